//! The file id and format upgrades of older files, run at open in the opening transaction.

use redb::ReadableTable;

use crate::commit::{Ctx, GroupTx};
use crate::error::{Error, Result};
use crate::format::record::{JobRecord, PayloadRef, StoredState};
use crate::format::schema::{
    FORMAT_VERSION, HISTORY_LIMITS, MARKER_TAG_ID, META, META_FILE_ID, META_FORMAT_VERSION, PAUSED,
    QUEUES, RATE_LIMITS, SCHEDULE_DUE, SCHEDULE_INSTANCES, SCHEDULES, marker_key,
};
use crate::limits::PAYLOAD_INLINE_MAX;

/// The file's random id, if it has one yet.
pub(crate) fn file_id(rtx: &redb::ReadTransaction) -> Result<Option<u64>> {
    let meta = rtx.open_table(META)?;
    Ok(meta
        .get(META_FILE_ID)?
        .map(|v| v.value())
        .filter(|&id| id != 0))
}

/// The file's random id, drawn and written now if it has none (a commit only then).
pub(crate) fn make_file_id(ctx: &mut Ctx<'_>) -> Result<u64> {
    let mut meta = ctx.table(META)?;
    if let Some(id) = meta
        .get(META_FILE_ID)?
        .map(|v| v.value())
        .filter(|&id| id != 0)
    {
        return Ok(id);
    }
    let id = random_u64();
    meta.insert(META_FILE_ID, id)?;
    Ok(id)
}

