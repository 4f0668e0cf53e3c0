//! Enqueue inside a transaction (issue 10, C33): follow-up jobs from an `ack_with` effect, and
//! `Queue::write` for the caller's own writes plus new jobs. Jobs enqueued through a `Tx`
//! exist if and only if its transaction committed.
//!
//! Adversarial tests of enqueue inside a transaction (`Tx`): `ack_with` follow-ups and
//! `Queue::write`.

use crate::common;
use crate::common::{EFFECTS, Fixture, assert_consistent, bump, drain_payloads, effects, new_id};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobState};
use redb::ReadableDatabase;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[test]
fn a_follow_up_enqueued_in_ack_with_commits_with_the_effect() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(
        b"step-1",
        EnqueueOptions::default().idempotency_key("order-7"),
    )
    .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let mut follow = None;
    let applied = l
        .ack_with(|tx| {
            bump(tx, 1)?;
            follow = Some(tx.enqueue(b"step-2", EnqueueOptions::default().priority(-1))?);
            Ok(())
        })
        .unwrap();
    assert_eq!(applied, Applied::Now);
    let follow = new_id(follow.unwrap());
    assert_eq!(effects(&q).get(&1), Some(&1));
    assert_eq!(q.job(follow).unwrap().unwrap().state, JobState::Ready);
    assert!(q.is_applied("order-7").unwrap());
    assert_eq!(drain_payloads(&q), vec![b"step-2".to_vec()]);
    assert_consistent(&q);
}

