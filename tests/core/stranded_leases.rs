//! Never strand a lease (cases C34, C35): every call on a lease borrows it, so after any
//! refusal the caller can still end the attempt; a call that ends it on its own (a failing
//! `ack_with` closure) records why; batch acks report each lease.
//!
//! Adversarial tests (issue 8): group commit against the `ack_with` re-run loop, per-lease
//! outcomes. Written by an adversarial review; every bug it found is fixed and its test kept as
//! a regression test.

use crate::common::{
    Fixture, LEASE, T0_MS, all_ok, assert_consistent, bump, effects, enqueue_n, ms,
};
#[cfg(feature = "sim")]
use leaseq::ManualClock;
use leaseq::{Applied, Clock, EnqueueOptions, Error, JobId, JobState, Lease, Queue};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

// ---------------------------------------------------------------------------------------
// C34, C35: refused and failed calls
// ---------------------------------------------------------------------------------------

/// C34: leases A (60 s), B (1 s), C (60 s) from one `dequeue_batch`; B expires and is
/// delivered again; `ack_batch([A, B, C])` acks A and C (their work is done) and reports B as
/// `LeaseLost`; A and C never come back, B stays with its new holder.
#[test]
fn c34_batch_ack_with_one_stale_lease_acks_the_others_and_reports_it() {
    for with_effect in [false, true] {
        let f = Fixture::new();
        let q = f.open();
        let lease_of = |s| EnqueueOptions::default().lease(Duration::from_secs(s));
        let a = q.enqueue(b"A", lease_of(60)).unwrap().id();
        let b = q.enqueue(b"B", lease_of(1)).unwrap().id();
        let c = q.enqueue(b"C", lease_of(60)).unwrap().id();
        let leases = q.dequeue_batch(3).unwrap();
        assert_eq!(leases.iter().map(Lease::id).collect::<Vec<_>>(), [a, b, c]);
        f.clock.advance(Duration::from_secs(2));
        let b2 = q.dequeue().unwrap().expect("B, its lease expired");
        assert_eq!((b2.id(), b2.attempt()), (b, 2));

        let outcomes: Vec<Result<(), Error>> = if with_effect {
            q.ack_with_batch(&leases, |tx, l| bump(tx, l.id().0))
                .unwrap()
                .into_iter()
                .map(|r| r.map(|a| assert_eq!(a, Applied::Now)))
                .collect()
        } else {
            q.ack_batch(&leases).unwrap()
        };
        match outcomes.as_slice() {
            [Ok(()), Err(Error::LeaseLost { job_id, token }), Ok(())] => {
                assert_eq!((*job_id, *token), (b, leases[1].token()));
            }
            other => panic!("with_effect={with_effect}: {other:?}"),
        }
        if with_effect {
            assert_eq!(effects(&q).keys().count(), 2, "effects of A and C only");
        }
        assert_eq!(q.job(a).unwrap(), None);
        assert_eq!(q.job(c).unwrap(), None);
        let held = q.job(b).unwrap().unwrap();
        assert_eq!(
            (held.state, held.lease_token),
            (JobState::Leased, Some(b2.token()))
        );
        // Far past every deadline: only B comes back (its second lease expired too).
        f.clock.advance(Duration::from_secs(120));
        let again = q.dequeue().unwrap().unwrap();
        assert_eq!((again.id(), again.attempt()), (b, 3));
        assert!(q.dequeue().unwrap().is_none());
        again.ack().unwrap();
        assert!(q.is_empty().unwrap());
        assert_consistent(&q);
    }
}

/// C35: `nack_after` with a backoff above `DELAY_MAX` is refused and writes nothing; the lease
/// is still current, and the caller ends the attempt with it.
#[test]
fn c35_refused_nack_after_keeps_the_lease_usable() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    let before = q.job(id).unwrap().unwrap();
    let err = l
        .nack_after("later", leaseq::DELAY_MAX + ms(1))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                field: "backoff",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(q.job(id).unwrap().unwrap(), before, "nothing written");
    assert_eq!(
        l.nack_after("later", Duration::from_secs(5)).unwrap(),
        JobState::Scheduled
    );
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.last_error.as_deref(), Some("later"));
    assert_eq!(info.run_at_ms, T0_MS + 5_000);
    assert!(
        matches!(l.ack(), Err(Error::LeaseLost { .. })),
        "ended once"
    );
    assert_consistent(&q);
}

