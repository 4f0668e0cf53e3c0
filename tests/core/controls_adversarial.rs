//! Adversarial tests of the format-7 job controls (cancel, the completed history, retry of
//! ended jobs, reschedule calls, dedup until started, snooze reasons, the error history), the
//! way a demanding user of BullMQ, River or Oban would use them: races between a cancel and
//! a worker's ack, cancelled leases that expire or outlive a reopen, stale leases after a
//! retry, histories bounded while acks and cancels interleave, payloads moved across the
//! inline limit, keys taken back by a retry, damaged rows, reasons cut inside a character.
//! Every test drives the public API on a real file with a manual clock and checks states,
//! stats, keys, payloads and `check()`.

use crate::common::{
    Fixture, LEASE, all_ok, assert_consistent, bump, effects, flip_record_byte, ms, new_id, plain,
    secs,
};
use leaseq::Clock;
use leaseq::{
    Applied, CancelOutcome, EnqueueOptions, Enqueued, Error, History, ImportJob, JobId, JobState,
    Queue,
};
use std::sync::{Arc, Barrier};
use std::time::Duration;

fn dedup(key: &str) -> EnqueueOptions {
    EnqueueOptions::default().dedup_key(key)
}

fn until_started(key: &str) -> EnqueueOptions {
    EnqueueOptions::default()
        .dedup_key(key)
        .dedup_until_started()
        .max_attempts(10)
}

fn state(q: &Queue, id: JobId) -> Option<JobState> {
    q.job(id).unwrap().map(|j| j.state)
}

fn ids_in(q: &Queue, s: JobState) -> Vec<JobId> {
    q.jobs(s, None, 1000)
        .unwrap()
        .jobs
        .iter()
        .map(|j| j.id)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Cancel against a worker.
// ---------------------------------------------------------------------------------------

/// A cancel and the worker's ack race from two threads, many times: exactly one of them
/// wins each time, the loser is refused with the right error and writes nothing, and the
/// job ends in the winner's state (with or without a history).
#[test]
fn cancel_racing_an_ack_from_another_thread_exactly_one_wins() {
    for keep in [false, true] {
        let f = Fixture::new();
        let q = f.open();
        if keep {
            q.set_history(History::off().keep_jobs(1000)).unwrap();
        }
        let (mut cancels, mut acks) = (0u64, 0u64);
        for i in 0..24 {
            let id = q
                .enqueue(format!("r{i}").as_bytes(), dedup(&format!("k{i}")))
                .unwrap()
                .id();
            let lease = q.dequeue().unwrap().unwrap();
            assert_eq!(lease.id(), id);
            let barrier = Arc::new(Barrier::new(2));
            let b = barrier.clone();
            let acker = std::thread::spawn(move || {
                b.wait();
                lease.ack_with_result(b"done")
            });
            barrier.wait();
            let c = q.cancel(id, "race");
            let a = acker.join().unwrap();
            match (c.map(|o| (o.cancelled(), o)), a) {
                (Ok((true, outcome)), Err(Error::Cancelled { job_id, reason })) => {
                    let was = outcome.was().unwrap();
                    cancels += 1;
                    assert_eq!(
                        (was, job_id, reason.as_str()),
                        (JobState::Leased, id, "race")
                    );
                    let j = q.job(id).unwrap().expect("a fenced cancel keeps its row");
                    assert_eq!(j.state, JobState::Cancelled);
                    assert_eq!(j.cancel_reason.as_deref(), Some("race"));
                    assert_eq!(j.result, None, "the refused ack stored nothing");
                }
                (Ok((false, e)), Ok(())) => {
                    acks += 1;
                    if keep {
                        assert_eq!(
                            e,
                            CancelOutcome::AlreadyEnded {
                                state: JobState::Completed
                            }
                        );
                        let j = q.job(id).unwrap().unwrap();
                        assert_eq!(j.state, JobState::Completed);
                        assert_eq!(j.result.as_deref(), Some(&b"done"[..]));
                    } else {
                        assert_eq!(e, CancelOutcome::Gone);
                        assert_eq!(q.job(id).unwrap(), None);
                    }
                }
                other => panic!("round {i}: not exactly one winner: {other:?}"),
            }
            // Either way the key is free.
            let fresh = new_id(q.enqueue(b"again", dedup(&format!("k{i}"))).unwrap());
            q.remove(fresh).unwrap();
            assert_consistent(&q);
        }
        let s = q.stats().unwrap();
        assert_eq!(cancels + acks, 24);
        assert_eq!(s.total, 0, "{s:?}");
        assert_eq!(s.cancelled, cancels, "{s:?}");
        assert_eq!(s.completed, if keep { acks } else { 0 }, "{s:?}");
        assert!(q.dequeue().unwrap().is_none());
    }
}

/// A cancel races the worker's heartbeat and then its nack: the heartbeat is either extended
/// before the cancel or refused after it, the nack always loses, and nothing comes back.
#[test]
fn cancel_racing_a_heartbeat_and_a_nack_never_redelivers() {
    let f = Fixture::new();
    let q = f.open();
    for i in 0..16 {
        let id = q.enqueue(format!("h{i}").as_bytes(), plain()).unwrap().id();
        let lease = q.dequeue().unwrap().unwrap();
        let hb = lease.heartbeat();
        let barrier = Arc::new(Barrier::new(2));
        let b = barrier.clone();
        let beat = std::thread::spawn(move || {
            b.wait();
            hb.extend(secs(60))
        });
        barrier.wait();
        assert_eq!(q.cancel(id, "stop").unwrap().was(), Some(JobState::Leased));
        match beat.join().unwrap() {
            Ok(deadline) => {
                // Extended before the cancel: the fence runs to the extended deadline.
                assert_eq!(deadline, f.clock.now_ms() + 60_000);
            }
            Err(Error::Cancelled { .. }) => {}
            Err(e) => panic!("round {i}: {e:?}"),
        }
        assert!(lease.is_cancelled().unwrap());
        assert!(matches!(lease.nack("x"), Err(Error::Cancelled { .. })));
        assert_eq!(state(&q, id), Some(JobState::Cancelled));
        assert!(q.dequeue().unwrap().is_none(), "round {i}: redelivered");
        assert_consistent(&q);
    }
}

/// A cancelled lease whose deadline passes is not returned by the sweep; its row goes (no
/// history) and the old lease stays refused.
#[test]
fn a_cancelled_lease_does_not_come_back_when_it_expires() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(
            b"c",
            EnqueueOptions::default()
                .dedup_key("d")
                .idempotency_key("i")
                .max_attempts(5),
        )
        .unwrap()
        .id();
    let other = q.enqueue(b"other", plain()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(lease.id(), id);
    assert_eq!(q.cancel(id, "stop").unwrap().was(), Some(JobState::Leased));
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.leased, s.ready, s.cancelled),
        (1, 0, 1, 1),
        "{s:?}"
    );
    f.clock.advance(LEASE + secs(1));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), other, "only the other job is delivered");
    l.ack().unwrap();
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.job(id).unwrap(), None, "the fence ended: the row went");
    assert!(matches!(
        lease.ack(),
        Err(Error::LeaseLost { .. } | Error::Cancelled { .. })
    ));
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.cancelled, s.dedup_keys), (0, 0, 0), "{s:?}");
    assert_consistent(&q);
}

