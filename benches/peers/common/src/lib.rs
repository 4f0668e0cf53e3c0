//! The harness of leaseq's benchmark against the Rust queues a user would compare it with
//! (`benches/peers`, docs/performance.md). Each peer is a crate of its own beside this one:
//! effectum and apalis-sqlite link different `libsqlite3-sys` versions, which cargo refuses
//! in one build. Each peer's binary measures leaseq's side ([`LeaseqSide`]) and its peer's
//! sides in the same run, so every ratio compares numbers taken minutes apart on one machine.
//!
//! The peers are push-style (a worker runs a handler and completes the job when it returns
//! `Ok`), so every side is measured the same way: workers with a handler that does nothing,
//! and the time until the queue's own API reports the jobs *completed* (the completion
//! committed), never the handler's entry.
//!
//! After criterion's groups, a bytes pass runs every benchmark criterion ran again on a fresh
//! file and counts the bytes each side writes per job ([`bytes`], `benches/queue`'s own module:
//! the process's `write_bytes`), printed and written beside criterion's results as
//! `<peer>.<group>/<side>/bytes.json`; `benches/peers/table.py` prints them beside jobs/s.

use std::hint::black_box;
use std::path::Path;
use std::sync::{Barrier, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use tempfile::TempDir;

/// Bytes written per job: `benches/queue/bytes.rs`, the one place both harnesses count them.
#[path = "../../../queue/bytes.rs"]
pub mod bytes;
mod leaseq_side;

pub use leaseq_side::{LeaseqSide, check_leaseq};

use crate::bytes::{Pass, Probe, Unmetered};

/// Payload size of every job, in bytes.
pub const PAYLOAD_LEN: usize = 64;

/// Jobs per iteration of `cycle_batch_100`.
pub const BATCH: usize = 100;

/// Jobs per iteration of the concurrent groups.
pub const CONCURRENT_JOBS: usize = 256;

/// Jobs the bytes pass measures per side and group (at least; whole iterations): fewer than
/// `benches/queue`'s 2,000, as apalis-sqlite runs about 60 jobs/s in `cycle_1`.
pub const BYTES_JOBS: usize = 500;

/// The payload every side enqueues (fixed bytes).
pub fn payload() -> Vec<u8> {
    (0..PAYLOAD_LEN)
        .map(|i| (i as u8).wrapping_mul(37))
        .collect()
}

/// A durable queue with workers, as the peer benchmark drives it.
///
/// Contract, identical for every side:
/// - `enqueue` and `enqueue_batch` return once their jobs are durable (committed and synced
///   as the side is configured: its name says how);
/// - the side's `consumers` workers run a handler that does nothing and succeeds; the queue
///   then completes the job by its own means;
/// - `wait_completed(n)` returns once `n` more jobs than at its previous return are reported
///   completed by the queue's own API (a completion committed, not a handler entered);
/// - one instance is shared by every thread of a benchmark, and dropping it stops its
///   workers.
pub trait Side: Send + Sync + Sized {
    /// Criterion function name (`<target>/criterion/<peer>.<group>/<NAME>/`).
    const NAME: &'static str;

    /// Creates the queue in `dir`, an empty directory, with `consumers` workers running (0:
    /// none, the jobs stay queued).
    fn open(dir: &Path, consumers: usize) -> Self;

    /// Enqueues one job; durable on return.
    fn enqueue(&self, payload: &[u8]);

    /// Enqueues every payload in one call (one transaction where the side has one); durable
    /// on return.
    fn enqueue_batch(&self, payloads: &[Vec<u8>]);

    /// Blocks until `n` more jobs have completed since the previous return (or the open).
    fn wait_completed(&self, n: usize);
}

/// The groups, one criterion group each (`<peer>.<name>`).
#[derive(Clone, Copy, Debug)]
pub enum Group {
    /// One durable enqueue per iteration, no workers.
    Enqueue1,
    /// One job per iteration: enqueued, then waited for until completed (one worker).
    Cycle1,
    /// 100 jobs per iteration: enqueued in one call, then waited for until all completed
    /// (one worker).
    CycleBatch100,
    /// `producers` threads enqueue `CONCURRENT_JOBS` jobs one call each while `consumers`
    /// workers run them; wall time until every job is completed.
    Concurrent { producers: usize, consumers: usize },
}

impl Group {
    /// Every group, in the order they run.
    pub const ALL: [Group; 5] = [
        Group::Enqueue1,
        Group::Cycle1,
        Group::CycleBatch100,
        Group::Concurrent {
            producers: 4,
            consumers: 4,
        },
        Group::Concurrent {
            producers: 16,
            consumers: 16,
        },
    ];

    /// The group's name (as in `benches/queue`).
    pub fn name(self) -> String {
        match self {
            Group::Enqueue1 => "enqueue_1".into(),
            Group::Cycle1 => "cycle_1".into(),
            Group::CycleBatch100 => "cycle_batch_100".into(),
            Group::Concurrent {
                producers,
                consumers,
            } => format!("cycle_concurrent_{producers}x{consumers}"),
        }
    }

    fn jobs_per_iteration(self) -> usize {
        match self {
            Group::Enqueue1 | Group::Cycle1 => 1,
            Group::CycleBatch100 => BATCH,
            Group::Concurrent { .. } => CONCURRENT_JOBS,
        }
    }

    fn consumers(self) -> usize {
        match self {
            Group::Enqueue1 => 0,
            Group::Cycle1 | Group::CycleBatch100 => 1,
            Group::Concurrent { consumers, .. } => consumers,
        }
    }
}

/// Opens one criterion group `<peer>.<group>` for every group, with the settings of
/// `benches/queue` (10 samples; 3 s, or 5 s flat for the concurrent groups); then runs the
/// bytes pass over the benchmarks criterion ran (none under `--profile-time`).
pub fn for_each_group(
    c: &mut Criterion,
    peer: &str,
    mut sides: impl FnMut(&mut BenchmarkGroup<'_, WallTime>, Group),
) {
    for kind in Group::ALL {
        let mut group = c.benchmark_group(format!("{peer}.{}", kind.name()));
        let slow = matches!(kind, Group::Concurrent { .. });
        group
            .throughput(Throughput::Elements(kind.jobs_per_iteration() as u64))
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(if slow { 5 } else { 3 }));
        if slow {
            group.sampling_mode(SamplingMode::Flat);
        }
        sides(&mut group, kind);
        group.finish();
    }
    let ran = std::mem::take(&mut *RAN.lock().unwrap_or_else(PoisonError::into_inner));
    let pass = Pass::from_args();
    if pass == Pass::Skip {
        return;
    }
    let rows: Vec<bytes::Row> = ran
        .into_iter()
        .map(|(kind, row)| row(&format!("{peer}.{}", kind.name()), kind, pass))
        .collect();
    bytes::report(pass, &rows);
}

/// A benchmark criterion ran, for the bytes pass: its group and the side's [`bytes_row`].
type Ran = (Group, fn(&str, Group, Pass) -> bytes::Row);

/// The benchmarks criterion ran (its filter kept). A static, as [`SideRun`]s take nothing else.
static RAN: Mutex<Vec<Ran>> = Mutex::new(Vec::new());

/// One side's benchmark of a group: `run::<S>` for a side `S`.
pub type SideRun = for<'a, 'b> fn(&'a mut BenchmarkGroup<'b, WallTime>, Group);

/// Runs `sides` in `group`, in the order given, or reversed with `LEASEQ_PEERS_REVERSE=1`:
/// `benches/peers/run` alternates the order between runs, so a drift of the disk during a
/// run does not always land on the same side.
pub fn run_sides(group: &mut BenchmarkGroup<'_, WallTime>, kind: Group, sides: &[SideRun]) {
    let reverse = std::env::var_os("LEASEQ_PEERS_REVERSE").is_some_and(|v| v == "1");
    let mut order: Vec<SideRun> = sides.to_vec();
    if reverse {
        order.reverse();
    }
    for side in order {
        side(group, kind);
    }
}

/// Whether `LEASEQ_PEERS_CHECK=1` asks for the self checks only.
pub fn check_only() -> bool {
    std::env::var_os("LEASEQ_PEERS_CHECK").is_some_and(|v| v == "1")
}

/// A side's queue and the directory holding its files (dropped in this order).
struct Instance<S> {
    side: S,
    _dir: TempDir,
}

/// Benchmarks side `S` as function `S::NAME` of `group`, on a fresh instance that lives for
/// this benchmark only (created only if the benchmark is not filtered out; then the bytes pass
/// runs it again).
pub fn run<S: Side>(group: &mut BenchmarkGroup<'_, WallTime>, kind: Group) {
    let payloads = vec![payload(); BATCH];
    let mut instance: Option<Instance<S>> = None;
    group.bench_function(S::NAME, |b| {
        let side = &instance
            .get_or_insert_with(|| {
                let dir = tempfile::tempdir().expect("tempdir");
                Instance {
                    side: S::open(dir.path(), kind.consumers()),
                    _dir: dir,
                }
            })
            .side;
        match kind {
            Group::Concurrent { producers, .. } => b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| concurrent_run(side, &payloads[0], producers))
                    .sum()
            }),
            _ => b.iter(|| iteration(side, kind, &payloads, &mut Unmetered)),
        }
    });
    if instance.is_some() {
        RAN.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((kind, bytes_row::<S>));
    }
}

