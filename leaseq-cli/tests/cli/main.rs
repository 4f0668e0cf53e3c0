//! The `leaseq` command-line tool, driven as a user would: the built binary on temporary
//! files, its exit codes, its one-line errors, and the files it must leave alone.

use std::borrow::Borrow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use leaseq::{Durability, Encoding, EnqueueOptions, JobInfo, JobState, Queue, RetryPolicy};
use serde_json::Value;

#[path = "../../../tests/common/mod.rs"]
mod common;
mod control;
mod schedules;

const BIN: &str = env!("CARGO_BIN_EXE_leaseq");
/// Longest any one run of the tool may take before the test calls it a hang.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// What the tool may be given on stdin.
enum Input<'a> {
    None,
    Bytes(&'a [u8]),
    File(&'a Path),
}

/// Runs the tool with `args`, stdin from `input`; fails the test if it runs longer than
/// `RUN_TIMEOUT`.
fn run_in(args: &[&str], input: Input<'_>) -> Output {
    // Through the target's runner, as cargo runs this test (an emulator for a foreign target).
    let mut cmd = common::target_command(BIN);
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG");
    match input {
        Input::None => {
            cmd.stdin(Stdio::null());
        }
        Input::Bytes(_) => {
            cmd.stdin(Stdio::piped());
        }
        Input::File(p) => {
            cmd.stdin(std::fs::File::open(p).unwrap());
        }
    }
    let mut child = common::spawn_retrying(&mut cmd);
    if let Input::Bytes(bytes) = input {
        let mut stdin = child.stdin.take().unwrap();
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    // Drain the pipes on threads so a large output never blocks the child.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).unwrap();
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut v).unwrap();
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("leaseq {args:?} ran longer than {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

fn run(args: &[&str]) -> Output {
    run_in(args, Input::None)
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: impl Borrow<Output>) -> String {
    String::from_utf8(o.borrow().stdout.clone()).expect("stdout is UTF-8")
}

/// Exit 0 and nothing on stderr.
fn ok(o: Output) -> Output {
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert!(o.stderr.is_empty(), "stderr: {}", stderr(&o));
    o
}

/// Exit `want` and exactly one line on stderr, prefixed `leaseq: `; returns that line.
fn fails(o: &Output, want: i32) -> String {
    let err = stderr(o);
    assert_eq!(code(o), want, "stderr: {err}");
    assert!(err.starts_with("leaseq: "), "stderr: {err:?}");
    assert!(err.ends_with('\n'), "stderr: {err:?}");
    assert_eq!(err.lines().count(), 1, "stderr: {err:?}");
    assert!(!err.contains("panicked"), "stderr: {err:?}");
    err
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn tmp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    (dir, path)
}

/// A queue file with a few jobs: 2 ready in the default queue, 1 scheduled in `mail`.
fn small_file(path: &Path) {
    let q = Queue::open(path).unwrap();
    q.enqueue(b"one", EnqueueOptions::default()).unwrap();
    q.enqueue(b"two", EnqueueOptions::default().priority(-1))
        .unwrap();
    q.named("mail")
        .unwrap()
        .enqueue(
            b"later",
            EnqueueOptions::default().delay(Duration::from_secs(3600)),
        )
        .unwrap();
}

fn json_lines(o: impl Borrow<Output>) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[test]
fn bad_arguments_exit_2_with_one_line_and_touch_nothing() {
    let (_dir, path) = tmp();
    let p = s(&path);
    let payload = path.with_file_name("payload.bin");
    std::fs::write(&payload, b"x").unwrap();
    let bad: Vec<Vec<&str>> = vec![
        vec![],
        vec!["frobnicate", p],
        vec!["stats"],
        vec!["ls", p, "--state", "sleeping"],
        vec!["purge", p, "--state", "sleeping"],
        vec!["purge", p, "--state", "leased"],
        vec!["purge", p],
        vec!["enqueue", p, "--data", "x", "--delay", "5x"],
        vec!["enqueue", p, "--data", "x", "--delay", "-5s"],
        vec!["enqueue", p, "--data", "x", "--delay=-5s"],
        vec!["enqueue", p, "--data", "x", "--delay", ""],
        vec!["enqueue", p, "--data", "x", "--delay", "5"],
        vec!["enqueue", p, "--data", "x", "--delay", "1.5h"],
        vec!["enqueue", p, "--data", "x", "--delay", "366d"],
        vec![
            "enqueue",
            p,
            "--data",
            "x",
            "--delay",
            "99999999999999999999999s",
        ],
        vec!["enqueue", p, "--data", "x", "--delay", "213503982335d"],
        vec!["enqueue", p, "--data", "x", "--file", s(&payload)],
        vec!["enqueue", p, "--data", "x", "--max-attempts", "0"],
        vec!["enqueue", p, "--data", "x", "--lease", "13h"],
        vec!["enqueue", p, "--data", "x", "--queue", "no spaces"],
        vec!["enqueue", p, "--data", "x", "--priority", "nine"],
        vec!["enqueue", p, "--file", "/nonexistent/payload"],
        vec!["requeue-dead", p],
        vec!["requeue-dead", p, "7", "--all"],
        vec!["show", p, "not-a-number"],
        vec!["ls", p, "--bogus-flag"],
        vec!["prune", p, "--applied-retention", "3 days"],
        vec!["schedules"],
        vec!["schedules", p, "--queue"],
        vec!["schedule-remove", p],
    ];
    // Against a missing file: nothing is created.
    for args in &bad {
        let o = run(args);
        let line = fails(&o, 2);
        assert!(o.stdout.is_empty(), "{args:?}: stdout {:?}", stdout(&o));
        assert!(!path.exists(), "{args:?} created the file ({line})");
    }
    // Against an existing file: its bytes are unchanged.
    small_file(&path);
    let before = std::fs::read(&path).unwrap();
    for args in &bad {
        fails(&run(args), 2);
        assert!(
            std::fs::read(&path).unwrap() == before,
            "{args:?} changed the file"
        );
    }
    // The durations' messages say what is wrong.
    let negative = fails(&run(&["enqueue", p, "--data", "x", "--delay", "-5s"]), 2);
    assert!(negative.contains("negative"), "{negative}");
    let long = fails(&run(&["enqueue", p, "--data", "x", "--delay", "366d"]), 2);
    assert!(long.contains("365d"), "{long}");
    let unit = fails(&run(&["enqueue", p, "--data", "x", "--delay", "5w"]), 2);
    assert!(unit.contains("unknown unit"), "{unit}");
}

#[test]
fn help_documents_exit_codes() {
    let o = ok(run(&["--help"]));
    let help = stdout(o);
    for needle in ["Exit codes", "0  success", "1  the command ran", "2  usage"] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
}

#[test]
fn read_commands_never_create_a_missing_file() {
    let (_dir, path) = tmp();
    let p = s(&path);
    for args in [
        vec!["stats", p],
        vec!["ls", p],
        vec!["show", p, "1"],
        vec!["check", p],
        vec!["queues", p],
        vec!["schedules", p],
        vec!["schedules", p, "--queue", "mail", "--json"],
        vec!["schedule-remove", p, "tick"],
        vec!["export", p],
        vec!["purge", p, "--state", "dead"],
        vec!["requeue-dead", p, "--all"],
        vec!["prune", p],
        vec!["compact", p],
    ] {
        let line = fails(&run(&args), 2);
        assert!(line.contains("no such file"), "{args:?}: {line}");
        assert!(!path.exists(), "{args:?} created the file");
    }
}

/// Runs every command that opens the file against `path` and asserts each refuses it with
/// exit 2 and a message containing `needle`, leaving its bytes as they were.
fn every_command_refuses(path: &Path, needle: &str) {
    let p = s(path);
    let before = std::fs::read(path).unwrap();
    let jsonl = b"{\"payload_utf8\":\"x\"}\n";
    let runs: Vec<(Vec<&str>, Input<'_>)> = vec![
        (vec!["stats", p], Input::None),
        (vec!["ls", p], Input::None),
        (vec!["show", p, "1"], Input::None),
        (vec!["check", p], Input::None),
        (vec!["queues", p], Input::None),
        (vec!["schedules", p], Input::None),
        (vec!["schedule-remove", p, "tick"], Input::None),
        (vec!["export", p], Input::None),
        (vec!["enqueue", p, "--data", "x"], Input::None),
        (vec!["import", p], Input::Bytes(jsonl)),
        (vec!["purge", p, "--state", "dead"], Input::None),
        (vec!["requeue-dead", p, "--all"], Input::None),
        (vec!["pause", p], Input::None),
        (vec!["resume", p], Input::None),
        (vec!["prune", p], Input::None),
        (vec!["compact", p], Input::None),
    ];
    for (args, input) in runs {
        let o = run_in(&args, input);
        let line = fails(&o, 2);
        assert!(line.contains(needle), "{args:?}: {line}");
        assert!(
            std::fs::read(path).unwrap() == before,
            "{args:?} changed the file"
        );
    }
}

#[test]
fn foreign_files_are_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    // 64 KiB of random bytes.
    let random = dir.path().join("random.bin");
    let mut rng = fastrand::Rng::with_seed(11);
    let bytes: Vec<u8> = (0..64 << 10).map(|_| rng.u8(..)).collect();
    std::fs::write(&random, &bytes).unwrap();
    every_command_refuses(&random, "not a leaseq file");
    // A real SQLite database.
    let sqlite = dir.path().join("app.db");
    {
        let c = rusqlite::Connection::open(&sqlite).unwrap();
        c.execute_batch("CREATE TABLE jobs(id INTEGER PRIMARY KEY, body BLOB); INSERT INTO jobs(body) VALUES (x'00ff');")
            .unwrap();
    }
    every_command_refuses(&sqlite, "not a leaseq file");
    // An empty file.
    let empty = dir.path().join("empty.leaseq");
    std::fs::write(&empty, b"").unwrap();
    every_command_refuses(&empty, "not a leaseq file");
    // A directory.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let line = fails(&run(&["stats", s(&sub)]), 2);
    assert!(line.contains("not a leaseq file"), "{line}");
}

#[test]
fn a_file_open_in_another_process_is_in_use_promptly() {
    let (_dir, path) = tmp();
    small_file(&path);
    let held = Queue::open(&path).unwrap();
    let p = s(&path);
    for args in [
        vec!["stats", p],
        vec!["ls", p],
        vec!["check", p],
        vec!["schedules", p],
        vec!["enqueue", p, "--data", "x"],
        vec!["compact", p],
        vec!["export", p],
    ] {
        let start = Instant::now();
        let line = fails(&run(&args), 2);
        assert!(line.contains("in use"), "{args:?}: {line}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            start.elapsed()
        );
    }
    assert_eq!(
        held.stats().unwrap().total,
        2,
        "the holder's queue is untouched"
    );
}

#[test]
fn enqueue_prints_the_id_and_says_duplicate() {
    let (_dir, path) = tmp();
    let p = s(&path);
    let o = ok(run(&["enqueue", p, "--data", "hello", "--dedup-key", "k"]));
    let id: u64 = stdout(o).trim().parse().expect("an id");
    let o = ok(run(&["enqueue", p, "--data", "again", "--dedup-key", "k"]));
    let text = stdout(o);
    assert!(text.starts_with(&format!("duplicate {id}")), "{text}");
    let o = ok(run(&[
        "enqueue",
        p,
        "--data",
        "third",
        "--dedup-key",
        "k",
        "--json",
    ]));
    let v: Value = serde_json::from_str(stdout(o).trim()).unwrap();
    assert_eq!(v["outcome"], "duplicate");
    assert_eq!(v["id"], id);
    // From a file and from stdin, with options.
    let payload_path = path.with_file_name("p.bin");
    std::fs::write(&payload_path, [0u8, 159, 146, 150]).unwrap();
    let o = ok(run(&[
        "enqueue",
        p,
        "--file",
        s(&payload_path),
        "--queue",
        "mail",
        "--delay",
        "90s",
        "--priority",
        "-7",
        "--idempotency-key",
        "order-9",
        "--max-attempts",
        "3",
        "--lease",
        "2m",
    ]));
    let file_id: u64 = stdout(o).trim().parse().unwrap();
    let o = ok(run_in(&["enqueue", p], Input::Bytes(b"from stdin")));
    let stdin_id: u64 = stdout(o).trim().parse().unwrap();

    let q = Queue::open(&path).unwrap();
    assert_eq!(q.payload(leaseq::JobId(id)).unwrap().unwrap(), b"hello");
    assert_eq!(
        q.payload(leaseq::JobId(stdin_id)).unwrap().unwrap(),
        b"from stdin"
    );
    let mail = q.existing("mail").unwrap();
    let info = mail.job(leaseq::JobId(file_id)).unwrap().unwrap();
    assert_eq!(info.state, JobState::Scheduled);
    assert_eq!(info.priority, -7);
    assert_eq!(info.max_attempts, 3);
    assert_eq!(info.idempotency_key.as_deref(), Some(&b"order-9"[..]));
    assert_eq!(info.run_at_ms - info.created_ms, 90_000);
    assert_eq!(
        mail.payload(leaseq::JobId(file_id)).unwrap().unwrap(),
        [0u8, 159, 146, 150]
    );
    assert_eq!(q.stats().unwrap().total, 2);
}

#[test]
fn json_outputs_parse_as_json() {
    let (_dir, path) = tmp();
    small_file(&path);
    let p = s(&path);
    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[0]["queue"], Value::Null);
    assert_eq!(stats[0]["ready"], 2);
    assert_eq!(stats[1]["queue"], "mail");
    assert_eq!(stats[1]["scheduled"], 1);
    let one = json_lines(ok(run(&["stats", p, "--json", "--queue", "mail"])));
    assert_eq!(one.len(), 1);
    assert_eq!(one[0]["total"], 1);

    let jobs = json_lines(ok(run(&["ls", p, "--json"])));
    assert_eq!(jobs.len(), 3);
    // Ready first, in dequeue order (priority -1 first), then scheduled.
    assert_eq!(jobs[0]["priority"], -1);
    assert_eq!(jobs[0]["state"], "ready");
    assert_eq!(jobs[2]["state"], "scheduled");
    assert_eq!(jobs[2]["queue"], "mail");
    assert_eq!(jobs[0]["payload_bytes"], 3);
    let limited = json_lines(ok(run(&["ls", p, "--json", "--limit", "1"])));
    assert_eq!(limited.len(), 1);
    let scheduled = json_lines(ok(run(&["ls", p, "--json", "--state", "scheduled"])));
    assert_eq!(scheduled.len(), 1);

    let id = jobs[0]["id"].as_u64().unwrap().to_string();
    let show = json_lines(ok(run(&["show", p, &id, "--json"])));
    assert_eq!(show.len(), 1);
    assert_eq!(show[0]["payload_utf8"], "two");
    assert_eq!(show[0]["id"].as_u64().unwrap().to_string(), id);

    let queues = json_lines(ok(run(&["queues", p, "--json"])));
    assert_eq!(queues, vec![serde_json::json!({"queues": ["mail"]})]);
    let check = json_lines(ok(run(&["check", p, "--json"])));
    assert_eq!(
        check,
        vec![serde_json::json!({"ok": true, "violations": []})]
    );
}

#[test]
fn human_output_shows_the_default_queue_and_every_field() {
    let (_dir, path) = tmp();
    small_file(&path);
    let p = s(&path);
    let stats = stdout(ok(run(&["stats", p])));
    assert!(
        stats.contains("(default)") && stats.contains("mail"),
        "{stats}"
    );
    let ls = stdout(ok(run(&["ls", p, "--queue", "(default)"])));
    assert_eq!(ls.lines().count(), 3, "header and two jobs:\n{ls}");
    let names = stdout(ok(run(&["queues", p])));
    assert_eq!(names, "mail\n");
    let jobs = json_lines(ok(run(&["ls", p, "--json", "--state", "scheduled"])));
    let id = jobs[0]["id"].as_u64().unwrap().to_string();
    let show = stdout(ok(run(&["show", p, &id])));
    for field in [
        "id",
        "queue",
        "state",
        "attempts",
        "priority",
        "run_at",
        "created",
        "died",
        "lease_deadline",
        "lease_token",
        "last_error",
        "idempotency_key",
        "dedup_key",
        "lease",
        "timeout",
        "payload",
    ] {
        assert!(
            show.lines().any(|l| l.starts_with(&format!("{field} "))),
            "show lacks {field}:\n{show}"
        );
    }
    assert!(
        show.contains("scheduled") && show.contains("later"),
        "{show}"
    );
}

#[test]
fn show_raw_is_byte_exact_and_missing_ids_exit_1() {
    let (_dir, path) = tmp();
    let payload: Vec<u8> = (0..=255u8).chain([0, 0xff, b'\n', 0xc3]).collect();
    let id = {
        let q = Queue::open(&path).unwrap();
        q.named("bin")
            .unwrap()
            .enqueue(&payload, EnqueueOptions::default())
            .unwrap()
            .id()
    };
    let p = s(&path);
    let o = ok(run(&["show", p, &id.to_string(), "--raw"]));
    assert_eq!(o.stdout, payload);
    let v = json_lines(ok(run(&["show", p, &id.to_string(), "--json"])));
    assert_eq!(
        v[0]["payload_hex"].as_str().unwrap().len(),
        payload.len() * 2
    );
    assert!(v[0].get("payload_utf8").is_none());
    let line = fails(&run(&["show", p, "999999"]), 1);
    assert!(line.contains("no job 999999"), "{line}");
    fails(
        &run(&["show", p, &id.to_string(), "--queue", "(default)"]),
        1,
    );
    fails(&run(&["show", p, &id.to_string(), "--queue", "nope"]), 1);
}

#[test]
fn check_is_0_on_a_clean_file_and_1_on_violations_or_damage() {
    use leaseq::redb::{ReadableDatabase, TableDefinition, TableHandle};
    let (_dir, path) = tmp();
    small_file(&path);
    let p = s(&path);
    let out = stdout(ok(run(&["check", p])));
    assert!(out.contains("ok"), "{out}");
    // A stray table of an unregistered queue number: a violation check() reports.
    {
        let q = Queue::open(&path).unwrap();
        let tx = q.database().begin_write().unwrap();
        let stray: TableDefinition<u64, u64> = TableDefinition::new("leaseq_q7_jobs");
        tx.open_table(stray).unwrap().insert(1, 1).unwrap();
        tx.commit().unwrap();
    }
    let o = run(&["check", p]);
    let line = fails(&o, 1);
    assert!(line.contains("1 violation found"), "{line}");
    assert!(stdout(&o).contains("not registered"), "{}", stdout(&o));
    let o = run(&["check", p, "--json"]);
    assert_eq!(code(&o), 1);
    let v = json_lines(&o);
    assert_eq!(v[0]["ok"], false);
    assert_eq!(v[0]["violations"].as_array().unwrap().len(), 1);
    // The default queue's ready index dropped: damage, also exit 1 from check (and 2 from
    // the other commands, which cannot use the file).
    {
        let q = Queue::open(&path).unwrap();
        let db = q.database();
        let names: Vec<String> = db
            .begin_read()
            .unwrap()
            .list_tables()
            .unwrap()
            .map(|t| t.name().to_string())
            .collect();
        assert!(names.iter().any(|n| n == "leaseq_ready"), "{names:?}");
        let tx = db.begin_write().unwrap();
        let handle = tx
            .list_tables()
            .unwrap()
            .find(|t| t.name() == "leaseq_ready")
            .unwrap();
        assert!(tx.delete_table(handle).unwrap());
        tx.commit().unwrap();
    }
    let line = fails(&run(&["check", p]), 1);
    assert!(line.contains("corrupted"), "{line}");
    let v = json_lines(run(&["check", p, "--json"]));
    assert_eq!(v[0]["ok"], false);
    fails(&run(&["stats", p]), 2);
}

#[test]
fn requeue_purge_prune_compact() {
    let (_dir, path) = tmp();
    let dead_id = {
        let q = Queue::open(&path).unwrap();
        for i in 0..5u8 {
            q.enqueue(&[i], EnqueueOptions::default()).unwrap();
        }
        let lease = q.dequeue().unwrap().unwrap();
        lease.fail("broken").unwrap();
        let other = q.dequeue().unwrap().unwrap();
        other.fail("broken too").unwrap();
        lease.id()
    };
    let p = s(&path);
    let dead = json_lines(ok(run(&["ls", p, "--state", "dead", "--json"])));
    assert_eq!(dead.len(), 2);
    assert_eq!(dead[0]["last_error"], "broken");
    ok(run(&["requeue-dead", p, &dead_id.to_string()]));
    let line = fails(&run(&["requeue-dead", p, &dead_id.to_string()]), 1);
    assert!(line.contains("not dead"), "{line}");
    fails(&run(&["requeue-dead", p, "424242"]), 1);
    let out = stdout(ok(run(&["requeue-dead", p, "--all"])));
    assert!(out.contains("requeued 1 dead jobs"), "{out}");
    let out = stdout(ok(run(&["purge", p, "--state", "ready"])));
    assert!(out.contains("purged 5 ready jobs"), "{out}");
    ok(run(&["prune", p, "--dead-retention", "1d"]));
    ok(run(&["compact", p]));
    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    assert_eq!(stats[0]["total"], 0);
}

/// `pause` and `resume`: every queue without `--queue`, one with it; stored in the file (the
/// library sees it), shown by `stats` (a column, and `paused` in JSON).
#[test]
fn pause_and_resume_every_queue_or_one() {
    let (_dir, path) = tmp();
    {
        let q = Queue::open(&path).unwrap();
        q.named("side")
            .unwrap()
            .enqueue(b"s", EnqueueOptions::default())
            .unwrap();
        q.enqueue(b"d", EnqueueOptions::default()).unwrap();
    }
    let p = s(&path);
    let out = stdout(ok(run(&["pause", p, "--queue", "side"])));
    assert_eq!(out.trim(), "side: paused");
    let out = stdout(ok(run(&["pause", p])));
    assert!(
        out.contains("(default): paused") && out.contains("side: already paused"),
        "{out}"
    );
    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    assert!(stats.iter().all(|s| s["paused"] == true), "{stats:?}");
    let table = stdout(ok(run(&["stats", p])));
    assert!(
        table.lines().next().unwrap().contains(" PAUSED "),
        "{table}"
    );
    {
        let q = Queue::open(&path).unwrap();
        assert!(q.is_paused() && q.existing("side").unwrap().is_paused());
        assert!(q.dequeue().unwrap().is_none());
    }
    let out = stdout(ok(run(&["resume", p, "--queue", "(default)"])));
    assert_eq!(out.trim(), "(default): resumed");
    let q = Queue::open(&path).unwrap();
    assert!(!q.is_paused());
    assert!(q.existing("side").unwrap().is_paused());
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), b"d");
    l.ack().unwrap();
    drop((l, q));
    fails(&run(&["pause", p, "--queue", "nope"]), 1);
}

