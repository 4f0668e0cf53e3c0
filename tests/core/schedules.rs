//! Periodic jobs (`Queue::create_schedule` and friends). Goal: due times come from the
//! schedule (no drift), at most one instance is pending, overlap and missed-time policies do
//! what they say, a dead or cancelled instance never stops a schedule, bad input is a typed
//! error that writes nothing, and the reopen decides missed due times before any dequeue.
//! Method: a manual clock, the public API, `check()` after each scenario.

use crate::common::{Fixture, T0_MS, assert_consistent, ms, secs};
use leaseq::{
    EnqueueOptions, Error, JobState, Missed, Overlap, Queue, Schedule, ScheduleInfo, Timing,
};
use std::time::Duration;

const MIN: u64 = 60_000;

fn every(d: Duration, payload: &[u8]) -> Schedule {
    Schedule::every(d).payload(payload.to_vec())
}

fn info(q: &Queue, name: &str) -> ScheduleInfo {
    q.schedule(name).unwrap().expect("the schedule")
}

/// Dequeues everything ready now; their payloads, each acked.
fn drain_acked(q: &Queue) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        out.push(l.payload().to_vec());
        l.ack().unwrap();
    }
    out
}

#[test]
fn an_interval_schedule_fires_on_its_grid_without_drift() {
    let f = Fixture::new();
    let q = f.open();
    let created = q
        .create_schedule("tick", &every(Duration::from_secs(60), b"tick"))
        .unwrap();
    assert_eq!(created.next_due_ms, Some(T0_MS + MIN));
    assert_eq!(
        created.timing,
        Timing::Interval {
            every_ms: MIN,
            start_ms: T0_MS + MIN
        }
    );
    assert!(q.dequeue().unwrap().is_none(), "not due yet");
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().expect("the first instance");
    assert_eq!(l.payload(), b"tick");
    // The run takes 45 s: the next due time stays on the grid.
    f.clock.advance(secs(45));
    l.ack().unwrap();
    let i = info(&q, "tick");
    assert_eq!(i.next_due_ms, Some(T0_MS + 2 * MIN));
    assert_eq!((i.fired, i.skipped), (1, 0));
    assert_eq!(i.last_job.map(|(_, at)| at), Some(T0_MS + MIN));
    f.clock.advance(secs(14));
    assert!(
        q.dequeue().unwrap().is_none(),
        "1 s before the second due time"
    );
    f.clock.advance(secs(1));
    assert_eq!(drain_acked(&q), vec![b"tick".to_vec()]);
    assert_eq!(info(&q, "tick").next_due_ms, Some(T0_MS + 3 * MIN));
    assert_consistent(&q);
}

#[test]
fn due_times_that_pass_together_enqueue_one_instance() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("tick", &every(secs(60), b"t")).unwrap();
    // Ten due times pass while nobody dequeues.
    f.clock.advance(secs(10 * 60 + 30));
    assert_eq!(drain_acked(&q), vec![b"t".to_vec()]);
    let i = info(&q, "tick");
    assert_eq!(i.fired, 1);
    assert_eq!(i.next_due_ms, Some(T0_MS + 11 * MIN), "the next after now");
    assert_consistent(&q);
}

#[test]
fn a_pending_instance_makes_later_due_times_skip() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("tick", &every(secs(60), b"t")).unwrap();
    let other = q.enqueue(b"other", Default::default()).unwrap().id();
    f.clock.advance(secs(60));
    // A dequeue fires the schedule (its instance queues behind the older job).
    let first = q.dequeue().unwrap().unwrap();
    assert_eq!(first.id(), other);
    first.ack().unwrap();
    for _ in 0..3 {
        f.clock.advance(secs(60));
        // Each dequeue sees the instance still ready and leaves it; no second one.
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.payload(), b"t");
        l.nack("again").unwrap();
    }
    let i = info(&q, "tick");
    assert_eq!(i.fired, 1, "{i:?}");
    assert_eq!(i.skipped, 3, "{i:?}");
    assert_eq!(q.stats().unwrap().ready, 1);
    assert_consistent(&q);
}

