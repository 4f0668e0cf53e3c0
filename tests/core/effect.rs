//! The exactly-once effect (`ack_with`) and the group commit under concurrent callers.

use crate::common::{EFFECTS, Fixture, LEASE, assert_consistent, bump, effects};
use leaseq::{Applied, EnqueueOptions, Error, JobState, Queue};
use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[test]
fn failing_effect_writes_nothing_and_the_job_is_given_back_with_its_error() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    let err = l
        .ack_with(|tx| {
            bump(tx, 1)?;
            Err("payment provider said no".into())
        })
        .unwrap_err();
    match err {
        Error::Effect(e) => assert_eq!(e.to_string(), "payment provider said no"),
        other => panic!("expected Effect, got {other:?}"),
    }
    assert!(effects(&q).is_empty(), "the effect's write was rolled back");
    let info = q.job(a).unwrap().unwrap();
    assert_eq!((info.state, info.lease_token), (JobState::Ready, None));
    assert_eq!(info.last_error.as_deref(), Some("payment provider said no"));
    assert!(
        matches!(l.ack(), Err(Error::LeaseLost { .. })),
        "the attempt is over"
    );
    // Delivered again at once, not after the lease.
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 2);
    assert_eq!(l.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
    assert_eq!(effects(&q), HashMap::from([(1, 1)]));
    assert_consistent(&q);
}

#[test]
fn panicking_effect_is_an_error_and_the_queue_keeps_working() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"A", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let err = l
        .ack_with(|tx| {
            bump(tx, 1)?;
            panic!("bug in the effect");
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::Effect(e) if e.to_string().contains("bug in the effect")),
        "{err:?}"
    );
    assert!(effects(&q).is_empty());
    let info = q.job(l.id()).unwrap().unwrap();
    assert_eq!(info.state, JobState::Ready);
    assert!(info.last_error.unwrap().contains("bug in the effect"));
    q.enqueue(b"B", EnqueueOptions::default()).unwrap();
    assert_eq!(q.len().unwrap(), 2);
    assert_consistent(&q);
}

#[test]
fn queue_calls_inside_an_effect_are_refused_not_deadlocked() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"A", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let inner = q.clone();
    let err = l
        .ack_with(|_| {
            inner.enqueue(b"from inside", EnqueueOptions::default())?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::Effect(e) if e.downcast_ref::<Error>().is_some_and(|e| matches!(e, Error::Reentrant))),
        "{err:?}"
    );
    assert_eq!(q.len().unwrap(), 1);
}

#[test]
fn default_idempotency_key_is_the_job_id() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let b = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    for _ in 0..2 {
        let l = q.dequeue().unwrap().unwrap();
        let id = l.id().0;
        assert_eq!(l.ack_with(|tx| bump(tx, id)).unwrap(), Applied::Now);
    }
    assert_eq!(effects(&q), HashMap::from([(a.0, 1), (b.0, 1)]));
    // No marker is kept for a job's own id: the effect and the job's removal commit
    // together and ids are never reused, so no later delivery could ask for it.
    assert_eq!(q.stats().unwrap().applied, 0);
    // A caller key equal to an id's bytes is a caller key like any other.
    assert!(!q.is_applied(a.0.to_be_bytes()).unwrap());
}

