//! Adversarial tests of periodic jobs, rate limits, execution timeouts and progress. Goal:
//! break their documented promises the way a hostile but realistic user would (clock jumps,
//! more schedules than one sweep fires, reopens, racing consumers and watchdogs, progress from
//! many threads). Method: the public API with a manual clock (real time where the pool's
//! timing is the subject), and the state checked after each scenario: stats, job states and
//! attempts, schedule counters, and `check()`.
//!
//! Four of them found bugs (fixed with them): missed due times past one sweep at open, the
//! sweep firing before reclaiming expired leases, and a used-up rate window still sweeping.

use crate::common::{Fixture, LEASE, T0_MS, assert_consistent, enqueue_n, ms, plain, secs};
use leaseq::redb::{ReadableDatabase, TableDefinition};
use leaseq::{
    EnqueueOptions, Error, History, JobId, JobState, Missed, Overlap, Queue, RateLimit, Schedule,
    ScheduleInfo, WorkerPool,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const MIN: u64 = 60_000;

fn every(d: Duration, payload: &[u8]) -> Schedule {
    Schedule::every(d).payload(payload.to_vec())
}

fn info(q: &Queue, name: &str) -> ScheduleInfo {
    q.schedule(name).unwrap().expect("the schedule")
}

/// Dequeues and acks everything available now; the payloads.
fn drain(q: &Queue) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        out.push(l.payload().to_vec());
        l.ack().unwrap();
    }
    out
}

/// A queue on a temp file with the wall clock (the pool's timeouts are real time).
fn wall_queue(lease: Duration) -> (tempfile::TempDir, Queue) {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::builder()
        .lease(lease)
        .retry(leaseq::RetryPolicy::immediate())
        .open(dir.path().join("q.leaseq"))
        .unwrap();
    (dir, q)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(ms(2));
    }
}

// ---------------------------------------------------------------------------------------
// Periodic jobs
// ---------------------------------------------------------------------------------------

/// The clock steps back an hour after a due time fired, then forward again: nothing fires
/// while it is back (the next due time is ahead of the clock), the stored due time is not
/// moved, and when the clock comes back to it, it fires exactly once.
#[test]
fn schedule_clock_stepping_back_neither_refires_nor_loses_a_due_time() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("tick", &every(secs(60), b"tick"))
        .unwrap();
    f.clock.advance(secs(60));
    assert_eq!(drain(&q), vec![b"tick".to_vec()]);
    let before = info(&q, "tick");
    assert_eq!(before.next_due_ms, Some(T0_MS + 2 * MIN));
    // An NTP correction an hour back.
    f.clock.set_ms(T0_MS - 3_600_000);
    for _ in 0..5 {
        assert!(q.dequeue().unwrap().is_none(), "nothing is due back then");
        f.clock.advance(secs(60));
    }
    let during = info(&q, "tick");
    assert_eq!(
        (during.fired, during.skipped, during.next_due_ms),
        (1, 0, before.next_due_ms),
        "the step back changed nothing: {during:?}"
    );
    // Upserting the same timing while the clock is back keeps the due time.
    let up = q
        .upsert_schedule("tick", &every(secs(60), b"tick"))
        .unwrap();
    assert_eq!(up.next_due_ms, before.next_due_ms);
    f.clock.set_ms(T0_MS + 2 * MIN - 1);
    assert!(q.dequeue().unwrap().is_none(), "1 ms early");
    f.clock.set_ms(T0_MS + 2 * MIN);
    assert_eq!(drain(&q), vec![b"tick".to_vec()]);
    assert!(q.dequeue().unwrap().is_none(), "once");
    let after = info(&q, "tick");
    assert_eq!((after.fired, after.skipped), (2, 0), "{after:?}");
    assert_eq!(after.last_job.map(|(_, at)| at), Some(T0_MS + 2 * MIN));
    assert_eq!(after.next_due_ms, Some(T0_MS + 3 * MIN));
    assert_consistent(&q);
}

/// A clock that leaps ten years ahead: one instance for all the due times, the next due time
/// is the first grid point after now (on the grid, not drifted), and the reopen after another
/// leap decides by `Missed`.
#[test]
fn schedule_far_future_leap_fires_once_and_stays_on_the_grid() {
    let f = Fixture::new();
    let every_ms = 7_919; // prime, so a drifted grid shows
    {
        let q = f.open();
        q.create_schedule("p", &every(ms(every_ms), b"p")).unwrap();
        q.create_schedule("s", &every(ms(every_ms), b"s").missed(Missed::Skip))
            .unwrap();
        f.clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
        let mut got = drain(&q);
        got.sort();
        assert_eq!(
            got,
            vec![b"p".to_vec(), b"s".to_vec()],
            "one each, while open"
        );
        let now = f.clock_now();
        for name in ["p", "s"] {
            let i = info(&q, name);
            let start = T0_MS + every_ms;
            let next = i.next_due_ms.unwrap();
            assert!(next > now && next <= now + every_ms, "{i:?}");
            assert_eq!((next - start) % every_ms, 0, "off the grid: {i:?}");
            assert_eq!((i.fired, i.skipped), (1, 0), "{i:?}");
        }
        assert_consistent(&q);
    }
    f.clock.advance(Duration::from_secs(365 * 24 * 3600));
    let q = f.open();
    let r = q.recovery();
    assert_eq!((r.schedules_fired, r.schedules_skipped), (1, 1), "{r:?}");
    assert_eq!(drain(&q), vec![b"p".to_vec()]);
    assert_eq!(info(&q, "p").fired, 2);
    assert_eq!(info(&q, "s").fired, 1);
    assert_consistent(&q);
}

