//! A delivered job under a lease, and the calls that end or extend it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::commit::refuse;
use crate::error::{BoxError, Error, Result};
use crate::job::{Applied, JobId, JobState};
use crate::queue::Queue;
use crate::store;

/// A job handed to a consumer, leased until [`deadline_ms`](Lease::deadline_ms), under a
/// fencing token.
///
/// End it with [`ack`](Lease::ack), [`ack_with`](Lease::ack_with), [`nack`](Lease::nack),
/// [`snooze`](Lease::snooze) or [`fail`](Lease::fail). A lease that is never ended (dropped,
/// or its worker stuck) keeps the job leased until its deadline. The first dequeue of the
/// queue after the deadline takes the job back, the attempt counted, through the retry policy
/// (due after its delay; dead with "lease expired" when that was its last attempt), and it is
/// delivered again (at-least-once). Dropping a lease does not give the job back early;
/// [`nack`](Lease::nack) or [`snooze`](Lease::snooze) does. If the process exits with the job
/// leased, or the file closes with it leased (every handle and lease dropped), the next open
/// of the file returns the job at once, without waiting for the deadline or the retry delay (the exclusive file lock
/// proves the holder is gone; dead with "lease abandoned: …" when that was its last attempt).
///
/// **Every call borrows the lease, and the store decides.** A lease is a receipt (the job's id
/// and the token of this delivery), as SQS's receipt handle: each call checks the token first,
/// and once the job was acked, given back, delivered again or recovered by a reopen, every call
/// returns [`Error::LeaseLost`](crate::Error::LeaseLost) and changes nothing. So whatever a call
/// returns, the caller still holds what it needs to end the attempt: after a refusal
/// (`InvalidOption`, `Reentrant`, a storage error) the lease is as current as before and can
/// still be acked, nacked, failed or extended. One call ends an attempt on its own when it
/// fails: [`ack_with`](Lease::ack_with) whose closure fails gives the job back with the
/// closure's error as its last error (see there).
///
/// A lease holds its queue (and so keeps the file open) until a call on it ended its attempt
/// (an ack, `ack_with`, nack or fail that succeeded, an `ack_with` whose closure failed) or
/// found it lost (`LeaseLost`) or cancelled (`Cancelled`), or until it is dropped. From then
/// on its calls are `LeaseLost` (`Cancelled`, with the reason, after a cancel) without
/// reading the file.
///
/// An ack, nack, fail or extend that arrives after the deadline, but before any dequeue
/// reclaimed the job, still succeeds: the token is still current and no other consumer has
/// the job (as SQS accepts a `DeleteMessage` for a message not yet received again).
#[must_use = "a lease that is not acked is delivered again when it expires"]
pub struct Lease {
    /// The queue, while this delivery's attempt may still be open through this lease; `None`
    /// once a call ended it or found it lost, so an ended lease does not hold the file open.
    queue: Mutex<Option<Queue>>,
    /// The reason, once a call on this lease was refused because the job was cancelled: its
    /// later calls say `Cancelled` again (not `LeaseLost`), without reading the file.
    cancelled: Mutex<Option<String>>,
    /// The result the ack that ends this delivery stores ([`Lease::set_result`]).
    result: Mutex<Option<Vec<u8>>>,
    /// Which queue the lease is from, ended or not: the file's committer id and the queue's
    /// number in the file.
    owner: (u64, u32),
    id: u64,
    token: u64,
    attempt: u32,
    max_attempts: u32,
    snoozes: u32,
    /// The deadline, updated by [`Lease::extend`] (which takes `&self`).
    deadline_ms: AtomicU64,
    /// Held by `extend` from its commit to its update of `deadline_ms`, so extends racing
    /// from several threads leave `deadline_ms` equal to the stored deadline.
    extending: Mutex<()>,
    lease_ms: u64,
    /// The job's own execution timeout, if it has one.
    timeout_ms: Option<u64>,
    /// When this delivery began: the leased record's `run_at_ms`.
    started_ms: u64,
    idempotency_key: Option<Vec<u8>>,
    /// How [`Lease::decode`] reads the payload: the job's recorded encoding, else its
    /// handle's.
    encoding: crate::format::payload::Encoding,
    payload: Vec<u8>,
    /// What the delivery changed beyond the lease, for [`Lease::release_unseen`].
    undo: store::Undo,
    /// Its progress updates not yet written, shared with its heartbeats.
    progress: Arc<ProgressSlot>,
}

/// A delivery's progress between commits: the rate bound of [`Lease::set_progress`], shared
/// by the lease and its [`Heartbeat`]s (whose extends write a pending update).
#[derive(Default)]
pub(crate) struct ProgressSlot {
    state: Mutex<ProgressState>,
}

#[derive(Default)]
struct ProgressState {
    /// The newest update not yet written.
    pending: Option<Vec<u8>>,
    /// When an update was last committed (or its commit began).
    last_commit: Option<std::time::Instant>,
}

impl ProgressSlot {
    /// `value` to commit now, or `None` if it is kept as the pending update (one was
    /// committed less than `PROGRESS_COMMIT_INTERVAL` ago).
    fn offer(&self, value: &[u8]) -> Option<Vec<u8>> {
        let mut st = self.state.lock();
        let now = std::time::Instant::now();
        if st
            .last_commit
            .is_some_and(|t| now.duration_since(t) < crate::limits::PROGRESS_COMMIT_INTERVAL)
        {
            st.pending = Some(value.to_vec());
            return None;
        }
        st.pending = None;
        st.last_commit = Some(now);
        Some(value.to_vec())
    }

