//! [`Reader`]: a read-only handle on a queue file, beside the process that has it open
//! (live, with [`Builder::live_reads`](crate::Builder::live_reads)) or with nobody else.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::ReadableDatabase;

use crate::error::{Error, Result, catch_engine_panic};
use crate::file::{GuardedDb, OpenFile};
use crate::format::schema::{DEFAULT_SCHEMA, QueueSchema};
use crate::job::{JobCursor, JobId, JobInfo, JobPage, JobState, Quarantined, Stats, Violation};
use crate::metrics::MinuteCounts;
use crate::scratch::Retire;
use crate::store;

/// A read-only handle on one queue of a file: the inspection calls of [`Queue`](crate::Queue),
/// never a write. What the `leaseq` tool's read commands use, and what a dashboard or a
/// monitoring thread in another process should use, as Oban Web, River UI and Bull Board
/// read the live store. In the app itself, [`Queue::reader`](crate::Queue::reader) gives one
/// over the app's own open (live, every call on the latest commit; the `Queue`'s own read
/// calls are its): it holds the file as a handle does, so `Queue::shutdown` waits for it and
/// `Queue::compact` is `Busy` while it lives.
///
/// [`Reader::open`] opens the file in one of two ways, told by [`Reader::is_live`]:
/// - **live**: the file itself, read-only, beside the process that has it open with
///   [`Builder::live_reads`](crate::Builder::live_reads) (or beside nobody). Every call reads
///   the latest commit, so a reader kept open follows the app. Jobs in flight show as
///   [`JobState::Leased`] with their deadlines: a reader never returns a lease, so it never
///   changes what the app sees.
/// - **snapshot**: a file left by a process that crashed (it needs redb's repair) or written
///   in an older format (it needs the upgrade) is repaired and upgraded on a copy in memory;
///   the file is not written. Calls read that copy, as of the open; the leases the crashed
///   process held show as leased, with the deadlines it set (the next writable open returns
///   them whatever those say). While a snapshot reader exists it holds the whole file: a
///   writer's open in between fails with [`Error::AlreadyOpen`], another reader's with
///   [`Error::HeldExclusively`]. Drop it, then open the file writable to recover the leases.
///
/// With nobody writing, a reader first verifies the file as a writable open would
/// ([`Builder::check_integrity`](crate::Builder::check_integrity), on by default), so a
/// damaged file is `Corrupted` rather than a read of damaged bytes.
///
/// While a reader is open, a process that opens the file *without*
/// [`Builder::live_reads`](crate::Builder::live_reads) is refused with
/// [`Error::AlreadyOpen`]; with it, the open goes ahead and the reader follows it. Keep
/// readers short-lived if such an app may start: `leaseq watch` opens one per refresh.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("app.leaseq");
/// use leaseq::{EnqueueOptions, Queue, Reader};
/// // The app, in its own process, opens the file for live reads...
/// let queue = Queue::builder().live_reads(true).open(&path)?;
/// queue.enqueue(b"job", EnqueueOptions::default())?;
/// let _in_flight = queue.dequeue()?.expect("a job");
/// // ...and a tool or a dashboard reads beside it (here in the same process).
/// let reader = Reader::open(&path)?;
/// assert!(reader.is_live());
/// let stats = reader.stats()?;
/// assert_eq!((stats.ready, stats.leased), (0, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Reader {
    inner: Arc<ReadFile>,
    schema: &'static QueueSchema,
    name: Option<Arc<str>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("path", &self.inner.path)
            .field("queue", &self.name)
            .field("live", &self.is_live())
            .finish()
    }
}

/// What every reader of one open shares.
struct ReadFile {
    source: Source,
    path: PathBuf,
    /// The writer's handle this reader is, among the file's live handles (a
    /// [`Source::Writer`] only).
    _held: Option<crate::handles::HandleMark>,
}