#[test]
fn overlap_skip_and_enqueue_while_an_instance_runs() {
    let f = Fixture::new();
    let q = f.open();
    // Instances leased for 10 minutes: still running at the next due times.
    let long = EnqueueOptions::default().lease(secs(600));
    q.create_schedule(
        "skip",
        &every(secs(60), b"skip")
            .overlap(Overlap::Skip)
            .options(long.clone()),
    )
    .unwrap();
    let q2 = q.named("other").unwrap();
    q2.create_schedule(
        "more",
        &every(secs(60), b"more")
            .overlap(Overlap::Enqueue)
            .options(long),
    )
    .unwrap();
    f.clock.advance(secs(60));
    let running_skip = q.dequeue().unwrap().unwrap();
    let running_more = q2.dequeue().unwrap().unwrap();
    f.clock.advance(secs(60));
    assert!(
        q.dequeue().unwrap().is_none(),
        "skip: nothing while one runs"
    );
    let second = q2.dequeue().unwrap().expect("enqueue: one more");
    assert_eq!(second.payload(), b"more");
    assert_eq!(info(&q, "skip").skipped, 1);
    assert_eq!(info(&q2, "more").fired, 2);
    // With the second one running too and none pending, the next due time enqueues again;
    // it then stays pending: the one after that skips.
    f.clock.advance(secs(60));
    assert_eq!(
        q2.stats().unwrap().ready,
        0,
        "fired by a dequeue, not by time alone"
    );
    let third = q2.dequeue().unwrap().expect("a third while two run");
    // A more urgent job is taken first: the fourth instance, fired by that dequeue, stays
    // ready; the next due time finds it pending and skips.
    f.clock.advance(secs(60));
    q2.enqueue(
        b"urgent",
        EnqueueOptions::default().priority(-1).lease(secs(600)),
    )
    .unwrap();
    let urgent = q2.dequeue().unwrap().unwrap();
    assert_eq!(urgent.payload(), b"urgent");
    assert_eq!(q2.stats().unwrap().ready, 1);
    f.clock.advance(secs(60));
    let fourth = q2.dequeue().unwrap().unwrap();
    assert_eq!(fourth.payload(), b"more");
    let i = info(&q2, "more");
    assert_eq!((i.fired, i.skipped), (4, 1), "{i:?}");
    for l in [running_skip, running_more, second, third, urgent, fourth] {
        l.ack().unwrap();
    }
    assert_consistent(&q);
}

/// Found by a new user's trial: with one consumer busy running the instance, no dequeue
/// looks at the due times that pass meanwhile. Under `Overlap::Skip` they are still skipped
/// (the file records when the instance ended): after the ack the next instance comes at the
/// first due time after the end, on the grid, not at once. A due time at the very end fires.
#[test]
fn skip_holds_for_due_times_no_one_looked_at_while_the_only_consumer_ran() {
    let f = Fixture::new();
    let q = f.builder().lease(secs(3600)).open(&f.path).unwrap();
    q.create_schedule("s", &every(secs(60), b"s")).unwrap();
    f.clock.advance(secs(60));
    let a = q.dequeue().unwrap().expect("the first instance");
    // Due at +120, +180 and +240 s while it runs; no one dequeues.
    f.clock.advance(secs(185));
    a.ack().unwrap();
    assert!(
        q.dequeue().unwrap().is_none(),
        "the due times passed while it ran are skipped"
    );
    let i = info(&q, "s");
    assert_eq!((i.fired, i.skipped), (1, 1), "one decision: {i:?}");
    assert_eq!(i.next_due_ms, Some(T0_MS + 5 * MIN), "on the grid");
    f.clock.advance(secs(55));
    let b = q.dequeue().unwrap().expect("the next due time fires");
    assert_eq!(info(&q, "s").last_job, Some((b.id(), T0_MS + 5 * MIN)));
    // An instance that ends exactly at a due time: that due time fires.
    f.clock.advance(secs(60));
    b.ack().unwrap();
    let c = q.dequeue().unwrap().expect("ended at the due time");
    // One that dies while due times pass: skipped as well, then on the grid again.
    f.clock.advance(secs(90));
    c.fail("broken").unwrap();
    assert!(q.dequeue().unwrap().is_none());
    f.clock.advance(secs(30));
    let d = q
        .dequeue()
        .unwrap()
        .expect("the first due time after its death");
    // Ended, then the file closed while due times passed: they were missed, not skipped.
    d.ack().unwrap();
    drop(d);
    drop(q);
    f.clock.advance(secs(150));
    let q = f.builder().lease(secs(3600)).open(&f.path).unwrap();
    assert_eq!(q.recovery().schedules_fired, 1, "{:?}", q.recovery());
    let i = info(&q, "s");
    assert_eq!((i.fired, i.skipped), (5, 2), "{i:?}");
    assert_consistent(&q);
}

/// From a review of the end stamps: an instance whose lease expired stopped at its deadline
/// (a due time after that fires, though the sweep found it later); one a closed file
/// abandoned is not stamped, so the due times missed while closed are Missed's to decide; an
/// end stamped by a clock that then went back holds nothing up.
#[test]
fn end_stamps_of_expiry_abandon_and_a_clock_that_went_back() {
    let once = || every(secs(60), b"s").options(EnqueueOptions::default().max_attempts(1));
    // Its worker hangs: the lease ends at +90 s; no one looks until +120.5 s.
    let f = Fixture::new();
    let q = f.builder().lease(secs(30)).open(&f.path).unwrap();
    q.create_schedule("s", &once()).unwrap();
    f.clock.advance(secs(60));
    let lost = q.dequeue().unwrap().expect("the first instance");
    f.clock.advance(Duration::from_millis(60_500));
    let next = q
        .dequeue()
        .unwrap()
        .expect("due at +120, after the lease ended");
    assert_ne!(next.id(), lost.id());
    // Leased when the file closed, dead at the reopen (out of attempts): RunOnce runs one.
    let f = Fixture::new();
    let q = f.builder().lease(secs(30)).open(&f.path).unwrap();
    q.create_schedule("s", &once()).unwrap();
    f.clock.advance(secs(60));
    let running = q.dequeue().unwrap().expect("the first instance");
    f.clock.advance(secs(10));
    drop(running);
    drop(q);
    f.clock.advance(secs(130));
    let q = f.builder().lease(secs(30)).open(&f.path).unwrap();
    let r = q.recovery();
    assert_eq!((r.leases_dead_lettered, r.schedules_fired), (1, 1), "{r:?}");
    // An ack committed while the clock was a day ahead, then the clock corrected.
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("s", &every(secs(60), b"s")).unwrap();
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().unwrap();
    let now = f.clock_now();
    f.clock.set_ms(now + 86_400_000);
    l.ack().unwrap();
    f.clock.set_ms(now + 5_000);
    f.clock.advance(secs(60));
    assert_eq!(
        drain_acked(&q),
        vec![b"s".to_vec()],
        "the next due time fires"
    );
    assert_consistent(&q);
}

