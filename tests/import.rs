//! `Queue::import_batch`: jobs added with their state and history, all or nothing, for
//! `leaseq import` and moving jobs between files.

mod common;

use std::time::Duration;

use common::{Fixture, T0_MS, assert_consistent};
use leaseq::{
    Encoding, EnqueueOptions, Enqueued, Error, ImportJob, JobInfo, JobState, Queue, RetryPolicy,
};

/// Every job of `q` in `state`, with its payload.
fn all(q: &Queue, state: JobState) -> Vec<(JobInfo, Vec<u8>)> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = q.jobs(state, after, 100).unwrap();
        for j in page.jobs {
            let p = q.payload(j.id).unwrap().unwrap();
            out.push((j, p));
        }
        match page.next {
            Some(c) => after = Some(c),
            None => return out,
        }
    }
}

/// The import form of a listed job (what `leaseq export` writes).
fn import_of(j: &JobInfo, payload: Vec<u8>) -> ImportJob {
    let mut o = EnqueueOptions::default()
        .priority(j.priority)
        .max_attempts(j.max_attempts);
    if let Some(k) = &j.idempotency_key {
        o = o.idempotency_key(k);
    }
    if let Some(k) = &j.dedup_key {
        o = o.dedup_key(k);
    }
    if let Some(w) = j.dedup_window_ms {
        o = o.dedup_window(Duration::from_millis(w));
    }
    if let Some(l) = j.lease_ms {
        o = o.lease(Duration::from_millis(l));
    }
    if let Some(r) = j.retry {
        o = o.retry(r);
    }
    ImportJob::new(payload)
        .options(o)
        .state(j.state)
        .run_at_ms(j.run_at_ms)
        .attempts(j.attempts)
        .snoozes(j.snoozes)
        .last_error(j.last_error.clone())
        .created_ms(j.created_ms)
        .encoding(j.encoding)
}

/// The fields a move keeps (not the id, lease token or deadline).
fn kept(j: &JobInfo) -> impl PartialEq + std::fmt::Debug + use<> {
    let state = if j.state == JobState::Leased {
        JobState::Ready
    } else {
        j.state
    };
    let run_at = (j.state != JobState::Ready && j.state != JobState::Leased).then_some(j.run_at_ms);
    (
        state,
        j.attempts,
        j.max_attempts,
        j.priority,
        run_at,
        j.created_ms,
        // An imported lease gets the reason a reopen gives a returned lease.
        if j.state == JobState::Leased
            || j.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("lease abandoned"))
        {
            Some("abandoned".to_string())
        } else {
            j.last_error.clone()
        },
        j.idempotency_key.clone(),
        j.dedup_key.clone(),
        (
            j.payload_bytes,
            j.snoozes,
            j.lease_ms,
            j.retry,
            j.dedup_window_ms,
            j.encoding,
        ),
    )
}

#[test]
fn a_moved_queue_keeps_every_state_option_and_byte() {
    let src = Fixture::new();
    let q = src.open();
    let d = EnqueueOptions::default;
    let big: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    q.enqueue(b"ready-1", d().priority(-3).idempotency_key("k1"))
        .unwrap();
    q.enqueue(
        &big,
        d().dedup_key("d2").dedup_window(Duration::from_secs(600)),
    )
    .unwrap();
    q.enqueue(
        &[0xff, 0, 0xfe],
        d().delay(Duration::from_secs(90))
            .lease(Duration::from_secs(9)),
    )
    .unwrap();
    q.enqueue(
        b"dies",
        d().priority(-5)
            .max_attempts(2)
            .retry(RetryPolicy::fixed(Duration::from_secs(3))),
    )
    .unwrap();
    q.with_encoding(Encoding::Json)
        .enqueue_value(&vec![1u8, 2], d().priority(5))
        .unwrap();
    q.enqueue(b"leased", d().priority(-9)).unwrap();
    // "leased" is held at export, "dies" fails, "ready-1" is snoozed once and nacked once.
    let held = q.dequeue().unwrap().unwrap();
    assert_eq!(held.payload(), b"leased");
    q.dequeue().unwrap().unwrap().fail("broken").unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), b"ready-1");
    l.snooze(Duration::ZERO).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    l.nack_after("later", Duration::ZERO).unwrap();
    let s = q.stats().unwrap();
    assert_eq!(
        (s.ready, s.scheduled, s.leased, s.dead),
        (3, 1, 1, 1),
        "{s:?}"
    );
    let mut source = Vec::new();
    for s in [
        JobState::Scheduled,
        JobState::Ready,
        JobState::Leased,
        JobState::Dead,
    ] {
        source.extend(all(&q, s));
    }
    assert_eq!(source.len(), 6);

    let dst = Fixture::new();
    let to = dst.open();
    let jobs: Vec<ImportJob> = source
        .iter()
        .map(|(j, p)| import_of(j, p.clone()))
        .collect();
    let out = to.import_batch(&jobs).unwrap();
    assert!(out.iter().all(|e| matches!(e, Enqueued::New(_))), "{out:?}");
    let mut moved = Vec::new();
    for s in [
        JobState::Scheduled,
        JobState::Ready,
        JobState::Leased,
        JobState::Dead,
    ] {
        moved.extend(all(&to, s));
    }
    assert_eq!(moved.len(), source.len());
    let mut want: Vec<_> = source
        .iter()
        .map(|(j, p)| (format!("{:?}", kept(j)), p.clone()))
        .collect();
    let mut got: Vec<_> = moved
        .iter()
        .map(|(j, p)| (format!("{:?}", kept(j)), p.clone()))
        .collect();
    want.sort();
    got.sort();
    assert_eq!(want, got);
    assert_eq!(to.stats().unwrap().leased, 0);
    assert_consistent(&to);
    // Keys came along: the dedup key is held in the new file.
    assert!(matches!(
        to.enqueue(b"dup", d().dedup_key("d2")).unwrap(),
        Enqueued::Duplicate(_)
    ));
}

