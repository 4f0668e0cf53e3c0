//! The upgrade from format 2 to 3 (payloads above 1 KiB stored apart), from a format-2 file
//! written by leaseq before format 3 (`tests/fixtures/format2-crashed.leaseq`, see the README
//! there): every job, key, marker and lease survives, payloads byte for byte; and, on the
//! simulator, a power loss at any write or sync of the upgrade leaves a file that opens with
//! the same content.
//!
//! Adversarial tests of issue 11 (the format 4 → 5 upgrade with mixed record versions): each
//! checks the state that should result (stats, `Queue::job`, `check()`), not only that nothing
//! panics.
//!
//! Adversarial tests of the "run for years" work (issue 9): the upgrade of a format-1 file with
//! damaged rows.

use crate::common::{Fixture, T0_MS, assert_consistent, bump, flip_record_byte, keyed, ms, plain};
use leaseq::{Applied, Encoding, EnqueueOptions, Enqueued, ImportJob, JobId, JobState, Queue};
use redb::TableDefinition;
use std::time::Duration;

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
    assert_returned(&r, 1);
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

/// Opens `fixture` (a file of format `from`) on the simulator with power lost at its `k`-th
/// write or sync, for every `k` until the open runs through; after each loss the rebooted file
/// must open with the same content (`assert_content`). The file and its journal (empty at
/// first: the open makes it) are two files on one power line, so a loss can land in the
/// journal's making, the session's record, the upgrade's checkpoint or lease recovery.
/// Seeds from `seed`.
#[cfg(feature = "sim")]
fn power_loss_at_every_write_of_the_upgrade(
    fixture: &str,
    from: u64,
    seed: u64,
    assert_content: fn(&Queue),
) {
    power_loss_at_every_write_of_the_upgrade_with(fixture, None, from, seed, assert_content)
}

/// As [`power_loss_at_every_write_of_the_upgrade`], with the journal `journal_image` beside
/// the file (`None`: none).
#[cfg(feature = "sim")]
fn power_loss_at_every_write_of_the_upgrade_with(
    fixture: &str,
    journal_image: Option<Vec<u8>>,
    from: u64,
    seed: u64,
    assert_content: fn(&Queue),
) {
    use leaseq::ManualClock;
    use leaseq::sim::SimDisk;
    let image = std::fs::read(fixture).unwrap();
    let open = |disk: &SimDisk, journal: &SimDisk| {
        Queue::builder()
            .clock(ManualClock::new(T0_MS))
            .retry(leaseq::RetryPolicy::immediate())
            .open_backends(disk.backend(), journal.backend())
    };
    let mut k = 0;
    loop {
        let disk = SimDisk::from_image(image.clone(), seed + k);
        let journal = match &journal_image {
            Some(j) => disk.sibling_from_image(j.clone(), seed + 60 + k),
            None => disk.sibling(seed + 60 + k),
        };
        disk.crash_after(k);
        let first = open(&disk, &journal);
        let crashed = disk.is_crashed();
        match (&first, crashed) {
            (Ok(q), false) => {
                // Every point before the whole open was tried.
                assert_eq!(q.recovery().upgraded_from, Some(from));
                assert_content(q);
                assert!(k > 3, "only {k} crash points");
                return;
            }
            (_, true) => {}
            (Err(e), false) => panic!("open failed without a crash at point {k}: {e}"),
        }
        drop(first);
        let reboot = SimDisk::from_image(disk.crash_image(), seed + 30 + k);
        let rebooted_journal = reboot.sibling_from_image(journal.crash_image(), seed + 90 + k);
        let q = open(&reboot, &rebooted_journal)
            .unwrap_or_else(|e| panic!("power lost at call {k}: reopen {e}"));
        assert_content(&q);
        k += 1;
    }
}

#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_upgrade_leaves_a_file_that_opens_the_same() {
    power_loss_at_every_write_of_the_upgrade(FIXTURE, 2, 40, assert_fixture);
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

// ---------------------------------------------------------------------------------------
// Format 4 → 5 with records of versions 3 and 4 side by side.
// ---------------------------------------------------------------------------------------

#[test]
fn an_upgraded_file_mixes_record_versions_through_snooze_crash_and_import() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE4, &f.path).unwrap();
    let max3 = {
        let q = f.open();
        assert_eq!(q.recovery().upgraded_from, Some(4));
        let max3 = q.job(JobId(3)).unwrap().unwrap().max_attempts;
        // Job 3 (record v3): delivered, snoozed (now v4), delivered again and held at the
        // "crash"; jobs 1 and 2 stay version-3 records.
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!((l.id(), l.attempt()), (JobId(3), 2));
        l.snooze(Duration::ZERO).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!((l.id(), l.attempt()), (JobId(3), 2));
        // Imported next to the old records.
        let out = q
            .import_batch(&[
                ImportJob::new(b"imported".to_vec())
                    .encoding(Some(Encoding::Json))
                    .options(plain().dedup_key("d3")),
                ImportJob::new(b"imported dead".to_vec())
                    .state(JobState::Dead)
                    .attempts(1)
                    .snoozes(4),
            ])
            .unwrap();
        assert_eq!(out[0], Enqueued::Duplicate(JobId(3)));
        drop(l); // held at the "crash"
        drop(q);
        max3
    };
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None);
    let want = if max3 > 2 { 1 } else { 0 };
    assert_eq!(q.recovery().leases_returned, want);
    let j3 = q.job(JobId(3)).unwrap().unwrap();
    assert_eq!((j3.attempts, j3.snoozes), (2, 1));
    for id in [1, 2] {
        let j = q.job(JobId(id)).unwrap().unwrap();
        assert_eq!(
            (j.snoozes, j.encoding, j.attempts),
            (0, None, id as u32 - 1)
        );
    }
    // The side queue's delayed v3 job comes due and is snoozed: v4 there too.
    let side = q.existing("side").unwrap();
    f.clock.advance(Duration::from_secs(61));
    let mut side_payloads = Vec::new();
    let mut snoozed = false;
    while let Some(l) = side.dequeue().unwrap() {
        side_payloads.push(l.payload().to_vec());
        if l.payload() == b"side-later" && !snoozed {
            snoozed = true;
            l.snooze(Duration::ZERO).unwrap();
            let j = side.job(l.id()).unwrap().unwrap();
            assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Ready, 0, 1));
        } else {
            l.ack().unwrap();
        }
    }
    assert_eq!(side_payloads.len(), 3, "{side_payloads:?}");
    assert_eq!(side.stats().unwrap().total, 0);
    assert_eq!(
        q.enqueue(b"x", plain().dedup_key("d3")).unwrap(),
        Enqueued::Duplicate(JobId(3))
    );
    let s = q.stats().unwrap();
    let dead = if max3 > 2 { 1 } else { 2 };
    assert_eq!(
        (s.total, s.dead),
        (4, dead),
        "jobs 1 to 3, the imported dead job"
    );
    assert_consistent(&q);
}

