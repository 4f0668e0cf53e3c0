//! Jobs as callers see them: ids, states, enqueue options and results.

use std::time::Duration;

mod progress;
pub(crate) mod state;

pub use progress::Progress;
pub use state::{JobId, JobState};

/// Options for one enqueue. Built with chained setters from `EnqueueOptions::default()`.
///
/// ```
/// use leaseq::EnqueueOptions;
/// use std::time::Duration;
/// let opts = EnqueueOptions::default()
///     .idempotency_key("order-42")
///     .priority(-1)
///     .delay(Duration::from_secs(10))
///     .max_attempts(3);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnqueueOptions {
    pub(crate) idempotency_key: Option<Vec<u8>>,
    pub(crate) dedup_key: Option<Vec<u8>>,
    pub(crate) priority: i32,
    pub(crate) delay: Option<Duration>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) lease: Option<Duration>,
    pub(crate) retry: Option<crate::retry::RetryPolicy>,
    pub(crate) dedup_window: Option<Duration>,
    pub(crate) dedup_until_started: bool,
    pub(crate) extend_dedup_window: bool,
    pub(crate) on_duplicate: OnDuplicate,
    /// How the payload was encoded: set by `EnqueueOptions::encoding`, or by `enqueue_value`
    /// (the handle's encoding when the options set none).
    pub(crate) encoding: Option<crate::format::payload::Encoding>,
    pub(crate) group: Option<Vec<u8>>,
    pub(crate) timeout: Option<Duration>,
}

