//! The floor: the fewest raw redb write transactions that do a durable queue's logical work,
//! with no leaseq code, written as a competent redb user would. It answers "what does leaseq
//! cost on top of redb itself?", where the SQLite side answers "against the usual choice".
//!
//! - The same redb as leaseq (the `redb` crate leaseq depends on and re-exports; one version in
//!   `Cargo.lock`), the same cache size as leaseq's default (64 MiB), redb's defaults otherwise.
//! - Every call is one write transaction with [`Durability::Immediate`] (redb's default, set
//!   explicitly), committed (fsynced) before it returns: the same durability as both other
//!   sides.
//! - Tables, nothing more:
//!
//!   | table | key | value |
//!   |---|---|---|
//!   | `floor_jobs` | job id | `[state u8, token u64, deadline_ms u64, attempts u32, priority i32]` little-endian, then the payload |
//!   | `floor_ready` | (priority rank, job id) | () |
//!   | `floor_leases` | (deadline_ms, job id) | () |
//!   | `effects` | job id | a copy of the payload (the effect row; the leaseq side writes the same) |
//!   | `floor_meta` | `"id_end"` | the end of the reserved block of job ids |
//!
//! - One call, the rows it writes:
//!   - enqueue: insert the job row, insert its ready entry; once every [`ID_BLOCK`] ids, one
//!     `floor_meta` row (ids are handed out from a block reserved durably ahead, as leaseq does
//!     with its own counters; unused ids of a block are skipped after a reopen, none is
//!     reused);
//!   - dequeue: pop the first ready entry (a batch: read the first `max` entries, remove them
//!     in one pass), rewrite the job row in place (`get_mut`: state, token, deadline,
//!     attempts + 1), insert the lease entry;
//!   - ack with effect: remove the job row (the removed row is the lease check: state leased
//!     and the same token, else the transaction is aborted and nothing is written), remove its
//!     lease entry, insert the effect row (which must be new). A batch removes dense runs of
//!     job rows and lease entries in one pass (`retain_in`), as leaseq does.
//!   - ack and dequeue next: both in one transaction.
//!   - extend: rewrite the job row in place (the lease check as the ack's: state leased and
//!     the same token, else abort; the new deadline), move its lease entry.
//!   - ack (no effect): as the ack with effect, without the effect row.
//! - "Applied" is recorded by the effect row itself, keyed by the job id, committed with the
//!   job's deletion, and ids are never reused: a second effect for the same job would find its
//!   row (checked on every insert). A separate `applied` table would be one more row per ack
//!   that leaseq does not write either (it writes a marker only for a caller's idempotency key).
//! - Lease tokens are random 64-bit numbers (as on the SQLite side), one per dequeue call.
//!   Priorities as leaseq's: lower values are served first, then by id.
//! - No group commit: every call is its own redb transaction and fsync; all threads share one
//!   [`Database`] and redb serializes the writers (`begin_write` waits for the previous one).
//!   Sharing one commit between concurrent calls is leaseq's own contribution, so in the
//!   concurrent groups `leaseq / redb_floor` measures what group commit buys, and in the
//!   single-thread groups what leaseq's extra work costs.
//! - What a real queue also does and this floor does not (the SQLite side does not either):
//!   returning expired leases at dequeue, scheduled jobs, dedup keys, attempt limits and dead
//!   jobs, checks of damaged rows.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table,
    TableDefinition, TableHandle, WriteTransaction,
};

use crate::common::{self, QueueUnderTest};

/// Database file name inside the benchmark's directory.
const FILE_NAME: &str = "floor.redb";

/// How long a lease lasts.
const LEASE_MS: u64 = 30_000;

/// Job ids reserved in `floor_meta` at a time.
const ID_BLOCK: u64 = 1024;

/// redb page cache, as leaseq's default `Builder::cache_bytes`.
const CACHE_BYTES: usize = 64 << 20;

