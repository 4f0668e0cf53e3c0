//! C40 (real I/O faults): the operating system failing underneath a real process on a real
//! file. The workload of C08 (process_kill.rs: enqueues, batches, dequeues, acks, `ack_with`
//! effects, nacks, snoozes, outbox writes, prunes, compactions, reopens) runs in a child
//! process under libfiu (`fiu_posix_preload.so`, preloaded as `fiu-run -x` does), and the
//! parent arms faults in it through libfiu's control FIFO (what `fiu-ctrl` writes), scoped to
//! the calls the queue file's I/O makes and the child's reports to the parent do not
//! (`write` on stdout): `pwrite`, `pread`, `fdatasync`, `fsync`, `open`, `ftruncate`, failing
//! with EIO, ENOSPC or EINTR at a rate (every call from then on, down to one in 500), armed
//! before the open or after a random number of reports; sometimes with short reads and
//! writes as well. After each round the parent reopens the file without faults and checks
//! C08's model of everything the child's `Ok`s promised.
//!
//! What the child must do under faults: a call fails with a typed I/O error
//! (`Error::Io`, `Error::Storage`, `Error::CommitFailed`), never a panic, an abort or another
//! error; the failed call is in doubt (the model treats it as unreported: an enqueue may or
//! may not be there, an ack may or may not have landed); and the handle stays failed: one
//! more enqueue on it must fail too (after an fsync error the kernel may have dropped the
//! dirty pages, so no later commit on that handle may be reported durable). Then the child
//! reports `DONE` and exits 0, the only way it may exit by itself. EINTR and short transfers
//! must never surface at all (the standard library retries and completes them; an EINTR
//! reported is fatal in the child).
//!
//! Beside it: a failed fsync is final for its handle (libfiu failing every `fdatasync` for
//! one enqueue); a disk that fills up (C41: a real tmpfs of a few MiB, and C08's kill runs on
//! one); bad files from real tools (C42: `cp` cut short by a full disk, copies taken while an
//! app writes, a directory entry replaced under a running app).
//!
//! Linux only (LD_PRELOAD), native runs only (not under a cargo runner such as qemu), and
//! only where libfiu is installed (`apt-get install fiu-utils`): elsewhere the test says why
//! it skips, unless `LEASEQ_REQUIRE_FIU=1` (as in `.ci/run`) makes that a failure.
//! Knobs: `LEASEQ_FAULT_RUNS` (default 60), `LEASEQ_FAULT_SEED`, `LEASEQ_FAULT_PARALLEL`
//! (default 2). A longer run (about 5 minutes on 2 cores): `LEASEQ_FAULT_RUNS=3000 cargo
//! test --release --test core -- io_faults::injected --nocapture`.

use crate::common::{ChildProc, child_scenario, say};
use crate::process_kill::{FAULTS_ENV, Tally, env_u64, run_many};
use leaseq::{EnqueueOptions, Error, Queue};
use std::fmt;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

const RUNS_DEFAULT: u64 = 60;

const BASE_SEED_DEFAULT: u64 = 0xC40_0000;

/// Where Debian's libfiu0 puts its preload libraries.
const FIU_DIR: &str = "/usr/lib/fiu";

/// The calls a fault can hit, by libfiu's failure point names. `pwrite` and `pread` cover
/// their 64-bit forms (what the standard library calls); `fsync` is what leaseq's own flushes
/// of new files and directories use, `fdatasync` redb's commits.
const POINTS: [&str; 6] = [
    "posix/io/rw/pwrite",
    "posix/io/rw/pread",
    "posix/io/sync/fdatasync",
    "posix/io/sync/fsync",
    "posix/io/oc/open",
    "posix/io/rw/ftruncate",
];

/// errno values (the same on every Linux architecture): EINTR, EIO, ENOSPC.
const EINTR: i32 = 4;
const ERRNOS: [(&str, i32); 3] = [("EINTR", EINTR), ("EIO", 5), ("ENOSPC", 28)];

/// Failure rates: every call from the moment the faults are armed, down to one in 500.
const RATES: [f64; 4] = [1.0, 0.2, 0.02, 0.002];

/// Faults in a child: libfiu's preload libraries and control FIFOs, or none (a small
/// file system that fills up is fault enough); and where the runs' files live.
pub(crate) struct Injector {
    preload: Option<String>,
    root: Option<std::path::PathBuf>,
}

/// The faults of one round.
#[derive(Debug, Clone)]
pub(crate) struct FaultPlan {
    /// libfiu control commands, one per line of the FIFO.
    commands: Vec<String>,
    /// Armed before the child opens the queue (0) or after this many of its reports.
    pub(crate) at: usize,
    what: String,
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, armed ", self.what)?;
        match self.at {
            0 => write!(f, "before the open"),
            n => write!(f, "after {n} reports"),
        }
    }
}

impl Injector {
    /// libfiu, when this run can use it: `Err` says why not.
    fn find() -> Result<Injector, String> {
        if !cfg!(target_os = "linux") {
            return Err("libfiu preloading needs Linux".into());
        }
        if std::env::vars().any(|(k, _)| k.starts_with("CARGO_TARGET_") && k.ends_with("_RUNNER")) {
            return Err("a cargo runner is set (an emulated target): libfiu is native".into());
        }
        let libs = ["fiu_run_preload.so", "fiu_posix_preload.so"].map(|l| format!("{FIU_DIR}/{l}"));
        if let Some(missing) = libs.iter().find(|l| !Path::new(l).exists()) {
            return Err(format!("{missing} is missing (apt-get install fiu-utils)"));
        }
        Ok(Injector {
            preload: Some(libs.join(" ")),
            root: None,
        })
    }

    /// No injected faults, the runs' files in `root` (a small tmpfs): the child only expects
    /// I/O errors, which the full file system gives.
    fn disk_only(root: &Path) -> Injector {
        Injector {
            preload: None,
            root: Some(root.to_path_buf()),
        }
    }

