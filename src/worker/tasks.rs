//! The async pool (feature `tokio`): worker tasks on the app's tokio runtime, each taking a
//! job through the async face, running an async handler on it as a task of its own, and
//! ending the job by what the handler returned, with the sync pool's rules (the same
//! [`Outcome`]s, counts and shutdown order). Built on the public API only.
//!
//! Per job: the handler runs as a spawned task (a panic is caught by tokio and ends the job
//! as an error, `panic: <message>`); while it runs, the worker task extends the lease every
//! [`PoolBuilder::heartbeat_every`] through [`AsyncLease::extend`]; the ending commit (the
//! ack, the staged effect with the ack, the nack) runs on the async face's helper threads
//! with the same code as the sync pool's. No runtime thread ever blocks on a commit.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::run::{Ran, end_job};
use super::{COMMIT_WAIT, Effect, PoolBuilder, PoolCounters, PoolStats, ShutdownReport};
use crate::{AsyncLease, AsyncQueue, BoxError, Error, Result, StopSignal};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type AsyncPlain = dyn Fn(AsyncLease) -> BoxFuture<std::result::Result<(), BoxError>> + Send + Sync;
type AsyncStaged =
    dyn Fn(AsyncLease) -> BoxFuture<std::result::Result<Effect, BoxError>> + Send + Sync;

enum AsyncHandler {
    Plain(Box<AsyncPlain>),
    Staged(Box<AsyncStaged>),
}

/// A handler task under way, for the shutdown to take back.
struct Running {
    lease: AsyncLease,
    abort: tokio::task::AbortHandle,
}

/// What the worker tasks of one [`AsyncPool`] share with it.
struct TaskState {
    /// The pool's name in a [`PoolMonitor`](super::PoolMonitor).
    name: String,
    /// The queue's name.
    queue_name: Option<String>,
    /// The worker tasks.
    tasks: usize,
    stop: StopSignal,
    counters: PoolCounters,
    /// Handlers running now, by the token of their delivery. The worker that removes its
    /// entry ends the job; an entry the shutdown removed is the shutdown's to give back.
    running: Mutex<HashMap<u64, Running>>,
    idle_timeout: Duration,
    heartbeat_every: Option<Duration>,
    heartbeat_extend: Option<Duration>,
    job_timeout: super::Timeouts,
}

impl TaskState {
    fn in_flight(&self) -> u64 {
        self.running.lock().len() as u64
    }
}

