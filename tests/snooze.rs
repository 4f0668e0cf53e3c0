//! `Lease::snooze`: giving a job back without charging the attempt (as Oban's snooze and
//! River's `JobSnooze`), fenced, counted apart; a crash or an expired lease still counts.

mod common;

use std::time::Duration;

use common::{Fixture, LEASE, assert_consistent};
use leaseq::{EnqueueOptions, Error, JobState};

#[test]
fn snoozing_never_uses_up_attempts() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"job", EnqueueOptions::default().max_attempts(1))
        .unwrap()
        .id();
    for n in 1..=10u32 {
        let l = q.dequeue().unwrap().expect("snoozed jobs come back");
        assert_eq!((l.attempt(), l.max_attempts()), (1, 1), "snooze {n}");
        l.snooze(Duration::ZERO).unwrap();
        let j = q.job(id).unwrap().unwrap();
        assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Ready, 0, n));
    }
    // Its one real attempt: a nack now makes it dead.
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.nack("real failure").unwrap(), JobState::Dead);
    let j = q.job(id).unwrap().unwrap();
    assert_eq!((j.attempts, j.snoozes), (1, 10));
    assert_consistent(&q);
}

#[test]
fn a_snooze_with_a_delay_waits_and_keeps_the_last_error() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
    q.dequeue().unwrap().unwrap().nack("first failure").unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 2);
    l.snooze(Duration::from_secs(60)).unwrap();
    let j = q.job(id).unwrap().unwrap();
    assert_eq!(j.state, JobState::Scheduled);
    assert_eq!(j.run_at_ms, common::T0_MS + 60_000);
    assert_eq!(j.last_error.as_deref(), Some("first failure"));
    assert_eq!((j.attempts, j.snoozes), (1, 1));
    f.clock.advance(Duration::from_secs(59));
    assert!(q.dequeue().unwrap().is_none(), "not before its time");
    f.clock.advance(Duration::from_secs(2));
    let l = q.dequeue().unwrap().expect("due");
    assert_eq!(l.attempt(), 2, "the snoozed attempt was not charged");
    l.ack().unwrap();
}

#[test]
fn a_crash_or_an_expired_lease_still_counts_the_attempt() {
    let f = Fixture::new();
    let id = {
        let q = f.open();
        let id = q
            .enqueue(b"poison", EnqueueOptions::default().max_attempts(2))
            .unwrap()
            .id();
        q.dequeue()
            .unwrap()
            .unwrap()
            .snooze(Duration::ZERO)
            .unwrap();
        // Attempt 1 taken and the process "dies" holding it.
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.attempt(), 1);
        drop(l); // not ended: still leased in the file when it closes
        id
    };
    let q = f.open();
    assert_eq!(q.recovery().leases_returned, 1);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 2, "the crashed attempt counted");
    drop(l); // abandoned: its lease expires
    f.clock.advance(LEASE + Duration::from_secs(1));
    assert!(q.dequeue().unwrap().is_none());
    let j = q.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Dead, 2, 1));
}

#[test]
fn a_stale_snooze_is_refused_and_changes_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
    let old = q.dequeue().unwrap().unwrap();
    f.clock.advance(LEASE + Duration::from_secs(1));
    let new = q.dequeue().unwrap().unwrap();
    let before = q.job(id).unwrap().unwrap();
    assert!(matches!(
        old.snooze(Duration::ZERO),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(q.job(id).unwrap().unwrap(), before);
    // A snooze after the ack is refused too.
    new.ack().unwrap();
    assert!(matches!(
        new.snooze(Duration::ZERO),
        Err(Error::LeaseLost { .. })
    ));
    assert!(q.job(id).unwrap().is_none());
    assert_consistent(&q);
}

#[test]
fn a_snooze_past_delay_max_is_refused_and_the_lease_stays() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    let r = l.snooze(leaseq::DELAY_MAX + Duration::from_millis(1));
    assert!(matches!(r, Err(Error::InvalidOption { .. })), "{r:?}");
    let j = q.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.snoozes, j.attempts), (JobState::Leased, 0, 1));
    l.ack().unwrap();
}

#[test]
fn a_snooze_of_zero_wakes_a_blocked_consumer() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"job", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || q.dequeue_timeout(Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(100));
    let t = std::time::Instant::now();
    l.snooze(Duration::ZERO).unwrap();
    let got = waiter
        .join()
        .unwrap()
        .unwrap()
        .expect("woken by the snooze");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(got.attempt(), 1);
    got.ack().unwrap();
}

/// An `ack_with` closure that returns an `Outcome` ends its job as the outcome says, with none
/// of its writes; the call's `Effect` error holds the outcome.
#[test]
fn ack_with_honours_an_outcome_from_its_closure() {
    use leaseq::Outcome;
    use leaseq::redb::ReadableDatabase;
    let f = Fixture::new();
    let q = f.open();
    const WRITES: leaseq::redb::TableDefinition<u64, u64> =
        leaseq::redb::TableDefinition::new("writes");
    let ids: Vec<_> = (0..4u8)
        .map(|i| {
            q.enqueue(&[i], EnqueueOptions::default().max_attempts(1))
                .unwrap()
                .id()
        })
        .collect();
    let outcomes = [
        Outcome::Snooze(Duration::from_secs(30)),
        Outcome::Fail("no such user".into()),
        Outcome::Retry {
            after: Duration::from_secs(5),
            reason: "busy".into(),
        },
        Outcome::Snooze(leaseq::DELAY_MAX + Duration::from_secs(1)),
    ];
    for (id, outcome) in ids.iter().zip(outcomes.clone()) {
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), *id);
        let r = l.ack_with(|tx| {
            tx.open_table(WRITES)?.insert(id.0, 1)?;
            Err(outcome.clone().into())
        });
        match r {
            Err(Error::Effect(e)) => assert_eq!(e.downcast_ref::<Outcome>(), Some(&outcome)),
            other => panic!("{other:?}"),
        }
    }
    let j = |i: usize| q.job(ids[i]).unwrap().unwrap();
    // Snoozed: uncharged, due in 30 s, not dead although it had one attempt.
    assert_eq!(
        (j(0).state, j(0).attempts, j(0).snoozes, j(0).run_at_ms),
        (JobState::Scheduled, 0, 1, common::T0_MS + 30_000)
    );
    assert_eq!(
        (j(1).state, j(1).last_error.as_deref()),
        (JobState::Dead, Some("no such user"))
    );
    // A retry on the last attempt is dead, with its reason.
    assert_eq!(
        (j(2).state, j(2).last_error.as_deref()),
        (JobState::Dead, Some("busy"))
    );
    // A refused snooze goes through the retry policy: its one attempt used, dead.
    assert_eq!(j(3).state, JobState::Dead);
    assert!(
        j(3).last_error.unwrap().starts_with("refused outcome"),
        "{:?}",
        j(3)
    );
    let rtx = q.database().begin_read().unwrap();
    assert!(
        rtx.open_table(WRITES).is_err(),
        "none of the closures' writes committed"
    );
    assert_consistent(&q);
}
