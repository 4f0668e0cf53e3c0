//! [`Tx`]: the write transaction a caller's closure runs in (an `ack_with` effect, or
//! [`Queue::write`](crate::Queue::write)), with leaseq's enqueue added, so the caller's writes
//! and new jobs commit together or not at all (the transactional outbox; as River's
//! `InsertTx` and Oban's `insert` in an `Ecto.Multi`).

use std::cell::RefCell;
use std::ops::Deref;

use crate::error::Result;
use crate::format::schema::QueueSchema;
use crate::job::{CancelOutcome, JobId};
use crate::job::{EnqueueOptions, Enqueued};
use crate::store::{self, NewJob, QueueConfig};

/// A redb write transaction (it dereferences to [`redb::WriteTransaction`], so
/// `tx.open_table(..)` works as on redb's own) in which leaseq can also enqueue jobs.
///
/// You get one inside [`Lease::ack_with`](crate::Lease::ack_with) (and the other `ack_with`
/// calls) and inside [`Queue::write`](crate::Queue::write). Jobs enqueued through it exist if
/// and only if that transaction commits: before the commit no consumer sees them; if the
/// transaction is dropped (the closure failed, the group it shares aborted) they never
/// existed and their dedup keys stay free; their ids may then be handed out again to other
/// jobs (an id names one committed job, never two). Consumers blocked in
/// [`Queue::dequeue_timeout`](crate::Queue::dequeue_timeout) wake when it commits.
///
/// leaseq's own tables (`leaseq_*`) are leaseq's: inside `ack_with` the queue's are held open,
/// so opening one is refused by redb; do not open or write any of them yourself.
pub struct Tx<'a> {
    tx: &'a redb::WriteTransaction,
    /// The queue the transaction's call came from (`enqueue` adds to it).
    pub(crate) config: QueueConfig,

    now_ms: u64,
    sink: RefCell<&'a mut (dyn Sink + 'a)>,
}

impl std::fmt::Debug for Tx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").field("now_ms", &self.now_ms).finish()
    }
}

impl<'a> Tx<'a> {
    pub(crate) fn new(
        tx: &'a redb::WriteTransaction,
        config: QueueConfig,
        now_ms: u64,
        sink: &'a mut (dyn Sink + 'a),
    ) -> Tx<'a> {
        Tx {
            tx,
            config,
            now_ms,
            sink: RefCell::new(sink),
        }
    }

    /// The redb transaction itself (the same as dereferencing).
    pub fn transaction(&self) -> &redb::WriteTransaction {
        self.tx
    }

    /// Enqueues a job in this transaction, as [`Queue::enqueue`](crate::Queue::enqueue) does
    /// (the queue's defaults; the clock read when the enclosing call began). Returns
    /// `New(id)`, or `Duplicate(id)` / `DuplicateDead(id)` when its dedup key is held (also by
    /// a job enqueued earlier in this transaction). Inside `ack_with`, a key held only while
    /// live by a job this call acks is free (that job is gone when the call commits), so a
    /// follow-up may reuse its parent's dedup key.
    ///
    /// Give a follow-up its own idempotency key: one carrying its parent's key finds the
    /// parent's marker when it is delivered, and its effect is `AlreadyApplied` (skipped).
    ///
    /// # Errors
    /// `PayloadTooLarge`, `KeyTooLong` or `InvalidOption` for a refused job, `QueueFull` when
    /// the queue's size limit has no room (never waiting), `StorageFull` while the file is
    /// within its disk reserve ([`Builder::disk_reserve`](crate::Builder::disk_reserve)):
    /// nothing was written and the transaction goes on (handle it, or return it to fail the
    /// call; from an `ack_with` closure, `StorageFull` passed on snoozes the job for
    /// [`STORAGE_FULL_SNOOZE`](crate::STORAGE_FULL_SNOOZE), no attempt spent).
    /// `Storage` or `Corrupted` if the storage engine failed mid-write: the enclosing call
    /// then fails whatever the closure returns (with `Effect`), so a half-written job never
    /// commits.
    pub fn enqueue(&self, payload: &[u8], opts: EnqueueOptions) -> Result<Enqueued> {
        let mut out = self.enqueue_batch([(payload, opts)])?;
        debug_assert_eq!(out.len(), 1);
        Ok(out.remove(0))
    }

    /// Enqueues `value` encoded with the calling handle's encoding, as
    /// [`Queue::enqueue_value`](crate::Queue::enqueue_value).
    ///
    /// # Errors
    /// `PayloadCodec` if `value` does not serialize or does not decode back; otherwise as
    /// [`Tx::enqueue`].
    pub fn enqueue_value<T>(&self, value: &T, opts: EnqueueOptions) -> Result<Enqueued>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let (payload, opts) = opts.typed(value, self.config.encoding)?;
        self.enqueue(&payload, opts)
    }

    /// Enqueues up to [`BATCH_MAX`](crate::BATCH_MAX) jobs, all or none, one result per job
    /// in order, as [`Queue::enqueue_batch`](crate::Queue::enqueue_batch).
    ///
    /// # Errors
    /// As [`Tx::enqueue`]; `InvalidOption` for an empty or oversized batch.
    pub fn enqueue_batch<'p>(
        &self,
        jobs: impl IntoIterator<Item = (&'p [u8], EnqueueOptions)>,
    ) -> Result<Vec<Enqueued>> {
        self.enqueue_batch_with(&self.config, jobs)
    }

    pub(crate) fn enqueue_batch_with<'p>(
        &self,
        config: &QueueConfig,
        jobs: impl IntoIterator<Item = (&'p [u8], EnqueueOptions)>,
    ) -> Result<Vec<Enqueued>> {
        let records = store::new_records(config, self.now_ms, jobs)?;
        self.sink.borrow_mut().put(config.schema, &records)
    }
}

