//! Leases, fencing tokens, attempts and ordering against the public API, on real files with a
//! manual clock. Scenario ids refer to docs/testing.md (Scenarios).

use crate::common;
use crate::common::{Fixture, LEASE, assert_consistent};
use leaseq::{EnqueueOptions, Enqueued, Error, JobState, Stats};
use std::time::Duration;

fn enq(q: &leaseq::Queue, payload: &[u8]) -> leaseq::JobId {
    match q.enqueue(payload, EnqueueOptions::default()).unwrap() {
        Enqueued::New(id) => id,
        other => panic!("expected a new job, got {other:?}"),
    }
}

/// Dequeues and acks until the queue has nothing ready; returns the ids in delivery order.
fn drain_ids(q: &leaseq::Queue) -> Vec<leaseq::JobId> {
    std::iter::from_fn(|| q.dequeue().unwrap())
        .map(|l| {
            let id = l.id();
            l.ack().unwrap();
            id
        })
        .collect()
}

fn lease_plus_1ms() -> Duration {
    LEASE + Duration::from_millis(1)
}

// C01: an acked job is gone from every state; expiry of its old lease changes nothing.
#[test]
fn acked_job_is_gone_and_its_old_deadline_changes_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let a = enq(&q, b"A");
    let l1 = q.dequeue().unwrap().unwrap();
    assert_eq!(l1.id(), a);
    l1.ack().unwrap();
    let after_ack = q.stats().unwrap();
    f.clock.advance(lease_plus_1ms());
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.job(a).unwrap(), None);
    assert_eq!(q.stats().unwrap(), after_ack);
    assert_eq!(after_ack.total, 0);
    assert_consistent(&q);
}

// C02: once a lease expired and the job was delivered again, every call with the old token
// is refused with LeaseLost and changes nothing.
#[test]
fn stale_token_is_fenced_for_every_operation() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().max_attempts(3))
        .unwrap()
        .id();
    let l1 = q.dequeue().unwrap().unwrap();
    let token1 = l1.token();
    f.clock.advance(lease_plus_1ms());
    let l2 = q.dequeue().unwrap().unwrap();
    assert_eq!((l2.id(), l2.attempt()), (a, 2));
    assert!(l2.token() > token1);
    let before = q.job(a).unwrap().unwrap();
    assert_eq!(before.last_error.as_deref(), Some("lease expired"));

    // A Lease is consumed by ack/nack/fail, so build stale copies through the same path a
    // stale worker would have: keep l1 for extend (by &mut), then use it for the rest.
    let l1 = l1;
    let stale = |r: Result<(), Error>| match r {
        Err(Error::LeaseLost { job_id, token }) => assert_eq!((job_id, token), (a, token1)),
        other => panic!("expected LeaseLost, got {other:?}"),
    };
    stale(l1.extend(Duration::from_secs(60)));
    assert_eq!(q.job(a).unwrap().unwrap(), before);
    stale(l1.nack("stale worker").map(drop));
    assert_eq!(q.job(a).unwrap().unwrap(), before);
    assert_eq!(q.job(a).unwrap().unwrap().attempts, 2);
    l2.ack().unwrap();
    assert_eq!(q.len().unwrap(), 0);
    assert_consistent(&q);
}

// Fencing for ack, fail and ack_with too: each stale call changes nothing.
#[test]
fn stale_ack_fail_and_ack_with_change_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().max_attempts(10))
        .unwrap()
        .id();
    let mut stale = Vec::new();
    for _ in 0..3 {
        stale.push(q.dequeue().unwrap().unwrap());
        f.clock.advance(lease_plus_1ms());
    }
    let current = q.dequeue().unwrap().unwrap();
    assert_eq!(current.attempt(), 4);
    let snapshot = q.job(a).unwrap().unwrap();
    let mut ran = false;
    let results = [
        stale.pop().unwrap().ack().err(),
        stale.pop().unwrap().fail("x").err(),
        stale
            .pop()
            .unwrap()
            .ack_with(|_| {
                ran = true;
                Ok(())
            })
            .err(),
    ];
    for r in results {
        assert!(matches!(r, Some(Error::LeaseLost { .. })), "{r:?}");
    }
    assert!(!ran, "a stale ack_with must not run its closure");
    assert_eq!(q.job(a).unwrap().unwrap(), snapshot);
    assert!(!q.is_applied(a.0.to_be_bytes()).unwrap());
    current.ack().unwrap();
    assert_consistent(&q);
}

