//! Never let one bad row stop the queue (case C37): a damaged job row is quarantined and the
//! rest of the queue goes on.
//!
//! Adversarial tests (issue 8): quarantine edge cases (damaged rows in every state, stray and
//! missing index entries, a dequeue behind many damaged rows, a call on a damaged row inside a
//! shared group). Written by an adversarial review; every bug it found is fixed and its test
//! kept as a regression test.

use crate::common::{
    Fixture, LEASE, T0_MS, assert_consistent, bump, effects, enqueue_n, flip_record_byte, ms,
    overwrite_record,
};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobId, JobState, Lease, Queue};
use redb::TableDefinition;
use std::sync::Mutex;
use std::time::Duration;

/// leaseq's own tables, written behind its back to plant damage (as a flaky disk would).
const READY: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("leaseq_ready");

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

/// leaseq's own tables, written behind its back to plant damage (as a flaky disk would).
const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("leaseq_jobs");

const SCHEDULED: TableDefinition<(u64, u64), ()> = TableDefinition::new("leaseq_scheduled");

const LEASES: TableDefinition<(u64, u64), ()> = TableDefinition::new("leaseq_leases");

const DEAD: TableDefinition<u64, ()> = TableDefinition::new("leaseq_dead");

/// Runs `f` in a write transaction on the queue's database and commits it.
fn plant(q: &Queue, f: impl FnOnce(&redb::WriteTransaction)) {
    let tx = q.database().begin_write().unwrap();
    f(&tx);
    tx.commit().unwrap();
}

const GARBAGE: &[u8] = b"\x01not a leaseq record, just bytes";

/// Removes every entry of `table` (an index keyed `(_, id)`) naming job `id`.
fn drop_index_entries_2(q: &Queue, table: TableDefinition<(u64, u64), ()>, id: JobId) {
    plant(q, |tx| {
        tx.open_table(table)
            .unwrap()
            .retain(|(_, j), ()| j != id.0)
            .unwrap();
    });
}

/// The ids of the jobs `check()` complains about.
fn reported(q: &Queue) -> Vec<JobId> {
    q.check().unwrap().iter().filter_map(|v| v.job_id).collect()
}

/// Drains the queue with single dequeues and acks, returning the ids served.
fn drain(q: &Queue) -> Vec<JobId> {
    std::iter::from_fn(|| q.dequeue().unwrap())
        .map(|l| {
            l.ack().unwrap();
            l.id()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Bugs: index entries that collide, go missing, or are never met by any pass
// ---------------------------------------------------------------------------------------

/// A stray `leaseq_dead` entry naming a live job (the same id in two indexes). Nothing meets
/// it until the job itself goes dead: then `Tables::put` finds the dead entry "already
/// present" and fails with `Corrupted` after writing, which aborts the whole group. When that
/// happens in the sweep (the last attempt's lease expires), every dequeue fails: the other
/// jobs are unreachable, one bad index entry stops the queue.
#[test]

fn stray_dead_entry_of_a_leased_job_stops_every_dequeue_at_expiry() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().max_attempts(1).lease(ms(1_000)),
        )
        .unwrap()
        .id();
    let b = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    let la = q.dequeue().unwrap().unwrap();
    assert_eq!(la.id(), a);
    plant(&q, |tx| {
        tx.open_table(DEAD).unwrap().insert(a.0, ()).unwrap();
    });
    f.clock.advance(ms(1_001));
    // The queue must go on: B is served, A is dead with "lease expired".
    let lb = q
        .dequeue()
        .expect("one stray index entry must not stop the dequeue")
        .expect("B is ready");
    assert_eq!(lb.id(), b);
    lb.ack().unwrap();
    assert_eq!(q.job(a).unwrap().unwrap().state, JobState::Dead);
    assert_consistent(&q);
}

/// The same stray dead entry, met by the lease recovery at open instead: the job's last
/// attempt was leased when the process went away, recovery dead-letters it, `put` collides
/// with the stray entry and the whole open fails. The file cannot be opened at all.
#[test]

fn stray_dead_entry_of_a_leased_job_refuses_the_reopen() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().max_attempts(1))
        .unwrap()
        .id();
    let b = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    let la = q.dequeue().unwrap().unwrap();
    assert_eq!(la.id(), a);
    plant(&q, |tx| {
        tx.open_table(DEAD).unwrap().insert(a.0, ()).unwrap();
    });
    drop(la);
    drop(q);
    let q = f
        .builder()
        .open(&f.path)
        .expect("one stray index entry must not refuse the file");
    assert_eq!(q.recovery().leases_dead_lettered, 1);
    assert_eq!(drain(&q), [b]);
}

