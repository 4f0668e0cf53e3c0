//! The read calls: one snapshot each, never a write (but `file_id`'s first draw).

use super::Queue;
use crate::error::Result;
use crate::job::Violation;
use crate::job::{JobCursor, JobId, JobInfo, JobPage, JobState, Quarantined, Stats};
use crate::metrics::MinuteCounts;
use crate::reader::Reader;
use crate::store;

impl Queue {
    /// A [`Reader`] of this queue over this handle's own open: the read calls, each on
    /// the latest commit ([`Reader::is_live`] is true). The queue's own read calls
    /// ([`Queue::stats`], [`Queue::jobs`], ...) are the reader's. Like any handle, a reader
    /// keeps the file open while it lives: [`Queue::shutdown`] waits for it.
    #[track_caller]
    pub fn reader(&self) -> Reader {
        let mark = self.mark.derive(
            Some(crate::handles::HandleKind::Reader),
            self.name.clone(),
            std::panic::Location::caller(),
        );
        Reader::of_writer(
            self.inner.clone(),
            self.config.schema,
            self.name.clone(),
            mark,
        )
    }

    /// A snapshot of one job, or `None` if no job has this id (never enqueued, or acked).
    ///
    /// # Errors
    /// `Corrupted` if its record does not decode; `Storage`.
    pub fn job(&self, id: JobId) -> Result<Option<JobInfo>> {
        self.reader().job(id)
    }

    /// Counts of jobs per state in this handle's queue, read from one snapshot.
    ///
    /// # Errors
    /// `Storage`.
    pub fn stats(&self) -> Result<Stats> {
        self.reader().stats()
    }

    /// Jobs still to be done: scheduled, ready or leased, not dead ([`Stats::pending`]), so
    /// "drain until empty" ends when the work is done even if some jobs died. Dead jobs are
    /// counted by [`Stats::dead`] (and in [`Stats::total`]).
    ///
    /// # Errors
    /// `Storage`.
    pub fn len(&self) -> Result<u64> {
        Ok(self.stats()?.pending())
    }

    /// Whether no job is left to do (none scheduled, ready or leased; dead jobs may remain).
    ///
    /// # Errors
    /// `Storage`.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Up to `limit` jobs in `state` (1 to [`BATCH_MAX`](crate::BATCH_MAX)), after `after`
    /// (the `next` of the previous page; `None` from the start), in that state's order: ready
    /// in the order they will be dequeued (those waiting behind their ordered group's head
    /// last, group by group, each in its group's order), scheduled by due time, leased by
    /// deadline, dead by id. Read from one snapshot; a row that fails its checks is skipped (`check` reports
    /// it). With [`JobInfo::last_error`](crate::JobInfo::last_error) and [`JobInfo::died_ms`](crate::JobInfo::died_ms), the dead-letter view;
    /// [`Queue::payload`] reads a job's payload.
    ///
    /// # Errors
    /// `InvalidOption` for `limit` of 0 or above `BATCH_MAX`, or a cursor of another state;
    /// `Storage`.
    pub fn jobs(&self, state: JobState, after: Option<JobCursor>, limit: usize) -> Result<JobPage> {
        self.reader().jobs(state, after, limit)
    }

    /// The jobs in `state` just before `before` in [`Queue::jobs`]' order (the last ones
    /// with `None`), in the reverse order: a dead, completed or cancelled list newest first,
    /// as BullMQ's lists and Oban Web show them. The page's
    /// [`next`](crate::JobPage::next) continues backward (pass it as `before`); its
    /// [`first`](crate::JobPage::first), passed as `after` to [`Queue::jobs`], reads the
    /// jobs after it, so a UI pages both ways.
    ///
    /// # Errors
    /// `InvalidOption` for `Ready` (listed in delivery order only), `limit` of 0 or above
    /// `BATCH_MAX`, or a cursor of another state; `Storage`.
    pub fn jobs_before(
        &self,
        state: JobState,
        before: Option<JobCursor>,
        limit: usize,
    ) -> Result<JobPage> {
        self.reader().jobs_before(state, before, limit)
    }

    /// Up to `limit` dead jobs (1 to [`BATCH_MAX`](crate::BATCH_MAX)), the most recently
    /// dead first: the dead-letter view of a dashboard, as BullMQ's failed list. Read from one
    /// snapshot by the dead jobs' time index ([`JobInfo::died_ms`](crate::JobInfo::died_ms)); a row that fails its
    /// checks is skipped. [`Queue::jobs`] lists them by id, with paging.
    ///
    /// # Errors
    /// `InvalidOption` for `limit` of 0 or above `BATCH_MAX`; `Storage`.
    pub fn latest_dead(&self, limit: usize) -> Result<Vec<JobInfo>> {
        self.reader().latest_dead(limit)
    }