impl EnqueueOptions {
    /// The payload of a typed value encoded with the encoding these options set, else with
    /// `handle_encoding` (checked to decode back), and these options marked with the encoding
    /// used, for `enqueue_value`.
    pub(crate) fn typed<T>(
        self,
        value: &T,
        handle_encoding: crate::format::payload::Encoding,
    ) -> crate::error::Result<(Vec<u8>, Self)>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let encoding = self.encoding.unwrap_or(handle_encoding);
        let payload = crate::format::payload::encode_payload(value, encoding)?;
        Ok((
            payload,
            EnqueueOptions {
                encoding: Some(encoding),
                ..self
            },
        ))
    }

    /// Records that the payload is a value encoded with `encoding`, so
    /// [`Lease::decode`](crate::Lease::decode) reads it that way whatever the consumer's
    /// handle says.
    ///
    /// - With [`Queue::enqueue_value`](crate::Queue::enqueue_value) (and its `Tx` and async
    ///   forms), the value is encoded with this encoding instead of the handle's
    ///   ([`Builder::encoding`](crate::Builder::encoding)).
    /// - With [`Queue::enqueue`](crate::Queue::enqueue), for bytes encoded elsewhere (a relay
    ///   carries the sender's encoding this way): nothing checks that they decode.
    pub fn encoding(mut self, encoding: crate::format::payload::Encoding) -> Self {
        self.encoding = Some(encoding);
        self
    }

    /// Puts the job in an ordered group (1 to [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX) bytes;
    /// an empty key is `InvalidOption`, a longer one `KeyTooLong`, at the enqueue): the jobs of one group are delivered one at a time, in the order they were
    /// enqueued, while other groups and ungrouped jobs flow around a busy one, as SQS FIFO's
    /// message groups and BullMQ Pro's groups with concurrency 1. The outbox of a notes app
    /// syncing each document in order is the example: group by document id.
    ///
    /// - A job of a group is delivered only when every job enqueued before it in the group
    ///   has ended: it waits (counted in [`Stats::ready`], listed ready) while an earlier one
    ///   is ready, leased, or scheduled (a retry waiting for its backoff blocks its group, as
    ///   an SQS FIFO message being retried does).
    /// - A job cancelled while leased ([`Queue::cancel`](crate::Queue::cancel)) blocks its
    ///   group until that delivery has ended, since its worker may still be running: until
    ///   the worker's ack, `ack_with`, nack, snooze or fail (each answered `Cancelled`), its
    ///   lease's deadline, or the next open. Its successor never runs beside it.
    /// - A dead job does not block its group: it is out of the way, as a message moved to an
    ///   SQS dead-letter queue; a job requeued from the dead letters ([`Queue::requeue_dead`](crate::Queue::requeue_dead),
    ///   [`Queue::retry`](crate::Queue::retry)) goes to the end of its group, as SQS's redrive.
    /// - A schedule's instances cannot be in a group ([`Schedule::options`](crate::Schedule::options)
    ///   refuses one).
    /// - Priorities order the groups' first jobs among themselves and ungrouped jobs; within
    ///   a group, enqueue order wins.
    pub fn group(mut self, key: impl AsRef<[u8]>) -> Self {
        self.group = Some(key.as_ref().to_vec());
        self
    }

    /// The key under which [`Lease::ack_with`](crate::Lease::ack_with) records the job's
    /// effect as applied (at most [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX) bytes). Jobs sharing
    /// a key share one effect: the second `ack_with` finds it applied and skips the closure.
    /// Defaults to the job's own id.
    pub fn idempotency_key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.idempotency_key = Some(key.as_ref().to_vec());
        self
    }

    /// Producer dedup (at most [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX) bytes): while a job
    /// holds this key, another enqueue with it adds nothing and returns
    /// [`Enqueued::Duplicate`] (or [`Enqueued::DuplicateDead`]) with that job's id. By default
    /// the key is held while the job is live: scheduled, ready, leased, or dead (a dead job
    /// keeps its key until it is removed, purged or requeued, and a duplicate of it says so).
    /// With [`dedup_window`](EnqueueOptions::dedup_window) it is held for a time instead. This
    /// is not exactly-once: it only keeps one job per key at a time.
    pub fn dedup_key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.dedup_key = Some(key.as_ref().to_vec());
        self
    }

    /// Holds the [`dedup_key`](EnqueueOptions::dedup_key) for `window` after this enqueue
    /// (whole milliseconds, from 1 ms to [`DELAY_MAX`](crate::DELAY_MAX)), whatever happens
    /// to the job, as SQS FIFO's five-minute deduplication interval or Oban's unique
    /// `period`: an ack (or the pruning of a dead job past its retention) does not release it
    /// early, and the window's end releases only the key, never touching the job (which runs,
    /// retries or dies as any other). A duplicate within the window names the job that took
    /// the key, even after that job was acked (it may be gone: `job(id)` is then `None`), and
    /// does not extend the window unless it says
    /// [`extend_dedup_window`](EnqueueOptions::extend_dedup_window). Removing the job on purpose
    /// ([`Queue::remove`](crate::Queue::remove), [`Queue::purge`](crate::Queue::purge))
    /// releases the key and ends its window, as BullMQ's `Job.remove` frees its deduplication
    /// id: the work is no longer wanted, so a new enqueue must not be refused for it. Needs a
    /// dedup key.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = Some(window);
        self
    }

    /// When this enqueue meets its [`dedup_key`](EnqueueOptions::dedup_key) held by a
    /// [`dedup_window`](EnqueueOptions::dedup_window), moves that window's end to now plus
    /// this enqueue's window, if that is later (a shorter window never shortens it): the key
    /// stays held until a whole window has passed with no duplicate, as BullMQ's
    /// `deduplication: { ttl, extend: true }` resets the key's TTL (a debounce of the
    /// enqueues themselves). The enqueue answers as a duplicate does without it
    /// ([`Enqueued::Duplicate`] naming the job that took the key, which may be gone), and
    /// [`JobInfo::dedup_window_ms`] of that job, while its row is kept, then shows the longer
    /// window (ms from its `created_ms` to the new end), exported and imported so.
    ///
    /// - A key held by a job without a window (held while the job is live, or until it
    ///   starts) is not given one: the duplicate is answered as usual and nothing changes.
    /// - With [`on_duplicate`](EnqueueOptions::on_duplicate) `Replace` or `Debounce`, a
    ///   waiting holder's payload (and, debounced, due time) is replaced *and* the window is
    ///   extended ([`Enqueued::Replaced`]), as BullMQ's `extend` with `replace`; a holder
    ///   that is leased, dead or gone is a duplicate, and the window is extended all the same.
    /// - In a batch (or a [`Tx`](crate::Tx)), a job earlier in the same batch that took the key
    ///   with a window is extended as any holder is.
    /// - While the holder's row is kept, its window ends at most
    ///   [`DELAY_MAX`](crate::DELAY_MAX) after its `created_ms` (the row keeps the window in
    ///   ms, up to that cap); a window whose job is gone is extended without that cap.
    /// - [`Queue::import_batch`](crate::Queue::import_batch) and schedules do not take it: an
    ///   import never extends a window, and [`Schedule::options`](crate::Schedule::options) refuses
    ///   it (`InvalidOption`).
    ///
    /// # Errors
    /// Needs a [`dedup_window`](EnqueueOptions::dedup_window) (whose length it uses):
    /// without one the enqueue is refused with `InvalidOption` (field
    /// `"extend_dedup_window"`) and writes nothing.
    pub fn extend_dedup_window(mut self) -> Self {
        self.extend_dedup_window = true;
        self
    }

    /// Holds the dedup key only until the job is first delivered, instead of while it is
    /// live: once a dequeue took the job, an enqueue with the same key makes a new job (as
    /// sidekiq-unique-jobs' `until_executing`, River's unique states without `running`, and
    /// Oban's `unique: [states: [:available, :scheduled]]`). For work that must see every
    /// change made while it runs: a note edited while its sync job is uploading gets a new
    /// sync job, so the edit is not lost. The job lets go of the key at its first delivery
    /// for good (a nack or an expiry does not take it back): from then on
    /// [`JobInfo::dedup_key`] is `None`. Needs a dedup key; not with a
    /// [`dedup_window`](EnqueueOptions::dedup_window) (a window holds the key whatever the job
    /// does). Both checked at enqueue (`InvalidOption`).
    ///
    /// Two things to get right with it, for jobs that sync edits:
    /// - **Give each edit's job its own idempotency key** (the note and its revision, or none:
    ///   a job without one is keyed by its own id). A key shared by every sync job of a note
    ///   makes the new job's [`ack_with`](crate::Lease::ack_with) find the first job's applied
    ///   marker and answer `AlreadyApplied` without running: the edit is not sent.
    /// - **A started job that is given back runs again with its own payload**, possibly after a
    ///   newer edit's job (it no longer holds the key, so a newer edit cannot replace it). Put
    ///   the note's id in the payload and read its latest text when the job runs, or
    ///   [`pause`](crate::Queue::pause) the queue while offline instead of snoozing.
    pub fn dedup_until_started(mut self) -> Self {
        self.dedup_until_started = true;
        self
    }

    /// What this enqueue does when its dedup key is held by a job still waiting (ready or
    /// scheduled): nothing (the default, [`Enqueued::Duplicate`]), or replace that job's
    /// payload, and with [`OnDuplicate::Debounce`] its due time too ([`Enqueued::Replaced`]).
    /// A holder that is leased or dead, or a key held only by a window, is a duplicate as
    /// usual. Needs a dedup key (checked at enqueue, `InvalidOption`).
    pub fn on_duplicate(mut self, on_duplicate: OnDuplicate) -> Self {
        self.on_duplicate = on_duplicate;
        self
    }

    /// This job's retry policy, instead of the queue's
    /// [`Builder::retry`](crate::Builder::retry). Checked at enqueue (`InvalidOption` with
    /// field `"retry"`).
    pub fn retry(mut self, policy: crate::retry::RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Priority: lower values are served first (as in Oban, River and BullMQ); default 0.
    /// Within one priority, jobs are served in the order they became ready: enqueued, found
    /// due by a dequeue, or given back by a nack, a lease expiry or `requeue_dead` (a job
    /// given back goes behind every job already ready; a lease returned at open keeps the
    /// place its job had, as persist-queue serves an interrupted item first). The order does
    /// not depend on the
    /// clock. When more than 256 delayed jobs come due at once, a dequeue promotes the 256
    /// earliest, so a later-due job of a higher priority can wait for the next dequeue.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Makes the job due `delay` from now (whole milliseconds, at most
    /// [`DELAY_MAX`](crate::DELAY_MAX), checked at enqueue; under 1 ms is no delay); until then
    /// no dequeue returns it and its delay never counts against a lease.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Attempts allowed before the job goes to the dead-letter state: deliveries, not counting
    /// those given back with [`Lease::snooze`](crate::Lease::snooze) (1 to
    /// [`MAX_ATTEMPTS_CAP`](crate::MAX_ATTEMPTS_CAP), checked at enqueue; default: the
    /// queue's [`Builder::max_attempts`](crate::Builder::max_attempts)).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// This job's lease duration (visibility timeout), instead of the queue's default
    /// [`Builder::lease`](crate::Builder::lease). Whole milliseconds, from 1 ms to
    /// [`LEASE_MAX`](crate::LEASE_MAX).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// This job's execution timeout, instead of the worker pool's
    /// [`PoolBuilder::job_timeout`](crate::worker::PoolBuilder::job_timeout), as River's
    /// `Timeout()` per job (`JobArgs` whose worker overrides `Timeout`, beside the client's
    /// `JobTimeout`). Whole milliseconds, from 1 ms to [`LEASE_MAX`](crate::LEASE_MAX),
    /// checked at enqueue (`InvalidOption` with field `"timeout"`; nothing is written); stored
    /// with the job ([`JobInfo::timeout_ms`], [`Lease::timeout_ms`](crate::Lease::timeout_ms)).
    ///
    /// A [`WorkerPool`](crate::worker::WorkerPool) or an `AsyncPool` (feature `tokio`)
    /// running the job ends a delivery whose plain or staged handler runs past it, as its own
    /// `job_timeout` would (given back through the retry policy with the error `timed out
    /// after N ms`, the attempt counted, or dead, as the pool's
    /// [`on_timeout`](crate::worker::PoolBuilder::on_timeout) says), whether the pool has a
    /// `job_timeout` or not. An effect handler
    /// ([`start_effects`](crate::worker::PoolBuilder::start_effects)) runs inside its commit
    /// and is not timed. A consumer outside a pool reads it from the lease and times itself:
    /// the queue ends a delivery only at its lease's deadline
    /// ([`lease`](EnqueueOptions::lease)). Schedules refuse it
    /// ([`Schedule::options`](crate::schedule::Schedule::options)).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new job was added under this id.
    New(JobId),
    /// The dedup key is held by this job (scheduled, ready or leased; or, within its dedup
    /// window, possibly already acked); nothing was added.
    Duplicate(JobId),
    /// The dedup key is held by this dead job; nothing was added. It holds the key until it
    /// is removed ([`Queue::remove`](crate::Queue::remove), `purge`) or requeued
    /// ([`Queue::requeue_dead`](crate::Queue::requeue_dead)): do one of those to enqueue the
    /// work again, or use a new key.
    DuplicateDead(JobId),
    /// The dedup key is held by this waiting job, whose payload (and, debounced, due time)
    /// this enqueue replaced ([`EnqueueOptions::on_duplicate`]); nothing was added.
    Replaced(JobId),
}

