//! The JSON form of a job, shared by everything that writes or reads jobs as JSON: the
//! line of `leaseq export` and `leaseq import` ([`JobLine`]), the objects of `leaseq ls
//! --json` and `leaseq show --json` and of the control channel's API ([`JobView`]). One job
//! per line in an export. docs/cli.md holds the schema (every field, its type and meaning,
//! how bytes are written, what an import defaults and refuses); the serde structs here are
//! its source, so a field added here goes into that table too.
//!
//! Bytes (payloads, keys, groups, results, progress) are written as text when they are UTF-8
//! without control characters other than tab, newline and carriage return, else as hex in
//! the field of the same name with `_hex` appended ([`text_or_hex`]).

use serde::{Deserialize, Serialize};

use crate::{Encoding, JobInfo, JobState, RetryPolicy};

mod import;

/// A job's retry policy in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryJson {
    /// `immediate`, `fixed` or `exponential`.
    pub kind: String,
    /// Fixed: the delay; exponential: the first delay.
    #[serde(default)]
    pub base_ms: u64,
    /// Exponential: the longest delay.
    #[serde(default)]
    pub cap_ms: u64,
    /// Up to this share is added to every delay.
    #[serde(default)]
    pub jitter_percent: u8,
}

/// One line of an export.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobLine {
    /// The named queue; `None` for the default queue.
    #[serde(default)]
    pub queue: Option<String>,
    /// The id in the exported file.
    #[serde(default)]
    pub id: Option<u64>,
    /// `ready`, `scheduled` or `dead` (`leased` is read as ready).
    #[serde(default)]
    pub state: Option<String>,
    /// Deliveries so far.
    #[serde(default)]
    pub attempts: Option<u32>,
    /// Deliveries allowed.
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Lower is served first.
    #[serde(default)]
    pub priority: Option<i32>,
    /// Due time, ready time or time of death (Unix ms).
    #[serde(default)]
    pub run_at_ms: Option<u64>,
    /// When it was enqueued (Unix ms).
    #[serde(default)]
    pub created_ms: Option<u64>,
    /// Why the last attempt ended badly.
    #[serde(default)]
    pub last_error: Option<String>,
    /// The idempotency key as UTF-8.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The idempotency key as hex, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key_hex: Option<String>,
    /// The dedup key as UTF-8.
    #[serde(default)]
    pub dedup_key: Option<String>,
    /// The dedup key as hex, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_key_hex: Option<String>,
    /// The job's own dedup window.
    #[serde(default)]
    pub dedup_window_ms: Option<u64>,
    /// The job's own lease.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// The job's own execution timeout (`EnqueueOptions::timeout`); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The job's own retry policy.
    #[serde(default)]
    pub retry: Option<RetryJson>,
    /// Times snoozed.
    #[serde(default)]
    pub snoozes: Option<u32>,
    /// `bincode` or `json` for a typed payload.
    #[serde(default)]
    pub encoding: Option<String>,
    /// Its ordered group (`EnqueueOptions::group`), as text or hex; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The group as hex, when it is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_hex: Option<String>,
    /// The payload, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_utf8: Option<String>,
    /// The payload as hex, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_hex: Option<String>,
}

/// Bytes as (text, hex), one of them set: text when they are UTF-8 without control
/// characters other than tab, newline and carriage return (so the JSON string is at most
/// twice as long as the bytes, as hex is), hex otherwise.
pub fn text_or_hex(bytes: Option<&[u8]>) -> (Option<String>, Option<String>) {
    match bytes {
        None => (None, None),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s)
                if !s
                    .chars()
                    .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) =>
            {
                (Some(s.to_string()), None)
            }
            _ => (None, Some(hex(b))),
        },
    }
}

/// Bytes back from a (UTF-8 text, hex) pair; both set is refused.
pub fn bytes_of(
    field: &str,
    text: Option<&str>,
    hex_text: Option<&str>,
) -> Result<Option<Vec<u8>>, String> {
    match (text, hex_text) {
        (Some(_), Some(_)) => Err(format!("both {field} and {field}_hex are given")),
        (Some(t), None) => Ok(Some(t.as_bytes().to_vec())),
        (None, Some(h)) => unhex(h).map(Some).map_err(|e| format!("{field}_hex: {e}")),
        (None, None) => Ok(None),
    }
}

