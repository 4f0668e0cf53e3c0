//! The queues' per-minute metrics (`leaseq_metrics`) and run times (`leaseq_run_times`):
//! written by each group commit from its tally, read per queue, checked.

use redb::{ReadTransaction, ReadableTable};

use crate::commit::GroupTx;
use crate::error::Result;
use crate::format::run_time;
use crate::format::schema::{METRIC_KINDS, METRICS, RUN_BUCKETS, RUN_TIMES};
use crate::job::Violation;
use crate::limits::{METRICS_MINUTES_KEPT, METRICS_PRUNED_PER_WRITE, VIOLATIONS_MAX};
use crate::metrics::{MetricRow, MinuteCounts, RUN_KIND_BASE};

const MINUTE_MS: u64 = 60_000;

/// Adds metric rows (queue, kind, minute, count) to the file (a run-time bucket's to
/// `leaseq_run_times`), and removes up to [`METRICS_PRUNED_PER_WRITE`] rows older than
/// [`METRICS_MINUTES_KEPT`] minutes (before the newest minute written) of each kind, and up
/// to two minutes' worth of run-time buckets, of each queue written. Run in a group's commit, or a flush's.
pub(crate) fn write_metrics(tx: GroupTx<'_>, rows: &[MetricRow]) -> Result<()> {
    let mut table = tx.table(METRICS)?;
    let mut runs = tx.table(RUN_TIMES)?;
    let mut newest: Vec<(u32, u64)> = Vec::new();
    for &(queue_number, kind, minute, n) in rows {
        debug_assert!(n > 0);
        if kind >= RUN_KIND_BASE {
            let b = kind - RUN_KIND_BASE;
            debug_assert!(b < RUN_BUCKETS);
            let key = (queue_number, minute, b);
            let was = runs.get(key)?.map_or(0, |v| v.value());
            runs.insert(key, was.saturating_add(n))?;
        } else {
            debug_assert!(kind < METRIC_KINDS);
            let key = (queue_number, kind, minute);
            let was = table.get(key)?.map_or(0, |v| v.value());
            table.insert(key, was.saturating_add(n))?;
        }
        match newest.iter_mut().find(|(q, _)| *q == queue_number) {
            Some(e) => e.1 = e.1.max(minute),
            None => newest.push((queue_number, minute)),
        }
    }
    // Every kind of the queue, so a kind no longer counted does not keep its old minutes.
    for (queue_number, minute) in newest {
        let oldest_kept = minute.saturating_sub(METRICS_MINUTES_KEPT - 1);
        for kind in 0..METRIC_KINDS {
            let expired: Vec<(u32, u8, u64)> = table
                .range((queue_number, kind, 0)..(queue_number, kind, oldest_kept))?
                .take(METRICS_PRUNED_PER_WRITE)
                .map(|e| e.map(|(k, _)| k.value()))
                .collect::<std::result::Result<_, _>>()?;
            for k in expired {
                table.remove(k)?;
            }
        }
        // Up to two minutes' worth of buckets per write, so pruning outpaces a queue whose
        // writes each add a whole minute of them.
        let expired: Vec<(u32, u64, u8)> = runs
            .range((queue_number, 0, 0)..(queue_number, oldest_kept, 0))?
            .take(2 * usize::from(RUN_BUCKETS))
            .map(|e| e.map(|(k, _)| k.value()))
            .collect::<std::result::Result<_, _>>()?;
        for k in expired {
            runs.remove(k)?;
        }
    }
    Ok(())
}

/// One minute of a queue as read back: its counts and its run-time buckets (bucket, count).
#[derive(Debug, Clone, Default)]
pub(crate) struct MinuteRows {
    pub(crate) counts: MinuteCounts,
    pub(crate) runs: Vec<(u8, u64)>,
}

impl MinuteRows {
    fn at(minute: u64) -> MinuteRows {
        MinuteRows {
            counts: MinuteCounts {
                minute_ms: minute.saturating_mul(MINUTE_MS),
                ..MinuteCounts::default()
            },
            runs: Vec::new(),
        }
    }

    /// Adds `n` of row kind `kind` (a count, or a run-time bucket from [`RUN_KIND_BASE`] on).
    fn add(&mut self, kind: u8, n: u64) {
        if kind >= RUN_KIND_BASE {
            let b = kind - RUN_KIND_BASE;
            if b >= RUN_BUCKETS {
                return;
            }
            match self.runs.iter_mut().find(|(x, _)| *x == b) {
                Some(e) => e.1 = e.1.saturating_add(n),
                None => self.runs.push((b, n)),
            }
        } else if let Some(slot) = self.counts.slot(usize::from(kind)) {
            *slot = slot.saturating_add(n);
        }
    }

    /// The minute's [`MinuteCounts`], its run times as percentiles.
    fn finish(mut self) -> MinuteCounts {
        self.counts.runs = self
            .runs
            .iter()
            .map(|&(_, n)| n)
            .fold(0, u64::saturating_add);
        self.counts.run_ms_p50 = run_time::percentile(&self.runs, 50);
        self.counts.run_ms_p95 = run_time::percentile(&self.runs, 95);
        self.counts
    }
}

