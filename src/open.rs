//! Opening a queue file: the `Builder`, atomic create, attach, the format checks and the look
//! before the writable open, upgrade and lease recovery at open.

use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, StorageBackend};

use crate::clock::{Clock, SystemClock};
use crate::commit::{Committer, Durability};
use crate::error::{Error, Result, catch_engine_panic};
use crate::file::{GuardedDb, OpenFile, Recovery};
use crate::format::schema::{
    DEFAULT_SCHEMA, FORMAT_VERSION, META, META_FORMAT_VERSION, META_NEXT_ID, META_NEXT_TOKEN,
};
use crate::handles::{HandleKind, HandleMark};
use crate::limits::{APPLIED_RETENTION_DEFAULT, DEQUEUE_BATCH_BYTES_DEFAULT};
use crate::platform;
use crate::queue::Queue;
use crate::retry::RetryPolicy;
use crate::scratch::ScratchBackend;
use crate::store::{self, QueueConfig};

/// redb's file header: a file shorter than this cannot be a database.
const REDB_HEADER_BYTES: u64 = 320;
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
/// redb's "god byte" follows the magic number; its bit 2 is set while a writer has the file
/// open and cleared by a clean close (redb's file format, `docs/design.md`).
const REDB_GOD_BYTE_OFFSET: u64 = REDB_MAGIC.len() as u64;
const REDB_RECOVERY_REQUIRED: u8 = 2;

/// How many times a writable open refused right after a look found the file free is tried
/// again (after 2, 4 and 8 ms): long enough for another process's look to end.
const OPEN_RETRIES: u32 = 3;

/// The files this process's threads are opening right now, so that they open one file in
/// turn (see [`Builder::open`]); as many entries as threads opening at once.
static OPENING: parking_lot::Mutex<Vec<PathBuf>> = parking_lot::Mutex::new(Vec::new());
static OPENING_ENDED: parking_lot::Condvar = parking_lot::Condvar::new();

/// This thread's turn to open a file: taken by waiting while another thread opens the same
/// file (its canonical path; the path as given where it has none), given up when dropped.
struct OpenTurn(PathBuf);

impl OpenTurn {
    fn take(path: &Path) -> OpenTurn {
        let key = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut opening = OPENING.lock();
        while opening.contains(&key) {
            OPENING_ENDED.wait(&mut opening);
        }
        opening.push(key.clone());
        OpenTurn(key)
    }
}

impl Drop for OpenTurn {
    fn drop(&mut self) {
        let mut opening = OPENING.lock();
        opening.retain(|p| *p != self.0);
        OPENING_ENDED.notify_all();
    }
}

/// Settings for opening a queue. Start from [`Queue::builder`].
///
/// ```no_run
/// use leaseq::Queue;
/// use std::time::Duration;
/// let queue = Queue::builder()
///     .lease(Duration::from_secs(30))
///     .max_attempts(5)
///     .cache_bytes(32 << 20)
///     .open("app.leaseq")?;
/// # Ok::<(), leaseq::Error>(())
/// ```
#[derive(Clone)]
pub struct Builder {
    lease: Duration,
    max_attempts: u32,
    cache_bytes: usize,
    payload_bytes_max: usize,
    dequeue_batch_bytes: usize,
    durability: Durability,
    quick_repair: bool,
    live_reads: bool,
    journal: bool,
    metrics: bool,
    check_integrity: bool,
    pub(crate) clock: Arc<dyn Clock>,
    on_repair: Option<Arc<dyn Fn(f64) + Send + Sync>>,
    retry: RetryPolicy,
    applied_retention: Option<Duration>,
    dead_retention: Option<Duration>,
    dead_jobs_max: Option<u64>,
    disk_reserve: Option<u64>,
    file_bytes_max: Option<u64>,
    encoding: crate::format::payload::Encoding,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("lease", &self.lease)
            .field("max_attempts", &self.max_attempts)
            .field("cache_bytes", &self.cache_bytes)
            .field("payload_bytes_max", &self.payload_bytes_max)
            .field("dequeue_batch_bytes", &self.dequeue_batch_bytes)
            .field("durability", &self.durability)
            .field("quick_repair", &self.quick_repair)
            .field("live_reads", &self.live_reads)
            .field("journal", &self.journal)
            .field("metrics", &self.metrics)
            .field("check_integrity", &self.check_integrity)
            .field("clock", &self.clock)
            .field("retry", &self.retry)
            .field("applied_retention", &self.applied_retention)
            .field("dead_retention", &self.dead_retention)
            .field("dead_jobs_max", &self.dead_jobs_max)
            .field("disk_reserve", &self.disk_reserve)
            .field("file_bytes_max", &self.file_bytes_max)
            .field("encoding", &self.encoding)
            .finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            lease: Duration::from_secs(30),
            max_attempts: 5,
            cache_bytes: 64 << 20,
            payload_bytes_max: 1 << 20,
            dequeue_batch_bytes: DEQUEUE_BATCH_BYTES_DEFAULT,
            durability: Durability::Immediate,
            quick_repair: false,
            live_reads: false,
            journal: true,
            metrics: true,
            check_integrity: true,
            clock: Arc::new(SystemClock),
            on_repair: None,
            retry: RetryPolicy::default(),
            applied_retention: Some(APPLIED_RETENTION_DEFAULT),
            dead_retention: None,
            dead_jobs_max: Some(crate::limits::DEAD_JOBS_MAX_DEFAULT),
            disk_reserve: None,
            file_bytes_max: None,
            encoding: crate::format::payload::Encoding::Bincode,
        }
    }
}

impl Builder {
    /// Default lease duration (visibility timeout) of a delivery; default 30 s, as SQS's
    /// default visibility timeout. From 1 ms to [`LEASE_MAX`](crate::LEASE_MAX), checked at
    /// open.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Default deliveries per job before the dead-letter state; default 5. At least 1, at most
    /// [`MAX_ATTEMPTS_CAP`](crate::MAX_ATTEMPTS_CAP), checked at open.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// redb's page cache, in bytes; default 64 MiB (redb's own default is 1 GiB).
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Largest payload accepted, in bytes; default 1 MiB, at most
    /// [`PAYLOAD_BYTES_MAX_CAP`](crate::PAYLOAD_BYTES_MAX_CAP), checked at open.
    pub fn payload_bytes_max(mut self, bytes: usize) -> Self {
        self.payload_bytes_max = bytes;
        self
    }

    /// The most payload bytes one [`Queue::dequeue_batch`] hands out, in bytes; default 16 MiB.
    /// A batch stops before the job that would take its payloads past this (the first job
    /// is always taken, whatever its size), so a batch of large payloads is a few leases, never
    /// a vector of gigabytes. Checked at open: at least 1.
    pub fn dequeue_batch_bytes(mut self, bytes: usize) -> Self {
        self.dequeue_batch_bytes = bytes;
        self
    }

    /// When calls return relative to the fsync; default [`Durability::Immediate`].
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// redb's quick-repair: every commit also saves the allocator state (a second fsync), so
    /// the open after a crash takes milliseconds instead of a full repair whose time grows
    /// with the file. Default off.
    ///
    /// The millisecond reopen needs [`Builder::check_integrity`]`(false)` as well: the
    /// integrity check (on by default) verifies the whole file at every open, crash or not,
    /// which is what a full repair costs.
    pub fn quick_repair(mut self, enabled: bool) -> Self {
        self.quick_repair = enabled;
        self
    }

    /// Whether other processes may read the file live while this one has it open; default
    /// off. With it on, [`Reader::open`](crate::Reader::open) (and the `leaseq` tool's read
    /// commands) work beside the running app, any number at once: each follows the app's
    /// commits, never writes, and never returns the app's leases (jobs in flight show as
    /// leased, with their deadlines). Off, the app holds the file exclusively and a reader is
    /// refused with [`Error::HeldExclusively`].
    ///
    /// It opens the file in redb's `ConcurrencyMode::SingleWriter` (redb 4.5 and later): one
    /// process writes, readers share the file through byte-range locks. What it costs: every
    /// commit is a two-phase commit (a second fsync, as [`Builder::quick_repair`]) with a few
    /// more lock calls per commit and per read; the durability chapter of the guide has the
    /// measured cost. Everything else holds as without it: the writable open still excludes
    /// any other writer, so lease recovery at open and fencing keep their proof.
    ///
    /// Supported where redb's file locks are: Linux, macOS and iOS, Windows. Elsewhere
    /// (Android, the BSDs) and on a [`Builder::open_backend`] backend without byte-range locks,
    /// the open fails with `Storage`. Checked at open: it cannot be combined with
    /// [`Durability::None`] (`InvalidOption`: redb refuses unsynced commits in this mode).
    pub fn live_reads(mut self, enabled: bool) -> Self {
        self.live_reads = enabled;
        self
    }