impl JobLine {
    /// The line of `info` in queue `queue`, with its payload if given (a job listed without
    /// its payload has neither payload field).
    pub fn from_info(queue: Option<&str>, info: &JobInfo, payload: Option<&[u8]>) -> JobLine {
        let (idempotency_key, idempotency_key_hex) = text_or_hex(info.idempotency_key.as_deref());
        let (dedup_key, dedup_key_hex) = text_or_hex(info.dedup_key.as_deref());
        let (payload_utf8, payload_hex) = text_or_hex(payload);
        let (group, group_hex) = text_or_hex(info.group.as_deref());
        // A leased job is exported as a reopen would return its lease: ready, or dead when
        // it has no attempts left (only a file opened without recovery holds leases).
        let (state, last_error) = match info.state {
            JobState::Leased if info.attempts >= info.max_attempts => {
                (JobState::Dead, Some("lease expired".to_string()))
            }
            JobState::Leased => (JobState::Ready, info.last_error.clone()),
            s => (s, info.last_error.clone()),
        };
        let extra = extra(info);
        JobLine {
            queue: queue.map(str::to_string),
            id: Some(info.id.0),
            state: Some(state.as_str().to_string()),
            attempts: Some(info.attempts),
            max_attempts: Some(info.max_attempts),
            priority: Some(info.priority),
            run_at_ms: Some(info.run_at_ms),
            created_ms: Some(info.created_ms),
            last_error,
            idempotency_key,
            idempotency_key_hex,
            dedup_key,
            dedup_key_hex,
            dedup_window_ms: extra.dedup_window_ms,
            lease_ms: extra.lease_ms,
            timeout_ms: extra.timeout_ms,
            retry: extra.retry,
            snoozes: Some(extra.snoozes),
            encoding: extra.encoding,
            group,
            group_hex,
            payload_utf8,
            payload_hex,
        }
    }
}

/// The fields of a job that the export carries besides the basic ones.
#[derive(Debug, Default)]
struct Extra {
    /// The job's own dedup window.
    dedup_window_ms: Option<u64>,
    /// The job's own lease.
    lease_ms: Option<u64>,
    /// The job's own execution timeout.
    timeout_ms: Option<u64>,
    /// The job's own retry policy.
    retry: Option<RetryJson>,
    /// Times snoozed.
    snoozes: u32,
    /// The codec of a typed payload.
    encoding: Option<String>,
}

/// The extra fields of `info`.
fn extra(info: &JobInfo) -> Extra {
    Extra {
        dedup_window_ms: info.dedup_window_ms,
        lease_ms: info.lease_ms,
        timeout_ms: info.timeout_ms,
        retry: info.retry.map(|r| retry_json(&r)),
        snoozes: info.snoozes,
        encoding: info.encoding.map(|e| encoding_name(e).to_string()),
    }
}

fn retry_json(r: &RetryPolicy) -> RetryJson {
    RetryJson {
        kind: r.kind().to_string(),
        base_ms: r.base_ms(),
        cap_ms: r.cap_ms(),
        jitter_percent: r.jitter_percent(),
    }
}

fn encoding_name(e: Encoding) -> &'static str {
    match e {
        Encoding::Bincode => "bincode",
        Encoding::Json => "json",
    }
}

/// `ls --json` and `show --json`: the export line (`state` as the job is: `leased` stays
/// leased) and what only an open file knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobView {
    /// The export fields.
    #[serde(flatten)]
    pub line: JobLine,
    /// The payload's length in bytes.
    pub payload_bytes: usize,
    /// Dead: when it died (Unix ms).
    pub died_ms: Option<u64>,
    /// Leased: when its delivery began (Unix ms; `JobInfo::leased_ms`).
    pub leased_ms: Option<u64>,
    /// Leased: the lease deadline (Unix ms).
    pub lease_deadline_ms: Option<u64>,
    /// Leased: the current lease token.
    pub lease_token: Option<u64>,
    /// Why it was last snoozed, until its next delivery.
    pub status: Option<String>,
    /// Completed or cancelled: when (Unix ms).
    pub ended_ms: Option<u64>,
    /// Cancelled: why.
    pub cancel_reason: Option<String>,
    /// Completed: the result its ack stored, as text or hex.
    pub result: Option<String>,
    /// Completed: the result as hex, when it is not text.
    pub result_hex: Option<String>,
    /// The progress its (last) delivery recorded, as text or hex, and when (Unix ms).
    pub progress: Option<String>,
    /// The progress as hex, when it is not text.
    pub progress_hex: Option<String>,
    /// When the progress was recorded (Unix ms).
    pub progress_ms: Option<u64>,
    /// The progress as a percentage, when its bytes say one
    /// ([`Progress::read`](crate::Progress::read)).
    pub progress_percent: Option<u8>,
    /// The progress's message, when its bytes hold one ([`Progress::read`](crate::Progress::read)).
    pub progress_message: Option<String>,
    /// The errors of its last attempts, oldest first.
    pub errors: Vec<ErrorView>,
}

