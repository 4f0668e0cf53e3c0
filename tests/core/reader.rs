//! Live reads (`Builder::live_reads`, `Reader`): a reader in another process (or this one)
//! reads beside the running app, follows its commits, writes nothing and never returns its
//! leases; an app that holds the file exclusively is said so, with what to do; a crashed or
//! older file is read from a copy repaired and upgraded in memory, the file unchanged; bad
//! files get the errors a writable open gives. Method: real files, child processes (this
//! binary re-run) that hold the file open or die holding leases, byte comparisons of the file.

use std::path::Path;
use std::time::Duration;

use crate::common::{ChildProc, Fixture, LEASE, assert_consistent, child_scenario, plain, say};
use leaseq::{EnqueueOptions, Error, JobId, JobState, Queue, Reader};

const ENTRY: &str = "reader::child_entry_reader";

/// The child side: opens the file (`live` or `exclusive`), enqueues three jobs and leases one,
/// says the lease's id and deadline, then waits to be killed (`READY`).
#[test]
fn child_entry_reader() {
    let Some((scenario, path)) = child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    let q = Queue::builder()
        .live_reads(scenario == "live")
        .lease(LEASE)
        .open(&path)
        .unwrap();
    for i in 0..3 {
        q.enqueue(format!("job{i}").as_bytes(), plain()).unwrap();
    }
    let lease = q.dequeue().unwrap().unwrap();
    say(format!("{} {}", lease.id().0, lease.deadline_ms()));
    crate::common::ready_to_die();
}

/// Starts a child holding `path` open in `mode` with one of three jobs leased; returns it with
/// the leased job's id and deadline.
fn child_holding(path: &Path, mode: &str) -> (ChildProc, JobId, u64) {
    let mut child = ChildProc::spawn(ENTRY, mode, path);
    let said = child.until_ready();
    let (id, deadline) = said[0].split_once(' ').unwrap();
    (child, JobId(id.parse().unwrap()), deadline.parse().unwrap())
}

fn jobs_in(r: &Reader, state: JobState) -> Vec<JobId> {
    r.jobs(state, None, 100)
        .unwrap()
        .jobs
        .iter()
        .map(|j| j.id)
        .collect()
}

