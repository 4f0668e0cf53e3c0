//! The one error type of leaseq.

use std::path::PathBuf;

use crate::job::state::{JobId, JobState};

/// A boxed error from caller code (the closure given to [`Lease::ack_with`](crate::Lease::ack_with)).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with leaseq's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in leaseq.
///
/// Every variant that refuses an input (`PayloadTooLarge`, `KeyTooLong`, `InvalidOption`,
/// `LeaseLost`, `JobNotFound`, `InvalidState`, `Reentrant`, `Closed`) is returned *before* anything is
/// written: the file is unchanged by the refused call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file is not a leaseq file: not a redb database at all, or a redb database without
    /// leaseq's tables (use [`Builder::attach`](crate::Builder::attach) to add them on purpose).
    /// The file was not modified.
    #[error("{path}: not a leaseq file ({detail})")]
    NotLeaseq {
        /// The path that was opened.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// The file is shorter than a redb header (0 bytes included). leaseq never recreates or
    /// deletes such a file; the file was not modified.
    #[error("{path}: truncated file ({len_bytes} bytes)")]
    Truncated {
        /// The path that was opened.
        path: PathBuf,
        /// Its length in bytes.
        len_bytes: u64,
    },
    /// Stored data failed a check: a redb checksum or structure error, a job record that does
    /// not decode (for a call aimed at that one job: passes over many jobs quarantine such a
    /// row and go on, see [`Queue::quarantined`](crate::Queue::quarantined)), or a panic
    /// inside the storage engine caught at leaseq's boundary.
    #[error("corrupted: {detail}")]
    Corrupted {
        /// What was inconsistent.
        detail: String,
    },
    /// The file was written by a newer leaseq (format version `found`); this build reads
    /// versions up to `supported`. The file was not modified.
    #[error("file format version {found} is newer than this leaseq supports ({supported})")]
    UnsupportedVersion {
        /// The version stored in the file.
        found: u64,
        /// The newest version this build reads.
        supported: u64,
    },
    /// The file is already open, by this process or another (a writer, or a
    /// [`Reader`](crate::Reader) when this open is without
    /// [`Builder::live_reads`](crate::Builder::live_reads)). The open ran no recovery.
    /// When handles of this process hold it, the message names them (as
    /// [`FileShutdown::handles`](crate::FileShutdown::handles) does): a handle kept by
    /// mistake is found by its line.
    #[error(
        "{path}: already open by this or another process{}",
        crate::handles::describe_here(.live_handles)
    )]
    AlreadyOpen {
        /// The path that was opened.
        path: PathBuf,
        /// The handles of this process that hold the file, where each was made (at most
        /// [`HANDLES_LISTED_MAX`](crate::HANDLES_LISTED_MAX)); empty when none does
        /// (another process has it open, or a [`Reader`](crate::Reader) of this one).
        live_handles: Vec<crate::handles::LiveHandle>,
    },
    /// [`Reader::open`](crate::Reader::open) found the file open in a process that holds it
    /// exclusively: one that opened it without
    /// [`Builder::live_reads`](crate::Builder::live_reads). Nothing was read or written.
    #[error(
        "{path}: held exclusively by the process that has it open; to read it while that \
         process runs, open it there with Builder::live_reads(true); else stop that process \
         first, or read a copy (a copy shows the jobs in flight as leased, as of the copy)"
    )]
    HeldExclusively {
        /// The path that was opened.
        path: PathBuf,
    },
    /// A payload is larger than the queue's limit
    /// ([`Builder::payload_bytes_max`](crate::Builder::payload_bytes_max)).
    ///
    /// Inside [`Queue::write`](crate::Queue::write) or an `ack_with` closure (an enqueue
    /// of the transaction refused, and the closure passing the error on with `?`), the call
    /// returns this same error, not [`Error::Effect`].
    #[error(
        "payload of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes: raise \
         Builder::payload_bytes_max (at most {cap} bytes), or keep the data in a table of \
         your own and enqueue its key",
        cap = crate::limits::PAYLOAD_BYTES_MAX_CAP
    )]
    PayloadTooLarge {
        /// The payload's size in bytes.
        size_bytes: usize,
        /// The limit in bytes.
        limit_bytes: usize,
    },
    /// An idempotency key or dedup key is longer than [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX).
    /// Inside `write` or an `ack_with` closure, as for `PayloadTooLarge`.
    #[error(
        "{field} of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes \
         (KEY_BYTES_MAX, fixed): use a hash of the key"
    )]
    KeyTooLong {
        /// `"idempotency_key"` or `"dedup_key"`.
        field: &'static str,
        /// The key's size in bytes.
        size_bytes: usize,
        /// The limit in bytes.
        limit_bytes: usize,
    },
    /// An option is out of range (zero lease, lease above the cap, zero max attempts, a delay
    /// whose due time overflows). Nothing is clamped silently. Inside `write` or an
    /// `ack_with` closure, as for `PayloadTooLarge`.
    #[error("invalid option {field}: {reason}")]
    InvalidOption {
        /// The option's name, e.g. `"lease"`.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The lease token is no longer current: the job was redelivered (its lease expired and a
    /// later dequeue took it), acked, nacked, failed, or recovered by a reopen. The fencing
    /// token check. Nothing was changed.
    #[error("lease lost: job {job_id} with token {token} is no longer leased under that token")]
    LeaseLost {
        /// The job the lease was for.
        job_id: JobId,
        /// The stale token.
        token: u64,
    },
    /// The job was cancelled ([`Queue::cancel`](crate::Queue::cancel)), with this reason: an
    /// ack, `ack_with`, nack, snooze, fail or extend of a delivery taken before the cancel is
    /// refused with it and changes nothing (the cancel fenced the lease, as a newer token
    /// would). Answered while the job's row is kept: at least until that lease's deadline,
    /// longer in a queue that keeps a history ([`Queue::set_history`](crate::Queue::set_history)).
    #[error("job {job_id} was cancelled: {reason}")]
    Cancelled {
        /// The job.
        job_id: JobId,
        /// The reason the cancel gave.
        reason: String,
    },
    /// A job cannot take its dedup key back: another job holds it
    /// ([`Queue::retry`](crate::Queue::retry) of a completed or cancelled job whose key was
    /// taken after it ended). Nothing was changed; remove or finish the holder, or enqueue the
    /// work anew.
    #[error("job {job_id}'s dedup key is held by job {holder}")]
    KeyHeld {
        /// The job that wanted its key back.
        job_id: JobId,
        /// The job that holds the key.
        holder: JobId,
    },
    /// An enqueue does not fit the queue's size limit
    /// ([`Queue::set_limit`](crate::Queue::set_limit)): with [`WhenFull::Refuse`](crate::WhenFull::Refuse)
    /// at once, with [`WhenFull::Block`](crate::WhenFull::Block) after its wait, with
    /// [`WhenFull::DropOldest`](crate::WhenFull::DropOldest) when dropping every job that can
    /// be dropped would not make room (a batch larger than the limit; leased and held jobs
    /// filling it). Nothing was written: no job added, none dropped. Take jobs off the queue
    /// (or raise the limit) and enqueue again, as with RabbitMQ's `reject-publish` nack.
    #[error(
        "queue {queue} is full: {jobs} jobs of {max_jobs:?}, {bytes} payload bytes of {max_bytes:?}; the enqueue needs {needs_jobs} more jobs and {needs_bytes} more bytes"
    )]
    QueueFull {
        /// The queue's name (`(default)` for the unnamed queue).
        queue: String,
        /// The jobs it holds (scheduled, ready and leased).
        jobs: u64,
        /// The payload bytes of those jobs.
        bytes: u64,
        /// Its count limit, if it has one.
        max_jobs: Option<u64>,
        /// Its byte limit, if it has one.
        max_bytes: Option<u64>,
        /// How many new jobs the refused call would have added.
        needs_jobs: u64,
        /// How many payload bytes they hold.
        needs_bytes: u64,
    },
    /// The file is *storage full*: its disk, or its file limit
    /// ([`Builder::file_bytes_max`](crate::Builder::file_bytes_max)), is within the disk
    /// reserve ([`Builder::disk_reserve`](crate::Builder::disk_reserve)). A call that only
    /// grows the file (an enqueue of any kind, an import, a schedule's instance) is refused,
    /// nothing written; dequeue, ack, `ack_with`, nack, cancel, remove, prune and compaction
    /// go on and free room. Also a single batch whose payload would take the room above the
    /// reserve. The state ends by itself once the room left is twice the reserve
    /// (as etcd's NOSPACE alarm, which leaves only reads and deletes). Sizes in bytes, as
    /// last seen.
    #[error(
        "{}",
        storage_full_text(*available_bytes, *file_bytes, *reusable_bytes, *reserve_bytes, *file_bytes_max, *needs_bytes)
    )]
    StorageFull {
        /// Bytes free to this process on the file's file system.
        available_bytes: u64,
        /// Bytes the queue file and its journal take on disk.
        file_bytes: u64,
        /// Of those, bytes the file can reuse (pages the drain freed).
        reusable_bytes: u64,
        /// The disk reserve.
        reserve_bytes: u64,
        /// The file limit, if one is set.
        file_bytes_max: Option<u64>,
        /// 0 while the file is storage full; else the refused call alone was too large: the
        /// bytes it needed (twice its payload), more than the room above the reserve.
        needs_bytes: u64,
    },
    /// A named queue that does not exist, asked for by a call that does not create it
    /// ([`Queue::existing`](crate::Queue::existing)).
    #[error("no queue named {name:?} in this file")]
    QueueNotFound {
        /// The name asked for.
        name: String,
    },
    /// [`Queue::create_schedule`](crate::Queue::create_schedule) with a name this queue
    /// already has a schedule under. Nothing was changed; use
    /// [`Queue::upsert_schedule`](crate::Queue::upsert_schedule) to create or change.
    #[error("a schedule named {name:?} exists in this queue")]
    ScheduleExists {
        /// The name asked for.
        name: String,
    },
    /// [`Queue::update_schedule`](crate::Queue::update_schedule) of a name this queue has no
    /// schedule under. Nothing was changed.
    #[error("no schedule named {name:?} in this queue")]
    ScheduleNotFound {
        /// The name asked for.
        name: String,
    },
    /// No job with this id is in this handle's queue: it was never enqueued there (a job of
    /// another queue of the file is not found either), or it is gone: acked, removed
    /// ([`Queue::remove`](crate::Queue::remove)), deleted by
    /// [`Queue::purge`](crate::Queue::purge), or deleted past
    /// [`Builder::dead_retention`](crate::Builder::dead_retention). Purging and removing delete
    /// the job's row and never hand its id out again (ids come from a counter that only grows),
    /// so a gone id stays not found.
    #[error("job {job_id} not found")]
    JobNotFound {
        /// The id asked for.
        job_id: JobId,
    },
    /// The job exists but is in a state the call does not apply to (e.g. `requeue_dead` on a
    /// job that is not dead).
    #[error("job {job_id} is {actual:?}, the call needs {expected}")]
    InvalidState {
        /// The job.
        job_id: JobId,
        /// Its current state.
        actual: JobState,
        /// The state the call needs.
        expected: &'static str,
    },
    /// A caller's closure failed: it returned an error (carried here), panicked (the error's
    /// text is then `closure panicked: ` and the panic's message), or swallowed a storage
    /// error inside one of its [`Tx::enqueue`](crate::Tx::enqueue) calls.
    ///
    /// From [`Lease::ack_with`](crate::Lease::ack_with) (and the other `ack_with` calls): its
    /// transaction was dropped (no effect, no applied-ids marker, no ack), then the job was
    /// given back with this error's text (its `Display`, without the `effect failed: ` prefix)
    /// as its [`last_error`](crate::JobInfo::last_error), as by
    /// [`Lease::nack`](crate::Lease::nack): due after the retry policy's delay, or dead with
    /// that text when it was its last attempt; the lease is stale from then on. A closure that
    /// returned an [`Outcome`](crate::Outcome) had the job end as it says instead (snoozed
    /// uncharged, dead now with its reason, or retried after its own backoff with its reason),
    /// and the `Outcome` is what this variant carries (downcast it to see which).
    ///
    /// From [`Queue::write`](crate::Queue::write): nothing of the closure's transaction
    /// committed (neither its writes nor its jobs). A queue call the closure made and passed
    /// on (refused `Reentrant`) is returned as itself, not as `Effect`.
    #[error("effect failed: {0}")]
    Effect(#[source] BoxError),
    /// A typed payload did not serialize, did not decode back at enqueue
    /// ([`Queue::enqueue_value`](crate::Queue::enqueue_value) checks the round trip), or did not
    /// decode as the type asked for ([`Lease::decode`](crate::Lease::decode)), with the job's
    /// [`Encoding`](crate::Encoding) (bincode or JSON). At enqueue nothing was written.
    #[error("payload codec: {detail}")]
    PayloadCodec {
        /// The codec's message.
        detail: String,
    },
    /// A queue operation was called from inside a closure that runs in the queue's write
    /// transaction (an `ack_with` effect or a [`Queue::write`](crate::Queue::write) closure,
    /// directly or through another queue's closure); it would wait for its own commit forever,
    /// so it is refused. Enqueue, cancel, retry or remove through the closure's
    /// [`Tx`](crate::Tx) instead ([`Tx::enqueue`](crate::Tx::enqueue),
    /// [`Tx::cancel`](crate::Tx::cancel), ...). A
    /// `Queue::write` whose closure passed this error on returns it as it is; an `ack_with`
    /// returns it inside [`Error::Effect`] (the attempt ended).
    #[error(
        "queue operation called from inside a closure running in its write transaction (ack_with or write): make it through the closure's Tx (enqueue, cancel, retry, remove)"
    )]
    Reentrant,
    /// [`Queue::close`](crate::Queue::close) was called on this file: no new job is enqueued
    /// or delivered through any of its handles. Calls on leases already held and reads still
    /// work. Nothing was written.
    #[error("the queue file was closed")]
    Closed,
    /// A call that runs its work on the caller's tokio runtime was made outside one (no
    /// runtime is current on the calling thread): `call` names it (`PoolBuilder::start_async`
    /// and its staged form, feature `tokio`). Nothing was started. Call it from inside the
    /// runtime (in an `async fn`, or after `Runtime::enter`), or start a thread pool with
    /// `PoolBuilder::start` instead.
    #[error(
        "{call} needs a tokio runtime: call it from inside one (#[tokio::main], Runtime::enter)"
    )]
    NoRuntime {
        /// The call that was refused.
        call: &'static str,
    },
    /// The call needs the queue to itself ([`Queue::compact`](crate::Queue::compact)): other
    /// handles or leases of it are alive, or a transaction is open on
    /// [`Queue::database`](crate::Queue::database). Nothing was done; try again once they are
    /// dropped.
    #[error("the queue is in use: {detail}")]
    Busy {
        /// What is still in use.
        detail: String,
    },
    /// A commit returned an error. Its changes may or may not have become durable; redb refuses
    /// further writes on this handle, so every later write returns this error too. Reopen the
    /// file: recovery and the applied-ids markers tell what happened.
    #[error("commit failed (outcome unknown, reopen the queue): {detail}")]
    CommitFailed {
        /// The storage engine's message.
        detail: String,
    },
    /// An error a running app answered to a request through its control channel
    /// (`leaseq::control::Client`, feature `control`) that has no variant
    /// of its own on this side: `kind` is the API's name for it (`invalid_option`,
    /// `payload_too_large`, `commit_failed`, `unauthorized`, ...), `message` the app's text,
    /// `status` the HTTP status. Whether it wrote anything is as the app's own error says
    /// (a refused input wrote nothing).
    #[error("the app answered {status}: {message}")]
    Remote {
        /// The HTTP status of the answer.
        status: u16,
        /// The API's name of the error.
        kind: String,
        /// The app's message.
        message: String,
    },
    /// Any other error from the storage engine (redb).
    #[error("storage: {0}")]
    Storage(#[source] redb::Error),
    /// An I/O error outside redb (creating, syncing or renaming the file).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    pub(crate) fn corrupted(detail: impl Into<String>) -> Error {
        Error::Corrupted {
            detail: detail.into(),
        }
    }

    /// `AlreadyOpen` for `path`, naming this process's handles of it.
    pub(crate) fn already_open(path: &std::path::Path) -> Error {
        Error::AlreadyOpen {
            path: path.to_path_buf(),
            live_handles: crate::handles::live_here(path),
        }
    }

    pub(crate) fn invalid_option(field: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidOption {
            field,
            reason: reason.into(),
        }
    }

    /// `InvalidOption` for a batch or page `field` out of 1 to
    /// [`BATCH_MAX`](crate::limits::BATCH_MAX) items.
    pub(crate) fn batch_too_large(field: &'static str) -> Error {
        Error::invalid_option(
            field,
            format!("a batch holds 1 to {} items", crate::limits::BATCH_MAX),
        )
    }
}