/// A cancelled lease outlives a reopen (a crash while the worker ran): the reopen's lease
/// recovery does not touch it, it is never delivered again, and its row goes at the fence's
/// end (no history) or stays cancelled (a history).
#[test]
fn a_cancelled_lease_is_left_alone_by_the_reopen() {
    for keep in [false, true] {
        let f = Fixture::new();
        let id;
        {
            let q = f.open();
            if keep {
                q.set_history(History::off().keep_jobs(10)).unwrap();
            }
            id = q.enqueue(b"c", dedup("k")).unwrap().id();
            let lease = q.dequeue().unwrap().unwrap();
            q.cancel(id, "stop").unwrap();
            drop(lease);
        }
        let q = f.open();
        let r = q.recovery();
        assert_eq!(
            (r.leases_returned, r.leases_dead_lettered, r.quarantined),
            (0, 0, 0),
            "{r:?}"
        );
        let j = q.job(id).unwrap().unwrap();
        assert_eq!(j.state, JobState::Cancelled);
        assert_eq!(j.attempts, 1);
        assert!(
            j.errors.is_empty(),
            "no 'lease abandoned' for a cancelled job"
        );
        assert!(q.dequeue().unwrap().is_none());
        assert_consistent(&q);
        f.clock.advance(LEASE + secs(1));
        // The sweep of a dequeue that delivers (one that finds nothing writes nothing).
        let other = q.enqueue(b"other", plain()).unwrap().id();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), other, "only the other job is delivered");
        l.ack().unwrap();
        assert!(q.dequeue().unwrap().is_none());
        assert_eq!(
            state(&q, id),
            if keep {
                Some(JobState::Cancelled)
            } else {
                None
            }
        );
        // Reopen again past the fence.
        drop(q);
        let q = f.open();
        assert_eq!(q.recovery().leases_returned, 0);
        assert!(q.dequeue().unwrap().is_none());
        assert_eq!(q.stats().unwrap().cancelled, u64::from(keep));
        assert_consistent(&q);
    }
}

