//! `AsyncQueue` and `AsyncLease`: each test checks the queue's state afterwards (stats, the
//! jobs' attempts, `check()`), not only the answers.

use crate::common::{Fixture, assert_consistent, keyed, ms, plain};
use leaseq::{AsyncQueue, EnqueueOptions, Error, JobState, Queue, StopSignal};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A queue on the system clock (due times and timeouts in real time).
fn real_clock(f: &Fixture) -> Queue {
    Queue::builder()
        .lease(Duration::from_secs(30))
        .retry(leaseq::RetryPolicy::immediate())
        .open(&f.path)
        .unwrap()
}

#[test]
fn enqueue_dequeue_and_every_ending_call() {
    let f = Fixture::new();
    let q = f.open().to_async();
    runtime().block_on(async {
        for n in 0..5u32 {
            q.enqueue_value(&n, plain()).await.unwrap();
        }
        let outcomes = ["ack", "nack", "fail", "snooze", "ack_with"];
        for what in outcomes {
            let lease = q.dequeue().await.unwrap().expect("a job");
            let n: u32 = lease.decode().unwrap();
            match what {
                "ack" => lease.ack().await.unwrap(),
                "nack" => assert_eq!(lease.nack("later").await.unwrap(), JobState::Ready),
                "fail" => lease.fail("bad").await.unwrap(),
                "snooze" => lease.snooze(Duration::from_secs(60)).await.unwrap(),
                _ => {
                    let applied = lease
                        .ack_with(move |tx| {
                            crate::common::bump(tx.transaction(), u64::from(n))?;
                            Ok(())
                        })
                        .await
                        .unwrap();
                    assert_eq!(applied, leaseq::Applied::Now);
                }
            }
            // Every ending call fenced the lease.
            assert!(matches!(lease.ack().await, Err(Error::LeaseLost { .. })));
        }
        let s = q.blocking().stats().unwrap();
        assert_eq!(
            (s.ready, s.dead, s.scheduled, s.leased),
            (1, 1, 1, 0),
            "{s:?}"
        );
        assert_eq!(crate::common::effects(q.blocking()).len(), 1);
        let id = q.enqueue(b"x", plain()).await.unwrap().id();
        assert_eq!(
            q.run(move |b| b.cancel(id, "gone")).await.unwrap().was(),
            Some(JobState::Ready)
        );
        let written = q
            .write(|tx| {
                tx.enqueue(b"from write", plain())?;
                Ok(7u8)
            })
            .await
            .unwrap();
        assert_eq!(written, 7);
    });
    assert_consistent(q.blocking());
}

/// Many tasks wait on one current-thread runtime: each is woken by the enqueue that gives
/// it work (no timeout reached: an hour), and every job is taken once.
/// Issue 42: `AsyncLease::started_ms` is the blocking lease's: when the delivery began, on
/// the queue's clock, the job's `leased_ms`.
#[test]
fn an_async_lease_says_when_its_delivery_began() {
    let f = Fixture::new();
    let q = f.open().to_async();
    runtime().block_on(async {
        let id = q.enqueue(b"x", plain()).await.unwrap().id();
        f.clock.advance(Duration::from_secs(2));
        let lease = q.dequeue().await.unwrap().expect("a job");
        assert_eq!(lease.started_ms(), f.clock_now());
        assert_eq!(lease.started_ms(), lease.blocking().started_ms());
        let info = q.blocking().job(id).unwrap().unwrap();
        assert_eq!(info.leased_ms, Some(lease.started_ms()));
        lease.ack().await.unwrap();
    });
    assert_consistent(q.blocking());
}

#[test]
fn waiting_consumers_are_woken_by_enqueues() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let rt = runtime();
    let taken = rt.block_on(async {
        let consumers: Vec<_> = (0..50)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move {
                    let lease = q
                        .dequeue_timeout(Duration::from_secs(3600))
                        .await
                        .unwrap()
                        .expect("woken with a job, not by the timeout");
                    lease.ack().await.unwrap();
                    lease.id()
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..50 {
            q.enqueue(b"work", plain()).await.unwrap();
        }
        let mut ids = HashSet::new();
        for c in consumers {
            assert!(ids.insert(c.await.unwrap()));
        }
        ids
    });
    assert_eq!(taken.len(), 50);
    assert_eq!(q.blocking().stats().unwrap().total, 0);
}

