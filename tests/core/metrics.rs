//! Per-minute metrics (`Queue::metrics`, `Reader::metrics`): every committed change counted
//! once, in the minute of its commit, as the change events report it; nothing counted for a
//! refused call or an aborted group; 24 hours kept, older minutes pruned; the same numbers
//! through a reader. Method: a mixed workload on two queues under a manual clock, its event
//! streams counted beside it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{Fixture, assert_consistent, ms, plain, secs};
use leaseq::{Event, MinuteCounts, Queue, Reader};

const MINUTE_MS: u64 = 60_000;

/// Counts of (enqueued, completed, retried, dead, cancelled) in `events`.
fn tally(events: &leaseq::Events) -> [u64; 5] {
    let mut t = [0u64; 5];
    while let Some(e) = events.try_recv() {
        match e {
            Event::Enqueued { .. } => t[0] += 1,
            Event::Completed { .. } => t[1] += 1,
            Event::Retried { .. } => t[2] += 1,
            Event::Dead { .. } => t[3] += 1,
            Event::Cancelled { .. } => t[4] += 1,
            _ => {}
        }
    }
    t
}

fn sum(minutes: &[MinuteCounts]) -> [u64; 5] {
    minutes.iter().fold([0; 5], |mut t, m| {
        for (slot, n) in t
            .iter_mut()
            .zip([m.enqueued, m.completed, m.retried, m.dead, m.cancelled])
        {
            *slot += n;
        }
        t
    })
}

/// One minute's worth of a workload that makes every kind of change.
fn workload(q: &Queue, f: &Fixture, round: u64) {
    let ids: Vec<_> = (0..6)
        .map(|i| {
            q.enqueue(format!("{round}-{i}").as_bytes(), plain())
                .unwrap()
        })
        .collect();
    // A duplicate adds nothing.
    q.enqueue(b"d", plain().dedup_key(format!("k{round}")))
        .unwrap();
    q.enqueue(b"d", plain().dedup_key(format!("k{round}")))
        .unwrap();
    q.enqueue_batch((0..3).map(|_| (&b"batch"[..], plain())))
        .unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    q.dequeue().unwrap().unwrap().nack("again").unwrap();
    q.dequeue().unwrap().unwrap().fail("broken").unwrap();
    let l = q.dequeue().unwrap().unwrap();
    // A failing effect: the attempt ends, the job is retried.
    let _ = l.ack_with(|_| Err("no".into()));
    q.cancel(ids[5].id(), "not needed").unwrap();
    // An expired lease taken back by a dequeue's sweep.
    let _held = q.dequeue().unwrap().unwrap();
    f.clock
        .advance(crate::common::LEASE + Duration::from_millis(1));
    if let Some(l) = q.dequeue().unwrap() {
        l.ack().unwrap();
    }
    // Refused calls and an aborted group count nothing.
    let waiting = q.enqueue(b"waiting", plain()).unwrap().id();
    assert!(q.requeue_dead(waiting).is_err(), "a ready job is not dead");
    assert!(q.retry(waiting).is_err(), "a ready job has not ended");
    assert!(
        q.write(|tx| {
            tx.enqueue(b"never", plain())?;
            Err::<(), _>("rolled back".into())
        })
        .is_err()
    );
}