const APPLIED: TableDefinition<&[u8], u64> = TableDefinition::new("leaseq_applied");

const APPLIED_BY_TIME: TableDefinition<(u64, &[u8]), ()> =
    TableDefinition::new("leaseq_applied_by_time");

const IDEM_JOBS: TableDefinition<(&[u8], u64), ()> = TableDefinition::new("leaseq_idem_jobs");

const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");

fn retained(f: &Fixture, retention: Duration) -> Queue {
    f.builder()
        .applied_retention(Some(retention))
        .open(&f.path)
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// The upgrade from format 1, with damaged rows
// ---------------------------------------------------------------------------------------

/// Turns a closed format-2 file into what format 1 looked like: version 1, no time index, no
/// carrier index, and a marker under a job's own id (tag 0).
fn downgrade_to_format_1(f: &Fixture, own_id: u64) {
    let db = redb::Database::open(&f.path).unwrap();
    let tx = db.begin_write().unwrap();
    tx.open_table(META)
        .unwrap()
        .insert("format_version", 1)
        .unwrap();
    assert!(tx.delete_table(APPLIED_BY_TIME).unwrap());
    assert!(tx.delete_table(IDEM_JOBS).unwrap());
    let mut own = vec![0u8];
    own.extend_from_slice(&own_id.to_be_bytes());
    tx.open_table(APPLIED)
        .unwrap()
        .insert(own.as_slice(), T0_MS)
        .unwrap();
    tx.commit().unwrap();
}

/// A format-1 file holding a damaged job row (carrying a key), a damaged leased row, a good
/// carried key, an uncarried key and a job's own-id marker: the open upgrades it (the damaged
/// rows are skipped, the leased one quarantined by recovery), the uncarried marker and the
/// own-id one go, the carried one stays, and once the damaged rows are removed `check` is
/// clean.
#[test]
fn upgrade_of_a_format_1_file_with_damaged_rows() {
    let f = Fixture::new();
    let (j_good, j_bad, j_leased, acked) = {
        let q = f.open();
        for k in ["K1", "K2", "K3"] {
            q.enqueue(b"first", keyed(k)).unwrap();
            let l = q.dequeue().unwrap().unwrap();
            assert_eq!(l.ack_with(|tx| bump(tx, 0)).unwrap(), Applied::Now);
        }
        let acked = q.enqueue(b"own", EnqueueOptions::default()).unwrap().id();
        q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
        let j_good = q.enqueue(b"K2 again", keyed("K2")).unwrap().id();
        let j_bad = q.enqueue(b"K3 again", keyed("K3")).unwrap().id();
        let j_leased = q.enqueue(b"held", keyed("K4")).unwrap().id();
        let held = q.dequeue_batch(3).unwrap();
        assert_eq!(held.len(), 3);
        flip_record_byte(&q, j_bad, 7, 0x5A);
        flip_record_byte(&q, j_leased, 7, 0x5A);
        drop(held); // still leased in the file: the next open recovers it
        drop(q);
        (j_good, j_bad, j_leased, acked)
    };
    downgrade_to_format_1(&f, acked.0);
    let q = retained(&f, ms(10));
    let r = q.recovery();
    assert_eq!(r.upgraded_from, Some(1), "{r:?}");
    assert_eq!((r.leases_returned, r.quarantined), (1, 2), "{r:?}");
    assert_eq!(q.stats().unwrap().applied, 3, "the own-id marker is gone");
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 2, "K1 and K3");
    assert!(!q.is_applied("K1").unwrap());
    assert!(q.is_applied("K2").unwrap(), "carried by a good live job");
    // K3 is carried only by a damaged row the upgrade skipped: its marker went (a job
    // quarantined under format 2 keeps its carrier entry, so its marker would stay).
    assert!(!q.is_applied("K3").unwrap());
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), j_good);
    assert_eq!(l.ack_with(|_| Ok(())).unwrap(), Applied::AlreadyApplied);
    drop(l);
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().quarantined, 2);
    q.remove(j_bad).unwrap();
    q.remove(j_leased).unwrap();
    assert_consistent(&q);
    drop(q);
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Format 5 → 6: the table of paused queues.
// ---------------------------------------------------------------------------------------

const FIXTURE5: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format5-crashed.leaseq"
);

/// Checks `format5-crashed.leaseq`'s content (see the fixtures README) on a queue opened from
/// it, just after the open that upgraded it and returned its three leases.
fn assert_fixture5(q: &Queue) {
    assert_consistent(q);
    let r = q.recovery();
    assert_returned(&r, 3);
    let s = q.stats().unwrap();
    // Format 5 has no completed or cancelled jobs.
    assert_eq!(counts(&s), (7, 2, 4, 0, 1, 1, 2, 0, 0), "{s:?}");
    assert!(!s.paused);
    let job = |id: u64| q.job(JobId(id)).unwrap().unwrap();
    assert_eq!(job(2).state, JobState::Scheduled);
    assert_eq!(job(2).run_at_ms, T0_MS + 30_000);
    assert_eq!(job(2).last_error.as_deref(), Some("later"));
    assert_eq!(
        (job(3).state, job(3).last_error.as_deref()),
        (JobState::Dead, Some("broken"))
    );
    assert!(q.payload(JobId(3)).unwrap().unwrap() == big(3000, 5));
    assert_eq!(
        (job(4).state, job(4).attempts, job(4).snoozes),
        (JobState::Ready, 1, 1)
    );
    assert_eq!(job(7).run_at_ms, T0_MS + 60_000);
    assert!(q.is_applied("A1").unwrap());
    let side = q.existing("sync").unwrap();
    let ss = side.stats().unwrap();
    assert_eq!((ss.total, ss.ready, ss.leased), (2, 2, 0), "{ss:?}");
}

/// The default queue of the format-5 and format-6 fixtures (written alike) after the open
/// that upgraded it: its keys still held (d4 by a live job, d5 by its window), and its
/// delivery order: the two returned leases in their places (4 at -4, 8 at -3), then the
/// priority-0 jobs in order. Takes those four jobs.
fn default_queue_keys_and_order_of_fixtures_5_and_6(q: &Queue) {
    for (key, holder) in [("d4", 4), ("d5", 5)] {
        assert_eq!(
            q.enqueue(b"dup", EnqueueOptions::default().dedup_key(key))
                .unwrap(),
            Enqueued::Duplicate(JobId(holder)),
            "{key}"
        );
    }
    let got: Vec<(u64, u32)> = q
        .dequeue_batch(10)
        .unwrap()
        .iter()
        .map(|l| (l.id().0, l.attempt()))
        .collect();
    assert_eq!(got, vec![(4, 2), (8, 2), (5, 1), (6, 1)]);
}

