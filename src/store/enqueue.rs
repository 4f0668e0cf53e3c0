//! Enqueue (new and imported records) and `Queue::write`: a caller's closure inside the group
//! transaction, with the `Sink` that collects the jobs it enqueues.

use redb::ReadableTable;

use crate::commit::{Ctx, Verdict, refuse};
use crate::error::{BoxError, Error, Result};
use crate::events::Event;
use crate::format::record::{JobRecord, StoredState};
use crate::format::schema::QueueSchema;
use crate::job::{Enqueued, JobId, OnDuplicate};
use crate::limits::PRUNE_PER_ACK_MAX;

use super::retention::prune_windows;
use super::tables::{Row, Tables};
use super::transition::set_due;
use super::validate::NewJob;

/// Adds new validated records (from [`new_records`](super::validate::new_records)) in order.
/// A dedup key held by a live job, or by an earlier record of the same batch, makes that
/// record a `Duplicate` (a record that extends windows moves the end of a window holding
/// it); key holders and windows are judged at each record's `created_ms` (now). Refused `QueueFull`, having written nothing, when the jobs do not fit the queue's
/// size limit, and `StorageFull` while the file is within its disk reserve.
pub(crate) fn enqueue(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    jobs: &[NewJob],
) -> Verdict<Vec<Enqueued>> {
    let mut tables = Tables::open(ctx, schema)?;
    full_is_refused(enqueue_into(&mut tables, ctx, jobs, None))
}

/// An enqueue's `QueueFull` or `StorageFull` (returned before its first write) as a refusal.
fn full_is_refused(done: Result<Vec<Enqueued>>) -> Verdict<Vec<Enqueued>> {
    match done {
        Err(e @ (Error::QueueFull { .. } | Error::StorageFull { .. })) => refuse(e),
        other => other.map(Ok),
    }
}

/// [`enqueue`] for imported records (from
/// [`import_record`](super::validate::import_record)), which keep their own `created_ms`:
/// key holders and windows are judged at `now_ms`, the time of the import.
pub(crate) fn enqueue_imported(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    records: &[JobRecord],
    now_ms: u64,
) -> Verdict<Vec<Enqueued>> {
    let mut tables = Tables::open(ctx, schema)?;
    let jobs: Vec<NewJob> = records
        .iter()
        .map(|record| NewJob {
            record: record.clone(),
            on_duplicate: OnDuplicate::Keep,
            extend_window: false,
        })
        .collect();
    full_is_refused(enqueue_into(&mut tables, ctx, &jobs, Some(now_ms)))
}

/// [`enqueue`] (`judged_at_ms: None`) or [`enqueue_imported`] on tables the running
/// operation holds open. `StorageFull` (the file within its disk reserve) or `QueueFull`,
/// before anything is written, if the jobs do not fit the
/// queue's size limit (after dropping the oldest waiting jobs if it says so).
pub(super) fn enqueue_into(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    jobs: &[NewJob],
    judged_at_ms: Option<u64>,
) -> Result<Vec<Enqueued>> {
    let Some(first) = jobs.first() else {
        return Ok(Vec::new());
    };
    let judged_ms = judged_at_ms.unwrap_or(first.record.created_ms);
    // A file within its disk reserve takes no new job (the drain goes on), nor a batch
    // larger than the room above it.
    let payload_bytes = jobs
        .iter()
        .map(|j| j.record.payload.len() as u64)
        .fold(0u64, u64::saturating_add);
    if let Some(full) = ctx.group().refuse_growth(payload_bytes) {
        return Err(full);
    }
    super::queue_limit::make_room(tables, ctx.group(), jobs, judged_ms)??;
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        let record = &job.record;
        let now_ms = judged_at_ms.unwrap_or(record.created_ms);
        if let Some(k) = &record.dedup_key
            && let Some((owner, by_window)) = tables.key_holder(k, now_ms)?
        {
            if by_window
                && job.extend_window
                && let Some(w) = record.dedup_window_ms
            {
                tables.extend_window(k, owner, now_ms.saturating_add(w))?;
            }
            if job.on_duplicate != OnDuplicate::Keep
                && replace_waiting(tables, ctx, owner, job, now_ms)?
            {
                out.push(Enqueued::Replaced(JobId(owner)));
                continue;
            }
            // A lookup that found a window ended wrote (it released the key), as did an
            // extended window; the duplicate itself adds nothing.
            let dead = !by_window && tables.dead()?.get(owner)?.is_some();
            out.push(if dead {
                Enqueued::DuplicateDead(JobId(owner))
            } else {
                Enqueued::Duplicate(JobId(owner))
            });
            continue;
        }
        let id = ctx.alloc_id();
        ctx.wake(tables.schema.queue_number);
        let mut record = record.clone();
        if record.state == StoredState::Ready {
            record.seq = ctx.alloc_seq();
        }
        if record.group.is_some() {
            record.group_order = ctx.alloc_seq();
        }
        tables.store_payload(id, &mut record)?;
        // An id in use is damage to the counters: the error aborts the whole transaction, so
        // what this wrote over is never committed.
        tables.put_new(id, &record)?;
        if let Some(k) = &record.dedup_key {
            // Dedup windows past their end go as new keys come, a bounded few per key.
            prune_windows(tables, now_ms, PRUNE_PER_ACK_MAX)?;
            tables.dedup_mut()?.insert(k.as_slice(), id)?;
            // A window runs from the job's creation (an imported job's may be past: a window
            // that already ended holds nothing beyond the live job).
            if let Some(w) = record.dedup_window_ms
                && let end_ms = record.created_ms.saturating_add(w)
                && end_ms > now_ms
            {
                tables.dedup_windows_mut()?.insert(k.as_slice(), end_ms)?;
                tables
                    .dedup_expiry_mut()?
                    .insert((end_ms, k.as_slice()), ())?;
            }
        }
        tables.list_idem_job(id, &record)?;
        tables.log().event(
            tables.schema.queue_number,
            Event::Enqueued { id: JobId(id) },
        );
        out.push(Enqueued::New(JobId(id)));
    }
    Ok(out)
}

/// Replaces the payload (and, debounced, the due time) of job `id`, the holder of `job`'s
/// dedup key, if it is still waiting (ready or scheduled); whether it did.
fn replace_waiting(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    id: u64,
    job: &NewJob,
    now_ms: u64,
) -> Result<bool> {
    let Row::Good(mut holder) = tables.row(id)? else {
        return Ok(false);
    };
    if !matches!(holder.state, StoredState::Ready | StoredState::Scheduled) {
        return Ok(false);
    }
    tables.unindex(id, &holder)?;
    tables.replace_payload(id, &mut holder, &job.record.payload)?;
    holder.encoding = job.record.encoding;
    if job.on_duplicate == OnDuplicate::Debounce {
        let queue_number = tables.schema.queue_number;
        set_due(ctx, queue_number, &mut holder, job.record.run_at_ms, now_ms);
    }
    tables.put(id, &holder)?;
    Ok(true)
}

/// Runs a caller's closure; a panic in it becomes its error.
pub(super) fn run_closure<T>(f: impl FnOnce() -> Result<T, BoxError>) -> Result<T, BoxError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            Err(format!("closure panicked: {}", crate::error::panic_message(&*panic)).into())
        }
    }
}
