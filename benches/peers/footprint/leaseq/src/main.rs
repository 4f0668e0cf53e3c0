//! leaseq's footprint app: `fill N DIR`, `rss N DIR`, `crash N DIR`, `first DIR`
//! (benches/peers/footprint/README.md). Synchronous: no runtime, no worker pool.

#[path = "../../common.rs"]
mod common;

use common::{CHUNK, CRASH_TAKEN, Clock, Mode, payload, report, report_memory};
use leaseq::{EnqueueOptions, Queue};
use std::time::Duration;

/// Enqueues jobs `0..n`, `CHUNK` per `enqueue_batch` (one commit, fsynced before it returns).
fn fill(queue: &Queue, n: usize) {
    let mut next = 0u64;
    while (next as usize) < n {
        let len = CHUNK.min(n - next as usize);
        let payloads: Vec<Vec<u8>> = (next..next + len as u64).map(payload).collect();
        queue
            .enqueue_batch(payloads.iter().map(|p| (&p[..], EnqueueOptions::default())))
            .expect("enqueue_batch");
        next += len as u64;
    }
}

fn main() {
    let clock = Clock::start();
    let args = common::args();
    match args.mode {
        Mode::Fill(n) => {
            let queue = Queue::open(args.file()).expect("open");
            fill(&queue, n);
            report_memory();
        }
        Mode::Rss(n) => {
            let queue = Queue::open(args.file()).expect("open");
            report_memory();
            // After the report: a check that the file is the one `fill` left.
            assert_eq!(queue.len().expect("len"), n as u64, "queued jobs");
        }
        Mode::Crash(n) => {
            let queue = Queue::open(args.file()).expect("open");
            fill(&queue, n);
            // Leases held (30 s, the default) when the process dies.
            let leases: Vec<_> = (0..CRASH_TAKEN)
                .map(|_| queue.dequeue().expect("dequeue").expect("a job"))
                .collect();
            let taken: Vec<u64> = leases
                .iter()
                .map(|l| common::index_of(l.payload()))
                .collect();
            args.save_taken(&taken);
            report_memory();
            std::process::abort();
        }
        Mode::First => {
            // The open returns every lease of the crashed process to its place in the ready
            // order before the first dequeue (redb's lock proves the holder is gone).
            let queue = Queue::open(args.file()).expect("open");
            let lease = queue
                .dequeue_timeout(Duration::from_secs(120))
                .expect("dequeue")
                .expect("a job within 120 s");
            clock.report_first(common::index_of(lease.payload()), &args.taken());
            let recovery = queue.recovery();
            report("leases_returned", recovery.leases_returned);
            report("repaired", recovery.repaired);
        }
        Mode::Recover => {
            let taken = args.taken();
            let queue = Queue::open(args.file()).expect("open");
            let mut seen = common::Recovered::start(taken);
            while !seen.timed_out() {
                let Some(lease) = queue
                    .dequeue_timeout(Duration::from_secs(1))
                    .expect("dequeue")
                else {
                    continue;
                };
                let done = seen.handled(common::index_of(lease.payload()));
                lease.ack().expect("ack");
                if done {
                    break;
                }
            }
            seen.report();
        }
    }
}