/// C35, tried as a new user would: an `ack_with` whose closure fails twice, with
/// `max_attempts(2)`, ends dead with the effect's own error, without waiting out any lease
/// (the clock never moves).
#[test]
fn c35_failing_effect_ends_the_attempt_at_once_with_its_error() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"A", EnqueueOptions::default().max_attempts(2))
        .unwrap()
        .id();
    for attempt in 1..=2 {
        let l = q.dequeue().unwrap().expect("delivered again at once");
        assert_eq!(l.attempt(), attempt);
        let err = l
            .ack_with(|tx| {
                bump(tx, 7)?;
                Err(format!("smtp said no ({attempt})").into())
            })
            .unwrap_err();
        assert!(matches!(err, Error::Effect(_)), "{err:?}");
        assert!(matches!(l.ack(), Err(Error::LeaseLost { .. })));
    }
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.state, JobState::Dead);
    assert_eq!(info.last_error.as_deref(), Some("smtp said no (2)"));
    assert!(effects(&q).is_empty(), "no failed effect left a write");
    assert_eq!(f.clock.now_ms(), T0_MS, "no lease was waited out");
    assert_consistent(&q);
}

/// The same through `ack_with_and_next` and `ack_with_batch`: the failing job is given back
/// with its error, nothing is leased by the failed `_and_next`, and in a batch the other
/// effects commit.
#[test]
fn c35_failing_effect_in_and_next_and_batch_gives_back_only_its_job() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 4, EnqueueOptions::default());
    let l = q.dequeue().unwrap().unwrap();
    let err = l.ack_with_and_next(|_| Err("no".into())).unwrap_err();
    assert!(matches!(err, Error::Effect(_)));
    let s = q.stats().unwrap();
    assert_eq!(
        (s.ready, s.leased),
        (4, 0),
        "nothing leased by a failed _and_next"
    );
    assert_eq!(
        q.job(ids[0]).unwrap().unwrap().last_error.as_deref(),
        Some("no")
    );

    let leases = q.dequeue_batch(4).unwrap();
    assert_eq!(
        leases[3].id(),
        ids[0],
        "the job given back went to the back"
    );
    let out = q
        .ack_with_batch(&leases, |tx, l| {
            if l.id() == ids[2] {
                panic!("bug in the effect of job {}", l.id());
            }
            bump(tx, l.id().0)
        })
        .unwrap();
    for (l, r) in leases.iter().zip(&out) {
        if l.id() == ids[2] {
            assert!(
                matches!(r, Err(Error::Effect(e)) if e.to_string().contains("bug in the effect")),
                "{r:?}"
            );
        } else {
            assert!(matches!(r, Ok(Applied::Now)), "{r:?}");
        }
    }
    assert_eq!(effects(&q).len(), 3);
    let back = q.job(ids[2]).unwrap().unwrap();
    assert_eq!(back.state, JobState::Ready);
    assert!(back.last_error.unwrap().contains("bug in the effect"));
    assert_eq!(q.len().unwrap(), 1);
    assert_consistent(&q);
}

/// One consuming call, as the sweep below makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Ack,
    AckAndNext,
    AckWith,
    AckWithAndNext,
    Nack,
    NackAfter,
    Fail,
    Extend,
    AckBatch,
    AckWithBatch,
}

const CALLS: [Call; 10] = [
    Call::Ack,
    Call::AckAndNext,
    Call::AckWith,
    Call::AckWithAndNext,
    Call::Nack,
    Call::NackAfter,
    Call::Fail,
    Call::Extend,
    Call::AckBatch,
    Call::AckWithBatch,
];

/// How a call is made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The lease expired and the job was delivered to another holder.
    Stale,
    /// An option out of range (a backoff above `DELAY_MAX`, a zero extension, a lease of
    /// another queue in a batch).
    InvalidOption,
    /// The `ack_with` closure fails.
    FailingClosure,
    /// Called from inside another lease's `ack_with` closure.
    Reentrant,
}

