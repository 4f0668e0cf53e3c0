//! leaseq against apalis 1.0 with apalis-sqlite 1.0 (SQLite through sqlx 0.9), with the
//! harness of `benches/peers/common`: leaseq's side and two apalis-sqlite sides.
//!
//! - `apalis_sqlite`: as it ships, set up as its README shows (the event-driven "hooked"
//!   example: `SqliteStorage::connect_with_callback`, `SqliteStorage::setup`, a poll strategy
//!   of the update-hook stream in `ready_chunks(batch_size)` with a 500 ms interval as the
//!   fallback). `setup()` runs `PRAGMA journal_mode = WAL` (persistent: every connection) and
//!   `PRAGMA synchronous = OFF` on the one pooled connection it happens to run on; the pool's
//!   other connections keep SQLite's compiled default, FULL (sqlx sets no `synchronous` and no
//!   `journal_mode` unless asked). Which connection commits a push, a fetch or an ack is up to
//!   the pool, so some commits are fsynced and others never are.
//! - `apalis_sqlite_full`: at leaseq's durability: WAL with `synchronous = FULL` on every
//!   connection of the pool (`setup()` runs on a throwaway one-connection pool, closed before
//!   the benchmark's pool opens with `synchronous(Full)`, and setup()'s other per-connection
//!   pragmas, which do not touch durability, set on every connection). The same update hook
//!   as `connect_with_callback` installs, in an `after_connect` of our own.
//!
//! What apalis-sqlite does per job: the push is one transaction (one INSERT; `push_bulk`: one
//! transaction of one INSERT per task), committed before `push` returns; the worker's fetch is
//! a write transaction (`UPDATE ... SET status = 'Queued' ... RETURNING`, up to `batch_size`
//! = 10 jobs); the handler's lock and completion go through a channel of the worker and are
//! committed together, in one transaction per drain of that channel (no timer: drained when
//! the worker loop next polls its backend). So, at FULL, three fsyncs per job when jobs come
//! one at a time. The update hook fires at the INSERT, before its commit, so the woken fetch
//! usually meets the pusher's write lock and sleeps in SQLite's busy handler (1, 2, 5 ms...).
//!
//! A lost wake-up in apalis-core 1.0 (`PollWith` ignores what its strategy reports: a hook
//! item consumed while a fetch that started before the insert is in flight is dropped, and
//! `IntervalStrategy` re-arms its timer without polling it) leaves a job waiting for the
//! fallback interval (500 ms) and, rarely, for the next heartbeat (30 s): both sides show it.
//!
//! apalis-sqlite keeps every `Done` row (with its result) until the user calls
//! `Vacuum::vacuum`, and its ack (`UPDATE Jobs ... FROM json_each(?) WHERE Jobs.id = j.task_id
//! AND Jobs.lock_by = ?`) is planned as a search of `Jobs` by `lock_by`: every job the worker
//! ever ran, times the ack's JSON. Its cost grows with the jobs the instance has completed, so
//! its numbers depend on how many jobs criterion ran before (each benchmark has a fresh file).
//!
//! Workers: one apalis worker with `.concurrency(consumers)` (the `concurrency` layer of
//! `apalis::layers::WorkerBuilderExt`), a handler that does nothing and succeeds. Jobs: the
//! 64-byte payload as a `Vec<u8>` argument in apalis's default JSON codec (a JSON array of
//! numbers, 225 bytes). Completion: the storage's `Jobs` table read back until the job's row
//! is `Done` (the ack apalis commits), polled every `COMPLETION_POLL` on a connection of its
//! own (apalis's `WaitForCompletion::wait_for` polls every 500 ms and needs task ids, which
//! `push` does not return).
//!
//! Before criterion runs, a self check drives each apalis side with 200 jobs through 4
//! workers and asserts every job ended `Done` after one run, and prints the `synchronous`
//! pragma of every connection of each pool; leaseq's side is checked too (`LEASEQ_PEERS_CHECK=1`:
//! the checks only).

use std::path::Path;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_sqlite::SqliteStorage;
use criterion::Criterion;
use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use peers_common::{LeaseqSide, Side, for_each_group, payload, run};
use sqlx::pool::PoolOptions;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqliteOperation, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Connection, Sqlite, SqliteConnection, SqlitePool};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

/// The task's argument: the payload, encoded by apalis's default codec (JSON).
type Args = Vec<u8>;

/// How often `wait_completed` reads the `Jobs` table while it waits.
const COMPLETION_POLL: Duration = Duration::from_micros(100);

