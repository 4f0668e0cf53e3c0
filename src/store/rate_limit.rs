//! The rate limit of a queue in the engine, read and charged by the dequeue's own
//! transaction: a fixed window (`leaseq_rate_limits`, since format 8) or a sliding one
//! (`leaseq_sliding_limits` and its log `leaseq_rate_log`, since format 15; the rules are
//! `format/rate_log.rs`). A queue has at most one of the two.
//!
//! A fixed window is BullMQ's limiter: at most `max` deliveries in a window of `per_ms`, the
//! window starting at the first delivery after the last one ended. The window's start and
//! count are stored with the limit, so a restart neither forgets the deliveries made nor
//! grants a fresh burst. A sliding window logs each millisecond's deliveries, so at most
//! `max` fall in any span of `per_ms`, across restarts too.

use redb::{ReadTransaction, ReadableTable};

use crate::commit::{Ctx, GroupTx};
use crate::error::{Error, Result};
use crate::format::rate_log::{self, SlidingRow};
use crate::format::schema::{RATE_LIMITS, RATE_LOG, SLIDING_LIMITS};
use crate::limits::{DELAY_MAX, QUEUES_MAX, SLIDING_LIMIT_MAX};
use crate::rate_limit::{RateLimit, RateWindow};

/// The most log rows one call reads or removes for a queue: a sound log holds at most
/// `SLIDING_LIMIT_MAX` (one per millisecond with deliveries, each at least one).
const LOG_ROWS_MAX: usize = SLIDING_LIMIT_MAX as usize + 1;

/// Checks a limit: `InvalidOption` for 0 deliveries, a window of 0 ms or above `DELAY_MAX`,
/// or a sliding window of more than `SLIDING_LIMIT_MAX` deliveries.
pub(crate) fn validate_rate_limit(limit: &RateLimit) -> Result<()> {
    if limit.max == 0 {
        return Err(Error::invalid_option(
            "rate_limit",
            "0 deliveries per window: pause the queue instead",
        ));
    }
    let max_ms = crate::clock::duration_ms(DELAY_MAX);
    if limit.per_ms == 0 || limit.per_ms > max_ms {
        return Err(Error::invalid_option(
            "rate_limit",
            format!("a window of {} ms: 1 ms to {max_ms} ms", limit.per_ms),
        ));
    }
    if limit.window == RateWindow::Sliding && limit.max > SLIDING_LIMIT_MAX {
        return Err(Error::invalid_option(
            "rate_limit",
            format!(
                "{} deliveries per sliding window: at most {SLIDING_LIMIT_MAX}",
                limit.max
            ),
        ));
    }
    Ok(())
}

/// Sets (or with `None` removes) queue `queue_number`'s limit; whether it changed. The same
/// limit set again keeps its window. A new fixed limit starts with a fresh window; a sliding
/// limit changed to another sliding one keeps its log (trimmed to the newest `max`
/// deliveries, which decide when the next may go), so a change never grants a burst the
/// deliveries already made would not allow; a sliding limit replacing a fixed one or none
/// starts with an empty log.
pub(crate) fn set_rate_limit(
    ctx: &mut Ctx<'_>,
    queue_number: u32,
    limit: Option<RateLimit>,
) -> Result<bool> {
    let q = queue_number;
    let fixed = ctx.table(RATE_LIMITS)?.get(q)?.map(|v| v.value());
    let sliding = ctx.table(SLIDING_LIMITS)?.get(q)?.map(|v| v.value());
    let same = |max: u64, per: u64, l: &RateLimit| max == u64::from(l.max) && per == l.per_ms;
    match limit {
        None => {
            if fixed.is_none() && sliding.is_none() {
                return Ok(false);
            }
            remove_fixed(ctx, q, fixed.is_some())?;
            remove_sliding(ctx, q, sliding.is_some())?;
        }
        Some(l) => {
            debug_assert!(validate_rate_limit(&l).is_ok());
            match l.window {
                RateWindow::Fixed => {
                    if fixed.is_some_and(|(max, per, ..)| same(max, per, &l)) {
                        return Ok(false);
                    }
                    remove_sliding(ctx, q, sliding.is_some())?;
                    ctx.table(RATE_LIMITS)?
                        .insert(q, (u64::from(l.max), l.per_ms, 0, 0))?;
                }
                RateWindow::Sliding => {
                    if sliding.is_some_and(|(max, per, ..)| same(max, per, &l)) {
                        return Ok(false);
                    }
                    remove_fixed(ctx, q, fixed.is_some())?;
                    let row = match sliding {
                        Some(row) => trim_log(ctx, q, row, u64::from(l.max))?,
                        None => (0, 0, 0, 0),
                    };
                    ctx.table(SLIDING_LIMITS)?
                        .insert(q, (u64::from(l.max), l.per_ms, row.2, row.3))?;
                }
            }
        }
    }
    // Consumers waiting for the window wake and take what the new limit allows.
    ctx.wake(q);
    Ok(true)
}

