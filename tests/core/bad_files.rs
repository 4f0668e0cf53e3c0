//! Bad files and bad input: corrupted bytes (C22), truncated files (C23), payloads and keys
//! over the limit (C24), options out of range (C25). Each refusal is a typed error that
//! writes nothing; no panic crosses leaseq's API; nothing aborts.
//! Scenario ids refer to docs/testing.md (Scenarios).
//!
//! C22 runs its byte flips in child processes (this test binary re-run), so that an abort
//! inside the storage engine is caught and attributed to its flip instead of killing the
//! test. Knobs: `LEASEQ_FLIPS` (default 300 flips on a cleanly closed file, plus a third as
//! many on a crash image of the same queue); `LEASEQ_FLIPS_VERBOSE` lists every flip that
//! was not harmless.

use crate::common;
use crate::common::{
    ChildProc, Fixture, LEASE, T0_MS, all_ok, assert_consistent, child_scenario, ms, say,
};
use leaseq::{
    Durability, EnqueueOptions, Enqueued, Error, JobId, JobState, Lease, ManualClock, Queue,
};
use redb::TableDefinition;
use std::collections::BTreeMap;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The caller's table the C22 queue's `ack_with` effects write.
const EFFECTS: TableDefinition<u64, u64> = TableDefinition::new("c22_effects");

/// redb's file header.
const REDB_HEADER_BYTES: usize = 320;

/// redb's page size here.
const PAGE: usize = 4096;

const FLIPS_DEFAULT: usize = 300;

const FLIP_SEED: u64 = 0xC22;

const JOBS: u64 = 1000;

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// The variant name of an error (`Corrupted`, `Storage`, ...).
fn variant(e: &Error) -> String {
    let s = format!("{e:?}");
    s.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("")
        .to_string()
}

// ------------------------------------------------------------------------------------------
// The 1,000-job queue file of C22/C23
// ------------------------------------------------------------------------------------------

/// Builds a queue of 1,000 jobs in which every table has content: ready jobs at three
/// priorities, delayed and backing-off (scheduled) jobs, leased jobs (their leases left in the
/// file), dead jobs, dedup keys, applied markers and a caller table written by `ack_with`.
/// Returns the file as a crash image (copied while open: it needs redb's repair) and as
/// closed cleanly.
fn build_thousand_job_queue(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let q = Queue::builder()
        .retry(leaseq::RetryPolicy::immediate())
        .clock(ManualClock::new(T0_MS))
        .lease(LEASE)
        .max_attempts(3)
        .open(path)
        .unwrap();
    for batch in 0..JOBS / 100 {
        let jobs: Vec<(Vec<u8>, EnqueueOptions)> = (batch * 100..(batch + 1) * 100)
            .map(|i| {
                let mut o = EnqueueOptions::default().priority((i % 3) as i32 - 1);
                if i % 5 == 0 {
                    o = o.dedup_key(format!("dedup-{i}"));
                }
                if i % 3 == 0 {
                    o = o.idempotency_key(format!("order-{i}"));
                }
                if i % 7 == 0 {
                    o = o.delay(Duration::from_secs(3600));
                }
                (
                    format!("job {i}: {}", "x".repeat((i % 97) as usize)).into_bytes(),
                    o,
                )
            })
            .collect();
        q.enqueue_batch(jobs.iter().map(|(p, o)| (p.as_slice(), o.clone())))
            .unwrap();
    }
    let mut leases = q.dequeue_batch(400).unwrap().into_iter();
    let acked: Vec<Lease> = leases.by_ref().take(120).collect();
    all_ok(q.ack_batch(&acked).unwrap());
    let applied: Vec<Lease> = leases.by_ref().take(120).collect();
    all_ok(
        q.ack_with_batch(&applied, |tx, l| {
            tx.open_table(EFFECTS)?.insert(l.id().0, 1)?;
            Ok(())
        })
        .unwrap(),
    );
    for l in leases.by_ref().take(60) {
        l.fail("failed on purpose").unwrap();
    }
    for l in leases.by_ref().take(40) {
        l.nack_after("backing off", Duration::from_secs(60))
            .unwrap();
    }
    let still_leased: Vec<_> = leases.collect();
    assert_eq!(still_leased.len(), 60);
    drop(still_leased); // their leases stay in the file
    let s = q.stats().unwrap();
    assert!(
        s.ready > 0 && s.scheduled > 0 && s.leased > 0 && s.dead > 0 && s.applied > 0,
        "{s:?}"
    );
    assert_eq!(s.total, JOBS - 240);
    let crash_image = fs::read(path).unwrap();
    drop((acked, applied)); // every lease holds the queue open
    drop(q);
    (crash_image, fs::read(path).unwrap())
}

// ------------------------------------------------------------------------------------------
// C22: byte flips, run in child processes
// ------------------------------------------------------------------------------------------

