//! Stopping consumers and keeping leases alive from other threads: `Queue::close`,
//! `StopSignal` with `dequeue_until`, `Lease::heartbeat`, `extend(&self)`, and what a lease
//! tells its handler (`max_attempts`, `idempotency_key`, `lease_ms`).
//!
//! Adversarial tests of issue 11 (`Queue::close`, `StopSignal` with `dequeue_until`, heartbeats
//! and `extend(&self)`): each checks the state that should result (stats, `Queue::job`,
//! `check()`), not only that nothing panics.
//!
//! And what a new user of the borrowing API trips over: ended leases let go of the file, open
//! ones keep it (issue 8's adversarial review).

use crate::common;
use crate::common::{Fixture, LEASE, T0_MS, all_ok, assert_consistent, enqueue_n, plain};
use leaseq::{Applied, EnqueueOptions, Error, ImportJob, JobState, StopSignal};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(600);

#[test]
fn close_wakes_a_blocked_consumer_with_closed() {
    let f = Fixture::new();
    let q = f.open();
    let (tx, rx) = mpsc::channel();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || tx.send(q.dequeue_timeout(LONG)).unwrap())
    };
    // The consumer is blocked (nothing to take); it must not answer before the close.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    let t = Instant::now();
    q.close();
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("woken by close");
    assert!(matches!(got, Err(Error::Closed)), "{got:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    consumer.join().unwrap();
}

#[test]
fn close_refuses_new_work_on_every_handle_and_writes_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let side = q.named("side").unwrap();
    q.enqueue(b"a", EnqueueOptions::default()).unwrap();
    side.close();
    assert!(q.is_closed() && side.is_closed());
    let before = q.stats().unwrap();
    assert!(matches!(
        q.enqueue(b"b", Default::default()),
        Err(Error::Closed)
    ));
    assert!(matches!(
        q.enqueue_value(&7u32, Default::default()),
        Err(Error::Closed)
    ));
    assert!(matches!(
        q.enqueue_batch([(&b"c"[..], EnqueueOptions::default())]),
        Err(Error::Closed)
    ));
    assert!(matches!(q.write(|_| Ok(())), Err(Error::Closed)));
    assert!(matches!(q.dequeue(), Err(Error::Closed)));
    assert!(matches!(q.dequeue_batch(4), Err(Error::Closed)));
    assert!(matches!(
        q.dequeue_timeout(Duration::from_millis(10)),
        Err(Error::Closed)
    ));
    assert!(matches!(
        side.dequeue_until(LONG, &StopSignal::new()),
        Err(Error::Closed)
    ));
    assert!(matches!(q.named("other"), Err(Error::Closed)));
    // Reads still answer, and nothing was written by the refused calls.
    assert_eq!(q.stats().unwrap(), before);
    assert_eq!(q.queue_names().unwrap(), vec!["side".to_string()]);
    assert_consistent(&q);
}

#[test]
fn leases_held_at_close_still_end_cleanly() {
    let f = Fixture::new();
    let q = f.open();
    for p in [b"a", b"b", b"c", b"d", b"e"] {
        q.enqueue(p, EnqueueOptions::default()).unwrap();
    }
    let leases = q.dequeue_batch(5).unwrap();
    assert_eq!(leases.len(), 5);
    q.close();
    let mut it = leases.into_iter();
    // ack_and_next acks and takes nothing, although jobs would be ready.
    let a = it.next().unwrap();
    assert!(a.ack_and_next().unwrap().is_none());
    let b = it.next().unwrap();
    b.extend(Duration::from_secs(5)).unwrap();
    b.heartbeat().extend(Duration::from_secs(5)).unwrap();
    assert_eq!(b.nack("shutting down").unwrap(), JobState::Ready);
    let c = it.next().unwrap();
    let (applied, next) = c
        .ack_with_and_next(|tx| {
            tx.enqueue(b"follow-up", EnqueueOptions::default())?;
            Ok(())
        })
        .unwrap();
    assert_eq!(applied, leaseq::Applied::Now);
    assert!(next.is_none());
    it.next().unwrap().fail("bad").unwrap();
    it.next().unwrap().ack().unwrap();
    let s = q.stats().unwrap();
    // b back to ready, the follow-up ready, d dead; a, c, e gone.
    assert_eq!((s.ready, s.leased, s.dead, s.total), (2, 0, 1, 3));
    assert_consistent(&q);
}

