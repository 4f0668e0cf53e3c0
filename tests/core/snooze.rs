//! `Lease::snooze`: giving a job back without charging the attempt (as Oban's snooze and
//! River's `JobSnooze`), fenced, counted apart; a crash or an expired lease still counts.
//!
//! Adversarial tests of issue 11 (`Lease::snooze`): each checks the state that should result
//! (stats, `Queue::job`, `check()`), not only that nothing panics.

use crate::common;
use crate::common::{Fixture, LEASE, T0_MS, assert_consistent, plain};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, ImportJob, JobId, JobState};
use std::time::Duration;

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
        assert_eq!(l.snoozes(), n - 1, "the lease counts the snoozes before it");
        l.snooze(Duration::ZERO).unwrap();
        let j = q.job(id).unwrap().unwrap();
        assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Ready, 0, n));
    }
    // Its one real attempt: a nack now makes it dead.
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.snoozes(), 10);
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

// ---------------------------------------------------------------------------------------
// Snooze.
// ---------------------------------------------------------------------------------------

/// max_attempts 1: any number of snoozes leave the one attempt; a crash holding the lease
/// uses it (dead at reopen); a scheduled snoozed job is untouched by the reopen.
#[test]
fn snooze_with_one_attempt_then_a_crash_dead_letters_at_reopen() {
    let f = Fixture::new();
    let (crashed, waiting) = {
        let q = f.open();
        let crashed = q.enqueue(b"crash", plain().max_attempts(1)).unwrap().id();
        let waiting = q.enqueue(b"wait", plain().max_attempts(1)).unwrap().id();
        for _ in 0..3 {
            let l = q.dequeue().unwrap().unwrap();
            assert_eq!(l.attempt(), 1);
            l.snooze(Duration::ZERO).unwrap();
        }
        // `crash` and `wait` alternate: crash (1), wait (1), crash (2) were snoozed.
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), waiting);
        l.snooze(Duration::from_secs(120)).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!((l.id(), l.attempt()), (crashed, 1));
        drop(l); // the process "dies" holding it: never ended
        drop(q);
        (crashed, waiting)
    };
    let q = f.open();
    let r = q.recovery();
    assert_eq!((r.leases_returned, r.leases_dead_lettered), (0, 1), "{r:?}");
    let j = q.job(crashed).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Dead, 1, 2));
    let w = q.job(waiting).unwrap().unwrap();
    assert_eq!(
        (w.state, w.attempts, w.snoozes, w.run_at_ms),
        (JobState::Scheduled, 0, 2, T0_MS + 120_000)
    );
    assert_consistent(&q);
}

#[test]
fn the_snooze_count_saturates() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .import_batch(&[ImportJob::new(b"tired".to_vec())
            .snoozes(u32::MAX)
            .attempts(3)])
        .unwrap()[0]
        .id();
    for _ in 0..2 {
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.attempt(), 4);
        l.snooze(Duration::ZERO).unwrap();
        let j = q.job(id).unwrap().unwrap();
        assert_eq!(
            (j.state, j.attempts, j.snoozes),
            (JobState::Ready, 3, u32::MAX)
        );
    }
    assert_consistent(&q);
}

/// A snooze touches no key: a dedup key held while live stays held, the idempotency key still
/// guards the effect, and a window ends on its own time even while the job sleeps.
#[test]
fn snooze_keeps_keys_and_windows_run_on_their_own_time() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"a", plain().dedup_key("a").idempotency_key("ia"))
        .unwrap()
        .id();
    let w = q
        .enqueue(
            b"w",
            plain().dedup_key("w").dedup_window(Duration::from_secs(5)),
        )
        .unwrap()
        .id();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(10))
        .unwrap();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        q.enqueue(b"dup", plain().dedup_key("a")).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(
        q.enqueue(b"dup", plain().dedup_key("w")).unwrap(),
        Enqueued::Duplicate(w)
    );
    f.clock.advance(Duration::from_secs(6));
    // w's window ended: the key is free though w is still snoozed.
    let w2 = q.enqueue(b"w2", plain().dedup_key("w")).unwrap().id();
    assert_eq!(q.job(w).unwrap().unwrap().state, JobState::Scheduled);
    f.clock.advance(Duration::from_secs(4));
    // w2 became ready before a came due: first in line.
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), w2);
    l.ack().unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt()), (a, 1));
    assert_eq!(l.ack_with(|_| Ok(())).unwrap(), Applied::Now);
    assert!(q.is_applied("ia").unwrap());
    assert!(matches!(
        q.enqueue(b"a later", plain().dedup_key("a")).unwrap(),
        Enqueued::New(_)
    ));
    // w comes due later.
    f.clock.advance(Duration::from_secs(60));
    let mut seen = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        seen.push(l.id());
        l.ack().unwrap();
    }
    assert!(seen.contains(&w), "{seen:?}");
    assert_consistent(&q);
}

