//! Batch calls and ack-and-fetch-next: one commit each, with the same fencing and attempt
//! counting as the single calls; a batch holding one stale lease fails whole and changes
//! nothing.
//!
//! Adversarial tests of the one-pass batch deletes (`store::dequeue` removing the first N
//! ready entries in one `retain_in`, `Tables::delete_leased` removing a batch's lease entries
//! and job rows in one pass where their keys are dense): a seeded model-based random workload
//! checked against a reference model after every step, plus targeted tests of the dense /
//! fallback boundaries with neighbours inside a pass's key range, large (multi-level) trees,
//! stale batches and concurrent batch acks.

use crate::common;
use crate::common::{Fixture, LEASE, T0_MS, all_ok, assert_consistent, bump, effects, ms};
use leaseq::{
    Applied, Durability, EnqueueOptions, Enqueued, Error, JobId, JobInfo, JobState, Lease, Queue,
    Stats,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

fn payloads(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("job-{i}").into_bytes()).collect()
}

/// Enqueues `payloads(n)` in one batch and returns the new jobs' ids, in order.
fn enqueue_ids(q: &Queue, n: usize) -> Vec<JobId> {
    q.enqueue_batch(
        payloads(n)
            .iter()
            .map(|b| (&b[..], EnqueueOptions::default())),
    )
    .unwrap()
    .into_iter()
    .map(|e| e.id())
    .collect()
}

#[test]
fn enqueue_batch_keeps_order_and_dedups_within_the_batch() {
    let f = Fixture::new();
    let q = f.open();
    let p = payloads(5);
    let res = q
        .enqueue_batch([
            (&p[0][..], EnqueueOptions::default()),
            (&p[1][..], EnqueueOptions::default().dedup_key("k")),
            (&p[2][..], EnqueueOptions::default().dedup_key("k")),
            (&p[3][..], EnqueueOptions::default()),
        ])
        .unwrap();
    let ids: Vec<_> = res.iter().map(|e| e.id()).collect();
    assert!(matches!(res[2], Enqueued::Duplicate(id) if id == ids[1]));
    assert!(matches!(res[3], Enqueued::New(_)));
    assert!(ids[0] < ids[1] && ids[1] < ids[3]);
    let order: Vec<_> = q
        .dequeue_batch(10)
        .unwrap()
        .iter()
        .map(|l| l.id())
        .collect();
    assert_eq!(order, vec![ids[0], ids[1], ids[3]]);
    assert_consistent(&q);
}

#[test]
fn enqueue_batch_with_one_refused_job_writes_nothing() {
    let f = Fixture::new();
    let q = f.builder().payload_bytes_max(10).open(&f.path).unwrap();
    let before = std::fs::read(&f.path).unwrap();
    let err = q
        .enqueue_batch([
            (&b"fine"[..], EnqueueOptions::default()),
            (&[0u8; 11][..], EnqueueOptions::default()),
        ])
        .unwrap_err();
    assert!(
        matches!(err, Error::PayloadTooLarge { size_bytes: 11, .. }),
        "{err:?}"
    );
    let err = q
        .enqueue_batch(std::iter::empty::<(&[u8], EnqueueOptions)>())
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidOption { field: "jobs", .. }),
        "{err:?}"
    );
    assert_eq!(q.len().unwrap(), 0);
    assert_eq!(std::fs::read(&f.path).unwrap(), before);
}

#[test]
fn dequeue_batch_leases_in_order_with_fresh_tokens() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_ids(&q, 7);
    let first = q.dequeue_batch(4).unwrap();
    let rest = q.dequeue_batch(100).unwrap();
    assert!(q.dequeue_batch(3).unwrap().is_empty());
    let got: Vec<_> = first.iter().chain(&rest).map(|l| l.id()).collect();
    assert_eq!(got, ids);
    let mut tokens: Vec<_> = first.iter().chain(&rest).map(|l| l.token()).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 7);
    assert!(first.iter().chain(&rest).all(|l| l.attempt() == 1));
    assert!(matches!(
        q.dequeue_batch(0),
        Err(Error::InvalidOption { field: "max", .. })
    ));
    assert!(matches!(
        q.dequeue_batch(leaseq::BATCH_MAX + 1),
        Err(Error::InvalidOption { field: "max", .. })
    ));
    all_ok(q.ack_batch(&first).unwrap());
    all_ok(q.ack_batch(&rest).unwrap());
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// Leases three jobs, then lets only the middle lease expire and redelivers that job:
/// returns the three original leases (the middle one now stale) and the middle job's current
/// lease.
fn three_leases_middle_stale(f: &Fixture, q: &Queue) -> (Vec<leaseq::Lease>, leaseq::Lease) {
    let p = payloads(3);
    q.enqueue_batch(p.iter().map(|b| (&b[..], EnqueueOptions::default())))
        .unwrap();
    let leases = q.dequeue_batch(3).unwrap();
    f.clock.advance(LEASE / 2);
    leases[0].extend(LEASE).unwrap();
    leases[2].extend(LEASE).unwrap();
    f.clock.advance(LEASE / 2 + Duration::from_millis(1));
    let current = q.dequeue().unwrap().unwrap();
    assert_eq!((current.id(), current.attempt()), (leases[1].id(), 2));
    (leases, current)
}

/// C34: a batch with one stale lease acks the others (their work is done) and reports the
/// stale one in its place; the stale job stays with its new holder.
#[test]
fn ack_batch_with_a_stale_lease_acks_the_rest_and_reports_it() {
    let f = Fixture::new();
    let q = f.open();
    let (leases, current) = three_leases_middle_stale(&f, &q);
    let ids: Vec<_> = leases.iter().map(|l| l.id()).collect();
    let held = q.job(ids[1]).unwrap().unwrap();
    let out = q.ack_batch(&leases).unwrap();
    match out.as_slice() {
        [Ok(()), Err(Error::LeaseLost { job_id, token }), Ok(())] => {
            assert_eq!((*job_id, *token), (ids[1], leases[1].token()));
        }
        other => panic!("expected [Ok, LeaseLost, Ok], got {other:?}"),
    }
    assert_eq!(q.job(ids[0]).unwrap(), None);
    assert_eq!(q.job(ids[2]).unwrap(), None);
    assert_eq!(
        q.job(ids[1]).unwrap().unwrap(),
        held,
        "the new holder's lease untouched"
    );
    // The acked jobs never come back, whatever the clock does.
    f.clock.advance(LEASE * 3);
    let again = q
        .dequeue()
        .unwrap()
        .expect("the middle job, its new lease expired");
    assert_eq!((again.id(), again.attempt()), (ids[1], 3));
    assert!(q.dequeue().unwrap().is_none());
    assert!(matches!(current.ack(), Err(Error::LeaseLost { .. })));
    again.ack().unwrap();
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

#[test]
fn ack_with_batch_with_a_stale_lease_runs_no_effect_for_it() {
    let f = Fixture::new();
    let q = f.open();
    let (leases, current) = three_leases_middle_stale(&f, &q);
    let mut ran = Vec::new();
    let out = q
        .ack_with_batch(&leases, |tx, l| {
            ran.push(l.id());
            bump(tx, l.id().0)
        })
        .unwrap();
    assert!(
        matches!(
            out.as_slice(),
            [
                Ok(Applied::Now),
                Err(Error::LeaseLost { .. }),
                Ok(Applied::Now)
            ]
        ),
        "{out:?}"
    );
    assert_eq!(ran, vec![leases[0].id(), leases[2].id()]);
    assert_eq!(
        effects(&q),
        HashMap::from([(leases[0].id().0, 1), (leases[2].id().0, 1)])
    );
    assert_eq!(q.stats().unwrap().leased, 1);
    assert_eq!(current.ack_with(|tx| bump(tx, 9)).unwrap(), Applied::Now);
    assert_eq!(effects(&q).len(), 3);
    assert_consistent(&q);
}

#[test]
fn ack_with_batch_applies_each_key_once_and_gives_back_only_a_failing_effect() {
    let f = Fixture::new();
    let q = f.open();
    let p = payloads(4);
    let res = q
        .enqueue_batch([
            (&p[0][..], EnqueueOptions::default().idempotency_key("a")),
            (&p[1][..], EnqueueOptions::default().idempotency_key("b")),
            (&p[2][..], EnqueueOptions::default().idempotency_key("a")),
            (&p[3][..], EnqueueOptions::default().idempotency_key("c")),
        ])
        .unwrap();
    let key_of = |id: leaseq::JobId| res.iter().position(|e| e.id() == id).unwrap() as u64;
    let leases = q.dequeue_batch(4).unwrap();
    // The effect of job 3 fails after writing: none of its writes stay, its job is given back
    // with the error; the other effects commit.
    let out = q
        .ack_with_batch(&leases, |tx, l| {
            bump(tx, key_of(l.id()))?;
            if key_of(l.id()) == 3 {
                return Err("no".into());
            }
            Ok(())
        })
        .unwrap();
    match out.as_slice() {
        [
            Ok(Applied::Now),
            Ok(Applied::Now),
            Ok(Applied::AlreadyApplied),
            Err(Error::Effect(e)),
        ] => assert_eq!(e.to_string(), "no"),
        other => panic!("{other:?}"),
    }
    assert_eq!(effects(&q), HashMap::from([(0, 1), (1, 1)]));
    let back = q.job(res[3].id()).unwrap().unwrap();
    assert_eq!(back.state, JobState::Ready);
    assert_eq!(back.last_error.as_deref(), Some("no"));
    assert_eq!(q.stats().unwrap().leased, 0);

    let again = q.dequeue_batch(4).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id(), again[0].attempt()), (res[3].id(), 2));
    let applied = q
        .ack_with_batch(&again, |tx, l| bump(tx, key_of(l.id())))
        .unwrap();
    assert!(matches!(applied.as_slice(), [Ok(Applied::Now)]));
    assert_eq!(effects(&q), HashMap::from([(0, 1), (1, 1), (3, 1)]));
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

#[test]
fn batch_of_another_queue_is_refused() {
    let f = Fixture::new();
    let g = Fixture::new();
    let q = f.open();
    let other = g.open();
    other.enqueue(b"x", EnqueueOptions::default()).unwrap();
    let l = other.dequeue().unwrap().unwrap();
    assert!(matches!(
        q.ack_batch(&[l]),
        Err(Error::InvalidOption {
            field: "leases",
            ..
        })
    ));
}

#[test]
fn ack_and_next_acks_and_leases_in_one_call() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_ids(&q, 3);
    let l = q.dequeue().unwrap().unwrap();
    let l = l.ack_and_next().unwrap().unwrap();
    assert_eq!(l.id(), ids[1]);
    assert_eq!(q.job(ids[0]).unwrap(), None);
    let (applied, next) = l.ack_with_and_next(|tx| bump(tx, 1)).unwrap();
    assert_eq!(applied, Applied::Now);
    let next = next.unwrap();
    assert_eq!(next.id(), ids[2]);
    assert_eq!(next.ack_and_next().unwrap().map(|l| l.id()), None);
    assert!(q.is_empty().unwrap());

    // Stale: nothing acked, nothing leased.
    let a = q.enqueue(b"a", EnqueueOptions::default()).unwrap().id();
    let b = q.enqueue(b"b", EnqueueOptions::default()).unwrap().id();
    let stale = q.dequeue().unwrap().unwrap();
    f.clock.advance(LEASE + Duration::from_millis(1));
    let current = q.dequeue().unwrap().unwrap(); // b first (a went to the back)
    assert_eq!(current.id(), b);
    let err = stale.ack_and_next().unwrap_err();
    assert!(matches!(err, Error::LeaseLost { job_id, .. } if job_id == a));
    let info = q.job(a).unwrap().unwrap();
    assert_eq!((info.state, info.attempts), (JobState::Ready, 1));
    current.ack().unwrap();
    assert_consistent(&q);
}

// Group commit: a lone caller never waits for company, so none of its groups is sealed by
// the gathering bound, each of its calls is one group, and every call is one commit.
#[test]
fn a_lone_caller_never_waits_for_company() {
    let f = Fixture::new();
    let q = f.open();
    let before = q.commit_stats();
    for i in 0..50u32 {
        q.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
            .unwrap();
        let l = q.dequeue().unwrap().expect("the job just enqueued");
        l.ack().unwrap();
    }
    let s = q.commit_stats();
    assert_eq!(s.deadline_seals, before.deadline_seals, "{s:?}");
    assert_eq!(s.commits - before.commits, 150, "{s:?}");
    assert_eq!(s.operations - before.operations, 150, "{s:?}");
}

