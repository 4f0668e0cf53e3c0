//! Who holds an open file: every handle's kind, queue and the caller that made it, so a
//! shutdown that waited in vain ([`FileShutdown::handles`](crate::FileShutdown::handles))
//! and an open refused in this process ([`Error::AlreadyOpen`](crate::Error::AlreadyOpen))
//! can name them.
//!
//! Each handle holding a file (a `Queue`, a `Reader` of `Queue::reader`, a lease) carries a [`HandleMark`]: a slot in its file's [`Handles`], taken when the handle
//! is made and given back when it is dropped. A slot costs a short lock of the file's own
//! table (no global lock, no allocation once the table has grown); past
//! [`HANDLES_TRACKED_MAX`] live handles of one file the others are counted (the file's
//! `Arc`) but not named.

use std::fmt;
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::job::state::JobId;
use crate::limits::{HANDLES_LISTED_MAX, HANDLES_TRACKED_MAX, OPEN_FILES_TRACKED_MAX};

/// What a live handle of a file is, in a [`LiveHandle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandleKind {
    /// A [`Queue`](crate::Queue) or `AsyncQueue` handle: opened, cloned, named
    /// ([`Queue::named`](crate::Queue::named), [`Queue::existing`](crate::Queue::existing),
    /// [`Queue::default_queue`](crate::Queue::default_queue)), made by a `with_*` call or
    /// by `Queue::to_async`; also the handles leaseq keeps for the app: a pool's worker
    /// threads and tasks (made where [`WorkerPool::builder`](crate::WorkerPool::builder)
    /// was called), the control channel's, a relay's.
    Queue,
    /// A [`Reader`](crate::Reader) made by [`Queue::reader`](crate::Queue::reader) (its
    /// clones share it), or one a read call of the queue made for itself.
    Reader,
    /// A delivery not ended yet: a [`Lease`](crate::Lease) (or `AsyncLease`) or a
    /// [`Heartbeat`](crate::Heartbeat) of it. Made where the handle that dequeued it was made.
    Lease {
        /// The leased job.
        job: JobId,
    },
}

impl fmt::Display for HandleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleKind::Queue => f.write_str("queue handle"),
            HandleKind::Reader => f.write_str("reader"),
            HandleKind::Lease { job } => write!(f, "lease of job {}", job.0),
        }
    }
}

/// One handle of a file still alive, as [`FileShutdown::handles`](crate::FileShutdown::handles)
/// and [`Error::AlreadyOpen`](crate::Error::AlreadyOpen) name it. Its `Display` is one line:
/// `queue handle on queue "emails", made at src/main.rs:12:17`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LiveHandle {
    /// What it is.
    pub kind: HandleKind,
    /// The name of its queue; `None` for the default queue.
    pub queue: Option<String>,
    /// The caller that made it (file, line and column, through `#[track_caller]`): the line
    /// of the app's code that opened the file, cloned a handle, named a queue, called a
    /// `with_*`, `to_async` or [`Queue::reader`](crate::Queue::reader). A clone made by a
    /// `#[derive(Clone)]` of the app's own struct names the derive; a clone of an
    /// `AsyncQueue` names the `to_async` line. A handle leaseq made for its own use names
    /// the line that made the app's handle it came from: a lease, the handle it was
    /// dequeued through; a pool's worker, the [`WorkerPool::builder`](crate::WorkerPool::builder)
    /// line; a read call's reader, the control channel's or a relay's handle, the handle
    /// passed to it.
    pub made_at: &'static Location<'static>,
}

impl fmt::Display for LiveHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.queue {
            Some(name) => write!(f, "{} on queue {name:?}", self.kind)?,
            None => write!(f, "{} on the default queue", self.kind)?,
        }
        write!(f, ", made at {}", self.made_at)
    }
}

