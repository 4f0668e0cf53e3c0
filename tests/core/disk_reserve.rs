//! Issue 41: the disk reserve and the file limit, on a real disk of any platform (the file
//! limit makes the file storage full without filling the disk; real full disks are in
//! `io_faults.rs`). What a storage-full file refuses (every kind of enqueue, nothing
//! written) and lets through (every call of the drain), how it says so (events, stats, a
//! reader of the closed file), how it ends by itself, the reserve file's life, and the
//! options' bounds.

use crate::common::{bump, effects};
use leaseq::{EnqueueOptions, Error, Event, JobId, Queue};
use std::path::Path;
use std::time::{Duration, Instant};

/// The file limit of these tests: the journal's 4 MiB and about 2 MiB for the file.
const LIMIT: u64 = 6 << 20;
const RESERVE: u64 = 256 << 10;

fn open_limited(path: &Path) -> Queue {
    Queue::builder()
        .disk_reserve(RESERVE)
        .file_bytes_max(Some(LIMIT))
        .open(path)
        .unwrap()
}

/// A 1 KiB payload naming job `i`.
fn kib(i: u32) -> Vec<u8> {
    format!("{i:08}").repeat(128).into_bytes()
}

/// Enqueues 1 KiB jobs until the file is storage full: the ids enqueued, and the refusal.
/// `events` are read as it goes (a full subscription would miss the turn): whether one
/// said `StorageFull`.
fn fill(q: &Queue, events: Option<(&leaseq::Events, &mut bool)>) -> (Vec<JobId>, Error) {
    let mut ids = Vec::new();
    let mut events = events;
    loop {
        let i = ids.len() as u32;
        assert!(i < 50_000, "the file limit was never met");
        if let Some((events, saw)) = events.as_mut() {
            while let Some(e) = events.try_recv() {
                **saw |= matches!(e, Event::StorageFull { .. });
            }
        }
        match q.enqueue(&kib(i)[..], EnqueueOptions::default()) {
            Ok(e) => ids.push(e.id()),
            Err(e) => return (ids, e),
        }
    }
}

/// Enqueues until one is taken (the state ends by itself), within 10 s.
fn enqueue_once_room(q: &Queue) -> JobId {
    let started = Instant::now();
    loop {
        match q.enqueue(&b"after"[..], EnqueueOptions::default()) {
            Ok(e) => return e.id(),
            Err(Error::StorageFull { .. }) if started.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the drained file still refuses: {e:?}"),
        }
    }
}