/// One iteration of `kind`'s body on `side` (`payloads`: `BATCH` payloads, a single enqueue
/// takes the first). Only `enqueue_1`'s call goes through `probe`: elsewhere the side's workers
/// write while the calls run, so a call's bytes are not its own.
fn iteration<S: Side>(side: &S, kind: Group, payloads: &[Vec<u8>], probe: &mut impl Probe) {
    let payload = &payloads[0];
    match kind {
        Group::Enqueue1 => probe.call("enqueue", || side.enqueue(black_box(payload))),
        Group::Cycle1 => {
            side.enqueue(payload);
            side.wait_completed(1);
        }
        Group::CycleBatch100 => {
            side.enqueue_batch(payloads);
            side.wait_completed(BATCH);
        }
        Group::Concurrent { producers, .. } => {
            concurrent_run(side, payload, producers);
        }
    }
}

/// The bytes side `S` writes in `kind` (criterion's group `group`): `kind`'s body on a fresh
/// file, a warm-up first, then about `BYTES_JOBS` jobs measured (as `pass` sizes them); the
/// side is dropped (its workers stopped) after the count.
fn bytes_row<S: Side>(group: &str, kind: Group, pass: Pass) -> bytes::Row {
    let dir = tempfile::tempdir().expect("tempdir");
    let side = S::open(dir.path(), kind.consumers());
    let payloads = vec![payload(); BATCH];
    let per_iteration = kind.jobs_per_iteration();
    let (warm_up, measured) = pass.iterations(BYTES_JOBS, per_iteration);
    for _ in 0..warm_up {
        iteration(&side, kind, &payloads, &mut Unmetered);
    }
    let jobs = measured * per_iteration;
    bytes::measure(group, S::NAME, jobs, |meter| {
        for _ in 0..measured {
            iteration(&side, kind, &payloads, meter);
        }
    })
}