#[test]
fn stop_signal_wakes_its_consumers_and_no_others() {
    let f = Fixture::new();
    let q = f.open();
    let stop = StopSignal::new();
    let (tx, rx) = mpsc::channel();
    let stopped = {
        let (q, stop, tx) = (q.clone(), stop.clone(), tx.clone());
        std::thread::spawn(move || {
            tx.send(("stopped", q.dequeue_until(LONG, &stop).map(|l| l.is_some())))
                .unwrap()
        })
    };
    let other_stop = StopSignal::new();
    let other = {
        let (q, other_stop) = (q.clone(), other_stop.clone());
        std::thread::spawn(move || {
            tx.send((
                "other",
                q.dequeue_until(LONG, &other_stop).map(|l| l.is_some()),
            ))
            .unwrap()
        })
    };
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    stop.stop();
    let (who, got) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(who, "stopped");
    assert!(matches!(got, Ok(false)), "{got:?}");
    // The other consumer is still waiting, and takes the next job.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    assert!(!q.is_closed());
    q.enqueue(b"job", EnqueueOptions::default()).unwrap();
    let (who, got) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(who, "other");
    assert!(matches!(got, Ok(true)), "{got:?}");
    stopped.join().unwrap();
    other.join().unwrap();
    // A job taken by the other consumer and dropped stays leased (its lease was not ended).
    assert_eq!(q.stats().unwrap().leased, 1);
}

#[test]
fn a_stopped_signal_dequeues_nothing() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"job", EnqueueOptions::default()).unwrap();
    let stop = StopSignal::new();
    stop.stop();
    assert!(stop.is_stopped());
    assert!(q.dequeue_until(LONG, &stop).unwrap().is_none());
    assert_eq!(q.stats().unwrap().ready, 1);
    // The same signal, stopped, on a named queue of the file too.
    let side = q.named("side").unwrap();
    side.enqueue(b"x", EnqueueOptions::default()).unwrap();
    assert!(side.dequeue_until(LONG, &stop).unwrap().is_none());
    assert_eq!(side.stats().unwrap().ready, 1);
}

#[test]
fn a_stop_signal_used_on_many_queues_wakes_each() {
    let f = Fixture::new();
    let q = f.open();
    let stop = StopSignal::new();
    let names = ["a", "b", "c"];
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = names
        .iter()
        .map(|n| {
            let (q, stop, tx) = (q.named(n).unwrap(), stop.clone(), tx.clone());
            std::thread::spawn(move || {
                tx.send(q.dequeue_until(LONG, &stop).unwrap().is_none())
                    .unwrap()
            })
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    stop.stop();
    for _ in names {
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    threads.into_iter().for_each(|t| t.join().unwrap());
}

/// C39: a heartbeat that lands after the job's ack is refused and writes nothing.
#[test]
fn heartbeat_after_ack_is_refused_and_brings_nothing_back() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    let beat = lease.heartbeat();
    f.clock.advance(Duration::from_secs(10));
    let deadline = beat.extend(Duration::from_secs(60)).unwrap();
    assert_eq!(deadline, common::T0_MS + 70_000);
    assert_eq!(
        q.job(id).unwrap().unwrap().lease_deadline_ms,
        Some(deadline)
    );
    lease.ack().unwrap();
    let before = q.stats().unwrap();
    for _ in 0..3 {
        assert!(matches!(
            beat.extend(Duration::from_secs(60)),
            Err(Error::LeaseLost { .. })
        ));
    }
    assert!(q.job(id).unwrap().is_none());
    assert_eq!(q.stats().unwrap(), before);
    assert_eq!(before.leased, 0);
    assert_consistent(&q);
}

#[test]
fn heartbeat_of_a_redelivered_job_is_fenced() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
    let first = q.dequeue().unwrap().unwrap();
    let beat = first.heartbeat();
    f.clock.advance(common::LEASE + Duration::from_secs(1));
    let second = q
        .dequeue()
        .unwrap()
        .expect("redelivered after the lease ended");
    let deadline = second.deadline_ms();
    assert!(matches!(
        beat.extend(Duration::from_secs(600)),
        Err(Error::LeaseLost { .. })
    ));
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.lease_deadline_ms, Some(deadline));
    assert_eq!(info.lease_token, Some(second.token()));
    second.ack().unwrap();
}