/// Format 5 to 6: the file's every job, key, marker, window and lease survives; the three
/// leases held at the crash come back in their places; the version is set once; the new
/// table works (a pause is stored) and `check()` covers it.
#[test]
fn format5_file_upgrades_to_6_and_keeps_every_job() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE5, &f.path).unwrap();
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, Some(5));
    assert_fixture5(&q);
    default_queue_keys_and_order_of_fixtures_5_and_6(&q);
    assert!(q.payload(JobId(5)).unwrap().unwrap() == big(20_000, 3));
    let side = q.existing("sync").unwrap();
    let order: Vec<(Vec<u8>, u32)> = side
        .dequeue_batch(10)
        .unwrap()
        .iter()
        .map(|l| (l.payload().to_vec(), l.attempt()))
        .collect();
    assert_eq!(
        order,
        vec![(b"sync-held".to_vec(), 2), (b"sync-ready".to_vec(), 1)]
    );
    // The new table: a pause is stored and checked.
    side.pause().unwrap();
    assert_consistent(&q);
    drop((q, side));
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    assert!(q.existing("sync").unwrap().is_paused());
    assert_consistent(&q);
}

/// A power loss at any write or sync of the open that upgrades the format-5 fixture leaves a
/// file that opens with the same content (the upgrade is one commit, the lease recovery the
/// next: a power loss leaves the file before or after each).
#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_5_to_6_upgrade_leaves_a_file_that_opens_the_same() {
    power_loss_at_every_write_of_the_upgrade(FIXTURE5, 5, 90, assert_fixture5);
}

/// A queue's counts as the format-6 and format-7 checks compare them: total, scheduled, ready,
/// leased, dead, applied, dedup keys, completed, cancelled.
fn counts(s: &leaseq::Stats) -> (u64, u64, u64, u64, u64, u64, u64, u64, u64) {
    (
        s.total,
        s.scheduled,
        s.ready,
        s.leased,
        s.dead,
        s.applied,
        s.dedup_keys,
        s.completed,
        s.cancelled,
    )
}

// ---------------------------------------------------------------------------------------
// Format 6 → 7: completed and cancelled jobs, the history setting, record version 5.
// ---------------------------------------------------------------------------------------

const FIXTURE6: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format6-crashed.leaseq"
);

/// Checks `format6-crashed.leaseq`'s content (see the fixtures README) on a queue opened from
/// it, just after the open that upgraded it and returned its three leases.
fn assert_fixture6(q: &Queue) {
    assert_consistent(q);
    let r = q.recovery();
    assert_returned(&r, 3);
    let s = q.stats().unwrap();
    assert_eq!(counts(&s), (7, 2, 4, 0, 1, 1, 2, 0, 0), "{s:?}");
    assert!(!s.paused);
    let job = |id: u64| q.job(JobId(id)).unwrap().unwrap();
    // A record of version 4 reads its one last error as the history, without a time.
    let nacked = job(2);
    assert_eq!(nacked.state, JobState::Scheduled);
    assert_eq!(nacked.run_at_ms, T0_MS + 30_000);
    assert_eq!(
        nacked.errors,
        vec![leaseq::AttemptError {
            attempt: 1,
            at_ms: None,
            message: "later".into()
        }]
    );
    assert_eq!(
        (job(3).state, job(3).last_error.as_deref()),
        (JobState::Dead, Some("broken"))
    );
    assert!(q.payload(JobId(3)).unwrap().unwrap() == big(3000, 5));
    // Returned at open: rewritten in record version 5, the abandon added to its history.
    let returned = job(4);
    assert_eq!(
        (returned.state, returned.attempts, returned.snoozes),
        (JobState::Ready, 1, 1)
    );
    assert_eq!(returned.errors.len(), 1);
    assert_eq!(returned.errors[0].attempt, 1);
    assert!(returned.errors[0].at_ms.is_some());
    assert_eq!(job(7).run_at_ms, T0_MS + 60_000);
    assert!(q.is_applied("A1").unwrap());
    assert!(q.history().unwrap().is_off());
    let sync = q.existing("sync").unwrap();
    let ss = sync.stats().unwrap();
    assert_eq!(
        (ss.total, ss.ready, ss.leased, ss.completed),
        (2, 2, 0, 0),
        "{ss:?}"
    );
    let quiet = q.existing("quiet").unwrap();
    assert!(quiet.is_paused(), "the pause survives the upgrade");
    assert_eq!(quiet.stats().unwrap().ready, 1);
}

/// Format 6 to 7: every job, key, marker, window, pause and lease survives; the three leases
/// come back in their places; the version is set once; the new tables work in every queue (a
/// history kept, a job completed and one cancelled, in a named queue too) and `check()`
/// covers them.
#[test]
fn format6_file_upgrades_to_7_and_keeps_every_job() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE6, &f.path).unwrap();
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, Some(6));
    assert_fixture6(&q);
    default_queue_keys_and_order_of_fixtures_5_and_6(&q);
    // The new tables, in a named queue of the old file.
    let sync = q.existing("sync").unwrap();
    sync.set_history(leaseq::History::off().keep_jobs(5))
        .unwrap();
    let l = sync.dequeue().unwrap().unwrap();
    let held = l.id();
    l.ack_with_result(b"done").unwrap();
    let other = sync.dequeue().unwrap().unwrap().id();
    sync.cancel(other, "stop").unwrap();
    let ss = sync.stats().unwrap();
    assert_eq!((ss.total, ss.completed, ss.cancelled), (0, 1, 1), "{ss:?}");
    assert_consistent(&q);
    drop((q, sync));
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    let sync = q.existing("sync").unwrap();
    assert_eq!(
        sync.job(held).unwrap().unwrap().result.as_deref(),
        Some(&b"done"[..])
    );
    assert_eq!(sync.history().unwrap(), leaseq::History::off().keep_jobs(5));
    assert_consistent(&q);
}

/// A power loss at any write or sync of the open that upgrades the format-6 fixture leaves a
/// file that opens with the same content.
#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_6_to_7_upgrade_leaves_a_file_that_opens_the_same() {
    power_loss_at_every_write_of_the_upgrade(FIXTURE6, 6, 91, assert_fixture6);
}

