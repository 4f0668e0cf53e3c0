//! The async pool (`PoolBuilder::start_async`, `start_async_staged`) and the sync pool's
//! staged handler (`start_staged`): jobs ended by what the handler returned, with the
//! sync pool's counts; heartbeats keep long handlers' leases; panics caught; the shutdown
//! gives back what overruns its grace and leaves no handle; staged effects commit with the
//! ack exactly once.

use crate::common::{Fixture, assert_consistent, effects, enqueue_n, keyed, plain};
use leaseq::worker::effect;
use leaseq::{AsyncLease, JobState, Outcome, Queue, WorkerPool};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn real_clock(f: &Fixture, lease: Duration) -> Queue {
    Queue::builder()
        .lease(lease)
        .retry(leaseq::RetryPolicy::immediate())
        .open(&f.path)
        .unwrap()
}

async fn until(q: &Queue, what: impl Fn(&leaseq::Stats) -> bool) {
    let t = std::time::Instant::now();
    while !what(&q.stats().unwrap()) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{:?}",
            q.stats().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn outcomes_of_async_handlers_end_jobs_as_the_sync_pool_does() {
    let f = Fixture::new();
    let q = f.open();
    // Payload says what the handler does.
    for what in ["ok", "err", "panic", "fail", "snooze", "ok", "ok"] {
        q.enqueue(what.as_bytes(), plain().max_attempts(1)).unwrap();
    }
    let report = runtime().block_on(async {
        let pool = WorkerPool::builder(&q)
            .threads(3)
            .start_async(|lease: AsyncLease| async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                match lease.payload() {
                    b"ok" => Ok(()),
                    b"err" => Err("it broke".into()),
                    b"panic" => panic!("handler panicked"),
                    b"fail" => Err(Outcome::Fail("bad input".into()).into()),
                    _ => Err(Outcome::Snooze(Duration::from_secs(600)).into()),
                }
            })
            .unwrap();
        until(&q, |s| s.ready == 0 && s.leased == 0).await;
        pool.shutdown(Duration::from_secs(5)).await
    });
    let s = report.stats;
    assert_eq!(
        (s.jobs, s.acked, s.retried, s.panics, s.failed, s.snoozed),
        (7, 3, 2, 1, 1, 1),
        "{s:?}"
    );
    assert_eq!((s.dead, s.errors, s.in_flight), (3, 0, 0), "{s:?}");
    assert_eq!(report.still_running, 0);
    let st = q.stats().unwrap();
    assert_eq!((st.dead, st.scheduled, st.total), (3, 1, 4), "{st:?}");
    let dead = q.jobs(JobState::Dead, None, 10).unwrap().jobs;
    let reasons: Vec<_> = dead.iter().filter_map(|j| j.last_error.clone()).collect();
    assert!(
        reasons.iter().any(|r| r == "panic: handler panicked"),
        "{reasons:?}"
    );
    assert_consistent(&q);
}

/// A handler far longer than the lease keeps its job (heartbeats through the async face);
/// a second consumer never gets it.
#[test]
fn heartbeats_keep_a_long_async_handler_s_lease() {
    let f = Fixture::new();
    let lease = Duration::from_millis(800);
    let q = real_clock(&f, lease);
    q.enqueue(b"long", plain()).unwrap();
    let report = runtime().block_on(async {
        let pool = WorkerPool::builder(&q)
            .threads(1)
            .start_async(|_| async {
                tokio::time::sleep(Duration::from_millis(4000)).await;
                Ok(())
            })
            .unwrap();
        // Measured from when the pool holds the job (a slow emulator may take a while to
        // start it), past twice the lease: only heartbeats can have kept it.
        until(&q, |s| s.leased == 1).await;
        tokio::time::sleep(lease * 2).await;
        assert!(q.dequeue().unwrap().is_none(), "the lease was kept");
        until(&q, |s| s.total == 0).await;
        pool.shutdown(Duration::from_secs(5)).await
    });
    assert_eq!(report.stats.acked, 1);
    assert!(report.stats.heartbeats >= 3, "{report:?}");
    assert_eq!(report.stats.lost, 0);
}

