//! Periodic jobs: named schedules stored in the file, each enqueueing a job (an *instance*)
//! at its due times, as River's periodic jobs, Oban's Cron plugin and BullMQ's job
//! schedulers do.
//!
//! A schedule belongs to one queue of the file and is made of a [`Timing`] (a fixed interval,
//! or a cron expression in an IANA time zone), the payload and options of its instances, and
//! two policies: [`Overlap`] (a due time that comes while the last instance still runs) and
//! [`Missed`] (due times that passed while the file was closed). See
//! [`Queue::create_schedule`](crate::Queue::create_schedule) for the calls.
//!
//! `timing.rs` computes due times; `handle.rs` holds the `Queue` calls; the engine's side is
//! `store/schedule.rs`, the stored row `format/schedule.rs`.

use std::time::Duration;

use crate::job::{EnqueueOptions, JobId};

pub(crate) mod timing;

/// When a schedule is due, as [`ScheduleInfo`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timing {
    /// Due at `start_ms + k * every_ms` (Unix ms) for k = 0, 1, 2, ...: due times come from
    /// the start, never from when a run ended, so a schedule does not drift.
    Interval {
        /// The interval, in ms (at least 1, at most [`DELAY_MAX`](crate::DELAY_MAX)).
        every_ms: u64,
        /// The first due time, in Unix ms.
        start_ms: u64,
    },
    /// Due at each match of a cron expression, read on the wall clock of an IANA time zone.
    Cron {
        /// The expression: 5 fields (minute, hour, day of month, month, day of week), 6 with
        /// seconds first, or 7 with a year last (a schedule whose years have passed is then
        /// left with no due time); `L`, `#`, `W` and the aliases `@hourly`, `@daily`, `@weekly`,
        /// `@monthly`, `@yearly` are understood (the `croner` crate's dialect).
        expression: String,
        /// The time zone's IANA name, e.g. `"Europe/Berlin"` or `"UTC"`.
        time_zone: String,
    },
}

/// What a schedule does at a due time while its last instance is still running (leased).
/// Whatever the choice, a due time that finds the last instance *pending* (ready or
/// scheduled, a retry waiting for its backoff included) enqueues nothing. This is a rule of
/// each due time, about the last instance: with `Enqueue`, an earlier instance that was
/// running can come back (a nack, a lease returned at reopen, a requeue of a dead one) while
/// the last one waits, and then two are pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Enqueue nothing for this due time (River's and Oban's default, BullMQ's only way).
    /// This holds even when no dequeue looked at the due time until the instance ended (a
    /// single consumer busy running it): the file records when the last instance ended
    /// (acked, died, cancelled or removed), and a due time that came before that end is
    /// skipped; the next instance comes at the first due time at or after the end.
    #[default]
    Skip,
    /// Enqueue one more instance, ready at once: another consumer may run it while the
    /// first one still runs (a consumer that should never run two at once uses `Skip`; a
    /// schedule's instances cannot join an ordered group). A due time that passed while the
    /// instance ran fires at the next dequeue, even once it ended.
    Enqueue,
}

/// What a schedule does with due times that passed while the file was closed (the app was
/// not running, or crashed): decided when the file opens, before the first dequeue. A due
/// time at the very millisecond of the open has not passed: it is due now and fires as it
/// would at a dequeue, under either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// One instance for all of them, enqueued by the open, then the next due time after now
    /// (a daily clean-up runs once after a week offline, not seven times).
    #[default]
    RunOnce,
    /// None: the schedule goes on from the next due time after now.
    Skip,
}

/// A schedule's definition, for [`Queue::create_schedule`](crate::Queue::create_schedule),
/// [`Queue::update_schedule`](crate::Queue::update_schedule) and
/// [`Queue::upsert_schedule`](crate::Queue::upsert_schedule). Nothing is checked until one
/// of those calls.
///
/// ```
/// use leaseq::{EnqueueOptions, Missed, Overlap, Schedule};
/// use std::time::Duration;
///
/// let nightly = Schedule::cron("0 3 * * *", "Europe/Berlin")
///     .payload(b"vacuum".to_vec())
///     .missed(Missed::Skip);
/// let sync = Schedule::every(Duration::from_secs(15 * 60))
///     .payload(b"sync".to_vec())
///     .options(EnqueueOptions::default().priority(-1).max_attempts(3))
///     .overlap(Overlap::Skip);
/// # let _ = (nightly, sync);
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    pub(crate) every: Option<Duration>,
    pub(crate) start_ms: Option<u64>,
    pub(crate) cron: Option<(String, String)>,
    pub(crate) payload: Vec<u8>,
    pub(crate) options: EnqueueOptions,
    pub(crate) overlap: Overlap,
    pub(crate) missed: Missed,
}

impl Schedule {
    fn new(every: Option<Duration>, cron: Option<(String, String)>) -> Schedule {
        Schedule {
            every,
            start_ms: None,
            cron,
            payload: Vec::new(),
            options: EnqueueOptions::default(),
            overlap: Overlap::default(),
            missed: Missed::default(),
        }
    }