    /// After the parent's reopen in `dir` failed with `e`: whether that was the full file
    /// system of a disk-only run (its error naming ENOSPC), which is then relieved of its
    /// ballast for the next try.
    pub(crate) fn relieve(&self, dir: &Path, e: &Error) -> bool {
        if self.preload.is_some() || !is_disk_full(e) {
            return false;
        }
        std::fs::remove_file(dir.join("ballast")).is_ok()
    }

    /// Where the runs' files live, if not in the system's temporary directory.
    pub(crate) fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The child's environment: the preload libraries, its control FIFOs in `dir`, and the
    /// flag that makes I/O errors expected outcomes.
    pub(crate) fn env(&self, dir: &Path) -> Vec<(String, String)> {
        let mut env = vec![(FAULTS_ENV.to_string(), "1".to_string())];
        if let Some(preload) = &self.preload {
            env.push(("LD_PRELOAD".into(), preload.clone()));
            env.push(("FIU_CTRL_FIFO".into(), fifo_prefix(dir)));
        }
        env
    }

    /// A random plan: one or two failure points (or all), an errno, a rate, a moment; a
    /// quarter of the plans add short reads and writes.
    /// Without libfiu: a ballast file in `dir` leaves 8-200 KiB free on the file system (the
    /// runs there go one at a time), so the queue file fills it up in many rounds.
    pub(crate) fn plan(&self, rng: &mut fastrand::Rng, dir: &Path) -> FaultPlan {
        if self.preload.is_none() {
            let ballast = dir.join("ballast");
            let had = std::fs::metadata(&ballast).map_or(0, |m| m.len());
            let leave = rng.u64(8..=200) * 1024;
            let size = (had + free_bytes(dir)).saturating_sub(leave);
            let _ = std::fs::remove_file(&ballast);
            std::fs::write(&ballast, vec![0xA5; size as usize]).unwrap();
            return FaultPlan {
                commands: Vec::new(),
                at: 0,
                what: format!("no injected faults, {} KiB left free", leave / 1024),
            };
        }
        let points: Vec<&str> = match rng.u32(0..10) {
            0 => POINTS.to_vec(),
            1..=3 => {
                let a = rng.usize(0..POINTS.len());
                let b = (a + rng.usize(1..POINTS.len())) % POINTS.len();
                vec![POINTS[a], POINTS[b]]
            }
            // The commit's two calls most often.
            4..=6 => vec![POINTS[rng.usize(0..2) * 2]],
            _ => vec![POINTS[rng.usize(0..POINTS.len())]],
        };
        let (errno_name, errno) = ERRNOS[rng.usize(0..ERRNOS.len())];
        // A call interrupted every time would be retried forever (the standard library
        // retries EINTR, as it must): interruptions come at a rate below 1.
        let rates = if errno == EINTR {
            &RATES[1..]
        } else {
            &RATES[..]
        };
        let rate = rates[rng.usize(0..rates.len())];
        let mut commands: Vec<String> = points
            .iter()
            .map(|p| format!("enable_random name={p},probability={rate},failinfo={errno}"))
            .collect();
        let short = rng.u32(0..4) == 0;
        if short {
            for p in ["posix/io/rw/pwrite/reduce", "posix/io/rw/pread/reduce"] {
                commands.push(format!("enable_random name={p},probability=0.3"));
            }
        }
        let short = if short {
            ", short reads and writes"
        } else {
            ""
        };
        FaultPlan {
            commands,
            at: if rng.u32(0..10) < 3 {
                0
            } else {
                rng.usize(1..=40)
            },
            what: format!("{points:?} fail with {errno_name} at rate {rate}{short}"),
        }
    }

    /// Arms `plan` in the child `pid` through its control FIFOs in `dir` (libfiu's remote
    /// control: a command line into `<prefix>-<pid>.in`, its answer, 0 for done, out of
    /// `.out`). A child that went away meanwhile leaves the FIFO unanswered: given up after
    /// 5 s (the caller looks whether the child still runs).
    pub(crate) fn arm(&self, plan: &FaultPlan, pid: u32, dir: &Path) -> Result<(), String> {
        plan.commands
            .iter()
            .try_for_each(|c| self.send(pid, dir, c))
    }