// Many producers and consumers share group commits; some effects fail on their first try,
// which aborts their group and replays the other members. Every job's effect must land
// exactly once, every failed one be redelivered, and the file stay consistent.
#[test]
fn concurrent_callers_with_failing_effects_apply_each_effect_once() {
    const PRODUCERS: u64 = 4;
    const CONSUMERS: usize = 4;
    const PER_PRODUCER: u64 = 150;
    let dir = tempfile::tempdir().unwrap();
    // A lease no delivery outlives, even on a loaded machine: a failed attempt comes back
    // through the retry policy, never by expiry, so exactly the first tries of every 7th job
    // fail (a 200 ms lease once expired under load before its ack: LeaseLost).
    let q = Queue::builder()
        .lease(Duration::from_secs(60))
        .max_attempts(100)
        .open(dir.path().join("q.leaseq"))
        .unwrap();
    let total = PRODUCERS * PER_PRODUCER;
    let acked = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let closure_runs = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for p in 0..PRODUCERS {
            let q = q.clone();
            s.spawn(move || {
                for i in 0..PER_PRODUCER {
                    let n = p * PER_PRODUCER + i;
                    q.enqueue(&n.to_le_bytes(), EnqueueOptions::default())
                        .unwrap();
                }
            });
        }
        for _ in 0..CONSUMERS {
            let q = q.clone();
            let (acked, failures, runs) = (acked.clone(), failures.clone(), closure_runs.clone());
            s.spawn(move || {
                while acked.load(Ordering::SeqCst) < total {
                    let Some(l) = q.dequeue_timeout(Duration::from_millis(50)).unwrap() else {
                        continue;
                    };
                    let n = u64::from_le_bytes(l.payload().try_into().unwrap());
                    let first_try = l.attempt() == 1;
                    let r = l.ack_with(|tx| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        bump(tx, n)?;
                        if first_try && n % 7 == 0 {
                            return Err("first attempt of every 7th job fails".into());
                        }
                        Ok(())
                    });
                    match r {
                        Ok(Applied::Now) => {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Applied::AlreadyApplied) => panic!("job {n} applied twice"),
                        Err(Error::Effect(_)) => {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    let fx = effects(&q);
    assert_eq!(fx.len() as u64, total);
    assert!(fx.values().all(|&c| c == 1), "an effect landed twice");
    assert_eq!(failures.load(Ordering::SeqCst), total.div_ceil(7));
    assert!(closure_runs.load(Ordering::SeqCst) >= total + failures.load(Ordering::SeqCst));
    // Every failing closure aborted its group (parked members were woken to replay).
    assert!(q.commit_stats().replayed >= failures.load(Ordering::SeqCst));
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.applied),
        (0, 0),
        "no markers for jobs without a caller key"
    );
    let rtx = q.database().begin_read().unwrap();
    assert_eq!(rtx.open_table(EFFECTS).unwrap().len().unwrap(), total);
    drop(rtx);
    assert_consistent(&q);
}

// Waiting consumers wake on the commit of new work, well before their timeout.
#[test]
fn blocked_dequeue_wakes_on_enqueue() {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("q.leaseq")).unwrap();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let l = q.dequeue_timeout(Duration::from_secs(60)).unwrap();
            (l.map(|l| l.payload().to_vec()), start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    q.enqueue(b"wake", EnqueueOptions::default()).unwrap();
    let (payload, waited) = consumer.join().unwrap();
    assert_eq!(payload.as_deref(), Some(&b"wake"[..]));
    // Not a timing test of speed: only that it did not sit out its 60 s timeout.
    assert!(waited < Duration::from_secs(30), "woke after {waited:?}");
}

#[test]
fn dequeue_timeout_returns_none_when_nothing_comes() {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("q.leaseq")).unwrap();
    assert!(
        q.dequeue_timeout(Duration::from_millis(20))
            .unwrap()
            .is_none()
    );
}

#[test]
fn flush_inside_an_effect_is_refused_and_another_queue_is_allowed() {
    let f = Fixture::new();
    let g = Fixture::new();
    let q = f.open();
    let other = g.open();
    q.enqueue(b"A", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let (inner, other2) = (q.clone(), other.clone());
    let applied = l
        .ack_with(|_| {
            assert!(matches!(inner.flush(), Err(Error::Reentrant)));
            other2.enqueue(b"elsewhere", EnqueueOptions::default())?;
            Ok(())
        })
        .unwrap();
    assert_eq!(applied, Applied::Now);
    assert_eq!(other.len().unwrap(), 1);
}

#[test]
fn effect_cannot_open_leaseq_tables() {
    const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");
    const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("leaseq_jobs");
    let f = Fixture::new();
    let q = f.open();
    for which in 0..2 {
        q.enqueue(b"A", EnqueueOptions::default()).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        let id = l.id();
        let err = l
            .ack_with(|tx| {
                if which == 0 {
                    tx.open_table(META)?.insert("next_token", 1)?;
                } else {
                    tx.open_table(JOBS)?.remove(id.0)?;
                }
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(err, Error::Effect(_)), "{err:?}");
        assert_consistent(&q);
        f.clock.advance(LEASE + Duration::from_millis(1));
        q.dequeue().unwrap().unwrap().ack().unwrap();
    }
}
