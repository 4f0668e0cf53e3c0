//! Group commit: many callers, one redb write transaction, one fsync (ARCHITECTURE.md,
//! the guide's durability chapter).
//!
//! A caller's operation runs on the caller's own thread, against the group's open
//! `WriteTransaction`, under the group mutex. Then the caller waits for the group's commit.
//! The member that opened the group (its leader) seals it (commits it) once no other caller
//! is on its way in (`arrivals == 0`) and every member of the previous group has come back
//! with its next operation (`returning == 0`: threads in a worker loop call again right after
//! their answer, so waiting for them makes one group per round instead of two half groups;
//! counted only after a group with more than one member, so a lone caller, or threads taking
//! turns, never wait), or the group is full, or it has been open for twice the last commit's
//! duration (at most `GATHER_MAX`): at 16x16 on 2 cores the members' serial operations take
//! longer than one commit, and waiting up to two (24-26 operations per group instead of
//! 18-19) gave +13% jobs/s; at 4x4 the two bounds measured the same.
//! A lone caller never waits. Nobody is answered before the commit that covers its
//! operation. Waiters are split by what they wait for, so an event wakes only the threads it
//! concerns: callers waiting to enter (a condvar), the leader waiting to seal (a condvar of
//! its own), members waiting for their result (parked, and unparked one by one once it is
//! set, so they never queue on the group mutex to read it). On 2 cores, waking every waiter
//! on every event cost a third of the CPU at 4x4.
//!
//! Operations validate before they write, so a refused call (stale token, bad option) leaves
//! the transaction clean and just reports its error after the commit: it answers a
//! [`Refusal`] (see [`Verdict`]), and its write mark must be unset (checked: a refusal
//! after a write aborts the group). An operation that fails (an `ack_with` closure error, a
//! storage error) aborts the whole group:
//! its caller gets the error at once, and every other member runs its operation again in a
//! fresh group (`Replay`). A group that wrote nothing is aborted instead of committed, so a
//! refused call costs no fsync.
//!
//! The one write path: an operation reaches its transaction only through [`GroupTx`]. Every
//! leaseq table is a [`GroupTable`], whose writes (insert, remove, retain) mark the group and
//! are where a journal would record each change; a caller's closure gets the raw transaction
//! from [`GroupTx::caller_transaction`], which marks the group too. What a group did besides
//! its writes (wake-ups, events, the metrics tally) is one record, filled through a
//! [`GroupLog`] and taken whole by the seal; a [`SealWriter`] writes the tally's metrics.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redb::{
    AccessGuard, Database, Key, ReadableTable, Table, TableDefinition, Value, WriteTransaction,
};

use crate::disk_reserve::{DiskReserve, Turned};
use crate::error::{Error, Result, catch_engine_panic};
use crate::events::{Event, EventHub};
use crate::format::journal::{FrameBody, type_code};
use crate::format::schema::{META, META_NEXT_ID, META_NEXT_TOKEN, META_STORAGE_FULL_MS};
use crate::journal::Journal;
use crate::limits::{COUNTER_BLOCK, GATHER_MAX, GROUP_MEMBERS_MAX, NON_DURABLE_COMMITS_MAX};
use crate::metrics::Tally;
use crate::signal::QueueSignals;

/// Source of committer ids (0 means "none" in the thread-locals below). An id, not the
/// committer's address: the committer moves (into the queue's `Arc`) after its first group.
static NEXT_COMMITTER_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The committers (by id) whose groups this thread is running an operation in, innermost
    /// last: a call to one of them from there (an `ack_with` closure calling its own queue,
    /// directly or through another queue's closure) would deadlock on the group mutex.
    static IN_GROUP: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// (committer id, sequence number) of the last group this thread was a member of:
    /// tells a thread returning from the previous group apart from a new arrival.
    static LAST_GROUP: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdBlocks {
    next_id: u64,
    id_end: u64,
    next_token: u64,
    token_end: u64,
}

impl IdBlocks {
    pub(crate) fn read(tx: &WriteTransaction) -> Result<IdBlocks> {
        let meta = tx.open_table(META)?;
        let get = |k: &str| -> Result<u64> {
            let v = meta
                .get(k)?
                .ok_or_else(|| Error::corrupted(format!("leaseq_meta has no {k}")))?
                .value();
            if v == 0 || v > u64::MAX / 2 {
                return Err(Error::corrupted(format!("leaseq_meta {k} is {v}")));
            }
            Ok(v)
        };
        let (id_end, token_end) = (get(META_NEXT_ID)?, get(META_NEXT_TOKEN)?);
        Ok(IdBlocks {
            next_id: id_end,
            id_end,
            next_token: token_end,
            token_end,
        })
    }

    fn write(&self, tx: GroupTx<'_>) -> Result<()> {
        let mut meta = tx.table(META)?;
        meta.insert(META_NEXT_ID, self.id_end)?;
        meta.insert(META_NEXT_TOKEN, self.token_end)?;
        Ok(())
    }

    /// Whether the reserved blocks moved (the meta row must be written).
    fn reserved_moved(&self, since: &IdBlocks) -> bool {
        (self.id_end, self.token_end) != (since.id_end, since.token_end)
    }

    fn take(next: &mut u64, end: &mut u64) -> u64 {
        debug_assert!(*next <= *end);
        if *next == *end {
            *end += COUNTER_BLOCK;
        }
        let n = *next;
        *next += 1;
        n
    }
}

/// What an operation sees of its group: its transaction through the one write path
/// ([`Ctx::table`]), the counters, and the group's log ([`GroupLog`]).
pub(crate) struct Ctx<'g> {
    /// Private: every leaseq table is opened through [`GroupTx`], whose writes mark the
    /// group; a caller's own writes get the transaction from [`GroupTx::caller_transaction`].
    tx: &'g WriteTransaction,
    pub counters: &'g mut IdBlocks,
    log: GroupLog<'g>,
}

/// An operation's answer that it refused and wrote nothing (a stale lease, a missing job, an
/// option out of range): the group goes on without it, and its caller gets the error after
/// the commit. Any other error an operation returns aborts the group (see [`Verdict`]).
#[derive(Debug)]
pub(crate) struct Refusal(pub(crate) Error);

/// What an operation run by [`Committer::run`] answers: `Ok(Ok(v))` done, `Ok(Err(refusal))`
/// refused having written nothing (the group stays clean of it), `Err(e)` failed (the group
/// aborts; its other members run again in a new one).
pub(crate) type Verdict<T> = Result<std::result::Result<T, Refusal>>;

/// `Ok(Err(Refusal(e)))`: the refusal `e`, as a [`Verdict`].
pub(crate) fn refuse<T>(e: Error) -> Verdict<T> {
    Ok(Err(Refusal(e)))
}

/// What a group did besides its table writes, filled in by its operations through their
/// [`GroupLog`] and taken whole by the seal: the queues to wake, the change events, the
/// metrics tally. Published (woken, sent, counted) only if the group commits.
#[derive(Default)]
struct GroupRecord {
    /// The queues (numbers) in which an operation made or scheduled work: their blocked
    /// consumers wake on commit.
    wake: RefCell<Vec<u32>>,
    /// The change events, for the queues' subscribers (only while someone listens).
    events: RefCell<Vec<(u32, Event)>>,
    /// What the group's operations count in the queues' metrics (only with a
    /// [`SealWriter`]).
    tally: RefCell<Tally>,
    /// The running operation wrote and then refused on purpose
    /// ([`GroupLog::refuse_after_write`]); reset before each operation.
    refusal_wrote: Cell<bool>,
}

