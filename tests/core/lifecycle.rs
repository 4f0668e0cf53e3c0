//! The app's lifecycle: a pool's shutdown lets go of the file, and `Queue::shutdown` stops
//! every consumer of a file, lets work in flight commit, and releases the file (issue 23).

use crate::common::{self, Fixture, enqueue_n, plain};
use leaseq::redb::{ReadableTable, TableDefinition};
use leaseq::{Error, HandleKind, JobState, LiveHandle, Queue, StopSignal, WorkerPool};
use std::collections::HashMap;
use std::time::Duration;

/// What the handlers of these tests did: job id → times its work was stored.
const DONE: TableDefinition<u64, u64> = TableDefinition::new("done");

fn done(q: &Queue) -> HashMap<u64, u64> {
    common::counters(q, DONE)
}

/// Stores that job `id` was done, in a commit of its own (a plain handler's write).
fn store_done(q: &Queue, id: u64) -> leaseq::Result<()> {
    q.write(|tx| {
        let mut t = tx.open_table(DONE)?;
        let n = t.get(id)?.map_or(0, |v| v.value());
        t.insert(id, n + 1)?;
        Ok(())
    })
}

/// Reopening right after a pool's shutdown and the drop of every handle succeeds, and the
/// open reports no repair; `compact` right after the shutdown is not `Busy`: the pool joined
/// its threads before returning (before the fix, a worker that had said it exited but not
/// yet returned kept the file open: `AlreadyOpen` in about half the rounds).
#[test]
fn pool_shutdown_releases_the_file_every_round() {
    let f = Fixture::new();
    for round in 0..60 {
        let mut q = f.open();
        assert!(
            !q.recovery().repaired,
            "round {round}: the last run closed cleanly"
        );
        enqueue_n(&q, 40, plain());
        let writer = q.clone();
        let pool = WorkerPool::builder(&q)
            .threads(16)
            .start(move |lease| {
                if lease.id().0 % 3 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                store_done(&writer, lease.id().0)?;
                Ok(())
            })
            .unwrap();
        while q.stats().unwrap().ready > 20 {
            std::thread::yield_now();
        }
        let report = pool.shutdown(Duration::from_secs(5));
        assert_eq!(report.still_running, 0, "round {round}: {report:?}");
        // The pool held the only other handles (its workers', its handler's capture).
        assert!(
            !matches!(q.compact(), Err(Error::Busy { .. })),
            "round {round}: compact right after the shutdown"
        );
        drop(q);
        // At once: no thread of the pool may still hold the file.
        let again = f.open();
        assert!(!again.recovery().repaired, "round {round}");
        assert_eq!(again.recovery().leases_returned, 0, "round {round}");
    }
}

