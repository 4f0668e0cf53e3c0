//! Opening, creating and refusing files: atomic create, foreign files left byte-identical,
//! a second open refused (C21), newer format versions refused.

use crate::common::{ChildProc, Fixture, assert_consistent, child_scenario, ready_to_die, say};
use leaseq::{EnqueueOptions, Error, Queue};
use redb::{ReadableDatabase, TableDefinition, TableHandle};
use std::fs;

/// Asserts the file still holds exactly `bytes` (without printing megabytes on failure).
fn assert_unchanged(f: &Fixture, bytes: &[u8]) {
    let now = fs::read(&f.path).unwrap();
    let first_diff = now.iter().zip(bytes).position(|(a, b)| a != b);
    assert!(
        now == bytes,
        "refused file was modified: {} bytes, was {}; first difference at {first_diff:?}",
        now.len(),
        bytes.len()
    );
}

fn refused_unchanged(f: &Fixture, bytes: &[u8]) -> Error {
    fs::write(&f.path, bytes).unwrap();
    let err = f.builder().open(&f.path).unwrap_err();
    assert_unchanged(f, bytes);
    err
}

#[test]
fn text_file_is_refused_unchanged() {
    let f = Fixture::new();
    let err = refused_unchanged(
        &f,
        b"hello, I am a text file that is long enough to hold a header.\n",
    );
    assert!(matches!(err, Error::NotLeaseq { .. }), "{err:?}");
    let long_text = "line of text\n".repeat(1000);
    let err = refused_unchanged(&f, long_text.as_bytes());
    assert!(matches!(err, Error::NotLeaseq { .. }), "{err:?}");
}

#[test]
fn empty_and_short_files_are_refused_unchanged_never_recreated() {
    let f = Fixture::new();
    let err = refused_unchanged(&f, b"");
    assert!(
        matches!(err, Error::Truncated { len_bytes: 0, .. }),
        "{err:?}"
    );
    let err = refused_unchanged(&f, b"redb\x1A\x0A\xA9\x0D\x0A");
    assert!(
        matches!(err, Error::Truncated { len_bytes: 9, .. }),
        "{err:?}"
    );
}

#[test]
fn plain_redb_file_is_refused_unchanged_and_attach_adds_tables() {
    const NOTES: TableDefinition<u64, &str> = TableDefinition::new("notes");
    let f = Fixture::new();
    {
        let db = redb::Database::create(&f.path).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(NOTES).unwrap().insert(1, "mine").unwrap();
        tx.commit().unwrap();
    }
    let bytes = fs::read(&f.path).unwrap();
    let err = f.builder().open(&f.path).unwrap_err();
    assert!(matches!(err, Error::NotLeaseq { .. }), "{err:?}");
    assert_unchanged(&f, &bytes);

    // Explicit attach: leaseq's tables join the caller's database; its data stays.
    let db = redb::Database::create(&f.path).unwrap();
    let q = f.builder().attach(db).unwrap();
    let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
    {
        use redb::ReadableDatabase;
        let rtx = q.database().begin_read().unwrap();
        let notes = rtx.open_table(NOTES).unwrap();
        assert_eq!(notes.get(1).unwrap().unwrap().value(), "mine");
    }
    drop(q);
    // Now it is a leaseq file: a plain open works and finds the job.
    let q = f.open();
    assert_eq!(q.dequeue().unwrap().unwrap().id(), id);
}

