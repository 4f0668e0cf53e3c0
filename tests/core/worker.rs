//! The worker pool (`WorkerPool`): heartbeats that keep long handlers leased, panics caught,
//! graceful shutdown that loses no job (C38), late heartbeats refused (C39), exactly-once
//! effects from many workers, and no polling while idle.
//!
//! Timing tests use real time scaled down (leases of 300 ms, heartbeats every 100 ms), with
//! margins of several heartbeats either way.

use crate::common::{assert_consistent, ms};
use leaseq::redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use leaseq::{
    BoxError, EnqueueOptions, Error, JobId, JobState, Outcome, Queue, RetryPolicy, StopSignal,
    WorkerPool,
};
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const EFFECTS: TableDefinition<&str, u64> = TableDefinition::new("effects");

const DONE: TableDefinition<u64, u64> = TableDefinition::new("done");

struct Q {
    _dir: tempfile::TempDir,
    queue: Queue,
}

/// A queue on a temp file with the wall clock (heartbeats are real time), a lease of
/// `lease`, and retries at once.
/// What a slow test handler has done: started, and returned.
#[derive(Clone, Default)]
struct Phases {
    running: Arc<AtomicBool>,
    returned: Arc<AtomicBool>,
}

impl Phases {
    /// A plain handler that marks itself running, sleeps `d`, then marks itself returned.
    fn sleeping(
        &self,
        d: Duration,
    ) -> impl Fn(&leaseq::Lease) -> Result<(), BoxError> + Send + Sync + 'static {
        let p = self.clone();
        move |_| {
            p.running.store(true, Ordering::SeqCst);
            std::thread::sleep(d);
            p.returned.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    fn wait_running(&self) {
        wait_for("the handler running", || {
            self.running.load(Ordering::SeqCst)
        });
    }

    fn returned(&self) -> bool {
        self.returned.load(Ordering::SeqCst)
    }

    fn wait_returned(&self) {
        wait_for("the handler returned", || self.returned());
    }
}

fn queue(lease: Duration) -> Q {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::builder()
        .lease(lease)
        .retry(RetryPolicy::immediate())
        .open(dir.path().join("q.leaseq"))
        .unwrap();
    Q { _dir: dir, queue }
}

/// Waits for `cond`; panics with `what` if it does not hold within 120 s. The bound only
/// catches a hang: a slow board or an emulator (qemu-user, wine) waits as long as it needs.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(ms(5));
    }
}

/// Every job id left in the queue, taken and acked.
fn drain(q: &Queue) -> Vec<JobId> {
    let mut ids = Vec::new();
    while let Some(lease) = q.dequeue().unwrap() {
        ids.push(lease.id());
        lease.ack().unwrap();
    }
    ids
}

/// A second consumer polling `dequeue()` every 20 ms until told to stop; every job it gets
/// is recorded with the time and attempt, and acked.
struct Poller {
    stop: Arc<AtomicBool>,
    got: Arc<Mutex<Vec<(JobId, u32, Instant)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Poller {
    fn start(q: &Queue) -> Poller {
        let (stop, got) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let thread = {
            let (q, stop, got) = (q.clone(), stop.clone(), got.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(lease) = q.dequeue().unwrap() {
                        got.lock()
                            .unwrap()
                            .push((lease.id(), lease.attempt(), Instant::now()));
                        lease.ack().unwrap();
                    }
                    std::thread::sleep(ms(20));
                }
            })
        };
        Poller { stop, got, thread }
    }

    fn finish(self) -> Vec<(JobId, u32, Instant)> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        Arc::try_unwrap(self.got).unwrap().into_inner().unwrap()
    }
}

#[test]
fn shutdown_with_jobs_in_flight_loses_none() {
    let q = queue(Duration::from_secs(30));
    let total = 300u64;
    let ids: BTreeSet<JobId> = (0..total)
        .map(|n| {
            q.queue
                .enqueue(&n.to_le_bytes(), EnqueueOptions::default())
                .unwrap()
                .id()
        })
        .collect();
    // An effect handler: its row exists iff the job was acked. It sleeps inside the commit,
    // so the workers queue up behind each other and some are waiting when the stop comes.
    let pool = WorkerPool::builder(&q.queue)
        .threads(4)
        .start_effects(|tx, lease| {
            std::thread::sleep(ms(2));
            tx.open_table(DONE)?.insert(lease.id().0, 1)?;
            Ok(())
        })
        .unwrap();
    wait_for("some jobs done", || q.queue.len().unwrap() < total - 20);
    let report = pool.shutdown(Duration::ZERO);
    assert_eq!(q.queue.stats().unwrap().leased, 0, "{report:?}");
    let stats = report.stats;
    assert!(stats.acked > 0, "{report:?}");
    assert_eq!(stats.lost, 0, "{report:?}");
    // Every job is acked (its row) or back in the queue, never both, never neither.
    let done: BTreeSet<JobId> = {
        let r = q.queue.database().begin_read().unwrap();
        let t = r.open_table(DONE).unwrap();
        t.iter()
            .unwrap()
            .map(|e| JobId(e.unwrap().0.value()))
            .collect()
    };
    assert_eq!(done.len() as u64, stats.acked);
    let left = drain(&q.queue);
    let left_set: BTreeSet<JobId> = left.iter().copied().collect();
    assert_eq!(
        left.len(),
        left_set.len(),
        "a job delivered twice from the drain"
    );
    assert!(done.is_disjoint(&left_set));
    assert_eq!(&done | &left_set, ids, "{report:?}");
    assert_consistent(&q.queue);
}