/// Deterministic flips for a file of `len` bytes: (position, xor mask). A tenth land in the
/// redb header, a twentieth in the rest of the first page, the rest anywhere in the file.
fn flip_cases(len: usize, n: usize, seed: u64) -> Vec<(usize, u8)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|i| {
            let pos = if i % 10 == 0 {
                rng.usize(0..REDB_HEADER_BYTES)
            } else if i % 20 == 1 {
                rng.usize(REDB_HEADER_BYTES..PAGE)
            } else {
                rng.usize(0..len)
            };
            (pos, rng.u8(1..=255))
        })
        .collect()
}

/// Deterministic flips inside `pages` (page numbers) of a file of `len` bytes: a third in the
/// first 64 bytes of a page (page headers, entry offsets), the rest anywhere in the page.
fn page_flip_cases(pages: &[usize], len: usize, n: usize, seed: u64) -> Vec<(usize, u8)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|i| {
            let page = pages[rng.usize(0..pages.len())];
            let within = if i % 3 == 0 { 64 } else { PAGE };
            let pos = (page * PAGE + rng.usize(0..within)).min(len - 1);
            (pos, rng.u8(1..=255))
        })
        .collect()
}

/// The pages (after redb's header page) that differ between two images of one file: for a
/// crash image and the same file closed cleanly, what the clean close wrote (the allocator
/// state redb saves, and the system-table pages that lead to it).
fn differing_pages(a: &[u8], b: &[u8]) -> Vec<usize> {
    (1..a.len().max(b.len()).div_ceil(PAGE))
        .filter(|&p| {
            let page = |img: &[u8]| {
                img.get(p * PAGE..((p + 1) * PAGE).min(img.len()))
                    .map(<[u8]>::to_vec)
            };
            page(a) != page(b)
        })
        .filter(|&p| p * PAGE < a.len().min(b.len()))
        .collect()
}

/// What a drain saw: each drained job's payload hash, the dead jobs found by a scan, and
/// every inconsistency `check()`, `stats()` or the scan showed along the way.
#[derive(Debug, PartialEq, Eq)]
struct Drained {
    payloads: BTreeMap<u64, u64>,
    dead: Vec<u64>,
    problems: Vec<String>,
}

/// The queue settings of every C22 open: time far ahead (every delay and backoff is due),
/// non-durable commits (the drain is about reading what is there, not about fsyncs).
fn c22_builder() -> leaseq::Builder {
    Queue::builder()
        .retry(leaseq::RetryPolicy::immediate())
        .clock(ManualClock::new(T0_MS + 365 * 24 * 3600 * 1000))
        .lease(LEASE)
        .max_attempts(3)
        .durability(Durability::None)
}

/// Drains the queue: single dequeues ended by ack, ack_with and nack, then batches of
/// dequeue + ack until none is left; reads every job id; `check()` before and after. Goes on
/// through inconsistencies `check()` reports (the calls must still not panic); stops at the
/// first error.
fn drain(q: &Queue) -> Result<Drained, Error> {
    let mut problems = Vec::new();
    q.stats()?;
    let v = q.check()?;
    if let Some(first) = v.first() {
        problems.push(format!("check() found {} violation(s): {first}", v.len()));
    }
    let mut payloads = BTreeMap::new();
    let mut deliveries = 0;
    for i in 0..6 {
        let Some(l) = q.dequeue()? else { break };
        deliveries += 1;
        payloads
            .entry(l.id().0)
            .or_insert_with(|| hash(l.payload()));
        match i % 3 {
            0 => l.ack()?,
            1 => {
                let id = l.id().0;
                l.ack_with(|tx| {
                    tx.open_table(EFFECTS)?.insert(id, 2)?;
                    Ok(())
                })?;
            }
            _ => {
                l.nack("again")?;
            }
        }
    }
    loop {
        let batch = q.dequeue_batch(leaseq::BATCH_MAX)?;
        if batch.is_empty() {
            break;
        }
        deliveries += batch.len();
        if deliveries > 3 * JOBS as usize {
            problems.push(format!("the drain does not end: {deliveries} deliveries"));
            break;
        }
        for l in &batch {
            payloads
                .entry(l.id().0)
                .or_insert_with(|| hash(l.payload()));
        }
        for (l, r) in batch.iter().zip(q.ack_batch(&batch)?) {
            if let Err(e) = r {
                problems.push(format!("job {}: ack refused: {e}", l.id()));
            }
        }
    }
    let mut dead = Vec::new();
    for id in 1..=JOBS + 10 {
        if let Some(info) = q.job(JobId(id))? {
            if info.state != JobState::Dead {
                problems.push(format!("job {id} is {:?} after the drain", info.state));
            }
            dead.push(id);
        }
    }
    let s = q.stats()?;
    let v = q.check()?;
    if let Some(first) = v.first() {
        problems.push(format!("check() after the drain: {first}"));
    }
    if (s.ready, s.scheduled, s.leased, s.total) != (0, 0, 0, dead.len() as u64) {
        problems.push(format!("stats after the drain: {s:?}"));
    }
    Ok(Drained {
        payloads,
        dead,
        problems,
    })
}

