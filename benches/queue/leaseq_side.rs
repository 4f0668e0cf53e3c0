//! leaseq as a `QueueUnderTest`: the same logical steps as the SQLite side, every call
//! durable (`Durability::Immediate`) before it returns. `LeaseqQueue<true>` opens the file with
//! `Builder::live_reads` (redb's SingleWriter mode), the cost of letting other processes read
//! it live (the journal is off in that mode); `LeaseqQueue<false, false>` with
//! `Builder::metrics(false)`, the cost of the per-minute metrics; `LeaseqQueue<false, true,
//! false>` with `Builder::journal(false)`, every commit a durable redb commit (the default
//! before the write-ahead journal); `LeaseqQueue<false, true, true, true>` with a size limit
//! (`Queue::set_limit`) the benchmark never fills, the cost of checking it at every enqueue
//! and of counting payload bytes at every move of a job; `LeaseqQueue<false, true, true,
//! false, false>` with `Builder::disk_reserve(0)`, no disk reserve (the default's look at the
//! disk before every commit, and its reserve file, left out).

use std::path::Path;
use std::time::Duration;

use leaseq::{EnqueueOptions, Lease, Queue, QueueLimit, WhenFull};
use redb::TableDefinition;

use crate::common::QueueUnderTest;

/// The effect row: job id -> a copy of its payload (as the SQLite side's `effects` table).
const EFFECTS: TableDefinition<u64, &[u8]> = TableDefinition::new("effects");

/// The limited side's bounds, far above what any run holds: every enqueue checks the limit
/// and every move of a job counts its bytes, and none is ever refused.
const NEVER_FULL: u64 = u64::MAX / 2;

pub struct LeaseqQueue<
    const LIVE_READS: bool = false,
    const METRICS: bool = true,
    const JOURNAL: bool = true,
    const LIMITED: bool = false,
    const RESERVE: bool = true,
> {
    queue: Queue,
}

fn expect_applied(applied: leaseq::Applied) {
    assert_eq!(
        applied,
        leaseq::Applied::Now,
        "a job's effect was already applied"
    );
}

impl<
    const LIVE_READS: bool,
    const METRICS: bool,
    const JOURNAL: bool,
    const LIMITED: bool,
    const RESERVE: bool,
> QueueUnderTest for LeaseqQueue<LIVE_READS, METRICS, JOURNAL, LIMITED, RESERVE>
{
    const NAME: &'static str = match (LIVE_READS, METRICS, JOURNAL, LIMITED, RESERVE) {
        (false, true, true, false, true) => "leaseq",
        (false, true, true, false, false) => "leaseq_no_reserve",
        (false, true, true, true, _) => "leaseq_limited",
        (false, true, false, _, _) => "leaseq_no_journal",
        (true, true, _, _, _) => "leaseq_live_reads",
        (false, false, _, _, _) => "leaseq_no_metrics",
        (true, false, _, _, _) => "leaseq_live_reads_no_metrics",
    };
    type Job = Lease;

    fn open(dir: &Path) -> Self {
        let builder = Queue::builder()
            .live_reads(LIVE_READS)
            .metrics(METRICS)
            .journal(JOURNAL);
        let builder = if RESERVE {
            builder
        } else {
            builder.disk_reserve(0)
        };
        let queue = builder.open(dir.join("bench.leaseq")).expect("open leaseq");
        if LIMITED {
            let limit = QueueLimit::jobs(NEVER_FULL)
                .and_bytes(NEVER_FULL)
                .when_full(WhenFull::Refuse);
            queue.set_limit(Some(limit)).expect("set_limit");
        }
        LeaseqQueue { queue }
    }

    fn enqueue(&self, payload: &[u8]) {
        self.queue
            .enqueue(payload, EnqueueOptions::default())
            .expect("enqueue");
    }

    fn enqueue_batch(&self, payloads: &[Vec<u8>]) {
        self.queue
            .enqueue_batch(payloads.iter().map(|p| (&p[..], EnqueueOptions::default())))
            .expect("enqueue_batch");
    }

    fn dequeue(&self) -> Option<Lease> {
        self.queue.dequeue().expect("dequeue")
    }

    fn dequeue_batch(&self, max: usize) -> Vec<Lease> {
        self.queue.dequeue_batch(max).expect("dequeue_batch")
    }

    fn extend(&self, job: &Lease) {
        // By the lease's own length, as a heartbeat does.
        job.extend(Duration::from_millis(job.lease_ms()))
            .expect("extend");
    }

    fn ack(&self, job: Lease) {
        job.ack().expect("ack");
    }

    fn ack_with_effect(&self, job: Lease) {
        let id = job.id().0;
        let payload = job.payload().to_vec();
        let applied = job
            .ack_with(|tx| {
                tx.open_table(EFFECTS)?.insert(id, payload.as_slice())?;
                Ok(())
            })
            .expect("ack_with");
        expect_applied(applied);
    }

    fn ack_batch_with_effect(&self, jobs: Vec<Lease>) {
        // One closure for the batch: the effects table opened once (as the other sides do).
        let applied = self
            .queue
            .ack_with_all(&jobs, |tx, leases| {
                let mut effects = tx.open_table(EFFECTS)?;
                for l in leases {
                    effects.insert(l.id().0, l.payload())?;
                }
                Ok(())
            })
            .expect("ack_with_all");
        applied
            .into_iter()
            .for_each(|a| expect_applied(a.expect("a lease of the batch")));
    }

    fn ack_and_dequeue_next(&self, job: Lease) -> Option<Lease> {
        let id = job.id().0;
        let payload = job.payload().to_vec();
        let (applied, next) = job
            .ack_with_and_next(|tx| {
                tx.open_table(EFFECTS)?.insert(id, payload.as_slice())?;
                Ok(())
            })
            .expect("ack_with_and_next");
        expect_applied(applied);
        next
    }
}
