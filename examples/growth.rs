//! The file over a long run: cycles of enqueue-then-drain with `ack_with` (half the jobs under a
//! caller idempotency key), printing the file size and the table sizes after each cycle, then
//! what `prune` and `compact` give back. C20 of the scenarios, as numbers.
//!
//! ```sh
//! cargo run --release --example growth                 # 10 cycles of 10,000 jobs of 4 KiB
//! cargo run --release --example growth -- 20 5000 1024 # cycles, jobs per cycle, payload bytes
//! ```

use std::time::Duration;

use leaseq::redb::TableDefinition;
use leaseq::{Durability, EnqueueOptions, ManualClock, Queue};

const EFFECTS: TableDefinition<u64, u64> = TableDefinition::new("effects");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let cycles = args.first().copied().unwrap_or(10);
    let jobs = args.get(1).copied().unwrap_or(10_000);
    let payload_bytes = args.get(2).copied().unwrap_or(4096) as usize;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("growth.leaseq");
    let clock = ManualClock::new(1_700_000_000_000);
    let mut q = Queue::builder()
        .clock(clock.clone())
        .durability(Durability::None) // sizes are the point, not fsyncs
        .applied_retention(Some(Duration::from_secs(3600)))
        .open(&path)?;
    let size = |path: &std::path::Path| std::fs::metadata(path).map(|m| m.len());
    println!(
        "{cycles} cycles of {jobs} jobs of {payload_bytes} B; applied retention 1 h; one hour of clock per cycle"
    );
    println!("cycle  file_MiB  jobs  applied  (markers kept: within the hour)");
    println!("empty  {:8.2}", size(&path)? as f64 / 1048576.0);
    let payload = vec![7u8; payload_bytes];
    let mut n = 0u64;
    for cycle in 1..=cycles {
        for chunk in 0..jobs.div_ceil(1000) {
            let count = (jobs - chunk * 1000).min(1000);
            q.enqueue_batch((0..count).map(|_| {
                n += 1;
                let opts = if n.is_multiple_of(2) {
                    EnqueueOptions::default().idempotency_key(format!("order-{n}"))
                } else {
                    EnqueueOptions::default()
                };
                (payload.as_slice(), opts)
            }))?;
        }
        loop {
            let batch = q.dequeue_batch(1000)?;
            if batch.is_empty() {
                break;
            }
            for r in q.ack_with_batch(&batch, |tx, l| {
                tx.open_table(EFFECTS)?.insert(l.id().0 % 1000, l.id().0)?;
                Ok(())
            })? {
                r?;
            }
        }
        q.flush()?;
        let s = q.stats()?;
        println!(
            "{cycle:5}  {:8.2}  {:4}  {:7}",
            size(&path)? as f64 / 1048576.0,
            s.total,
            s.applied
        );
        clock.advance(Duration::from_secs(3600));
    }
    let pruned = q.prune()?;
    q.flush()?;
    println!(
        "prune: {} markers removed, file {:.2} MiB",
        pruned.applied,
        size(&path)? as f64 / 1048576.0
    );
    q.compact()?;
    println!("compact: file {:.2} MiB", size(&path)? as f64 / 1048576.0);
    Ok(())
}
