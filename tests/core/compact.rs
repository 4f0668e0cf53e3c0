//! File size under churn and `Queue::compact` (issue 9, cases C20 and C31).
//!
//! Adversarial tests of the "run for years" work (issue 9): compaction after failures.

#[cfg(feature = "sim")]
use std::time::Duration;

use crate::common::{Fixture, all_ok, assert_consistent, bump};
use leaseq::{Durability, EnqueueOptions, Error, Queue};
use redb::ReadableDatabase;
#[cfg(feature = "sim")]
use {
    crate::common::{self, T0_MS},
    leaseq::{JobState, RetryPolicy},
};

const KIB: usize = 1024;

fn file_len(f: &Fixture) -> u64 {
    std::fs::metadata(&f.path).unwrap().len()
}

/// One churn cycle: `jobs` jobs of 4 KiB enqueued in batches, then drained with
/// `ack_with_batch` (each effect one row in the caller's table, in the same file).
fn churn_cycle(q: &Queue, cycle: usize, jobs: usize) {
    let payload = vec![cycle as u8; 4 * KIB];
    for _ in 0..jobs / 500 {
        q.enqueue_batch((0..500).map(|_| (payload.as_slice(), EnqueueOptions::default())))
            .unwrap();
    }
    loop {
        let batch = q.dequeue_batch(500).unwrap();
        if batch.is_empty() {
            break;
        }
        all_ok(
            q.ack_with_batch(&batch, |tx, l| bump(tx, l.id().0 % 1000))
                .unwrap(),
        );
    }
    assert!(q.is_empty().unwrap());
}

/// C20: 10 cycles of 10,000 jobs of 4 KiB, each enqueued then drained with `ack_with`. The
/// file after cycle 10 is at most cycle 2's plus slack (freed pages are reused, nothing grows
/// with throughput), and `compact()` on the drained queue brings it near its empty size.
#[test]
fn c20_file_size_stays_flat_under_churn_and_compact_shrinks_it() {
    let f = Fixture::new();
    let mut q = f
        .builder()
        .durability(Durability::None) // the sizes are the point here, not the fsyncs
        .open(&f.path)
        .unwrap();
    let empty = file_len(&f);
    let mut sizes = Vec::new();
    for cycle in 0..10 {
        churn_cycle(&q, cycle, 10_000);
        q.flush().unwrap();
        sizes.push(file_len(&f));
    }
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.applied), (0, 0), "{s:?}");
    assert!(
        sizes[9] <= sizes[1] + sizes[1] / 10,
        "the file grew with throughput: {sizes:?}"
    );
    assert!(
        sizes[1] > 20 << 20,
        "the churn did fill the file: {sizes:?}"
    );
    assert!(q.compact().unwrap(), "something was given back");
    let compacted = file_len(&f);
    assert!(
        compacted <= empty + (2 << 20),
        "compacted to {compacted} bytes (empty file: {empty}, churned: {sizes:?})"
    );
    assert_consistent(&q);
    // The compacted queue works, and keeps working after a reopen.
    churn_cycle(&q, 11, 1_000);
    drop(q);
    let q = f.open();
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// C31: `compact()` while a lease (or another handle) is alive is refused, typed, and
/// changes nothing; the lease still acks afterwards; once they are dropped it runs.
#[test]
fn c31_compact_while_the_queue_is_in_use_is_refused_and_the_lease_still_acks() {
    let f = Fixture::new();
    let mut q = f.open();
    let ids: Vec<_> = (0..2_000)
        .map(|i| {
            q.enqueue(&vec![i as u8; 2 * KIB], EnqueueOptions::default())
                .unwrap()
                .id()
        })
        .collect();
    for _ in 0..1_999 {
        q.dequeue().unwrap().unwrap().ack().unwrap();
    }
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(lease.id(), ids[1_999]);
    let before = std::fs::read(&f.path).unwrap();
    assert!(matches!(q.compact(), Err(Error::Busy { .. })));
    let clone = q.clone();
    assert_eq!(
        std::fs::read(&f.path).unwrap(),
        before,
        "a refused compact wrote nothing"
    );
    lease.ack().unwrap();
    drop(lease);
    assert!(
        matches!(q.compact(), Err(Error::Busy { .. })),
        "a clone is alive"
    );
    drop(clone);
    {
        let rtx = redb::ReadableDatabase::begin_read(q.database()).unwrap();
        assert!(matches!(q.compact(), Err(Error::Busy { .. })), "{rtx:?}");
    }
    let len = file_len(&f);
    assert!(q.compact().unwrap());
    assert!(file_len(&f) < len, "{} >= {len}", file_len(&f));
    assert!(q.is_empty().unwrap());
    q.enqueue(b"after", EnqueueOptions::default()).unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().payload(), b"after");
    assert_consistent(&q);
}

/// C31 on the power-loss simulator: 50,000 jobs enqueued, 49,000 drained, then `compact()`
/// with power lost at the k-th write or sync of the compaction, for k spread over all of
/// them, and with the disk full. After every reopen: the same 1,000 jobs in the same states,
/// with the same attempts and keys, and `check()` empty.
#[cfg(feature = "sim")]
mod sim {
    use super::*;
    use leaseq::sim::SimDisk;
    use leaseq::{JobId, JobInfo, JobState, ManualClock};

