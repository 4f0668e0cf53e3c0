//! Adversarial tests for issue 11: `Queue::close`, `StopSignal` with `dequeue_until`,
//! heartbeats and `extend(&self)`, `Lease::snooze`, typed payload encodings,
//! `Queue::import_batch`, and the format 4 → 5 upgrade with mixed record versions.
//!
//! Each test checks the state that should result (stats, `Queue::job`, `check()`), not only
//! that nothing panics.

mod common;

use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use common::{Fixture, LEASE, T0_MS, assert_consistent};
use leaseq::{
    Applied, Durability, Encoding, EnqueueOptions, Enqueued, Error, ImportJob, JobId, JobState,
    Queue, StopSignal,
};
use serde::{Deserialize, Serialize};

const LONG: Duration = Duration::from_secs(600);
const HOUR_MS: u64 = 3_600_000;
const FIXTURE4: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format4-crashed.leaseq"
);

fn d() -> EnqueueOptions {
    EnqueueOptions::default()
}

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
            d().dedup_key("k").dedup_window(Duration::from_secs(3600)),
        )
        .unwrap()
        .id();
    let out = q
        .import_batch(&[ImportJob::new(b"future".to_vec())
            .options(d().dedup_key("k"))
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
            d().dedup_key("a").dedup_window(Duration::from_secs(3600)),
        )
        .unwrap()
        .id();
    let out = q
        .import_batch(&[ImportJob::new(b"b".to_vec())
            .options(d().dedup_key("b"))
            .created_ms(T0_MS + 2 * HOUR_MS)])
        .unwrap();
    assert!(matches!(out[0], Enqueued::New(_)));
    // Still T0: the window of "a" runs for another hour.
    let again = q.enqueue(b"a again", d().dedup_key("a")).unwrap();
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
        d().dedup_key("k").dedup_window(Duration::from_secs(3600)),
    )
    .unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    f.clock.advance(Duration::from_millis(2 * HOUR_MS));
    // (No other enqueue with a dedup key here: it would prune the ended window itself.)
    let out = q
        .import_batch(&[ImportJob::new(b"exported at T0".to_vec())
            .options(d().dedup_key("k"))
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
                d().idempotency_key(&key512)
                    .dedup_key(&key512)
                    .dedup_window(Duration::from_secs(1)),
            ),
            // Its delay is ignored: the state says when it is due.
            ImportJob::new(b"delay ignored".to_vec()).options(d().delay(Duration::from_secs(60))),
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
        ImportJob::new(b"x".to_vec()).options(d().dedup_key(&long)),
        ImportJob::new(b"x".to_vec()).options(d().idempotency_key(&long)),
        ImportJob::new(b"x".to_vec()).options(d().dedup_key("")),
        ImportJob::new(b"x".to_vec()).options(d().idempotency_key("")),
        ImportJob::new(b"x".to_vec()).options(d().dedup_window(Duration::from_secs(1))),
        ImportJob::new(b"x".to_vec())
            .options(d().dedup_key("w").dedup_window(Duration::from_micros(500))),
        ImportJob::new(b"x".to_vec()).options(d().lease(Duration::ZERO)),
        ImportJob::new(b"x".to_vec())
            .options(d().max_attempts(2))
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
            d().dedup_key("wk").dedup_window(Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    let dead_holder = q
        .enqueue(b"dead", d().dedup_key("dk").max_attempts(1))
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().fail("gone").unwrap();
    let half = leaseq::BATCH_MAX / 2;
    let mut jobs: Vec<ImportJob> = (0..leaseq::BATCH_MAX)
        .map(|i| {
            ImportJob::new(i.to_le_bytes().to_vec())
                .options(d().dedup_key(format!("k{}", i % half)))
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
    jobs[half] = ImportJob::new(b"w again".to_vec()).options(d().dedup_key("wk"));
    jobs[half + 1] = ImportJob::new(b"d again".to_vec()).options(d().dedup_key("dk"));
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
                .options(d().dedup_key("fresh-dead"))
                .state(JobState::Dead)
                .attempts(5),
            ImportJob::new(b"y".to_vec()).options(d().dedup_key("fresh-dead")),
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
                .options(d().max_attempts(3).priority(-1))
                .attempts(2)
                .snoozes(7)
                .last_error(Some("second failure".into())),
            ImportJob::new(b"leased, none made".to_vec())
                .options(d().max_attempts(1))
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

// ---------------------------------------------------------------------------------------
// Snooze.
// ---------------------------------------------------------------------------------------

/// max_attempts 1: any number of snoozes leave the one attempt; a crash holding the lease
/// uses it (dead at reopen); a scheduled snoozed job is untouched by the reopen.
#[test]
fn snooze_with_one_attempt_then_a_crash_dead_letters_at_reopen() {
    let f = Fixture::new();
    let (crashed, waiting) = {
        let q = f.open();
        let crashed = q.enqueue(b"crash", d().max_attempts(1)).unwrap().id();
        let waiting = q.enqueue(b"wait", d().max_attempts(1)).unwrap().id();
        for _ in 0..3 {
            let l = q.dequeue().unwrap().unwrap();
            assert_eq!(l.attempt(), 1);
            l.snooze(Duration::ZERO).unwrap();
        }
        // `crash` and `wait` alternate: crash (1), wait (1), crash (2) were snoozed.
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.id(), waiting);
        l.snooze(Duration::from_secs(120)).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!((l.id(), l.attempt()), (crashed, 1));
        drop(l); // the process "dies" holding it: never ended
        drop(q);
        (crashed, waiting)
    };
    let q = f.open();
    let r = q.recovery();
    assert_eq!((r.leases_returned, r.leases_dead_lettered), (0, 1), "{r:?}");
    let j = q.job(crashed).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Dead, 1, 2));
    let w = q.job(waiting).unwrap().unwrap();
    assert_eq!(
        (w.state, w.attempts, w.snoozes, w.run_at_ms),
        (JobState::Scheduled, 0, 2, T0_MS + 120_000)
    );
    assert_consistent(&q);
}

#[test]
fn the_snooze_count_saturates() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .import_batch(&[ImportJob::new(b"tired".to_vec())
            .snoozes(u32::MAX)
            .attempts(3)])
        .unwrap()[0]
        .id();
    for _ in 0..2 {
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.attempt(), 4);
        l.snooze(Duration::ZERO).unwrap();
        let j = q.job(id).unwrap().unwrap();
        assert_eq!(
            (j.state, j.attempts, j.snoozes),
            (JobState::Ready, 3, u32::MAX)
        );
    }
    assert_consistent(&q);
}

