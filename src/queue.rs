//! The queue handle, its builder, and opening, creating and attaching files.

use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTable, StorageBackend};

use crate::clock::{Clock, SystemClock};
use crate::commit::{Committer, Ctx, Durability};
use crate::error::{Error, Result};
use crate::job::{
    Applied, EnqueueOptions, Enqueued, JobCursor, JobId, JobInfo, JobPage, JobState, Quarantined,
    Stats,
};
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use crate::schema::{
    DEFAULT_TABLES, FORMAT_VERSION, META, META_FORMAT_VERSION, META_NEXT_ID, META_NEXT_TOKEN,
};
use crate::scratch::ScratchBackend;
use crate::store::{self, Config, Violation};

/// The default of [`Builder::applied_retention`]: 7 days.
/// [`Builder::dequeue_batch_bytes`]'s default: 16 MiB.
const DEQUEUE_BATCH_BYTES_DEFAULT: usize = 16 << 20;

const APPLIED_RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// redb's file header: a file shorter than this cannot be a database.
const REDB_HEADER_BYTES: u64 = 320;
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
/// redb's "god byte" follows the magic number; its bit 2 is set while a writer has the file
/// open and cleared by a clean close (redb's file format, `docs/design.md`).
const REDB_GOD_BYTE_OFFSET: u64 = REDB_MAGIC.len() as u64;
const REDB_RECOVERY_REQUIRED: u8 = 2;

/// What [`Queue::prune`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// Applied-ids markers past their retention.
    pub applied: u64,
    /// Dedup keys whose window ended (released; their jobs untouched).
    pub dedup_windows: u64,
    /// Dead jobs past [`Builder::dead_retention`] (deleted).
    pub dead: u64,
}

