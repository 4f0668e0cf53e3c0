//! Every change leaseq makes to its tables, as functions over one open write transaction
//! (a group commit's [`Ctx`]), plus the read-only views (stats, inspection, `check`).
//!
//! Each mutating function validates everything it can before its first write, so a refusal
//! (`LeaseLost`, `InvalidOption`, ...) leaves the transaction untouched and the rest of the
//! group can still commit. Each keeps the first invariant of ARCHITECTURE.md: a job is in
//! exactly one state, and the state's index holds exactly the job's entry.

use redb::{
    ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table,
    TableHandle,
};

use crate::codec::{JobRecord, PAYLOAD_INLINE_MAX, PayloadRef, StoredState};
use crate::commit::Ctx;
use crate::error::{BoxError, Error, Result};
use crate::job::{Applied, EnqueueOptions, Enqueued, JobId, JobInfo, JobState, Quarantined, Stats};
use crate::schema::{
    FORMAT_VERSION, META, META_FILE_ID, META_FORMAT_VERSION, META_NEXT_ID, META_NEXT_TOKEN, QUEUES,
    QuarantineValue, QueueTables, ReadyKey, applied_key, priority_rank,
};

/// At most this many due scheduled jobs are promoted, and this many expired leases
/// reclaimed, per dequeue: a sweep never makes one call slow.
pub(crate) const SWEEP_MAX: usize = 256;
/// `last_error` keeps at most this many bytes of a reason (cut at a char boundary).
pub(crate) const REASON_BYTES_MAX: usize = 4096;
/// Most violations `check` lists before it stops.
const VIOLATIONS_MAX: usize = 1000;

pub(crate) const REASON_EXPIRED: &str = "lease expired";
pub(crate) const REASON_ABANDONED: &str =
    "lease abandoned: still held when the file was closed or its process exited";

/// Queue-wide settings an operation needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    pub lease_ms: u64,
    pub max_attempts: u32,
    pub payload_bytes_max: usize,
    /// Most payload bytes one dequeue batch hands out (its first job is always taken).
    pub dequeue_batch_bytes: usize,
    pub retry: crate::RetryPolicy,
    /// How long an applied marker of a caller key is kept (`None`: forever).
    pub applied_retention_ms: Option<u64>,
    /// How long a dead job is kept (`None`: until removed).
    pub dead_retention_ms: Option<u64>,
    /// The queue's tables.
    pub tables: &'static QueueTables,
    /// The file's committer id (set once the file is open): which file the queue is in.
    pub file: u64,
    /// How `enqueue_value` encodes, and how `Lease::decode` reads a job that recorded none.
    pub encoding: crate::Encoding,
}

/// At most this many expired applied markers are pruned per `ack_with` (twice what one
/// lease adds, so the table cannot outgrow its retention); `Queue::prune` does the rest.
pub(crate) const PRUNE_PER_ACK_MAX: usize = 2;

/// When a job whose attempt `rec.attempts` just ended without an ack is due again: now plus
/// the retry policy's delay.
fn retry_at_ms(cfg: &Config, id: u64, rec: &JobRecord, now_ms: u64) -> u64 {
    // A stored policy was validated when the record was read.
    let policy = rec.retry.and_then(|r| r.policy().ok()).unwrap_or(cfg.retry);
    now_ms.saturating_add(policy.delay_ms(JobId(id), rec.attempts))
}

/// How a job whose `ack_with` closure failed is given back ([`crate::Outcome`]).
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
pub(crate) struct Failure {
    pub reason: String,
    pub how: GiveBack,
}

impl Failure {
    /// The failure of a closure that returned `e`: an [`crate::Outcome`] decides how the
    /// job ends (a delay above `DELAY_MAX` is refused there, and the job goes through the
    /// retry policy with the refusal as its reason); any other error retries.
    pub(crate) fn of(e: &BoxError) -> Failure {
        let max_ms = crate::clock::duration_ms(crate::DELAY_MAX);
        let refused = |d: std::time::Duration| Failure {
            reason: format!(
                "refused outcome: {e} (the delay of {} ms is above DELAY_MAX)",
                d.as_millis()
            ),
            how: GiveBack::Retry(None),
        };
        match e.downcast_ref::<crate::Outcome>() {
            Some(crate::Outcome::Snooze(d)) if crate::clock::duration_ms(*d) <= max_ms => Failure {
                reason: e.to_string(),
                how: GiveBack::Snooze(crate::clock::duration_ms(*d)),
            },
            Some(crate::Outcome::Fail(reason)) => Failure {
                reason: reason.clone(),
                how: GiveBack::Fail,
            },
            Some(crate::Outcome::Retry { after, reason })
                if crate::clock::duration_ms(*after) <= max_ms =>
            {
                Failure {
                    reason: reason.clone(),
                    how: GiveBack::Retry(Some(crate::clock::duration_ms(*after))),
                }
            }
            Some(crate::Outcome::Snooze(d) | crate::Outcome::Retry { after: d, .. }) => refused(*d),
            None => Failure {
                reason: e.to_string(),
                how: GiveBack::Retry(None),
            },
        }
    }
}

/// A job handed out by a dequeue, before it becomes a `Lease`.
#[derive(Debug)]
pub(crate) struct Leased {
    pub id: u64,
    pub token: u64,
    pub attempt: u32,
    pub max_attempts: u32,
    pub deadline_ms: u64,
    /// The lease duration this delivery got.
    pub lease_ms: u64,
    pub idempotency_key: Option<Vec<u8>>,
    /// The encoding the job recorded, if any.
    pub encoding: Option<crate::Encoding>,
    pub payload: Vec<u8>,
}

fn truncate_reason(reason: &str) -> String {
    if reason.len() <= REASON_BYTES_MAX {
        return reason.to_string();
    }
    let mut end = REASON_BYTES_MAX;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

/// The error of a call aimed at one job whose row is damaged.
fn damaged(id: u64, why: &str) -> Error {
    Error::corrupted(format!(
        "job {id}: record damaged ({why}); a dequeue quarantines it when it meets it (ready, \
         due or expired), or delete it with Queue::remove"
    ))
}

/// Checks a lease duration option: 1 ms to `LEASE_MAX`, whole milliseconds.
pub(crate) fn lease_ms_checked(field: &'static str, d: std::time::Duration) -> Result<u64> {
    let ms = crate::clock::duration_ms(d);
    if ms == 0 {
        return Err(Error::invalid_option(field, "must be at least 1 ms"));
    }
    if d > crate::LEASE_MAX {
        return Err(Error::invalid_option(
            field,
            format!(
                "{ms} ms is above the cap of {} ms",
                crate::LEASE_MAX.as_millis()
            ),
        ));
    }
    Ok(ms)
}

fn check_key(field: &'static str, key: Option<&Vec<u8>>) -> Result<()> {
    match key {
        Some(k) if k.len() > crate::KEY_BYTES_MAX => Err(Error::KeyTooLong {
            field,
            size_bytes: k.len(),
            limit_bytes: crate::KEY_BYTES_MAX,
        }),
        Some(k) if k.is_empty() => Err(Error::invalid_option(field, "must not be empty")),
        _ => Ok(()),
    }
}

/// Validates a batch of enqueues (1 to `BATCH_MAX` jobs) and builds their records.
pub(crate) fn new_records<'p>(
    cfg: &Config,
    now_ms: u64,
    jobs: impl IntoIterator<Item = (&'p [u8], EnqueueOptions)>,
) -> Result<Vec<JobRecord>> {
    let mut records = Vec::new();
    for (payload, opts) in jobs {
        if records.len() == crate::BATCH_MAX {
            return Err(Error::invalid_option(
                "jobs",
                format!("a batch holds 1 to {} items", crate::BATCH_MAX),
            ));
        }
        records.push(new_record(cfg, now_ms, payload, &opts)?);
    }
    if records.is_empty() {
        return Err(Error::invalid_option("jobs", "the batch is empty"));
    }
    Ok(records)
}

/// Validates one imported job and builds its record: as [`new_record`], then its state and
/// history as given, checked against the record's invariants.
pub(crate) fn import_record(
    cfg: &Config,
    now_ms: u64,
    job: &crate::ImportJob,
) -> Result<JobRecord> {
    let opts = EnqueueOptions {
        delay: None,
        encoding: job.encoding,
        ..job.options.clone()
    };
    let mut rec = new_record(cfg, now_ms, &job.payload, &opts)?;
    rec.created_ms = job.created_ms.unwrap_or(now_ms);
    rec.attempts = job.attempts;
    rec.snoozes = job.snoozes;
    rec.last_error = job.last_error.as_deref().map(truncate_reason);
    rec.run_at_ms = job.run_at_ms.unwrap_or(now_ms);
    let left = job.attempts < rec.max_attempts;
    rec.state = match job.state {
        JobState::Ready | JobState::Scheduled if !left => {
            return Err(Error::invalid_option(
                "attempts",
                format!(
                    "{} of {} made: a job still to run needs one left",
                    job.attempts, rec.max_attempts
                ),
            ));
        }
        JobState::Ready => StoredState::Ready,
        JobState::Scheduled => StoredState::Scheduled,
        // A lease that ended without an ack, as the reopen after a crash returns it.
        JobState::Leased => {
            rec.run_at_ms = now_ms;
            rec.last_error = Some(REASON_ABANDONED.to_string());
            if left {
                StoredState::Ready
            } else {
                StoredState::Dead
            }
        }
        JobState::Dead => StoredState::Dead,
    };
    rec.validate()
        .map_err(|e| Error::invalid_option("job", e.to_string()))?;
    Ok(rec)
}

/// Validates one enqueue and builds its record (state and run_at set, id not yet known).
pub(crate) fn new_record(
    cfg: &Config,
    now_ms: u64,
    payload: &[u8],
    opts: &EnqueueOptions,
) -> Result<JobRecord> {
    if payload.len() > cfg.payload_bytes_max {
        return Err(Error::PayloadTooLarge {
            size_bytes: payload.len(),
            limit_bytes: cfg.payload_bytes_max,
        });
    }
    check_key("idempotency_key", opts.idempotency_key.as_ref())?;
    check_key("dedup_key", opts.dedup_key.as_ref())?;
    let max_attempts = opts.max_attempts.unwrap_or(cfg.max_attempts);
    if max_attempts == 0 || max_attempts > crate::MAX_ATTEMPTS_CAP {
        return Err(Error::invalid_option(
            "max_attempts",
            format!("{max_attempts} is outside 1..={}", crate::MAX_ATTEMPTS_CAP),
        ));
    }
    let lease_ms = opts
        .lease
        .map(|d| lease_ms_checked("lease", d))
        .transpose()?;
    let delay_ms = match opts.delay {
        Some(d) if d > crate::DELAY_MAX => {
            return Err(Error::invalid_option(
                "delay",
                format!("above the cap of {} ms", crate::DELAY_MAX.as_millis()),
            ));
        }
        Some(d) => crate::clock::duration_ms(d),
        None => 0,
    };
    let run_at_ms = now_ms
        .checked_add(delay_ms)
        .ok_or_else(|| Error::invalid_option("delay", "due time overflows"))?;
    if let Some(p) = &opts.retry {
        p.validate("retry")?;
    }
    let dedup_window_ms = match opts.dedup_window {
        None => None,
        Some(_) if opts.dedup_key.is_none() => {
            return Err(Error::invalid_option("dedup_window", "needs a dedup key"));
        }
        // In whole milliseconds: 500 µs would be a window of 0.
        Some(w) if crate::clock::duration_ms(w) == 0 || w > crate::DELAY_MAX => {
            return Err(Error::invalid_option(
                "dedup_window",
                format!(
                    "{} ms is outside 1 ms to {} ms (DELAY_MAX)",
                    w.as_millis(),
                    crate::DELAY_MAX.as_millis()
                ),
            ));
        }
        Some(w) => Some(crate::clock::duration_ms(w)),
    };
    if dedup_window_ms.is_some_and(|w| now_ms.checked_add(w).is_none()) {
        return Err(Error::invalid_option("dedup_window", "its end overflows"));
    }
    Ok(JobRecord {
        state: if delay_ms > 0 {
            StoredState::Scheduled
        } else {
            StoredState::Ready
        },
        priority: opts.priority,
        run_at_ms,
        attempts: 0,
        max_attempts,
        lease_ms,
        created_ms: now_ms,
        seq: 0,
        idempotency_key: opts.idempotency_key.clone(),
        dedup_key: opts.dedup_key.clone(),
        last_error: None,
        payload: payload.to_vec(),
        retry: opts.retry.as_ref().map(crate::codec::StoredRetry::new),
        dedup_window_ms,
        payload_apart: None,
        snoozes: 0,
        encoding: opts.encoding.map(crate::Encoding::tag),
    })
}

/// Removes exactly the entries `sorted` (ascending, unique) from `table`, all within `range`,
/// in one pass. An entry that is missing (index damage) is logged, not an error: the rows it
/// stood for are deleted all the same.
fn remove_dense<K, V>(
    table: &mut Table<'_, K, V>,
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
struct Tables<'t> {
    tx: &'t redb::WriteTransaction,
    tq: &'static QueueTables,
    jobs: Table<'t, u64, &'static [u8]>,
    ready: Option<Table<'t, (u32, u64, u64), ()>>,
    scheduled: Option<Table<'t, (u64, u64), ()>>,
    leases: Option<Table<'t, (u64, u64), ()>>,
    dead: Option<Table<'t, u64, ()>>,
    dedup: Option<Table<'t, &'static [u8], u64>>,
    quarantine: Option<Table<'t, u64, QuarantineValue>>,
    idem: Option<Table<'t, (&'static [u8], u64), ()>>,
    windows: Option<Table<'t, &'static [u8], u64>>,
    expiry: Option<Table<'t, (u64, &'static [u8]), ()>>,
    dead_by_time: Option<Table<'t, (u64, u64), ()>>,
    payloads: Option<Table<'t, u64, &'static [u8]>>,
}

