//! Rate limits (`Queue::set_rate_limit`). Goal: at most `max` deliveries per window over
//! every consumer (dequeue, batch, ack-and-next, a pool), waiting consumers sleep until the
//! window ends, the window survives a reopen, and bad limits write nothing. Method: a manual
//! clock, the public API, `check()`. A sliding window lets at most `max` into any span of
//! `per_ms`, where a fixed one lets up to twice that across two windows.

use crate::common::{Fixture, assert_consistent, enqueue_n, plain, secs};
use leaseq::{Error, RateLimit};
use std::time::Duration;

fn per_minute(max: u32) -> Option<RateLimit> {
    Some(RateLimit::new(max, secs(60)))
}

#[test]
fn a_window_delivers_at_most_its_max_then_the_next_window_more() {
    let f = Fixture::new();
    let q = f.open();
    assert!(q.set_rate_limit(per_minute(3)).unwrap());
    assert_eq!(q.rate_limit().unwrap(), per_minute(3));
    enqueue_n(&q, 10, plain());
    let first = q.dequeue_batch(10).unwrap();
    assert_eq!(first.len(), 3);
    assert!(q.dequeue().unwrap().is_none(), "used up");
    // Acks are not deliveries, and ack_and_next takes nothing past the limit.
    for l in first {
        assert!(l.ack_and_next().unwrap().is_none());
    }
    f.clock.advance(secs(59));
    assert!(q.dequeue().unwrap().is_none(), "still the same window");
    f.clock.advance(secs(1));
    let second = q.dequeue_batch(10).unwrap();
    assert_eq!(second.len(), 3, "a new window");
    for l in second {
        l.ack().unwrap();
    }
    assert!(q.dequeue().unwrap().is_none(), "3 taken already");
    f.clock.advance(secs(60));
    // ack_and_next within the window takes the next job while some is left.
    let mut taken = 0;
    let mut lease = q.dequeue().unwrap();
    while let Some(l) = lease {
        taken += 1;
        lease = l.ack_and_next().unwrap();
    }
    assert_eq!(taken, 3, "1 dequeue + 2 ack_and_next in the third window");
    assert_eq!(q.stats().unwrap().ready, 1);
    assert_consistent(&q);
}

/// Fixed and sliding alike: a consumer blocked on a used-up limit sleeps until a delivery
/// may go (the window's end, or the counted delivery leaving it), woken by the clock.
#[test]
fn a_waiting_consumer_sleeps_until_the_window_ends() {
    for limit in [RateLimit::new(1, secs(60)), RateLimit::sliding(1, secs(60))] {
        let f = Fixture::new();
        let q = f.open();
        q.set_rate_limit(Some(limit)).unwrap();
        enqueue_n(&q, 2, plain());
        q.dequeue().unwrap().unwrap().ack().unwrap();
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.dequeue_timeout(Duration::from_secs(20)).unwrap())
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished(), "{limit:?}: the window is used up");
        f.clock.advance(secs(60));
        let l = waiter.join().unwrap().expect("woken as a delivery may go");
        l.ack().unwrap();
        assert_consistent(&q);
    }
}

#[test]
fn the_window_survives_a_reopen() {
    let f = Fixture::new();
    {
        let q = f.open();
        q.set_rate_limit(per_minute(2)).unwrap();
        enqueue_n(&q, 5, plain());
        for l in q.dequeue_batch(5).unwrap() {
            l.ack().unwrap();
        }
    }
    let q = f.open();
    assert_eq!(q.rate_limit().unwrap(), per_minute(2));
    assert!(
        q.dequeue().unwrap().is_none(),
        "no fresh burst after a restart"
    );
    f.clock.advance(secs(60));
    assert_eq!(q.dequeue_batch(5).unwrap().len(), 2);
    assert_consistent(&q);
}

