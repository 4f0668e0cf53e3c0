//! Bounded retention: pruning expired applied markers, dead jobs and dedup windows, a few per
//! operation and the rest on `Queue::prune`.

use redb::{ReadableTable, ReadableTableMetadata, Table};

use crate::commit::{Ctx, GroupTable};
use crate::error::Result;
use crate::format::record::StoredState;
use crate::format::schema::QueueSchema;

use super::QueueConfig;
use super::tables::{Row, Tables};

/// Removes up to `max` applied markers whose retention (from their `kept_since_ms`) has
/// passed, oldest first. A marker whose key a job carries (live, or kept ended) is kept: its retention starts
/// again from now. Returns how many were removed, how many looked at (each one a write), and
/// whether expired ones may remain.
pub(super) fn prune_applied(
    tables: &mut Tables<'_>,
    applied: &mut GroupTable<'_, &'static [u8], u64>,
    by_time: &mut GroupTable<'_, (u64, &'static [u8]), ()>,
    now_ms: u64,
    retention_ms: u64,
    max: usize,
) -> Result<(u64, usize, bool)> {
    let Some(cutoff_ms) = now_ms.checked_sub(retention_ms) else {
        return Ok((0, 0, false));
    };
    let (expired, more) = due_entries(by_time, cutoff_ms, max)?;
    let looked = expired.len();
    let mut removed = 0;
    for (at, key) in expired {
        by_time.remove((at, key.as_slice()))?;
        let carried = tables
            .idem_jobs()?
            .range((key.as_slice(), 0)..=(key.as_slice(), u64::MAX))?
            .next()
            .is_some();
        if carried {
            applied.insert(key.as_slice(), now_ms)?;
            by_time.insert((now_ms, key.as_slice()), ())?;
        } else {
            applied.remove(key.as_slice())?;
            removed += 1;
        }
    }
    Ok((removed, looked, more))
}

/// Deletes up to `max` dead jobs that died `retention_ms` or more before `now_ms`, oldest
/// first, releasing their keys. An index entry that does not match its row is dropped (the
/// row settled). Returns how many were deleted and whether more may be left.
pub(super) fn prune_dead(
    tables: &mut Tables<'_>,
    now_ms: u64,
    retention_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let Some(cutoff_ms) = now_ms.checked_sub(retention_ms) else {
        return Ok((0, false));
    };
    let old: Vec<(u64, u64)> = tables
        .dead_by_time()?
        .range(..=(cutoff_ms, u64::MAX))?
        .take(max + 1)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    let more = old.len() > max;
    let deleted = delete_dead(tables, old.into_iter().take(max), now_ms)?;
    Ok((deleted, more))
}

/// Deletes the dead jobs of `entries` (`leaseq_dead_by_time` keys: when it died, its id),
/// releasing their keys; how many. An entry that does not match its row is dropped (the row
/// settled).
fn delete_dead(
    tables: &mut Tables<'_>,
    entries: impl Iterator<Item = (u64, u64)>,
    now_ms: u64,
) -> Result<u64> {
    let mut deleted = 0;
    for (died_ms, id) in entries {
        match tables.row(id)? {
            Row::Good(record)
                if record.state == StoredState::Dead && record.run_at_ms == died_ms =>
            {
                tables.delete(id, &record, now_ms)?;
                deleted += 1;
            }
            row => {
                tables.dead_by_time_mut()?.remove((died_ms, id))?;
                tables.repair_stray_entry(id, row, now_ms)?;
            }
        }
    }
    Ok(deleted)
}

/// Deletes up to `max` completed and cancelled jobs past the queue's history, oldest first:
/// while there are more than its `keep_jobs`, or older than its `keep_for`, or all of them
/// when it keeps none; never one whose row may not go yet (a cancelled lease still fenced),
/// and those do not count toward `keep_jobs`.
/// An entry that does not match its row is dropped. Returns how many were deleted and whether
/// more may be left.
pub(super) fn prune_history(
    tables: &mut Tables<'_>,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    // Read once the oldest row is due: an empty history (the default) costs two lookups.
    let mut bounds = None;
    let mut deleted = 0;
    for _ in 0..max {
        let first_completed = tables.completed()?.first()?.map(|(k, _)| k.value());
        let first_cancelled = tables.cancelled()?.first()?.map(|(k, _)| k.value());
        let (at_ms, id, completed) = match (first_completed, first_cancelled) {
            (Some(a), Some(b)) if b < a => (b.0, b.1, false),
            (Some(a), _) => (a.0, a.1, true),
            (None, Some(b)) => (b.0, b.1, false),
            (None, None) => return Ok((deleted, false)),
        };
        if at_ms > now_ms {
            return Ok((deleted, false));
        }
        let (history, fenced) = match bounds {
            Some(b) => b,
            None => {
                // Rows still fencing a lease are kept whatever the bounds, and do not count
                // toward them.
                let fenced = tables
                    .cancelled()?
                    .range((now_ms.saturating_add(1), 0)..)?
                    .count() as u64;
                *bounds.insert((tables.history()?, fenced))
            }
        };
        let kept = (tables.completed()?.len()? + tables.cancelled()?.len()?).saturating_sub(fenced);
        let too_many = history.keep_jobs.is_some_and(|n| kept > n);
        let too_old = history
            .keep_for_ms
            .is_some_and(|ms| at_ms.saturating_add(ms) <= now_ms);
        if !(history.is_off() || too_many || too_old) {
            return Ok((deleted, false));
        }
        match tables.row(id)? {
            Row::Good(record)
                if record.history_ms() == at_ms
                    && matches!(
                        (&record.state, completed),
                        (StoredState::Completed { .. }, true)
                            | (StoredState::Cancelled { .. }, false)
                    ) =>
            {
                tables.delete(id, &record, now_ms)?;
                deleted += 1;
            }
            row => {
                if completed {
                    tables.completed_mut()?.remove((at_ms, id))?;
                } else {
                    tables.cancelled_mut()?.remove((at_ms, id))?;
                }
                tables.repair_stray_entry(id, row, now_ms)?;
            }
        }
    }
    Ok((deleted, true))
}