/// A delayed job reaches a consumer already waiting, at its due time (no commit wakes it).
#[test]
fn a_waiting_consumer_gets_a_delayed_job_when_it_comes_due() {
    let f = Fixture::new();
    let q = real_clock(&f).to_async();
    runtime().block_on(async {
        q.enqueue(
            b"later",
            EnqueueOptions::default().delay(Duration::from_millis(300)),
        )
        .await
        .unwrap();
        let t = std::time::Instant::now();
        let lease = q
            .dequeue_timeout(Duration::from_secs(30))
            .await
            .unwrap()
            .expect("the delayed job");
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "not before it was due"
        );
        lease.ack().await.unwrap();
    });
}

/// A manual clock advanced past a due time wakes a waiting task at once.
#[test]
fn a_manual_clock_jump_wakes_a_waiting_task() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let clock = f.clock.clone();
    runtime().block_on(async {
        q.enqueue(
            b"later",
            EnqueueOptions::default().delay(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.dequeue_timeout(Duration::from_secs(7200)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        clock.advance(Duration::from_secs(3601));
        let got = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("woken by the jump")
            .unwrap()
            .unwrap();
        got.expect("the job").ack().await.unwrap();
    });
}

/// `close` wakes every waiting task with `Closed`; a `StopSignal` wakes its own with `None`.
#[test]
fn close_and_stop_wake_waiting_tasks() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let stop = StopSignal::new();
    runtime().block_on(async {
        let stopped = {
            let (q, stop) = (q.clone(), stop.clone());
            tokio::spawn(async move { q.dequeue_until(Duration::from_secs(3600), &stop).await })
        };
        let closed = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.stop();
        let got = tokio::time::timeout(Duration::from_secs(20), stopped).await;
        assert!(matches!(got, Ok(Ok(Ok(None)))), "{got:?}");
        assert!(!closed.is_finished(), "a stop wakes only its own consumers");
        q.blocking().close();
        let got = tokio::time::timeout(Duration::from_secs(20), closed).await;
        assert!(matches!(got, Ok(Ok(Err(Error::Closed)))), "{got:?}");
    });
}

/// The cancel-safety promise: dequeue futures dropped at every point (a runtime's timeout
/// over a wait, over a commit under way, just after it answered) strand no job. After many
/// rounds racing producers, every job is either acked by a consumer that got its lease, or
/// ready with no attempt charged; none is leased.
#[test]
fn dropped_dequeues_strand_no_job_and_charge_no_attempt() {
    let f = Fixture::new();
    let q = real_clock(&f).to_async();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let enqueued = Arc::new(AtomicU64::new(0));
    let acked = rt.block_on(async {
        let producer = {
            let (q, enqueued) = (q.clone(), Arc::clone(&enqueued));
            tokio::spawn(async move {
                for _ in 0..400 {
                    q.enqueue(b"job", plain()).await.unwrap();
                    enqueued.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            })
        };
        let mut acked = 0u64;
        let mut round = 0u64;
        while !producer.is_finished() || round < 2000 {
            round += 1;
            // From 0 µs (dropped before its first poll finishes) to a few ms (mid-commit,
            // or after). Every 64th round is a dequeue that does not wait for a job, given
            // as long as it takes: some complete however slow the machine (an emulator
            // under load).
            let got = if round.is_multiple_of(64) {
                tokio::time::timeout(Duration::from_secs(10), q.dequeue()).await
            } else {
                let budget = Duration::from_micros((round * 37) % 3000);
                tokio::time::timeout(budget, q.dequeue_timeout(Duration::from_secs(5))).await
            };
            if let Ok(got) = got
                && let Some(lease) = got.unwrap()
            {
                lease.ack().await.unwrap();
                acked += 1;
            }
            if round > 100_000 {
                break;
            }
        }
        producer.await.unwrap();
        acked
    });
    // Give-backs run on helper threads: wait until none is left leased.
    let t = std::time::Instant::now();
    while q.blocking().stats().unwrap().leased > 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = q.blocking().stats().unwrap();
    if s.leased > 0 {
        let stranded = q.blocking().jobs(JobState::Leased, None, 10).unwrap();
        panic!(
            "a dropped dequeue stranded {} lease(s) for 20 s (now {:?}): {:?}",
            s.leased,
            std::time::SystemTime::now(),
            stranded.jobs
        );
    }
    assert_eq!(enqueued.load(Ordering::SeqCst), 400);
    assert_eq!(s.ready, 400 - acked, "{s:?}");
    let ready = q.blocking().jobs(JobState::Ready, None, 1000).unwrap();
    for j in &ready.jobs {
        assert_eq!(
            (j.attempts, j.snoozes),
            (0, 0),
            "charged by a dropped dequeue: {j:?}"
        );
    }
    assert!(acked > 0, "some dequeues completed");
    assert_consistent(q.blocking());
}

/// The future of a dequeue that already committed, dropped before it was polled again: the
/// lease goes back unseen, in its place (first again), uncharged.
#[test]
fn a_lease_taken_for_a_dropped_future_goes_back_in_its_place() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let ids = crate::common::enqueue_n(q.blocking(), 3, plain());
    let ready_ms = q.blocking().job(ids[0]).unwrap().unwrap().run_at_ms;
    // Taken later than it became ready: the delivery's start is not its ready time.
    f.clock.advance(std::time::Duration::from_secs(5));
    crate::support::take_and_drop_a_dequeue(&q);
    let back = q.blocking().job(ids[0]).unwrap().unwrap();
    assert_eq!(
        (back.state, back.run_at_ms, back.leased_ms),
        (leaseq::JobState::Ready, ready_ms, None),
        "ready since when it was, not since the delivery no one saw"
    );
    let first = q.blocking().dequeue().unwrap().unwrap();
    assert_eq!(first.id(), ids[0], "back in its place");
    assert_eq!(first.attempt(), 1, "the dropped delivery was not charged");
    assert_eq!(q.blocking().job(ids[0]).unwrap().unwrap().snoozes, 0);
    first.ack().unwrap();
    assert_consistent(q.blocking());
}

/// What an `AsyncLease` offers without `Deref` to `Lease`: the lease's data, read from
/// memory on the caller's thread (so at once even while every commit of the file is held),
/// equal to the blocking lease's; `set_result` kept for the ack; `extend` through a future,
/// seen by every clone; and the blocking lease one explicit step away, for a thread that may
/// block (its heartbeat here).
#[test]
fn an_async_lease_reads_memory_and_commits_through_futures() {
    let f = Fixture::new();
    let q = f.open().to_async();
    q.blocking()
        .set_history(leaseq::History::off().keep_jobs(10))
        .unwrap();
    let rt = runtime();
    let id = rt
        .block_on(q.enqueue_value(&"resize 12".to_string(), keyed("photo-12").max_attempts(4)))
        .unwrap()
        .id();
    let lease = rt.block_on(q.dequeue()).unwrap().expect("the job");
    let held = crate::support::hold_commits(q.blocking());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let lease = lease.clone();
        std::thread::spawn(move || {
            let task: String = lease.decode().unwrap();
            lease.set_result(b"resized").unwrap();
            tx.send((
                lease.id(),
                task,
                lease.payload().to_vec(),
                lease.encoding(),
                (lease.attempt(), lease.max_attempts(), lease.snoozes()),
                lease.idempotency_key().map(<[u8]>::to_vec),
                (lease.token(), lease.deadline_ms(), lease.lease_ms()),
            ))
            .unwrap();
        })
    };
    let (got_id, task, payload, encoding, counts, key, timing) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the reads did not wait for the held commit");
    drop(held);
    reader.join().unwrap();
    let b = lease.blocking();
    assert_eq!((got_id, task.as_str()), (id, "resize 12"));
    assert_eq!((payload.as_slice(), encoding), (b.payload(), b.encoding()));
    assert_eq!(counts, (1, 4, 0));
    assert_eq!(key.as_deref(), Some(&b"photo-12"[..]));
    assert_eq!(timing, (b.token(), b.deadline_ms(), b.lease_ms()));
    assert_eq!(timing.1, f.clock_now() + timing.2);
    rt.block_on(async {
        // A clone is the same delivery: its extend moves this value's deadline too.
        lease.clone().extend(Duration::from_secs(90)).await.unwrap();
        assert_eq!(lease.deadline_ms(), f.clock_now() + 90_000);
        // The escape hatch, where blocking is fine.
        let beat = {
            let lease = lease.clone();
            tokio::task::spawn_blocking(move || lease.blocking().heartbeat().extend(ms(5_000)))
        };
        assert_eq!(beat.await.unwrap().unwrap(), f.clock_now() + 5_000);
        lease.ack().await.unwrap();
    });
    let job = q.blocking().job(id).unwrap().expect("kept in the history");
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(
        job.result.as_deref(),
        Some(&b"resized"[..]),
        "set_result reached the ack"
    );
    assert_consistent(q.blocking());
}