#[test]
fn a_failing_effect_leaves_no_follow_up_and_frees_its_dedup_key() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"parent", EnqueueOptions::default().max_attempts(3))
        .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let r = l.ack_with(|tx| {
        bump(tx, 1)?;
        tx.enqueue(
            b"child",
            EnqueueOptions::default().dedup_key("child-of-parent"),
        )?;
        Err("the effect failed after enqueueing".into())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    // Only the parent is there, given back; no effect, no child.
    assert_eq!(q.stats().unwrap().ready, 1);
    assert!(effects(&q).is_empty());
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!(again.payload(), b"parent");
    assert_eq!(again.attempt(), 2);
    // The child's dedup key was never taken.
    let e = q
        .enqueue(
            b"other",
            EnqueueOptions::default().dedup_key("child-of-parent"),
        )
        .unwrap();
    assert!(matches!(e, Enqueued::New(_)), "{e:?}");
    assert_consistent(&q);
}

#[test]
fn a_refused_follow_up_is_the_closures_to_handle_and_the_ack_still_commits() {
    let f = Fixture::new();
    let q = f.builder().payload_bytes_max(16).open(&f.path).unwrap();
    q.enqueue(b"p", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let mut refusal = None;
    l.ack_with(|tx| {
        refusal = Some(tx.enqueue(&[0; 17], EnqueueOptions::default()).unwrap_err());
        bump(tx, 9)
    })
    .unwrap();
    assert!(
        matches!(refusal, Some(Error::PayloadTooLarge { .. })),
        "{refusal:?}"
    );
    assert!(q.is_empty().unwrap());
    assert_eq!(effects(&q).get(&9), Some(&1));
    assert_consistent(&q);
}

#[test]
fn follow_ups_in_a_batch_ack_commit_only_for_the_leases_whose_effect_committed() {
    let f = Fixture::new();
    let q = f.open();
    for i in 0..4u8 {
        q.enqueue(&[i], EnqueueOptions::default()).unwrap();
    }
    let leases = q.dequeue_batch(4).unwrap();
    assert_eq!(leases.len(), 4);
    let out = q
        .ack_with_batch(&leases, |tx, l| {
            let i = l.payload()[0];
            tx.enqueue(&[100 + i], EnqueueOptions::default())?;
            if i == 2 {
                return Err("lease 2 fails".into());
            }
            bump(tx, u64::from(i))
        })
        .unwrap();
    assert!(
        out[0].is_ok() && out[1].is_ok() && out[3].is_ok(),
        "{out:?}"
    );
    assert!(matches!(out[2], Err(Error::Effect(_))), "{out:?}");
    let mut left = drain_payloads(&q);
    left.sort();
    // Job 2 given back; the follow-ups of 0, 1 and 3 exist, that of 2 does not.
    assert_eq!(left, vec![vec![2], vec![100], vec![101], vec![103]]);
    assert_consistent(&q);
}

#[test]
fn write_commits_the_callers_rows_and_jobs_together() {
    let f = Fixture::new();
    let q = f.open();
    let ids = q
        .write(|tx| {
            bump(tx, 5)?;
            Ok(tx.enqueue_batch([
                (&b"a"[..], EnqueueOptions::default()),
                (
                    &b"b"[..],
                    EnqueueOptions::default().delay(Duration::from_secs(60)),
                ),
            ])?)
        })
        .unwrap();
    assert_eq!(ids.len(), 2);
    assert_eq!(effects(&q).get(&5), Some(&1));
    assert_eq!(
        q.job(new_id(ids[0])).unwrap().unwrap().state,
        JobState::Ready
    );
    assert_eq!(
        q.job(new_id(ids[1])).unwrap().unwrap().state,
        JobState::Scheduled
    );
    // A write that only writes the caller's rows commits too.
    q.write(|tx| bump(tx, 6)).unwrap();
    assert_eq!(effects(&q).get(&6), Some(&1));
    assert_consistent(&q);
}

#[test]
fn a_failed_write_leaves_nothing_and_its_ids_and_keys_are_not_lost() {
    let f = Fixture::new();
    let q = f.open();
    let before = q.enqueue(b"x", EnqueueOptions::default()).unwrap();
    let r: leaseq::Result<()> = q.write(|tx| {
        bump(tx, 1)?;
        tx.enqueue(b"y", EnqueueOptions::default().dedup_key("k"))?;
        Err("changed my mind".into())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    let panicked: leaseq::Result<()> = q.write(|tx| {
        tx.enqueue(b"z", EnqueueOptions::default())?;
        panic!("boom in write");
    });
    match panicked {
        Err(Error::Effect(e)) => assert!(e.to_string().contains("boom in write"), "{e}"),
        other => panic!("expected Effect, got {other:?}"),
    }
    assert!(effects(&q).is_empty());
    assert_eq!(q.len().unwrap(), 1);
    let after = q
        .enqueue(b"y2", EnqueueOptions::default().dedup_key("k"))
        .unwrap();
    // The key is free, and ids stay unique and increasing.
    assert!(new_id(after) > new_id(before));
    assert_eq!(drain_payloads(&q), vec![b"x".to_vec(), b"y2".to_vec()]);
    assert_consistent(&q);
}

// A write whose closure passes on the disk's error from its own table writes (redb's
// StorageError::Io or PreviousIo, bare or in a TableError) is `Storage`, telling the caller the
// disk failed; any other error of its own stays `Effect`, a value too large for redb included
// (it is not leaseq's payload limit). Nothing commits either way.
#[test]
fn a_write_passes_on_the_disks_error_and_keeps_its_own_as_effect() {
    let f = Fixture::new();
    let q = f.open();
    // The closure may run again (a replay), so it makes its error each time.
    let fail = |make: &dyn Fn() -> leaseq::BoxError| {
        q.write(|tx| -> Result<(), leaseq::BoxError> {
            bump(tx, 1)?;
            tx.enqueue(b"y", EnqueueOptions::default())?;
            Err(make())
        })
    };
    let r = fail(&|| Box::new(redb::StorageError::Io(std::io::Error::other("the disk"))));
    assert!(
        matches!(r, Err(Error::Storage(redb::Error::Io(_)))),
        "{r:?}"
    );
    let r = fail(&|| Box::new(redb::TableError::Storage(redb::StorageError::PreviousIo)));
    assert!(
        matches!(r, Err(Error::Storage(redb::Error::PreviousIo))),
        "{r:?}"
    );
    let r = fail(&|| Box::new(redb::StorageError::ValueTooLarge(usize::MAX)));
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    let r = fail(&|| "the caller's own reason".into());
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    assert!(effects(&q).is_empty());
    assert_eq!(q.len().unwrap(), 0);
    assert_consistent(&q);
}

#[test]
fn a_dedup_key_held_in_the_same_transaction_is_a_duplicate() {
    let f = Fixture::new();
    let q = f.open();
    let (a, b) = q
        .write(|tx| {
            let a = tx.enqueue(b"1", EnqueueOptions::default().dedup_key("d"))?;
            let b = tx.enqueue(b"2", EnqueueOptions::default().dedup_key("d"))?;
            Ok((a, b))
        })
        .unwrap();
    let a = new_id(a);
    assert_eq!(b, Enqueued::Duplicate(a));
    assert_eq!(q.len().unwrap(), 1);
}

#[test]
fn calling_the_queue_inside_write_is_reentrant_and_nothing_commits() {
    let f = Fixture::new();
    let q = f.open();
    let q2 = q.clone();
    let r: leaseq::Result<()> = q.write(move |tx| {
        bump(tx, 1)?;
        q2.enqueue(b"inner", EnqueueOptions::default())?;
        Ok(())
    });
    // The caller's mistake is said as itself, not as its closure failing (issue 42).
    assert!(matches!(r, Err(Error::Reentrant)), "{r:?}");
    assert!(
        r.unwrap_err().to_string().contains("from inside a closure"),
        "the message names the mistake"
    );
    assert!(q.is_empty().unwrap());
    assert!(effects(&q).is_empty());
}

#[test]
fn a_blocked_consumer_wakes_when_a_write_enqueues() {
    let f = Fixture::new();
    let q = f.open();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let l = q.dequeue_timeout(Duration::from_secs(60)).unwrap();
            (l.map(|l| l.payload().to_vec()), started.elapsed())
        })
    };
    // Give the consumer time to block (if it has not yet, it finds the job at once).
    std::thread::sleep(Duration::from_millis(100));
    q.write(|tx| {
        tx.enqueue(b"woken", EnqueueOptions::default())
            .map(drop)
            .map_err(Into::into)
    })
    .unwrap();
    let (got, waited) = consumer.join().unwrap();
    assert_eq!(got.as_deref(), Some(&b"woken"[..]));
    assert!(
        waited < Duration::from_secs(30),
        "woke only after {waited:?}"
    );
}

/// Concurrent enqueues share group transactions with writes that fail: every enqueue that
/// returned `Ok` is there, and nothing of a failed write is.
#[test]
fn failing_writes_never_take_concurrent_calls_with_them() {
    let f = Fixture::new();
    let q = f.open();
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let q = q.clone();
        threads.push(std::thread::spawn(move || {
            let mut ok = Vec::new();
            for i in 0..50u64 {
                let n = t * 1000 + i;
                if t % 2 == 0 {
                    ok.push(new_id(
                        q.enqueue(&n.to_be_bytes(), EnqueueOptions::default())
                            .unwrap(),
                    ));
                } else {
                    let fail = i % 3 == 0;
                    let r = q.write(|tx| {
                        bump(tx, n)?;
                        let id = tx.enqueue(&n.to_be_bytes(), EnqueueOptions::default())?;
                        if fail {
                            return Err("fail on purpose".into());
                        }
                        Ok(id)
                    });
                    match (fail, r) {
                        (true, Err(Error::Effect(_))) => {}
                        (false, Ok(id)) => ok.push(new_id(id)),
                        (fail, r) => panic!("write {n} (fail {fail}): {r:?}"),
                    }
                }
            }
            ok
        }));
    }
    let ok: Vec<leaseq::JobId> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(q.len().unwrap(), ok.len() as u64);
    for id in &ok {
        assert!(q.job(*id).unwrap().is_some(), "job {id:?} lost");
    }
    let rtx = q.database().begin_read().unwrap();
    let table = rtx.open_table(EFFECTS).unwrap();
    for t in [1u64, 3] {
        for i in 0..50u64 {
            let present = redb::ReadableTable::get(&table, t * 1000 + i)
                .unwrap()
                .is_some();
            assert_eq!(present, i % 3 != 0, "effect of write {t}/{i}");
        }
    }
    drop(table);
    drop(rtx);
    assert_consistent(&q);
}

