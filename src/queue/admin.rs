//! Per-job and bulk administration: cancel, retry, promote, reschedule, remove, purge, prune.

use std::time::Duration;

use super::Queue;
use crate::commit::Ctx;
use crate::error::{Error, Result};
use crate::job::Pruned;
use crate::job::{JobId, JobState};
use crate::limits::BATCH_MAX;
use crate::store;

/// One commit of a bulk call: over at most [`BATCH_MAX`] rows at the clock's Unix ms, how
/// many rows it changed and whether any is left.
type BatchStep<'s> = dyn FnMut(&mut Ctx<'_>, u64) -> Result<(u64, bool)> + 's;

impl Queue {
    /// Cancels a job in any live state, with `reason` (kept up to
    /// [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes, cut at a character boundary), as
    /// River's `JobCancel`, Oban's `cancel_job` and BullMQ's cancellation. Returns what it
    /// did ([`CancelOutcome`](crate::CancelOutcome)): cancelled now (and the state the job was
    /// in), or ended before this call (nothing written). One commit. Inside a transaction
    /// of your own (with your writes), [`Tx::cancel`](crate::Tx::cancel).
    ///
    /// - A scheduled, ready or dead job ends now: it is never delivered again.
    /// - A leased job ends now too, and its current delivery is fenced: that lease's
    ///   [`ack`](crate::Lease::ack), `ack_with`, `nack`, `snooze`, `fail` and
    ///   [`extend`](crate::Lease::extend) are refused with
    ///   [`Error::Cancelled`] and change nothing of the job (the worker's effect is not
    ///   applied; an `ack_with` closure does not run). The worker can find out while it runs:
    ///   [`Lease::is_cancelled`](crate::Lease::is_cancelled) is a cheap read, and its
    ///   heartbeat's extends fail with `Cancelled`.
    ///   leaseq cannot stop the worker's code: as in River, the work in flight runs to its
    ///   end, and only its outcome is refused. So a job of an ordered group
    ///   ([`EnqueueOptions::group`](crate::EnqueueOptions::group)) cancelled while leased still
    ///   holds its group until that delivery ends (the worker's ack, `ack_with`, nack, snooze
    ///   or fail, each answered `Cancelled`; its lease's deadline; or the next open): the
    ///   group's next job never runs beside it. The worker's extends and heartbeats, though
    ///   answered `Cancelled`, still move that deadline as they would have moved the lease's,
    ///   and a [`WorkerPool`](crate::worker::WorkerPool) keeps a cancelled handler's
    ///   heartbeats going until it returns: a handler that runs past the deadline its lease
    ///   had at the cancel still holds its group. One exception: a thread pool's execution
    ///   timeout ([`PoolBuilder::job_timeout`](crate::worker::PoolBuilder::job_timeout),
    ///   [`EnqueueOptions::timeout`](crate::EnqueueOptions::timeout)) ends the delivery when
    ///   it is up, as it ends any job's, though the thread runs on (an async pool drops the
    ///   handler's future then).
    ///
    /// The job lets go of its dedup key and idempotency key at once (a new enqueue with the
    /// key makes a new job; a running [`dedup_window`](crate::EnqueueOptions::dedup_window)
    /// still holds its key until it ends). It is kept as [`JobState::Cancelled`] with its
    /// reason in a queue that keeps a history ([`Queue::set_history`]), where it counts
    /// toward the bounds, and in any queue until the deadline of the lease it fenced (so
    /// that lease's calls learn why); otherwise it is deleted. [`Queue::retry`] runs a
    /// cancelled job again while its row is kept: to undo cancels, keep a history.
    ///
    /// A job that already ended is not an error, as in Oban's `cancel_job` (which answers
    /// `:ok`): [`CancelOutcome::AlreadyEnded`](crate::CancelOutcome::AlreadyEnded) names its
    /// state while its row is kept (a history, a fence), and
    /// [`CancelOutcome::Gone`](crate::CancelOutcome::Gone) says its row went (ended and not
    /// kept). An id this file never handed out is `JobNotFound`, so "ended earlier" and
    /// "never existed" are told apart (ids are reserved in blocks: an unused id of a block
    /// reserved before a restart reads as `Gone`, as does an id whose job ended in another
    /// queue; a live job of another queue is `JobNotFound`).
    ///
    /// # Errors
    /// `JobNotFound` for an id this file never handed out, or one another queue of the file
    /// holds; `Corrupted` if its row is damaged; `Reentrant` (inside [`Queue::write`] or an `ack_with` closure: use
    /// [`Tx::cancel`](crate::Tx::cancel)); `CommitFailed` or `Storage`. Nothing is written on
    /// an error.
    pub fn cancel(&self, id: JobId, reason: &str) -> Result<crate::job::CancelOutcome> {
        let now_ms = self.now_ms();
        let reason = store::truncate_reason(reason);
        self.run(&mut |ctx| store::cancel(ctx, self.config.schema, id.0, &reason, now_ms))
    }

