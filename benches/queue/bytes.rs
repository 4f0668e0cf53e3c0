//! Bytes written to storage per job and per call: the one place both benchmark harnesses count
//! them (`benches/queue`, and `benches/peers/common`, which includes this file by `#[path]`),
//! so every side of both is counted the same way.
//!
//! The count is the process's `write_bytes` from `/proc/self/io` (Linux; elsewhere there is no
//! count and the table says "n/a"): what the process caused to be sent to storage, every
//! thread's, counted when a page of the page cache is dirtied, so in whole pages (4 KiB), once
//! per page between two write-backs. Every side syncs before a call returns, so each call's
//! pages are counted in that call. It is read before and after a measured run of a known number
//! of jobs (and around each call, where one thread makes them), on a fresh file after a
//! warm-up; nothing else in the process writes meanwhile.
//!
//! Criterion measures time only, so the bytes are a pass of their own after criterion's groups,
//! over the benchmarks criterion ran (its filter applies): a table on stdout, and
//! `<criterion dir>/<group>/<side>/bytes.json` beside criterion's own results (written by a
//! full pass only), which `benches/ratios.py` and `benches/peers/table.py` read.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Bytes this process has caused to be written to storage so far: `write_bytes` of
/// `/proc/self/io` (all its threads, ended ones included); `None` where there is no such
/// counter (not Linux, or no procfs).
pub fn written() -> Option<u64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))?
        .trim()
        .parse()
        .ok()
}

/// How large a bytes pass the command line asks for, read as criterion reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// `--profile-time`: a profiler is watching criterion's loop; no pass.
    Skip,
    /// Criterion's test mode (`--test`, or no `--bench`: `cargo test --benches`): one
    /// iteration of each body, printed, no warm-up, nothing written.
    Quick,
    /// A benchmark run: about `jobs` jobs per side and group after a warm-up of a tenth as
    /// many, printed and written.
    Full,
}

impl Pass {
    /// The pass this process's arguments ask for.
    pub fn from_args() -> Pass {
        let args: Vec<String> = std::env::args().collect();
        let has = |flag: &str| args.iter().any(|a| a == flag);
        if has("--profile-time") || has("--list") {
            Pass::Skip
        } else if has("--test") || !has("--bench") {
            Pass::Quick
        } else {
            Pass::Full
        }
    }

    /// Iterations of a body doing `jobs_per_iteration` jobs each: (warm-up, measured), the
    /// measured ones doing at least `jobs` jobs in a full pass.
    pub fn iterations(self, jobs: usize, jobs_per_iteration: usize) -> (usize, usize) {
        match self {
            Pass::Skip => (0, 0),
            Pass::Quick => (0, 1),
            Pass::Full => {
                let measured = jobs.div_ceil(jobs_per_iteration).max(1);
                (measured.div_ceil(10), measured)
            }
        }
    }
}

/// Wraps each call of a benchmark body: [`Unmetered`] under criterion's clock (adds nothing),
/// [`Meter`] in the bytes pass.
pub trait Probe {
    /// Runs `f`, the call named `name`.
    fn call<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T;
}

/// Runs each call as it is.
pub struct Unmetered;

impl Probe for Unmetered {
    #[inline(always)]
    fn call<T>(&mut self, _name: &'static str, f: impl FnOnce() -> T) -> T {
        f()
    }
}

/// Counts each call and the bytes written during it, per call name (meaningful where one
/// thread makes the calls; concurrent bodies do not call it).
#[derive(Default)]
pub struct Meter {
    calls: Vec<Call>,
}

/// The calls of one name in a measured run.
#[derive(Clone, Debug)]
pub struct Call {
    pub name: &'static str,
    pub count: u64,
    /// Bytes written during them; `None` without a counter.
    pub bytes: Option<u64>,
}