fn remove_fixed(ctx: &Ctx<'_>, q: u32, present: bool) -> Result<()> {
    if present {
        ctx.table(RATE_LIMITS)?.remove(q)?;
    }
    Ok(())
}

/// Removes queue `q`'s sliding limit and its log.
fn remove_sliding(ctx: &Ctx<'_>, q: u32, present: bool) -> Result<()> {
    if present {
        ctx.table(SLIDING_LIMITS)?.remove(q)?;
        clear_log(ctx, q)?;
    }
    Ok(())
}

/// Removes queue `q`'s log rows (at most [`LOG_ROWS_MAX`]: a sound log has no more).
fn clear_log(ctx: &Ctx<'_>, q: u32) -> Result<()> {
    let mut log = ctx.table(RATE_LOG)?;
    let times = log
        .range((q, 0)..=(q, u64::MAX))?
        .take(LOG_ROWS_MAX)
        .map(|e| e.map(|(k, _)| k.value().1))
        .collect::<std::result::Result<Vec<u64>, _>>()?;
    for at in times {
        log.remove((q, at))?;
    }
    Ok(())
}

/// Drops queue `q`'s oldest logged deliveries until at most `max` are left: the newest
/// `max` alone decide when a limit of `max` lets the next one go. The row as it is then.
fn trim_log(ctx: &Ctx<'_>, q: u32, mut row: SlidingRow, max: u64) -> Result<SlidingRow> {
    if row.2 <= max {
        return Ok(row);
    }
    let mut log = ctx.table(RATE_LOG)?;
    let oldest = log
        .range((q, 0)..=(q, u64::MAX))?
        .take(LOG_ROWS_MAX)
        .map(|e| e.map(|(k, v)| (k.value().1, v.value())))
        .collect::<std::result::Result<Vec<(u64, u64)>, _>>()?;
    for (at, n) in oldest {
        if row.2 <= max {
            break;
        }
        let drop = n.min(row.2 - max);
        if drop == n {
            log.remove((q, at))?;
        } else {
            log.insert((q, at), n - drop)?;
        }
        row.2 -= drop;
    }
    if row.2 == 0 {
        row.3 = 0;
    }
    Ok(row)
}

/// A fixed-window row as the window stands at `now_ms`: (max, per_ms, window start, count),
/// the window restarted (count 0) if it ended, or if the clock went back a whole window
/// before its start. A `now_ms` a little before the start is within the window: a call that
/// read the clock just before another opened the window may commit after it.
fn current_window(row: (u64, u64, u64, u64), now_ms: u64) -> (u64, u64, u64, u64) {
    let (max, per, start, count) = row;
    if now_ms.saturating_add(per) <= start || now_ms >= start.saturating_add(per) {
        (max, per, now_ms, 0)
    } else {
        (max, per, start, count)
    }
}

/// The deliveries a sliding limit's log counts at `now_ms`: the sum of its rows still in the
/// window (none when the log is stale: it is cleared at the next charge). Read from the rows
/// (at most `max` of them), not from the row's `logged`, so a damaged count cannot hold the
/// queue back for good: the next charge rewrites it from the rows.
fn live<T: ReadableTable<(u32, u64), u64>>(
    log: &T,
    q: u32,
    row: SlidingRow,
    now_ms: u64,
) -> Result<u64> {
    if rate_log::stale(row, now_ms) {
        return Ok(0);
    }
    let from = rate_log::expired_through(row.1, now_ms).map_or(0, |t| t.saturating_add(1));
    let mut counted = 0u64;
    for e in log.range((q, from)..=(q, u64::MAX))?.take(LOG_ROWS_MAX) {
        counted = counted.saturating_add(e?.1.value());
    }
    Ok(counted)
}

/// How many deliveries queue `queue_number` may make now (`None`: not limited), read in the
/// dequeue's transaction.
pub(super) fn allowed_now(tx: GroupTx<'_>, queue_number: u32, now_ms: u64) -> Result<Option<u64>> {
    if let Some(row) = tx.table(RATE_LIMITS)?.get(queue_number)?.map(|v| v.value()) {
        let (max, _, _, count) = current_window(row, now_ms);
        return Ok(Some(max.saturating_sub(count)));
    }
    let Some(row) = tx
        .table(SLIDING_LIMITS)?
        .get(queue_number)?
        .map(|v| v.value())
    else {
        return Ok(None);
    };
    let log = tx.table(RATE_LOG)?;
    Ok(Some(row.0.saturating_sub(live(
        &*log,
        queue_number,
        row,
        now_ms,
    )?)))
}

