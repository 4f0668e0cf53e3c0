//! C08 (crash-recovery): seeded runs in which a child process (this test binary re-run)
//! drives a random workload on one queue file and is SIGKILLed at a random moment; the parent
//! reopens the file and checks every promise made by the calls the child reported as `Ok`.
//! Scenario ids refer to docs/testing.md (Scenarios).
//!
//! Protocol. The child reports each call's outcome with `say()` only after the call returned
//! (`ENQ`, `DEQ`, `ACK`, `ACKW`, ...), and reports `TRY <id> <token>` *before* every call that
//! can remove a job (ack, ack_with, their batch and and-next forms). A kill can land after a
//! commit and before its report, so a job may be missing after a crash only if its ack was
//! reported, or an ack on it was started and its outcome never reported.
//!
//! Each run uses one file for 2 or 3 rounds of: spawn a child on it, let it report a random
//! number of outcomes (or kill it during startup, open, repair or lease recovery), wait a
//! random fraction of a commit, SIGKILL, then reopen and check (a quarter of the rounds skip
//! the check so the next child itself opens the crashed file). The child uses the wall clock,
//! leases as short as 10 ms (so leases expire, tokens go stale and attempts run out), one or
//! two threads (group commits shared between them, with injected `ack_with` failures that
//! abort a shared group).
//!
//! Knobs: `LEASEQ_KILL_RUNS` (default 200), `LEASEQ_KILL_SEED` (base seed; run `i` uses
//! `seed + i`), `LEASEQ_KILL_PARALLEL` (runs at a time, default 2).

use crate::common;
use crate::common::{ChildProc, child_scenario, ms, say};
use crate::io_faults::{FaultPlan, Injector};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobId, JobInfo, JobState, Lease, Queue};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The child side's test name.
pub(crate) const ENTRY: &str = "process_kill::child_entry_process_kill";

/// The caller's own table that `ack_with` effects increment: one counter per effect key.
const EFFECTS: TableDefinition<&str, u64> = TableDefinition::new("kill_effects");

const RUNS_DEFAULT: u64 = 200;

const BASE_SEED_DEFAULT: u64 = 0xC08_0000;

/// Idempotency keys shared by many jobs of a run (so `AlreadyApplied` happens, across rounds).
const SHARED_IDEM_KEYS: u32 = 12;

/// Dedup keys shared by many jobs of a run (so `Duplicate` happens).
const SHARED_DEDUP_KEYS: u32 = 6;

/// A child still alive after this long is stuck (a deadlock): it says so and exits.
const CHILD_WATCHDOG: Duration = Duration::from_secs(30);

/// The number in the environment variable `name`, or `default` when it is not set.
pub(crate) fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}

/// splitmix64: independent streams for the child's threads and the parent's choices.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a child of round `round` of run `seed` runs with; both sides derive it.
#[derive(Debug, Clone, Copy)]
struct Plan {
    threads: u64,
    lease_ms: u64,
    max_attempts: u32,
    /// The child opens with `Builder::live_reads`; the parent then reads beside it.
    live_reads: bool,
    /// The child's `Builder::disk_reserve` (`None`: the default). On a small disk its
    /// enqueues meet it (refused `StorageFull`, reported `FULL`) or, with 0, the full disk.
    disk_reserve: Option<u64>,
    /// The child's `Builder::file_bytes_max` (with a 256 KiB reserve): an eighth of the
    /// rounds run at a file limit about 1.5 MiB above the journal, so enqueues meet it
    /// (`FULL`) and injected faults (ENOSPC among them) strike a file at its limit.
    file_bytes_max: Option<u64>,
}

fn plan(seed: u64, round: u64) -> Plan {
    let mut rng = fastrand::Rng::with_seed(mix(seed, 0x1000 + round));
    Plan {
        threads: rng.u64(1..=2),
        lease_ms: [10, 40, 150, 30_000][rng.usize(0..4)],
        max_attempts: rng.u32(2..=5),
        live_reads: rng.bool(),
        disk_reserve: [None, Some(0), Some(64 << 10), Some(256 << 10)][rng.usize(0..4)],
        file_bytes_max: (rng.u32(0..8) == 0).then_some((4 << 20) + 4096 + (3 << 19)),
    }
}

/// The idempotency and dedup keys a job's payload names (`<tag>/<idem>/<dedup>`, `-` = none).
fn keys_of(payload: &str) -> Option<(Option<String>, Option<String>)> {
    let mut parts = payload.split('/');
    let (_tag, idem, dedup) = (parts.next()?, parts.next()?, parts.next()?);
    let key = |k: &str| (k != "-").then(|| k.to_string());
    Some((key(idem), key(dedup)))
}

/// The counter an `ack_with` of job `id` increments: its idempotency key, or `#<id>`.
fn effect_key(id: u64, idem: Option<&str>) -> String {
    idem.map_or_else(|| format!("#{id}"), str::to_string)
}

// ------------------------------------------------------------------------------------------
// Child side
// ------------------------------------------------------------------------------------------