    /// Runs a job again, as River's `JobRetry`: a dead, completed or cancelled job goes back
    /// to ready now, at the back of its priority, with its attempts reset (a new series of
    /// `max_attempts`); its error history stays. A completed or cancelled job takes its keys
    /// back: it carries its idempotency key again (if an `ack_with` applied it, the next
    /// delivery's `ack_with` answers `AlreadyApplied`: the effect is not applied twice), and
    /// holds its dedup key again. For a dead job this is [`Queue::requeue_dead`]. A scheduled
    /// job (waiting for its delay, or for the backoff after a failed attempt) is ready now, at
    /// the back of its priority, its attempts, keys and options kept: this is
    /// [`Queue::promote`]. One commit.
    ///
    /// Where it differs from River's `JobRetry` (`Client.JobRetry` in riverqueue/river's
    /// `client.go` and its `JobRetry` SQL query: every job but a running one becomes
    /// `available`, due now, one already available keeping its place):
    /// - River keeps the attempt count of an ended job and raises its `max_attempts` by one
    ///   when it has none left; here a dead, completed or cancelled job starts a whole new
    ///   series, as BullMQ's `job.retry()` does (its `reprocessJob` script clears
    ///   `attemptsMade`).
    /// - River answers a running job, and a job already available, with the row unchanged;
    ///   here they are `InvalidState`, so a caller learns that nothing was retried (a leased
    ///   job ends through its lease; a ready one is already due).
    /// - BullMQ's `job.retry()` takes only a failed or completed job (`reprocessJob` answers
    ///   "not in state" for any other); a scheduled job is taken here, as River takes it.
    ///
    /// A job cancelled while leased, without a group, may be retried at once: it is delivered
    /// again while the cancelled worker may still run (leaseq cannot stop it), whose late
    /// calls are then refused with `LeaseLost`. In an ordered group the retry waits for that
    /// delivery to end (`InvalidState` until then).
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` for a ready or leased job, or a job of an ordered group
    /// cancelled while leased whose delivery has not ended (its group waits for it: see
    /// [`Queue::cancel`]); `KeyHeld` if another job took the dedup key of a completed or
    /// cancelled one meanwhile; `Corrupted` if its row is
    /// damaged; `Reentrant`; `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn retry(&self, id: JobId) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::retry(ctx, self.config.schema, id.0, now_ms))
    }

    /// Runs a scheduled job now, as BullMQ's `job.promote()`: ready at once, at the back of
    /// its priority; its attempts, keys and options stay. One commit.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` if it is not scheduled (a leased job is changed through
    /// its lease; a ready job is already due); `Corrupted` if its row is damaged; `Reentrant`;
    /// `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn promote(&self, id: JobId) -> Result<()> {
        self.update(id, store::Change::Promote)
    }

    /// Moves the due time of a ready or scheduled job to `delay` from now (whole
    /// milliseconds, at most [`DELAY_MAX`](crate::DELAY_MAX); zero: ready now), as BullMQ's
    /// `job.changeDelay()`. A ready job given a delay waits again; a ready job given zero keeps
    /// its place in line; a scheduled one made ready goes to the back of its priority. One
    /// commit.
    ///
    /// Where it differs from the call named: BullMQ's `changeDelay` takes only a delayed job
    /// (its `changeDelay` script answers "job not in delayed set" for any other, and the call
    /// throws); here a ready job is taken too and waits again, the way to put off a job that
    /// waits in line without a remove and a new enqueue (which would lose its id, keys and
    /// attempts). A job that has not started is either ready or scheduled, so the call
    /// refuses only what BullMQ cannot delay either: a running, failed or finished job.
    ///
    /// # Errors
    /// `InvalidOption` for a delay above `DELAY_MAX` or a due time that overflows;
    /// `JobNotFound`; `InvalidState` for a leased, dead or ended job (a dead job runs again
    /// with [`Queue::retry`]); `Corrupted`; `Reentrant`; `CommitFailed` or `Storage`. Nothing
    /// is written on an error.
    pub fn reschedule(&self, id: JobId, delay: Duration) -> Result<()> {
        if delay > crate::limits::DELAY_MAX {
            return Err(Error::invalid_option("delay", "above DELAY_MAX"));
        }
        self.update(id, store::Change::DueIn(crate::clock::duration_ms(delay)))
    }

    /// Changes the priority of a ready, scheduled or dead job (lower is served first), as
    /// BullMQ's `job.changePriority()`. A ready job keeps its place among the jobs of its new
    /// priority by when it became ready; a scheduled or dead one is served at its new
    /// priority once ready. One commit.
    ///
    /// Where it differs from the call named: BullMQ's `changePriority` script takes a waiting
    /// job out and adds it again with a new number from the queue's priority counter, so it
    /// goes behind every waiting job of its new priority, as if added now (with `lifo`, before
    /// them); here it keeps the place its ready time gives it, so a job that waited long is
    /// not sent to the back of the line by a change (a job raised to a higher priority is
    /// served before the jobs of that priority that became ready after it). BullMQ also
    /// records a new priority on a job in any other state (active, failed, completed); here a
    /// leased or ended job is refused, nothing written, as its priority no longer orders
    /// anything.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` for a leased or ended job; `Corrupted`; `Reentrant`;
    /// `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn set_priority(&self, id: JobId, priority: i32) -> Result<()> {
        self.update(id, store::Change::Priority(priority))
    }

    /// Replaces the payload of a ready, scheduled or dead job, as BullMQ's `job.updateData()`:
    /// its place, attempts, keys and options stay. The new payload is raw bytes (a typed
    /// payload's recorded encoding goes; [`Lease::decode`](crate::Lease::decode) then uses the
    /// handle's). One commit.
    ///
    /// # Errors
    /// `PayloadTooLarge` above [`Builder::payload_bytes_max`](crate::Builder::payload_bytes_max); `JobNotFound`; `InvalidState`
    /// for a leased or ended job (a leased job's payload is what its worker is running);
    /// `Corrupted`; `Reentrant`; `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn update_payload(&self, id: JobId, payload: &[u8]) -> Result<()> {
        if payload.len() > self.config.payload_bytes_max {
            return Err(Error::PayloadTooLarge {
                size_bytes: payload.len(),
                limit_bytes: self.config.payload_bytes_max,
            });
        }
        self.update(id, store::Change::Payload(payload))
    }

    pub(super) fn update(&self, id: JobId, change: store::Change<'_>) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::update(ctx, self.config.schema, id.0, change, now_ms))
    }

    /// Releases a dedup key by hand, as BullMQ's `removeDeduplicationKey`: the next enqueue
    /// with it makes a new job. The job that held it goes on but no longer holds it (its
    /// [`JobInfo::dedup_key`](crate::JobInfo::dedup_key) is `None` from then on, and its dedup window ends). Returns the
    /// job the key named (possibly gone, for a window), or `None` if nothing held it. One
    /// commit when a key was held.
    ///
    /// # Errors
    /// `KeyTooLong` above [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX), `InvalidOption` for an
    /// empty key (nothing written); `Reentrant`; `CommitFailed` or `Storage`.
    pub fn release_dedup_key(&self, key: impl AsRef<[u8]>) -> Result<Option<JobId>> {
        let key = key.as_ref().to_vec();
        store::validate_key("dedup_key", Some(&key))?;
        self.run(&mut |ctx| store::release_key(ctx, self.config.schema, &key).map(Ok))
            .map(|holder| holder.map(JobId))
    }

    /// Moves every dead job back to ready with its attempts reset, as
    /// [`Queue::requeue_dead`] for each, in commits of up to [`BATCH_MAX`](crate::BATCH_MAX)
    /// jobs; returns how many were requeued. Each job moves once: requeueing twice never
    /// makes two jobs. Jobs that die while it runs may be requeued too.
    ///
    /// # Errors
    /// `Reentrant`; `CommitFailed` or `Storage` (the commits before it stay).
    pub fn requeue_dead_all(&self) -> Result<u64> {
        self.each_in_state(JobState::Dead, store::BulkAction::Requeue)
    }

    /// Deletes every job in `state` (dead, scheduled or ready; never leased: a leased job is
    /// ended through its lease), releasing their dedup keys (a running
    /// [`dedup_window`](crate::EnqueueOptions::dedup_window) ends with its job), in commits of
    /// up to
    /// [`BATCH_MAX`](crate::BATCH_MAX) jobs; returns how many were deleted. As BullMQ's
    /// `obliterate` / `clean` by state.
    ///
    /// # Errors
    /// `InvalidOption` for `JobState::Leased` (nothing written); `Reentrant`; `CommitFailed` or
    /// `Storage` (the commits before it stay).
    pub fn purge(&self, state: JobState) -> Result<u64> {
        if state == JobState::Leased {
            return Err(Error::invalid_option(
                "state",
                "leased jobs are ended through their leases",
            ));
        }
        self.each_in_state(state, store::BulkAction::Purge)
    }

    /// Runs `action` over the jobs in `state`, a batch per commit, until none is left or as
    /// many batches ran as there were jobs at the start (so jobs arriving meanwhile cannot
    /// keep it going).
    pub(super) fn each_in_state(&self, state: JobState, action: store::BulkAction) -> Result<u64> {
        let stats = self.stats()?;
        let at_start = match state {
            JobState::Scheduled => stats.scheduled,
            JobState::Ready => stats.ready,
            JobState::Leased => stats.leased,
            JobState::Dead => stats.dead,
            JobState::Completed => stats.completed,
            JobState::Cancelled => stats.cancelled,
        };
        let schema = self.config.schema;
        self.in_batches(at_start, &mut |ctx, now_ms| {
            store::bulk_by_state(ctx, schema, state, action, now_ms, BATCH_MAX)
        })
    }

    /// Runs `step` (one commit over at most [`BATCH_MAX`] rows at the clock's `now_ms`,
    /// answering how many it changed and whether any is left) until none is left, or as many
    /// batches ran as `at_start` rows (counted before) fill, plus one: rows arriving meanwhile
    /// cannot keep it going. Returns the rows changed; the commits before an error stay.
    fn in_batches(&self, at_start: u64, step: &mut BatchStep<'_>) -> Result<u64> {
        let batches = at_start.div_ceil(BATCH_MAX as u64) + 1;
        let mut total = 0;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (n, more) = self.run(&mut |ctx| step(ctx, now_ms).map(Ok))?;
            total += n;
            if !more {
                break;
            }
        }
        Ok(total)
    }

    /// Moves a dead job back to ready with its attempts reset to 0, as a fresh job at the
    /// back of its priority.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` if the job is not dead; `CommitFailed` or `Storage`.
    pub fn requeue_dead(&self, id: JobId) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::requeue_dead(ctx, self.config.schema, id.0, now_ms))
    }

    /// Deletes a job that is not leased (scheduled, ready, dead, completed or cancelled) and
    /// releases its dedup key
    /// (ending a running [`dedup_window`](crate::EnqueueOptions::dedup_window) too), as
    /// BullMQ's `Job.remove`: for dead jobs that will not be retried, or work that is no
    /// longer wanted. A leased job must be ended through its lease (ack, nack, fail).
    ///
    /// Also deletes a quarantined row ([`Queue::quarantined`]) or a job row that fails its
    /// checks, whatever its state (which cannot be read), with every index and dedup entry
    /// naming it. Finding those entries reads the index and dedup tables whole: only the
    /// repair of a damaged file pays that.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` if the job is leased, or is a job of an ordered group
    /// cancelled while leased whose delivery has not ended (see [`Queue::cancel`]);
    /// `CommitFailed` or `Storage`.
    pub fn remove(&self, id: JobId) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::remove(ctx, self.config.schema, id.0, now_ms))
    }

    /// Removes every applied-ids marker past its retention
    /// ([`Builder::applied_retention`](crate::Builder::applied_retention)), deletes every dead job past
    /// [`Builder::dead_retention`](crate::Builder::dead_retention) (if set) and the oldest over
    /// [`Builder::dead_jobs_max`](crate::Builder::dead_jobs_max), and releases every dedup key whose window ended
    /// ([`EnqueueOptions::dedup_window`](crate::EnqueueOptions::dedup_window)) now, in commits of up to
    /// [`BATCH_MAX`](crate::BATCH_MAX), deletes the completed and cancelled jobs past the
    /// queue's history ([`Queue::set_history`]; first, so a marker only such a job carried goes
    /// in the same call), and reports what it removed. (A window that ended
    /// already lets a new enqueue take its key; this only cleans up.) (`ack_with` already
    /// removes a few with every marker it writes; this finishes the job, for example before
    /// [`Queue::compact`].) Never removes a marker whose key a job carries (a live one, or one kept in the history,
    /// which a retry may run again): its retention
    /// starts again instead.
    ///
    /// # Errors
    /// `Reentrant`; `CommitFailed` or `Storage` (the commits before it stay).
    pub fn prune(&self) -> Result<Pruned> {
        let config = self.config;
        let mut out = Pruned::default();
        // First the completed and cancelled jobs past the history: a marker only such a job
        // carried can then go in this same call.
        let s = self.stats()?;
        out.history = self.in_batches(s.completed + s.cancelled, &mut |ctx, now_ms| {
            store::prune_history_jobs(ctx, config.schema, now_ms, BATCH_MAX)
        })?;
        out.applied = self.in_batches(self.stats()?.applied, &mut |ctx, now_ms| {
            store::prune(ctx, &config, now_ms, BATCH_MAX)
        })?;
        // Dead jobs past their retention.
        out.dead = self.in_batches(self.stats()?.dead, &mut |ctx, now_ms| {
            store::prune_dead_jobs(ctx, &config, now_ms, BATCH_MAX)
        })?;
        // Dedup windows that ended: as many batches as there are keys at most.
        out.dedup_windows = self.in_batches(self.stats()?.dedup_keys, &mut |ctx, now_ms| {
            store::prune_dedup_windows(ctx, config.schema, now_ms, BATCH_MAX)
        })?;
        tracing::info!(
            queue = self.config.schema.queue_number,
            applied = out.applied,
            dedup_windows = out.dedup_windows,
            dead = out.dead,
            history = out.history,
            "leaseq: pruned"
        );
        Ok(out)
    }
}