#[test]
fn a_pool_respects_the_limit() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(per_minute(5)).unwrap();
    enqueue_n(&q, 20, plain());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pool = {
        let done = std::sync::Arc::clone(&done);
        leaseq::WorkerPool::builder(&q)
            .threads(4)
            .start(move |_| {
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
            .unwrap()
    };
    let count = || done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(crate::common::eventually(|| count() == 5));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(count(), 5, "no more within the window");
    f.clock.advance(secs(60));
    assert!(crate::common::eventually(|| count() == 10));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(count(), 10);
    let report = pool.shutdown(Duration::from_secs(5));
    assert_eq!(report.stats.acked, 10, "{report:?}");
    assert_consistent(&q);
}

#[test]
fn limits_are_per_queue_and_changes_take_effect() {
    let f = Fixture::new();
    let q = f.open();
    let other = q.named("other").unwrap();
    q.set_rate_limit(per_minute(1)).unwrap();
    enqueue_n(&q, 3, plain());
    enqueue_n(&other, 3, plain());
    assert_eq!(
        other.dequeue_batch(3).unwrap().len(),
        3,
        "the other queue is not limited"
    );
    assert_eq!(q.dequeue_batch(3).unwrap().len(), 1);
    assert!(
        !q.set_rate_limit(per_minute(1)).unwrap(),
        "the same limit: no change"
    );
    assert!(q.dequeue().unwrap().is_none(), "and the window kept");
    assert!(q.set_rate_limit(per_minute(2)).unwrap());
    assert_eq!(
        q.dequeue_batch(3).unwrap().len(),
        2,
        "a new limit, a fresh window"
    );
    enqueue_n(&q, 1, plain());
    assert!(q.set_rate_limit(None).unwrap());
    assert!(!q.set_rate_limit(None).unwrap());
    assert_eq!(q.rate_limit().unwrap(), None);
    assert_eq!(q.dequeue_batch(3).unwrap().len(), 1, "unlimited");
    assert_consistent(&q);
}

#[test]
fn bad_limits_are_typed_errors_that_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let commits = q.commit_stats().commits;
    for bad in [
        RateLimit::new(0, secs(1)),
        RateLimit::new(1, Duration::ZERO),
        RateLimit::new(1, Duration::from_micros(500)),
        RateLimit::new(1, leaseq::DELAY_MAX + secs(1)),
    ] {
        match q.set_rate_limit(Some(bad)) {
            Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "rate_limit"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(q.commit_stats().commits, commits);
    assert_eq!(q.rate_limit().unwrap(), None);
}

#[test]
fn check_reports_a_window_past_its_limit() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(per_minute(2)).unwrap();
    let w = q.database().begin_write().unwrap();
    {
        let def: leaseq::redb::TableDefinition<u32, (u64, u64, u64, u64)> =
            leaseq::redb::TableDefinition::new("leaseq_rate_limits");
        w.open_table(def)
            .unwrap()
            .insert(0u32, (2, 60_000, crate::common::T0_MS, 7))
            .unwrap();
    }
    w.commit().unwrap();
    let v = q.check().unwrap();
    assert!(
        v.iter().any(|v| v.detail.contains("leaseq_rate_limits")),
        "{v:?}"
    );
}

/// Every 100 ms for `total_ms`: enqueues the step's arrivals (`arrivals` over and over),
/// then dequeues a batch of up to 10 and acks it. The clock times of the deliveries.
fn deliveries_over(f: &Fixture, q: &leaseq::Queue, arrivals: &[usize], total_ms: u64) -> Vec<u64> {
    let start = f.clock_now();
    let mut times = Vec::new();
    let mut i = 0;
    while f.clock_now() - start < total_ms {
        enqueue_n(q, arrivals[i % arrivals.len()], plain());
        for l in q.dequeue_batch(10).unwrap() {
            times.push(f.clock_now());
            l.ack().unwrap();
        }
        f.clock.advance(Duration::from_millis(100));
        i += 1;
    }
    times
}

/// The most deliveries in any span of `per_ms` (half-open, as a server's window).
fn busiest_span(times: &[u64], per_ms: u64) -> usize {
    times
        .iter()
        .map(|&t| times.iter().filter(|&&u| u >= t && u < t + per_ms).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn a_sliding_window_lets_at_most_max_into_any_span_where_a_fixed_one_lets_twice() {
    // Work arriving unevenly: a job at the start of each second, eight near its end.
    let arrivals = [1, 0, 0, 0, 0, 0, 0, 0, 0, 8];
    let limits = [
        (RateLimit::new(5, secs(1)), "fixed"),
        (RateLimit::sliding(5, secs(1)), "sliding"),
    ];
    let mut busiest = Vec::new();
    for (limit, name) in limits {
        let f = Fixture::new();
        let q = f.open();
        q.set_rate_limit(Some(limit)).unwrap();
        assert_eq!(q.rate_limit().unwrap(), Some(limit));
        let times = deliveries_over(&f, &q, &arrivals, 20_000);
        // Held back only by the limit: 9 arrive a second, close to 5 a second go.
        assert!(times.len() >= 90, "{name}: {} delivered", times.len());
        busiest.push(busiest_span(&times, 1_000));
        assert_consistent(&q);
    }
    assert!(
        busiest[0] > 5,
        "the fixed window lets more than 5 into one second: {busiest:?}"
    );
    assert_eq!(busiest[1], 5, "the sliding window never does");
}

#[test]
fn a_sliding_window_frees_one_delivery_as_each_leaves_it() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::sliding(3, secs(1))))
        .unwrap();
    enqueue_n(&q, 10, plain());
    let t0 = f.clock_now();
    assert_eq!(q.dequeue_batch(2).unwrap().len(), 2);
    f.clock.advance(Duration::from_millis(400));
    assert_eq!(
        q.dequeue_batch(10).unwrap().len(),
        1,
        "one left in the window"
    );
    assert_eq!(
        q.reader().rate_limited_until(f.clock_now()).unwrap(),
        Some(t0 + 1_000)
    );
    f.clock.advance(Duration::from_millis(599));
    assert!(
        q.dequeue().unwrap().is_none(),
        "1 ms before the first two leave"
    );
    f.clock.advance(Duration::from_millis(1));
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 2, "the first two left");
    assert_eq!(
        q.reader().rate_limited_until(f.clock_now()).unwrap(),
        Some(t0 + 1_400),
        "the one taken at 400 ms leaves next"
    );
    assert_consistent(&q);
}