// ---------------------------------------------------------------------------------------
// Format 7 → 8: the schedules and their due-time index.
// ---------------------------------------------------------------------------------------

const FIXTURE7: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format7-crashed.leaseq"
);

/// Checks `format7-crashed.leaseq`'s content (see the fixtures README) on a queue opened from
/// it, just after the open that upgraded it and returned its four leases. Reads only.
fn assert_fixture7(q: &Queue) {
    assert_consistent(q);
    let r = q.recovery();
    assert_returned(&r, 4);
    let s = q.stats().unwrap();
    assert_eq!(counts(&s), (7, 2, 4, 0, 1, 1, 2, 0, 0), "{s:?}");
    assert!(!s.paused);
    assert!(q.history().unwrap().is_off());
    let job = |id: u64| q.job(JobId(id)).unwrap().unwrap();
    // A record of version 5: the nack's error with its time.
    assert_nacked_once_at_t0(&job(2));
    let dead = job(3);
    assert_eq!(
        (dead.state, dead.attempts, dead.last_error.as_deref()),
        (JobState::Dead, 1, Some("broken"))
    );
    assert_eq!(dead.payload_bytes, 3000);
    assert!(q.payload(JobId(3)).unwrap().unwrap() == big(3000, 5));
    // Returned at open, the abandon added to its history.
    let returned = job(4);
    assert_eq!(
        (returned.state, returned.attempts, returned.snoozes),
        (JobState::Ready, 1, 1)
    );
    assert_eq!(returned.errors.len(), 1, "{:?}", returned.errors);
    assert_eq!(returned.errors[0].attempt, 1);
    assert!(returned.errors[0].at_ms.is_some());
    assert_eq!(job(5).state, JobState::Ready);
    assert!(q.payload(JobId(5)).unwrap().unwrap() == big(20_000, 3));
    assert_eq!(
        q.payload(JobId(6)).unwrap().unwrap(),
        b"ready",
        "job 6 (K6)"
    );
    let later = job(7);
    assert_eq!(
        (later.state, later.run_at_ms),
        (JobState::Scheduled, T0_MS + 60_000)
    );
    assert_eq!((job(8).state, job(8).attempts), (JobState::Ready, 1));
    assert!(q.is_applied("A1").unwrap());
    assert!(!q.is_applied("K6").unwrap());
    // The new tables are there and empty.
    assert_eq!(q.schedules().unwrap(), vec![]);
    let sync = q.existing("sync").unwrap();
    let ss = sync.stats().unwrap();
    assert_eq!(
        (ss.total, ss.ready, ss.leased, ss.completed, ss.cancelled),
        (2, 2, 0, 0, 0),
        "{ss:?}"
    );
    let held = sync.job(JobId(10)).unwrap().unwrap();
    assert_eq!((held.state, held.attempts), (JobState::Ready, 1));
    let quiet = q.existing("quiet").unwrap();
    assert!(quiet.is_paused(), "the pause survives the upgrade");
    assert_eq!(quiet.stats().unwrap().ready, 1);
    // The queue with a history: its setting, its completed job (with its result), its
    // cancelled job (with its reason), its returned lease.
    let kept = q.existing("kept").unwrap();
    assert_eq!(
        kept.history().unwrap(),
        leaseq::History::off().keep_jobs(10)
    );
    let ks = kept.stats().unwrap();
    assert_eq!(
        (ks.total, ks.ready, ks.leased, ks.completed, ks.cancelled),
        (1, 1, 0, 1, 1),
        "{ks:?}"
    );
    let done = kept.job(JobId(12)).unwrap().unwrap();
    assert_eq!(
        (done.state, done.attempts, done.ended_ms),
        (JobState::Completed, 1, Some(T0_MS))
    );
    assert_eq!(done.result.as_deref(), Some(&b"done"[..]));
    let cancelled = kept.job(JobId(13)).unwrap().unwrap();
    assert_eq!(
        (cancelled.state, cancelled.cancel_reason.as_deref()),
        (JobState::Cancelled, Some("stop"))
    );
    let held = kept.job(JobId(14)).unwrap().unwrap();
    assert_eq!(
        (held.state, held.attempts, held.priority),
        (JobState::Ready, 1, -2)
    );
    assert_eq!(kept.schedules().unwrap(), vec![]);
}

