//! An export line back to an [`ImportJob`].

use std::time::Duration;

use crate::{Encoding, EnqueueOptions, ImportJob, JobState, RetryPolicy};

use super::{JobLine, RetryJson, bytes_of, unhex};

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

impl JobLine {
    /// This line as a job to import ([`Queue::import_batch`](crate::Queue::import_batch)),
    /// and its payload's length in bytes.
    ///
    /// # Errors
    /// A sentence naming the field, for what the schema does not allow: no payload or two,
    /// a text and a hex form of one field both given, bad hex, an unknown state (`ready`,
    /// `leased`, `scheduled`, `dead`), retry kind or encoding. The values themselves are
    /// checked when the job is imported.
    pub fn to_import(&self) -> Result<(ImportJob, usize), String> {
        import_job(self.clone())
    }
}

fn import_job(line: JobLine) -> Result<(ImportJob, usize), String> {
    let payload = match (line.payload_utf8, line.payload_hex) {
        (Some(_), Some(_)) => return Err("both payload_utf8 and payload_hex are given".into()),
        (None, None) => return Err("no payload (payload_utf8 or payload_hex)".into()),
        (Some(text), None) => text.into_bytes(),
        (None, Some(h)) => unhex(&h).map_err(|e| format!("payload_hex: {e}"))?,
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
    if let Some(ms) = line.timeout_ms {
        opts = opts.timeout(Duration::from_millis(ms));
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
