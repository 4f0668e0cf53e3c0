//! The file's life through a handle: close, shutdown, flush, compact, and what the open found.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::Database;

use super::Queue;
use crate::error::catch_engine_panic;
use crate::error::{Error, Result};
use crate::file::Recovery;

impl Queue {
    /// Closes the file to new work, for every handle of it (every named queue too): blocked
    /// [`dequeue_timeout`](Queue::dequeue_timeout) and [`dequeue_until`](Queue::dequeue_until)
    /// calls wake and return `Err(Closed)`, and from then on `dequeue`, `dequeue_batch`,
    /// `dequeue_timeout`, `dequeue_until`, `enqueue`, `enqueue_value`, `enqueue_batch`,
    /// `write` and `named` return [`Error::Closed`] without writing. So consumer threads
    /// stop without polling a flag of their own (as BullMQ's `queue.close()`).
    ///
    /// What stays open, so work in flight ends cleanly: every call on a [`Lease`](crate::Lease) already
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
    /// attempt counted, as after a crash). [`FileShutdown::handles`] names them, each by the
    /// line of the app's code that made it, and an open of the file in this process meanwhile
    /// is [`Error::AlreadyOpen`] naming them too. A shutdown never loses a job: a job in
    /// flight is either ended by its worker or still leased in the file.
    ///
    /// # The order at the app's exit
    ///
    /// Two steps:
    ///
    /// 1. **Let go of the handles that do not dequeue**: stop the app's own threads and tasks
    ///    that hold a queue, a reader or a lease without dequeuing (a status view, a writer),
    ///    and drop the handles kept in structs. What dequeues needs no step: consumer loops
    ///    end on `Err(Closed)`, and the pools, [`WorkerPool`](crate::worker::WorkerPool)s and
    ///    `AsyncPool`s alike, stop by themselves: each worker ends the job in hand (its
    ///    ack and writes commit), then exits and lets go of its handle.
    /// 2. **`shutdown(grace)` on the last handle**; in async code
    ///    `queue.into_async().shutdown(grace).await` (`AsyncQueue::shutdown`).
    ///
    /// Nothing shorter is correct: the file is released only once every other handle is
    /// gone, and a handle that never dequeues never hears of the shutdown, so only the app
    /// can let it go (before this call, which blocks until the grace ends). Nothing more is
    /// needed: this call stops the pools' workers, and their handlers get its grace to
    /// finish. A handler still running at the end of the grace keeps its worker's handle
    /// (named here by its pool's [`WorkerPool::builder`](crate::worker::WorkerPool::builder)
    /// line) and the file open; its job comes back at the next open, the attempt counted.
    /// (A pool's own `shutdown` is for stopping one pool while the app goes on; it also
    /// aborts an async handler that overruns its grace.)
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
    /// let status = queue.clone(); // a handle that never dequeues
    /// // The app is quitting: 1. let go of the handles that do not dequeue,
    /// drop(status);
    /// // 2. shut the file down from the last handle; the pool stops by itself.
    /// let report = queue.shutdown(Duration::from_secs(10));
    /// assert!(report.released, "{report:?}");
    /// for forgotten in &report.handles {
    ///     eprintln!("still open: {forgotten}"); // "queue handle ..., made at src/main.rs:7:14"
    /// }
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
        if let Err(e) = self.inner.flush() {
            tracing::warn!(error = %e, "leaseq: the flush at shutdown failed");
        }
        let handles_left = self.other_handles();
        // Named before this handle goes: a handle dropped meanwhile may still be listed (it
        // went a moment too late), one made meanwhile is not.
        let handles = if handles_left > 0 {
            self.inner
                .handles
                .live(Some(&self.mark), crate::limits::HANDLES_LISTED_MAX)
        } else {
            Vec::new()
        };
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
                handles = %crate::handles::describe_here(&handles),
                "leaseq: file shut down; handles still alive keep it open"
            );
        }
        FileShutdown {
            released,
            handles_left: if released { 0 } else { handles_left.max(1) },
            handles: if released { Vec::new() } else { handles },
            elapsed: started.elapsed(),
        }
    }

    /// `Err(Closed)` once the file was closed to new work.
    pub(crate) fn ensure_open(&self) -> Result<()> {
        if self.inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        Ok(())
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
    /// [`Lease::ack_with`](crate::Lease::ack_with)). Tables named `leaseq_*` belong to leaseq.
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

    /// Gives the file's free pages back to the file system, as redb's
    /// `Database::compact`: after a queue that once held many jobs drained, the file shrinks to
    /// about the size of what it holds now. (Under steady churn the file does not grow: redb
    /// reuses freed pages; it only never shrinks by itself.) Returns whether anything was
    /// given back.
    ///
    /// It needs the queue to itself, so it takes `&mut self` and refuses while other handles
    /// ([`Clone`]s, [`Queue::reader`]s) or [`Lease`](crate::Lease)s of this queue are alive, or a transaction is open on
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
                detail: "other handles, readers or leases of this queue are alive".into(),
            });
        };
        inner.committer.ensure_not_reentrant()?;
        inner.committer.ensure_not_poisoned()?;
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
                // Compaction's own commits are durable (they hold every commit before them)
                // but record no journal position: the frames since the last checkpoint
                // replay harmlessly at the next open, a frame setting values the file
                // already holds. No checkpoint here: its commit would grow the file again.
                // The file's free pages went with the compaction: counted again.
                if let Some(reserve) = inner.committer.reserve() {
                    reserve.recount();
                }
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

    /// Makes every earlier commit durable in the queue file itself (one `Immediate` redb
    /// commit: with the journal on, a checkpoint, after which a copy of the file alone holds
    /// everything so far), and writes the [metrics](Queue::metrics) not written yet. Needed
    /// only with [`Durability::None`](crate::Durability::None), before copying the file of a
    /// running queue, or for metrics a reader must see now.
    ///
    /// # Errors
    /// `Reentrant` from inside an `ack_with` closure; `CommitFailed` when this commit failed
    /// (the handle then refuses every later write, as after any failed commit) or an earlier
    /// one did; `Storage` for other storage errors.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

/// What [`Queue::shutdown`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Which they are, when not released: each handle's kind, queue and the line of the
    /// app's code that made it (an open, a `clone`, [`Queue::named`], a dequeue's handle
    /// for a lease, [`WorkerPool::builder`](crate::worker::WorkerPool::builder) for a pool's
    /// workers), at most [`HANDLES_LISTED_MAX`](crate::HANDLES_LISTED_MAX) of them:
    /// `handles_left - handles.len()` more were not listed. Empty when released. Each
    /// prints as one line (`queue handle on queue "emails", made at src/main.rs:12:17`).
    pub handles: Vec<crate::handles::LiveHandle>,
    /// How long the shutdown took.
    pub elapsed: Duration,
}

impl FileShutdown {
    /// The report of a shutdown whose last step could not run (no helper thread for the
    /// async face's final flush): the file not released, by this handle at least.
    #[cfg(feature = "async")]
    pub(crate) fn not_released(started: Instant) -> FileShutdown {
        FileShutdown {
            released: false,
            handles_left: 1,
            handles: Vec::new(),
            elapsed: started.elapsed(),
        }
    }
}
