//! The job controls of issue 22: cancel (any live state, a leased job's delivery fenced),
//! the completed history (opt-in per queue, bounded by count and age, stored in the file),
//! retry of an ended job, dedup keys held until the job starts, snooze reasons and the error
//! history. Each test drives the public API on a real file with a manual clock and checks the
//! file's invariants (`check()`) after the writes.

use crate::common::{Fixture, assert_consistent, ms, plain, secs};
use leaseq::worker::WorkerPool;
use leaseq::{CancelOutcome, Clock, EnqueueOptions, Enqueued, Error, History, JobState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn dedup(key: &str) -> EnqueueOptions {
    EnqueueOptions::default().dedup_key(key)
}

// ---------------------------------------------------------------------------------------
// Cancel.
// ---------------------------------------------------------------------------------------

/// A scheduled, ready or dead job is ended at once, in any queue: never delivered again, its
/// dedup key free; without a history its row goes.
#[test]
fn cancel_ends_a_waiting_or_dead_job_at_once_and_frees_its_key() {
    let f = Fixture::new();
    let q = f.open();
    let ready = q.enqueue(b"ready", dedup("r")).unwrap().id();
    let later = q
        .enqueue(b"later", EnqueueOptions::default().delay(secs(60)))
        .unwrap()
        .id();
    let dead = q
        .enqueue(
            b"dead",
            EnqueueOptions::default().max_attempts(1).priority(-1),
        )
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().nack("broken").unwrap();
    assert_eq!(q.job(dead).unwrap().unwrap().state, JobState::Dead);
    assert_eq!(
        q.cancel(ready, "not wanted").unwrap().was(),
        Some(JobState::Ready)
    );
    assert_eq!(
        q.cancel(later, "not wanted").unwrap().was(),
        Some(JobState::Scheduled)
    );
    assert_eq!(
        q.cancel(dead, "given up").unwrap().was(),
        Some(JobState::Dead)
    );
    // No history: the rows are gone, nothing is left to deliver. A second cancel says the
    // job is gone, not that it never existed.
    for id in [ready, later, dead] {
        assert_eq!(q.job(id).unwrap(), None);
        assert_eq!(q.cancel(id, "again").unwrap(), CancelOutcome::Gone);
    }
    f.clock.advance(secs(120));
    assert!(q.dequeue().unwrap().is_none());
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.cancelled, s.dedup_keys), (0, 0, 0), "{s:?}");
    // The key is free: a new enqueue makes a new job.
    assert!(matches!(
        q.enqueue(b"ready again", dedup("r")).unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// A leased job's delivery is fenced: every call of that lease is refused with `Cancelled`
/// and writes nothing (an `ack_with` closure does not run), its worker can see it, and the
/// row stays (cancelled, with its reason) until that lease's deadline, then goes.
#[test]
fn cancel_fences_the_delivery_of_a_leased_job() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(
            b"sync note",
            EnqueueOptions::default()
                .idempotency_key("n1")
                .dedup_key("d"),
        )
        .unwrap()
        .id();
    let lease = q.dequeue().unwrap().unwrap();
    let beat = lease.heartbeat();
    assert!(!lease.is_cancelled().unwrap());
    assert_eq!(
        q.cancel(id, "note deleted").unwrap().was(),
        Some(JobState::Leased)
    );
    assert!(lease.is_cancelled().unwrap());
    assert!(beat.is_cancelled().unwrap());
    let job = q.job(id).unwrap().unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.cancel_reason.as_deref(), Some("note deleted"));
    assert_eq!(job.ended_ms, Some(f.clock.now_ms()));
    // The heartbeat and every call of the lease are refused, with the reason.
    assert!(
        matches!(beat.extend(secs(30)), Err(Error::Cancelled { ref reason, .. }) if reason == "note deleted")
    );
    let ran = AtomicBool::new(false);
    let r = lease.ack_with(|_| {
        ran.store(true, Ordering::SeqCst);
        Ok(())
    });
    assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
    assert!(
        !ran.load(Ordering::SeqCst),
        "the effect of a cancelled delivery never runs"
    );
    assert!(!q.is_applied("n1").unwrap());
    // The lease ended with that refusal: later calls say Cancelled again, without a read.
    assert!(
        matches!(lease.nack("x"), Err(Error::Cancelled { ref reason, .. }) if reason == "note deleted")
    );
    assert!(lease.is_cancelled().unwrap());
    // Its key is free at once; the job is counted as cancelled, not live.
    assert!(matches!(
        q.enqueue(b"n", dedup("d")).unwrap(),
        Enqueued::New(_)
    ));
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.leased, s.cancelled), (1, 0, 1), "{s:?}");
    assert_consistent(&q);
    // A second cancel changes nothing: it already ended.
    assert_eq!(
        q.cancel(id, "again").unwrap(),
        CancelOutcome::AlreadyEnded {
            state: JobState::Cancelled
        }
    );
    // Past the fenced lease's deadline, with no history, the next operation deletes it.
    f.clock.advance(crate::common::LEASE + ms(1));
    let _ = q.dequeue().unwrap();
    assert_eq!(q.job(id).unwrap(), None);
    assert_eq!(q.stats().unwrap().cancelled, 0);
    assert_consistent(&q);
}