    /// The pending update, taken to be written with an extend.
    fn take_pending(&self) -> Option<Vec<u8>> {
        let mut st = self.state.lock();
        let pending = st.pending.take();
        if pending.is_some() {
            st.last_commit = Some(std::time::Instant::now());
        }
        pending
    }

    /// Puts back an update whose commit did not land (a newer pending one wins).
    fn restore(&self, value: Vec<u8>) {
        let mut st = self.state.lock();
        if st.pending.is_none() {
            st.pending = Some(value);
        }
    }
}

/// Extends lease `(id, token)` by `by` on `q` and writes `progress` (a pending update) in the
/// same commit; the new deadline.
fn extend_with_progress(
    q: &Queue,
    (id, token): (u64, u64),
    by: Duration,
    slot: &ProgressSlot,
) -> Result<u64> {
    let progress = slot.take_pending();
    let now_ms = q.now_ms();
    let schema = q.config().schema;
    let r = q.run(&mut |ctx| {
        let deadline = match store::extend(ctx, schema, id, token, now_ms, by)? {
            Ok(deadline) => deadline,
            Err(refusal) => return Ok(Err(refusal)),
        };
        if let Some(value) = &progress
            && let Err(refusal) = store::set_progress(ctx, schema, (id, token), now_ms, value)?
        {
            return Ok(Err(refusal));
        }
        Ok(Ok(deadline))
    });
    if r.is_err()
        && let Some(value) = progress
    {
        slot.restore(value);
    }
    r
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("token", &self.token)
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .field("snoozes", &self.snoozes)
            .field("deadline_ms", &self.deadline_ms())
            .field("payload_bytes", &self.payload.len())
            .finish()
    }
}

impl Lease {
    /// The lease of `delivery`, a job `queue` just leased.
    pub(crate) fn from_delivery(queue: &Queue, delivery: store::Delivery) -> Lease {
        Lease {
            queue: Mutex::new(Some(queue.clone_kind(crate::handles::HandleKind::Lease {
                job: JobId(delivery.id),
            }))),
            cancelled: Mutex::new(None),
            result: Mutex::new(None),
            owner: queue.lease_owner(),
            id: delivery.id,
            token: delivery.token,
            attempt: delivery.attempt,
            max_attempts: delivery.max_attempts,
            snoozes: delivery.snoozes,
            deadline_ms: AtomicU64::new(delivery.deadline_ms),
            extending: Mutex::new(()),
            lease_ms: delivery.lease_ms,
            timeout_ms: delivery.timeout_ms,
            // The delivery's deadline is its start plus its lease (`lease_record`), as the
            // record's `run_at_ms` is its start.
            started_ms: delivery.deadline_ms.saturating_sub(delivery.lease_ms),
            idempotency_key: delivery.idempotency_key,
            encoding: delivery.encoding.unwrap_or(queue.config().encoding),
            payload: delivery.payload,
            undo: delivery.undo,
            progress: Arc::default(),
        }
    }

    /// Which queue the lease is from ([`Queue::lease_owner`]), ended or not.
    pub(crate) fn owner(&self) -> (u64, u32) {
        self.owner
    }

    /// `(job id, fencing token)`: what the engine's fenced calls take.
    pub(crate) fn fenced_key(&self) -> (u64, u64) {
        (self.id, self.token)
    }

    /// The job's id.
    pub fn id(&self) -> JobId {
        JobId(self.id)
    }