#[test]
fn metrics_count_every_committed_change_once_in_its_minute() {
    let f = Fixture::new();
    let q = f.open();
    let mail = q.named("mail").unwrap();
    let (ev_q, ev_mail) = (q.events().unwrap(), mail.events().unwrap());
    let start_ms = f.clock_now();
    let mut per_minute: BTreeMap<u64, [u64; 5]> = BTreeMap::new();
    for round in 0..3 {
        let minute = f.clock_now() / MINUTE_MS * MINUTE_MS;
        workload(&q, &f, round);
        let counted = tally(&ev_q);
        per_minute.insert(minute, counted);
        workload(&mail, &f, round);
        f.clock.advance(Duration::from_secs(60));
    }
    let mail_events = tally(&ev_mail);
    let m = q.metrics(start_ms).unwrap();
    // Each minute holds what that minute's commits did (the expiry's advance stays inside it).
    let from_metrics: BTreeMap<u64, [u64; 5]> =
        m.iter().map(|c| (c.minute_ms, sum(&[*c]))).collect();
    // The expired lease's sweep ran after the clock moved: it may land in the next minute.
    assert_eq!(
        per_minute.values().fold([0; 5], |mut t, c| {
            t.iter_mut().zip(c).for_each(|(a, b)| *a += b);
            t
        }),
        sum(&m),
        "{m:#?}"
    );
    assert!(from_metrics.len() >= 3, "{m:#?}");
    let total = sum(&m);
    assert!(
        total.iter().all(|&n| n > 0),
        "every kind happened: {total:?}"
    );
    assert_eq!(sum(&mail.metrics(0).unwrap()), mail_events);
    // Minutes are whole and ascending; a later start leaves the earlier ones out.
    assert!(m.windows(2).all(|w| w[0].minute_ms < w[1].minute_ms));
    assert!(m.iter().all(|c| c.minute_ms % MINUTE_MS == 0));
    let last = m.last().unwrap().minute_ms;
    assert_eq!(q.metrics(last).unwrap(), vec![*m.last().unwrap()]);
    assert_eq!(q.metrics(last + MINUTE_MS).unwrap(), vec![]);
    assert_consistent(&q);
    // The same through a reader, and after a reopen.
    drop((q, mail, ev_q, ev_mail));
    let r = Reader::open(&f.path).unwrap();
    assert_eq!(r.metrics(start_ms).unwrap(), m);
    drop(r);
    let q = f.open();
    assert_eq!(q.metrics(start_ms).unwrap(), m);
}

#[test]
fn metrics_keep_the_last_day_and_prune_older_minutes() {
    let f = Fixture::new();
    let q = f.open_non_durable();
    let start = f.clock_now();
    // One enqueue in each of 26 hours of minutes, 20 minutes apart after the first day.
    for _ in 0..(24 * 60 + 10) {
        q.enqueue(b"tick", plain()).unwrap();
        f.clock.advance(Duration::from_secs(60));
    }
    let m = q.metrics(0).unwrap();
    assert!(
        m.len() as u64 <= leaseq::METRICS_MINUTES_KEPT,
        "{} minutes kept",
        m.len()
    );
    let now_minute = f.clock_now() / MINUTE_MS;
    let oldest = m.first().unwrap().minute_ms / MINUTE_MS;
    assert!(
        now_minute - oldest <= leaseq::METRICS_MINUTES_KEPT,
        "a minute older than a day was kept: {oldest} at {now_minute}"
    );
    assert!(m.first().unwrap().minute_ms > start);
    assert!(m.iter().all(|c| c.enqueued == 1));
    // A jump of days: the older minutes are no longer read, and the next writes (one a
    // second at most) remove them, 64 of each kind per write.
    f.clock.advance(secs(3 * 24 * 3600));
    for _ in 0..200 {
        q.enqueue(b"later", plain()).unwrap();
    }
    let m = q.metrics(0).unwrap();
    assert_eq!(
        m.len(),
        1,
        "every minute older than a day is left out: {:?}",
        m.first()
    );
    assert_eq!(m[0].enqueued, 200);
    for _ in 0..30 {
        f.clock.advance(secs(1));
        q.enqueue(b"later", plain()).unwrap();
    }
    // The rows are gone from the file, not only left out (30 writes of up to 64 per kind).
    let rows = {
        use redb::{ReadableDatabase, ReadableTableMetadata};
        const METRICS: redb::TableDefinition<(u32, u8, u64), u64> =
            redb::TableDefinition::new("leaseq_metrics");
        let rtx = q.database().begin_read().unwrap();
        rtx.open_table(METRICS).unwrap().len().unwrap()
    };
    assert!(rows <= 2, "{rows} rows left in leaseq_metrics");
    drop(q);
    let r = Reader::open(&f.path).unwrap();
    let m = r.metrics(0).unwrap();
    assert_eq!(m.iter().map(|c| c.enqueued).sum::<u64>(), 230);
    assert_eq!(r.check().unwrap(), vec![]);
}

