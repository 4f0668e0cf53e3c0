//! Periodic jobs in the engine: setting and removing schedules (`leaseq_schedules` and its
//! due-time index `leaseq_schedule_due`, since format 8), and firing the due ones: inline and
//! bounded in a dequeue's sweep, and for every queue at open (where [`Missed`] is decided).
//!
//! Firing a due schedule is one step in the sweep's transaction: the instance job (if one is
//! enqueued), the schedule's next due time and its counters commit together, so a crash at
//! any point leaves either the due time not yet fired (it fires after the reopen) or fired
//! once, never twice.

use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata};

use crate::commit::{Ctx, GroupTable, GroupTx, Refusal, Verdict, refuse};
use crate::error::{Error, Result};
use crate::format::record::{JobRecord, StoredState};
use crate::format::schedule::{
    INSTANCE_LIVE, MISSED_RUN_ONCE, MISSED_SKIP, NO_DUE_MS, OVERLAP_ENQUEUE, OVERLAP_SKIP,
    ScheduleRecord, StoredTemplate, StoredTiming,
};
use crate::format::schema::{QueueSchema, SCHEDULE_DUE, SCHEDULE_INSTANCES, SCHEDULES};
use crate::job::{JobId, OnDuplicate};
use crate::limits::{
    DELAY_MAX, SCHEDULE_NAME_BYTES_MAX, SCHEDULE_PAYLOAD_BYTES_MAX, SCHEDULES_MAX, SWEEP_MAX,
};
use crate::schedule::timing::{CRON_SUPPORTED, CronTiming, next_due_after};
use crate::schedule::{Missed, Overlap, Schedule, ScheduleInfo, Timing};

use super::QueueConfig;
use super::tables::{Row, Tables};
use super::validate::{NewJob, new_record};

/// A checked schedule definition, before any write.
#[derive(Debug)]
pub(crate) struct NewSchedule {
    name: String,
    timing: StoredTiming,
    /// An interval whose start the caller gave (otherwise it starts one interval from now,
    /// and an update with the same interval keeps the stored start).
    start_given: bool,
    template: StoredTemplate,
    overlap: u8,
    missed: u8,
}

/// Validates a schedule name: 1 to `SCHEDULE_NAME_BYTES_MAX` bytes, no control characters.
pub(crate) fn validate_schedule_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > SCHEDULE_NAME_BYTES_MAX || name.chars().any(char::is_control)
    {
        return Err(Error::invalid_option(
            "schedule name",
            format!("{name:?}: 1 to {SCHEDULE_NAME_BYTES_MAX} bytes, no control characters"),
        ));
    }
    Ok(())
}

/// Validates `schedule` for the queue of `config` at `now_ms`: every refusal before a write.
pub(crate) fn build(
    config: &QueueConfig,
    now_ms: u64,
    name: &str,
    schedule: &Schedule,
) -> Result<NewSchedule> {
    validate_schedule_name(name)?;
    let timing = match (&schedule.every, &schedule.cron) {
        (Some(every), None) => {
            let every_ms = crate::clock::duration_ms(*every);
            if every_ms == 0 || *every > DELAY_MAX {
                return Err(Error::invalid_option(
                    "interval",
                    format!(
                        "{} ms is outside 1 ms to {} ms (DELAY_MAX)",
                        every.as_millis(),
                        DELAY_MAX.as_millis()
                    ),
                ));
            }
            let start_ms = match schedule.start_ms {
                Some(s) if s > now_ms.saturating_add(crate::clock::duration_ms(DELAY_MAX)) => {
                    return Err(Error::invalid_option(
                        "starting_at_ms",
                        "more than DELAY_MAX from now: the schedule would never come due",
                    ));
                }
                Some(s) => s,
                None => now_ms
                    .checked_add(every_ms)
                    .ok_or_else(|| Error::invalid_option("interval", "due time overflows"))?,
            };
            StoredTiming::Interval { every_ms, start_ms }
        }
        (None, Some((expression, time_zone))) => {
            if schedule.start_ms.is_some() {
                return Err(Error::invalid_option(
                    "starting_at_ms",
                    "only an interval schedule has a start",
                ));
            }
            let cron = CronTiming::parse(expression, time_zone)?;
            if cron.next_after(now_ms).is_none() {
                return Err(Error::invalid_option(
                    "cron",
                    format!("{expression:?} never matches from now on"),
                ));
            }
            StoredTiming::Cron {
                expression: expression.clone(),
                time_zone: time_zone.clone(),
            }
        }
        _ => unreachable!("a Schedule is made by `every` or `cron`"),
    };
    let opts = &schedule.options;
    for (field, set) in [
        ("delay", opts.delay.is_some()),
        ("dedup_key", opts.dedup_key.is_some()),
        ("idempotency_key", opts.idempotency_key.is_some()),
        ("dedup_window", opts.dedup_window.is_some()),
        ("dedup_until_started", opts.dedup_until_started),
        ("extend_dedup_window", opts.extend_dedup_window),
        ("on_duplicate", opts.on_duplicate != OnDuplicate::Keep),
        ("group", opts.group.is_some()),
    ] {
        if set {
            return Err(Error::invalid_option(
                field,
                "a schedule's jobs take no delay, dedup or idempotency key, and join no \
                 group: the schedule says when they run and keeps one pending",
            ));
        }
    }
    if opts.timeout.is_some() {
        return Err(Error::invalid_option(
            "timeout",
            "a schedule's jobs take no execution timeout of their own: the schedule record \
             does not keep one; set the pool's job_timeout",
        ));
    }
    let limit_bytes = config.payload_bytes_max.min(SCHEDULE_PAYLOAD_BYTES_MAX);
    if schedule.payload.len() > limit_bytes {
        return Err(Error::PayloadTooLarge {
            size_bytes: schedule.payload.len(),
            limit_bytes,
        });
    }
    // The options as an enqueue would check and resolve them (the handle's defaults filled
    // in now, so every instance is the same whichever handle's dequeue fires it).
    let record = new_record(config, now_ms, &schedule.payload, opts)?;
    let template = StoredTemplate {
        priority: record.priority,
        max_attempts: record.max_attempts,
        lease_ms: record.lease_ms,
        retry: record.retry,
        encoding: record.encoding,
        payload: schedule.payload.clone(),
    };
    Ok(NewSchedule {
        name: name.to_string(),
        timing,
        start_given: schedule.start_ms.is_some(),
        template,
        overlap: match schedule.overlap {
            Overlap::Skip => OVERLAP_SKIP,
            Overlap::Enqueue => OVERLAP_ENQUEUE,
        },
        missed: match schedule.missed {
            Missed::RunOnce => MISSED_RUN_ONCE,
            Missed::Skip => MISSED_SKIP,
        },
    })
}