/// What the open found and did before returning the queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Leases found in the file at open (their holder closed the file or exited without
    /// ending them) put back to ready.
    pub leases_returned: u64,
    /// Leases found in the file at open whose job had no attempts left: dead-lettered.
    pub leases_dead_lettered: u64,
    /// Whether the previous process did not close the file cleanly (it crashed or was
    /// killed), so redb recovered it at open: a full repair, or with quick-repair the
    /// allocator state its last commit saved. Always `false` for [`Builder::attach`] unless
    /// redb's integrity check found and repaired damage there.
    pub repaired: bool,
    /// Whether the open created a new file.
    pub created: bool,
    /// Leased job rows that failed their checks and were quarantined instead of returned
    /// (see [`Queue::quarantined`]).
    pub quarantined: u64,
    /// The format version the file was upgraded from at this open (in one transaction, before
    /// lease recovery), or `None` if it was current. See [`FORMAT_VERSION`].
    pub upgraded_from: Option<u64>,
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
    check_integrity: bool,
    clock: Arc<dyn Clock>,
    on_repair: Option<Arc<dyn Fn(f64) + Send + Sync>>,
    retry: RetryPolicy,
    applied_retention: Option<Duration>,
    dead_retention: Option<Duration>,
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
            .field("check_integrity", &self.check_integrity)
            .field("clock", &self.clock)
            .field("retry", &self.retry)
            .field("applied_retention", &self.applied_retention)
            .field("dead_retention", &self.dead_retention)
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
            check_integrity: true,
            clock: Arc::new(SystemClock),
            on_repair: None,
            retry: RetryPolicy::default(),
            applied_retention: Some(APPLIED_RETENTION_DEFAULT),
            dead_retention: None,
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

    /// How long a job waits before its next attempt after one that ended without an ack (a
    /// `nack` without an explicit backoff, an expired lease, a failing `ack_with` closure);
    /// default [`RetryPolicy::default`] (exponential from 1 s, capped at 1 hour, 10 %
    /// jitter). Checked at open: see [`RetryPolicy`] for the ranges.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// How long the applied-ids marker of a caller idempotency key
    /// ([`EnqueueOptions::idempotency_key`]) is kept after its effect was applied; default 7
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
    pub fn dead_retention(mut self, retention: Option<Duration>) -> Self {
        self.dead_retention = retention;
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
    /// cache on the development machine (the README's scale table: 200-223 ms for 272 MiB),
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

    fn config(&self) -> Result<Config> {
        let lease_ms = store::lease_ms_checked("lease", self.lease)?;
        if self.max_attempts == 0 || self.max_attempts > crate::MAX_ATTEMPTS_CAP {
            return Err(Error::invalid_option(
                "max_attempts",
                format!(
                    "{} is outside 1..={}",
                    self.max_attempts,
                    crate::MAX_ATTEMPTS_CAP
                ),
            ));
        }
        if self.payload_bytes_max > crate::PAYLOAD_BYTES_MAX_CAP {
            return Err(Error::invalid_option(
                "payload_bytes_max",
                format!("above the cap of {} bytes", crate::PAYLOAD_BYTES_MAX_CAP),
            ));
        }
        if self.dequeue_batch_bytes == 0 {
            return Err(Error::invalid_option(
                "dequeue_batch_bytes",
                "must be at least 1",
            ));
        }
        self.retry.validate("retry")?;
        let applied_retention_ms = retention_ms("applied_retention", self.applied_retention)?;
        let dead_retention_ms = retention_ms("dead_retention", self.dead_retention)?;
        Ok(Config {
            dead_retention_ms,
            applied_retention_ms,
            lease_ms,
            max_attempts: self.max_attempts,
            payload_bytes_max: self.payload_bytes_max,
            dequeue_batch_bytes: self.dequeue_batch_bytes,
            retry: self.retry,
            tables: &crate::schema::DEFAULT_TABLES,
            file: 0,
        })
    }

    fn redb_builder(&self) -> redb::Builder {
        let mut b = redb::Builder::new();
        b.set_cache_size(self.cache_bytes);
        // Verify instead of trusting the allocator state saved in the file: redb's plain open
        // may panic on a file altered outside redb, and a panic in its unwinding aborts.
        b.set_check_integrity_on_open(self.check_integrity);
        if let Some(cb) = self.on_repair.clone() {
            b.set_repair_callback(move |session| cb(session.progress()));
        }
        b
    }

    /// Opens the queue file at `path`, creating it if no file is there.
    ///
    /// A new file is created atomically: built at a temporary path beside it, closed,
    /// fsynced, linked into place (never over an existing file), and the directory fsynced,
    /// because a power loss inside redb's first create can leave a file redb refuses to open.
    /// An existing file is never recreated or deleted. Before the queue is returned, every
    /// lease left by a previous process goes back to ready, or dead when out of attempts, in
    /// one transaction ([`Queue::recovery`] reports it); the exclusive file lock proves that
    /// process is gone.
    ///
    /// # Errors
    /// - `InvalidOption` for a builder setting out of range (nothing is opened);
    /// - `AlreadyOpen` if this or another process has the file open (no recovery runs);
    /// - `Truncated` for a file shorter than a redb header (0 bytes included);
    /// - `NotLeaseq` for a file that is not a redb database, or a redb database without
    ///   leaseq's tables (use [`Builder::attach`]); the file is left byte-identical;
    /// - `UnsupportedVersion` for a newer format, also leaving the file byte-identical;
    /// - `Corrupted` if redb or leaseq finds damage: with [`Builder::check_integrity`] on (the
    ///   default), a page of the file's trees altered outside redb is found at open; panics in
    ///   redb are caught;
    /// - `Io` or `Storage` for I/O failures.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Queue> {
        let path = path.as_ref();
        guarded(|| self.open_path(path))
    }

    fn open_path(&self, path: &Path) -> Result<Queue> {
        let cfg = self.config()?;
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
        let repaired = check_header(path)?;
        let builder = self.redb_builder();
        let already_open = || Error::AlreadyOpen {
            path: path.to_path_buf(),
        };
        // A look first that never writes the file, so a foreign, newer or damaged file stays
        // byte-identical. With the integrity check on, the look is a verified open of a
        // scratch copy (writes kept in memory): every page is checked against its parent's
        // checksum before any pointer in it is followed, so a damaged table root is
        // `Corrupted` and never a read of a page size taken from damaged bytes (up to 4 GiB
        // allocated inside redb). Without the check, a plain read-only open; a file that
        // needs repair (a crashed writer) cannot be opened read-only and is repaired on a
        // scratch copy first. Either scratch look takes the locks a real open takes.
        if self.check_integrity {
            self.look_on_scratch(path, true)?;
        } else {
            match guarded(|| builder.open_read_only(path).map_err(Error::from)) {
                Ok(ro) => {
                    let rtx = ro.begin_read()?;
                    verify_format(&rtx, path)?;
                    // What recovery will read must decode now, so a damaged lease is refused
                    // before the writable open touches the file.
                    guarded(|| store::check_leases(&rtx))?;
                }
                Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) => {
                    return Err(already_open());
                }
                Err(Error::Storage(redb::Error::RepairAborted)) => {
                    self.look_on_scratch(path, false)?;
                }
                Err(e) => return Err(e),
            }
        }
        let opened = guarded(|| builder.open(path).map_err(Error::from)).and_then(|db| {
            let db = DbBox::new(db);
            verify_format(&db.get().begin_read()?, path)?;
            self.finish(db, cfg, Some(path.to_path_buf()), repaired, created)
        });
        match opened {
            Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) => Err(already_open()),
            other => other,
        }
    }

    /// Opens a scratch copy of the file at `path` (reads from the file, writes kept in memory,
    /// redb's file locks taken), with redb's integrity check when `verify`, and checks the
    /// format and every lease there; the copy is then retired and dropped, the file unchanged.
    fn look_on_scratch(&self, path: &Path, verify: bool) -> Result<()> {
        let scratch = ScratchBackend::locked(path)?;
        let retire = scratch.retire_handle();
        let mut b = redb::Builder::new();
        b.set_cache_size(self.cache_bytes);
        b.set_check_integrity_on_open(verify);
        if let Some(cb) = self.on_repair.clone() {
            b.set_repair_callback(move |session| cb(session.progress()));
        }
        let db = match guarded(|| b.create_with_backend(scratch).map_err(Error::from)) {
            Err(Error::Storage(redb::Error::DatabaseAlreadyOpen)) => {
                return Err(Error::AlreadyOpen {
                    path: path.to_path_buf(),
                });
            }
            other => DbBox::new(other?),
        };
        let looked = guarded(|| {
            let rtx = db.get().begin_read()?;
            verify_format(&rtx, path)?;
            // What recovery will read must decode now, so a damaged lease is refused before
            // the writable open touches the file.
            store::check_leases(&rtx)
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
    pub fn open_backend(&self, backend: impl StorageBackend) -> Result<Queue> {
        guarded(|| self.open_on_backend(backend))
    }

    fn open_on_backend(&self, backend: impl StorageBackend) -> Result<Queue> {
        let cfg = self.config()?;
        let len_bytes = backend.len().map_err(Error::Io)?;
        let empty = len_bytes == 0;
        let repaired = len_bytes >= REDB_HEADER_BYTES && {
            let mut god = [0u8];
            backend
                .read(REDB_GOD_BYTE_OFFSET, &mut god)
                .map_err(Error::Io)?;
            god[0] & REDB_RECOVERY_REQUIRED != 0
        };
        let db = guarded(|| {
            self.redb_builder()
                .create_with_backend(backend)
                .map_err(Error::from)
        })?;
        let db = DbBox::new(db);
        // A backend has no atomic create: a crash inside its first open can leave an empty
        // redb database (no tables at all), which is finished here as a new queue.
        let blank = empty || {
            let rtx = db.get().begin_read()?;
            rtx.list_tables()?.next().is_none() && rtx.list_multimap_tables()?.next().is_none()
        };
        if blank {
            init_tables(db.get())?;
        }
        verify_format(&db.get().begin_read()?, Path::new("<backend>"))?;
        self.finish(db, cfg, None, repaired && !blank, blank)
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
    pub fn attach(&self, db: Database) -> Result<Queue> {
        guarded(|| self.attach_db(db))
    }

    fn attach_db(&self, mut db: Database) -> Result<Queue> {
        let cfg = self.config()?;
        // `Ok(false)`: damage was found and repaired (redb rebuilt what it could verify).
        let repaired = self.check_integrity && !db.check_integrity()?;
        let db = DbBox::new(db);
        // Refuse a newer format or foreign `leaseq_*` tables before writing anything.
        precheck_attach(&db.get().begin_read()?)?;
        init_tables(db.get())?;
        verify_format(&db.get().begin_read()?, Path::new("<attached>"))?;
        self.finish(db, cfg, None, repaired, false)
    }

    fn finish(
        &self,
        db: DbBox,
        cfg: Config,
        path: Option<PathBuf>,
        repaired: bool,
        created: bool,
    ) -> Result<Queue> {
        let committer = Committer::new(self.durability, self.quick_repair);
        let cfg = Config {
            file: committer.id(),
            ..cfg
        };
        let inner = Inner {
            db,
            committer,
            cfg,
            clock: self.clock.clone(),
            path,
            recovery: Recovery::default(),
        };
        let now_ms = inner.clock.now_ms();
        let upgraded_from = inner
            .committer
            .run(inner.db.get(), &mut |ctx| store::upgrade(ctx))?;
        let recovered = inner.committer.run(inner.db.get(), &mut |ctx| {
            store::recover_leases(ctx, now_ms)
        })?;
        inner
            .clock
            .subscribe(crate::clock::ClockWaker::new(inner.committer.work()));
        let inner = Inner {
            recovery: Recovery {
                leases_returned: recovered.returned,
                leases_dead_lettered: recovered.dead,
                repaired,
                created,
                quarantined: recovered.quarantined,
                upgraded_from,
            },
            ..inner
        };
        Ok(Queue {
            cfg: inner.cfg,
            inner: Arc::new(inner),
            name: None,
        })
    }
}

/// A retention setting in whole milliseconds: `None` stays `None`; 1 ms to `DELAY_MAX`.
fn retention_ms(field: &'static str, retention: Option<Duration>) -> Result<Option<u64>> {
    match retention {
        None => Ok(None),
        // Checked in whole milliseconds: 500 µs would be a retention of 0.
        Some(d) if crate::clock::duration_ms(d) == 0 || d > crate::DELAY_MAX => Err(
            Error::invalid_option(field, format!("{d:?} is outside 1 ms..=DELAY_MAX")),
        ),
        Some(d) => Ok(Some(crate::clock::duration_ms(d))),
    }
}

fn batch_too_large(field: &'static str) -> Error {
    Error::invalid_option(
        field,
        format!("a batch holds 1 to {} items", crate::BATCH_MAX),
    )
}

/// Converts a panic inside the storage engine into `Corrupted`: no panic crosses leaseq's API.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::corrupted(format!(
            "storage engine panicked: {}",
            crate::panic_message(&*p)
        )))
    })
}