/// A file closed, its clock set back before its schedules' due times, and reopened: the open
/// fires nothing and the due times stay; later, forward again, each fires once.
#[test]
fn schedule_reopen_with_a_clock_set_back_fires_nothing_early() {
    let f = Fixture::new();
    {
        let q = f.open();
        q.create_schedule("a", &every(secs(60), b"a")).unwrap();
        q.create_schedule(
            "c",
            &Schedule::cron("*/5 * * * *", "UTC").payload(b"c".to_vec()),
        )
        .unwrap();
    }
    let due_a = T0_MS + MIN;
    f.clock.set_ms(T0_MS - 86_400_000);
    {
        let q = f.open();
        let r = q.recovery();
        assert_eq!((r.schedules_fired, r.schedules_skipped), (0, 0), "{r:?}");
        assert_eq!(q.stats().unwrap().total, 0);
        assert!(q.dequeue().unwrap().is_none());
        assert_eq!(info(&q, "a").next_due_ms, Some(due_a));
        assert_consistent(&q);
    }
    f.clock.set_ms(T0_MS + 10 * MIN);
    let q = f.open();
    let r = q.recovery();
    assert_eq!((r.schedules_fired, r.schedules_skipped), (2, 0), "{r:?}");
    let mut got = drain(&q);
    got.sort();
    assert_eq!(got, vec![b"a".to_vec(), b"c".to_vec()]);
    assert!(q.dequeue().unwrap().is_none());
    assert_consistent(&q);
}

/// More schedules due at once than one sweep fires (256): repeated dequeues fire every one of
/// them exactly once per due time, over two rounds, with no loss and no duplicate.
#[test]
fn schedule_more_than_a_sweep_all_fire_once_per_due_time() {
    let f = Fixture::new();
    let q = f.open();
    let n = 300usize;
    for i in 0..n {
        q.create_schedule(
            &format!("s{i:03}"),
            &every(secs(60), format!("s{i:03}").as_bytes()),
        )
        .unwrap();
    }
    for round in 1..=2u64 {
        f.clock.advance(secs(60));
        let mut seen: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        for p in drain(&q) {
            *seen.entry(p).or_default() += 1;
        }
        assert_eq!(seen.len(), n, "round {round}: every schedule fired");
        assert!(
            seen.values().all(|&c| c == 1),
            "round {round}: duplicates {seen:?}"
        );
        for s in q.schedules().unwrap() {
            assert_eq!((s.fired, s.skipped), (round, 0), "{s:?}");
            assert_eq!(s.next_due_ms, Some(T0_MS + (round + 1) * MIN), "{s:?}");
        }
        assert_eq!(q.stats().unwrap().total, 0);
    }
    assert_consistent(&q);
}

/// More than 256 schedules with `Missed::Skip` miss their due time while the file is closed.
/// The doc: missed due times are decided by the open, before the first dequeue; `Skip`
/// enqueues none. So no instance may ever appear for them.
#[test]
fn schedule_missed_skip_beyond_one_sweep_is_still_skipped() {
    let f = Fixture::new();
    let n = 300usize;
    {
        let q = f.open();
        for i in 0..n {
            q.create_schedule(
                &format!("s{i:03}"),
                &every(secs(60), b"x").missed(Missed::Skip),
            )
            .unwrap();
        }
    }
    f.clock.advance(secs(3600));
    let q = f.open();
    let r = q.recovery();
    let fired_by_dequeue = drain(&q).len();
    let fired: u64 = q.schedules().unwrap().iter().map(|s| s.fired).sum();
    assert_eq!(
        (
            r.schedules_fired,
            r.schedules_skipped,
            fired_by_dequeue,
            fired
        ),
        (0, n as u64, 0, 0),
        "{r:?}"
    );
    assert_consistent(&q);
}

/// The same with `Missed::RunOnce`: the open enqueues one instance per schedule, before the
/// first dequeue (its `Recovery` says how many).
#[test]
fn schedule_missed_run_once_beyond_one_sweep_is_all_decided_by_the_open() {
    let f = Fixture::new();
    let n = 300usize;
    {
        let q = f.open();
        for i in 0..n {
            q.create_schedule(&format!("s{i:03}"), &every(secs(60), b"x"))
                .unwrap();
        }
    }
    f.clock.advance(secs(3600));
    let q = f.open();
    let r = q.recovery();
    let ready_at_open = q.stats().unwrap().ready;
    assert_eq!(drain(&q).len(), n, "one each in the end");
    assert_eq!(
        (r.schedules_fired, ready_at_open),
        (n as u64, n as u64),
        "{r:?}"
    );
    assert_consistent(&q);
}

/// A name removed while its instance runs and created again: the new schedule starts fresh
/// (its counters and last job are its own), the old instance is just a job, and the new one
/// fires at its own due time even though the old instance still runs (Overlap::Skip only
/// looks at its own instances).
#[test]
fn schedule_removed_and_recreated_name_starts_fresh() {
    let f = Fixture::new();
    let q = f.open();
    let long = EnqueueOptions::default().lease(secs(3600));
    q.create_schedule("s", &every(secs(60), b"old").options(long.clone()))
        .unwrap();
    f.clock.advance(secs(60));
    let old = q.dequeue().unwrap().unwrap();
    assert_eq!(old.payload(), b"old");
    assert!(q.remove_schedule("s").unwrap());
    let created = q
        .create_schedule("s", &every(secs(30), b"new").options(long))
        .unwrap();
    assert_eq!(
        (created.fired, created.skipped, created.last_job),
        (0, 0, None)
    );
    assert_eq!(created.created_ms, f.clock_now());
    f.clock.advance(secs(30));
    let new = q.dequeue().unwrap().expect("the new schedule fires");
    assert_eq!(new.payload(), b"new");
    assert_ne!(new.id(), old.id());
    old.ack().unwrap();
    new.ack().unwrap();
    let i = info(&q, "s");
    assert_eq!((i.fired, i.skipped), (1, 0), "{i:?}");
    assert_eq!(i.last_job.map(|(id, _)| id), Some(new.id()));
    assert_eq!(q.schedules().unwrap().len(), 1);
    assert_consistent(&q);
}