/// Every fenced call of a cancelled delivery (nack, snooze, fail, extend) is refused and
/// changes nothing, and a cancel of a job nobody has is `JobNotFound`.
#[test]
fn every_call_of_a_cancelled_delivery_is_refused_and_writes_nothing() {
    type Call = fn(&leaseq::Lease) -> leaseq::Result<()>;
    let calls: [(&str, Call); 5] = [
        ("nack", |l| l.nack("x").map(drop)),
        ("snooze", |l| l.snooze(secs(1))),
        ("fail", |l| l.fail("x")),
        ("extend", |l| l.extend(secs(5))),
        ("ack_with_result", |l| l.ack_with_result(b"r")),
    ];
    for (name, call) in calls {
        let f = Fixture::new();
        let q = f.open();
        q.set_history(History::off().keep_jobs(10)).unwrap();
        let id = q.enqueue(b"job", plain()).unwrap().id();
        let lease = q.dequeue().unwrap().unwrap();
        q.cancel(id, "stop").unwrap();
        let before = q.job(id).unwrap();
        let r = call(&lease);
        assert!(matches!(r, Err(Error::Cancelled { .. })), "{name}: {r:?}");
        assert_eq!(q.job(id).unwrap(), before, "{name} wrote");
        assert_consistent(&q);
    }
    let f = Fixture::new();
    let q = f.open();
    assert!(matches!(
        q.cancel(leaseq::JobId(99), "x"),
        Err(Error::JobNotFound { .. })
    ));
}

/// A worker pool's handler can see its job cancelled while it runs, and the pool stops that
/// handler's heartbeats (the heartbeat's extend says `Cancelled`).
#[test]
fn a_pool_handler_sees_its_job_cancelled_and_its_heartbeats_stop() {
    let f = Fixture::new();
    let q = f
        .builder()
        .clock(leaseq::SystemClock)
        .lease(ms(400))
        .open(&f.path)
        .unwrap();
    let id = q.enqueue(b"long", plain()).unwrap().id();
    let (saw_tx, saw_rx) = std::sync::mpsc::channel();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let pool = WorkerPool::builder(&q)
        .threads(1)
        .start(move |lease| {
            started_tx.send(()).unwrap();
            // Works in steps, looking between them.
            for _ in 0..200 {
                if lease.is_cancelled()? {
                    saw_tx.send(true).unwrap();
                    return Ok(());
                }
                std::thread::sleep(ms(10));
            }
            saw_tx.send(false).unwrap();
            Ok(())
        })
        .unwrap();
    started_rx.recv_timeout(secs(10)).unwrap();
    q.cancel(id, "user pressed stop").unwrap();
    assert!(
        saw_rx.recv_timeout(secs(10)).unwrap(),
        "the handler saw the cancel"
    );
    let report = pool.shutdown(secs(5));
    assert_eq!(report.still_running, 0, "{report:?}");
    assert_eq!(
        (
            report.stats.cancelled,
            report.stats.acked,
            report.stats.errors
        ),
        (1, 0, 0),
        "the handler's ack was refused as cancelled: {report:?}"
    );
    // The handler's Ok was an ack of a cancelled delivery: refused; nothing runs it again.
    assert_eq!(
        q.job(id).unwrap().map(|j| j.state),
        Some(JobState::Cancelled)
    );
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// The completed history.
// ---------------------------------------------------------------------------------------

/// Off by default; once set (stored in the file, per queue), acks keep their jobs as
/// completed, with the result; listed, counted, shown; the oldest go past `keep_jobs`.
#[test]
fn a_history_keeps_the_last_completed_jobs_with_their_results() {
    let f = Fixture::new();
    let q = f.open();
    assert!(q.history().unwrap().is_off());
    let first = q.enqueue(b"first", plain()).unwrap().id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.job(first).unwrap(), None, "no history: the ack deletes");
    assert!(q.set_history(History::off().keep_jobs(3)).unwrap());
    assert!(
        !q.set_history(History::off().keep_jobs(3)).unwrap(),
        "unchanged"
    );
    let ids = crate::common::enqueue_n(&q, 5, plain());
    for (i, id) in ids.iter().enumerate() {
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), *id);
        f.clock.advance(ms(10));
        l.ack_with_result(format!("r{i}").as_bytes()).unwrap();
    }
    // The last 3 are kept, oldest first in the list.
    let page = q.jobs(JobState::Completed, None, 10).unwrap();
    let kept: Vec<_> = page.jobs.iter().map(|j| j.id).collect();
    assert_eq!(kept, ids[2..].to_vec());
    let job = q.job(ids[4]).unwrap().unwrap();
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.result.as_deref(), Some(&b"r4"[..]));
    assert_eq!(job.ended_ms, Some(f.clock.now_ms()));
    assert_eq!(q.payload(ids[4]).unwrap().as_deref(), Some(&b"job 4"[..]));
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.completed), (0, 3), "{s:?}");
    assert!(q.is_empty().unwrap(), "completed jobs are not pending");
    assert_consistent(&q);
    // Stored in the file: a reopen keeps the setting and the jobs.
    drop(q);
    let q = f.open();
    assert_eq!(q.history().unwrap(), History::off().keep_jobs(3));
    assert_eq!(q.stats().unwrap().completed, 3);
    // Per queue: a named queue of the file keeps none.
    let side = q.named("side").unwrap();
    assert!(side.history().unwrap().is_off());
    let s_id = side.enqueue(b"s", plain()).unwrap().id();
    side.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(side.job(s_id).unwrap(), None);
    // Turned off: prune deletes what is kept.
    assert!(q.set_history(History::off()).unwrap());
    assert_eq!(q.prune().unwrap().history, 3);
    assert_eq!(q.stats().unwrap().completed, 0);
    assert_consistent(&q);
}

