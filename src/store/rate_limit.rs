//! The rate limit of a queue in the engine (`leaseq_rate_limits`, since format 8), read and
//! charged by the dequeue's own transaction.
//!
//! A limit is a fixed window, as BullMQ's limiter: at most `max` deliveries in a window of
//! `per_ms`, the window starting at the first delivery after the last one ended. The window's
//! start and count are stored with the limit, so a restart neither forgets the deliveries made
//! nor grants a fresh burst.

use redb::{ReadTransaction, ReadableTable};

use crate::commit::{Ctx, GroupTx};
use crate::error::{Error, Result};
use crate::format::schema::RATE_LIMITS;
use crate::limits::{DELAY_MAX, QUEUES_MAX};
use crate::rate_limit::RateLimit;

/// Checks a limit: `InvalidOption` for 0 deliveries, or a window of 0 ms or above
/// `DELAY_MAX`.
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
    Ok(())
}

/// Sets (or with `None` removes) queue `queue_number`'s limit; whether it changed. A new
/// limit starts with a fresh window; the same limit set again keeps its window.
pub(crate) fn set_rate_limit(
    ctx: &mut Ctx<'_>,
    queue_number: u32,
    limit: Option<RateLimit>,
) -> Result<bool> {
    let mut rows = ctx.table(RATE_LIMITS)?;
    let current = rows.get(queue_number)?.map(|v| v.value());
    match limit {
        None if current.is_none() => Ok(false),
        None => {
            rows.remove(queue_number)?;
            // Consumers waiting for the window wake and take what is ready.
            ctx.wake(queue_number);
            Ok(true)
        }
        Some(l) => {
            debug_assert!(validate_rate_limit(&l).is_ok());
            if current.is_some_and(|(max, per, ..)| max == u64::from(l.max) && per == l.per_ms) {
                return Ok(false);
            }
            rows.insert(queue_number, (u64::from(l.max), l.per_ms, 0, 0))?;
            ctx.wake(queue_number);
            Ok(true)
        }
    }
}

/// A limit row as the window stands at `now_ms`: (max, per_ms, window start, count), the
/// window restarted (count 0) if it ended, or if the clock went back a whole window before
/// its start. A `now_ms` a little before the start is within the window: a call that read
/// the clock just before another opened the window may commit after it.
fn current_window(row: (u64, u64, u64, u64), now_ms: u64) -> (u64, u64, u64, u64) {
    let (max, per, start, count) = row;
    if now_ms.saturating_add(per) <= start || now_ms >= start.saturating_add(per) {
        (max, per, now_ms, 0)
    } else {
        (max, per, start, count)
    }
}

/// How many deliveries queue `queue_number` may make now (`None`: not limited), read in the
/// dequeue's transaction.
pub(super) fn allowed_now(tx: GroupTx<'_>, queue_number: u32, now_ms: u64) -> Result<Option<u64>> {
    let rows = tx.table(RATE_LIMITS)?;
    Ok(rows.get(queue_number)?.map(|v| {
        let (max, _, _, count) = current_window(v.value(), now_ms);
        max.saturating_sub(count)
    }))
}

/// Counts `taken` deliveries of queue `queue_number` at `now_ms` against its window.
pub(super) fn charge(ctx: &Ctx<'_>, queue_number: u32, now_ms: u64, taken: u64) -> Result<()> {
    if taken == 0 {
        return Ok(());
    }
    let mut rows = ctx.table(RATE_LIMITS)?;
    let Some(row) = rows.get(queue_number)?.map(|v| v.value()) else {
        return Ok(());
    };
    let (max, per, start, count) = current_window(row, now_ms);
    debug_assert!(count + taken <= max, "charged past the limit");
    rows.insert(queue_number, (max, per, start, count.saturating_add(taken)))?;
    Ok(())
}

/// For a waiting consumer: when queue `queue_number`'s window ends, if it has no delivery
/// left now (`None`: it may deliver, or it is not limited). A file older than format 8 has
/// no limits.
pub(crate) fn limited_until(
    rtx: &ReadTransaction,
    queue_number: u32,
    now_ms: u64,
) -> Result<Option<u64>> {
    let rows = match rtx.open_table(RATE_LIMITS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(rows.get(queue_number)?.and_then(|v| {
        let (max, per, start, count) = current_window(v.value(), now_ms);
        (count >= max).then(|| start.saturating_add(per))
    }))
}

/// Queue `queue_number`'s limit (`None`: not limited, or a file older than format 8).
pub(crate) fn rate_limit_of(rtx: &ReadTransaction, queue_number: u32) -> Result<Option<RateLimit>> {
    let rows = match rtx.open_table(RATE_LIMITS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(rows.get(queue_number)?.map(|v| {
        let (max, per, ..) = v.value();
        RateLimit {
            max: u32::try_from(max).unwrap_or(u32::MAX),
            per_ms: per,
        }
    }))
}

/// `leaseq_rate_limits`' invariants, for `check()`: rows of the file's queues, each a valid
/// limit whose window holds at most its `max`.
pub(super) fn check_rate_limits(
    rtx: &ReadTransaction,
    named: &[(String, u32)],
    out: &mut Vec<String>,
) -> Result<()> {
    let rows = match rtx.open_table(RATE_LIMITS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for e in rows.iter()?.take(QUEUES_MAX as usize + 1) {
        let (k, v) = e?;
        let (q, (max, per, _, count)) = (k.value(), v.value());
        if q != 0 && !named.iter().any(|(_, n)| *n == q) {
            out.push(format!(
                "leaseq_rate_limits names queue number {q}, which is not registered"
            ));
        }
        let limit = RateLimit {
            max: u32::try_from(max).unwrap_or(0),
            per_ms: per,
        };
        if validate_rate_limit(&limit).is_err() || count > max {
            out.push(format!(
                "leaseq_rate_limits holds ({max}, {per} ms, {count} delivered) for queue number {q}"
            ));
        }
    }
    Ok(())
}
