//! A power-loss simulator: a [`redb::StorageBackend`] that models a disk with a volatile write
//! cache, for testing that data survives a crash at any point.
//!
//! Only compiled with the `sim` feature.
//!
//! # The model
//!
//! A [`SimDisk`] holds two byte images of one file and a log:
//!
//! * the **live image**: every write and length change made so far. Reads and `len` see it, as a
//!   running program sees its file through the operating system's page cache;
//! * the **durable image**: what is on the platter for certain. `sync_data` makes it equal to the
//!   live image;
//! * the **unsynced log**: each successful `write` and `set_len` since the last `sync_data`, in
//!   order.
//!
//! Power can be made to fail at a chosen mutating call ([`SimDisk::crash_after`]) or at once
//! ([`SimDisk::crash_now`]). The call at which it fails has no effect, and it and every later
//! I/O call on the disk (reads and `len` included) return an I/O error.
//!
//! What survives power loss is the **crash image** ([`SimDisk::crash_image`]): the durable image
//! with the unsynced log replayed in order over it, each entry independently
//!
//! * a `write`: kept whole (probability 1/3), dropped (1/3), or torn (1/3). A torn write keeps
//!   each 512-byte sector it touches independently with probability 1/2, so a torn write may also
//!   end up kept whole or dropped. Sectors are aligned to absolute offsets that are multiples of
//!   512 ([`SECTOR_SIZE`]), and a sector is never split: each part of a write that falls in one
//!   sector is kept or lost as a unit;
//! * a `set_len`: kept or dropped, with probability 1/2 each.
//!
//! Since the log is replayed in order, a later write wins over an earlier one at the same offset
//! when both are kept. The bytes of a kept write that fall past the crash image's length at that
//! point of the replay (because the `set_len` that made room for them was dropped) are lost, as
//! the data past the end of a file whose size change never reached the disk.
//!
//! The choices are drawn from a [`fastrand::Rng`] seeded with the disk's seed, afresh for every
//! call of [`SimDisk::crash_image`], so the crash image is a pure function of the seed and the
//! calls made: the same seed and the same calls give the same image.
//!
//! To "reboot", build a new disk from the crash image with [`SimDisk::from_image`] and open the
//! database on it again.
//!
//! The approach follows redb's own fuzzer (`fuzz/fuzz_targets/fuzz_redb.rs` in the redb
//! repository), whose backend fails every I/O call once a countdown runs out, after which the
//! fuzzer reopens the file and checks it against a reference model, and SQLite's crash-test VFS
//! (`src/test6.c`), which on a simulated crash writes, drops or corrupts each sector written since
//! the last sync. Unlike redb's fuzzer, this simulator also loses unsynced writes; unlike SQLite's,
//! it never writes garbage: every sector of a crash image holds content that was written to it.
//!
//! # Limits
//!
//! * Images are `Vec<u8>`s in memory. A `set_len` above the disk's cap
//!   ([`DEFAULT_MAX_LEN`], 1 GiB, unless changed by [`SimDisk::set_max_len`]) fails instead of
//!   allocating. The unsynced log keeps a copy of every byte written since the last sync.
//! * [`SimBackend`] implements none of the optional lock methods, so redb treats it as a backend
//!   without locking: only [`redb::ConcurrencyMode::ExclusiveWriter`] (the default) works (the
//!   other modes fail to open with an "unsupported" error), and nothing stops two databases from
//!   being opened on one disk at once.
//! * The backend implements the redb 4.x (`std::io::Error`) form of the trait; it does not
//!   build with redb's `experimental-api-5` feature.
//!
//! # Example
//!
//! Testing that a committed row survives a power loss during the next commit:
//!
//! ```
//! use leaseq::sim::SimDisk;
//! use redb::{Builder, ReadableDatabase, TableDefinition};
//!
//! const ROWS: TableDefinition<u64, u64> = TableDefinition::new("rows");
//!
//! let disk = SimDisk::new(42);
//! let db = Builder::new().create_with_backend(disk.backend())?;
//! let txn = db.begin_write()?; // Durability::Immediate by default
//! txn.open_table(ROWS)?.insert(1, 10)?;
//! txn.commit()?;
//!
//! // Power fails at the next write, set_len or sync_data: inside this commit
//! disk.crash_after(0);
//! let txn = db.begin_write()?;
//! txn.open_table(ROWS)?.insert(2, 20)?;
//! assert!(txn.commit().is_err());
//! assert!(disk.is_crashed());
//! drop(db);
//!
//! // Reboot: open what survived on a fresh disk
//! let rebooted = SimDisk::from_image(disk.crash_image(), 43);
//! let db = Builder::new().create_with_backend(rebooted.backend())?;
//! let read = db.begin_read()?;
//! let rows = read.open_table(ROWS)?;
//! assert_eq!(rows.get(1)?.map(|v| v.value()), Some(10));
//! assert!(rows.get(2)?.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::io;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fastrand::Rng;