/// Opens `work` (holding `bytes`) and drains it; returns `<CLASS> <detail>`.
fn open_and_drain(work: &Path, bytes: &[u8], reference: Option<&Drained>) -> String {
    let q = match c22_builder().open(work) {
        Ok(q) => q,
        Err(e) => {
            let after = fs::read(work).map(|b| hash(&b)).unwrap_or(0);
            let class = if after == hash(bytes) {
                "OPEN"
            } else {
                "MODIFIED"
            };
            return format!("{class} {} {e}", variant(&e));
        }
    };
    let outcome = match drain(&q) {
        Err(e) => format!("LATER {} {e}", variant(&e)),
        Ok(d) if !d.problems.is_empty() => format!("CHECK check {}", d.problems.join("; ")),
        Ok(d) => match reference {
            None => format!("CLEAN baseline {} {}", d.payloads.len(), d.dead.len()),
            Some(r) if *r == d => "CLEAN harmless".to_string(),
            Some(r) => {
                let changed = r
                    .payloads
                    .iter()
                    .filter(|(id, h)| d.payloads.get(id) != Some(h))
                    .count();
                format!(
                    "CLEAN silent: {} drained vs {}, {} dead vs {}, {changed} payloads differ",
                    d.payloads.len(),
                    r.payloads.len(),
                    d.dead.len(),
                    r.dead.len()
                )
            }
        },
    };
    drop(q);
    outcome
}

/// The last panic seen by the child's quiet hook (leaseq catches some of them itself).
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// The child side of C22: runs flips `start..end` of an image, one report per flip.
#[test]
fn child_entry_bad_files() {
    let Some((scenario, image)) = child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let at = info.location().map(|l| l.to_string()).unwrap_or_default();
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{at}: {msg}"));
    }));
    let mut words = scenario.split(' ');
    assert_eq!(words.next(), Some("flip"));
    let selftest = words.next() == Some("selftest");
    let mut num = || words.next().unwrap().parse::<usize>().unwrap();
    let (n, start, end) = (num(), num(), num());
    let original = fs::read(&image).unwrap();
    let work = image.with_extension(format!("work{start}"));
    fs::write(&work, &original).unwrap();
    let baseline = if selftest {
        None
    } else {
        match drain(&c22_builder().open(&work).unwrap()) {
            Ok(d) if d.problems.is_empty() => Some(d),
            other => panic!("the unflipped file does not drain cleanly: {other:?}"),
        }
    };
    if let Some(b) = &baseline {
        say(format!(
            "BASELINE {} drained {} dead",
            b.payloads.len(),
            b.dead.len()
        ));
    }
    let cases = if selftest {
        vec![(0, 0xFF); n] // the magic number: refused at open as NotLeaseq
    } else if let Ok(pages) = fs::read_to_string(image.with_extension("pages")) {
        // Only in the pages listed beside the image.
        let pages: Vec<usize> = pages
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        page_flip_cases(&pages, original.len(), n, FLIP_SEED ^ original.len() as u64)
    } else {
        flip_cases(original.len(), n, FLIP_SEED ^ original.len() as u64)
    };
    for (i, &(pos, mask)) in cases.iter().enumerate().take(end).skip(start) {
        say(format!("START {i}"));
        let mut bytes = original.clone();
        bytes[pos] ^= mask;
        fs::write(&work, &bytes).unwrap();
        *LAST_PANIC.lock().unwrap() = None;
        // The self-test injects each failure the harness must report, one per flip.
        let mut believed = bytes.clone();
        match (selftest, i) {
            (true, 1) => believed[1] ^= 1, // as if the refused open had written to the file
            (true, 3) => std::process::abort(),
            _ => {}
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if selftest && i == 2 {
                panic!("injected panic");
            }
            open_and_drain(&work, &believed, baseline.as_ref())
        }))
        .unwrap_or_else(|_| {
            let p = LAST_PANIC.lock().unwrap().take().unwrap_or_default();
            format!("PANIC crossed leaseq's API: {p}")
        });
        say(format!(
            "CASE {i} {pos} {mask:#04x} {}",
            outcome.replace('\n', " ")
        ));
    }
    let _ = fs::remove_file(&work);
    say("DONE");
    common::ready_to_die();
}

/// Runs flips `0..n` of `image` in two child processes; respawns past a flip that killed its
/// child. Returns one outcome line per flip (`<i> <pos> <mask> <CLASS> <detail>`).
fn run_flips(image: &Path, n: usize, mode: &str) -> Vec<String> {
    let results = Mutex::new(Vec::new());
    let half = n.div_ceil(2);
    std::thread::scope(|s| {
        for (lo, hi) in [(0, half), (half, n)] {
            let results = &results;
            s.spawn(move || {
                let mut start = lo;
                while start < hi {
                    let scenario = format!("flip {mode} {n} {start} {hi}");
                    let mut child =
                        ChildProc::spawn("bad_files::child_entry_bad_files", &scenario, image);
                    let mut current = None;
                    let mut done = false;
                    while let Some(m) = child.next_message() {
                        if let Some(i) = m.strip_prefix("START ") {
                            current = Some(i.parse::<usize>().unwrap());
                        } else if let Some(rest) = m.strip_prefix("CASE ") {
                            results.lock().unwrap().push(rest.to_string());
                            current = None;
                        } else if m == "DONE" {
                            done = true;
                            break;
                        } else if !m.starts_with("BASELINE") {
                            panic!("unexpected message from the flip child: {m}");
                        }
                    }
                    let status = (0..100).find_map(|_| {
                        let s = child.exited();
                        if s.is_none() {
                            std::thread::sleep(ms(10));
                        }
                        s
                    });
                    child.kill();
                    if done {
                        break;
                    }
                    // The child died inside flip `i`: an abort (or a crash) of the process.
                    let i = current.expect("the flip child died outside any flip");
                    results
                        .lock()
                        .unwrap()
                        .push(format!("{i} ? ? ABORT the process died: {status:?}"));
                    start = i + 1;
                }
            });
        }
    });
    let mut r = results.into_inner().unwrap();
    r.sort_by_key(|l| l.split(' ').next().unwrap().parse::<usize>().unwrap());
    r
}

