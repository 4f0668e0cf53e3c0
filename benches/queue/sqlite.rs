//! The baseline: the durable job queue a competent user would build on SQLite.
//!
//! - WAL journal, `synchronous=FULL`: every commit appends to the WAL and fsyncs it before
//!   `COMMIT` returns, so every call is durable when it returns (same as leaseq).
//! - `AUTOINCREMENT` job ids, so an id is never reused and can key the `applied` table.
//! - A partial, covering index `jobs_ready (state, priority DESC, id) WHERE state = 0`
//!   serves "first ready job" from the index alone, no table lookup and no sort (checked
//!   with `EXPLAIN QUERY PLAN` in [`self_check`]); leased jobs leave it, so it only holds
//!   the ready backlog and acking (deleting) a leased job touches no index. (`state` is in
//!   the key only so SQLite's planner sees the index as covering.)
//! - Dequeue is a single `UPDATE ... WHERE id = (first ready) RETURNING ...`.
//! - Every transaction is `BEGIN IMMEDIATE`, statements are cached (`prepare_cached`).
//! - Each call checks out its own connection (a thread never shares one with another
//!   thread; the pool ends up with one connection per concurrently calling thread, reused
//!   across calls, so connections are not reopened per call), with a busy timeout; an
//!   in-process mutex serializes the write transactions, which is steadier and faster than
//!   SQLite's sleeping busy handler.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{
    Connection, OptionalExtension, Transaction, TransactionBehavior, params, params_from_iter,
};

use crate::common::{self, QueueUnderTest};

/// Database file name inside the benchmark's directory.
const FILE_NAME: &str = "queue.sqlite";

/// How long a lease lasts.
const LEASE_MS: i64 = 30_000;

/// Idempotent; `state` is 0 = ready, 1 = leased (acked jobs are deleted).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    priority          INTEGER NOT NULL DEFAULT 0,
    state             INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    lease_token       INTEGER,
    lease_deadline_ms INTEGER,
    payload           BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (state, priority DESC, id) WHERE state = 0;
CREATE TABLE IF NOT EXISTS applied (
    job_id INTEGER PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS effects (
    id     INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL,
    value  BLOB NOT NULL
);
";

const ENQUEUE: &str = "INSERT INTO jobs (priority, state, payload) VALUES (?1, 0, ?2)";

/// The "first ready job" lookup; a literal `state = 0` so the partial index applies.
const FIRST_READY: &str = "SELECT id FROM jobs WHERE state = 0 ORDER BY priority DESC, id";

fn dequeue_one_sql() -> String {
    format!(
        "UPDATE jobs SET state = 1, lease_token = ?1, lease_deadline_ms = ?2, \
         attempts = attempts + 1 \
         WHERE id = ({FIRST_READY} LIMIT 1) \
         RETURNING id, payload, attempts"
    )
}

fn dequeue_many_sql() -> String {
    format!(
        "UPDATE jobs SET state = 1, lease_token = ?1, lease_deadline_ms = ?2, \
         attempts = attempts + 1 \
         WHERE id IN ({FIRST_READY} LIMIT ?3) \
         RETURNING id, payload, attempts"
    )
}

const ACK_DELETE: &str = "DELETE FROM jobs WHERE id = ?1 AND state = 1 AND lease_token = ?2";
const EXTEND: &str =
    "UPDATE jobs SET lease_deadline_ms = ?3 WHERE id = ?1 AND state = 1 AND lease_token = ?2";
const ACK_APPLIED: &str = "INSERT INTO applied (job_id) VALUES (?1)";
const ACK_EFFECT: &str = "INSERT INTO effects (job_id, value) VALUES (?1, ?2)";

/// A leased job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteJob {
    pub id: i64,
    pub payload: Vec<u8>,
    pub token: i64,
    pub attempts: i64,
}

/// The SQLite queue; share it between threads by reference.
pub struct SqliteQueue {
    path: PathBuf,
    /// Idle connections; a call takes one (or opens one) and puts it back afterwards.
    idle: Mutex<Vec<Connection>>,
    /// Serializes write transactions within the process.
    writer: Mutex<()>,
    dequeue_one: String,
    dequeue_many: String,
}

