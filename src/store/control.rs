//! Queue controls stored in the file: pause and resume (`leaseq_paused`, since format 6),
//! the completed history each queue keeps (`leaseq_history_limits`, since format 7).

use redb::{ReadTransaction, ReadableTable};

use crate::commit::Ctx;
use crate::error::{Error, Result};
use crate::format::schema::{HISTORY_LIMITS, PAUSED};
use crate::job::History;
use crate::limits::{DELAY_MAX, HISTORY_JOBS_MAX, QUEUES_MAX};

/// Checks a history's bounds: `InvalidOption` for a count of 0 or above `HISTORY_JOBS_MAX`,
/// an age of 0 or above `DELAY_MAX`.
pub(crate) fn validate_history(history: &History) -> Result<()> {
    if history
        .keep_jobs
        .is_some_and(|n| n == 0 || n > HISTORY_JOBS_MAX)
    {
        return Err(Error::invalid_option(
            "history keep_jobs",
            format!("1 to {HISTORY_JOBS_MAX} jobs"),
        ));
    }
    let age_max_ms = crate::clock::duration_ms(DELAY_MAX);
    if history
        .keep_for_ms
        .is_some_and(|ms| ms == 0 || ms > age_max_ms)
    {
        return Err(Error::invalid_option(
            "history keep_for",
            format!("1 ms to {age_max_ms} ms (DELAY_MAX)"),
        ));
    }
    Ok(())
}

/// The history a stored row `(jobs, ms)` (0: no bound of that kind) stands for, if it is a
/// valid one (a row never stores "off": that is no row).
pub(crate) fn history_from_stored(jobs: u64, ms: u64) -> Option<History> {
    let history = History {
        keep_jobs: (jobs > 0).then_some(jobs),
        keep_for_ms: (ms > 0).then_some(ms),
    };
    (!history.is_off() && validate_history(&history).is_ok()).then_some(history)
}

/// Sets queue `queue_number`'s history (validated by the caller); whether it changed.
pub(crate) fn set_history(ctx: &mut Ctx<'_>, queue_number: u32, history: History) -> Result<bool> {
    debug_assert!(validate_history(&history).is_ok());
    let mut limits = ctx.table(HISTORY_LIMITS)?;
    let stored = (
        history.keep_jobs.unwrap_or(0),
        history.keep_for_ms.unwrap_or(0),
    );
    let current = limits.get(queue_number)?.map(|v| v.value());
    if history.is_off() {
        if current.is_none() {
            return Ok(false);
        }
        limits.remove(queue_number)?;
    } else {
        if current == Some(stored) {
            return Ok(false);
        }
        limits.insert(queue_number, stored)?;
    }
    Ok(true)
}

/// Queue `queue_number`'s history, read from `limits` (`leaseq_history_limits`). A row that
/// is not a valid history keeps nothing (`check()` reports it).
pub(crate) fn history_in(
    limits: &impl ReadableTable<u32, (u64, u64)>,
    queue_number: u32,
) -> Result<History> {
    Ok(match limits.get(queue_number)? {
        Some(v) => {
            let (jobs, ms) = v.value();
            history_from_stored(jobs, ms).unwrap_or_default()
        }
        None => History::off(),
    })
}

/// Queue `queue_number`'s history in a read snapshot (off in a file older than format 7).
pub(crate) fn history_of(rtx: &ReadTransaction, queue_number: u32) -> Result<History> {
    match rtx.open_table(HISTORY_LIMITS) {
        Ok(limits) => history_in(&limits, queue_number),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(History::off()),
        Err(e) => Err(e.into()),
    }
}

/// Pauses queue `queue_number` at `now_ms`; whether it was running (a second pause changes
/// nothing and keeps the first time).
pub(crate) fn pause(ctx: &mut Ctx<'_>, queue_number: u32, now_ms: u64) -> Result<bool> {
    let mut paused = ctx.table(PAUSED)?;
    if paused.get(queue_number)?.is_some() {
        return Ok(false);
    }
    paused.insert(queue_number, now_ms)?;
    ctx.log().event(queue_number, crate::events::Event::Paused);
    Ok(true)
}

/// Resumes queue `queue_number`; whether it was paused. Its blocked consumers wake on commit.
pub(crate) fn resume(ctx: &mut Ctx<'_>, queue_number: u32) -> Result<bool> {
    let mut paused = ctx.table(PAUSED)?;
    if paused.get(queue_number)?.is_none() {
        return Ok(false);
    }
    paused.remove(queue_number)?;
    ctx.wake(queue_number);
    ctx.log().event(queue_number, crate::events::Event::Resumed);
    Ok(true)
}

/// The rows of `leaseq_paused`, by queue number, with when each was paused (Unix ms): at most
/// one per queue a file can hold (the default one and `QUEUES_MAX` named ones), read as they
/// are (a number no queue has is for `check()` to report). A file of format 5 or older has
/// none.
pub(crate) fn paused_queues(rtx: &ReadTransaction) -> Result<Vec<(u32, u64)>> {
    let paused = match rtx.open_table(PAUSED) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for e in paused.iter()?.take(QUEUES_MAX as usize + 1) {
        let (n, at) = e?;
        out.push((n.value(), at.value()));
    }
    Ok(out)
}

/// Records the file's storage-full state in `leaseq_meta` (`storage_full_ms`: since when, or
/// 0 with room), for readers and the next open: what the disk reserve saw at this open,
/// written at once rather than with the first commit that writes.
pub(crate) fn record_storage_full(ctx: &mut Ctx<'_>, since_ms: u64) -> Result<()> {
    ctx.table(crate::format::schema::META)?
        .insert(crate::format::schema::META_STORAGE_FULL_MS, since_ms)?;
    Ok(())
}
