//! Every limit leaseq puts on what grows or what a caller may ask for, in one place.

use std::time::Duration;

/// Longest lease (visibility timeout) accepted: 12 hours, as SQS's maximum.
pub const LEASE_MAX: Duration = Duration::from_secs(12 * 60 * 60);
/// Longest delay or backoff accepted: 365 days.
pub const DELAY_MAX: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// Most deliveries a job may be allowed.
pub const MAX_ATTEMPTS_CAP: u32 = 1_000_000;
/// Most jobs or leases one batch call takes.
pub const BATCH_MAX: usize = 10_000;
/// Longest idempotency key or dedup key, in bytes.
pub const KEY_BYTES_MAX: usize = 512;
/// The highest payload limit a queue may be configured with, in bytes (64 MiB).
pub const PAYLOAD_BYTES_MAX_CAP: usize = 64 << 20;
/// The longest a consumer blocked in [`Queue::dequeue_timeout`](crate::Queue::dequeue_timeout) waits for a due time before
/// reading the clock again (250 ms), so a clock that jumps forward delivers due work within it.
pub const DUE_RECHECK_MAX: Duration = Duration::from_millis(250);

/// Most named queues one file holds (the default queue not counted): queue numbers run from
/// 1 to this and are never reused.
pub const QUEUES_MAX: u32 = 1024;
/// Longest queue name, in bytes (ASCII letters, digits, `_`, `-` and `.`).
pub const QUEUE_NAME_BYTES_MAX: usize = 64;