/// A snooze touches no key: a dedup key held while live stays held, the idempotency key still
/// guards the effect, and a window ends on its own time even while the job sleeps.
#[test]
fn snooze_keeps_keys_and_windows_run_on_their_own_time() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"a", d().dedup_key("a").idempotency_key("ia"))
        .unwrap()
        .id();
    let w = q
        .enqueue(
            b"w",
            d().dedup_key("w").dedup_window(Duration::from_secs(5)),
        )
        .unwrap()
        .id();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(10))
        .unwrap();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        q.enqueue(b"dup", d().dedup_key("a")).unwrap(),
        Enqueued::Duplicate(a)
    );
    assert_eq!(
        q.enqueue(b"dup", d().dedup_key("w")).unwrap(),
        Enqueued::Duplicate(w)
    );
    f.clock.advance(Duration::from_secs(6));
    // w's window ended: the key is free though w is still snoozed.
    let w2 = q.enqueue(b"w2", d().dedup_key("w")).unwrap().id();
    assert_eq!(q.job(w).unwrap().unwrap().state, JobState::Scheduled);
    f.clock.advance(Duration::from_secs(4));
    // w2 became ready before a came due: first in line.
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), w2);
    l.ack().unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt()), (a, 1));
    assert_eq!(l.ack_with(|_| Ok(())).unwrap(), Applied::Now);
    assert!(q.is_applied("ia").unwrap());
    assert!(matches!(
        q.enqueue(b"a later", d().dedup_key("a")).unwrap(),
        Enqueued::New(_)
    ));
    // w comes due later.
    f.clock.advance(Duration::from_secs(60));
    let mut seen = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        seen.push(l.id());
        l.ack().unwrap();
    }
    assert!(seen.contains(&w), "{seen:?}");
    assert_consistent(&q);
}