/// Upsert flipping a schedule between an interval and a cron expression (and back, and to a
/// new start): each change of timing counts from now, exactly one due entry exists at each
/// step (`check()`), counters and last job are kept, and nothing fires twice.
#[test]
fn schedule_upsert_between_interval_and_cron_keeps_one_due_entry() {
    let f = Fixture::new();
    // T0_MS is 2023-11-14T22:13:20Z.
    let q = f.open();
    q.upsert_schedule("s", &every(secs(60), b"i")).unwrap();
    f.clock.advance(secs(60));
    assert_eq!(drain(&q), vec![b"i".to_vec()]);
    let c = q
        .upsert_schedule(
            "s",
            &Schedule::cron("0 * * * *", "UTC").payload(b"c".to_vec()),
        )
        .unwrap();
    // The next full hour after 22:14:20 is 23:00:00.
    let hour = T0_MS - 13 * MIN - 20_000 + 60 * MIN;
    assert_eq!(c.next_due_ms, Some(hour), "{c:?}");
    assert_eq!(c.fired, 1, "counters kept");
    assert_consistent(&q);
    // The same cron again keeps the due time; a different zone is a new timing.
    let same = q
        .upsert_schedule(
            "s",
            &Schedule::cron("0 * * * *", "UTC").payload(b"c".to_vec()),
        )
        .unwrap();
    assert_eq!(same.next_due_ms, Some(hour));
    let kolkata = q
        .upsert_schedule(
            "s",
            &Schedule::cron("0 * * * *", "Asia/Kolkata").payload(b"k".to_vec()),
        )
        .unwrap();
    // Kolkata is UTC+5:30: its full hours are at :30 UTC. 22:14:20 -> 22:30:00.
    assert_eq!(kolkata.next_due_ms, Some(hour - 30 * MIN), "{kolkata:?}");
    assert_consistent(&q);
    // Back to an interval with a start in the past: the first grid point not before now.
    let now = f.clock_now();
    let back = q
        .upsert_schedule("s", &every(secs(7), b"i2").starting_at_ms(now - 100_000))
        .unwrap();
    let next = back.next_due_ms.unwrap();
    assert!(next >= now && next < now + 7_000, "{back:?}");
    assert_eq!((next - (now - 100_000)) % 7_000, 0);
    assert_consistent(&q);
    f.clock.set_ms(next);
    assert_eq!(drain(&q), vec![b"i2".to_vec()]);
    f.clock.set_ms(hour + 1);
    // Only the interval is live now: the old cron times fire nothing of their own.
    assert_eq!(drain(&q), vec![b"i2".to_vec()]);
    let i = info(&q, "s");
    assert_eq!((i.fired, i.skipped), (3, 0), "{i:?}");
    assert_consistent(&q);
}

/// The last instance moved around by the user while the schedule runs: snoozed (scheduled,
/// so pending: later due times skip even under Overlap::Enqueue), failed and requeued
/// (pending again), removed (ended: fires), retried after completion (it is no longer the
/// last instance once a new one fired). The instance count always equals `fired`.
#[test]
fn schedule_instances_moved_by_the_user_keep_one_pending() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(1000)).unwrap();
    q.create_schedule(
        "s",
        &every(secs(60), b"s")
            .overlap(Overlap::Enqueue)
            .options(EnqueueOptions::default().max_attempts(1).lease(secs(3600))),
    )
    .unwrap();
    let mut ids = BTreeSet::new();
    // 1: snoozed for 10 minutes: scheduled, pending.
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().unwrap();
    ids.insert(l.id());
    l.snooze(secs(600)).unwrap();
    for _ in 0..3 {
        f.clock.advance(secs(60));
        assert!(q.dequeue().unwrap().is_none(), "the snoozed one is pending");
    }
    assert_eq!(info(&q, "s").fired, 1);
    assert_eq!(info(&q, "s").skipped, 3);
    // It comes due and runs (the due time swept just before its promotion skips too); it
    // fails on its only attempt: dead, then requeued by hand.
    f.clock.advance(secs(420));
    let l = q.dequeue().unwrap().unwrap();
    assert!(ids.contains(&l.id()), "the snoozed instance, no new one");
    l.fail("broken").unwrap();
    let dead = l.id();
    q.requeue_dead(dead).unwrap();
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), dead, "requeued, pending: the due time skipped");
    l.ack().unwrap();
    // Completed: the next due time fires a new one; the user retries the completed one.
    f.clock.advance(secs(60));
    let fresh = q.dequeue().unwrap().unwrap();
    ids.insert(fresh.id());
    assert_ne!(fresh.id(), dead);
    q.retry(dead).unwrap();
    // The newest instance is running and none of the schedule's is pending: Overlap::Enqueue
    // fires one more (the retried old one is not the schedule's last).
    f.clock.advance(secs(60));
    let third = q.dequeue().unwrap().unwrap();
    let fourth = q.dequeue().unwrap().unwrap();
    let got: BTreeSet<JobId> = [third.id(), fourth.id()].into();
    assert!(got.contains(&dead), "{got:?}");
    for l in [&third, &fourth] {
        ids.insert(l.id());
    }
    // Removed while pending: the next due time fires past it.
    let last = info(&q, "s").last_job.unwrap().0;
    third.ack().unwrap();
    fourth.ack().unwrap();
    fresh.ack().unwrap();
    f.clock.advance(secs(60));
    // Fired at this dequeue; remove it and the following due time fires again.
    assert!(q.dequeue().unwrap().is_some_and(|l| {
        ids.insert(l.id());
        l.snooze(secs(1)).is_ok()
    }));
    let pending = info(&q, "s").last_job.unwrap().0;
    assert_ne!(pending, last);
    q.remove(pending).unwrap();
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().expect("fires past a removed instance");
    ids.insert(l.id());
    l.ack().unwrap();
    let i = info(&q, "s");
    assert_eq!(i.fired as usize, ids.len(), "{i:?} vs {ids:?}");
    assert_eq!(q.stats().unwrap().ready + q.stats().unwrap().leased, 0);
    assert_consistent(&q);
}

