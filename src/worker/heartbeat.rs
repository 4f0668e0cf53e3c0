//! The pool's heartbeat: one thread that extends the lease of every running job at its
//! interval, through the job's [`Heartbeat`] handle.
//!
//! A job's beat is registered before its handler runs and removed after the job's final
//! commit returned (by its worker, or by the shutdown that gave it back). The thread sleeps
//! on a condition variable until the earliest due beat (or without end when no job runs):
//! no polling. An extend runs with the registry unlocked, so a slow commit never blocks a
//! worker registering or removing a beat. A beat whose extend returns `LeaseLost` is dropped
//! (the attempt ended elsewhere: the core writes nothing for it).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::PoolCounters;
use crate::{Error, Heartbeat, LEASE_MAX, Lease};

const MS: Duration = Duration::from_millis(1);

/// Every beat of the pool, and the thread's wake-up.
#[derive(Default)]
pub(super) struct Beats {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Beats by the lease token of the delivery they extend (unique in the file).
    jobs: HashMap<u64, Beat>,
    /// Set at shutdown, once the workers are done: the thread ends when no beat is left.
    exit: bool,
    /// When the thread will look at the beats again on its own; `None` while it waits for a
    /// notification only. A new beat due earlier notifies it.
    next_look: Option<Instant>,
}

struct Beat {
    heartbeat: Heartbeat,
    /// How far each extend moves the deadline (from the extend's own now).
    extend: Duration,
    /// Time between two extends.
    every: Duration,
    due: Instant,
}

/// How far a heartbeat extends `lease`, and how often: the configured values, else the
/// delivery's own lease and a third of it. Both at least 1 ms; the extend at most
/// [`LEASE_MAX`]; the interval at most half the extend (a job whose own lease is shorter than
/// the configured interval is still kept: one late beat never loses it).
pub(super) fn timing(
    lease: &Lease,
    every: Option<Duration>,
    extend: Option<Duration>,
) -> (Duration, Duration) {
    let extend = extend
        .unwrap_or(Duration::from_millis(lease.lease_ms()))
        .clamp(MS, LEASE_MAX);
    let every = every.unwrap_or(extend / 3).min(extend / 2).max(MS);
    (extend, every)
}

impl Beats {
    /// Starts beating `lease` (before its handler runs): first extend after `every`.
    pub(super) fn start(&self, lease: &Lease, extend: Duration, every: Duration) {
        let now = Instant::now();
        let due = now.checked_add(every).unwrap_or(now);
        let beat = Beat {
            heartbeat: lease.heartbeat(),
            extend,
            every,
            due,
        };
        let mut st = self.state.lock();
        st.jobs.insert(lease.token(), beat);
        if st.next_look.is_none_or(|t| due < t) {
            self.cv.notify_one();
        }
    }

    /// Stops beating the delivery with `token` (after its final commit returned). An extend
    /// already under way for it finishes and, the attempt having ended, gets `LeaseLost`.
    pub(super) fn stop(&self, token: u64) {
        self.state.lock().jobs.remove(&token);
    }

    /// Tells the thread to end once no beat is left; returns whether none is left now (then
    /// the thread ends at once and can be joined).
    pub(super) fn exit(&self) -> bool {
        let mut st = self.state.lock();
        st.exit = true;
        self.cv.notify_all();
        st.jobs.is_empty()
    }

    /// The heartbeat thread's body.
    pub(super) fn run(&self, counters: &PoolCounters) {
        let mut st = self.state.lock();
        loop {
            if st.exit && st.jobs.is_empty() {
                return;
            }
            let now = Instant::now();
            let earliest = st
                .jobs
                .iter()
                .min_by_key(|(_, b)| b.due)
                .map(|(token, b)| (*token, b.due));
            let Some((token, due)) = earliest else {
                st.next_look = None;
                self.cv.wait(&mut st);
                continue;
            };
            if due > now {
                st.next_look = Some(due);
                self.cv.wait_until(&mut st, due);
                continue;
            }
            st.next_look = Some(now);
            self.beat(&mut st, token, now, counters);
        }
    }

    /// One extend of the beat `token`, with the registry unlocked during the commit.
    fn beat(&self, st: &mut MutexGuard<'_, State>, token: u64, now: Instant, c: &PoolCounters) {
        let Some(b) = st.jobs.get(&token) else {
            return;
        };
        let (heartbeat, extend, every) = (b.heartbeat.clone(), b.extend, b.every);
        let r = MutexGuard::unlocked(st, || heartbeat.extend(extend));
        match r {
            Ok(_) => {
                PoolCounters::add(&c.heartbeats);
                if let Some(b) = st.jobs.get_mut(&token) {
                    b.due = now.checked_add(every).unwrap_or(now);
                }
            }
            // The delivery ended, or was cancelled: its beats stop.
            Err(Error::LeaseLost { .. } | Error::Cancelled { .. }) => {
                PoolCounters::add(&c.heartbeats_lost);
                st.jobs.remove(&token);
            }
            Err(e) => {
                // The lease is as it was (a refused or failed extend writes nothing): try
                // again sooner than the interval, while some of the lease is left.
                PoolCounters::add(&c.errors);
                tracing::warn!(job = heartbeat.job_id().0, error = %e, "leaseq pool: heartbeat failed");
                if let Some(b) = st.jobs.get_mut(&token) {
                    let again = Instant::now();
                    b.due = again.checked_add((every / 4).max(MS)).unwrap_or(again);
                }
            }
        }
    }
}
