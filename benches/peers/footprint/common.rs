//! What the three footprint apps share, included by path (`#[path = "../../common.rs"]`) so
//! that no shared crate adds to their crate counts: the command line, the payload, and the
//! memory figures from /proc/self/status.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Payload bytes per job.
pub const PAYLOAD_LEN: usize = 64;
/// Jobs per enqueue call (one transaction, durable on return) in `fill` and `crash`.
pub const CHUNK: usize = 1000;
/// Jobs `crash` takes (leased, or running in a handler that never returns) before it aborts.
pub const CRASH_TAKEN: usize = 10;
/// Queue file name inside the directory given on the command line.
pub const FILE: &str = "queue.db";
/// Where `crash` lists the indices of the jobs it held.
const TAKEN: &str = "taken";

/// The payload of job `index` (its enqueue order): the index (8 bytes, little-endian), then
/// fixed bytes; so `first` and `recover` can tell the jobs `crash` held (`crash` writes their
/// indices to `DIR/taken`: not always the first ones enqueued, apalis-sqlite's order among
/// jobs of one second is its ULIDs' order, random within a millisecond).
pub fn payload(index: u64) -> Vec<u8> {
    let mut p: Vec<u8> = (0..PAYLOAD_LEN)
        .map(|i| (i as u8).wrapping_mul(37))
        .collect();
    p[..8].copy_from_slice(&index.to_le_bytes());
    p
}

/// The index `payload` wrote.
pub fn index_of(payload: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&payload[..8]);
    u64::from_le_bytes(b)
}

pub enum Mode {
    /// Enqueue N jobs, then report peak RSS.
    Fill(usize),
    /// Open a file holding N queued jobs, take nothing, report RSS.
    Rss(usize),
    /// Enqueue N jobs, take `CRASH_TAKEN` of them, abort while they are held.
    Crash(usize),
    /// Open the file `crash` left, time to the first job handed out.
    First,
    /// Open the file `crash` left and run every job (handler succeeds at once) until the
    /// jobs `crash` held have all come back, or `RECOVER_LIMIT`; reports when and after how
    /// many others they came (not part of `measure`'s table: how each queue recovers).
    Recover,
}

/// How long `recover` waits for the jobs `crash` held.
pub const RECOVER_LIMIT: Duration = Duration::from_secs(240);

pub struct Args {
    pub mode: Mode,
    pub dir: PathBuf,
}

impl Args {
    pub fn file(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// `crash`: records the jobs it holds (before it aborts).
    pub fn save_taken(&self, taken: &[u64]) {
        let list: Vec<String> = taken.iter().map(u64::to_string).collect();
        std::fs::write(self.dir.join(TAKEN), list.join(",")).expect("write the taken list");
        report("taken", taken.len());
    }

    /// The jobs `crash` held (none if `crash` did not run here).
    pub fn taken(&self) -> Vec<u64> {
        std::fs::read_to_string(self.dir.join(TAKEN))
            .map(|s| s.split(',').filter_map(|i| i.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

const USAGE: &str = "usage: APP fill N DIR | rss N DIR | crash N DIR | first DIR | recover DIR";

pub fn args() -> Args {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let n = |s: &String| -> usize { s.parse().expect(USAGE) };
    let (mode, dir) = match a.as_slice() {
        [m, count, dir] if m == "fill" => (Mode::Fill(n(count)), dir),
        [m, count, dir] if m == "rss" => (Mode::Rss(n(count)), dir),
        [m, count, dir] if m == "crash" => (Mode::Crash(n(count)), dir),
        [m, dir] if m == "first" => (Mode::First, dir),
        [m, dir] if m == "recover" => (Mode::Recover, dir),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the directory");
    Args { mode, dir }
}

/// A field of /proc/self/status in KiB (`VmHWM`, `VmRSS`).
pub fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} not in /proc/self/status"))
}

/// Prints `key=value` lines (what `measure` parses).
pub fn report(key: &str, value: impl std::fmt::Display) {
    println!("{key}={value}");
}

pub fn report_memory() {
    report("vmhwm_kib", status_kib("VmHWM"));
    report("vmrss_kib", status_kib("VmRSS"));
}

/// The clock `first` times from: main's first line, and, where `measure` exported
/// `FP_SPAWN_NS` (the wall clock in ns just before it started the process), the spawn too.
pub struct Clock {
    main: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            main: Instant::now(),
        }
    }

    /// Reports `first_ms` (since the spawn when known, else since main) and
    /// `first_main_ms` (since main).
    pub fn report_first(&self, index: u64, taken: &[u64]) {
        let since_main = self.main.elapsed();
        let since_spawn = std::env::var("FP_SPAWN_NS")
            .ok()
            .and_then(|v| v.parse::<u128>().ok())
            .map(|spawn| {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos();
                Duration::from_nanos(now.saturating_sub(spawn) as u64)
            });
        let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
        report("first_ms", ms(since_spawn.unwrap_or(since_main)));
        report("first_main_ms", ms(since_main));
        report("first_index", index);
        report("first_was_taken_by_crash", taken.contains(&index));
    }
}

/// `recover`'s bookkeeping: every job handed out, in order, and when the held ones came.
pub struct Recovered {
    start: Instant,
    taken: Vec<u64>,
    handled: u64,
    /// (position among the jobs handed out, ms since start) of each held job that came back.
    held: Vec<(u64, f64)>,
}

impl Recovered {
    pub fn start(taken: Vec<u64>) -> Recovered {
        assert_eq!(taken.len(), CRASH_TAKEN, "the jobs `crash` held");
        Recovered {
            start: Instant::now(),
            taken,
            handled: 0,
            held: Vec::new(),
        }
    }

    /// Records a job handed out; true once every held job came back.
    pub fn handled(&mut self, index: u64) -> bool {
        if self.taken.contains(&index) {
            self.held
                .push((self.handled, self.start.elapsed().as_secs_f64() * 1e3));
        }
        self.handled += 1;
        self.held.len() == CRASH_TAKEN
    }

    pub fn timed_out(&self) -> bool {
        self.start.elapsed() > RECOVER_LIMIT
    }

    pub fn report(&self) {
        report("handled", self.handled);
        report("held_back", self.held.len());
        let list = |f: &dyn Fn(&(u64, f64)) -> String| {
            self.held.iter().map(f).collect::<Vec<_>>().join(",")
        };
        report("held_positions", list(&|h| h.0.to_string()));
        report("held_ms", list(&|h| format!("{:.0}", h.1)));
    }
}
