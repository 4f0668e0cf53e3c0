//! The sliding-window rate limit's rows (since format 15): a queue's limit in
//! `leaseq_sliding_limits` as `(max, per_ms, logged, last_at_ms)`, and the deliveries it
//! counts in `leaseq_rate_log` as `(queue number, at_ms) → count`.
//!
//! - `max`: deliveries allowed in any window of `per_ms` (1 to
//!   [`SLIDING_LIMIT_MAX`](crate::limits::SLIDING_LIMIT_MAX)).
//! - `logged`: the sum of the queue's log counts (expired rows not yet removed included); at
//!   most `max` after every commit, since a dequeue removes the expired rows before it adds.
//! - `last_at_ms`: the newest log row's time (0 with an empty log). Deliveries are logged at
//!   `max(now, last_at_ms)`, so the log stays in time order when the clock steps back.
//!
//! A delivery logged at `at_ms` counts while `now < at_ms + per_ms`. The log is cleared when
//! the clock is a whole window before its last delivery (as the fixed window restarts then).

/// The stored limit row: (max, per_ms, logged, last_at_ms).
pub(crate) type SlidingRow = (u64, u64, u64, u64);

/// The time a delivery made at `now_ms` is logged at: never before the newest logged one.
pub(crate) fn log_at(row: SlidingRow, now_ms: u64) -> u64 {
    now_ms.max(row.3)
}

/// Whether a delivery logged at `at_ms` has left the window at `now_ms`.
pub(crate) fn expired(at_ms: u64, per_ms: u64, now_ms: u64) -> bool {
    at_ms.saturating_add(per_ms) <= now_ms
}

/// The newest time a log row may have and be expired at `now_ms` (`None`: none can be).
pub(crate) fn expired_through(per_ms: u64, now_ms: u64) -> Option<u64> {
    now_ms.checked_sub(per_ms)
}

/// Whether the clock went back a whole window before the newest delivery: the log no longer
/// says anything about the window ending at `now_ms`, and is cleared.
pub(crate) fn stale(row: SlidingRow, now_ms: u64) -> bool {
    row.2 > 0 && now_ms.saturating_add(row.1) <= row.3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_counts_for_exactly_one_window() {
        assert!(!expired(1_000, 500, 1_499));
        assert!(expired(1_000, 500, 1_500));
        assert_eq!(expired_through(500, 1_500), Some(1_000));
        assert_eq!(expired_through(500, 499), None);
        assert!(!expired(0, 500, 499), "a delivery at 0 ms counts");
    }

    #[test]
    fn the_log_keeps_time_order_and_clears_when_the_clock_goes_back_a_window() {
        let row = (5, 1_000, 2, 10_000);
        assert_eq!(log_at(row, 9_500), 10_000);
        assert_eq!(log_at(row, 10_200), 10_200);
        assert!(!stale(row, 9_001));
        assert!(stale(row, 9_000));
        assert!(
            !stale((5, 1_000, 0, 10_000), 0),
            "an empty log is never stale"
        );
    }
}