/// A job row as read: absent, present but failing its checks (the reason), or good.
// One row at a time, on the stack, moved into its use: boxing the record would only add an
// allocation per read.
#[allow(clippy::large_enum_variant)]
enum Row {
    Missing,
    Damaged(String),
    Good(JobRecord),
}

/// The table in `slot`, opened from `tx` on first use.
fn lazy<'a, 't, K: redb::Key + 'static, V: redb::Value + 'static>(
    slot: &'a mut Option<Table<'t, K, V>>,
    tx: &'t redb::WriteTransaction,
    def: redb::TableDefinition<K, V>,
) -> Result<&'a mut Table<'t, K, V>> {
    if slot.is_none() {
        *slot = Some(tx.open_table(def)?);
    }
    Ok(slot.as_mut().expect("opened above"))
}

impl<'t> Tables<'t> {
    fn open(tx: &'t redb::WriteTransaction, tq: &'static QueueTables) -> Result<Tables<'t>> {
        Ok(Tables {
            tx,
            tq,
            jobs: tx.open_table(tq.jobs())?,
            ready: None,
            scheduled: None,
            leases: None,
            dead: None,
            dedup: None,
            quarantine: None,
            idem: None,
            windows: None,
            expiry: None,
            dead_by_time: None,
            payloads: None,
        })
    }

    /// Opens every index table now (and `leaseq_quarantine`, creating it if needed).
    fn open_all(&mut self) -> Result<()> {
        self.ready()?;
        self.scheduled()?;
        self.leases()?;
        self.dead()?;
        self.dedup()?;
        self.idem()?;
        self.windows()?;
        self.expiry()?;
        self.dead_by_time()?;
        self.payloads()?;
        lazy(&mut self.quarantine, self.tx, self.tq.quarantine())?;
        Ok(())
    }

    fn ready(&mut self) -> Result<&mut Table<'t, (u32, u64, u64), ()>> {
        lazy(&mut self.ready, self.tx, self.tq.ready())
    }

    fn scheduled(&mut self) -> Result<&mut Table<'t, (u64, u64), ()>> {
        lazy(&mut self.scheduled, self.tx, self.tq.scheduled())
    }

    fn leases(&mut self) -> Result<&mut Table<'t, (u64, u64), ()>> {
        lazy(&mut self.leases, self.tx, self.tq.leases())
    }

    fn dead(&mut self) -> Result<&mut Table<'t, u64, ()>> {
        lazy(&mut self.dead, self.tx, self.tq.dead())
    }

    fn dedup(&mut self) -> Result<&mut Table<'t, &'static [u8], u64>> {
        lazy(&mut self.dedup, self.tx, self.tq.dedup())
    }

    fn idem(&mut self) -> Result<&mut Table<'t, (&'static [u8], u64), ()>> {
        lazy(&mut self.idem, self.tx, self.tq.idem_jobs())
    }

    fn dead_by_time(&mut self) -> Result<&mut Table<'t, (u64, u64), ()>> {
        lazy(&mut self.dead_by_time, self.tx, self.tq.dead_by_time())
    }

    fn payloads(&mut self) -> Result<&mut Table<'t, u64, &'static [u8]>> {
        lazy(&mut self.payloads, self.tx, self.tq.payloads())
    }

    /// Stores `rec`'s payload apart (under `id`) if it is larger than `PAYLOAD_INLINE_MAX`,
    /// leaving its length and checksum in the record.
    fn store_payload(&mut self, id: u64, rec: &mut JobRecord) -> Result<()> {
        if rec.payload.len() > PAYLOAD_INLINE_MAX {
            let payload = std::mem::take(&mut rec.payload);
            rec.payload_apart = Some(PayloadRef::of(&payload));
            self.payloads()?.insert(id, payload.as_slice())?;
        }
        Ok(())
    }

    /// The payload job `id` stores apart, checked against its reference; `Ok(Err(why))` if
    /// it is missing or damaged.
    fn apart_payload(&mut self, id: u64, r: &PayloadRef) -> Result<Result<Vec<u8>, String>> {
        Ok(match self.payloads()?.get(id)? {
            None => Err("payload: stored apart, but its row is missing".to_string()),
            Some(v) => r
                .verify(v.value())
                .map(|()| v.value().to_vec())
                .map_err(|e| e.to_string()),
        })
    }

    /// Removes the payload job `id` stores apart, if it does.
    fn drop_payload(&mut self, id: u64, rec: &JobRecord) -> Result<()> {
        if rec.payload_apart.is_some() && self.payloads()?.remove(id)?.is_none() {
            tracing::warn!(job_id = id, "leaseq: the job's payload row was missing");
        }
        Ok(())
    }

    fn windows(&mut self) -> Result<&mut Table<'t, &'static [u8], u64>> {
        lazy(&mut self.windows, self.tx, self.tq.dedup_windows())
    }

    fn expiry(&mut self) -> Result<&mut Table<'t, (u64, &'static [u8]), ()>> {
        lazy(&mut self.expiry, self.tx, self.tq.dedup_expiry())
    }

    /// Who holds dedup key `k` at `now_ms`: `None` if nobody does (a window that ended
    /// releases the key, its entries removed here), else the holder and whether the key is
    /// held by a window (rather than by the holder being live).
    fn key_holder(&mut self, k: &[u8], now_ms: u64) -> Result<Option<(u64, bool)>> {
        let Some(owner) = self.dedup()?.get(k)?.map(|v| v.value()) else {
            return Ok(None);
        };
        let window_end_ms = self.windows()?.get(k)?.map(|v| v.value());
        match window_end_ms {
            Some(end_ms) if end_ms <= now_ms => {
                self.end_window(k, end_ms)?;
                Ok(None)
            }
            Some(_) => Ok(Some((owner, true))),
            None => Ok(Some((owner, false))),
        }
    }

    /// Releases dedup key `k` whose window ends at `end_ms`: its window, its expiry entry and
    /// its holder entry. The job that held it is not touched.
    fn end_window(&mut self, k: &[u8], end_ms: u64) -> Result<()> {
        self.windows()?.remove(k)?;
        self.expiry()?.remove((end_ms, k))?;
        self.dedup()?.remove(k)?;
        Ok(())
    }

    /// Removes every dedup entry held by job `id` (with its window): a scan of the dedup
    /// table, for a row whose keys cannot be read (damaged or quarantined).
    fn drop_keys_of(&mut self, id: u64) -> Result<()> {
        let mut keys = Vec::new();
        for e in self.dedup()?.iter()? {
            let (k, owner) = e?;
            if owner.value() == id {
                keys.push(k.value().to_vec());
            }
        }
        for k in keys {
            let window_end_ms = self.windows()?.get(k.as_slice())?.map(|v| v.value());
            match window_end_ms {
                Some(end_ms) => self.end_window(&k, end_ms)?,
                None => {
                    self.dedup()?.remove(k.as_slice())?;
                }
            }
        }
        self.idem()?.retain(|(_, j), ()| j != id)?;
        Ok(())
    }

    /// The row of job `id`; `Err` only for storage errors, never for a damaged row.
    fn row(&self, id: u64) -> Result<Row> {
        Ok(match self.jobs.get(id)? {
            None => Row::Missing,
            Some(v) => match JobRecord::decode(v.value()) {
                Ok(rec) => Row::Good(rec),
                Err(e) => Row::Damaged(e.to_string()),
            },
        })
    }

    /// Moves the damaged row of job `id` whole into `leaseq_quarantine` (its bytes as found,
    /// with `reason`), so the pass that met it goes on with the rest. The caller has removed
    /// the index entry that led to it. A dedup key the job held stays held by it until
    /// [`remove`] deletes the quarantined row.
    fn quarantine(&mut self, ctx: &mut Ctx<'_>, id: u64, reason: &str, now_ms: u64) -> Result<()> {
        let raw = self
            .jobs
            .remove(id)?
            .ok_or_else(|| Error::corrupted(format!("job {id}: no row to quarantine")))?;
        *ctx.dirty = true;
        let reason = truncate_reason(reason);
        tracing::warn!(job_id = id, %reason, "leaseq: job record quarantined");
        lazy(&mut self.quarantine, self.tx, self.tq.quarantine())?
            .insert(id, (now_ms, reason.as_str(), raw.value()))?;
        Ok(())
    }

    /// After a pass removed an index entry (of job `id`) that did not match the job's row:
    /// a damaged row is quarantined; a good row gets back its own index entry if that is
    /// missing (an index entry damaged in place); nothing is left to do for a missing row.
    /// Returns whether a row was quarantined.
    fn settle_stray(&mut self, ctx: &mut Ctx<'_>, id: u64, row: Row, now_ms: u64) -> Result<bool> {
        *ctx.dirty = true;
        match row {
            Row::Missing => {
                tracing::warn!(job_id = id, "leaseq: index entry without a job row dropped");
                Ok(false)
            }
            Row::Good(rec) => {
                tracing::warn!(
                    job_id = id,
                    "leaseq: index entry disagreeing with its job dropped"
                );
                self.reindex(id, &rec)?;
                Ok(false)
            }
            Row::Damaged(why) => {
                self.quarantine(ctx, id, &why, now_ms)?;
                Ok(true)
            }
        }
    }

    /// Inserts the index entry of `rec`'s state (a no-op if it is there).
    fn reindex(&mut self, id: u64, rec: &JobRecord) -> Result<()> {
        self.index(id, rec).map(drop)
    }

    /// Writes `rec` under `id` and adds the index entry of its state. The caller has
    /// already removed the entry of its previous state. An entry already there (a stray one
    /// with the same key, index damage) is logged and kept: it now names the job rightly.
    fn put(&mut self, id: u64, rec: &JobRecord) -> Result<()> {
        rec.validate()?;
        self.jobs.insert(id, rec.encode()?.as_slice())?;
        if !self.index(id, rec)? {
            tracing::warn!(job_id = id, "leaseq: index entry was already present");
        }
        Ok(())
    }

    /// [`Tables::put`] for a new job: `Corrupted` (the transaction then aborts) if the id is
    /// already in use, found by the insert itself rather than a read before it.
    fn put_new(&mut self, id: u64, rec: &JobRecord) -> Result<()> {
        rec.validate()?;
        if self.jobs.insert(id, rec.encode()?.as_slice())?.is_some() {
            return Err(Error::corrupted(format!("job id {id} is already in use")));
        }
        if !self.index(id, rec)? {
            tracing::warn!(job_id = id, "leaseq: index entry was already present");
        }
        Ok(())
    }

    /// Inserts the index entry of `rec`'s state; whether it was absent.
    fn index(&mut self, id: u64, rec: &JobRecord) -> Result<bool> {
        Ok(match rec.state {
            StoredState::Ready => self
                .ready()?
                .insert((priority_rank(rec.priority), rec.seq, id), ())?
                .is_none(),
            StoredState::Scheduled => self.scheduled()?.insert((rec.run_at_ms, id), ())?.is_none(),
            StoredState::Leased { deadline_ms, .. } => {
                self.leases()?.insert((deadline_ms, id), ())?.is_none()
            }
            StoredState::Dead => {
                // A dead job's run_at_ms is when it died.
                self.dead_by_time()?.insert((rec.run_at_ms, id), ())?;
                self.dead()?.insert(id, ())?.is_none()
            }
        })
    }

    /// Removes the index entry of `rec`'s current state. A missing entry (index damage) is
    /// logged, not an error, so the job can still leave that state.
    fn unindex(&mut self, id: u64, rec: &JobRecord) -> Result<()> {
        let present = match rec.state {
            StoredState::Ready => self
                .ready()?
                .remove((priority_rank(rec.priority), rec.seq, id))?
                .is_some(),
            StoredState::Scheduled => self.scheduled()?.remove((rec.run_at_ms, id))?.is_some(),
            StoredState::Leased { deadline_ms, .. } => {
                self.leases()?.remove((deadline_ms, id))?.is_some()
            }
            StoredState::Dead => {
                self.dead_by_time()?.remove((rec.run_at_ms, id))?;
                self.dead()?.remove(id)?.is_some()
            }
        };
        if !present {
            tracing::warn!(
                job_id = id,
                state = ?rec.state.public(),
                "leaseq: the job's index entry was missing"
            );
        }
        Ok(())
    }

    /// Deletes the job, releases its dedup key if the job still owns it, and drops it from
    /// the carriers of its idempotency key.
    fn delete(&mut self, id: u64, rec: &JobRecord, now_ms: u64) -> Result<()> {
        self.unindex(id, rec)?;
        self.jobs.remove(id)?;
        self.drop_payload(id, rec)?;
        self.release_keys(id, rec, now_ms)
    }

    /// Job `id` carries its caller idempotency key (if any): its marker is kept.
    fn carry_key(&mut self, id: u64, rec: &JobRecord) -> Result<()> {
        if let Some(k) = rec.idempotency_key.as_deref() {
            let key = applied_key(Some(k), id);
            self.idem()?.insert((key.as_slice(), id), ())?;
        }
        Ok(())
    }

    /// After deleting job `id`: releases its dedup key if the job still holds it (unless a
    /// dedup window still runs: the key outlives the job until then), and drops it from the
    /// carriers of its idempotency key.
    fn release_keys(&mut self, id: u64, rec: &JobRecord, now_ms: u64) -> Result<()> {
        if let Some(k) = &rec.dedup_key
            && let Some((owner, _)) = self.key_holder(k, now_ms)?
            && owner == id
            && rec.dedup_window_ms.is_none()
        {
            self.dedup()?.remove(k.as_slice())?;
        }
        if let Some(k) = rec.idempotency_key.as_deref() {
            let key = applied_key(Some(k), id);
            if self.idem()?.remove((key.as_slice(), id))?.is_none() {
                tracing::warn!(
                    job_id = id,
                    "leaseq: idempotency-key index entry was missing"
                );
            }
        }
        Ok(())
    }

    /// Deletes the leased jobs `leases[i].0` (records `records[i]`): like [`Tables::delete`]
    /// for each, but the job rows and lease entries of a batch are removed in one pass where
    /// their keys are dense (a single delete rebuilds its leaf: 100 deletes cost ~120 µs one
    /// by one, ~15 µs in one pass). A pass scans at most twice as many entries as it removes.
    fn delete_leased(
        &mut self,
        leases: &[(u64, u64)],
        records: &[JobRecord],
        now_ms: u64,
    ) -> Result<()> {
        debug_assert_eq!(leases.len(), records.len());
        if let ([(id, _)], [rec]) = (leases, records) {
            return self.delete(*id, rec, now_ms);
        }
        let mut keys: Vec<(u64, u64)> = Vec::with_capacity(records.len());
        for (&(id, _), rec) in leases.iter().zip(records) {
            let StoredState::Leased { deadline_ms, .. } = rec.state else {
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
            remove_dense(self.leases()?, first..=last, &keys, "leaseq_leases")?;
        } else {
            for (&(id, _), rec) in leases.iter().zip(records) {
                self.unindex(id, rec)?;
            }
        }
        let mut ids: Vec<u64> = keys.iter().map(|&(_, id)| id).collect();
        ids.sort_unstable();
        if dense(ids[0], ids[ids.len() - 1], ids.len()) {
            remove_dense(
                &mut self.jobs,
                ids[0]..=ids[ids.len() - 1],
                &ids,
                "leaseq_jobs",
            )?;
        } else {
            for &id in &ids {
                self.jobs.remove(id)?;
            }
        }
        for (&(id, _), rec) in leases.iter().zip(records) {
            self.drop_payload(id, rec)?;
            self.release_keys(id, rec, now_ms)?;
        }
        Ok(())
    }

    /// Whether `(id, token)` is a current lease: its record, or the refusal for this one lease
    /// (`LeaseLost`; `Corrupted` for a damaged row). Only storage errors are outside.
    fn lease_of(&self, id: u64, token: u64) -> Result<Result<JobRecord>> {
        Ok(match self.row(id)? {
            Row::Good(rec) if matches!(rec.state, StoredState::Leased { token: t, .. } if t == token) => {
                Ok(rec)
            }
            Row::Damaged(why) => Err(damaged(id, &why)),
            _ => Err(Error::LeaseLost {
                job_id: JobId(id),
                token,
            }),
        })
    }

    /// Gives a leased job back without charging its attempt (see [`snooze`]).
    fn snooze_leased(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        mut rec: JobRecord,
        now_ms: u64,
        delay_ms: u64,
    ) -> Result<()> {
        // A leased job's delivery was counted when it was leased.
        debug_assert!(rec.attempts >= 1, "leased with no attempt counted");
        ctx.wake(self.tq.qid);
        self.unindex(id, &rec)?;
        let at = now_ms.saturating_add(delay_ms);
        rec.attempts = rec.attempts.saturating_sub(1);
        rec.snoozes = rec.snoozes.saturating_add(1);
        rec.run_at_ms = at;
        rec.state = if at > now_ms {
            StoredState::Scheduled
        } else {
            rec.seq = ctx.alloc_seq();
            StoredState::Ready
        };
        self.put(id, &rec)
    }

    /// Moves a leased job to the dead-letter state now, with `reason`.
    fn fail_leased(
        &mut self,
        id: u64,
        mut rec: JobRecord,
        reason: &str,
        now_ms: u64,
    ) -> Result<()> {
        self.unindex(id, &rec)?;
        rec.last_error = Some(truncate_reason(reason));
        tracing::info!(queue = self.tq.qid, job_id = id, %reason, "leaseq: job dead-lettered by fail");
        rec.state = StoredState::Dead;
        rec.run_at_ms = now_ms;
        self.put(id, &rec)
    }

    /// Ends a delivery that did not ack: back to ready at `requeue_at_ms` (the back of its
    /// priority: a job whose leases keep expiring never starves the jobs behind it),
    /// scheduled if that is in the future, or dead when the attempts are used up.
    fn end_attempt(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        mut rec: JobRecord,
        reason: &str,
        now_ms: u64,
        requeue_at_ms: u64,
    ) -> Result<JobState> {
        debug_assert!(matches!(rec.state, StoredState::Leased { .. }));
        self.unindex(id, &rec)?;
        rec.last_error = Some(truncate_reason(reason));
        if rec.attempts >= rec.max_attempts {
            tracing::info!(
                queue = self.tq.qid,
                job_id = id,
                attempts = rec.attempts,
                %reason,
                "leaseq: job dead-lettered (no attempts left)"
            );
            rec.state = StoredState::Dead;
            rec.run_at_ms = now_ms;
        } else {
            rec.run_at_ms = requeue_at_ms;
            rec.state = if requeue_at_ms > now_ms {
                StoredState::Scheduled
            } else {
                rec.seq = ctx.alloc_seq();
                StoredState::Ready
            };
        }
        self.put(id, &rec)?;
        Ok(rec.state.public())
    }
}

