//! Adversarial tests of the async face: dequeue futures dropped at awkward points (a lost
//! `select!`, a batch, a runtime's timeout while a pool also consumes), waiters on paused and
//! named queues, stop signals over several files, wakers left behind by dropped waits, and
//! shutdowns racing waiters, pools and leases. Each test checks the queue's state after
//! (stats, attempts, `check()`), not only the answers.

use crate::common::{
    Fixture, assert_consistent, assert_nothing_charged, enqueue_n, eventually, plain,
};
use crate::support::{
    a_dequeue_that_took_the_lease, counting_waker, hold_commits, poll_once, take_and_drop_a_dequeue,
};
use leaseq::{
    AsyncQueue, EnqueueOptions, Enqueued, Error, JobId, JobState, StopSignal, WorkerPool,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Two dequeues on one queue raced in `select!`: the loser is dropped, perhaps after its
/// commit took a job. Over many rounds every job is handed out exactly once, at attempt 1,
/// and nothing is left leased or charged.
#[test]
fn select_between_two_dequeues_strands_nothing() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let ids = enqueue_n(q.blocking(), 300, plain());
    let handed = current_thread().block_on(async {
        let mut handed: HashMap<u64, u32> = HashMap::new();
        let mut empty_rounds = 0;
        while empty_rounds < 50 {
            let got = tokio::select! {
                a = q.dequeue_timeout(Duration::from_millis(20)) => a,
                b = q.dequeue_timeout(Duration::from_millis(20)) => b,
            };
            match got.unwrap() {
                Some(lease) => {
                    assert_eq!(lease.attempt(), 1, "charged by a lost select: {lease:?}");
                    *handed.entry(lease.id().0).or_default() += 1;
                    lease.ack().await.unwrap();
                    empty_rounds = 0;
                }
                // Maybe every job left is held by a loser's give-back still under way.
                None => empty_rounds += 1,
            }
        }
        handed
    });
    assert_eq!(handed.len(), ids.len(), "every job handed out");
    assert!(handed.values().all(|n| *n == 1), "a job handed out twice");
    let s = q.blocking().stats().unwrap();
    assert_eq!((s.total, s.leased), (0, 0), "{s:?}");
    assert_consistent(q.blocking());
}

/// A batch dequeue's future dropped after its commit took five jobs: all five go back,
/// ready in their places (the next batch gets them in the original order), uncharged.
#[test]
fn a_dropped_batch_dequeue_gives_every_lease_back_in_order() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let ids = enqueue_n(q.blocking(), 8, plain());
    let (_c, waker) = counting_waker();
    let mut fut = Box::pin(q.dequeue_batch(5));
    let held = hold_commits(q.blocking());
    assert!(
        poll_once(fut.as_mut(), &waker).is_none(),
        "commits on a helper"
    );
    drop(held);
    assert!(eventually(|| q.blocking().stats().unwrap().leased == 5));
    drop(fut);
    assert!(
        eventually(|| q.blocking().stats().unwrap().leased == 0),
        "the dropped batch's leases went back"
    );
    assert_nothing_charged(q.blocking());
    let again = q.blocking().dequeue_batch(8).unwrap();
    let got: Vec<JobId> = again.iter().map(|l| l.id()).collect();
    assert_eq!(got, ids, "back in their places");
    assert!(again.iter().all(|l| l.attempt() == 1));
    for l in again {
        l.ack().unwrap();
    }
    assert_consistent(q.blocking());
}