const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("floor_jobs");
const READY: TableDefinition<(u32, u64), ()> = TableDefinition::new("floor_ready");
const LEASES: TableDefinition<(u64, u64), ()> = TableDefinition::new("floor_leases");
/// The effect row: job id -> a copy of its payload (as the leaseq side's `effects` table).
const EFFECTS: TableDefinition<u64, &[u8]> = TableDefinition::new("effects");
const META: TableDefinition<&str, u64> = TableDefinition::new("floor_meta");
const META_ID_END: &str = "id_end";

const STATE_READY: u8 = 0;
const STATE_LEASED: u8 = 1;

/// Bytes of a job row before its payload.
const HEADER: usize = 1 + 8 + 8 + 4 + 4;

/// A job row, decoded (the payload borrowed from the row).
#[derive(Debug, Clone, Copy)]
struct Record<'a> {
    state: u8,
    token: u64,
    deadline_ms: u64,
    attempts: u32,
    priority: i32,
    payload: &'a [u8],
}

impl<'a> Record<'a> {
    fn decode(row: &'a [u8]) -> Record<'a> {
        assert!(row.len() >= HEADER, "job row of {} bytes", row.len());
        let field = |at: usize, len: usize| &row[at..at + len];
        Record {
            state: row[0],
            token: u64::from_le_bytes(field(1, 8).try_into().expect("8 bytes")),
            deadline_ms: u64::from_le_bytes(field(9, 8).try_into().expect("8 bytes")),
            attempts: u32::from_le_bytes(field(17, 4).try_into().expect("4 bytes")),
            priority: i32::from_le_bytes(field(21, 4).try_into().expect("4 bytes")),
            payload: &row[HEADER..],
        }
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.clear();
        out.push(self.state);
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.deadline_ms.to_le_bytes());
        out.extend_from_slice(&self.attempts.to_le_bytes());
        out.extend_from_slice(&self.priority.to_le_bytes());
        out.extend_from_slice(self.payload);
    }
}

/// Ready-index rank of a priority: order-preserving from `i32` onto `u32` (lower first).
fn priority_rank(priority: i32) -> u32 {
    (i64::from(priority) - i64::from(i32::MIN)) as u32
}

fn now_ms() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970");
    u64::try_from(since_epoch.as_millis()).expect("clock overflow")
}

fn new_token() -> u64 {
    fastrand::u64(1..)
}

/// Whether `n` sorted keys spanning `lo..=hi` are dense enough to remove in one pass over
/// the range instead of one by one (the same rule as leaseq's).
fn dense(lo: u64, hi: u64, n: usize) -> bool {
    n >= 2 && hi - lo < 2 * n as u64
}

/// A leased job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloorJob {
    pub id: u64,
    pub token: u64,
    pub attempts: u32,
    pub payload: Vec<u8>,
}

/// A lease that is not current (wrong token, not leased, or gone): the transaction is
/// aborted, nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale;

/// The next job id and the end of the durably reserved block.
#[derive(Debug, Clone, Copy)]
struct IdBlock {
    next: u64,
    end: u64,
}

impl IdBlock {
    fn take(&mut self, tx: &WriteTransaction) -> Result<u64, redb::Error> {
        if self.next == self.end {
            self.end += ID_BLOCK;
            tx.open_table(META)?.insert(META_ID_END, self.end)?;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }
}

/// The floor queue; share it between threads by reference.
pub struct FloorQueue {
    db: Database,
    /// Only touched inside a write transaction (redb admits one at a time, so it is never
    /// contended); held until the commit, so it moves with the committed `floor_meta` row.
    ids: Mutex<IdBlock>,
}

impl FloorQueue {
    /// Opens (creating if needed) the queue database at `path`.
    pub fn open(path: &Path) -> Result<Self, redb::Error> {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)?;
        let tx = db.begin_write()?;
        tx.open_table(JOBS)?;
        tx.open_table(READY)?;
        tx.open_table(LEASES)?;
        tx.open_table(EFFECTS)?;
        let id_end = {
            let mut meta = tx.open_table(META)?;
            let stored = meta.get(META_ID_END)?.map(|v| v.value());
            match stored {
                Some(end) => end,
                None => {
                    meta.insert(META_ID_END, 1)?;
                    1
                }
            }
        };
        tx.commit()?;
        Ok(Self {
            db,
            ids: Mutex::new(IdBlock {
                next: id_end,
                end: id_end,
            }),
        })
    }