/// Errors an open of a damaged file may give; anything else (e.g. `AlreadyOpen`) is a bug.
const OPEN_ERRORS: &[&str] = &[
    "Corrupted",
    "NotLeaseq",
    "Truncated",
    "UnsupportedVersion",
    "Storage",
    "Io",
];

/// Counts per class and variant, and the lines that are failures.
fn summarize(name: &str, lines: &[String]) -> (String, Vec<String>) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad = Vec::new();
    let mut caught_panics = 0;
    for l in lines {
        let w: Vec<&str> = l.splitn(6, ' ').collect();
        let (class, var) = (w[3], w.get(4).copied().unwrap_or(""));
        if l.contains("panicked") {
            caught_panics += 1;
        }
        let key = match class {
            "OPEN" => format!("detected at open: {var}"),
            "LATER" => format!("detected later: {var}"),
            "CHECK" => "detected later: by check()".to_string(),
            "CLEAN" if var == "harmless" => "not detected: harmless".to_string(),
            "CLEAN" => "not detected: silently changed data".to_string(),
            other => format!("FAILURE {other}"),
        };
        *counts.entry(key).or_default() += 1;
        let bad_open = class == "OPEN" && !OPEN_ERRORS.contains(&var);
        if matches!(class, "PANIC" | "ABORT" | "MODIFIED") || bad_open {
            bad.push(format!("{name}: flip {l}"));
        }
    }
    let mut s = format!("C22 {name}: {} flips\n", lines.len());
    for (k, v) in &counts {
        s += &format!("  {v:>4}  {k}\n");
    }
    s += &format!("  ({caught_panics} panics inside redb were caught by leaseq and typed)\n");
    (s, bad)
}

// C22: single-byte flips across a 1,000-job queue file (header included), each opened and
// drained: every flip ends in a typed error (at open or later) or a consistent queue; no
// panic crosses leaseq's API, nothing aborts, and a refused open leaves the file
// byte-identical. Run on the cleanly closed file and on a crash image (which redb repairs).
#[test]
fn flipped_bytes_give_typed_errors_or_a_consistent_queue_never_a_panic() {
    if child_scenario().is_some() {
        return;
    }
    let n: usize = std::env::var("LEASEQ_FLIPS")
        .ok()
        .map_or(FLIPS_DEFAULT, |v| v.parse().unwrap());
    let f = Fixture::new();
    let (crash, clean) = build_thousand_job_queue(&f.path);
    // The flips' copies live in memory-backed storage where there is one: the opens, repairs
    // and closes of hundreds of copies then cost no disk syncs.
    let work = Path::new("/dev/shm")
        .is_dir()
        .then(|| tempfile::tempdir_in("/dev/shm").ok())
        .flatten()
        .unwrap_or_else(|| tempfile::tempdir().unwrap());
    let started = Instant::now();
    let mut report = String::new();
    let mut failures = Vec::new();
    // Issue 14: the pages the clean close wrote hold the allocator state a plain open trusts;
    // flips there aborted the process before the integrity check at open was on by default.
    let close_written = differing_pages(&crash, &clean);
    assert!(!close_written.is_empty(), "the clean close wrote no page");
    for (name, bytes, count) in [
        ("closed file", &clean, n),
        ("crash image", &crash, n / 3),
        ("closed file, pages the close wrote", &clean, n / 3),
    ] {
        let image = work.path().join(name.replace([' ', ','], "-"));
        fs::write(&image, bytes).unwrap();
        if name.contains("pages") {
            let list: Vec<String> = close_written.iter().map(|p| p.to_string()).collect();
            fs::write(image.with_extension("pages"), list.join(" ")).unwrap();
        }
        let lines = run_flips(&image, count, "real");
        assert_eq!(lines.len(), count, "one outcome per flip");
        if std::env::var_os("LEASEQ_FLIPS_VERBOSE").is_some() {
            for l in lines.iter().filter(|l| !l.contains("CLEAN harmless")) {
                eprintln!("{name}: {l}");
            }
        }
        let (s, bad) = summarize(name, &lines);
        report += &s;
        failures.extend(bad);
    }
    eprintln!("{report}({} bytes, {:.1?})", clean.len(), started.elapsed());
    assert!(
        failures.is_empty(),
        "{} flip(s) broke the contract:\n{}\n\n{report}",
        failures.len(),
        failures.join("\n")
    );
}

