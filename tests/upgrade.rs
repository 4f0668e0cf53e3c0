//! The upgrade from format 2 to 3 (payloads above 1 KiB stored apart), from a format-2 file
//! written by leaseq before format 3 (`tests/fixtures/format2-crashed.leaseq`, see the README
//! there): every job, key, marker and lease survives, payloads byte for byte; and, on the
//! simulator, a power loss at any write or sync of the upgrade leaves a file that opens with
//! the same content.

mod common;

use std::time::Duration;

#[cfg(feature = "sim")]
use common::T0_MS;
use common::{Fixture, assert_consistent};
use leaseq::{EnqueueOptions, Enqueued, JobId, JobState, Queue};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format2-crashed.leaseq"
);

/// The payload generator the fixture was written with.
fn big(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Checks the fixture's content on a queue opened from it (just after the open).
fn assert_fixture(q: &Queue) {
    assert_consistent(q);
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.ready, s.scheduled, s.leased, s.dead, s.applied),
        (6, 3, 2, 0, 1, 1),
        "{s:?}"
    );
    let want: [(u64, JobState, Vec<u8>); 6] = [
        (2, JobState::Scheduled, b"nacked".to_vec()),
        (3, JobState::Dead, big(3000, 5)),
        (4, JobState::Ready, big(20_000, 3)),
        (5, JobState::Ready, b"small".to_vec()),
        (6, JobState::Ready, big(8192, 2)),
        (7, JobState::Scheduled, big(5000, 4)),
    ];
    for (id, state, payload) in want {
        let j = q.job(JobId(id)).unwrap().unwrap();
        assert_eq!(j.state, state, "job {id}");
        assert_eq!(j.payload_bytes, payload.len(), "job {id}");
        assert_eq!(q.payload(JobId(id)).unwrap().unwrap(), payload, "job {id}");
    }
    assert_eq!(
        q.job(JobId(4)).unwrap().unwrap().attempts,
        1,
        "the held lease counted"
    );
    assert_eq!(
        q.job(JobId(3)).unwrap().unwrap().last_error.as_deref(),
        Some("broken")
    );
    assert!(q.is_applied("A6").unwrap());
}

#[test]
fn a_format_2_file_is_upgraded_at_open_with_every_job_and_key() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE, &f.path).unwrap();
    let q = f.open();
    let r = q.recovery();
    assert_eq!(r.upgraded_from, Some(2), "{r:?}");
    assert_eq!(r.leases_returned, 1, "{r:?}");
    assert_fixture(&q);
    // Keys: d1 and d3 held by live jobs 5 and 4, d4 by job 7's window.
    for (key, holder) in [("d1", 5), ("d3", 4), ("d4", 7)] {
        let e = q
            .enqueue(b"dup", EnqueueOptions::default().dedup_key(key))
            .unwrap();
        assert_eq!(e, Enqueued::Duplicate(JobId(holder)), "{key}");
    }
    // Everything drains (the dead job requeued, the scheduled ones due), payloads intact.
    f.clock.advance(Duration::from_secs(61));
    q.requeue_dead(JobId(3)).unwrap();
    let mut seen = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        assert_eq!(
            q.payload(l.id()).unwrap().unwrap(),
            l.payload(),
            "job {:?}",
            l.id()
        );
        seen.push(l.id().0);
        l.ack().unwrap();
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![2, 3, 4, 5, 6, 7]);
    assert_consistent(&q);
    drop(q);
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    assert!(q.is_empty().unwrap());
}

#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_upgrade_leaves_a_file_that_opens_the_same() {
    use leaseq::ManualClock;
    use leaseq::sim::SimDisk;
    let image = std::fs::read(FIXTURE).unwrap();
    let open = |disk: &SimDisk| {
        Queue::builder()
            .clock(ManualClock::new(T0_MS))
            .retry(leaseq::RetryPolicy::immediate())
            .open_backend(disk.backend())
    };
    let mut k = 0;
    loop {
        let disk = SimDisk::from_image(image.clone(), 40 + k);
        disk.crash_after(k);
        let first = open(&disk);
        let crashed = disk.is_crashed();
        match (&first, crashed) {
            (Ok(q), false) => {
                // Every point before the whole open was tried.
                assert_eq!(q.recovery().upgraded_from, Some(2));
                assert_fixture(q);
                assert!(k > 3, "only {k} crash points");
                return;
            }
            (_, true) => {}
            (Err(e), false) => panic!("open failed without a crash at point {k}: {e}"),
        }
        drop(first);
        let reboot = SimDisk::from_image(disk.crash_image(), 70 + k);
        let q = open(&reboot).unwrap_or_else(|e| panic!("power lost at call {k}: reopen {e}"));
        assert_fixture(&q);
        k += 1;
    }
}

const FIXTURE4: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format4-crashed.leaseq"
);

/// Format 4 to 5: records of version 3 are read as never snoozed, with no recorded encoding
/// (a typed payload of then decodes with the handle's encoding, bincode by default); the
/// version is set once; the lease held at the crash comes back; named queues keep their jobs.
#[test]
fn format4_file_upgrades_to_5_and_keeps_every_job() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE4, &f.path).unwrap();
    let q = f.open();
    let r = q.recovery();
    assert_eq!(r.upgraded_from, Some(4), "{r:?}");
    assert_eq!(r.leases_returned, 1, "{r:?}");
    assert_consistent(&q);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.ready, s.leased), (3, 3, 0), "{s:?}");
    for id in 1..=3 {
        let j = q.job(JobId(id)).unwrap().unwrap();
        assert_eq!((j.snoozes, j.encoding), (0, None), "job {id}");
    }
    assert_eq!(
        q.job(JobId(2)).unwrap().unwrap().last_error.as_deref(),
        Some("try again")
    );
    // Priority order: job 3 (-2), job 2 (-1), job 1 (0).
    let l3 = q.dequeue().unwrap().unwrap();
    assert_eq!((l3.id(), l3.attempt()), (JobId(3), 2));
    assert!(l3.payload() == big(4000, 7), "job 3's payload");
    // A snooze on an upgraded record writes a version-4 record.
    l3.snooze(Duration::from_secs(60)).unwrap();
    let j3 = q.job(JobId(3)).unwrap().unwrap();
    assert_eq!(
        (j3.state, j3.attempts, j3.snoozes),
        (JobState::Scheduled, 1, 1)
    );
    let l2 = q.dequeue().unwrap().unwrap();
    assert_eq!((l2.id(), l2.attempt()), (JobId(2), 2));
    assert_eq!(l2.payload(), b"nacked");
    l2.ack().unwrap();
    let l1 = q.dequeue().unwrap().unwrap();
    assert_eq!(l1.id(), JobId(1));
    assert_eq!(
        l1.decode::<(String, u32)>().unwrap(),
        ("resize".to_string(), 640)
    );
    l1.ack_with(|_| Ok(())).unwrap();
    assert!(q.is_applied("T1").unwrap());
    let side = q.existing("side").unwrap();
    let ss = side.stats().unwrap();
    assert_eq!((ss.ready, ss.scheduled), (1, 1), "{ss:?}");
    assert_eq!(side.dequeue().unwrap().unwrap().payload(), b"side-ready");
    // The dedup key of job 3 is still held.
    assert_eq!(
        q.enqueue(b"x", EnqueueOptions::default().dedup_key("d3"))
            .unwrap(),
        Enqueued::Duplicate(JobId(3))
    );
    drop((q, side));
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    assert_consistent(&q);
}
