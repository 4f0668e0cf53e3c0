//! The async forms of the calls that change jobs, a queue's settings and its schedules:
//! each runs the blocking call on a helper thread, which finishes it (its commit lands, or
//! not) even if the future was dropped, as [`AsyncQueue::enqueue`]'s.

use std::time::Duration;

use super::AsyncQueue;
use crate::error::Result;
use crate::job::{History, JobId, JobState, Pruned};
use crate::queue_limit::QueueLimit;
use crate::rate_limit::RateLimit;
use crate::schedule::{Schedule, ScheduleInfo};

/// Per-job and bulk administration.
impl AsyncQueue {
    /// The async form of [`Queue::cancel`](crate::Queue::cancel): cancels job `id` with
    /// `reason` (kept up to [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes) in one
    /// commit on a helper; returns what it did ([`CancelOutcome`](crate::CancelOutcome)).
    ///
    /// # Errors
    /// As [`Queue::cancel`](crate::Queue::cancel).
    pub async fn cancel(&self, id: JobId, reason: &str) -> Result<crate::job::CancelOutcome> {
        let reason = reason.to_string();
        self.on_helper(move |q| q.cancel(id, &reason)).await
    }

    /// The async form of [`Queue::retry`](crate::Queue::retry): a dead, completed or
    /// cancelled job ready again, attempts reset, in one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::retry`](crate::Queue::retry).
    pub async fn retry(&self, id: JobId) -> Result<()> {
        self.on_helper(move |q| q.retry(id)).await
    }

    /// The async form of [`Queue::promote`](crate::Queue::promote): a scheduled job ready
    /// now, in one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::promote`](crate::Queue::promote).
    pub async fn promote(&self, id: JobId) -> Result<()> {
        self.on_helper(move |q| q.promote(id)).await
    }

    /// The async form of [`Queue::reschedule`](crate::Queue::reschedule): a ready or
    /// scheduled job due `delay` from now (whole ms), in one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::reschedule`](crate::Queue::reschedule).
    pub async fn reschedule(&self, id: JobId, delay: Duration) -> Result<()> {
        self.on_helper(move |q| q.reschedule(id, delay)).await
    }

    /// The async form of [`Queue::set_priority`](crate::Queue::set_priority) (lower is
    /// served first), in one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::set_priority`](crate::Queue::set_priority).
    pub async fn set_priority(&self, id: JobId, priority: i32) -> Result<()> {
        self.on_helper(move |q| q.set_priority(id, priority)).await
    }

    /// The async form of [`Queue::update_payload`](crate::Queue::update_payload): `payload`
    /// (raw bytes, copied) replaces the job's, in one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::update_payload`](crate::Queue::update_payload).
    pub async fn update_payload(&self, id: JobId, payload: &[u8]) -> Result<()> {
        let payload = payload.to_vec();
        self.on_helper(move |q| q.update_payload(id, &payload))
            .await
    }

    /// The async form of [`Queue::release_dedup_key`](crate::Queue::release_dedup_key)
    /// (`key` copied): the job that held the key, if any; one commit on a helper when a key
    /// was held.
    ///
    /// # Errors
    /// As [`Queue::release_dedup_key`](crate::Queue::release_dedup_key).
    pub async fn release_dedup_key(&self, key: impl AsRef<[u8]>) -> Result<Option<JobId>> {
        let key = key.as_ref().to_vec();
        self.on_helper(move |q| q.release_dedup_key(&key)).await
    }

    /// The async form of [`Queue::requeue_dead`](crate::Queue::requeue_dead), in one commit
    /// on a helper.
    ///
    /// # Errors
    /// As [`Queue::requeue_dead`](crate::Queue::requeue_dead).
    pub async fn requeue_dead(&self, id: JobId) -> Result<()> {
        self.on_helper(move |q| q.requeue_dead(id)).await
    }