#[test]
fn a_full_file_refuses_every_growth_and_lets_every_drain_call_through() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let q = open_limited(&path);
    let events = q.events().unwrap();
    let other = q.named("other").unwrap();
    other.enqueue(b"o", EnqueueOptions::default()).unwrap();
    let mut saw_full = false;
    let (ids, refused) = fill(&q, Some((&events, &mut saw_full)));
    assert!(ids.len() > 200, "only {} jobs fit", ids.len());
    match refused {
        Error::StorageFull {
            reserve_bytes,
            file_bytes_max,
            file_bytes,
            ..
        } => {
            assert_eq!((reserve_bytes, file_bytes_max), (RESERVE, Some(LIMIT)));
            assert!(file_bytes <= LIMIT, "{file_bytes} bytes taken");
        }
        e => panic!("the refusal: {e:?}"),
    }
    while let Some(e) = events.try_recv() {
        saw_full |= matches!(e, Event::StorageFull { .. });
    }
    assert!(saw_full, "no StorageFull event");
    let stats = q.stats().unwrap();
    let since = stats.storage_full_ms.expect("stats say storage full");
    assert_eq!(
        other.stats().unwrap().storage_full_ms,
        Some(since),
        "file-wide"
    );
    let total = stats.total;
    assert_eq!(total, ids.len() as u64);

    // Every kind of growth is refused, nothing written.
    fn full<T>(r: leaseq::Result<T>) -> bool {
        matches!(r, Err(Error::StorageFull { .. }))
    }
    assert!(full(
        q.enqueue_batch(vec![(&b"b"[..], EnqueueOptions::default())])
    ));
    assert!(full(other.enqueue(b"o2", EnqueueOptions::default())));
    assert!(full(q.enqueue_value(&7u32, EnqueueOptions::default())));
    assert!(full(
        q.import_batch(&[leaseq::ImportJob::new(b"i".to_vec())])
    ));
    // In the app's own commit: the enqueue is refused, the closure goes on, its own write
    // commits.
    q.write(|tx| {
        let r = tx.enqueue(b"t", EnqueueOptions::default());
        assert!(matches!(r, Err(Error::StorageFull { .. })), "{r:?}");
        bump(tx.transaction(), 0)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(effects(&q).get(&0), Some(&1));
    assert_eq!(q.stats().unwrap().total, total);
    assert_eq!(other.stats().unwrap().total, 1);

    // Every call of the drain goes on.
    let l = q.dequeue().unwrap().unwrap();
    l.nack_after("later", Duration::from_secs(3600)).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    l.ack().unwrap();
    q.cancel(ids[ids.len() - 1], "not needed").unwrap();
    q.remove(ids[ids.len() - 2]).unwrap();
    let batch = q.dequeue_batch(10).unwrap();
    assert_eq!(batch.len(), 10);
    for r in q.ack_batch(&batch).unwrap() {
        r.unwrap();
    }
    q.prune().unwrap();
    while let Some(l) = q.dequeue().unwrap() {
        let id = l.id().0;
        l.ack_with(|tx| bump(tx, id)).unwrap();
    }
    assert!(effects(&q).values().all(|&n| n == 1));
    assert_eq!(q.stats().unwrap().pending(), 1, "the nacked job waits");
    let o = other.dequeue().unwrap().unwrap();
    o.ack().unwrap();

    // The state ends by itself: enqueues taken, the stats and an event say so.
    let after = enqueue_once_room(&q);
    assert!(q.job(after).unwrap().is_some());
    assert_eq!(q.stats().unwrap().storage_full_ms, None);
    assert!(
        std::iter::from_fn(|| events.try_recv()).any(|e| e == Event::StorageAvailable),
        "no StorageAvailable event"
    );
    assert_eq!(q.check().unwrap(), vec![]);
}

#[test]
fn the_state_is_in_the_file_for_readers_and_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let q = open_limited(&path);
    let (ids, refused) = fill(&q, None);
    assert!(matches!(refused, Error::StorageFull { .. }), "{refused:?}");
    let since = q.stats().unwrap().storage_full_ms.unwrap();
    drop(q);
    // A reader of the closed file sees what the writer recorded.
    let reader = leaseq::Reader::open(&path).unwrap();
    assert_eq!(reader.stats().unwrap().storage_full_ms, Some(since));
    drop(reader);
    // The next open is still full: refused at once, the drain goes on.
    let q = open_limited(&path);
    assert!(matches!(
        q.enqueue(b"x", EnqueueOptions::default()),
        Err(Error::StorageFull { .. })
    ));
    assert!(q.stats().unwrap().storage_full_ms.is_some());
    let mut n = 0;
    while let Some(l) = q.dequeue().unwrap() {
        l.ack().unwrap();
        n += 1;
    }
    assert_eq!(n, ids.len());
    enqueue_once_room(&q);
    drop(q);
    let reader = leaseq::Reader::open(&path).unwrap();
    assert_eq!(reader.stats().unwrap().storage_full_ms, None);
    drop(reader);
    // Full again and closed; opened with room (a larger limit): the open records it at
    // once, before any commit of the app's own.
    let q = open_limited(&path);
    fill(&q, None);
    assert!(q.stats().unwrap().storage_full_ms.is_some());
    drop(q);
    let q = Queue::builder()
        .disk_reserve(RESERVE)
        .file_bytes_max(Some(64 << 20))
        .open(&path)
        .unwrap();
    assert_eq!(
        q.stats().unwrap().storage_full_ms,
        None,
        "recorded by the open"
    );
    while let Some(l) = q.dequeue().unwrap() {
        l.ack().unwrap();
    }
    drop(q);
    // Full again, then opened without a reserve or a limit: the first commit records that
    // the file is not full any more.
    let q = open_limited(&path);
    fill(&q, None);
    drop(q);
    let q = Queue::builder().disk_reserve(0).open(&path).unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.stats().unwrap().storage_full_ms, None);
    q.enqueue(b"x", EnqueueOptions::default()).unwrap();
}

#[test]
fn the_reserve_file_is_kept_made_again_and_given_back_with_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let reserve = dir.path().join("q.leaseq-reserve");
    let total = 1u64 << 40; // the default: 8 MiB, or an eighth of a smaller disk
    let q = Queue::open(&path).unwrap();
    let len = std::fs::metadata(&reserve).unwrap().len();
    assert!(
        len == leaseq::DISK_RESERVE_DEFAULT || len < leaseq::DISK_RESERVE_DEFAULT.min(total),
        "{len}"
    );
    assert!(
        crate::common::allocated_bytes(&reserve) >= len.min(1 << 20),
        "the reserve is allocated, not a hole"
    );
    drop(q);
    std::fs::remove_file(&reserve).unwrap();
    let q = Queue::builder().disk_reserve(1 << 20).open(&path).unwrap();
    assert_eq!(
        std::fs::metadata(&reserve).unwrap().len(),
        1 << 20,
        "made again"
    );
    q.enqueue(b"kept", EnqueueOptions::default()).unwrap();
    drop(q);
    let q = Queue::builder().disk_reserve(0).open(&path).unwrap();
    assert!(!reserve.exists(), "given back with a reserve of 0");
    assert_eq!(q.len().unwrap(), 1);
}

