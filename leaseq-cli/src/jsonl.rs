//! The JSON form of a job: the line of `leaseq export` and `leaseq import`, and (with a few
//! fields more) the objects of `ls --json` and `show --json`.
//!
//! One job per line. docs/cli.md holds the schema (every field, its type and meaning, how
//! bytes are written, what import defaults and refuses); the serde structs below are its
//! source, so a field added here goes into that table too.

use serde::{Deserialize, Serialize};

use leaseq::{JobInfo, JobState};

use crate::output::{hex, state_name, unhex};

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
        let extra = crate::convert::extra(info);
        JobLine {
            queue: queue.map(str::to_string),
            id: Some(info.id.0),
            state: Some(state_name(state).to_string()),
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

/// `ls --json` and `show --json`: the export line (`state` as the job is: `leased` stays
/// leased) and what only an open file knows.
#[derive(Debug, Serialize)]
pub struct JobView {
    /// The export fields.
    #[serde(flatten)]
    pub line: JobLine,
    /// The payload's length in bytes.
    pub payload_bytes: usize,
    /// Dead: when it died (Unix ms).
    pub died_ms: Option<u64>,
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
    pub result_hex: Option<String>,
    /// The progress its (last) delivery recorded, as text or hex, and when (Unix ms).
    pub progress: Option<String>,
    pub progress_hex: Option<String>,
    pub progress_ms: Option<u64>,
    /// The errors of its last attempts, oldest first.
    pub errors: Vec<ErrorView>,
}

/// One attempt's error in a [`JobView`].
#[derive(Debug, Serialize)]
pub struct ErrorView {
    pub attempt: u32,
    pub at_ms: Option<u64>,
    pub message: String,
}

impl JobView {
    /// The view of `info` in `queue`, with its payload if given.
    pub fn new(queue: Option<&str>, info: &JobInfo, payload: Option<&[u8]>) -> JobView {
        let mut line = JobLine::from_info(queue, info, payload);
        line.state = Some(state_name(info.state).to_string());
        line.last_error.clone_from(&info.last_error);
        JobView {
            line,
            payload_bytes: info.payload_bytes,
            died_ms: info.died_ms,
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