    const T0: u64 = common::T0_MS;

    fn open(disk: &SimDisk) -> Queue {
        Queue::builder()
            .clock(ManualClock::new(T0))
            .retry(leaseq::RetryPolicy::immediate())
            .open_backend(disk.backend())
            .unwrap()
    }

    /// The 1,000 jobs left, as the queue shows them.
    fn snapshot(q: &Queue) -> Vec<JobInfo> {
        let mut out = Vec::new();
        for state in [JobState::Ready, JobState::Scheduled, JobState::Dead] {
            let mut after = None;
            loop {
                let page = q.jobs(state, after, 1_000).unwrap();
                out.extend(page.jobs);
                match page.next {
                    Some(c) => after = Some(c),
                    None => break,
                }
            }
        }
        out.sort_by_key(|j| j.id);
        out
    }

    /// The base image: 50,000 jobs enqueued (some with keys, delays, few attempts), 49,000
    /// drained, some of the rest dead, cleanly closed.
    fn base() -> (Vec<u8>, Vec<JobInfo>) {
        let disk = SimDisk::new(7);
        let q = open(&disk);
        let payload = [9u8; 64];
        for b in 0..50 {
            q.enqueue_batch((0..1_000).map(|i| {
                let mut o = EnqueueOptions::default().idempotency_key(format!("k{b}-{i}"));
                if i % 7 == 0 {
                    o = o.dedup_key(format!("d{b}-{i}"));
                }
                if b == 49 && i % 3 == 0 {
                    o = o.delay(Duration::from_secs(60));
                }
                (&payload[..], o)
            }))
            .unwrap();
        }
        for _ in 0..49 {
            let batch = q.dequeue_batch(1_000).unwrap();
            all_ok(
                q.ack_with_batch(&batch, |tx, l| bump(tx, l.id().0))
                    .unwrap(),
            );
        }
        let last = q.dequeue_batch(50).unwrap();
        for l in &last[..20] {
            l.fail("dead on purpose").unwrap();
        }
        for l in &last[20..] {
            l.nack_after("again", Duration::ZERO).unwrap();
        }
        drop(last);
        let jobs = snapshot(&q);
        assert_eq!(jobs.len(), 1_000);
        assert_consistent(&q);
        drop(q);
        (disk.live_image(), jobs)
    }

    fn assert_same(q: &Queue, want: &[JobInfo], what: &str) {
        let v = q.check().unwrap();
        assert!(v.is_empty(), "{what}: {v:?}");
        let got = snapshot(q);
        assert_eq!(got.len(), want.len(), "{what}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g, w, "{what}");
        }
        assert_eq!(q.stats().unwrap().total, 1_000, "{what}");
    }

    #[test]
    fn c31_power_loss_and_a_full_disk_during_compact_lose_nothing() {
        let (image, want) = base();
        // A compaction without faults: how many mutating calls it makes.
        let disk = SimDisk::from_image(image.clone(), 1);
        let mut q = open(&disk);
        let ops_before = disk.mutating_ops();
        assert!(q.compact().unwrap());
        let ops = disk.mutating_ops() - ops_before;
        assert!(ops > 4, "{ops} mutating calls");
        assert!(
            disk.live_image().len() < image.len(),
            "compaction shrank the file"
        );
        assert_same(&q, &want, "after a clean compaction");
        drop(q);
        let q = open(&SimDisk::from_image(disk.live_image(), 2));
        assert_same(&q, &want, "reopened after a clean compaction");
        drop(q);

        // Power lost at every k-th call of it (about 24 points, first and last included).
        let step = (ops / 24).max(1);
        let mut points: Vec<u64> = (0..ops).step_by(step as usize).collect();
        points.push(ops - 1);
        for (n, &k) in points.iter().enumerate() {
            let disk = SimDisk::from_image(image.clone(), 100 + n as u64);
            let mut q = open(&disk);
            disk.crash_after(k);
            let r = q.compact();
            assert!(
                disk.is_crashed(),
                "crash point {k} of {ops} not reached: {r:?}"
            );
            assert!(r.is_err(), "crash point {k}: {r:?}");
            drop(q);
            let reboot = SimDisk::from_image(disk.crash_image(), 200 + n as u64);
            let q = open(&reboot);
            assert_same(&q, &want, &format!("power lost at call {k} of {ops}"));
        }

        // A full disk: the compaction's growth is refused; nothing is lost, the handle
        // refuses writes until reopened.
        for cap_extra in [0u64, 4096, 64 << 10] {
            let disk = SimDisk::from_image(image.clone(), 3);
            let mut q = open(&disk);
            disk.set_max_len(disk.live_image().len() as u64 + cap_extra);
            match q.compact() {
                Ok(_) => {}
                Err(e) => {
                    assert!(
                        matches!(
                            q.enqueue(b"x", EnqueueOptions::default()),
                            Err(Error::CommitFailed { .. })
                        ),
                        "after {e}"
                    );
                }
            }
            drop(q);
            let q = open(&SimDisk::from_image(disk.live_image(), 4));
            assert_same(&q, &want, &format!("full disk (+{cap_extra} bytes)"));
        }
        let _ = JobId(0);
    }
}

