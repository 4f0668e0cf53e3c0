//! Read-only views over a `ReadTransaction`: what a dequeue would find, stats, one job, its
//! payload, lists, quarantine, applied markers.

use redb::ReadableTableMetadata;
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable};

use crate::error::{Error, Result};
use crate::format::record::{JobRecord, StoredState};
use crate::format::schema::{QuarantineValue, QueueSchema, ReadyKey, marker_key};
use crate::job::{JobId, JobInfo, JobState, Quarantined, Stats};

use super::validate::damaged;

/// What a dequeue would find, read without a write transaction: whether anything is ready,
/// due or expired now (a scheduled job, a lease, a schedule of the queue; dead jobs over
/// `dead_jobs_max`, for the sweep to delete), and the earliest future due time or lease
/// deadline.
pub(crate) fn peek_due(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    now_ms: u64,
    dead_jobs_max: Option<u64>,
) -> Result<(bool, Option<u64>)> {
    // A rate-limited queue whose window is used up has nothing to do until the window ends.
    if let Some(window_end_ms) = super::rate_limit::limited_until(rtx, schema.queue_number, now_ms)?
    {
        return Ok((false, Some(window_end_ms)));
    }
    let ready = rtx.open_table(schema.ready())?;
    if !ready.is_empty()? {
        return Ok((true, None));
    }
    // Dead jobs over their count are the sweep's to delete.
    if let Some(kept) = dead_jobs_max
        && rtx.open_table(schema.dead())?.len()? > kept
    {
        return Ok((true, None));
    }
    let first_key = |def| -> Result<Option<u64>> {
        let table = rtx.open_table::<(u64, u64), ()>(def)?;
        let first = table.first()?;
        Ok(first.map(|(k, _)| k.value().0))
    };
    let next_run = first_key(schema.scheduled())?;
    let next_deadline = first_key(schema.leases())?;
    let next_schedule = super::schedule::next_due(rtx, schema.queue_number)?;
    let next_fence = first_fence(rtx, schema.queue_number)?;
    let next = [next_run, next_deadline, next_schedule, next_fence]
        .into_iter()
        .flatten()
        .min();
    let work = next.is_some_and(|at_ms| at_ms <= now_ms);
    Ok((work, next))
}