/// `Overlap::Enqueue` does not look at when the last instance ended: a due time that passed
/// while it ran fires at the next dequeue.
#[test]
fn enqueue_fires_at_the_first_look_after_due_times_passed_while_one_ran() {
    let f = Fixture::new();
    let q = f.builder().lease(secs(3600)).open(&f.path).unwrap();
    q.create_schedule("e", &every(secs(60), b"e").overlap(Overlap::Enqueue))
        .unwrap();
    f.clock.advance(secs(60));
    let a = q.dequeue().unwrap().unwrap();
    f.clock.advance(secs(100));
    a.ack().unwrap();
    let b = q.dequeue().unwrap().expect("one more");
    b.ack().unwrap();
    assert_eq!(info(&q, "e").fired, 2);
    assert_consistent(&q);
}

#[test]
fn a_dead_or_cancelled_instance_never_stops_the_schedule() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule(
        "fragile",
        &every(secs(60), b"f").options(EnqueueOptions::default().max_attempts(1)),
    )
    .unwrap();
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().unwrap();
    let dead = l.id();
    l.fail("broken").unwrap();
    assert_eq!(q.job(dead).unwrap().unwrap().state, JobState::Dead);
    f.clock.advance(secs(60));
    let l = q
        .dequeue()
        .unwrap()
        .expect("the next due time fires past a dead one");
    assert_ne!(l.id(), dead);
    l.ack().unwrap();
    f.clock.advance(secs(60));
    // An instance cancelled while ready.
    q.dequeue().unwrap().map(|l| l.nack("again").unwrap());
    let pending = info(&q, "fragile").last_job.unwrap().0;
    q.cancel(pending, "not today").unwrap();
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().expect("fires past a cancelled one");
    assert_ne!(l.id(), pending);
    l.ack().unwrap();
    assert_eq!(info(&q, "fragile").fired, 4);
    assert_consistent(&q);
}

#[test]
fn missed_due_times_run_once_or_skip_as_the_reopen_decides() {
    let f = Fixture::new();
    {
        let q = f.open();
        q.create_schedule("once", &every(secs(60), b"once"))
            .unwrap();
        q.create_schedule("skip", &every(secs(60), b"skip").missed(Missed::Skip))
            .unwrap();
    }
    // Closed for an hour.
    f.clock.advance(secs(3600));
    let q = f.open();
    // Decided by the open: the RunOnce instance is already enqueued, before any dequeue.
    let r = q.recovery();
    assert_eq!((r.schedules_fired, r.schedules_skipped), (1, 1), "{r:?}");
    let s = q.stats().unwrap();
    assert_eq!(s.ready, 1, "{s:?}");
    let once = info(&q, "once");
    let skip = info(&q, "skip");
    assert_eq!((once.fired, once.skipped), (1, 0));
    assert_eq!((skip.fired, skip.skipped), (0, 1));
    for i in [&once, &skip] {
        assert_eq!(i.next_due_ms, Some(T0_MS + 61 * MIN), "{i:?}");
    }
    assert_eq!(drain_acked(&q), vec![b"once".to_vec()]);
    // While open, a late sweep is not a miss: both fire.
    f.clock.advance(secs(120));
    let mut got = drain_acked(&q);
    got.sort();
    assert_eq!(got, vec![b"once".to_vec(), b"skip".to_vec()]);
    assert_consistent(&q);
}

#[test]
fn a_cron_schedule_fires_at_the_wall_clock_times_of_its_zone() {
    // T0 is 2023-11-14 22:13:20 UTC, 23:13:20 in Berlin (CET, UTC+1).
    let f = Fixture::new();
    let q = f.open();
    let i = q
        .create_schedule(
            "berlin-midnight",
            &Schedule::cron("0 0 * * *", "Europe/Berlin").payload(b"m".to_vec()),
        )
        .unwrap();
    // 2023-11-15 00:00 CET = 2023-11-14 23:00 UTC.
    let due = 1_700_002_800_000;
    assert_eq!(i.next_due_ms, Some(due));
    f.clock.set_ms(due - 1);
    assert!(q.dequeue().unwrap().is_none());
    f.clock.set_ms(due);
    assert_eq!(drain_acked(&q), vec![b"m".to_vec()]);
    assert_eq!(
        info(&q, "berlin-midnight").next_due_ms,
        Some(due + 24 * 60 * MIN)
    );
    assert_consistent(&q);
}