/// `handles` on one line, for an error message: `"; in this process: a, b"`, or nothing
/// for none.
pub(crate) fn describe_here(handles: &[LiveHandle]) -> String {
    if handles.is_empty() {
        return String::new();
    }
    let named: Vec<String> = handles.iter().map(LiveHandle::to_string).collect();
    format!("; in this process: {}", named.join(", "))
}

/// What one slot holds.
#[derive(Clone)]
struct Made {
    kind: HandleKind,
    queue: Option<Arc<str>>,
    at: &'static Location<'static>,
}

impl Made {
    fn live(&self) -> LiveHandle {
        LiveHandle {
            kind: self.kind,
            queue: self.queue.as_deref().map(str::to_string),
            made_at: self.at,
        }
    }
}

/// The live handles of one open file, at most [`HANDLES_TRACKED_MAX`] of them named.
pub(crate) struct Handles {
    /// The file's path as the process sees it (canonical where it can be), for an open
    /// refused in this process; `None` for a backend or an attached database.
    path: Option<PathBuf>,
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    entries: Vec<Option<Made>>,
    /// Slots given back, for the next handle.
    free: Vec<u32>,
}

impl Handles {
    /// The table of a file just opened, from `path` if it has one (then known to
    /// [`live_here`] while the file is open).
    pub(crate) fn new(path: Option<&Path>) -> Arc<Handles> {
        let handles = Arc::new(Handles {
            path: path.map(canonical),
            slots: Mutex::new(Slots::default()),
        });
        if handles.path.is_some() {
            let mut open = OPEN_HERE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            open.retain(|h| h.strong_count() > 0);
            if open.len() < OPEN_FILES_TRACKED_MAX {
                open.push(Arc::downgrade(&handles));
            }
        }
        handles
    }

    fn take_slot(&self, made: Made) -> Option<u32> {
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.free.pop() {
            slots.entries[slot as usize] = Some(made);
            return Some(slot);
        }
        if slots.entries.len() >= HANDLES_TRACKED_MAX {
            return None;
        }
        slots.entries.push(Some(made));
        u32::try_from(slots.entries.len() - 1).ok()
    }

    fn give_back(&self, slot: u32) {
        let mut slots = self.slots.lock();
        if let Some(entry) = slots.entries.get_mut(slot as usize) {
            *entry = None;
            slots.free.push(slot);
        }
    }

    /// The live handles but `except`'s, at most `max` (in no particular order).
    pub(crate) fn live(&self, except: Option<&HandleMark>, max: usize) -> Vec<LiveHandle> {
        let skip = except.and_then(|m| m.slot);
        let slots = self.slots.lock();
        slots
            .entries
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i as u32) != skip)
            .filter_map(|(_, made)| made.as_ref())
            .take(max)
            .map(Made::live)
            .collect()
    }
}

/// The files open in this process from a path, for [`live_here`].
static OPEN_HERE: std::sync::Mutex<Vec<Weak<Handles>>> = std::sync::Mutex::new(Vec::new());