/// Makes `call` on `lease` under `fault`; returns its error (every sweep case fails).
fn make_call(q: &Queue, other: &Queue, call: Call, fault: Fault, lease: &mut Lease) -> Error {
    let fails = fault == Fault::FailingClosure;
    let effect = |tx: &leaseq::Tx<'_>| {
        bump(tx, 1)?;
        if fails {
            return Err("closure failed".into());
        }
        Ok(())
    };
    let invalid = fault == Fault::InvalidOption;
    let foreign = || {
        other.enqueue(b"x", EnqueueOptions::default()).unwrap();
        other.dequeue().unwrap().unwrap()
    };
    let one = |r: leaseq::Result<Vec<leaseq::Result<()>>>| match r {
        Ok(mut v) => v
            .pop()
            .unwrap()
            .expect_err("the lease's outcome is an error"),
        Err(e) => e,
    };
    let r: Error = match call {
        Call::Ack => lease.ack().unwrap_err(),
        Call::AckAndNext => lease.ack_and_next().unwrap_err(),
        Call::AckWith => lease.ack_with(effect).unwrap_err(),
        Call::AckWithAndNext => lease.ack_with_and_next(effect).unwrap_err(),
        Call::Nack => lease.nack("why").unwrap_err(),
        Call::NackAfter => {
            let backoff = if invalid {
                leaseq::DELAY_MAX + ms(1)
            } else {
                ms(5)
            };
            lease.nack_after("why", backoff).unwrap_err()
        }
        Call::Fail => lease.fail("why").unwrap_err(),
        Call::Extend => lease
            .extend(if invalid { Duration::ZERO } else { LEASE })
            .unwrap_err(),
        Call::AckBatch if invalid => one(q.ack_batch(&[foreign()])),
        Call::AckBatch => one(q.ack_batch(std::slice::from_ref(lease))),
        Call::AckWithBatch if invalid => q
            .ack_with_batch(&[foreign()], |tx, _| effect(tx))
            .unwrap_err(),
        Call::AckWithBatch => {
            match q.ack_with_batch(std::slice::from_ref(lease), |tx, _| effect(tx)) {
                Ok(mut v) => v.pop().unwrap().unwrap_err(),
                Err(e) => e,
            }
        }
    };
    let _ = q;
    r
}

