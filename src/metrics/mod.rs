//! Per-minute metrics of each queue: how many jobs were enqueued, completed, retried,
//! dead-lettered and cancelled in each minute, stored in the file by the commit that did it
//! (`leaseq_metrics`, docs/format.md), as BullMQ's queue metrics. Read with
//! [`Queue::metrics`](crate::Queue::metrics) or [`Reader::metrics`](crate::Reader::metrics):
//! what `leaseq watch` shows as rates.

/// What one queue did in one minute (Unix time, UTC): counts of the changes committed in it,
/// as the change [`Event`](crate::Event)s of the same names count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MinuteCounts {
    /// The minute's start, in Unix ms (a multiple of 60,000).
    pub minute_ms: u64,
    /// Jobs added ([`Event::Enqueued`](crate::Event::Enqueued)): duplicates kept, replaced
    /// or debounced add none; jobs of schedules and imports count.
    pub enqueued: u64,
    /// Jobs acked ([`Event::Completed`](crate::Event::Completed)).
    pub completed: u64,
    /// Attempts that ended without an ack, the job to run again
    /// ([`Event::Retried`](crate::Event::Retried)): nacks, failing `ack_with` closures,
    /// expired leases taken back.
    pub retried: u64,
    /// Jobs that moved to the dead letters ([`Event::Dead`](crate::Event::Dead)).
    pub dead: u64,
    /// Jobs cancelled ([`Event::Cancelled`](crate::Event::Cancelled)).
    pub cancelled: u64,
}

impl MinuteCounts {
    /// The count of metric `kind` (0 enqueued, 1 completed, 2 retried, 3 dead, 4 cancelled,
    /// the order of `leaseq_metrics`' kinds).
    pub(crate) fn slot(&mut self, kind: usize) -> Option<&mut u64> {
        Some(match kind {
            0 => &mut self.enqueued,
            1 => &mut self.completed,
            2 => &mut self.retried,
            3 => &mut self.dead,
            4 => &mut self.cancelled,
            _ => return None,
        })
    }
}

/// The counts one group commit adds, per queue number, in the order of the kinds above.
#[derive(Debug, Default)]
pub(crate) struct Tally(pub(crate) Vec<(u32, [u64; METRIC_KINDS])>);

/// How many kinds of metric there are.
pub(crate) const METRIC_KINDS: usize = 5;

impl Tally {
    /// Counts one change of metric `kind` in queue `queue_number`.
    pub(crate) fn add(&mut self, queue_number: u32, kind: usize) {
        debug_assert!(kind < METRIC_KINDS);
        let i = match self.0.iter().position(|(q, _)| *q == queue_number) {
            Some(i) => i,
            None => {
                self.0.push((queue_number, [0; METRIC_KINDS]));
                self.0.len() - 1
            }
        };
        self.0[i].1[kind] += 1;
    }

    /// The rows of this tally at the minute of `now_ms`: (queue, kind, minute, count), none
    /// of count 0.
    pub(crate) fn rows(self, now_ms: u64) -> Vec<crate::commit::MetricRow> {
        let minute = now_ms / 60_000;
        let mut out = Vec::new();
        for (queue_number, counts) in self.0 {
            for (kind, n) in counts.into_iter().enumerate() {
                if n > 0 {
                    out.push((queue_number, kind as u8, minute, n));
                }
            }
        }
        out
    }
}