/// In a batch: one lease snoozed, one whose `ack_with` closure fails (given back, charged),
/// whose later snooze is stale and changes nothing; the attempt counts add up to dead.
#[test]
fn snooze_in_a_batch_next_to_a_failing_ack_with() {
    let f = Fixture::new();
    let q = f.open();
    let ids: Vec<JobId> = (0..3u8)
        .map(|i| q.enqueue(&[i], d().max_attempts(2)).unwrap().id())
        .collect();
    let mut batch = q.dequeue_batch(3).unwrap().into_iter();
    let (l0, l1, l2) = (
        batch.next().unwrap(),
        batch.next().unwrap(),
        batch.next().unwrap(),
    );
    l0.snooze(Duration::ZERO).unwrap();
    let r = l1.ack_with(|_| Err("boom".into()));
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    let before = q.job(ids[1]).unwrap().unwrap();
    assert_eq!(
        (before.state, before.attempts, before.snoozes),
        (JobState::Ready, 1, 0)
    );
    assert!(matches!(
        l1.snooze(Duration::ZERO),
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        l1.heartbeat().extend(LEASE),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(q.job(ids[1]).unwrap().unwrap(), before);
    l2.ack().unwrap();
    // Job 1 again: its second and last attempt; a snooze gives it back, then a failing
    // effect on the same attempt number makes it dead.
    let mut deaths = 0;
    for _ in 0..6 {
        let Some(l) = q.dequeue().unwrap() else { break };
        if l.id() == ids[1] && q.job(ids[1]).unwrap().unwrap().snoozes == 0 {
            assert_eq!(l.attempt(), 2);
            l.snooze(Duration::ZERO).unwrap();
        } else if l.id() == ids[1] {
            assert_eq!(l.attempt(), 2, "the snoozed attempt was given back");
            assert!(l.ack_with(|_| Err("boom again".into())).is_err());
            deaths += 1;
        } else {
            assert_eq!((l.id(), l.attempt()), (ids[0], 1));
            l.ack().unwrap();
        }
    }
    assert_eq!(deaths, 1);
    let j = q.job(ids[1]).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Dead, 2, 1));
    assert_eq!(j.last_error.as_deref(), Some("boom again"));
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.dead), (1, 1));
    assert_consistent(&q);
}

#[test]
fn a_snoozed_job_can_be_removed_purged_or_requeued() {
    let f = Fixture::new();
    let q = f.open();
    let r = q.enqueue(b"r", d().dedup_key("r")).unwrap().id();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(60))
        .unwrap();
    q.remove(r).unwrap();
    assert!(q.job(r).unwrap().is_none());
    assert!(matches!(
        q.enqueue(b"r2", d().dedup_key("r")).unwrap(),
        Enqueued::New(_)
    ));
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::from_secs(60))
        .unwrap();
    assert_eq!(q.purge(JobState::Scheduled).unwrap(), 1);
    // Dead, requeued: the snooze count stays, the attempts restart.
    let x = q.enqueue(b"x", d().max_attempts(1)).unwrap().id();
    q.dequeue()
        .unwrap()
        .unwrap()
        .snooze(Duration::ZERO)
        .unwrap();
    q.dequeue().unwrap().unwrap().fail("no").unwrap();
    q.requeue_dead(x).unwrap();
    let j = q.job(x).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Ready, 0, 1));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.attempt(), l.max_attempts()), (1, 1));
    l.ack().unwrap();
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Heartbeats and extend(&self).
// ---------------------------------------------------------------------------------------

