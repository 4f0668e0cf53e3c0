//! Between leaseq's types and their JSON form: the fields an export line carries beyond the
//! basic ones (the job's own lease, retry policy, dedup window, snoozes, encoding), and an
//! export line back to an [`ImportJob`].

use std::time::Duration;

use leaseq::{Encoding, EnqueueOptions, ImportJob, JobInfo, JobState, RetryPolicy};

use crate::jsonl::{JobLine, RetryJson, bytes_of};

/// The fields of a job that the export carries besides the basic ones.
#[derive(Debug, Default)]
pub struct Extra {
    /// The job's own dedup window.
    pub dedup_window_ms: Option<u64>,
    /// The job's own lease.
    pub lease_ms: Option<u64>,
    /// The job's own retry policy.
    pub retry: Option<RetryJson>,
    /// Times snoozed.
    pub snoozes: u32,
    /// The codec of a typed payload.
    pub encoding: Option<String>,
}

/// The extra fields of `info`.
pub fn extra(info: &JobInfo) -> Extra {
    Extra {
        dedup_window_ms: info.dedup_window_ms,
        lease_ms: info.lease_ms,
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

fn retry_policy(r: &RetryJson) -> Result<RetryPolicy, String> {
    let base = Duration::from_millis(r.base_ms);
    let policy = match r.kind.as_str() {
        "immediate" => RetryPolicy::immediate(),
        "fixed" => RetryPolicy::fixed(base),
        "exponential" => RetryPolicy::exponential(base, Duration::from_millis(r.cap_ms)),
        other => {
            return Err(format!(
                "retry: unknown kind {other:?} (immediate, fixed or exponential)"
            ));
        }
    };
    Ok(if r.jitter_percent > 0 {
        policy.with_jitter(r.jitter_percent)
    } else {
        policy
    })
}

fn encoding_name(e: Encoding) -> &'static str {
    match e {
        Encoding::Bincode => "bincode",
        Encoding::Json => "json",
        _ => "unknown",
    }
}

fn encoding_of(name: &str) -> Result<Encoding, String> {
    match name {
        "bincode" => Ok(Encoding::Bincode),
        "json" => Ok(Encoding::Json),
        other => Err(format!("encoding: unknown {other:?} (bincode or json)")),
    }
}

fn state_of(name: &str) -> Result<JobState, String> {
    match name {
        "ready" | "leased" => Ok(JobState::Ready),
        "scheduled" => Ok(JobState::Scheduled),
        "dead" => Ok(JobState::Dead),
        other => Err(format!(
            "state: unknown {other:?} (ready, scheduled or dead)"
        )),
    }
}

/// An export line as a job to import, and its payload's length. Refuses what the schema
/// does not allow (no payload or two, bad hex, an unknown state, retry kind or encoding);
/// the library checks the values when the job is imported.
pub fn import_job(line: JobLine) -> Result<(ImportJob, usize), String> {
    let payload = match (line.payload_utf8, line.payload_hex) {
        (Some(_), Some(_)) => return Err("both payload_utf8 and payload_hex are given".into()),
        (None, None) => return Err("no payload (payload_utf8 or payload_hex)".into()),
        (Some(text), None) => text.into_bytes(),
        (None, Some(h)) => crate::output::unhex(&h).map_err(|e| format!("payload_hex: {e}"))?,
    };
    let mut opts = EnqueueOptions::default();
    if let Some(p) = line.priority {
        opts = opts.priority(p);
    }
    if let Some(n) = line.max_attempts {
        opts = opts.max_attempts(n);
    }
    if let Some(ms) = line.lease_ms {
        opts = opts.lease(Duration::from_millis(ms));
    }
    if let Some(r) = &line.retry {
        opts = opts.retry(retry_policy(r)?);
    }
    if let Some(k) = bytes_of(
        "idempotency_key",
        line.idempotency_key.as_deref(),
        line.idempotency_key_hex.as_deref(),
    )? {
        opts = opts.idempotency_key(k);
    }
    if let Some(k) = bytes_of(
        "dedup_key",
        line.dedup_key.as_deref(),
        line.dedup_key_hex.as_deref(),
    )? {
        opts = opts.dedup_key(k);
    }
    if let Some(ms) = line.dedup_window_ms {
        opts = opts.dedup_window(Duration::from_millis(ms));
    }
    if let Some(g) = bytes_of("group", line.group.as_deref(), line.group_hex.as_deref())? {
        opts = opts.group(g);
    }
    let state = match line.state.as_deref() {
        None => JobState::Ready,
        Some(s) => state_of(s)?,
    };
    let encoding = line.encoding.as_deref().map(encoding_of).transpose()?;
    let payload_bytes = payload.len();
    let mut job = ImportJob::new(payload)
        .options(opts)
        .state(state)
        .attempts(line.attempts.unwrap_or(0))
        .snoozes(line.snoozes.unwrap_or(0))
        .last_error(line.last_error)
        .encoding(encoding);
    if let Some(ms) = line.run_at_ms {
        job = job.run_at_ms(ms);
    }
    if let Some(ms) = line.created_ms {
        job = job.created_ms(ms);
    }
    Ok((job, payload_bytes))
}