// Concurrent callers do share commits: with 8 threads, fewer commits than calls.
#[test]
fn concurrent_callers_share_commits() {
    const THREADS: u32 = 8;
    const PER_THREAD: u32 = 40;
    let f = Fixture::new();
    let q = f.open();
    let before = q.commit_stats();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let q = q.clone();
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    q.enqueue(
                        &(t * PER_THREAD + i).to_le_bytes(),
                        EnqueueOptions::default(),
                    )
                    .unwrap();
                }
            });
        }
    });
    let s = q.commit_stats();
    let ops = s.operations - before.operations;
    assert_eq!(ops, u64::from(THREADS * PER_THREAD));
    assert!(
        s.commits - before.commits < ops,
        "no commit was shared: {s:?}"
    );
    assert_eq!(q.len().unwrap(), ops);
    assert_consistent(&q);
}

// Batch acks and batch leases remove their index entries in one pass where the keys are
// dense, one by one otherwise: both must remove exactly the acked jobs, never a neighbour
// inside the range of a pass (job 6 below), and keep every other lease working.
#[test]
fn batch_ack_removes_exactly_its_jobs_dense_or_scattered() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_ids(&q, 30);
    let first = q.dequeue_batch(10).unwrap(); // jobs 0..10, one deadline
    f.clock.advance(Duration::from_millis(5));
    let second = q.dequeue_batch(10).unwrap(); // jobs 10..20, a later deadline
    assert_eq!(first.iter().map(Lease::id).collect::<Vec<_>>(), ids[..10]);
    assert_eq!(
        second.iter().map(Lease::id).collect::<Vec<_>>(),
        ids[10..20]
    );
    let mut held: HashMap<JobId, Lease> = first
        .into_iter()
        .chain(second)
        .map(|l| (l.id(), l))
        .collect();
    let mut take = |idx: &[usize]| -> Vec<Lease> {
        idx.iter().map(|&i| held.remove(&ids[i]).unwrap()).collect()
    };
    // Dense (one deadline, ids 4..=8 without 6): one pass over a range holding job 6.
    all_ok(q.ack_batch(&take(&[4, 5, 7, 8])).unwrap());
    // Scattered: two deadlines, sparse ids.
    all_ok(q.ack_batch(&take(&[1, 3, 12, 19])).unwrap());
    // Dense within the second deadline, acked with effects.
    all_ok(
        q.ack_with_batch(&take(&[14, 15, 16]), |tx, l| bump(tx, l.id().0))
            .unwrap(),
    );
    let gone = [1, 3, 4, 5, 7, 8, 12, 14, 15, 16, 19];
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            q.job(*id).unwrap().is_none(),
            gone.contains(&i),
            "job index {i}"
        );
    }
    assert_eq!(effects(&q).len(), 3);
    assert_consistent(&q);
    // Every lease still held is still current: ack them all, then the ready rest.
    let rest: Vec<Lease> = held.into_values().collect();
    assert_eq!(rest.len(), 20 - 11);
    all_ok(q.ack_batch(&rest).unwrap());
    let ready = q.dequeue_batch(100).unwrap();
    assert_eq!(ready.iter().map(Lease::id).collect::<Vec<_>>(), ids[20..]);
    all_ok(q.ack_batch(&ready).unwrap());
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// `dequeue_batch` stops before the job whose payload would take the batch past
/// `dequeue_batch_bytes`; the first job is always taken, and the jobs after the cut stay
/// ready in their places.
#[test]
fn dequeue_batch_keeps_to_its_byte_budget() {
    let f = Fixture::new();
    let q = f
        .builder()
        .payload_bytes_max(64 << 10)
        .dequeue_batch_bytes(100 << 10)
        .open(&f.path)
        .unwrap();
    // 40 KiB, 40 KiB, 40 KiB, 1 byte, 64 KiB: the budget of 100 KiB fits the first two.
    let sizes = [40 << 10, 40 << 10, 40 << 10, 1, 64 << 10];
    for (i, &n) in sizes.iter().enumerate() {
        q.enqueue(&vec![i as u8; n], EnqueueOptions::default())
            .unwrap();
    }
    let first = q.dequeue_batch(10).unwrap();
    assert_eq!(
        first.iter().map(|l| l.payload()[0]).collect::<Vec<_>>(),
        vec![0, 1]
    );
    let second = q.dequeue_batch(10).unwrap();
    assert_eq!(
        second.iter().map(|l| l.payload()[0]).collect::<Vec<_>>(),
        vec![2, 3],
        "the rest in order; the 64 KiB job would pass the budget"
    );
    let third = q.dequeue_batch(10).unwrap();
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].payload().len(), 64 << 10);
    // A budget smaller than any payload still hands out one job per batch.
    let g = Fixture::new();
    let q2 = g.builder().dequeue_batch_bytes(1).open(&g.path).unwrap();
    for i in 0..3u8 {
        q2.enqueue(&[i; 10], EnqueueOptions::default()).unwrap();
    }
    for i in 0..3u8 {
        let b = q2.dequeue_batch(10).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].payload()[0], i);
    }
    assert!(q2.dequeue_batch(10).unwrap().is_empty());
    for l in first.into_iter().chain(second).chain(third) {
        l.ack().unwrap();
    }
    assert_consistent(&q);
    assert!(matches!(
        g.builder()
            .dequeue_batch_bytes(0)
            .open(g.dir.path().join("z")),
        Err(leaseq::Error::InvalidOption { .. })
    ));
}

/// Adds one to each key's counter with the table opened once (the `ack_with_all` shape).
fn bump_all(tx: &redb::WriteTransaction, keys: &[u64]) -> Result<(), leaseq::BoxError> {
    use redb::ReadableTable;
    let mut t = tx.open_table(common::EFFECTS)?;
    for &key in keys {
        let n = t.get(key)?.map_or(0, |v| v.value());
        t.insert(key, n + 1)?;
    }
    Ok(())
}

