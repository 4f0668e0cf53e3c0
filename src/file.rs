//! The state every handle of one open file shares ([`OpenFile`]): the database behind a panic
//! guard, the group committer, the clock, and what the open found ([`Recovery`]).

use std::path::PathBuf;
use std::sync::Arc;

use redb::Database;

use crate::clock::Clock;
use crate::commit::{Committer, GroupTx, SealWriter};
use crate::error::{Result, catch_engine_panic};
use crate::metrics::{MetricRow, PendingMetrics, Tally};
use crate::store::{self, QueueConfig};

/// What the open found and did before returning the queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Leases found in the file at open (their holder closed the file or exited without
    /// ending them) put back to ready, each in the place its job had within its priority:
    /// before every job that became ready after it (the attempt stays counted).
    pub leases_returned: u64,
    /// Leases found in the file at open whose job had no attempts left: dead-lettered.
    pub leases_dead_lettered: u64,
    /// Whether the previous process did not close the file cleanly (it crashed or was
    /// killed), so redb recovered it at open: a full repair, or with quick-repair the
    /// allocator state its last commit saved. Always `false` for [`Builder::attach`](crate::Builder::attach) unless
    /// redb's integrity check found and repaired damage there.
    pub repaired: bool,
    /// Whether the open created a new file.
    pub created: bool,
    /// Leased job rows that failed their checks and were quarantined instead of returned
    /// (see [`Queue::quarantined`](crate::Queue::quarantined)).
    pub quarantined: u64,
    /// The format version the file was upgraded from at this open (in one transaction, before
    /// lease recovery), or `None` if it was current. See [`FORMAT_VERSION`](crate::FORMAT_VERSION).
    pub upgraded_from: Option<u64>,
    /// Schedules that came due while the file was closed and enqueued a job at this open
    /// ([`Missed::RunOnce`](crate::Missed::RunOnce); several due times of one schedule count
    /// once).
    pub schedules_fired: u64,
    /// Schedules that came due while the file was closed and enqueued nothing at this open:
    /// [`Missed::Skip`](crate::Missed::Skip), or an instance still pending.
    pub schedules_skipped: u64,
    /// What the open found in the write-ahead journal beside the file (see
    /// [`Builder::journal`](crate::Builder::journal)): frames replayed, a journal missing, or
    /// nothing to do. Replay runs before the upgrade, lease recovery and schedules.
    pub journal: crate::journal::JournalFound,
}

/// Owns the database; drops it inside `catch_unwind` so a panic in redb's drop (seen on
/// corrupted files) does not cross leaseq's API.
pub(crate) struct GuardedDb(Option<Database>);

impl GuardedDb {
    pub(crate) fn new(db: Database) -> GuardedDb {
        GuardedDb(Some(db))
    }

    pub(crate) fn get(&self) -> &Database {
        self.0.as_ref().expect("database present until drop")
    }

    pub(crate) fn get_mut(&mut self) -> &mut Database {
        self.0.as_mut().expect("database present until drop")
    }
}

impl Drop for GuardedDb {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
        }
    }
}

impl Drop for OpenFile {
    /// The close writes the metrics not written yet, and with the journal on makes the
    /// session's last checkpoint (the queue file then holds everything, alone). Best
    /// effort: a handle whose commits failed writes nothing (the next open replays).
    fn drop(&mut self) {
        let journaling = self.committer.journaling();
        if (journaling || !self.pending_metrics().is_empty())
            && self.committer.ensure_not_poisoned().is_ok()
        {
            let _ = self.checkpoint(journaling);
        }
    }
}

/// The metrics of a file's committed groups not yet written (at most a second's) and the
/// clock that dates them: the committer's [`SealWriter`], written with a group's commit at
/// most once per second, and by [`OpenFile::flush`] (a flush, shutdown, the close).
pub(crate) struct FileMetrics {
    pending: parking_lot::Mutex<PendingMetrics>,
    clock: Arc<dyn Clock>,
}

