//! The pool's heartbeat: one thread that extends the lease of every running job at its
//! interval, through the job's [`Heartbeat`] handle.
//!
//! A job's beat is registered before its handler runs and removed after the job's final
//! commit returned (by its worker, or by the shutdown that gave it back). The thread sleeps
//! on a condition variable until the earliest due beat (or without end when no job runs):
//! no polling. An extend runs with the registry unlocked, so a slow commit never blocks a
//! worker registering or removing a beat. A beat whose extend returns `LeaseLost` is dropped
//! (the attempt ended elsewhere: the core writes nothing for it).
//!
//! The same thread ends a job that runs past its execution timeout (the job's own, else the
//! pool's [`PoolBuilder::job_timeout`](super::PoolBuilder::job_timeout)): its beats stop and
//! its delivery ends through the [`Heartbeat`] (given back or dead), which fences the
//! handler's late ack.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The job's execution timeout (its own, else the pool's), if it has one.
    timeout: Option<Timeout>,
}

/// A running job's execution timeout: when it ends the delivery, and how.
pub(super) struct Timeout {
    /// When the handler's time is up.
    pub at: Instant,
    /// The timeout it was given (for the reason recorded in the job).
    pub after: Duration,
    pub action: super::OnTimeout,
    /// Set when the timeout ended the delivery: the handler's
    /// [`is_timed_out`](super::is_timed_out), and its worker's cue not to commit.
    pub flag: Arc<AtomicBool>,
}

impl Beat {
    /// The beat's next event: its extend, or its timeout if earlier.
    fn next_event(&self) -> Instant {
        self.timeout
            .as_ref()
            .map_or(self.due, |t| t.at.min(self.due))
    }
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
    /// Starts beating `lease` (before its handler runs): first extend after `every`, and the
    /// delivery ended at `timeout.at` if it still runs then.
    pub(super) fn start(
        &self,
        lease: &Lease,
        extend: Duration,
        every: Duration,
        timeout: Option<Timeout>,
    ) {
        let now = Instant::now();
        let due = now.checked_add(every).unwrap_or(now);
        let beat = Beat {
            heartbeat: lease.heartbeat(),
            extend,
            every,
            due,
            timeout,
        };
        let event = beat.next_event();
        let mut st = self.state.lock();
        st.jobs.insert(lease.token(), beat);
        if st.next_look.is_none_or(|t| event < t) {
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
                .min_by_key(|(_, b)| b.next_event())
                .map(|(token, b)| (*token, b.next_event()));
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
            let timed_out = st
                .jobs
                .get(&token)
                .and_then(|b| b.timeout.as_ref())
                .is_some_and(|t| t.at <= now);
            if timed_out {
                self.time_out(&mut st, token, counters);
            } else {
                self.beat(&mut st, token, now, counters);
            }
        }
    }

    /// Ends the delivery `token` whose handler ran past its timeout (its beats stop), with
    /// the registry unlocked during the commit: given back through the retry policy, or
    /// dead, as the pool says. Its handler runs on (a thread cannot be stopped); the flag
    /// tells it, and its worker does not commit.
    fn time_out(&self, st: &mut MutexGuard<'_, State>, token: u64, c: &PoolCounters) {
        let Some(Beat {
            heartbeat,
            timeout: Some(timeout),
            ..
        }) = st.jobs.remove(&token)
        else {
            return;
        };
        timeout.flag.store(true, Ordering::SeqCst);
        let reason = format!("timed out after {} ms", timeout.after.as_millis());
        let r = MutexGuard::unlocked(st, || match timeout.action {
            super::OnTimeout::Retry => heartbeat.nack(&reason).map(drop),
            super::OnTimeout::Fail => heartbeat.fail(&reason),
        });
        match r {
            Ok(()) => PoolCounters::add(&c.timed_out),
            // The job's own commit won the race, or it was cancelled: nothing to end.
            Err(Error::LeaseLost { .. } | Error::Cancelled { .. }) => {}
            Err(e) => {
                PoolCounters::add(&c.errors);
                tracing::warn!(job = heartbeat.job_id().0, error = %e, "leaseq pool: ending a timed-out job failed");
            }
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
                c.heartbeat_landed();
                if let Some(b) = st.jobs.get_mut(&token) {
                    b.due = now.checked_add(every).unwrap_or(now);
                }
            }
            // The delivery ended: its beats stop.
            Err(Error::LeaseLost { .. }) => {
                PoolCounters::add(&c.heartbeats_lost);
                st.jobs.remove(&token);
            }
            // Cancelled while its handler runs: the beats go on until the handler returns,
            // so an ordered group waits for it (each beat moves the group's wait; without a
            // group it writes nothing).
            Err(Error::Cancelled { .. }) => {
                if let Some(b) = st.jobs.get_mut(&token) {
                    b.due = now.checked_add(every).unwrap_or(now);
                }
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
