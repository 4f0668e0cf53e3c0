//! A storage backend for looking at a file that needs repair without changing it.
//!
//! A file left by a crashed writer cannot be opened read-only: redb must repair it first,
//! and the repair writes. To refuse a foreign or newer file byte-identical even then, leaseq
//! first opens it on a [`ScratchBackend`]: reads come from the file, writes stay in memory
//! (4 KiB pages), nothing is synced. Only if that look finds a leaseq file it can read does
//! the real, writable open follow.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use redb::BackendError;

use crate::platform;

const PAGE_BYTES: u64 = 4096;

/// Reads through to a file; keeps every write in memory.
#[derive(Debug)]
pub(crate) struct ScratchBackend {
    file: File,
    file_len: u64,
    /// redb's own file backend on the same file, used for its locks only (never read or
    /// written through): a look takes the locks a real open would, so a file another
    /// process or another handle of this one holds is `DatabaseAlreadyOpen` before any of
    /// its pages are read, never a look at pages changing under it.
    locks: Option<redb::backends::FileBackend>,
    state: Mutex<Scratch>,
    /// Set once the look is over: every later write or sync fails (see [`Retire`]).
    retired: Arc<AtomicBool>,
}

/// Ends a scratch look cheaply. Closing a redb database saves its allocator state, a
/// commit whose cost grows with the file (~40 ms for 270 MiB), all of it thrown away with
/// the scratch copy. After [`Retire::retire`], every write and sync of the backend fails;
/// redb latches the first such failure and then closes without writing anything.
#[derive(Debug, Clone)]
pub(crate) struct Retire(Arc<AtomicBool>);

impl Retire {
    /// Makes every later write, `set_len` and sync of the scratch backend fail, then lets
    /// `db` fail one commit so that its close skips the allocator-state save.
    pub(crate) fn retire(&self, db: &redb::Database) {
        self.0.store(true, Ordering::SeqCst);
        // The commit is meant to fail (its first write does); its error is the point.
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            db.begin_write().map(|tx| tx.commit().is_err())
        }));
        debug_assert!(
            !matches!(failed, Ok(Ok(false))),
            "a retired scratch commit succeeded"
        );
    }
}

#[derive(Debug)]
struct Scratch {
    len: u64,
    /// Written pages, whole; a page not here reads from the file (zeros past its end).
    pages: HashMap<u64, Box<[u8]>>,
}