// ---------------------------------------------------------------------------------------
// Compaction
// ---------------------------------------------------------------------------------------

/// `compact` refuses (`Busy`, never waits) while a read or a write transaction of the
/// caller's is open on `database()`, and runs once they are gone; twice in a row is fine.
#[test]
fn compact_refuses_open_transactions_without_waiting() {
    let f = Fixture::new();
    let mut q = f.open();
    q.enqueue_batch((0..2_000).map(|_| (&[7u8; 512][..], EnqueueOptions::default())))
        .unwrap();
    let all = q.dequeue_batch(2_000).unwrap();
    all_ok(q.ack_batch(&all).unwrap());
    drop(all);
    let rtx = q.database().begin_read().unwrap();
    assert!(matches!(q.compact(), Err(Error::Busy { .. })));
    drop(rtx);
    let wtx = q.database().begin_write().unwrap();
    assert!(matches!(q.compact(), Err(Error::Busy { .. })));
    wtx.abort().unwrap();
    let before = std::fs::metadata(&f.path).unwrap().len();
    q.compact().unwrap();
    let after = std::fs::metadata(&f.path).unwrap().len();
    assert!(after < before, "{after} < {before}");
    let second = q.compact().unwrap();
    assert_eq!(std::fs::metadata(&f.path).unwrap().len(), after, "{second}");
    q.enqueue(b"after", EnqueueOptions::default()).unwrap();
    assert_consistent(&q);
}

#[cfg(feature = "sim")]
mod after_failures {
    use super::*;
    use leaseq::ManualClock;
    use leaseq::sim::SimDisk;

    fn open(disk: &SimDisk) -> Queue {
        Queue::builder()
            .clock(ManualClock::new(T0_MS))
            .retry(RetryPolicy::immediate())
            .open_backend(disk.backend())
            .unwrap()
    }

    fn image_with_jobs() -> Vec<u8> {
        let disk = SimDisk::new(1);
        let q = open(&disk);
        q.enqueue_batch((0..3_000).map(|i| {
            (
                &[1u8; 256][..],
                EnqueueOptions::default().idempotency_key(format!("k{i}")),
            )
        }))
        .unwrap();
        let batch = q.dequeue_batch(2_900).unwrap();
        all_ok(q.ack_with_batch(&batch, |_, _| Ok(())).unwrap());
        drop(batch);
        drop(q);
        disk.live_image()
    }

    /// A handle whose commit failed (power lost) refuses `compact` with `CommitFailed`, and
    /// the reopened file is whole.
    #[test]
    fn compact_on_a_poisoned_handle_is_commit_failed() {
        let image = image_with_jobs();
        let disk = SimDisk::from_image(image, 2);
        let mut q = open(&disk);
        disk.crash_after(0);
        assert!(q.enqueue(b"x", EnqueueOptions::default()).is_err());
        let r = q.compact();
        assert!(matches!(r, Err(Error::CommitFailed { .. })), "{r:?}");
        drop(q);
        let q = open(&SimDisk::from_image(disk.crash_image(), 3));
        assert_eq!(q.stats().unwrap().ready, 100);
        assert_consistent(&q);
    }

    /// After a compaction that failed (power lost at its k-th write or sync): a second
    /// `compact` is `CommitFailed`, every write is `CommitFailed`, reads answer or fail typed
    /// without panicking, and the file reopened after the crash holds every job.
    #[test]
    fn after_a_failed_compact() {
        let image = image_with_jobs();
        let ops = {
            let disk = SimDisk::from_image(image.clone(), 4);
            let mut q = open(&disk);
            let at = disk.mutating_ops();
            assert!(q.compact().unwrap());
            disk.mutating_ops() - at
        };
        assert!(ops > 2, "{ops}");
        for k in [0, ops / 2, ops - 1] {
            let disk = SimDisk::from_image(image.clone(), 4);
            let mut q = open(&disk);
            let before = q.stats().unwrap();
            disk.crash_after(k);
            assert!(q.compact().is_err(), "crash at {k} of {ops}");
            let r = q.compact();
            assert!(matches!(r, Err(Error::CommitFailed { .. })), "{r:?}");
            assert!(matches!(
                q.enqueue(b"x", EnqueueOptions::default()),
                Err(Error::CommitFailed { .. })
            ));
            assert!(matches!(q.dequeue(), Err(Error::CommitFailed { .. })));
            assert!(matches!(q.prune(), Err(Error::CommitFailed { .. })));
            if let Ok(s) = q.stats() {
                assert_eq!(s, before, "crash at {k}");
            }
            let _ = q.jobs(JobState::Ready, None, 10);
            let _ = q.check();
            drop(q);
            let q = open(&SimDisk::from_image(disk.crash_image(), 5));
            assert_eq!(q.stats().unwrap(), before, "crash at {k}");
            assert_consistent(&q);
        }
    }
}