/// `cancel`, `retry` and `promote` on one job, found in whichever queue holds it; the new
/// states in `ls` and `stats`; the key column; `show` with the reason, status and errors.
#[test]
fn cancel_retry_and_promote_a_job_and_see_the_new_states() {
    let (_dir, path) = tmp();
    let (sync, later, done) = {
        let q = Queue::builder()
            .retry(RetryPolicy::immediate())
            .open(&path)
            .unwrap();
        q.set_history(leaseq::History::off().keep_jobs(10)).unwrap();
        let side = q.named("side").unwrap();
        side.set_history(leaseq::History::off().keep_jobs(10))
            .unwrap();
        let sync = side
            .enqueue(b"sync", EnqueueOptions::default().dedup_key("note-7"))
            .unwrap()
            .id();
        let later = q
            .enqueue(
                b"later",
                EnqueueOptions::default().delay(Duration::from_secs(3600)),
            )
            .unwrap()
            .id();
        let done = q.enqueue(b"done", EnqueueOptions::default()).unwrap().id();
        let l = q.dequeue().unwrap().unwrap();
        l.nack("flaky").unwrap();
        let l = q.dequeue().unwrap().unwrap();
        l.snooze_because(Duration::ZERO, "waiting for network")
            .unwrap();
        q.dequeue()
            .unwrap()
            .unwrap()
            .ack_with_result(b"ok")
            .unwrap();
        (sync, later, done)
    };
    let p = s(&path);
    let ls = stdout(ok(run(&["ls", p])));
    assert!(ls.lines().next().unwrap().contains(" KEY "), "{ls}");
    assert!(ls.contains("note-7"), "the key column: {ls}");
    assert!(ls.contains("completed"), "{ls}");
    let show = stdout(ok(run(&["show", p, &done.0.to_string()])));
    assert!(show.contains("result           ok"), "{show}");
    assert!(show.contains("error            attempt 1 at"), "{show}");
    assert!(show.contains("flaky"), "{show}");
    // Cancel the job of the named queue, found without --queue.
    let out = stdout(ok(run(&[
        "cancel",
        p,
        &sync.0.to_string(),
        "--reason",
        "note deleted",
    ])));
    assert_eq!(out.trim(), format!("cancelled {} (was ready)", sync.0));
    let out = stdout(ok(run(&["promote", p, &later.0.to_string()])));
    assert_eq!(out.trim(), format!("promoted {}", later.0));
    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    let side = stats.iter().find(|s| s["queue"] == "side").unwrap();
    assert_eq!(
        (side["cancelled"].as_u64(), side["leased"].as_u64()),
        (Some(1), Some(0))
    );
    let def = stats.iter().find(|s| s["queue"].is_null()).unwrap();
    assert_eq!(def["completed"].as_u64(), Some(1), "{def}");
    let ls = stdout(ok(run(&["ls", p, "--state", "cancelled"])));
    assert!(ls.contains("cancelled: note deleted"), "{ls}");
    let out = stdout(ok(run(&["retry", p, &done.0.to_string()])));
    assert_eq!(out.trim(), format!("retried {}", done.0));
    // Errors are said, and change nothing.
    fails(&run(&["cancel", p, &sync.0.to_string()]), 1);
    fails(&run(&["promote", p, &done.0.to_string()]), 1);
    fails(&run(&["retry", p, "999"]), 1);
    let q = Queue::open(&path).unwrap();
    assert_eq!(q.job(later).unwrap().unwrap().state, JobState::Ready);
    assert_eq!(q.job(done).unwrap().unwrap().state, JobState::Ready);
    assert!(q.check().unwrap().is_empty());
}