/// `keep_for` bounds the history by age: jobs older than it go, a few per operation and the
/// rest by prune; `purge(Completed)` clears it; bad bounds are refused and write nothing.
#[test]
fn a_history_by_age_forgets_old_jobs_and_bad_bounds_are_refused() {
    let f = Fixture::new();
    let q = f.open();
    for bad in [
        History::off().keep_jobs(0),
        History::off().keep_jobs(leaseq::HISTORY_JOBS_MAX + 1),
        History::off().keep_for(Duration::ZERO),
        History::off().keep_for(leaseq::DELAY_MAX + secs(1)),
    ] {
        assert!(
            matches!(q.set_history(bad), Err(Error::InvalidOption { .. })),
            "{bad:?}"
        );
        assert!(q.history().unwrap().is_off());
    }
    q.set_history(History::off().keep_for(secs(60))).unwrap();
    let ids = crate::common::enqueue_n(&q, 6, plain());
    for _ in &ids {
        q.dequeue().unwrap().unwrap().ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().completed, 6);
    f.clock.advance(secs(59));
    let _ = q.dequeue().unwrap();
    assert_eq!(q.stats().unwrap().completed, 6, "younger than the bound");
    f.clock.advance(secs(1));
    // An ack deletes a bounded few of the old ones (and keeps its own job).
    q.enqueue(b"new", plain()).unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    let left = q.stats().unwrap().completed;
    assert!((2..=6).contains(&left), "{left}");
    assert_eq!(q.prune().unwrap().history, left - 1);
    assert_eq!(q.stats().unwrap().completed, 1, "the young one stays");
    // Purge clears a history at once.
    assert_eq!(q.purge(JobState::Completed).unwrap(), 1);
    assert_consistent(&q);
}

/// A result above `RESULT_BYTES_MAX` is refused and the lease stays current.
#[test]
fn an_oversized_result_is_refused_and_the_lease_stays() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(5)).unwrap();
    let id = q.enqueue(b"x", plain()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    let big = vec![7u8; leaseq::RESULT_BYTES_MAX + 1];
    assert!(matches!(
        l.ack_with_result(&big),
        Err(Error::InvalidOption { .. })
    ));
    assert_eq!(q.job(id).unwrap().unwrap().state, JobState::Leased);
    l.ack_with_result(&big[..leaseq::RESULT_BYTES_MAX]).unwrap();
    assert_eq!(
        q.job(id).unwrap().unwrap().result.map(|r| r.len()),
        Some(leaseq::RESULT_BYTES_MAX)
    );
}

/// `ack_with` into a history: the effect, the marker and the completed row commit together;
/// the completed job does not keep its idempotency key's marker alive.
#[test]
fn ack_with_keeps_the_job_completed_in_a_history() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(5)).unwrap();
    let id = q
        .enqueue(b"pay", EnqueueOptions::default().idempotency_key("p1"))
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.ack_with(|_| Ok(())).unwrap(), leaseq::Applied::Now);
    assert_eq!(q.job(id).unwrap().unwrap().state, JobState::Completed);
    assert!(q.is_applied("p1").unwrap());
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Retry of an ended job.
// ---------------------------------------------------------------------------------------

/// A completed or cancelled job runs again as a new attempt series and takes its keys back;
/// a key another job took meanwhile refuses the retry and writes nothing; a live job is
/// refused.
#[test]
fn retry_runs_an_ended_job_again_with_its_keys() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let a = q
        .enqueue(
            b"a",
            EnqueueOptions::default().dedup_key("ka").max_attempts(2),
        )
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    l.nack("first try").unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.job(a).unwrap().unwrap().attempts, 2);
    q.retry(a).unwrap();
    let job = q.job(a).unwrap().unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Ready, 0));
    assert_eq!(
        job.last_error.as_deref(),
        Some("first try"),
        "its errors stay"
    );
    assert_eq!(
        q.enqueue(b"dup", dedup("ka")).unwrap(),
        Enqueued::Duplicate(a),
        "it holds its key again"
    );
    assert!(matches!(
        q.retry(a),
        Err(Error::InvalidState {
            actual: JobState::Ready,
            ..
        })
    ));
    // Cancelled, then its key taken by a new job: the retry is refused.
    q.cancel(a, "no").unwrap();
    let b = q.enqueue(b"b", dedup("ka")).unwrap().id();
    let before = q.job(a).unwrap();
    assert!(matches!(q.retry(a), Err(Error::KeyHeld { holder, .. }) if holder == b));
    assert_eq!(q.job(a).unwrap(), before);
    q.remove(b).unwrap();
    q.retry(a).unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().id(), a);
    assert_consistent(&q);
}