/// The live handles of this process holding the file at `path` (at most
/// [`HANDLES_LISTED_MAX`]); empty if it holds none (another process has it) or the file is
/// not known here.
pub(crate) fn live_here(path: &Path) -> Vec<LiveHandle> {
    let path = canonical(path);
    let open: Vec<Arc<Handles>> = {
        let open = OPEN_HERE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        open.iter().filter_map(Weak::upgrade).collect()
    };
    open.iter()
        .filter(|h| h.path.as_deref() == Some(path.as_path()))
        .flat_map(|h| h.live(None, HANDLES_LISTED_MAX))
        .take(HANDLES_LISTED_MAX)
        .collect()
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A handle's slot in its file's [`Handles`], given back when the handle is dropped.
pub(crate) struct HandleMark {
    handles: Arc<Handles>,
    /// `None` past [`HANDLES_TRACKED_MAX`]: counted, not named.
    slot: Option<u32>,
    /// What the slot holds, kept here too so a handle made from this one reads it without
    /// the lock.
    made: Made,
}

impl HandleMark {
    /// The mark of a new handle of `handles`.
    pub(crate) fn new(
        handles: &Arc<Handles>,
        kind: HandleKind,
        queue: Option<Arc<str>>,
        at: &'static Location<'static>,
    ) -> HandleMark {
        let made = Made { kind, queue, at };
        HandleMark {
            handles: Arc::clone(handles),
            slot: handles.take_slot(made.clone()),
            made,
        }
    }

    /// The mark of a handle made from this one by `caller`: of `kind` (this one's if
    /// `None`), on `queue`, made at `caller`, or where this one was made when `caller` is
    /// leaseq's own code or the standard library's (an `Option<Queue>`'s clone): a handle
    /// leaseq makes for its own use names the app's line its handle came from.
    pub(crate) fn derive(
        &self,
        kind: Option<HandleKind>,
        queue: Option<Arc<str>>,
        caller: &'static Location<'static>,
    ) -> HandleMark {
        let (kind, at) = if made_inside(caller) {
            (kind.unwrap_or(self.made.kind), self.made.at)
        } else {
            (kind.unwrap_or(HandleKind::Queue), caller)
        };
        HandleMark::new(&self.handles, kind, queue, at)
    }

    /// Where the handle was made.
    pub(crate) fn site(&self) -> &'static Location<'static> {
        self.made.at
    }

    /// The same handle, named as made at `at` (a public open, once its handle exists).
    pub(crate) fn made_at(&mut self, at: &'static Location<'static>) {
        self.made.at = at;
        if let Some(slot) = self.slot
            && let Some(Some(made)) = self.handles.slots.lock().entries.get_mut(slot as usize)
        {
            made.at = at;
        }
    }
}

impl Drop for HandleMark {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.handles.give_back(slot);
        }
    }
}

/// Whether `at` is a line of leaseq's own sources or of the standard library's.
fn made_inside(at: &Location<'_>) -> bool {
    // This file is `<crate>/src/handles.rs` as rustc was given it, as is every file of
    // the crate: the same `<crate>/src/` before its path within `src/`.
    const HERE: &str = file!();
    let own_src = HERE.strip_suffix("handles.rs").unwrap_or(HERE);
    let file = at.file();
    file.starts_with(own_src)
        || file.starts_with("/rustc/")
        || ["library/core/src", "library/alloc/src", "library/std/src"]
            .iter()
            .any(|std_src| file.contains(std_src))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_bounded() {
        let handles = Handles::new(None);
        let at = Location::caller();
        let first = HandleMark::new(&handles, HandleKind::Queue, None, at);
        let second = first.derive(Some(HandleKind::Reader), Some("q".into()), at);
        assert_eq!(handles.live(None, 10).len(), 2);
        assert_eq!(handles.live(Some(&first), 10).len(), 1);
        let slot = second.slot;
        drop(second);
        let third = first.derive(None, None, at);
        assert_eq!(third.slot, slot, "a slot given back is taken again");
        let many: Vec<HandleMark> = (0..HANDLES_TRACKED_MAX)
            .map(|_| first.derive(None, None, at))
            .collect();
        assert_eq!(many.iter().filter(|m| m.slot.is_none()).count(), 2);
        assert_eq!(handles.live(None, usize::MAX).len(), HANDLES_TRACKED_MAX);
    }

    #[test]
    fn a_handle_made_inside_names_where_its_source_was_made() {
        let handles = Handles::new(None);
        let app = Location::caller();
        let mark = HandleMark::new(&handles, HandleKind::Queue, None, app);
        // This test is in leaseq's sources: a handle made here is leaseq's own.
        assert!(made_inside(Location::caller()));
        let job = JobId(7);
        let child = mark.derive(Some(HandleKind::Lease { job }), None, Location::caller());
        assert_eq!(
            (child.made.at, child.made.kind),
            (app, HandleKind::Lease { job })
        );
        let clone = child.derive(None, None, Location::caller());
        assert_eq!(
            (clone.made.at, clone.made.kind),
            (app, HandleKind::Lease { job })
        );
    }
}
