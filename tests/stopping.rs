//! Stopping consumers and keeping leases alive from other threads: `Queue::close`,
//! `StopSignal` with `dequeue_until`, `Lease::heartbeat`, `extend(&self)`, and what a lease
//! tells its handler (`max_attempts`, `idempotency_key`, `lease_ms`).

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Fixture, assert_consistent};
use leaseq::{EnqueueOptions, Error, JobState, StopSignal};

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