impl FileMetrics {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> FileMetrics {
        FileMetrics {
            pending: parking_lot::Mutex::default(),
            clock,
        }
    }
}

impl SealWriter for FileMetrics {
    fn write(&self, tally: Tally, tx: GroupTx<'_>) -> Result<()> {
        let rows = self.pending.lock().seal(tally, self.clock.now_ms());
        if rows.is_empty() {
            return Ok(());
        }
        store::write_metrics(tx, &rows)
    }

    fn settle(&self, landed: bool) {
        self.pending.lock().settle(landed);
    }
}

impl OpenFile {
    /// The metric rows counted by committed groups and not yet written to the file.
    pub(crate) fn pending_metrics(&self) -> Vec<MetricRow> {
        self.metrics
            .as_ref()
            .map(|m| m.pending.lock().rows().to_vec())
            .unwrap_or_default()
    }

    /// One durable commit, a checkpoint with the journal on: every earlier commit of the file
    /// durable in the queue file itself, with the metrics not written yet. They are taken
    /// out before the flush's group runs (a group's seal writing them meanwhile finds none),
    /// and go back if its commit fails.
    pub(crate) fn flush(&self) -> Result<()> {
        self.checkpoint(false)
    }

    /// [`OpenFile::flush`]; `closing`: the session's last checkpoint (the close).
    fn checkpoint(&self, closing: bool) -> Result<()> {
        self.committer.ensure_not_reentrant()?;
        self.committer.ensure_not_poisoned()?;
        let rows = self
            .metrics
            .as_ref()
            .map(|m| m.pending.lock().take())
            .unwrap_or_default();
        let flushed = catch_engine_panic(|| {
            self.committer.run(self.db.get(), &mut |ctx| {
                let group = ctx.group();
                if !rows.is_empty() {
                    store::write_metrics(group, &rows)?;
                }
                if closing {
                    group.checkpoint_closing();
                } else {
                    group.checkpoint();
                }
                Ok(Ok(()))
            })
        });
        if flushed.is_err()
            && let Some(m) = &self.metrics
        {
            m.pending.lock().put_back(&rows);
        }
        flushed
    }
}

/// What every handle of one open file shares: the database, its committer, the default
/// queue's settings, the clock, and what the open found.
pub(crate) struct OpenFile {
    // Field order matters: the committer (holding no transaction once idle) drops before the
    // database.
    pub(crate) committer: Committer,
    pub(crate) db: GuardedDb,
    /// The metrics not written yet (`None`: not counted, `Builder::metrics(false)`); the
    /// committer holds it too, as its [`SealWriter`].
    pub(crate) metrics: Option<Arc<FileMetrics>>,
    pub(crate) config: QueueConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) path: Option<PathBuf>,
    pub(crate) recovery: Recovery,
    /// Set by [`Queue::close`](crate::Queue::close), and by
    /// [`Queue::shutdown`](crate::Queue::shutdown) at the end of its grace: no new enqueue
    /// or delivery through any handle of the file.
    pub(crate) closed: std::sync::atomic::AtomicBool,
    /// Set by [`Queue::shutdown`](crate::Queue::shutdown) as it starts: no new delivery
    /// through any handle of the file; enqueues and `write` still commit (the handlers
    /// finishing their jobs may store results and enqueue follow-ups).
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// The numbers of the paused queues, as `leaseq_paused` holds them (read at open, then
    /// kept by [`Queue::pause`](crate::Queue::pause) and
    /// [`Queue::resume`](crate::Queue::resume) once their commit lands: one process owns the
    /// file, so this copy is the truth between opens).
    pub(crate) paused: parking_lot::RwLock<std::collections::BTreeSet<u32>>,
    /// Held by `pause` and `resume` from their commit to their update of `paused`, so the
    /// set follows the order of the commits (a pause and a resume racing in one group).
    pub(crate) pausing: parking_lot::Mutex<()>,
    /// Every live handle of the file: its kind, queue and maker, for a shutdown to name.
    pub(crate) handles: Arc<crate::handles::Handles>,
}
