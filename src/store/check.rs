//! The invariant checker behind `Queue::check`: every row, index and key table against the
//! others, one function per invariant.

use redb::ReadableTableMetadata;
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, TableHandle};

use crate::error::Result;
use crate::format::record::{JobRecord, StoredState};
use crate::format::schema::{
    FORMAT_VERSION, MARKER_TAG_KEY, META, META_FORMAT_VERSION, META_NEXT_ID, META_NEXT_TOKEN,
    QuarantineValue, QueueSchema, marker_key, priority_rank,
};
use crate::job::{JobId, Violation};
use crate::limits::{PAYLOAD_INLINE_MAX, VIOLATIONS_MAX};

use super::read::quarantine_table;
use super::registry::{named_queues, named_tables_present};

/// [`check`] over every queue of the file, in one snapshot: the default queue, then each
/// named one (its violations' details prefixed with the queue's name).
pub(crate) fn check_file(rtx: &ReadTransaction) -> Result<Vec<Violation>> {
    let mut out = check(rtx, &crate::format::schema::DEFAULT_SCHEMA)?;
    let named = named_queues(rtx)?;
    // Reverse: every queue's tables belong to a registered queue.
    for table in rtx.list_tables()? {
        let name = table.name().to_string();
        if let Some(queue_number) = QueueSchema::number_in(&name)
            && !named.iter().any(|(_, n)| *n == queue_number)
            && out.len() < VIOLATIONS_MAX
        {
            out.push(Violation {
                job_id: None,
                detail: format!(
                    "table {name} of queue number {queue_number}, which is not registered"
                ),
            });
        }
    }
    for (name, queue_number) in &named {
        named_tables_present(rtx, name, QueueSchema::named(*queue_number))?;
    }
    check_paused(rtx, &named, &mut out)?;
    check_history_limits(rtx, &named, &mut out)?;
    check_schedule_tables(rtx, &named, &mut out)?;
    super::metrics::check_metrics(rtx, &named, format_version(rtx)?, &mut out)?;
    super::metrics::check_run_times(rtx, &named, format_version(rtx)?, &mut out)?;
    check_queue_limits(rtx, &named, format_version(rtx)?, &mut out)?;
    for (name, queue_number) in named {
        for mut v in check(rtx, QueueSchema::named(queue_number))? {
            if out.len() >= VIOLATIONS_MAX {
                return Ok(out);
            }
            v.detail = format!("queue {name:?}: {}", v.detail);
            out.push(v);
        }
    }
    Ok(out)
}

/// The file's format version, as `leaseq_meta` holds it.
fn format_version(rtx: &redb::ReadTransaction) -> Result<Option<u64>> {
    Ok(rtx
        .open_table(META)?
        .get(META_FORMAT_VERSION)?
        .map(|v| v.value()))
}

/// `leaseq_paused` (format 6 on) names only queues of the file: the default one (0) or a
/// registered one.
fn check_paused(
    rtx: &redb::ReadTransaction,
    named: &[(String, u32)],
    out: &mut Vec<Violation>,
) -> Result<()> {
    let version = format_version(rtx)?;
    if version.is_some_and(|v| v >= 6)
        && let Err(redb::TableError::TableDoesNotExist(_)) =
            rtx.open_table(crate::format::schema::PAUSED)
    {
        out.push(Violation {
            job_id: None,
            detail: "leaseq_paused is missing (format 6)".to_string(),
        });
    }
    for (queue_number, _) in super::control::paused_queues(rtx)? {
        if queue_number != 0
            && !named.iter().any(|(_, n)| *n == queue_number)
            && out.len() < VIOLATIONS_MAX
        {
            out.push(Violation {
                job_id: None,
                detail: format!(
                    "leaseq_paused names queue number {queue_number}, which is not registered"
                ),
            });
        }
    }
    Ok(())
}