#[test]
fn ack_with_all_runs_once_for_the_leases_that_need_it() {
    let f = Fixture::new();
    let q = f.open();
    let (leases, current) = three_leases_middle_stale(&f, &q);
    // One more job, whose key is applied already by an earlier job.
    let p = payloads(2);
    q.enqueue_batch([
        (&p[0][..], EnqueueOptions::default().idempotency_key("k")),
        (&p[1][..], EnqueueOptions::default().idempotency_key("k")),
    ])
    .unwrap();
    let first = q.dequeue().unwrap().unwrap();
    assert_eq!(first.ack_with(|tx| bump(tx, 100)).unwrap(), Applied::Now);
    let keyed = q.dequeue().unwrap().unwrap();
    let mut batch: Vec<Lease> = leases;
    batch.push(keyed);
    let mut calls = Vec::new();
    let out = q
        .ack_with_all(&batch, |tx, ls| {
            let ids: Vec<u64> = ls.iter().map(|l| l.id().0).collect();
            calls.push(ids.clone());
            bump_all(tx, &ids)
        })
        .unwrap();
    assert!(
        matches!(
            out.as_slice(),
            [
                Ok(Applied::Now),
                Err(Error::LeaseLost { .. }),
                Ok(Applied::Now),
                Ok(Applied::AlreadyApplied)
            ]
        ),
        "{out:?}"
    );
    assert_eq!(
        calls,
        vec![vec![batch[0].id().0, batch[2].id().0]],
        "one call"
    );
    assert_eq!(
        effects(&q),
        HashMap::from([(100, 1), (batch[0].id().0, 1), (batch[2].id().0, 1)])
    );
    assert_eq!(
        q.stats().unwrap().leased,
        1,
        "only the stale lease's job is still leased"
    );
    // Nothing needs the closure: it does not run.
    let out = q
        .ack_with_all(std::slice::from_ref(&current), |_, _| Ok(()))
        .unwrap();
    assert!(matches!(out.as_slice(), [Ok(Applied::Now)]));
    let again = q
        .ack_with_all(std::slice::from_ref(&current), |_, _| panic!("ran"))
        .unwrap();
    assert!(matches!(again.as_slice(), [Err(Error::LeaseLost { .. })]));
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

#[test]
fn a_failing_ack_with_all_gives_back_every_lease_it_was_given() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_ids(&q, 4);
    let p = payloads(1);
    let applied = q
        .enqueue(&p[0], EnqueueOptions::default().idempotency_key("done"))
        .unwrap()
        .id();
    let pre = q.dequeue_batch(10).unwrap();
    // The keyed job's key is applied by its own earlier delivery... acked now, alone.
    let (keyed, rest): (Vec<Lease>, Vec<Lease>) = pre.into_iter().partition(|l| l.id() == applied);
    assert_eq!(
        q.ack_with_all(&keyed, |tx, ls| bump_all(tx, &[ls[0].id().0]))
            .unwrap()[0]
            .as_ref()
            .unwrap(),
        &Applied::Now
    );
    // A closure that writes, then fails: nothing of it stays, all four go back.
    let out = q
        .ack_with_all(&rest, |tx, ls| {
            bump_all(tx, &ls.iter().map(|l| l.id().0).collect::<Vec<_>>())?;
            Err("downstream refused".into())
        })
        .unwrap();
    assert_eq!(out.len(), 4);
    for o in &out {
        match o {
            Err(Error::Effect(e)) => assert_eq!(e.to_string(), "downstream refused"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(effects(&q), HashMap::from([(applied.0, 1)]));
    for id in &ids {
        let job = q.job(*id).unwrap().unwrap();
        assert_eq!((job.state, job.attempts), (JobState::Ready, 1));
        assert_eq!(job.last_error.as_deref(), Some("downstream refused"));
    }
    // An Outcome applies to every lease given: snoozed, attempts given back.
    let leases = q.dequeue_batch(10).unwrap();
    assert_eq!(leases.len(), 4);
    let out = q
        .ack_with_all(&leases, |_, _| {
            Err(leaseq::Outcome::Snooze(Duration::from_secs(60)).into())
        })
        .unwrap();
    assert!(out.iter().all(|o| matches!(o, Err(Error::Effect(_)))));
    for id in &ids {
        let job = q.job(*id).unwrap().unwrap();
        assert_eq!(
            (job.state, job.attempts, job.snoozes),
            (JobState::Scheduled, 1, 1)
        );
    }
    // A panic is an error like any other.
    f.clock.advance(Duration::from_secs(61));
    let leases = q.dequeue_batch(10).unwrap();
    let out = q.ack_with_all(&leases, |_, _| panic!("boom")).unwrap();
    assert!(
        out.iter()
            .all(|o| matches!(o, Err(Error::Effect(e)) if e.to_string().contains("boom"))),
        "{out:?}"
    );
    assert_eq!(q.stats().unwrap().leased, 0);
    // And then it applies, once.
    let leases = q.dequeue_batch(10).unwrap();
    let out = q
        .ack_with_all(&leases, |tx, ls| {
            bump_all(tx, &ls.iter().map(|l| l.id().0).collect::<Vec<_>>())
        })
        .unwrap();
    assert!(out.iter().all(|o| matches!(o, Ok(Applied::Now))));
    assert_eq!(effects(&q).len(), 5);
    assert!(effects(&q).values().all(|&n| n == 1));
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// Seeded random batches (keys shared or applied, stale leases, failing effects, follow-up
/// jobs) acked with `ack_with_all` on one file and `ack_with_batch` on another: the same
/// outcomes, effects, jobs and stats.
#[test]
fn ack_with_all_matches_ack_with_batch_on_random_batches() {
    for seed in 0..150u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let plan: Vec<(Option<u8>, bool)> = (0..rng.usize(1..12))
            .map(|_| (rng.bool().then(|| rng.u8(0..4)), rng.u8(0..5) == 0))
            .collect();
        let stale_at = rng.bool().then(|| rng.usize(0..plan.len()));
        // The positions every failing `ack_with_all` call was given: the per-lease side fails
        // exactly those (the all side's next run covers the rest).
        let failed_set = std::cell::RefCell::new(Vec::<usize>::new());
        let run = |all: bool| {
            let f = Fixture::new();
            let q = f.open();
            let p = payloads(plan.len());
            let ids: Vec<JobId> = q
                .enqueue_batch(plan.iter().zip(&p).map(|((key, _), b)| {
                    let o = EnqueueOptions::default();
                    let o = match key {
                        Some(k) => o.idempotency_key([*k]),
                        None => o,
                    };
                    (&b[..], o)
                }))
                .unwrap()
                .into_iter()
                .map(|e| e.id())
                .collect();
            // Key 0 is applied before the batch.
            q.enqueue(b"pre", EnqueueOptions::default().idempotency_key([0u8]))
                .unwrap();
            let mut leases = q.dequeue_batch(plan.len()).unwrap();
            let pre = q.dequeue().unwrap().unwrap();
            pre.ack_with(|tx| bump(tx, 999)).unwrap();
            if let Some(i) = stale_at {
                // Make one lease stale: it expires and another delivery holds the job.
                for (j, l) in leases.iter().enumerate() {
                    if j != i {
                        l.extend(LEASE * 4).unwrap();
                    }
                }
                f.clock.advance(LEASE + Duration::from_millis(1));
                let holder = q.dequeue().unwrap().unwrap();
                assert_eq!(holder.id(), leases[i].id());
            }
            let at = |l: &Lease| ids.iter().position(|id| *id == l.id()).unwrap();
            let fails = |l: &Lease| plan[at(l)].1;
            let effect_of = |tx: &leaseq::Tx<'_>, l: &Lease| -> Result<(), leaseq::BoxError> {
                bump(tx, l.id().0)?;
                tx.enqueue(b"follow-up", EnqueueOptions::default())?;
                Ok(())
            };
            let out = if all {
                // All or nothing: fails when any of its leases would.
                let mut calls = 0;
                let out = q
                    .ack_with_all(&leases, |tx, ls| {
                        calls += 1;
                        for l in ls {
                            effect_of(tx, l)?;
                        }
                        if ls.iter().any(|l| fails(l)) {
                            failed_set.borrow_mut().extend(ls.iter().map(|l| at(l)));
                            return Err("refused".into());
                        }
                        Ok(())
                    })
                    .unwrap();
                assert!(
                    calls <= leases.len() + 1,
                    "one call, and one more per failure"
                );
                out
            } else {
                let set = failed_set.borrow().clone();
                q.ack_with_batch(&leases, |tx, l| {
                    effect_of(tx, l)?;
                    if set.contains(&at(l)) {
                        return Err("refused".into());
                    }
                    Ok(())
                })
                .unwrap()
            };
            let out: Vec<String> = out
                .iter()
                .map(|o| match o {
                    Ok(a) => format!("{a:?}"),
                    Err(Error::Effect(e)) => format!("Effect({e})"),
                    Err(Error::LeaseLost { job_id, .. }) => format!("LeaseLost({job_id:?})"),
                    Err(e) => panic!("{e:?}"),
                })
                .collect();
            let jobs: Vec<_> = ids
                .iter()
                .map(|id| {
                    q.job(*id)
                        .unwrap()
                        .map(|j| (j.state, j.attempts, j.last_error))
                })
                .collect();
            assert_consistent(&q);
            leases.clear();
            (out, effects(&q), jobs, q.stats().unwrap())
        };
        let (a, b) = (run(true), run(false));
        assert_eq!(a, b, "seed {seed}: plan {plan:?}, stale at {stale_at:?}");
    }
}

/// The fields of a `JobInfo` the model predicts (it is `#[non_exhaustive]`).
type InfoView = (
    (JobId, JobState, u32, u32, i32),
    (u64, Option<u64>, Option<u64>),
    (Option<u64>, Option<u64>, u64),
    (Option<String>, Option<Vec<u8>>, Option<Vec<u8>>),
    usize,
);

fn view(j: &JobInfo) -> InfoView {
    (
        (j.id, j.state, j.attempts, j.max_attempts, j.priority),
        (j.run_at_ms, j.died_ms, j.leased_ms),
        (j.lease_deadline_ms, j.lease_token, j.created_ms),
        (
            j.last_error.clone(),
            j.idempotency_key.clone(),
            j.dedup_key.clone(),
        ),
        j.payload_bytes,
    )
}

const LEASE_MS: u64 = 1_000;

const MAX_ATTEMPTS: u32 = 3;

const SWEEP_MAX: usize = 256;

const EXPIRED: &str = "lease expired";

const ABANDONED: &str =
    "lease abandoned: still held when the file was closed or its process exited";

fn builder(f: &Fixture, d: Durability) -> leaseq::Builder {
    Queue::builder()
        .retry(leaseq::RetryPolicy::immediate())
        .lease(ms(LEASE_MS))
        .max_attempts(MAX_ATTEMPTS)
        .clock(f.clock.clone())
        .durability(d)
}

// ---------------------------------------------------------------------------------------------
// Reference model
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum St {
    Scheduled,
    /// Ready with the model's own readiness sequence number.
    Ready(u64),
    Leased {
        token: u64,
        deadline: u64,
    },
    Dead,
}

#[derive(Clone, Debug)]
struct MJob {
    state: St,
    /// The readiness sequence number it had when last leased: a lease returned at reopen
    /// goes back to it (its place in the ready order).
    leased_from_seq: u64,
    priority: i32,
    run_at: u64,
    attempts: u32,
    max_attempts: u32,
    lease_ms: Option<u64>,
    created: u64,
    last_error: Option<String>,
    idem: Option<Vec<u8>>,
    dedup: Option<Vec<u8>>,
    payload: Vec<u8>,
}

fn applied_key(idem: Option<&[u8]>, id: u64) -> Vec<u8> {
    match idem {
        Some(k) => [&[1u8][..], k].concat(),
        None => [&[0u8][..], &id.to_be_bytes()[..]].concat(),
    }
}

/// Whether an effect under idempotency key `idem` runs now (its key not applied yet), marking
/// it applied. A job without a key is keyed by its id: it always runs, and leaseq keeps no
/// marker for it (it would guard nothing once the job is gone).
fn first_apply(applied: &mut HashSet<Vec<u8>>, idem: Option<&[u8]>) -> bool {
    match idem {
        None => true,
        Some(k) => applied.insert(applied_key(Some(k), 0)),
    }
}

#[derive(Default)]
struct Model {
    jobs: BTreeMap<u64, MJob>,
    dedup: HashMap<Vec<u8>, u64>,
    applied: HashSet<Vec<u8>>,
    effects: HashMap<u64, u64>,
    seq: u64,
    max_id: u64,
    max_token: u64,
    /// Ids of acked / removed jobs (the most recent ones are checked to be gone).
    gone: Vec<u64>,
}

impl Model {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn is_current(&self, id: u64, token: u64) -> bool {
        matches!(self.jobs.get(&id), Some(j) if matches!(j.state, St::Leased { token: t, .. } if t == token))
    }

    fn end_attempt(&mut self, id: u64, reason: &str, now: u64, requeue_at: u64) -> JobState {
        let seq = self.seq + 1;
        let j = self.jobs.get_mut(&id).unwrap();
        assert!(matches!(j.state, St::Leased { .. }));
        j.last_error = Some(reason.to_string());
        if j.attempts >= j.max_attempts {
            j.state = St::Dead;
            j.run_at = now; // when it died
            JobState::Dead
        } else {
            j.run_at = requeue_at;
            if requeue_at > now {
                j.state = St::Scheduled;
                JobState::Scheduled
            } else {
                j.state = St::Ready(seq);
                self.seq = seq;
                JobState::Ready
            }
        }
    }

    fn sweep(&mut self, now: u64) {
        let mut due: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == St::Scheduled && j.run_at <= now)
            .map(|(&id, j)| (j.run_at, id))
            .collect();
        due.sort_unstable();
        due.truncate(SWEEP_MAX);
        for (_, id) in due {
            let seq = self.next_seq();
            self.jobs.get_mut(&id).unwrap().state = St::Ready(seq);
        }
        let mut expired: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                St::Leased { deadline, .. } if deadline <= now => Some((deadline, id)),
                _ => None,
            })
            .collect();
        expired.sort_unstable();
        expired.truncate(SWEEP_MAX);
        for (_, id) in expired {
            self.end_attempt(id, EXPIRED, now, now);
        }
    }

    /// Ready jobs in delivery order: priority (lower first), then the order they became ready.
    fn ready_order(&self) -> Vec<u64> {
        let mut r: Vec<(i32, u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                St::Ready(seq) => Some((j.priority, seq, id)),
                _ => None,
            })
            .collect();
        r.sort_unstable();
        r.into_iter().map(|(_, _, id)| id).collect()
    }

    fn delete(&mut self, id: u64) {
        let j = self.jobs.remove(&id).expect("deleting a live job");
        if let Some(k) = j.dedup
            && self.dedup.get(&k) == Some(&id)
        {
            self.dedup.remove(&k);
        }
        self.gone.push(id);
    }

    /// Lease recovery at open: every lease, in (deadline, id) order, back to ready or dead.
    fn recover(&mut self, now: u64) -> (u64, u64) {
        let mut leased: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                St::Leased { deadline, .. } => Some((deadline, id)),
                _ => None,
            })
            .collect();
        leased.sort_unstable();
        let (mut back, mut dead) = (0, 0);
        for (_, id) in leased {
            match self.end_attempt(id, ABANDONED, now, now) {
                JobState::Dead => dead += 1,
                _ => {
                    // Back to the place it had in the ready order.
                    let j = self.jobs.get_mut(&id).unwrap();
                    j.state = St::Ready(j.leased_from_seq);
                    back += 1;
                }
            }
        }
        (back, dead)
    }

    fn stats(&self) -> Stats {
        let mut s = Stats {
            total: self.jobs.len() as u64,
            applied: self.applied.len() as u64,
            dedup_keys: self.dedup.len() as u64,
            ..Stats::default()
        };
        for j in self.jobs.values() {
            match j.state {
                St::Scheduled => s.scheduled += 1,
                St::Ready(_) => s.ready += 1,
                St::Leased { .. } => s.leased += 1,
                St::Dead => s.dead += 1,
            }
        }
        s
    }

    fn info(&self, id: u64) -> InfoView {
        let j = &self.jobs[&id];
        let (state, token, deadline) = match j.state {
            St::Scheduled => (JobState::Scheduled, None, None),
            St::Ready(_) => (JobState::Ready, None, None),
            St::Leased { token, deadline } => (JobState::Leased, Some(token), Some(deadline)),
            St::Dead => (JobState::Dead, None, None),
        };
        (
            (JobId(id), state, j.attempts, j.max_attempts, j.priority),
            (
                j.run_at,
                (state == JobState::Dead).then_some(j.run_at),
                (state == JobState::Leased).then_some(j.run_at),
            ),
            (deadline, token, j.created),
            (j.last_error.clone(), j.idem.clone(), j.dedup.clone()),
            j.payload.len(),
        )
    }

    fn deadline(&self, id: u64) -> u64 {
        match self.jobs[&id].state {
            St::Leased { deadline, .. } => deadline,
            ref s => panic!("job {id} is {s:?}, not leased"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Harness: the queue, the model, the leases a test consumer holds
// ---------------------------------------------------------------------------------------------

/// How often each delete path was driven (summed over seeds, asserted at the end).
#[derive(Default, Debug, Clone, Copy)]
struct Coverage {
    /// Batches of >= 2 leases, one deadline, dense ids: lease entries and rows in one pass.
    lease_and_rows_pass: u64,
    /// ... with a neighbour (not in the batch) inside the lease pass's id range.
    lease_pass_with_neighbour: u64,
    /// Batches with dense ids but several deadlines: rows in one pass, leases one by one.
    rows_pass_only: u64,
    /// Batches of >= 2 with sparse ids: everything one by one.
    sparse_fallback: u64,
    /// Acks of exactly one lease (ack, ack_with, ack-and-next, batch of one).
    single: u64,
    /// Batches refused whole for a stale lease.
    stale_refused: u64,
    /// ack_with batches refused by an effect error.
    effect_refused: u64,
    /// Dequeues that removed >= 2 ready entries in one pass.
    dequeue_pass: u64,
    /// Largest batch acked in one pass.
    largest_pass: u64,
    reopens: u64,
    steps: u64,
}

impl Coverage {
    fn add(&mut self, o: Coverage) {
        self.lease_and_rows_pass += o.lease_and_rows_pass;
        self.lease_pass_with_neighbour += o.lease_pass_with_neighbour;
        self.rows_pass_only += o.rows_pass_only;
        self.sparse_fallback += o.sparse_fallback;
        self.single += o.single;
        self.stale_refused += o.stale_refused;
        self.effect_refused += o.effect_refused;
        self.dequeue_pass += o.dequeue_pass;
        self.largest_pass = self.largest_pass.max(o.largest_pass);
        self.reopens += o.reopens;
        self.steps += o.steps;
    }
}

struct Harness {
    seed: u64,
    f: Fixture,
    durability: Durability,
    q: Option<Queue>,
    m: Model,
    held: Vec<Lease>,
    rng: fastrand::Rng,
    trace: Vec<String>,
    cov: Coverage,
    /// Bias: dequeue batch sizes and enqueue batch sizes scale with this.
    scale: usize,
    /// Whether jobs get varied priorities, delays and lease durations (sparse ids within a
    /// delivery, several deadlines) or mostly the defaults (dense ids, one deadline).
    varied: bool,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let from = self.trace.len().saturating_sub(40);
            eprintln!(
                "seed {} failed after {} steps; last operations:\n  {}",
                self.seed,
                self.trace.len(),
                self.trace[from..].join("\n  ")
            );
        }
    }
}

const DEDUP_POOL: usize = 8;

const IDEM_POOL: usize = 6;

struct Spec {
    payload: Vec<u8>,
    opts: EnqueueOptions,
    priority: i32,
    delay: u64,
    max_attempts: Option<u32>,
    lease_ms: Option<u64>,
    dedup: Option<Vec<u8>>,
    idem: Option<Vec<u8>>,
}

impl Harness {
    fn new(seed: u64, durability: Durability, scale: usize, varied: bool) -> Harness {
        let f = Fixture::new();
        let q = builder(&f, durability).open(&f.path).unwrap();
        Harness {
            seed,
            f,
            durability,
            q: Some(q),
            m: Model::default(),
            held: Vec::new(),
            rng: fastrand::Rng::with_seed(seed),
            trace: Vec::new(),
            cov: Coverage::default(),
            scale,
            varied,
        }
    }

    fn q(&self) -> &Queue {
        self.q.as_ref().unwrap()
    }

    fn now(&self) -> u64 {
        use leaseq::Clock;
        self.f.clock.now_ms()
    }

    fn log(&mut self, s: String) {
        self.trace.push(format!(
            "[{}] t+{} {s}",
            self.trace.len(),
            self.now() - T0_MS
        ));
    }

    fn spec(&mut self) -> Spec {
        let varied = self.varied;
        let r = &mut self.rng;
        let len = match r.u8(0..20) {
            0 => r.usize(2000..6000),
            1..=5 => r.usize(100..800),
            _ => r.usize(0..40),
        };
        let payload: Vec<u8> = (0..len).map(|_| r.u8(..)).collect();
        let priority = match if varied { r.u8(0..12) } else { 12 } {
            0 => i32::MIN,
            1 => i32::MAX,
            2..=3 => -1,
            4..=5 => 1,
            6 => 7,
            _ => 0,
        };
        let delay = if r.u8(0..if varied { 5 } else { 30 }) == 0 {
            r.u64(1..2000)
        } else {
            0
        };
        let max_attempts = match r.u8(0..6) {
            0 => Some(1),
            1 => Some(2),
            _ => None,
        };
        let lease_ms = match r.u8(0..if varied { 6 } else { 40 }) {
            0 => Some(200),
            1 => Some(3000),
            _ => None,
        };
        let dedup = (r.u8(0..4) == 0).then(|| format!("d{}", r.usize(0..DEDUP_POOL)).into_bytes());
        let idem = (r.u8(0..3) == 0).then(|| format!("i{}", r.usize(0..IDEM_POOL)).into_bytes());
        let mut opts = EnqueueOptions::default().priority(priority);
        if delay > 0 {
            opts = opts.delay(ms(delay));
        }
        if let Some(a) = max_attempts {
            opts = opts.max_attempts(a);
        }
        if let Some(l) = lease_ms {
            opts = opts.lease(ms(l));
        }
        if let Some(k) = &dedup {
            opts = opts.dedup_key(k);
        }
        if let Some(k) = &idem {
            opts = opts.idempotency_key(k);
        }
        Spec {
            payload,
            opts,
            priority,
            delay,
            max_attempts,
            lease_ms,
            dedup,
            idem,
        }
    }

    // ---- checks ---------------------------------------------------------------------------

    fn check_stats(&self) {
        assert_eq!(self.q().stats().unwrap(), self.m.stats(), "stats");
    }

    fn check_jobs(&self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            let got = self.q().job(JobId(id)).unwrap();
            match self.m.jobs.get(&id) {
                Some(_) => assert_eq!(got.as_ref().map(view), Some(self.m.info(id)), "job {id}"),
                None => assert_eq!(got, None, "job {id} should be gone"),
            }
        }
    }

    /// After a refused batch: the batch's jobs, stats, effects and markers are unchanged.
    fn check_unchanged(&self, ids: &[u64]) {
        self.check_stats();
        self.check_jobs(ids.iter().copied());
        assert_eq!(effects(self.q()), self.m.effects, "effects table");
    }

    /// Everything: stats, every live job, the recently deleted ones, effects, dedup owners
    /// (through `check`), applied markers of the key pool.
    fn check_all(&self) {
        self.check_stats();
        self.check_jobs(self.m.jobs.keys().copied());
        let from = self.m.gone.len().saturating_sub(64);
        self.check_jobs(self.m.gone[from..].iter().copied());
        assert_eq!(effects(self.q()), self.m.effects, "effects table");
        for i in 0..IDEM_POOL {
            let k = format!("i{i}").into_bytes();
            assert_eq!(
                self.q().is_applied(&k).unwrap(),
                self.m.applied.contains(&applied_key(Some(&k), 0)),
                "is_applied(i{i})"
            );
        }
        assert_consistent(self.q());
    }

    // ---- operations -----------------------------------------------------------------------

    fn enqueue(&mut self, n: usize) {
        let now = self.now();
        let specs: Vec<Spec> = (0..n).map(|_| self.spec()).collect();
        let res = if n == 1 && self.rng.bool() {
            vec![
                self.q()
                    .enqueue(&specs[0].payload, specs[0].opts.clone())
                    .unwrap(),
            ]
        } else {
            self.q()
                .enqueue_batch(specs.iter().map(|s| (&s.payload[..], s.opts.clone())))
                .unwrap()
        };
        assert_eq!(res.len(), n);
        let mut new = 0;
        for (s, r) in specs.into_iter().zip(res) {
            if let Some(k) = &s.dedup
                && let Some(&owner) = self.m.dedup.get(k)
            {
                let want = if self.m.jobs[&owner].state == St::Dead {
                    Enqueued::DuplicateDead(JobId(owner))
                } else {
                    Enqueued::Duplicate(JobId(owner))
                };
                assert_eq!(r, want, "dedup key {k:?}");
                continue;
            }
            let Enqueued::New(JobId(id)) = r else {
                panic!("expected a new job, got {r:?} (dedup {:?})", s.dedup)
            };
            assert!(id > self.m.max_id, "id {id} not fresh");
            self.m.max_id = id;
            new += 1;
            let state = if s.delay > 0 {
                St::Scheduled
            } else {
                St::Ready(self.m.next_seq())
            };
            if let Some(k) = &s.dedup {
                self.m.dedup.insert(k.clone(), id);
            }
            self.m.jobs.insert(
                id,
                MJob {
                    state,
                    leased_from_seq: 0,
                    priority: s.priority,
                    run_at: now + s.delay,
                    attempts: 0,
                    max_attempts: s.max_attempts.unwrap_or(MAX_ATTEMPTS),
                    lease_ms: s.lease_ms,
                    created: now,
                    last_error: None,
                    idem: s.idem,
                    dedup: s.dedup,
                    payload: s.payload,
                },
            );
        }
        self.log(format!("enqueue {n}: {new} new"));
    }

    /// The model side of a dequeue of up to `max` at `now` that returned `got`.
    fn expect_dequeued(&mut self, now: u64, max: usize, got: &[Lease]) {
        self.m.sweep(now);
        let order = self.m.ready_order();
        let want = &order[..max.min(order.len())];
        let ids: Vec<u64> = got.iter().map(|l| l.id().0).collect();
        assert_eq!(ids, want, "delivery order (max {max})");
        for l in got {
            let id = l.id().0;
            assert!(
                l.token() > self.m.max_token,
                "token {} not fresh",
                l.token()
            );
            self.m.max_token = l.token();
            let j = self.m.jobs.get_mut(&id).unwrap();
            j.attempts += 1;
            let deadline = now + j.lease_ms.unwrap_or(LEASE_MS);
            let St::Ready(seq) = j.state else {
                panic!("job {id} leased from {:?}", j.state)
            };
            j.leased_from_seq = seq;
            // A leased job's run_at is when its delivery began.
            j.run_at = now;
            j.state = St::Leased {
                token: l.token(),
                deadline,
            };
            assert_eq!(l.attempt(), j.attempts, "attempt of {id}");
            assert_eq!(l.deadline_ms(), deadline, "deadline of {id}");
            assert_eq!(l.payload(), &j.payload[..], "payload of {id}");
        }
        if got.len() >= 2 {
            self.cov.dequeue_pass += 1;
        }
    }

    fn dequeue(&mut self, max: usize) {
        let now = self.now();
        let got: Vec<Lease> = if max == 1 && self.rng.bool() {
            self.q().dequeue().unwrap().into_iter().collect()
        } else {
            self.q().dequeue_batch(max).unwrap()
        };
        self.log(format!(
            "dequeue {max}: {:?}",
            got.iter().map(|l| l.id().0).collect::<Vec<_>>()
        ));
        self.expect_dequeued(now, max, &got);
        self.held.extend(got);
    }

    fn current(&self, l: &Lease) -> bool {
        self.m.is_current(l.id().0, l.token())
    }

    /// Records which delete path a batch of current leases takes (mirrors `delete_leased`).
    fn classify(&mut self, ids: &[u64]) {
        if ids.len() == 1 {
            self.cov.single += 1;
            return;
        }
        let mut keys: Vec<(u64, u64)> = ids.iter().map(|&id| (self.m.deadline(id), id)).collect();
        keys.sort_unstable();
        let mut sorted: Vec<u64> = ids.to_vec();
        sorted.sort_unstable();
        let n = ids.len() as u64;
        let dense = sorted[sorted.len() - 1] - sorted[0] < 2 * n;
        let one_deadline = keys[0].0 == keys[keys.len() - 1].0;
        if dense && one_deadline {
            self.cov.lease_and_rows_pass += 1;
            self.cov.largest_pass = self.cov.largest_pass.max(n);
            let d = keys[0].0;
            let (lo, hi) = (sorted[0], sorted[sorted.len() - 1]);
            let neighbour = self.m.jobs.iter().any(|(&id, j)| {
                (lo..=hi).contains(&id)
                    && !sorted.contains(&id)
                    && matches!(j.state, St::Leased { deadline, .. } if deadline == d)
            });
            if neighbour {
                self.cov.lease_pass_with_neighbour += 1;
            }
        } else if dense {
            self.cov.rows_pass_only += 1;
        } else {
            self.cov.sparse_fallback += 1;
        }
    }

    /// Picks leases to ack together, by index into `held`, in batch order.
    fn pick_batch(&mut self) -> Vec<usize> {
        let cur: Vec<usize> = (0..self.held.len())
            .filter(|&i| self.current(&self.held[i]))
            .collect();
        let stale: Vec<usize> = (0..self.held.len())
            .filter(|&i| !self.current(&self.held[i]))
            .collect();
        let by_id = |v: &mut Vec<usize>, held: &[Lease]| v.sort_by_key(|&i| held[i].id());
        let mut chosen: Vec<usize> = Vec::new();
        if !cur.is_empty() {
            let strategy = self.rng.u8(0..6);
            // Leases grouped by their deadline (the model's).
            let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
            for &i in &cur {
                groups
                    .entry(self.m.deadline(self.held[i].id().0))
                    .or_default()
                    .push(i);
            }
            let groups: Vec<Vec<usize>> = groups.into_values().collect();
            match strategy {
                // A window of one deadline's leases, with holes.
                0..=2 => {
                    let mut g = groups[self.rng.usize(0..groups.len())].clone();
                    by_id(&mut g, &self.held);
                    let start = self.rng.usize(0..g.len());
                    let len = self.rng.usize(1..=g.len() - start);
                    let keep = self.rng.u8(50..=100);
                    chosen = g[start..start + len]
                        .iter()
                        .copied()
                        .filter(|_| self.rng.u8(0..100) < keep)
                        .collect();
                    if chosen.is_empty() {
                        chosen.push(g[start]);
                    }
                }
                // All of one deadline.
                3 => chosen = groups[self.rng.usize(0..groups.len())].clone(),
                // A window over every current lease (any deadlines).
                4 => {
                    let mut g = cur.clone();
                    by_id(&mut g, &self.held);
                    let start = self.rng.usize(0..g.len());
                    let len = self.rng.usize(1..=g.len() - start);
                    chosen = g[start..start + len].to_vec();
                }
                // A random subset.
                _ => {
                    let p = self.rng.u8(5..=60);
                    chosen = cur
                        .iter()
                        .copied()
                        .filter(|_| self.rng.u8(0..100) < p)
                        .collect();
                }
            }
        }
        if !stale.is_empty() && (chosen.is_empty() || self.rng.u8(0..6) == 0) {
            let s = stale[self.rng.usize(0..stale.len())];
            let at = self.rng.usize(0..=chosen.len());
            chosen.insert(at, s);
        }
        if self.rng.bool() {
            self.rng.shuffle(&mut chosen);
        }
        chosen
    }

    /// Takes the leases at `idx` out of `held`, in that order.
    fn take(&mut self, idx: &[usize]) -> Vec<Lease> {
        let mut slots: Vec<Option<Lease>> = std::mem::take(&mut self.held)
            .into_iter()
            .map(Some)
            .collect();
        let out: Vec<Lease> = idx.iter().map(|&i| slots[i].take().unwrap()).collect();
        self.held = slots.into_iter().flatten().collect();
        out
    }

    fn expect_lease_lost(&mut self, r: Result<impl std::fmt::Debug, Error>, stale: (u64, u64)) {
        match r {
            Err(Error::LeaseLost { job_id, token }) => {
                assert_eq!(
                    (job_id.0, token),
                    stale,
                    "LeaseLost names the first stale lease"
                )
            }
            other => panic!("expected LeaseLost for {stale:?}, got {other:?}"),
        }
        self.cov.stale_refused += 1;
    }

    /// A batch of held leases to ack, their ids, and the first stale one (id, token).
    #[allow(clippy::type_complexity)]
    fn take_batch(&mut self) -> Option<(Vec<Lease>, Vec<u64>, Option<(u64, u64)>)> {
        let idx = self.pick_batch();
        if idx.is_empty() {
            return None;
        }
        let batch = self.take(&idx);
        let ids: Vec<u64> = batch.iter().map(|l| l.id().0).collect();
        let first_stale = batch
            .iter()
            .find(|l| !self.current(l))
            .map(|l| (l.id().0, l.token()));
        Some((batch, ids, first_stale))
    }

    /// Checks a batch call's per-lease outcomes for the stale leases (`LeaseLost`, naming
    /// that lease) and returns the ids of the current ones.
    fn expect_stale_reported<T: std::fmt::Debug>(
        &mut self,
        batch: &[Lease],
        current: &[bool],
        out: &[Result<T, Error>],
    ) -> Vec<u64> {
        assert_eq!(out.len(), batch.len(), "one outcome per lease");
        let mut acked = Vec::new();
        for ((l, &cur), r) in batch.iter().zip(current).zip(out) {
            if cur {
                acked.push(l.id().0);
                continue;
            }
            match r {
                Err(Error::LeaseLost { job_id, token }) => {
                    assert_eq!(
                        (job_id.0, *token),
                        (l.id().0, l.token()),
                        "LeaseLost names it"
                    )
                }
                other => panic!("expected LeaseLost for a stale lease, got {other:?}"),
            }
            self.cov.stale_refused += 1;
        }
        acked
    }

    fn ack_batch(&mut self) {
        let Some((batch, ids, first_stale)) = self.take_batch() else {
            return;
        };
        let current: Vec<bool> = batch.iter().map(|l| self.current(l)).collect();
        self.log(format!("ack_batch {ids:?} stale {first_stale:?}"));
        let out = self.q().ack_batch(&batch).unwrap();
        let acked = self.expect_stale_reported(&batch, &current, &out);
        for (r, _) in out.iter().zip(&current).filter(|(_, c)| **c) {
            assert!(r.is_ok(), "a current lease of the batch: {r:?}");
        }
        if acked.is_empty() {
            self.check_unchanged(&ids);
            return;
        }
        self.classify(&acked);
        for &id in &acked {
            self.m.delete(id);
        }
        self.check_jobs(ids);
    }

    /// The predicted outcome of `ack_with_batch` over `batch` when the closure of job
    /// `failed` fails (it is given back): per lease, the effects that run in order, and the
    /// applied keys afterwards.
    #[allow(clippy::type_complexity)]
    fn plan_ack_with(
        &self,
        batch: &[Lease],
        failed: Option<u64>,
    ) -> (
        Vec<Result<Applied, &'static str>>,
        Vec<u64>,
        HashSet<Vec<u8>>,
    ) {
        let mut applied = self.m.applied.clone();
        let (mut want, mut calls) = (Vec::new(), Vec::new());
        for l in batch {
            let id = l.id().0;
            if !self.current(l) {
                want.push(Err("LeaseLost"));
            } else if failed == Some(id) {
                want.push(Err("Effect"));
            } else if first_apply(&mut applied, self.m.jobs[&id].idem.as_deref()) {
                want.push(Ok(Applied::Now));
                calls.push(id);
            } else {
                want.push(Ok(Applied::AlreadyApplied));
            }
        }
        (want, calls, applied)
    }

    fn ack_with_batch(&mut self) {
        let Some((batch, ids, first_stale)) = self.take_batch() else {
            return;
        };
        let current: Vec<bool> = batch.iter().map(|l| self.current(l)).collect();
        let (_, first_calls, _) = self.plan_ack_with(&batch, None);
        let fail_at = (!first_calls.is_empty() && self.rng.u8(0..8) == 0)
            .then(|| self.rng.usize(0..first_calls.len()));
        let failed = fail_at.map(|k| first_calls[k]);
        let (want, want_calls, applied) = self.plan_ack_with(&batch, failed);
        self.log(format!(
            "ack_with_batch {ids:?} stale {first_stale:?} fail_at {fail_at:?}"
        ));
        let mut calls = Vec::new();
        let out = self
            .q()
            .ack_with_batch(&batch, |tx, l| {
                calls.push(l.id().0);
                if failed == Some(l.id().0) {
                    return Err("injected effect failure".into());
                }
                bump(tx, l.id().0)
            })
            .unwrap();
        self.expect_stale_reported(&batch, &current, &out);
        let got: Vec<Result<Applied, &str>> = out
            .iter()
            .map(|r| match r {
                Ok(a) => Ok(*a),
                Err(Error::LeaseLost { .. }) => Err("LeaseLost"),
                Err(Error::Effect(e)) => {
                    assert_eq!(e.to_string(), "injected effect failure");
                    Err("Effect")
                }
                Err(e) => panic!("ack_with_batch: {e}"),
            })
            .collect();
        assert_eq!(got, want, "outcomes of {ids:?}");
        // A failing closure drops the transaction; the call runs again without it.
        let mut want_all_calls = match fail_at {
            Some(k) => first_calls[..=k].to_vec(),
            None => Vec::new(),
        };
        want_all_calls.extend(&want_calls);
        assert_eq!(calls, want_all_calls, "effects run, in order");
        if let Some(id) = failed {
            self.cov.effect_refused += 1;
            let now = self.now();
            self.m.end_attempt(id, "injected effect failure", now, now);
        }
        let acked: Vec<u64> = batch
            .iter()
            .zip(&want)
            .filter(|(_, w)| w.is_ok())
            .map(|(l, _)| l.id().0)
            .collect();
        if !acked.is_empty() {
            self.classify(&acked);
        }
        self.m.applied = applied;
        for &id in &want_calls {
            *self.m.effects.entry(id).or_default() += 1;
        }
        for &id in &acked {
            self.m.delete(id);
        }
        self.check_jobs(ids);
    }

    /// Leases a batch, then acks (or acks with effects) part of it at once: every other
    /// lease, all but a few, or a contiguous run, so the acked leases share a deadline and
    /// the ones kept are neighbours inside the pass's range. The kept ones stay held.
    fn dequeue_then_ack_part(&mut self, max: usize) {
        let before = self.held.len();
        self.dequeue(max);
        let got = self.held.len() - before;
        if got < 2 {
            return;
        }
        let idx: Vec<usize> = match self.rng.u8(0..4) {
            0 => (before..self.held.len()).step_by(2).collect(),
            1 => (before + 1..self.held.len()).step_by(2).collect(),
            2 => (before..self.held.len())
                .filter(|_| self.rng.u8(0..10) < 8)
                .collect(),
            _ => {
                let a = self.rng.usize(before..self.held.len());
                let b = self.rng.usize(a..self.held.len());
                (a..=b).collect()
            }
        };
        if idx.is_empty() {
            return;
        }
        let batch = self.take(&idx);
        let ids: Vec<u64> = batch.iter().map(|l| l.id().0).collect();
        self.log(format!("ack part {ids:?}"));
        if self.rng.bool() {
            all_ok(self.q().ack_batch(&batch).unwrap());
        } else {
            let mut applied = self.m.applied.clone();
            let mut want = Vec::new();
            for &id in &ids {
                let j = &self.m.jobs[&id];
                if first_apply(&mut applied, j.idem.as_deref()) {
                    want.push(Applied::Now);
                    *self.m.effects.entry(id).or_default() += 1;
                } else {
                    want.push(Applied::AlreadyApplied);
                }
            }
            let got = all_ok(
                self.q()
                    .ack_with_batch(&batch, |tx, l| bump(tx, l.id().0))
                    .unwrap(),
            );
            assert_eq!(got, want);
            self.m.applied = applied;
        }
        self.classify(&ids);
        for &id in &ids {
            self.m.delete(id);
        }
        self.check_jobs(ids);
    }

    fn pick_one(&mut self) -> Option<Lease> {
        if self.held.is_empty() {
            return None;
        }
        let i = self.rng.usize(0..self.held.len());
        Some(self.held.swap_remove(i))
    }

    /// One lease ended alone: ack, ack_with, ack-and-next, ack_with-and-next, nack(_after),
    /// fail, extend, or simply dropped.
    fn single(&mut self) {
        let Some(l) = self.pick_one() else { return };
        let (id, token) = (l.id().0, l.token());
        let current = self.current(&l);
        let now = self.now();
        let op = self.rng.u8(0..9);
        self.log(format!("single op {op} on {id}/{token} current {current}"));
        match op {
            0 | 1 => {
                let r = l.ack();
                if !current {
                    return self.expect_lease_lost(r, (id, token));
                }
                r.unwrap();
                self.cov.single += 1;
                self.m.delete(id);
            }
            2 => {
                let r = l.ack_and_next();
                if !current {
                    self.expect_lease_lost(r, (id, token));
                    return self.check_unchanged(&[id]);
                }
                let next = r.unwrap();
                self.cov.single += 1;
                self.m.delete(id);
                let got: Vec<Lease> = next.into_iter().collect();
                self.expect_dequeued(now, 1, &got);
                self.held.extend(got);
            }
            3 => {
                let idem = self.m.jobs.get(&id).map(|j| j.idem.clone());
                let mut ran = 0;
                let and_next = self.rng.bool();
                let r = if and_next {
                    l.ack_with_and_next(|tx| {
                        ran += 1;
                        bump(tx, id)
                    })
                } else {
                    l.ack_with(|tx| {
                        ran += 1;
                        bump(tx, id)
                    })
                    .map(|a| (a, None))
                };
                if !current {
                    assert_eq!(ran, 0);
                    self.expect_lease_lost(r, (id, token));
                    return self.check_unchanged(&[id]);
                }
                let (applied, next) = r.unwrap();
                let idem = idem.unwrap();
                if first_apply(&mut self.m.applied, idem.as_deref()) {
                    assert_eq!((applied, ran), (Applied::Now, 1));
                    *self.m.effects.entry(id).or_default() += 1;
                } else {
                    assert_eq!((applied, ran), (Applied::AlreadyApplied, 0));
                }
                self.cov.single += 1;
                self.m.delete(id);
                if and_next {
                    let got: Vec<Lease> = next.into_iter().collect();
                    self.expect_dequeued(now, 1, &got);
                    self.held.extend(got);
                } else {
                    assert!(next.is_none());
                }
            }
            4 | 5 => {
                let backoff = if op == 5 { self.rng.u64(1..1500) } else { 0 };
                let r = l.nack_after("why: nack", ms(backoff));
                if !current {
                    return self.expect_lease_lost(r, (id, token));
                }
                let want = self.m.end_attempt(id, "why: nack", now, now + backoff);
                assert_eq!(r.unwrap(), want);
            }
            6 => {
                let r = l.fail("why: fail");
                if !current {
                    return self.expect_lease_lost(r, (id, token));
                }
                r.unwrap();
                let j = self.m.jobs.get_mut(&id).unwrap();
                j.state = St::Dead;
                j.run_at = now; // when it died
                j.last_error = Some("why: fail".into());
            }
            7 => {
                let by = match self.rng.u8(0..3) {
                    0 => LEASE_MS,
                    1 => 2 * LEASE_MS,
                    _ => self.rng.u64(1..3000),
                };
                let r = l.extend(ms(by));
                if !current {
                    self.expect_lease_lost(r, (id, token));
                    self.held.push(l);
                    return;
                }
                r.unwrap();
                assert_eq!(l.deadline_ms(), now + by);
                self.m.jobs.get_mut(&id).unwrap().state = St::Leased {
                    token,
                    deadline: now + by,
                };
                self.held.push(l);
            }
            _ => drop(l), // abandoned: stays leased until it expires
        }
        self.check_jobs([id]);
    }

    fn remove_or_requeue(&mut self) {
        if self.m.jobs.is_empty() {
            return;
        }
        let ids: Vec<u64> = self.m.jobs.keys().copied().collect();
        // Prefer dead jobs half the time.
        let dead: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| self.m.jobs[id].state == St::Dead)
            .collect();
        let id = if !dead.is_empty() && self.rng.bool() {
            dead[self.rng.usize(0..dead.len())]
        } else {
            ids[self.rng.usize(0..ids.len())]
        };
        let state = self.m.jobs[&id].state.clone();
        let now = self.now();
        if self.rng.bool() {
            self.log(format!("remove {id} ({state:?})"));
            let r = self.q().remove(JobId(id));
            if matches!(state, St::Leased { .. }) {
                assert!(
                    matches!(
                        r,
                        Err(Error::InvalidState {
                            actual: JobState::Leased,
                            ..
                        })
                    ),
                    "{r:?}"
                );
            } else {
                r.unwrap();
                self.m.delete(id);
            }
        } else {
            self.log(format!("requeue_dead {id} ({state:?})"));
            let r = self.q().requeue_dead(JobId(id));
            if state == St::Dead {
                r.unwrap();
                let seq = self.m.next_seq();
                let j = self.m.jobs.get_mut(&id).unwrap();
                j.state = St::Ready(seq);
                j.attempts = 0;
                j.run_at = now;
            } else {
                assert!(matches!(r, Err(Error::InvalidState { .. })), "{r:?}");
            }
        }
        self.check_jobs([id]);
    }

    fn advance(&mut self) {
        let by = match self.rng.u8(0..8) {
            0 | 1 => 1,
            2..=4 => self.rng.u64(1..100),
            5 => LEASE_MS + 1,
            6 => 200,
            _ => self.rng.u64(1..2 * LEASE_MS),
        };
        self.log(format!("advance {by} ms"));
        self.f.clock.advance(ms(by));
    }

    fn reopen(&mut self) {
        self.log("reopen".into());
        self.held.clear();
        let q = self.q.take().unwrap();
        q.flush().unwrap();
        drop(q);
        let q = builder(&self.f, self.durability)
            .open(&self.f.path)
            .unwrap();
        let (back, dead) = self.m.recover(self.now());
        let r = q.recovery();
        assert_eq!(
            (r.leases_returned, r.leases_dead_lettered, r.created),
            (back, dead, false),
            "{r:?}"
        );
        self.q = Some(q);
        self.cov.reopens += 1;
        self.check_all();
    }

    fn step(&mut self) {
        self.cov.steps += 1;
        let live = self.m.jobs.len();
        let ready = self.m.stats().ready as usize;
        let k = self.rng.u8(0..100);
        match k {
            0..=9 => {
                let n = if self.rng.u8(0..4) == 0 {
                    self.rng.usize(1..=4 * self.scale)
                } else {
                    1
                };
                if live < 40 * self.scale {
                    self.enqueue(n);
                } else {
                    self.ack_batch();
                }
            }
            10..=14 => {
                let n = self.rng.usize(2..=2 * self.scale);
                if live < 40 * self.scale {
                    self.enqueue(n);
                } else {
                    self.dequeue(n);
                }
            }
            15..=29 => {
                let n = match self.rng.u8(0..4) {
                    0 => 1,
                    1 => self.rng.usize(2..=4),
                    2 => self.rng.usize(2..=(ready + 2)),
                    _ => self.rng.usize(2..=3 * self.scale),
                };
                self.dequeue(n);
            }
            30..=37 => {
                let n = self.rng.usize(2..=3 * self.scale);
                self.dequeue_then_ack_part(n);
            }
            38..=49 => self.ack_batch(),
            50..=61 => self.ack_with_batch(),
            62..=79 => self.single(),
            80..=85 => self.remove_or_requeue(),
            86..=97 => self.advance(),
            _ => {
                if self.rng.u8(0..3) == 0 {
                    self.reopen();
                } else {
                    self.advance();
                }
            }
        }
        self.check_stats();
        if self.cov.steps.is_multiple_of(16) {
            self.check_all();
        } else if self.cov.steps.is_multiple_of(4) {
            assert_consistent(self.q());
        }
    }
}

