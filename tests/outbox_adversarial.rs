//! Adversarial tests of enqueue inside a transaction (`Tx`): `ack_with` follow-ups and
//! `Queue::write`.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{Fixture, assert_consistent, bump, drain_payloads, effects, new_id};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobState};

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
        Enqueued::Duplicate(id) | Enqueued::DuplicateDead(id) => {
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
