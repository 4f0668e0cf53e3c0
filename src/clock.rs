//! Time source for leases, delays and deadlines.
//!
//! Every deadline leaseq stores is a Unix timestamp in milliseconds read from a [`Clock`].
//! A clock that steps back only makes leases last longer (a deadline in the future stays in
//! the future); it never makes a job due early.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time, in Unix milliseconds.
///
/// Implementations must be cheap and thread-safe: leaseq calls `now_ms` on every operation.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current time as milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The wall clock ([`SystemTime::now`]). The default.
///
/// A system time before the Unix epoch reads as 0.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to: for tests of leases, delays and expiry.
///
/// Clones share one time, so a test keeps a clone and hands another to the queue builder.
///
/// ```
/// use leaseq::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::new(1_000);
/// let shared = clock.clone();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(shared.now_ms(), 3_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start_ms` (Unix milliseconds).
    pub fn new(start_ms: u64) -> ManualClock {
        ManualClock {
            now_ms: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// Moves the clock forward by `by` (whole milliseconds; saturates at `u64::MAX`).
    pub fn advance(&self, by: Duration) {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let _ = self
            .now_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by_ms))
            });
    }

    /// Sets the clock to `now_ms` (Unix milliseconds); it may step back.
    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// `d` in whole milliseconds, saturating.
pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
