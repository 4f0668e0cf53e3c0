//! Every limit leaseq puts on what grows or what a caller may ask for, in one place: the public
//! caps first, then the internal bounds and defaults. How the bounds relate is asserted at
//! compile time at the end.

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

/// Most helper threads the async face (`AsyncQueue`, feature `async`)
/// runs its commits on, process-wide: started when a call finds every helper busy, each
/// exiting after 10 s without work. Calls beyond wait their turn (their futures pending).
pub const ASYNC_THREADS_MAX: usize = 8;

/// Most change-event subscriptions alive at once on one file
/// ([`Queue::events`](crate::Queue::events)).
pub const SUBSCRIBERS_MAX: usize = 64;
/// The events a subscription holds for its reader before it counts the next ones as missed
/// (1024), unless [`Queue::events_with_capacity`](crate::Queue::events_with_capacity) says
/// otherwise.
pub const EVENTS_CAPACITY_DEFAULT: usize = 1024;
/// The largest capacity a subscription may ask for (1 Mi events).
pub const EVENTS_CAPACITY_MAX: usize = 1 << 20;

/// Most named queues one file holds (the default queue not counted): queue numbers run from
/// 1 to this and are never reused.
pub const QUEUES_MAX: u32 = 1024;
/// Longest queue name, in bytes (ASCII letters, digits, `_`, `-` and `.`).
pub const QUEUE_NAME_BYTES_MAX: usize = 64;
/// The live handles of a file named by one [`FileShutdown`](crate::FileShutdown) or one
/// [`Error::AlreadyOpen`](crate::Error::AlreadyOpen): 16 (the others are counted).
pub const HANDLES_LISTED_MAX: usize = 16;
/// The live handles of one file whose kind, queue and maker are kept; the others are counted
/// but not named.
pub(crate) const HANDLES_TRACKED_MAX: usize = 1024;
/// The files open from a path in one process that an `AlreadyOpen` can name handles of.
pub(crate) const OPEN_FILES_TRACKED_MAX: usize = 64;

// The engine (store).

