//! effectum 0.7's footprint app: `fill N DIR`, `rss N DIR`, `crash N DIR`, `first DIR`
//! (benches/peers/footprint/README.md). effectum as it ships: `Queue::new(path)`, one
//! `Worker` with a `JobRunner`, on a tokio runtime of 2 worker threads.

#[path = "../../common.rs"]
mod common;

use common::{CHUNK, CRASH_TAKEN, Clock, Mode, payload, report_memory};
use effectum::{Job, JobRunner, Queue, RunningJob, Worker};
use std::sync::{Arc, Mutex, mpsc};

const JOB_TYPE: &str = "footprint";

/// What the handler shares with main: where it reports each job it was handed, and whether
/// it holds the job.
#[derive(Debug)]
struct Ctx {
    entered: Mutex<mpsc::Sender<u64>>,
    hold: bool,
}

/// Reports the job, then never returns (the job stays running until the process ends),
/// except in `recover`, where it succeeds at once.
async fn handle(job: RunningJob, ctx: Arc<Ctx>) -> Result<(), String> {
    let _ = ctx
        .entered
        .lock()
        .unwrap()
        .send(common::index_of(&job.payload));
    if ctx.hold {
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// Enqueues jobs `0..n`, `CHUNK` per `add_jobs` (one writer operation, answered after its
/// commit).
async fn fill(queue: &Queue, n: usize) {
    let mut next = 0u64;
    while (next as usize) < n {
        let len = CHUNK.min(n - next as usize);
        let jobs = (next..next + len as u64)
            .map(|i| Job::builder(JOB_TYPE).payload(payload(i)).build())
            .collect();
        queue.add_jobs(jobs).await.expect("add_jobs");
        next += len as u64;
    }
}

/// Starts one worker of `concurrency`; returns it and the receiver of handled indices.
async fn worker(queue: &Queue, concurrency: u16, hold: bool) -> (Worker, mpsc::Receiver<u64>) {
    let (tx, rx) = mpsc::channel();
    let ctx = Arc::new(Ctx {
        entered: Mutex::new(tx),
        hold,
    });
    let runner = JobRunner::builder(JOB_TYPE, handle).build();
    let worker = Worker::builder(queue, ctx)
        .min_concurrency(concurrency)
        .max_concurrency(concurrency)
        .jobs([runner])
        .build()
        .await
        .expect("start the worker");
    (worker, rx)
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
                let queue = Queue::new(&file).await.expect("open");
                fill(&queue, n).await;
                report_memory();
                queue
                    .close(std::time::Duration::from_secs(10))
                    .await
                    .expect("close");
            }
            Mode::Rss(n) => {
                let queue = Queue::new(&file).await.expect("open");
                report_memory();
                let active = queue.num_active_jobs().await.expect("num_active_jobs");
                assert_eq!(active.pending, n as u64, "queued jobs");
                queue
                    .close(std::time::Duration::from_secs(10))
                    .await
                    .expect("close");
            }
            Mode::Crash(n) => {
                let queue = Queue::new(&file).await.expect("open");
                fill(&queue, n).await;
                let (_worker, rx) = worker(&queue, CRASH_TAKEN as u16, true).await;
                // Each handler entered after effectum committed its claim (the job running).
                let taken: Vec<u64> = (0..CRASH_TAKEN)
                    .map(|_| rx.recv().expect("a handler entered"))
                    .collect();
                args.save_taken(&taken);
                report_memory();
                std::process::abort();
            }
            Mode::First => {
                // Queue::new fails every job the crashed process had running and retries it
                // at once (run_at = now), before the writer thread starts.
                let queue = Queue::new(&file).await.expect("open");
                let (_worker, rx) = worker(&queue, 1, true).await;
                let index = tokio::task::spawn_blocking(move || rx.recv().expect("first job"))
                    .await
                    .expect("join");
                clock.report_first(index, &args.taken());
                std::process::exit(0);
            }
            Mode::Recover => {
                let taken = args.taken();
                let queue = Queue::new(&file).await.expect("open");
                let (_worker, rx) = worker(&queue, 1, false).await;
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
