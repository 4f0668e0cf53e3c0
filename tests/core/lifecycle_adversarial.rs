//! Adversarial tests of `Queue::shutdown` and of a pool's hold on the file: shutdowns with
//! `Durability::None`, from two clones at once, from a named queue's handle, with grace
//! zero, over a pool stopped by its own signal but still held, over a handler that enqueues
//! during the grace, over a blocked consumer of a paused queue. Each test checks the file
//! after (a reopen's recovery report, the jobs' states and attempts, `check()`).

use crate::common::{
    Fixture, assert_consistent, assert_nothing_charged, enqueue_n, eventually, plain,
};
use leaseq::{Error, JobId, JobState, Queue, StopSignal, WorkerPool};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// With `Durability::None` every enqueue returns before its commit is durable; a released
/// shutdown makes them durable and closes cleanly: the reopen finds every job, no repair.
#[test]
fn shutdown_with_durability_none_keeps_every_enqueue() {
    let f = Fixture::new();
    let mut expected = 0u64;
    for round in 0..10u64 {
        let q = f.open_non_durable();
        assert!(!q.recovery().repaired, "round {round}");
        assert_eq!(q.stats().unwrap().ready, expected, "round {round}");
        enqueue_n(&q, 7, plain());
        // Some work in flight at the shutdown, ended during the grace from another thread.
        let lease = q.dequeue().unwrap().unwrap();
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            lease.ack().unwrap();
        });
        let report = q.shutdown(Duration::from_secs(10));
        ender.join().unwrap();
        assert!(report.released, "round {round}: {report:?}");
        assert_eq!(report.handles_left, 0);
        expected += 6;
        let again = f.open();
        assert!(!again.recovery().repaired, "round {round}");
        assert_eq!(again.recovery().leases_returned, 0, "round {round}");
        assert_eq!(again.stats().unwrap().ready, expected, "round {round}");
        assert_consistent(&again);
    }
}

/// Two clones call `shutdown` at once from two threads. Each waits for the other, so both
/// run out their grace; then the file must be released (both handles are gone when both
/// calls returned), a reopen at once succeeds with no repair, no job is lost, and at least
/// one report says it released the file (neither may claim handles that were gone).
#[test]
fn shutdown_twice_from_clones_at_once() {
    let f = Fixture::new();
    let mut neither = 0;
    for round in 0..40u64 {
        let q = f.open_non_durable();
        let before = q.stats().unwrap().ready;
        enqueue_n(&q, 3, plain());
        let other = q.clone();
        let grace = Duration::from_millis(10 + round % 5);
        let t = std::thread::spawn(move || other.shutdown(grace));
        let mine = q.shutdown(grace);
        let theirs = t.join().unwrap();
        let again = f.open();
        let r = again.recovery();
        assert!(!r.repaired, "round {round}: {r:?}");
        assert_eq!(again.stats().unwrap().ready, before + 3, "round {round}");
        assert!(mine.handles_left <= 1 && theirs.handles_left <= 1);
        if !mine.released && !theirs.released {
            neither += 1;
        }
        drop(again);
    }
    assert_eq!(
        neither, 0,
        "rounds where the file was released but both reports said it was not"
    );
}

/// The app keeps only a named queue's handle and shuts the file down through it: the
/// default queue's pool stops, and the file is released.
#[test]
fn shutdown_through_a_named_queue_handle_releases_the_file() {
    let f = Fixture::new();
    let q = f.open();
    let side = q.named("side").unwrap();
    enqueue_n(&q, 20, plain());
    enqueue_n(&side, 5, plain());
    let pool = WorkerPool::builder(&q)
        .threads(2)
        .start(|_| {
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        })
        .unwrap();
    drop(q);
    let report = side.shutdown(Duration::from_secs(10));
    assert!(report.released, "{report:?}");
    let stats = pool.stats();
    assert_eq!((stats.errors, stats.in_flight), (0, 0), "{stats:?}");
    drop(pool);
    let again = f.open();
    let r = again.recovery();
    assert!(!r.repaired && r.leases_returned == 0, "{r:?}");
    assert_eq!(again.named("side").unwrap().stats().unwrap().ready, 5);
    let s = again.stats().unwrap();
    assert_eq!(s.ready + stats.acked, 20, "{s:?} {stats:?}");
    assert_nothing_charged(&again);
    assert_consistent(&again);
}

/// A pool stopped through its own `StopSignal` (not shut down: the app still holds the
/// `WorkerPool`) holds no handle once its workers exited: a `Queue::shutdown` then releases
/// the file, though the handler captured a queue handle. Dropping the pool after is harmless.
#[test]
fn a_stopped_but_held_pool_does_not_hold_the_file() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 10, plain());
    let stop = StopSignal::new();
    let captured = q.clone();
    let pool = WorkerPool::builder(&q)
        .threads(3)
        .stop_signal(stop.clone())
        .start(move |lease| {
            // The handler holds a handle of its own.
            let _ = captured.stats()?;
            let _ = lease.id();
            Ok(())
        })
        .unwrap();
    assert!(eventually(|| q.stats().unwrap().total == 0));
    stop.stop();
    let report = q.shutdown(Duration::from_secs(10));
    assert!(report.released, "{report:?}");
    let stats = pool.stats();
    assert_eq!((stats.acked, stats.errors, stats.in_flight), (10, 0, 0));
    let shut = pool.shutdown(Duration::from_secs(1));
    assert_eq!(shut.still_running, 0, "{shut:?}");
    let again = f.open();
    assert!(!again.recovery().repaired);
    assert_eq!(again.stats().unwrap().total, 0);
}