    /// The payload bytes as enqueued.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Decodes a payload enqueued with [`Queue::enqueue_value`], with the encoding the job
    /// recorded then (for a job enqueued as raw bytes, or before format 5: the
    /// [`Encoding`](crate::Encoding) of the handle that dequeued it).
    ///
    /// # Errors
    /// [`Error::PayloadCodec`](crate::Error::PayloadCodec) if the bytes are not a `T` (with
    /// bincode: also when the job type gained, lost or reordered a field since the job was
    /// enqueued; see [`Encoding`](crate::Encoding)).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        crate::format::payload::decode_payload(&self.payload, self.encoding)
    }

    /// The encoding [`decode`](Lease::decode) uses for this job.
    pub fn encoding(&self) -> crate::format::payload::Encoding {
        self.encoding
    }

    /// Which attempt this delivery is: 1 for the first, counting every earlier delivery
    /// however it ended (nack, lease expiry, a failed `ack_with` closure, crash) except the
    /// ones given back with [`snooze`](Lease::snooze), which are not charged.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How many times the job was given back with [`snooze`](Lease::snooze) (or
    /// [`Outcome::Snooze`](crate::Outcome::Snooze)) before this delivery: 0 for a job never
    /// snoozed. Snoozes do not count as attempts; this lets a handler bound them itself (as
    /// Oban's `snoozed` meta and River's snooze count).
    pub fn snoozes(&self) -> u32 {
        self.snoozes
    }

    /// The fencing token of this delivery (unique in the file, increasing; not dense: tokens
    /// are reserved in blocks, and a reopen skips the rest of one).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Attempts allowed before the dead-letter state (the job's own, else the queue's at
    /// enqueue). `attempt() == max_attempts()` is the last one: a nack, a failing `ack_with`
    /// closure, an expired lease or a crash now makes the job dead (a snooze does not).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The idempotency key given at enqueue, or `None` if none was: then
    /// [`ack_with`](Lease::ack_with) keys its applied marker by the job's id, so only this job's
    /// own redeliveries are deduplicated. Use it to key an external effect too (an HTTP
    /// `Idempotency-Key` header).
    pub fn idempotency_key(&self) -> Option<&[u8]> {
        self.idempotency_key.as_deref()
    }

    /// The lease deadline, in Unix milliseconds of the queue's clock, as this delivery began
    /// or as [`extend`](Lease::extend) last set it (extends made through a [`Heartbeat`] are
    /// not seen here: [`Heartbeat::extend`] returns them).
    pub fn deadline_ms(&self) -> u64 {
        self.deadline_ms.load(Ordering::SeqCst)
    }

    /// The lease duration this delivery got, in milliseconds (the job's own lease, else the
    /// queue's). A heartbeat that extends by it at a fraction of it keeps the job leased.
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// The job's own execution timeout in milliseconds, as given at enqueue
    /// ([`EnqueueOptions::timeout`](crate::job::EnqueueOptions::timeout), as River's
    /// `Timeout()` per job); `None` if it has none. A worker pool uses it over its own
    /// [`job_timeout`](crate::worker::PoolBuilder::job_timeout); a consumer outside a pool
    /// may bound its own work by it (the queue ends a delivery only at its lease's deadline).
    pub fn timeout_ms(&self) -> Option<u64> {
        self.timeout_ms
    }

    /// When this delivery began, in Unix milliseconds of the queue's clock: the commit of the
    /// dequeue that leased the job (the job's [`JobInfo::leased_ms`](crate::JobInfo::leased_ms),
    /// and its record's `run_at_ms` while leased). An [`extend`](Lease::extend) does not
    /// move it; `deadline_ms() - started_ms()` is how long the delivery may run so far.
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    /// A cheap handle that extends this lease from any thread (`Clone + Send + Sync`), for a
    /// heartbeat while the lease itself is busy in a long call. It is fenced by this
    /// delivery's token: once the attempt ended (acked, given back, snoozed, failed, or the
    /// job delivered again) it returns `LeaseLost` and writes nothing. It keeps the queue's
    /// file open while it lives.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// # queue.enqueue(b"long job", Default::default())?;
    /// use std::time::Duration;
    ///
    /// let lease = queue.dequeue()?.expect("a job");
    /// let beat = lease.heartbeat();
    /// let heart = std::thread::spawn(move || beat.extend(Duration::from_secs(30)));
    /// heart.join().unwrap()?; // the lease now ends 30 s from the heartbeat
    /// lease.ack()?;
    /// assert!(matches!(
    ///     lease.heartbeat().extend(Duration::from_secs(30)),
    ///     Err(leaseq::Error::LeaseLost { .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            queue: self.queue.lock().clone(),
            id: self.id,
            token: self.token,
            progress: Arc::clone(&self.progress),
        }
    }

    fn key(&self) -> [(u64, u64); 1] {
        [(self.id, self.token)]
    }

    /// The queue, while this lease's attempt may still be open; once it ended, `Cancelled`
    /// (with the reason) if a call found the job cancelled, else `LeaseLost`.
    fn queue(&self) -> Result<Queue> {
        if let Some(q) = self.queue.lock().clone() {
            return Ok(q);
        }
        Err(match self.cancelled.lock().clone() {
            Some(reason) => Error::Cancelled {
                job_id: JobId(self.id),
                reason,
            },
            None => Error::LeaseLost {
                job_id: JobId(self.id),
                token: self.token,
            },
        })
    }

    /// After a call that may end the attempt: if `outcome` says it ended (or was lost), lets
    /// go of the queue. A refusal or a storage error keeps it: the attempt may be open.
    /// After a call that does not end the delivery (extend, progress): the handle goes only
    /// when the lease is lost. A cancelled delivery keeps it, so the worker's ending call
    /// still reaches the file and lets a group waiting for it go on (its answer is
    /// `Cancelled` all the same).
    fn release_if_lost<T>(&self, outcome: &Result<T>) {
        match outcome {
            Err(Error::Cancelled { reason, .. }) => *self.cancelled.lock() = Some(reason.clone()),
            Err(Error::LeaseLost { .. }) => *self.queue.lock() = None,
            _ => {}
        }
    }

    pub(crate) fn release_if_ended<T>(&self, outcome: &Result<T>) {
        let ended = matches!(
            outcome,
            Ok(_)
                | Err(crate::error::Error::LeaseLost { .. }
                    | crate::error::Error::Cancelled { .. }
                    | crate::error::Error::Effect(_))
        );
        if let Err(Error::Cancelled { reason, .. }) = outcome {
            *self.cancelled.lock() = Some(reason.clone());
        }
        if ended {
            *self.queue.lock() = None;
        }
    }

    /// Acks the job: it ends, and releases its dedup key. It is deleted, or, in a queue that
    /// keeps a history ([`Queue::set_history`]), kept as [`JobState::Completed`](crate::JobState::Completed).
    /// One durable commit.
    ///
    /// This is the at-least-once ack: if the work had effects, a crash between them and this
    /// ack repeats them. Use [`ack_with`](Lease::ack_with) for an exactly-once effect.
    ///
    /// # Errors
    /// `LeaseLost` if the token is stale; `Cancelled` if the job was cancelled
    /// ([`Queue::cancel`]) since this delivery; `Corrupted` if the job's row is damaged (a later
    /// dequeue quarantines it once the lease ends); `Reentrant` from inside an `ack_with`
    /// closure; `CommitFailed` or `Storage` from the storage engine. The lease stays current
    /// after every error but `LeaseLost` and `Cancelled` (and a `CommitFailed` whose commit
    /// did land).
    pub fn ack(&self) -> Result<()> {
        let (key, q) = (self.key(), self.queue()?);
        let (now_ms, results) = (q.now_ms(), [self.result()]);
        let r =
            single(q.run(&mut |ctx| {
                store::ack(ctx, q.config().schema, &key, &results, now_ms).map(Ok)
            })?);
        self.release_if_ended(&r);
        r
    }

    /// Records how far this delivery got: a percentage (one byte), or a short blob such as
    /// `{"done":40,"of":120}` (at most [`PROGRESS_BYTES_MAX`](crate::PROGRESS_BYTES_MAX)
    /// bytes), as BullMQ's `updateProgress`. A UI reads it with [`Queue::job`]
    /// ([`JobInfo::progress`](crate::JobInfo::progress)), the `leaseq` tool's `show`, or
    /// [`Event::Progress`](crate::Event::Progress) as it is written. It is kept until the
    /// job's next delivery (a completed job in a history keeps its last one).
    ///
    /// **Cost and rate.** A fenced commit of the job's record, at most one per
    /// [`PROGRESS_COMMIT_INTERVAL`](crate::PROGRESS_COMMIT_INTERVAL) (250 ms) per delivery:
    /// an update sooner than that is kept in memory (a newer one replaces it) and written by
    /// the lease's next commit that can carry it: the next `set_progress` past the interval,
    /// or an [`extend`](Lease::extend) of the lease or of one of its
    /// [heartbeats](Lease::heartbeat) (a [`WorkerPool`](crate::worker::WorkerPool)'s
    /// heartbeat writes it within a third of the lease). An update still pending when the
    /// delivery ends is dropped. So a handler may call this in a tight loop.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// # queue.enqueue(b"import 120 photos", Default::default())?;
    /// let lease = queue.dequeue()?.expect("a job");
    /// lease.set_progress(&[40])?; // 40 % (set_progress_percent adds a message)
    /// let job = queue.job(lease.id())?.expect("the job");
    /// assert_eq!(job.progress.as_deref(), Some(&[40u8][..]));
    /// lease.ack()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` above `PROGRESS_BYTES_MAX` bytes (nothing kept). When it commits: as
    /// [`Lease::extend`] (`LeaseLost`, `Cancelled`, ...; the lease stays as it was).
    pub fn set_progress(&self, value: &[u8]) -> Result<()> {
        if value.len() > crate::limits::PROGRESS_BYTES_MAX {
            return Err(Error::invalid_option(
                "progress",
                format!(
                    "{} bytes, above PROGRESS_BYTES_MAX ({})",
                    value.len(),
                    crate::limits::PROGRESS_BYTES_MAX
                ),
            ));
        }
        let q = self.queue()?;
        let Some(value) = self.progress.offer(value) else {
            return Ok(());
        };
        let (key, now_ms, schema) = ((self.id, self.token), q.now_ms(), q.config().schema);
        let r = q.run(&mut |ctx| store::set_progress(ctx, schema, key, now_ms, &value));
        match &r {
            Err(Error::LeaseLost { .. } | Error::Cancelled { .. }) => self.release_if_lost(&r),
            Err(_) => self.progress.restore(value),
            Ok(()) => {}
        }
        r
    }

    /// Records how far this delivery got as a percentage and, optionally, what it is doing
    /// (`"uploading 3 of 10"`), as BullMQ's `updateProgress` with an object: stores
    /// `{"percent":P,"message":M}` through [`Lease::set_progress`] (its cost, rate and
    /// errors), which [`Progress::read`](crate::Progress::read), the dashboard and the
    /// `leaseq` tool show as `30 % uploading 3 of 10`.
    ///
    /// # Errors
    /// `InvalidOption` for a `percent` above 100, or a message that makes the JSON longer
    /// than [`PROGRESS_BYTES_MAX`](crate::PROGRESS_BYTES_MAX) bytes (nothing kept); then as
    /// [`Lease::set_progress`].
    pub fn set_progress_percent(&self, percent: u8, message: Option<&str>) -> Result<()> {
        if percent > 100 {
            return Err(Error::invalid_option(
                "progress",
                format!("{percent} %: a percentage is 0 to 100"),
            ));
        }
        self.set_progress(&crate::job::Progress::encode(percent, message))
    }
    /// Sets the result the ack that ends this delivery stores with the completed job:
    /// whichever ack it is ([`ack`](Lease::ack), [`ack_with`](Lease::ack_with), the `_and_next`
    /// calls, a batch ack, or a [`WorkerPool`](crate::worker::WorkerPool)'s ack once its
    /// handler returns), read back as [`JobInfo::result`](crate::JobInfo::result): what a user
    /// asks of a job's history ("did it finish, and with what?"), as BullMQ keeps a job's
    /// return value. Held in memory until then (a later call replaces it; nothing is
    /// written now). Kept only in a queue that keeps a history ([`Queue::set_history`]);
    /// elsewhere the job is deleted at its ack, and its result with it.
    ///
    /// # Errors
    /// `InvalidOption` for a result above [`RESULT_BYTES_MAX`](crate::RESULT_BYTES_MAX) bytes
    /// (nothing kept).
    pub fn set_result(&self, result: &[u8]) -> Result<()> {
        if result.len() > crate::limits::RESULT_BYTES_MAX {
            return Err(Error::invalid_option(
                "result",
                format!(
                    "{} bytes, above RESULT_BYTES_MAX ({})",
                    result.len(),
                    crate::limits::RESULT_BYTES_MAX
                ),
            ));
        }
        *self.result.lock() = Some(result.to_vec());
        Ok(())
    }

    /// [`Lease::set_result`], then [`Lease::ack`].
    ///
    /// # Errors
    /// As [`Lease::set_result`] (nothing written; the lease stays current), then as
    /// [`Lease::ack`].
    pub fn ack_with_result(&self, result: &[u8]) -> Result<()> {
        self.set_result(result)?;
        self.ack()
    }

    /// The result [`Lease::set_result`] set, for the ack that ends this delivery.
    pub(crate) fn result(&self) -> Option<Vec<u8>> {
        self.result.lock().clone()
    }

    /// Acks this job and leases the next available one in the same commit: a worker loop
    /// pays one fsync per job for both. The next job is dequeued as by
    /// [`Queue::dequeue`] (`None` if nothing is available now).
    ///
    /// # Errors
    /// As [`Lease::ack`] (a refused ack leases nothing) and [`Queue::dequeue`].
    pub fn ack_and_next(&self) -> Result<Option<Lease>> {
        let (key, q) = (self.key(), self.queue()?);
        let results = [self.result()];
        let (now_ms, config) = (q.now_ms(), q.config());
        // After `close`, during a `shutdown`, or while the queue is paused, the ack alone.
        let more = !q.is_closed() && !q.is_paused();
        let next = q.run(&mut |ctx| {
            if let Err(e) = single(store::ack(ctx, q.config().schema, &key, &results, now_ms)?) {
                return refuse(e);
            }
            if !more || q.is_paused() {
                return Ok(Ok(Vec::new()));
            }
            Ok(Ok(store::dequeue(ctx, &config, now_ms, 1)?))
        });
        self.release_if_ended(&next);
        Ok(next?
            .into_iter()
            .next()
            .map(|l| Lease::from_delivery(&q, l)))
    }

    /// Acks the job and applies its effect in one redb write transaction: the closure's writes
    /// to the caller's own tables (in the queue's file, see [`Queue::database`]), the
    /// applied-ids marker for the job's idempotency key, and the ack commit together or not at
    /// all. If the key is already applied (an earlier delivery, or another job with the same
    /// key, committed its effect), the closure does not run and the job is acked:
    /// [`Applied::AlreadyApplied`]. This is leaseq's exactly-once effect.
    ///
    /// The closure gets a [`Tx`](crate::Tx): it dereferences to redb's `WriteTransaction`
    /// (`tx.open_table(..)`), and [`Tx::enqueue`](crate::Tx::enqueue) adds follow-up jobs in
    /// the same transaction, so the next step of a pipeline exists if and only if this one's
    /// effect and ack committed (as River's `InsertTx` inside a job's completion).
    ///
    /// The closure may run more than once (when a concurrent operation in the same group
    /// commit fails, the group is replayed) and must only touch the transaction. It must not
    /// open leaseq's tables (`leaseq_*`) or call the queue (that returns `Reentrant`).
    ///
    /// **A failing closure ends the attempt**: when it returns an error or panics, its
    /// transaction is dropped (none of its writes, no marker, no ack), and the job is given
    /// back as by [`nack`](Lease::nack) with the closure's error as its last error: due after
    /// the retry policy's delay, or dead when this was its last attempt (as a worker in Oban
    /// or River whose `perform` fails). A closure that returns an [`Outcome`](crate::Outcome) chooses instead:
    /// snoozed without charging the attempt, dead now, or retried after its own backoff. That
    /// costs a second commit; then this lease is stale.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::{EnqueueOptions, Error, JobState};
    ///
    /// let id = queue.enqueue(b"charge card", EnqueueOptions::default().max_attempts(1))?.id();
    /// let lease = queue.dequeue()?.expect("a job");
    /// let r = lease.ack_with(|_tx| Err("card declined".into()));
    /// assert!(matches!(r, Err(Error::Effect(_))));
    /// // Its last attempt: dead, with the closure's error text as the reason.
    /// let job = queue.job(id)?.expect("kept as a dead letter");
    /// assert_eq!(job.state, JobState::Dead);
    /// assert_eq!(job.last_error.as_deref(), Some("card declined"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `Effect` with the closure's error (or panic message), after the job was given back
    /// (the closure passing on an input refusal of an enqueue inside it, `PayloadTooLarge`,
    /// `KeyTooLong`, `InvalidOption` or `QueueFull`: that error itself, the job given back the
    /// same way; `StorageFull`, a follow-up the full file refused: that error, the job
    /// snoozed for [`STORAGE_FULL_SNOOZE`](crate::STORAGE_FULL_SNOOZE) without spending an
    /// attempt, so a pipeline waits out the drain rather than dying);
    /// `LeaseLost` if the token is stale (the closure did not run); `Corrupted`, `Reentrant`,
    /// `CommitFailed` or `Storage` as [`Lease::ack`].
    pub fn ack_with<F>(&self, mut effect: F) -> Result<Applied>
    where
        F: FnMut(&crate::tx::Tx<'_>) -> std::result::Result<(), BoxError>,
    {
        let q = self.queue()?;
        let mut each = |tx: &crate::tx::Tx<'_>, _: usize| effect(tx);
        let (applied, _) = q.ack_with_keys(
            &self.key(),
            &[self.result()],
            &mut store::AckClosure::Each(&mut each),
            AckThen::Stop,
        )?;
        let r = single(applied);
        self.release_if_ended(&r);
        r.map_err(Error::surfaced)
    }

    /// [`Lease::ack_with`] and the next dequeue in one commit: the effect, the marker, the
    /// ack and the next lease become durable together. Returns the outcome and the next job
    /// (`None` if nothing is available now).
    ///
    /// # Errors
    /// As [`Lease::ack_with`] (on any error nothing is leased; a failing closure gives the
    /// job back) and [`Queue::dequeue`].
    pub fn ack_with_and_next<F>(&self, mut effect: F) -> Result<(Applied, Option<Lease>)>
    where
        F: FnMut(&crate::tx::Tx<'_>) -> std::result::Result<(), BoxError>,
    {
        let q = self.queue()?;
        let mut each = |tx: &crate::tx::Tx<'_>, _: usize| effect(tx);
        let (applied, next) = q.ack_with_keys(
            &self.key(),
            &[self.result()],
            &mut store::AckClosure::Each(&mut each),
            AckThen::LeaseNext,
        )?;
        let applied = single(applied);
        self.release_if_ended(&applied);
        Ok((
            applied.map_err(Error::surfaced)?,
            next.into_iter().next().map(|l| Lease::from_delivery(&q, l)),
        ))
    }

    /// Gives the job back, recording `reason` as its last error: due after the queue's
    /// [`RetryPolicy`](crate::RetryPolicy) delay for this attempt (with
    /// [`RetryPolicy::immediate`](crate::RetryPolicy::immediate): ready at once, behind the
    /// jobs already ready), or dead if this was its last attempt. Returns the state it went to.
    ///
    /// # Errors
    /// As [`Lease::ack`].
    pub fn nack(&self, reason: &str) -> Result<JobState> {
        self.give_back(reason, None)
    }

    /// Gives the job back to be due after `backoff` (whole milliseconds; `Duration::ZERO`:
    /// ready at once), whatever the retry policy says (as SQS's `ChangeMessageVisibility`
    /// before giving up a message), or dead if this was its last attempt. The backoff does not
    /// count against any lease. Returns the state it went to.
    ///
    /// # Errors
    /// `InvalidOption` if `backoff` is above [`DELAY_MAX`](crate::DELAY_MAX) (nothing written,
    /// the lease stays current); otherwise as [`Lease::ack`].
    pub fn nack_after(&self, reason: &str, backoff: Duration) -> Result<JobState> {
        if backoff > crate::limits::DELAY_MAX {
            return Err(crate::error::Error::invalid_option(
                "backoff",
                "above DELAY_MAX",
            ));
        }
        self.give_back(reason, Some(crate::clock::duration_ms(backoff)))
    }

    fn give_back(&self, reason: &str, backoff_ms: Option<u64>) -> Result<JobState> {
        let (key, q) = ((self.id, self.token), self.queue()?);
        let (now_ms, config) = (q.now_ms(), q.config());
        let r = q.run(&mut |ctx| store::nack(ctx, &config, key, now_ms, backoff_ms, reason));
        self.release_if_ended(&r);
        r
    }

    /// Gives the job back **without charging the attempt**, to be due after `delay` (whole
    /// milliseconds; `Duration::ZERO`: ready at once, behind the jobs already ready): for a
    /// worker that chose not to run it now (shutting down, a rate limit, a resource busy),
    /// not for a job that failed. As Oban's `{:snooze, seconds}`, River's `JobSnooze` and
    /// BullMQ's `moveToDelayed`.
    ///
    /// Its attempt count goes back down by one and its snooze count
    /// ([`JobInfo::snoozes`](crate::JobInfo::snoozes)) up by one; its last error is kept. It
    /// never dead-letters, whatever attempts are left. It is fenced like every lease call, and
    /// only an explicit snooze is free: a worker that crashes or lets the lease expire is
    /// charged the attempt as always, so a job that kills its worker still reaches the
    /// dead-letter state. A worker that snoozes a job forever never lets it die: bound the
    /// snoozes yourself ([`JobInfo::snoozes`](crate::JobInfo::snoozes)) if that can happen.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::EnqueueOptions;
    /// use std::time::Duration;
    ///
    /// let id = queue.enqueue(b"upload", EnqueueOptions::default().max_attempts(1))?.id();
    /// let lease = queue.dequeue()?.expect("a job");
    /// assert_eq!((lease.attempt(), lease.max_attempts()), (1, 1)); // its only attempt
    /// // The network is down: not the job's fault. Try again in a minute, at no cost.
    /// lease.snooze(Duration::from_secs(60))?;
    /// let job = queue.job(id)?.expect("still there");
    /// assert_eq!((job.attempts, job.snoozes), (0, 1));
    /// assert_eq!(job.state, leaseq::JobState::Scheduled);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` if `delay` is above [`DELAY_MAX`](crate::DELAY_MAX) (nothing written,
    /// the lease stays current); otherwise as [`Lease::ack`].
    pub fn snooze(&self, delay: Duration) -> Result<()> {
        self.snooze_with(delay, None)
    }

    /// [`Lease::snooze`] with a reason, kept as the job's
    /// [`status`](crate::JobInfo::status) until its next delivery (what a UI shows:
    /// "waiting for network"), apart from its last error, which a snooze does not touch. As
    /// Oban's `{:snooze, seconds}` with a note. `reason` is kept up to
    /// [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes, cut at a character boundary.
    ///
    /// # Errors
    /// As [`Lease::snooze`].
    pub fn snooze_because(&self, delay: Duration, reason: &str) -> Result<()> {
        self.snooze_with(delay, Some(reason))
    }

    /// Gives the job back as if this delivery had never been taken: ready at once in its
    /// place, the attempt not charged, nothing else changed. For a lease no consumer saw (an
    /// async dequeue dropped before it handed the lease out).
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn release_unseen(&self) -> Result<()> {
        let (key, q) = (self.key()[0], self.queue()?);
        let now_ms = q.now_ms();
        let r = q
            .run(&mut |ctx| store::release_unseen(ctx, q.config().schema, key, &self.undo, now_ms));
        self.release_if_ended(&r);
        r
    }

    fn snooze_with(&self, delay: Duration, reason: Option<&str>) -> Result<()> {
        if delay > crate::limits::DELAY_MAX {
            return Err(crate::error::Error::invalid_option(
                "delay",
                "above DELAY_MAX",
            ));
        }
        let (key, q) = (self.key()[0], self.queue()?);
        let (now_ms, delay_ms) = (q.now_ms(), crate::clock::duration_ms(delay));
        let r =
            q.run(&mut |ctx| store::snooze(ctx, q.config().schema, key, now_ms, delay_ms, reason));
        self.release_if_ended(&r);
        r
    }

    /// Moves the job to the dead-letter state now, with `reason` (kept up to 4096 bytes, cut
    /// at a character boundary) as its last error, whatever attempts it has left.
    ///
    /// # Errors
    /// As [`Lease::ack`].
    pub fn fail(&self, reason: &str) -> Result<()> {
        let (key, q) = (self.key()[0], self.queue()?);
        let now_ms = q.now_ms();
        let r = q.run(&mut |ctx| store::fail(ctx, q.config().schema, key, now_ms, reason));
        self.release_if_ended(&r);
        r
    }

    /// Whether the job was cancelled ([`Queue::cancel`]) since this delivery: a cheap read
    /// (one read transaction, no commit) a long-running worker can make between steps, to stop
    /// early; its ack would be refused with [`Error::Cancelled`] anyway. As the cancelled
    /// context River hands a running job.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// let id = queue.enqueue(b"export", Default::default())?.id();
    /// let lease = queue.dequeue()?.expect("a job");
    /// assert!(!lease.is_cancelled()?);
    /// queue.cancel(id, "the user closed the document")?;
    /// assert!(lease.is_cancelled()?);
    /// assert!(matches!(lease.ack(), Err(leaseq::Error::Cancelled { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Once a call on this lease was refused with `Cancelled`, this is `Ok(true)` without a
    /// read, and every later call on the lease is refused with `Cancelled` again.
    ///
    /// # Errors
    /// `LeaseLost` once a call on this lease ended it (or found it lost), or once the delivery
    /// is no longer current for another reason (its lease expired and the job was delivered
    /// again, or it was cancelled, then retried); `Corrupted`, `Storage`.
    pub fn is_cancelled(&self) -> Result<bool> {
        if self.cancelled.lock().is_some() {
            return Ok(true);
        }
        self.queue()?
            .is_delivery_cancelled(JobId(self.id), self.token)
    }

    /// Sets the deadline to now + `by` (never added to the old deadline), as SQS's
    /// `ChangeMessageVisibility`. `by` is whole milliseconds, from 1 ms to
    /// [`LEASE_MAX`](crate::LEASE_MAX). On success [`deadline_ms`](Lease::deadline_ms) is the
    /// new deadline. One durable commit. It takes `&self`, so a lease shared with another
    /// thread can be extended there; see also [`Lease::heartbeat`].
    ///
    /// # Errors
    /// `InvalidOption` for a zero or too long `by` (nothing written, the lease stays
    /// current); otherwise as [`Lease::ack`]. Refused `Cancelled`, it still tells an ordered
    /// group waiting for this cancelled delivery to wait until now + `by`
    /// ([`Queue::cancel`]).
    pub fn extend(&self, by: Duration) -> Result<()> {
        // The option first, as for a lease still held: a bad one is refused the same way.
        store::validate_lease_ms("extend", by)?;
        let (id, token, q) = (self.id, self.token, self.queue()?);
        let _one_at_a_time = self.extending.lock();
        let r = extend_with_progress(&q, (id, token), by, &self.progress);
        if matches!(
            r,
            Err(crate::error::Error::LeaseLost { .. } | crate::error::Error::Cancelled { .. })
        ) {
            self.release_if_lost(&r);
        }
        self.deadline_ms.store(r?, Ordering::SeqCst);
        Ok(())
    }
}

/// The one outcome of a call made on one lease.
fn single<T>(mut outcomes: Vec<Result<T>>) -> Result<T> {
    debug_assert_eq!(outcomes.len(), 1);
    outcomes
        .pop()
        .unwrap_or_else(|| Err(crate::error::Error::corrupted("no outcome for the lease")))
}

/// Extends one delivery's lease from any thread: made by [`Lease::heartbeat`]. Cheap to clone,
/// `Send + Sync`; fenced by the delivery's token.
#[derive(Clone)]
pub struct Heartbeat {
    /// The queue, or `None` when the lease had already ended as the heartbeat was made.
    queue: Option<Queue>,
    id: u64,
    token: u64,
    /// The lease's pending progress, written by the next extend.
    progress: Arc<ProgressSlot>,
}

impl fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Heartbeat")
            .field("id", &self.id)
            .field("token", &self.token)
            .finish()
    }
}