    /// Whether commits go through a write-ahead journal beside the file
    /// (`<file>-journal`, 4 MiB, preallocated); default on. With it, each group commit is one
    /// checksummed frame appended to the journal and made durable by one `fdatasync` (a few
    /// KiB written where a redb commit writes its header and 5-7 scattered pages), and redb
    /// commits the same changes without its own fsync; a *checkpoint* (a durable redb commit)
    /// catches the file up every 4 MiB of frames, 1024 frames or 30 s, at
    /// [`Queue::flush`], shutdown and close. Reopening replays the frames after the file's
    /// last checkpoint before anything else, so every call that returned `Ok` survives a
    /// crash or a power loss as without it. As SQLite's write-ahead log.
    ///
    /// A group carrying a caller's own writes ([`Lease::ack_with`](crate::Lease::ack_with),
    /// [`Queue::write`], a worker's effect handler) cannot be replayed from the journal, so it
    /// is a checkpoint: its writes and the ack stay one atomic, durable commit, at today's
    /// cost. The guide's durability chapter has the measured gain and what a copy of the
    /// file alone holds (the queue as of its last checkpoint: back up both files, or call
    /// [`Queue::flush`] first).
    ///
    /// It applies only with [`Durability::Immediate`], without [`Builder::live_reads`]
    /// (redb's shared mode refuses commits without an fsync; readers in other processes
    /// could not see what only the journal holds) and to files opened by path or by
    /// [`Builder::open_backends`]; otherwise it is off. Off or on, an open replays a journal
    /// the file was left with.
    pub fn journal(mut self, enabled: bool) -> Self {
        self.journal = enabled;
        self
    }