/// Adds validated records (from [`new_record`] or [`import_record`]) in order. A dedup key
/// held by a live job, or by an earlier record of the same batch, makes that record a
/// `Duplicate`. `now_ms` is when key holders and windows are judged: the call's time for an
/// import (whose records keep their own `created_ms`), `None` for new records (created now).
pub(crate) fn enqueue(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    records: &[JobRecord],
    now_ms: Option<u64>,
) -> Result<Vec<Enqueued>> {
    let mut t = Tables::open(ctx.tx, tq)?;
    enqueue_into(&mut t, ctx, records, now_ms)
}

/// [`enqueue`] on tables the running operation holds open.
fn enqueue_into(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    records: &[JobRecord],
    now_ms: Option<u64>,
) -> Result<Vec<Enqueued>> {
    let mut out = Vec::with_capacity(records.len());
    for rec in records {
        let now_ms = now_ms.unwrap_or(rec.created_ms);
        if let Some(k) = &rec.dedup_key
            && let Some((owner, by_window)) = t.key_holder(k, now_ms)?
        {
            // A lookup that found a window ended wrote (it released the key); this did not.
            let dead = !by_window && t.dead()?.get(owner)?.is_some();
            out.push(if dead {
                Enqueued::DuplicateDead(JobId(owner))
            } else {
                Enqueued::Duplicate(JobId(owner))
            });
            continue;
        }
        let id = ctx.alloc_id();
        *ctx.dirty = true;
        ctx.wake(t.tq.qid);
        let mut rec = rec.clone();
        if rec.state == StoredState::Ready {
            rec.seq = ctx.alloc_seq();
        }
        t.store_payload(id, &mut rec)?;
        // An id in use is damage to the counters: the error aborts the whole transaction, so
        // what this wrote over is never committed.
        t.put_new(id, &rec)?;
        if let Some(k) = &rec.dedup_key {
            // Dedup windows past their end go as new keys come, a bounded few per key.
            prune_windows(t, now_ms, PRUNE_PER_ACK_MAX)?;
            t.dedup()?.insert(k.as_slice(), id)?;
            // A window runs from the job's creation (an imported job's may be past: a window
            // that already ended holds nothing beyond the live job).
            if let Some(w) = rec.dedup_window_ms
                && let end_ms = rec.created_ms.saturating_add(w)
                && end_ms > now_ms
            {
                t.windows()?.insert(k.as_slice(), end_ms)?;
                t.expiry()?.insert((end_ms, k.as_slice()), ())?;
            }
        }
        t.carry_key(id, &rec)?;
        out.push(Enqueued::New(JobId(id)));
    }
    Ok(out)
}

/// Where a caller's closure inside a group transaction enqueues ([`crate::Tx::enqueue`]): on
/// the tables the running operation holds open (`ack_with`) or opens for it
/// ([`write`]).
pub(crate) trait Sink {
    /// Adds validated records in order to queue `tq`, as [`enqueue`].
    fn put(&mut self, tq: &'static QueueTables, records: &[JobRecord]) -> Result<Vec<Enqueued>>;
}

/// The [`Sink`] of one closure run. A storage error part-way through an enqueue leaves its
/// writes half done: `broken` then makes the operation fail whatever the closure returns.
pub(crate) struct TablesSink<'s, 't, 'c> {
    t: &'s mut Tables<'t>,
    ctx: &'s mut Ctx<'c>,
    /// The jobs the running operation acks (deletes) when it commits: a dedup key one of them
    /// holds only while live is free for a job enqueued here.
    acked: &'s [u64],
    broken: Option<String>,
}

impl Sink for TablesSink<'_, '_, '_> {
    fn put(&mut self, tq: &'static QueueTables, records: &[JobRecord]) -> Result<Vec<Enqueued>> {
        if let Some(why) = &self.broken {
            return Err(Error::Effect(
                format!("an earlier enqueue in this transaction failed: {why}").into(),
            ));
        }
        let r = if tq.qid == self.t.tq.qid {
            self.release_acked_keys(records)
                .and_then(|()| enqueue_into(self.t, self.ctx, records, None))
        } else {
            // Another queue of the file: its tables, opened for this enqueue only.
            Tables::open(self.t.tx, tq)
                .and_then(|mut other| enqueue_into(&mut other, self.ctx, records, None))
        };
        if let Err(e) = &r {
            self.broken = Some(e.to_string());
        }
        r
    }
}

impl TablesSink<'_, '_, '_> {
    /// Releases the dedup keys of `records` held (while live, not by a window) by a job this
    /// operation acks: that job is gone when the transaction commits, so a follow-up with its
    /// key takes the key instead of being answered `Duplicate` of a job that will not exist.
    fn release_acked_keys(&mut self, records: &[JobRecord]) -> Result<()> {
        if self.acked.is_empty() {
            return Ok(());
        }
        for rec in records {
            if let Some(k) = &rec.dedup_key
                && let Some((owner, false)) = self.t.key_holder(k, rec.created_ms)?
                && self.acked.contains(&owner)
            {
                self.t.dedup()?.remove(k.as_slice())?;
            }
        }
        Ok(())
    }

    /// The closure's result, unless an enqueue inside it broke the transaction.
    fn settle<T>(self, ran: Result<T, BoxError>) -> Result<T> {
        if let Some(why) = self.broken {
            return Err(Error::Effect(
                format!("an enqueue inside the transaction failed: {why}").into(),
            ));
        }
        ran.map_err(Error::Effect)
    }
}

