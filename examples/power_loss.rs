//! Testing your own `ack_with` effect under power loss, with the simulator of the `sim`
//! feature.
//!
//! ```text
//! cargo run --example power_loss --features sim [-- SEEDS]
//! ```
//!
//! For each seed: a queue on a [`SimDisk`] gets 20 jobs; a consumer applies each job's effect
//! (adding its amount to an account balance in the caller's own table) with `ack_with` until
//! the power fails at a seeded random write or sync. The disk is "rebooted" from its crash
//! image, the queue reopened and drained. Every job's amount must be in the balance exactly
//! once, whatever the crash point: the effect, its applied-ids marker and the ack commit
//! together or not at all.

use leaseq::redb::{ReadableDatabase, ReadableTable, TableDefinition};
use leaseq::sim::SimDisk;
use leaseq::{EnqueueOptions, ManualClock, Queue};

const BALANCE: TableDefinition<&str, u64> = TableDefinition::new("balance");

fn open(disk: &SimDisk) -> leaseq::Result<Queue> {
    Queue::builder()
        .clock(ManualClock::new(0))
        .open_backend(disk.backend())
}

/// The caller's effect: add `amount` to the balance, in the queue's transaction.
fn credit(tx: &leaseq::redb::WriteTransaction, amount: u64) -> Result<(), leaseq::BoxError> {
    let mut t = tx.open_table(BALANCE)?;
    let old = t.get("alice")?.map_or(0, |v| v.value());
    t.insert("alice", old + amount)?;
    Ok(())
}

fn drain(queue: &Queue) -> leaseq::Result<()> {
    while let Some(lease) = queue.dequeue()? {
        let amount: u64 = lease.decode()?;
        lease.ack_with(|tx| credit(tx, amount))?;
    }
    Ok(())
}

fn balance(queue: &Queue) -> Result<u64, Box<dyn std::error::Error>> {
    let rtx = queue.database().begin_read()?;
    Ok(match rtx.open_table(BALANCE) {
        Ok(t) => t.get("alice")?.map_or(0, |v| v.value()),
        Err(leaseq::redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => return Err(e.into()),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seeds: u64 = std::env::args().nth(1).map_or(Ok(200), |s| s.parse())?;
    let amounts: Vec<u64> = (1..=20).map(|i| i * 100).collect();
    let expected: u64 = amounts.iter().sum();
    let mut crashes_in_effects = 0;
    for seed in 0..seeds {
        let disk = SimDisk::new(seed);
        let queue = open(&disk)?;
        for (i, a) in amounts.iter().enumerate() {
            queue.enqueue_value(
                a,
                EnqueueOptions::default().idempotency_key(format!("pay-{i}")),
            )?;
        }
        // Power fails somewhere inside the consumer's work.
        disk.crash_after(fastrand::Rng::with_seed(seed).u64(0..600));
        if drain(&queue).is_err() {
            crashes_in_effects += 1;
        }
        drop(queue);

        let rebooted = SimDisk::from_image(disk.crash_image(), seed);
        let queue = open(&rebooted)?;
        drain(&queue)?;
        let got = balance(&queue)?;
        assert!(
            queue.check()?.is_empty(),
            "seed {seed}: {:?}",
            queue.check()?
        );
        assert_eq!(
            got, expected,
            "seed {seed}: an effect was lost or applied twice"
        );
    }
    println!(
        "power loss: seeds={seeds} crashes_during_effects={crashes_in_effects} balance exact every time"
    );
    Ok(())
}
