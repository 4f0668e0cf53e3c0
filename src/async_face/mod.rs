//! The async face (feature `async`): [`AsyncQueue`] and [`AsyncLease`], for apps on an async
//! runtime (tokio, Tauri, async-std, smol: no runtime is required).
//!
//! **Nothing blocks a runtime thread on a commit.** Every call that waits for a commit (an
//! enqueue, a dequeue's lease, an ack) runs on one of leaseq's helper threads (started on
//! demand, at most [`ASYNC_THREADS_MAX`](crate::ASYNC_THREADS_MAX), exiting after 10 s idle;
//! concurrent calls share commits, as threads do), and its future resolves when the commit
//! is durable. So does every read of the file (`stats`, `jobs`, `schedules`, ... and
//! [`AsyncQueue::read`] for the app's own tables): a read transaction commits nothing, but
//! it reads pages from disk, and some reads are long (`check` reads the whole file). The one
//! read on the caller's thread is a dequeue's look at the queue (a short read transaction
//! over the first entries of its indexes), before it asks a helper for the commit; what a
//! handle holds in memory (`is_paused`, `name`, `recovery`, a subscription to `events`) is
//! answered at once.
//!
//! **A waiting consumer holds no thread.** An async dequeue that finds nothing registers its
//! task with the queue's own wake-up: the commit that makes work available wakes it, as
//! does the next due time, its timeout, a [`StopSignal`], [`Queue::close`] and
//! [`Queue::shutdown`]. No polling.
//!
//! **Cancel-safe dequeues.** A dequeue future may be dropped at any point (a `select!`
//! branch lost, a `tokio::time::timeout` ran out, the task aborted) and no job is stranded:
//! a lease it took but never handed out goes back right after the drop (a commit on a helper
//! thread, a few ms: until it lands the job still shows as leased), ready in the place it had, its
//! attempt not charged; so does the next lease of a dropped [`AsyncLease::ack_and_next`]
//! (its ack stands). Other calls cannot be taken back once started: a dropped
//! `enqueue`, `ack`, `cancel`, `pause`, ... future still completes on its helper (the job is
//! enqueued or acked, or not, as if the answer had been read), as a database driver's
//! dropped query may still commit.
//!
//! **No blocking call a dot away.** [`AsyncQueue`] and [`AsyncLease`] do not deref to the
//! blocking [`Queue`] and [`Lease`]: their calls are futures, or reads of memory (a lease's
//! `payload`, `decode`, `attempt`, ...). The blocking handle is one explicit step away
//! ([`AsyncQueue::blocking`], [`AsyncLease::blocking`]), for a call this face does not
//! repeat ([`Queue::database`], [`Queue::reader`], whose calls block), made where a thread
//! may block. [`AsyncQueue`] has every other call of [`Queue`], under the same name, with
//! the same arguments (borrowed ones copied; leases as [`AsyncLease`]s) and the same answer
//! (a handle as an `AsyncQueue`, a lease as an `AsyncLease`; [`AsyncQueue::compact`] gives
//! its handle back beside its answer).
//!
//! **Transactions stay synchronous.** The closures of [`AsyncQueue::write`] and
//! [`AsyncLease::ack_with`] run on a helper inside the write transaction; they cannot await
//! (a transaction never spans an await: every other writer of the file would wait). Do the
//! slow or outside work before, then commit its result with the ack.
//!
//! Where leaseq differs from apalis or effectum: there is no server or polling loop, the
//! queue is one file in the app, and the guarantees are those of the blocking API, call for
//! call (an `await`ed `Ok` is as durable as the blocking call's).
//!
//! ```
//! use leaseq::{EnqueueOptions, Queue};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let queue = Queue::open(dir.path().join("app.leaseq"))?.to_async();
//! queue.enqueue(b"sync note 7", EnqueueOptions::default()).await?;
//! // Waits without a thread; dropping this future never strands a job.
//! if let Some(lease) = queue.dequeue_timeout(Duration::from_secs(5)).await? {
//!     assert_eq!(lease.payload(), b"sync note 7");
//!     lease.ack().await?;
//! }
//! # Ok(())
//! # }
//! ```