/// Runs a caller's closure in the group transaction ([`crate::Queue::write`]): its own writes
/// and the jobs it enqueues commit with the group. The closure's error (or panic) fails the
/// call with `Effect`, and the group aborts so nothing of it commits.
pub(crate) fn write<T>(
    ctx: &mut Ctx<'_>,
    cfg: &Config,
    now_ms: u64,
    f: &mut dyn FnMut(&crate::Tx<'_>) -> Result<T, BoxError>,
) -> Result<T> {
    let tq = cfg.tables;
    let tx = ctx.tx;
    // The caller's writes are unknown to leaseq: the group commits.
    *ctx.dirty = true;
    let mut t = Tables::open(tx, tq)?;
    let mut sink = TablesSink {
        t: &mut t,
        ctx,
        acked: &[],
        broken: None,
    };
    let ran = run_closure(|| f(&crate::Tx::new(tx, *cfg, now_ms, &mut sink)));
    sink.settle(ran)
}

/// Runs a caller's closure; a panic in it becomes its error.
fn run_closure<T>(f: impl FnOnce() -> Result<T, BoxError>) -> Result<T, BoxError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => Err(format!("closure panicked: {}", crate::panic_message(&*panic)).into()),
    }
}

/// Promotes due scheduled jobs and reclaims expired leases, at most `SWEEP_MAX` of each. An
/// entry whose row is damaged or disagrees is settled (quarantined, dropped) and the sweep
/// goes on.
fn sweep(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, cfg: &Config, now_ms: u64) -> Result<()> {
    if let Some(retention_ms) = cfg.dead_retention_ms {
        prune_dead(t, ctx, now_ms, retention_ms, PRUNE_PER_ACK_MAX)?;
    }
    let due: Vec<(u64, u64)> = t
        .scheduled()?
        .range(..=(now_ms, u64::MAX))?
        .take(SWEEP_MAX)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    for (run_at_ms, id) in due {
        *ctx.dirty = true;
        ctx.wake(t.tq.qid);
        match t.row(id)? {
            Row::Good(mut rec)
                if rec.state == StoredState::Scheduled && rec.run_at_ms == run_at_ms =>
            {
                t.unindex(id, &rec)?;
                rec.seq = ctx.alloc_seq();
                rec.state = StoredState::Ready;
                t.put(id, &rec)?;
            }
            row => {
                t.scheduled()?.remove((run_at_ms, id))?;
                t.settle_stray(ctx, id, row, now_ms)?;
            }
        }
    }
    let expired: Vec<(u64, u64)> = t
        .leases()?
        .range(..=(now_ms, u64::MAX))?
        .take(SWEEP_MAX)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    for (deadline_ms, id) in expired {
        *ctx.dirty = true;
        ctx.wake(t.tq.qid);
        end_lease_entry(t, ctx, (deadline_ms, id), REASON_EXPIRED, Some(cfg), now_ms)?;
    }
    Ok(())
}

/// What ending one lease entry did.
enum Ended {
    Returned,
    Dead,
    Quarantined,
    Stray,
}

/// Ends the attempt behind lease entry `(deadline_ms, id)` (lease expiry, recovery at open):
/// ready or dead as [`Tables::end_attempt`], due after the retry policy of `retry` (`None`:
/// at once); a damaged row is quarantined and an entry that does not match its row is
/// dropped, so one bad row never stops the pass.
fn end_lease_entry(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    (deadline_ms, id): (u64, u64),
    reason: &str,
    retry: Option<&Config>,
    now_ms: u64,
) -> Result<Ended> {
    match t.row(id)? {
        Row::Good(rec) if matches!(rec.state, StoredState::Leased { deadline_ms: d, .. } if d == deadline_ms) =>
        {
            let at_ms = retry.map_or(now_ms, |cfg| retry_at_ms(cfg, id, &rec, now_ms));
            Ok(match t.end_attempt(ctx, id, rec, reason, now_ms, at_ms)? {
                JobState::Dead => Ended::Dead,
                _ => Ended::Returned,
            })
        }
        row => {
            t.leases()?.remove((deadline_ms, id))?;
            Ok(if t.settle_stray(ctx, id, row, now_ms)? {
                Ended::Quarantined
            } else {
                Ended::Stray
            })
        }
    }
}

/// Sweeps, then leases up to `max` ready jobs in queue order.
pub(crate) fn dequeue(
    ctx: &mut Ctx<'_>,
    cfg: &Config,
    now_ms: u64,
    max: usize,
) -> Result<Vec<Leased>> {
    let tq = cfg.tables;
    debug_assert!((1..=crate::BATCH_MAX).contains(&max));
    let mut t = Tables::open(ctx.tx, tq)?;
    sweep(&mut t, ctx, cfg, now_ms)?;
    let mut out = Vec::with_capacity(max);
    // Entries whose row is damaged or does not match: settled below. Each is settled once (its
    // entry removed), so however much damage lies ahead of the first good job, the loop ends,
    // and a dequeue never answers "nothing" while a job is ready.
    let mut strays = Vec::new();
    // Payload bytes handed out so far: the batch stops before the job that would pass the
    // budget (the first job is always taken).
    let mut bytes = 0usize;
    let mut budget_reached = false;
    while out.len() < max && !budget_reached {
        // The first entries still wanted, in queue order.
        let mut firsts: Vec<(u32, u64, u64)> = t
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
        *ctx.dirty = true;
        let mut slots = Vec::with_capacity(firsts.len());
        for (i, &(rank, seq, id)) in firsts.iter().enumerate() {
            let Some(mut row) = t.jobs.get_mut(id)? else {
                slots.push(Slot::Stray);
                continue;
            };
            let mut rec = match JobRecord::decode(row.value()) {
                Ok(rec)
                    if rec.state == StoredState::Ready
                        && priority_rank(rec.priority) == rank
                        && rec.seq == seq =>
                {
                    rec
                }
                _ => {
                    slots.push(Slot::Stray);
                    continue;
                }
            };
            let size = rec.payload_len();
            let taken_any = !out.is_empty() || slots.iter().any(|s| !matches!(s, Slot::Stray));
            if taken_any && bytes.saturating_add(size) > cfg.dequeue_batch_bytes {
                firsts.truncate(i);
                budget_reached = true;
                break;
            }
            bytes = bytes.saturating_add(size);
            // Tokens in queue order, whatever the payloads.
            let mut leased = lease_record(ctx, cfg, now_ms, id, &mut rec);
            if rec.payload_apart.is_some() {
                // Its payload is read (and checked) below, before its lease is written.
                slots.push(Slot::Apart(rec, leased));
                continue;
            }
            rec.validate()?;
            row.insert(rec.encode()?.as_slice())?;
            drop(row);
            if !t.index(id, &rec)? {
                tracing::warn!(job_id = id, "leaseq: index entry was already present");
            }
            leased.idempotency_key = rec.idempotency_key;
            leased.payload = rec.payload;
            slots.push(Slot::Leased(leased));
        }
        // Then the ready entries removed: one at a time for one, in one pass for more (a
        // single delete rebuilds its leaf: 100 cost ~120 µs one by one, ~15 µs in one pass).
        match firsts.as_slice() {
            // The budget cuts before the first row only when something was taken already.
            [] => break,
            [one] => {
                t.ready()?.remove(*one)?;
            }
            [.., last] => {
                let mut removed = 0;
                t.ready()?.retain_in(..=*last, |_, ()| {
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
                Slot::Stray => strays.push(id),
                Slot::Leased(leased) => out.push(leased),
                Slot::Apart(rec, mut leased) => {
                    let Some(r) = &rec.payload_apart else {
                        unreachable!("an apart slot has its payload apart")
                    };
                    let payload = match t.apart_payload(id, r)? {
                        Ok(p) => p,
                        Err(why) => {
                            // Its ready entry is gone: the job moves aside whole, the batch
                            // goes on.
                            t.quarantine(ctx, id, &why, now_ms)?;
                            continue;
                        }
                    };
                    t.put(id, &rec)?;
                    leased.idempotency_key = rec.idempotency_key;
                    leased.payload = payload;
                    out.push(leased);
                }
            }
        }
    }
    // Settled after the leases, from the rows as they are now: a stray entry's job may be one
    // this dequeue just leased through its own entry.
    for id in strays {
        let row = t.row(id)?;
        t.settle_stray(ctx, id, row, now_ms)?;
    }
    Ok(out)
}

/// A ready job found by [`dequeue`]: leased in place; leased in memory, its row written once
/// its payload stored apart is read; or an entry that does not match its row.
// Moved once each, on the way out: boxing would only add an allocation per job.
#[allow(clippy::large_enum_variant)]
enum Slot {
    Leased(Leased),
    Apart(JobRecord, Leased),
    Stray,
}

/// Turns the ready record `rec` of job `id` into a leased one (a fresh token, the attempt
/// counted, the deadline from its lease) and returns the delivery, its key and payload left
/// empty.
fn lease_record(
    ctx: &mut Ctx<'_>,
    cfg: &Config,
    now_ms: u64,
    id: u64,
    rec: &mut JobRecord,
) -> Leased {
    let token = ctx.alloc_token();
    let lease_ms = rec.lease_ms.unwrap_or(cfg.lease_ms);
    let deadline_ms = now_ms.saturating_add(lease_ms);
    rec.attempts += 1;
    rec.state = StoredState::Leased { token, deadline_ms };
    Leased {
        id,
        token,
        attempt: rec.attempts,
        max_attempts: rec.max_attempts,
        deadline_ms,
        lease_ms,
        // Moved from the record once it is written.
        idempotency_key: None,
        encoding: rec.encoding.and_then(crate::Encoding::from_tag),
        payload: Vec::new(),
    }
}

/// Acks every current lease of the batch; a lease that is not current (`LeaseLost`) or whose
/// row is damaged (`Corrupted`) is reported in its place and changes nothing, so the others
/// are not held up by it (as SQS's `DeleteMessageBatch` reports each entry).
pub(crate) fn ack(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    leases: &[(u64, u64)],
    now_ms: u64,
) -> Result<Vec<Result<()>>> {
    let mut t = Tables::open(ctx.tx, tq)?;
    let mut out = Vec::with_capacity(leases.len());
    let (mut keys, mut records) = (Vec::new(), Vec::new());
    for &(id, token) in leases {
        match t.lease_of(id, token)? {
            Ok(rec) => {
                keys.push((id, token));
                records.push(rec);
                out.push(Ok(()));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    if !keys.is_empty() {
        *ctx.dirty = true;
        t.delete_leased(&keys, &records, now_ms)?;
    }
    Ok(out)
}

/// The effect callback of [`ack_with`]: gets the transaction and the index of the lease in
/// the batch.
pub(crate) type Effect<'a> = dyn FnMut(&crate::Tx<'_>, usize) -> Result<(), BoxError> + 'a;

/// A caller's effect for the whole batch: called once with the positions of the leases it
/// covers.
pub(crate) type EffectAll<'a> = dyn FnMut(&crate::Tx<'_>, &[usize]) -> Result<(), BoxError> + 'a;

/// How [`ack_with`] runs the caller's effect: once per lease that needs it, or once for all
/// of them (after the checks, before the deletes).
pub(crate) enum EffectFn<'f, 'e> {
    Each(&'f mut Effect<'e>),
    All(&'f mut EffectAll<'e>),
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
    cfg: &Config,
    now_ms: u64,
    failed: &[Option<Failure>],
    effect: &mut EffectFn<'_, '_>,
) -> Result<Vec<Result<Applied>>> {
    let tq = cfg.tables;
    debug_assert_eq!(leases.len(), failed.len());
    let tx = ctx.tx;
    let mut t = Tables::open(tx, tq)?;
    // Every leaseq table is held open while closures run, so redb refuses a closure that
    // opens one (lazy opening would leave the unused index tables open to it).
    t.open_all()?;
    let mut applied = tx.open_table(tq.applied())?;
    // Held open (unused) so a closure that opens `leaseq_meta` is refused by redb as well.
    let _meta = tx.open_table(META)?;
    let mut out = Vec::with_capacity(leases.len());
    let (mut keys, mut records) = (Vec::new(), Vec::new());
    // Held open (as every leaseq table) while closures run.
    let mut by_time = tx.open_table(tq.applied_by_time())?;
    let mut new_markers = 0;
    // With `EffectFn::All`, the leases whose effect runs (once, after the loop).
    let mut pending = Vec::new();
    // The jobs this call deletes if it commits (current leases whose effect did not fail
    // before): follow-ups enqueued by the closures may take the dedup keys they hold.
    let mut acked = Vec::new();
    // Each row read once: no row changes before the deletes at the end but a failed lease's
    // own (given back below; closures cannot write leaseq's tables, and their enqueues take
    // new ids). A job named by two leases of the batch is read again at each.
    let mut read: Vec<Option<Result<JobRecord>>> = Vec::with_capacity(leases.len());
    for (i, &(id, token)) in leases.iter().enumerate() {
        let found = t.lease_of(id, token)?;
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
            None => t.lease_of(id, token)?,
        };
        let rec = match found {
            Ok(rec) => rec,
            Err(e) => {
                out.push(Err(e));
                continue;
            }
        };
        *ctx.dirty = true;
        if let Some(f) = &failed[i] {
            ctx.wake(t.tq.qid);
            match f.how {
                GiveBack::Retry(backoff_ms) => {
                    let at_ms = match backoff_ms {
                        Some(b) => now_ms.saturating_add(b),
                        None => retry_at_ms(cfg, id, &rec, now_ms),
                    };
                    t.end_attempt(ctx, id, rec, &f.reason, now_ms, at_ms)?;
                }
                GiveBack::Snooze(delay_ms) => t.snooze_leased(ctx, id, rec, now_ms, delay_ms)?,
                GiveBack::Fail => t.fail_leased(id, rec, &f.reason, now_ms)?,
            }
            out.push(Err(Error::Effect(f.reason.clone().into())));
            continue;
        }
        // Only a caller's idempotency key gets a marker. A job without one is keyed by its
        // own id, and that marker would guard nothing: ids are never reused, and the effect
        // and the removal of the job commit together, so no later delivery can ask.
        let key = rec
            .idempotency_key
            .as_deref()
            .map(|k| applied_key(Some(k), id));
        let already = match &key {
            Some(k) => applied.get(k.as_slice())?.is_some(),
            None => false,
        };
        if already {
            out.push(Ok(Applied::AlreadyApplied));
        } else {
            match effect {
                // leaseq's tables stay open: the closure may open any table but `leaseq_*`
                // ones (redb would refuse those as already open), and enqueue follow-up jobs
                // through them. A panic in it becomes an error like any other, so the group
                // aborts cleanly.
                EffectFn::Each(f) => {
                    let mut sink = TablesSink {
                        t: &mut t,
                        ctx,
                        acked: &acked,
                        broken: None,
                    };
                    let ran = run_closure(|| f(&crate::Tx::new(tx, *cfg, now_ms, &mut sink), i));
                    sink.settle(ran)?;
                }
                // Run once below, for every lease that needs it.
                EffectFn::All(_) => pending.push(i),
            }
            if let Some(k) = &key {
                applied.insert(k.as_slice(), now_ms)?;
                by_time.insert((now_ms, k.as_slice()), ())?;
                new_markers += 1;
            }
            out.push(Ok(Applied::Now));
        }
        keys.push((id, token));
        records.push(rec);
    }
    if let EffectFn::All(f) = effect
        && !pending.is_empty()
    {
        let mut sink = TablesSink {
            t: &mut t,
            ctx,
            acked: &acked,
            broken: None,
        };
        let ran = run_closure(|| f(&crate::Tx::new(tx, *cfg, now_ms, &mut sink), &pending));
        sink.settle(ran)?;
    }
    if !keys.is_empty() {
        t.delete_leased(&keys, &records, now_ms)?;
    }
    // Markers past their retention go as new ones come, a bounded few per new one.
    if new_markers > 0
        && let Some(retention_ms) = cfg.applied_retention_ms
    {
        let max = PRUNE_PER_ACK_MAX * new_markers;
        prune_applied(
            &mut t,
            &mut applied,
            &mut by_time,
            now_ms,
            retention_ms,
            max,
        )?;
        debug_assert!(*ctx.dirty, "an ack_with that wrote a marker is dirty");
    }
    Ok(out)
}

/// Removes up to `max` applied markers whose retention (from their `kept_since_ms`) has
/// passed, oldest first. A marker whose key a live job carries is kept: its retention starts
/// again from now. Returns how many were removed, how many looked at (each one a write), and
/// whether expired ones may remain.
fn prune_applied(
    t: &mut Tables<'_>,
    applied: &mut Table<'_, &'static [u8], u64>,
    by_time: &mut Table<'_, (u64, &'static [u8]), ()>,
    now_ms: u64,
    retention_ms: u64,
    max: usize,
) -> Result<(u64, usize, bool)> {
    let Some(cutoff_ms) = now_ms.checked_sub(retention_ms) else {
        return Ok((0, 0, false));
    };
    let (expired, more) = due_entries(by_time, cutoff_ms, max)?;
    let looked = expired.len();
    let mut removed = 0;
    for (at, key) in expired {
        by_time.remove((at, key.as_slice()))?;
        let carried = t
            .idem()?
            .range((key.as_slice(), 0)..=(key.as_slice(), u64::MAX))?
            .next()
            .is_some();
        if carried {
            applied.insert(key.as_slice(), now_ms)?;
            by_time.insert((now_ms, key.as_slice()), ())?;
        } else {
            applied.remove(key.as_slice())?;
            removed += 1;
        }
    }
    Ok((removed, looked, more))
}

/// Deletes up to `max` dead jobs that died `retention_ms` or more before `now_ms`, oldest
/// first, releasing their keys. An index entry that does not match its row is dropped (the
/// row settled). Returns how many were deleted and whether more may be left.
fn prune_dead(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    now_ms: u64,
    retention_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let Some(cutoff_ms) = now_ms.checked_sub(retention_ms) else {
        return Ok((0, false));
    };
    let old: Vec<(u64, u64)> = t
        .dead_by_time()?
        .range(..=(cutoff_ms, u64::MAX))?
        .take(max + 1)
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    let more = old.len() > max;
    let mut deleted = 0;
    for (died_ms, id) in old.into_iter().take(max) {
        *ctx.dirty = true;
        match t.row(id)? {
            Row::Good(rec) if rec.state == StoredState::Dead && rec.run_at_ms == died_ms => {
                t.delete(id, &rec, now_ms)?;
                deleted += 1;
            }
            row => {
                t.dead_by_time()?.remove((died_ms, id))?;
                t.settle_stray(ctx, id, row, now_ms)?;
            }
        }
    }
    Ok((deleted, more))
}

/// [`Queue::prune`](crate::Queue::prune)'s work on dead jobs in one transaction.
pub(crate) fn prune_dead_jobs(
    ctx: &mut Ctx<'_>,
    cfg: &Config,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let tq = cfg.tables;
    let Some(retention_ms) = cfg.dead_retention_ms else {
        return Ok((0, false));
    };
    let mut t = Tables::open(ctx.tx, tq)?;
    prune_dead(&mut t, ctx, now_ms, retention_ms, max)
}

/// An entry of a time index: (time_ms, key).
type TimedKey = (u64, Vec<u8>);

/// The first `max` entries of a time index `(time_ms, key)` with `time_ms <= up_to_ms`, oldest
/// first, and whether more such entries are left.
fn due_entries(
    index: &Table<'_, (u64, &'static [u8]), ()>,
    up_to_ms: u64,
    max: usize,
) -> Result<(Vec<TimedKey>, bool)> {
    let empty: &[u8] = &[];
    let mut due: Vec<TimedKey> = index
        .range(..(up_to_ms.saturating_add(1), empty))?
        .take(max.saturating_add(1))
        .map(|e| {
            e.map(|(k, _)| {
                let (at, key) = k.value();
                (at, key.to_vec())
            })
        })
        .collect::<Result<_, _>>()?;
    let more = due.len() > max;
    due.truncate(max);
    Ok((due, more))
}