fn run_seed(
    seed: u64,
    steps: usize,
    durability: Durability,
    scale: usize,
    varied: bool,
) -> Coverage {
    let mut h = Harness::new(seed, durability, scale, varied);
    // Start with a few big batches so the trees have several levels.
    let n = h.rng.usize(10 * scale..=30 * scale);
    h.enqueue(n);
    let m = h.rng.usize(2..=n);
    h.dequeue(m);
    h.check_all();
    for _ in 0..steps {
        h.step();
    }
    h.check_all();
    // Drain: every held lease acked or stale, everything else delivered and acked.
    h.reopen();
    loop {
        h.f.clock.advance(ms(3 * LEASE_MS));
        let now = h.now();
        let got = h.q().dequeue_batch(leaseq::BATCH_MAX).unwrap();
        h.expect_dequeued(now, leaseq::BATCH_MAX, &got);
        if got.is_empty() && h.m.stats().scheduled == 0 && h.m.stats().leased == 0 {
            break;
        }
        if !got.is_empty() {
            let ids: Vec<u64> = got.iter().map(|l| l.id().0).collect();
            all_ok(h.q().ack_batch(&got).unwrap());
            h.classify(&ids);
            for id in ids {
                h.m.delete(id);
            }
        }
        h.check_all();
    }
    let dead: Vec<u64> = h.m.jobs.keys().copied().collect();
    for id in dead {
        h.q().remove(JobId(id)).unwrap();
        h.m.delete(id);
    }
    h.check_all();
    assert_eq!(h.q().len().unwrap(), 0);
    h.cov
}