    /// The async form of [`Queue::requeue_dead_all`](crate::Queue::requeue_dead_all): how
    /// many dead jobs went back to ready, in commits of up to
    /// [`BATCH_MAX`](crate::BATCH_MAX) on a helper. Dropped, it still runs to its end there.
    ///
    /// # Errors
    /// As [`Queue::requeue_dead_all`](crate::Queue::requeue_dead_all).
    pub async fn requeue_dead_all(&self) -> Result<u64> {
        self.on_helper(|q| q.requeue_dead_all()).await
    }

    /// The async form of [`Queue::purge`](crate::Queue::purge): how many jobs in `state` were
    /// deleted, in commits of up to [`BATCH_MAX`](crate::BATCH_MAX) on a helper. Dropped, it
    /// still runs to its end there.
    ///
    /// # Errors
    /// As [`Queue::purge`](crate::Queue::purge).
    pub async fn purge(&self, state: JobState) -> Result<u64> {
        self.on_helper(move |q| q.purge(state)).await
    }

    /// The async form of [`Queue::remove`](crate::Queue::remove): deletes a job that is not
    /// leased (or a quarantined row), in one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::remove`](crate::Queue::remove).
    pub async fn remove(&self, id: JobId) -> Result<()> {
        self.on_helper(move |q| q.remove(id)).await
    }

    /// The async form of [`Queue::prune`](crate::Queue::prune): what it removed, in commits
    /// of up to [`BATCH_MAX`](crate::BATCH_MAX) on a helper. Dropped, it still runs to its
    /// end there.
    ///
    /// # Errors
    /// As [`Queue::prune`](crate::Queue::prune).
    pub async fn prune(&self) -> Result<Pruned> {
        self.on_helper(|q| q.prune()).await
    }
}

/// The queue's stored settings: pause, history, rate and size limits.
impl AsyncQueue {
    /// The async form of [`Queue::pause`](crate::Queue::pause): whether the queue was
    /// running; one commit on a helper. Once the future answered, no dequeue of the queue
    /// delivers.
    ///
    /// # Errors
    /// As [`Queue::pause`](crate::Queue::pause).
    pub async fn pause(&self) -> Result<bool> {
        self.on_helper(|q| q.pause()).await
    }

    /// The async form of [`Queue::resume`](crate::Queue::resume): whether the queue was
    /// paused; one commit on a helper, then its waiting consumers (tasks too) wake.
    ///
    /// # Errors
    /// As [`Queue::resume`](crate::Queue::resume).
    pub async fn resume(&self) -> Result<bool> {
        self.on_helper(|q| q.resume()).await
    }

    /// [`Queue::is_paused`](crate::Queue::is_paused): read from memory, no I/O.
    pub fn is_paused(&self) -> bool {
        self.queue.is_paused()
    }

    /// [`Queue::events`](crate::Queue::events): a subscription, made in memory (no I/O); an
    /// [`Events`](crate::Events) is a `Stream` for async code.
    ///
    /// # Errors
    /// As [`Queue::events`](crate::Queue::events).
    pub fn events(&self) -> Result<crate::events::Events> {
        self.queue.events()
    }

    /// [`Queue::events_with_capacity`](crate::Queue::events_with_capacity): a subscription
    /// holding up to `capacity` unread events, made in memory.
    ///
    /// # Errors
    /// As [`Queue::events_with_capacity`](crate::Queue::events_with_capacity).
    pub fn events_with_capacity(&self, capacity: usize) -> Result<crate::events::Events> {
        self.queue.events_with_capacity(capacity)
    }

    /// The async form of [`Queue::set_history`](crate::Queue::set_history): whether the
    /// setting changed; one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::set_history`](crate::Queue::set_history).
    pub async fn set_history(&self, history: History) -> Result<bool> {
        self.on_helper(move |q| q.set_history(history)).await
    }