    /// Runs `f` in one write transaction, committed with `Durability::Immediate` if it returns
    /// `Ok(Ok(_))`, aborted if it returns `Ok(Err(Stale))` or an error.
    fn write<T>(
        &self,
        f: impl FnOnce(&WriteTransaction, &mut IdBlock) -> Result<Result<T, Stale>, redb::Error>,
    ) -> Result<Result<T, Stale>, redb::Error> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        let mut block = *ids;
        match f(&tx, &mut block)? {
            Ok(value) => {
                tx.commit()?;
                *ids = block;
                Ok(Ok(value))
            }
            Err(Stale) => {
                tx.abort()?;
                Ok(Err(Stale))
            }
        }
    }

    /// Enqueues one job with `priority`; returns its id.
    pub fn try_enqueue(&self, payload: &[u8], priority: i32) -> Result<u64, redb::Error> {
        let id = self.write(|tx, ids| {
            let id = ids.take(tx)?;
            let mut row = Vec::with_capacity(HEADER + payload.len());
            insert_ready(
                &mut tx.open_table(JOBS)?,
                &mut tx.open_table(READY)?,
                id,
                priority,
                payload,
                &mut row,
            )?;
            Ok(Ok(id))
        })?;
        Ok(id.expect("an enqueue is never stale"))
    }

    /// Enqueues all `payloads` (priority 0) in one transaction; returns their ids.
    pub fn try_enqueue_batch(&self, payloads: &[Vec<u8>]) -> Result<Vec<u64>, redb::Error> {
        let ids = self.write(|tx, ids| {
            let mut jobs = tx.open_table(JOBS)?;
            let mut ready = tx.open_table(READY)?;
            let mut row = Vec::new();
            let mut out = Vec::with_capacity(payloads.len());
            for payload in payloads {
                let id = ids.take(tx)?;
                insert_ready(&mut jobs, &mut ready, id, 0, payload, &mut row)?;
                out.push(id);
            }
            Ok(Ok(out))
        })?;
        Ok(ids.expect("an enqueue is never stale"))
    }

    /// Leases the first ready job, if any.
    pub fn try_dequeue(&self) -> Result<Option<FloorJob>, redb::Error> {
        let job = self.write(|tx, _| lease(tx, 1).map(|mut jobs| Ok(jobs.pop())))?;
        Ok(job.expect("a dequeue is never stale"))
    }

    /// Leases up to `max` ready jobs in one transaction (one token for the batch), in queue
    /// order.
    pub fn try_dequeue_batch(&self, max: usize) -> Result<Vec<FloorJob>, redb::Error> {
        let jobs = self.write(|tx, _| lease(tx, max).map(Ok))?;
        Ok(jobs.expect("a dequeue is never stale"))
    }

    /// Moves the lease of `job` to `LEASE_MS` from now; `Err(Stale)` (and nothing written) if
    /// its lease is stale.
    pub fn try_extend(&self, job: &FloorJob) -> Result<Result<(), Stale>, redb::Error> {
        self.write(|tx, _| extend(tx, job))
    }

    /// Acks `job` without an effect; `Err(Stale)` (and nothing written) if its lease is stale.
    pub fn try_ack(&self, job: &FloorJob) -> Result<Result<(), Stale>, redb::Error> {
        self.write(|tx, _| ack(tx, std::slice::from_ref(job), Effects::None))
    }

    /// Acks `job` with its effect; `Err(Stale)` (and nothing written) if its lease is stale.
    pub fn try_ack_with_effect(&self, job: &FloorJob) -> Result<Result<(), Stale>, redb::Error> {
        self.write(|tx, _| ack(tx, std::slice::from_ref(job), Effects::Write))
    }

    /// Acks all `jobs` with their effects in one transaction; `Err(Stale)` (and nothing
    /// written) if any of their leases is stale.
    pub fn try_ack_batch_with_effect(
        &self,
        jobs: &[FloorJob],
    ) -> Result<Result<(), Stale>, redb::Error> {
        self.write(|tx, _| ack(tx, jobs, Effects::Write))
    }

    /// Acks `job` with its effect and leases the next ready job, in one transaction;
    /// `Err(Stale)` (nothing written, nothing leased) if the lease of `job` is stale.
    pub fn try_ack_and_dequeue_next(
        &self,
        job: &FloorJob,
    ) -> Result<Result<Option<FloorJob>, Stale>, redb::Error> {
        self.write(|tx, _| {
            if ack(tx, std::slice::from_ref(job), Effects::Write)?.is_err() {
                return Ok(Err(Stale));
            }
            Ok(Ok(lease(tx, 1)?.pop()))
        })
    }

    /// Rows of `table` (for checks only).
    fn count(&self, table: impl TableHandle) -> u64 {
        let tx = self.db.begin_read().expect("begin_read");
        let name = table.name().to_owned();
        tx.open_untyped_table(table)
            .and_then(|t| t.len().map_err(Into::into))
            .unwrap_or_else(|e| panic!("count {name}: {e}"))
    }

    /// The lease entries, (deadline, job id), and the deadline in each one's job row (for
    /// checks only).
    fn leases(&self) -> Vec<((u64, u64), u64)> {
        let tx = self.db.begin_read().expect("begin_read");
        let (leases, jobs) = (tx.open_table(LEASES), tx.open_table(JOBS));
        let (leases, jobs) = (leases.expect("leases"), jobs.expect("jobs"));
        leases
            .iter()
            .expect("iter")
            .map(|e| {
                let key = e.expect("lease entry").0.value();
                let row = jobs.get(key.1).expect("get").expect("a leased job's row");
                (key, Record::decode(row.value()).deadline_ms)
            })
            .collect()
    }

    /// The effect rows (for checks only).
    fn effects(&self) -> Vec<(u64, Vec<u8>)> {
        let tx = self.db.begin_read().expect("begin_read");
        let table = tx.open_table(EFFECTS).expect("effects");
        table
            .iter()
            .expect("iter")
            .map(|e| {
                let (k, v) = e.expect("effect row");
                (k.value(), v.value().to_vec())
            })
            .collect()
    }
}

