//! What a page reads and what an action changes: the app's own [`Queue`], or a file read with
//! a [`Reader`] opened per request and written with a [`Queue`] opened per action.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use crate::{
    Error, JobCursor, JobId, JobInfo, JobPage, JobState, MinuteCounts, Queue, Reader, Result,
    ScheduleInfo, Stats,
};

/// Where the dashboard reads and writes.
pub(crate) enum Target {
    /// The app's own queue handle (any queue of its file), let go of once the app closes the
    /// file ([`Queue::close`], [`Queue::shutdown`]): a shutdown waits for every handle, and
    /// the dashboard's must not keep it from releasing the file.
    App(RwLock<Option<Queue>>),
    /// A file, read without holding it between requests.
    File {
        path: PathBuf,
        /// Requests take turns on the file ([`Target::turn`]).
        turns: parking_lot::Mutex<()>,
        /// Whether a first open verified the file: later ones skip redb's integrity check
        /// (as `leaseq watch` does), so a page does not read the whole file again.
        verified: AtomicBool,
    },
}

/// A request's turn on a file ([`Target::turn`]), held while it is answered.
pub(crate) struct Turn<'a>(#[allow(dead_code)] parking_lot::MutexGuard<'a, ()>);

/// One request's handle on the queue it names.
pub(crate) enum View {
    Queue(Queue),
    Reader(Reader),
}

impl Target {
    /// The turn of a request on a file: one at a time, pages and actions alike (nothing for
    /// the app's own handle, whose calls need no turns). An action's writable open would be
    /// refused beside a page's reader in this process; and a page of a file left by a crash
    /// reads a repaired copy under the file's writer lock, which a second page's open would
    /// meet (`HeldExclusively`).
    pub(crate) fn turn(&self) -> Option<Turn<'_>> {
        match self {
            Target::App(_) => None,
            Target::File { turns, .. } => Some(Turn(turns.lock())),
        }
    }

    /// The file's path (`None` for an app's file without one, or once the app closed it).
    pub(crate) fn path(&self) -> Option<PathBuf> {
        match self {
            Target::App(queue) => queue.read().as_ref()?.path().map(Path::to_path_buf),
            Target::File { path, .. } => Some(path.clone()),
        }
    }

    /// The app's queue handle while the app has not closed the file; drops it once it has.
    ///
    /// # Errors
    /// `Closed` once the app closed the file.
    fn app_queue(lock: &RwLock<Option<Queue>>) -> Result<Queue> {
        if let Some(queue) = lock.read().as_ref()
            && !queue.is_closed()
        {
            return Ok(queue.clone());
        }
        Target::release_closed(lock);
        Err(Error::Closed)
    }

    /// Drops the app's handle if the app closed the file (called at every request and by
    /// the serving threads while idle).
    pub(crate) fn release_if_closed(&self) {
        if let Target::App(lock) = self {
            Target::release_closed(lock);
        }
    }

    fn release_closed(lock: &RwLock<Option<Queue>>) {
        let closed = lock.read().as_ref().is_some_and(Queue::is_closed);
        if closed {
            tracing::info!("leaseq: the dashboard lets go of the closed queue");
            *lock.write() = None;
        }
    }

    /// The handle of the default queue (`name` of `None`) or of a named one.
    ///
    /// # Errors
    /// `QueueNotFound` for a name the file does not have; a file target's open errors
    /// ([`Reader::open`]).
    pub(crate) fn view(&self, name: Option<&str>) -> Result<View> {
        let view = match self {
            Target::App(lock) => View::Queue(Target::app_queue(lock)?),
            Target::File { path, verified, .. } => {
                let verify = !verified.load(Ordering::Relaxed);
                let reader = Queue::builder().check_integrity(verify).open_reader(path)?;
                verified.store(true, Ordering::Relaxed);
                View::Reader(reader)
            }
        };
        view.queue(name)
    }

    /// Runs `action` on a handle that may write: the app's queue, or the file opened for
    /// writing for this one action (and closed after it).
    ///
    /// # Errors
    /// Those of `action`; `Closed` once the app closed its file; for a file, `AlreadyOpen`
    /// while another process has it open, and the errors of [`Queue::open`].
    pub(crate) fn write<T>(
        &self,
        name: Option<&str>,
        action: impl FnOnce(&Queue) -> Result<T>,
    ) -> Result<T> {
        let opened;
        let queue = match self {
            Target::App(lock) => {
                opened = Target::app_queue(lock)?;
                &opened
            }
            Target::File { path, .. } => {
                if !path.exists() {
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{} is gone", path.display()),
                    )));
                }
                opened = Queue::open(path)?;
                &opened
            }
        };
        match name {
            None => action(&queue.default_queue()),
            Some(name) => action(&queue.existing(name)?),
        }
    }
}

impl View {
    /// The handle of another queue of the same file (`None`: the default queue), on the
    /// same open: one page reads all its queues from one open of the file.
    ///
    /// # Errors
    /// `QueueNotFound` for a name the file does not have.
    pub(crate) fn queue(&self, name: Option<&str>) -> Result<View> {
        Ok(match (self, name) {
            (View::Queue(q), Some(name)) => View::Queue(q.existing(name)?),
            (View::Reader(r), Some(name)) => View::Reader(r.existing(name)?),
            (View::Queue(q), None) => View::Queue(q.default_queue()),
            (View::Reader(r), None) => View::Reader(r.default_queue()),
        })
    }

    /// Whether the reads follow the file's commits (false: a copy of a file left by a crash).
    pub(crate) fn is_live(&self) -> bool {
        match self {
            View::Queue(_) => true,
            View::Reader(r) => r.is_live(),
        }
    }

    pub(crate) fn queue_names(&self) -> Result<Vec<String>> {
        match self {
            View::Queue(q) => q.queue_names(),
            View::Reader(r) => r.queue_names(),
        }
    }

    pub(crate) fn stats(&self) -> Result<Stats> {
        match self {
            View::Queue(q) => q.stats(),
            View::Reader(r) => r.stats(),
        }
    }

    pub(crate) fn job(&self, id: JobId) -> Result<Option<JobInfo>> {
        match self {
            View::Queue(q) => q.job(id),
            View::Reader(r) => r.job(id),
        }
    }

    pub(crate) fn jobs(
        &self,
        state: JobState,
        after: Option<JobCursor>,
        limit: usize,
    ) -> Result<JobPage> {
        match self {
            View::Queue(q) => q.jobs(state, after, limit),
            View::Reader(r) => r.jobs(state, after, limit),
        }
    }

    pub(crate) fn latest_dead(&self, limit: usize) -> Result<Vec<JobInfo>> {
        match self {
            View::Queue(q) => q.latest_dead(limit),
            View::Reader(r) => r.latest_dead(limit),
        }
    }

    pub(crate) fn payload(&self, id: JobId) -> Result<Option<Vec<u8>>> {
        match self {
            View::Queue(q) => q.payload(id),
            View::Reader(r) => r.payload(id),
        }
    }

    pub(crate) fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        match self {
            View::Queue(q) => q.schedules(),
            View::Reader(r) => r.schedules(),
        }
    }

    pub(crate) fn metrics(&self, since_ms: u64) -> Result<Vec<MinuteCounts>> {
        match self {
            View::Queue(q) => q.metrics(since_ms),
            View::Reader(r) => r.metrics(since_ms),
        }
    }
}