// C03: extending keeps a single delivery; without extending, exactly one redelivery.
#[test]
fn extend_keeps_one_delivery_and_expiry_redelivers_once() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().lease(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    let l1 = q.dequeue().unwrap().unwrap();
    for _ in 0..10 {
        f.clock.advance(Duration::from_secs(40));
        l1.extend(Duration::from_secs(60)).unwrap();
        assert_eq!(
            l1.deadline_ms(),
            f.clock_now() + 60_000,
            "deadline = now + d"
        );
        assert!(q.dequeue().unwrap().is_none());
    }
    assert_eq!(q.job(a).unwrap().unwrap().attempts, 1);
    l1.ack().unwrap();

    // Negative case.
    let b = q
        .enqueue(
            b"B",
            EnqueueOptions::default().lease(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    let m1 = q.dequeue().unwrap().unwrap();
    f.clock.advance(Duration::from_secs(59));
    assert!(q.dequeue().unwrap().is_none());
    f.clock.advance(Duration::from_secs(2));
    let m2 = q.dequeue().unwrap().unwrap();
    assert_eq!((m2.id(), m2.attempt()), (b, 2));
    assert!(
        q.dequeue().unwrap().is_none(),
        "only one copy leased at a time"
    );
    assert_eq!(q.stats().unwrap().leased, 1);
    drop(m1);
    m2.ack().unwrap();
    assert_consistent(&q);
}

// Extend never compounds: the deadline is now + d, not old deadline + d.
#[test]
fn extend_sets_deadline_from_now_never_compounding() {
    let f = Fixture::new();
    let q = f.open();
    enq(&q, b"A");
    let l = q.dequeue().unwrap().unwrap();
    let first = l.deadline_ms();
    assert_eq!(first, f.clock_now() + LEASE.as_millis() as u64);
    l.extend(Duration::from_secs(10)).unwrap();
    assert_eq!(l.deadline_ms(), f.clock_now() + 10_000, "may shorten");
    l.extend(Duration::from_secs(10)).unwrap();
    assert_eq!(l.deadline_ms(), f.clock_now() + 10_000, "twice is not 20 s");
    let info = q.job(l.id()).unwrap().unwrap();
    assert_eq!(info.lease_deadline_ms, Some(l.deadline_ms()));
    assert!(matches!(
        l.extend(Duration::ZERO),
        Err(Error::InvalidOption {
            field: "extend",
            ..
        })
    ));
    assert!(matches!(
        l.extend(leaseq::LEASE_MAX + Duration::from_millis(1)),
        Err(Error::InvalidOption {
            field: "extend",
            ..
        })
    ));
    assert_eq!(
        q.job(l.id()).unwrap().unwrap(),
        info,
        "refused extend wrote nothing"
    );
    // The shortened lease expires at its new deadline.
    f.clock.advance(Duration::from_secs(10));
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!(again.attempt(), 2);
    again.ack().unwrap();
    assert_consistent(&q);
}

/// Issue 42: `Lease::started_ms` is when the delivery began: the dequeue's time on the
/// queue's clock, the job's `leased_ms`, not the time it became ready; an extend does not
/// move it; a redelivery has its own.
#[test]
fn started_ms_is_when_the_delivery_began() {
    let f = Fixture::new();
    let q = f.open();
    let id = enq(&q, b"A");
    f.clock.advance(Duration::from_secs(3));
    let began = f.clock_now();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.started_ms(), began);
    assert_eq!(l.deadline_ms() - l.started_ms(), l.lease_ms());
    assert_eq!(q.job(id).unwrap().unwrap().leased_ms, Some(began));
    f.clock.advance(Duration::from_secs(1));
    l.extend(Duration::from_secs(60)).unwrap();
    assert_eq!(l.started_ms(), began, "an extend does not move the start");
    f.clock.advance(Duration::from_secs(61));
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!((again.id(), again.started_ms()), (id, f.clock_now()));
    assert_eq!(l.started_ms(), began, "the old lease keeps its start");
    again.ack().unwrap();
    assert_consistent(&q);
}

// C04: a per-job lease overrides the queue default.
#[test]
fn per_job_lease_overrides_the_default() {
    let f = Fixture::new();
    let q = f
        .builder()
        .lease(Duration::from_secs(5 * 60))
        .open(&f.path)
        .unwrap();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().lease(Duration::from_secs(60 * 60)),
        )
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    f.clock.advance(Duration::from_secs(10 * 60));
    assert!(q.dequeue().unwrap().is_none());
    f.clock.advance(Duration::from_secs(51 * 60));
    let l2 = q.dequeue().unwrap().unwrap();
    assert_eq!((l2.id(), l2.attempt()), (a, 2));
    drop(l);
    l2.ack().unwrap();
}

