//! Producer dedup over time (issue 9, C29, C30): keys held while the job is live, or for a
//! window after enqueue whatever the job does; a dead holder said explicitly; a job's own
//! retry policy.

use crate::common::{Fixture, T0_MS, assert_consistent, secs};
use leaseq::{Clock, EnqueueOptions, Enqueued, Error, JobId, JobState, RetryPolicy};
use std::time::Duration;

fn windowed(k: &str, s: u64) -> EnqueueOptions {
    EnqueueOptions::default().dedup_key(k).dedup_window(secs(s))
}

/// C29: `enq(A, k, window=5s)`; the clock passes 6 s; A is delivered, attempt 1, payload
/// intact: the window's end released the key only. `enq(B, k)` → New(B); the ack of A leaves
/// k → B (ownership is checked on release); `enq(C, k)` → Duplicate(B).
#[test]
fn c29_a_window_ending_releases_the_key_never_the_job() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", windowed("k", 5)).unwrap().id();
    f.clock.advance(secs(6));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt(), l.payload()), (a, 1, &b"A"[..]));
    let b = match q
        .enqueue(b"B", EnqueueOptions::default().dedup_key("k"))
        .unwrap()
    {
        Enqueued::New(b) => b,
        other => panic!("the window ended: {other:?}"),
    };
    l.ack().unwrap();
    assert_eq!(
        q.enqueue(b"C", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
        Enqueued::Duplicate(b),
        "A's ack did not release B's key"
    );
    assert_consistent(&q);
}

