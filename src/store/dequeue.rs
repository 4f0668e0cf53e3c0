//! Sweep and dequeue: firing due schedules, promoting due scheduled jobs and reclaiming
//! expired leases inline and bounded (River's periodic job enqueuer, scheduler and rescuer),
//! then leasing ready jobs in priority order. A paused queue's look promotes due scheduled
//! jobs only, as BullMQ's `moveToActive` still moves due delayed jobs to a paused queue's list.

use redb::ReadableTable;

use crate::commit::Ctx;
use crate::error::{Error, Result};
use crate::format::record::{JobRecord, StoredState};
use crate::format::schema::priority_rank;
use crate::limits::{PRUNE_PER_ACK_MAX, SWEEP_MAX};

use super::retention::{prune_dead, prune_dead_over, prune_history};
use super::tables::{Row, Tables};
use super::transition::{LeaseEnd, end_lease_entry, lease_record};
use super::{Delivery, QueueConfig};

/// Fires due schedules, promotes due scheduled jobs, reclaims expired leases and ends the
/// group waits for cancelled deliveries whose lease ran out, at most `SWEEP_MAX` of each. An
/// entry whose row is damaged or disagrees is settled (quarantined, dropped) and the sweep
/// goes on.
fn sweep(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    config: &QueueConfig,
    now_ms: u64,
) -> Result<()> {
    if let Some(retention_ms) = config.dead_retention_ms {
        prune_dead(tables, now_ms, retention_ms, PRUNE_PER_ACK_MAX)?;
    }
    // Dead jobs over the count limit go whole (up to a sweep's worth): the deaths since the
    // last dequeue are at most what the fenced calls and the last sweep made.
    if let Some(kept) = config.dead_jobs_max {
        prune_dead_over(tables, now_ms, kept, SWEEP_MAX)?;
    }
    prune_history(tables, now_ms, PRUNE_PER_ACK_MAX)?;
    promote_due(tables, ctx, now_ms)?;
    let expired: Vec<(u64, u64)> = tables
        .leases()?
        .range(..=(now_ms, u64::MAX))?
        .take(SWEEP_MAX)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    for (deadline_ms, id) in expired {
        ctx.wake(tables.schema.queue_number);
        end_lease_entry(
            tables,
            ctx,
            (deadline_ms, id),
            LeaseEnd::Expired(config),
            now_ms,
        )?;
    }
    // Cancelled deliveries whose lease ran out: their groups go on, as after an expired lease.
    tables.end_fences_due(now_ms, SWEEP_MAX)?;
    // Due schedules last: each sees its last instance as it now is (an expired lease just
    // given back is pending, not running), and an instance enqueued now is ready for this
    // very dequeue.
    super::schedule::fire_due(tables, ctx, now_ms, false)?;
    Ok(())
}

/// Moves the scheduled jobs due at `now_ms` to ready, at most `SWEEP_MAX`, each at the back
/// of its priority (in due order); an entry whose row is damaged or disagrees is settled.
fn promote_due(tables: &mut Tables<'_>, ctx: &mut Ctx<'_>, now_ms: u64) -> Result<()> {
    let due: Vec<(u64, u64)> = tables
        .scheduled()?
        .range(..=(now_ms, u64::MAX))?
        .take(SWEEP_MAX)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    for (run_at_ms, id) in due {
        ctx.wake(tables.schema.queue_number);
        match tables.row(id)? {
            Row::Good(mut record)
                if record.state == StoredState::Scheduled && record.run_at_ms == run_at_ms =>
            {
                tables.unindex(id, &record)?;
                record.seq = ctx.alloc_seq();
                record.state = StoredState::Ready;
                tables.put(id, &record)?;
            }
            row => {
                tables.scheduled_mut()?.remove((run_at_ms, id))?;
                tables.repair_stray_entry(id, row, now_ms)?;
            }
        }
    }
    Ok(())
}

/// A paused queue's look: its scheduled jobs due at `now_ms` move to ready (at most
/// `SWEEP_MAX`, as a dequeue's sweep moves them), so counts and states show due work as
/// ready; nothing is delivered, no lease is reclaimed and no schedule fires (those wait for
/// the first dequeue after the resume). Writes nothing when nothing is due.
pub(crate) fn promote_due_paused(
    ctx: &mut Ctx<'_>,
    schema: &'static crate::format::schema::QueueSchema,
    now_ms: u64,
) -> Result<()> {
    let mut tables = Tables::open(ctx, schema)?;
    promote_due(&mut tables, ctx, now_ms)
}