/// How [`set`] treats a name that exists (or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetMode {
    /// `ScheduleExists` if it exists.
    Create,
    /// `ScheduleNotFound` if it does not.
    Update,
    /// Either.
    Upsert,
}

/// Creates or changes schedule `new` of queue `queue_number` at `now_ms`. A changed timing
/// counts its next due time from now; the same timing keeps it (and an interval its start
/// unless a new one is given), so an app that upserts its schedules at every start does not
/// push them back. The last instance and the counters are kept.
pub(crate) fn set(
    ctx: &mut Ctx<'_>,
    queue_number: u32,
    new: &NewSchedule,
    mode: SetMode,
    now_ms: u64,
) -> Verdict<ScheduleInfo> {
    let mut rows = ctx.table(SCHEDULES)?;
    let key = (queue_number, new.name.as_str());
    let old = rows.get(key)?.map(|v| ScheduleRecord::decode(v.value()));
    match (&old, mode) {
        (Some(_), SetMode::Create) => {
            return refuse(Error::ScheduleExists {
                name: new.name.clone(),
            });
        }
        (None, SetMode::Update) => {
            return refuse(Error::ScheduleNotFound {
                name: new.name.clone(),
            });
        }
        (None, _) if rows.len()? >= SCHEDULES_MAX as u64 => {
            return refuse(Error::invalid_option(
                "schedules",
                format!("a file holds at most {SCHEDULES_MAX} schedules"),
            ));
        }
        _ => {}
    }
    // A damaged row is replaced whole (`check()` reported it; setting it again is the fix),
    // and its last instance's entry, which no row names any more, goes.
    let was_damaged = matches!(old, Some(Err(_)));
    let old = old.and_then(Result::ok);
    let kept_timing = old.as_ref().and_then(|o| match (&o.timing, &new.timing) {
        (
            StoredTiming::Interval { every_ms: a, .. },
            StoredTiming::Interval { every_ms: b, .. },
        ) if a == b && !new.start_given => Some(o.timing.clone()),
        (a, b) if a == b => Some(o.timing.clone()),
        _ => None,
    });
    let (timing, next_due_ms) = match (kept_timing, &old) {
        (Some(t), Some(o)) => (t, o.next_due_ms),
        _ => {
            let next = first_due(&new.timing, now_ms)?;
            (new.timing.clone(), next)
        }
    };
    // A paused schedule stays paused, without a due time, until resumed.
    let paused_ms = old.as_ref().and_then(|o| o.paused_ms);
    let next_due_ms = if paused_ms.is_some() {
        NO_DUE_MS
    } else {
        next_due_ms
    };
    let record = ScheduleRecord {
        timing,
        template: new.template.clone(),
        overlap: new.overlap,
        missed: new.missed,
        next_due_ms,
        last_job: old.as_ref().and_then(|o| o.last_job),
        fired: old.as_ref().map_or(0, |o| o.fired),
        skipped: old.as_ref().map_or(0, |o| o.skipped),
        created_ms: old.as_ref().map_or(now_ms, |o| o.created_ms),
        updated_ms: now_ms,
        paused_ms,
    };
    let mut due = ctx.table(SCHEDULE_DUE)?;
    unindex_due(&mut due, queue_number, &new.name)?;
    if next_due_ms != NO_DUE_MS {
        due.insert((queue_number, next_due_ms, new.name.as_str()), ())?;
    }
    rows.insert(key, record.encode()?.as_slice())?;
    if was_damaged {
        drop_unnamed_instances(ctx.group(), &rows, queue_number)?;
    }
    ctx.wake(queue_number);
    Ok(Ok(info(&new.name, &record)))
}

