//! Applied-ids markers over a long run (issue 9, C26): no marker for a job's own id, caller
//! keys kept for a retention horizon and never pruned while a live job carries them; the
//! upgrade of a format-1 file.
//!
//! Adversarial tests of the "run for years" work (issue 9): applied-marker retention on every
//! path that creates or deletes jobs (also from threads sharing group commits).
//!
//! A property test of the long-run rules (issue 9): random sequences of enqueues (delay,
//! priority, dedup key with and without a window, idempotency key), dequeues, acks,
//! `ack_with`, nacks, lease expiry, `prune`, `compact`, clock steps and reopens, run against a
//! simple model. After every step `check()` is empty and the stats, the applied markers and
//! the held dedup keys are the model's; every dequeue hands out the model's choice.

use crate::common;
use crate::common::{
    Fixture, T0_MS, all_ok, assert_consistent, bump, flip_record_byte, keyed, ms, secs,
};
use leaseq::{
    Applied, EnqueueOptions, Enqueued, Error, JobId, JobState, Lease, Queue, RetryPolicy, Stats,
};
use proptest::prelude::*;
use redb::{ReadableTable, TableDefinition};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// C26, first part: 100,000 cycles of enqueue (default key), dequeue, `ack_with` leave the
/// applied-ids table empty: a job's own id guards nothing once the job is gone.
#[test]
fn c26_default_key_effects_keep_no_markers() {
    let f = Fixture::new();
    let q = f.open_non_durable();
    for _ in 0..100 {
        q.enqueue_batch((0..1_000).map(|_| (&b"x"[..], EnqueueOptions::default())))
            .unwrap();
        let batch = q.dequeue_batch(1_000).unwrap();
        let applied = all_ok(
            q.ack_with_batch(&batch, |tx, l| bump(tx, l.id().0 % 10))
                .unwrap(),
        );
        assert!(applied.iter().all(|a| *a == Applied::Now));
    }
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.applied), (0, 0), "{s:?}");
    assert_consistent(&q);
}

fn retained(f: &Fixture, retention_ms: u64) -> Queue {
    f.builder()
        .applied_retention(Some(ms(retention_ms)))
        .open(&f.path)
        .unwrap()
}

/// C26, second part: `enq(A, K)`; `ack_with` → Now; `enq(A2, K)` (a producer retry); a prune
/// past the horizon keeps K while A2 is live, in every state A2 can be in; `ack_with(A2)` →
/// AlreadyApplied; then the prune removes K.
#[test]
fn c26_a_marker_outlives_its_horizon_while_a_live_job_carries_its_key() {
    for a2_state in [
        JobState::Ready,
        JobState::Scheduled,
        JobState::Leased,
        JobState::Dead,
    ] {
        let f = Fixture::new();
        let q = retained(&f, 10);
        q.enqueue(b"A", keyed("K")).unwrap();
        let a = q.dequeue().unwrap().unwrap();
        assert_eq!(a.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
        let opts = match a2_state {
            JobState::Scheduled => keyed("K").delay(Duration::from_secs(60)),
            _ => keyed("K"),
        };
        let a2 = q.enqueue(b"A2", opts).unwrap().id();
        let mut held = None;
        match a2_state {
            JobState::Leased => held = q.dequeue().unwrap(),
            JobState::Dead => q.dequeue().unwrap().unwrap().fail("later").unwrap(),
            _ => {}
        }
        assert_eq!(q.job(a2).unwrap().unwrap().state, a2_state);
        f.clock.advance(ms(11));
        assert_eq!(
            q.prune().unwrap().applied,
            0,
            "{a2_state:?}: K is carried by A2"
        );
        assert!(q.is_applied("K").unwrap(), "{a2_state:?}");
        assert_consistent(&q);
        // A2 ends: as a duplicate of the applied effect (or removed, when dead).
        match a2_state {
            JobState::Dead => q.remove(a2).unwrap(),
            _ => {
                f.clock.advance(Duration::from_secs(61));
                let l = match held.take() {
                    Some(l) => l,
                    None => q.dequeue().unwrap().unwrap(),
                };
                assert_eq!(l.id(), a2);
                assert_eq!(
                    l.ack_with(|tx| bump(tx, 1)).unwrap(),
                    Applied::AlreadyApplied
                );
            }
        }
        // The prune that found K carried restarted its horizon: not yet.
        assert!(q.is_applied("K").unwrap());
        f.clock.advance(Duration::from_secs(120));
        assert_eq!(q.prune().unwrap().applied, 1, "{a2_state:?}");
        assert!(!q.is_applied("K").unwrap(), "{a2_state:?}");
        // After the horizon, a duplicate is applied again (documented).
        q.enqueue(b"A3", keyed("K")).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
        assert_consistent(&q);
    }
}

/// Markers past their horizon go a few per new marker, as `ack_with` writes them, and the rest
/// with `prune`; markers within it stay.
#[test]
fn expired_markers_go_as_new_ones_come_and_prune_finishes() {
    let f = Fixture::new();
    let q = retained(&f, 10_000);
    let keys: Vec<String> = (0..100).map(|i| format!("old-{i}")).collect();
    for k in &keys {
        q.enqueue(b"x", keyed(k)).unwrap();
    }
    let batch = q.dequeue_batch(100).unwrap();
    all_ok(q.ack_with_batch(&batch, |_, _| Ok(())).unwrap());
    assert_eq!(q.stats().unwrap().applied, 100);
    f.clock.advance(ms(10_001));
    for i in 0..10 {
        q.enqueue(b"y", keyed(&format!("new-{i}"))).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.ack_with(|_| Ok(())).unwrap(), Applied::Now);
    }
    // Ten new markers, each pruning at most two old ones.
    assert_eq!(q.stats().unwrap().applied, 100 + 10 - 20);
    assert_eq!(q.prune().unwrap().applied, 80);
    assert_eq!(q.stats().unwrap().applied, 10);
    assert!(keys.iter().all(|k| !q.is_applied(k).unwrap()));
    assert!((0..10).all(|i| q.is_applied(format!("new-{i}")).unwrap()));
    assert_eq!(q.prune().unwrap().applied, 0);
    assert_consistent(&q);
}