/// Cancel, then retry (the user pressed "run again") while the first worker still runs: the
/// old delivery's calls are all refused and write nothing, and the job runs once more
/// through a new lease only.
#[test]
fn cancel_then_retry_refuses_every_call_of_the_old_lease() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"job", EnqueueOptions::default().idempotency_key("idem"))
        .unwrap()
        .id();
    let old = q.dequeue().unwrap().unwrap();
    let old_hb = old.heartbeat();
    q.cancel(id, "stop").unwrap();
    q.retry(id).unwrap();
    let j = q.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Ready, 0));
    // While the job waits again, then once it runs again on a new lease.
    assert!(matches!(
        old_hb.extend(secs(5)),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(q.job(id).unwrap().unwrap().state, JobState::Ready);
    let new = q.dequeue().unwrap().unwrap();
    assert_eq!(new.id(), id);
    assert!(new.token() > old.token());
    let before = q.job(id).unwrap();
    let ran = std::cell::Cell::new(false);
    let r = old.ack_with(|tx| {
        ran.set(true);
        bump(tx, 1)
    });
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "{r:?}");
    assert!(!ran.get(), "the old lease's effect ran");
    assert!(matches!(old.extend(secs(5)), Err(Error::LeaseLost { .. })));
    assert!(matches!(old.nack("x"), Err(Error::LeaseLost { .. })));
    assert!(matches!(
        old_hb.extend(secs(5)),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(q.job(id).unwrap(), before, "the old lease wrote");
    assert_eq!(new.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
    assert_eq!(effects(&q).get(&1), Some(&1));
    assert!(q.dequeue().unwrap().is_none());
    assert_consistent(&q);
}

/// `Lease::is_cancelled` says whether *this delivery* was cancelled. After cancel then retry
/// (the job is ready again, about to run on another worker), the first worker's delivery is
/// still cancelled: its ack is refused. A worker polling `is_cancelled` between steps must be
/// told to stop, or it runs on, concurrently with the retried run.
#[test]
fn is_cancelled_of_an_old_lease_stays_true_after_the_job_is_retried() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"export", plain()).unwrap().id();
    let old = q.dequeue().unwrap().unwrap();
    let hb = old.heartbeat();
    q.cancel(id, "user pressed stop").unwrap();
    assert!(old.is_cancelled().unwrap());
    q.retry(id).unwrap();
    let _second_run = q.dequeue().unwrap().unwrap();
    // The first worker checks between steps.
    let lease_says = old.is_cancelled();
    let heartbeat_says = hb.is_cancelled();
    assert!(
        matches!(
            lease_says,
            Ok(true) | Err(Error::LeaseLost { .. } | Error::Cancelled { .. })
        ),
        "Lease::is_cancelled of a cancelled delivery answered {lease_says:?} once the job was \
         retried: the worker runs on"
    );
    assert!(
        matches!(
            heartbeat_says,
            Ok(true) | Err(Error::LeaseLost { .. } | Error::Cancelled { .. })
        ),
        "Heartbeat::is_cancelled answered {heartbeat_says:?}"
    );
}

/// Cancel a leased job twice, and through another queue of the file: the second cancel is
/// refused, another queue's handle does not see the job.
#[test]
fn cancel_is_refused_for_an_ended_job_and_from_another_queue() {
    let f = Fixture::new();
    let q = f.open();
    let side = q.named("side").unwrap();
    let id = side.enqueue(b"s", plain()).unwrap().id();
    let lease = side.dequeue().unwrap().unwrap();
    assert!(matches!(
        q.cancel(id, "wrong queue"),
        Err(Error::JobNotFound { .. })
    ));
    assert_eq!(state(&side, id), Some(JobState::Leased));
    side.cancel(id, "first").unwrap();
    assert_eq!(
        side.cancel(id, "second").unwrap(),
        CancelOutcome::AlreadyEnded {
            state: JobState::Cancelled
        },
        "an ended job is answered, nothing written"
    );
    assert_eq!(
        side.job(id).unwrap().unwrap().cancel_reason.as_deref(),
        Some("first"),
        "the second cancel wrote"
    );
    assert!(matches!(lease.ack(), Err(Error::Cancelled { reason, .. }) if reason == "first"));
    assert_eq!(q.stats().unwrap().cancelled, 0);
    assert_eq!(side.stats().unwrap().cancelled, 1);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// The history.
// ---------------------------------------------------------------------------------------

/// Acks and cancels interleaved at distinct times under `keep_jobs(5)`: after every
/// operation the history holds at most 5 jobs, and at the end exactly the 5 that ended last,
/// whatever their kind.
#[test]
fn history_count_bound_holds_with_acks_and_cancels_interleaved() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(5)).unwrap();
    let mut ended = Vec::new();
    for i in 0..40u32 {
        f.clock.advance(ms(7));
        let a = q.enqueue(format!("a{i}").as_bytes(), plain()).unwrap().id();
        let b = q
            .enqueue(
                format!("b{i}").as_bytes(),
                EnqueueOptions::default().delay(secs(1)),
            )
            .unwrap()
            .id();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), a);
        if i % 3 == 0 {
            // A cancel first, then the ack.
            q.cancel(b, &format!("c{i}")).unwrap();
            ended.push(b);
            f.clock.advance(ms(1));
            l.ack_with_result(format!("r{i}").as_bytes()).unwrap();
            ended.push(a);
        } else {
            l.ack().unwrap();
            ended.push(a);
            f.clock.advance(ms(1));
            q.cancel(b, &format!("c{i}")).unwrap();
            ended.push(b);
        }
        let s = q.stats().unwrap();
        assert!(s.completed + s.cancelled <= 5, "round {i}: {s:?}");
        assert_eq!(s.total, 0, "{s:?}");
    }
    let mut kept: Vec<JobId> = ids_in(&q, JobState::Completed);
    kept.extend(ids_in(&q, JobState::Cancelled));
    kept.sort();
    let mut want = ended[ended.len() - 5..].to_vec();
    want.sort();
    assert_eq!(kept, want, "the last 5 ended jobs are kept");
    assert_eq!(q.prune().unwrap().history, 0);
    assert_consistent(&q);
}

/// `keep_jobs(1)` keeps "the last completed and cancelled job". A cancel of a leased job is
/// fenced until that lease's deadline (its row must stay); an ack made just after it ends a
/// newer job. The newest job, the one just acked with its result, must not be the one the
/// history deletes.
#[test]
fn a_fenced_cancel_makes_the_history_delete_the_job_just_acked() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(1)).unwrap();
    let cancelled = q.enqueue(b"long export", plain()).unwrap().id();
    let acked = q.enqueue(b"thumbnail", plain()).unwrap().id();
    let l1 = q.dequeue().unwrap().unwrap();
    let l2 = q.dequeue().unwrap().unwrap();
    assert_eq!((l1.id(), l2.id()), (cancelled, acked));
    q.cancel(cancelled, "user closed the tab").unwrap();
    f.clock.advance(ms(1));
    l2.ack_with_result(b"640x480").unwrap();
    let got = q.job(acked).unwrap();
    assert_eq!(
        got.as_ref().map(|j| (j.state, j.result.clone())),
        Some((JobState::Completed, Some(b"640x480".to_vec()))),
        "the job acked last (after the cancel) was deleted by keep_jobs(1) right at its ack; \
         kept instead: {:?}",
        ids_in(&q, JobState::Cancelled)
    );
}