    /// Whether this handle's commits count what they did in the file's per-minute metrics
    /// ([`Queue::metrics`], read by `leaseq watch` for its rates); default on. The counts of
    /// committed groups are kept in memory and written at most once per second, with a
    /// later commit (a few rows per queue), [`Queue::flush`], the shutdown or the close; the
    /// durability chapter of the guide has the measured cost. Off, nothing is counted while
    /// this handle has the file open (the minutes it was open read as quiet); nothing else
    /// changes.
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.metrics = enabled;
        self
    }

    /// How [`Queue::enqueue_value`] encodes typed payloads on the handles this builder opens
    /// (named queues start with it too); default [`Encoding::Bincode`](crate::Encoding::Bincode).
    /// Jobs record their encoding, so changing it later still decodes the jobs stored before.
    /// See [`Encoding`](crate::Encoding) for which to choose.
    pub fn encoding(mut self, encoding: crate::format::payload::Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// How long a job waits before its next attempt after one that ended without an ack (a
    /// `nack` without an explicit backoff, an expired lease, a failing `ack_with` closure);
    /// default [`RetryPolicy::default`] (exponential from 1 s, capped at 1 hour, 10 %
    /// jitter). Checked at open: see [`RetryPolicy`] for the ranges.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// How long the applied-ids marker of a caller idempotency key
    /// ([`EnqueueOptions::idempotency_key`](crate::EnqueueOptions::idempotency_key)) is kept after its effect was applied; default 7
    /// days; `None` keeps markers forever (the table then grows with every key ever used). A
    /// marker is never removed while a live job (scheduled, ready, leased or dead) carries
    /// its key: then its retention starts again. **A duplicate that arrives after the
    /// horizon is applied again**: set it longer than any producer may retry. Markers go a
    /// few per new marker, as `ack_with` writes them, and all at once with [`Queue::prune`].
    /// Whole milliseconds, from 1 ms to [`DELAY_MAX`](crate::DELAY_MAX), checked at open.
    /// (A job without a caller key keeps no marker at all: it would guard nothing once the
    /// job is gone.)
    pub fn applied_retention(mut self, retention: Option<Duration>) -> Self {
        self.applied_retention = retention;
        self
    }

    /// How long a dead job is kept after it died before it is deleted (with its dedup key);
    /// default `None`: dead jobs stay until removed, purged or requeued, because an app must
    /// see its failures (as Oban and River keep discarded jobs until their pruner's age).
    /// Dead jobs past it go a few per dequeue that leases or sweeps something, and all with
    /// [`Queue::prune`]. Whole
    /// milliseconds, from 1 ms to [`DELAY_MAX`](crate::DELAY_MAX), checked at open.
    ///
    /// Beside it, [`Builder::dead_jobs_max`] keeps at most so many dead jobs per queue
    /// (10,000 by default), the oldest deleted first.
    pub fn dead_retention(mut self, retention: Option<Duration>) -> Self {
        self.dead_retention = retention;
        self
    }

    /// How many dead jobs each queue keeps at most; default
    /// [`DEAD_JOBS_MAX_DEFAULT`](crate::DEAD_JOBS_MAX_DEFAULT) (10,000); `None` keeps them
    /// all. Past it the oldest (by when they died) are deleted with their dedup keys, as
    /// BullMQ's `removeOnFail: N` keeps the last N failed jobs: up to 256 at each dequeue that
    /// sweeps, and all with [`Queue::prune`](crate::Queue::prune). So a queue holds at most
    /// this many plus the jobs that died since its last dequeue. Applies to every queue the
    /// handle's file serves through handles of this builder (a setting of the handle, as
    /// [`Builder::dead_retention`], not stored in the file).
    ///
    /// # Errors
    /// At open: `InvalidOption` (field `dead_jobs_max`) for `Some(0)`.
    pub fn dead_jobs_max(mut self, max: Option<u64>) -> Self {
        self.dead_jobs_max = max;
        self
    }

    /// The disk reserve, in bytes: room kept on the file's disk for the drain, so a disk
    /// that fills never stops it. Default
    /// [`DISK_RESERVE_DEFAULT`](crate::DISK_RESERVE_DEFAULT) (8 MiB), or an eighth of the
    /// file system if that is less; 0 turns it off.
    ///
    /// Before each commit that writes, the handle looks at the bytes free on the disk and at
    /// what the file and its journal take. The file is *storage full* once the room left
    /// (the free bytes, or the [file limit](Builder::file_bytes_max) less the bytes taken,
    /// each plus the bytes the file can reuse inside itself, less what enqueues took since
    /// they were counted) is under the reserve, or the disk alone has under a quarter of it
    /// free. Then calls that only grow it (every enqueue, an import, a schedule's instance,
    /// which is then skipped) are refused with [`Error::StorageFull`], nothing written, while
    /// dequeue, ack, `ack_with`, nack, cancel, remove, prune and [`Queue::compact`] go on,
    /// each group a checkpoint so the pages one ack frees serve the next (an `ack_with` whose
    /// closure passes on a follow-up's `StorageFull` snoozes its job, no attempt spent). One
    /// large batch (twice its payload a quarter of the reserve or more) that would take the
    /// room above the reserve is refused the same (`needs_bytes` set), the file staying open
    /// to smaller calls. The state ends by itself once the room left is twice the reserve
    /// and the disk has half of it free (the drain freed pages, or someone freed disk space),
    /// seen at the next commit or refused enqueue: no restart.
    /// [`Event::StorageFull`](crate::Event::StorageFull) and
    /// [`Event::StorageAvailable`](crate::Event::StorageAvailable) mark the turns, and
    /// [`Stats::storage_full_ms`](crate::Stats::storage_full_ms) says since when, as of the
    /// writer's last commit (and of its open), as etcd's NOSPACE alarm leaves reads and
    /// deletes.
    ///
    /// The reserve's bytes are held, allocated, in `<file>-reserve` beside the file (as
    /// CockroachDB's emergency ballast). It is deleted once the disk has under a quarter of
    /// the reserve free (another process filled it, or the drain needs more), so the drain
    /// has that much room; a file that fills the disk itself keeps it. It is made (at open
    /// too) only on a disk with three times the reserve free. A file system that refuses
    /// preallocation gets it written; one that refuses it otherwise (the name taken) leaves
    /// the reserve without it, logged. On a file system with snapshots (APFS Time Machine,
    /// btrfs, ZFS), deleting it may free nothing.
    ///
    /// Size it for the producer: the state turns before a commit, so the reserve must cover
    /// what is written between two looks (near the edge, one group) and what the drain
    /// writes before the pages it frees are reused; measured in the operations chapter (a
    /// producer faster than the drain on a 24 MiB disk with the default 3 MiB). With 0, no
    /// reserve file is kept (one an earlier open left is deleted): with a file limit the file
    /// turns full 256 KiB before it, and without one nothing is looked at and the disk fills
    /// to its last byte (then every write fails with `Io` or `CommitFailed`, as the
    /// durability chapter says). Only a file with a path has one (not a
    /// [`Builder::open_backend`] one).
    ///
    /// # Errors
    /// At open: `InvalidOption` (field `disk_reserve`) above
    /// [`DISK_RESERVE_MAX`](crate::DISK_RESERVE_MAX) (1 GiB).
    pub fn disk_reserve(mut self, bytes: u64) -> Self {
        self.disk_reserve = Some(bytes);
        self
    }

    /// The file limit, in bytes: what the queue file and its journal may take on disk (their
    /// allocated bytes, as `du` counts them); default `None`, no limit but the disk's. The
    /// file turns *storage full* once it is within the [disk reserve](Builder::disk_reserve)
    /// of the limit, counting the pages it can reuse as room; see there for what is refused
    /// and what goes on. So the drain itself may take the file up to the limit, not past it
    /// (with a reserve that covers a checkpoint).
    ///
    /// # Errors
    /// At open: `InvalidOption` (field `file_bytes_max`) for a limit under 4 times the
    /// reserve (256 KiB at least, the room kept under a limit with `disk_reserve(0)`) plus the
    /// journal's 4 MiB when it is on.
    pub fn file_bytes_max(mut self, max: Option<u64>) -> Self {
        self.file_bytes_max = max;
        self
    }

    /// Whether every open verifies the file with redb's integrity check; default **on**.
    ///
    /// With it on, the open verifies the checksum of every page of the committed trees and
    /// rebuilds redb's allocator state (which free pages it may reuse) from them instead of
    /// loading the copy saved in the file. A file damaged outside redb (a flaky disk or SD
    /// card, a stray write, a bad copy) is then refused with `Error::Corrupted` at open. This
    /// costs two reads of the whole file at every open of an existing file (the look on a
    /// scratch copy, then the writable open): 70-80 ms per 100 MB of queue file from the page
    /// cache on the development machine (docs/performance.md, "Memory and recovery": 200-223 ms for 272 MiB),
    /// more from a cold disk. After a crash without
    /// quick-repair, redb's own repair does the same work anyway, so the check adds nothing
    /// there; with quick-repair it replaces the millisecond reopen.
    ///
    /// **What turning it off gives up**: a cleanly closed file, or with quick-repair any file,
    /// is then trusted as redb saved it, and redb makes no promise for a file altered since.
    /// Damage to its allocator state is not seen at open; the first commit that reuses a
    /// damaged page can make redb panic inside its unwinding, which **aborts the process**
    /// (no `catch_unwind`, leaseq's included, can stop that), at every start from then on.
    /// Damage to table pages is still mostly reported as `Corrupted` when read, but a damaged
    /// page number can make redb allocate the page size it names (up to 4 GiB) before the read
    /// fails. Turn it off only for large files whose open time matters, on storage you trust.
    ///
    /// With it on, [`Builder::open`] verifies the file twice: once on an in-memory scratch
    /// copy before anything is written (so a foreign or damaged file is refused unchanged),
    /// then at the writable open. [`Builder::on_repair`] sees both passes.
    ///
    /// Applies to [`Builder::open`] and [`Builder::open_backend`]. [`Builder::attach`] runs
    /// the same check on the caller's database ([`redb::Database::check_integrity`]) while it
    /// is on.
    ///
    /// **On 32-bit targets** (armv7, i686) the check stays on whatever this says: there, the
    /// up-to-4 GiB allocation a damaged page number can ask for does not fit the address
    /// space and aborts the process, so a damaged file could never be an `Error` without it.
    pub fn check_integrity(mut self, enabled: bool) -> Self {
        self.check_integrity = enabled;
        self
    }

    /// The time source; default [`SystemClock`]. Use a [`ManualClock`](crate::ManualClock) in
    /// tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Called during a repair at open with the progress in `[0.0, 1.0)`: a file that was not
    /// closed cleanly needs one, and a large file takes seconds. The integrity check
    /// ([`Builder::check_integrity`]) runs as a repair pass, so with it on this is called at
    /// every open of an existing file.
    pub fn on_repair(mut self, callback: impl Fn(f64) + Send + Sync + 'static) -> Self {
        self.on_repair = Some(Arc::new(callback));
        self
    }

    fn config(&self) -> Result<QueueConfig> {
        let lease_ms = store::validate_lease_ms("lease", self.lease)?;
        store::validate_max_attempts(self.max_attempts)?;
        if self.payload_bytes_max > crate::limits::PAYLOAD_BYTES_MAX_CAP {
            return Err(Error::invalid_option(
                "payload_bytes_max",
                format!(
                    "above the cap of {} bytes",
                    crate::limits::PAYLOAD_BYTES_MAX_CAP
                ),
            ));
        }
        if self.dequeue_batch_bytes == 0 {
            return Err(Error::invalid_option(
                "dequeue_batch_bytes",
                "must be at least 1",
            ));
        }
        self.retry.validate("retry")?;
        if self.live_reads && self.durability == Durability::None {
            return Err(Error::invalid_option(
                "live_reads",
                "cannot be combined with Durability::None: readers in other processes \
                 follow durable commits only",
            ));
        }
        let applied_retention_ms = retention_ms("applied_retention", self.applied_retention)?;
        let dead_retention_ms = retention_ms("dead_retention", self.dead_retention)?;
        if self.dead_jobs_max == Some(0) {
            return Err(Error::invalid_option(
                "dead_jobs_max",
                "0 dead jobs: at least 1 (a job that dies must be seen), or None for all",
            ));
        }
        if self.disk_reserve.unwrap_or(0) > crate::limits::DISK_RESERVE_MAX {
            return Err(Error::invalid_option(
                "disk_reserve",
                format!("at most {} bytes (1 GiB)", crate::limits::DISK_RESERVE_MAX),
            ));
        }
        if let Some(max) = self.file_bytes_max {
            let reserve = self
                .disk_reserve
                .unwrap_or(crate::limits::DISK_RESERVE_DEFAULT)
                .max(crate::disk_reserve::LIMIT_MARGIN_MIN);
            let journal = if self.journaling() {
                crate::format::journal::FRAMES_START + crate::limits::JOURNAL_BYTES
            } else {
                0
            };
            let least = reserve.saturating_mul(4).saturating_add(journal);
            if max < least {
                return Err(Error::invalid_option(
                    "file_bytes_max",
                    format!(
                        "{max} bytes: at least {least}, 4 times the room kept under a limit ({reserve} bytes: the disk reserve, or 256 KiB if that is more) and the journal ({journal} bytes)"
                    ),
                ));
            }
        }
        Ok(QueueConfig {
            dead_retention_ms,
            dead_jobs_max: self.dead_jobs_max,
            applied_retention_ms,
            lease_ms,
            max_attempts: self.max_attempts,
            payload_bytes_max: self.payload_bytes_max,
            dequeue_batch_bytes: self.dequeue_batch_bytes,
            retry: self.retry,
            schema: &crate::format::schema::DEFAULT_SCHEMA,
            committer_id: 0,
            encoding: self.encoding,
        })
    }

    /// Whether opens verify the file: [`Builder::check_integrity`], always on 32-bit targets.
    fn verifies(&self) -> bool {
        self.check_integrity || cfg!(target_pointer_width = "32")
    }

    /// How the writable open shares the file with other processes: readers beside it with
    /// [`Builder::live_reads`], nobody else without.
    pub(crate) fn concurrency_mode(&self) -> redb::ConcurrencyMode {
        if self.live_reads {
            redb::ConcurrencyMode::SingleWriter
        } else {
            redb::ConcurrencyMode::ExclusiveWriter
        }
    }

    fn redb_builder(&self) -> redb::Builder {
        let mut b = redb::Builder::new();
        b.set_cache_size(self.cache_bytes);
        b.set_concurrency_mode(self.concurrency_mode());
        // Verify instead of trusting the allocator state saved in the file: redb's plain open
        // may panic on a file altered outside redb, and a panic in its unwinding aborts.
        b.set_check_integrity_on_open(self.verifies());
        if let Some(cb) = self.on_repair.clone() {
            b.set_repair_callback(move |session| cb(session.progress()));
        }
        b
    }

    /// Opens the queue file at `path`, creating it if no file is there.
    ///
    /// A new file is created atomically: built at a temporary path beside it, closed,
    /// flushed, hard-linked into place (never over an existing file), and the name made
    /// durable (the directory fsynced on Unix; on Windows, where a directory cannot be
    /// flushed, the file is flushed again through its new name, which forces NTFS's journal
    /// holding the name to disk), because a power loss inside redb's first create can leave
    /// a file redb refuses to open. On a file system without hard links (FAT32 and exFAT: SD
    /// cards, USB sticks) the finished file is renamed into place instead, while holding an
    /// exclusive lock on `.{name}.create-lock` beside it, which every creator of the name
    /// takes and which stays there; a power loss on FAT, which keeps no journal, can still
    /// damage the volume's own directory. An existing file is never recreated or deleted.
    ///
    /// Before the queue is returned, every lease left by a previous process goes back to
    /// ready, or dead when out of attempts, in one transaction ([`Queue::recovery`] reports
    /// it); the exclusive file lock proves that process is gone.
    ///
    /// # Errors
    /// - `InvalidOption` for a builder setting out of range (nothing is opened);
    /// - `AlreadyOpen` if this or another process has the file open (no recovery runs).
    ///   Threads of one process opening a file at once open it in turn: one gets the queue,
    ///   the others `AlreadyOpen` once it has it (each waits for the open before it, a
    ///   verified open of a large file included). Two processes opening at once: a writable
    ///   open refused right after its look found the file free is tried again 3 times (2, 4,
    ///   8 ms), so that both being refused takes a run of unlucky timings (not tested across
    ///   processes; the threads' case is);
    /// - `Truncated` for a file shorter than a redb header (0 bytes included);
    /// - `NotLeaseq` for a file that is not a redb database, or a redb database without
    ///   leaseq's tables (use [`Builder::attach`]); the file is left byte-identical;
    /// - `UnsupportedVersion` for a newer format, also leaving the file byte-identical;
    /// - `Corrupted` if redb or leaseq finds damage: with [`Builder::check_integrity`] on (the
    ///   default), a page of the file's trees altered outside redb is found at open; panics in
    ///   redb are caught;
    /// - `NotLeaseq` for a path that is a directory or anything but a regular file;
    /// - `Io` for a directory that does not exist or cannot take a new file (read-only
    ///   volume, no permission: the message names the directory; nothing is created), and
    ///   for an existing file that cannot be opened for writing (a read-only file or volume:
    ///   kind `PermissionDenied` or `ReadOnlyFilesystem`, the message naming the file, which
    ///   is left byte-identical). Every open writes (it returns orphaned leases), so there is
    ///   no read-only open: copy a file from write-protected media to look at it. A name the
    ///   platform refuses (on Windows `NUL`, `aux.leaseq`, `?` or `:` in a name) is an `Io`
    ///   error of the OS's kind;
    /// - `Io` or `Storage` for other I/O failures.
    #[track_caller]
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Queue> {
        let path = path.as_ref();
        let _span = tracing::info_span!("leaseq.open", path = %path.display()).entered();
        let started = std::time::Instant::now();
        let r = catch_engine_panic(|| self.open_path(path)).map_err(|e| naming(e, path));
        let at = std::panic::Location::caller();
        let r = r.map(|q| q.made_at(at));
        logged(&r, started);
        r
    }

    fn open_path(&self, path: &Path) -> Result<Queue> {
        let config = self.config()?;
        let mut created = false;
        match fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_atomically(path)?;
                created = true;
            }
            Err(e) => return Err(e.into()),
            Ok(m) if !m.is_file() => {
                return Err(Error::NotLeaseq {
                    path: path.to_path_buf(),
                    detail: "not a regular file".into(),
                });
            }
            Ok(_) => {}
        }
        let repaired = validate_header(path)?;
        // A look holds the file's locks only while it looks, so an opener's writable open can
        // meet a racer's look and be refused though nobody keeps the file: threads of this
        // process open one file in turn, and a refusal right after a look that found the file
        // free (another process's look, most likely) is tried again a few times.
        let _turn = OpenTurn::take(path);
        let mut retries = 0;
        loop {
            match self.look_and_open(path, config, repaired, created) {
                Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) if retries < OPEN_RETRIES => {
                    std::thread::sleep(Duration::from_millis(2 << retries));
                    retries += 1;
                }
                Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) => {
                    return Err(Error::already_open(path));
                }
                other => return other,
            }
        }
    }

    /// The look at the file (which never writes it), then its writable open: `AlreadyOpen`
    /// when the look is refused, redb's `DatabaseAlreadyOpen` (so the caller may retry) when
    /// only the writable open is.
    fn look_and_open(
        &self,
        path: &Path,
        config: QueueConfig,
        repaired: bool,
        created: bool,
    ) -> Result<Queue> {
        let builder = self.redb_builder();
        // A look first that never writes the file, so a foreign, newer or damaged file stays
        // byte-identical. With the integrity check on, the look is a verified open of a
        // scratch copy (writes kept in memory): every page is checked against its parent's
        // checksum before any pointer in it is followed, so a damaged table root is
        // `Corrupted` and never a read of a page size taken from damaged bytes (up to 4 GiB
        // allocated inside redb). Without the check, a plain read-only open; a file that
        // needs repair (a crashed writer) cannot be opened read-only and is repaired on a
        // scratch copy first. Either scratch look takes the locks a real open takes.
        if self.verifies() {
            self.look_on_scratch(path, true, self.concurrency_mode())?;
        } else {
            match catch_engine_panic(|| builder.open_read_only(path).map_err(Error::from)) {
                Ok(ro) => {
                    let rtx = ro.begin_read()?;
                    validate_format(&rtx, path)?;
                    // What recovery will read must decode now, so a damaged lease is refused
                    // before the writable open touches the file.
                    catch_engine_panic(|| store::read_leased_rows(&rtx))?;
                }
                Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) => {
                    return Err(Error::already_open(path));
                }
                Err(Error::Storage(redb::Error::RepairAborted)) => {
                    self.look_on_scratch(path, false, self.concurrency_mode())?;
                }
                Err(e) => return Err(e),
            }
        }
        // A refusal here is passed on as redb's: the look found the file free a moment ago.
        catch_engine_panic(|| builder.open(path).map_err(Error::from)).and_then(|db| {
            let db = GuardedDb::new(db);
            validate_format(&db.get().begin_read()?, path)?;
            self.finish(
                db,
                config,
                Some(path.to_path_buf()),
                JournalAt::Path(crate::journal::path_beside(path)),
                repaired,
                created,
            )
        })
    }

    /// Opens the file at `path` for reading only: see [`Reader::open`](crate::Reader::open),
    /// which is this with the default settings. Of the builder's settings, `cache_bytes`,
    /// `check_integrity` and `on_repair` apply; the others are for writers.
    ///
    /// # Errors
    /// As [`Reader::open`](crate::Reader::open).
    pub fn open_reader(&self, path: impl AsRef<Path>) -> Result<crate::reader::Reader> {
        let path = path.as_ref();
        let _span = tracing::info_span!("leaseq.open_reader", path = %path.display()).entered();
        let source =
            catch_engine_panic(|| self.reader_source(path)).map_err(|e| naming(e, path))?;
        Ok(crate::reader::Reader::new(source, path.to_path_buf()))
    }

    /// Where a reader reads from: the file itself beside a live writer (or none), or a scratch
    /// copy when the file needs a repair or an upgrade first (both done in memory only).
    fn reader_source(&self, path: &Path) -> Result<crate::reader::Source> {
        match fs::metadata(path) {
            Ok(m) if !m.is_file() => {
                return Err(Error::NotLeaseq {
                    path: path.to_path_buf(),
                    detail: "not a regular file".into(),
                });
            }
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        // The recovery-required flag is set while a writer has the file open, and left set by
        // one that crashed.
        let writer_flag = validate_header(path)?;
        if !writer_flag && self.verifies() {
            // No writer: verify the file as a writable open would, on a scratch copy that
            // takes no lock, so an app may open the file meanwhile (its own open verifies it
            // then). Damage found while an app opened is not the reader's to report: the
            // torn view of a file being written fails checksums too.
            let scratch = ScratchBackend::new(fs::File::open(path)?)?;
            match self.look_on(scratch, path, true, redb::ConcurrencyMode::ExclusiveWriter) {
                Ok(()) => {}
                Err(_) if validate_header(path)? => {}
                Err(e) => return Err(e),
            }
        }
        let mut b = redb::Builder::new();
        b.set_cache_size(self.cache_bytes);
        b.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
        match catch_engine_panic(|| b.open_read_only(path).map_err(Error::from)) {
            Ok(ro) => {
                let version = validate_format(&ro.begin_read()?, path)?;
                if version == FORMAT_VERSION {
                    return Ok(crate::reader::Source::Live(crate::reader::GuardedRo::new(
                        ro,
                    )));
                }
                // An older format: upgraded on a scratch copy, below.
            }
            Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) => {
                return Err(Error::HeldExclusively {
                    path: path.to_path_buf(),
                });
            }
            // Left by a writer that crashed: repaired on a scratch copy, below.
            Err(Error::Storage(redb::Error::RepairAborted)) => {}
            Err(e) => return Err(e),
        }
        self.snapshot_on_scratch(path)
    }

    /// A scratch copy of the file, repaired and upgraded in memory, kept as the reader's
    /// snapshot: it holds the whole file's lock until the reader is dropped (a writer that
    /// opens meanwhile gets `AlreadyOpen`, another reader `HeldExclusively`, so none reads
    /// the unrepaired file in place), and nothing of it ever reaches the file. A file this
    /// process cannot open for writing is read without locks: no process of this user can
    /// write it either.
    fn snapshot_on_scratch(&self, path: &Path) -> Result<crate::reader::Source> {
        // A conflict here is a writer that opened since the look, or another reader's
        // snapshot: `AlreadyOpen`, try again.
        let (db, retire) = self.scratch_db(
            scratch_for_reading(path)?,
            path,
            self.verifies(),
            redb::ConcurrencyMode::ExclusiveWriter,
        )?;
        // What the journal beside it holds is part of the file: replayed into the copy (in
        // memory), and the journal left as it is.
        validate_format(&db.get().begin_read()?, path)?;
        let journal = crate::journal::open_existing(&crate::journal::path_beside(path))?;
        crate::journal::start_session(db.get(), journal, None, path)?;
        let snapshot = crate::reader::Source::Snapshot { db, retire };
        let version = validate_format(&snapshot.begin_read()?, path)?;
        if version < FORMAT_VERSION
            && let crate::reader::Source::Snapshot { db, .. } = &snapshot
        {
            let committer = Committer::new(Durability::Immediate, false);
            committer.run(db.get(), &mut |ctx| store::upgrade(ctx).map(Ok))?;
        }
        Ok(snapshot)
    }

    /// Opens a scratch copy of the file at `path` (reads from the file, writes kept in memory,
    /// redb's file locks taken), with redb's integrity check when `verify`, and checks the
    /// format and every lease there; the copy is then retired and dropped, the file unchanged.
    fn look_on_scratch(
        &self,
        path: &Path,
        verify: bool,
        mode: redb::ConcurrencyMode,
    ) -> Result<()> {
        self.look_on(ScratchBackend::locked(path)?, path, verify, mode)
    }

    /// A redb database on `scratch` (with the integrity check when `verify`, redb's locks of
    /// `mode`), and the switch that retires it; `AlreadyOpen` when the locks conflict.
    fn scratch_db(
        &self,
        scratch: ScratchBackend,
        path: &Path,
        verify: bool,
        mode: redb::ConcurrencyMode,
    ) -> Result<(GuardedDb, crate::scratch::Retire)> {
        let retire = scratch.retire_handle();
        let mut b = redb::Builder::new();
        b.set_cache_size(self.cache_bytes);
        b.set_concurrency_mode(mode);
        b.set_check_integrity_on_open(verify);
        if let Some(cb) = self.on_repair.clone() {
            b.set_repair_callback(move |session| cb(session.progress()));
        }
        match catch_engine_panic(|| b.create_with_backend(scratch).map_err(Error::from)) {
            Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) => Err(Error::already_open(path)),
            other => Ok((GuardedDb::new(other?), retire)),
        }
    }

    /// [`Builder::look_on_scratch`] on a given scratch copy.
    fn look_on(
        &self,
        scratch: ScratchBackend,
        path: &Path,
        verify: bool,
        mode: redb::ConcurrencyMode,
    ) -> Result<()> {
        // The locks of the open that follows: in the shared mode, readers beside it are no
        // reason to refuse.
        let (db, retire) = self.scratch_db(scratch, path, verify, mode)?;
        let looked = catch_engine_panic(|| {
            let rtx = db.get().begin_read()?;
            validate_format(&rtx, path)?;
            // What recovery will read must decode now, so a damaged lease is refused before
            // the writable open touches the file.
            store::read_leased_rows(&rtx)
        });
        // The scratch copy is thrown away: close it without saving its state.
        retire.retire(db.get());
        looked
    }

    /// Opens a queue on a caller-supplied redb storage backend (for example the power-loss
    /// simulator of the `sim` feature). An empty backend, or one holding a redb database with
    /// no tables at all, is initialized as a new queue; any other must hold a leaseq database.
    /// Unlike a path, a backend cannot be created atomically: a power loss inside redb's very
    /// first write of the header can leave it unopenable (redb: "magic number mismatch");
    /// start such a backend afresh.
    ///
    /// The integrity check ([`Builder::check_integrity`], on by default) runs as for a path,
    /// so damage to the backend's bytes is refused with `Corrupted`. Unlike a path, a backend
    /// gets no read-only look first: a backend holding a foreign or newer redb database is
    /// refused, but redb's open (and the check's commit) may already have written to it.
    ///
    /// # Errors
    /// As [`Builder::open`], without the path-based checks.
    #[track_caller]
    pub fn open_backend(&self, backend: impl StorageBackend) -> Result<Queue> {
        let _span = tracing::info_span!("leaseq.open", backend = true).entered();
        let started = std::time::Instant::now();
        let r = catch_engine_panic(|| self.open_on_backend(backend, JournalAt::None));
        let at = std::panic::Location::caller();
        let r = r.map(|q| q.made_at(at));
        logged(&r, started);
        r
    }

    /// As [`Builder::open_backend`], with the write-ahead journal ([`Builder::journal`]) on
    /// a backend of its own: `journal`, which holds a journal of this queue, or nothing
    /// (empty) for a new one. The pair is what a path's file and its `-journal` file are;
    /// the power-loss simulator (`leaseq::sim`, feature `sim`) cuts power across both.
    ///
    /// # Errors
    /// As [`Builder::open_backend`]; `NotLeaseq` if `journal` holds something other than a
    /// leaseq journal; `UnsupportedVersion` for a newer journal holding frames the queue
    /// needs; `Io` from the journal backend.
    #[track_caller]
    pub fn open_backends(
        &self,
        backend: impl StorageBackend,
        journal: impl StorageBackend,
    ) -> Result<Queue> {
        let _span = tracing::info_span!("leaseq.open", backend = true, journal = true).entered();
        let started = std::time::Instant::now();
        let r = catch_engine_panic(|| {
            self.open_on_backend(backend, JournalAt::Backend(Box::new(journal)))
        });
        let at = std::panic::Location::caller();
        let r = r.map(|q| q.made_at(at));
        logged(&r, started);
        r
    }

    fn open_on_backend(&self, backend: impl StorageBackend, journal: JournalAt) -> Result<Queue> {
        let config = self.config()?;
        let len_bytes = backend.len().map_err(Error::Io)?;
        let empty = len_bytes == 0;
        let repaired = len_bytes >= REDB_HEADER_BYTES && {
            let mut god = [0u8];
            backend
                .read(REDB_GOD_BYTE_OFFSET, &mut god)
                .map_err(Error::Io)?;
            god[0] & REDB_RECOVERY_REQUIRED != 0
        };
        let db = catch_engine_panic(|| {
            self.redb_builder()
                .create_with_backend(backend)
                .map_err(Error::from)
        })?;
        let db = GuardedDb::new(db);
        // A backend has no atomic create: a crash inside its first open can leave an empty
        // redb database (no tables at all), which is finished here as a new queue.
        let blank = empty || {
            let rtx = db.get().begin_read()?;
            rtx.list_tables()?.next().is_none() && rtx.list_multimap_tables()?.next().is_none()
        };
        if blank {
            init_tables(db.get())?;
        }
        validate_format(&db.get().begin_read()?, Path::new("<backend>"))?;
        self.finish(db, config, None, journal, repaired && !blank, blank)
    }

    /// Adds leaseq's tables to the caller's own redb database (if they are not there yet) and
    /// returns a queue that shares it: the caller keeps using its tables through
    /// [`Queue::database`]. Leases found in the database are recovered as at open, so attach
    /// only a database this process alone writes.
    ///
    /// The caller opened the database, so the caller's redb settings decided what that open
    /// trusted; `cache_bytes`, `quick_repair` and `on_repair` do not apply here. With
    /// [`Builder::check_integrity`] on (the default), attach first runs
    /// [`redb::Database::check_integrity`], which verifies every page and rebuilds the
    /// allocator state, so a file altered outside redb is refused with `Corrupted` before
    /// leaseq's first commit. A plain `redb::Database::open` of a damaged file may already
    /// have panicked in the caller's code: open it with
    /// `redb::Builder::set_check_integrity_on_open(true)` (and then set
    /// `check_integrity(false)` here, so the file is not verified twice).
    ///
    /// # Errors
    /// `UnsupportedVersion` for leaseq tables of a newer format; `NotLeaseq` if a table named
    /// `leaseq_*` exists with other types; `Corrupted` if the integrity check finds damage it
    /// cannot repair; `Storage` (`TransactionInProgress`) if the check is on and the caller
    /// still holds a transaction on `db`; `Storage` or `Corrupted` from redb otherwise.
    #[track_caller]
    pub fn attach(&self, db: Database) -> Result<Queue> {
        let _span = tracing::info_span!("leaseq.open", attach = true).entered();
        let started = std::time::Instant::now();
        let r = catch_engine_panic(|| self.attach_db(db));
        let at = std::panic::Location::caller();
        let r = r.map(|q| q.made_at(at));
        logged(&r, started);
        r
    }

    fn attach_db(&self, mut db: Database) -> Result<Queue> {
        let config = self.config()?;
        // `Ok(false)`: damage was found and repaired (redb rebuilt what it could verify).
        let repaired = self.verifies() && !db.check_integrity()?;
        let db = GuardedDb::new(db);
        // Refuse a newer format or foreign `leaseq_*` tables before writing anything.
        validate_attach(&db.get().begin_read()?)?;
        init_tables(db.get())?;
        validate_format(&db.get().begin_read()?, Path::new("<attached>"))?;
        self.finish(db, config, None, JournalAt::None, repaired, false)
    }

    /// Whether a writable open journals its commits (see [`Builder::journal`]).
    fn journaling(&self) -> bool {
        self.journal && self.durability == Durability::Immediate && !self.live_reads
    }

    /// The journal at `at` replayed into `db` (frames after the file's last checkpoint), and
    /// with the journal on, a new session started on it, recorded durably before the open
    /// goes on.
    fn start_journal(
        &self,
        db: &redb::Database,
        at: JournalAt,
    ) -> Result<(
        crate::journal::JournalFound,
        Option<crate::journal::Journal>,
    )> {
        let on = self.journaling();
        let (file, path, made) = match at {
            JournalAt::None => (None, PathBuf::from("<none>"), None),
            JournalAt::Backend(b) => (Some(b), PathBuf::from("<journal backend>"), None),
            JournalAt::Path(p) if on => {
                let made = !p.exists();
                (
                    Some(crate::journal::open_file(&p)?),
                    p.clone(),
                    made.then_some(p),
                )
            }
            JournalAt::Path(p) => (crate::journal::open_existing(&p)?, p, None),
        };
        if let Some(p) = made
            && let Some(dir) = p.parent()
        {
            // The new journal's name durable before the file names its session.
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            crate::platform::sync_name(&p, dir)?;
        }
        let session = on.then(store::random_u64);
        let (found, journal) = crate::journal::start_session(db, file, session, &path)?;
        Ok((found, journal))
    }

    /// The disk reserve of the file at `path` (its journal beside it if `journaled`), with
    /// the state the file records; `None` (nothing looked at, a reserve file left by an
    /// earlier open deleted) for a reserve of 0 without a file limit, unless the file
    /// records itself full.
    fn disk_reserve_of(
        &self,
        db: &redb::Database,
        path: &Path,
        journaled: bool,
    ) -> Result<Option<crate::disk_reserve::DiskReserve>> {
        let reserve = match self.disk_reserve {
            Some(bytes) => bytes,
            None => {
                let dir = match path.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                let total = fs4::total_space(dir).unwrap_or(u64::MAX);
                crate::limits::DISK_RESERVE_DEFAULT.min(total / 8)
            }
        };
        let recorded = {
            let rtx = db.begin_read()?;
            match rtx.open_table(crate::format::schema::META) {
                Ok(meta) => meta
                    .get(crate::format::schema::META_STORAGE_FULL_MS)?
                    .map(|v| v.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(e.into()),
            }
        };
        // A file recorded full gets a look even so: its first commit records that it is not.
        if reserve == 0 && self.file_bytes_max.is_none() && recorded.is_none_or(|ms| ms == 0) {
            let _ = fs::remove_file(crate::disk_reserve::path_beside(path));
            return Ok(None);
        }
        let journal = journaled.then(|| crate::journal::path_beside(path));
        crate::disk_reserve::DiskReserve::open(
            path,
            journal.as_deref(),
            reserve,
            self.file_bytes_max,
            self.clock.clone(),
            recorded.filter(|&ms| ms != 0),
        )
        .map(Some)
    }

    fn finish(
        &self,
        db: GuardedDb,
        config: QueueConfig,
        path: Option<PathBuf>,
        journal_at: JournalAt,
        repaired: bool,
        created: bool,
    ) -> Result<Queue> {
        // The journal first: its frames are part of the file before anything reads it.
        let (journal_found, journal) = self.start_journal(db.get(), journal_at)?;
        let journaled = journal.is_some();
        let mut committer = Committer::new(self.durability, self.quick_repair);
        if let Some(journal) = journal {
            committer = committer.with_journal(journal);
        }
        if let Some(path) = &path
            && let Some(reserve) = self.disk_reserve_of(db.get(), path, journaled)?
        {
            committer = committer.with_reserve(Arc::new(reserve));
        }
        let metrics = self
            .metrics
            .then(|| Arc::new(crate::file::FileMetrics::new(self.clock.clone())));
        if let Some(m) = &metrics {
            committer = committer.with_seal_writer(m.clone());
        }
        let config = QueueConfig {
            committer_id: committer.id(),
            ..config
        };
        let handles = crate::handles::Handles::new(path.as_deref());
        let mut inner = OpenFile {
            db,
            committer,
            metrics,
            config,
            clock: self.clock.clone(),
            path,
            recovery: Recovery::default(),
            closed: std::sync::atomic::AtomicBool::new(false),
            draining: std::sync::atomic::AtomicBool::new(false),
            paused: parking_lot::RwLock::default(),
            pausing: parking_lot::Mutex::new(()),
            handles,
        };
        let now_ms = inner.clock.now_ms();
        let upgraded_from = inner
            .committer
            .run(inner.db.get(), &mut |ctx| store::upgrade(ctx).map(Ok))?;
        // Leases back, then the schedules due while the file was closed: one transaction,
        // before any dequeue.
        let (recovered, (schedules_fired, schedules_skipped)) =
            inner.committer.run(inner.db.get(), &mut |ctx| {
                let recovered = store::recover_leases(ctx, now_ms)?;
                let schedules = store::fire_at_open(ctx, now_ms)?;
                Ok(Ok((recovered, schedules)))
            })?;
        // The storage-full state as this open saw it (a file recorded full whose disk was
        // freed while it was closed, or the other way), recorded now: a reader, and the app's
        // own `stats()`, see it before any commit of its own.
        if let Some(since_ms) = inner.committer.reserve().and_then(|r| r.to_record()) {
            inner.committer.run(inner.db.get(), &mut |ctx| {
                store::record_storage_full(ctx, since_ms).map(Ok)
            })?;
        }
        let paused = crate::error::catch_engine_panic(|| {
            store::paused_queues(&inner.db.get().begin_read()?)
        })?;
        // A row no queue can have is left for `check()` to report; it pauses nothing.
        *inner.paused.write() = paused
            .into_iter()
            .map(|(n, _)| n)
            .filter(|&n| n <= crate::limits::QUEUES_MAX)
            .collect();
        inner
            .clock
            .subscribe(crate::clock::ClockWaker::new(inner.committer.work()));
        inner.recovery = Recovery {
            leases_returned: recovered.returned,
            leases_dead_lettered: recovered.dead,
            repaired,
            created,
            quarantined: recovered.quarantined,
            upgraded_from,
            schedules_fired,
            schedules_skipped,
            journal: journal_found,
        };
        let mark = HandleMark::new(
            &inner.handles,
            HandleKind::Queue,
            None,
            std::panic::Location::caller(),
        );
        Ok(Queue {
            config: inner.config,
            inner: Arc::new(inner),
            name: None,
            mark,
        })
    }
}