/// A heartbeat thread that keeps beating after its lease was snoozed, nacked or expired must
/// never move the deadline of the job's next delivery.
#[test]
fn a_stale_heartbeat_never_moves_the_next_delivery() {
    let f = Fixture::new();
    let q = f
        .builder()
        .durability(Durability::None)
        .open(&f.path)
        .unwrap();
    for round in 0..60u32 {
        let id = q.enqueue(&round.to_le_bytes(), d()).unwrap().id();
        let first = q.dequeue().unwrap().unwrap();
        let beat = first.heartbeat();
        let beater = std::thread::spawn(move || {
            for n in 0..10_000 {
                match beat.extend(Duration::from_secs(3600)) {
                    Ok(_) => {}
                    Err(Error::LeaseLost { .. }) => return n,
                    Err(e) => panic!("{e}"),
                }
            }
            panic!("the heartbeat was never refused");
        });
        match round % 3 {
            0 => first.snooze(Duration::ZERO).unwrap(),
            1 => assert_eq!(first.nack("again").unwrap(), JobState::Ready),
            _ => {
                // Lost to expiry: the old deadline passes and a dequeue reclaims it (the
                // beater may have pushed it out: move past whatever it is now).
                while q.job(id).unwrap().unwrap().state == JobState::Leased {
                    let dl = q.job(id).unwrap().unwrap().lease_deadline_ms.unwrap();
                    f.clock.set_ms(dl + 1);
                    if let Some(l) = q.dequeue().unwrap() {
                        assert_eq!(l.id(), id);
                        l.nack_after("give back", Duration::ZERO).unwrap();
                    }
                }
                drop(first);
            }
        }
        let second = q.dequeue().unwrap().expect("given back");
        assert_eq!(second.id(), id);
        beater.join().unwrap();
        let j = q.job(id).unwrap().unwrap();
        assert_eq!(j.lease_token, Some(second.token()), "round {round}");
        assert_eq!(
            j.lease_deadline_ms,
            Some(second.deadline_ms()),
            "round {round}: a stale heartbeat moved the new lease"
        );
        second.ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// `extend(&self)` from several threads at once: afterwards the lease's own `deadline_ms()`
/// must be the deadline the file holds (a worker that trusts it must not believe it has more
/// time than the store gives it).
#[test]
fn concurrent_extends_leave_deadline_ms_equal_to_the_stored_deadline() {
    let f = Fixture::new();
    let q = f
        .builder()
        .durability(Durability::None)
        .open(&f.path)
        .unwrap();
    const ROUNDS: u32 = 1000;
    let mut mismatches = Vec::new();
    for round in 0..ROUNDS {
        let id = q.enqueue(&round.to_le_bytes(), d()).unwrap().id();
        let lease = q.dequeue().unwrap().unwrap();
        let barrier = Barrier::new(3);
        std::thread::scope(|s| {
            for by in [10u64, 20, 40] {
                let (lease, barrier) = (&lease, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    lease.extend(Duration::from_secs(by)).unwrap();
                });
            }
        });
        let stored = q.job(id).unwrap().unwrap().lease_deadline_ms.unwrap();
        if lease.deadline_ms() != stored {
            mismatches.push((round, lease.deadline_ms() - T0_MS, stored - T0_MS));
        }
        lease.ack().unwrap();
    }
    assert!(
        mismatches.is_empty(),
        "{} of {ROUNDS} rounds: (round, deadline_ms() - T0, stored - T0): {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    assert_consistent(&q);
}

/// As documented: a heartbeat holds the queue, so the file stays open (a reopen is
/// `AlreadyOpen`) until the heartbeat is dropped, even after its lease ended.
#[test]
fn a_heartbeat_keeps_the_file_open_until_dropped() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", d()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    let beat = lease.heartbeat();
    lease.ack().unwrap();
    // A heartbeat made after the end holds nothing.
    let late = lease.heartbeat();
    drop((q, lease));
    assert!(matches!(late.extend(LEASE), Err(Error::LeaseLost { .. })));
    assert!(matches!(beat.extend(LEASE), Err(Error::LeaseLost { .. })));
    assert!(matches!(
        f.builder().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    drop(beat);
    let q = f.open();
    assert!(q.job(id).unwrap().is_none());
    assert_eq!(q.recovery().leases_returned, 0);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Close and stop signals.
// ---------------------------------------------------------------------------------------

#[test]
fn close_wakes_every_named_queue_and_in_flight_work_still_ends() {
    let f = Fixture::new();
    let q = f.open();
    let (a, b) = (q.named("a").unwrap(), q.named("b").unwrap());
    let held_id = a.enqueue(b"held", d().max_attempts(2)).unwrap().id();
    let other_id = a.enqueue(b"other", d()).unwrap().id();
    let held = a.dequeue().unwrap().unwrap();
    let other = a.dequeue().unwrap().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|h| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let r = h
                    .dequeue_until(LONG, &StopSignal::new())
                    .map(|l| l.is_some());
                tx.send(r).unwrap();
            })
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    q.close();
    for _ in 0..2 {
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("woken");
        assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    }
    waiters.into_iter().for_each(|t| t.join().unwrap());
    assert!(matches!(
        a.import_batch(&[ImportJob::new(b"x".to_vec())]),
        Err(Error::Closed)
    ));
    // In-flight work: a heartbeat, a snooze, an ack_with whose follow-up is typed.
    let beat = held.heartbeat();
    f.clock.advance(Duration::from_secs(5));
    assert_eq!(
        beat.extend(Duration::from_secs(100)).unwrap(),
        T0_MS + 105_000
    );
    held.snooze(Duration::from_secs(30)).unwrap();
    let j = a.job(held_id).unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.snoozes),
        (JobState::Scheduled, 0, 1)
    );
    assert!(matches!(beat.extend(LEASE), Err(Error::LeaseLost { .. })));
    let (applied, next) = other
        .ack_with_and_next(|tx| {
            tx.enqueue_value(&("follow".to_string(), 1u32), d())?;
            Ok(())
        })
        .unwrap();
    assert_eq!(applied, Applied::Now);
    assert!(next.is_none());
    assert!(a.job(other_id).unwrap().is_none());
    let s = a.stats().unwrap();
    assert_eq!((s.scheduled, s.ready, s.leased), (1, 1, 0), "{s:?}");
    // Still closed: nothing new leaves.
    assert!(matches!(a.dequeue(), Err(Error::Closed)));
    assert_consistent(&q);
}