/// Lowering the bound (count, then age instead of count) deletes the oldest first and keeps
/// the newest, a few per operation and the rest by prune.
#[test]
fn lowering_the_history_keeps_the_newest_jobs() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let ids = crate::common::enqueue_n(&q, 10, plain());
    for id in &ids {
        f.clock.advance(secs(1));
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), *id);
        l.ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().completed, 10);
    assert!(q.set_history(History::off().keep_jobs(6)).unwrap());
    // One operation deletes a bounded few, oldest first.
    let x = q.enqueue(b"x", plain()).unwrap().id();
    q.cancel(x, "no").unwrap();
    let s = q.stats().unwrap();
    assert!(
        s.completed + s.cancelled >= 6 && s.completed + s.cancelled <= 11,
        "{s:?}"
    );
    q.prune().unwrap();
    let s = q.stats().unwrap();
    assert_eq!((s.completed, s.cancelled), (5, 1), "{s:?}");
    assert_eq!(ids_in(&q, JobState::Completed), ids[5..].to_vec());
    // Age instead of count: only the jobs that ended in the last 1.5 s stay.
    q.set_history(History::off().keep_for(ms(1500))).unwrap();
    assert_eq!(q.history().unwrap().jobs(), None);
    let pruned = q.prune().unwrap().history;
    assert_eq!(pruned, 3, "ended at 6, 7, 8 s; now 10 s");
    assert_eq!(ids_in(&q, JobState::Completed), ids[8..].to_vec());
    assert_eq!(ids_in(&q, JobState::Cancelled), vec![x]);
    assert!(q.set_history(History::off()).unwrap());
    assert_eq!(q.prune().unwrap().history, 3);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.completed, s.cancelled), (0, 0, 0), "{s:?}");
    assert_consistent(&q);
}

/// `ack_batch` and `ack_with_batch` into a history, with cancelled leases in the batch: the
/// cancelled ones are refused in their place (no effect runs for them), the others complete,
/// every count and effect adds up.
#[test]
fn batch_acks_into_a_history_with_cancelled_leases_in_the_batch() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(100)).unwrap();
    let ids = crate::common::enqueue_n(&q, 10, plain());
    let leases = q.dequeue_batch(10).unwrap();
    assert_eq!(leases.len(), 10);
    q.cancel(ids[3], "x").unwrap();
    q.cancel(ids[7], "y").unwrap();
    let out = q.ack_batch(&leases).unwrap();
    for (i, r) in out.iter().enumerate() {
        if i == 3 || i == 7 {
            assert!(matches!(r, Err(Error::Cancelled { .. })), "{i}: {r:?}");
        } else {
            assert!(r.is_ok(), "{i}: {r:?}");
        }
    }
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.completed, s.cancelled), (0, 8, 2), "{s:?}");
    assert_consistent(&q);
    // ack_with_batch, with idempotency keys.
    let ids: Vec<JobId> = (0..5)
        .map(|i| {
            q.enqueue(
                format!("w{i}").as_bytes(),
                EnqueueOptions::default().idempotency_key(format!("w{i}")),
            )
            .unwrap()
            .id()
        })
        .collect();
    let leases = q.dequeue_batch(5).unwrap();
    q.cancel(ids[2], "z").unwrap();
    let out = q
        .ack_with_batch(&leases, |tx, l| bump(tx, l.id().0))
        .unwrap();
    for (i, r) in out.iter().enumerate() {
        if i == 2 {
            assert!(matches!(r, Err(Error::Cancelled { .. })), "{i}: {r:?}");
        } else {
            assert_eq!(r.as_ref().ok(), Some(&Applied::Now), "{i}: {r:?}");
        }
    }
    let e = effects(&q);
    assert_eq!(e.get(&ids[2].0), None, "the cancelled lease's effect ran");
    for (i, id) in ids.iter().enumerate() {
        if i != 2 {
            assert_eq!(e.get(&id.0), Some(&1));
            assert_eq!(state(&q, *id), Some(JobState::Completed));
            assert!(q.is_applied(format!("w{i}")).unwrap());
        }
    }
    assert!(!q.is_applied("w2").unwrap());
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.completed, s.cancelled), (0, 12, 3), "{s:?}");
    assert_consistent(&q);
}

/// `purge(Completed)` and `purge(Cancelled)` clear only their state; `remove` of an ended job
/// deletes its row (and a payload stored apart) and leaves the live jobs alone.
#[test]
fn purge_and_remove_of_ended_jobs() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(100)).unwrap();
    let big = vec![5u8; 3000];
    let done: Vec<JobId> = (0..3)
        .map(|_| q.enqueue(&big, plain()).unwrap().id())
        .collect();
    for _ in 0..3 {
        q.dequeue().unwrap().unwrap().ack().unwrap();
    }
    let gone: Vec<JobId> = (0..3)
        .map(|_| q.enqueue(&big, plain()).unwrap().id())
        .collect();
    let leased = q.dequeue().unwrap().unwrap();
    for id in &gone {
        q.cancel(*id, "x").unwrap();
    }
    let live = q.enqueue(b"live", dedup("live")).unwrap().id();
    assert_eq!(q.payload(done[0]).unwrap().unwrap(), big);
    q.remove(done[0]).unwrap();
    q.remove(gone[1]).unwrap();
    assert_eq!(q.job(done[0]).unwrap(), None);
    assert_consistent(&q);
    assert_eq!(q.purge(JobState::Completed).unwrap(), 2);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.completed, s.cancelled), (1, 0, 2), "{s:?}");
    assert_eq!(q.purge(JobState::Cancelled).unwrap(), 2);
    assert!(matches!(
        leased.ack(),
        Err(Error::LeaseLost { .. } | Error::Cancelled { .. })
    ));
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.ready, s.completed, s.cancelled),
        (1, 1, 0, 0),
        "{s:?}"
    );
    assert_eq!(
        q.enqueue(b"dup", dedup("live")).unwrap(),
        Enqueued::Duplicate(live)
    );
    assert_consistent(&q);
}