/// A seeded random workload over every call that reaches the changed code, checked against
/// the reference model: every step the delivery order, tokens, attempts, deadlines,
/// payloads, outcomes, stats and the touched jobs' full snapshots; after a refusal the
/// batch's jobs, stats and effects unchanged; `check()` every 4th step; every live job,
/// recently deleted ids, effects and applied markers every 16th step, after each reopen and
/// at the end (after draining everything).
#[test]
fn model_random_workload() {
    let mut total = Coverage::default();
    // (seed, steps, durability, scale, varied): small and large trees, dense and sparse ids.
    let runs: &[(u64, usize, Durability, usize, bool)] = &[
        (1, 250, Durability::None, 2, true),
        (2, 250, Durability::None, 2, false),
        (3, 250, Durability::None, 5, true),
        (4, 250, Durability::None, 5, false),
        (5, 200, Durability::None, 10, true),
        (6, 200, Durability::None, 20, false),
        (7, 150, Durability::Immediate, 3, true),
        (8, 150, Durability::Immediate, 3, false),
    ];
    for &(seed, steps, d, scale, varied) in runs {
        let c = run_seed(seed, steps, d, scale, varied);
        eprintln!("seed {seed}: {c:?}");
        total.add(c);
    }
    eprintln!("total: {total:?}");
    assert!(total.lease_and_rows_pass >= 20, "{total:?}");
    assert!(total.lease_pass_with_neighbour >= 5, "{total:?}");
    assert!(total.rows_pass_only >= 5, "{total:?}");
    assert!(total.sparse_fallback >= 20, "{total:?}");
    assert!(total.single >= 20, "{total:?}");
    assert!(total.stale_refused >= 10, "{total:?}");
    assert!(total.effect_refused >= 2, "{total:?}");
    assert!(total.dequeue_pass >= 20, "{total:?}");
    assert!(total.reopens >= 3, "{total:?}");
}

