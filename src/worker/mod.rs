//! A worker pool: threads that take jobs from a [`Queue`], run a handler on each, and end
//! each job by what the handler returned, keeping running jobs leased with heartbeats.
//!
//! Built on leaseq's public API only (as another crate could be). A pool works on one queue
//! handle, the default queue or a named one ([`Queue::named`]), and there are two kinds of
//! handler:
//!
//! - [`PoolBuilder::start`]: a plain handler `Fn(&Lease) -> Result<(), BoxError>`. `Ok` acks
//!   the job (at-least-once); an error gives it back through the queue's
//!   [`RetryPolicy`](crate::RetryPolicy) with the error's text as its last error (dead when
//!   out of attempts); an [`Outcome`] returned as the error snoozes it, fails it now, or
//!   retries it after a backoff of the handler's choosing. A result the handler set with
//!   [`Lease::set_result`] is stored by that ack, in a queue that keeps a history; a job
//!   cancelled while its handler runs is refused at the end ([`PoolStats::cancelled`]), and
//!   [`Lease::is_cancelled`] lets a long handler stop early.
//! - [`PoolBuilder::start_effects`]: an effect handler `Fn(&Tx, &Lease) -> Result<(),
//!   BoxError>` run inside [`Lease::ack_with`]: its writes to the app's own tables, the
//!   applied marker and the ack commit together, so the exactly-once effect is the easy path.
//!
//! **What the pool does for every job.** A worker takes a job ([`Queue::dequeue_until`],
//! blocked on the queue's wake-up while there is none: no polling), registers the job's
//! heartbeat, runs the handler (a panic is caught: the job is given back with `panic:
//! <message>` as its last error and the thread lives on), then ends the job and takes the
//! next one in the same commit ([`Lease::ack_and_next`] / [`Lease::ack_with_and_next`]), so a
//! busy worker pays one commit per job. The heartbeat stops only after that final commit
//! returned. An idle worker's dequeue waits at most [`PoolBuilder::idle_timeout`] before it
//! looks again (an idle pool of 4 threads makes 4 dequeue calls in a second,
//! [`PoolStats::polls`]).
//!
//! **Heartbeats.** One thread per pool extends the lease of every running job through its
//! [`Heartbeat`](crate::Heartbeat), by the delivery's own lease ([`Lease::lease_ms`]) every
//! third of it ([`PoolBuilder::heartbeat_extend`], [`PoolBuilder::heartbeat_every`]), so a
//! handler may run far longer than the lease while another consumer never gets its job. A
//! job's heartbeat starts before its handler and stops after its final commit. An extend that
//! finds the attempt over (`LeaseLost`, a beat landing just after the ack among them) drops
//! that job's heartbeat; the core writes nothing for it.
//!
//! **Execution timeouts.** With [`PoolBuilder::job_timeout`], or for a job with its own
//! ([`EnqueueOptions::timeout`](crate::job::EnqueueOptions::timeout), which wins), the
//! heartbeat thread also ends the delivery of a handler that runs too long: given back
//! through the retry policy (or dead, [`OnTimeout::Fail`]), its heartbeats stopped, its late
//! ack fenced. A thread cannot be killed, so the handler runs on until it returns;
//! [`is_timed_out`] and [`job_deadline`] let it stop early. An async pool drops the handler's
//! future instead.
//!
//! **Shutdown.** [`WorkerPool::shutdown`] stops taking jobs (idle workers wake at once), lets
//! the running handlers finish within the grace, then gives back the leases of the handlers
//! still running (ready at once, the attempt counted); heartbeats go on until each job's
//! final commit and stop last. A job taken as the stop came goes back unstarted (snoozed: its
//! attempt not charged). Dropping the pool shuts it down with [`PoolBuilder::drop_grace`]
//! (default [`DROP_GRACE_DEFAULT`], 10 s). The pool never closes the file ([`Queue::close`]):
//! it stops with its own [`StopSignal`].
//!
//! **Effect handlers run inside the queue's write transaction**: every other write of the
//! file waits while one runs, so keep them to the writes. An [`Outcome`] returned there ends
//! the job as it says ([`Lease::ack_with`] honours it in the commit after the failed one).
//!
//! ```
//! use leaseq::{EnqueueOptions, Queue, WorkerPool};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir()?;
//! let queue = Queue::open(dir.path().join("app.leaseq"))?;
//! for n in 0..10u32 {
//!     queue.enqueue_value(&n, EnqueueOptions::default())?;
//! }
//! let pool = WorkerPool::builder(&queue).threads(2).start(|lease| {
//!     let n: u32 = lease.decode()?;
//!     println!("job {n}"); // the work; an Err gives the job back through the retry policy
//!     Ok(())
//! })?;
//! while !queue.is_empty()? {
//!     std::thread::sleep(Duration::from_millis(10));
//! }
//! let report = pool.shutdown(Duration::from_secs(5));
//! assert_eq!(report.given_back, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Two pools on one file, a plain one on a named queue and an effect one on the default
//! queue; the effect handler's writes and the ack commit together:
//!
//! ```
//! use leaseq::redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
//! use leaseq::{EnqueueOptions, Outcome, Queue, WorkerPool};
//! use std::time::Duration;
//!
//! const PAID: TableDefinition<u64, u64> = TableDefinition::new("paid");
//!
//! let dir = tempfile::tempdir()?;
//! let queue = Queue::open(dir.path().join("app.leaseq"))?;
//! // Plain handler: Ok acks, Err retries through the policy, an Outcome snoozes or fails.
//! let mailer = WorkerPool::builder(&queue.named("mail")?).threads(2).start(|lease| {
//!     if lease.payload().is_empty() {
//!         return Err(Outcome::Fail("empty".into()).into());
//!     }
//!     Ok(()) // send it
//! })?;
//! // Effect handler: runs inside ack_with, so its writes and the ack commit together.
//! let payer = WorkerPool::builder(&queue).threads(4).start_effects(|tx, lease| {
//!     tx.open_table(PAID)?.insert(lease.id().0, 1)?;
//!     Ok(())
//! })?;
//! queue.enqueue(b"order 1", EnqueueOptions::default())?;
//! while !queue.is_empty()? {
//!     std::thread::sleep(Duration::from_millis(10));
//! }
//! let report = payer.shutdown(Duration::from_secs(30)); // dropping shuts down too (10 s grace)
//! println!("{report:?}");
//! drop(mailer);
//!
//! // Reading your own table afterwards: a redb read transaction on the queue's database.
//! let paid = queue.database().begin_read()?.open_table(PAID)?.len()?;
//! assert_eq!(paid, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `cargo run --example worker_pool` pays orders exactly once with an effect pool that
//! enqueues a receipt per payment for a plain pool on a named queue, and prints a verified
//! summary. Measured throughput: `docs/performance.md` in the source repository.