/// The same collision on the dequeue's own write: a stray lease entry that happens to equal
/// the deadline the dequeue is about to give (`now + lease`, easy with a manual clock, and
/// left by any damage that copies a lease entry) makes `put` fail, and with it every dequeue
/// at that instant, although the job is good and the stray entry is just an extra key.
#[test]

fn stray_lease_entry_at_the_new_deadline_fails_the_dequeue() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 2, EnqueueOptions::default());
    let deadline = T0_MS + LEASE.as_millis() as u64;
    plant(&q, |tx| {
        tx.open_table(LEASES)
            .unwrap()
            .insert((deadline, ids[0].0), ())
            .unwrap();
    });
    let l = q
        .dequeue()
        .expect("a stray index entry must not fail the dequeue")
        .expect("job 1");
    assert_eq!(l.id(), ids[0]);
    l.ack().unwrap();
    assert_eq!(drain(&q), [ids[1]]);
    assert_consistent(&q);
}

/// A good ready row whose ready entry is gone (the index damaged, the row intact): no pass
/// ever meets it (passes walk the indexes), `check()` reports it, and `remove` fails with
/// `Corrupted` (`delete` -> `unindex` finds no entry), an error `remove` does not document.
/// The job is neither served nor removable: it can never leave the file.
#[test]

fn a_ready_job_without_its_ready_entry_is_removable() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().dedup_key("k1"))
        .unwrap()
        .id();
    let b = q
        .enqueue(b"B", EnqueueOptions::default().dedup_key("k2"))
        .unwrap()
        .id();
    plant(&q, |tx| {
        tx.open_table(READY)
            .unwrap()
            .retain(|(_, _, j), ()| j != a.0)
            .unwrap();
    });
    assert!(reported(&q).contains(&a));
    assert_eq!(drain(&q), [b], "the job without an entry is never served");
    q.remove(a)
        .expect("remove deletes a job whatever its index says");
    assert!(matches!(
        q.enqueue(b"again", EnqueueOptions::default().dedup_key("k1"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// A leased job whose lease entry is gone: every call on its current lease (`ack`, `nack`,
/// `fail`, `extend`) fails with `Corrupted` (each unindexes first), the sweep never reclaims
/// it (no entry to expire), the reopen never recovers it (recovery walks lease entries), and
/// `remove` refuses it as leased. The lease is stranded for good, the exact failure issue 8
/// rules out.
#[test]

fn a_leased_job_without_its_lease_entry_is_not_stranded() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 2, EnqueueOptions::default());
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), ids[0]);
    drop_index_entries_2(&q, LEASES, ids[0]);
    let ack = l.ack();
    let nack = l.nack("x");
    let fail = l.fail("x");
    let extend = l.extend(LEASE);
    // Far past the deadline, then a reopen: something must end that attempt.
    f.clock.advance(LEASE * 10);
    let swept = q.dequeue().unwrap().map(|l| l.id());
    drop(l);
    drop(q);
    let q = f.open();
    let after_reopen = q.job(ids[0]).unwrap().map(|i| i.state);
    assert!(
        ack.is_ok()
            || nack.is_ok()
            || fail.is_ok()
            || extend.is_ok()
            || swept == Some(ids[0])
            || after_reopen != Some(JobState::Leased),
        "stranded: ack {ack:?}, nack {nack:?}, fail {fail:?}, extend {extend:?}, \
         swept {swept:?}, after reopen {after_reopen:?}"
    );
}

/// One lease in a batch whose job's lease entry is missing (its row intact and its token
/// current) fails the whole `ack_batch` with `Corrupted`, an error the batch call does not
/// document, and holds up the other leases, which per-lease outcomes were meant to prevent.
#[test]

