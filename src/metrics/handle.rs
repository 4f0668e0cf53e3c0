//! The `Queue` call that reads the metrics.

use redb::ReadableDatabase;

use crate::error::{Result, catch_engine_panic};
use crate::metrics::MinuteCounts;
use crate::queue::Queue;
use crate::store;

impl Queue {
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
        let queue_number = self.config.tables.queue_number;
        let mut stored = catch_engine_panic(|| {
            store::metrics_of(&self.inner.db.get().begin_read()?, queue_number, since_ms)
        })?;
        // This process's counts not written yet (at most a second's).
        let first_minute = since_ms / 60_000;
        for (q, kind, minute, n) in self.inner.pending_metrics() {
            if q != queue_number || minute < first_minute {
                continue;
            }
            let at = stored.partition_point(|c| c.minute_ms / 60_000 < minute);
            if stored
                .get(at)
                .is_none_or(|c| c.minute_ms / 60_000 != minute)
            {
                stored.insert(
                    at,
                    MinuteCounts {
                        minute_ms: minute.saturating_mul(60_000),
                        ..MinuteCounts::default()
                    },
                );
            }
            if let Some(slot) = stored[at].slot(usize::from(kind)) {
                *slot = slot.saturating_add(n);
            }
        }
        Ok(stored)
    }
}
