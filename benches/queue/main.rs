//! Speed of leaseq against the SQLite baseline and against the redb floor (the fewest raw redb
//! transactions doing the same work, `redb_floor.rs`), all at the same durability, and the bytes
//! each side writes per job and per call (`bytes.rs`).
//!
//! Results: `target/criterion/<group>/<side>/new/estimates.json`, one function per side
//! (`QueueUnderTest::NAME`) in every queue group; throughput is in jobs. After criterion's
//! groups, a bytes pass runs every benchmark criterion ran again on a fresh file and prints the
//! bytes written per job and per call, also in `target/criterion/<group>/<side>/bytes.json`.
//!
//! Adding a side: implement [`common::QueueUnderTest`] for it in a module of this bench and
//! add one `run_group::<ThatQueue>(...)` line in [`queue_groups`].

mod bytes;
mod common;
mod leaseq_side;
mod redb_floor;
mod sqlite;

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::{Seek, SeekFrom, Write};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use tempfile::TempDir;

use crate::bytes::{Pass, Probe, Unmetered};
use crate::common::{Gate, QueueUnderTest};
use crate::sqlite::SqliteQueue;

/// Jobs per iteration of the batch group.
const BATCH: usize = 100;

/// Jobs per iteration of the concurrent groups.
const CONCURRENT_JOBS: usize = 256;

/// Jobs the bytes pass measures per side and group (at least; whole iterations).
const BYTES_JOBS: usize = 2000;

/// The queue benchmarks, one criterion group each.
#[derive(Clone, Copy, Debug)]
enum Group {
    /// One durable enqueue per iteration.
    Enqueue1,
    /// One thread: enqueue, dequeue, ack with effect; one job per iteration.
    Cycle1,
    /// One thread: enqueue, then ack the previously leased job and lease the next one in one
    /// transaction (`ack_and_dequeue_next`); one job per iteration.
    Cycle1AckNext,
    /// One thread: enqueue, dequeue, extend the lease once (a heartbeat), ack without an
    /// effect; one job per iteration (each call of a job's plain life on its own).
    Cycle1ExtendAck,
    /// One thread: enqueue 100, dequeue 100, ack 100, one transaction each.
    CycleBatch100,
    /// `producers` and `consumers` threads, every call durable; `CONCURRENT_JOBS` jobs
    /// enqueued and fully acked per iteration, wall time. Consumers ack each job together
    /// with leasing the next (`ack_and_dequeue_next`), as a worker loop does.
    Concurrent { producers: usize, consumers: usize },
}