/// Many waiters on one stop signal: the jobs enqueued go to exactly as many of them, the
/// others return `Ok(None)` at the stop, and no job is left leased without a holder.
#[test]
fn many_waiters_one_stop_exactly_the_enqueued_jobs_are_leased() {
    let f = Fixture::new();
    let q = f.open();
    let stop = StopSignal::new();
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (q, stop, tx) = (q.clone(), stop.clone(), tx.clone());
            std::thread::spawn(move || tx.send(q.dequeue_until(LONG, &stop).unwrap()).unwrap())
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    q.enqueue_batch([(&b"1"[..], d()), (&b"2"[..], d()), (&b"3"[..], d())])
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap()
                .expect("a job"),
        );
    }
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    stop.stop();
    for _ in 0..5 {
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_none());
    }
    threads.into_iter().for_each(|t| t.join().unwrap());
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.leased), (0, 3));
    let mut payloads: Vec<Vec<u8>> = got.iter().map(|l| l.payload().to_vec()).collect();
    payloads.sort();
    assert_eq!(payloads, vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    for l in got {
        l.ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// A stop racing a commit that makes work: the waiter either takes the job (and its lease is
/// the current one) or returns `None` with the job still ready; never both, never a lost job.
#[test]
fn a_stop_racing_an_enqueue_never_loses_the_job() {
    let f = Fixture::new();
    let q = f
        .builder()
        .durability(Durability::None)
        .open(&f.path)
        .unwrap();
    let (mut taken, mut left) = (0, 0);
    for round in 0..60u32 {
        let stop = StopSignal::new();
        let waiter = {
            let (q, stop) = (q.clone(), stop.clone());
            std::thread::spawn(move || q.dequeue_until(LONG, &stop))
        };
        let barrier = Arc::new(Barrier::new(2));
        let enq = {
            let (q, barrier) = (q.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                q.enqueue(&round.to_le_bytes(), EnqueueOptions::default())
                    .unwrap()
                    .id()
            })
        };
        barrier.wait();
        stop.stop();
        let id = enq.join().unwrap();
        let t = Instant::now();
        let got = waiter.join().unwrap().unwrap();
        assert!(t.elapsed() < Duration::from_secs(10));
        let j = q.job(id).unwrap().unwrap();
        match got {
            Some(l) => {
                taken += 1;
                assert_eq!(l.id(), id);
                assert_eq!(j.lease_token, Some(l.token()), "round {round}");
                l.ack().unwrap();
            }
            None => {
                left += 1;
                assert_eq!(j.state, JobState::Ready, "round {round}");
                q.dequeue().unwrap().unwrap().ack().unwrap();
            }
        }
    }
    assert_eq!(taken + left, 60);
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

#[test]
fn one_stop_signal_wakes_waiters_in_two_files() {
    let (f1, f2) = (Fixture::new(), Fixture::new());
    let (q1, q2) = (f1.open(), f2.open());
    let q2n = q2.named("n").unwrap();
    let stop = StopSignal::new();
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = [q1.clone(), q2.clone(), q2n.clone(), q1.clone()]
        .into_iter()
        .map(|q| {
            let (stop, tx) = (stop.clone(), tx.clone());
            std::thread::spawn(move || tx.send(q.dequeue_until(LONG, &stop).unwrap().is_none()))
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    // Work in one file wakes none of the waiters of the other for nothing to take.
    q2.enqueue(b"in file 2", d()).unwrap();
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(!first, "a waiter of file 2's default queue took the job");
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    let t = Instant::now();
    stop.stop();
    for _ in 0..3 {
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    threads.into_iter().for_each(|t| t.join().unwrap().unwrap());
    // The job taken by the file-2 waiter was dropped unacked: leased there, nothing in file 1.
    assert_eq!(q2.stats().unwrap().leased, 1);
    assert_eq!(q1.stats().unwrap().total, 0);
    assert!(!q1.is_closed() && !q2.is_closed());
    assert_consistent(&q1);
    assert_consistent(&q2);
}

// ---------------------------------------------------------------------------------------
// Encodings.
// ---------------------------------------------------------------------------------------

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Tree {
    Leaf,
    Node(Box<Tree>),
}

#[track_caller]
fn codec_err<T: std::fmt::Debug>(r: leaseq::Result<T>) {
    assert!(matches!(r, Err(Error::PayloadCodec { .. })), "{r:?}");
}

/// Foreign or damaged payloads (enqueued as raw bytes) decode to `PayloadCodec`, quickly, and
/// never to a panic or an allocation the size a length prefix claims.
#[test]
fn corrupt_payloads_are_codec_errors() {
    let f = Fixture::new();
    let q = f.open();
    let json = q.with_encoding(Encoding::Json);
    let mut huge_len = vec![253u8];
    huge_len.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let bincode_cases: Vec<Vec<u8>> = vec![
        huge_len.clone(),          // Vec<u64> / String / Vec<Vec<u8>> of 2^62 items
        vec![3, 0xff, 0xfe, 0xfd], // a String of invalid UTF-8
        vec![255],                 // no such varint
        vec![],                    // nothing
        vec![2, 7, 7, 9, 9, 9],    // trailing bytes after a Vec<u8> of 2
        vec![251, 0xff],           // a truncated u16
    ];
    for p in &bincode_cases {
        q.enqueue(p, d()).unwrap();
    }
    let json_cases: Vec<Vec<u8>> = vec![
        br#"{"a":"#.to_vec(),
        b"\"\xff\xfe\"".to_vec(),
        [b"[".repeat(100_000), b"]".repeat(100_000)].concat(),
        [
            br#"{"Node":"#.repeat(50_000),
            br#""Leaf""#.to_vec(),
            b"}".repeat(50_000),
        ]
        .concat(),
        b"[1,2] trailing".to_vec(),
        b"1e999999".to_vec(),
    ];
    for p in &json_cases {
        json.enqueue(p, d()).unwrap();
    }
    let t = Instant::now();
    for i in 0..bincode_cases.len() {
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.encoding(), Encoding::Bincode);
        codec_err(l.decode::<Vec<u64>>());
        codec_err(l.decode::<String>());
        codec_err(l.decode::<Vec<Vec<u8>>>());
        codec_err(l.decode::<(u16, u64, u64)>());
        if i == 4 {
            assert_eq!(
                l.decode::<(Vec<u8>, u8, u8, u8)>().unwrap(),
                (vec![7, 7], 9, 9, 9)
            );
        }
        l.ack().unwrap();
    }
    for i in 0..json_cases.len() {
        let l = json.dequeue().unwrap().unwrap();
        assert_eq!(l.encoding(), Encoding::Json, "case {i}");
        codec_err(l.decode::<serde_json::Value>());
        codec_err(l.decode::<Tree>());
        codec_err(l.decode::<Vec<u8>>());
        l.ack().unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(q.stats().unwrap().total, 0);
}

/// A deeply nested bincode payload decoded into a recursive job type: `PayloadCodec`, not a
/// stack overflow that aborts the worker process. Runs in a child process so an abort is seen
/// as an exit status instead of killing the test binary.
#[test]
fn a_deeply_nested_bincode_payload_is_a_codec_error_not_a_crash() {
    const NAME: &str = "a_deeply_nested_bincode_payload_is_a_codec_error_not_a_crash";
    if let Some((scenario, path)) = common::child_scenario() {
        if scenario == "decode-deep" {
            let q = Queue::open(&path).unwrap();
            let l = q.dequeue().unwrap().unwrap();
            // A worker thread with the default stack.
            let r = std::thread::spawn(move || match l.decode::<Tree>() {
                Ok(_) => "decoded".to_string(),
                Err(Error::PayloadCodec { .. }) => "PayloadCodec".to_string(),
                Err(e) => format!("other error: {e}"),
            })
            .join()
            .unwrap();
            common::say(format!("RESULT {r}"));
        }
        return;
    }
    let f = Fixture::new();
    {
        let q = f.open();
        // Variant 1 (Node) nested 64 Ki deep, ending in variant 7, which `Tree` does not
        // have: not a `Tree` whatever the stack, so the only right answer is PayloadCodec.
        // (8 Ki deep and a Leaf decodes fine on a 2 MiB worker stack; 64 Ki aborts.)
        let mut p = vec![1u8; 64 * 1024];
        p.push(7);
        q.enqueue(&p, d()).unwrap();
    }
    let mut child = common::ChildProc::spawn(NAME, "decode-deep", &f.path);
    let said = child.next_message();
    let status = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(50));
        child.exited()
    });
    assert_eq!(
        said.as_deref(),
        Some("RESULT PayloadCodec"),
        "the child died decoding (exit: {status:?})"
    );
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Wrapped {
    text: String,
}

#[test]
fn a_json_value_at_the_payload_limit_and_lossy_values_are_refused() {
    let f = Fixture::new();
    let q = f
        .builder()
        .payload_bytes_max(4096)
        .encoding(Encoding::Json)
        .open(&f.path)
        .unwrap();
    // `"` + text + `"`: exactly the limit, then one byte over.
    let at = "é".repeat(2047); // 4094 bytes
    let id = q.enqueue_value(&at, d()).unwrap().id();
    assert_eq!(q.job(id).unwrap().unwrap().payload_bytes, 4096);
    let over = format!("{at}a");
    assert!(matches!(
        q.enqueue_value(&over, d()),
        Err(Error::PayloadTooLarge { .. })
    ));
    // A value JSON cannot carry: NaN is written as null, which is no f64.
    codec_err(q.enqueue_value(&f64::NAN, d()));
    codec_err(q.enqueue_value(&vec![1.0, f64::INFINITY], d()));
    // Map keys JSON cannot write.
    let mut m = std::collections::BTreeMap::new();
    m.insert((1u8, 2u8), 3u8);
    codec_err(q.enqueue_value(&m, d()));
    assert_eq!(
        q.stats().unwrap().total,
        1,
        "nothing written by the refusals"
    );
    // Bincode carries them.
    let b = q.with_encoding(Encoding::Bincode);
    b.enqueue_value(&m, d()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<String>().unwrap(), at);
    l.ack().unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(
        l.encoding(),
        Encoding::Bincode,
        "the job's own, not the handle's"
    );
    assert_eq!(
        l.decode::<std::collections::BTreeMap<(u8, u8), u8>>()
            .unwrap(),
        m
    );
    l.ack().unwrap();
    assert_consistent(&q);
}

#[test]
fn tx_enqueue_value_records_the_encoding_of_its_handle() {
    let f = Fixture::new();
    let q = f.open();
    let json = q.with_encoding(Encoding::Json);
    json.enqueue(b"raw parent", d()).unwrap();
    let parent = json.dequeue().unwrap().unwrap();
    assert_eq!(parent.encoding(), Encoding::Json, "raw: the handle's");
    let mut child_ids = Vec::new();
    parent
        .ack_with(|tx| {
            let id = tx
                .enqueue_value(
                    &Wrapped {
                        text: "from json".into(),
                    },
                    d(),
                )?
                .id();
            child_ids.push(id);
            Ok(())
        })
        .unwrap();
    let from_json = *child_ids.last().unwrap();
    let from_bincode = q
        .write(|tx| {
            Ok(tx
                .enqueue_value(
                    &Wrapped {
                        text: "from bincode".into(),
                    },
                    d(),
                )?
                .id())
        })
        .unwrap();
    assert_eq!(
        q.job(from_json).unwrap().unwrap().encoding,
        Some(Encoding::Json)
    );
    assert_eq!(
        q.job(from_bincode).unwrap().unwrap().encoding,
        Some(Encoding::Bincode)
    );
    assert!(q.payload(from_json).unwrap().unwrap().starts_with(b"{"));
    // Both decode through either handle.
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<Wrapped>().unwrap().text, "from json");
    l.ack().unwrap();
    let l = json.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<Wrapped>().unwrap().text, "from bincode");
    l.ack().unwrap();
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Format 4 → 5 with records of versions 3 and 4 side by side.
// ---------------------------------------------------------------------------------------

#[test]
fn an_upgraded_file_mixes_record_versions_through_snooze_crash_and_import() {
    let f = Fixture::new();
    std::fs::copy(FIXTURE4, &f.path).unwrap();
    let max3 = {
        let q = f.open();
        assert_eq!(q.recovery().upgraded_from, Some(4));
        let max3 = q.job(JobId(3)).unwrap().unwrap().max_attempts;
        // Job 3 (record v3): delivered, snoozed (now v4), delivered again and held at the
        // "crash"; jobs 1 and 2 stay version-3 records.
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!((l.id(), l.attempt()), (JobId(3), 2));
        l.snooze(Duration::ZERO).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!((l.id(), l.attempt()), (JobId(3), 2));
        // Imported next to the old records.
        let out = q
            .import_batch(&[
                ImportJob::new(b"imported".to_vec())
                    .encoding(Some(Encoding::Json))
                    .options(d().dedup_key("d3")),
                ImportJob::new(b"imported dead".to_vec())
                    .state(JobState::Dead)
                    .attempts(1)
                    .snoozes(4),
            ])
            .unwrap();
        assert_eq!(out[0], Enqueued::Duplicate(JobId(3)));
        drop(l); // held at the "crash"
        drop(q);
        max3
    };
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None);
    let want = if max3 > 2 { 1 } else { 0 };
    assert_eq!(q.recovery().leases_returned, want);
    let j3 = q.job(JobId(3)).unwrap().unwrap();
    assert_eq!((j3.attempts, j3.snoozes), (2, 1));
    for id in [1, 2] {
        let j = q.job(JobId(id)).unwrap().unwrap();
        assert_eq!(
            (j.snoozes, j.encoding, j.attempts),
            (0, None, id as u32 - 1)
        );
    }
    // The side queue's delayed v3 job comes due and is snoozed: v4 there too.
    let side = q.existing("side").unwrap();
    f.clock.advance(Duration::from_secs(61));
    let mut side_payloads = Vec::new();
    let mut snoozed = false;
    while let Some(l) = side.dequeue().unwrap() {
        side_payloads.push(l.payload().to_vec());
        if l.payload() == b"side-later" && !snoozed {
            snoozed = true;
            l.snooze(Duration::ZERO).unwrap();
            let j = side.job(l.id()).unwrap().unwrap();
            assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Ready, 0, 1));
        } else {
            l.ack().unwrap();
        }
    }
    assert_eq!(side_payloads.len(), 3, "{side_payloads:?}");
    assert_eq!(side.stats().unwrap().total, 0);
    assert_eq!(
        q.enqueue(b"x", d().dedup_key("d3")).unwrap(),
        Enqueued::Duplicate(JobId(3))
    );
    let s = q.stats().unwrap();
    let dead = if max3 > 2 { 1 } else { 2 };
    assert_eq!(
        (s.total, s.dead),
        (4, dead),
        "jobs 1 to 3, the imported dead job"
    );
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// tracing.
// ---------------------------------------------------------------------------------------

