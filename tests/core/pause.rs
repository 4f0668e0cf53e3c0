//! Pause and resume (issue 22 item 1): stored in the file, per queue; a paused queue delivers
//! nothing and everything else goes on; a resume wakes blocked consumers at once.

use crate::common::{Fixture, assert_consistent, ms, plain, secs};
use leaseq::redb::TableDefinition;
use leaseq::worker::WorkerPool;
use leaseq::{EnqueueOptions, RetryPolicy};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[test]
fn a_paused_queue_delivers_nothing_and_everything_else_goes_on() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"a", plain()).unwrap().id();
    let held = q.dequeue().unwrap().unwrap();
    assert_eq!(held.id(), a);
    assert!(!q.is_paused());
    assert!(q.pause().unwrap(), "it was running");
    assert!(!q.pause().unwrap(), "a second pause changes nothing");
    assert!(q.is_paused());
    assert!(q.stats().unwrap().paused);
    // Enqueues go on; deliveries do not.
    let b = q.enqueue(b"b", plain()).unwrap().id();
    q.enqueue_batch([(&b"c"[..], plain()), (&b"d"[..], plain())])
        .unwrap();
    assert!(q.dequeue().unwrap().is_none());
    assert!(q.dequeue_batch(10).unwrap().is_empty());
    assert!(q.dequeue_timeout(ms(20)).unwrap().is_none());
    // A lease already held goes on: ack_and_next acks and takes nothing.
    assert!(held.ack_and_next().unwrap().is_none());
    assert_eq!(q.job(a).unwrap(), None, "acked");
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.leased, s.paused), (3, 0, true));
    // Resumed: deliveries go on in their order.
    assert!(q.resume().unwrap());
    assert!(!q.resume().unwrap(), "a second resume changes nothing");
    assert!(!q.stats().unwrap().paused);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), b);
    assert_consistent(&q);
}

/// The rest of `pause`'s promises: `ack_with_and_next` applies its effect and takes nothing,
/// `dequeue_until` waits like `dequeue_timeout`, and pause and resume still commit after
/// `close` (they start no work).
#[test]
fn ack_with_and_next_takes_nothing_and_pause_works_after_close() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"a", plain().idempotency_key("ka")).unwrap();
    q.enqueue(b"b", plain()).unwrap();
    let held = q.dequeue().unwrap().unwrap();
    q.pause().unwrap();
    let (applied, next) = held.ack_with_and_next(|_| Ok(())).unwrap();
    assert_eq!(applied, leaseq::Applied::Now);
    assert!(
        next.is_none(),
        "a paused queue delivered through ack_with_and_next"
    );
    assert!(q.is_applied("ka").unwrap());
    let stop = leaseq::StopSignal::new();
    assert!(q.dequeue_until(ms(20), &stop).unwrap().is_none());
    q.close();
    assert!(q.resume().unwrap(), "resume commits after close");
    assert!(!q.is_paused());
    assert!(q.pause().unwrap(), "pause commits after close");
    drop(q);
    let q = f.open();
    assert!(q.is_paused(), "the pause made after close is in the file");
    assert_eq!(q.stats().unwrap().ready, 1);
}

#[test]
fn the_pause_is_stored_and_survives_a_reopen_per_queue() {
    let f = Fixture::new();
    {
        let q = f.open();
        let side = q.named("side").unwrap();
        q.enqueue(b"default", plain()).unwrap();
        side.enqueue(b"side", plain()).unwrap();
        side.pause().unwrap();
        // Only "side" is paused: the default queue delivers.
        assert!(!q.is_paused());
        assert_eq!(q.dequeue().unwrap().unwrap().payload(), b"default");
        assert!(side.dequeue().unwrap().is_none());
    }
    let q = f.open();
    let side = q.existing("side").unwrap();
    assert!(side.is_paused(), "the pause is in the file");
    assert!(!q.is_paused());
    assert!(side.stats().unwrap().paused);
    assert!(side.dequeue().unwrap().is_none());
    side.resume().unwrap();
    drop((q, side));
    let q = f.open();
    let side = q.existing("side").unwrap();
    assert!(!side.is_paused(), "the resume is in the file too");
    assert_eq!(side.dequeue().unwrap().unwrap().payload(), b"side");
    assert_consistent(&q);
}

