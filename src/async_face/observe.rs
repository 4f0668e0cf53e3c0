//! The async forms of the read calls, and [`AsyncQueue::read`] for the app's own tables.
//!
//! Each read runs on a helper thread, as the calls that commit do: a read transaction is
//! short, but it reads pages from the file (a cold cache, a slow disk), and some reads are
//! long (`check` reads the whole file, `payload` up to the payload cap), so none of them
//! runs on a runtime thread. A read commits nothing and blocks no writer; a dropped read
//! future's read still runs to its end on its helper, its answer unread.

use super::AsyncQueue;
use crate::error::{BoxError, Error, Result, catch_engine_panic};
use crate::job::{History, JobCursor, JobId, JobInfo, JobPage, JobState, Quarantined};
use crate::job::{Stats, Violation};
use crate::metrics::MinuteCounts;
use crate::queue_limit::QueueLimit;
use crate::rate_limit::RateLimit;
use crate::schedule::ScheduleInfo;

impl AsyncQueue {
    /// Runs `f` over a read transaction of the queue's file on a helper thread, and returns
    /// its value: the async way to read the app's own tables (those it writes with
    /// [`AsyncQueue::write`] or an `ack_with` effect), where blocking code would use
    /// [`Queue::database`](crate::Queue::database)`.begin_read()`. The transaction sees the
    /// latest commit; it never blocks writers, and writers never block it. Keep `f` short:
    /// redb cannot reuse the pages a live read transaction still sees, and `f` holds a
    /// helper thread ([`ASYNC_THREADS_MAX`](crate::ASYNC_THREADS_MAX) are shared by the
    /// process). `f` cannot await (the transaction never spans an await). The tables named
    /// `leaseq_*` are leaseq's: read them through this face's calls (`stats`, `jobs`, ...),
    /// which know their format. The shape is tokio-rusqlite's `Connection::call(|conn| ..)`:
    /// a closure over the blocking handle, run on a thread of the library's.
    ///
    /// ```
    /// use leaseq::redb::{ReadableTable, TableDefinition};
    /// use leaseq::{EnqueueOptions, Queue};
    ///
    /// const NOTES: TableDefinition<&str, &str> = TableDefinition::new("notes");
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let queue = Queue::open(dir.path().join("app.leaseq"))?.to_async();
    /// queue
    ///     .write(|tx| {
    ///         tx.open_table(NOTES)?.insert("note-1", "buy milk")?;
    ///         tx.enqueue(b"note-1", EnqueueOptions::default())?;
    ///         Ok(())
    ///     })
    ///     .await?;
    /// let text = queue
    ///     .read(|rtx| {
    ///         let notes = rtx.open_table(NOTES)?;
    ///         Ok(notes.get("note-1")?.map(|v| v.value().to_string()))
    ///     })
    ///     .await?;
    /// assert_eq!(text.as_deref(), Some("buy milk"));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `Effect` with `f`'s error, or with `closure panicked: ` and its message if it
    /// panicked; `Storage` (or `Io`) when redb fails to begin the transaction, or when `f`
    /// passed on a read that failed on the disk (redb's `StorageError::Io` or `PreviousIo`,
    /// bare or in a `TableError`, as [`Queue::write`](crate::Queue::write) reports them);
    /// `Reentrant` from inside a `write` or `ack_with` closure.
    pub async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> std::result::Result<T, BoxError> + Send + 'static,
    {
        self.on_helper(move |q| {
            let rtx = catch_engine_panic(|| Ok(redb::ReadableDatabase::begin_read(q.database())?))?;
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&rtx)))
                .unwrap_or_else(|panic| {
                    Err(
                        format!("closure panicked: {}", crate::error::panic_message(&*panic))
                            .into(),
                    )
                });
            // Ended on the helper, under the guard, as every read of the engine.
            catch_engine_panic(|| {
                drop(rtx);
                Ok(())
            })?;
            ran.map_err(|e| Error::Effect(e).surfaced_in_write())
        })
        .await
    }

    /// The async form of [`Queue::job`](crate::Queue::job): a snapshot of one job, or
    /// `None`; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::job`](crate::Queue::job).
    pub async fn job(&self, id: JobId) -> Result<Option<JobInfo>> {
        self.on_helper(move |q| q.job(id)).await
    }

    /// The async form of [`Queue::stats`](crate::Queue::stats): counts per state, from one
    /// snapshot read on a helper.
    ///
    /// # Errors
    /// As [`Queue::stats`](crate::Queue::stats).
    pub async fn stats(&self) -> Result<Stats> {
        self.on_helper(|q| q.stats()).await
    }

    /// The async form of [`Queue::len`](crate::Queue::len): jobs still to be done
    /// (scheduled, ready or leased); a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::len`](crate::Queue::len).
    pub async fn len(&self) -> Result<u64> {
        self.on_helper(|q| q.len()).await
    }

    /// The async form of [`Queue::is_empty`](crate::Queue::is_empty): whether no job is left
    /// to do; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::is_empty`](crate::Queue::is_empty).
    pub async fn is_empty(&self) -> Result<bool> {
        self.on_helper(|q| q.is_empty()).await
    }

    /// The async form of [`Queue::jobs`](crate::Queue::jobs): up to `limit` jobs in `state`
    /// after `after`; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::jobs`](crate::Queue::jobs).
    pub async fn jobs(
        &self,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
    ) -> Result<JobPage> {
        self.on_helper(move |q| q.jobs(state, after, limit)).await
    }

    /// The async form of [`Queue::jobs_before`](crate::Queue::jobs_before): up to `limit`
    /// jobs in `state` before `before`, in the reverse order; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::jobs_before`](crate::Queue::jobs_before).
    pub async fn jobs_before(
        &self,
        state: JobState,
        before: Option<JobCursor>,
        limit: usize,
    ) -> Result<JobPage> {
        self.on_helper(move |q| q.jobs_before(state, before, limit))
            .await
    }

    /// The async form of [`Queue::latest_dead`](crate::Queue::latest_dead): up to `limit`
    /// dead jobs, the most recently dead first; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::latest_dead`](crate::Queue::latest_dead).
    pub async fn latest_dead(&self, limit: usize) -> Result<Vec<JobInfo>> {
        self.on_helper(move |q| q.latest_dead(limit)).await
    }

    /// The async form of [`Queue::payload`](crate::Queue::payload): job `id`'s payload
    /// bytes, or `None`; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::payload`](crate::Queue::payload).
    pub async fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.on_helper(move |q| q.payload(id)).await
    }

    /// The async form of [`Queue::check`](crate::Queue::check): the violations found (empty:
    /// consistent); it reads the whole file, on a helper.
    ///
    /// # Errors
    /// As [`Queue::check`](crate::Queue::check).
    pub async fn check(&self) -> Result<Vec<Violation>> {
        self.on_helper(|q| q.check()).await
    }

    /// The async form of [`Queue::is_applied`](crate::Queue::is_applied) (`idempotency_key`
    /// copied); a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::is_applied`](crate::Queue::is_applied).
    pub async fn is_applied(&self, idempotency_key: impl AsRef<[u8]>) -> Result<bool> {
        let key = idempotency_key.as_ref().to_vec();
        self.on_helper(move |q| q.is_applied(&key)).await
    }

    /// The async form of [`Queue::file_id`](crate::Queue::file_id): the file's random 64-bit
    /// id; a read on a helper (and the first draw's commit).
    ///
    /// # Errors
    /// As [`Queue::file_id`](crate::Queue::file_id).
    pub async fn file_id(&self) -> Result<u64> {
        self.on_helper(|q| q.file_id()).await
    }

    /// The async form of [`Queue::quarantined`](crate::Queue::quarantined): up to `max`
    /// quarantined rows after `after`; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::quarantined`](crate::Queue::quarantined).
    pub async fn quarantined(&self, after: Option<JobId>, max: usize) -> Result<Vec<Quarantined>> {
        self.on_helper(move |q| q.quarantined(after, max)).await
    }

    /// The async form of [`Queue::quarantined_record`](crate::Queue::quarantined_record): a
    /// quarantined row's bytes as found, or `None`; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::quarantined_record`](crate::Queue::quarantined_record).
    pub async fn quarantined_record(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        self.on_helper(move |q| q.quarantined_record(id)).await
    }

    /// The async form of [`Queue::metrics`](crate::Queue::metrics): the queue's counts per
    /// minute since `since_ms` (Unix ms), oldest first; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::metrics`](crate::Queue::metrics).
    pub async fn metrics(&self, since_ms: u64) -> Result<Vec<MinuteCounts>> {
        self.on_helper(move |q| q.metrics(since_ms)).await
    }

    /// The async form of [`Queue::queue_names`](crate::Queue::queue_names): the file's named
    /// queues, sorted; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::queue_names`](crate::Queue::queue_names).
    pub async fn queue_names(&self) -> Result<Vec<String>> {
        self.on_helper(|q| q.queue_names()).await
    }

    /// The async form of [`Queue::history`](crate::Queue::history): what the queue keeps of
    /// its completed jobs; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::history`](crate::Queue::history).
    pub async fn history(&self) -> Result<History> {
        self.on_helper(|q| q.history()).await
    }

    /// The async form of [`Queue::rate_limit`](crate::Queue::rate_limit): the queue's rate
    /// limit, if any; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::rate_limit`](crate::Queue::rate_limit).
    pub async fn rate_limit(&self) -> Result<Option<RateLimit>> {
        self.on_helper(|q| q.rate_limit()).await
    }

    /// The async form of [`Queue::limit`](crate::Queue::limit): the queue's size limit, if
    /// any; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::limit`](crate::Queue::limit).
    pub async fn limit(&self) -> Result<Option<QueueLimit>> {
        self.on_helper(|q| q.limit()).await
    }

    /// The async form of [`Queue::schedules`](crate::Queue::schedules): the queue's
    /// schedules by name; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::schedules`](crate::Queue::schedules).
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        self.on_helper(|q| q.schedules()).await
    }

    /// The async form of [`Queue::schedule`](crate::Queue::schedule): schedule `name`, if it
    /// exists; a read on a helper.
    ///
    /// # Errors
    /// As [`Queue::schedule`](crate::Queue::schedule).
    pub async fn schedule(&self, name: &str) -> Result<Option<ScheduleInfo>> {
        let name = name.to_string();
        self.on_helper(move |q| q.schedule(&name)).await
    }
}
