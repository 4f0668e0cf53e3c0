//! A power-loss simulator: a [`redb::StorageBackend`] that models a disk with a volatile write
//! cache, for testing that data survives a crash at any point.
//!
//! Only compiled with the `sim` feature.
//!
//! # The model
//!
//! A [`SimDisk`] is one file. It holds two byte images of the file and a log:
//!
//! * the **live image**: every write and length change made so far. Reads and `len` see it, as a
//!   running program sees its file through the operating system's page cache;
//! * the **durable image**: what is on the platter for certain. `sync_data` makes it equal to the
//!   live image;
//! * the **unsynced log**: each successful `write` and `set_len` since the last `sync_data`, in
//!   order.
//!
//! Every file is on a **power line**. [`SimDisk::new`] and [`SimDisk::from_image`] make a file on
//! a line of its own; [`SimDisk::sibling`] and [`SimDisk::sibling_from_image`] make another file
//! on the same line as an existing one (a queue's redb file and its journal, say: two files of
//! one machine). Files of a line have their own images, logs, seeds, caps, `sync_data` counts
//! and byte-range locks; what they share is the power:
//!
//! * their mutating calls (`write`, `set_len`, `sync_data`) are counted together, in the order
//!   they are made: [`SimDisk::mutating_ops`] and [`SimDisk::crash_after`] count the line's calls,
//!   whichever file of the line they are asked of ([`SimDisk::file_mutating_ops`] counts one
//!   file's);
//! * power fails for the whole line at once.
//!
//! Power can be made to fail at a chosen mutating call ([`SimDisk::crash_after`]) or at once
//! ([`SimDisk::crash_now`]). The call at which it fails has no effect, and it and every later
//! I/O call on any file of the line (reads and `len` included) return an I/O error. A sync of
//! one file makes only that file's writes durable: a crash can keep a file's synced data and lose
//! another file's unsynced writes made before that sync.
//!
//! What survives power loss is each file's **crash image** ([`SimDisk::crash_image`]): the
//! file's durable image with its unsynced log replayed in order over it, each entry independently
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
//! the data past the end of a file whose size change never reached the disk. A write into room
//! that is durable (a file preallocated, zeroed and synced, as a journal's) is never clipped: each
//! of its sectors holds the write's bytes or what was there before. Each write is drawn on its
//! own, so the model is harsher than a disk in one way: of two unsynced writes sharing a sector,
//! the later one can be kept while the earlier one is lost (a disk writes the sector as the page
//! cache holds it: with neither, with the earlier one alone, or with both).
//!
//! The choices are drawn from a [`fastrand::Rng`] seeded with the file's seed, afresh for every
//! call of [`SimDisk::crash_image`], so a crash image is a pure function of the file's seed and
//! the calls made on that file: the same seed and the same calls give the same image, whatever
//! the line's other files did.
//!
//! To "reboot", build a new file from each crash image with [`SimDisk::from_image`] (and
//! [`SimDisk::sibling_from_image`] for the other files of the line) and open them again.
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
//! * Images are `Vec<u8>`s in memory. A `set_len` above the file's cap
//!   ([`DEFAULT_MAX_LEN`], 1 GiB, unless changed by [`SimDisk::set_max_len`]) fails instead of
//!   allocating. The unsynced log keeps a copy of every byte written since the last sync.
//! * One lock serializes every call on the files of a line, so concurrent calls never overlap
//!   in time (each is at one point of the line's count).
//! * [`SimBackend`]'s byte-range locks are kept per file, in memory: they stand for the locks
//!   processes take on a real file, not for anything on the disk (see [`SimBackend`]).
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
//!
//! Two files on one power line, a database and a journal beside it, where the journal writes
//! records into room it preallocated and synced:
//!
//! ```
//! use leaseq::sim::SimDisk;
//! use redb::StorageBackend;
//!
//! let db_file = SimDisk::new(1);
//! let journal = db_file.sibling(2);
//! let (db, log) = (db_file.backend(), journal.backend());
//! log.set_len(4096)?; // the line's mutating call 0
//! log.sync_data()?; // 1
//! log.write(0, b"record 1")?; // 2
//! log.sync_data()?; // 3
//! assert_eq!((db_file.mutating_ops(), journal.file_mutating_ops()), (4, 4));
//!
//! // Power fails at the line's second mutating call from now, whichever file makes it
//! db_file.crash_after(1);
//! log.write(8, b"record 2")?; // 4: the journal's, not synced
//! assert!(db.set_len(4096).is_err()); // 5: the database's; power fails for both
//! assert!(journal.is_crashed());
//! assert!(log.read(0, &mut [0; 8]).is_err());
//!
//! // The synced record survives; the unsynced one may or may not
//! let journal_image = journal.crash_image();
//! assert_eq!(&journal_image[..8], b"record 1");
//! assert!(db_file.crash_image().is_empty());
//!
//! // Reboot both files, on one line again
//! let db_file = SimDisk::from_image(db_file.crash_image(), 3);
//! let journal = db_file.sibling_from_image(journal_image, 4);
//! assert_eq!(journal.backend().len()?, 4096);
//! # Ok::<(), std::io::Error>(())
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