// Attempt counting on every ending path: nack, expiry, fail, and ack each count exactly the
// one delivery; the job dies at max_attempts with the reason of the last ending.
#[test]
fn every_ending_path_counts_one_attempt() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().max_attempts(4))
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 1);
    assert_eq!(l.nack("first").unwrap(), JobState::Ready);
    assert_eq!(q.job(a).unwrap().unwrap().attempts, 1);

    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 2);
    drop(l);
    f.clock.advance(lease_plus_1ms());
    let l = q.dequeue().unwrap().unwrap(); // the expiry of attempt 2 is swept here
    assert_eq!(l.attempt(), 3);
    let info = q.job(a).unwrap().unwrap();
    assert_eq!(
        (info.attempts, info.last_error.as_deref()),
        (3, Some("lease expired"))
    );

    assert_eq!(
        l.nack_after("third", Duration::from_secs(5)).unwrap(),
        JobState::Scheduled
    );
    assert!(q.dequeue().unwrap().is_none(), "backoff holds it");
    f.clock.advance(Duration::from_secs(5));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 4);
    assert_eq!(l.nack("fourth").unwrap(), JobState::Dead);
    let info = q.job(a).unwrap().unwrap();
    assert_eq!(
        (info.state, info.attempts, info.last_error.as_deref()),
        (JobState::Dead, 4, Some("fourth"))
    );
    assert!(q.dequeue().unwrap().is_none());

    // fail dead-letters at once, whatever attempts are left; ack removes.
    let b = enq(&q, b"B");
    q.dequeue().unwrap().unwrap().fail("bad input").unwrap();
    let info = q.job(b).unwrap().unwrap();
    assert_eq!((info.state, info.attempts), (JobState::Dead, 1));
    let c = enq(&q, b"C");
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.job(c).unwrap(), None);
    assert_eq!(
        q.stats().unwrap(),
        Stats {
            total: 2,
            dead: 2,
            ..Stats::default()
        }
    );
    assert_consistent(&q);
}

// C14: expiry as the only ending path; B is served meanwhile.
#[test]
fn repeated_expiry_dead_letters_with_lease_expired() {
    let f = Fixture::new();
    let q = f.builder().max_attempts(3).open(&f.path).unwrap();
    let p = enq(&q, b"P");
    let b = enq(&q, b"B");
    let first = q.dequeue().unwrap().unwrap();
    assert_eq!(first.id(), p);
    drop(first);
    f.clock.advance(lease_plus_1ms());
    // After the first expiry: P is back behind B (attempt 1 counted, not dead), and B is
    // served first.
    let next = q.dequeue().unwrap().unwrap();
    let info = q.job(p).unwrap().unwrap();
    assert_eq!((info.state, info.attempts), (JobState::Ready, 1));
    assert_eq!(next.id(), b);
    next.ack().unwrap();
    for _ in 0..4 {
        f.clock.advance(lease_plus_1ms());
        if let Some(l) = q.dequeue().unwrap() {
            if l.id() == b {
                l.ack().unwrap();
            } else {
                drop(l);
            }
        }
    }
    f.clock.advance(lease_plus_1ms());
    while let Some(l) = q.dequeue().unwrap() {
        assert_eq!(l.id(), b, "P must not be delivered a fourth time");
        l.ack().unwrap();
    }
    let info = q.job(p).unwrap().unwrap();
    assert_eq!(
        (info.state, info.attempts, info.last_error.as_deref()),
        (JobState::Dead, 3, Some("lease expired"))
    );
    assert_eq!(q.job(b).unwrap(), None);
    assert_consistent(&q);
}