/// The async `ack_and_next` and `ack_with_and_next`: the ack (and effect) and the next lease
/// in one commit on a helper; `None` once nothing is ready.
#[test]
fn ack_and_next_hands_the_next_lease_on() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let ids = crate::common::enqueue_n(q.blocking(), 3, plain());
    runtime().block_on(async {
        let first = q.dequeue().await.unwrap().expect("a job");
        let second = first.ack_and_next().await.unwrap().expect("the next job");
        assert_eq!((first.id(), second.id()), (ids[0], ids[1]));
        assert!(matches!(first.ack().await, Err(Error::LeaseLost { .. })));
        let (applied, third) = second
            .ack_with_and_next(|tx| {
                crate::common::bump(tx.transaction(), 7)?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(applied, leaseq::Applied::Now);
        let third = third.expect("the last job");
        assert_eq!(third.id(), ids[2]);
        assert!(third.ack_and_next().await.unwrap().is_none());
    });
    let s = q.blocking().stats().unwrap();
    assert_eq!((s.ready, s.leased), (0, 0), "{s:?}");
    assert_eq!(crate::common::effects(q.blocking()).get(&7), Some(&1));
    assert_consistent(q.blocking());
}

/// An `ack_and_next` future dropped after its commit: the ack stands, the next lease it took
/// goes back unseen, uncharged, as a dropped dequeue's.
#[test]
fn a_dropped_ack_and_next_gives_the_next_lease_back() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let ids = crate::common::enqueue_n(q.blocking(), 2, plain());
    let first = runtime().block_on(q.dequeue()).unwrap().expect("a job");
    drop_after_its_commit(&q, Box::pin(first.ack_and_next()));
    assert!(
        q.blocking().job(ids[0]).unwrap().is_none(),
        "the ack stands"
    );
    comes_back_uncharged(&q, ids[1]);
}

