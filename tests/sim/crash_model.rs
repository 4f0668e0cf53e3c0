//! Model-based crash test: seeded random workloads over the public API on the
//! power-loss simulator, checked against a model of what every `Ok` promised, after every
//! reopen, kill, power cut and crash at a random I/O call. See `tests/sim_model/mod.rs`.
//!
//! `LEASEQ_SIM_SEEDS=N` sets the number of seeds (default below), `LEASEQ_SIM_SEED_START=S` the
//! first one; `LEASEQ_SIM_SEED=S` replays one seed and prints its op log. Prints exactly one
//! line: `crash-sim: seeds=<N> crashes=<M> violations=<V>`.

use crate::sim_model::{Outcome, Settings, run_seed};
use crate::{common, sim_model};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Seeds run by default: 2,000 took 53 s on two cores (debug build, redb optimized by the
/// `[profile.dev.package.redb]` section of Cargo.toml); compiling the test adds about a minute
/// to a cold build.
const DEFAULT_SEEDS: u64 = 2_000;

/// Failing seeds whose whole op log is printed (the rest print their violation only).
const LOGS_PRINTED: usize = 3;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// Runs one seed; a panic (in leaseq or the harness) is a violation (the harness catches those
/// in a workload and keeps its op log; this catches the rest).
fn run_caught(seed: u64) -> Outcome {
    std::panic::catch_unwind(|| run_seed(seed, Settings::default())).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Outcome {
            seed,
            violation: Some(format!("PANIC: {msg}")),
            ..Outcome::default()
        }
    })
}

