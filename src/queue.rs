//! The queue handle: every call on one queue of an open file.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase};

use crate::commit::{Ctx, Verdict, refuse};
use crate::error::catch_engine_panic;
use crate::error::{Error, Result};
use crate::file::{OpenFile, Recovery};
use crate::job::{
    Applied, EnqueueOptions, Enqueued, JobCursor, JobId, JobInfo, JobPage, JobState, Quarantined,
    Stats,
};
use crate::job::{Pruned, Violation};
use crate::lease::Lease;
use crate::open::Builder;
use crate::retry::RetryPolicy;
use crate::stop::StopSignal;
use crate::store::{self, QueueConfig};

pub(crate) fn batch_too_large(field: &'static str) -> Error {
    Error::invalid_option(
        field,
        format!("a batch holds 1 to {} items", crate::limits::BATCH_MAX),
    )
}

/// The checks of a page request ([`Queue::jobs`], [`Reader::jobs`](crate::Reader::jobs)).
pub(crate) fn check_page(state: JobState, after: Option<JobCursor>, limit: usize) -> Result<()> {
    if limit == 0 || limit > crate::limits::BATCH_MAX {
        return Err(batch_too_large("limit"));
    }
    if after.is_some_and(|c| c.state != state) {
        return Err(Error::invalid_option("after", "a cursor of another state"));
    }
    Ok(())
}

/// A page of `jobs` in `state`, whose last entry's key is `last`.
pub(crate) fn page(state: JobState, jobs: Vec<JobInfo>, last: Option<(u64, u64, u64)>) -> JobPage {
    let next = last.map(|key| JobCursor { state, key });
    JobPage { jobs, next }
}

/// A persistent job queue in one redb file. Cheap to clone (a shared handle); `Send + Sync`.
///
/// Every mutating call returns after the commit that covers it is durable (with the default
/// [`Durability::Immediate`](crate::Durability::Immediate)); concurrent calls from many threads share commits (group
/// commit). The file closes when the last handle, including every outstanding [`Lease`], is
/// dropped.
#[derive(Clone)]
pub struct Queue {
    pub(crate) inner: Arc<OpenFile>,
    /// This handle's queue: its tables and default options.
    pub(crate) config: QueueConfig,
    /// Its name; `None` for the default queue.
    pub(crate) name: Option<Arc<str>>,
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

    pub(crate) fn config(&self) -> QueueConfig {
        self.config
    }

