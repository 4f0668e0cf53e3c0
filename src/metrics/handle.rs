//! The `Queue` call that reads the metrics.

use redb::ReadableDatabase;

use crate::error::{Result, catch_engine_panic};
use crate::metrics::MinuteCounts;
use crate::queue::Queue;
use crate::store;

impl Queue {
    /// What this queue did per minute since `since_ms` (Unix ms; the minute holding it
    /// included), oldest first: one [`MinuteCounts`] per minute in which anything was
    /// counted, at most [`METRICS_MINUTES_KEPT`](crate::METRICS_MINUTES_KEPT): each commit that
    /// counts in a queue removes up to 8 of its minutes (of each kind) older than 24 hours, so
    /// a busy queue keeps about its last day, and a queue nothing happens in keeps its last
    /// minutes until something does (`since_ms` leaves them out). A read,
    /// as BullMQ's `getMetrics`. Counted by the commit that made each change, so a crash
    /// loses none and counts none that did not commit. Minutes are by the queue's
    /// [`Clock`](crate::Clock).
    ///
    /// # Errors
    /// `Storage`.
    pub fn metrics(&self, since_ms: u64) -> Result<Vec<MinuteCounts>> {
        catch_engine_panic(|| {
            store::metrics_of(
                &self.inner.db.get().begin_read()?,
                self.config.tables.queue_number,
                since_ms,
            )
        })
    }
}