/// A completed job's row is damaged on disk; `remove` (what `check()`'s message tells the
/// user to do) deletes it. Nothing of it may stay: no completed entry, no count.
#[test]
fn remove_of_a_damaged_completed_row_leaves_a_stray_history_entry() {
    for cancel in [false, true] {
        let f = Fixture::new();
        let q = f.open();
        q.set_history(History::off().keep_jobs(10)).unwrap();
        let id = q.enqueue(b"x", plain()).unwrap().id();
        if cancel {
            q.cancel(id, "no").unwrap();
        } else {
            q.dequeue().unwrap().unwrap().ack().unwrap();
        }
        let keep = q.enqueue(b"live", plain()).unwrap().id();
        flip_record_byte(&q, id, 3, 0x40);
        assert!(!q.check().unwrap().is_empty(), "the damage is seen");
        q.remove(id).unwrap();
        let s = q.stats().unwrap();
        assert_eq!(
            (s.total, s.completed, s.cancelled),
            (1, 0, 0),
            "cancelled={cancel}: {s:?}"
        );
        assert_eq!(state(&q, keep), Some(JobState::Ready));
        assert_consistent(&q);
    }
}

/// The history is per queue: a named queue's history, cancels and purges leave the default
/// queue alone, and the other way round.
#[test]
fn named_queues_keep_their_own_history_and_cancels() {
    let f = Fixture::new();
    let q = f.open();
    let side = q.named("side").unwrap();
    side.set_history(History::off().keep_jobs(2)).unwrap();
    assert!(q.history().unwrap().is_off());
    let main_ids = crate::common::enqueue_n(&q, 3, plain());
    let side_ids = crate::common::enqueue_n(&side, 3, plain());
    for _ in 0..3 {
        q.dequeue().unwrap().unwrap().ack().unwrap();
        side.dequeue().unwrap().unwrap().ack().unwrap();
    }
    assert!(main_ids.iter().all(|id| q.job(*id).unwrap().is_none()));
    assert_eq!(ids_in(&side, JobState::Completed), side_ids[1..].to_vec());
    let c = side.enqueue(b"c", plain()).unwrap().id();
    side.cancel(c, "x").unwrap();
    assert_eq!(ids_in(&side, JobState::Completed), side_ids[2..].to_vec());
    assert_eq!(ids_in(&side, JobState::Cancelled), vec![c]);
    assert_eq!(q.purge(JobState::Completed).unwrap(), 0);
    assert_eq!(q.purge(JobState::Cancelled).unwrap(), 0);
    assert_eq!(side.stats().unwrap().completed, 1);
    assert!(matches!(q.retry(c), Err(Error::JobNotFound { .. })));
    side.retry(c).unwrap();
    assert_eq!(side.dequeue().unwrap().unwrap().id(), c);
    assert!(q.dequeue().unwrap().is_none());
    assert_consistent(&q);
    drop(side);
    drop(q);
    let q = f.open();
    let side = q.existing("side").unwrap();
    assert_eq!(side.history().unwrap(), History::off().keep_jobs(2));
    assert!(q.history().unwrap().is_off());
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Retry and keys.
// ---------------------------------------------------------------------------------------

/// A job with a dedup window completes (kept in the history) and its window ends. A retry
/// runs it again and it completes again: afterwards its key must be free. The retry takes the
/// key back without a window, and the job then never lets go of it (a job with a window never
/// releases its key at its end: the window does), so the key stays held by a finished job
/// forever: every enqueue with it is a `Duplicate` of a completed (or deleted) job.
#[test]
fn retry_of_a_job_whose_dedup_window_ended_holds_its_key_forever() {
    for keep_after in [true, false] {
        let f = Fixture::new();
        let q = f.open();
        q.set_history(History::off().keep_jobs(10)).unwrap();
        let a = q
            .enqueue(
                b"a",
                EnqueueOptions::default()
                    .dedup_key("k")
                    .dedup_window(secs(10)),
            )
            .unwrap()
            .id();
        q.dequeue().unwrap().unwrap().ack().unwrap();
        f.clock.advance(secs(20));
        q.prune().unwrap();
        q.retry(a).unwrap();
        assert_consistent(&q);
        if !keep_after {
            q.set_history(History::off()).unwrap();
        }
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), a);
        l.ack().unwrap();
        q.prune().unwrap();
        f.clock.advance(secs(3600));
        q.prune().unwrap();
        let s = q.stats().unwrap();
        let r = q.enqueue(b"b", dedup("k")).unwrap();
        assert!(
            matches!(r, Enqueued::New(_)),
            "history kept after={keep_after}: the key of finished job {a:?} is still held: \
             {r:?} (job {a:?} is {:?}; stats {s:?}; check {:?})",
            state(&q, a),
            q.check().unwrap()
        );
        assert_consistent(&q);
    }
}

/// A completed job in the history is retried after its idempotency key's marker passed its
/// retention (an ended job does not carry its key, so nothing keeps the marker). The retry
/// promises "if an `ack_with` applied it, the next delivery's `ack_with` answers
/// `AlreadyApplied`: the effect is not applied twice".
#[test]
fn retry_after_the_applied_marker_was_pruned_applies_the_effect_twice() {
    let f = Fixture::new();
    let q = f
        .builder()
        .applied_retention(Some(secs(60)))
        .open(&f.path)
        .unwrap();
    q.set_history(History::off().keep_jobs(1000)).unwrap();
    let id = q
        .enqueue(
            b"charge",
            EnqueueOptions::default().idempotency_key("charge-1"),
        )
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
    assert_eq!(state(&q, id), Some(JobState::Completed));
    f.clock.advance(secs(3600));
    q.prune().unwrap();
    assert_eq!(
        state(&q, id),
        Some(JobState::Completed),
        "still in the history"
    );
    q.retry(id).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let applied = l.ack_with(|tx| bump(tx, 1)).unwrap();
    assert_eq!(
        (applied, effects(&q).get(&1).copied()),
        (Applied::AlreadyApplied, Some(1)),
        "the retried job's effect was applied a second time"
    );
}