/// Schedule `name` of queue `queue_number` as stored, for a call on it: `ScheduleNotFound`,
/// or `Corrupted` for a row that fails its checks, as refusals.
fn existing(
    ctx: &Ctx<'_>,
    queue_number: u32,
    name: &str,
) -> Result<std::result::Result<ScheduleRecord, Refusal>> {
    let rows = ctx.table(SCHEDULES)?;
    let found = rows
        .get((queue_number, name))?
        .map(|v| ScheduleRecord::decode(v.value()));
    Ok(match found {
        None => Err(Refusal(Error::ScheduleNotFound {
            name: name.to_string(),
        })),
        Some(Err(e)) => Err(Refusal(e)),
        Some(Ok(r)) => Ok(r),
    })
}

/// Pauses schedule `name` of queue `queue_number` at `now_ms`: it keeps no due time and
/// fires nothing until resumed; whether it was running.
pub(crate) fn pause(
    ctx: &mut Ctx<'_>,
    queue_number: u32,
    name: &str,
    now_ms: u64,
) -> Verdict<bool> {
    let mut record = match existing(ctx, queue_number, name)? {
        Ok(r) => r,
        Err(refusal) => return Ok(Err(refusal)),
    };
    if record.paused_ms.is_some() {
        return Ok(Ok(false));
    }
    record.paused_ms = Some(now_ms);
    record.next_due_ms = NO_DUE_MS;
    let mut due = ctx.table(SCHEDULE_DUE)?;
    unindex_due(&mut due, queue_number, name)?;
    ctx.table(SCHEDULES)?
        .insert((queue_number, name), record.encode()?.as_slice())?;
    Ok(Ok(true))
}

/// Resumes paused schedule `name` of queue `queue_number` at `now_ms`: due again at its
/// first due time from now on (the due times passed while paused are not made up, and not
/// counted); whether it was paused.
pub(crate) fn resume(
    ctx: &mut Ctx<'_>,
    queue_number: u32,
    name: &str,
    now_ms: u64,
) -> Verdict<bool> {
    let mut record = match existing(ctx, queue_number, name)? {
        Ok(r) => r,
        Err(refusal) => return Ok(Err(refusal)),
    };
    if record.paused_ms.is_none() {
        return Ok(Ok(false));
    }
    // A timing this build cannot compute (a cron schedule without the `cron` feature) is
    // refused, nothing written: the sweep keeps such a schedule unfired, as it was.
    if !CRON_SUPPORTED && matches!(record.timing, StoredTiming::Cron { .. }) {
        return refuse(Error::invalid_option(
            "cron",
            format!(
                "schedule {name:?} is a cron schedule: resuming it needs leaseq's `cron` \
                 feature (on by default); it stays paused"
            ),
        ));
    }
    let next_due_ms = match first_due(&record.timing, now_ms) {
        Ok(due) => due,
        Err(e) => return refuse(e),
    };
    record.paused_ms = None;
    record.next_due_ms = next_due_ms;
    let mut due = ctx.table(SCHEDULE_DUE)?;
    unindex_due(&mut due, queue_number, name)?;
    if record.next_due_ms != NO_DUE_MS {
        due.insert((queue_number, record.next_due_ms, name), ())?;
    }
    ctx.table(SCHEDULES)?
        .insert((queue_number, name), record.encode()?.as_slice())?;
    ctx.wake(queue_number);
    Ok(Ok(true))
}