/// Format 7 to 8: every job, key, marker, window, pause, history and lease survives; the four
/// leases come back; the version is set once; the new tables work in the default queue and in
/// a named queue of the old file (a schedule each, fired by a dequeue, then by the reopen
/// after due times were missed) and `check()` covers them.
#[test]
fn format7_file_upgrades_to_8_and_keeps_every_job() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE7, &f.path).unwrap();
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, Some(7));
    assert_fixture7(&q);
    for (key, holder) in [("d4", 4), ("d5", 5)] {
        assert_eq!(
            q.enqueue(b"dup", plain().dedup_key(key)).unwrap(),
            Enqueued::Duplicate(JobId(holder)),
            "{key}"
        );
    }
    let kept = q.existing("kept").unwrap();
    // A schedule in each queue, due 60 s and 90 s from the fixture's clock.
    let tick = q
        .create_schedule(
            "tick",
            &leaseq::Schedule::every(Duration::from_secs(60)).payload(b"tick".to_vec()),
        )
        .unwrap();
    assert_eq!(
        (tick.timing.clone(), tick.next_due_ms, tick.fired),
        (
            leaseq::Timing::Interval {
                every_ms: 60_000,
                start_ms: T0_MS + 60_000
            },
            Some(T0_MS + 60_000),
            0
        )
    );
    let tock = kept
        .create_schedule(
            "tock",
            &leaseq::Schedule::every(Duration::from_secs(90)).payload(b"tock".to_vec()),
        )
        .unwrap();
    assert_eq!(tock.next_due_ms, Some(T0_MS + 90_000));
    assert_consistent(&q);
    f.clock.advance(Duration::from_secs(91));
    // The default queue: its six live jobs (2 and 7 now due) and the schedule's instance,
    // under the next id the file stored (1025: ids are reserved in blocks, and the fixture's
    // writer, jobs 1 to 14, had its first one).
    let mut got = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        got.push((l.id().0, l.payload().to_vec()));
        l.ack().unwrap();
    }
    got.sort();
    let want: Vec<(u64, Vec<u8>)> = vec![
        (2, b"nacked".to_vec()),
        (4, b"snoozed".to_vec()),
        (5, big(20_000, 3)),
        (6, b"ready".to_vec()),
        (7, b"later".to_vec()),
        (8, b"held".to_vec()),
        (1025, b"tick".to_vec()),
    ];
    assert!(
        got == want,
        "default queue drained: {:?}",
        got.iter().map(|(id, p)| (id, p.len())).collect::<Vec<_>>()
    );
    let tick = q.schedule("tick").unwrap().unwrap();
    assert_eq!(
        (tick.fired, tick.last_job, tick.next_due_ms),
        (
            1,
            Some((JobId(1025), T0_MS + 60_000)),
            Some(T0_MS + 120_000)
        )
    );
    // The named queue: its returned lease, then the instance, kept in its history.
    let first = kept.dequeue().unwrap().unwrap();
    assert_eq!((first.id(), first.attempt()), (JobId(14), 2));
    first.ack().unwrap();
    let instance = kept.dequeue().unwrap().unwrap();
    assert_eq!(
        (instance.id(), instance.payload()),
        (JobId(1026), &b"tock"[..])
    );
    instance.ack_with_result(b"tocked").unwrap();
    assert!(kept.dequeue().unwrap().is_none());
    let tock = kept.schedule("tock").unwrap().unwrap();
    assert_eq!(
        (tock.fired, tock.last_job, tock.next_due_ms),
        (
            1,
            Some((JobId(1026), T0_MS + 90_000)),
            Some(T0_MS + 180_000)
        )
    );
    let ks = kept.stats().unwrap();
    assert_eq!((ks.total, ks.completed, ks.cancelled), (0, 3, 1), "{ks:?}");
    assert_eq!(
        kept.job(JobId(1026)).unwrap().unwrap().result.as_deref(),
        Some(&b"tocked"[..])
    );
    // The cancelled job let go of its dedup key: a new job takes it.
    assert_eq!(
        kept.enqueue(b"again", plain().dedup_key("d13")).unwrap(),
        Enqueued::New(JobId(1027))
    );
    assert_eq!(q.stats().unwrap().total, 1, "the dead job 3");
    assert_consistent(&q);
    drop((q, kept));
    // Closed past the next due time of each: the reopen fires both (`Missed::RunOnce`).
    f.clock.advance(Duration::from_secs(109)); // T0 + 200 s
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    let kept = q.existing("kept").unwrap();
    let listed = |q: &Queue| -> Vec<(String, u64, Option<u64>)> {
        q.schedules()
            .unwrap()
            .into_iter()
            .map(|i| (i.name, i.fired, i.next_due_ms))
            .collect()
    };
    assert_eq!(
        listed(&q),
        vec![("tick".to_string(), 2, Some(T0_MS + 240_000))]
    );
    assert_eq!(
        listed(&kept),
        vec![("tock".to_string(), 2, Some(T0_MS + 270_000))]
    );
    let tick_job = q.schedule("tick").unwrap().unwrap().last_job.unwrap();
    assert_eq!(tick_job.1, T0_MS + 120_000);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.payload()), (tick_job.0, &b"tick"[..]));
    l.ack().unwrap();
    assert!(q.dequeue().unwrap().is_none());
    let tock_job = kept.schedule("tock").unwrap().unwrap().last_job.unwrap();
    assert_eq!(tock_job.1, T0_MS + 180_000);
    let mut got: Vec<(JobId, Vec<u8>)> = Vec::new();
    while let Some(l) = kept.dequeue().unwrap() {
        got.push((l.id(), l.payload().to_vec()));
        l.ack().unwrap();
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            (JobId(1027), b"again".to_vec()),
            (tock_job.0, b"tock".to_vec())
        ]
    );
    assert!(q.existing("quiet").unwrap().is_paused());
    assert_consistent(&q);
}

/// A power loss at any write or sync of the open that upgrades the format-7 fixture leaves a
/// file that opens with the same content.
#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_7_to_8_upgrade_leaves_a_file_that_opens_the_same() {
    power_loss_at_every_write_of_the_upgrade(FIXTURE7, 7, 92, assert_fixture7);
}

// ---------------------------------------------------------------------------------------
// Format 9 → 10: record version 7 (a fixed-width head, XXH3-64), written as jobs change.
// ---------------------------------------------------------------------------------------

const FIXTURE9: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format9-crashed.leaseq"
);

/// The record version of each row of a queue's `leaseq_jobs` in the file at `path` (closed):
/// job id → the row's first byte.
fn record_versions(path: &std::path::Path, jobs_table: &str) -> Vec<(u64, u8)> {
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::Database::open(path).unwrap();
    let rtx = db.begin_read().unwrap();
    let table = rtx
        .open_table(TableDefinition::<u64, &[u8]>::new(jobs_table))
        .unwrap();
    table
        .iter()
        .unwrap()
        .map(|e| {
            let (id, row) = e.unwrap();
            (id.value(), row.value()[0])
        })
        .collect()
}

