//! Per-minute metrics (`Queue::metrics`, `Reader::metrics`): every committed change counted
//! once, in the minute of its commit, as the change events report it; nothing counted for a
//! refused call or an aborted group; 24 hours kept, older minutes pruned; the same numbers
//! through a reader. Method: a mixed workload on two queues under a manual clock, its event
//! streams counted beside it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{Fixture, assert_consistent, plain, secs};
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