/// `None` keeps markers forever; the default keeps them 7 days.
#[test]
fn retention_none_keeps_markers_and_the_default_is_seven_days() {
    let f = Fixture::new();
    let q = f.builder().applied_retention(None).open(&f.path).unwrap();
    q.enqueue(b"x", keyed("forever")).unwrap();
    q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
    f.clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    assert_eq!(q.prune().unwrap().applied, 0);
    assert!(q.is_applied("forever").unwrap());
    drop(q);

    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"x", keyed("week")).unwrap();
    q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
    f.clock.advance(Duration::from_secs(7 * 24 * 3600 - 1));
    assert_eq!(q.prune().unwrap().applied, 0);
    f.clock.advance(Duration::from_secs(1));
    assert_eq!(q.prune().unwrap().applied, 1);
}

#[test]
fn zero_or_overflowing_retention_is_refused_before_anything_is_written() {
    for bad in [Duration::ZERO, leaseq::DELAY_MAX + ms(1)] {
        let f = Fixture::new();
        let r = f.builder().applied_retention(Some(bad)).open(&f.path);
        assert!(
            matches!(
                r,
                Err(Error::InvalidOption {
                    field: "applied_retention",
                    ..
                })
            ),
            "{bad:?}: {r:?}"
        );
        assert!(!f.path.exists());
    }
}

/// A format-1 file (written by leaseq before format 2, left open by a process that exited):
/// the open upgrades it in one transaction, then recovers its lease; markers of jobs' own
/// ids are dropped; the caller keys of live jobs are protected from pruning.
#[test]
fn a_format_1_file_is_upgraded_at_open() {
    let f = Fixture::new();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/format1-crashed.leaseq"
    );
    std::fs::copy(fixture, &f.path).unwrap();
    let q = f
        .builder()
        .applied_retention(Some(ms(1)))
        .open(&f.path)
        .unwrap();
    let r = q.recovery();
    assert_eq!(r.upgraded_from, Some(1), "{r:?}");
    assert_eq!(r.leases_returned, 1, "{r:?}");
    assert_consistent(&q);
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.dead, s.ready, s.scheduled, s.applied),
        (3, 1, 1, 1, 1),
        "{s:?}"
    );
    assert!(q.is_applied("K").unwrap());
    // L (dead job 3) and M (delayed job 6) are carried: a marker for them is never pruned.
    f.clock.advance(Duration::from_secs(61));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt()), (JobId(5), 2));
    l.ack().unwrap();
    drop(l); // a lease holds the file open
    let m = q.dequeue().unwrap().unwrap();
    assert_eq!(m.id(), JobId(6));
    let again = q.enqueue(b"M again", keyed("M")).unwrap().id();
    assert_eq!(m.ack_with(|_| Ok(())).unwrap(), Applied::Now);
    // The new marker took expired K with it (markers go as new ones come).
    assert!(!q.is_applied("K").unwrap());
    f.clock.advance(ms(10));
    assert_eq!(
        q.prune().unwrap().applied,
        0,
        "M is carried by the job enqueued again"
    );
    assert!(q.is_applied("M").unwrap());
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), again);
    assert_eq!(l.ack_with(|_| Ok(())).unwrap(), Applied::AlreadyApplied);
    drop((l, m));
    drop(q);
    // Reopened: current, nothing to upgrade.
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None);
    assert_eq!(
        q.job(JobId(3)).unwrap().unwrap().last_error.as_deref(),
        Some("broken")
    );
    assert_consistent(&q);
}