/// The fallback interval of the worker's poll strategy (the README's hooked example).
const FALLBACK_POLL: Duration = Duration::from_millis(500);

/// How long `wait_completed` waits before it declares jobs lost.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Calls of the handler, all sides together (the self check reads it).
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// The handler: does nothing and succeeds.
async fn handle(_job: Args) -> Result<(), BoxDynError> {
    HANDLED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The update hook's stream of inserted jobs (`Sync`, as the poll strategy requires).
type HookStream = Pin<Box<dyn Stream<Item = ()> + Send + Sync + 'static>>;

/// How a side opens its pool: the wake-up stream of the update hook comes with it.
trait Flavor: Send + Sync + 'static {
    const NAME: &'static str;
    /// What every connection of the pool must report as `PRAGMA synchronous` (None: mixed
    /// as shipped, reported only).
    const EXPECTED_SYNCHRONOUS: Option<i64>;

    /// Opens the pool on `path`, runs `SqliteStorage::setup`, and returns the pool with the
    /// stream the update hook feeds (one item per inserted job).
    fn connect(path: &Path) -> impl Future<Output = (SqlitePool, HookStream)> + Send;
}

/// apalis-sqlite as it ships: `connect_with_callback` then `setup` on the same pool.
struct AsShipped;

impl Flavor for AsShipped {
    const NAME: &'static str = "apalis_sqlite";
    const EXPECTED_SYNCHRONOUS: Option<i64> = None;

    async fn connect(path: &Path) -> (SqlitePool, HookStream) {
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let (pool, listener) =
            SqliteStorage::connect_with_callback(&url).expect("connect_with_callback");
        SqliteStorage::setup(&pool).await.expect("setup");
        (pool, Box::pin(listener))
    }
}

/// WAL with `synchronous = FULL` on every connection.
struct Full;

impl Flavor for Full {
    const NAME: &'static str = "apalis_sqlite_full";
    const EXPECTED_SYNCHRONOUS: Option<i64> = Some(2);