mod admin;
mod handles;
mod observe;
mod offload;
mod wait;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{BoxError, Result};
use crate::format::payload::Encoding;
use crate::job::{Applied, EnqueueOptions, Enqueued, JobId, JobState};
use crate::lease::Lease;
use crate::queue::Queue;
use crate::queue::lifecycle::FileShutdown;
use crate::stop::StopSignal;
use crate::tx::Tx;

use offload::{call, call_or_abandon};
use wait::SignalWait;

impl Queue {
    /// This queue's async face: the same queue (a clone of this handle), with calls that
    /// never block the caller's thread on a commit. See [`AsyncQueue`].
    #[track_caller]
    pub fn to_async(&self) -> AsyncQueue {
        AsyncQueue {
            queue: self.clone(),
        }
    }

    /// [`Queue::to_async`] taking this handle instead of a clone: for the last handle of an
    /// app on its way to [`AsyncQueue::shutdown`] (`queue.into_async().shutdown(grace).await`),
    /// which waits for every other handle.
    pub fn into_async(self) -> AsyncQueue {
        AsyncQueue { queue: self }
    }
}

/// A [`Queue`] handle whose calls are futures: commits run on leaseq's helper threads,
/// waiting consumers are woken by the queue's own signal, and a dropped dequeue never
/// strands a job ([the module page](crate::async_face) says how). Cheap to clone; `Send +
/// Sync`. Made by [`Queue::to_async`] or [`AsyncQueue::open`]. Every call of [`Queue`] is
/// here under its name (but `database` and `reader`, whose calls block: use
/// [`AsyncQueue::read`], or [`AsyncQueue::blocking`] where a thread may block): each that
/// commits or reads the file is a future run on a helper, which completes even if the
/// future is dropped (a dequeue's lease goes back); reads of memory answer at once.
/// [`AsyncQueue::run`] runs blocking calls of the handle on a helper, several in one trip.
/// Each call's errors are its blocking form's; one more for every future, reads too: from
/// inside a `write` or `ack_with` closure (a `block_on` there), `Reentrant` at once.
///
/// It is a handle like any other: it keeps the file open until dropped, and
/// [`Queue::shutdown`] waits for it.
#[derive(Clone)]
pub struct AsyncQueue {
    queue: Queue,
}

impl fmt::Debug for AsyncQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncQueue")
            .field("queue", &self.queue)
            .finish()
    }
}

impl AsyncQueue {
    /// The blocking handle of the same queue.
    pub fn blocking(&self) -> &Queue {
        &self.queue
    }

    /// [`Queue::enqueue`], its commit on a helper thread. `payload` is copied.
    ///
    /// # Errors
    /// As [`Queue::enqueue`].
    pub async fn enqueue(&self, payload: &[u8], opts: EnqueueOptions) -> Result<Enqueued> {
        let mut out = self.enqueue_waiting(vec![(payload.to_vec(), opts)]).await?;
        debug_assert_eq!(out.len(), 1);
        Ok(out.remove(0))
    }

    /// Enqueues `jobs` in one commit on a helper; into a full queue whose size limit blocks
    /// ([`WhenFull::Block`](crate::WhenFull::Block)), tries again after pauses awaited on a
    /// timer, so no thread (runtime or helper) waits for room.
    async fn enqueue_waiting(&self, jobs: Vec<(Vec<u8>, EnqueueOptions)>) -> Result<Vec<Enqueued>> {
        let jobs = std::sync::Arc::new(jobs);
        let mut wait = Some(crate::queue::produce::FullWait::default());
        loop {
            let (q, batch) = (self.queue.clone(), jobs.clone());
            let full = match call(move || {
                let batch: Vec<(&[u8], EnqueueOptions)> = batch
                    .iter()
                    .map(|(p, o)| (p.as_slice(), o.clone()))
                    .collect();
                q.enqueue_once(&batch)
            })
            .await
            {
                Err(full @ crate::error::Error::QueueFull { .. }) => full,
                done => return done,
            };
            // The first look reads the limit: on a helper, as every read of the file.
            let (q, mut w) = (self.queue.clone(), wait.take().unwrap_or_default());
            let (w, next) = call(move || {
                let next = w.next(&q);
                Ok((w, next))
            })
            .await?;
            wait = Some(w);
            match next? {
                Some(pause) => futures_timer::Delay::new(pause).await,
                None => return Err(full),
            }
        }
    }