/// Counts `taken` deliveries of queue `queue_number` at `now_ms` against its limit: the fixed
/// window's count, or the sliding log (its expired rows removed first, so the log never holds
/// more than `max`).
pub(super) fn charge(ctx: &Ctx<'_>, queue_number: u32, now_ms: u64, taken: u64) -> Result<()> {
    if taken == 0 {
        return Ok(());
    }
    let q = queue_number;
    let mut rows = ctx.table(RATE_LIMITS)?;
    let fixed = rows.get(q)?.map(|v| v.value());
    if let Some(row) = fixed {
        let (max, per, start, count) = current_window(row, now_ms);
        debug_assert!(count + taken <= max, "charged past the limit");
        rows.insert(q, (max, per, start, count.saturating_add(taken)))?;
        return Ok(());
    }
    drop(rows);
    let mut limits = ctx.table(SLIDING_LIMITS)?;
    let Some(mut row) = limits.get(q)?.map(|v| v.value()) else {
        return Ok(());
    };
    if rate_log::stale(row, now_ms) {
        clear_log(ctx, q)?;
        (row.2, row.3) = (0, 0);
    } else if let Some(through) = rate_log::expired_through(row.1, now_ms) {
        let mut log = ctx.table(RATE_LOG)?;
        let expired = log
            .range((q, 0)..=(q, through))?
            .take(LOG_ROWS_MAX)
            .map(|e| e.map(|(k, _)| k.value().1))
            .collect::<std::result::Result<Vec<u64>, _>>()?;
        for at in expired {
            debug_assert!(rate_log::expired(at, row.1, now_ms));
            log.remove((q, at))?;
        }
    }
    // What is left is counted from the rows themselves (as `live` counts it), so a damaged
    // count is rewritten here.
    let counted = live(&*ctx.table(RATE_LOG)?, q, row, now_ms)?;
    let at = rate_log::log_at(row, now_ms);
    let mut log = ctx.table(RATE_LOG)?;
    let before = log.get((q, at))?.map_or(0, |v| v.value());
    log.insert((q, at), before.saturating_add(taken))?;
    row.2 = counted.saturating_add(taken);
    row.3 = at;
    debug_assert!(row.2 <= row.0, "charged past the sliding limit");
    limits.insert(q, row)?;
    Ok(())
}

