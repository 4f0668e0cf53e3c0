//! The read commands: `stats`, `ls`, `show`, `queues`, `schedules`, `check`. None of them
//! creates a file or a queue.

use leaseq::JobState;
use serde::Serialize;
use serde_json::Value;

use crate::args::{CheckArgs, LsArgs, QueuesArgs, SchedulesArgs, ShowArgs, StatsArgs};
use crate::duration::format_ms;
use crate::fail::{CliResult, Fail};
use crate::files::queue_label;
use crate::output::{Out, short, utc};
use crate::source::Source;

/// Jobs read per `Queue::jobs` call.
const PAGE_JOBS: usize = 1000;

/// Every state, in the order `ls` lists them.
pub const STATES: [JobState; 6] = [
    JobState::Ready,
    JobState::Scheduled,
    JobState::Leased,
    JobState::Dead,
    JobState::Completed,
    JobState::Cancelled,
];

/// `leaseq stats`: from the file, or through the control channel of the app holding it.
pub fn stats(a: &StatsArgs) -> CliResult {
    let source = Source::open(&a.file)?;
    let mut rows: Vec<Value> = Vec::new();
    for q in source.queues(a.queue.queue.as_deref())? {
        rows.push(source.stats(q.as_deref())?);
    }
    let mut out = Out::new();
    if a.json {
        for row in &rows {
            out.json(row)?;
        }
        return out.flush();
    }
    let header = [
        "QUEUE",
        "TOTAL",
        "SCHEDULED",
        "READY",
        "LEASED",
        "DEAD",
        "APPLIED",
        "DEDUP_KEYS",
        "QUARANTINED",
        "PAUSED",
        "COMPLETED",
        "CANCELLED",
        "SCHEDULES",
        "LIMIT",
        "DROPPED",
        "RATE_LIMIT",
    ];
    let n = |v: &Value| v.as_u64().unwrap_or(0).to_string();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            let mut row = vec![queue_label(s["queue"].as_str()).to_string()];
            for field in [
                "total",
                "scheduled",
                "ready",
                "leased",
                "dead",
                "applied",
                "dedup_keys",
                "quarantined",
            ] {
                row.push(n(&s[field]));
            }
            row.push(if s["paused"] == true { "yes" } else { "no" }.to_string());
            row.push(n(&s["completed"]));
            row.push(n(&s["cancelled"]));
            row.push(n(&s["schedules"]));
            row.push(limit_cell(&s["limit"]));
            row.push(n(&s["dropped"]));
            row.push(match s["rate_limit"].as_object() {
                // A sliding window (any span) is marked with a `~`.
                Some(l) => format!(
                    "{}/{}{}",
                    l["max"].as_u64().unwrap_or(0),
                    if l["window"] == "sliding" { "~" } else { "" },
                    format_ms(l["per_ms"].as_u64().unwrap_or(0))
                ),
                None => "-".to_string(),
            });
            row
        })
        .collect();
    let right: Vec<bool> = (0..header.len()).map(|i| i > 0).collect();
    table(&mut out, &header, &right, &cells)?;
    // A file-wide state: said once, under the table.
    if let Some(since) = rows.iter().find_map(|s| s["storage_full_ms"].as_u64()) {
        out.line(format!(
            "storage full since {}: enqueues are refused until the drain or a clean-up frees room (the disk reserve)",
            utc(since)
        ))?;
    }
    out.flush()
}

/// A queue's size limit in one word (the JSON of `leaseq::json::queue_limit`): its bounds
/// (`1000j` jobs, `1048576B` payload bytes) and what a full queue does (`refuse`,
/// `block:5s`, `drop-oldest`), joined by commas; `-` without a limit.
pub fn limit_cell(l: &Value) -> String {
    if l.is_null() {
        return "-".to_string();
    }
    let mut parts = Vec::new();
    if let Some(j) = l["max_jobs"].as_u64() {
        parts.push(format!("{j}j"));
    }
    if let Some(b) = l["max_bytes"].as_u64() {
        parts.push(format!("{b}B"));
    }
    parts.push(match l["when_full"].as_str() {
        Some("block") => format!("block:{}", format_ms(l["wait_ms"].as_u64().unwrap_or(0))),
        Some("drop_oldest") => "drop-oldest".to_string(),
        Some(other) => other.to_string(),
        None => "?".to_string(),
    });
    parts.join(",")
}

