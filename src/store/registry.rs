//! The named-queue registry: queue numbers, their tables, lookup by name.

use redb::ReadableTableMetadata;
use redb::{ReadTransaction, ReadableTable};

use crate::commit::{Ctx, GroupTx, Verdict, refuse};
use crate::error::{Error, Result};
use crate::format::schema::{QUEUES, QueueSchema};

/// The number of the queue named `name`, creating the queue (its registry entry and tables)
/// if it does not exist. Refusals: `InvalidOption` (a bad name, or `QUEUES_MAX` reached).
pub(crate) fn create_queue(ctx: &mut Ctx<'_>, name: &str) -> Verdict<u32> {
    if let Err(e) = QueueSchema::validate_queue_name(name) {
        return refuse(e);
    }
    let mut queues = ctx.table(QUEUES)?;
    if let Some(queue_number) = queues.get(name)?.map(|v| v.value()) {
        if !(1..=crate::limits::QUEUES_MAX).contains(&queue_number) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {name:?} has number {queue_number}"
            )));
        }
        return Ok(Ok(queue_number));
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
    let queue_number = highest + 1;
    if queue_number > crate::limits::QUEUES_MAX {
        return refuse(Error::invalid_option(
            "queue name",
            format!(
                "queue numbers are used up to QUEUES_MAX ({})",
                crate::limits::QUEUES_MAX
            ),
        ));
    }
    queues.insert(name, queue_number)?;
    QueueSchema::named(queue_number).create(&ctx.group())?;
    Ok(Ok(queue_number))
}

/// Every named queue of the file: (name, number), by name. None in a file of format 3 or
/// older (no registry yet).
pub(crate) fn named_queues(rtx: &ReadTransaction) -> Result<Vec<(String, u32)>> {
    let queues = match rtx.open_table(QUEUES) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out: Vec<(String, u32)> = Vec::new();
    for e in queues.iter()? {
        let (name, queue_number) = e?;
        let queue_number = queue_number.value();
        if !(1..=crate::limits::QUEUES_MAX).contains(&queue_number) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {:?} has number {queue_number}",
                name.value()
            )));
        }
        if let Some((other, _)) = out.iter().find(|(_, n)| *n == queue_number) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {other:?} and {:?} both have number {queue_number}",
                name.value()
            )));
        }
        out.push((name.value().to_string(), queue_number));
    }
    Ok(out)
}

/// `Corrupted` unless every table of registered queue `name` is there (a registry entry
/// whose tables are missing is damage, reported as such rather than as a storage error).
pub(super) fn named_tables_present(
    rtx: &ReadTransaction,
    name: &str,
    schema: &'static QueueSchema,
) -> Result<()> {
    fn present<K: redb::Key + 'static, V: redb::Value + 'static>(
        rtx: &ReadTransaction,
        name: &str,
        def: redb::TableDefinition<K, V>,
    ) -> Result<()> {
        match rtx.open_table(def) {
            Ok(_) => Ok(()),
            Err(redb::TableError::TableDoesNotExist(table)) => Err(Error::corrupted(format!(
                "queue {name:?} is registered, but its table {table} is missing"
            ))),
            Err(e) => Err(e.into()),
        }
    }
    present(rtx, name, schema.jobs())?;
    present(rtx, name, schema.ready())?;
    present(rtx, name, schema.scheduled())?;
    present(rtx, name, schema.leases())?;
    present(rtx, name, schema.dead())?;
    present(rtx, name, schema.dead_by_time())?;
    present(rtx, name, schema.dedup())?;
    present(rtx, name, schema.dedup_windows())?;
    present(rtx, name, schema.dedup_expiry())?;
    present(rtx, name, schema.applied())?;
    present(rtx, name, schema.applied_by_time())?;
    present(rtx, name, schema.idem_jobs())?;
    present(rtx, name, schema.payloads())
}

/// The number of queue `name`, if it exists (a read).
pub(crate) fn find_queue(rtx: &ReadTransaction, name: &str) -> Result<Option<u32>> {
    Ok(named_queues(rtx)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, queue_number)| queue_number))
}

/// The name of queue `queue_number` in this transaction's file, as the tool writes it:
/// `(default)` for the unnamed queue, `#N` for a number with no name (damage).
pub(crate) fn name_of(tx: GroupTx<'_>, queue_number: u32) -> Result<String> {
    if queue_number == 0 {
        return Ok("(default)".to_string());
    }
    let queues = tx.table(QUEUES)?;
    for e in queues.iter()?.take(crate::limits::QUEUES_MAX as usize + 1) {
        let (name, n) = e?;
        if n.value() == queue_number {
            return Ok(name.value().to_string());
        }
    }
    Ok(format!("#{queue_number}"))
}

/// Whether named queue number `queue_number` is registered in this transaction's file.
pub(crate) fn is_registered(tx: GroupTx<'_>, queue_number: u32) -> Result<bool> {
    if !(1..=crate::limits::QUEUES_MAX).contains(&queue_number) {
        return Ok(false);
    }
    let queues = tx.table(QUEUES)?;
    for e in queues.iter()?.take(crate::limits::QUEUES_MAX as usize + 1) {
        if e?.1.value() == queue_number {
            return Ok(true);
        }
    }
    Ok(false)
}
