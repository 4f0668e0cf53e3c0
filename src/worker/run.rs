//! One worker thread: take a job, run its handler, end the job in one commit that also takes
//! the next one; wait on the queue's wake-up when there is nothing to do.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use super::{
    ERROR_BACKOFF_MAX, ERROR_BACKOFF_MIN, Effect, Handler, Outcome, PoolCounters, PoolState,
    WorkerSlot,
};
use crate::{Applied, BoxError, Error, JobState, Lease, Result};

/// What a worker holds of its own, and drops before it says it exited: a pool whose workers
/// all exited holds no handle to the file (not even through its handler's captures).
pub(super) struct Own {
    pub(super) queue: crate::Queue,
    pub(super) handler: Arc<Handler>,
}

/// The worker thread's body.
pub(super) fn worker(shared: &PoolState, index: usize, own: Own) {
    let Own { queue, handler } = own;
    let mut next: Option<Lease> = None;
    let mut backoff = ERROR_BACKOFF_MIN;
    loop {
        let lease = match next.take() {
            Some(lease) => lease,
            None => {
                if shared.stop.is_stopped() {
                    break;
                }
                PoolCounters::add(&shared.counters.polls);
                match queue.dequeue_until(shared.idle_timeout, &shared.stop) {
                    Ok(Some(lease)) => {
                        backoff = ERROR_BACKOFF_MIN;
                        lease
                    }
                    Ok(None) => continue,
                    // The app closed the file to new work: nothing more to take.
                    Err(Error::Closed) => break,
                    Err(e) => {
                        PoolCounters::add(&shared.counters.errors);
                        tracing::warn!(error = %e, "leaseq pool: dequeue failed");
                        shared.gate.sleep(backoff, &shared.stop);
                        backoff = (backoff * 2).min(ERROR_BACKOFF_MAX);
                        continue;
                    }
                }
            }
        };
        if shared.stop.is_stopped() {
            // Taken as the stop came (a dequeue or an ack-and-next racing it): never started,
            // so given back without charging the attempt.
            return_unstarted(shared, &lease);
            break;
        }
        next = process(shared, &handler, &queue, index, lease);
    }
    drop(next);
    drop(handler);
    drop(queue);
    if let Some(exited) = shared.exited.get(index) {
        exited.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    shared.gate.exit();
}

/// Gives back a lease whose handler never ran, ready at once.
fn return_unstarted(shared: &PoolState, lease: &Lease) {
    let c = &shared.counters;
    match lease.snooze(Duration::ZERO) {
        Ok(()) => PoolCounters::add(&c.unstarted),
        Err(e) => note_error(c, lease, &e, "giving back an unstarted job"),
    }
}

/// Runs one job: its heartbeat starts before the handler, and stops after the job's final
/// commit returned. Returns the next job, when that commit took one.
fn process(
    shared: &PoolState,
    handler: &Handler,
    queue: &crate::Queue,
    index: usize,
    lease: Lease,
) -> Option<Lease> {
    let lease = Arc::new(lease);
    let token = lease.token();
    let (extend, every) =
        super::heartbeat::timing(&lease, shared.heartbeat_every, shared.heartbeat_extend);
    // The job's own timeout, else the pool's. An effect handler runs inside its commit,
    // which a timeout could not end: not timed.
    let timeout = match (shared.job_timeout.of(&lease), handler) {
        (Some((after, action)), Handler::Plain(_) | Handler::Staged(_)) => {
            let now = std::time::Instant::now();
            Some(super::heartbeat::Timeout {
                at: now.checked_add(after).unwrap_or(now),
                after,
                action,
                flag: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            })
        }
        _ => None,
    };
    let timed_out = timeout.as_ref().map(|t| Arc::clone(&t.flag));
    super::set_current_timeout(timeout.as_ref().map(|t| (t.at, Arc::clone(&t.flag))));
    shared.beats.start(&lease, extend, every, timeout);
    // A plain handler runs apart from its commit, so a shutdown may take its job back; an
    // effect handler runs inside its commit, which ends the job whatever happens.
    let phase = match handler {
        Handler::Plain(_) | Handler::Staged(_) => WorkerSlot::Running(Arc::clone(&lease)),
        Handler::Effect(_) => WorkerSlot::Committing,
    };
    if let Some(slot) = shared.slots.get(index) {
        *slot.lock() = phase;
    }
    PoolCounters::add(&shared.counters.jobs);
    let next = match handler {
        Handler::Plain(handler) => {
            let ran = catch_unwind(AssertUnwindSafe(|| handler(&lease)));
            if is_set(&timed_out) {
                // The pool's timeout ended the delivery: this outcome does not count.
                note_ran(&shared.counters, &ran);
                None
            } else if shared.enter_commit(index) {
                end_plain(&shared.counters, !shared.stop.is_stopped(), &lease, ran)
            } else {
                // Given back by the shutdown while the handler ran: the shutdown ends the
                // attempt (and stops its heartbeat), this worker does not commit.
                note_ran(&shared.counters, &ran);
                None
            }
        }
        Handler::Effect(handler) => {
            let take_next = !shared.stop.is_stopped();
            run_effect(&shared.counters, take_next, &lease, handler.as_ref())
        }
        Handler::Staged(handler) => {
            // A key already applied (the commit landed before a crash or a lost answer):
            // the first stage is not run again; `ack_with` acks it as applied.
            let applied = lease
                .idempotency_key()
                .is_some_and(|k| queue.is_applied(k).unwrap_or(false));
            let ran = if applied {
                Ok(Ok(super::no_effect()))
            } else {
                catch_unwind(AssertUnwindSafe(|| handler(&lease)))
            };
            if is_set(&timed_out) || !shared.enter_commit(index) {
                note_ran(&shared.counters, &ran.map(|r| r.map(drop)));
                None
            } else {
                let take_next = !shared.stop.is_stopped();
                end_job(
                    &shared.counters,
                    take_next,
                    &lease,
                    ran.map(|r| r.map(Some)),
                )
            }
        }
    };
    super::set_current_timeout(None);
    let claimed = shared.leave(index);
    if !claimed {
        shared.beats.stop(token);
    }
    next
}

/// Whether the pool's timeout ended this delivery.
fn is_set(flag: &Option<Arc<std::sync::atomic::AtomicBool>>) -> bool {
    flag.as_ref()
        .is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst))
}

