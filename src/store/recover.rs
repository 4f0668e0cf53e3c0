//! Lease recovery at open: every lease of the file back to ready (or dead), and the read-only
//! look at leased rows before it.

use redb::{ReadTransaction, ReadableTable};

use crate::commit::Ctx;
use crate::error::{Error, Result};
use crate::format::schema::{QUEUES, QueueSchema};

use super::registry::{named_queues, named_tables_present};
use super::tables::Tables;
use super::transition::{Ended, LeaseEnd, end_lease_entry};

/// What lease recovery at open did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeaseRecovery {
    pub returned: u64,
    pub dead: u64,
    pub quarantined: u64,
}

/// Returns every lease in the file to ready (or dead when out of attempts), and ends every
/// group's wait for a cancelled delivery: run at open, when the file lock proves the process
/// that held them is gone. A leased row that is damaged is
/// quarantined and the rest are recovered.
pub(crate) fn recover_leases(ctx: &mut Ctx<'_>, now_ms: u64) -> Result<LeaseRecovery> {
    let named: Vec<u32> = {
        let queues = ctx.table(QUEUES)?;
        let mut v = Vec::new();
        for e in queues.iter()? {
            v.push(e?.1.value());
        }
        v
    };
    let mut out = recover_queue_leases(ctx, &crate::format::schema::DEFAULT_SCHEMA, now_ms)?;
    for queue_number in named {
        if !(1..=crate::limits::QUEUES_MAX).contains(&queue_number) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: queue number {queue_number}"
            )));
        }
        let r = recover_queue_leases(ctx, QueueSchema::named(queue_number), now_ms)?;
        out.returned += r.returned;
        out.dead += r.dead;
        out.quarantined += r.quarantined;
    }
    Ok(out)
}

/// [`recover_leases`] for one queue.
fn recover_queue_leases(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    now_ms: u64,
) -> Result<LeaseRecovery> {
    let mut tables = Tables::open(ctx, schema)?;
    let all: Vec<(u64, u64)> = tables
        .leases()?
        .iter()?
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    let mut out = LeaseRecovery::default();
    for entry in all {
        ctx.wake(tables.schema.queue_number);
        match end_lease_entry(&mut tables, ctx, entry, LeaseEnd::Abandoned, now_ms)? {
            Ended::Returned => out.returned += 1,
            Ended::Dead => out.dead += 1,
            Ended::Quarantined => out.quarantined += 1,
            Ended::Stray => {}
        }
    }
    // The workers of cancelled deliveries are gone too: their groups go on. Each pass removes
    // every entry it reads, so the loop ends.
    while tables.end_fences_due(u64::MAX, crate::limits::SWEEP_MAX)? == crate::limits::SWEEP_MAX {}
    Ok(out)
}

/// Reads, over a read snapshot, every lease entry and the job row it names: what lease
/// recovery at open will read, so damage that redb itself reports refuses the file before
/// anything is written. A row that redb reads but that fails leaseq's own checks is not an
/// error here: recovery quarantines it.
pub(crate) fn read_leased_rows(rtx: &ReadTransaction) -> Result<()> {
    let mut all = vec![&crate::format::schema::DEFAULT_SCHEMA];
    for (name, queue_number) in named_queues(rtx)? {
        let schema = QueueSchema::named(queue_number);
        named_tables_present(rtx, &name, schema)?;
        all.push(schema);
    }
    for schema in all {
        let jobs = rtx.open_table(schema.jobs())?;
        for e in rtx.open_table(schema.leases())?.iter()? {
            let (_, id) = e?.0.value();
            jobs.get(id)?;
        }
    }
    Ok(())
}