mod heartbeat;
mod run;
#[cfg(feature = "tokio")]
mod tasks;

#[cfg(feature = "tokio")]
pub use tasks::AsyncPool;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{BoxError, Error, LEASE_MAX, Lease, Outcome, Queue, Result, StopSignal, Tx};

/// A worker's first wait after a failed dequeue (plain and async pools); doubled after each
/// failure in a row.
const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest wait between two dequeues that fail.
const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Most worker threads one pool runs.
pub const WORKER_THREADS_MAX: usize = 256;
/// How long an idle worker blocks in one [`Queue::dequeue_until`] before it looks again
/// (5 s), unless [`PoolBuilder::idle_timeout`] says otherwise. New work and the pool's stop
/// wake it at once whatever this is; it only bounds a wait.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// The longest [`PoolBuilder::idle_timeout`] accepted (1 hour).
pub const IDLE_TIMEOUT_MAX: Duration = Duration::from_secs(60 * 60);
/// The grace a dropped pool gives its running handlers (10 s), unless
/// [`PoolBuilder::drop_grace`] says otherwise.
pub const DROP_GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// The thread name prefix, unless [`PoolBuilder::thread_name`] says otherwise.
pub const THREAD_NAME_DEFAULT: &str = "leaseq-worker";
/// After the grace and the give-backs, how long a shutdown still waits for workers that were
/// in the middle of a commit (their handler had returned) to come back.
const COMMIT_WAIT: Duration = Duration::from_secs(1);

/// What [`PoolBuilder::job_timeout`] (or a job's own
/// [`EnqueueOptions::timeout`](crate::job::EnqueueOptions::timeout)) does to a job whose
/// handler ran too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnTimeout {
    /// Give it back through the retry policy, the attempt counted (dead if it was the last),
    /// as River and Oban treat a timeout: an error like any other.
    #[default]
    Retry,
    /// Dead-letter it now, whatever attempts it has left.
    Fail,
}

/// A pool's execution timeouts: its own for every job ([`PoolBuilder::job_timeout`]), if
/// any, and what a timeout does ([`PoolBuilder::on_timeout`]).
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    pool: Option<Duration>,
    action: OnTimeout,
}

impl Timeouts {
    /// The execution timeout of the job `lease` delivers, and what it does: the job's own
    /// ([`Lease::timeout_ms`]), else the pool's; `None` if neither has one.
    fn of(&self, lease: &Lease) -> Option<(Duration, OnTimeout)> {
        lease
            .timeout_ms()
            .map(Duration::from_millis)
            .or(self.pool)
            .map(|after| (after, self.action))
    }
}

thread_local! {
    /// The running job's timeout on a pool's worker thread: when it is up, and whether the
    /// pool already ended the delivery.
    static CURRENT_TIMEOUT: std::cell::RefCell<Option<(Instant, Arc<std::sync::atomic::AtomicBool>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Inside a plain or staged handler of a [`WorkerPool`] running a job with an execution
/// timeout (its own, [`EnqueueOptions::timeout`](crate::job::EnqueueOptions::timeout), else
/// the pool's [`job_timeout`](PoolBuilder::job_timeout)): whether the job's time is up and
/// the pool ended its delivery (its outcome will not count: stop and return). `false` on any
/// other thread, and for a job without a timeout. A relaxed atomic load: cheap enough for a
/// loop.
pub fn is_timed_out() -> bool {
    CURRENT_TIMEOUT.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|(_, flag)| flag.load(Ordering::Relaxed))
    })
}

/// Inside a plain or staged handler of a [`WorkerPool`] running a job with an execution
/// timeout (its own, [`EnqueueOptions::timeout`](crate::job::EnqueueOptions::timeout), else
/// the pool's [`job_timeout`](PoolBuilder::job_timeout)): when the job's time is up (a
/// monotonic instant), to bound the handler's own waits (a socket timeout, a child process).
/// `None` on any other thread, and for a job without a timeout.
pub fn job_deadline() -> Option<Instant> {
    CURRENT_TIMEOUT.with(|c| c.borrow().as_ref().map(|(at, _)| *at))
}

/// Sets (or clears) the running job's timeout for [`is_timed_out`] and [`job_deadline`] on
/// this worker thread.
fn set_current_timeout(current: Option<(Instant, Arc<std::sync::atomic::AtomicBool>)>) {
    CURRENT_TIMEOUT.with(|c| *c.borrow_mut() = current);
}