/// Checks `format9-crashed.leaseq`'s content (see the fixtures README) on a queue opened from
/// it, just after the open that upgraded it and returned its three leases. Reads only.
fn assert_fixture9(q: &Queue) {
    assert_consistent(q);
    let r = q.recovery();
    assert_returned(&r, 3);
    let s = q.stats().unwrap();
    // Jobs 2 to 10: 2, 4, 7 scheduled; 5, 6, 8, 9, 10 ready (10 held behind 9); 3 dead.
    assert_eq!(counts(&s), (9, 3, 5, 0, 1, 1, 3, 0, 0), "{s:?}");
    let job = |id: u64| q.job(JobId(id)).unwrap().unwrap();
    assert_eq!(q.job(JobId(1)).unwrap(), None, "acked without a history");
    assert!(q.is_applied("A1").unwrap());
    assert_nacked_once_at_t0(&job(2));
    let dead = job(3);
    assert_eq!(
        (dead.state, dead.attempts, dead.max_attempts, dead.priority),
        (JobState::Dead, 1, 1, -5)
    );
    assert_eq!(dead.last_error.as_deref(), Some("broken"));
    assert_eq!(dead.idempotency_key.as_deref(), Some(&b"K3"[..]));
    assert!(q.payload(JobId(3)).unwrap().unwrap() == big(3000, 5));
    let snoozed = job(4);
    assert_eq!(
        (
            snoozed.state,
            snoozed.run_at_ms,
            snoozed.attempts,
            snoozed.snoozes
        ),
        (JobState::Scheduled, T0_MS + 60_000, 0, 1)
    );
    assert_eq!(snoozed.status.as_deref(), Some("offline"));
    assert_eq!(snoozed.dedup_key.as_deref(), Some(&b"d4"[..]));
    let apart = job(5);
    assert_eq!(
        (apart.state, apart.payload_bytes),
        (JobState::Ready, 20_000)
    );
    assert_eq!(apart.dedup_window_ms, Some(3_600_000));
    assert!(q.payload(JobId(5)).unwrap().unwrap() == big(20_000, 3));
    let typed = job(6);
    assert_eq!(typed.encoding, Some(Encoding::Bincode));
    assert_eq!(typed.lease_ms, Some(10_000));
    assert_eq!(
        typed.retry,
        Some(leaseq::RetryPolicy::fixed(Duration::from_secs(3)))
    );
    assert_eq!(typed.idempotency_key.as_deref(), Some(&b"K6"[..]));
    let later = job(7);
    assert_eq!(
        (later.state, later.run_at_ms),
        (JobState::Scheduled, T0_MS + 60_000)
    );
    assert_eq!(later.dedup_key.as_deref(), Some(&b"d7"[..]));
    // Returned at open: the abandon added to the history, the progress kept.
    let progress = job(8);
    assert_eq!((progress.state, progress.attempts), (JobState::Ready, 1));
    assert_eq!(progress.progress.as_deref(), Some(&b"half"[..]));
    assert_eq!(progress.errors.len(), 1);
    let head = job(9);
    assert_eq!((head.state, head.attempts), (JobState::Ready, 1));
    assert_eq!(head.group.as_deref(), Some(&b"g1"[..]));
    assert!(q.payload(JobId(9)).unwrap().unwrap() == big(5000, 4));
    assert_eq!(job(10).group.as_deref(), Some(&b"g1"[..]));
    let sync = q.existing("sync").unwrap();
    assert_eq!(
        sync.job(JobId(11))
            .unwrap()
            .unwrap()
            .idempotency_key
            .as_deref(),
        Some(&b"S11"[..])
    );
    let kept = q.existing("kept").unwrap();
    assert_eq!(
        kept.history().unwrap(),
        leaseq::History::off().keep_jobs(10)
    );
    let ks = kept.stats().unwrap();
    assert_eq!(
        (ks.total, ks.ready, ks.leased, ks.completed, ks.cancelled),
        (1, 1, 0, 1, 1),
        "{ks:?}"
    );
    let done = kept.job(JobId(12)).unwrap().unwrap();
    assert_eq!(
        (done.state, done.ended_ms),
        (JobState::Completed, Some(T0_MS))
    );
    assert_eq!(done.result.as_deref(), Some(&b"done"[..]));
    let cancelled = kept.job(JobId(13)).unwrap().unwrap();
    assert_eq!(
        (cancelled.state, cancelled.cancel_reason.as_deref()),
        (JobState::Cancelled, Some("stop"))
    );
    let retried = kept.job(JobId(14)).unwrap().unwrap();
    assert_eq!((retried.state, retried.attempts), (JobState::Ready, 2));
    assert_eq!(retried.errors[0].message, "first try");
    let quiet = q.existing("quiet").unwrap();
    assert!(quiet.is_paused());
    assert_eq!(quiet.stats().unwrap().ready, 1);
}

/// Format 9 to 10 (and on to the current format): every job of every state survives with
/// every field a version-6 record holds; only the records of the returned leases are
/// rewritten at open (in the current record version, 8 since format 15), the rest
/// stay version 6 until their jobs change; payloads stored apart under FNV-1a still verify
/// after their records are rewritten; once every live job has ended (acked, cancelled), the
/// only rows left are the history's, the two that ended before the upgrade still version 6,
/// and the file checks clean.
#[test]
fn format9_file_upgrades_to_10_and_rewrites_records_as_jobs_change() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE9, &f.path).unwrap();
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, Some(9));
    assert_fixture9(&q);
    drop(q);
    let v6_except = |rows: Vec<(u64, u8)>, rewritten: &[u64]| {
        for (id, version) in rows {
            let want = if rewritten.contains(&id) { 8 } else { 6 };
            assert_eq!(version, want, "job {id}");
        }
    };
    v6_except(record_versions(&f.path, "leaseq_jobs"), &[8, 9]);
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    drop(q);
    // `kept` was the second named queue made: number 2.
    let kept_jobs = "leaseq_q2_jobs";
    v6_except(record_versions(&f.path, kept_jobs), &[14]);
    // Every live job ends: the ready ones are delivered and acked (payloads apart read back
    // through their rewritten records), the scheduled ones cancelled, the dead one retried
    // and acked, and so are the named queues' (the paused one resumed first).
    let q = f.open();
    let mut delivered = Vec::new();
    while let Some(lease) = q.dequeue().unwrap() {
        let id = lease.id().0;
        let payload = lease.payload().to_vec();
        match id {
            5 => assert!(payload == big(20_000, 3)),
            9 => assert!(payload == big(5000, 4)),
            _ => {}
        }
        delivered.push(id);
        lease.ack().unwrap();
    }
    delivered.sort_unstable();
    assert_eq!(delivered, vec![5, 6, 8, 9, 10]);
    for id in [2, 4, 7] {
        // The state it was cancelled in; without a history its row goes.
        assert_eq!(
            q.cancel(JobId(id), "done").unwrap().was(),
            Some(JobState::Scheduled)
        );
        assert_eq!(q.job(JobId(id)).unwrap(), None);
    }
    q.retry(JobId(3)).unwrap();
    let lease = q.dequeue().unwrap().unwrap();
    assert!(lease.payload() == big(3000, 5));
    lease.ack().unwrap();
    let kept = q.existing("kept").unwrap();
    let lease = kept.dequeue().unwrap().unwrap();
    assert_eq!((lease.id(), lease.attempt()), (JobId(14), 3));
    lease.ack_with_result(b"third").unwrap();
    let sync = q.existing("sync").unwrap();
    let lease = sync.dequeue().unwrap().unwrap();
    assert_eq!(
        (lease.id(), lease.payload()),
        (JobId(11), &b"sync-ready"[..])
    );
    lease.ack().unwrap();
    let quiet = q.existing("quiet").unwrap();
    assert!(quiet.resume().unwrap());
    let lease = quiet.dequeue().unwrap().unwrap();
    assert_eq!(
        (lease.id(), lease.payload()),
        (JobId(15), &b"quiet-ready"[..])
    );
    lease.ack().unwrap();
    assert_consistent(&q);
    drop((kept, sync, quiet, q));
    // `sync` and `quiet` were the first and third named queues made: numbers 1 and 3.
    for table in ["leaseq_jobs", "leaseq_q1_jobs", "leaseq_q3_jobs"] {
        assert!(
            record_versions(&f.path, table).is_empty(),
            "{table}: all acked or cancelled without a history"
        );
    }
    let rows = record_versions(&f.path, kept_jobs);
    // 12 and 13 ended in version 6 and stay so until removed; 14 ended in the current
    // version, 8.
    assert_eq!(rows, vec![(12, 6), (13, 6), (14, 8)]);
    let q = f.open();
    assert_consistent(&q);
    let kept = q.existing("kept").unwrap();
    assert_eq!(
        kept.job(JobId(14)).unwrap().unwrap().result.as_deref(),
        Some(&b"third"[..])
    );
}