/// Issue 42 item 8: as River's `JobRetry` (every job but a running one becomes available
/// now), a scheduled job, waiting for its backoff or for its delay, runs now: ready at the
/// back of its priority, its attempts, error and keys kept (as `promote`); a ready or leased
/// job is still refused, nothing written.
#[test]
fn retry_runs_a_scheduled_job_now_as_river_does() {
    let f = Fixture::new();
    let q = f
        .builder()
        .retry(leaseq::RetryPolicy::fixed(secs(60)))
        .open(&f.path)
        .unwrap();
    let failed = q.enqueue(b"failed", dedup("kf")).unwrap().id();
    q.dequeue().unwrap().unwrap().nack("offline").unwrap();
    let delayed = q
        .enqueue(b"delayed", EnqueueOptions::default().delay(secs(3600)))
        .unwrap()
        .id();
    let ahead = q.enqueue(b"ahead", plain()).unwrap().id();
    for id in [failed, delayed] {
        assert_eq!(q.job(id).unwrap().unwrap().state, JobState::Scheduled);
    }
    q.retry(failed).unwrap();
    let job = q.job(failed).unwrap().unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Ready, 1),
        "attempts kept"
    );
    assert_eq!(job.run_at_ms, f.clock_now());
    assert_eq!(job.last_error.as_deref(), Some("offline"));
    assert_eq!(
        q.enqueue(b"dup", dedup("kf")).unwrap(),
        Enqueued::Duplicate(failed),
        "it still holds its key"
    );
    q.retry(delayed).unwrap();
    // At the back of its priority: behind the job that was ready before.
    let order: Vec<_> = (0..3).map(|_| q.dequeue().unwrap().unwrap()).collect();
    let ids: Vec<_> = order.iter().map(|l| l.id()).collect();
    assert_eq!(ids, vec![ahead, failed, delayed]);
    // Leased now: refused, nothing written.
    let before = q.job(delayed).unwrap();
    assert!(matches!(
        q.retry(delayed),
        Err(Error::InvalidState {
            actual: JobState::Leased,
            ..
        })
    ));
    assert_eq!(q.job(delayed).unwrap(), before);
    for l in order {
        l.ack().unwrap();
    }
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Dedup held until the job starts.
// ---------------------------------------------------------------------------------------

/// The key is held while the job waits, and released at its first delivery: an edit saved
/// while the sync job runs gets its own job, so it is not lost.
#[test]
fn a_key_held_until_started_lets_a_new_job_in_once_the_first_runs() {
    let f = Fixture::new();
    let q = f.open();
    let sync = |payload: &[u8]| {
        q.enqueue(
            payload,
            EnqueueOptions::default()
                .dedup_key("note-7")
                .dedup_until_started(),
        )
        .unwrap()
    };
    let first = sync(b"v1").id();
    assert_eq!(
        sync(b"v2"),
        Enqueued::Duplicate(first),
        "held while waiting"
    );
    let running = q.dequeue().unwrap().unwrap();
    assert_eq!(q.job(first).unwrap().unwrap().dedup_key, None);
    let second = match sync(b"v3") {
        Enqueued::New(id) => id,
        other => panic!("a new job after the start, got {other:?}"),
    };
    assert_eq!(sync(b"v4"), Enqueued::Duplicate(second));
    // The first job's nack does not take the key back.
    running.nack("offline").unwrap();
    assert_eq!(sync(b"v5"), Enqueued::Duplicate(second));
    assert_consistent(&q);
    // Refused without a key, or with a window.
    for bad in [
        EnqueueOptions::default().dedup_until_started(),
        EnqueueOptions::default()
            .dedup_key("k")
            .dedup_window(secs(5))
            .dedup_until_started(),
    ] {
        assert!(matches!(
            q.enqueue(b"x", bad),
            Err(Error::InvalidOption { .. })
        ));
    }
}

// ---------------------------------------------------------------------------------------
// Snooze reasons and the error history.
// ---------------------------------------------------------------------------------------

/// A snooze's reason is the job's status until its next delivery, apart from its last error;
/// the error history keeps each attempt's error, time and number, at most `ERRORS_KEPT`.
#[test]
fn snooze_reasons_and_the_error_history_are_kept() {
    let f = Fixture::new();
    let q = f.open();
    let max = leaseq::ERRORS_KEPT as u32 + 3;
    let id = q
        .enqueue(b"x", EnqueueOptions::default().max_attempts(max + 1))
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    l.nack("timeout").unwrap();
    let l = q.dequeue().unwrap().unwrap();
    l.snooze_because(Duration::ZERO, "waiting for network")
        .unwrap();
    let job = q.job(id).unwrap().unwrap();
    assert_eq!(job.status.as_deref(), Some("waiting for network"));
    assert_eq!(
        job.last_error.as_deref(),
        Some("timeout"),
        "a snooze keeps it"
    );
    assert_eq!(
        job.errors,
        vec![leaseq::AttemptError {
            attempt: 1,
            at_ms: Some(f.clock.now_ms()),
            message: "timeout".into()
        }]
    );
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.snoozes(), 1);
    assert_eq!(
        q.job(id).unwrap().unwrap().status,
        None,
        "cleared by the delivery"
    );
    l.nack("e2").unwrap();
    for i in 3..=max {
        f.clock.advance(ms(5));
        q.dequeue()
            .unwrap()
            .unwrap()
            .nack(&format!("e{i}"))
            .unwrap();
    }
    let job = q.job(id).unwrap().unwrap();
    assert_eq!(job.errors.len(), leaseq::ERRORS_KEPT);
    let attempts: Vec<u32> = job.errors.iter().map(|e| e.attempt).collect();
    let want: Vec<u32> = (max + 1 - leaseq::ERRORS_KEPT as u32..=max).collect();
    assert_eq!(attempts, want, "the last ERRORS_KEPT, oldest first");
    assert_eq!(job.last_error.as_deref(), Some(format!("e{max}").as_str()));
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Reschedule a waiting job.
// ---------------------------------------------------------------------------------------

