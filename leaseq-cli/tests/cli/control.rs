//! The write commands beside a running app: with the app's control channel open they go
//! through the app (which holds the file throughout: nothing else could have written it),
//! with the same outputs and exit codes as on a closed file; without one they say what
//! works. The app here is this test process; the tool is the built binary, run as a user
//! would (under wine too, `.ci/foreign windows`).

use std::time::Duration;

use serde_json::json;

use leaseq::{EnqueueOptions, Error, History, JobId, JobState, Queue, Schedule};

use super::{code, fails, json_lines, ok, run, s, stderr, stdout, tmp};

fn state(queue: &Queue, id: JobId) -> Option<JobState> {
    queue.job(id).unwrap().map(|j| j.state)
}

#[test]
fn write_commands_act_on_a_running_app_through_its_control_channel() {
    let (_dir, path) = tmp();
    let app = Queue::open(&path).unwrap();
    let mail = app.named("mail").unwrap();
    mail.set_history(History::off().keep_jobs(100)).unwrap();
    let channel = leaseq::control::serve(&app).unwrap();
    let p = s(&path);

    // enqueue: the id it prints is the app's job.
    let out = stdout(ok(run(&[
        "enqueue", p, "--queue", "mail", "--data", "hello",
    ])));
    let id = JobId(out.trim().parse().unwrap());
    assert_eq!(mail.payload(id).unwrap().as_deref(), Some(&b"hello"[..]));
    let dup = json_lines(ok(run(&[
        "enqueue",
        p,
        "--queue",
        "mail",
        "--dedup-key",
        "k",
        "--delay",
        "1m",
        "--json",
        "--data",
        "a",
    ])));
    let keyed = JobId(dup[0]["id"].as_u64().unwrap());
    assert_eq!(dup[0]["outcome"], "new");
    assert_eq!(state(&mail, keyed), Some(JobState::Scheduled));
    let again = json_lines(ok(run(&[
        "enqueue",
        p,
        "--queue",
        "mail",
        "--dedup-key",
        "k",
        "--json",
        "--data",
        "b",
    ])));
    assert_eq!(
        (&again[0]["outcome"], &again[0]["id"]),
        (&"duplicate".into(), &keyed.0.into())
    );
    // An option the library refuses is refused before anything is sent.
    fails(&run(&["enqueue", p, "--lease", "0s", "--data", "x"]), 2);

    // promote, cancel, retry.
    assert_eq!(
        stdout(ok(run(&["promote", p, &keyed.0.to_string()]))),
        format!("promoted {keyed}\n")
    );
    assert_eq!(state(&mail, keyed), Some(JobState::Ready));
    let out = stdout(ok(run(&["cancel", p, &id.0.to_string(), "--reason", "r"])));
    assert_eq!(out, format!("cancelled {id} (was ready)\n"));
    assert_eq!(state(&mail, id), Some(JobState::Cancelled));
    assert_eq!(
        stdout(ok(run(&["retry", p, &id.0.to_string()]))),
        format!("retried {id}\n")
    );
    assert_eq!(state(&mail, id), Some(JobState::Ready));
    // The app's refusals, with the tool's exit codes and words.
    let line = fails(&run(&["retry", p, &id.0.to_string()]), 1);
    assert!(line.contains(&format!("job {id} is ready")), "{line}");
    let line = fails(&run(&["cancel", p, "987654"]), 1);
    assert!(line.contains("no job 987654"), "{line}");
    let line = fails(&run(&["pause", p, "--queue", "nope"]), 1);
    assert!(line.contains("no queue named \"nope\""), "{line}");

    // pause and resume, every queue.
    assert_eq!(
        stdout(ok(run(&["pause", p]))),
        "(default): paused\nmail: paused\n"
    );
    assert!(app.is_paused() && mail.is_paused());
    assert_eq!(
        stdout(ok(run(&["pause", p, "--queue", "mail"]))),
        "mail: already paused\n"
    );
    assert_eq!(
        stdout(ok(run(&["resume", p]))),
        "(default): resumed\nmail: resumed\n"
    );
    assert!(!app.is_paused());

    // requeue-dead, one and all; purge.
    let dead = |q: &Queue| {
        let id = q
            .enqueue(b"d", EnqueueOptions::default().max_attempts(1))
            .unwrap()
            .id();
        loop {
            let lease = q.dequeue().unwrap().unwrap();
            if lease.id() == id {
                lease.fail("boom").unwrap();
                return id;
            }
            lease.nack("later").unwrap();
        }
    };
    let d1 = dead(&app);
    let d2 = dead(&app);
    let line = fails(&run(&["requeue-dead", p, &id.0.to_string()]), 1);
    assert!(line.contains("not dead"), "{line}");
    assert_eq!(
        stdout(ok(run(&["requeue-dead", p, &d1.0.to_string()]))),
        format!("requeued {d1}\n")
    );
    assert_eq!(state(&app, d1), Some(JobState::Ready));
    assert_eq!(
        stdout(ok(run(&["requeue-dead", p, "--all"]))),
        "(default): requeued 1 dead jobs\nmail: requeued 0 dead jobs\n"
    );
    assert_eq!(state(&app, d2), Some(JobState::Ready));
    assert_eq!(
        stdout(ok(run(&[
            "purge",
            p,
            "--state",
            "ready",
            "--queue",
            "(default)"
        ]))),
        "(default): purged 2 ready jobs\n"
    );
    assert_eq!(app.stats().unwrap().ready, 0);

    // schedule-remove, then the app's "not found" as exit 1.
    mail.create_schedule("sync", &Schedule::every(Duration::from_secs(60)))
        .unwrap();
    assert_eq!(
        stdout(ok(run(&["schedule-remove", p, "sync", "--queue", "mail"]))),
        "mail: removed schedule \"sync\"\n"
    );
    assert!(mail.schedules().unwrap().is_empty());
    let line = fails(&run(&["schedule-remove", p, "sync", "--queue", "mail"]), 1);
    assert!(
        line.contains("no schedule named \"sync\" in queue mail"),
        "{line}"
    );
    // Pause, trigger and resume a schedule of the running app.
    mail.create_schedule("digest", &Schedule::every(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(
        stdout(ok(run(&["schedule-pause", p, "digest", "--queue", "mail"]))),
        "mail: paused schedule \"digest\"\n"
    );
    assert!(
        mail.schedule("digest")
            .unwrap()
            .unwrap()
            .paused_ms
            .is_some()
    );
    let said = stdout(ok(run(&[
        "schedule-trigger",
        p,
        "digest",
        "--queue",
        "mail",
    ])));
    let job = mail
        .schedule("digest")
        .unwrap()
        .unwrap()
        .last_job
        .expect("an instance")
        .0;
    assert_eq!(
        said,
        format!("mail: schedule \"digest\" enqueued job {job}\n")
    );
    assert_eq!(
        stdout(ok(run(&[
            "schedule-resume",
            p,
            "digest",
            "--queue",
            "mail"
        ]))),
        "mail: resumed schedule \"digest\"\n"
    );
    assert!(
        mail.schedule("digest")
            .unwrap()
            .unwrap()
            .next_due_ms
            .is_some()
    );
    assert!(mail.remove_schedule("digest").unwrap());
    assert!(mail.cancel(job, "test").is_ok());

    // prune with the app's own retentions; the tool's are refused, saying what works.
    let out = stdout(ok(run(&["prune", p])));
    assert!(
        out.starts_with("(default): removed 0 applied markers"),
        "{out}"
    );
    let line = fails(&run(&["prune", p, "--applied-retention", "7d"]), 2);
    assert!(line.contains("without --applied-retention"), "{line}");
    // compact needs the file to itself: refused, saying so.
    let line = fails(&run(&["compact", p]), 2);
    assert!(line.contains("in use"), "{line}");
    assert!(line.contains("compact needs the file to itself"), "{line}");
    let line = fails(&run(&["import", p]), 2);
    assert!(line.contains("import needs the file to itself"), "{line}");

    // The file was the app's alone all along.
    assert!(matches!(Queue::open(&path), Err(Error::AlreadyOpen { .. })));
    assert!(!stderr(&run(&["pause", p])).contains("note"));

    // Without the channel: refused, naming the way that works; nothing written.
    drop(channel);
    let o = run(&["resume", p]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("leaseq::control::serve"),
        "{}",
        stderr(&o)
    );
    assert!(app.is_paused());
    drop(mail);
    drop(app);
}

/// An app killed with its channel open leaves its control file behind: the tool says no app
/// answers there and works on the file itself.
#[test]
fn a_control_file_left_by_a_killed_app_is_passed_by() {
    let (_dir, path) = tmp();
    let app = Queue::open(&path).unwrap();
    let channel = leaseq::control::serve(&app).unwrap();
    let control_file = leaseq::control::control_file_path(&path);
    let text = std::fs::read(&control_file).unwrap();
    drop(channel);
    drop(app);
    std::fs::write(&control_file, text).unwrap();
    let o = run(&["pause", s(&path)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(o.clone()), "(default): paused\n");
    assert!(stderr(&o).contains("no app answers"), "{}", stderr(&o));
    assert!(Queue::open(&path).unwrap().is_paused());
}

/// The tool's `--json` and the API's answers are the same shapes, value for value: `stats`,
/// `ls`, `show` beside an app with live reads, against its channel's reads.
#[test]
fn the_tools_json_and_the_apis_answers_are_the_same_shapes() {
    let (_dir, path) = tmp();
    let app = Queue::builder().live_reads(true).open(&path).unwrap();
    let mail = app.named("mail").unwrap();
    let a = mail
        .enqueue(
            b"{\"to\":\"x\"}",
            EnqueueOptions::default()
                .idempotency_key("k1")
                .group([0xff, 0x00])
                .max_attempts(1),
        )
        .unwrap()
        .id();
    mail.enqueue(
        &[0u8, 1, 2],
        EnqueueOptions::default().delay(Duration::from_secs(60)),
    )
    .unwrap();
    let lease = mail.dequeue().unwrap().unwrap();
    assert_eq!(lease.id(), a);
    lease.fail("line one\nline two").unwrap();
    let channel = leaseq::control::serve(&app).unwrap();
    let client = leaseq::control::Client::for_file(&path).unwrap().unwrap();
    let p = s(&path);

    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    let api = client.get("stats").unwrap();
    assert_eq!(serde_json::Value::Array(stats), api["queues"]);

    for state in ["dead", "scheduled"] {
        let listed = json_lines(ok(run(&[
            "ls", p, "--state", state, "--queue", "mail", "--json",
        ])));
        let page = client
            .get(&format!("jobs?state={state}&queue=mail"))
            .unwrap();
        assert_eq!(serde_json::Value::Array(listed), page["jobs"], "{state}");
    }
    let shown = json_lines(ok(run(&["show", p, &a.0.to_string(), "--json"])));
    let job = client.get(&format!("jobs/{a}?payload=1")).unwrap();
    assert_eq!(shown[0], job);
    assert_eq!(job["group_hex"], "ff00");
    drop(channel);
}

/// Beside an app without live reads (the default: the journal on), `stats`, `ls`, `show`,
/// `queues`, `schedules` and `check` read through the app's control channel, and say
/// exactly what they say of the same file once the app has closed it.
#[test]
fn read_commands_read_through_the_channel_of_an_app_without_live_reads() {
    let (_dir, path) = tmp();
    let app = Queue::open(&path).unwrap();
    let mail = app.named("mail").unwrap();
    for i in 0..5u8 {
        mail.enqueue(
            &[b'a' + i],
            EnqueueOptions::default().dedup_key(format!("k{i}")),
        )
        .unwrap();
    }
    app.enqueue(&[0xff, 0x00], EnqueueOptions::default().priority(-2))
        .unwrap();
    let lease = mail.dequeue().unwrap().unwrap();
    lease.set_progress_percent(40, Some("halfway")).unwrap();
    lease.fail("line one\nline two").unwrap();
    let id = lease.id().0.to_string();
    let binary = app.jobs(JobState::Ready, None, 10).unwrap().jobs[0]
        .id
        .0
        .to_string();
    mail.create_schedule(
        "digest",
        &Schedule::cron("0 3 * * *", "Europe/Berlin").payload(b"d".to_vec()),
    )
    .unwrap();
    app.create_schedule("tick", &Schedule::every(Duration::from_secs(60)))
        .unwrap();
    app.pause_schedule("tick").unwrap();
    let channel = leaseq::control::serve(&app).unwrap();
    let p = s(&path);
    let commands: Vec<Vec<&str>> = vec![
        vec!["stats", p],
        vec!["stats", p, "--json"],
        vec!["stats", p, "--queue", "mail"],
        vec!["ls", p],
        vec!["ls", p, "--json"],
        vec!["ls", p, "--state", "dead", "--queue", "mail", "--json"],
        vec!["ls", p, "--limit", "3"],
        vec!["show", p, &id],
        vec!["show", p, &id, "--json"],
        vec!["show", p, &binary],
        vec!["show", p, &binary, "--raw"],
        vec!["queues", p],
        vec!["queues", p, "--json"],
        vec!["schedules", p],
        vec!["schedules", p, "--json"],
        vec!["schedules", p, "--queue", "mail"],
        vec!["check", p],
        vec!["check", p, "--json"],
    ];
    let beside: Vec<std::process::Output> = commands.iter().map(|c| ok(run(c))).collect();
    // Missing things are the same refusals as on the file.
    let line = fails(&run(&["show", p, "999999"]), 1);
    assert!(line.contains("no job 999999"), "{line}");
    let line = fails(&run(&["ls", p, "--queue", "nope"]), 1);
    assert!(line.contains("no queue named \"nope\""), "{line}");
    // Commands the channel does not serve say what works.
    let o = run(&["export", p]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("stats, ls, show, queues, schedules, check and watch"),
        "{}",
        stderr(&o)
    );
    drop(channel);
    drop(mail);
    drop(app);
    for (cmd, before) in commands.iter().zip(&beside) {
        let after = ok(run(cmd));
        let json = cmd.contains(&"--json");
        if json {
            assert_eq!(json_lines(before.clone()), json_lines(after), "{cmd:?}");
        } else {
            assert_eq!(before.stdout, after.stdout, "{cmd:?}");
        }
    }
    // The progress and the error read as on the file.
    let shown = stdout(beside[7].clone());
    assert!(shown.contains("40 % halfway"), "{shown}");
    assert!(shown.contains("line one\\nline two"), "{shown}");
    assert_eq!(beside[10].stdout, vec![0xff, 0x00]);
}

/// A control file that is not one (or one this user may not read), with no app running,
/// does not stand in the way: the write command opens the file itself.
#[test]
fn a_broken_control_file_without_an_app_is_passed_by() {
    let (_dir, path) = tmp();
    drop(Queue::open(&path).unwrap());
    let control_file = leaseq::control::control_file_path(&path);
    std::fs::write(&control_file, b"not json").unwrap();
    let o = run(&["pause", s(&path)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(Queue::open(&path).unwrap().is_paused());
    // With an app holding the file, the same broken file is the error said.
    let app = Queue::open(&path).unwrap();
    let line = fails(&run(&["resume", s(&path)]), 2);
    assert!(line.contains("not a leaseq control file"), "{line}");
    assert!(app.is_paused());
}

/// `watch` beside an app without live reads reads through its channel: each queue's counts,
/// longest wait and dead letters as the app has them, refresh after refresh.
#[test]
fn watch_reads_through_the_channel_of_an_app_without_live_reads() {
    let (_dir, path) = tmp();
    let app = Queue::open(&path).unwrap();
    let mail = app.named("mail").unwrap();
    for i in 0..3u8 {
        mail.enqueue(&[i], EnqueueOptions::default()).unwrap();
    }
    let doomed = app
        .enqueue(b"doomed", EnqueueOptions::default().max_attempts(1))
        .unwrap()
        .id();
    let lease = app.dequeue().unwrap().unwrap();
    assert_eq!(lease.id(), doomed);
    lease.fail("gone for good").unwrap();
    let channel = leaseq::control::serve(&app).unwrap();
    let p = s(&path);
    let lines = json_lines(ok(run(&[
        "watch",
        p,
        "--json",
        "--count",
        "2",
        "--interval",
        "100ms",
    ])));
    let views: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l.get("queue").is_some()).collect();
    // Two refreshes of two queues.
    assert_eq!(views.len(), 4, "{lines:?}");
    let of = |q: Option<&str>| {
        views
            .iter()
            .rev()
            .find(|v| v["queue"].as_str() == q)
            .copied()
            .unwrap_or_else(|| panic!("{q:?} in {lines:?}"))
    };
    assert_eq!(
        (&of(None)["dead"], &of(None)["ready"]),
        (&json!(1), &json!(0))
    );
    let m = of(Some("mail"));
    assert_eq!((&m["ready"], &m["live"]), (&json!(3), &json!(true)));
    assert!(m["oldest_ready_ms"].as_u64().is_some(), "{m}");
    assert!(
        m["enqueued_per_s"].as_f64().is_some(),
        "the second refresh has rates: {m}"
    );
    let dead: Vec<&serde_json::Value> = lines.iter().filter_map(|l| l.get("dead_letter")).collect();
    assert_eq!(dead.len(), 1, "said once: {lines:?}");
    assert_eq!(
        (&dead[0]["id"], &dead[0]["last_error"]),
        (&json!(doomed.0), &json!("gone for good"))
    );
    drop(channel);
}

/// `leaseq limit` on a closed file and beside a running app (through its channel): sets,
/// says when nothing changed, removes; the app's enqueues meet the limit at once; bad
/// settings exit 2 before anything is sent, a missing queue exits 1; nothing is written by
/// a refusal.
#[test]
fn limit_sets_and_removes_a_queues_size_limit_on_a_file_and_a_running_app() {
    let (_dir, path) = tmp();
    let p = s(&path);
    {
        let q = Queue::open(&path).unwrap();
        q.named("telemetry").unwrap();
    }
    assert_eq!(
        stdout(ok(run(&[
            "limit",
            p,
            "--queue",
            "telemetry",
            "--max-jobs",
            "2",
            "--when-full",
            "drop-oldest",
        ]))),
        "telemetry: limit set: 2j,drop-oldest\n"
    );
    let app = Queue::open(&path).unwrap();
    let telemetry = app.existing("telemetry").unwrap();
    assert_eq!(
        telemetry.limit().unwrap(),
        Some(leaseq::QueueLimit::jobs(2).when_full(leaseq::WhenFull::DropOldest))
    );
    let channel = leaseq::control::serve(&app).unwrap();
    assert_eq!(
        stdout(ok(run(&[
            "limit",
            p,
            "--queue",
            "telemetry",
            "--max-jobs",
            "2",
            "--when-full",
            "drop-oldest",
        ]))),
        "telemetry: the limit was already 2j,drop-oldest\n"
    );
    assert_eq!(
        stdout(ok(run(&[
            "limit",
            p,
            "--max-jobs",
            "1",
            "--max-bytes",
            "100",
            "--when-full",
            "block",
            "--wait",
            "250ms",
        ]))),
        "(default): limit set: 1j,100B,block:250ms\n"
    );
    // The running app meets it at once.
    app.enqueue(b"one", EnqueueOptions::default()).unwrap();
    assert!(matches!(
        app.enqueue(b"two", EnqueueOptions::default()),
        Err(Error::QueueFull { .. })
    ));
    let before = app.stats().unwrap();
    for bad in [
        &["limit", p][..],
        &["limit", p, "--max-jobs", "1", "--when-full", "block"],
        &["limit", p, "--max-jobs", "1", "--wait", "1s"],
        &["limit", p, "--max-jobs", "0"],
        &["limit", p, "--remove", "--max-jobs", "3"],
    ] {
        fails(&run(bad), 2);
    }
    fails(&run(&["limit", p, "--queue", "nope", "--max-jobs", "3"]), 1);
    assert_eq!(app.stats().unwrap(), before, "a refusal writes nothing");
    assert_eq!(
        stdout(ok(run(&["limit", p, "--remove"]))),
        "(default): limit removed\n"
    );
    assert_eq!(
        stdout(ok(run(&["limit", p, "--remove"]))),
        "(default): had no limit\n"
    );
    app.enqueue(b"two", EnqueueOptions::default()).unwrap();
    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    assert!(stats[0]["limit"].is_null());
    assert_eq!(stats[1]["limit"]["when_full"], "drop_oldest");
    drop(channel);
}
