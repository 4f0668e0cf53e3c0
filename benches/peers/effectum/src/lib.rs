//! effectum's sides of leaseq's peer benchmark (`benches/peers`, the harness in
//! `peers-common`): effectum 0.7 as it ships ([`EffectumAsShipped`]) and effectum at leaseq's
//! durability ([`EffectumWalFull`]), both driven through effectum's own API.
//!
//! What both sides share (effectum 0.7.0's source, `src/local_queue.rs`, `src/db_writer.rs`,
//! `src/add_job.rs`, `src/worker.rs`, `src/job.rs`):
//! - Every write (add, claim, completion) is an operation sent to effectum's one writer
//!   thread, which takes up to 50 waiting operations into one SQLite transaction (a savepoint
//!   each) and answers each caller only after that transaction's `COMMIT` returned: a group
//!   commit, as leaseq's.
//! - `enqueue` is `Queue::add_job`, which returns after that commit; `enqueue_batch` is
//!   `Queue::add_jobs`, one operation, so every job of the batch is in one savepoint of one
//!   transaction (possibly shared with other waiting operations), committed before it
//!   returns.
//! - After an add commits, effectum wakes its in-process workers of that job type (a tokio
//!   `Notify`, no polling); a worker then claims ready jobs through the writer thread (an
//!   operation of its own, which the writer may commit with other waiting ones, with the same
//!   durability as the adds). A worker sends its next claim after its completion returned, so
//!   one worker makes two commits per job.
//! - One effectum `Worker` with `min_concurrency = max_concurrency = consumers` (tokio tasks
//!   on the side's runtime of 2 threads), where leaseq runs `consumers` OS threads.
//! - The handler completes its job through effectum's own `RunningJob::complete`, which sends
//!   the completion to the writer thread and returns only once its transaction committed
//!   (the same call effectum's runner makes when a handler returns `Ok`, so the work per job
//!   is the same); the completion is counted when that call returns `Ok`. So `wait_completed`
//!   sees a completion as soon as effectum's API reports it committed, with no polling
//!   interval (the wake-up of the waiting thread only). [`check`] confirms afterwards through
//!   `Queue::get_job_status`, `Queue::num_active_jobs` and `Worker::counts` that every job
//!   ended `Succeeded` after exactly one run.
//! - effectum keeps every finished job's row (`jobs`, with its payload and run info) forever;
//!   there is no deletion of finished jobs in 0.7.

use std::collections::HashSet;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use effectum::{Job, JobRunner, JobState, Queue, RunningJob, Worker};
use peers_common::{Completions, Side};
use rusqlite::ffi;
use tokio::runtime::Runtime;
use uuid::Uuid;

/// The one job type every side enqueues and runs.
const JOB_TYPE: &str = "noop";

/// How long a drop waits for the worker and the queue to stop.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// effectum's storage configuration of a side: its file name and what is done to the file
/// before effectum opens it.
pub trait Flavor: Send + Sync + 'static {
    /// Criterion function name.
    const NAME: &'static str;
    /// The database file's name in the side's directory.
    const FILE: &'static str;
    /// The journal mode SQLite must report for the file once effectum opened it.
    const JOURNAL_MODE: &'static str;
    /// Prepares `path` (not yet existing) before `Queue::new` opens it.
    fn prepare(path: &Path);
}

/// effectum as it ships: `Queue::new(path)`, nothing else.
///
/// Durability: effectum's writer connection runs `PRAGMA journal = wal` (a pragma SQLite does
/// not know, so silently a no-op: the real one is `journal_mode`) and
/// `PRAGMA synchronous = normal`. The file therefore stays in SQLite's default rollback
/// journal (`journal_mode = delete`, no `-wal` file; both checked by [`check`]) with
/// `synchronous = NORMAL` on the connection that does every write. A commit then: writes the
/// old pages to a new `-journal` file and fsyncs it once (FULL would fsync it twice, around
/// the header's page count), fsyncs the directory (SQLite does so on the first sync of a
/// newly created journal), writes the database file and fsyncs it, and deletes the journal,
/// which is the commit point. That deletion is not followed by a directory fsync (only
/// `synchronous = EXTRA` does that), so after a power loss the journal can come back and roll
/// the last transaction back: the latest acknowledged commit is not durable against power
/// loss (only it: the next commit's directory fsync, when it creates its journal, persists
/// the deletion), though it is against a process crash. SQLite also documents a very small chance of corruption on power loss with
/// NORMAL in rollback mode (the single journal sync). Three fsyncs per commit.
/// Read connections (effectum's pool) keep SQLite's default `synchronous = FULL`; they write
/// nothing.
pub struct AsShipped;

