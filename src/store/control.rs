//! Queue controls stored in the file: pause and resume (`leaseq_paused`, since format 6).

use redb::{ReadTransaction, ReadableTable};

use crate::commit::Ctx;
use crate::error::Result;
use crate::format::schema::PAUSED;
use crate::limits::QUEUES_MAX;

/// Pauses queue `queue_number` at `now_ms`; whether it was running (a second pause changes
/// nothing and keeps the first time).
pub(crate) fn pause(ctx: &mut Ctx<'_>, queue_number: u32, now_ms: u64) -> Result<bool> {
    let mut paused = ctx.tx.open_table(PAUSED)?;
    if paused.get(queue_number)?.is_some() {
        return Ok(false);
    }
    ctx.mark_written();
    paused.insert(queue_number, now_ms)?;
    Ok(true)
}

/// Resumes queue `queue_number`; whether it was paused. Its blocked consumers wake on commit.
pub(crate) fn resume(ctx: &mut Ctx<'_>, queue_number: u32) -> Result<bool> {
    let mut paused = ctx.tx.open_table(PAUSED)?;
    if paused.get(queue_number)?.is_none() {
        return Ok(false);
    }
    ctx.mark_written();
    paused.remove(queue_number)?;
    ctx.wake(queue_number);
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