/// Counts since the pool started ([`WorkerPool::stats`]). Every field counts events, but
/// `in_flight`, a gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Times an idle worker asked the queue for a job ([`Queue::dequeue_until`] calls; the
    /// jobs taken by an ack-and-next are not polls). An idle pool makes one per thread per
    /// [`PoolBuilder::idle_timeout`].
    pub polls: u64,
    /// Handler runs started.
    pub jobs: u64,
    /// Jobs acked (`ack`, or `ack_with` that committed or found the key applied).
    pub acked: u64,
    /// Of `acked`, effect jobs whose idempotency key was already applied (the handler did not
    /// run in the commit that acked them).
    pub already_applied: u64,
    /// Jobs given back through the retry policy after an error or a panic (or with
    /// [`Outcome::Retry`]'s backoff), dead ones included. A job past its
    /// [`PoolBuilder::job_timeout`] counts in `timed_out` alone, whatever became of it.
    pub retried: u64,
    /// Handler panics caught (each also counted in `retried` unless the shutdown had given
    /// its job back).
    pub panics: u64,
    /// Jobs dead-lettered by [`Outcome::Fail`].
    pub failed: u64,
    /// Jobs the pool moved to the dead-letter state: [`Outcome::Fail`], and retries out of
    /// attempts (plain handlers; an effect handler's failure is given back by `ack_with`,
    /// which does not say). Not the jobs past their timeout with [`OnTimeout::Fail`]: they
    /// count in `timed_out` alone.
    pub dead: u64,
    /// Jobs snoozed by [`Outcome::Snooze`].
    pub snoozed: u64,
    /// Leases of handlers still running after a shutdown's grace, given back.
    pub given_back: u64,
    /// Jobs taken as the pool stopped (a dequeue racing the stop), given back before their
    /// handler ran, without charging the attempt.
    pub unstarted: u64,
    /// Calls that ended a job refused with `LeaseLost`: the lease had expired and the job was
    /// delivered again (heartbeats too late, or stopped by an error), so this attempt's
    /// outcome does not count.
    pub lost: u64,
    /// Calls that ended a job refused with `Cancelled`: the job was cancelled
    /// ([`Queue::cancel`](crate::Queue::cancel)) while its handler ran, so its outcome does
    /// not count (its heartbeats went on until it returned, so an ordered group waited for
    /// it).
    pub cancelled: u64,
    /// Jobs whose handler ran past their execution timeout (their own, else
    /// [`PoolBuilder::job_timeout`]): their delivery was ended (given back through the retry
    /// policy, or dead, as [`PoolBuilder::on_timeout`] says).
    pub timed_out: u64,
    /// Successful heartbeat extends.
    pub heartbeats: u64,
    /// When the last of them landed (Unix ms, by the system clock); `None` before the first.
    /// A pool with jobs in flight whose last heartbeat is older than its
    /// [`PoolBuilder::heartbeat_every`] is stuck between beats: a commit or the disk is slow.
    pub last_heartbeat_ms: Option<u64>,
    /// Heartbeat extends that found the attempt over (`LeaseLost`); that job's heartbeat
    /// stopped (a cancelled job's beats go on, answered `Cancelled`, and are not counted).
    /// A beat under way as the job's own final commit lands counts here too (it changes
    /// nothing); more than that means leases expired under running handlers.
    pub heartbeats_lost: u64,
    /// Other failed calls (a dequeue, a commit, a heartbeat: storage errors), each logged
    /// with `tracing`.
    pub errors: u64,
    /// Handlers running now.
    pub in_flight: u64,
}

/// What a pool counts, for a [`PoolMonitor`].
trait Counted: Send + Sync {
    fn snapshot(&self) -> PoolStats;
    fn stopping(&self) -> bool;
}

impl Counted for PoolState {
    fn snapshot(&self) -> PoolStats {
        self.counters.snapshot(self.in_flight())
    }

    fn stopping(&self) -> bool {
        self.stop.is_stopped()
    }
}

/// A pool's counters seen from elsewhere in the app ([`WorkerPool::monitor`],
/// `AsyncPool::monitor`, feature `tokio`): cheap to clone, holding nothing of the pool (a pool dropped or
/// shut down reads as gone).
#[derive(Clone)]
pub struct PoolMonitor {
    name: String,
    queue: Option<String>,
    threads: usize,
    state: std::sync::Weak<dyn Counted>,
}

impl PoolMonitor {
    /// The pool's name: its thread name prefix ([`PoolBuilder::thread_name`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the queue it works on (`None`: the default queue).
    pub fn queue(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    /// Its worker threads (or tasks).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Its counts now ([`PoolStats::in_flight`]: the workers busy), `None` once the pool is
    /// gone (dropped, or shut down and dropped).
    pub fn stats(&self) -> Option<PoolStats> {
        self.state.upgrade().map(|s| s.snapshot())
    }

    /// Whether the pool is stopping (its stop signal set) or gone.
    pub fn is_stopping(&self) -> bool {
        self.state.upgrade().is_none_or(|s| s.stopping())
    }
}

impl fmt::Debug for PoolMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolMonitor")
            .field("name", &self.name)
            .field("queue", &self.queue)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

/// What [`WorkerPool::shutdown`] did. Counts from the moment the stop was signalled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Jobs in flight that their worker ended itself during the shutdown (acked, retried,
    /// failed or snoozed: the handler finished within the grace).
    pub finished: u64,
    /// Leases of handlers still running at the end of the grace, given back: ready at once,
    /// the attempt counted (dead if it was the last one). Those handlers' later acks get
    /// `LeaseLost` and change nothing.
    pub given_back: u64,
    /// Jobs taken as the stop came, given back without charging the attempt before their
    /// handler ran.
    pub unstarted: u64,
    /// Final commits refused with `LeaseLost` during the shutdown (the lease had expired
    /// and the job was delivered again).
    pub lost: u64,
    /// Worker threads still running a handler when the shutdown returned: their leases were
    /// given back (or their commit is still under way), and each thread ends when its handler
    /// returns, holding a handle to the queue (so the file stays open) until then.
    pub still_running: usize,
    /// How long the shutdown took.
    pub elapsed: Duration,
    /// The pool's counts when the shutdown returned (`in_flight`: the handlers still
    /// running).
    pub stats: PoolStats,
}

impl ShutdownReport {
    /// The report of a shutdown that started at `started` with the counts `before` and
    /// ended with `after`.
    fn between(
        before: &PoolStats,
        after: PoolStats,
        still_running: usize,
        started: Instant,
    ) -> ShutdownReport {
        let ended = |s: &PoolStats| s.acked + s.retried + s.failed + s.snoozed;
        ShutdownReport {
            finished: ended(&after).saturating_sub(ended(before)),
            given_back: after.given_back.saturating_sub(before.given_back),
            unstarted: after.unstarted.saturating_sub(before.unstarted),
            lost: after.lost.saturating_sub(before.lost),
            still_running,
            elapsed: started.elapsed(),
            stats: after,
        }
    }
}