/// The shutdown of an async pool: handlers that overrun the grace are aborted (a task can
/// be) and their jobs given back at once, the attempt counted; idle workers end at once;
/// every worker task has ended when it returns, and the file is released with the app's
/// own handles.
#[test]
fn async_shutdown_aborts_overrunning_handlers_and_gives_their_jobs_back() {
    let f = Fixture::new();
    let q = f.open();
    let ids = enqueue_n(&q, 2, plain());
    let started = Arc::new(AtomicU64::new(0));
    let report = runtime().block_on(async {
        let started2 = Arc::clone(&started);
        let pool = WorkerPool::builder(&q)
            .threads(4)
            .start_async(move |_| {
                let started = Arc::clone(&started2);
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(())
                }
            })
            .unwrap();
        while started.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        pool.shutdown(Duration::from_millis(100)).await
    });
    assert_eq!(report.given_back, 2, "{report:?}");
    assert_eq!(
        report.stats.panics, 0,
        "an abort is not a panic: {report:?}"
    );
    assert_eq!(report.still_running, 0);
    for id in ids {
        let j = q.job(id).unwrap().unwrap();
        assert_eq!((j.state, j.attempts), (JobState::Ready, 1), "{j:?}");
    }
    let report = q.shutdown(Duration::from_secs(5));
    assert!(report.released, "{report:?}");
    let again = f.open();
    assert!(!again.recovery().repaired && again.recovery().leases_returned == 0);
}