/// Power lost at every write and sync of an `ack_with` that enqueues a follow-up, and of a
/// `Queue::write`, on the simulator: after the reboot the follow-up exists if and only if the
/// effect, the marker and the ack committed (the parent gone); never one without the other.
#[cfg(feature = "sim")]
mod power_loss {
    use super::*;
    use leaseq::sim::SimDisk;
    use leaseq::{ManualClock, Queue};

    fn open(disk: &SimDisk) -> Queue {
        Queue::builder()
            .clock(ManualClock::new(common::T0_MS))
            .retry(leaseq::RetryPolicy::immediate())
            .open_backend(disk.backend())
            .unwrap()
    }

    /// (parent there, follow-up there, effect row there, marker there) after a reboot.
    fn observe(q: &Queue) -> (bool, bool, bool, bool) {
        let mut parent = false;
        let mut child = false;
        for state in [JobState::Ready, JobState::Scheduled, JobState::Leased] {
            for j in q.jobs(state, None, 100).unwrap().jobs {
                match q.payload(j.id).unwrap().unwrap().as_slice() {
                    b"parent" => parent = true,
                    b"child" => child = true,
                    other => panic!("unexpected job {other:?}"),
                }
            }
        }
        (
            parent,
            child,
            effects(q).contains_key(&1),
            q.is_applied("parent-key").unwrap(),
        )
    }

    /// Runs `step` on a queue holding one leased parent job, crashing at each of its mutating
    /// calls in turn, and checks every reboot with `judge`. Returns the number of crash
    /// points tried.
    fn every_crash_point(
        step: impl Fn(&Queue),
        judge: impl Fn((bool, bool, bool, bool), &str),
    ) -> u64 {
        let base = SimDisk::new(11);
        let q = open(&base);
        q.enqueue(
            b"parent",
            EnqueueOptions::default().idempotency_key("parent-key"),
        )
        .unwrap();
        drop(q);
        let image = base.live_image();
        let mut k = 0;
        loop {
            let disk = SimDisk::from_image(image.clone(), 500 + k);
            let q = open(&disk);
            disk.crash_after(k);
            step(&q);
            let crashed = disk.is_crashed();
            drop(q);
            let reboot = SimDisk::from_image(disk.crash_image(), 900 + k);
            let q = open(&reboot);
            let seen = observe(&q);
            judge(
                seen,
                &format!("power lost at mutating call {k} (crashed: {crashed})"),
            );
            assert_consistent(&q);
            if !crashed {
                // The whole step ran without reaching the crash point: every point was tried.
                assert!(seen.1, "the step committed without a crash: {seen:?}");
                return k;
            }
            k += 1;
        }
    }

    #[test]
    fn a_follow_up_exists_iff_its_parents_ack_committed() {
        let points = every_crash_point(
            |q| {
                let l = match q.dequeue() {
                    Ok(Some(l)) => l,
                    _ => return,
                };
                let _ = l.ack_with(|tx| {
                    bump(tx, 1)?;
                    tx.enqueue(b"child", EnqueueOptions::default())?;
                    Ok(())
                });
            },
            |(parent, child, effect, marker), at| {
                assert_eq!(child, effect, "{at}: follow-up {child}, effect {effect}");
                assert_eq!(child, marker, "{at}: follow-up {child}, marker {marker}");
                assert_eq!(child, !parent, "{at}: follow-up {child}, parent {parent}");
            },
        );
        assert!(points > 3, "only {points} crash points");
    }

    #[test]
    fn a_writes_rows_and_jobs_survive_power_loss_together() {
        let points = every_crash_point(
            |q| {
                let _ = q.write(|tx| {
                    bump(tx, 1)?;
                    tx.enqueue(b"child", EnqueueOptions::default())?;
                    Ok(())
                });
            },
            |(parent, child, effect, _), at| {
                assert!(parent, "{at}: the parent was not touched");
                assert_eq!(child, effect, "{at}: job {child}, row {effect}");
            },
        );
        assert!(points > 2, "only {points} crash points");
    }
}

const READY_T: redb::TableDefinition<(u32, u64, u64), ()> =
    redb::TableDefinition::new("leaseq_ready");