/// Queue `queue_number`'s minutes from the one holding `since_ms` on, oldest first, at most
/// [`METRICS_MINUTES_KEPT`] of them, with `pending` (this process's rows not written yet:
/// (queue, kind, minute, count)) added; minutes with nothing counted are left out.
pub(crate) fn metrics_with(
    rtx: &ReadTransaction,
    queue_number: u32,
    since_ms: u64,
    pending: &[MetricRow],
) -> Result<Vec<MinuteCounts>> {
    let mut by_minute = minutes_of(rtx, queue_number, since_ms)?;
    let first = since_ms / MINUTE_MS;
    for &(q, kind, minute, n) in pending {
        if q == queue_number && minute >= first {
            by_minute
                .entry(minute)
                .or_insert_with(|| MinuteRows::at(minute))
                .add(kind, n);
        }
    }
    Ok(finish(by_minute))
}

/// The stored minutes of [`metrics_with`], by minute, before the percentiles.
fn minutes_of(
    rtx: &ReadTransaction,
    queue_number: u32,
    since_ms: u64,
) -> Result<std::collections::BTreeMap<u64, MinuteRows>> {
    let mut by_minute: std::collections::BTreeMap<u64, MinuteRows> = Default::default();
    let first = since_ms / MINUTE_MS;
    match rtx.open_table(METRICS) {
        Ok(table) => {
            for kind in 0..METRIC_KINDS {
                let rows = table
                    .range((queue_number, kind, first)..=(queue_number, kind, u64::MAX))?
                    .rev()
                    .take(METRICS_MINUTES_KEPT as usize);
                for e in rows {
                    let (k, v) = e?;
                    let (_, _, minute) = k.value();
                    by_minute
                        .entry(minute)
                        .or_insert_with(|| MinuteRows::at(minute))
                        .add(kind, v.value());
                }
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(e.into()),
    }
    match rtx.open_table(RUN_TIMES) {
        Ok(table) => {
            // The newest day's buckets: at most every bucket of every minute kept.
            let rows = table
                .range((queue_number, first, 0)..=(queue_number, u64::MAX, u8::MAX))?
                .rev()
                .take(METRICS_MINUTES_KEPT as usize * usize::from(RUN_BUCKETS));
            for e in rows {
                let (k, v) = e?;
                let (_, minute, b) = k.value();
                by_minute
                    .entry(minute)
                    .or_insert_with(|| MinuteRows::at(minute))
                    .add(RUN_KIND_BASE.saturating_add(b), v.value());
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(by_minute)
}

/// The minutes read, oldest first; rows a day older than the queue's newest minute are
/// expired and not yet pruned (some go with each write): left out.
fn finish(by_minute: std::collections::BTreeMap<u64, MinuteRows>) -> Vec<MinuteCounts> {
    let newest = by_minute.keys().next_back().copied().unwrap_or(0);
    let oldest_kept = newest.saturating_sub(METRICS_MINUTES_KEPT - 1);
    by_minute
        .into_iter()
        .filter(|(minute, _)| *minute >= oldest_kept)
        .map(|(_, rows)| rows.finish())
        .collect()
}

/// `leaseq_metrics` (format 9 on): every row of a queue of the file, of a known kind, with a
/// count above 0.
pub(super) fn check_metrics(
    rtx: &ReadTransaction,
    named: &[(String, u32)],
    format_version: Option<u64>,
    out: &mut Vec<Violation>,
) -> Result<()> {
    let table = match rtx.open_table(METRICS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            if format_version.is_some_and(|v| v >= 9) {
                out.push(Violation {
                    job_id: None,
                    detail: "leaseq_metrics is missing (format 9)".to_string(),
                });
            }
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    for e in table.iter()? {
        if out.len() >= VIOLATIONS_MAX {
            break;
        }
        let (k, v) = e?;
        let ((queue_number, kind, minute), n) = (k.value(), v.value());
        let known = queue_number == 0 || named.iter().any(|(_, q)| *q == queue_number);
        let problem = if !known {
            "a queue number that is not registered"
        } else if kind >= METRIC_KINDS {
            "an unknown kind"
        } else if n == 0 {
            "a count of 0"
        } else {
            continue;
        };
        out.push(Violation {
            job_id: None,
            detail: format!(
                "leaseq_metrics row (queue {queue_number}, kind {kind}, minute {minute}) has {problem}"
            ),
        });
    }
    Ok(())
}

/// `leaseq_run_times` (format 12 on): every row of a queue of the file, of a known bucket,
/// with a count above 0.
pub(super) fn check_run_times(
    rtx: &ReadTransaction,
    named: &[(String, u32)],
    format_version: Option<u64>,
    out: &mut Vec<Violation>,
) -> Result<()> {
    let table = match rtx.open_table(RUN_TIMES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            if format_version.is_some_and(|v| v >= 12) {
                out.push(Violation {
                    job_id: None,
                    detail: "leaseq_run_times is missing (format 12)".to_string(),
                });
            }
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    for e in table.iter()? {
        if out.len() >= VIOLATIONS_MAX {
            break;
        }
        let (k, v) = e?;
        let ((queue_number, minute, b), n) = (k.value(), v.value());
        let known = queue_number == 0 || named.iter().any(|(_, q)| *q == queue_number);
        let problem = if !known {
            "a queue number that is not registered"
        } else if b >= RUN_BUCKETS {
            "an unknown bucket"
        } else if n == 0 {
            "a count of 0"
        } else {
            continue;
        };
        out.push(Violation {
            job_id: None,
            detail: format!(
                "leaseq_run_times row (queue {queue_number}, minute {minute}, bucket {b}) has {problem}"
            ),
        });
    }
    Ok(())
}
