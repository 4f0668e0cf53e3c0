//! A clock step while a consumer is blocked (case C36): a blocked `dequeue_timeout` sees a
//! clock jump, whichever queue, clone or deadline it waits on.
//!
//! Adversarial tests (issue 8): clock wakers. Written by an adversarial review; every bug it
//! found is fixed and its test kept as a regression test.

use crate::common::{Fixture, LEASE, T0_MS, ms};
use leaseq::{Clock, EnqueueOptions, Error, JobId, Lease, ManualClock, Queue};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// C36: a clock step while a consumer is blocked
// ---------------------------------------------------------------------------------------

/// C36: `enq(A, delay=60s)`; a thread blocks in `dequeue_timeout(20s)`; 50 ms later the
/// manual clock jumps 61 s. The thread returns A at once, not after 20 s.
#[test]
fn c36_manual_clock_jump_wakes_a_blocked_consumer() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().delay(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let got = q.dequeue_timeout(Duration::from_secs(20)).unwrap();
            (got.map(|l| l.id()), started.elapsed())
        })
    };
    std::thread::sleep(ms(50));
    f.clock.advance(Duration::from_secs(61));
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, Some(a));
    assert!(
        waited < Duration::from_secs(10),
        "waited {waited:?} of 20 s"
    );
}

/// A wall clock stepped forward (NTP on a box that booted without a real-time clock) cannot
/// tell anyone: a blocked consumer re-reads the time at least every `DUE_RECHECK_MAX`.
#[derive(Debug, Clone)]
struct SteppedClock(Arc<AtomicU64>);

impl Clock for SteppedClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn c36_a_clock_that_cannot_wake_anyone_is_re_read_while_blocked() {
    let f = Fixture::new();
    let now = Arc::new(AtomicU64::new(T0_MS));
    let q = f
        .builder()
        .clock(SteppedClock(now.clone()))
        .open(&f.path)
        .unwrap();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().delay(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let got = q.dequeue_timeout(Duration::from_secs(20)).unwrap();
            (got.map(|l| l.id()), started.elapsed())
        })
    };
    std::thread::sleep(ms(50));
    now.fetch_add(61_000, Ordering::SeqCst);
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, Some(a));
    assert!(
        waited < Duration::from_secs(10),
        "waited {waited:?} of 20 s"
    );
}

/// A manual clock outliving many queues keeps no waker of a closed queue.
#[test]
fn manual_clock_forgets_closed_queues() {
    let clock = ManualClock::new(T0_MS);
    for _ in 0..50 {
        let f = Fixture::new();
        let q = Queue::builder().clock(clock.clone()).open(&f.path).unwrap();
        q.enqueue(b"x", EnqueueOptions::default()).unwrap();
        drop(q);
        clock.advance(ms(1));
    }
    let dbg = format!("{clock:?}");
    assert!(
        !dbg.contains("queue_open: true"),
        "a closed queue's waker is still live: {dbg}"
    );
    assert!(dbg.matches("ClockWaker").count() <= 1, "{dbg}");
}

// ---------------------------------------------------------------------------------------
// Regression: clock wakers
// ---------------------------------------------------------------------------------------

/// Many queues on one manual clock, each with a consumer blocked on a delayed job: one jump
/// wakes them all at once (well under `DUE_RECHECK_MAX` plus scheduling noise each).
#[test]
fn one_manual_clock_jump_wakes_consumers_of_many_queues() {
    let clock = ManualClock::new(T0_MS);
    let n = 12;
    let fixtures: Vec<Fixture> = (0..n).map(|_| Fixture::new()).collect();
    let queues: Vec<Queue> = fixtures
        .iter()
        .map(|f| {
            Queue::builder()
                .lease(LEASE)
                .clock(clock.clone())
                .open(&f.path)
                .unwrap()
        })
        .collect();
    for q in &queues {
        q.enqueue(
            b"later",
            EnqueueOptions::default().delay(Duration::from_secs(3_600)),
        )
        .unwrap();
    }
    let started = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = queues
        .iter()
        .map(|q| {
            let q = q.clone();
            let started = started.clone();
            std::thread::spawn(move || {
                started.wait();
                let l = q.dequeue_timeout(Duration::from_secs(30)).unwrap();
                let got = l.as_ref().map(Lease::id);
                if let Some(l) = l {
                    l.ack().unwrap();
                }
                (got, Instant::now())
            })
        })
        .collect();
    started.wait();
    std::thread::sleep(ms(100));
    let jumped = Instant::now();
    clock.advance(Duration::from_secs(3_601));
    for h in handles {
        let (got, at) = h.join().unwrap();
        assert_eq!(got, Some(JobId(1)));
        assert!(
            at.duration_since(jumped) < Duration::from_secs(5),
            "woke {:?} after the jump",
            at.duration_since(jumped)
        );
    }
}

/// A consumer blocked on a clone of a queue whose other handles were all dropped: the clock's
/// waker still reaches it (the clone keeps the queue open), and once the consumer is done
/// the queue closes and the file can be opened again.
#[test]
fn a_consumer_on_the_last_clone_is_still_woken() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().delay(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || {
            let got = q.dequeue_timeout(Duration::from_secs(20)).unwrap();
            let id = got.as_ref().map(Lease::id);
            got.unwrap().ack().unwrap();
            id
        })
    };
    drop(q);
    std::thread::sleep(ms(50));
    let t = Instant::now();
    f.clock.advance(Duration::from_secs(61));
    assert_eq!(waiter.join().unwrap(), Some(a));
    assert!(t.elapsed() < Duration::from_secs(5));
    let q = f.open();
    assert!(q.is_empty().unwrap());
}

/// A blocked consumer waiting for a lease deadline (a held job, nothing else): a manual clock
/// jump past the deadline delivers the job again at once.
#[test]
fn a_clock_jump_past_a_lease_deadline_wakes_the_consumer() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let held = q.dequeue().unwrap().unwrap();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let l = q.dequeue_timeout(Duration::from_secs(20)).unwrap().unwrap();
            let r = (l.id(), l.attempt(), t.elapsed());
            l.ack().unwrap();
            r
        })
    };
    std::thread::sleep(ms(50));
    f.clock.advance(LEASE + ms(1));
    let (id, attempt, waited) = waiter.join().unwrap();
    assert_eq!((id, attempt), (a, 2));
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert!(matches!(held.ack(), Err(Error::LeaseLost { .. })));
}