/// Dequeue futures dropped by short timeouts on a multi-thread runtime while a worker pool
/// consumes the same queue: every job is handled exactly once, each at attempt 1 (a job a
/// dropped future took went back uncharged), and nothing is left.
#[test]
fn dropped_dequeues_racing_a_pool_hand_each_job_out_once() {
    let f = Fixture::new();
    let queue = f.open();
    let q = queue.to_async();
    let handed: Arc<Mutex<HashMap<u64, Vec<u32>>>> = Arc::default();
    let pool = {
        let handed = Arc::clone(&handed);
        WorkerPool::builder(&queue)
            .threads(2)
            .start(move |lease| {
                handed
                    .lock()
                    .unwrap()
                    .entry(lease.id().0)
                    .or_default()
                    .push(lease.attempt());
                Ok(())
            })
            .unwrap()
    };
    const N: u64 = 300;
    multi_thread().block_on(async {
        let producer = {
            let q = q.clone();
            tokio::spawn(async move {
                for _ in 0..N {
                    q.enqueue(b"job", plain()).await.unwrap();
                    tokio::task::yield_now().await;
                }
            })
        };
        let consumers: Vec<_> = (0..3u64)
            .map(|c| {
                let (q, handed) = (q.clone(), Arc::clone(&handed));
                tokio::spawn(async move {
                    for round in 0..600u64 {
                        let budget = Duration::from_micros((round * 53 + c * 17) % 2500);
                        if let Ok(got) =
                            tokio::time::timeout(budget, q.dequeue_timeout(Duration::from_secs(5)))
                                .await
                            && let Some(lease) = got.unwrap()
                        {
                            handed
                                .lock()
                                .unwrap()
                                .entry(lease.id().0)
                                .or_default()
                                .push(lease.attempt());
                            lease.ack().await.unwrap();
                        }
                    }
                })
            })
            .collect();
        producer.await.unwrap();
        for c in consumers {
            c.await.unwrap();
        }
    });
    assert!(
        eventually(|| queue.stats().unwrap().total == 0),
        "the pool took what was left: {:?}",
        queue.stats().unwrap()
    );
    let report = pool.shutdown(Duration::from_secs(10));
    assert_eq!(report.stats.errors, 0, "{report:?}");
    let handed = handed.lock().unwrap();
    assert_eq!(handed.len() as u64, N, "every job handled");
    for (id, attempts) in handed.iter() {
        assert_eq!(attempts, &vec![1], "job {id}: handed out at {attempts:?}");
    }
    assert_consistent(&queue);
}

/// A job enqueued with `dedup_until_started` holds its key until a consumer starts it. A
/// dequeue future dropped after its commit took the job never handed it to anyone: the job
/// goes back "as if never taken", so it must still hold its key, and a second enqueue with
/// the key is a `Duplicate`, not a second waiting job.
#[test]
fn an_unseen_give_back_keeps_a_dedup_until_started_key() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let opts = || {
        EnqueueOptions::default()
            .dedup_key("note-7")
            .dedup_until_started()
    };
    let first = q.blocking().enqueue(b"sync note 7", opts()).unwrap().id();
    take_and_drop_a_dequeue(&q);
    let info = q.blocking().job(first).unwrap().unwrap();
    assert_eq!((info.state, info.attempts), (JobState::Ready, 0));
    let again = q.blocking().enqueue(b"sync note 7", opts()).unwrap();
    assert_eq!(
        (again, q.blocking().stats().unwrap().ready),
        (Enqueued::Duplicate(first), 1),
        "one waiting job per key"
    );
    assert_eq!(
        info.dedup_key.as_deref(),
        Some(&b"note-7"[..]),
        "the key of a job never started: {info:?}"
    );
    assert_consistent(q.blocking());
}

/// A job snoozed with a reason shows it as its status until its next delivery. A delivery
/// taken by a dropped dequeue future and given back unseen is no delivery: the status stays.
#[test]
fn an_unseen_give_back_keeps_the_snooze_status() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let id = q.blocking().enqueue(b"upload", plain()).unwrap().id();
    let lease = q.blocking().dequeue().unwrap().unwrap();
    lease
        .snooze_because(Duration::ZERO, "waiting for network")
        .unwrap();
    let before = q.blocking().job(id).unwrap().unwrap();
    assert_eq!(before.status.as_deref(), Some("waiting for network"));
    take_and_drop_a_dequeue(&q);
    let after = q.blocking().job(id).unwrap().unwrap();
    assert_eq!(
        (after.state, after.attempts, after.snoozes),
        (JobState::Ready, 0, 1)
    );
    assert_eq!(
        after.status, before.status,
        "nothing else changed: {after:?}"
    );
    assert_consistent(q.blocking());
}

/// A task waiting on a paused queue that holds a ready job is not served by the pause, nor by
/// an enqueue while paused; `resume` wakes it with the first job.
#[test]
fn a_paused_queue_holds_async_waiters_until_resume() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let first = q.blocking().enqueue(b"first", plain()).unwrap().id();
    q.blocking().pause().unwrap();
    current_thread().block_on(async {
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.dequeue_timeout(Duration::from_secs(3600)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.enqueue(b"second", plain()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "a paused queue delivered");
        let s = q.blocking().stats().unwrap();
        assert_eq!((s.ready, s.leased), (2, 0), "{s:?}");
        q.run(|b| b.resume()).await.unwrap();
        let lease = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("woken by the resume")
            .unwrap()
            .unwrap()
            .expect("a job");
        assert_eq!((lease.id(), lease.attempt()), (first, 1));
        lease.ack().await.unwrap();
    });
    let s = q.blocking().stats().unwrap();
    assert_eq!((s.ready, s.leased, s.total), (1, 0, 1), "{s:?}");
    assert_nothing_charged(q.blocking());
    assert_consistent(q.blocking());
}