/// Where a reader reads.
pub(crate) enum Source {
    /// The writer's own database, through [`Queue::reader`](crate::queue::Queue::reader):
    /// every call reads the latest commit of this process.
    Writer(Arc<OpenFile>),
    /// The file, read-only, in redb's shared mode.
    Live(GuardedRo),
    /// A scratch copy (reads from the file, writes in memory), repaired and upgraded.
    Snapshot { db: GuardedDb, retire: Retire },
}

impl Source {
    pub(crate) fn begin_read(&self) -> Result<redb::ReadTransaction> {
        Ok(match self {
            Source::Writer(file) => file.db.get().begin_read()?,
            Source::Live(ro) => ro.get().begin_read()?,
            Source::Snapshot { db, .. } => db.get().begin_read()?,
        })
    }
}

impl Drop for ReadFile {
    fn drop(&mut self) {
        // The scratch copy is thrown away: closed without saving its state.
        if let Source::Snapshot { db, retire } = &self.source {
            retire.retire(db.get());
        }
    }
}

/// Owns a read-only database; drops it inside `catch_unwind`, as [`GuardedDb`].
pub(crate) struct GuardedRo(Option<redb::ReadOnlyDatabase>);

impl GuardedRo {
    pub(crate) fn new(db: redb::ReadOnlyDatabase) -> GuardedRo {
        GuardedRo(Some(db))
    }

    fn get(&self) -> &redb::ReadOnlyDatabase {
        self.0.as_ref().expect("database present until drop")
    }
}

impl Drop for GuardedRo {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
        }
    }
}

impl Reader {
    pub(crate) fn new(source: Source, path: PathBuf) -> Reader {
        Reader {
            inner: Arc::new(ReadFile {
                source,
                path,
                _held: None,
            }),
            schema: &DEFAULT_SCHEMA,
            name: None,
        }
    }

    /// A reader of queue `schema` (named `name`) over the writer's own open `file`, one of
    /// its live handles as `mark` says.
    pub(crate) fn of_writer(
        file: Arc<OpenFile>,
        schema: &'static QueueSchema,
        name: Option<Arc<str>>,
        mark: crate::handles::HandleMark,
    ) -> Reader {
        let path = file.path.clone().unwrap_or_default();
        Reader {
            inner: Arc::new(ReadFile {
                source: Source::Writer(file),
                path,
                _held: Some(mark),
            }),
            schema,
            name,
        }
    }

    /// Opens the queue file at `path` for reading only, with the default settings
    /// ([`Builder::open_reader`](crate::Builder::open_reader) takes a cache size and the
    /// integrity check), and returns its default queue ([`Reader::existing`] reaches the
    /// named ones). Never creates, writes, repairs or upgrades the file.
    ///
    /// # Errors
    /// - `HeldExclusively` if a process has the file open without
    ///   [`Builder::live_reads`](crate::Builder::live_reads): the message says what to do;
    /// - `AlreadyOpen` if the file needs a repair or an upgrade (read from a copy) while a
    ///   writer or another reader's copy holds its writer lock;
    /// - `Io` (kind `NotFound`) for no file at `path`;
    /// - `Truncated`, `NotLeaseq`, `UnsupportedVersion` and `Corrupted` as
    ///   [`Builder::open`](crate::Builder::open) (the file left byte-identical);
    /// - `Io` or `Storage` for other I/O failures.
    pub fn open(path: impl AsRef<Path>) -> Result<Reader> {
        crate::open::Builder::default().open_reader(path)
    }

    /// Whether this reader follows the file (live: every call reads the latest commit) or
    /// reads a snapshot repaired or upgraded in memory at open (see [`Reader`]).
    pub fn is_live(&self) -> bool {
        matches!(self.inner.source, Source::Live(_) | Source::Writer(_))
    }