    /// [`Queue::enqueue_value`]: `value` is encoded on the caller's thread, the commit runs
    /// on a helper.
    ///
    /// # Errors
    /// As [`Queue::enqueue_value`].
    pub async fn enqueue_value<T>(&self, value: &T, opts: EnqueueOptions) -> Result<Enqueued>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let (payload, opts) = opts.typed(value, self.queue.config().encoding)?;
        let mut out = self.enqueue_waiting(vec![(payload, opts)]).await?;
        debug_assert_eq!(out.len(), 1);
        Ok(out.remove(0))
    }

    /// [`Queue::enqueue_batch`] (one commit for all, all or nothing), its commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::enqueue_batch`].
    pub async fn enqueue_batch(
        &self,
        jobs: Vec<(Vec<u8>, EnqueueOptions)>,
    ) -> Result<Vec<Enqueued>> {
        self.enqueue_waiting(jobs).await
    }

    /// [`Queue::write`]: `f` runs on a helper thread inside the write transaction (it may
    /// run more than once, as there: a group that aborts is replayed), and cannot await.
    ///
    /// # Errors
    /// As [`Queue::write`].
    pub async fn write<T, F>(&self, mut f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Tx<'_>) -> std::result::Result<T, BoxError> + Send + 'static,
    {
        self.on_helper(move |q| q.write(&mut f)).await
    }

    /// The async form of [`Queue::import_batch`] (`jobs` copied): up to
    /// [`BATCH_MAX`](crate::BATCH_MAX) jobs with their state and history, in one commit on a
    /// helper, all or nothing; one result per job, in order. Never waits for room, as there.
    ///
    /// # Errors
    /// As [`Queue::import_batch`].
    pub async fn import_batch(&self, jobs: &[crate::job::ImportJob]) -> Result<Vec<Enqueued>> {
        let jobs = jobs.to_vec();
        self.on_helper(move |q| q.import_batch(&jobs)).await
    }

    /// [`Queue::validate_enqueue`]: what an enqueue would refuse of `payload` and `opts`,
    /// checked on the caller's thread (no I/O), writing nothing.
    ///
    /// # Errors
    /// As [`Queue::validate_enqueue`].
    pub fn validate_enqueue(&self, payload: &[u8], opts: &EnqueueOptions) -> Result<()> {
        self.queue.validate_enqueue(payload, opts)
    }

    /// Runs `f` with the blocking handle on a helper thread and returns its value: the
    /// escape hatch, for several blocking calls in one trip to a helper (each is still its
    /// own commit), or code written against [`Queue`] (every call of `Queue` but `database`
    /// and `reader` has its own async form here). Dropped, `f` still runs to its end on its
    /// helper.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?.to_async();
    /// use leaseq::JobState;
    ///
    /// queue.enqueue(b"x", Default::default()).await?;
    /// // The user signed out: stop delivering, then drop what waits.
    /// let dropped = queue
    ///     .run(|q| {
    ///         q.pause()?;
    ///         q.purge(JobState::Ready)
    ///     })
    ///     .await?;
    /// assert_eq!(dropped, 1);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `f`'s; `Reentrant` from inside a `write` or `ack_with` closure.
    pub async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Queue) -> Result<T> + Send + 'static,
    {
        self.on_helper(f).await
    }

    /// Runs `f` with a clone of the blocking handle on a helper thread: how every call of
    /// this face that commits or reads the file runs. The call completes there even if the
    /// returned future is dropped.
    fn on_helper<T, F>(&self, f: F) -> offload::Call<T>
    where
        T: Send + 'static,
        F: FnOnce(&Queue) -> Result<T> + Send + 'static,
    {
        let q = self.queue.clone();
        call(move || f(&q))
    }

    /// [`Queue::dequeue`]: the next job if one is available now, else `None` without
    /// waiting. Cancel-safe: dropped before it answered, a job it took goes back unseen (its
    /// attempt not charged).
    ///
    /// # Errors
    /// As [`Queue::dequeue`].
    pub async fn dequeue(&self) -> Result<Option<AsyncLease>> {
        Ok(self.dequeue_batch(1).await?.pop())
    }

    /// [`Queue::dequeue_batch`]: up to `max` jobs available now, in one commit. Cancel-safe
    /// as [`AsyncQueue::dequeue`].
    ///
    /// # Errors
    /// As [`Queue::dequeue_batch`].
    pub async fn dequeue_batch(&self, max: usize) -> Result<Vec<AsyncLease>> {
        if max == 0 || max > crate::limits::BATCH_MAX {
            return self.queue.dequeue_batch(max).map(|_| Vec::new());
        }
        match self.queue.peek_work()? {
            (true, _) => Ok(self.take(max).await?.0),
            (false, _) => Ok(Vec::new()),
        }
    }

    /// [`Queue::dequeue_timeout`]: the next job, waiting up to `timeout` for one, without a
    /// thread: the task is woken by the commit that makes work available, the next due time
    /// (read again at least every [`DUE_RECHECK_MAX`](crate::DUE_RECHECK_MAX) while one is
    /// pending), or [`Queue::close`] / [`Queue::shutdown`]. Cancel-safe: dropped at any point
    /// (a `select!` lost, a runtime's timeout), no job is stranded: a lease it took but did
    /// not hand out goes back right after the drop (a commit on a helper), ready in its place,
    /// its attempt not charged.
    ///
    /// # Errors
    /// As [`Queue::dequeue_timeout`]: `Closed` once the file is closed to deliveries (a
    /// blocked call wakes with it).
    pub async fn dequeue_timeout(&self, timeout: Duration) -> Result<Option<AsyncLease>> {
        self.wait_for_job(timeout, None).await
    }

    /// [`Queue::dequeue_until`]: as [`AsyncQueue::dequeue_timeout`], and `Ok(None)` as soon
    /// as `stop` is stopped (a waiting call wakes at once).
    ///
    /// # Errors
    /// As [`AsyncQueue::dequeue_timeout`].
    pub async fn dequeue_until(
        &self,
        timeout: Duration,
        stop: &StopSignal,
    ) -> Result<Option<AsyncLease>> {
        self.wait_for_job(timeout, Some(stop)).await
    }

    /// The next job, waiting for one as long as it takes: `Err(Closed)` ends the wait (a
    /// close or a shutdown of the file). For a consumer task's loop:
    /// `while let Ok(lease) = queue.next().await { ... }`, or `select!` it with the app's
    /// own stop.
    ///
    /// # Errors
    /// As [`AsyncQueue::dequeue_timeout`].
    pub async fn next(&self) -> Result<AsyncLease> {
        loop {
            if let Some(lease) = self.wait_for_job(Duration::from_secs(3600), None).await? {
                return Ok(lease);
            }
        }
    }

    async fn wait_for_job(
        &self,
        timeout: Duration,
        stop: Option<&StopSignal>,
    ) -> Result<Option<AsyncLease>> {
        let deadline = Instant::now().checked_add(timeout);
        let work = self.queue.work_signal();
        if let Some(stop) = stop {
            stop.watch(&work);
        }
        loop {
            // The epoch before the flags, as the blocking wait: a close or a stop after this
            // read moves it, and the wait below ends at once.
            let epoch = work.epoch();
            if stop.is_some_and(StopSignal::is_stopped) {
                return Ok(None);
            }
            let next_due_ms = match self.queue.peek_work()? {
                (true, _) => {
                    let (mut leases, next_due_ms) = self.take(1).await?;
                    if let Some(lease) = leases.pop() {
                        return Ok(Some(lease));
                    }
                    next_due_ms
                }
                (false, next_due_ms) => next_due_ms,
            };
            match self.queue.wait_before_looking(deadline, next_due_ms) {
                Some(wait) => SignalWait::new(Arc::clone(&work), epoch, wait).await,
                None => return Ok(None),
            }
        }
    }

    /// The commit of a dequeue, on a helper; leases a dropped future never handed out go
    /// back unseen.
    async fn take(&self, max: usize) -> Result<(Vec<AsyncLease>, Option<u64>)> {
        let q = self.queue.clone();
        let (leases, next_due_ms) =
            call_or_abandon(move || q.take_now(max), give_back_unseen).await?;
        Ok((
            leases.into_iter().map(AsyncLease::new).collect(),
            next_due_ms,
        ))
    }

    /// The async form of [`Queue::ack_batch`]: acks every lease in one commit on a helper;
    /// one outcome per lease, in order. Dropped, the acks still commit.
    ///
    /// # Errors
    /// As [`Queue::ack_batch`].
    #[must_use = "a lease of the batch may be LeaseLost: its outcome is in the Vec"]
    pub async fn ack_batch(&self, leases: &[AsyncLease]) -> Result<Vec<Result<()>>> {
        let leases = leases.to_vec();
        self.on_helper(move |q| q.ack_batch_of(&AsyncLease::borrow_all(&leases)))
            .await
    }

    /// The async form of [`Queue::ack_with_batch`]: `effect(tx, lease)` runs on a helper
    /// inside the write transaction for each lease that needs it (it may run more than once,
    /// as there; it cannot await), and the effects and acks commit together; one outcome
    /// per lease, in order. Dropped, it still commits.
    ///
    /// # Errors
    /// As [`Queue::ack_with_batch`].
    #[must_use = "a lease of the batch may be LeaseLost or Effect: its outcome is in the Vec"]
    pub async fn ack_with_batch<F>(
        &self,
        leases: &[AsyncLease],
        mut effect: F,
    ) -> Result<Vec<Result<Applied>>>
    where
        F: FnMut(&Tx<'_>, &AsyncLease) -> std::result::Result<(), BoxError> + Send + 'static,
    {
        let leases = leases.to_vec();
        self.on_helper(move |q| {
            q.ack_with_each(&AsyncLease::borrow_all(&leases), &mut |tx, i| {
                effect(tx, &leases[i])
            })
        })
        .await
    }

    /// The async form of [`Queue::ack_with_all`]: `effect(tx, leases)` runs once on a helper
    /// inside the write transaction, with the leases that need it (it may run more than
    /// once, as there; it cannot await); one outcome per lease, in order. Dropped, it still
    /// commits.
    ///
    /// # Errors
    /// As [`Queue::ack_with_all`].
    #[must_use = "a lease of the batch may be LeaseLost or Effect: its outcome is in the Vec"]
    pub async fn ack_with_all<F>(
        &self,
        leases: &[AsyncLease],
        mut effect: F,
    ) -> Result<Vec<Result<Applied>>>
    where
        F: FnMut(&Tx<'_>, &[&AsyncLease]) -> std::result::Result<(), BoxError> + Send + 'static,
    {
        let leases = leases.to_vec();
        self.on_helper(move |q| {
            q.ack_with_all_at(&AsyncLease::borrow_all(&leases), &mut |tx, at| {
                let chosen: Vec<&AsyncLease> = at.iter().map(|&i| &leases[i]).collect();
                effect(tx, &chosen)
            })
        })
        .await
    }

    /// [`Queue::flush`] on a helper.
    ///
    /// # Errors
    /// As [`Queue::flush`].
    pub async fn flush(&self) -> Result<()> {
        let q = self.queue.clone();
        call(move || q.flush()).await
    }

    /// [`Queue::shutdown`] without blocking the caller's thread: no new deliveries, `grace`
    /// for every other handle (async ones, leases and tasks included) to go (the task
    /// sleeps between looks, holding no thread), then the file closed and released (the
    /// final flush on a helper). Call it on the app's last handle: a blocking handle kept
    /// alive meanwhile (`queue.to_async().shutdown(..)` with `queue` still in scope) is a
    /// handle like any other, waited for the whole grace, and the file is not released;
    /// [`Queue::into_async`] gives up the blocking one. In async code prefer this to
    /// [`Queue::shutdown`], which blocks a runtime thread (on a current-thread runtime, the
    /// tasks it waits for could not even run).
    pub async fn shutdown(self, grace: Duration) -> FileShutdown {
        let started = Instant::now();
        let q = self.queue;
        q.begin_shutdown();
        let deadline = started.checked_add(grace);
        let mut look = Duration::from_micros(200);
        while q.other_handles() > 0 && deadline.is_none_or(|d| Instant::now() < d) {
            futures_timer::Delay::new(look).await;
            look = (look * 2).min(Duration::from_millis(2));
        }
        call(move || Ok(q.finish_shutdown(started)))
            .await
            .unwrap_or_else(|_| FileShutdown::not_released(started))
    }
}

/// What a dequeue's commit took when no one will read it: every lease back, unseen.
fn give_back_unseen(answer: Result<(Vec<Lease>, Option<u64>)>) {
    let Ok((leases, _)) = answer else {
        return;
    };
    for lease in leases {
        if let Err(e) = lease.release_unseen() {
            // The lease stays: the job comes back when it expires (the attempt counted).
            tracing::warn!(job = lease.id().0, error = %e, "leaseq: giving back a lease a dropped dequeue took");
        }
    }
}

/// What an `ack_and_next`'s commit leased when no one will read it: back, unseen.
fn give_back_next(answer: Result<Option<Lease>>) {
    give_back_unseen(answer.map(|next| (next.into_iter().collect(), None)));
}

/// A [`Lease`] for async code: the calls that commit or read the file are futures, run on a
/// helper thread; what the lease holds in memory (`id`, `payload`, `decode`, `attempt`,
/// `deadline_ms`, ...) is read at once; [`AsyncLease::set_result`] only stores in memory.
/// Dropping it is dropping the lease: the job stays leased until its deadline, then comes
/// back (the attempt counted), as SQS's visibility timeout; end it with a call.
///
/// **No `Deref` to [`Lease`]**: most of a `Lease`'s calls wait for a commit on the caller's
/// thread, which on a runtime thread stalls every task it runs (on a current-thread
/// runtime, the whole app). Deref coercion would put them all a dot away, compiling without
/// a warning (`lease.ack_and_next()` was the blocking one until this type had its own,
/// `lease.heartbeat().extend(..)`, `Lease::ack(&lease)`). So this type offers only what is
/// safe there; the blocking lease is one explicit step away, [`AsyncLease::blocking`], for
/// a call this type does not repeat ([`Lease::heartbeat`]'s handle, whose calls block),
/// from a thread that may block (`tokio::task::spawn_blocking`, a thread of the app's own).
///
/// Cloning it is cheap and shares the one delivery (an async pool's handler gets a clone):
/// a clone's [`extend`](AsyncLease::extend) is the async form of a heartbeat, and its
/// [`nack`](AsyncLease::nack) or [`fail`](AsyncLease::fail) of a watchdog's
/// [`Heartbeat`](crate::Heartbeat) calls.
///
/// ```
/// use leaseq::Queue;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let queue = Queue::open(dir.path().join("app.leaseq"))?.to_async();
/// queue.enqueue_value(&String::from("resize photo 12"), Default::default()).await?;
/// let lease = queue.dequeue().await?.expect("a job");
/// let task: String = lease.decode()?; // reads memory: no await
/// assert_eq!((task.as_str(), lease.attempt()), ("resize photo 12", 1));
/// lease.extend(Duration::from_secs(60)).await?; // commits on a helper
/// lease.set_result(b"done")?; // kept in memory for the ack
/// lease.ack().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a lease that is not acked is delivered again when it expires"]
#[derive(Clone)]
pub struct AsyncLease {
    lease: Arc<Lease>,
}

impl fmt::Debug for AsyncLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.lease, f)
    }
}