    /// The payload of job `id` as enqueued, or `None` if no job has this id.
    ///
    /// # Errors
    /// `Corrupted` if its row is damaged or quarantined; `Storage`.
    pub fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.reader().payload(id)
    }

    /// Checks every invariant of the file, in every queue of it (the registry of named queues:
    /// one number per queue, each registered queue's tables there, no queue tables of an
    /// unregistered number; each job in exactly one state; every index and the
    /// jobs table agree both ways; dedup entries name their job or a running window, and the
    /// windows agree with their expiry index; applied markers (caller keys only) agree with
    /// their time index; `leaseq_idem_jobs` lists exactly the live jobs with an idempotency key;
    /// quarantined rows; counters ahead of every id and token) and returns the violations
    /// found, at most 1000. Empty means consistent.
    ///
    /// It reads every table of the file in read transactions (it never blocks writers):
    /// meant for tests and for a look after a crash or a disk problem, from code or from the
    /// command line with `leaseq check FILE`. It repairs nothing: a damaged job row is
    /// quarantined by the next dequeue that meets it, and deleted with [`Queue::remove`].
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` if redb cannot read the tables or the registry of named
    /// queues is damaged.
    pub fn check(&self) -> Result<Vec<Violation>> {
        self.reader().check()
    }

    /// Whether the applied-ids marker of this idempotency key exists: an effect under it was
    /// applied by [`Lease::ack_with`](crate::Lease::ack_with), within the retention ([`Builder::applied_retention`](crate::Builder::applied_retention):
    /// once the marker is pruned this is `false` again, and a duplicate is applied again).
    ///
    /// Only caller keys ([`EnqueueOptions::idempotency_key`](crate::EnqueueOptions::idempotency_key)) can be asked about. A job
    /// enqueued without one is keyed by its own id, and no marker is kept for it: ids are
    /// never reused, and the effect and the removal of the job commit together, so no later
    /// delivery of that job could ever ask. To learn whether a job's effect landed, read the
    /// caller's own table it wrote.
    ///
    /// # Errors
    /// `Storage`.
    pub fn is_applied(&self, idempotency_key: impl AsRef<[u8]>) -> Result<bool> {
        self.reader().is_applied(idempotency_key)
    }

    /// The file's random id: 64 bits (never 0), drawn and stored in the file by the first call
    /// (one commit then), the same for every queue of the file and across reopens. Relays
    /// make message ids unique across files with it (`lq:{file_id:016x}:{job id}`), since job
    /// ids are unique only within a file. A copy of the file carries the same id.
    ///
    /// # Errors
    /// `Closed` after [`Queue::close`] for a file that has no id yet; `CommitFailed`,
    /// `Storage`, `Reentrant`.
    pub fn file_id(&self) -> Result<u64> {
        if let Some(id) = self.reader().file_id()? {
            return Ok(id);
        }
        self.ensure_open()?;
        self.run(&mut |ctx| store::make_file_id(ctx).map(Ok))
    }

    /// Quarantined job rows, by job id, after `after` (exclusive; `None` from the first), at
    /// most `max` of them (at most [`BATCH_MAX`](crate::BATCH_MAX)): rows a dequeue or the
    /// lease recovery at open found failing their checks and moved aside whole, so the rest
    /// of the queue went on. Page through with the last id returned.
    /// [`Queue::quarantined_record`] gives a row's bytes; [`Queue::remove`] deletes it.
    ///
    /// # Errors
    /// `InvalidOption` for `max` of 0 or above `BATCH_MAX`; `Storage`.
    pub fn quarantined(&self, after: Option<JobId>, max: usize) -> Result<Vec<Quarantined>> {
        self.reader().quarantined(after, max)
    }

    /// The bytes of a quarantined job row as they were found (at most the record cap, 64 MiB
    /// and change), or `None` if the job is not quarantined.
    ///
    /// # Errors
    /// `Storage`.
    pub fn quarantined_record(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.reader().quarantined_record(id)
    }

    /// What this queue did per minute since `since_ms` (Unix ms; the minute holding it
    /// included), oldest first: one [`MinuteCounts`] per minute in which anything was
    /// counted, at most [`METRICS_MINUTES_KEPT`](crate::METRICS_MINUTES_KEPT) (a day) before
    /// the queue's newest counted minute: older ones are left out, and removed from the file
    /// a few dozen per write of the queue's counts. A read, as BullMQ's
    /// `getMetrics`. Counted for the commit that made each change (none for a change that
    /// did not commit), in the minute of that commit, and written to the file at most once
    /// per second: with a later commit, [`Queue::flush`], [`Queue::shutdown`] or the close of
    /// the file. This handle's calls include the counts not written yet; a
    /// [`Reader`](crate::Reader) in another process sees them within about a second of
    /// activity; a crash or power loss loses at most the last second's. Minutes are by the
    /// queue's [`Clock`](crate::Clock).
    ///
    /// # Errors
    /// `Storage`.
    pub fn metrics(&self, since_ms: u64) -> Result<Vec<MinuteCounts>> {
        self.reader().metrics(since_ms)
    }
}
