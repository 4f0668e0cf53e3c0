//! Shared test helpers: queues on temp files with a manual clock, and child processes that
//! run a scenario and are killed with SIGKILL.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leaseq::{Builder, EnqueueOptions, JobId, ManualClock, Queue};

pub const LEASE: Duration = Duration::from_secs(30);
pub const T0_MS: u64 = 1_700_000_000_000;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub clock: ManualClock,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.leaseq");
        Fixture {
            dir,
            path,
            clock: ManualClock::new(T0_MS),
        }
    }

    /// Retries at once: the scenario tests count deliveries and read states right after a
    /// nack or an expiry (the retry policy has tests of its own, `tests/core/retry.rs`).
    pub fn builder(&self) -> Builder {
        Queue::builder()
            .lease(LEASE)
            .clock(self.clock.clone())
            .retry(leaseq::RetryPolicy::immediate())
    }

    pub fn open(&self) -> Queue {
        self.builder().open(&self.path).unwrap()
    }

    /// [`Fixture::open`] with `Durability::None`: commits do not wait for the disk (a
    /// clean close or a flush makes them durable).
    pub fn open_non_durable(&self) -> Queue {
        self.builder()
            .durability(leaseq::Durability::None)
            .open(&self.path)
            .unwrap()
    }

    /// The fixture's clock now (Unix ms).
    pub fn clock_now(&self) -> u64 {
        use leaseq::Clock;
        self.clock.now_ms()
    }

    /// Opens the file once its last other handle is gone: retries `AlreadyOpen` every 2 ms
    /// for up to 20 s (a helper thread or a finishing worker lets go just after its commit);
    /// any other error, or a handle still held after 20 s, panics.
    pub fn reopen_when_released(&self) -> Queue {
        let t = std::time::Instant::now();
        loop {
            match self.builder().open(&self.path) {
                Ok(q) => return q,
                Err(leaseq::Error::AlreadyOpen { .. }) if t.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("reopen: {e}"),
            }
        }
    }
}

/// Asserts `check()` finds nothing.
pub fn assert_consistent(q: &Queue) {
    let v = q.check().unwrap();
    assert!(v.is_empty(), "invariant violations: {v:#?}");
}

