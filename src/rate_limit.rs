//! A queue's rate limit: [`RateLimit`] caps a queue's deliveries per window across all its
//! consumers, in a fixed window (as BullMQ's limiter) or a sliding one (as a server's "N per
//! second over any second"); stored in the file with the queue
//! ([`Queue::set_rate_limit`](crate::Queue::set_rate_limit)). The `Queue` calls are
//! `queue/controls.rs`; the engine's side is `store/rate_limit.rs`.

/// At most `max` deliveries per `per_ms`, counted over every consumer of the queue (every
/// handle, thread, pool and async task of the process), in the kind of window `window` says:
///
/// - [`RateWindow::Fixed`] ([`RateLimit::new`]), as BullMQ's limiter (`{ max, duration }`):
///   a window starts at the first delivery after the last one ended and takes `max`
///   deliveries. Cheap (one row), but two windows meet: up to `2 × max` deliveries can fall
///   within one span of `per_ms` across their boundary.
/// - [`RateWindow::Sliding`] ([`RateLimit::sliding`]): at most `max` deliveries in *any* span
///   of `per_ms`, as a server counts "5 requests per second" over every second (the sliding
///   log algorithm of rate limiting).
///   The file logs each millisecond's deliveries (at most `max` rows, hence
///   [`SLIDING_LIMIT_MAX`](crate::SLIDING_LIMIT_MAX)). A delivery is counted from the
///   dequeue that made it: a worker's delay before its call to the server passes on to the
///   server, so leave a margin ([`Queue::set_rate_limit`](crate::Queue::set_rate_limit)
///   says how it counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Deliveries per window (at least 1; a sliding window at most
    /// [`SLIDING_LIMIT_MAX`](crate::SLIDING_LIMIT_MAX)).
    pub max: u32,
    /// The window, in ms (1 ms to [`DELAY_MAX`](crate::DELAY_MAX)).
    pub per_ms: u64,
    /// Fixed or sliding.
    pub window: RateWindow,
}

/// How a [`RateLimit`] counts its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateWindow {
    /// A window of `per_ms` from the first delivery after the last window ended, as BullMQ's
    /// limiter.
    #[default]
    Fixed,
    /// Every span of `per_ms`: a delivery counts for `per_ms` after the dequeue that made it.
    Sliding,
}

impl RateWindow {
    /// `"fixed"` or `"sliding"`, as JSON and the tool write it.
    pub fn as_str(self) -> &'static str {
        match self {
            RateWindow::Fixed => "fixed",
            RateWindow::Sliding => "sliding",
        }
    }
}

impl RateLimit {
    /// At most `max` deliveries per fixed window of `per` (whole ms), as BullMQ's limiter.
    /// Checked by [`Queue::set_rate_limit`](crate::Queue::set_rate_limit).
    pub fn new(max: u32, per: std::time::Duration) -> RateLimit {
        RateLimit {
            max,
            per_ms: crate::clock::duration_ms(per),
            window: RateWindow::Fixed,
        }
    }

    /// At most `max` deliveries in any span of `per` (whole ms): a sliding window, for a
    /// server that counts its limit over every span. Checked by
    /// [`Queue::set_rate_limit`](crate::Queue::set_rate_limit) (`max` at most
    /// [`SLIDING_LIMIT_MAX`](crate::SLIDING_LIMIT_MAX)).
    pub fn sliding(max: u32, per: std::time::Duration) -> RateLimit {
        RateLimit {
            window: RateWindow::Sliding,
            ..RateLimit::new(max, per)
        }
    }
}