fn one_lease_without_its_index_entry_does_not_hold_up_the_batch() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 3, EnqueueOptions::default());
    let leases = q.dequeue_batch(3).unwrap();
    drop_index_entries_2(&q, LEASES, ids[1]);
    let out = q
        .ack_batch(&leases)
        .expect("per-lease outcomes, not a whole-call error");
    assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
    assert_eq!(q.job(ids[0]).unwrap(), None);
    assert_eq!(q.job(ids[2]).unwrap(), None);
}

/// A `leaseq_dead` entry naming no job (left by an ack, or by damage): no pass meets dead
/// entries, `remove` and `requeue_dead` answer `JobNotFound` and leave it, so `check()`
/// reports it forever and `stats().dead` counts a dead job that does not exist.
#[test]

fn a_stray_dead_entry_without_a_job_can_be_cleared() {
    let f = Fixture::new();
    let q = f.open();
    plant(&q, |tx| {
        tx.open_table(DEAD).unwrap().insert(999, ()).unwrap();
    });
    assert_eq!(reported(&q), [JobId(999)]);
    let _ = q.remove(JobId(999));
    let _ = q.requeue_dead(JobId(999));
    while q.dequeue().unwrap().is_some() {}
    assert_eq!(q.stats().unwrap().dead, 0, "no dead job exists");
    assert_consistent(&q);
}

/// More than `SWEEP_MAX` (256) damaged rows ahead of a good job: one `dequeue` settles 256
/// strays and returns `None` although a job is available now, so the documented loop
/// `while let Some(l) = q.dequeue()? { .. }` stops early and reports an empty queue. The
/// dequeue's doc ("returns `None` at once" only if nothing is available; "one bad row never
/// stops it ... goes on with the next job") does not say a `None` can mean "look again".
#[test]

fn dequeue_returns_a_ready_job_behind_many_damaged_rows() {
    let f = Fixture::new();
    let q = f.open();
    let n = 300;
    let payloads: Vec<Vec<u8>> = (0..=n).map(|i| format!("j{i}").into_bytes()).collect();
    let ids: Vec<JobId> = q
        .enqueue_batch(
            payloads
                .iter()
                .map(|p| (p.as_slice(), EnqueueOptions::default())),
        )
        .unwrap()
        .into_iter()
        .map(|e| e.id())
        .collect();
    plant(&q, |tx| {
        let mut jobs = tx.open_table(JOBS).unwrap();
        for id in &ids[..n] {
            jobs.insert(id.0, GARBAGE).unwrap();
        }
    });
    let got = q.dequeue().unwrap().map(|l| l.id());
    assert_eq!(got, Some(ids[n]), "a job is available now");
}

// ---------------------------------------------------------------------------------------
// Regression: quarantine and stray entries in every state
// ---------------------------------------------------------------------------------------

/// A batch with a damaged lease in the middle: the good leases are acked, the damaged one is
/// `Corrupted` in its place; `ack_with_batch` runs no closure for it. The damaged row is
/// quarantined once its lease runs out, keeping its dedup key until removed.
#[test]
fn a_damaged_lease_in_a_batch_is_reported_in_its_place() {
    for with_effect in [false, true] {
        let f = Fixture::new();
        let q = f.open();
        let ids: Vec<JobId> = (0..3)
            .map(|i| {
                q.enqueue(
                    b"x",
                    EnqueueOptions::default()
                        .dedup_key(format!("d{i}"))
                        .lease(ms(1_000)),
                )
                .unwrap()
                .id()
            })
            .collect();
        let leases = q.dequeue_batch(3).unwrap();
        overwrite_record(&q, ids[1], GARBAGE);
        let ran = Mutex::new(Vec::new());
        let out: Vec<Result<(), Error>> = if with_effect {
            q.ack_with_batch(&leases, |tx, l| {
                ran.lock().unwrap().push(l.id());
                bump(tx, l.id().0)
            })
            .unwrap()
            .into_iter()
            .map(|r| r.map(|a| assert_eq!(a, Applied::Now)))
            .collect()
        } else {
            q.ack_batch(&leases).unwrap()
        };
        assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
        assert!(matches!(out[1], Err(Error::Corrupted { .. })), "{out:?}");
        if with_effect {
            assert_eq!(*ran.lock().unwrap(), [ids[0], ids[2]]);
            assert_eq!(effects(&q).len(), 2);
        }
        // Still Corrupted for its holder, nothing written.
        assert!(matches!(leases[1].ack(), Err(Error::Corrupted { .. })));
        f.clock.advance(ms(1_001));
        assert!(q.dequeue().unwrap().is_none());
        assert_eq!(q.stats().unwrap().quarantined, 1);
        assert!(matches!(leases[1].ack(), Err(Error::LeaseLost { .. })));
        assert_eq!(
            q.enqueue(b"y", EnqueueOptions::default().dedup_key("d1"))
                .unwrap(),
            Enqueued::Duplicate(ids[1])
        );
        q.remove(ids[1]).unwrap();
        assert_consistent(&q);
    }
}