fn now_ms() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970");
    i64::try_from(since_epoch.as_millis()).expect("clock overflow")
}

fn new_token() -> i64 {
    fastrand::i64(1..)
}

impl SqliteQueue {
    /// Opens (creating if needed) the queue database at `path`.
    pub fn open(path: &Path) -> rusqlite::Result<Self> {
        let conn = Self::connect(path)?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            path: path.to_owned(),
            idle: Mutex::new(vec![conn]),
            writer: Mutex::new(()),
            dequeue_one: dequeue_one_sql(),
            dequeue_many: dequeue_many_sql(),
        })
    }

    fn connect(path: &Path) -> rusqlite::Result<Connection> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        // WAL is persistent in the file; setting it on every connection is harmless.
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        assert_eq!(mode, "wal", "SQLite refused WAL mode");
        // Per connection: fsync the WAL on every commit.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }

    fn checkout(&self) -> rusqlite::Result<Connection> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => Self::connect(&self.path),
        }
    }

    fn checkin(&self, conn: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction, committed (and synced) if `f` returns
    /// `Ok`, rolled back otherwise.
    fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let mut conn = self.checkout()?;
        let result = {
            let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            conn.transaction_with_behavior(TransactionBehavior::Immediate)
                .and_then(|tx| {
                    let value = f(&tx)?;
                    tx.commit()?;
                    Ok(value)
                })
        };
        self.checkin(conn);
        result
    }

    /// Enqueues one job with priority 0; returns its id.
    pub fn try_enqueue(&self, payload: &[u8]) -> rusqlite::Result<i64> {
        self.write(|tx| {
            tx.prepare_cached(ENQUEUE)?.execute(params![0, payload])?;
            Ok(tx.last_insert_rowid())
        })
    }

    /// Enqueues all `payloads` in one transaction.
    pub fn try_enqueue_batch(&self, payloads: &[Vec<u8>]) -> rusqlite::Result<()> {
        self.write(|tx| {
            let mut insert = tx.prepare_cached(ENQUEUE)?;
            for payload in payloads {
                insert.execute(params![0, payload])?;
            }
            Ok(())
        })
    }

    fn lease_one(&self, tx: &Transaction<'_>) -> rusqlite::Result<Option<SqliteJob>> {
        let token = new_token();
        tx.prepare_cached(&self.dequeue_one)?
            .query_row(params![token, now_ms() + LEASE_MS], |row| {
                Ok(SqliteJob {
                    id: row.get(0)?,
                    payload: row.get(1)?,
                    token,
                    attempts: row.get(2)?,
                })
            })
            .optional()
    }

    /// Leases the first ready job, if any.
    pub fn try_dequeue(&self) -> rusqlite::Result<Option<SqliteJob>> {
        self.write(|tx| self.lease_one(tx))
    }

    /// Leases up to `max` ready jobs (one lease token for the batch), in id order.
    pub fn try_dequeue_batch(&self, max: usize) -> rusqlite::Result<Vec<SqliteJob>> {
        let max = i64::try_from(max).expect("batch size overflow");
        let mut jobs = self.write(|tx| {
            let token = new_token();
            let mut update = tx.prepare_cached(&self.dequeue_many)?;
            let rows = update.query_map(params![token, now_ms() + LEASE_MS, max], |row| {
                Ok(SqliteJob {
                    id: row.get(0)?,
                    payload: row.get(1)?,
                    token,
                    attempts: row.get(2)?,
                })
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        // RETURNING does not promise an order.
        jobs.sort_unstable_by_key(|job| job.id);
        Ok(jobs)
    }

    /// Within `tx`: deletes the job if it is still leased with `job.token`, then records it
    /// as applied and writes its effect row. `false` (and no writes) if the lease is stale.
    fn ack_in(tx: &Transaction<'_>, job: &SqliteJob) -> rusqlite::Result<bool> {
        let deleted = tx
            .prepare_cached(ACK_DELETE)?
            .execute(params![job.id, job.token])?;
        if deleted == 0 {
            return Ok(false);
        }
        tx.prepare_cached(ACK_APPLIED)?.execute(params![job.id])?;
        tx.prepare_cached(ACK_EFFECT)?
            .execute(params![job.id, job.payload])?;
        Ok(true)
    }

    /// Moves the lease of `job` to `LEASE_MS` from now; `false` if its lease is stale (then
    /// nothing is written).
    pub fn try_extend(&self, job: &SqliteJob) -> rusqlite::Result<bool> {
        self.write(|tx| {
            let changed = tx.prepare_cached(EXTEND)?.execute(params![
                job.id,
                job.token,
                now_ms() + LEASE_MS
            ])?;
            Ok(changed == 1)
        })
    }

    /// Acks `job` without an effect (deletes it); `false` if its lease is stale (then nothing
    /// is written).
    pub fn try_ack(&self, job: &SqliteJob) -> rusqlite::Result<bool> {
        self.write(|tx| {
            let deleted = tx
                .prepare_cached(ACK_DELETE)?
                .execute(params![job.id, job.token])?;
            Ok(deleted == 1)
        })
    }

    /// Acks `job` with its effect; `false` if its lease is stale (then nothing is written).
    pub fn try_ack_with_effect(&self, job: &SqliteJob) -> rusqlite::Result<bool> {
        self.write(|tx| Self::ack_in(tx, job))
    }

    /// Acks all `jobs` with their effects in one transaction; returns how many were acked
    /// (jobs with a stale lease are skipped).
    pub fn try_ack_batch_with_effect(&self, jobs: &[SqliteJob]) -> rusqlite::Result<usize> {
        self.write(|tx| {
            let mut acked = 0;
            for job in jobs {
                acked += usize::from(Self::ack_in(tx, job)?);
            }
            Ok(acked)
        })
    }

    /// Acks `job` with its effect and leases the next ready job, in one transaction.
    /// `Ok(None)` if the lease of `job` is stale (then nothing is written or leased),
    /// `Ok(Some(next))` otherwise.
    pub fn try_ack_and_dequeue_next(
        &self,
        job: &SqliteJob,
    ) -> rusqlite::Result<Option<Option<SqliteJob>>> {
        self.write(|tx| {
            if !Self::ack_in(tx, job)? {
                return Ok(None);
            }
            self.lease_one(tx).map(Some)
        })
    }

    /// Counts rows of `table` (for checks only).
    fn count(&self, table: &str) -> rusqlite::Result<i64> {
        let conn = self.checkout()?;
        let n = conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        });
        self.checkin(conn);
        n
    }
}

impl QueueUnderTest for SqliteQueue {
    const NAME: &'static str = "sqlite";
    type Job = SqliteJob;

    fn open(dir: &Path) -> Self {
        SqliteQueue::open(&dir.join(FILE_NAME)).expect("open SQLite queue")
    }

    fn enqueue(&self, payload: &[u8]) {
        self.try_enqueue(payload).expect("enqueue");
    }

    fn enqueue_batch(&self, payloads: &[Vec<u8>]) {
        self.try_enqueue_batch(payloads).expect("enqueue batch");
    }

    fn dequeue(&self) -> Option<SqliteJob> {
        self.try_dequeue().expect("dequeue")
    }

    fn dequeue_batch(&self, max: usize) -> Vec<SqliteJob> {
        self.try_dequeue_batch(max).expect("dequeue batch")
    }

    fn extend(&self, job: &SqliteJob) {
        let current = self.try_extend(job).expect("extend");
        assert!(current, "stale lease on job {}", job.id);
    }

    fn ack(&self, job: SqliteJob) {
        let current = self.try_ack(&job).expect("ack");
        assert!(current, "stale lease on job {}", job.id);
    }

    fn ack_with_effect(&self, job: SqliteJob) {
        assert!(
            self.try_ack_with_effect(&job).expect("ack"),
            "stale lease on job {}",
            job.id
        );
    }

    fn ack_batch_with_effect(&self, jobs: Vec<SqliteJob>) {
        let acked = self.try_ack_batch_with_effect(&jobs).expect("ack batch");
        assert_eq!(acked, jobs.len(), "stale leases in batch ack");
    }

    fn ack_and_dequeue_next(&self, job: SqliteJob) -> Option<SqliteJob> {
        self.try_ack_and_dequeue_next(&job)
            .expect("ack and dequeue next")
            .unwrap_or_else(|| panic!("stale lease on job {}", job.id))
    }
}

/// Correctness checks of the SQLite queue, run once by the bench binary before measuring;
/// panics on any violation.
pub fn self_check() {
    const JOBS: usize = 300;
    const CONSUMERS: usize = 4;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE_NAME);
    let queue = SqliteQueue::open(&path).expect("open");
    let payload = common::payload();

    // Pragmas and the query plan of "first ready job".
    {
        let conn = queue.checkout().expect("connection");
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .expect("journal_mode");
        assert_eq!(mode, "wal");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .expect("synchronous");
        assert_eq!(sync, 2, "synchronous must be FULL");
        for sql in [queue.dequeue_one.as_str(), queue.dequeue_many.as_str()] {
            let mut plan = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("explain");
            let args = std::iter::repeat_n(1_i64, plan.parameter_count());
            let details = plan
                .query_map(params_from_iter(args), |row| row.get::<_, String>(3))
                .expect("explain rows")
                .collect::<rusqlite::Result<Vec<_>>>()
                .expect("explain rows");
            let plan_text = details.join(" | ");
            assert!(
                plan_text.contains("COVERING INDEX jobs_ready")
                    && !plan_text.contains("TEMP B-TREE"),
                "first-ready lookup does not use the covering partial index: {plan_text}"
            );
        }
        queue.checkin(conn);
    }

    // Empty queue.
    assert_eq!(queue.try_dequeue().expect("dequeue"), None);

    // Priority then id order, stale tokens, ack_and_dequeue_next.
    {
        let low = queue.try_enqueue(b"low").expect("enqueue");
        let high = queue
            .write(|tx| {
                tx.prepare_cached(ENQUEUE)?.execute(params![5, b"high"])?;
                Ok(tx.last_insert_rowid())
            })
            .expect("enqueue high");
        assert!(low < high);
        let first = queue.try_dequeue().expect("dequeue").expect("a job");
        assert_eq!((first.id, first.payload.as_slice()), (high, &b"high"[..]));
        assert_eq!(first.attempts, 1);
        let stale = SqliteJob {
            token: first.token.wrapping_add(1),
            ..first.clone()
        };
        assert!(!queue.try_ack_with_effect(&stale).expect("ack"));
        assert_eq!(queue.try_ack_and_dequeue_next(&stale).expect("ack"), None);
        let second = queue
            .try_ack_and_dequeue_next(&first)
            .expect("ack next")
            .expect("lease was valid")
            .expect("a next job");
        assert_eq!(second.id, low);
        assert!(
            !queue.try_ack_with_effect(&first).expect("ack"),
            "acked twice"
        );
        assert_eq!(
            queue.try_ack_and_dequeue_next(&second).expect("ack"),
            Some(None)
        );
        assert_eq!(queue.count("jobs").expect("count"), 0);
        assert_eq!(queue.count("applied").expect("count"), 2);
        assert_eq!(queue.count("effects").expect("count"), 2);
    }

    // Extend and the plain ack: fenced by the token; the ack writes no effect.
    {
        queue.try_enqueue(&payload).expect("enqueue");
        let job = queue.try_dequeue().expect("dequeue").expect("a job");
        let deadline = |queue: &SqliteQueue| -> i64 {
            let conn = queue.checkout().expect("connection");
            let sql = "SELECT lease_deadline_ms FROM jobs WHERE id = ?1";
            let d = conn.query_row(sql, params![job.id], |row| row.get(0));
            queue.checkin(conn);
            d.expect("deadline")
        };
        let leased_until = deadline(&queue);
        let stale = SqliteJob {
            token: job.token.wrapping_add(1),
            ..job.clone()
        };
        assert!(!queue.try_extend(&stale).expect("extend"));
        assert!(!queue.try_ack(&stale).expect("ack"));
        assert_eq!(
            deadline(&queue),
            leased_until,
            "a stale extend moved the lease"
        );
        thread::sleep(Duration::from_millis(3));
        assert!(queue.try_extend(&job).expect("extend"));
        assert!(
            deadline(&queue) > leased_until,
            "the extend did not move the lease"
        );
        assert!(queue.try_ack(&job).expect("ack"));
        assert!(
            !queue.try_extend(&job).expect("extend"),
            "extended once acked"
        );
        assert!(!queue.try_ack(&job).expect("ack"), "acked twice");
        assert_eq!(queue.count("jobs").expect("count"), 0);
        assert_eq!(queue.count("applied").expect("count"), 2);
        assert_eq!(queue.count("effects").expect("count"), 2);
    }

    // Batches.
    {
        let payloads = vec![payload.clone(); 10];
        queue.try_enqueue_batch(&payloads).expect("enqueue batch");
        let jobs = queue.try_dequeue_batch(7).expect("dequeue batch");
        assert_eq!(jobs.len(), 7);
        assert!(jobs.windows(2).all(|w| w[0].id < w[1].id));
        let rest = queue.try_dequeue_batch(100).expect("dequeue batch");
        assert_eq!(rest.len(), 3);
        assert!(jobs.last().expect("jobs").id < rest[0].id);
        assert_eq!(queue.try_ack_batch_with_effect(&jobs).expect("ack"), 7);
        assert_eq!(queue.try_ack_batch_with_effect(&jobs).expect("ack"), 0);
        assert_eq!(queue.try_ack_batch_with_effect(&rest).expect("ack"), 3);
        assert_eq!(queue.count("jobs").expect("count"), 0);
        assert_eq!(queue.count("applied").expect("count"), 12);
        assert_eq!(queue.count("effects").expect("count"), 12);
    }

    // Concurrent drain: every job acked exactly once.
    let before = queue.count("applied").expect("count");
    let mut ids = Vec::with_capacity(JOBS);
    for _ in 0..JOBS {
        ids.push(queue.try_enqueue(&payload).expect("enqueue"));
    }
    let acked = AtomicUsize::new(0);
    let mut seen: Vec<i64> = thread::scope(|s| {
        let workers: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    while let Some(job) = queue.try_dequeue().expect("dequeue") {
                        assert_eq!(job.payload, payload);
                        assert_eq!(job.attempts, 1);
                        assert!(queue.try_ack_with_effect(&job).expect("ack"), "stale");
                        acked.fetch_add(1, Ordering::Relaxed);
                        mine.push(job.id);
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
    assert_eq!(acked.load(Ordering::Relaxed), JOBS);
    let jobs = i64::try_from(JOBS).expect("jobs");
    assert_eq!(queue.count("jobs").expect("count"), 0, "jobs left");
    assert_eq!(queue.count("applied").expect("count") - before, jobs);
    assert_eq!(queue.count("effects").expect("count") - before, jobs);
    let effect_ids: i64 = {
        let conn = queue.checkout().expect("connection");
        let n = conn
            .query_row(
                "SELECT count(*) FROM effects e JOIN applied a ON a.job_id = e.job_id",
                [],
                |row| row.get(0),
            )
            .expect("join");
        queue.checkin(conn);
        n
    };
    assert_eq!(effect_ids, jobs + before, "effects and applied disagree");

    // Everything is in the file: reopen and look.
    drop(queue);
    let reopened = SqliteQueue::open(&path).expect("reopen");
    assert_eq!(reopened.count("jobs").expect("count"), 0);
    assert_eq!(reopened.count("applied").expect("count"), jobs + before);
    let next = reopened.try_enqueue(&payload).expect("enqueue");
    assert!(
        next > *ids.last().expect("ids"),
        "AUTOINCREMENT reused an id"
    );
}
