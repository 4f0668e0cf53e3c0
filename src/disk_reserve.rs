//! The disk reserve: room kept for the drain, so a queue whose disk (or whose file limit)
//! fills never needs a person (the operations chapter, "A full disk").
//!
//! An open file with a path watches two numbers before every commit that writes: the bytes
//! free to it on its file system, and the bytes its file and journal take on disk. While
//! the room left (free bytes, or the file limit less the bytes taken, each plus what the file
//! can reuse inside itself) is under the reserve, the file is *storage full*: calls that only
//! grow it are refused with `StorageFull` (nothing written); dequeue, ack, `ack_with`,
//! nack, cancel, remove, prune and compaction go on, and each group is a checkpoint, so the
//! pages an ack frees are reused by the next. As etcd's NOSPACE alarm: reads and deletes only.
//!
//! Beside the file, `<file>-reserve` holds the reserve's bytes, allocated (a ballast, as
//! CockroachDB's emergency ballast): another process filling the disk leaves leaseq that
//! much. It is deleted when the disk turns the file full, and made again once the disk has
//! three times the reserve free. Leaving the state takes twice the reserve of room
//! (hysteresis: the state does not flap at its edge).
//!
//! What the file can reuse is its allocated bytes less the pages redb holds: pages a drain
//! freed. Counting redb's pages walks its trees, so it is done only near the edge, at most
//! every [`REUSABLE_REFRESH`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fs4::FileExt;
use parking_lot::Mutex;
use redb::WriteTransaction;

use crate::clock::Clock;
use crate::error::Error;

/// How often, at most, the pages redb holds are counted (a walk of its trees) while the
/// file is near or in the storage-full state.
pub(crate) const REUSABLE_REFRESH: Duration = Duration::from_secs(1);

/// How often, at most, a refused call looks again at the disk while the file is full (so a
/// file that only refuses leaves the state once space is freed).
const FULL_RECHECK: Duration = Duration::from_millis(100);

/// The reserve file's path beside the queue file `path`: `<name>-reserve`.
pub(crate) fn path_beside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-reserve");
    PathBuf::from(name)
}

/// What the last look at the disk saw, for the refusal's error and the state's events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Bytes free to this process on the file's file system.
    pub available: u64,
    /// Bytes the file and its journal take on disk.
    pub file_bytes: u64,
    /// Of those, bytes the file can reuse (pages freed inside it).
    pub reusable: u64,
}

/// A change of the storage-full state, to publish as an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turned {
    /// The file turned full at this time (Unix ms).
    Full(u64),
    /// The file has room again.
    Ok,
}

struct State {
    /// Since when (Unix ms) the file is full; `None` while it has room.
    full_since_ms: Option<u64>,
    /// Whether the reserve file is in place.
    held: bool,
    seen: Seen,
    /// When the reusable bytes were counted last.
    counted_at: Option<Instant>,
    looked_at: Option<Instant>,
    /// The state as the file records it (`leaseq_meta`), written by the next commit.
    recorded: Option<Option<u64>>,
    /// Turns not published yet.
    turns: Vec<Turned>,
    /// The room the last look saw: the least of the disk's and the file limit's (bytes).
    room: u64,
    /// The reusable bytes the last count saw.
    counted: u64,
    /// Twice the payload bytes of the enqueues admitted since that count.
    admitted: u64,
    /// A refused call asked for a look at the next seal.
    look_wanted: bool,
    /// How long the last count of the reusable bytes took (the next waits ten times that).
    count_took: Duration,
    /// When free space could not be read and that was logged.
    warned_at: Option<Instant>,
    /// When free space was read last.
    available_at: Option<Instant>,
    /// When making the reserve file last failed for want of room.
    reserve_failed_at: Option<Instant>,
    /// The reserve file cannot be made on this file system: not tried again this session.
    reserve_broken: bool,
}

/// The fastest another writer is assumed to fill the disk (4 GB/s, in bytes per ns): free
/// space is read again before the headroom the last reading saw could be gone at that pace.
const FILLER_BYTES_PER_NS: u64 = 4;

/// The longest a reading of free space is used (100 ms), however much headroom it saw.
const AVAILABLE_EVERY: Duration = Duration::from_millis(100);