/// Whether a group's commit is a checkpoint: a durable redb commit (recording the journal's
/// position, with the journal on) instead of a journal frame and a non-durable commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum Checkpoint {
    /// A frame, with the journal on; per the queue's durability without it.
    #[default]
    No,
    /// A durable commit: a caller's own writes, an upgrade, a flush, a table without a type
    /// code, or the journal's bounds.
    Yes,
    /// The last checkpoint of the file's session: the close (the journal holds nothing the
    /// file needs after it).
    Closing,
}

/// The one record of what an operation does in its group, beside its writes: the write mark
/// (set by [`GroupTable`]'s writes only), the wake-ups, the events and the metrics tally. One
/// `Copy` handle: `store::Tables` holds a copy, and the committer takes the record it fills
/// at the seal.
///
/// The mark is the operation's: a group nobody marked is aborted (it wrote nothing), and a
/// refusal ([`Refusal`]) must leave it unset. It cannot be set by hand: writing around it is
/// impossible by construction, every leaseq table being a [`GroupTable`].
#[derive(Clone, Copy)]
pub(crate) struct GroupLog<'g> {
    written: &'g Cell<bool>,
    record: &'g GroupRecord,
    /// The group's frame, with the journal on: every write is recorded in it.
    frame: Option<&'g RefCell<FrameBody>>,
    /// Whether the group must be a checkpoint (see [`Checkpoint`]).
    checkpoint: &'g Cell<Checkpoint>,
    /// Whether anyone listens to the file's events (they are recorded only then).
    listening: bool,
    /// Whether the group's changes are counted (the committer has a [`SealWriter`]).
    counting: bool,
    /// The file's disk reserve, if it has one: calls that only grow the file ask it.
    reserve: Option<&'g DiskReserve>,
}

impl GroupLog<'_> {
    /// Marks the group written: it must commit. Only the write path calls it.
    fn mark(self) {
        self.written.set(true);
    }

    /// Records a change of table `name` (type code `code`) in the group's frame, with the
    /// journal on. A table without a code cannot be journaled: the group becomes a
    /// checkpoint, and a checkpoint's writes need no frame.
    fn journal(self, code: Option<u8>, record: impl FnOnce(&mut FrameBody, u8)) {
        let Some(frame) = self.frame else { return };
        if self.checkpoint.get() != Checkpoint::No {
            return;
        }
        match code {
            Some(code) => record(&mut frame.borrow_mut(), code),
            None => self.checkpoint.set(Checkpoint::Yes),
        }
    }

    /// Whether writes are being recorded in a frame (the journal is on and the group is
    /// not a checkpoint yet): a pass that must know its keys to record them asks.
    fn recording(self) -> bool {
        self.frame.is_some() && self.checkpoint.get() == Checkpoint::No
    }

    /// Makes the group a checkpoint (at least `level`): a durable redb commit.
    fn require(self, level: Checkpoint) {
        self.mark();
        if self.checkpoint.get() < level {
            self.checkpoint.set(level);
        }
    }

    /// Whether this operation has written so far.
    pub(crate) fn written(self) -> bool {
        self.written.get()
    }

    /// Lets this operation refuse after writing: its writes commit with the group, and its
    /// caller gets the refusal. The two uses, both on a cancelled delivery its group waits
    /// for (`store::fenced`): a call that ends it is refused `Cancelled`, yet it tells the
    /// group that the delivery ended; an extend of it is refused `Cancelled`, yet it moves
    /// the group's wait. Every other refusal writes nothing.
    pub(crate) fn refuse_after_write(self) {
        self.record.refusal_wrote.set(true);
    }

    /// Marks queue `queue_number` as having new work once this group commits.
    pub(crate) fn wake(self, queue_number: u32) {
        let mut list = self.record.wake.borrow_mut();
        if !list.contains(&queue_number) {
            list.push(queue_number);
        }
    }

    /// Whether anyone listens: events are recorded (an event costing a lookup can be skipped
    /// otherwise).
    pub(crate) fn listening(self) -> bool {
        self.listening
    }

    /// Counts a delivery of queue `queue_number` whose consumer ended it after it ran `ms`
    /// (in the tally's run times). Published with the group's counts.
    pub(crate) fn run(self, queue_number: u32, ms: u64) {
        if self.counting {
            self.record
                .tally
                .borrow_mut()
                .add_run(queue_number, crate::format::run_time::bucket(ms));
        }
    }

    /// Records `event` of queue `queue_number`: counted in the tally if it is a metric,
    /// kept for the subscribers if anyone listens. Published once the group commits.
    pub(crate) fn event(self, queue_number: u32, event: Event) {
        if self.counting
            && let Some(kind) = crate::events::metric_kind(&event)
        {
            self.record.tally.borrow_mut().add(queue_number, kind);
        }
        if self.listening {
            self.record.events.borrow_mut().push((queue_number, event));
        }
    }
}

/// The group's transaction as the engine uses it: the one write path. Every leaseq table is
/// opened through it as a [`GroupTable`], whose writes mark the group; the raw transaction
/// is handed out only for a caller's own writes ([`GroupTx::caller_transaction`]).
#[derive(Clone, Copy)]
pub(crate) struct GroupTx<'g> {
    tx: &'g WriteTransaction,
    log: GroupLog<'g>,
}

impl<'g> GroupTx<'g> {
    /// `StorageFull` while the file is within its disk reserve, or when `payload_bytes`
    /// would take the room above it: a call that only grows the file (an enqueue) returns it
    /// as its refusal, before its first write.
    pub(crate) fn refuse_growth(&self, payload_bytes: u64) -> Option<crate::error::Error> {
        self.log
            .reserve
            .and_then(|r| r.refuse_growth(payload_bytes))
    }

    /// Leaseq table `def` in the group's transaction: read it through `Deref`, write it
    /// through the [`GroupTable`]'s own methods.
    pub(crate) fn table<K: Key + 'static, V: Value + 'static>(
        self,
        def: TableDefinition<'static, K, V>,
    ) -> Result<GroupTable<'g, K, V>> {
        Ok(GroupTable {
            table: self.tx.open_table(def)?,
            def,
            code: self.log.frame.and_then(|_| type_code::<K, V>()),
            log: self.log,
        })
    }

    /// Creates table `def` if it does not exist (an upgrade's or a new queue's empty
    /// table): a write, so it marks the group.
    pub(crate) fn create<K: Key + 'static, V: Value + 'static>(
        self,
        def: TableDefinition<'static, K, V>,
    ) -> Result<()> {
        self.log.mark();
        self.log.journal(type_code::<K, V>(), |f, c| {
            f.create(redb::TableHandle::name(&def), c)
        });
        self.tx.open_table(def)?;
        Ok(())
    }

    /// Makes the group a checkpoint: its commit is durable (and records the journal's
    /// position), whatever the queue's durability. An upgrade, a flush.
    pub(crate) fn checkpoint(self) {
        self.log.require(Checkpoint::Yes);
    }

    /// Makes the group the session's last checkpoint (the close).
    pub(crate) fn checkpoint_closing(self) {
        self.log.require(Checkpoint::Closing);
    }

    /// The names of the tables in the file.
    pub(crate) fn list_tables(self) -> Result<impl Iterator<Item = redb::UntypedTableHandle>> {
        Ok(self.tx.list_tables()?)
    }

    /// The raw transaction, for a caller's own writes (the closure of
    /// [`Queue::write`](crate::Queue::write) or of an `ack_with`, through a
    /// [`Tx`](crate::tx::Tx)): it marks the group, since leaseq cannot see those writes. The
    /// one raw use: a journal cannot record writes of the caller's own tables, so a group
    /// that ran a caller's closure is written whole (a checkpoint), not journaled.
    pub(crate) fn caller_transaction(self) -> &'g WriteTransaction {
        self.log.require(Checkpoint::Yes);
        self.tx
    }

    /// The group's log.
    pub(crate) fn log(self) -> GroupLog<'g> {
        self.log
    }
}

