//! A queue's size limit in the engine (`leaseq_queue_limits`, since format 13; its row is
//! `format::queue_limit`): set and read, checked by every enqueue before its first write,
//! and room made by dropping the oldest waiting jobs when the limit says so. The payload
//! bytes of a limited queue's counted jobs are kept in the row by `Tables::count_bytes`,
//! at every move of a job in or out of the counted states.

use std::collections::HashSet;

use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata};

use crate::commit::{Ctx, GroupTx};
use crate::error::{Error, Result};
use crate::events::Event;
use crate::format::queue_limit::{self, BLOCK_WAIT_MAX_MS, LimitRow};
use crate::format::record::JobRecord;
use crate::format::schema::{DROPPED, QUEUE_LIMITS, QueueSchema, ReadyKey};
use crate::job::JobId;
use crate::limits::DROP_PER_ENQUEUE_MAX;
use crate::queue_limit::{QueueLimit, WhenFull};

use super::tables::{Row, Tables};
use super::validate::NewJob;

/// Checks a limit: `InvalidOption` for no bound at all (remove the limit with `None`), a
/// bound of 0, or a block wait of 0 ms or above an hour.
pub(crate) fn validate_limit(limit: &QueueLimit) -> Result<()> {
    if limit.max_jobs.is_none() && limit.max_bytes.is_none() {
        return Err(Error::invalid_option(
            "limit",
            "neither max_jobs nor max_bytes: pass None to remove the limit",
        ));
    }
    if limit.max_jobs == Some(0) || limit.max_bytes == Some(0) {
        return Err(Error::invalid_option(
            "limit",
            "a bound of 0: at least 1 (pause the queue to stop its deliveries)",
        ));
    }
    if let WhenFull::Block { wait_ms } = limit.when_full
        && !(1..=BLOCK_WAIT_MAX_MS).contains(&wait_ms)
    {
        return Err(Error::invalid_option(
            "when_full",
            format!("a wait of {wait_ms} ms: 1 ms to {BLOCK_WAIT_MAX_MS} ms"),
        ));
    }
    Ok(())
}

/// Sets (or with `None` removes) queue `schema`'s limit; whether it changed. A new row
/// counts the payload bytes of the queue's jobs (one pass over them); a changed limit keeps
/// its count.
pub(crate) fn set_limit(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    limit: Option<QueueLimit>,
) -> Result<bool> {
    let n = schema.queue_number;
    let current = ctx.table(QUEUE_LIMITS)?.get(n)?.map(|v| v.value());
    let row = match (limit, current) {
        (None, None) => return Ok(false),
        (None, Some(_)) => {
            ctx.table(QUEUE_LIMITS)?.remove(n)?;
            return Ok(true);
        }
        (Some(l), Some(row)) => {
            debug_assert!(validate_limit(&l).is_ok());
            if queue_limit::decode(n, row).ok() == Some(l) {
                return Ok(false);
            }
            queue_limit::encode(&l, row.3)
        }
        (Some(l), None) => {
            debug_assert!(validate_limit(&l).is_ok());
            let mut tables = Tables::open(ctx, schema)?;
            let bytes = counted_bytes_of(&mut tables)?;
            drop(tables);
            queue_limit::encode(&l, bytes)
        }
    };
    ctx.table(QUEUE_LIMITS)?.insert(n, row)?;
    Ok(true)
}

/// The payload bytes of the counted jobs of `tables`' queue, from their rows (a damaged row
/// counts nothing).
pub(super) fn counted_bytes_of(tables: &mut Tables<'_>) -> Result<u64> {
    let mut ids: Vec<u64> = Vec::new();
    for e in tables.ready()?.iter()? {
        ids.push(e?.0.value().2);
    }
    for e in tables.held()?.iter()? {
        ids.push(e?.0.value().1);
    }
    for e in tables.scheduled()?.iter()? {
        ids.push(e?.0.value().1);
    }
    for e in tables.leases()?.iter()? {
        ids.push(e?.0.value().1);
    }
    let mut bytes = 0u64;
    for id in ids {
        if let Row::Good(r) = tables.row(id)? {
            bytes = bytes.saturating_add(r.payload_len() as u64);
        }
    }
    Ok(bytes)
}