/// Retry of a cancelled job that was held until started: it holds its key again until its
/// next first delivery; retry of one that had started holds none.
#[test]
fn retry_of_until_started_jobs_takes_back_only_an_unreleased_key() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let waiting = q.enqueue(b"w", until_started("w")).unwrap().id();
    q.cancel(waiting, "no").unwrap();
    assert!(matches!(
        q.enqueue(b"w2", until_started("w")).unwrap(),
        Enqueued::New(_)
    ));
    // The key is taken: the retry is refused and writes nothing.
    let before = q.job(waiting).unwrap();
    assert!(matches!(q.retry(waiting), Err(Error::KeyHeld { .. })));
    assert_eq!(q.job(waiting).unwrap(), before);
    q.purge(JobState::Ready).unwrap();
    q.retry(waiting).unwrap();
    assert_eq!(
        q.enqueue(b"w3", until_started("w")).unwrap(),
        Enqueued::Duplicate(waiting)
    );
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), waiting);
    assert_eq!(q.job(waiting).unwrap().unwrap().dedup_key, None);
    assert!(matches!(
        q.enqueue(b"w4", until_started("w")).unwrap(),
        Enqueued::New(_)
    ));
    l.ack().unwrap();
    // Retried after it had started: it holds nothing.
    q.retry(waiting).unwrap();
    let j = q.job(waiting).unwrap().unwrap();
    assert_eq!((j.state, j.dedup_key), (JobState::Ready, None));
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Dedup held until started.
// ---------------------------------------------------------------------------------------

/// Until-started keys through a nack, an expiry, a snooze, a reopen with the job leased and a
/// reopen with the job waiting: released exactly at the first delivery, never taken back.
#[test]
fn until_started_keys_through_nack_expiry_snooze_and_reopen() {
    let f = Fixture::new();
    let (a, b, c, w);
    {
        let q = f.open();
        a = q.enqueue(b"a", until_started("a")).unwrap().id();
        b = q.enqueue(b"b", until_started("b")).unwrap().id();
        c = q.enqueue(b"c", until_started("c")).unwrap().id();
        w = q
            .enqueue(b"w", until_started("w").delay(secs(3600)))
            .unwrap()
            .id();
        // a: nacked; b: snoozed with a reason before any ack; c: its lease expires.
        let la = q.dequeue().unwrap().unwrap();
        let lb = q.dequeue().unwrap().unwrap();
        let lc = q.dequeue().unwrap().unwrap();
        assert_eq!((la.id(), lb.id(), lc.id()), (a, b, c));
        la.nack("flaky").unwrap();
        lb.snooze_because(secs(600), "waiting for network").unwrap();
        for k in ["a", "b", "c"] {
            assert!(
                matches!(
                    q.enqueue(k.as_bytes(), until_started(k)).unwrap(),
                    Enqueued::New(_)
                ),
                "key {k} still held after the start"
            );
        }
        let jb = q.job(b).unwrap().unwrap();
        assert_eq!(
            (jb.state, jb.dedup_key, jb.status.as_deref(), jb.attempts),
            (JobState::Scheduled, None, Some("waiting for network"), 0)
        );
        assert_eq!(
            q.enqueue(b"w2", until_started("w")).unwrap(),
            Enqueued::Duplicate(w)
        );
        f.clock.advance(LEASE + secs(1));
        // The expiry of c's lease; the second jobs of a, b, c and a itself are delivered.
        let ls = q.dequeue_batch(10).unwrap();
        assert_eq!(ls.len(), 5, "a, c and the second jobs of a, b, c");
        assert!(ls.iter().all(|l| l.id() != w && l.id() != b));
        drop(lc);
        drop(ls);
        assert_consistent(&q);
    }
    let q = f.open();
    assert_eq!(q.recovery().leases_returned, 5);
    // After the reopen the started jobs hold nothing; the waiting one still holds its key.
    for id in [a, b, c] {
        assert_eq!(q.job(id).unwrap().unwrap().dedup_key, None, "{id:?}");
    }
    assert_eq!(
        q.enqueue(b"w3", until_started("w")).unwrap(),
        Enqueued::Duplicate(w)
    );
    let s = q.stats().unwrap();
    assert_eq!(
        s.dedup_keys, 1,
        "only w's: every other holder started: {s:?}"
    );
    q.promote(w).unwrap();
    let mut seen = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        seen.push(l.id());
        l.ack().unwrap();
    }
    assert!(seen.contains(&w));
    assert_eq!(q.job(w).unwrap(), None);
    assert!(matches!(
        q.enqueue(b"w4", until_started("w")).unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// An until-started holder that is still waiting keeps its key through a reschedule, a new
/// priority and a new payload (none of them is a start); its first delivery releases it.
#[test]
fn until_started_keys_survive_reschedule_calls_while_waiting() {
    let f = Fixture::new();
    let q = f.open();
    let first = q.enqueue(b"v1", until_started("n")).unwrap().id();
    q.reschedule(first, secs(5)).unwrap();
    q.set_priority(first, -3).unwrap();
    q.update_payload(first, &[7u8; 2000]).unwrap();
    assert_eq!(
        q.enqueue(b"v2", until_started("n")).unwrap(),
        Enqueued::Duplicate(first)
    );
    q.promote(first).unwrap();
    assert_eq!(
        q.enqueue(b"v3", until_started("n")).unwrap(),
        Enqueued::Duplicate(first)
    );
    assert_eq!(
        q.job(first).unwrap().unwrap().dedup_key.as_deref(),
        Some(&b"n"[..])
    );
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.payload()), (first, &[7u8; 2000][..]));
    let second = new_id(q.enqueue(b"v4", until_started("n")).unwrap());
    assert_eq!(
        q.enqueue(b"v5", until_started("n")).unwrap(),
        Enqueued::Duplicate(second)
    );
    l.ack().unwrap();
    assert_eq!(
        q.enqueue(b"v6", until_started("n")).unwrap(),
        Enqueued::Duplicate(second)
    );
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Reschedule calls.
// ---------------------------------------------------------------------------------------

/// `update_payload` across the 1 KiB inline limit, both ways, on ready, scheduled and dead
/// jobs: the payload reads back, deliveries carry it, no payload row is left behind; an
/// ended job is refused and keeps its payload.
#[test]
fn update_payload_across_the_inline_limit_both_ways() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let at = vec![1u8; 1024];
    let over = vec![2u8; 1025];
    let r = q.enqueue(&at, plain()).unwrap().id();
    let s = q
        .enqueue(&over, EnqueueOptions::default().delay(secs(60)))
        .unwrap()
        .id();
    let d = q
        .enqueue(
            b"d",
            EnqueueOptions::default().max_attempts(1).priority(-10),
        )
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().nack("bad").unwrap();
    assert_eq!(state(&q, d), Some(JobState::Dead));
    for (round, (pr, ps, pd)) in [
        (over.clone(), at.clone(), over.clone()),
        (at.clone(), over.clone(), at.clone()),
        (vec![3u8; 70_000], Vec::new(), vec![4u8; 1]),
        (Vec::new(), vec![5u8; 1025], vec![6u8; 2048]),
    ]
    .into_iter()
    .enumerate()
    {
        q.update_payload(r, &pr).unwrap();
        q.update_payload(s, &ps).unwrap();
        q.update_payload(d, &pd).unwrap();
        assert_eq!(q.payload(r).unwrap().unwrap(), pr, "round {round}");
        assert_eq!(q.payload(s).unwrap().unwrap(), ps, "round {round}");
        assert_eq!(q.payload(d).unwrap().unwrap(), pd, "round {round}");
        assert_eq!(q.job(r).unwrap().unwrap().payload_bytes as usize, pr.len());
        assert_consistent(&q);
    }
    // Survives a reopen, then delivered with the new payloads.
    drop(q);
    let q = f.open();
    q.retry(d).unwrap();
    q.promote(s).unwrap();
    let got: Vec<(JobId, usize)> = q
        .dequeue_batch(10)
        .unwrap()
        .into_iter()
        .map(|l| {
            let out = (l.id(), l.payload().len());
            l.ack().unwrap();
            out
        })
        .collect();
    assert_eq!(got, vec![(d, 2048), (r, 0), (s, 1025)]);
    // Ended: refused, the payload stays.
    let before = q.payload(s).unwrap();
    assert!(matches!(
        q.update_payload(s, b"late"),
        Err(Error::InvalidState {
            actual: JobState::Completed,
            ..
        })
    ));
    assert_eq!(q.payload(s).unwrap(), before);
    q.set_history(History::off()).unwrap();
    q.prune().unwrap();
    assert_eq!(q.stats().unwrap().completed, 0);
    assert_consistent(&q);
}