/// A batch mixing a damaged lease, a failing closure and a good one: one outcome each, in
/// place (`Corrupted`, `Effect`, `Ok`); only the good effect commits; the failing job is
/// ready with its error.
#[test]
fn a_batch_with_a_damaged_lease_and_a_failing_closure() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 3, EnqueueOptions::default());
    let leases = q.dequeue_batch(3).unwrap();
    overwrite_record(&q, ids[0], GARBAGE);
    let out = q
        .ack_with_batch(&leases, |tx, l| {
            bump(tx, l.id().0)?;
            if l.id() == ids[1] {
                return Err("middle fails".into());
            }
            Ok(())
        })
        .unwrap();
    assert!(matches!(out[0], Err(Error::Corrupted { .. })), "{out:?}");
    assert!(matches!(out[1], Err(Error::Effect(_))), "{out:?}");
    assert!(matches!(out[2], Ok(Applied::Now)), "{out:?}");
    let fx = effects(&q);
    assert_eq!(fx.len(), 1);
    assert_eq!(fx.get(&ids[2].0), Some(&1));
    let info = q.job(ids[1]).unwrap().unwrap();
    assert_eq!(
        (info.state, info.last_error.as_deref()),
        (JobState::Ready, Some("middle fails"))
    );
}

/// A call aimed at one damaged job is documented to "return `Corrupted` and write nothing",
/// and operations to "validate before they write, so a refused call never spoils a group".
/// `ack` keeps that (its `Corrupted` is a per-lease outcome), but `nack`, `fail`, `extend` and
/// `requeue_dead` return `Corrupted` as the operation's error, which `is_refusal` does not
/// know: the group is aborted and every other member runs again (their `ack_with` closures
/// included).
#[test]

fn a_call_on_a_damaged_row_does_not_spoil_its_group() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 2, EnqueueOptions::default());
    let l = q.dequeue().unwrap().unwrap();
    overwrite_record(&q, ids[0], GARBAGE);
    let before = q.commit_stats().replayed;
    assert!(matches!(l.ack(), Err(Error::Corrupted { .. })));
    assert_eq!(q.commit_stats().replayed, before, "ack: per-lease refusal");
    assert!(matches!(l.nack("x"), Err(Error::Corrupted { .. })));
    assert!(matches!(l.fail("x"), Err(Error::Corrupted { .. })));
    assert!(matches!(l.extend(LEASE), Err(Error::Corrupted { .. })));
    assert_eq!(
        q.commit_stats().replayed,
        before,
        "a refusal aimed at one damaged job aborted the group"
    );
}