// C15: requeue_dead resets attempts and deadlines; only dead jobs can be requeued.
#[test]
fn requeue_dead_gives_a_fresh_start_and_refuses_live_jobs() {
    let f = Fixture::new();
    let q = f.builder().max_attempts(1).open(&f.path).unwrap();
    let a = enq(&q, b"A");
    drop(q.dequeue().unwrap().unwrap());
    f.clock.advance(lease_plus_1ms());
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.job(a).unwrap().unwrap().state, JobState::Dead);
    f.clock.advance(Duration::from_secs(24 * 3600));
    q.requeue_dead(a).unwrap();
    let info = q.job(a).unwrap().unwrap();
    assert_eq!(
        (info.state, info.attempts, info.lease_deadline_ms),
        (JobState::Ready, 0, None)
    );
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 1);
    assert_eq!(l.deadline_ms(), f.clock_now() + LEASE.as_millis() as u64);
    assert!(matches!(
        q.requeue_dead(a),
        Err(Error::InvalidState {
            actual: JobState::Leased,
            ..
        })
    ));
    l.ack().unwrap();
    assert!(matches!(q.requeue_dead(a), Err(Error::JobNotFound { .. })));
    assert_consistent(&q);
}

// C18: FIFO within a priority, lower value first, the same after a reopen; both ends of the
// i32 range.
#[test]
fn priority_then_fifo_order_survives_reopen() {
    let f = Fixture::new();
    let mut ids = Vec::new();
    {
        let q = f.open();
        for i in 0..5 {
            ids.push(enq(&q, format!("J{}", i + 1).as_bytes()));
        }
        let j6 = q
            .enqueue(b"J6", EnqueueOptions::default().priority(-1))
            .unwrap()
            .id();
        let low = q
            .enqueue(b"low", EnqueueOptions::default().priority(i32::MAX))
            .unwrap()
            .id();
        let top = q
            .enqueue(b"top", EnqueueOptions::default().priority(i32::MIN))
            .unwrap()
            .id();
        ids.insert(0, j6);
        ids.insert(0, top);
        ids.push(low);
    }
    let q = f.open();
    let order = drain_ids(&q);
    assert_eq!(order, ids);
}

// C19: a nacked job goes behind jobs already available; with a backoff it waits.
#[test]
fn nack_puts_job_behind_available_work() {
    let f = Fixture::new();
    let q = f.open();
    let a = enq(&q, b"A");
    let b = enq(&q, b"B");
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), a);
    f.clock.advance(Duration::from_millis(1));
    l.nack_after("retry", Duration::from_secs(10)).unwrap();
    let lb = q.dequeue().unwrap().unwrap();
    assert_eq!(lb.id(), b);
    assert!(q.dequeue().unwrap().is_none(), "A waits out its backoff");
    f.clock.advance(Duration::from_secs(10));
    let la = q.dequeue().unwrap().unwrap();
    assert_eq!((la.id(), la.attempt()), (a, 2));
    // backoff 0: documented tail position (behind B, which is ready again after a nack).
    let c = enq(&q, b"C");
    f.clock.advance(Duration::from_millis(1));
    la.nack("again").unwrap();
    lb.nack("b").unwrap();
    let order = drain_ids(&q);
    assert_eq!(order, vec![c, a, b]);
}