#[test]
fn shutdown_of_a_plain_pool_with_a_zero_grace_gives_every_running_job_back() {
    // The default retry policy (1 s and up): a give-back is ready at once all the same.
    let dir = tempfile::tempdir().unwrap();
    let q = Q {
        queue: Queue::open(dir.path().join("q.leaseq")).unwrap(),
        _dir: dir,
    };
    let total = 40u64;
    for n in 0..total {
        q.queue
            .enqueue(&n.to_le_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    // The handlers run until the test lets them go (not for a set time: under an emulator
    // the shutdown itself can take longer than any sleep chosen here).
    let started = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let release = Arc::new(AtomicBool::new(false));
    let pool = {
        let (started, finished, release) = (started.clone(), finished.clone(), release.clone());
        WorkerPool::builder(&q.queue)
            .threads(4)
            .start(move |_| {
                started.fetch_add(1, Ordering::SeqCst);
                let until = Instant::now() + Duration::from_secs(60);
                while !release.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(ms(5));
                }
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap()
    };
    wait_for("four handlers running", || {
        started.load(Ordering::SeqCst) >= 4
    });
    let report = pool.shutdown(Duration::ZERO);
    // The four running handlers are still running: all four given back at once, ready.
    assert_eq!(report.given_back, 4, "{report:?}");
    assert_eq!(report.still_running, 4, "{report:?}");
    assert_eq!(finished.load(Ordering::SeqCst), 0, "{report:?}");
    let stats = q.queue.stats().unwrap();
    assert_eq!(stats.leased, 0);
    assert_eq!(
        stats.ready, total,
        "given back ready at once, not after their lease"
    );
    // Their handlers finish later: their worker does not ack a job given back.
    release.store(true, Ordering::SeqCst);
    wait_for("the four handlers finished", || {
        finished.load(Ordering::SeqCst) >= 4
    });
    // A late ack would follow the handler's return: give it the time it would take.
    std::thread::sleep(ms(200));
    assert_eq!(q.queue.stats().unwrap().ready, total);
    let attempts: Vec<u32> = q
        .queue
        .jobs(JobState::Ready, None, 100)
        .unwrap()
        .jobs
        .iter()
        .map(|j| j.attempts)
        .collect();
    assert_eq!(
        attempts.iter().filter(|&&a| a == 1).count(),
        4,
        "attempt counted"
    );
    assert_eq!(drain(&q.queue).len() as u64, total);
    assert_consistent(&q.queue);
}

#[test]
fn a_handler_that_panics_every_time_ends_dead_with_the_panic_message() {
    let q = queue(Duration::from_secs(30));
    let bad = q
        .queue
        .enqueue(b"bad", EnqueueOptions::default().max_attempts(3))
        .unwrap()
        .id();
    let pool = WorkerPool::builder(&q.queue)
        .threads(2)
        .start(|lease| {
            if lease.payload() == b"bad" {
                panic!("boom at attempt {}", lease.attempt());
            }
            Ok(())
        })
        .unwrap();
    wait_for("the job dead", || {
        q.queue
            .job(bad)
            .unwrap()
            .is_some_and(|j| j.state == JobState::Dead)
    });
    let job = q.queue.job(bad).unwrap().unwrap();
    assert_eq!(job.attempts, 3);
    assert_eq!(job.last_error.as_deref(), Some("panic: boom at attempt 3"));
    // The workers live on: a good job is still handled.
    let good = q
        .queue
        .enqueue(b"good", EnqueueOptions::default())
        .unwrap()
        .id();
    wait_for("the good job acked", || {
        q.queue.job(good).unwrap().is_none()
    });
    // A worker counts an outcome after the commit that ends its job: wait for the counts.
    wait_for("the pool's counts", || {
        let s = pool.stats();
        s.acked == 1 && s.dead == 1
    });
    let stats = pool.stats();
    assert_eq!(
        (stats.panics, stats.retried, stats.dead),
        (3, 3, 1),
        "{stats:?}"
    );
    assert_eq!(stats.acked, 1);
    pool.shutdown(Duration::from_secs(5));
    assert_consistent(&q.queue);
}

#[test]
fn an_effect_handler_that_panics_gives_the_job_back_with_the_panic_message() {
    let q = queue(Duration::from_secs(30));
    let bad = q
        .queue
        .enqueue(b"bad", EnqueueOptions::default().max_attempts(2))
        .unwrap()
        .id();
    let pool = WorkerPool::builder(&q.queue)
        .threads(2)
        .start_effects(|tx, lease| {
            tx.open_table(EFFECTS)?.insert("written", 1)?;
            if lease.payload() == b"bad" {
                panic!("effect boom");
            }
            Ok(())
        })
        .unwrap();
    wait_for("the job dead", || {
        q.queue
            .job(bad)
            .unwrap()
            .is_some_and(|j| j.state == JobState::Dead)
    });
    let job = q.queue.job(bad).unwrap().unwrap();
    assert_eq!(job.last_error.as_deref(), Some("panic: effect boom"));
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!(
        (stats.panics, stats.retried, stats.acked),
        (2, 2, 0),
        "{stats:?}"
    );
    // Nothing of the panicking effect committed.
    let r = q.queue.database().begin_read().unwrap();
    assert!(
        r.open_table(EFFECTS).is_err(),
        "the table was never created"
    );
    assert_consistent(&q.queue);
}

#[test]
fn a_handler_error_is_retried_through_the_policy_with_its_text() {
    let q = queue(Duration::from_secs(30));
    let id = q
        .queue
        .enqueue(b"x", EnqueueOptions::default().max_attempts(2))
        .unwrap()
        .id();
    let pool = WorkerPool::builder(&q.queue)
        .threads(1)
        .start(|lease| Err(format!("no luck on attempt {}", lease.attempt()).into()))
        .unwrap();
    wait_for("the job dead", || {
        q.queue
            .job(id)
            .unwrap()
            .is_some_and(|j| j.state == JobState::Dead)
    });
    let job = q.queue.job(id).unwrap().unwrap();
    assert_eq!(job.last_error.as_deref(), Some("no luck on attempt 2"));
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!((stats.retried, stats.dead, stats.panics), (2, 1, 0));
}

#[test]
fn outcomes_snooze_fail_and_retry_after() {
    let q = queue(Duration::from_secs(30));
    let snooze = q.queue.enqueue(b"snooze", Default::default()).unwrap().id();
    let fail = q.queue.enqueue(b"fail", Default::default()).unwrap().id();
    let later = q.queue.enqueue(b"later", Default::default()).unwrap().id();
    let too_long = q
        .queue
        .enqueue(b"too long", Default::default())
        .unwrap()
        .id();
    let pool = WorkerPool::builder(&q.queue)
        .threads(2)
        .start(|lease| -> Result<(), BoxError> {
            match lease.payload() {
                b"snooze" => Err(Outcome::Snooze(Duration::from_secs(3600)).into()),
                b"fail" => Err(Outcome::Fail("cannot be done".into()).into()),
                b"later" => Err(Outcome::Retry {
                    after: Duration::from_secs(3600),
                    reason: "upstream busy".into(),
                }
                .into()),
                _ => Err(Outcome::Snooze(leaseq::DELAY_MAX + Duration::from_secs(1)).into()),
            }
        })
        .unwrap();
    // One snapshot: two `stats()` reads could see "none leased" before a job was taken and
    // "none ready" after (seen under qemu-arm).
    wait_for("every job ended", || {
        let stats = q.queue.stats().unwrap();
        stats.leased == 0 && stats.ready == 0
    });
    let s = q.queue.job(snooze).unwrap().unwrap();
    assert_eq!(s.state, JobState::Scheduled);
    assert_eq!(
        (s.attempts, s.snoozes),
        (0, 1),
        "a snooze does not charge the attempt"
    );
    let f = q.queue.job(fail).unwrap().unwrap();
    assert_eq!(f.state, JobState::Dead);
    assert_eq!(f.last_error.as_deref(), Some("cannot be done"));
    let l = q.queue.job(later).unwrap().unwrap();
    assert_eq!((l.state, l.attempts), (JobState::Scheduled, 1));
    assert_eq!(l.last_error.as_deref(), Some("upstream busy"));
    // A refused directive is a retry (ready at once with this queue's policy), not a wait
    // for the lease to end.
    wait_for("the refused snooze retried", || {
        q.queue.job(too_long).unwrap().unwrap().attempts >= 2
    });
    let t = q.queue.job(too_long).unwrap().unwrap();
    assert!(
        t.last_error
            .as_deref()
            .unwrap()
            .starts_with("refused outcome: "),
        "{t:?}"
    );
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!((stats.snoozed, stats.failed), (1, 1), "{stats:?}");
    assert!(stats.retried >= 3, "{stats:?}");
}

#[test]
fn a_slow_handler_keeps_its_lease_by_heartbeat_and_is_delivered_once() {
    let q = queue(ms(300));
    let id = q.queue.enqueue(b"slow", Default::default()).unwrap().id();
    let runs = Arc::new(AtomicU64::new(0));
    let pool = {
        let runs = runs.clone();
        WorkerPool::builder(&q.queue)
            .threads(1)
            .start(move |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(ms(1500));
                Ok(())
            })
            .unwrap()
    };
    // The second consumer starts once the pool holds the job.
    wait_for("the handler running", || runs.load(Ordering::SeqCst) == 1);
    let poller = Poller::start(&q.queue);
    wait_for("the job acked", || q.queue.job(id).unwrap().is_none());
    let got = poller.finish();
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert!(got.is_empty(), "the second consumer got {got:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!((stats.acked, stats.lost), (1, 0), "{stats:?}");
    // At most one beat under way as the ack landed (refused, C39).
    assert!(stats.heartbeats_lost <= 1, "{stats:?}");
    // 1.5 s at one heartbeat per 100 ms (a third of the 300 ms lease): at most 16, never
    // faster; at least 4, or the 300 ms lease would have run out between two of them (a
    // loaded machine delays beats, so the count between is not asserted).
    assert!((4..=16).contains(&stats.heartbeats), "{stats:?}");
    assert_consistent(&q.queue);
}

#[test]
fn a_heartbeat_racing_the_ack_never_brings_the_lease_back() {
    let q = queue(Duration::from_secs(30));
    for i in 0..200 {
        let id = q.queue.enqueue(b"x", Default::default()).unwrap().id();
        let lease = q.queue.dequeue().unwrap().unwrap();
        let beat = lease.heartbeat();
        let barrier = Arc::new(Barrier::new(2));
        let heart = {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                // Spread the extends around the ack: some before, some after.
                (0..3)
                    .map(|_| beat.extend(Duration::from_secs(30)))
                    .collect::<Vec<_>>()
            })
        };
        barrier.wait();
        if i % 2 == 0 {
            std::thread::yield_now();
        }
        lease.ack().unwrap();
        let beats = heart.join().unwrap();
        // Once one extend found the ack, none after it succeeds.
        let first_lost = beats
            .iter()
            .position(|r| matches!(r, Err(Error::LeaseLost { .. })));
        if let Some(p) = first_lost {
            assert!(
                beats[p..]
                    .iter()
                    .all(|r| matches!(r, Err(Error::LeaseLost { .. }))),
                "{beats:?}"
            );
        }
        assert!(
            beats
                .iter()
                .all(|r| matches!(r, Ok(_) | Err(Error::LeaseLost { .. })))
        );
        assert_eq!(q.queue.job(id).unwrap(), None, "iteration {i}");
        let s = q.queue.stats().unwrap();
        assert_eq!((s.leased, s.total), (0, 0), "iteration {i}");
    }
    assert_consistent(&q.queue);
}

#[test]
fn n_workers_deliver_each_effect_once() {
    let q = queue(Duration::from_secs(30));
    let (keys, dups) = (2_000usize, 400usize);
    // Every key once, then `dups` jobs that repeat a key: each key's effect applies once.
    let opts: Vec<(Vec<u8>, EnqueueOptions)> = (0..keys)
        .chain((0..dups).map(|d| d * 5))
        .map(|k| {
            let key = format!("key-{k}");
            (
                key.clone().into_bytes(),
                EnqueueOptions::default().idempotency_key(key),
            )
        })
        .collect();
    for chunk in opts.chunks(1000) {
        q.queue
            .enqueue_batch(chunk.iter().map(|(p, o)| (&p[..], o.clone())))
            .unwrap();
    }
    let t = Instant::now();
    let pool = WorkerPool::builder(&q.queue)
        .threads(4)
        .start_effects(|tx, lease| {
            let key = std::str::from_utf8(lease.payload())?;
            let mut t = tx.open_table(EFFECTS)?;
            let seen = t.get(key)?.map_or(0, |v| v.value());
            t.insert(key, seen + 1)?;
            Ok(())
        })
        .unwrap();
    wait_for("the queue drained", || q.queue.is_empty().unwrap());
    let elapsed = t.elapsed();
    let report = pool.shutdown(Duration::from_secs(5));
    let total = (keys + dups) as u64;
    eprintln!(
        "pool: 4 workers, {total} effect jobs in {elapsed:?}: {:.0} jobs/s; {} commits",
        total as f64 / elapsed.as_secs_f64(),
        q.queue.commit_stats().commits
    );
    let stats = report.stats;
    assert_eq!(stats.acked, total, "{stats:?}");
    assert_eq!(stats.already_applied, dups as u64, "{stats:?}");
    assert_eq!(
        (stats.retried, stats.lost, stats.errors),
        (0, 0, 0),
        "{stats:?}"
    );
    let r = q.queue.database().begin_read().unwrap();
    let t = r.open_table(EFFECTS).unwrap();
    assert_eq!(t.len().unwrap(), keys as u64);
    for e in t.iter().unwrap() {
        let (k, v) = e.unwrap();
        assert_eq!(v.value(), 1, "{} applied {} times", k.value(), v.value());
    }
    assert_consistent(&q.queue);
}

/// C38 with a grace longer than the handler: heartbeats go on until it returns, the ack
/// succeeds, and a second consumer never gets the job.
#[test]
fn c38_a_long_grace_lets_the_handler_finish_under_heartbeats() {
    let q = queue(ms(1000));
    let id = q.queue.enqueue(b"long", Default::default()).unwrap().id();
    let running = Arc::new(AtomicBool::new(false));
    let pool = {
        let running = running.clone();
        WorkerPool::builder(&q.queue)
            .threads(1)
            .heartbeat_every(ms(300))
            .start(move |_| {
                running.store(true, Ordering::SeqCst);
                std::thread::sleep(ms(3000));
                Ok(())
            })
            .unwrap()
    };
    wait_for("the handler running", || running.load(Ordering::SeqCst));
    let poller = Poller::start(&q.queue);
    std::thread::sleep(ms(50));
    let report = pool.shutdown(ms(4000));
    let got = poller.finish();
    assert!(got.is_empty(), "the second consumer got {got:?}");
    assert_eq!((report.finished, report.given_back), (1, 0), "{report:?}");
    assert_eq!(report.still_running, 0);
    assert_eq!(report.stats.acked, 1);
    // At least 2 beats, or the 1 s lease would have run out under the 3 s handler.
    assert!(report.stats.heartbeats >= 2, "{report:?}");
    assert!(
        report.elapsed < ms(4000),
        "ended when the handler returned: {report:?}"
    );
    assert_eq!(q.queue.job(id).unwrap(), None);
    assert_consistent(&q.queue);
}

/// C38 with a grace shorter than the handler: heartbeats keep the job leased until the
/// grace ends, then it is given back (attempt counted) and delivered again at once.
#[test]
fn c38_a_short_grace_gives_the_job_back_after_heartbeats_to_the_end() {
    let q = queue(ms(1000));
    let id = q.queue.enqueue(b"long", Default::default()).unwrap().id();
    let phases = Phases::default();
    let pool = WorkerPool::builder(&q.queue)
        .threads(1)
        .heartbeat_every(ms(300))
        .start(phases.sleeping(ms(3000)))
        .unwrap();
    phases.wait_running();
    let poller = Poller::start(&q.queue);
    // Past the 1 s lease: only heartbeats keep the job from the second consumer.
    std::thread::sleep(ms(1300));
    let shutdown_at = Instant::now();
    let report = pool.shutdown(ms(600));
    assert_eq!((report.given_back, report.finished), (1, 0), "{report:?}");
    assert_eq!(report.still_running, 1);
    assert!(!phases.returned(), "the handler still runs");
    phases.wait_returned();
    std::thread::sleep(ms(100));
    let got = poller.finish();
    // The second consumer got it once, after the give-back, as attempt 2.
    assert_eq!(got.len(), 1, "{got:?}");
    let (got_id, attempt, at) = got[0];
    assert_eq!((got_id, attempt), (id, 2));
    assert!(
        at >= shutdown_at + ms(600),
        "delivered again before the grace ended"
    );
    // At least 2 beats before the grace ended (1.9 s under a 1 s lease).
    assert!(report.stats.heartbeats >= 2, "{report:?}");
    assert_eq!(report.stats.acked, 0);
    assert_eq!(
        q.queue.job(id).unwrap(),
        None,
        "acked by the second consumer"
    );
    assert_consistent(&q.queue);
}

/// C39: a heartbeat after the job's ack is refused and writes nothing.
#[test]
fn c39_a_late_heartbeat_is_refused_and_writes_nothing() {
    let q = queue(Duration::from_secs(30));
    let id = q.queue.enqueue(b"x", Default::default()).unwrap().id();
    let lease = q.queue.dequeue().unwrap().unwrap();
    let beat = lease.heartbeat();
    beat.extend(Duration::from_secs(30)).unwrap();
    lease.ack().unwrap();
    let before = q.queue.stats().unwrap();
    for _ in 0..3 {
        assert!(matches!(
            beat.extend(Duration::from_secs(30)),
            Err(Error::LeaseLost { job_id, .. }) if job_id == id
        ));
    }
    assert_eq!(q.queue.job(id).unwrap(), None);
    assert_eq!(q.queue.stats().unwrap(), before);
    assert_eq!(before.leased + before.total, 0);
    let leased = q.queue.jobs(JobState::Leased, None, 10).unwrap();
    assert!(leased.jobs.is_empty());
    assert_consistent(&q.queue);
}

/// C39 in the pool: jobs shorter than the heartbeat end between two beats or right at one;
/// no lease ever comes back and nothing stays leased.
#[test]
fn c39_pool_heartbeats_around_fast_jobs_leave_no_lease() {
    let q = queue(ms(100));
    for _ in 0..200 {
        q.queue.enqueue(b"x", Default::default()).unwrap();
    }
    let pool = WorkerPool::builder(&q.queue)
        .threads(4)
        .heartbeat_every(ms(1))
        .start(|_| {
            std::thread::sleep(ms(3));
            Ok(())
        })
        .unwrap();
    wait_for("the queue drained", || q.queue.is_empty().unwrap());
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!(stats.acked, 200, "{stats:?}");
    assert!(stats.heartbeats > 0, "{stats:?}");
    let s = q.queue.stats().unwrap();
    assert_eq!((s.total, s.leased), (0, 0));
    assert_consistent(&q.queue);
}

#[test]
fn an_idle_pool_does_not_poll() {
    let q = queue(Duration::from_secs(30));
    let pool = WorkerPool::builder(&q.queue)
        .threads(4)
        .start(|_| Ok(()))
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let stats = pool.stats();
    eprintln!("idle: {} polls in 1 s with 4 threads", stats.polls);
    // One blocked dequeue per thread (idle timeout 5 s), woken by nothing.
    assert!(stats.polls <= 8, "{stats:?}");
    assert_eq!(stats.heartbeats, 0);
    // New work wakes a blocked worker at once.
    let t = Instant::now();
    let id = q.queue.enqueue(b"x", Default::default()).unwrap().id();
    wait_for("the job acked", || q.queue.job(id).unwrap().is_none());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // And the stop wakes every idle worker at once.
    let report = pool.shutdown(Duration::from_secs(10));
    assert!(report.elapsed < Duration::from_secs(2), "{report:?}");
    assert!(report.stats.polls <= 12, "{report:?}");
}

#[test]
fn dropping_the_pool_shuts_it_down() {
    let q = queue(Duration::from_secs(30));
    let id = q.queue.enqueue(b"slow", Default::default()).unwrap().id();
    let phases = Phases::default();
    let pool = WorkerPool::builder(&q.queue)
        .threads(2)
        .drop_grace(ms(100))
        .start(phases.sleeping(ms(600)))
        .unwrap();
    phases.wait_running();
    let t = Instant::now();
    drop(pool);
    assert!(
        t.elapsed() < ms(550),
        "the drop waited out the handler: {:?}",
        t.elapsed()
    );
    // The running job was given back at once, attempt counted.
    let job = q.queue.job(id).unwrap().unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Ready, 1));
    phases.wait_returned();
    std::thread::sleep(ms(50));
    // Its late ack changed nothing; the pool took no new job.
    let job = q.queue.job(id).unwrap().unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Ready, 1));
    assert_eq!(drain(&q.queue), vec![id]);
    assert_consistent(&q.queue);
}

