//! `leaseq schedules` and `leaseq schedule-remove`: schedules made through the library (a
//! manual clock where one must fire), listed by the tool per queue, in tables and JSON lines,
//! with the values `Queue::schedules` reports; an empty listing; a missing queue (exit 1).

use std::path::Path;
use std::time::Duration;

use leaseq::{EnqueueOptions, ManualClock, Missed, Overlap, Queue, Schedule, ScheduleInfo, Timing};
use serde_json::{Value, json};

use super::{code, every_queue, fails, json_lines, ok, run, s, small_file, stdout, tmp};

const MIN_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;
/// Asia/Kolkata is UTC+5:30 all year (no daylight saving time).
const KOLKATA_OFFSET_MS: u64 = 5 * HOUR_MS + 30 * MIN_MS;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Unix ms as the tool writes times: RFC 3339 UTC with milliseconds.
fn utc(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// What the file at `path` was made with, for the assertions.
struct Made {
    /// The Kolkata hour of the `digest` cron (about 12 hours from now).
    digest_hour: u64,
    /// When `digest` is next due, computed here (the next 30 minutes past `digest_hour` in
    /// Kolkata after `made_ms`).
    digest_due_ms: u64,
    /// The first due time of `bounce-check`, 30 days ahead.
    bounce_start_ms: u64,
}

/// A file with three schedules, none due for hours: in the default queue `sync` (every 15m,
/// fired once through a manual clock, its instance acked); in `mail` `digest` (a cron in
/// Asia/Kolkata, at 30 minutes past an hour about 12 hours away) and `bounce-check` (every 2h
/// from 30 days ahead). A job in `mail` too.
fn schedule_file(path: &Path) -> Made {
    let made_ms = now_ms();
    let clock = ManualClock::new(made_ms);
    let q = Queue::builder().clock(clock.clone()).open(path).unwrap();
    q.create_schedule(
        "sync",
        &Schedule::every(Duration::from_secs(15 * 60))
            .starting_at_ms(made_ms + 1000)
            .payload(b"sync".to_vec())
            .options(EnqueueOptions::default().priority(-1)),
    )
    .unwrap();
    clock.advance(Duration::from_secs(1));
    let lease = q.dequeue().unwrap().expect("the first instance of sync");
    assert_eq!(lease.payload(), b"sync");
    lease.ack().unwrap();

    let local_ms = made_ms + KOLKATA_OFFSET_MS;
    let digest_hour = (local_ms % DAY_MS / HOUR_MS + 12) % 24;
    let mut due_local = local_ms - local_ms % DAY_MS + digest_hour * HOUR_MS + 30 * MIN_MS;
    if due_local <= local_ms {
        due_local += DAY_MS;
    }
    let mail = q.named("mail").unwrap();
    mail.create_schedule(
        "digest",
        &Schedule::cron(format!("30 {digest_hour} * * *"), "Asia/Kolkata")
            .payload(b"digest".to_vec())
            .overlap(Overlap::Enqueue)
            .missed(Missed::Skip),
    )
    .unwrap();
    let bounce_start_ms = made_ms + 30 * DAY_MS;
    mail.create_schedule(
        "bounce-check",
        &Schedule::every(Duration::from_secs(2 * 3600)).starting_at_ms(bounce_start_ms),
    )
    .unwrap();
    mail.enqueue(b"hello", EnqueueOptions::default()).unwrap();
    Made {
        digest_hour,
        digest_due_ms: due_local - KOLKATA_OFFSET_MS,
        bounce_start_ms,
    }
}

/// The schedules of every queue of the file, as the library reads them: (queue, schedule)
/// in the tool's order (the default queue, then the named ones by name; each queue's by name).
fn library_view(path: &Path) -> Vec<(Option<String>, ScheduleInfo)> {
    let mut out = Vec::new();
    for queue in every_queue(path) {
        for info in queue.schedules().unwrap() {
            out.push((queue.name().map(str::to_string), info));
        }
    }
    out
}

/// A table's lines split into cells (columns are at least two spaces apart; no cell here
/// holds two spaces in a row).
fn cells(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

const HEADER: [&str; 10] = [
    "QUEUE", "NAME", "TIMING", "NEXT_DUE", "LAST_JOB", "LAST_DUE", "FIRED", "SKIPPED", "OVERLAP",
    "MISSED",
];

/// The table row the tool should print for `info` of `queue`.
fn row(queue: Option<&str>, info: &ScheduleInfo) -> Vec<String> {
    let timing = match &info.timing {
        Timing::Interval { every_ms, .. } if every_ms % HOUR_MS == 0 => {
            format!("every {}h", every_ms / HOUR_MS)
        }
        Timing::Interval { every_ms, .. } => format!("every {}m", every_ms / MIN_MS),
        Timing::Cron {
            expression,
            time_zone,
        } => format!("cron {expression} ({time_zone})"),
    };
    vec![
        queue.unwrap_or("(default)").to_string(),
        info.name.clone(),
        timing,
        info.next_due_ms.map_or("none".to_string(), utc),
        info.last_job
            .map_or("-".to_string(), |(id, _)| id.0.to_string()),
        info.last_job.map_or("-".to_string(), |(_, due)| utc(due)),
        info.fired.to_string(),
        info.skipped.to_string(),
        match info.overlap {
            Overlap::Skip => "skip",
            Overlap::Enqueue => "enqueue",
        }
        .to_string(),
        match info.missed {
            Missed::RunOnce => "run_once",
            Missed::Skip => "skip",
        }
        .to_string(),
    ]
}

/// The JSON line the tool should print for `info` of `queue`.
fn line(queue: Option<&str>, info: &ScheduleInfo) -> Value {
    let timing = match &info.timing {
        Timing::Interval { every_ms, start_ms } => {
            json!({"kind": "interval", "every_ms": every_ms, "start_ms": start_ms})
        }
        Timing::Cron {
            expression,
            time_zone,
        } => json!({"kind": "cron", "expression": expression, "time_zone": time_zone}),
    };
    json!({
        "queue": queue,
        "name": info.name,
        "timing": timing,
        "next_due_ms": info.next_due_ms,
        "last_job_id": info.last_job.map(|(id, _)| id.0),
        "last_due_ms": info.last_job.map(|(_, due)| due),
        "fired": info.fired,
        "skipped": info.skipped,
        "overlap": match info.overlap { Overlap::Skip => "skip", Overlap::Enqueue => "enqueue" },
        "missed": match info.missed { Missed::RunOnce => "run_once", Missed::Skip => "skip" },
        "priority": info.priority,
        "payload_bytes": info.payload_bytes,
        "created_ms": info.created_ms,
        "updated_ms": info.updated_ms,
        "paused_ms": info.paused_ms,
    })
}

#[test]
fn schedules_of_every_queue_with_their_next_due_times() {
    let (_dir, path) = tmp();
    let made = schedule_file(&path);
    let before = library_view(&path);
    let p = s(&path);

    let table = stdout(ok(run(&["schedules", p])));
    let json = json_lines(ok(run(&["schedules", p, "--json"])));
    // Listing changed nothing.
    let after = library_view(&path);
    assert_eq!(before, after);

    // The library's values, checked against what the file was made with.
    let names: Vec<(Option<&str>, &str)> = after
        .iter()
        .map(|(q, i)| (q.as_deref(), i.name.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![
            (None, "sync"),
            (Some("mail"), "bounce-check"),
            (Some("mail"), "digest")
        ]
    );
    let (sync, bounce, digest) = (&after[0].1, &after[1].1, &after[2].1);
    let (sync_job, sync_due) = sync.last_job.expect("sync fired once");
    assert_eq!(sync.next_due_ms, Some(sync_due + 15 * MIN_MS));
    assert_eq!((sync.fired, sync.skipped, sync.priority), (1, 0, -1));
    assert_eq!(bounce.next_due_ms, Some(made.bounce_start_ms));
    assert_eq!(bounce.last_job, None);
    assert_eq!(digest.next_due_ms, Some(made.digest_due_ms));
    assert_eq!(
        digest.timing,
        Timing::Cron {
            expression: format!("30 {} * * *", made.digest_hour),
            time_zone: "Asia/Kolkata".into()
        }
    );

    // The table: a header, then one row per schedule with those values.
    let rows = cells(&table);
    assert_eq!(rows.len(), 4, "{table}");
    assert_eq!(rows[0], HEADER, "{table}");
    for (r, (q, info)) in rows[1..].iter().zip(&after) {
        assert_eq!(*r, row(q.as_deref(), info), "{table}");
    }
    // The values spelled out once, not only through `row`.
    assert_eq!(
        rows[1],
        [
            "(default)",
            "sync",
            "every 15m",
            utc(sync_due + 15 * MIN_MS).as_str(),
            sync_job.0.to_string().as_str(),
            utc(sync_due).as_str(),
            "1",
            "0",
            "skip",
            "run_once",
        ]
    );
    assert_eq!(rows[2][3], utc(made.bounce_start_ms));
    assert_eq!(rows[2][4..6], ["-", "-"]);
    assert_eq!(
        rows[3][2],
        format!("cron 30 {} * * * (Asia/Kolkata)", made.digest_hour)
    );
    assert_eq!(rows[3][3], utc(made.digest_due_ms));
    assert_eq!(rows[3][8..], ["enqueue", "skip"]);

    // JSON lines: one per schedule, every field.
    assert_eq!(json.len(), 3);
    for (v, (q, info)) in json.iter().zip(&after) {
        assert_eq!(*v, line(q.as_deref(), info));
    }
    assert_eq!(json[0]["queue"], Value::Null);
    assert_eq!(json[0]["next_due_ms"], sync_due + 15 * MIN_MS);
    assert_eq!(json[0]["last_job_id"], sync_job.0);
    assert_eq!(json[0]["last_due_ms"], sync_due);
    assert_eq!(json[0]["timing"]["every_ms"], 15 * MIN_MS);
    assert_eq!(json[0]["payload_bytes"], 4);
    assert_eq!(json[1]["last_job_id"], Value::Null);
    assert_eq!(json[2]["timing"]["kind"], "cron");
    assert_eq!(json[2]["next_due_ms"], made.digest_due_ms);
    assert_eq!(json[2]["overlap"], "enqueue");
    assert_eq!(json[2]["missed"], "skip");
}

#[test]
fn schedules_of_one_queue_and_a_missing_queue_exit_1() {
    let (_dir, path) = tmp();
    schedule_file(&path);
    let all = library_view(&path);
    let p = s(&path);

    let mail = cells(&stdout(ok(run(&["schedules", p, "--queue", "mail"]))));
    assert_eq!(mail.len(), 3, "{mail:?}");
    assert_eq!(mail[0], HEADER);
    assert_eq!(mail[1], row(Some("mail"), &all[1].1));
    assert_eq!(mail[2], row(Some("mail"), &all[2].1));
    let mail = json_lines(ok(run(&["schedules", p, "-q", "mail", "--json"])));
    assert_eq!(
        mail,
        vec![line(Some("mail"), &all[1].1), line(Some("mail"), &all[2].1)]
    );

    let default = cells(&stdout(ok(run(&["schedules", p, "--queue", "(default)"]))));
    assert_eq!(
        default,
        vec![HEADER.map(String::from).to_vec(), row(None, &all[0].1)]
    );
    let default = json_lines(ok(run(&["schedules", p, "--queue", "(default)", "--json"])));
    assert_eq!(default, vec![line(None, &all[0].1)]);

    for args in [
        vec!["schedules", p, "--queue", "nope"],
        vec!["schedules", p, "--queue", "nope", "--json"],
    ] {
        let o = run(&args);
        let err = fails(&o, 1);
        assert!(err.contains("no queue named \"nope\""), "{err}");
        assert!(o.stdout.is_empty(), "{}", stdout(&o));
    }
    // Asking made no queue.
    assert_eq!(
        Queue::open(&path).unwrap().queue_names().unwrap(),
        vec!["mail".to_string()]
    );
}

#[test]
fn no_schedules() {
    let (_dir, path) = tmp();
    drop(Queue::open(&path).unwrap());
    let p = s(&path);
    assert_eq!(stdout(ok(run(&["schedules", p]))), "no schedules\n");
    assert!(ok(run(&["schedules", p, "--json"])).stdout.is_empty());
    // Queues and jobs, but no schedules.
    small_file(&path);
    assert_eq!(stdout(ok(run(&["schedules", p]))), "no schedules\n");
    assert!(ok(run(&["schedules", p, "--json"])).stdout.is_empty());
    // A queue without schedules in a file with some.
    Queue::open(&path)
        .unwrap()
        .create_schedule("tick", &Schedule::every(Duration::from_secs(3600)))
        .unwrap();
    assert_eq!(
        stdout(ok(run(&["schedules", p, "--queue", "mail"]))),
        "no schedules\n"
    );
    assert_eq!(json_lines(ok(run(&["schedules", p, "--json"]))).len(), 1);
}

/// Read commands never write: due times that passed while the file was closed are listed
/// as due, nothing fired. The next writable open (a write command's) fires them, as every
/// open does under `Missed::RunOnce`, says so, and the listing shows the instance.
#[test]
fn read_commands_leave_missed_due_times_to_the_next_writable_open() {
    let (_dir, path) = tmp();
    let day_ago_ms = now_ms() - DAY_MS;
    {
        let q = Queue::builder()
            .clock(ManualClock::new(day_ago_ms))
            .open(&path)
            .unwrap();
        q.create_schedule(
            "hourly",
            &Schedule::every(Duration::from_secs(3600)).payload(b"h".to_vec()),
        )
        .unwrap();
    }
    let p = s(&path);
    let before = std::fs::read(&path).unwrap();
    let out = run(&["schedules", p, "--json"]);
    assert_eq!(code(&out), 0);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let listed = json_lines(out);
    assert_eq!(
        (
            &listed[0]["fired"],
            &listed[0]["last_job_id"],
            &listed[0]["next_due_ms"]
        ),
        (
            &serde_json::json!(0),
            &serde_json::Value::Null,
            &serde_json::json!(day_ago_ms + HOUR_MS)
        )
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "a read command wrote"
    );
    let out = run(&["prune", p]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    // The open says what it enqueued (on stderr, without -v).
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        format!(
            "leaseq: note: opening {p} enqueued a job for each of 1 schedule(s) due while the file was closed"
        )
    );
    let json = json_lines(ok(run(&["schedules", p, "--json"])));
    let view = library_view(&path);
    assert_eq!(json, vec![line(None, &view[0].1)]);
    let info = &view[0].1;
    assert_eq!(info.fired, 1, "{info:?}");
    let (job, due) = info.last_job.expect("the open's instance");
    // The newest due time passed: 24 hours after creation at the latest.
    assert!(
        due > day_ago_ms && due <= day_ago_ms + 24 * HOUR_MS,
        "{info:?}"
    );
    assert_eq!((due - day_ago_ms) % HOUR_MS, 0, "on the grid: {info:?}");
    assert!(info.next_due_ms.unwrap() > due, "{info:?}");
    // That instance is a ready job of the file.
    let jobs = json_lines(ok(run(&["ls", p, "--json"])));
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["id"], job.0);
    assert_eq!(jobs[0]["state"], "ready");
}

#[test]
fn schedule_remove_and_the_count_in_stats() {
    let (_dir, path) = tmp();
    schedule_file(&path);
    let p = s(&path);
    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    assert_eq!(stats[0]["schedules"], 1);
    assert_eq!(stats[1]["queue"], "mail");
    assert_eq!(stats[1]["schedules"], 2);
    let table = cells(&stdout(ok(run(&["stats", p]))));
    // The schedule count, found by its header.
    let at = table[0]
        .iter()
        .position(|h| h == "SCHEDULES")
        .expect("a SCHEDULES column");
    let count = |row: &Vec<String>| row[at].clone();
    assert_eq!(count(&table[1]), "1");
    assert_eq!(count(&table[2]), "2");

    // Without --queue: the default queue's.
    assert_eq!(
        stdout(ok(run(&["schedule-remove", p, "sync"]))),
        "(default): removed schedule \"sync\"\n"
    );
    let o = run(&["schedule-remove", p, "sync"]);
    let err = fails(&o, 1);
    assert!(
        err.contains("no schedule named \"sync\" in queue (default)"),
        "{err}"
    );
    // The default queue has no `digest`; mail has.
    fails(&run(&["schedule-remove", p, "digest"]), 1);
    assert_eq!(
        stdout(ok(run(&[
            "schedule-remove",
            p,
            "digest",
            "--queue",
            "mail"
        ]))),
        "mail: removed schedule \"digest\"\n"
    );
    let err = fails(
        &run(&["schedule-remove", p, "digest", "--queue", "nope"]),
        1,
    );
    assert!(err.contains("no queue named \"nope\""), "{err}");

    let left = library_view(&path);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0.as_deref(), Some("mail"));
    assert_eq!(left[0].1.name, "bounce-check");
    let q = Queue::open(&path).unwrap();
    assert_eq!(q.queue_names().unwrap(), vec!["mail".to_string()]);
    // Jobs are not schedules: mail's job stays.
    assert_eq!(q.existing("mail").unwrap().stats().unwrap().ready, 1);
    drop(q);
    let stats = json_lines(ok(run(&["stats", p, "--json"])));
    assert_eq!(stats[0]["schedules"], 0);
    assert_eq!(stats[1]["schedules"], 1);
    assert_eq!(code(&run(&["schedules", p])), 0);
}

/// `schedule-pause`, `schedule-resume` and `schedule-trigger` on the file: each says what it
/// did, the library sees it, `schedules` shows the pause (table and JSON), and a missing
/// schedule is exit 1 with nothing written.
#[test]
fn schedule_pause_resume_and_trigger() {
    let (_dir, path) = tmp();
    schedule_file(&path);
    let p = s(&path);
    assert_eq!(
        stdout(ok(run(&["schedule-pause", p, "sync"]))),
        "(default): paused schedule \"sync\"\n"
    );
    assert_eq!(
        stdout(ok(run(&["schedule-pause", p, "sync"]))),
        "(default): schedule \"sync\" was already paused\n"
    );
    let listed = json_lines(ok(run(&["schedules", p, "--json", "--queue", "(default)"])));
    assert!(listed[0]["paused_ms"].as_u64().is_some(), "{listed:?}");
    assert!(listed[0]["next_due_ms"].is_null(), "{listed:?}");
    let table = stdout(ok(run(&["schedules", p])));
    assert!(table.contains("paused since"), "{table}");
    let said = stdout(ok(run(&["schedule-trigger", p, "sync"])));
    let id: u64 = said
        .trim_end()
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert_eq!(
        said,
        format!("(default): schedule \"sync\" enqueued job {id}\n")
    );
    let q = Queue::open(&path).unwrap();
    let info = q.schedule("sync").unwrap().unwrap();
    assert_eq!(info.last_job.map(|(job, _)| job.0), Some(id));
    assert!(info.paused_ms.is_some(), "a trigger leaves it paused");
    assert_eq!(
        q.job(leaseq::JobId(id)).unwrap().unwrap().state,
        leaseq::JobState::Ready
    );
    drop(q);
    // While "sync" is paused nothing is due, so a write open has nothing to fire and the
    // view before and after compares only what the refused commands wrote (on a slow
    // machine a resumed "sync" comes due between two commands).
    let before = library_view(&path);
    for verb in ["schedule-pause", "schedule-resume", "schedule-trigger"] {
        let err = fails(&run(&[verb, p, "nope"]), 1);
        assert!(
            err.contains("no schedule named \"nope\" in queue (default)"),
            "{verb}: {err}"
        );
    }
    assert_eq!(library_view(&path), before, "nothing written");
    assert_eq!(
        stdout(ok(run(&["schedule-resume", p, "sync"]))),
        "(default): resumed schedule \"sync\"\n"
    );
    assert_eq!(
        stdout(ok(run(&["schedule-resume", p, "sync"]))),
        "(default): schedule \"sync\" was not paused\n"
    );
}