type PlainFn = dyn Fn(&Lease) -> std::result::Result<(), BoxError> + Send + Sync;
type EffectHandler = dyn Fn(&Tx<'_>, &Lease) -> std::result::Result<(), BoxError> + Send + Sync;
type StagedFn = dyn Fn(&Lease) -> std::result::Result<Effect, BoxError> + Send + Sync;

/// The second stage of a staged handler ([`PoolBuilder::start_staged`], and the async
/// pool's): the writes that commit with the job's ack, in one transaction, as
/// [`Lease::ack_with`]'s closure. Made with [`effect`]. It runs inside the write
/// transaction, perhaps more than once (a group that aborts is replayed), so it only writes:
/// the slow or outside work was the first stage.
pub type Effect = Box<dyn FnMut(&Tx<'_>) -> std::result::Result<(), BoxError> + Send>;

/// Wraps `f` as an [`Effect`] (a staged handler's result).
pub fn effect<F>(f: F) -> Effect
where
    F: FnMut(&Tx<'_>) -> std::result::Result<(), BoxError> + Send + 'static,
{
    Box::new(f)
}

/// What a staged handler returns that commits nothing with the ack: [`effect`] of a closure
/// that writes nothing.
pub fn no_effect() -> Effect {
    Box::new(|_| Ok(()))
}

enum Handler {
    Plain(Box<PlainFn>),
    Effect(Box<EffectHandler>),
    Staged(Box<StagedFn>),
}

/// Where one worker is with its job; the shutdown reads it to find the handlers still
/// running, and claims them.
enum WorkerSlot {
    /// No job.
    Idle,
    /// A plain handler runs.
    Running(Arc<Lease>),
    /// The worker is ending the job: a plain handler returned, or an effect handler's
    /// commit (the handler runs inside it) is under way.
    Committing,
    /// The shutdown took the job from a running handler and gives it back; the worker will
    /// not commit it.
    Claimed,
}

#[derive(Default)]
struct PoolCounters {
    polls: AtomicU64,
    jobs: AtomicU64,
    acked: AtomicU64,
    already_applied: AtomicU64,
    retried: AtomicU64,
    panics: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    snoozed: AtomicU64,
    given_back: AtomicU64,
    unstarted: AtomicU64,
    lost: AtomicU64,
    cancelled: AtomicU64,
    timed_out: AtomicU64,
    heartbeats: AtomicU64,
    /// When the last heartbeat landed (Unix ms; 0: none yet).
    last_heartbeat_ms: AtomicU64,
    heartbeats_lost: AtomicU64,
    errors: AtomicU64,
}

impl PoolCounters {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A heartbeat extend landed: counted, and its time kept.
    fn heartbeat_landed(&self) {
        PoolCounters::add(&self.heartbeats);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_heartbeat_ms.fetch_max(now, Ordering::Relaxed);
    }

    fn snapshot(&self, in_flight: u64) -> PoolStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PoolStats {
            polls: get(&self.polls),
            jobs: get(&self.jobs),
            acked: get(&self.acked),
            already_applied: get(&self.already_applied),
            retried: get(&self.retried),
            panics: get(&self.panics),
            failed: get(&self.failed),
            dead: get(&self.dead),
            snoozed: get(&self.snoozed),
            given_back: get(&self.given_back),
            unstarted: get(&self.unstarted),
            lost: get(&self.lost),
            cancelled: get(&self.cancelled),
            timed_out: get(&self.timed_out),
            heartbeats: get(&self.heartbeats),
            last_heartbeat_ms: Some(get(&self.last_heartbeat_ms)).filter(|&ms| ms > 0),
            heartbeats_lost: get(&self.heartbeats_lost),
            errors: get(&self.errors),
            in_flight,
        }
    }
}

/// The live workers, and the wake-up for a shutdown waiting on them and for workers sleeping
/// after an error.
#[derive(Default)]
struct Gate {
    alive: Mutex<usize>,
    cv: Condvar,
}

impl Gate {
    /// Sleeps up to `d`, or until the pool stops.
    fn sleep(&self, d: Duration, stop: &StopSignal) {
        let mut alive = self.alive.lock();
        if !stop.is_stopped() {
            self.cv.wait_for(&mut alive, d);
        }
    }

    fn wake_all(&self) {
        let _alive = self.alive.lock();
        self.cv.notify_all();
    }

    fn exit(&self) {
        let mut alive = self.alive.lock();
        *alive = alive.saturating_sub(1);
        self.cv.notify_all();
    }

    /// Waits until `done(live workers)` holds or `deadline` passes (`None`: no deadline);
    /// returns the live workers then.
    fn wait(&self, deadline: Option<Instant>, done: impl Fn(usize) -> bool) -> usize {
        let mut alive = self.alive.lock();
        while !done(*alive) {
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut alive, d).timed_out() {
                        break;
                    }
                }
                None => self.cv.wait(&mut alive),
            }
        }
        *alive
    }
}

struct PoolState {
    /// The queue's name, for `Debug` (the workers hold the queue itself, each its own
    /// handle, so a pool whose workers all ended holds none).
    queue_name: Option<String>,
    /// The thread name prefix: the pool's name in a [`PoolMonitor`].
    name: String,
    stop: StopSignal,
    idle_timeout: Duration,
    heartbeat_every: Option<Duration>,
    heartbeat_extend: Option<Duration>,
    job_timeout: Timeouts,
    slots: Vec<Mutex<WorkerSlot>>,
    /// Set by each worker as its last act, once it let go of its queue handle: a shutdown
    /// joins exactly these (the join returns at once) and reports the others as still
    /// running.
    exited: Vec<std::sync::atomic::AtomicBool>,
    beats: heartbeat::Beats,
    gate: Gate,
    counters: PoolCounters,
}

impl PoolState {
    /// The worker's plain handler returned: `Running` → `Committing`. `false` if the
    /// shutdown claimed the job.
    fn enter_commit(&self, index: usize) -> bool {
        let Some(slot) = self.slots.get(index) else {
            return true;
        };
        let mut slot = slot.lock();
        match *slot {
            WorkerSlot::Claimed => false,
            _ => {
                *slot = WorkerSlot::Committing;
                true
            }
        }
    }