/// One attempt's error in a [`JobView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorView {
    /// The attempt that ended with it.
    pub attempt: u32,
    /// When (Unix ms); `None` for an error recorded before format 7.
    pub at_ms: Option<u64>,
    /// The error's text.
    pub message: String,
}

impl JobView {
    /// The view of `info` in `queue`, with its payload if given.
    pub fn new(queue: Option<&str>, info: &JobInfo, payload: Option<&[u8]>) -> JobView {
        let mut line = JobLine::from_info(queue, info, payload);
        let progress = info.progress.as_deref().map(crate::Progress::read);
        line.state = Some(info.state.as_str().to_string());
        line.last_error.clone_from(&info.last_error);
        JobView {
            line,
            payload_bytes: info.payload_bytes,
            died_ms: info.died_ms,
            leased_ms: info.leased_ms,
            lease_deadline_ms: info.lease_deadline_ms,
            lease_token: info.lease_token,
            status: info.status.clone(),
            ended_ms: info.ended_ms,
            cancel_reason: info.cancel_reason.clone(),
            result: text_or_hex(info.result.as_deref()).0,
            result_hex: text_or_hex(info.result.as_deref()).1,
            progress: text_or_hex(info.progress.as_deref()).0,
            progress_hex: text_or_hex(info.progress.as_deref()).1,
            progress_ms: info.progress_ms,
            progress_percent: progress.as_ref().and_then(|p| p.percent),
            progress_message: progress.and_then(|p| p.message),
            errors: info
                .errors
                .iter()
                .map(|e| ErrorView {
                    attempt: e.attempt,
                    at_ms: e.at_ms,
                    message: e.message.clone(),
                })
                .collect(),
        }
    }
}

/// One queue's counts as JSON: the line of `leaseq stats --json`, and an entry of the control
/// channel's `GET /api/v1/stats`: `queue` (`null` for the default queue), the counts of
/// [`Stats`](crate::Stats) by their names, `schedules` (how many), and `rate_limit`
/// (`{"max":..,"per_ms":..,"window":"fixed"|"sliding"}`, or `null`).
///
/// # Errors
/// Those of [`Reader::stats`](crate::Reader::stats), [`Reader::schedules`](crate::Reader::schedules)
/// and [`Reader::rate_limit`](crate::Reader::rate_limit).
pub fn stats(q: &crate::Reader) -> crate::Result<serde_json::Value> {
    let s = q.stats()?;
    let schedules = q.schedules()?.len();
    let limit = q.rate_limit()?;
    Ok(serde_json::json!({
        "queue": q.name(),
        "total": s.total,
        "scheduled": s.scheduled,
        "ready": s.ready,
        "leased": s.leased,
        "dead": s.dead,
        "applied": s.applied,
        "dedup_keys": s.dedup_keys,
        "quarantined": s.quarantined,
        "paused": s.paused,
        "completed": s.completed,
        "cancelled": s.cancelled,
        "schedules": schedules,
        "rate_limit": limit.map(|l| serde_json::json!({
            "max": l.max,
            "per_ms": l.per_ms,
            "window": l.window.as_str(),
        })),
        "limit": s.limit.map(|l| queue_limit(&l)),
        "payload_bytes": s.payload_bytes,
        "dropped": s.dropped,
        "storage_full_ms": s.storage_full_ms,
    }))
}

/// A queue's size limit in JSON: `{"max_jobs":..,"max_bytes":..,"when_full":..,"wait_ms":..}`,
/// a bound without a value `null`; `when_full` is `"refuse"`, `"block"` (with `wait_ms`) or
/// `"drop_oldest"` (`wait_ms` `null` but for `"block"`).
pub fn queue_limit(l: &crate::QueueLimit) -> serde_json::Value {
    let (when_full, wait_ms) = match l.when_full {
        crate::WhenFull::Refuse => ("refuse", None),
        crate::WhenFull::Block { wait_ms } => ("block", Some(wait_ms)),
        crate::WhenFull::DropOldest => ("drop_oldest", None),
    };
    serde_json::json!({
        "max_jobs": l.max_jobs, "max_bytes": l.max_bytes, "when_full": when_full,
        "wait_ms": wait_ms,
    })
}

/// A schedule's timing in JSON: `{"kind":"interval","every_ms":..,"start_ms":..}` or
/// `{"kind":"cron","expression":..,"time_zone":..}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TimingView {
    /// Every `every_ms` from `start_ms` (Unix ms).
    Interval {
        /// The interval, in ms.
        every_ms: u64,
        /// Its first due time (Unix ms).
        start_ms: u64,
    },
    /// At each match of a cron expression in an IANA time zone.
    Cron {
        /// The expression.
        expression: String,
        /// The time zone.
        time_zone: String,
    },
}