impl Enqueued {
    /// The id of the new job, or of the job that holds the dedup key.
    pub fn id(self) -> JobId {
        match self {
            Enqueued::New(id)
            | Enqueued::Duplicate(id)
            | Enqueued::DuplicateDead(id)
            | Enqueued::Replaced(id) => id,
        }
    }
}

/// What an enqueue does when its dedup key is held by a job still waiting
/// ([`EnqueueOptions::on_duplicate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnDuplicate {
    /// Nothing is added or changed: [`Enqueued::Duplicate`] names the holder (the default).
    #[default]
    Keep,
    /// The waiting holder's payload (and its encoding) becomes this enqueue's: the latest
    /// version wins, as BullMQ's deduplication with `replace`. The holder keeps its id, place,
    /// due time, attempts, keys and options; this enqueue's other options are not used.
    Replace,
    /// [`OnDuplicate::Replace`], and the holder's due time becomes this enqueue's (now, or
    /// its [`delay`](EnqueueOptions::delay) from now): a burst of enqueues runs once, after
    /// the last, as BullMQ's debounce. A holder made due now goes to the back of its
    /// priority (one already ready keeps its place).
    Debounce,
}

/// The result of [`Lease::ack_with`](crate::Lease::ack_with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The closure ran and its writes committed together with the applied-ids marker and
    /// the ack.
    Now,
    /// The idempotency key was already applied: the closure did not run; the job was acked.
    AlreadyApplied,
}