/// Overlap::Enqueue and an instance whose holder died (its lease expired, not yet swept):
/// the doc promises "whatever the choice, at most one instance is pending". The dequeue's
/// sweep at the next due time must not leave two instances ready.
#[test]
fn schedule_overlap_enqueue_with_an_expired_instance_keeps_one_pending() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule(
        "s",
        &every(secs(60), b"s")
            .overlap(Overlap::Enqueue)
            .options(EnqueueOptions::default().lease(secs(10))),
    )
    .unwrap();
    f.clock.advance(secs(60));
    let crashed = q.dequeue().unwrap().unwrap();
    let crashed_id = crashed.id();
    drop(crashed); // the worker died holding it: its lease runs out after 10 s
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().expect("an instance");
    let s = q.stats().unwrap();
    let i = info(&q, "s");
    let pending_after = s.ready;
    l.ack().unwrap();
    assert_eq!(
        pending_after,
        0,
        "two instances pending at once (took {:?}, crashed {crashed_id:?}): {s:?} {i:?}",
        l.id()
    );
    assert_eq!((i.fired, i.skipped), (1, 1), "{i:?}");
    assert_consistent(&q);
}

/// Many reopens with random clock steps and random work on the instances: the number of
/// distinct instances ever seen equals the sum of `fired` at the end, and `fired + skipped`
/// never exceeds the number of due times that passed.
#[test]
fn schedule_fired_counts_match_instances_across_many_reopens() {
    let f = Fixture::new();
    let mut seen: BTreeSet<JobId> = BTreeSet::new();
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    {
        let q = f.open();
        q.set_history(History::off().keep_jobs(10_000)).unwrap();
        q.create_schedule("a", &every(secs(60), b"a")).unwrap();
        q.create_schedule("b", &every(secs(45), b"b").missed(Missed::Skip))
            .unwrap();
        q.named("n")
            .unwrap()
            .create_schedule("c", &every(secs(90), b"c").overlap(Overlap::Enqueue))
            .unwrap();
    }
    for _cycle in 0..25 {
        let q = f.open();
        let n = q.named("n").unwrap();
        for _ in 0..(next() % 6) {
            f.clock.advance(ms(next() % 200_000));
            for h in [&q, &n] {
                if let Some(l) = h.dequeue().unwrap() {
                    seen.insert(l.id());
                    match next() % 4 {
                        0 => drop(l), // left running, returned by the next open
                        1 => {
                            l.nack("again").unwrap();
                        }
                        _ => l.ack().unwrap(),
                    }
                }
            }
        }
        assert_consistent(&q);
        f.clock.advance(ms(next() % 300_000));
    }
    let q = f.open();
    let n = q.named("n").unwrap();
    for h in [&q, &n] {
        while let Some(l) = h.dequeue().unwrap() {
            seen.insert(l.id());
            l.ack().unwrap();
        }
    }
    let elapsed = f.clock_now() - T0_MS;
    let mut fired = 0;
    for (h, name, period) in [(&q, "a", 60_000u64), (&q, "b", 45_000), (&n, "c", 90_000)] {
        let i = info(h, name);
        fired += i.fired;
        assert!(i.fired + i.skipped <= elapsed / period, "{i:?}");
        assert!(i.fired >= 1, "{i:?}");
    }
    assert_eq!(fired as usize, seen.len(), "instances seen vs fired");
    assert_consistent(&q);
}

/// A paused queue is fired by nobody while open; closed past its due times and reopened
/// while still paused, the doc's "a paused one enqueues nothing until someone dequeues"
/// meets "missed due times are decided by the open". Whatever the open does, the schedule
/// fires once in total for that stretch and nothing is delivered while paused.
#[test]
fn schedule_on_a_paused_named_queue_across_a_reopen() {
    let f = Fixture::new();
    {
        let q = f.open();
        let n = q.named("paused").unwrap();
        n.create_schedule("s", &every(secs(60), b"s")).unwrap();
        n.pause().unwrap();
        f.clock.advance(secs(600));
        assert!(n.dequeue().unwrap().is_none());
        assert_eq!(info(&n, "s").fired, 0);
    }
    f.clock.advance(secs(600));
    let q = f.open();
    let n = q.named("paused").unwrap();
    assert!(n.stats().unwrap().paused);
    assert!(n.dequeue().unwrap().is_none(), "paused: nothing delivered");
    f.clock.advance(secs(600));
    assert!(n.dequeue().unwrap().is_none());
    n.resume().unwrap();
    assert_eq!(
        drain(&n),
        vec![b"s".to_vec()],
        "one instance for the whole stretch"
    );
    let i = info(&n, "s");
    assert_eq!(i.fired, 1, "{i:?}");
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Rate limits
// ---------------------------------------------------------------------------------------

/// Clock steps within a window: forward within it keeps the count, a step back that stays at
/// or after the window's start keeps it too, and a far leap grants one window, not many.
#[test]
fn rate_clock_steps_within_and_past_a_window() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::new(2, secs(60)))).unwrap();
    enqueue_n(&q, 20, plain());
    f.clock.advance(secs(10));
    let start = f.clock_now();
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 2);
    f.clock.advance(secs(40));
    assert!(q.dequeue().unwrap().is_none());
    f.clock.set_ms(start + 5_000);
    assert!(
        q.dequeue().unwrap().is_none(),
        "back, but within the window"
    );
    f.clock.set_ms(start);
    assert!(q.dequeue().unwrap().is_none(), "at its very start");
    f.clock.set_ms(start + 59_999);
    assert!(q.dequeue().unwrap().is_none(), "its last ms");
    // Ten years later: one fresh window only.
    f.clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 2);
    assert!(q.dequeue().unwrap().is_none());
    // The first two leases expired long ago and came back: two leased, the rest ready.
    let s = q.stats().unwrap();
    assert_eq!((s.leased, s.ready), (2, 18), "{s:?}");
    assert_consistent(&q);
}