/// The child: opens the file, runs the workload on one or two threads until it is killed.
#[test]
fn child_entry_process_kill() {
    let Some((scenario, path)) = child_scenario() else {
        return; // Only meaningful when re-executed by the parent test.
    };
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_WATCHDOG);
        say("ERR watchdog: the child was not killed within 30 s (a hang?)");
        std::process::exit(3);
    });
    let mut words = scenario.split(' ').map(|w| w.parse::<u64>().unwrap());
    let (seed, round) = (words.next().unwrap(), words.next().unwrap());
    let p = plan(seed, round);
    if faults_expected() {
        // The parent switches the faults on now (io_faults.rs), then lets the child go.
        say("HELLO");
        let go = go_file(&path);
        let started = Instant::now();
        while !go.exists() {
            if started.elapsed() > Duration::from_secs(10) {
                fatal("the parent never said go".to_string());
            }
            std::thread::sleep(ms(1));
        }
    }
    let open = || {
        let b = Queue::builder()
            .retry(leaseq::RetryPolicy::immediate())
            .lease(ms(p.lease_ms))
            .max_attempts(p.max_attempts)
            .live_reads(p.live_reads);
        match (p.file_bytes_max, p.disk_reserve) {
            (Some(max), _) => b.disk_reserve(256 << 10).file_bytes_max(Some(max)),
            (None, Some(bytes)) => b.disk_reserve(bytes),
            (None, None) => b,
        }
        .open(&path)
    };
    let mut q = match open() {
        Ok(q) => q,
        Err(e) => io_failure("open", e),
    };
    let mut start = fastrand::Rng::with_seed(mix(seed, round << 8 | 0xFF));
    if faults_expected() && start.u32(0..100) < 20 {
        // Under faults, what needs the only handle: a compaction, or a close and a reopen.
        if start.bool() {
            match q.compact() {
                Ok(_) => say("COMPACT"),
                Err(e) => io_failure("compact", e),
            }
        } else {
            drop(q);
            q = match open() {
                Ok(q) => q,
                Err(e) => io_failure("reopen", e),
            };
            say("REOPEN");
        }
    }
    if p.file_bytes_max.is_some() {
        pad_to_the_limit(&q);
    }
    say("OPEN");
    let workers: Vec<_> = (0..p.threads)
        .map(|t| {
            let mut w = Worker {
                q: q.clone(),
                rng: fastrand::Rng::with_seed(mix(seed, (round << 8) | t)),
                tag: format!("r{round}t{t}"),
                jobs_made: 0,
                held: Vec::new(),
                dead: Vec::new(),
            };
            std::thread::spawn(move || {
                let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run()));
                if let Err(p) = panicked {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                    fatal(format!("worker panicked: {msg:?}"));
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    fatal("a worker ended".to_string());
}

/// Set in a child that runs under injected I/O faults (io_faults.rs): I/O errors are then
/// expected outcomes, reported with `IOERR` instead of failing the run.
pub(crate) const FAULTS_ENV: &str = "LEASEQ_CHILD_FAULTS";

fn faults_expected() -> bool {
    std::env::var_os(FAULTS_ENV).is_some()
}

/// The file whose creation lets a fault-injected child open its queue (faults armed).
pub(crate) fn go_file(path: &Path) -> std::path::PathBuf {
    path.with_extension("go")
}

/// Whether `e` is what a failing disk gives (an I/O error from redb or from leaseq's own file
/// calls, a commit whose outcome is unknown), as opposed to a refusal or a broken promise.
fn is_io(e: &Error) -> bool {
    // EINTR must never surface (the standard library retries it): a finding if it does.
    if e.to_string().contains("(os error 4)") {
        return false;
    }
    match e {
        Error::Io(_) | Error::CommitFailed { .. } => true,
        // Only redb's I/O errors: any other storage error is a finding.
        Error::Storage(redb::Error::Io(_) | redb::Error::PreviousIo) => true,
        // An `ack_with` closure whose own table write failed on the disk: leaseq reports the
        // closure's error, which is the storage engine's.
        Error::Effect(inner) => matches!(
            inner.downcast_ref::<redb::StorageError>(),
            Some(redb::StorageError::Io(_) | redb::StorageError::PreviousIo)
        ),
        _ => false,
    }
}

/// A call failed with `e`. Under injected faults an I/O error is an outcome: the call is in
/// doubt (the model treats it as unreported), the child says so and exits (see
/// [`Worker::failed`]); anything else is fatal.
fn io_failure(what: &str, e: Error) -> ! {
    if faults_expected() && is_io(&e) {
        // Held to the exit, so no other thread leaves half a line behind.
        let _stdout = std::io::stdout().lock();
        say(format!("IOERR {what} {}", e.to_string().replace('\n', " ")));
        say("DONE");
        std::process::exit(0);
    }
    fatal(format!("{what}: {e:?}"))
}

/// A round at a file limit: 1 KiB jobs in the queue `pad` (outside the model) until the file
/// is storage full, then 600 of them acked, so the round's workload runs at the limit (its
/// enqueues meet it again, reported `FULL`) and injected faults strike a file there.
fn pad_to_the_limit(q: &Queue) {
    let pad = q.named("pad").unwrap_or_else(|e| io_failure("pad", e));
    let kib = [b'p'; 1024];
    let mut n = 0usize;
    // In batches of 32 while they fit (a large batch is refused before the limit), then one
    // at a time until the file turns full.
    for size in [32, 1] {
        while n < 20_000 {
            match pad.enqueue_batch((0..size).map(|_| (&kib[..], EnqueueOptions::default()))) {
                Ok(_) => n += size,
                Err(Error::StorageFull { .. }) => {
                    say("FULL");
                    break;
                }
                Err(e) => io_failure("pad enqueue", e),
            }
        }
    }
    let taken = pad
        .dequeue_batch(600)
        .unwrap_or_else(|e| io_failure("pad dequeue", e));
    match pad.ack_batch(&taken) {
        _ if taken.is_empty() => {}
        Ok(outcomes) => {
            if let Some(Err(e)) = outcomes.into_iter().find(Result::is_err) {
                io_failure("pad ack", e)
            }
        }
        Err(e) => io_failure("pad ack", e),
    }
    say(format!("PAD {n}"));
}

/// Reports an unexpected outcome and stops this thread (the parent fails the run).
fn fatal(msg: String) -> ! {
    say(format!("ERR {}", msg.replace('\n', " ")));
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Adds one to the effect counter of `key` in the caller's own table.
fn bump(tx: &redb::WriteTransaction, key: &str) -> Result<(), leaseq::BoxError> {
    let mut t = tx.open_table(EFFECTS)?;
    let n = t.get(key)?.map_or(0, |v| v.value());
    t.insert(key, n + 1)?;
    Ok(())
}

struct Worker {
    q: Queue,
    rng: fastrand::Rng,
    tag: String,
    jobs_made: u64,
    held: Vec<Lease>,
    dead: Vec<JobId>,
}

fn payload_of(l: &Lease) -> String {
    String::from_utf8(l.payload().to_vec()).unwrap()
}

fn lease_key(l: &Lease) -> String {
    let (idem, _) = keys_of(&payload_of(l)).expect("payload names its keys");
    effect_key(l.id().0, idem.as_deref())
}

fn report_lease(l: &Lease) {
    say(format!(
        "DEQ {} {} {} {}",
        l.id(),
        l.attempt(),
        l.token(),
        payload_of(l)
    ));
}

impl Worker {
    /// A call failed with `e`: fatal, unless it is an I/O error under injected faults. Then
    /// the handle must stay failed (redb fails every later call after an I/O error, and
    /// leaseq every write after a failed commit: no later `Ok` may claim durability the disk
    /// did not give, the fsyncgate lesson), which one more enqueue checks; the child exits.
    fn failed(&self, what: impl std::fmt::Display, e: Error) -> ! {
        if faults_expected() && is_io(&e) {
            match self.q.enqueue(&b"after/-/-"[..], EnqueueOptions::default()) {
                Ok(id) => fatal(format!(
                    "{what} failed ({e}), then an enqueue on the same handle returned Ok ({id:?})"
                )),
                Err(after) if is_io(&after) => {}
                Err(after) => fatal(format!("{what} failed ({e}), then an enqueue: {after:?}")),
            }
        }
        io_failure(&what.to_string(), e)
    }

    fn run(&mut self) {
        loop {
            match self.rng.u32(0..112) {
                0..=21 => self.enqueue(),
                22..=25 => self.enqueue_batch(),
                26..=45 => self.dequeue(),
                46..=54 => self.ack(),
                55..=65 => self.ack_with(),
                66..=67 => self.ack_and_next(),
                68..=69 => self.ack_with_and_next(),
                70..=71 => self.ack_batch(),
                72..=73 => self.ack_with_batch(),
                74..=79 => self.nack(),
                80..=84 => self.extend(),
                85..=87 => self.fail(),
                88..=89 => self.abandon(),
                90..=93 => self.requeue_dead(),
                94..=98 => self.snooze(),
                99..=103 => self.outbox(),
                104..=105 => self.prune(),
                _ => std::thread::sleep(ms(self.rng.u64(1..20))),
            }
        }
    }

    fn job_spec(&mut self) -> (String, EnqueueOptions) {
        self.jobs_made += 1;
        let r = &mut self.rng;
        let idem = match r.u32(0..100) {
            0..35 => format!("k{}", r.u32(0..SHARED_IDEM_KEYS)),
            35..60 => format!("u{}n{}", self.tag, self.jobs_made),
            _ => "-".to_string(),
        };
        let dedup = if r.u32(0..100) < 30 {
            format!("d{}", r.u32(0..SHARED_DEDUP_KEYS))
        } else {
            "-".to_string()
        };
        let payload = format!("{}n{}/{idem}/{dedup}", self.tag, self.jobs_made);
        let mut o = EnqueueOptions::default().priority(r.i32(-2..=2));
        if idem != "-" {
            o = o.idempotency_key(&idem);
        }
        if dedup != "-" {
            o = o.dedup_key(&dedup);
        }
        if r.u32(0..100) < 15 {
            o = o.delay(ms(r.u64(1..30)));
        }
        if r.u32(0..100) < 15 {
            o = o.max_attempts(r.u32(1..=3));
        }
        if r.u32(0..100) < 15 {
            o = o.lease(ms(r.u64(5..100)));
        }
        (payload, o)
    }

    fn report_enqueued(e: Enqueued, payload: &str) {
        match e {
            Enqueued::New(id) => say(format!("ENQ {id} {payload}")),
            Enqueued::Duplicate(id) | Enqueued::DuplicateDead(id) | Enqueued::Replaced(id) => {
                let (_, dedup) = keys_of(payload).unwrap();
                say(format!(
                    "DUP {id} {}",
                    dedup.expect("only dedup keys duplicate")
                ));
            }
        }
    }

    fn enqueue(&mut self) {
        let (payload, opts) = self.job_spec();
        match self.q.enqueue(payload.as_bytes(), opts) {
            Ok(e) => Self::report_enqueued(e, &payload),
            // The disk reserve met: refused, nothing stored (no job reported).
            Err(Error::StorageFull { .. }) => say("FULL"),
            Err(e) => self.failed("enqueue", e),
        }
    }

    fn enqueue_batch(&mut self) {
        let n = self.rng.usize(2..=4);
        let specs: Vec<_> = (0..n).map(|_| self.job_spec()).collect();
        let jobs = specs.iter().map(|(p, o)| (p.as_bytes(), o.clone()));
        match self.q.enqueue_batch(jobs) {
            Ok(res) => {
                for (e, (payload, _)) in res.into_iter().zip(&specs) {
                    Self::report_enqueued(e, payload);
                }
            }
            Err(Error::StorageFull { .. }) => say("FULL"),
            Err(e) => self.failed("enqueue_batch", e),
        }
    }

    fn dequeue(&mut self) {
        if self.held.len() >= 4 {
            return self.ack();
        }
        let got = match self.rng.u32(0..3) {
            0 => self.q.dequeue().map(|l| l.into_iter().collect()),
            1 => self
                .q
                .dequeue_timeout(ms(self.rng.u64(1..10)))
                .map(|l| l.into_iter().collect()),
            _ => self.q.dequeue_batch(self.rng.usize(1..=3)),
        };
        match got {
            Ok(leases) => {
                for l in leases {
                    report_lease(&l);
                    self.held.push(l);
                }
            }
            Err(e) => self.failed("dequeue", e),
        }
    }

    /// Takes one held lease at random, or dequeues (and returns `None`) if none is held.
    fn take(&mut self) -> Option<Lease> {
        if self.held.is_empty() {
            self.dequeue();
            return None;
        }
        let i = self.rng.usize(0..self.held.len());
        Some(self.held.swap_remove(i))
    }

    fn take_some(&mut self) -> Vec<Lease> {
        let n = self.rng.usize(1..=3).min(self.held.len());
        // May hold a stale and the current lease of one job (a redelivery to this thread).
        (0..n).filter_map(|_| self.take()).collect()
    }

    fn ack(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok) = (l.id(), l.token());
        say(format!("TRY {id} {tok}"));
        match l.ack() {
            Ok(()) => say(format!("ACK {id} {tok}")),
            Err(Error::LeaseLost { .. }) => say(format!("LOST {id} {tok}")),
            Err(e) => self.failed(format!("ack {id}"), e),
        }
    }

    fn ack_with(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok, key) = (l.id(), l.token(), lease_key(&l));
        let inject = self.rng.u32(0..100) < 8;
        say(format!("TRY {id} {tok}"));
        let r = l.ack_with(|tx| {
            bump(tx, &key)?;
            if inject {
                return Err("injected effect failure".into());
            }
            Ok(())
        });
        match r {
            Ok(a) => say(format!("ACKW {id} {tok} {key} {}", applied_word(a))),
            Err(Error::Effect(_)) if inject => say(format!("EFFERR {id} {tok}")),
            Err(Error::LeaseLost { .. }) => say(format!("LOST {id} {tok}")),
            Err(e) => self.failed(format!("ack_with {id}"), e),
        }
    }

    fn ack_and_next(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok) = (l.id(), l.token());
        say(format!("TRY {id} {tok}"));
        match l.ack_and_next() {
            Ok(next) => {
                say(format!("ACK {id} {tok}"));
                if let Some(n) = next {
                    report_lease(&n);
                    self.held.push(n);
                }
            }
            Err(Error::LeaseLost { .. }) => say(format!("LOST {id} {tok}")),
            Err(e) => self.failed(format!("ack_and_next {id}"), e),
        }
    }

    fn ack_with_and_next(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok, key) = (l.id(), l.token(), lease_key(&l));
        say(format!("TRY {id} {tok}"));
        match l.ack_with_and_next(|tx| bump(tx, &key)) {
            Ok((a, next)) => {
                say(format!("ACKW {id} {tok} {key} {}", applied_word(a)));
                if let Some(n) = next {
                    report_lease(&n);
                    self.held.push(n);
                }
            }
            Err(Error::LeaseLost { .. }) => say(format!("LOST {id} {tok}")),
            Err(e) => self.failed(format!("ack_with_and_next {id}"), e),
        }
    }

    fn ack_batch(&mut self) {
        let ls = self.take_some();
        if ls.is_empty() {
            return;
        }
        let ids: Vec<_> = ls.iter().map(|l| (l.id(), l.token())).collect();
        for (id, tok) in &ids {
            say(format!("TRY {id} {tok}"));
        }
        match self.q.ack_batch(&ls) {
            Ok(outcomes) => {
                for ((i, t), r) in ids.iter().zip(outcomes) {
                    match r {
                        Ok(()) => say(format!("ACK {i} {t}")),
                        Err(Error::LeaseLost { .. }) => say(format!("LOST {i} {t}")),
                        Err(e) => self.failed(format!("ack_batch {i}"), e),
                    }
                }
            }
            Err(e) => self.failed(format!("ack_batch {ids:?}"), e),
        }
    }

    fn ack_with_batch(&mut self) {
        let ls = self.take_some();
        if ls.is_empty() {
            return;
        }
        let ids: Vec<_> = ls
            .iter()
            .map(|l| (l.id(), l.token(), lease_key(l)))
            .collect();
        for (id, tok, _) in &ids {
            say(format!("TRY {id} {tok}"));
        }
        match self.q.ack_with_batch(&ls, |tx, l| bump(tx, &lease_key(l))) {
            Ok(outcomes) => {
                for ((id, tok, key), r) in ids.iter().zip(outcomes) {
                    match r {
                        Ok(a) => say(format!("ACKW {id} {tok} {key} {}", applied_word(a))),
                        Err(Error::LeaseLost { .. }) => say(format!("LOST {id} {tok}")),
                        Err(e) => self.failed(format!("ack_with_batch {id}"), e),
                    }
                }
            }
            Err(e) => self.failed(format!("ack_with_batch {ids:?}"), e),
        }
    }

    fn nack(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok) = (l.id(), l.token());
        let r = if self.rng.bool() {
            l.nack("nacked")
        } else {
            l.nack_after("backing off", ms(self.rng.u64(1..40)))
        };
        match r {
            Ok(state) => {
                say(format!("NACK {id} {tok} {state:?}"));
                if state == JobState::Dead {
                    self.dead.push(id);
                }
            }
            Err(Error::LeaseLost { .. }) => say(format!("NLOST {id} {tok}")),
            Err(e) => self.failed(format!("nack {id}"), e),
        }
    }

    fn extend(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok) = (l.id(), l.token());
        match l.extend(ms(self.rng.u64(5..200))) {
            Ok(()) => {
                say(format!("EXT {id} {tok} {}", l.deadline_ms()));
                self.held.push(l);
            }
            Err(Error::LeaseLost { .. }) => say(format!("XLOST {id} {tok}")),
            Err(e) => self.failed(format!("extend {id}"), e),
        }
    }

    fn fail(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok) = (l.id(), l.token());
        match l.fail("failed on purpose") {
            Ok(()) => {
                say(format!("FAIL {id} {tok}"));
                self.dead.push(id);
            }
            Err(Error::LeaseLost { .. }) => say(format!("FLOST {id} {tok}")),
            Err(e) => self.failed(format!("fail {id}"), e),
        }
    }

    /// Drops a lease without ending it: it expires (or is recovered by the next open).
    fn abandon(&mut self) {
        let Some(l) = self.take() else { return };
        say(format!("DROP {} {}", l.id(), l.token()));
    }

    /// Gives the job back for later without charging the attempt (Oban's snooze): its
    /// attempts may go back by one, which `TRYSNZ` tells the model before the call.
    fn snooze(&mut self) {
        let Some(l) = self.take() else { return };
        let (id, tok) = (l.id(), l.token());
        say(format!("TRYSNZ {id}"));
        match l.snooze(ms(self.rng.u64(1..30))) {
            Ok(()) => say(format!("SNZ {id} {tok}")),
            Err(Error::LeaseLost { .. }) => say(format!("SLOST {id} {tok}")),
            Err(e) => self.failed(format!("snooze {id}"), e),
        }
    }

    /// The outbox: an effect in the caller's table and an enqueue in one transaction. The
    /// effect's key (`w:` and the payload's unique name) is reported with the job.
    fn outbox(&mut self) {
        let (payload, opts) = self.job_spec();
        let key = format!("w:{}", payload.split('/').next().unwrap());
        let r = self.q.write(|tx| {
            bump(tx.transaction(), &key)?;
            Ok(tx.enqueue(payload.as_bytes(), opts.clone())?)
        });
        match r {
            Ok(e) => {
                Self::report_enqueued(e, &payload);
                say(format!("WRITE {key}"));
            }
            // Refused inside the closure: the effect was not committed either.
            Err(Error::StorageFull { .. }) => say("FULL"),
            Err(e) => self.failed("write", e),
        }
    }

    fn prune(&mut self) {
        match self.q.prune() {
            Ok(_) => say("PRUNE"),
            Err(e) => self.failed("prune", e),
        }
    }

    fn requeue_dead(&mut self) {
        if self.dead.is_empty() {
            return self.enqueue();
        }
        let id = self.dead.swap_remove(self.rng.usize(0..self.dead.len()));
        say(format!("TRYRQ {id}"));
        match self.q.requeue_dead(id) {
            Ok(()) => say(format!("RQ {id}")),
            Err(e) => self.failed(format!("requeue_dead {id}"), e),
        }
    }
}

