//! What a page reads and what an action changes: every page reads a [`Reader`] (the app's
//! own queue's, [`Queue::reader`], or one opened on a file per request); an action writes
//! with the app's [`Queue`], or one opened on the file for that action.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use crate::{Error, Queue, Reader, Result};

/// The reader of queue `name` (`None`: the default queue) on `reader`'s open: one page reads
/// all its queues from one open of the file.
///
/// # Errors
/// `QueueNotFound` for a name the file does not have.
pub(crate) fn queue_of(reader: &Reader, name: Option<&str>) -> Result<Reader> {
    match name {
        Some(name) => reader.existing(name),
        None => Ok(reader.default_queue()),
    }
}

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
    pub(crate) fn view(&self, name: Option<&str>) -> Result<Reader> {
        let reader = match self {
            Target::App(lock) => Target::app_queue(lock)?.reader(),
            Target::File { path, verified, .. } => {
                let verify = !verified.load(Ordering::Relaxed);
                let reader = Queue::builder().check_integrity(verify).open_reader(path)?;
                verified.store(true, Ordering::Relaxed);
                reader
            }
        };
        queue_of(&reader, name)
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