/// Redeliveries count: a job nacked and taken again uses the window, expired leases that
/// come back too; ack_with_and_next takes nothing past the window but still applies the
/// effect and acks.
#[test]
fn rate_redeliveries_and_ack_with_and_next_count_against_the_window() {
    const FX: TableDefinition<u64, u64> = TableDefinition::new("fx");
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::new(3, secs(60)))).unwrap();
    let ids = enqueue_n(&q, 2, plain());
    let a = q.dequeue().unwrap().unwrap();
    assert_eq!(a.id(), ids[0]);
    a.nack("again").unwrap();
    let b = q.dequeue().unwrap().unwrap();
    assert_eq!(b.id(), ids[1]);
    let a2 = q.dequeue().unwrap().unwrap();
    assert_eq!((a2.id(), a2.attempt()), (a.id(), 2), "redelivered");
    assert!(q.dequeue().unwrap().is_none(), "3 deliveries: used up");
    let applied = a2
        .ack_with_and_next(|tx| {
            tx.open_table(FX)?.insert(1, 1)?;
            Ok(())
        })
        .unwrap();
    assert!(applied.1.is_none(), "no next past the window");
    assert_eq!(q.job(a.id()).unwrap(), None, "acked");
    // The other lease expires within the window: it comes back only when a dequeue may
    // deliver, in the next window.
    f.clock.advance(LEASE + secs(1));
    assert!(q.dequeue().unwrap().is_none(), "still the same window");
    f.clock.advance(secs(30));
    let b2 = q.dequeue().unwrap().expect("a new window, b back");
    assert_eq!(b2.id(), b.id());
    assert_eq!(b2.attempt(), 2);
    assert!(matches!(b.ack(), Err(Error::LeaseLost { .. })));
    b2.ack().unwrap();
    let rtx = q.database().begin_read().unwrap();
    assert_eq!(
        rtx.open_table(FX).unwrap().get(1).unwrap().unwrap().value(),
        1
    );
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// Eight threads racing every kind of dequeue (single, batch, ack_and_next,
/// dequeue_timeout) on a manual clock: each window delivers exactly `max` in total, never
/// more, however they interleave.
#[test]
fn rate_threads_racing_every_dequeue_kind_never_exceed_the_window() {
    let f = Fixture::new();
    let q = f.open();
    let max = 7u32;
    q.set_rate_limit(Some(RateLimit::new(max, secs(60))))
        .unwrap();
    enqueue_n(&q, 200, plain());
    let delivered = Arc::new(AtomicU64::new(0));
    for window in 1..=3u64 {
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (q, delivered, barrier) = (q.clone(), delivered.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for _ in 0..20 {
                        let got: Vec<leaseq::Lease> = match t % 4 {
                            0 => q.dequeue().unwrap().into_iter().collect(),
                            1 => q.dequeue_batch(3).unwrap(),
                            2 => q.dequeue_timeout(ms(5)).unwrap().into_iter().collect(),
                            _ => {
                                let v = Vec::new();
                                let mut cur = q.dequeue().unwrap();
                                while let Some(l) = cur {
                                    delivered.fetch_add(1, Ordering::SeqCst);
                                    cur = l.ack_and_next().unwrap();
                                }
                                v
                            }
                        };
                        delivered.fetch_add(got.len() as u64, Ordering::SeqCst);
                        for l in got {
                            l.ack().unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            delivered.load(Ordering::SeqCst),
            window * u64::from(max),
            "window {window}"
        );
        f.clock.advance(secs(60));
    }
    assert_eq!(q.stats().unwrap().ready, 200 - 3 * u64::from(max));
    assert_consistent(&q);
}

/// The same race on the wall clock (the default SystemClock): each dequeue reads the time
/// before it joins the group commit, so a consumer whose reading is a millisecond older than
/// the one that opened the window commits after it. The limit promises at most `max` per
/// window over every thread; a window of 60 s gives each round room for `max` only.
#[test]
fn rate_threads_racing_on_the_wall_clock_never_exceed_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::builder()
        .durability(leaseq::Durability::None)
        .open(dir.path().join("q.leaseq"))
        .unwrap();
    let threads = 12;
    let mut over = Vec::new();
    for round in 0..60u64 {
        // A different limit each round: a fresh window.
        q.set_rate_limit(Some(RateLimit {
            max: 2,
            per_ms: 600_000 + round,
            window: leaseq::RateWindow::Fixed,
        }))
        .unwrap();
        enqueue_n(&q, 30, plain());
        let barrier = Arc::new(Barrier::new(threads));
        let delivered = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (q, barrier, delivered) = (q.clone(), barrier.clone(), delivered.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let until = Instant::now() + ms(15);
                    while Instant::now() < until {
                        for l in q.dequeue_batch(2).unwrap() {
                            delivered.fetch_add(1, Ordering::SeqCst);
                            l.ack().unwrap();
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let n = delivered.load(Ordering::SeqCst);
        if n > 2 {
            over.push((round, n));
        }
        // Leave nothing for the next round.
        q.set_rate_limit(None).unwrap();
        drain(&q);
    }
    assert!(
        over.is_empty(),
        "rounds delivering more than 2 in one window: {over:?}"
    );
    assert_consistent(&q);
}

/// The doc: "While the window is used up, nothing else a dequeue does happens either: due
/// schedules fire ... at the window's end." An ack_and_next made while the window is used up
/// must not fire a due schedule.
#[test]
fn rate_used_up_window_fires_no_schedule_even_through_ack_and_next() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::new(1, secs(60)))).unwrap();
    q.create_schedule("s", &every(secs(10), b"s")).unwrap();
    q.enqueue(b"job", plain()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    f.clock.advance(secs(10));
    assert!(q.dequeue().unwrap().is_none(), "used up");
    assert_eq!(info(&q, "s").fired, 0, "a plain dequeue fires nothing");
    assert!(l.ack_and_next().unwrap().is_none());
    let i = info(&q, "s");
    assert_eq!(
        (i.fired, i.skipped),
        (0, 0),
        "fired through ack_and_next: {i:?}"
    );
    assert_eq!(q.stats().unwrap().ready, 0);
}

/// Several consumers waiting in dequeue_timeout on a used-up window: at the window's end
/// exactly `max` of them get a job; the others go on waiting (and time out).
#[test]
fn rate_waiting_consumers_share_one_window() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::new(2, secs(60)))).unwrap();
    enqueue_n(&q, 10, plain());
    for l in q.dequeue_batch(2).unwrap() {
        l.ack().unwrap();
    }
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let q = q.clone();
            std::thread::spawn(move || q.dequeue_timeout(ms(1500)).unwrap())
        })
        .collect();
    std::thread::sleep(ms(150));
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "the window is used up"
    );
    f.clock.advance(secs(60));
    let got: Vec<_> = waiters
        .into_iter()
        .filter_map(|w| w.join().unwrap())
        .collect();
    assert_eq!(got.len(), 2, "two per window");
    for l in got {
        l.ack().unwrap();
    }
    assert_eq!(q.stats().unwrap().ready, 6);
    assert_consistent(&q);
}

