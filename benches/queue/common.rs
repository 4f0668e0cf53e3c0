//! What every queue under benchmark implements, plus small helpers shared by the groups.

use std::path::Path;
use std::sync::{Condvar, Mutex, PoisonError};

/// Payload size used by every benchmark, in bytes.
pub const PAYLOAD_LEN: usize = 64;

/// The payload every benchmark enqueues (fixed bytes, so both sides store the same data).
pub fn payload() -> Vec<u8> {
    (0..PAYLOAD_LEN)
        .map(|i| (i as u8).wrapping_mul(37))
        .collect()
}

/// A durable job queue as the benchmarks drive it.
///
/// Contract, identical for every side:
/// - every method is durable before it returns (its transaction is committed and synced);
/// - `dequeue*` leases jobs (state leased, new lease token and deadline, attempts + 1) in one
///   transaction, first ready job by priority then id;
/// - `extend` checks the lease token and moves the lease's deadline to now + the lease length
///   (a heartbeat), in one transaction;
/// - `ack` checks the lease token and deletes the job, nothing more (no effect, no record of
///   it), in one transaction;
/// - `ack*_with_effect` checks the lease token, records the job as applied, writes one effect
///   row (the job id and a copy of its 64-byte payload) and deletes the job, all in one
///   transaction; a stale lease is a bug here, so implementations panic on it;
/// - one instance is shared by all threads of a benchmark (`&self`, `Send + Sync`).
pub trait QueueUnderTest: Send + Sync + Sized {
    /// Criterion function name of this side (`target/criterion/<group>/<NAME>/...`).
    const NAME: &'static str;

    /// A leased job, handed back to the queue to ack it.
    type Job: Send;

    /// Creates (or opens) the queue's files inside `dir`, an empty directory.
    fn open(dir: &Path) -> Self;

    /// Enqueues one job (one transaction).
    fn enqueue(&self, payload: &[u8]);

    /// Enqueues all `payloads` in one transaction.
    fn enqueue_batch(&self, payloads: &[Vec<u8>]);

    /// Leases the first ready job, if any (one transaction).
    fn dequeue(&self) -> Option<Self::Job>;

    /// Leases up to `max` ready jobs in one transaction.
    fn dequeue_batch(&self, max: usize) -> Vec<Self::Job>;

    /// Extends the lease of `job` by the lease length from now (one transaction).
    fn extend(&self, job: &Self::Job);

    /// Acks one leased job without an effect (one transaction).
    fn ack(&self, job: Self::Job);

    /// Acks one leased job together with its effect (one transaction).
    fn ack_with_effect(&self, job: Self::Job);

    /// Acks all `jobs` with their effects in one transaction.
    fn ack_batch_with_effect(&self, jobs: Vec<Self::Job>);

    /// Acks `job` with its effect and leases the next ready job, in one transaction.
    fn ack_and_dequeue_next(&self, job: Self::Job) -> Option<Self::Job>;
}

/// Hands out "a committed job is waiting" permits to consumer threads, so that consumers of
/// the concurrent benchmarks never poll an empty queue and every `dequeue` finds a job. This
/// is the same (ideal) wake-up mechanism for every side, so it does not favour either.
pub struct Gate {
    total: usize,
    state: Mutex<GateState>,
    ready: Condvar,
}

struct GateState {
    available: usize,
    claimed: usize,
}

impl Gate {
    /// A gate for a run of `total` jobs.
    pub fn new(total: usize) -> Self {
        Self {
            total,
            state: Mutex::new(GateState {
                available: 0,
                claimed: 0,
            }),
            ready: Condvar::new(),
        }
    }

    /// Called by a producer after its enqueue of one job has returned (is committed).
    pub fn publish(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.available += 1;
        drop(state);
        self.ready.notify_one();
    }

    /// Waits for a committed, unclaimed job and claims it; `false` once all `total` jobs
    /// have been claimed.
    pub fn claim(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if state.claimed == self.total {
                return false;
            }
            if state.available > 0 {
                state.available -= 1;
                state.claimed += 1;
                if state.claimed == self.total {
                    // Wake the consumers still waiting so they can exit.
                    self.ready.notify_all();
                }
                return true;
            }
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}