impl crate::format::schema::CreateTables for GroupTx<'_> {
    fn create_table<K: Key + 'static, V: Value + 'static>(
        &self,
        def: TableDefinition<'static, K, V>,
    ) -> std::result::Result<(), redb::TableError> {
        self.log.mark();
        self.log.journal(type_code::<K, V>(), |f, c| {
            f.create(redb::TableHandle::name(&def), c)
        });
        self.tx.open_table(def).map(drop)
    }
}

/// A leaseq table opened in a group's transaction ([`GroupTx::table`]): reads through
/// `Deref` to the redb table; writes only through the methods below, each of which marks
/// the group and, with the journal on, records the change (table, key, value or removal)
/// in the group's frame. No `DerefMut`: no write can go around them.
pub(crate) struct GroupTable<'g, K: Key + 'static, V: Value + 'static> {
    table: Table<'g, K, V>,
    def: TableDefinition<'static, K, V>,
    /// The table's type code in a frame (`None` with the journal off, or for a table a
    /// frame cannot name: a write to it makes the group a checkpoint).
    code: Option<u8>,
    log: GroupLog<'g>,
}

impl<'g, K: Key + 'static, V: Value + 'static> std::ops::Deref for GroupTable<'g, K, V> {
    type Target = Table<'g, K, V>;

    fn deref(&self) -> &Table<'g, K, V> {
        &self.table
    }
}

impl<K: Key + 'static, V: Value + 'static> GroupTable<'_, K, V> {
    /// Inserts `key` → `value`, as redb's `Table::insert`.
    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
        value: impl std::borrow::Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>> {
        let (key, value) = (key.borrow(), value.borrow());
        self.log.mark();
        self.log.journal(self.code, |f, c| {
            f.put(
                redb::TableHandle::name(&self.def),
                c,
                K::as_bytes(key).as_ref(),
                V::as_bytes(value).as_ref(),
            );
        });
        Ok(self.table.insert(key, value)?)
    }

    /// Removes `key`, as redb's `Table::remove`.
    pub(crate) fn remove<'a>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>> {
        let key = key.borrow();
        self.log.mark();
        self.log.journal(self.code, |f, c| {
            f.remove(
                redb::TableHandle::name(&self.def),
                c,
                K::as_bytes(key).as_ref(),
            );
        });
        Ok(self.table.remove(key)?)
    }

    /// The value of `key` for rewriting in place, as redb's `Table::get_mut` (which copies
    /// its page for writing, found or not): a write of `key`, marked. The new value goes in
    /// through [`GroupRowMut::insert`], which records it.
    pub(crate) fn get_mut<'k>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
    ) -> Result<Option<GroupRowMut<'_, V>>> {
        let key = key.borrow();
        self.log.mark();
        let recording = self.log.recording();
        let key_bytes = if recording {
            K::as_bytes(key).as_ref().to_vec()
        } else {
            Vec::new()
        };
        let (name, code, log) = (redb::TableHandle::name(&self.def), self.code, self.log);
        Ok(self.table.get_mut(key)?.map(|guard| GroupRowMut {
            guard,
            key: key_bytes,
            name,
            code,
            log,
        }))
    }

    /// Removes every entry for which `keep` is false, as redb's `Table::retain`; with the
    /// journal on, each removed key is recorded.
    pub(crate) fn retain<F: for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool>(
        &mut self,
        keep: F,
    ) -> Result<()> {
        self.log.mark();
        if !self.log.recording() {
            return Ok(self.table.retain(keep)?);
        }
        let keep = recording_removals(self.log, self.code, self.def, keep);
        Ok(self.table.retain(keep)?)
    }

    /// Removes the entries of `range` for which `keep` is false, as redb's
    /// `Table::retain_in`; with the journal on, each removed key is recorded.
    pub(crate) fn retain_in<'a, KR, F: for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool>(
        &mut self,
        range: impl std::ops::RangeBounds<KR> + 'a,
        keep: F,
    ) -> Result<()>
    where
        KR: std::borrow::Borrow<K::SelfType<'a>> + 'a,
    {
        self.log.mark();
        if !self.log.recording() {
            return Ok(self.table.retain_in(range, keep)?);
        }
        let keep = recording_removals(self.log, self.code, self.def, keep);
        Ok(self.table.retain_in(range, keep)?)
    }
}

/// `keep` (a `retain` predicate over table `def`) that also records, in the group's frame,
/// the key of every entry it drops.
fn recording_removals<'a, K: Key + 'static, V: Value + 'static>(
    log: GroupLog<'a>,
    code: Option<u8>,
    def: TableDefinition<'static, K, V>,
    mut keep: impl for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool,
) -> impl for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool {
    let mut key = Vec::new();
    move |k: K::SelfType<'_>, v: V::SelfType<'_>| {
        key.clear();
        key.extend_from_slice(K::as_bytes(&k).as_ref());
        let kept = keep(k, v);
        if !kept {
            log.journal(code, |f, c| {
                f.remove(redb::TableHandle::name(&def), c, &key)
            });
        }
        kept
    }
}

/// A row of a [`GroupTable`] open for rewriting ([`GroupTable::get_mut`]): read it with
/// [`GroupRowMut::value`], write it with [`GroupRowMut::insert`], which records the change.
pub(crate) struct GroupRowMut<'a, V: Value + 'static> {
    guard: redb::AccessGuardMut<'a, V>,
    /// The row's key bytes (recorded with the new value; empty when not recording).
    key: Vec<u8>,
    name: &'a str,
    code: Option<u8>,
    log: GroupLog<'a>,
}

impl<V: Value + 'static> GroupRowMut<'_, V> {
    /// The row's value, as redb's `AccessGuardMut::value`.
    pub(crate) fn value(&self) -> V::SelfType<'_> {
        self.guard.value()
    }

    /// Rewrites the row with `value`, as redb's `AccessGuardMut::insert`.
    pub(crate) fn insert<'v>(
        &mut self,
        value: impl std::borrow::Borrow<V::SelfType<'v>>,
    ) -> Result<()> {
        let value = value.borrow();
        let (name, key) = (self.name, &self.key);
        self.log.journal(self.code, |f, c| {
            f.put(name, c, key, V::as_bytes(value).as_ref())
        });
        Ok(self.guard.insert(value)?)
    }
}

