//! The calls checked against a lease's fencing token: ack, `ack_with` (the exactly-once
//! effect), nack, snooze, fail, extend. A stale token is a refusal that writes nothing.

use redb::ReadableTable;

use crate::commit::{Ctx, Refusal, Verdict, refuse};
use crate::error::{BoxError, Error, Result};
use crate::format::record::{JobRecord, StoredState};
use crate::format::schema::{META, QueueSchema, marker_key};
use crate::job::{Applied, JobState};
use crate::limits::PRUNE_PER_ACK_MAX;

use super::QueueConfig;
use super::enqueue::run_closure;
use super::retention::prune_applied;
use super::sink::TablesSink;
use super::tables::Tables;
use super::transition::retry_at_ms;
use super::validate::validate_lease_ms;

/// How a job whose `ack_with` closure failed is given back ([`crate::job::Outcome`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GiveBack {
    /// Through the retry policy, or after this backoff (ms); dead when out of attempts.
    Retry(Option<u64>),
    /// Without charging the attempt, due after this delay (ms).
    Snooze(u64),
    /// Dead now.
    Fail,
}

/// A lease whose `ack_with` closure failed in an earlier run of the call: how its job ends,
/// and the last error it gets.
#[derive(Debug, Clone)]
pub(crate) struct ClosureFailure {
    pub reason: String,
    pub how: GiveBack,
}

impl ClosureFailure {
    /// The failure of a closure that returned `e`: an [`crate::job::Outcome`] decides how the
    /// job ends (a delay above `DELAY_MAX` is refused there, and the job goes through the
    /// retry policy with the refusal as its reason); any other error retries.
    pub(crate) fn of(e: &BoxError) -> ClosureFailure {
        let max_ms = crate::clock::duration_ms(crate::limits::DELAY_MAX);
        let refused = |d: std::time::Duration| ClosureFailure {
            reason: format!(
                "refused outcome: {e} (the delay of {} ms is above DELAY_MAX)",
                d.as_millis()
            ),
            how: GiveBack::Retry(None),
        };
        // An enqueue inside the closure refused for want of disk room, passed on: the job
        // waits for the drain without spending an attempt.
        if let Some(crate::error::Error::StorageFull { .. }) =
            e.downcast_ref::<crate::error::Error>()
        {
            return ClosureFailure {
                reason: e.to_string(),
                how: GiveBack::Snooze(crate::clock::duration_ms(
                    crate::limits::STORAGE_FULL_SNOOZE,
                )),
            };
        }
        match e.downcast_ref::<crate::job::Outcome>() {
            Some(crate::job::Outcome::Snooze(d)) if crate::clock::duration_ms(*d) <= max_ms => {
                ClosureFailure {
                    reason: e.to_string(),
                    how: GiveBack::Snooze(crate::clock::duration_ms(*d)),
                }
            }
            Some(crate::job::Outcome::Fail(reason)) => ClosureFailure {
                reason: reason.clone(),
                how: GiveBack::Fail,
            },
            Some(crate::job::Outcome::Retry { after, reason })
                if crate::clock::duration_ms(*after) <= max_ms =>
            {
                ClosureFailure {
                    reason: reason.clone(),
                    how: GiveBack::Retry(Some(crate::clock::duration_ms(*after))),
                }
            }
            Some(crate::job::Outcome::Snooze(d) | crate::job::Outcome::Retry { after: d, .. }) => {
                refused(*d)
            }
            None => ClosureFailure {
                reason: e.to_string(),
                how: GiveBack::Retry(None),
            },
        }
    }
}