#[test]
fn a_handle_opened_without_metrics_counts_nothing() {
    let f = Fixture::new();
    let q = f.builder().metrics(false).open(&f.path).unwrap();
    q.enqueue(b"a", plain()).unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.metrics(0).unwrap(), vec![]);
    drop(q);
    // The next handle with metrics counts again; the quiet minutes stay quiet.
    let q = f.open();
    q.enqueue(b"b", plain()).unwrap();
    let m = q.metrics(0).unwrap();
    assert_eq!((m.len(), m[0].enqueued, m[0].completed), (1, 1, 0));
}

/// A kind no longer counted does not keep its old minutes: the next commits of the queue, of
/// any kind, remove them (found by a new user's trial: an old `dead` minute outlived the day).
#[test]
fn old_minutes_of_every_kind_go_with_the_queues_next_commits() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"doomed", plain().max_attempts(1)).unwrap();
    q.dequeue().unwrap().unwrap().fail("broken").unwrap();
    q.enqueue(b"x", plain()).unwrap();
    q.cancel(q.enqueue(b"y", plain()).unwrap().id(), "no")
        .unwrap();
    f.clock.advance(secs(2 * 24 * 3600));
    q.enqueue(b"later", plain()).unwrap();
    let m = q.metrics(0).unwrap();
    assert_eq!(m.len(), 1, "{m:#?}");
    assert_eq!((m[0].enqueued, m[0].dead, m[0].cancelled), (1, 0, 0));
}

/// `Queue::flush` writes the counts not written yet: a reader beside the open queue sees them.
#[test]
fn flush_writes_the_pending_counts_for_readers() {
    let f = Fixture::new();
    let q = f.builder().live_reads(true).open(&f.path).unwrap();
    q.enqueue(b"first", plain()).unwrap(); // written with its commit (the first write)
    q.enqueue(b"second", plain()).unwrap(); // pending: under a second since
    let r = Reader::open(&f.path).unwrap();
    assert_eq!(sum(&r.metrics(0).unwrap())[0], 1);
    assert_eq!(
        sum(&q.metrics(0).unwrap())[0],
        2,
        "the handle counts its pending ones"
    );
    q.flush().unwrap();
    assert_eq!(sum(&r.metrics(0).unwrap())[0], 2);
}