    /// Sends one libfiu control command (`enable ...`, `enable_random ...`, `disable ...`) to
    /// the child `pid` whose FIFOs are in `dir`.
    fn send(&self, pid: u32, dir: &Path, command: &str) -> Result<(), String> {
        // libfiu's control loop now and then answers a command sent right after another with
        // nothing (once in a 3,000-run batch of C40): sent again, which is harmless (enabling
        // a failure point twice is enabling it).
        let mut last = Ok(());
        for _ in 0..3 {
            last = self.send_once(pid, dir, command);
            if last.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        last
    }

    fn send_once(&self, pid: u32, dir: &Path, command: &str) -> Result<(), String> {
        let prefix = format!("{}-{pid}", fifo_prefix(dir));
        let (cmd, fifo) = (command.to_string(), prefix.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        // Opening a FIFO blocks until the other side opens it: on a thread of its own.
        std::thread::spawn(move || {
            let answer = (|| -> std::io::Result<String> {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(format!("{fifo}.in"))?
                    .write_all(format!("{cmd}\n").as_bytes())?;
                let mut answer = String::new();
                std::fs::File::open(format!("{fifo}.out"))?.read_to_string(&mut answer)?;
                Ok(answer)
            })();
            let _ = tx.send(answer);
        });
        match rx.recv_timeout(Duration::from_secs(3)) {
            Ok(Ok(a)) if a.trim() == "0" => Ok(()),
            // A missing FIFO (libfiu removes them as the process exits), a broken one or an
            // answer cut off are errors here too: the caller forgives them only if the child
            // is gone.
            Ok(Ok(a)) => Err(format!("libfiu refused {command:?}: {a:?}")),
            Ok(Err(e)) => Err(format!("libfiu's FIFO {prefix}: {e}")),
            Err(_) => Err(format!("libfiu's FIFO {prefix} did not answer {command:?}")),
        }
    }
}

/// libfiu, or `None` after saying why the test `name` checks nothing here (a failure instead
/// when `LEASEQ_REQUIRE_FIU` is set).
fn injector_or_skip(name: &str) -> Option<Injector> {
    found_or_skip(name, "LEASEQ_REQUIRE_FIU", Injector::find())
}

/// What a test needs from the machine, or `None` after saying why the test `name` checks
/// nothing here; a failure instead when the environment variable `require` is set (CI).
fn found_or_skip<T>(name: &str, require: &str, found: Result<T, String>) -> Option<T> {
    match found {
        Ok(t) => Some(t),
        Err(why) if std::env::var_os(require).is_some() => {
            panic!("{require} is set and {name} cannot run: {why}")
        }
        Err(why) => {
            eprintln!("{name} skipped, it checks nothing here: {why}");
            None
        }
    }
}

fn fifo_prefix(dir: &Path) -> String {
    dir.join("fiu").display().to_string()
}

// C40: seeded rounds of the C08 workload under injected I/O errors; after each, a reopen
// without faults finds every promise of a reported `Ok` kept (check() clean, no lost or
// reappearing job, each effect exactly once per reported ack_with or outbox write), the
// child stopped only through a typed I/O error with its handle failed for good, and nothing
// panicked or aborted.
#[test]
fn injected_io_errors_keep_every_reported_promise() {
    if child_scenario().is_some() {
        return;
    }
    let Some(injector) = injector_or_skip("C40") else {
        return;
    };
    let runs = env_u64("LEASEQ_FAULT_RUNS", RUNS_DEFAULT);
    let t: Tally = run_many(
        "C40",
        "LEASEQ_FAULT_SEED=<seed> LEASEQ_FAULT_RUNS=1",
        runs,
        env_u64("LEASEQ_FAULT_SEED", BASE_SEED_DEFAULT),
        env_u64("LEASEQ_FAULT_PARALLEL", 2).max(1),
        Some(&injector),
    );
    // Every round arms its faults unless its child stopped (or was killed early) first.
    assert!(
        t.fault_rounds + t.early_kills >= t.rounds * 9 / 10,
        "rounds ran without faults armed: {t:?}"
    );
    if runs >= 10 {
        assert!(t.io_errors > 0, "no fault surfaced: {t:?}");
    }
    if runs >= RUNS_DEFAULT {
        // The faults must land where the model is put to the test.
        assert!(t.fault_stops > 0, "no child stopped on a fault: {t:?}");
        // And on files at their limit (ENOSPC among the faults there).
        assert!(t.storage_full > 0, "no round met its file limit: {t:?}");
        assert!(
            t.inflight_ack_committed + t.inflight_ack_not_committed > 0,
            "no ack was left in doubt: {t:?}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// fsync failure is final for its handle
// ------------------------------------------------------------------------------------------

/// The child side of the fail-once fsync test's steps: waits until the parent created
/// `<path>.go<n>` (it armed or disarmed a fault meanwhile).
fn wait_for_go(path: &Path, n: u32) {
    let go = path.with_extension(format!("go{n}"));
    let started = std::time::Instant::now();
    while !go.exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "no go{n}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What a call returned, in one word for the parent: `ok`, or the error's variant.
fn outcome<T>(r: &leaseq::Result<T>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(Error::CommitFailed { .. }) => "CommitFailed",
        Err(Error::Storage(_)) => "Storage",
        Err(Error::Io(_)) => "Io",
        Err(_) => "other",
    }
}

/// The child of [`a_failed_fsync_is_final_for_its_handle`]: job `a` durable; `b` while every
/// `fdatasync` fails; `c` and a flush on the same handle after the fault is gone; the handle
/// dropped and the file reopened in the same process; `d`.
#[test]
fn child_entry_fsync_once() {
    let Some((_, path)) = child_scenario() else {
        return;
    };
    let enqueue = |q: &Queue, p: &str| q.enqueue(p.as_bytes(), EnqueueOptions::default());
    let q = Queue::open(&path).unwrap();
    say(format!("A {}", outcome(&enqueue(&q, "a"))));
    wait_for_go(&path, 1);
    say(format!("B {}", outcome(&enqueue(&q, "b"))));
    wait_for_go(&path, 2);
    say(format!("C {}", outcome(&enqueue(&q, "c"))));
    say(format!("FLUSH {}", outcome(&q.flush())));
    drop(q);
    match Queue::open(&path) {
        Ok(q) => say(format!("D {}", outcome(&enqueue(&q, "d")))),
        Err(e) => say(format!("REOPEN {e}")),
    }
    say("END");
}

// C40: fsyncgate. Once a commit's fsync failed, the kernel may have dropped the dirty pages,
// so a later fsync that succeeds proves nothing about them: no call on that handle may be
// answered `Ok` again. With libfiu failing every fdatasync for one enqueue, then none: that
// enqueue is `CommitFailed`; the next enqueue and a flush on the same handle fail too (redb
// fails every call after an I/O error, `PreviousIo`, and leaseq every write after a failed
// commit); a reopen in the same process works; the parent then finds the jobs acknowledged
// `Ok` (a, d), never c, and b only as the in-doubt outcome its error announced. With the
// journal on (the default), the failing fdatasync is the journal frame's: a failed journal
// sync poisons the handle as a failed redb commit does, and the reopen replays b's frame if
// its write reached the file whole.
#[test]
fn a_failed_fsync_is_final_for_its_handle() {
    if child_scenario().is_some() {
        return;
    }
    let Some(injector) = injector_or_skip("fail-once fsync") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let env = injector.env(dir.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut child = ChildProc::spawn_env(
        "io_faults::child_entry_fsync_once",
        "fsync-once",
        &path,
        &env,
    );
    let mut said = Vec::new();
    let mut next = |child: &mut ChildProc| {
        let m = child.next_message().expect("the child ended early");
        said.push(m.clone());
        m
    };
    assert_eq!(next(&mut child), "A ok");
    let fdatasync = "posix/io/sync/fdatasync";
    injector
        .send(
            child.pid(),
            dir.path(),
            &format!("enable name={fdatasync},failinfo=5"),
        )
        .unwrap();
    std::fs::write(path.with_extension("go1"), b"").unwrap();
    assert_eq!(next(&mut child), "B CommitFailed");
    injector
        .send(
            child.pid(),
            dir.path(),
            &format!("disable name={fdatasync}"),
        )
        .unwrap();
    std::fs::write(path.with_extension("go2"), b"").unwrap();
    let rest: Vec<String> = (0..4).map(|_| next(&mut child)).collect();
    assert_eq!(
        rest,
        ["C CommitFailed", "FLUSH CommitFailed", "D ok", "END"],
        "after a failed fsync, the same handle answered Ok, or a reopen failed"
    );
    child.kill();
    let q = Queue::open(&path).unwrap();
    assert_eq!(q.check().unwrap(), vec![]);
    let mut payloads = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        payloads.push(String::from_utf8(l.payload().to_vec()).unwrap());
        l.ack().unwrap();
    }
    // b's commit wrote its pages and only the fsync failed: the file may hold it.
    assert!(
        payloads == ["a", "d"] || payloads == ["a", "b", "d"],
        "jobs after the failed fsync: {payloads:?} ({said:?})"
    );
}

// ------------------------------------------------------------------------------------------
// A disk that fills up: a real tmpfs of a few megabytes
// ------------------------------------------------------------------------------------------

/// A tmpfs mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    mnt: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// A tmpfs of `size` (as `mount -o size=` takes it: `4m`), or why this process cannot
    /// mount one (not root, no permission in this container, not Linux).
    fn mount(size: &str) -> Result<Tmpfs, String> {
        if !cfg!(target_os = "linux") {
            return Err("tmpfs is Linux's".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mnt)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { mnt, _dir: dir })
    }
}

/// Bytes free on the file system holding `path` (as `df` counts them).
fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().nth(1).unwrap().trim().parse().unwrap()
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
    }
}

/// A tmpfs of `size`, or `None` after saying why the test `name` checks nothing here (a
/// failure instead when `LEASEQ_REQUIRE_MOUNT` is set).
fn tmpfs_or_skip(name: &str, size: &str) -> Option<Tmpfs> {
    found_or_skip(name, "LEASEQ_REQUIRE_MOUNT", Tmpfs::mount(size))
}

/// Whether `e` is the typed error of a full disk: an I/O error whose cause is ENOSPC.
fn is_disk_full(e: &Error) -> bool {
    matches!(
        e,
        Error::Io(_) | Error::Storage(_) | Error::CommitFailed { .. }
    ) && e.to_string().contains("No space left on device")
}

/// A 1 KiB payload naming job `i`.
fn kib(i: u32) -> Vec<u8> {
    format!("{i:08}").repeat(128).into_bytes()
}

/// The queue at `path` opened without a disk reserve: the disk fills up to its last byte.
fn open_without_reserve(path: &Path) -> leaseq::Result<Queue> {
    Queue::builder().disk_reserve(0).open(path)
}

// C41: a disk that fills up, without a disk reserve (`disk_reserve(0)`). On a 4 MiB tmpfs, enqueues of 1 KiB run until the file system is
// full: the failing one is a typed error naming ENOSPC, the handle then refuses every call,
// and nothing is lost: a reopen on the still full disk reads every job enqueued `Ok`, and a
// drain with `ack_with` either makes progress or fails with the same typed error (redb writes
// new pages for every change: on a full tmpfs it fails); once space is freed (a ballast file
// removed) the queue takes new jobs again; every effect is applied once and check() is clean
// throughout. Then `compact` with 16 KiB free: done or refused with that error, nothing lost.
#[test]
fn a_full_disk_is_a_typed_error_that_loses_nothing() {
    let Some(fs) = tmpfs_or_skip("full disk", "4m") else {
        return;
    };
    let path = fs.mnt.join("q.leaseq");
    let ballast = fs.mnt.join("ballast");
    std::fs::write(&ballast, vec![7u8; 256 * 1024]).unwrap();
    let q = open_without_reserve(&path).unwrap();
    let mut enqueued = Vec::new();
    let full = loop {
        let i = enqueued.len() as u32;
        assert!(i < 20_000, "4 MiB never filled up");
        match q.enqueue(&kib(i)[..], EnqueueOptions::default()) {
            Ok(e) => enqueued.push(e.id()),
            Err(e) => break e,
        }
    };
    assert!(is_disk_full(&full), "the full disk's error: {full:?}");
    assert!(enqueued.len() > 100, "only {} jobs fit", enqueued.len());
    let after = q.enqueue(&b"x"[..], EnqueueOptions::default());
    assert!(
        matches!(after, Err(Error::CommitFailed { .. })),
        "an enqueue on the failed handle: {after:?}"
    );
    drop(q);
    // A reader needs no space: it reads every job enqueued Ok (repairing in memory if needed).
    let reader = leaseq::Reader::open(&path).unwrap();
    assert!(reader.stats().unwrap().total >= enqueued.len() as u64);
    assert_eq!(reader.check().unwrap(), vec![]);
    drop(reader);
    eprintln!(
        "full disk: {} jobs of 1 KiB enqueued, then {full}; {} bytes free",
        enqueued.len(),
        free_bytes(&fs.mnt)
    );

    // Still full: the reopen and a drain either work or fail with the full disk's error.
    let mut acked = 0u32;
    match open_without_reserve(&path) {
        Ok(q) => {
            // Reads need no space.
            assert_eq!(q.check().unwrap(), vec![]);
            assert!(q.stats().unwrap().total >= enqueued.len() as u64);
            assert!(q.job(enqueued[0]).unwrap().is_some());
            loop {
                let lease = match q.dequeue() {
                    Ok(Some(l)) => l,
                    Ok(None) => break,
                    Err(e) => {
                        assert!(is_disk_full(&e), "a dequeue on the full disk: {e:?}");
                        eprintln!("full disk: a dequeue while full: {e}");
                        break;
                    }
                };
                let id = lease.id().0;
                match lease.ack_with(|tx| crate::common::bump(tx, id)) {
                    Ok(_) => acked += 1,
                    Err(e) => {
                        assert!(is_disk_full(&e), "an ack_with on the full disk: {e:?}");
                        break;
                    }
                }
                if acked == 50 {
                    break;
                }
            }
            eprintln!("full disk: reopened while full, {acked} jobs drained with ack_with");
        }
        Err(e) => {
            assert!(is_disk_full(&e), "the reopen on the full disk: {e:?}");
            eprintln!("full disk: the reopen while full failed: {e}");
        }
    }

    // Space freed: every job is there, new ones go in, everything drains once.
    std::fs::remove_file(&ballast).unwrap();
    let q = open_without_reserve(&path).unwrap();
    assert_eq!(q.check().unwrap(), vec![]);
    let extra = q
        .enqueue(&kib(99_999)[..], EnqueueOptions::default())
        .unwrap()
        .id();
    let mut left: std::collections::BTreeSet<u64> = enqueued.iter().map(|id| id.0).collect();
    let effects_before = crate::common::effects(&q);
    // Every ack_with answered Ok, and perhaps the one that failed (its commit in doubt).
    let n = effects_before.len() as u32;
    assert!(n == acked || n == acked + 1, "{n} effects, {acked} acked");
    for id in effects_before.keys() {
        assert!(
            left.remove(id),
            "effect of job {id}, which was not enqueued"
        );
        assert!(
            q.job(leaseq::JobId(*id)).unwrap().is_none(),
            "job {id} acked and still there"
        );
    }
    left.insert(extra.0);
    while let Some(l) = q.dequeue().unwrap() {
        let id = l.id().0;
        l.ack_with(|tx| crate::common::bump(tx, id)).unwrap();
        // The in-doubt enqueue (the one that hit the full disk) may be there: not in `left`.
        left.remove(&id);
    }
    assert!(left.is_empty(), "jobs enqueued Ok and lost: {left:?}");
    assert!(crate::common::effects(&q).values().all(|&n| n == 1));
    assert_eq!(q.check().unwrap(), vec![]);

    // Compaction with 16 KiB left: done, or refused with the full disk's error; either way
    // the 200 jobs kept are all there after a reopen.
    let mut q = q;
    for i in 0..200 {
        q.enqueue(&kib(i)[..], EnqueueOptions::default()).unwrap();
    }
    let leave = 16 * 1024;
    let ballast_len = free_bytes(&fs.mnt).saturating_sub(leave);
    std::fs::write(&ballast, vec![7u8; ballast_len as usize]).unwrap();
    match q.compact() {
        Ok(done) => eprintln!("full disk: compact with 16 KiB free: Ok({done})"),
        Err(e) => {
            assert!(is_disk_full(&e), "compact on a nearly full disk: {e:?}");
            eprintln!("full disk: compact with 16 KiB free: {e}");
        }
    }
    drop(q);
    std::fs::remove_file(&ballast).unwrap();
    let q = open_without_reserve(&path).unwrap();
    assert_eq!(q.check().unwrap(), vec![]);
    assert_eq!(q.stats().unwrap().total, 200);
}

// Issue 41: the disk reserve. An app fills a 32 MiB tmpfs with its own enqueues (the
// default reserve: an eighth of it, 4 MiB): the enqueue that meets the reserve is refused
// `StorageFull`, nothing written, never an I/O error; the file says so in its stats and an
// event, and its reserve file stays (only another process's filling, the disk nearly out,
// takes it). The drain (`ack_with`) then takes every job, each effect applied once, with no
// error and no restart; and the file takes enqueues again by itself, the turn announced.
#[test]
fn a_disk_the_app_fills_itself_refuses_enqueues_and_drains_every_job() {
    let Some(fs) = tmpfs_or_skip("disk reserve (app fills)", "32m") else {
        return;
    };
    let path = fs.mnt.join("q.leaseq");
    let reserve_file = fs.mnt.join("q.leaseq-reserve");
    let q = Queue::open(&path).unwrap();
    let events = q.events().unwrap();
    let mut turned_full = false;
    let mut turned_ok = false;
    let reserve_len = std::fs::metadata(&reserve_file).unwrap().len();
    assert_eq!(reserve_len, 4 << 20, "the default reserve on a 32 MiB disk");
    let mut enqueued = Vec::new();
    let refused = loop {
        let i = enqueued.len() as u32;
        assert!(i < 40_000, "32 MiB never filled up");
        while let Some(e) = events.try_recv() {
            turned_full |= matches!(e, leaseq::Event::StorageFull { .. });
        }
        match q.enqueue(&kib(i)[..], EnqueueOptions::default()) {
            Ok(e) => enqueued.push(e.id().0),
            Err(e) => break e,
        }
    };
    let Error::StorageFull {
        available_bytes,
        reserve_bytes,
        ..
    } = refused
    else {
        panic!("the full disk's refusal: {refused:?}")
    };
    assert_eq!(reserve_bytes, 4 << 20);
    assert!(enqueued.len() > 5_000, "only {} jobs fit", enqueued.len());
    let free = free_bytes(&fs.mnt);
    eprintln!(
        "disk reserve: {} jobs of 1 KiB, then refused with {available_bytes} bytes free (df: {free})",
        enqueued.len()
    );
    assert!(
        reserve_file.exists(),
        "the reserve file is kept for another process's filling"
    );
    assert!(
        free >= 1 << 20,
        "a quarter of the reserve is free at least: {free}"
    );
    let stats = q.stats().unwrap();
    assert!(stats.storage_full_ms.is_some(), "{stats:?}");
    assert_eq!(
        stats.total,
        enqueued.len() as u64,
        "the refused job is not stored"
    );
    while let Some(e) = events.try_recv() {
        turned_full |= matches!(e, leaseq::Event::StorageFull { .. });
    }
    assert!(turned_full, "no StorageFull event");
    // Another refusal, of a batch and inside a transaction: nothing written either.
    assert!(matches!(
        q.enqueue_batch(vec![(&b"a"[..], EnqueueOptions::default())]),
        Err(Error::StorageFull { .. })
    ));
    assert_eq!(q.stats().unwrap().total, enqueued.len() as u64);

    // The drain: every job, its effect once, no error.
    let mut left: std::collections::BTreeSet<u64> = enqueued.iter().copied().collect();
    while let Some(l) = q.dequeue().unwrap() {
        let id = l.id().0;
        l.ack_with(|tx| crate::common::bump(tx, id)).unwrap();
        assert!(left.remove(&id), "job {id} delivered twice");
        while let Some(e) = events.try_recv() {
            turned_ok |= e == leaseq::Event::StorageAvailable;
        }
    }
    assert!(left.is_empty(), "{} jobs not drained", left.len());
    let effects = crate::common::effects(&q);
    assert_eq!(effects.len(), enqueued.len());
    assert!(effects.values().all(|&n| n == 1));

    // Room again, by itself: the freed pages count, the reserve file comes back.
    let started = std::time::Instant::now();
    let again = loop {
        match q.enqueue(&b"after"[..], EnqueueOptions::default()) {
            Ok(e) => break e.id(),
            Err(Error::StorageFull { .. }) if started.elapsed().as_secs() < 10 => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("the drained file still refuses: {e:?}"),
        }
    };
    assert_eq!(q.stats().unwrap().storage_full_ms, None);
    assert!(reserve_file.exists(), "the reserve file stayed");
    turned_ok |=
        std::iter::from_fn(|| events.try_recv()).any(|e| e == leaseq::Event::StorageAvailable);
    assert!(turned_ok, "no StorageAvailable event");
    assert_eq!(q.job(again).unwrap().unwrap().id, again);
    assert_eq!(q.check().unwrap(), vec![]);
    drop(events);
    let mut q = q;
    q.compact().unwrap();
    q.enqueue(&b"after compaction"[..], EnqueueOptions::default())
        .unwrap();
    assert_eq!(std::fs::metadata(&reserve_file).unwrap().len(), 4 << 20);
}

// Issue 41, from a new user's trial: a producer faster than the drain on a small disk (24
// MiB, the default reserve). The producer enqueues 1 KiB readings as fast as it can and,
// refused `StorageFull`, waits 20 ms and tries the same reading again; the consumer acks
// with `ack_with` at the same time. For 8 s the disk stays at the edge: no call may fail
// with an I/O error (the first build let a stale count of the file's free pages take the
// disk to its last byte within seconds), and every reading enqueued `Ok` is applied once.
#[test]
fn a_producer_faster_than_the_drain_never_takes_the_disk_to_its_last_byte() {
    let Some(fs) = tmpfs_or_skip("disk reserve (fast producer)", "24m") else {
        return;
    };
    let path = fs.mnt.join("q.leaseq");
    let q = Queue::open(&path).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (q, stop) = (q.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut ids, mut refused) = (Vec::new(), 0u64);
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match q.enqueue(&kib(i)[..], EnqueueOptions::default()) {
                    Ok(e) => {
                        ids.push(e.id().0);
                        i += 1;
                    }
                    Err(Error::StorageFull { .. }) => {
                        refused += 1;
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    Err(e) => panic!("the producer met {e:?} after {i} readings"),
                }
            }
            (ids, refused)
        })
    };
    let consumer = {
        let (q, stop) = (q.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut acked = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match q.dequeue_timeout(std::time::Duration::from_millis(200)) {
                    Ok(Some(l)) => {
                        let id = l.id().0;
                        l.ack_with(|tx| crate::common::bump(tx, id))
                            .unwrap_or_else(|e| panic!("the consumer's ack met {e:?}"));
                        acked += 1;
                    }
                    Ok(None) => {}
                    Err(e) => panic!("the consumer's dequeue met {e:?}"),
                }
            }
            acked
        })
    };
    std::thread::sleep(std::time::Duration::from_secs(8));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ids, refused) = producer.join().unwrap();
    let acked = consumer.join().unwrap();
    eprintln!(
        "disk reserve, fast producer: {} readings enqueued, {refused} refusals, {acked} acked, {} bytes free",
        ids.len(),
        free_bytes(&fs.mnt)
    );
    assert!(refused > 0, "the disk never reached the reserve");
    while let Some(l) = q.dequeue().unwrap() {
        let id = l.id().0;
        l.ack_with(|tx| crate::common::bump(tx, id)).unwrap();
    }
    let effects = crate::common::effects(&q);
    assert_eq!(effects.len(), ids.len());
    assert!(ids.iter().all(|id| effects.get(id) == Some(&1)));
    assert_eq!(q.check().unwrap(), vec![]);
}