/// C30: `enq(A, k, window=60s)`; `deq`; `ack` at t=1s; `enq(B, k)` at t=30s → Duplicate(A)
/// (the window outlives the job; the id named is the job that took the key, gone now); at
/// t=61s → New. A duplicate does not extend the window.
#[test]
fn c30_a_window_outlives_the_ack_and_a_duplicate_does_not_extend_it() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", windowed("k", 60)).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    f.clock.advance(secs(1));
    l.ack().unwrap();
    assert_eq!(q.job(a).unwrap(), None, "A is gone");
    f.clock.advance(secs(29));
    assert_eq!(
        q.enqueue(b"B", windowed("k", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(q.len().unwrap(), 0, "nothing was added");
    f.clock.advance(secs(30)); // t = 60 s: the window ends at exactly 60 s
    assert!(matches!(
        q.enqueue(b"B", windowed("k", 60)).unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// The lease of job `id`, snoozing for an hour every other job dequeued before it.
fn take(q: &leaseq::Queue, id: JobId) -> leaseq::Lease {
    loop {
        let l = q.dequeue().unwrap().expect("the job is ready");
        if l.id() == id {
            return l;
        }
        l.snooze(secs(3600)).unwrap();
    }
}

/// Removing a windowed job on purpose (`remove`, `purge`) releases its key and ends its
/// window (BullMQ's `Job.remove` frees the deduplication id); an ack or the pruning of a dead
/// job past its retention leaves the window running (C30). Both sides in one test, so the
/// difference is the call, not the setup.
#[test]
fn remove_and_purge_end_a_window_an_ack_and_a_prune_do_not() {
    let f = Fixture::new();
    let q = f
        .builder()
        .dead_retention(Some(secs(10)))
        .retry(RetryPolicy::immediate())
        .open(&f.path)
        .unwrap();
    // remove: the key is free again at once, and a new job takes it.
    let a = q.enqueue(b"A", windowed("removed", 600)).unwrap().id();
    q.remove(a).unwrap();
    let a2 = match q.enqueue(b"A2", windowed("removed", 600)).unwrap() {
        Enqueued::New(id) => id,
        other => panic!("remove ended the window: {other:?}"),
    };
    // purge (of each purgeable state): the same.
    let s = q
        .enqueue(b"S", windowed("scheduled", 600).delay(secs(60)))
        .unwrap()
        .id();
    assert_eq!(q.job(s).unwrap().unwrap().state, JobState::Scheduled);
    assert_eq!(q.purge(JobState::Scheduled).unwrap(), 1);
    assert!(matches!(
        q.enqueue(b"S2", windowed("scheduled", 600)).unwrap(),
        Enqueued::New(_)
    ));
    q.remove(a2).unwrap();
    // ack: the window outlives the job.
    let b = q.enqueue(b"B", windowed("kept", 600)).unwrap().id();
    take(&q, b).ack().unwrap();
    assert_eq!(
        q.enqueue(b"B2", windowed("kept", 600)).unwrap(),
        Enqueued::Duplicate(b)
    );
    // A dead job pruned past its retention: the window outlives it too.
    let d = q
        .enqueue(b"D", windowed("dead", 600).max_attempts(1))
        .unwrap()
        .id();
    assert_eq!(take(&q, d).nack("no").unwrap(), JobState::Dead);
    f.clock.advance(secs(11));
    assert_eq!(q.prune().unwrap().dead, 1);
    assert_eq!(q.job(d).unwrap(), None);
    assert_eq!(
        q.enqueue(b"D2", windowed("dead", 600)).unwrap(),
        Enqueued::Duplicate(d)
    );
    assert_consistent(&q);
}

/// Dedup keys held by windows that ended are cleaned up: a few per new key, and all by
/// `prune`; `stats().dedup_keys` counts what is held.
#[test]
fn ended_windows_are_pruned() {
    let f = Fixture::new();
    let q = f.open();
    for i in 0..20 {
        let l = {
            q.enqueue(b"x", windowed(&format!("w{i}"), 10)).unwrap();
            q.dequeue().unwrap().unwrap()
        };
        l.ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().dedup_keys, 20, "held by their windows");
    f.clock.advance(secs(11));
    q.enqueue(b"y", EnqueueOptions::default().dedup_key("live"))
        .unwrap();
    assert_eq!(
        q.stats().unwrap().dedup_keys,
        20 - 2 + 1,
        "two ended per new key"
    );
    assert_eq!(q.prune().unwrap().dedup_windows, 18);
    assert_eq!(q.stats().unwrap().dedup_keys, 1);
    assert_consistent(&q);
}

/// A dead job keeps its key (it is still there to see and requeue), and a duplicate of it says
/// so; removing or requeueing it settles the key.
#[test]
fn a_duplicate_of_a_dead_job_says_so() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().dedup_key("k"))
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().fail("bad input").unwrap();
    assert_eq!(
        q.enqueue(b"A fixed", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
        Enqueued::DuplicateDead(a)
    );
    q.requeue_dead(a).unwrap();
    assert_eq!(
        q.enqueue(b"A fixed", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
        Enqueued::Duplicate(a)
    );
    q.dequeue().unwrap().unwrap().fail("again").unwrap();
    q.remove(a).unwrap();
    assert!(matches!(
        q.enqueue(b"A fixed", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// A windowed key survives a reopen, and so does the window's end.
#[test]
fn a_window_survives_a_reopen() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", windowed("k", 60)).unwrap().id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    drop(q);
    let q = f.open();
    assert_eq!(
        q.enqueue(b"B", windowed("k", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    f.clock.advance(secs(60));
    assert!(matches!(
        q.enqueue(b"B", windowed("k", 60)).unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

#[test]
fn bad_windows_are_refused_and_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let cases = [
        EnqueueOptions::default().dedup_window(secs(5)), // no dedup key
        EnqueueOptions::default()
            .dedup_key("k")
            .dedup_window(Duration::ZERO),
        EnqueueOptions::default()
            .dedup_key("k")
            .dedup_window(Duration::from_micros(500)),
        EnqueueOptions::default()
            .dedup_key("k")
            .dedup_window(leaseq::DELAY_MAX + Duration::from_millis(1)),
        EnqueueOptions::default().retry(RetryPolicy::fixed(Duration::ZERO)),
    ];
    for opts in cases {
        let r = q.enqueue(b"x", opts.clone());
        assert!(
            matches!(r, Err(Error::InvalidOption { .. })),
            "{opts:?}: {r:?}"
        );
    }
    assert_eq!(q.stats().unwrap().total, 0);
    assert_eq!(q.stats().unwrap().dedup_keys, 0);
}

/// A job's own retry policy wins over the queue's (here: the fixture's `immediate`), and it is
/// kept across a reopen.
#[test]
fn a_jobs_own_retry_policy() {
    let f = Fixture::new();
    let q = f.open();
    let slow = q
        .enqueue(
            b"slow",
            EnqueueOptions::default().retry(RetryPolicy::fixed(secs(30))),
        )
        .unwrap()
        .id();
    let fast = q.enqueue(b"fast", EnqueueOptions::default()).unwrap().id();
    for l in q.dequeue_batch(2).unwrap() {
        l.nack("later").unwrap();
    }
    assert_eq!(q.job(fast).unwrap().unwrap().state, JobState::Ready);
    let info = q.job(slow).unwrap().unwrap();
    assert_eq!(
        (info.state, info.run_at_ms),
        (JobState::Scheduled, T0_MS + 30_000)
    );
    drop(q);
    let q = f.open();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), fast);
    l.ack().unwrap();
    f.clock.advance(secs(30));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt()), (slow, 2));
    l.nack("again").unwrap();
    assert_eq!(
        q.job(slow).unwrap().unwrap().run_at_ms,
        f.clock.now_ms() + 30_000
    );
    let _ = JobId(0);
}

// C16: a dedup key held while its job lives is free once the job is gone, whether acked or
// dead and purged: the next enqueue with the key is a new job, and every dedup entry left
// names a live job (`check`).
#[test]
fn c16_a_key_is_free_after_ack_and_after_purge() {
    let f = Fixture::new();
    let q = f.builder().max_attempts(1).open(&f.path).unwrap();
    let k = EnqueueOptions::default().dedup_key("k");
    let a = q.enqueue(b"A", k.clone()).unwrap().id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.purge(JobState::Dead).unwrap(), 0);
    let b = match q.enqueue(b"B", k.clone()).unwrap() {
        Enqueued::New(b) => b,
        other => panic!("expected a new job, got {other:?}"),
    };
    assert_ne!(a, b);
    assert_consistent(&q);
    // B dies (one attempt), holds the key while dead, and lets it go when purged.
    q.dequeue().unwrap().unwrap().nack("no").unwrap();
    assert_eq!(q.job(b).unwrap().unwrap().state, JobState::Dead);
    assert!(matches!(
        q.enqueue(b"C", k.clone()).unwrap(),
        Enqueued::DuplicateDead(id) if id == b
    ));
    assert_eq!(q.purge(JobState::Dead).unwrap(), 1);
    let c = match q.enqueue(b"C", k).unwrap() {
        Enqueued::New(c) => c,
        other => panic!("expected a new job, got {other:?}"),
    };
    assert!(c != a && c != b);
    assert_eq!(q.len().unwrap(), 1);
    assert_consistent(&q);
}

/// `windowed(k, s)` that extends a window holding `k` (BullMQ's `deduplication.extend`).
fn extending(k: &str, s: u64) -> EnqueueOptions {
    windowed(k, s).extend_dedup_window()
}

/// The dedup window of job `id` in ms, as `JobInfo` shows it.
fn window_ms(q: &leaseq::Queue, id: JobId) -> Option<u64> {
    q.job(id).unwrap().expect("the job is kept").dedup_window_ms
}

/// `enq(A, k, window=60s)` at t=0; at t=40s a duplicate with `extend_dedup_window` (60 s) →
/// Duplicate(A), and the window now ends at 100 s (A's `dedup_window_ms` says 100 000); a
/// plain duplicate at 99 s changes nothing; at 100 s a new job takes the key. A key beside it
/// with plain duplicates ends at 60 s, as before.
#[test]
fn a_duplicate_that_extends_moves_the_window_end() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", windowed("k", 60)).unwrap().id();
    let p = q.enqueue(b"P", windowed("plain", 60)).unwrap().id();
    f.clock.advance(secs(40));
    assert_eq!(
        q.enqueue(b"B", extending("k", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(
        q.enqueue(b"B", windowed("plain", 60)).unwrap(),
        Enqueued::Duplicate(p)
    );
    assert_eq!(window_ms(&q, a), Some(100_000), "extended to 40 s + 60 s");
    assert_eq!(
        window_ms(&q, p),
        Some(60_000),
        "a plain duplicate extends nothing"
    );
    assert_eq!(q.len().unwrap(), 2, "nothing was added");
    assert_consistent(&q);
    f.clock.advance(secs(20)); // t = 60 s
    assert!(matches!(
        q.enqueue(b"P2", windowed("plain", 60)).unwrap(),
        Enqueued::New(_)
    ));
    assert_eq!(
        q.enqueue(b"C", windowed("k", 60)).unwrap(),
        Enqueued::Duplicate(a),
        "the extended window still runs at 60 s"
    );
    f.clock.advance(secs(39)); // t = 99 s
    assert_eq!(
        q.enqueue(b"C", windowed("k", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(window_ms(&q, a), Some(100_000));
    f.clock.advance(secs(1)); // t = 100 s: the extended window ends
    assert!(matches!(
        q.enqueue(b"C", windowed("k", 60)).unwrap(),
        Enqueued::New(_)
    ));
    assert_eq!(
        window_ms(&q, a),
        Some(100_000),
        "A's record is left as it was"
    );
    assert_consistent(&q);
}

/// An extension never shortens a window: a duplicate with a shorter window leaves the end
/// where it was; a longer one moves it.
#[test]
fn an_extension_never_shortens_a_window() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", windowed("k", 600)).unwrap().id();
    f.clock.advance(secs(10));
    assert_eq!(
        q.enqueue(b"B", extending("k", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(
        window_ms(&q, a),
        Some(600_000),
        "10 s + 60 s is before 600 s"
    );
    assert_consistent(&q);
    f.clock.advance(secs(589)); // t = 599 s
    assert_eq!(
        q.enqueue(b"B", windowed("k", 600)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(
        q.enqueue(b"B", extending("k", 2)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(window_ms(&q, a), Some(601_000), "599 s + 2 s");
    f.clock.advance(secs(2)); // t = 601 s
    assert!(matches!(
        q.enqueue(b"C", windowed("k", 600)).unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// The holder acked and gone: the window alone is extended, survives a reopen, and ends at
/// the extended end. A kept holder's extended window goes through an export and import.
#[test]
fn an_extended_window_survives_a_reopen_and_an_export() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", windowed("gone", 60)).unwrap().id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.job(a).unwrap(), None, "A is gone");
    let k = q.enqueue(b"K", windowed("kept", 60)).unwrap().id();
    f.clock.advance(secs(30));
    for key in ["gone", "kept"] {
        q.enqueue(b"B", extending(key, 60)).unwrap();
    }
    assert_eq!(window_ms(&q, k), Some(90_000));
    assert_consistent(&q);
    // The export line of K, as `leaseq export` writes it.
    let line = leaseq::json::JobLine::from_info(None, &q.job(k).unwrap().unwrap(), Some(b"K"));
    drop(q);
    let q = f.open();
    f.clock.advance(secs(59)); // t = 89 s
    assert_eq!(
        q.enqueue(b"C", windowed("gone", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(
        q.enqueue(b"C", windowed("kept", 60)).unwrap(),
        Enqueued::Duplicate(k)
    );
    assert_eq!(window_ms(&q, k), Some(90_000));
    assert_consistent(&q);
    // Imported into another file at 89 s, K's window still ends at 90 s.
    let dir = tempfile::tempdir().unwrap();
    let other = f.builder().open(dir.path().join("other.leaseq")).unwrap();
    let (job, _) = line.to_import().unwrap();
    let [Enqueued::New(k2)] = other.import_batch(&[job]).unwrap()[..] else {
        panic!("the import adds K")
    };
    assert_eq!(window_ms(&other, k2), Some(90_000));
    assert_eq!(
        other.enqueue(b"C", windowed("kept", 60)).unwrap(),
        Enqueued::Duplicate(k2)
    );
    assert_consistent(&other);
    f.clock.advance(secs(1)); // t = 90 s
    for q in [&q, &other] {
        for key in ["gone", "kept"] {
            assert!(
                matches!(
                    q.enqueue(b"D", windowed(key, 60)).unwrap(),
                    Enqueued::New(_)
                ),
                "{key}: the extended window ended at 90 s"
            );
        }
        assert_consistent(q);
    }
}

/// A key held by a job without a window is not given one; `extend_dedup_window` without a
/// window (or a key) is refused with `InvalidOption` and writes nothing, not even the
/// extension of a held window.
#[test]
fn extend_needs_a_window_and_gives_none_to_a_key_without_one() {
    let f = Fixture::new();
    let q = f.open();
    let cases = [
        EnqueueOptions::default().extend_dedup_window(),
        EnqueueOptions::default()
            .dedup_key("w")
            .extend_dedup_window(),
        EnqueueOptions::default()
            .dedup_key("w")
            .dedup_until_started()
            .extend_dedup_window(),
    ];
    for opts in &cases {
        let r = q.enqueue(b"x", opts.clone());
        assert!(
            matches!(
                r,
                Err(Error::InvalidOption {
                    field: "extend_dedup_window" | "dedup_until_started",
                    ..
                })
            ),
            "{opts:?}: {r:?}"
        );
    }
    assert_eq!(q.stats().unwrap().total, 0);
    assert_eq!(q.stats().unwrap().dedup_keys, 0);
    let w = q.enqueue(b"W", windowed("w", 60)).unwrap().id();
    f.clock.advance(secs(30));
    let r = q.enqueue_batch([
        (&b"ok"[..], extending("w", 60)),
        (&b"bad"[..], cases[1].clone()),
    ]);
    assert!(
        matches!(
            r,
            Err(Error::InvalidOption {
                field: "extend_dedup_window",
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(
        window_ms(&q, w),
        Some(60_000),
        "a refused batch extends nothing"
    );
    // A key held while its job is live.
    let a = q
        .enqueue(b"A", EnqueueOptions::default().dedup_key("live"))
        .unwrap()
        .id();
    assert_eq!(
        q.enqueue(b"B", extending("live", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(window_ms(&q, a), None, "no window given");
    take(&q, a).ack().unwrap();
    assert!(matches!(
        q.enqueue(b"C", EnqueueOptions::default().dedup_key("live"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// Batch and `Tx` enqueues extend as a single enqueue does: a later job of a batch extends
/// the window an earlier one took; a `Tx` enqueue's extension commits with its transaction,
/// and not at all when the transaction fails.
#[test]
fn batch_and_tx_enqueues_extend_alike() {
    let f = Fixture::new();
    let q = f.open();
    let out = q
        .enqueue_batch([
            (&b"A"[..], windowed("k", 60)),
            (&b"B"[..], extending("k", 100)),
        ])
        .unwrap();
    let a = out[0].id();
    assert_eq!(out, vec![Enqueued::New(a), Enqueued::Duplicate(a)]);
    assert_eq!(window_ms(&q, a), Some(100_000));
    assert_consistent(&q);
    f.clock.advance(secs(50));
    let failed: leaseq::Result<()> = q.write(|tx| {
        tx.enqueue(b"C", extending("k", 500))?;
        Err("changed my mind".into())
    });
    assert!(matches!(failed, Err(Error::Effect(_))), "{failed:?}");
    assert_eq!(
        window_ms(&q, a),
        Some(100_000),
        "nothing of a failed Tx commits"
    );
    let got = q
        .write(|tx| Ok(tx.enqueue(b"C", extending("k", 60))?))
        .unwrap();
    assert_eq!(got, Enqueued::Duplicate(a));
    assert_eq!(window_ms(&q, a), Some(110_000), "50 s + 60 s");
    assert_consistent(&q);
    f.clock.advance(secs(59)); // t = 109 s
    assert_eq!(
        q.enqueue(b"D", windowed("k", 60)).unwrap(),
        Enqueued::Duplicate(a)
    );
    f.clock.advance(secs(1)); // t = 110 s
    assert!(matches!(
        q.enqueue(b"D", windowed("k", 60)).unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// With `on_duplicate` `Replace`, a waiting holder's payload is replaced and its window
/// extended (BullMQ's `extend` with `replace`); a leased holder is a duplicate, its window
/// extended all the same (`Debounce` too).
#[test]
fn extend_with_replace_and_debounce() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", windowed("k", 600).delay(secs(100)))
        .unwrap()
        .id();
    f.clock.advance(secs(30));
    assert_eq!(
        q.enqueue(
            b"A2",
            extending("k", 600).on_duplicate(leaseq::OnDuplicate::Replace)
        )
        .unwrap(),
        Enqueued::Replaced(a)
    );
    assert_eq!(q.payload(a).unwrap().as_deref(), Some(&b"A2"[..]));
    assert_eq!(window_ms(&q, a), Some(630_000));
    assert_eq!(
        q.job(a).unwrap().unwrap().run_at_ms,
        T0_MS + 100_000,
        "replace keeps the due time"
    );
    assert_consistent(&q);
    f.clock.advance(secs(70)); // t = 100 s: A is due
    let l = q.dequeue().unwrap().expect("A is due");
    assert_eq!((l.id(), l.payload()), (a, &b"A2"[..]));
    assert_eq!(
        q.enqueue(
            b"A3",
            extending("k", 600).on_duplicate(leaseq::OnDuplicate::Debounce)
        )
        .unwrap(),
        Enqueued::Duplicate(a),
        "a leased holder is not replaced"
    );
    assert_eq!(window_ms(&q, a), Some(700_000));
    l.ack().unwrap();
    assert_consistent(&q);
}

/// While the holder's row is kept, its window ends at most `DELAY_MAX` after its creation
/// (the row keeps the window in ms, up to that cap).
#[test]
fn a_kept_holders_window_is_capped_at_delay_max() {
    let f = Fixture::new();
    let q = f.open();
    let max_ms = leaseq::DELAY_MAX.as_millis() as u64;
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default()
                .dedup_key("k")
                .dedup_window(leaseq::DELAY_MAX - secs(60)),
        )
        .unwrap()
        .id();
    f.clock.advance(secs(3600));
    let long = EnqueueOptions::default()
        .dedup_key("k")
        .dedup_window(leaseq::DELAY_MAX)
        .extend_dedup_window();
    assert_eq!(q.enqueue(b"B", long).unwrap(), Enqueued::Duplicate(a));
    assert_eq!(window_ms(&q, a), Some(max_ms), "capped at DELAY_MAX");
    assert_consistent(&q);
}

/// `check()` holds a kept holder's record to its window: a record planted back as it was
/// before an extension (as a lost write would leave it) is reported, naming the job.
#[test]
fn check_finds_a_holder_record_that_disagrees_with_its_window() {
    use redb::ReadableDatabase;
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", windowed("k", 60)).unwrap().id();
    let before = {
        let rtx = q.database().begin_read().unwrap();
        let t = rtx.open_table(crate::common::JOBS_TABLE).unwrap();
        t.get(a.0).unwrap().expect("A's row").value().to_vec()
    };
    f.clock.advance(secs(10));
    q.enqueue(b"B", extending("k", 60)).unwrap();
    assert_consistent(&q);
    crate::common::overwrite_record(&q, a, &before);
    let found = q.check().unwrap();
    assert!(
        found
            .iter()
            .any(|v| v.job_id == Some(a) && v.detail.contains("dedup window ends at")),
        "{found:#?}"
    );
}