    /// Runs `op` in the group commit: its value once committed, or its refusal or failure.
    pub(crate) fn run<T>(&self, op: &mut dyn FnMut(&mut Ctx<'_>) -> Verdict<T>) -> Result<T> {
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
    /// bytes of ASCII letters, digits, `_`, `-`, `.`) or a file whose queue numbers are used
    /// up (a queue gets one above the highest in use, never reused, at most
    /// [`QUEUES_MAX`](crate::QUEUES_MAX)); `Corrupted` for a damaged registry (a number out of
    /// range or given twice, a registered queue's table missing); `CommitFailed`, `Storage`,
    /// `Reentrant`; `Closed` after [`Queue::close`] (even for a queue that exists: reach it
    /// with [`Queue::existing`] then).
    pub fn named(&self, name: &str) -> Result<Queue> {
        crate::format::schema::QueueTables::check_name(name)?;
        self.check_open()?;
        let found =
            catch_engine_panic(|| store::find_queue(&self.inner.db.get().begin_read()?, name))?;
        let queue_number = match found {
            Some(queue_number) => queue_number,
            None => self.run(&mut |ctx| store::create_queue(ctx, name))?,
        };
        Ok(self.handle_of(name, queue_number))
    }

    /// A handle to the queue named `name` if it exists; never makes one (a read only).
    ///
    /// # Errors
    /// `QueueNotFound` if the file has no queue of that name; `InvalidOption` for a bad name;
    /// `Corrupted` for a damaged registry; `Storage`.
    pub fn existing(&self, name: &str) -> Result<Queue> {
        crate::format::schema::QueueTables::check_name(name)?;
        match catch_engine_panic(|| store::find_queue(&self.inner.db.get().begin_read()?, name))? {
            Some(queue_number) => Ok(self.handle_of(name, queue_number)),
            None => Err(Error::QueueNotFound {
                name: name.to_string(),
            }),
        }
    }

    /// The file's default queue (the one with no name), from any handle of the file: the
    /// inverse of [`Queue::named`]. It keeps this handle's settings (lease, attempts,
    /// encoding, retry policy); nothing is written.
    pub fn default_queue(&self) -> Queue {
        Queue {
            inner: self.inner.clone(),
            config: QueueConfig {
                tables: &crate::format::schema::DEFAULT_TABLES,
                ..self.config
            },
            name: None,
        }
    }

    /// The names of the file's named queues, sorted (the default queue is not listed).
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` for a damaged registry.
    pub fn queue_names(&self) -> Result<Vec<String>> {
        let named = catch_engine_panic(|| store::named_queues(&self.inner.db.get().begin_read()?))?;
        Ok(named.into_iter().map(|(name, _)| name).collect())
    }

    /// This handle's queue name; `None` for the default queue.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    fn handle_of(&self, name: &str, queue_number: u32) -> Queue {
        Queue {
            inner: self.inner.clone(),
            config: QueueConfig {
                tables: crate::format::schema::QueueTables::named(queue_number),
                ..self.inner.config
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
        q.config.lease_ms = store::lease_ms_checked("lease", lease)?;
        Ok(q)
    }

    /// This handle with another default number of attempts, for the jobs it enqueues without
    /// their own. Nothing is stored.
    ///
    /// # Errors
    /// `InvalidOption` for 0 or above [`MAX_ATTEMPTS_CAP`](crate::MAX_ATTEMPTS_CAP).
    pub fn with_max_attempts(&self, max_attempts: u32) -> Result<Queue> {
        if max_attempts == 0 || max_attempts > crate::limits::MAX_ATTEMPTS_CAP {
            return Err(Error::invalid_option(
                "max_attempts",
                format!(
                    "{max_attempts} is outside 1..={}",
                    crate::limits::MAX_ATTEMPTS_CAP
                ),
            ));
        }
        let mut q = self.clone();
        q.config.max_attempts = max_attempts;
        Ok(q)
    }

    /// This handle with another [`Encoding`](crate::Encoding) for
    /// [`enqueue_value`](Queue::enqueue_value) (and for decoding jobs that recorded none: raw
    /// payloads and jobs of files before format 5). Other handles are unchanged; nothing is
    /// stored until a job is enqueued.
    pub fn with_encoding(&self, encoding: crate::format::payload::Encoding) -> Queue {
        let mut q = self.clone();
        q.config.encoding = encoding;
        q
    }

    /// This handle with another default retry policy, for the jobs it gives back that have
    /// none of their own. Nothing is stored.
    ///
    /// # Errors
    /// `InvalidOption` for a policy out of range.
    pub fn with_retry(&self, retry: RetryPolicy) -> Result<Queue> {
        retry.validate("retry")?;
        let mut q = self.clone();
        q.config.retry = retry;
        Ok(q)
    }

    /// Enqueues a job with `payload` (at most the builder's `payload_bytes_max` bytes) and
    /// returns its id once the commit is durable.
    ///
    /// # Errors
    /// `PayloadTooLarge`, `KeyTooLong` or `InvalidOption` before anything is written;
    /// `Closed` after [`Queue::close`]; `CommitFailed`, `Storage` or `Reentrant` otherwise.
    pub fn enqueue(&self, payload: &[u8], opts: EnqueueOptions) -> Result<Enqueued> {
        let mut out = self.enqueue_batch([(payload, opts)])?;
        debug_assert_eq!(out.len(), 1);
        Ok(out.remove(0))
    }

    /// Enqueues `value` encoded with the handle's [`Encoding`](crate::Encoding) (bincode
    /// unless [`Builder::encoding`] or [`Queue::with_encoding`] chose another); read it back
    /// with [`Lease::decode`]. The job records its encoding, so it decodes the same way
    /// whatever handle later delivers it.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    /// enum Job {
    ///     Email { to: String },
    ///     Resize { width: u32 },
    /// }
    /// queue.enqueue_value(&Job::Resize { width: 640 }, Default::default())?;
    /// let lease = queue.dequeue()?.expect("a job");
    /// assert_eq!(lease.decode::<Job>()?, Job::Resize { width: 640 });
    /// lease.ack()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `PayloadCodec` if `value` does not serialize, or serializes to bytes that do not decode
    /// back as a `T` (with bincode: a serde internally tagged or untagged enum, or a
    /// `#[serde(flatten)]` field; use [`Encoding::Json`](crate::Encoding::Json) for those):
    /// nothing is written. Otherwise as [`Queue::enqueue`].
    pub fn enqueue_value<T>(&self, value: &T, opts: EnqueueOptions) -> Result<Enqueued>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let (payload, opts) = opts.typed(value, self.config.encoding)?;
        self.enqueue(&payload, opts)
    }

    /// Enqueues up to [`BATCH_MAX`](crate::BATCH_MAX) jobs in one commit (one fsync) and returns
    /// one result per job, in order. All or nothing: if any job is refused, none is added. A
    /// dedup key held by a live job, or by an earlier job of the same batch, yields
    /// `Duplicate` for that job.
    ///
    /// # Errors
    /// `InvalidOption` for an empty or oversized batch; `PayloadTooLarge`, `KeyTooLong` or
    /// `InvalidOption` for the first job refused (nothing is written); `Closed` after
    /// [`Queue::close`]; `CommitFailed`, `Storage` or `Reentrant` otherwise.
    pub fn enqueue_batch<'p>(
        &self,
        jobs: impl IntoIterator<Item = (&'p [u8], EnqueueOptions)>,
    ) -> Result<Vec<Enqueued>> {
        self.check_open()?;
        let records = store::new_records(&self.config, self.now_ms(), jobs)?;
        self.run(&mut |ctx| store::enqueue(ctx, self.config.tables, &records).map(Ok))
    }

    /// Adds up to [`BATCH_MAX`](crate::BATCH_MAX) jobs with their state and history (attempts,
    /// last error, due or death time) in one commit, all or nothing, and returns one result per
    /// job, in order: `New(id)` with a new id, or `Duplicate`/`DuplicateDead` when its dedup
    /// key is held (as [`Queue::enqueue_batch`]). For moving jobs between files and restoring
    /// an export (`leaseq import`); see [`ImportJob`](crate::ImportJob). Ready jobs join the
    /// back of their priority in the order given. Applied markers are not imported: a job
    /// without an idempotency key gets a new id, so its effect's marker (keyed by the old
    /// id) does not follow it.
    ///
    /// # Errors
    /// `InvalidOption` for an empty or oversized batch, or for the first job refused (an
    /// option out of range, attempts not below `max_attempts` for a job still to run, or above
    /// it for a dead one); `PayloadTooLarge`, `KeyTooLong`: nothing is written. `Closed`;
    /// `CommitFailed`, `Storage` or `Reentrant`.
    ///
    /// Moving every job of one file into another, with its state and history (what
    /// `leaseq export` and `leaseq import` do through JSON lines):
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// use leaseq::{EnqueueOptions, ImportJob, JobState, Queue};
    ///
    /// let old = Queue::open(dir.path().join("old.leaseq"))?;
    /// old.enqueue(b"resize 42", EnqueueOptions::default().priority(-1))?;
    /// old.enqueue(b"email 7", EnqueueOptions::default().max_attempts(1))?;
    /// let resize = old.dequeue()?.expect("a job"); // priority -1 goes first
    /// let email = old.dequeue()?.expect("a job");
    /// resize.nack_after("not now", std::time::Duration::ZERO)?; // ready again, 1 attempt made
    /// email.nack("smtp down")?; // its only attempt: dead
    ///
    /// let mut batch = Vec::new();
    /// for state in [JobState::Ready, JobState::Dead] {
    ///     for info in old.jobs(state, None, 100)?.jobs {
    ///         let payload = old.payload(info.id)?.expect("the job is there");
    ///         let mut opts = EnqueueOptions::default()
    ///             .priority(info.priority)
    ///             .max_attempts(info.max_attempts);
    ///         if let Some(key) = &info.idempotency_key {
    ///             opts = opts.idempotency_key(key);
    ///         }
    ///         batch.push(
    ///             ImportJob::new(payload)
    ///                 .options(opts)
    ///                 .state(info.state)
    ///                 .run_at_ms(info.run_at_ms)
    ///                 .attempts(info.attempts)
    ///                 .last_error(info.last_error.clone())
    ///                 .created_ms(info.created_ms)
    ///                 .encoding(info.encoding),
    ///         );
    ///     }
    /// }
    /// let new = Queue::open(dir.path().join("new.leaseq"))?;
    /// let outcomes = new.import_batch(&batch)?; // one commit, all or nothing, new ids
    /// assert_eq!(outcomes.len(), 2);
    /// let stats = new.stats()?;
    /// assert_eq!((stats.ready, stats.dead), (1, 1));
    /// let dead = new.jobs(JobState::Dead, None, 10)?.jobs;
    /// assert_eq!(dead[0].last_error.as_deref(), Some("smtp down"));
    /// let ready = new.jobs(JobState::Ready, None, 10)?.jobs;
    /// assert_eq!((ready[0].attempts, ready[0].last_error.as_deref()), (1, Some("not now")));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn import_batch(&self, jobs: &[crate::job::ImportJob]) -> Result<Vec<Enqueued>> {
        self.check_open()?;
        if jobs.is_empty() || jobs.len() > crate::limits::BATCH_MAX {
            return Err(batch_too_large("jobs"));
        }
        let now_ms = self.now_ms();
        let records = jobs
            .iter()
            .map(|j| store::import_record(&self.config, now_ms, j))
            .collect::<Result<Vec<_>>>()?;
        self.run(&mut |ctx| {
            store::enqueue_imported(ctx, self.config.tables, &records, now_ms).map(Ok)
        })
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
    /// The outbox: an app saves a note in its own table and enqueues the job that syncs it,
    /// in one commit, so there is never a note without its sync job or a job without its note
    /// (`examples/outbox_sync.rs` runs the whole loop against a flaky server):
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::redb::{ReadableDatabase, TableDefinition};
    /// use leaseq::EnqueueOptions;
    ///
    /// const NOTES: TableDefinition<&str, &str> = TableDefinition::new("notes");
    ///
    /// let id = queue.write(|tx| {
    ///     tx.open_table(NOTES)?.insert("note-1", "buy milk")?;
    ///     // Keyed by the note, so the server can drop a repeated request.
    ///     let job = tx.enqueue(b"note-1", EnqueueOptions::default().idempotency_key("note-1"))?;
    ///     Ok(job.id())
    /// })?;
    /// let info = queue.job(id)?.expect("enqueued");
    /// assert_eq!(info.idempotency_key.as_deref(), Some(&b"note-1"[..]));
    ///
    /// // A failing closure commits nothing: neither the note nor the job.
    /// let r = queue.write(|tx| {
    ///     tx.open_table(NOTES)?.insert("note-2", "call mum")?;
    ///     tx.enqueue(b"note-2", EnqueueOptions::default())?;
    ///     Err::<(), _>("the app changed its mind".into())
    /// });
    /// assert!(matches!(r, Err(leaseq::Error::Effect(_))));
    /// assert_eq!(queue.len()?, 1);
    /// let read = queue.database().begin_read()?;
    /// assert!(read.open_table(NOTES)?.get("note-2")?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `PayloadTooLarge`, `KeyTooLong` or `InvalidOption` when `f` passed on an enqueue's
    /// refusal (as outside `write`: the message names the setting; a closure may also catch
    /// it and go on, the refused job written nothing); `Effect` with any other error or
    /// panic message of `f` (nothing of it commits; the other calls
    /// sharing the transaction run again without it); `Closed` after [`Queue::close`];
    /// `Storage` (or `Io`) also when an enqueue inside `f`, or `f`'s own table writes, failed
    /// on the disk and `f` passed that error on (redb's `StorageError::Io` or `PreviousIo`,
    /// bare or in a `TableError`; nothing of `f` commits); `CommitFailed`, `Storage` or
    /// `Reentrant` otherwise.
    pub fn write<T, F>(&self, mut f: F) -> Result<T>
    where
        F: FnMut(&crate::tx::Tx<'_>) -> std::result::Result<T, crate::error::BoxError>,
    {
        self.check_open()?;
        let (now_ms, config) = (self.now_ms(), self.config);
        self.run(&mut |ctx| store::write(ctx, &config, now_ms, &mut f).map(Ok))
            .map_err(Error::surfaced_in_write)
    }

    /// Takes the next job if one is available now, or returns `None` at once.
    ///
    /// Before taking one, moves due delayed jobs to ready and reclaims expired leases (at most
    /// 256 of each per call; an expired job with attempts left is given back through its
    /// retry policy, due after the delay (ready at once, at the back of its priority, with
    /// [`RetryPolicy::immediate`]), otherwise dead with "lease expired"). The job is leased for its lease
    /// duration under a fresh token, its attempt counted, and it is returned only after that
    /// commit. A check that finds nothing costs a read, not a commit.
    ///
    /// One bad row never stops it: a job row that fails its checks is quarantined
    /// ([`Queue::quarantined`]), an index entry that does not match its job is dropped (the
    /// job keeps its own entry), and the dequeue goes on with the next job; it answers `None`
    /// only when no job is available.
    ///
    /// # Errors
    /// `Closed` after [`Queue::close`] (nothing leased); `CommitFailed`, `Storage` or
    /// `Reentrant`; `Corrupted` only for damage redb itself reports.
    pub fn dequeue(&self) -> Result<Option<Lease>> {
        Ok(self.try_dequeue()?.0)
    }

    fn try_dequeue(&self) -> Result<(Option<Lease>, Option<u64>)> {
        let (mut leases, next_due_ms) = self.try_dequeue_batch(1)?;
        Ok((leases.pop(), next_due_ms))
    }

    fn try_dequeue_batch(&self, max: usize) -> Result<(Vec<Lease>, Option<u64>)> {
        if max == 0 || max > crate::limits::BATCH_MAX {
            return Err(batch_too_large("max"));
        }
        match self.peek_work()? {
            (true, _) => self.take_now(max),
            (false, next_due_ms) => Ok((Vec::new(), next_due_ms)),
        }
    }

    /// A look before a dequeue's commit, with a read: whether a job may be available now,
    /// and the earliest due time of the queue's waiting jobs and leases (`None` with nothing
    /// to wait for, or while the queue is paused: only a resume wakes it then).
    ///
    /// # Errors
    /// `Closed` once the file is closed to deliveries; `Reentrant`; `Storage`.
    pub(crate) fn peek_work(&self) -> Result<(bool, Option<u64>)> {
        self.check_delivering()?;
        // Before the probe: from inside an `ack_with` closure, "nothing ready" must not
        // pass for an answer (and `dequeue_timeout` must not wait for a commit this very
        // thread is holding up).
        self.inner.committer.check_reentrant()?;
        if self.is_paused() {
            return Ok((false, None));
        }
        let now_ms = self.now_ms();
        catch_engine_panic(|| {
            let rtx = self.inner.db.get().begin_read()?;
            store::peek_due(&rtx, self.config.tables, now_ms)
        })
    }

    /// A dequeue's commit, after [`Queue::peek_work`] saw work: up to `max` leases, and,
    /// when it took none (another consumer took the job, or a bounded sweep has more to
    /// do), now as the time to look again.
    pub(crate) fn take_now(&self, max: usize) -> Result<(Vec<Lease>, Option<u64>)> {
        let (now_ms, config) = (self.now_ms(), self.config);
        let leased = self.run(&mut |ctx| {
            // Again in the group: a pause that returned while this call waited to join wins,
            // and so does a close or a shutdown (an async dequeue may wait for a helper).
            if self.is_paused() {
                return Ok(Ok(Vec::new()));
            }
            if self.is_closed() {
                return refuse(Error::Closed);
            }
            store::dequeue(ctx, &config, now_ms, max).map(Ok)
        })?;
        let next_due_ms = leased.is_empty().then_some(now_ms);
        Ok((
            leased
                .into_iter()
                .map(|l| Lease::from_delivery(self, l))
                .collect(),
            next_due_ms,
        ))
    }

    /// How long a consumer that found nothing waits before it looks again: until `deadline`
    /// (`None`: an hour at most), the next due time, and at most
    /// [`DUE_RECHECK_MAX`](crate::DUE_RECHECK_MAX) while a due time is pending (a clock that
    /// jumps). `None` once `deadline` passed.
    pub(crate) fn wait_before_looking(
        &self,
        deadline: Option<Instant>,
        next_due_ms: Option<u64>,
    ) -> Option<Duration> {
        let now = Instant::now();
        let mut wait = match deadline {
            Some(d) if now >= d => return None,
            Some(d) => d - now,
            None => Duration::from_secs(3600),
        };
        if let Some(due_ms) = next_due_ms {
            let until_due = due_ms.saturating_sub(self.now_ms()).max(1);
            wait = wait
                .min(Duration::from_millis(until_due))
                .min(crate::limits::DUE_RECHECK_MAX);
        }
        Some(wait)
    }

    /// The wake-up of this queue's consumers.
    pub(crate) fn work_signal(&self) -> Arc<crate::signal::WakeSignal> {
        self.inner
            .committer
            .work()
            .of(self.config().tables.queue_number)
    }

    /// Which queue a lease of this handle is from: the file's committer id and the queue's
    /// number in the file.
    pub(crate) fn lease_owner(&self) -> (u64, u32) {
        (self.inner.committer.id(), self.config.tables.queue_number)
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
        let results: Vec<Option<Vec<u8>>> = leases.iter().map(Lease::result).collect();
        let now_ms = self.now_ms();
        let out = self
            .run(&mut |ctx| store::ack(ctx, self.config.tables, &keys, &results, now_ms).map(Ok))?;
        leases
            .iter()
            .zip(&out)
            .for_each(|(l, r)| l.release_if_ended(r));
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
        F: FnMut(&crate::tx::Tx<'_>, &Lease) -> std::result::Result<(), crate::error::BoxError>,
    {
        let mut each = |tx: &crate::tx::Tx<'_>, i: usize| effect(tx, &leases[i]);
        self.ack_with_leases(leases, &mut store::EffectCall::Each(&mut each))
    }

    /// `ack_with` over a batch of leases (checked first), each ending its lease as its outcome
    /// says.
    fn ack_with_leases(
        &self,
        leases: &[Lease],
        effect: &mut store::EffectCall<'_, '_>,
    ) -> Result<Vec<Result<Applied>>> {
        let keys = self.batch_keys(leases)?;
        let results: Vec<Option<Vec<u8>>> = leases.iter().map(Lease::result).collect();
        let (applied, _) = self.ack_with_keys(&keys, &results, effect, AckThen::Stop)?;
        leases
            .iter()
            .zip(&applied)
            .for_each(|(l, r)| l.release_if_ended(r));
        Ok(applied
            .into_iter()
            .map(|r| r.map_err(Error::surfaced))
            .collect())
    }

    /// [`Queue::ack_with_batch`] with one call of `effect` for the whole batch: `effect(tx,
    /// leases)` runs once, with the leases of the batch that are current and whose idempotency
    /// key is not yet applied (in the order given; two leases with the same key: the first),
    /// then the markers and acks are written, and all commit together. For an effect that
    /// writes the same tables for every job: it opens each table once per batch rather than
    /// once per job (a redb `open_table` costs about what an insert does). The closure does not
    /// run when no lease needs it. Returns one outcome per lease, in order: `Ok(Now)` for each
    /// lease passed to the closure; `Ok(AlreadyApplied)`; `Err(LeaseLost)` or
    /// `Err(Corrupted)` as in [`Queue::ack_batch`]. If the closure fails (an error, a panic,
    /// an [`Outcome`](crate::Outcome)), none of its writes commit and every lease it was given
    /// is given back as by a failing [`Lease::ack_with`] closure (the error as its last error,
    /// or as the `Outcome` says), `Err(Effect)` in its place (the closure's own error at the
    /// first, its text at the others; an enqueue's refusal the closure passed on is that
    /// error itself at the first, as from [`Lease::ack_with`]); the other leases' outcomes
    /// stand and commit.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::{EnqueueOptions, redb::TableDefinition};
    /// const TOTALS: TableDefinition<u64, u64> = TableDefinition::new("totals");
    ///
    /// for n in 1..=3u64 {
    ///     queue.enqueue(&n.to_le_bytes(), EnqueueOptions::default())?;
    /// }
    /// let leases = queue.dequeue_batch(10)?;
    /// let outcomes = queue.ack_with_all(&leases, |tx, leases| {
    ///     let mut totals = tx.open_table(TOTALS)?; // opened once for the batch
    ///     for lease in leases {
    ///         let n = u64::from_le_bytes(lease.payload().try_into()?);
    ///         totals.insert(lease.id().0, n * 10)?;
    ///     }
    ///     Ok(())
    /// })?;
    /// assert!(outcomes.iter().all(|o| matches!(o, Ok(leaseq::Applied::Now))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Queue::ack_batch`].
    #[must_use = "a lease of the batch may be LeaseLost or Effect: its outcome is in the Vec"]
    pub fn ack_with_all<F>(&self, leases: &[Lease], mut effect: F) -> Result<Vec<Result<Applied>>>
    where
        F: FnMut(&crate::tx::Tx<'_>, &[&Lease]) -> std::result::Result<(), crate::error::BoxError>,
    {
        let mut all = |tx: &crate::tx::Tx<'_>, at: &[usize]| {
            let chosen: Vec<&Lease> = at.iter().map(|&i| &leases[i]).collect();
            effect(tx, &chosen)
        };
        self.ack_with_leases(leases, &mut store::EffectCall::All(&mut all))
    }

    /// Runs `store::ack_with` over `keys` (then, with [`AckThen::LeaseNext`], a dequeue of one)
    /// in one commit.
    /// A closure that fails drops the transaction; the call then runs again with that lease
    /// marked, so its job is given back with the closure's error and the other leases' effects
    /// commit (no dequeue once a closure has failed). At most one run more than there are
    /// leases. The closure errors come back in their leases' places.
    pub(crate) fn ack_with_keys(
        &self,
        keys: &[(u64, u64)],
        results: &[Option<Vec<u8>>],
        effect: &mut store::EffectCall<'_, '_>,
        then: AckThen,
    ) -> Result<(Vec<Result<Applied>>, Vec<store::Delivery>)> {
        let (now_ms, config) = (self.now_ms(), self.config);
        // After `close`, an ack-and-next acks and takes nothing.
        let next = then == AckThen::LeaseNext && !self.is_closed() && !self.is_paused();
        let mut failed: Vec<Option<store::ClosureFailure>> = vec![None; keys.len()];
        let mut errors: Vec<Option<crate::error::BoxError>> = keys.iter().map(|_| None).collect();
        for _ in 0..=keys.len() {
            // The leases the closure that ran last was given.
            let mut failing: Vec<usize> = Vec::new();
            let dequeue = next && errors.iter().all(Option::is_none);
            let ran = self.run(&mut |ctx| {
                // Left set after the closure returns: an `Effect` error of the operation
                // comes from the closure that ran last (its error or panic, or a storage
                // error inside one of its enqueues that it swallowed).
                let (mut each, mut all);
                let mut tracked = match effect {
                    store::EffectCall::Each(f) => {
                        each = |tx: &crate::tx::Tx<'_>, i: usize| {
                            failing = vec![i];
                            f(tx, i)
                        };
                        store::EffectCall::Each(&mut each)
                    }
                    store::EffectCall::All(f) => {
                        all = |tx: &crate::tx::Tx<'_>, at: &[usize]| {
                            failing = at.to_vec();
                            f(tx, at)
                        };
                        store::EffectCall::All(&mut all)
                    }
                };
                let applied =
                    store::ack_with(ctx, keys, results, &config, now_ms, &failed, &mut tracked)?;
                // The next job only after an ack that happened: a refused one leases nothing.
                let leased = if dequeue && !self.is_paused() && applied.iter().all(Result::is_ok) {
                    store::dequeue(ctx, &config, now_ms, 1)?
                } else {
                    Vec::new()
                };
                Ok(Ok((applied, leased)))
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
                (Err(Error::Effect(e)), at)
                    if !at.is_empty() && at.iter().all(|&i| failed[i].is_none()) =>
                {
                    // Every lease the failing closure was given goes back with its error.
                    let failure = store::ClosureFailure::of(&e);
                    for &i in &at[1..] {
                        failed[i] = Some(failure.clone());
                        errors[i] = Some(e.to_string().into());
                    }
                    failed[at[0]] = Some(failure);
                    errors[at[0]] = Some(e);
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
        if leases.len() > crate::limits::BATCH_MAX {
            return Err(batch_too_large("leases"));
        }
        if leases.iter().any(|l| l.owner() != self.lease_owner()) {
            return Err(Error::invalid_option("leases", "a lease of another queue"));
        }
        Ok(leases.iter().map(Lease::fenced_key).collect())
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
    /// As [`Queue::dequeue`]; a call blocked when [`Queue::close`] is called wakes and
    /// returns `Closed`.
    pub fn dequeue_timeout(&self, timeout: Duration) -> Result<Option<Lease>> {
        self.wait_for_job(timeout, None)
    }

    /// [`Queue::dequeue_timeout`] that also returns `Ok(None)` as soon as `stop` is stopped:
    /// a blocked call wakes at once, and a signal already stopped returns before dequeuing
    /// anything (also on a closed file: the signal is looked at first). This is how a thread pool stops its idle consumers without closing the file
    /// for the rest of the app (as Go's `context` cancellation or .NET's
    /// `CancellationToken`); [`Queue::close`] stops every consumer of the file instead.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::StopSignal;
    /// use std::time::Duration;
    ///
    /// let stop = StopSignal::new();
    /// let consumer = {
    ///     let (queue, stop) = (queue.clone(), stop.clone());
    ///     std::thread::spawn(move || queue.dequeue_until(Duration::from_secs(3600), &stop))
    /// };
    /// stop.stop(); // the consumer returns Ok(None) now, not in an hour
    /// assert!(consumer.join().unwrap()?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Queue::dequeue_timeout`].
    pub fn dequeue_until(&self, timeout: Duration, stop: &StopSignal) -> Result<Option<Lease>> {
        self.wait_for_job(timeout, Some(stop))
    }

    fn wait_for_job(&self, timeout: Duration, stop: Option<&StopSignal>) -> Result<Option<Lease>> {
        self.inner.committer.check_reentrant()?;
        // A timeout too long to add to the monotonic clock waits without end.
        let deadline = Instant::now().checked_add(timeout);
        let work = self.work_signal();
        if let Some(stop) = stop {
            stop.watch(&work);
        }
        loop {
            // The epoch before the flags: a close or a stop after this read moves the epoch,
            // so the wait below returns at once.
            let epoch = work.epoch();
            if stop.is_some_and(StopSignal::is_stopped) {
                return Ok(None);
            }
            let (lease, next_due_ms) = self.try_dequeue()?;
            if lease.is_some() {
                return Ok(lease);
            }
            match self.wait_before_looking(deadline, next_due_ms) {
                Some(wait) => work.wait(epoch, wait),
                None => return Ok(None),
            }
        }
    }

    /// Closes the file to new work, for every handle of it (every named queue too): blocked
    /// [`dequeue_timeout`](Queue::dequeue_timeout) and [`dequeue_until`](Queue::dequeue_until)
    /// calls wake and return `Err(Closed)`, and from then on `dequeue`, `dequeue_batch`,
    /// `dequeue_timeout`, `dequeue_until`, `enqueue`, `enqueue_value`, `enqueue_batch`,
    /// `write` and `named` return [`Error::Closed`] without writing. So consumer threads
    /// stop without polling a flag of their own (as BullMQ's `queue.close()`).
    ///
    /// What stays open, so work in flight ends cleanly: every call on a [`Lease`] already
    /// held (ack, `ack_with` with its follow-up enqueues, nack, fail, extend, snooze,
    /// heartbeats; `ack_and_next` acks and returns no next job), and the reads (`stats`,
    /// `jobs`, `job`, `payload`, `check`). The file itself closes when the last handle and
    /// lease are dropped, as before. Closing twice is a no-op; there is no reopening through
    /// the same handles (open the file again once they are dropped).
    ///
    /// Maintenance calls that start no work are not refused either: `requeue_dead`,
    /// `requeue_dead_all`, `remove`, `purge`, `prune`, `flush`, `compact`. `import_batch` is
    /// refused (it adds jobs).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::Error;
    /// use std::time::Duration;
    ///
    /// queue.enqueue(b"in flight", Default::default())?;
    /// let lease = queue.dequeue()?.expect("a job");
    /// let consumer = {
    ///     let queue = queue.clone();
    ///     std::thread::spawn(move || queue.dequeue_timeout(Duration::from_secs(3600)))
    /// };
    ///
    /// queue.close(); // the blocked consumer returns Err(Closed) now, not in an hour
    /// assert!(matches!(consumer.join().unwrap(), Err(Error::Closed)));
    /// assert!(matches!(queue.enqueue(b"new", Default::default()), Err(Error::Closed)));
    /// lease.ack()?; // work in flight still ends
    /// assert!(queue.is_empty()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.inner.committer.work().notify_all();
    }

    /// Whether the file is closed to new deliveries: [`Queue::close`] was called on it, or a
    /// [`Queue::shutdown`] started (during its grace enqueues still commit).
    pub fn is_closed(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.inner.closed.load(SeqCst) || self.inner.draining.load(SeqCst)
    }

    /// Shuts the file down for the app's exit, in one call: stops every consumer, lets the
    /// work in flight end and commit within `grace`, then closes the file and lets go of it.
    /// Consumes this handle, so that it can be the last.
    ///
    /// 1. **No new deliveries**, on every handle of the file (every named queue too): blocked
    ///    [`dequeue_timeout`](Queue::dequeue_timeout) / [`dequeue_until`](Queue::dequeue_until)
    ///    calls wake and return `Err(Closed)`, later dequeues too; [`WorkerPool`](crate::worker::WorkerPool)s
    ///    stop taking jobs (their workers exit and let go of the file); `ack_and_next` acks
    ///    only. Everything else goes on: calls on leases already held, `enqueue`, `write`
    ///    (a handler finishing its job may store its result and enqueue follow-ups), reads.
    /// 2. **Waits up to `grace`** for every other handle of the file to be dropped: the app's
    ///    clones of the queue and its named queues, leases not yet ended, pools' workers,
    ///    consumer threads (each ends when its dequeue returns `Closed`). It looks every
    ///    millisecond or so.
    /// 3. **Closes the file** as [`Queue::close`] does (new enqueues are `Closed` from now
    ///    on), and, if this was the last handle, makes every commit durable
    ///    ([`Queue::flush`]) and closes the database: its lock is let go, a reopen in this
    ///    process or another succeeds at once, and reports no repair
    ///    ([`Recovery::repaired`] `false`). [`FileShutdown::released`] says which.
    ///
    /// Handles still alive at the end of the grace keep the file open until they are
    /// dropped (then it closes, as always); their leases are returned at the next open (the
    /// attempt counted, as after a crash). A shutdown never loses a job: a job in flight is
    /// either ended by its worker or still leased in the file.
    ///
    /// Takes `grace` at most, plus the final flush. From a [`WorkerPool`](crate::worker::WorkerPool)
    /// handler or an `ack_with` closure it would wait for its own caller: don't. It blocks
    /// the calling thread: in async code use `AsyncQueue::shutdown` (feature `async`), which
    /// waits without a thread (the tasks it waits for may need this one to run).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("app.leaseq");
    /// use leaseq::{Queue, WorkerPool};
    /// use std::time::Duration;
    ///
    /// let queue = Queue::open(&path)?;
    /// let pool = WorkerPool::builder(&queue).threads(2).start(|_lease| Ok(()))?;
    /// queue.enqueue(b"work", Default::default())?;
    /// // The app is quitting:
    /// let report = queue.shutdown(Duration::from_secs(10));
    /// assert!(report.released, "{report:?}");
    /// assert!(pool.stats().in_flight == 0);
    /// let again = Queue::open(&path)?; // at once, in the same process
    /// assert!(!again.recovery().repaired);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(self, grace: Duration) -> FileShutdown {
        let started = Instant::now();
        self.begin_shutdown();
        let deadline = started.checked_add(grace);
        let mut look = Duration::from_micros(200);
        while self.other_handles() > 0 && deadline.is_none_or(|d| Instant::now() < d) {
            std::thread::sleep(look);
            look = (look * 2).min(Duration::from_millis(2));
        }
        self.finish_shutdown(started)
    }

    /// The first step of [`Queue::shutdown`]: no new deliveries on any handle of the file;
    /// blocked consumers wake.
    pub(crate) fn begin_shutdown(&self) {
        self.inner
            .draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.inner.committer.work().notify_all();
    }

    /// Handles of the file other than this one (queue handles, leases, pools' workers).
    pub(crate) fn other_handles(&self) -> usize {
        Arc::strong_count(&self.inner).saturating_sub(1)
    }

    /// The last step of [`Queue::shutdown`] (a flush, one commit): the file closed to new
    /// work, every commit durable, the database closed if this was the last handle.
    pub(crate) fn finish_shutdown(self, started: Instant) -> FileShutdown {
        self.close();
        // Even with handles left (another shutdown at once, say): what committed so far is
        // durable whoever closes the file.
        if let Err(e) = flush_file(&self.inner) {
            tracing::warn!(error = %e, "leaseq: the flush at shutdown failed");
        }
        let handles_left = self.other_handles();
        let Queue { inner, .. } = self;
        // `into_inner`, not `try_unwrap`: of handles let go of at once (two shutdowns from
        // clones), exactly one gets the file, so one report says it was released.
        let released = match Arc::into_inner(inner) {
            Some(file) => {
                drop(file);
                true
            }
            None => false,
        };
        if released {
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "leaseq: file shut down and released"
            );
        } else {
            tracing::info!(
                handles_left,
                "leaseq: file shut down; handles still alive keep it open"
            );
        }
        FileShutdown {
            released,
            handles_left: if released { 0 } else { handles_left.max(1) },
            elapsed: started.elapsed(),
        }
    }

    /// Pauses this queue, as BullMQ's `queue.pause()`, Oban's `pause_queue` and River's
    /// `QueuePause`: for an app gone offline, whose sync jobs would only fail (and use up their
    /// attempts) until it is back. The pause is stored in the file (a reopen finds the queue
    /// paused) until [`Queue::resume`]. A paused queue delivers nothing: [`Queue::dequeue`]
    /// and [`Queue::dequeue_batch`] return nothing at once; [`Queue::dequeue_timeout`] and
    /// [`Queue::dequeue_until`] wait for a resume (or their timeout or stop);
    /// [`Lease::ack_and_next`] and [`Lease::ack_with_and_next`] ack and take nothing; a
    /// [`WorkerPool`](crate::worker::WorkerPool) idles, and a relay takes nothing new (jobs it
    /// already leased still go out).
    ///
    /// Everything else goes on: enqueues, every call on a lease already held (a lease can
    /// still run out: the first dequeue after the resume takes it back, as usual), the reads,
    /// maintenance. Only this queue is paused; the file's other queues keep running. A call
    /// racing the pause from another thread may still deliver; none does once `pause`
    /// returned. Returns whether the queue was running (pausing a paused queue changes
    /// nothing). One commit, even after [`Queue::close`].
    ///
    /// # Errors
    /// `Reentrant` from inside an `ack_with` closure; `CommitFailed` or `Storage`.
    pub fn pause(&self) -> Result<bool> {
        let (queue_number, now_ms) = (self.config.tables.queue_number, self.now_ms());
        let _in_commit_order = self.inner.pausing.lock();
        let paused = self.run(&mut |ctx| store::pause(ctx, queue_number, now_ms).map(Ok))?;
        self.inner.paused.write().insert(queue_number);
        if paused {
            tracing::info!(queue = queue_number, "leaseq: queue paused");
        }
        Ok(paused)
    }

    /// Resumes a paused queue ([`Queue::pause`]): its blocked consumers wake at once and
    /// deliveries go on where they stopped (jobs due meanwhile are served in their order).
    /// Returns whether the queue was paused. One commit.
    ///
    /// # Errors
    /// `Reentrant` from inside an `ack_with` closure; `CommitFailed` or `Storage`.
    pub fn resume(&self) -> Result<bool> {
        let queue_number = self.config.tables.queue_number;
        let _in_commit_order = self.inner.pausing.lock();
        let resumed = self.run(&mut |ctx| store::resume(ctx, queue_number).map(Ok))?;
        self.inner.paused.write().remove(&queue_number);
        // After the flag: a consumer woken here finds the queue running.
        self.inner.committer.work().notify(queue_number);
        if resumed {
            tracing::info!(queue = queue_number, "leaseq: queue resumed");
        }
        Ok(resumed)
    }

    /// Subscribes to this queue's change events ([`Event`](crate::Event)): what each commit
    /// did (jobs enqueued, completed, retried, snoozed, dead, cancelled, requeued; the queue
    /// paused, resumed, drained), published after the commit, for a UI's live counts and
    /// lists without polling (as BullMQ's `QueueEvents`). Holds up to
    /// [`EVENTS_CAPACITY_DEFAULT`](crate::EVENTS_CAPACITY_DEFAULT) unread events, then counts
    /// the ones it drops ([`Events::missed`](crate::Events::missed)). Events before the call
    /// are not replayed: subscribe, read [`Queue::stats`] once, then follow the events (a
    /// call that started before `events` returned, on another thread, may be missing from
    /// both: subscribe before the app's work starts, or read the stats again when in doubt).
    /// An event is published before its call returns. Recording costs nothing while no one
    /// subscribes.
    ///
    /// Not evented (read the stats after them): `remove`, `purge`, `prune` and the history's
    /// retention, quarantine, `promote`, `reschedule`, `set_priority`, `update_payload`, and
    /// a duplicate that replaced or debounced a waiting job.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::Event;
    ///
    /// let events = queue.events()?;
    /// let id = queue.enqueue(b"x", Default::default())?.id();
    /// queue.dequeue()?.expect("a job").ack()?;
    /// assert_eq!(events.try_recv(), Some(Event::Enqueued { id }));
    /// assert_eq!(events.try_recv(), Some(Event::Completed { id }));
    /// assert_eq!(events.try_recv(), Some(Event::Drained));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` when [`SUBSCRIBERS_MAX`](crate::SUBSCRIBERS_MAX) subscriptions of the
    /// file are alive.
    pub fn events(&self) -> Result<crate::events::Events> {
        self.events_with_capacity(crate::limits::EVENTS_CAPACITY_DEFAULT)
    }

    /// [`Queue::events`] holding up to `capacity` unread events (1 to
    /// [`EVENTS_CAPACITY_MAX`](crate::EVENTS_CAPACITY_MAX)).
    ///
    /// # Errors
    /// `InvalidOption` for a capacity out of range, or as [`Queue::events`].
    pub fn events_with_capacity(&self, capacity: usize) -> Result<crate::events::Events> {
        if !(1..=crate::limits::EVENTS_CAPACITY_MAX).contains(&capacity) {
            return Err(Error::invalid_option(
                "capacity",
                format!("1 to {} events", crate::limits::EVENTS_CAPACITY_MAX),
            ));
        }
        self.inner
            .committer
            .hub()
            .subscribe(self.config.tables.queue_number, capacity)
            .ok_or_else(|| {
                Error::invalid_option(
                    "events",
                    format!(
                        "{} subscriptions of this file are alive",
                        crate::limits::SUBSCRIBERS_MAX
                    ),
                )
            })
    }

    /// Whether this queue is paused ([`Queue::pause`]). No I/O: the file's pause state is kept
    /// in memory from the open on.
    pub fn is_paused(&self) -> bool {
        self.inner
            .paused
            .read()
            .contains(&self.config.tables.queue_number)
    }

    /// Sets what this queue keeps of its completed jobs: its completed history (see
    /// [`History`](crate::History)). Stored in the file, for this queue only (the file's other
    /// queues keep their own), so every handle and every later open keeps the same history,
    /// and the `leaseq` tool's writes never prune what the app keeps. Off by default: an ack
    /// deletes its job. Turning it off (or lowering a bound) lets the next operations delete
    /// what the new bound no longer keeps, a few per operation ([`Queue::prune`] does the rest
    /// at once). Returns whether the setting changed. One commit.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::{History, JobState};
    /// use std::time::Duration;
    ///
    /// queue.set_history(History::off().keep_jobs(1000).keep_for(Duration::from_secs(86_400)))?;
    /// let id = queue.enqueue(b"resize photo 7", Default::default())?.id();
    /// queue.dequeue()?.expect("a job").ack_with_result(b"640x480")?;
    /// let job = queue.job(id)?.expect("kept");
    /// assert_eq!(job.state, JobState::Completed);
    /// assert_eq!(job.result.as_deref(), Some(&b"640x480"[..]));
    /// assert_eq!(queue.stats()?.completed, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `InvalidOption` for a `keep_jobs` of 0 or above
    /// [`HISTORY_JOBS_MAX`](crate::HISTORY_JOBS_MAX), or a `keep_for` of 0 or above
    /// [`DELAY_MAX`](crate::DELAY_MAX) (nothing written); `Reentrant`; `CommitFailed` or
    /// `Storage`.
    pub fn set_history(&self, history: crate::job::History) -> Result<bool> {
        store::validate_history(&history)?;
        let queue_number = self.config.tables.queue_number;
        self.run(&mut |ctx| store::set_history(ctx, queue_number, history).map(Ok))
    }

    /// What this queue keeps of its completed jobs ([`Queue::set_history`]).
    ///
    /// # Errors
    /// `Storage`.
    pub fn history(&self) -> Result<crate::job::History> {
        catch_engine_panic(|| {
            store::history_of(
                &self.inner.db.get().begin_read()?,
                self.config.tables.queue_number,
            )
        })
    }

    /// Cancels a job in any live state, with `reason` (kept up to
    /// [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes, cut at a character boundary), as
    /// River's `JobCancel`, Oban's `cancel_job` and BullMQ's cancellation. Returns the state
    /// the job was in. One commit.
    ///
    /// - A scheduled, ready or dead job ends now: it is never delivered again.
    /// - A leased job ends now too, and its current delivery is fenced: that lease's
    ///   [`ack`](crate::Lease::ack), `ack_with`, `nack`, `snooze`, `fail` and
    ///   [`extend`](crate::Lease::extend) are refused with
    ///   [`Error::Cancelled`] and write nothing (the worker's effect is not applied; an
    ///   `ack_with` closure does not run). The worker can find out while it runs:
    ///   [`Lease::is_cancelled`](crate::Lease::is_cancelled) is a cheap read, and its
    ///   heartbeat's next extend fails with `Cancelled` (a
    ///   [`WorkerPool`](crate::worker::WorkerPool) then stops that handler's heartbeats).
    ///   leaseq cannot stop the worker's code: as in River, the work in flight runs to its
    ///   end, and only its outcome is refused.
    ///
    /// The job lets go of its dedup key and idempotency key at once (a new enqueue with the
    /// key makes a new job; a running [`dedup_window`](crate::EnqueueOptions::dedup_window)
    /// still holds its key until it ends). It is kept as [`JobState::Cancelled`] with its
    /// reason in a queue that keeps a history ([`Queue::set_history`]), where it counts
    /// toward the bounds, and in any queue until the deadline of the lease it fenced (so
    /// that lease's calls learn why); otherwise it is deleted. [`Queue::retry`] runs a
    /// cancelled job again while its row is kept: to undo cancels, keep a history.
    ///
    /// # Errors
    /// `JobNotFound` (never enqueued, or gone); `InvalidState` if it is already completed or
    /// cancelled; `Corrupted` if its row is damaged; `Reentrant`; `CommitFailed` or `Storage`.
    /// Nothing is written on an error.
    pub fn cancel(&self, id: JobId, reason: &str) -> Result<JobState> {
        let now_ms = self.now_ms();
        let reason = store::truncate_reason(reason);
        self.run(&mut |ctx| store::cancel(ctx, self.config.tables, id.0, &reason, now_ms))
    }

    /// Runs a dead, completed or cancelled job again, as River's `JobRetry` and BullMQ's
    /// `job.retry()`: back to ready now, at the back of its priority, with its attempts reset
    /// (a new series of `max_attempts`); its error history stays. A completed or cancelled job
    /// takes its keys back: it carries its idempotency key again (if an `ack_with` applied
    /// it, the next delivery's `ack_with` answers `AlreadyApplied`: the effect is not applied
    /// twice), and holds its dedup key again. For a dead job this is [`Queue::requeue_dead`].
    /// One commit.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` for a scheduled, ready or leased job; `KeyHeld` if another
    /// job took its dedup key meanwhile; `Corrupted` if its row is damaged; `Reentrant`;
    /// `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn retry(&self, id: JobId) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::retry(ctx, self.config.tables, id.0, now_ms))
    }

    /// Runs a scheduled job now, as BullMQ's `job.promote()`: ready at once, at the back of
    /// its priority; its attempts, keys and options stay. One commit.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` if it is not scheduled (a leased job is changed through
    /// its lease; a ready job is already due); `Corrupted` if its row is damaged; `Reentrant`;
    /// `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn promote(&self, id: JobId) -> Result<()> {
        self.update(id, store::Change::Promote)
    }

    /// Moves the due time of a ready or scheduled job to `delay` from now (whole
    /// milliseconds, at most [`DELAY_MAX`](crate::DELAY_MAX); zero: ready now), as BullMQ's
    /// `job.changeDelay()`. A ready job given a delay waits again; a ready job given zero keeps
    /// its place in line; a scheduled one made ready goes to the back of its priority. One
    /// commit.
    ///
    /// # Errors
    /// `InvalidOption` for a delay above `DELAY_MAX` or a due time that overflows;
    /// `JobNotFound`; `InvalidState` for a leased, dead or ended job (a dead job runs again
    /// with [`Queue::retry`]); `Corrupted`; `Reentrant`; `CommitFailed` or `Storage`. Nothing
    /// is written on an error.
    pub fn reschedule(&self, id: JobId, delay: Duration) -> Result<()> {
        if delay > crate::limits::DELAY_MAX {
            return Err(Error::invalid_option("delay", "above DELAY_MAX"));
        }
        self.update(id, store::Change::DueIn(crate::clock::duration_ms(delay)))
    }

    /// Changes the priority of a ready, scheduled or dead job (lower is served first), as
    /// BullMQ's `job.changePriority()`. A ready job keeps its place among the jobs of its new
    /// priority by when it became ready. One commit.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` for a leased or ended job; `Corrupted`; `Reentrant`;
    /// `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn set_priority(&self, id: JobId, priority: i32) -> Result<()> {
        self.update(id, store::Change::Priority(priority))
    }

    /// Replaces the payload of a ready, scheduled or dead job, as BullMQ's `job.updateData()`:
    /// its place, attempts, keys and options stay. The new payload is raw bytes (a typed
    /// payload's recorded encoding goes; [`Lease::decode`](crate::Lease::decode) then uses the
    /// handle's). One commit.
    ///
    /// # Errors
    /// `PayloadTooLarge` above [`Builder::payload_bytes_max`]; `JobNotFound`; `InvalidState`
    /// for a leased or ended job (a leased job's payload is what its worker is running);
    /// `Corrupted`; `Reentrant`; `CommitFailed` or `Storage`. Nothing is written on an error.
    pub fn update_payload(&self, id: JobId, payload: &[u8]) -> Result<()> {
        if payload.len() > self.config.payload_bytes_max {
            return Err(Error::PayloadTooLarge {
                size_bytes: payload.len(),
                limit_bytes: self.config.payload_bytes_max,
            });
        }
        self.update(id, store::Change::Payload(payload))
    }

    fn update(&self, id: JobId, change: store::Change<'_>) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::update(ctx, self.config.tables, id.0, change, now_ms))
    }

    /// Releases a dedup key by hand, as BullMQ's `removeDeduplicationKey`: the next enqueue
    /// with it makes a new job. The job that held it goes on but no longer holds it (its
    /// [`JobInfo::dedup_key`] is `None` from then on, and its dedup window ends). Returns the
    /// job the key named (possibly gone, for a window), or `None` if nothing held it. One
    /// commit when a key was held.
    ///
    /// # Errors
    /// `KeyTooLong` above [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX), `InvalidOption` for an
    /// empty key (nothing written); `Reentrant`; `CommitFailed` or `Storage`.
    pub fn release_dedup_key(&self, key: impl AsRef<[u8]>) -> Result<Option<JobId>> {
        let key = key.as_ref().to_vec();
        store::check_key("dedup_key", Some(&key))?;
        self.run(&mut |ctx| store::release_key(ctx, self.config.tables, &key).map(Ok))
            .map(|holder| holder.map(JobId))
    }

    /// Whether the delivery of job `id` under `token` was cancelled (a read, for
    /// [`Lease::is_cancelled`]): `true` if the job is cancelled, `false` while that delivery
    /// is current, `LeaseLost` once it is neither (the job was retried, redelivered, ended or
    /// its cancelled row went).
    pub(crate) fn is_delivery_cancelled(&self, id: JobId, token: u64) -> Result<bool> {
        match self.job(id)? {
            Some(j) if j.state == JobState::Cancelled => Ok(true),
            Some(j) if j.lease_token == Some(token) => Ok(false),
            _ => Err(Error::LeaseLost { job_id: id, token }),
        }
    }

    /// `Err(Closed)` once the file was closed to new deliveries (a close, or a shutdown
    /// under way).
    pub(crate) fn check_delivering(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// `Err(Closed)` once the file was closed to new work.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// A snapshot of one job, or `None` if no job has this id (never enqueued, or acked).
    ///
    /// # Errors
    /// `Corrupted` if its record does not decode; `Storage`.
    pub fn job(&self, id: JobId) -> Result<Option<JobInfo>> {
        catch_engine_panic(|| {
            store::job(&self.inner.db.get().begin_read()?, self.config.tables, id.0)
        })
    }

    /// Counts of jobs per state in this handle's queue, read from one snapshot.
    ///
    /// # Errors
    /// `Storage`.
    pub fn stats(&self) -> Result<Stats> {
        catch_engine_panic(|| store::stats(&self.inner.db.get().begin_read()?, self.config.tables))
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
    /// in the order they will be dequeued (those waiting behind their ordered group's head
    /// last, group by group, each in its group's order), scheduled by due time, leased by
    /// deadline, dead by id. Read from one snapshot; a row that fails its checks is skipped (`check` reports
    /// it). With [`JobInfo::last_error`] and [`JobInfo::died_ms`], the dead-letter view;
    /// [`Queue::payload`] reads a job's payload.
    ///
    /// # Errors
    /// `InvalidOption` for `limit` of 0 or above `BATCH_MAX`, or a cursor of another state;
    /// `Storage`.
    pub fn jobs(&self, state: JobState, after: Option<JobCursor>, limit: usize) -> Result<JobPage> {
        check_page(state, after, limit)?;
        let (jobs, last) = catch_engine_panic(|| {
            store::list(
                &self.inner.db.get().begin_read()?,
                self.config.tables,
                state,
                after.map(|c| c.key),
                limit,
            )
        })?;
        Ok(page(state, jobs, last))
    }

    /// Up to `limit` dead jobs (1 to [`BATCH_MAX`](crate::BATCH_MAX)), the most recently
    /// dead first: the dead-letter view of a dashboard, as BullMQ's failed list. Read from one
    /// snapshot by the dead jobs' time index ([`JobInfo::died_ms`]); a row that fails its
    /// checks is skipped. [`Queue::jobs`] lists them by id, with paging.
    ///
    /// # Errors
    /// `InvalidOption` for `limit` of 0 or above `BATCH_MAX`; `Storage`.
    pub fn latest_dead(&self, limit: usize) -> Result<Vec<JobInfo>> {
        if limit == 0 || limit > crate::limits::BATCH_MAX {
            return Err(batch_too_large("limit"));
        }
        catch_engine_panic(|| {
            store::latest_dead(
                &self.inner.db.get().begin_read()?,
                self.config.tables,
                limit,
            )
        })
    }

    /// The payload of job `id` as enqueued, or `None` if no job has this id.
    ///
    /// # Errors
    /// `Corrupted` if its row is damaged or quarantined; `Storage`.
    pub fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        catch_engine_panic(|| {
            store::payload(&self.inner.db.get().begin_read()?, self.config.tables, id.0)
        })
    }

    /// Moves every dead job back to ready with its attempts reset, as
    /// [`Queue::requeue_dead`] for each, in commits of up to [`BATCH_MAX`](crate::BATCH_MAX)
    /// jobs; returns how many were requeued. Each job moves once: requeueing twice never
    /// makes two jobs. Jobs that die while it runs may be requeued too.
    ///
    /// # Errors
    /// `Reentrant`; `CommitFailed` or `Storage` (the commits before it stay).
    pub fn requeue_dead_all(&self) -> Result<u64> {
        self.each_in_state(JobState::Dead, store::BulkAction::Requeue)
    }

    /// Deletes every job in `state` (dead, scheduled or ready; never leased: a leased job is
    /// ended through its lease), releasing their dedup keys (a running
    /// [`dedup_window`](crate::EnqueueOptions::dedup_window) ends with its job), in commits of
    /// up to
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
        self.each_in_state(state, store::BulkAction::Purge)
    }

    /// Runs `action` over the jobs in `state`, a batch per commit, until none is left or as
    /// many batches ran as there were jobs at the start (so jobs arriving meanwhile cannot
    /// keep it going).
    fn each_in_state(&self, state: JobState, action: store::BulkAction) -> Result<u64> {
        let stats = self.stats()?;
        let at_start = match state {
            JobState::Scheduled => stats.scheduled,
            JobState::Ready => stats.ready,
            JobState::Leased => stats.leased,
            JobState::Dead => stats.dead,
            JobState::Completed => stats.completed,
            JobState::Cancelled => stats.cancelled,
        };
        let batches = at_start.div_ceil(crate::limits::BATCH_MAX as u64) + 1;
        let mut total = 0;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (n, more) = self.run(&mut |ctx| {
                store::bulk_by_state(
                    ctx,
                    self.config.tables,
                    state,
                    action,
                    now_ms,
                    crate::limits::BATCH_MAX,
                )
                .map(Ok)
            })?;
            total += n;
            if !more {
                break;
            }
        }
        Ok(total)
    }