/// `prune` never removes applied markers unless told how old they may be: the tool cannot
/// know the application's retention, and a removed marker lets a duplicate apply again.
#[test]
fn prune_keeps_applied_markers_unless_given_a_retention() {
    let (_dir, path) = tmp();
    let month_ago_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        - 30 * 24 * 3_600_000;
    {
        let q = Queue::builder()
            .clock(leaseq::ManualClock::new(month_ago_ms))
            .open(&path)
            .unwrap();
        q.enqueue(b"pay", EnqueueOptions::default().idempotency_key("order-1"))
            .unwrap();
        q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
    }
    let p = s(&path);
    let applied = |path: &std::path::Path| {
        Queue::builder()
            .applied_retention(None)
            .open(path)
            .unwrap()
            .is_applied("order-1")
            .unwrap()
    };
    let out = stdout(ok(run(&["prune", p])));
    assert!(out.contains("removed 0 applied markers"), "{out}");
    assert!(applied(&path), "kept without --applied-retention");
    let out = stdout(ok(run(&["prune", p, "--applied-retention", "7d"])));
    assert!(out.contains("removed 1 applied markers"), "{out}");
    assert!(!applied(&path));
}

#[test]
fn logs_only_behind_v() {
    let (_dir, path) = tmp();
    small_file(&path);
    let p = s(&path);
    let quiet = run(&["stats", p]);
    ok(quiet);
    let loud = run(&["-v", "stats", p]);
    assert_eq!(code(&loud), 0);
    assert!(stderr(&loud).contains("opened"), "{}", stderr(&loud));
}