/// Enqueues one instance of schedule `name` of `schema`'s queue now, whatever its due time,
/// overlap policy or pause say: it becomes the schedule's last instance (so under
/// [`Overlap::Skip`] a due time skips while it runs) and counts in `fired`; the next due time
/// stays. Its id.
pub(crate) fn trigger(
    ctx: &mut Ctx<'_>,
    schema: &'static crate::format::schema::QueueSchema,
    name: &str,
    now_ms: u64,
) -> Verdict<JobId> {
    let queue_number = schema.queue_number;
    let mut record = match existing(ctx, queue_number, name)? {
        Ok(r) => r,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let mut tables = Tables::open(ctx, schema)?;
    let id = match enqueue_instance(&mut tables, ctx, &record.template, now_ms) {
        Err(e @ (Error::QueueFull { .. } | Error::StorageFull { .. })) => return refuse(e),
        other => other?,
    };
    if let Some((previous, _)) = record.last_job {
        drop_dead_instance(&mut tables, previous, now_ms)?;
    }
    tables.instances_changed();
    let mut instances = ctx.table(SCHEDULE_INSTANCES)?;
    if let Some((previous, _)) = record.last_job {
        instances.remove((queue_number, previous))?;
    }
    instances.insert((queue_number, id), INSTANCE_LIVE)?;
    record.last_job = Some((id, now_ms));
    record.fired = record.fired.saturating_add(1);
    ctx.table(SCHEDULES)?
        .insert((queue_number, name), record.encode()?.as_slice())?;
    Ok(Ok(JobId(id)))
}

/// Removes queue `queue_number`'s entries of `leaseq_schedule_instances` that no schedule
/// row names as its last instance (left by a damaged row). Bounded by the file's schedules.
fn drop_unnamed_instances(
    tx: GroupTx<'_>,
    rows: &redb::Table<'_, (u32, &'static str), &'static [u8]>,
    queue_number: u32,
) -> Result<()> {
    let mut named = std::collections::BTreeSet::new();
    for e in rows
        .range((queue_number, "")..(queue_number + 1, ""))?
        .take(SCHEDULES_MAX + 1)
    {
        let (_, v) = e?;
        if let Ok(ScheduleRecord {
            last_job: Some((id, _)),
            ..
        }) = ScheduleRecord::decode(v.value())
        {
            named.insert(id);
        }
    }
    let mut instances = tx.table(SCHEDULE_INSTANCES)?;
    let mut unnamed = Vec::new();
    for e in instances
        .range((queue_number, 0)..=(queue_number, u64::MAX))?
        .take(SCHEDULES_MAX + 1)
    {
        let (k, _) = e?;
        let (_, id) = k.value();
        if !named.contains(&id) {
            unnamed.push(id);
        }
    }
    for id in unnamed {
        instances.remove((queue_number, id))?;
    }
    Ok(())
}

/// The first due time of a new timing: an interval's start if it is not past, else its next
/// due time from `now_ms` on; a cron expression's first match strictly after `now_ms`, so a
/// schedule set at the very millisecond its expression matches waits for the next match (as
/// BullMQ's repeatable jobs and a crontab entry added at 03:00:00 do).
fn first_due(timing: &StoredTiming, now_ms: u64) -> Result<u64> {
    Ok(match timing {
        StoredTiming::Interval { start_ms, .. } if *start_ms >= now_ms => *start_ms,
        StoredTiming::Interval { .. } => {
            next_due_after(timing, now_ms.saturating_sub(1))?.unwrap_or(NO_DUE_MS)
        }
        StoredTiming::Cron { .. } => next_due_after(timing, now_ms)?.unwrap_or(NO_DUE_MS),
    })
}

/// Removes every due entry of schedule `name` of queue `queue_number` (at most one is
/// expected; a stray one `check()` reported goes too). Bounded by the file's schedules.
fn unindex_due(
    due: &mut GroupTable<'_, (u32, u64, &'static str), ()>,
    queue_number: u32,
    name: &str,
) -> Result<()> {
    let mut found = Vec::new();
    for e in due
        .range((queue_number, 0, "")..(queue_number + 1, 0, ""))?
        .take(SCHEDULES_MAX + 1)
    {
        let (k, _) = e?;
        let (_, at, n) = k.value();
        if n == name {
            found.push(at);
        }
    }
    for at in found {
        due.remove((queue_number, at, name))?;
    }
    Ok(())
}

/// Removes schedule `name` of queue `queue_number`; whether it existed. Its last instance,
/// if still live, stays and runs as any job.
pub(crate) fn remove(ctx: &mut Ctx<'_>, queue_number: u32, name: &str) -> Result<bool> {
    let mut rows = ctx.table(SCHEDULES)?;
    if rows.get((queue_number, name))?.is_none() {
        return Ok(false);
    }
    let old = rows
        .remove((queue_number, name))?
        .map(|v| ScheduleRecord::decode(v.value()));
    match old {
        Some(Ok(ScheduleRecord {
            last_job: Some((id, _)),
            ..
        })) => {
            ctx.table(SCHEDULE_INSTANCES)?.remove((queue_number, id))?;
        }
        // A damaged row names no instance: drop the entries no row names.
        Some(Err(_)) => drop_unnamed_instances(ctx.group(), &rows, queue_number)?,
        _ => {}
    }
    let mut due = ctx.table(SCHEDULE_DUE)?;
    unindex_due(&mut due, queue_number, name)?;
    Ok(true)
}