/// The async face waits on a used-up window and wakes at its end, and a second async waiter
/// in the same window gets nothing.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_async_dequeue_timeout_waits_for_the_window() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::new(1, secs(60)))).unwrap();
    enqueue_n(&q, 3, plain());
    let aq = q.to_async();
    aq.dequeue().await.unwrap().unwrap().ack().await.unwrap();
    let first = {
        let aq = aq.clone();
        tokio::spawn(async move { aq.dequeue_timeout(secs(20)).await.unwrap() })
    };
    tokio::time::sleep(ms(150)).await;
    assert!(!first.is_finished(), "waiting for the window");
    f.clock.advance(secs(60));
    let l = first.await.unwrap().expect("woken at the window's end");
    let second = aq.dequeue_timeout(ms(300)).await.unwrap();
    assert!(second.is_none(), "one per window");
    l.ack().await.unwrap();
    assert_eq!(q.stats().unwrap().ready, 1);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Execution timeouts
// ---------------------------------------------------------------------------------------

/// Handlers that return right around the timeout, over many jobs and threads: each attempt
/// ends exactly once (acked xor ended by the timeout), so handler runs = acked + timed out,
/// every job is completed once, and its attempts equal its runs.
#[test]
fn timeout_racing_the_ack_ends_each_attempt_exactly_once() {
    let (_dir, q) = wall_queue(secs(30));
    q.set_history(History::off().keep_jobs(10_000)).unwrap();
    let n = 40;
    let ids: Vec<JobId> = enqueue_n(&q, n, EnqueueOptions::default().max_attempts(100));
    let runs: Arc<Mutex<HashMap<JobId, u32>>> = Arc::default();
    let timeout = ms(40);
    let pool = {
        let runs = runs.clone();
        WorkerPool::builder(&q)
            .threads(6)
            .job_timeout(timeout)
            .start(move |lease| {
                let k = {
                    let mut r = runs.lock().unwrap();
                    let k = r.entry(lease.id()).or_default();
                    *k += 1;
                    *k
                };
                // From 3 ms past the timeout down to well within it, by attempt.
                let d = (43u64 + lease.id().0 % 3).saturating_sub(u64::from(k) * 2);
                std::thread::sleep(ms(d));
                Ok(())
            })
            .unwrap()
    };
    wait_for("every job completed", || {
        q.stats().unwrap().completed == n as u64
    });
    let stats = pool.shutdown(secs(10)).stats;
    let runs = runs.lock().unwrap().clone();
    let total_runs: u64 = runs.values().map(|&r| u64::from(r)).sum();
    assert_eq!(stats.jobs, total_runs, "{stats:?}");
    assert_eq!(stats.acked, n as u64, "each job acked once: {stats:?}");
    assert_eq!(stats.acked + stats.timed_out, stats.jobs, "{stats:?}");
    assert_eq!((stats.errors, stats.given_back), (0, 0), "{stats:?}");
    for id in ids {
        let j = q.job(id).unwrap().unwrap();
        assert_eq!(j.state, JobState::Completed);
        assert_eq!(j.attempts, runs[&id], "{j:?}");
        assert_eq!(
            j.errors.len() as u32,
            (runs[&id] - 1).min(leaseq::ERRORS_KEPT as u32),
            "{j:?}"
        );
        assert!(
            j.errors
                .iter()
                .all(|e| e.message == "timed out after 40 ms"),
            "{:?}",
            j.errors
        );
    }
    assert_consistent(&q);
}

/// A staged handler past its timeout: its effect never commits (fenced), the job is dead
/// with OnTimeout::Fail, and the second stage of a job that finishes in time commits.
#[test]
fn timeout_fences_a_staged_handlers_effect() {
    const FX: TableDefinition<u64, u64> = TableDefinition::new("fx");
    let (_dir, q) = wall_queue(secs(30));
    let slow = q
        .enqueue(b"slow", EnqueueOptions::default().max_attempts(5))
        .unwrap()
        .id();
    let pool = WorkerPool::builder(&q)
        .threads(2)
        .job_timeout(ms(100))
        .on_timeout(leaseq::worker::OnTimeout::Fail)
        .start_staged(|lease| {
            if lease.payload() == b"slow" {
                std::thread::sleep(ms(300));
            }
            let id = lease.id().0;
            Ok(leaseq::worker::effect(move |tx| {
                tx.open_table(FX)?.insert(id, 1)?;
                Ok(())
            }))
        })
        .unwrap();
    let quick = q.enqueue(b"quick", plain()).unwrap().id();
    wait_for("slow dead and quick done", || {
        q.job(slow)
            .unwrap()
            .is_some_and(|j| j.state == JobState::Dead)
            && q.job(quick).unwrap().is_none()
    });
    // The slow handler returns its effect after the timeout: it must not commit.
    std::thread::sleep(ms(400));
    let stats = pool.shutdown(secs(5)).stats;
    let rtx = q.database().begin_read().unwrap();
    let fx = rtx.open_table(FX).unwrap();
    assert!(
        fx.get(quick.0).unwrap().is_some(),
        "the quick effect committed"
    );
    assert!(
        fx.get(slow.0).unwrap().is_none(),
        "the timed-out effect was fenced"
    );
    let j = q.job(slow).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Dead, 1));
    assert_eq!(
        (stats.timed_out, stats.acked, stats.jobs),
        (1, 1, 2),
        "{stats:?}"
    );
    assert_consistent(&q);
}