// Issue 41: another process fills the disk (`dd` until ENOSPC) while the app has 3,000 jobs
// waiting. The app's next commit sees the disk full and gives its reserve file back, so the
// drain takes every job, each effect once, without an error or a restart, while enqueues are
// refused `StorageFull`. Once the other file is deleted the app takes enqueues again by
// itself, its reserve file made again.
#[test]
fn a_disk_another_process_fills_leaves_the_drain_its_reserve() {
    let Some(fs) = tmpfs_or_skip("disk reserve (another process fills)", "32m") else {
        return;
    };
    let path = fs.mnt.join("q.leaseq");
    let reserve_file = fs.mnt.join("q.leaseq-reserve");
    let q = Queue::builder().disk_reserve(4 << 20).open(&path).unwrap();
    let mut left = std::collections::BTreeSet::new();
    for i in 0..3_000 {
        left.insert(
            q.enqueue(&kib(i)[..], EnqueueOptions::default())
                .unwrap()
                .id()
                .0,
        );
    }
    assert_eq!(std::fs::metadata(&reserve_file).unwrap().len(), 4 << 20);
    let filler = fs.mnt.join("filler");
    let dd = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}", filler.display()))
        .output()
        .unwrap();
    assert!(!dd.status.success(), "dd filled the disk and failed");
    assert!(
        String::from_utf8_lossy(&dd.stderr).contains("No space left"),
        "{}",
        String::from_utf8_lossy(&dd.stderr)
    );
    assert!(free_bytes(&fs.mnt) < 64 << 10, "the disk is full");
    let mut drained = 0u64;
    while let Some(l) = q.dequeue().unwrap() {
        let id = l.id().0;
        l.ack_with(|tx| crate::common::bump(tx, id)).unwrap();
        assert!(left.remove(&id), "job {id} delivered twice");
        drained += 1;
        if drained == 1 {
            assert!(!reserve_file.exists(), "the reserve file given back");
            assert!(matches!(
                q.enqueue(&b"x"[..], EnqueueOptions::default()),
                Err(Error::StorageFull { .. })
            ));
        }
    }
    assert!(left.is_empty(), "{} jobs not drained", left.len());
    let effects = crate::common::effects(&q);
    assert_eq!(effects.len(), 3_000);
    assert!(effects.values().all(|&n| n == 1));
    assert!(q.stats().unwrap().storage_full_ms.is_some());
    assert!(
        free_bytes(&fs.mnt) >= 1 << 20,
        "the drain used more than three quarters of the reserve: {} bytes free",
        free_bytes(&fs.mnt)
    );
    eprintln!(
        "disk reserve: {drained} jobs drained on a disk another process filled; {} bytes free after",
        free_bytes(&fs.mnt)
    );

    std::fs::remove_file(&filler).unwrap();
    let started = std::time::Instant::now();
    loop {
        match q.enqueue(&b"after"[..], EnqueueOptions::default()) {
            Ok(_) => break,
            Err(Error::StorageFull { .. }) if started.elapsed().as_secs() < 10 => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("the freed disk still refuses: {e:?}"),
        }
    }
    assert_eq!(std::fs::metadata(&reserve_file).unwrap().len(), 4 << 20);
    assert_eq!(q.stats().unwrap().storage_full_ms, None);
    assert_eq!(q.check().unwrap(), vec![]);
}