/// Where the journal of a file being opened is.
enum JournalAt {
    /// Nowhere: a backend opened alone, an attached database.
    None,
    /// Beside the file, at this path.
    Path(PathBuf),
    /// On its own backend ([`Builder::open_backends`]).
    Backend(Box<dyn StorageBackend>),
}

/// A retention setting in whole milliseconds: `None` stays `None`; 1 ms to `DELAY_MAX`.
fn retention_ms(field: &'static str, retention: Option<Duration>) -> Result<Option<u64>> {
    match retention {
        None => Ok(None),
        // Checked in whole milliseconds: 500 µs would be a retention of 0.
        Some(d) if crate::clock::duration_ms(d) == 0 || d > crate::limits::DELAY_MAX => Err(
            Error::invalid_option(field, format!("{d:?} is outside 1 ms..=DELAY_MAX")),
        ),
        Some(d) => Ok(Some(crate::clock::duration_ms(d))),
    }
}

/// A scratch copy for a reader's snapshot: with redb's locks where the file can be opened for
/// writing; without locks where it cannot (a read-only file or volume, which no process of
/// this user can be writing either; redb's exclusive mode then goes on without locks).
fn scratch_for_reading(path: &Path) -> Result<ScratchBackend> {
    match ScratchBackend::locked(path) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            Ok(ScratchBackend::new(fs::File::open(path)?)?)
        }
        other => Ok(other?),
    }
}

