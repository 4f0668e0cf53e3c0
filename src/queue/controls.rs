//! Settings of a queue stored in the file (pause, history) and its change events.

use super::Queue;
use crate::error::{Error, Result};
use crate::queue_limit::QueueLimit;
use crate::rate_limit::RateLimit;
use crate::store;

impl Queue {
    /// Pauses this queue, as BullMQ's `queue.pause()`, Oban's `pause_queue` and River's
    /// `QueuePause`: for an app gone offline, whose sync jobs would only fail (and use up their
    /// attempts) until it is back. The pause is stored in the file (a reopen finds the queue
    /// paused) until [`Queue::resume`]. A paused queue delivers nothing: [`Queue::dequeue`]
    /// and [`Queue::dequeue_batch`] return nothing at once; [`Queue::dequeue_timeout`] and
    /// [`Queue::dequeue_until`] wait for a resume (or their timeout or stop);
    /// [`Lease::ack_and_next`](crate::Lease::ack_and_next) and [`Lease::ack_with_and_next`](crate::Lease::ack_with_and_next) ack and take nothing; a
    /// [`WorkerPool`](crate::worker::WorkerPool) idles, and a relay takes nothing new (jobs it
    /// already leased still go out).
    ///
    /// Everything else goes on: enqueues, every call on a lease already held (a lease can
    /// still run out: the first dequeue after the resume takes it back, as usual), the reads,
    /// maintenance. Only this queue is paused; the file's other queues keep running. A call
    /// racing the pause from another thread may still deliver; none does once `pause`
    /// returned. Returns whether the queue was running (pausing a paused queue changes
    /// nothing). One commit, even after [`Queue::close`].
    ///
    /// Delays still run out: a scheduled job (a delay, a retry's backoff) that comes due
    /// while paused is moved to ready, not delivered, by the queue's next dequeue (which
    /// still returns nothing; one commit when something is due) or by a consumer waiting on
    /// the queue, which wakes at the next due time for it (as BullMQ's `moveToActive`
    /// script moves due delayed jobs to a paused queue's list before it takes nothing). So
    /// [`Queue::stats`], [`Queue::job`], a [`Reader`](crate::Reader), the tool and the
    /// dashboard count due work as ready, and the resume delivers it in its order. As in a
    /// running queue, a due job reads as scheduled until some consumer looks (its
    /// `run_at_ms` says when it is due). Nothing else of a dequeue's sweep runs while
    /// paused: due schedules fire and expired leases come back at the first dequeue after
    /// the resume.
    ///
    /// # Errors
    /// `Reentrant` from inside an `ack_with` closure; `CommitFailed` or `Storage`.
    pub fn pause(&self) -> Result<bool> {
        let (queue_number, now_ms) = (self.config.schema.queue_number, self.now_ms());
        let _in_commit_order = self.inner.pausing.lock();
        let paused = self.run(&mut |ctx| store::pause(ctx, queue_number, now_ms).map(Ok))?;
        self.inner.paused.write().insert(queue_number);
        if paused {
            tracing::info!(queue = queue_number, "leaseq: queue paused");
        }
        Ok(paused)
    }

    /// Resumes a paused queue ([`Queue::pause`]): its blocked consumers wake at once and
    /// deliveries go on where they stopped (jobs due meanwhile are served in their order).
    /// Returns whether the queue was paused. One commit.
    ///
    /// # Errors
    /// `Reentrant` from inside an `ack_with` closure; `CommitFailed` or `Storage`.
    pub fn resume(&self) -> Result<bool> {
        let queue_number = self.config.schema.queue_number;
        let _in_commit_order = self.inner.pausing.lock();
        let resumed = self.run(&mut |ctx| store::resume(ctx, queue_number).map(Ok))?;
        self.inner.paused.write().remove(&queue_number);
        // After the flag: a consumer woken here finds the queue running.
        self.inner.committer.work().notify(queue_number);
        if resumed {
            tracing::info!(queue = queue_number, "leaseq: queue resumed");
        }
        Ok(resumed)
    }