/// What a cancel did ([`Queue::cancel`](crate::Queue::cancel), [`Tx::cancel`](crate::Tx::cancel),
/// `AsyncQueue::cancel`): the job was cancelled now, or it had
/// ended before the call (nothing written). An id the file never handed out, or one another
/// queue of the file holds, is not an outcome but `Error::JobNotFound`.
///
/// As Oban's `cancel_job`, a job that already ended is not an error; unlike it, the answer
/// says so. River's `JobCancel` answers the job as it now is, as [`Queue::job`](crate::Queue::job)
/// does here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The job was live, in state `was` (scheduled, ready, leased or dead), and is cancelled
    /// now.
    Cancelled {
        /// The state it was in.
        was: JobState,
    },
    /// The job had already ended, in `state` (`Completed` or `Cancelled`), and its row is kept
    /// (a queue's history, or a cancelled lease's fence): it stays as it was.
    AlreadyEnded {
        /// The state it ended in.
        state: JobState,
    },
    /// The job is gone: no row holds its id, which this file handed out. It ended and its row
    /// went (acked in a queue that keeps no history, pruned from the history, removed, purged
    /// or dropped), or it was moved to the quarantine. Ids are reserved in blocks of 1,024, so
    /// an id after the last job a file made before a restart also answers `Gone`.
    Gone,
}

impl CancelOutcome {
    /// Whether this call cancelled the job (it was live).
    pub fn cancelled(&self) -> bool {
        matches!(self, CancelOutcome::Cancelled { .. })
    }

    /// The state the job was in before this call: `None` for a job that is gone.
    pub fn was(&self) -> Option<JobState> {
        match *self {
            CancelOutcome::Cancelled { was } => Some(was),
            CancelOutcome::AlreadyEnded { state } => Some(state),
            CancelOutcome::Gone => None,
        }
    }
}