// As BullMQ's repeatable jobs (and a crontab entry added at 03:00:00): a cron schedule set
// at the very millisecond its expression matches fires first at the next match, not at once;
// set a millisecond before a match, it fires at that match.
#[cfg(feature = "cron")]
#[test]
fn a_cron_schedule_set_on_a_match_waits_for_the_next_one() {
    let f = Fixture::new();
    let q = f.open();
    let minute = 1_700_000_040_000; // 2023-11-14 22:14:00 UTC, a whole minute after T0
    assert!(minute > T0_MS);
    f.clock.set_ms(minute);
    let every_minute = || Schedule::cron("* * * * *", "UTC").payload(b"m".to_vec());
    let i = q.create_schedule("on", &every_minute()).unwrap();
    assert_eq!(i.next_due_ms, Some(minute + 60_000));
    assert!(q.dequeue().unwrap().is_none(), "fired at once");
    f.clock.set_ms(minute + 60_000 - 1);
    let before = q.create_schedule("before", &every_minute()).unwrap();
    assert_eq!(before.next_due_ms, Some(minute + 60_000));
    f.clock.set_ms(minute + 60_000);
    assert_eq!(drain_acked(&q), vec![b"m".to_vec(), b"m".to_vec()]);
    assert_eq!(info(&q, "on").next_due_ms, Some(minute + 120_000));
    assert_consistent(&q);
}

#[test]
fn bad_definitions_are_typed_errors_that_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let field = |r: leaseq::Result<ScheduleInfo>| match r {
        Err(Error::InvalidOption { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(q.create_schedule("c", &Schedule::cron("every day", "UTC"))),
        "cron"
    );
    assert_eq!(
        field(q.create_schedule("c", &Schedule::cron("0 0 30 2 *", "UTC"))),
        "cron"
    );
    assert_eq!(
        field(q.create_schedule("c", &Schedule::cron("0 3 * * *", "Europe/Atlantis"))),
        "time_zone"
    );
    assert_eq!(
        field(q.create_schedule("c", &Schedule::every(Duration::ZERO))),
        "interval"
    );
    assert_eq!(
        field(q.create_schedule("c", &Schedule::every(ms(0) + Duration::from_micros(500)))),
        "interval"
    );
    assert_eq!(
        field(q.create_schedule("c", &Schedule::every(leaseq::DELAY_MAX + secs(1)))),
        "interval"
    );
    assert_eq!(
        field(q.create_schedule("", &every(secs(1), b""))),
        "schedule name"
    );
    let long = "n".repeat(leaseq::SCHEDULE_NAME_BYTES_MAX + 1);
    assert_eq!(
        field(q.create_schedule(&long, &every(secs(1), b""))),
        "schedule name"
    );
    assert_eq!(
        field(q.create_schedule("a\nb", &every(secs(1), b""))),
        "schedule name"
    );
    for (opts, name) in [
        (EnqueueOptions::default().delay(secs(1)), "delay"),
        (EnqueueOptions::default().dedup_key("k"), "dedup_key"),
        (
            EnqueueOptions::default().idempotency_key("k"),
            "idempotency_key",
        ),
        (EnqueueOptions::default().max_attempts(0), "max_attempts"),
        (EnqueueOptions::default().lease(Duration::ZERO), "lease"),
    ] {
        assert_eq!(
            field(q.create_schedule("c", &every(secs(1), b"").options(opts))),
            name
        );
    }
    assert_eq!(
        field(q.create_schedule("c", &Schedule::cron("@daily", "UTC").starting_at_ms(T0_MS))),
        "starting_at_ms"
    );
    // A start so far ahead the schedule would never come due (found by a new user's trial:
    // u64::MAX was taken, with no due time).
    for start in [u64::MAX, T0_MS + leaseq::DELAY_MAX.as_millis() as u64 + 1] {
        assert_eq!(
            field(q.create_schedule("c", &every(secs(1), b"").starting_at_ms(start))),
            "starting_at_ms"
        );
    }
    match q.create_schedule(
        "c",
        &every(secs(1), &vec![0u8; leaseq::SCHEDULE_PAYLOAD_BYTES_MAX + 1]),
    ) {
        Err(Error::PayloadTooLarge { limit_bytes, .. }) => {
            assert_eq!(limit_bytes, leaseq::SCHEDULE_PAYLOAD_BYTES_MAX)
        }
        other => panic!("{other:?}"),
    }
    assert!(q.schedules().unwrap().is_empty());
    q.create_schedule("c", &every(secs(1), b"")).unwrap();
    let before = q.schedules().unwrap();
    assert!(matches!(
        q.create_schedule("c", &every(secs(5), b"other")),
        Err(Error::ScheduleExists { name }) if name == "c"
    ));
    assert!(matches!(
        q.update_schedule("nope", &every(secs(5), b"")),
        Err(Error::ScheduleNotFound { name }) if name == "nope"
    ));
    assert_eq!(q.schedules().unwrap(), before, "refusals changed nothing");
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

#[test]
fn upsert_with_the_same_timing_keeps_the_due_time_and_a_new_timing_restarts_it() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.upsert_schedule("s", &every(secs(60), b"v1")).unwrap();
    assert_eq!(a.next_due_ms, Some(T0_MS + MIN));
    // The app restarts 30 s later and declares its schedules again.
    f.clock.advance(secs(30));
    let b = q
        .upsert_schedule("s", &every(secs(60), b"v2").overlap(Overlap::Enqueue))
        .unwrap();
    assert_eq!(b.next_due_ms, a.next_due_ms, "not pushed back");
    assert_eq!((b.overlap, b.created_ms), (Overlap::Enqueue, a.created_ms));
    assert_eq!(b.payload_bytes, 2);
    // A new interval counts from now.
    let c = q.update_schedule("s", &every(secs(600), b"v3")).unwrap();
    assert_eq!(c.next_due_ms, Some(T0_MS + 30_000 + 10 * MIN));
    f.clock.advance(secs(600));
    assert_eq!(drain_acked(&q), vec![b"v3".to_vec()]);
    assert_consistent(&q);
}

#[test]
fn a_removed_schedule_fires_no_more_and_leaves_its_instance() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("s", &every(secs(60), b"s")).unwrap();
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().unwrap();
    assert!(q.remove_schedule("s").unwrap());
    assert!(!q.remove_schedule("s").unwrap());
    assert!(q.schedule("s").unwrap().is_none());
    l.ack().unwrap();
    f.clock.advance(secs(600));
    assert!(q.dequeue().unwrap().is_none());
    assert_consistent(&q);
}