fn applied_word(a: Applied) -> &'static str {
    match a {
        Applied::Now => "now",
        Applied::AlreadyApplied => "already",
    }
}

// ------------------------------------------------------------------------------------------
// Parent side: the model of what the reported `Ok`s promised
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Default)]
struct JobModel {
    payload: Option<String>,
    idem: Option<String>,
    dedup: Option<String>,
    /// Reported dead (fail, or a nack that returned Dead) or seen dead at a check, and no
    /// requeue started since: must be dead.
    known_dead: bool,
    /// Highest attempt reported by a delivery (or seen at the last check).
    min_attempts: u32,
}

/// Counts of what the runs exercised, summed over all runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub(crate) rounds: u64,
    pub(crate) early_kills: u64,
    pub(crate) checks: u64,
    pub(crate) messages: u64,
    pub(crate) enqueued: u64,
    pub(crate) duplicates: u64,
    pub(crate) deliveries: u64,
    pub(crate) redeliveries: u64,
    pub(crate) acks: u64,
    pub(crate) effects_now: u64,
    pub(crate) effects_already: u64,
    pub(crate) lost_tokens: u64,
    pub(crate) effect_failures: u64,
    pub(crate) dead_reported: u64,
    pub(crate) requeues: u64,
    /// An ack started but unreported whose commit landed before the kill (job gone).
    pub(crate) inflight_ack_committed: u64,
    /// An ack started but unreported that never committed (job still there).
    pub(crate) inflight_ack_not_committed: u64,
    /// Jobs found at a check that no report mentioned (enqueue committed, report killed).
    pub(crate) unreported_jobs_found: u64,
    pub(crate) leases_recovered: u64,
    /// Reads beside a live child (live-read rounds): a `Reader` opened, checked clean.
    pub(crate) live_reads_checked: u64,
    pub(crate) snoozes: u64,
    pub(crate) outbox_writes: u64,
    /// Calls that failed with an I/O error under injected faults (io_faults.rs).
    pub(crate) io_errors: u64,
    /// Enqueues refused `StorageFull` (the disk reserve met).
    pub(crate) storage_full: u64,
    /// Rounds whose faults were armed in a running child, and those whose child stopped on
    /// an I/O error.
    pub(crate) fault_rounds: u64,
    pub(crate) fault_stops: u64,
    /// Reopens refused by a full file system, then done once space was freed.
    pub(crate) full_disk_opens: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        let pairs = [
            (&mut self.rounds, o.rounds),
            (&mut self.early_kills, o.early_kills),
            (&mut self.checks, o.checks),
            (&mut self.messages, o.messages),
            (&mut self.enqueued, o.enqueued),
            (&mut self.duplicates, o.duplicates),
            (&mut self.deliveries, o.deliveries),
            (&mut self.redeliveries, o.redeliveries),
            (&mut self.acks, o.acks),
            (&mut self.effects_now, o.effects_now),
            (&mut self.effects_already, o.effects_already),
            (&mut self.lost_tokens, o.lost_tokens),
            (&mut self.effect_failures, o.effect_failures),
            (&mut self.dead_reported, o.dead_reported),
            (&mut self.requeues, o.requeues),
            (&mut self.inflight_ack_committed, o.inflight_ack_committed),
            (
                &mut self.inflight_ack_not_committed,
                o.inflight_ack_not_committed,
            ),
            (&mut self.unreported_jobs_found, o.unreported_jobs_found),
            (&mut self.leases_recovered, o.leases_recovered),
            (&mut self.live_reads_checked, o.live_reads_checked),
            (&mut self.snoozes, o.snoozes),
            (&mut self.outbox_writes, o.outbox_writes),
            (&mut self.io_errors, o.io_errors),
            (&mut self.storage_full, o.storage_full),
            (&mut self.fault_rounds, o.fault_rounds),
            (&mut self.fault_stops, o.fault_stops),
            (&mut self.full_disk_opens, o.full_disk_opens),
        ];
        for (a, b) in pairs {
            *a += b;
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Model {
    jobs: BTreeMap<u64, JobModel>,
    /// Jobs whose ack was reported: token of that ack.
    acked: BTreeMap<u64, u64>,
    /// Jobs that are gone (acked, reported or not): must never be seen again.
    gone: BTreeSet<u64>,
    /// Ack calls started (`TRY`) whose outcome was not reported yet, per (job, token).
    pending: HashMap<(u64, u64), u32>,
    /// Jobs with an ack started and never reported back before a kill: may be gone.
    maybe_acked: BTreeSet<u64>,
    /// Jobs with a requeue_dead or a snooze started since the last check (attempts may have
    /// gone back).
    requeue_started: BTreeSet<u64>,
    /// Effect keys of every reported outbox `write`: their effect is 1.
    outbox_keys: BTreeSet<String>,
    /// `Applied::Now` reports per effect key: at most one, ever.
    now_reports: BTreeMap<String, u32>,
    /// Effect keys of every reported ack_with (Now or AlreadyApplied): their effect is 1.
    ackw_keys: BTreeSet<String>,
    /// `Duplicate(id)` results: (id, dedup key) to check against the named job.
    dup_claims: Vec<(u64, String)>,
    violations: Vec<String>,
    tally: Tally,
}

impl Model {
    fn violation(&mut self, v: String) {
        if self.violations.len() < 50 {
            self.violations.push(v);
        }
    }

    /// A job a report mentions with its payload: learn it, or check the payload is the same.
    fn learn(&mut self, id: u64, payload: &str) {
        let Some((idem, dedup)) = keys_of(payload) else {
            return self.violation(format!("job {id}: malformed payload {payload:?}"));
        };
        let j = self.jobs.entry(id).or_default();
        match &j.payload {
            Some(p) if p != payload => {
                let v = format!("job {id}: payload {payload:?}, enqueued as {p:?}");
                self.violation(v);
            }
            Some(_) => {}
            None => {
                j.payload = Some(payload.to_string());
                j.idem = idem;
                j.dedup = dedup;
            }
        }
    }

    fn resolve(&mut self, id: u64, tok: u64) {
        match self.pending.get_mut(&(id, tok)) {
            Some(n) if *n > 0 => *n -= 1,
            _ => self.violation(format!("outcome for job {id} token {tok} without a TRY")),
        }
    }

    /// Applies one message the child sent.
    fn apply(&mut self, msg: &str) {
        self.tally.messages += 1;
        let w: Vec<&str> = msg.split(' ').collect();
        let num = |i: usize| -> u64 {
            w.get(i)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("malformed message {msg:?}"))
        };
        match w[0] {
            "OPEN" | "RQ" | "EXT" | "DROP" | "SNZ" | "PRUNE" | "COMPACT" | "REOPEN" | "HELLO"
            | "DONE" | "PAD" => {}
            "IOERR" => self.tally.io_errors += 1,
            "FULL" => self.tally.storage_full += 1,
            "WRITE" => {
                self.tally.outbox_writes += 1;
                self.outbox_keys.insert(w[1].to_string());
            }
            "TRYSNZ" => {
                self.tally.snoozes += 1;
                self.requeue_started.insert(num(1));
            }
            "SLOST" => self.tally.lost_tokens += 1,
            "ENQ" => {
                let id = num(1);
                self.tally.enqueued += 1;
                // Another thread may have reported its delivery or ack first; an id handed out
                // twice shows up as two payloads (every payload is unique).
                self.learn(id, w[2]);
            }
            "DUP" => {
                self.tally.duplicates += 1;
                self.dup_claims.push((num(1), w[2].to_string()));
            }
            "DEQ" => {
                let (id, attempt, tok) = (num(1), num(2) as u32, num(3));
                self.tally.deliveries += 1;
                if attempt > 1 {
                    self.tally.redeliveries += 1;
                }
                if let Some(&acked_tok) = self.acked.get(&id)
                    && tok > acked_tok
                {
                    self.violation(format!(
                        "job {id} delivered with token {tok} after its ack with token {acked_tok}"
                    ));
                }
                self.learn(id, w[4]);
                let j = self.jobs.get_mut(&id).unwrap();
                j.min_attempts = j.min_attempts.max(attempt);
            }
            "TRY" => *self.pending.entry((num(1), num(2))).or_default() += 1,
            "ACK" | "ACKW" => {
                let (id, tok) = (num(1), num(2));
                self.resolve(id, tok);
                self.acked.insert(id, tok);
                self.gone.insert(id);
                if w[0] == "ACK" {
                    self.tally.acks += 1;
                    return;
                }
                let key = w[3].to_string();
                let expected = self
                    .jobs
                    .get(&id)
                    .map(|j| effect_key(id, j.idem.as_deref()));
                if expected.as_ref() != Some(&key) {
                    self.violation(format!(
                        "job {id}: ack_with under key {key}, expected {expected:?}"
                    ));
                }
                if w[4] == "now" {
                    self.tally.effects_now += 1;
                    let n = self.now_reports.entry(key.clone()).or_default();
                    *n += 1;
                    if *n > 1 {
                        self.violation(format!("effect key {key}: Applied::Now reported twice"));
                    }
                } else {
                    self.tally.effects_already += 1;
                }
                self.ackw_keys.insert(key);
            }
            "LOST" | "EFFERR" => {
                if w[0] == "LOST" {
                    self.tally.lost_tokens += 1;
                } else {
                    self.tally.effect_failures += 1;
                }
                self.resolve(num(1), num(2));
            }
            "NLOST" | "XLOST" | "FLOST" => self.tally.lost_tokens += 1,
            "NACK" | "FAIL" => {
                if w[0] == "FAIL" || w[3] == "Dead" {
                    self.tally.dead_reported += 1;
                    self.jobs.entry(num(1)).or_default().known_dead = true;
                }
            }
            "TRYRQ" => {
                let id = num(1);
                self.tally.requeues += 1;
                self.jobs.entry(id).or_default().known_dead = false;
                self.requeue_started.insert(id);
            }
            _ => self.violation(format!("child reported: {msg}")),
        }
    }

    /// After a kill: every ack started and not reported back may or may not have committed.
    fn end_round(&mut self) {
        for ((id, _), n) in self.pending.drain() {
            if n > 0 {
                self.maybe_acked.insert(id);
            }
        }
    }

    /// Checks a freshly reopened queue against everything the reports promised.
    fn check(&mut self, q: &Queue) {
        self.tally.checks += 1;
        let r = q.recovery();
        self.tally.leases_recovered += r.leases_returned + r.leases_dead_lettered;
        match q.check() {
            Ok(v) if v.is_empty() => {}
            Ok(v) => self.violation(format!("check(): {v:?}")),
            Err(e) => self.violation(format!("check() failed: {e:?}")),
        }
        let stats = match q.stats() {
            Ok(s) => s,
            Err(e) => return self.violation(format!("stats(): {e:?}")),
        };
        if stats.leased != 0 {
            self.violation(format!("{} leases survived the reopen", stats.leased));
        }

        // Every live job, by id (ids are never reused and start at 1).
        let mut present: BTreeMap<u64, JobInfo> = BTreeMap::new();
        let limit = self.jobs.keys().last().copied().unwrap_or(0) + 10_000;
        let mut id = 1;
        while (present.len() as u64) < stats.total {
            if id > limit {
                let v = format!(
                    "found {} of {} jobs below id {limit}",
                    present.len(),
                    stats.total
                );
                self.violation(v);
                break;
            }
            match q.job(JobId(id)) {
                Ok(Some(info)) => {
                    present.insert(id, info);
                }
                Ok(None) => {}
                Err(e) => self.violation(format!("job({id}): {e:?}")),
            }
            id += 1;
        }

        let mut dedup_holders: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for (&id, info) in &present {
            let str_of =
                |k: &Option<Vec<u8>>| k.as_ref().map(|k| String::from_utf8_lossy(k).into_owned());
            let (idem, dedup) = (str_of(&info.idempotency_key), str_of(&info.dedup_key));
            let mut v = Vec::new();
            if self.gone.contains(&id) {
                v.push(format!(
                    "job {id} was acked and reappeared ({:?})",
                    info.state
                ));
            }
            if !self.jobs.contains_key(&id) {
                self.tally.unreported_jobs_found += 1;
            }
            let j = self.jobs.entry(id).or_default();
            if j.payload.is_none() && j.idem.is_none() && j.dedup.is_none() {
                (j.idem, j.dedup) = (idem.clone(), dedup.clone());
            }
            if (&j.idem, &j.dedup) != (&idem, &dedup) {
                v.push(format!(
                    "job {id}: keys {idem:?}/{dedup:?}, enqueued with {:?}/{:?}",
                    j.idem, j.dedup
                ));
            }
            if let Some(p) = &j.payload
                && p.len() != info.payload_bytes
            {
                v.push(format!(
                    "job {id}: {} payload bytes, enqueued {}",
                    info.payload_bytes,
                    p.len()
                ));
            }
            if info.state == JobState::Leased {
                v.push(format!("job {id} is still leased after the reopen"));
            }
            if info.attempts > info.max_attempts {
                v.push(format!(
                    "job {id}: attempts {} > max {}",
                    info.attempts, info.max_attempts
                ));
            }
            if matches!(info.state, JobState::Ready | JobState::Scheduled)
                && info.attempts >= info.max_attempts
            {
                v.push(format!(
                    "job {id} is {:?} with no attempts left",
                    info.state
                ));
            }
            if j.known_dead && info.state != JobState::Dead {
                v.push(format!(
                    "job {id} was dead-lettered and is now {:?}",
                    info.state
                ));
            }
            if !self.requeue_started.contains(&id) && info.attempts < j.min_attempts {
                v.push(format!(
                    "job {id}: attempts went back from {} to {}",
                    j.min_attempts, info.attempts
                ));
            }
            j.known_dead = info.state == JobState::Dead;
            j.min_attempts = info.attempts;
            if let Some(k) = &info.dedup_key
                && let Some(other) = dedup_holders.insert(k.clone(), id)
            {
                v.push(format!(
                    "jobs {other} and {id} both hold dedup key {dedup:?}"
                ));
            }
            if self.maybe_acked.contains(&id) {
                self.tally.inflight_ack_not_committed += 1;
            }
            for x in v {
                self.violation(x);
            }
        }

        // No lost job: every job a report mentioned is present, or gone through an ack.
        let missing: Vec<u64> = self
            .jobs
            .keys()
            .copied()
            .filter(|id| !present.contains_key(id) && !self.gone.contains(id))
            .collect();
        for id in missing {
            if self.maybe_acked.contains(&id) {
                self.tally.inflight_ack_committed += 1;
                self.gone.insert(id);
            } else {
                self.violation(format!(
                    "job {id} is lost: reported enqueued or delivered, no ack started, now absent"
                ));
            }
        }
        self.maybe_acked.clear();
        self.requeue_started.clear();

        // Every Duplicate(id) named a job that holds that dedup key.
        for (id, key) in std::mem::take(&mut self.dup_claims) {
            let holds = self.jobs.get(&id).and_then(|j| j.dedup.clone());
            if holds.as_deref() != Some(key.as_str()) {
                self.violation(format!(
                    "Duplicate({id}) for dedup key {key}, but job {id} holds {holds:?}"
                ));
            }
        }

        self.check_effects(q, &present);
    }

    /// Each effect key's counter is at most 1, is 1 for every reported ack_with, and agrees
    /// with the applied marker; an id-keyed effect implies its job is gone.
    fn check_effects(&mut self, q: &Queue, present: &BTreeMap<u64, JobInfo>) {
        let counts: BTreeMap<String, u64> = {
            let rtx = q.database().begin_read().unwrap();
            match rtx.open_table(EFFECTS) {
                Ok(t) => t
                    .iter()
                    .unwrap()
                    .map(|e| {
                        let (k, v) = e.unwrap();
                        (k.value().to_string(), v.value())
                    })
                    .collect(),
                Err(redb::TableError::TableDoesNotExist(_)) => BTreeMap::new(),
                Err(e) => return self.violation(format!("effects table: {e}")),
            }
        };
        let mut v = Vec::new();
        for (k, &n) in &counts {
            if n > 1 {
                v.push(format!("effect {k} applied {n} times"));
            }
            if let Some(id) = k.strip_prefix('#').and_then(|s| s.parse::<u64>().ok())
                && present.contains_key(&id)
            {
                v.push(format!("effect {k} committed but job {id} was not acked"));
            }
        }
        for k in self.ackw_keys.iter().chain(&self.outbox_keys) {
            if counts.get(k) != Some(&1) {
                v.push(format!(
                    "ack_with of {k} reported Ok, effect count {:?}",
                    counts.get(k)
                ));
            }
        }
        let idem_keys: BTreeSet<String> = self
            .jobs
            .values()
            .filter_map(|j| j.idem.clone())
            .chain(
                counts
                    .keys()
                    .filter(|k| !k.starts_with('#') && !k.starts_with("w:"))
                    .cloned(),
            )
            .collect();
        for k in idem_keys {
            match q.is_applied(&k) {
                Ok(m) if m == (counts.get(&k) == Some(&1)) => {}
                Ok(m) => v.push(format!(
                    "key {k}: applied marker {m}, effect count {:?}",
                    counts.get(&k)
                )),
                Err(e) => v.push(format!("is_applied({k}): {e:?}")),
            }
        }
        for x in v {
            self.violation(x);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Parent side: the runs
// ------------------------------------------------------------------------------------------

/// Reads the file beside the running child: a live `Reader` whose `check()` is clean and
/// whose counts add up (a snapshot instead of live reads only when `child_may_be_gone`: it
/// stopped on an injected fault). Never disturbs the child (it writes nothing, takes no lease).
fn read_beside(path: &Path, model: &mut Model, child_may_be_gone: bool) {
    match leaseq::Reader::open(path) {
        Ok(r) => {
            if !r.is_live() && !child_may_be_gone {
                model.violation("a reader beside a live-read child read a snapshot".into());
            }
            match (r.check(), r.stats()) {
                (Ok(v), Ok(s)) if v.is_empty() && s.total == s.pending() + s.dead => {
                    model.tally.live_reads_checked += 1;
                }
                other => model.violation(format!("a reader beside the child: {other:?}")),
            }
        }
        Err(e) => model.violation(format!("a reader beside the child: {e:?}")),
    }
}

/// One seeded run: 2 or 3 rounds of spawn, kill, reopen, check on one file; with the I/O faults `faults` arms in each child (io_faults.rs) when given:
/// the child then waits after `HELLO` until the first faults are armed, and may stop on its
/// own after an I/O error (`IOERR`, `DONE`, exit status 0), which is the only way it may exit.
pub(crate) fn run_rounds(seed: u64, faults: Option<&Injector>) -> Result<Tally, String> {
    let dir = match faults.and_then(Injector::root) {
        Some(root) => tempfile::tempdir_in(root).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let path = dir.path().join("q.leaseq");
    let mut rng = fastrand::Rng::with_seed(mix(seed, 7));
    let mut model = Model::default();
    let rounds = rng.u64(2..=3);
    let mut log: Vec<String> = Vec::new();
    for round in 0..rounds {
        model.tally.rounds += 1;
        log.push(format!("--- round {round}: {:?}", plan(seed, round)));
        let scenario = format!("{seed} {round}");
        let fault_plan = faults.map(|f| f.plan(&mut rng, dir.path()));
        let mut child = match (faults, &fault_plan) {
            (Some(f), Some(fp)) => {
                log.push(format!("--- faults: {fp}"));
                let env = f.env(dir.path());
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let mut child = ChildProc::spawn_env(ENTRY, &scenario, &path, &env);
                match child.next_message().as_deref() {
                    Some("HELLO") => {}
                    other => model.violation(format!("a fault child began with {other:?}")),
                }
                if fp.at == 0 {
                    arm(f, fp, &mut child, dir.path(), &mut model);
                }
                std::fs::write(go_file(&path), b"").unwrap();
                child
            }
            _ => ChildProc::spawn(ENTRY, &scenario, &path),
        };
        let mut said = Vec::new();
        if rng.u32(0..100) < 12 {
            // Killed while starting, opening, repairing or recovering leases.
            model.tally.early_kills += 1;
            std::thread::sleep(ms(rng.u64(0..60)));
        } else {
            let mut k = rng.usize(1..=60);
            if let Some(fp) = &fault_plan {
                // Past the moment the faults are armed, so that every such round arms them.
                k = k.max(fp.at + rng.usize(1..=20));
            }
            // In a live-read round, a reader beside the child once, after this many messages.
            let read_at = plan(seed, round).live_reads.then(|| rng.usize(1..=k));
            while said.len() < k {
                if read_at == Some(said.len()) && said.iter().any(|m| m == "OPEN") {
                    // Under faults the child may have stopped on an I/O error already.
                    read_beside(&path, &mut model, faults.is_some());
                }
                if let (Some(f), Some(fp)) = (faults, &fault_plan)
                    && fp.at > 0
                    && fp.at == said.len()
                {
                    arm(f, fp, &mut child, dir.path(), &mut model);
                }
                match child.next_message() {
                    Some(m) => {
                        let err = m.starts_with("ERR");
                        said.push(m);
                        if err {
                            break;
                        }
                    }
                    None => break,
                }
            }
            // Land inside the next commit (an fsync here takes ~1-3 ms).
            std::thread::sleep(Duration::from_micros(rng.u64(0..3000)));
        }
        let exited = child.exited();
        said.extend(child.kill_and_collect());
        let _ = std::fs::remove_file(go_file(&path));
        match exited {
            None => {}
            // Under faults, the one way out: an I/O error reported, the handle found failed.
            Some(status)
                if faults.is_some() && status.success() && said.iter().any(|m| m == "DONE") =>
            {
                model.tally.fault_stops += 1;
            }
            Some(status) => model.violation(format!("the child exited on its own ({status})")),
        }
        for m in &said {
            model.apply(m);
        }
        log.extend(said);
        model.end_round();
        let last = round + 1 == rounds;
        if last || rng.u32(0..100) >= 25 {
            let mut reopened = Queue::open(&path);
            // A full disk may refuse the reopen (its repair and lease recovery write): with a
            // typed error naming it, and the file opens once space is freed.
            if let (Err(e), Some(f)) = (&reopened, faults)
                && f.relieve(dir.path(), e)
            {
                model.tally.full_disk_opens += 1;
                reopened = Queue::open(&path);
            }
            match reopened {
                Ok(q) => model.check(&q),
                Err(e) => model.violation(format!("reopen failed: {e:?}")),
            }
        } else {
            log.push("--- no check: the next child opens the crashed file".into());
        }
        if !model.violations.is_empty() {
            let tail = log[log.len().saturating_sub(40)..].join("\n  ");
            return Err(format!(
                "seed {seed} round {round}: {} violation(s):\n  {}\nlast messages:\n  {tail}",
                model.violations.len(),
                model.violations.join("\n  ")
            ));
        }
    }
    Ok(model.tally)
}

/// Arms `plan` in `child`: counted in `fault_rounds` when done; a child that is gone by then
/// (it stopped on an I/O error, or exited otherwise, which the round judges) arms nothing;
/// a failure while it still runs is a violation.
fn arm(f: &Injector, plan: &FaultPlan, child: &mut ChildProc, dir: &Path, model: &mut Model) {
    if child.exited().is_some() {
        return;
    }
    match f.arm(plan, child.pid(), dir) {
        Ok(()) => model.tally.fault_rounds += 1,
        Err(e) => {
            // libfiu removes its FIFOs as the child exits: wait a moment for its end.
            let gone = (0..100).any(|_| {
                std::thread::sleep(ms(10));
                child.exited().is_some()
            });
            if !gone {
                model.violation(format!("arming the faults failed: {e}"));
            }
        }
    }
}

/// Runs seeds `base..base + runs`, `parallel` at a time, with `faults` if given; prints the
/// tally under `name` and fails the test with every failed run's report (at most 3: the
/// runs stop after them) and `rerun`, how to rerun one.
pub(crate) fn run_many(
    name: &str,
    rerun: &str,
    runs: u64,
    base: u64,
    parallel: u64,
    faults: Option<&Injector>,
) -> Tally {
    let next = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    let total = Mutex::new(Tally::default());
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..parallel {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= runs || failures.lock().unwrap().len() >= 3 {
                        break;
                    }
                    match run_rounds(base + i, faults) {
                        Ok(t) => total.lock().unwrap().add(&t),
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            });
        }
    });
    let t = total.into_inner().unwrap();
    eprintln!(
        "{name}: {runs} runs in {:.1?} (base seed {base:#x}, {parallel} at a time)\n{t:#?}",
        started.elapsed()
    );
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} run(s) failed; rerun one with {rerun}\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    t
}

