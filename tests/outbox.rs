//! Enqueue inside a transaction (issue 10, C33): follow-up jobs from an `ack_with` effect, and
//! `Queue::write` for the caller's own writes plus new jobs. Jobs enqueued through a `Tx`
//! exist if and only if its transaction committed.

mod common;

use std::time::{Duration, Instant};

use common::{EFFECTS, Fixture, assert_consistent, bump, drain_payloads, effects, new_id};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobState};
use redb::ReadableDatabase;

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
    match r {
        Err(Error::Effect(e)) => assert!(
            matches!(e.downcast_ref::<Error>(), Some(Error::Reentrant)),
            "{e:?}"
        ),
        other => panic!("expected Effect(Reentrant), got {other:?}"),
    }
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