#[test]
fn schedules_belong_to_their_queue() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap();
    a.create_schedule("s", &every(secs(60), b"a")).unwrap();
    q.create_schedule("s", &every(secs(120), b"default"))
        .unwrap();
    assert_eq!(a.schedules().unwrap().len(), 1);
    assert_eq!(q.schedules().unwrap().len(), 1);
    f.clock.advance(secs(60));
    assert!(
        q.dequeue().unwrap().is_none(),
        "the default queue's is not due"
    );
    assert_eq!(drain_acked(&a), vec![b"a".to_vec()]);
    assert_consistent(&q);
}

#[test]
fn a_waiting_consumer_wakes_at_the_due_time() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("s", &every(secs(60), b"s")).unwrap();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || q.dequeue_timeout(Duration::from_secs(20)).unwrap())
    };
    std::thread::sleep(Duration::from_millis(50));
    f.clock.advance(secs(60));
    let l = consumer.join().unwrap().expect("woken by the due time");
    assert_eq!(l.payload(), b"s");
    l.ack().unwrap();
}

#[test]
fn check_reports_a_damaged_schedule_and_the_sweep_goes_on() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("bad", &every(secs(60), b"bad")).unwrap();
    q.create_schedule("good", &every(secs(60), b"good"))
        .unwrap();
    let db = q.database();
    let w = db.begin_write().unwrap();
    {
        let def: leaseq::redb::TableDefinition<(u32, &str), &[u8]> =
            leaseq::redb::TableDefinition::new("leaseq_schedules");
        let mut t = w.open_table(def).unwrap();
        t.insert((0u32, "bad"), &b"not a schedule record"[..])
            .unwrap();
    }
    w.commit().unwrap();
    let v = q.check().unwrap();
    assert!(v.iter().any(|v| v.detail.contains("\"bad\"")), "{v:?}");
    f.clock.advance(secs(60));
    assert_eq!(
        drain_acked(&q),
        vec![b"good".to_vec()],
        "one bad row stops nothing"
    );
    // Setting it again is the fix.
    q.upsert_schedule("bad", &every(secs(60), b"bad")).unwrap();
    assert_consistent(&q);
}

/// A schedule that fired, then had its row damaged: removing it, or setting it again,
/// drops its last instance's entry (no row names it any more), and `check()` is clean.
#[test]
fn a_damaged_fired_schedule_removed_or_set_again_leaves_check_clean() {
    let f = Fixture::new();
    let q = f.open();
    for name in ["removed", "set again"] {
        q.create_schedule(name, &every(secs(60), b"x")).unwrap();
    }
    f.clock.advance(secs(60));
    assert_eq!(drain_acked(&q).len(), 2);
    let db = q.database();
    let w = db.begin_write().unwrap();
    {
        let def: leaseq::redb::TableDefinition<(u32, &str), &[u8]> =
            leaseq::redb::TableDefinition::new("leaseq_schedules");
        let mut t = w.open_table(def).unwrap();
        for name in ["removed", "set again"] {
            t.insert((0u32, name), &b"not a schedule record"[..])
                .unwrap();
        }
    }
    w.commit().unwrap();
    assert!(!q.check().unwrap().is_empty());
    assert!(q.remove_schedule("removed").unwrap());
    q.upsert_schedule("set again", &every(secs(60), b"x"))
        .unwrap();
    assert_consistent(&q);
}