#[test]
fn a_resume_wakes_a_blocked_consumer_at_once() {
    let f = Fixture::new();
    let q = f.open();
    q.pause().unwrap();
    q.enqueue(b"waiting", plain()).unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        let consumer = s.spawn(|| q.dequeue_timeout(Duration::from_secs(120)).unwrap());
        // The consumer finds the queue paused and waits (for the resume, not for a poll).
        std::thread::sleep(ms(100));
        assert!(!consumer.is_finished(), "a paused queue delivered");
        q.resume().unwrap();
        let got = consumer.join().unwrap().expect("woken by the resume");
        assert_eq!(got.payload(), b"waiting");
    });
    // Woken by the resume, not by its 120 s timeout (a missed wake-up would still find the
    // job once the timeout ends, so the time is what tells).
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// A lease held across the pause can still run out; the first dequeue after the resume
/// takes it back, as usual (its attempt counted).
#[test]
fn a_lease_that_runs_out_while_paused_comes_back_after_the_resume() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"x", plain()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    q.pause().unwrap();
    f.clock.advance(crate::common::LEASE + secs(1));
    assert!(q.dequeue().unwrap().is_none());
    q.resume().unwrap();
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!((again.id(), again.attempt()), (id, 2));
    assert!(matches!(l.ack(), Err(leaseq::Error::LeaseLost { .. })));
    assert_consistent(&q);
}

#[test]
fn a_worker_pool_idles_while_paused_and_runs_after_the_resume() {
    let f = Fixture::new();
    let q = f.open();
    q.pause().unwrap();
    for i in 0..20u32 {
        q.enqueue(&i.to_le_bytes(), plain()).unwrap();
    }
    let ran = Arc::new(AtomicU64::new(0));
    let pool = {
        let ran = ran.clone();
        WorkerPool::builder(&q)
            .threads(2)
            .idle_timeout(ms(50))
            .start(move |_| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap()
    };
    // Both workers asked for work twice or more (each ask blocks up to 50 ms), and got none.
    let until = Instant::now() + Duration::from_secs(60);
    while pool.stats().polls < 4 {
        assert!(Instant::now() < until, "the pool never polled");
        std::thread::sleep(ms(5));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a paused queue ran jobs");
    q.resume().unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while ran.load(Ordering::SeqCst) < 20 {
        assert!(Instant::now() < until, "the pool did not run the jobs");
        std::thread::sleep(ms(5));
    }
    let report = pool.shutdown(Duration::from_secs(5));
    assert_eq!(report.stats.acked, 20, "{report:?}");
    assert!(q.is_empty().unwrap());
}

/// The offline-first recipe of the guide (operations chapter): a sync loop that pauses its
/// queue when the server is unreachable, gives the job back without charging it, and resumes
/// when the network returns. Offline far longer than the whole retry budget (5 attempts, the
/// default exponential backoff from 1 s), no note is lost to the dead letters.
#[test]
fn an_offline_sync_loop_that_pauses_loses_no_job_to_the_dead_letters() {
    let f = Fixture::new();
    let q = f
        .builder()
        .retry(RetryPolicy::exponential(
            Duration::from_secs(1),
            Duration::from_secs(3600),
        ))
        .max_attempts(5)
        .open(&f.path)
        .unwrap();
    let online = std::sync::atomic::AtomicBool::new(false);
    let sent = std::sync::Mutex::new(Vec::new());
    let refused = AtomicU64::new(0);
    let send = |payload: &[u8]| -> Result<(), &'static str> {
        if online.load(Ordering::SeqCst) {
            sent.lock().unwrap().push(payload.to_vec());
            Ok(())
        } else {
            refused.fetch_add(1, Ordering::SeqCst);
            Err("connection refused")
        }
    };
    // One step of the documented loop: take a note, send it, ack; offline, give the note back
    // without charging its attempt and pause the queue until the network returns.
    let step = || -> leaseq::Result<bool> {
        let Some(lease) = q.dequeue()? else {
            return Ok(false);
        };
        match send(lease.payload()) {
            Ok(()) => lease.ack()?,
            Err(_offline) => {
                lease.snooze(Duration::ZERO)?;
                q.pause()?;
            }
        }
        Ok(true)
    };
    for i in 0..50u32 {
        q.enqueue(format!("note {i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    // Two hours offline, the loop running all along (more edits saved meanwhile).
    for minute in 0..120u32 {
        for _ in 0..10 {
            step().unwrap();
        }
        q.enqueue(format!("edit {minute}").as_bytes(), plain())
            .unwrap();
        f.clock.advance(secs(60));
    }
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.pending()), (0, 170), "{s:?}");
    assert!(s.paused);
    // One request hit the offline server: the first; then the queue was paused.
    assert_eq!(refused.load(Ordering::SeqCst), 1);
    // Back online: the network watcher resumes the queue; every note goes out.
    online.store(true, Ordering::SeqCst);
    q.resume().unwrap();
    while step().unwrap() {}
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.total), (0, 0), "{s:?}");
    let mut sent = sent.into_inner().unwrap();
    // Every note and edit once (the note given back went behind the ones waiting: a snooze).
    sent.sort();
    let mut expected: Vec<Vec<u8>> = (0..50)
        .map(|i| format!("note {i}"))
        .chain((0..120).map(|m| format!("edit {m}")))
        .map(String::into_bytes)
        .collect();
    expected.sort();
    assert_eq!(sent, expected);
    assert_consistent(&q);
}

