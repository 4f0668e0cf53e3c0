//! Input validation and record building: every refusal of bad input happens here, before an
//! operation's first write.

use crate::error::{Error, Result};
use crate::format::record::{JobRecord, StoredState};
use crate::job::{EnqueueOptions, JobState, OnDuplicate};
use crate::limits::REASON_BYTES_MAX;

use super::QueueConfig;

/// The error a lease returned at open records: its process died holding it.
pub(crate) const REASON_ABANDONED: &str =
    "lease abandoned: still held when the file was closed or its process exited";

pub(crate) fn truncate_reason(reason: &str) -> String {
    if reason.len() <= REASON_BYTES_MAX {
        return reason.to_string();
    }
    let mut end = REASON_BYTES_MAX;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

/// The error of a call aimed at one job whose row is damaged.
pub(super) fn damaged(id: u64, why: &str) -> Error {
    Error::corrupted(format!(
        "job {id}: record damaged ({why}); a dequeue quarantines it when it meets it (ready, \
         due or expired), or delete it with Queue::remove"
    ))
}

/// Validates a number of attempts (a builder's, a handle's or a job's): 1 to
/// `MAX_ATTEMPTS_CAP`.
pub(crate) fn validate_max_attempts(max_attempts: u32) -> Result<u32> {
    if max_attempts == 0 || max_attempts > crate::limits::MAX_ATTEMPTS_CAP {
        return Err(Error::invalid_option(
            "max_attempts",
            format!(
                "{max_attempts} is outside 1..={}",
                crate::limits::MAX_ATTEMPTS_CAP
            ),
        ));
    }
    Ok(max_attempts)
}

/// Validates a lease duration option: 1 ms to `LEASE_MAX`, whole milliseconds.
pub(crate) fn validate_lease_ms(field: &'static str, d: std::time::Duration) -> Result<u64> {
    let ms = crate::clock::duration_ms(d);
    if ms == 0 {
        return Err(Error::invalid_option(field, "must be at least 1 ms"));
    }
    if d > crate::limits::LEASE_MAX {
        return Err(Error::invalid_option(
            field,
            format!(
                "{ms} ms is above the cap of {} ms",
                crate::limits::LEASE_MAX.as_millis()
            ),
        ));
    }
    Ok(ms)
}

pub(crate) fn validate_key(field: &'static str, key: Option<&Vec<u8>>) -> Result<()> {
    match key {
        Some(k) if k.len() > crate::limits::KEY_BYTES_MAX => Err(Error::KeyTooLong {
            field,
            size_bytes: k.len(),
            limit_bytes: crate::limits::KEY_BYTES_MAX,
        }),
        Some(k) if k.is_empty() => Err(Error::invalid_option(field, "must not be empty")),
        _ => Ok(()),
    }
}

/// A validated enqueue: the record to add, and what to do if its dedup key is held.
#[derive(Debug, Clone)]
pub(crate) struct NewJob {
    pub record: JobRecord,
    pub on_duplicate: OnDuplicate,
    /// A key held by a window has the window's end moved to now plus this record's window
    /// ([`EnqueueOptions::extend_dedup_window`]).
    pub extend_window: bool,
}

/// Validates a batch of enqueues (1 to `BATCH_MAX` jobs) and builds their records.
pub(crate) fn new_records<'p>(
    config: &QueueConfig,
    now_ms: u64,
    jobs: impl IntoIterator<Item = (&'p [u8], EnqueueOptions)>,
) -> Result<Vec<NewJob>> {
    let mut records = Vec::new();
    for (payload, opts) in jobs {
        if records.len() == crate::limits::BATCH_MAX {
            return Err(Error::invalid_option(
                "jobs",
                format!("a batch holds 1 to {} items", crate::limits::BATCH_MAX),
            ));
        }
        if opts.on_duplicate != OnDuplicate::Keep && opts.dedup_key.is_none() {
            return Err(Error::invalid_option("on_duplicate", "needs a dedup key"));
        }
        records.push(NewJob {
            record: new_record(config, now_ms, payload, &opts)?,
            on_duplicate: opts.on_duplicate,
            extend_window: opts.extend_dedup_window,
        });
    }
    if records.is_empty() {
        return Err(Error::invalid_option("jobs", "the batch is empty"));
    }
    Ok(records)
}

/// Validates one imported job and builds its record: as [`new_record`], then its state and
/// history as given, checked against the record's invariants.
pub(crate) fn import_record(
    config: &QueueConfig,
    now_ms: u64,
    job: &crate::job::ImportJob,
) -> Result<JobRecord> {
    let opts = EnqueueOptions {
        delay: None,
        encoding: job.encoding,
        ..job.options.clone()
    };
    let mut record = new_record(config, now_ms, &job.payload, &opts)?;
    record.created_ms = job.created_ms.unwrap_or(now_ms);
    record.attempts = job.attempts;
    record.snoozes = job.snoozes;
    if let Some(e) = job.last_error.as_deref() {
        // The attempt that ended with it: the last one made.
        record.push_error(job.attempts, None, truncate_reason(e));
    }
    record.run_at_ms = job.run_at_ms.unwrap_or(now_ms);
    let left = job.attempts < record.max_attempts;
    record.state = match job.state {
        JobState::Ready | JobState::Scheduled if !left => {
            return Err(Error::invalid_option(
                "attempts",
                format!(
                    "{} of {} made: a job still to run needs one left",
                    job.attempts, record.max_attempts
                ),
            ));
        }
        JobState::Ready => StoredState::Ready,
        JobState::Scheduled => StoredState::Scheduled,
        // A lease that ended without an ack, as the reopen after a crash returns it.
        JobState::Leased => {
            record.run_at_ms = now_ms;
            record.push_error(job.attempts, Some(now_ms), REASON_ABANDONED.to_string());
            if left {
                StoredState::Ready
            } else {
                StoredState::Dead
            }
        }
        JobState::Dead => StoredState::Dead,
        JobState::Completed | JobState::Cancelled => {
            return Err(Error::invalid_option(
                "state",
                format!("{:?}: only live jobs are imported", job.state),
            ));
        }
    };
    record
        .check_invariants()
        .map_err(|e| Error::invalid_option("job", e.to_string()))?;
    Ok(record)
}

/// Validates one enqueue and builds its record (state and run_at set, id not yet known).
pub(crate) fn new_record(
    config: &QueueConfig,
    now_ms: u64,
    payload: &[u8],
    opts: &EnqueueOptions,
) -> Result<JobRecord> {
    if payload.len() > config.payload_bytes_max {
        return Err(Error::PayloadTooLarge {
            size_bytes: payload.len(),
            limit_bytes: config.payload_bytes_max,
        });
    }
    validate_key("idempotency_key", opts.idempotency_key.as_ref())?;
    validate_key("dedup_key", opts.dedup_key.as_ref())?;
    validate_key("group", opts.group.as_ref())?;
    let max_attempts = validate_max_attempts(opts.max_attempts.unwrap_or(config.max_attempts))?;
    let lease_ms = opts
        .lease
        .map(|d| validate_lease_ms("lease", d))
        .transpose()?;
    // The same bounds as a lease, and as a pool's `job_timeout`.
    let timeout_ms = opts
        .timeout
        .map(|d| validate_lease_ms("timeout", d))
        .transpose()?;
    let delay_ms = match opts.delay {
        Some(d) if d > crate::limits::DELAY_MAX => {
            return Err(Error::invalid_option(
                "delay",
                format!(
                    "above the cap of {} ms",
                    crate::limits::DELAY_MAX.as_millis()
                ),
            ));
        }
        Some(d) => crate::clock::duration_ms(d),
        None => 0,
    };
    let run_at_ms = now_ms
        .checked_add(delay_ms)
        .ok_or_else(|| Error::invalid_option("delay", "due time overflows"))?;
    if let Some(p) = &opts.retry {
        p.validate("retry")?;
    }
    let dedup_window_ms = match opts.dedup_window {
        None => None,
        Some(_) if opts.dedup_key.is_none() => {
            return Err(Error::invalid_option("dedup_window", "needs a dedup key"));
        }
        // In whole milliseconds: 500 µs would be a window of 0.
        Some(w) if crate::clock::duration_ms(w) == 0 || w > crate::limits::DELAY_MAX => {
            return Err(Error::invalid_option(
                "dedup_window",
                format!(
                    "{} ms is outside 1 ms to {} ms (DELAY_MAX)",
                    w.as_millis(),
                    crate::limits::DELAY_MAX.as_millis()
                ),
            ));
        }
        Some(w) => Some(crate::clock::duration_ms(w)),
    };
    if dedup_window_ms.is_some_and(|w| now_ms.checked_add(w).is_none()) {
        return Err(Error::invalid_option("dedup_window", "its end overflows"));
    }
    if opts.dedup_until_started && (opts.dedup_key.is_none() || dedup_window_ms.is_some()) {
        return Err(Error::invalid_option(
            "dedup_until_started",
            "needs a dedup key, and no dedup window",
        ));
    }
    if opts.extend_dedup_window && dedup_window_ms.is_none() {
        return Err(Error::invalid_option(
            "extend_dedup_window",
            "needs a dedup window (whose length it uses)",
        ));
    }
    Ok(JobRecord {
        state: if delay_ms > 0 {
            StoredState::Scheduled
        } else {
            StoredState::Ready
        },
        priority: opts.priority,
        run_at_ms,
        attempts: 0,
        max_attempts,
        lease_ms,
        created_ms: now_ms,
        seq: 0,
        idempotency_key: opts.idempotency_key.clone(),
        dedup_key: opts.dedup_key.clone(),
        errors: Vec::new(),
        payload: payload.to_vec(),
        retry: opts
            .retry
            .as_ref()
            .map(crate::format::record::StoredRetry::new),
        dedup_window_ms,
        payload_apart: None,
        snoozes: 0,
        encoding: opts.encoding.map(crate::format::payload::Encoding::tag),
        status: None,
        dedup_until_started: opts.dedup_until_started,
        progress: None,
        group: opts.group.clone(),
        // Taken when the job is added (`enqueue`).
        group_order: 0,
        timeout_ms,
    })
}