/// A schedule as `leaseq schedules --json` writes it and the API's `schedules` answers: one
/// [`ScheduleInfo`](crate::ScheduleInfo) and its queue (`null` for the default one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleView {
    /// Its queue: `None` for the default one.
    pub queue: Option<String>,
    /// Its name.
    pub name: String,
    /// When it is due.
    pub timing: TimingView,
    /// Its next due time (Unix ms); `None` when it has none (a cron expression with no match
    /// ahead) or while it is paused.
    pub next_due_ms: Option<u64>,
    /// The last job it enqueued.
    pub last_job_id: Option<u64>,
    /// The due time that job was enqueued for (Unix ms).
    pub last_due_ms: Option<u64>,
    /// Jobs it enqueued.
    pub fired: u64,
    /// Decisions that enqueued nothing.
    pub skipped: u64,
    /// `"skip"` or `"enqueue"`.
    pub overlap: &'static str,
    /// `"run_once"` or `"skip"`.
    pub missed: &'static str,
    /// Its instances' priority.
    pub priority: i32,
    /// Its instances' payload size, in bytes.
    pub payload_bytes: usize,
    /// When it was created and last set (Unix ms).
    pub created_ms: u64,
    /// When it was last set by a create, update or upsert (Unix ms).
    pub updated_ms: u64,
    /// When it was paused (Unix ms), while it is.
    pub paused_ms: Option<u64>,
}

impl ScheduleView {
    /// The view of schedule `s` of queue `queue`.
    pub fn new(queue: Option<&str>, s: &crate::ScheduleInfo) -> ScheduleView {
        ScheduleView {
            queue: queue.map(str::to_string),
            name: s.name.clone(),
            timing: match &s.timing {
                crate::Timing::Interval { every_ms, start_ms } => TimingView::Interval {
                    every_ms: *every_ms,
                    start_ms: *start_ms,
                },
                crate::Timing::Cron {
                    expression,
                    time_zone,
                } => TimingView::Cron {
                    expression: expression.clone(),
                    time_zone: time_zone.clone(),
                },
            },
            next_due_ms: s.next_due_ms,
            last_job_id: s.last_job.map(|(id, _)| id.0),
            last_due_ms: s.last_job.map(|(_, due)| due),
            fired: s.fired,
            skipped: s.skipped,
            overlap: match s.overlap {
                crate::Overlap::Skip => "skip",
                crate::Overlap::Enqueue => "enqueue",
            },
            missed: match s.missed {
                crate::Missed::RunOnce => "run_once",
                crate::Missed::Skip => "skip",
            },
            priority: s.priority,
            payload_bytes: s.payload_bytes,
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
            paused_ms: s.paused_ms,
        }
    }
}

/// What `leaseq check --json` writes and the API's `check` answers:
/// `{"ok":B,"violations":[{"job_id":N|null,"detail":TEXT},…]}`.
pub fn check(violations: &[crate::Violation]) -> serde_json::Value {
    serde_json::json!({
        "ok": violations.is_empty(),
        "violations": violations
            .iter()
            .map(|v| serde_json::json!({ "job_id": v.job_id.map(|id| id.0), "detail": v.detail }))
            .collect::<Vec<_>>(),
    })
}

/// Ready jobs [`overview`] looks at for the longest wait: the head of the line.
pub const OVERVIEW_READY_LOOKED_AT: usize = 1000;
/// The most dead letters [`overview`] returns per queue.
pub const OVERVIEW_DEAD_MAX: usize = 1000;