#[test]
fn a_pool_on_a_named_queue_takes_only_its_jobs() {
    let q = queue(Duration::from_secs(30));
    let mail = q.queue.named("mail").unwrap();
    let other = q
        .queue
        .enqueue(b"default", Default::default())
        .unwrap()
        .id();
    for _ in 0..20 {
        mail.enqueue(b"mail", Default::default()).unwrap();
    }
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let pool = {
        let seen = seen.clone();
        WorkerPool::builder(&mail)
            .threads(2)
            .start(move |lease| {
                seen.lock().unwrap().insert(lease.payload().to_vec());
                Ok(())
            })
            .unwrap()
    };
    wait_for("the named queue drained", || mail.is_empty().unwrap());
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!(stats.acked, 20);
    assert_eq!(*seen.lock().unwrap(), HashSet::from([b"mail".to_vec()]));
    assert_eq!(q.queue.job(other).unwrap().unwrap().state, JobState::Ready);
}

#[test]
fn a_handler_can_watch_the_pools_stop_signal() {
    let q = queue(Duration::from_secs(30));
    let id = q.queue.enqueue(b"long", Default::default()).unwrap().id();
    let stop = StopSignal::new();
    let running = Arc::new(AtomicBool::new(false));
    let pool = {
        let (stop, running) = (stop.clone(), running.clone());
        WorkerPool::builder(&q.queue)
            .threads(1)
            .stop_signal(stop.clone())
            .start(move |_| {
                running.store(true, Ordering::SeqCst);
                while !stop.is_stopped() {
                    std::thread::sleep(ms(5));
                }
                Err(Outcome::Snooze(Duration::ZERO).into())
            })
            .unwrap()
    };
    wait_for("the handler running", || running.load(Ordering::SeqCst));
    let report = pool.shutdown(Duration::from_secs(10));
    assert_eq!((report.finished, report.given_back), (1, 0), "{report:?}");
    assert!(report.elapsed < Duration::from_secs(2));
    let job = q.queue.job(id).unwrap().unwrap();
    assert_eq!(
        (job.state, job.attempts, job.snoozes),
        (JobState::Ready, 0, 1)
    );
}