#[test]
fn newer_format_version_is_refused_unchanged() {
    const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");
    let f = Fixture::new();
    drop(f.open());
    {
        let db = redb::Database::open(&f.path).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(META)
            .unwrap()
            .insert("format_version", leaseq::FORMAT_VERSION + 1)
            .unwrap();
        tx.commit().unwrap();
    }
    let bytes = fs::read(&f.path).unwrap();
    match f.builder().open(&f.path) {
        Err(Error::UnsupportedVersion { found, supported }) => {
            assert_eq!(
                (found, supported),
                (leaseq::FORMAT_VERSION + 1, leaseq::FORMAT_VERSION)
            );
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
    assert_unchanged(&f, &bytes);
}

#[test]
fn create_leaves_no_temporary_file_and_reopen_keeps_jobs() {
    let f = Fixture::new();
    let q = f.open();
    assert!(q.recovery().created);
    let id = q.enqueue(b"kept", EnqueueOptions::default()).unwrap().id();
    drop(q);
    let names: Vec<_> = fs::read_dir(f.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(
        names,
        vec![
            "q.leaseq".to_string(),
            "q.leaseq-journal".to_string(),
            "q.leaseq-reserve".to_string()
        ]
    );
    let q = f.open();
    assert!(!q.recovery().created);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.payload()), (id, &b"kept"[..]));
}

#[test]
fn directory_path_is_refused() {
    let f = Fixture::new();
    let err = f.builder().open(f.dir.path()).unwrap_err();
    assert!(matches!(err, Error::NotLeaseq { .. }), "{err:?}");
}

// C21: a second open in the same process is refused, runs no recovery, and the first
// handle's lease is intact.
#[test]
fn second_open_in_process_is_refused_and_runs_no_recovery() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    match f.builder().open(&f.path) {
        Err(Error::AlreadyOpen { path, .. }) => assert_eq!(path, f.path),
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.lease_token, Some(l.token()));
    l.ack().unwrap();
    assert_consistent(&q);
}

/// Child side of `second_open_from_another_process_is_refused`.
#[test]
fn child_entry_files() {
    let Some((scenario, path)) = child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    match scenario.as_str() {
        "hold_open" => {
            let q = Queue::open(&path).unwrap();
            let l = q.dequeue().unwrap().unwrap();
            say(l.token());
            ready_to_die(); // while holding the queue and the lease
        }
        // Leave a redb file that needs repair: commit, then die without closing.
        "crash_plain_redb" => {
            const NOTES: TableDefinition<u64, &str> = TableDefinition::new("notes");
            let db = redb::Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(NOTES).unwrap().insert(1, "mine").unwrap();
            tx.commit().unwrap();
            std::mem::forget(db);
        }
        "crash_newer_version" => {
            drop(Queue::open(&path).unwrap());
            const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");
            let db = redb::Database::open(&path).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(META)
                .unwrap()
                .insert("format_version", leaseq::FORMAT_VERSION + 1)
                .unwrap();
            tx.commit().unwrap();
            std::mem::forget(db);
        }
        other => panic!("unknown scenario {other}"),
    }
    ready_to_die();
}

// C21 across processes: the other process's open is refused without hanging.
#[test]
fn second_open_from_another_process_is_refused() {
    let f = Fixture::new();
    {
        let q = Queue::open(&f.path).unwrap();
        let _ = q.enqueue(b"A", EnqueueOptions::default()).unwrap();
    }
    let mut child = ChildProc::spawn("files::child_entry_files", "hold_open", &f.path);
    let said = child.until_ready();
    let token: u64 = said[0].parse().unwrap();
    let err = Queue::open(&f.path).unwrap_err();
    assert!(matches!(err, Error::AlreadyOpen { .. }), "{err:?}");
    child.kill();
    // Once the holder is gone, the open recovers its lease.
    let q = Queue::open(&f.path).unwrap();
    assert_eq!(q.recovery().leases_returned, 1);
    let l = q.dequeue().unwrap().unwrap();
    assert!(l.token() > token);
    assert_eq!(l.attempt(), 2);
}

/// Runs `scenario` in a child that dies (SIGKILL) without closing the file it wrote.
fn crashed_file(f: &Fixture, scenario: &str) -> Vec<u8> {
    let mut child = ChildProc::spawn("files::child_entry_files", scenario, &f.path);
    child.until_ready();
    child.kill();
    fs::read(&f.path).unwrap()
}

/// A file left by a crashed writer needs repair, which writes; the open must still refuse
/// it byte-identical (the repair is tried on a scratch copy in memory first).
fn crashed_file_is_refused_unchanged(scenario: &str, expected: fn(&Error) -> bool) {
    let f = Fixture::new();
    let bytes = crashed_file(&f, scenario);
    let err = f.builder().open(&f.path).unwrap_err();
    assert!(expected(&err), "{scenario}: {err:?}");
    assert_unchanged(&f, &bytes);
}