/// A shutdown whose zero grace lands right as the timeout fires: the attempt is ended once
/// (given back by the shutdown xor ended by the timeout), charged once, and the job is ready
/// again with exactly one error.
#[test]
fn timeout_and_shutdown_racing_end_the_attempt_once() {
    for delay_ms in [0u64, 45, 50, 55, 60, 100] {
        let (_dir, q) = wall_queue(secs(30));
        let id = q
            .enqueue(b"stuck", EnqueueOptions::default().max_attempts(5))
            .unwrap()
            .id();
        let running = Arc::new(AtomicBool::new(false));
        let pool = {
            let running = running.clone();
            WorkerPool::builder(&q)
                .threads(1)
                .job_timeout(ms(50))
                .start(move |_| {
                    running.store(true, Ordering::SeqCst);
                    std::thread::sleep(ms(250));
                    Ok(())
                })
                .unwrap()
        };
        wait_for("running", || running.load(Ordering::SeqCst));
        std::thread::sleep(ms(delay_ms));
        let report = pool.shutdown(Duration::ZERO);
        let s = report.stats;
        assert_eq!(
            s.given_back + s.timed_out,
            1,
            "delay {delay_ms}: {report:?}"
        );
        assert_eq!((s.acked, s.errors), (0, 0), "delay {delay_ms}: {report:?}");
        // Let the handler thread finish; its late Ok must change nothing.
        std::thread::sleep(ms(300));
        let j = q.job(id).unwrap().unwrap();
        assert_eq!(
            (j.state, j.attempts, j.errors.len()),
            (JobState::Ready, 1, 1),
            "{j:?}"
        );
        assert_eq!(q.stats().unwrap().leased, 0);
        assert_consistent(&q);
    }
}

/// A job cancelled while its handler runs, whose timeout then fires: the timeout ends
/// nothing (the cancel did), the job stays cancelled, is not delivered again, and the pool
/// does not count a timeout.
#[test]
fn timeout_after_a_cancel_changes_nothing() {
    let (_dir, q) = wall_queue(secs(30));
    q.set_history(History::off().keep_jobs(100)).unwrap();
    let id = q
        .enqueue(b"c", EnqueueOptions::default().max_attempts(5))
        .unwrap()
        .id();
    let running = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU64::new(0));
    let pool = {
        let (running, runs) = (running.clone(), runs.clone());
        WorkerPool::builder(&q)
            .threads(2)
            .job_timeout(ms(150))
            .start(move |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                running.store(true, Ordering::SeqCst);
                std::thread::sleep(ms(300));
                Ok(())
            })
            .unwrap()
    };
    wait_for("running", || running.load(Ordering::SeqCst));
    q.cancel(id, "no longer wanted").unwrap();
    std::thread::sleep(ms(500));
    let stats = pool.shutdown(secs(5)).stats;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let j = q.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Cancelled, 1), "{j:?}");
    assert_eq!(
        (stats.timed_out, stats.acked, stats.errors),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_consistent(&q);
}

/// Heartbeat::nack and Heartbeat::fail from another thread: they end the delivery once;
/// the lease's own calls are then fenced; a second end from either side is refused and
/// writes nothing; on a cancelled job they answer Cancelled.
#[test]
fn heartbeat_nack_and_fail_end_a_delivery_once() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"a", EnqueueOptions::default().max_attempts(3))
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    let hb = l.heartbeat();
    let state = std::thread::spawn({
        let hb = hb.clone();
        move || hb.nack("watchdog")
    })
    .join()
    .unwrap()
    .unwrap();
    assert_eq!(state, JobState::Ready);
    let commits = q.commit_stats().commits;
    assert!(matches!(hb.nack("again"), Err(Error::LeaseLost { .. })));
    assert!(matches!(hb.fail("again"), Err(Error::LeaseLost { .. })));
    assert!(matches!(l.ack(), Err(Error::LeaseLost { .. })));
    assert!(matches!(
        l.set_progress(b"late"),
        Err(Error::LeaseLost { .. }) | Ok(())
    ));
    assert!(matches!(hb.extend(secs(5)), Err(Error::LeaseLost { .. })));
    assert_eq!(q.commit_stats().commits, commits, "refusals write nothing");
    let j = q.job(a).unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.progress),
        (JobState::Ready, 1, None)
    );
    // Second delivery: fail from the heartbeat, dead at once with attempts left.
    let l2 = q.dequeue().unwrap().unwrap();
    l2.heartbeat().fail("poison").unwrap();
    assert!(matches!(l2.nack("x"), Err(Error::LeaseLost { .. })));
    let j = q.job(a).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Dead, 2));
    assert_eq!(j.last_error.as_deref(), Some("poison"));
    // A cancelled job: the heartbeat's ends are refused with Cancelled.
    let b = q.enqueue(b"b", plain()).unwrap().id();
    let l3 = q.dequeue().unwrap().unwrap();
    assert_eq!(l3.id(), b);
    q.cancel(b, "stop").unwrap();
    assert!(matches!(
        l3.heartbeat().nack("x"),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        l3.heartbeat().fail("x"),
        Err(Error::Cancelled { .. })
    ));
    assert_eq!(q.stats().unwrap().leased, 0);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------------------