/// Refuses files that cannot be redb databases before redb sees them. Returns whether the
/// file was left open by a writer (redb's recovery-required flag: not closed cleanly).
fn check_header(path: &Path) -> Result<bool> {
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

/// Checks that the snapshot holds leaseq's tables in a format this build reads.
fn verify_format(rtx: &redb::ReadTransaction, path: &Path) -> Result<()> {
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
        rtx.open_table(DEFAULT_TABLES.jobs()).map(drop),
        rtx.open_table(DEFAULT_TABLES.ready()).map(drop),
        rtx.open_table(DEFAULT_TABLES.scheduled()).map(drop),
        rtx.open_table(DEFAULT_TABLES.leases()).map(drop),
        rtx.open_table(DEFAULT_TABLES.dead()).map(drop),
        rtx.open_table(DEFAULT_TABLES.dedup()).map(drop),
        rtx.open_table(DEFAULT_TABLES.applied()).map(drop),
    ];
    for t in tables {
        t.map_err(|e| Error::corrupted(format!("leaseq table: {e}")))?;
    }
    Ok(())
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
        tx.open_table(DEFAULT_TABLES.jobs()).map_err(foreign)?;
        tx.open_table(DEFAULT_TABLES.ready()).map_err(foreign)?;
        tx.open_table(DEFAULT_TABLES.scheduled()).map_err(foreign)?;
        tx.open_table(DEFAULT_TABLES.leases()).map_err(foreign)?;
        tx.open_table(DEFAULT_TABLES.dead()).map_err(foreign)?;
        tx.open_table(DEFAULT_TABLES.dedup()).map_err(foreign)?;
        tx.open_table(DEFAULT_TABLES.applied()).map_err(foreign)?;
        let mut meta = tx.open_table(META).map_err(foreign)?;
        // A new file is made at the current version, with every table of it; an existing one
        // keeps its version (the open upgrades it).
        if meta.get(META_FORMAT_VERSION)?.is_none() {
            DEFAULT_TABLES.create(&tx).map_err(foreign)?;
            tx.open_table(crate::schema::QUEUES).map_err(foreign)?;
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
fn precheck_attach(rtx: &redb::ReadTransaction) -> Result<()> {
    fn check<K: redb::Key + 'static, V: redb::Value + 'static>(
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
    check(rtx, DEFAULT_TABLES.jobs())?;
    check(rtx, DEFAULT_TABLES.ready())?;
    check(rtx, DEFAULT_TABLES.scheduled())?;
    check(rtx, DEFAULT_TABLES.leases())?;
    check(rtx, DEFAULT_TABLES.dead())?;
    check(rtx, DEFAULT_TABLES.dedup())?;
    check(rtx, DEFAULT_TABLES.applied())?;
    check(rtx, META)?;
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

/// Builds a new queue file at a temporary path, fsyncs it, and links it into place without
/// ever replacing an existing file; then fsyncs the directory.
fn create_atomically(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if path.file_name().is_none() {
        return Err(Error::invalid_option("path", "has no file name"));
    }
    // Unique per process and per call, and short (the final name may be near the limit).
    static CREATES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".leaseq-create-{}-{}",
        std::process::id(),
        CREATES.fetch_add(1, Ordering::Relaxed)
    ));
    // A leftover of a crashed process that had our pid: nobody else can be using it.
    let _ = fs::remove_file(&tmp);
    let built = (|| -> Result<()> {
        let db = redb::Builder::new().set_cache_size(1 << 20).create(&tmp)?;
        init_tables(&db)?;
        drop(db);
        fs::File::open(&tmp)?.sync_all()?;
        match fs::hard_link(&tmp, path) {
            Ok(()) => {}
            // Another opener created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
        fs::File::open(&dir)?.sync_all()?;
        Ok(())
    })();
    let _ = fs::remove_file(&tmp);
    built
}

/// Owns the database; drops it inside `catch_unwind` so a panic in redb's drop (seen on
/// corrupted files) does not cross leaseq's API.
struct DbBox(Option<Database>);

impl DbBox {
    fn new(db: Database) -> DbBox {
        DbBox(Some(db))
    }

    fn get(&self) -> &Database {
        self.0.as_ref().expect("database present until drop")
    }

    fn get_mut(&mut self) -> &mut Database {
        self.0.as_mut().expect("database present until drop")
    }
}

impl Drop for DbBox {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
        }
    }
}

struct Inner {
    // Field order matters: the committer (holding no transaction once idle) drops before the
    // database.
    committer: Committer,
    db: DbBox,
    cfg: Config,
    clock: Arc<dyn Clock>,
    path: Option<PathBuf>,
    recovery: Recovery,
}

/// A persistent job queue in one redb file. Cheap to clone (a shared handle); `Send + Sync`.
///
/// Every mutating call returns after the commit that covers it is durable (with the default
/// [`Durability::Immediate`]); concurrent calls from many threads share commits (group
/// commit). The file closes when the last handle, including every outstanding [`Lease`], is
/// dropped.
#[derive(Clone)]
pub struct Queue {
    inner: Arc<Inner>,
    /// This handle's queue: its tables and default options.
    cfg: Config,
    /// Its name; `None` for the default queue.
    name: Option<Arc<str>>,
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("path", &self.inner.path)
            .field("name", &self.name)
            .field("recovery", &self.inner.recovery)
            .finish_non_exhaustive()
    }
}

