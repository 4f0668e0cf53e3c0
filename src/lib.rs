//! # leaseq
//!
//! An embedded, single-process, synchronous, persistent job queue stored in one
//! [redb](https://docs.rs/redb) file. Link it into a desktop or edge app: no server, no
//! network, no async runtime required (the library is synchronous; its async face, feature
//! `async`, works on any runtime, and feature `tokio` adds worker pools of async handlers on
//! yours).
//! Jobs survive crashes and power loss; consumers take them under
//! leases with fencing tokens; [`Lease::ack_with`] commits your own writes, an applied marker
//! and the ack in one transaction, so a job's effect on your tables happens exactly once even
//! though delivery is at-least-once.
//!
//! - **At-least-once delivery, never a lost job.** An [`enqueue`](Queue::enqueue) that
//!   returned `Ok` survives a crash or power loss (with the default
//!   [`Durability::Immediate`]). A consumer takes a job under a *lease* (a deadline, as SQS's
//!   visibility timeout); a job not acked before its deadline is delivered again after it,
//!   and the leases of a process that died are returned by the next open of the file, before
//!   its first dequeue.
//! - **Exactly-once effect.** [`Lease::ack_with`] commits the consumer's own writes, the
//!   applied-ids marker for the job's idempotency key and the ack in one redb write
//!   transaction. A redelivered job whose key is applied changes nothing
//!   ([`Applied::AlreadyApplied`]).
//! - **Fencing.** Every delivery carries a fresh token; an ack, nack, snooze, fail or extend
//!   with a stale one returns [`Error::LeaseLost`] and changes nothing.
//! - **Producer dedup** ([`EnqueueOptions::dedup_key`]) keeps one live job per key. It is not
//!   exactly-once; consumer idempotency is.
//!
//! The README's guarantees table says what each guarantee does not cover.
//!
//! leaseq re-exports the redb it is built on as [`leaseq::redb`](redb), so an app's own
//! tables need no direct redb dependency:
//!
//! ```
//! use leaseq::redb::TableDefinition;
//! use leaseq::{Applied, AttemptError, EnqueueOptions, Queue};
//! use std::time::Duration;
//!
//! const ORDERS: TableDefinition<&str, &str> = TableDefinition::new("orders");
//!
//! let dir = tempfile::tempdir()?;
//! let queue = Queue::builder()
//!     .lease(Duration::from_secs(30))
//!     .max_attempts(5)
//!     .open(dir.path().join("app.leaseq"))?;
//! queue.enqueue(b"pay order 42", EnqueueOptions::default().idempotency_key("order-42"))?;
//!
//! if let Some(lease) = queue.dequeue_timeout(Duration::from_secs(1))? {
//!     let outcome = lease.ack_with(|tx| {
//!         let mut orders = tx.open_table(ORDERS)?; // the caller's own table, same file
//!         orders.insert("order-42", "paid")?;
//!         Ok(())
//!     })?;
//!     assert_eq!(outcome, Applied::Now);
//! }
//! assert!(queue.is_applied("order-42")?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The guide
//!
//! The [`guide`] module, one chapter per concept:
//! [the exactly-once effect](guide::exactly_once) and external effects,
//! [typed jobs](guide::typed_jobs), [stopping and long jobs](guide::stopping),
//! [several queues in one file](guide::named_queues), [running for years](guide::operations),
//! [durability](guide::durability), [when you outgrow one machine](guide::comparison),
//! [platforms](guide::platforms); with feature `tokio`, building an app on tokio
//! (`guide::building_an_app`).
//!
//! # Where things are
//!
//! - **Open a file**: [`Queue::open`], or [`Queue::builder`] for the settings ([`Builder`]:
//!   lease, attempts, retry policy, retention, durability, integrity check); what the open
//!   recovered is [`Recovery`].
//! - **Produce**: [`Queue::enqueue`], [`Queue::enqueue_value`], [`Queue::enqueue_batch`] with
//!   [`EnqueueOptions`]; the outbox: [`Queue::write`] and [`Tx::enqueue`].
//! - **Consume**: [`Queue::dequeue`], [`Queue::dequeue_timeout`], [`Queue::dequeue_until`],
//!   [`Queue::dequeue_batch`]; then the [`Lease`]: ack, `ack_with`, nack, snooze, fail, extend,
//!   [`Heartbeat`]; an [`Outcome`] returned from a closure; [`RetryPolicy`] for the backoff.
//! - **Stop**: [`Queue::shutdown`] for the app's exit (the file released), [`Queue::close`] to
//!   refuse new work, a [`StopSignal`] for some consumers.
//! - **Follow**: [`Queue::events`], a subscription to what each commit did ([`Event`]).
//! - **Several queues**: [`Queue::named`]. **Look and repair**: [`Queue::stats`],
//!   [`Queue::jobs`], [`Queue::check`], [`Queue::prune`], [`Queue::purge`],
//!   [`Queue::requeue_dead`], [`Queue::remove`], [`Queue::compact`].
//! - **Errors**: one [`Error`] enum; every call's page lists its errors. **Limits**: the
//!   constants ([`LEASE_MAX`], [`BATCH_MAX`], …). **Time**: whole milliseconds everywhere
//!   (`Duration`s in, Unix-ms timestamps out), from a [`Clock`] ([`ManualClock`] in tests).
//! - **Schedules**: interval schedules always; cron expressions in IANA time zones
//!   ([`Schedule::cron`]) with feature `cron` (on by default; see the guide's periodic jobs).
//! - **Async** (feature `async`): `Queue::to_async` gives an `AsyncQueue` whose commits never
//!   block the caller's thread and whose waits hold none, with cancel-safe dequeues; feature
//!   `tokio` adds the async pool (`PoolBuilder::start_async`). The guide's building-an-app
//!   chapter puts an app on tokio together.
//! - **Built on the public API**: [`worker`] ([`WorkerPool`]: threads, heartbeats, shutdown);
//!   with feature `nats`, `relay`: store-and-forward between a queue and a NATS JetStream
//!   stream; with feature `sim`, `sim`: a power-loss simulator for testing your own effects;
//!   and the `leaseq` command-line tool, the `leaseq-cli` crate of the source repository
//!   (`docs/cli.md` there).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod clock;
mod commit;
mod disk_reserve;
mod error;
mod events;
mod file;
mod format;
mod handles;
mod job;
mod journal;
mod lease;
mod limits;
mod metrics;
mod open;
mod platform;
mod queue;
mod queue_limit;
mod rate_limit;
mod reader;
mod retry;
mod schedule;
mod scratch;
mod signal;
mod stop;
mod store;
mod tx;