/// A file of a newer format than this build is refused byte-identical.
#[test]
fn a_newer_format_is_refused_unchanged() {
    let f = Fixture::new();
    let q = f.open();
    {
        let tx = q.database().begin_write().unwrap();
        tx.open_table(redb::TableDefinition::<&str, u64>::new("leaseq_meta"))
            .unwrap()
            .insert("format_version", leaseq::FORMAT_VERSION + 1)
            .unwrap();
        tx.commit().unwrap();
    }
    drop(q);
    let bytes = std::fs::read(&f.path).unwrap();
    let r = f.builder().open(&f.path);
    assert!(
        matches!(r, Err(Error::UnsupportedVersion { found, .. }) if found == leaseq::FORMAT_VERSION + 1),
        "{r:?}"
    );
    assert_eq!(std::fs::read(&f.path).unwrap(), bytes);
    let _ = T0_MS;
}

const APPLIED: TableDefinition<&[u8], u64> = TableDefinition::new("leaseq_applied");

const APPLIED_BY_TIME: TableDefinition<(u64, &[u8]), ()> =
    TableDefinition::new("leaseq_applied_by_time");

const IDEM_JOBS: TableDefinition<(&[u8], u64), ()> = TableDefinition::new("leaseq_idem_jobs");

fn retained_for(f: &Fixture, retention: Duration) -> Queue {
    f.builder()
        .applied_retention(Some(retention))
        .open(&f.path)
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// Applied-marker retention
// ---------------------------------------------------------------------------------------

/// `Builder::applied_retention` says "whole milliseconds, from 1 ms to DELAY_MAX, checked at
/// open". A retention below 1 ms (500 µs) is accepted and becomes 0 ms: the marker an
/// `ack_with` writes is pruned by the same `ack_with` (its own prune runs after it), so the
/// effect is applied again by the very next duplicate, with no time passing at all.
#[test]

fn sub_millisecond_retention_is_refused_or_keeps_markers() {
    let f = Fixture::new();
    match f
        .builder()
        .applied_retention(Some(Duration::from_micros(500)))
        .open(&f.path)
    {
        Err(Error::InvalidOption {
            field: "applied_retention",
            ..
        }) => {}
        Err(e) => panic!("{e}"),
        Ok(q) => {
            q.enqueue(b"A", keyed("K")).unwrap();
            let a = q.dequeue().unwrap().unwrap();
            assert_eq!(a.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
            assert!(q.is_applied("K").unwrap(), "marker gone in its own commit");
            // The producer retries at the same instant.
            q.enqueue(b"A2", keyed("K")).unwrap();
            let a2 = q.dequeue().unwrap().unwrap();
            assert_eq!(
                a2.ack_with(|tx| bump(tx, 1)).unwrap(),
                Applied::AlreadyApplied,
                "the duplicate, at the same instant, ran the effect again"
            );
        }
    }
}

/// Every path that creates or deletes jobs keeps `leaseq_idem_jobs` right, so a marker is
/// never pruned while a live job carries its key: `enqueue_batch` with duplicate dedup keys
/// (the dropped duplicate carries nothing), `remove`, `purge` of each state, `requeue_dead_all`,
/// a batch ack of jobs sharing a key, a reopen that returns a lease, and a quarantine.
#[test]
fn markers_follow_their_carriers_through_every_path() {
    let f = Fixture::new();
    let q = retained_for(&f, ms(10));
    let apply = |k: &str| {
        q.enqueue(b"first", keyed(k)).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.ack_with(|tx| bump(tx, 0)).unwrap(), Applied::Now, "{k}");
    };
    for k in ["B", "R", "P", "S", "D", "Q", "L", "X"] {
        apply(k);
    }
    // B: a batch whose second record is a dedup duplicate carrying another key.
    let out = q
        .enqueue_batch([
            (&b"b1"[..], keyed("B").dedup_key("d")),
            (&b"b2"[..], keyed("X").dedup_key("d")),
        ])
        .unwrap();
    let b1 = out[0].id();
    assert_eq!(out[1], Enqueued::Duplicate(b1));
    // R: ready, removed later; P: ready, purged later; S: scheduled; D: dead, requeued;
    // Q: quarantined; L: leased when the process "crashes".
    let r = q.enqueue(b"r", keyed("R")).unwrap().id();
    let p = q.enqueue(b"p", keyed("P")).unwrap().id();
    let s = q.enqueue(b"s", keyed("S").delay(secs(3600))).unwrap().id();
    let d = q.enqueue(b"d", keyed("D").max_attempts(1)).unwrap().id();
    let qq = q.enqueue(b"q", keyed("Q")).unwrap().id();
    let l = q.enqueue(b"l", keyed("L")).unwrap().id();
    // Take them all, give back all but L and D (D dies at its one attempt).
    let taken = q.dequeue_batch(7).unwrap();
    assert_eq!(taken.len(), 6, "all but the scheduled one");
    for lease in &taken {
        if lease.id() == d {
            lease.nack("die").unwrap();
        } else if lease.id() != l {
            lease.nack("back").unwrap();
        }
    }
    drop(taken);
    flip_record_byte(&q, qq, 3, 0x5A);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 1, "only X is uncarried");
    assert!(!q.is_applied("X").unwrap());
    drop(q);
    // Reopen: L's lease comes back; Q's damaged row gets quarantined by a dequeue.
    let q = retained_for(&f, ms(10));
    assert_eq!(q.recovery().leases_returned, 1);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 0, "every key still carried");
    assert_eq!(q.requeue_dead_all().unwrap(), 1);
    let all: Vec<_> = std::iter::from_fn(|| q.dequeue().unwrap()).collect();
    assert_eq!(q.stats().unwrap().quarantined, 1);
    let ids: BTreeSet<JobId> = all.iter().map(|l| l.id()).collect();
    assert!(ids.contains(&d) && ids.contains(&l) && !ids.contains(&qq));
    for lease in &all {
        lease.nack_after("back", Duration::ZERO).unwrap();
    }
    drop(all);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 0, "still carried after requeue");
    for k in ["B", "R", "P", "S", "D", "Q", "L"] {
        assert!(q.is_applied(k).unwrap(), "{k}");
    }
    // Now end each carrier; the marker goes only once its last carrier is gone.
    q.remove(r).unwrap();
    assert_eq!(q.purge(JobState::Scheduled).unwrap(), 1);
    let _ = s;
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 2, "R and S");
    q.remove(qq).unwrap();
    assert_eq!(q.purge(JobState::Ready).unwrap(), 3, "B, P, L");
    assert_eq!(
        q.job(d).unwrap().unwrap().state,
        JobState::Dead,
        "its one attempt"
    );
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 4, "B, P, L, Q");
    assert!(q.is_applied("D").unwrap(), "carried by dead D");
    assert_eq!(q.purge(JobState::Dead).unwrap(), 1);
    let _ = (p, b1);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 1);
    assert_eq!(q.stats().unwrap().applied, 0);
    assert_consistent(&q);
}