/// The earliest deadline of a cancelled delivery an ordered group of queue `queue_number`
/// waits for (`leaseq_group_fences`), if any.
fn first_fence(rtx: &ReadTransaction, queue_number: u32) -> Result<Option<u64>> {
    let fences = match rtx.open_table(crate::format::schema::GROUP_FENCES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let first = fences
        .range((queue_number, 0, 0)..=(queue_number, u64::MAX, u64::MAX))?
        .next()
        .transpose()?;
    Ok(first.map(|(k, _)| k.value().1))
}

/// What a dequeue of a paused queue would find, read without a write transaction: whether
/// a scheduled job is due now (for [`promote_due_paused`](super::promote_due_paused) to move
/// to ready), and the earliest due time of its scheduled jobs, past or future. Ready jobs,
/// leases and schedules wait for the resume.
pub(crate) fn peek_due_paused(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    now_ms: u64,
) -> Result<(bool, Option<u64>)> {
    let scheduled = rtx.open_table(schema.scheduled())?;
    let first = scheduled.first()?.map(|(k, _)| k.value().0);
    Ok((first.is_some_and(|at_ms| at_ms <= now_ms), first))
}

pub(crate) fn stats(rtx: &ReadTransaction, schema: &'static QueueSchema) -> Result<Stats> {
    let completed = rtx.open_table(schema.completed())?.len()?;
    let cancelled = rtx.open_table(schema.cancelled())?.len()?;
    let limit = super::queue_limit::limit_of(rtx, schema.queue_number)?;
    Ok(Stats {
        total: rtx
            .open_table(schema.jobs())?
            .len()?
            .saturating_sub(completed + cancelled),
        scheduled: rtx.open_table(schema.scheduled())?.len()?,
        ready: rtx.open_table(schema.ready())?.len()?
            + match rtx.open_table(schema.held()) {
                Ok(held) => held.len()?,
                Err(redb::TableError::TableDoesNotExist(_)) => 0,
                Err(e) => return Err(e.into()),
            },
        leased: rtx.open_table(schema.leases())?.len()?,
        dead: rtx.open_table(schema.dead())?.len()?,
        applied: rtx.open_table(schema.applied())?.len()?,
        dedup_keys: rtx.open_table(schema.dedup())?.len()?,
        quarantined: match quarantine_table(rtx, schema)? {
            Some(q) => q.len()?,
            None => 0,
        },
        paused: super::control::paused_queues(rtx)?
            .iter()
            .any(|&(n, _)| n == schema.queue_number),
        completed,
        cancelled,
        limit: limit.map(|(l, _)| l),
        payload_bytes: limit.map(|(_, bytes)| bytes),
        dropped: super::queue_limit::dropped_of(rtx, schema.queue_number)?,
        storage_full_ms: rtx
            .open_table(crate::format::schema::META)?
            .get(crate::format::schema::META_STORAGE_FULL_MS)?
            .map(|v| v.value())
            .filter(|&ms| ms != 0),
    })
}

/// `leaseq_quarantine` in a snapshot, or `None` if nothing was ever quarantined in the file.
pub(super) fn quarantine_table(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
) -> Result<Option<ReadOnlyTable<u64, QuarantineValue>>> {
    match rtx.open_table(schema.quarantine()) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Up to `max` quarantined rows, by job id, from `after` (exclusive) on.
pub(crate) fn quarantined(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    after: Option<u64>,
    max: usize,
) -> Result<Vec<Quarantined>> {
    let Some(q) = quarantine_table(rtx, schema)? else {
        return Ok(Vec::new());
    };
    let start = after.map_or(0, |a| a.saturating_add(1));
    if after == Some(u64::MAX) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in q.range(start..)?.take(max) {
        let (k, v) = e?;
        let (quarantined_ms, reason, raw) = v.value();
        out.push(Quarantined {
            job_id: JobId(k.value()),
            quarantined_ms,
            reason: reason.to_string(),
            record_bytes: raw.len(),
        });
    }
    Ok(out)
}

/// The bytes of a quarantined row as they were found, or `None` if `id` is not quarantined.
pub(crate) fn quarantined_record(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    id: u64,
) -> Result<Option<Vec<u8>>> {
    let Some(q) = quarantine_table(rtx, schema)? else {
        return Ok(None);
    };
    Ok(q.get(id)?.map(|v| v.value().2.to_vec()))
}

pub(crate) fn job(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    id: u64,
) -> Result<Option<JobInfo>> {
    match record(rtx, schema, id)? {
        Some(record) => Ok(Some(info(id, record))),
        None => quarantined_error(rtx, schema, id).map(|()| None),
    }
}

/// Job `id`'s record, checked (`Corrupted` for a row that fails its checks); `None` when
/// `leaseq_jobs` has no row for it.
fn record(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    id: u64,
) -> Result<Option<JobRecord>> {
    let jobs = rtx.open_table(schema.jobs())?;
    let Some(v) = jobs.get(id)? else {
        return Ok(None);
    };
    JobRecord::decode(v.value())
        .map(Some)
        .map_err(|e| damaged(id, &e.to_string()))
}

/// For job `id` when it is ready but held behind the head of its ordered group (in
/// `leaseq_held`): the head's id. `None` for any other job, or one not there.
pub(crate) fn held_behind(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    id: u64,
) -> Result<Option<JobId>> {
    let Some(record) = record(rtx, schema, id)? else {
        return Ok(None);
    };
    let (StoredState::Ready, Some(g)) = (&record.state, record.group.as_deref()) else {
        return Ok(None);
    };
    let held = match rtx.open_table(schema.held()) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if held.get((g, id))?.is_none() {
        return Ok(None);
    }
    let groups = rtx.open_table(schema.groups())?;
    let head = groups
        .range((g, 0)..=(g, u64::MAX))?
        .next()
        .transpose()?
        .map(|(_, v)| v.value());
    Ok(head.filter(|&h| h != id).map(JobId))
}

/// `Corrupted` if job `id` (not in `leaseq_jobs`) is quarantined.
fn quarantined_error(rtx: &ReadTransaction, schema: &'static QueueSchema, id: u64) -> Result<()> {
    if let Some(q) = quarantine_table(rtx, schema)?
        && let Some(v) = q.get(id)?
    {
        return Err(Error::corrupted(format!(
            "job {id} is quarantined: {}",
            v.value().1
        )));
    }
    Ok(())
}

/// A job as callers see it.
pub(super) fn info(id: u64, record: JobRecord) -> JobInfo {
    let (lease_token, lease_deadline_ms) = match record.state {
        StoredState::Leased { token, deadline_ms } => (Some(token), Some(deadline_ms)),
        _ => (None, None),
    };
    let payload_bytes = record.payload_len();
    JobInfo {
        id: JobId(id),
        state: record.state.job_state(),
        attempts: record.attempts,
        max_attempts: record.max_attempts,
        priority: record.priority,
        run_at_ms: record.run_at_ms,
        leased_ms: matches!(record.state, StoredState::Leased { .. }).then_some(record.run_at_ms),
        died_ms: (record.state == StoredState::Dead).then_some(record.run_at_ms),
        lease_deadline_ms,
        lease_token,
        created_ms: record.created_ms,
        last_error: record.last_error().map(str::to_owned),
        errors: record
            .errors
            .iter()
            .map(|e| crate::job::AttemptError {
                attempt: e.attempt,
                at_ms: e.at_ms,
                message: e.message.clone(),
            })
            .collect(),
        status: record.status.clone(),
        group: record.group.clone(),
        progress: record.progress.as_ref().map(|p| p.value.clone()),
        progress_ms: record.progress.as_ref().map(|p| p.at_ms),
        ended_ms: record.state.is_ended().then_some(record.run_at_ms),
        cancel_reason: match &record.state {
            StoredState::Cancelled { reason, .. } => Some(reason.clone()),
            _ => None,
        },
        result: match &record.state {
            StoredState::Completed { result } => result.clone(),
            _ => None,
        },
        idempotency_key: record.idempotency_key,
        dedup_key: record.dedup_key,
        payload_bytes,
        snoozes: record.snoozes,
        lease_ms: record.lease_ms,
        // A stored policy was validated when the record was read.
        retry: record.retry.and_then(|r| r.policy().ok()),
        dedup_window_ms: record.dedup_window_ms,
        timeout_ms: record.timeout_ms,
        encoding: record
            .encoding
            .and_then(crate::format::payload::Encoding::from_tag),
    }
}

/// The payload of job `id`, or `None` if no such job.
pub(crate) fn payload(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    id: u64,
) -> Result<Option<Vec<u8>>> {
    let jobs = rtx.open_table(schema.jobs())?;
    let Some(v) = jobs.get(id)? else {
        return quarantined_error(rtx, schema, id).map(|()| None);
    };
    let record = JobRecord::decode(v.value()).map_err(|e| damaged(id, &e.to_string()))?;
    let Some(r) = record.payload_apart else {
        return Ok(Some(record.payload));
    };
    let payloads = rtx.open_table(schema.payloads())?;
    let v = payloads
        .get(id)?
        .ok_or_else(|| damaged(id, "payload: stored apart, but its row is missing"))?;
    r.verify(v.value())
        .map_err(|e| damaged(id, &e.to_string()))?;
    Ok(Some(v.value().to_vec()))
}

/// A place in one state's index, as a `(u64, u64, u64)` key: ready `(rank, seq, id)`,
/// scheduled `(run_at_ms, id, 0)`, leased `(deadline_ms, id, 0)`, dead `(id, 0, 0)`,
/// completed and cancelled `(history_ms, id, 0)`.
pub(crate) type IndexKey = (u64, u64, u64);

/// The first part of a ready listing's cursor past the deliverable jobs: among the held ones.
const HELD: u64 = u64::MAX;

/// Up to `limit` jobs in `state`, in that state's index order (ready: the order they will be
/// dequeued; scheduled: by due time; leased: by deadline; dead: by id; completed: by when
/// they completed; cancelled: by when their row may go), after `after`. Rows
/// that fail their checks are skipped (`check` reports them). Returns the jobs and, when the
/// page is full, the key of its last entry, to continue from.
///
/// `backward`: the jobs just before `after` (or the last ones), in the reverse order, for
/// every state but ready (the caller refuses it). Also returns the key of the page's first
/// entry, to page the other way from.
pub(crate) fn list(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    state: JobState,
    after: Option<IndexKey>,
    limit: usize,
    backward: bool,
) -> Result<ListPage> {
    debug_assert!(!(backward && state == JobState::Ready));
    let keys: Vec<IndexKey> = match state {
        JobState::Ready => {
            // The deliverable ones in queue order, then those held behind their group's
            // head (their cursor: (u64::MAX, how many held ones came before, id)).
            let mut keys: Vec<IndexKey> = Vec::new();
            let held_from = match after {
                Some((HELD, skip, _)) => Some(skip),
                _ => None,
            };
            if held_from.is_none() {
                let index = rtx.open_table(schema.ready())?;
                let from = after.map(|(r, s, i)| (r as u32, s, i));
                let it = match from {
                    Some(k) => {
                        index.range((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded))?
                    }
                    None => index.range::<ReadyKey>(..)?,
                };
                for e in it.take(limit) {
                    let (r, s, i) = e?.0.value();
                    keys.push((u64::from(r), s, i));
                }
            }
            // Group by group (by key bytes), each in the order its jobs will be delivered:
            // the group's members in join order, those held among them.
            if keys.len() < limit
                && let (Ok(groups), Ok(held)) = (
                    rtx.open_table(schema.groups()),
                    rtx.open_table(schema.held()),
                )
            {
                let skip = held_from.unwrap_or(0);
                let mut n = 0u64;
                // Only the groups with a held job are read: the next one after each.
                let mut after: Option<Vec<u8>> = None;
                'groups: loop {
                    let first = match &after {
                        None => held.iter()?.next(),
                        Some(g) => held
                            .range((
                                std::ops::Bound::Excluded((g.as_slice(), u64::MAX)),
                                std::ops::Bound::Unbounded,
                            ))?
                            .next(),
                    };
                    let Some(first) = first else { break };
                    let g = first?.0.value().0.to_vec();
                    for e in groups.range((g.as_slice(), 0)..=(g.as_slice(), u64::MAX))? {
                        let id = e?.1.value();
                        if held.get((g.as_slice(), id))?.is_none() {
                            continue;
                        }
                        n += 1;
                        if n > skip {
                            keys.push((HELD, n, id));
                            if keys.len() >= limit {
                                break 'groups;
                            }
                        }
                    }
                    after = Some(g);
                }
            }
            keys
        }
        JobState::Scheduled | JobState::Leased | JobState::Completed | JobState::Cancelled => {
            let def = match state {
                JobState::Scheduled => schema.scheduled(),
                JobState::Leased => schema.leases(),
                JobState::Completed => schema.completed(),
                _ => schema.cancelled(),
            };
            let index = rtx.open_table(def)?;
            use std::ops::Bound::{Excluded, Unbounded};
            let it = match (after, backward) {
                (Some((a, b, _)), false) => index.range((Excluded((a, b)), Unbounded))?,
                (Some((a, b, _)), true) => index.range((Unbounded, Excluded((a, b))))?,
                (None, _) => index.range::<(u64, u64)>(..)?,
            };
            let key = |e: Result<_, redb::StorageError>| {
                e.map(|(k, _): (redb::AccessGuard<'_, (u64, u64)>, _)| {
                    let (a, b) = k.value();
                    (a, b, 0)
                })
            };
            if backward {
                it.rev().take(limit).map(key).collect::<Result<_, _>>()?
            } else {
                it.take(limit).map(key).collect::<Result<_, _>>()?
            }
        }
        JobState::Dead => {
            let index = rtx.open_table(schema.dead())?;
            use std::ops::Bound::{Excluded, Unbounded};
            let it = match (after, backward) {
                (Some((id, _, _)), false) => index.range((Excluded(id), Unbounded))?,
                (Some((id, _, _)), true) => index.range((Unbounded, Excluded(id)))?,
                (None, _) => index.range::<u64>(..)?,
            };
            let key = |e: Result<_, redb::StorageError>| {
                e.map(|(k, _): (redb::AccessGuard<'_, u64>, _)| (k.value(), 0, 0))
            };
            if backward {
                it.rev().take(limit).map(key).collect::<Result<_, _>>()?
            } else {
                it.take(limit).map(key).collect::<Result<_, _>>()?
            }
        }
    };
    let jobs = rtx.open_table(schema.jobs())?;
    let mut out = Vec::with_capacity(keys.len());
    for &key in &keys {
        let id = match state {
            JobState::Ready => key.2,
            JobState::Scheduled | JobState::Leased | JobState::Completed | JobState::Cancelled => {
                key.1
            }
            JobState::Dead => key.0,
        };
        if let Some(v) = jobs.get(id)?
            && let Ok(record) = JobRecord::decode(v.value())
            && record.state.job_state() == state
        {
            out.push(info(id, record));
        }
    }
    // A full page may have more after it; a short one reached the end.
    let next = if keys.len() == limit {
        keys.last().copied()
    } else {
        None
    };
    Ok(ListPage {
        jobs: out,
        next,
        first: keys.first().copied(),
    })
}

/// A page of [`list`]: its jobs, the key to continue from (when the page is full) and the
/// key of its first entry.
pub(crate) struct ListPage {
    pub(crate) jobs: Vec<JobInfo>,
    pub(crate) next: Option<IndexKey>,
    pub(crate) first: Option<IndexKey>,
}

/// Whether the applied-ids marker for this idempotency key exists.
pub(crate) fn is_applied(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    key: &[u8],
) -> Result<bool> {
    Ok(rtx
        .open_table(schema.applied())?
        .get(marker_key(key).as_slice())?
        .is_some())
}

/// Up to `limit` dead jobs, the most recently dead first (by the dead jobs' time index); a row
/// that fails its checks is skipped.
pub(crate) fn latest_dead(
    rtx: &ReadTransaction,
    schema: &'static QueueSchema,
    limit: usize,
) -> Result<Vec<JobInfo>> {
    let index = rtx.open_table(schema.dead_by_time())?;
    let jobs = rtx.open_table(schema.jobs())?;
    let mut out = Vec::new();
    for e in index.range::<(u64, u64)>(..)?.rev().take(limit) {
        let (_, id) = e?.0.value();
        if let Some(v) = jobs.get(id)?
            && let Ok(record) = JobRecord::decode(v.value())
            && record.state.job_state() == JobState::Dead
        {
            out.push(info(id, record));
        }
    }
    Ok(out)
}