/// Promote, a new due time, a new priority and a new payload each keep every index in step;
/// a leased or ended job is refused and nothing is written.
#[test]
fn waiting_jobs_are_rescheduled_and_leased_ones_refused() {
    let f = Fixture::new();
    let q = f.open();
    let later = q
        .enqueue(b"later", EnqueueOptions::default().delay(secs(3600)))
        .unwrap()
        .id();
    let a = q.enqueue(b"a", plain()).unwrap().id();
    let b = q.enqueue(b"b", plain()).unwrap().id();
    // Promote: the scheduled job is ready now, behind a and b.
    q.promote(later).unwrap();
    assert_eq!(q.job(later).unwrap().unwrap().state, JobState::Ready);
    assert!(matches!(
        q.promote(a),
        Err(Error::InvalidState {
            actual: JobState::Ready,
            ..
        })
    ));
    // A new priority moves b ahead; a delay sends a back to wait.
    q.set_priority(b, -5).unwrap();
    q.reschedule(a, secs(60)).unwrap();
    let ja = q.job(a).unwrap().unwrap();
    assert_eq!(
        (ja.state, ja.run_at_ms),
        (JobState::Scheduled, f.clock.now_ms() + 60_000)
    );
    // A new payload, large enough to be stored apart, then small again.
    let big = vec![9u8; 5000];
    q.update_payload(later, &big).unwrap();
    assert_eq!(q.payload(later).unwrap().unwrap(), big);
    assert_consistent(&q);
    let order: Vec<_> = q
        .dequeue_batch(10)
        .unwrap()
        .into_iter()
        .map(|l| (l.id(), l.payload().to_vec()))
        .collect();
    assert_eq!(order, vec![(b, b"b".to_vec()), (later, big.clone())]);
    // Leased jobs are refused, with nothing written.
    for r in [
        q.update_payload(b, b"x"),
        q.set_priority(b, 1),
        q.reschedule(b, secs(1)),
        q.promote(b),
    ] {
        assert!(
            matches!(
                r,
                Err(Error::InvalidState {
                    actual: JobState::Leased,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert_eq!(q.job(b).unwrap().unwrap().priority, -5);
    // The scheduled one: due now with a zero delay; bad input refused.
    q.reschedule(a, Duration::ZERO).unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().id(), a);
    assert!(matches!(
        q.reschedule(a, leaseq::DELAY_MAX + secs(1)),
        Err(Error::InvalidOption { .. })
    ));
    assert!(matches!(
        q.promote(leaseq::JobId(999)),
        Err(Error::JobNotFound { .. })
    ));
    let huge = vec![0u8; 64 << 20];
    assert!(matches!(
        q.update_payload(later, &huge),
        Err(Error::PayloadTooLarge { .. })
    ));
    assert_consistent(&q);
}

/// A dead job's payload and priority can be fixed before it runs again.
#[test]
fn a_dead_jobs_payload_is_fixed_then_retried() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"bad input", EnqueueOptions::default().max_attempts(1))
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().nack("parse error").unwrap();
    q.update_payload(id, b"good input").unwrap();
    q.set_priority(id, -1).unwrap();
    assert!(matches!(
        q.reschedule(id, secs(1)),
        Err(Error::InvalidState {
            actual: JobState::Dead,
            ..
        })
    ));
    q.retry(id).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), b"good input");
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Replace, debounce, release a key by hand.
// ---------------------------------------------------------------------------------------

/// A duplicate with `Replace` gives the waiting holder its payload (the latest edit wins,
/// the holder keeps its place and id); a leased holder is a plain duplicate (the edit gets
/// its own job only with `dedup_until_started`).
#[test]
fn a_duplicate_replaces_the_waiting_jobs_payload() {
    let f = Fixture::new();
    let q = f.open();
    let edit = |payload: &[u8]| {
        q.enqueue(
            payload,
            EnqueueOptions::default()
                .dedup_key("note-7")
                .on_duplicate(leaseq::OnDuplicate::Replace),
        )
        .unwrap()
    };
    let first = edit(b"v1").id();
    let other = q.enqueue(b"other", plain()).unwrap().id();
    assert_eq!(edit(b"v2"), Enqueued::Replaced(first));
    // Across the inline limit and back.
    let big = vec![3u8; 4000];
    assert_eq!(edit(&big), Enqueued::Replaced(first));
    assert_eq!(q.payload(first).unwrap().unwrap(), big);
    assert_consistent(&q);
    assert_eq!(edit(b"v4"), Enqueued::Replaced(first));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(
        (l.id(), l.payload()),
        (first, &b"v4"[..]),
        "it kept its place"
    );
    assert_eq!(
        edit(b"v5"),
        Enqueued::Duplicate(first),
        "a leased holder keeps its payload"
    );
    l.ack().unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().id(), other);
    assert!(matches!(
        q.enqueue(
            b"x",
            EnqueueOptions::default().on_duplicate(leaseq::OnDuplicate::Replace)
        ),
        Err(Error::InvalidOption { .. })
    ));
    assert_consistent(&q);
}

/// Debounce: a burst of enqueues runs once, after the last one's delay, with the last
/// payload.
#[test]
fn a_debounced_burst_runs_once_after_the_last() {
    let f = Fixture::new();
    let q = f.open();
    let save = |payload: &[u8]| {
        q.enqueue(
            payload,
            EnqueueOptions::default()
                .dedup_key("autosave")
                .delay(secs(5))
                .on_duplicate(leaseq::OnDuplicate::Debounce),
        )
        .unwrap()
    };
    let id = save(b"draft 1").id();
    for i in 2..=4 {
        f.clock.advance(secs(3));
        assert_eq!(
            save(format!("draft {i}").as_bytes()),
            Enqueued::Replaced(id)
        );
        assert!(q.dequeue().unwrap().is_none(), "pushed back each time");
    }
    f.clock.advance(secs(5));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.payload()), (id, &b"draft 4"[..]));
    assert_consistent(&q);
}

