//! What differs between operating systems, in one place: positional reads, and putting a
//! new, finished file in place under its name durably without ever replacing a file.
//!
//! leaseq runs on Unix (Linux, macOS, Android, iOS) and Windows. Everything here uses the
//! standard library only; a platform without a branch of its own gets the portable one.

use std::fs::{self, File};
use std::io;
#[cfg(unix)]
use std::os::unix::fs::FileExt;
#[cfg(windows)]
use std::os::windows::fs::FileExt;
use std::path::Path;

/// Reads exactly `buf.len()` bytes of `file` at byte `offset`.
///
/// On Windows the file's cursor moves (`seek_read`); callers use the handle for positional
/// reads only. Elsewhere, beside Unix, the portable branch seeks: callers must serialize.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        file.read_exact_at(buf, offset)
    }
    #[cfg(windows)]
    {
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
/// `EPERM` on Linux, `ERROR_INVALID_FUNCTION` on Windows, `ERROR_ACCESS_DENIED` under wine)
/// gets a rename done while holding an
/// exclusive lock on `lock` (a small file kept beside the queue file): every creator of the
/// name takes that lock and looks for the name first, so no rename ever replaces a file
/// another creator put there. `tmp` is left for the caller to remove. This holds while every
/// creator of a name sees the same answer from `link` there (a file system either has hard
/// links or not): a creator whose link succeeds takes no lock, so one whose link failed on
/// the same directory for a reason of its own (a sandbox refusing only it) could rename over
/// the linked file. The standard library has no rename that refuses to replace.
///
/// Durability: on Unix the directory is fsynced after the name is in place. Windows cannot
/// flush a directory through the standard library; NTFS journals the new name, and flushing
/// the file through the new name (`FlushFileBuffers`) forces the volume's log, which holds
/// the name, to disk.
pub(crate) fn place_new(tmp: &Path, path: &Path, lock: &Path, dir: &Path) -> io::Result<Placed> {
    place_new_with(|from, to| fs::hard_link(from, to), tmp, path, lock, dir)
}

/// [`place_new`] with `link` for `fs::hard_link` (tests stand in a file system without).
fn place_new_with(
    link: impl FnOnce(&Path, &Path) -> io::Result<()>,
    tmp: &Path,
    path: &Path,
    lock: &Path,
    dir: &Path,
) -> io::Result<Placed> {
    let placed = match link(tmp, path) {
        Ok(()) => Placed::Linked,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Placed::Existed,
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
                Ok(_) => Placed::Existed,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::rename(tmp, path)?;
                    Placed::Renamed
                }
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    // Also when another creator placed it: this caller is about to use the file, and that
    // creator may not have made its name durable yet (or died before it could).
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
        // ERROR_INVALID_FUNCTION (Windows' FAT and exFAT), ERROR_NOT_SUPPORTED (some network
        // and pooled drives), ERROR_ACCESS_DENIED (wine on exFAT; where it means a directory
        // refusing new names, the rename is refused the same way).
        matches!(e.raw_os_error(), Some(1) | Some(50) | Some(5))
    }
    #[cfg(not(any(unix, windows)))]
    {
        false
    }
}