/// Acks every current lease of the batch; a lease that is not current (`LeaseLost`) or whose
/// row is damaged (`Corrupted`) is reported in its place and changes nothing, so the others
/// are not held up by it (as SQS's `DeleteMessageBatch` reports each entry). `results[i]` (at
/// most `RESULT_BYTES_MAX`, checked by the caller) is kept with lease `i`'s job in a queue that
/// keeps a history.
pub(crate) fn ack(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    leases: &[(u64, u64)],
    results: &[Option<Vec<u8>>],
    now_ms: u64,
) -> Result<Vec<Result<()>>> {
    debug_assert_eq!(leases.len(), results.len());
    let mut tables = Tables::open(ctx, schema)?;
    let mut out = Vec::with_capacity(leases.len());
    let (mut keys, mut records, mut kept) = (Vec::new(), Vec::new(), Vec::new());
    for (&(id, token), result) in leases.iter().zip(results) {
        match tables.lease_of(id, token)? {
            Ok(record) => {
                tables.note_run(&record, now_ms);
                keys.push((id, token));
                records.push(record);
                kept.push(result.clone());
                out.push(Ok(()));
            }
            Err(refusal) => {
                ended_cancelled(&mut tables, (id, token), &refusal)?;
                out.push(Err(refusal.0));
            }
        }
    }
    if !keys.is_empty() {
        super::transition::complete_leased(&mut tables, &keys, records, kept, now_ms)?;
    }
    Ok(out)
}

/// The caller's closure of [`ack_with`] run once per lease: gets the transaction and the
/// index of the lease in the batch.
pub(crate) type AckEach<'a> = dyn FnMut(&crate::tx::Tx<'_>, usize) -> Result<(), BoxError> + 'a;

/// The caller's closure of [`ack_with`] run once for the whole batch: gets the transaction and
/// the positions of the leases it covers.
pub(crate) type AckAll<'a> = dyn FnMut(&crate::tx::Tx<'_>, &[usize]) -> Result<(), BoxError> + 'a;

/// How [`ack_with`] runs the caller's closure (the lease's effect): once per lease that needs
/// it, or once for all of them (after the checks, before the deletes).
pub(crate) enum AckClosure<'f, 'e> {
    Each(&'f mut AckEach<'e>),
    All(&'f mut AckAll<'e>),
}