/// Inserts a ready job row and its ready entry.
fn insert_ready(
    jobs: &mut Table<'_, u64, &'static [u8]>,
    ready: &mut Table<'_, (u32, u64), ()>,
    id: u64,
    priority: i32,
    payload: &[u8],
    row: &mut Vec<u8>,
) -> Result<(), redb::Error> {
    Record {
        state: STATE_READY,
        token: 0,
        deadline_ms: 0,
        attempts: 0,
        priority,
        payload,
    }
    .encode_into(row);
    let replaced = jobs.insert(id, row.as_slice())?.is_some();
    assert!(!replaced, "job id {id} reused");
    ready.insert((priority_rank(priority), id), ())?;
    Ok(())
}

/// Within `tx`: leases up to `max` first ready jobs (one token), in queue order.
fn lease(tx: &WriteTransaction, max: usize) -> Result<Vec<FloorJob>, redb::Error> {
    let firsts: Vec<(u32, u64)> = {
        let mut ready = tx.open_table(READY)?;
        if max == 1 {
            let first = ready.pop_first()?.map(|(k, _)| k.value());
            first.into_iter().collect()
        } else {
            let firsts: Vec<(u32, u64)> = ready
                .iter()?
                .take(max)
                .map(|e| e.map(|(k, _)| k.value()))
                .collect::<Result<_, _>>()?;
            if let Some(&last) = firsts.last() {
                // They are the first entries: everything up to the last goes, in one pass.
                let mut removed = 0;
                ready.retain_in(..=last, |_, ()| {
                    removed += 1;
                    false
                })?;
                assert_eq!(removed, firsts.len(), "floor_ready changed under a dequeue");
            }
            firsts
        }
    };
    if firsts.is_empty() {
        return Ok(Vec::new());
    }
    let token = new_token();
    let deadline_ms = now_ms() + LEASE_MS;
    let mut jobs = tx.open_table(JOBS)?;
    let mut leases = tx.open_table(LEASES)?;
    let mut row = Vec::new();
    let mut out = Vec::with_capacity(firsts.len());
    for (rank, id) in firsts {
        let mut guard = jobs
            .get_mut(id)?
            .unwrap_or_else(|| panic!("ready entry of job {id} without a row"));
        let rec = Record::decode(guard.value());
        assert!(
            rec.state == STATE_READY && priority_rank(rec.priority) == rank,
            "ready entry of job {id} does not match its row"
        );
        let job = FloorJob {
            id,
            token,
            attempts: rec.attempts + 1,
            payload: rec.payload.to_vec(),
        };
        Record {
            state: STATE_LEASED,
            token,
            deadline_ms,
            attempts: job.attempts,
            ..rec
        }
        .encode_into(&mut row);
        guard.insert(row.as_slice())?;
        drop(guard);
        leases.insert((deadline_ms, id), ())?;
        out.push(job);
    }
    Ok(out)
}