/// Fires the due schedules of `tables`' queue at `now_ms`, at most `SWEEP_MAX` of them:
/// for each, one instance or a skip, and its next due time, in this transaction.
/// `at_open`: the file was closed since the schedule's due times before `now_ms`, so
/// [`Missed`] decides for those (one at `now_ms` is due now, as at a dequeue).
pub(super) fn fire_due(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    now_ms: u64,
    at_open: bool,
) -> Result<(u64, u64)> {
    let queue_number = tables.schema.queue_number;
    let (mut fired, mut skipped) = (0, 0);
    let mut due = tables.gtx.table(SCHEDULE_DUE)?;
    // A build without cron support passes over the cron schedules' entries and leaves them
    // in place, so it looks at up to every schedule of the file to find `SWEEP_MAX` others.
    let looked_at = if CRON_SUPPORTED {
        SWEEP_MAX
    } else {
        SCHEDULES_MAX
    };
    let entries: Vec<(u64, String)> = due
        .range((queue_number, 0, "")..(queue_number, now_ms.saturating_add(1), ""))?
        .take(looked_at)
        .map(|e| {
            e.map(|(k, _)| {
                let (_, at, name) = k.value();
                (at, name.to_string())
            })
        })
        .collect::<Result<_, _>>()?;
    if entries.is_empty() {
        return Ok((0, 0));
    }
    let mut rows = tables.gtx.table(SCHEDULES)?;
    let mut handled = 0;
    for (at, name) in entries {
        if handled == SWEEP_MAX {
            break;
        }
        let record = match rows.get((queue_number, name.as_str()))? {
            Some(v) => ScheduleRecord::decode(v.value()),
            None => Err(Error::corrupted("no schedule row")),
        };
        if !CRON_SUPPORTED
            && let Ok(r) = &record
            && matches!(r.timing, StoredTiming::Cron { .. })
        {
            // Kept for a build with the `cron` feature: not fired, nothing written.
            if at_open {
                tracing::warn!(queue_number, schedule = %name, "leaseq: a cron schedule is due but this build has no `cron` feature: kept unfired");
            }
            continue;
        }
        handled += 1;
        due.remove((queue_number, at, name.as_str()))?;
        let mut record = match record {
            Ok(r) => r,
            Err(e) => {
                // Left for `check()` and for a new `upsert_schedule` of the name; without
                // its due entry it no longer stops the sweep. (An entry without a row is
                // removed the same way.)
                if rows.get((queue_number, name.as_str()))?.is_some() {
                    tracing::warn!(queue_number, schedule = %name, error = %e, "leaseq: damaged schedule row");
                }
                continue;
            }
        };
        if record.next_due_ms != at {
            // A stray entry: the row's own time is indexed again.
            if record.next_due_ms != NO_DUE_MS {
                due.insert((queue_number, record.next_due_ms, name.as_str()), ())?;
            }
            continue;
        }
        // A due time at the open's very millisecond did not pass while the file was closed:
        // it is due now, as it would be at a dequeue, whatever `Missed` says.
        let fire = if at_open && record.missed == MISSED_SKIP && at < now_ms {
            false
        } else {
            let last = record.last_job.map(|(id, _)| id);
            match instance_state(tables, queue_number, last)? {
                Instance::Pending => false,
                Instance::Running => record.overlap == OVERLAP_ENQUEUE,
                // Under Skip, the due times that passed while it still ran are skipped, even
                // when no dequeue looked until it ended: one fires only if a due time came at
                // or after its end. An end after now (the clock went back) or a timing that
                // no longer reads tells nothing: the due time fires.
                Instance::Ended(Some(ended_ms))
                    if record.overlap == OVERLAP_SKIP && ended_ms <= now_ms =>
                {
                    next_due_after(&record.timing, ended_ms.saturating_sub(1))
                        .map_or(true, |d| d.is_some_and(|d| d <= now_ms))
                }
                Instance::Ended(_) => true,
            }
        };
        // A due time whose instance does not fit the queue's size limit is skipped.
        let instance = if fire {
            match enqueue_instance(tables, ctx, &record.template, now_ms) {
                Err(Error::QueueFull { .. }) => {
                    tracing::warn!(queue_number, schedule = %name, "leaseq: the queue is full: a due time of the schedule skipped");
                    None
                }
                Err(Error::StorageFull { .. }) => {
                    tracing::warn!(queue_number, schedule = %name, "leaseq: storage full: a due time of the schedule skipped");
                    None
                }
                other => Some(other?),
            }
        } else {
            None
        };
        if let Some(id) = instance {
            if let Some((previous, _)) = record.last_job {
                drop_dead_instance(tables, previous, now_ms)?;
            }
            tables.instances_changed();
            let mut instances = tables.gtx.table(SCHEDULE_INSTANCES)?;
            if let Some((previous, _)) = record.last_job {
                instances.remove((queue_number, previous))?;
            }
            instances.insert((queue_number, id), INSTANCE_LIVE)?;
            record.last_job = Some((id, at));
            record.fired = record.fired.saturating_add(1);
            fired += 1;
        } else {
            record.skipped = record.skipped.saturating_add(1);
            skipped += 1;
        }
        record.next_due_ms = match next_due_after(&record.timing, now_ms) {
            Ok(next) => next.unwrap_or(NO_DUE_MS),
            Err(e) => {
                tracing::warn!(queue_number, schedule = %name, error = %e, "leaseq: schedule has no next due time");
                NO_DUE_MS
            }
        };
        if record.next_due_ms != NO_DUE_MS {
            due.insert((queue_number, record.next_due_ms, name.as_str()), ())?;
        }
        rows.insert((queue_number, name.as_str()), record.encode()?.as_slice())?;
    }
    Ok((fired, skipped))
}