/// Acks every current lease with its effect in this transaction (stale or damaged ones are
/// reported in their place, as by [`ack`]). A lease whose idempotency key is already applied
/// (also by an earlier lease of the same batch) is acked without its effect. A lease with
/// `failed[i]` set had its effect fail in an earlier run of this call: its closure does not
/// run again, and its job is given back with that error as its last error (as a nack through
/// the retry policy, or dead when out of attempts), reported as `Effect`. A closure that fails now
/// fails the whole transaction with `Effect`; the caller runs it again with that lease marked.
pub(crate) fn ack_with(
    ctx: &mut Ctx<'_>,
    leases: &[(u64, u64)],
    results: &[Option<Vec<u8>>],
    config: &QueueConfig,
    now_ms: u64,
    failed: &[Option<ClosureFailure>],
    closure: &mut AckClosure<'_, '_>,
) -> Result<Vec<Result<Applied>>> {
    let schema = config.schema;
    debug_assert_eq!(leases.len(), failed.len());
    let group = ctx.group();
    let mut tables = Tables::open(ctx, schema)?;
    // Every leaseq table is held open while closures run, so redb refuses a closure that
    // opens one (lazy opening would leave the unused index tables open to it).
    tables.open_all()?;
    let mut applied = group.table(schema.applied())?;
    // Held open (unused) so a closure that opens `leaseq_meta` is refused by redb as well.
    let _meta = group.table(META)?;
    let mut out = Vec::with_capacity(leases.len());
    let (mut keys, mut records, mut kept) = (Vec::new(), Vec::new(), Vec::new());
    // Held open (as every leaseq table) while closures run.
    let mut by_time = group.table(schema.applied_by_time())?;
    let mut new_markers = 0;
    // With `AckClosure::All`, the leases whose effect runs (once, after the loop).
    let mut pending = Vec::new();
    // The jobs this call deletes if it commits (current leases whose effect did not fail
    // before): follow-ups enqueued by the closures may take the dedup keys they hold.
    let mut acked = Vec::new();
    // Each row read once: no row changes before the deletes at the end but a failed lease's
    // own (given back below; closures cannot write leaseq's tables, and their enqueues take
    // new ids). A job named by two leases of the batch is read again at each.
    let mut read: Vec<Option<std::result::Result<JobRecord, Refusal>>> =
        Vec::with_capacity(leases.len());
    for (i, &(id, token)) in leases.iter().enumerate() {
        let found = tables.lease_of(id, token)?;
        if failed[i].is_none() && found.is_ok() {
            acked.push(id);
        }
        read.push(Some(found));
    }
    if leases.len() > 1 {
        let mut ids: Vec<u64> = leases.iter().map(|&(id, _)| id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            read.iter_mut().for_each(|r| *r = None);
        }
    }
    for (i, &(id, token)) in leases.iter().enumerate() {
        let found = match read[i].take() {
            Some(found) => found,
            None => tables.lease_of(id, token)?,
        };
        let record = match found {
            Ok(record) => record,
            Err(refusal) => {
                ended_cancelled(&mut tables, (id, token), &refusal)?;
                out.push(Err(refusal.0));
                continue;
            }
        };
        tables.note_run(&record, now_ms);
        if let Some(f) = &failed[i] {
            ctx.wake(tables.schema.queue_number);
            match f.how {
                GiveBack::Retry(backoff_ms) => {
                    let at_ms = match backoff_ms {
                        Some(b) => now_ms.saturating_add(b),
                        None => retry_at_ms(config, id, &record, now_ms),
                    };
                    tables.end_attempt(ctx, id, record, &f.reason, now_ms, at_ms)?;
                }
                GiveBack::Snooze(delay_ms) => {
                    tables.snooze_leased(ctx, id, record, now_ms, delay_ms, None)?
                }
                GiveBack::Fail => tables.fail_leased(id, record, &f.reason, now_ms)?,
            }
            out.push(Err(Error::Effect(f.reason.clone().into())));
            continue;
        }
        // Only a caller's idempotency key gets a marker. A job without one is keyed by its
        // own id, and that marker would guard nothing: ids are never reused, and the effect
        // and the removal of the job commit together, so no later delivery can ask.
        let key = record.idempotency_key.as_deref().map(marker_key);
        let already = match &key {
            Some(k) => applied.get(k.as_slice())?.is_some(),
            None => false,
        };
        if already {
            out.push(Ok(Applied::AlreadyApplied));
        } else {
            match closure {
                // leaseq's tables stay open: the closure may open any table but `leaseq_*`
                // ones (redb would refuse those as already open), and enqueue follow-up jobs
                // through them. A panic in it becomes an error like any other, so the group
                // aborts cleanly.
                AckClosure::Each(f) => {
                    let tx = group.caller_transaction();
                    let mut sink = TablesSink {
                        tables: &mut tables,
                        ctx,
                        acked: &acked,
                        leases,
                        broken: None,
                    };
                    let ran =
                        run_closure(|| f(&crate::tx::Tx::new(tx, *config, now_ms, &mut sink), i));
                    sink.into_result(ran)?;
                }
                // Run once below, for every lease that needs it.
                AckClosure::All(_) => pending.push(i),
            }
            if let Some(k) = &key {
                applied.insert(k.as_slice(), now_ms)?;
                by_time.insert((now_ms, k.as_slice()), ())?;
                new_markers += 1;
            }
            out.push(Ok(Applied::Now));
        }
        keys.push((id, token));
        records.push(record);
        kept.push(results[i].clone());
    }
    if let AckClosure::All(f) = closure
        && !pending.is_empty()
    {
        let tx = group.caller_transaction();
        let mut sink = TablesSink {
            tables: &mut tables,
            ctx,
            acked: &acked,
            leases,
            broken: None,
        };
        let ran = run_closure(|| {
            f(
                &crate::tx::Tx::new(tx, *config, now_ms, &mut sink),
                &pending,
            )
        });
        sink.into_result(ran)?;
    }
    if !keys.is_empty() {
        super::transition::complete_leased(&mut tables, &keys, records, kept, now_ms)?;
    }
    // Markers past their retention go as new ones come, a bounded few per new one.
    if new_markers > 0
        && let Some(retention_ms) = config.applied_retention_ms
    {
        let max = PRUNE_PER_ACK_MAX * new_markers;
        prune_applied(
            &mut tables,
            &mut applied,
            &mut by_time,
            now_ms,
            retention_ms,
            max,
        )?;
        debug_assert!(ctx.written(), "an ack_with that wrote a marker is marked");
    }
    Ok(out)
}