/// Releases up to `max` dedup keys whose window has ended, earliest first (the jobs that
/// held them are not touched). Returns how many were released and whether more may be left.
fn prune_windows(t: &mut Tables<'_>, now_ms: u64, max: usize) -> Result<(u64, bool)> {
    let (ended, more) = due_entries(t.expiry()?, now_ms, max)?;
    let mut released = 0;
    for (end_ms, key) in ended {
        let current = t.windows()?.get(key.as_slice())?.map(|v| v.value());
        if current == Some(end_ms) {
            t.end_window(&key, end_ms)?;
            released += 1;
        } else {
            t.expiry()?.remove((end_ms, key.as_slice()))?;
        }
    }
    Ok((released, more))
}

/// [`Queue::prune`](crate::Queue::prune)'s work on dedup windows in one transaction.
pub(crate) fn prune_dedup_windows(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let mut t = Tables::open(ctx.tx, tq)?;
    let (released, more) = prune_windows(&mut t, now_ms, max)?;
    if released > 0 || more {
        *ctx.dirty = true;
    }
    Ok((released, more))
}

/// Brings a file of an older format version to [`FORMAT_VERSION`], one step per version, in
/// this transaction (run at open, before lease recovery). Returns the version it came from,
/// or `None` if the file was current.
///
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
    let mut meta = ctx.tx.open_table(META)?;
    if let Some(id) = meta
        .get(META_FILE_ID)?
        .map(|v| v.value())
        .filter(|&id| id != 0)
    {
        return Ok(id);
    }
    let id = random_u64();
    meta.insert(META_FILE_ID, id)?;
    *ctx.dirty = true;
    Ok(id)
}

