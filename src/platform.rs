//! What differs between operating systems, in one place: positional reads, and putting a
//! new, finished file in place under its name durably without ever replacing a file.
//!
//! leaseq runs on Unix (Linux, macOS, Android, iOS) and Windows. Everything here uses the
//! standard library only; a platform without a branch of its own gets the portable one.

use std::fs::{self, File};
use std::io;
use std::path::Path;

/// Reads exactly `buf.len()` bytes of `file` at byte `offset`.
///
/// On Windows the file's cursor moves (`seek_read`); callers use the handle for positional
/// reads only. Elsewhere, beside Unix, the portable branch seeks: callers must serialize.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(buf, offset)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::FileExt;
        let (mut done, mut at) = (0, offset);
        while done < buf.len() {
            match file.seek_read(&mut buf[done..], at) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file ended before the bytes asked for",
                    ));
                }
                Ok(n) => {
                    done += n;
                    at += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    #[cfg(not(any(unix, windows)))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(buf)
    }
}

/// Flushes `path`'s data and metadata to stable storage. The handle is opened for writing:
/// Windows flushes (`FlushFileBuffers`) only through a handle with write access.
pub(crate) fn sync_file(path: &Path) -> io::Result<()> {
    fs::OpenOptions::new().write(true).open(path)?.sync_all()
}

/// How [`place_new`] put the file under its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Linked: `path` is now the finished file.
    Linked,
    /// Renamed under the directory's create lock (a file system without hard links).
    Renamed,
    /// `path` already existed (another creator was first): left as it was.
    Existed,
}

/// Puts the finished, flushed file `tmp` under the name `path` if, and only if, no file has
/// that name, and makes the name durable. Never replaces a file.
///
/// A hard link is the one way the standard library offers to give a file a name only if
/// the name is free, atomically, on every platform (`link(2)`, `CreateHardLinkW`). A file
/// system without hard links (FAT32, exFAT: SD cards and USB sticks; `link` fails with
/// `EPERM` on Linux, `ERROR_INVALID_FUNCTION` on Windows) gets a rename done while holding an
/// exclusive lock on `lock` (a small file kept beside the queue file): every creator of the
/// name takes that lock and looks for the name first, so no rename ever replaces a file
/// another creator put there. `tmp` is left for the caller to remove.
///
/// Durability: on Unix the directory is fsynced after the name is in place. Windows cannot
/// flush a directory through the standard library; NTFS journals the new name, and flushing
/// the file through the new name (`FlushFileBuffers`) forces the volume's log, which holds
/// the name, to disk.
pub(crate) fn place_new(tmp: &Path, path: &Path, lock: &Path, dir: &Path) -> io::Result<Placed> {
    let placed = match fs::hard_link(tmp, path) {
        Ok(()) => Placed::Linked,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(Placed::Existed),
        Err(e) if no_hard_links(&e) => {
            let lock_file = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(lock)?;
            // Held for a create only (milliseconds); released when the handle drops, also
            // by the OS if this process dies.
            lock_file.lock()?;
            match fs::symlink_metadata(path) {
                Ok(_) => return Ok(Placed::Existed),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            fs::rename(tmp, path)?;
            sync_name(path, dir)?;
            return Ok(Placed::Renamed);
        }
        Err(e) => return Err(e),
    };
    sync_name(path, dir)?;
    Ok(placed)
}

/// Whether a failed `hard_link` means the file system has no hard links (as opposed to a
/// reason a rename would fail for too: a missing directory, no permission to write it).
fn no_hard_links(e: &io::Error) -> bool {
    if e.kind() == io::ErrorKind::Unsupported {
        return true;
    }
    #[cfg(unix)]
    {
        // EPERM (1): Linux's vfat/exfat answer; EOPNOTSUPP/ENOTSUP: macOS and others.
        // (EACCES, the permission error, is 13 and not here.)
        const EPERM: i32 = 1;
        const EOPNOTSUPP_LINUX: i32 = 95;
        const ENOTSUP_APPLE: i32 = 45;
        matches!(
            e.raw_os_error(),
            Some(EPERM) | Some(EOPNOTSUPP_LINUX) | Some(ENOTSUP_APPLE)
        )
    }
    #[cfg(windows)]
    {
        // ERROR_INVALID_FUNCTION (FAT, exFAT), ERROR_NOT_SUPPORTED.
        matches!(e.raw_os_error(), Some(1) | Some(50))
    }
    #[cfg(not(any(unix, windows)))]
    {
        false
    }
}

/// Makes the new name `path` in `dir` durable (see [`place_new`]).
fn sync_name(path: &Path, dir: &Path) -> io::Result<()> {
    #[cfg(windows)]
    {
        let _ = dir;
        sync_file(path)
    }
    #[cfg(not(windows))]
    {
        let _ = path;
        File::open(dir)?.sync_all()
    }
}