#[test]
fn heartbeats_race_the_ack_and_never_leave_lease_state() {
    let f = Fixture::new();
    let q = f.open();
    for round in 0..200u32 {
        let id = q
            .enqueue(&round.to_le_bytes(), EnqueueOptions::default())
            .unwrap()
            .id();
        let lease = q.dequeue().unwrap().unwrap();
        let beat = lease.heartbeat();
        let beater = std::thread::spawn(move || {
            let mut refused = 0;
            for _ in 0..5 {
                match beat.extend(Duration::from_secs(60)) {
                    Ok(_) => {}
                    Err(Error::LeaseLost { .. }) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            refused
        });
        lease.ack().unwrap();
        let refused = beater.join().unwrap();
        assert!(refused <= 5);
        assert!(
            q.job(id).unwrap().is_none(),
            "round {round}: the job came back"
        );
    }
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.leased), (0, 0));
    assert_consistent(&q);
}

#[test]
fn extend_from_another_thread_through_a_shared_lease() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"job", EnqueueOptions::default()).unwrap();
    let lease = q.dequeue().unwrap().unwrap();
    let first = lease.deadline_ms();
    f.clock.advance(Duration::from_secs(20));
    std::thread::scope(|s| {
        s.spawn(|| lease.extend(Duration::from_secs(30)).unwrap());
    });
    assert_eq!(lease.deadline_ms(), first + 20_000);
    lease.ack().unwrap();
}

#[test]
fn a_lease_tells_its_handler_the_last_attempt_and_its_key() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(
        b"keyed",
        EnqueueOptions::default()
            .idempotency_key("order-7")
            .max_attempts(2)
            .lease(Duration::from_secs(5)),
    )
    .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.attempt(), l.max_attempts()), (1, 2));
    assert_eq!(l.idempotency_key(), Some(&b"order-7"[..]));
    assert_eq!(l.lease_ms(), 5_000);
    l.nack("again").unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.attempt(), l.max_attempts()), (2, 2));
    l.ack().unwrap();

    q.enqueue(b"plain", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.idempotency_key(), None);
    assert_eq!(l.lease_ms(), common::LEASE.as_millis() as u64);
    assert_eq!(l.max_attempts(), 5, "the builder's default");
    l.ack().unwrap();
}

// ---------------------------------------------------------------------------------------
// Heartbeats and extend(&self).
// ---------------------------------------------------------------------------------------

