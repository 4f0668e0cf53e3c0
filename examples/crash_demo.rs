//! The crash demo: word counts over real text files, computed by a worker process that is
//! killed with SIGKILL at random points, with an exactly-once effect per line.
//!
//! ```text
//! cargo run --release --example crash_demo [-- [--seed N] [--crashes K] [PATH ...]]
//! ```
//!
//! 1. Every line of the input files (default: this repository's `src/` and `README.md`) is
//!    enqueued as one job, keyed `file:line` as its idempotency key.
//! 2. A worker process (this binary, re-run with `--worker`) takes jobs with two consumer
//!    threads and applies each line's word counts to a redb table in the queue's own file with
//!    `Lease::ack_with`: the counts, the applied-ids marker and the ack commit together.
//! 3. The parent kills the worker with SIGKILL after a random number of acks (and a random
//!    sub-millisecond delay, to land inside commits), at least `--crashes` times (default 3),
//!    reopening the queue after each kill; a last worker drains what is left.
//! 4. The counts table is compared with a direct single-pass count of the same files. The
//!    last line is `verified: jobs=N lost=0 duplicate_effects=0 redeliveries=R crashes=K`,
//!    and the exit code is non-zero if anything differs.
//!
//! Under an emulator that cannot start a foreign binary by itself (qemu-user without
//! binfmt_misc), set `LEASEQ_DEMO_RUNNER` to the command that runs one (for example
//! `qemu-arm -L /usr/arm-linux-gnueabihf`): each worker is started through it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use leaseq::redb::{ReadableDatabase, ReadableTable, TableDefinition};
use leaseq::{Durability, EnqueueOptions, Queue};

/// word -> count: the effect.
const WORDS: TableDefinition<&str, u64> = TableDefinition::new("demo_words");
/// line key -> (times applied, attempt that applied it): the evidence.
const LINES: TableDefinition<&str, (u64, u32)> = TableDefinition::new("demo_lines");

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A command running this binary (`exe`), through `LEASEQ_DEMO_RUNNER` when it is set (an
/// emulator's command line, split on whitespace).
fn worker_command(exe: &Path) -> Command {
    let runner = std::env::var("LEASEQ_DEMO_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(exe);
            cmd
        }
        None => Command::new(exe),
    }
}

fn words(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for p in entries {
            collect_files(&p, out)?;
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// (key, line) for every line of every file, each file once however often it is named;
/// files that are not UTF-8 text are skipped.
fn read_lines(inputs: &[PathBuf]) -> Result<Vec<(String, String)>, Error> {
    let mut files = Vec::new();
    for p in inputs {
        collect_files(p, &mut files)
            .map_err(|e| format!("cannot read input {}: {e}", p.display()))?;
    }
    let mut seen = std::collections::HashSet::new();
    let mut lines = Vec::new();
    for f in files {
        let canonical = f
            .canonicalize()
            .map_err(|e| format!("cannot read input {}: {e}", f.display()))?;
        if !seen.insert(canonical) {
            continue; // named twice (e.g. `src src/lib.rs`): one job per line, once
        }
        let text = match std::fs::read_to_string(&f) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                eprintln!("skipping {} (not UTF-8 text)", f.display());
                continue;
            }
            Err(e) => return Err(format!("cannot read input {}: {e}", f.display()).into()),
        };
        for (i, line) in text.lines().enumerate() {
            lines.push((format!("{}:{}", f.display(), i + 1), line.to_string()));
        }
    }
    Ok(lines)
}