/// Where a schedule's last instance is.
enum Instance {
    /// Ready or scheduled (a retry waiting for its backoff too): not started.
    Pending,
    /// Leased.
    Running,
    /// Completed, cancelled, dead, removed, damaged, or none yet; when it ended, if
    /// `leaseq_schedule_instances` recorded it.
    Ended(Option<u64>),
}

fn instance_state(tables: &Tables<'_>, queue_number: u32, id: Option<u64>) -> Result<Instance> {
    let Some(id) = id else {
        return Ok(Instance::Ended(None));
    };
    // Dead, completed or cancelled (kept in the history), deleted or damaged: ended, at the
    // time its entry recorded if it has one.
    if let Row::Good(r) = tables.row(id)? {
        match r.state {
            StoredState::Ready | StoredState::Scheduled => return Ok(Instance::Pending),
            StoredState::Leased { .. } => return Ok(Instance::Running),
            _ => {}
        }
    }
    let ended_ms = tables
        .gtx
        .table(SCHEDULE_INSTANCES)?
        .get((queue_number, id))?
        .map(|v| v.value())
        .filter(|&ms| ms != INSTANCE_LIVE);
    Ok(Instance::Ended(ended_ms))
}

/// Deletes a schedule's previous instance `id` if it is dead, as a new instance replaces it:
/// a schedule keeps at most one dead instance, its last, so a job that fails at every due
/// time (or an app that crashes under it until its attempts are spent) leaves one dead
/// letter, not one per due time. The new instance shows whether the work still fails.
fn drop_dead_instance(tables: &mut Tables<'_>, id: u64, now_ms: u64) -> Result<()> {
    if let Row::Good(r) = tables.row(id)?
        && r.state == StoredState::Dead
    {
        tracing::info!(
            job_id = id,
            "leaseq: a schedule's dead instance replaced by its next"
        );
        tables.delete(id, &r, now_ms)?;
    }
    Ok(())
}

/// Enqueues one instance of `template`, ready now; its id.
fn enqueue_instance(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    template: &StoredTemplate,
    now_ms: u64,
) -> Result<u64> {
    let record = JobRecord {
        state: StoredState::Ready,
        priority: template.priority,
        run_at_ms: now_ms,
        attempts: 0,
        max_attempts: template.max_attempts,
        lease_ms: template.lease_ms,
        created_ms: now_ms,
        seq: 0,
        idempotency_key: None,
        dedup_key: None,
        errors: Vec::new(),
        payload: template.payload.clone(),
        retry: template.retry,
        dedup_window_ms: None,
        payload_apart: None,
        snoozes: 0,
        encoding: template.encoding,
        status: None,
        dedup_until_started: false,
        progress: None,
        group: None,
        group_order: 0,
        // A schedule refuses a timeout in its options (the schedule record has no field).
        timeout_ms: None,
    };
    record.check_invariants()?;
    let job = NewJob {
        record,
        on_duplicate: OnDuplicate::Keep,
        extend_window: false,
    };
    match super::enqueue::enqueue_into(tables, ctx, std::slice::from_ref(&job), None)?.as_slice() {
        [crate::job::Enqueued::New(id)] => Ok(id.0),
        other => Err(Error::corrupted(format!(
            "a schedule's instance carries no key, yet its enqueue gave {other:?}"
        ))),
    }
}