/// 64 random bits, never 0: std's randomly keyed SipHash over the time and process id.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// 1 → 2: the time index of the applied markers and the index of the caller idempotency keys
/// live jobs carry are built from `leaseq_applied` and `leaseq_jobs`; markers of jobs' own ids
/// (which guard nothing) are dropped. 2 → 3: payloads above 1 KiB move to `leaseq_payloads`.
/// 3 → 4: the empty registry of named queues. 4 → 5: the version only (records of version 3
/// are read as they are).
/// A row that fails its checks is skipped here: the pass that meets it quarantines it.
pub(crate) fn upgrade(ctx: &mut Ctx<'_>) -> Result<Option<u64>> {
    let tx = ctx.tx;
    let mut meta = tx.open_table(META)?;
    let version = meta
        .get(META_FORMAT_VERSION)?
        .map(|v| v.value())
        .ok_or_else(|| Error::corrupted("leaseq_meta has no format version"))?;
    match version {
        FORMAT_VERSION => return Ok(None),
        1..=4 => {}
        _ => {
            return Err(Error::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
    }
    *ctx.dirty = true;
    if version == 1 {
        upgrade_1_to_2(tx)?;
    }
    if version <= 2 {
        upgrade_2_to_3(tx)?;
    }
    // 3 to 4: the registry of named queues, empty.
    tx.open_table(QUEUES)?;
    // 4 to 5: nothing to rewrite (version-4 records are written from now on).
    meta.insert(META_FORMAT_VERSION, FORMAT_VERSION)?;
    Ok(Some(version))
}

/// Format 1 to 2: the time index of applied markers (markers of jobs' own ids dropped), the
/// carriers of caller keys, the dedup-window tables, the dead jobs by when they died.
fn upgrade_1_to_2(tx: &redb::WriteTransaction) -> Result<()> {
    let tq = &crate::schema::DEFAULT_TABLES;
    let mut applied = tx.open_table(tq.applied())?;
    applied.retain(|k, _| k.first() != Some(&0))?;
    let mut by_time = tx.open_table(tq.applied_by_time())?;
    for e in applied.iter()? {
        let (k, at) = e?;
        by_time.insert((at.value(), k.value()), ())?;
    }
    let jobs = tx.open_table(tq.jobs())?;
    let mut idem = tx.open_table(tq.idem_jobs())?;
    for e in jobs.iter()? {
        let (id, row) = e?;
        if let Ok(rec) = JobRecord::decode(row.value())
            && let Some(k) = rec.idempotency_key.as_deref()
        {
            let key = applied_key(Some(k), id.value());
            idem.insert((key.as_slice(), id.value()), ())?;
        }
    }
    tx.open_table(tq.dedup_windows())?;
    tx.open_table(tq.dedup_expiry())?;
    let mut dead_by_time = tx.open_table(tq.dead_by_time())?;
    for e in tx.open_table(tq.dead())?.iter()? {
        let id = e?.0.value();
        if let Some(row) = jobs.get(id)?
            && let Ok(rec) = JobRecord::decode(row.value())
            && rec.state == StoredState::Dead
        {
            dead_by_time.insert((rec.run_at_ms, id), ())?;
        }
    }
    Ok(())
}

/// Format 2 to 3: every inline payload larger than `PAYLOAD_INLINE_MAX` moves to
/// `leaseq_payloads` (one job at a time, so memory holds one payload). A row that does not
/// decode is left for the passes that quarantine it.
fn upgrade_2_to_3(tx: &redb::WriteTransaction) -> Result<()> {
    let tq = &crate::schema::DEFAULT_TABLES;
    let mut jobs = tx.open_table(tq.jobs())?;
    let mut payloads = tx.open_table(tq.payloads())?;
    let mut large = Vec::new();
    for e in jobs.iter()? {
        let (id, row) = e?;
        if let Ok(rec) = JobRecord::decode(row.value())
            && rec.payload.len() > PAYLOAD_INLINE_MAX
        {
            large.push(id.value());
        }
    }
    for id in large {
        let mut rec = match jobs.get(id)? {
            Some(row) => JobRecord::decode(row.value())?,
            None => continue,
        };
        let payload = std::mem::take(&mut rec.payload);
        rec.payload_apart = Some(PayloadRef::of(&payload));
        payloads.insert(id, payload.as_slice())?;
        rec.validate()?;
        jobs.insert(id, rec.encode()?.as_slice())?;
    }
    Ok(())
}

/// [`Queue::prune`](crate::Queue::prune)'s work in one transaction: up to `max` expired
/// applied markers. Returns how many were removed and whether more may be left.
pub(crate) fn prune(
    ctx: &mut Ctx<'_>,
    cfg: &Config,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    let tq = cfg.tables;
    let Some(retention_ms) = cfg.applied_retention_ms else {
        return Ok((0, false));
    };
    let mut t = Tables::open(ctx.tx, tq)?;
    let mut applied = ctx.tx.open_table(tq.applied())?;
    let mut by_time = ctx.tx.open_table(tq.applied_by_time())?;
    let (removed, looked, more) = prune_applied(
        &mut t,
        &mut applied,
        &mut by_time,
        now_ms,
        retention_ms,
        max,
    )?;
    if looked > 0 {
        *ctx.dirty = true;
    }
    Ok((removed, more))
}

// The calls aimed at one job below answer `Ok(Err(refusal))` for a refusal about that job
// (`LeaseLost`, `Corrupted` for its damaged row, ...): nothing was written, and the group
// commit goes on without replaying its other members. An outer `Err` aborts the group.

/// The record of lease `(id, token)`, or the refusal, as the first step of a call on it.
macro_rules! lease_or_refuse {
    ($t:expr, $id:expr, $token:expr) => {
        match $t.lease_of($id, $token)? {
            Ok(rec) => rec,
            Err(refusal) => return Ok(Err(refusal)),
        }
    };
}

/// Ends the attempt of lease `(id, token)` with `reason`: due after `backoff_ms`, or after the
/// retry policy's delay when `None`; dead when out of attempts.
pub(crate) fn nack(
    ctx: &mut Ctx<'_>,
    cfg: &Config,
    (id, token): (u64, u64),
    now_ms: u64,
    backoff_ms: Option<u64>,
    reason: &str,
) -> Result<Result<JobState>> {
    let tq = cfg.tables;
    let mut t = Tables::open(ctx.tx, tq)?;
    let rec = lease_or_refuse!(t, id, token);
    let at = match backoff_ms {
        Some(b) => now_ms
            .checked_add(b)
            .ok_or_else(|| Error::invalid_option("backoff", "due time overflows"))?,
        None => retry_at_ms(cfg, id, &rec, now_ms),
    };
    *ctx.dirty = true;
    ctx.wake(t.tq.qid);
    t.end_attempt(ctx, id, rec, reason, now_ms, at).map(Ok)
}

/// Gives a leased job back without charging its attempt: due at `now_ms + delay_ms` (ready
/// at once for 0), its attempt count back down by one, its snooze count up by one. Never
/// dead-letters; the last error is kept as it was.
pub(crate) fn snooze(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    (id, token): (u64, u64),
    now_ms: u64,
    delay_ms: u64,
) -> Result<Result<()>> {
    let mut t = Tables::open(ctx.tx, tq)?;
    let rec = lease_or_refuse!(t, id, token);
    if now_ms.checked_add(delay_ms).is_none() {
        return Err(Error::invalid_option("delay", "due time overflows"));
    }
    *ctx.dirty = true;
    t.snooze_leased(ctx, id, rec, now_ms, delay_ms).map(Ok)
}

pub(crate) fn fail(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    (id, token): (u64, u64),
    now_ms: u64,
    reason: &str,
) -> Result<Result<()>> {
    let mut t = Tables::open(ctx.tx, tq)?;
    let rec = lease_or_refuse!(t, id, token);
    *ctx.dirty = true;
    t.fail_leased(id, rec, reason, now_ms).map(Ok)
}

pub(crate) fn extend(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    id: u64,
    token: u64,
    now_ms: u64,
    by: std::time::Duration,
) -> Result<Result<u64>> {
    let lease_ms = lease_ms_checked("extend", by)?;
    let mut t = Tables::open(ctx.tx, tq)?;
    let mut rec = lease_or_refuse!(t, id, token);
    let deadline_ms = now_ms
        .checked_add(lease_ms)
        .ok_or_else(|| Error::invalid_option("extend", "deadline overflows"))?;
    *ctx.dirty = true;
    t.unindex(id, &rec)?;
    rec.state = StoredState::Leased { token, deadline_ms };
    t.put(id, &rec)?;
    Ok(Ok(deadline_ms))
}

pub(crate) fn requeue_dead(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    id: u64,
    now_ms: u64,
) -> Result<Result<()>> {
    let mut t = Tables::open(ctx.tx, tq)?;
    let mut rec = match t.row(id)? {
        Row::Good(rec) => rec,
        Row::Damaged(why) => return Ok(Err(damaged(id, &why))),
        Row::Missing => return Ok(Err(Error::JobNotFound { job_id: JobId(id) })),
    };
    if rec.state != StoredState::Dead {
        return Ok(Err(Error::InvalidState {
            job_id: JobId(id),
            actual: rec.state.public(),
            expected: "Dead",
        }));
    }
    *ctx.dirty = true;
    ctx.wake(t.tq.qid);
    t.unindex(id, &rec)?;
    rec.attempts = 0;
    rec.run_at_ms = now_ms;
    rec.seq = ctx.alloc_seq();
    rec.state = StoredState::Ready;
    t.put(id, &rec).map(Ok)
}

/// Deletes a job that is not leased (scheduled, ready or dead), releasing its dedup key. A
/// damaged row (in any state: its state cannot be read) or a quarantined one is deleted too,
/// with every index and dedup entry naming it: these scans read whole tables, which only
/// damage repair pays. So is a leased job whose lease entry is missing (no sweep or reopen
/// can find it), and a dead-letter entry naming no job.
pub(crate) fn remove(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    id: u64,
    now_ms: u64,
) -> Result<Result<()>> {
    let mut t = Tables::open(ctx.tx, tq)?;
    match t.row(id)? {
        Row::Good(rec) => {
            if let StoredState::Leased { deadline_ms, .. } = rec.state
                && t.leases()?.get((deadline_ms, id))?.is_some()
            {
                return Ok(Err(Error::InvalidState {
                    job_id: JobId(id),
                    actual: JobState::Leased,
                    expected: "Scheduled, Ready or Dead",
                }));
            }
            *ctx.dirty = true;
            t.delete(id, &rec, now_ms).map(Ok)
        }
        Row::Damaged(_) => {
            *ctx.dirty = true;
            t.ready()?.retain(|(_, _, j), ()| j != id)?;
            t.scheduled()?.retain(|(_, j), ()| j != id)?;
            t.leases()?.retain(|(_, j), ()| j != id)?;
            t.dead()?.remove(id)?;
            t.dead_by_time()?.retain(|(_, j), ()| j != id)?;
            t.drop_keys_of(id)?;
            t.jobs.remove(id)?;
            t.payloads()?.remove(id)?;
            Ok(Ok(()))
        }
        Row::Missing => {
            let quarantined = match ctx.tx.open_table(tq.quarantine()) {
                Ok(mut q) => q.remove(id)?.is_some(),
                Err(redb::TableError::TableDoesNotExist(_)) => false,
                Err(e) => return Err(e.into()),
            };
            // A dead-letter entry naming no job is found by its id alone (the other indexes
            // are keyed by time or place: a pass that meets such an entry drops it).
            let stray_dead = t.dead()?.remove(id)?.is_some();
            if stray_dead {
                t.dead_by_time()?.retain(|(_, j), ()| j != id)?;
            }
            if !quarantined && !stray_dead {
                return Ok(Err(Error::JobNotFound { job_id: JobId(id) }));
            }
            *ctx.dirty = true;
            if quarantined {
                t.drop_keys_of(id)?;
                t.payloads()?.remove(id)?;
            }
            Ok(Ok(()))
        }
    }
}

/// The number of the queue named `name`, creating the queue (its registry entry and tables)
/// when `create` and it does not exist. Refusals: `QueueNotFound` (not `create`),
/// `InvalidOption` (a bad name, or `QUEUES_MAX` reached).
pub(crate) fn queue_number(ctx: &mut Ctx<'_>, name: &str, create: bool) -> Result<Result<u32>> {
    if let Err(e) = QueueTables::check_name(name) {
        return Ok(Err(e));
    }
    let mut queues = ctx.tx.open_table(QUEUES)?;
    if let Some(qid) = queues.get(name)?.map(|v| v.value()) {
        if !(1..=crate::QUEUES_MAX).contains(&qid) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {name:?} has number {qid}"
            )));
        }
        return Ok(Ok(qid));
    }
    if !create {
        return Ok(Err(Error::QueueNotFound {
            name: name.to_string(),
        }));
    }
    let count = queues.len()?;
    if count >= u64::from(crate::QUEUES_MAX) {
        return Ok(Err(Error::invalid_option(
            "queue name",
            format!(
                "the file holds QUEUES_MAX ({}) named queues",
                crate::QUEUES_MAX
            ),
        )));
    }
    // Numbers are never reused: one above the highest there is.
    let mut highest = 0;
    for e in queues.iter()? {
        highest = highest.max(e?.1.value());
    }
    let qid = highest + 1;
    if qid > crate::QUEUES_MAX {
        return Ok(Err(Error::invalid_option(
            "queue name",
            format!(
                "queue numbers are used up to QUEUES_MAX ({})",
                crate::QUEUES_MAX
            ),
        )));
    }
    *ctx.dirty = true;
    queues.insert(name, qid)?;
    QueueTables::named(qid).create(ctx.tx)?;
    Ok(Ok(qid))
}

/// Every named queue of the file: (name, number), by name. None in a file of format 3 or
/// older (no registry yet).
pub(crate) fn named_queues(rtx: &ReadTransaction) -> Result<Vec<(String, u32)>> {
    let queues = match rtx.open_table(QUEUES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut out: Vec<(String, u32)> = Vec::new();
    for e in queues.iter()? {
        let (name, qid) = e?;
        let qid = qid.value();
        if !(1..=crate::QUEUES_MAX).contains(&qid) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {:?} has number {qid}",
                name.value()
            )));
        }
        if let Some((other, _)) = out.iter().find(|(_, n)| *n == qid) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: {other:?} and {:?} both have number {qid}",
                name.value()
            )));
        }
        out.push((name.value().to_string(), qid));
    }
    Ok(out)
}

/// `Corrupted` unless every table of registered queue `name` is there (a registry entry
/// whose tables are missing is damage, reported as such rather than as a storage error).
fn named_tables_present(rtx: &ReadTransaction, name: &str, tq: &'static QueueTables) -> Result<()> {
    fn present<K: redb::Key + 'static, V: redb::Value + 'static>(
        rtx: &ReadTransaction,
        name: &str,
        def: redb::TableDefinition<K, V>,
    ) -> Result<()> {
        match rtx.open_table(def) {
            Ok(_) => Ok(()),
            Err(redb::TableError::TableDoesNotExist(t)) => Err(Error::corrupted(format!(
                "queue {name:?} is registered, but its table {t} is missing"
            ))),
            Err(e) => Err(e.into()),
        }
    }
    present(rtx, name, tq.jobs())?;
    present(rtx, name, tq.ready())?;
    present(rtx, name, tq.scheduled())?;
    present(rtx, name, tq.leases())?;
    present(rtx, name, tq.dead())?;
    present(rtx, name, tq.dead_by_time())?;
    present(rtx, name, tq.dedup())?;
    present(rtx, name, tq.dedup_windows())?;
    present(rtx, name, tq.dedup_expiry())?;
    present(rtx, name, tq.applied())?;
    present(rtx, name, tq.applied_by_time())?;
    present(rtx, name, tq.idem_jobs())?;
    present(rtx, name, tq.payloads())
}

/// The number of queue `name`, if it exists (a read).
pub(crate) fn find_queue(rtx: &ReadTransaction, name: &str) -> Result<Option<u32>> {
    Ok(named_queues(rtx)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, qid)| qid))
}

/// What lease recovery at open did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Recovered {
    pub returned: u64,
    pub dead: u64,
    pub quarantined: u64,
}

/// Returns every lease in the file to ready (or dead when out of attempts): run at open, when
/// the file lock proves the process that held them is gone. A leased row that is damaged is
/// quarantined and the rest are recovered.
pub(crate) fn recover_leases(ctx: &mut Ctx<'_>, now_ms: u64) -> Result<Recovered> {
    let named: Vec<u32> = {
        let queues = ctx.tx.open_table(QUEUES)?;
        let mut v = Vec::new();
        for e in queues.iter()? {
            v.push(e?.1.value());
        }
        v
    };
    let mut out = recover_queue_leases(ctx, &crate::schema::DEFAULT_TABLES, now_ms)?;
    for qid in named {
        if !(1..=crate::QUEUES_MAX).contains(&qid) {
            return Err(Error::corrupted(format!(
                "leaseq_queues: queue number {qid}"
            )));
        }
        let r = recover_queue_leases(ctx, QueueTables::named(qid), now_ms)?;
        out.returned += r.returned;
        out.dead += r.dead;
        out.quarantined += r.quarantined;
    }
    Ok(out)
}