#[test]
fn settings_out_of_range_are_refused() {
    let q = queue(Duration::from_secs(30));
    let refused = |b: leaseq::PoolBuilder, field: &str| match b.start(|_| Ok(())) {
        Err(Error::InvalidOption { field: f, .. }) => assert_eq!(f, field),
        other => panic!("{field}: {other:?}"),
    };
    let b = || WorkerPool::builder(&q.queue);
    refused(b().threads(0), "threads");
    refused(b().threads(leaseq::WORKER_THREADS_MAX + 1), "threads");
    refused(b().heartbeat_every(Duration::ZERO), "heartbeat_every");
    refused(
        b().heartbeat_extend(leaseq::LEASE_MAX + ms(1)),
        "heartbeat_extend",
    );
    refused(
        b().heartbeat_every(ms(500)).heartbeat_extend(ms(500)),
        "heartbeat_every",
    );
    refused(b().idle_timeout(Duration::ZERO), "idle_timeout");
    refused(
        b().idle_timeout(leaseq::IDLE_TIMEOUT_MAX + ms(1)),
        "idle_timeout",
    );
    refused(b().thread_name("a\0b"), "thread_name");
    let pool = b()
        .threads(leaseq::WORKER_THREADS_MAX)
        .start(|_| Ok(()))
        .unwrap();
    assert_eq!(pool.threads(), leaseq::WORKER_THREADS_MAX);
    let report = pool.shutdown(Duration::from_secs(5));
    assert_eq!(report.still_running, 0);
}