/// Fires, at open, the due schedules of every queue of the file (the file was closed, so
/// [`Missed`] decides), before the first dequeue; how many enqueued a job, and how many
/// skipped.
pub(crate) fn fire_at_open(ctx: &mut Ctx<'_>, now_ms: u64) -> Result<(u64, u64)> {
    let (mut fired, mut skipped) = (0, 0);
    let mut queues: Vec<u32> = Vec::new();
    {
        let due = ctx.table(SCHEDULE_DUE)?;
        for e in due.iter()?.take(SCHEDULES_MAX + 1) {
            let (k, _) = e?;
            let (q, at, _) = k.value();
            if at <= now_ms && queues.last() != Some(&q) {
                queues.push(q);
            }
        }
    }
    for q in queues {
        let schema = match q {
            0 => &crate::format::schema::DEFAULT_SCHEMA,
            n if super::registry::is_registered(ctx.group(), n)? => QueueSchema::named(n),
            // A schedule of no queue: `check()` reports it; nothing fires into nowhere.
            _ => continue,
        };
        let mut tables = Tables::open(ctx, schema)?;
        // Every due schedule of the queue, a sweep's worth at a time: each one fired moves
        // past `now_ms`, so the passes end (a file holds at most SCHEDULES_MAX).
        for _ in 0..=SCHEDULES_MAX / SWEEP_MAX {
            let (f, s) = fire_due(&mut tables, ctx, now_ms, true)?;
            fired += f;
            skipped += s;
            if f + s == 0 {
                break;
            }
        }
    }
    Ok((fired, skipped))
}

