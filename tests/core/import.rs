//! `Queue::import_batch`: jobs added with their state and history, all or nothing, for
//! `leaseq import` and moving jobs between files.
//!
//! Adversarial tests of issue 11 (`Queue::import_batch`): each checks the state that should
//! result (stats, `Queue::job`, `check()`), not only that nothing panics.

use crate::common::{Fixture, T0_MS, assert_consistent, plain};
use leaseq::{
    Encoding, EnqueueOptions, Enqueued, Error, ImportJob, JobId, JobInfo, JobState, Queue,
    RetryPolicy,
};
use std::time::{Duration, Instant};

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
    if let Some(t) = j.timeout_ms {
        o = o.timeout(Duration::from_millis(t));
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
            j.timeout_ms,
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
    let big: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    q.enqueue(b"ready-1", plain().priority(-3).idempotency_key("k1"))
        .unwrap();
    q.enqueue(
        &big,
        plain()
            .dedup_key("d2")
            .dedup_window(Duration::from_secs(600)),
    )
    .unwrap();
    q.enqueue(
        &[0xff, 0, 0xfe],
        plain()
            .delay(Duration::from_secs(90))
            .lease(Duration::from_secs(9))
            .timeout(Duration::from_secs(4)),
    )
    .unwrap();
    q.enqueue(
        b"dies",
        plain()
            .priority(-5)
            .max_attempts(2)
            .retry(RetryPolicy::fixed(Duration::from_secs(3))),
    )
    .unwrap();
    q.with_encoding(Encoding::Json)
        .enqueue_value(&vec![1u8, 2], plain().priority(5))
        .unwrap();
    q.enqueue(b"leased", plain().priority(-9)).unwrap();
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
    let timeouts: Vec<_> = source.iter().filter_map(|(j, _)| j.timeout_ms).collect();
    assert_eq!(timeouts, vec![4_000], "the one job with its own timeout");

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
        to.enqueue(b"dup", plain().dedup_key("d2")).unwrap(),
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

const HOUR_MS: u64 = 3_600_000;

// ---------------------------------------------------------------------------------------
// Import: dedup keys are judged at the import's time, not at the job's `created_ms`.
// ---------------------------------------------------------------------------------------

/// A job exported with a `created_ms` ahead of this file's clock (another machine's clock, a
/// clock stepped back) must not take a dedup key whose window is still running here.
#[test]
fn import_created_in_the_future_does_not_take_a_key_whose_window_still_runs() {
    let f = Fixture::new();
    let q = f.open();
    let holder = q
        .enqueue(
            b"holder",
            plain()
                .dedup_key("k")
                .dedup_window(Duration::from_secs(3600)),
        )
        .unwrap()
        .id();
    let out = q
        .import_batch(&[ImportJob::new(b"future".to_vec())
            .options(plain().dedup_key("k"))
            .created_ms(T0_MS + 2 * HOUR_MS)])
        .unwrap();
    // The window of `holder` runs until T0 + 1 h, and the clock reads T0.
    assert_eq!(
        out[0],
        Enqueued::Duplicate(holder),
        "the key's window still runs at the import's time"
    );
    assert_eq!(q.stats().unwrap().total, 1);
    assert_consistent(&q);
}

/// Importing a job with a future `created_ms` must not release *other* keys' running
/// windows (the bounded window pruning done with each new dedup key).
#[test]
fn import_created_in_the_future_does_not_release_other_running_windows() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(
            b"a",
            plain()
                .dedup_key("a")
                .dedup_window(Duration::from_secs(3600)),
        )
        .unwrap()
        .id();
    let out = q
        .import_batch(&[ImportJob::new(b"b".to_vec())
            .options(plain().dedup_key("b"))
            .created_ms(T0_MS + 2 * HOUR_MS)])
        .unwrap();
    assert!(matches!(out[0], Enqueued::New(_)));
    // Still T0: the window of "a" runs for another hour.
    let again = q.enqueue(b"a again", plain().dedup_key("a")).unwrap();
    assert_eq!(
        again,
        Enqueued::Duplicate(a),
        "the import released the running window of another key"
    );
    assert_eq!(q.stats().unwrap().dedup_keys, 2);
    assert_consistent(&q);
}

/// The other direction: an exported job whose `created_ms` is in the past is judged against
/// windows as they were then, so a window that ended long ago still refuses it.
#[test]
fn import_created_in_the_past_does_not_revive_an_ended_window() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(
        b"old holder",
        plain()
            .dedup_key("k")
            .dedup_window(Duration::from_secs(3600)),
    )
    .unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    f.clock.advance(Duration::from_millis(2 * HOUR_MS));
    // (No other enqueue with a dedup key here: it would prune the ended window itself.)
    let out = q
        .import_batch(&[ImportJob::new(b"exported at T0".to_vec())
            .options(plain().dedup_key("k"))
            .created_ms(T0_MS)])
        .unwrap();
    assert!(
        matches!(out[0], Enqueued::New(_)),
        "the window of the key ended an hour before the import, got {:?}",
        out[0]
    );
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Import: edge times, states, limits and batches.
// ---------------------------------------------------------------------------------------