impl AsyncLease {
    fn new(lease: Lease) -> AsyncLease {
        AsyncLease {
            lease: Arc::new(lease),
        }
    }

    /// The blocking leases of `leases`, for a batch call of the blocking handle.
    fn borrow_all(leases: &[AsyncLease]) -> Vec<&Lease> {
        leases.iter().map(|l| &*l.lease).collect()
    }

    /// The blocking lease of the same delivery, for a call this type does not repeat.
    /// **Its calls that commit or read the file block the calling thread** (a commit is an
    /// fsync): make them where a thread may block, as `tokio::task::spawn_blocking` (move a
    /// clone of this `AsyncLease` in), not on a runtime thread.
    pub fn blocking(&self) -> &Lease {
        &self.lease
    }

    /// [`Lease::id`].
    pub fn id(&self) -> JobId {
        self.lease.id()
    }

    /// [`Lease::payload`].
    pub fn payload(&self) -> &[u8] {
        self.lease.payload()
    }

    /// [`Lease::decode`] (on the caller's thread: decoding reads memory only).
    ///
    /// # Errors
    /// As [`Lease::decode`].
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        self.lease.decode()
    }

    /// [`Lease::encoding`].
    pub fn encoding(&self) -> Encoding {
        self.lease.encoding()
    }

    /// [`Lease::attempt`].
    pub fn attempt(&self) -> u32 {
        self.lease.attempt()
    }

    /// [`Lease::snoozes`].
    pub fn snoozes(&self) -> u32 {
        self.lease.snoozes()
    }

    /// [`Lease::token`].
    pub fn token(&self) -> u64 {
        self.lease.token()
    }

    /// [`Lease::max_attempts`].
    pub fn max_attempts(&self) -> u32 {
        self.lease.max_attempts()
    }

    /// [`Lease::idempotency_key`].
    pub fn idempotency_key(&self) -> Option<&[u8]> {
        self.lease.idempotency_key()
    }

    /// [`Lease::deadline_ms`]: as this delivery began or as [`AsyncLease::extend`] (of this
    /// value or a clone) last set it.
    pub fn deadline_ms(&self) -> u64 {
        self.lease.deadline_ms()
    }

    /// [`Lease::lease_ms`].
    pub fn lease_ms(&self) -> u64 {
        self.lease.lease_ms()
    }

    /// [`Lease::timeout_ms`]: the job's own execution timeout in ms, if it has one.
    pub fn timeout_ms(&self) -> Option<u64> {
        self.lease.timeout_ms()
    }

    /// [`Lease::started_ms`]: when this delivery began, in Unix ms of the queue's clock.
    pub fn started_ms(&self) -> u64 {
        self.lease.started_ms()
    }

    /// [`Lease::set_result`]: kept in memory for the ack that ends this delivery (nothing is
    /// written now, so it does not wait).
    ///
    /// # Errors
    /// As [`Lease::set_result`].
    pub fn set_result(&self, result: &[u8]) -> Result<()> {
        self.lease.set_result(result)
    }

    async fn on_helper<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Lease) -> Result<T> + Send + 'static,
    {
        let lease = Arc::clone(&self.lease);
        call(move || f(&lease)).await
    }

    /// [`Lease::ack`]. The commit runs on a helper and completes even if this future is
    /// dropped.
    ///
    /// # Errors
    /// As [`Lease::ack`].
    pub async fn ack(&self) -> Result<()> {
        self.on_helper(Lease::ack).await
    }

    /// [`Lease::ack_with_result`]: acks, keeping `result` (at most
    /// [`RESULT_BYTES_MAX`](crate::RESULT_BYTES_MAX)) with the completed job.
    ///
    /// # Errors
    /// As [`Lease::ack_with_result`].
    pub async fn ack_with_result(&self, result: &[u8]) -> Result<()> {
        let result = result.to_vec();
        self.on_helper(move |l| l.ack_with_result(&result)).await
    }

    /// [`Lease::ack_with`]: `effect` runs on a helper inside the write transaction (it may
    /// run more than once; it cannot await); its writes, the idempotency key's applied
    /// marker and the ack commit together.
    ///
    /// # Errors
    /// As [`Lease::ack_with`].
    pub async fn ack_with<F>(&self, mut effect: F) -> Result<Applied>
    where
        F: FnMut(&Tx<'_>) -> std::result::Result<(), BoxError> + Send + 'static,
    {
        self.on_helper(move |l| l.ack_with(&mut effect)).await
    }

    /// [`Lease::ack_and_next`]: acks this job and leases the next available one (`None` if
    /// nothing is available now) in one commit, on a helper. Dropped before it answered, the
    /// ack still completes (as [`AsyncLease::ack`]) and a lease it took goes back unseen, as
    /// a dropped [`AsyncQueue::dequeue`]'s.
    ///
    /// # Errors
    /// As [`Lease::ack_and_next`].
    pub async fn ack_and_next(&self) -> Result<Option<AsyncLease>> {
        let lease = Arc::clone(&self.lease);
        let next = call_or_abandon(move || lease.ack_and_next(), give_back_next).await?;
        Ok(next.map(AsyncLease::new))
    }

    /// [`Lease::ack_with_and_next`]: [`AsyncLease::ack_with`] and the next dequeue in one
    /// commit, on a helper (`effect` as there: it may run more than once; it cannot await).
    /// Dropped before it answered, as [`AsyncLease::ack_and_next`].
    ///
    /// # Errors
    /// As [`Lease::ack_with_and_next`].
    pub async fn ack_with_and_next<F>(&self, mut effect: F) -> Result<(Applied, Option<AsyncLease>)>
    where
        F: FnMut(&Tx<'_>) -> std::result::Result<(), BoxError> + Send + 'static,
    {
        let lease = Arc::clone(&self.lease);
        let (applied, next) = call_or_abandon(
            move || lease.ack_with_and_next(&mut effect),
            |answer: Result<(Applied, Option<Lease>)>| {
                give_back_next(answer.map(|(_, next)| next));
            },
        )
        .await?;
        Ok((applied, next.map(AsyncLease::new)))
    }

    /// [`Lease::nack`]: given back through the retry policy with `reason`.
    ///
    /// # Errors
    /// As [`Lease::nack`].
    pub async fn nack(&self, reason: &str) -> Result<JobState> {
        let reason = reason.to_string();
        self.on_helper(move |l| l.nack(&reason)).await
    }

    /// [`Lease::nack_after`]: given back, due after `backoff`.
    ///
    /// # Errors
    /// As [`Lease::nack_after`].
    pub async fn nack_after(&self, reason: &str, backoff: Duration) -> Result<JobState> {
        let reason = reason.to_string();
        self.on_helper(move |l| l.nack_after(&reason, backoff))
            .await
    }

    /// [`Lease::snooze`]: given back, due after `delay`, the attempt not charged.
    ///
    /// # Errors
    /// As [`Lease::snooze`].
    pub async fn snooze(&self, delay: Duration) -> Result<()> {
        self.on_helper(move |l| l.snooze(delay)).await
    }

    /// [`Lease::snooze_because`]: a snooze with a reason kept as the job's status.
    ///
    /// # Errors
    /// As [`Lease::snooze_because`].
    pub async fn snooze_because(&self, delay: Duration, reason: &str) -> Result<()> {
        let reason = reason.to_string();
        self.on_helper(move |l| l.snooze_because(delay, &reason))
            .await
    }

    /// [`Lease::fail`]: dead now, with `reason`.
    ///
    /// # Errors
    /// As [`Lease::fail`].
    pub async fn fail(&self, reason: &str) -> Result<()> {
        let reason = reason.to_string();
        self.on_helper(move |l| l.fail(&reason)).await
    }

    /// [`Lease::extend`]: deadline = now + `by` (as SQS's `ChangeMessageVisibility`).
    ///
    /// # Errors
    /// As [`Lease::extend`].
    pub async fn extend(&self, by: Duration) -> Result<()> {
        self.on_helper(move |l| l.extend(by)).await
    }

    /// [`Lease::set_progress`] on a helper (an update within the rate bound is kept in
    /// memory and costs no commit).
    ///
    /// # Errors
    /// As [`Lease::set_progress`].
    pub async fn set_progress(&self, value: &[u8]) -> Result<()> {
        let value = value.to_vec();
        self.on_helper(move |l| l.set_progress(&value)).await
    }

    /// [`Lease::set_progress_percent`] on a helper.
    ///
    /// # Errors
    /// As [`Lease::set_progress_percent`].
    pub async fn set_progress_percent(&self, percent: u8, message: Option<&str>) -> Result<()> {
        let message = message.map(str::to_string);
        self.on_helper(move |l| l.set_progress_percent(percent, message.as_deref()))
            .await
    }

    /// [`Lease::is_cancelled`] on a helper (a read).
    ///
    /// # Errors
    /// As [`Lease::is_cancelled`].
    pub async fn is_cancelled(&self) -> Result<bool> {
        self.on_helper(Lease::is_cancelled).await
    }
}