/// Makes the new name `path` in `dir` durable (see [`place_new`]).
/// Makes the name `path` (a new file in `dir`) durable: the directory's fsync on Unix, the
/// file's flush on Windows (which cannot open a directory for it).
pub(crate) fn sync_name(path: &Path, dir: &Path) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    /// What `link` answers on a file system without hard links, on this OS.
    fn no_links(_: &Path, _: &Path) -> io::Result<()> {
        // EPERM on Unix, ERROR_INVALID_FUNCTION on Windows: both 1.
        Err(io::Error::from_raw_os_error(1))
    }

    fn tmp_with(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn without_hard_links_a_rename_places_the_file_and_never_replaces_one() {
        let d = tempfile::tempdir().unwrap();
        let (path, lock) = (d.path().join("q"), d.path().join(".q.create-lock"));
        let tmp = tmp_with(d.path(), "t1", b"first");
        let placed = place_new_with(no_links, &tmp, &path, &lock, d.path()).unwrap();
        assert_eq!(placed, Placed::Renamed);
        assert_eq!(fs::read(&path).unwrap(), b"first");
        assert!(!tmp.exists(), "the temporary file became the queue file");
        assert!(lock.exists(), "the create lock stays beside it");
        // A second creator finds the name taken and leaves the file alone.
        let tmp = tmp_with(d.path(), "t2", b"second");
        let placed = place_new_with(no_links, &tmp, &path, &lock, d.path()).unwrap();
        assert_eq!(placed, Placed::Existed);
        assert_eq!(fs::read(&path).unwrap(), b"first");
        assert_eq!(fs::read(&tmp).unwrap(), b"second", "left for the caller");
    }

    /// Creators racing for one name without hard links: exactly one file is placed, every
    /// other creator sees it, and the file is the winner's, whole.
    #[test]
    fn racing_creators_without_hard_links_place_exactly_one_file() {
        for round in 0..20 {
            let d = Arc::new(tempfile::tempdir().unwrap());
            let n = 6;
            let gate = Arc::new(Barrier::new(n));
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let (d, gate) = (d.clone(), gate.clone());
                    std::thread::spawn(move || {
                        let dir = d.path();
                        let tmp =
                            tmp_with(dir, &format!("t{i}"), format!("creator {i}").as_bytes());
                        gate.wait();
                        let placed = place_new_with(
                            no_links,
                            &tmp,
                            &dir.join("q"),
                            &dir.join(".q.create-lock"),
                            dir,
                        )
                        .unwrap();
                        (i, placed)
                    })
                })
                .collect();
            let results: Vec<(usize, Placed)> =
                handles.into_iter().map(|h| h.join().unwrap()).collect();
            let winners: Vec<usize> = results
                .iter()
                .filter(|(_, p)| *p == Placed::Renamed)
                .map(|(i, _)| *i)
                .collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            assert!(results.iter().all(|(_, p)| *p != Placed::Linked));
            let content = fs::read_to_string(d.path().join("q")).unwrap();
            assert_eq!(content, format!("creator {}", winners[0]), "round {round}");
        }
    }

    #[test]
    fn with_hard_links_the_link_places_the_file_and_an_existing_name_wins() {
        let d = tempfile::tempdir().unwrap();
        let (path, lock) = (d.path().join("q"), d.path().join(".q.create-lock"));
        let tmp = tmp_with(d.path(), "t1", b"first");
        assert_eq!(
            place_new(&tmp, &path, &lock, d.path()).unwrap(),
            Placed::Linked
        );
        assert!(!lock.exists(), "no lock file where links work");
        let tmp = tmp_with(d.path(), "t2", b"second");
        assert_eq!(
            place_new(&tmp, &path, &lock, d.path()).unwrap(),
            Placed::Existed
        );
        assert_eq!(fs::read(&path).unwrap(), b"first");
    }

    /// A link refused for a reason a rename shares (a missing directory) is that error, with
    /// no fallback and nothing written.
    #[test]
    fn other_link_errors_are_returned_as_they_are() {
        let d = tempfile::tempdir().unwrap();
        let tmp = tmp_with(d.path(), "t", b"x");
        let gone = d.path().join("no-such-dir");
        let e = place_new(&tmp, &gone.join("q"), &gone.join(".q.create-lock"), &gone).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(!gone.exists());
        assert_eq!(fs::read(&tmp).unwrap(), b"x");
    }

    #[test]
    fn positional_reads_read_exactly_and_fail_past_the_end() {
        let d = tempfile::tempdir().unwrap();
        let p = tmp_with(d.path(), "f", &(0..=255u8).collect::<Vec<_>>());
        let f = File::open(&p).unwrap();
        let mut buf = [0u8; 4];
        read_exact_at(&f, &mut buf, 100).unwrap();
        assert_eq!(buf, [100, 101, 102, 103]);
        read_exact_at(&f, &mut buf, 0).unwrap();
        assert_eq!(buf, [0, 1, 2, 3]);
        let e = read_exact_at(&f, &mut buf, 254).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