/// A snapshot of one job, for inspection ([`Queue::job`](crate::Queue::job)) and export.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobInfo {
    /// The job's id.
    pub id: JobId,
    /// Its state.
    pub state: JobState,
    /// Attempts so far: each delivery counts one, however it ends, except a delivery given
    /// back with [`Lease::snooze`](crate::Lease::snooze) (its attempt is taken back).
    pub attempts: u32,
    /// Attempts allowed before the dead-letter state.
    pub max_attempts: u32,
    /// Priority (lower is served first).
    pub priority: i32,
    /// Scheduled: when it is due; Ready: when it became available; Leased: when its current
    /// delivery began (the same as `leased_ms`); Dead: when it died; Completed or
    /// Cancelled: when it ended (Unix ms).
    pub run_at_ms: u64,
    /// Leased: when its current delivery began (Unix ms), so a job that has run for long
    /// can be told from one whose heartbeats keep its deadline ahead (River's
    /// `attempted_at`). Since format 12; for a lease taken by an older build, when the job
    /// had become ready.
    pub leased_ms: Option<u64>,
    /// Dead: when it died (Unix ms; the same as `run_at_ms`). For a job that died in a
    /// format-1 file (before the upgrade): when it last became ready, as format 1 did not
    /// keep the time of death.
    pub died_ms: Option<u64>,
    /// Leased: the lease deadline (Unix ms).
    pub lease_deadline_ms: Option<u64>,
    /// Leased: the current lease token.
    pub lease_token: Option<u64>,
    /// When it was enqueued (Unix ms).
    pub created_ms: u64,
    /// Why the last attempt ended badly, at most 4096 bytes: the `nack` or `fail` reason, the
    /// text of a failing `ack_with` closure's error (`closure panicked: …` for a panic; the
    /// reason of an [`Outcome::Fail`] or `Outcome::Retry` it returned),
    /// `lease expired`, or `lease abandoned: …` for a lease returned at open (or imported as
    /// leased). A snooze and a requeue of a dead job keep it. The message of the last entry of
    /// `errors`.
    pub last_error: Option<String>,
    /// The errors of its last attempts that ended badly, oldest first: at most
    /// [`ERRORS_KEPT`](crate::ERRORS_KEPT) (older ones are dropped), each with its attempt
    /// and time, as River keeps one error per attempt. Since format 7; an error recorded
    /// before has no time.
    pub errors: Vec<AttemptError>,
    /// Why it was last snoozed ([`Lease::snooze_because`](crate::Lease::snooze_because)),
    /// until its next delivery: what a UI shows as its status ("waiting for network"), apart
    /// from its last error.
    pub status: Option<String>,
    /// Its ordered group ([`EnqueueOptions::group`]), if any.
    pub group: Option<Vec<u8>>,
    /// The last progress its current (or, until the next delivery, its last) delivery
    /// recorded ([`Lease::set_progress`](crate::Lease::set_progress)), at most
    /// [`PROGRESS_BYTES_MAX`](crate::PROGRESS_BYTES_MAX) bytes.
    pub progress: Option<Vec<u8>>,
    /// When that progress was recorded (Unix ms).
    pub progress_ms: Option<u64>,
    /// Completed or cancelled: when (Unix ms; the same as `run_at_ms`).
    pub ended_ms: Option<u64>,
    /// Cancelled: the reason the cancel gave.
    pub cancel_reason: Option<String>,
    /// Completed: the result its ack stored, if any
    /// ([`Lease::set_result`](crate::Lease::set_result)).
    pub result: Option<Vec<u8>>,
    /// The idempotency key, if one was given.
    pub idempotency_key: Option<Vec<u8>>,
    /// The dedup key it was enqueued with, while it has one: a job held until started lets
    /// go of it (and shows `None`) at its first delivery, and so does the holder of a key
    /// released by hand ([`Queue::release_dedup_key`](crate::Queue::release_dedup_key)). A
    /// completed or cancelled job shows the key it had, but no longer holds it (another job
    /// may).
    pub dedup_key: Option<Vec<u8>>,
    /// The payload's length in bytes.
    pub payload_bytes: usize,
    /// Times it was snoozed ([`Lease::snooze`](crate::Lease::snooze): given back without
    /// charging the attempt).
    pub snoozes: u32,
    /// Its own lease duration in ms, if given at enqueue
    /// ([`EnqueueOptions::lease`]); `None` uses the queue's.
    pub lease_ms: Option<u64>,
    /// Its own retry policy, if given at enqueue ([`EnqueueOptions::retry`]).
    pub retry: Option<crate::retry::RetryPolicy>,
    /// Its dedup window in ms, if given ([`EnqueueOptions::dedup_window`]): the key is held
    /// until `created_ms` plus this. A duplicate with
    /// [`EnqueueOptions::extend_dedup_window`] lengthens it to reach the window's new end.
    pub dedup_window_ms: Option<u64>,
    /// Its own execution timeout in ms, if given at enqueue ([`EnqueueOptions::timeout`]);
    /// `None`: a pool's [`job_timeout`](crate::worker::PoolBuilder::job_timeout), if any.
    pub timeout_ms: Option<u64>,
    /// The encoding of a payload enqueued with
    /// [`Queue::enqueue_value`](crate::Queue::enqueue_value); `None` for raw bytes.
    pub encoding: Option<crate::format::payload::Encoding>,
}

/// What a queue keeps of its completed jobs: its completed history
/// ([`Queue::set_history`](crate::Queue::set_history)), as BullMQ's `removeOnComplete: { count,
/// age }` and River's completed-job retention. Off by default: an ack deletes the job, so
/// nothing grows. With a bound set, an ack keeps the job as [`JobState::Completed`] (with the
/// result the ack stored, if any), and the oldest kept jobs go once there are more than
/// `keep_jobs` of them, or once they are older than `keep_for`, whichever comes first; both
/// bounds may be set. Cancelled jobs ([`Queue::cancel`](crate::Queue::cancel)) are kept the same
/// way and count toward `keep_jobs`, except a cancelled lease's row while it fences that lease
/// (until the lease's deadline): kept whatever the bounds, and not counted. Jobs past a bound are deleted a few per operation (as
/// dead jobs past [`Builder::dead_retention`](crate::Builder::dead_retention)), and the rest by
/// [`Queue::prune`](crate::Queue::prune). A job's result is what
/// [`Lease::set_result`](crate::Lease::set_result) set before the ack that ended it (any ack,
/// `ack_with` and a [`WorkerPool`](crate::worker::WorkerPool)'s included).
/// [`Queue::jobs`](crate::Queue::jobs) lists the history oldest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct History {
    pub(crate) keep_jobs: Option<u64>,
    pub(crate) keep_for_ms: Option<u64>,
}

impl History {
    /// No history: an ack deletes its job (the default).
    pub fn off() -> History {
        History::default()
    }

    /// Keeps at most the last `jobs` completed and cancelled jobs (1 to
    /// [`HISTORY_JOBS_MAX`](crate::HISTORY_JOBS_MAX); checked by `set_history`).
    pub fn keep_jobs(mut self, jobs: u64) -> History {
        self.keep_jobs = Some(jobs);
        self
    }

