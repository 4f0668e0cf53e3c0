//! Operator actions on jobs by id or by state: requeue a dead job, remove a job, purge or
//! requeue up to a bound of one state.

use crate::events::Event;
use redb::ReadableTable;

use crate::commit::{Ctx, Verdict, refuse};
use crate::error::{Error, Result};
use crate::format::record::{JobRecord, StoredState};
use crate::format::schema::QueueSchema;
use crate::job::{CancelOutcome, JobId, JobState};

use super::read::IndexKey;
use super::tables::{Row, Tables};
use super::transition::set_due;
use super::validate::damaged;

pub(crate) fn requeue_dead(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    id: u64,
    now_ms: u64,
) -> Verdict<()> {
    let mut tables = Tables::open(ctx, schema)?;
    let record = match good_row(&tables, id)? {
        Ok(record) => record,
        Err(refusal) => return Ok(Err(refusal)),
    };
    if record.state != StoredState::Dead {
        return refuse(Error::InvalidState {
            job_id: JobId(id),
            actual: record.state.job_state(),
            expected: "Dead",
        });
    }
    requeue_record(&mut tables, ctx, id, record, now_ms).map(Ok)
}

/// Cancels job `id` with `reason` (already cut to `REASON_BYTES_MAX`) in queue `schema`, as
/// [`cancel_in`].
pub(crate) fn cancel(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    id: u64,
    reason: &str,
    now_ms: u64,
) -> Verdict<CancelOutcome> {
    let next_id = ctx.next_id();
    let mut tables = Tables::open(ctx, schema)?;
    cancel_in(&mut tables, next_id, id, reason, now_ms)
}

/// Cancels job `id` with `reason`: a scheduled, ready or dead job ends now; a leased one too,
/// its lease fenced: the row stays as cancelled at least until the lease's deadline, so that
/// lease's calls are answered `Cancelled` (and a group waits for that delivery,
/// `leaseq_group_fences`). The row is kept in the history (deleted when the queue keeps none
/// and nothing is fenced). A job that already ended (`AlreadyEnded`) or whose row is gone
/// while its id is below `next_id`, the file's next id, and no other queue holds it (`Gone`),
/// is answered with nothing written. Refused: `JobNotFound` for an id never handed out or
/// held by another queue, `Corrupted` for a damaged row.
pub(crate) fn cancel_in(
    tables: &mut Tables<'_>,
    next_id: u64,
    id: u64,
    reason: &str,
    now_ms: u64,
) -> Verdict<CancelOutcome> {
    let record = match tables.row(id)? {
        Row::Good(record) => record,
        Row::Damaged(why) => return refuse(damaged(id, &why)),
        Row::Missing if id > 0 && id < next_id && !tables.in_another_queue(id)? => {
            return Ok(Ok(CancelOutcome::Gone));
        }
        Row::Missing => return refuse(Error::JobNotFound { job_id: JobId(id) }),
    };
    if record.state.is_ended() {
        return Ok(Ok(CancelOutcome::AlreadyEnded {
            state: record.state.job_state(),
        }));
    }
    let was = record.state.job_state();
    let fenced_until_ms = match record.state {
        StoredState::Leased { deadline_ms, .. } => deadline_ms.max(now_ms),
        _ => now_ms,
    };
    let keep = !tables.history()?.is_off();
    tracing::info!(queue = tables.schema.queue_number, job_id = id, %reason, "leaseq: job cancelled");
    let end = StoredState::Cancelled {
        reason: reason.to_string(),
        fenced_until_ms,
    };
    tables.end_job(id, record, end, now_ms, keep)?;
    super::retention::prune_history(tables, now_ms, crate::limits::PRUNE_PER_ACK_MAX)?;
    let q = tables.schema.queue_number;
    tables.log().event(q, Event::Cancelled { id: JobId(id) });
    if was == JobState::Leased {
        tables.note_drained(now_ms)?;
    }
    Ok(Ok(CancelOutcome::Cancelled { was }))
}

