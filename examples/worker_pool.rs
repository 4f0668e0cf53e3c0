//! A worker pool with an exactly-once effect: payments applied to the app's own table in the
//! queue's file, each with a follow-up job for a second pool.
//!
//! ```text
//! cargo run --example worker_pool [-- ORDERS]
//! ```
//!
//! 1. `ORDERS` payment jobs (default 2,000) go into the default queue, keyed `order-N` as
//!    their idempotency key, plus a producer retry (the same key again) for every tenth.
//! 2. A pool of 4 workers runs an effect handler inside `Lease::ack_with`: it adds the order
//!    to the `paid` table and enqueues a receipt job into the `receipts` queue, in the commit
//!    that acks the payment. A retried order finds its key applied and is acked untouched.
//! 3. A pool of 2 workers on `receipts` runs a plain handler that "sends" each receipt; one in
//!    500 has a bad address and is dead-lettered with `Outcome::Fail`.
//! 4. Both pools shut down; the summary checks every order was paid exactly once and every
//!    receipt sent or dead, and the exit code is non-zero if not.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use leaseq::redb::{ReadableDatabase, ReadableTable, TableDefinition};
use leaseq::{EnqueueOptions, Outcome, Queue, WorkerPool};

/// order -> times paid: the effect, and its evidence.
const PAID: TableDefinition<u64, u64> = TableDefinition::new("paid");

type Error = Box<dyn std::error::Error + Send + Sync>;

fn order_of(payload: &[u8]) -> Result<u64, Error> {
    Ok(std::str::from_utf8(payload)?
        .trim_start_matches("order-")
        .parse()?)
}

fn main() -> Result<ExitCode, Error> {
    let orders: u64 = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 2_000,
    };
    let dir = tempfile::tempdir()?;
    let queue = Queue::open(dir.path().join("shop.leaseq"))?;
    let receipts = queue.named("receipts")?;

    let jobs: Vec<(String, EnqueueOptions)> = (0..orders)
        .chain((0..orders).step_by(10)) // producer retries: the same key again
        .map(|n| {
            let key = format!("order-{n}");
            (key.clone(), EnqueueOptions::default().idempotency_key(key))
        })
        .collect();
    for chunk in jobs.chunks(leaseq::BATCH_MAX) {
        queue.enqueue_batch(chunk.iter().map(|(p, o)| (p.as_bytes(), o.clone())))?;
    }
    let commits_before = queue.commit_stats().commits;
    let started = Instant::now();

    let payments = {
        let receipts = receipts.clone();
        WorkerPool::builder(&queue)
            .threads(4)
            .thread_name("payments")
            .start_effects(move |tx, lease| {
                let order = order_of(lease.payload())?;
                let mut paid = tx.open_table(PAID)?;
                let times = paid.get(order)?.map_or(0, |v| v.value());
                paid.insert(order, times + 1)?;
                tx.enqueue_to(&receipts, lease.payload(), EnqueueOptions::default())?;
                Ok(())
            })?
    };
    let mailer = WorkerPool::builder(&receipts)
        .threads(2)
        .thread_name("receipts")
        .start(|lease| {
            let order = order_of(lease.payload())?;
            if order % 500 == 499 {
                return Err(Outcome::Fail(format!("order {order}: bad address")).into());
            }
            Ok(()) // "sent"
        })?;

    while !queue.is_empty()? || !receipts.is_empty()? {
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    let pay = payments.shutdown(Duration::from_secs(10));
    let mail = mailer.shutdown(Duration::from_secs(10));

    let (paid_rows, paid_twice) = {
        let read = queue.database().begin_read()?;
        let paid = read.open_table(PAID)?;
        let (mut rows, mut twice) = (0u64, 0u64);
        for row in paid.iter()? {
            let (_, times) = row?;
            rows += 1;
            twice += u64::from(times.value() != 1);
        }
        (rows, twice)
    };
    let jobs = pay.stats.acked + mail.stats.acked + mail.stats.failed;
    println!(
        "payments: {} jobs ({} applied, {} already applied) by 4 workers",
        pay.stats.acked,
        pay.stats.acked - pay.stats.already_applied,
        pay.stats.already_applied
    );
    println!(
        "receipts: {} sent, {} dead (bad address) by 2 workers",
        mail.stats.acked, mail.stats.failed
    );
    println!(
        "{jobs} jobs in {:.0} ms: {:.0} jobs/s, {} commits; {} heartbeats, {} polls",
        elapsed.as_secs_f64() * 1e3,
        jobs as f64 / elapsed.as_secs_f64(),
        queue.commit_stats().commits - commits_before,
        pay.stats.heartbeats + mail.stats.heartbeats,
        pay.stats.polls + mail.stats.polls
    );
    let dead = receipts.stats()?.dead;
    let ok = paid_rows == orders
        && paid_twice == 0
        && mail.stats.acked + dead == orders
        && queue.check()?.is_empty();
    println!(
        "verified: orders={orders} paid={paid_rows} paid_twice={paid_twice} receipts_sent={} dead={dead}: {}",
        mail.stats.acked,
        if ok { "ok" } else { "MISMATCH" }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