impl ScratchBackend {
    pub(crate) fn new(file: File) -> io::Result<ScratchBackend> {
        let file_len = file.metadata()?.len();
        Ok(ScratchBackend {
            file,
            file_len,
            locks: None,
            state: Mutex::new(Scratch {
                len: file_len,
                pages: HashMap::new(),
            }),
            retired: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A scratch look at the file at `path` that takes redb's file locks as a writable open
    /// would (on a second descriptor opened read-write; nothing is written through it).
    pub(crate) fn locked(path: &std::path::Path) -> io::Result<ScratchBackend> {
        let lock_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let locks = redb::backends::FileBackend::new(lock_file).map_err(io::Error::other)?;
        let mut scratch = ScratchBackend::new(File::open(path)?)?;
        scratch.locks = Some(locks);
        Ok(scratch)
    }

    fn lock_backend(&self) -> Result<&redb::backends::FileBackend, redb::BackendError> {
        self.locks.as_ref().ok_or(redb::BackendError::Unsupported)
    }

    /// The switch that ends this backend's look (take it before handing the backend to redb).
    pub(crate) fn retire_handle(&self) -> Retire {
        Retire(self.retired.clone())
    }

    fn ensure_live(&self) -> io::Result<()> {
        if self.retired.load(Ordering::SeqCst) {
            return Err(io::Error::other("scratch copy retired"));
        }
        Ok(())
    }

    /// The file's own bytes of page `n` (zeros past the end of the file).
    fn file_page(&self, n: u64) -> io::Result<Box<[u8]>> {
        let mut page = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
        let start = n * PAGE_BYTES;
        if start < self.file_len {
            let end = (start + PAGE_BYTES).min(self.file_len);
            // Callers hold the state lock (the portable branch of `read_exact_at` seeks).
            platform::read_exact_at(&self.file, &mut page[..(end - start) as usize], start)?;
        }
        Ok(page)
    }
}

/// Calls `f(page, offset in page, offset in the buffer, bytes)` for each page piece of the
/// range `offset .. offset + len`, after checking the range lies within `storage_len`.
fn for_each_page(
    offset: u64,
    len: usize,
    storage_len: u64,
    mut f: impl FnMut(u64, usize, usize, usize) -> io::Result<()>,
) -> io::Result<()> {
    let end = offset.checked_add(len as u64).ok_or_else(out_of_range)?;
    if end > storage_len {
        return Err(out_of_range());
    }
    let mut pos = offset;
    while pos < end {
        let in_page = pos % PAGE_BYTES;
        let take = (PAGE_BYTES - in_page).min(end - pos);
        f(
            pos / PAGE_BYTES,
            in_page as usize,
            (pos - offset) as usize,
            take as usize,
        )?;
        pos += take;
    }
    Ok(())
}

fn out_of_range() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "read past the end of the storage",
    )
}

impl redb::StorageBackend for ScratchBackend {
    fn close(&self) -> io::Result<()> {
        match &self.locks {
            Some(l) => l.close(),
            None => Ok(()),
        }
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.lock_backend()?.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.lock_backend()?.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.lock_backend()?.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.lock_backend()?.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.lock_backend()?.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.lock_backend()?.query_lock_range(start, end)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let st = self.state.lock();
        for_each_page(offset, out.len(), st.len, |n, in_page, at, take| {
            let dst = &mut out[at..at + take];
            match st.pages.get(&n) {
                Some(page) => dst.copy_from_slice(&page[in_page..in_page + take]),
                None => dst.copy_from_slice(&self.file_page(n)?[in_page..in_page + take]),
            }
            Ok(())
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.ensure_live()?;
        let mut st = self.state.lock();
        if len < st.len {
            // Bytes past the new end must read as zeros if the file grows again.
            let first_dropped = len.div_ceil(PAGE_BYTES);
            st.pages.retain(|&n, _| n < first_dropped);
            if !len.is_multiple_of(PAGE_BYTES) {
                let n = len / PAGE_BYTES;
                let mut page = match st.pages.remove(&n) {
                    Some(p) => p,
                    None => self.file_page(n)?,
                };
                page[(len % PAGE_BYTES) as usize..].fill(0);
                st.pages.insert(n, page);
            }
            // Pages of the file beyond the cut must not show through again either.
            let file_pages = self.file_len.div_ceil(PAGE_BYTES);
            for n in first_dropped..file_pages {
                st.pages
                    .insert(n, vec![0u8; PAGE_BYTES as usize].into_boxed_slice());
            }
        }
        st.len = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.ensure_live()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.ensure_live()?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        for_each_page(offset, data.len(), st.len, |n, in_page, at, take| {
            let page = match st.pages.entry(n) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(self.file_page(n)?),
            };
            page[in_page..in_page + take].copy_from_slice(&data[at..at + take]);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, StorageBackend};
    use std::io::Write;

    #[test]
    fn writes_stay_in_memory_and_reads_see_them() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let original: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&original).unwrap();
        let b = ScratchBackend::new(File::open(f.path()).unwrap()).unwrap();
        b.write(4090, &[9; 20]).unwrap();
        let mut got = vec![0; 30];
        b.read(4085, &mut got).unwrap();
        assert_eq!(&got[..5], &original[4085..4090]);
        assert_eq!(&got[5..25], &[9; 20]);
        assert_eq!(&got[25..], &original[4110..4115]);
        b.set_len(5000).unwrap();
        b.set_len(12_000).unwrap();
        let mut tail = vec![1; 7000];
        b.read(5000, &mut tail).unwrap();
        assert!(
            tail.iter().all(|&x| x == 0),
            "bytes past a cut read as zeros"
        );
        assert!(b.read(11_999, &mut [0; 2]).is_err());
        assert_eq!(std::fs::read(f.path()).unwrap(), original, "file untouched");
    }

    #[test]
    fn a_retired_scratch_refuses_commits_and_leaves_the_file_alone() {
        const T: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("t");
        let f = tempfile::NamedTempFile::new().unwrap();
        {
            let db = redb::Database::create(f.path()).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(T).unwrap().insert(1, 2).unwrap();
            tx.commit().unwrap();
        }
        let before = std::fs::read(f.path()).unwrap();
        let b = ScratchBackend::new(File::open(f.path()).unwrap()).unwrap();
        let retire = b.retire_handle();
        let db = redb::Builder::new().create_with_backend(b).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(T).unwrap().insert(3, 4).unwrap();
        tx.commit().unwrap();
        retire.retire(&db);
        let tx = db.begin_write();
        assert!(
            tx.is_err() || tx.unwrap().commit().is_err(),
            "a commit after retire must fail"
        );
        let rtx = db.begin_read().unwrap();
        assert_eq!(
            rtx.open_table(T).unwrap().get(3).unwrap().unwrap().value(),
            4
        );
        drop(rtx);
        drop(db);
        assert_eq!(std::fs::read(f.path()).unwrap(), before, "file untouched");
    }
}