/// The general rule behind C34/C35, swept over every consuming call and every way it can
/// fail: after the error, the attempt is either still the caller's (the job is leased under
/// the caller's token, and the same lease value acks it), or the error's documented outcome
/// ended it at once (a failing closure: ready with the closure's error), or it belongs to the
/// job's new holder (a stale lease: nothing changed). No job ever waits out a lease nobody
/// holds: the clock never moves after the call.
#[test]
fn no_refused_or_failed_call_strands_a_lease() {
    let faults = [
        Fault::Stale,
        Fault::InvalidOption,
        Fault::FailingClosure,
        Fault::Reentrant,
    ];
    let mut cases = 0;
    for call in CALLS {
        for fault in faults {
            let closure_call = matches!(
                call,
                Call::AckWith | Call::AckWithAndNext | Call::AckWithBatch
            );
            let has_option = matches!(
                call,
                Call::NackAfter | Call::Extend | Call::AckBatch | Call::AckWithBatch
            );
            if (fault == Fault::FailingClosure && !closure_call)
                || (fault == Fault::InvalidOption && !has_option)
            {
                continue;
            }
            cases += 1;
            let what = format!("{call:?} under {fault:?}");
            let f = Fixture::new();
            let q = f.open();
            let g = Fixture::new();
            let other = g.open();
            let id = q
                .enqueue(b"job", EnqueueOptions::default().lease(ms(1_000)))
                .unwrap()
                .id();
            q.enqueue(b"next", EnqueueOptions::default()).unwrap();
            let mut lease = q.dequeue().unwrap().unwrap();
            let mut new_holder = None;
            if fault == Fault::Stale {
                f.clock.advance(ms(1_001));
                let l = q.dequeue().unwrap().unwrap();
                let l = if l.id() == id {
                    l
                } else {
                    // The sweep put the job behind "next": take that too.
                    let again = q.dequeue().unwrap().unwrap();
                    l.nack("not this one").unwrap();
                    again
                };
                assert_eq!(l.id(), id, "{what}");
                new_holder = Some(l);
            }
            let err = if fault == Fault::Reentrant {
                // The call is made from inside the closure of another lease's ack_with.
                let carrier_id = q
                    .enqueue(b"carrier", EnqueueOptions::default())
                    .unwrap()
                    .id();
                let carrier = loop {
                    let l = q.dequeue().unwrap().expect("the carrier");
                    if l.id() == carrier_id {
                        break l;
                    }
                    l.nack("not the carrier").unwrap();
                };
                let mut seen = None;
                let r = carrier.ack_with(|_| {
                    seen = Some(make_call(&q, &other, call, fault, &mut lease));
                    Err("inner call refused".into())
                });
                assert!(matches!(r, Err(Error::Effect(_))), "{what}: {r:?}");
                seen.expect("the closure ran")
            } else {
                make_call(&q, &other, call, fault, &mut lease)
            };
            let expected = match fault {
                Fault::Stale => matches!(err, Error::LeaseLost { .. }),
                Fault::InvalidOption => matches!(err, Error::InvalidOption { .. }),
                Fault::FailingClosure => matches!(err, Error::Effect(_)),
                Fault::Reentrant => matches!(err, Error::Reentrant),
            };
            assert!(expected, "{what}: {err:?}");
            assert!(
                effects(&q).is_empty(),
                "{what}: a failed call left an effect"
            );
            let info = q.job(id).unwrap().expect("the job is still there");
            match fault {
                Fault::Stale => {
                    let holder = new_holder.as_ref().unwrap();
                    assert_eq!(
                        (info.state, info.lease_token),
                        (JobState::Leased, Some(holder.token())),
                        "{what}: the new holder's lease untouched"
                    );
                    holder.ack().unwrap();
                }
                Fault::FailingClosure => {
                    assert_eq!(info.state, JobState::Ready, "{what}");
                    assert_eq!(info.last_error.as_deref(), Some("closure failed"), "{what}");
                    assert!(
                        matches!(lease.ack(), Err(Error::LeaseLost { .. })),
                        "{what}"
                    );
                }
                Fault::InvalidOption | Fault::Reentrant => {
                    assert_eq!(
                        (info.state, info.lease_token),
                        (JobState::Leased, Some(lease.token())),
                        "{what}: the attempt is still the caller's"
                    );
                    lease
                        .ack()
                        .unwrap_or_else(|e| panic!("{what}: the lease no longer acks: {e}"));
                }
            }
            assert_eq!(
                q.job(id).unwrap().map(|i| i.state),
                match fault {
                    Fault::FailingClosure => Some(JobState::Ready),
                    _ => None,
                },
                "{what}"
            );
            assert_eq!(
                f.clock.now_ms(),
                T0_MS + if fault == Fault::Stale { 1_001 } else { 0 }
            );
            assert_consistent(&q);
        }
    }
    assert_eq!(cases, 10 * 2 + 4 + 3, "every applicable pair was tried");
}

/// A lease stays a value the caller holds: ending it twice is refused, never a second ack.
#[test]
fn a_lease_ended_once_is_refused_afterwards() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 3, EnqueueOptions::default());
    let l = q.dequeue().unwrap().unwrap();
    l.ack().unwrap();
    assert!(matches!(l.ack(), Err(Error::LeaseLost { .. })));
    assert!(matches!(l.nack("x"), Err(Error::LeaseLost { .. })));
    assert!(matches!(
        l.ack_with(|_| Ok(())),
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(l.ack_and_next(), Err(Error::LeaseLost { .. })));
    assert_eq!(
        q.stats().unwrap().ready,
        2,
        "a refused ack_and_next leases nothing"
    );
    let out = all_ok(q.ack_batch(&q.dequeue_batch(2).unwrap()).unwrap());
    assert_eq!(out.len(), 2);
    assert!(q.is_empty().unwrap());
}

// ---------------------------------------------------------------------------------------
// Regression: the ack_with re-run loop under group commit
// ---------------------------------------------------------------------------------------