/// At most this many due scheduled jobs are promoted, and this many expired leases
/// reclaimed, per dequeue: a sweep never makes one call slow.
pub(crate) const SWEEP_MAX: usize = 256;
/// How many dead jobs a queue keeps by default
/// ([`Builder::dead_jobs_max`](crate::Builder::dead_jobs_max)), the oldest deleted first, so
/// a device that fails the same work for weeks does not fill its disk with dead letters.
pub const DEAD_JOBS_MAX_DEFAULT: u64 = 10_000;
/// The disk reserve by default ([`Builder::disk_reserve`](crate::Builder::disk_reserve)),
/// in bytes: 8 MiB, or an eighth of the file system if that is less. It covers a
/// checkpoint's new pages (the journal holds at most 4 MiB of frames) and the drain's own
/// growth before the pages it frees are reused.
pub const DISK_RESERVE_DEFAULT: u64 = 8 << 20;
/// How long a job waits when its `ack_with` closure passed on
/// [`Error::StorageFull`](crate::Error::StorageFull) from an enqueue inside it (a follow-up
/// job the full file refused): snoozed, no attempt spent, as the drain frees room (10 s).
pub const STORAGE_FULL_SNOOZE: Duration = Duration::from_secs(10);
/// The largest disk reserve accepted, in bytes (1 GiB).
pub const DISK_RESERVE_MAX: u64 = 1 << 30;
/// An enqueue into a full queue that drops the oldest jobs
/// ([`WhenFull::DropOldest`](crate::WhenFull::DropOldest)) looks at most this many of them
/// (and drops at most as many); if they do not make room it is refused.
pub(crate) const DROP_PER_ENQUEUE_MAX: usize = 4096;
/// At most this many expired applied markers are pruned per `ack_with` (twice what one
/// lease adds, so the table cannot outgrow its retention); `Queue::prune` does the rest.
pub(crate) const PRUNE_PER_ACK_MAX: usize = 2;
/// A job's error, snooze reason or cancel reason keeps at most this many bytes (cut at a
/// char boundary).
pub const REASON_BYTES_MAX: usize = 4096;
/// A job keeps the errors of at most its last this many attempts
/// ([`JobInfo::errors`](crate::JobInfo::errors)), as River keeps one per attempt.
pub const ERRORS_KEPT: usize = 10;
/// The largest progress value a running job may record
/// ([`Lease::set_progress`](crate::Lease::set_progress)), in bytes.
pub const PROGRESS_BYTES_MAX: usize = 256;
/// The least time between two commits of a lease's progress: an update sooner than this is
/// kept in memory and written with the lease's next commit (see `Lease::set_progress`).
pub const PROGRESS_COMMIT_INTERVAL: Duration = Duration::from_millis(250);
/// The largest result an ack may store with a completed job
/// ([`Lease::ack_with_result`](crate::Lease::ack_with_result)), in bytes.
pub const RESULT_BYTES_MAX: usize = 4096;
/// The most completed jobs a queue's history may be set to keep
/// ([`History::keep_jobs`](crate::History::keep_jobs)).
pub const HISTORY_JOBS_MAX: u64 = 10_000_000;
/// The most deliveries a sliding-window rate limit may allow per window
/// ([`RateLimit::sliding`](crate::RateLimit::sliding)): the file logs each millisecond's
/// deliveries of the window, so this bounds that log's rows per queue.
pub const SLIDING_LIMIT_MAX: u32 = 10_000;
/// The most schedules one file holds, over all its queues
/// ([`Queue::create_schedule`](crate::Queue::create_schedule)).
pub const SCHEDULES_MAX: usize = 1024;
/// Minutes of metrics a file keeps per queue and kind ([`Queue::metrics`](crate::Queue::metrics)):
/// 24 hours.
pub const METRICS_MINUTES_KEPT: u64 = 24 * 60;
/// How often a queue's counts are written to its metrics, at most: with the next commit once
/// this passed since the last write (a crash loses at most this much of them).
pub(crate) const METRICS_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Expired metric rows a commit removes per queue and kind it counts in, at most.
pub(crate) const METRICS_PRUNED_PER_WRITE: usize = 64;
/// The longest schedule name, in bytes (UTF-8, at least one byte, no control characters).
pub const SCHEDULE_NAME_BYTES_MAX: usize = 128;
/// The largest payload a schedule's instances carry, in bytes: it is stored in the schedule's
/// row and copied into each instance.
pub const SCHEDULE_PAYLOAD_BYTES_MAX: usize = 64 * 1024;
/// The longest cron expression, and the longest time zone name, in bytes.
pub const CRON_TEXT_BYTES_MAX: usize = 256;
/// Most violations `check` lists before it stops.
pub(crate) const VIOLATIONS_MAX: usize = 1000;

// Group commit.

/// How long a group may stay open gathering members.
pub(crate) const GATHER_MAX: Duration = Duration::from_millis(2);
/// The most operations one group takes.
pub(crate) const GROUP_MEMBERS_MAX: usize = 1024;
/// With `Durability::None`, every this-many commits is made durable anyway, so redb can
/// reuse pages (non-durable commits pin them) and the file does not grow without bound.
pub(crate) const NON_DURABLE_COMMITS_MAX: u64 = 256;
/// The journal's size in bytes (4 MiB), preallocated and zeroed when it is made, so a
/// frame's `fdatasync` changes no file size. A group whose frame would not fit before the
/// end is a checkpoint instead (a durable redb commit), after which frames start again at
/// the front. As SQLite's `wal_autocheckpoint` default (1000 pages of 4 KiB).
pub(crate) const JOURNAL_BYTES: u64 = 4 << 20;
/// The most frames between two checkpoints: each frame's redb commit is non-durable, and
/// redb's work per commit grows with the non-durable commits since the last durable one.
/// Measured on one thread (2026-12-05): with 4096, dequeues ran at 0.85x of no journal;
/// with 1024 and 256 every call ran at 1.7-1.8x, 1024 writing 3-6 % fewer bytes.
pub(crate) const JOURNAL_FRAMES_MAX: u64 = 1024;
/// The longest time between two checkpoints while groups commit: a copy of the queue file
/// alone is at most this old (plus the time without commits).
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(30);
/// Ids and lease tokens handed out in blocks: `leaseq_meta` stores the end of the reserved
/// block (every id or token ever used is below it), so the counter row is written once per
/// `COUNTER_BLOCK` allocations instead of on every commit. Unused numbers of a block are
/// skipped after a reopen; ids and tokens stay unique and increasing.
pub(crate) const COUNTER_BLOCK: u64 = 1024;