// ---------------------------------------------------------------------------------------------
// Targeted tests
// ---------------------------------------------------------------------------------------------

/// Byte `i` at index `i`, for one-byte payloads.
const BYTES: [u8; 256] = {
    let mut b = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        b[i] = i as u8;
        i += 1;
    }
    b
};

fn ids_of(leases: &[Lease]) -> Vec<JobId> {
    leases.iter().map(Lease::id).collect()
}

fn snapshot(q: &Queue, ids: &[JobId]) -> Vec<Option<JobInfo>> {
    ids.iter().map(|&id| q.job(id).unwrap()).collect()
}

/// Splits `leases` by `pred(index)`: (those where it holds, the rest), order kept.
fn split(leases: Vec<Lease>, pred: impl Fn(usize) -> bool) -> (Vec<Lease>, Vec<Lease>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (i, l) in leases.into_iter().enumerate() {
        if pred(i) { a.push(l) } else { b.push(l) }
    }
    (a, b)
}

fn assert_consecutive(ids: &[JobId]) {
    for w in ids.windows(2) {
        assert_eq!(w[1].0, w[0].0 + 1, "precondition: consecutive ids");
    }
}

/// 1500 jobs (payloads up to 700 bytes, so the jobs table spans many leaves and levels)
/// leased in one dequeue under one deadline; acking two of every three in one batch is one
/// pass over both the lease index and the job rows, each spanning many leaves, with a
/// surviving neighbour every third key. The survivors keep their leases, records and dedup
/// keys; later sparse batches, a reopen and recovery all agree.
#[test]
fn one_pass_over_many_leaves_keeps_interleaved_leases_and_rows() {
    const N: usize = 1500;
    let f = Fixture::new();
    let q = builder(&f, Durability::Immediate).open(&f.path).unwrap();
    let payloads: Vec<Vec<u8>> = (0..N).map(|i| vec![i as u8; (i * 37) % 700]).collect();
    let ids: Vec<JobId> = q
        .enqueue_batch(payloads.iter().enumerate().map(|(i, p)| {
            (
                &p[..],
                EnqueueOptions::default()
                    .dedup_key(format!("k{i}"))
                    .idempotency_key(format!("i{i}")),
            )
        }))
        .unwrap()
        .into_iter()
        .map(Enqueued::id)
        .collect();
    assert_consecutive(&ids);
    let leases = q.dequeue_batch(N).unwrap();
    assert_eq!(ids_of(&leases), ids);
    let deadline = leases[0].deadline_ms();
    assert!(leases.iter().all(|l| l.deadline_ms() == deadline));

    let (keep, ack) = split(leases, |i| i % 3 == 0);
    assert_eq!(ack.len(), 1000); // span 1498 < 2 * 1000: one pass
    let kept: Vec<(JobId, u64)> = keep.iter().map(|l| (l.id(), l.token())).collect();
    all_ok(q.ack_batch(&ack).unwrap());
    for (i, &id) in ids.iter().enumerate() {
        let info = q.job(id).unwrap();
        if i % 3 == 0 {
            let info = info.unwrap_or_else(|| panic!("neighbour {i} was deleted"));
            assert_eq!(info.state, JobState::Leased);
            assert_eq!(info.lease_token, Some(kept[i / 3].1));
            assert_eq!(info.lease_deadline_ms, Some(deadline));
            assert_eq!(info.payload_bytes, payloads[i].len());
            assert_eq!(info.dedup_key, Some(format!("k{i}").into_bytes()));
        } else {
            assert_eq!(info, None, "job {i} acked");
        }
    }
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.leased, s.ready), (500, 500, 0));
    assert_consistent(&q);
    // Dedup keys: released for the acked jobs only.
    for i in [0usize, 1, 2, 3, 700, 1497, 1498, 1499] {
        let r = q
            .enqueue(
                b"again",
                EnqueueOptions::default().dedup_key(format!("k{i}")),
            )
            .unwrap();
        if i % 3 == 0 {
            assert_eq!(r, Enqueued::Duplicate(ids[i]), "key k{i}");
        } else {
            assert!(matches!(r, Enqueued::New(_)), "key k{i}: {r:?}");
        }
    }

    // The survivors, every third id: pairs three apart are dense (3 < 4), longer runs sparse.
    let mut keep = keep;
    let rest = keep.split_off(2);
    all_ok(q.ack_batch(&keep).unwrap());
    let (odd, even) = split(rest, |i| i % 2 == 1);
    let mut effects_run = 0;
    let applied = all_ok(
        q.ack_with_batch(&odd, |tx, l| {
            effects_run += 1;
            bump(tx, l.id().0)
        })
        .unwrap(),
    );
    assert!(applied.iter().all(|a| *a == Applied::Now));
    assert_eq!(effects_run, 249);
    assert_eq!(q.stats().unwrap().leased, 249);
    assert_consistent(&q);

    // Reopen with the rest still leased: recovery returns exactly them, in order. (Every
    // lease holds the queue open, the acked ones too.)
    let still: Vec<JobId> = ids_of(&even);
    drop((even, odd, keep, ack));
    drop(q);
    f.clock.advance(ms(1));
    let q = builder(&f, Durability::Immediate).open(&f.path).unwrap();
    assert_eq!(q.recovery().leases_returned, 249);
    assert_consistent(&q);
    let again = q.dequeue_batch(N).unwrap();
    let got = ids_of(&again);
    // The recovered ones first, in the order they were enqueued (each keeps its place), then
    // the five jobs enqueued after them.
    assert_eq!(got.len(), 249 + 5);
    let mut still_in_order = still.clone();
    still_in_order.sort();
    assert_eq!(&got[..249], &still_in_order[..]);
    assert!(again[..249].iter().all(|l| l.attempt() == 2));
    all_ok(q.ack_batch(&again).unwrap());
    assert!(q.is_empty().unwrap());
    assert_eq!(effects(&q).len(), 249);
    assert_consistent(&q);
}

