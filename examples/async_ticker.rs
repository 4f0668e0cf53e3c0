//! Does the async face keep a runtime responsive? A 1 ms ticker on a current-thread tokio
//! runtime measures its worst gap while 10,000 jobs flow through the queue on the same
//! runtime, first through the async face, then (the baseline) through the blocking calls
//! made straight from the tasks, as an app without the async face would.
//!
//! ```text
//! cargo run --release --features tokio --example async_ticker [-- JOBS]
//! ```
//!
//! Prints, for each side, the jobs' throughput and the ticker's worst and 99th-percentile
//! gaps, and the ratio of the worst gaps. It checks its own results (every job enqueued,
//! delivered and acked once; the queue empty), not the timings: those depend on the disk.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leaseq::{EnqueueOptions, Queue};

const PRODUCERS: usize = 4;
const CONSUMERS: usize = 4;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// What one run measured.
struct Run {
    elapsed: Duration,
    worst_gap: Duration,
    p99_gap: Duration,
}

fn main() -> Result<(), Error> {
    let jobs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let face = run(jobs, &dir.path().join("async.leaseq"), true)?;
    let blocking = run(jobs, &dir.path().join("blocking.leaseq"), false)?;
    let per_s = |r: &Run| jobs as f64 / r.elapsed.as_secs_f64();
    println!(
        "{jobs} jobs, {PRODUCERS} producer and {CONSUMERS} consumer tasks, one current-thread runtime, a 1 ms ticker"
    );
    println!(
        "{:<22} {:>10} {:>14} {:>14}",
        "", "jobs/s", "worst gap", "p99 gap"
    );
    for (name, r) in [("async face", &face), ("blocking calls", &blocking)] {
        println!(
            "{name:<22} {:>10.0} {:>11.2} ms {:>11.2} ms",
            per_s(r),
            r.worst_gap.as_secs_f64() * 1e3,
            r.p99_gap.as_secs_f64() * 1e3
        );
    }
    println!(
        "worst gap, blocking / async: {:.1}x",
        blocking.worst_gap.as_secs_f64() / face.worst_gap.as_secs_f64().max(1e-6)
    );
    Ok(())
}

fn run(jobs: usize, path: &std::path::Path, through_face: bool) -> Result<Run, Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let queue = Queue::open(path)?;
    rt.block_on(async move {
        let done = Arc::new(AtomicBool::new(false));
        let ticker = {
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut gaps = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut last = Instant::now();
                while !done.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let now = Instant::now();
                    gaps.push(now - last);
                    last = now;
                }
                gaps
            })
        };
        let started = Instant::now();
        let produced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let per = jobs / PRODUCERS;
        let mut tasks = Vec::new();
        for p in 0..PRODUCERS {
            let (q, produced) = (queue.clone(), Arc::clone(&produced));
            let n = if p == PRODUCERS - 1 {
                jobs - per * (PRODUCERS - 1)
            } else {
                per
            };
            tasks.push(tokio::spawn(async move {
                let aq = q.to_async();
                for i in 0..n {
                    let body = format!("job {p}-{i}");
                    if through_face {
                        aq.enqueue(body.as_bytes(), EnqueueOptions::default())
                            .await?;
                    } else {
                        q.enqueue(body.as_bytes(), EnqueueOptions::default())?;
                        tokio::task::yield_now().await;
                    }
                }
                produced.fetch_add(1, Ordering::SeqCst);
                Ok::<usize, Error>(0)
            }));
        }
        for _ in 0..CONSUMERS {
            let (q, produced) = (queue.clone(), Arc::clone(&produced));
            tasks.push(tokio::spawn(async move {
                let aq = q.to_async();
                let all_in = || produced.load(Ordering::SeqCst) == PRODUCERS;
                let mut acked = 0;
                loop {
                    if through_face {
                        match aq.dequeue_timeout(Duration::from_millis(200)).await? {
                            Some(lease) => {
                                lease.ack().await?;
                                acked += 1;
                            }
                            None if all_in() && q.is_empty()? => return Ok::<usize, Error>(acked),
                            None => {}
                        }
                    } else {
                        match q.dequeue()? {
                            Some(lease) => {
                                lease.ack()?;
                                acked += 1;
                            }
                            None if all_in() && q.is_empty()? => return Ok(acked),
                            None => tokio::time::sleep(Duration::from_millis(1)).await,
                        }
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        let mut acked = 0;
        for t in tasks {
            acked += t.await??;
        }
        let elapsed = started.elapsed();
        done.store(true, Ordering::Relaxed);
        let mut gaps = ticker.await?;
        // Its own results: every job acked once, nothing left.
        assert_eq!(acked, jobs, "every job acked once");
        assert_eq!(queue.stats()?.total, 0, "the queue is empty");
        gaps.sort();
        let worst_gap = gaps.last().copied().unwrap_or_default();
        let p99_gap = gaps.get(gaps.len() * 99 / 100).copied().unwrap_or_default();
        Ok(Run {
            elapsed,
            worst_gap,
            p99_gap,
        })
    })
}