/// Everything a subscriber wrote, as text.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let value = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
    (value, text)
}

/// A snooze is never reported as a dead-lettering (it never is one), however often a job
/// with one attempt is snoozed; the expiry that does use its attempt is; the upgrade of a
/// format-4 file is reported with the version it came from.
#[test]
fn snoozes_are_not_dead_letterings_and_the_upgrade_is_reported() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"one try", d().max_attempts(1)).unwrap().id();
    let ((), log) = capture(|| {
        for _ in 0..5 {
            q.dequeue()
                .unwrap()
                .unwrap()
                .snooze(Duration::ZERO)
                .unwrap();
        }
    });
    assert!(!log.contains("dead-lettered"), "{log}");
    assert_eq!(q.job(id).unwrap().unwrap().snoozes, 5);
    let ((), log) = capture(|| {
        let l = q.dequeue().unwrap().unwrap();
        f.clock.advance(LEASE + Duration::from_secs(1));
        drop(l);
        assert!(q.dequeue().unwrap().is_none());
    });
    assert!(
        log.contains("dead-lettered (no attempts left)") && log.contains("lease expired"),
        "{log}"
    );
    let j = q.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.snoozes), (JobState::Dead, 1, 5));
    drop(q);

    let g = Fixture::new();
    std::fs::copy(FIXTURE4, &g.path).unwrap();
    let (q, log) = capture(|| g.open());
    assert_eq!(q.recovery().upgraded_from, Some(4));
    assert!(log.contains("upgraded_from=4"), "{log}");
    assert!(log.contains("leases_returned=1"), "{log}");
    assert_consistent(&q);
}