#[cfg(feature = "async")]
pub mod async_face;
#[cfg(feature = "control")]
pub mod control;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod guide;
pub mod json;
#[cfg(feature = "nats")]
pub mod relay;
#[cfg(feature = "sim")]
pub mod sim;
pub mod worker;

// The README's Rust code blocks are compiled (and run, unless marked `no_run`) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The redb crate leaseq is built on, re-exported so an app's `ack_with` closures and
/// [`Queue::database`] calls use the same version without a direct dependency.
pub use redb;

#[cfg(feature = "async")]
pub use async_face::{AsyncLease, AsyncQueue};
pub use clock::{Clock, ClockWaker, ManualClock, SystemClock};
pub use commit::{CommitStats, Durability};
pub use error::{BoxError, Error, Result};
pub use events::{Event, Events};
pub use file::Recovery;
pub use format::payload::Encoding;
pub use format::schema::FORMAT_VERSION;
pub use handles::{HandleKind, LiveHandle};
pub use job::{
    Applied, AttemptError, CancelOutcome, EnqueueOptions, Enqueued, History, ImportJob, JobCursor,
    JobId, JobInfo, JobPage, JobState, OnDuplicate, Outcome, Progress, Pruned, Quarantined, Stats,
    Violation,
};
pub use journal::JournalFound;
pub use lease::{Heartbeat, Lease};
pub use limits::{
    ASYNC_THREADS_MAX, BATCH_MAX, CRON_TEXT_BYTES_MAX, DEAD_JOBS_MAX_DEFAULT, DELAY_MAX,
    DISK_RESERVE_DEFAULT, DISK_RESERVE_MAX, DUE_RECHECK_MAX, ERRORS_KEPT, EVENTS_CAPACITY_DEFAULT,
    EVENTS_CAPACITY_MAX, HANDLES_LISTED_MAX, HISTORY_JOBS_MAX, KEY_BYTES_MAX, LEASE_MAX,
    MAX_ATTEMPTS_CAP, METRICS_MINUTES_KEPT, PAYLOAD_BYTES_MAX_CAP, PROGRESS_BYTES_MAX,
    PROGRESS_COMMIT_INTERVAL, QUEUE_NAME_BYTES_MAX, QUEUES_MAX, REASON_BYTES_MAX, RESULT_BYTES_MAX,
    SCHEDULE_NAME_BYTES_MAX, SCHEDULE_PAYLOAD_BYTES_MAX, SCHEDULES_MAX, SLIDING_LIMIT_MAX,
    STORAGE_FULL_SNOOZE, SUBSCRIBERS_MAX,
};
pub use metrics::MinuteCounts;
pub use open::Builder;
pub use queue::Queue;
pub use queue::lifecycle::FileShutdown;
pub use queue_limit::{QueueLimit, WhenFull};
pub use rate_limit::{RateLimit, RateWindow};
pub use reader::Reader;
pub use retry::RetryPolicy;
pub use schedule::{Missed, Overlap, Schedule, ScheduleInfo, Timing};
pub use stop::StopSignal;
pub use tx::Tx;
#[cfg(feature = "tokio")]
pub use worker::AsyncPool;
pub use worker::{
    DROP_GRACE_DEFAULT, IDLE_TIMEOUT_DEFAULT, IDLE_TIMEOUT_MAX, OnTimeout, PoolBuilder,
    PoolMonitor, PoolStats, ShutdownReport, THREAD_NAME_DEFAULT, WORKER_THREADS_MAX, WorkerPool,
};