/// A batch ack of two leases sharing a key, the first closure failing: the second applies
/// the effect (marker written), the first job is given back and, delivered again, finds the
/// marker. A replay after a failing closure never leaves a marker without its time index.
#[test]
fn failing_closure_in_a_batch_sharing_a_key() {
    let f = Fixture::new();
    let q = retained_for(&f, ms(5));
    q.enqueue(b"a", keyed("K")).unwrap();
    q.enqueue(b"b", keyed("K")).unwrap();
    for i in 0..20 {
        q.enqueue(b"old", keyed(&format!("old{i}"))).unwrap();
    }
    let olds = q.dequeue_batch(22).unwrap();
    let (ab, olds) = olds.split_at(2);
    all_ok(q.ack_with_batch(olds, |_, _| Ok(())).unwrap());
    f.clock.advance(ms(6));
    let out = q
        .ack_with_batch(ab, |tx, l| {
            if l.payload() == b"a" {
                Err("a fails".into())
            } else {
                bump(tx, 1)
            }
        })
        .unwrap();
    assert!(matches!(out[0], Err(Error::Effect(_))), "{out:?}");
    assert_eq!(out[1].as_ref().unwrap(), &Applied::Now);
    assert_eq!(
        q.stats().unwrap().applied,
        1 + 20 - 2,
        "one new marker, two pruned"
    );
    assert_consistent(&q);
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!(again.payload(), b"a");
    assert_eq!(
        again.ack_with(|tx| bump(tx, 1)).unwrap(),
        Applied::AlreadyApplied
    );
    assert_eq!(common::effects(&q).get(&1), Some(&1));
    assert_consistent(&q);
}