impl Group {
    const ALL: [Group; 7] = [
        Group::Enqueue1,
        Group::Cycle1,
        Group::Cycle1AckNext,
        Group::Cycle1ExtendAck,
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

    fn name(self) -> String {
        match self {
            Group::Enqueue1 => "enqueue_1".into(),
            Group::Cycle1 => "cycle_1".into(),
            Group::Cycle1AckNext => "cycle_1_ack_next".into(),
            Group::Cycle1ExtendAck => "cycle_1_extend_ack".into(),
            Group::CycleBatch100 => "cycle_batch_100".into(),
            Group::Concurrent {
                producers,
                consumers,
            } => format!("cycle_concurrent_{producers}x{consumers}"),
        }
    }

    fn jobs_per_iteration(self) -> usize {
        match self {
            Group::Enqueue1 | Group::Cycle1 | Group::Cycle1AckNext | Group::Cycle1ExtendAck => 1,
            Group::CycleBatch100 => BATCH,
            Group::Concurrent { .. } => CONCURRENT_JOBS,
        }
    }
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>, jobs_per_iteration: usize, slow: bool) {
    group
        .throughput(Throughput::Elements(jobs_per_iteration as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(if slow { 5 } else { 3 }));
    if slow {
        group.sampling_mode(SamplingMode::Flat);
    }
}

/// A benchmark criterion ran, for the bytes pass to run again: its group and the side's
/// [`bytes_row`].
type Ran = (Group, fn(Group, Pass) -> bytes::Row);

/// Every queue group, each with one function per side; returns the benchmarks criterion ran
/// (those its filter kept).
fn queue_groups(c: &mut Criterion) -> Vec<Ran> {
    let mut ran = Vec::new();
    for kind in Group::ALL {
        let mut group = c.benchmark_group(kind.name());
        configure(
            &mut group,
            kind.jobs_per_iteration(),
            matches!(kind, Group::Concurrent { .. }),
        );
        run_group::<SqliteQueue>(&mut group, kind, &mut ran);
        run_group::<redb_floor::FloorQueue>(&mut group, kind, &mut ran);
        run_group::<leaseq_side::LeaseqQueue>(&mut group, kind, &mut ran);
        run_group::<leaseq_side::LeaseqQueue<true>>(&mut group, kind, &mut ran);
        run_group::<leaseq_side::LeaseqQueue<false, false>>(&mut group, kind, &mut ran);
        run_group::<leaseq_side::LeaseqQueue<false, true, false>>(&mut group, kind, &mut ran);
        run_group::<leaseq_side::LeaseqQueue<false, true, true, true>>(&mut group, kind, &mut ran);
        run_group::<leaseq_side::LeaseqQueue<false, true, true, false, false>>(
            &mut group, kind, &mut ran,
        );
        group.finish();
    }
    ran
}

/// A queue and the temporary directory holding its files (dropped in this order).
struct Instance<Q> {
    queue: Q,
    _dir: TempDir,
}

impl<Q: QueueUnderTest> Instance<Q> {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self {
            queue: Q::open(dir.path()),
            _dir: dir,
        }
    }
}

/// Benchmarks side `Q` as function `Q::NAME` of `group`, on one fresh queue instance that
/// lives for the whole benchmark (created only if the benchmark is not filtered out); adds
/// it to `ran` if it ran.
fn run_group<Q: QueueUnderTest>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    kind: Group,
    ran: &mut Vec<Ran>,
) {
    let payloads = vec![common::payload(); BATCH];
    let mut instance: Option<Instance<Q>> = None;
    // `leased` carries the job leased by the previous iteration of `Cycle1AckNext`.
    let mut leased: Option<Q::Job> = None;
    group.bench_function(Q::NAME, |b| {
        let queue = &instance.get_or_insert_with(Instance::new).queue;
        match kind {
            Group::Concurrent {
                producers,
                consumers,
            } => b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| concurrent_run(queue, &payloads[0], producers, consumers))
                    .sum()
            }),
            _ => b.iter(|| iteration(queue, kind, &payloads, &mut leased, &mut Unmetered)),
        }
    });
    if instance.is_some() {
        ran.push((kind, bytes_row::<Q>));
    }
}

/// One iteration of `kind`'s body on `queue`, each call made through `probe`: `payloads` holds
/// `BATCH` payloads (a single call enqueues the first), `leased` the job a `Cycle1AckNext`
/// iteration leaves leased for the next one. A concurrent body's calls are not probed.
fn iteration<Q: QueueUnderTest>(
    queue: &Q,
    kind: Group,
    payloads: &[Vec<u8>],
    leased: &mut Option<Q::Job>,
    probe: &mut impl Probe,
) {
    let payload = &payloads[0];
    match kind {
        Group::Enqueue1 => probe.call("enqueue", || queue.enqueue(black_box(payload))),
        Group::Cycle1 => {
            probe.call("enqueue", || queue.enqueue(payload));
            let job = probe.call("dequeue", || queue.dequeue());
            let job = job.expect("the job just enqueued");
            probe.call("ack_with_effect", || queue.ack_with_effect(job));
        }
        Group::Cycle1AckNext => {
            probe.call("enqueue", || queue.enqueue(payload));
            let next = match leased.take() {
                Some(job) => probe.call("ack_and_dequeue_next", || queue.ack_and_dequeue_next(job)),
                // First iteration: nothing leased yet.
                None => probe.call("dequeue", || queue.dequeue()),
            };
            *leased = Some(next.expect("the job just enqueued"));
        }
        Group::Cycle1ExtendAck => {
            probe.call("enqueue", || queue.enqueue(payload));
            let job = probe.call("dequeue", || queue.dequeue());
            let job = job.expect("the job just enqueued");
            probe.call("extend", || queue.extend(&job));
            probe.call("ack", || queue.ack(job));
        }
        Group::CycleBatch100 => {
            probe.call("enqueue_batch", || queue.enqueue_batch(payloads));
            let jobs = probe.call("dequeue_batch", || queue.dequeue_batch(BATCH));
            assert_eq!(jobs.len(), BATCH, "dequeue_batch came back short");
            probe.call("ack_batch_with_effect", || {
                queue.ack_batch_with_effect(jobs)
            });
        }
        Group::Concurrent {
            producers,
            consumers,
        } => {
            concurrent_run(queue, payload, producers, consumers);
        }
    }
}

