//! Enqueueing: one job, a batch, an import, and a transaction of the caller's (`write`).

use super::Queue;
use crate::error::{Error, Result};
use crate::job::{EnqueueOptions, Enqueued};
use crate::store;
use crate::tx::Tx;

impl Queue {
    /// Enqueues a job with `payload` (at most the builder's `payload_bytes_max` bytes) and
    /// returns its id once the commit is durable. In a queue with a size limit
    /// ([`Queue::set_limit`]) that is full, the job is refused, waits for room, or makes room
    /// by dropping the oldest waiting jobs, as the limit's [`WhenFull`](crate::WhenFull) says.
    ///
    /// # Errors
    /// `PayloadTooLarge`, `KeyTooLong` or `InvalidOption` before anything is written;
    /// `QueueFull` (nothing written) when the queue's size limit has no room for it;
    /// `StorageFull` (nothing written, never waited for) while the file is within its disk
    /// reserve ([`Builder::disk_reserve`](crate::Builder::disk_reserve));
    /// `Closed` after [`Queue::close`]; `CommitFailed`, `Storage` or `Reentrant` otherwise.
    pub fn enqueue(&self, payload: &[u8], opts: EnqueueOptions) -> Result<Enqueued> {
        let mut out = self.enqueue_batch([(payload, opts)])?;
        debug_assert_eq!(out.len(), 1);
        Ok(out.remove(0))
    }

    /// Enqueues `value` encoded with the handle's [`Encoding`](crate::Encoding) (bincode
    /// unless [`Builder::encoding`](crate::Builder::encoding) or [`Queue::with_encoding`] chose another); read it back
    /// with [`Lease::decode`](crate::Lease::decode). The job records its encoding, so it decodes the same way
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
    /// A queue's size limit ([`Queue::set_limit`]) takes the batch whole or not at all.
    /// Under [`WhenFull::Block`](crate::WhenFull::Block) the call waits, trying again at
    /// least every 50 ms (each try a look that writes nothing), until the batch fits or the
    /// wait is over; the jobs' times (created, due) are those of the try that adds them.
    ///
    /// # Errors
    /// `InvalidOption` for an empty or oversized batch; `PayloadTooLarge`, `KeyTooLong` or
    /// `InvalidOption` for the first job refused (nothing is written); `QueueFull` (nothing
    /// written) when the queue's size limit has no room for the batch (after the limit's
    /// wait); `StorageFull` (nothing written, never waited for) while the file is within its
    /// disk reserve, or for a batch whose payload would take the room above the reserve
    /// ([`Builder::disk_reserve`](crate::Builder::disk_reserve)); `Closed` after
    /// [`Queue::close`]; `CommitFailed`, `Storage` or `Reentrant` otherwise.
    pub fn enqueue_batch<'p>(
        &self,
        jobs: impl IntoIterator<Item = (&'p [u8], EnqueueOptions)>,
    ) -> Result<Vec<Enqueued>> {
        self.ensure_open()?;
        let jobs: Vec<(&[u8], EnqueueOptions)> = jobs.into_iter().collect();
        let mut wait = FullWait::default();
        loop {
            let full = match self.enqueue_once(&jobs) {
                Err(full @ Error::QueueFull { .. }) => full,
                done => return done,
            };
            match wait.next(self)? {
                Some(pause) => std::thread::sleep(pause),
                None => return Err(full),
            }
            self.ensure_open()?;
        }
    }

    /// One try of [`Queue::enqueue_batch`]: `QueueFull` at once when the queue's size limit
    /// has no room (the async face waits for room between tries without a thread).
    pub(crate) fn enqueue_once(&self, jobs: &[(&[u8], EnqueueOptions)]) -> Result<Vec<Enqueued>> {
        self.ensure_open()?;
        let records = store::new_records(&self.config, self.now_ms(), jobs.iter().cloned())?;
        self.run(&mut |ctx| store::enqueue(ctx, self.config.schema, &records))
    }