    /// The async form of [`Queue::set_rate_limit`](crate::Queue::set_rate_limit) (`None`
    /// removes it): whether the setting changed; one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::set_rate_limit`](crate::Queue::set_rate_limit).
    pub async fn set_rate_limit(&self, limit: Option<RateLimit>) -> Result<bool> {
        self.on_helper(move |q| q.set_rate_limit(limit)).await
    }

    /// The async form of [`Queue::set_limit`](crate::Queue::set_limit) (`None` removes it):
    /// whether the setting changed; one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::set_limit`](crate::Queue::set_limit).
    pub async fn set_limit(&self, limit: Option<QueueLimit>) -> Result<bool> {
        self.on_helper(move |q| q.set_limit(limit)).await
    }
}

/// Periodic jobs.
impl AsyncQueue {
    /// The async form of [`Queue::create_schedule`](crate::Queue::create_schedule)
    /// (`schedule` copied): the schedule as stored; one commit on a helper.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use leaseq::{Queue, Schedule};
    /// use std::time::Duration;
    ///
    /// let queue = Queue::open(dir.path().join("app.leaseq"))?.to_async();
    /// let every_minute = Schedule::every(Duration::from_secs(60)).payload(b"sync".to_vec());
    /// queue.upsert_schedule("sync", &every_minute).await?;
    /// assert!(queue.pause_schedule("sync").await?);
    /// assert_eq!(queue.schedule("sync").await?.map(|s| s.paused_ms.is_some()), Some(true));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Queue::create_schedule`](crate::Queue::create_schedule).
    pub async fn create_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleInfo> {
        let (name, schedule) = (name.to_string(), schedule.clone());
        self.on_helper(move |q| q.create_schedule(&name, &schedule))
            .await
    }

    /// The async form of [`Queue::update_schedule`](crate::Queue::update_schedule)
    /// (`schedule` copied): the schedule as stored; one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::update_schedule`](crate::Queue::update_schedule).
    pub async fn update_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleInfo> {
        let (name, schedule) = (name.to_string(), schedule.clone());
        self.on_helper(move |q| q.update_schedule(&name, &schedule))
            .await
    }

    /// The async form of [`Queue::upsert_schedule`](crate::Queue::upsert_schedule)
    /// (`schedule` copied): the schedule as stored; one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::upsert_schedule`](crate::Queue::upsert_schedule).
    pub async fn upsert_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleInfo> {
        let (name, schedule) = (name.to_string(), schedule.clone());
        self.on_helper(move |q| q.upsert_schedule(&name, &schedule))
            .await
    }

    /// The async form of [`Queue::remove_schedule`](crate::Queue::remove_schedule): whether
    /// it existed; one commit on a helper if it did.
    ///
    /// # Errors
    /// As [`Queue::remove_schedule`](crate::Queue::remove_schedule).
    pub async fn remove_schedule(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.on_helper(move |q| q.remove_schedule(&name)).await
    }

    /// The async form of [`Queue::pause_schedule`](crate::Queue::pause_schedule): whether it
    /// was running; one commit on a helper if it was.
    ///
    /// # Errors
    /// As [`Queue::pause_schedule`](crate::Queue::pause_schedule).
    pub async fn pause_schedule(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.on_helper(move |q| q.pause_schedule(&name)).await
    }

    /// The async form of [`Queue::resume_schedule`](crate::Queue::resume_schedule): whether
    /// it was paused; one commit on a helper if it was.
    ///
    /// # Errors
    /// As [`Queue::resume_schedule`](crate::Queue::resume_schedule).
    pub async fn resume_schedule(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.on_helper(move |q| q.resume_schedule(&name)).await
    }

    /// The async form of [`Queue::trigger_schedule`](crate::Queue::trigger_schedule): the id
    /// of the instance enqueued now; one commit on a helper.
    ///
    /// # Errors
    /// As [`Queue::trigger_schedule`](crate::Queue::trigger_schedule).
    pub async fn trigger_schedule(&self, name: &str) -> Result<JobId> {
        let name = name.to_string();
        self.on_helper(move |q| q.trigger_schedule(&name)).await
    }
}