/// [`Queue::prune`](crate::Queue::prune)'s work on the history in one transaction.
pub(crate) fn prune_history_jobs(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let mut tables = Tables::open(ctx, schema)?;
    prune_history(&mut tables, now_ms, max)
}

/// [`Queue::prune`](crate::Queue::prune)'s work on dead jobs in one transaction: those past
/// the retention, then the oldest over the count limit.
pub(crate) fn prune_dead_jobs(
    ctx: &mut Ctx<'_>,
    config: &QueueConfig,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let mut tables = Tables::open(ctx, config.schema)?;
    let (mut deleted, mut more) = (0, false);
    if let Some(retention_ms) = config.dead_retention_ms {
        (deleted, more) = prune_dead(&mut tables, now_ms, retention_ms, max)?;
    }
    if let Some(kept) = config.dead_jobs_max {
        let (d, m) = prune_dead_over(&mut tables, now_ms, kept, max - deleted as usize)?;
        deleted += d;
        more |= m;
    }
    Ok((deleted, more))
}

/// Deletes the oldest dead jobs (by when they died) while the queue holds more than `kept`,
/// at most `max` of them, releasing their keys. An index entry that does not match its row
/// is dropped (the row settled). Returns how many were deleted and whether more may be left.
pub(super) fn prune_dead_over(
    tables: &mut Tables<'_>,
    now_ms: u64,
    kept: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let over = tables.dead()?.len()?.saturating_sub(kept);
    if over == 0 {
        return Ok((0, false));
    }
    let take = usize::try_from(over).unwrap_or(usize::MAX).min(max);
    let old: Vec<(u64, u64)> = tables
        .dead_by_time()?
        .iter()?
        .take(take)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    let deleted = delete_dead(tables, old.into_iter(), now_ms)?;
    Ok((deleted, over > take as u64))
}

/// An entry of a time index: (time_ms, key).
type TimedKey = (u64, Vec<u8>);

/// The first `max` entries of a time index `(time_ms, key)` with `time_ms <= up_to_ms`, oldest
/// first, and whether more such entries are left.
fn due_entries(
    index: &Table<'_, (u64, &'static [u8]), ()>,
    up_to_ms: u64,
    max: usize,
) -> Result<(Vec<TimedKey>, bool)> {
    let empty: &[u8] = &[];
    let mut due: Vec<TimedKey> = index
        .range(..(up_to_ms.saturating_add(1), empty))?
        .take(max.saturating_add(1))
        .map(|e| {
            e.map(|(k, _)| {
                let (at, key) = k.value();
                (at, key.to_vec())
            })
        })
        .collect::<Result<_, _>>()?;
    let more = due.len() > max;
    due.truncate(max);
    Ok((due, more))
}

/// Releases up to `max` dedup keys whose window has ended, earliest first (the jobs that
/// held them are not touched). Returns how many were released and whether more may be left.
pub(super) fn prune_windows(
    tables: &mut Tables<'_>,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let (ended, more) = due_entries(tables.dedup_expiry()?, now_ms, max)?;
    let mut released = 0;
    for (end_ms, key) in ended {
        let current = tables
            .dedup_windows()?
            .get(key.as_slice())?
            .map(|v| v.value());
        if current == Some(end_ms) {
            tables.end_window(&key, end_ms)?;
            released += 1;
        } else {
            tables
                .dedup_expiry_mut()?
                .remove((end_ms, key.as_slice()))?;
        }
    }
    Ok((released, more))
}

/// [`Queue::prune`](crate::Queue::prune)'s work on dedup windows in one transaction.
pub(crate) fn prune_dedup_windows(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let mut tables = Tables::open(ctx, schema)?;
    prune_windows(&mut tables, now_ms, max)
}

/// [`Queue::prune`](crate::Queue::prune)'s work in one transaction: up to `max` expired
/// applied markers. Returns how many were removed and whether more may be left.
pub(crate) fn prune(
    ctx: &mut Ctx<'_>,
    config: &QueueConfig,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let schema = config.schema;
    let Some(retention_ms) = config.applied_retention_ms else {
        return Ok((0, false));
    };
    let mut tables = Tables::open(ctx, schema)?;
    let mut applied = ctx.table(schema.applied())?;
    let mut by_time = ctx.table(schema.applied_by_time())?;
    let (removed, _looked, more) = prune_applied(
        &mut tables,
        &mut applied,
        &mut by_time,
        now_ms,
        retention_ms,
        max,
    )?;
    Ok((removed, more))
}