/// Worker tasks on the app's tokio runtime that run an async handler on every job of a
/// queue, with heartbeats, panic catching and a graceful shutdown: the async form of
/// [`WorkerPool`](super::WorkerPool) (feature `tokio`). Made by [`PoolBuilder::start_async`]
/// and [`PoolBuilder::start_async_staged`], where [`PoolBuilder::threads`] is the number
/// of handlers that run at once.
///
/// Dropping it stops taking jobs (its stop signal) and leaves running handlers to finish on
/// their own; [`AsyncPool::shutdown`] waits for them.
pub struct AsyncPool {
    shared: Arc<TaskState>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for AsyncPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncPool")
            .field("tasks", &self.workers.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl PoolBuilder {
    /// Starts an async pool on the current tokio runtime (call it from inside one): `threads`
    /// worker tasks, each taking a job (without a thread while it waits), running
    /// `handler(lease)` as a task of its own, and ending the job as a plain handler's
    /// ([`PoolBuilder::start`]): `Ok` acks it, an error gives it back through the retry
    /// policy, an [`Outcome`](crate::Outcome) as the error snoozes, fails or retries it, a
    /// panic is an error `panic: <message>`. The handler gets a clone of the lease to read
    /// (`payload`, `decode`, `attempt`, `is_cancelled`, ...); the pool ends it, not the
    /// handler. The idle timeout, heartbeats and stop signal are as for a
    /// [`WorkerPool`](super::WorkerPool); `thread_name` and `drop_grace` do not apply.
    ///
    /// ```
    /// use leaseq::{EnqueueOptions, Queue};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let queue = Queue::open(dir.path().join("app.leaseq"))?;
    /// for n in 0..10u32 {
    ///     queue.enqueue_value(&n, EnqueueOptions::default())?;
    /// }
    /// let pool = leaseq::WorkerPool::builder(&queue)
    ///     .threads(4)
    ///     .start_async(|lease| async move {
    ///         let n: u32 = lease.decode()?;
    ///         tokio::time::sleep(Duration::from_millis(u64::from(n))).await; // the work
    ///         Ok(())
    ///     })?;
    /// while !queue.is_empty()? {
    ///     tokio::time::sleep(Duration::from_millis(10)).await;
    /// }
    /// let report = pool.shutdown(Duration::from_secs(5)).await;
    /// assert_eq!(report.stats.acked, 10);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`PoolBuilder::start`]; `NoRuntime` if no tokio runtime is current on this thread
    /// (nothing started).
    pub fn start_async<F, Fut>(self, handler: F) -> Result<AsyncPool>
    where
        F: Fn(AsyncLease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        self.spawn_async(
            "PoolBuilder::start_async",
            AsyncHandler::Plain(Box::new(move |l| Box::pin(handler(l)))),
        )
    }

    /// [`PoolBuilder::start_async`] with a staged handler, as [`PoolBuilder::start_staged`]:
    /// the handler's future does the slow or outside work (awaiting, off the write lock),
    /// and resolves to an [`Effect`], the writes that then commit with the job's ack in one
    /// transaction (with the idempotency key's applied marker); a job whose key is already
    /// applied is acked without running the handler.
    ///
    /// # Errors
    /// As [`PoolBuilder::start_async`] (`NoRuntime` names this call).
    pub fn start_async_staged<F, Fut>(self, handler: F) -> Result<AsyncPool>
    where
        F: Fn(AsyncLease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Effect, BoxError>> + Send + 'static,
    {
        self.spawn_async(
            "PoolBuilder::start_async_staged",
            AsyncHandler::Staged(Box::new(move |l| Box::pin(handler(l)))),
        )
    }

    /// Starts the pool of `call` (its name for `NoRuntime`) with `handler`.
    fn spawn_async(self, call: &'static str, handler: AsyncHandler) -> Result<AsyncPool> {
        let tasks = self.validate()?;
        if self.queue.is_closed() {
            return Err(Error::Closed);
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime { call })?;
        let shared = Arc::new(TaskState {
            name: self.thread_name.clone(),
            queue_name: self.queue.name().map(str::to_string),
            tasks,
            stop: self.stop.clone().unwrap_or_default(),
            counters: PoolCounters::default(),
            running: Mutex::new(HashMap::new()),
            idle_timeout: self.idle_timeout,
            heartbeat_every: self.heartbeat_every,
            heartbeat_extend: self.heartbeat_extend,
            job_timeout: self.timeouts(),
        });
        let handler = Arc::new(handler);
        let workers = (0..tasks)
            .map(|_| {
                let (shared, handler) = (Arc::clone(&shared), Arc::clone(&handler));
                runtime.spawn(worker(shared, self.queue.to_async(), handler))
            })
            .collect();
        Ok(AsyncPool { shared, workers })
    }
}

impl super::Counted for TaskState {
    fn snapshot(&self) -> PoolStats {
        self.counters.snapshot(self.in_flight())
    }

    fn stopping(&self) -> bool {
        self.stop.is_stopped()
    }
}

impl AsyncPool {
    /// Counts since the pool started, and the handlers running now.
    pub fn stats(&self) -> PoolStats {
        self.shared.counters.snapshot(self.shared.in_flight())
    }

    /// A view of this pool's counters held without holding the pool, as
    /// [`WorkerPool::monitor`](super::WorkerPool::monitor).
    pub fn monitor(&self) -> super::PoolMonitor {
        let state: Arc<dyn super::Counted> = self.shared.clone();
        super::PoolMonitor {
            name: self.shared.name.clone(),
            queue: self.shared.queue_name.clone(),
            threads: self.shared.tasks,
            state: Arc::downgrade(&state),
        }
    }

    /// The pool's stop signal.
    pub fn stop_signal(&self) -> StopSignal {
        self.shared.stop.clone()
    }

    /// Stops the pool and waits for it, as [`WorkerPool::shutdown`](super::WorkerPool::shutdown):
    /// no job is taken from now on (a job taken as the stop came goes back unstarted, its
    /// attempt not charged); running handlers get up to `grace` to return and their jobs
    /// are ended as usual; at the end of the grace the handler tasks still running are
    /// aborted (at their next await: unlike a thread, a task can be stopped) and their jobs
    /// given back (ready at once, the attempt counted). Then it waits up to 1 s more for
    /// commits under way. When it returns, every worker task has ended (or is counted in
    /// `still_running`) and the pool holds no handle to the file.
    pub async fn shutdown(mut self, grace: Duration) -> ShutdownReport {
        let started = Instant::now();
        let shared = Arc::clone(&self.shared);
        shared.stop.stop();
        let before = shared.counters.snapshot(0);
        let mut workers = std::mem::take(&mut self.workers);
        let all_done =
            |workers: &Vec<tokio::task::JoinHandle<()>>| workers.iter().all(|w| w.is_finished());
        wait_until(&mut workers, started.checked_add(grace), all_done).await;
        // The handlers still running: taken back and aborted at once, their jobs given back
        // by a task of their own (so a caller dropping this future part-way strands none).
        let claimed: Vec<Running> = shared.running.lock().drain().map(|(_, r)| r).collect();
        claimed.iter().for_each(|r| r.abort.abort());
        let reason = format!(
            "given back at shutdown: the handler was still running after the grace of {} ms",
            grace.as_millis()
        );
        let giving_back = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                for r in claimed {
                    match r.lease.nack_after(&reason, Duration::ZERO).await {
                        Ok(_) => PoolCounters::add(&shared.counters.given_back),
                        Err(Error::LeaseLost { .. }) => {}
                        Err(e) => {
                            PoolCounters::add(&shared.counters.errors);
                            tracing::warn!(job = r.lease.id().0, error = %e, "leaseq async pool: giving back at shutdown");
                        }
                    }
                }
            })
        };
        let _ = giving_back.await;
        wait_until(
            &mut workers,
            Instant::now().checked_add(COMMIT_WAIT),
            all_done,
        )
        .await;
        let still_running = workers.iter().filter(|w| !w.is_finished()).count();
        let after = shared.counters.snapshot(shared.in_flight());
        ShutdownReport::between(&before, after, still_running, started)
    }
}