/// A row of `leaseq_paused` naming no queue (an unregistered number, one above `QUEUES_MAX`)
/// is reported by `check()`, pauses nothing, and does not stop the file from opening.
#[test]
fn check_reports_a_pause_of_a_queue_that_does_not_exist_and_the_open_goes_on() {
    const PAUSED: TableDefinition<u32, u64> = TableDefinition::new("leaseq_paused");
    let f = Fixture::new();
    {
        let q = f.open();
        q.enqueue(b"x", plain()).unwrap();
        q.pause().unwrap();
        assert_consistent(&q);
        let tx = q.database().begin_write().unwrap();
        {
            let mut t = tx.open_table(PAUSED).unwrap();
            t.insert(77, 1).unwrap();
            t.insert(u32::MAX, 1).unwrap();
            t.remove(0).unwrap();
        }
        tx.commit().unwrap();
    }
    let q = f.open();
    assert!(!q.is_paused());
    assert_eq!(q.dequeue().unwrap().unwrap().payload(), b"x");
    let v = q.check().unwrap();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v[0].detail.contains("queue number 77"), "{v:?}");
    assert!(v[1].detail.contains(&u32::MAX.to_string()), "{v:?}");
}

/// Pauses and resumes racing from two threads (a worker pausing, a network watcher
/// resuming): afterwards the queue's state in memory is the file's.
#[test]
fn racing_pauses_and_resumes_leave_memory_and_file_agreeing() {
    let f = Fixture::new();
    let q = f.open();
    // Many short rounds: each ends on a race between the last pause and the last resume.
    for round in 0..300 {
        std::thread::scope(|s| {
            for pause in [true, false, true, false] {
                let q = &q;
                s.spawn(move || {
                    for _ in 0..2 {
                        if pause {
                            q.pause().unwrap();
                        } else {
                            q.resume().unwrap();
                        }
                    }
                });
            }
        });
        assert_eq!(q.is_paused(), q.stats().unwrap().paused, "round {round}");
    }
    drop(q);
    let q = f.open();
    assert_eq!(q.is_paused(), q.stats().unwrap().paused);
}