/// Eight threads hammering set_progress on one lease, with a heartbeat thread extending it:
/// the commit rate stays within the bound (one per interval, plus the extends), every call
/// succeeds, and after a final extend the stored value is the last one offered.
#[test]
fn progress_from_many_threads_on_one_lease_stays_within_its_rate() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"p", plain()).unwrap().id();
    let lease = Arc::new(q.dequeue().unwrap().unwrap());
    let before = q.commit_stats().commits;
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let extends = Arc::new(AtomicU64::new(0));
    let beat = {
        let (hb, stop, extends) = (lease.heartbeat(), stop.clone(), extends.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                hb.extend(secs(30)).unwrap();
                extends.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(ms(40));
            }
        })
    };
    let ths: Vec<_> = (0..8u8)
        .map(|t| {
            let lease = lease.clone();
            std::thread::spawn(move || {
                let until = Instant::now() + ms(600);
                let mut i = 0u32;
                while Instant::now() < until {
                    let mut v = vec![t];
                    v.extend_from_slice(&i.to_le_bytes());
                    lease.set_progress(&v).unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    for t in ths {
        t.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    beat.join().unwrap();
    let took = started.elapsed();
    let commits = q.commit_stats().commits - before;
    let extends = extends.load(Ordering::SeqCst);
    let allowed = 1 + (took.as_millis() / leaseq::PROGRESS_COMMIT_INTERVAL.as_millis()) as u64;
    assert!(
        commits <= allowed + extends,
        "{commits} commits in {took:?} with {extends} extends (at most {allowed} progress ones)"
    );
    // Pin the final value: one more update past the interval is committed at once.
    std::thread::sleep(leaseq::PROGRESS_COMMIT_INTERVAL + ms(10));
    lease.set_progress(b"final").unwrap();
    assert_eq!(
        q.job(id).unwrap().unwrap().progress.as_deref(),
        Some(&b"final"[..])
    );
    lease.extend(secs(30)).unwrap();
    assert_eq!(
        q.job(id).unwrap().unwrap().progress.as_deref(),
        Some(&b"final"[..])
    );
    lease.ack().unwrap();
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// Progress after the delivery ended: after an ack it is refused (or kept in memory and
/// never written) and the completed job's history keeps the last written value; a pending
/// update at the ack is dropped (the doc), not written by the ack.
#[test]
fn progress_after_ack_and_pending_at_ack_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let id = q.enqueue(b"p", plain()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    l.set_progress(b"one").unwrap();
    l.set_progress(b"two").unwrap(); // within the interval: pending
    let written = q.job(id).unwrap().unwrap().progress.unwrap();
    l.ack().unwrap();
    let commits = q.commit_stats().commits;
    let late = l.set_progress(b"three");
    assert!(
        matches!(late, Err(Error::LeaseLost { .. }) | Ok(())),
        "{late:?}"
    );
    std::thread::sleep(leaseq::PROGRESS_COMMIT_INTERVAL + ms(10));
    let late = l.set_progress(b"four");
    assert!(matches!(late, Err(Error::LeaseLost { .. })), "{late:?}");
    assert!(matches!(l.extend(secs(5)), Err(Error::LeaseLost { .. })));
    assert_eq!(
        q.commit_stats().commits,
        commits,
        "nothing written after the ack"
    );
    let j = q.job(id).unwrap().unwrap();
    assert_eq!(j.state, JobState::Completed);
    assert_eq!(
        j.progress,
        Some(written),
        "the last written value, not a late one"
    );
    assert_consistent(&q);
}

/// Progress on a job cancelled while it runs: refused with Cancelled, the stored value stays
/// the last one written before the cancel, and a heartbeat carrying a pending update writes
/// nothing either.
#[test]
fn progress_on_a_cancelled_job_is_refused_and_writes_nothing() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let id = q.enqueue(b"p", plain()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    let hb = l.heartbeat();
    l.set_progress(b"before").unwrap();
    l.set_progress(b"pending").unwrap();
    q.cancel(id, "stop").unwrap();
    let commits = q.commit_stats().commits;
    assert!(matches!(hb.extend(secs(5)), Err(Error::Cancelled { .. })));
    std::thread::sleep(leaseq::PROGRESS_COMMIT_INTERVAL + ms(10));
    assert!(matches!(
        l.set_progress(b"after"),
        Err(Error::Cancelled { .. })
    ));
    assert_eq!(q.commit_stats().commits, commits);
    let j = q.job(id).unwrap().unwrap();
    assert_eq!(j.state, JobState::Cancelled);
    assert_ne!(j.progress.as_deref(), Some(&b"after"[..]));
    assert_ne!(j.progress.as_deref(), Some(&b"pending"[..]));
    assert_eq!(q.stats().unwrap().leased, 0);
    assert_consistent(&q);
}

/// A pool job that sets progress in a tight loop and runs past its timeout: the stored
/// progress belongs to that delivery until the retry's delivery, which starts without it;
/// no progress of the timed-out handler lands after the timeout ended its delivery.
#[test]
fn progress_of_a_timed_out_handler_is_fenced_after_the_timeout() {
    let (_dir, q) = wall_queue(ms(600));
    let id = q
        .enqueue(b"p", EnqueueOptions::default().max_attempts(2))
        .unwrap()
        .id();
    let seen_second = Arc::new(Mutex::new(None));
    let late_refused = Arc::new(AtomicU64::new(0));
    let pool = {
        let (seen_second, late_refused, q2) =
            (seen_second.clone(), late_refused.clone(), q.clone());
        WorkerPool::builder(&q)
            .threads(2)
            .job_timeout(ms(150))
            .start(move |lease| {
                if lease.attempt() == 2 {
                    *seen_second.lock().unwrap() =
                        Some(q2.job(lease.id()).unwrap().unwrap().progress);
                    return Ok(());
                }
                let mut i = 0u32;
                while !leaseq::worker::is_timed_out() {
                    let _ = lease.set_progress(&i.to_le_bytes());
                    i += 1;
                }
                // Past the interval: this update would commit if it were not fenced.
                std::thread::sleep(leaseq::PROGRESS_COMMIT_INTERVAL + ms(20));
                if matches!(lease.set_progress(b"late"), Err(Error::LeaseLost { .. })) {
                    late_refused.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            })
            .unwrap()
    };
    wait_for("the job done", || q.job(id).unwrap().is_none());
    std::thread::sleep(leaseq::PROGRESS_COMMIT_INTERVAL + ms(100));
    let stats = pool.shutdown(secs(5)).stats;
    assert_eq!(
        late_refused.load(Ordering::SeqCst),
        1,
        "the late update was fenced"
    );
    let second = seen_second
        .lock()
        .unwrap()
        .clone()
        .expect("a second delivery");
    assert_eq!(second, None, "the retry's delivery starts without progress");
    assert_eq!((stats.timed_out, stats.acked), (1, 1), "{stats:?}");
    assert_consistent(&q);
}