/// Refuses files that cannot be redb databases before redb sees them. Returns whether the
/// file was left open by a writer (redb's recovery-required flag: not closed cleanly).
fn validate_header(path: &Path) -> Result<bool> {
    let mut file = fs::File::open(path)?;
    let len_bytes = file.metadata()?.len();
    // The magic number and the god byte.
    let mut head = Vec::with_capacity(REDB_MAGIC.len() + 1);
    file.by_ref()
        .take(REDB_MAGIC.len() as u64 + 1)
        .read_to_end(&mut head)?;
    if head.len() >= REDB_MAGIC.len() && head[..REDB_MAGIC.len()] != REDB_MAGIC {
        return Err(Error::NotLeaseq {
            path: path.to_path_buf(),
            detail: "no redb header".into(),
        });
    }
    if len_bytes < REDB_HEADER_BYTES {
        return Err(Error::Truncated {
            path: path.to_path_buf(),
            len_bytes,
        });
    }
    Ok(head[REDB_GOD_BYTE_OFFSET as usize] & REDB_RECOVERY_REQUIRED != 0)
}

/// Validates that the snapshot holds leaseq's tables in a format this build reads.
fn validate_format(rtx: &redb::ReadTransaction, path: &Path) -> Result<u64> {
    let not_leaseq = |detail: String| Error::NotLeaseq {
        path: path.to_path_buf(),
        detail,
    };
    let meta = match rtx.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return Err(not_leaseq("a redb database without leaseq tables".into()));
        }
        Err(redb::TableError::TableTypeMismatch { .. }) => {
            return Err(not_leaseq("leaseq_meta has foreign types".into()));
        }
        Err(e) => return Err(e.into()),
    };
    let version = meta
        .get(META_FORMAT_VERSION)?
        .map(|v| v.value())
        .ok_or_else(|| not_leaseq("leaseq_meta has no format version".into()))?;
    if version > FORMAT_VERSION {
        return Err(Error::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if version == 0 {
        return Err(Error::corrupted("format version 0"));
    }
    // The counters the first commit will read.
    for key in [META_NEXT_ID, META_NEXT_TOKEN] {
        match meta.get(key)?.map(|v| v.value()) {
            Some(v) if v > 0 && v <= u64::MAX / 2 => {}
            other => {
                return Err(Error::corrupted(format!("leaseq_meta {key} is {other:?}")));
            }
        }
    }
    // Every table must be there with its types.
    let tables = [
        rtx.open_table(DEFAULT_SCHEMA.jobs()).map(drop),
        rtx.open_table(DEFAULT_SCHEMA.ready()).map(drop),
        rtx.open_table(DEFAULT_SCHEMA.scheduled()).map(drop),
        rtx.open_table(DEFAULT_SCHEMA.leases()).map(drop),
        rtx.open_table(DEFAULT_SCHEMA.dead()).map(drop),
        rtx.open_table(DEFAULT_SCHEMA.dedup()).map(drop),
        rtx.open_table(DEFAULT_SCHEMA.applied()).map(drop),
    ];
    for t in tables {
        t.map_err(|e| match e {
            // The disk failing under the read is not the file's damage.
            redb::TableError::Storage(storage) => Error::from(storage),
            e => Error::corrupted(format!("leaseq table: {e}")),
        })?;
    }
    Ok(version)
}

/// Creates leaseq's tables and counters where they are missing; idempotent.
fn init_tables(db: &Database) -> Result<()> {
    let tx = db.begin_write()?;
    {
        let foreign = |e: redb::TableError| match e {
            redb::TableError::TableTypeMismatch { table, .. } => Error::NotLeaseq {
                path: PathBuf::from("<attached>"),
                detail: format!("{table} has foreign types"),
            },
            e => e.into(),
        };
        tx.open_table(DEFAULT_SCHEMA.jobs()).map_err(foreign)?;
        tx.open_table(DEFAULT_SCHEMA.ready()).map_err(foreign)?;
        tx.open_table(DEFAULT_SCHEMA.scheduled()).map_err(foreign)?;
        tx.open_table(DEFAULT_SCHEMA.leases()).map_err(foreign)?;
        tx.open_table(DEFAULT_SCHEMA.dead()).map_err(foreign)?;
        tx.open_table(DEFAULT_SCHEMA.dedup()).map_err(foreign)?;
        tx.open_table(DEFAULT_SCHEMA.applied()).map_err(foreign)?;
        let mut meta = tx.open_table(META).map_err(foreign)?;
        // A new file is made at the current version, with every table of it; an existing one
        // keeps its version (the open upgrades it).
        if meta.get(META_FORMAT_VERSION)?.is_none() {
            DEFAULT_SCHEMA.create(&tx).map_err(foreign)?;
            tx.open_table(crate::format::schema::QUEUES)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::PAUSED)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::HISTORY_LIMITS)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::SCHEDULES)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::SCHEDULE_DUE)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::SCHEDULE_INSTANCES)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::RATE_LIMITS)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::METRICS)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::RUN_TIMES)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::QUEUE_LIMITS)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::DROPPED)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::GROUP_FENCES)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::SLIDING_LIMITS)
                .map_err(foreign)?;
            tx.open_table(crate::format::schema::RATE_LOG)
                .map_err(foreign)?;
        }
        for key in [META_FORMAT_VERSION, META_NEXT_ID, META_NEXT_TOKEN] {
            if meta.get(key)?.is_none() {
                let initial = if key == META_FORMAT_VERSION {
                    FORMAT_VERSION
                } else {
                    1
                };
                meta.insert(key, initial)?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

/// Before `attach` writes: a newer format version, or a `leaseq_*` table with other types,
/// is refused while the caller's database is still untouched.
fn validate_attach(rtx: &redb::ReadTransaction) -> Result<()> {
    fn refuse_other_types<K: redb::Key + 'static, V: redb::Value + 'static>(
        rtx: &redb::ReadTransaction,
        def: redb::TableDefinition<K, V>,
    ) -> Result<()> {
        match rtx.open_table(def) {
            Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => Ok(()),
            Err(redb::TableError::TableTypeMismatch { table, .. }) => Err(Error::NotLeaseq {
                path: PathBuf::from("<attached>"),
                detail: format!("{table} has foreign types"),
            }),
            Err(e) => Err(e.into()),
        }
    }
    refuse_other_types(rtx, DEFAULT_SCHEMA.jobs())?;
    refuse_other_types(rtx, DEFAULT_SCHEMA.ready())?;
    refuse_other_types(rtx, DEFAULT_SCHEMA.scheduled())?;
    refuse_other_types(rtx, DEFAULT_SCHEMA.leases())?;
    refuse_other_types(rtx, DEFAULT_SCHEMA.dead())?;
    refuse_other_types(rtx, DEFAULT_SCHEMA.dedup())?;
    refuse_other_types(rtx, DEFAULT_SCHEMA.applied())?;
    refuse_other_types(rtx, META)?;
    refuse_other_types(rtx, crate::format::schema::QUEUES)?;
    refuse_other_types(rtx, crate::format::schema::PAUSED)?;
    refuse_other_types(rtx, crate::format::schema::HISTORY_LIMITS)?;
    refuse_other_types(rtx, crate::format::schema::SCHEDULES)?;
    refuse_other_types(rtx, crate::format::schema::SCHEDULE_DUE)?;
    refuse_other_types(rtx, crate::format::schema::SCHEDULE_INSTANCES)?;
    refuse_other_types(rtx, crate::format::schema::RATE_LIMITS)?;
    refuse_other_types(rtx, crate::format::schema::METRICS)?;
    refuse_other_types(rtx, crate::format::schema::RUN_TIMES)?;
    refuse_other_types(rtx, crate::format::schema::QUEUE_LIMITS)?;
    refuse_other_types(rtx, crate::format::schema::DROPPED)?;
    refuse_other_types(rtx, crate::format::schema::GROUP_FENCES)?;
    refuse_other_types(rtx, crate::format::schema::SLIDING_LIMITS)?;
    refuse_other_types(rtx, crate::format::schema::RATE_LOG)?;
    if let Ok(meta) = rtx.open_table(META)
        && let Some(found) = meta.get(META_FORMAT_VERSION)?.map(|v| v.value())
        && found > FORMAT_VERSION
    {
        return Err(Error::UnsupportedVersion {
            found,
            supported: FORMAT_VERSION,
        });
    }
    Ok(())
}

/// Builds a new queue file at a temporary path, flushes it, and puts it in place under its
/// name without ever replacing an existing file, durably (`platform::place_new`: a hard
/// link, or on a file system without hard links a rename under the create lock).
fn create_atomically(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if path.file_name().is_none() {
        return Err(Error::invalid_option("path", "has no file name"));
    }
    // Said with the path (redb's own error would not name it).
    if !dir.is_dir() {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{}: no such directory to create the queue file in",
                dir.display()
            ),
        )));
    }
    let tmp = new_temp_file(&dir)?;
    let built = (|| -> Result<()> {
        let db = redb::Builder::new().set_cache_size(1 << 20).create(&tmp)?;
        init_tables(&db)?;
        drop(db);
        platform::sync_file(&tmp)?;
        // Another opener may create it first: then theirs is used (`Placed::Existed`).
        platform::place_new(&tmp, path, &create_lock_path(path, &dir), &dir)?;
        Ok(())
    })();
    let _ = fs::remove_file(&tmp);
    built
}

