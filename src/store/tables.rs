//! The `Tables` of one queue inside a write transaction: lazy opens, the state indexes, dedup
//! keys, payloads stored apart, quarantine and the repair of stray entries.

use crate::events::Event;
use redb::{ReadableTable, ReadableTableMetadata, Table};

use crate::commit::{Ctx, GroupLog, GroupTable, GroupTx, Verdict, refuse};
use crate::error::{Error, Result};
use crate::format::record::{JobRecord, PayloadRef, StoredState};
use crate::format::schema::{
    GROUP_FENCES, QuarantineValue, QueueSchema, marker_key, priority_rank,
};
use crate::job::JobId;
use crate::limits::PAYLOAD_INLINE_MAX;

use super::validate::{damaged, truncate_reason};

/// Removes exactly the entries `sorted` (ascending, unique) from `table`, all within `range`,
/// in one pass. An entry that is missing (index damage) is logged, not an error: the rows it
/// stood for are deleted all the same.
fn remove_dense<K, V>(
    table: &mut GroupTable<'_, K, V>,
    range: std::ops::RangeInclusive<K>,
    sorted: &[K],
    name: &str,
) -> Result<()>
where
    K: redb::Key + Ord + Copy + std::fmt::Debug + 'static,
    for<'a> K: std::borrow::Borrow<K::SelfType<'a>> + From<K::SelfType<'a>>,
    V: redb::Value + 'static,
{
    let mut removed = 0;
    table.retain_in(range, |k, _| {
        let gone = sorted.binary_search(&K::from(k)).is_ok();
        removed += usize::from(gone);
        !gone
    })?;
    debug_assert!(removed <= sorted.len());
    if removed != sorted.len() {
        tracing::warn!(
            table = name,
            missing = sorted.len() - removed,
            "leaseq: index entries to delete were missing"
        );
    }
    Ok(())
}

/// The tables a state change touches. `jobs` is opened at once, the index tables when
/// first used: every table opened in a transaction costs an open, a close and a root check
/// at commit (about a fifth of an operation's CPU when all six were opened every time).
///
/// Each table has a reading accessor (`jobs()`, `ready()`, ...: a shared reference to the
/// redb table, which cannot write) and a writing one (`jobs_mut()`, `ready_mut()`, ...: the
/// group's [`GroupTable`], whose writes mark the group): the one write path, as for the
/// file-wide tables ([`GroupTx::table`]).
pub(super) struct Tables<'t> {
    /// The group's transaction, for the file-wide tables an operation writes beside these.
    pub(super) gtx: GroupTx<'t>,
    pub(super) schema: &'static QueueSchema,
    jobs: GroupTable<'t, u64, &'static [u8]>,
    ready: Option<GroupTable<'t, (u32, u64, u64), ()>>,
    scheduled: Option<GroupTable<'t, (u64, u64), ()>>,
    leases: Option<GroupTable<'t, (u64, u64), ()>>,
    dead: Option<GroupTable<'t, u64, ()>>,
    dedup: Option<GroupTable<'t, &'static [u8], u64>>,
    quarantine: Option<GroupTable<'t, u64, QuarantineValue>>,
    idem_jobs: Option<GroupTable<'t, (&'static [u8], u64), ()>>,
    windows: Option<GroupTable<'t, &'static [u8], u64>>,
    expiry: Option<GroupTable<'t, (u64, &'static [u8]), ()>>,
    dead_by_time: Option<GroupTable<'t, (u64, u64), ()>>,
    payloads: Option<GroupTable<'t, u64, &'static [u8]>>,
    completed: Option<GroupTable<'t, (u64, u64), ()>>,
    cancelled: Option<GroupTable<'t, (u64, u64), ()>>,
    groups: Option<GroupTable<'t, (&'static [u8], u64), u64>>,
    held: Option<GroupTable<'t, (&'static [u8], u64), ()>>,
    /// `leaseq_schedule_instances` was found empty (no schedule has a live last instance in
    /// the file) by a job that ended: later ending jobs need no lookup in it. Forgotten when a
    /// schedule fires ([`Tables::instances_changed`]).
    instances_empty: bool,
    /// The queue's history setting, read on first use.
    history: Option<crate::job::History>,
    /// Whether the queue has a size limit (whose row counts its payload bytes), read on the
    /// first move of a job in or out of the counted states.
    limited: Option<bool>,
}

/// A job row as read: absent, present but failing its checks (the reason), or good.
// One row at a time, on the stack, moved into its use: boxing the record would only add an
// allocation per read.
#[allow(clippy::large_enum_variant)]
pub(super) enum Row {
    Missing,
    Damaged(String),
    Good(JobRecord),
}

/// Adds `add` and takes `sub` payload bytes off the count of queue `queue_number`'s row, if
/// it has one; whether it has one.
fn count_bytes(
    gtx: crate::commit::GroupTx<'_>,
    queue_number: u32,
    add: u64,
    sub: u64,
) -> Result<bool> {
    let mut table = gtx.table(crate::format::schema::QUEUE_LIMITS)?;
    let Some(mut row) = table.get(queue_number)?.map(|v| v.value()) else {
        return Ok(false);
    };
    let counted = row.3.saturating_add(add);
    // A count below what leaves is a count that missed a job (damage repaired while it was
    // counted): it stays at 0 rather than wrapping.
    row.3 = counted.saturating_sub(sub);
    table.insert(queue_number, row)?;
    Ok(true)
}

/// The table in `slot`, opened from `tx` on first use.
fn lazy<'a, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
    slot: &'a mut Option<GroupTable<'t, K, V>>,
    tx: GroupTx<'t>,
    def: redb::TableDefinition<'static, K, V>,
) -> Result<&'a mut GroupTable<'t, K, V>> {
    if slot.is_none() {
        *slot = Some(tx.table(def)?);
    }
    Ok(slot.as_mut().expect("opened above"))
}