/// Issue 42 item 9: a delayed job that comes due while the queue is paused reads as ready
/// (stats, its state, a reader's counts) once a consumer looks, though nothing is delivered:
/// a paused queue's dequeue moves due scheduled jobs to ready and takes none. A job not due
/// yet (1 ms before) stays scheduled; the resume delivers the due one first.
#[test]
fn a_delayed_job_that_comes_due_while_paused_reads_as_ready() {
    let f = Fixture::new();
    let q = f.open();
    let delayed = |s: u64| plain().delay(secs(s));
    let a = q.enqueue(b"a", delayed(10)).unwrap().id();
    let b = q.enqueue(b"b", delayed(20)).unwrap().id();
    q.pause().unwrap();
    let state = |id| q.job(id).unwrap().unwrap().state;
    f.clock.advance(secs(10) - ms(1));
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(
        state(a),
        leaseq::JobState::Scheduled,
        "1 ms before its due time"
    );
    f.clock.advance(ms(1));
    assert!(q.dequeue().unwrap().is_none(), "a paused queue delivered");
    assert!(q.dequeue_batch(10).unwrap().is_empty());
    assert_eq!(state(a), leaseq::JobState::Ready, "due, read as not due");
    assert_eq!(state(b), leaseq::JobState::Scheduled);
    let s = q.stats().unwrap();
    assert_eq!((s.scheduled, s.ready, s.leased, s.paused), (1, 1, 0, true));
    assert_eq!(q.reader().stats().unwrap(), s);
    let info = q.job(a).unwrap().unwrap();
    assert_eq!(
        (info.attempts, info.run_at_ms),
        (0, crate::common::T0_MS + 10_000)
    );
    assert_consistent(&q);
    // Past b's due time too: the resume delivers in due order, nothing charged meanwhile.
    f.clock.advance(secs(10));
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().ready, 2);
    crate::common::assert_nothing_charged(&q);
    q.resume().unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().id(), a);
    assert_eq!(q.dequeue().unwrap().unwrap().id(), b);
    assert_consistent(&q);
}

/// A consumer blocked on a paused queue wakes at the next due time, moves the due job to
/// ready and goes on waiting (it takes nothing until the resume).
#[test]
fn a_blocked_consumer_of_a_paused_queue_moves_due_jobs_without_taking_them() {
    let f = Fixture::new();
    let q = f.open();
    q.pause().unwrap();
    let a = q.enqueue(b"a", plain().delay(secs(60))).unwrap().id();
    let started = Instant::now();
    std::thread::scope(|s| {
        let consumer = s.spawn(|| q.dequeue_timeout(Duration::from_secs(120)).unwrap());
        std::thread::sleep(ms(50));
        f.clock.advance(secs(61));
        assert!(
            crate::common::eventually(|| q.stats().unwrap().ready == 1),
            "the due job still reads as scheduled: {:?}",
            q.stats().unwrap()
        );
        assert!(!consumer.is_finished(), "a paused queue delivered");
        assert_eq!(q.stats().unwrap().leased, 0);
        q.resume().unwrap();
        let got = consumer.join().unwrap().expect("woken by the resume");
        assert_eq!(got.id(), a);
    });
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_consistent(&q);
}

/// What leaseq offers for persist-queue's `auto_resume=False` (the guide's "Left out on
/// purpose"): the open returns the orphaned leases, and a pause stored before the crash keeps
/// them, ready, from running until the app resumes the queue.
#[test]
fn a_pause_stored_before_a_crash_holds_the_returned_jobs_until_the_resume() {
    let f = Fixture::new();
    let held = {
        let q = f.open();
        let id = q.enqueue(b"unacked", plain()).unwrap().id();
        q.enqueue(b"waiting", plain()).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), id);
        q.pause().unwrap();
        // Never acked: the handle and its lease go as a crash would leave them.
        drop(l);
        id
    };
    let q = f.open();
    assert_eq!(q.recovery().leases_returned, 1);
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.leased), (2, 0), "returned, and waiting");
    assert!(q.is_paused());
    assert!(q.dequeue().unwrap().is_none(), "held by the pause");
    q.resume().unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt()), (held, 2));
    l.ack().unwrap();
    assert_consistent(&q);
}
