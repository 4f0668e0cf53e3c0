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
//! [`Refusal`] (see [`Verdict`]), and its [`WriteMark`] must be unset (checked: a refusal
//! after a write aborts the group). An operation that fails (an `ack_with` closure error, a
//! storage error) aborts the whole group:
//! its caller gets the error at once, and every other member runs its operation again in a
//! fresh group (`Replay`). A group that wrote nothing is aborted instead of committed, so a
//! refused call costs no fsync.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redb::{Database, ReadableTable, WriteTransaction};

use crate::error::{Error, Result, catch_engine_panic};
use crate::events::{Event, EventHub, EventSink};
use crate::format::schema::{META, META_NEXT_ID, META_NEXT_TOKEN};
use crate::limits::{COUNTER_BLOCK, GATHER_MAX, GROUP_MEMBERS_MAX, NON_DURABLE_COMMITS_MAX};
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

    fn write(&self, tx: &WriteTransaction) -> Result<()> {
        let mut meta = tx.open_table(META)?;
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

/// What an operation sees of its group: the transaction, the counters, the mark it leaves
/// when it writes, and the queues in which it made work available.
pub(crate) struct Ctx<'g> {
    /// For reads and for opening `store::Tables`, whose write accessors mark the group
    /// themselves. A write straight through the transaction (the file's meta, the queue
    /// registry, the applied markers, a caller's closure) calls [`Ctx::mark_written`].
    pub tx: &'g WriteTransaction,
    pub counters: &'g mut IdBlocks,
    written: WriteMark<'g>,
    /// The queues (numbers) in which an operation made or scheduled work: their blocked
    /// consumers wake on commit.
    wake: WakeList<'g>,
    /// What the operations did, for the queues' subscribers (published on commit).
    pub events: EventSink<'g>,
}

/// Set by every write of one operation: the group must commit. A group no operation marked
/// is aborted (it wrote nothing), so a write that does not mark is lost although its caller
/// was answered `Ok`; that is why writes mark themselves (the `store::Tables` write
/// accessors hold a copy). A refusal ([`Refusal`]) must leave it unset.
#[derive(Clone, Copy)]
pub(crate) struct WriteMark<'g>(&'g Cell<bool>);

impl WriteMark<'_> {
    pub(crate) fn set(self) {
        self.0.set(true);
    }
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

impl<'g> Ctx<'g> {
    /// Marks the group written: it must commit.
    pub(crate) fn mark_written(&self) {
        self.written.set();
    }

    /// The mark, for tables that write on this operation's behalf.
    pub(crate) fn write_mark(&self) -> WriteMark<'g> {
        self.written
    }

    /// Whether this operation has written so far.
    pub(crate) fn written(&self) -> bool {
        self.written.0.get()
    }
}

/// The queues whose blocked consumers wake when the group commits; a copy goes to the
/// `store::Tables` of each operation, whose index changes can make work available (a
/// group's next job).
#[derive(Clone, Copy)]
pub(crate) struct WakeList<'g>(&'g RefCell<Vec<u32>>);

impl WakeList<'_> {
    /// Marks queue `queue_number` as having new work once this group commits.
    pub(crate) fn wake(self, queue_number: u32) {
        let mut list = self.0.borrow_mut();
        if !list.contains(&queue_number) {
            list.push(queue_number);
        }
    }
}

impl<'g> Ctx<'g> {
    /// Marks queue `queue_number` as having new work once this group commits.
    pub(crate) fn wake(&mut self, queue_number: u32) {
        self.wake.wake(queue_number);
    }

    /// The group's wake list, for tables that make work available on the operation's behalf.
    pub(crate) fn wake_list(&self) -> WakeList<'g> {
        self.wake
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
    wake: RefCell<Vec<u32>>,
    events: std::cell::RefCell<Vec<(u32, Event)>>,
    /// What the group's operations count in the queues' metrics (written by its commit).
    tally: RefCell<crate::metrics::Tally>,
    members: usize,
    /// Members other than the leader, parked until the result is set (woken one by one
    /// with `unpark`: no condvar, so they never queue on the group mutex to read it).
    waiters: Vec<std::thread::Thread>,
    seq: u64,
    /// Whether this group commits with `Durability::Immediate`.
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
    /// Metrics counted by committed groups and not yet written (see [`PendingMetrics`]).
    pending_metrics: PendingMetrics,
}

/// A metric row: (queue number, kind, minute since the Unix epoch, count).
pub(crate) type MetricRow = (u32, u8, u64, u64);