#[test]
fn a_pool_runs_the_instances_and_sleeps_until_the_next_due_time() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("tick", &every(secs(60), b"tick"))
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let pool = leaseq::WorkerPool::builder(&q)
        .threads(2)
        .start(move |lease: &leaseq::Lease| {
            tx.lock().unwrap().send(lease.payload().to_vec()).unwrap();
            Ok(())
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(rx.try_recv().is_err(), "nothing before the first due time");
    for round in 1..=3u64 {
        f.clock.advance(secs(60));
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("round {round}: the pool woke for the due time"));
        assert_eq!(got, b"tick");
        // Acked before the next due time, or that one would find it running and skip.
        assert!(crate::common::eventually(|| q.stats().unwrap().total == 0));
    }
    pool.shutdown(Duration::from_secs(5));
    let i = info(&q, "tick");
    assert_eq!(i.fired, 3, "{i:?}");
    assert!(rx.try_recv().is_err(), "one instance per due time");
    assert_consistent(&q);
}

#[test]
fn a_paused_queue_fires_nothing_until_resumed_then_once() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule("tick", &every(secs(60), b"tick"))
        .unwrap();
    q.pause().unwrap();
    f.clock.advance(secs(300));
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(info(&q, "tick").fired, 0);
    q.resume().unwrap();
    assert_eq!(drain_acked(&q), vec![b"tick".to_vec()]);
    assert_eq!(info(&q, "tick").next_due_ms, Some(T0_MS + 6 * MIN));
    assert_consistent(&q);
}

#[test]
fn an_instance_is_announced_as_any_enqueue() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events().unwrap();
    q.create_schedule("tick", &every(secs(60), b"tick"))
        .unwrap();
    f.clock.advance(secs(60));
    let l = q.dequeue().unwrap().unwrap();
    match events.recv_timeout(Duration::from_secs(5)).unwrap() {
        leaseq::Event::Enqueued { id } => assert_eq!(id, l.id()),
        other => panic!("{other:?}"),
    }
    l.ack().unwrap();
}

#[test]
fn the_file_holds_at_most_schedules_max() {
    let f = Fixture::new();
    let q = f.open_non_durable();
    let other = q.named("other").unwrap();
    for i in 0..leaseq::SCHEDULES_MAX {
        // Spread over two queues: the bound is the file's.
        let on = if i % 2 == 0 { &q } else { &other };
        on.create_schedule(&format!("s{i}"), &every(secs(3600), b""))
            .unwrap();
    }
    match q.create_schedule("one-more", &every(secs(60), b"")) {
        Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "schedules"),
        other => panic!("{other:?}"),
    }
    // Changing one that exists is still allowed; removing one makes room.
    q.upsert_schedule("s0", &every(secs(60), b"changed"))
        .unwrap();
    assert!(q.remove_schedule("s0").unwrap());
    q.create_schedule("one-more", &every(secs(60), b""))
        .unwrap();
    assert_eq!(
        q.schedules().unwrap().len() + other.schedules().unwrap().len(),
        leaseq::SCHEDULES_MAX
    );
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Builds without the `cron` feature.
// ---------------------------------------------------------------------------------------

/// A file with two schedules of the default queue, written by a build with `cron` at the
/// fixtures' clock (1,700,000,000,000 ms) and closed: `nightly`, cron `0 3 * * *` in UTC
/// (payload `nightly`), and `tick`, every 60 s (payload `tick`). No jobs.
const CRON_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/cron-schedules.leaseq"
);

/// The first 03:00 UTC after the fixture's clock: 2023-11-15 03:00 UTC.
const NIGHTLY_DUE_MS: u64 = 1_700_017_200_000;
const DAY_MS: u64 = 86_400_000;

/// Writes `tests/fixtures/cron-schedules.leaseq` (by hand: `cargo test --test core --
/// --ignored write_cron_fixture`).
#[cfg(feature = "cron")]
#[test]
#[ignore]
fn write_cron_fixture() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule(
        "nightly",
        &Schedule::cron("0 3 * * *", "UTC").payload(b"nightly".to_vec()),
    )
    .unwrap();
    q.create_schedule("tick", &every(Duration::from_secs(60), b"tick"))
        .unwrap();
    assert_eq!(info(&q, "nightly").next_due_ms, Some(NIGHTLY_DUE_MS));
    q.close();
    drop(q);
    std::fs::copy(&f.path, CRON_FIXTURE).unwrap();
}

/// Opens a copy of the cron fixture a day after its clock (both schedules due).
fn open_cron_fixture_a_day_later() -> (Fixture, Queue) {
    let f = Fixture::new();
    std::fs::copy(CRON_FIXTURE, &f.path).unwrap();
    f.clock.set_ms(T0_MS + DAY_MS);
    let q = f.open();
    (f, q)
}

/// With `cron`, the fixture's two schedules fire at the open a day later (what the build
/// without it must keep).
#[cfg(feature = "cron")]
#[test]
fn the_cron_fixture_fires_both_schedules_with_cron() {
    let (_f, q) = open_cron_fixture_a_day_later();
    assert_eq!(q.recovery().schedules_fired, 2);
    let mut got = drain_acked(&q);
    got.sort();
    assert_eq!(got, vec![b"nightly".to_vec(), b"tick".to_vec()]);
    assert_eq!(info(&q, "nightly").fired, 1);
    assert_consistent(&q);
}