/// Priorities and zero delays keep the ready order: a ready job rescheduled to now keeps its
/// place; a priority changed back and forth keeps its place by when it became ready; a job
/// sent to wait and made due goes to the back.
#[test]
fn reschedule_and_set_priority_keep_the_ready_order() {
    let f = Fixture::new();
    let q = f.open();
    let [a, b, c, d]: [JobId; 4] = crate::common::enqueue_n(&q, 4, plain()).try_into().unwrap();
    q.reschedule(a, Duration::ZERO).unwrap();
    q.set_priority(b, 0).unwrap();
    q.set_priority(c, -1).unwrap();
    q.set_priority(c, 0).unwrap();
    q.set_priority(a, 7).unwrap();
    q.set_priority(a, 0).unwrap();
    q.reschedule(b, secs(10)).unwrap();
    assert_eq!(state(&q, b), Some(JobState::Scheduled));
    q.reschedule(b, Duration::ZERO).unwrap();
    assert_eq!(state(&q, b), Some(JobState::Ready));
    assert_eq!(ids_in(&q, JobState::Ready), vec![a, c, d, b]);
    q.set_priority(d, i32::MIN).unwrap();
    q.set_priority(a, i32::MAX).unwrap();
    let order: Vec<JobId> = q
        .dequeue_batch(10)
        .unwrap()
        .iter()
        .map(|l| l.id())
        .collect();
    assert_eq!(order, vec![d, c, b, a]);
    assert_consistent(&q);
}

/// Reschedule calls never touch an ended job, even one whose id is reused by nothing and
/// whose row is kept only as a fence.
#[test]
fn reschedule_calls_refuse_ended_jobs_and_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"x", plain()).unwrap().id();
    let _lease = q.dequeue().unwrap().unwrap();
    q.cancel(id, "stop").unwrap();
    let before = q.job(id).unwrap();
    for (name, r) in [
        ("promote", q.promote(id)),
        ("reschedule", q.reschedule(id, Duration::ZERO)),
        ("set_priority", q.set_priority(id, 3)),
        ("update_payload", q.update_payload(id, b"y")),
        ("requeue_dead", q.requeue_dead(id)),
    ] {
        assert!(
            matches!(
                r,
                Err(Error::InvalidState {
                    actual: JobState::Cancelled,
                    ..
                })
            ),
            "{name}: {r:?}"
        );
    }
    assert_eq!(q.job(id).unwrap(), before);
    assert!(q.dequeue().unwrap().is_none());
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Reasons, statuses and the error history at their bounds.
// ---------------------------------------------------------------------------------------