#[test]
fn crash_sim() {
    if let Some(seed) = env_u64("LEASEQ_SIM_SEED") {
        let out = run_caught(seed);
        eprintln!("{}", out.report());
        println!(
            "crash-sim: seeds=1 crashes={} violations={}",
            out.crashes,
            u64::from(out.violation.is_some())
        );
        assert!(out.violation.is_none(), "seed {seed} failed");
        return;
    }
    let seeds = env_u64("LEASEQ_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let start = env_u64("LEASEQ_SIM_SEED_START").unwrap_or(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = AtomicU64::new(start);
    let crashes = AtomicU64::new(0);
    // Verbose totals: steps, crashes in recovery, uncertain calls, of which committed, reopens,
    // Durability::None reopens that lost calls, ambiguous reopens, most candidate states;
    // schedule calls, instances enqueued and due times skipped by dequeues, and by opens;
    // dequeues with a job behind its group's head, dequeues held back by the rate limit;
    // opens with live reads; size limit calls, calls refused QueueFull, jobs dropped.
    let totals: Mutex<[u64; 19]> = Mutex::new([0; 19]);
    let failures: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    let began = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= start + seeds {
                        break;
                    }
                    let out = run_caught(seed);
                    crashes.fetch_add(out.crashes, Ordering::SeqCst);
                    {
                        let mut t = totals.lock().unwrap();
                        t[0] += out.steps as u64;
                        t[1] += out.crashes_in_recovery;
                        t[2] += out.uncertain_calls;
                        t[3] += out.uncertain_committed;
                        t[4] += out.reopens;
                        t[5] += out.non_durable_lost;
                        t[6] += out.ambiguous_reopens;
                        t[7] = t[7].max(out.worlds_max);
                        t[8] += out.schedule_calls;
                        t[9] += out.schedule_fired;
                        t[10] += out.schedule_skipped;
                        t[11] += out.open_fired;
                        t[12] += out.open_skipped;
                        t[13] += out.group_waits;
                        t[14] += out.rate_limited;
                        t[15] += out.live_read_opens;
                        t[16] += out.limit_calls;
                        t[17] += out.queue_full;
                        t[18] += out.jobs_dropped;
                    }
                    if out.violation.is_some() {
                        failures.lock().unwrap().push(out);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|o| o.seed);
    for (i, f) in failures.iter().enumerate() {
        if i < LOGS_PRINTED {
            eprintln!("{}", f.report());
        } else {
            eprintln!(
                "crash-sim seed {} VIOLATION: {}",
                f.seed,
                f.violation.as_deref().unwrap_or("")
            );
        }
    }
    if std::env::var_os("LEASEQ_SIM_VERBOSE").is_some() {
        let t = totals.lock().unwrap();
        eprintln!(
            "crash-sim: {seeds} seeds from {start} in {:.1}s on {threads} threads: {} steps, \
             {} crashes during a recovery open, {} calls hit by a crash ({} committed), \
             {} other reopens (clean, kill, power cut), {} Durability::None reopens that \
             lost calls, {} reopens with several candidate states (at most {}); {} schedule \
             calls, dequeues fired {} instances and skipped {} due times, opens fired {} and \
             skipped {}; {} dequeues with a job waiting behind its group's head, {} held to \
             less than asked by the rate limit; {} opens with live reads; {} set_limit \
             calls, {} calls refused QueueFull, {} jobs dropped to make room",
            began.elapsed().as_secs_f64(),
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
            t[5],
            t[6],
            t[7],
            t[8],
            t[9],
            t[10],
            t[11],
            t[12],
            t[13],
            t[14],
            t[15],
            t[16],
            t[17],
            t[18]
        );
    }
    // Written to the process's stdout directly, not through println!, so the line shows in
    // `cargo test` output even though libtest captures what passing tests print.
    {
        use std::io::Write;
        let line = format!(
            "crash-sim: seeds={seeds} crashes={} violations={}\n",
            crashes.load(Ordering::SeqCst),
            failures.len()
        );
        let _ = std::io::stdout().write_all(line.as_bytes());
    }
    assert!(
        failures.is_empty(),
        "{} of {seeds} seeds found violations; first: seed {} (replay with LEASEQ_SIM_SEED={})",
        failures.len(),
        failures[0].seed,
        failures[0].seed
    );
}

/// Asserts one seed runs clean, printing its report otherwise.
fn regression(seed: u64) {
    let out = run_caught(seed);
    assert!(out.violation.is_none(), "{}", out.report());
}

/// A short fixed set of seeds, so a plain `cargo test --features sim --test sim --
/// crash_sim_smoke` is quick.
#[test]
fn crash_sim_smoke() {
    for seed in [1, 2, 3] {
        regression(seed);
    }
}

/// Found by the `open_corrupt` fuzz target (fuzz/) on the working tree between 85c6ecd and
/// ac56116 (fixed there: all of `open_backend` now runs under the guard): one flipped bit in the page holding
/// `leaseq_meta` made redb panic inside `AccessGuard::value` while leaseq read the format
/// version at open (`validate_format`, not under leaseq's panic guard), and the panic came out of
/// `Builder::open_backend`. The fuzzer's input (`[0x24, 0x0f, 0x00, 0x01, 0x10, 0x00, 0x80,
/// 0x2d]`) depends on the file layout, so this flips every byte of the header and entry
/// offsets of that page instead (before the fix it failed at byte 2 of the page, the entry count).
#[test]
fn regression_corrupt_meta_page_never_panics_through_open() {
    let opened =
        sim_model::corrupt::meta_page_sweep(64, &[0x10, 0xFF]).unwrap_or_else(|e| panic!("{e}"));
    assert!(opened > 0);
}

/// Found by the crash simulation (15 of the first 400 seeds in a debug build of 27dab2b and
/// aef6046; fixed in 85c6ecd): `ack_batch` / `ack_with_batch` given a stale lease and the
/// current lease of one job (it expired and was delivered again) tripped a `debug_assert!` in
/// `store::leased_all` ("one job twice in a batch"); the committer caught the panic and the
/// call returned `Corrupted` instead of `LeaseLost`. The contract (since the batch calls
/// report each lease): the stale lease is `LeaseLost` in its place, the current one is acked.
#[test]
fn regression_seed_22_ack_batch_with_a_stale_and_the_current_lease_of_one_job() {
    regression(22);
}

#[test]
fn regression_seed_292_ack_with_batch_with_a_stale_and_the_current_lease_of_one_job() {
    regression(292);
}

/// The same finding, reduced to its five calls.
#[test]
fn regression_ack_batch_with_a_stale_and_the_current_lease_of_one_job() {
    use leaseq::sim::SimDisk;
    use leaseq::{EnqueueOptions, Error, ManualClock, Queue};
    use std::time::Duration;

    for with_effect in [false, true] {
        let clock = ManualClock::new(sim_model::T0_MS);
        let disk = SimDisk::new(1);
        let q = Queue::builder()
            .retry(leaseq::RetryPolicy::immediate())
            .clock(clock.clone())
            .open_backend(disk.backend())
            .unwrap();
        q.enqueue(
            b"x",
            EnqueueOptions::default().lease(Duration::from_millis(10)),
        )
        .unwrap();
        let stale = q.dequeue().unwrap().unwrap();
        clock.advance(Duration::from_millis(20));
        let current = q.dequeue().unwrap().unwrap(); // the expired lease, delivered again
        assert_eq!(stale.id(), current.id());
        let id = current.id();
        let leases = [stale, current];
        let r: Vec<Result<(), Error>> = if with_effect {
            let r = q.ack_with_batch(&leases, |_, _| Ok(())).unwrap();
            r.into_iter().map(|r| r.map(drop)).collect()
        } else {
            q.ack_batch(&leases).unwrap()
        };
        assert!(
            matches!(r.as_slice(), [Err(Error::LeaseLost { .. }), Ok(())]),
            "with_effect={with_effect}: {r:?}"
        );
        assert_eq!(q.job(id).unwrap(), None, "the current lease acked the job");
        assert!(matches!(leases[1].ack(), Err(Error::LeaseLost { .. })));
        assert!(q.check().unwrap().is_empty());
    }
}

// ------------------------------------------------------------------------------------------
// Fuzz findings kept as regressions, and the committed seed corpus (fuzz/seeds/) replayed
// ------------------------------------------------------------------------------------------

/// The fuzz targets' committed seed corpus: one directory per target.
fn seeds_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target)
}