/// Without `cron` (`cargo test --no-default-features --test core -- without_cron`): a cron
/// schedule in the file is kept as it is (never fired, its due time and counts unchanged, not
/// reported by `check()`), interval schedules beside it run, and a new cron schedule is
/// refused with `InvalidOption` naming `cron`, writing nothing.
#[cfg(not(feature = "cron"))]
#[test]
fn without_cron_a_cron_schedule_is_kept_unfired_and_a_new_one_refused() {
    let (f, q) = open_cron_fixture_a_day_later();
    assert_eq!(q.recovery().schedules_fired, 1, "the interval only");
    assert_eq!(drain_acked(&q), vec![b"tick".to_vec()]);
    let nightly = info(&q, "nightly");
    assert_eq!(
        (nightly.next_due_ms, nightly.fired, nightly.skipped),
        (Some(NIGHTLY_DUE_MS), 0, 0)
    );
    assert!(matches!(nightly.timing, Timing::Cron { .. }));
    assert_eq!(info(&q, "tick").fired, 1);
    let r = q.create_schedule("other", &Schedule::cron("@daily", "UTC"));
    assert!(
        matches!(&r, Err(Error::InvalidOption { field, .. }) if *field == "cron"),
        "{r:?}"
    );
    assert_eq!(q.schedule("other").unwrap(), None);
    // Sweeps pass over it: the interval keeps firing, the cron schedule stays as it was.
    f.clock.advance(Duration::from_secs(60));
    assert_eq!(drain_acked(&q), vec![b"tick".to_vec()]);
    assert_eq!(info(&q, "nightly"), nightly);
    // A consumer waiting on the idle queue waits for the interval's next due time: the kept
    // cron schedule's past due time does not make it look again and again (each look a
    // trip through the writer).
    let before = q.commit_stats();
    assert!(q.dequeue_timeout(ms(300)).unwrap().is_none());
    let after = q.commit_stats();
    let looks = (after.commits + after.aborted_clean) - (before.commits + before.aborted_clean);
    assert!(looks <= 2, "{looks} write groups while idle for 300 ms");
    assert_consistent(&q);
    // Paused, it can be triggered (its template needs no cron); resumed, its next due time
    // cannot be computed here: refused with InvalidOption, nothing written, still paused.
    assert!(q.pause_schedule("nightly").unwrap());
    let paused = info(&q, "nightly");
    let r = q.resume_schedule("nightly");
    assert!(matches!(&r, Err(Error::InvalidOption { .. })), "{r:?}");
    assert_eq!(info(&q, "nightly"), paused);
    q.trigger_schedule("nightly").unwrap();
    assert_eq!(drain_acked(&q), vec![b"nightly".to_vec()]);
    assert_consistent(&q);
    drop(q);
    let q = f.open();
    assert_eq!(info(&q, "nightly").paused_ms, paused.paused_ms);
    assert_consistent(&q);
}

/// A paused schedule fires nothing and has no due time, across reopens and an upsert at
/// start; resumed, it is due at its next time from then, the time missed while paused made
/// up for by nothing; a trigger enqueues one instance now, paused or not, as the schedule's
/// last instance (so a due time under `Overlap::Skip` skips while it runs); each call on a
/// missing name is `ScheduleNotFound` and writes nothing.
#[test]
fn pause_resume_and_trigger_a_schedule() {
    let f = Fixture::new();
    let q = f.open();
    let tick = every(Duration::from_secs(60), b"tick");
    q.create_schedule("tick", &tick).unwrap();
    assert!(q.pause_schedule("tick").unwrap());
    assert!(!q.pause_schedule("tick").unwrap(), "already paused");
    let paused = info(&q, "tick");
    assert_eq!((paused.paused_ms, paused.next_due_ms), (Some(T0_MS), None));
    f.clock.advance(secs(5 * 60));
    assert!(
        q.dequeue().unwrap().is_none(),
        "a paused schedule fires nothing"
    );
    // An app that upserts its schedules at start does not resume them; nor does a reopen.
    q.upsert_schedule("tick", &tick).unwrap();
    drop(q);
    let q = f.open();
    assert_eq!(q.recovery().schedules_fired, 0);
    let still = info(&q, "tick");
    assert_eq!((still.paused_ms, still.next_due_ms), (Some(T0_MS), None));
    assert_eq!((still.fired, still.skipped), (0, 0));
    assert_consistent(&q);

    // Triggered while paused: one instance now; the schedule stays paused.
    let now = f.clock_now();
    let id = q.trigger_schedule("tick").unwrap();
    let triggered = info(&q, "tick");
    assert_eq!(triggered.last_job, Some((id, now)));
    assert_eq!((triggered.fired, triggered.paused_ms), (1, Some(T0_MS)));
    let lease = q.dequeue().unwrap().expect("the triggered instance");
    assert_eq!((lease.id(), lease.payload()), (id, &b"tick"[..]));

    // Resumed: due at the next minute of its grid from now, not at the ones passed.
    assert!(q.resume_schedule("tick").unwrap());
    assert!(!q.resume_schedule("tick").unwrap(), "already running");
    let resumed = info(&q, "tick");
    assert_eq!(resumed.paused_ms, None);
    let due = resumed.next_due_ms.expect("a due time");
    assert!(due >= now && due <= now + MIN, "{due} from {now}");
    assert_eq!((due - T0_MS) % MIN, 0, "on its grid");
    // The triggered instance still runs: under Overlap::Skip the due time skips.
    f.clock.set_ms(due);
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(info(&q, "tick").skipped, 1);
    lease.ack().unwrap();
    f.clock.set_ms(due + MIN);
    assert_eq!(drain_acked(&q), vec![b"tick".to_vec()]);
    assert_eq!(info(&q, "tick").fired, 2);

    // A missing name: typed, nothing written.
    let before = q.schedules().unwrap();
    for r in [
        q.pause_schedule("nope").map(|_| ()),
        q.resume_schedule("nope").map(|_| ()),
        q.trigger_schedule("nope").map(|_| ()),
    ] {
        assert!(matches!(r, Err(Error::ScheduleNotFound { .. })), "{r:?}");
    }
    assert_eq!(q.schedules().unwrap(), before);
    assert_eq!(q.stats().unwrap().ready, 0);
    assert_consistent(&q);
}