/// Writes a table: column `i` right-aligned when `right[i]`, else left-aligned.
fn table(out: &mut Out, header: &[&str], right: &[bool], rows: &[Vec<String>]) -> CliResult {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let format_row = |cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if right.get(i).copied().unwrap_or(false) {
                line.push_str(&format!("{cell:>w$}"));
            } else {
                line.push_str(&format!("{cell:<w$}"));
            }
        }
        line.trim_end().to_string()
    };
    out.line(format_row(&mut header.iter().copied()))?;
    for row in rows {
        out.line(format_row(&mut row.iter().map(String::as_str)))?;
    }
    Ok(())
}

/// `leaseq ls`: from the file, or through the control channel of the app holding it.
pub fn ls(a: &LsArgs) -> CliResult {
    let source = Source::open(&a.file)?;
    let queues = source.queues(a.queue.queue.as_deref())?;
    let states: Vec<JobState> = match a.state {
        Some(s) => vec![s.into()],
        None => STATES.to_vec(),
    };
    let queue_width = queues
        .iter()
        .map(|q| queue_label(q.as_deref()).len())
        .max()
        .unwrap_or(0)
        .max("QUEUE".len());
    let mut out = Out::new();
    if !a.json {
        out.line(format!(
            "{:>10}  {:<queue_width$}  {:<9}  {:>8}  {:>6}  {:<24}  {:>9}  {:<24}  LAST_ERROR",
            "ID", "QUEUE", "STATE", "ATTEMPTS", "PRI", "RUN_AT", "BYTES", "KEY"
        ))?;
    }
    let mut left = a.limit.unwrap_or(u64::MAX);
    'queues: for q in &queues {
        for &state in &states {
            let mut after: Option<String> = None;
            loop {
                if left == 0 {
                    break 'queues;
                }
                let want = usize::try_from(left).unwrap_or(usize::MAX).min(PAGE_JOBS);
                let (jobs, next) = source.jobs(q.as_deref(), state, after.as_deref(), want)?;
                for job in &jobs {
                    if a.json {
                        out.json(job)?;
                    } else {
                        out.line(ls_line(job, queue_width))?;
                    }
                }
                left -= jobs.len() as u64;
                match next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
    }
    out.flush()
}

/// One line of `ls`'s table from a job's JSON ([`leaseq::json::JobView`]).
fn ls_line(job: &Value, queue_width: usize) -> String {
    let text = |k: &str| job[k].as_str().map(str::to_string);
    let attempts = format!(
        "{}/{}",
        job["attempts"].as_u64().unwrap_or(0),
        job["max_attempts"].as_u64().unwrap_or(0)
    );
    // The dedup key, else the idempotency key; as text, or hex.
    let key = [
        ("dedup_key", "dedup_key_hex"),
        ("idempotency_key", "idempotency_key_hex"),
    ]
    .iter()
    .find_map(|(t, h)| text(t).or_else(|| text(h).map(|h| format!("0x{h}"))))
    .unwrap_or_else(|| "-".to_string());
    // A cancelled job's reason, a snoozed one's status, else the last error.
    let note = match (text("cancel_reason"), text("status")) {
        (Some(r), _) => format!("cancelled: {r}"),
        (None, Some(s)) => format!("snoozed: {s}"),
        (None, None) => text("last_error").unwrap_or_default(),
    };
    format!(
        "{:>10}  {:<queue_width$}  {:<9}  {:>8}  {:>6}  {:<24}  {:>9}  {:<24}  {}",
        job["id"].as_u64().unwrap_or(0),
        queue_label(job["queue"].as_str()),
        job["state"].as_str().unwrap_or("?"),
        attempts,
        job["priority"].as_i64().unwrap_or(0),
        utc(job["run_at_ms"].as_u64().unwrap_or(0)),
        job["payload_bytes"].as_u64().unwrap_or(0),
        short(&key, 24),
        short(&note, 60),
    )
}

/// `text` on one line: line breaks (and carriage returns) shown as `\n` (`\r`).
fn one_line(text: &str) -> String {
    text.replace('\r', "\\r").replace('\n', "\\n")
}

fn no_job(path: &std::path::Path, name: Option<&str>, id: u64) -> Fail {
    let path = path.display();
    match name {
        Some(name) => Fail::problem(format!("{path}: no job {id} in queue {name}")),
        None => Fail::problem(format!("{path}: no job {id}")),
    }
}

/// `leaseq show`: from the file, or through the control channel of the app holding it.
pub fn show(a: &ShowArgs) -> CliResult {
    let source = Source::open(&a.file)?;
    let name = a.queue.queue.as_deref();
    if let Some(q) = name {
        // A missing queue is its own error (exit 1), as for the other read commands.
        source.queues(Some(q))?;
    }
    let Some((job, payload)) = source.job(name, a.id)? else {
        return Err(no_job(&a.file, name, a.id));
    };
    let mut out = Out::new();
    if a.raw {
        out.bytes(&payload)?;
        return out.flush();
    }
    if a.json {
        out.json(&job)?;
        return out.flush();
    }
    let text = |k: &str| job[k].as_str().map(str::to_string);
    let number = |k: &str| job[k].as_u64();
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    // A field as text, or as `0x` and hex when it is not.
    let text_or_hex =
        |k: &str| text(k).or_else(|| text(&format!("{k}_hex")).map(|h| format!("0x{h}")));
    let retry = job["retry"].as_object().map(|r| {
        let kind = r["kind"].as_str().unwrap_or("?");
        let ms = |k: &str| format_ms(r[k].as_u64().unwrap_or(0));
        let jitter = r["jitter_percent"].as_u64().unwrap_or(0);
        match kind {
            "immediate" => "immediate".to_string(),
            "fixed" => format!("fixed {}, jitter {jitter}%", ms("base_ms")),
            _ => format!(
                "{kind} from {} to {}, jitter {jitter}%",
                ms("base_ms"),
                ms("cap_ms")
            ),
        }
    });
    let time = |ms: u64| format!("{} ({ms})", utc(ms));
    let progress = (job["progress"].is_string() || job["progress_hex"].is_string()).then(|| {
        let value = match (
            job["progress_percent"].as_u64(),
            text("progress_message"),
            text_or_hex("progress"),
        ) {
            (Some(pct), Some(m), _) => format!("{pct} % {}", one_line(&m)),
            (Some(pct), None, _) => format!("{pct} %"),
            (None, _, Some(v)) => one_line(&v),
            (None, _, None) => String::new(),
        };
        match number("progress_ms") {
            Some(ms) => format!("{value} (at {})", utc(ms)),
            None => value,
        }
    });
    let fields: Vec<(&str, String)> = vec![
        ("id", a.id.to_string()),
        ("queue", queue_label(job["queue"].as_str()).to_string()),
        ("state", or_dash(text("state"))),
        (
            "attempts",
            format!(
                "{} of {}",
                number("attempts").unwrap_or(0),
                number("max_attempts").unwrap_or(0)
            ),
        ),
        (
            "priority",
            job["priority"].as_i64().unwrap_or(0).to_string(),
        ),
        ("run_at", time(number("run_at_ms").unwrap_or(0))),
        ("created", time(number("created_ms").unwrap_or(0))),
        ("died", or_dash(number("died_ms").map(time))),
        ("leased", or_dash(number("leased_ms").map(time))),
        (
            "lease_deadline",
            or_dash(number("lease_deadline_ms").map(time)),
        ),
        (
            "lease_token",
            or_dash(number("lease_token").map(|t| t.to_string())),
        ),
        (
            "last_error",
            or_dash(text("last_error").as_deref().map(one_line)),
        ),
        ("status", or_dash(text("status").as_deref().map(one_line))),
        ("ended", or_dash(number("ended_ms").map(time))),
        (
            "cancel_reason",
            or_dash(text("cancel_reason").as_deref().map(one_line)),
        ),
        ("result", or_dash(text_or_hex("result"))),
        ("progress", or_dash(progress)),
        ("idempotency_key", or_dash(text_or_hex("idempotency_key"))),
        ("dedup_key", or_dash(text_or_hex("dedup_key"))),
        ("group", or_dash(text_or_hex("group"))),
        (
            "dedup_window",
            or_dash(number("dedup_window_ms").map(format_ms)),
        ),
        ("lease", or_dash(number("lease_ms").map(format_ms))),
        ("timeout", or_dash(number("timeout_ms").map(format_ms))),
        ("retry", or_dash(retry)),
        ("snoozes", or_dash(number("snoozes").map(|s| s.to_string()))),
        ("encoding", or_dash(text("encoding"))),
    ];
    for (name, value) in fields {
        out.line(format!("{name:<16} {value}"))?;
    }
    for e in job["errors"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let at = e["at_ms"].as_u64().map_or("time unknown".to_string(), utc);
        out.line(format!(
            "error            attempt {} at {at}: {}",
            e["attempt"].as_u64().unwrap_or(0),
            one_line(e["message"].as_str().unwrap_or(""))
        ))?;
    }
    // Text as it is; bytes that are not text (or hold control characters a terminal would
    // act on) as hex.
    match leaseq::json::text_or_hex(Some(&payload)) {
        (Some(text), _) => {
            out.line(format!("payload          {} bytes, UTF-8:", payload.len()))?;
            out.line(text)?;
        }
        (None, hex) => {
            out.line(format!("payload          {} bytes, hex:", payload.len()))?;
            out.line(hex.unwrap_or_default())?;
        }
    }
    out.flush()
}

/// `leaseq queues`: from the file, or through the control channel of the app holding it.
pub fn queues(a: &QueuesArgs) -> CliResult {
    let names = Source::open(&a.file)?.queue_names()?;
    let mut out = Out::new();
    if a.json {
        #[derive(Serialize)]
        struct QueuesJson<'a> {
            queues: &'a [String],
        }
        out.json(&QueuesJson { queues: &names })?;
    } else {
        for name in &names {
            out.line(name)?;
        }
    }
    out.flush()
}