/// The job-row pass spans ids whose jobs are in every other state (ready, scheduled,
/// leased under another deadline, dead): acking the 600 even jobs in one batch must leave
/// all 600 odd ones exactly as they were, and their delivery order intact.
#[test]
fn row_pass_keeps_neighbours_in_every_other_state() {
    const N: usize = 1200;
    let f = Fixture::new();
    let q = builder(&f, Durability::None).open(&f.path).unwrap();
    let payload = [7u8; 300];
    let ids: Vec<JobId> = q
        .enqueue_batch((0..N).map(|i| {
            let o = EnqueueOptions::default().priority(if i % 2 == 0 { 0 } else { 1 });
            let o = if i % 10 == 5 { o.delay(ms(60_000)) } else { o };
            let o = if i % 2 == 1 {
                o.dedup_key(format!("odd{i}"))
            } else {
                o
            };
            (&payload[..], o)
        }))
        .unwrap()
        .into_iter()
        .map(Enqueued::id)
        .collect();
    assert_consecutive(&ids);
    let evens = q.dequeue_batch(N / 2).unwrap();
    assert_eq!(
        ids_of(&evens),
        ids.iter().step_by(2).copied().collect::<Vec<_>>()
    );
    // Odd neighbours under another deadline: some stay leased, some fail (dead), some are
    // given back with a backoff (scheduled), some plainly (ready at the back).
    f.clock.advance(ms(5));
    let odds = q.dequeue_batch(100).unwrap();
    let mut held_odd = Vec::new();
    for (k, l) in odds.into_iter().enumerate() {
        match k % 4 {
            0 => l.fail("why: dead").unwrap(),
            1 => assert_eq!(
                l.nack_after("why: later", ms(10_000)).unwrap(),
                JobState::Scheduled
            ),
            2 => assert_eq!(l.nack("why: again").unwrap(), JobState::Ready),
            _ => held_odd.push(l),
        }
    }
    let odd_ids: Vec<JobId> = ids.iter().skip(1).step_by(2).copied().collect();
    let before = snapshot(&q, &odd_ids);
    let s = q.stats().unwrap();
    assert_eq!((s.leased, s.dead), (600 + 25, 25));
    // The ready odd jobs, in delivery order, before the pass.
    let want_order: Vec<JobId> = {
        let mut r: Vec<(u64, JobId)> = Vec::new();
        for (id, info) in odd_ids.iter().zip(&before) {
            let info = info.as_ref().unwrap();
            if info.state == JobState::Ready {
                r.push((0, *id));
            }
        }
        // Untouched ready odds keep enqueue order; the nacked ones went to the back.
        let nacked: Vec<JobId> = before
            .iter()
            .flatten()
            .filter(|i| i.state == JobState::Ready && i.attempts == 1)
            .map(|i| i.id)
            .collect();
        let mut order: Vec<JobId> = r
            .iter()
            .map(|&(_, id)| id)
            .filter(|id| !nacked.contains(id))
            .collect();
        order.extend(nacked);
        order
    };

    all_ok(q.ack_batch(&evens).unwrap()); // 600 leases, ids span 1198 < 1200, one deadline
    assert_eq!(snapshot(&q, &odd_ids), before, "odd neighbours changed");
    for id in ids.iter().step_by(2) {
        assert_eq!(q.job(*id).unwrap(), None);
    }
    assert_consistent(&q);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.leased, s.dead), (600, 25, 25));

    // Same rows pass, but leases under two deadlines (the lease index one by one).
    let two = held_odd.split_off(20);
    two[0].extend(ms(7_000)).unwrap();
    let two_ids = ids_of(&two);
    all_ok(q.ack_batch(&two).unwrap());
    assert!(two_ids.iter().all(|&id| q.job(id).unwrap().is_none()));
    assert_consistent(&q);

    let ready = q.dequeue_batch(N).unwrap();
    assert_eq!(ids_of(&ready), want_order);
    all_ok(q.ack_batch(&ready).unwrap());
    all_ok(q.ack_batch(&held_odd).unwrap());
    // Dedup keys of the acked odd jobs are free, those of dead / scheduled ones still held.
    for (i, info) in odd_ids.iter().zip(&before) {
        let info = info.as_ref().unwrap();
        let key = info.dedup_key.clone().unwrap();
        let state = q.job(*i).unwrap().map(|j| j.state);
        let r = q
            .enqueue(b"x", EnqueueOptions::default().dedup_key(&key).delay(ms(1)))
            .unwrap();
        if state == Some(JobState::Dead) {
            assert_eq!(r, Enqueued::DuplicateDead(*i));
        } else if state.is_some() {
            assert_eq!(r, Enqueued::Duplicate(*i));
        } else {
            assert!(matches!(r, Enqueued::New(_)), "{r:?}");
        }
    }
    assert_consistent(&q);
}

/// The density bound at its edges: two leases three apart are one pass (3 < 4) with their
/// two neighbours inside it, four apart are not; equal ids but two deadlines; a batch of
/// one; the whole lot. Each must delete exactly its own jobs.
#[test]
fn density_threshold_edges_delete_exactly_the_batch() {
    let f = Fixture::new();
    let q = builder(&f, Durability::Immediate).open(&f.path).unwrap();
    let ids: Vec<JobId> = q
        .enqueue_batch((0..16u8).map(|i| {
            (
                &BYTES[i as usize..=i as usize],
                EnqueueOptions::default().dedup_key([b'k', i]),
            )
        }))
        .unwrap()
        .into_iter()
        .map(Enqueued::id)
        .collect();
    assert_consecutive(&ids);
    let mut held: BTreeMap<usize, Lease> = q
        .dequeue_batch(16)
        .unwrap()
        .into_iter()
        .enumerate()
        .collect();
    let mut gone: Vec<usize> = Vec::new();
    let check = |q: &Queue, held: &BTreeMap<usize, Lease>, gone: &[usize]| {
        for (i, id) in ids.iter().enumerate() {
            let info = q.job(*id).unwrap();
            if gone.contains(&i) {
                assert_eq!(info, None, "job {i} acked");
            } else if let Some(l) = held.get(&i) {
                let info = info.unwrap_or_else(|| panic!("job {i} lost"));
                assert_eq!(info.lease_token, Some(l.token()), "job {i}");
                assert_eq!(info.lease_deadline_ms, Some(l.deadline_ms()), "job {i}");
            }
        }
        assert_eq!(q.stats().unwrap().total, (16 - gone.len()) as u64);
        assert_consistent(q);
    };
    let ack = |q: &Queue,
               held: &mut BTreeMap<usize, Lease>,
               gone: &mut Vec<usize>,
               idx: &[usize],
               with: bool| {
        let batch: Vec<Lease> = idx.iter().map(|i| held.remove(i).unwrap()).collect();
        if with {
            all_ok(
                q.ack_with_batch(&batch, |tx, l| bump(tx, l.id().0))
                    .unwrap(),
            );
        } else {
            all_ok(q.ack_batch(&batch).unwrap());
        }
        gone.extend_from_slice(idx);
    };
    ack(&q, &mut held, &mut gone, &[3, 0], false); // n=2, span 3: one pass, 1 and 2 inside
    check(&q, &held, &gone);
    ack(&q, &mut held, &mut gone, &[4, 8], true); // n=2, span 4: one by one
    check(&q, &held, &gone);
    ack(&q, &mut held, &mut gone, &[9, 11, 13], false); // n=3, span 4 < 6: pass, 10 and 12 inside
    check(&q, &held, &gone);
    ack(&q, &mut held, &mut gone, &[5, 10, 15], true); // n=3, span 10: one by one
    check(&q, &held, &gone);
    // Dense ids, two deadlines: rows in one pass, lease entries one by one.
    f.clock.advance(ms(3));
    held.get_mut(&6).unwrap().extend(ms(LEASE_MS)).unwrap();
    ack(&q, &mut held, &mut gone, &[7, 6], false);
    check(&q, &held, &gone);
    ack(&q, &mut held, &mut gone, &[1], true); // a batch of one
    check(&q, &held, &gone);
    let rest: Vec<usize> = held.keys().copied().collect();
    assert_eq!(rest, [2, 12, 14]);
    ack(&q, &mut held, &mut gone, &rest, false);
    check(&q, &held, &gone);
    assert!(q.is_empty().unwrap());
    // Every dedup key is free again.
    for i in 0..16u8 {
        assert!(matches!(
            q.enqueue(b"", EnqueueOptions::default().dedup_key([b'k', i]))
                .unwrap(),
            Enqueued::New(_)
        ));
    }
    assert_eq!(effects(&q).len(), 6);
}

/// `dequeue_batch` removes the first N ready entries in one pass right after the sweep
/// inserted hundreds of entries into the same tree in the same transaction (promoted
/// scheduled jobs and reclaimed leases, 256 of each at most): the order is priority, then
/// the order jobs became ready, and batch sizes around leaf boundaries take exactly N.
#[test]
fn dequeue_batch_pass_after_a_sweep_in_the_same_transaction() {
    let f = Fixture::new();
    let q = builder(&f, Durability::None).open(&f.path).unwrap();
    let enqueue = |n: usize, o: EnqueueOptions| -> Vec<JobId> {
        q.enqueue_batch((0..n).map(|_| (&b"p"[..], o.clone())))
            .unwrap()
            .into_iter()
            .map(Enqueued::id)
            .collect()
    };
    let to_expire = enqueue(300, EnqueueOptions::default());
    let leased = q.dequeue_batch(300).unwrap();
    assert_eq!(ids_of(&leased), to_expire);
    drop(leased);
    let low = enqueue(300, EnqueueOptions::default().priority(1));
    let sched = enqueue(300, EnqueueOptions::default().delay(ms(100)));
    f.clock.advance(ms(LEASE_MS + 1));
    // Sweep: 256 scheduled (by due time, then id), then 256 expired leases (by deadline,
    // then id), all priority 0, ahead of the 300 priority-1 jobs already ready.
    let first = q.dequeue_batch(400).unwrap();
    let want: Vec<JobId> = sched[..256]
        .iter()
        .chain(&to_expire[..144])
        .copied()
        .collect();
    assert_eq!(ids_of(&first), want);
    assert!(first[256..].iter().all(|l| l.attempt() == 2));
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.scheduled, s.leased), (112 + 300, 44, 400 + 44));
    assert_consistent(&q);
    // Second sweep: the other 44 scheduled, the other 44 leases; then priority 1.
    let second = q.dequeue_batch(500).unwrap();
    let want: Vec<JobId> = to_expire[144..256]
        .iter()
        .chain(&sched[256..])
        .chain(&to_expire[256..])
        .chain(&low)
        .copied()
        .collect();
    assert_eq!(ids_of(&second), want);
    assert_consistent(&q);
    // Nothing left ready; everything leased exactly once under a current token.
    assert!(q.dequeue_batch(10).unwrap().is_empty());
    let mut all: Vec<Lease> = first.into_iter().chain(second).collect();
    all.sort_by_key(Lease::id);
    let mut tokens: Vec<u64> = all.iter().map(Lease::token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 900);
    // Sizes around leaf boundaries: re-enqueue and take 1, 2, 127, 128, 129, 200, rest.
    all_ok(q.ack_batch(&all).unwrap());
    let ids = enqueue(900, EnqueueOptions::default());
    let mut at = 0;
    for n in [1usize, 2, 127, 128, 129, 200, 255, 256, 1000] {
        let got = q.dequeue_batch(n).unwrap();
        let end = (at + n).min(ids.len());
        assert_eq!(ids_of(&got), ids[at..end], "batch of {n}");
        at = end;
        assert_eq!(q.stats().unwrap().ready, (ids.len() - at) as u64);
        all_ok(q.ack_batch(&got).unwrap());
        assert_consistent(&q);
        if at == ids.len() {
            break;
        }
    }
    assert!(q.is_empty().unwrap());
}

