//! A stop signal for consumers blocked in [`Queue::dequeue_until`](crate::Queue::dequeue_until).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::limits::WATCHED_MAX;
use crate::signal::WakeSignal;

/// A flag that stops [`Queue::dequeue_until`](crate::Queue::dequeue_until) calls: once
/// [`stop`](StopSignal::stop) is called, every call waiting on it returns `Ok(None)` at once
/// and later ones return `Ok(None)` without dequeuing. Cheap to clone (clones share the flag);
/// `Send + Sync`. It affects only the calls given it, not the file or other consumers (unlike
/// [`Queue::close`](crate::Queue::close)). Once stopped it stays stopped.
#[derive(Clone, Default)]
pub struct StopSignal {
    inner: Arc<StopInner>,
}

#[derive(Default)]
struct StopInner {
    stopped: AtomicBool,
    /// The wake-ups of the queues waited on with this signal, so `stop` can wake them.
    watched: Mutex<Vec<Weak<WakeSignal>>>,
}

impl fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopSignal")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

impl StopSignal {
    /// A signal not yet stopped.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Stops: wakes every `dequeue_until` waiting on this signal (they return `Ok(None)`).
    /// Calling it again is a no-op.
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let watched: Vec<Arc<WakeSignal>> = self
            .inner
            .watched
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        watched.iter().for_each(|s| s.notify());
    }

    /// Whether [`stop`](StopSignal::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// Remembers a queue's wake-up, so `stop` wakes the consumers blocked on it. Called
    /// before the waiter reads the flag, so a stop in between is not missed.
    pub(crate) fn watch(&self, signal: &Arc<WakeSignal>) {
        let mut watched = self.inner.watched.lock();
        if watched.iter().any(|w| w.as_ptr() == Arc::as_ptr(signal)) {
            return;
        }
        if watched.len() >= WATCHED_MAX {
            watched.retain(|w| w.strong_count() > 0);
            if watched.len() >= WATCHED_MAX {
                watched.remove(0);
            }
        }
        watched.push(Arc::downgrade(signal));
    }
}