/// Opens a table of format 8 or later, `None` in an older file.
fn open_if_there<K: redb::Key + 'static, V: redb::Value + 'static>(
    rtx: &ReadTransaction,
    def: redb::TableDefinition<'static, K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>> {
    match rtx.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// For a waiting consumer: when queue `queue_number`'s limit lets a delivery go, if it has
/// none left now (`None`: it may deliver, or it is not limited): the fixed window's end, or
/// when enough of the sliding log has left the window. A file older than format 8 has no
/// limits.
pub(crate) fn limited_until(
    rtx: &ReadTransaction,
    queue_number: u32,
    now_ms: u64,
) -> Result<Option<u64>> {
    let q = queue_number;
    if let Some(rows) = open_if_there(rtx, RATE_LIMITS)?
        && let Some(row) = rows.get(q)?.map(|v| v.value())
    {
        let (max, per, start, count) = current_window(row, now_ms);
        return Ok((count >= max).then(|| start.saturating_add(per)));
    }
    let (Some(limits), Some(log)) = (
        open_if_there(rtx, SLIDING_LIMITS)?,
        open_if_there(rtx, RATE_LOG)?,
    ) else {
        return Ok(None);
    };
    let Some(row) = limits.get(q)?.map(|v| v.value()) else {
        return Ok(None);
    };
    let counted = live(&log, q, row, now_ms)?;
    if counted < row.0 {
        return Ok(None);
    }
    // The oldest deliveries still counted leave first: the next one may go once `counted`
    // falls below `max`.
    let from = rate_log::expired_through(row.1, now_ms).map_or(0, |t| t.saturating_add(1));
    let mut left = counted;
    for e in log.range((q, from)..=(q, u64::MAX))?.take(LOG_ROWS_MAX) {
        let (k, v) = e?;
        left = left.saturating_sub(v.value());
        if left < row.0 {
            return Ok(Some(k.value().1.saturating_add(row.1)));
        }
    }
    Ok(None)
}

/// Queue `queue_number`'s limit (`None`: not limited, or a file older than format 8).
pub(crate) fn rate_limit_of(rtx: &ReadTransaction, queue_number: u32) -> Result<Option<RateLimit>> {
    let max32 = |max: u64| u32::try_from(max).unwrap_or(u32::MAX);
    if let Some(rows) = open_if_there(rtx, RATE_LIMITS)?
        && let Some((max, per, ..)) = rows.get(queue_number)?.map(|v| v.value())
    {
        return Ok(Some(RateLimit {
            max: max32(max),
            per_ms: per,
            window: RateWindow::Fixed,
        }));
    }
    let Some(limits) = open_if_there(rtx, SLIDING_LIMITS)? else {
        return Ok(None);
    };
    Ok(limits.get(queue_number)?.map(|v| {
        let (max, per, ..) = v.value();
        RateLimit {
            max: max32(max),
            per_ms: per,
            window: RateWindow::Sliding,
        }
    }))
}

/// The rate-limit tables' invariants, for `check()`: rows of the file's queues, each a valid
/// limit whose window holds at most its `max`; a queue limited by one kind only; each sliding
/// limit's log of its queue, in time order up to its newest time, summing to its count.
pub(super) fn check_rate_limits(
    rtx: &ReadTransaction,
    named: &[(String, u32)],
    out: &mut Vec<String>,
) -> Result<()> {
    let registered = |q: u32| q == 0 || named.iter().any(|(_, n)| *n == q);
    let mut fixed_queues = Vec::new();
    if let Some(rows) = open_if_there(rtx, RATE_LIMITS)? {
        for e in rows.iter()?.take(QUEUES_MAX as usize + 1) {
            let (k, v) = e?;
            let (q, (max, per, _, count)) = (k.value(), v.value());
            fixed_queues.push(q);
            if !registered(q) {
                out.push(format!(
                    "leaseq_rate_limits names queue number {q}, which is not registered"
                ));
            }
            let limit = RateLimit {
                max: u32::try_from(max).unwrap_or(0),
                per_ms: per,
                window: RateWindow::Fixed,
            };
            if validate_rate_limit(&limit).is_err() || count > max {
                out.push(format!(
                    "leaseq_rate_limits holds ({max}, {per} ms, {count} delivered) for queue number {q}"
                ));
            }
        }
    }
    let (Some(limits), Some(log)) = (
        open_if_there(rtx, SLIDING_LIMITS)?,
        open_if_there(rtx, RATE_LOG)?,
    ) else {
        return Ok(());
    };
    let mut sliding_queues = Vec::new();
    for e in limits.iter()?.take(QUEUES_MAX as usize + 1) {
        let (k, v) = e?;
        let (q, (max, per, logged, last_at)) = (k.value(), v.value());
        sliding_queues.push(q);
        if !registered(q) {
            out.push(format!(
                "leaseq_sliding_limits names queue number {q}, which is not registered"
            ));
        }
        if fixed_queues.contains(&q) {
            out.push(format!(
                "queue number {q} has both a fixed and a sliding rate limit"
            ));
        }
        let limit = RateLimit {
            max: u32::try_from(max).unwrap_or(0),
            per_ms: per,
            window: RateWindow::Sliding,
        };
        if validate_rate_limit(&limit).is_err() || logged > max {
            out.push(format!(
                "leaseq_sliding_limits holds ({max}, {per} ms, {logged} logged) for queue number {q}"
            ));
        }
        let (mut sum, mut newest, mut rows) = (0u64, None, 0usize);
        for e in log.range((q, 0)..=(q, u64::MAX))?.take(LOG_ROWS_MAX) {
            let (k, v) = e?;
            let (at, n) = (k.value().1, v.value());
            rows += 1;
            if n == 0 {
                out.push(format!(
                    "leaseq_rate_log of queue number {q} holds 0 at {at} ms"
                ));
            }
            sum = sum.saturating_add(n);
            newest = Some(at);
        }
        if sum != logged || newest.unwrap_or(0) != last_at || rows == LOG_ROWS_MAX {
            out.push(format!(
                "leaseq_rate_log of queue number {q} holds {sum} deliveries in {rows} rows up to \
                 {newest:?} ms, its limit says {logged} up to {last_at} ms"
            ));
        }
    }
    // Each queue the log names, once: the first row at or after the last queue's end.
    let mut from = Some(0u32);
    for _ in 0..=QUEUES_MAX {
        let Some(start) = from else { break };
        let Some(e) = log.range((start, 0)..)?.next() else {
            break;
        };
        let q = e?.0.value().0;
        if !sliding_queues.contains(&q) {
            out.push(format!(
                "leaseq_rate_log holds deliveries of queue number {q}, which has no sliding limit"
            ));
        }
        from = q.checked_add(1);
    }
    Ok(())
}