impl Heartbeat {
    /// The job's id.
    pub fn job_id(&self) -> JobId {
        JobId(self.id)
    }

    /// The fencing token of the delivery it extends.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Sets the lease deadline to now + `by` (whole milliseconds, 1 ms to
    /// [`LEASE_MAX`](crate::LEASE_MAX)), as [`Lease::extend`] and SQS's
    /// `ChangeMessageVisibility`, and returns the new deadline (Unix ms of the queue's clock).
    /// One durable commit. The [`Lease`] it came from does not see the new deadline in its
    /// [`deadline_ms`](Lease::deadline_ms).
    ///
    /// # Errors
    /// `LeaseLost` once the delivery ended (acked, given back, snoozed, failed, delivered
    /// again, or returned by a reopen): nothing is written, no lease comes back; `Cancelled`
    /// once the job was cancelled ([`Queue::cancel`]: the job's state is not changed, but a
    /// job of an ordered group still has its group wait for this delivery until now + `by`,
    /// as the lease would have); `InvalidOption` for a zero or too long
    /// `by`; `Corrupted`, `Reentrant`, `CommitFailed` or `Storage` as [`Lease::ack`].
    pub fn extend(&self, by: Duration) -> Result<u64> {
        store::validate_lease_ms("extend", by)?;
        let q = self.current_queue()?;
        extend_with_progress(q, (self.id, self.token), by, &self.progress)
    }