/// Runs `f` over group `g`'s transaction through the same write path, with a record of its
/// own that is dropped (such a write counts, wakes and tells nothing): the committer's own
/// writes at a seal (the counters, the metrics), recorded in the group's frame with the
/// journal on (a table without a type code makes the group a checkpoint, as any write).
fn write_unlogged<T>(g: &OpenGroup, f: impl FnOnce(GroupTx<'_>) -> Result<T>) -> Result<T> {
    let (written, record) = (Cell::new(false), GroupRecord::default());
    f(GroupTx {
        tx: &g.tx,
        log: GroupLog {
            written: &written,
            record: &record,
            frame: g.frame.as_ref(),
            checkpoint: &g.checkpoint,
            listening: false,
            counting: false,
            reserve: None,
        },
    })
}

impl<'g> Ctx<'g> {
    /// The group's transaction, through the one write path.
    pub(crate) fn group(&self) -> GroupTx<'g> {
        GroupTx {
            tx: self.tx,
            log: self.log,
        }
    }

    /// Leaseq table `def` in the group's transaction ([`GroupTx::table`]).
    pub(crate) fn table<K: Key + 'static, V: Value + 'static>(
        &self,
        def: TableDefinition<'static, K, V>,
    ) -> Result<GroupTable<'g, K, V>> {
        self.group().table(def)
    }

    /// The group's log: events, wake-ups, the mark.
    pub(crate) fn log(&self) -> GroupLog<'g> {
        self.log
    }

    /// Whether this operation has written so far.
    pub(crate) fn written(&self) -> bool {
        self.log.written()
    }

    /// Marks queue `queue_number` as having new work once this group commits.
    pub(crate) fn wake(&mut self, queue_number: u32) {
        self.log.wake(queue_number);
    }

    /// The next id this file hands out: every id below it was handed out (and may name a
    /// job, or one that ended); none at or above it was.
    pub(crate) fn next_id(&self) -> u64 {
        self.counters.next_id
    }

    pub(crate) fn alloc_id(&mut self) -> u64 {
        let c = &mut *self.counters;
        IdBlocks::take(&mut c.next_id, &mut c.id_end)
    }

    /// A ready-queue position: from the token counter, so increasing and unique.
    pub(crate) fn alloc_seq(&mut self) -> u64 {
        self.alloc_token()
    }

    pub(crate) fn alloc_token(&mut self) -> u64 {
        let c = &mut *self.counters;
        IdBlocks::take(&mut c.next_token, &mut c.token_end)
    }
}

#[derive(Debug, Clone)]
enum GroupResult {
    Committed,
    Replay,
    Failed(String),
}

struct OpenGroup {
    tx: WriteTransaction,
    counters: IdBlocks,
    counters_at_start: IdBlocks,
    dirty: bool,
    /// What the group's operations did besides their writes (see [`GroupLog`]).
    record: GroupRecord,
    /// The group's frame: its changes, with the journal on.
    frame: Option<RefCell<FrameBody>>,
    /// Whether the group is a checkpoint.
    checkpoint: Cell<Checkpoint>,
    members: usize,
    /// Members other than the leader, parked until the result is set (woken one by one
    /// with `unpark`: no condvar, so they never queue on the group mutex to read it).
    waiters: Vec<std::thread::Thread>,
    seq: u64,
    /// Whether this group commits with `Durability::Immediate` (with the journal on, or if
    /// it becomes a checkpoint, decided at its seal).
    durable: bool,
    opened_at: Instant,
    result: Arc<OnceLock<GroupResult>>,
}

#[derive(Default)]
struct State {
    open: Option<OpenGroup>,
    sealing: bool,
    /// Set after a failed commit: redb refuses writes on this handle until it is reopened.
    poisoned: Option<String>,
    /// Commits since the last durable one (`Durability::None` only).
    non_durable_commits: u64,
    /// The counters as of the last commit (read from `leaseq_meta` by the first group).
    counters: Option<IdBlocks>,
    stats: CommitStats,
    /// Sequence number of the next group to open.
    next_seq: u64,
    /// Members of group `returning_seq` (the last committed) not yet back with a new call.
    returning: usize,
    returning_seq: u64,
    /// How long the last commit took: a group waits at most twice that for its members.
    last_commit: Duration,
}

/// Group-commit counters of one queue handle since it was opened, from
/// [`Queue::commit_stats`](crate::Queue::commit_stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Groups that wrote and were committed (each one redb commit, one fsync when durable).
    pub commits: u64,
    /// Operations answered by those commits (`operations / commits` is the mean group size).
    pub operations: u64,
    /// Groups that wrote nothing (only refusals or empty sweeps) and were closed without a
    /// commit.
    pub aborted_clean: u64,
    /// Groups aborted by a failing operation (an `ack_with` closure error, a storage error);
    /// their other members, if any, ran again in a new group.
    pub replayed: u64,
    /// Time spent inside redb commits (the fsync included), in microseconds.
    pub commit_micros: u64,
    /// Time groups spent open, from their first operation to their seal, in microseconds.
    pub gather_micros: u64,
    /// Of `commits`, with the journal on: groups written as a journal frame (one
    /// `fdatasync` of the journal) and a redb commit without an fsync.
    pub journal_frames: u64,
    /// Of `commits`, with the journal on: checkpoints (durable redb commits recording the
    /// journal's position): groups with a caller's own writes, flushes, the close, and
    /// the journal's bounds (size, frames, time).
    pub checkpoints: u64,
    /// Groups sealed because their gathering bound passed (twice the last commit, at most
    /// 2 ms) while callers were still expected, rather than because every expected caller
    /// had joined or the group was full. A lone caller never adds to it.
    pub deadline_seals: u64,
}

/// Durability of the queue's commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every call returns after the fsync that covers it (shared by the calls of a group).
    #[default]
    Immediate,
    /// Calls return before their commit is durable (redb `Durability::None`). A crash or
    /// power loss may lose every call since the last durable commit: enqueues that returned
    /// `Ok`, acks, leases; the job ids and lease tokens those calls returned may then be
    /// handed out again. leaseq makes every 256th commit durable, and
    /// [`Queue::flush`](crate::Queue::flush) makes everything so far durable.
    None,
}

pub(crate) struct Committer {
    /// Unique per committer, for the thread-locals `IN_GROUP` and `LAST_GROUP`.
    id: u64,
    state: Mutex<State>,
    /// Callers waiting to join while a group is sealing (notified when the seal ends).
    enter_cv: Condvar,
    /// The leader of the open group (the member that opened it) waiting to seal it:
    /// notified when the last arrival leaves, the last returning member is back, or the
    /// group fills up. Only the leader waits here, so nobody else wakes for these events.
    leader_cv: Condvar,
    arrivals: AtomicUsize,
    durability: Durability,
    quick_repair: bool,
    /// Blocked consumers wait on it; shared with the queue's clock (see `ClockWaker`).
    work: Arc<QueueSignals>,
    /// The subscribers of the file's change events.
    hub: EventHub,
    /// Writes what a group's commit adds besides its operations' writes (the metrics, from
    /// its tally); `None` counts nothing (a committer that is not a queue's).
    seal_writer: Option<Arc<dyn SealWriter>>,
    /// The file's journal, if it is on: groups write frames into it, and checkpoints. Only
    /// the sealing leader locks it.
    journal: Option<Mutex<Journal>>,
    /// The file's disk reserve (a file with a path): looked at before each commit that
    /// writes.
    reserve: Option<Arc<DiskReserve>>,
}