/// Threads share group commits: producers enqueue keyed jobs (keys reused across threads),
/// consumers `ack_with` them (some closures failing, so groups abort and replay), a pruner
/// prunes and the clock moves, retention 3 ms. Afterwards the markers, their time index and
/// the carrier index agree (`check`), and once the horizon passes every marker goes.
#[test]
fn concurrent_ack_with_and_prune_keep_the_time_index_right() {
    let f = Fixture::new();
    let q = f
        .builder()
        .applied_retention(Some(ms(3)))
        .max_attempts(100)
        .durability(leaseq::Durability::None)
        .open(&f.path)
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let q = q.clone();
            s.spawn(move || {
                for i in 0..300u64 {
                    let k = format!("k{}", (i * 7 + t) % 40);
                    q.enqueue(b"x", keyed(&k)).unwrap();
                }
            });
        }
        for t in 0..3u64 {
            let q = q.clone();
            let stop = stop.clone();
            s.spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || !q.is_empty().unwrap() {
                    match q.dequeue().unwrap() {
                        Some(l) => {
                            n += 1;
                            let fail = (n + t).is_multiple_of(5);
                            let _ = l.ack_with(|tx| {
                                if fail {
                                    Err("flaky".into())
                                } else {
                                    bump(tx, l.id().0)
                                }
                            });
                        }
                        None => std::thread::yield_now(),
                    }
                }
            });
        }
        {
            let q = q.clone();
            let clock = f.clock.clone();
            let stop = stop.clone();
            s.spawn(move || {
                for _ in 0..200 {
                    clock.advance(ms(1));
                    q.prune().unwrap();
                    std::thread::sleep(ms(1));
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
    f.clock.advance(ms(4));
    q.prune().unwrap();
    assert_eq!(q.stats().unwrap().applied, 0);
    assert_consistent(&q);
}

/// `Queue::prune` is bounded per commit and finishes: 25,000 expired markers of which 12,000
/// are carried by live jobs (their retention restarts); one prune removes the 13,000 others.
#[test]
fn prune_finishes_with_many_carried_markers() {
    let f = Fixture::new();
    let q = f
        .builder()
        .applied_retention(Some(ms(10)))
        .durability(leaseq::Durability::None)
        .open(&f.path)
        .unwrap();
    for chunk in 0..5 {
        q.enqueue_batch((0..5_000).map(|i| (&b"x"[..], keyed(&format!("k{chunk}-{i}")))))
            .unwrap();
        let batch = q.dequeue_batch(5_000).unwrap();
        all_ok(q.ack_with_batch(&batch, |_, _| Ok(())).unwrap());
    }
    // Carriers of the keys of chunks 0, 1 and the first 2,000 of chunk 2.
    for chunk in 0..3 {
        let n = if chunk == 2 { 2_000 } else { 5_000 };
        q.enqueue_batch((0..n).map(|i| (&b"y"[..], keyed(&format!("k{chunk}-{i}")))))
            .unwrap();
    }
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 13_000);
    assert_eq!(q.stats().unwrap().applied, 12_000);
    assert_eq!(q.prune().unwrap().applied, 0);
    assert_consistent(&q);
}

/// `check` sees damage to the new tables: a time-index entry without its marker, a marker
/// missing from the time index, a carrier entry naming a job that does not carry the key, a
/// live keyed job missing from the carrier index.
#[test]
fn check_reports_damage_to_the_retention_tables() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"a", keyed("A")).unwrap();
    q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
    let live = q.enqueue(b"b", keyed("B")).unwrap().id();
    let other = q.enqueue(b"c", EnqueueOptions::default()).unwrap().id();
    assert_consistent(&q);
    let plant = |what: &dyn Fn(&redb::WriteTransaction)| {
        let tx = q.database().begin_write().unwrap();
        what(&tx);
        tx.commit().unwrap();
        let v = q.check().unwrap();
        assert!(!v.is_empty(), "damage not reported");
        v
    };
    // A time-index entry without a marker.
    plant(&|tx| {
        tx.open_table(APPLIED_BY_TIME)
            .unwrap()
            .insert((5, &b"\x01Z"[..]), ())
            .unwrap();
    });
    plant(&|tx| {
        tx.open_table(APPLIED_BY_TIME)
            .unwrap()
            .remove((5, &b"\x01Z"[..]))
            .unwrap();
        let mut b = tx.open_table(APPLIED_BY_TIME).unwrap();
        let first = b
            .first()
            .unwrap()
            .map(|(k, _)| (k.value().0, k.value().1.to_vec()));
        let (at, k) = first.unwrap();
        b.remove((at, k.as_slice())).unwrap();
    });
    // Repair: the marker's time entry back.
    {
        let tx = q.database().begin_write().unwrap();
        let at = tx
            .open_table(APPLIED)
            .unwrap()
            .get(&b"\x01A"[..])
            .unwrap()
            .unwrap()
            .value();
        tx.open_table(APPLIED_BY_TIME)
            .unwrap()
            .insert((at, &b"\x01A"[..]), ())
            .unwrap();
        tx.commit().unwrap();
    }
    assert_consistent(&q);
    let v = plant(&|tx| {
        let mut idem = tx.open_table(IDEM_JOBS).unwrap();
        idem.remove((&b"\x01B"[..], live.0)).unwrap();
        idem.insert((&b"\x01B"[..], other.0), ()).unwrap();
    });
    assert!(v.iter().any(|x| x.job_id == Some(live)), "{v:?}");
    assert!(v.iter().any(|x| x.job_id == Some(other)), "{v:?}");
}

const LEASE_MS: u64 = 1_000;

const MAX_ATTEMPTS: u32 = 3;

const RETENTION_MS: u64 = 5_000;

/// Markers and dedup windows pruned per new marker / new keyed job (`store::PRUNE_PER_ACK_MAX`).
const PRUNE_PER_WRITE: usize = 2;

