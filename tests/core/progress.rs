//! Progress of running jobs (`Lease::set_progress`). Goal: an update is a fenced commit that
//! inspection and events show, at most one commit per `PROGRESS_COMMIT_INTERVAL` per
//! delivery (faster updates wait in memory for the next commit that can carry them: a later
//! update, an extend, a heartbeat), bad input writes nothing, a stale lease is refused, and
//! the value lasts until the next delivery. Method: the public API, commit counts from
//! `commit_stats`.

use crate::common::{Fixture, T0_MS, assert_consistent, plain, secs};
use leaseq::{Error, Event, History, JobState, PROGRESS_BYTES_MAX, PROGRESS_COMMIT_INTERVAL};
use std::time::Instant;

#[test]
fn an_update_is_a_commit_that_inspection_and_events_show() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events().unwrap();
    let id = q.enqueue(b"import", plain()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    f.clock.advance(secs(2));
    lease.set_progress(b"{\"done\":40,\"of\":120}").unwrap();
    let job = q.job(id).unwrap().unwrap();
    assert_eq!(
        job.progress.as_deref(),
        Some(&b"{\"done\":40,\"of\":120}"[..])
    );
    assert_eq!(job.progress_ms, Some(T0_MS + 2_000));
    assert_eq!(job.state, JobState::Leased, "still leased, same deadline");
    assert_eq!(job.lease_deadline_ms, Some(lease.deadline_ms()));
    let seen: Vec<Event> = std::iter::from_fn(|| events.try_recv()).collect();
    assert!(seen.contains(&Event::Progress { id }), "{seen:?}");
    lease.ack().unwrap();
    assert_consistent(&q);
}

#[test]
fn fast_updates_commit_at_most_once_per_interval_and_an_extend_writes_the_last() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"resize", plain()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    let before = q.commit_stats().commits;
    let started = Instant::now();
    for pct in 0..=100u8 {
        lease.set_progress(&[pct]).unwrap();
    }
    let took = started.elapsed();
    let commits = q.commit_stats().commits - before;
    let allowed = 1 + (took.as_millis() / PROGRESS_COMMIT_INTERVAL.as_millis()) as u64;
    assert!(
        commits <= allowed,
        "{commits} commits for 101 updates in {took:?} (at most {allowed})"
    );
    assert!(commits >= 1, "the first update commits at once");
    let shown = q.job(id).unwrap().unwrap().progress.unwrap();
    if commits == 1 {
        assert_eq!(shown, vec![0], "only the first was written");
    }
    // The extend carries the newest pending update in its own commit.
    let before = q.commit_stats().commits;
    lease.extend(secs(30)).unwrap();
    assert_eq!(q.commit_stats().commits - before, 1);
    assert_eq!(q.job(id).unwrap().unwrap().progress, Some(vec![100]));
    // Nothing pending any more: a later extend writes no progress (the value stays).
    lease.extend(secs(30)).unwrap();
    assert_eq!(q.job(id).unwrap().unwrap().progress, Some(vec![100]));
    lease.ack().unwrap();
    assert_consistent(&q);
}

#[test]
fn a_heartbeat_carries_the_pending_update() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"sync", plain()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    let beat = lease.heartbeat();
    lease.set_progress(b"1").unwrap();
    lease.set_progress(b"2").unwrap();
    if q.job(id).unwrap().unwrap().progress.as_deref() == Some(b"1") {
        // "2" came within the interval: pending until the heartbeat's extend.
        std::thread::spawn(move || beat.extend(secs(30)).unwrap())
            .join()
            .unwrap();
    }
    assert_eq!(
        q.job(id).unwrap().unwrap().progress.as_deref(),
        Some(&b"2"[..])
    );
    lease.ack().unwrap();
}

#[test]
fn bad_and_stale_updates_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"job", plain()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    let before = q.commit_stats().commits;
    match lease.set_progress(&vec![7u8; PROGRESS_BYTES_MAX + 1]) {
        Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "progress"),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.commit_stats().commits, before);
    assert_eq!(q.job(id).unwrap().unwrap().progress, None);
    lease.set_progress(&vec![7u8; PROGRESS_BYTES_MAX]).unwrap();
    // The lease expires and the job is delivered again: the old lease is fenced.
    f.clock.advance(crate::common::LEASE + secs(1));
    let again = q.dequeue().unwrap().expect("delivered again");
    assert_eq!(
        q.job(id).unwrap().unwrap().progress,
        None,
        "a new delivery starts without progress"
    );
    let stale = lease.set_progress(b"late");
    assert!(
        matches!(stale, Err(Error::LeaseLost { .. })) || stale.is_ok(),
        "{stale:?}"
    );
    // Within the interval the late update waited in memory; the extend that would carry it
    // is refused: either way nothing of the stale lease is written.
    assert!(matches!(
        lease.extend(secs(5)),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(q.job(id).unwrap().unwrap().progress, None);
    again.set_progress(b"fresh").unwrap();
    assert_eq!(
        q.job(id).unwrap().unwrap().progress.as_deref(),
        Some(&b"fresh"[..])
    );
    again.ack().unwrap();
    assert_consistent(&q);
}

#[test]
fn a_completed_job_keeps_its_last_progress_in_the_history() {
    let f = Fixture::new();
    let q = f.open();
    q.set_history(History::off().keep_jobs(10)).unwrap();
    let id = q.enqueue(b"job", plain()).unwrap().id();
    let lease = q.dequeue().unwrap().unwrap();
    lease.set_progress(&[100]).unwrap();
    lease.ack().unwrap();
    let job = q.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state, job.progress),
        (JobState::Completed, Some(vec![100]))
    );
    assert_consistent(&q);
}

#[test]
fn progress_survives_a_reopen_and_goes_at_the_next_delivery() {
    let f = Fixture::new();
    let id;
    {
        let q = f.open();
        id = q.enqueue(b"job", plain()).unwrap().id();
        let lease = q.dequeue().unwrap().unwrap();
        lease.set_progress(b"half").unwrap();
        drop(lease); // not given back: the reopen finds it leased
    }
    let q = f.open();
    let job = q.job(id).unwrap().unwrap();
    assert_eq!(job.state, JobState::Ready, "returned by the reopen");
    assert_eq!(
        job.progress.as_deref(),
        Some(&b"half"[..]),
        "kept until the next delivery"
    );
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(q.job(id).unwrap().unwrap().progress, None);
    lease.ack().unwrap();
    assert_consistent(&q);
}