/// 64 random bits, never 0: std's randomly keyed SipHash over the time and process id.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// Brings a file of an older format version to [`FORMAT_VERSION`], one step per version, in
/// this transaction (run at open, before lease recovery). Returns the version it came from,
/// or `None` if the file was current.
///
/// 1 → 2: the time index of the applied markers and the index of the caller idempotency keys
/// live jobs carry are built from `leaseq_applied` and `leaseq_jobs`; markers of jobs' own ids
/// (which guard nothing) are dropped. 2 → 3: payloads above 1 KiB move to `leaseq_payloads`.
/// 3 → 4: the empty registry of named queues. 4 → 5: the version only (records of version 3
/// are read as they are). 5 → 6: the empty table of paused queues. 6 → 7: the empty history
/// settings, and each queue's empty completed and cancelled indexes (records of version 4 are
/// read as they are). 7 → 8: the empty schedule and rate-limit tables, and each queue's empty group tables
/// (records of version 5 are read as they are). 8 → 9: the empty metrics table. 9 → 10: the
/// version only (records of version 7, fixed-width and checked with XXH3-64, are written from
/// now on; records of version 6 are read as they are, and rewritten when their job changes).
/// 10 → 11: the version only (the journal's meta keys are optional); a format-10 build then
/// refuses the file instead of opening it without replaying its journal. 11 → 12: the empty
/// run-time table; a format-11 build then refuses the file instead of leaving run times
/// uncounted. 12 → 13: the empty size-limit and dropped-count tables. 13 → 14: the empty
/// table of cancelled deliveries groups wait for. 14 → 15: the empty sliding-window limit and
/// log tables (records of version 8, which may hold a job's own execution timeout, are
/// written from now on; records of version 7 are read as they are); a format-14 build then
/// refuses the file instead of missing a sliding limit or quarantining the records it
/// cannot read.
///
/// An upgrade is a checkpoint (a durable commit, never a journal frame): an older build
/// reading the file finds it upgraded or not, never a journal it cannot replay.
///
/// A row that fails its checks is skipped here: the pass that meets it quarantines it.
pub(crate) fn upgrade(ctx: &mut Ctx<'_>) -> Result<Option<u64>> {
    let tx = ctx.group();
    let mut meta = tx.table(META)?;
    let version = meta
        .get(META_FORMAT_VERSION)?
        .map(|v| v.value())
        .ok_or_else(|| Error::corrupted("leaseq_meta has no format version"))?;
    match version {
        FORMAT_VERSION => return Ok(None),
        1..=14 => {}
        _ => {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
    }
    if version == 1 {
        upgrade_1_to_2(tx)?;
    }
    if version <= 2 {
        upgrade_2_to_3(tx)?;
    }
    // 3 to 4: the registry of named queues, empty.
    tx.create(QUEUES)?;
    // 4 to 5: nothing to rewrite (version-4 records are written from now on).
    // 5 to 6: the table of paused queues, empty.
    tx.create(PAUSED)?;
    // 6 to 7: the history settings, and every queue's history indexes, empty.
    tx.create(HISTORY_LIMITS)?;
    if version <= 6 {
        upgrade_6_to_7(tx)?;
    }
    // 7 to 8: the schedules and their due-time index, empty.
    tx.create(SCHEDULES)?;
    tx.create(SCHEDULE_DUE)?;
    tx.create(SCHEDULE_INSTANCES)?;
    // 7 to 8: the rate limits, none; every queue's group tables, empty.
    tx.create(RATE_LIMITS)?;
    for schema in all_queues(tx)? {
        tx.create(schema.groups())?;
        tx.create(schema.held())?;
    }
    // 8 to 9: the queues' metrics, none counted yet.
    tx.create(crate::format::schema::METRICS)?;
    // 9 to 10: nothing to rewrite (version-7 records are written from now on).
    // 10 to 11: nothing to rewrite (the journal's meta keys are optional).
    // 11 to 12: the queues' run times, none yet (a leased job's run_at_ms is its delivery's
    // start from now on; a lease of an older build keeps its ready time until this open's
    // lease recovery, right after, returns it).
    tx.create(crate::format::schema::RUN_TIMES)?;
    // 12 to 13: the queues' size limits, none, and their dropped counts, none.
    tx.create(crate::format::schema::QUEUE_LIMITS)?;
    tx.create(crate::format::schema::DROPPED)?;
    // 13 to 14: the cancelled deliveries groups wait for, none (a job cancelled while leased
    // by an older build has already let its group go on).
    tx.create(crate::format::schema::GROUP_FENCES)?;
    // 14 to 15: the sliding-window rate limits, none, and their logs, empty; nothing to
    // rewrite (version-8 records are written from now on).
    tx.create(crate::format::schema::SLIDING_LIMITS)?;
    tx.create(crate::format::schema::RATE_LOG)?;
    meta.insert(META_FORMAT_VERSION, FORMAT_VERSION)?;
    tx.checkpoint();
    Ok(Some(version))
}

/// The tables of the default queue and of every registered named queue.
fn all_queues(tx: GroupTx<'_>) -> Result<Vec<&'static crate::format::schema::QueueSchema>> {
    let mut queues = vec![&crate::format::schema::DEFAULT_SCHEMA];
    let registry = tx.table(QUEUES)?;
    for e in registry.iter()?.take(crate::limits::QUEUES_MAX as usize) {
        let number = e?.1.value();
        if (1..=crate::limits::QUEUES_MAX).contains(&number) {
            queues.push(crate::format::schema::QueueSchema::named(number));
        }
    }
    Ok(queues)
}

/// Format 6 to 7: the completed and cancelled indexes of every queue.
fn upgrade_6_to_7(tx: GroupTx<'_>) -> Result<()> {
    for schema in all_queues(tx)? {
        tx.create(schema.completed())?;
        tx.create(schema.cancelled())?;
    }
    Ok(())
}

/// Format 1 to 2: the time index of applied markers (markers of jobs' own ids dropped), the
/// jobs of each caller key (`idem_jobs`), the dedup-window tables, the dead jobs by when they died.
fn upgrade_1_to_2(tx: GroupTx<'_>) -> Result<()> {
    let schema = &crate::format::schema::DEFAULT_SCHEMA;
    let mut applied = tx.table(schema.applied())?;
    applied.retain(|k, _| k.first() != Some(&MARKER_TAG_ID))?;
    let mut by_time = tx.table(schema.applied_by_time())?;
    for e in applied.iter()? {
        let (k, at) = e?;
        by_time.insert((at.value(), k.value()), ())?;
    }
    let jobs = tx.table(schema.jobs())?;
    let mut idem_jobs = tx.table(schema.idem_jobs())?;
    for e in jobs.iter()? {
        let (id, row) = e?;
        if let Ok(record) = JobRecord::decode(row.value())
            && let Some(k) = record.idempotency_key.as_deref()
        {
            let key = marker_key(k);
            idem_jobs.insert((key.as_slice(), id.value()), ())?;
        }
    }
    tx.create(schema.dedup_windows())?;
    tx.create(schema.dedup_expiry())?;
    let mut dead_by_time = tx.table(schema.dead_by_time())?;
    for e in tx.table(schema.dead())?.iter()? {
        let id = e?.0.value();
        if let Some(row) = jobs.get(id)?
            && let Ok(record) = JobRecord::decode(row.value())
            && record.state == StoredState::Dead
        {
            dead_by_time.insert((record.run_at_ms, id), ())?;
        }
    }
    Ok(())
}

/// Format 2 to 3: every inline payload larger than `PAYLOAD_INLINE_MAX` moves to
/// `leaseq_payloads` (one job at a time, so memory holds one payload). A row that does not
/// decode is left for the passes that quarantine it.
fn upgrade_2_to_3(tx: GroupTx<'_>) -> Result<()> {
    let schema = &crate::format::schema::DEFAULT_SCHEMA;
    let mut jobs = tx.table(schema.jobs())?;
    let mut payloads = tx.table(schema.payloads())?;
    let mut large = Vec::new();
    for e in jobs.iter()? {
        let (id, row) = e?;
        if let Ok(record) = JobRecord::decode(row.value())
            && record.payload.len() > PAYLOAD_INLINE_MAX
        {
            large.push(id.value());
        }
    }
    for id in large {
        let mut record = match jobs.get(id)? {
            Some(row) => JobRecord::decode(row.value())?,
            None => continue,
        };
        let payload = std::mem::take(&mut record.payload);
        record.payload_apart = Some(PayloadRef::of(&payload));
        payloads.insert(id, payload.as_slice())?;
        record.check_invariants()?;
        jobs.insert(id, record.encode()?.as_slice())?;
    }
    Ok(())
}
