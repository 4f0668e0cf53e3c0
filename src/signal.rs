//! Wake-ups for blocked consumers: one [`WakeSignal`] per queue, kept by [`QueueSignals`]. A
//! leaf: the committer bumps a queue's signal after a commit that made work available in it,
//! the clock bumps them all when it jumps, and a `StopSignal` bumps the ones it was waited on.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::Waker;
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

/// One queue's wake-up: an epoch and the consumers blocked on it: threads on the condition
/// variable, async tasks by their [`Waker`] (registered while they wait, woken once).
#[derive(Debug, Default)]
pub(crate) struct WakeSignal {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct State {
    epoch: u64,
    /// The wakers of the async waits now pending, by their key; as many as the app has
    /// waiting futures (each removes its own when dropped).
    wakers: HashMap<u64, Waker>,
    next_key: u64,
}

impl WakeSignal {
    pub(crate) fn notify(&self) {
        let wakers = {
            let mut st = self.state.lock();
            st.epoch += 1;
            std::mem::take(&mut st.wakers)
        };
        self.cv.notify_all();
        wakers.into_values().for_each(Waker::wake);
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.state.lock().epoch
    }

    /// Blocks until the epoch moves past `epoch`, or `timeout` passes.
    pub(crate) fn wait(&self, epoch: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        while st.epoch == epoch {
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                return;
            }
        }
    }

    /// For an async wait: `true` if the epoch moved past `epoch`; otherwise `waker` is
    /// woken at the next notify (under `key`, assigned at the first registration and
    /// replacing the waker an earlier poll left).
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn moved_or_register(
        &self,
        epoch: u64,
        key: &mut Option<u64>,
        waker: &Waker,
    ) -> bool {
        let mut st = self.state.lock();
        if st.epoch != epoch {
            return true;
        }
        let k = *key.get_or_insert_with(|| {
            st.next_key += 1;
            st.next_key
        });
        match st.wakers.get_mut(&k) {
            Some(w) if w.will_wake(waker) => {}
            _ => {
                st.wakers.insert(k, waker.clone());
            }
        }
        false
    }

    /// Forgets the waker registered under `key` (an async wait that ended or was dropped).
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn unregister(&self, key: u64) {
        self.state.lock().wakers.remove(&key);
    }
}