/// Many threads ack_with at once (groups form), some closures fail and one panics: every
/// succeeding job's effect is applied exactly once, every failing job is ready again with its
/// own error, no effect of a failing closure survives, and the file is consistent.
#[test]
fn concurrent_ack_with_with_failing_and_panicking_closures() {
    let f = Fixture::new();
    let q = f.open();
    let threads = 8;
    let rounds = 6;
    for round in 0..rounds {
        let ids = enqueue_n(&q, threads, EnqueueOptions::default());
        let leases = q.dequeue_batch(threads).unwrap();
        assert_eq!(leases.len(), threads);
        let barrier = Arc::new(Barrier::new(threads));
        let results: Vec<(JobId, leaseq::Result<Applied>)> = std::thread::scope(|s| {
            let hs: Vec<_> = leases
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let barrier = barrier.clone();
                    s.spawn(move || {
                        barrier.wait();
                        let r = l.ack_with(|tx| {
                            bump(tx, l.id().0)?;
                            match i % 4 {
                                1 => Err(format!("fail {}", l.id()).into()),
                                3 if round % 2 == 0 => panic!("panic {}", l.id()),
                                _ => Ok(()),
                            }
                        });
                        (l.id(), r)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let fx = effects(&q);
        for (i, (id, r)) in results.iter().enumerate() {
            let fails = i % 4 == 1 || (i % 4 == 3 && round % 2 == 0);
            if fails {
                assert!(matches!(r, Err(Error::Effect(_))), "{id}: {r:?}");
                let info = q.job(*id).unwrap().unwrap();
                assert_eq!(info.state, JobState::Ready);
                let want = if i % 4 == 1 {
                    format!("fail {id}")
                } else {
                    format!("panic {id}")
                };
                assert!(
                    info.last_error.as_deref().unwrap().contains(&want),
                    "{info:?}"
                );
                assert_eq!(fx.get(&id.0), None, "{id}: a failed effect survived");
            } else {
                assert!(matches!(r, Ok(Applied::Now)), "{id}: {r:?}");
                assert_eq!(q.job(*id).unwrap(), None);
                assert_eq!(fx.get(&id.0), Some(&1), "{id}: effect applied once");
            }
        }
        // Clear the given-back jobs for the next round.
        for l in q.dequeue_batch(threads).unwrap() {
            assert!(ids.contains(&l.id()));
            l.ack().unwrap();
        }
        assert!(q.is_empty().unwrap());
        assert_consistent(&q);
    }
}

/// A closure that succeeds on its first run and fails only when its group is replayed
/// (another member's closure failed after it in the same group): the job is given back with
/// the replay's error, and the other member's job with its own. Two threads race from a
/// barrier until the replay is seen; whatever the interleaving, the outcomes must agree with
/// how often the first closure ran.
#[test]
fn a_closure_that_fails_only_on_replay_gives_its_job_back_with_that_error() {
    let f = Fixture::new();
    let q = f.open();
    let mut replays_seen = 0;
    for _ in 0..400 {
        let ids = enqueue_n(&q, 2, EnqueueOptions::default());
        let la = q.dequeue().unwrap().unwrap();
        let lb = q.dequeue().unwrap().unwrap();
        let calls = AtomicUsize::new(0);
        let barrier = Barrier::new(2);
        let (ra, rb) = std::thread::scope(|s| {
            let a = s.spawn(|| {
                barrier.wait();
                la.ack_with(|tx| {
                    bump(tx, la.id().0)?;
                    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        Ok(())
                    } else {
                        Err("a fails on replay".into())
                    }
                })
            });
            let b = s.spawn(|| {
                barrier.wait();
                std::thread::sleep(Duration::from_micros(30));
                lb.ack_with(|tx| {
                    bump(tx, lb.id().0)?;
                    Err("b fails".into())
                })
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(matches!(rb, Err(Error::Effect(_))), "{rb:?}");
        let fx = effects(&q);
        assert_eq!(fx.get(&ids[1].0), None);
        if calls.load(Ordering::SeqCst) >= 2 {
            replays_seen += 1;
            assert!(matches!(ra, Err(Error::Effect(_))), "{ra:?}");
            let info_a = q.job(ids[0]).unwrap().unwrap();
            assert_eq!(info_a.state, JobState::Ready);
            assert_eq!(info_a.last_error.as_deref(), Some("a fails on replay"));
            assert_eq!(fx.get(&ids[0].0), None);
        } else {
            assert!(matches!(ra, Ok(Applied::Now)), "{ra:?}");
            assert_eq!(fx.get(&ids[0].0), Some(&1));
        }
        assert!(matches!(la.ack(), Err(Error::LeaseLost { .. })));
        assert!(matches!(lb.ack(), Err(Error::LeaseLost { .. })));
        // Clear what was given back.
        while let Some(l) = q.dequeue().unwrap() {
            l.ack().unwrap();
        }
        if replays_seen >= 3 {
            break;
        }
    }
    assert_consistent(&q);
    assert!(replays_seen > 0, "the replay path was never taken");
}

/// Every closure of a batch fails: the call runs once per lease plus one, each job is given
/// back with its own error, and no effect survives.
#[test]
fn ack_with_batch_where_every_closure_fails() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 5, EnqueueOptions::default());
    let leases = q.dequeue_batch(5).unwrap();
    let calls = AtomicUsize::new(0);
    let out = q
        .ack_with_batch(&leases, |tx, l| {
            calls.fetch_add(1, Ordering::SeqCst);
            bump(tx, l.id().0)?;
            Err(format!("no {}", l.id()).into())
        })
        .unwrap();
    // Each run stops at the first closure that fails, and a failed lease's closure never
    // runs again: one call per lease, in six runs.
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    for (id, r) in ids.iter().zip(&out) {
        assert!(
            matches!(r, Err(Error::Effect(e)) if e.to_string() == format!("no {id}")),
            "{r:?}"
        );
        assert_eq!(
            q.job(*id).unwrap().unwrap().last_error,
            Some(format!("no {id}"))
        );
    }
    assert!(effects(&q).is_empty());
    assert_eq!(q.stats().unwrap().ready, 5);
    assert_consistent(&q);
}

/// Two leases with one idempotency key, the first closure failing: the second applies the
/// effect (`Now`), the first job is given back, and when it comes again its key is applied:
/// `AlreadyApplied` without running the closure.
#[test]
fn shared_idempotency_key_with_the_first_closure_failing() {
    let f = Fixture::new();
    let q = f.open();
    let opts = EnqueueOptions::default().idempotency_key("k");
    let ids = enqueue_n(&q, 2, opts);
    let leases = q.dequeue_batch(2).unwrap();
    let out = q
        .ack_with_batch(&leases, |tx, l| {
            if l.id() == ids[0] {
                return Err("first fails".into());
            }
            bump(tx, 7)
        })
        .unwrap();
    assert!(matches!(out[0], Err(Error::Effect(_))), "{out:?}");
    assert!(matches!(out[1], Ok(Applied::Now)), "{out:?}");
    assert!(q.is_applied("k").unwrap());
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!(again.id(), ids[0]);
    let ran = AtomicUsize::new(0);
    assert_eq!(
        again
            .ack_with(|_| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap(),
        Applied::AlreadyApplied
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(effects(&q).get(&7), Some(&1));
    assert_consistent(&q);
}

/// A closure that calls its own queue gets `Reentrant` there and may go on: the other lease
/// it tried to ack is untouched and still current afterwards; the outer ack commits.
#[test]
fn reentrant_call_inside_a_closure_leaves_the_other_lease_current() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 2, EnqueueOptions::default());
    let la = q.dequeue().unwrap().unwrap();
    let lb = q.dequeue().unwrap().unwrap();
    let mut inner = Vec::new();
    let r = la.ack_with(|tx| {
        inner.push(lb.ack().map_err(|e| e.to_string()));
        inner.push(lb.nack("x").map(|_| ()).map_err(|e| e.to_string()));
        inner.push(
            q.ack_batch(std::slice::from_ref(&lb))
                .map(|_| ())
                .map_err(|e| e.to_string()),
        );
        bump(tx, 1)
    });
    assert_eq!(r.unwrap(), Applied::Now);
    assert!(inner.iter().all(Result::is_err), "{inner:?}");
    let info = q.job(ids[1]).unwrap().unwrap();
    assert_eq!(info.lease_token, Some(lb.token()));
    lb.ack().unwrap();
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// A stale lease and the current lease of the same job in one batch, both orders: the stale
/// one is `LeaseLost`, the current one acked; same for `ack_with_batch`, whose closure runs
/// once.
#[test]
fn stale_and_current_lease_of_one_job_in_one_batch() {
    for stale_first in [true, false] {
        for with_effect in [false, true] {
            let f = Fixture::new();
            let q = f.open();
            let id = q
                .enqueue(b"A", EnqueueOptions::default().lease(ms(1_000)))
                .unwrap()
                .id();
            let old = q.dequeue().unwrap().unwrap();
            f.clock.advance(ms(1_001));
            let new = q.dequeue().unwrap().unwrap();
            assert_eq!(new.id(), id);
            let batch = if stale_first { [old, new] } else { [new, old] };
            let (si, ci) = if stale_first { (0, 1) } else { (1, 0) };
            let runs = AtomicUsize::new(0);
            let out: Vec<Result<(), Error>> = if with_effect {
                q.ack_with_batch(&batch, |tx, _| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    bump(tx, 1)
                })
                .unwrap()
                .into_iter()
                .map(|r| r.map(drop))
                .collect()
            } else {
                q.ack_batch(&batch).unwrap()
            };
            assert!(matches!(out[si], Err(Error::LeaseLost { .. })), "{out:?}");
            assert!(out[ci].is_ok(), "{out:?}");
            if with_effect {
                assert_eq!(runs.load(Ordering::SeqCst), 1);
            }
            assert!(q.is_empty().unwrap());
            assert_consistent(&q);
        }
    }
}

/// A lease of another queue anywhere in the batch refuses the whole call, writes nothing,
/// and leaves every lease current.
#[test]
fn a_foreign_lease_refuses_the_whole_batch_and_writes_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let g = Fixture::new();
    let other = g.open();
    enqueue_n(&q, 2, EnqueueOptions::default());
    other.enqueue(b"x", EnqueueOptions::default()).unwrap();
    let mut batch = q.dequeue_batch(2).unwrap();
    batch.push(other.dequeue().unwrap().unwrap());
    assert!(matches!(
        q.ack_batch(&batch),
        Err(Error::InvalidOption { .. })
    ));
    let ran = AtomicUsize::new(0);
    assert!(matches!(
        q.ack_with_batch(&batch, |_, _| {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }),
        Err(Error::InvalidOption { .. })
    ));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let foreign = batch.pop().unwrap();
    all_ok(q.ack_batch(&batch).unwrap());
    foreign.ack().unwrap();
    assert!(q.is_empty().unwrap() && other.is_empty().unwrap());
}

/// The disk fails between the failing closure and the give-back commit: the call returns an
/// error (not `Effect`), nothing of the effect is in the file, and after the "reboot" the
/// reopen returns the job (its lease was durable).
#[cfg(feature = "sim")]
#[test]
fn disk_failure_between_the_failing_closure_and_the_give_back() {
    use leaseq::sim::SimDisk;
    let clock = ManualClock::new(T0_MS);
    let disk = SimDisk::new(11);
    let q = Queue::builder()
        .clock(clock.clone())
        .open_backend(disk.backend())
        .unwrap();
    let id = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    let r = l.ack_with(|tx| {
        bump(tx, 1)?;
        disk.crash_now();
        Err("effect failed as the power went".into())
    });
    assert!(
        matches!(r, Err(Error::CommitFailed { .. } | Error::Storage(_))),
        "{r:?}"
    );
    drop(l);
    drop(q);
    let rebooted = SimDisk::from_image(disk.durable_image(), 12);
    let q = Queue::builder()
        .clock(clock)
        .open_backend(rebooted.backend())
        .unwrap();
    assert_eq!(q.recovery().leases_returned, 1);
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.state, JobState::Ready);
    assert!(effects(&q).is_empty());
    assert_consistent(&q);
}