#[test]
fn pool_types_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<WorkerPool>();
    send_sync::<leaseq::PoolBuilder>();
    send_sync::<leaseq::PoolStats>();
    send_sync::<leaseq::ShutdownReport>();
    send_sync::<Outcome>();
}

/// An effect handler runs inside its own commit: a shutdown cannot give its job back (the
/// give-back would wait for that very transaction), so the commit decides.
#[test]
fn an_effect_handler_inside_its_commit_is_never_given_back() {
    let q = queue(Duration::from_secs(30));
    let id = q.queue.enqueue(b"x", Default::default()).unwrap().id();
    let running = Arc::new(AtomicBool::new(false));
    let pool = {
        let running = running.clone();
        WorkerPool::builder(&q.queue)
            .threads(2)
            .start_effects(move |tx, lease| {
                running.store(true, Ordering::SeqCst);
                std::thread::sleep(ms(300));
                tx.open_table(DONE)?.insert(lease.id().0, 1)?;
                Ok(())
            })
            .unwrap()
    };
    wait_for("the handler running", || running.load(Ordering::SeqCst));
    let report = pool.shutdown(Duration::ZERO);
    assert_eq!((report.finished, report.given_back), (1, 0), "{report:?}");
    assert_eq!(report.still_running, 0);
    assert_eq!(q.queue.job(id).unwrap(), None);
    let r = q.queue.database().begin_read().unwrap();
    assert_eq!(r.open_table(DONE).unwrap().len().unwrap(), 1);
}