#[test]
fn ready_jobs_keep_their_order_within_a_priority() {
    let f = Fixture::new();
    let q = f.open();
    let jobs: Vec<ImportJob> = (0..50u32)
        .map(|i| ImportJob::new(i.to_le_bytes().to_vec()))
        .collect();
    q.import_batch(&jobs).unwrap();
    for i in 0..50u32 {
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.payload(), i.to_le_bytes());
        l.ack().unwrap();
    }
}

#[test]
fn a_leased_job_imports_as_a_lease_returned_at_reopen() {
    let f = Fixture::new();
    let q = f.open();
    let out = q
        .import_batch(&[
            ImportJob::new(b"has one left".to_vec())
                .options(EnqueueOptions::default().max_attempts(3))
                .state(JobState::Leased)
                .attempts(2),
            ImportJob::new(b"last attempt".to_vec())
                .options(EnqueueOptions::default().max_attempts(3))
                .state(JobState::Leased)
                .attempts(3),
        ])
        .unwrap();
    let a = q.job(out[0].id()).unwrap().unwrap();
    assert_eq!((a.state, a.attempts), (JobState::Ready, 2));
    assert!(a.last_error.unwrap().starts_with("lease abandoned"));
    let b = q.job(out[1].id()).unwrap().unwrap();
    assert_eq!((b.state, b.attempts), (JobState::Dead, 3));
    assert!(b.last_error.unwrap().starts_with("lease abandoned"));
    assert_eq!(b.died_ms, Some(T0_MS));
    assert_consistent(&q);
}

#[test]
fn one_bad_job_refuses_the_whole_batch() {
    let f = Fixture::new();
    let q = f.open();
    let good = ImportJob::new(b"good".to_vec());
    let cases = [
        // A job still to run with no attempt left.
        ImportJob::new(b"x".to_vec())
            .options(EnqueueOptions::default().max_attempts(2))
            .attempts(2),
        ImportJob::new(b"x".to_vec())
            .options(EnqueueOptions::default().max_attempts(2))
            .state(JobState::Scheduled)
            .run_at_ms(T0_MS + 1)
            .attempts(5),
        // A dead job with more attempts than allowed.
        ImportJob::new(b"x".to_vec())
            .options(EnqueueOptions::default().max_attempts(2))
            .state(JobState::Dead)
            .attempts(3),
        ImportJob::new(b"x".to_vec()).options(EnqueueOptions::default().max_attempts(0)),
        ImportJob::new(vec![0; (1 << 20) + 1]),
        ImportJob::new(b"x".to_vec())
            .options(EnqueueOptions::default().idempotency_key(vec![1; 4096])),
    ];
    for bad in cases {
        let r = q.import_batch(&[good.clone(), bad.clone()]);
        assert!(
            matches!(
                r,
                Err(Error::InvalidOption { .. }
                    | Error::PayloadTooLarge { .. }
                    | Error::KeyTooLong { .. })
            ),
            "{r:?}"
        );
        assert_eq!(q.stats().unwrap().total, 0, "nothing written");
    }
    assert!(matches!(
        q.import_batch(&[]),
        Err(Error::InvalidOption { .. })
    ));
    let too_many = vec![good.clone(); leaseq::BATCH_MAX + 1];
    assert!(matches!(
        q.import_batch(&too_many),
        Err(Error::InvalidOption { .. })
    ));
    q.close();
    assert!(matches!(q.import_batch(&[good]), Err(Error::Closed)));
    assert_eq!(q.stats().unwrap().total, 0);
}

#[test]
fn a_held_dedup_key_makes_an_imported_job_a_duplicate() {
    let f = Fixture::new();
    let q = f.open();
    let held = q
        .enqueue(b"live", EnqueueOptions::default().dedup_key("k"))
        .unwrap()
        .id();
    let out = q
        .import_batch(&[
            ImportJob::new(b"a".to_vec()).options(EnqueueOptions::default().dedup_key("k")),
            ImportJob::new(b"b".to_vec()).options(EnqueueOptions::default().dedup_key("j")),
            ImportJob::new(b"c".to_vec()).options(EnqueueOptions::default().dedup_key("j")),
        ])
        .unwrap();
    assert_eq!(out[0], Enqueued::Duplicate(held));
    assert!(matches!(out[1], Enqueued::New(_)));
    assert_eq!(out[2], Enqueued::Duplicate(out[1].id()));
    assert_eq!(q.stats().unwrap().total, 2);
}

#[test]
fn an_imported_dead_job_can_be_requeued_and_expires_by_its_death_time() {
    let f = Fixture::new();
    let q = f
        .builder()
        .dead_retention(Some(Duration::from_secs(3600)))
        .open(&f.path)
        .unwrap();
    let out = q
        .import_batch(&[
            ImportJob::new(b"old death".to_vec())
                .state(JobState::Dead)
                .run_at_ms(T0_MS - 7_200_000)
                .attempts(5)
                .last_error(Some("gone".into())),
            ImportJob::new(b"fresh death".to_vec())
                .state(JobState::Dead)
                .run_at_ms(T0_MS)
                .attempts(1),
        ])
        .unwrap();
    let pruned = q.prune().unwrap();
    assert_eq!(pruned.dead, 1);
    assert!(q.job(out[0].id()).unwrap().is_none());
    q.requeue_dead(out[1].id()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), b"fresh death");
    l.ack().unwrap();
    assert_consistent(&q);
}