/// A heartbeat thread that keeps beating after its lease was snoozed, nacked or expired must
/// never move the deadline of the job's next delivery.
#[test]
fn a_stale_heartbeat_never_moves_the_next_delivery() {
    let f = Fixture::new();
    let q = f.open_non_durable();
    for round in 0..60u32 {
        let id = q.enqueue(&round.to_le_bytes(), plain()).unwrap().id();
        let first = q.dequeue().unwrap().unwrap();
        let beat = first.heartbeat();
        let beater = std::thread::spawn(move || {
            for n in 0..10_000 {
                match beat.extend(Duration::from_secs(3600)) {
                    Ok(_) => {}
                    Err(Error::LeaseLost { .. }) => return n,
                    Err(e) => panic!("{e}"),
                }
            }
            panic!("the heartbeat was never refused");
        });
        match round % 3 {
            0 => first.snooze(Duration::ZERO).unwrap(),
            1 => assert_eq!(first.nack("again").unwrap(), JobState::Ready),
            _ => {
                // Lost to expiry: the old deadline passes and a dequeue reclaims it (the
                // beater may have pushed it out: move past whatever it is now).
                while q.job(id).unwrap().unwrap().state == JobState::Leased {
                    let dl = q.job(id).unwrap().unwrap().lease_deadline_ms.unwrap();
                    f.clock.set_ms(dl + 1);
                    if let Some(l) = q.dequeue().unwrap() {
                        assert_eq!(l.id(), id);
                        l.nack_after("give back", Duration::ZERO).unwrap();
                    }
                }
                drop(first);
            }
        }
        let second = q.dequeue().unwrap().expect("given back");
        assert_eq!(second.id(), id);
        beater.join().unwrap();
        let j = q.job(id).unwrap().unwrap();
        assert_eq!(j.lease_token, Some(second.token()), "round {round}");
        assert_eq!(
            j.lease_deadline_ms,
            Some(second.deadline_ms()),
            "round {round}: a stale heartbeat moved the new lease"
        );
        second.ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// `extend(&self)` from several threads at once: afterwards the lease's own `deadline_ms()`
/// must be the deadline the file holds (a worker that trusts it must not believe it has more
/// time than the store gives it).
#[test]
fn concurrent_extends_leave_deadline_ms_equal_to_the_stored_deadline() {
    let f = Fixture::new();
    let q = f.open_non_durable();
    const ROUNDS: u32 = 1000;
    let mut mismatches = Vec::new();
    for round in 0..ROUNDS {
        let id = q.enqueue(&round.to_le_bytes(), plain()).unwrap().id();
        let lease = q.dequeue().unwrap().unwrap();
        let barrier = Barrier::new(3);
        std::thread::scope(|s| {
            for by in [10u64, 20, 40] {
                let (lease, barrier) = (&lease, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    lease.extend(Duration::from_secs(by)).unwrap();
                });
            }
        });
        let stored = q.job(id).unwrap().unwrap().lease_deadline_ms.unwrap();
        if lease.deadline_ms() != stored {
            mismatches.push((round, lease.deadline_ms() - T0_MS, stored - T0_MS));
        }
        lease.ack().unwrap();
    }
    assert!(
        mismatches.is_empty(),
        "{} of {ROUNDS} rounds: (round, deadline_ms() - T0, stored - T0): {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    assert_consistent(&q);
}

/// As documented: a heartbeat holds the queue, so the file stays open (a reopen is
/// `AlreadyOpen`) until the heartbeat is dropped, even after its lease ended.
#[test]
fn a_heartbeat_keeps_the_file_open_until_dropped() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", plain()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    let beat = lease.heartbeat();
    lease.ack().unwrap();
    // A heartbeat made after the end holds nothing.
    let late = lease.heartbeat();
    drop((q, lease));
    assert!(matches!(late.extend(LEASE), Err(Error::LeaseLost { .. })));
    assert!(matches!(beat.extend(LEASE), Err(Error::LeaseLost { .. })));
    assert!(matches!(
        f.builder().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    drop(beat);
    let q = f.open();
    assert!(q.job(id).unwrap().is_none());
    assert_eq!(q.recovery().leases_returned, 0);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Close and stop signals.
// ---------------------------------------------------------------------------------------

#[test]
fn close_wakes_every_named_queue_and_in_flight_work_still_ends() {
    let f = Fixture::new();
    let q = f.open();
    let (a, b) = (q.named("a").unwrap(), q.named("b").unwrap());
    let held_id = a.enqueue(b"held", plain().max_attempts(2)).unwrap().id();
    let other_id = a.enqueue(b"other", plain()).unwrap().id();
    let held = a.dequeue().unwrap().unwrap();
    let other = a.dequeue().unwrap().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|h| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let r = h
                    .dequeue_until(LONG, &StopSignal::new())
                    .map(|l| l.is_some());
                tx.send(r).unwrap();
            })
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    q.close();
    for _ in 0..2 {
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("woken");
        assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    }
    waiters.into_iter().for_each(|t| t.join().unwrap());
    assert!(matches!(
        a.import_batch(&[ImportJob::new(b"x".to_vec())]),
        Err(Error::Closed)
    ));
    // In-flight work: a heartbeat, a snooze, an ack_with whose follow-up is typed.
    let beat = held.heartbeat();
    f.clock.advance(Duration::from_secs(5));
    assert_eq!(
        beat.extend(Duration::from_secs(100)).unwrap(),
        T0_MS + 105_000
    );
    held.snooze(Duration::from_secs(30)).unwrap();
    let j = a.job(held_id).unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.snoozes),
        (JobState::Scheduled, 0, 1)
    );
    assert!(matches!(beat.extend(LEASE), Err(Error::LeaseLost { .. })));
    let (applied, next) = other
        .ack_with_and_next(|tx| {
            tx.enqueue_value(&("follow".to_string(), 1u32), plain())?;
            Ok(())
        })
        .unwrap();
    assert_eq!(applied, Applied::Now);
    assert!(next.is_none());
    assert!(a.job(other_id).unwrap().is_none());
    let s = a.stats().unwrap();
    assert_eq!((s.scheduled, s.ready, s.leased), (1, 1, 0), "{s:?}");
    // Still closed: nothing new leaves.
    assert!(matches!(a.dequeue(), Err(Error::Closed)));
    assert_consistent(&q);
}

