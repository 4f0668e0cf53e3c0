//! Adversarial tests for "never strand a lease, never let one bad row stop the queue" (issue 8,
//! cases C34-C37): group commit against the `ack_with` re-run loop, per-lease outcomes,
//! quarantine edge cases (damaged rows in every state, stray and missing index entries), clock
//! wakers, and what a new user of the borrowing API trips over.
//!
//! Written by an adversarial review; every bug it found is fixed and its test kept as a
//! regression test (stray and missing index entries, a dequeue behind many damaged rows, a
//! call on a damaged row inside a shared group).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{Fixture, LEASE, T0_MS, all_ok, assert_consistent, bump, effects, overwrite_record};
use leaseq::{
    Applied, EnqueueOptions, Enqueued, Error, JobId, JobState, Lease, ManualClock, Queue,
};
use redb::TableDefinition;

/// leaseq's own tables, written behind its back to plant damage (as a flaky disk would).
const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("leaseq_jobs");
const READY: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("leaseq_ready");
const SCHEDULED: TableDefinition<(u64, u64), ()> = TableDefinition::new("leaseq_scheduled");
const LEASES: TableDefinition<(u64, u64), ()> = TableDefinition::new("leaseq_leases");
const DEAD: TableDefinition<u64, ()> = TableDefinition::new("leaseq_dead");

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

// ---------------------------------------------------------------------------------------
// What a new user trips over
// ---------------------------------------------------------------------------------------

/// Lease calls borrow: after `ack_batch(&leases)` the leases are still alive. An ended lease
/// (acked, given back, failed, or found lost) lets go of its queue, so a program that acks,
/// drops its queue handle and reopens the file gets it; a lease still open keeps the file
/// open, by design (its holder may still end the attempt).
#[test]
fn ended_leases_let_go_of_the_file_open_ones_keep_it() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 4, EnqueueOptions::default());
    let leases = q.dequeue_batch(3).unwrap();
    all_ok(q.ack_batch(&leases).unwrap());
    let open = q.dequeue().unwrap().unwrap();
    drop(q);
    assert!(matches!(
        f.builder().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    assert!(matches!(leases[0].ack(), Err(Error::LeaseLost { .. })));
    open.ack().unwrap();
    let q = f.open();
    assert!(q.is_empty().unwrap());
    drop(leases);
}