    async fn connect(path: &Path) -> (SqlitePool, HookStream) {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
        // `setup()` on a pool of its own: its `synchronous = OFF` (and its other
        // per-connection pragmas) end with that pool; the migrations and WAL stay in the file.
        let setup_pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .expect("connect the setup pool");
        SqliteStorage::setup(&setup_pool).await.expect("setup");
        setup_pool.close().await;
        // setup()'s other per-connection pragmas, on every connection (they do not touch
        // durability): only `synchronous` differs from the as-shipped pool's setup connection.
        let options = options
            .pragma("temp_store", "MEMORY")
            .pragma("cache_size", "64000")
            .pragma("journal_size_limit", "67108864");
        // The update hook `connect_with_callback` installs (inserts into `Jobs`), on the
        // default pool options as there.
        let (tx, rx) = mpsc::unbounded::<()>();
        let pool = PoolOptions::<Sqlite>::new()
            .after_connect(move |conn, _| {
                let tx = tx.clone();
                Box::pin(async move {
                    let mut handle = conn.lock_handle().await?;
                    handle.set_update_hook(move |event| {
                        if event.operation == SqliteOperation::Insert && event.table == "Jobs" {
                            let _ = tx.unbounded_send(());
                        }
                    });
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        (pool, Box::pin(SyncStream(Mutex::new(rx))))
    }
}

/// A receiver made `Sync` (as apalis-sqlite's `HookCallbackListener` is), which the poll
/// strategy requires.
struct SyncStream<S>(Mutex<S>);

impl<S: Stream + Unpin> Stream for SyncStream<S> {
    type Item = S::Item;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        self.0.lock().unwrap().poll_next_unpin(cx)
    }
}

/// Jobs completed, read from the storage's table on a connection of its own.
struct Tracker {
    /// Taken (and closed) when the side is dropped.
    conn: Option<SqliteConnection>,
    /// Every row up to this rowid is `Done` (rowids follow the commit order of inserts).
    base_rowid: i64,
    /// Rows up to `base_rowid`.
    base_done: u64,
    /// Completions returned by `wait_completed` so far.
    waited: u64,
}

impl Tracker {
    /// Jobs `Done` in the committed state of the table.
    async fn done(&mut self) -> u64 {
        let rows: Vec<(i64, bool)> = sqlx::query_as(
            "SELECT ROWID, status = 'Done' FROM Jobs WHERE ROWID > ?1 ORDER BY ROWID",
        )
        .bind(self.base_rowid)
        .fetch_all(self.conn.as_mut().expect("open until dropped"))
        .await
        .expect("read the Jobs table");
        let mut prefix = true;
        let mut later = 0;
        for (rowid, done) in rows {
            if !done {
                prefix = false;
            } else if prefix {
                self.base_rowid = rowid;
                self.base_done += 1;
            } else {
                later += 1;
            }
        }
        self.base_done + later
    }
}

/// An apalis-sqlite queue with one worker of `consumers` concurrent jobs.
struct ApalisSide<F: Flavor> {
    runtime: Option<Runtime>,
    pool: SqlitePool,
    storage: SqliteStorage<Args>,
    tracker: Mutex<Tracker>,
    stop: Option<oneshot::Sender<()>>,
    worker: Option<tokio::task::JoinHandle<Result<(), WorkerError>>>,
    _flavor: std::marker::PhantomData<F>,
}

type ApalisAsShipped = ApalisSide<AsShipped>;
type ApalisFull = ApalisSide<Full>;

impl<F: Flavor> Side for ApalisSide<F> {
    const NAME: &'static str = F::NAME;

    fn open(dir: &Path, consumers: usize) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let path = dir.join("bench.sqlite");
        let (pool, hook, tracker) = runtime.block_on(async {
            let (pool, hook) = F::connect(&path).await;
            let conn = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&path))
                .await
                .expect("connect the completion reader");
            let tracker = Tracker {
                conn: Some(conn),
                base_rowid: 0,
                base_done: 0,
                waited: 0,
            };
            (pool, hook, tracker)
        });
        let storage = SqliteStorage::<Args>::new(&pool);
        let (stop, worker) = if consumers > 0 {
            let config = apalis_sqlite::Config::default();
            let strategy = Strategy::new()
                .stream(hook.ready_chunks(config.batch_size))
                .interval(FALLBACK_POLL);
            let backend = storage.clone().poll_with_strategy(strategy);
            let worker = WorkerBuilder::new("bench-worker")
                .backend(backend)
                .concurrency(consumers)
                .build(handle);
            let (stop, stopped) = oneshot::channel::<()>();
            let worker = runtime.spawn(worker.run_until(async move {
                let _ = stopped.await;
                Ok::<(), WorkerError>(())
            }));
            (Some(stop), Some(worker))
        } else {
            drop(hook);
            (None, None)
        };
        ApalisSide {
            runtime: Some(runtime),
            pool,
            storage,
            tracker: Mutex::new(tracker),
            stop,
            worker,
            _flavor: std::marker::PhantomData,
        }
    }

    fn enqueue(&self, payload: &[u8]) {
        // `push` sends one task through the storage's sink and flushes it: one transaction,
        // committed before it returns.
        let mut storage = self.storage.clone();
        self.block_on(storage.push(payload.to_vec())).expect("push");
    }

    fn enqueue_batch(&self, payloads: &[Vec<u8>]) {
        // `push_bulk` buffers every task in the sink and flushes once: one transaction.
        let mut storage = self.storage.clone();
        self.block_on(storage.push_bulk(payloads.to_vec()))
            .expect("push_bulk");
    }

    fn wait_completed(&self, n: usize) {
        let mut tracker = self.tracker.lock().unwrap();
        let target = tracker.waited + n as u64;
        let deadline = Instant::now() + WAIT_LIMIT;
        while self.block_on(tracker.done()) < target {
            assert!(
                Instant::now() < deadline,
                "{}: {n} jobs not completed within {WAIT_LIMIT:?}",
                F::NAME
            );
            thread::sleep(COMPLETION_POLL);
        }
        tracker.waited = target;
    }
}

impl<F: Flavor> ApalisSide<F> {
    fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime
            .as_ref()
            .expect("open until dropped")
            .block_on(future)
    }

    /// `PRAGMA synchronous` and `journal_mode` of every connection the pool holds (they must
    /// all be idle: the pool opens a new one when none is).
    fn connections(&self) -> Vec<(i64, String)> {
        self.block_on(async {
            let mut held = Vec::new();
            for _ in 0..self.pool.size() {
                held.push(self.pool.acquire().await.expect("acquire"));
            }
            let mut pragmas = Vec::new();
            for conn in &mut held {
                let (synchronous,): (i64,) = sqlx::query_as("PRAGMA synchronous")
                    .fetch_one(&mut **conn)
                    .await
                    .expect("PRAGMA synchronous");
                let (journal,): (String,) = sqlx::query_as("PRAGMA journal_mode")
                    .fetch_one(&mut **conn)
                    .await
                    .expect("PRAGMA journal_mode");
                pragmas.push((synchronous, journal));
            }
            pragmas
        })
    }

    /// Every job's status and attempts.
    fn jobs(&self) -> Vec<(String, i64)> {
        self.block_on(
            sqlx::query_as("SELECT status, attempts FROM Jobs ORDER BY ROWID")
                .fetch_all(&self.pool),
        )
        .expect("read the jobs")
    }
}