    /// Keeps completed and cancelled jobs for `age` after they ended (1 ms to
    /// [`DELAY_MAX`](crate::DELAY_MAX); checked by `set_history`).
    pub fn keep_for(mut self, age: std::time::Duration) -> History {
        // Clamped so a huge Duration is refused by the check, not wrapped.
        self.keep_for_ms = Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// The most jobs kept, if bounded by count.
    pub fn jobs(&self) -> Option<u64> {
        self.keep_jobs
    }

    /// How long jobs are kept after they ended, if bounded by age.
    pub fn age(&self) -> Option<std::time::Duration> {
        self.keep_for_ms.map(std::time::Duration::from_millis)
    }

    /// Whether no history is kept.
    pub fn is_off(&self) -> bool {
        self.keep_jobs.is_none() && self.keep_for_ms.is_none()
    }
}

/// The error that ended one attempt of a job ([`JobInfo::errors`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptError {
    /// The attempt it ended (1 for the first delivery).
    pub attempt: u32,
    /// When (Unix ms); `None` for an error recorded before format 7 or imported.
    pub at_ms: Option<u64>,
    /// The reason, at most [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes.
    pub message: String,
}

/// One page of [`Queue::jobs`](crate::Queue::jobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPage {
    /// The jobs, in the state's order (ready: the ones that can be delivered now, in the order
    /// they will be dequeued, then those waiting behind their group's head, group by group
    /// (by key bytes), each group's in the order it will deliver them; scheduled: by
    /// due time; leased: by lease deadline; dead: by id; completed: by when they completed,
    /// oldest first; cancelled: by when their row may go, oldest first: when they were
    /// cancelled, or a cancelled lease's deadline).
    pub jobs: Vec<JobInfo>,
    /// Where the next page starts: `Some` whenever this page is full (the next one may then
    /// be empty), `None` when it is not (the end was reached). For
    /// [`Queue::jobs_before`](crate::Queue::jobs_before), the next page back.
    pub next: Option<JobCursor>,
    /// The place of this page's first job (`None` for an empty page), to page the other way:
    /// pass it as `before` to [`Queue::jobs_before`](crate::Queue::jobs_before) for the jobs
    /// before this page, or as `after` to [`Queue::jobs`](crate::Queue::jobs) for those after
    /// a page [`Queue::jobs_before`](crate::Queue::jobs_before) gave.
    pub first: Option<JobCursor>,
}

/// Where a page of [`Queue::jobs`](crate::Queue::jobs) ends: pass it back as `after` for the
/// next page. Valid for the state it was read from only. Jobs that change state between two
/// pages may be missed or seen twice (as any paging over live data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobCursor {
    pub(crate) state: JobState,
    pub(crate) key: (u64, u64, u64),
}

impl JobCursor {
    /// This cursor as text, to carry in a URL or on a command line (a dashboard's "next page"
    /// link): `<state>.<a>.<b>.<c>` in ASCII, at most 72 bytes. [`JobCursor::parse`] reads it
    /// back. The text names a place in the state's order, not a job: any cursor is safe to
    /// pass to [`Queue::jobs`](crate::Queue::jobs), a forged one only starts the page
    /// elsewhere.
    pub fn to_text(&self) -> String {
        let (a, b, c) = self.key;
        format!("{}.{a}.{b}.{c}", self.state.as_str())
    }

    /// Reads a cursor written by [`JobCursor::to_text`].
    ///
    /// # Errors
    /// `InvalidOption` for text that is not a state name and three unsigned decimal `u64`s
    /// separated by dots (what `to_text` writes, or the same numbers written with leading
    /// zeros or a `+`).
    pub fn parse(text: &str) -> crate::error::Result<JobCursor> {
        let bad = || {
            crate::error::Error::invalid_option(
                "cursor",
                "not a cursor written by JobCursor::to_text (state.a.b.c)",
            )
        };
        let mut parts = text.split('.');
        let state = parts.next().and_then(JobState::from_name).ok_or_else(bad)?;
        let mut number = || -> crate::error::Result<u64> {
            parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)
        };
        let key = (number()?, number()?, number()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(JobCursor { state, key })
    }

    /// The state whose order this cursor is a place in.
    pub fn state(&self) -> JobState {
        self.state
    }
}