// Issue 42 item 9: a cron schedule's first due time is the first match strictly after the
// call that sets it (as BullMQ's repeatable jobs): set 1 ms after a match, the next match; a
// schedule resumed on a match, the next one too. An interval keeps what it documents: one
// interval after it is created, or its start when that is not past (due at once when the
// start is now).
#[cfg(feature = "cron")]
#[test]
fn a_cron_schedule_set_or_resumed_around_a_match_is_first_due_strictly_after() {
    let f = Fixture::new();
    let q = f.open();
    let minute = 1_700_000_040_000; // 2023-11-14 22:14:00 UTC
    let every_minute = || Schedule::cron("* * * * *", "UTC").payload(b"m".to_vec());
    f.clock.set_ms(minute + 1);
    let after = q.create_schedule("after", &every_minute()).unwrap();
    assert_eq!(after.next_due_ms, Some(minute + MIN));
    // Paused, then resumed at the very millisecond of a match: the next match.
    q.pause_schedule("after").unwrap();
    f.clock.set_ms(minute + MIN);
    assert!(q.resume_schedule("after").unwrap());
    assert_eq!(info(&q, "after").next_due_ms, Some(minute + 2 * MIN));
    assert!(q.dequeue().unwrap().is_none(), "fired at once on resume");
    // An interval starting now is due now; without a start, one interval from now.
    let now = f.clock_now();
    let start_now = every(secs(60), b"i").starting_at_ms(now);
    assert_eq!(
        q.create_schedule("start-now", &start_now)
            .unwrap()
            .next_due_ms,
        Some(now)
    );
    assert_eq!(
        q.create_schedule("plain", &every(secs(60), b"p"))
            .unwrap()
            .next_due_ms,
        Some(now + MIN)
    );
    assert_eq!(drain_acked(&q), vec![b"i".to_vec()]);
    assert_consistent(&q);
}

// A due time computed earlier and reached at the very millisecond of an update or a reopen
// is not lost: an upsert of the same timing keeps it and the next look fires it; the open
// fires it whatever `Missed` says (it did not pass while the file was closed). One
// millisecond later, `Missed::Skip` skips it at the open, as documented.
#[cfg(feature = "cron")]
#[test]
fn a_due_time_reached_at_an_update_or_a_reopen_still_fires() {
    let f = Fixture::new();
    let minute = 1_700_000_040_000; // 2023-11-14 22:14:00 UTC, after T0
    let cron = |p: &[u8]| Schedule::cron("* * * * *", "UTC").payload(p.to_vec());
    {
        let q = f.open();
        q.create_schedule("c", &cron(b"c1")).unwrap();
        q.create_schedule("i", &every(secs(60), b"i1").starting_at_ms(minute))
            .unwrap();
        f.clock.set_ms(minute);
        // The app restarts on the due millisecond and declares its schedules again.
        let c = q.upsert_schedule("c", &cron(b"c2")).unwrap();
        let i = q.upsert_schedule("i", &every(secs(60), b"i2")).unwrap();
        assert_eq!((c.next_due_ms, i.next_due_ms), (Some(minute), Some(minute)));
        let mut got = drain_acked(&q);
        got.sort();
        assert_eq!(got, vec![b"c2".to_vec(), b"i2".to_vec()]);
        q.remove_schedule("i").unwrap();
        q.create_schedule("skip", &cron(b"s").missed(Missed::Skip))
            .unwrap();
        assert_consistent(&q);
    }
    // Closed; opened again on the very millisecond of the next match: both fire.
    f.clock.set_ms(minute + MIN);
    {
        let q = f.open();
        let r = q.recovery();
        assert_eq!((r.schedules_fired, r.schedules_skipped), (2, 0), "{r:?}");
        let mut got = drain_acked(&q);
        got.sort();
        assert_eq!(got, vec![b"c2".to_vec(), b"s".to_vec()]);
        assert_eq!(info(&q, "skip").next_due_ms, Some(minute + 2 * MIN));
    }
    // Opened 1 ms after the next match: it passed while closed, so Skip skips it.
    f.clock.set_ms(minute + 2 * MIN + 1);
    let q = f.open();
    let r = q.recovery();
    assert_eq!((r.schedules_fired, r.schedules_skipped), (1, 1), "{r:?}");
    assert_eq!(drain_acked(&q), vec![b"c2".to_vec()]);
    assert_consistent(&q);
}