// Issue 41: the file limit. With 16 MiB for the file and its journal (4 MiB of which the
// journal takes) and a 2 MiB reserve, enqueues are refused `StorageFull` before the file
// and journal take 16 MiB on disk; the drain then takes every job without going past it, and
// the file takes enqueues again.
#[test]
fn the_file_limit_refuses_enqueues_before_it_and_the_drain_stays_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let max = 16u64 << 20;
    let q = Queue::builder()
        .disk_reserve(2 << 20)
        .file_bytes_max(Some(max))
        .open(&path)
        .unwrap();
    let taken = || {
        crate::common::allocated_bytes(&path)
            + crate::common::allocated_bytes(&dir.path().join("q.leaseq-journal"))
    };
    let mut enqueued = Vec::new();
    let refused = loop {
        let i = enqueued.len() as u32;
        assert!(i < 40_000, "the limit never met");
        assert!(taken() <= max, "{} bytes taken at job {i}", taken());
        match q.enqueue(&kib(i)[..], EnqueueOptions::default()) {
            Ok(e) => enqueued.push(e.id().0),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(refused, Error::StorageFull { file_bytes_max: Some(m), .. } if m == max),
        "{refused:?}"
    );
    assert!(enqueued.len() > 1_000, "only {} jobs fit", enqueued.len());
    let mut n = 0;
    while let Some(l) = q.dequeue().unwrap() {
        let id = l.id().0;
        l.ack_with(|tx| crate::common::bump(tx, id)).unwrap();
        n += 1;
        assert!(taken() <= max, "{} bytes taken after {n} acks", taken());
    }
    assert_eq!(n, enqueued.len());
    let started = std::time::Instant::now();
    while let Err(e) = q.enqueue(&b"after"[..], EnqueueOptions::default()) {
        assert!(matches!(e, Error::StorageFull { .. }), "{e:?}");
        assert!(
            started.elapsed().as_secs() < 10,
            "the drained file still refuses"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(q.check().unwrap(), vec![]);
    // A limit under 4 times the reserve is refused at open.
    let small = Queue::builder()
        .disk_reserve(1 << 20)
        .file_bytes_max(Some(3 << 20))
        .open(dir.path().join("other.leaseq"));
    assert!(
        matches!(
            small,
            Err(Error::InvalidOption {
                field: "file_bytes_max",
                ..
            })
        ),
        "{small:?}"
    );
}

// C41: C08's SIGKILLed workloads on a small tmpfs that fills up: before every round a ballast
// leaves 8-200 KiB free, so the queue file runs out of room in many rounds (the child reports
// the typed error and stops, its handle failed) and the next child opens the full disk. After
// each round, every promise of C08's model holds.
#[test]
fn sigkilled_workloads_on_a_small_tmpfs_keep_every_reported_promise() {
    if child_scenario().is_some() {
        return;
    }
    let Some(fs) = tmpfs_or_skip("kills on a small tmpfs", "2m") else {
        return;
    };
    let runs = env_u64("LEASEQ_FULL_DISK_RUNS", 30);
    let t = run_many(
        "C41 (kills on a small tmpfs)",
        "LEASEQ_FULL_DISK_SEED=<seed> LEASEQ_FULL_DISK_RUNS=1",
        runs,
        env_u64("LEASEQ_FULL_DISK_SEED", BASE_SEED_DEFAULT + 0x1_0000),
        1,
        Some(&Injector::disk_only(&fs.mnt)),
    );
    if runs >= 30 {
        assert!(
            t.io_errors > 0 && t.full_disk_opens > 0,
            "the file system never filled up: {t:?}"
        );
        assert!(t.storage_full > 0, "no enqueue met the disk reserve: {t:?}");
    }
}

// ------------------------------------------------------------------------------------------
// Bad files from real tools
// ------------------------------------------------------------------------------------------

/// What opening a file some tool left behind gave: a consistent queue (its jobs), or a typed
/// refusal. Anything else (a panic, a queue whose `check()` finds violations) fails the test.
fn open_left_behind(path: &Path, what: &str) -> Result<u64, String> {
    let opened = std::panic::catch_unwind(|| Queue::open(path))
        .unwrap_or_else(|_| panic!("{what}: opening it panicked"));
    match opened {
        Ok(q) => {
            assert_eq!(q.check().unwrap(), vec![], "{what}: check()");
            let s = q.stats().unwrap();
            assert_eq!(s.leased, 0, "{what}: leases survived the open");
            Ok(s.total)
        }
        Err(
            e @ (Error::Truncated { .. }
            | Error::Corrupted { .. }
            | Error::NotLeaseq { .. }
            | Error::UnsupportedVersion { .. }),
        ) => Err(e.to_string()),
        Err(e) => panic!("{what}: opening it gave {e:?}, not a typed refusal of the file"),
    }
}

// A copy that ran out of space: `cp` of a 1,000-job queue onto a 512 KiB tmpfs stops with
// ENOSPC and leaves a truncated file. Opening it is a typed refusal that leaves it
// byte-identical (never a panic, never an empty queue made in its place).
#[test]
fn a_copy_cut_short_by_a_full_disk_is_refused_unchanged() {
    if child_scenario().is_some() {
        return;
    }
    let Some(fs) = tmpfs_or_skip("a copy cut short", "512k") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    {
        let q = Queue::open(&path).unwrap();
        let jobs = (0..1000).map(|i| (kib(i), EnqueueOptions::default()));
        let jobs: Vec<_> = jobs.collect();
        q.enqueue_batch(jobs.iter().map(|(p, o)| (&p[..], o.clone())))
            .unwrap();
    }
    let copy = fs.mnt.join("q.leaseq");
    let cp = std::process::Command::new("cp")
        .arg(&path)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        !cp.status.success(),
        "the copy fit: the test proves nothing"
    );
    assert!(String::from_utf8_lossy(&cp.stderr).contains("No space left"));
    let before = std::fs::read(&copy).unwrap();
    assert!(before.len() < std::fs::metadata(&path).unwrap().len() as usize);
    let refused = open_left_behind(&copy, "a copy cut short");
    assert!(refused.is_err(), "a truncated copy opened: {refused:?}");
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        before,
        "the refused open changed the file"
    );
}

