//! The `Queue` calls of periodic jobs.

use crate::commit::refuse;

use super::Queue;
use crate::error::Result;
use crate::job::JobId;
use crate::schedule::{Schedule, ScheduleInfo};
use crate::store;

impl Queue {
    /// Creates schedule `name` in this queue: a periodic job, stored in the file, as River's
    /// periodic jobs, Oban's Cron plugin and BullMQ's job schedulers. At each due time of its
    /// [`Timing`](crate::Timing) it enqueues one job (an *instance*) with its payload and
    /// options; returns the schedule as stored (its first due time in `next_due_ms`). One
    /// commit.
    ///
    /// - **Who enqueues.** There is no background thread: this queue's dequeues fire due
    ///   schedules in their own transaction (at most 256 per call, as they promote delayed
    ///   jobs), and a consumer waiting in [`dequeue_timeout`](Queue::dequeue_timeout), the
    ///   async face or a [`WorkerPool`](crate::worker::WorkerPool) wakes at the next due time.
    ///   A queue nobody dequeues from, or a paused one, enqueues nothing until someone does;
    ///   then the due times that passed enqueue one instance together. (The open decides the
    ///   due times missed while the file was closed for every queue, a paused one too: its
    ///   instance waits in the paused queue.)
    /// - **No drift.** Due times come from the timing (an interval counts from its start),
    ///   never from when the last run ended.
    /// - **No pile-up.** A due time that finds the last instance still ready or scheduled (a
    ///   retry waiting for its backoff too) enqueues nothing (it counts in `skipped`); one
    ///   that finds it running follows [`Overlap`](crate::Overlap) (with the default `Skip`,
    ///   one instance at a time, unless a dead one is requeued). A dead,
    ///   cancelled, completed or removed instance never stops the schedule.
    /// - **Closed file.** Due times that passed while the file was closed (or the app crashed)
    ///   follow [`Missed`](crate::Missed), decided by the open, before the first dequeue.
    /// - **Crashes.** An instance and its schedule's next due time commit together: a crash
    ///   neither loses a due time (it fires after the reopen, as `Missed` says) nor fires one
    ///   twice.
    ///
    /// An instance is a plain job of this queue: dequeued, acked, retried, dead-lettered and
    /// listed as any other ([`ScheduleInfo::last_job`] names the newest). Its idempotency key
    /// is its own id, so an [`ack_with`](crate::Lease::ack_with) applies once per due time.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::{Missed, Schedule};
    ///
    /// let info = queue.create_schedule(
    ///     "nightly-vacuum",
    ///     &Schedule::cron("0 3 * * *", "Europe/Berlin")
    ///         .payload(b"vacuum".to_vec())
    ///         .missed(Missed::Skip),
    /// )?;
    /// assert!(info.next_due_ms.is_some());
    /// assert!(matches!(
    ///     queue.create_schedule("nightly-vacuum", &Schedule::cron("@daily", "UTC")),
    ///     Err(leaseq::Error::ScheduleExists { .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Nothing is written on any of them:
    /// - `ScheduleExists` if this queue has a schedule of that name;
    /// - `InvalidOption` naming the field: `schedule name` (empty, above
    ///   [`SCHEDULE_NAME_BYTES_MAX`](crate::SCHEDULE_NAME_BYTES_MAX) bytes, or with control
    ///   characters), `interval` (0 or above [`DELAY_MAX`](crate::DELAY_MAX)), `cron` (text
    ///   the parser refuses, above [`CRON_TEXT_BYTES_MAX`](crate::CRON_TEXT_BYTES_MAX) bytes,
    ///   or one that never matches), `time_zone` (not an IANA name), `starting_at_ms` (on a
    ///   cron schedule, or more than [`DELAY_MAX`](crate::DELAY_MAX) from now), `delay`,
    ///   `dedup_key`, `idempotency_key`, the other dedup options and `group` (a schedule's
    ///   jobs take none), an option an enqueue would refuse (`max_attempts`,
    ///   `lease`, `retry`), or `schedules` when the file holds
    ///   [`SCHEDULES_MAX`](crate::SCHEDULES_MAX);
    /// - `PayloadTooLarge` above [`SCHEDULE_PAYLOAD_BYTES_MAX`](crate::SCHEDULE_PAYLOAD_BYTES_MAX)
    ///   or the handle's [`Builder::payload_bytes_max`](crate::Builder::payload_bytes_max);
    /// - `Closed`, `Reentrant`, `CommitFailed` or `Storage`.
    pub fn create_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleInfo> {
        self.set_schedule(name, schedule, store::SetMode::Create)
    }

    /// Changes schedule `name` of this queue to `schedule`: its payload, options and policies
    /// at once, and its timing. The same timing keeps the next due time (an interval keeps
    /// its start unless `schedule` gives one), even one reached but not fired yet (due at the
    /// very millisecond of the update): it fires at the next look. A new timing counts from
    /// now, as a new schedule's (a cron expression's first match strictly after now). The
    /// last instance and the counters are kept; an instance already enqueued keeps the old
    /// payload. One commit.
    ///
    /// # Errors
    /// `ScheduleNotFound` if this queue has no schedule of that name; otherwise as
    /// [`Queue::create_schedule`] (without `ScheduleExists`).
    pub fn update_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleInfo> {
        self.set_schedule(name, schedule, store::SetMode::Update)
    }