/// Polls `fut` (an ack that takes the next lease) once while commits are held, lets its
/// commit land (the first job acked, the next leased for the future), then drops it: the
/// next job must be ready again.
fn drop_after_its_commit<F: std::future::Future>(q: &AsyncQueue, mut fut: std::pin::Pin<Box<F>>) {
    use crate::support::{counting_waker, hold_commits, poll_once};
    let (_c, waker) = counting_waker();
    let held = hold_commits(q.blocking());
    assert!(poll_once(fut.as_mut(), &waker).is_none());
    drop(held);
    assert!(crate::common::eventually(|| {
        let s = q.blocking().stats().unwrap();
        (s.ready, s.leased) == (0, 1)
    }));
    drop(fut);
    assert!(crate::common::eventually(|| {
        q.blocking().stats().unwrap().ready == 1
    }));
}

/// The job given back, `id`, is delivered again with its attempt uncharged.
fn comes_back_uncharged(q: &AsyncQueue, id: leaseq::JobId) {
    let again = q.blocking().dequeue().unwrap().expect("back");
    assert_eq!((again.id(), again.attempt()), (id, 1), "uncharged");
    again.ack().unwrap();
    assert_consistent(q.blocking());
}

/// As `a_dropped_ack_and_next_gives_the_next_lease_back`, through `ack_with_and_next`, whose
/// answer also carries the effect: the effect and the ack stand (the caller's row written
/// once, the key applied), the next lease goes back unseen and uncharged.
#[test]
fn a_dropped_ack_with_and_next_keeps_the_effect_and_gives_the_next_lease_back() {
    const DONE: leaseq::redb::TableDefinition<u64, u64> =
        leaseq::redb::TableDefinition::new("done");
    let f = Fixture::new();
    let q = f.open().to_async();
    let first_id = q.blocking().enqueue(b"a", keyed("effect-a")).unwrap().id();
    let second_id = q.blocking().enqueue(b"b", plain()).unwrap().id();
    let first = runtime().block_on(q.dequeue()).unwrap().expect("a job");
    assert_eq!(first.id(), first_id);
    drop_after_its_commit(
        &q,
        Box::pin(first.ack_with_and_next(move |tx| {
            let mut done = tx.open_table(DONE)?;
            let n = leaseq::redb::ReadableTable::get(&done, first_id.0)?.map_or(0, |v| v.value());
            done.insert(first_id.0, n + 1)?;
            Ok(())
        })),
    );
    assert!(
        q.blocking().is_applied("effect-a").unwrap(),
        "the effect stands"
    );
    let rtx = leaseq::redb::ReadableDatabase::begin_read(q.blocking().database()).unwrap();
    let done = rtx.open_table(DONE).unwrap();
    assert_eq!(
        done.get(first_id.0).unwrap().map(|v| v.value()),
        Some(1),
        "once"
    );
    drop((done, rtx));
    comes_back_uncharged(&q, second_id);
}