/// Control calls inside the transaction, as River's `JobCancelTx`, `JobRetryTx` and
/// `JobDeleteTx`: the call's change commits with the caller's writes and jobs, or not at
/// all. They act on this queue's jobs (the queue the closure's call came from); an `ack_with`
/// refuses them on the jobs of its own batch (`InvalidState`: its lease ends them when it
/// commits). A refused call writes nothing and the transaction goes on; a storage error
/// fails the whole transaction (`Effect`, as an enqueue's).
impl Tx<'_> {
    /// Cancels job `id` in this transaction, as [`Queue::cancel`](crate::Queue::cancel):
    /// the same outcome, the same fencing of a leased job, with effect only if the
    /// transaction commits. `reason` is kept up to
    /// [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX) bytes, cut at a character boundary.
    ///
    /// # Errors
    /// `JobNotFound` for an id this file never handed out, or one another queue of the file
    /// holds; `Corrupted` for a damaged row;
    /// `InvalidState` for a job this `ack_with` acks; `Effect` after an earlier call of this
    /// transaction failed on storage; `Storage`.
    pub fn cancel(&self, id: JobId, reason: &str) -> Result<CancelOutcome> {
        let reason = store::truncate_reason(reason);
        let call = TxCall::Cancel {
            id: id.0,
            reason: &reason,
            now_ms: self.now_ms,
        };
        match self.control(call)? {
            TxAnswer::Cancel(outcome) => Ok(outcome),
            TxAnswer::Done => unreachable!("a cancel answers its outcome"),
        }
    }

    /// Runs a dead, completed or cancelled job again in this transaction, as
    /// [`Queue::retry`](crate::Queue::retry).
    ///
    /// # Errors
    /// As [`Queue::retry`](crate::Queue::retry) (`JobNotFound`, `InvalidState`, `KeyHeld`,
    /// `Corrupted`); `Effect` after an earlier call of this transaction failed on storage;
    /// `Storage`.
    pub fn retry(&self, id: JobId) -> Result<()> {
        self.control(TxCall::Retry {
            id: id.0,
            now_ms: self.now_ms,
        })
        .map(drop)
    }

    /// Deletes a job that is not leased in this transaction, as
    /// [`Queue::remove`](crate::Queue::remove) (River's `JobDeleteTx`).
    ///
    /// # Errors
    /// As [`Queue::remove`](crate::Queue::remove) (`JobNotFound`, `InvalidState` for a leased
    /// job or a cancelled one its group still waits for); `Effect` after an earlier call of this transaction failed on storage; `Storage`.
    pub fn remove(&self, id: JobId) -> Result<()> {
        self.control(TxCall::Remove {
            id: id.0,
            now_ms: self.now_ms,
        })
        .map(drop)
    }

    fn control(&self, call: TxCall<'_>) -> Result<TxAnswer> {
        self.sink.borrow_mut().control(self.config.schema, call)
    }
}

impl Deref for Tx<'_> {
    type Target = redb::WriteTransaction;

    fn deref(&self) -> &redb::WriteTransaction {
        self.tx
    }
}

/// Where a caller's closure inside a group transaction enqueues ([`Tx::enqueue`]) and makes
/// its control calls ([`Tx::cancel`], ...): on the tables the running operation holds open
/// (`ack_with`) or opens for it (`store::write`).
pub(crate) trait Sink {
    /// Adds validated jobs in order to queue `schema`, as the engine's enqueue.
    fn put(&mut self, schema: &'static QueueSchema, jobs: &[NewJob]) -> Result<Vec<Enqueued>>;

    /// Runs control call `call` on queue `schema`: a refusal (`Err` of an input error) wrote
    /// nothing; any other error breaks the transaction.
    fn control(&mut self, schema: &'static QueueSchema, call: TxCall<'_>) -> Result<TxAnswer>;
}

/// A control call made inside a caller's transaction ([`Tx::cancel`], `retry`,
/// `remove`), run on the operation's tables.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TxCall<'r> {
    Cancel {
        id: u64,
        reason: &'r str,
        now_ms: u64,
    },
    Retry {
        id: u64,
        now_ms: u64,
    },
    Remove {
        id: u64,
        now_ms: u64,
    },
}

/// What a [`TxCall`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxAnswer {
    Cancel(crate::job::CancelOutcome),
    Done,
}