/// What a group's commit writes besides its operations' writes: a file's metrics, from the
/// group's tally (`file::FileMetrics`, so the committer names no engine code). Given the
/// tally of a group that wrote, in its transaction before its commit; then told whether the
/// commit landed (what it took out of a buffer for the write goes back if not).
pub(crate) trait SealWriter: Send + Sync {
    /// Writes what is due with this group, whose operations counted `tally`.
    fn write(&self, tally: Tally, tx: GroupTx<'_>) -> Result<()>;
    /// The group's commit landed (`true`) or not, after [`SealWriter::write`] ran or not.
    fn settle(&self, landed: bool);
}

impl Committer {
    pub(crate) fn new(durability: Durability, quick_repair: bool) -> Committer {
        Committer {
            id: NEXT_COMMITTER_ID.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::default()),
            enter_cv: Condvar::new(),
            leader_cv: Condvar::new(),
            arrivals: AtomicUsize::new(0),
            durability,
            quick_repair,
            work: Arc::new(QueueSignals::default()),
            hub: EventHub::default(),
            seal_writer: None,
            journal: None,
            reserve: None,
        }
    }

    /// This committer with the file's disk reserve: it looks at the disk before each commit
    /// that writes, refuses growth while the file is full, and publishes the state's turns.
    pub(crate) fn with_reserve(mut self, reserve: Arc<DiskReserve>) -> Committer {
        self.reserve = Some(reserve);
        self
    }

    /// The file's disk reserve, if it has one.
    pub(crate) fn reserve(&self) -> Option<&DiskReserve> {
        self.reserve.as_deref()
    }

    /// This committer writing its groups through `journal` (see `crate::journal`).
    pub(crate) fn with_journal(mut self, journal: Journal) -> Committer {
        self.journal = Some(Mutex::new(journal));
        self
    }

    /// Whether groups are journaled.
    pub(crate) fn journaling(&self) -> bool {
        self.journal.is_some()
    }

    /// This committer with its groups' tallies counted and written by `writer` (a queue's
    /// committer: the file's metrics).
    pub(crate) fn with_seal_writer(mut self, writer: Arc<dyn SealWriter>) -> Committer {
        self.seal_writer = Some(writer);
        self
    }