// ---- export and import ----

/// The fields of a job that survive an export and import (not its id, nor lease fields).
fn surviving(info: &JobInfo, payload: Vec<u8>) -> String {
    format!(
        "{:?} attempts={} max={} pri={} run_at={} created={} err={:?} idem={:?} dedup={:?} \
         window={:?} lease={:?} timeout={:?} retry={:?} snoozes={} encoding={:?} \
         payload={payload:?}",
        info.state,
        info.attempts,
        info.max_attempts,
        info.priority,
        info.run_at_ms,
        info.created_ms,
        info.last_error,
        info.idempotency_key,
        info.dedup_key,
        info.dedup_window_ms,
        info.lease_ms,
        info.timeout_ms,
        info.retry,
        info.snoozes,
        info.encoding,
    )
}

/// The file's queues, opened with the library: the default one, then the named ones by name
/// (the tool's order).
fn every_queue(path: &Path) -> Vec<Queue> {
    let q = Queue::open(path).unwrap();
    let mut queues = vec![q.clone()];
    for name in q.queue_names().unwrap() {
        queues.push(q.existing(&name).unwrap());
    }
    queues
}

/// Every job of every queue of the file at `path`, per queue and state in each state's order.
fn snapshot(path: &Path) -> Vec<(Option<String>, Vec<String>)> {
    let mut out = Vec::new();
    for queue in every_queue(path) {
        let mut jobs = Vec::new();
        for state in [JobState::Ready, JobState::Scheduled, JobState::Dead] {
            let mut after = None;
            loop {
                let page = queue.jobs(state, after, 1000).unwrap();
                for info in &page.jobs {
                    let payload = queue.payload(info.id).unwrap().unwrap();
                    jobs.push(surviving(info, payload));
                }
                match page.next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
        }
        out.push((queue.name().map(str::to_string), jobs));
    }
    out
}

/// A file of 10,000 jobs: ready, scheduled and dead, with and without keys, priorities,
/// binary payloads, attempts used, in the default queue and in `mail`.
fn mixed_file(path: &Path) {
    let q = Queue::builder()
        .durability(Durability::None)
        .retry(RetryPolicy::immediate())
        .open(path)
        .unwrap();
    let mail = q.named("mail").unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut batch: Vec<(Vec<u8>, EnqueueOptions)> = Vec::new();
    let mut batch_mail: Vec<(Vec<u8>, EnqueueOptions)> = Vec::new();
    for i in 0..10_000u32 {
        let payload: Vec<u8> = if i % 3 == 0 {
            (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect()
        } else if i % 97 == 0 {
            vec![b'x'; 3000] // stored apart from the record
        } else {
            format!("job {i} ✓").into_bytes()
        };
        let mut o = EnqueueOptions::default().priority(rng.i32(-3..=3));
        if i % 5 == 0 {
            o = o.dedup_key(format!("dedup-{i}"));
        }
        if i % 7 == 0 {
            o = o.idempotency_key([0xff, (i % 256) as u8, b'k']);
        }
        if i % 11 == 0 {
            o = o.idempotency_key(format!("idem-{i}"));
        }
        if i % 4 == 1 {
            o = o.delay(Duration::from_secs(60 + u64::from(i)));
        }
        if i % 13 == 0 {
            o = o.max_attempts(1 + i % 9);
        }
        if i % 10 == 5 {
            o = o.dedup_window(Duration::from_secs(3600));
        }
        match i % 17 {
            1 => o = o.retry(RetryPolicy::fixed(Duration::from_secs(5)).with_jitter(10)),
            2 => {
                o = o.retry(RetryPolicy::exponential(
                    Duration::from_millis(250),
                    Duration::from_secs(600),
                ))
            }
            3 => o = o.retry(RetryPolicy::immediate()),
            _ => {}
        }
        if i % 29 == 0 {
            o = o.lease(Duration::from_secs(120));
        }
        if i % 31 == 0 {
            o = o.timeout(Duration::from_millis(500 + u64::from(i)));
        }
        if i % 10 < 3 {
            batch_mail.push((payload, o));
        } else {
            batch.push((payload, o));
        }
    }
    q.enqueue_batch(batch.iter().map(|(p, o)| (&p[..], o.clone())))
        .unwrap();
    mail.enqueue_batch(batch_mail.iter().map(|(p, o)| (&p[..], o.clone())))
        .unwrap();
    // Typed payloads, in both encodings.
    for (queue, encoding) in [(&q, Encoding::Json), (&mail, Encoding::Bincode)] {
        let typed = queue.with_encoding(encoding);
        for i in 0..100u32 {
            typed
                .enqueue_value(&(i, format!("value {i}")), EnqueueOptions::default())
                .unwrap();
        }
    }
    // Some deliveries: failed (dead), nacked (attempts used, ready again or backing off),
    // snoozed (ready or scheduled, the attempt given back).
    for queue in [&q, &mail] {
        for n in 0..800 {
            let Some(lease) = queue.dequeue().unwrap() else {
                break;
            };
            match n % 4 {
                0 => lease.fail(&format!("failed {n}")).unwrap(),
                1 => lease.snooze(Duration::ZERO).unwrap(),
                2 => lease.snooze(Duration::from_secs(90)).unwrap(),
                _ => {
                    lease.nack(&format!("nacked {n}")).unwrap();
                }
            }
        }
    }
    q.flush().unwrap();
    let stats = q.stats().unwrap();
    assert!(stats.dead > 100 && stats.scheduled > 1000 && stats.ready > 1000);
}

#[test]
fn export_import_round_trip_of_10200_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.leaseq");
    let dst = dir.path().join("dst.leaseq");
    mixed_file(&src);
    let exported = ok(run(&["export", s(&src)])).stdout.clone();
    let jsonl = dir.path().join("jobs.jsonl");
    std::fs::write(&jsonl, &exported).unwrap();
    let lines: Vec<Value> = exported
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10_200);
    assert!(lines.iter().any(|l| l.get("payload_hex").is_some()));
    for field in [
        "retry",
        "lease_ms",
        "timeout_ms",
        "dedup_window_ms",
        "encoding",
    ] {
        assert!(lines.iter().any(|l| !l[field].is_null()), "no {field}");
    }
    assert!(lines.iter().any(|l| l["snoozes"] != 0));
    assert!(lines.iter().any(|l| l["state"] == "dead"));
    assert!(lines.iter().any(|l| l["state"] == "scheduled"));
    assert!(lines.iter().any(|l| l.get("idempotency_key_hex").is_some()));
    assert!(lines.iter().any(|l| l["queue"] == "mail"));

    let o = ok(run_in(&["import", s(&dst)], Input::File(&jsonl)));
    let report = stdout(o);
    assert!(report.contains("imported 10200"), "{report}");

    let before = snapshot(&src);
    let after = snapshot(&dst);
    assert_eq!(before.len(), after.len());
    for ((qa, a), (qb, b)) in before.iter().zip(&after) {
        assert_eq!(qa, qb);
        assert_eq!(a.len(), b.len(), "queue {qa:?}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x, y, "queue {qa:?}");
        }
    }
    let src_q = Queue::open(&src).unwrap();
    let dst_q = Queue::open(&dst).unwrap();
    for (a, b) in [
        (src_q.clone(), dst_q.clone()),
        (
            src_q.existing("mail").unwrap(),
            dst_q.existing("mail").unwrap(),
        ),
    ] {
        let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
        assert_eq!(sa.total, sb.total);
        assert_eq!(sa.dedup_keys, sb.dedup_keys);
    }
    drop((src_q, dst_q));

    // A second export of the imported file is the first one, ids aside.
    let again = ok(run(&["export", s(&dst)])).stdout.clone();
    let strip = |bytes: &[u8]| -> Vec<Value> {
        bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let mut v: Value = serde_json::from_slice(l).unwrap();
                v.as_object_mut().unwrap().remove("id");
                v
            })
            .collect()
    };
    assert!(strip(&exported) == strip(&again), "exports differ");

    // Importing the same lines again: every dedup key is held, so those are duplicates.
    let o = ok(run_in(&["import", s(&dst)], Input::File(&jsonl)));
    let report = stdout(o);
    assert!(report.contains("duplicates 2000"), "{report}");

    // --queue puts every line in one queue; from a pipe too.
    let third = dir.path().join("third.leaseq");
    let o = ok(run_in(
        &["import", s(&third), "--queue", "all"],
        Input::Bytes(&exported),
    ));
    assert!(stdout(&o).contains("imported 10200"), "{}", stdout(&o));
    let q = Queue::open(&third).unwrap();
    assert_eq!(q.queue_names().unwrap(), vec!["all".to_string()]);
    assert_eq!(q.existing("all").unwrap().stats().unwrap().total, 10_200);
    assert_eq!(q.stats().unwrap().total, 0);
}