// What a backup tool does: `cp` of the file while an app writes it (C08's busy child), 20
// times at random moments. Each copy opens as a consistent queue (the last commit wholly in
// the copy, repaired, its leases returned) or is refused with a typed error; never a panic.
#[test]
fn copies_taken_while_the_app_writes_open_consistent_or_are_refused() {
    if child_scenario().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let mut child = ChildProc::spawn(crate::process_kill::ENTRY, "1234 0", &path);
    assert_eq!(child.next_message().as_deref(), Some("OPEN"));
    let mut rng = fastrand::Rng::with_seed(0xC0_91E5);
    let (mut opened, mut refused) = (0, Vec::new());
    for i in 0..20 {
        std::thread::sleep(Duration::from_millis(rng.u64(1..40)));
        let copy = dir.path().join(format!("copy{i}.leaseq"));
        let cp = std::process::Command::new("cp")
            .arg(&path)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(cp.success());
        match open_left_behind(&copy, &format!("copy {i}")) {
            Ok(_) => opened += 1,
            Err(e) => refused.push(e),
        }
        if child.exited().is_some() {
            break;
        }
    }
    let said = child.kill_and_collect();
    assert!(!said.iter().any(|m| m.starts_with("ERR")), "{said:?}");
    eprintln!("copies while writing: {opened} opened, refused: {refused:?}");
    assert!(opened > 0, "no copy opened: {refused:?}");
}