// The calls aimed at one job below answer a `Verdict`: a refusal about that job (`LeaseLost`,
// `Corrupted` for its damaged row, an option that overflows) is made before anything is
// written, and the group commit goes on without replaying its other members. An outer `Err`
// aborts the group.

/// The record of lease `(id, token)`, or the refusal, as the first step of a call on it.
macro_rules! lease_or_refuse {
    ($tables:expr, $id:expr, $token:expr) => {
        match $tables.lease_of($id, $token)? {
            Ok(record) => record,
            Err(refusal) => return Ok(Err(refusal)),
        }
    };
}

/// [`lease_or_refuse`] for a call that ends its delivery (ack, nack, snooze, fail): answered
/// `Cancelled`, it still tells the job's group that the cancelled delivery ended.
macro_rules! ending_lease_or_refuse {
    ($tables:expr, $id:expr, $token:expr) => {
        match $tables.lease_of($id, $token)? {
            Ok(record) => record,
            Err(refusal) => {
                ended_cancelled(&mut $tables, ($id, $token), &refusal)?;
                return Ok(Err(refusal));
            }
        }
    };
}

/// After a refusal of an ending call on job `id`: when it is `Cancelled`, the worker has
/// reported back, and a group waiting for that cancelled delivery goes on (the one write a
/// refused call makes, and only to a group's wait).
fn ended_cancelled(
    tables: &mut Tables<'_>,
    (id, token): (u64, u64),
    refusal: &Refusal,
) -> Result<()> {
    if matches!(refusal.0, Error::Cancelled { .. }) {
        tables.delivery_ended(id, token)?;
        tables.log().refuse_after_write();
    }
    Ok(())
}

/// Ends the attempt of lease `(id, token)` with `reason`: due after `backoff_ms`, or after the
/// retry policy's delay when `None`; dead when out of attempts.
pub(crate) fn nack(
    ctx: &mut Ctx<'_>,
    config: &QueueConfig,
    (id, token): (u64, u64),
    now_ms: u64,
    backoff_ms: Option<u64>,
    reason: &str,
) -> Verdict<JobState> {
    let schema = config.schema;
    let mut tables = Tables::open(ctx, schema)?;
    let record = ending_lease_or_refuse!(tables, id, token);
    let at = match backoff_ms {
        Some(b) => match now_ms.checked_add(b) {
            Some(at) => at,
            None => return refuse(Error::invalid_option("backoff", "due time overflows")),
        },
        None => retry_at_ms(config, id, &record, now_ms),
    };
    tables.note_run(&record, now_ms);
    ctx.wake(tables.schema.queue_number);
    tables
        .end_attempt(ctx, id, record, reason, now_ms, at)
        .map(Ok)
}

