//! Shared test helpers: queues on temp files with a manual clock, and child processes that
//! run a scenario and are killed with SIGKILL.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leaseq::{Builder, ManualClock, Queue};

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

    pub fn builder(&self) -> Builder {
        Queue::builder().lease(LEASE).clock(self.clock.clone())
    }

    pub fn open(&self) -> Queue {
        self.builder().open(&self.path).unwrap()
    }
}

/// Asserts `check()` finds nothing.
pub fn assert_consistent(q: &Queue) {
    let v = q.check().unwrap();
    assert!(v.is_empty(), "invariant violations: {v:#?}");
}

/// Environment variable naming the scenario a re-executed test binary runs as a child.
pub const CHILD_ENV: &str = "LEASEQ_TEST_CHILD";
pub const CHILD_PATH_ENV: &str = "LEASEQ_TEST_CHILD_PATH";

/// Re-runs this test binary as a child that executes only `entry_test` with the scenario
/// `scenario` on `path`. The child prints `READY` when it reached its kill point.
pub fn spawn_child(entry_test: &str, scenario: &str, path: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", entry_test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scenario)
        .env(CHILD_PATH_ENV, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Waits for the child's `READY` line (its lines before that are returned), then SIGKILLs it.
pub fn kill_when_ready(mut child: Child) -> Vec<String> {
    let stdout = child.stdout.take().unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if line == "READY" {
            child.kill().unwrap(); // SIGKILL on Unix
            child.wait().unwrap();
            return lines;
        }
        lines.push(line);
    }
    let status = child.wait().unwrap();
    panic!("child exited ({status}) before READY; output: {lines:?}");
}

/// In a child: announce the kill point and wait to be killed.
pub fn ready_to_die() -> ! {
    println!("READY");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}