// The C22 harness can fail: a flip whose refused open changed the file, a panic crossing
// the API and an aborted process are each reported as failures (and the flips after the
// abort still run); a plain refusal is not.
#[test]
fn flip_harness_reports_modified_files_panics_and_aborts() {
    if child_scenario().is_some() {
        return;
    }
    let f = Fixture::new();
    f.open().enqueue(b"A", EnqueueOptions::default()).unwrap();
    let lines = run_flips(&f.path, 5, "selftest");
    let classes: Vec<&str> = lines.iter().map(|l| l.split(' ').nth(3).unwrap()).collect();
    assert_eq!(
        classes,
        ["OPEN", "MODIFIED", "PANIC", "ABORT", "OPEN"],
        "{lines:#?}"
    );
    let (_, bad) = summarize("selftest", &lines);
    assert_eq!(bad.len(), 3, "{bad:#?}");
}

// ------------------------------------------------------------------------------------------
// C23: truncated files
// ------------------------------------------------------------------------------------------

/// Opens a truncated copy and checks the refusal: typed, file still there, byte-identical,
/// nothing created beside it, and a second open refused the same way.
fn assert_truncation_refused(f: &Fixture, what: &str, bytes: &[u8], jobs: u64) -> String {
    fs::write(&f.path, bytes).unwrap();
    let err = match f.builder().open(&f.path) {
        Err(e) => e,
        Ok(q) => {
            // Only acceptable if the cut removed nothing the queue needed.
            let total = q.stats().unwrap().total;
            assert_eq!(total, jobs, "{what}: opened with jobs missing");
            assert_consistent(&q);
            return "opened, nothing lost".into();
        }
    };
    assert!(
        matches!(
            err,
            Error::Truncated { .. }
                | Error::Corrupted { .. }
                | Error::NotLeaseq { .. }
                | Error::Storage(_)
                | Error::Io(_)
        ),
        "{what}: {err:?}"
    );
    let after = fs::read(&f.path).expect("the refused file still exists");
    assert_eq!(after.len(), bytes.len(), "{what}: length changed ({err:?})");
    assert!(
        after == bytes,
        "{what}: refused ({err:?}) but modified at byte(s) {:?}",
        (0..after.len())
            .filter(|&i| after[i] != bytes[i])
            .take(8)
            .collect::<Vec<_>>()
    );
    let names: Vec<_> = fs::read_dir(f.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![f.path.file_name().unwrap()], "{what}");
    let again = f.builder().open(&f.path).expect_err("refused again");
    assert_eq!(variant(&again), variant(&err), "{what}");
    assert_eq!(fs::read(&f.path).unwrap(), bytes, "{what}: second open");
    format!("{err}")
}

// C23: a queue file truncated to 0 bytes, to the redb header - 1, to half, to the last page
// minus one byte (and a few more cuts) is refused with a typed error; the file is never
// deleted, modified or silently recreated empty. Cleanly closed file.
#[test]
fn truncated_closed_file_is_refused_unchanged_never_recreated() {
    let src = Fixture::new();
    let (_, clean) = build_thousand_job_queue(&src.path);
    let f = Fixture::new();
    truncations(&f, &clean);
}

// C23 on a crash image (the file a killed process leaves, which redb must repair): the same
// refusals, and the failed repair must not have written to the file either.
#[test]
fn truncated_crash_image_is_refused_unchanged_never_recreated() {
    let src = Fixture::new();
    let (crash, _) = build_thousand_job_queue(&src.path);
    let f = Fixture::new();
    truncations(&f, &crash);
}