    /// Creates schedule `name`, or changes it as [`Queue::update_schedule`] does, as BullMQ's
    /// `upsertJobScheduler`: for an app that declares its schedules at every start. Declaring
    /// the same timing again keeps its next due time, so a restart never pushes a schedule
    /// back. One commit.
    ///
    /// # Errors
    /// As [`Queue::create_schedule`] (without `ScheduleExists`).
    pub fn upsert_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleInfo> {
        self.set_schedule(name, schedule, store::SetMode::Upsert)
    }

    fn set_schedule(
        &self,
        name: &str,
        schedule: &Schedule,
        mode: store::SetMode,
    ) -> Result<ScheduleInfo> {
        self.ensure_open()?;
        let now_ms = self.now_ms();
        let new = store::build_schedule(&self.config, now_ms, name, schedule)?;
        let queue_number = self.config.schema.queue_number;
        self.run(&mut |ctx| {
            if self.is_closed() {
                return refuse(crate::error::Error::Closed);
            }
            store::set_schedule(ctx, queue_number, &new, mode, now_ms)
        })
    }

    /// Removes schedule `name` of this queue; whether it existed. An instance it enqueued
    /// stays and runs as any job (cancel it with [`Queue::cancel`]). One commit if it existed.
    ///
    /// # Errors
    /// `Closed`, `Reentrant`, `CommitFailed` or `Storage`.
    pub fn remove_schedule(&self, name: &str) -> Result<bool> {
        self.ensure_open()?;
        let queue_number = self.config.schema.queue_number;
        self.run(&mut |ctx| store::remove_schedule(ctx, queue_number, name).map(Ok))
    }

    /// Pauses schedule `name` of this queue: it fires nothing until
    /// [`Queue::resume_schedule`], and has no next due time meanwhile (an instance it
    /// enqueued runs on). Kept across reopens, and by an update or upsert of the schedule
    /// (an app that upserts its schedules at every start does not resume them), as Oban's
    /// DynamicCron `paused` and Sidekiq-Cron's disable. Returns whether it was running. One
    /// commit when it was.
    ///
    /// # Errors
    /// `ScheduleNotFound` if this queue has no schedule of that name; `Corrupted` if its row
    /// fails its checks (nothing written); `Closed`, `Reentrant`, `CommitFailed` or
    /// `Storage`.
    pub fn pause_schedule(&self, name: &str) -> Result<bool> {
        self.ensure_open()?;
        let now_ms = self.now_ms();
        let queue_number = self.config.schema.queue_number;
        self.run(&mut |ctx| store::pause_schedule(ctx, queue_number, name, now_ms))
    }

    /// Resumes paused schedule `name` of this queue: it is due again at its first due time
    /// from now on, as a new schedule of its timing would be (an interval at its next
    /// multiple from its start, a cron expression at its first match strictly after now:
    /// resumed at the very millisecond of a match, at the one after). The due times that
    /// passed while it was paused are neither made up nor counted as skipped, whatever its
    /// [`Missed`](crate::Missed) policy. Returns whether it was paused. One commit when it
    /// was.
    ///
    /// # Errors
    /// As [`Queue::pause_schedule`]; and `InvalidOption`, nothing written, for a cron
    /// schedule in a build without the `cron` feature (it stays paused).
    pub fn resume_schedule(&self, name: &str) -> Result<bool> {
        self.ensure_open()?;
        let now_ms = self.now_ms();
        let queue_number = self.config.schema.queue_number;
        self.run(&mut |ctx| store::resume_schedule(ctx, queue_number, name, now_ms))
    }

    /// Enqueues one instance of schedule `name` of this queue now, as Hangfire's
    /// `RecurringJob.TriggerJob` and Sidekiq-Cron's "enqueue now": ready at once, made of the
    /// schedule's template, whatever its next due time, its overlap policy or a pause say (a
    /// paused schedule stays paused). It becomes the schedule's last instance, so a due time
    /// that comes while it is pending is skipped (under either [`Overlap`](crate::Overlap)
    /// policy), and one that comes while it runs under [`Overlap::Skip`](crate::Overlap::Skip);
    /// it counts in `fired`; the next due time does not move. Returns the job's id. One
    /// commit.
    ///
    /// # Errors
    /// As [`Queue::pause_schedule`]; `QueueFull` or `StorageFull` (nothing written) when the
    /// queue's size limit or the file's disk reserve refuses the instance.
    pub fn trigger_schedule(&self, name: &str) -> Result<JobId> {
        self.ensure_open()?;
        let now_ms = self.now_ms();
        let schema = self.config.schema;
        self.run(&mut |ctx| {
            if self.is_closed() {
                return refuse(crate::error::Error::Closed);
            }
            store::trigger_schedule(ctx, schema, name, now_ms)
        })
    }

    /// This queue's schedules, by name, at most [`SCHEDULES_MAX`](crate::SCHEDULES_MAX), each
    /// with its next due time. A read; a row that fails its checks is left out
    /// ([`Queue::check`] reports it).
    ///
    /// # Errors
    /// `Storage`.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.reader().schedules()
    }

    /// Schedule `name` of this queue, if it exists. A read.
    ///
    /// # Errors
    /// `Corrupted` if its row fails its checks; `Storage`.
    pub fn schedule(&self, name: &str) -> Result<Option<ScheduleInfo>> {
        self.reader().schedule(name)
    }
}