/// The next due time of queue `queue_number`'s schedules, for a waiting consumer (none in a
/// file older than format 8, which a writable open upgrades).
///
/// A build without cron support leaves out the due times of the cron schedules it keeps
/// unfired: their entries stay in the past, and a consumer that counted them would look
/// again every millisecond. It reads each due entry's row until the first other one (at most
/// `SCHEDULES_MAX`), a cost only such a build pays, only while it holds cron schedules.
pub(crate) fn next_due(rtx: &ReadTransaction, queue_number: u32) -> Result<Option<u64>> {
    let due = match rtx.open_table(SCHEDULE_DUE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut entries = due.range((queue_number, 0, "")..(queue_number + 1, 0, ""))?;
    if CRON_SUPPORTED {
        let first = entries.next().transpose()?;
        return Ok(first.map(|(k, _)| k.value().1));
    }
    let rows = rtx.open_table(SCHEDULES)?;
    for e in entries.take(SCHEDULES_MAX) {
        let (k, _) = e?;
        let (_, at, name) = k.value();
        let kept_cron = rows.get((queue_number, name))?.is_some_and(|v| {
            ScheduleRecord::decode(v.value())
                .is_ok_and(|r| matches!(r.timing, StoredTiming::Cron { .. }))
        });
        if !kept_cron {
            return Ok(Some(at));
        }
    }
    Ok(None)
}

/// The schedules of queue `queue_number`, by name; a row that fails its checks is left out
/// (`check()` reports it).
pub(crate) fn list(rtx: &ReadTransaction, queue_number: u32) -> Result<Vec<ScheduleInfo>> {
    let rows = match rtx.open_table(SCHEDULES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for e in rows
        .range((queue_number, "")..(queue_number + 1, ""))?
        .take(SCHEDULES_MAX)
    {
        let (k, v) = e?;
        if let Ok(record) = ScheduleRecord::decode(v.value()) {
            out.push(info(k.value().1, &record));
        }
    }
    Ok(out)
}

/// Schedule `name` of queue `queue_number`: `Corrupted` for a row that fails its checks.
pub(crate) fn get(
    rtx: &ReadTransaction,
    queue_number: u32,
    name: &str,
) -> Result<Option<ScheduleInfo>> {
    let rows = match rtx.open_table(SCHEDULES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(v) = rows.get((queue_number, name))? else {
        return Ok(None);
    };
    Ok(Some(info(name, &ScheduleRecord::decode(v.value())?)))
}

fn info(name: &str, r: &ScheduleRecord) -> ScheduleInfo {
    ScheduleInfo {
        name: name.to_string(),
        timing: match &r.timing {
            StoredTiming::Interval { every_ms, start_ms } => Timing::Interval {
                every_ms: *every_ms,
                start_ms: *start_ms,
            },
            StoredTiming::Cron {
                expression,
                time_zone,
            } => Timing::Cron {
                expression: expression.clone(),
                time_zone: time_zone.clone(),
            },
        },
        next_due_ms: (r.next_due_ms != NO_DUE_MS).then_some(r.next_due_ms),
        last_job: r.last_job.map(|(id, at)| (JobId(id), at)),
        fired: r.fired,
        skipped: r.skipped,
        overlap: if r.overlap == OVERLAP_ENQUEUE {
            Overlap::Enqueue
        } else {
            Overlap::Skip
        },
        missed: if r.missed == MISSED_SKIP {
            Missed::Skip
        } else {
            Missed::RunOnce
        },
        priority: r.template.priority,
        payload_bytes: r.template.payload.len(),
        created_ms: r.created_ms,
        updated_ms: r.updated_ms,
        paused_ms: r.paused_ms,
    }
}

/// The schedule tables' invariants, for `check()`: each row decodes and belongs to a queue of
/// the file; each schedule with a due time has exactly that one entry in
/// `leaseq_schedule_due` and every entry is a schedule's; an instance id was handed out
/// (below `next_id`); at most `SCHEDULES_MAX` rows.
pub(crate) fn check_schedules(
    rtx: &ReadTransaction,
    named: &[(String, u32)],
    next_id: u64,
    out: &mut Vec<String>,
) -> Result<()> {
    let (rows, due) = match (rtx.open_table(SCHEDULES), rtx.open_table(SCHEDULE_DUE)) {
        (Ok(r), Ok(d)) => (r, d),
        (
            Err(redb::TableError::TableDoesNotExist(_)),
            Err(redb::TableError::TableDoesNotExist(_)),
        ) => {
            return Ok(());
        }
        (Err(e), _) | (_, Err(e)) => {
            out.push(format!("leaseq_schedules or leaseq_schedule_due: {e}"));
            return Ok(());
        }
    };
    if rows.len()? > SCHEDULES_MAX as u64 {
        out.push(format!(
            "leaseq_schedules holds {} rows, above {SCHEDULES_MAX}",
            rows.len()?
        ));
    }
    let mut expected = std::collections::BTreeSet::new();
    let mut last_jobs = std::collections::BTreeSet::new();
    for e in rows.iter()?.take(SCHEDULES_MAX + 1) {
        let (k, v) = e?;
        let (q, name) = k.value();
        let known = q == 0 || named.iter().any(|(_, n)| *n == q);
        if !known {
            out.push(format!(
                "schedule {name:?} of queue number {q}, which is not registered"
            ));
        }
        if validate_schedule_name(name).is_err() {
            out.push(format!("schedule name {name:?} out of range"));
        }
        match ScheduleRecord::decode(v.value()) {
            Err(e) => out.push(format!("schedule {name:?} of queue number {q}: {e}")),
            Ok(r) => {
                // Without cron support a cron schedule is kept, not damage.
                if let StoredTiming::Cron {
                    expression,
                    time_zone,
                } = &r.timing
                    && CRON_SUPPORTED
                    && let Err(e) = CronTiming::parse(expression, time_zone)
                {
                    out.push(format!("schedule {name:?}: {e}"));
                }
                if let Some((id, _)) = r.last_job {
                    last_jobs.insert((q, id));
                    if id >= next_id {
                        out.push(format!(
                            "schedule {name:?}: last job {id} was never handed out (next id {next_id})"
                        ));
                    }
                }
                if r.next_due_ms != NO_DUE_MS {
                    expected.insert((q, r.next_due_ms, name.to_string()));
                }
            }
        }
    }
    let mut found = std::collections::BTreeSet::new();
    for e in due.iter()?.take(SCHEDULES_MAX + 1) {
        let (k, _) = e?;
        let (q, at, name) = k.value();
        found.insert((q, at, name.to_string()));
    }
    for (q, at, name) in expected.difference(&found) {
        out.push(format!(
            "schedule {name:?} of queue number {q} is due at {at} but leaseq_schedule_due has no entry"
        ));
    }
    for (q, at, name) in found.difference(&expected) {
        out.push(format!(
            "leaseq_schedule_due entry ({q}, {at}, {name:?}) matches no schedule's due time"
        ));
    }
    // Each entry of leaseq_schedule_instances is a schedule's last instance (the table's
    // presence is checked with the others of format 8).
    if let Ok(instances) = rtx.open_table(SCHEDULE_INSTANCES) {
        if instances.len()? > SCHEDULES_MAX as u64 {
            out.push(format!(
                "leaseq_schedule_instances holds {} entries, above {SCHEDULES_MAX}",
                instances.len()?
            ));
        }
        for e in instances.iter()?.take(SCHEDULES_MAX + 1) {
            let (k, _) = e?;
            let (q, id) = k.value();
            if !last_jobs.contains(&(q, id)) {
                out.push(format!(
                    "leaseq_schedule_instances entry ({q}, job {id}) is no schedule's last instance"
                ));
            }
        }
    }
    Ok(())
}