/// Counts of jobs per state. Kept by redb's per-table lengths, so they always agree with a
/// scan (checked by [`Queue::check`](crate::Queue::check)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// All live jobs (`scheduled + ready + leased + dead`).
    pub total: u64,
    /// Waiting for a delay or backoff. A job whose due time came is counted here until a
    /// consumer of the queue looks (a dequeue, or a waiting consumer woken at the due time,
    /// in a paused queue too: see [`Queue::pause`](crate::Queue::pause)) and moves it to
    /// `ready`.
    pub scheduled: u64,
    /// Available now: waiting in line, delivered in priority order (in a paused queue, once
    /// it is resumed).
    pub ready: u64,
    /// Under a lease.
    pub leased: u64,
    /// Dead-lettered.
    pub dead: u64,
    /// Applied-ids markers kept.
    pub applied: u64,
    /// Dedup keys held (by live jobs, or by windows).
    pub dedup_keys: u64,
    /// Job rows moved to quarantine because they failed their checks (not counted in
    /// `total`); see [`Queue::quarantined`](crate::Queue::quarantined).
    pub quarantined: u64,
    /// Whether the queue is paused ([`Queue::pause`](crate::Queue::pause)): it delivers
    /// nothing until resumed.
    pub paused: bool,
    /// Completed jobs kept in the history ([`Queue::set_history`](crate::Queue::set_history);
    /// not counted in `total`).
    pub completed: u64,
    /// Cancelled jobs kept ([`Queue::cancel`](crate::Queue::cancel); not counted in `total`).
    pub cancelled: u64,
    /// The queue's size limit ([`Queue::set_limit`](crate::Queue::set_limit)), if it has one.
    pub limit: Option<crate::queue_limit::QueueLimit>,
    /// The payload bytes of its scheduled, ready and leased jobs, what the limit's
    /// `max_bytes` bounds; counted while the queue has a limit, `None` without one.
    pub payload_bytes: Option<u64>,
    /// Waiting jobs dropped to make room since the queue began
    /// ([`WhenFull::DropOldest`](crate::WhenFull::DropOldest)).
    pub dropped: u64,
    /// Since when (Unix ms) the file is *storage full*: its disk, or its file limit, is
    /// within the disk reserve ([`Builder::disk_reserve`](crate::Builder::disk_reserve)),
    /// so enqueues are refused with [`Error::StorageFull`](crate::Error::StorageFull) while
    /// the drain goes on. `None` while it has room. The writer records it with its next
    /// commit, so a reader in another process sees it too; a file-wide state, the same in
    /// every queue's stats.
    pub storage_full_ms: Option<u64>,
}

impl Stats {
    /// Jobs still to be done: scheduled, ready or leased (not dead). What
    /// [`Queue::len`](crate::Queue::len) counts.
    pub fn pending(&self) -> u64 {
        self.scheduled + self.ready + self.leased
    }
}

/// A job row that failed its checks (a checksum mismatch, a record that does not decode or
/// breaks an invariant) and was moved aside whole by the pass that met it (a dequeue, a lease
/// recovery at open), so the rest of the queue goes on. Its bytes are kept as found
/// ([`Queue::quarantined_record`](crate::Queue::quarantined_record)); it is never delivered,
/// and a dedup key it held stays held until [`Queue::remove`](crate::Queue::remove) deletes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The job's id.
    pub job_id: JobId,
    /// When it was quarantined (Unix ms of the queue's clock).
    pub quarantined_ms: u64,
    /// What its check found (at most 4096 bytes).
    pub reason: String,
    /// The length of the row's bytes as found.
    pub record_bytes: usize,
}

/// A job to add as it was, with its state and history, for
/// [`Queue::import_batch`](crate::Queue::import_batch): what `leaseq import` reads back from
/// `leaseq export` (moving jobs between files, or restoring a backup). Built with
/// [`ImportJob::new`] and its setters; everything not set is as a fresh enqueue.
///
/// ```
/// use leaseq::{EnqueueOptions, ImportJob, JobState};
/// let job = ImportJob::new(b"resize 42".to_vec())
///     .options(EnqueueOptions::default().priority(-1).max_attempts(5))
///     .state(JobState::Dead)
///     .run_at_ms(1_700_000_000_000) // when it died
///     .attempts(5)
///     .last_error(Some("timeout".into()));
/// # let _ = job;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportJob {
    pub(crate) payload: Vec<u8>,
    pub(crate) options: EnqueueOptions,
    pub(crate) state: JobState,
    pub(crate) run_at_ms: Option<u64>,
    pub(crate) attempts: u32,
    pub(crate) snoozes: u32,
    pub(crate) last_error: Option<String>,
    pub(crate) created_ms: Option<u64>,
    pub(crate) encoding: Option<crate::format::payload::Encoding>,
}

impl ImportJob {
    /// A ready job with `payload` and default options, no attempts made.
    pub fn new(payload: Vec<u8>) -> ImportJob {
        ImportJob {
            payload,
            options: EnqueueOptions::default(),
            state: JobState::Ready,
            run_at_ms: None,
            attempts: 0,
            snoozes: 0,
            last_error: None,
            created_ms: None,
            encoding: None,
        }
    }

    /// Its options: priority, max attempts, lease, retry policy, idempotency key, dedup key
    /// and window, checked as at enqueue. Their `delay` is ignored: the state and
    /// [`run_at_ms`](ImportJob::run_at_ms) say when it is due.
    pub fn options(mut self, options: EnqueueOptions) -> ImportJob {
        self.options = options;
        self
    }

    /// Its state (default `Ready`). `Leased` is taken as a lease that ended without an ack,
    /// as a reopen after a crash returns it: ready again, or dead when it has no attempts
    /// left, with "lease abandoned: …" as its last error either way.
    pub fn state(mut self, state: JobState) -> ImportJob {
        self.state = state;
        self
    }