/// A power loss at any write or sync of the open that upgrades the format-9 fixture leaves a
/// file that opens with the same content.
#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_9_to_10_upgrade_leaves_a_file_that_opens_the_same() {
    power_loss_at_every_write_of_the_upgrade(FIXTURE9, 9, 131, assert_fixture9);
}

/// Job 2 of the format-8 and format-9 fixtures: nacked once at `T0_MS` ("later", 30 s of
/// backoff), priority -1, its error kept with its time.
fn assert_nacked_once_at_t0(nacked: &leaseq::JobInfo) {
    assert_eq!(
        (
            nacked.state,
            nacked.run_at_ms,
            nacked.attempts,
            nacked.priority
        ),
        (JobState::Scheduled, T0_MS + 30_000, 1, -1)
    );
    assert_eq!(
        nacked.errors,
        vec![leaseq::AttemptError {
            attempt: 1,
            at_ms: Some(T0_MS),
            message: "later".into()
        }]
    );
}

const FIXTURE10: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format10-crashed.leaseq"
);

/// Checks `format10-crashed.leaseq`'s content (see the fixtures README) on a queue opened from
/// it, just after the open that upgraded it and returned its lease. Reads only.
fn assert_fixture10(q: &Queue) {
    assert_consistent(q);
    let r = q.recovery();
    assert_returned(&r, 1);
    let job = |id: u64| q.job(JobId(id)).unwrap().unwrap();
    assert_eq!(q.job(JobId(1)).unwrap(), None, "acked without a history");
    assert!(q.is_applied("A1").unwrap());
    let dead = job(2);
    assert_eq!((dead.state, dead.attempts), (JobState::Dead, 1));
    assert_eq!(dead.last_error.as_deref(), Some("broken"));
    let returned = job(3);
    assert_eq!((returned.state, returned.attempts), (JobState::Ready, 1));
    let apart = job(4);
    assert_eq!(
        (apart.state, apart.payload_bytes, apart.priority),
        (JobState::Ready, 3000, -1)
    );
    assert!(q.payload(JobId(4)).unwrap().unwrap() == vec![7u8; 3000]);
    assert_eq!(apart.idempotency_key.as_deref(), Some(&b"K4"[..]));
    let later = job(5);
    assert_eq!(
        (later.state, later.run_at_ms),
        (JobState::Scheduled, T0_MS + 60_000)
    );
    let sync = q.existing("sync").unwrap();
    assert_eq!(
        sync.job(JobId(6))
            .unwrap()
            .unwrap()
            .idempotency_key
            .as_deref(),
        Some(&b"S6"[..])
    );
    assert_eq!(crate::common::effects(q).get(&1), Some(&1));
}

/// Format 10 (the last without the journal) upgrades to the current format at its first
/// open, in a checkpoint: the file alone is then upgraded (a format-10 build refuses it) and
/// every job is there; new calls go through the journal, and a reopen finds them.
#[test]
fn format10_file_upgrades_and_goes_on_through_the_journal() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE10, &f.path).unwrap();
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, Some(10));
    assert_fixture10(&q);
    let id = q.enqueue(b"new", EnqueueOptions::default()).unwrap().id();
    assert!(q.commit_stats().journal_frames >= 1);
    drop(q);
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    assert!(q.job(id).unwrap().is_some());
    assert_eq!(q.check().unwrap(), vec![]);
}

/// A power loss at any write or sync of either file during the open that upgrades the
/// format-10 fixture (making the journal, recording its session, the upgrade's checkpoint,
/// lease recovery) leaves a file that opens with the same content.
#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_10_to_11_upgrade_leaves_a_file_that_opens_the_same() {
    power_loss_at_every_write_of_the_upgrade(FIXTURE10, 10, 151, assert_fixture10);
}

/// The open returned `n` leases; or, after a power loss in an earlier open whose lease
/// recovery reached the journal whole (its answer never given, as a commit whose fsync was
/// cut), the replay returned them and this open found none. The jobs' states, checked by the
/// caller, are the same either way.
fn assert_returned(r: &leaseq::Recovery, n: u64) {
    assert!(
        r.leases_returned == n
            || (r.leases_returned == 0 && matches!(r.journal, leaseq::JournalFound::Replayed(_))),
        "{r:?}"
    );
}

const FIXTURE11: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format11-crashed.leaseq"
);

/// The format-11 fixture's journal as it was left: its frames
/// (`format11-crashed.leaseq-journal.head`), then the zeros of its preallocated tail, not
/// stored (see the fixtures README).
fn fixture11_journal() -> Vec<u8> {
    let mut journal =
        std::fs::read(format!("{FIXTURE11}-journal.head")).expect("the journal's frames");
    assert!(journal.len() < FIXTURE11_JOURNAL_BYTES);
    journal.resize(FIXTURE11_JOURNAL_BYTES, 0);
    journal
}

/// The length of the format-11 fixture's journal: 4 MiB of frames after a 4 KiB header.
const FIXTURE11_JOURNAL_BYTES: usize = (4 << 20) + 4096;

/// Checks `format11-crashed.leaseq`'s content (see the fixtures README) on a queue opened from
/// it and its journal, just after the open that replayed the journal, upgraded the file and
/// returned its lease. Reads only.
fn assert_fixture11(q: &Queue) {
    assert_consistent(q);
    assert_returned(&q.recovery(), 1);
    let job = |id: u64| q.job(JobId(id)).unwrap().unwrap();
    assert_eq!(q.job(JobId(1)).unwrap(), None, "acked without a history");
    assert!(q.is_applied("A1").unwrap());
    assert_eq!(crate::common::effects(q).get(&1), Some(&1));
    let dead = job(2);
    assert_eq!((dead.state, dead.attempts), (JobState::Dead, 1));
    // From the journal's frames: the lease came back, its attempt counted, no longer leased.
    let returned = job(3);
    assert_eq!(
        (returned.state, returned.attempts, returned.leased_ms),
        (JobState::Ready, 1, None)
    );
    // Job 4 (priority -1) was the one delivered and acked after 250 ms.
    assert_eq!(q.job(JobId(4)).unwrap(), None, "acked");
    let later = job(5);
    assert_eq!(
        (later.state, later.run_at_ms),
        (JobState::Scheduled, T0_MS + 500 + 60_000)
    );
    let sync = q.existing("sync").unwrap();
    assert_eq!(
        sync.job(JobId(6))
            .unwrap()
            .unwrap()
            .idempotency_key
            .as_deref(),
        Some(&b"S6"[..])
    );
    let timed = job(7);
    assert_eq!((timed.state, timed.attempts), (JobState::Ready, 0));
    assert_eq!(q.payload(JobId(7)).unwrap().as_deref(), Some(&b"timed"[..]));
    // Format 11 timed nothing.
    assert!(q.metrics(0).unwrap().iter().all(|m| m.runs == 0));
}