/// 6,000 valid lines with line 5,000 replaced by `bad`.
fn jsonl_with_bad_line(bad: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 1..=6000 {
        if i == 5000 {
            out.extend_from_slice(bad.as_bytes());
        } else {
            out.extend_from_slice(
                format!("{{\"queue\":\"q{}\",\"payload_utf8\":\"job {i}\"}}", i % 3).as_bytes(),
            );
        }
        out.push(b'\n');
    }
    out
}

#[test]
fn a_bad_line_5000_names_it_and_imports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [
        "{\"payload_utf8\": \"x\"",                           // not JSON
        "{\"payload_utf8\": 5}",                              // wrong type
        "{\"payload_utf8\": \"x\", \"payload_hex\": \"00\"}", // both payloads
        "{\"payload_hex\": \"0g\"}",                          // bad hex
        "{\"state\": \"sleeping\", \"payload_utf8\": \"x\"}", // unknown state
        "{\"payload_utf8\": \"x\", \"colour\": 1}",           // unknown field
        "{\"state\": \"ready\"}",                             // no payload
        "{\"max_attempts\": 0, \"payload_utf8\": \"x\"}",     // refused by the library
        "{\"attempts\": 9, \"max_attempts\": 3, \"payload_utf8\": \"x\"}",
        "{\"queue\": \"bad name!\", \"payload_utf8\": \"x\"}",
    ] {
        let input = jsonl_with_bad_line(bad);
        // A new file is not even created.
        let fresh = dir.path().join("fresh.leaseq");
        let line = fails(&run_in(&["import", s(&fresh)], Input::Bytes(&input)), 2);
        assert!(line.contains("line 5000"), "{bad}: {line}");
        assert!(!fresh.exists(), "{bad}: the file was created");
        // An existing file keeps its jobs, and no more.
        let existing = dir.path().join("existing.leaseq");
        if !existing.exists() {
            small_file(&existing);
        }
        let before = std::fs::read(&existing).unwrap();
        let line = fails(&run_in(&["import", s(&existing)], Input::Bytes(&input)), 2);
        assert!(line.contains("line 5000"), "{bad}: {line}");
        assert!(
            std::fs::read(&existing).unwrap() == before,
            "{bad}: changed"
        );
    }
    // The same input without the bad line imports, so the refusal was the bad line's.
    let good = jsonl_with_bad_line("{\"payload_utf8\":\"fixed\"}");
    let target = dir.path().join("good.leaseq");
    ok(run_in(&["import", s(&target)], Input::Bytes(&good)));
    let q = Queue::open(&target).unwrap();
    let total: u64 = ["q0", "q1", "q2"]
        .iter()
        .map(|n| q.existing(n).unwrap().stats().unwrap().total)
        .sum();
    assert_eq!(total + q.stats().unwrap().total, 6000);
}