    /// Unix ms. Scheduled: when it is due. Dead: when it died (kept for
    /// [`Builder::dead_retention`](crate::Builder::dead_retention)). Ready: when it became
    /// ready (informative; the ready line follows the import order). Default: the import's
    /// time.
    pub fn run_at_ms(mut self, run_at_ms: u64) -> ImportJob {
        self.run_at_ms = Some(run_at_ms);
        self
    }

    /// Deliveries already made (default 0). A ready or scheduled job must have one left
    /// (`attempts < max_attempts`); a dead one at most `max_attempts`.
    pub fn attempts(mut self, attempts: u32) -> ImportJob {
        self.attempts = attempts;
        self
    }

    /// Times it was snoozed (default 0).
    pub fn snoozes(mut self, snoozes: u32) -> ImportJob {
        self.snoozes = snoozes;
        self
    }

    /// Its last error (kept up to 4096 bytes, cut at a character boundary).
    pub fn last_error(mut self, last_error: Option<String>) -> ImportJob {
        self.last_error = last_error;
        self
    }

    /// When it was first enqueued, Unix ms (default: the import's time). A dedup window runs
    /// from it.
    pub fn created_ms(mut self, created_ms: u64) -> ImportJob {
        self.created_ms = Some(created_ms);
        self
    }

    /// The encoding of a typed payload ([`JobInfo::encoding`]); `None` for raw bytes.
    pub fn encoding(mut self, encoding: Option<crate::format::payload::Encoding>) -> ImportJob {
        self.encoding = encoding;
        self
    }
}

/// How a failing handler wants its job to end instead of the default retry: return it as the
/// error (`Err(Outcome::Snooze(d).into())`, or `?` on a `Result<_, Outcome>`) from an
/// [`ack_with`](crate::Lease::ack_with) closure (any form, and [`Queue::ack_with_batch`](crate::Queue::ack_with_batch)) or a
/// [`WorkerPool`](crate::WorkerPool) handler. As Oban's `{:snooze, s}` / `{:cancel, reason}`
/// and River's `JobSnooze` / `JobCancel`.
///
/// In an `ack_with` closure, nothing of the closure's transaction commits (as for any failing
/// closure), and the job ends as the outcome says in the commit that follows; the call returns
/// [`Error::Effect`](crate::Error::Effect) holding the `Outcome` (downcast it to see which).
/// A directive the queue refuses (a snooze or backoff above [`DELAY_MAX`](crate::DELAY_MAX))
/// gives the job back through the retry policy with the refusal as its last error, so the job
/// never waits out its lease.
///
/// ```
/// use leaseq::{BoxError, Lease, Outcome};
/// use std::time::Duration;
///
/// fn handle(lease: &Lease) -> Result<(), BoxError> {
///     match lease.payload() {
///         b"later" => Err(Outcome::Snooze(Duration::from_secs(30)).into()),
///         b"" => Err(Outcome::Fail("empty payload".into()).into()),
///         b"busy" => Err(Outcome::Retry {
///             after: Duration::from_secs(5),
///             reason: "upstream busy".into(),
///         }
///         .into()),
///         _ => Ok(()),
///     }
/// }
/// # let _ = handle;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Give the job back to be due after this delay (whole ms; `ZERO`: ready at once)
    /// without charging the attempt ([`Lease::snooze`](crate::Lease::snooze)); never dead-letters.
    Snooze(std::time::Duration),
    /// Dead-letter the job now with this reason, whatever attempts it has left
    /// ([`Lease::fail`](crate::Lease::fail)).
    Fail(String),
    /// Give the job back to be due after `after` instead of the retry policy's delay, the
    /// attempt counted ([`Lease::nack_after`](crate::Lease::nack_after)); dead when it was the last attempt.
    Retry {
        /// The backoff (whole ms; `ZERO`: ready at once).
        after: std::time::Duration,
        /// Kept as the job's last error.
        reason: String,
    },
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Snooze(d) => write!(f, "snooze for {} ms", d.as_millis()),
            Outcome::Fail(reason) => write!(f, "fail: {reason}"),
            Outcome::Retry { after, reason } => {
                write!(f, "{reason} (retry after {} ms)", after.as_millis())
            }
        }
    }
}

impl std::error::Error for Outcome {}

/// What [`Queue::prune`](crate::Queue::prune) removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// Applied-ids markers past their retention.
    pub applied: u64,
    /// Dedup keys whose window ended (released; their jobs untouched).
    pub dedup_windows: u64,
    /// Dead jobs past [`Builder::dead_retention`](crate::Builder::dead_retention) or over
    /// [`Builder::dead_jobs_max`](crate::Builder::dead_jobs_max) (deleted).
    pub dead: u64,
    /// Completed and cancelled jobs past the queue's history
    /// ([`Queue::set_history`](crate::Queue::set_history); deleted).
    pub history: u64,
}

/// One broken invariant found by [`Queue::check`](crate::Queue::check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The job concerned, when there is one.
    pub job_id: Option<JobId>,
    /// What is wrong.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.job_id {
            Some(id) => write!(f, "job {id}: {}", self.detail),
            None => f.write_str(&self.detail),
        }
    }
}