/// The run times of the deliveries whose consumers ended them: each ack, `ack_with`, nack,
/// fail and snooze (one at a time and in a batch) timed from its dequeue, per minute, read
/// as percentiles within a quarter above the true ones; an expired, cancelled or abandoned
/// lease is not timed; a leased job says when its delivery began; the same through a reader
/// after the close, and `check` finds nothing wrong.
#[test]
fn run_times_are_kept_per_minute_as_percentiles_of_the_ended_deliveries() {
    let f = Fixture::new();
    let q = f.open();
    // Start at a whole minute, so every run below ends in one minute.
    let now = f.clock_now();
    f.clock.set_ms(now - now % MINUTE_MS + MINUTE_MS);
    let minute_ms = f.clock_now();
    let mut timed = Vec::new();
    let mut run = |ran: u64, end: &dyn Fn(&leaseq::Lease)| {
        q.enqueue(b"job", plain()).unwrap();
        let lease = q.dequeue().unwrap().unwrap();
        let started = f.clock_now();
        let info = q.job(lease.id()).unwrap().unwrap();
        assert_eq!(info.leased_ms, Some(started), "when the delivery began");
        assert_eq!(info.run_at_ms, started);
        f.clock.advance(ms(ran));
        end(&lease);
        timed.push(ran);
    };
    run(40, &|l| l.ack().unwrap());
    run(3_000, &|l| {
        l.nack("again").unwrap();
    });
    run(120, &|l| l.fail("broken").unwrap());
    run(5, &|l| l.snooze(secs(1)).unwrap());
    run(7, &|l| {
        l.ack_with(|_| Ok(())).unwrap();
    });
    run(0, &|l| l.ack().unwrap());
    run(900, &|l| {
        let r = l.ack_with(|_| Err("the server said no".into()));
        assert!(r.is_err());
    });
    // Two leases acked in one batch after 250 ms.
    q.enqueue_batch([(&b"a"[..], plain()), (&b"b"[..], plain())])
        .unwrap();
    let batch = q.dequeue_batch(2).unwrap();
    assert_eq!(batch.len(), 2);
    f.clock.advance(ms(250));
    assert!(q.ack_batch(&batch).unwrap().iter().all(|r| r.is_ok()));
    timed.extend([250, 250]);
    // Not timed: a lease that expires, a leased job cancelled, a refused ack (on a queue
    // of their own, so the jobs given back above do not come first).
    let side = q.named("side").unwrap();
    let expiring = side.enqueue(b"hangs", plain().lease(secs(1))).unwrap().id();
    let hung = side.dequeue().unwrap().unwrap();
    assert_eq!(hung.id(), expiring);
    let cancelled = side.enqueue(b"cancelled", plain()).unwrap().id();
    let leased = side.dequeue().unwrap().unwrap();
    assert_eq!(leased.id(), cancelled);
    f.clock.advance(secs(2));
    side.cancel(cancelled, "not needed").unwrap();
    assert!(leased.ack().is_err(), "a cancelled lease is refused");
    // The next dequeue takes the expired lease back (untimed) and delivers its job again.
    assert_eq!(side.dequeue().unwrap().unwrap().id(), expiring);
    assert!(
        side.metrics(0).unwrap().iter().all(|m| m.runs == 0),
        "nothing timed on the side queue"
    );
    assert_eq!(
        f.clock_now() / MINUTE_MS,
        minute_ms / MINUTE_MS,
        "one minute"
    );

    let check = |m: &[MinuteCounts]| {
        let m: Vec<_> = m.iter().filter(|c| c.runs > 0).collect();
        assert_eq!(m.len(), 1, "{m:#?}");
        let m = m[0];
        assert_eq!(m.minute_ms, minute_ms);
        assert_eq!(m.runs, timed.len() as u64);
        let mut sorted = timed.clone();
        sorted.sort_unstable();
        for (percent, got) in [(50, m.run_ms_p50), (95, m.run_ms_p95)] {
            let rank = (sorted.len() * percent).div_ceil(100);
            let truth = sorted[rank - 1];
            let got = got.expect("a percentile");
            assert!(
                got >= truth && got <= truth + truth / 4,
                "p{percent}: {got} for {truth} of {sorted:?}"
            );
        }
    };
    check(&q.metrics(0).unwrap());
    drop((q, side, hung, leased));
    let r = Reader::open(&f.path).unwrap();
    check(&r.metrics(0).unwrap());
    assert_eq!(r.check().unwrap(), vec![]);
}

/// Run times are kept a day, as the counts: a day later the next writes remove the old
/// buckets from the file.
#[test]
fn old_run_times_go_with_the_queues_next_commits() {
    let f = Fixture::new();
    let q = f.open();
    for ran in [1u64, 10, 100, 1_000, 10_000, 100_000] {
        q.enqueue(b"job", plain()).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        f.clock.advance(ms(ran));
        l.ack().unwrap();
    }
    q.flush().unwrap();
    let rows = |q: &Queue| {
        use redb::{ReadableDatabase, ReadableTableMetadata};
        const RUN_TIMES: redb::TableDefinition<(u32, u64, u8), u64> =
            redb::TableDefinition::new("leaseq_run_times");
        let rtx = q.database().begin_read().unwrap();
        rtx.open_table(RUN_TIMES).unwrap().len().unwrap()
    };
    assert_eq!(rows(&q), 6, "one bucket per run");
    f.clock.advance(secs(2 * 24 * 3600));
    q.enqueue(b"later", plain()).unwrap();
    assert_eq!(rows(&q), 0, "buckets older than a day are removed");
    let m = q.metrics(0).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].runs, m[0].run_ms_p50), (0, None));
}