/// The refusal of a retry, remove or purge of cancelled job `id` whose group still waits for
/// its delivery (its worker may still run): after that worker's ending call or its lease's
/// deadline.
fn still_running(id: u64) -> Error {
    Error::InvalidState {
        job_id: JobId(id),
        actual: JobState::Cancelled,
        expected: "a job whose cancelled delivery has ended (its group waits for it: until its worker's ack, ack_with, nack, snooze or fail, its lease's deadline, or the next open)",
    }
}

/// Job `id`'s good record, or the refusal (`JobNotFound`, `Corrupted`).
fn good_row(tables: &Tables<'_>, id: u64) -> Verdict<JobRecord> {
    match tables.row(id)? {
        Row::Good(record) => Ok(Ok(record)),
        Row::Damaged(why) => refuse(damaged(id, &why)),
        Row::Missing => refuse(Error::JobNotFound { job_id: JobId(id) }),
    }
}

/// Runs job `id` again: a dead, completed or cancelled job goes back to ready with its
/// attempts reset (a new attempt series), at the back of its priority; its error history
/// stays. An ended job holds its dedup key again (while live: a window that ended does not
/// run again) unless another job took it meanwhile (`KeyHeld`, nothing written); it carried
/// its idempotency key all along. A scheduled job (a delay, a backoff) is ready now as by
/// `Change::Promote`, its attempts kept, as River's `JobRetry` makes it available. Refused:
/// `JobNotFound`, `InvalidState` for a ready or leased job, `Corrupted`.
pub(crate) fn retry(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    id: u64,
    now_ms: u64,
) -> Verdict<()> {
    let mut tables = Tables::open(ctx, schema)?;
    retry_in(&mut tables, ctx, id, now_ms)
}

/// [`retry`] on the tables of an operation that holds them open.
pub(crate) fn retry_in(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    id: u64,
    now_ms: u64,
) -> Verdict<()> {
    let mut record = match good_row(tables, id)? {
        Ok(record) => record,
        Err(refusal) => return Ok(Err(refusal)),
    };
    match record.state {
        StoredState::Dead => {
            return requeue_record(tables, ctx, id, record, now_ms).map(Ok);
        }
        StoredState::Scheduled => {
            // Waiting for its delay or backoff: it runs now, its attempts and keys kept.
            tables.unindex(id, &record)?;
            set_due(ctx, tables.schema.queue_number, &mut record, now_ms, now_ms);
            return tables.put(id, &record).map(Ok);
        }
        StoredState::Cancelled { .. } if tables.still_fencing(id, &record)? => {
            return refuse(still_running(id));
        }
        StoredState::Completed { .. } | StoredState::Cancelled { .. } => {}
        _ => {
            return refuse(Error::InvalidState {
                job_id: JobId(id),
                actual: record.state.job_state(),
                expected: "Scheduled, Dead, Completed or Cancelled",
            });
        }
    }
    // Who holds the dedup key now, read without writing (a refusal writes nothing).
    let mut window_ended = None;
    let holder = match record.dedup_key.as_deref() {
        Some(k) => tables.dedup()?.get(k)?.map(|v| v.value()),
        None => None,
    };
    if let Some(k) = record.dedup_key.as_deref()
        && let Some(holder) = holder
    {
        let window_end_ms = tables.dedup_windows()?.get(k)?.map(|v| v.value());
        match window_end_ms {
            Some(end_ms) if end_ms <= now_ms => window_ended = Some(end_ms),
            _ if holder == id => {}
            _ => {
                return refuse(Error::KeyHeld {
                    job_id: JobId(id),
                    holder: JobId(holder),
                });
            }
        }
    }
    if let (Some(k), Some(end_ms)) = (record.dedup_key.clone(), window_ended) {
        tables.end_window(&k, end_ms)?;
    }
    ctx.wake(tables.schema.queue_number);
    tables.unindex(id, &record)?;
    if let Some(k) = record.dedup_key.clone()
        && tables.dedup()?.get(k.as_slice())?.is_none()
    {
        // Taken again while the job is live: a window that ended does not run again.
        tables.dedup_mut()?.insert(k.as_slice(), id)?;
        record.dedup_window_ms = None;
    }
    record.attempts = 0;
    record.run_at_ms = now_ms;
    record.seq = ctx.alloc_seq();
    record.state = StoredState::Ready;
    if record.group.is_some() {
        // Back at the end of its group, as SQS's redrive of a dead letter.
        record.group_order = ctx.alloc_seq();
    }
    tables.put(id, &record)?;
    let q = tables.schema.queue_number;
    tables.log().event(q, Event::Requeued { id: JobId(id) });
    Ok(Ok(()))
}