/// Reasons far above `REASON_BYTES_MAX`, with a multi-byte character across the cut, in
/// every place a reason is kept (nack, fail, snooze status, cancel, import): each is cut at a
/// character boundary to at most the bound, a prefix of what was given; the history keeps the
/// last `ERRORS_KEPT` attempts. A record holding all of them at once (and keys at their
/// largest) survives a reopen unquarantined.
#[test]
fn huge_multibyte_reasons_are_cut_at_a_boundary_everywhere() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let max = leaseq::REASON_BYTES_MAX;
    // 'x' then 2-byte characters: byte max falls inside one.
    let two = format!("x{}", "é".repeat(max));
    // 'x' then 4-byte characters: byte max falls inside one.
    let four = format!("x{}", "🦀".repeat(max / 2));
    let cut = |s: &str, got: &str| {
        assert!(got.len() <= max, "{} bytes", got.len());
        assert!(got.len() > max - 4, "cut too short: {} bytes", got.len());
        assert!(s.starts_with(got));
    };
    let key = vec![b'k'; leaseq::KEY_BYTES_MAX];
    let id = q
        .enqueue(
            &[9u8; 1024],
            EnqueueOptions::default()
                .max_attempts(40)
                .idempotency_key(&key)
                .dedup_key(&key),
        )
        .unwrap()
        .id();
    let n = leaseq::ERRORS_KEPT + 3;
    for i in 0..n {
        f.clock.advance(ms(3));
        let l = q.dequeue().unwrap().unwrap();
        let reason = if i % 2 == 0 { &two } else { &four };
        l.nack(reason).unwrap();
    }
    let l = q.dequeue().unwrap().unwrap();
    l.snooze_because(Duration::ZERO, &four).unwrap();
    let j = q.job(id).unwrap().unwrap();
    assert_eq!(j.errors.len(), leaseq::ERRORS_KEPT);
    let attempts: Vec<u32> = j.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, (4..=n as u32).collect::<Vec<_>>());
    for (e, i) in j.errors.iter().zip(3..n) {
        cut(if i % 2 == 0 { &two } else { &four }, &e.message);
        assert!(e.at_ms.is_some());
    }
    cut(&four, j.status.as_deref().unwrap());
    assert_eq!(
        j.last_error.as_deref(),
        Some(j.errors.last().unwrap().message.as_str())
    );
    assert_consistent(&q);
    // The largest record there is: reopen, nothing quarantined.
    drop(q);
    let q = f.open();
    assert_eq!(q.recovery().quarantined, 0);
    assert!(q.quarantined(None, 10).unwrap().is_empty());
    assert_eq!(
        q.job(id).unwrap().unwrap().errors.len(),
        leaseq::ERRORS_KEPT
    );
    let l = q.dequeue().unwrap().unwrap();
    l.fail(&two).unwrap();
    let j = q.job(id).unwrap().unwrap();
    assert_eq!(j.state, JobState::Dead);
    cut(&two, j.last_error.as_deref().unwrap());
    assert_eq!(j.errors.len(), leaseq::ERRORS_KEPT);
    q.retry(id).unwrap();
    q.cancel(id, &four).unwrap();
    let j = q.job(id).unwrap().unwrap();
    cut(&four, j.cancel_reason.as_deref().unwrap());
    assert_eq!(
        j.errors.len(),
        leaseq::ERRORS_KEPT,
        "a cancel keeps the error history"
    );
    assert_consistent(&q);
    drop(q);
    let q = f.open();
    assert!(q.quarantined(None, 10).unwrap().is_empty());
    assert_eq!(state(&q, id), Some(JobState::Cancelled));
    // Imported with a huge last error: cut the same way, no time.
    let ids = q
        .import_batch(&[ImportJob::new(b"imp".to_vec())
            .attempts(2)
            .last_error(Some(two.clone()))])
        .unwrap();
    let j = q.job(ids[0].id()).unwrap().unwrap();
    assert_eq!(j.errors.len(), 1);
    assert_eq!((j.errors[0].attempt, j.errors[0].at_ms), (2, None));
    cut(&two, &j.errors[0].message);
    assert_consistent(&q);
}

/// Import refuses the ended states (only live jobs are imported) and writes nothing of the
/// batch.
#[test]
fn import_of_completed_or_cancelled_jobs_is_refused_whole() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    for s in [JobState::Completed, JobState::Cancelled] {
        let r = q.import_batch(&[
            ImportJob::new(b"ok".to_vec()),
            ImportJob::new(b"ended".to_vec()).state(s),
        ]);
        assert!(
            matches!(r, Err(Error::InvalidOption { .. })),
            "{s:?}: {r:?}"
        );
        let st = q.stats().unwrap();
        assert_eq!((st.total, st.completed, st.cancelled), (0, 0, 0), "{st:?}");
    }
    assert_consistent(&q);
}

/// Many cancels of waiting jobs with a tiny history and `prune` never fail a later
/// `requeue_dead_all`, `purge` or `check`; counts add up (the stats' total never counts ended
/// jobs, never wraps).
#[test]
fn stats_stay_exact_through_cancels_retries_and_prunes() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(3)).unwrap();
    let ids = crate::common::enqueue_n(&q, 20, EnqueueOptions::default().max_attempts(1));
    for id in &ids[..10] {
        f.clock.advance(ms(1));
        q.cancel(*id, "bulk").unwrap();
    }
    for _ in 0..5 {
        q.dequeue().unwrap().unwrap().nack("boom").unwrap();
    }
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.ready, s.dead, s.cancelled),
        (10, 5, 5, 3),
        "{s:?}"
    );
    for id in ids[7..10].iter() {
        q.retry(*id).unwrap();
    }
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.ready, s.dead, s.cancelled),
        (13, 8, 5, 0),
        "{s:?}"
    );
    assert_eq!(q.requeue_dead_all().unwrap(), 5);
    assert_eq!(q.len().unwrap(), 13);
    let out = all_ok(q.ack_batch(&q.dequeue_batch(13).unwrap()).unwrap());
    assert_eq!(out.len(), 13);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.completed, s.cancelled), (0, 3, 0), "{s:?}");
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}