    /// The job is over for its worker: back to `Idle`. Returns whether the shutdown had
    /// claimed it (then the shutdown stops its heartbeat).
    fn leave(&self, index: usize) -> bool {
        let Some(slot) = self.slots.get(index) else {
            return false;
        };
        let old = std::mem::replace(&mut *slot.lock(), WorkerSlot::Idle);
        matches!(old, WorkerSlot::Claimed)
    }

    fn in_flight(&self) -> u64 {
        let busy = self
            .slots
            .iter()
            .filter(|s| !matches!(*s.lock(), WorkerSlot::Idle))
            .count();
        u64::try_from(busy).unwrap_or(u64::MAX)
    }

    fn claimed(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(*s.lock(), WorkerSlot::Claimed))
            .count()
    }

    /// Claims every job whose handler still runs, so its worker will not commit it.
    fn claim_running(&self) -> Vec<Arc<Lease>> {
        let mut taken = Vec::new();
        for slot in &self.slots {
            let mut slot = slot.lock();
            if let WorkerSlot::Running(lease) = &*slot {
                taken.push(Arc::clone(lease));
                *slot = WorkerSlot::Claimed;
            }
        }
        taken
    }
}

/// Settings of a [`WorkerPool`]; made by [`WorkerPool::builder`], started by
/// [`start`](PoolBuilder::start) (plain handler) or [`start_effects`](PoolBuilder::start_effects)
/// (effect handler). Every setting is checked when the pool starts.
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    queue: Queue,
    threads: Option<usize>,
    heartbeat_every: Option<Duration>,
    heartbeat_extend: Option<Duration>,
    job_timeout: Option<Duration>,
    on_timeout: OnTimeout,
    idle_timeout: Duration,
    drop_grace: Duration,
    thread_name: String,
    stop: Option<StopSignal>,
}