/// `AsyncQueue::shutdown` from async code: waiting tasks end with `Closed`, their handles
/// go, and the file is released: a reopen succeeds at once and reports no repair.
#[test]
fn async_shutdown_releases_the_file() {
    let f = Fixture::new();
    for round in 0..10 {
        let q: AsyncQueue = f.open().to_async();
        assert!(!q.blocking().recovery().repaired, "round {round}");
        let rt = runtime();
        let report = rt.block_on(async {
            let consumers: Vec<_> = (0..4)
                .map(|_| {
                    let q = q.clone();
                    tokio::spawn(async move {
                        loop {
                            match q.next().await {
                                Ok(lease) => lease.ack().await.unwrap(),
                                Err(Error::Closed) => return,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    })
                })
                .collect();
            for _ in 0..20 {
                q.enqueue(b"w", plain()).await.unwrap();
            }
            let report = q.shutdown(Duration::from_secs(10)).await;
            for c in consumers {
                c.await.unwrap();
            }
            report
        });
        assert!(report.released, "round {round}: {report:?}");
        let again = f.open();
        assert!(!again.recovery().repaired && again.recovery().leases_returned == 0);
        drop(again);
    }
}

/// Change events as an async `Stream`: a task follows them without a thread (woken by each
/// commit that publishes), and the stream ends when the file is shut down.
#[test]
fn events_as_a_stream_follow_commits_and_end_with_the_file() {
    use futures_util::StreamExt;
    use leaseq::Event;
    let f = Fixture::new();
    let q = f.open().to_async();
    let rt = runtime();
    let (seen, report) = rt.block_on(async {
        let mut events = q.blocking().events().unwrap();
        let follower = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(e) = events.next().await {
                seen.push(e);
            }
            seen
        });
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(q.enqueue(b"x", plain()).await.unwrap().id());
            tokio::task::yield_now().await;
        }
        while let Some(lease) = q.dequeue().await.unwrap() {
            lease.ack().await.unwrap();
        }
        let report = q.shutdown(Duration::from_secs(10)).await;
        let seen = tokio::time::timeout(Duration::from_secs(20), follower)
            .await
            .expect("the stream ended with the file")
            .unwrap();
        (seen, (report, ids))
    });
    let (report, ids) = report;
    assert!(report.released, "{report:?}");
    let enqueued: Vec<_> = seen
        .iter()
        .filter_map(|e| match e {
            Event::Enqueued { id } => Some(*id),
            _ => None,
        })
        .collect();
    let completed = seen
        .iter()
        .filter(|e| matches!(e, Event::Completed { .. }))
        .count();
    assert_eq!(enqueued, ids);
    assert_eq!(completed, 20);
    assert_eq!(seen.last(), Some(&Event::Drained), "{seen:?}");
}

/// Producers waiting for room in a full queue whose limit blocks (`WhenFull::Block`) hold no
/// thread: more of them than the helper threads wait at once on a one-thread runtime while
/// the consumer's dequeue and acks still run, and each enqueue lands once room is made.
#[test]
fn producers_waiting_for_room_hold_no_thread() {
    let f = Fixture::new();
    let q = f.open();
    q.set_limit(Some(
        leaseq::QueueLimit::jobs(1).when_full(leaseq::WhenFull::block(Duration::from_secs(60))),
    ))
    .unwrap();
    q.enqueue(b"first", plain()).unwrap();
    let q = q.into_async();
    let waiting = leaseq::ASYNC_THREADS_MAX + 4;
    runtime().block_on(async {
        let producers: Vec<_> = (0..waiting)
            .map(|i| {
                let q = q.clone();
                tokio::spawn(async move { q.enqueue(format!("p{i}").as_bytes(), plain()).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            producers.iter().all(|p| !p.is_finished()),
            "all wait for room"
        );
        // The consumer drains; each ack makes room for one waiting producer.
        let mut taken = Vec::new();
        while taken.len() <= waiting {
            let lease = q
                .dequeue_timeout(Duration::from_secs(10))
                .await
                .unwrap()
                .expect("a producer's job once room was made");
            taken.push(lease.payload().to_vec());
            lease.ack().await.unwrap();
        }
        for p in producers {
            assert!(matches!(p.await.unwrap(), Ok(leaseq::Enqueued::New(_))));
        }
        let mut names: Vec<String> = taken
            .iter()
            .map(|p| String::from_utf8(p.clone()).unwrap())
            .collect();
        names.sort();
        let mut expected: Vec<String> = (0..waiting).map(|i| format!("p{i}")).collect();
        expected.push("first".to_string());
        expected.sort();
        assert_eq!(names, expected, "each producer's job once");
    });
    assert_consistent(q.blocking());
}