/// One simulated file, on its disk and on a power line it may share with other files
/// ([`sibling`](Self::sibling)). Cloning gives another handle to the same file.
///
/// See the [module documentation](self) for the model.
#[derive(Clone)]
pub struct SimDisk {
    line: Arc<Mutex<Line>>,
    /// This file's index in the line's `files`
    file: usize,
}

/// A [`redb::StorageBackend`] on a [`SimDisk`], made by [`SimDisk::backend`].
///
/// Every backend of a file shares its state, and every backend of every file of a power line
/// shares the power: their mutating calls are counted together, and power fails for all of them
/// at once.
///
/// `len` and `read` see the live image. `write` and `set_len` change the live image and are
/// logged as unsynced; `sync_data` makes the live image durable. Each returns an I/O error:
///
/// * of kind [`io::ErrorKind::Other`] once power has failed on the file's line (see
///   [`SimDisk::crash_after`]);
/// * of kind [`io::ErrorKind::InvalidInput`] for a `read` or `write` past the end of the file
///   (the file is not changed);
/// * of kind [`io::ErrorKind::FileTooLarge`] for a `set_len` above the file's cap (the file is
///   not changed).
///
/// Byte-range locks are kept per file, as open file descriptions hold them (OFD locks): a
/// backend's locks conflict with other backends' where the ranges overlap and either is
/// exclusive, never with its own; `unlock_range` releases that exact range; `close` releases
/// every lock of the backend and always succeeds. So redb's shared modes
/// (`ConcurrencyMode::SingleWriter`, [`Builder::live_reads`](crate::Builder::live_reads))
/// run on the simulator with the lock calls they make on a real file. A waiting
/// `lock_range` gives up after 30 s with an I/O error (a simulated process holding a lock
/// forever is a bug of the test). Lock calls work after a power failure too: the locks are
/// the processes', not the disk's.
pub struct SimBackend {
    line: Arc<Mutex<Line>>,
    /// The backend's file: its index in the line's `files`
    file: usize,
    /// Whose locks these are: one id per backend of the file.
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

/// A power line and the files on it, behind one lock: a call on any file is at one point of the
/// line's count, and a crash is one moment for every file.
struct Line {
    /// Mutating calls that reached any file of the line while it had power, the failing one
    /// included
    mutating_ops: u64,
    /// Index (counted like `mutating_ops`, from zero) of the mutating call at which power fails
    crash_at: Option<u64>,
    crashed: bool,
    /// At least one; never shrinks, so a `SimDisk`'s index stays valid
    files: Vec<File>,
}

struct File {
    seed: u64,
    live: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Op>,
    /// Mutating calls that reached this file while the line had power, the failing one included
    mutating_ops: u64,
    syncs: u64,
    max_len: u64,
    /// The byte-range locks of every backend of the file.
    locks: Vec<HeldLock>,
    /// The id the next backend gets.
    next_backend: u64,
}

impl SimDisk {
    /// An empty file (length zero) on a power line of its own, whose crash images are drawn from
    /// `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk::from_image(Vec::new(), seed)
    }

    /// A file whose durable and live image are both `image`, with nothing unsynced, on a power
    /// line of its own with power on: the file after a reboot, when `image` is another file's
    /// [`crash_image`](Self::crash_image). Its crash images are drawn from `seed`.
    ///
    /// The image is taken as it is, even if it is longer than the cap on `set_len`.
    pub fn from_image(image: Vec<u8>, seed: u64) -> SimDisk {
        let line = Line {
            mutating_ops: 0,
            crash_at: None,
            crashed: false,
            files: vec![File::from_image(image, seed)],
        };
        SimDisk {
            line: Arc::new(Mutex::new(line)),
            file: 0,
        }
    }

    /// Another file on this file's power line: empty (length zero), with its own images, log,
    /// cap, counts and locks, and crash images drawn from `seed`. Its mutating calls are counted
    /// with those of every file of the line, and power fails for all of them at once; see the
    /// [module documentation](self).
    ///
    /// A file added after power failed is dead from the start, as the others.
    ///
    /// # Examples
    ///
    /// ```
    /// use leaseq::sim::SimDisk;
    /// use redb::StorageBackend;
    ///
    /// let db_file = SimDisk::new(1);
    /// let journal = db_file.sibling(2);
    /// journal.crash_after(0);
    /// assert!(db_file.backend().set_len(512).is_err());
    /// assert!(journal.backend().len().is_err());
    /// ```
    pub fn sibling(&self, seed: u64) -> SimDisk {
        self.sibling_from_image(Vec::new(), seed)
    }