impl PoolBuilder {
    /// Worker threads, 1 to [`WORKER_THREADS_MAX`] (256); default: the machine's available
    /// parallelism (at most 256). Each runs one handler at a time.
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// Time between two heartbeats of a running job (whole ms, 1 ms to
    /// [`LEASE_MAX`]); default: a third of the job's lease (of
    /// [`heartbeat_extend`](PoolBuilder::heartbeat_extend) when set, else of
    /// [`Lease::lease_ms`]). Used up to half the extend at most, so a job whose own lease is
    /// short is still kept. Keep it well under the lease: a heartbeat is a commit, and one
    /// that comes after the deadline may find the job delivered again.
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.heartbeat_every = Some(every);
        self
    }

    /// How far each heartbeat extends a running job's lease (whole ms, 1 ms to
    /// [`LEASE_MAX`]): the deadline becomes the heartbeat's now plus this. Default: the
    /// delivery's own lease ([`Lease::lease_ms`]: the job's, else the queue handle's).
    pub fn heartbeat_extend(mut self, extend: Duration) -> Self {
        self.heartbeat_extend = Some(extend);
        self
    }

    /// An execution timeout for every job (whole ms, 1 ms to [`LEASE_MAX`]; default none), as
    /// River's `JobTimeout`, Oban's `timeout/1` and BullMQ's `timeout`. A job's own timeout
    /// ([`EnqueueOptions::timeout`](crate::job::EnqueueOptions::timeout), River's `Timeout()`
    /// per job) wins over it, longer or shorter, and is kept even by a pool without one; what
    /// a timeout does is this pool's [`on_timeout`](PoolBuilder::on_timeout) either way.
    ///
    /// A handler still running this long after it started (after its delivery, to be exact)
    /// has its delivery ended by the pool's heartbeat thread:
    /// given back through the retry policy with the error `timed out after N ms` (or dead,
    /// with [`PoolBuilder::on_timeout`]); its heartbeats stop, and its late ack, nack or
    /// `ack_with` is refused with `LeaseLost` and writes nothing (the fencing token moved
    /// on), so the job can be delivered again while the old handler still runs.
    ///
    /// A thread cannot be stopped from outside: the handler runs on until it returns. It can
    /// stop early on its own: [`is_timed_out`] and [`job_deadline`] answer on the worker's
    /// thread. An async pool's handler (`PoolBuilder::start_async`, feature `tokio`) is a future, and is
    /// dropped at its next `.await` once its time is up. An effect handler
    /// ([`PoolBuilder::start_effects`]) runs inside its commit, which nothing else can end
    /// meanwhile: it is not timed.
    pub fn job_timeout(mut self, timeout: Duration) -> Self {
        self.job_timeout = Some(timeout);
        self
    }

    /// What a [`job_timeout`](PoolBuilder::job_timeout), or a job's own timeout
    /// ([`EnqueueOptions::timeout`](crate::job::EnqueueOptions::timeout)), does to the job
    /// (default [`OnTimeout::Retry`]).
    pub fn on_timeout(mut self, action: OnTimeout) -> Self {
        self.on_timeout = action;
        self
    }

    /// How long an idle worker blocks in one [`Queue::dequeue_until`] (1 ms to
    /// [`IDLE_TIMEOUT_MAX`]; default [`IDLE_TIMEOUT_DEFAULT`], 5 s). New work and the pool's
    /// stop wake it at once; this only bounds one wait, so it sets how often an idle pool
    /// looks at the queue ([`PoolStats::polls`]).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// The grace a dropped pool gives its running handlers (default
    /// [`DROP_GRACE_DEFAULT`], 10 s): dropping the pool calls
    /// [`shutdown`](WorkerPool::shutdown) with it, so the drop blocks up to about that long.
    pub fn drop_grace(mut self, grace: Duration) -> Self {
        self.drop_grace = grace;
        self
    }

    /// The threads' name prefix (default [`THREAD_NAME_DEFAULT`]): workers are named
    /// `{prefix}-{n}` and the heartbeat thread `{prefix}-heartbeat` (Linux shows the first
    /// 15 bytes). It must not contain a NUL byte.
    pub fn thread_name(mut self, prefix: impl Into<String>) -> Self {
        self.thread_name = prefix.into();
        self
    }

    /// Use this stop signal instead of a new one, so handlers can watch it (a long handler
    /// that checks [`StopSignal::is_stopped`] can end early at shutdown). Stopping it
    /// yourself makes the workers take no more jobs (each ends the job it runs, then exits);
    /// [`WorkerPool::shutdown`] is still what gives leases back and ends the heartbeats.
    pub fn stop_signal(mut self, stop: StopSignal) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Starts the pool with a plain handler: `Ok(())` acks the job (at-least-once: a crash
    /// between the work and the ack repeats the work); `Err(e)` gives it back through the
    /// queue's retry policy with `e`'s text as its last error (dead when out of attempts),
    /// unless `e` is an [`Outcome`]; a panic is caught and handled as an error whose text is
    /// `panic: <message>`. The lease is the pool's: the handler reads it (`payload`,
    /// `decode`, `attempt`, ...) but must not ack, nack, fail or snooze it (the pool's own
    /// call would then find it `LeaseLost`). Its [`deadline_ms`](Lease::deadline_ms) is the
    /// one the dequeue set: the pool's heartbeats move the stored deadline, not that copy.
    ///
    /// # Errors
    /// `InvalidOption` for a setting out of range (threads 0 or above
    /// [`WORKER_THREADS_MAX`], a zero or too long interval, a heartbeat interval not below a
    /// configured extend, a thread name with a NUL byte); `Closed` if
    /// [`Queue::close`] was called on the file; `Io` if a thread could not be
    /// spawned (the threads already started are stopped first).
    pub fn start<F>(self, handler: F) -> Result<WorkerPool>
    where
        F: Fn(&Lease) -> std::result::Result<(), BoxError> + Send + Sync + 'static,
    {
        self.spawn(Handler::Plain(Box::new(handler)))
    }

    /// Starts the pool with an effect handler, run inside [`Lease::ack_with`]: its writes
    /// to the app's own tables (through `tx`, in the queue's file), the applied marker of the
    /// job's idempotency key and the ack commit together or not at all, and a job whose key
    /// is already applied is acked without running it ([`PoolStats::already_applied`]).
    /// `Err` or a panic (caught; its text `panic: <message>`) drops the writes and gives the
    /// job back through the retry policy, as `ack_with` does; an [`Outcome`] returned as the
    /// error is honoured by `ack_with` itself (snoozed, failed, or retried after its backoff).
    ///
    /// **The handler runs inside the queue's write transaction**: every other write of the
    /// file (other workers' commits, heartbeats, enqueues) waits while it runs, and it may
    /// run more than once (a group commit that aborts is replayed). Keep it to the
    /// transaction's writes; do slow or outside work in a plain handler. It must not call the
    /// queue or the lease (`Reentrant`).
    ///
    /// # Errors
    /// As [`start`](PoolBuilder::start).
    ///
    /// ```
    /// use leaseq::redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
    /// use leaseq::{EnqueueOptions, Queue, WorkerPool};
    /// use std::time::Duration;
    ///
    /// const SENT: TableDefinition<u64, &[u8]> = TableDefinition::new("sent");
    ///
    /// let dir = tempfile::tempdir()?;
    /// let queue = Queue::open(dir.path().join("app.leaseq"))?;
    /// for key in ["mail-1", "mail-2", "mail-1"] {
    ///     queue.enqueue(key.as_bytes(), EnqueueOptions::default().idempotency_key(key))?;
    /// }
    /// let pool = WorkerPool::builder(&queue).threads(2).start_effects(|tx, lease| {
    ///     tx.open_table(SENT)?.insert(lease.id().0, lease.payload())?;
    ///     Ok(())
    /// })?;
    /// while !queue.is_empty()? {
    ///     std::thread::sleep(Duration::from_millis(10));
    /// }
    /// pool.shutdown(Duration::from_secs(5));
    /// let rows = queue.database().begin_read()?.open_table(SENT)?.len()?;
    /// assert_eq!(rows, 2); // "mail-1" applied once
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_effects<F>(self, handler: F) -> Result<WorkerPool>
    where
        F: Fn(&Tx<'_>, &Lease) -> std::result::Result<(), BoxError> + Send + Sync + 'static,
    {
        self.spawn(Handler::Effect(Box::new(handler)))
    }

    /// Starts the pool with a staged handler, for "slow or outside work, then commit its
    /// result with the ack": `handler` runs outside the write transaction (as a plain
    /// handler: heartbeats keep the lease, other writes of the file go on, a shutdown can
    /// give its job back), and returns an [`Effect`]: the writes that then commit with the
    /// job's ack in one transaction ([`Lease::ack_with`]: with the idempotency key's applied
    /// marker). So an HTTP call's response and the ack are never apart, and the write lock is
    /// never held across the call.
    ///
    /// A job whose idempotency key is already applied (a redelivery after a crash between
    /// the commit and the answer) is acked without running the handler
    /// ([`PoolStats::already_applied`]). An `Err` from either stage, or a panic, gives the
    /// job back as a plain handler's error does (an [`Outcome`] as the error does what it
    /// says); a crash between the stages runs the first stage again: make it safe to repeat
    /// (an idempotency key on the outside call, as the guide's outbox does).
    ///
    /// ```
    /// use leaseq::redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
    /// use leaseq::worker::effect;
    /// use leaseq::{EnqueueOptions, Queue, WorkerPool};
    /// use std::time::Duration;
    ///
    /// const RECEIPTS: TableDefinition<&str, &str> = TableDefinition::new("receipts");
    ///
    /// let dir = tempfile::tempdir()?;
    /// let queue = Queue::open(dir.path().join("app.leaseq"))?;
    /// queue.enqueue(b"order-1", EnqueueOptions::default().idempotency_key("order-1"))?;
    /// let pool = WorkerPool::builder(&queue).threads(2).start_staged(|lease| {
    ///     let order = String::from_utf8(lease.payload().to_vec())?;
    ///     let receipt = format!("paid {order}"); // the slow call, outside the transaction
    ///     Ok(effect(move |tx| {
    ///         tx.open_table(RECEIPTS)?.insert(order.as_str(), receipt.as_str())?;
    ///         Ok(())
    ///     }))
    /// })?;
    /// while !queue.is_empty()? {
    ///     std::thread::sleep(Duration::from_millis(10));
    /// }
    /// pool.shutdown(Duration::from_secs(5));
    /// assert!(queue.is_applied("order-1")?);
    /// let rows = queue.database().begin_read()?.open_table(RECEIPTS)?.len()?;
    /// assert_eq!(rows, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`start`](PoolBuilder::start).
    pub fn start_staged<F>(self, handler: F) -> Result<WorkerPool>
    where
        F: Fn(&Lease) -> std::result::Result<Effect, BoxError> + Send + Sync + 'static,
    {
        self.spawn(Handler::Staged(Box::new(handler)))
    }

    fn validate_threads(&self) -> Result<usize> {
        let threads = self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(WORKER_THREADS_MAX)
        });
        if !(1..=WORKER_THREADS_MAX).contains(&threads) {
            return Err(invalid(
                "threads",
                format!("{threads}: a pool runs 1 to {WORKER_THREADS_MAX} threads"),
            ));
        }
        Ok(threads)
    }

    fn validate(&self) -> Result<usize> {
        let threads = self.validate_threads()?;
        let in_range = |field: &'static str, d: Duration, max: Duration| {
            if d < Duration::from_millis(1) || d > max {
                Err(invalid(
                    field,
                    format!("{} ms: from 1 ms to {} ms", d.as_millis(), max.as_millis()),
                ))
            } else {
                Ok(())
            }
        };
        if let Some(every) = self.heartbeat_every {
            in_range("heartbeat_every", every, LEASE_MAX)?;
        }
        if let Some(extend) = self.heartbeat_extend {
            in_range("heartbeat_extend", extend, LEASE_MAX)?;
        }
        if let (Some(every), Some(extend)) = (self.heartbeat_every, self.heartbeat_extend)
            && every >= extend
        {
            return Err(invalid(
                "heartbeat_every",
                "must be below heartbeat_extend, or the lease ends between two heartbeats",
            ));
        }
        in_range("idle_timeout", self.idle_timeout, IDLE_TIMEOUT_MAX)?;
        if let Some(timeout) = self.job_timeout {
            in_range("job_timeout", timeout, LEASE_MAX)?;
        }
        if self.thread_name.contains('\0') {
            return Err(invalid("thread_name", "contains a NUL byte"));
        }
        Ok(threads)
    }

    /// The pool's execution timeouts, for its workers.
    fn timeouts(&self) -> Timeouts {
        Timeouts {
            pool: self.job_timeout,
            action: self.on_timeout,
        }
    }

    fn spawn(self, handler: Handler) -> Result<WorkerPool> {
        let threads = self.validate()?;
        // A pool over a closed file would take nothing: say so instead of idling.
        if self.queue.is_closed() {
            return Err(Error::Closed);
        }
        let shared = Arc::new(PoolState {
            queue_name: self.queue.name().map(str::to_string),
            name: self.thread_name.clone(),
            stop: self.stop.clone().unwrap_or_default(),
            idle_timeout: self.idle_timeout,
            heartbeat_every: self.heartbeat_every,
            heartbeat_extend: self.heartbeat_extend,
            job_timeout: self.timeouts(),
            slots: (0..threads).map(|_| Mutex::new(WorkerSlot::Idle)).collect(),
            exited: (0..threads).map(|_| Default::default()).collect(),
            beats: heartbeat::Beats::default(),
            gate: Gate::default(),
            counters: PoolCounters::default(),
        });
        let mut pool = WorkerPool {
            shared: Arc::clone(&shared),
            workers: Vec::with_capacity(threads),
            heart: None,
            drop_grace: self.drop_grace,
            done: false,
        };
        // The workers share the handler (it may hold queue handles of its own): the last
        // worker to exit drops it.
        let handler = Arc::new(handler);
        let heart = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("{}-heartbeat", self.thread_name))
                .spawn(move || shared.beats.run(&shared.counters))
        };
        pool.heart = Some(heart.map_err(|e| pool.abort(e))?);
        for index in 0..threads {
            *shared.gate.alive.lock() += 1;
            let worker = {
                let own = run::Own {
                    queue: self.queue.clone(),
                    handler: Arc::clone(&handler),
                };
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("{}-{index}", self.thread_name))
                    .spawn(move || run::worker(&shared, index, own))
            };
            match worker {
                Ok(handle) => pool.workers.push(handle),
                Err(e) => {
                    shared.gate.exit();
                    return Err(pool.abort(e));
                }
            }
        }
        Ok(pool)
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidOption {
        field,
        reason: reason.into(),
    }
}