#[test]
fn import_edge_times_land_where_they_say() {
    let f = Fixture::new();
    let q = f
        .builder()
        .dead_retention(Some(Duration::from_secs(3600)))
        .open(&f.path)
        .unwrap();
    let out = q
        .import_batch(&[
            ImportJob::new(b"ready, run_at max".to_vec())
                .run_at_ms(u64::MAX)
                .created_ms(0),
            ImportJob::new(b"scheduled at 0".to_vec())
                .state(JobState::Scheduled)
                .run_at_ms(0)
                .created_ms(u64::MAX),
            ImportJob::new(b"scheduled at max".to_vec())
                .state(JobState::Scheduled)
                .run_at_ms(u64::MAX),
            ImportJob::new(b"died at 0".to_vec())
                .state(JobState::Dead)
                .run_at_ms(0)
                .attempts(0),
            ImportJob::new(b"dies at max".to_vec())
                .state(JobState::Dead)
                .run_at_ms(u64::MAX)
                .attempts(5),
        ])
        .unwrap();
    let ids: Vec<JobId> = out.iter().map(|e| e.id()).collect();
    let info = |i: usize| q.job(ids[i]).unwrap().unwrap();
    assert_eq!((info(0).state, info(0).created_ms), (JobState::Ready, 0));
    assert_eq!(info(0).run_at_ms, u64::MAX);
    assert_eq!(info(1).created_ms, u64::MAX);
    assert_eq!(
        (info(2).state, info(2).run_at_ms),
        (JobState::Scheduled, u64::MAX)
    );
    assert_eq!(info(4).died_ms, Some(u64::MAX));
    assert_consistent(&q);
    // The ready job first (in line at import), then the one due at 0 (promoted behind it).
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), b"ready, run_at max");
    l.ack().unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), b"scheduled at 0");
    assert_eq!(l.attempt(), 1);
    l.ack().unwrap();
    // The one due at u64::MAX never comes, and a blocked consumer does not hang on it.
    let t = Instant::now();
    assert!(
        q.dequeue_timeout(Duration::from_millis(300))
            .unwrap()
            .is_none()
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    // Dead retention: the one that died at 0 goes (a dequeue's sweep or the prune), the
    // one dying at u64::MAX stays.
    q.prune().unwrap();
    assert!(q.job(ids[3]).unwrap().is_none());
    assert_eq!(q.job(ids[4]).unwrap().unwrap().state, JobState::Dead);
    let s = q.stats().unwrap();
    assert_eq!((s.scheduled, s.ready, s.leased, s.dead), (1, 0, 0, 1));
    assert_consistent(&q);
}

#[test]
fn import_cuts_a_huge_last_error_and_refuses_bad_keys_all_or_nothing() {
    let f = Fixture::new();
    let q = f.open();
    // 3-byte characters: 4096 is not a boundary, so the cut must step back to 4095.
    let huge = "€".repeat(400_000);
    let key512 = vec![b'k'; leaseq::KEY_BYTES_MAX];
    let out = q
        .import_batch(&[
            ImportJob::new(b"e".to_vec())
                .state(JobState::Dead)
                .attempts(5)
                .last_error(Some(huge.clone())),
            ImportJob::new(b"longest keys".to_vec()).options(
                plain()
                    .idempotency_key(&key512)
                    .dedup_key(&key512)
                    .dedup_window(Duration::from_secs(1)),
            ),
            // Its delay is ignored: the state says when it is due.
            ImportJob::new(b"delay ignored".to_vec())
                .options(plain().delay(Duration::from_secs(60))),
        ])
        .unwrap();
    let e = q.job(out[0].id()).unwrap().unwrap();
    let kept = e.last_error.unwrap();
    assert_eq!(kept.len(), 4095);
    assert!(kept.chars().all(|c| c == '€'));
    assert_eq!(q.job(out[2].id()).unwrap().unwrap().state, JobState::Ready);
    let before = q.stats().unwrap();
    let good = ImportJob::new(b"good".to_vec());
    let long = vec![b'k'; leaseq::KEY_BYTES_MAX + 1];
    let bad = [
        ImportJob::new(b"x".to_vec()).options(plain().dedup_key(&long)),
        ImportJob::new(b"x".to_vec()).options(plain().idempotency_key(&long)),
        ImportJob::new(b"x".to_vec()).options(plain().dedup_key("")),
        ImportJob::new(b"x".to_vec()).options(plain().idempotency_key("")),
        ImportJob::new(b"x".to_vec()).options(plain().dedup_window(Duration::from_secs(1))),
        ImportJob::new(b"x".to_vec()).options(
            plain()
                .dedup_key("w")
                .dedup_window(Duration::from_micros(500)),
        ),
        ImportJob::new(b"x".to_vec()).options(plain().lease(Duration::ZERO)),
        ImportJob::new(b"x".to_vec())
            .options(plain().max_attempts(2))
            .state(JobState::Leased)
            .attempts(3),
    ];
    for (i, b) in bad.into_iter().enumerate() {
        let r = q.import_batch(&[good.clone(), b]);
        assert!(
            matches!(
                r,
                Err(Error::InvalidOption { .. } | Error::KeyTooLong { .. })
            ),
            "case {i}: {r:?}"
        );
        assert_eq!(q.stats().unwrap(), before, "case {i}: nothing written");
    }
    assert_consistent(&q);
}