fn truncations(f: &Fixture, image: &[u8]) {
    let len = image.len();
    let live = JOBS - 240;
    let cuts = [
        ("0 bytes", 0),
        ("header - 1", REDB_HEADER_BYTES - 1),
        ("header", REDB_HEADER_BYTES),
        ("one page - 1", PAGE - 1),
        ("half", len / 2),
        ("half, page-aligned", len / 2 / PAGE * PAGE),
        ("last page - 1", len - PAGE - 1),
        ("length - 1", len - 1),
    ];
    let mut failed = Vec::new();
    for (what, cut) in cuts {
        let what = format!("{what} ({cut} of {len} bytes)");
        let r = catch_unwind(AssertUnwindSafe(|| {
            assert_truncation_refused(f, &what, &image[..cut], live)
        }));
        match r {
            Ok(err) if cut < REDB_HEADER_BYTES && !err.contains("truncated file") => {
                failed.push(format!("{what}: expected Truncated, got {err}"));
            }
            Ok(err) => eprintln!("C23 {what}: {err}"),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "panic".into());
                failed.push(msg);
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// ------------------------------------------------------------------------------------------
// C24: payloads and keys over the limit
// ------------------------------------------------------------------------------------------

/// A queue with a job holding dedup key "held", made durable, and the file's bytes.
fn queue_with_one_job(f: &Fixture, b: leaseq::Builder) -> (Queue, Vec<u8>) {
    let q = b.open(&f.path).unwrap();
    q.enqueue(b"first", EnqueueOptions::default().dedup_key("held"))
        .unwrap();
    let bytes = fs::read(&f.path).unwrap();
    (q, bytes)
}

/// The refused call wrote nothing: same stats, same file bytes, the refused dedup key is
/// still free and the held one still held.
fn assert_nothing_written(f: &Fixture, q: &Queue, bytes: &[u8], stats: leaseq::Stats, key: &str) {
    assert_eq!(q.stats().unwrap(), stats, "counts unchanged");
    assert!(fs::read(&f.path).unwrap() == bytes, "file bytes unchanged");
    assert!(matches!(
        q.enqueue(b"dup?", EnqueueOptions::default().dedup_key("held"))
            .unwrap(),
        Enqueued::Duplicate(_)
    ));
    assert!(
        matches!(
            q.enqueue(b"next", EnqueueOptions::default().dedup_key(key))
                .unwrap(),
            Enqueued::New(_)
        ),
        "the refused call's dedup key {key} is free and the next enqueue works"
    );
    assert_consistent(q);
}

// C24: a payload of exactly the limit is accepted and delivered intact; one byte more is
// `PayloadTooLarge { limit, size }` before any write (counts, dedup keys and file bytes
// unchanged), and the next enqueue works. For a small configured limit and the default 1 MiB.
#[test]
fn payload_at_limit_accepted_one_byte_over_refused_before_any_write() {
    for limit in [1000, 1 << 20] {
        let f = Fixture::new();
        let b = if limit == 1 << 20 {
            f.builder() // the default limit
        } else {
            f.builder().payload_bytes_max(limit)
        };
        let (q, bytes) = queue_with_one_job(&f, b);
        let stats = q.stats().unwrap();
        let over = vec![0xAB; limit + 1];
        let err = q
            .enqueue(&over, EnqueueOptions::default().dedup_key("over"))
            .unwrap_err();
        assert!(
            matches!(err, Error::PayloadTooLarge { size_bytes, limit_bytes }
                if size_bytes == limit + 1 && limit_bytes == limit),
            "{err:?}"
        );
        // The same refusal for a batch holding one oversized payload: nothing of it is added.
        let small = [1u8; 10];
        let err = q
            .enqueue_batch([
                (&small[..], EnqueueOptions::default().dedup_key("over")),
                (&over[..], EnqueueOptions::default()),
            ])
            .unwrap_err();
        assert!(matches!(err, Error::PayloadTooLarge { .. }), "{err:?}");
        // A typed payload whose encoding is over the limit.
        let err = q
            .enqueue_value(&vec![7u8; limit], EnqueueOptions::default())
            .unwrap_err();
        assert!(matches!(err, Error::PayloadTooLarge { .. }), "{err:?}");
        assert_nothing_written(&f, &q, &bytes, stats, "over");

        let at = vec![0xCD; limit];
        let id = q.enqueue(&at, EnqueueOptions::default()).unwrap().id();
        let mut got = None;
        while let Some(l) = q.dequeue().unwrap() {
            if l.id() == id {
                got = Some(l.payload().to_vec());
            }
            l.ack().unwrap();
        }
        assert!(
            got == Some(at),
            "the payload at the limit comes back intact"
        );
    }
}

// C24: the configurable limit has a cap: asking for more is refused at open, and a payload
// one byte over the cap is refused by a queue configured at the cap.
#[test]
fn payload_over_the_cap_is_refused() {
    let f = Fixture::new();
    let q = f
        .builder()
        .payload_bytes_max(leaseq::PAYLOAD_BYTES_MAX_CAP)
        .open(&f.path)
        .unwrap();
    let before = q.stats().unwrap();
    let huge = vec![0u8; leaseq::PAYLOAD_BYTES_MAX_CAP + 1];
    assert!(matches!(
        q.enqueue(&huge, EnqueueOptions::default()),
        Err(Error::PayloadTooLarge { size_bytes, limit_bytes })
            if size_bytes == huge.len() && limit_bytes == leaseq::PAYLOAD_BYTES_MAX_CAP
    ));
    assert_eq!(q.stats().unwrap(), before);
}

// C24 for keys: a dedup key or idempotency key of exactly KEY_BYTES_MAX bytes works
// (dedup, ack_with, is_applied); one byte more is `KeyTooLong { field, size, limit }` before
// any write, and the next enqueue works.
#[test]
fn keys_at_limit_accepted_one_byte_over_refused_before_any_write() {
    let max = leaseq::KEY_BYTES_MAX;
    let f = Fixture::new();
    let (q, bytes) = queue_with_one_job(&f, f.builder());
    let stats = q.stats().unwrap();
    let long = vec![b'k'; max + 1];
    for (field, opts) in [
        (
            "dedup_key",
            EnqueueOptions::default()
                .dedup_key(&long)
                .idempotency_key("i"),
        ),
        (
            "idempotency_key",
            EnqueueOptions::default()
                .idempotency_key(&long)
                .dedup_key("over"),
        ),
    ] {
        match q.enqueue(b"x", opts) {
            Err(Error::KeyTooLong {
                field: got,
                size_bytes,
                limit_bytes,
            }) => assert_eq!((got, size_bytes, limit_bytes), (field, max + 1, max)),
            other => panic!("expected KeyTooLong {field}, got {other:?}"),
        }
    }
    assert_nothing_written(&f, &q, &bytes, stats, "over");

    let dedup = vec![b'd'; max];
    let idem = vec![b'i'; max];
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default()
                .dedup_key(&dedup)
                .idempotency_key(&idem),
        )
        .unwrap();
    assert!(matches!(a, Enqueued::New(_)));
    assert_eq!(
        q.enqueue(b"A'", EnqueueOptions::default().dedup_key(&dedup))
            .unwrap(),
        Enqueued::Duplicate(a.id())
    );
    while let Some(l) = q.dequeue().unwrap() {
        if l.id() == a.id() {
            assert_eq!(l.ack_with(|_| Ok(())).unwrap(), leaseq::Applied::Now);
        } else {
            l.ack().unwrap();
        }
    }
    assert!(q.is_applied(&idem).unwrap());
    assert_consistent(&q);
}

// ------------------------------------------------------------------------------------------
// C25: options out of range
// ------------------------------------------------------------------------------------------

fn assert_invalid<T: std::fmt::Debug>(r: leaseq::Result<T>, field: &str) {
    match r {
        Err(Error::InvalidOption { field: got, .. }) => assert_eq!(got, field),
        other => panic!("expected InvalidOption {{ field: {field} }}, got {other:?}"),
    }
}

// C25 at the builder: lease 0, a lease under 1 ms (it would round to 0), a lease above
// LEASE_MAX, max_attempts 0 or above its cap, a payload limit above its cap: refused at open
// with `InvalidOption { field }`, before the file is created or touched (an existing file is
// left byte-identical and its leases are not recovered).
#[test]
fn invalid_builder_options_are_refused_before_touching_the_file() {
    let f = Fixture::new();
    let bad = || {
        [
            (f.builder().lease(Duration::ZERO), "lease"),
            (f.builder().lease(Duration::from_micros(999)), "lease"),
            (f.builder().lease(leaseq::LEASE_MAX + ms(1)), "lease"),
            (f.builder().max_attempts(0), "max_attempts"),
            (
                f.builder().max_attempts(leaseq::MAX_ATTEMPTS_CAP + 1),
                "max_attempts",
            ),
            (
                f.builder()
                    .payload_bytes_max(leaseq::PAYLOAD_BYTES_MAX_CAP + 1),
                "payload_bytes_max",
            ),
        ]
    };
    for (b, field) in bad() {
        assert_invalid(b.open(&f.path), field);
    }
    assert!(!f.path.exists(), "a refused open creates nothing");

    // An existing file with a lease left in it.
    {
        let q = f.open();
        q.enqueue(b"A", EnqueueOptions::default()).unwrap();
        drop(q.dequeue().unwrap().unwrap());
    }
    let bytes = fs::read(&f.path).unwrap();
    for (b, field) in bad() {
        assert_invalid(b.open(&f.path), field);
        assert!(fs::read(&f.path).unwrap() == bytes, "{field}: file touched");
    }
    assert_eq!(
        f.open().recovery().leases_returned,
        1,
        "no refused open recovered it"
    );

    // The limits themselves are accepted as given, not clamped.
    let q = f
        .builder()
        .lease(leaseq::LEASE_MAX)
        .max_attempts(leaseq::MAX_ATTEMPTS_CAP)
        .open(&f.path)
        .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(
        l.deadline_ms(),
        T0_MS + leaseq::LEASE_MAX.as_millis() as u64
    );
    let id = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.max_attempts, leaseq::MAX_ATTEMPTS_CAP);
}

