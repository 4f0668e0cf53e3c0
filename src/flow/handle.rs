//! The `Queue` calls of rate limits.

use redb::ReadableDatabase;

use crate::error::{Result, catch_engine_panic};
use crate::flow::RateLimit;
use crate::queue::Queue;
use crate::store;

impl Queue {
    /// Sets this queue's rate limit (`None` removes it): at most `limit.max` deliveries per
    /// window of `limit.per_ms`, over all of its consumers, as BullMQ's limiter. Returns
    /// whether the setting changed. Stored in the file with the queue: every handle and
    /// every later open keeps it, and the `leaseq` tool's `stats` shows it. One commit.
    ///
    /// - **What counts.** Each job a dequeue hands out (a batch dequeue takes at most what
    ///   the window has left; an `ack_and_next` takes its next job only if the window
    ///   allows). Retries and redeliveries count as deliveries, and so does a lease given
    ///   back unseen (an async dequeue's dropped future, a pool's job taken as it stopped);
    ///   acks, enqueues and the leases already held do not.
    /// - **Waiting consumers sleep until the next window.** A
    ///   [`dequeue_timeout`](Queue::dequeue_timeout), a
    ///   [`WorkerPool`](crate::worker::WorkerPool)'s workers and the async face wait for the
    ///   window's end (or new work, or a stop) with no polling; [`Queue::dequeue`] returns
    ///   `None` at once.
    /// - **The window is stored**, in the dequeue's own commit: a restart neither forgets the
    ///   deliveries made in it nor grants a fresh burst. Setting a different limit starts a
    ///   fresh window; setting the same one again keeps it.
    /// - While the window is used up, nothing else a dequeue does happens either: due
    ///   schedules fire, delayed jobs become ready and expired leases come back at the
    ///   window's end.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::RateLimit;
    /// use std::time::Duration;
    ///
    /// // An API that allows 10 calls a second.
    /// queue.set_rate_limit(Some(RateLimit::new(10, Duration::from_secs(1))))?;
    /// for i in 0..12u8 {
    ///     queue.enqueue(&[i], Default::default())?;
    /// }
    /// assert_eq!(queue.dequeue_batch(100)?.len(), 10);
    /// assert!(queue.dequeue()?.is_none(), "the window is used up");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` (field `rate_limit`) for a `max` of 0 (pause the queue instead) or a
    /// window of 0 ms or above `DELAY_MAX`, with nothing written; `Reentrant`,
    /// `CommitFailed` or `Storage`.
    pub fn set_rate_limit(&self, limit: Option<RateLimit>) -> Result<bool> {
        if let Some(l) = &limit {
            store::validate_rate_limit(l)?;
        }
        let queue_number = self.config.tables.queue_number;
        self.run(&mut |ctx| store::set_rate_limit(ctx, queue_number, limit).map(Ok))
    }

    /// This queue's rate limit ([`Queue::set_rate_limit`]), if it has one. A read.
    ///
    /// # Errors
    /// `Storage`.
    pub fn rate_limit(&self) -> Result<Option<RateLimit>> {
        catch_engine_panic(|| {
            store::rate_limit_of(
                &self.inner.db.get().begin_read()?,
                self.config.tables.queue_number,
            )
        })
    }
}