const KEYS: u8 = 6;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        priority: i32,
        delay_ms: u64,
        dedup: Option<(u8, Option<u64>)>,
        idem: Option<u8>,
    },
    Dequeue,
    Ack(usize),
    AckWith(usize),
    Nack(usize),
    /// Cancel the job at this index of the model's jobs (any state).
    Cancel(usize),
    Clock(u64),
    Prune,
    Compact,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            0..3i32,
            prop_oneof![Just(0u64), Just(0), Just(500), Just(2_000)],
            prop::option::of((0..KEYS, prop::option::of(prop_oneof![Just(1_000u64), Just(3_000)]))),
            prop::option::of(0..KEYS),
        )
            .prop_map(|(priority, delay_ms, dedup, idem)| Op::Enqueue {
                priority,
                delay_ms,
                dedup,
                idem
            }),
        4 => Just(Op::Dequeue),
        2 => any::<usize>().prop_map(Op::Ack),
        3 => any::<usize>().prop_map(Op::AckWith),
        1 => any::<usize>().prop_map(Op::Nack),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => prop_oneof![Just(1u64), Just(300), Just(1_001), Just(6_000)].prop_map(Op::Clock),
        1 => Just(Op::Prune),
        1 => Just(Op::Compact),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum St {
    Ready(u64),
    Scheduled(u64),
    Leased(u64),
    Dead,
}

#[derive(Debug, Clone)]
struct MJob {
    priority: i32,
    state: St,
    /// Its readiness sequence number when last leased (a lease returned at reopen keeps it).
    leased_from_seq: u64,
    attempts: u32,
    idem: Option<String>,
    dedup: Option<String>,
    windowed: bool,
}

/// What the public contract says the queue holds.
#[derive(Debug, Default)]
struct Model {
    now: u64,
    seq: u64,
    jobs: BTreeMap<u64, MJob>,
    /// Dedup key -> (holder, window end).
    dedup: BTreeMap<String, (u64, Option<u64>)>,
    /// Idempotency key -> kept since.
    applied: BTreeMap<String, u64>,
}

impl Model {
    fn make_ready(&mut self, id: u64) {
        self.seq += 1;
        self.jobs.get_mut(&id).unwrap().state = St::Ready(self.seq);
    }

    /// Who holds `k` now; a window that ended releases it here (as the lookup does).
    fn holder(&mut self, k: &str) -> Option<u64> {
        let &(h, end) = self.dedup.get(k)?;
        if end.is_some_and(|e| e <= self.now) {
            self.dedup.remove(k);
            return None;
        }
        Some(h)
    }

    /// The earliest ended windows, at most `max`, released.
    fn prune_windows(&mut self, max: usize) -> usize {
        let mut ended: Vec<(u64, String)> = self
            .dedup
            .iter()
            .filter_map(|(k, &(_, e))| e.filter(|&e| e <= self.now).map(|e| (e, k.clone())))
            .collect();
        ended.sort();
        ended.truncate(max);
        for (_, k) in &ended {
            self.dedup.remove(k);
        }
        ended.len()
    }

    /// Markers past the retention, oldest first, at most `max`: carried ones restart.
    fn prune_markers(&mut self, max: usize) -> usize {
        let Some(cutoff) = self.now.checked_sub(RETENTION_MS) else {
            return 0;
        };
        let mut old: Vec<(u64, String)> = self
            .applied
            .iter()
            .filter(|&(_, &t)| t <= cutoff)
            .map(|(k, &t)| (t, k.clone()))
            .collect();
        old.sort();
        old.truncate(max);
        let mut removed = 0;
        for (_, k) in old {
            let carried = self.jobs.values().any(|j| j.idem.as_deref() == Some(&k));
            if carried {
                self.applied.insert(k, self.now);
            } else {
                self.applied.remove(&k);
                removed += 1;
            }
        }
        removed
    }

    fn enqueue(&mut self, id_next: u64, op: &Op) -> Option<Enqueued> {
        let Op::Enqueue {
            priority,
            delay_ms,
            dedup,
            idem,
        } = op
        else {
            unreachable!()
        };
        if let Some((k, _)) = dedup {
            let k = format!("d{k}");
            if let Some(h) = self.holder(&k) {
                let windowed = self.dedup[&k].1.is_some();
                let dead = !windowed && self.jobs.get(&h).is_some_and(|j| j.state == St::Dead);
                return Some(if dead {
                    Enqueued::DuplicateDead(JobId(h))
                } else {
                    Enqueued::Duplicate(JobId(h))
                });
            }
            self.prune_windows(PRUNE_PER_WRITE);
            let end = dedup.unwrap().1.map(|w| self.now + w);
            self.dedup.insert(k, (id_next, end));
        }
        self.jobs.insert(
            id_next,
            MJob {
                priority: *priority,
                state: St::Scheduled(self.now + delay_ms),
                leased_from_seq: 0,
                attempts: 0,
                idem: idem.map(|k| format!("i{k}")),
                dedup: dedup.map(|(k, _)| format!("d{k}")),
                windowed: dedup.is_some_and(|(_, w)| w.is_some()),
            },
        );
        if *delay_ms == 0 {
            self.make_ready(id_next);
        }
        None
    }