impl Flavor for AsShipped {
    const NAME: &'static str = "effectum";
    const FILE: &'static str = "effectum.sqlite3";
    const JOURNAL_MODE: &'static str = "delete";

    fn prepare(_path: &Path) {}
}

/// effectum at leaseq's durability: WAL, `synchronous = FULL` on every connection effectum
/// opens, effectum's code and calls otherwise unchanged.
///
/// effectum 0.7 has no hook on its connections (no options, no connection callback; its
/// writer connection is opened and set to `synchronous = normal` inside `Queue::new`), so
/// this is done from outside effectum, through SQLite's own process-wide API:
/// - the file is created in WAL mode before effectum opens it (`PRAGMA journal_mode = WAL`
///   is persistent in the file; effectum never sets `journal_mode`);
/// - an SQLite auto-extension (`sqlite3_auto_extension`, run by SQLite at the end of every
///   `sqlite3_open*` in the process) recognizes connections to this side's file by name
///   ([`WalFull::FILE`]), sets `synchronous = FULL` on them, and installs an authorizer that
///   turns any later `PRAGMA synchronous = ...` on them into a no-op (`SQLITE_IGNORE`), so
///   effectum's own `synchronous = normal` does not take effect. [`check`] asserts that the
///   authorizer refused effectum's pragma and that the file is in WAL.
///
/// Durability: each commit appends to the `-wal` file and fsyncs it before `COMMIT` returns,
/// so every acknowledged add, claim and completion is durable against power loss (one fsync
/// per group commit, as leaseq's default). A checkpoint (automatic, every 1000 WAL pages, run
/// by the committing writer) fsyncs the WAL, copies the pages into the database file and
/// fsyncs it.
pub struct WalFull;

impl Flavor for WalFull {
    const NAME: &'static str = "effectum_wal_full";
    const FILE: &'static str = "effectum-wal-full.sqlite3";
    const JOURNAL_MODE: &'static str = "wal";

    fn prepare(path: &Path) {
        install_wal_full_hook();
        let conn = rusqlite::Connection::open(path).expect("create the WAL file");
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .expect("journal_mode = WAL");
        assert_eq!(mode, "wal", "{} not converted to WAL", path.display());
        conn.close().map_err(|(_, e)| e).expect("close");
    }
}

/// Side `effectum`.
pub type EffectumAsShipped = Effectum<AsShipped>;

/// Side `effectum_wal_full`.
pub type EffectumWalFull = Effectum<WalFull>;

