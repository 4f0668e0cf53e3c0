//! apalis 1.0 with apalis-sqlite 1.0's footprint app: `fill N DIR`, `rss N DIR`,
//! `crash N DIR`, `first DIR` (benches/peers/footprint/README.md). Set up as apalis-sqlite's
//! README's "Basic Worker": `SqlitePool::connect`, `SqliteStorage::setup`,
//! `SqliteStorage::new`, one worker from `WorkerBuilder`, on a tokio runtime of 2 worker
//! threads. The job's argument is the payload as a `Vec<u8>` (apalis's JSON codec).
//!
//! The worker's name: `FP_APALIS_WORKER` if set, else `footprint-<pid>` (a new name per
//! process). apalis-sqlite refuses to register a worker whose name was seen alive (its
//! heartbeat) less than `heartbeat_interval` (30 s) ago, so an app that restarts under the
//! same name within 30 s of a crash gets `WORKER_ALREADY_EXISTS`.

#[path = "../../common.rs"]
mod common;

use apalis::prelude::*;
use apalis_sqlite::{SqlitePool, SqliteStorage};
use common::{CHUNK, CRASH_TAKEN, Clock, Mode, payload, report_memory};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};

type Args = Vec<u8>;

/// Where the handler reports each job it was handed.
static ENTERED: OnceLock<Mutex<mpsc::Sender<u64>>> = OnceLock::new();
/// Whether the handler holds its job (all modes but `recover`).
static HOLD: AtomicBool = AtomicBool::new(true);

/// Reports the job, then never returns (the job stays locked by this worker), except in
/// `recover`, where it succeeds at once.
async fn handle(job: Args) -> Result<(), BoxDynError> {
    if let Some(tx) = ENTERED.get() {
        let _ = tx.lock().unwrap().send(common::index_of(&job));
    }
    if HOLD.load(Ordering::Relaxed) {
        std::future::pending::<()>().await;
    }
    Ok(())
}

async fn open(file: &std::path::Path) -> (SqlitePool, SqliteStorage<Args>) {
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let pool = SqlitePool::connect(&url).await.expect("connect");
    SqliteStorage::setup(&pool).await.expect("setup");
    let storage = SqliteStorage::<Args>::new(&pool);
    (pool, storage)
}

/// Pushes jobs `0..n`, `CHUNK` per `push_bulk` (one transaction, committed on return).
async fn fill(storage: &SqliteStorage<Args>, n: usize) {
    let mut storage = storage.clone();
    let mut next = 0u64;
    while (next as usize) < n {
        let len = CHUNK.min(n - next as usize);
        let jobs: Vec<Args> = (next..next + len as u64).map(payload).collect();
        storage.push_bulk(jobs).await.expect("push_bulk");
        next += len as u64;
    }
}

/// Starts one worker of `concurrency` on the runtime; returns the receiver of handled
/// indices.
fn worker(storage: &SqliteStorage<Args>, concurrency: usize) -> mpsc::Receiver<u64> {
    let (tx, rx) = mpsc::channel();
    ENTERED.set(Mutex::new(tx)).expect("one worker per process");
    let name =
        std::env::var("FP_APALIS_WORKER").unwrap_or_else(|_| format!("footprint-{}", std::process::id()));
    let worker = WorkerBuilder::new(name)
        .backend(storage.clone())
        .concurrency(concurrency)
        .build(handle);
    tokio::spawn(async move {
        if let Err(e) = worker.run().await {
            eprintln!("apalis worker ended: {e}");
            std::process::exit(3);
        }
    });
    rx
}

fn main() {
    let clock = Clock::start();
    let args = common::args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let file = args.file();
    runtime.block_on(async {
        match args.mode {
            Mode::Fill(n) => {
                let (pool, storage) = open(&file).await;
                fill(&storage, n).await;
                report_memory();
                pool.close().await;
            }
            Mode::Rss(n) => {
                let (pool, _storage) = open(&file).await;
                report_memory();
                let (pending,): (i64,) =
                    sqlx::query_as("SELECT COUNT(*) FROM Jobs WHERE status = 'Pending'")
                        .fetch_one(&pool)
                        .await
                        .expect("count");
                assert_eq!(pending as usize, n, "queued jobs");
                pool.close().await;
            }
            Mode::Crash(n) => {
                let (_pool, storage) = open(&file).await;
                fill(&storage, n).await;
                let rx = worker(&storage, CRASH_TAKEN);
                // Each handler entered after apalis-sqlite committed its fetch (the job
                // `Queued`, locked by this worker).
                let taken: Vec<u64> = tokio::task::spawn_blocking(move || {
                    (0..CRASH_TAKEN)
                        .map(|_| rx.recv().expect("a handler entered"))
                        .collect()
                })
                .await
                .expect("join");
                args.save_taken(&taken);
                report_memory();
                std::process::abort();
            }
            Mode::First => {
                // Nothing runs at open for the crashed worker's jobs: they stay locked by its
                // name until a live worker's heartbeat finds that worker silent for
                // `missed_heartbeats x heartbeat_interval` (60 s), or a worker of the same name
                // registers after 30 s.
                let (_pool, storage) = open(&file).await;
                let rx = worker(&storage, 1);
                let index = tokio::task::spawn_blocking(move || rx.recv().expect("first job"))
                    .await
                    .expect("join");
                clock.report_first(index, &args.taken());
                std::process::exit(0);
            }
            Mode::Recover => {
                let taken = args.taken();
                let (_pool, storage) = open(&file).await;
                HOLD.store(false, Ordering::Relaxed);
                let rx = worker(&storage, 1);
                tokio::task::spawn_blocking(move || {
                    let mut seen = common::Recovered::start(taken);
                    while !seen.timed_out() {
                        match rx.recv_timeout(std::time::Duration::from_secs(1)) {
                            Ok(index) if seen.handled(index) => break,
                            _ => {}
                        }
                    }
                    seen.report();
                })
                .await
                .expect("join");
                std::process::exit(0);
            }
        }
    });
}