// The record and payload codecs.

/// The largest payload kept inline in its job record, in bytes; larger ones are stored apart
/// (`leaseq_payloads`). Small enough that a rewritten record stays within a fraction of a
/// 4 KiB page; large enough that the common small job touches one table.
pub(crate) const PAYLOAD_INLINE_MAX: usize = 1024;
/// Decoding never reads or allocates past this many bytes (the payload cap plus headroom for
/// keys and the error text).
pub(crate) const RECORD_BYTES_MAX: usize = PAYLOAD_BYTES_MAX_CAP + 64 * 1024;
/// How many levels of nesting a payload may have: 128, serde_json's default recursion limit
/// (which reads 127 levels of arrays and objects, and refuses the 128th). Far more than a job
/// type nests, and few enough that the frames they take fit a small thread stack (each level
/// costs a handful of frames; the tests decode to the limit on 256 KiB).
pub(crate) const DEPTH_MAX: usize = 128;

// Waiting.

/// The most queue wake-ups one stop signal remembers (one per queue it was waited on, in any
/// file); past that the dead ones are dropped first, then the oldest.
pub(crate) const WATCHED_MAX: usize = 4096;

// Defaults of `Builder`.

/// [`Builder::dequeue_batch_bytes`](crate::Builder::dequeue_batch_bytes)'s default: 16 MiB.
pub(crate) const DEQUEUE_BATCH_BYTES_DEFAULT: usize = 16 << 20;
/// The default of [`Builder::applied_retention`](crate::Builder::applied_retention): 7 days.
pub(crate) const APPLIED_RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

// How the bounds relate, checked at compile time.
const _: () = {
    // A record's headroom above its payload holds both keys, a full error history (each
    // entry a reason and 32 bytes), a snooze reason, a cancel reason or a result, and the
    // fixed fields (under 256 bytes).
    assert!(
        2 * KEY_BYTES_MAX
            + ERRORS_KEPT * (REASON_BYTES_MAX + 32)
            + 2 * REASON_BYTES_MAX
            + RESULT_BYTES_MAX
            + PROGRESS_BYTES_MAX
            + 16
            + 256
            <= RECORD_BYTES_MAX - PAYLOAD_BYTES_MAX_CAP
    );
    assert!(ERRORS_KEPT >= 1);
    // Payloads stored apart are those above the inline limit, which the cap exceeds.
    assert!(PAYLOAD_INLINE_MAX < PAYLOAD_BYTES_MAX_CAP);
    // One ack_with adds at most one applied marker: pruning two per ack keeps the table
    // within its retention.
    assert!(PRUNE_PER_ACK_MAX >= 2);
    // A clock that jumps forward delivers due work within a second.
    assert!(DUE_RECHECK_MAX.as_millis() <= 1000);
    // A delay or lease in ms fits the u64 arithmetic of deadlines with room to spare.
    assert!(DELAY_MAX.as_millis() < (u64::MAX / 4) as u128);
    // Every bound admits at least one item.
    assert!(GROUP_MEMBERS_MAX >= 1 && SWEEP_MAX >= 1 && VIOLATIONS_MAX >= 1);
    assert!(COUNTER_BLOCK >= 1 && NON_DURABLE_COMMITS_MAX >= 1);
    // The journal holds a header block and at least one frame of a large group.
    assert!(JOURNAL_BYTES >= 1 << 20 && JOURNAL_FRAMES_MAX >= 1);
    // A schedule row (payload, name, cron text, template) stays far below a record's cap.
    assert!(SCHEDULE_PAYLOAD_BYTES_MAX + 2 * CRON_TEXT_BYTES_MAX + 1024 <= RECORD_BYTES_MAX);
    assert!(SCHEDULES_MAX >= 1);
    // A shutdown names at most the handles it knows of; a slot number fits a u32.
    assert!(HANDLES_LISTED_MAX >= 1 && HANDLES_LISTED_MAX <= HANDLES_TRACKED_MAX);
    assert!(HANDLES_TRACKED_MAX <= u32::MAX as usize && OPEN_FILES_TRACKED_MAX >= 1);
    // A queue name fits within a redb table name with its prefix and suffix.
    assert!(QUEUE_NAME_BYTES_MAX <= 64);
};