/// [`recover_leases`] for one queue.
fn recover_queue_leases(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    now_ms: u64,
) -> Result<Recovered> {
    let mut t = Tables::open(ctx.tx, tq)?;
    let all: Vec<(u64, u64)> = t
        .leases()?
        .iter()?
        .map(|e| e.map(|(k, _)| k.value()))
        .collect::<Result<_, _>>()?;
    let mut out = Recovered::default();
    for entry in all {
        *ctx.dirty = true;
        ctx.wake(t.tq.qid);
        match end_lease_entry(&mut t, ctx, entry, REASON_ABANDONED, None, now_ms)? {
            Ended::Returned => out.returned += 1,
            Ended::Dead => out.dead += 1,
            Ended::Quarantined => out.quarantined += 1,
            Ended::Stray => {}
        }
    }
    Ok(out)
}

/// Reads, over a read snapshot, every lease entry and the job row it names: what lease
/// recovery at open will read, so damage that redb itself reports refuses the file before
/// anything is written. A row that redb reads but that fails leaseq's own checks is not an
/// error here: recovery quarantines it.
pub(crate) fn check_leases(rtx: &ReadTransaction) -> Result<()> {
    let mut all = vec![&crate::schema::DEFAULT_TABLES];
    for (name, qid) in named_queues(rtx)? {
        let tq = QueueTables::named(qid);
        named_tables_present(rtx, &name, tq)?;
        all.push(tq);
    }
    for tq in all {
        let jobs = rtx.open_table(tq.jobs())?;
        for e in rtx.open_table(tq.leases())?.iter()? {
            let (_, id) = e?.0.value();
            jobs.get(id)?;
        }
    }
    Ok(())
}

/// What a dequeue would find, read without a write transaction: whether anything is ready,
/// due or expired now, and the earliest future due time or lease deadline.
pub(crate) fn probe(
    rtx: &ReadTransaction,
    tq: &'static QueueTables,
    now_ms: u64,
) -> Result<(bool, Option<u64>)> {
    let ready = rtx.open_table(tq.ready())?;
    if !ready.is_empty()? {
        return Ok((true, None));
    }
    let first_key = |def| -> Result<Option<u64>> {
        let table = rtx.open_table::<(u64, u64), ()>(def)?;
        let first = table.first()?;
        Ok(first.map(|(k, _)| k.value().0))
    };
    let next_run = first_key(tq.scheduled())?;
    let next_deadline = first_key(tq.leases())?;
    let work = next_run.is_some_and(|t| t <= now_ms) || next_deadline.is_some_and(|t| t <= now_ms);
    let next = [next_run, next_deadline].into_iter().flatten().min();
    Ok((work, next))
}

pub(crate) fn stats(rtx: &ReadTransaction, tq: &'static QueueTables) -> Result<Stats> {
    Ok(Stats {
        total: rtx.open_table(tq.jobs())?.len()?,
        scheduled: rtx.open_table(tq.scheduled())?.len()?,
        ready: rtx.open_table(tq.ready())?.len()?,
        leased: rtx.open_table(tq.leases())?.len()?,
        dead: rtx.open_table(tq.dead())?.len()?,
        applied: rtx.open_table(tq.applied())?.len()?,
        dedup_keys: rtx.open_table(tq.dedup())?.len()?,
        quarantined: match quarantine_table(rtx, tq)? {
            Some(q) => q.len()?,
            None => 0,
        },
    })
}

/// `leaseq_quarantine` in a snapshot, or `None` if nothing was ever quarantined in the file.
fn quarantine_table(
    rtx: &ReadTransaction,
    tq: &'static QueueTables,
) -> Result<Option<ReadOnlyTable<u64, QuarantineValue>>> {
    match rtx.open_table(tq.quarantine()) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Up to `max` quarantined rows, by job id, from `after` (exclusive) on.
pub(crate) fn quarantined(
    rtx: &ReadTransaction,
    tq: &'static QueueTables,
    after: Option<u64>,
    max: usize,
) -> Result<Vec<Quarantined>> {
    let Some(q) = quarantine_table(rtx, tq)? else {
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
    tq: &'static QueueTables,
    id: u64,
) -> Result<Option<Vec<u8>>> {
    let Some(q) = quarantine_table(rtx, tq)? else {
        return Ok(None);
    };
    Ok(q.get(id)?.map(|v| v.value().2.to_vec()))
}

pub(crate) fn job(
    rtx: &ReadTransaction,
    tq: &'static QueueTables,
    id: u64,
) -> Result<Option<JobInfo>> {
    let jobs = rtx.open_table(tq.jobs())?;
    let Some(v) = jobs.get(id)? else {
        return quarantined_error(rtx, tq, id).map(|()| None);
    };
    let rec = JobRecord::decode(v.value()).map_err(|e| damaged(id, &e.to_string()))?;
    Ok(Some(info(id, rec)))
}

/// `Corrupted` if job `id` (not in `leaseq_jobs`) is quarantined.
fn quarantined_error(rtx: &ReadTransaction, tq: &'static QueueTables, id: u64) -> Result<()> {
    if let Some(q) = quarantine_table(rtx, tq)?
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
fn info(id: u64, rec: JobRecord) -> JobInfo {
    let (lease_token, lease_deadline_ms) = match rec.state {
        StoredState::Leased { token, deadline_ms } => (Some(token), Some(deadline_ms)),
        _ => (None, None),
    };
    let payload_bytes = rec.payload_len();
    JobInfo {
        id: JobId(id),
        state: rec.state.public(),
        attempts: rec.attempts,
        max_attempts: rec.max_attempts,
        priority: rec.priority,
        run_at_ms: rec.run_at_ms,
        died_ms: (rec.state == StoredState::Dead).then_some(rec.run_at_ms),
        lease_deadline_ms,
        lease_token,
        created_ms: rec.created_ms,
        last_error: rec.last_error,
        idempotency_key: rec.idempotency_key,
        dedup_key: rec.dedup_key,
        payload_bytes,
        snoozes: rec.snoozes,
        lease_ms: rec.lease_ms,
        // A stored policy was validated when the record was read.
        retry: rec.retry.and_then(|r| r.policy().ok()),
        dedup_window_ms: rec.dedup_window_ms,
        encoding: rec.encoding.and_then(crate::Encoding::from_tag),
    }
}

/// The payload of job `id`, or `None` if no such job.
pub(crate) fn payload(
    rtx: &ReadTransaction,
    tq: &'static QueueTables,
    id: u64,
) -> Result<Option<Vec<u8>>> {
    let jobs = rtx.open_table(tq.jobs())?;
    let Some(v) = jobs.get(id)? else {
        return quarantined_error(rtx, tq, id).map(|()| None);
    };
    let rec = JobRecord::decode(v.value()).map_err(|e| damaged(id, &e.to_string()))?;
    let Some(r) = rec.payload_apart else {
        return Ok(Some(rec.payload));
    };
    let payloads = rtx.open_table(tq.payloads())?;
    let v = payloads
        .get(id)?
        .ok_or_else(|| damaged(id, "payload: stored apart, but its row is missing"))?;
    r.verify(v.value())
        .map_err(|e| damaged(id, &e.to_string()))?;
    Ok(Some(v.value().to_vec()))
}

/// A place in one state's index, as a `(u64, u64, u64)` key: ready `(rank, seq, id)`,
/// scheduled `(run_at_ms, id, 0)`, leased `(deadline_ms, id, 0)`, dead `(id, 0, 0)`.
pub(crate) type IndexKey = (u64, u64, u64);

/// Up to `limit` jobs in `state`, in that state's index order (ready: the order they will be
/// dequeued; scheduled: by due time; leased: by deadline; dead: by id), after `after`. Rows
/// that fail their checks are skipped (`check` reports them). Returns the jobs and, when the
/// page is full, the key of its last entry, to continue from.
pub(crate) fn list(
    rtx: &ReadTransaction,
    tq: &'static QueueTables,
    state: JobState,
    after: Option<IndexKey>,
    limit: usize,
) -> Result<(Vec<JobInfo>, Option<IndexKey>)> {
    let keys: Vec<IndexKey> = match state {
        JobState::Ready => {
            let t = rtx.open_table(tq.ready())?;
            let from = after.map(|(r, s, i)| (r as u32, s, i));
            let it = match from {
                Some(k) => t.range((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded))?,
                None => t.range::<ReadyKey>(..)?,
            };
            it.take(limit)
                .map(|e| {
                    e.map(|(k, _)| {
                        let (r, s, i) = k.value();
                        (u64::from(r), s, i)
                    })
                })
                .collect::<Result<_, _>>()?
        }
        JobState::Scheduled | JobState::Leased => {
            let def = if state == JobState::Scheduled {
                tq.scheduled()
            } else {
                tq.leases()
            };
            let t = rtx.open_table(def)?;
            let it = match after {
                Some((a, b, _)) => t.range((
                    std::ops::Bound::Excluded((a, b)),
                    std::ops::Bound::Unbounded,
                ))?,
                None => t.range::<(u64, u64)>(..)?,
            };
            it.take(limit)
                .map(|e| {
                    e.map(|(k, _)| {
                        let (a, b) = k.value();
                        (a, b, 0)
                    })
                })
                .collect::<Result<_, _>>()?
        }
        JobState::Dead => {
            let t = rtx.open_table(tq.dead())?;
            let it = match after {
                Some((id, _, _)) => {
                    t.range((std::ops::Bound::Excluded(id), std::ops::Bound::Unbounded))?
                }
                None => t.range::<u64>(..)?,
            };
            it.take(limit)
                .map(|e| e.map(|(k, _)| (k.value(), 0, 0)))
                .collect::<Result<_, _>>()?
        }
    };
    let jobs = rtx.open_table(tq.jobs())?;
    let mut out = Vec::with_capacity(keys.len());
    for &key in &keys {
        let id = match state {
            JobState::Ready => key.2,
            JobState::Scheduled | JobState::Leased => key.1,
            JobState::Dead => key.0,
        };
        if let Some(v) = jobs.get(id)?
            && let Ok(rec) = JobRecord::decode(v.value())
            && rec.state.public() == state
        {
            out.push(info(id, rec));
        }
    }
    // A full page may have more after it; a short one reached the end.
    let next = if keys.len() == limit {
        keys.last().copied()
    } else {
        None
    };
    Ok((out, next))
}

/// Acts on up to `max` jobs of `state`, first in its index order: `Purge` deletes them
/// (releasing their dedup keys), `Requeue` moves dead jobs back to ready with their attempts
/// reset. A damaged row met on the way is quarantined, an entry naming no job dropped.
/// Returns how many jobs were purged or requeued, and whether entries are left.
pub(crate) fn sweep_state(
    ctx: &mut Ctx<'_>,
    tq: &'static QueueTables,
    state: JobState,
    action: StateAction,
    now_ms: u64,
    max: usize,
) -> Result<(u64, bool)> {
    debug_assert!(state != JobState::Leased);
    debug_assert!(action == StateAction::Purge || state == JobState::Dead);
    let mut t = Tables::open(ctx.tx, tq)?;
    // (job id, its index key) of the first `max + 1` entries (one more tells if more are left).
    let ids: Vec<(u64, IndexKey)> = match state {
        JobState::Ready => t
            .ready()?
            .iter()?
            .take(max + 1)
            .map(|e| {
                e.map(|(k, _)| {
                    let (r, s, i) = k.value();
                    (i, (u64::from(r), s, i))
                })
            })
            .collect::<Result<_, _>>()?,
        JobState::Scheduled => t
            .scheduled()?
            .iter()?
            .take(max + 1)
            .map(|e| e.map(|(k, _)| (k.value().1, (k.value().0, k.value().1, 0))))
            .collect::<Result<_, _>>()?,
        JobState::Dead => t
            .dead()?
            .iter()?
            .take(max + 1)
            .map(|e| e.map(|(k, _)| (k.value(), (k.value(), 0, 0))))
            .collect::<Result<_, _>>()?,
        JobState::Leased => return Ok((0, false)),
    };
    let more = ids.len() > max;
    let mut done = 0;
    for &(id, key) in ids.iter().take(max) {
        *ctx.dirty = true;
        match t.row(id)? {
            Row::Good(mut rec) if rec.state.public() == state => match action {
                StateAction::Purge => {
                    t.delete(id, &rec, now_ms)?;
                    done += 1;
                }
                StateAction::Requeue => {
                    ctx.wake(t.tq.qid);
                    t.unindex(id, &rec)?;
                    rec.attempts = 0;
                    rec.run_at_ms = now_ms;
                    rec.seq = ctx.alloc_seq();
                    rec.state = StoredState::Ready;
                    t.put(id, &rec)?;
                    done += 1;
                }
            },
            row => {
                // The entry does not match its row: drop it, then settle the row.
                match state {
                    JobState::Ready => {
                        t.ready()?.remove((key.0 as u32, key.1, key.2))?;
                    }
                    JobState::Scheduled => {
                        t.scheduled()?.remove((key.0, key.1))?;
                    }
                    _ => {
                        t.dead()?.remove(id)?;
                        t.dead_by_time()?.retain(|(_, j), ()| j != id)?;
                    }
                }
                t.settle_stray(ctx, id, row, now_ms)?;
            }
        }
    }
    Ok((done, more))
}

/// What [`sweep_state`] does to each job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateAction {
    Purge,
    Requeue,
}

/// Whether the applied-ids marker for this idempotency key exists.
pub(crate) fn is_applied(
    rtx: &ReadTransaction,
    tq: &'static QueueTables,
    key: &[u8],
) -> Result<bool> {
    Ok(rtx
        .open_table(tq.applied())?
        .get(applied_key(Some(key), 0).as_slice())?
        .is_some())
}

/// Checks that `table` (key → time) and its time index (time, key) agree both ways, reporting
/// what disagrees through `v`.
fn check_time_index(
    table: &ReadOnlyTable<&'static [u8], u64>,
    index: &ReadOnlyTable<(u64, &'static [u8]), ()>,
    what: &str,
    v: &mut dyn FnMut(Option<u64>, String),
) -> Result<()> {
    for e in table.iter()? {
        let (k, at) = e?;
        if index.get((at.value(), k.value()))?.is_none() {
            v(
                None,
                format!("{what} at {} missing from its time index", at.value()),
            );
        }
    }
    for e in index.iter()? {
        let entry = e?.0;
        let (at, k) = entry.value();
        if table.get(k)?.map(|g| g.value()) != Some(at) {
            v(
                None,
                format!("{what} time index entry at {at} without its entry"),
            );
        }
    }
    Ok(())
}

/// One broken invariant found by [`Queue::check`](crate::Queue::check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The job concerned, when there is one.
    pub job_id: Option<JobId>,
    /// What is wrong.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.job_id {
            Some(id) => write!(f, "job {id}: {}", self.detail),
            None => f.write_str(&self.detail),
        }
    }
}