/// The unit a write is torn in, in bytes: the crash image never holds part of a write's share of
/// one sector. Sectors start at absolute offsets that are multiples of this.
pub const SECTOR_SIZE: u64 = 512;

/// The default cap on a disk's length, in bytes (1 GiB). See [`SimDisk::set_max_len`].
pub const DEFAULT_MAX_LEN: u64 = 1 << 30;

/// One simulated disk holding one file. Cloning gives another handle to the same disk.
///
/// See the [module documentation](self) for the model.
#[derive(Clone)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

/// A [`redb::StorageBackend`] on a [`SimDisk`], made by [`SimDisk::backend`].
///
/// Every backend of a disk shares its state: their calls are counted together, and power fails
/// for all of them at once.
///
/// `len` and `read` see the live image. `write` and `set_len` change the live image and are
/// logged as unsynced; `sync_data` makes the live image durable. Each returns an I/O error:
///
/// * of kind [`io::ErrorKind::Other`] once power has failed (see [`SimDisk::crash_after`]);
/// * of kind [`io::ErrorKind::InvalidInput`] for a `read` or `write` past the end of the file
///   (the file is not changed);
/// * of kind [`io::ErrorKind::FileTooLarge`] for a `set_len` above the disk's cap (the file is
///   not changed).
///
/// Byte-range locks are kept per disk, as open file descriptions hold them (OFD locks): a
/// backend's locks conflict with other backends' where the ranges overlap and either is
/// exclusive, never with its own; `unlock_range` releases that exact range; `close` releases
/// every lock of the backend and always succeeds. So redb's shared modes
/// (`ConcurrencyMode::SingleWriter`, [`Builder::live_reads`](crate::Builder::live_reads))
/// run on the simulator with the lock calls they make on a real file. A waiting
/// `lock_range` gives up after 30 s with an I/O error (a simulated process holding a lock
/// forever is a bug of the test). Lock calls work after a power failure too: the locks are
/// the processes', not the disk's.
pub struct SimBackend {
    state: Arc<Mutex<State>>,
    /// Whose locks these are: one id per backend.
    id: u64,
}

/// A byte-range lock held by a backend; `end` exclusive, `u64::MAX` for an unbounded end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeldLock {
    backend: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

#[derive(Debug)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

struct State {
    seed: u64,
    live: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Op>,
    /// Mutating calls that reached the disk while it had power, the failing one included
    mutating_ops: u64,
    syncs: u64,
    /// Index (counted like `mutating_ops`, from zero) of the mutating call at which power fails
    crash_at: Option<u64>,
    crashed: bool,
    max_len: u64,
    /// The byte-range locks of every backend of the disk.
    locks: Vec<HeldLock>,
    /// The id the next backend gets.
    next_backend: u64,
}