/// A command running `program`, a binary built for this test's target, the way cargo ran this
/// test: through the target's runner when cargo was given one in the environment
/// (`CARGO_TARGET_<TRIPLE>_RUNNER`, for example `qemu-arm -L /usr/arm-linux-gnueabihf`), so
/// that a child starts under the same emulator on a machine that cannot run it directly (no
/// binfmt_misc). On Windows the program is started directly: under wine, wine starts it.
pub fn target_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    match runner() {
        Some(mut words) => {
            let mut cmd = Command::new(words.remove(0));
            cmd.args(words).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Starts `cmd`, trying again up to 4 times, 250 ms apart, when the start itself fails.
/// Under wine, `CreateProcess` fails now and then with `ERROR_INTERNAL_ERROR` (1359) while
/// other processes start and die around it (the kill tests start and kill hundreds); that
/// says nothing about leaseq, so it must not fail a test. Panics with the last error after
/// the fifth failure.
pub fn spawn_retrying(cmd: &mut Command) -> Child {
    const ATTEMPTS: u32 = 5;
    let mut attempt = 1;
    loop {
        match cmd.spawn() {
            Ok(child) => return child,
            Err(e) if attempt < ATTEMPTS => {
                eprintln!("starting {cmd:?} failed (attempt {attempt} of {ATTEMPTS}): {e}");
                std::thread::sleep(Duration::from_millis(250));
                attempt += 1;
            }
            Err(e) => panic!("starting {cmd:?} failed {ATTEMPTS} times: {e}"),
        }
    }
}

/// The runner cargo was given for this binary's target, split on whitespace as cargo does:
/// the `CARGO_TARGET_<TRIPLE>_RUNNER` whose triple fits this binary's architecture, OS, C
/// library and float ABI (the triple itself is not known to a test binary). Panics if two
/// fit, rather than guess.
fn runner() -> Option<Vec<String>> {
    if cfg!(windows) {
        return None;
    }
    let fits = |triple: &str| {
        let parts: Vec<&str> = triple.split('_').collect();
        let arch = parts.first().copied().unwrap_or_default();
        let arch_fits = match std::env::consts::ARCH {
            "x86" => matches!(arch, "I386" | "I586" | "I686"),
            "arm" => arch.starts_with("ARM") || arch.starts_with("THUMB"),
            // X86_64 is split in two by the underscore.
            "x86_64" => triple.starts_with("X86_64_"),
            other => arch == other.to_ascii_uppercase(),
        };
        let os = match std::env::consts::OS {
            "macos" | "ios" => "APPLE".to_string(),
            other => other.to_ascii_uppercase(),
        };
        let android = std::env::consts::OS == "android";
        let last = parts.last().copied().unwrap_or_default();
        let env_fits = match (cfg!(target_env = "musl"), cfg!(target_env = "gnu")) {
            (true, _) => last.starts_with("MUSL"),
            (_, true) => last.starts_with("GNU"),
            _ => true,
        };
        let hard_float = last.ends_with("HF");
        arch_fits
            && triple.contains(&os)
            && triple.contains("_ANDROID") == android
            && env_fits
            && (std::env::consts::ARCH != "arm" || hard_float == cfg!(target_abi = "eabihf"))
    };
    let mut found: Vec<(String, Vec<String>)> = std::env::vars()
        .filter_map(|(key, value)| {
            let triple = key.strip_prefix("CARGO_TARGET_")?.strip_suffix("_RUNNER")?;
            let words: Vec<String> = value.split_whitespace().map(String::from).collect();
            (fits(triple) && !words.is_empty()).then(|| (key.clone(), words))
        })
        .collect();
    assert!(
        found.len() <= 1,
        "several cargo runners fit this target: {:?}; set only one",
        found.iter().map(|(k, _)| k).collect::<Vec<_>>()
    );
    found.pop().map(|(_, words)| words)
}

/// How long an emulated child may take to print its first line (libtest's, at its start)
/// before it is taken for one that never started.
const CHILD_START_MAX: Duration = Duration::from_secs(120);

/// A child's output lines, read on a thread of their own and handed over in order.
struct ChildLines {
    rx: std::sync::mpsc::Receiver<std::io::Result<String>>,
    /// A line taken by [`ChildLines::started`], not yet handed out.
    first: Option<std::io::Result<String>>,
}

impl ChildLines {
    fn read(stdout: std::process::ChildStdout) -> ChildLines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildLines { rx, first: None }
    }

    /// Whether the child printed a line (or ended its output) within `limit`.
    fn started(&mut self, limit: Duration) -> bool {
        match self.rx.recv_timeout(limit) {
            Ok(line) => {
                self.first = Some(line);
                true
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => false,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => true,
        }
    }

    /// The next line; `None` once the output ended.
    fn next_line(&mut self) -> Option<std::io::Result<String>> {
        self.first.take().or_else(|| self.rx.recv().ok())
    }
}

/// Environment variable naming the scenario a re-executed test binary runs as a child.
pub const CHILD_ENV: &str = "LEASEQ_TEST_CHILD";
pub const CHILD_PATH_ENV: &str = "LEASEQ_TEST_CHILD_PATH";

/// A child process re-running this test binary as one scenario; killed (SIGKILL) on drop,
/// so a failing test never leaks it.
pub struct ChildProc {
    child: Child,
    /// The child's output lines, read on a thread of their own (so the start can be waited
    /// for with a time limit); closed at the end of its output.
    lines: ChildLines,
    /// The test the child runs, for the message when it runs none.
    entry_test: String,
}

impl ChildProc {
    /// Re-runs this test binary as a child that executes only `entry_test` with the scenario
    /// `scenario` on `path`. `entry_test` is the test's full name in this binary as libtest
    /// prints it, its module path included (`module::name`): the child runs it with `--exact`,
    /// and a child whose name matches no test fails the parent when the parent reads its
    /// output (see `libtest_line`), never passes silently.
    pub fn spawn(entry_test: &str, scenario: &str, path: &Path) -> ChildProc {
        ChildProc::spawn_env(entry_test, scenario, path, &[])
    }

    /// [`ChildProc::spawn`] with more environment variables for the child.
    pub fn spawn_env(
        entry_test: &str,
        scenario: &str,
        path: &Path,
        env: &[(&str, &str)],
    ) -> ChildProc {
        let mut cmd = target_command(std::env::current_exe().unwrap());
        cmd.args(["--exact", entry_test, "--nocapture", "--test-threads=1"])
            .envs(env.iter().copied())
            .env(CHILD_ENV, scenario)
            .env(CHILD_PATH_ENV, path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Under an emulator (qemu-user), a fork of the many-threaded test binary now and then
        // never reaches its exec (the emulator's own locks, held by another thread at the
        // fork, stay held in the copy): such a child prints nothing, ever. It is killed and
        // started again; that says nothing about leaseq. A child that printed and then hangs
        // is not restarted. Natively the start is not timed.
        const STARTS: u32 = 3;
        let emulated = runner().is_some();
        let mut attempt = 1;
        loop {
            let mut child = spawn_retrying(&mut cmd);
            let mut lines = ChildLines::read(child.stdout.take().unwrap());
            if !emulated || attempt == STARTS || lines.started(CHILD_START_MAX) {
                return ChildProc {
                    child,
                    lines,
                    entry_test: entry_test.to_string(),
                };
            }
            eprintln!(
                "the emulated child for {entry_test} printed nothing in {CHILD_START_MAX:?}: \
                 killed and started again (attempt {attempt} of {STARTS})"
            );
            let _ = child.kill();
            let _ = child.wait();
            attempt += 1;
        }
    }

    /// The messages the child sent with [`say`] until it said `READY`.
    pub fn until_ready(&mut self) -> Vec<String> {
        let mut said = Vec::new();
        while let Some(line) = self.lines.next_line() {
            let line = line.unwrap();
            // libtest may print "test name ... " on the same line before the child's output.
            match line.find("@@ ").map(|i| &line[i + 3..]) {
                Some("READY") => return said,
                Some(msg) => said.push(msg.to_string()),
                None => libtest_line(&self.entry_test, &line),
            }
        }
        panic!("child exited before READY; it said {said:?}");
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(mut self) {
        self.kill_now();
    }

    fn kill_now(&mut self) {
        let _ = self.child.kill(); // SIGKILL on Unix
        let _ = self.child.wait();
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// A line of libtest's own output from the child that runs `entry_test`: panics if the child
/// runs no test (the name given to `--exact` names no test of this binary, for example after
/// the test moved to another module), which would otherwise look like a child that said
/// nothing and exited 0.
fn libtest_line(entry_test: &str, line: &str) {
    assert!(
        line.trim() != "running 0 tests",
        "the child ran no test: no test of this binary is named `{entry_test}` (a test's name \
         includes its module path)"
    );
}

/// In a child: send a message to the parent.
pub fn say(msg: impl std::fmt::Display) {
    use std::io::Write;
    println!("@@ {msg}");
    std::io::stdout().flush().unwrap();
}

/// In a child: announce the kill point and wait to be killed.
pub fn ready_to_die() -> ! {
    say("READY");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// In a child: the scenario name and queue path, or `None` when not run as a child.
pub fn child_scenario() -> Option<(String, PathBuf)> {
    let scenario = std::env::var(CHILD_ENV).ok()?;
    let path = std::env::var(CHILD_PATH_ENV).unwrap();
    Some((scenario, PathBuf::from(path)))
}

impl ChildProc {
    /// The next message the child sent with [`say`] (`READY` included), or `None` once its
    /// output ended (it exited or was killed).
    pub fn next_message(&mut self) -> Option<String> {
        while let Some(line) = self.lines.next_line() {
            let line = line.ok()?;
            if let Some(i) = line.find("@@ ") {
                return Some(line[i + 3..].to_string());
            }
            libtest_line(&self.entry_test, &line);
        }
        None
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child already exited on its own (and how), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILLs the child, reaps it, and returns the messages it sent that were not read
    /// yet (everything it wrote before it died stays readable in the pipe).
    pub fn kill_and_collect(mut self) -> Vec<String> {
        self.kill_now();
        let mut rest = Vec::new();
        while let Some(m) = self.next_message() {
            rest.push(m);
        }
        rest
    }
}

/// Whether `cond` holds within 20 s (looked at every 2 ms): for what a helper thread or a
/// dropped future finishes a moment later (a give-back, a release).
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

/// Every ready job of `q` has no attempt charged and no snooze; none is leased.
pub fn assert_nothing_charged(q: &Queue) {
    let s = q.stats().unwrap();
    assert_eq!(s.leased, 0, "a lease was stranded: {s:?}");
    for j in q.jobs(leaseq::JobState::Ready, None, 10_000).unwrap().jobs {
        assert_eq!((j.attempts, j.snoozes), (0, 0), "charged: {j:?}");
    }
}

/// The caller's effect table of the effect tests: key -> times the effect was applied.
pub const EFFECTS: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("effects");

/// Every effect counter, read from a fresh snapshot (empty before the first effect).
pub fn effects(q: &Queue) -> std::collections::HashMap<u64, u64> {
    counters(q, EFFECTS)
}

/// Every row of a caller's `u64 -> u64` counter table, from a fresh snapshot (empty before
/// the table exists).
pub fn counters(
    q: &Queue,
    table: redb::TableDefinition<u64, u64>,
) -> std::collections::HashMap<u64, u64> {
    use redb::{ReadableDatabase, ReadableTable};
    let rtx = q.database().begin_read().unwrap();
    match rtx.open_table(table) {
        Ok(t) => t
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value(), v.value())
            })
            .collect(),
        Err(redb::TableError::TableDoesNotExist(_)) => std::collections::HashMap::new(),
        Err(e) => panic!("{e}"),
    }
}

/// The effect: adds one to `key`'s counter, inside the `ack_with` transaction.
pub fn bump(tx: &redb::WriteTransaction, key: u64) -> Result<(), leaseq::BoxError> {
    use redb::ReadableTable;
    let mut t = tx.open_table(EFFECTS)?;
    let n = t.get(key)?.map_or(0, |v| v.value());
    t.insert(key, n + 1)?;
    Ok(())
}

/// The per-lease outcomes of a batch ack, every one of which must be `Ok`: the values.
#[track_caller]
pub fn all_ok<T: std::fmt::Debug>(outcomes: Vec<leaseq::Result<T>>) -> Vec<T> {
    outcomes
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("lease {i} of the batch: {e}")))
        .collect()
}

/// leaseq's job table, written behind its back by tests that plant damage (as a flaky disk
/// would).
pub const JOBS_TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("leaseq_jobs");

/// Replaces the stored record of job `id` with `bytes` through the shared database.
pub fn overwrite_record(q: &Queue, id: leaseq::JobId, bytes: &[u8]) {
    let tx = q.database().begin_write().unwrap();
    tx.open_table(JOBS_TABLE)
        .unwrap()
        .insert(id.0, bytes)
        .unwrap();
    tx.commit().unwrap();
}

/// XORs one byte of job `id`'s stored record (at `at`, modulo its length) with `xor` (0 taken
/// as 1); returns the damaged bytes.
pub fn flip_record_byte(q: &Queue, id: leaseq::JobId, at: usize, xor: u8) -> Vec<u8> {
    use redb::ReadableDatabase;
    let mut bytes = {
        let rtx = q.database().begin_read().unwrap();
        let t = rtx.open_table(JOBS_TABLE).unwrap();
        let row = t.get(id.0).unwrap().expect("the job's row");
        row.value().to_vec()
    };
    let at = at % bytes.len();
    bytes[at] ^= xor.max(1);
    overwrite_record(q, id, &bytes);
    bytes
}

/// The id of a new job; panics on a duplicate.
#[track_caller]
pub fn new_id(e: leaseq::Enqueued) -> leaseq::JobId {
    match e {
        leaseq::Enqueued::New(id) => id,
        other => panic!("expected New, got {other:?}"),
    }
}

/// Dequeues and acks every job available now; their payloads in delivery order.
pub fn drain_payloads(q: &Queue) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        out.push(l.payload().to_vec());
        l.ack().unwrap();
    }
    out
}

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Enqueue options with nothing set.
pub fn plain() -> EnqueueOptions {
    EnqueueOptions::default()
}

/// Enqueue options with idempotency key `k` and nothing else.
pub fn keyed(k: &str) -> EnqueueOptions {
    EnqueueOptions::default().idempotency_key(k)
}

/// Enqueues `n` jobs (payloads `job 0`, `job 1`, ...) with `opts`; their ids in order.
pub fn enqueue_n(q: &Queue, n: usize, opts: EnqueueOptions) -> Vec<JobId> {
    (0..n)
        .map(|i| {
            q.enqueue(format!("job {i}").as_bytes(), opts.clone())
                .unwrap()
                .id()
        })
        .collect()
}

/// Bytes `path` takes on disk (allocated blocks, as `du` counts them; the length where the
/// platform has no block count); 0 if it is missing.
pub fn allocated_bytes(path: &std::path::Path) -> u64 {
    match std::fs::metadata(path) {
        #[cfg(unix)]
        Ok(m) => std::os::unix::fs::MetadataExt::blocks(&m) * 512,
        #[cfg(not(unix))]
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}