/// The bytes side `Q` writes in `kind`: `kind`'s body run on a fresh file, a warm-up first,
/// then about `BYTES_JOBS` jobs measured (as `pass` sizes them).
fn bytes_row<Q: QueueUnderTest>(kind: Group, pass: Pass) -> bytes::Row {
    let instance = Instance::<Q>::new();
    let queue = &instance.queue;
    let payloads = vec![common::payload(); BATCH];
    let mut leased: Option<Q::Job> = None;
    let per_iteration = kind.jobs_per_iteration();
    let (warm_up, measured) = pass.iterations(BYTES_JOBS, per_iteration);
    for _ in 0..warm_up {
        iteration(queue, kind, &payloads, &mut leased, &mut Unmetered);
    }
    let jobs = measured * per_iteration;
    bytes::measure(&kind.name(), Q::NAME, jobs, |meter| {
        for _ in 0..measured {
            iteration(queue, kind, &payloads, &mut leased, meter);
        }
    })
}

/// `producers` threads enqueue `CONCURRENT_JOBS` jobs between them while `consumers`
/// threads lease and ack them with effects (each ack leasing the next job); returns the wall
/// time from the start signal until every job is acked.
fn concurrent_run<Q: QueueUnderTest>(
    queue: &Q,
    payload: &[u8],
    producers: usize,
    consumers: usize,
) -> Duration {
    assert_eq!(CONCURRENT_JOBS % producers, 0);
    let per_producer = CONCURRENT_JOBS / producers;
    let gate = Gate::new(CONCURRENT_JOBS);
    let start = Barrier::new(producers + consumers + 1);
    thread::scope(|s| {
        let mut threads = Vec::with_capacity(producers + consumers);
        for _ in 0..producers {
            threads.push(s.spawn(|| {
                start.wait();
                for _ in 0..per_producer {
                    queue.enqueue(payload);
                    gate.publish();
                }
            }));
        }
        for _ in 0..consumers {
            threads.push(s.spawn(|| {
                start.wait();
                // A worker loop: each job is acked together with leasing the next one, in
                // one transaction; a permit is claimed before every lease, so each finds a
                // committed job. The last job of a consumer is acked alone.
                if !gate.claim() {
                    return;
                }
                let mut job = queue.dequeue().expect("a committed job must be ready");
                while gate.claim() {
                    job = queue
                        .ack_and_dequeue_next(job)
                        .expect("a committed job must be ready");
                }
                queue.ack_with_effect(job);
            }));
        }
        start.wait();
        let started = Instant::now();
        for thread in threads {
            thread.join().expect("benchmark thread panicked");
        }
        started.elapsed()
    })
}

/// The physical limit: one 64-byte append plus `sync_data` per iteration (`fsync`), and,
/// for reference, one 64-byte overwrite inside a preallocated file plus `sync_data`
/// (`fsync_overwrite`: no size change, so no file-system metadata to commit; SQLite's WAL
/// is in that regime once it has wrapped around after a checkpoint).
fn fsync_limit(c: &mut Criterion) {
    const PREALLOCATED: u64 = 1 << 20;
    let mut group = c.benchmark_group("fsync_limit");
    configure(&mut group, 1, false);
    let record = common::payload();
    let mut append = None;
    group.bench_function("fsync", |b| {
        let (file, _) = append.get_or_insert_with(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.path().join("fsync.log"))
                .expect("open");
            (file, dir)
        });
        b.iter(|| {
            file.write_all(&record).expect("write");
            file.sync_data().expect("sync_data");
        });
    });
    let mut overwrite = None;
    let mut offset = 0;
    group.bench_function("fsync_overwrite", |b| {
        let (file, _) = overwrite.get_or_insert_with(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(dir.path().join("fsync.dat"))
                .expect("open");
            // Really allocate the blocks (not a sparse file), durably.
            let zeros = vec![0; 1 << 16];
            for _ in 0..PREALLOCATED / (1 << 16) {
                file.write_all(&zeros).expect("preallocate");
            }
            file.sync_all().expect("sync_all");
            (file, dir)
        });
        b.iter(|| {
            // A seek and a write (portable; the same bytes as a positional write).
            file.seek(SeekFrom::Start(offset)).expect("seek");
            file.write_all(&record).expect("write");
            file.sync_data().expect("sync_data");
            offset = (offset + record.len() as u64) % PREALLOCATED;
        });
    });
    group.finish();
}