#[test]
fn options_out_of_range_are_refused_at_open_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let too_big = Queue::builder()
        .disk_reserve(leaseq::DISK_RESERVE_MAX + 1)
        .open(&path);
    assert!(
        matches!(
            too_big,
            Err(Error::InvalidOption {
                field: "disk_reserve",
                ..
            })
        ),
        "{too_big:?}"
    );
    // 4 times the reserve (256 KiB at least) and the journal's 4 MiB and header.
    let journal: u64 = (4 << 20) + 4096;
    for (reserve, max) in [
        (None, 32u64 << 20),
        (Some(1 << 20), (4 << 20) + journal - 1),
        (Some(0), (1 << 20) + journal - 1),
        (Some(1 << 20), 4 << 20),
    ] {
        let b = Queue::builder().file_bytes_max(Some(max));
        let b = match reserve {
            Some(r) => b.disk_reserve(r),
            None => b,
        };
        let r = b.open(&path);
        assert!(
            matches!(
                r,
                Err(Error::InvalidOption {
                    field: "file_bytes_max",
                    ..
                })
            ),
            "reserve {reserve:?}, limit {max}: {r:?}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
    // At the bounds: taken; without the journal, less.
    Queue::builder()
        .disk_reserve(1 << 20)
        .file_bytes_max(Some((4 << 20) + journal))
        .open(&path)
        .unwrap();
    Queue::builder()
        .disk_reserve(0)
        .journal(false)
        .file_bytes_max(Some(1 << 20))
        .open(dir.path().join("other.leaseq"))
        .unwrap();
}

// The reserve file cannot be made (a directory holds its name): the file still turns full
// at its limit, drains, and takes enqueues again: the state never waits for the reserve file.
#[test]
fn a_reserve_file_that_cannot_be_made_never_keeps_the_file_full() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    std::fs::create_dir(dir.path().join("q.leaseq-reserve")).unwrap();
    let q = open_limited(&path);
    let (ids, refused) = fill(&q, None);
    assert!(matches!(refused, Error::StorageFull { .. }), "{refused:?}");
    for _ in &ids {
        q.dequeue().unwrap().unwrap().ack().unwrap();
    }
    enqueue_once_room(&q);
    assert!(
        dir.path().join("q.leaseq-reserve").is_dir(),
        "left as it was"
    );
}

// One large batch cannot take the reserve: with room for it but not for it and the reserve,
// it is refused whole while the file is not full, and smaller enqueues go on.
#[test]
fn a_batch_larger_than_the_room_above_the_reserve_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let q = Queue::builder()
        .disk_reserve(RESERVE)
        .file_bytes_max(Some(8 << 20))
        .open(&path)
        .unwrap();
    q.enqueue(b"first", EnqueueOptions::default()).unwrap();
    // About 1.9 MiB of payload: twice it is more than the room the file limit leaves.
    let big: Vec<Vec<u8>> = (0..1900).map(kib).collect();
    let r = q.enqueue_batch(big.iter().map(|p| (&p[..], EnqueueOptions::default())));
    assert!(
        matches!(r, Err(Error::StorageFull { .. })),
        "{:?}",
        r.map(|v| v.len())
    );
    let stats = q.stats().unwrap();
    assert_eq!((stats.total, stats.storage_full_ms), (1, None));
    q.enqueue(&kib(1)[..], EnqueueOptions::default()).unwrap();
}

// A pipeline step whose follow-up the full file refuses: `ack_with` answers `StorageFull`
// and snoozes the job without spending an attempt, so a long full spell never turns the
// pipeline's jobs into dead letters; once room is back the step goes through.
#[test]
fn an_ack_with_whose_follow_up_is_refused_snoozes_without_an_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let clock = leaseq::ManualClock::new(1_000_000);
    let q = Queue::builder()
        .disk_reserve(RESERVE)
        .file_bytes_max(Some(LIMIT))
        .clock(clock.clone())
        .open(&path)
        .unwrap();
    let step = q
        .enqueue(b"step", EnqueueOptions::default().max_attempts(1))
        .unwrap()
        .id();
    let (ids, _) = fill(&q, None);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), step);
    let r = l.ack_with(|tx| {
        tx.enqueue(b"next", EnqueueOptions::default())?;
        Ok(())
    });
    assert!(matches!(r, Err(Error::StorageFull { .. })), "{r:?}");
    let job = q.job(step).unwrap().unwrap();
    assert_eq!(job.state, leaseq::JobState::Scheduled, "snoozed, not dead");
    assert_eq!(job.attempts, 0, "no attempt spent");
    // The drain frees room; the step goes through on its next delivery.
    for _ in &ids {
        q.dequeue().unwrap().unwrap().ack().unwrap();
    }
    let after = enqueue_once_room(&q);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), after, "the step waits out its snooze");
    l.ack().unwrap();
    clock.advance(leaseq::STORAGE_FULL_SNOOZE);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), step);
    l.ack_with(|tx| {
        tx.enqueue(b"next", EnqueueOptions::default())?;
        Ok(())
    })
    .unwrap();
}