    /// The path the reader was opened from; for [`Queue::reader`](crate::Queue::reader), its
    /// queue's path, empty for a queue opened without one
    /// ([`Builder::open_backend`](crate::Builder::open_backend)).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// This handle's queue name; `None` for the default queue.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// A reader of the queue named `name`, sharing this one's open.
    ///
    /// # Errors
    /// `QueueNotFound` if the file has no queue of that name; `InvalidOption` for a bad name;
    /// `Corrupted` for a damaged registry; `Storage`.
    pub fn existing(&self, name: &str) -> Result<Reader> {
        QueueSchema::validate_queue_name(name)?;
        match self.read(|rtx, _| store::find_queue(rtx, name))? {
            Some(queue_number) => Ok(Reader {
                inner: self.inner.clone(),
                schema: QueueSchema::named(queue_number),
                name: Some(Arc::from(name)),
            }),
            None => Err(Error::QueueNotFound {
                name: name.to_string(),
            }),
        }
    }

    /// The file's default queue (the one with no name), from any reader of the file: the
    /// inverse of [`Reader::existing`], on the same open.
    pub fn default_queue(&self) -> Reader {
        Reader {
            inner: self.inner.clone(),
            schema: &DEFAULT_SCHEMA,
            name: None,
        }
    }

    /// The names of the file's named queues, sorted (the default queue is not listed), as
    /// [`Queue::queue_names`](crate::Queue::queue_names).
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` for a damaged registry.
    pub fn queue_names(&self) -> Result<Vec<String>> {
        let named = self.read(|rtx, _| store::named_queues(rtx))?;
        Ok(named.into_iter().map(|(name, _)| name).collect())
    }

    /// Counts of jobs per state, read from one snapshot, as [`Queue::stats`](crate::Queue::stats).
    ///
    /// # Errors
    /// `Storage`.
    pub fn stats(&self) -> Result<Stats> {
        self.read(store::stats)
    }

    /// A job, or `None` if no job has this id, as [`Queue::job`](crate::Queue::job).
    ///
    /// # Errors
    /// `Corrupted` if its record does not decode; `Storage`.
    pub fn job(&self, id: JobId) -> Result<Option<JobInfo>> {
        self.read(|rtx, schema| store::job(rtx, schema, id.0))
    }

    /// A page of the jobs in `state`, as [`Queue::jobs`](crate::Queue::jobs) (same order,
    /// same cursors).
    ///
    /// # Errors
    /// `InvalidOption` for `limit` of 0 or above [`BATCH_MAX`](crate::BATCH_MAX), or a cursor
    /// of another state; `Storage`.
    pub fn jobs(&self, state: JobState, after: Option<JobCursor>, limit: usize) -> Result<JobPage> {
        self.list(state, after, limit, false)
    }

    /// A page of the jobs in `state` just before `before` in the state's order (the last
    /// ones with `None`), in the reverse order: the newest first, as
    /// [`Queue::jobs_before`](crate::Queue::jobs_before).
    ///
    /// # Errors
    /// `InvalidOption` for `Ready` (listed in delivery order only), `limit` of 0 or above
    /// [`BATCH_MAX`](crate::BATCH_MAX), or a cursor of another state; `Storage`.
    pub fn jobs_before(
        &self,
        state: JobState,
        before: Option<JobCursor>,
        limit: usize,
    ) -> Result<JobPage> {
        if state == JobState::Ready {
            return Err(Error::invalid_option(
                "state",
                "ready jobs are listed in delivery order only (Reader::jobs)",
            ));
        }
        self.list(state, before, limit, true)
    }

    fn list(
        &self,
        state: JobState,
        from: Option<JobCursor>,
        limit: usize,
        backward: bool,
    ) -> Result<JobPage> {
        if limit == 0 || limit > crate::limits::BATCH_MAX {
            return Err(Error::batch_too_large("limit"));
        }
        if from.is_some_and(|c| c.state != state) {
            return Err(Error::invalid_option(
                if backward { "before" } else { "after" },
                "a cursor of another state",
            ));
        }
        let page = self.read(|rtx, schema| {
            store::list(rtx, schema, state, from.map(|c| c.key), limit, backward)
        })?;
        let cursor = |key| JobCursor { state, key };
        Ok(JobPage {
            jobs: page.jobs,
            next: page.next.map(cursor),
            first: page.first.map(cursor),
        })
    }

    /// Up to `limit` dead jobs, the most recently dead first, as
    /// [`Queue::latest_dead`](crate::Queue::latest_dead).
    ///
    /// # Errors
    /// `InvalidOption` for `limit` of 0 or above [`BATCH_MAX`](crate::BATCH_MAX); `Storage`.
    pub fn latest_dead(&self, limit: usize) -> Result<Vec<JobInfo>> {
        if limit == 0 || limit > crate::limits::BATCH_MAX {
            return Err(Error::batch_too_large("limit"));
        }
        self.read(|rtx, schema| store::latest_dead(rtx, schema, limit))
    }

    /// The payload of job `id` as enqueued, or `None`, as
    /// [`Queue::payload`](crate::Queue::payload).
    ///
    /// # Errors
    /// `Corrupted` if its row is damaged or quarantined; `Storage`.
    pub fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.read(|rtx, schema| store::payload(rtx, schema, id.0))
    }

    /// This queue's schedules, as [`Queue::schedules`](crate::Queue::schedules).
    ///
    /// # Errors
    /// `Storage`.
    pub fn schedules(&self) -> Result<Vec<crate::schedule::ScheduleInfo>> {
        self.read(|rtx, schema| store::schedules_of(rtx, schema.queue_number))
    }

    /// Schedule `name` of this queue, if it exists, as
    /// [`Queue::schedule`](crate::Queue::schedule).
    ///
    /// # Errors
    /// `Corrupted` if its row fails its checks; `Storage`.
    pub fn schedule(&self, name: &str) -> Result<Option<crate::schedule::ScheduleInfo>> {
        self.read(|rtx, schema| store::schedule_of(rtx, schema.queue_number, name))
    }

    /// Why a ready job of an ordered group ([`EnqueueOptions::group`](crate::EnqueueOptions::group))
    /// does not move: the id of its group's head, the member it waits behind (delivered one
    /// at a time, in enqueue order, as SQS FIFO's message groups). `None` for a job that is
    /// not held that way (any other state, no group, its group's head itself, or no such
    /// job).
    ///
    /// # Errors
    /// `Corrupted` if the job's row fails its checks; `Storage`.
    pub fn held_behind(&self, id: JobId) -> Result<Option<JobId>> {
        self.read(|rtx, schema| store::held_behind(rtx, schema, id.0))
    }

    /// This queue's rate limit, if it has one, as
    /// [`Queue::rate_limit`](crate::Queue::rate_limit).
    ///
    /// # Errors
    /// `Corrupted` for a damaged row; `Storage`.
    pub fn rate_limit(&self) -> Result<Option<crate::rate_limit::RateLimit>> {
        self.read(|rtx, schema| store::rate_limit_of(rtx, schema.queue_number))
    }

    /// This queue's size limit, as [`Queue::limit`](crate::Queue::limit).
    ///
    /// # Errors
    /// `Storage`; `Corrupted` for a stored limit no build writes.
    pub fn limit(&self) -> Result<Option<crate::queue_limit::QueueLimit>> {
        self.read(|rtx, schema| Ok(store::limit_of(rtx, schema.queue_number)?.map(|(l, _)| l)))
    }

    /// When this queue's rate limit ([`Queue::set_rate_limit`](crate::Queue::set_rate_limit))
    /// lets a delivery through again, if its window is used up at `now_ms` (Unix ms, by
    /// the clock that set it: pass the app's clock's time), in Unix ms: a fixed window's end,
    /// or when enough deliveries have left a sliding window for one more. `None` without a
    /// limit or while the window has room: ready jobs are held back by the limit only until
    /// then (BullMQ's `getRateLimitTtl`).
    ///
    /// # Errors
    /// `Storage`.
    pub fn rate_limited_until(&self, now_ms: u64) -> Result<Option<u64>> {
        self.read(|rtx, schema| store::limited_until(rtx, schema.queue_number, now_ms))
    }

    /// What this queue keeps of its completed jobs, as
    /// [`Queue::history`](crate::Queue::history).
    ///
    /// # Errors
    /// `Storage`.
    pub fn history(&self) -> Result<crate::job::History> {
        self.read(|rtx, schema| store::history_of(rtx, schema.queue_number))
    }

    /// Whether an effect with this idempotency key was applied, as
    /// [`Queue::is_applied`](crate::Queue::is_applied).
    ///
    /// # Errors
    /// `Storage`.
    pub fn is_applied(&self, idempotency_key: impl AsRef<[u8]>) -> Result<bool> {
        self.read(|rtx, schema| store::is_applied(rtx, schema, idempotency_key.as_ref()))
    }

    /// Quarantined job rows, as [`Queue::quarantined`](crate::Queue::quarantined).
    ///
    /// # Errors
    /// `InvalidOption` for `max` of 0 or above [`BATCH_MAX`](crate::BATCH_MAX); `Storage`.
    pub fn quarantined(&self, after: Option<JobId>, max: usize) -> Result<Vec<Quarantined>> {
        if max == 0 || max > crate::limits::BATCH_MAX {
            return Err(Error::batch_too_large("max"));
        }
        self.read(|rtx, schema| store::quarantined(rtx, schema, after.map(|id| id.0), max))
    }

    /// The stored bytes of quarantined job `id` (for a look at what went wrong), or `None`,
    /// as [`Queue::quarantined_record`](crate::Queue::quarantined_record).
    ///
    /// # Errors
    /// `Storage`.
    pub fn quarantined_record(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.read(|rtx, schema| store::quarantined_record(rtx, schema, id.0))
    }

    /// What this queue did per minute since `since_ms`, as
    /// [`Queue::metrics`](crate::Queue::metrics): beside a live writer, the minutes its commits
    /// wrote so far; from [`Queue::reader`](crate::Queue::reader), also this process's counts
    /// not written yet.
    ///
    /// # Errors
    /// `Storage`.
    pub fn metrics(&self, since_ms: u64) -> Result<Vec<MinuteCounts>> {
        let queue_number = self.schema.queue_number;
        self.read(|rtx, _| {
            // This process's counts not written yet (at most a second's), taken after the
            // snapshot: a row written meanwhile is in neither, never in both.
            let pending = match &self.inner.source {
                Source::Writer(file) => file.pending_metrics(),
                _ => Vec::new(),
            };
            store::metrics_with(rtx, queue_number, since_ms, &pending)
        })
    }

    /// Every invariant of the file, over one snapshot, as [`Queue::check`](crate::Queue::check):
    /// the violations found (at most 1000), empty when consistent. Beside a live writer it
    /// checks the commit it read; it repairs nothing.
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` if redb cannot read the tables or the registry of named
    /// queues is damaged.
    pub fn check(&self) -> Result<Vec<Violation>> {
        self.read(|rtx, _| store::check_file(rtx))
    }

    /// The file's random id, or `None` if no call drew one yet (a reader never does), as
    /// [`Queue::file_id`](crate::Queue::file_id).
    ///
    /// # Errors
    /// `Storage`.
    pub fn file_id(&self) -> Result<Option<u64>> {
        self.read(|rtx, _| store::file_id(rtx))
    }

    fn rtx(&self) -> Result<redb::ReadTransaction> {
        self.inner.source.begin_read()
    }

    /// Runs `read` over a new read transaction of this reader's file and its queue's tables,
    /// under the engine's panic guard: the one way every read call reads.
    fn read<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction, &'static QueueSchema) -> Result<T>,
    ) -> Result<T> {
        catch_engine_panic(|| read(&self.rtx()?, self.schema))
    }
}