    /// Another file on this file's power line, whose durable and live image are both `image`,
    /// with nothing unsynced: with [`from_image`](Self::from_image), a reboot of a line of
    /// several files. Otherwise as [`sibling`](Self::sibling).
    pub fn sibling_from_image(&self, image: Vec<u8>, seed: u64) -> SimDisk {
        let mut line = self.lock();
        line.files.push(File::from_image(image, seed));
        SimDisk {
            line: Arc::clone(&self.line),
            file: line.files.len() - 1,
        }
    }

    /// A new [`redb::StorageBackend`] on this file, for
    /// [`redb::Builder::create_with_backend`]. It shares this file's state.
    pub fn backend(&self) -> SimBackend {
        let id = {
            let mut line = self.lock();
            let file = &mut line.files[self.file];
            file.next_backend += 1;
            file.next_backend - 1
        };
        SimBackend {
            line: Arc::clone(&self.line),
            file: self.file,
            id,
        }
    }

    /// Sets the cap on this file's length, in bytes: a later `set_len` above it fails with
    /// [`io::ErrorKind::FileTooLarge`] and changes nothing. Defaults to [`DEFAULT_MAX_LEN`].
    /// A file already longer than the cap is left as it is.
    pub fn set_max_len(&self, bytes: u64) {
        self.lock().files[self.file].max_len = bytes;
    }

    /// Plans a power failure at the mutating call (`write`, `set_len` or `sync_data`, on any
    /// backend of any file of this file's power line) that comes `mutating_ops` such calls from
    /// now: `0` is the very next one. That call takes no effect; it and every later I/O call on
    /// the line's files (`len` and `read` included) return an I/O error of kind
    /// [`io::ErrorKind::Other`].
    ///
    /// Replaces an earlier plan of the line. Does nothing once power has failed.
    pub fn crash_after(&self, mutating_ops: u64) {
        let mut line = self.lock();
        if !line.crashed {
            line.crash_at = Some(line.mutating_ops.saturating_add(mutating_ops));
        }
    }

    /// Makes power fail now for this file's line: every later I/O call on any of its files
    /// returns an I/O error of kind [`io::ErrorKind::Other`]. Does nothing if power has already
    /// failed.
    pub fn crash_now(&self) {
        self.lock().crashed = true;
    }

    /// Whether power has failed on this file's line.
    pub fn is_crashed(&self) -> bool {
        self.lock().crashed
    }

    /// The number of mutating calls (`write`, `set_len`, `sync_data`) made on the files of this
    /// file's power line while it had power, counting failed ones and the one at which power
    /// failed, but none after it. For a file alone on its line, that file's calls.
    ///
    /// A workload that makes `n` of them on fresh files can be crashed at any of them with
    /// `crash_after(k)` for `k` in `0..n`.
    pub fn mutating_ops(&self) -> u64 {
        self.lock().mutating_ops
    }

    /// The number of mutating calls made on this file alone, counted as
    /// [`mutating_ops`](Self::mutating_ops) counts the line's.
    pub fn file_mutating_ops(&self) -> u64 {
        self.lock().files[self.file].mutating_ops
    }

    /// The number of this file's `sync_data` calls that succeeded.
    pub fn syncs(&self) -> u64 {
        self.lock().files[self.file].syncs
    }

    /// The bytes of this file that would be on the disk if power failed now, or that are on it if
    /// power has failed: the durable image with each unsynced write kept, dropped or torn, and
    /// each unsynced `set_len` kept or dropped, as the [module documentation](self) describes. A
    /// pure function of the file's seed and the calls made on it so far: asking again gives the
    /// same image, and the line's other files do not change it.
    pub fn crash_image(&self) -> Vec<u8> {
        self.lock().files[self.file].crash_image()
    }

    /// A copy of the durable image, in bytes: the file as of its last successful `sync_data` (or
    /// as given to [`from_image`](Self::from_image)).
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().files[self.file].durable.clone()
    }

    /// A copy of the live image, in bytes: the file as reads see it, with every successful
    /// `write` and `set_len` so far.
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().files[self.file].live.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Line> {
        lock(&self.line)
    }
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        lock(&self.line).fmt_fields("SimDisk", self.file, f)
    }
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        lock(&self.line).fmt_fields("SimBackend", self.file, f)
    }
}