impl<F: Flavor> Drop for ApalisSide<F> {
    fn drop(&mut self) {
        let runtime = self.runtime.take().expect("dropped once");
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(worker) = self.worker.take() {
            match runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), worker).await })
            {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => eprintln!("{}: worker ended with {e}", F::NAME),
                Ok(Err(e)) => eprintln!("{}: worker task failed: {e}", F::NAME),
                Err(_) => eprintln!("{}: worker did not stop within 10 s", F::NAME),
            }
        }
        let conn = self.tracker.get_mut().unwrap().conn.take();
        runtime.block_on(async {
            if let Some(conn) = conn {
                let _ = conn.close().await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(10), self.pool.close()).await;
        });
        runtime.shutdown_timeout(Duration::from_secs(5));
    }
}

/// Runs 200 jobs (100 single pushes from 4 threads, one batch of 100) through a side with 4
/// workers; asserts every job ended `Done` after exactly one run and prints the pragmas of
/// every connection of the pool.
fn self_check<F: Flavor>() {
    const SINGLES: usize = 100;
    const BATCH: usize = 100;
    let dir = tempfile::tempdir().expect("tempdir");
    let side = ApalisSide::<F>::open(dir.path(), 4);
    let handled = HANDLED.load(Ordering::Relaxed);
    let payload = payload();
    let started = Instant::now();
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..SINGLES / 4 {
                    side.enqueue(&payload);
                }
            });
        }
        side.enqueue_batch(&vec![payload.clone(); BATCH]);
    });
    side.wait_completed(SINGLES + BATCH);
    let elapsed = started.elapsed();
    // Let the worker settle (an empty fetch after the last ack), so no connection is in use.
    thread::sleep(Duration::from_millis(200));
    let jobs = side.jobs();
    assert_eq!(jobs.len(), SINGLES + BATCH, "{}: rows in Jobs", F::NAME);
    for (status, attempts) in &jobs {
        assert_eq!(status, "Done", "{}: a job's status", F::NAME);
        assert_eq!(*attempts, 1, "{}: a job's attempts", F::NAME);
    }
    let runs = HANDLED.load(Ordering::Relaxed) - handled;
    assert_eq!(runs, (SINGLES + BATCH) as u64, "{}: handler runs", F::NAME);
    let connections = side.connections();
    eprintln!(
        "self check {}: {} jobs Done once each in {elapsed:.2?}; pool connections \
         (synchronous 0=OFF 2=FULL, journal_mode): {connections:?}",
        F::NAME,
        jobs.len()
    );
    for (synchronous, journal) in &connections {
        assert_eq!(journal, "wal", "{}: journal_mode", F::NAME);
        if let Some(expected) = F::EXPECTED_SYNCHRONOUS {
            assert_eq!(*synchronous, expected, "{}: synchronous", F::NAME);
        }
    }
    drop(side);
}

/// The encoded size of the task's argument (apalis's JSON codec).
fn encoded_len() -> usize {
    Codec::<Args>::encode(&apalis_sqlite::JsonCodec::<Args>::default(), &payload())
        .expect("encode")
        .len()
}

fn main() {
    eprintln!(
        "apalis-sqlite job argument: {} payload bytes, {} bytes encoded (JSON)",
        peers_common::PAYLOAD_LEN,
        encoded_len()
    );
    if !std::env::args().any(|a| a == "--list") {
        println!("{}", peers_common::check_leaseq());
        self_check::<AsShipped>();
        self_check::<Full>();
        if peers_common::check_only() {
            return;
        }
    }
    let mut c = Criterion::default().configure_from_args();
    for_each_group(&mut c, "apalis", |g, kind| {
        peers_common::run_sides(
            g,
            kind,
            &[run::<LeaseqSide>, run::<ApalisAsShipped>, run::<ApalisFull>],
        );
    });
    c.final_summary();
}
