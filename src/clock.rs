//! Time source for leases, delays and deadlines.
//!
//! Every deadline leaseq stores is a Unix timestamp in milliseconds read from a [`Clock`].
//! A clock that steps back only makes leases last longer (a deadline in the future stays in
//! the future); it never makes a job due early.

use std::fmt::{self, Debug};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::signal::QueueSignals;

/// A source of the current time, in Unix milliseconds.
///
/// Implementations must be cheap and thread-safe: leaseq calls `now_ms` on every operation.
///
/// A clock may jump (a [`ManualClock`] advanced in a test, a wall clock stepped by NTP on a
/// box that booted without a real-time clock). A consumer blocked in
/// [`Queue::dequeue_timeout`](crate::Queue::dequeue_timeout) waiting for a due time
/// re-reads the clock at least every [`DUE_RECHECK_MAX`](crate::DUE_RECHECK_MAX) (250 ms),
/// so work made due by a jump is seen within that; a clock that can tell when it jumps
/// wakes such consumers at once through [`Clock::subscribe`].
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current time as milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Called once by every queue opened with this clock: a clock that moves in jumps calls
    /// [`ClockWaker::wake`] on each waker after every jump, so that consumers blocked waiting
    /// for a due time look again at once. The default keeps nothing: blocked consumers then
    /// notice a jump within [`DUE_RECHECK_MAX`](crate::DUE_RECHECK_MAX).
    fn subscribe(&self, waker: ClockWaker) {
        let _ = waker;
    }
}

/// Wakes the blocked consumers of one queue when its clock jumps; handed to
/// [`Clock::subscribe`]. Holds the queue weakly: once the queue is closed, `wake` returns
/// `false` and the clock may drop the waker.
#[derive(Clone)]
pub struct ClockWaker(Weak<QueueSignals>);

impl ClockWaker {
    pub(crate) fn new(work: &Arc<QueueSignals>) -> ClockWaker {
        ClockWaker(Arc::downgrade(work))
    }

    /// Wakes the queue's consumers blocked in `dequeue_timeout` so they read the clock
    /// again. Returns `false` if the queue is gone (nothing to wake, now or later).
    pub fn wake(&self) -> bool {
        match self.0.upgrade() {
            Some(work) => {
                work.notify_all();
                true
            }
            None => false,
        }
    }
}

impl Debug for ClockWaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClockWaker")
            .field("queue_open", &(self.0.strong_count() > 0))
            .finish()
    }
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
/// [`advance`](ManualClock::advance) and [`set_ms`](ManualClock::set_ms) wake every consumer
/// blocked in `dequeue_timeout` on a queue using this clock, so a job made due by the jump is
/// delivered at once.
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
    /// One per queue opened with this clock (or a clone); closed queues' are pruned.
    wakers: Arc<Mutex<Vec<ClockWaker>>>,
}

impl ManualClock {
    /// A clock reading `start_ms` (Unix milliseconds).
    pub fn new(start_ms: u64) -> ManualClock {
        ManualClock {
            now_ms: Arc::new(AtomicU64::new(start_ms)),
            wakers: Arc::default(),
        }
    }

    /// Wakes the blocked consumers of every open queue using this clock; forgets closed ones.
    fn wake_all(&self) {
        self.wakers.lock().retain(ClockWaker::wake);
    }

    /// Moves the clock forward by `by` (whole milliseconds; saturates at `u64::MAX`).
    pub fn advance(&self, by: Duration) {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let _ = self
            .now_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by_ms))
            });
        self.wake_all();
    }

    /// Sets the clock to `now_ms` (Unix milliseconds); it may step back.
    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
        self.wake_all();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn subscribe(&self, waker: ClockWaker) {
        let mut wakers = self.wakers.lock();
        // Bounded by the queues open at once: closed queues' wakers go here and on a jump.
        wakers.retain(|w| w.0.strong_count() > 0);
        wakers.push(waker);
    }
}

/// `d` in whole milliseconds, saturating.
pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