// C13: a job delayed 2 h, looked at every 10 min: scheduled, no attempt, no lease; at 2 h it
// is delivered as attempt 1 with its lease from then.
#[test]
fn delayed_job_waits_without_attempts_or_lease() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().delay(Duration::from_secs(7200)),
        )
        .unwrap()
        .id();
    for _ in 0..11 {
        f.clock.advance(Duration::from_secs(600));
        assert!(q.dequeue().unwrap().is_none());
        let info = q.job(a).unwrap().unwrap();
        assert_eq!(
            (info.state, info.attempts, info.lease_token),
            (JobState::Scheduled, 0, None)
        );
    }
    f.clock.advance(Duration::from_secs(600)); // t = 2h
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 1);
    assert_eq!(l.deadline_ms(), f.clock_now() + LEASE.as_millis() as u64);
    l.ack().unwrap();
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
    items: Vec<String>,
    total_cents: i64,
}

#[test]
fn typed_payload_round_trips() {
    let f = Fixture::new();
    let q = f.open();
    let order = Order {
        id: 42,
        items: vec!["tea".into(), "cake".into()],
        total_cents: -5,
    };
    let _ = q.enqueue_value(&order, EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<Order>().unwrap(), order);
    assert!(matches!(
        l.decode::<Vec<Order>>(),
        Err(Error::PayloadCodec { .. })
    ));
    l.ack().unwrap();
}

// C24 and C25 (the refusals): typed errors before any write; the next enqueue works.
#[test]
fn refused_enqueues_write_nothing() {
    let f = Fixture::new();
    let q = f.builder().payload_bytes_max(1000).open(&f.path).unwrap();
    let _ = q
        .enqueue(&[7; 1000], EnqueueOptions::default().dedup_key("d"))
        .unwrap();
    let before = q.stats().unwrap();
    let bytes_before = std::fs::read(&f.path).unwrap();
    let refusals = [
        q.enqueue(&[7; 1001], EnqueueOptions::default()).err(),
        q.enqueue(b"x", EnqueueOptions::default().dedup_key([1; 513]))
            .err(),
        q.enqueue(b"x", EnqueueOptions::default().idempotency_key([1; 513]))
            .err(),
        q.enqueue(b"x", EnqueueOptions::default().max_attempts(0))
            .err(),
        q.enqueue(b"x", EnqueueOptions::default().lease(Duration::ZERO))
            .err(),
        q.enqueue(
            b"x",
            EnqueueOptions::default().lease(leaseq::LEASE_MAX + Duration::from_secs(1)),
        )
        .err(),
        q.enqueue(b"x", EnqueueOptions::default().delay(Duration::MAX))
            .err(),
    ];
    assert!(matches!(
        refusals[0],
        Some(Error::PayloadTooLarge {
            size_bytes: 1001,
            limit_bytes: 1000
        })
    ));
    assert!(matches!(
        refusals[1],
        Some(Error::KeyTooLong {
            field: "dedup_key",
            ..
        })
    ));
    assert!(matches!(
        refusals[2],
        Some(Error::KeyTooLong {
            field: "idempotency_key",
            ..
        })
    ));
    for (r, field) in refusals[3..]
        .iter()
        .zip(["max_attempts", "lease", "lease", "delay"])
    {
        match r {
            Some(Error::InvalidOption { field: f, .. }) => assert_eq!(*f, field),
            other => panic!("expected InvalidOption {field}, got {other:?}"),
        }
    }
    assert_eq!(q.stats().unwrap(), before);
    assert_eq!(
        std::fs::read(&f.path).unwrap(),
        bytes_before,
        "file unchanged"
    );
    assert!(matches!(
        q.enqueue(b"y", EnqueueOptions::default().dedup_key("d"))
            .unwrap(),
        Enqueued::Duplicate(_)
    ));
    assert!(matches!(
        q.enqueue(b"y", EnqueueOptions::default()).unwrap(),
        Enqueued::New(_)
    ));
}