/// One queue at a glance, as `leaseq watch` shows it and the API's `overview` answers:
/// `{"queue":Q,"stats":{…as [stats]},"oldest_ready_ms":MS|null,"rate_limited_until_ms":MS|null,
/// "minutes":[{"minute_ms":..,"enqueued":..,"completed":..,"retried":..,"dead":..,
/// "cancelled":..,"runs":..,"run_ms_p50":..,"run_ms_p95":..},…],"latest_dead":[{"id":..,
/// "died_ms":..,"last_error":..},…]}`. `oldest_ready_ms` is how long the longest-waiting of
/// the first [`OVERVIEW_READY_LOOKED_AT`] ready jobs in line has waited at `now_ms`;
/// `minutes` are [`Reader::metrics`](crate::Reader::metrics) from `since_ms`;
/// `latest_dead` the `dead` (at most [`OVERVIEW_DEAD_MAX`]) most recently dead jobs, newest
/// first.
///
/// # Errors
/// Those of the reads: `Storage`; `Corrupted` for a damaged rate-limit row.
pub fn overview(
    q: &crate::Reader,
    now_ms: u64,
    since_ms: u64,
    dead: usize,
) -> crate::Result<serde_json::Value> {
    let ready = q.jobs(JobState::Ready, None, OVERVIEW_READY_LOOKED_AT)?;
    let oldest_ready_ms = ready
        .jobs
        .iter()
        .map(|j| now_ms.saturating_sub(j.run_at_ms))
        .max();
    let minutes: Vec<serde_json::Value> = q.metrics(since_ms)?.iter().map(minute).collect();
    let dead = dead.min(OVERVIEW_DEAD_MAX);
    let latest = if dead == 0 {
        Vec::new()
    } else {
        q.latest_dead(dead)?
    };
    let latest_dead: Vec<serde_json::Value> = latest
        .iter()
        .map(|j| {
            serde_json::json!({
                "id": j.id.0, "died_ms": j.died_ms, "last_error": j.last_error,
            })
        })
        .collect();
    Ok(serde_json::json!({
        "queue": q.name(),
        "stats": stats(q)?,
        "oldest_ready_ms": oldest_ready_ms,
        "rate_limited_until_ms": q.rate_limited_until(now_ms)?,
        "minutes": minutes,
        "latest_dead": latest_dead,
    }))
}

/// One minute of a queue's metrics in JSON: `{"minute_ms":..,"enqueued":..,"completed":..,
/// "retried":..,"dead":..,"cancelled":..,"dropped":..,"runs":..,"run_ms_p50":..,"run_ms_p95":..}`.
pub fn minute(m: &crate::MinuteCounts) -> serde_json::Value {
    serde_json::json!({
        "minute_ms": m.minute_ms, "enqueued": m.enqueued, "completed": m.completed,
        "retried": m.retried, "dead": m.dead, "cancelled": m.cancelled, "dropped": m.dropped,
        "runs": m.runs, "run_ms_p50": m.run_ms_p50, "run_ms_p95": m.run_ms_p95,
    })
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// The bytes of a hex text (either case, even length).
pub fn unhex(text: &str) -> Result<Vec<u8>, String> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", t.len()));
    }
    t.chunks_exact(2)
        .enumerate()
        .map(|(i, pair)| match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
            _ => Err(format!("not a hex digit at offset {}", i * 2)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)).unwrap(), all);
        assert_eq!(unhex("ABff").unwrap(), vec![0xab, 0xff]);
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
    }

    /// A job's own execution timeout goes out in its export line and comes back at import,
    /// as its lease does; a line of a job without one has no `timeout_ms` key.
    #[test]
    fn an_exported_timeout_is_imported_back() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| crate::queue::Queue::open(dir.path().join(name)).unwrap();
        let (from, to) = (open("from.leaseq"), open("to.leaseq"));
        let opts = crate::job::EnqueueOptions::default()
            .lease(std::time::Duration::from_millis(7_000))
            .timeout(std::time::Duration::from_millis(2_500));
        let timed = from.enqueue(b"timed", opts).unwrap().id();
        let plain = from.enqueue(b"plain", Default::default()).unwrap().id();
        let line_of = |id| {
            let info = from.job(id).unwrap().unwrap();
            let payload = from.payload(id).unwrap().unwrap();
            serde_json::to_string(&JobLine::from_info(None, &info, Some(&payload))).unwrap()
        };
        let (timed_line, plain_line) = (line_of(timed), line_of(plain));
        assert!(timed_line.contains("\"timeout_ms\":2500"), "{timed_line}");
        assert!(!plain_line.contains("timeout_ms"), "{plain_line}");
        let mut jobs = Vec::new();
        for line in [&timed_line, &plain_line] {
            let parsed: JobLine = serde_json::from_str(line).unwrap();
            jobs.push(parsed.to_import().unwrap().0);
        }
        let ids: Vec<_> = to
            .import_batch(&jobs)
            .unwrap()
            .iter()
            .map(|e| e.id())
            .collect();
        let back = |id| to.job(id).unwrap().unwrap();
        assert_eq!(
            (back(ids[0]).timeout_ms, back(ids[0]).lease_ms),
            (Some(2_500), Some(7_000))
        );
        assert_eq!(back(ids[1]).timeout_ms, None);
        // The line of the imported job is the source's, but for its id.
        let again = JobLine::from_info(None, &back(ids[0]), Some(b"timed"));
        let first: JobLine = serde_json::from_str(&timed_line).unwrap();
        assert_eq!(
            JobLine {
                id: first.id,
                ..again
            },
            first
        );
    }
}
