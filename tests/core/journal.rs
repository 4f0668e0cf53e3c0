//! The write-ahead journal on real files: where it is, when it is on, which groups are
//! checkpoints, what the queue file alone holds, and a file at the journal's path that is
//! not a journal. Power cuts across the two files are in `tests/sim/journal.rs`.

use crate::common::Fixture;
use leaseq::{Durability, EnqueueOptions, Error, JournalFound, Reader};
use std::path::{Path, PathBuf};

fn journal_of(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push("-journal");
    PathBuf::from(s)
}

#[test]
fn plain_calls_are_journal_frames_and_caller_writes_are_checkpoints() {
    let f = Fixture::new();
    let q = f.open();
    assert!(journal_of(&f.path).is_file(), "the journal beside the file");
    let before = q.commit_stats();
    for i in 0..5u8 {
        q.enqueue(&[i], EnqueueOptions::default()).unwrap();
    }
    let l = q.dequeue().unwrap().unwrap();
    l.ack().unwrap();
    let s = q.commit_stats();
    assert_eq!(s.journal_frames - before.journal_frames, 7, "{s:?}");
    assert_eq!(s.checkpoints, before.checkpoints, "{s:?}");
    // ack_with carries the caller's writes: one checkpoint, no frame.
    let l = q.dequeue().unwrap().unwrap();
    let id = l.id().0;
    let s = q.commit_stats();
    l.ack_with(|tx| crate::common::bump(tx, id)).unwrap();
    let t = q.commit_stats();
    assert_eq!(
        (
            t.journal_frames - s.journal_frames,
            t.checkpoints - s.checkpoints
        ),
        (0, 1),
        "{t:?}"
    );
    // So does Queue::write, and flush.
    q.write(|tx| crate::common::bump(tx, 99)).unwrap();
    q.flush().unwrap();
    let u = q.commit_stats();
    assert_eq!(u.checkpoints - t.checkpoints, 2, "{u:?}");
}

#[test]
fn after_a_flush_or_a_close_the_queue_file_alone_holds_everything() {
    let f = Fixture::new();
    let q = f.open();
    let ids: Vec<_> = (0..4u8)
        .map(|i| q.enqueue(&[i], EnqueueOptions::default()).unwrap().id())
        .collect();
    q.flush().unwrap();
    // A copy of the file alone after the flush (the app still running): every job.
    let copy = f.dir.path().join("copy.leaseq");
    std::fs::copy(&f.path, &copy).unwrap();
    let r = Reader::open(&copy).unwrap();
    assert_eq!(r.stats().unwrap().total, 4);
    drop(r);
    q.enqueue(b"late", EnqueueOptions::default()).unwrap();
    drop(q);
    // After the close: the file alone holds the late job too.
    let alone = f.dir.path().join("alone.leaseq");
    std::fs::copy(&f.path, &alone).unwrap();
    let q2 = f.builder().open(&alone).unwrap();
    assert_eq!(q2.recovery().journal, JournalFound::Nothing);
    assert_eq!(q2.stats().unwrap().total, 5);
    for id in ids {
        assert!(q2.job(id).unwrap().is_some());
    }
    assert_eq!(q2.check().unwrap(), vec![]);
    drop(q2);
    let q = f.open();
    assert_eq!(q.recovery().journal, JournalFound::Nothing);
    assert!(!q.recovery().repaired);
    assert_eq!(q.stats().unwrap().total, 5);
}

#[test]
fn the_journal_is_off_without_immediate_durability_with_live_reads_or_when_asked() {
    for (name, b) in [
        ("off", Fixture::new().builder().journal(false)),
        (
            "none",
            Fixture::new().builder().durability(Durability::None),
        ),
        ("live", Fixture::new().builder().live_reads(true)),
    ] {
        let f = Fixture::new();
        let q = b.open(&f.path).unwrap();
        q.enqueue(b"x", EnqueueOptions::default()).unwrap();
        let s = q.commit_stats();
        assert_eq!((s.journal_frames, s.checkpoints), (0, 0), "{name}: {s:?}");
        drop(q);
        assert!(!journal_of(&f.path).exists(), "{name}: a journal was made");
        let q = f.open();
        assert_eq!(q.stats().unwrap().total, 1, "{name}");
    }
}

#[test]
fn a_file_at_the_journal_path_that_is_not_a_journal_is_refused_and_kept() {
    let f = Fixture::new();
    drop(f.open());
    let j = journal_of(&f.path);
    let mine = b"someone else's notes, not a journal".repeat(200);
    std::fs::write(&j, &mine).unwrap();
    let e = f.builder().open(&f.path).unwrap_err();
    assert!(matches!(e, Error::NotLeaseq { .. }), "{e:?}");
    assert_eq!(std::fs::read(&j).unwrap(), mine, "the file was written");
    // Without the journal the queue opens: a journal is read only when the file needs it.
    let q = f.builder().journal(false).open(&f.path).unwrap();
    assert_eq!(q.stats().unwrap().total, 0);
    drop(q);
    assert_eq!(std::fs::read(&j).unwrap(), mine);
}

#[test]
fn compaction_loses_nothing_journaled_before_it() {
    let f = Fixture::new();
    let mut q = f.open();
    for i in 0..300u32 {
        q.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    for _ in 0..290 {
        q.dequeue().unwrap().unwrap().ack().unwrap();
    }
    let before = q.commit_stats();
    assert_eq!(before.checkpoints, 0, "{before:?}");
    q.compact().unwrap();
    q.enqueue(b"after", EnqueueOptions::default()).unwrap();
    assert_eq!(q.stats().unwrap().total, 11);
    // The frames from before the compaction replay over the compacted file, harmlessly.
    let copy = f.dir.path().join("copy.leaseq");
    std::fs::copy(&f.path, &copy).unwrap();
    std::fs::copy(journal_of(&f.path), journal_of(&copy)).unwrap();
    let r = Reader::open(&copy).unwrap();
    assert_eq!(r.stats().unwrap().total, 11);
    assert_eq!(r.check().unwrap(), vec![]);
    drop(r);
    drop(q);
    let q = f.open();
    assert_eq!(q.stats().unwrap().total, 11);
    assert_eq!(q.check().unwrap(), vec![]);
}

// A frame that would not fit before the journal's end (4 MiB of frames) makes its group a
// checkpoint, after which frames start again at the front: large payloads pass through a
// full journal, and every one is there after a reopen.
#[test]
fn a_group_too_large_for_the_rest_of_the_journal_is_a_checkpoint() {
    let f = Fixture::new();
    let q = f.open();
    let big = |i: u8| vec![i; 900 * 1024];
    for i in 0..10u8 {
        q.enqueue(&big(i), EnqueueOptions::default()).unwrap();
    }
    let s = q.commit_stats();
    // About four 900 KiB frames fit in 4 MiB: the fifth group is a checkpoint, and so on.
    assert!(s.checkpoints >= 2, "{s:?}");
    assert!(s.journal_frames >= 6, "{s:?}");
    drop(q);
    let q = f.open();
    for i in 0..10u8 {
        let l = q.dequeue().unwrap().unwrap();
        assert!(l.payload() == &big(i)[..], "job {i}");
        l.ack().unwrap();
    }
}