/// Releases dedup key `key` by hand: its entry and window go, and the live job that held it
/// no longer does (its record forgets the key). Returns the job the entry named, if any.
pub(crate) fn release_key(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    key: &[u8],
) -> Result<Option<u64>> {
    let mut tables = Tables::open(ctx, schema)?;
    let Some(holder) = tables.dedup()?.get(key)?.map(|v| v.value()) else {
        return Ok(None);
    };
    let window_end_ms = tables.dedup_windows()?.get(key)?.map(|v| v.value());
    match window_end_ms {
        Some(end_ms) => tables.end_window(key, end_ms)?,
        None => {
            tables.dedup_mut()?.remove(key)?;
        }
    }
    if let Row::Good(mut record) = tables.row(holder)?
        && !record.state.is_ended()
        && record.dedup_key.as_deref() == Some(key)
    {
        record.dedup_key = None;
        record.dedup_window_ms = None;
        record.dedup_until_started = false;
        // Its state, and so its index entry, is unchanged.
        record.check_invariants()?;
        tables
            .jobs_mut()
            .insert(holder, record.encode()?.as_slice())?;
    }
    Ok(Some(holder))
}

/// A change to a waiting job ([`update`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change<'a> {
    /// Due this many ms from now (0: ready now). Ready or scheduled jobs.
    DueIn(u64),
    /// Scheduled jobs only: ready now.
    Promote,
    /// A new priority. Ready, scheduled or dead jobs.
    Priority(i32),
    /// A new payload (raw bytes: the recorded encoding goes), checked against the queue's
    /// limit by the caller. Ready, scheduled or dead jobs.
    Payload(&'a [u8]),
}

