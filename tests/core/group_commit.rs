//! Adversarial tests of the group commit (src/commit.rs): concurrent mixed workloads checked
//! against a model, two queues on the same threads, calls from inside `ack_with` closures,
//! crashes in the middle of shared groups. Public API only.
//!
//! A test that could hang (a deadlock is one of the failures looked for) runs its body on a
//! watchdog thread: if the body does not finish within a generous bound, the test fails with
//! "no progress" instead of hanging the suite. The bound only detects a hang; no test asserts
//! on speed.

use crate::common;
use crate::common::{Fixture, LEASE, assert_consistent, bump, effects};
use leaseq::{Applied, Durability, EnqueueOptions, Enqueued, Error, JobId, JobState, Lease, Queue};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs `f` on its own thread and returns its result; fails the test if it has not finished
/// after `secs` seconds (a deadlock: the stuck thread is left behind, parked).
fn watchdog<T: Send + 'static>(what: &str, secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("{what}: no progress after {secs} s (deadlock)"),
    }
}

/// Keeps the deliberate closure panics of the workloads out of the test output.
fn quiet_closure_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !msg.contains(DELIBERATE_PANIC) {
                default(info);
            }
        }));
    });
}

const DELIBERATE_PANIC: &str = "deliberate panic in an effect (first attempt)";

fn is_reentrant_effect(r: &Result<Applied, Error>) -> bool {
    matches!(r, Err(Error::Effect(e)) if e.downcast_ref::<Error>().is_some_and(|e| matches!(e, Error::Reentrant)))
}