    /// Ends a delivery without an ack: ready at once (the retry policy is immediate) or dead.
    fn end_attempt(&mut self, id: u64) {
        if self.jobs[&id].attempts >= MAX_ATTEMPTS {
            self.jobs.get_mut(&id).unwrap().state = St::Dead;
        } else {
            self.make_ready(id);
        }
    }

    fn delete(&mut self, id: u64) {
        let j = self.jobs.remove(&id).unwrap();
        if let Some(k) = &j.dedup
            && self.holder(k) == Some(id)
            && !j.windowed
        {
            self.dedup.remove(k);
        }
    }

    /// Sweeps, then leases the first ready job.
    fn dequeue(&mut self) -> Option<(u64, u32)> {
        let now = self.now;
        let mut due: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                St::Scheduled(t) if t <= now => Some((t, id)),
                _ => None,
            })
            .collect();
        due.sort();
        for (_, id) in due {
            self.make_ready(id);
        }
        let mut expired: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                St::Leased(d) if d <= now => Some((d, id)),
                _ => None,
            })
            .collect();
        expired.sort();
        for (_, id) in expired {
            self.end_attempt(id);
        }
        let (&id, _) = self
            .jobs
            .iter()
            .filter_map(|(id, j)| match j.state {
                St::Ready(s) => Some((id, (j.priority, s))),
                _ => None,
            })
            .min_by_key(|(_, k)| *k)?;
        let j = self.jobs.get_mut(&id).unwrap();
        j.attempts += 1;
        if let St::Ready(s) = j.state {
            j.leased_from_seq = s;
        }
        j.state = St::Leased(now + LEASE_MS);
        Some((id, j.attempts))
    }

    fn leased(&self, id: u64) -> bool {
        matches!(
            self.jobs.get(&id),
            Some(MJob {
                state: St::Leased(_),
                ..
            })
        )
    }

    fn stats(&self) -> (u64, u64, u64, u64, u64, u64, u64) {
        let mut s = (self.jobs.len() as u64, 0, 0, 0, 0, 0, 0);
        for j in self.jobs.values() {
            match j.state {
                St::Scheduled(_) => s.1 += 1,
                St::Ready(_) => s.2 += 1,
                St::Leased(_) => s.3 += 1,
                St::Dead => s.4 += 1,
            }
        }
        s.5 = self.applied.len() as u64;
        s.6 = self.dedup.len() as u64;
        s
    }
}

fn got_stats(s: Stats) -> (u64, u64, u64, u64, u64, u64, u64) {
    (
        s.total,
        s.scheduled,
        s.ready,
        s.leased,
        s.dead,
        s.applied,
        s.dedup_keys,
    )
}