/// An `Io` error of an open said with the path (the OS's text names no file), unless it
/// already names the path or its directory; any other error as it is.
fn naming(e: Error, path: &Path) -> Error {
    match e {
        Error::Io(io) => {
            let text = io.to_string();
            let dir = path.parent().map(|d| d.display().to_string());
            let named = text.contains(&path.display().to_string())
                || dir.is_some_and(|d| !d.is_empty() && text.contains(&d));
            if named {
                Error::Io(io)
            } else {
                Error::Io(std::io::Error::new(
                    io.kind(),
                    format!("{}: {text}", path.display()),
                ))
            }
        }
        other => other,
    }
}

/// Creates an empty file with a new name in `dir` for building a queue file: the name has the
/// process id and 64 random bits (`RandomState`'s keys), so processes that share the id (in
/// other PID namespaces on a shared volume) do not share names, and `create_new` makes sure
/// no other creator's file is taken. A directory or volume that cannot take a new file (read
/// only, no permission, full) is an `Io` error naming the directory.
fn new_temp_file(dir: &Path) -> Result<PathBuf> {
    use std::hash::BuildHasher;
    let cannot = |e: std::io::Error| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("{}: cannot create the queue file here: {e}", dir.display()),
        ))
    };
    let random = std::collections::hash_map::RandomState::new();
    let mut last = None;
    for attempt in 0..8u32 {
        let tmp = dir.join(format!(
            ".leaseq-create-{}-{:016x}",
            std::process::id(),
            random.hash_one(attempt)
        ));
        match fs::File::create_new(&tmp) {
            Ok(_) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(cannot(e)),
        }
    }
    Err(cannot(last.expect("eight attempts made")))
}