/// Waiters on one named queue are not woken into taking another queue's jobs: jobs of "b"
/// and of the default queue stay with them; "a"'s waiter gets "a"'s job only.
#[test]
fn a_waiter_on_one_named_queue_is_served_only_by_its_own_jobs() {
    let f = Fixture::new();
    let main = f.open();
    let a = main.named("a").unwrap().to_async();
    let b = main.named("b").unwrap().to_async();
    current_thread().block_on(async {
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.dequeue_timeout(Duration::from_secs(3600)).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        for _ in 0..5 {
            b.enqueue(b"for b", plain()).await.unwrap();
            main.to_async().enqueue(b"for main", plain()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "woken into another queue's job");
        let mine = a.enqueue(b"for a", plain()).await.unwrap().id();
        let lease = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("woken by its own queue's job")
            .unwrap()
            .unwrap()
            .expect("a job");
        assert_eq!((lease.id(), lease.payload()), (mine, &b"for a"[..]));
        lease.ack().await.unwrap();
    });
    assert_eq!(b.blocking().stats().unwrap().ready, 5);
    assert_eq!(main.stats().unwrap().ready, 5);
    assert_eq!(a.blocking().stats().unwrap().total, 0);
    assert_nothing_charged(b.blocking());
    assert_nothing_charged(&main);
    assert_consistent(&main);
}

/// One `StopSignal` watched by async waiters on several queues of two files: one `stop`
/// wakes them all with `None`, and no job was taken.
#[test]
fn one_stop_wakes_async_waiters_on_several_queues_and_files() {
    let (f1, f2) = (Fixture::new(), Fixture::new());
    let (q1, q2) = (f1.open(), f2.open());
    let queues: Vec<AsyncQueue> = vec![
        q1.to_async(),
        q1.named("x").unwrap().to_async(),
        q2.to_async(),
        q2.named("y").unwrap().to_async(),
    ];
    // A delayed job in each, so the waits have a due time to look at too.
    for q in &queues {
        q.blocking()
            .enqueue(
                b"later",
                EnqueueOptions::default().delay(Duration::from_secs(3600)),
            )
            .unwrap();
    }
    let stop = StopSignal::new();
    current_thread().block_on(async {
        let waiters: Vec<_> = queues
            .iter()
            .flat_map(|q| {
                (0..3).map(|_| {
                    let (q, stop) = (q.clone(), stop.clone());
                    tokio::spawn(
                        async move { q.dequeue_until(Duration::from_secs(3600), &stop).await },
                    )
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        stop.stop();
        for w in waiters {
            let got = tokio::time::timeout(Duration::from_secs(20), w)
                .await
                .expect("woken by the stop");
            assert!(matches!(got, Ok(Ok(None))), "{got:?}");
        }
    });
    for q in &queues {
        let s = q.blocking().stats().unwrap();
        assert_eq!((s.scheduled, s.leased, s.ready), (1, 0, 0), "{s:?}");
    }
    assert_consistent(&q1);
    assert_consistent(&q2);
}

/// The wakers of dropped waits are let go of: thousands of waiting dequeues (an hour each)
/// polled once with a counting waker then dropped leave no copy of the waker anywhere (the
/// queue's signal, the timer), so a loop of `select!`s cannot grow memory.
#[test]
fn dropped_waits_leave_no_waker_behind() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let (counter, waker) = counting_waker();
    for round in 0..2000 {
        let mut fut = Box::pin(q.dequeue_timeout(Duration::from_secs(3600)));
        assert!(poll_once(fut.as_mut(), &waker).is_none(), "round {round}");
        drop(fut);
    }
    // A few waits also polled again with another waker (a task moved between threads).
    let (other, other_waker) = counting_waker();
    for _ in 0..100 {
        let mut fut = Box::pin(q.dequeue_timeout(Duration::from_secs(3600)));
        assert!(poll_once(fut.as_mut(), &waker).is_none());
        assert!(poll_once(fut.as_mut(), &other_waker).is_none());
        drop(fut);
    }
    drop((waker, other_waker));
    assert!(
        eventually(|| Arc::strong_count(&counter) == 1 && Arc::strong_count(&other) == 1),
        "wakers kept after their waits were dropped: {} and {} copies",
        Arc::strong_count(&counter) - 1,
        Arc::strong_count(&other) - 1
    );
    // Nothing was woken for nothing, and the queue still wakes a real waiter.
    current_thread().block_on(async {
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.dequeue_timeout(Duration::from_secs(3600)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.enqueue(b"w", plain()).await.unwrap();
        let lease = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("woken")
            .unwrap()
            .unwrap()
            .expect("the job");
        lease.ack().await.unwrap();
    });
    assert_eq!(q.blocking().stats().unwrap().total, 0);
    assert_consistent(q.blocking());
}

/// A waker registered by a pending wait is woken by an enqueue on its queue, and only once;
/// an enqueue on another queue of the file does not wake it.
#[test]
fn a_registered_waker_is_woken_by_its_own_queue_only() {
    let f = Fixture::new();
    let main = f.open();
    let other = main.named("other").unwrap();
    let q = main.to_async();
    let (counter, waker) = counting_waker();
    let mut fut = Box::pin(q.dequeue_timeout(Duration::from_secs(3600)));
    assert!(poll_once(fut.as_mut(), &waker).is_none());
    other.enqueue(b"elsewhere", plain()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        counter.wakes.load(Ordering::SeqCst),
        0,
        "woken by another queue"
    );
    main.enqueue(b"here", plain()).unwrap();
    assert!(eventually(|| counter.wakes.load(Ordering::SeqCst) >= 1));
    // Polled now, it takes the job (the commit on a helper), then answers.
    let lease = current_thread().block_on(async {
        tokio::time::timeout(Duration::from_secs(20), fut)
            .await
            .expect("answers")
            .unwrap()
            .expect("the job")
    });
    assert_eq!(lease.payload(), b"here");
    assert_eq!(lease.attempt(), 1);
    lease.blocking().ack().unwrap(); // not on a runtime thread: blocking is fine
    assert_eq!(other.stats().unwrap().ready, 1);
    assert_consistent(&main);
}

/// `AsyncQueue::shutdown` while tasks wait (default and named queues), a worker pool runs
/// slow handlers that write and enqueue follow-ups, and a task holds a lease it acks only
/// after the shutdown began: everything ends within the grace, the file is released, a
/// reopen reports no repair and no lease, and every job is either done once (with its
/// follow-up) or still ready and uncharged.
#[test]
fn async_shutdown_racing_waiters_a_pool_and_a_held_lease() {
    for round in 0..8u64 {
        let f = Fixture::new();
        let queue = f.open();
        let side = queue.named("side").unwrap();
        let ids = enqueue_n(&queue, 30, plain());
        let done: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
        let pool = {
            let (done, follow) = (Arc::clone(&done), side.clone());
            WorkerPool::builder(&queue)
                .threads(2)
                .start(move |lease| {
                    std::thread::sleep(Duration::from_millis(lease.id().0 % 3));
                    follow.enqueue(&lease.id().0.to_le_bytes(), plain())?;
                    *done.lock().unwrap().entry(lease.id().0).or_default() += 1;
                    Ok(())
                })
                .unwrap()
        };
        drop(side);
        let q = queue.to_async();
        drop(queue);
        let rt = multi_thread();
        let report = rt.block_on(async {
            let held = q.dequeue().await.unwrap();
            let waiters: Vec<_> = (0..4)
                .map(|i| {
                    let q = if i % 2 == 0 {
                        q.clone()
                    } else {
                        q.blocking().named("side").unwrap().to_async()
                    };
                    let done = Arc::clone(&done);
                    tokio::spawn(async move {
                        loop {
                            match q.next().await {
                                Ok(lease) => {
                                    if q.blocking().name().is_none() {
                                        *done.lock().unwrap().entry(lease.id().0).or_default() += 1;
                                    }
                                    // A side job (a follow-up) is simply consumed.
                                    lease.ack().await.unwrap();
                                }
                                Err(Error::Closed) => return,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    })
                })
                .collect();
            let finisher = {
                let (q, done) = (q.clone(), Arc::clone(&done));
                tokio::spawn(async move {
                    while !q.blocking().is_closed() {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    // During the grace: deliveries refused, enqueues and lease calls work.
                    assert!(matches!(q.dequeue().await, Err(Error::Closed)));
                    let late = q.enqueue(b"late", plain()).await.unwrap().id();
                    if let Some(lease) = held {
                        *done.lock().unwrap().entry(lease.id().0).or_default() += 1;
                        lease.ack().await.unwrap();
                    }
                    late
                })
            };
            tokio::time::sleep(Duration::from_millis(round % 5)).await;
            let report = q.shutdown(Duration::from_secs(15)).await;
            for w in waiters {
                w.await.unwrap();
            }
            (report, finisher.await.unwrap())
        });
        let (report, late) = report;
        assert!(report.released, "round {round}: {report:?}");
        assert_eq!(report.handles_left, 0);
        let ps = pool.stats();
        assert_eq!((ps.errors, ps.in_flight), (0, 0), "round {round}: {ps:?}");
        drop(pool);
        let again = f.open();
        let r = again.recovery();
        assert!(
            !r.repaired && r.leases_returned == 0,
            "round {round}: {r:?}"
        );
        let done = done.lock().unwrap();
        for (id, n) in done.iter() {
            assert_eq!(*n, 1, "round {round}: job {id} done {n} times");
            assert!(again.job(JobId(*id)).unwrap().is_none(), "done, so acked");
        }
        for id in &ids {
            if !done.contains_key(&id.0) {
                let j = again.job(*id).unwrap().expect("not done, so waiting");
                assert_eq!((j.state, j.attempts), (JobState::Ready, 0), "{j:?}");
            }
        }
        let j = again.job(late).unwrap().expect("the enqueue in the grace");
        assert_eq!(j.state, JobState::Ready);
        assert_nothing_charged(&again);
        assert_consistent(&again);
    }
}

/// An `AsyncLease` kept past a shutdown's grace keeps the file open, is counted in
/// `handles_left`, can still be acked after the shutdown returned, and its drop then closes
/// the file: a reopen succeeds and finds the job gone.
#[test]
fn an_async_lease_acked_after_the_shutdown_returned() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let ids = enqueue_n(q.blocking(), 2, plain());
    let rt = current_thread();
    let (lease, report) = rt.block_on(async {
        let lease = q.dequeue().await.unwrap().expect("a job");
        let report = q.shutdown(Duration::from_millis(50)).await;
        (lease, report)
    });
    assert!(!report.released, "{report:?}");
    assert_eq!(report.handles_left, 1, "the lease: {report:?}");
    assert!(matches!(
        leaseq::Builder::default().open(&f.path),
        Err(Error::AlreadyOpen { .. })
    ));
    rt.block_on(async {
        lease.ack().await.unwrap();
        // The ended lease fences itself, even with the file closed.
        assert!(matches!(lease.ack().await, Err(Error::LeaseLost { .. })));
    });
    drop(lease);
    let again = f.open();
    assert!(!again.recovery().repaired);
    assert_eq!(again.recovery().leases_returned, 0);
    assert!(again.job(ids[0]).unwrap().is_none(), "acked");
    let j = again.job(ids[1]).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Ready, 0));
    assert_consistent(&again);
}

/// Two clones shut the file down at once, from async code: both return within the grace
/// and a little; the file is released (a reopen succeeds and reports no repair); the reports
/// agree with that (one says released; no report says more handles were left than there
/// were); no job is lost.
#[test]
fn two_async_shutdowns_from_clones() {
    let f = Fixture::new();
    for round in 0..10 {
        let q = f.open_non_durable().to_async();
        let before = q.blocking().stats().unwrap().ready;
        enqueue_n(q.blocking(), 5, plain());
        let (a, b) = (q.clone(), q);
        let (ra, rb) = current_thread().block_on(async {
            let grace = Duration::from_millis(100);
            tokio::join!(a.shutdown(grace), b.shutdown(grace))
        });
        assert!(
            ra.handles_left <= 1 && rb.handles_left <= 1,
            "round {round}: {ra:?} {rb:?}"
        );
        let again = f.open();
        assert!(!again.recovery().repaired, "round {round}");
        assert_eq!(again.stats().unwrap().ready, before + 5, "round {round}");
        assert!(
            ra.released || rb.released,
            "round {round}: the file was released but neither report says so: {ra:?} {rb:?}"
        );
        assert_consistent(&again);
    }
}

/// Forty tasks loop on `next()` on a multi-thread runtime through bursts of batch
/// enqueues: every job is taken once, at attempt 1; a shutdown from a clone ends every loop
/// with `Closed`, and reports the handle the test still holds.
#[test]
fn many_next_waiters_on_a_multi_thread_runtime_take_each_job_once() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let taken = Arc::new(AtomicU64::new(0));
    let seen: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let report = multi_thread().block_on(async {
        let waiters: Vec<_> = (0..40)
            .map(|_| {
                let (q, taken, seen) = (q.clone(), Arc::clone(&taken), Arc::clone(&seen));
                tokio::spawn(async move {
                    while let Ok(lease) = q.next().await {
                        assert_eq!(lease.attempt(), 1);
                        *seen.lock().unwrap().entry(lease.id().0).or_default() += 1;
                        lease.ack().await.unwrap();
                        taken.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for chunk in 0..10 {
            let jobs = (0..20).map(|i| (vec![chunk, i], plain())).collect();
            q.enqueue_batch(jobs).await.unwrap();
            tokio::task::yield_now().await;
        }
        let t = Instant::now();
        while taken.load(Ordering::SeqCst) < 200 && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let report = q.clone().shutdown(Duration::from_secs(10)).await;
        for w in waiters {
            w.await.unwrap();
        }
        report
    });
    assert_eq!(taken.load(Ordering::SeqCst), 200);
    assert!(seen.lock().unwrap().values().all(|n| *n == 1));
    // `q` itself is still held here.
    assert!(!report.released);
    assert_eq!(report.handles_left, 1, "{report:?}");
    assert_eq!(q.blocking().stats().unwrap().total, 0);
    assert_consistent(q.blocking());
}

/// A lease taken for a dequeue future is given back after the file was shut down with no
/// grace (the future dropped only then): the give-back still commits (a lease call, not a
/// delivery), the file closes when the last handle goes, and the reopen finds the job
/// ready and uncharged, with no lease to return.
#[test]
fn a_give_back_after_the_shutdown_closed_the_file() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let ids = enqueue_n(q.blocking(), 2, plain());
    let (_c, waker) = counting_waker();
    let kept = q.clone();
    let mut fut = Box::pin(kept.dequeue());
    let held = hold_commits(q.blocking());
    assert!(poll_once(fut.as_mut(), &waker).is_none());
    drop(held);
    assert!(eventually(|| q.blocking().stats().unwrap().leased == 1));
    let report = current_thread().block_on(q.shutdown(Duration::ZERO));
    assert!(!report.released, "{report:?}");
    assert!(kept.blocking().is_closed());
    drop(fut);
    assert!(
        eventually(|| kept.blocking().stats().unwrap().leased == 0),
        "given back though the file is closed"
    );
    assert_nothing_charged(kept.blocking());
    drop(kept);
    // The give-back's helper lets go of its handle just after its commit.
    let again = f.reopen_when_released();
    let r = again.recovery();
    assert!(!r.repaired && r.leases_returned == 0, "{r:?}");
    for id in ids {
        let j = again.job(id).unwrap().unwrap();
        assert_eq!((j.state, j.attempts), (JobState::Ready, 0), "{j:?}");
    }
    assert_consistent(&again);
}

/// A task waiting while the only job is leased to a dequeue future that is then dropped is
/// woken by the give-back and gets the job, at attempt 1.
#[test]
fn a_waiter_gets_the_job_a_dropped_future_gave_back() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let id = q.blocking().enqueue(b"only", plain()).unwrap().id();
    let fut = a_dequeue_that_took_the_lease(&q);
    current_thread().block_on(async {
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.dequeue_timeout(Duration::from_secs(3600)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the job is leased");
        drop(fut);
        let lease = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("woken by the give-back")
            .unwrap()
            .unwrap()
            .expect("the job");
        assert_eq!((lease.id(), lease.attempt()), (id, 1));
        lease.ack().await.unwrap();
    });
    assert_eq!(q.blocking().stats().unwrap().total, 0);
    assert_consistent(q.blocking());
}

/// From inside a `write` or `ack_with` closure, an async call would wait for a helper that
/// waits for the closure's transaction: refused with `Reentrant` at once, as the blocking
/// calls are, and the file goes on (found by review: it deadlocked every writer).
#[test]
fn an_async_call_from_inside_a_transaction_is_reentrant_not_a_deadlock() {
    let f = Fixture::new();
    let q = f.open();
    let aq = q.to_async();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let (q, aq) = (q.clone(), aq.clone());
        std::thread::spawn(move || {
            let inner = q.write(move |_| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                Ok(rt.block_on(aq.enqueue(b"inner", plain())).map(|_| ()))
            });
            tx.send(inner).unwrap();
        })
    };
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("answered, not deadlocked");
    worker.join().unwrap();
    assert!(matches!(got, Ok(Err(Error::Reentrant))), "{got:?}");
    // The file goes on.
    q.enqueue(b"after", plain()).unwrap();
    assert_eq!(q.stats().unwrap().ready, 1);
}