fn worker(queue_path: &Path) -> Result<(), Error> {
    let queue = Queue::builder().max_attempts(1000).open(queue_path)?;
    std::thread::scope(|s| -> Result<(), Error> {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let queue = queue.clone();
                s.spawn(move || -> Result<(), Error> {
                    while let Some(lease) = queue.dequeue_timeout(Duration::from_millis(200))? {
                        let (key, line): (String, String) = lease.decode()?;
                        let attempt = lease.attempt();
                        lease.ack_with(|tx| {
                            let mut counts = tx.open_table(WORDS)?;
                            for w in words(&line) {
                                let n = counts.get(w.as_str())?.map_or(0, |v| v.value());
                                counts.insert(w.as_str(), n + 1)?;
                            }
                            let mut lines = tx.open_table(LINES)?;
                            let times = lines.get(key.as_str())?.map_or(0, |v| v.value().0);
                            lines.insert(key.as_str(), (times + 1, attempt))?;
                            Ok(())
                        })?;
                        println!("acked");
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().expect("worker thread panicked")?;
        }
        Ok(())
    })
}

fn run() -> Result<bool, Error> {
    let mut args = std::env::args().skip(1);
    let mut inputs = Vec::new();
    let mut seed = None;
    let mut crashes_min = 3u32;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--worker" => {
                let path = args.next().ok_or("--worker needs the queue path")?;
                worker(Path::new(&path))?;
                return Ok(true);
            }
            "--seed" => seed = Some(args.next().ok_or("--seed needs a number")?.parse()?),
            "--crashes" => crashes_min = args.next().ok_or("--crashes needs a number")?.parse()?,
            _ => inputs.push(PathBuf::from(a)),
        }
    }
    if inputs.is_empty() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        inputs = vec![root.join("src"), root.join("README.md")];
    }
    let seed = seed.unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let lines = read_lines(&inputs)?;
    let jobs = lines.len() as u64;
    if jobs == 0 {
        return Err("no input lines".into());
    }

    let dir = tempfile::tempdir()?;
    let queue_path = dir.path().join("crash_demo.leaseq");
    println!(
        "crash demo: {jobs} lines from {} input path(s), seed {seed}, queue {}",
        inputs.len(),
        queue_path.display()
    );
    {
        // Bulk load without an fsync per line, then one flush makes it all durable.
        let queue = Queue::builder()
            .durability(Durability::None)
            .payload_bytes_max(leaseq::PAYLOAD_BYTES_MAX_CAP)
            .open(&queue_path)?;
        for (key, line) in &lines {
            // The job type the workers decode: `(String, String)`.
            queue.enqueue_value(
                &(key.clone(), line.clone()),
                EnqueueOptions::default().idempotency_key(key),
            )?;
        }
        queue.flush()?;
    }

    let exe = std::env::current_exe()?;
    let mut crashes = 0u32;
    let mut remaining = jobs;
    loop {
        let kill = crashes < crashes_min && remaining > 0;
        let mut child = worker_command(&exe)
            .arg("--worker")
            .arg(&queue_path)
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(child.stdout.take().ok_or("no worker stdout")?).lines();
        if kill {
            // Kill after a random share of what is left, early enough to leave work behind;
            // with little left, kill before the first ack (during start-up or recovery).
            let kills_left = u64::from(crashes_min - crashes);
            let kill_after = if remaining <= kills_left {
                0
            } else {
                rng.u64(1..=remaining.div_ceil(kills_left + 1).max(1))
            };
            let mut acked = 0;
            // Keep reading (`out` stays open until after the kill) so the worker never sees
            // a closed pipe: it must die by SIGKILL, not by an I/O error.
            while acked < kill_after {
                match out.next() {
                    Some(line) => {
                        if line? == "acked" {
                            acked += 1;
                        }
                    }
                    None => break, // the worker finished (or failed) on its own
                }
            }
            let jitter_us = if kill_after == 0 { 0..20_000 } else { 0..3000 };
            std::thread::sleep(Duration::from_micros(rng.u64(jitter_us)));
            child.kill()?; // SIGKILL
            child.wait()?;
            drop(out);
            crashes += 1;
            let queue = Queue::open(&queue_path)?;
            let stats = queue.stats()?;
            println!(
                "crash {crashes}: killed after {acked}+ acks; reopen returned {} lease(s), repaired={}, {} job(s) left",
                queue.recovery().leases_returned,
                queue.recovery().repaired,
                stats.total
            );
            remaining = stats.total;
        } else {
            let acked = out.map_while(Result::ok).filter(|l| l == "acked").count();
            let status = child.wait()?;
            if !status.success() {
                return Err(format!("worker failed: {status}").into());
            }
            println!("final worker drained {acked} job(s)");
            break;
        }
    }

    // Verify against a direct count.
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for (_, line) in &lines {
        for w in words(line) {
            *expected.entry(w).or_default() += 1;
        }
    }
    let queue = Queue::open(&queue_path)?;
    let violations = queue.check()?;
    let stats = queue.stats()?;
    let rtx = queue.database().begin_read()?;
    let counted: BTreeMap<String, u64> = rtx
        .open_table(WORDS)?
        .iter()?
        .map(|e| e.map(|(k, v)| (k.value().to_string(), v.value())))
        .collect::<Result<_, _>>()?;
    let applied: BTreeMap<String, (u64, u32)> = rtx
        .open_table(LINES)?
        .iter()?
        .map(|e| e.map(|(k, v)| (k.value().to_string(), v.value())))
        .collect::<Result<_, _>>()?;
    let lost = lines
        .iter()
        .filter(|(k, _)| !applied.contains_key(k))
        .count();
    let duplicate_effects: u64 = applied.values().map(|(times, _)| times - 1).sum();
    let redeliveries: u64 = applied
        .values()
        .map(|(_, attempt)| u64::from(attempt - 1))
        .sum();
    let counts_match = counted == expected;
    if !counts_match {
        let differing = expected
            .iter()
            .filter(|(w, n)| counted.get(*w) != Some(n))
            .count();
        eprintln!("word counts differ for {differing} word(s)");
    }
    if !violations.is_empty() {
        eprintln!("check() found violations: {violations:?}");
    }
    let ok = counts_match
        && lost == 0
        && duplicate_effects == 0
        && violations.is_empty()
        && stats.total == 0
        && crashes >= crashes_min;
    if crashes < crashes_min {
        eprintln!("only {crashes} of {crashes_min} crashes happened");
    }
    if stats.total != 0 {
        eprintln!("{} job(s) left in the queue", stats.total);
    }
    let line = format!(
        "jobs={jobs} lost={lost} duplicate_effects={duplicate_effects} redeliveries={redeliveries} crashes={crashes}"
    );
    if ok {
        println!("verified: {line}");
    } else {
        println!("NOT verified: {line}");
    }
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("crash demo error: {e}");
            ExitCode::FAILURE
        }
    }
}