/// A `Queue` handle is one queue of its file: the default queue ([`Builder::open`]) or a
/// named one ([`Queue::named`]). Calls that enqueue, dequeue, list, count, prune or purge act
/// on that queue only; [`Queue::check`], [`Queue::compact`], [`Queue::flush`] and
/// [`Queue::database`] are about the whole file.
impl Queue {
    /// Opens (or creates) the queue at `path` with default settings; see [`Builder::open`].
    ///
    /// # Errors
    /// As [`Builder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Queue> {
        Builder::default().open(path)
    }

    /// A builder with default settings.
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    pub(crate) fn config(&self) -> Config {
        self.cfg
    }

    pub(crate) fn run<T>(&self, op: &mut dyn FnMut(&mut Ctx<'_>) -> Result<T>) -> Result<T> {
        self.inner.committer.run(self.inner.db.get(), op)
    }

    /// A handle to the queue named `name` in this file, made (in one commit) if it does not
    /// exist yet. Named queues share the file, its commits and its ids, and nothing else:
    /// each has its own jobs, order, dedup keys, applied markers, dead letters and stats, and
    /// a consumer of one never sees another's jobs (a blocked
    /// [`dequeue_timeout`](Queue::dequeue_timeout) wakes only for its own queue). An
    /// `ack_with` on a lease of one queue can write the caller's tables, so one file keeps a
    /// pipeline's steps exactly-once (as a BullMQ or Oban installation with several queues).
    /// The handle starts with the builder's defaults (lease, attempts, retry policy); see
    /// [`Queue::with_lease`] and the like. The unnamed queue is the one [`Builder::open`]
    /// returns.
    ///
    /// # Errors
    /// `InvalidOption` for a bad name (1 to [`QUEUE_NAME_BYTES_MAX`](crate::QUEUE_NAME_BYTES_MAX)
    /// bytes of ASCII letters, digits, `_`, `-`, `.`) or a file that already holds
    /// [`QUEUES_MAX`](crate::QUEUES_MAX) named queues; `CommitFailed`, `Storage`, `Reentrant`.
    pub fn named(&self, name: &str) -> Result<Queue> {
        crate::schema::QueueTables::check_name(name)?;
        let found = guarded(|| store::find_queue(&self.inner.db.get().begin_read()?, name))?;
        let qid = match found {
            Some(qid) => qid,
            None => self.run(&mut |ctx| store::queue_number(ctx, name, true))??,
        };
        Ok(self.handle_of(name, qid))
    }

    /// A handle to the queue named `name` if it exists; never makes one (a read only).
    ///
    /// # Errors
    /// `QueueNotFound` if the file has no queue of that name; `InvalidOption` for a bad name;
    /// `Storage`.
    pub fn existing(&self, name: &str) -> Result<Queue> {
        crate::schema::QueueTables::check_name(name)?;
        match guarded(|| store::find_queue(&self.inner.db.get().begin_read()?, name))? {
            Some(qid) => Ok(self.handle_of(name, qid)),
            None => Err(Error::QueueNotFound {
                name: name.to_string(),
            }),
        }
    }

    /// The names of the file's named queues, sorted (the default queue is not listed).
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` for a damaged registry.
    pub fn queue_names(&self) -> Result<Vec<String>> {
        let named = guarded(|| store::named_queues(&self.inner.db.get().begin_read()?))?;
        Ok(named.into_iter().map(|(name, _)| name).collect())
    }

    /// This handle's queue name; `None` for the default queue.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    fn handle_of(&self, name: &str, qid: u32) -> Queue {
        Queue {
            inner: self.inner.clone(),
            cfg: Config {
                tables: crate::schema::QueueTables::named(qid),
                ..self.inner.cfg
            },
            name: Some(name.into()),
        }
    }

    /// This handle with another default lease (visibility timeout) for its dequeues: for jobs
    /// enqueued without their own. Other handles are unchanged; nothing is stored.
    ///
    /// # Errors
    /// `InvalidOption` for a lease of 0 or above [`LEASE_MAX`](crate::LEASE_MAX).
    pub fn with_lease(&self, lease: Duration) -> Result<Queue> {
        let mut q = self.clone();
        q.cfg.lease_ms = store::lease_ms_checked("lease", lease)?;
        Ok(q)
    }

    /// This handle with another default number of attempts, for the jobs it enqueues without
    /// their own. Nothing is stored.
    ///
    /// # Errors
    /// `InvalidOption` for 0 or above [`MAX_ATTEMPTS_CAP`](crate::MAX_ATTEMPTS_CAP).
    pub fn with_max_attempts(&self, max_attempts: u32) -> Result<Queue> {
        if max_attempts == 0 || max_attempts > crate::MAX_ATTEMPTS_CAP {
            return Err(Error::invalid_option(
                "max_attempts",
                format!("{max_attempts} is outside 1..={}", crate::MAX_ATTEMPTS_CAP),
            ));
        }
        let mut q = self.clone();
        q.cfg.max_attempts = max_attempts;
        Ok(q)
    }

    /// This handle with another default retry policy, for the jobs it gives back that have
    /// none of their own. Nothing is stored.
    ///
    /// # Errors
    /// `InvalidOption` for a policy out of range.
    pub fn with_retry(&self, retry: RetryPolicy) -> Result<Queue> {
        retry.validate("retry")?;
        let mut q = self.clone();
        q.cfg.retry = retry;
        Ok(q)
    }

    /// Enqueues a job with `payload` (at most the builder's `payload_bytes_max` bytes) and
    /// returns its id once the commit is durable.
    ///
    /// # Errors
    /// `PayloadTooLarge`, `KeyTooLong` or `InvalidOption` before anything is written;
    /// `CommitFailed`, `Storage` or `Reentrant` otherwise.
    pub fn enqueue(&self, payload: &[u8], opts: EnqueueOptions) -> Result<Enqueued> {
        let mut out = self.enqueue_batch([(payload, opts)])?;
        debug_assert_eq!(out.len(), 1);
        Ok(out.remove(0))
    }

    /// Enqueues `value` encoded with bincode (serde); read it back with [`Lease::decode`].
    ///
    /// # Errors
    /// `PayloadCodec` if `value` does not serialize; otherwise as [`Queue::enqueue`].
    pub fn enqueue_value<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
        opts: EnqueueOptions,
    ) -> Result<Enqueued> {
        self.enqueue(&crate::codec::encode_payload(value)?, opts)
    }

    /// Enqueues up to [`BATCH_MAX`](crate::BATCH_MAX) jobs in one commit (one fsync) and returns
    /// one result per job, in order. All or nothing: if any job is refused, none is added. A
    /// dedup key held by a live job, or by an earlier job of the same batch, yields
    /// `Duplicate` for that job.
    ///
    /// # Errors
    /// `InvalidOption` for an empty or oversized batch; `PayloadTooLarge`, `KeyTooLong` or
    /// `InvalidOption` for the first job refused (nothing is written); `CommitFailed`,
    /// `Storage` or `Reentrant` otherwise.
    pub fn enqueue_batch<'p>(
        &self,
        jobs: impl IntoIterator<Item = (&'p [u8], EnqueueOptions)>,
    ) -> Result<Vec<Enqueued>> {
        let records = store::new_records(&self.cfg, self.now_ms(), jobs)?;
        self.run(&mut |ctx| store::enqueue(ctx, self.cfg.tables, &records))
    }

    /// Runs `f` in a write transaction shared with the queue's group commit and commits it:
    /// the caller's own writes (its tables in this file) and the jobs it enqueues through
    /// [`Tx::enqueue`](crate::Tx::enqueue) become durable together, or, if `f` fails, not at
    /// all (the transactional outbox, as River's `InsertTx`). This is the supported way to
    /// write your own tables while using the queue: it shares fsyncs with the queue's other
    /// calls, and it cannot deadlock the way holding a transaction of
    /// [`Queue::database`] while calling the queue does. Blocked consumers wake when it
    /// commits. Returns `f`'s value once the commit is durable.
    ///
    /// `f` may run more than once (when another member's failure aborts the shared
    /// transaction, it runs again in the next one), so it must not have effects outside the
    /// transaction. It must not call the queue (`Reentrant`), begin a transaction of its own
    /// on [`Queue::database`] (that waits for itself forever), or open leaseq's tables
    /// (`leaseq_*`): enqueue through `tx` instead.
    ///
    /// # Errors
    /// `Effect` with `f`'s error or panic message (nothing of it commits; the other calls
    /// sharing the transaction run again without it); `CommitFailed`, `Storage` or
    /// `Reentrant` otherwise.
    pub fn write<T, F>(&self, mut f: F) -> Result<T>
    where
        F: FnMut(&crate::Tx<'_>) -> std::result::Result<T, crate::BoxError>,
    {
        let (now_ms, cfg) = (self.now_ms(), self.cfg);
        self.run(&mut |ctx| store::write(ctx, &cfg, now_ms, &mut f))
    }

    /// Takes the next job if one is available now, or returns `None` at once.
    ///
    /// Before taking one, moves due delayed jobs to ready and reclaims expired leases (at most
    /// 256 of each per call; an expired job with attempts left is ready again at the back
    /// of its priority, otherwise dead with "lease expired"). The job is leased for its lease
    /// duration under a fresh token, its attempt counted, and it is returned only after that
    /// commit. A check that finds nothing costs a read, not a commit.
    ///
    /// One bad row never stops it: a job row that fails its checks is quarantined
    /// ([`Queue::quarantined`]), an index entry that does not match its job is dropped (the
    /// job keeps its own entry), and the dequeue goes on with the next job; it answers `None`
    /// only when no job is available.
    ///
    /// # Errors
    /// `CommitFailed`, `Storage` or `Reentrant`; `Corrupted` only for damage redb itself
    /// reports.
    pub fn dequeue(&self) -> Result<Option<Lease>> {
        Ok(self.try_dequeue()?.0)
    }

    fn try_dequeue(&self) -> Result<(Option<Lease>, Option<u64>)> {
        let (mut leases, next_due_ms) = self.try_dequeue_batch(1)?;
        Ok((leases.pop(), next_due_ms))
    }

    fn try_dequeue_batch(&self, max: usize) -> Result<(Vec<Lease>, Option<u64>)> {
        if max == 0 || max > crate::BATCH_MAX {
            return Err(batch_too_large("max"));
        }
        // Before the probe: from inside an `ack_with` closure, "nothing ready" must not
        // pass for an answer (and `dequeue_timeout` must not wait for a commit this very
        // thread is holding up).
        self.inner.committer.check_reentrant()?;
        let now_ms = self.now_ms();
        let (work, next_due_ms) = guarded(|| {
            let rtx = self.inner.db.get().begin_read()?;
            store::probe(&rtx, self.cfg.tables, now_ms)
        })?;
        if !work {
            return Ok((Vec::new(), next_due_ms));
        }
        let cfg = self.cfg;
        let leased = self.run(&mut |ctx| store::dequeue(ctx, &cfg, now_ms, max))?;
        // Nothing leased although work was seen (another consumer took it, or a bounded
        // sweep has more to do): look again soon rather than waiting out the timeout.
        let next_due_ms = leased.is_empty().then_some(now_ms);
        Ok((
            leased.into_iter().map(|l| self.lease(l)).collect(),
            next_due_ms,
        ))
    }

    pub(crate) fn lease(&self, l: store::Leased) -> Lease {
        Lease {
            queue: parking_lot::Mutex::new(Some(self.clone())),
            owner: (self.inner.committer.id(), self.cfg.tables.qid),
            id: l.id,
            token: l.token,
            attempt: l.attempt,
            deadline_ms: l.deadline_ms,
            payload: l.payload,
        }
    }

    /// Takes up to `max` jobs available now (at most [`BATCH_MAX`](crate::BATCH_MAX)) in one
    /// commit, in queue order; an empty `Vec` if none is available. Each is leased, counted
    /// and fenced as by [`Queue::dequeue`]. Fewer than `max` when their payloads would add up
    /// to more than [`Builder::dequeue_batch_bytes`] (16 MiB by default; the first job is
    /// always taken): the jobs left stay ready, in place.
    ///
    /// # Errors
    /// `InvalidOption` for `max` of 0 or above `BATCH_MAX`; otherwise as [`Queue::dequeue`].
    pub fn dequeue_batch(&self, max: usize) -> Result<Vec<Lease>> {
        Ok(self.try_dequeue_batch(max)?.0)
    }

    /// Acks every lease in one commit and returns one outcome per lease, in order: `Ok(())`
    /// for each lease acked; `Err(LeaseLost)` for a lease that is no longer current, or
    /// `Err(Corrupted)` for one whose job row is damaged, neither of which holds up the
    /// others (as SQS's `DeleteMessageBatch` reports each entry). The leases stay with the
    /// caller: after a whole-call error every one of them is as current as before.
    ///
    /// # Errors
    /// For the whole call, nothing written: `InvalidOption` for an empty or oversized batch or
    /// a lease of another queue; `Reentrant`; `CommitFailed` or `Storage`.
    #[must_use = "a lease of the batch may be LeaseLost: its outcome is in the Vec"]
    pub fn ack_batch(&self, leases: &[Lease]) -> Result<Vec<Result<()>>> {
        let keys = self.batch_keys(leases)?;
        let now_ms = self.now_ms();
        let out = self.run(&mut |ctx| store::ack(ctx, self.cfg.tables, &keys, now_ms))?;
        leases.iter().zip(&out).for_each(|(l, r)| l.settle(r));
        Ok(out)
    }

    /// [`Lease::ack_with`] for many leases in one transaction and one commit: for each current
    /// lease whose idempotency key is not yet applied, `effect(tx, lease)` runs, then the
    /// markers and acks are written; they commit together. Returns one outcome per lease, in
    /// order: `Ok(Applied)`; `Err(LeaseLost)` or `Err(Corrupted)` as in
    /// [`Queue::ack_batch`] (the closure did not run for it); `Err(Effect)` for a lease whose
    /// closure failed: that job was given back with the closure's error as its last error
    /// (as by [`Lease::ack_with`]), and the other leases' effects still commit (their closures
    /// run again in a fresh transaction, one more per failing lease). Two leases with the same
    /// idempotency key: the first applies, the second is `AlreadyApplied`.
    ///
    /// # Errors
    /// As [`Queue::ack_batch`].
    #[must_use = "a lease of the batch may be LeaseLost or Effect: its outcome is in the Vec"]
    pub fn ack_with_batch<F>(&self, leases: &[Lease], mut effect: F) -> Result<Vec<Result<Applied>>>
    where
        F: FnMut(&crate::Tx<'_>, &Lease) -> std::result::Result<(), crate::BoxError>,
    {
        let keys = self.batch_keys(leases)?;
        let (applied, _) = self.ack_with_keys(&keys, &mut |tx, i| effect(tx, &leases[i]), false)?;
        leases.iter().zip(&applied).for_each(|(l, r)| l.settle(r));
        Ok(applied)
    }

    /// Runs `store::ack_with` over `keys` (then, with `next`, a dequeue of one) in one commit.
    /// A closure that fails drops the transaction; the call then runs again with that lease
    /// marked, so its job is given back with the closure's error and the other leases' effects
    /// commit (no dequeue once a closure has failed). At most one run more than there are
    /// leases. The closure errors come back in their leases' places.
    pub(crate) fn ack_with_keys(
        &self,
        keys: &[(u64, u64)],
        effect: &mut store::Effect<'_>,
        next: bool,
    ) -> Result<(Vec<Result<Applied>>, Vec<store::Leased>)> {
        let (now_ms, cfg) = (self.now_ms(), self.cfg);
        let mut failed: Vec<Option<String>> = vec![None; keys.len()];
        let mut errors: Vec<Option<crate::BoxError>> = keys.iter().map(|_| None).collect();
        for _ in 0..=keys.len() {
            // The lease whose closure ran last.
            let mut failing = None;
            let dequeue = next && errors.iter().all(Option::is_none);
            let ran = self.run(&mut |ctx| {
                let applied = store::ack_with(ctx, keys, &cfg, now_ms, &failed, &mut |tx, i| {
                    // Left set after the closure returns: an `Effect` error of the operation
                    // comes from the closure that ran last (its error or panic, or a storage
                    // error inside one of its enqueues that it swallowed).
                    failing = Some(i);
                    effect(tx, i)
                })?;
                // The next job only after an ack that happened: a refused one leases nothing.
                let leased = if dequeue && applied.iter().all(Result::is_ok) {
                    store::dequeue(ctx, &cfg, now_ms, 1)?
                } else {
                    Vec::new()
                };
                Ok((applied, leased))
            });
            match (ran, failing) {
                (Ok((mut applied, leased)), _) => {
                    // The closure's own error in place of its text, where the job was given
                    // back (a lease that went stale in between keeps its `LeaseLost`).
                    for (outcome, error) in applied.iter_mut().zip(errors) {
                        if let (Some(e), Err(Error::Effect(_))) = (error, &outcome) {
                            *outcome = Err(Error::Effect(e));
                        }
                    }
                    return Ok((applied, leased));
                }
                (Err(Error::Effect(e)), Some(i)) if failed[i].is_none() => {
                    failed[i] = Some(e.to_string());
                    errors[i] = Some(e);
                }
                (Err(e), _) => return Err(e),
            }
        }
        Err(Error::corrupted(
            "ack_with: more failing closures than leases",
        ))
    }

    fn batch_keys(&self, leases: &[Lease]) -> Result<Vec<(u64, u64)>> {
        if leases.is_empty() {
            return Err(Error::invalid_option("leases", "the batch is empty"));
        }
        if leases.len() > crate::BATCH_MAX {
            return Err(batch_too_large("leases"));
        }
        if leases
            .iter()
            .any(|l| l.owner != (self.inner.committer.id(), self.cfg.tables.qid))
        {
            return Err(Error::invalid_option("leases", "a lease of another queue"));
        }
        Ok(leases.iter().map(|l| (l.id, l.token)).collect())
    }

    /// Takes the next job, waiting up to `timeout` for one. Wakes when a commit makes work
    /// available (an enqueue, a nack, a requeue) and at the next due time or lease deadline,
    /// never by polling in a tight loop. While a due time is pending it reads the clock again
    /// at least every [`DUE_RECHECK_MAX`](crate::DUE_RECHECK_MAX) (250 ms), so a clock that
    /// jumps forward (an NTP step) delivers the job within that; a
    /// [`ManualClock`](crate::ManualClock) wakes it at once. A write transaction the caller holds on
    /// [`Queue::database`] blocks it (like every queue write) until that transaction ends,
    /// whatever the timeout.
    ///
    /// # Errors
    /// As [`Queue::dequeue`].
    pub fn dequeue_timeout(&self, timeout: Duration) -> Result<Option<Lease>> {
        self.inner.committer.check_reentrant()?;
        // A timeout too long to add to the monotonic clock waits without end.
        let deadline = Instant::now().checked_add(timeout);
        let work = self.inner.committer.work().of(self.config().tables.qid);
        loop {
            let epoch = work.epoch();
            let (lease, next_due_ms) = self.try_dequeue()?;
            if lease.is_some() {
                return Ok(lease);
            }
            let now = Instant::now();
            let mut wait = match deadline {
                Some(d) if now >= d => return Ok(None),
                Some(d) => d - now,
                None => Duration::from_secs(3600),
            };
            if let Some(due_ms) = next_due_ms {
                // The clock may jump before the due time (an NTP step): look again at least
                // every DUE_RECHECK_MAX.
                let until_due = due_ms.saturating_sub(self.now_ms()).max(1);
                wait = wait
                    .min(Duration::from_millis(until_due))
                    .min(crate::DUE_RECHECK_MAX);
            }
            work.wait(epoch, wait);
        }
    }

    /// A snapshot of one job, or `None` if no job has this id (never enqueued, or acked).
    ///
    /// # Errors
    /// `Corrupted` if its record does not decode; `Storage`.
    pub fn job(&self, id: JobId) -> Result<Option<JobInfo>> {
        guarded(|| store::job(&self.inner.db.get().begin_read()?, self.cfg.tables, id.0))
    }

    /// Counts of jobs per state in this handle's queue, read from one snapshot.
    ///
    /// # Errors
    /// `Storage`.
    pub fn stats(&self) -> Result<Stats> {
        guarded(|| store::stats(&self.inner.db.get().begin_read()?, self.cfg.tables))
    }

    /// Jobs still to be done: scheduled, ready or leased, not dead ([`Stats::pending`]), so
    /// "drain until empty" ends when the work is done even if some jobs died. Dead jobs are
    /// counted by [`Stats::dead`] (and in [`Stats::total`]).
    ///
    /// # Errors
    /// `Storage`.
    pub fn len(&self) -> Result<u64> {
        Ok(self.stats()?.pending())
    }

    /// Whether no job is left to do (none scheduled, ready or leased; dead jobs may remain).
    ///
    /// # Errors
    /// `Storage`.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Up to `limit` jobs in `state` (1 to [`BATCH_MAX`](crate::BATCH_MAX)), after `after`
    /// (the `next` of the previous page; `None` from the start), in that state's order: ready
    /// in the order they will be dequeued, scheduled by due time, leased by deadline, dead by
    /// id. Read from one snapshot; a row that fails its checks is skipped (`check` reports
    /// it). With [`JobInfo::last_error`] and [`JobInfo::died_ms`], the dead-letter view;
    /// [`Queue::payload`] reads a job's payload.
    ///
    /// # Errors
    /// `InvalidOption` for `limit` of 0 or above `BATCH_MAX`, or a cursor of another state;
    /// `Storage`.
    pub fn jobs(&self, state: JobState, after: Option<JobCursor>, limit: usize) -> Result<JobPage> {
        if limit == 0 || limit > crate::BATCH_MAX {
            return Err(batch_too_large("limit"));
        }
        if after.is_some_and(|c| c.state != state) {
            return Err(Error::invalid_option("after", "a cursor of another state"));
        }
        let (jobs, last) = guarded(|| {
            store::list(
                &self.inner.db.get().begin_read()?,
                self.cfg.tables,
                state,
                after.map(|c| c.key),
                limit,
            )
        })?;
        let next = last.map(|key| JobCursor { state, key });
        Ok(JobPage { jobs, next })
    }

    /// The payload of job `id` as enqueued, or `None` if no job has this id.
    ///
    /// # Errors
    /// `Corrupted` if its row is damaged or quarantined; `Storage`.
    pub fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        guarded(|| store::payload(&self.inner.db.get().begin_read()?, self.cfg.tables, id.0))
    }

    /// Moves every dead job back to ready with its attempts reset, as
    /// [`Queue::requeue_dead`] for each, in commits of up to [`BATCH_MAX`](crate::BATCH_MAX)
    /// jobs; returns how many were requeued. Each job moves once: requeueing twice never
    /// makes two jobs. Jobs that die while it runs may be requeued too.
    ///
    /// # Errors
    /// `Reentrant`; `CommitFailed` or `Storage` (the commits before it stay).
    pub fn requeue_dead_all(&self) -> Result<u64> {
        self.each_in_state(JobState::Dead, store::StateAction::Requeue)
    }

    /// Deletes every job in `state` (dead, scheduled or ready; never leased: a leased job is
    /// ended through its lease), releasing their dedup keys, in commits of up to
    /// [`BATCH_MAX`](crate::BATCH_MAX) jobs; returns how many were deleted. As BullMQ's
    /// `obliterate` / `clean` by state.
    ///
    /// # Errors
    /// `InvalidOption` for `JobState::Leased` (nothing written); `Reentrant`; `CommitFailed` or
    /// `Storage` (the commits before it stay).
    pub fn purge(&self, state: JobState) -> Result<u64> {
        if state == JobState::Leased {
            return Err(Error::invalid_option(
                "state",
                "leased jobs are ended through their leases",
            ));
        }
        self.each_in_state(state, store::StateAction::Purge)
    }

    /// Runs `action` over the jobs in `state`, a batch per commit, until none is left or as
    /// many batches ran as there were jobs at the start (so jobs arriving meanwhile cannot
    /// keep it going).
    fn each_in_state(&self, state: JobState, action: store::StateAction) -> Result<u64> {
        let stats = self.stats()?;
        let at_start = match state {
            JobState::Scheduled => stats.scheduled,
            JobState::Ready => stats.ready,
            JobState::Leased => stats.leased,
            JobState::Dead => stats.dead,
        };
        let batches = at_start.div_ceil(crate::BATCH_MAX as u64) + 1;
        let mut total = 0;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (n, more) = self.run(&mut |ctx| {
                store::sweep_state(
                    ctx,
                    self.cfg.tables,
                    state,
                    action,
                    now_ms,
                    crate::BATCH_MAX,
                )
            })?;
            total += n;
            if !more {
                break;
            }
        }
        Ok(total)
    }

    /// Checks every invariant of the file, in every queue of it (each job in exactly one state; every index and the
    /// jobs table agree both ways; dedup entries name their job or a running window, and the
    /// windows agree with their expiry index; applied markers (caller keys only) agree with
    /// their time index; the carriers of idempotency keys are exactly the live jobs with one;
    /// quarantined rows; counters ahead of every id and token) and returns the violations
    /// found, at most 1000. Empty means consistent.
    /// Reads the whole queue: meant for tests, the CLI and after crashes.
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` if redb cannot read the tables.
    pub fn check(&self) -> Result<Vec<Violation>> {
        guarded(|| store::check_file(self.inner.db.get()))
    }

    /// Moves a dead job back to ready with its attempts reset to 0, as a fresh job at the
    /// back of its priority.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` if the job is not dead; `CommitFailed` or `Storage`.
    pub fn requeue_dead(&self, id: JobId) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::requeue_dead(ctx, self.cfg.tables, id.0, now_ms))?
    }

    /// Deletes a job that is not leased (scheduled, ready or dead) and releases its dedup key,
    /// as BullMQ's `Job.remove`: for dead jobs that will not be retried, or work that is no
    /// longer wanted. A leased job must be ended through its lease (ack, nack, fail).
    ///
    /// Also deletes a quarantined row ([`Queue::quarantined`]) or a job row that fails its
    /// checks, whatever its state (which cannot be read), with every index and dedup entry
    /// naming it. Finding those entries reads the index and dedup tables whole: only the
    /// repair of a damaged file pays that.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` if the job is leased; `CommitFailed` or `Storage`.
    pub fn remove(&self, id: JobId) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::remove(ctx, self.cfg.tables, id.0, now_ms))?
    }

    /// Whether the applied-ids marker of this idempotency key exists: an effect under it was
    /// applied by [`Lease::ack_with`], within the retention ([`Builder::applied_retention`]:
    /// once the marker is pruned this is `false` again, and a duplicate is applied again).
    ///
    /// Only caller keys ([`EnqueueOptions::idempotency_key`]) can be asked about. A job
    /// enqueued without one is keyed by its own id, and no marker is kept for it: ids are
    /// never reused, and the effect and the removal of the job commit together, so no later
    /// delivery of that job could ever ask. To learn whether a job's effect landed, read the
    /// caller's own table it wrote.
    ///
    /// # Errors
    /// `Storage`.
    pub fn is_applied(&self, idempotency_key: impl AsRef<[u8]>) -> Result<bool> {
        guarded(|| {
            store::is_applied(
                &self.inner.db.get().begin_read()?,
                self.cfg.tables,
                idempotency_key.as_ref(),
            )
        })
    }

    /// Quarantined job rows, by job id, after `after` (exclusive; `None` from the first), at
    /// most `max` of them (at most [`BATCH_MAX`](crate::BATCH_MAX)): rows a dequeue or the
    /// lease recovery at open found failing their checks and moved aside whole, so the rest
    /// of the queue went on. Page through with the last id returned.
    /// [`Queue::quarantined_record`] gives a row's bytes; [`Queue::remove`] deletes it.
    ///
    /// # Errors
    /// `InvalidOption` for `max` of 0 or above `BATCH_MAX`; `Storage`.
    pub fn quarantined(&self, after: Option<JobId>, max: usize) -> Result<Vec<Quarantined>> {
        if max == 0 || max > crate::BATCH_MAX {
            return Err(batch_too_large("max"));
        }
        guarded(|| {
            store::quarantined(
                &self.inner.db.get().begin_read()?,
                self.cfg.tables,
                after.map(|id| id.0),
                max,
            )
        })
    }

    /// The bytes of a quarantined job row as they were found (at most the record cap, 64 MiB
    /// and change), or `None` if the job is not quarantined.
    ///
    /// # Errors
    /// `Storage`.
    pub fn quarantined_record(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        guarded(|| {
            store::quarantined_record(&self.inner.db.get().begin_read()?, self.cfg.tables, id.0)
        })
    }

    /// How this handle's commits were shared: groups committed and operations they answered.
    pub fn commit_stats(&self) -> crate::CommitStats {
        self.inner.committer.stats()
    }

    /// What the open found: leases recovered, whether redb repaired the file.
    pub fn recovery(&self) -> Recovery {
        self.inner.recovery
    }

    /// The redb database in the queue's file, for the caller's own tables (used together with
    /// [`Lease::ack_with`]). Tables named `leaseq_*` belong to leaseq.
    ///
    /// **Write through [`Queue::write`], not through a transaction of your own.** redb has
    /// one writer at a time: a write transaction begun here blocks every queue call that
    /// commits until it ends, and a thread that calls the queue while it holds one waits
    /// for itself forever (leaseq cannot see a transaction begun on redb directly, so this
    /// is not detected). Read transactions are fine.
    pub fn database(&self) -> &Database {
        self.inner.db.get()
    }

    /// The file's path, when opened from a path.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Removes every applied-ids marker past its retention
    /// ([`Builder::applied_retention`]), deletes every dead job past
    /// [`Builder::dead_retention`] (if set), and releases every dedup key whose window ended
    /// ([`EnqueueOptions::dedup_window`]) now, in commits of up to
    /// [`BATCH_MAX`](crate::BATCH_MAX), and reports what it removed. (A window that ended
    /// already lets a new enqueue take its key; this only cleans up.) (`ack_with` already
    /// removes a few with every marker it writes; this finishes the job, for example before
    /// [`Queue::compact`].) Never removes a marker whose key a live job carries: its retention
    /// starts again instead.
    ///
    /// # Errors
    /// `Reentrant`; `CommitFailed` or `Storage` (the commits before it stay).
    pub fn prune(&self) -> Result<Pruned> {
        let cfg = self.cfg;
        let batches = self.stats()?.applied.div_ceil(crate::BATCH_MAX as u64) + 1;
        let mut out = Pruned::default();
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (removed, more) =
                self.run(&mut |ctx| store::prune(ctx, &cfg, now_ms, crate::BATCH_MAX))?;
            out.applied += removed;
            if !more {
                break;
            }
        }
        // Dead jobs past their retention.
        let batches = self.stats()?.dead.div_ceil(crate::BATCH_MAX as u64) + 1;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (deleted, more) =
                self.run(&mut |ctx| store::prune_dead_jobs(ctx, &cfg, now_ms, crate::BATCH_MAX))?;
            out.dead += deleted;
            if !more {
                break;
            }
        }
        // Dedup windows that ended: as many batches as there are keys at most.
        let batches = self.stats()?.dedup_keys.div_ceil(crate::BATCH_MAX as u64) + 1;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (released, more) = self.run(&mut |ctx| {
                store::prune_dedup_windows(ctx, self.cfg.tables, now_ms, crate::BATCH_MAX)
            })?;
            out.dedup_windows += released;
            if !more {
                break;
            }
        }
        Ok(out)
    }

    /// Gives the file's free pages back to the file system, as redb's
    /// `Database::compact`: after a queue that once held many jobs drained, the file shrinks to
    /// about the size of what it holds now. (Under steady churn the file does not grow: redb
    /// reuses freed pages; it only never shrinks by itself.) Returns whether anything was
    /// given back.
    ///
    /// It needs the queue to itself, so it takes `&mut self` and refuses while other handles
    /// ([`Clone`]s) or [`Lease`]s of this queue are alive, or a transaction is open on
    /// [`Queue::database`]: drop them first. It never waits for them. A crash or power loss
    /// during it loses nothing: redb compacts through its own commits, so the reopened file
    /// holds every job as before (tested on the power-loss simulator, also with a full disk).
    /// It rewrites most of the file: seconds for hundreds of MiB.
    ///
    /// # Errors
    /// `Busy` (nothing done) while the queue is in use; `CommitFailed` if a commit failed on
    /// this handle earlier; `Storage` or `Io` if the disk fails during it (a full disk, say):
    /// the file keeps every job, but this handle then refuses writes (`CommitFailed`) until
    /// the file is reopened.
    pub fn compact(&mut self) -> Result<bool> {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(Error::Busy {
                detail: "other handles or leases of this queue are alive".into(),
            });
        };
        inner.committer.check_reentrant()?;
        inner.committer.check_not_poisoned()?;
        let db = inner.db.get_mut();
        match guarded(|| {
            db.compact().map_err(|e| match e {
                redb::CompactionError::TransactionInProgress => Error::Busy {
                    detail: "a transaction is open on database()".into(),
                },
                redb::CompactionError::PersistentSavepointExists
                | redb::CompactionError::EphemeralSavepointExists => Error::Busy {
                    detail: "a savepoint exists on database()".into(),
                },
                redb::CompactionError::Storage(e) => Error::from(e),
                other => Error::Storage(other.into()),
            })
        }) {
            Ok(compacted) => Ok(compacted),
            Err(e @ Error::Busy { .. }) => Err(e),
            Err(e) => {
                // redb refuses writes after a failed write; say so on every later call.
                inner.committer.poison(format!("compaction failed: {e}"));
                Err(e)
            }
        }
    }

    /// Makes every earlier commit durable (one empty `Immediate` commit). Needed only with
    /// [`Durability::None`].
    ///
    /// # Errors
    /// `Reentrant` from inside an `ack_with` closure; `CommitFailed` or `Storage`.
    pub fn flush(&self) -> Result<()> {
        self.inner.committer.check_reentrant()?;
        guarded(|| {
            let tx = self.inner.db.get().begin_write()?;
            tx.commit()?;
            Ok(())
        })
    }
}