impl Probe for Meter {
    fn call<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let before = written();
        let value = f();
        let bytes = before.zip(written()).map(|(b, a)| a - b);
        let at = match self.calls.iter().position(|c| c.name == name) {
            Some(at) => at,
            None => {
                self.calls.push(Call {
                    name,
                    count: 0,
                    bytes: Some(0),
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[at];
        call.count += 1;
        call.bytes = call.bytes.zip(bytes).map(|(sum, b)| sum + b);
        value
    }
}

/// One side's bytes in one group.
#[derive(Clone, Debug)]
pub struct Row {
    pub group: String,
    pub side: String,
    /// Jobs done by the measured run.
    pub jobs: u64,
    /// Bytes written during it; `None` without a counter.
    pub bytes: Option<u64>,
    /// Per call name, in the order first made (none for a concurrent body).
    pub calls: Vec<Call>,
}

impl Row {
    /// Bytes per job; `None` without a counter.
    pub fn per_job(&self) -> Option<f64> {
        self.bytes.map(|b| b as f64 / self.jobs.max(1) as f64)
    }
}

impl Call {
    /// Bytes per call; `None` without a counter.
    pub fn per_call(&self) -> Option<f64> {
        self.bytes.map(|b| b as f64 / self.count.max(1) as f64)
    }
}

/// Runs `body`, which does `jobs` jobs and makes its calls through the [`Meter`] it is given,
/// and counts the bytes it writes.
pub fn measure(group: &str, side: &str, jobs: usize, body: impl FnOnce(&mut Meter)) -> Row {
    let mut meter = Meter::default();
    let before = written();
    body(&mut meter);
    let bytes = before.zip(written()).map(|(b, a)| a - b);
    let row = Row {
        group: group.to_string(),
        side: side.to_string(),
        jobs: jobs as u64,
        bytes,
        calls: meter.calls,
    };
    // Progress, once the count is read (a redirected stderr writes to storage too).
    eprintln!("bytes: {group}/{side}: {} per job", kb(row.per_job()));
    row
}

/// `bytes` as kilobytes (1,000 bytes), one decimal; "n/a" without a count.
fn kb(bytes: Option<f64>) -> String {
    bytes.map_or_else(|| "n/a".to_string(), |b| format!("{:.1} KB", b / 1000.0))
}

/// The rows as a Markdown table: group, side, jobs, bytes per job, bytes per call.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "bytes written (/proc/self/io write_bytes; KB = 1,000 bytes), per job and per call \
         (where one thread makes the calls; a batch call does a batch of jobs):\n\n\
         | group | side | jobs | bytes/job | bytes/call |\n|---|---|---|---|---|\n",
    );
    for row in rows {
        let calls: Vec<String> = row
            .calls
            .iter()
            .map(|c| format!("{} {}", c.name, kb(c.per_call())))
            .collect();
        let calls = if calls.is_empty() {
            "-".to_string()
        } else {
            calls.join(", ")
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {calls} |",
            row.group,
            row.side,
            row.jobs,
            kb(row.per_job())
        );
    }
    out
}

/// Criterion's output directory, found as criterion finds it: `$CRITERION_HOME`, else
/// `$CARGO_TARGET_DIR/criterion`, else `criterion` in the target directory holding this
/// executable (`<target>/<profile>/deps/<bench>`).
pub fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return Path::new(&target).join("criterion");
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("criterion")))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

/// A JSON number, or `null` without a count.
fn json_number(value: Option<f64>) -> String {
    value.map_or_else(|| "null".to_string(), |v| format!("{v:.1}"))
}

/// Writes `row` to `<dir>/<group>/<side>/bytes.json` (beside criterion's results of that
/// benchmark), replacing an earlier one.
pub fn write_json(dir: &Path, row: &Row) -> std::io::Result<()> {
    // Names are criterion's ids as these harnesses spell them: no JSON escape needed.
    let plain = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    assert!(
        plain(&row.group) && plain(&row.side),
        "name to escape: {row:?}"
    );
    let calls: Vec<String> = row
        .calls
        .iter()
        .map(|c| {
            format!(
                "{{\"call\": \"{}\", \"count\": {}, \"bytes_per_call\": {}}}",
                c.name,
                c.count,
                json_number(c.per_call())
            )
        })
        .collect();
    let json = format!(
        "{{\"group\": \"{}\", \"side\": \"{}\", \"counter\": \"/proc/self/io write_bytes\", \
         \"jobs\": {}, \"bytes_per_job\": {}, \"calls\": [{}]}}\n",
        row.group,
        row.side,
        row.jobs,
        json_number(row.per_job()),
        calls.join(", ")
    );
    let at = dir.join(&row.group).join(&row.side);
    std::fs::create_dir_all(&at)?;
    std::fs::write(at.join("bytes.json"), json)
}

/// Prints the table of `rows` and, in a full pass, writes each row's JSON beside criterion's
/// results.
pub fn report(pass: Pass, rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!("\n{}", table(rows));
    if pass == Pass::Full {
        let dir = criterion_dir();
        for row in rows {
            if let Err(e) = write_json(&dir, row) {
                eprintln!("bytes: cannot write {}: {e}", dir.display());
            }
        }
        println!(
            "(each row also in {}/<group>/<side>/bytes.json)",
            dir.display()
        );
    }
}
