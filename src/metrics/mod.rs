//! Per-minute metrics of each queue: how many jobs were enqueued, completed, retried,
//! dead-lettered and cancelled in each minute, stored in the file by the commit that did it
//! (`leaseq_metrics`, docs/format.md), as BullMQ's queue metrics. Read with
//! [`Queue::metrics`](crate::Queue::metrics) or [`Reader::metrics`](crate::Reader::metrics):
//! what `leaseq watch` shows as rates. With them, how long the deliveries that ended in each
//! minute ran: a histogram of run times (`leaseq_run_times`), read as percentiles.

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
    /// Waiting jobs dropped to make room in a full queue
    /// ([`Event::Dropped`](crate::Event::Dropped)). Since format 13.
    pub dropped: u64,
    /// Deliveries whose consumer ended them in this minute (an ack, `ack_with`, a nack, a
    /// fail or a snooze, through a [`Lease`](crate::Lease) or a batch call), each timed from
    /// its dequeue to that call: the runs the two percentiles below are of. A lease that
    /// expired, was cancelled or was abandoned by a crash is not timed. Since format 12.
    pub runs: u64,
    /// The median run time of those deliveries (ms): an upper bound, at most a quarter above
    /// the true value and exact below 8 ms (run times are kept as a histogram of buckets
    /// growing by a quarter, as HdrHistogram and Prometheus keep latencies). `None` when
    /// `runs` is 0.
    pub run_ms_p50: Option<u64>,
    /// The 95th percentile of their run times (ms), of the same precision as `run_ms_p50`:
    /// what Sidekiq and Oban Web chart as execution time.
    pub run_ms_p95: Option<u64>,
}

impl MinuteCounts {
    /// The count of metric `kind` (0 enqueued, 1 completed, 2 retried, 3 dead, 4 cancelled,
    /// 5 dropped,
    /// the order of `leaseq_metrics`' kinds).
    pub(crate) fn slot(&mut self, kind: usize) -> Option<&mut u64> {
        Some(match kind {
            0 => &mut self.enqueued,
            1 => &mut self.completed,
            2 => &mut self.retried,
            3 => &mut self.dead,
            4 => &mut self.cancelled,
            5 => &mut self.dropped,
            _ => return None,
        })
    }
}

/// The counts one group commit adds, per queue number, in the order of the kinds above, and
/// its run times (queue number, bucket, how many).
#[derive(Debug, Default)]
pub(crate) struct Tally(
    pub(crate) Vec<(u32, [u64; METRIC_KINDS])>,
    pub(crate) Vec<(u32, u8, u64)>,
);

/// How many kinds of metric there are.
pub(crate) const METRIC_KINDS: usize = 6;

/// A [`MetricRow`]'s kind from this one on is a run-time bucket (kind − this), kept in
/// `leaseq_run_times`; below it, a count of `leaseq_metrics`.
pub(crate) const RUN_KIND_BASE: u8 = 128;
const _: () = assert!((METRIC_KINDS as u8) < RUN_KIND_BASE);

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

    /// Counts one delivery of queue `queue_number` whose run time fell in run-time bucket
    /// `b` (`format::run_time::bucket`).
    pub(crate) fn add_run(&mut self, queue_number: u32, b: u8) {
        debug_assert!(b < u8::MAX - RUN_KIND_BASE);
        match self
            .1
            .iter_mut()
            .find(|(q, x, _)| (*q, *x) == (queue_number, b))
        {
            Some(e) => e.2 += 1,
            None => self.1.push((queue_number, b, 1)),
        }
    }

    /// The rows of this tally at the minute of `now_ms`: (queue, kind, minute, count), none
    /// of count 0.
    pub(crate) fn rows(self, now_ms: u64) -> Vec<MetricRow> {
        let minute = now_ms / 60_000;
        let mut out = Vec::new();
        for (queue_number, counts) in self.0 {
            for (kind, n) in counts.into_iter().enumerate() {
                if n > 0 {
                    out.push((queue_number, kind as u8, minute, n));
                }
            }
        }
        for (queue_number, b, n) in self.1 {
            out.push((queue_number, RUN_KIND_BASE + b, minute, n));
        }
        out
    }
}

/// A metric row: (queue number, kind, minute since the Unix epoch, count). A kind from
/// [`RUN_KIND_BASE`] on counts the runs of a run-time bucket.
pub(crate) type MetricRow = (u32, u8, u64, u64);

/// Adds `rows` into `into`, summing the counts of equal (queue, kind, minute).
fn merge_rows(into: &mut Vec<MetricRow>, rows: &[MetricRow]) {
    for &(q, k, m, n) in rows {
        match into
            .iter_mut()
            .find(|(q2, k2, m2, _)| (*q2, *k2, *m2) == (q, k, m))
        {
            Some(row) => row.3 = row.3.saturating_add(n),
            None => into.push((q, k, m, n)),
        }
    }
}