/// Issue 23's bug, whole: pools, an effect pool, hand-written consumers on two queues of one
/// file, a producer, all running when the app quits with one `Queue::shutdown` while the
/// app still holds its pools. Over many rounds: the file is released when the call returns
/// (a reopen succeeds at once and reports no repair, and no lease is left to return), every
/// handler that ran stored its work with `write` during the shutdown (never `Closed`), and
/// every job is either done exactly once and gone, or still waiting, never done.
#[test]
fn queue_shutdown_stops_everything_and_releases_the_file() {
    let f = Fixture::new();
    let mut seen_done = 0u64;
    for round in 0..30u64 {
        let q = f.open();
        let r = q.recovery();
        assert!(
            !r.repaired && r.leases_returned == 0,
            "round {round}: {r:?}"
        );
        let side = q.named("side").unwrap();
        enqueue_n(&q, 60, plain());
        // A plain pool whose handler is slow, stores its work with `write` and enqueues a
        // follow-up on the side queue.
        let (writer, follow) = (q.clone(), side.clone());
        let plain_pool = WorkerPool::builder(&q)
            .threads(3)
            .start(move |lease| {
                std::thread::sleep(Duration::from_millis(lease.id().0 % 4));
                store_done(&writer, lease.id().0)?;
                follow.enqueue(&lease.id().0.to_le_bytes(), plain())?;
                Ok(())
            })
            .unwrap();
        // An effect pool on the side queue.
        let effect_pool = WorkerPool::builder(&side)
            .threads(2)
            .start_effects(|tx, lease| {
                let mut t = tx.open_table(DONE)?;
                let key = lease.id().0;
                let n = t.get(key)?.map_or(0, |v| v.value());
                t.insert(key, n + 1)?;
                Ok(())
            })
            .unwrap();
        drop(side); // the app's own handles are given up before the shutdown
        // Two hand-written consumers, one stopping on `Closed`, one with its own stop too.
        let stop = StopSignal::new();
        let hands: Vec<_> = (0..2)
            .map(|i| {
                let (q, stop) = (q.clone(), stop.clone());
                std::thread::spawn(move || {
                    loop {
                        let got = if i == 0 {
                            q.dequeue_timeout(Duration::from_secs(600))
                        } else {
                            q.dequeue_until(Duration::from_secs(600), &stop)
                        };
                        match got {
                            Ok(Some(lease)) => {
                                store_done(&q, lease.id().0).unwrap();
                                lease.ack().unwrap();
                            }
                            Ok(None) => return,
                            Err(Error::Closed) => return,
                            Err(e) => panic!("consumer: {e}"),
                        }
                    }
                })
            })
            .collect();
        // Quit while work is under way (sometimes before any, sometimes after all).
        std::thread::sleep(Duration::from_millis(round % 7));
        let report = q.shutdown(Duration::from_secs(10));
        assert!(report.released, "round {round}: {report:?}");
        assert_eq!(report.handles_left, 0);
        for h in hands {
            h.join().unwrap();
        }
        let (ps, es) = (plain_pool.stats(), effect_pool.stats());
        assert_eq!(ps.errors + es.errors, 0, "round {round}: {ps:?} {es:?}");
        assert_eq!(ps.in_flight + es.in_flight, 0);
        drop((plain_pool, effect_pool));
        // At once, in this process: released, and closed cleanly.
        let q = f.open();
        let r = q.recovery();
        assert!(!r.repaired, "round {round}: {r:?}");
        assert_eq!(
            r.leases_returned, 0,
            "round {round}: a lease was left behind"
        );
        let done = done(&q);
        for (id, n) in &done {
            assert_eq!(*n, 1, "round {round}: job {id} done {n} times");
            assert!(
                q.job(leaseq::JobId(*id)).unwrap().is_none(),
                "done, so acked"
            );
        }
        for state in [JobState::Ready, JobState::Leased, JobState::Scheduled] {
            let page = q.jobs(state, None, 1000).unwrap();
            assert!(
                state == JobState::Ready || page.jobs.is_empty(),
                "round {round}: {state:?} left: {:?}",
                page.jobs
            );
            for j in page.jobs {
                assert!(!done.contains_key(&j.id.0), "waiting, so never done");
            }
        }
        seen_done += done.len() as u64;
        common::assert_consistent(&q);
        // Next round: a fresh file.
        drop(q);
        std::fs::remove_file(&f.path).unwrap();
    }
    assert!(seen_done > 0, "some work ran before the shutdowns");
}