/// Metrics of committed groups not yet in the file: a group's counts are written with the
/// group that commits at least [`METRICS_FLUSH_INTERVAL`](crate::limits::METRICS_FLUSH_INTERVAL)
/// after the last write of them (or the first to commit), so the metrics cost at most one
/// small write per second; [`Queue::flush`](crate::Queue::flush), shutdown and the close
/// write the rest.
#[derive(Default)]
struct PendingMetrics {
    rows: Vec<MetricRow>,
    /// When they were last written (the clock's Unix ms); `None` before the first write.
    written_ms: Option<u64>,
}

/// Adds `rows` into `into`, summing the counts of equal (queue, kind, minute).
fn merge_rows(into: &mut Vec<MetricRow>, rows: &[MetricRow]) {
    for &(q, k, m, n) in rows {
        match into
            .iter_mut()
            .find(|(q2, k2, m2, _)| (*q2, *k2, *m2) == (q, k, m))
        {
            Some(row) => row.3 = row.3.saturating_add(n),
            None => into.push((q, k, m, n)),
        }
    }
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
    /// Writes a group's metrics tally into its transaction before the commit, at the time the
    /// clock gives; `None` counts nothing (a committer that is not a queue's).
    metrics: Option<MetricsWriter>,
}

/// How a committer writes metrics: the engine's writer (rows into a transaction, pruning
/// what expired) and the queue's clock.
pub(crate) struct MetricsWriter {
    pub(crate) write: fn(&WriteTransaction, &[MetricRow]) -> Result<()>,
    pub(crate) clock: Arc<dyn crate::clock::Clock>,
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
            metrics: None,
        }
    }

    /// This committer with its groups' metrics written by `metrics` (a queue's committer).
    pub(crate) fn with_metrics(mut self, metrics: MetricsWriter) -> Committer {
        self.metrics = Some(metrics);
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
        self.check_reentrant()?;
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
        let applied = catch_engine_panic(|| {
            let mut ctx = Ctx {
                tx: &g.tx,
                counters: &mut g.counters,
                written: WriteMark(&written),
                wake: WakeList(&g.wake),
                // Looked at per operation: a call made after a subscription returned is
                // recorded whatever group it joins.
                events: EventSink::new(
                    self.hub.listening().then_some(&g.events),
                    self.metrics.is_some().then_some(&g.tally),
                ),
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
            Ok(Err(Refusal(e))) if !written.get() => self.count_member(g, leader, Err(e)),
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
            wake: RefCell::new(Vec::new()),
            events: std::cell::RefCell::new(Vec::new()),
            tally: RefCell::new(crate::metrics::Tally::default()),
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
        let wake = g.wake.take();
        let events = std::mem::take(g.events.get_mut());
        let counters = g.counters;
        let (members, dirty, seq, durable) = (g.members, g.dirty, g.seq, g.durable);
        let result_cell = g.result.clone();
        let started = Instant::now();
        st.stats.gather_micros += u64::try_from((started - g.opened_at).as_micros()).unwrap_or(0);
        // The group's counts, and whether this commit writes them with those pending.
        let metrics = self.metrics.as_ref().map(|m| {
            let now_ms = m.clock.now_ms();
            let group_rows = std::mem::take(g.tally.get_mut()).rows(now_ms);
            let due = st.pending_metrics.written_ms.is_none_or(|t| {
                now_ms < t || now_ms - t >= crate::limits::METRICS_FLUSH_INTERVAL.as_millis() as u64
            });
            // Taken out while this commit writes them, so a flush in between cannot write
            // them again; put back if the commit does not land.
            let mut write_rows = Vec::new();
            if due {
                write_rows = std::mem::take(&mut st.pending_metrics.rows);
                merge_rows(&mut write_rows, &group_rows);
            }
            (m.write, write_rows, group_rows, now_ms)
        });
        let to_write = metrics
            .as_ref()
            .filter(|(_, rows, _, _)| !rows.is_empty())
            .map(|(write, rows, _, _)| (*write, rows.clone()));
        let outcome = parking_lot::MutexGuard::unlocked(st, || {
            catch_unwind(AssertUnwindSafe(|| commit_group(g, to_write)))
                .unwrap_or_else(|_| Err("storage engine panicked during commit".to_string()))
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
        if let Some((_, written, group_rows, now_ms)) = metrics {
            let pending = &mut st.pending_metrics;
            match (&outcome, dirty, written.is_empty()) {
                // Committed, counts written: they are in the file.
                (Ok(()), true, false) => pending.written_ms = Some(now_ms),
                // Committed, counts not due: the group's wait for a later write.
                (Ok(()), true, true) => merge_rows(&mut pending.rows, &group_rows),
                // Nothing committed: the pending rows taken out go back (the group's own
                // changes did not land, so neither do its counts).
                _ => {
                    let group_part = &group_rows;
                    for &(q, k, m, n) in &written {
                        let own = group_part
                            .iter()
                            .find(|(q2, k2, m2, _)| (*q2, *k2, *m2) == (q, k, m))
                            .map_or(0, |r| r.3);
                        if n > own {
                            merge_rows(&mut pending.rows, &[(q, k, m, n - own)]);
                        }
                    }
                }
            }
        }
        let result = match outcome {
            Ok(()) => {
                st.counters = Some(counters);
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
            self.hub.publish(events);
        }
        let _ = result_cell.set(result);
        waiters.iter().for_each(std::thread::Thread::unpark);
        self.enter_cv.notify_all();
        if committed {
            for queue_number in wake {
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
    pub(crate) fn check_reentrant(&self) -> Result<()> {
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
    pub(crate) fn check_not_poisoned(&self) -> Result<()> {
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

    /// The metric rows counted by committed groups and not yet written to the file.
    pub(crate) fn pending_metrics(&self) -> Vec<MetricRow> {
        self.state.lock().pending_metrics.rows.clone()
    }

    /// Takes the pending metric rows out for a flush (a commit outside the groups), which
    /// writes them with [`Committer::write_metric_rows`] and gives them back with
    /// [`Committer::metrics_not_written`] if its commit does not land. Taken before the
    /// flush's transaction begins: the group mutex is never waited for while holding redb's
    /// write slot (a group opening its transaction holds the mutex).
    pub(crate) fn take_pending_metrics(&self) -> Vec<MetricRow> {
        if self.metrics.is_none() {
            return Vec::new();
        }
        std::mem::take(&mut self.state.lock().pending_metrics.rows)
    }

    /// Writes metric rows in `tx` (a flush's), without touching the group mutex.
    pub(crate) fn write_metric_rows(
        &self,
        tx: &WriteTransaction,
        rows: &[MetricRow],
    ) -> Result<()> {
        match &self.metrics {
            Some(m) if !rows.is_empty() => (m.write)(tx, rows),
            _ => Ok(()),
        }
    }

    /// Rows a flush took out and did not commit: pending again.
    pub(crate) fn metrics_not_written(&self, rows: &[MetricRow]) {
        merge_rows(&mut self.state.lock().pending_metrics.rows, rows);
    }
}

/// The metrics writer and the rows a group's commit writes.
type GroupMetrics = Option<(
    fn(&WriteTransaction, &[MetricRow]) -> Result<()>,
    Vec<MetricRow>,
)>;

fn commit_group(g: OpenGroup, metrics: GroupMetrics) -> std::result::Result<(), String> {
    let _span = tracing::debug_span!(
        "leaseq.commit",
        members = g.members,
        durable = g.durable,
        dirty = g.dirty
    )
    .entered();
    let members = g.members;
    let r = commit_group_inner(g, metrics);
    if let Err(e) = &r {
        tracing::error!(members, error = %e, "leaseq: group commit failed");
    }
    r
}

fn commit_group_inner(g: OpenGroup, metrics: GroupMetrics) -> std::result::Result<(), String> {
    if !g.dirty {
        debug_assert_eq!(
            g.counters, g.counters_at_start,
            "counters moved without a write"
        );
        // Nothing was written: no fsync needed, and every member read committed state.
        return g.tx.abort().map_err(|e| e.to_string());
    }
    if g.counters.reserved_moved(&g.counters_at_start) {
        g.counters.write(&g.tx).map_err(|e| e.to_string())?;
    }
    if let Some((write, rows)) = metrics {
        write(&g.tx, &rows).map_err(|e| e.to_string())?;
    }
    g.tx.commit().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    //! The contract between the committer and the operations it runs: who commits, who
    //! aborts, what a refusal after a write does.

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

    /// Writes row `k` and marks the group, as the engine's writes do.
    fn put(ctx: &mut Ctx<'_>, k: u64) -> Result<()> {
        ctx.mark_written();
        ctx.tx.open_table(ROWS)?.insert(k, k)?;
        Ok(())
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
    fn an_unmarked_group_is_aborted_so_a_write_that_does_not_mark_is_lost() {
        // Why writes must mark: the committer trusts the mark, not the transaction.
        let (_dir, db, c) = setup();
        c.run(&db, &mut |ctx| {
            ctx.tx.open_table(ROWS)?.insert(7, 7)?;
            Ok(Ok(()))
        })
        .unwrap();
        assert_eq!(c.stats().aborted_clean, 1);
        let rtx = db.begin_read().unwrap();
        assert!(
            rtx.open_table(ROWS).is_err(),
            "nothing of the write was committed"
        );
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