#[test]
fn crashed_foreign_redb_file_is_refused_unchanged() {
    crashed_file_is_refused_unchanged("crash_plain_redb", |e| matches!(e, Error::NotLeaseq { .. }));
}

#[test]
fn crashed_newer_version_file_is_refused_unchanged() {
    crashed_file_is_refused_unchanged("crash_newer_version", |e| {
        matches!(e, Error::UnsupportedVersion { .. })
    });
}

// attach refuses a newer format before writing anything into the caller's database.
#[test]
fn attach_refuses_newer_format_without_writing() {
    const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");
    let f = Fixture::new();
    {
        let db = redb::Database::create(&f.path).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(META)
            .unwrap()
            .insert("format_version", leaseq::FORMAT_VERSION + 1)
            .unwrap();
        tx.commit().unwrap();
    }
    let db = redb::Database::open(&f.path).unwrap();
    let err = f.builder().attach(db).unwrap_err();
    assert!(matches!(err, Error::UnsupportedVersion { .. }), "{err:?}");
    // Nothing was added: the caller's database still holds only its own table.
    let db = redb::Database::open(&f.path).unwrap();
    let rtx = db.begin_read().unwrap();
    let names: Vec<String> = rtx
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(names, vec!["leaseq_meta".to_string()]);
}

// Many threads opening one new path at once: exactly one gets the queue, the others
// AlreadyOpen. (Before threads took turns, a thread's writable open could meet another's look
// at the file and every one of them be refused: CI's run under wine, round 4 of 10.)
#[test]
fn concurrent_first_opens_create_one_file() {
    for round in 0..10 {
        let f = Fixture::new();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| f.builder().open(&f.path)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let opened = results.iter().filter(|r| r.is_ok()).count();
        for r in &results {
            assert!(
                matches!(r, Ok(_) | Err(Error::AlreadyOpen { .. })),
                "round {round}: {r:?}"
            );
        }
        assert_eq!(opened, 1, "round {round}: {results:?}");
        drop(results);
        // Exactly one file, its journal and its disk reserve, no temporary left behind.
        assert_eq!(fs::read_dir(f.dir.path()).unwrap().count(), 3);
    }
}

#[test]
fn attach_refuses_a_foreign_leaseq_table() {
    const JOBS: TableDefinition<&str, &str> = TableDefinition::new("leaseq_jobs");
    let f = Fixture::new();
    let db = redb::Database::create(&f.path).unwrap();
    let tx = db.begin_write().unwrap();
    tx.open_table(JOBS)
        .unwrap()
        .insert("mine", "not leaseq's")
        .unwrap();
    tx.commit().unwrap();
    let err = f.builder().attach(db).unwrap_err();
    assert!(matches!(err, Error::NotLeaseq { .. }), "{err:?}");
}

// attach with the integrity check on (the default) runs redb's check on the caller's database,
// which needs every transaction on it closed: a read transaction the caller still holds makes
// attach refuse (typed) and write nothing; with the check off, the same attach goes ahead
// (on 64-bit targets: on 32-bit the check cannot be turned off).
#[test]
fn attach_with_the_integrity_check_refuses_while_the_caller_holds_a_transaction() {
    use redb::ReadableDatabase;
    let f = Fixture::new();
    let db = redb::Database::create(&f.path).unwrap();
    let rtx = db.begin_read().unwrap();
    let err = f.builder().attach(db).unwrap_err();
    assert!(
        matches!(err, Error::Storage(redb::Error::TransactionInProgress)),
        "{err:?}"
    );
    drop(rtx);
    let db = redb::Database::create(&f.path).unwrap();
    let rtx = db.begin_read().unwrap();
    if cfg!(target_pointer_width = "32") {
        // On 32-bit the check stays on whatever the builder says (`Builder::check_integrity`).
        let err = f.builder().check_integrity(false).attach(db).unwrap_err();
        assert!(
            matches!(err, Error::Storage(redb::Error::TransactionInProgress)),
            "{err:?}"
        );
        return;
    }
    let q = f.builder().check_integrity(false).attach(db).unwrap();
    drop(rtx);
    q.enqueue(b"job", EnqueueOptions::default()).unwrap();
    assert_eq!(q.len().unwrap(), 1);
}