    /// Checks every invariant of the file, in every queue of it (the registry of named queues:
    /// one number per queue, each registered queue's tables there, no queue tables of an
    /// unregistered number; each job in exactly one state; every index and the
    /// jobs table agree both ways; dedup entries name their job or a running window, and the
    /// windows agree with their expiry index; applied markers (caller keys only) agree with
    /// their time index; the carriers of idempotency keys are exactly the live jobs with one;
    /// quarantined rows; counters ahead of every id and token) and returns the violations
    /// found, at most 1000. Empty means consistent.
    ///
    /// It reads every table of the file in read transactions (it never blocks writers):
    /// meant for tests and for a look after a crash or a disk problem, from code or from the
    /// command line with `leaseq check FILE`. It repairs nothing: a damaged job row is
    /// quarantined by the next dequeue that meets it, and deleted with [`Queue::remove`].
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` if redb cannot read the tables or the registry of named
    /// queues is damaged.
    pub fn check(&self) -> Result<Vec<Violation>> {
        catch_engine_panic(|| store::check_file(&self.inner.db.get().begin_read()?))
    }

    /// Moves a dead job back to ready with its attempts reset to 0, as a fresh job at the
    /// back of its priority.
    ///
    /// # Errors
    /// `JobNotFound`; `InvalidState` if the job is not dead; `CommitFailed` or `Storage`.
    pub fn requeue_dead(&self, id: JobId) -> Result<()> {
        let now_ms = self.now_ms();
        self.run(&mut |ctx| store::requeue_dead(ctx, self.config.tables, id.0, now_ms))
    }

    /// Deletes a job that is not leased (scheduled, ready, dead, completed or cancelled) and
    /// releases its dedup key
    /// (ending a running [`dedup_window`](crate::EnqueueOptions::dedup_window) too), as
    /// BullMQ's `Job.remove`: for dead jobs that will not be retried, or work that is no
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
        self.run(&mut |ctx| store::remove(ctx, self.config.tables, id.0, now_ms))
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
        catch_engine_panic(|| {
            store::is_applied(
                &self.inner.db.get().begin_read()?,
                self.config.tables,
                idempotency_key.as_ref(),
            )
        })
    }

    /// The file's random id: 64 bits (never 0), drawn and stored in the file by the first call
    /// (one commit then), the same for every queue of the file and across reopens. Relays
    /// make message ids unique across files with it (`lq:{file_id:016x}:{job id}`), since job
    /// ids are unique only within a file. A copy of the file carries the same id.
    ///
    /// # Errors
    /// `Closed` after [`Queue::close`] for a file that has no id yet; `CommitFailed`,
    /// `Storage`, `Reentrant`.
    pub fn file_id(&self) -> Result<u64> {
        if let Some(id) = catch_engine_panic(|| store::file_id(&self.inner.db.get().begin_read()?))?
        {
            return Ok(id);
        }
        self.check_open()?;
        self.run(&mut |ctx| store::make_file_id(ctx).map(Ok))
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
        if max == 0 || max > crate::limits::BATCH_MAX {
            return Err(batch_too_large("max"));
        }
        catch_engine_panic(|| {
            store::quarantined(
                &self.inner.db.get().begin_read()?,
                self.config.tables,
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
        catch_engine_panic(|| {
            store::quarantined_record(&self.inner.db.get().begin_read()?, self.config.tables, id.0)
        })
    }

    /// How this handle's commits were shared: groups committed and operations they answered.
    pub fn commit_stats(&self) -> crate::commit::CommitStats {
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
    /// [`BATCH_MAX`](crate::BATCH_MAX), deletes the completed and cancelled jobs past the
    /// queue's history ([`Queue::set_history`]; first, so a marker only such a job carried goes
    /// in the same call), and reports what it removed. (A window that ended
    /// already lets a new enqueue take its key; this only cleans up.) (`ack_with` already
    /// removes a few with every marker it writes; this finishes the job, for example before
    /// [`Queue::compact`].) Never removes a marker whose key a job carries (a live one, or one kept in the history,
    /// which a retry may run again): its retention
    /// starts again instead.
    ///
    /// # Errors
    /// `Reentrant`; `CommitFailed` or `Storage` (the commits before it stay).
    pub fn prune(&self) -> Result<Pruned> {
        let config = self.config;
        let mut out = Pruned::default();
        // First the completed and cancelled jobs past the history: a marker only such a job
        // carried can then go in this same call.
        let s = self.stats()?;
        let batches = (s.completed + s.cancelled).div_ceil(crate::limits::BATCH_MAX as u64) + 1;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (deleted, more) = self.run(&mut |ctx| {
                store::prune_history_jobs(ctx, config.tables, now_ms, crate::limits::BATCH_MAX)
                    .map(Ok)
            })?;
            out.history += deleted;
            if !more {
                break;
            }
        }
        let batches = self
            .stats()?
            .applied
            .div_ceil(crate::limits::BATCH_MAX as u64)
            + 1;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (removed, more) = self.run(&mut |ctx| {
                store::prune(ctx, &config, now_ms, crate::limits::BATCH_MAX).map(Ok)
            })?;
            out.applied += removed;
            if !more {
                break;
            }
        }
        // Dead jobs past their retention.
        let batches = self.stats()?.dead.div_ceil(crate::limits::BATCH_MAX as u64) + 1;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (deleted, more) = self.run(&mut |ctx| {
                store::prune_dead_jobs(ctx, &config, now_ms, crate::limits::BATCH_MAX).map(Ok)
            })?;
            out.dead += deleted;
            if !more {
                break;
            }
        }
        // Dedup windows that ended: as many batches as there are keys at most.
        let batches = self
            .stats()?
            .dedup_keys
            .div_ceil(crate::limits::BATCH_MAX as u64)
            + 1;
        for _ in 0..batches {
            let now_ms = self.now_ms();
            let (released, more) = self.run(&mut |ctx| {
                store::prune_dedup_windows(
                    ctx,
                    self.config.tables,
                    now_ms,
                    crate::limits::BATCH_MAX,
                )
                .map(Ok)
            })?;
            out.dedup_windows += released;
            if !more {
                break;
            }
        }
        tracing::info!(
            queue = self.config.tables.queue_number,
            applied = out.applied,
            dedup_windows = out.dedup_windows,
            dead = out.dead,
            history = out.history,
            "leaseq: pruned"
        );
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
        let _span = tracing::info_span!("leaseq.compact").entered();
        let started = std::time::Instant::now();
        match catch_engine_panic(|| {
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
            Ok(compacted) => {
                tracing::info!(
                    compacted,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "leaseq: compacted"
                );
                Ok(compacted)
            }
            Err(e @ Error::Busy { .. }) => Err(e),
            Err(e) => {
                tracing::error!(error = %e, "leaseq: compaction failed");
                // redb refuses writes after a failed write; say so on every later call.
                inner.committer.poison(format!("compaction failed: {e}"));
                Err(e)
            }
        }
    }

    /// Makes every earlier commit durable (one `Immediate` commit), and writes the
    /// [metrics](Queue::metrics) not written yet. Needed only with
    /// [`Durability::None`](crate::Durability::None), or for metrics a reader must see now.
    ///
    /// # Errors
    /// `Reentrant` from inside an `ack_with` closure; `CommitFailed` when this commit failed
    /// (the handle then refuses every later write, as after any failed commit) or an earlier
    /// one did; `Storage` for other storage errors.
    pub fn flush(&self) -> Result<()> {
        flush_file(&self.inner)
    }
}

/// One `Immediate` commit: every earlier commit of the file durable, with the metrics not
/// written yet.
pub(crate) fn flush_file(file: &OpenFile) -> Result<()> {
    file.flush()
}

/// What [`Queue::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileShutdown {
    /// Whether the file was released: every handle was gone within the grace, the last
    /// commits were made durable and the database closed. A reopen (this process or
    /// another) succeeds at once and reports no repair.
    pub released: bool,
    /// Handles of the file (queue handles, leases not yet ended, pools' workers, relays)
    /// still alive at the end of the grace; 0 when released. The file closes when the last
    /// is dropped.
    pub handles_left: usize,
    /// How long the shutdown took.
    pub elapsed: Duration,
}

/// What an `ack_with` does after its acks, in the same commit ([`Queue::ack_with_keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckThen {
    /// Nothing: [`Lease::ack_with`], [`Queue::ack_with_batch`], [`Queue::ack_with_all`].
    Stop,
    /// Leases the next job: [`Lease::ack_with_and_next`].
    LeaseNext,
}