const DEDUP_T: redb::TableDefinition<&[u8], u64> = redb::TableDefinition::new("leaseq_dedup");

const JOBS_T: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("leaseq_jobs");

/// A follow-up whose dedup key is the parent's own: at enqueue time the parent still holds
/// it, so the follow-up is a `Duplicate` of the parent, which the same transaction deletes.
#[test]
fn follow_up_with_parents_dedup_key_is_not_silently_lost() {
    let f = Fixture::new();
    let q = f.open();
    let parent = new_id(
        q.enqueue(b"parent", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
    );
    let l = q.dequeue().unwrap().unwrap();
    let mut got = None;
    l.ack_with(|tx| {
        got = Some(tx.enqueue(b"child", EnqueueOptions::default().dedup_key("k"))?);
        Ok(())
    })
    .unwrap();
    let got = got.unwrap();
    assert_consistent(&q);
    let left = drain_payloads(&q);
    // Whatever it answered, the id it named must exist after the commit (or the child must).
    match got {
        Enqueued::New(_) => assert_eq!(left, vec![b"child".to_vec()]),
        Enqueued::Duplicate(id) | Enqueued::DuplicateDead(id) | Enqueued::Replaced(id) => {
            assert!(
                id != parent && left.is_empty(),
                "follow-up answered {got:?} (the parent, acked in the same transaction): \
                 after the commit no job carries the follow-up's work; left = {left:?}"
            );
        }
    }
}

/// Same with a second lease of the batch: lease A's follow-up takes lease B's dedup key.
#[test]
fn follow_up_with_dedup_key_of_another_lease_in_the_batch() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"a", EnqueueOptions::default()).unwrap();
    q.enqueue(b"b", EnqueueOptions::default().dedup_key("kb"))
        .unwrap();
    let ls = q.dequeue_batch(2).unwrap();
    let mut got = None;
    let out = q
        .ack_with_batch(&ls, |tx, l| {
            if l.payload() == b"a" {
                got = Some(tx.enqueue(b"child", EnqueueOptions::default().dedup_key("kb"))?);
            }
            Ok(())
        })
        .unwrap();
    common::all_ok(out);
    assert_consistent(&q);
    let left = drain_payloads(&q);
    assert!(
        matches!(got, Some(Enqueued::New(_))) && left == vec![b"child".to_vec()],
        "follow-up answered {got:?} although its key's holder was acked in the same \
         commit; jobs left = {left:?}"
    );
}

/// A follow-up carrying the parent's idempotency key: by design its effect is already
/// applied (exactly once per key), so it is acked without running.
#[test]
fn follow_up_with_parents_idempotency_key_is_already_applied() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"p", EnqueueOptions::default().idempotency_key("idem"))
        .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    l.ack_with(|tx| {
        bump(tx, 1)?;
        tx.enqueue(b"c", EnqueueOptions::default().idempotency_key("idem"))?;
        Ok(())
    })
    .unwrap();
    assert_consistent(&q);
    let c = q.dequeue().unwrap().unwrap();
    let mut ran = false;
    let a = c
        .ack_with(|tx| {
            ran = true;
            bump(tx, 2)
        })
        .unwrap();
    assert_eq!(a, Applied::AlreadyApplied);
    assert!(!ran);
    assert_eq!(effects(&q).get(&2), None);
    assert_consistent(&q);
}

/// `ack_with_and_next` may lease the follow-up it just enqueued, in the same commit.
#[test]
fn ack_with_and_next_can_lease_its_own_follow_up() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"p", EnqueueOptions::default()).unwrap();
    q.enqueue(b"other", EnqueueOptions::default().priority(5))
        .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let mut child = None;
    let (a, next) = l
        .ack_with_and_next(|tx| {
            child = Some(new_id(
                tx.enqueue(b"child", EnqueueOptions::default().priority(-5))?,
            ));
            Ok(())
        })
        .unwrap();
    assert_eq!(a, Applied::Now);
    let next = next.expect("a next lease");
    assert_eq!(next.payload(), b"child");
    assert_eq!(next.id(), child.unwrap());
    assert_eq!(q.job(next.id()).unwrap().unwrap().state, JobState::Leased);
    assert_consistent(&q);
    next.ack().unwrap();
    assert_eq!(drain_payloads(&q), vec![b"other".to_vec()]);
    assert_consistent(&q);
}