/// A handler that enqueues follow-ups (on its own queue and a named one) and stores its
/// work during the grace: every job the pool acked has exactly one follow-up in each queue,
/// every job not acked is ready and uncharged, and the file is released.
#[test]
fn a_handler_enqueueing_during_the_grace_loses_nothing() {
    let f = Fixture::new();
    for round in 0..10u64 {
        let q = f.open();
        let side = q.named("side").unwrap();
        let ids = enqueue_n(&q, 40, plain());
        let handled: Arc<Mutex<Vec<u64>>> = Arc::default();
        let pool = {
            let (own, side, handled) = (q.clone(), side.clone(), Arc::clone(&handled));
            WorkerPool::builder(&q)
                .threads(3)
                .start(move |lease| {
                    let id = lease.id().0;
                    // Follow-ups carry their parent's id; the first byte tells them apart.
                    if lease.payload().first() == Some(&b'f') {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(id % 3));
                    let mut body = b"f".to_vec();
                    body.extend_from_slice(&id.to_le_bytes());
                    own.enqueue(&body, plain())?;
                    side.enqueue(&body, plain())?;
                    handled.lock().unwrap().push(id);
                    Ok(())
                })
                .unwrap()
        };
        drop(side);
        std::thread::sleep(Duration::from_millis(round % 6));
        let report = q.shutdown(Duration::from_secs(15));
        assert!(report.released, "round {round}: {report:?}");
        let ps = pool.stats();
        assert_eq!((ps.errors, ps.in_flight), (0, 0), "round {round}: {ps:?}");
        drop(pool);
        let again = f.open();
        let r = again.recovery();
        assert!(
            !r.repaired && r.leases_returned == 0,
            "round {round}: {r:?}"
        );
        let handled: HashSet<u64> = handled.lock().unwrap().iter().copied().collect();
        let parent = |payload: &[u8]| -> Option<u64> {
            let rest = payload.strip_prefix(b"f")?;
            Some(u64::from_le_bytes(rest.try_into().ok()?))
        };
        let follow_ups = |q: &Queue| -> HashMap<u64, u32> {
            let mut m = HashMap::new();
            for j in q.jobs(JobState::Ready, None, 10_000).unwrap().jobs {
                let payload = q.payload(j.id).unwrap().unwrap();
                if let Some(p) = parent(&payload) {
                    *m.entry(p).or_default() += 1;
                }
            }
            m
        };
        let side = again.named("side").unwrap();
        let in_side = follow_ups(&side);
        // Follow-ups on the main queue may have been handled (and acked) by the pool before
        // the shutdown: those on the side queue are never consumed.
        assert_eq!(
            in_side.keys().copied().collect::<HashSet<_>>(),
            handled,
            "round {round}"
        );
        assert!(in_side.values().all(|n| *n == 1), "round {round}");
        for id in &ids {
            match again.job(*id).unwrap() {
                None => assert!(
                    handled.contains(&id.0),
                    "round {round}: {id:?} gone unhandled"
                ),
                Some(j) => {
                    assert!(
                        !handled.contains(&id.0),
                        "round {round}: handled, not acked"
                    );
                    assert_eq!((j.state, j.attempts), (JobState::Ready, 0), "{j:?}");
                }
            }
        }
        assert_nothing_charged(&again);
        assert_consistent(&again);
        drop((side, again));
        std::fs::remove_file(&f.path).unwrap();
    }
}

/// A consumer blocked on a paused named queue (which only a resume would wake) wakes with
/// `Closed` at the shutdown, and the file is released.
#[test]
fn shutdown_wakes_a_consumer_blocked_on_a_paused_queue() {
    let f = Fixture::new();
    let q = f.open();
    let side = q.named("side").unwrap();
    enqueue_n(&side, 2, plain());
    side.pause().unwrap();
    let stop = StopSignal::new();
    let blocked: Vec<_> = (0..2)
        .map(|i| {
            let (side, stop) = (side.clone(), stop.clone());
            std::thread::spawn(move || {
                if i == 0 {
                    side.dequeue_timeout(Duration::from_secs(3600))
                } else {
                    side.dequeue_until(Duration::from_secs(3600), &stop)
                }
            })
        })
        .collect();
    drop(side);
    std::thread::sleep(Duration::from_millis(50));
    let report = q.shutdown(Duration::from_secs(20));
    assert!(report.released, "{report:?}");
    assert!(report.elapsed < Duration::from_secs(20), "{report:?}");
    for b in blocked {
        assert!(matches!(b.join().unwrap(), Err(Error::Closed)));
    }
    let again = f.open();
    assert!(!again.recovery().repaired);
    let side = again.named("side").unwrap();
    let s = side.stats().unwrap();
    assert!(s.paused, "the pause is kept in the file");
    assert_eq!((s.ready, s.leased), (2, 0), "{s:?}");
    assert_nothing_charged(&side);
    assert_consistent(&again);
}