/// `producers` threads enqueue `CONCURRENT_JOBS` jobs between them, one call each, while
/// the side's workers run them; the wall time from the start until all are completed.
fn concurrent_run<S: Side>(side: &S, payload: &[u8], producers: usize) -> Duration {
    assert_eq!(CONCURRENT_JOBS % producers, 0);
    let per_producer = CONCURRENT_JOBS / producers;
    let start = Barrier::new(producers + 1);
    thread::scope(|s| {
        for _ in 0..producers {
            s.spawn(|| {
                start.wait();
                for _ in 0..per_producer {
                    side.enqueue(payload);
                }
            });
        }
        start.wait();
        let started = Instant::now();
        side.wait_completed(CONCURRENT_JOBS);
        started.elapsed()
    })
}

/// Counts completions a side observed and lets a waiter block until enough have come: the
/// bookkeeping behind [`Side::wait_completed`] for sides that learn of completions one by
/// one (from a listener thread or task).
#[derive(Default)]
pub struct Completions {
    state: Mutex<CompletionState>,
    changed: Condvar,
}

#[derive(Default)]
struct CompletionState {
    completed: u64,
    waited: u64,
}

impl Completions {
    /// Records `n` more completed jobs.
    pub fn add(&self, n: u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.completed += n;
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until `n` more jobs completed than at the previous return; panics after 60 s
    /// (a side that loses jobs must not hang the benchmark).
    pub fn wait(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let target = state.waited + n as u64;
        while state.completed < target {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{n} jobs not completed within 60 s");
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.waited = target;
    }
}