/// Threads that run a handler on every job of a [`Queue`], with heartbeats, panic
/// catching and a graceful shutdown: how it works is on [the module page](crate::worker).
/// Made by [`WorkerPool::builder`].
///
/// The pool holds a handle to the queue (so the file stays open) until it is shut down and
/// every handler it started has returned.
pub struct WorkerPool {
    shared: Arc<PoolState>,
    workers: Vec<JoinHandle<()>>,
    heart: Option<JoinHandle<()>>,
    drop_grace: Duration,
    /// Set once shut down, so the drop does not do it again.
    done: bool,
}

impl fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerPool")
            .field("queue", &self.shared.queue_name)
            .field("threads", &self.workers.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl WorkerPool {
    /// A builder for a pool over `queue` (any handle: the default queue, a named one, one
    /// with its own defaults from [`Queue::with_lease`] and the like). The pool keeps a clone
    /// of the handle, and each worker one (named by this call's line in a
    /// [`FileShutdown`](crate::FileShutdown) while they live).
    #[track_caller]
    pub fn builder(queue: &Queue) -> PoolBuilder {
        PoolBuilder {
            queue: queue.clone(),
            threads: None,
            heartbeat_every: None,
            heartbeat_extend: None,
            job_timeout: None,
            on_timeout: OnTimeout::Retry,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            drop_grace: DROP_GRACE_DEFAULT,
            thread_name: THREAD_NAME_DEFAULT.to_string(),
            stop: None,
        }
    }

    /// Counts since the pool started, and the handlers running now.
    pub fn stats(&self) -> PoolStats {
        self.shared.counters.snapshot(self.shared.in_flight())
    }

    /// The number of worker threads.
    pub fn threads(&self) -> usize {
        self.shared.slots.len()
    }

    /// A view of this pool's counters that other parts of the app hold without holding the
    /// pool: `Dashboard::pool` (feature `dashboard`) and `Control::pool` (feature
    /// `control`) show it as the workers view, as Sidekiq's processes page and Oban Web's
    /// nodes. It keeps nothing of the pool alive: once the
    /// pool is gone it reads as stopped.
    pub fn monitor(&self) -> PoolMonitor {
        let state: Arc<dyn Counted> = self.shared.clone();
        PoolMonitor {
            name: self.shared.name.clone(),
            queue: self.shared.queue_name.clone(),
            threads: self.shared.slots.len(),
            state: Arc::downgrade(&state),
        }
    }

    /// The pool's stop signal (the one given to [`PoolBuilder::stop_signal`], else its own).
    pub fn stop_signal(&self) -> StopSignal {
        self.shared.stop.clone()
    }

    /// Stops the pool, and returns once every job in flight was ended or given back:
    ///
    /// 1. The stop signal is set: idle workers wake at once and exit; no handler starts
    ///    from now on (a job taken as the stop came is given back unstarted, uncharged).
    /// 2. Running handlers get up to `grace` to return; each job is then ended by its
    ///    worker as usual (ack, retry, ...), and its heartbeat goes on until that commit.
    /// 3. At the end of the grace, the lease of every handler still running is given back
    ///    ([`Lease::nack_after`] with a zero backoff: delivered again at once, not after its
    ///    lease; the attempt counted, so a job that always outlives the grace dies at its
    ///    `max_attempts` as a crashing one would). Its heartbeat stops after that commit. The
    ///    handler's thread cannot be killed: it runs on, and its final call finds the lease
    ///    `LeaseLost` and changes nothing. An effect handler already inside its commit cannot
    ///    be given back (every write waits for that transaction): its commit decides.
    /// 4. Workers that were mid-commit get up to 1 s more; the heartbeat thread ends once no
    ///    job it beats is left (last of all).
    ///
    /// Takes about `grace` at most when handlers overrun, plus the give-back commits (each a
    /// write, which waits for a write transaction held elsewhere on the file, as any write).
    /// The file is never closed ([`Queue::close`]); other consumers go on.
    pub fn shutdown(mut self, grace: Duration) -> ShutdownReport {
        self.shut(grace)
    }

    fn shut(&mut self, grace: Duration) -> ShutdownReport {
        self.done = true;
        let started = Instant::now();
        let shared = &self.shared;
        shared.stop.stop();
        shared.gate.wake_all();
        let before = shared.counters.snapshot(0);
        // 2: the running handlers finish within the grace.
        shared
            .gate
            .wait(started.checked_add(grace), |alive| alive == 0);
        // 3: the leases of the handlers still running go back.
        let reason = format!(
            "given back at shutdown: the handler was still running after the grace of {} ms",
            grace.as_millis()
        );
        for lease in shared.claim_running() {
            match lease.nack_after(&reason, Duration::ZERO) {
                Ok(_) => PoolCounters::add(&shared.counters.given_back),
                // It had expired and was delivered again: nothing to give back.
                Err(Error::LeaseLost { .. }) => {}
                Err(e) => {
                    PoolCounters::add(&shared.counters.errors);
                    tracing::warn!(job = lease.id().0, error = %e, "leaseq pool: giving back at shutdown");
                }
            }
            shared.beats.stop(lease.token());
        }
        // 4: workers mid-commit come back; those still in a handler are left running.
        let wait_until = Instant::now().checked_add(COMMIT_WAIT);
        shared
            .gate
            .wait(wait_until, |alive| alive <= shared.claimed());
        // Every worker that exited is joined (it let go of its queue handle before saying
        // so, so the join returns at once); the others are still running.
        let mut still_running = 0;
        for (index, worker) in std::mem::take(&mut self.workers).into_iter().enumerate() {
            let exited = shared
                .exited
                .get(index)
                .is_some_and(|e| e.load(Ordering::SeqCst));
            if exited {
                let _ = worker.join();
            } else {
                still_running += 1;
            }
        }
        if shared.beats.exit()
            && let Some(heart) = self.heart.take()
        {
            let _ = heart.join();
        }
        let after = shared.counters.snapshot(shared.in_flight());
        ShutdownReport::between(&before, after, still_running, started)
    }

    /// Stops what a failed start had begun, and passes the spawn error on.
    fn abort(&mut self, e: std::io::Error) -> Error {
        self.shut(Duration::ZERO);
        Error::Io(e)
    }
}

impl Drop for WorkerPool {
    /// Shuts the pool down with [`PoolBuilder::drop_grace`] unless
    /// [`shutdown`](WorkerPool::shutdown) already did.
    fn drop(&mut self) {
        if !self.done {
            let _ = self.shut(self.drop_grace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_texts_say_what_was_asked() {
        assert_eq!(
            Outcome::Snooze(Duration::from_secs(2)).to_string(),
            "snooze for 2000 ms"
        );
        assert_eq!(Outcome::Fail("bad".into()).to_string(), "fail: bad");
        let retry = Outcome::Retry {
            after: Duration::from_millis(5),
            reason: "busy".into(),
        };
        assert_eq!(retry.to_string(), "busy (retry after 5 ms)");
        let boxed: BoxError = retry.clone().into();
        assert_eq!(boxed.downcast_ref::<Outcome>(), Some(&retry));
    }

    #[test]
    fn panic_texts() {
        let p = std::panic::catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
        assert_eq!(crate::error::panic_message(&*p), "boom 7");
        let p = std::panic::catch_unwind(|| std::panic::panic_any(5u8)).unwrap_err();
        assert_eq!(crate::error::panic_message(&*p), "non-string panic payload");
    }
}