/// Within `tx`: moves the lease of `job` to `LEASE_MS` from now (its row's deadline rewritten
/// in place, its lease entry moved). `Err(Stale)` if the lease is not current; the caller then
/// aborts `tx`.
fn extend(tx: &WriteTransaction, job: &FloorJob) -> Result<Result<(), Stale>, redb::Error> {
    let deadline_ms = now_ms() + LEASE_MS;
    let old_deadline_ms = {
        let mut jobs = tx.open_table(JOBS)?;
        let Some(mut guard) = jobs.get_mut(job.id)? else {
            return Ok(Err(Stale));
        };
        let rec = Record::decode(guard.value());
        if rec.state != STATE_LEASED || rec.token != job.token {
            return Ok(Err(Stale));
        }
        let old = rec.deadline_ms;
        let mut row = Vec::with_capacity(HEADER + rec.payload.len());
        Record { deadline_ms, ..rec }.encode_into(&mut row);
        guard.insert(row.as_slice())?;
        old
    };
    let mut leases = tx.open_table(LEASES)?;
    let removed = leases.remove((old_deadline_ms, job.id))?.is_some();
    assert!(removed, "lease entry of job {} missing", job.id);
    leases.insert((deadline_ms, job.id), ())?;
    Ok(Ok(()))
}

/// Whether an ack writes the jobs' effect rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effects {
    Write,
    None,
}

