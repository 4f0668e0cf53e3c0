//! Never strand a lease, never let one bad row stop the queue (cases C34-C37): every call on a
//! lease borrows it, so after any refusal the caller can still end the attempt; a call that
//! ends it on its own (a failing `ack_with` closure) records why; batch acks report each lease;
//! a blocked `dequeue_timeout` sees a clock jump; a damaged job row is quarantined and the rest
//! of the queue goes on.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{
    Fixture, LEASE, T0_MS, all_ok, assert_consistent, bump, effects, flip_record_byte,
    overwrite_record,
};
use leaseq::{
    Applied, Clock, EnqueueOptions, Enqueued, Error, JobId, JobState, Lease, ManualClock, Queue,
};
use redb::TableDefinition;

/// leaseq's own tables, written behind its back to plant damage (as a flaky disk would).
const READY: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("leaseq_ready");

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn enqueue_n(q: &Queue, n: usize, opts: EnqueueOptions) -> Vec<JobId> {
    (0..n)
        .map(|i| {
            q.enqueue(format!("job {i}").as_bytes(), opts.clone())
                .unwrap()
                .id()
        })
        .collect()
}

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
// C37: one bad record
// ---------------------------------------------------------------------------------------

/// C37: 20 ready jobs, one record overwritten with garbage. The other 19 are dequeued and
/// acked; the bad one is quarantined (its bytes kept, reported by `check`, `stats` and
/// `quarantined`), keeps its dedup key, and is removable; no call returns `Corrupted`
/// forever.
#[test]
fn c37_one_garbage_record_is_quarantined_and_the_other_19_are_served() {
    let f = Fixture::new();
    let q = f.open();
    let ids: Vec<JobId> = (0..20)
        .map(|i| {
            q.enqueue(
                format!("job {i}").as_bytes(),
                EnqueueOptions::default().dedup_key(format!("d{i}")),
            )
            .unwrap()
            .id()
        })
        .collect();
    let bad = ids[7];
    let garbage = b"\x01not a leaseq record at all, just bytes".to_vec();
    overwrite_record(&q, bad, &garbage);
    assert!(matches!(q.job(bad), Err(Error::Corrupted { .. })));
    assert!(
        q.check().unwrap().iter().any(|v| v.job_id == Some(bad)),
        "check reports the damaged row"
    );

    let mut served = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        served.push(l.id());
        l.ack().unwrap();
    }
    let want: Vec<JobId> = ids.iter().copied().filter(|&id| id != bad).collect();
    assert_eq!(served, want, "the other 19, in order");

    let s = q.stats().unwrap();
    assert_eq!((s.total, s.quarantined), (0, 1), "{s:?}");
    let listed = q.quarantined(None, 10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].job_id, bad);
    assert_eq!(listed[0].record_bytes, garbage.len());
    assert!(
        listed[0].reason.contains("checksum"),
        "{:?}",
        listed[0].reason
    );
    assert_eq!(q.quarantined_record(bad).unwrap(), Some(garbage));
    let v = q.check().unwrap();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].detail.starts_with("quarantined"), "{v:?}");
    // Its dedup key stays held by it (a Duplicate names a job inspection can find, as
    // quarantined) until it is removed.
    assert_eq!(
        q.enqueue(b"again", EnqueueOptions::default().dedup_key("d7"))
            .unwrap(),
        Enqueued::Duplicate(bad)
    );
    assert!(
        matches!(q.job(bad), Err(Error::Corrupted { detail }) if detail.contains("quarantined"))
    );
    q.remove(bad).unwrap();
    assert!(matches!(q.remove(bad), Err(Error::JobNotFound { .. })));
    assert_eq!(q.stats().unwrap().quarantined, 0);
    assert!(q.quarantined(None, 10).unwrap().is_empty());
    assert!(matches!(
        q.enqueue(b"again", EnqueueOptions::default().dedup_key("d7"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// C37, leased: a leased job's record is damaged, then the process goes away. The reopen
/// recovers every other lease, quarantines the bad one, and reports it in `Recovery`.
#[test]
fn c37_a_damaged_leased_record_is_quarantined_by_the_reopen() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 5, EnqueueOptions::default());
    let leases = q.dequeue_batch(5).unwrap();
    flip_record_byte(&q, ids[2], 11, 0x40);
    drop(leases);
    drop(q);
    let q = f.open();
    let r = q.recovery();
    assert_eq!((r.leases_returned, r.quarantined), (4, 1), "{r:?}");
    let served: Vec<JobId> = std::iter::from_fn(|| q.dequeue().unwrap())
        .map(|l| {
            l.ack().unwrap();
            l.id()
        })
        .collect();
    assert_eq!(served, [ids[0], ids[1], ids[3], ids[4]]);
    assert_eq!(q.quarantined(None, 10).unwrap()[0].job_id, ids[2]);
    q.remove(ids[2]).unwrap();
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// A lease whose row is damaged after delivery: its calls are `Corrupted` (nothing written)
/// until the lease ends, when the sweep quarantines the row; then they are `LeaseLost`.
#[test]
fn a_damaged_leased_row_is_corrupted_for_its_holder_until_its_lease_ends() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 2, EnqueueOptions::default().lease(ms(1_000)));
    let l = q.dequeue().unwrap().unwrap();
    flip_record_byte(&q, l.id(), 3, 0x01);
    assert!(matches!(l.ack(), Err(Error::Corrupted { .. })));
    assert!(matches!(l.nack("x"), Err(Error::Corrupted { .. })));
    let other = q.dequeue().unwrap().unwrap();
    assert_eq!(other.id(), ids[1], "the queue goes on");
    other.ack().unwrap();
    f.clock.advance(ms(1_001));
    assert!(q.dequeue().unwrap().is_none(), "the sweep quarantined it");
    assert!(matches!(l.ack(), Err(Error::LeaseLost { .. })));
    assert_eq!(q.stats().unwrap().quarantined, 1);
}

/// A dead job's damaged row is never met by a dequeue: `check` reports it and `remove`
/// deletes it (with its dedup key), whatever its state.
#[test]
fn a_damaged_dead_row_is_reported_and_removable() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"A", EnqueueOptions::default().dedup_key("k"))
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().fail("dead").unwrap();
    flip_record_byte(&q, id, 5, 0x80);
    assert!(q.check().unwrap().iter().any(|v| v.job_id == Some(id)));
    assert!(matches!(q.requeue_dead(id), Err(Error::Corrupted { .. })));
    q.remove(id).unwrap();
    assert!(matches!(
        q.enqueue(b"B", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// An index entry naming no job (or naming a job in another state) is dropped by the pass
/// that meets it; the jobs around it are served.
#[test]
fn a_stray_ready_entry_is_dropped_and_the_queue_goes_on() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 3, EnqueueOptions::default());
    {
        let tx = q.database().begin_write().unwrap();
        let mut ready = tx.open_table(READY).unwrap();
        ready.insert((0, 0, 999_999), ()).unwrap(); // first in line, no such job
        ready.insert((0, 1, ids[2].0), ()).unwrap(); // names job 3 at a wrong place
        drop(ready);
        tx.commit().unwrap();
    }
    assert!(!q.check().unwrap().is_empty());
    let served: Vec<JobId> = q.dequeue_batch(10).unwrap().iter().map(Lease::id).collect();
    let mut rest: Vec<JobId> = std::iter::from_fn(|| q.dequeue().unwrap())
        .map(|l| l.id())
        .collect();
    let mut all = served.clone();
    all.append(&mut rest);
    all.sort();
    assert_eq!(all, ids, "every job served once");
    assert_eq!(q.stats().unwrap().quarantined, 0);
}

/// Byte flips inside job records (not redb's pages), across every state: every undamaged job
/// drains as enqueued, every damaged one is quarantined or reported, and after removing the
/// damaged rows the file is consistent.
#[test]
fn byte_flips_in_job_records_never_stop_the_drain() {
    let mut rng = fastrand::Rng::with_seed(0xC37);
    for round in 0..6 {
        let f = Fixture::new();
        let q = f.open();
        let n = 60;
        let ids: Vec<JobId> = (0..n)
            .map(|i| {
                let mut o = EnqueueOptions::default().dedup_key(format!("d{i}"));
                if i % 5 == 1 {
                    o = o.delay(Duration::from_secs(10));
                }
                q.enqueue(format!("payload {round}/{i}").as_bytes(), o)
                    .unwrap()
                    .id()
            })
            .collect();
        // Some leased (kept across a reopen), some dead.
        let leased = q.dequeue_batch(12).unwrap();
        for l in &leased[..4] {
            l.fail("dead on purpose").unwrap();
        }
        let failed: Vec<JobId> = leased[..4].iter().map(Lease::id).collect();
        let mut damaged: Vec<JobId> = ids.clone();
        rng.shuffle(&mut damaged);
        damaged.truncate(rng.usize(1..12));
        damaged.sort();
        for &id in &damaged {
            flip_record_byte(&q, id, rng.usize(..), rng.u8(..));
        }
        drop(leased);
        drop(q);
        let q = f.open();
        f.clock.advance(Duration::from_secs(11));
        let mut served = Vec::new();
        loop {
            let batch = q.dequeue_batch(rng.usize(1..8)).unwrap();
            if batch.is_empty() {
                break;
            }
            for (l, r) in batch.iter().zip(q.ack_batch(&batch).unwrap()) {
                r.unwrap();
                assert_eq!(
                    l.payload(),
                    format!(
                        "payload {round}/{}",
                        ids.iter().position(|&i| i == l.id()).unwrap()
                    )
                    .as_bytes()
                );
                served.push(l.id());
            }
        }
        // Undamaged and not dead: served, each once.
        let dead: Vec<JobId> = (1..=n as u64)
            .map(JobId)
            .filter(|&id| matches!(q.job(id), Ok(Some(i)) if i.state == JobState::Dead))
            .collect();
        served.sort();
        let want: Vec<JobId> = ids
            .iter()
            .copied()
            .filter(|id| !damaged.contains(id) && !dead.contains(id))
            .collect();
        assert_eq!(served, want, "round {round}: damaged {damaged:?}");
        let undamaged_failed: Vec<JobId> = failed
            .iter()
            .copied()
            .filter(|id| !damaged.contains(id))
            .collect();
        assert_eq!(dead, undamaged_failed, "round {round}");
        // Every damaged row is quarantined or (dead, never met) reported by check.
        let reported: Vec<JobId> = q.check().unwrap().iter().filter_map(|v| v.job_id).collect();
        for id in &damaged {
            assert!(
                reported.contains(id),
                "round {round}: damaged {id} not reported"
            );
            q.remove(*id).unwrap();
        }
        for id in dead {
            q.remove(id).unwrap();
        }
        assert!(q.is_empty().unwrap(), "round {round}");
        assert_consistent(&q);
    }
}