/// A failing closure in `ack_with_and_next`: no follow-up, no next lease, parent given back.
#[test]
fn ack_with_and_next_failing_closure_leaves_nothing() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"p", EnqueueOptions::default().max_attempts(5))
        .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let r = l.ack_with_and_next(|tx| {
        tx.enqueue(
            b"child",
            EnqueueOptions::default().priority(-5).dedup_key("c"),
        )?;
        Err("boom".into())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    assert_eq!(q.stats().unwrap().total, 1);
    assert_eq!(drain_payloads(&q), vec![b"p".to_vec()]);
    assert!(matches!(
        q.enqueue(b"x", EnqueueOptions::default().dedup_key("c"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// A delayed follow-up is scheduled at the call's clock plus its delay.
#[test]
fn delayed_follow_up_is_scheduled_and_then_due() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"p", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let mut id = None;
    let (_, next) = l
        .ack_with_and_next(|tx| {
            id = Some(new_id(tx.enqueue(
                b"later",
                EnqueueOptions::default().delay(Duration::from_secs(10)),
            )?));
            Ok(())
        })
        .unwrap();
    assert!(next.is_none(), "a delayed follow-up was leased at once");
    let info = q.job(id.unwrap()).unwrap().unwrap();
    assert_eq!(info.state, JobState::Scheduled);
    assert_eq!(info.run_at_ms, common::T0_MS + 10_000);
    assert!(q.dequeue().unwrap().is_none());
    f.clock.advance(Duration::from_secs(10));
    assert_eq!(drain_payloads(&q), vec![b"later".to_vec()]);
    assert_consistent(&q);
}

/// Oversized and empty batches inside a Tx are refused, nothing written, the call goes on.
#[test]
fn oversized_and_empty_batches_inside_tx_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let payloads: Vec<Vec<u8>> = (0..=leaseq::BATCH_MAX)
        .map(|i| i.to_le_bytes().to_vec())
        .collect();
    let (big, empty) = q
        .write(|tx| {
            let big = tx
                .enqueue_batch(
                    payloads
                        .iter()
                        .map(|p| (p.as_slice(), EnqueueOptions::default())),
                )
                .unwrap_err();
            let empty = tx.enqueue_batch(std::iter::empty()).unwrap_err();
            bump(tx, 1)?;
            tx.enqueue(b"after", EnqueueOptions::default())?;
            Ok((big, empty))
        })
        .unwrap();
    assert!(matches!(big, Error::InvalidOption { .. }), "{big:?}");
    assert!(matches!(empty, Error::InvalidOption { .. }), "{empty:?}");
    assert_eq!(q.stats().unwrap().total, 1);
    assert_eq!(effects(&q).get(&1), Some(&1));
    assert_consistent(&q);
    // A batch refused on its last job writes none of the others.
    let mut ok: Vec<(&[u8], EnqueueOptions)> = vec![(b"x", EnqueueOptions::default()); 5];
    ok.push((b"y", EnqueueOptions::default().dedup_key(vec![b'k'; 513])));
    let r = q
        .write(|tx| Ok(tx.enqueue_batch(ok.iter().cloned()).unwrap_err()))
        .unwrap();
    assert!(matches!(r, Error::KeyTooLong { .. }), "{r:?}");
    assert_eq!(q.stats().unwrap().total, 1);
    assert_consistent(&q);
}

/// Refusals swallowed by the closure: nothing of them written, later enqueues fine.
#[test]
fn swallowed_refusals_write_nothing() {
    let f = Fixture::new();
    let q = f.builder().payload_bytes_max(8).open(&f.path).unwrap();
    let ids = q
        .write(|tx| {
            let _ = tx.enqueue(&[0; 9], EnqueueOptions::default().dedup_key("a"));
            let _ = tx.enqueue(b"x", EnqueueOptions::default().dedup_key(vec![0u8; 513]));
            let _ = tx.enqueue(
                b"x",
                EnqueueOptions::default()
                    .dedup_key("b")
                    .delay(leaseq::DELAY_MAX + Duration::from_secs(1)),
            );
            let _ = tx.enqueue(
                b"x",
                EnqueueOptions::default().dedup_key("c").max_attempts(0),
            );
            let a = tx.enqueue(b"ok-a", EnqueueOptions::default().dedup_key("a"))?;
            let b = tx.enqueue(b"ok-b", EnqueueOptions::default().dedup_key("b"))?;
            let c = tx.enqueue(b"ok-c", EnqueueOptions::default().dedup_key("c"))?;
            Ok([a, b, c])
        })
        .unwrap();
    for e in ids {
        assert!(matches!(e, Enqueued::New(_)), "{ids:?}");
    }
    assert_eq!(q.stats().unwrap().total, 3);
    assert_consistent(&q);
}

/// A storage error mid-enqueue (the closure holds `leaseq_ready` open, so the job row is
/// written and its index entry is not): swallowed by the closure, the call must still fail
/// with `Effect` and leave no half job.
#[test]
fn swallowed_storage_error_mid_enqueue_fails_the_write() {
    let f = Fixture::new();
    let q = f.open();
    let mut inner = Vec::new();
    let r = q.write(|tx| {
        bump(tx, 1)?;
        let held = tx.open_table(READY_T)?;
        let e1 = tx.enqueue(b"half", EnqueueOptions::default().dedup_key("h"));
        drop(held);
        let e2 = tx.enqueue(b"after", EnqueueOptions::default());
        inner.push(format!("{e1:?} / {e2:?}"));
        Ok(())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}; inner {inner:?}");
    assert_eq!(q.stats().unwrap().total, 0, "inner {inner:?}");
    assert!(effects(&q).is_empty());
    assert!(matches!(
        q.enqueue(b"x", EnqueueOptions::default().dedup_key("h"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// The same inside `ack_with`: the lease stays current, nothing commits.
#[test]
fn swallowed_storage_error_in_ack_with_fails_the_call() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"p", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    // leaseq's tables are held open in ack_with: the closure cannot open one itself.
    let r = l.ack_with(|tx| {
        let e = tx.open_table(READY_T).err();
        assert!(e.is_some(), "leaseq_ready opened inside ack_with");
        let e = tx.open_table(JOBS_T).err();
        assert!(e.is_some(), "leaseq_jobs opened inside ack_with");
        bump(tx, 3)
    });
    assert_eq!(r.unwrap(), Applied::Now);
    assert_consistent(&q);
}

/// A write that opens `leaseq_jobs` itself gets redb's refusal; swallowed, the write goes on.
#[test]
fn write_opening_leaseq_jobs_is_refused_by_redb() {
    let f = Fixture::new();
    let q = f.open();
    let r = q
        .write(|tx| {
            let e = tx.open_table(JOBS_T).err().map(|e| e.to_string());
            tx.enqueue(b"j", EnqueueOptions::default())?;
            Ok(e)
        })
        .unwrap();
    assert!(r.is_some(), "leaseq_jobs was opened inside write");
    assert_eq!(q.stats().unwrap().total, 1);
    assert_consistent(&q);
}

/// Holding `leaseq_dedup` open across an enqueue with a key inside write.
#[test]
fn write_holding_leaseq_dedup_then_enqueue_fails_cleanly() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"seed", EnqueueOptions::default().dedup_key("s"))
        .unwrap();
    let r = q.write(|tx| {
        let t = tx.open_table(DEDUP_T)?;
        let e = tx.enqueue(b"j", EnqueueOptions::default().dedup_key("s2"));
        drop(t);
        let _ = e;
        Ok(())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    assert_eq!(q.stats().unwrap().total, 1);
    assert_consistent(&q);
}

/// Panicking / failing write after enqueues: nothing, keys free. An id of a job that never
/// committed may be handed out again (documented on `Tx`), but then names only the new job.
#[test]
fn failing_and_panicking_writes_leave_nothing_and_ids_name_one_committed_job() {
    let f = Fixture::new();
    let q = f.open();
    let mut seen = Vec::new();
    let r = q.write(|tx| -> Result<(), leaseq::BoxError> {
        let a = new_id(tx.enqueue(b"a", EnqueueOptions::default().dedup_key("k1"))?);
        let d = tx.enqueue(b"a2", EnqueueOptions::default().dedup_key("k1"))?;
        assert_eq!(d, Enqueued::Duplicate(a));
        seen.push(a);
        bump(tx, 1)?;
        panic!("mid-write");
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    let r = q.write(|tx| -> Result<(), leaseq::BoxError> {
        seen.push(new_id(
            tx.enqueue(b"b", EnqueueOptions::default().dedup_key("k1"))?,
        ));
        Err("nope".into())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    assert_eq!(q.stats().unwrap().total, 0);
    assert!(effects(&q).is_empty());
    let c = new_id(
        q.enqueue(b"c", EnqueueOptions::default().dedup_key("k1"))
            .unwrap(),
    );
    let d = new_id(q.enqueue(b"d", EnqueueOptions::default()).unwrap());
    assert_ne!(c, d);
    assert_eq!(q.payload(c).unwrap().unwrap(), b"c");
    assert_eq!(q.payload(d).unwrap().unwrap(), b"d");
    assert_eq!(q.stats().unwrap().total, 2, "aborted ids {seen:?}");
    assert_consistent(&q);
}

/// Calling the queue from inside a write closure is `Reentrant` (not a hang).
#[test]
fn queue_calls_inside_write_are_reentrant() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"p", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let results = q
        .write(|tx| {
            let v = vec![
                ("enqueue", q.enqueue(b"x", EnqueueOptions::default()).err()),
                ("dequeue", q.dequeue().err()),
                (
                    "dequeue_timeout",
                    q.dequeue_timeout(Duration::from_secs(1)).err(),
                ),
                ("write", q.write(|_| Ok(())).err()),
                ("ack", l.ack().err()),
                ("nack", l.nack("x").err()),
                ("extend", l.extend(Duration::from_secs(1)).err()),
            ];
            tx.enqueue(b"inside", EnqueueOptions::default())?;
            Ok(v.into_iter()
                .map(|(n, e)| (n, format!("{e:?}")))
                .collect::<Vec<_>>())
        })
        .unwrap();
    for (name, e) in &results {
        assert!(e.contains("Reentrant"), "{name} inside write: {e}");
    }
    // The lease is still current.
    l.ack().unwrap();
    assert_eq!(drain_payloads(&q), vec![b"inside".to_vec()]);
    assert_consistent(&q);
}

/// `write` wakes a consumer blocked in `dequeue_timeout`.
#[test]
fn write_wakes_blocked_consumer() {
    let f = Fixture::new();
    let q = f.open();
    let q2 = q.clone();
    let h = std::thread::spawn(move || {
        let t = Instant::now();
        let l = q2.dequeue_timeout(Duration::from_secs(20)).unwrap();
        (l.map(|l| l.payload().to_vec()), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    q.write(|tx| {
        tx.enqueue(b"w", EnqueueOptions::default())?;
        Ok(())
    })
    .unwrap();
    let (p, took) = h.join().unwrap();
    assert_eq!(p, Some(b"w".to_vec()));
    assert!(took < Duration::from_secs(5), "woke after {took:?}");
}

/// ack_with_batch: lease 0 enqueues a keyed follow-up, lease 1 fails; the replay must
/// produce exactly one follow-up.
#[test]
fn batch_replay_produces_each_follow_up_once() {
    let f = Fixture::new();
    let q = f.open();
    for i in 0..3u8 {
        q.enqueue(&[i], EnqueueOptions::default().max_attempts(5))
            .unwrap();
    }
    let ls = q.dequeue_batch(3).unwrap();
    let runs = AtomicU64::new(0);
    let out = q
        .ack_with_batch(&ls, |tx, l| {
            runs.fetch_add(1, Ordering::SeqCst);
            match l.payload()[0] {
                0 => {
                    tx.enqueue(b"f0", EnqueueOptions::default().dedup_key("f0"))?;
                    tx.enqueue(b"g0", EnqueueOptions::default())?;
                    bump(tx, 0)
                }
                1 => {
                    tx.enqueue(b"f1", EnqueueOptions::default().dedup_key("f1"))?;
                    Err("lease 1 fails".into())
                }
                _ => {
                    tx.enqueue(b"f2", EnqueueOptions::default())?;
                    bump(tx, 2)
                }
            }
        })
        .unwrap();
    assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
    assert!(matches!(out[1], Err(Error::Effect(_))), "{out:?}");
    assert!(runs.load(Ordering::SeqCst) >= 4);
    let e = effects(&q);
    assert_eq!((e.get(&0), e.get(&2)), (Some(&1), Some(&1)));
    assert_consistent(&q);
    let mut left = drain_payloads(&q);
    left.sort();
    assert_eq!(
        left,
        vec![vec![1u8], b"f0".to_vec(), b"f2".to_vec(), b"g0".to_vec()]
    );
    assert_consistent(&q);
}

/// Concurrent writes (some failing, so groups replay), dequeuers and ack_with with
/// follow-ups: every committed write/follow-up exists exactly once, nothing else does.
#[test]
fn concurrent_writes_failures_and_ack_with_follow_ups_are_exact() {
    let f = Fixture::new();
    let q = f.open();
    const WRITERS: u64 = 4;
    const PER: u64 = 60;
    let ok_writes = Arc::new(AtomicU64::new(0));
    let write_runs = Arc::new(AtomicU64::new(0));
    let follow_ups = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(WRITERS as usize + 2));
    let mut hs = Vec::new();
    for w in 0..WRITERS {
        let (q, ok_writes, write_runs, ids, barrier) = (
            q.clone(),
            ok_writes.clone(),
            write_runs.clone(),
            ids.clone(),
            barrier.clone(),
        );
        hs.push(std::thread::spawn(move || {
            barrier.wait();
            for i in 0..PER {
                let fail = (w + i) % 3 == 0;
                let key = 1_000 + w * PER + i;
                let r = q.write(|tx| {
                    write_runs.fetch_add(1, Ordering::SeqCst);
                    bump(tx, key)?;
                    let id = new_id(tx.enqueue(
                        &key.to_le_bytes(),
                        EnqueueOptions::default().dedup_key(key.to_le_bytes()),
                    )?);
                    if fail {
                        return Err("planned".into());
                    }
                    Ok(id)
                });
                match (fail, r) {
                    (false, Ok(id)) => {
                        ok_writes.fetch_add(1, Ordering::SeqCst);
                        ids.lock().unwrap().push(id);
                    }
                    (true, Err(Error::Effect(_))) => {}
                    (fail, r) => panic!("writer {w} #{i} fail={fail}: {r:?}"),
                }
            }
        }));
    }
    // Two consumers: root jobs (8-byte payloads) get a follow-up "F"+payload via ack_with.
    for _ in 0..2 {
        let (q, follow_ups, acked, stop, barrier, ids) = (
            q.clone(),
            follow_ups.clone(),
            acked.clone(),
            stop.clone(),
            barrier.clone(),
            ids.clone(),
        );
        hs.push(std::thread::spawn(move || {
            barrier.wait();
            loop {
                match q.dequeue_timeout(Duration::from_millis(50)).unwrap() {
                    Some(l) => {
                        let p = l.payload().to_vec();
                        let mut made = None;
                        if p.len() == 8 {
                            l.ack_with(|tx| {
                                let mut fp = b"F".to_vec();
                                fp.extend_from_slice(&p);
                                made = Some(new_id(tx.enqueue(&fp, EnqueueOptions::default())?));
                                Ok(())
                            })
                            .unwrap();
                            follow_ups.fetch_add(1, Ordering::SeqCst);
                            ids.lock().unwrap().push(made.unwrap());
                        } else {
                            l.ack().unwrap();
                        }
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                    None if stop.load(Ordering::SeqCst) => break,
                    None => {}
                }
            }
        }));
    }
    let (writers, consumers): (Vec<_>, Vec<_>) = {
        let mut hs = hs.into_iter();
        let w: Vec<_> = hs.by_ref().take(WRITERS as usize).collect();
        (w, hs.collect())
    };
    for h in writers {
        h.join().unwrap();
    }
    // Let the consumers drain, then stop them.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !q.is_empty().unwrap() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    for h in consumers {
        h.join().unwrap();
    }
    let ok = ok_writes.load(Ordering::SeqCst);
    let expected_ok = (0..WRITERS)
        .flat_map(|w| (0..PER).map(move |i| (w + i) % 3 != 0))
        .filter(|b| *b)
        .count() as u64;
    assert_eq!(ok, expected_ok);
    assert_eq!(
        follow_ups.load(Ordering::SeqCst),
        ok,
        "one follow-up per committed write"
    );
    assert_eq!(
        acked.load(Ordering::SeqCst),
        2 * ok,
        "roots + follow-ups acked"
    );
    let e = effects(&q);
    assert_eq!(
        e.len() as u64,
        ok,
        "effects of failed writes leaked: {}",
        e.len()
    );
    assert!(e.values().all(|&n| n == 1), "an effect applied twice");
    let ids = ids.lock().unwrap();
    let set: HashSet<_> = ids.iter().collect();
    assert_eq!(set.len(), ids.len(), "duplicate job ids");
    assert!(q.is_empty().unwrap());
    // Every dedup key of a failed write is free, of a committed one free too (acked).
    for w in 0..WRITERS {
        for i in 0..PER {
            let key = 1_000 + w * PER + i;
            let r = q
                .enqueue(
                    b"probe",
                    EnqueueOptions::default().dedup_key(key.to_le_bytes()),
                )
                .unwrap();
            assert!(matches!(r, Enqueued::New(_)), "key {key}: {r:?}");
        }
    }
    eprintln!(
        "write closure runs: {} for {} calls (replays: {})",
        write_runs.load(Ordering::SeqCst),
        WRITERS * PER,
        write_runs.load(Ordering::SeqCst) - WRITERS * PER
    );
    assert_consistent(&q);
}

/// The id a failed `ack_with` closure's follow-up was given may be handed out again, but
/// then names only the job that committed under it.
#[test]
fn failed_ack_with_follow_up_id_names_only_a_committed_job() {
    let f = Fixture::new();
    let q = f.open();
    let parent = new_id(
        q.enqueue(b"p", EnqueueOptions::default().max_attempts(3))
            .unwrap(),
    );
    let l = q.dequeue().unwrap().unwrap();
    let mut child = None;
    let r = l.ack_with(|tx| {
        child = Some(new_id(tx.enqueue(b"c", EnqueueOptions::default())?));
        Err("fail".into())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    let child = child.unwrap();
    assert!(child > parent);
    let later = new_id(q.enqueue(b"later", EnqueueOptions::default()).unwrap());
    assert_ne!(later, parent);
    // Whatever `later` is (perhaps the aborted follow-up's id), it names the later job only.
    assert_eq!(q.payload(later).unwrap().unwrap(), b"later");
    assert!(q.job(child).unwrap().is_none() || child == later);
    assert_consistent(&q);
}

/// Issue 23: a refusal inside a caller's transaction is the same typed error as outside it,
/// naming the setting to change; a closure passing it on commits nothing, one catching it
/// goes on and commits the rest.
#[test]
fn a_refused_enqueue_inside_write_is_its_own_error_naming_the_setting() {
    let f = Fixture::new();
    let q = f.builder().payload_bytes_max(64).open(&f.path).unwrap();
    let big = vec![7u8; 65];
    let outside = q.enqueue(&big, EnqueueOptions::default()).unwrap_err();
    let inside = q
        .write(|tx| {
            bump(tx, 1)?;
            tx.enqueue(&big, EnqueueOptions::default())?;
            Ok(())
        })
        .unwrap_err();
    for e in [&outside, &inside] {
        assert!(
            matches!(
                e,
                Error::PayloadTooLarge {
                    size_bytes: 65,
                    limit_bytes: 64
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("Builder::payload_bytes_max"), "{e}");
    }
    assert!(
        effects(&q).is_empty(),
        "passed on: nothing of the closure commits"
    );
    assert_eq!(q.len().unwrap(), 0);
    // Caught: the refused job wrote nothing, the rest commits.
    q.write(|tx| {
        bump(tx, 2)?;
        let refused = tx.enqueue(&big, EnqueueOptions::default());
        assert!(matches!(refused, Err(Error::PayloadTooLarge { .. })));
        tx.enqueue(b"small", EnqueueOptions::default())?;
        Ok(())
    })
    .unwrap();
    assert_eq!(effects(&q).get(&2), Some(&1));
    assert_eq!(drain_payloads(&q), vec![b"small".to_vec()]);
    let long_key = "k".repeat(leaseq::KEY_BYTES_MAX + 1);
    let e = q
        .write(|tx| {
            tx.enqueue(b"x", EnqueueOptions::default().idempotency_key(&long_key))?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::KeyTooLong {
                field: "idempotency_key",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("KEY_BYTES_MAX"), "{e}");
    // A closure's own error stays `Effect`.
    let e = q.write(|_| Err::<(), _>("mine".into())).unwrap_err();
    assert!(matches!(e, Error::Effect(_)), "{e:?}");
    assert_consistent(&q);
}

/// The same inside `ack_with`: the job is given back (as for any closure error) with the
/// refusal's text as its last error, the lease has ended, and the call says which setting.
#[test]
fn a_refused_follow_up_inside_ack_with_is_its_own_error_and_the_job_goes_back() {
    let f = Fixture::new();
    let q = f.builder().payload_bytes_max(64).open(&f.path).unwrap();
    let id = new_id(q.enqueue(b"step-1", EnqueueOptions::default()).unwrap());
    let lease = q.dequeue().unwrap().unwrap();
    let e = lease
        .ack_with(|tx| {
            bump(tx, 1)?;
            tx.enqueue(&[0u8; 100], EnqueueOptions::default())?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::PayloadTooLarge {
                size_bytes: 100,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        matches!(lease.ack(), Err(Error::LeaseLost { .. })),
        "the attempt ended"
    );
    let job = q.job(id).unwrap().unwrap();
    assert_eq!(job.state, JobState::Ready);
    assert!(
        job.last_error
            .as_deref()
            .unwrap()
            .contains("payload_bytes_max"),
        "{job:?}"
    );
    assert!(effects(&q).is_empty());
    // A pool's effect handler: counted as retried, not as an error.
    let pool = leaseq::WorkerPool::builder(&q)
        .threads(1)
        .start_effects(|tx, _| {
            tx.enqueue(&[0u8; 100], EnqueueOptions::default())?;
            Ok(())
        })
        .unwrap();
    let t = Instant::now();
    while pool.stats().retried == 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let report = pool.shutdown(Duration::from_secs(5));
    assert!(
        report.stats.retried >= 1 && report.stats.errors == 0,
        "{report:?}"
    );
    assert_consistent(&q);
}
