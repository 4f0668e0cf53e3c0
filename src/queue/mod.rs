//! The queue handle: every call on one queue of an open file.

mod admin;
mod consume;
mod controls;
pub(crate) mod lifecycle;
mod observe;
pub(crate) mod produce;
mod schedules;

use std::fmt;
use std::panic::Location;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redb::ReadableDatabase;

use crate::commit::{Ctx, Verdict};
use crate::error::catch_engine_panic;
use crate::error::{Error, Result};
use crate::file::OpenFile;
use crate::handles::{HandleKind, HandleMark};
use crate::open::Builder;
use crate::retry::RetryPolicy;
use crate::store::{self, QueueConfig};

/// A persistent job queue in one redb file. Cheap to clone (a shared handle); `Send + Sync`.
///
/// Every mutating call returns after the commit that covers it is durable (with the default
/// [`Durability::Immediate`](crate::Durability::Immediate)); concurrent calls from many threads share commits (group
/// commit). The file closes when the last handle, including every outstanding [`Lease`](crate::Lease), is
/// dropped; [`Queue::shutdown`] names the handles still alive, each by the line that made it
/// (an open, a `clone`, [`Queue::named`], ...).
pub struct Queue {
    pub(crate) inner: Arc<OpenFile>,
    /// This handle's queue: its tables and default options.
    pub(crate) config: QueueConfig,
    /// Its name; `None` for the default queue.
    pub(crate) name: Option<Arc<str>>,
    /// Its slot among the file's live handles (what it is, where it was made).
    pub(crate) mark: HandleMark,
}

impl Clone for Queue {
    /// Another handle of the same queue, named by the caller's line in a
    /// [`FileShutdown`](crate::FileShutdown) while it lives.
    #[track_caller]
    fn clone(&self) -> Queue {
        self.derive(None, Location::caller())
    }
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

/// A `Queue` handle is one queue of its file: the default queue ([`Builder::open`](crate::Builder::open)) or a
/// named one ([`Queue::named`]). Calls that enqueue, dequeue, list, count, prune or purge act
/// on that queue only; [`Queue::check`], [`Queue::compact`], [`Queue::flush`] and
/// [`Queue::database`] are about the whole file.
impl Queue {
    /// Opens (or creates) the queue at `path` with default settings; see [`Builder::open`](crate::Builder::open).
    ///
    /// # Errors
    /// As [`Builder::open`](crate::Builder::open).
    #[track_caller]
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

    /// Another handle of this queue of `kind`, named as made where this one was (a lease,
    /// a pool's worker: made by leaseq for the app's handle).
    pub(crate) fn clone_kind(&self, kind: HandleKind) -> Queue {
        self.derive(Some(kind), self.mark_site())
    }

    /// Another handle of this queue, its mark derived from this one's: of `kind` (`None`: a
    /// plain handle), named as made at `at`.
    fn derive(&self, kind: Option<HandleKind>, at: &'static Location<'static>) -> Queue {
        Queue {
            inner: Arc::clone(&self.inner),
            config: self.config,
            name: self.name.clone(),
            mark: self.mark.derive(kind, self.name.clone(), at),
        }
    }

    /// Where this handle was made.
    pub(crate) fn mark_site(&self) -> &'static Location<'static> {
        self.mark.site()
    }

    /// This handle, named as made at `at` (a public open's caller).
    pub(crate) fn made_at(mut self, at: &'static Location<'static>) -> Queue {
        self.mark.made_at(at);
        self
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
    /// [`Queue::with_lease`] and the like. The unnamed queue is the one [`Builder::open`](crate::Builder::open)
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
    #[track_caller]
    pub fn named(&self, name: &str) -> Result<Queue> {
        crate::format::schema::QueueSchema::validate_queue_name(name)?;
        self.ensure_open()?;
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
    #[track_caller]
    pub fn existing(&self, name: &str) -> Result<Queue> {
        crate::format::schema::QueueSchema::validate_queue_name(name)?;
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
    #[track_caller]
    pub fn default_queue(&self) -> Queue {
        Queue {
            inner: self.inner.clone(),
            config: QueueConfig {
                schema: &crate::format::schema::DEFAULT_SCHEMA,
                ..self.config
            },
            name: None,
            mark: self.mark.derive(None, None, Location::caller()),
        }
    }

    /// The names of the file's named queues, sorted (the default queue is not listed).
    ///
    /// # Errors
    /// `Storage`, or `Corrupted` for a damaged registry.
    pub fn queue_names(&self) -> Result<Vec<String>> {
        self.reader().queue_names()
    }

    /// This handle's queue name; `None` for the default queue.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    #[track_caller]
    pub(super) fn handle_of(&self, name: &str, queue_number: u32) -> Queue {
        let name: Arc<str> = name.into();
        Queue {
            mark: self
                .mark
                .derive(None, Some(Arc::clone(&name)), Location::caller()),
            inner: self.inner.clone(),
            config: QueueConfig {
                schema: crate::format::schema::QueueSchema::named(queue_number),
                ..self.inner.config
            },
            name: Some(name),
        }
    }

    /// This handle with another default lease (visibility timeout) for its dequeues: for jobs
    /// enqueued without their own. Other handles are unchanged; nothing is stored.
    ///
    /// # Errors
    /// `InvalidOption` for a lease of 0 or above [`LEASE_MAX`](crate::LEASE_MAX).
    #[track_caller]
    pub fn with_lease(&self, lease: Duration) -> Result<Queue> {
        let mut q = self.clone();
        q.config.lease_ms = store::validate_lease_ms("lease", lease)?;
        Ok(q)
    }

    /// This handle with another default number of attempts, for the jobs it enqueues without
    /// their own. Nothing is stored.
    ///
    /// # Errors
    /// `InvalidOption` for 0 or above [`MAX_ATTEMPTS_CAP`](crate::MAX_ATTEMPTS_CAP).
    #[track_caller]
    pub fn with_max_attempts(&self, max_attempts: u32) -> Result<Queue> {
        store::validate_max_attempts(max_attempts)?;
        let mut q = self.clone();
        q.config.max_attempts = max_attempts;
        Ok(q)
    }

    /// This handle with another [`Encoding`](crate::Encoding) for
    /// [`enqueue_value`](Queue::enqueue_value) (and for decoding jobs that recorded none: raw
    /// payloads and jobs of files before format 5). Other handles are unchanged; nothing is
    /// stored until a job is enqueued.
    #[track_caller]
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
    #[track_caller]
    pub fn with_retry(&self, retry: RetryPolicy) -> Result<Queue> {
        retry.validate("retry")?;
        let mut q = self.clone();
        q.config.retry = retry;
        Ok(q)
    }
}