#[test]
fn import_batch_max_with_duplicates_inside_and_against_holders() {
    let f = Fixture::new();
    let q = f.open();
    // A key held by a window although its job is gone, and one held by a dead job.
    let window_holder = q
        .enqueue(
            b"w",
            plain()
                .dedup_key("wk")
                .dedup_window(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    let dead_holder = q
        .enqueue(b"dead", plain().dedup_key("dk").max_attempts(1))
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().fail("gone").unwrap();
    let half = leaseq::BATCH_MAX / 2;
    let mut jobs: Vec<ImportJob> = (0..leaseq::BATCH_MAX)
        .map(|i| {
            ImportJob::new(i.to_le_bytes().to_vec())
                .options(plain().dedup_key(format!("k{}", i % half)))
        })
        .collect();
    // One over: refused whole.
    let mut over = jobs.clone();
    over.push(ImportJob::new(b"one too many".to_vec()));
    assert!(matches!(
        q.import_batch(&over),
        Err(Error::InvalidOption { .. })
    ));
    assert_eq!(q.stats().unwrap().total, 1);
    jobs[half] = ImportJob::new(b"w again".to_vec()).options(plain().dedup_key("wk"));
    jobs[half + 1] = ImportJob::new(b"d again".to_vec()).options(plain().dedup_key("dk"));
    let out = q.import_batch(&jobs).unwrap();
    assert_eq!(out.len(), leaseq::BATCH_MAX);
    assert_eq!(out[half], Enqueued::Duplicate(window_holder));
    assert_eq!(out[half + 1], Enqueued::DuplicateDead(dead_holder));
    for i in half + 2..leaseq::BATCH_MAX {
        assert_eq!(out[i], Enqueued::Duplicate(out[i - half].id()), "job {i}");
    }
    let s = q.stats().unwrap();
    assert_eq!(
        (s.ready, s.dead, s.total),
        (half as u64, 1, half as u64 + 1)
    );
    // A dead job imported in a batch holds its key against a later one of the same batch.
    let out = q
        .import_batch(&[
            ImportJob::new(b"x".to_vec())
                .options(plain().dedup_key("fresh-dead"))
                .state(JobState::Dead)
                .attempts(5),
            ImportJob::new(b"y".to_vec()).options(plain().dedup_key("fresh-dead")),
        ])
        .unwrap();
    assert_eq!(out[1], Enqueued::DuplicateDead(out[0].id()));
    assert_consistent(&q);
}

#[test]
fn imported_attempts_are_the_attempts_a_consumer_sees() {
    let f = Fixture::new();
    let q = f.open();
    let out = q
        .import_batch(&[
            ImportJob::new(b"last try".to_vec())
                .options(plain().max_attempts(3).priority(-1))
                .attempts(2)
                .snoozes(7)
                .last_error(Some("second failure".into())),
            ImportJob::new(b"leased, none made".to_vec())
                .options(plain().max_attempts(1))
                .state(JobState::Leased)
                .attempts(0),
        ])
        .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), b"last try");
    assert_eq!((l.attempt(), l.max_attempts()), (3, 3));
    assert_eq!(l.nack("third").unwrap(), JobState::Dead);
    let j = q.job(out[0].id()).unwrap().unwrap();
    assert_eq!((j.attempts, j.snoozes), (3, 7));
    let j = q.job(out[1].id()).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Ready, 0));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.attempt(), l.max_attempts()), (1, 1));
    l.ack().unwrap();
    assert_consistent(&q);
}

/// An imported job whose dedup window had ended before the import holds its key while live,
/// and lets go of it at its ack (it used to keep it for good).
#[test]
fn an_imported_job_past_its_window_frees_its_key_at_ack() {
    let f = Fixture::new();
    let q = f.open();
    let job = ImportJob::new(b"old".to_vec())
        .options(
            EnqueueOptions::default()
                .dedup_key("k")
                .dedup_window(Duration::from_secs(60)),
        )
        .created_ms(T0_MS - 3_600_000);
    let id = q.import_batch(&[job]).unwrap()[0].id();
    assert_eq!(
        q.enqueue(b"dup", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
        Enqueued::Duplicate(id),
        "held while live"
    );
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert!(matches!(
        q.enqueue(b"new", EnqueueOptions::default().dedup_key("k"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
}