/// A job whose own lease is shorter than the configured heartbeat interval is still kept:
/// the interval is at most half the extend.
#[test]
fn a_short_job_lease_is_kept_even_with_a_long_heartbeat_interval() {
    let q = queue(Duration::from_secs(30));
    let id = q
        .queue
        .enqueue(b"x", EnqueueOptions::default().lease(ms(300)))
        .unwrap()
        .id();
    let running = Arc::new(AtomicBool::new(false));
    let pool = {
        let running = running.clone();
        WorkerPool::builder(&q.queue)
            .threads(1)
            .heartbeat_every(Duration::from_secs(10))
            .start(move |_| {
                running.store(true, Ordering::SeqCst);
                std::thread::sleep(ms(1000));
                Ok(())
            })
            .unwrap()
    };
    wait_for("the handler running", || running.load(Ordering::SeqCst));
    let poller = Poller::start(&q.queue);
    wait_for("the job acked", || q.queue.job(id).unwrap().is_none());
    let got = poller.finish();
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert!(got.is_empty(), "the second consumer got {got:?}");
    assert_eq!((stats.acked, stats.lost), (1, 0));
    assert!(stats.heartbeats >= 4, "every 150 ms: {stats:?}");
}

/// A job taken as the stop came (here: by the ack-and-next of the commit in which the stop
/// was signalled) is given back before its handler runs, its attempt not charged.
#[test]
fn a_job_taken_as_the_stop_comes_goes_back_unstarted() {
    let q = queue(Duration::from_secs(30));
    let first = q.queue.enqueue(b"first", Default::default()).unwrap().id();
    let second = q.queue.enqueue(b"second", Default::default()).unwrap().id();
    let stop = StopSignal::new();
    let pool = {
        let stop = stop.clone();
        WorkerPool::builder(&q.queue)
            .threads(1)
            .stop_signal(stop.clone())
            .start_effects(move |tx, lease| {
                tx.open_table(DONE)?.insert(lease.id().0, 1)?;
                stop.stop(); // inside the ack-and-next commit, which takes `second`
                Ok(())
            })
            .unwrap()
    };
    wait_for("the worker gone", || pool.stats().unstarted == 1);
    assert_eq!(q.queue.job(first).unwrap(), None);
    let job = q.queue.job(second).unwrap().unwrap();
    assert_eq!(
        (job.state, job.attempts, job.snoozes),
        (JobState::Ready, 0, 1)
    );
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!(
        (stats.jobs, stats.acked, stats.unstarted),
        (1, 1, 1),
        "{stats:?}"
    );
}

/// An effect handler's `Outcome` is honoured by `ack_with`: a snooze leaves the attempt
/// uncharged, a fail dead-letters at once, a retry waits its own backoff; none of the
/// handler's writes commit.
#[test]
fn effect_handlers_outcomes_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::builder()
        .retry(RetryPolicy::fixed(Duration::from_secs(3600)))
        .open(dir.path().join("q.leaseq"))
        .unwrap();
    const WRITES: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("writes");
    let snooze = q
        .enqueue(b"snooze", EnqueueOptions::default().max_attempts(1))
        .unwrap()
        .id();
    let fail = q.enqueue(b"fail", EnqueueOptions::default()).unwrap().id();
    let later = q.enqueue(b"later", EnqueueOptions::default()).unwrap().id();
    let pool = WorkerPool::builder(&q)
        .threads(1)
        .start_effects(|tx, lease| {
            tx.open_table(WRITES)?.insert(lease.id().0, 1)?;
            match lease.payload() {
                b"snooze" => Err(Outcome::Snooze(Duration::from_secs(600)).into()),
                b"fail" => Err(Outcome::Fail("cannot be done".into()).into()),
                _ => Err(Outcome::Retry {
                    after: Duration::from_secs(60),
                    reason: "upstream busy".into(),
                }
                .into()),
            }
        })
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pool.stats().jobs < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = pool.shutdown(Duration::from_secs(5));
    assert_eq!(
        (
            report.stats.snoozed,
            report.stats.failed,
            report.stats.retried
        ),
        (1, 1, 1),
        "{report:?}"
    );
    let s = q.job(snooze).unwrap().unwrap();
    assert_eq!(
        (s.state, s.attempts, s.snoozes),
        (JobState::Scheduled, 0, 1)
    );
    let f = q.job(fail).unwrap().unwrap();
    assert_eq!(f.state, JobState::Dead);
    assert_eq!(f.last_error.as_deref(), Some("cannot be done"));
    let l = q.job(later).unwrap().unwrap();
    assert_eq!((l.state, l.attempts), (JobState::Scheduled, 1));
    assert_eq!(l.last_error.as_deref(), Some("upstream busy"));
    assert!(
        l.run_at_ms < s.run_at_ms,
        "its own 60 s, not the policy's hour"
    );
    let rtx = q.database().begin_read().unwrap();
    assert!(
        rtx.open_table(WRITES).is_err(),
        "no write of a failed handler committed"
    );
}