    /// Due every `every` (whole ms: 1 ms to [`DELAY_MAX`](crate::DELAY_MAX)), first one
    /// interval after the schedule is created (or at
    /// [`starting_at_ms`](Schedule::starting_at_ms)), as BullMQ's `every` and River's
    /// `PeriodicInterval`.
    pub fn every(every: Duration) -> Schedule {
        Schedule::new(Some(every), None)
    }

    /// Due at each match of `expression` on the wall clock of `time_zone`, an IANA name (see
    /// [`Timing::Cron`]), first at the first match strictly after the schedule is created (one
    /// created at the very millisecond of a match waits for the next, as BullMQ's
    /// repeatable jobs and a crontab entry do). The zone database is built into leaseq (the `chrono-tz` crate), so
    /// the due times are the same on every platform. Daylight saving time follows croner: a
    /// time skipped by a spring-forward gap runs at the first instant after the gap; a
    /// fixed time of day repeated by a fall-back (`30 1 * * *`) runs once, while an
    /// expression that matches every few minutes (`*/30 * * * *`) matches in both passes of
    /// the repeated hour.
    ///
    /// Needs the `cron` feature (on by default): without it,
    /// [`Queue::create_schedule`](crate::Queue::create_schedule) refuses a cron schedule with
    /// `InvalidOption` naming `cron`, and a cron schedule already in a file is kept as it is,
    /// never fired, for a build with the feature.
    pub fn cron(expression: impl Into<String>, time_zone: impl Into<String>) -> Schedule {
        Schedule::new(None, Some((expression.into(), time_zone.into())))
    }

    /// An interval schedule's first due time, in Unix ms (default: one interval after it is
    /// created). A start in the past counts on from it: the first due time is the first of
    /// `start_ms + k * every` not before now. Refused (`InvalidOption`) on a cron schedule,
    /// and more than [`DELAY_MAX`](crate::DELAY_MAX) from now.
    pub fn starting_at_ms(mut self, start_ms: u64) -> Schedule {
        self.start_ms = Some(start_ms);
        self
    }

    /// The payload of every instance (at most
    /// [`SCHEDULE_PAYLOAD_BYTES_MAX`](crate::SCHEDULE_PAYLOAD_BYTES_MAX) bytes, and within the
    /// handle's [`Builder::payload_bytes_max`](crate::Builder::payload_bytes_max)). Empty by
    /// default.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Schedule {
        self.payload = payload.into();
        self
    }

    /// The options of every instance: priority, max attempts, lease, retry policy and
    /// encoding. A delay, dedup key, idempotency key or [`group`](EnqueueOptions::group) is
    /// refused (`InvalidOption`): the schedule says when its jobs run and skips a due time
    /// while its last one is pending, and an instance's idempotency key is its own id (one
    /// effect per due time). So is an execution [`timeout`](EnqueueOptions::timeout): the
    /// schedule does not keep one; a pool's
    /// [`job_timeout`](crate::worker::PoolBuilder::job_timeout) times its instances.
    pub fn options(mut self, options: EnqueueOptions) -> Schedule {
        self.options = options;
        self
    }

    /// What a due time does while the last instance runs (default [`Overlap::Skip`]).
    pub fn overlap(mut self, overlap: Overlap) -> Schedule {
        self.overlap = overlap;
        self
    }

    /// What due times missed while the file was closed do (default [`Missed::RunOnce`]).
    pub fn missed(mut self, missed: Missed) -> Schedule {
        self.missed = missed;
        self
    }
}

/// A schedule as stored, from [`Queue::schedules`](crate::Queue::schedules) and
/// [`Queue::schedule`](crate::Queue::schedule).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name, unique within its queue.
    pub name: String,
    /// When it is due.
    pub timing: Timing,
    /// Its next due time (Unix ms); `None` when it has none left (a cron expression with no
    /// match ahead) or while it is paused.
    pub next_due_ms: Option<u64>,
    /// The last job it enqueued, and the due time (Unix ms) that job was enqueued for (for
    /// one [`Queue::trigger_schedule`](crate::Queue::trigger_schedule) enqueued, when).
    pub last_job: Option<(JobId, u64)>,
    /// Jobs it enqueued.
    pub fired: u64,
    /// Decisions that enqueued nothing: an instance was pending, or running under
    /// [`Overlap::Skip`], or the time was missed while the file was closed under
    /// [`Missed::Skip`]. Due times that passed together (no dequeue in between) make one
    /// decision and count once, as in `fired`.
    pub skipped: u64,
    /// Its overlap policy.
    pub overlap: Overlap,
    /// Its policy for missed due times.
    pub missed: Missed,
    /// Its instances' priority.
    pub priority: i32,
    /// Its instances' payload size, in bytes.
    pub payload_bytes: usize,
    /// When it was created (Unix ms).
    pub created_ms: u64,
    /// When it was last changed by a create, update or upsert (Unix ms).
    pub updated_ms: u64,
    /// When it was paused ([`Queue::pause_schedule`](crate::Queue::pause_schedule), Unix
    /// ms), while it is; `next_due_ms` is then `None`.
    pub paused_ms: Option<u64>,
}