/// Metrics of committed groups not yet in the file: a group's counts are written with the
/// group that commits at least [`METRICS_FLUSH_INTERVAL`](crate::limits::METRICS_FLUSH_INTERVAL)
/// after the last write of them (or the first to commit), so the metrics cost at most one
/// small write per second; [`Queue::flush`](crate::Queue::flush), shutdown and the close
/// write the rest. Only the buffer: the file's `FileMetrics` writes it.
#[derive(Debug, Default)]
pub(crate) struct PendingMetrics {
    rows: Vec<MetricRow>,
    /// When they were last written (the clock's Unix ms); `None` before the first write.
    written_ms: Option<u64>,
    /// The commit on its way ([`PendingMetrics::seal`] to [`PendingMetrics::settle`]).
    sealing: Option<Sealing>,
}

/// What a sealing group's commit carries of the metrics.
#[derive(Debug)]
struct Sealing {
    /// Pending rows taken out for its write (so a flush meanwhile cannot write them again).
    taken: Vec<MetricRow>,
    /// The group's own counts.
    own: Vec<MetricRow>,
    now_ms: u64,
    /// Whether its commit writes them (they were due).
    writes: bool,
}

impl PendingMetrics {
    /// A group that wrote is sealing at `now_ms` with `tally`: the rows its commit writes
    /// (none when the last write is less than a second old), then
    /// [`PendingMetrics::settle`] once it landed or not.
    pub(crate) fn seal(&mut self, tally: Tally, now_ms: u64) -> Vec<MetricRow> {
        // A seal never settled (not expected: the committer settles every one) gives its
        // rows back first.
        self.settle(false);
        let own = tally.rows(now_ms);
        let due = self.written_ms.is_none_or(|t| {
            now_ms < t || now_ms - t >= crate::limits::METRICS_FLUSH_INTERVAL.as_millis() as u64
        });
        let mut write = Vec::new();
        let taken = if due {
            write = std::mem::take(&mut self.rows);
            let taken = write.clone();
            merge_rows(&mut write, &own);
            taken
        } else {
            Vec::new()
        };
        self.sealing = Some(Sealing {
            taken,
            own,
            now_ms,
            writes: due && !write.is_empty(),
        });
        write
    }

    /// The sealing group's commit landed (its counts are in the file, or wait for a later
    /// write) or not (its own counts are dropped with it; the pending rows it took go back).
    pub(crate) fn settle(&mut self, landed: bool) {
        let Some(s) = self.sealing.take() else {
            return;
        };
        match (landed, s.writes) {
            (true, true) => self.written_ms = Some(s.now_ms),
            (true, false) => merge_rows(&mut self.rows, &s.own),
            (false, _) => merge_rows(&mut self.rows, &s.taken),
        }
    }

    /// The rows not written yet.
    pub(crate) fn rows(&self) -> &[MetricRow] {
        &self.rows
    }

    /// Takes the rows out for a flush, which gives them back with
    /// [`PendingMetrics::put_back`] if its commit does not land.
    pub(crate) fn take(&mut self) -> Vec<MetricRow> {
        std::mem::take(&mut self.rows)
    }

    /// Rows a flush took out and did not commit: pending again.
    pub(crate) fn put_back(&mut self, rows: &[MetricRow]) {
        merge_rows(&mut self.rows, rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(q: u32, kind: usize) -> Tally {
        let mut t = Tally::default();
        t.add(q, kind);
        t
    }

    #[test]
    fn a_group_writes_its_counts_at_most_once_a_second_and_an_aborted_one_counts_nothing() {
        let mut p = PendingMetrics::default();
        // The first commit writes its counts.
        assert_eq!(p.seal(tally(1, 0), 60_000), vec![(1, 0, 1, 1)]);
        p.settle(true);
        // Within the second: kept for later.
        assert!(p.seal(tally(1, 0), 60_500).is_empty());
        p.settle(true);
        assert_eq!(p.rows(), &[(1, 0, 1, 1)]);
        // An aborted group's counts are dropped; the pending ones it took go back.
        assert_eq!(
            p.seal(tally(1, 1), 61_500),
            vec![(1, 0, 1, 1), (1, 1, 1, 1)]
        );
        p.settle(false);
        assert_eq!(p.rows(), &[(1, 0, 1, 1)]);
        // A flush takes them, and gives them back when its commit fails.
        let rows = p.take();
        p.put_back(&rows);
        assert_eq!(p.rows(), &[(1, 0, 1, 1)]);
    }
}