/// A timing for people: `every 15m`, or `cron 0 3 * * * (Europe/Berlin)` (runs of spaces
/// in the expression as one).
fn timing_text(t: &Value) -> String {
    match t["kind"].as_str() {
        Some("interval") => format!("every {}", format_ms(t["every_ms"].as_u64().unwrap_or(0))),
        _ => format!(
            "cron {} ({})",
            short(
                &crate::fail::one_line(t["expression"].as_str().unwrap_or("")),
                200
            ),
            short(t["time_zone"].as_str().unwrap_or(""), 200)
        ),
    }
}

/// `leaseq schedules`: the schedules of the selected queues, each queue's by name; through
/// the app's control channel when the app holds the file (the same JSON).
pub fn schedules(a: &SchedulesArgs) -> CliResult {
    let source = Source::open(&a.file)?;
    let mut rows: Vec<Value> = Vec::new();
    for q in source.queues(a.queue.queue.as_deref())? {
        rows.extend(source.schedules(q.as_deref())?);
    }
    let mut out = Out::new();
    if a.json {
        for s in &rows {
            out.json(s)?;
        }
        return out.flush();
    }
    if rows.is_empty() {
        out.line("no schedules")?;
        return out.flush();
    }
    let header = [
        "QUEUE", "NAME", "TIMING", "NEXT_DUE", "LAST_JOB", "LAST_DUE", "FIRED", "SKIPPED",
        "OVERLAP", "MISSED",
    ];
    let right = [
        false, false, false, false, true, false, true, true, false, false,
    ];
    let number = |v: &Value| {
        v.as_u64()
            .map_or_else(|| "-".to_string(), |n| n.to_string())
    };
    let time = |v: &Value| v.as_u64().map_or_else(|| "-".to_string(), utc);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            vec![
                queue_label(s["queue"].as_str()).to_string(),
                short(s["name"].as_str().unwrap_or(""), 200),
                timing_text(&s["timing"]),
                match (s["paused_ms"].as_u64(), s["next_due_ms"].as_u64()) {
                    (Some(at), _) => format!("paused since {}", utc(at)),
                    (None, next) => next.map_or_else(|| "none".to_string(), utc),
                },
                number(&s["last_job_id"]),
                time(&s["last_due_ms"]),
                number(&s["fired"]),
                number(&s["skipped"]),
                s["overlap"].as_str().unwrap_or("").to_string(),
                s["missed"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect();
    table(&mut out, &header, &right, &cells)?;
    out.flush()
}

/// `leaseq check`: exit 1 when the file breaks an invariant or fails redb's integrity check;
/// through the app's control channel when the app holds the file (the app checks it).
pub fn check(a: &CheckArgs) -> CliResult {
    let mut out = Out::new();
    let source = match Source::open(&a.file) {
        Ok(s) => s,
        Err(f) if f.corrupted => {
            if a.json {
                out.json(&leaseq::json::check(&[leaseq::Violation {
                    job_id: None,
                    detail: f.message.clone(),
                }]))?;
                out.flush()?;
            }
            return Err(Fail { code: 1, ..f });
        }
        Err(f) => return Err(f),
    };
    let path = a.file.as_path();
    let doc = source.check()?;
    let violations: Vec<(Option<u64>, String)> = doc["violations"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|v| {
                    (
                        v["job_id"].as_u64(),
                        v["detail"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    if a.json {
        out.json(&doc)?;
    } else if violations.is_empty() {
        out.line(format!("{}: ok", path.display()))?;
    } else {
        for (job_id, detail) in &violations {
            let line = match job_id {
                Some(id) => format!("job {id}: {detail}"),
                None => detail.clone(),
            };
            out.line(short(&line, 10_000))?;
        }
    }
    out.flush()?;
    if violations.is_empty() {
        Ok(())
    } else {
        let more = if violations.len() >= 1000 {
            " (the first 1000)"
        } else {
            ""
        };
        Err(Fail::problem(format!(
            "{}: {} violation{} found{more}",
            path.display(),
            violations.len(),
            if violations.len() == 1 { "" } else { "s" }
        )))
    }
}