// A panic while the lock is held leaves the state consistent (every update is a single
// assignment or a completed copy), so a poisoned lock is read through
fn lock(line: &Mutex<Line>) -> MutexGuard<'_, Line> {
    line.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Line {
    // Hand-written so that no image is printed byte by byte
    fn fmt_fields(&self, name: &str, file: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let this = &self.files[file];
        f.debug_struct(name)
            .field("seed", &this.seed)
            .field("live_len", &this.live.len())
            .field("durable_len", &this.durable.len())
            .field("unsynced_ops", &this.unsynced.len())
            .field("file_mutating_ops", &this.mutating_ops)
            .field("syncs", &this.syncs)
            .field("file", &file)
            .field("line_files", &self.files.len())
            .field("mutating_ops", &self.mutating_ops)
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

    // Counts a mutating call on `file`, failing it (and the line's power) if it is the planned
    // crash point; on success, hands back the file to change
    fn begin_mutation(&mut self, file: usize) -> io::Result<&mut File> {
        self.ensure_powered()?;
        let index = self.mutating_ops;
        self.mutating_ops += 1;
        self.files[file].mutating_ops += 1;
        if self.crash_at.is_some_and(|at| index >= at) {
            self.crashed = true;
            return Err(power_lost());
        }
        Ok(&mut self.files[file])
    }

    // The file a read-only call looks at, if the line has power
    fn powered_file(&self, file: usize) -> io::Result<&File> {
        self.ensure_powered()?;
        Ok(&self.files[file])
    }
}

impl File {
    fn from_image(image: Vec<u8>, seed: u64) -> File {
        File {
            seed,
            durable: image.clone(),
            live: image,
            unsynced: Vec::new(),
            mutating_ops: 0,
            syncs: 0,
            max_len: DEFAULT_MAX_LEN,
            locks: Vec::new(),
            next_backend: 1,
        }
    }

    // See `SimDisk::crash_image`; the draws depend on this file's seed and log alone
    fn crash_image(&self) -> Vec<u8> {
        let mut rng = Rng::with_seed(self.seed);
        let mut image = self.durable.clone();
        for op in &self.unsynced {
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
    /// another backend's of the same file.
    fn conflicts(file: &File, me: u64, span: (u64, u64), exclusive: bool) -> bool {
        file.locks.iter().any(|l| {
            l.backend != me && l.start < span.1 && span.0 < l.end && (exclusive || l.exclusive)
        })
    }

    fn try_lock(&self, start: Bound<u64>, end: Bound<u64>, exclusive: bool) -> bool {
        let span = lock_span(start, end);
        let mut line = lock(&self.line);
        let file = &mut line.files[self.file];
        if SimBackend::conflicts(file, self.id, span, exclusive) {
            return false;
        }
        file.locks.push(HeldLock {
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
            line: Arc::clone(&self.line),
            file: self.file,
            id: self.id,
        }
    }
}

impl redb::StorageBackend for SimBackend {
    fn close(&self) -> Result<(), io::Error> {
        lock(&self.line).files[self.file]
            .locks
            .retain(|l| l.backend != self.id);
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
        lock(&self.line).files[self.file]
            .locks
            .retain(|l| !(l.backend == self.id && l.start == s && l.end == e));
        Ok(())
    }

    fn query_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        let line = lock(&self.line);
        Ok(SimBackend::conflicts(
            &line.files[self.file],
            self.id,
            lock_span(start, end),
            true,
        ))
    }

    fn len(&self) -> Result<u64, io::Error> {
        let line = lock(&self.line);
        let file = line.powered_file(self.file)?;
        Ok(file.live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let line = lock(&self.line);
        let file = line.powered_file(self.file)?;
        let range = range_in(file.live.len(), offset, out.len()).ok_or_else(out_of_range)?;
        out.copy_from_slice(&file.live[range]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut line = lock(&self.line);
        let file = line.begin_mutation(self.file)?;
        if len > file.max_len || usize::try_from(len).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!(
                    "simulated file length {len} is above the cap of {} bytes",
                    file.max_len
                ),
            ));
        }
        set_len(&mut file.live, len);
        file.unsynced.push(Op::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut line = lock(&self.line);
        let file = line.begin_mutation(self.file)?;
        // Replaying the log keeps the cost to the bytes written, not the file's size
        for op in file.unsynced.drain(..) {
            match op {
                Op::SetLen(len) => set_len(&mut file.durable, len),
                Op::Write { offset, data } => write_clipped(&mut file.durable, offset, &data),
            }
        }
        file.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut line = lock(&self.line);
        let file = line.begin_mutation(self.file)?;
        let range = range_in(file.live.len(), offset, data.len()).ok_or_else(out_of_range)?;
        file.live[range].copy_from_slice(data);
        file.unsynced.push(Op::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }
}