/// Within `tx`: acks `jobs` (remove the rows, their lease entries) and, with
/// `Effects::Write`, inserts their effect rows. `Err(Stale)` if any lease is not current; the
/// caller then aborts `tx`.
fn ack(
    tx: &WriteTransaction,
    jobs: &[FloorJob],
    effects: Effects,
) -> Result<Result<(), Stale>, redb::Error> {
    if jobs.is_empty() {
        return Ok(Ok(()));
    }
    // (deadline, id) of every acked job, from its removed row.
    let mut leased: Vec<(u64, u64)> = Vec::with_capacity(jobs.len());
    {
        let mut rows = tx.open_table(JOBS)?;
        let current = |row: &[u8], token: u64| {
            let rec = Record::decode(row);
            (rec.state == STATE_LEASED && rec.token == token).then_some(rec.deadline_ms)
        };
        let mut wanted: Vec<(u64, u64)> = jobs.iter().map(|j| (j.id, j.token)).collect();
        wanted.sort_unstable();
        let (lo, hi) = (wanted[0].0, wanted[wanted.len() - 1].0);
        if dense(lo, hi, wanted.len()) {
            let mut stale = false;
            rows.retain_in(lo..=hi, |id, row| {
                let Ok(i) = wanted.binary_search_by_key(&id, |&(id, _)| id) else {
                    return true;
                };
                match current(row, wanted[i].1) {
                    Some(deadline) => {
                        leased.push((deadline, id));
                        false
                    }
                    None => {
                        stale = true;
                        true
                    }
                }
            })?;
            if stale {
                return Ok(Err(Stale));
            }
        } else {
            for &(id, token) in &wanted {
                let Some(row) = rows.remove(id)? else {
                    return Ok(Err(Stale));
                };
                match current(row.value(), token) {
                    Some(deadline) => leased.push((deadline, id)),
                    None => return Ok(Err(Stale)),
                }
            }
        }
        // A job gone (or listed twice) leaves fewer rows than jobs.
        if leased.len() != jobs.len() {
            return Ok(Err(Stale));
        }
    }
    let mut leases = tx.open_table(LEASES)?;
    leased.sort_unstable();
    let (first, last) = (leased[0], leased[leased.len() - 1]);
    if first.0 == last.0 && dense(first.1, last.1, leased.len()) {
        let mut removed = 0;
        leases.retain_in(first..=last, |key, ()| {
            let gone = leased.binary_search(&key).is_ok();
            removed += usize::from(gone);
            !gone
        })?;
        assert_eq!(removed, leased.len(), "lease entries missing");
    } else {
        for &key in &leased {
            let removed = leases.remove(key)?.is_some();
            assert!(removed, "lease entry {key:?} missing");
        }
    }
    if effects == Effects::None {
        return Ok(Ok(()));
    }
    let mut effects = tx.open_table(EFFECTS)?;
    for job in jobs {
        let again = effects.insert(job.id, job.payload.as_slice())?.is_some();
        assert!(!again, "the effect of job {} applied twice", job.id);
    }
    Ok(Ok(()))
}

impl QueueUnderTest for FloorQueue {
    const NAME: &'static str = "redb_floor";
    type Job = FloorJob;

    fn open(dir: &Path) -> Self {
        FloorQueue::open(&dir.join(FILE_NAME)).expect("open redb floor")
    }

    fn enqueue(&self, payload: &[u8]) {
        self.try_enqueue(payload, 0).expect("enqueue");
    }

    fn enqueue_batch(&self, payloads: &[Vec<u8>]) {
        self.try_enqueue_batch(payloads).expect("enqueue batch");
    }

    fn dequeue(&self) -> Option<FloorJob> {
        self.try_dequeue().expect("dequeue")
    }

    fn dequeue_batch(&self, max: usize) -> Vec<FloorJob> {
        self.try_dequeue_batch(max).expect("dequeue batch")
    }

    fn extend(&self, job: &FloorJob) {
        self.try_extend(job)
            .expect("extend")
            .unwrap_or_else(|Stale| panic!("stale lease on job {}", job.id));
    }

    fn ack(&self, job: FloorJob) {
        self.try_ack(&job)
            .expect("ack")
            .unwrap_or_else(|Stale| panic!("stale lease on job {}", job.id));
    }

    fn ack_with_effect(&self, job: FloorJob) {
        self.try_ack_with_effect(&job)
            .expect("ack")
            .unwrap_or_else(|Stale| panic!("stale lease on job {}", job.id));
    }

    fn ack_batch_with_effect(&self, jobs: Vec<FloorJob>) {
        self.try_ack_batch_with_effect(&jobs)
            .expect("ack batch")
            .expect("stale leases in batch ack");
    }

    fn ack_and_dequeue_next(&self, job: FloorJob) -> Option<FloorJob> {
        self.try_ack_and_dequeue_next(&job)
            .expect("ack and dequeue next")
            .unwrap_or_else(|Stale| panic!("stale lease on job {}", job.id))
    }
}