/// In a batch: one lease snoozed, one whose `ack_with` closure fails (given back, charged),
/// whose later snooze is stale and changes nothing; the attempt counts add up to dead.
#[test]
fn snooze_in_a_batch_next_to_a_failing_ack_with() {
    let f = Fixture::new();
    let q = f.open();
    let ids: Vec<JobId> = (0..3u8)
        .map(|i| q.enqueue(&[i], plain().max_attempts(2)).unwrap().id())
        .collect();
    let mut batch = q.dequeue_batch(3).unwrap().into_iter();
    let (l0, l1, l2) = (
        batch.next().unwrap(),
        batch.next().unwrap(),
        batch.next().unwrap(),
    );
    l0.snooze(Duration::ZERO).unwrap();
    let r = l1.ack_with(|_| Err("boom".into()));
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    let before = q.job(ids[1]).unwrap().unwrap();
    assert_eq!(
        (before.state, before.attempts, before.snoozes),
        (JobState::Ready, 1, 0)
    );
    assert!(matches!(
        l1.snooze(Duration::ZERO),
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        l1.heartbeat().extend(LEASE),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(q.job(ids[1]).unwrap().unwrap(), before);
    l2.ack().unwrap();
    // Job 1 again: its second and last attempt; a snooze gives it back, then a failing
    // effect on the same attempt number makes it dead.
    let mut deaths = 0;
    for _ in 0..6 {
        let Some(l) = q.dequeue().unwrap() else { break };
        if l.id() == ids[1] && q.job(ids[1]).unwrap().unwrap().snoozes == 0 {
            assert_eq!(l.attempt(), 2);
            l.snooze(Duration::ZERO).unwrap();
        } else if l.id() == ids[1] {
            assert_eq!(l.attempt(), 2, "the snoozed attempt was given back");
            assert!(l.ack_with(|_| Err("boom again".into())).is_err());
            deaths += 1;
        } else {
            assert_eq!((l.id(), l.attempt()), (ids[0], 1));
            l.ack().unwrap();
        }
    }
    assert_eq!(deaths, 1);
    let j = q.job(ids[1]).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Dead, 2, 1));
    assert_eq!(j.last_error.as_deref(), Some("boom again"));
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.dead), (1, 1));
    assert_consistent(&q);
}

#[test]
fn a_snoozed_job_can_be_removed_purged_or_requeued() {
    let f = Fixture::new();
    let q = f.open();
    let r = q.enqueue(b"r", plain().dedup_key("r")).unwrap().id();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(60))
        .unwrap();
    q.remove(r).unwrap();
    assert!(q.job(r).unwrap().is_none());
    assert!(matches!(
        q.enqueue(b"r2", plain().dedup_key("r")).unwrap(),
        Enqueued::New(_)
    ));
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(60))
        .unwrap();
    assert_eq!(q.purge(JobState::Scheduled).unwrap(), 1);
    // Dead, requeued: the snooze count stays, the attempts restart.
    let x = q.enqueue(b"x", plain().max_attempts(1)).unwrap().id();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::ZERO)
        .unwrap();
    q.dequeue().unwrap().unwrap().fail("no").unwrap();
    q.requeue_dead(x).unwrap();
    let j = q.job(x).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Ready, 0, 1));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.attempt(), l.max_attempts()), (1, 1));
    l.ack().unwrap();
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}
