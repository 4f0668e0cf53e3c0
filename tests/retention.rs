//! Applied-ids markers over a long run (issue 9, C26): no marker for a job's own id, caller
//! keys kept for a retention horizon and never pruned while a live job carries them; the
//! upgrade of a format-1 file.

mod common;

use std::time::Duration;

use common::{Fixture, T0_MS, all_ok, assert_consistent, bump};
use leaseq::{Applied, Durability, EnqueueOptions, Error, JobId, JobState, Queue};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn keyed(k: &str) -> EnqueueOptions {
    EnqueueOptions::default().idempotency_key(k)
}

/// C26, first part: 100,000 cycles of enqueue (default key), dequeue, `ack_with` leave the
/// applied-ids table empty: a job's own id guards nothing once the job is gone.
#[test]
fn c26_default_key_effects_keep_no_markers() {
    let f = Fixture::new();
    let q = f
        .builder()
        .durability(Durability::None)
        .open(&f.path)
        .unwrap();
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