/// C34 on the one-pass deletes: a dense one-deadline batch holding one stale lease (reclaimed
/// and redelivered, or only reclaimed) acks every current lease in one pass and reports the
/// stale one as `LeaseLost` in its place: its job, inside the pass's id range, is untouched
/// (no effect runs for it, its row, index entry and dedup key stay).
#[test]
fn stale_lease_in_a_dense_batch_is_reported_and_the_rest_acked_in_one_pass() {
    let f = Fixture::new();
    let q = builder(&f, Durability::Immediate).open(&f.path).unwrap();
    let ids: Vec<JobId> = q
        .enqueue_batch((0..40u8).map(|i| {
            (
                &BYTES[i as usize..=i as usize],
                EnqueueOptions::default()
                    .dedup_key([i])
                    .idempotency_key([i]),
            )
        }))
        .unwrap()
        .into_iter()
        .map(Enqueued::id)
        .collect();
    let mut leases = q.dequeue_batch(40).unwrap();
    // All but jobs 17 and 30 extended to one new deadline, at the same instant.
    f.clock.advance(ms(LEASE_MS / 2));
    for (i, l) in leases.iter_mut().enumerate() {
        if i != 17 && i != 30 {
            l.extend(ms(LEASE_MS)).unwrap();
        }
    }
    f.clock.advance(ms(LEASE_MS / 2 + 1));
    // The sweep reclaims 17 and 30; 17 is redelivered, 30 stays ready.
    let current17 = q.dequeue().unwrap().unwrap();
    assert_eq!(current17.id(), ids[17]);
    assert_eq!(q.job(ids[30]).unwrap().unwrap().state, JobState::Ready);
    let stale30 = leases.remove(30);
    let stale17 = leases.remove(17);
    let (stale17_token, stale30_token) = (stale17.token(), stale30.token());

    let snap = |id: JobId| q.job(id).unwrap().unwrap();
    let (held17, ready30) = (snap(ids[17]), snap(ids[30]));
    // 19 good leases, then the stale one last.
    let (a, b) = split(leases, |i| i < 19);
    let mut batch = a;
    batch.push(stale30);
    let out = q.ack_batch(&batch).unwrap();
    let (last, firsts) = out.split_last().unwrap();
    assert!(firsts.iter().all(Result::is_ok), "{firsts:?}");
    match last {
        Err(Error::LeaseLost { job_id, token }) => {
            assert_eq!((*job_id, *token), (ids[30], stale30_token))
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    let mut ran = Vec::new();
    let mut batch = b;
    batch.insert(7, stale17);
    let out = q
        .ack_with_batch(&batch, |tx, l| {
            ran.push(l.id());
            bump(tx, l.id().0)
        })
        .unwrap();
    for (i, r) in out.iter().enumerate() {
        match (i, r) {
            (7, Err(Error::LeaseLost { job_id, token })) => {
                assert_eq!((*job_id, *token), (ids[17], stale17_token))
            }
            (7, other) => panic!("expected LeaseLost, got {other:?}"),
            (_, r) => assert!(matches!(r, Ok(Applied::Now)), "lease {i}: {r:?}"),
        }
    }
    assert_eq!(ran.len(), 19);
    assert!(!ran.contains(&ids[17]), "no effect for the stale lease");
    // The stale leases' jobs, inside the passes' ranges, are exactly as they were.
    assert_eq!(snap(ids[17]), held17);
    assert_eq!(snap(ids[30]), ready30);
    assert_eq!(q.stats().unwrap().total, 2);
    assert_eq!(effects(&q).len(), 19);
    for i in [17u8, 30] {
        match q
            .enqueue(b"dup", EnqueueOptions::default().dedup_key([i]))
            .unwrap()
        {
            Enqueued::Duplicate(id) => assert_eq!(id, ids[i as usize], "dedup key {i} kept"),
            other => panic!("dedup key {i} was released: {other:?}"),
        }
    }
    assert_consistent(&q);

    // Both are then acked in one batch: 30 dequeued again, 17 by its current lease.
    let mut again = q.dequeue_batch(100).unwrap();
    assert_eq!(ids_of(&again), [ids[30]]);
    again.push(current17);
    let applied = all_ok(
        q.ack_with_batch(&again, |tx, l| bump(tx, l.id().0))
            .unwrap(),
    );
    assert!(applied.iter().all(|a| *a == Applied::Now));
    assert!(q.is_empty().unwrap());
    assert_eq!(effects(&q).len(), 21);
    assert_consistent(&q);

    // The current and a stale lease of one job in one batch, with a dense neighbour: the
    // current ones are acked, the stale one reported, after the current one.
    let two: Vec<JobId> = q
        .enqueue_batch([
            (&b"a"[..], EnqueueOptions::default()),
            (&b"b"[..], EnqueueOptions::default()),
        ])
        .unwrap()
        .into_iter()
        .map(Enqueued::id)
        .collect();
    let stale = q.dequeue().unwrap().unwrap();
    assert_eq!(stale.id(), two[0]);
    f.clock.advance(ms(LEASE_MS + 1));
    let current = q.dequeue_batch(2).unwrap();
    assert_eq!(ids_of(&current), [two[1], two[0]]);
    let stale_token = stale.token();
    let mut batch = current;
    batch.push(stale);
    match q.ack_batch(&batch).unwrap().as_slice() {
        [Ok(()), Ok(()), Err(Error::LeaseLost { job_id, token })] => {
            assert_eq!((*job_id, *token), (two[0], stale_token))
        }
        other => panic!("expected [Ok, Ok, LeaseLost], got {other:?}"),
    }
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// Several consumers acking dense halves of their batches (plain and with effects) while a
/// producer enqueues: group commit puts several one-pass deletes on the same trees into one
/// transaction. Whatever the grouping, every job is delivered and acked exactly once, every
/// effect applied once, and the file is consistent (also after a reopen).
#[test]
fn concurrent_batch_acks_in_shared_commits() {
    const PRE: usize = 1200;
    const PRODUCED: usize = 400;
    const WORKERS: u64 = 3;
    let f = Fixture::new();
    let q = builder(&f, Durability::None).open(&f.path).unwrap();
    let p = [1u8; 64];
    q.enqueue_batch((0..PRE).map(|i| {
        (
            &p[..],
            EnqueueOptions::default().idempotency_key(format!("k{i}")),
        )
    }))
    .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let acked = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for b in 0..PRODUCED / 20 {
                q.enqueue_batch((0..20).map(|i| {
                    (
                        &p[..],
                        EnqueueOptions::default().idempotency_key(format!("p{b}-{i}")),
                    )
                }))
                .unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        for w in 0..WORKERS {
            let (q, done, acked) = (&q, &done, &acked);
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(100 + w);
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                    let got = q.dequeue_batch(rng.usize(2..80)).unwrap();
                    if got.is_empty() {
                        if finished {
                            break;
                        }
                        std::thread::yield_now();
                        continue;
                    }
                    let n = got.len() as u64;
                    let k = rng.usize(0..2);
                    let (a, b) = split(got, |i| i % 2 == k);
                    if !a.is_empty() {
                        all_ok(q.ack_batch(&a).unwrap());
                    }
                    if !b.is_empty() {
                        let r = all_ok(q.ack_with_batch(&b, |tx, l| bump(tx, l.id().0)).unwrap());
                        assert!(r.iter().all(|a| *a == Applied::Now));
                    }
                    acked.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(acked.into_inner(), (PRE + PRODUCED) as u64);
    assert!(q.is_empty().unwrap());
    let e = effects(&q);
    assert!(e.values().all(|&n| n == 1), "an effect applied twice");
    assert_eq!(q.stats().unwrap().applied, e.len() as u64);
    assert_consistent(&q);
    q.flush().unwrap();
    drop(q);
    let q = builder(&f, Durability::None).open(&f.path).unwrap();
    assert!(q.is_empty().unwrap());
    assert_eq!(effects(&q), e);
    assert_consistent(&q);
}

/// Many leaves under several branches: 12,000 jobs (every 50th with a 3,000-byte payload,
/// so the job rows form a three-level tree; the lease index spans ~50 leaves) leased under
/// one deadline by two `dequeue_batch` passes over the ready index, then acked in passes of
/// thousands that cross leaf and branch boundaries (dense with holes, a dense run, sparse,
/// with effects), each leaving every survivor's lease current. Counts plus the final ack of
/// every survivor pin down exactly which jobs were deleted.
#[test]
fn passes_across_leaves_and_branches_of_large_trees() {
    use redb::{ReadableDatabase, ReadableTableMetadata};
    const N: usize = 12_000;
    let f = Fixture::new();
    let q = builder(&f, Durability::None).open(&f.path).unwrap();
    let big = vec![9u8; 3000];
    let mut ids: Vec<JobId> = Vec::new();
    for half in [0..N / 2, N / 2..N] {
        ids.extend(
            q.enqueue_batch(half.map(|i| {
                let p: &[u8] = if i.is_multiple_of(50) { &big } else { b"x" };
                (p, EnqueueOptions::default())
            }))
            .unwrap()
            .into_iter()
            .map(Enqueued::id),
        );
    }
    assert_consecutive(&ids);
    let mut leases = q.dequeue_batch(10_000).unwrap();
    leases.extend(q.dequeue_batch(10_000).unwrap());
    assert_eq!(ids_of(&leases), ids);
    assert_eq!(q.stats().unwrap().ready, 0);
    {
        // Precondition (read through the queue's public `database()`): the job rows really
        // are a three-level tree, the lease index many leaves.
        let rtx = q.database().begin_read().unwrap();
        let jobs = rtx
            .open_table(redb::TableDefinition::<u64, &[u8]>::new("leaseq_jobs"))
            .unwrap();
        assert!(jobs.stats().unwrap().tree_height() >= 3);
        let leases = rtx
            .open_table(redb::TableDefinition::<(u64, u64), ()>::new(
                "leaseq_leases",
            ))
            .unwrap();
        assert!(leases.stats().unwrap().leaf_pages() >= 20);
    }
    let mut slots: Vec<Option<Lease>> = leases.into_iter().map(Some).collect();
    let mut take = |pred: &dyn Fn(usize) -> bool| -> Vec<Lease> {
        (0..N)
            .filter(|&i| pred(i))
            .filter_map(|i| slots[i].take())
            .collect()
    };
    let mut live = N as u64;
    let mut ack = |q: &Queue, batch: Vec<Lease>, with: bool| {
        let n = batch.len() as u64;
        if with {
            all_ok(
                q.ack_with_batch(&batch, |tx, l| bump(tx, l.id().0))
                    .unwrap(),
            );
        } else {
            all_ok(q.ack_batch(&batch).unwrap());
        }
        live -= n;
        let s = q.stats().unwrap();
        assert_eq!((s.total, s.leased), (live, live));
        assert_consistent(q);
    };
    // Two of every three in the first half: 4,000 leases over 6,000 ids, one pass.
    ack(&q, take(&|i| i < 6_000 && i % 3 != 0), false);
    // A run with every seventh kept: one pass.
    ack(
        &q,
        take(&|i| (6_000..10_000).contains(&i) && i % 7 != 0),
        false,
    );
    // The thirds kept in the first half, every other one: sparse, one by one.
    ack(&q, take(&|i| i < 6_000 && i % 6 == 0), false);
    // The last 2,000 with effects, in one pass.
    ack(&q, take(&|i| i >= 10_000), true);
    assert_eq!(effects(&q).len(), 2_000);
    // Every survivor is still leased under its token: two batches ack them all.
    let rest = take(&|i| i % 2 == 0);
    ack(&q, rest, false);
    let rest = take(&|_| true);
    ack(&q, rest, true);
    assert_eq!(live, 0);
    assert!(q.is_empty().unwrap());
}