#[test]
fn invalid_builder_options_are_refused_before_opening() {
    let f = Fixture::new();
    let cases = [
        (f.builder().lease(Duration::ZERO), "lease"),
        (
            f.builder()
                .lease(leaseq::LEASE_MAX + Duration::from_millis(1)),
            "lease",
        ),
        (f.builder().max_attempts(0), "max_attempts"),
        (
            f.builder()
                .payload_bytes_max(leaseq::PAYLOAD_BYTES_MAX_CAP + 1),
            "payload_bytes_max",
        ),
    ];
    for (b, field) in cases {
        match b.open(&f.path) {
            Err(Error::InvalidOption { field: got, .. }) => assert_eq!(got, field),
            other => panic!("expected InvalidOption {field}, got {other:?}"),
        }
    }
    assert!(!f.path.exists(), "nothing was created");
}

// Producer dedup: one live job per key; released when its job is acked.
#[test]
fn dedup_key_keeps_one_live_job_and_is_released_on_ack() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().dedup_key("k"))
        .unwrap();
    let dup = q
        .enqueue(b"A again", EnqueueOptions::default().dedup_key("k"))
        .unwrap();
    assert_eq!(dup, Enqueued::Duplicate(a.id()));
    assert_eq!(q.len().unwrap(), 1);
    q.dequeue().unwrap().unwrap().ack().unwrap();
    let b = q
        .enqueue(b"B", EnqueueOptions::default().dedup_key("k"))
        .unwrap();
    assert!(matches!(b, Enqueued::New(id) if id != a.id()));
    assert_consistent(&q);
}

// Ties within one millisecond: a job given back goes behind every job already ready, by
// the order jobs became ready, not by id or clock time.
#[test]
fn job_given_back_in_the_same_millisecond_goes_behind() {
    let f = Fixture::new();
    let q = f.open();
    let a = enq(&q, b"A");
    let b = enq(&q, b"B");
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), a);
    l.nack("again").unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().id(), b);
    assert_eq!(q.dequeue().unwrap().unwrap().id(), a);

    // requeue_dead in the same millisecond: behind C.
    let g = Fixture::new();
    let q = g.builder().max_attempts(1).open(&g.path).unwrap();
    let d = enq(&q, b"D");
    q.dequeue().unwrap().unwrap().fail("x").unwrap();
    let c = enq(&q, b"C");
    q.requeue_dead(d).unwrap();
    let order = drain_ids(&q);
    assert_eq!(order, vec![c, d]);
}

// FIFO does not depend on the clock: a clock stepping back keeps enqueue order.
#[test]
fn clock_stepping_back_keeps_fifo() {
    let f = Fixture::new();
    let q = f.open();
    let a = enq(&q, b"A");
    f.clock.set_ms(common::T0_MS - 5_000);
    let b = enq(&q, b"B");
    let order = drain_ids(&q);
    assert_eq!(order, vec![a, b]);
}

#[test]
fn dequeue_timeout_with_an_endless_timeout_does_not_panic() {
    let f = Fixture::new();
    let q = f.open();
    let a = enq(&q, b"A");
    let l = q.dequeue_timeout(Duration::MAX).unwrap().unwrap();
    assert_eq!(l.id(), a);
}

// remove: deletes a scheduled, ready or dead job and frees its dedup key; a leased job must
// be ended through its lease.
#[test]
fn remove_deletes_unleased_jobs_and_frees_their_dedup_key() {
    let f = Fixture::new();
    let q = f.builder().max_attempts(1).open(&f.path).unwrap();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().dedup_key("k"))
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().fail("broken").unwrap();
    assert!(matches!(
        q.enqueue(b"A2", EnqueueOptions::default().dedup_key("k")).unwrap(),
        Enqueued::DuplicateDead(id) if id == a
    ));
    q.remove(a).unwrap();
    assert_eq!(q.job(a).unwrap(), None);
    let b = q
        .enqueue(b"B", EnqueueOptions::default().dedup_key("k"))
        .unwrap();
    assert!(matches!(b, Enqueued::New(id) if id != a));
    let delayed = q
        .enqueue(
            b"D",
            EnqueueOptions::default().delay(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    q.remove(delayed).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert!(matches!(
        q.remove(l.id()),
        Err(Error::InvalidState {
            actual: JobState::Leased,
            ..
        })
    ));
    l.ack().unwrap();
    assert!(matches!(q.remove(a), Err(Error::JobNotFound { .. })));
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}