impl Error {
    /// A copy of this error when it is `StorageFull` (its fields are numbers), for each of
    /// several calls one refusal answers; `None` for any other error.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn storage_full_copy(&self) -> Option<Error> {
        match *self {
            Error::StorageFull {
                available_bytes,
                file_bytes,
                reusable_bytes,
                reserve_bytes,
                file_bytes_max,
                needs_bytes,
            } => Some(Error::StorageFull {
                available_bytes,
                file_bytes,
                reusable_bytes,
                reserve_bytes,
                file_bytes_max,
                needs_bytes,
            }),
            _ => None,
        }
    }

    /// Whether this refuses an input before anything is written (a payload, a key or an
    /// option out of range): the same error inside a caller's transaction as outside it.
    pub(crate) fn is_input_refusal(&self) -> bool {
        matches!(
            self,
            Error::PayloadTooLarge { .. }
                | Error::KeyTooLong { .. }
                | Error::InvalidOption { .. }
                | Error::QueueFull { .. }
                | Error::StorageFull { .. }
        )
    }

    /// Whether the disk or the storage engine failed under a call, rather than the call
    /// being refused.
    pub(crate) fn is_storage_failure(&self) -> bool {
        matches!(
            self,
            Error::Storage(_) | Error::Io(_) | Error::CommitFailed { .. }
        )
    }

    /// The error a caller's closure passed on, when it is one of leaseq's input refusals
    /// (an enqueue inside `write` or `ack_with` refused): that error itself rather than
    /// `Effect` around it, so it names the setting to change.
    pub(crate) fn surfaced(self) -> Error {
        self.surfaced_if(Error::is_input_refusal)
    }

    /// [`Error::surfaced`], and also, under the closure of `Queue::write`, a queue call made
    /// inside it (`Reentrant`, the caller's mistake, not its closure failing), a refusal of
    /// one of the `Tx`'s control calls (`JobNotFound`, `InvalidState`, `KeyHeld`) and a failing
    /// disk: an enqueue inside it that failed on storage, or its own table writes failing with redb's
    /// `StorageError::Io` or `PreviousIo` (bare or in a `TableError`), passed on by the
    /// closure. The caller sees `Storage`, not its own closure failing; any other error of
    /// its own (a value too large for redb, a table of other types) stays `Effect`. (Not for
    /// `ack_with`, where `Effect` says the attempt ended.)
    pub(crate) fn surfaced_in_write(self) -> Error {
        fn disk(e: &redb::StorageError) -> bool {
            matches!(
                e,
                redb::StorageError::Io(_) | redb::StorageError::PreviousIo
            )
        }
        let e = match self {
            Error::Effect(boxed) => match boxed.downcast::<redb::StorageError>() {
                Ok(storage) if disk(&storage) => return Error::from(*storage),
                Ok(storage) => Error::Effect(storage),
                Err(boxed) => match boxed.downcast::<redb::TableError>() {
                    Ok(table) => match *table {
                        redb::TableError::Storage(storage) if disk(&storage) => {
                            return Error::from(storage);
                        }
                        other => Error::Effect(Box::new(other)),
                    },
                    Err(boxed) => Error::Effect(boxed),
                },
            },
            e => e,
        };
        e.surfaced_if(|e| {
            e.is_input_refusal()
                || e.is_storage_failure()
                || matches!(
                    e,
                    Error::Reentrant
                        | Error::JobNotFound { .. }
                        | Error::InvalidState { .. }
                        | Error::KeyHeld { .. }
                )
        })
    }

    fn surfaced_if(self, surfaces: fn(&Error) -> bool) -> Error {
        match self {
            Error::Effect(boxed) => match boxed.downcast::<Error>() {
                Ok(inner) if surfaces(&inner) => *inner,
                Ok(inner) => Error::Effect(inner),
                Err(other) => Error::Effect(other),
            },
            e => e,
        }
    }
}