/// Handles still alive at the end of the grace: the shutdown says so, closes the file to new
/// work, and the file is released when the last of them goes.
#[test]
fn shutdown_with_a_handle_kept_reports_it_and_the_file_closes_with_it() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 2, plain());
    let kept = q.clone();
    let lease = kept.dequeue().unwrap().unwrap();
    let report = q.shutdown(Duration::from_millis(50));
    assert!(!report.released);
    assert_eq!(report.handles_left, 2, "the kept handle and the lease");
    assert!(report.elapsed >= Duration::from_millis(50));
    assert!(kept.is_closed());
    assert!(matches!(kept.enqueue(b"late", plain()), Err(Error::Closed)));
    assert!(matches!(kept.dequeue(), Err(Error::Closed)));
    // Work in flight still ends.
    lease.ack().unwrap();
    assert!(matches!(
        leaseq::Builder::default().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    drop(lease);
    drop(kept);
    let again = f.open();
    assert!(!again.recovery().repaired);
    assert_eq!(again.stats().unwrap().ready, 1);
}

/// During the grace, enqueues and `write` commit and leases end; deliveries are refused on
/// every handle, and a consumer blocked in a dequeue wakes with `Closed`.
#[test]
fn during_the_grace_writes_commit_and_deliveries_stop() {
    let f = Fixture::new();
    let q = f.open();
    let side = q.named("side").unwrap();
    enqueue_n(&q, 3, plain());
    let lease = q.dequeue().unwrap().unwrap();
    let blocked = {
        let side = side.clone();
        std::thread::spawn(move || side.dequeue_timeout(Duration::from_secs(600)))
    };
    std::thread::sleep(Duration::from_millis(50));
    let finisher = {
        let q = q.clone();
        std::thread::spawn(move || {
            // Give the shutdown time to start.
            while !q.is_closed() {
                std::thread::yield_now();
            }
            let delivered = q.dequeue();
            let enqueued = q.enqueue(b"follow-up", plain());
            let wrote = store_done(&q, lease.id().0);
            let acked = lease.ack();
            (
                delivered.map(|l| l.is_some()),
                enqueued.is_ok(),
                wrote,
                acked,
            )
        })
    };
    let report = q.shutdown(Duration::from_secs(10));
    let (delivered, enqueued, wrote, acked) = finisher.join().unwrap();
    assert!(matches!(delivered, Err(Error::Closed)), "{delivered:?}");
    assert!(enqueued, "an enqueue during the grace commits");
    wrote.unwrap();
    acked.unwrap();
    assert!(matches!(blocked.join().unwrap(), Err(Error::Closed)));
    drop(side);
    // The `side` handle was dropped after the blocked thread's: the shutdown may have seen it.
    if !report.released {
        assert_eq!(report.handles_left, 1, "{report:?}");
    }
    let q = f.open();
    assert_eq!(q.stats().unwrap().ready, 3, "two left and the follow-up");
    assert_eq!(done(&q).len(), 1);
}

/// A clean exit of a process after `Queue::shutdown` leaves a file that the next start opens
/// with no repair (so `Recovery::repaired` tells an app its last run crashed), even with a
/// pool that was busy at the exit.
#[test]
fn a_process_that_shut_down_leaves_no_repair() {
    const NAME: &str = "lifecycle::a_process_that_shut_down_leaves_no_repair";
    if let Some((scenario, path)) = common::child_scenario() {
        if scenario == "quit" {
            let q = Queue::open(&path).unwrap();
            enqueue_n(&q, 200, plain());
            let pool = WorkerPool::builder(&q)
                .threads(4)
                .start(|_| {
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(())
                })
                .unwrap();
            std::thread::sleep(Duration::from_millis(30));
            let report = q.shutdown(Duration::from_secs(10));
            common::say(format!("RELEASED {}", report.released));
            // The app keeps its pool value to the end of main, as apps do.
            std::mem::forget(pool);
        }
        return;
    }
    let f = Fixture::new();
    drop(f.open());
    for round in 0..6 {
        let mut child = common::ChildProc::spawn(NAME, "quit", &f.path);
        assert_eq!(
            child.next_message().as_deref(),
            Some("RELEASED true"),
            "round {round}"
        );
        let status = (0..200).find_map(|_| {
            std::thread::sleep(Duration::from_millis(25));
            child.exited()
        });
        assert!(
            status.is_some_and(|s| s.success()),
            "round {round}: {status:?}"
        );
        let q = f.open();
        let r = q.recovery();
        assert!(
            !r.repaired && r.leases_returned == 0,
            "round {round}: {r:?}"
        );
    }
}

/// Issue 42: a handle forgotten at the app's exit is named by the line of the app's code
/// that made it (a clone, a named queue, a reader, and a lease named by the line of the
/// handle that dequeued it), in the shutdown's report and in the `AlreadyOpen` of the next
/// open in this process; once they are dropped, the file opens.
#[test]
fn a_forgotten_handle_is_named_by_the_line_that_made_it() {
    let f = Fixture::new();
    let q = Queue::open(&f.path).unwrap();
    let (kept, kept_line) = (q.clone(), line!());
    let (emails, emails_line) = (q.named("emails").unwrap(), line!());
    let (reader, reader_line) = (q.reader(), line!());
    emails.enqueue(b"to send", plain()).unwrap();
    let lease = emails.dequeue().unwrap().unwrap();
    let job = lease.id();
    let report = q.shutdown(Duration::from_millis(20));
    assert!(!report.released);
    assert_eq!(report.handles_left, 4, "{report:?}");
    let named = |handles: &[LiveHandle]| {
        let mut named: Vec<(HandleKind, Option<String>, &str, u32)> = handles
            .iter()
            .map(|h| (h.kind, h.queue.clone(), h.made_at.file(), h.made_at.line()))
            .collect();
        named.sort_by_key(|n| n.3);
        named
    };
    let emails_name = Some("emails".to_string());
    let mut expected = vec![
        (HandleKind::Queue, None, file!(), kept_line),
        (HandleKind::Queue, emails_name.clone(), file!(), emails_line),
        (HandleKind::Lease { job }, emails_name, file!(), emails_line),
        (HandleKind::Reader, None, file!(), reader_line),
    ];
    expected.sort_by_key(|n| n.3);
    assert_eq!(named(&report.handles), expected, "{report:?}");
    let line = report.handles[0].to_string();
    assert!(line.contains(&format!("{}:", file!())), "{line}");
    match Queue::open(&f.path) {
        Err(e @ Error::AlreadyOpen { .. }) => {
            let text = e.to_string();
            let Error::AlreadyOpen { live_handles, .. } = e else {
                unreachable!()
            };
            assert_eq!(named(&live_handles), expected);
            let at = format!("{}:{kept_line}:", file!());
            assert!(text.contains(&at), "{text}");
        }
        other => panic!("{other:?}"),
    }
    lease.ack().unwrap();
    drop((kept, emails, reader, lease));
    let again = Queue::open(&f.path).unwrap();
    assert!(again.named("emails").unwrap().is_empty().unwrap());
    let report = again.shutdown(Duration::from_secs(1));
    assert!(report.released && report.handles.is_empty(), "{report:?}");
}

/// The handles a shutdown names are bounded: of 40 forgotten clones it lists
/// `HANDLES_LISTED_MAX` and counts all.
#[test]
fn a_shutdown_names_at_most_handles_listed_max() {
    let f = Fixture::new();
    let q = f.open();
    let kept: Vec<Queue> = (0..40).map(|_| q.clone()).collect();
    let report = q.shutdown(Duration::ZERO);
    assert_eq!(report.handles_left, 40);
    assert_eq!(report.handles.len(), leaseq::HANDLES_LISTED_MAX);
    drop(kept);
    assert!(!f.open().recovery().repaired);
}

/// Issue 42: the documented quit order, two steps. The app lets go of the handles it holds
/// that never dequeue (a status thread), and calls `shutdown` on its last handle while two
/// worker pools (plain and effect handlers) still run jobs: no pool shutdown is needed.
/// The pools' workers end their jobs and exit, the file is released, and the next open
/// succeeds at once with no repair and no lease to return.
#[test]
fn the_documented_quit_order_releases_the_file_with_pools_running() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 40, plain());
    let writer = q.clone();
    let pool = WorkerPool::builder(&q)
        .threads(3)
        .start(move |lease| {
            std::thread::sleep(Duration::from_millis(2));
            store_done(&writer, lease.id().0)?;
            Ok(())
        })
        .unwrap();
    let side = q.named("side").unwrap();
    enqueue_n(&side, 20, plain());
    let effects = WorkerPool::builder(&side)
        .threads(2)
        .start_effects(|tx, lease| {
            tx.open_table(DONE)?.insert(lease.id().0, 1)?;
            Ok(())
        })
        .unwrap();
    drop(side);
    // The app's own thread holding a handle, reading stats until told to stop.
    let stop = StopSignal::new();
    let status = {
        let (q, stop) = (q.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.is_stopped() {
                let _ = q.stats();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    // Quit with work under way.
    let waited = std::time::Instant::now();
    while done(&q).len() < 3 {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the pool ran nothing"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // 1. Let go of the handles that never dequeue.
    stop.stop();
    status.join().unwrap();
    // 2. Shut the file down from the last handle.
    let report = q.shutdown(Duration::from_secs(10));
    assert!(report.released, "{report:?}");
    assert!(report.handles.is_empty());
    assert_eq!((pool.stats().in_flight, effects.stats().in_flight), (0, 0));
    let again = f.open();
    let r = again.recovery();
    assert!(!r.repaired && r.leases_returned == 0, "{r:?}");
    let (main, side) = (
        again.stats().unwrap(),
        again.named("side").unwrap().stats().unwrap(),
    );
    assert_eq!(main.leased + side.leased, 0);
    // Every job is done once and gone, or still waiting.
    let done = done(&again);
    assert!(done.values().all(|&n| n == 1), "{done:?}");
    assert_eq!(done.len() as u64 + main.ready + side.ready, 60);
    drop((pool, effects));
}

/// Issue 42: a pool's handler still running at the end of the grace keeps its worker's
/// handle and its lease (and the lease's heartbeat): the shutdown names each by the line of
/// `WorkerPool::builder`.
#[test]
fn a_handler_that_overran_the_grace_is_named_by_its_pools_line() {
    let f = Fixture::new();
    let q = Queue::open(&f.path).unwrap();
    let job = q.enqueue(b"slow", plain()).unwrap().id();
    let (started, go) = (StopSignal::new(), StopSignal::new());
    let (pool, pool_line) = (WorkerPool::builder(&q), line!());
    let pool = {
        let (started, go) = (started.clone(), go.clone());
        pool.threads(1)
            .start(move |_lease| {
                started.stop();
                while !go.is_stopped() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })
            .unwrap()
    };
    while !started.is_stopped() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let report = q.shutdown(Duration::from_millis(20));
    assert!(!report.released);
    assert_eq!(report.handles.len(), report.handles_left, "{report:?}");
    assert!(
        report
            .handles
            .iter()
            .all(|h| (h.made_at.file(), h.made_at.line()) == (file!(), pool_line)),
        "{report:?}"
    );
    let kinds: Vec<HandleKind> = report.handles.iter().map(|h| h.kind).collect();
    let workers = kinds.iter().filter(|k| **k == HandleKind::Queue).count();
    let leases = kinds
        .iter()
        .filter(|k| **k == HandleKind::Lease { job })
        .count();
    assert_eq!((workers, workers + leases), (1, kinds.len()), "{kinds:?}");
    assert!(leases >= 1, "{kinds:?}");
    go.stop();
    drop(pool);
    let again = f.open();
    assert!(again.is_empty().unwrap());
}