// C25 per job: lease 0, under 1 ms, above LEASE_MAX; max_attempts 0 or above its cap; a
// delay above DELAY_MAX; a delay whose due time overflows the clock's timestamp. Each is
// `InvalidOption { field }` at once, writes nothing (file bytes identical), also inside a
// batch; values at the limits are kept exactly.
#[test]
fn invalid_enqueue_options_are_refused_and_write_nothing() {
    let f = Fixture::new();
    let (q, bytes) = queue_with_one_job(&f, f.builder());
    let stats = q.stats().unwrap();
    let d = EnqueueOptions::default;
    let cases = [
        (d().lease(Duration::ZERO), "lease"),
        (d().lease(Duration::from_micros(999)), "lease"),
        (d().lease(leaseq::LEASE_MAX + ms(1)), "lease"),
        (d().max_attempts(0), "max_attempts"),
        (
            d().max_attempts(leaseq::MAX_ATTEMPTS_CAP + 1),
            "max_attempts",
        ),
        (d().delay(leaseq::DELAY_MAX + ms(1)), "delay"),
        (d().delay(Duration::MAX), "delay"),
    ];
    for (o, field) in cases.clone() {
        assert_invalid(q.enqueue(b"x", o.clone().dedup_key("over")), field);
        assert_invalid(q.enqueue_batch([(&b"ok"[..], d()), (&b"x"[..], o)]), field);
    }
    assert_nothing_written(&f, &q, &bytes, stats, "over");

    // A delay within DELAY_MAX whose due time overflows a u64 of milliseconds.
    let f2 = Fixture::new();
    f2.clock.set_ms(u64::MAX - 1000);
    let (q2, bytes2) = queue_with_one_job(&f2, f2.builder());
    let stats2 = q2.stats().unwrap();
    assert_invalid(
        q2.enqueue(b"x", d().delay(Duration::from_secs(2)).dedup_key("over")),
        "delay",
    );
    assert_nothing_written(&f2, &q2, &bytes2, stats2, "over");

    // At the limits: kept exactly.
    let now = T0_MS;
    let id = q
        .enqueue(
            b"far",
            d().delay(leaseq::DELAY_MAX)
                .max_attempts(leaseq::MAX_ATTEMPTS_CAP)
                .lease(leaseq::LEASE_MAX),
        )
        .unwrap()
        .id();
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.run_at_ms, now + leaseq::DELAY_MAX.as_millis() as u64);
    assert_eq!(info.max_attempts, leaseq::MAX_ATTEMPTS_CAP);
    assert_eq!(info.state, JobState::Scheduled);
}

