//! The engine: every change leaseq makes to its tables, as functions over one open write
//! transaction (a group commit's [`Ctx`](crate::commit::Ctx)), plus the read-only views.
//!
//! Each mutating function validates everything it can before its first write, so a refusal
//! (`LeaseLost`, `InvalidOption`, ...) leaves the transaction untouched and the rest of the
//! group can still commit: a function that can refuse answers a
//! [`Verdict`](crate::commit::Verdict), the refusal on its own channel. Every write goes
//! through one path, which marks the group: a [`GroupTable`](crate::commit::GroupTable), from
//! [`Tables`](tables::Tables)' writing accessors or [`Ctx::table`](crate::commit::Ctx::table)
//! for the file-wide tables; events and wake-ups go to the group's
//! [`GroupLog`](crate::commit::GroupLog). Each function keeps the first invariant of ARCHITECTURE.md: a job is in
//! exactly one state, and the state's index holds exactly the job's entry.
//!
//! The files, in the order a job meets them (callers outside `store` use the re-exports
//! below, `store::dequeue` and so on):
//!
//! | file | what |
//! |---|---|
//! | `tables.rs` | `Tables`: one queue's tables in a write transaction; index, key and payload mechanics; quarantine |
//! | `transition.rs` | the state changes shared by operations: end an attempt, snooze, fail, lease a record |
//! | `validate.rs` | input checks and record building, before any write |
//! | `enqueue.rs` | enqueue (new, imported) |
//! | `sink.rs` | what a caller's closure reaches through its `Tx`: the `Sink` over the operation's tables (enqueues, the control calls `TxCall`), and `Queue::write` |
//! | `dequeue.rs` | the bounded sweep (due jobs, expired leases, group waits for cancelled deliveries), then the dequeue; a paused queue's look (due jobs only) |
//! | `fenced.rs` | calls checked against a fencing token: ack, `ack_with`, nack, snooze, fail, extend |
//! | `retention.rs` | bounded pruning of applied markers, dead jobs, dedup windows, the completed history |
//! | `admin.rs` | cancel, retry, requeue, remove, purge or requeue by state |
//! | `registry.rs` | named-queue numbers |
//! | `control.rs` | queue controls stored in the file: pause, resume, the history setting; the file's storage-full state |
//! | `rate_limit.rs` | a queue's rate limit, read and charged by the dequeue |
//! | `queue_limit.rs` | a queue's size limit: checked by every enqueue, room made by dropping the oldest, its payload bytes counted |
//! | `metrics.rs` | the per-minute metrics each group commit adds to, read per queue |
//! | `schedule.rs` | periodic jobs: set, remove, fire the due ones (in the sweep, and at open) |
//! | `migrate.rs` | the file id, format upgrades |
//! | `recover.rs` | lease recovery at open |
//! | `read.rs` | read-only views: peek, stats, one job, lists |
//! | `check.rs` | the invariant checker behind `Queue::check` |

use crate::format::schema::QueueSchema;

mod admin;
mod check;
mod control;
mod dequeue;
mod enqueue;
mod fenced;
mod metrics;
mod migrate;
mod queue_limit;
mod rate_limit;
mod read;
mod recover;
mod registry;
mod retention;
mod schedule;
mod sink;
mod tables;
mod transition;
mod validate;

pub(crate) use admin::{
    BulkAction, Change, bulk_by_state, cancel, release_key, remove, requeue_dead, retry, update,
};
pub(crate) use check::check_file;
pub(crate) use control::{
    history_of, pause, paused_queues, record_storage_full, resume, set_history, validate_history,
};
pub(crate) use dequeue::{dequeue, promote_due_paused};
pub(crate) use enqueue::{enqueue, enqueue_imported};
pub(crate) use fenced::{
    AckClosure, ClosureFailure, ack, ack_with, extend, fail, nack, release_unseen, set_progress,
    snooze,
};
pub(crate) use metrics::{metrics_with, write_metrics};
pub(crate) use migrate::{file_id, make_file_id, random_u64, upgrade};
pub(crate) use queue_limit::{limit_of, set_limit, validate_limit};
pub(crate) use rate_limit::{limited_until, rate_limit_of, set_rate_limit, validate_rate_limit};
pub(crate) use read::{
    held_behind, is_applied, job, latest_dead, list, payload, peek_due, peek_due_paused,
    quarantined, quarantined_record, stats,
};
pub(crate) use recover::{read_leased_rows, recover_leases};
pub(crate) use registry::{create_queue, find_queue, named_queues};
pub(crate) use retention::{prune, prune_dead_jobs, prune_dedup_windows, prune_history_jobs};
pub(crate) use schedule::{
    SetMode, build as build_schedule, fire_at_open, get as schedule_of, list as schedules_of,
    pause as pause_schedule, remove as remove_schedule, resume as resume_schedule,
    set as set_schedule, trigger as trigger_schedule,
};
pub(crate) use sink::write;
pub(crate) use validate::{
    NewJob, import_record, new_records, truncate_reason, validate_key, validate_lease_ms,
    validate_max_attempts,
};

/// Queue-wide settings an operation needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueConfig {
    pub lease_ms: u64,
    pub max_attempts: u32,
    pub payload_bytes_max: usize,
    /// Most payload bytes one dequeue batch hands out (its first job is always taken).
    pub dequeue_batch_bytes: usize,
    pub retry: crate::retry::RetryPolicy,
    /// How long an applied marker of a caller key is kept (`None`: forever).
    pub applied_retention_ms: Option<u64>,
    /// How long a dead job is kept (`None`: until removed).
    pub dead_retention_ms: Option<u64>,
    /// How many dead jobs the queue keeps at most, the oldest deleted first (`None`: all).
    pub dead_jobs_max: Option<u64>,
    /// The queue's tables.
    pub schema: &'static QueueSchema,
    /// The file's committer id (set once the file is open): which file the queue is in.
    pub committer_id: u64,
    /// How `enqueue_value` encodes, and how `Lease::decode` reads a job that recorded none.
    pub encoding: crate::format::payload::Encoding,
}

/// A job handed out by a dequeue, before it becomes a `Lease`.
#[derive(Debug)]
pub(crate) struct Delivery {
    pub id: u64,
    pub token: u64,
    pub attempt: u32,
    pub max_attempts: u32,
    /// Times the job was snoozed before this delivery.
    pub snoozes: u32,
    pub deadline_ms: u64,
    /// The lease duration this delivery got.
    pub lease_ms: u64,
    /// The job's own execution timeout, if it has one (`EnqueueOptions::timeout`).
    pub timeout_ms: Option<u64>,
    pub idempotency_key: Option<Vec<u8>>,
    /// The encoding the job recorded, if any.
    pub encoding: Option<crate::format::payload::Encoding>,
    pub payload: Vec<u8>,
    /// What this delivery changed beyond the lease, to undo if no consumer sees it.
    pub undo: Undo,
}

/// What a delivery changed in its job beyond the lease, so [`release_unseen`] can put it
/// back: the snooze reason and the last delivery's progress (cleared by a delivery) and a
/// key held until the job started (released by it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Undo {
    pub status: Option<String>,
    pub until_started_key: Option<Vec<u8>>,
    pub progress: Option<crate::format::record::StoredProgress>,
    /// When the job had become ready (its `run_at_ms` before the delivery made it the
    /// delivery's start).
    pub ready_ms: u64,
}