/// [`check`] over every queue of the file: the default queue, then each named one (its
/// violations' details prefixed with the queue's name).
pub(crate) fn check_file(db: &redb::Database) -> Result<Vec<Violation>> {
    let mut out = check(db, &crate::schema::DEFAULT_TABLES)?;
    let rtx = db.begin_read()?;
    let named = named_queues(&rtx)?;
    // Reverse: every queue's tables belong to a registered queue.
    for table in rtx.list_tables()? {
        let name = table.name().to_string();
        if let Some(qid) = QueueTables::number_in(&name)
            && !named.iter().any(|(_, n)| *n == qid)
            && out.len() < VIOLATIONS_MAX
        {
            out.push(Violation {
                job_id: None,
                detail: format!("table {name} of queue number {qid}, which is not registered"),
            });
        }
    }
    for (name, qid) in &named {
        named_tables_present(&rtx, name, QueueTables::named(*qid))?;
    }
    drop(rtx);
    for (name, qid) in named {
        for mut v in check(db, QueueTables::named(qid))? {
            if out.len() >= VIOLATIONS_MAX {
                return Ok(out);
            }
            v.detail = format!("queue {name:?}: {}", v.detail);
            out.push(v);
        }
    }
    Ok(out)
}

/// Whether job `id` has a good record whose payload is stored apart.
fn state_of_apart(jobs: &ReadOnlyTable<u64, &'static [u8]>, id: u64) -> Result<bool> {
    Ok(jobs
        .get(id)?
        .is_some_and(|g| JobRecord::decode(g.value()).is_ok_and(|r| r.payload_apart.is_some())))
}

/// Checks the invariants listed in ARCHITECTURE.md over a read snapshot of one queue: each
/// job decodes and is in exactly one state; each state's index and the jobs table agree both
/// ways; dedup entries point at the job that holds the key; counters are ahead of every id and
/// token. Memory stays bounded: reverse checks look each index entry up instead of collecting
/// ids.
pub(crate) fn check(db: &redb::Database, tq: &'static QueueTables) -> Result<Vec<Violation>> {
    let rtx = db.begin_read()?;
    let mut out = Vec::new();
    let mut v = |job: Option<u64>, detail: String| {
        if out.len() < VIOLATIONS_MAX {
            out.push(Violation {
                job_id: job.map(JobId),
                detail,
            });
        }
    };
    let meta = rtx.open_table(META)?;
    let get = |k: &str| -> Result<Option<u64>> { Ok(meta.get(k)?.map(|g| g.value())) };
    if get(META_FORMAT_VERSION)? != Some(FORMAT_VERSION) {
        v(
            None,
            format!("format version is {:?}", get(META_FORMAT_VERSION)?),
        );
    }
    let next_id = get(META_NEXT_ID)?.unwrap_or(0);
    let next_token = get(META_NEXT_TOKEN)?.unwrap_or(0);
    if next_id == 0 || next_token == 0 {
        v(None, "counters missing from leaseq_meta".into());
    }
    let jobs = rtx.open_table(tq.jobs())?;
    let ready = rtx.open_table(tq.ready())?;
    let scheduled = rtx.open_table(tq.scheduled())?;
    let leases = rtx.open_table(tq.leases())?;
    let dead = rtx.open_table(tq.dead())?;
    let dedup = rtx.open_table(tq.dedup())?;
    let applied = rtx.open_table(tq.applied())?;
    let by_time = rtx.open_table(tq.applied_by_time())?;
    let idem = rtx.open_table(tq.idem_jobs())?;
    let dead_by_time = rtx.open_table(tq.dead_by_time())?;
    let windows = rtx.open_table(tq.dedup_windows())?;
    let expiry = rtx.open_table(tq.dedup_expiry())?;
    let payloads = rtx.open_table(tq.payloads())?;
    let mut counts = [0u64; 4];
    for entry in jobs.iter()? {
        let (k, val) = entry?;
        let id = k.value();
        if id == 0 || id >= next_id {
            v(Some(id), format!("id not below next_id {next_id}"));
        }
        let rec = match JobRecord::decode(val.value()) {
            Ok(r) => r,
            Err(e) => {
                v(Some(id), format!("record does not decode: {e}"));
                continue;
            }
        };
        match &rec.payload_apart {
            None if rec.payload.len() > PAYLOAD_INLINE_MAX => {
                v(
                    Some(id),
                    "a payload above the inline limit is inline".into(),
                );
            }
            None => {}
            Some(r) => match payloads.get(id)? {
                None => v(
                    Some(id),
                    "payload stored apart, but its row is missing".into(),
                ),
                Some(p) => {
                    if let Err(e) = r.verify(p.value()) {
                        v(Some(id), e.to_string());
                    }
                }
            },
        }
        let indexed = match rec.state {
            StoredState::Ready => {
                counts[0] += 1;
                ready
                    .get((priority_rank(rec.priority), rec.seq, id))?
                    .is_some()
            }
            StoredState::Scheduled => {
                counts[1] += 1;
                scheduled.get((rec.run_at_ms, id))?.is_some()
            }
            StoredState::Leased { token, deadline_ms } => {
                counts[2] += 1;
                if token == 0 || token >= next_token {
                    v(
                        Some(id),
                        format!("token {token} not below next_token {next_token}"),
                    );
                }
                leases.get((deadline_ms, id))?.is_some()
            }
            StoredState::Dead => {
                counts[3] += 1;
                dead.get(id)?.is_some() && dead_by_time.get((rec.run_at_ms, id))?.is_some()
            }
        };
        if !indexed {
            v(
                Some(id),
                format!("{:?} but missing from its index", rec.state.public()),
            );
        }
        if let Some(k) = rec.idempotency_key.as_deref()
            && idem
                .get((applied_key(Some(k), id).as_slice(), id))?
                .is_none()
        {
            v(
                Some(id),
                "carries an idempotency key leaseq_idem_jobs does not list".into(),
            );
        }
        // A key held by a window may have been released (window ended) or taken over.
        if let Some(key) = &rec.dedup_key
            && rec.dedup_window_ms.is_none()
            && dedup.get(key.as_slice())?.map(|g| g.value()) != Some(id)
        {
            v(
                Some(id),
                "holds a dedup key the dedup table does not map to it".into(),
            );
        }
    }
    let lens = [ready.len()?, scheduled.len()?, leases.len()?, dead.len()?];
    for ((name, count), len) in ["ready", "scheduled", "leases", "dead"]
        .iter()
        .zip(counts)
        .zip(lens)
    {
        if count != len {
            v(
                None,
                format!("{count} jobs are {name} but its index has {len} entries"),
            );
        }
    }
    // Every payload row belongs to a job stored apart (or a quarantined one: its row stays
    // until `remove`); a scan, since a missing row and a stray one would leave the counts
    // equal.
    let quarantine = quarantine_table(&rtx, tq)?;
    for e in payloads.iter()? {
        let id = e?.0.value();
        let owned = state_of_apart(&jobs, id)?
            || match &quarantine {
                Some(q) => q.get(id)?.is_some(),
                None => false,
            };
        if !owned {
            v(Some(id), "payload row of no job".into());
        }
    }
    // Reverse direction: every index entry names a job in the matching state and place.
    let state_of = |id: u64| -> Result<Option<JobRecord>> {
        match jobs.get(id)? {
            Some(g) => Ok(JobRecord::decode(g.value()).ok()),
            None => Ok(None),
        }
    };
    for e in ready.iter()? {
        let (rank, seq, id) = e?.0.value();
        let ok = state_of(id)?.is_some_and(|r| {
            r.state == StoredState::Ready && priority_rank(r.priority) == rank && r.seq == seq
        });
        if !ok {
            v(Some(id), "ready entry without a matching ready job".into());
        }
    }
    for e in scheduled.iter()? {
        let (run_at, id) = e?.0.value();
        let ok = state_of(id)?
            .is_some_and(|r| r.state == StoredState::Scheduled && r.run_at_ms == run_at);
        if !ok {
            v(
                Some(id),
                "scheduled entry without a matching scheduled job".into(),
            );
        }
    }
    for e in leases.iter()? {
        let (deadline, id) = e?.0.value();
        let ok = state_of(id)?.is_some_and(
            |r| matches!(r.state, StoredState::Leased { deadline_ms, .. } if deadline_ms == deadline),
        );
        if !ok {
            v(Some(id), "lease entry without a matching leased job".into());
        }
    }
    for e in dead.iter()? {
        let id = e?.0.value();
        if !state_of(id)?.is_some_and(|r| r.state == StoredState::Dead) {
            v(Some(id), "dead entry without a dead job".into());
        }
    }
    // Applied markers: only caller keys, each in the time index under its kept_since_ms, and
    // the time index names only markers.
    for e in applied.iter()? {
        if e?.0.value().first() != Some(&1) {
            v(None, "an applied marker that is not a caller key's".into());
        }
    }
    check_time_index(&applied, &by_time, "applied marker", &mut v)?;
    let quarantine = quarantine_table(&rtx, tq)?;
    // Each carrier entry names a live (or quarantined) job that carries that key.
    for e in idem.iter()? {
        let entry = e?.0;
        let (k, id) = entry.value();
        let carried = match state_of(id)? {
            Some(r) => r
                .idempotency_key
                .as_deref()
                .is_some_and(|ik| applied_key(Some(ik), id) == k),
            None => match &quarantine {
                Some(q) => q.get(id)?.is_some(),
                None => false,
            },
        };
        if !carried {
            v(
                Some(id),
                "leaseq_idem_jobs names a job that does not carry the key".into(),
            );
        }
    }
    if let Some(q) = &quarantine {
        for e in q.iter()? {
            let (k, row) = e?;
            let id = k.value();
            v(Some(id), format!("quarantined: {}", row.value().1));
            if jobs.get(id)?.is_some() {
                v(Some(id), "both quarantined and in leaseq_jobs".into());
            }
        }
    }
    if dead_by_time.len()? != dead.len()? {
        v(
            None,
            format!(
                "leaseq_dead_by_time has {} entries, leaseq_dead {}",
                dead_by_time.len()?,
                dead.len()?
            ),
        );
    }
    check_time_index(&windows, &expiry, "dedup window", &mut v)?;
    for e in windows.iter()? {
        let k = e?.0;
        if dedup.get(k.value())?.is_none() {
            v(None, "a dedup window without a holder".into());
        }
    }
    for e in dedup.iter()? {
        let (k, owner) = e?;
        let owner = owner.value();
        // A quarantined job keeps its key until it is removed (reported above); a window
        // holds its key whatever became of the job that took it.
        let held = windows.get(k.value())?.is_some()
            || match &quarantine {
                Some(q) => q.get(owner)?.is_some(),
                None => false,
            };
        let ok =
            held || state_of(owner)?.is_some_and(|r| r.dedup_key.as_deref() == Some(k.value()));
        if !ok {
            v(
                Some(owner),
                "dedup entry names a job that does not hold the key".into(),
            );
        }
    }
    Ok(out)
}