fn open(f: &Fixture) -> Queue {
    f.builder()
        .lease(Duration::from_millis(LEASE_MS))
        .max_attempts(MAX_ATTEMPTS)
        .retry(RetryPolicy::immediate())
        .applied_retention(Some(Duration::from_millis(RETENTION_MS)))
        .open(&f.path)
        .unwrap()
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let f = Fixture::new();
    let mut q = open(&f);
    let mut m = Model {
        now: T0_MS,
        ..Model::default()
    };
    let mut held: Vec<Lease> = Vec::new();
    let mut next_id = 1u64;
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} {op:?}");
        match op {
            Op::Enqueue {
                priority,
                delay_ms,
                dedup,
                idem,
            } => {
                let mut o = EnqueueOptions::default().priority(*priority);
                if *delay_ms > 0 {
                    o = o.delay(Duration::from_millis(*delay_ms));
                }
                if let Some((k, w)) = dedup {
                    o = o.dedup_key(format!("d{k}"));
                    if let Some(w) = w {
                        o = o.dedup_window(Duration::from_millis(*w));
                    }
                }
                if let Some(k) = idem {
                    o = o.idempotency_key(format!("i{k}"));
                }
                let got = q.enqueue(b"x", o).unwrap();
                match (m.enqueue(next_id, op), got) {
                    (None, Enqueued::New(JobId(id))) => {
                        prop_assert!(id >= next_id, "{at}: id {id}");
                        if id != next_id {
                            // Ids skip after a reopen (a block was reserved): rename.
                            let j = m.jobs.remove(&next_id).unwrap();
                            m.jobs.insert(id, j);
                            for v in m.dedup.values_mut() {
                                if v.0 == next_id {
                                    v.0 = id;
                                }
                            }
                        }
                        next_id = id + 1;
                    }
                    (Some(want), got) => prop_assert_eq!(want, got, "{}", at),
                    (want, got) => prop_assert!(false, "{at}: want {want:?}, got {got:?}"),
                }
            }
            Op::Dequeue => {
                let want = m.dequeue();
                let got = q.dequeue().unwrap();
                prop_assert_eq!(
                    want,
                    got.as_ref().map(|l| (l.id().0, l.attempt())),
                    "{}",
                    at
                );
                held.extend(got);
            }
            Op::Ack(i) | Op::AckWith(i) | Op::Nack(i) => {
                if held.is_empty() {
                    continue;
                }
                let l = held.swap_remove(i % held.len());
                let id = l.id().0;
                // Held leases can be stale (expired and reclaimed, or recovered by a reopen).
                let current = m.leased(id) && {
                    let info = q.job(l.id()).unwrap();
                    info.and_then(|i| i.lease_token) == Some(l.token())
                };
                match op {
                    Op::Ack(_) => {
                        let r = l.ack();
                        prop_assert_eq!(r.is_ok(), current, "{}: {:?}", at, r);
                        if current {
                            m.delete(id);
                        }
                    }
                    Op::AckWith(_) => {
                        let r = l.ack_with(|_| Ok(()));
                        prop_assert_eq!(r.is_ok(), current, "{}: {:?}", at, r);
                        if current {
                            let idem = m.jobs[&id].idem.clone();
                            let want = match &idem {
                                Some(k) if m.applied.contains_key(k) => Applied::AlreadyApplied,
                                Some(k) => {
                                    m.applied.insert(k.clone(), m.now);
                                    Applied::Now
                                }
                                None => Applied::Now,
                            };
                            prop_assert_eq!(r.unwrap(), want, "{}", at);
                            m.delete(id);
                            if want == Applied::Now && idem.is_some() {
                                m.prune_markers(PRUNE_PER_WRITE);
                            }
                        }
                    }
                    _ => {
                        let r = l.nack("again");
                        prop_assert_eq!(r.is_ok(), current, "{}: {:?}", at, r);
                        if current {
                            m.end_attempt(id);
                        }
                    }
                }
            }
            Op::Cancel(i) => {
                if m.jobs.is_empty() {
                    continue;
                }
                // Waiting and dead jobs only: a cancelled lease's row (and the idempotency
                // key it carries) stays until a later prune, which this model does not time;
                // tests/core/controls.rs covers it.
                let waiting: Vec<u64> = m
                    .jobs
                    .iter()
                    .filter(|(_, j)| !matches!(j.state, St::Leased(_)))
                    .map(|(&id, _)| id)
                    .collect();
                if waiting.is_empty() {
                    continue;
                }
                let id = waiting[i % waiting.len()];
                let want = match m.jobs[&id].state {
                    St::Ready(_) => JobState::Ready,
                    St::Scheduled(_) => JobState::Scheduled,
                    St::Leased(_) => unreachable!("leased jobs are not picked"),
                    St::Dead => JobState::Dead,
                };
                prop_assert_eq!(
                    q.cancel(JobId(id), "stop").unwrap().was(),
                    Some(want),
                    "{}",
                    at
                );
                // Gone for the model: its key free (unless a window holds it), its
                // idempotency key no longer carried.
                m.delete(id);
            }
            Op::Clock(ms) => {
                f.clock.advance(Duration::from_millis(*ms));
                m.now += ms;
            }
            Op::Prune => {
                let p = q.prune().unwrap();
                let markers = m.prune_markers(usize::MAX);
                let windows = m.prune_windows(usize::MAX);
                prop_assert_eq!(
                    (p.applied, p.dedup_windows),
                    (markers as u64, windows as u64),
                    "{}",
                    at
                );
            }
            Op::Compact => {
                held.clear(); // every lease holds the queue: compact needs it alone
                q.compact().unwrap();
            }
            Op::Reopen => {
                held.clear();
                drop(q);
                q = open(&f);
                let mut leased: Vec<(u64, u64)> = m
                    .jobs
                    .iter()
                    .filter_map(|(&id, j)| match j.state {
                        St::Leased(d) => Some((d, id)),
                        _ => None,
                    })
                    .collect();
                leased.sort();
                for (_, id) in leased {
                    m.end_attempt(id);
                    // Returned at open: back to the place it had in the ready order.
                    let j = m.jobs.get_mut(&id).unwrap();
                    if matches!(j.state, St::Ready(_)) {
                        j.state = St::Ready(j.leased_from_seq);
                    }
                }
            }
        }
        prop_assert!(
            q.check().unwrap().is_empty(),
            "{at}: {:?}",
            q.check().unwrap()
        );
        prop_assert_eq!(got_stats(q.stats().unwrap()), m.stats(), "{}", at);
        for k in 0..KEYS {
            let k = format!("i{k}");
            prop_assert_eq!(
                q.is_applied(&k).unwrap(),
                m.applied.contains_key(&k),
                "{}: marker {}",
                at,
                k
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn long_run_rules_hold_against_the_model(ops in prop::collection::vec(op(), 1..100)) {
        run(&ops)?;
    }
}