/// Gives a leased job back without charging its attempt: due at `now_ms + delay_ms` (ready
/// at once for 0), its attempt count back down by one, its snooze count up by one. Never
/// dead-letters; the last error is kept as it was.
pub(crate) fn snooze(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    (id, token): (u64, u64),
    now_ms: u64,
    delay_ms: u64,
    reason: Option<&str>,
) -> Verdict<()> {
    let mut tables = Tables::open(ctx, schema)?;
    let record = ending_lease_or_refuse!(tables, id, token);
    if now_ms.checked_add(delay_ms).is_none() {
        return refuse(Error::invalid_option("delay", "due time overflows"));
    }
    tables.note_run(&record, now_ms);
    tables
        .snooze_leased(ctx, id, record, now_ms, delay_ms, reason)
        .map(Ok)
}

/// Gives back lease `(id, token)` as if it had never been taken (see
/// [`Tables::release_unseen`]): for a delivery the async face took but could not hand out.
pub(crate) fn release_unseen(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    (id, token): (u64, u64),
    undo: &super::Undo,
    now_ms: u64,
) -> Verdict<()> {
    let mut tables = Tables::open(ctx, schema)?;
    let record = ending_lease_or_refuse!(tables, id, token);
    tables.release_unseen(ctx, id, record, undo, now_ms).map(Ok)
}

pub(crate) fn fail(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    (id, token): (u64, u64),
    now_ms: u64,
    reason: &str,
) -> Verdict<()> {
    let mut tables = Tables::open(ctx, schema)?;
    let record = ending_lease_or_refuse!(tables, id, token);
    tables.note_run(&record, now_ms);
    tables.fail_leased(id, record, reason, now_ms).map(Ok)
}

/// Records `value` as the progress of lease `(id, token)` at `now_ms` (checked by the caller:
/// at most `PROGRESS_BYTES_MAX` bytes). The job stays leased as it was.
pub(crate) fn set_progress(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    (id, token): (u64, u64),
    now_ms: u64,
    value: &[u8],
) -> Verdict<()> {
    debug_assert!(value.len() <= crate::limits::PROGRESS_BYTES_MAX);
    let mut tables = Tables::open(ctx, schema)?;
    let mut record = lease_or_refuse!(tables, id, token);
    // Updates of one delivery from several threads (a heartbeat carrying a pending one, a
    // direct one) may commit out of order: an older one never replaces a newer one.
    if record.progress.as_ref().is_some_and(|p| p.at_ms > now_ms) {
        return Ok(Ok(()));
    }
    record.progress = Some(crate::format::record::StoredProgress {
        at_ms: now_ms,
        value: value.to_vec(),
    });
    // Same state, same deadline: the row only (its lease entry stays as it is).
    record.check_invariants()?;
    tables.jobs_mut().insert(id, record.encode()?.as_slice())?;
    tables.log().event(
        schema.queue_number,
        crate::events::Event::Progress {
            id: crate::job::JobId(id),
        },
    );
    Ok(Ok(()))
}

pub(crate) fn extend(
    ctx: &mut Ctx<'_>,
    schema: &'static QueueSchema,
    id: u64,
    token: u64,
    now_ms: u64,
    by: std::time::Duration,
) -> Verdict<u64> {
    let lease_ms = match validate_lease_ms("extend", by) {
        Ok(ms) => ms,
        Err(e) => return refuse(e),
    };
    let mut tables = Tables::open(ctx, schema)?;
    let Some(deadline_ms) = now_ms.checked_add(lease_ms) else {
        return refuse(Error::invalid_option("extend", "deadline overflows"));
    };
    let mut record = match tables.lease_of(id, token)? {
        Ok(record) => record,
        Err(refusal) => {
            // A cancelled delivery's worker still runs: its extend (a pool's heartbeat)
            // keeps its group waiting for it, answered `Cancelled` all the same.
            if matches!(refusal.0, Error::Cancelled { .. })
                && tables.extend_fence(id, token, deadline_ms)?
            {
                tables.log().refuse_after_write();
            }
            return Ok(Err(refusal));
        }
    };
    tables.unindex(id, &record)?;
    record.state = StoredState::Leased { token, deadline_ms };
    tables.put(id, &record)?;
    Ok(Ok(deadline_ms))
}