#[test]
fn a_sliding_window_survives_a_reopen_and_a_clock_step_back() {
    let f = Fixture::new();
    let t0 = f.clock_now();
    {
        let q = f.open();
        q.set_rate_limit(Some(RateLimit::sliding(2, secs(10))))
            .unwrap();
        enqueue_n(&q, 10, plain());
        assert_eq!(q.dequeue_batch(1).unwrap().len(), 1);
        f.clock.advance(secs(4));
        assert_eq!(q.dequeue_batch(5).unwrap().len(), 1);
    }
    let q = f.open();
    assert_eq!(
        q.rate_limit().unwrap(),
        Some(RateLimit::sliding(2, secs(10)))
    );
    // The open returned both leases; the log still counts both deliveries.
    assert!(
        q.dequeue().unwrap().is_none(),
        "no fresh burst after a restart"
    );
    assert_eq!(
        q.reader().rate_limited_until(f.clock_now()).unwrap(),
        Some(t0 + 10_000)
    );
    // A clock stepping back a little keeps the log: the deliveries still count.
    f.clock.set_ms(t0 + 1_000);
    assert!(q.dequeue().unwrap().is_none());
    // A whole window back, the log says nothing about now: it starts again.
    f.clock.set_ms(t0 + 4_000 - 10_000);
    assert_eq!(q.dequeue_batch(5).unwrap().len(), 2);
    assert_consistent(&q);
}