/// The create lock of `path` on a file system without hard links: `.{name}.create-lock` in
/// its directory (left there: removing a lock file others may be waiting on is a race).
fn create_lock_path(path: &Path, dir: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    dir.join(format!(".{name}.create-lock"))
}

/// One `tracing` event for an open: what its recovery did, or why it was refused.
fn logged(r: &Result<Queue>, started: std::time::Instant) {
    match r {
        Ok(q) => log_recovery(&q.inner.recovery, started.elapsed()),
        Err(e) => tracing::warn!(error = %e, "leaseq: open refused"),
    }
}

/// The recovery done at an open, as one `tracing` event (info when it had work, debug
/// otherwise).
fn log_recovery(r: &Recovery, elapsed: std::time::Duration) {
    let elapsed_ms = elapsed.as_millis() as u64;
    let busy = r.leases_returned > 0
        || r.leases_dead_lettered > 0
        || r.quarantined > 0
        || r.repaired
        || r.upgraded_from.is_some();
    if busy {
        tracing::info!(
            elapsed_ms,
            leases_returned = r.leases_returned,
            leases_dead_lettered = r.leases_dead_lettered,
            quarantined = r.quarantined,
            repaired = r.repaired,
            upgraded_from = r.upgraded_from,
            "leaseq: opened after recovery"
        );
    } else {
        tracing::debug!(elapsed_ms, created = r.created, "leaseq: opened");
    }
}