/// A read command reads an older format from a copy upgraded in memory (said on stderr), the
/// file left as it is; a write command upgrades the file and says so, once.
#[test]
fn an_older_format_is_read_as_it_is_and_upgraded_by_a_write_command() {
    let (_dir, path) = tmp();
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/format4-crashed.leaseq"
        ),
        &path,
    )
    .unwrap();
    let before = std::fs::read(&path).unwrap();
    let o = run(&["stats", s(&path), "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.starts_with("leaseq: note: "), "{err}");
    assert!(err.contains("read from a copy repaired in memory"), "{err}");
    assert!(!json_lines(&o).is_empty());
    assert!(
        std::fs::read(&path).unwrap() == before,
        "a read command wrote"
    );
    let o = run(&["prune", s(&path)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("upgraded from format 4"),
        "{}",
        stderr(&o)
    );
    // Once upgraded, nothing more is said.
    let o = ok(run(&["stats", s(&path)]));
    assert_eq!(stderr(&o), "");
}

/// A read command never returns the leases a closed process left: they are listed as leased,
/// the file unchanged. A write command's open returns them and says so on stderr even
/// without -v, once.
#[test]
fn leases_left_by_a_closed_process_are_read_as_leased_and_returned_by_a_write_command() {
    let (_dir, path) = tmp();
    {
        let q = Queue::open(&path).unwrap();
        q.enqueue(b"held", EnqueueOptions::default()).unwrap();
        let _lease = q.dequeue().unwrap().unwrap(); // left leased when the file closes
    }
    let before = std::fs::read(&path).unwrap();
    let out = run(&["stats", s(&path), "--json"]);
    assert_eq!(code(&out), 0);
    assert_eq!(stderr(&out), "");
    assert_eq!(json_lines(&out)[0]["leased"], 1);
    let listed = json_lines(ok(run(&["ls", s(&path), "--json"])));
    assert_eq!(listed[0]["state"], "leased");
    assert!(
        std::fs::read(&path).unwrap() == before,
        "a read command wrote"
    );
    let out = run(&["prune", s(&path)]);
    assert_eq!(code(&out), 0);
    let err = stderr(&out);
    assert!(err.contains("returned 1 lease(s)"), "{err}");
    // Said once: the next open finds nothing to return.
    let again = run(&["prune", s(&path)]);
    assert!(!stderr(&again).contains("returned"), "{}", stderr(&again));
    assert_eq!(
        json_lines(ok(run(&["stats", s(&path), "--json"])))[0]["ready"],
        1
    );
}

#[test]
fn show_prints_a_jobs_progress_as_text_or_hex() {
    let (_dir, path) = tmp();
    let (text_id, bin_id) = {
        let q = Queue::open(&path).unwrap();
        q.set_history(leaseq::History::off().keep_jobs(10)).unwrap();
        let mut ids = Vec::new();
        for progress in [&b"half"[..], &[0xff, 0x00][..]] {
            let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
            let lease = q.dequeue().unwrap().unwrap();
            assert_eq!(lease.id(), id);
            lease.set_progress(progress).unwrap();
            lease.ack().unwrap();
            ids.push(id.to_string());
        }
        (ids[0].clone(), ids[1].clone())
    };
    let p = s(&path);
    let v = json_lines(ok(run(&["show", p, &text_id, "--json"])));
    assert_eq!(v[0]["progress"], "half");
    assert!(v[0]["progress_ms"].as_u64().is_some(), "{:?}", v[0]);
    let v = json_lines(ok(run(&["show", p, &bin_id, "--json"])));
    assert_eq!(v[0]["progress_hex"], "ff00");
    let human = stdout(ok(run(&["show", p, &text_id])));
    let line = human
        .lines()
        .find(|l| l.starts_with("progress "))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(line.contains("half (at "), "{line}");
    assert_eq!(v[0]["progress_percent"], serde_json::Value::Null);
    // A percentage with a message, as set_progress_percent records it.
    let pct_id = {
        let q = Queue::open(&path).unwrap();
        let id = q.enqueue(b"job", EnqueueOptions::default()).unwrap().id();
        let lease = q.dequeue().unwrap().unwrap();
        lease
            .set_progress_percent(30, Some("uploading 3 of 10"))
            .unwrap();
        lease.ack().unwrap();
        id.to_string()
    };
    let v = json_lines(ok(run(&["show", p, &pct_id, "--json"])));
    assert_eq!(
        (&v[0]["progress_percent"], &v[0]["progress_message"]),
        (&30.into(), &"uploading 3 of 10".into())
    );
    let human = stdout(ok(run(&["show", p, &pct_id])));
    assert!(human.contains("30 % uploading 3 of 10 (at "), "{human}");
}

#[test]
fn stats_shows_each_queues_rate_limit() {
    let (_dir, path) = tmp();
    {
        let q = Queue::open(&path).unwrap();
        q.set_rate_limit(Some(leaseq::RateLimit::new(10, Duration::from_secs(60))))
            .unwrap();
        let free = q.named("free").unwrap();
        free.set_rate_limit(Some(leaseq::RateLimit::sliding(5, Duration::from_secs(1))))
            .unwrap();
        free.set_limit(Some(
            leaseq::QueueLimit::jobs(2)
                .and_bytes(1000)
                .when_full(leaseq::WhenFull::DropOldest),
        ))
        .unwrap();
        for _ in 0..3 {
            free.enqueue(b"reading", Default::default()).unwrap();
        }
        q.set_limit(Some(
            leaseq::QueueLimit::jobs(5).when_full(leaseq::WhenFull::block(Duration::from_secs(5))),
        ))
        .unwrap();
    }
    let p = s(&path);
    let v = json_lines(ok(run(&["stats", p, "--json"])));
    assert_eq!(
        v[0]["rate_limit"],
        serde_json::json!({"max": 10, "per_ms": 60000, "window": "fixed"})
    );
    assert_eq!(v[1]["queue"], "free");
    assert_eq!(
        v[1]["rate_limit"],
        serde_json::json!({"max": 5, "per_ms": 1000, "window": "sliding"})
    );
    // The table marks a sliding window with `~`.
    let table = stdout(ok(run(&["stats", p])));
    assert!(
        table.contains("10/1m") && table.contains("5/~1s"),
        "{table}"
    );
    assert_eq!(
        (&v[1]["limit"], &v[1]["payload_bytes"], &v[1]["dropped"]),
        (
            &serde_json::json!({"max_jobs": 2, "max_bytes": 1000, "when_full": "drop_oldest", "wait_ms": null}),
            &14.into(),
            &1.into()
        )
    );
    assert_eq!(v[0]["limit"]["when_full"], "block");
    assert_eq!(v[0]["limit"]["wait_ms"], 5000);
    let text = stdout(ok(run(&["stats", p])));
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0].last(), Some(&"RATE_LIMIT"));
    assert_eq!(lines[1].last(), Some(&"10/1m"));
    // The table marks a sliding window with `~`.
    assert_eq!(lines[2].last(), Some(&"5/~1s"));
    let n = lines[0].len();
    assert_eq!(&lines[0][n - 3..n - 1], &["LIMIT", "DROPPED"]);
    assert_eq!(&lines[1][n - 3..n - 1], &["5j,block:5s", "0"]);
    assert_eq!(&lines[2][n - 3..n - 1], &["2j,1000B,drop-oldest", "1"]);
}