#[test]
fn changing_a_sliding_limit_keeps_what_it_counted_and_other_changes_start_fresh() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 40, plain());
    q.set_rate_limit(Some(RateLimit::sliding(4, secs(60))))
        .unwrap();
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 4);
    assert!(
        !q.set_rate_limit(Some(RateLimit::sliding(4, secs(60))))
            .unwrap()
    );
    // Raised: only the room above the 4 counted.
    assert!(
        q.set_rate_limit(Some(RateLimit::sliding(6, secs(60))))
            .unwrap()
    );
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 2);
    // Lowered: the newest 3 still count, no burst.
    assert!(
        q.set_rate_limit(Some(RateLimit::sliding(3, secs(60))))
            .unwrap()
    );
    assert!(q.dequeue().unwrap().is_none());
    assert_consistent(&q);
    // A fixed limit replacing it starts a fresh window; a sliding one replacing that starts
    // with an empty log.
    assert!(q.set_rate_limit(per_minute(2)).unwrap());
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 2);
    assert!(
        q.set_rate_limit(Some(RateLimit::sliding(3, secs(60))))
            .unwrap()
    );
    assert_eq!(
        q.rate_limit().unwrap(),
        Some(RateLimit::sliding(3, secs(60)))
    );
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 3);
    assert_consistent(&q);
    assert!(q.set_rate_limit(None).unwrap());
    assert_eq!(q.dequeue_batch(10).unwrap().len(), 10, "unlimited");
    assert_consistent(&q);
}

#[test]
fn a_sliding_limit_above_its_bound_is_refused_and_writes_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let commits = q.commit_stats().commits;
    match q.set_rate_limit(Some(RateLimit::sliding(
        leaseq::SLIDING_LIMIT_MAX + 1,
        secs(1),
    ))) {
        Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "rate_limit"),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.commit_stats().commits, commits);
    assert_eq!(q.rate_limit().unwrap(), None);
    // The bound itself is accepted, and a fixed window has none.
    let at_bound = RateLimit::sliding(leaseq::SLIDING_LIMIT_MAX, secs(1));
    assert!(q.set_rate_limit(Some(at_bound)).unwrap());
    let fixed = RateLimit::new(leaseq::SLIDING_LIMIT_MAX + 1, secs(1));
    assert!(q.set_rate_limit(Some(fixed)).unwrap());
}

#[test]
fn check_reports_a_sliding_log_that_disagrees_with_its_limit() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::sliding(3, secs(60))))
        .unwrap();
    enqueue_n(&q, 3, plain());
    assert_eq!(q.dequeue_batch(3).unwrap().len(), 3);
    assert_consistent(&q);
    let w = q.database().begin_write().unwrap();
    {
        let def: leaseq::redb::TableDefinition<(u32, u64), u64> =
            leaseq::redb::TableDefinition::new("leaseq_rate_log");
        w.open_table(def)
            .unwrap()
            .insert((0u32, crate::common::T0_MS - 5), 1)
            .unwrap();
    }
    w.commit().unwrap();
    let v = q.check().unwrap();
    assert!(
        v.iter().any(|v| v.detail.contains("leaseq_rate_log")),
        "{v:?}"
    );
}

/// A sliding limit's count damaged above what its log holds does not hold the queue back
/// for good: the dequeue counts from the log's rows, and its charge rewrites the count.
#[test]
fn a_damaged_sliding_count_is_rewritten_from_the_log_not_obeyed() {
    let f = Fixture::new();
    let q = f.open();
    q.set_rate_limit(Some(RateLimit::sliding(3, secs(60))))
        .unwrap();
    enqueue_n(&q, 5, plain());
    assert_eq!(q.dequeue_batch(1).unwrap().len(), 1);
    let w = q.database().begin_write().unwrap();
    {
        let def: leaseq::redb::TableDefinition<u32, (u64, u64, u64, u64)> =
            leaseq::redb::TableDefinition::new("leaseq_sliding_limits");
        let mut t = w.open_table(def).unwrap();
        let (max, per, _, last) = leaseq::redb::ReadableTable::get(&t, 0u32)
            .unwrap()
            .unwrap()
            .value();
        t.insert(0u32, (max, per, 9, last)).unwrap();
    }
    w.commit().unwrap();
    assert!(
        q.check()
            .unwrap()
            .iter()
            .any(|v| v.detail.contains("leaseq_rate_log")),
        "check() reports the count"
    );
    assert_eq!(
        q.dequeue_batch(5).unwrap().len(),
        2,
        "one counted, two left"
    );
    assert_consistent(&q);
}
