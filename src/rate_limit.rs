//! A queue's rate limit: [`RateLimit`] caps a queue's deliveries per window across all its
//! consumers, as BullMQ's limiter; stored in the file with the queue
//! ([`Queue::set_rate_limit`](crate::Queue::set_rate_limit)). The `Queue` calls are
//! `queue/controls.rs`; the engine's side is `store/rate_limit.rs`.

/// At most `max` deliveries in any window of `per_ms`, counted over every consumer of the
/// queue (every handle, thread, pool and async task of the process), as BullMQ's limiter
/// (`{ max, duration }`): a fixed window that starts at the first delivery after the last
/// window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Deliveries per window (at least 1).
    pub max: u32,
    /// The window, in ms (1 ms to [`DELAY_MAX`](crate::DELAY_MAX)).
    pub per_ms: u64,
}

impl RateLimit {
    /// At most `max` deliveries per `per` (whole ms). Checked by
    /// [`Queue::set_rate_limit`](crate::Queue::set_rate_limit).
    pub fn new(max: u32, per: std::time::Duration) -> RateLimit {
        RateLimit {
            max,
            per_ms: crate::clock::duration_ms(per),
        }
    }
}