// C25 on a lease: `extend(0)`, under 1 ms or above LEASE_MAX, and `nack_after` with a backoff
// above DELAY_MAX or one whose due time overflows the timestamp, are `InvalidOption` at once;
// the job stays leased under the same token, deadline and attempt count, and the file is
// unchanged. `extend(LEASE_MAX)` is kept exactly.
#[test]
fn invalid_extend_and_backoff_are_refused_and_change_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    let info = q.job(id).unwrap().unwrap();
    let bytes = fs::read(&f.path).unwrap();
    for by in [
        Duration::ZERO,
        Duration::from_micros(999),
        leaseq::LEASE_MAX + ms(1),
    ] {
        assert_invalid(l.extend(by), "extend");
        assert_eq!(l.deadline_ms(), info.lease_deadline_ms.unwrap());
    }
    assert_eq!(q.job(id).unwrap().unwrap(), info, "nothing changed");
    assert!(fs::read(&f.path).unwrap() == bytes, "file unchanged");

    f.clock.advance(ms(1000));
    l.extend(leaseq::LEASE_MAX).unwrap();
    let deadline = T0_MS + 1000 + leaseq::LEASE_MAX.as_millis() as u64;
    assert_eq!(l.deadline_ms(), deadline);
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.lease_deadline_ms, Some(deadline));

    let bytes = fs::read(&f.path).unwrap();
    assert_invalid(
        l.nack_after("too long", leaseq::DELAY_MAX + ms(1)),
        "backoff",
    );
    assert_eq!(q.job(id).unwrap().unwrap(), info, "nothing changed");
    assert!(fs::read(&f.path).unwrap() == bytes, "file unchanged");

    // A backoff within DELAY_MAX whose due time overflows the timestamp.
    let f2 = Fixture::new();
    let q2 = f2.open();
    let id2 = q2.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    let l2 = q2.dequeue().unwrap().unwrap();
    f2.clock.set_ms(u64::MAX - 1000);
    let info2 = q2.job(id2).unwrap().unwrap();
    let bytes2 = fs::read(&f2.path).unwrap();
    assert_invalid(l2.nack_after("overflow", Duration::from_secs(2)), "backoff");
    assert_eq!(q2.job(id2).unwrap().unwrap(), info2, "nothing changed");
    assert!(fs::read(&f2.path).unwrap() == bytes2, "file unchanged");
}

// C25, found while writing these tests: an `extend` whose deadline (now + d) overflows the
// timestamp is silently clamped to u64::MAX instead of refused, unlike an overflowing delay
// or backoff. Nothing may be clamped silently: expect `InvalidOption { field: "extend" }`
// and no change.
#[test]
fn extend_whose_deadline_overflows_is_refused_not_clamped() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    f.clock.set_ms(u64::MAX - 1000);
    let before = q.job(id).unwrap().unwrap();
    let r = l.extend(Duration::from_secs(2));
    let after = q.job(id).unwrap().unwrap();
    assert!(
        matches!(
            r,
            Err(Error::InvalidOption {
                field: "extend",
                ..
            })
        ),
        "extend past the end of time: {r:?}, deadline now {:?}",
        after.lease_deadline_ms
    );
    assert_eq!(after, before, "nothing changed");
}

// C23, minimal reproduction of a finding: the crash image of an empty queue (the file a
// killed process leaves), truncated to two pages. The open is refused, but only after redb's
// repair has rewritten the header's layout (bytes 24..32) to fit the shorter file and
// flushed it: a refused open must leave the file byte-identical.
#[test]
fn refused_open_of_a_truncated_crash_image_leaves_it_byte_identical() {
    let f = Fixture::new();
    let q = f.open();
    let crash_image = fs::read(&f.path).unwrap();
    drop(q);
    let cut = &crash_image[..2 * PAGE];
    fs::write(&f.path, cut).unwrap();
    let err = f
        .builder()
        .open(&f.path)
        .expect_err("a truncated file is refused");
    let after = fs::read(&f.path).unwrap();
    assert!(
        after == cut,
        "refused with {err:?}, but header bytes 24..32 went from {:?} to {:?}",
        &cut[24..32],
        &after[24..32]
    );
}