/// The read commands work beside a running app that opened the file with live reads: they
/// show its jobs in flight as leased, with deadlines, and never take them; `check` reads the
/// commit it sees. Beside an app that holds the file exclusively they say what to do; write
/// commands are refused either way (one writer at a time).
#[test]
fn read_commands_beside_a_running_app() {
    let (_dir, path) = tmp();
    let app = Queue::builder().live_reads(true).open(&path).unwrap();
    app.enqueue(b"a", EnqueueOptions::default()).unwrap();
    app.enqueue(b"b", EnqueueOptions::default()).unwrap();
    let lease = app.dequeue().unwrap().unwrap();
    let stats = json_lines(ok(run(&["stats", s(&path), "--json"])));
    assert_eq!(
        (&stats[0]["ready"], &stats[0]["leased"]),
        (&1.into(), &1.into())
    );
    let shown = json_lines(ok(run(&[
        "show",
        s(&path),
        &lease.id().0.to_string(),
        "--json",
    ])));
    assert_eq!(shown[0]["state"], "leased");
    let o = ok(run(&["show", s(&path), &lease.id().0.to_string()]));
    assert!(
        stdout(o).contains("lease_deadline"),
        "show prints the deadline"
    );
    ok(run(&["check", s(&path)]));
    assert_eq!(json_lines(ok(run(&["export", s(&path)]))).len(), 2);
    // The app's lease is untouched: its ack lands.
    lease.ack().unwrap();
    assert_eq!(
        json_lines(ok(run(&["stats", s(&path), "--json"])))[0]["total"],
        1
    );
    let o = run(&["prune", s(&path)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("live_reads"), "{}", stderr(&o));
    drop(app);
    // An app without live reads.
    let app = Queue::open(&path).unwrap();
    for cmd in ["stats", "ls", "check", "queues", "schedules", "export"] {
        let o = run(&[cmd, s(&path)]);
        assert_eq!(code(&o), 2, "{cmd}");
        let err = stderr(&o);
        for needed in [
            "holds it exclusively",
            "live_reads(true)",
            "stop that process",
            "copy",
        ] {
            assert!(err.contains(needed), "{cmd}: {err}");
        }
    }
    drop(app);
}

/// `leaseq watch` beside a running app: one JSON line per queue and refresh, rates from the
/// second refresh on (enqueues and completions while the app works), each dead letter said
/// once; plain lines when piped; an app holding the file exclusively stops it at once.
#[test]
fn watch_follows_a_running_app() {
    let (_dir, path) = tmp();
    let app = Queue::builder().live_reads(true).open(&path).unwrap();
    app.enqueue(b"doomed", EnqueueOptions::default().max_attempts(1))
        .unwrap();
    app.dequeue()
        .unwrap()
        .unwrap()
        .fail("broken on purpose")
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (app, stop) = (app.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                app.enqueue(b"work", EnqueueOptions::default()).unwrap();
                if let Some(l) = app.dequeue().unwrap() {
                    l.ack().unwrap();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // Metrics reach the file at most once a second: refreshes over 2.4 s see some.
    let o = ok(run(&[
        "watch",
        s(&path),
        "--count",
        "7",
        "--interval",
        "400ms",
        "--json",
    ]));
    let lines = json_lines(&o);
    let views: Vec<&Value> = lines.iter().filter(|l| l.get("ready").is_some()).collect();
    let dead: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("dead_letter").is_some())
        .collect();
    assert_eq!(views.len(), 7, "{lines:?}");
    assert!(views[0]["enqueued_per_s"].is_null());
    assert!(
        views[1..]
            .iter()
            .any(|v| v["enqueued_per_s"].as_f64().unwrap() > 0.0
                && v["completed_per_s"].as_f64().unwrap() > 0.0),
        "no rates while the app worked: {views:?}"
    );
    assert!(views.iter().all(|v| v["dead"] == 1));
    assert_eq!(dead.len(), 1, "a dead letter is said once: {lines:?}");
    assert_eq!(dead[0]["dead_letter"]["last_error"], "broken on purpose");
    let plain = stdout(ok(run(&["watch", s(&path), "-n", "2", "-i", "100ms"])));
    let plain: Vec<&str> = plain.lines().collect();
    assert_eq!(
        plain
            .iter()
            .filter(|l| !l.starts_with("dead ") && l.contains(" queue=(default) "))
            .count(),
        2,
        "{plain:?}"
    );
    assert_eq!(plain.iter().filter(|l| l.starts_with("dead ")).count(), 1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    worker.join().unwrap();
    let o = run(&["watch", s(&path), "-i", "50ms"]);
    assert_eq!(code(&o), 2, "an interval under 100ms");
    drop(app);
    let _exclusive = Queue::open(&path).unwrap();
    let o = run(&["watch", s(&path), "-n", "1"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("live_reads"), "{}", stderr(&o));
}

/// One GET to the dashboard at `addr` with the token as a bearer header: status and body.
fn dashboard_get(addr: &str, token: &str, target: &str) -> (u16, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(RUN_TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

#[test]
fn dashboard_serves_a_file_beside_a_running_app() {
    let (_dir, path) = tmp();
    let app = Queue::builder().live_reads(true).open(&path).unwrap();
    app.enqueue(b"x", EnqueueOptions::default()).unwrap();
    /// Killed when dropped, a failed assertion's unwinding included.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = KillOnDrop(common::spawn_retrying(
        common::target_command(BIN)
            .args([
                "dashboard",
                s(&path),
                "--addr",
                "127.0.0.1:0",
                "--read-only",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    ));
    // The URL is printed once, on the first line.
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(RUN_TIMEOUT)
        .expect("the dashboard printed its URL");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"));
    assert!(line.contains("(read-only)"), "{line}");
    let (addr, token) = url
        .trim_start_matches("http://")
        .split_once("/?token=")
        .unwrap();
    let (status, body) = dashboard_get(addr, token, "/api/overview");
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["live"], true);
    assert_eq!(doc["read_only"], true);
    assert_eq!(doc["queues"][0]["ready"], 1);
    // It follows the app's commits, and a wrong token reads nothing.
    app.enqueue(b"y", EnqueueOptions::default()).unwrap();
    let doc: Value = serde_json::from_str(&dashboard_get(addr, token, "/api/overview").1).unwrap();
    assert_eq!(doc["queues"][0]["ready"], 2);
    assert_eq!(dashboard_get(addr, "wrong-token-0123456789", "/").0, 401);
    drop(child);
    drop(app);

    // What it cannot serve: exit 2 with one line saying why, the files left alone.
    let (dir, foreign) = tmp();
    std::fs::write(&foreign, b"just text, no queue here, long enough to look").unwrap();
    let o = run(&["dashboard", s(&foreign), "--addr", "127.0.0.1:0"]);
    assert!(fails(&o, 2).contains("not a leaseq file"), "{}", stderr(&o));
    let o = run(&["dashboard", s(&path), "--addr", "0.0.0.0:0"]);
    assert!(
        fails(&o, 2).contains("not a loopback address"),
        "{}",
        stderr(&o)
    );
    let missing = dir.path().join("missing.leaseq");
    let o = run(&["dashboard", s(&missing), "--addr", "127.0.0.1:0"]);
    assert!(fails(&o, 2).contains("no such file"), "{}", stderr(&o));
    assert!(!missing.exists());
    let held = Queue::open(&path).unwrap();
    let o = run(&["dashboard", s(&path), "--addr", "127.0.0.1:0"]);
    assert!(
        fails(&o, 2).contains("holds it exclusively"),
        "{}",
        stderr(&o)
    );
    drop(held);
}

// A file its writer left storage full (its file limit met): `stats` says since when under
// its table, and its JSON carries `storage_full_ms`; a file with room says nothing.
#[test]
fn stats_says_when_the_file_is_storage_full() {
    let (_dir, path) = tmp();
    {
        let q = Queue::builder()
            .disk_reserve(256 << 10)
            .file_bytes_max(Some(6 << 20))
            .open(&path)
            .unwrap();
        let payload = vec![b'r'; 1024];
        let mut n = 0;
        loop {
            assert!(n < 50_000, "the file limit was never met");
            match q.enqueue(&payload, EnqueueOptions::default()) {
                Ok(_) => n += 1,
                Err(leaseq::Error::StorageFull { .. }) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
    }
    let p = s(&path);
    let v = json_lines(ok(run(&["stats", p, "--json"])));
    let since = v[0]["storage_full_ms"]
        .as_u64()
        .expect("storage_full_ms set");
    assert!(since > 0);
    let text = stdout(ok(run(&["stats", p])));
    assert!(text.contains("storage full since "), "{text}");
    let (_other, clear) = tmp();
    small_file(&clear);
    let v = json_lines(ok(run(&["stats", s(&clear), "--json"])));
    assert!(v[0]["storage_full_ms"].is_null(), "{:?}", v[0]);
    assert!(!stdout(ok(run(&["stats", s(&clear)]))).contains("storage full"));
}