/// The files of a seed directory, sorted by name (a directory with none is a broken checkout).
fn seed_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seed files in {}", dir.display());
    files
}

/// The fuzz targets' settings for `run_bytes`.
const FUZZ_SETTINGS: Settings = Settings {
    min_steps: 0,
    max_steps: 400,
    full_check_every: 4,
};

/// The child side of the `open_corrupt` replays: runs each input file of the scenario's path
/// (a file, or a directory of them) through `sim_model::corrupt::open_corrupt`, from the
/// index the scenario names, one report per file. An abort ends the child mid-file, which the
/// parent reports. Scenario `open_corrupt <start>`, or `open_corrupt-selftest <start>`, which
/// aborts in its second file (the parent must report that), or `sweep <mode> 0`, which runs
/// `close_written_sweep` opening as `mode` says.
#[test]
fn child_entry_open_corrupt() {
    let Some((scenario, path)) = common::child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    // leaseq catches redb's panics at its boundary; keep their messages out of the output.
    std::panic::set_hook(Box::new(|_| {}));
    let (mode, start) = scenario.rsplit_once(' ').unwrap();
    let start: usize = start.parse().unwrap();
    if let Some(open_mode) = mode.strip_prefix("sweep ") {
        if start > 0 {
            // Respawned after the sweep died: it is one case, already reported.
            common::say("DONE");
            common::ready_to_die();
        }
        common::say("START 0");
        let outcome = match sim_model::corrupt::close_written_sweep(
            open_mode.parse().unwrap(),
            64,
            29,
            &[0x2E, 0xFF, 0x01, 0x80],
        ) {
            Ok(n) => format!("{n} images OK"),
            Err(e) => e.replace('\n', " "),
        };
        common::say(format!("CASE 0 {mode}: {outcome}"));
        common::say("DONE");
        common::ready_to_die();
    }
    let files = if path.is_dir() {
        seed_files(&path)
    } else {
        vec![path]
    };
    for (i, file) in files.iter().enumerate().skip(start) {
        common::say(format!("START {i}"));
        if mode == "open_corrupt-selftest" && i == 1 {
            std::process::abort();
        }
        let data = std::fs::read(file).unwrap();
        let outcome = match sim_model::corrupt::open_corrupt(&data) {
            Ok(()) => "OK".to_string(),
            Err(e) => e.replace('\n', " "),
        };
        common::say(format!("CASE {i} {} {outcome}", file.display()));
    }
    common::say("DONE");
    common::ready_to_die();
}

/// Runs `sim_model::corrupt::open_corrupt` over the input file `path` (or every file of the
/// directory `path`) in child processes (this test binary re-run), so that an abort of the
/// process is reported against its input instead of killing the test binary; respawns past an
/// input that killed its child. Returns one line per input: `<i> <file> OK`, or the failure.
fn replay_open_corrupt_in_child(path: &Path, mode: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut start = 0;
    loop {
        let scenario = format!("{mode} {start}");
        let mut child =
            common::ChildProc::spawn("crash_model::child_entry_open_corrupt", &scenario, path);
        let mut current = None;
        let mut done = false;
        while let Some(m) = child.next_message() {
            if let Some(i) = m.strip_prefix("START ") {
                current = Some(i.parse::<usize>().unwrap());
            } else if let Some(rest) = m.strip_prefix("CASE ") {
                lines.push(rest.to_string());
                current = None;
            } else if m == "DONE" {
                done = true;
                break;
            } else {
                panic!("unexpected message from the open_corrupt child: {m}");
            }
        }
        let status = (0..200).find_map(|_| {
            let s = child.exited();
            if s.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            s
        });
        child.kill();
        if done {
            return lines;
        }
        let i = current.expect("the open_corrupt child died outside any input");
        lines.push(format!("{i} ABORT: the process died ({status:?})"));
        start = i + 1;
    }
}