/// Format 11 (the journal's first) left by a crash: the open replays the journal's frames
/// (written by the format-11 build), then upgrades the file to 12 in a checkpoint and
/// returns the lease; from then on a delivery is timed, and a reopen upgrades nothing.
#[test]
fn format11_file_replays_its_journal_then_upgrades_and_times_deliveries() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE11, &f.path).unwrap();
    let mut journal_path = f.path.clone().into_os_string();
    journal_path.push("-journal");
    std::fs::write(&journal_path, fixture11_journal()).unwrap();
    let q = f.open();
    let r = q.recovery();
    assert_eq!(r.upgraded_from, Some(11));
    assert!(
        matches!(r.journal, leaseq::JournalFound::Replayed(n) if n >= 1),
        "{r:?}"
    );
    assert_fixture11(&q);
    // A delivery now is timed from its dequeue.
    let lease = q.dequeue().unwrap().unwrap();
    let started = f.clock_now();
    assert_eq!(q.job(lease.id()).unwrap().unwrap().leased_ms, Some(started));
    f.clock.advance(Duration::from_millis(40));
    lease.ack().unwrap();
    let m = q.metrics(0).unwrap();
    assert_eq!(m.iter().map(|m| m.runs).sum::<u64>(), 1);
    drop(q);
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None, "upgraded once");
    assert_eq!(q.check().unwrap(), vec![]);
}

/// A power loss at any write or sync of either file during the open that replays the
/// format-11 fixture's journal and upgrades it leaves files that open with the same content.
#[cfg(feature = "sim")]
#[test]
fn a_power_loss_anywhere_in_the_11_to_12_upgrade_leaves_a_file_that_opens_the_same() {
    power_loss_at_every_write_of_the_upgrade_with(
        FIXTURE11,
        Some(fixture11_journal()),
        11,
        211,
        assert_fixture11,
    );
}

// ---------------------------------------------------------------------------------------
// The upgrades from formats 12 and 13 (no fixture: a current file taken back by hand)
// ---------------------------------------------------------------------------------------

const QUEUE_LIMITS: TableDefinition<u32, (u64, u64, u64, u64)> =
    TableDefinition::new("leaseq_queue_limits");
const DROPPED: TableDefinition<u32, u64> = TableDefinition::new("leaseq_dropped");
const GROUP_FENCES: TableDefinition<(u32, u64, u64), u64> =
    TableDefinition::new("leaseq_group_fences");
const SLIDING_LIMITS: TableDefinition<u32, (u64, u64, u64, u64)> =
    TableDefinition::new("leaseq_sliding_limits");
const RATE_LOG: TableDefinition<(u32, u64), u64> = TableDefinition::new("leaseq_rate_log");

/// A format-12 file (before size limits), a format-13 one (before group waits for
/// cancelled deliveries) and a format-14 one (before record version 8, a job's own
/// execution timeout) open upgraded, with their jobs, and a format-12 file is no longer
/// refused as unsupported (it was, between formats 13 and 14: the upgrade's version range
/// stopped at 11).
#[test]
fn files_of_formats_12_to_14_are_upgraded() {
    for from in [12u64, 13, 14] {
        let f = Fixture::new();
        {
            let q = f.open();
            q.enqueue(b"kept", EnqueueOptions::default().group("g"))
                .unwrap();
            q.close();
        }
        {
            let db = redb::Database::open(&f.path).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(META)
                .unwrap()
                .insert("format_version", from)
                .unwrap();
            tx.delete_table(SLIDING_LIMITS).unwrap();
            tx.delete_table(RATE_LOG).unwrap();
            if from <= 13 {
                tx.delete_table(GROUP_FENCES).unwrap();
            }
            if from == 12 {
                tx.delete_table(QUEUE_LIMITS).unwrap();
                tx.delete_table(DROPPED).unwrap();
            }
            tx.commit().unwrap();
        }
        let q = f.open();
        assert_eq!(q.recovery().upgraded_from, Some(from));
        assert_consistent(&q);
        let l = q.dequeue().unwrap().expect("the job is kept");
        assert_eq!(l.payload(), b"kept");
        // The new table works: a cancelled delivery holds its group.
        q.enqueue(b"next", EnqueueOptions::default().group("g"))
            .unwrap();
        q.cancel(l.id(), "stop").unwrap();
        assert!(q.dequeue().unwrap().is_none());
        assert_consistent(&q);
        drop(l);
        // And the sliding-window tables of format 15.
        q.set_rate_limit(Some(leaseq::RateLimit::sliding(1, Duration::from_secs(60))))
            .unwrap();
        for _ in 0..2 {
            q.enqueue(b"limited", EnqueueOptions::default()).unwrap();
        }
        f.clock.advance(Duration::from_secs(1));
        assert!(q.dequeue().unwrap().is_some());
        assert!(q.dequeue().unwrap().is_none(), "one in the sliding window");
        assert_eq!(
            q.stats().unwrap().ready,
            2,
            "the other and the grouped one wait"
        );
        assert_consistent(&q);
        q.close();
        drop(q);
        // The last handle lets go just after its commit (a helper thread may still hold it).
        let t = std::time::Instant::now();
        let db = loop {
            match redb::Database::open(&f.path) {
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
                    if t.elapsed() < Duration::from_secs(20) =>
                {
                    std::thread::sleep(Duration::from_millis(2))
                }
                other => break other.unwrap(),
            }
        };
        let rtx = redb::ReadableDatabase::begin_read(&db).unwrap();
        let v = rtx
            .open_table(META)
            .unwrap()
            .get("format_version")
            .unwrap()
            .unwrap()
            .value();
        assert_eq!(v, leaseq::FORMAT_VERSION);
        assert!(rtx.open_table(QUEUE_LIMITS).is_ok());
        assert!(rtx.open_table(RATE_LOG).is_ok());
    }
}