/// `leaseq_history_limits` (format 7 on) names only queues of the file, each with a bound.
fn check_history_limits(
    rtx: &redb::ReadTransaction,
    named: &[(String, u32)],
    out: &mut Vec<Violation>,
) -> Result<()> {
    let version = format_version(rtx)?;
    let table = match rtx.open_table(crate::format::schema::HISTORY_LIMITS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            if version.is_some_and(|v| v >= 7) {
                out.push(Violation {
                    job_id: None,
                    detail: "leaseq_history_limits is missing (format 7)".to_string(),
                });
            }
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    for e in table.iter()? {
        let (k, v) = e?;
        let (queue_number, (jobs, ms)) = (k.value(), v.value());
        let known = queue_number == 0 || named.iter().any(|(_, n)| *n == queue_number);
        let detail = if !known {
            format!(
                "leaseq_history_limits names queue number {queue_number}, which is not registered"
            )
        } else if super::control::history_from_stored(jobs, ms).is_none() {
            format!(
                "leaseq_history_limits holds ({jobs}, {ms}) for queue number {queue_number}: no bound, or one out of range"
            )
        } else {
            continue;
        };
        if out.len() < VIOLATIONS_MAX {
            out.push(Violation {
                job_id: None,
                detail,
            });
        }
    }
    Ok(())
}

/// The file-wide tables of format 8: `leaseq_schedules` and `leaseq_schedule_due` present
/// and consistent (`store::schedule::check_schedules`), the rate limits' rows valid (and the
/// sliding ones' tables of format 15 present).
fn check_schedule_tables(
    rtx: &redb::ReadTransaction,
    named: &[(String, u32)],
    out: &mut Vec<Violation>,
) -> Result<()> {
    let mut details = Vec::new();
    if format_version(rtx)?.is_some_and(|v| v >= 8) {
        for (name, present) in [
            (
                "leaseq_schedules",
                rtx.open_table(crate::format::schema::SCHEDULES).is_ok(),
            ),
            (
                "leaseq_schedule_due",
                rtx.open_table(crate::format::schema::SCHEDULE_DUE).is_ok(),
            ),
            (
                "leaseq_rate_limits",
                rtx.open_table(crate::format::schema::RATE_LIMITS).is_ok(),
            ),
            (
                "leaseq_schedule_instances",
                rtx.open_table(crate::format::schema::SCHEDULE_INSTANCES)
                    .is_ok(),
            ),
        ] {
            if !present {
                details.push(format!("{name} is missing (format 8)"));
            }
        }
    }
    if format_version(rtx)?.is_some_and(|v| v >= 15) {
        for (name, present) in [
            (
                "leaseq_sliding_limits",
                rtx.open_table(crate::format::schema::SLIDING_LIMITS)
                    .is_ok(),
            ),
            (
                "leaseq_rate_log",
                rtx.open_table(crate::format::schema::RATE_LOG).is_ok(),
            ),
        ] {
            if !present {
                details.push(format!("{name} is missing (format 15)"));
            }
        }
    }
    let next_id = rtx
        .open_table(META)?
        .get(META_NEXT_ID)?
        .map_or(u64::MAX, |v| v.value());
    super::schedule::check_schedules(rtx, named, next_id, &mut details)?;
    super::rate_limit::check_rate_limits(rtx, named, &mut details)?;
    for detail in details {
        if out.len() < VIOLATIONS_MAX {
            out.push(Violation {
                job_id: None,
                detail,
            });
        }
    }
    Ok(())
}

/// The violations found so far, at most `VIOLATIONS_MAX`.
#[derive(Default)]
struct Found {
    out: Vec<Violation>,
}

impl Found {
    fn add(&mut self, job: Option<u64>, detail: String) {
        if self.out.len() < VIOLATIONS_MAX {
            self.out.push(Violation {
                job_id: job.map(JobId),
                detail,
            });
        }
    }
}

/// One queue's tables in a read snapshot, as the checks see them.
struct Snapshot {
    jobs: ReadOnlyTable<u64, &'static [u8]>,
    ready: ReadOnlyTable<(u32, u64, u64), ()>,
    scheduled: ReadOnlyTable<(u64, u64), ()>,
    leases: ReadOnlyTable<(u64, u64), ()>,
    dead: ReadOnlyTable<u64, ()>,
    dead_by_time: ReadOnlyTable<(u64, u64), ()>,
    dedup: ReadOnlyTable<&'static [u8], u64>,
    dedup_windows: ReadOnlyTable<&'static [u8], u64>,
    dedup_expiry: ReadOnlyTable<(u64, &'static [u8]), ()>,
    applied: ReadOnlyTable<&'static [u8], u64>,
    applied_by_time: ReadOnlyTable<(u64, &'static [u8]), ()>,
    idem_jobs: ReadOnlyTable<(&'static [u8], u64), ()>,
    payloads: ReadOnlyTable<u64, &'static [u8]>,
    completed: ReadOnlyTable<(u64, u64), ()>,
    cancelled: ReadOnlyTable<(u64, u64), ()>,
    groups: ReadOnlyTable<(&'static [u8], u64), u64>,
    held: ReadOnlyTable<(&'static [u8], u64), ()>,
    /// Absent until the first job of the queue is quarantined.
    quarantine: Option<ReadOnlyTable<u64, QuarantineValue>>,
    /// The file's `leaseq_group_fences` (absent in a file of format 13 or older).
    fences: Option<ReadOnlyTable<(u32, u64, u64), u64>>,
    queue_number: u32,
}

impl Snapshot {
    fn open(rtx: &ReadTransaction, schema: &'static QueueSchema) -> Result<Snapshot> {
        Ok(Snapshot {
            jobs: rtx.open_table(schema.jobs())?,
            ready: rtx.open_table(schema.ready())?,
            scheduled: rtx.open_table(schema.scheduled())?,
            leases: rtx.open_table(schema.leases())?,
            dead: rtx.open_table(schema.dead())?,
            dead_by_time: rtx.open_table(schema.dead_by_time())?,
            dedup: rtx.open_table(schema.dedup())?,
            dedup_windows: rtx.open_table(schema.dedup_windows())?,
            dedup_expiry: rtx.open_table(schema.dedup_expiry())?,
            applied: rtx.open_table(schema.applied())?,
            applied_by_time: rtx.open_table(schema.applied_by_time())?,
            idem_jobs: rtx.open_table(schema.idem_jobs())?,
            payloads: rtx.open_table(schema.payloads())?,
            completed: rtx.open_table(schema.completed())?,
            cancelled: rtx.open_table(schema.cancelled())?,
            groups: rtx.open_table(schema.groups())?,
            held: rtx.open_table(schema.held())?,
            quarantine: quarantine_table(rtx, schema)?,
            fences: match rtx.open_table(crate::format::schema::GROUP_FENCES) {
                Ok(t) => Some(t),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(e.into()),
            },
            queue_number: schema.queue_number,
        })
    }

    /// Job `id`'s record, if it has one that decodes.
    fn record(&self, id: u64) -> Result<Option<JobRecord>> {
        match self.jobs.get(id)? {
            Some(g) => Ok(JobRecord::decode(g.value()).ok()),
            None => Ok(None),
        }
    }

    fn is_quarantined(&self, id: u64) -> Result<bool> {
        match &self.quarantine {
            Some(q) => Ok(q.get(id)?.is_some()),
            None => Ok(false),
        }
    }
}

/// The file's id and token counters (`next_id`, `next_token`; 0 when missing).
struct StoredCounters {
    next_id: u64,
    next_token: u64,
}

/// Checks the invariants listed in ARCHITECTURE.md over a read snapshot of one queue: each
/// job decodes and is in exactly one state; each state's index and the jobs table agree both
/// ways; dedup entries point at the job that holds the key; counters are ahead of every id and
/// token. Memory stays bounded: reverse checks look each index entry up instead of collecting
/// ids.
pub(crate) fn check(rtx: &ReadTransaction, schema: &'static QueueSchema) -> Result<Vec<Violation>> {
    let mut found = Found::default();
    let counters = check_meta(rtx, &mut found)?;
    let snap = Snapshot::open(rtx, schema)?;
    let counts = check_rows(&snap, &counters, &mut found)?;
    check_index_sizes(&snap, counts, &mut found)?;
    check_payload_rows(&snap, &mut found)?;
    check_ready_entries(&snap, &mut found)?;
    check_scheduled_entries(&snap, &mut found)?;
    check_lease_entries(&snap, &mut found)?;
    check_dead_entries(&snap, &mut found)?;
    check_history_entries(&snap, &mut found)?;
    check_applied_markers(&snap, &mut found)?;
    check_idem_jobs(&snap, &mut found)?;
    check_quarantine(&snap, &mut found)?;
    check_dead_time_index(&snap, &mut found)?;
    check_dedup_windows(&snap, &mut found)?;
    check_dedup_holders(&snap, &mut found)?;
    check_group_entries(&snap, &mut found)?;
    Ok(found.out)
}

/// Every group member is a live (scheduled, ready, leased) job of that group or a cancelled
/// delivery it waits for (with its `leaseq_group_fences` entry), every such entry names a
/// cancelled member of its group at that deadline, and every held entry is a ready job of that
/// group.
fn check_group_entries(snap: &Snapshot, found: &mut Found) -> Result<()> {
    let fence_of = |r: &JobRecord, id: u64| -> Result<bool> {
        Ok(match (&snap.fences, &r.state) {
            (
                Some(f),
                StoredState::Cancelled {
                    fenced_until_ms, ..
                },
            ) => f.get((snap.queue_number, *fenced_until_ms, id))?.is_some(),
            _ => false,
        })
    };
    for e in snap.groups.iter()? {
        let (k, v) = e?;
        let ((g, order), id) = (k.value(), v.value());
        let ok = match snap.record(id)? {
            Some(r) => {
                r.group.as_deref() == Some(g)
                    && r.group_order == order
                    && (matches!(
                        r.state,
                        StoredState::Ready | StoredState::Scheduled | StoredState::Leased { .. }
                    ) || fence_of(&r, id)?)
            }
            None => false,
        };
        if !ok {
            found.add(
                Some(id),
                "a group member that is not a live job of that group".into(),
            );
        }
    }
    if let Some(fences) = &snap.fences {
        let q = snap.queue_number;
        for e in fences.range((q, 0, 0)..=(q, u64::MAX, u64::MAX))? {
            let (k, _) = e?;
            let (_, until_ms, id) = k.value();
            let ok = match snap.record(id)? {
                Some(r) => match (&r.state, r.group.as_deref()) {
                    (
                        StoredState::Cancelled {
                            fenced_until_ms, ..
                        },
                        Some(g),
                    ) => {
                        *fenced_until_ms == until_ms
                            && snap.groups.get((g, r.group_order))?.map(|v| v.value()) == Some(id)
                    }
                    _ => false,
                },
                None => false,
            };
            if !ok {
                found.add(
                    Some(id),
                    "a group wait that is not a cancelled member of its group".into(),
                );
            }
        }
    }
    for e in snap.held.iter()? {
        let (k, _) = e?;
        let (g, id) = k.value();
        let ok = snap
            .record(id)?
            .is_some_and(|r| r.group.as_deref() == Some(g) && r.state == StoredState::Ready);
        if !ok {
            found.add(
                Some(id),
                "a held entry that is not a ready job of that group".into(),
            );
        }
    }
    Ok(())
}

/// The format version is current and the counters exist.
fn check_meta(rtx: &ReadTransaction, found: &mut Found) -> Result<StoredCounters> {
    let meta = rtx.open_table(META)?;
    let get = |k: &str| -> Result<Option<u64>> { Ok(meta.get(k)?.map(|g| g.value())) };
    if get(META_FORMAT_VERSION)? != Some(FORMAT_VERSION) {
        found.add(
            None,
            format!("format version is {:?}", get(META_FORMAT_VERSION)?),
        );
    }
    let counters = StoredCounters {
        next_id: get(META_NEXT_ID)?.unwrap_or(0),
        next_token: get(META_NEXT_TOKEN)?.unwrap_or(0),
    };
    if counters.next_id == 0 || counters.next_token == 0 {
        found.add(None, "counters missing from leaseq_meta".into());
    }
    Ok(counters)
}

/// Every row, forward: its id (and token) below the counters, it decodes, its payload is
/// where its record says, it is in its state's index, it is listed in `idem_jobs`
/// under its caller key (every job row, live or kept ended), and the dedup key it holds maps to
/// it (a live job's: an ended one let go of it). Returns how many jobs are ready, scheduled, leased, dead, completed and cancelled.
fn check_rows(snap: &Snapshot, counters: &StoredCounters, found: &mut Found) -> Result<[u64; 6]> {
    let StoredCounters {
        next_id,
        next_token,
    } = *counters;
    let mut counts = [0u64; 6];
    for entry in snap.jobs.iter()? {
        let (k, val) = entry?;
        let id = k.value();
        if id == 0 || id >= next_id {
            found.add(Some(id), format!("id not below next_id {next_id}"));
        }
        let record = match JobRecord::decode(val.value()) {
            Ok(r) => r,
            Err(e) => {
                found.add(Some(id), format!("record does not decode: {e}"));
                continue;
            }
        };
        check_payload_place(snap, id, &record, found)?;
        let indexed = match record.state {
            StoredState::Ready => {
                counts[0] += 1;
                let ready = snap
                    .ready
                    .get((priority_rank(record.priority), record.seq, id))?
                    .is_some();
                match record.group.as_deref() {
                    // Deliverable iff it is its group's head, held otherwise: exactly one.
                    Some(g) => {
                        let held = snap.held.get((g, id))?.is_some();
                        let head = snap
                            .groups
                            .range((g, 0)..=(g, u64::MAX))?
                            .next()
                            .transpose()?
                            .is_some_and(|(_, v)| v.value() == id);
                        if ready == held || ready != head {
                            found.add(
                                Some(id),
                                format!(
                                    "ready in a group: deliverable {ready}, held {held}, its group's head {head}"
                                ),
                            );
                        }
                        ready || held
                    }
                    None => ready,
                }
            }
            StoredState::Scheduled => {
                counts[1] += 1;
                snap.scheduled.get((record.run_at_ms, id))?.is_some()
            }
            StoredState::Leased { token, deadline_ms } => {
                counts[2] += 1;
                if token == 0 || token >= next_token {
                    found.add(
                        Some(id),
                        format!("token {token} not below next_token {next_token}"),
                    );
                }
                snap.leases.get((deadline_ms, id))?.is_some()
            }
            StoredState::Dead => {
                counts[3] += 1;
                snap.dead.get(id)?.is_some()
                    && snap.dead_by_time.get((record.run_at_ms, id))?.is_some()
            }
            StoredState::Completed { .. } => {
                counts[4] += 1;
                snap.completed.get((record.history_ms(), id))?.is_some()
            }
            StoredState::Cancelled { .. } => {
                counts[5] += 1;
                snap.cancelled.get((record.history_ms(), id))?.is_some()
            }
        };
        let live = !record.state.is_ended();
        if let Some(g) = record.group.as_deref() {
            let member = snap.groups.get((g, record.group_order))?.map(|v| v.value()) == Some(id);
            // A cancelled delivery its group still waits for stays a member.
            let waited_for = match (&snap.fences, &record.state) {
                (
                    Some(f),
                    StoredState::Cancelled {
                        fenced_until_ms, ..
                    },
                ) => f.get((snap.queue_number, *fenced_until_ms, id))?.is_some(),
                _ => false,
            };
            let should = (live && record.state != StoredState::Dead) || waited_for;
            if member != should {
                found.add(
                    Some(id),
                    format!(
                        "{:?} in a group, and {} its group's members",
                        record.state.job_state(),
                        if member { "among" } else { "missing from" }
                    ),
                );
            }
        }
        if !indexed {
            found.add(
                Some(id),
                format!("{:?} but missing from its index", record.state.job_state()),
            );
        }
        if let Some(k) = record.idempotency_key.as_deref()
            && snap
                .idem_jobs
                .get((marker_key(k).as_slice(), id))?
                .is_none()
        {
            found.add(
                Some(id),
                "carries an idempotency key leaseq_idem_jobs does not list".into(),
            );
        }
        // A key held by a window may have been released (window ended) or taken over.
        if let Some(key) = &record.dedup_key
            && live
            && record.dedup_window_ms.is_none()
            && snap.dedup.get(key.as_slice())?.map(|g| g.value()) != Some(id)
        {
            found.add(
                Some(id),
                "holds a dedup key the dedup table does not map to it".into(),
            );
        }
    }
    Ok(counts)
}

/// A payload above the inline limit is stored apart, and a payload stored apart has its row,
/// which matches the record's length and checksum.
fn check_payload_place(
    snap: &Snapshot,
    id: u64,
    record: &JobRecord,
    found: &mut Found,
) -> Result<()> {
    match &record.payload_apart {
        None if record.payload.len() > PAYLOAD_INLINE_MAX => {
            found.add(
                Some(id),
                "a payload above the inline limit is inline".into(),
            );
        }
        None => {}
        Some(r) => match snap.payloads.get(id)? {
            None => found.add(
                Some(id),
                "payload stored apart, but its row is missing".into(),
            ),
            Some(p) => {
                if let Err(e) = r.verify(p.value()) {
                    found.add(Some(id), e.to_string());
                }
            }
        },
    }
    Ok(())
}

/// Each state's index has exactly as many entries as jobs are in that state.
fn check_index_sizes(snap: &Snapshot, counts: [u64; 6], found: &mut Found) -> Result<()> {
    let lens = [
        snap.ready.len()? + snap.held.len()?,
        snap.scheduled.len()?,
        snap.leases.len()?,
        snap.dead.len()?,
        snap.completed.len()?,
        snap.cancelled.len()?,
    ];
    for ((name, count), len) in [
        "ready",
        "scheduled",
        "leases",
        "dead",
        "completed",
        "cancelled",
    ]
    .iter()
    .zip(counts)
    .zip(lens)
    {
        if count != len {
            found.add(
                None,
                format!("{count} jobs are {name} but its index has {len} entries"),
            );
        }
    }
    Ok(())
}

/// Every payload row belongs to a job stored apart (or a quarantined one: its row stays
/// until `remove`); a scan, since a missing row and a stray one would leave the counts
/// equal.
fn check_payload_rows(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.payloads.iter()? {
        let id = e?.0.value();
        if !(state_of_apart(&snap.jobs, id)? || snap.is_quarantined(id)?) {
            found.add(Some(id), "payload row of no job".into());
        }
    }
    Ok(())
}

/// Every ready entry names a ready job of that priority and sequence number.
fn check_ready_entries(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.ready.iter()? {
        let (rank, seq, id) = e?.0.value();
        let ok = snap.record(id)?.is_some_and(|r| {
            r.state == StoredState::Ready && priority_rank(r.priority) == rank && r.seq == seq
        });
        if !ok {
            found.add(Some(id), "ready entry without a matching ready job".into());
        }
    }
    Ok(())
}

/// Every scheduled entry names a scheduled job due at that time.
fn check_scheduled_entries(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.scheduled.iter()? {
        let (run_at, id) = e?.0.value();
        let ok = snap
            .record(id)?
            .is_some_and(|r| r.state == StoredState::Scheduled && r.run_at_ms == run_at);
        if !ok {
            found.add(
                Some(id),
                "scheduled entry without a matching scheduled job".into(),
            );
        }
    }
    Ok(())
}

/// Every lease entry names a leased job with that deadline.
fn check_lease_entries(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.leases.iter()? {
        let (deadline, id) = e?.0.value();
        let ok = snap.record(id)?.is_some_and(
            |r| matches!(r.state, StoredState::Leased { deadline_ms, .. } if deadline_ms == deadline),
        );
        if !ok {
            found.add(Some(id), "lease entry without a matching leased job".into());
        }
    }
    Ok(())
}

/// Every dead entry names a dead job.
fn check_dead_entries(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.dead.iter()? {
        let id = e?.0.value();
        if !snap
            .record(id)?
            .is_some_and(|r| r.state == StoredState::Dead)
        {
            found.add(Some(id), "dead entry without a dead job".into());
        }
    }
    Ok(())
}

/// Every completed or cancelled entry names a job of that state whose row may go at that
/// time.
fn check_history_entries(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for (index, completed) in [(&snap.completed, true), (&snap.cancelled, false)] {
        for e in index.iter()? {
            let (at, id) = e?.0.value();
            let ok = snap.record(id)?.is_some_and(|r| {
                r.history_ms() == at
                    && match r.state {
                        StoredState::Completed { .. } => completed,
                        StoredState::Cancelled { .. } => !completed,
                        _ => false,
                    }
            });
            if !ok {
                let state = if completed { "completed" } else { "cancelled" };
                found.add(Some(id), format!("{state} entry without a matching job"));
            }
        }
    }
    Ok(())
}

/// Applied markers: only caller keys, each in the time index under its kept_since_ms, and
/// the time index names only markers.
fn check_applied_markers(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.applied.iter()? {
        if e?.0.value().first() != Some(&MARKER_TAG_KEY) {
            found.add(None, "an applied marker that is not a caller key's".into());
        }
    }
    check_time_index(
        &snap.applied,
        &snap.applied_by_time,
        "applied marker",
        found,
    )
}

/// Each `idem_jobs` entry names a live (or quarantined) job that carries that key.
fn check_idem_jobs(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.idem_jobs.iter()? {
        let entry = e?.0;
        let (k, id) = entry.value();
        let carried = match snap.record(id)? {
            Some(r) => r
                .idempotency_key
                .as_deref()
                .is_some_and(|ik| marker_key(ik) == k),
            None => snap.is_quarantined(id)?,
        };
        if !carried {
            found.add(
                Some(id),
                "leaseq_idem_jobs names a job that does not carry the key".into(),
            );
        }
    }
    Ok(())
}

/// Every quarantined job is reported, and none is also in the jobs table.
fn check_quarantine(snap: &Snapshot, found: &mut Found) -> Result<()> {
    if let Some(q) = &snap.quarantine {
        for e in q.iter()? {
            let (k, row) = e?;
            let id = k.value();
            found.add(Some(id), format!("quarantined: {}", row.value().1));
            if snap.jobs.get(id)?.is_some() {
                found.add(Some(id), "both quarantined and in leaseq_jobs".into());
            }
        }
    }
    Ok(())
}

/// The dead jobs' time index has one entry per dead job.
fn check_dead_time_index(snap: &Snapshot, found: &mut Found) -> Result<()> {
    if snap.dead_by_time.len()? != snap.dead.len()? {
        found.add(
            None,
            format!(
                "leaseq_dead_by_time has {} entries, leaseq_dead {}",
                snap.dead_by_time.len()?,
                snap.dead.len()?
            ),
        );
    }
    Ok(())
}

/// Dedup windows and their expiry index agree both ways, and every window's key has a holder.
/// A holder whose row is kept, and still carries the key, records the window as it runs:
/// its `created_ms` plus its `dedup_window_ms` is the window's end (an extension by a
/// duplicate moves both).
fn check_dedup_windows(snap: &Snapshot, found: &mut Found) -> Result<()> {
    check_time_index(
        &snap.dedup_windows,
        &snap.dedup_expiry,
        "dedup window",
        found,
    )?;
    for e in snap.dedup_windows.iter()? {
        let (k, end_ms) = e?;
        let end_ms = end_ms.value();
        let Some(holder) = snap.dedup.get(k.value())?.map(|v| v.value()) else {
            found.add(None, "a dedup window without a holder".into());
            continue;
        };
        let Some(record) = snap.record(holder)? else {
            continue;
        };
        if record.dedup_key.as_deref() != Some(k.value()) {
            continue;
        }
        let recorded = record
            .dedup_window_ms
            .map(|w| record.created_ms.saturating_add(w));
        if recorded != Some(end_ms) {
            found.add(
                Some(holder),
                format!(
                    "its dedup window ends at {end_ms} ms, its record says {recorded:?} \
                     (created_ms plus dedup_window_ms)"
                ),
            );
        }
    }
    Ok(())
}

/// Every dedup entry names the job that holds the key, unless a window holds it.
fn check_dedup_holders(snap: &Snapshot, found: &mut Found) -> Result<()> {
    for e in snap.dedup.iter()? {
        let (k, holder) = e?;
        let holder = holder.value();
        // A quarantined job keeps its key until it is removed (reported above); a window
        // holds its key whatever became of the job that took it.
        let held = snap.dedup_windows.get(k.value())?.is_some() || snap.is_quarantined(holder)?;
        let ok = held
            || snap
                .record(holder)?
                .is_some_and(|r| !r.state.is_ended() && r.dedup_key.as_deref() == Some(k.value()));
        if !ok {
            found.add(
                Some(holder),
                "dedup entry names a job that does not hold the key".into(),
            );
        }
    }
    Ok(())
}

/// Checks that `table` (key → time) and its time index (time, key) agree both ways.
fn check_time_index(
    table: &ReadOnlyTable<&'static [u8], u64>,
    index: &ReadOnlyTable<(u64, &'static [u8]), ()>,
    what: &str,
    found: &mut Found,
) -> Result<()> {
    for e in table.iter()? {
        let (k, at) = e?;
        if index.get((at.value(), k.value()))?.is_none() {
            found.add(
                None,
                format!("{what} at {} missing from its time index", at.value()),
            );
        }
    }
    for e in index.iter()? {
        let entry = e?.0;
        let (at, k) = entry.value();
        if table.get(k)?.map(|g| g.value()) != Some(at) {
            found.add(
                None,
                format!("{what} time index entry at {at} without its entry"),
            );
        }
    }
    Ok(())
}

/// Whether job `id` has a good record whose payload is stored apart.
fn state_of_apart(jobs: &ReadOnlyTable<u64, &'static [u8]>, id: u64) -> Result<bool> {
    Ok(jobs
        .get(id)?
        .is_some_and(|g| JobRecord::decode(g.value()).is_ok_and(|r| r.payload_apart.is_some())))
}

/// `leaseq_queue_limits` (format 13 on): every row names a queue of the file, holds a limit
/// a build writes, and counts exactly the payload bytes of its queue's scheduled, ready and
/// leased jobs (a queue with quarantined rows may count more: a damaged row's bytes cannot
/// be read back off the count).
fn check_queue_limits(
    rtx: &ReadTransaction,
    named: &[(String, u32)],
    version: Option<u64>,
    out: &mut Vec<crate::job::Violation>,
) -> Result<()> {
    let mut push = |detail: String| {
        if out.len() < crate::limits::VIOLATIONS_MAX {
            out.push(crate::job::Violation {
                job_id: None,
                detail,
            });
        }
    };
    let table = match rtx.open_table(crate::format::schema::QUEUE_LIMITS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            if version.is_some_and(|v| v >= 13) {
                push("leaseq_queue_limits is missing (format 13)".to_string());
            }
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    for e in table.iter()? {
        let (k, v) = e?;
        let (n, row) = (k.value(), v.value());
        let schema = match n {
            0 => &crate::format::schema::DEFAULT_SCHEMA,
            n if named.iter().any(|(_, q)| *q == n) => QueueSchema::named(n),
            _ => {
                push(format!(
                    "leaseq_queue_limits names queue number {n}, which is not registered"
                ));
                continue;
            }
        };
        if let Err(e) = crate::format::queue_limit::decode(n, row) {
            push(e.to_string());
        }
        let mut counted = 0u64;
        for e in rtx.open_table(schema.jobs())?.iter()? {
            let (_, bytes) = e?;
            if let Ok(r) = JobRecord::decode(bytes.value())
                && r.state.is_live()
            {
                counted = counted.saturating_add(r.payload_len() as u64);
            }
        }
        let quarantined = match quarantine_table(rtx, schema)? {
            Some(q) => q.len()?,
            None => 0,
        };
        if row.3 != counted && !(quarantined > 0 && row.3 > counted) {
            push(format!(
                "leaseq_queue_limits counts {} payload bytes in queue number {n}, its jobs hold {counted}",
                row.3
            ));
        }
    }
    Ok(())
}