impl SimDisk {
    /// An empty disk (length zero) whose crash images are drawn from `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk::from_image(Vec::new(), seed)
    }

    /// A disk whose durable and live image are both `image`, with nothing unsynced and power on:
    /// the disk after a reboot, when `image` is another disk's [`crash_image`](Self::crash_image).
    /// Its crash images are drawn from `seed`.
    ///
    /// The image is taken as it is, even if it is longer than the cap on `set_len`.
    pub fn from_image(image: Vec<u8>, seed: u64) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(State {
                seed,
                durable: image.clone(),
                live: image,
                unsynced: Vec::new(),
                mutating_ops: 0,
                syncs: 0,
                crash_at: None,
                crashed: false,
                max_len: DEFAULT_MAX_LEN,
                locks: Vec::new(),
                next_backend: 1,
            })),
        }
    }

    /// A new [`redb::StorageBackend`] on this disk, for
    /// [`redb::Builder::create_with_backend`]. It shares this disk's state.
    pub fn backend(&self) -> SimBackend {
        let id = {
            let mut state = self.lock();
            state.next_backend += 1;
            state.next_backend - 1
        };
        SimBackend {
            state: Arc::clone(&self.state),
            id,
        }
    }

    /// Sets the cap on the file's length, in bytes: a later `set_len` above it fails with
    /// [`io::ErrorKind::FileTooLarge`] and changes nothing. Defaults to [`DEFAULT_MAX_LEN`].
    /// A file already longer than the cap is left as it is.
    pub fn set_max_len(&self, bytes: u64) {
        self.lock().max_len = bytes;
    }

    /// Plans a power failure at the mutating call (`write`, `set_len` or `sync_data`, on any of
    /// the disk's backends) that comes `mutating_ops` such calls from now: `0` is the very next
    /// one. That call takes no effect; it and every later I/O call on the disk (`len` and `read`
    /// included) return an I/O error of kind [`io::ErrorKind::Other`].
    ///
    /// Replaces an earlier plan. Does nothing once power has failed.
    pub fn crash_after(&self, mutating_ops: u64) {
        let mut state = self.lock();
        if !state.crashed {
            state.crash_at = Some(state.mutating_ops.saturating_add(mutating_ops));
        }
    }

    /// Makes power fail now: every later I/O call on the disk returns an I/O error of kind
    /// [`io::ErrorKind::Other`]. Does nothing if power has already failed.
    pub fn crash_now(&self) {
        self.lock().crashed = true;
    }

    /// Whether power has failed.
    pub fn is_crashed(&self) -> bool {
        self.lock().crashed
    }

    /// The number of mutating calls (`write`, `set_len`, `sync_data`) made on this disk while it
    /// had power, counting failed ones and the one at which power failed, but none after it.
    ///
    /// A workload that makes `n` of them on a fresh disk can be crashed at any of them with
    /// `crash_after(k)` for `k` in `0..n`.
    pub fn mutating_ops(&self) -> u64 {
        self.lock().mutating_ops
    }

    /// The number of `sync_data` calls that succeeded.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// The bytes that would be on the disk if power failed now, or that are on it if power has
    /// failed: the durable image with each unsynced write kept, dropped or torn, and each
    /// unsynced `set_len` kept or dropped, as the [module documentation](self) describes. A pure
    /// function of the seed and the calls made so far: asking again gives the same image.
    pub fn crash_image(&self) -> Vec<u8> {
        let state = self.lock();
        let mut rng = Rng::with_seed(state.seed);
        let mut image = state.durable.clone();
        for op in &state.unsynced {
            match op {
                Op::SetLen(len) => {
                    if rng.bool() {
                        set_len(&mut image, *len);
                    }
                }
                Op::Write { offset, data } => {
                    match rng.u8(0..3) {
                        // Kept whole
                        0 => write_clipped(&mut image, *offset, data),
                        // Dropped
                        1 => {}
                        // Torn: each sector's share of the write kept with probability 1/2
                        _ => {
                            for (start, end) in sector_pieces(*offset, data.len()) {
                                if rng.bool() {
                                    let piece =
                                        &data[to_usize(start - offset)..to_usize(end - offset)];
                                    write_clipped(&mut image, start, piece);
                                }
                            }
                        }
                    }
                }
            }
        }
        image
    }

    /// A copy of the durable image, in bytes: the file as of the last successful `sync_data` (or
    /// as given to [`from_image`](Self::from_image)).
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// A copy of the live image, in bytes: the file as reads see it, with every successful
    /// `write` and `set_len` so far.
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        lock(&self.state).fmt_fields("SimDisk", f)
    }
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        lock(&self.state).fmt_fields("SimBackend", f)
    }
}

// A panic while the lock is held leaves the state consistent (every update is a single
// assignment or a completed copy), so a poisoned lock is read through
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    // Hand-written so that no image is printed byte by byte
    fn fmt_fields(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("seed", &self.seed)
            .field("live_len", &self.live.len())
            .field("durable_len", &self.durable.len())
            .field("unsynced_ops", &self.unsynced.len())
            .field("mutating_ops", &self.mutating_ops)
            .field("syncs", &self.syncs)
            .field("crash_at", &self.crash_at)
            .field("crashed", &self.crashed)
            .finish()
    }

    fn ensure_powered(&self) -> io::Result<()> {
        if self.crashed {
            Err(power_lost())
        } else {
            Ok(())
        }
    }

    // Counts a mutating call, failing it (and the power) if it is the planned crash point
    fn begin_mutation(&mut self) -> io::Result<()> {
        self.ensure_powered()?;
        let index = self.mutating_ops;
        self.mutating_ops += 1;
        if self.crash_at.is_some_and(|at| index >= at) {
            self.crashed = true;
            return Err(power_lost());
        }
        Ok(())
    }
}

fn power_lost() -> io::Error {
    io::Error::other("simulated power loss (leaseq::sim)")
}

fn out_of_range() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "offset and length past the end of the simulated file",
    )
}

fn to_usize(value: u64) -> usize {
    // Lengths are capped by the images held in memory, so they fit
    usize::try_from(value).unwrap_or(usize::MAX)
}

// The range `offset..offset + len` of an image of `image_len` bytes, or None if it does not fit
fn range_in(image_len: usize, offset: u64, len: usize) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(len)?;
    (end <= image_len).then_some(start..end)
}