/// Sweeps, then leases up to `max` ready jobs in queue order.
pub(crate) fn dequeue(
    ctx: &mut Ctx<'_>,
    config: &QueueConfig,
    now_ms: u64,
    max: usize,
) -> Result<Vec<Delivery>> {
    let schema = config.schema;
    debug_assert!((1..=crate::limits::BATCH_MAX).contains(&max));
    // A rate-limited queue delivers what its window has left; with nothing left it does
    // nothing else either (no sweep) until the window ends, as a waiting consumer does.
    let limited = super::rate_limit::allowed_now(ctx.group(), schema.queue_number, now_ms)?;
    let max = match limited {
        Some(allowed) => max.min(usize::try_from(allowed).unwrap_or(usize::MAX)),
        None => max,
    };
    if max == 0 {
        return Ok(Vec::new());
    }
    let mut tables = Tables::open(ctx, schema)?;
    sweep(&mut tables, ctx, config, now_ms)?;
    let mut out = Vec::with_capacity(max);
    // Entries whose row is damaged or does not match: settled below. Each is settled once (its
    // entry removed), so however much damage lies ahead of the first good job, the loop ends,
    // and a dequeue never answers "nothing" while a job is ready.
    let mut strays = Vec::new();
    // Payload bytes handed out so far: the batch stops before the job that would pass the
    // budget (the first job is always taken).
    let mut bytes = 0usize;
    let mut budget_reached = false;
    // Dedup keys held until their job started, let go of by this dequeue: (job id, key).
    let mut started = Vec::new();
    while out.len() < max && !budget_reached {
        // The first entries still wanted, in queue order.
        let mut firsts: Vec<(u32, u64, u64)> = tables
            .ready()?
            .iter()?
            .take(max - out.len())
            .map(|e| e.map(|(k, _)| k.value()))
            .collect::<Result<_, _>>()?;
        // Their rows, in order. A row is read and, if its payload is inline, leased at once
        // through one `get_mut` (one descent of `leaseq_jobs` for the read and the write);
        // the byte budget can cut the batch short before a row, leaving the jobs after the
        // cut ready in place. The ready entries are removed after this pass.
        if firsts.is_empty() {
            break;
        }
        // `get_mut` copies the row's page for writing, whether or not the row is leased.
        let mut slots = Vec::with_capacity(firsts.len());
        for (i, &(rank, seq, id)) in firsts.iter().enumerate() {
            let Some(mut row) = tables.jobs_mut().get_mut(id)? else {
                slots.push(Taken::Stray);
                continue;
            };
            let mut record = match JobRecord::decode(row.value()) {
                Ok(record)
                    if record.state == StoredState::Ready
                        && priority_rank(record.priority) == rank
                        && record.seq == seq =>
                {
                    record
                }
                _ => {
                    slots.push(Taken::Stray);
                    continue;
                }
            };
            let size = record.payload_len();
            let taken_any = !out.is_empty() || slots.iter().any(|s| !matches!(s, Taken::Stray));
            if taken_any && bytes.saturating_add(size) > config.dequeue_batch_bytes {
                firsts.truncate(i);
                budget_reached = true;
                break;
            }
            bytes = bytes.saturating_add(size);
            // Tokens in queue order, whatever the payloads.
            let mut leased = lease_record(ctx, config, now_ms, id, &mut record);
            if let Some(k) = record.dedup_key.take_if(|_| record.dedup_until_started) {
                record.dedup_until_started = false;
                leased.undo.until_started_key = Some(k.clone());
                started.push((id, k));
            }
            if record.payload_apart.is_some() {
                // Its payload is read (and checked) below, before its lease is written.
                slots.push(Taken::Apart(record, leased));
                continue;
            }
            record.check_invariants()?;
            row.insert(record.encode()?.as_slice())?;
            drop(row);
            // Ready to leased: counted before and after, so the counted bytes stay.
            if !tables.index_moved(id, &record)? {
                tracing::warn!(job_id = id, "leaseq: index entry was already present");
            }
            leased.idempotency_key = record.idempotency_key;
            leased.payload = record.payload;
            slots.push(Taken::Leased(leased));
        }
        // Then the ready entries removed: one at a time for one, in one pass for more (a
        // single delete rebuilds its leaf: 100 cost ~120 µs one by one, ~15 µs in one pass).
        match firsts.as_slice() {
            // The budget cuts before the first row only when something was taken already.
            [] => break,
            [one] => {
                tables.ready_mut()?.remove(*one)?;
            }
            [.., last] => {
                let mut removed = 0;
                tables.ready_mut()?.retain_in(..=*last, |_, ()| {
                    removed += 1;
                    false
                })?;
                if removed != firsts.len() {
                    return Err(Error::corrupted(format!(
                        "leaseq_ready: {removed} entries up to {last:?}, {} read",
                        firsts.len()
                    )));
                }
            }
        }
        debug_assert_eq!(firsts.len(), slots.len());
        for ((_, _, id), slot) in firsts.into_iter().zip(slots) {
            // Its ready entry was removed above.
            match slot {
                Taken::Stray => strays.push(id),
                Taken::Leased(leased) => out.push(leased),
                Taken::Apart(record, mut leased) => {
                    let Some(r) = &record.payload_apart else {
                        unreachable!("an apart slot has its payload apart")
                    };
                    let payload = match tables.apart_payload(id, r)? {
                        Ok(p) => p,
                        Err(why) => {
                            // Its ready entry is gone: the job moves aside whole (its bytes
                            // no longer counted), the batch goes on.
                            tables.uncount_bytes(record.payload_len() as u64)?;
                            tables.quarantine(id, &why, now_ms)?;
                            continue;
                        }
                    };
                    tables.put_moved(id, &record)?;
                    leased.idempotency_key = record.idempotency_key;
                    leased.payload = payload;
                    out.push(leased);
                }
            }
        }
    }
    // A key held until its job started is released (if the job still holds it): an enqueue
    // from now on makes a new job.
    for (id, k) in started {
        if tables.dedup()?.get(k.as_slice())?.map(|v| v.value()) == Some(id) {
            tables.dedup_mut()?.remove(k.as_slice())?;
        }
    }
    // Settled after the leases, from the rows as they are now: a stray entry's job may be one
    // this dequeue just leased through its own entry.
    for id in strays {
        let row = tables.row(id)?;
        tables.repair_stray_entry(id, row, now_ms)?;
    }
    if limited.is_some() {
        super::rate_limit::charge(ctx, schema.queue_number, now_ms, out.len() as u64)?;
    }
    Ok(out)
}

/// A ready job found by [`dequeue`]: leased in place; leased in memory, its row written once
/// its payload stored apart is read; or an entry that does not match its row.
// Moved once each, on the way out: boxing would only add an allocation per job.
#[allow(clippy::large_enum_variant)]
enum Taken {
    Leased(Delivery),
    Apart(JobRecord, Delivery),
    Stray,
}
