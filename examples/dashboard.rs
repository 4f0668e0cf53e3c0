//! The web dashboard on a busy app: jobs flowing through two queues, some failing into the
//! dead-letter state, and the dashboard served beside them.
//!
//! ```text
//! cargo run --features dashboard --example dashboard [-- SECONDS]
//! ```
//!
//! Prints the dashboard's URL (it carries the access token), then for `SECONDS` (default: until
//! interrupted) enqueues a job every 20 ms (two into the default queue for one into `mail`),
//! runs them on two worker pools (every 40th fails for good and is dead-lettered; of the
//! others, every 10th fails once and is retried), and keeps a schedule firing every 10 s in
//! `mail`. Open the URL to watch the counts and rates move,
//! retry or remove the dead jobs, pause and resume a queue.

use std::time::{Duration, Instant};

use leaseq::{EnqueueOptions, History, Queue, RetryPolicy, Schedule, WorkerPool};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let seconds: Option<u64> = std::env::args().nth(1).map(|s| s.parse()).transpose()?;
    let dir = tempfile::tempdir()?;
    let queue = Queue::builder()
        .live_reads(true)
        .retry(RetryPolicy::fixed(Duration::from_millis(500)))
        .open(dir.path().join("demo.leaseq"))?;
    queue.set_history(History::off().keep_jobs(1_000))?;
    let mail = queue.named("mail")?;
    mail.upsert_schedule(
        "digest",
        &Schedule::every(Duration::from_secs(10)).payload(br#"{"kind":"digest","n":1}"#.to_vec()),
    )?;
    let server = leaseq::dashboard::serve(&queue, "127.0.0.1:0")?;
    println!("dashboard: {}", server.url());
    println!(
        "file: {} (leaseq dashboard FILE serves it too)",
        dir.path().join("demo.leaseq").display()
    );

    let handler = |lease: &leaseq::Lease| -> Result<(), leaseq::BoxError> {
        std::thread::sleep(Duration::from_millis(30));
        let n: u64 = serde_json::from_slice::<serde_json::Value>(lease.payload())?["n"]
            .as_u64()
            .unwrap_or(0);
        if n.is_multiple_of(40) {
            return Err(format!("order {n}: card declined (for good)").into());
        }
        if n.is_multiple_of(10) && lease.attempt() == 1 {
            return Err(format!("order {n}: gateway timeout").into());
        }
        Ok(())
    };
    let pools = [
        WorkerPool::builder(&queue).threads(2).start(handler)?,
        WorkerPool::builder(&mail).threads(1).start(handler)?,
    ];
    let started = Instant::now();
    let mut n = 0u64;
    while seconds.is_none_or(|s| started.elapsed() < Duration::from_secs(s)) {
        n += 1;
        let target = if n.is_multiple_of(3) { &mail } else { &queue };
        let payload = serde_json::json!({"n": n, "to": format!("user{}@example.com", n % 97)});
        let opts = EnqueueOptions::default()
            .max_attempts(if n.is_multiple_of(40) { 1 } else { 3 })
            .idempotency_key(format!("order-{n}"));
        target.enqueue(payload.to_string().as_bytes(), opts)?;
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(server);
    for pool in pools {
        pool.shutdown(Duration::from_secs(5));
    }
    let stats = queue.stats()?;
    println!("{n} jobs enqueued; default queue: {stats:?}");
    Ok(())
}
