//! The named-queue registry: queue numbers, their tables, lookup by name.

use redb::ReadableTableMetadata;
use redb::{ReadTransaction, ReadableTable};

use crate::commit::{Ctx, Verdict, refuse};
use crate::error::{Error, Result};
use crate::format::schema::{QUEUES, QueueTables};

/// The number of the queue named `name`, creating the queue (its registry entry and tables)
/// if it does not exist. Refusals: `InvalidOption` (a bad name, or `QUEUES_MAX` reached).
pub(crate) fn create_queue(ctx: &mut Ctx<'_>, name: &str) -> Verdict<u32> {
    if let Err(e) = QueueTables::check_name(name) {
        return refuse(e);
    }
    let mut queues = ctx.tx.open_table(QUEUES)?;
    if let Some(qid) = queues.get(name)?.map(|v| v.value()) {
        if !(1..=crate::limits::QUEUES_MAX).contains(&qid) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {name:?} has number {qid}"
            )));
        }
        return Ok(Ok(qid));
    }
    let count = queues.len()?;
    if count >= u64::from(crate::limits::QUEUES_MAX) {
        return refuse(Error::invalid_option(
            "queue name",
            format!(
                "the file holds QUEUES_MAX ({}) named queues",
                crate::limits::QUEUES_MAX
            ),
        ));
    }
    // Numbers are never reused: one above the highest there is.
    let mut highest = 0;
    for e in queues.iter()? {
        highest = highest.max(e?.1.value());
    }
    let qid = highest + 1;
    if qid > crate::limits::QUEUES_MAX {
        return refuse(Error::invalid_option(
            "queue name",
            format!(
                "queue numbers are used up to QUEUES_MAX ({})",
                crate::limits::QUEUES_MAX
            ),
        ));
    }
    ctx.mark_written();
    queues.insert(name, qid)?;
    QueueTables::named(qid).create(ctx.tx)?;
    Ok(Ok(qid))
}

/// Every named queue of the file: (name, number), by name. None in a file of format 3 or
/// older (no registry yet).
pub(crate) fn named_queues(rtx: &ReadTransaction) -> Result<Vec<(String, u32)>> {
    let queues = match rtx.open_table(QUEUES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out: Vec<(String, u32)> = Vec::new();
    for e in queues.iter()? {
        let (name, qid) = e?;
        let qid = qid.value();
        if !(1..=crate::limits::QUEUES_MAX).contains(&qid) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {:?} has number {qid}",
                name.value()
            )));
        }
        if let Some((other, _)) = out.iter().find(|(_, n)| *n == qid) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {other:?} and {:?} both have number {qid}",
                name.value()
            )));
        }
        out.push((name.value().to_string(), qid));
    }
    Ok(out)
}

/// `Corrupted` unless every table of registered queue `name` is there (a registry entry
/// whose tables are missing is damage, reported as such rather than as a storage error).
pub(super) fn named_tables_present(
    rtx: &ReadTransaction,
    name: &str,
    tq: &'static QueueTables,
) -> Result<()> {
    fn present<K: redb::Key + 'static, V: redb::Value + 'static>(
        rtx: &ReadTransaction,
        name: &str,
        def: redb::TableDefinition<K, V>,
    ) -> Result<()> {
        match rtx.open_table(def) {
            Ok(_) => Ok(()),
            Err(redb::TableError::TableDoesNotExist(t)) => Err(Error::corrupted(format!(
                "queue {name:?} is registered, but its table {t} is missing"
            ))),
            Err(e) => Err(e.into()),
        }
    }
    present(rtx, name, tq.jobs())?;
    present(rtx, name, tq.ready())?;
    present(rtx, name, tq.scheduled())?;
    present(rtx, name, tq.leases())?;
    present(rtx, name, tq.dead())?;
    present(rtx, name, tq.dead_by_time())?;
    present(rtx, name, tq.dedup())?;
    present(rtx, name, tq.dedup_windows())?;
    present(rtx, name, tq.dedup_expiry())?;
    present(rtx, name, tq.applied())?;
    present(rtx, name, tq.applied_by_time())?;
    present(rtx, name, tq.idem_jobs())?;
    present(rtx, name, tq.payloads())
}

/// The number of queue `name`, if it exists (a read).
pub(crate) fn find_queue(rtx: &ReadTransaction, name: &str) -> Result<Option<u32>> {
    Ok(named_queues(rtx)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, qid)| qid))
}