/// A shutdown with grace zero while the app keeps a lease and a clone: not released,
/// `handles_left` counts both; a second shutdown through the kept clone once the lease is
/// dropped (not acked) releases the file; the next open returns that lease (the attempt
/// counted, as after a crash), and the job is ready again.
#[test]
fn a_second_shutdown_through_the_kept_handle_releases_the_file() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 3, plain());
    let kept = q.clone();
    let lease = kept.dequeue().unwrap().unwrap();
    assert_eq!(lease.id(), ids[0]);
    let first = q.shutdown(Duration::ZERO);
    assert!(!first.released);
    assert_eq!(first.handles_left, 2, "{first:?}");
    drop(lease);
    let second = kept.shutdown(Duration::from_secs(5));
    assert!(second.released, "{second:?}");
    assert_eq!(second.handles_left, 0);
    let again = f.open();
    let r = again.recovery();
    assert_eq!(r.leases_returned, 1, "{r:?}");
    let j = again.job(ids[0]).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Ready, 1), "{j:?}");
    for id in &ids[1..] {
        let j = again.job(*id).unwrap().unwrap();
        assert_eq!((j.state, j.attempts), (JobState::Ready, 0));
    }
    assert_consistent(&again);
}

/// During the grace a handler-style writer keeps committing through `write` and `enqueue`
/// from many threads while consumers are refused: no call that returned `Ok` is lost (all in
/// the file after the reopen), and every refusal is `Closed`, never another error.
#[test]
fn writes_racing_the_end_of_the_grace_are_kept_or_refused_cleanly() {
    let f = Fixture::new();
    for round in 0..6u64 {
        let q = f.open();
        let before = q.stats().unwrap().ready;
        let oks: Arc<Mutex<Vec<JobId>>> = Arc::default();
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let (q, oks) = (q.clone(), Arc::clone(&oks));
                std::thread::spawn(move || {
                    // Each writer keeps going until refused, then drops its handle.
                    for _ in 0..10_000 {
                        match q.enqueue(b"late", plain()) {
                            Ok(e) => oks.lock().unwrap().push(e.id()),
                            Err(Error::Closed) => return,
                            Err(e) => panic!("{e}"),
                        }
                        // A dequeue that started after the shutdown did delivers nothing.
                        let was_closed = q.is_closed();
                        match q.dequeue() {
                            Err(Error::Closed) => {}
                            Ok(_) if !was_closed => {}
                            other => panic!("a delivery during the grace: {other:?}"),
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5 + round));
        // Short: the writers are still enqueueing when it runs out.
        let report = q.shutdown(Duration::from_millis(20 + round * 3));
        for w in writers {
            w.join().unwrap();
        }
        let oks = oks.lock().unwrap();
        if !report.released {
            assert!(report.handles_left >= 1, "{report:?}");
        }
        let again = f.open();
        let s = again.stats().unwrap();
        // Deliveries before the shutdown took and dropped some leases: returned at open.
        assert_eq!(
            s.ready,
            before + oks.len() as u64,
            "round {round}: {s:?} {:?}",
            again.recovery()
        );
        for id in oks.iter() {
            assert!(
                again.job(*id).unwrap().is_some(),
                "round {round}: lost {id:?}"
            );
        }
        assert_consistent(&again);
        drop(again);
        std::fs::remove_file(&f.path).unwrap();
    }
}

/// A pool handler that outlives the pool's grace: the shutdown gives its job back (attempt
/// counted) and reports it still running; its worker keeps the file open (a reopen is
/// `AlreadyOpen`) until the handler returns, then lets go by itself: the reopen succeeds,
/// reports no repair and no lease, and the job is ready with one attempt and the reason.
#[test]
fn a_worker_left_running_holds_the_file_until_its_handler_returns() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"slow", plain()).unwrap().id();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let pool = WorkerPool::builder(&q)
        .threads(1)
        .start(move |_lease| {
            let _ = release_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
            Ok(())
        })
        .unwrap();
    assert!(eventually(|| pool.stats().in_flight == 1));
    let report = pool.shutdown(Duration::from_millis(50));
    assert_eq!(
        (report.still_running, report.given_back),
        (1, 1),
        "{report:?}"
    );
    drop(q);
    assert!(matches!(
        leaseq::Builder::default().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    release_tx.send(()).unwrap();
    let again = f.reopen_when_released();
    let r = again.recovery();
    assert!(!r.repaired && r.leases_returned == 0, "{r:?}");
    let j = again.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Ready, 1), "{j:?}");
    assert!(
        j.last_error
            .as_deref()
            .is_some_and(|e| e.contains("given back at shutdown")),
        "{j:?}"
    );
    assert_consistent(&again);
}
