//! Memory and recovery at scale: peak resident memory with a deep queue, and the reopen
//! after a crash (SIGKILL) with many jobs and leases, with redb's quick-repair on and off and
//! leaseq's integrity check at open (`Builder::check_integrity`) on and off.
//!
//! ```text
//! cargo run --release --example scale [-- --jobs N --leases L --cache-mib C]
//! ```
//! Defaults: 1,000,000 jobs, 10,000 leases, 64 MiB cache. For each quick-repair setting, a
//! child process enqueues the jobs (batches of 10,000), leases `L` of them, reports its peak
//! RSS (VmHWM) and is killed with SIGKILL. For each check setting the parent reopens a copy
//! of the crashed file and times the open (repair or check, plus lease recovery) and the
//! first dequeue, then closes it cleanly and times a second open (the check's cost on a
//! clean file). Runs with a warm page cache (the copy was just written).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leaseq::{EnqueueOptions, Queue};

type Error = Box<dyn std::error::Error>;

fn peak_rss_kib() -> Result<u64, Error> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .ok_or("no VmHWM")?;
    Ok(line.split_whitespace().nth(1).ok_or("bad VmHWM")?.parse()?)
}

fn arg(name: &str, default: u64) -> Result<u64, Error> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).ok_or("missing value")?.parse()?),
        None => Ok(default),
    }
}

fn builder(quick_repair: bool, cache_mib: u64) -> leaseq::Builder {
    Queue::builder()
        .lease(Duration::from_secs(3600))
        .cache_bytes((cache_mib as usize) << 20)
        .quick_repair(quick_repair)
        .check_integrity(false)
}

fn child(
    path: &str,
    quick_repair: bool,
    jobs: u64,
    leases: u64,
    cache_mib: u64,
) -> Result<(), Error> {
    let queue = builder(quick_repair, cache_mib).open(path)?;
    let payload = [7u8; 64];
    let started = Instant::now();
    let mut left = jobs;
    while left > 0 {
        let n = left.min(10_000);
        queue.enqueue_batch((0..n).map(|_| (&payload[..], EnqueueOptions::default())))?;
        left -= n;
    }
    let enqueue_s = started.elapsed().as_secs_f64();
    let mut held = Vec::new();
    while (held.len() as u64) < leases {
        let n = (leases - held.len() as u64).min(10_000) as usize;
        held.extend(queue.dequeue_batch(n)?);
    }
    println!(
        "LOADED {enqueue_s:.2} {} {}",
        peak_rss_kib()?,
        std::fs::metadata(path)?.len()
    );
    loop {
        std::thread::sleep(Duration::from_secs(60)); // wait for SIGKILL
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        return child(
            &args[2],
            args[3] == "1",
            args[4].parse()?,
            args[5].parse()?,
            args[6].parse()?,
        );
    }
    let jobs = arg("--jobs", 1_000_000)?;
    let leases = arg("--leases", 10_000)?;
    let cache_mib = arg("--cache-mib", 64)?;
    println!("jobs={jobs} leases={leases} cache={cache_mib} MiB payload=64 B");
    println!(
        "| quick-repair | check | enqueue s | peak RSS MiB | file MiB | reopen after crash ms | first dequeue ms | leases returned | clean reopen ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for quick_repair in [false, true] {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("scale.leaseq");
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--child", path.to_str().ok_or("path")?])
            .arg(if quick_repair { "1" } else { "0" })
            .args([jobs.to_string(), leases.to_string(), cache_mib.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().ok_or("stdout")?).lines();
        let loaded = loop {
            let line = lines.next().ok_or("child exited early")??;
            if let Some(rest) = line.strip_prefix("LOADED ") {
                break rest.to_string();
            }
        };
        child.kill()?; // SIGKILL
        child.wait()?;
        let f: Vec<&str> = loaded.split_whitespace().collect();
        let (enqueue_s, rss_kib, file_bytes): (f64, u64, u64) =
            (f[0].parse()?, f[1].parse()?, f[2].parse()?);
        for check in [false, true] {
            let copy = dir.path().join(format!("copy-{check}.leaseq"));
            std::fs::copy(&path, &copy)?;
            let b = builder(quick_repair, cache_mib).check_integrity(check);
            let started = Instant::now();
            let queue = b.open(&copy)?;
            let reopen = started.elapsed();
            let first = queue.dequeue()?.ok_or("no job after reopen")?;
            let first_dequeue = started.elapsed();
            let returned = queue.recovery().leases_returned;
            drop(first);
            drop(queue); // a clean close
            let started = Instant::now();
            let queue = b.open(&copy)?;
            let clean_reopen = started.elapsed();
            drop(queue);
            std::fs::remove_file(&copy)?;
            println!(
                "| {} | {} | {enqueue_s:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {returned} | {:.0} |",
                if quick_repair { "on" } else { "off" },
                if check { "on" } else { "off" },
                rss_kib as f64 / 1024.0,
                file_bytes as f64 / (1 << 20) as f64,
                reopen.as_secs_f64() * 1e3,
                first_dequeue.as_secs_f64() * 1e3,
                clean_reopen.as_secs_f64() * 1e3,
            );
        }
    }
    Ok(())
}