    /// Runs `op` inside a group transaction and returns its result once the group's commit
    /// is durable (per the queue's durability). `op` may run more than once (replay after
    /// another member's failure); it must only touch the transaction and the context.
    ///
    /// # Errors
    /// `op`'s own error; `Reentrant` from inside another operation; `CommitFailed` if the
    /// commit failed (now or earlier on this handle); storage errors from `begin_write`.
    pub(crate) fn run<T>(
        &self,
        db: &Database,
        op: &mut dyn FnMut(&mut Ctx<'_>) -> Verdict<T>,
    ) -> Result<T> {
        self.ensure_not_reentrant()?;
        loop {
            self.arrivals.fetch_add(1, Ordering::SeqCst);
            let mut st = self.state.lock();
            let (value, result, leader) = self.join(db, &mut st, op)?;
            match self.await_group(&mut st, &result, leader) {
                GroupResult::Committed => return value,
                GroupResult::Replay => continue,
                GroupResult::Failed(detail) => return Err(Error::CommitFailed { detail }),
            }
        }
    }

    /// Opens a group if none is open, applies `op` to it and returns `op`'s value, the
    /// group's result cell, and whether this call opened the group (is its leader).
    /// Decrements `arrivals` on every path.
    #[allow(clippy::type_complexity)]
    fn join<T>(
        &self,
        db: &Database,
        st: &mut parking_lot::MutexGuard<'_, State>,
        op: &mut dyn FnMut(&mut Ctx<'_>) -> Verdict<T>,
    ) -> Result<(Result<T>, Arc<OnceLock<GroupResult>>, bool)> {
        let leave = || {
            if self.arrivals.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.leader_cv.notify_one();
            }
        };
        // Wait while a group is sealing, or while the open one is full (its leader has been
        // told to seal it), so no group takes more than `GROUP_MEMBERS_MAX` operations.
        while st.poisoned.is_none()
            && (st.sealing
                || st
                    .open
                    .as_ref()
                    .is_some_and(|g| g.members >= GROUP_MEMBERS_MAX))
        {
            self.enter_cv.wait(st);
        }
        if let Some(detail) = &st.poisoned {
            leave();
            return Err(Error::CommitFailed {
                detail: detail.clone(),
            });
        }
        let leader = st.open.is_none();
        if leader {
            let begun = catch_engine_panic(|| self.begin(db, st.non_durable_commits, st.counters));
            match begun {
                Ok(mut g) => {
                    g.seq = st.next_seq;
                    st.next_seq += 1;
                    st.open = Some(g);
                }
                Err(e) => {
                    leave();
                    return Err(e);
                }
            }
        }
        let me = self.id;
        if LAST_GROUP.with(|c| c.get()) == (me, st.returning_seq) && st.returning > 0 {
            st.returning -= 1;
            if st.returning == 0 {
                self.leader_cv.notify_one();
            }
        }
        let g = st.open.as_mut().expect("a group is open");
        LAST_GROUP.with(|c| c.set((me, g.seq)));
        IN_GROUP.with(|c| c.borrow_mut().push(me));
        // Caller closures run under their own catch_unwind (ack_with), so a panic here is the
        // storage engine's: `Corrupted`, and the group aborts as for any other failure.
        let written = Cell::new(false);
        g.record.refusal_wrote.set(false);
        let applied = catch_engine_panic(|| {
            let mut ctx = Ctx {
                tx: &g.tx,
                counters: &mut g.counters,
                log: GroupLog {
                    written: &written,
                    record: &g.record,
                    frame: g.frame.as_ref(),
                    checkpoint: &g.checkpoint,
                    // Looked at per operation: a call made after a subscription returned is
                    // recorded whatever group it joins.
                    listening: self.hub.listening(),
                    counting: self.seal_writer.is_some(),
                    reserve: self.reserve.as_deref(),
                },
            };
            op(&mut ctx)
        });
        g.dirty |= written.get();
        IN_GROUP.with(|c| {
            let popped = c.borrow_mut().pop();
            debug_assert_eq!(popped, Some(me), "IN_GROUP is a stack");
        });
        leave();
        match applied {
            Ok(Ok(v)) => self.count_member(g, leader, Ok(v)),
            // The pair of "validate before writing": a refusal wrote nothing. One that did
            // would commit half an operation its caller was told was refused, so the group
            // aborts instead (and debug builds stop here).
            Ok(Err(Refusal(e))) if !written.get() || g.record.refusal_wrote.get() => {
                self.count_member(g, leader, Err(e))
            }
            Ok(Err(Refusal(e))) => {
                self.abort_open(st);
                debug_assert!(false, "an operation wrote, then refused: {e}");
                Err(e)
            }
            Err(e) => {
                self.abort_open(st);
                Err(e)
            }
        }
    }

    /// Counts a member that answered (done or refused) into the open group `g`, telling its
    /// leader when the group is full.
    #[allow(clippy::type_complexity)]
    fn count_member<T>(
        &self,
        g: &mut OpenGroup,
        leader: bool,
        answer: Result<T>,
    ) -> Result<(Result<T>, Arc<OnceLock<GroupResult>>, bool)> {
        g.members += 1;
        if g.members >= GROUP_MEMBERS_MAX {
            self.leader_cv.notify_one();
        }
        Ok((answer, g.result.clone(), leader))
    }

    fn begin(
        &self,
        db: &Database,
        non_durable_commits: u64,
        cached: Option<IdBlocks>,
    ) -> Result<OpenGroup> {
        let mut tx = db.begin_write()?;
        let durable = match self.durability {
            // With the journal, the seal decides: a frame and a non-durable commit, or a
            // checkpoint.
            _ if self.journal.is_some() => false,
            Durability::Immediate => true,
            Durability::None => non_durable_commits + 1 >= NON_DURABLE_COMMITS_MAX,
        };
        if !durable {
            tx.set_durability(redb::Durability::None)
                .map_err(|e| Error::Storage(e.into()))?;
        }
        if self.quick_repair {
            tx.set_quick_repair(true);
        }
        let counters = match cached {
            Some(c) => c,
            None => IdBlocks::read(&tx)?,
        };
        Ok(OpenGroup {
            tx,
            counters,
            counters_at_start: counters,
            dirty: false,
            record: GroupRecord::default(),
            frame: self.journal.as_ref().map(|_| RefCell::default()),
            checkpoint: Cell::new(Checkpoint::No),
            members: 0,
            waiters: Vec::new(),
            seq: 0,
            durable,
            opened_at: Instant::now(),
            result: Arc::new(OnceLock::new()),
        })
    }

    /// Aborts the open group: its members replay in a new group.
    fn abort_open(&self, st: &mut State) {
        if let Some(g) = st.open.take() {
            st.stats.replayed += 1;
            let _ = g.result.set(GroupResult::Replay);
            // An abort error leaves nothing to undo: the transaction is dropped either way.
            let _ = catch_unwind(AssertUnwindSafe(|| g.tx.abort()));
            self.leader_cv.notify_all();
            g.waiters.iter().for_each(std::thread::Thread::unpark);
        }
    }

    /// Waits until the member's group has a result; the group's leader seals it when it is
    /// ready.
    fn await_group(
        &self,
        st: &mut parking_lot::MutexGuard<'_, State>,
        result: &Arc<OnceLock<GroupResult>>,
        leader: bool,
    ) -> GroupResult {
        if !leader {
            return self.await_result(st, result);
        }
        loop {
            if let Some(r) = result.get() {
                return r.clone();
            }
            let mine_open = st
                .open
                .as_ref()
                .is_some_and(|g| Arc::ptr_eq(&g.result, result));
            if mine_open {
                let g = st.open.as_ref().expect("checked");
                let deadline = g.opened_at + (st.last_commit * 2).min(GATHER_MAX);
                let complete = (self.arrivals.load(Ordering::SeqCst) == 0 && st.returning == 0)
                    || g.members >= GROUP_MEMBERS_MAX;
                let expired = !complete && Instant::now() >= deadline;
                if expired {
                    st.stats.deadline_seals += 1;
                }
                if complete || expired {
                    self.seal(st);
                    continue;
                }
                self.leader_cv.wait_until(st, deadline);
            } else {
                // Unreachable: only the leader seals its group, and an abort sets the result
                // before removing it. Waiting for the end of a seal is correct regardless.
                debug_assert!(false, "a leader's group closed without a result");
                self.enter_cv.wait(st);
            }
        }
    }

    /// A member that is not the leader: parks, outside the group mutex, until its group's
    /// result is set (the sealer or an abort unparks every registered member).
    fn await_result(
        &self,
        st: &mut parking_lot::MutexGuard<'_, State>,
        result: &Arc<OnceLock<GroupResult>>,
    ) -> GroupResult {
        if let Some(r) = result.get() {
            return r.clone();
        }
        // The member joined under this same lock hold, so its group is still open.
        match st.open.as_mut() {
            Some(g) if Arc::ptr_eq(&g.result, result) => {
                g.waiters.push(std::thread::current());
                parking_lot::MutexGuard::unlocked(st, || {
                    loop {
                        if let Some(r) = result.get() {
                            return r.clone();
                        }
                        std::thread::park();
                    }
                })
            }
            _ => {
                debug_assert!(false, "a member's group closed before it waited");
                loop {
                    if let Some(r) = result.get() {
                        return r.clone();
                    }
                    self.enter_cv.wait(st);
                }
            }
        }
    }

    /// Commits the open group outside the mutex, then publishes its result.
    fn seal(&self, st: &mut parking_lot::MutexGuard<'_, State>) {
        let mut g = st.open.take().expect("sealing an open group");
        let waiters = std::mem::take(&mut g.waiters);
        debug_assert!(g.counters.next_id >= g.counters_at_start.next_id);
        debug_assert!(g.counters.next_token >= g.counters_at_start.next_token);
        st.sealing = true;
        // What the group did, taken whole: published below if it committed, its tally
        // written with its commit.
        let GroupRecord {
            wake,
            events,
            tally,
            refusal_wrote: _,
        } = std::mem::take(&mut g.record);
        let counters = g.counters;
        let (members, dirty, seq, durable) = (g.members, g.dirty, g.seq, g.durable);
        let result_cell = g.result.clone();
        let started = Instant::now();
        st.stats.gather_micros += u64::try_from((started - g.opened_at).as_micros()).unwrap_or(0);
        let writer = self.seal_writer.as_deref();
        let journal = self.journal.as_ref();
        let reserve = self.reserve.as_deref();
        let outcome = parking_lot::MutexGuard::unlocked(st, || {
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                commit_group(g, tally.into_inner(), writer, journal, reserve)
            }))
            .unwrap_or_else(|_| Err("storage engine panicked during commit".to_string()));
            if let Some(writer) = writer
                && dirty
            {
                writer.settle(outcome.is_ok());
            }
            outcome
        });
        st.sealing = false;
        st.last_commit = started.elapsed();
        st.stats.commit_micros += u64::try_from(st.last_commit.as_micros()).unwrap_or(0);
        st.returning_seq = seq;
        // Waiting for returning members pays only when the group had company: a lone
        // caller's next call (or another thread taking turns with it) must not wait for it.
        st.returning = if outcome.is_ok() && members > 1 {
            members
        } else {
            0
        };
        let result = match outcome {
            Ok(sealed) => {
                st.counters = Some(counters);
                if dirty {
                    match sealed {
                        Sealed::Frame => st.stats.journal_frames += 1,
                        Sealed::Checkpoint => st.stats.checkpoints += 1,
                        Sealed::Plain => {}
                    }
                }
                if dirty {
                    // Only a group that really committed counts towards (or is) the periodic
                    // durable commit; a clean group was aborted and made nothing durable.
                    st.non_durable_commits = if durable {
                        0
                    } else {
                        st.non_durable_commits + 1
                    };
                    st.stats.commits += 1;
                    st.stats.operations += members as u64;
                } else {
                    st.stats.aborted_clean += 1;
                }
                GroupResult::Committed
            }
            Err(detail) => {
                st.poisoned = Some(detail.clone());
                GroupResult::Failed(detail)
            }
        };
        let committed = matches!(result, GroupResult::Committed);
        // Published before anyone is answered: a call that returned finds its events there.
        if committed && dirty {
            self.hub.publish(events.into_inner());
        }
        if let Some(reserve) = reserve {
            if !committed {
                reserve.record_lost();
            }
            for turn in reserve.take_turns() {
                self.hub.publish_file(match turn {
                    Turned::Full(since_ms) => Event::StorageFull { since_ms },
                    Turned::Ok => Event::StorageAvailable,
                });
            }
        }
        let _ = result_cell.set(result);
        waiters.iter().for_each(std::thread::Thread::unpark);
        self.enter_cv.notify_all();
        if committed {
            for queue_number in wake.into_inner() {
                self.work.notify(queue_number);
            }
        }
    }

    /// Whether this thread is inside an operation of any committer (an `ack_with` or `write`
    /// closure): the async face refuses to wait there for a helper that would wait for it.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn in_any_group() -> bool {
        IN_GROUP.with(|c| !c.borrow().is_empty())
    }

    /// `Reentrant` when called from inside one of this committer's operations (an
    /// `ack_with` closure): the group mutex and redb's write slot are held there.
    pub(crate) fn ensure_not_reentrant(&self) -> Result<()> {
        if IN_GROUP.with(|c| c.borrow().contains(&self.id)) {
            return Err(Error::Reentrant);
        }
        Ok(())
    }

    pub(crate) fn stats(&self) -> CommitStats {
        self.state.lock().stats
    }

    /// Unique per committer: which queue a lease came from.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// `CommitFailed` if a commit failed on this handle (redb refuses writes until reopened).
    pub(crate) fn ensure_not_poisoned(&self) -> Result<()> {
        match &self.state.lock().poisoned {
            Some(detail) => Err(Error::CommitFailed {
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Marks the handle failed, as after a failed commit: every later write is `CommitFailed`.
    pub(crate) fn poison(&self, detail: String) {
        self.state.lock().poisoned.get_or_insert(detail);
    }

    /// What blocked consumers wait on.
    pub(crate) fn work(&self) -> &Arc<QueueSignals> {
        &self.work
    }

    /// The subscribers of the file's change events.
    pub(crate) fn hub(&self) -> &EventHub {
        &self.hub
    }
}

fn commit_group(
    g: OpenGroup,
    tally: Tally,
    writer: Option<&dyn SealWriter>,
    journal: Option<&Mutex<Journal>>,
    reserve: Option<&DiskReserve>,
) -> std::result::Result<Sealed, String> {
    let _span = tracing::debug_span!(
        "leaseq.commit",
        members = g.members,
        durable = g.durable,
        dirty = g.dirty
    )
    .entered();
    let members = g.members;
    let r = commit_group_inner(g, tally, writer, journal, reserve);
    if let Err(e) = &r {
        tracing::error!(members, error = %e, "leaseq: group commit failed");
    }
    r
}

fn commit_group_inner(
    g: OpenGroup,
    tally: Tally,
    writer: Option<&dyn SealWriter>,
    journal: Option<&Mutex<Journal>>,
    reserve: Option<&DiskReserve>,
) -> std::result::Result<Sealed, String> {
    // The disk looked at before the write: a file turning full gives its reserve file back
    // first, and while it is full or near it each group is a checkpoint, so the pages its
    // acks free are reused by the next group rather than held until the next checkpoint. A
    // group that wrote nothing looks when a refused call asked (the state may have ended).
    if let Some(reserve) = reserve
        && (g.dirty || reserve.look_wanted())
    {
        reserve.look(&g.tx);
        if reserve.checkpoint_each_group() && g.checkpoint.get() == Checkpoint::No {
            g.checkpoint.set(Checkpoint::Yes);
        }
    }
    if !g.dirty {
        debug_assert_eq!(
            g.counters, g.counters_at_start,
            "counters moved without a write"
        );
        // Nothing was written: no fsync needed, and every member read committed state.
        return g
            .tx
            .abort()
            .map(|()| Sealed::Plain)
            .map_err(|e| e.to_string());
    }
    let err = |e: &dyn std::fmt::Display| e.to_string();
    // The committer's own writes, through the write path too (into the frame).
    write_unlogged(&g, |tx| {
        if g.counters.reserved_moved(&g.counters_at_start) {
            g.counters.write(tx)?;
        }
        if let Some(since_ms) = reserve.and_then(DiskReserve::to_record) {
            tx.table(META)?.insert(META_STORAGE_FULL_MS, since_ms)?;
        }
        match writer {
            Some(writer) => writer.write(tally, tx),
            None => Ok(()),
        }
    })
    .map_err(|e| err(&e))?;
    let mut tx = g.tx;
    let Some(journal) = journal else {
        if g.checkpoint.get() != Checkpoint::No && !g.durable {
            tx.set_durability(redb::Durability::Immediate)
                .map_err(|e| err(&e))?;
        }
        return tx.commit().map(|()| Sealed::Plain).map_err(|e| err(&e));
    };
    let mut journal = journal.lock();
    let mut checkpoint = g.checkpoint.get();
    if checkpoint == Checkpoint::No && journal.checkpoint_due(std::time::Instant::now()) {
        checkpoint = Checkpoint::Yes;
    }
    let frame = g.frame.as_ref().map(RefCell::borrow);
    if checkpoint == Checkpoint::No
        && let Some(frame) = frame.as_deref()
        && !frame.is_empty()
    {
        // The frame durable first: the group is answered once it is, and a crash from here
        // on replays it at the next open. Then redb's own commit, without an fsync.
        match journal.append(frame) {
            Ok(true) => {}
            Ok(false) => checkpoint = Checkpoint::Yes,
            Err(e) => return Err(format!("journal: {e}")),
        }
    }
    if checkpoint == Checkpoint::No {
        return tx.commit().map(|()| Sealed::Frame).map_err(|e| err(&e));
    }
    // A checkpoint: a durable commit recording the last frame it holds.
    journal
        .state(checkpoint != Checkpoint::Closing)
        .write(&tx)
        .map_err(|e| err(&e))?;
    tx.set_durability(redb::Durability::Immediate)
        .map_err(|e| err(&e))?;
    tx.commit().map_err(|e| err(&e))?;
    journal.checkpointed();
    Ok(Sealed::Checkpoint)
}

/// How a group's commit went to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sealed {
    /// Without the journal: per the queue's durability (or aborted, having written nothing).
    Plain,
    /// A journal frame and a non-durable redb commit.
    Frame,
    /// A checkpoint (with the journal on).
    Checkpoint,
}

#[cfg(test)]
mod tests {
    //! The contract between the committer and the operations it runs: a write through the
    //! one path marks the group and commits it; a group that wrote nothing is aborted; a
    //! failure or a refusal after a write aborts the group; what a refused call or an aborted
    //! group logged (events, wake-ups, tally) is neither published nor counted. A write that
    //! does not mark cannot be written: every leaseq table is a [`GroupTable`] (see
    //! [`GroupLog`]), so no test of one.

    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const ROWS: TableDefinition<u64, u64> = TableDefinition::new("rows");

    /// A file with the counters a group reads, and a committer over it.
    fn setup() -> (tempfile::TempDir, Database, Committer) {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("c.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let mut meta = tx.open_table(META).unwrap();
            meta.insert(META_NEXT_ID, 1).unwrap();
            meta.insert(META_NEXT_TOKEN, 1).unwrap();
        }
        tx.commit().unwrap();
        (dir, db, Committer::new(Durability::Immediate, false))
    }

    /// Row `k` as committed; `None` also when no commit ever created the table (a group
    /// that aborted, as every group of a test may have).
    fn row(db: &Database, k: u64) -> Option<u64> {
        let rtx = db.begin_read().unwrap();
        let t = match rtx.open_table(ROWS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return None,
            Err(e) => panic!("{e}"),
        };
        t.get(k).unwrap().map(|v| v.value())
    }

    /// Writes row `k` through the one write path, as the engine's writes do.
    fn put(ctx: &mut Ctx<'_>, k: u64) -> Result<()> {
        ctx.table(ROWS)?.insert(k, k)?;
        Ok(())
    }

    /// A writer that counts what it is given and how the commits it wrote with settled.
    #[derive(Default)]
    struct Counting {
        /// The rows of each tally given, at minute 1.
        tallies: Mutex<Vec<Vec<crate::metrics::MetricRow>>>,
        settled: Mutex<Vec<bool>>,
    }

    impl SealWriter for Counting {
        fn write(&self, tally: Tally, _tx: GroupTx<'_>) -> Result<()> {
            self.tallies.lock().push(tally.rows(60_000));
            Ok(())
        }

        fn settle(&self, landed: bool) {
            self.settled.lock().push(landed);
        }
    }

    #[test]
    fn a_write_through_the_one_path_marks_the_group_and_commits_it() {
        let (_dir, db, c) = setup();
        let marked = c
            .run(&db, &mut |ctx| {
                assert!(!ctx.written());
                put(ctx, 1)?;
                Ok(Ok(ctx.written()))
            })
            .unwrap();
        assert!(marked);
        assert_eq!((c.stats().commits, c.stats().aborted_clean), (1, 0));
        assert_eq!(row(&db, 1), Some(1));
    }

    #[test]
    fn a_read_marks_nothing_and_a_group_that_wrote_nothing_is_aborted() {
        let (_dir, db, c) = setup();
        c.run(&db, &mut |ctx| {
            let meta = ctx.table(META)?;
            assert!(meta.get(META_NEXT_ID)?.is_some());
            Ok(Ok(()))
        })
        .unwrap();
        let stats = c.stats();
        assert_eq!((stats.commits, stats.aborted_clean), (0, 1));
    }

    #[test]
    fn a_caller_transaction_marks_the_group() {
        // A caller's closure writes tables leaseq cannot see: handing it the transaction
        // marks the group, so its writes commit.
        let (_dir, db, c) = setup();
        c.run(&db, &mut |ctx| {
            let tx = ctx.group().caller_transaction();
            tx.open_table(ROWS)?.insert(5, 5)?;
            Ok(Ok(()))
        })
        .unwrap();
        assert_eq!(row(&db, 5), Some(5));
    }

    #[test]
    fn a_marked_write_commits_and_a_refusal_is_answered_after_it() {
        let (_dir, db, c) = setup();
        c.run(&db, &mut |ctx| put(ctx, 1).map(Ok)).unwrap();
        let e = c
            .run(&db, &mut |_ctx| {
                refuse::<()>(Error::invalid_option("x", "no"))
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
        let stats = c.stats();
        assert_eq!(
            (stats.commits, stats.aborted_clean, stats.replayed),
            (1, 1, 0)
        );
        assert_eq!(row(&db, 1), Some(1));
    }

    #[test]
    fn the_log_of_a_committed_group_is_published_and_of_an_aborted_one_dropped() {
        let (_dir, db, c) = setup();
        let writer = Arc::new(Counting::default());
        let c = c.with_seal_writer(writer.clone());
        let events = c.hub().subscribe(1, 16).expect("a subscription");
        let signal = c.work().of(1);
        let done = |ctx: &mut Ctx<'_>, k: u64| -> Result<()> {
            put(ctx, k)?;
            ctx.log().event(
                1,
                Event::Enqueued {
                    id: crate::job::JobId(k),
                },
            );
            ctx.wake(1);
            Ok(())
        };
        // A failure after the log was written: nothing of it is published or counted.
        let e = c
            .run(&db, &mut |ctx| {
                done(ctx, 2)?;
                Err::<std::result::Result<(), Refusal>, _>(Error::corrupted("boom"))
            })
            .unwrap_err();
        assert!(matches!(e, Error::Corrupted { .. }), "{e:?}");
        assert!(events.try_recv().is_none());
        assert!(
            writer.tallies.lock().is_empty(),
            "an aborted group counts nothing"
        );
        assert_eq!(signal.epoch(), 0, "an aborted group wakes no one");
        // A refused call records nothing; the group's other member commits and publishes.
        let e = c
            .run(&db, &mut |_ctx| {
                refuse::<()>(Error::invalid_option("x", "no"))
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
        c.run(&db, &mut |ctx| done(ctx, 3).map(Ok)).unwrap();
        assert_eq!(
            events.try_recv(),
            Some(Event::Enqueued {
                id: crate::job::JobId(3)
            })
        );
        assert!(events.try_recv().is_none());
        assert_eq!(*writer.tallies.lock(), vec![vec![(1, 0, 1, 1)]]);
        assert_eq!(*writer.settled.lock(), vec![true]);
        assert_eq!(signal.epoch(), 1, "a committed group wakes its queues once");
    }

    #[test]
    fn a_failure_after_a_write_aborts_the_group() {
        let (_dir, db, c) = setup();
        let e = c
            .run(&db, &mut |ctx| {
                put(ctx, 2)?;
                Err::<std::result::Result<(), Refusal>, _>(Error::corrupted("boom"))
            })
            .unwrap_err();
        assert!(matches!(e, Error::Corrupted { .. }), "{e:?}");
        assert_eq!(c.stats().replayed, 1);
        c.run(&db, &mut |ctx| put(ctx, 3).map(Ok)).unwrap();
        assert_eq!((row(&db, 2), row(&db, 3)), (None, Some(3)));
    }

    /// The pair assertion: an operation that wrote and then refused would commit half of
    /// itself under a refusal. Debug builds stop there; release builds abort the group.
    #[test]
    #[cfg_attr(
        debug_assertions,
        should_panic(expected = "an operation wrote, then refused")
    )]
    fn a_refusal_after_a_write_aborts_the_group() {
        let (_dir, db, c) = setup();
        let e = c
            .run(&db, &mut |ctx| {
                put(ctx, 4)?;
                refuse::<()>(Error::invalid_option("x", "too late"))
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
        assert_eq!(c.stats().replayed, 1);
        assert_eq!(row(&db, 4), None);
    }
}
