//! Wake-ups for blocked consumers: one [`WakeSignal`] per queue, kept by [`QueueSignals`]. A
//! leaf: the committer bumps a queue's signal after a commit that made work available in it,
//! the clock bumps them all when it jumps, and a `StopSignal` bumps the ones it was waited on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// What blocked consumers wait on, one [`WakeSignal`] per queue of the file (by number): a queue's
/// is bumped after every commit that made work available in it; all are bumped whenever the
/// queue's clock jumps (a [`ManualClock`](crate::ManualClock) advanced).
#[derive(Debug, Default)]
pub(crate) struct QueueSignals {
    queues: Mutex<HashMap<u32, Arc<WakeSignal>>>,
}

impl QueueSignals {
    /// The signal of queue `queue_number`.
    pub(crate) fn of(&self, queue_number: u32) -> Arc<WakeSignal> {
        self.queues.lock().entry(queue_number).or_default().clone()
    }

    /// Wakes the consumers of queue `queue_number`.
    pub(crate) fn notify(&self, queue_number: u32) {
        let signal = self.queues.lock().get(&queue_number).cloned();
        if let Some(s) = signal {
            s.notify();
        }
    }

    /// Wakes the consumers of every queue.
    pub(crate) fn notify_all(&self) {
        let all: Vec<Arc<WakeSignal>> = self.queues.lock().values().cloned().collect();
        all.iter().for_each(|s| s.notify());
    }
}

/// One queue's wake-up: an epoch and the consumers blocked on it.
#[derive(Debug, Default)]
pub(crate) struct WakeSignal {
    epoch: Mutex<u64>,
    cv: Condvar,
}

impl WakeSignal {
    pub(crate) fn notify(&self) {
        *self.epoch.lock() += 1;
        self.cv.notify_all();
    }

    pub(crate) fn epoch(&self) -> u64 {
        *self.epoch.lock()
    }

    /// Blocks until the epoch moves past `epoch`, or `timeout` passes.
    pub(crate) fn wait(&self, epoch: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut e = self.epoch.lock();
        while *e == epoch {
            if self.cv.wait_until(&mut e, deadline).timed_out() {
                return;
            }
        }
    }
}