/// The file's shutdown stops an async pool too (its workers see `Closed`), while its
/// handlers finish and commit: released with the pool value still alive.
#[test]
fn queue_shutdown_stops_an_async_pool() {
    let f = Fixture::new();
    let q = f.open();
    enqueue_n(&q, 50, plain());
    let rt = runtime();
    let pool = rt.block_on(async {
        WorkerPool::builder(&q)
            .threads(4)
            .start_async(|_| async {
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok(())
            })
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(30));
    let report = q.shutdown(Duration::from_secs(10));
    assert!(report.released, "{report:?}");
    let s = pool.stats();
    assert_eq!((s.errors, s.in_flight), (0, 0), "{s:?}");
    drop(pool);
    drop(rt);
    let q = f.open();
    assert_eq!(q.recovery().leases_returned, 0);
    assert_eq!(q.stats().unwrap().ready + s.acked, 50);
}

/// Staged handlers, sync and async: the slow stage runs outside the write transaction (a
/// write from another thread commits while it runs), the effect commits with the ack once
/// per idempotency key, and a job whose key is already applied is acked without running the
/// slow stage again.
#[test]
fn staged_handlers_commit_their_effect_with_the_ack_once() {
    let f = Fixture::new();
    let q = f.open();
    let slow_runs = Arc::new(AtomicU64::new(0));
    for key in ["a", "b", "a", "c"] {
        q.enqueue(key.as_bytes(), keyed(key)).unwrap();
    }
    // The sync pool's staged handler (one thread: the second "a" is taken after the first
    // committed, so its slow stage is skipped for sure).
    let runs = Arc::clone(&slow_runs);
    let writer = q.clone();
    let pool = WorkerPool::builder(&q)
        .threads(1)
        .start_staged(move |lease| {
            runs.fetch_add(1, Ordering::SeqCst);
            // Outside the transaction: another write of the file commits meanwhile.
            writer.enqueue(b"side", plain().delay(Duration::from_secs(3600)))?;
            let n = u64::from(lease.payload()[0]);
            Ok(effect(move |tx| {
                crate::common::bump(tx.transaction(), n)?;
                Ok(())
            }))
        })
        .unwrap();
    let t = std::time::Instant::now();
    while q.stats().unwrap().ready + q.stats().unwrap().leased > 0 {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = pool.shutdown(Duration::from_secs(5));
    assert_eq!(report.stats.acked, 4, "{report:?}");
    assert_eq!(report.stats.already_applied, 1);
    assert_eq!(
        slow_runs.load(Ordering::SeqCst),
        3,
        "the applied key's job skipped stage one"
    );
    let fx = effects(&q);
    assert_eq!(fx.values().sum::<u64>(), 3, "{fx:?}");
    assert!(fx.values().all(|&n| n == 1), "{fx:?}");
    // The async staged pool, with a failing effect: given back, nothing committed.
    q.enqueue(b"d", keyed("d").max_attempts(1)).unwrap();
    q.enqueue(b"e", keyed("e")).unwrap();
    let report = runtime().block_on(async {
        let pool = WorkerPool::builder(&q)
            .threads(2)
            .start_async_staged(|lease| async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let key = lease.payload()[0];
                Ok(effect(move |tx| {
                    if key == b'd' {
                        return Err("the effect failed".into());
                    }
                    crate::common::bump(tx.transaction(), u64::from(key))?;
                    Ok(())
                }))
            })
            .unwrap();
        until(&q, |s| s.ready == 0 && s.leased == 0).await;
        pool.shutdown(Duration::from_secs(5)).await
    });
    assert_eq!(
        (report.stats.acked, report.stats.retried),
        (1, 1),
        "{report:?}"
    );
    let fx = effects(&q);
    assert_eq!(fx.get(&u64::from(b'e')), Some(&1));
    assert_eq!(fx.get(&u64::from(b'd')), None);
    assert!(q.is_applied("e").unwrap() && !q.is_applied("d").unwrap());
    assert_eq!(q.stats().unwrap().dead, 1);
    assert_consistent(&q);
}

/// The app-level stop over many rounds with everything at once: an async pool, a sync pool,
/// async consumer tasks and a producer task, on a multi-thread runtime. Each round the app
/// quits in the documented order (its tasks, the pools, then `AsyncQueue::shutdown` from the
/// last handle): the file is released, a reopen at once reports no repair and no lease left,
/// and every job is acked once or still waiting.
#[test]
fn the_app_level_stop_releases_the_file_every_round() {
    let f = Fixture::new();
    for round in 0..12u64 {
        let q = f.open();
        let r = q.recovery();
        assert!(
            !r.repaired && r.leases_returned == 0,
            "round {round}: {r:?}"
        );
        enqueue_n(&q, 30, plain());
        let acked = Arc::new(AtomicU64::new(0));
        let made = Arc::new(AtomicU64::new(0));
        let rt = runtime();
        let (made2, acked2) = (Arc::clone(&made), Arc::clone(&acked));
        let report = rt.block_on(async move {
            let acked = acked2;
            let a = Arc::clone(&acked);
            let async_pool = WorkerPool::builder(&q)
                .threads(3)
                .start_async(move |_| {
                    let a = Arc::clone(&a);
                    async move {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        a.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                })
                .unwrap();
            let a = Arc::clone(&acked);
            let sync_pool = WorkerPool::builder(&q)
                .threads(2)
                .start(move |_| {
                    a.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .unwrap();
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    let (aq, a) = (q.to_async(), Arc::clone(&acked));
                    tokio::spawn(async move {
                        while let Ok(lease) = aq.next().await {
                            lease.ack().await.unwrap();
                            a.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            let producer = {
                let (aq, made) = (q.to_async(), made2);
                tokio::spawn(async move {
                    loop {
                        if aq.enqueue(b"more", plain()).await.is_err() {
                            return;
                        }
                        made.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            };
            tokio::time::sleep(Duration::from_millis(round * 3)).await;
            // The documented order: the app's tasks, the pools, then the file.
            producer.abort();
            let _ = producer.await;
            let p = async_pool.shutdown(Duration::from_secs(5)).await;
            assert_eq!((p.still_running, p.stats.errors), (0, 0), "{p:?}");
            let s = sync_pool.shutdown(Duration::from_secs(5));
            assert_eq!((s.still_running, s.stats.errors), (0, 0), "{s:?}");
            // From the last handle of the app (the consumers' go as they see `Closed`).
            let shutdown = tokio::spawn(q.into_async().shutdown(Duration::from_secs(10)));
            // The consumers end on `Closed` once the shutdown starts.
            for c in consumers {
                c.await.unwrap();
            }
            shutdown.await.unwrap()
        });
        assert!(report.released, "round {round}: {report:?}");
        drop(rt);
        let q = f.open();
        let r = q.recovery();
        assert!(
            !r.repaired && r.leases_returned == 0,
            "round {round}: {r:?}"
        );
        let s = q.stats().unwrap();
        assert_eq!(s.leased, 0);
        // Every job acked once or waiting: an enqueue whose future the abort dropped may
        // still have committed (one at most).
        let (found, made) = (
            s.ready + acked.load(Ordering::SeqCst),
            30 + made.load(Ordering::SeqCst),
        );
        assert!(
            found == made || found == made + 1,
            "round {round}: {s:?}, {found} vs {made}"
        );
        assert_consistent(&q);
        drop(q);
        std::fs::remove_file(&f.path).unwrap();
    }
}

/// An async handler past the pool's job timeout is dropped (a future can be, at its next
/// await) and its job given back through the retry policy with "timed out after N ms"; out
/// of attempts it is dead. Nothing it would have done after the timeout happens.
#[test]
fn an_async_handler_past_its_timeout_is_dropped_and_its_job_given_back() {
    let f = Fixture::new();
    let q = real_clock(&f, Duration::from_secs(30));
    let id = q
        .enqueue(b"slow", leaseq::EnqueueOptions::default().max_attempts(2))
        .unwrap()
        .id();
    let (started, finished) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let report = runtime().block_on(async {
        let (s, d) = (Arc::clone(&started), Arc::clone(&finished));
        let pool = WorkerPool::builder(&q)
            .threads(1)
            .job_timeout(Duration::from_millis(150))
            .start_async(move |_| {
                let (s, d) = (Arc::clone(&s), Arc::clone(&d));
                async move {
                    s.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    d.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        until(&q, |s| s.dead == 1).await;
        pool.shutdown(Duration::from_secs(5)).await
    });
    assert_eq!(started.load(Ordering::SeqCst), 2);
    assert_eq!(finished.load(Ordering::SeqCst), 0, "dropped, never resumed");
    assert_eq!(
        (report.stats.timed_out, report.stats.acked),
        (2, 0),
        "{report:?}"
    );
    let j = q.job(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Dead, 2), "{j:?}");
    assert_eq!(j.last_error.as_deref(), Some("timed out after 150 ms"));
    assert_consistent(&q);
}

/// A job's own execution timeout (`EnqueueOptions::timeout`) in an async pool without a
/// `job_timeout`: its handler is dropped past it and the job given back ("timed out after N
/// ms", the attempt counted); a job without one in the same pool is not timed (acked after
/// sleeping longer than the other's timeout).
#[test]
fn an_async_jobs_own_timeout_is_kept_by_a_pool_without_one() {
    let f = Fixture::new();
    let q = real_clock(&f, Duration::from_secs(30));
    let timed = q
        .enqueue(
            b"timed",
            leaseq::EnqueueOptions::default()
                .max_attempts(2)
                .timeout(Duration::from_millis(100)),
        )
        .unwrap()
        .id();
    let untimed = q
        .enqueue(b"untimed", leaseq::EnqueueOptions::default())
        .unwrap()
        .id();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let report = runtime().block_on(async {
        let seen = Arc::clone(&seen);
        let pool = WorkerPool::builder(&q)
            .threads(1)
            .start_async(move |lease: AsyncLease| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock()
                        .unwrap()
                        .push((lease.payload().to_vec(), lease.timeout_ms()));
                    if lease.timeout_ms().is_some() {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    Ok(())
                }
            })
            .unwrap();
        until(&q, |s| s.dead == 1 && s.total == 1).await;
        pool.shutdown(Duration::from_secs(5)).await
    });
    assert_eq!(
        (report.stats.timed_out, report.stats.acked),
        (2, 1),
        "{report:?}"
    );
    assert!(q.job(untimed).unwrap().is_none(), "acked");
    let j = q.job(timed).unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.timeout_ms),
        (JobState::Dead, 2, Some(100))
    );
    assert_eq!(j.last_error.as_deref(), Some("timed out after 100 ms"));
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (b"timed".to_vec(), Some(100)),
            (b"timed".to_vec(), Some(100)),
            (b"untimed".to_vec(), None)
        ]
    );
    assert_consistent(&q);
}

/// Started outside a tokio runtime, an async pool is refused with `NoRuntime` naming the
/// call (it was `Io`, read as a failing disk), nothing started and the queue untouched;
/// the same builder's pool starts once a runtime is entered.
#[test]
fn an_async_pool_started_outside_a_runtime_is_no_runtime() {
    let f = Fixture::new();
    let q = real_clock(&f, Duration::from_secs(30));
    enqueue_n(&q, 2, plain());
    let got = WorkerPool::builder(&q)
        .threads(1)
        .start_async(|_l: AsyncLease| async { Ok(()) });
    match got {
        Err(e @ leaseq::Error::NoRuntime { call }) => {
            assert_eq!(call, "PoolBuilder::start_async");
            assert!(e.to_string().contains("tokio runtime"), "{e}");
        }
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("started without a runtime"),
    }
    assert_eq!(q.stats().unwrap().ready, 2, "a job was taken");
    let staged = WorkerPool::builder(&q)
        .threads(1)
        .start_async_staged(|_l: AsyncLease| async { Ok(effect(|_tx| Ok(()))) });
    match staged {
        Err(leaseq::Error::NoRuntime { call }) => {
            assert_eq!(call, "PoolBuilder::start_async_staged")
        }
        other => panic!("{other:?}"),
    }
    let rt = runtime();
    let _in = rt.enter();
    let pool = WorkerPool::builder(&q)
        .threads(1)
        .start_async(|_l: AsyncLease| async { Ok(()) })
        .unwrap();
    rt.block_on(async {
        until(&q, |s| s.ready == 0 && s.leased == 0).await;
        pool.shutdown(Duration::from_secs(5)).await;
    });
    assert_consistent(&q);
}

/// Issue 42: the documented quit order in async code, two steps, on a current-thread
/// runtime: the app's task holding a handle is stopped, then
/// `queue.into_async().shutdown(grace)` on the last handle while an async pool and a thread
/// pool still run jobs (neither is shut down by itself). The pools' workers end their jobs
/// and exit, the file is released, and the next open succeeds at once with no repair and
/// no lease to return.
#[test]
fn the_documented_quit_order_releases_the_file_with_an_async_pool_running() {
    let f = Fixture::new();
    let q = real_clock(&f, Duration::from_secs(30));
    let side = q.named("side").unwrap();
    enqueue_n(&q, 30, plain());
    enqueue_n(&side, 10, plain());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ran = Arc::new(AtomicU64::new(0));
    let (report, pools) = rt.block_on(async {
        let counted = Arc::clone(&ran);
        let tasks = WorkerPool::builder(&q)
            .threads(4)
            .start_async(move |_lease: AsyncLease| {
                let counted = Arc::clone(&counted);
                async move {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        let threads = WorkerPool::builder(&side)
            .threads(2)
            .start(|_lease| Ok(()))
            .unwrap();
        drop(side);
        // The app's own task holding a handle: a status view.
        let status = tokio::spawn({
            let q = q.to_async();
            async move {
                loop {
                    let _ = q.blocking().stats();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
        // Quit with work under way.
        let waited = std::time::Instant::now();
        while ran.load(Ordering::SeqCst) < 3 {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the pool ran nothing"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // 1. Stop the tasks that hold handles and never dequeue.
        status.abort();
        let _ = status.await;
        // 2. Shut the file down from the last handle.
        let report = q.into_async().shutdown(Duration::from_secs(10)).await;
        (report, (tasks, threads))
    });
    assert!(report.released, "{report:?}");
    assert_eq!(
        (pools.0.stats().in_flight, pools.1.stats().in_flight),
        (0, 0)
    );
    drop(pools);
    let again = Queue::open(&f.path).unwrap();
    let r = again.recovery();
    assert!(!r.repaired && r.leases_returned == 0, "{r:?}");
    let main = again.stats().unwrap();
    let side = again.named("side").unwrap().stats().unwrap();
    assert_eq!(main.leased + side.leased, 0);
    assert_eq!(ran.load(Ordering::SeqCst) + main.ready, 30);
    assert_consistent(&again);
}

/// An async pool's handler of a group's head, cancelled, runs past the deadline its lease
/// had at the cancel: its heartbeats go on (answered `Cancelled`), so the group's next job
/// does not start until it returns, as in the thread pool.
#[test]
fn an_async_pools_cancelled_handler_holds_its_group_until_it_returns() {
    let f = Fixture::new();
    let q = f.open();
    let a = q
        .enqueue(b"a", leaseq::EnqueueOptions::default().group("doc"))
        .unwrap()
        .id();
    q.enqueue(b"b", leaseq::EnqueueOptions::default().group("doc"))
        .unwrap();
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let b_started = Arc::new(AtomicU64::new(0));
    let a_started = Arc::new(AtomicU64::new(0));
    let rt = runtime();
    let report = rt.block_on(async {
        let pool = {
            let (a_started, b_started) = (Arc::clone(&a_started), Arc::clone(&b_started));
            WorkerPool::builder(&q)
                .threads(2)
                .heartbeat_every(Duration::from_millis(20))
                .start_async(move |lease: AsyncLease| {
                    let (a_started, b_started) = (Arc::clone(&a_started), Arc::clone(&b_started));
                    let mut release = release_rx.clone();
                    async move {
                        if lease.payload() == b"a" {
                            a_started.store(1, Ordering::SeqCst);
                            let _ = release.wait_for(|go| *go).await;
                        } else {
                            b_started.store(1, Ordering::SeqCst);
                        }
                        Ok(())
                    }
                })
                .unwrap()
        };
        while a_started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        q.cancel(a, "user deleted the document").unwrap();
        // Three times the lease in all, a third at a time, with time for several beats each.
        for _ in 0..9 {
            f.clock.advance(crate::common::LEASE / 3);
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert_eq!(
                b_started.load(Ordering::SeqCst),
                0,
                "b ran beside the cancelled a"
            );
        }
        release_tx.send(true).unwrap();
        let t = std::time::Instant::now();
        while b_started.load(Ordering::SeqCst) == 0 {
            assert!(t.elapsed() < Duration::from_secs(30), "b never ran");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        pool.shutdown(Duration::from_secs(10)).await
    });
    let s = report.stats;
    assert_eq!((s.cancelled, s.lost, s.acked), (1, 0, 1), "{s:?}");
    assert_consistent(&q);
}