/// `remove` of a damaged row that is leased (its state cannot be read): deleted with its
/// lease entry and dedup key; the holder's calls are `LeaseLost` afterwards; the sweep finds
/// nothing to do at the old deadline; `check()` is clean.
#[test]
fn remove_of_a_damaged_leased_row_takes_its_lease_entry_and_key() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"A", EnqueueOptions::default().dedup_key("ka"))
        .unwrap()
        .id();
    let b = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    let la = q.dequeue().unwrap().unwrap();
    assert_eq!(la.id(), a);
    overwrite_record(&q, a, GARBAGE);
    q.remove(a).unwrap();
    assert!(matches!(la.ack(), Err(Error::LeaseLost { .. })));
    assert!(matches!(la.nack("x"), Err(Error::LeaseLost { .. })));
    assert_eq!(q.job(a).unwrap(), None);
    f.clock.advance(LEASE * 2);
    assert_eq!(drain(&q), [b]);
    assert_eq!(q.stats().unwrap().quarantined, 0);
    assert!(matches!(
        q.enqueue(b"A2", EnqueueOptions::default().dedup_key("ka"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}

/// A damaged scheduled row: before it is due nothing meets it (check reports it, the other
/// jobs are served); once due, the sweep quarantines it and the queue goes on; its dedup key
/// stays held until `remove`.
#[test]
fn a_damaged_scheduled_row_is_quarantined_when_due() {
    let f = Fixture::new();
    let q = f.open();
    let s = q
        .enqueue(
            b"S",
            EnqueueOptions::default()
                .delay(Duration::from_secs(10))
                .dedup_key("ks"),
        )
        .unwrap()
        .id();
    let later = q
        .enqueue(
            b"L",
            EnqueueOptions::default().delay(Duration::from_secs(10)),
        )
        .unwrap()
        .id();
    let r = q.enqueue(b"R", EnqueueOptions::default()).unwrap().id();
    overwrite_record(&q, s, GARBAGE);
    assert!(reported(&q).contains(&s));
    assert_eq!(drain(&q), [r]);
    assert_eq!(q.stats().unwrap().quarantined, 0, "not due: not met");
    f.clock.advance(Duration::from_secs(10));
    assert_eq!(drain(&q), [later]);
    let listed = q.quarantined(None, 10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].job_id, s);
    assert_eq!(listed[0].quarantined_ms, T0_MS + 10_000);
    assert_eq!(q.quarantined_record(s).unwrap().as_deref(), Some(GARBAGE));
    assert_eq!(
        q.enqueue(b"S2", EnqueueOptions::default().dedup_key("ks"))
            .unwrap(),
        Enqueued::Duplicate(s)
    );
    assert!(matches!(q.requeue_dead(s), Err(Error::JobNotFound { .. })));
    q.remove(s).unwrap();
    assert_consistent(&q);
}

/// A stray ready entry naming a job that is leased (the same id in two indexes): the dequeue
/// that meets it drops it and never delivers the job a second time; the holder acks as usual.
/// A stray ready entry naming a dead job is dropped too, and the dead job stays dead.
#[test]
fn a_stray_ready_entry_never_delivers_a_job_twice() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 3, EnqueueOptions::default());
    let held = q.dequeue().unwrap().unwrap();
    assert_eq!(held.id(), ids[0]);
    let dead = q.dequeue().unwrap().unwrap();
    dead.fail("dead").unwrap();
    plant(&q, |tx| {
        let mut ready = tx.open_table(READY).unwrap();
        ready.insert((0, 0, ids[0].0), ()).unwrap();
        ready.insert((0, 1, ids[1].0), ()).unwrap();
    });
    let served: Vec<JobId> = q.dequeue_batch(10).unwrap().iter().map(Lease::id).collect();
    assert_eq!(served, [ids[2]]);
    assert!(q.dequeue().unwrap().is_none());
    held.ack().unwrap();
    assert_eq!(q.job(ids[1]).unwrap().unwrap().state, JobState::Dead);
    assert_eq!(q.stats().unwrap().quarantined, 0);
    q.remove(ids[1]).unwrap();
    // The batch's leases were dropped unacked: let them expire and drain.
    f.clock.advance(LEASE * 2);
    assert_eq!(drain(&q), [ids[2]]);
    assert_consistent(&q);
}

/// A ready job also named by a due scheduled entry and by an expired lease entry: the sweep
/// drops both strays and the job is served once.
#[test]
fn a_job_in_three_indexes_is_served_once() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 2, EnqueueOptions::default());
    plant(&q, |tx| {
        tx.open_table(SCHEDULED)
            .unwrap()
            .insert((T0_MS - 5, ids[0].0), ())
            .unwrap();
        tx.open_table(LEASES)
            .unwrap()
            .insert((T0_MS - 5, ids[0].0), ())
            .unwrap();
    });
    assert_eq!(drain(&q), ids);
    assert_eq!(q.stats().unwrap().quarantined, 0);
    assert_consistent(&q);
}