/// A path in a directory that does not exist is an `Io` error naming the directory; nothing
/// is created.
#[test]
fn a_missing_directory_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/q.leaseq");
    match leaseq::Queue::open(&path) {
        Err(leaseq::Error::Io(e)) => {
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            assert!(e.to_string().contains("no/such/dir"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!dir.path().join("no").exists());
}

/// A directory named by `var` (set by `.ci/run`, which mounts FAT volumes with fusefat), or
/// `None` with a note when the machine has none: FAT cannot be mounted without FUSE.
fn volume_dir(var: &str) -> Option<std::path::PathBuf> {
    match std::env::var_os(var) {
        Some(dir) => Some(dir.into()),
        None => {
            eprintln!("{var} not set: no such volume on this machine, nothing checked");
            None
        }
    }
}

/// FAT32 and exFAT (SD cards, USB sticks) have no hard links: a new queue is created by a
/// rename under a create lock kept beside it (`.<name>.create-lock`), and behaves as anywhere
/// else: jobs kept across a reopen, a second open refused, a second create using the file.
#[test]
fn a_volume_without_hard_links_gets_its_queue_by_rename() {
    let Some(dir) = volume_dir("LEASEQ_TEST_NO_LINK_DIR") else {
        return;
    };
    let work = dir.join(format!("files-{}", std::process::id()));
    fs::create_dir(&work).unwrap();
    // The fixture really has no hard links (else this test would prove nothing).
    fs::write(work.join("probe"), b"x").unwrap();
    let link = fs::hard_link(work.join("probe"), work.join("probe2"));
    assert!(link.is_err(), "{} allows hard links", dir.display());
    fs::remove_file(work.join("probe")).unwrap();
    let path = work.join("q.leaseq");
    let q = Queue::open(&path).unwrap();
    assert!(q.recovery().created);
    let id = q.enqueue(b"kept", EnqueueOptions::default()).unwrap().id();
    assert!(matches!(Queue::open(&path), Err(Error::AlreadyOpen { .. })));
    drop(q);
    let mut names: Vec<_> = fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ".q.leaseq.create-lock",
            "q.leaseq",
            "q.leaseq-journal",
            "q.leaseq-reserve"
        ]
    );
    let q = Queue::open(&path).unwrap();
    assert!(!q.recovery().created);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.payload()), (id, &b"kept"[..]));
    l.ack().unwrap();
    assert_consistent(&q);
    drop(q);
    // Creators racing for a new name there: one file, every open succeeds or is AlreadyOpen.
    let path = work.join("raced.leaseq");
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4).map(|_| s.spawn(|| Queue::open(&path))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().any(|r| r.is_ok()), "{results:?}");
    for r in &results {
        assert!(matches!(r, Ok(_) | Err(Error::AlreadyOpen { .. })), "{r:?}");
    }
    drop(results);
    let leftovers: Vec<_> = fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".leaseq-create"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    fs::remove_dir_all(&work).unwrap();
}

/// A read-only volume (`.ci/run` mounts one holding a queue file `q.leaseq` with one job): a
/// new queue there is an `Io` error and creates nothing; the existing file is refused with a
/// typed error and left byte-identical.
#[test]
fn a_read_only_volume_is_a_typed_error_and_nothing_is_written() {
    let Some(dir) = volume_dir("LEASEQ_TEST_READ_ONLY_DIR") else {
        return;
    };
    let before: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    match Queue::open(dir.join("new.leaseq")) {
        Err(Error::Io(e)) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
            ),
            "{e:?}"
        ),
        other => panic!("{other:?}"),
    }
    let existing = dir.join("q.leaseq");
    let bytes = fs::read(&existing).unwrap();
    let err = Queue::open(&existing).unwrap_err();
    match &err {
        // The OS's text names no file: the error says which.
        Error::Io(e) => assert!(e.to_string().contains("q.leaseq"), "{e}"),
        other => panic!("a typed I/O error: {other:?}"),
    }
    assert_eq!(fs::read(&existing).unwrap(), bytes, "the file was written");
    let after: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(before, after);
}