    /// Subscribes to this queue's change events ([`Event`](crate::Event)): what each commit
    /// did (jobs enqueued, completed, retried, snoozed, dead, cancelled, requeued; the queue
    /// paused, resumed, drained), published after the commit, for a UI's live counts and
    /// lists without polling (as BullMQ's `QueueEvents`). Holds up to
    /// [`EVENTS_CAPACITY_DEFAULT`](crate::EVENTS_CAPACITY_DEFAULT) unread events, then counts
    /// the ones it drops ([`Events::missed`](crate::Events::missed)). Events before the call
    /// are not replayed: subscribe, read [`Queue::stats`] once, then follow the events (a
    /// call that started before `events` returned, on another thread, may be missing from
    /// both: subscribe before the app's work starts, or read the stats again when in doubt).
    /// An event is published before its call returns. Recording costs nothing while no one
    /// subscribes.
    ///
    /// Not evented (read the stats after them): `remove`, `purge`, `prune` and the history's
    /// retention, quarantine, `promote`, `reschedule`, `set_priority`, `update_payload`, and
    /// a duplicate that replaced or debounced a waiting job.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::Event;
    ///
    /// let events = queue.events()?;
    /// let id = queue.enqueue(b"x", Default::default())?.id();
    /// queue.dequeue()?.expect("a job").ack()?;
    /// assert_eq!(events.try_recv(), Some(Event::Enqueued { id }));
    /// assert_eq!(events.try_recv(), Some(Event::Completed { id }));
    /// assert_eq!(events.try_recv(), Some(Event::Drained));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` when [`SUBSCRIBERS_MAX`](crate::SUBSCRIBERS_MAX) subscriptions of the
    /// file are alive.
    pub fn events(&self) -> Result<crate::events::Events> {
        self.events_with_capacity(crate::limits::EVENTS_CAPACITY_DEFAULT)
    }

    /// [`Queue::events`] holding up to `capacity` unread events (1 to
    /// [`EVENTS_CAPACITY_MAX`](crate::EVENTS_CAPACITY_MAX)).
    ///
    /// # Errors
    /// `InvalidOption` for a capacity out of range, or as [`Queue::events`].
    pub fn events_with_capacity(&self, capacity: usize) -> Result<crate::events::Events> {
        if !(1..=crate::limits::EVENTS_CAPACITY_MAX).contains(&capacity) {
            return Err(Error::invalid_option(
                "capacity",
                format!("1 to {} events", crate::limits::EVENTS_CAPACITY_MAX),
            ));
        }
        self.inner
            .committer
            .hub()
            .subscribe(self.config.schema.queue_number, capacity)
            .ok_or_else(|| {
                Error::invalid_option(
                    "events",
                    format!(
                        "{} subscriptions of this file are alive",
                        crate::limits::SUBSCRIBERS_MAX
                    ),
                )
            })
    }

    /// Whether this queue is paused ([`Queue::pause`]). No I/O: the file's pause state is kept
    /// in memory from the open on.
    pub fn is_paused(&self) -> bool {
        self.inner
            .paused
            .read()
            .contains(&self.config.schema.queue_number)
    }

    /// Sets what this queue keeps of its completed jobs: its completed history (see
    /// [`History`](crate::History)). Stored in the file, for this queue only (the file's other
    /// queues keep their own), so every handle and every later open keeps the same history,
    /// and the `leaseq` tool's writes never prune what the app keeps. Off by default: an ack
    /// deletes its job. Turning it off (or lowering a bound) lets the next operations delete
    /// what the new bound no longer keeps, a few per operation ([`Queue::prune`] does the rest
    /// at once). Returns whether the setting changed. One commit.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::{History, JobState};
    /// use std::time::Duration;
    ///
    /// queue.set_history(History::off().keep_jobs(1000).keep_for(Duration::from_secs(86_400)))?;
    /// let id = queue.enqueue(b"resize photo 7", Default::default())?.id();
    /// queue.dequeue()?.expect("a job").ack_with_result(b"640x480")?;
    /// let job = queue.job(id)?.expect("kept");
    /// assert_eq!(job.state, JobState::Completed);
    /// assert_eq!(job.result.as_deref(), Some(&b"640x480"[..]));
    /// assert_eq!(queue.stats()?.completed, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` for a `keep_jobs` of 0 or above
    /// [`HISTORY_JOBS_MAX`](crate::HISTORY_JOBS_MAX), or a `keep_for` of 0 or above
    /// [`DELAY_MAX`](crate::DELAY_MAX) (nothing written); `Reentrant`; `CommitFailed` or
    /// `Storage`.
    pub fn set_history(&self, history: crate::job::History) -> Result<bool> {
        store::validate_history(&history)?;
        let queue_number = self.config.schema.queue_number;
        self.run(&mut |ctx| store::set_history(ctx, queue_number, history).map(Ok))
    }