/// A key released by hand lets a new enqueue in; the old holder goes on without it.
#[test]
fn a_dedup_key_released_by_hand_lets_a_new_job_in() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"a", dedup("k")).unwrap().id();
    assert_eq!(q.release_dedup_key("k").unwrap(), Some(a));
    assert_eq!(
        q.release_dedup_key("k").unwrap(),
        None,
        "nothing holds it now"
    );
    assert_eq!(q.job(a).unwrap().unwrap().dedup_key, None);
    let b = match q.enqueue(b"b", dedup("k")).unwrap() {
        Enqueued::New(id) => id,
        other => panic!("{other:?}"),
    };
    assert_consistent(&q);
    // Deleting the old holder leaves the new one's key alone.
    q.remove(a).unwrap();
    assert_eq!(q.enqueue(b"c", dedup("k")).unwrap(), Enqueued::Duplicate(b));
    // A window's key too.
    let w = EnqueueOptions::default()
        .dedup_key("w")
        .dedup_window(secs(600));
    let c = q.enqueue(b"w", w.clone()).unwrap().id();
    assert_eq!(q.release_dedup_key("w").unwrap(), Some(c));
    assert!(matches!(q.enqueue(b"w2", w).unwrap(), Enqueued::New(_)));
    assert!(matches!(
        q.release_dedup_key(""),
        Err(Error::InvalidOption { .. })
    ));
    assert!(matches!(
        q.release_dedup_key(vec![0u8; leaseq::KEY_BYTES_MAX + 1]),
        Err(Error::KeyTooLong { .. })
    ));
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// The history's bounds, against a model of what it may keep.
// ---------------------------------------------------------------------------------------

mod history_bounds {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const LEASE_MS: u64 = 1_000;

    #[derive(Debug, Clone)]
    enum Op {
        Enqueue,
        /// Dequeue and ack.
        Complete,
        /// Dequeue and cancel the leased job (its row fenced until the lease's deadline).
        CancelLeased,
        /// Cancel the oldest waiting job.
        CancelWaiting,
        SetHistory(Option<u64>, Option<u64>),
        Clock(u64),
        Prune,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Enqueue),
            4 => Just(Op::Complete),
            1 => Just(Op::CancelLeased),
            1 => Just(Op::CancelWaiting),
            1 => (
                prop::option::of(1..5u64),
                prop::option::of(prop_oneof![Just(500u64), Just(3_000)])
            )
                .prop_map(|(n, ms)| Op::SetHistory(n, ms)),
            2 => prop_oneof![Just(1u64), Just(400), Just(1_500)].prop_map(Op::Clock),
            2 => Just(Op::Prune),
        ]
    }

    fn run(ops: &[Op]) -> Result<(), TestCaseError> {
        let f = Fixture::new();
        let q = f
            .builder()
            .lease(Duration::from_millis(LEASE_MS))
            .open(&f.path)
            .unwrap();
        let mut history = History::off();
        // Every job ended so far: id -> when its row may go (history_ms).
        let mut ended: BTreeMap<u64, u64> = BTreeMap::new();
        let mut waiting: Vec<leaseq::JobId> = Vec::new();
        // Jobs ended since the history was last set: none of them can have gone under an
        // older, stricter setting.
        let mut since_set: std::collections::BTreeSet<u64> = Default::default();
        for (step, op) in ops.iter().enumerate() {
            let at = format!("step {step} {op:?}");
            let now = f.clock.now_ms();
            match op {
                Op::Enqueue => waiting.push(q.enqueue(b"x", plain()).unwrap().id()),
                Op::Complete | Op::CancelLeased => {
                    let Some(l) = q.dequeue().unwrap() else {
                        continue;
                    };
                    waiting.retain(|&id| id != l.id());
                    if matches!(op, Op::Complete) {
                        l.ack().unwrap();
                        if !history.is_off() {
                            ended.insert(l.id().0, now);
                        }
                    } else {
                        q.cancel(l.id(), "stop").unwrap();
                        ended.insert(l.id().0, l.deadline_ms().max(now));
                    }
                    since_set.insert(l.id().0);
                }
                Op::CancelWaiting => {
                    if waiting.is_empty() {
                        continue;
                    }
                    let id = waiting.remove(0);
                    q.cancel(id, "stop").unwrap();
                    if !history.is_off() {
                        ended.insert(id.0, now);
                    }
                    since_set.insert(id.0);
                }
                Op::SetHistory(n, ms) => {
                    let mut h = History::off();
                    if let Some(n) = n {
                        h = h.keep_jobs(*n);
                    }
                    if let Some(ms) = ms {
                        h = h.keep_for(Duration::from_millis(*ms));
                    }
                    q.set_history(h).unwrap();
                    history = h;
                    since_set.clear();
                }
                Op::Clock(ms) => f.clock.advance(Duration::from_millis(*ms)),
                Op::Prune => {
                    q.prune().unwrap();
                    // Exactly what the history keeps is left: rows still fencing a lease,
                    // and of the others the newest `keep_jobs` not older than `keep_for`.
                    let now = f.clock.now_ms();
                    let mut kept: Vec<(u64, u64)> = Vec::new();
                    for state in [JobState::Completed, JobState::Cancelled] {
                        for j in q.jobs(state, None, 1000).unwrap().jobs {
                            let h = *ended.get(&j.id.0).ok_or_else(|| {
                                TestCaseError::fail(format!("{at}: unknown ended job {:?}", j.id))
                            })?;
                            kept.push((h, j.id.0));
                        }
                    }
                    let mut unfenced: Vec<(u64, u64)> = ended
                        .iter()
                        .map(|(&id, &h)| (h, id))
                        .filter(|&(h, _)| h <= now)
                        .collect();
                    unfenced.sort();
                    let young: Vec<(u64, u64)> = unfenced
                        .into_iter()
                        .filter(|&(h, _)| {
                            !history.is_off()
                                && history.age().is_none_or(|a| h + a.as_millis() as u64 > now)
                        })
                        .collect();
                    let mut want: Vec<(u64, u64)> = match history.jobs() {
                        Some(n) => young[young.len().saturating_sub(n as usize)..].to_vec(),
                        None => young,
                    };
                    want.extend(
                        ended
                            .iter()
                            .map(|(&id, &h)| (h, id))
                            .filter(|&(h, _)| h > now),
                    );
                    want.sort();
                    kept.sort();
                    // Nothing beyond the bounds is kept; what ended since the setting is
                    // exactly there (an older row may have gone under a stricter setting).
                    for k in &kept {
                        prop_assert!(
                            want.contains(k),
                            "{at}: kept {k:?} beyond the bounds: kept {kept:?}, want {want:?}"
                        );
                    }
                    for w in &want {
                        prop_assert!(
                            kept.contains(w) || !since_set.contains(&w.1),
                            "{at}: {w:?} went: kept {kept:?}, want {want:?}"
                        );
                    }
                    // What went is forgotten for good.
                    ended.retain(|id, h| kept.contains(&(*h, *id)));
                }
            }
            prop_assert!(
                q.check().unwrap().is_empty(),
                "{at}: {:?}",
                q.check().unwrap()
            );
            let s = q.stats().unwrap();
            prop_assert_eq!(s.total, waiting.len() as u64, "{}: live jobs", at);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// After a prune the history holds exactly what its bounds keep; nothing live is lost.
        #[test]
        fn the_history_keeps_exactly_what_its_bounds_say(ops in prop::collection::vec(op(), 1..80)) {
            run(&ops)?;
        }
    }
}