/// `dequeue_batch(n)` with damaged rows among the first `n`: it goes on past them and still
/// returns `n` good jobs, in order.
#[test]
fn dequeue_batch_goes_past_damaged_rows_to_fill_the_batch() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 10, EnqueueOptions::default());
    for &i in &[1, 2, 4] {
        overwrite_record(&q, ids[i], GARBAGE);
    }
    let got: Vec<JobId> = q.dequeue_batch(5).unwrap().iter().map(Lease::id).collect();
    assert_eq!(got, [ids[0], ids[3], ids[5], ids[6], ids[7]]);
    assert_eq!(q.stats().unwrap().quarantined, 3);
}

/// The damaged leased row of a live holder, then a reopen with damaged rows in several
/// states: recovery quarantines the leased one only, reports it, and the rest is served.
#[test]
fn reopen_with_damage_in_every_state() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 6, EnqueueOptions::default());
    let sched = q
        .enqueue(
            b"S",
            EnqueueOptions::default().delay(Duration::from_secs(5)),
        )
        .unwrap()
        .id();
    let leases = q.dequeue_batch(3).unwrap(); // ids 0..3 leased
    leases[0].fail("dead").unwrap(); // ids[0] dead
    overwrite_record(&q, ids[0], GARBAGE); // dead, damaged
    overwrite_record(&q, ids[1], GARBAGE); // leased, damaged
    overwrite_record(&q, ids[3], GARBAGE); // ready, damaged
    overwrite_record(&q, sched, GARBAGE); // scheduled, damaged
    drop(leases);
    drop(q);
    let q = f.open();
    let r = q.recovery();
    assert_eq!(
        (r.leases_returned, r.leases_dead_lettered, r.quarantined),
        (1, 0, 1),
        "{r:?}"
    );
    f.clock.advance(Duration::from_secs(5));
    let mut served = drain(&q);
    served.sort();
    assert_eq!(served, [ids[2], ids[4], ids[5]]);
    let mut q_ids: Vec<JobId> = q
        .quarantined(None, 10)
        .unwrap()
        .iter()
        .map(|x| x.job_id)
        .collect();
    q_ids.sort();
    assert_eq!(q_ids, [ids[1], ids[3], sched]);
    // The dead damaged row was never met: reported by check, removable.
    assert!(reported(&q).contains(&ids[0]));
    for id in [ids[0], ids[1], ids[3], sched] {
        q.remove(id).unwrap();
    }
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// Paging through quarantined rows with `after`, and its bounds.
#[test]
fn quarantined_pages_and_bounds() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 7, EnqueueOptions::default());
    for id in &ids {
        overwrite_record(&q, *id, GARBAGE);
    }
    assert!(q.dequeue().unwrap().is_none());
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = q.quarantined(after, 3).unwrap();
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().job_id);
        seen.extend(page.iter().map(|x| x.job_id));
    }
    assert_eq!(seen, ids);
    assert!(q.quarantined(Some(JobId(u64::MAX)), 3).unwrap().is_empty());
    assert!(matches!(
        q.quarantined(None, 0),
        Err(Error::InvalidOption { .. })
    ));
    assert!(matches!(
        q.quarantined(None, leaseq::BATCH_MAX + 1),
        Err(Error::InvalidOption { .. })
    ));
    assert_eq!(q.quarantined_record(JobId(12345)).unwrap(), None);
}

/// `Queue::payload`'s doc: "`Corrupted` if its row is damaged or quarantined". For a
/// quarantined job it answers `Ok(None)` ("no job has this id"), unlike `Queue::job`, which
/// answers `Corrupted` for the same id.
#[test]

fn payload_of_a_quarantined_job_is_corrupted() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"precious", EnqueueOptions::default())
        .unwrap()
        .id();
    flip_record_byte(&q, id, 5, 0x5A);
    assert!(matches!(q.payload(id), Err(Error::Corrupted { .. })));
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().quarantined, 1);
    assert!(matches!(q.job(id), Err(Error::Corrupted { .. })));
    let r = q.payload(id);
    assert!(matches!(r, Err(Error::Corrupted { .. })), "{r:?}");
}