    /// What this queue keeps of its completed jobs ([`Queue::set_history`]).
    ///
    /// # Errors
    /// `Storage`.
    pub fn history(&self) -> Result<crate::job::History> {
        self.reader().history()
    }

    /// Sets this queue's rate limit (`None` removes it): at most `limit.max` deliveries per
    /// `limit.per_ms`, over all of its consumers, in a fixed window as BullMQ's limiter
    /// ([`RateLimit::new`]) or in any span ([`RateLimit::sliding`]). Returns whether the
    /// setting changed. Stored in the file with the queue: every handle and every later open
    /// keeps it, and the `leaseq` tool's `stats` shows it. One commit.
    ///
    /// - **Fixed or sliding.** A fixed window starts at the first delivery after the last
    ///   one ended, so up to `2 × max` deliveries can fall within one span of `per_ms`
    ///   across two windows. A server that enforces "N per second" over every second refuses
    ///   those: give it a sliding limit, which never lets more than `max` dequeues fall in
    ///   any span of `per_ms`. Each counts from its dequeue's commit, at that dequeue's clock
    ///   reading (never before a delivery already counted: with several threads, a reading a
    ///   few ms older than a commit that landed first is counted at that commit's time, so a
    ///   lease's `started_ms` can be those few ms earlier). What a worker does between its
    ///   dequeue and its call to the server (a thread's wake-up, a retry's own delay) passes
    ///   on to the server as it is: leave a margin, such as a window a little longer than
    ///   the server's.
    /// - **What counts.** Each job a dequeue hands out (a batch dequeue takes at most what
    ///   the window has left; an `ack_and_next` takes its next job only if the window
    ///   allows). Retries and redeliveries count as deliveries, and so does a lease given
    ///   back unseen (an async dequeue's dropped future, a pool's job taken as it stopped);
    ///   acks, enqueues and the leases already held do not.
    /// - **Waiting consumers sleep until a delivery may go**: the fixed window's end, or the
    ///   moment the oldest counted delivery leaves a sliding one. A
    ///   [`dequeue_timeout`](Queue::dequeue_timeout), a
    ///   [`WorkerPool`](crate::worker::WorkerPool)'s workers and the async face wait for it
    ///   (or new work, or a stop) with no polling; [`Queue::dequeue`] returns `None` at once.
    /// - **The window is stored**, in the dequeue's own commit: a restart neither forgets the
    ///   deliveries made in it nor grants a fresh burst. Setting the same limit again keeps
    ///   its window. A sliding limit changed to another sliding one keeps the deliveries it
    ///   counted (the newest `max` of them), so changing it never grants a burst. Every other
    ///   change starts afresh: a different fixed limit, a change of kind, or a limit set
    ///   where there was none (the deliveries made meanwhile were not counted).
    /// - **A clock that steps back** a whole window before the newest counted delivery (a
    ///   device whose clock was reset) starts the window afresh too, as the fixed window
    ///   does: what was counted says nothing about the new time. A smaller step back keeps
    ///   what was counted, and the window lasts that much longer.
    /// - While no delivery may go, nothing else a dequeue does happens either: due
    ///   schedules fire, delayed jobs become ready and expired leases come back once one
    ///   may.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::RateLimit;
    /// use std::time::Duration;
    ///
    /// // A server that refuses more than 10 calls in any second.
    /// queue.set_rate_limit(Some(RateLimit::sliding(10, Duration::from_secs(1))))?;
    /// for i in 0..12u8 {
    ///     queue.enqueue(&[i], Default::default())?;
    /// }
    /// assert_eq!(queue.dequeue_batch(100)?.len(), 10);
    /// assert!(queue.dequeue()?.is_none(), "10 in the last second");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` (field `rate_limit`) for a `max` of 0 (pause the queue instead), a
    /// window of 0 ms or above `DELAY_MAX`, or a sliding `max` above
    /// [`SLIDING_LIMIT_MAX`](crate::SLIDING_LIMIT_MAX), with nothing written; `Reentrant`,
    /// `CommitFailed` or `Storage`.
    pub fn set_rate_limit(&self, limit: Option<RateLimit>) -> Result<bool> {
        if let Some(l) = &limit {
            store::validate_rate_limit(l)?;
        }
        let queue_number = self.config.schema.queue_number;
        self.run(&mut |ctx| store::set_rate_limit(ctx, queue_number, limit).map(Ok))
    }