    /// Checks what [`Queue::enqueue`] would refuse of `payload` and `opts` (an option out of
    /// range, a payload or key too long), writing nothing: for a caller that must refuse
    /// bad input before it does anything else (the control channel checks an enqueue before
    /// it makes the named queue it goes to). A job that passes may still meet the file's
    /// own refusals at enqueue (`Closed`, a dedup key held).
    ///
    /// # Errors
    /// `InvalidOption`, `PayloadTooLarge` or `KeyTooLong`, as [`Queue::enqueue`] would return
    /// them; `Closed`.
    pub fn validate_enqueue(&self, payload: &[u8], opts: &EnqueueOptions) -> Result<()> {
        self.ensure_open()?;
        store::new_records(&self.config, self.now_ms(), [(payload, opts.clone())]).map(drop)
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
    /// it for a dead one); `PayloadTooLarge`, `KeyTooLong`: nothing is written. `QueueFull`
    /// and `StorageFull` as [`Queue::enqueue_batch`] (never waiting). `Closed`;
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
        self.ensure_open()?;
        if jobs.is_empty() || jobs.len() > crate::limits::BATCH_MAX {
            return Err(Error::batch_too_large("jobs"));
        }
        let now_ms = self.now_ms();
        let records = jobs
            .iter()
            .map(|j| store::import_record(&self.config, now_ms, j))
            .collect::<Result<Vec<_>>>()?;
        self.run(&mut |ctx| store::enqueue_imported(ctx, self.config.schema, &records, now_ms))
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
    /// `PayloadTooLarge`, `KeyTooLong`, `InvalidOption`, `QueueFull` or `StorageFull` when
    /// `f` passed on an enqueue's refusal (as outside `write`: the message names the setting;
    /// a closure may also catch it and go on, the refused job written nothing); `JobNotFound`,
    /// `InvalidState` or `KeyHeld` when `f` passed on the refusal of a [`Tx::cancel`],
    /// [`Tx::retry`] or [`Tx::remove`] (caught, it wrote nothing); `Effect` with any other error or
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
        self.ensure_open()?;
        let (now_ms, config) = (self.now_ms(), self.config);
        self.run(&mut |ctx| store::write(ctx, &config, now_ms, &mut f).map(Ok))
            .map_err(Error::surfaced_in_write)
    }
}

/// [`Tx::enqueue_to`] sits with the handles: it takes a [`Queue`], which `tx.rs` (below the
/// handles: the engine builds a `Tx`) does not name.
impl Tx<'_> {
    /// Enqueues a job in another queue of the same file (a [`Queue::named`](crate::Queue::named)
    /// handle, or the default one) in this transaction: the next step of a pipeline, handed to
    /// that queue's workers if and only if this transaction commits. As [`Tx::enqueue`], with
    /// `queue`'s defaults.
    ///
    /// # Errors
    /// As [`Tx::enqueue`]; `InvalidOption` for a queue of another file.
    pub fn enqueue_to(
        &self,
        queue: &Queue,
        payload: &[u8],
        opts: EnqueueOptions,
    ) -> Result<Enqueued> {
        let config = queue.config();
        if config.committer_id != self.config.committer_id {
            return Err(Error::invalid_option("queue", "a queue of another file"));
        }
        let mut out = self.enqueue_batch_with(&config, [(payload, opts)])?;
        debug_assert_eq!(out.len(), 1);
        Ok(out.remove(0))
    }
}

/// The wait of an enqueue into a full queue whose limit blocks
/// ([`WhenFull::Block`](crate::queue_limit::WhenFull::Block)): the pauses between tries, from
/// 1 ms doubling to 50 ms, until the limit's wait is over.
#[derive(Default)]
pub(crate) struct FullWait {
    deadline: Option<std::time::Instant>,
    pause: std::time::Duration,
}

impl FullWait {
    /// After a try refused `QueueFull`: the pause before the next try, or `None` to give up
    /// (the limit does not block, is gone, or its wait is over). Reads the limit once.
    pub(crate) fn next(&mut self, queue: &Queue) -> Result<Option<std::time::Duration>> {
        let deadline = match self.deadline {
            Some(d) => d,
            None => match queue.limit()?.map(|l| l.when_full) {
                Some(crate::queue_limit::WhenFull::Block { wait_ms }) => {
                    self.pause = std::time::Duration::from_millis(1);
                    *self.deadline.insert(
                        std::time::Instant::now() + std::time::Duration::from_millis(wait_ms),
                    )
                }
                _ => return Ok(None),
            },
        };
        let now = std::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let pause = self.pause.min(deadline - now);
        self.pause = (self.pause * 2).min(std::time::Duration::from_millis(50));
        Ok(Some(pause))
    }
}