/// Enqueues one job on `q`, leases it and acks it with `body` as the effect, under a watchdog;
/// asserts the ack failed with `Effect(Reentrant)` and returns the queue's length after it.
fn assert_refused_inside_closure(
    what: &'static str,
    q: Queue,
    body: impl FnMut(&leaseq::Tx<'_>) -> Result<(), leaseq::BoxError> + Send + 'static,
) -> u64 {
    let (refused, got, len) = watchdog(what, 8, move || {
        q.enqueue(b"A", EnqueueOptions::default()).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        let r = l.ack_with(body);
        (is_reentrant_effect(&r), format!("{r:?}"), q.len().unwrap())
    });
    assert!(refused, "{what}: expected Effect(Reentrant), got {got}");
    len
}

// ---------------------------------------------------------------------------------------
// Reentrancy: a call to the same queue from inside an `ack_with` closure must be refused
// with `Reentrant`, whatever else the closure did first.
// ---------------------------------------------------------------------------------------

// Regression (found in review, fixed): the "inside a group" marker was one cell per thread,
// cleared after every operation. A closure inside queue A's group that first called queue B
// (allowed: tests/core/effect.rs `flush_inside_an_effect_is_refused_and_another_queue_is_allowed`)
// cleared A's marker; its next call to A passed the reentrancy check and blocked forever on
// A's group mutex, which this same thread holds, and every other caller of A with it. The
// marker is now a stack of committer ids.
#[test]
fn reentrant_call_after_using_another_queue_is_refused_not_deadlocked() {
    let f = Fixture::new();
    let g = Fixture::new();
    let (a, b) = (f.open(), g.open());
    let a2 = a.clone();
    let len =
        assert_refused_inside_closure("A call after a B call inside A's closure", a, move |_| {
            b.enqueue(b"elsewhere", EnqueueOptions::default())?;
            a2.enqueue(b"same queue", EnqueueOptions::default())?;
            Ok(())
        });
    assert_eq!(len, 1, "the refused closure changed nothing");
}

// Nested deeper: A's closure acks a job of queue B with a closure of its own, which calls A.
// The call to A must be refused (B's closure fails, so B's ack fails, so A's closure fails),
// not block on A's group mutex held further up this thread's stack.
#[test]
fn reentrant_call_through_another_queues_closure_is_refused_not_deadlocked() {
    let f = Fixture::new();
    let g = Fixture::new();
    let a = f.open();
    let b = g.open();
    let r = watchdog(
        "A call inside B's closure inside A's closure",
        8,
        move || {
            a.enqueue(b"A", EnqueueOptions::default()).unwrap();
            b.enqueue(b"B", EnqueueOptions::default()).unwrap();
            let la = a.dequeue().unwrap().unwrap();
            let lb = b.dequeue().unwrap().unwrap();
            let a2 = a.clone();
            let inner = std::sync::Arc::new(std::sync::Mutex::new(None));
            let inner2 = inner.clone();
            let mut lb = Some(lb);
            let r = la.ack_with(move |_| {
                let Some(lb) = lb.take() else {
                    return Err("A's closure ran twice".into());
                };
                let rb = lb.ack_with(|_| {
                    a2.enqueue(b"same queue", EnqueueOptions::default())?;
                    Ok(())
                });
                let refused = is_reentrant_effect(&rb);
                *inner2.lock().unwrap() = Some(format!("{rb:?}"));
                rb?;
                assert!(refused);
                Ok(())
            });
            let inner = inner.lock().unwrap().clone().unwrap_or_default();
            (r.is_err(), inner, a.len().unwrap(), b.len().unwrap())
        },
    );
    assert!(r.0, "A's ack must fail with its closure");
    assert!(
        r.1.contains("Reentrant"),
        "B's closure must be refused: {}",
        r.1
    );
    assert_eq!((r.2, r.3), (1, 1), "nothing was acked or enqueued");
}

// Same hole, through `flush`: after a B call, `A.flush()` from A's closure passes the
// reentrancy check and waits for redb's write lock, held by A's open group on this thread.
#[test]
fn reentrant_flush_after_using_another_queue_is_refused_not_deadlocked() {
    let f = Fixture::new();
    let g = Fixture::new();
    let (a, b) = (f.open(), g.open());
    let a2 = a.clone();
    assert_refused_inside_closure(
        "A.flush() after a B call inside A's closure",
        a,
        move |_| {
            b.enqueue(b"elsewhere", EnqueueOptions::default())?;
            a2.flush()?;
            Ok(())
        },
    );
}

// Regression (found in review, fixed): `dequeue_timeout` did not check reentrancy. From
// inside an `ack_with` closure, with nothing available (the only job is the one being acked),
// it waited for a commit that cannot happen (this thread holds the group mutex) until its
// timeout, blocking every other caller meanwhile. (`dequeue` and `dequeue_batch` answered
// `Ok(None)` / `Ok([])` instead of `Reentrant` when the probe found nothing.)
#[test]
fn dequeue_timeout_inside_a_closure_is_refused_not_blocked() {
    let f = Fixture::new();
    let q = f.open();
    let inner = q.clone();
    assert_refused_inside_closure("dequeue_timeout inside a closure", q, move |_| {
        let got = inner.dequeue_timeout(Duration::from_secs(3600))?;
        assert!(got.is_none());
        Ok(())
    });
}

// Every mutating call from inside a closure is refused with `Reentrant` and the closure's
// writes are rolled back; the lease the refused calls tried to end or extend is unchanged.
// The failed closure gives its own job back, recording the refusal as its last error.
#[test]
fn every_mutating_call_inside_a_closure_is_refused() {
    let f = Fixture::new();
    let q = f.open();
    watchdog("mutating calls inside closures", 30, move || {
        let dead = q.enqueue(b"dead", EnqueueOptions::default()).unwrap().id();
        q.dequeue()
            .unwrap()
            .unwrap()
            .fail("to be requeued")
            .unwrap();
        for i in 0..12u8 {
            q.enqueue(&[i], EnqueueOptions::default()).unwrap();
        }
        // 3 stay ready, so the probe of a `dequeue` inside a closure sees work.
        let mut held: Vec<Lease> = q.dequeue_batch(9).unwrap();
        let victim = held.pop().unwrap();
        let (victim_id, victim_token, victim_deadline) =
            (victim.id(), victim.token(), victim.deadline_ms());
        let victim = Mutex::new(Some(victim));
        type Call<'a> = Box<dyn Fn(&Queue) -> Result<(), Error> + 'a>;
        let calls: Vec<(&str, Call)> = vec![
            (
                "enqueue",
                Box::new(|q| q.enqueue(b"x", EnqueueOptions::default()).map(drop)),
            ),
            (
                "enqueue_batch",
                Box::new(|q| {
                    q.enqueue_batch([(&b"x"[..], EnqueueOptions::default())])
                        .map(drop)
                }),
            ),
            ("dequeue", Box::new(|q| q.dequeue().map(drop))),
            ("dequeue_batch", Box::new(|q| q.dequeue_batch(2).map(drop))),
            ("requeue_dead", Box::new(|q| q.requeue_dead(dead))),
            ("remove", Box::new(|q| q.remove(dead))),
            ("flush", Box::new(|q| q.flush())),
            (
                "extend",
                Box::new(|_| {
                    victim
                        .lock()
                        .unwrap()
                        .as_mut()
                        .unwrap()
                        .extend(Duration::from_secs(99))
                }),
            ),
        ];
        for (name, call) in &calls {
            let l = held.pop().expect("a lease per call");
            let inner = q.clone();
            let r = l.ack_with(|tx| {
                bump(tx, 1)?;
                call(&inner)?;
                Ok(())
            });
            assert!(is_reentrant_effect(&r), "{name}: {r:?}");
            assert!(
                effects(&q).is_empty(),
                "{name}: the closure's write was rolled back"
            );
            let back = q.job(l.id()).unwrap().unwrap();
            assert_eq!(
                back.state,
                JobState::Ready,
                "{name}: the job was given back"
            );
            assert_eq!(
                back.last_error,
                Some(Error::Reentrant.to_string()),
                "{name}: the closure's error is its last error"
            );
            assert_consistent(&q);
        }
        let s = q.stats().unwrap();
        assert_eq!((s.ready, s.leased, s.dead), (3 + 8, 1, 1), "{s:?}");
        let info = q.job(victim_id).unwrap().unwrap();
        assert_eq!(info.lease_token, Some(victim_token));
        assert_eq!(info.lease_deadline_ms, Some(victim_deadline));
        // The victim still acks under its token.
        victim.lock().unwrap().take().unwrap().ack().unwrap();
        assert_consistent(&q);
    });
}

// ---------------------------------------------------------------------------------------
// "A lone caller never waits" (src/commit.rs module docs) and "A lone caller never adds to
// [deadline_seals]" (`CommitStats::deadline_seals`).
// ---------------------------------------------------------------------------------------

// Regression (found in review, fixed): a group waits for the members of the previous group
// to come back, recognised through a thread-local. The open's lease recovery is a group whose
// one member is the opening thread, so a lone caller on any other thread waited for a member
// that never came, until the gathering bound sealed its group. Only groups with company are
// waited for now.
#[test]
fn a_lone_caller_on_another_thread_than_the_opener_never_waits() {
    let f = Fixture::new();
    let q = f.open();
    let before = q.commit_stats();
    let worker = q.clone();
    std::thread::spawn(move || {
        for i in 0..5u8 {
            worker.enqueue(&[i], EnqueueOptions::default()).unwrap();
        }
    })
    .join()
    .unwrap();
    let s = q.commit_stats();
    assert_eq!(s.commits - before.commits, 5, "{s:?}");
    assert_eq!(s.deadline_seals, before.deadline_seals, "{s:?}");
}

// Regression (found in review, fixed): the thread-local that recognises a returning member
// holds one queue at a time, so a lone thread alternating between two queues was never
// recognised and waited out the gathering bound on every call.
#[test]
fn a_lone_caller_alternating_two_queues_never_waits() {
    let f = Fixture::new();
    let g = Fixture::new();
    let a = f.open();
    let b = g.open();
    let (a0, b0) = (a.commit_stats(), b.commit_stats());
    for i in 0..20u8 {
        a.enqueue(&[i], EnqueueOptions::default()).unwrap();
        b.enqueue(&[i], EnqueueOptions::default()).unwrap();
    }
    let (sa, sb) = (a.commit_stats(), b.commit_stats());
    assert_eq!((sa.commits - a0.commits, sb.commits - b0.commits), (20, 20));
    assert_eq!(sa.deadline_seals - a0.deadline_seals, 0, "queue A: {sa:?}");
    assert_eq!(sb.deadline_seals - b0.deadline_seals, 0, "queue B: {sb:?}");
}

// ---------------------------------------------------------------------------------------
// `ack_with` closures and leaseq's own tables.
// ---------------------------------------------------------------------------------------

// Regression (743213a, lazy index tables; found in review, fixed): `ack_with` keeps every
// leaseq table open while closures run, so redb refuses a closure that opens one. With the
// index tables opened on first use, the unused ones were not open while the first closure
// ran: a closure could write `leaseq_dead` and the commit went through with a corrupted
// index.
#[test]
fn effect_cannot_open_leaseq_index_tables() {
    use redb::TableDefinition;
    const READY: TableDefinition<(u32, u64, u64), ()> = TableDefinition::new("leaseq_ready");
    const SCHEDULED: TableDefinition<(u64, u64), ()> = TableDefinition::new("leaseq_scheduled");
    const LEASES: TableDefinition<(u64, u64), ()> = TableDefinition::new("leaseq_leases");
    const DEAD: TableDefinition<u64, ()> = TableDefinition::new("leaseq_dead");
    const DEDUP: TableDefinition<&[u8], u64> = TableDefinition::new("leaseq_dedup");
    let f = Fixture::new();
    let q = f.open();
    let mut opened = Vec::new();
    for which in 0..5 {
        q.enqueue(b"A", EnqueueOptions::default()).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        let r = l.ack_with(|tx| {
            // Only opens (and closes) the table: writes nothing to it.
            match which {
                0 => drop(tx.open_table(READY)?),
                1 => drop(tx.open_table(SCHEDULED)?),
                2 => drop(tx.open_table(LEASES)?),
                3 => drop(tx.open_table(DEAD)?),
                _ => drop(tx.open_table(DEDUP)?),
            }
            Ok(())
        });
        if r.is_ok() {
            opened.push(
                [
                    "leaseq_ready",
                    "leaseq_scheduled",
                    "leaseq_leases",
                    "leaseq_dead",
                    "leaseq_dedup",
                ][which],
            );
        } else {
            f.clock.advance(LEASE + Duration::from_millis(1));
            q.dequeue().unwrap().unwrap().ack().unwrap();
        }
        assert_consistent(&q);
    }
    // And a closure that writes one: the index now names a job that does not exist.
    q.enqueue(b"B", EnqueueOptions::default()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let r = l.ack_with(|tx| {
        tx.open_table(DEAD)?.insert(u64::MAX / 4, ())?;
        Ok(())
    });
    let violations = q.check().unwrap();
    assert!(
        opened.is_empty() && r.is_err() && violations.is_empty(),
        "a closure opened {opened:?}; writing leaseq_dead gave {r:?} and {} violation(s): {violations:?}",
        violations.len()
    );
}

// ---------------------------------------------------------------------------------------
// Mixed concurrent workloads against a model.
// ---------------------------------------------------------------------------------------

/// What the answers of one queue promised.
#[derive(Default)]
struct QModel {
    /// Every id an enqueue answered `New`.
    produced: Mutex<HashSet<u64>>,
    /// id -> (times completed, how): a job must be completed exactly once.
    completed: Mutex<HashMap<u64, (u32, Done)>>,
    /// (dedup key's first id, the id a later `Duplicate` named).
    duplicates: Mutex<Vec<(u64, u64)>>,
    /// Ids enqueued with a caller idempotency key (only those keep an applied marker).
    keyed: Mutex<HashSet<u64>>,
    /// `Effect` errors (each one aborted its group).
    effect_errors: AtomicU64,
    reentrant_refusals: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Done {
    /// `ack_with`-like: `Applied::Now`, its effect must be in the effect table once.
    Effect,
    /// `ack`, `ack_and_next`: no effect.
    Ack,
    /// `remove`: no effect.
    Removed,
}

impl QModel {
    fn enqueued(&self, e: Enqueued) -> u64 {
        match e {
            Enqueued::New(id) => {
                assert!(
                    self.produced.lock().unwrap().insert(id.0),
                    "id {id:?} reused"
                );
                id.0
            }
            Enqueued::Duplicate(id) | Enqueued::DuplicateDead(id) | Enqueued::Replaced(id) => {
                panic!("unexpected Duplicate({id:?})")
            }
        }
    }

    fn complete(&self, id: u64, how: Done) {
        let mut c = self.completed.lock().unwrap();
        let e = c.entry(id).or_insert((0, how));
        e.0 += 1;
        assert_eq!(e.0, 1, "job {id} completed twice ({how:?} after {:?})", e.1);
    }

    fn settled(&self) -> bool {
        let done = self.completed.lock().unwrap().len();
        done >= self.produced.lock().unwrap().len()
    }

    fn effect_error(&self) {
        self.effect_errors.fetch_add(1, Ordering::SeqCst);
    }

    /// Checks the queue against the model once everything settled.
    fn verify(&self, q: &Queue, name: &str) {
        let produced = self.produced.lock().unwrap().clone();
        let completed = self.completed.lock().unwrap().clone();
        assert_eq!(
            produced,
            completed.keys().copied().collect::<HashSet<_>>(),
            "{name}: jobs completed != jobs enqueued"
        );
        for &(first, named) in self.duplicates.lock().unwrap().iter() {
            assert_eq!(first, named, "{name}: Duplicate named another job");
        }
        let fx = effects(q);
        let with_effect: HashSet<u64> = completed
            .iter()
            .filter(|(_, (_, how))| *how == Done::Effect)
            .map(|(&id, _)| id)
            .collect();
        for (&id, &n) in &fx {
            assert_eq!(n, 1, "{name}: effect of job {id} applied {n} times");
            assert!(
                with_effect.contains(&id),
                "{name}: effect of job {id} without an Applied::Now"
            );
        }
        assert_eq!(
            fx.len(),
            with_effect.len(),
            "{name}: an Applied::Now without its effect"
        );
        let s = q.stats().unwrap();
        assert_eq!(s.total, 0, "{name}: jobs left: {s:?}");
        let keyed = self.keyed.lock().unwrap();
        let markers = with_effect.iter().filter(|id| keyed.contains(id)).count();
        assert_eq!(
            s.applied, markers as u64,
            "{name}: one marker per keyed effect: {s:?}"
        );
        assert_consistent(q);
        let cs = q.commit_stats();
        assert!(
            cs.replayed >= self.effect_errors.load(Ordering::SeqCst),
            "{name}: a failing effect did not abort its group: {cs:?}"
        );
    }
}

struct World {
    queues: Vec<Queue>,
    models: Vec<QModel>,
    clock: leaseq::ManualClock,
    producers_done: AtomicBool,
    _dirs: Vec<tempfile::TempDir>,
}

impl World {
    fn new(n: usize, durability: Durability) -> World {
        let clock = leaseq::ManualClock::new(common::T0_MS);
        let mut dirs = Vec::new();
        let mut queues = Vec::new();
        for _ in 0..n {
            let dir = tempfile::tempdir().unwrap();
            let q = Queue::builder()
                .lease(LEASE)
                .max_attempts(1_000_000)
                .durability(durability)
                .clock(clock.clone())
                .open(dir.path().join("q.leaseq"))
                .unwrap();
            queues.push(q);
            dirs.push(dir);
        }
        World {
            models: (0..n).map(|_| QModel::default()).collect(),
            queues,
            clock,
            producers_done: AtomicBool::new(false),
            _dirs: dirs,
        }
    }

    /// Settled in order: a queue's closures may enqueue into the next queue, so once the
    /// first is settled the second's `produced` is final.
    fn settled(&self) -> bool {
        self.producers_done.load(Ordering::SeqCst) && self.models.iter().all(QModel::settled)
    }

    fn quick_repair(mut self, on: bool) -> World {
        if on {
            let dirs = std::mem::take(&mut self._dirs);
            let mut queues = Vec::new();
            for (dir, q) in dirs.iter().zip(std::mem::take(&mut self.queues)) {
                drop(q);
                queues.push(
                    Queue::builder()
                        .lease(LEASE)
                        .max_attempts(1_000_000)
                        .durability(Durability::None)
                        .quick_repair(true)
                        .clock(self.clock.clone())
                        .open(dir.path().join("q.leaseq"))
                        .unwrap(),
                );
            }
            self.queues = queues;
            self._dirs = dirs;
        }
        self
    }

    fn expire_leases(&self) {
        self.clock.advance(LEASE + Duration::from_millis(1));
    }
}

fn produce(w: &World, p: u64, iterations: u64) {
    let mut rng = fastrand::Rng::with_seed(1000 + p);
    for i in 0..iterations {
        let k = rng.usize(..w.queues.len());
        let (q, m) = (&w.queues[k], &w.models[k]);
        let payload = (p << 32 | i).to_le_bytes();
        match rng.u32(0..10) {
            0..=2 => {
                m.enqueued(q.enqueue(&payload, EnqueueOptions::default()).unwrap());
            }
            3 => {
                let mut opts = || EnqueueOptions::default().priority(rng.i32(-2..3));
                let out = q
                    .enqueue_batch([
                        (&payload[..], opts()),
                        (&payload[..], opts()),
                        (&payload[..], opts()),
                    ])
                    .unwrap();
                for e in out {
                    m.enqueued(e);
                }
            }
            4 => {
                // A dedup key: the second enqueue names the first job while it is live.
                let key = format!("d-{p}-{i}");
                let first = m.enqueued(
                    q.enqueue(&payload, EnqueueOptions::default().dedup_key(&key))
                        .unwrap(),
                );
                match q
                    .enqueue(&payload, EnqueueOptions::default().dedup_key(&key))
                    .unwrap()
                {
                    Enqueued::Duplicate(named)
                    | Enqueued::DuplicateDead(named)
                    | Enqueued::Replaced(named) => {
                        m.duplicates.lock().unwrap().push((first, named.0))
                    }
                    new @ Enqueued::New(_) => {
                        m.enqueued(new); // the first was done already
                    }
                }
            }
            5 => {
                let opts = EnqueueOptions::default().delay(Duration::from_millis(1 + rng.u64(..5)));
                m.enqueued(q.enqueue(&payload, opts).unwrap());
            }
            6 => {
                // Refusals inside shared groups: the group stays clean for them.
                let r = q.remove(JobId(u64::MAX / 4));
                assert!(matches!(r, Err(Error::JobNotFound { .. })), "{r:?}");
                m.enqueued(q.enqueue(&payload, EnqueueOptions::default()).unwrap());
            }
            7 => {
                // requeue_dead of some job: usually refused (not dead), sometimes a dead one.
                let id = m.produced.lock().unwrap().iter().next().copied();
                if let Some(id) = id {
                    match q.requeue_dead(JobId(id)) {
                        Ok(()) | Err(Error::InvalidState { .. } | Error::JobNotFound { .. }) => {}
                        Err(e) => panic!("requeue_dead: {e}"),
                    }
                }
                m.enqueued(q.enqueue(&payload, EnqueueOptions::default()).unwrap());
            }
            8 => {
                // remove some job: refused while leased; done without effect otherwise.
                let id = m
                    .produced
                    .lock()
                    .unwrap()
                    .iter()
                    .nth(rng.usize(..4))
                    .copied();
                if let Some(id) = id {
                    match q.remove(JobId(id)) {
                        Ok(()) => m.complete(id, Done::Removed),
                        Err(Error::InvalidState { .. } | Error::JobNotFound { .. }) => {}
                        Err(e) => panic!("remove: {e}"),
                    }
                }
                m.enqueued(q.enqueue(&payload, EnqueueOptions::default()).unwrap());
            }
            _ => {
                let key = format!("i-{p}-{i}");
                let id = m.enqueued(
                    q.enqueue(&payload, EnqueueOptions::default().idempotency_key(key))
                        .unwrap(),
                );
                m.keyed.lock().unwrap().insert(id);
            }
        }
    }
}

/// Ends `lease` (of queue `k`) in one of many ways, following `*_and_next` chains.
fn consume(w: &World, k: usize, lease: Lease, rng: &mut fastrand::Rng) {
    let (q, m) = (&w.queues[k], &w.models[k]);
    let nested = (k + 1 < w.queues.len()).then(|| (&w.queues[k + 1], &w.models[k + 1]));
    let mut cur = Some(lease);
    while let Some(l) = cur.take() {
        let id = l.id().0;
        let first = l.attempt() == 1;
        let effect_result = |r: Result<Applied, Error>, may_fail: bool| match r {
            Ok(Applied::Now) => m.complete(id, Done::Effect),
            Ok(Applied::AlreadyApplied) => panic!("job {id}: effect already applied"),
            Err(Error::LeaseLost { .. }) => {}
            Err(Error::Effect(e)) if may_fail => {
                let _ = e;
                m.effect_error();
            }
            Err(e) => panic!("job {id}: ack_with: {e:?}"),
        };
        match rng.u32(0..14) {
            0 => effect_result(l.ack_with(|tx| bump(tx, id)), false),
            1 => effect_result(
                l.ack_with(|tx| {
                    bump(tx, id)?;
                    if first {
                        return Err("first attempt fails".into());
                    }
                    Ok(())
                }),
                first,
            ),
            2 => effect_result(
                l.ack_with(|tx| {
                    bump(tx, id)?;
                    assert!(!first, "{DELIBERATE_PANIC}");
                    Ok(())
                }),
                first,
            ),
            3 => {
                let r = l.ack_with(|tx| {
                    bump(tx, id)?;
                    if first {
                        q.enqueue(b"from inside", EnqueueOptions::default())?;
                    }
                    Ok(())
                });
                if first && !matches!(r, Err(Error::LeaseLost { .. })) {
                    assert!(is_reentrant_effect(&r), "{r:?}");
                    m.reentrant_refusals.fetch_add(1, Ordering::SeqCst);
                }
                effect_result(r, first);
            }
            4 => match l.nack("again") {
                Ok(_) | Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("nack: {e}"),
            },
            5 => match l.nack_after("later", Duration::from_millis(2)) {
                Ok(_) | Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("nack_after: {e}"),
            },
            6 => {
                let l = l;
                match l.extend(Duration::from_secs(60)) {
                    Ok(()) | Err(Error::LeaseLost { .. }) => {}
                    Err(e) => panic!("extend: {e}"),
                }
                effect_result(l.ack_with(|tx| bump(tx, id)), false);
            }
            7 => match l.fail("to the dead letters") {
                Ok(()) => match q.requeue_dead(JobId(id)) {
                    Ok(()) | Err(Error::InvalidState { .. } | Error::JobNotFound { .. }) => {}
                    Err(e) => panic!("requeue_dead: {e}"),
                },
                Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("fail: {e}"),
            },
            8 => match l.ack_and_next() {
                Ok(next) => {
                    m.complete(id, Done::Ack);
                    cur = next;
                }
                Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("ack_and_next: {e}"),
            },
            9 => match l.ack_with_and_next(|tx| bump(tx, id)) {
                Ok((Applied::Now, next)) => {
                    m.complete(id, Done::Effect);
                    cur = next;
                }
                Ok((Applied::AlreadyApplied, _)) => panic!("job {id}: effect already applied"),
                Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("ack_with_and_next: {e}"),
            },
            10 => match l.ack() {
                Ok(()) => m.complete(id, Done::Ack),
                Err(Error::LeaseLost { .. }) => {}
                Err(e) => panic!("ack: {e}"),
            },
            11 => {
                let mut all = vec![l];
                all.extend(q.dequeue_batch(2).unwrap());
                let ids: Vec<u64> = all.iter().map(|l| l.id().0).collect();
                match q.ack_with_batch(&all, |tx, l| bump(tx, l.id().0)) {
                    Ok(outcomes) => {
                        for (id, r) in ids.into_iter().zip(outcomes) {
                            match r {
                                Ok(a) => {
                                    assert_eq!(a, Applied::Now, "job {id}");
                                    m.complete(id, Done::Effect);
                                }
                                Err(Error::LeaseLost { .. }) => {}
                                Err(e) => panic!("ack_with_batch, job {id}: {e}"),
                            }
                        }
                    }
                    Err(e) => panic!("ack_with_batch: {e}"),
                }
            }
            12 => {
                // A stale token: expire every lease, let a dequeue reclaim them, then ack.
                w.expire_leases();
                cur = q.dequeue().unwrap();
                match l.ack() {
                    Ok(()) => m.complete(id, Done::Ack),
                    Err(Error::LeaseLost { .. }) => {}
                    Err(e) => panic!("stale ack: {e}"),
                }
            }
            _ => match nested {
                // The effect also enqueues into the next queue (a different file and
                // committer: allowed). The enqueue is not part of this transaction, so a
                // replay repeats it: every `New` it answers is a job of that queue.
                Some((qb, mb)) => effect_result(
                    l.ack_with(|tx| {
                        bump(tx, id)?;
                        let e = qb.enqueue(&id.to_le_bytes(), EnqueueOptions::default())?;
                        mb.enqueued(e);
                        Ok(())
                    }),
                    false,
                ),
                None => effect_result(l.ack_with(|tx| bump(tx, id)), false),
            },
        }
    }
}

fn consumer(w: &World, c: u64) {
    let mut rng = fastrand::Rng::with_seed(2000 + c);
    while !w.settled() {
        let k = rng.usize(..w.queues.len());
        match w.queues[k]
            .dequeue_timeout(Duration::from_millis(2))
            .unwrap()
        {
            Some(l) => consume(w, k, l, &mut rng),
            // Nothing ready: failed effects hold their lease, delayed jobs wait. Move time.
            None => w.expire_leases(),
        }
    }
}

/// Runs producers and consumers (and a flusher) on `w` until every job is done, then checks
/// every queue against its model.
fn run_world(w: World, producers: u64, consumers: u64, iterations: u64, flusher: bool) -> World {
    quiet_closure_panics();
    let w = Arc::new(w);
    let w2 = w.clone();
    watchdog("mixed workload", 60, move || {
        let w = &*w2;
        std::thread::scope(|s| {
            let mut ps = Vec::new();
            for p in 0..producers {
                ps.push(s.spawn(move || produce(w, p, iterations)));
            }
            for c in 0..consumers {
                s.spawn(move || consumer(w, c));
            }
            if flusher {
                s.spawn(move || {
                    while !w.settled() {
                        for q in &w.queues {
                            q.flush().unwrap();
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
            }
            for p in ps {
                p.join().unwrap();
            }
            w.producers_done.store(true, Ordering::SeqCst);
        });
    });
    for (i, (q, m)) in w.queues.iter().zip(&w.models).enumerate() {
        m.verify(q, &format!("queue {i}"));
    }
    Arc::try_unwrap(w).ok().expect("threads are done")
}

#[test]
fn mixed_workload_completes_every_job_exactly_once() {
    for round in 0..3 {
        let w = run_world(World::new(1, Durability::Immediate), 3, 6, 120, false);
        let (cs, m) = (w.queues[0].commit_stats(), &w.models[0]);
        if std::env::var_os("STRESS_VERBOSE").is_some() {
            eprintln!(
                "round {round}: {} jobs; {cs:?}",
                m.produced.lock().unwrap().len()
            );
        }
        // The workload did reach the paths it is meant to stress.
        assert!(m.reentrant_refusals.load(Ordering::SeqCst) > 0);
        assert!(
            m.effect_errors.load(Ordering::SeqCst) > 0 && cs.replayed > 0,
            "{cs:?}"
        );
        assert!(
            cs.operations > cs.commits,
            "no group had two members: {cs:?}"
        );
    }
}

// The same with non-durable commits (every 256th is durable), `flush` from another thread,
// and quick-repair (two-phase commits) on one of the rounds.
#[test]
fn mixed_workload_with_durability_none_and_a_flusher() {
    for round in 0..2 {
        let w = run_world(
            World::new(1, Durability::None).quick_repair(round == 1),
            3,
            6,
            150,
            true,
        );
        let cs = w.queues[0].commit_stats();
        if std::env::var_os("STRESS_VERBOSE").is_some() {
            eprintln!("round {round}: {cs:?}");
        }
        assert!(
            cs.commits > 256,
            "the periodic durable commit was not reached: {cs:?}"
        );
    }
}

// Two queues (two files, two committers) used from the same threads, each thread switching
// between them at random; queue 0's effects also enqueue into queue 1 from inside the
// closure. Each queue must still complete every job exactly once.
#[test]
fn two_queues_interleaved_on_the_same_threads() {
    for _ in 0..2 {
        let w = run_world(World::new(2, Durability::Immediate), 3, 6, 100, false);
        assert!(!w.models[1].produced.lock().unwrap().is_empty());
    }
}

// Many threads (more than cores by far) in tight enqueue / lease / ack-with-effect loops,
// every 5th effect failing once: members park and are unparked, groups abort and replay.
#[test]
fn many_threads_share_groups_and_replay() {
    const THREADS: u64 = 24;
    const PER_THREAD: u64 = 25;
    quiet_closure_panics();
    let f = Fixture::new();
    let q = f.builder().max_attempts(1_000_000).open(&f.path).unwrap();
    let model = Arc::new(QModel::default());
    let (q2, m2, clock) = (q.clone(), model.clone(), f.clock.clone());
    watchdog("many threads", 60, move || {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (q, m, clock) = (&q2, &*m2, &clock);
                s.spawn(move || {
                    for i in 0..PER_THREAD {
                        m.enqueued(
                            q.enqueue(&(t << 32 | i).to_le_bytes(), EnqueueOptions::default())
                                .unwrap(),
                        );
                        // Any job, not necessarily this thread's; failed ones come back once
                        // their lease expires.
                        let Some(l) = q.dequeue().unwrap() else {
                            clock.advance(LEASE + Duration::from_millis(1));
                            continue;
                        };
                        let (id, first) = (l.id().0, l.attempt() == 1);
                        match l.ack_with(|tx| {
                            bump(tx, id)?;
                            if first && id % 5 == 0 {
                                return Err("fails once".into());
                            }
                            Ok(())
                        }) {
                            Ok(Applied::Now) => m.complete(id, Done::Effect),
                            Err(Error::Effect(_)) => m.effect_error(),
                            Err(Error::LeaseLost { .. }) => {}
                            other => panic!("{other:?}"),
                        }
                    }
                });
            }
        });
        // Drain what is left (failed effects, jobs whose lease the clock expired).
        while !m2.settled() {
            clock.advance(LEASE + Duration::from_millis(1));
            while let Some(l) = q2.dequeue().unwrap() {
                let id = l.id().0;
                assert_eq!(l.ack_with(|tx| bump(tx, id)).unwrap(), Applied::Now);
                m2.complete(id, Done::Effect);
            }
        }
    });
    model.verify(&q, "queue");
    assert_eq!(
        model.produced.lock().unwrap().len() as u64,
        THREADS * PER_THREAD
    );
}

// ---------------------------------------------------------------------------------------
// Power failure in the middle of shared groups (the `sim` feature's disk).
// ---------------------------------------------------------------------------------------

// Several threads enqueue, lease and ack (plain and with an effect) on one queue while the
// simulated disk loses power at a random I/O call. Nobody may hang (the failed commit poisons
// the handle: every member of the group and every later caller gets an error), and after a
// reboot from the crash image every call that returned `Ok` must be there: each `Ok` enqueue
// is a job unless an `Ok` ack removed it, each `Ok` ack is gone, each `Ok` effect applied
// once. This is "nobody is answered before the commit that covers its operation".
#[cfg(feature = "sim")]
#[test]
fn power_loss_in_shared_groups_keeps_every_ok_and_hangs_nobody() {
    use leaseq::sim::SimDisk;
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 80;
    watchdog("power loss in shared groups", 60, || {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut crashed_rounds = 0;
        for round in 0..ROUNDS {
            let clock = leaseq::ManualClock::new(common::T0_MS);
            let builder = Queue::builder()
                .lease(LEASE)
                .max_attempts(1_000_000)
                .clock(clock.clone());
            let disk = SimDisk::new(round);
            let q = builder.open_backend(disk.backend()).unwrap();
            // The whole workload takes about 1300 I/O calls.
            disk.crash_after(rng.u64(0..1200));
            let ops_at_open = disk.mutating_ops();
            #[derive(Default)]
            struct Seen {
                attempted: HashSet<u64>,        // payload tags of every enqueue tried
                ok_enqueued: HashMap<u64, u64>, // id -> tag
                ok_acked: HashSet<u64>,
                // Every ack tried: one that returned an error may still have committed
                // (power lost after its commit's sync, before the answer), like a lost ack.
                ack_tried: HashSet<u64>,
                ok_effect: HashSet<u64>,
                effect_tried: HashSet<u64>,
            }
            let seen = Mutex::new(Seen::default());
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    let (q, seen) = (&q, &seen);
                    s.spawn(move || {
                        let ok_error = |e: &Error| {
                            assert!(
                                matches!(
                                    e,
                                    Error::CommitFailed { .. }
                                        | Error::Storage(_)
                                        | Error::Io(_)
                                        | Error::Corrupted { .. }
                                        | Error::Effect(_)
                                ),
                                "unexpected error after power loss: {e:?}"
                            );
                        };
                        for i in 0..40u64 {
                            let tag = t << 32 | i;
                            seen.lock().unwrap().attempted.insert(tag);
                            match q.enqueue(&tag.to_le_bytes(), EnqueueOptions::default()) {
                                Ok(e) => {
                                    seen.lock().unwrap().ok_enqueued.insert(e.id().0, tag);
                                }
                                Err(e) => return ok_error(&e),
                            }
                            let l = match q.dequeue() {
                                Ok(Some(l)) => l,
                                Ok(None) => continue,
                                Err(e) => return ok_error(&e),
                            };
                            let id = l.id().0;
                            seen.lock().unwrap().ack_tried.insert(id);
                            let r = if i % 2 == 0 {
                                seen.lock().unwrap().effect_tried.insert(id);
                                l.ack_with(|tx| bump(tx, id)).map(|a| {
                                    assert_eq!(a, Applied::Now);
                                    true
                                })
                            } else {
                                l.ack().map(|()| false)
                            };
                            match r {
                                Ok(effect) => {
                                    let mut s = seen.lock().unwrap();
                                    s.ok_acked.insert(id);
                                    if effect {
                                        s.ok_effect.insert(id);
                                    }
                                }
                                Err(e) => return ok_error(&e),
                            }
                        }
                    });
                }
            });
            if std::env::var_os("STRESS_VERBOSE").is_some() {
                eprintln!(
                    "round {round}: crashed {} after {} I/O calls",
                    disk.is_crashed(),
                    disk.mutating_ops() - ops_at_open
                );
            }
            if disk.is_crashed() {
                crashed_rounds += 1;
                // The handle is poisoned or its disk is gone: a later call fails, never hangs.
                assert!(q.enqueue(b"after", EnqueueOptions::default()).is_err());
            }
            disk.crash_now();
            let image = disk.crash_image();
            drop(q);
            let q = builder
                .open_backend(SimDisk::from_image(image, round).backend())
                .unwrap_or_else(|e| panic!("round {round}: reopen after power loss: {e}"));
            assert_consistent(&q);
            let seen = seen.into_inner().unwrap();
            // Every job left (leases were returned at open): drain them.
            let mut left: HashMap<u64, u64> = HashMap::new();
            loop {
                let batch = q.dequeue_batch(1000).unwrap();
                if batch.is_empty() {
                    break;
                }
                for l in batch {
                    let tag = u64::from_le_bytes(l.payload().try_into().unwrap());
                    assert!(
                        seen.attempted.contains(&tag),
                        "round {round}: unknown job {tag:#x}"
                    );
                    assert!(left.insert(l.id().0, tag).is_none());
                }
            }
            for (&id, &tag) in &seen.ok_enqueued {
                if seen.ok_acked.contains(&id) {
                    assert!(
                        !left.contains_key(&id),
                        "round {round}: job {id} acked Ok is back"
                    );
                } else if !seen.ack_tried.contains(&id) {
                    assert_eq!(
                        left.get(&id),
                        Some(&tag),
                        "round {round}: job {id} enqueued Ok is lost"
                    );
                } else if let Some(t) = left.get(&id) {
                    // An ack that failed: the job is back, or it was acked after all.
                    assert_eq!(*t, tag, "round {round}: job {id} came back changed");
                }
            }
            let fx = effects(&q);
            for (&id, &n) in &fx {
                assert_eq!(n, 1, "round {round}: effect of {id} applied {n} times");
                assert!(seen.effect_tried.contains(&id));
                assert!(
                    !left.contains_key(&id),
                    "round {round}: job {id} has its effect but is not acked"
                );
            }
            for id in &seen.ok_effect {
                assert_eq!(
                    fx.get(id),
                    Some(&1),
                    "round {round}: Ok effect of {id} lost"
                );
            }
        }
        assert!(
            crashed_rounds > ROUNDS / 4,
            "only {crashed_rounds} rounds crashed mid-workload"
        );
    });
}