/// Correctness checks of the floor, run once by the bench binary before measuring; panics on
/// any violation (a wrong floor would make every ratio against it meaningless).
pub fn self_check() {
    const JOBS_N: usize = 300;
    const CONSUMERS: usize = 4;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE_NAME);
    let queue = FloorQueue::open(&path).expect("open");
    let payload = common::payload();
    // Every index and the jobs table are empty, and the effects are exactly `acked` rows, each
    // a copy of its job's payload.
    let settled = |queue: &FloorQueue, acked: &[(u64, Vec<u8>)]| {
        assert_eq!(queue.count(JOBS), 0, "job rows left");
        assert_eq!(queue.count(READY), 0, "ready entries left");
        assert_eq!(queue.count(LEASES), 0, "lease entries left");
        let mut want = acked.to_vec();
        want.sort_unstable();
        assert_eq!(queue.effects(), want, "effect rows");
    };
    let mut acked: Vec<(u64, Vec<u8>)> = Vec::new();

    // Empty queue.
    assert_eq!(queue.try_dequeue().expect("dequeue"), None);

    // Priority then id order, stale tokens, ack_and_dequeue_next.
    {
        let late = queue.try_enqueue(b"late", 0).expect("enqueue");
        let early = queue.try_enqueue(b"early", -5).expect("enqueue");
        let after = queue.try_enqueue(b"after", 0).expect("enqueue");
        assert!(late < early && early < after);
        let first = queue.try_dequeue().expect("dequeue").expect("a job");
        assert_eq!((first.id, first.payload.as_slice()), (early, &b"early"[..]));
        assert_eq!(first.attempts, 1);
        assert_eq!(queue.count(LEASES), 1);
        let stale = FloorJob {
            token: first.token.wrapping_add(1),
            ..first.clone()
        };
        assert_eq!(queue.try_ack_with_effect(&stale).expect("ack"), Err(Stale));
        assert_eq!(
            queue.try_ack_and_dequeue_next(&stale).expect("ack"),
            Err(Stale)
        );
        // The stale acks wrote nothing and leased nothing.
        assert_eq!(
            (queue.count(JOBS), queue.count(READY), queue.count(LEASES)),
            (3, 2, 1)
        );
        assert_eq!(queue.count(EFFECTS), 0);
        let second = queue
            .try_ack_and_dequeue_next(&first)
            .expect("ack next")
            .expect("lease was valid")
            .expect("a next job");
        assert_eq!((second.id, second.payload.as_slice()), (late, &b"late"[..]));
        assert_eq!(
            queue.try_ack_with_effect(&first).expect("ack"),
            Err(Stale),
            "acked twice"
        );
        let third = queue
            .try_ack_and_dequeue_next(&second)
            .expect("ack")
            .expect("lease was valid")
            .expect("a next job");
        assert_eq!(third.id, after);
        assert_eq!(
            queue.try_ack_and_dequeue_next(&third).expect("ack"),
            Ok(None)
        );
        acked.extend([
            (early, b"early".to_vec()),
            (late, b"late".to_vec()),
            (after, b"after".to_vec()),
        ]);
        settled(&queue, &acked);
    }

    // Extend and the plain ack: fenced by the token; the lease entry moves with the row's
    // deadline; the ack writes no effect row.
    {
        let id = queue.try_enqueue(&payload, 0).expect("enqueue");
        let job = queue.try_dequeue().expect("dequeue").expect("a job");
        assert_eq!(job.id, id);
        let before = queue.leases();
        assert!(
            matches!(before[..], [((deadline, i), row)] if i == id && row == deadline),
            "{before:?}"
        );
        let stale = FloorJob {
            token: job.token.wrapping_add(1),
            ..job.clone()
        };
        assert_eq!(queue.try_extend(&stale).expect("extend"), Err(Stale));
        assert_eq!(queue.try_ack(&stale).expect("ack"), Err(Stale));
        assert_eq!(queue.leases(), before, "a stale call moved the lease");
        thread::sleep(Duration::from_millis(3));
        assert_eq!(queue.try_extend(&job).expect("extend"), Ok(()));
        let after = queue.leases();
        assert!(
            matches!(after[..], [((deadline, i), row)]
                if i == id && row == deadline && deadline > before[0].0 .0),
            "the extend did not move the lease: {before:?} -> {after:?}"
        );
        assert_eq!(queue.try_ack(&job).expect("ack"), Ok(()));
        assert_eq!(queue.try_extend(&job).expect("extend"), Err(Stale));
        assert_eq!(queue.try_ack(&job).expect("ack"), Err(Stale), "acked twice");
        settled(&queue, &acked);
    }

    // Batches: dense one-pass removals, the sparse path, leases of different deadlines, a
    // stale lease in a batch, and a batch across an id block boundary.
    {
        let payloads = vec![payload.clone(); 10];
        let ids = queue.try_enqueue_batch(&payloads).expect("enqueue batch");
        let jobs = queue.try_dequeue_batch(7).expect("dequeue batch");
        assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), ids[..7]);
        assert!(jobs.iter().all(|j| j.attempts == 1 && j.payload == payload));
        // A later deadline for the rest (lease entries of two deadlines in one ack).
        thread::sleep(Duration::from_millis(3));
        let rest = queue.try_dequeue_batch(100).expect("dequeue batch");
        assert_eq!(rest.iter().map(|j| j.id).collect::<Vec<_>>(), ids[7..]);
        // Sparse: the first and the last of the 7.
        let ends = [jobs[0].clone(), jobs[6].clone()];
        assert_eq!(queue.try_ack_batch_with_effect(&ends).expect("ack"), Ok(()));
        assert_eq!(
            queue.try_ack_batch_with_effect(&ends).expect("ack"),
            Err(Stale)
        );
        // One stale lease makes the whole batch stale, nothing written.
        let mut mixed: Vec<FloorJob> = jobs[1..6].to_vec();
        mixed.push(jobs[0].clone());
        assert_eq!(
            queue.try_ack_batch_with_effect(&mixed).expect("ack"),
            Err(Stale)
        );
        assert_eq!(queue.count(JOBS), 8);
        // Dense, over two deadlines.
        let mut middle: Vec<FloorJob> = jobs[1..6].to_vec();
        middle.extend(rest.iter().cloned());
        assert_eq!(
            queue.try_ack_batch_with_effect(&middle).expect("ack"),
            Ok(())
        );
        acked.extend(ids.iter().map(|&id| (id, payload.clone())));
        settled(&queue, &acked);

        let many = vec![payload.clone(); ID_BLOCK as usize + 100];
        let ids = queue.try_enqueue_batch(&many).expect("enqueue batch");
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1));
        let jobs = queue.try_dequeue_batch(many.len()).expect("dequeue batch");
        assert_eq!(jobs.len(), many.len());
        assert_eq!(queue.try_ack_batch_with_effect(&jobs).expect("ack"), Ok(()));
        acked.extend(ids.iter().map(|&id| (id, payload.clone())));
        settled(&queue, &acked);
    }

    // Concurrent drain: every job acked exactly once.
    let mut ids = Vec::with_capacity(JOBS_N);
    for _ in 0..JOBS_N {
        ids.push(queue.try_enqueue(&payload, 0).expect("enqueue"));
    }
    let done = AtomicUsize::new(0);
    let mut seen: Vec<u64> = thread::scope(|s| {
        let workers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    let mut next = queue.try_dequeue().expect("dequeue");
                    while let Some(job) = next {
                        assert_eq!(job.payload, payload);
                        assert_eq!(job.attempts, 1);
                        mine.push(job.id);
                        done.fetch_add(1, Ordering::Relaxed);
                        next = queue
                            .try_ack_and_dequeue_next(&job)
                            .expect("ack next")
                            .expect("stale");
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("consumer panicked"))
            .collect()
    });
    seen.sort_unstable();
    assert_eq!(seen, ids, "every job must be acked exactly once");
    assert_eq!(done.load(Ordering::Relaxed), JOBS_N);
    acked.extend(ids.iter().map(|&id| (id, payload.clone())));
    settled(&queue, &acked);

    // Everything is in the file: reopen and look; no id is reused.
    drop(queue);
    let reopened = FloorQueue::open(&path).expect("reopen");
    settled(&reopened, &acked);
    let next = reopened.try_enqueue(&payload, 0).expect("enqueue");
    assert!(
        next > *ids.last().expect("ids"),
        "job id reused after reopen"
    );
}