/// Counts a handler run whose outcome the shutdown or a timeout overrode.
fn note_ran(c: &PoolCounters, ran: &std::thread::Result<std::result::Result<(), BoxError>>) {
    if ran.is_err() {
        PoolCounters::add(&c.panics);
    }
}

/// What a plain or staged handler returned: nothing to commit, or its [`Effect`] (the
/// second stage), an error, or a panic.
pub(super) type Ran = std::thread::Result<std::result::Result<Option<Effect>, BoxError>>;

/// Ends a job by what its plain or staged handler returned (the staged one's effect commits
/// with the ack), and takes the next one in the same commit when `take_next`.
pub(super) fn end_job(c: &PoolCounters, take_next: bool, lease: &Lease, ran: Ran) -> Option<Lease> {
    match ran {
        Ok(Ok(Some(effect))) => {
            let effect = parking_lot::Mutex::new(effect);
            let second = |tx: &crate::Tx<'_>, _: &Lease| (*effect.lock())(tx);
            run_effect(c, take_next, lease, &second)
        }
        other => end_plain(c, take_next, lease, other.map(|r| r.map(drop))),
    }
}

/// Ends a plain handler's job by what it returned.
fn end_plain(
    c: &PoolCounters,
    take_next: bool,
    lease: &Lease,
    ran: std::thread::Result<std::result::Result<(), BoxError>>,
) -> Option<Lease> {
    match ran {
        Ok(Ok(())) => {
            if !take_next {
                count_ending(c, lease, lease.ack(), &c.acked);
                None
            } else {
                count_ending(c, lease, lease.ack_and_next(), &c.acked).flatten()
            }
        }
        Ok(Err(e)) => {
            match e.downcast::<Outcome>() {
                Ok(outcome) => apply(c, lease, *outcome),
                Err(e) => retry(c, lease, &e.to_string()),
            }
            None
        }
        Err(panic) => {
            PoolCounters::add(&c.panics);
            retry(
                c,
                lease,
                &format!("panic: {}", crate::error::panic_message(&*panic)),
            );
            None
        }
    }
}

/// Gives the job back through the retry policy (dead when out of attempts).
fn retry(c: &PoolCounters, lease: &Lease, reason: &str) {
    if let Some(state) = count_ending(c, lease, lease.nack(reason), &c.retried) {
        count_dead(c, state);
    }
}

/// Does what a handler's [`Outcome`] asks. A refused directive (a snooze or backoff above
/// `DELAY_MAX`) gives the job back through the retry policy instead, with the refusal as
/// its last error, so the job never waits out its lease.
fn apply(c: &PoolCounters, lease: &Lease, outcome: Outcome) {
    let refused = match outcome {
        Outcome::Snooze(delay) => match lease.snooze(delay) {
            Err(e @ Error::InvalidOption { .. }) => e,
            r => {
                count_ending(c, lease, r, &c.snoozed);
                return;
            }
        },
        Outcome::Fail(reason) => {
            if count_ending(c, lease, lease.fail(&reason), &c.failed).is_some() {
                PoolCounters::add(&c.dead);
            }
            return;
        }
        Outcome::Retry { after, reason } => match lease.nack_after(&reason, after) {
            Err(e @ Error::InvalidOption { .. }) => e,
            r => {
                if let Some(state) = count_ending(c, lease, r, &c.retried) {
                    count_dead(c, state);
                }
                return;
            }
        },
    };
    retry(c, lease, &format!("refused outcome: {refused}"));
}

