//! The read commands: `stats`, `ls`, `show`, `queues`, `schedules`, `check`. None of them
//! creates a file or a queue.

use leaseq::{JobState, Missed, Overlap, Reader, ScheduleInfo, Stats, Timing};
use serde::Serialize;

use crate::args::{CheckArgs, LsArgs, QueuesArgs, SchedulesArgs, ShowArgs, StatsArgs};
use crate::duration::format_ms;
use crate::fail::{CliResult, Fail};
use crate::files::{self, find_job, queue_label};
use crate::output::{Out, short, state_name, utc};
use leaseq::json::JobView;

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

#[derive(Serialize)]
struct StatsJson<'a> {
    queue: Option<&'a str>,
    total: u64,
    scheduled: u64,
    ready: u64,
    leased: u64,
    dead: u64,
    applied: u64,
    dedup_keys: u64,
    quarantined: u64,
    paused: bool,
    completed: u64,
    cancelled: u64,
    schedules: u64,
    /// `{"max":..,"per_ms":..}`, or null when the queue is not rate-limited.
    rate_limit: Option<RateLimitJson>,
}

#[derive(Serialize)]
struct RateLimitJson {
    max: u32,
    per_ms: u64,
}

/// `leaseq stats`.
pub fn stats(a: &StatsArgs) -> CliResult {
    let queue = files::open_reader(&a.file)?;
    let path = queue.path();
    type Row = (
        String,
        Option<String>,
        Stats,
        u64,
        Option<leaseq::RateLimit>,
    );
    let mut rows: Vec<Row> = Vec::new();
    for q in files::selected(&queue, a.queue.queue.as_deref())? {
        let s = q.stats().map_err(|e| Fail::leaseq(path, e))?;
        let schedules = q.schedules().map_err(|e| Fail::leaseq(path, e))?.len() as u64;
        let limit = q.rate_limit().map_err(|e| Fail::leaseq(path, e))?;
        rows.push((
            queue_label(q.name()).to_string(),
            q.name().map(str::to_string),
            s,
            schedules,
            limit,
        ));
    }
    let mut out = Out::new();
    if a.json {
        for (_, name, s, schedules, limit) in &rows {
            out.json(&StatsJson {
                queue: name.as_deref(),
                total: s.total,
                scheduled: s.scheduled,
                ready: s.ready,
                leased: s.leased,
                dead: s.dead,
                applied: s.applied,
                dedup_keys: s.dedup_keys,
                quarantined: s.quarantined,
                paused: s.paused,
                completed: s.completed,
                cancelled: s.cancelled,
                schedules: *schedules,
                rate_limit: limit.map(|l| RateLimitJson {
                    max: l.max,
                    per_ms: l.per_ms,
                }),
            })?;
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
        "RATE_LIMIT",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, _, s, schedules, limit)| {
            let mut row = vec![label.clone()];
            row.extend(
                [
                    s.total,
                    s.scheduled,
                    s.ready,
                    s.leased,
                    s.dead,
                    s.applied,
                    s.dedup_keys,
                    s.quarantined,
                ]
                .iter()
                .map(u64::to_string),
            );
            row.push(if s.paused { "yes" } else { "no" }.to_string());
            row.push(s.completed.to_string());
            row.push(s.cancelled.to_string());
            row.push(schedules.to_string());
            row.push(match limit {
                Some(l) => format!("{}/{}", l.max, format_ms(l.per_ms)),
                None => "-".to_string(),
            });
            row
        })
        .collect();
    let right: Vec<bool> = (0..header.len()).map(|i| i > 0).collect();
    table(&mut out, &header, &right, &cells)?;
    out.flush()
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

/// `leaseq ls`.
pub fn ls(a: &LsArgs) -> CliResult {
    let queue = files::open_reader(&a.file)?;
    let path = queue.path();
    let queues = files::selected(&queue, a.queue.queue.as_deref())?;
    let states: Vec<JobState> = match a.state {
        Some(s) => vec![s.into()],
        None => STATES.to_vec(),
    };
    let queue_width = queues
        .iter()
        .map(|q| queue_label(q.name()).len())
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
            let mut after = None;
            loop {
                if left == 0 {
                    break 'queues;
                }
                let want = usize::try_from(left).unwrap_or(usize::MAX).min(PAGE_JOBS);
                let page = q
                    .jobs(state, after, want)
                    .map_err(|e| Fail::leaseq(path, e))?;
                for info in &page.jobs {
                    if a.json {
                        out.json(&JobView::new(q.name(), info, None))?;
                    } else {
                        let attempts = format!("{}/{}", info.attempts, info.max_attempts);
                        // The dedup key, else the idempotency key; as text, or hex.
                        let key = match (&info.dedup_key, &info.idempotency_key) {
                            (Some(k), _) | (None, Some(k)) => {
                                match leaseq::json::text_or_hex(Some(k)) {
                                    (Some(text), _) => text,
                                    (None, hex) => format!("0x{}", hex.unwrap_or_default()),
                                }
                            }
                            (None, None) => "-".to_string(),
                        };
                        // A cancelled job's reason, a snoozed one's status, else the last
                        // error.
                        let note = match (&info.cancel_reason, &info.status) {
                            (Some(r), _) => format!("cancelled: {r}"),
                            (None, Some(s)) => format!("snoozed: {s}"),
                            (None, None) => info.last_error.clone().unwrap_or_default(),
                        };
                        out.line(format!(
                            "{:>10}  {:<queue_width$}  {:<9}  {:>8}  {:>6}  {:<24}  {:>9}  {:<24}  {}",
                            info.id.0,
                            queue_label(q.name()),
                            state_name(info.state),
                            attempts,
                            info.priority,
                            utc(info.run_at_ms),
                            info.payload_bytes,
                            short(&key, 24),
                            short(&note, 60),
                        ))?;
                    }
                }
                left -= page.jobs.len() as u64;
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
    }
    out.flush()
}

/// `text` on one line: line breaks (and carriage returns) shown as `\n` (`\r`).
fn one_line(text: &str) -> String {
    text.replace('\r', "\\r").replace('\n', "\\n")
}

fn no_job(queue: &Reader, name: Option<&str>, id: u64) -> Fail {
    let path = queue.path().display();
    match name {
        Some(name) => Fail::problem(format!("{path}: no job {id} in queue {name}")),
        None => Fail::problem(format!("{path}: no job {id}")),
    }
}

/// `leaseq show`.
pub fn show(a: &ShowArgs) -> CliResult {
    let queue = files::open_reader(&a.file)?;
    let path = queue.path();
    let name = a.queue.queue.as_deref();
    let Some((q, info)) = find_job(&queue, name, a.id)? else {
        return Err(no_job(&queue, name, a.id));
    };
    let payload = q
        .payload(info.id)
        .map_err(|e| Fail::leaseq(path, e))?
        .ok_or_else(|| no_job(&queue, name, a.id))?;
    let mut out = Out::new();
    if a.raw {
        out.bytes(&payload)?;
        return out.flush();
    }
    if a.json {
        out.json(&JobView::new(q.name(), &info, Some(&payload)))?;
        return out.flush();
    }
    let view = JobView::new(q.name(), &info, None);
    let l = &view.line;
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let key = |text: &Option<String>, hex_text: &Option<String>| match (text, hex_text) {
        (Some(t), _) => t.clone(),
        (None, Some(h)) => format!("0x{h}"),
        (None, None) => "-".into(),
    };
    let retry = l.retry.as_ref().map(|r| match r.kind.as_str() {
        "immediate" => "immediate".to_string(),
        "fixed" => format!(
            "fixed {}, jitter {}%",
            format_ms(r.base_ms),
            r.jitter_percent
        ),
        _ => format!(
            "{} from {} to {}, jitter {}%",
            r.kind,
            format_ms(r.base_ms),
            format_ms(r.cap_ms),
            r.jitter_percent
        ),
    });
    let time = |ms: u64| format!("{} ({ms})", utc(ms));
    let fields: Vec<(&str, String)> = vec![
        ("id", info.id.to_string()),
        ("queue", queue_label(q.name()).to_string()),
        ("state", state_name(info.state).to_string()),
        (
            "attempts",
            format!("{} of {}", info.attempts, info.max_attempts),
        ),
        ("priority", info.priority.to_string()),
        ("run_at", time(info.run_at_ms)),
        ("created", time(info.created_ms)),
        ("died", or_dash(info.died_ms.map(time))),
        ("lease_deadline", or_dash(info.lease_deadline_ms.map(time))),
        (
            "lease_token",
            or_dash(info.lease_token.map(|t| t.to_string())),
        ),
        (
            "last_error",
            or_dash(info.last_error.as_deref().map(one_line)),
        ),
        ("status", or_dash(info.status.as_deref().map(one_line))),
        ("ended", or_dash(info.ended_ms.map(time))),
        (
            "cancel_reason",
            or_dash(info.cancel_reason.as_deref().map(one_line)),
        ),
        (
            "result",
            or_dash(
                info.result
                    .as_ref()
                    .map(|r| match leaseq::json::text_or_hex(Some(r)) {
                        (Some(text), _) => text,
                        (None, hex) => format!("0x{}", hex.unwrap_or_default()),
                    }),
            ),
        ),
        (
            "progress",
            or_dash(info.progress.as_ref().map(|p| {
                let read = leaseq::Progress::read(p);
                let value = match (
                    read.percent,
                    read.message,
                    leaseq::json::text_or_hex(Some(p)),
                ) {
                    (Some(pct), Some(m), _) => format!("{pct} % {}", one_line(&m)),
                    (Some(pct), None, _) => format!("{pct} %"),
                    (None, _, (Some(text), _)) => one_line(&text),
                    (None, _, (None, hex)) => format!("0x{}", hex.unwrap_or_default()),
                };
                match info.progress_ms {
                    Some(ms) => format!("{value} (at {})", utc(ms)),
                    None => value,
                }
            })),
        ),
        (
            "idempotency_key",
            key(&l.idempotency_key, &l.idempotency_key_hex),
        ),
        ("dedup_key", key(&l.dedup_key, &l.dedup_key_hex)),
        ("group", key(&l.group, &l.group_hex)),
        ("dedup_window", or_dash(l.dedup_window_ms.map(format_ms))),
        ("lease", or_dash(l.lease_ms.map(format_ms))),
        ("retry", or_dash(retry)),
        ("snoozes", or_dash(l.snoozes.map(|s| s.to_string()))),
        ("encoding", or_dash(l.encoding.clone())),
    ];
    for (name, value) in fields {
        out.line(format!("{name:<16} {value}"))?;
    }
    for e in &info.errors {
        let at = e.at_ms.map_or("time unknown".to_string(), utc);
        out.line(format!(
            "error            attempt {} at {at}: {}",
            e.attempt,
            one_line(&e.message)
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

/// `leaseq queues`.
pub fn queues(a: &QueuesArgs) -> CliResult {
    let queue = files::open_reader(&a.file)?;
    let names = queue
        .queue_names()
        .map_err(|e| Fail::leaseq(queue.path(), e))?;
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

/// A schedule's timing in JSON: `{"kind":"interval","every_ms":..,"start_ms":..}` or
/// `{"kind":"cron","expression":..,"time_zone":..}`.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum TimingJson<'a> {
    Interval {
        every_ms: u64,
        start_ms: u64,
    },
    Cron {
        expression: &'a str,
        time_zone: &'a str,
    },
}

#[derive(Serialize)]
struct ScheduleJson<'a> {
    queue: Option<&'a str>,
    name: &'a str,
    timing: TimingJson<'a>,
    next_due_ms: Option<u64>,
    last_job_id: Option<u64>,
    last_due_ms: Option<u64>,
    fired: u64,
    skipped: u64,
    overlap: &'static str,
    missed: &'static str,
    priority: i32,
    payload_bytes: usize,
    created_ms: u64,
    updated_ms: u64,
}

impl<'a> ScheduleJson<'a> {
    fn new(queue: Option<&'a str>, s: &'a ScheduleInfo) -> ScheduleJson<'a> {
        ScheduleJson {
            queue,
            name: &s.name,
            timing: match &s.timing {
                Timing::Interval { every_ms, start_ms } => TimingJson::Interval {
                    every_ms: *every_ms,
                    start_ms: *start_ms,
                },
                Timing::Cron {
                    expression,
                    time_zone,
                } => TimingJson::Cron {
                    expression,
                    time_zone,
                },
            },
            next_due_ms: s.next_due_ms,
            last_job_id: s.last_job.map(|(id, _)| id.0),
            last_due_ms: s.last_job.map(|(_, due)| due),
            fired: s.fired,
            skipped: s.skipped,
            overlap: overlap_name(s.overlap),
            missed: missed_name(s.missed),
            priority: s.priority,
            payload_bytes: s.payload_bytes,
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
        }
    }
}

/// An overlap policy's name on the command line and in JSON.
fn overlap_name(o: Overlap) -> &'static str {
    match o {
        Overlap::Skip => "skip",
        Overlap::Enqueue => "enqueue",
    }
}

/// A missed-time policy's name on the command line and in JSON.
fn missed_name(m: Missed) -> &'static str {
    match m {
        Missed::RunOnce => "run_once",
        Missed::Skip => "skip",
    }
}

/// A timing for people: `every 15m`, or `cron 0 3 * * * (Europe/Berlin)` (runs of spaces
/// in the expression as one).
fn timing_text(t: &Timing) -> String {
    match t {
        Timing::Interval { every_ms, .. } => format!("every {}", format_ms(*every_ms)),
        Timing::Cron {
            expression,
            time_zone,
        } => format!(
            "cron {} ({})",
            short(&crate::fail::one_line(expression), 200),
            short(time_zone, 200)
        ),
    }
}

/// `leaseq schedules`: the schedules of the selected queues, each queue's by name.
pub fn schedules(a: &SchedulesArgs) -> CliResult {
    let queue = files::open_reader(&a.file)?;
    let path = queue.path();
    let mut rows: Vec<(Reader, Vec<ScheduleInfo>)> = Vec::new();
    for q in files::selected(&queue, a.queue.queue.as_deref())? {
        let list = q.schedules().map_err(|e| Fail::leaseq(path, e))?;
        rows.push((q, list));
    }
    let mut out = Out::new();
    if a.json {
        for (q, list) in &rows {
            for s in list {
                out.json(&ScheduleJson::new(q.name(), s))?;
            }
        }
        return out.flush();
    }
    if rows.iter().all(|(_, list)| list.is_empty()) {
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
    let cells: Vec<Vec<String>> = rows
        .iter()
        .flat_map(|(q, list)| list.iter().map(move |s| (queue_label(q.name()), s)))
        .map(|(label, s)| {
            vec![
                label.to_string(),
                short(&s.name, 200),
                timing_text(&s.timing),
                s.next_due_ms.map_or_else(|| "none".to_string(), utc),
                s.last_job
                    .map_or_else(|| "-".to_string(), |(id, _)| id.0.to_string()),
                s.last_job
                    .map_or_else(|| "-".to_string(), |(_, due)| utc(due)),
                s.fired.to_string(),
                s.skipped.to_string(),
                overlap_name(s.overlap).to_string(),
                missed_name(s.missed).to_string(),
            ]
        })
        .collect();
    table(&mut out, &header, &right, &cells)?;
    out.flush()
}

#[derive(Serialize)]
struct ViolationJson {
    job_id: Option<u64>,
    detail: String,
}

#[derive(Serialize)]
struct CheckJson {
    ok: bool,
    violations: Vec<ViolationJson>,
}

/// `leaseq check`: exit 1 when the file breaks an invariant or fails redb's integrity check.
pub fn check(a: &CheckArgs) -> CliResult {
    let mut out = Out::new();
    let queue = match files::open_reader(&a.file) {
        Ok(q) => q,
        Err(f) if f.corrupted => {
            if a.json {
                out.json(&CheckJson {
                    ok: false,
                    violations: vec![ViolationJson {
                        job_id: None,
                        detail: f.message.clone(),
                    }],
                })?;
                out.flush()?;
            }
            return Err(Fail { code: 1, ..f });
        }
        Err(f) => return Err(f),
    };
    let path = queue.path();
    let violations = match queue.check() {
        Ok(v) => v,
        Err(e @ leaseq::Error::Corrupted { .. }) => vec![leaseq::Violation {
            job_id: None,
            detail: e.to_string(),
        }],
        Err(e) => return Err(Fail::leaseq(path, e)),
    };
    if a.json {
        out.json(&CheckJson {
            ok: violations.is_empty(),
            violations: violations
                .iter()
                .map(|v| ViolationJson {
                    job_id: v.job_id.map(|id| id.0),
                    detail: v.detail.clone(),
                })
                .collect(),
        })?;
    } else if violations.is_empty() {
        out.line(format!("{}: ok", path.display()))?;
    } else {
        for v in &violations {
            out.line(short(&v.to_string(), 10_000))?;
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