#[test]
fn a_reader_in_another_process_follows_the_app_and_sees_its_leases() {
    if child_scenario().is_some() {
        return;
    }
    let f = Fixture::new();
    let (child, leased, deadline) = child_holding(&f.path, "live");
    let r = Reader::open(&f.path).unwrap();
    assert!(r.is_live());
    let s = r.stats().unwrap();
    assert_eq!((s.total, s.ready, s.leased), (3, 2, 1), "{s:?}");
    assert_eq!(jobs_in(&r, JobState::Leased), vec![leased]);
    let info = r.job(leased).unwrap().unwrap();
    assert_eq!(info.state, JobState::Leased);
    assert_eq!(info.lease_deadline_ms, Some(deadline));
    assert_eq!(r.payload(leased).unwrap().unwrap(), b"job0");
    assert_eq!(r.check().unwrap(), vec![]);
    // A second reader at the same time.
    let r2 = Reader::open(&f.path).unwrap();
    assert_eq!(r2.stats().unwrap(), s);
    // The app still holds the file: a writable open is refused, and nothing was returned.
    assert!(matches!(
        Queue::builder().live_reads(true).open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    child.kill();
    // The kill orphaned the lease; readers never return it: still leased, for both.
    assert_eq!(r.stats().unwrap().leased, 1);
    drop((r, r2));
    let q = Queue::open(&f.path).unwrap();
    assert_eq!(q.recovery().leases_returned, 1);
}

#[test]
fn a_reader_kept_open_sees_each_commit_and_leaves_every_lease_to_the_app() {
    let f = Fixture::new();
    let q = f.builder().live_reads(true).open(&f.path).unwrap();
    let r = Reader::open(&f.path).unwrap();
    assert!(r.is_live());
    assert_eq!(r.stats().unwrap().total, 0);
    let a = q.enqueue(b"a", plain()).unwrap().id();
    assert_eq!(jobs_in(&r, JobState::Ready), vec![a]);
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(jobs_in(&r, JobState::Leased), vec![a]);
    // Readers come and go while the lease runs: the app's token stays current.
    for _ in 0..3 {
        let r = Reader::open(&f.path).unwrap();
        assert_eq!(r.job(a).unwrap().unwrap().attempts, 1);
    }
    lease.ack().unwrap();
    assert_eq!(r.stats().unwrap().total, 0);
    // Named queues, schedules, limits.
    let mail = q.named("mail").unwrap();
    mail.enqueue(b"m", plain()).unwrap();
    mail.set_rate_limit(Some(leaseq::RateLimit::new(5, Duration::from_secs(1))))
        .unwrap();
    assert_eq!(r.queue_names().unwrap(), vec!["mail".to_string()]);
    let rm = r.existing("mail").unwrap();
    assert_eq!((rm.name(), rm.stats().unwrap().ready), (Some("mail"), 1));
    assert_eq!(rm.rate_limit().unwrap(), mail.rate_limit().unwrap());
    assert!(matches!(
        r.existing("nope"),
        Err(Error::QueueNotFound { .. })
    ));
    assert!(matches!(
        r.existing("no spaces"),
        Err(Error::InvalidOption { .. })
    ));
    assert_consistent(&q);
}

#[test]
fn an_app_without_live_reads_is_said_to_hold_the_file_exclusively() {
    if child_scenario().is_some() {
        return;
    }
    let f = Fixture::new();
    let (child, _, _) = child_holding(&f.path, "exclusive");
    let e = Reader::open(&f.path).unwrap_err();
    assert!(matches!(e, Error::HeldExclusively { .. }), "{e:?}");
    let text = e.to_string();
    for needed in ["live_reads", "stop that process", "copy"] {
        assert!(text.contains(needed), "{text}");
    }
    // A copy of the queue file alone, taken while it runs: the queue as of its last
    // checkpoint (the app's open), older but consistent.
    let alone = f.dir.path().join("alone.leaseq");
    std::fs::copy(&f.path, &alone).unwrap();
    let r = Reader::open(&alone).unwrap();
    assert!(!r.is_live(), "a copy of an open file needs a repair");
    assert_eq!(r.stats().unwrap().total, 0, "{:?}", r.stats());
    assert_eq!(r.check().unwrap(), vec![]);
    drop(r);
    // A copy of both files (the queue file first, then its journal): read as a snapshot
    // with the journal replayed in memory, the lease shown as leased.
    let copy = f.dir.path().join("copy.leaseq");
    std::fs::copy(&f.path, &copy).unwrap();
    let journal = |p: &Path| {
        let mut s = p.as_os_str().to_owned();
        s.push("-journal");
        std::path::PathBuf::from(s)
    };
    std::fs::copy(journal(&f.path), journal(&copy)).unwrap();
    let before = (
        std::fs::read(&copy).unwrap(),
        std::fs::read(journal(&copy)).unwrap(),
    );
    let r = Reader::open(&copy).unwrap();
    assert!(!r.is_live(), "a copy of an open file needs a repair");
    let s = r.stats().unwrap();
    assert_eq!((s.total, s.ready, s.leased), (3, 2, 1), "{s:?}");
    drop(r);
    assert!(
        (
            std::fs::read(&copy).unwrap(),
            std::fs::read(journal(&copy)).unwrap()
        ) == before,
        "the copy was written"
    );
    child.kill();
}

#[test]
fn a_crashed_file_is_read_from_a_repaired_copy_and_left_as_it_is() {
    if child_scenario().is_some() {
        return;
    }
    let f = Fixture::new();
    let (child, leased, deadline) = child_holding(&f.path, "exclusive");
    child.kill();
    let before = std::fs::read(&f.path).unwrap();
    let r = Reader::open(&f.path).unwrap();
    assert!(!r.is_live());
    let info = r.job(leased).unwrap().unwrap();
    assert_eq!(
        (info.state, info.lease_deadline_ms),
        (JobState::Leased, Some(deadline))
    );
    assert_eq!(r.check().unwrap(), vec![]);
    // The snapshot holds the writer lock while it lives.
    assert!(matches!(
        Queue::open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    drop(r);
    assert!(
        std::fs::read(&f.path).unwrap() == before,
        "the file was written"
    );
    let q = Queue::open(&f.path).unwrap();
    assert_eq!(q.recovery().leases_returned, 1);
}

#[test]
fn an_older_format_is_read_upgraded_in_memory_and_left_as_it_is() {
    let f = Fixture::new();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/format7-crashed.leaseq"
        ),
        &f.path,
    )
    .unwrap();
    let before = std::fs::read(&f.path).unwrap();
    let r = Reader::open(&f.path).unwrap();
    assert!(!r.is_live());
    let s = r.stats().unwrap();
    assert_eq!(s.total, 7, "{s:?}");
    // The fixture's four leases (in its queues together) stay leased: a reader returns none.
    let mut leased = s.leased;
    for name in r.queue_names().unwrap() {
        leased += r.existing(&name).unwrap().stats().unwrap().leased;
    }
    assert_eq!(leased, 4);
    assert_eq!(r.schedules().unwrap(), vec![]);
    assert_eq!(r.check().unwrap(), vec![]);
    drop(r);
    assert!(
        std::fs::read(&f.path).unwrap() == before,
        "the file was written"
    );
    let q = Queue::open(&f.path).unwrap();
    assert_eq!(q.recovery().upgraded_from, Some(7));
}

#[test]
fn with_nobody_writing_a_reader_writes_nothing_and_an_app_may_open_beside_it() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.enqueue(b"a", plain()).unwrap().id();
    drop(q);
    let before = std::fs::read(&f.path).unwrap();
    let r = Reader::open(&f.path).unwrap();
    assert!(r.is_live());
    assert_eq!(jobs_in(&r, JobState::Ready), vec![a]);
    assert_eq!(r.history().unwrap(), leaseq::History::default());
    assert!(!r.is_applied(b"k").unwrap());
    assert_eq!(r.file_id().unwrap(), None);
    assert_eq!(r.quarantined(None, 10).unwrap(), vec![]);
    assert!(
        std::fs::read(&f.path).unwrap() == before,
        "the reader wrote"
    );
    // An app without live reads cannot take the file from under a reader; one with them can,
    // and the reader follows it.
    assert!(matches!(
        f.builder().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    let q = f.builder().live_reads(true).open(&f.path).unwrap();
    let b = q.enqueue(b"b", plain()).unwrap().id();
    assert_eq!(jobs_in(&r, JobState::Ready), vec![a, b]);
}

#[test]
fn a_reader_refuses_bad_files_and_leaves_them_byte_identical() {
    let f = Fixture::new();
    let missing = f.dir.path().join("missing.leaseq");
    match Reader::open(&missing) {
        Err(Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    assert!(!missing.exists(), "a reader created a file");
    let cases: [(&str, Vec<u8>); 3] = [
        (
            "foreign",
            b"hello, not a database at all, just some text".repeat(40),
        ),
        ("empty", Vec::new()),
        ("short", b"redb\x1a\x0a\xa9\x0d\x0a".to_vec()),
    ];
    for (name, bytes) in cases {
        let p = f.dir.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let e = Reader::open(&p).unwrap_err();
        assert!(
            matches!(e, Error::NotLeaseq { .. } | Error::Truncated { .. }),
            "{name}: {e:?}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), bytes, "{name} was written");
    }
    // A redb database of someone else's.
    let other = f.dir.path().join("other.redb");
    drop(redb::Database::create(&other).unwrap());
    let bytes = std::fs::read(&other).unwrap();
    assert!(matches!(Reader::open(&other), Err(Error::NotLeaseq { .. })));
    assert!(std::fs::read(&other).unwrap() == bytes);
    assert!(matches!(
        Reader::open(f.dir.path()),
        Err(Error::NotLeaseq { .. })
    ));
    // A damaged page is found by the reader's verification.
    let q = f.open();
    leaseq_fill(&q);
    drop(q);
    let mut bytes = std::fs::read(&f.path).unwrap();
    let at = bytes.len() - 4096 + 100;
    bytes[at] ^= 0xFF;
    std::fs::write(&f.path, &bytes).unwrap();
    match Reader::open(&f.path) {
        Err(Error::Corrupted { .. }) => {}
        Ok(r) => {
            // The flipped byte fell in a free page: every read still answers.
            r.stats().unwrap();
            r.check().unwrap();
        }
        Err(e) => panic!("{e:?}"),
    }
    assert!(std::fs::read(&f.path).unwrap() == bytes);
}

fn leaseq_fill(q: &Queue) {
    for i in 0..200 {
        q.enqueue(&vec![i as u8; 300], EnqueueOptions::default())
            .unwrap();
    }
}

#[test]
fn live_reads_and_durability_none_are_refused_together() {
    let f = Fixture::new();
    let e = f
        .builder()
        .live_reads(true)
        .durability(leaseq::Durability::None)
        .open(&f.path)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
    assert!(!f.path.exists(), "a refused setting created the file");
}

#[test]
fn check_through_a_reader_is_clean_on_every_commit_of_a_busy_app() {
    let f = Fixture::new();
    let q = f.builder().live_reads(true).open(&f.path).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let worker = {
        let (q, stop, done) = (q.clone(), stop.clone(), done.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                q.enqueue(
                    format!("{n}").as_bytes(),
                    plain().dedup_key(format!("k{}", n % 7)),
                )
                .unwrap();
                if let Some(l) = q.dequeue().unwrap() {
                    if n.is_multiple_of(3) {
                        l.nack("again").unwrap();
                    } else {
                        l.ack().unwrap();
                    }
                }
                n += 1;
                done.store(n, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let r = Reader::open(&f.path).unwrap();
    // Checks run while the app commits, until it made 300 rounds of commits (and at least 20
    // checks ran).
    let mut checks = 0;
    let mut seen_totals = std::collections::BTreeSet::new();
    while checks < 20 || done.load(std::sync::atomic::Ordering::Relaxed) < 300 {
        assert_eq!(r.check().unwrap(), vec![]);
        let s = r.stats().unwrap();
        assert_eq!(s.total, s.ready + s.scheduled + s.leased + s.dead, "{s:?}");
        seen_totals.insert(s.total);
        checks += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    worker.join().unwrap();
    assert!(
        seen_totals.len() > 1,
        "the reader saw one state only: {seen_totals:?}"
    );
}

#[test]
fn live_reads_on_a_backend_without_byte_range_locks_is_refused() {
    let e = Queue::builder()
        .live_reads(true)
        .open_backend(redb::backends::InMemoryBackend::new())
        .unwrap_err();
    assert!(matches!(e, Error::Storage(_)), "{e:?}");
    // Without live reads the same backend opens.
    Queue::builder()
        .open_backend(redb::backends::InMemoryBackend::new())
        .unwrap();
}

#[test]
fn latest_dead_lists_the_most_recently_dead_first() {
    let f = Fixture::new();
    let q = f.builder().live_reads(true).open(&f.path).unwrap();
    let ids: Vec<JobId> = (0..3)
        .map(|i| {
            q.enqueue(format!("{i}").as_bytes(), plain().max_attempts(1))
                .unwrap()
                .id()
        })
        .collect();
    let mut leases: Vec<_> = (0..3).map(|_| q.dequeue().unwrap().unwrap()).collect();
    // They die in the order 2, 0, 1.
    for at in [2, 0, 1] {
        let l = leases.iter().position(|l| l.id() == ids[at]).unwrap();
        leases.remove(l).fail("no").unwrap();
        f.clock.advance(Duration::from_millis(5));
    }
    let r = Reader::open(&f.path).unwrap();
    let latest: Vec<JobId> = r.latest_dead(10).unwrap().iter().map(|j| j.id).collect();
    assert_eq!(latest, vec![ids[1], ids[0], ids[2]]);
    let two: Vec<JobId> = q.latest_dead(2).unwrap().iter().map(|j| j.id).collect();
    assert_eq!(two, vec![ids[1], ids[0]]);
    assert!(matches!(r.latest_dead(0), Err(Error::InvalidOption { .. })));
    // A requeued job leaves the list.
    q.requeue_dead(ids[1]).unwrap();
    assert_eq!(r.latest_dead(10).unwrap().len(), 2);
}

/// `Queue::reader`: the one read API over the app's own open. It follows the queue's commits
/// (its counts, named queues and metrics, those not written yet included, as the queue's own
/// calls), names the queue's file, and holds the file as a handle does: `compact` is `Busy`
/// while it lives, and succeeds once it is dropped.
#[test]
fn a_queue_reader_follows_the_queue_and_holds_the_file() {
    let f = Fixture::new();
    let mut q = f.open();
    let reader = q.reader();
    assert!(reader.is_live());
    assert_eq!(reader.path(), f.path.as_path());
    assert_eq!(reader.name(), None);
    q.enqueue(b"a", plain()).unwrap();
    let emails = q.named("emails").unwrap();
    emails.enqueue(b"b", plain()).unwrap();
    assert_eq!(reader.stats().unwrap(), q.stats().unwrap());
    assert_eq!(
        reader.stats().unwrap().ready,
        1,
        "the commit is read at once"
    );
    assert_eq!(reader.queue_names().unwrap(), vec!["emails".to_string()]);
    let named = emails.reader();
    assert_eq!(
        (named.name(), named.stats().unwrap().ready),
        (Some("emails"), 1)
    );
    assert_eq!(reader.existing("emails").unwrap().stats().unwrap().ready, 1);
    // The first commit wrote its counts; the next ones within the second (the manual clock
    // stands still) are not written yet, and the reader counts them as the queue does.
    q.enqueue(b"c", plain()).unwrap();
    let enqueued = |m: Vec<leaseq::MinuteCounts>| m.iter().map(|c| c.enqueued).sum::<u64>();
    assert_eq!(enqueued(q.metrics(0).unwrap()), 2);
    assert_eq!(enqueued(reader.metrics(0).unwrap()), 2);
    drop((emails, named));
    let err = q.compact().unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    drop(reader);
    q.compact().unwrap();
    assert_consistent(&q);
}