    /// Sets (or with `None` removes) this queue's size limit ([`QueueLimit`]): at most so
    /// many jobs (scheduled, ready and leased, what [`Queue::len`] counts) and so many bytes
    /// of payload, and what an enqueue that does not fit does ([`WhenFull`](crate::WhenFull): refuse, wait
    /// for room, or drop the oldest waiting jobs), as RabbitMQ's `x-max-length` and
    /// `x-overflow` or JetStream's `max_msgs` and `discard`. Returns whether the setting
    /// changed. Stored in the file with the queue: every handle and later open keeps it,
    /// and [`Queue::stats`] shows it with the payload bytes counted and the jobs dropped.
    /// One commit; setting a limit on a queue that had none counts its jobs' payload bytes
    /// in that commit (one pass over the queue's jobs).
    ///
    /// - **What it bounds.** Enqueues of every kind: [`Queue::enqueue`] and the batches, a
    ///   [`Tx::enqueue`](crate::Tx::enqueue) (the outbox) and [`Tx::enqueue_to`](crate::Tx::enqueue_to),
    ///   imports, and a schedule's instances (a due time that does not fit is skipped,
    ///   counted in [`ScheduleInfo::skipped`](crate::ScheduleInfo::skipped)). A job that
    ///   comes back (a nack, an expired lease, a retry or a requeue) always has its place.
    /// - **A batch fits whole or not at all**: its new jobs are counted (a duplicate of a
    ///   held dedup key adds none), and a refused batch adds nothing.
    /// - **Lowering a limit below what the queue holds** drops nothing: enqueues wait for
    ///   (or, dropping, make) room.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::{Error, QueueLimit, WhenFull};
    ///
    /// // Telemetry: keep the newest 3 readings.
    /// queue.set_limit(Some(QueueLimit::jobs(3).when_full(WhenFull::DropOldest)))?;
    /// for reading in 0..5u8 {
    ///     queue.enqueue(&[reading], Default::default())?;
    /// }
    /// assert_eq!(queue.dequeue()?.expect("a reading").payload(), &[2]);
    /// assert_eq!(queue.stats()?.dropped, 2);
    ///
    /// // Commands: refuse what does not fit.
    /// queue.set_limit(Some(QueueLimit::jobs(3)))?;
    /// assert!(matches!(queue.enqueue(b"x", Default::default()), Err(Error::QueueFull { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` (field `limit`) for a limit with no bound or a bound of 0, (field
    /// `when_full`) for a wait of 0 ms or above an hour, with nothing written; `Reentrant`,
    /// `CommitFailed` or `Storage`.
    pub fn set_limit(&self, limit: Option<QueueLimit>) -> Result<bool> {
        if let Some(l) = &limit {
            store::validate_limit(l)?;
        }
        let schema = self.config.schema;
        self.run(&mut |ctx| store::set_limit(ctx, schema, limit).map(Ok))
    }

    /// This queue's size limit ([`Queue::set_limit`]), if it has one. A read.
    ///
    /// # Errors
    /// `Storage`; `Corrupted` for a stored limit no build writes.
    pub fn limit(&self) -> Result<Option<QueueLimit>> {
        self.reader().limit()
    }

    /// This queue's rate limit ([`Queue::set_rate_limit`]), if it has one. A read.
    ///
    /// # Errors
    /// `Storage`.
    pub fn rate_limit(&self) -> Result<Option<RateLimit>> {
        self.reader().rate_limit()
    }
}