/// Changes waiting job `id` as `change` says, keeping every index in step (a ready job that
/// stays ready keeps its place in line; one made ready goes to the back of its priority).
/// Refused, nothing written: `JobNotFound`; `InvalidState` for a leased or ended job, or a
/// state the change does not apply to; `Corrupted` for a damaged row; `InvalidOption` for a
/// due time that overflows.
pub(crate) fn update(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    id: u64,
    change: Change<'_>,
    now_ms: u64,
) -> Verdict<()> {
    let mut tables = Tables::open(ctx, schema)?;
    let mut record = match good_row(&tables, id)? {
        Ok(record) => record,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let state = record.state.job_state();
    let (applies, expected) = match change {
        Change::DueIn(_) => (
            matches!(state, JobState::Ready | JobState::Scheduled),
            "Ready or Scheduled",
        ),
        Change::Promote => (state == JobState::Scheduled, "Scheduled"),
        Change::Priority(_) | Change::Payload(_) => (
            matches!(
                state,
                JobState::Ready | JobState::Scheduled | JobState::Dead
            ),
            "Ready, Scheduled or Dead",
        ),
    };
    if !applies {
        return refuse(Error::InvalidState {
            job_id: JobId(id),
            actual: state,
            expected,
        });
    }
    let Some(due_ms) = now_ms.checked_add(match change {
        Change::DueIn(ms) => ms,
        _ => 0,
    }) else {
        return refuse(Error::invalid_option("delay", "due time overflows"));
    };
    tables.unindex(id, &record)?;
    match change {
        Change::DueIn(_) | Change::Promote => {
            set_due(ctx, schema.queue_number, &mut record, due_ms, now_ms);
        }
        Change::Priority(priority) => record.priority = priority,
        Change::Payload(payload) => {
            tables.replace_payload(id, &mut record, payload)?;
            record.encoding = None;
        }
    }
    tables.put(id, &record).map(Ok)
}

/// Moves job `id` (its good `record`, whose index entry is still in place) back to ready
/// with its attempts reset to 0, as a fresh job at the back of its priority.
fn requeue_record(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    id: u64,
    mut record: JobRecord,
    now_ms: u64,
) -> Result<()> {
    ctx.wake(tables.schema.queue_number);
    tables.unindex(id, &record)?;
    record.attempts = 0;
    record.run_at_ms = now_ms;
    record.seq = ctx.alloc_seq();
    record.state = StoredState::Ready;
    if record.group.is_some() {
        // Back at the end of its group, as SQS's redrive of a dead letter.
        record.group_order = ctx.alloc_seq();
    }
    tables.put(id, &record)?;
    let q = tables.schema.queue_number;
    tables.log().event(q, Event::Requeued { id: JobId(id) });
    Ok(())
}

/// Deletes a job that is not leased (scheduled, ready or dead), releasing its dedup key. A
/// damaged row (in any state: its state cannot be read) or a quarantined one is deleted too,
/// with every index and dedup entry naming it: these scans read whole tables, which only
/// damage repair pays. So is a leased job whose lease entry is missing (no sweep or reopen
/// can find it), and a dead-letter entry naming no job.
pub(crate) fn remove(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    id: u64,
    now_ms: u64,
) -> Verdict<()> {
    let mut tables = Tables::open(ctx, schema)?;
    remove_in(&mut tables, id, now_ms)
}

/// [`remove`] on the tables of an operation that holds them open.
pub(crate) fn remove_in(tables: &mut Tables<'_>, id: u64, now_ms: u64) -> Verdict<()> {
    match tables.row(id)? {
        Row::Good(record) => {
            if let StoredState::Leased { deadline_ms, .. } = record.state
                && tables.leases()?.get((deadline_ms, id))?.is_some()
            {
                return refuse(Error::InvalidState {
                    job_id: JobId(id),
                    actual: JobState::Leased,
                    expected: "Scheduled, Ready or Dead",
                });
            }
            if tables.still_fencing(id, &record)? {
                return refuse(still_running(id));
            }
            tables.delete_removed(id, &record, now_ms).map(Ok)
        }
        Row::Damaged(_) => {
            tables.ready_mut()?.retain(|(_, _, j), ()| j != id)?;
            tables.held_mut()?.retain(|(_, j), ()| j != id)?;
            tables.groups_mut()?.retain(|_, j| j != id)?;
            tables.scheduled_mut()?.retain(|(_, j), ()| j != id)?;
            tables.leases_mut()?.retain(|(_, j), ()| j != id)?;
            tables.dead_mut()?.remove(id)?;
            tables.dead_by_time_mut()?.retain(|(_, j), ()| j != id)?;
            tables.completed_mut()?.retain(|(_, j), ()| j != id)?;
            tables.cancelled_mut()?.retain(|(_, j), ()| j != id)?;
            tables.drop_keys_of(id)?;
            tables.jobs_mut().remove(id)?;
            tables.payloads_mut()?.remove(id)?;
            Ok(Ok(()))
        }
        Row::Missing => {
            // Looked up before anything is written: a refusal writes nothing.
            let quarantined = tables.is_quarantined(id)?;
            // A dead-letter entry naming no job is found by its id alone (the other indexes
            // are keyed by time or place: a pass that meets such an entry drops it).
            let stray_dead = tables.dead()?.get(id)?.is_some();
            if !quarantined && !stray_dead {
                return refuse(Error::JobNotFound { job_id: JobId(id) });
            }
            if quarantined {
                tables.remove_quarantined(id)?;
                tables.drop_keys_of(id)?;
                tables.payloads_mut()?.remove(id)?;
            }
            if stray_dead {
                tables.dead_mut()?.remove(id)?;
                tables.dead_by_time_mut()?.retain(|(_, j), ()| j != id)?;
            }
            Ok(Ok(()))
        }
    }
}

/// The index key a bulk pass gives a ready job held behind its group's head (a ready
/// entry's first part is a `u32` rank, so never this).
const HELD_KEY: u64 = u64::MAX;

/// Acts on up to `max` jobs of `state`, first in its index order: `Purge` deletes them
/// (releasing their dedup keys), `Requeue` moves dead jobs back to ready with their attempts
/// reset. A damaged row met on the way is quarantined, an entry naming no job dropped.
/// Returns how many jobs were purged or requeued, and whether entries are left.
pub(crate) fn bulk_by_state(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    state: JobState,
    action: BulkAction,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    debug_assert!(state != JobState::Leased);
    debug_assert!(action == BulkAction::Purge || state == JobState::Dead);
    let mut tables = Tables::open(ctx, schema)?;
    // (job id, its index key) of the first `max + 1` entries (one more tells if more are left).
    let ids: Vec<(u64, IndexKey)> = match state {
        JobState::Ready => {
            // The deliverable ones, then those held behind their group's head.
            let mut ids: Vec<(u64, IndexKey)> = tables
                .ready()?
                .iter()?
                .take(max + 1)
                .map(|e| {
                    e.map(|(k, _)| {
                        let (r, s, i) = k.value();
                        (i, (u64::from(r), s, i))
                    })
                })
                .collect::<Result<_, _>>()?;
            let room = (max + 1).saturating_sub(ids.len());
            for e in tables.held()?.iter()?.take(room) {
                let id = e?.0.value().1;
                ids.push((id, (HELD_KEY, 0, id)));
            }
            ids
        }
        JobState::Scheduled => first_timed(tables.scheduled()?, max + 1)?,
        JobState::Completed => first_timed(tables.completed()?, max + 1)?,
        JobState::Cancelled => first_timed(tables.cancelled()?, max + 1)?,
        JobState::Dead => tables
            .dead()?
            .iter()?
            .take(max + 1)
            .map(|e| e.map(|(k, _)| (k.value(), (k.value(), 0, 0))))
            .collect::<Result<_, _>>()?,
        JobState::Leased => return Ok((0, false)),
    };
    let mut more = ids.len() > max;
    let mut done = 0;
    for &(id, key) in ids.iter().take(max) {
        match tables.row(id)? {
            // A cancelled job whose group still waits for its delivery is left for later
            // (its worker may still run); a pass that only meets such rows stops.
            Row::Good(record)
                if state == JobState::Cancelled && tables.still_fencing(id, &record)? =>
            {
                more &= done > 0;
            }
            Row::Good(record) if record.state.job_state() == state => {
                match action {
                    BulkAction::Purge => tables.delete_removed(id, &record, now_ms)?,
                    BulkAction::Requeue => {
                        requeue_record(&mut tables, ctx, id, record, now_ms)?;
                    }
                }
                done += 1;
            }
            row => {
                // The entry does not match its row: drop it, then settle the row.
                match state {
                    JobState::Ready if key.0 == HELD_KEY => {
                        tables.held_mut()?.retain(|(_, j), ()| j != id)?;
                    }
                    JobState::Ready => {
                        tables.ready_mut()?.remove((key.0 as u32, key.1, key.2))?;
                    }
                    JobState::Scheduled => {
                        tables.scheduled_mut()?.remove((key.0, key.1))?;
                    }
                    JobState::Completed => {
                        tables.completed_mut()?.remove((key.0, key.1))?;
                    }
                    JobState::Cancelled => {
                        tables.cancelled_mut()?.remove((key.0, key.1))?;
                    }
                    _ => {
                        tables.dead_mut()?.remove(id)?;
                        tables.dead_by_time_mut()?.retain(|(_, j), ()| j != id)?;
                    }
                }
                tables.repair_stray_entry(id, row, now_ms)?;
            }
        }
    }
    Ok((done, more))
}

/// The first `n` entries of a `(time_ms, job id)` index: each job id with its index key.
fn first_timed(index: &redb::Table<'_, (u64, u64), ()>, n: usize) -> Result<Vec<(u64, IndexKey)>> {
    let mut out = Vec::new();
    for e in index.iter()?.take(n) {
        let (at, id) = e?.0.value();
        out.push((id, (at, id, 0)));
    }
    Ok(out)
}

/// What [`bulk_by_state`] does to each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BulkAction {
    Purge,
    Requeue,
}