impl From<redb::Error> for Error {
    fn from(e: redb::Error) -> Error {
        match e {
            redb::Error::Corrupted(detail) => Error::Corrupted { detail },
            redb::Error::ValueTooLarge(size) => Error::PayloadTooLarge {
                size_bytes: size,
                limit_bytes: crate::limits::PAYLOAD_BYTES_MAX_CAP,
            },
            other => Error::Storage(other),
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::from(redb::Error::from(e))
            }
        }
    )*};
}
from_redb!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::DatabaseError
);

impl From<redb::CommitError> for Error {
    fn from(e: redb::CommitError) -> Error {
        Error::CommitFailed {
            detail: e.to_string(),
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `f`, turning a panic inside the storage engine into `Corrupted`: no panic crosses
/// leaseq's API. The one place that does (the open, the committer, the read views).
pub(crate) fn catch_engine_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::corrupted(format!(
            "storage engine panicked: {}",
            panic_message(&*p)
        )))
    })
}

/// `StorageFull`'s text: what is short (the disk, the file limit, or the call itself), then
/// the numbers.
fn storage_full_text(
    available: u64,
    file: u64,
    reusable: u64,
    reserve: u64,
    file_max: Option<u64>,
    needs: u64,
) -> String {
    let at_limit = file_max.is_some_and(|max| file >= max.saturating_sub(reserve.max(256 << 10)));
    let what = if needs > 0 {
        format!(
            "this call needs about {needs} bytes, more than the room left above the disk reserve: enqueue it in smaller parts"
        )
    } else if at_limit {
        format!(
            "storage full: the file and its journal take {file} bytes of the file limit of {} ({reusable} reusable)",
            file_max.unwrap_or(0)
        )
    } else {
        format!(
            "storage full: {available} bytes free on the disk, the disk reserve is {reserve} bytes ({reusable} bytes reusable in the file)"
        )
    };
    if needs > 0 {
        format!(
            "{what} ({available} bytes free on the disk, {file} taken by the file and its journal)"
        )
    } else {
        format!("{what}; enqueues are refused until the drain or a clean-up frees room")
    }
}