/// The two accessors of each lazily opened table: `$read` (a shared reference to the redb
/// table: reads only) and `$write` (the [`GroupTable`], whose writes mark the group).
macro_rules! table_accessors {
    ($($read:ident, $write:ident: $field:ident = $def:ident: $k:ty => $v:ty;)*) => {$(
        pub(super) fn $read(&mut self) -> Result<&Table<'t, $k, $v>> {
            lazy(&mut self.$field, self.gtx, self.schema.$def()).map(|table| &**table)
        }

        pub(super) fn $write(&mut self) -> Result<&mut GroupTable<'t, $k, $v>> {
            lazy(&mut self.$field, self.gtx, self.schema.$def())
        }
    )*};
}

impl<'t> Tables<'t> {
    // reader, writer: field = the `QueueSchema` definition: key => value
    table_accessors! {
        ready, ready_mut: ready = ready: (u32, u64, u64) => ();
        scheduled, scheduled_mut: scheduled = scheduled: (u64, u64) => ();
        leases, leases_mut: leases = leases: (u64, u64) => ();
        dead, dead_mut: dead = dead: u64 => ();
        dedup, dedup_mut: dedup = dedup: &'static [u8] => u64;
        idem_jobs, idem_jobs_mut: idem_jobs = idem_jobs: (&'static [u8], u64) => ();
        dead_by_time, dead_by_time_mut: dead_by_time = dead_by_time: (u64, u64) => ();
        payloads, payloads_mut: payloads = payloads: u64 => &'static [u8];
        dedup_windows, dedup_windows_mut: windows = dedup_windows: &'static [u8] => u64;
        dedup_expiry, dedup_expiry_mut: expiry = dedup_expiry: (u64, &'static [u8]) => ();
        completed, completed_mut: completed = completed: (u64, u64) => ();
        cancelled, cancelled_mut: cancelled = cancelled: (u64, u64) => ();
        groups, groups_mut: groups = groups: (&'static [u8], u64) => u64;
        held, held_mut: held = held: (&'static [u8], u64) => ();
    }

    /// The tables of queue `schema` in the operation's transaction, marking its group when they
    /// write.
    pub(super) fn open(ctx: &Ctx<'t>, schema: &'static QueueSchema) -> Result<Tables<'t>> {
        Tables::open_with(ctx.group(), schema)
    }

    /// The tables of another queue `schema` of the file, in the same transaction and marking
    /// the same group.
    pub(super) fn open_other(&self, schema: &'static QueueSchema) -> Result<Tables<'t>> {
        Tables::open_with(self.gtx, schema)
    }

    fn open_with(gtx: GroupTx<'t>, schema: &'static QueueSchema) -> Result<Tables<'t>> {
        Ok(Tables {
            gtx,
            schema,
            jobs: gtx.table(schema.jobs())?,
            ready: None,
            scheduled: None,
            leases: None,
            dead: None,
            dedup: None,
            quarantine: None,
            idem_jobs: None,
            windows: None,
            expiry: None,
            dead_by_time: None,
            payloads: None,
            completed: None,
            cancelled: None,
            groups: None,
            held: None,
            instances_empty: false,
            history: None,
            limited: None,
        })
    }

    /// The group's log: events, wake-ups.
    pub(super) fn log(&self) -> GroupLog<'t> {
        self.gtx.log()
    }

    /// Opens every index table now (and `leaseq_quarantine`, creating it if needed).
    pub(super) fn open_all(&mut self) -> Result<()> {
        self.ready()?;
        self.scheduled()?;
        self.leases()?;
        self.dead()?;
        self.dedup()?;
        self.idem_jobs()?;
        self.dedup_windows()?;
        self.dedup_expiry()?;
        self.dead_by_time()?;
        self.payloads()?;
        self.completed()?;
        self.cancelled()?;
        self.groups()?;
        self.held()?;
        self.history()?;
        lazy(&mut self.quarantine, self.gtx, self.schema.quarantine())?;
        Ok(())
    }

    /// The completed history the queue keeps (`leaseq_history_limits`), read once per
    /// operation.
    pub(super) fn history(&mut self) -> Result<crate::job::History> {
        if let Some(h) = self.history {
            return Ok(h);
        }
        let limits = self.gtx.table(crate::format::schema::HISTORY_LIMITS)?;
        let h = super::control::history_in(&*limits, self.schema.queue_number)?;
        self.history = Some(h);
        Ok(h)
    }

    /// Job `id` left the live states at `ended_ms` (acked, died, cancelled, removed; a dead
    /// job removed later ended when it died): if it
    /// is a schedule's last instance, its entry in `leaseq_schedule_instances` records when,
    /// for the schedule's next due time ([`Overlap::Skip`](crate::Overlap::Skip)). A lookup in
    /// a table of at most one entry per schedule.
    pub(super) fn note_instance_end(&mut self, id: u64, ended_ms: u64) -> Result<()> {
        if self.instances_empty {
            return Ok(());
        }
        let mut instances = self.gtx.table(crate::format::schema::SCHEDULE_INSTANCES)?;
        if instances.is_empty()? {
            self.instances_empty = true;
            return Ok(());
        }
        let key = (self.schema.queue_number, id);
        if instances.get(key)?.is_some() {
            instances.insert(key, ended_ms)?;
        }
        Ok(())
    }

    /// A schedule fired in this operation and wrote `leaseq_schedule_instances`: the next
    /// ending job looks at the table again.
    pub(super) fn instances_changed(&mut self) {
        self.instances_empty = false;
    }

    pub(super) fn jobs(&self) -> &Table<'t, u64, &'static [u8]> {
        &self.jobs
    }

    pub(super) fn jobs_mut(&mut self) -> &mut GroupTable<'t, u64, &'static [u8]> {
        &mut self.jobs
    }

    /// Stores `record`'s payload apart (under `id`) if it is larger than `PAYLOAD_INLINE_MAX`,
    /// leaving its length and checksum in the record.
    pub(super) fn store_payload(&mut self, id: u64, record: &mut JobRecord) -> Result<()> {
        if record.payload.len() > PAYLOAD_INLINE_MAX {
            let payload = std::mem::take(&mut record.payload);
            record.payload_apart = Some(PayloadRef::of(&payload));
            self.payloads_mut()?.insert(id, payload.as_slice())?;
        }
        Ok(())
    }

    /// Gives job `id` (its `record`, not yet written back) the payload `payload`: inline, or
    /// apart above `PAYLOAD_INLINE_MAX`, its old row apart dropped. The caller unindexed the
    /// record first (so the counted bytes lose the old payload and gain the new one at
    /// [`Tables::put`]).
    pub(super) fn replace_payload(
        &mut self,
        id: u64,
        record: &mut JobRecord,
        payload: &[u8],
    ) -> Result<()> {
        if record.payload_apart.take().is_some() {
            self.payloads_mut()?.remove(id)?;
        }
        record.payload = payload.to_vec();
        self.store_payload(id, record)
    }

    /// The payload job `id` stores apart, checked against its reference; `Ok(Err(why))` if
    /// it is missing or damaged.
    pub(super) fn apart_payload(
        &mut self,
        id: u64,
        r: &PayloadRef,
    ) -> Result<Result<Vec<u8>, String>> {
        Ok(match self.payloads()?.get(id)? {
            None => Err("payload: stored apart, but its row is missing".to_string()),
            Some(v) => r
                .verify(v.value())
                .map(|()| v.value().to_vec())
                .map_err(|e| e.to_string()),
        })
    }

    /// Removes the payload job `id` stores apart, if it does.
    fn drop_payload(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        if record.payload_apart.is_some() && self.payloads_mut()?.remove(id)?.is_none() {
            tracing::warn!(job_id = id, "leaseq: the job's payload row was missing");
        }
        Ok(())
    }

    /// Who holds dedup key `k` at `now_ms`: `None` if nobody does (a window that ended
    /// releases the key, its entries removed here), else the holder and whether the key is
    /// held by a window (rather than by the holder being live).
    pub(super) fn key_holder(&mut self, k: &[u8], now_ms: u64) -> Result<Option<(u64, bool)>> {
        let Some(owner) = self.dedup()?.get(k)?.map(|v| v.value()) else {
            return Ok(None);
        };
        let window_end_ms = self.dedup_windows()?.get(k)?.map(|v| v.value());
        match window_end_ms {
            Some(end_ms) if end_ms <= now_ms => {
                self.end_window(k, end_ms)?;
                Ok(None)
            }
            Some(_) => Ok(Some((owner, true))),
            None => Ok(Some((owner, false))),
        }
    }

    /// Moves the end of the window holding dedup key `k` (taken by job `owner`) to `end_ms`
    /// if that is later ([`EnqueueOptions::extend_dedup_window`](crate::job::EnqueueOptions::extend_dedup_window)):
    /// the window, its expiry entry, and the record of its holder while its row is kept (its
    /// `dedup_window_ms`, counted from its `created_ms`, capped at `DELAY_MAX`, so that the
    /// record and the window agree). A key without a window is left as it is.
    pub(super) fn extend_window(&mut self, k: &[u8], owner: u64, end_ms: u64) -> Result<()> {
        let Some(old_end_ms) = self.dedup_windows()?.get(k)?.map(|v| v.value()) else {
            return Ok(());
        };
        let holder = match self.row(owner)? {
            Row::Good(r) if r.dedup_key.as_deref() == Some(k) && r.dedup_window_ms.is_some() => {
                Some(r)
            }
            _ => None,
        };
        let window_max_ms = crate::clock::duration_ms(crate::limits::DELAY_MAX);
        let end_ms = match &holder {
            Some(r) => end_ms.min(r.created_ms.saturating_add(window_max_ms)),
            None => end_ms,
        };
        if end_ms <= old_end_ms {
            return Ok(());
        }
        self.dedup_windows_mut()?.insert(k, end_ms)?;
        self.dedup_expiry_mut()?.remove((old_end_ms, k))?;
        self.dedup_expiry_mut()?.insert((end_ms, k), ())?;
        if let Some(mut record) = holder
            && let Some(w) = end_ms.checked_sub(record.created_ms)
        {
            record.dedup_window_ms = Some(w);
            // Its state, and so its index entry, is unchanged.
            record.check_invariants()?;
            self.jobs_mut().insert(owner, record.encode()?.as_slice())?;
        }
        Ok(())
    }

    /// Releases dedup key `k` whose window ends at `end_ms`: its window, its expiry entry and
    /// its holder entry. The job that held it is not touched.
    pub(super) fn end_window(&mut self, k: &[u8], end_ms: u64) -> Result<()> {
        self.dedup_windows_mut()?.remove(k)?;
        self.dedup_expiry_mut()?.remove((end_ms, k))?;
        self.dedup_mut()?.remove(k)?;
        Ok(())
    }

    /// Removes every dedup entry held by job `id` (with its window): a scan of the dedup
    /// table, for a row whose keys cannot be read (damaged or quarantined).
    pub(super) fn drop_keys_of(&mut self, id: u64) -> Result<()> {
        let mut keys = Vec::new();
        for e in self.dedup()?.iter()? {
            let (k, owner) = e?;
            if owner.value() == id {
                keys.push(k.value().to_vec());
            }
        }
        for k in keys {
            let window_end_ms = self.dedup_windows()?.get(k.as_slice())?.map(|v| v.value());
            match window_end_ms {
                Some(end_ms) => self.end_window(&k, end_ms)?,
                None => {
                    self.dedup_mut()?.remove(k.as_slice())?;
                }
            }
        }
        self.idem_jobs_mut()?.retain(|(_, j), ()| j != id)?;
        Ok(())
    }

    /// The row of job `id`; `Err` only for storage errors, never for a damaged row.
    pub(super) fn row(&self, id: u64) -> Result<Row> {
        Ok(match self.jobs().get(id)? {
            None => Row::Missing,
            Some(v) => match JobRecord::decode(v.value()) {
                Ok(record) => Row::Good(record),
                Err(e) => Row::Damaged(e.to_string()),
            },
        })
    }

    /// Whether another queue of the file holds a row of job `id` (ids are the file's): a call
    /// on this queue that finds no row tells "in another queue" from "gone" by it. Reads the
    /// registry and one row per queue (at most `QUEUES_MAX`).
    pub(super) fn in_another_queue(&self, id: u64) -> Result<bool> {
        let mut numbers = vec![0];
        {
            let queues = self.gtx.table(crate::format::schema::QUEUES)?;
            for e in queues.iter()?.take(crate::limits::QUEUES_MAX as usize) {
                let n = e?.1.value();
                if (1..=crate::limits::QUEUES_MAX).contains(&n) {
                    numbers.push(n);
                }
            }
        }
        for n in numbers {
            if n == self.schema.queue_number {
                continue;
            }
            let schema = match n {
                0 => &crate::format::schema::DEFAULT_SCHEMA,
                n => QueueSchema::named(n),
            };
            if self.gtx.table(schema.jobs())?.get(id)?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether job `id` has a row in `leaseq_quarantine`, looked up without creating the
    /// table (a refusal writes nothing; opening it in a write transaction would create it).
    pub(super) fn is_quarantined(&mut self, id: u64) -> Result<bool> {
        if self.quarantine.is_none() {
            let name = redb::TableHandle::name(&self.schema.quarantine()).to_string();
            if !self
                .gtx
                .list_tables()?
                .any(|t| redb::TableHandle::name(&t) == name)
            {
                return Ok(false);
            }
        }
        let table = lazy(&mut self.quarantine, self.gtx, self.schema.quarantine())?;
        Ok(table.get(id)?.is_some())
    }

    /// Deletes job `id`'s row in `leaseq_quarantine`.
    pub(super) fn remove_quarantined(&mut self, id: u64) -> Result<()> {
        lazy(&mut self.quarantine, self.gtx, self.schema.quarantine())?.remove(id)?;
        Ok(())
    }

    /// Moves the damaged row of job `id` whole into `leaseq_quarantine` (its bytes as found,
    /// with `reason`), so the pass that met it goes on with the rest. The caller has removed
    /// the index entry that led to it. A dedup key the job held stays held by it until
    /// [`remove`](super::admin::remove) deletes the quarantined row.
    pub(super) fn quarantine(&mut self, id: u64, reason: &str, now_ms: u64) -> Result<()> {
        let raw = self
            .jobs
            .remove(id)?
            .ok_or_else(|| Error::corrupted(format!("job {id}: no row to quarantine")))?;
        let reason = truncate_reason(reason);
        tracing::warn!(job_id = id, %reason, "leaseq: job record quarantined");
        lazy(&mut self.quarantine, self.gtx, self.schema.quarantine())?
            .insert(id, (now_ms, reason.as_str(), raw.value()))?;
        Ok(())
    }

    /// After a pass removed an index entry (of job `id`) that did not match the job's row:
    /// a damaged row is quarantined; a good row gets back its own index entry if that is
    /// missing (an index entry damaged in place); nothing is left to do for a missing row.
    /// Returns whether a row was quarantined.
    pub(super) fn repair_stray_entry(&mut self, id: u64, row: Row, now_ms: u64) -> Result<bool> {
        match row {
            Row::Missing => {
                tracing::warn!(job_id = id, "leaseq: index entry without a job row dropped");
                Ok(false)
            }
            Row::Good(record) => {
                tracing::warn!(
                    job_id = id,
                    "leaseq: index entry disagreeing with its job dropped"
                );
                self.reindex(id, &record)?;
                Ok(false)
            }
            Row::Damaged(why) => {
                self.quarantine(id, &why, now_ms)?;
                Ok(true)
            }
        }
    }

    /// Inserts the index entry of `record`'s state (a no-op if it is there).
    fn reindex(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        self.index(id, record).map(drop)
    }

    /// Writes `record` under `id` and adds the index entry of its state. The caller has
    /// already removed the entry of its previous state. An entry already there (a stray one
    /// with the same key, index damage) is logged and kept: it now names the job rightly.
    pub(super) fn put(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        record.check_invariants()?;
        self.jobs_mut().insert(id, record.encode()?.as_slice())?;
        if !self.index(id, record)? {
            tracing::warn!(job_id = id, "leaseq: index entry was already present");
        }
        Ok(())
    }

    /// [`Tables::put`] of a job that moves between counted states (ready to leased) whose
    /// previous index entry was removed without [`Tables::unindex`]: the counted payload
    /// bytes stay as they are.
    pub(super) fn put_moved(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        record.check_invariants()?;
        self.jobs_mut().insert(id, record.encode()?.as_slice())?;
        if !self.index_moved(id, record)? {
            tracing::warn!(job_id = id, "leaseq: index entry was already present");
        }
        Ok(())
    }

    /// [`Tables::index`] of a job that moves between counted states, its previous entry
    /// removed without [`Tables::unindex`]: nothing is counted.
    pub(super) fn index_moved(&mut self, id: u64, record: &JobRecord) -> Result<bool> {
        debug_assert!(record.state.is_live());
        match record.group.as_deref() {
            Some(g) => self.index_grouped(id, record, g),
            None => self.index_state(id, record),
        }
    }

    /// Notes whether the queue has a size limit, as a look at its row found (so the counts of
    /// this operation need no look of their own).
    pub(super) fn note_limited(&mut self, limited: bool) {
        self.limited = Some(limited);
    }

    /// [`Tables::put`] for a new job: `Corrupted` (the transaction then aborts) if the id is
    /// already in use, found by the insert itself rather than a read before it.
    pub(super) fn put_new(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        record.check_invariants()?;
        if self
            .jobs_mut()
            .insert(id, record.encode()?.as_slice())?
            .is_some()
        {
            return Err(Error::corrupted(format!("job id {id} is already in use")));
        }
        if !self.index(id, record)? {
            tracing::warn!(job_id = id, "leaseq: index entry was already present");
        }
        Ok(())
    }

    /// Inserts the index entry of `record`'s state; whether it was absent. A job of an
    /// ordered group joins its group while live (leaves it when dead or ended, making the
    /// next member the head), and when ready is held behind its group's head unless it is
    /// the head.
    pub(super) fn index(&mut self, id: u64, record: &JobRecord) -> Result<bool> {
        let absent = match record.group.as_deref() {
            Some(g) => self.index_grouped(id, record, g)?,
            None => self.index_state(id, record)?,
        };
        if absent && record.state.is_live() {
            self.count_bytes(record.payload_len() as u64, 0)?;
        }
        Ok(absent)
    }

    /// Takes `bytes` off the queue's counted payload bytes, for jobs whose counted index
    /// entries a pass removed without [`Tables::unindex`].
    pub(super) fn uncount_bytes(&mut self, bytes: u64) -> Result<()> {
        self.count_bytes(0, bytes)
    }

    /// Adds `add` and takes `sub` payload bytes off the queue's count, if it has a size
    /// limit (`store/queue_limit.rs`): the count in its `leaseq_queue_limits` row.
    fn count_bytes(&mut self, add: u64, sub: u64) -> Result<()> {
        if add == sub || self.limited == Some(false) {
            return Ok(());
        }
        let limited = count_bytes(self.gtx, self.schema.queue_number, add, sub)?;
        self.limited = Some(limited);
        Ok(())
    }

    /// [`Tables::index`] of a job of group `g`.
    fn index_grouped(&mut self, id: u64, record: &JobRecord, g: &[u8]) -> Result<bool> {
        let order = record.group_order;
        match record.state {
            StoredState::Ready | StoredState::Scheduled | StoredState::Leased { .. } => {
                self.groups_mut()?.insert((g, order), id)?;
                if record.state == StoredState::Ready && !self.is_head(g, id)? {
                    return Ok(self.held_mut()?.insert((g, id), ())?.is_none());
                }
                self.index_state(id, record)
            }
            StoredState::Cancelled {
                fenced_until_ms, ..
            } if fenced_until_ms > record.run_at_ms
                && self.groups()?.get((g, order))?.map(|v| v.value()) == Some(id) =>
            {
                // Cancelled while leased: its worker may still be running, so the group waits
                // for that delivery to end before its next member (the wait's entry, with the
                // lease's token, is `end_job`'s to write).
                self.index_state(id, record)
            }
            _ => {
                let absent = self.index_state(id, record)?;
                self.leave_group(g, id, order)?;
                Ok(absent)
            }
        }
    }

    /// Whether cancelled `record` (job `id`) is a delivery its group still waits for: its
    /// entry in `leaseq_group_fences` is there.
    fn fence_holds(&self, id: u64, record: &JobRecord) -> Result<bool> {
        let StoredState::Cancelled {
            fenced_until_ms, ..
        } = record.state
        else {
            return Ok(false);
        };
        let fences = self.gtx.table(GROUP_FENCES)?;
        Ok(fences
            .get((self.schema.queue_number, fenced_until_ms, id))?
            .is_some())
    }

    /// Ends the wait of cancelled `record`'s group (job `id`) for its delivery, if it waits:
    /// its fence entry goes, and the job leaves its group (the next member may be delivered).
    fn end_fence(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        let (
            Some(g),
            StoredState::Cancelled {
                fenced_until_ms, ..
            },
        ) = (record.group.as_deref(), &record.state)
        else {
            return Ok(());
        };
        self.gtx
            .table(GROUP_FENCES)?
            .remove((self.schema.queue_number, *fenced_until_ms, id))?;
        self.leave_group(g, id, record.group_order)
    }

    /// The worker of lease `(id, token)` of a cancelled job reported back (an ending call
    /// answered `Cancelled`): if that is the delivery its group waits for, it has ended, and
    /// the group goes on. Nothing for an older delivery's token or any other row.
    pub(super) fn delivery_ended(&mut self, id: u64, token: u64) -> Result<()> {
        if let Row::Good(record) = self.row(id)?
            && let StoredState::Cancelled {
                fenced_until_ms, ..
            } = record.state
        {
            let fenced = self
                .gtx
                .table(GROUP_FENCES)?
                .get((self.schema.queue_number, fenced_until_ms, id))?
                .map(|v| v.value());
            if fenced == Some(token) {
                self.end_fence(id, &record)?;
            }
        }
        Ok(())
    }

    /// The worker of lease `(id, token)` of a cancelled job extended it: if that is the
    /// delivery its group waits for, the wait lasts until `deadline_ms` (never shorter), as
    /// the lease would have. Whether it moved: the fence entry, the row's `fenced_until_ms`
    /// and its place in the cancelled index (keyed by `history_ms`) move together.
    pub(super) fn extend_fence(&mut self, id: u64, token: u64, deadline_ms: u64) -> Result<bool> {
        let Row::Good(mut record) = self.row(id)? else {
            return Ok(false);
        };
        let StoredState::Cancelled {
            fenced_until_ms,
            reason,
        } = &record.state
        else {
            return Ok(false);
        };
        let (old_until_ms, reason) = (*fenced_until_ms, reason.clone());
        let q = self.schema.queue_number;
        if deadline_ms <= old_until_ms
            || self
                .gtx
                .table(GROUP_FENCES)?
                .get((q, old_until_ms, id))?
                .map(|v| v.value())
                != Some(token)
        {
            return Ok(false);
        }
        let old_history_ms = record.history_ms();
        record.state = StoredState::Cancelled {
            reason,
            fenced_until_ms: deadline_ms,
        };
        record.check_invariants()?;
        self.cancelled_mut()?.remove((old_history_ms, id))?;
        self.cancelled_mut()?
            .insert((record.history_ms(), id), ())?;
        let mut fences = self.gtx.table(GROUP_FENCES)?;
        fences.remove((q, old_until_ms, id))?;
        fences.insert((q, deadline_ms, id), token)?;
        drop(fences);
        self.jobs_mut().insert(id, record.encode()?.as_slice())?;
        Ok(true)
    }

    /// Whether cancelled job `id`'s group still waits for its delivery: a retry, a remove or
    /// a purge leaves the row alone until then (`InvalidState`).
    pub(super) fn still_fencing(&self, id: u64, record: &JobRecord) -> Result<bool> {
        self.fence_holds(id, record)
    }

    /// Ends the group waits of this queue whose fenced lease's deadline is at or before
    /// `until_ms`, at most `max` of them; how many it ended. An entry whose row does not match
    /// is dropped.
    pub(super) fn end_fences_due(&mut self, until_ms: u64, max: usize) -> Result<usize> {
        let q = self.schema.queue_number;
        let due: Vec<(u64, u64)> = {
            let fences = self.gtx.table(GROUP_FENCES)?;
            fences
                .range((q, 0, 0)..=(q, until_ms, u64::MAX))?
                .take(max)
                .map(|e| e.map(|(k, _)| (k.value().1, k.value().2)))
                .collect::<std::result::Result<_, _>>()?
        };
        for &(at_ms, id) in &due {
            match self.row(id)? {
                Row::Good(record) if self.fence_holds(id, &record)? => {
                    self.end_fence(id, &record)?
                }
                _ => {
                    self.gtx.table(GROUP_FENCES)?.remove((q, at_ms, id))?;
                }
            }
        }
        Ok(due.len())
    }

    /// The first member of group `g`: (its order, its job id).
    fn group_head(&mut self, g: &[u8]) -> Result<Option<(u64, u64)>> {
        Ok(self
            .groups()?
            .range((g, 0)..=(g, u64::MAX))?
            .next()
            .transpose()?
            .map(|(k, v)| (k.value().1, v.value())))
    }

    /// Whether job `id` is the first live member of group `g`. A member before it whose row
    /// is missing, damaged, or not that live member (left behind by damage) is dropped on
    /// the way, at most `SWEEP_MAX` of them per call.
    fn is_head(&mut self, g: &[u8], id: u64) -> Result<bool> {
        for _ in 0..crate::limits::SWEEP_MAX {
            match self.group_head(g)? {
                None => return Ok(true),
                Some((_, first)) if first == id => return Ok(true),
                Some((order, first)) => {
                    if self.is_live_member(g, order, first)? {
                        return Ok(false);
                    }
                    tracing::warn!(
                        job_id = first,
                        "leaseq: a group member without a live row dropped"
                    );
                    self.groups_mut()?.remove((g, order))?;
                }
            }
        }
        Ok(false)
    }

    /// Whether job `id` has a good row in group `g` at `order`, live or a cancelled delivery
    /// its group still waits for.
    fn is_live_member(&self, g: &[u8], order: u64, id: u64) -> Result<bool> {
        Ok(match self.row(id)? {
            Row::Good(r) => {
                r.group.as_deref() == Some(g)
                    && r.group_order == order
                    && (matches!(
                        r.state,
                        StoredState::Ready | StoredState::Scheduled | StoredState::Leased { .. }
                    ) || self.fence_holds(id, &r)?)
            }
            _ => false,
        })
    }

    /// Job `id` (at `order`) leaves group `g` (dead, ended or deleted): the next member, if
    /// ready and held, becomes deliverable, and the queue's waiting consumers are told.
    fn leave_group(&mut self, g: &[u8], id: u64, order: u64) -> Result<()> {
        if self.groups()?.get((g, order))?.map(|v| v.value()) != Some(id) {
            return Ok(());
        }
        self.groups_mut()?.remove((g, order))?;
        self.held_mut()?.remove((g, id))?;
        if let Some((_, next)) = self.group_head(g)?
            && self.held()?.get((g, next))?.is_some()
            && let Row::Good(r) = self.row(next)?
            && r.state == StoredState::Ready
        {
            self.held_mut()?.remove((g, next))?;
            self.ready_mut()?
                .insert((priority_rank(r.priority), r.seq, next), ())?;
            self.log().wake(self.schema.queue_number);
        }
        Ok(())
    }

    /// Inserts the entry of `record`'s state in that state's index; whether it was absent.
    fn index_state(&mut self, id: u64, record: &JobRecord) -> Result<bool> {
        Ok(match record.state {
            StoredState::Ready => self
                .ready_mut()?
                .insert((priority_rank(record.priority), record.seq, id), ())?
                .is_none(),
            StoredState::Scheduled => self
                .scheduled_mut()?
                .insert((record.run_at_ms, id), ())?
                .is_none(),
            StoredState::Leased { deadline_ms, .. } => {
                self.leases_mut()?.insert((deadline_ms, id), ())?.is_none()
            }
            StoredState::Dead => {
                // A dead job's run_at_ms is when it died.
                self.dead_by_time_mut()?
                    .insert((record.run_at_ms, id), ())?;
                self.dead_mut()?.insert(id, ())?.is_none()
            }
            StoredState::Completed { .. } => self
                .completed_mut()?
                .insert((record.history_ms(), id), ())?
                .is_none(),
            StoredState::Cancelled { .. } => self
                .cancelled_mut()?
                .insert((record.history_ms(), id), ())?
                .is_none(),
        })
    }

    /// Removes the index entry of `record`'s current state. A missing entry (index damage) is
    /// logged, not an error, so the job can still leave that state.
    pub(super) fn unindex(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        let present = match record.state {
            // A job of a group is ready either deliverable or held behind its group's head.
            StoredState::Ready => {
                let ready = self
                    .ready_mut()?
                    .remove((priority_rank(record.priority), record.seq, id))?
                    .is_some();
                let held = match record.group.as_deref() {
                    Some(g) => self.held_mut()?.remove((g, id))?.is_some(),
                    None => false,
                };
                ready || held
            }
            StoredState::Scheduled => self
                .scheduled_mut()?
                .remove((record.run_at_ms, id))?
                .is_some(),
            StoredState::Leased { deadline_ms, .. } => {
                self.leases_mut()?.remove((deadline_ms, id))?.is_some()
            }
            StoredState::Dead => {
                self.dead_by_time_mut()?.remove((record.run_at_ms, id))?;
                self.dead_mut()?.remove(id)?.is_some()
            }
            StoredState::Completed { .. } => self
                .completed_mut()?
                .remove((record.history_ms(), id))?
                .is_some(),
            StoredState::Cancelled { .. } => {
                // A cancelled delivery its group waited for: the wait ends with the row's
                // move (a retry, a delete).
                self.end_fence(id, record)?;
                self.cancelled_mut()?
                    .remove((record.history_ms(), id))?
                    .is_some()
            }
        };
        if !present {
            tracing::warn!(
                job_id = id,
                state = ?record.state.job_state(),
                "leaseq: the job's index entry was missing"
            );
        } else if record.state.is_live() {
            self.count_bytes(0, record.payload_len() as u64)?;
        }
        Ok(())
    }

    /// Deletes the job, releases its dedup key if the job still owns it (an ended job let go
    /// of it when it ended), and unlists it from `idem_jobs`.
    pub(super) fn delete(&mut self, id: u64, record: &JobRecord, now_ms: u64) -> Result<()> {
        if record.state.is_live() {
            self.note_instance_end(id, now_ms)?;
        }
        self.unindex(id, record)?;
        self.jobs_mut().remove(id)?;
        if let Some(g) = record.group.as_deref() {
            self.leave_group(g, id, record.group_order)?;
        }
        self.drop_payload(id, record)?;
        if record.state.is_ended() {
            return self.unlist_idem_job(id, record);
        }
        self.release_keys(id, record, now_ms)
    }

    /// Ends live job `id` for good, in `end` (completed or cancelled, with `ended_ms` as its
    /// end): it lets go of its dedup key as a deleted job does, and its row goes to the
    /// history when `keep` (or while it fences a cancelled lease), still carrying its
    /// idempotency key (so a retry finds its applied marker), or is deleted.
    pub(super) fn end_job(
        &mut self,
        id: u64,
        mut record: JobRecord,
        end: StoredState,
        ended_ms: u64,
        keep: bool,
    ) -> Result<()> {
        debug_assert!(end.is_ended() && !record.state.is_ended());
        let fences = matches!(end, StoredState::Cancelled { fenced_until_ms, .. } if fenced_until_ms > ended_ms);
        if !keep && !fences {
            return self.delete(id, &record, ended_ms);
        }
        if record.state.is_live() {
            self.note_instance_end(id, ended_ms)?;
        }
        self.unindex(id, &record)?;
        self.release_dedup_key(id, &record, ended_ms)?;
        let fenced_token = match record.state {
            StoredState::Leased { token, .. } => Some(token),
            _ => None,
        };
        record.state = end;
        record.run_at_ms = ended_ms;
        record.status = None;
        self.put(id, &record)?;
        // A leased member of a group cancelled: `index` kept it in its group; its wait is
        // recorded with the lease's token, so only that delivery's ending call ends it.
        if let (
            Some(token),
            Some(g),
            StoredState::Cancelled {
                fenced_until_ms, ..
            },
        ) = (fenced_token, record.group.as_deref(), &record.state)
            && *fenced_until_ms > ended_ms
            && self
                .groups()?
                .get((g, record.group_order))?
                .map(|v| v.value())
                == Some(id)
        {
            self.gtx
                .table(GROUP_FENCES)?
                .insert((self.schema.queue_number, *fenced_until_ms, id), token)?;
        }
        Ok(())
    }

    /// [`Tables::delete`] of a job removed on purpose (`remove`, `purge`): its dedup key is
    /// released even while its window runs, the window ended with it.
    pub(super) fn delete_removed(
        &mut self,
        id: u64,
        record: &JobRecord,
        now_ms: u64,
    ) -> Result<()> {
        self.delete(id, record, now_ms)?;
        if let Some(k) = &record.dedup_key
            && record.dedup_window_ms.is_some()
            && self.dedup()?.get(k.as_slice())?.map(|v| v.value()) == Some(id)
        {
            let window_end_ms = self.dedup_windows()?.get(k.as_slice())?.map(|v| v.value());
            match window_end_ms {
                Some(end_ms) => self.end_window(k, end_ms)?,
                None => {
                    self.dedup_mut()?.remove(k.as_slice())?;
                }
            }
        }
        Ok(())
    }

    /// Lists job `id` in `idem_jobs` under its caller idempotency key (if any): its marker is
    /// kept.
    pub(super) fn list_idem_job(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        if let Some(k) = record.idempotency_key.as_deref() {
            let key = marker_key(k);
            self.idem_jobs_mut()?.insert((key.as_slice(), id), ())?;
        }
        Ok(())
    }

    /// After deleting job `id`: releases its dedup key if the job still holds it (unless a
    /// dedup window still runs: the key outlives the job until then), and unlists it from
    /// `idem_jobs`.
    fn release_keys(&mut self, id: u64, record: &JobRecord, now_ms: u64) -> Result<()> {
        self.release_dedup_key(id, record, now_ms)?;
        self.unlist_idem_job(id, record)
    }

    /// Releases job `id`'s dedup key if it still holds it and no running window holds it (a
    /// job whose window had ended before it took the key, as an imported one, holds it while
    /// live).
    fn release_dedup_key(&mut self, id: u64, record: &JobRecord, now_ms: u64) -> Result<()> {
        if let Some(k) = &record.dedup_key
            && let Some((owner, by_window)) = self.key_holder(k, now_ms)?
            && owner == id
            && !by_window
        {
            self.dedup_mut()?.remove(k.as_slice())?;
        }
        Ok(())
    }

    /// Unlists job `id` from `idem_jobs` (the jobs of its idempotency key), if it has one.
    fn unlist_idem_job(&mut self, id: u64, record: &JobRecord) -> Result<()> {
        if let Some(k) = record.idempotency_key.as_deref() {
            let key = marker_key(k);
            if self
                .idem_jobs_mut()?
                .remove((key.as_slice(), id))?
                .is_none()
            {
                tracing::warn!(
                    job_id = id,
                    "leaseq: idempotency-key index entry was missing"
                );
            }
        }
        Ok(())
    }

    /// After a leased job ended at `now_ms`: [`Event::Drained`] if no job is ready, due or
    /// leased now (only when someone listens: three lookups).
    pub(super) fn note_drained(&mut self, now_ms: u64) -> Result<()> {
        if !self.log().listening()
            || self.ready()?.first()?.is_some()
            || self.leases()?.first()?.is_some()
        {
            return Ok(());
        }
        let due = match self.scheduled()?.first()? {
            Some((k, _)) => k.value().0 <= now_ms,
            None => false,
        };
        if !due {
            self.log().event(self.schema.queue_number, Event::Drained);
        }
        Ok(())
    }

    /// Deletes the leased jobs `leases[i].0` (records `records[i]`): like [`Tables::delete`]
    /// for each, but the job rows and lease entries of a batch are removed in one pass where
    /// their keys are dense (a single delete rebuilds its leaf: 100 deletes cost ~120 µs one
    /// by one, ~15 µs in one pass). A pass scans at most twice as many entries as it removes.
    pub(super) fn delete_leased(
        &mut self,
        leases: &[(u64, u64)],
        records: &[JobRecord],
        now_ms: u64,
    ) -> Result<()> {
        debug_assert_eq!(leases.len(), records.len());
        if let ([(id, _)], [record]) = (leases, records) {
            return self.delete(*id, record, now_ms);
        }
        let mut keys: Vec<(u64, u64)> = Vec::with_capacity(records.len());
        for (&(id, _), record) in leases.iter().zip(records) {
            let StoredState::Leased { deadline_ms, .. } = record.state else {
                return Err(Error::corrupted(format!("job {id} is not leased")));
            };
            keys.push((deadline_ms, id));
        }
        keys.sort_unstable();
        let (Some(&first), Some(&last)) = (keys.first(), keys.last()) else {
            return Ok(());
        };
        let dense = |lo: u64, hi: u64, n: usize| n >= 2 && hi - lo < 2 * n as u64;
        if first.0 == last.0 && dense(first.1, last.1, keys.len()) {
            remove_dense(self.leases_mut()?, first..=last, &keys, "leaseq_leases")?;
            let bytes = records.iter().map(|r| r.payload_len() as u64).sum();
            self.uncount_bytes(bytes)?;
        } else {
            for (&(id, _), record) in leases.iter().zip(records) {
                self.unindex(id, record)?;
            }
        }
        let mut ids: Vec<u64> = keys.iter().map(|&(_, id)| id).collect();
        ids.sort_unstable();
        if dense(ids[0], ids[ids.len() - 1], ids.len()) {
            remove_dense(
                self.jobs_mut(),
                ids[0]..=ids[ids.len() - 1],
                &ids,
                "leaseq_jobs",
            )?;
        } else {
            for &id in &ids {
                self.jobs_mut().remove(id)?;
            }
        }
        for (&(id, _), record) in leases.iter().zip(records) {
            self.note_instance_end(id, now_ms)?;
            self.drop_payload(id, record)?;
            self.release_keys(id, record, now_ms)?;
            if let Some(g) = record.group.as_deref() {
                self.leave_group(g, id, record.group_order)?;
            }
        }
        Ok(())
    }

    /// Counts the run of leased `record`'s delivery, ended by its consumer at `now_ms`, in the
    /// queue's run times (a leased job's `run_at_ms` is when the delivery began).
    pub(super) fn note_run(&self, record: &JobRecord, now_ms: u64) {
        debug_assert!(matches!(record.state, StoredState::Leased { .. }));
        self.log().run(
            self.schema.queue_number,
            now_ms.saturating_sub(record.run_at_ms),
        );
    }

    /// Whether `(id, token)` is a current lease: its record, or the refusal for this one lease
    /// (`LeaseLost`, `Cancelled`; `Corrupted` for a damaged row). Only storage errors are
    /// outside.
    pub(super) fn lease_of(&self, id: u64, token: u64) -> Verdict<JobRecord> {
        match self.row(id)? {
            Row::Good(record) if matches!(record.state, StoredState::Leased { token: current, .. } if current == token) => {
                Ok(Ok(record))
            }
            Row::Damaged(why) => refuse(damaged(id, &why)),
            Row::Good(JobRecord {
                state: StoredState::Cancelled { reason, .. },
                ..
            }) => refuse(Error::Cancelled {
                job_id: JobId(id),
                reason,
            }),
            _ => refuse(Error::LeaseLost {
                job_id: JobId(id),
                token,
            }),
        }
    }
}