/// A result set on the lease is stored by whichever ack ends the delivery: `ack_with` (with
/// its effect), a batch ack, a worker pool's ack after its handler returned.
#[test]
fn a_result_is_stored_by_any_ack() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let ids = crate::common::enqueue_n(&q, 4, EnqueueOptions::default().idempotency_key("k"));
    let l = q.dequeue().unwrap().unwrap();
    l.set_result(b"uploaded").unwrap();
    assert_eq!(l.ack_with(|_| Ok(())).unwrap(), leaseq::Applied::Now);
    let batch = q.dequeue_batch(2).unwrap();
    batch[0].set_result(b"first").unwrap();
    let big = vec![0u8; leaseq::RESULT_BYTES_MAX + 1];
    assert!(matches!(
        batch[1].set_result(&big),
        Err(Error::InvalidOption { .. })
    ));
    assert!(q.ack_batch(&batch).unwrap().iter().all(Result::is_ok));
    let result = |id| q.job(id).unwrap().unwrap().result;
    assert_eq!(result(ids[0]).as_deref(), Some(&b"uploaded"[..]));
    assert_eq!(result(ids[1]).as_deref(), Some(&b"first"[..]));
    assert_eq!(result(ids[2]), None, "a refused result is not kept");
    // A pool: the handler sets it, the pool's ack stores it.
    let pool = WorkerPool::builder(&q)
        .threads(1)
        .start(|lease| lease.set_result(b"from the pool").map_err(Into::into))
        .unwrap();
    let until = std::time::Instant::now() + secs(30);
    while q.job(ids[3]).unwrap().unwrap().state != JobState::Completed {
        assert!(
            std::time::Instant::now() < until,
            "the pool did not run the job"
        );
        std::thread::sleep(ms(5));
    }
    pool.shutdown(secs(5));
    assert_eq!(result(ids[3]).as_deref(), Some(&b"from the pool"[..]));
    assert_consistent(&q);
}