fn assert_all_ok(lines: &[String]) {
    assert!(!lines.is_empty());
    let bad: Vec<&String> = lines.iter().filter(|l| !l.ends_with(" OK")).collect();
    assert!(bad.is_empty(), "{} input(s) failed:\n{bad:#?}", bad.len());
}

/// Found by the `open_corrupt` fuzz target (issue 14; input `YDFA8y58cGE=`, kept in
/// `fuzz/seeds/open_corrupt/`): the cleanly closed base image on a `SimDisk` with one byte of
/// redb's saved allocator state XORed. redb trusted that state at open; the next durable commit
/// (an `ack_with`) tripped an assertion in its buddy allocator, leaseq caught the panic, and
/// while it unwound a `Drop` inside redb panicked again on a poisoned mutex: a panic during
/// unwinding aborts the process, which no `catch_unwind` can stop. Fixed by redb's integrity
/// check at open, on by default (`Builder::check_integrity`). Run in a child process: an abort
/// fails this test instead of killing the test binary.
#[test]
fn regression_issue14_clean_file_with_corrupt_allocator_state_never_aborts() {
    if common::child_scenario().is_some() {
        return;
    }
    let file = seeds_dir("open_corrupt").join("issue14-clean-allocator-state-abort");
    let lines = replay_open_corrupt_in_child(&file, "open_corrupt");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_all_ok(&lines);
}

/// Every committed `open_corrupt` seed input runs clean: no panic crosses leaseq's API and the
/// process never aborts (each replayed in a child process).
#[test]
fn fuzz_seed_corpus_open_corrupt_replays_clean() {
    if common::child_scenario().is_some() {
        return;
    }
    let dir = seeds_dir("open_corrupt");
    let lines = replay_open_corrupt_in_child(&dir, "open_corrupt");
    assert_eq!(lines.len(), seed_files(&dir).len(), "{lines:#?}");
    assert_all_ok(&lines);
}

/// Issue 14, the whole kind: byte flips over the pages the clean close of the base image wrote
/// (redb's saved allocator state and the system-table pages leading to it, which a plain open
/// trusts), each image opened, checked, read, drained and written to, on a `SimDisk` with
/// `open_backend` and from a file with `Queue::open`: no panic crosses leaseq's API and the
/// process never aborts (run in a child process). With the integrity check off, the first
/// such flips abort the process, as the fuzz target found.
#[test]
fn flips_in_the_allocator_state_of_a_clean_file_never_abort_or_panic() {
    if common::child_scenario().is_some() {
        return;
    }
    let pages = sim_model::corrupt::close_written_pages();
    assert!(!pages.is_empty(), "the clean close wrote no page");
    for mode in [0u8, 2] {
        let lines = replay_open_corrupt_in_child(Path::new("."), &format!("sweep {mode}"));
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            lines[0].ends_with("images OK"),
            "pages {pages:?}: {lines:#?}"
        );
    }
}

/// The `open_corrupt` base images with schedules (mode bit 7) hold them, in the default queue
/// and in a named one, so the fuzzer's edits hit the schedule tables; their open decides the
/// due ones (the schedules of every queue).
#[test]
fn open_corrupt_scheduled_base_images_hold_schedules_groups_and_limits() {
    use leaseq::sim::SimDisk;
    use leaseq::{ManualClock, Queue};

    let (clean, killed) = sim_model::corrupt::scheduled_images();
    for image in [clean, killed] {
        let clock = ManualClock::new(sim_model::T0_MS + 10_000);
        let disk = SimDisk::from_image(image.clone(), 1);
        let q = Queue::builder()
            .clock(clock)
            .open_backend(disk.backend())
            .unwrap();
        let names: Vec<String> = q.schedules().unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["nightly", "tick"]);
        let side = q.existing("side").unwrap().schedules().unwrap();
        assert_eq!(side.len(), 1);
        assert!(side[0].next_due_ms > Some(sim_model::T0_MS + 10_000));
        let rec = q.recovery();
        assert_eq!(rec.schedules_fired + rec.schedules_skipped, 2, "{rec:?}");
        assert!(q.check().unwrap().is_empty());
        // Flow control: grouped jobs, and each queue's limit with its stored window ("side"
        // used its one delivery an hour's window ago less 10 s: nothing until it ends).
        let grouped = (1..=24)
            .filter_map(|id| q.job(leaseq::JobId(id)).unwrap())
            .filter(|j| j.group.is_some())
            .count();
        assert!(grouped >= 4, "{grouped} grouped jobs");
        assert_eq!(
            q.rate_limit().unwrap(),
            Some(leaseq::RateLimit::new(
                40,
                std::time::Duration::from_secs(60)
            ))
        );
        let side = q.existing("side").unwrap();
        assert_eq!(side.rate_limit().unwrap().map(|l| l.max), Some(1));
        assert!(side.dequeue().unwrap().is_none());
        assert!(side.stats().unwrap().ready >= 2);
    }
}