/// `LEASEQ_BENCH_PROFILE=<side>:<iterations>` runs that many iterations of the
/// `cycle_batch_100` body on one side (`leaseq`, `leaseq_live_reads`, `leaseq_no_metrics`,
/// `leaseq_no_journal`, `leaseq_limited`, `leaseq_no_reserve`, `redb_floor` or `sqlite`) and exits, without
/// criterion: for profilers that count instructions (`valgrind --tool=callgrind`), where two
/// iteration counts apart give the cost of one iteration without the set-up.
/// `<side>:<iterations>:<producers>x<consumers>` runs that many iterations of a concurrent
/// group's body instead (`/usr/bin/time -v` around it gives the CPU time and context switches
/// of the whole run, every thread included).
fn profile(spec: &str) {
    let mut parts = spec.split(':');
    let (side, iterations) = (
        parts.next().expect("<side>"),
        parts.next().expect("<side>:<iterations>"),
    );
    let iterations: usize = iterations.parse().expect("a number of iterations");
    if let Some(shape) = parts.next() {
        let (p, c) = shape.split_once('x').expect("<producers>x<consumers>");
        let (p, c): (usize, usize) = (p.parse().expect("producers"), c.parse().expect("consumers"));
        fn concurrent<Q: QueueUnderTest>(iterations: usize, p: usize, c: usize) {
            let instance = Instance::<Q>::new();
            let payload = common::payload();
            let took: Duration = (0..iterations)
                .map(|_| concurrent_run(&instance.queue, &payload, p, c))
                .sum();
            let jobs = (iterations * CONCURRENT_JOBS) as f64;
            eprintln!(
                "{}: {iterations} runs of {p}x{c}, {:.0} jobs/s",
                Q::NAME,
                jobs / took.as_secs_f64()
            );
        }
        match side {
            "leaseq" => concurrent::<leaseq_side::LeaseqQueue>(iterations, p, c),
            "redb_floor" => concurrent::<redb_floor::FloorQueue>(iterations, p, c),
            "sqlite" => concurrent::<SqliteQueue>(iterations, p, c),
            other => panic!("unknown side {other}"),
        }
        return;
    }
    fn run<Q: QueueUnderTest>(iterations: usize) {
        let instance = Instance::<Q>::new();
        let payloads = vec![common::payload(); BATCH];
        // Unmetered calls: an instruction count must not include reads of the counter.
        let before = bytes::written();
        for _ in 0..iterations {
            let body = Group::CycleBatch100;
            iteration(&instance.queue, body, &payloads, &mut None, &mut Unmetered);
        }
        let per_iteration = before.zip(bytes::written()).map_or_else(
            || "n/a".to_string(),
            |(b, a)| ((a - b) / iterations.max(1) as u64).to_string(),
        );
        eprintln!(
            "{}: {per_iteration} bytes written to storage per iteration",
            Q::NAME
        );
    }
    match side {
        "leaseq" => run::<leaseq_side::LeaseqQueue>(iterations),
        "leaseq_live_reads" => run::<leaseq_side::LeaseqQueue<true>>(iterations),
        "leaseq_no_metrics" => run::<leaseq_side::LeaseqQueue<false, false>>(iterations),
        "leaseq_no_journal" => run::<leaseq_side::LeaseqQueue<false, true, false>>(iterations),
        "leaseq_limited" => run::<leaseq_side::LeaseqQueue<false, true, true, true>>(iterations),
        "leaseq_no_reserve" => {
            run::<leaseq_side::LeaseqQueue<false, true, true, false, false>>(iterations)
        }
        "redb_floor" => run::<redb_floor::FloorQueue>(iterations),
        "sqlite" => run::<SqliteQueue>(iterations),
        other => panic!("unknown side {other}"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("LEASEQ_BENCH_PROFILE") {
        return profile(&spec);
    }
    sqlite::self_check();
    redb_floor::self_check();
    let mut c = Criterion::default().configure_from_args();
    fsync_limit(&mut c);
    let ran = queue_groups(&mut c);
    c.final_summary();
    // The bytes pass, after criterion (whose clock it would disturb).
    let pass = Pass::from_args();
    if pass != Pass::Skip {
        let rows: Vec<bytes::Row> = ran.iter().map(|&(kind, row)| row(kind, pass)).collect();
        bytes::report(pass, &rows);
    }
}