/// A handler past the pool's job timeout: the heartbeat thread ends its delivery (given back
/// through the retry policy with "timed out after N ms"), the handler sees the flag and its
/// deadline, its outcome does not count; out of attempts the job is dead.
#[test]
fn a_job_past_its_timeout_is_given_back_and_its_handler_told() {
    let q = queue(Duration::from_secs(30));
    let id = q
        .queue
        .enqueue(b"slow", EnqueueOptions::default().max_attempts(2))
        .unwrap()
        .id();
    let saw = Arc::new(Mutex::new(Vec::new()));
    let pool = {
        let saw = Arc::clone(&saw);
        WorkerPool::builder(&q.queue)
            .threads(1)
            .job_timeout(ms(150))
            .start(move |lease| {
                let started = Instant::now();
                let deadline = leaseq::worker::job_deadline().expect("a deadline");
                assert!(deadline > started && deadline <= started + ms(150));
                while !leaseq::worker::is_timed_out() {
                    assert!(started.elapsed() < Duration::from_secs(60), "never told");
                    std::thread::sleep(ms(5));
                }
                // Told at or after the deadline (measured from the delivery, a moment
                // before this handler started: under emulation that moment is seen).
                let on_time = Instant::now() >= deadline;
                saw.lock().unwrap().push((lease.attempt(), on_time));
                Ok(())
            })
            .unwrap()
    };
    wait_for("two timed-out attempts", || saw.lock().unwrap().len() == 2);
    wait_for("the job dead", || {
        q.queue.job(id).unwrap().unwrap().state == JobState::Dead
    });
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!(stats.timed_out, 2, "{stats:?}");
    // As PoolStats documents: timeouts count in timed_out alone.
    assert_eq!((stats.retried, stats.dead), (0, 0), "{stats:?}");
    assert_eq!(
        stats.acked, 0,
        "a timed-out handler's Ok is not an ack: {stats:?}"
    );
    let saw = saw.lock().unwrap().clone();
    assert_eq!(saw.iter().map(|(a, _)| *a).collect::<Vec<_>>(), vec![1, 2]);
    assert!(
        saw.iter().all(|(_, on_time)| *on_time),
        "told early: {saw:?}"
    );
    let job = q.queue.job(id).unwrap().unwrap();
    assert_eq!(job.attempts, 2);
    assert!(
        job.errors
            .iter()
            .all(|e| e.message == "timed out after 150 ms"),
        "{:?}",
        job.errors
    );
    assert!(!leaseq::worker::is_timed_out(), "only on a worker's thread");
    assert_eq!(leaseq::worker::job_deadline(), None);
    assert_consistent(&q.queue);
}

/// With `OnTimeout::Fail` the job is dead at once; a handler that ignores its timeout and
/// returns late has its outcome fenced: the job stays dead, nothing else is written.
#[test]
fn on_timeout_fail_dead_letters_and_a_late_return_is_fenced() {
    let q = queue(Duration::from_secs(30));
    let id = q
        .queue
        .enqueue(b"stuck", EnqueueOptions::default().max_attempts(5))
        .unwrap()
        .id();
    let phases = Phases::default();
    let pool = WorkerPool::builder(&q.queue)
        .threads(1)
        .job_timeout(ms(100))
        .on_timeout(leaseq::worker::OnTimeout::Fail)
        .start(phases.sleeping(ms(400)))
        .unwrap();
    wait_for("the job dead", || {
        q.queue.job(id).unwrap().unwrap().state == JobState::Dead
    });
    assert!(!phases.returned(), "dead while its handler still runs");
    phases.wait_returned();
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    let job = q.queue.job(id).unwrap().unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Dead, 1));
    assert_eq!(job.last_error.as_deref(), Some("timed out after 100 ms"));
    assert_eq!(
        (stats.timed_out, stats.acked, stats.jobs),
        (1, 0, 1),
        "{stats:?}"
    );
    assert_eq!(
        (stats.retried, stats.dead),
        (0, 0),
        "timed_out alone: {stats:?}"
    );
    assert_consistent(&q.queue);
}