/// What the handler shares with the side.
struct Shared {
    completions: Completions,
    /// `RunningJob::complete` calls that failed (must stay 0).
    failed: AtomicU64,
    /// The ids of completed jobs, in the self check only.
    seen: Option<Mutex<Vec<Uuid>>>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// The handler: does nothing, then completes its job through effectum (the call effectum's
/// runner would make for a handler returning `Ok`), and counts the completion once that call
/// returned, that is once effectum committed it.
async fn handle(job: RunningJob, shared: Arc<Shared>) -> Result<(), effectum::Error> {
    match job.complete(()).await {
        Ok(()) => {
            if let Some(seen) = &shared.seen {
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(job.id);
            }
            shared.completions.add(1);
        }
        Err(e) => {
            shared.failed.fetch_add(1, Ordering::Relaxed);
            eprintln!("effectum: completing job {} failed: {e}", job.id);
        }
    }
    Ok(())
}

/// An effectum queue in one file, with one worker of `consumers` concurrency, on a tokio
/// runtime of its own (2 threads) that the blocking [`Side`] calls enter with `block_on`.
pub struct Effectum<F: Flavor> {
    runtime: Option<Runtime>,
    queue: Option<Queue>,
    worker: Option<Worker>,
    shared: Arc<Shared>,
    path: PathBuf,
    _flavor: PhantomData<F>,
}

impl<F: Flavor> Effectum<F> {
    fn open_with(dir: &Path, consumers: usize, record: bool) -> Self {
        let path = dir.join(F::FILE);
        F::prepare(&path);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("effectum-side")
            .build()
            .expect("tokio runtime");
        let shared = Arc::new(Shared {
            completions: Completions::default(),
            failed: AtomicU64::new(0),
            seen: record.then(|| Mutex::new(Vec::new())),
        });
        let (queue, worker) = runtime.block_on(async {
            let queue = Queue::new(&path).await.expect("open effectum");
            let worker = if consumers > 0 {
                let concurrency = u16::try_from(consumers).expect("consumers fit u16");
                let runner = JobRunner::builder(JOB_TYPE, handle).build();
                let worker = Worker::builder(&queue, Arc::clone(&shared))
                    .min_concurrency(concurrency)
                    .max_concurrency(concurrency)
                    .jobs([runner])
                    .build()
                    .await
                    .expect("start the worker");
                Some(worker)
            } else {
                None
            };
            (queue, worker)
        });
        Effectum {
            runtime: Some(runtime),
            queue: Some(queue),
            worker,
            shared,
            path,
            _flavor: PhantomData,
        }
    }

    fn runtime(&self) -> &Runtime {
        self.runtime.as_ref().expect("open until dropped")
    }

    fn queue(&self) -> &Queue {
        self.queue.as_ref().expect("open until dropped")
    }

    fn job(payload: &[u8]) -> Job {
        Job::builder(JOB_TYPE).payload(payload.to_vec()).build()
    }

    /// `Queue::add_job`: returns after the commit of the add.
    fn add(&self, payload: &[u8]) -> Uuid {
        self.runtime()
            .handle()
            .block_on(self.queue().add_job(Self::job(payload)))
            .expect("add_job")
    }

    /// `Queue::add_jobs`: one writer operation, one transaction; returns after its commit.
    fn add_batch(&self, payloads: &[Vec<u8>]) -> Vec<Uuid> {
        let jobs = payloads.iter().map(|p| Self::job(p)).collect();
        self.runtime()
            .handle()
            .block_on(self.queue().add_jobs(jobs))
            .expect("add_jobs")
    }
}

impl<F: Flavor> Side for Effectum<F> {
    const NAME: &'static str = F::NAME;

    fn open(dir: &Path, consumers: usize) -> Self {
        Self::open_with(dir, consumers, false)
    }

    fn enqueue(&self, payload: &[u8]) {
        self.add(payload);
    }

    fn enqueue_batch(&self, payloads: &[Vec<u8>]) {
        self.add_batch(payloads);
    }

    fn wait_completed(&self, n: usize) {
        self.shared.completions.wait(n);
    }
}

impl<F: Flavor> Drop for Effectum<F> {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let worker = self.worker.take();
        let queue = self.queue.take();
        runtime.block_on(async move {
            // Unregister first: the worker stops claiming and waits for its running jobs.
            if let Some(worker) = worker
                && let Err(e) = worker.unregister(Some(CLOSE_TIMEOUT)).await
            {
                eprintln!("effectum: stopping the worker: {e}");
            }
            if let Some(queue) = queue {
                // Stops effectum's tasks and joins its writer thread (its connection closed);
                // the drop then has nothing left to spawn.
                if let Err(e) = queue.close(CLOSE_TIMEOUT).await {
                    eprintln!("effectum: closing the queue: {e}");
                }
                drop(queue);
            }
        });
        runtime.shutdown_timeout(CLOSE_TIMEOUT);
    }
}

// ---------------------------------------------------------------------------------------
// effectum_wal_full's connection hook.