// A file whose directory entry was replaced while the app had it open (an editor's save, a
// sync tool, `mv`): the app goes on writing to the file it opened, which is no longer at the
// path. A new open of the path gets what is there now: a foreign file is `NotLeaseq` and stays
// as it is, another queue file opens with its own jobs; never a panic.
#[test]
fn a_replaced_directory_entry_opens_what_is_there_now() {
    if child_scenario().is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    let other = dir.path().join("other.leaseq");
    {
        let q = Queue::open(&other).unwrap();
        q.enqueue(&b"the other queue's"[..], EnqueueOptions::default())
            .unwrap();
    }
    let app = Queue::open(&path).unwrap();
    for _ in 0..3 {
        app.enqueue(&b"the app's"[..], EnqueueOptions::default())
            .unwrap();
    }
    std::fs::rename(&other, &path).unwrap();
    // The app still works on the file it opened.
    app.enqueue(&b"the app's, after"[..], EnqueueOptions::default())
        .unwrap();
    assert_eq!(app.stats().unwrap().total, 4);
    assert_eq!(open_left_behind(&path, "a queue moved over it"), Ok(1));

    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, b"not a queue").unwrap();
    std::fs::rename(&foreign, &path).unwrap();
    assert!(open_left_behind(&path, "a text file moved over it").is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"not a queue");
    drop(app);
}