/// A job that finishes in time is acked as usual, and the timeout's bound is checked.
#[test]
fn a_job_within_its_timeout_is_acked_and_bad_timeouts_are_refused() {
    let q = queue(Duration::from_secs(30));
    let id = q.queue.enqueue(b"quick", Default::default()).unwrap().id();
    let pool = WorkerPool::builder(&q.queue)
        .threads(1)
        .job_timeout(Duration::from_secs(30))
        .start(|_| Ok(()))
        .unwrap();
    wait_for("the job acked", || q.queue.job(id).unwrap().is_none());
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!((stats.acked, stats.timed_out), (1, 0), "{stats:?}");
    for bad in [Duration::ZERO, leaseq::LEASE_MAX + ms(1)] {
        match WorkerPool::builder(&q.queue)
            .job_timeout(bad)
            .start(|_| Ok(()))
        {
            Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "job_timeout"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

/// A job's own execution timeout (`EnqueueOptions::timeout`, River's `Timeout()` per job) in
/// a pool without a `job_timeout`: the pool still times it, ends the delivery past it (given
/// back, the attempt counted, "timed out after N ms"), the handler reads it from its lease and
/// is told; out of attempts the job is dead.
#[test]
fn own_timeout_ends_a_job_in_a_pool_without_one() {
    let q = queue(Duration::from_secs(30));
    let id = q
        .queue
        .enqueue(
            b"slow",
            EnqueueOptions::default().max_attempts(2).timeout(ms(120)),
        )
        .unwrap()
        .id();
    assert_eq!(q.queue.job(id).unwrap().unwrap().timeout_ms, Some(120));
    let saw = Arc::new(Mutex::new(Vec::new()));
    let pool = {
        let saw = Arc::clone(&saw);
        WorkerPool::builder(&q.queue)
            .threads(1)
            .start(move |lease| {
                let started = Instant::now();
                let deadline = leaseq::worker::job_deadline().expect("the job's deadline");
                assert!(deadline > started && deadline <= started + ms(120));
                while !leaseq::worker::is_timed_out() {
                    assert!(started.elapsed() < Duration::from_secs(60), "never told");
                    std::thread::sleep(ms(5));
                }
                saw.lock()
                    .unwrap()
                    .push((lease.attempt(), lease.timeout_ms()));
                Ok(())
            })
            .unwrap()
    };
    wait_for("two timed-out attempts", || saw.lock().unwrap().len() == 2);
    wait_for("the job dead", || {
        q.queue.job(id).unwrap().unwrap().state == JobState::Dead
    });
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!((stats.timed_out, stats.acked), (2, 0), "{stats:?}");
    assert_eq!(
        *saw.lock().unwrap(),
        vec![(1, Some(120)), (2, Some(120))],
        "redelivered once, the timeout read from each lease"
    );
    let job = q.queue.job(id).unwrap().unwrap();
    assert_eq!((job.attempts, job.timeout_ms), (2, Some(120)));
    let errors: Vec<_> = job
        .errors
        .iter()
        .map(|e| (e.attempt, e.message.as_str()))
        .collect();
    assert_eq!(
        errors,
        vec![(1, "timed out after 120 ms"), (2, "timed out after 120 ms")]
    );
    assert_consistent(&q.queue);
}

/// A job's own timeout wins over the pool's either way: a longer one is not ended at the
/// pool's (acked), a shorter one ends it sooner (its own in the error); a job without one
/// is timed by the pool's. `OnTimeout` is the pool's.
#[test]
fn own_timeout_wins_over_the_pools_and_a_job_without_uses_the_pools() {
    let q = queue(Duration::from_secs(30));
    let enqueue = |payload: &[u8], opts: EnqueueOptions| {
        q.queue.enqueue(payload, opts.max_attempts(1)).unwrap().id()
    };
    let longer = enqueue(b"longer", EnqueueOptions::default().timeout(ms(60_000)));
    let none = enqueue(b"none", EnqueueOptions::default());
    let shorter = enqueue(b"shorter", EnqueueOptions::default().timeout(ms(20)));
    let deadlines = Arc::new(Mutex::new(Vec::new()));
    let pool = {
        let deadlines = Arc::clone(&deadlines);
        WorkerPool::builder(&q.queue)
            .threads(1)
            .job_timeout(ms(100))
            .on_timeout(leaseq::worker::OnTimeout::Fail)
            .start(move |lease| {
                let started = Instant::now();
                let left = leaseq::worker::job_deadline()
                    .expect("a deadline")
                    .saturating_duration_since(started);
                deadlines
                    .lock()
                    .unwrap()
                    .push((lease.payload().to_vec(), left));
                // Past the pool's timeout (and the shorter one), far within the longer one.
                std::thread::sleep(ms(400));
                Ok(())
            })
            .unwrap()
    };
    wait_for("every job ended", || {
        let st = |id| q.queue.job(id).unwrap().map(|j| j.state);
        st(longer).is_none()
            && st(none) == Some(JobState::Dead)
            && st(shorter) == Some(JobState::Dead)
    });
    let stats = pool.shutdown(Duration::from_secs(5)).stats;
    assert_eq!((stats.acked, stats.timed_out), (1, 2), "{stats:?}");
    let error = |id| q.queue.job(id).unwrap().unwrap().last_error;
    assert_eq!(error(none).as_deref(), Some("timed out after 100 ms"));
    assert_eq!(error(shorter).as_deref(), Some("timed out after 20 ms"));
    // Each handler saw its own deadline: the longer job's far past the pool's.
    for (payload, left) in deadlines.lock().unwrap().iter() {
        let bound = match payload.as_slice() {
            b"longer" => ms(60_000),
            b"none" => ms(100),
            _ => ms(20),
        };
        assert!(*left <= bound, "{payload:?}: {left:?}");
        if payload.as_slice() == b"longer" {
            assert!(*left > ms(30_000), "the pool's deadline: {left:?}");
        }
    }
    assert_eq!(deadlines.lock().unwrap().len(), 3);
    assert_consistent(&q.queue);
}

/// A timeout outside 1 ms to `LEASE_MAX` (whole ms: 500 µs is 0) is refused at enqueue with
/// `InvalidOption` naming "timeout", and nothing is written; the bounds themselves are
/// kept, read back from the job and its lease. A schedule refuses one (it keeps none).
#[test]
fn own_timeout_out_of_range_is_refused_at_enqueue() {
    let q = queue(Duration::from_secs(30));
    for bad in [
        Duration::ZERO,
        Duration::from_micros(500),
        leaseq::LEASE_MAX + ms(1),
    ] {
        match q
            .queue
            .enqueue(b"x", EnqueueOptions::default().timeout(bad))
        {
            Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "timeout", "{bad:?}"),
            other => panic!("{bad:?}: {other:?}"),
        }
        let batch = q.queue.enqueue_batch([
            (&b"ok"[..], EnqueueOptions::default()),
            (&b"x"[..], EnqueueOptions::default().timeout(bad)),
        ]);
        assert!(
            matches!(
                batch,
                Err(Error::InvalidOption {
                    field: "timeout",
                    ..
                })
            ),
            "{bad:?}: {batch:?}"
        );
    }
    assert_eq!(q.queue.stats().unwrap().total, 0, "nothing written");
    let max_ms = leaseq::LEASE_MAX.as_millis() as u64;
    for (good, want) in [(ms(1), 1), (leaseq::LEASE_MAX, max_ms)] {
        let id = q
            .queue
            .enqueue(b"ok", EnqueueOptions::default().timeout(good))
            .unwrap()
            .id();
        assert_eq!(q.queue.job(id).unwrap().unwrap().timeout_ms, Some(want));
        let lease = q.queue.dequeue().unwrap().expect("the job");
        assert_eq!((lease.id(), lease.timeout_ms()), (id, Some(want)));
        lease.ack().unwrap();
    }
    q.queue
        .enqueue(b"plain", EnqueueOptions::default())
        .unwrap();
    let lease = q.queue.dequeue().unwrap().expect("the job");
    assert_eq!(lease.timeout_ms(), None);
    lease.ack().unwrap();
    let schedule = leaseq::Schedule::every(Duration::from_secs(60))
        .options(EnqueueOptions::default().timeout(ms(100)));
    match q.queue.create_schedule("s", &schedule) {
        Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "timeout"),
        other => panic!("{other:?}"),
    }
    assert!(q.queue.schedules().unwrap().is_empty());
    assert_consistent(&q.queue);
}