/// Queue `queue_number`'s limit and the payload bytes of its counted jobs, in a snapshot
/// (`None` without a limit, or in a file of format 12 or older).
pub(crate) fn limit_of(
    rtx: &ReadTransaction,
    queue_number: u32,
) -> Result<Option<(QueueLimit, u64)>> {
    let table = match rtx.open_table(QUEUE_LIMITS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(row) = table.get(queue_number)?.map(|v| v.value()) else {
        return Ok(None);
    };
    Ok(Some((queue_limit::decode(queue_number, row)?, row.3)))
}

/// How many jobs queue `queue_number` dropped to make room, in a snapshot.
pub(crate) fn dropped_of(rtx: &ReadTransaction, queue_number: u32) -> Result<u64> {
    match rtx.open_table(DROPPED) {
        Ok(t) => Ok(t.get(queue_number)?.map_or(0, |v| v.value())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// The limit row of queue `queue_number` in a write transaction, if it has one.
pub(super) fn row_of(gtx: GroupTx<'_>, queue_number: u32) -> Result<Option<LimitRow>> {
    Ok(gtx
        .table(QUEUE_LIMITS)?
        .get(queue_number)?
        .map(|v| v.value()))
}

/// What an enqueue of `jobs` adds to the queue at most: (new jobs, their payload bytes). A
/// job whose dedup key is held (by a live job, a running window, or an earlier job of the
/// batch) adds no job, and its payload only if it may replace the holder's.
fn needs(tables: &mut Tables<'_>, jobs: &[NewJob], now_ms: u64) -> Result<(u64, u64)> {
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let (mut count, mut bytes) = (0u64, 0u64);
    for job in jobs {
        let len = job.record.payload.len() as u64;
        let held = match &job.record.dedup_key {
            None => false,
            Some(k) => !seen.insert(k.as_slice()) || key_held(tables, k, now_ms)?,
        };
        if !held {
            count += 1;
            bytes = bytes.saturating_add(len);
        } else if job.on_duplicate != crate::job::OnDuplicate::Keep {
            bytes = bytes.saturating_add(len);
        }
    }
    Ok((count, bytes))
}

/// Whether dedup key `k` is held at `now_ms`, read only (`Tables::key_holder` releases an
/// ended window).
fn key_held(tables: &mut Tables<'_>, k: &[u8], now_ms: u64) -> Result<bool> {
    if tables.dedup()?.get(k)?.is_none() {
        return Ok(false);
    }
    Ok(match tables.dedup_windows()?.get(k)?.map(|v| v.value()) {
        Some(end_ms) => end_ms > now_ms,
        None => true,
    })
}

/// How many jobs queue `tables` counts: scheduled, ready (held included) and leased.
pub(super) fn counted_jobs(tables: &mut Tables<'_>) -> Result<u64> {
    Ok(tables.ready()?.len()?
        + tables.held()?.len()?
        + tables.scheduled()?.len()?
        + tables.leases()?.len()?)
}

/// Before the first write of an enqueue of `jobs` (judged at `now_ms`) into `tables`' queue:
/// `Ok(Ok(()))` if they fit its limit (or it has none), the oldest waiting jobs dropped
/// first when the limit says so; `Ok(Err(QueueFull))`, nothing written, if they do not.
pub(super) fn make_room(
    tables: &mut Tables<'_>,
    gtx: GroupTx<'_>,
    jobs: &[NewJob],
    now_ms: u64,
) -> Result<std::result::Result<(), Error>> {
    let n = tables.schema.queue_number;
    let Some(row) = row_of(gtx, n)? else {
        tables.note_limited(false);
        return Ok(Ok(()));
    };
    tables.note_limited(true);
    let limit = queue_limit::decode(n, row)?;
    let (need_jobs, need_bytes) = needs(tables, jobs, now_ms)?;
    let (count, bytes) = (counted_jobs(tables)?, row.3);
    let fits = |count: u64, bytes: u64| {
        limit
            .max_jobs
            .is_none_or(|m| need_jobs == 0 || count.saturating_add(need_jobs) <= m)
            && limit
                .max_bytes
                .is_none_or(|m| need_bytes == 0 || bytes.saturating_add(need_bytes) <= m)
    };
    if fits(count, bytes) {
        return Ok(Ok(()));
    }
    let full = Error::QueueFull {
        queue: super::registry::name_of(gtx, n)?,
        jobs: count,
        bytes,
        max_jobs: limit.max_jobs,
        max_bytes: limit.max_bytes,
        needs_jobs: need_jobs,
        needs_bytes: need_bytes,
    };
    if limit.when_full != WhenFull::DropOldest {
        return Ok(Err(full));
    }
    let keys: HashSet<&[u8]> = jobs
        .iter()
        .filter_map(|j| j.record.dedup_key.as_deref())
        .collect();
    let Some(victims) = victims(tables, &keys, count, bytes, &fits)? else {
        return Ok(Err(full));
    };
    for (id, record) in &victims {
        tables.delete_removed(*id, record, now_ms)?;
        tables.log().event(n, Event::Dropped { id: JobId(*id) });
    }
    let mut dropped = gtx.table(DROPPED)?;
    let before = dropped.get(n)?.map_or(0, |v| v.value());
    dropped.insert(n, before.saturating_add(victims.len() as u64))?;
    Ok(Ok(()))
}

/// The oldest waiting jobs whose dropping makes the counts (`count`, `bytes`) fit, in the
/// order they go: ready jobs of the priority served last first (the highest rank), in their
/// order of delivery, then
/// scheduled jobs by due time; none holding one of `keys` (the enqueue's own dedup keys).
/// `None` if all those that can go (at most [`DROP_PER_ENQUEUE_MAX`]) are not enough.
fn victims(
    tables: &mut Tables<'_>,
    keys: &HashSet<&[u8]>,
    mut count: u64,
    mut bytes: u64,
    fits: &dyn Fn(u64, u64) -> bool,
) -> Result<Option<Vec<(u64, JobRecord)>>> {
    let mut out = Vec::new();
    let mut cursor = Cursor::Ready(None);
    let mut looked = 0usize;
    while looked < DROP_PER_ENQUEUE_MAX {
        let (chunk, next) = next_candidates(tables, cursor)?;
        if chunk.is_empty() {
            return Ok(None);
        }
        cursor = next;
        for id in chunk {
            looked += 1;
            let Row::Good(record) = tables.row(id)? else {
                continue;
            };
            if record
                .dedup_key
                .as_deref()
                .is_some_and(|k| keys.contains(k))
            {
                continue;
            }
            count = count.saturating_sub(1);
            bytes = bytes.saturating_sub(record.payload_len() as u64);
            out.push((id, record));
            if fits(count, bytes) {
                return Ok(Some(out));
            }
        }
    }
    Ok(None)
}

/// Where the look for jobs to drop goes on: after a ready index entry (in the order ranks
/// descending, then place ascending), or after a scheduled one.
#[derive(Clone, Copy)]
enum Cursor {
    Ready(Option<ReadyKey>),
    Scheduled(Option<(u64, u64)>),
}

/// How many candidates one look reads.
const CHUNK: usize = 32;

/// The next candidates after `cursor` (empty when none is left), and the cursor after them.
fn next_candidates(tables: &mut Tables<'_>, cursor: Cursor) -> Result<(Vec<u64>, Cursor)> {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    if let Cursor::Ready(after) = cursor {
        let ready = tables.ready()?;
        let read = |from: std::ops::Bound<ReadyKey>, rank: u32| -> Result<Vec<ReadyKey>> {
            Ok(ready
                .range::<ReadyKey>((from, Included((rank, u64::MAX, u64::MAX))))?
                .take(CHUNK)
                .map(|e| e.map(|(k, _)| k.value()))
                .collect::<std::result::Result<_, _>>()?)
        };
        // The entries after `after` in its rank.
        if let Some(k) = after {
            let keys = read(Excluded(k), k.0)?;
            if let Some(&last) = keys.last() {
                return Ok((
                    keys.iter().map(|k| k.2).collect(),
                    Cursor::Ready(Some(last)),
                ));
            }
        }
        // Else the first of the highest rank below it (the priority served last of those
        // left).
        let upper = match after {
            Some(k) => Excluded((k.0, 0, 0)),
            None => Unbounded,
        };
        if let Some(e) = ready.range::<ReadyKey>((Unbounded, upper))?.next_back() {
            let rank = e?.0.value().0;
            let keys = read(Included((rank, 0, 0)), rank)?;
            if let Some(&last) = keys.last() {
                return Ok((
                    keys.iter().map(|k| k.2).collect(),
                    Cursor::Ready(Some(last)),
                ));
            }
        }
        return next_candidates(tables, Cursor::Scheduled(None));
    }
    let Cursor::Scheduled(after) = cursor else {
        unreachable!("ready cursors are handled above")
    };
    let lower = match after {
        Some(k) => Excluded(k),
        None => Unbounded,
    };
    let keys: Vec<(u64, u64)> = tables
        .scheduled()?
        .range::<(u64, u64)>((lower, Unbounded))?
        .take(CHUNK)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<std::result::Result<_, _>>()?;
    let next = Cursor::Scheduled(keys.last().copied().or(after));
    Ok((keys.iter().map(|k| k.1).collect(), next))
}