    /// Ends the delivery from another thread, as [`Lease::nack`]: the attempt ends with
    /// `reason` and the job is given back through its retry policy (dead if this was its last
    /// attempt); returns the state it went to. For a watchdog (the worker pool's job timeout):
    /// the thread running the job keeps its [`Lease`], whose calls are then refused with
    /// `LeaseLost` and write nothing. One commit.
    ///
    /// # Errors
    /// As [`Heartbeat::extend`] (without `InvalidOption`).
    pub fn nack(&self, reason: &str) -> Result<JobState> {
        let q = self.current_queue()?;
        let (key, now_ms, config) = ((self.id, self.token), q.now_ms(), q.config());
        q.run(&mut |ctx| store::nack(ctx, &config, key, now_ms, None, reason))
    }

    /// Ends the delivery from another thread, as [`Lease::fail`]: the job is dead now with
    /// `reason`, whatever attempts it has left. The thread running the job keeps its
    /// [`Lease`], whose calls are then refused with `LeaseLost`. One commit.
    ///
    /// # Errors
    /// As [`Heartbeat::extend`] (without `InvalidOption`).
    pub fn fail(&self, reason: &str) -> Result<()> {
        let q = self.current_queue()?;
        let (key, now_ms) = ((self.id, self.token), q.now_ms());
        q.run(&mut |ctx| store::fail(ctx, q.config().schema, key, now_ms, reason))
    }

    fn current_queue(&self) -> Result<&Queue> {
        self.queue.as_ref().ok_or(crate::error::Error::LeaseLost {
            job_id: JobId(self.id),
            token: self.token,
        })
    }

    /// Whether the job was cancelled ([`Queue::cancel`]), as [`Lease::is_cancelled`].
    ///
    /// # Errors
    /// `LeaseLost` if the lease had already ended when the heartbeat was made, or its delivery
    /// is no longer current (as [`Lease::is_cancelled`]); `Corrupted`, `Storage`.
    pub fn is_cancelled(&self) -> Result<bool> {
        let q = self.current_queue()?;
        q.is_delivery_cancelled(JobId(self.id), self.token)
    }
}

/// What an `ack_with` does after its acks, in the same commit ([`Queue::ack_with_keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckThen {
    /// Nothing: [`Lease::ack_with`](crate::Lease::ack_with), [`Queue::ack_with_batch`], [`Queue::ack_with_all`].
    Stop,
    /// Leases the next job: [`Lease::ack_with_and_next`](crate::Lease::ack_with_and_next).
    LeaseNext,
}