/// How often, at most, a failure to read free space is logged.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// How often, at most, making the reserve file is tried again while it is missing.
const RESERVE_RETRY: Duration = Duration::from_secs(10);

/// The least room kept under a file limit (bytes), whatever the reserve: with
/// `disk_reserve(0)` a file limit still turns the file full before it.
pub(crate) const LIMIT_MARGIN_MIN: u64 = 256 << 10;

/// Writes `len` bytes of a pattern into `f` from its start (64 KiB of xorshift output,
/// repeated): bytes a compressing file system must keep.
fn write_pattern(f: &File, len: u64) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    let mut block = vec![0u8; 64 << 10];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in block.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let mut w = f;
    w.seek(std::io::SeekFrom::Start(0))?;
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        w.write_all(&block[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Whether `e` says the disk or the user's quota is full.
fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// Most turns kept unpublished (the newest win).
const TURNS_KEPT: usize = 4;

fn push_turn(turns: &mut Vec<Turned>, turn: Turned) {
    if turns.len() >= TURNS_KEPT {
        turns.remove(0);
    }
    turns.push(turn);
}

/// The disk reserve of one open file (shared by its handles through the committer).
pub(crate) struct DiskReserve {
    dir: PathBuf,
    file: File,
    /// The bytes the journal takes on disk (0 without one).
    journal_bytes: u64,
    reserve_path: PathBuf,
    reserve: u64,
    file_max: Option<u64>,
    clock: Arc<dyn Clock>,
    full: AtomicBool,
    /// Within twice the reserve of the edge (full or not): each group is a checkpoint.
    near: AtomicBool,
    state: Mutex<State>,
}

impl std::fmt::Debug for DiskReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskReserve")
            .field("dir", &self.dir)
            .field("reserve", &self.reserve)
            .field("file_max", &self.file_max)
            .field("full", &self.full.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl DiskReserve {
    /// The reserve of the queue file at `path` (journal at `journal` if on): `reserve`
    /// bytes (0: no reserve file, and the file is full only at its limit or when the disk
    /// has no byte left), `file_max` the file limit. Makes the reserve file if it is
    /// missing and the disk has three times the reserve free; `recorded` is the state the
    /// file records: a
    /// file recorded full opens full (since then, its reserve file not made), so leaving the
    /// state takes twice the reserve of room across a reopen too.
    pub(crate) fn open(
        path: &Path,
        journal: Option<&Path>,
        reserve: u64,
        file_max: Option<u64>,
        clock: Arc<dyn Clock>,
        recorded: Option<u64>,
    ) -> crate::error::Result<DiskReserve> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file = File::open(path)?;
        // The journal is made its full size before a session writes it, and never changes
        // while open: counted once (a stat of it before every commit cost 40 µs, the
        // frame's fdatasync waiting on it).
        let journal_bytes = match journal {
            Some(j) => File::open(j)?.allocated_size()?,
            None => 0,
        };
        let reserve_path = path_beside(path);
        let r = DiskReserve {
            dir,
            file,
            journal_bytes,
            reserve_path,
            reserve,
            file_max,
            clock,
            full: AtomicBool::new(recorded.is_some()),
            near: AtomicBool::new(false),
            state: Mutex::new(State {
                full_since_ms: recorded,
                held: false,
                seen: Seen::default(),
                counted_at: None,
                looked_at: None,
                recorded: Some(recorded),
                turns: Vec::new(),
                room: u64::MAX,
                counted: 0,
                admitted: 0,
                look_wanted: true,
                count_took: Duration::ZERO,
                warned_at: None,
                available_at: None,
                reserve_failed_at: None,
                reserve_broken: false,
            }),
        };
        let mut st = r.state.lock();
        if reserve == 0 {
            // No reserve asked for: a reserve file an earlier open left is given back.
            let _ = std::fs::remove_file(&r.reserve_path);
        } else if std::fs::File::open(&r.reserve_path)
            .and_then(|f| f.allocated_size())
            .is_ok_and(|bytes| bytes >= reserve)
        {
            // Kept from an earlier open.
            st.held = true;
        } else if recorded.is_none()
            && fs4::available_space(&r.dir).unwrap_or(u64::MAX) >= reserve.saturating_mul(3)
        {
            // Made only on a disk with three times the reserve free, as after the state.
            match r.hold_reserve_file() {
                Ok(()) => st.held = true,
                Err(e) if is_disk_full(&e) => {
                    st.reserve_failed_at = Some(Instant::now());
                    tracing::warn!(path = %r.reserve_path.display(), "leaseq: no room for the disk reserve file");
                }
                Err(e) => {
                    st.reserve_broken = true;
                    tracing::warn!(error = %e, path = %r.reserve_path.display(), "leaseq: the disk reserve file cannot be made: the reserve is kept without it this session");
                }
            }
        }
        drop(st);
        Ok(r)
    }

    /// Makes (or finds) the reserve file at its full size. A failure leaves none.
    fn hold_reserve_file(&self) -> std::io::Result<()> {
        let made = (|| -> std::io::Result<()> {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.reserve_path)?;
            if f.allocated_size()? < self.reserve {
                match f.allocate(self.reserve) {
                    Ok(()) => {}
                    Err(e) if is_disk_full(&e) => return Err(e),
                    // A file system (or Windows layer, as wine's) without preallocation: the
                    // bytes written, a pattern that does not compress away.
                    Err(_) => write_pattern(&f, self.reserve)?,
                }
                f.sync_all()?;
            }
            Ok(())
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&self.reserve_path);
        }
        made
    }

    /// Whether the file is storage full (calls that grow it are refused).
    pub(crate) fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Whether each group must be a checkpoint: the file is full, or within twice the
    /// reserve of it. A checkpoint makes the pages the group's commit frees reusable at once,
    /// and its growth seen by the next look (between checkpoints, new pages wait in the page
    /// cache and a file system counts them only when written back).
    pub(crate) fn checkpoint_each_group(&self) -> bool {
        self.is_full() || self.near.load(Ordering::Acquire)
    }

    /// `StorageFull` for a call that only grows the file by about `payload_bytes`: while the
    /// file is full, or for a large call (twice its payload, for the pages around it, a
    /// quarter of the reserve or more) that would not leave the reserve free in the room the
    /// last look saw (one batch cannot take the reserve; small calls are the state's to
    /// refuse). `None` if it may go on. A refusal asks for a look at the next seal, at most
    /// every [`FULL_RECHECK`], so the state ends once space is freed even if nothing else
    /// writes.
    pub(crate) fn refuse_growth(&self, payload_bytes: u64) -> Option<Error> {
        let mut st = self.state.lock();
        let needs = payload_bytes.saturating_mul(2);
        let margin = self.limit_margin(false);
        let large = needs >= margin / 4;
        if !self.is_full() && (!large || st.room.saturating_sub(needs) >= margin) {
            st.admitted = st.admitted.saturating_add(needs);
            st.room = st.room.saturating_sub(needs);
            return None;
        }
        if st.looked_at.is_none_or(|t| t.elapsed() >= FULL_RECHECK) {
            st.look_wanted = true;
        }
        Some(Error::StorageFull {
            available_bytes: st.seen.available,
            file_bytes: st.seen.file_bytes,
            reusable_bytes: st.seen.reusable,
            reserve_bytes: self.reserve,
            file_bytes_max: self.file_max,
            needs_bytes: if self.is_full() { 0 } else { needs },
        })
    }

    /// Whether a refused call asked for a look (a seal of a group that wrote nothing then
    /// looks too).
    pub(crate) fn look_wanted(&self) -> bool {
        self.state.lock().look_wanted
    }

    /// Counts the file's reusable bytes again at the next look (after a compaction).
    pub(crate) fn recount(&self) {
        self.state.lock().counted_at = None;
    }

    /// The room under the file limit below which the file is full (`leaving`: twice it to
    /// leave): the reserve, at least [`LIMIT_MARGIN_MIN`].
    fn limit_margin(&self, leaving: bool) -> u64 {
        let m = self.reserve.max(LIMIT_MARGIN_MIN);
        if leaving { m.saturating_mul(2) } else { m }
    }

    /// Looks at the disk (at the seal of a group that wrote, or that a refused call asked
    /// for) and turns the state if it must: full when the room left on the disk is under the
    /// reserve (the reserve file deleted, giving its bytes to the drain) or the room under the
    /// file limit is under [`DiskReserve::limit_margin`]; room again when both are twice that.
    /// The reserve file is made again once the disk has three times the reserve free. A turn
    /// is kept for [`DiskReserve::take_turns`]. Free space that cannot be read leaves the
    /// disk side unchecked (logged at most once a minute); the file limit still holds.
    pub(crate) fn look(&self, tx: &WriteTransaction) {
        let mut st = self.state.lock();
        st.look_wanted = false;
        st.looked_at = Some(Instant::now());
        // Free space is read again once another writer could have used the headroom above
        // the reserve the last reading saw, at FILLER_BYTES_PER_NS (at most every
        // AVAILABLE_EVERY; every commit near the edge): a `statfs` costs some microseconds
        // before each commit, several per cent of a single enqueue.
        let headroom = st
            .seen
            .available
            .saturating_sub(self.reserve.saturating_mul(2));
        let fresh_for = AVAILABLE_EVERY.min(Duration::from_nanos(headroom / FILLER_BYTES_PER_NS));
        let stale = st.available_at.is_none_or(|t| t.elapsed() >= fresh_for);
        let available = if !stale {
            st.seen.available
        } else {
            st.available_at = Some(Instant::now());
            match fs4::available_space(&self.dir) {
                Ok(a) => a,
                Err(e) => {
                    if st.warned_at.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        st.warned_at = Some(Instant::now());
                        tracing::warn!(error = %e, "leaseq: free disk space unknown: only the file limit is checked");
                    }
                    u64::MAX
                }
            }
        };
        let journal_bytes = self.journal_bytes;
        let file_bytes = self.file.allocated_size().unwrap_or(0) + journal_bytes;
        // A file system that allocates at write-back (ext4's and XFS's delayed allocation)
        // counts the pages written since the last checkpoint only once they are written
        // back: until then the file's length (redb grows it in doublings, sparse) bounds
        // what it will take. Free space counts such reservations already.
        let file_len = self.file.metadata().map_or(0, |m| m.len());
        let bound_bytes = file_bytes.max(file_len.saturating_add(journal_bytes));
        st.seen.available = available;
        st.seen.file_bytes = file_bytes;
        let full_now = st.full_since_ms.is_some();
        let disk_room = |reusable: u64| available.saturating_add(reusable);
        let limit_room = |reusable: u64, taken: u64| {
            self.file_max.map_or(u64::MAX, |max| {
                max.saturating_add(reusable).saturating_sub(taken)
            })
        };
        let (disk_margin, limit_margin) = if full_now {
            (self.reserve.saturating_mul(2), self.limit_margin(true))
        } else {
            (self.reserve, self.limit_margin(false))
        };
        // Near the edge: within twice the margins, the file counted at its bound (so from
        // there on each group is a checkpoint and the bytes it takes are counted at once).
        let near = |reusable: u64| {
            disk_room(reusable) < self.reserve.saturating_mul(2).max(1)
                || limit_room(reusable, bound_bytes) < self.limit_margin(true)
        };
        // Cheap first: without counting the file's free pages.
        if !full_now && !near(0) {
            self.near.store(false, Ordering::Release);
            st.room = disk_room(0).min(limit_room(0, bound_bytes));
            self.keep_reserve_file(&mut st, available);
            return;
        }
        let every = REUSABLE_REFRESH.max(st.count_took * 10);
        if st.counted_at.is_none_or(|t| t.elapsed() >= every) {
            let started = Instant::now();
            st.counted = reusable_bytes(tx, self.file.allocated_size().unwrap_or(0));
            st.admitted = 0;
            st.count_took = started.elapsed();
            st.counted_at = Some(Instant::now());
        }
        // What the count saw, less what the enqueues admitted since may have taken of it
        // (twice their payload): a stale count never lends room that is gone.
        let reusable = st.counted.saturating_sub(st.admitted);
        st.seen.reusable = reusable;
        // Free disk bytes alone, whatever the file could reuse: under a quarter of the
        // reserve the file is full (its growth is not all reuse), and it leaves the state
        // only with half the reserve free.
        let floor = if full_now {
            self.reserve / 2
        } else {
            self.reserve / 4
        };
        let disk_short = disk_room(reusable) < disk_margin.max(1) || available < floor;
        let limit_short = limit_room(reusable, file_bytes) < limit_margin;
        st.room = disk_room(reusable).min(limit_room(reusable, bound_bytes));
        self.near.store(near(reusable), Ordering::Release);
        // The reserve file's bytes go to the drain once the disk itself is nearly out (under
        // a quarter of the reserve free): another process filled it, or the drain needs
        // them. Not before: a file that filled the disk itself keeps its reserve file, so
        // another process cannot take the drain's room later.
        if st.held && available < self.reserve / 4 {
            let _ = std::fs::remove_file(&self.reserve_path);
            st.held = false;
            tracing::warn!(
                available,
                reserve = self.reserve,
                "leaseq: the disk is nearly out: the reserve file's bytes given to the drain"
            );
        }
        match (full_now, disk_short || limit_short) {
            (false, true) => {
                let now_ms = self.clock.now_ms();
                st.full_since_ms = Some(now_ms);
                self.full.store(true, Ordering::Release);

                tracing::warn!(
                    available = st.seen.available,
                    file_bytes = st.seen.file_bytes,
                    reusable = st.seen.reusable,
                    reserve = self.reserve,
                    file_bytes_max = ?self.file_max,
                    "leaseq: storage full: enqueues refused until space is freed"
                );
                push_turn(&mut st.turns, Turned::Full(now_ms));
            }
            (true, false) => {
                st.full_since_ms = None;
                self.full.store(false, Ordering::Release);
                tracing::info!(
                    available = st.seen.available,
                    reusable = st.seen.reusable,
                    "leaseq: storage has room again: enqueues taken"
                );
                push_turn(&mut st.turns, Turned::Ok);
                self.keep_reserve_file(&mut st, available);
            }
            (false, false) => self.keep_reserve_file(&mut st, available),
            (true, true) => {}
        }
    }

    /// While the file has room and its reserve file is not in place (deleted on turning
    /// full, or not made at open): makes it once the disk has three times the reserve free
    /// (so the disk keeps twice the reserve after it), again at most every [`RESERVE_RETRY`]
    /// after a try failed. A file that filled its disk itself keeps that room inside it for
    /// its next jobs: its reserve file comes back once something (a compaction) frees disk
    /// space. A file system that cannot hold it (it refuses preallocation, the name is
    /// taken) leaves the file without one for this session, said once.
    fn keep_reserve_file(&self, st: &mut State, available: u64) {
        if self.reserve == 0 || st.held || st.reserve_broken || self.is_full() {
            return;
        }
        if available < self.reserve.saturating_mul(3)
            || st
                .reserve_failed_at
                .is_some_and(|t| t.elapsed() < RESERVE_RETRY)
        {
            return;
        }
        match self.hold_reserve_file() {
            Ok(()) => st.held = true,
            Err(e) if is_disk_full(&e) => st.reserve_failed_at = Some(Instant::now()),
            Err(e) => {
                st.reserve_broken = true;
                tracing::warn!(error = %e, path = %self.reserve_path.display(), "leaseq: the disk reserve file cannot be made: the reserve is kept without it this session");
            }
        }
    }

    /// The turns since the last call, oldest first (at most [`TURNS_KEPT`]), to publish.
    pub(crate) fn take_turns(&self) -> Vec<Turned> {
        std::mem::take(&mut self.state.lock().turns)
    }

    /// The state to record in the file if it differs from what the file records (the
    /// value of `leaseq_meta`'s `storage_full_ms`: 0 while there is room), marking it
    /// recorded; `None` when the file records the state already.
    pub(crate) fn to_record(&self) -> Option<u64> {
        let mut st = self.state.lock();
        let now = st.full_since_ms;
        if st.recorded == Some(now) {
            return None;
        }
        st.recorded = Some(now);
        Some(now.unwrap_or(0))
    }

    /// Forgets what the file records (a commit carrying it failed): the next writes it.
    pub(crate) fn record_lost(&self) {
        self.state.lock().recorded = None;
    }
}

/// Bytes of the file (taking `allocated` bytes on disk) that redb does not hold: pages a
/// drain freed, which it reuses before it grows the file. 0 if redb's count fails.
fn reusable_bytes(tx: &WriteTransaction, allocated: u64) -> u64 {
    match tx.stats() {
        Ok(s) => {
            let held = s.allocated_pages().saturating_mul(s.page_size() as u64);
            allocated.saturating_sub(held)
        }
        Err(e) => {
            tracing::warn!(error = %e, "leaseq: redb's page count failed");
            0
        }
    }
}