/// Connections to a `WalFull` file the auto-extension configured.
static HOOKED_CONNECTIONS: AtomicU64 = AtomicU64::new(0);
/// `PRAGMA synchronous = ...` statements the authorizer turned into no-ops.
static REFUSED_SYNCHRONOUS: AtomicU64 = AtomicU64::new(0);
/// `PRAGMA journal ...` statements seen on hooked connections (effectum's misspelled one).
static SEEN_JOURNAL_PRAGMA: AtomicU64 = AtomicU64::new(0);

fn install_wal_full_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: `wal_full_entry` has the signature SQLite calls an extension entry point
        // with; it stays valid for the life of the process.
        let rc = unsafe { ffi::sqlite3_auto_extension(Some(wal_full_entry)) };
        assert_eq!(rc, ffi::SQLITE_OK, "sqlite3_auto_extension");
    });
}

/// Runs at the end of every `sqlite3_open*` in the process (SQLite's auto-extension).
unsafe extern "C" fn wal_full_entry(
    db: *mut ffi::sqlite3,
    _err: *mut *const c_char,
    _api: *const ffi::sqlite3_api_routines,
) -> c_int {
    // SAFETY: `db` is the connection being opened, valid during this call.
    let name = unsafe { ffi::sqlite3_db_filename(db, c"main".as_ptr()) };
    if name.is_null() {
        return ffi::SQLITE_OK;
    }
    // SAFETY: SQLite returns a NUL-terminated string that lives as long as the connection.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    if !name.ends_with(WalFull::FILE.as_bytes()) {
        return ffi::SQLITE_OK;
    }
    // SAFETY: `db` is valid; the SQL is a NUL-terminated constant; no callback.
    let rc = unsafe {
        ffi::sqlite3_exec(
            db,
            c"PRAGMA synchronous = FULL".as_ptr(),
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: `db` is valid; the callback is a plain function without user data.
    let rc =
        unsafe { ffi::sqlite3_set_authorizer(db, Some(keep_synchronous), std::ptr::null_mut()) };
    if rc == ffi::SQLITE_OK {
        HOOKED_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    }
    rc
}

/// The authorizer of hooked connections: every action allowed, except setting `synchronous`
/// (made a no-op).
unsafe extern "C" fn keep_synchronous(
    _user: *mut c_void,
    action: c_int,
    arg1: *const c_char,
    arg2: *const c_char,
    _db_name: *const c_char,
    _trigger: *const c_char,
) -> c_int {
    if action != ffi::SQLITE_PRAGMA || arg1.is_null() {
        return ffi::SQLITE_OK;
    }
    // SAFETY: for SQLITE_PRAGMA, SQLite passes the pragma's name as a NUL-terminated string.
    let pragma = unsafe { CStr::from_ptr(arg1) }.to_bytes();
    if pragma.eq_ignore_ascii_case(b"journal") {
        SEEN_JOURNAL_PRAGMA.fetch_add(1, Ordering::Relaxed);
    }
    // `arg2` is the pragma's argument: null for a query of the value, which stays allowed.
    if pragma.eq_ignore_ascii_case(b"synchronous") && !arg2.is_null() {
        REFUSED_SYNCHRONOUS.fetch_add(1, Ordering::Relaxed);
        return ffi::SQLITE_IGNORE;
    }
    ffi::SQLITE_OK
}

// ---------------------------------------------------------------------------------------
// The self check.

/// Jobs of the self check: half enqueued one by one from 4 threads, half in 2 batches.
const CHECK_JOBS: usize = 200;

/// Runs `CHECK_JOBS` jobs through a fresh side of flavor `F` with 4 consumers and asserts
/// that each was completed exactly once, as effectum's own API reports it, and that the file
/// has the journal mode the side claims. Returns a one-line summary.
pub fn check<F: Flavor>() -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Effectum::<F>::open_with(dir.path(), 4, true);
    let payload = peers_common::payload();
    let started = Instant::now();

    // Half one by one from 4 producer threads, half in two batches.
    let mut ids: Vec<Uuid> = thread::scope(|s| {
        let producers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..CHECK_JOBS / 8)
                        .map(|_| side.add(&payload))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let batch = vec![payload.clone(); CHECK_JOBS / 4];
        let mut ids = side.add_batch(&batch);
        ids.extend(side.add_batch(&batch));
        for producer in producers {
            ids.extend(producer.join().expect("producer"));
        }
        ids
    });
    assert_eq!(ids.len(), CHECK_JOBS);
    side.wait_completed(CHECK_JOBS);
    let elapsed = started.elapsed();

    // Settle, then nothing more may have been completed.
    thread::sleep(Duration::from_millis(300));
    let shared = &side.shared;
    assert_eq!(
        shared.failed.load(Ordering::Relaxed),
        0,
        "{}: failed completions",
        F::NAME
    );
    let mut seen = shared
        .seen
        .as_ref()
        .expect("recorded")
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    seen.sort();
    ids.sort();
    // The same ids, as many: none missing, none completed twice, none after the settle.
    assert_eq!(seen, ids, "{}: each job completed exactly once", F::NAME);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        CHECK_JOBS,
        "{}: distinct ids",
        F::NAME
    );

    // effectum's own view: every job succeeded after one run, none active, the worker's
    // counts agree.
    let handle = side.runtime().handle();
    for id in &ids {
        let status = handle
            .block_on(side.queue().get_job_status(*id))
            .expect("get_job_status");
        assert_eq!(status.state, JobState::Succeeded, "{}: job {id}", F::NAME);
        assert_eq!(status.run_info.len(), 1, "{}: runs of job {id}", F::NAME);
        assert!(status.run_info[0].success, "{}: job {id}", F::NAME);
        assert_eq!(status.payload, payload, "{}: payload of job {id}", F::NAME);
    }
    let active = handle
        .block_on(side.queue().num_active_jobs())
        .expect("num_active_jobs");
    assert_eq!(
        (active.pending, active.running),
        (0, 0),
        "{}: active jobs",
        F::NAME
    );
    let counts = side.worker.as_ref().expect("worker").counts();
    assert_eq!(
        (counts.started, counts.finished),
        (CHECK_JOBS as u64, CHECK_JOBS as u64),
        "{}: worker counts",
        F::NAME
    );

    // The journal mode of the file, and the -wal file, while effectum has it open.
    let wal_file = {
        let mut name = side.path.clone().into_os_string();
        name.push("-wal");
        PathBuf::from(name)
    };
    let wal_exists = wal_file.exists();
    // Counted before the inspection's own connection is opened (the hook counts it too).
    let hooked = HOOKED_CONNECTIONS.load(Ordering::Relaxed);
    let conn = rusqlite::Connection::open(&side.path).expect("open to inspect");
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .expect("journal_mode");
    drop(conn);
    assert_eq!(mode, F::JOURNAL_MODE, "{}: journal mode", F::NAME);
    assert_eq!(
        wal_exists,
        F::JOURNAL_MODE == "wal",
        "{}: -wal file",
        F::NAME
    );

    let hook = if F::JOURNAL_MODE == "wal" {
        let refused = REFUSED_SYNCHRONOUS.load(Ordering::Relaxed);
        let journal = SEEN_JOURNAL_PRAGMA.load(Ordering::Relaxed);
        // prepare()'s connection, the writer connection (effectum's `synchronous = normal`
        // refused) and at least one pooled read connection.
        assert!(hooked >= 3, "{}: hooked connections {hooked}", F::NAME);
        assert!(refused >= 1, "{}: synchronous pragma not refused", F::NAME);
        format!(
            "; hooked connections {hooked}, `PRAGMA synchronous = ..` refused {refused}, \
             `PRAGMA journal ..` seen {journal}"
        )
    } else {
        String::new()
    };
    drop(side);
    format!(
        "{}: {CHECK_JOBS} jobs completed exactly once, all Succeeded after one run \
         ({elapsed:.2?}); journal_mode = {mode}, -wal file present: {wal_exists}{hook}",
        F::NAME
    )
}