/// A cancelled lease's row carries its idempotency key while it is kept (a retry would find
/// the marker), so the marker outlives its retention until then; one `prune` after the
/// fence ends deletes the row and then the marker.
#[test]
fn a_fenced_cancel_keeps_its_marker_until_prune_deletes_the_row() {
    let f = Fixture::new();
    let q = f
        .builder()
        .applied_retention(Some(secs(5)))
        .open(&f.path)
        .unwrap();
    let key = || EnqueueOptions::default().idempotency_key("k0");
    q.enqueue(b"b", key()).unwrap();
    q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
    f.clock.advance(secs(10));
    q.enqueue(b"c", key()).unwrap();
    let lc = q.dequeue().unwrap().unwrap();
    q.cancel(lc.id(), "stop").unwrap();
    // The marker is past its retention, but the fenced row carries its key.
    assert_eq!(q.prune().unwrap().applied, 0);
    assert!(q.is_applied("k0").unwrap());
    assert_eq!(q.stats().unwrap().cancelled, 1);
    drop(lc);
    f.clock.advance(crate::common::LEASE + secs(6));
    // One prune: the row whose fence ended, then the marker nothing carries any more.
    let p = q.prune().unwrap();
    assert_eq!((p.history, p.applied), (1, 1), "{p:?}");
    assert!(!q.is_applied("k0").unwrap());
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Controls inside the caller's own commit (issue 42: `Tx::cancel`, `retry`, `remove`) and
// the cancel's outcome.
// ---------------------------------------------------------------------------------------

/// Found by a new user: deleting a report (the app's own table) and cancelling its sync job
/// could not be one commit. `Tx::cancel` makes it one: both or neither.
#[test]
fn tx_cancel_commits_with_the_apps_own_writes_or_not_at_all() {
    use crate::common::{EFFECTS, effects};
    let f = Fixture::new();
    let q = f.open();
    let job = q.enqueue(b"sync report 7", plain()).unwrap().id();
    // The closure fails after the cancel: nothing of it commits.
    let r = q.write(|tx| {
        tx.open_table(EFFECTS)?.insert(7, 1)?;
        assert_eq!(
            tx.cancel(job, "report deleted")?,
            CancelOutcome::Cancelled {
                was: JobState::Ready
            }
        );
        Err::<(), _>("the app changed its mind".into())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    assert_eq!(q.job(job).unwrap().unwrap().state, JobState::Ready);
    assert!(effects(&q).is_empty());
    // Both commit.
    let out = q
        .write(|tx| {
            tx.open_table(EFFECTS)?.insert(7, 1)?;
            Ok(tx.cancel(job, "report deleted")?)
        })
        .unwrap();
    assert_eq!(out.was(), Some(JobState::Ready));
    assert_eq!(q.job(job).unwrap(), None, "no history: the row goes");
    assert_eq!(effects(&q).get(&7), Some(&1));
    assert!(q.dequeue().unwrap().is_none());
    // A refused call writes nothing and the transaction goes on.
    let never = leaseq::JobId(1 << 40);
    q.write(|tx| {
        assert!(matches!(
            tx.cancel(never, "x"),
            Err(Error::JobNotFound { .. })
        ));
        assert_eq!(tx.cancel(job, "again")?, CancelOutcome::Gone);
        tx.open_table(EFFECTS)?.insert(8, 1)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(effects(&q).get(&8), Some(&1));
    // The same passed on from the closure is the write's own answer.
    let r = q.write(|tx| Ok(tx.cancel(never, "x")?));
    assert!(matches!(r, Err(Error::JobNotFound { .. })), "{r:?}");
    assert_consistent(&q);
}

/// In an `ack_with`, the transaction cancels, retries and removes other jobs with the ack;
/// the jobs of its own batch are refused (their lease ends them), the transaction unharmed.
#[test]
fn ack_with_cancels_retries_and_removes_other_jobs_in_its_commit() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let parent = q.enqueue(b"parent", plain()).unwrap().id();
    let sibling = q.enqueue(b"sibling", plain()).unwrap().id();
    let extra = q.enqueue(b"extra", plain()).unwrap().id();
    let done = q.enqueue(b"done", plain()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), parent);
    // `done` is acked first so that it can be retried.
    let _ = q.dequeue().unwrap().unwrap(); // sibling, leased
    let le = q.dequeue().unwrap().unwrap();
    assert_eq!(le.id(), extra);
    let ld = q.dequeue().unwrap().unwrap();
    ld.ack().unwrap();
    le.nack("later").unwrap();
    let applied = l
        .ack_with(|tx| {
            assert!(matches!(
                tx.cancel(parent, "self"),
                Err(Error::InvalidState { .. })
            ));
            assert_eq!(
                tx.cancel(sibling, "not needed")?.was(),
                Some(JobState::Leased)
            );
            tx.retry(done)?;
            tx.remove(extra)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(applied, leaseq::Applied::Now);
    assert_eq!(q.job(parent).unwrap().unwrap().state, JobState::Completed);
    assert_eq!(q.job(sibling).unwrap().unwrap().state, JobState::Cancelled);
    assert_eq!(q.job(extra).unwrap(), None);
    let again = q.dequeue().unwrap().expect("the retried job");
    assert_eq!(again.id(), done);
    again.ack().unwrap();
    assert_consistent(&q);
    // A queue call (not the Tx's) inside the closure is `Reentrant`, and says what to use.
    let r = q.write(|_| Ok(q.cancel(sibling, "x")?));
    match r {
        Err(e @ Error::Reentrant) => assert!(e.to_string().contains("Tx"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// The outcomes tell "cancelled now", "ended earlier" (row kept, or gone) and "never existed".
#[test]
fn cancel_tells_ended_earlier_from_never_existed() {
    let f = Fixture::new();
    let q = f.open();
    let acked = q.enqueue(b"a", plain()).unwrap().id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.cancel(acked, "late").unwrap(), CancelOutcome::Gone);
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let kept = q.enqueue(b"k", plain()).unwrap().id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(
        q.cancel(kept, "late").unwrap(),
        CancelOutcome::AlreadyEnded {
            state: JobState::Completed
        }
    );
    assert_eq!(q.job(kept).unwrap().unwrap().state, JobState::Completed);
    // Never handed out: not found, also right after an id was given and its enqueue
    // aborted.
    let next = leaseq::JobId(kept.0 + 1);
    assert!(matches!(
        q.cancel(next, "x"),
        Err(Error::JobNotFound { .. })
    ));
    // A job of another queue is not found in this one, however live.
    let side = q.named("side").unwrap();
    let other = side.enqueue(b"s", plain()).unwrap().id();
    assert!(matches!(
        q.cancel(other, "x"),
        Err(Error::JobNotFound { .. })
    ));
    assert_eq!(
        side.cancel(other, "x").unwrap().was(),
        Some(JobState::Ready)
    );
    assert_consistent(&q);
}