fn set_len(image: &mut Vec<u8>, len: u64) {
    image.resize(to_usize(len), 0);
}

// Writes the part of `data` at `offset` that lies within the image
fn write_clipped(image: &mut [u8], offset: u64, data: &[u8]) {
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if start >= image.len() {
        return;
    }
    let len = data.len().min(image.len() - start);
    image[start..start + len].copy_from_slice(&data[..len]);
}

// The parts of `offset..offset + len` that fall in each sector, as absolute (start, end) offsets
fn sector_pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, u64)> {
    let end = offset + len as u64;
    let mut start = offset;
    std::iter::from_fn(move || {
        if start >= end {
            return None;
        }
        let sector_end = (start / SECTOR_SIZE + 1) * SECTOR_SIZE;
        let piece = (start, sector_end.min(end));
        start = piece.1;
        Some(piece)
    })
}

/// A lock range as `[start, end)`, `end` `u64::MAX` when unbounded.
fn lock_span(start: Bound<u64>, end: Bound<u64>) -> (u64, u64) {
    let start = match start {
        Bound::Included(s) => s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match end {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl SimBackend {
    /// Whether a lock of this backend over `span` (exclusive or shared) would conflict with
    /// another backend's.
    fn conflicts(state: &State, me: u64, span: (u64, u64), exclusive: bool) -> bool {
        state.locks.iter().any(|l| {
            l.backend != me && l.start < span.1 && span.0 < l.end && (exclusive || l.exclusive)
        })
    }

    fn try_lock(&self, start: Bound<u64>, end: Bound<u64>, exclusive: bool) -> bool {
        let span = lock_span(start, end);
        let mut state = lock(&self.state);
        if SimBackend::conflicts(&state, self.id, span, exclusive) {
            return false;
        }
        state.locks.push(HeldLock {
            backend: self.id,
            start: span.0,
            end: span.1,
            exclusive,
        });
        true
    }

    fn wait_lock(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
        exclusive: bool,
    ) -> Result<(), redb::BackendError> {
        let started = std::time::Instant::now();
        while !self.try_lock(start, end, exclusive) {
            if started.elapsed() > std::time::Duration::from_secs(30) {
                return Err(redb::BackendError::Io(io::Error::other(
                    "simulated lock wait of 30 s: another backend holds the range",
                )));
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        Ok(())
    }
}

impl Clone for SimBackend {
    /// Another handle with the same locks (the same open file description).
    fn clone(&self) -> SimBackend {
        SimBackend {
            state: Arc::clone(&self.state),
            id: self.id,
        }
    }
}

impl redb::StorageBackend for SimBackend {
    fn close(&self) -> Result<(), io::Error> {
        lock(&self.state).locks.retain(|l| l.backend != self.id);
        Ok(())
    }

    fn try_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        Ok(self.try_lock(start, end, true))
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        Ok(self.try_lock(start, end, false))
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.wait_lock(start, end, true)
    }

    fn lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.wait_lock(start, end, false)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        let (s, e) = lock_span(start, end);
        lock(&self.state)
            .locks
            .retain(|l| !(l.backend == self.id && l.start == s && l.end == e));
        Ok(())
    }

    fn query_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        let state = lock(&self.state);
        Ok(SimBackend::conflicts(
            &state,
            self.id,
            lock_span(start, end),
            true,
        ))
    }

    fn len(&self) -> Result<u64, io::Error> {
        let state = lock(&self.state);
        state.ensure_powered()?;
        Ok(state.live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let state = lock(&self.state);
        state.ensure_powered()?;
        let range = range_in(state.live.len(), offset, out.len()).ok_or_else(out_of_range)?;
        out.copy_from_slice(&state.live[range]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut state = lock(&self.state);
        state.begin_mutation()?;
        if len > state.max_len || usize::try_from(len).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!(
                    "simulated file length {len} is above the cap of {} bytes",
                    state.max_len
                ),
            ));
        }
        set_len(&mut state.live, len);
        state.unsynced.push(Op::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut state = lock(&self.state);
        state.begin_mutation()?;
        let State {
            durable, unsynced, ..
        } = &mut *state;
        // Replaying the log keeps the cost to the bytes written, not the file's size
        for op in unsynced.drain(..) {
            match op {
                Op::SetLen(len) => set_len(durable, len),
                Op::Write { offset, data } => write_clipped(durable, offset, &data),
            }
        }
        state.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut state = lock(&self.state);
        state.begin_mutation()?;
        let range = range_in(state.live.len(), offset, data.len()).ok_or_else(out_of_range)?;
        state.live[range].copy_from_slice(data);
        state.unsynced.push(Op::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }
}