/// Many waiters on one stop signal: the jobs enqueued go to exactly as many of them, the
/// others return `Ok(None)` at the stop, and no job is left leased without a holder.
#[test]
fn many_waiters_one_stop_exactly_the_enqueued_jobs_are_leased() {
    let f = Fixture::new();
    let q = f.open();
    let stop = StopSignal::new();
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (q, stop, tx) = (q.clone(), stop.clone(), tx.clone());
            std::thread::spawn(move || tx.send(q.dequeue_until(LONG, &stop).unwrap()).unwrap())
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    q.enqueue_batch([
        (&b"1"[..], plain()),
        (&b"2"[..], plain()),
        (&b"3"[..], plain()),
    ])
    .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap()
                .expect("a job"),
        );
    }
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    stop.stop();
    for _ in 0..5 {
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_none());
    }
    threads.into_iter().for_each(|t| t.join().unwrap());
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.leased), (0, 3));
    let mut payloads: Vec<Vec<u8>> = got.iter().map(|l| l.payload().to_vec()).collect();
    payloads.sort();
    assert_eq!(payloads, vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    for l in got {
        l.ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// A stop racing a commit that makes work: the waiter either takes the job (and its lease is
/// the current one) or returns `None` with the job still ready; never both, never a lost job.
#[test]
fn a_stop_racing_an_enqueue_never_loses_the_job() {
    let f = Fixture::new();
    let q = f.open_non_durable();
    let (mut taken, mut left) = (0, 0);
    for round in 0..60u32 {
        let stop = StopSignal::new();
        let waiter = {
            let (q, stop) = (q.clone(), stop.clone());
            std::thread::spawn(move || q.dequeue_until(LONG, &stop))
        };
        let barrier = Arc::new(Barrier::new(2));
        let enq = {
            let (q, barrier) = (q.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                q.enqueue(&round.to_le_bytes(), EnqueueOptions::default())
                    .unwrap()
                    .id()
            })
        };
        barrier.wait();
        stop.stop();
        let id = enq.join().unwrap();
        let t = Instant::now();
        let got = waiter.join().unwrap().unwrap();
        assert!(t.elapsed() < Duration::from_secs(10));
        let j = q.job(id).unwrap().unwrap();
        match got {
            Some(l) => {
                taken += 1;
                assert_eq!(l.id(), id);
                assert_eq!(j.lease_token, Some(l.token()), "round {round}");
                l.ack().unwrap();
            }
            None => {
                left += 1;
                assert_eq!(j.state, JobState::Ready, "round {round}");
                q.dequeue().unwrap().unwrap().ack().unwrap();
            }
        }
    }
    assert_eq!(taken + left, 60);
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

#[test]
fn one_stop_signal_wakes_waiters_in_two_files() {
    let (f1, f2) = (Fixture::new(), Fixture::new());
    let (q1, q2) = (f1.open(), f2.open());
    let q2n = q2.named("n").unwrap();
    let stop = StopSignal::new();
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = [q1.clone(), q2.clone(), q2n.clone(), q1.clone()]
        .into_iter()
        .map(|q| {
            let (stop, tx) = (stop.clone(), tx.clone());
            std::thread::spawn(move || tx.send(q.dequeue_until(LONG, &stop).unwrap().is_none()))
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    // Work in one file wakes none of the waiters of the other for nothing to take.
    q2.enqueue(b"in file 2", plain()).unwrap();
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(!first, "a waiter of file 2's default queue took the job");
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    let t = Instant::now();
    stop.stop();
    for _ in 0..3 {
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    threads.into_iter().for_each(|t| t.join().unwrap().unwrap());
    // The job taken by the file-2 waiter was dropped unacked: leased there, nothing in file 1.
    assert_eq!(q2.stats().unwrap().leased, 1);
    assert_eq!(q1.stats().unwrap().total, 0);
    assert!(!q1.is_closed() && !q2.is_closed());
    assert_consistent(&q1);
    assert_consistent(&q2);
}

// ---------------------------------------------------------------------------------------
// What a new user trips over
// ---------------------------------------------------------------------------------------

/// Lease calls borrow: after `ack_batch(&leases)` the leases are still alive. An ended lease
/// (acked, given back, failed, or found lost) lets go of its queue, so a program that acks,
/// drops its queue handle and reopens the file gets it; a lease still open keeps the file
/// open, by design (its holder may still end the attempt).
#[test]
fn ended_leases_let_go_of_the_file_open_ones_keep_it() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 4, EnqueueOptions::default());
    let leases = q.dequeue_batch(3).unwrap();
    all_ok(q.ack_batch(&leases).unwrap());
    let open = q.dequeue().unwrap().unwrap();
    drop(q);
    assert!(matches!(
        f.builder().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    assert!(matches!(leases[0].ack(), Err(Error::LeaseLost { .. })));
    open.ack().unwrap();
    let q = f.open();
    assert!(q.is_empty().unwrap());
    drop(leases);
}