fn count_dead(c: &PoolCounters, state: JobState) {
    if state == JobState::Dead {
        PoolCounters::add(&c.dead);
    }
}

/// Runs an effect handler inside `ack_with` (with the next dequeue in the same commit unless
/// the pool is stopping). The job ends with this commit, whatever a shutdown does meanwhile.
fn run_effect(
    c: &PoolCounters,
    take_next: bool,
    lease: &Lease,
    handler: &(dyn Fn(&crate::Tx<'_>, &Lease) -> std::result::Result<(), BoxError> + '_),
) -> Option<Lease> {
    // Whether the closure's last run panicked (it may run more than once).
    let mut panicked = false;
    let mut effect = |tx: &crate::Tx<'_>| -> std::result::Result<(), BoxError> {
        panicked = false;
        catch_unwind(AssertUnwindSafe(|| handler(tx, lease))).unwrap_or_else(|panic| {
            panicked = true;
            Err(format!("panic: {}", crate::error::panic_message(&*panic)).into())
        })
    };
    let r = if !take_next {
        lease.ack_with(&mut effect).map(|applied| (applied, None))
    } else {
        lease.ack_with_and_next(&mut effect)
    };
    match r {
        Ok((applied, next)) => {
            PoolCounters::add(&c.acked);
            if applied == Applied::AlreadyApplied {
                PoolCounters::add(&c.already_applied);
            }
            next
        }
        // The closure failed: `ack_with` gave the job back itself, as an `Outcome` it
        // returned asked, or through the retry policy.
        Err(Error::Effect(e)) => {
            if panicked {
                PoolCounters::add(&c.panics);
            }
            match e.downcast_ref::<Outcome>() {
                Some(Outcome::Snooze(d)) if *d <= crate::DELAY_MAX => PoolCounters::add(&c.snoozed),
                Some(Outcome::Fail(_)) => {
                    PoolCounters::add(&c.failed);
                    PoolCounters::add(&c.dead);
                }
                _ => PoolCounters::add(&c.retried),
            }
            None
        }
        // A follow-up the full file refused: snoozed by `ack_with` (no attempt spent).
        Err(Error::StorageFull { .. }) => {
            PoolCounters::add(&c.snoozed);
            None
        }
        // The closure passed on an enqueue's refusal: given back by `ack_with` as any
        // closure error is.
        Err(
            e @ (Error::PayloadTooLarge { .. }
            | Error::KeyTooLong { .. }
            | Error::InvalidOption { .. }
            | Error::QueueFull { .. }),
        ) => {
            PoolCounters::add(&c.retried);
            tracing::warn!(job = lease.id().0, error = %e, "leaseq pool: the effect handler's enqueue was refused");
            None
        }
        Err(e) => {
            note_error(c, lease, &e, "ending a job");
            None
        }
    }
}

/// Counts the outcome of a call that ends an attempt: `ok` on success, `lost` for
/// `LeaseLost` (the lease had expired and the job was delivered again, or the shutdown gave
/// it back), `cancelled` for `Cancelled`, `errors` otherwise (the job comes back when its lease ends: its heartbeat stops
/// with this call). Returns the value on success.
fn count_ending<T>(
    c: &PoolCounters,
    lease: &Lease,
    r: Result<T>,
    ok: &std::sync::atomic::AtomicU64,
) -> Option<T> {
    match r {
        Ok(v) => {
            PoolCounters::add(ok);
            Some(v)
        }
        Err(e) => {
            note_error(c, lease, &e, "ending a job");
            None
        }
    }
}

fn note_error(c: &PoolCounters, lease: &Lease, e: &Error, what: &str) {
    if matches!(e, Error::LeaseLost { .. }) {
        PoolCounters::add(&c.lost);
    } else if matches!(e, Error::Cancelled { .. }) {
        // Not a fault: the job was cancelled while its handler ran.
        PoolCounters::add(&c.cancelled);
        tracing::info!(job = lease.id().0, error = %e, "leaseq pool: {what}");
        return;
    } else {
        PoolCounters::add(&c.errors);
    }
    tracing::warn!(job = lease.id().0, error = %e, "leaseq pool: {what}");
}