// C08: at least 200 seeded runs of random enq/deq/ack/ack_with/nack/extend/fail workloads
// SIGKILLed at random points; after each reopen: every job in exactly one state, indexes and
// jobs agree both ways (check()), no acknowledged job reappears, every enqueue that returned
// Ok is present or acked, each effect applied at most once and exactly once per reported
// ack_with, applied markers agree with the effects.
#[test]
fn sigkilled_workloads_keep_every_reported_promise() {
    if child_scenario().is_some() {
        return;
    }
    let runs = env_u64("LEASEQ_KILL_RUNS", RUNS_DEFAULT);
    let base = env_u64("LEASEQ_KILL_SEED", BASE_SEED_DEFAULT);
    let parallel = env_u64("LEASEQ_KILL_PARALLEL", 2).max(1);
    let t = run_many(
        "C08",
        "LEASEQ_KILL_SEED=<seed> LEASEQ_KILL_RUNS=1",
        runs,
        base,
        parallel,
        None,
    );
    if runs >= RUNS_DEFAULT {
        // The kills must land where the model is put to the test, or the runs prove little.
        assert!(
            t.inflight_ack_committed > 0,
            "no kill landed between an ack's commit and its report"
        );
        assert!(
            t.inflight_ack_not_committed > 0,
            "no kill landed inside an ack before its commit"
        );
        assert!(
            t.live_reads_checked > 0,
            "no reader ran beside a live-read child"
        );
        assert!(
            t.leases_recovered > 0 && t.effects_already > 0 && t.lost_tokens > 0,
            "{t:?}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// The checker itself can fail
// ------------------------------------------------------------------------------------------

/// Replays `msgs` into a fresh model, checks `path`, and returns the violations.
fn violations_for(path: &Path, msgs: &[String]) -> Vec<String> {
    let mut m = Model::default();
    for msg in msgs {
        m.apply(msg);
    }
    m.end_round();
    let q = Queue::open(path).unwrap();
    m.check(&q);
    m.violations
}

// C08's oracle is not vacuous: against a real file, honest reports pass, and each kind of
// broken promise (a reappearing acked job, a lost job, a double or missing effect, a marker
// disagreeing with its effect, a revived dead job, attempts going back, a bad Duplicate) is
// reported. An ack started but never reported may have committed: that job may be gone.
#[test]
fn kill_model_flags_every_kind_of_broken_promise() {
    if child_scenario().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let q = Queue::open(&path).unwrap();
    let enq = |payload: &str, o: EnqueueOptions| -> u64 {
        q.enqueue(payload.as_bytes(), o).unwrap().id().0
    };
    let a = enq("x/k1/-", EnqueueOptions::default().idempotency_key("k1"));
    let b = enq("x/-/d1", EnqueueOptions::default().dedup_key("d1"));
    let c = enq("x/-/-", EnqueueOptions::default());
    let d = enq("x/-/-", EnqueueOptions::default());
    let la = q.dequeue().unwrap().unwrap();
    let ta = la.token();
    assert_eq!(la.ack_with(|tx| bump(tx, "k1")).unwrap(), Applied::Now);
    let lb = q.dequeue().unwrap().unwrap();
    assert_eq!(lb.id().0, b);
    lb.nack("back").unwrap(); // b: Scheduled (the default retry policy backs off), attempts 1
    let lc = q.dequeue().unwrap().unwrap();
    assert_eq!(lc.id().0, c);
    let tc = lc.token();
    lc.fail("dead").unwrap();
    let ld = q.dequeue().unwrap().unwrap();
    let td = ld.token();
    assert_eq!(ld.id().0, d);
    ld.ack().unwrap(); // d: acked, never reported
    drop((la, lb, lc, ld)); // every lease holds the file open
    drop(q);

    let honest: Vec<String> = [
        format!("ENQ {a} x/k1/-"),
        format!("ENQ {b} x/-/d1"),
        format!("ENQ {c} x/-/-"),
        format!("ENQ {d} x/-/-"),
        format!("DEQ {a} 1 {ta} x/k1/-"),
        format!("TRY {a} {ta}"),
        format!("ACKW {a} {ta} k1 now"),
        format!("DUP {b} d1"),
        format!("DEQ {c} 1 {tc} x/-/-"),
        format!("FAIL {c} {tc}"),
        format!("DEQ {d} 1 {td} x/-/-"),
        format!("TRY {d} {td}"), // killed before "ACK": the ack committed unreported
    ]
    .into();
    assert_eq!(violations_for(&path, &honest), Vec::<String>::new());

    // (what is planted, the messages, what the violation must say)
    let planted: Vec<(&str, Vec<String>, String)> = vec![
        (
            "acked job reappears",
            vec![format!("TRY {b} 99"), format!("ACK {b} 99")],
            format!("job {b} was acked and reappeared"),
        ),
        (
            "lost job",
            vec!["ENQ 77 x/-/-".into()],
            "job 77 is lost".into(),
        ),
        (
            "ack_with reported, effect missing",
            vec![
                "ENQ 78 x/k2/-".into(),
                "TRY 78 5".into(),
                "ACKW 78 5 k2 now".into(),
            ],
            "ack_with of k2 reported Ok, effect count None".into(),
        ),
        (
            "Now reported twice for one key",
            vec![
                "ENQ 79 x/k1/-".into(),
                "TRY 79 6".into(),
                "ACKW 79 6 k1 now".into(),
            ],
            "effect key k1: Applied::Now reported twice".into(),
        ),
        (
            "dead job revived",
            vec![format!("FAIL {b} 7")],
            format!("job {b} was dead-lettered and is now Scheduled"),
        ),
        (
            "attempts went back",
            vec![format!("DEQ {b} 3 8 x/-/d1")],
            format!("job {b}: attempts went back from 3 to 1"),
        ),
        (
            "Duplicate names a job without the key",
            vec![format!("DUP {c} d1")],
            format!("Duplicate({c}) for dedup key d1"),
        ),
        (
            "payload changed",
            vec![format!("DEQ {b} 1 9 x/-/d2")],
            format!("job {b}: payload \"x/-/d2\""),
        ),
        (
            "child error",
            vec!["ERR something".into()],
            "child reported: ERR something".into(),
        ),
    ];
    for (what, extra, expected) in planted {
        let mut msgs = honest.clone();
        msgs.extend(extra);
        let v = violations_for(&path, &msgs);
        assert!(
            v.iter().any(|v| v.contains(&expected)),
            "planted '{what}' was not detected as '{expected}': {v:?}"
        );
    }
    // Without the TRY, the unreported ack of d is a lost job.
    let mut no_try = honest.clone();
    no_try.retain(|m| *m != format!("TRY {d} {td}"));
    assert!(
        violations_for(&path, &no_try)
            .iter()
            .any(|v| v.contains(&format!("job {d} is lost"))),
        "a job missing without any ack started was not flagged"
    );

    // Effects tampered behind leaseq's back: a double effect, and an effect with no marker.
    {
        let q = Queue::open(&path).unwrap();
        let tx = q.database().begin_write().unwrap();
        tx.open_table(EFFECTS).unwrap().insert("k1", 2).unwrap();
        tx.commit().unwrap();
    }
    assert!(
        violations_for(&path, &honest)
            .iter()
            .any(|v| v.contains("applied 2 times"))
    );
    {
        let q = Queue::open(&path).unwrap();
        let tx = q.database().begin_write().unwrap();
        let mut t = tx.open_table(EFFECTS).unwrap();
        t.insert("k1", 1).unwrap();
        t.insert("k3", 1).unwrap();
        t.insert(format!("#{b}").as_str(), 1).unwrap();
        drop(t);
        tx.commit().unwrap();
    }
    let v = violations_for(&path, &honest);
    assert!(
        v.iter().any(|v| v.contains("key k3: applied marker false")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|v| v.contains(&format!("job {b} was not acked"))),
        "{v:?}"
    );
}

// Found by C08 (seed 0xc080000 + 16 = 201850896): a worker may hold a stale lease and the
// current lease of the same job (its lease expired and the job was redelivered to it). A
// batch ack of both must ack through the current lease and report the stale one as
// `LeaseLost`, not panic inside leaseq and report a corrupted file.
#[test]
fn batch_ack_of_a_stale_and_the_current_lease_of_one_job_acks_once() {
    if child_scenario().is_some() {
        return;
    }
    let f = common::Fixture::new();
    let q = f.open();
    for with_effect in [false, true] {
        let id = q
            .enqueue(b"A", EnqueueOptions::default().idempotency_key("once"))
            .unwrap()
            .id();
        let stale = q.dequeue().unwrap().unwrap();
        f.clock.advance(common::LEASE + ms(1));
        let current = q.dequeue().unwrap().unwrap();
        assert_eq!((stale.id(), current.id()), (id, id));
        let stale_token = stale.token();
        let mut ran = 0;
        let leases = [current, stale];
        let outcomes: Vec<Result<(), Error>> = if with_effect {
            q.ack_with_batch(&leases, |_, _| {
                ran += 1;
                Ok(())
            })
            .unwrap()
            .into_iter()
            .map(|r| r.map(drop))
            .collect()
        } else {
            q.ack_batch(&leases).unwrap()
        };
        assert!(
            matches!(
                outcomes.as_slice(),
                [Ok(()), Err(Error::LeaseLost { token, .. })] if *token == stale_token
            ),
            "batch ack with a stale lease of a job also in the batch: {outcomes:?}"
        );
        assert_eq!(
            ran,
            usize::from(with_effect),
            "the effect runs once, for the current lease"
        );
        assert_eq!(q.job(id).unwrap(), None);
        assert_eq!(q.is_applied("once").unwrap(), with_effect);
        common::assert_consistent(&q);
    }
}