/// The replay above can fail: a child that aborts inside an input is reported against that
/// input, and the inputs after it still run.
#[test]
fn open_corrupt_child_replay_reports_an_abort() {
    if common::child_scenario().is_some() {
        return;
    }
    let dir = seeds_dir("open_corrupt");
    let n = seed_files(&dir).len();
    let lines = replay_open_corrupt_in_child(&dir, "open_corrupt-selftest");
    assert!(
        n >= 2,
        "the self-test needs an input after the aborting one"
    );
    assert_eq!(lines.len(), n, "{lines:#?}");
    assert!(lines[1].starts_with("1 ABORT"), "{lines:#?}");
    assert_eq!(lines.iter().filter(|l| l.contains("ABORT")).count(), 1);
}

/// Every committed `crash_recovery` seed input runs clean: the queue agrees with the model.
#[test]
fn fuzz_seed_corpus_crash_recovery_replays_clean() {
    let mut failed = Vec::new();
    for file in seed_files(&seeds_dir("crash_recovery")) {
        let data = std::fs::read(&file).unwrap();
        let out = std::panic::catch_unwind(|| sim_model::run_bytes(&data, FUZZ_SETTINGS))
            .unwrap_or_else(|_| Outcome {
                violation: Some("PANIC out of the harness".into()),
                ..Outcome::default()
            });
        if out.violation.is_some() {
            failed.push(format!("{}:\n{}", file.display(), out.report()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Issue 14, second finding: a false alarm of the harness, not a fault of the queue. The
/// `crash_recovery` fuzz target stopped on an input (kept in `fuzz/seeds/crash_recovery/`) where
/// a crash armed during a reopen stayed armed after the open returned; with
/// `Durability::None` and a small cache, the periodic full check's reads made redb write cached
/// pages of non-durable commits back to the file, the planned crash fired on one of those
/// writes, `check()` rightly returned the I/O error, and the harness called that "queue
/// disagrees with the model (no crash)". The harness now treats a crash inside a check as a
/// crash between calls and compares the rebooted file with the model.
///
/// The fuzzer's input no longer reaches that point once the integrity check changed the I/O
/// of every open, so this runs a seed that does (found by
/// `find_seeds_that_crash_inside_a_check`; 780 since the crash model writes a cancel inside a
/// `Queue::write`). The log assertion keeps the test meaningful: when a
/// change of leaseq's I/O moves the crash elsewhere, it fails and names the search to run.
#[test]
fn regression_issue14_power_loss_inside_a_check_is_a_crash_not_a_violation() {
    let out = run_caught(780);
    assert!(out.violation.is_none(), "{}", out.report());
    assert!(
        out.log
            .iter()
            .any(|l| l.contains("the planned crash hit the check's reads")),
        "seed 780 no longer crashes inside a check; pick another with \
         `cargo test --features sim --test sim -- --ignored crash_model::find_seeds --nocapture`:\n{}",
        out.report()
    );
}

/// Lists the seeds whose planned crash fires inside the reads of a check (for the regression
/// above). `LEASEQ_SIM_SEEDS` seeds from 0 (default 3000); a few in 4,000 do (2006, 2057, 2127, 2209 and 2295 last
/// with this harness, which drives every control of issue 22, periodic jobs, ordered groups and
/// rate limits, live reads, format 9, and the journal on the queue file's power line;
/// run with `--release`).
#[test]
#[ignore = "a search, not a test"]
fn find_seeds_that_crash_inside_a_check() {
    let seeds = env_u64("LEASEQ_SIM_SEEDS").unwrap_or(3000);
    for seed in 0..seeds {
        let out = run_caught(seed);
        if let Some(l) = out
            .log
            .iter()
            .find(|l| l.contains("hit the check's reads") || l.contains("hit the reads of"))
        {
            println!("seed {seed}: {l} (violation: {:?})", out.violation);
        }
    }
}
