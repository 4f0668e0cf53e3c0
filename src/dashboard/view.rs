//! What a page reads and what an action changes: every page reads a [`Reader`] (the app's
//! own queue's, [`Queue::reader`], or one opened on a file per request); an action is an
//! [`Action`] carried out with the app's [`Queue`], through the control channel of the app
//! that has the file open, or on the file opened for that action.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use crate::control::api::{Access, Held};
use crate::control::{Action, Client};
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
    /// file.
    App(Held),
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
            Target::App(held) => held.path(),
            Target::File { path, .. } => Some(path.clone()),
        }
    }

    /// The path of a file target (`None` for the app's own handle).
    pub(crate) fn file_path(&self) -> Option<&std::path::Path> {
        match self {
            Target::App(_) => None,
            Target::File { path, .. } => Some(path),
        }
    }

    /// Drops the app's handle if the app closed the file (called at every request and by
    /// the serving threads while idle).
    pub(crate) fn release_if_closed(&self) {
        if let Target::App(held) = self {
            held.release_if_closed();
        }
    }

    /// The handle of the default queue (`name` of `None`) or of a named one.
    ///
    /// # Errors
    /// `QueueNotFound` for a name the file does not have; `Closed` once the app closed its
    /// file; a file target's open errors ([`Reader::open`]).
    pub(crate) fn view(&self, name: Option<&str>) -> Result<Reader> {
        let reader = match self {
            Target::App(held) => held.queue()?.reader(),
            Target::File { path, verified, .. } => {
                let verify = !verified.load(Ordering::Relaxed);
                let reader = Queue::builder().check_integrity(verify).open_reader(path)?;
                verified.store(true, Ordering::Relaxed);
                reader
            }
        };
        queue_of(&reader, name)
    }

    /// Carries `action` out: with the app's queue; for a file, through the control channel
    /// of the app that has it open ([`Client`]), or, with no app answering there, on the
    /// file opened for writing for this one action (and closed after it).
    ///
    /// # Errors
    /// Those of `action`; `Closed` once the app closed its file; for a file, the channel's
    /// errors ([`Client::act`]), and without a channel `AlreadyOpen` while another process
    /// has it open and the errors of [`Queue::open`].
    pub(crate) fn act(&self, action: &Action) -> Result<Value> {
        match self {
            Target::App(held) => held.act(action),
            Target::File { path, .. } => {
                if !path.exists() {
                    return Err(Error::Io(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{} is gone", path.display()),
                    )));
                }
                match Client::for_file(path) {
                    Ok(Some(client)) => match client.act(action) {
                        // A control file left by an app that was killed: the file is free.
                        Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                        answered => return answered,
                    },
                    Ok(None) => {}
                    // A control file this user may not read, or not one: the file itself,
                    // and that error if it is held.
                    Err(e) => {
                        return match Queue::open(path) {
                            Ok(queue) => action.apply(&queue),
                            Err(Error::AlreadyOpen { .. } | Error::HeldExclusively { .. }) => {
                                Err(e)
                            }
                            Err(other) => Err(other),
                        };
                    }
                }
                action.apply(&Queue::open(path)?)
            }
        }
    }
}

impl Target {
    /// Carries each of `actions` out, one commit each, as [`Target::act`] would one by one,
    /// but on a file through one channel client or one open of the file for them all.
    /// Stops at the first error that is not a refusal (a storage failure, the file gone).
    pub(crate) fn act_each(&self, actions: &[Action]) -> Vec<Result<Value>> {
        let Target::File { path, .. } = self else {
            return actions.iter().map(|a| self.act(a)).collect();
        };
        let refused =
            |r: &Result<Value>| matches!(r, Err(e) if crate::control::api::status_of(e) < 500);
        if let Ok(Some(client)) = Client::for_file(path) {
            let mut out = Vec::with_capacity(actions.len());
            for (i, action) in actions.iter().enumerate() {
                let r = client.act(action);
                if i == 0
                    && matches!(&r, Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused)
                {
                    // Nobody answers there: the file itself, below.
                    out.clear();
                    break;
                }
                let stop = r.is_err() && !refused(&r);
                out.push(r);
                if stop {
                    return out;
                }
            }
            if out.len() == actions.len() {
                return out;
            }
        }
        match Queue::open(path) {
            Ok(queue) => {
                let mut out = Vec::with_capacity(actions.len());
                for action in actions {
                    let r = action.apply(&queue);
                    let stop = r.is_err() && !refused(&r);
                    out.push(r);
                    if stop {
                        break;
                    }
                }
                out
            }
            Err(e) => vec![Err(e)],
        }
    }
}

impl Access for Target {
    fn reader(&self) -> Result<Reader> {
        self.view(None)
    }

    fn act(&self, action: &Action) -> Result<Value> {
        Target::act(self, action)
    }
}
