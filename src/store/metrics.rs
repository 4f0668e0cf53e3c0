//! The queues' per-minute metrics (`leaseq_metrics`): written by each group commit from its
//! tally, read per queue, checked.

use redb::{ReadTransaction, ReadableTable};

use crate::commit::GroupTx;
use crate::error::Result;
use crate::format::schema::{METRIC_KINDS, METRICS};
use crate::job::Violation;
use crate::limits::{METRICS_MINUTES_KEPT, METRICS_PRUNED_PER_WRITE, VIOLATIONS_MAX};
use crate::metrics::{MetricRow, MinuteCounts};

const MINUTE_MS: u64 = 60_000;

/// Adds metric rows (queue, kind, minute, count) to the file, and removes up to
/// [`METRICS_PRUNED_PER_WRITE`] rows older than [`METRICS_MINUTES_KEPT`] minutes (before the
/// newest minute written) of each kind of each queue written. Run in a group's commit, or a
/// flush's.
pub(crate) fn write_metrics(tx: GroupTx<'_>, rows: &[MetricRow]) -> Result<()> {
    let mut table = tx.table(METRICS)?;
    let mut newest: Vec<(u32, u64)> = Vec::new();
    for &(queue_number, kind, minute, n) in rows {
        debug_assert!(kind < METRIC_KINDS && n > 0);
        let key = (queue_number, kind, minute);
        let was = table.get(key)?.map_or(0, |v| v.value());
        table.insert(key, was.saturating_add(n))?;
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
    }
    Ok(())
}

/// Queue `queue_number`'s minutes from the one holding `since_ms` on, oldest first, at most
/// [`METRICS_MINUTES_KEPT`] of them; minutes with nothing counted are left out.
pub(crate) fn metrics_of(
    rtx: &ReadTransaction,
    queue_number: u32,
    since_ms: u64,
) -> Result<Vec<MinuteCounts>> {
    let table = match rtx.open_table(METRICS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let first = since_ms / MINUTE_MS;
    let mut by_minute: std::collections::BTreeMap<u64, MinuteCounts> = Default::default();
    for kind in 0..METRIC_KINDS {
        let rows = table
            .range((queue_number, kind, first)..=(queue_number, kind, u64::MAX))?
            .rev()
            .take(METRICS_MINUTES_KEPT as usize);
        for e in rows {
            let (k, v) = e?;
            let (_, _, minute) = k.value();
            let entry = by_minute.entry(minute).or_insert_with(|| MinuteCounts {
                minute_ms: minute.saturating_mul(MINUTE_MS),
                ..MinuteCounts::default()
            });
            if let Some(slot) = entry.slot(usize::from(kind)) {
                *slot = slot.saturating_add(v.value());
            }
        }
    }
    // Rows a day older than the queue's newest minute are expired and not yet pruned (some
    // go with each write): left out.
    let newest = by_minute.keys().next_back().copied().unwrap_or(0);
    let oldest_kept = newest.saturating_sub(METRICS_MINUTES_KEPT - 1);
    Ok(by_minute
        .into_iter()
        .filter(|(minute, _)| *minute >= oldest_kept)
        .map(|(_, counts)| counts)
        .collect())
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