impl Drop for AsyncPool {
    /// Stops taking jobs; running handlers finish on their own (an async drop cannot wait).
    fn drop(&mut self) {
        self.shared.stop.stop();
    }
}

/// Waits (without blocking the runtime) until `done(workers)` or `deadline`.
async fn wait_until(
    workers: &mut Vec<tokio::task::JoinHandle<()>>,
    deadline: Option<Instant>,
    done: impl Fn(&Vec<tokio::task::JoinHandle<()>>) -> bool,
) {
    let mut look = Duration::from_millis(1);
    while !done(workers) && deadline.is_none_or(|d| Instant::now() < d) {
        tokio::time::sleep(look).await;
        look = (look * 2).min(Duration::from_millis(20));
    }
}

/// One worker task: take a job, run its handler task, end the job; until the stop or the
/// file's close.
async fn worker(shared: Arc<TaskState>, queue: AsyncQueue, handler: Arc<AsyncHandler>) {
    let mut backoff = super::ERROR_BACKOFF_MIN;
    while !shared.stop.is_stopped() {
        PoolCounters::add(&shared.counters.polls);
        match queue.dequeue_until(shared.idle_timeout, &shared.stop).await {
            Ok(Some(lease)) => {
                backoff = super::ERROR_BACKOFF_MIN;
                if shared.stop.is_stopped() {
                    // Taken as the stop came: never started, so uncharged.
                    match lease.snooze(Duration::ZERO).await {
                        Ok(()) => PoolCounters::add(&shared.counters.unstarted),
                        Err(e) => note(&shared.counters, &lease, &e),
                    }
                    break;
                }
                run_job(&shared, &queue, &handler, lease).await;
            }
            Ok(None) => {}
            Err(Error::Closed) => break,
            Err(e) => {
                PoolCounters::add(&shared.counters.errors);
                tracing::warn!(error = %e, "leaseq async pool: dequeue failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(super::ERROR_BACKOFF_MAX);
            }
        }
    }
}

fn note(c: &PoolCounters, lease: &AsyncLease, e: &Error) {
    match e {
        Error::LeaseLost { .. } => PoolCounters::add(&c.lost),
        Error::Cancelled { .. } => PoolCounters::add(&c.cancelled),
        _ => PoolCounters::add(&c.errors),
    }
    tracing::warn!(job = lease.id().0, error = %e, "leaseq async pool: ending a job");
}

/// One job: the handler as a task of its own, heartbeats while it runs, then the ending
/// commit on a helper thread.
async fn run_job(
    shared: &Arc<TaskState>,
    queue: &AsyncQueue,
    handler: &AsyncHandler,
    lease: AsyncLease,
) {
    let c = &shared.counters;
    PoolCounters::add(&c.jobs);
    let token = lease.token();
    // A staged job whose key is already applied: acked without running the first stage.
    let applied = matches!(handler, AsyncHandler::Staged(_))
        && lease
            .idempotency_key()
            .is_some_and(|k| queue.blocking().is_applied(k).unwrap_or(false));
    let work: BoxFuture<std::result::Result<Option<Effect>, BoxError>> = match handler {
        _ if applied => Box::pin(async { Ok(Some(super::no_effect())) }),
        AsyncHandler::Plain(h) => {
            let f = h(lease.clone());
            Box::pin(async move { f.await.map(|()| None) })
        }
        AsyncHandler::Staged(h) => {
            let f = h(lease.clone());
            Box::pin(async move { f.await.map(Some) })
        }
    };
    let mut task = tokio::spawn(work);
    shared.running.lock().insert(
        token,
        Running {
            lease: lease.clone(),
            abort: task.abort_handle(),
        },
    );
    let (extend, every) = super::heartbeat::timing(
        lease.blocking(),
        shared.heartbeat_every,
        shared.heartbeat_extend,
    );
    let mut beating = true;
    // The job's own timeout, else the pool's.
    let deadline = shared
        .job_timeout
        .of(lease.blocking())
        .map(|(after, action)| (tokio::time::Instant::now() + after, after, action));
    let joined = loop {
        let wait = match deadline {
            Some((at, ..)) => every.min(at.saturating_duration_since(tokio::time::Instant::now())),
            None => every,
        };
        match tokio::time::timeout(wait, &mut task).await {
            Ok(joined) => break joined,
            Err(_) if deadline.is_some_and(|(at, ..)| tokio::time::Instant::now() >= at) => {
                // Its time is up: the handler future is dropped (at its next await) and the
                // delivery ended as the pool says; a late outcome would be fenced anyway.
                task.abort();
                if shared.running.lock().remove(&token).is_some()
                    && let Some((_, after, action)) = deadline
                {
                    let reason = format!("timed out after {} ms", after.as_millis());
                    let ended = match action {
                        super::OnTimeout::Retry => lease.nack(&reason).await.map(drop),
                        super::OnTimeout::Fail => lease.fail(&reason).await,
                    };
                    match ended {
                        Ok(()) => PoolCounters::add(&c.timed_out),
                        Err(e) => note(c, &lease, &e),
                    }
                }
                return;
            }
            Err(_) if beating => match lease.extend(extend).await {
                Ok(()) => c.heartbeat_landed(),
                Err(Error::LeaseLost { .. }) => {
                    PoolCounters::add(&c.heartbeats_lost);
                    beating = false;
                }
                // Cancelled while the handler runs: the beats go on until it returns, so an
                // ordered group waits for it (each moves the group's wait).
                Err(Error::Cancelled { .. }) => {}
                Err(e) => {
                    PoolCounters::add(&c.errors);
                    tracing::warn!(job = lease.id().0, error = %e, "leaseq async pool: heartbeat failed");
                }
            },
            Err(_) => {}
        }
    };
    let mine = shared.running.lock().remove(&token).is_some();
    let panicked = matches!(&joined, Err(e) if e.is_panic());
    if !mine {
        // The shutdown took the job back (and gave it back); an abort is not a panic.
        if panicked {
            PoolCounters::add(&c.panics);
        }
        return;
    }
    let ran: Ran = match joined {
        Ok(result) => Ok(result),
        Err(e) if e.is_panic() => Err(e.into_panic()),
        Err(_) => Err(Box::new("the handler task was cancelled")),
    };
    let (shared, held) = (Arc::clone(shared), lease.clone());
    let ended = queue
        .run(move |_| {
            // The sync pool's ending, on a helper thread; no next job (this task dequeues).
            drop(end_job(&shared.counters, false, held.blocking(), ran));
            Ok(())
        })
        .await;
    if let Err(e) = ended {
        note(c, &lease, &e);
    }
}
