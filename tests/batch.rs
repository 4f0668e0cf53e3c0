//! Batch calls and ack-and-fetch-next: one commit each, with the same fencing and attempt
//! counting as the single calls; a batch holding one stale lease fails whole and changes
//! nothing.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Fixture, LEASE, all_ok, assert_consistent, bump, effects};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobId, JobState, Lease, Queue};

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
