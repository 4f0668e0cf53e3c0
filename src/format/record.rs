//! The job record: what one row of `leaseq_jobs` holds, its versions, and its checked
//! encode and decode. docs/format.md describes the bytes and the version history.
//!
//! Records read from disk are checked before use: a version byte, a checksum (redb checks its
//! pages only when it repairs, so a flipped payload byte would otherwise pass unseen), a decode
//! limit so no length field can make leaseq allocate more than the record's own size, and the
//! invariants of [`JobRecord::check_invariants`].
//!
//! Payloads of more than [`PAYLOAD_INLINE_MAX`] bytes are stored apart from the record, in
//! `leaseq_payloads` under the job id, with their length and checksum in the record
//! ([`PayloadRef`]), as PostgreSQL's TOAST keeps large values out of the row: a state change
//! (dequeue, extend, nack, expiry, recovery) rewrites the record only, a number of bytes
//! that does not grow with the payload.

use bincode::config::{self, Configuration, Fixint, Limit, LittleEndian};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::payload::Encoding;
use crate::job::JobState;
use crate::limits::{
    ERRORS_KEPT, PAYLOAD_INLINE_MAX, PROGRESS_BYTES_MAX, REASON_BYTES_MAX, RECORD_BYTES_MAX,
    RESULT_BYTES_MAX,
};
use crate::retry::{RetryKind, RetryPolicy};

mod layout;
mod v6;

/// First byte of every encoded record. Version 8 is version 7's layout with one more flagged
/// field (`timeout_ms`); both are read by `layout`.
const RECORD_VERSION: u8 = 8;

type RecordConfig = Configuration<LittleEndian, Fixint, Limit<RECORD_BYTES_MAX>>;

fn record_config() -> RecordConfig {
    config::standard()
        .with_fixed_int_encoding()
        .with_limit::<RECORD_BYTES_MAX>()
}

/// Where a job is, as stored. Lease token and deadline live here, so a fencing check is one
/// read of the job's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum StoredState {
    Scheduled,
    Ready,
    Leased {
        token: u64,
        deadline_ms: u64,
    },
    Dead,
    /// Acked, and kept in the queue's completed history, with the result the ack stored.
    Completed {
        result: Option<Vec<u8>>,
    },
    /// Cancelled with `reason`. `fenced_until_ms`: the deadline of the lease the cancel
    /// fenced (the row is kept at least until then, so that lease's calls are answered
    /// `Cancelled`), or when the job was cancelled if it was not leased.
    Cancelled {
        reason: String,
        fenced_until_ms: u64,
    },
}

impl StoredState {
    pub(crate) fn job_state(&self) -> JobState {
        match self {
            StoredState::Scheduled => JobState::Scheduled,
            StoredState::Ready => JobState::Ready,
            StoredState::Leased { .. } => JobState::Leased,
            StoredState::Dead => JobState::Dead,
            StoredState::Completed { .. } => JobState::Completed,
            StoredState::Cancelled { .. } => JobState::Cancelled,
        }
    }

    /// Scheduled, ready or leased: neither dead nor ended.
    pub(crate) fn is_live(&self) -> bool {
        matches!(
            self,
            StoredState::Scheduled | StoredState::Ready | StoredState::Leased { .. }
        )
    }

    /// Whether the job has ended for good (completed or cancelled): it is in the history.
    pub(crate) fn is_ended(&self) -> bool {
        matches!(
            self,
            StoredState::Completed { .. } | StoredState::Cancelled { .. }
        )
    }
}

/// One attempt's error, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredError {
    /// The attempt it ended (1 for the first delivery).
    pub attempt: u32,
    /// When (Unix ms); `None` for an error recorded before record version 5 (or imported
    /// without a time).
    pub at_ms: Option<u64>,
    pub message: String,
}

/// One row of `leaseq_jobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JobRecord {
    pub state: StoredState,
    pub priority: i32,
    /// Scheduled: due time. Ready: when it became available (its place in line).
    pub run_at_ms: u64,
    pub attempts: u32,
    pub max_attempts: u32,
    /// This job's lease duration; `None` uses the queue's default at dequeue time.
    pub lease_ms: Option<u64>,
    pub created_ms: u64,
    /// Ready: its place in line within its priority (from the sequence counter shared with
    /// lease tokens; assigned each time the job becomes ready).
    pub seq: u64,
    pub idempotency_key: Option<Vec<u8>>,
    pub dedup_key: Option<Vec<u8>>,
    /// The errors of its last attempts that ended badly, oldest first, at most
    /// [`ERRORS_KEPT`]; the last is the job's last error.
    pub errors: Vec<StoredError>,
    pub payload: Vec<u8>,
    /// This job's retry policy; `None` uses the queue's.
    pub retry: Option<StoredRetry>,
    /// How long after `created_ms` the dedup key is held, whatever happens to the job;
    /// `None`: while the job is live.
    pub dedup_window_ms: Option<u64>,
    /// Set when the payload is stored apart (`leaseq_payloads`); `payload` is then empty.
    pub payload_apart: Option<PayloadRef>,
    /// Times the job was snoozed (given back without charging the attempt).
    pub snoozes: u32,
    /// How a typed payload was encoded ([`Encoding::tag`]); `None` for raw bytes.
    pub encoding: Option<u8>,
    /// Why the job was last snoozed, kept until its next delivery (a UI's "waiting for
    /// network"), apart from its last error.
    pub status: Option<String>,
    /// The dedup key is held only until the job is first delivered: the dequeue releases it
    /// and clears `dedup_key`.
    pub dedup_until_started: bool,
    /// The last progress its running delivery recorded (`Lease::set_progress`), kept until
    /// its next delivery. Since record version 6.
    pub progress: Option<StoredProgress>,
    /// The ordered group it belongs to (`EnqueueOptions::group`): at most one job of a group
    /// is delivered at a time, in `group_order`. Since record version 6.
    pub group: Option<Vec<u8>>,
    /// Its place in its group (from the sequence counter, taken when it joined: at enqueue,
    /// or when a requeue or retry brought it back to the end of the group); 0 without a
    /// group. Since record version 6.
    pub group_order: u64,
    /// This job's execution timeout in a worker pool (`EnqueueOptions::timeout`), 1 ms to
    /// `LEASE_MAX`; `None` uses the pool's. Since record version 8. Not a serde field: the
    /// bincode forms (versions 1 to 6) never held it.
    #[serde(skip)]
    pub timeout_ms: Option<u64>,
}

/// A running job's progress, as stored: when it was recorded (Unix ms) and its bytes (at
/// most [`PROGRESS_BYTES_MAX`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredProgress {
    pub at_ms: u64,
    pub value: Vec<u8>,
}

/// A job record of record version 4: [`JobRecord`] with one `last_error` for `errors`, and
/// without `status` and `dedup_until_started`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct JobRecordV4 {
    state: StoredState,
    priority: i32,
    run_at_ms: u64,
    attempts: u32,
    max_attempts: u32,
    lease_ms: Option<u64>,
    created_ms: u64,
    seq: u64,
    idempotency_key: Option<Vec<u8>>,
    dedup_key: Option<Vec<u8>>,
    last_error: Option<String>,
    payload: Vec<u8>,
    retry: Option<StoredRetry>,
    dedup_window_ms: Option<u64>,
    payload_apart: Option<PayloadRef>,
    snoozes: u32,
    encoding: Option<u8>,
}

/// The error history of a record older than version 5: its one last error, without a time,
/// counted to the attempt that ended with it (the one before a lease in progress).
fn errors_from_last(
    last_error: Option<String>,
    state: &StoredState,
    attempts: u32,
) -> Vec<StoredError> {
    let attempt = match state {
        StoredState::Leased { .. } => attempts.saturating_sub(1),
        _ => attempts,
    };
    last_error
        .map(|message| StoredError {
            attempt,
            at_ms: None,
            message,
        })
        .into_iter()
        .collect()
}

impl From<JobRecordV4> for JobRecord {
    fn from(r: JobRecordV4) -> JobRecord {
        JobRecord {
            errors: errors_from_last(r.last_error, &r.state, r.attempts),
            state: r.state,
            priority: r.priority,
            run_at_ms: r.run_at_ms,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_ms: r.lease_ms,
            created_ms: r.created_ms,
            seq: r.seq,
            idempotency_key: r.idempotency_key,
            dedup_key: r.dedup_key,
            payload: r.payload,
            retry: r.retry,
            dedup_window_ms: r.dedup_window_ms,
            payload_apart: r.payload_apart,
            snoozes: r.snoozes,
            encoding: r.encoding,
            status: None,
            dedup_until_started: false,
            progress: None,
            group: None,
            group_order: 0,
            timeout_ms: None,
        }
    }
}

/// A job record of record version 3: [`JobRecord`] without `snoozes` and `encoding`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct JobRecordV3 {
    state: StoredState,
    priority: i32,
    run_at_ms: u64,
    attempts: u32,
    max_attempts: u32,
    lease_ms: Option<u64>,
    created_ms: u64,
    seq: u64,
    idempotency_key: Option<Vec<u8>>,
    dedup_key: Option<Vec<u8>>,
    last_error: Option<String>,
    payload: Vec<u8>,
    retry: Option<StoredRetry>,
    dedup_window_ms: Option<u64>,
    payload_apart: Option<PayloadRef>,
}

impl From<JobRecordV3> for JobRecord {
    fn from(r: JobRecordV3) -> JobRecord {
        JobRecord {
            errors: errors_from_last(r.last_error, &r.state, r.attempts),
            state: r.state,
            priority: r.priority,
            run_at_ms: r.run_at_ms,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_ms: r.lease_ms,
            created_ms: r.created_ms,
            seq: r.seq,
            idempotency_key: r.idempotency_key,
            dedup_key: r.dedup_key,
            payload: r.payload,
            retry: r.retry,
            dedup_window_ms: r.dedup_window_ms,
            payload_apart: r.payload_apart,
            snoozes: 0,
            encoding: None,
            status: None,
            dedup_until_started: false,
            progress: None,
            group: None,
            group_order: 0,
            timeout_ms: None,
        }
    }
}

/// A payload stored apart from its record: its length and checksum, checked when it is read
/// back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PayloadRef {
    pub len: u64,
    pub checksum: u64,
    /// How `checksum` was computed: records before version 7 (bincode, which never wrote this
    /// field) hold FNV-1a 64; a version-7 record says which, so a payload stored under an
    /// older record keeps its checksum when the record is rewritten.
    #[serde(skip)]
    pub sum: PayloadSum,
}

/// The checksum of a payload stored apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PayloadSum {
    /// FNV-1a 64, of records before version 7.
    #[default]
    Fnv1a64,
    /// XXH3-64, of payloads stored apart since record version 7.
    Xxh3,
}

impl PayloadRef {
    pub(crate) fn of(payload: &[u8]) -> PayloadRef {
        PayloadRef {
            len: payload.len() as u64,
            checksum: xxh3_64(payload),
            sum: PayloadSum::Xxh3,
        }
    }

    /// Checks payload bytes read back from `leaseq_payloads` against this reference.
    pub(crate) fn verify(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 != self.len {
            return Err(Error::corrupted(format!(
                "payload: {} bytes stored, the record says {}",
                bytes.len(),
                self.len
            )));
        }
        let sum = match self.sum {
            PayloadSum::Fnv1a64 => fnv1a64(bytes),
            PayloadSum::Xxh3 => xxh3_64(bytes),
        };
        if sum != self.checksum {
            return Err(Error::corrupted("payload: checksum mismatch"));
        }
        Ok(())
    }
}

/// A job record of record version 2: [`JobRecord`] without `payload_apart`.
#[derive(Deserialize)]
struct JobRecordV2 {
    state: StoredState,
    priority: i32,
    run_at_ms: u64,
    attempts: u32,
    max_attempts: u32,
    lease_ms: Option<u64>,
    created_ms: u64,
    seq: u64,
    idempotency_key: Option<Vec<u8>>,
    dedup_key: Option<Vec<u8>>,
    last_error: Option<String>,
    payload: Vec<u8>,
    retry: Option<StoredRetry>,
    dedup_window_ms: Option<u64>,
}

impl From<JobRecordV2> for JobRecord {
    fn from(r: JobRecordV2) -> JobRecord {
        JobRecord {
            errors: errors_from_last(r.last_error, &r.state, r.attempts),
            state: r.state,
            priority: r.priority,
            run_at_ms: r.run_at_ms,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_ms: r.lease_ms,
            created_ms: r.created_ms,
            seq: r.seq,
            idempotency_key: r.idempotency_key,
            dedup_key: r.dedup_key,
            payload: r.payload,
            retry: r.retry,
            dedup_window_ms: r.dedup_window_ms,
            payload_apart: None,
            snoozes: 0,
            encoding: None,
            status: None,
            dedup_until_started: false,
            progress: None,
            group: None,
            group_order: 0,
            timeout_ms: None,
        }
    }
}

/// A job record of record version 1: [`JobRecord`] without its last two fields.
#[derive(Deserialize)]
struct JobRecordV1 {
    state: StoredState,
    priority: i32,
    run_at_ms: u64,
    attempts: u32,
    max_attempts: u32,
    lease_ms: Option<u64>,
    created_ms: u64,
    seq: u64,
    idempotency_key: Option<Vec<u8>>,
    dedup_key: Option<Vec<u8>>,
    last_error: Option<String>,
    payload: Vec<u8>,
}

impl From<JobRecordV1> for JobRecord {
    fn from(r: JobRecordV1) -> JobRecord {
        JobRecord {
            errors: errors_from_last(r.last_error, &r.state, r.attempts),
            state: r.state,
            priority: r.priority,
            run_at_ms: r.run_at_ms,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_ms: r.lease_ms,
            created_ms: r.created_ms,
            seq: r.seq,
            idempotency_key: r.idempotency_key,
            dedup_key: r.dedup_key,
            payload: r.payload,
            retry: None,
            dedup_window_ms: None,
            payload_apart: None,
            snoozes: 0,
            encoding: None,
            status: None,
            dedup_until_started: false,
            progress: None,
            group: None,
            group_order: 0,
            timeout_ms: None,
        }
    }
}

/// A job's own retry policy as stored: `kind` 0 immediate, 1 fixed, 2 exponential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredRetry {
    kind: u8,
    base_ms: u64,
    cap_ms: u64,
    jitter_percent: u8,
}

impl StoredRetry {
    pub(crate) fn new(p: &RetryPolicy) -> StoredRetry {
        StoredRetry {
            kind: match p.kind {
                RetryKind::Immediate => 0,
                RetryKind::Fixed => 1,
                RetryKind::Exponential => 2,
            },
            base_ms: p.base_ms,
            cap_ms: p.cap_ms,
            jitter_percent: p.jitter_percent,
        }
    }

    /// The policy, if the stored one is valid.
    pub(crate) fn policy(&self) -> Result<RetryPolicy> {
        let kind = match self.kind {
            0 => RetryKind::Immediate,
            1 => RetryKind::Fixed,
            2 => RetryKind::Exponential,
            k => return Err(Error::corrupted(format!("job record: retry kind {k}"))),
        };
        let p = RetryPolicy {
            kind,
            base_ms: self.base_ms,
            cap_ms: self.cap_ms,
            jitter_percent: self.jitter_percent,
        };
        p.validate("retry")
            .map_err(|e| Error::corrupted(format!("job record: {e}")))?;
        Ok(p)
    }
}

impl JobRecord {
    /// The job's last error: the message of the newest entry of its error history.
    pub(crate) fn last_error(&self) -> Option<&str> {
        self.errors.last().map(|e| e.message.as_str())
    }

    /// Adds the error that ended attempt `attempt` at `at_ms` to the history, dropping the
    /// oldest past [`ERRORS_KEPT`]. `message` is already cut to [`REASON_BYTES_MAX`].
    pub(crate) fn push_error(&mut self, attempt: u32, at_ms: Option<u64>, message: String) {
        debug_assert!(message.len() <= REASON_BYTES_MAX);
        if self.errors.len() >= ERRORS_KEPT {
            let extra = self.errors.len() + 1 - ERRORS_KEPT;
            self.errors.drain(..extra);
        }
        self.errors.push(StoredError {
            attempt,
            at_ms,
            message,
        });
    }

    /// An ended job's key in the history index: when its row may go. When it ended, or, for
    /// a cancelled lease, that lease's deadline if later (its calls are answered
    /// `Cancelled` until then).
    pub(crate) fn history_ms(&self) -> u64 {
        match self.state {
            StoredState::Cancelled {
                fenced_until_ms, ..
            } => self.run_at_ms.max(fenced_until_ms),
            _ => self.run_at_ms,
        }
    }

    /// The payload's size in bytes, wherever it is stored.
    pub(crate) fn payload_len(&self) -> usize {
        match &self.payload_apart {
            // `check_invariants` holds it to the payload cap, which fits every target's usize.
            Some(r) => usize::try_from(r.len).unwrap_or(usize::MAX),
            None => self.payload.len(),
        }
    }

    /// Checks the invariants every stored record keeps; used before every write and after
    /// every read.
    pub(crate) fn check_invariants(&self) -> Result<()> {
        let fail = |what: &str| Err(Error::corrupted(format!("job record: {what}")));
        if self.max_attempts == 0 {
            return fail("max_attempts is 0");
        }
        if self.attempts > self.max_attempts {
            return fail("attempts above max_attempts");
        }
        if matches!(self.state, StoredState::Ready | StoredState::Scheduled)
            && self.attempts >= self.max_attempts
        {
            return fail("waiting job has no attempts left");
        }
        if matches!(self.state, StoredState::Leased { .. }) && self.attempts == 0 {
            return fail("leased job with no attempt counted");
        }
        if self.payload.len() > crate::limits::PAYLOAD_BYTES_MAX_CAP {
            return fail("payload above the cap");
        }
        if let Some(r) = &self.payload_apart
            && (!self.payload.is_empty()
                || r.len <= PAYLOAD_INLINE_MAX as u64
                || r.len > crate::limits::PAYLOAD_BYTES_MAX_CAP as u64)
        {
            return fail("payload stored apart with an inline part or a size out of range");
        }
        if let Some(r) = &self.retry {
            r.policy()?;
        }
        if self
            .encoding
            .is_some_and(|t| Encoding::from_tag(t).is_none())
        {
            return fail("unknown payload encoding");
        }
        let window_max_ms = crate::clock::duration_ms(crate::limits::DELAY_MAX);
        if self
            .dedup_window_ms
            .is_some_and(|w| w == 0 || w > window_max_ms || self.dedup_key.is_none())
        {
            return fail("dedup window out of range or without a dedup key");
        }
        if self.errors.len() > ERRORS_KEPT
            || self
                .errors
                .iter()
                .any(|e| e.message.len() > REASON_BYTES_MAX || e.attempt > self.max_attempts)
        {
            return fail("error history above its bounds");
        }
        if self
            .status
            .as_ref()
            .is_some_and(|s| s.len() > REASON_BYTES_MAX)
        {
            return fail("status above the limit");
        }
        if self
            .progress
            .as_ref()
            .is_some_and(|p| p.value.len() > PROGRESS_BYTES_MAX)
        {
            return fail("progress above the limit");
        }
        if self
            .group
            .as_ref()
            .is_some_and(|g| g.len() > crate::limits::KEY_BYTES_MAX)
        {
            return fail("group key above the limit");
        }
        if self.group.is_none() && self.group_order != 0 {
            return fail("a group order without a group");
        }
        let lease_max_ms = crate::clock::duration_ms(crate::limits::LEASE_MAX);
        if self.timeout_ms.is_some_and(|t| t == 0 || t > lease_max_ms) {
            return fail("execution timeout out of range");
        }
        match &self.state {
            StoredState::Completed { result } => {
                if result.as_ref().is_some_and(|r| r.len() > RESULT_BYTES_MAX) {
                    return fail("result above the limit");
                }
                if self.attempts == 0 {
                    return fail("completed job with no attempt counted");
                }
            }
            StoredState::Cancelled { reason, .. } if reason.len() > REASON_BYTES_MAX => {
                return fail("cancel reason above the limit");
            }
            _ => {}
        }
        if self.dedup_until_started && (self.dedup_key.is_none() || self.dedup_window_ms.is_some())
        {
            return fail("dedup held until started without a key, or with a window");
        }
        let key_too_long = |k: &Option<Vec<u8>>| {
            k.as_ref()
                .is_some_and(|k| k.len() > crate::limits::KEY_BYTES_MAX)
        };
        if key_too_long(&self.idempotency_key) || key_too_long(&self.dedup_key) {
            return fail("key above the limit");
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        debug_assert!(
            self.check_invariants().is_ok(),
            "encoding an invalid record: {self:?}"
        );
        let mut out = Vec::with_capacity(1 + layout::HEAD_BYTES + self.payload.len() + 8);
        out.push(RECORD_VERSION);
        layout::write(self, &mut out)?;
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<JobRecord> {
        if bytes.len() < 1 + 8 {
            return Err(Error::corrupted("job record: too short"));
        }
        let (checked, sum) = bytes.split_at(bytes.len() - 8);
        let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
        // Versions 7 and 8 sum with XXH3-64, older versions with FNV-1a 64: a damaged version
        // byte picks the other function, or a layout that refuses the flags, and fails as well.
        let computed = if checked[0] >= 7 {
            xxh3_64(checked)
        } else {
            fnv1a64(checked)
        };
        if computed != sum {
            return Err(Error::corrupted("job record: checksum mismatch"));
        }
        let (&version, body) = checked.split_first().expect("at least 1 byte");
        if body.len() > RECORD_BYTES_MAX {
            return Err(Error::corrupted("job record: longer than the record cap"));
        }
        let decode_error =
            |e: bincode::error::DecodeError| Error::corrupted(format!("job record decode: {e}"));
        let (record, used): (JobRecord, usize) = match version {
            8 | 7 => (layout::read(body, version)?, body.len()),
            6 | 5 => (v6::read(body, version)?, body.len()),
            4 => {
                let (v4, used): (JobRecordV4, usize) =
                    bincode::serde::decode_from_slice(body, record_config())
                        .map_err(decode_error)?;
                (v4.into(), used)
            }
            3 => {
                let (v3, used): (JobRecordV3, usize) =
                    bincode::serde::decode_from_slice(body, record_config())
                        .map_err(decode_error)?;
                (v3.into(), used)
            }
            2 => {
                let (v2, used): (JobRecordV2, usize) =
                    bincode::serde::decode_from_slice(body, record_config())
                        .map_err(decode_error)?;
                (v2.into(), used)
            }
            1 => {
                let (v1, used): (JobRecordV1, usize) =
                    bincode::serde::decode_from_slice(body, record_config())
                        .map_err(decode_error)?;
                (v1.into(), used)
            }
            _ => {
                return Err(Error::corrupted(format!(
                    "job record: unknown record version {version}"
                )));
            }
        };
        if used != body.len() {
            return Err(Error::corrupted("job record: trailing bytes"));
        }
        record.check_invariants()?;
        Ok(record)
    }
}

/// XXH3, 64-bit: the checksum of records since version 7 and of payloads they store apart,
/// against bit rot and stray writes (not an adversary). Eight bytes at a time, against
/// [`fnv1a64`]'s one.
pub(crate) fn xxh3_64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// FNV-1a, 64-bit: the checksum of records before version 7 (and of the schedule record): a
/// cheap checksum against bit rot and stray writes (not an adversary).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> JobRecord {
        JobRecord {
            state: StoredState::Leased {
                token: 9,
                deadline_ms: 1_000,
            },
            priority: -3,
            run_at_ms: 5,
            attempts: 1,
            max_attempts: 3,
            lease_ms: Some(60_000),
            created_ms: 4,
            seq: 3,
            idempotency_key: Some(b"k".to_vec()),
            dedup_key: None,
            errors: vec![StoredError {
                attempt: 0,
                at_ms: None,
                message: "boom".into(),
            }],
            payload: b"hello".to_vec(),
            retry: Some(StoredRetry::new(&RetryPolicy::fixed(
                std::time::Duration::from_secs(3),
            ))),
            dedup_window_ms: None,
            payload_apart: None,
            snoozes: 2,
            encoding: Some(1),
            status: None,
            dedup_until_started: false,
            progress: None,
            group: None,
            group_order: 0,
            timeout_ms: None,
        }
    }

    #[test]
    fn a_version_1_record_reads_without_retry_or_window() {
        #[derive(Serialize)]
        struct V1<'a> {
            state: StoredState,
            priority: i32,
            run_at_ms: u64,
            attempts: u32,
            max_attempts: u32,
            lease_ms: Option<u64>,
            created_ms: u64,
            seq: u64,
            idempotency_key: Option<&'a [u8]>,
            dedup_key: Option<&'a [u8]>,
            last_error: Option<&'a str>,
            payload: &'a [u8],
        }
        let r = record();
        let v1 = V1 {
            state: r.state.clone(),
            priority: r.priority,
            run_at_ms: r.run_at_ms,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_ms: r.lease_ms,
            created_ms: r.created_ms,
            seq: r.seq,
            idempotency_key: r.idempotency_key.as_deref(),
            dedup_key: None,
            last_error: r.last_error(),
            payload: &r.payload,
        };
        let mut bytes = vec![1u8];
        bincode::serde::encode_into_std_write(&v1, &mut bytes, record_config()).unwrap();
        bytes.extend_from_slice(&[0; 8]);
        let got = JobRecord::decode(&reseal(bytes)).unwrap();
        assert_eq!(
            got,
            JobRecord {
                retry: None,
                dedup_window_ms: None,
                snoozes: 0,
                encoding: None,
                ..r
            }
        );
    }

    #[test]
    fn a_payload_stored_apart_is_checked_by_length_and_checksum() {
        let payload = vec![7u8; PAYLOAD_INLINE_MAX + 1];
        let r = PayloadRef::of(&payload);
        r.verify(&payload).unwrap();
        let mut flipped = payload.clone();
        flipped[100] ^= 1;
        assert!(r.verify(&flipped).is_err());
        assert!(r.verify(&payload[1..]).is_err());
        let apart = JobRecord {
            payload: Vec::new(),
            payload_apart: Some(r),
            ..record()
        };
        assert_eq!(JobRecord::decode(&apart.encode().unwrap()).unwrap(), apart);
        // Apart with an inline part, or apart though small enough to be inline: refused.
        let both = JobRecord {
            payload: vec![1],
            ..apart.clone()
        };
        assert!(both.check_invariants().is_err());
        let small = JobRecord {
            payload_apart: Some(PayloadRef::of(&[1; 10])),
            ..apart
        };
        assert!(small.check_invariants().is_err());
    }

    #[test]
    fn record_round_trips() {
        let r = record();
        assert_eq!(JobRecord::decode(&r.encode().unwrap()).unwrap(), r);
        let timed = JobRecord {
            timeout_ms: Some(2_500),
            ..record()
        };
        let bytes = timed.encode().unwrap();
        assert_eq!(bytes[0], 8);
        assert_eq!(JobRecord::decode(&bytes).unwrap().timeout_ms, Some(2_500));
    }

    /// `r` as a build of record version 7 stored it: the same layout, without the timeout.
    fn encode_v7(r: &JobRecord) -> Vec<u8> {
        assert_eq!(r.timeout_ms, None, "version 7 has no timeout");
        let mut bytes = r.encode().unwrap();
        bytes[0] = 7;
        reseal(bytes)
    }

    #[test]
    fn a_version_7_record_reads_without_a_timeout() {
        let r = record();
        let old = encode_v7(&r);
        let got = JobRecord::decode(&old).unwrap();
        assert_eq!(got.timeout_ms, None);
        assert_eq!(got, r);
        // Written again, it is version 8, of the same size (no timeout, no flag).
        let new = got.encode().unwrap();
        assert_eq!((new[0], new.len()), (8, old.len()));
        // A version-7 row whose flags name a timeout is refused, not read.
        let mut timed = JobRecord {
            timeout_ms: Some(10),
            ..record()
        }
        .encode()
        .unwrap();
        timed[0] = 7;
        let err = JobRecord::decode(&reseal(timed)).unwrap_err();
        assert!(err.to_string().contains("unknown flags"), "{err}");
    }

    #[test]
    fn a_timeout_out_of_range_is_refused() {
        let lease_max_ms = crate::clock::duration_ms(crate::limits::LEASE_MAX);
        for bad in [0, lease_max_ms + 1, u64::MAX] {
            let r = JobRecord {
                timeout_ms: Some(bad),
                ..record()
            };
            assert!(r.check_invariants().is_err(), "{bad}");
            // Bytes on disk with it decode to an error, not a record.
            let mut bytes = vec![RECORD_VERSION];
            layout::write(&r, &mut bytes).unwrap();
            bytes.extend_from_slice(&[0; 8]);
            let err = JobRecord::decode(&reseal(bytes)).unwrap_err();
            assert!(err.to_string().contains("execution timeout"), "{err}");
        }
        for good in [1, lease_max_ms] {
            let r = JobRecord {
                timeout_ms: Some(good),
                ..record()
            };
            assert_eq!(JobRecord::decode(&r.encode().unwrap()).unwrap(), r);
        }
    }

    #[test]
    fn every_truncation_of_a_record_is_a_typed_error() {
        let bytes = record().encode().unwrap();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    JobRecord::decode(&bytes[..len]),
                    Err(Error::Corrupted { .. })
                ),
                "prefix of {len} bytes decoded"
            );
        }
    }

    /// Re-seals `bytes` (a record whose body was edited) with a valid checksum of its version.
    fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
        let n = bytes.len() - 8;
        let sum = if bytes[0] >= 7 {
            xxh3_64(&bytes[..n])
        } else {
            fnv1a64(&bytes[..n])
        };
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
        bytes
    }

    /// `r` as a record of version 6 would store it (bincode, FNV-1a).
    fn encode_v6(r: &JobRecord) -> Vec<u8> {
        let mut bytes = vec![6u8];
        v6::write(r, &mut bytes);
        bytes.extend_from_slice(&[0; 8]);
        reseal(bytes)
    }

    #[test]
    fn a_version_6_record_reads_as_it_was_written_and_is_rewritten_in_version_8() {
        let r = record();
        let old = encode_v6(&r);
        assert_eq!(JobRecord::decode(&old).unwrap(), r);
        let new = r.encode().unwrap();
        assert_eq!(new[0], RECORD_VERSION);
        assert_eq!(JobRecord::decode(&new).unwrap(), r);
        assert!(new.len() < old.len(), "{} >= {}", new.len(), old.len());
    }

    #[test]
    fn a_payload_apart_keeps_the_checksum_kind_it_was_stored_with() {
        let payload = vec![3u8; PAYLOAD_INLINE_MAX + 10];
        let fnv = PayloadRef {
            len: payload.len() as u64,
            checksum: fnv1a64(&payload),
            sum: PayloadSum::Fnv1a64,
        };
        fnv.verify(&payload).unwrap();
        let r = JobRecord {
            payload: Vec::new(),
            payload_apart: Some(fnv),
            ..record()
        };
        // Stored by a version-6 record, rewritten in version 7: still FNV, still verifies.
        let from_v6 = JobRecord::decode(&encode_v6(&r)).unwrap();
        assert_eq!(from_v6.payload_apart, Some(fnv));
        let again = JobRecord::decode(&from_v6.encode().unwrap()).unwrap();
        assert_eq!(again.payload_apart, Some(fnv));
        again.payload_apart.unwrap().verify(&payload).unwrap();
        // A new payload apart is XXH3, and the two kinds do not verify each other's sums.
        let xxh = PayloadRef::of(&payload);
        assert_eq!(xxh.sum, PayloadSum::Xxh3);
        assert_ne!(xxh.checksum, fnv.checksum);
        let swapped = PayloadRef {
            sum: PayloadSum::Fnv1a64,
            ..xxh
        };
        assert!(swapped.verify(&payload).is_err());
    }

    #[test]
    fn a_huge_length_prefix_does_not_allocate() {
        // A version-6 payload length claiming ~2^60 bytes, behind a valid checksum (version 7
        // lengths are 16-bit, their bound is tested in `layout`).
        let mut bytes = encode_v6(&record());
        let n = bytes.len() - 8;
        // The payload length is the 8 bytes before the 5-byte payload itself, which the retry
        // policy (tag, kind, base, cap, jitter: 19 bytes), the dedup window (`None`: 1 byte),
        // the payload reference (`None`: 1 byte), the snooze count (4 bytes) and the encoding
        // (`Some(1)`: 2 bytes), the status (`None`: 1 byte), the until-started flag (1 byte)
        // the progress and the group (`None`: 1 byte each) and the group order (8 bytes)
        // follow.
        let end = n - 19 - 1 - 1 - 4 - 2 - 1 - 1 - 1 - 1 - 8;
        assert_eq!(&bytes[end - 5..end], b"hello");
        bytes[end - 5 - 8..end - 5].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let err = JobRecord::decode(&reseal(bytes)).unwrap_err();
        assert!(
            matches!(&err, Error::Corrupted { detail } if detail.contains("decode")),
            "{err:?}"
        );
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let bytes = record().encode().unwrap();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[i] ^= 1 << bit;
                assert!(
                    matches!(JobRecord::decode(&flipped), Err(Error::Corrupted { .. })),
                    "flip of bit {bit} of byte {i} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn a_record_breaking_an_invariant_is_refused_after_decode() {
        let mut r = record();
        r.attempts = 0; // a leased record must have an attempt counted
        let mut bytes = vec![RECORD_VERSION];
        layout::write(&r, &mut bytes).unwrap();
        bytes.extend_from_slice(&[0; 8]);
        let err = JobRecord::decode(&reseal(bytes)).unwrap_err();
        assert!(
            matches!(&err, Error::Corrupted { detail } if detail.contains("no attempt")),
            "{err:?}"
        );
        // And in a version-6 record.
        let mut bytes = vec![6u8];
        bincode::serde::encode_into_std_write(&r, &mut bytes, record_config()).unwrap();
        bytes.extend_from_slice(&[0; 8]);
        let err = JobRecord::decode(&reseal(bytes)).unwrap_err();
        assert!(
            matches!(&err, Error::Corrupted { detail } if detail.contains("no attempt")),
            "{err:?}"
        );
    }

    #[test]
    fn encoding_tags_round_trip_and_unknown_tags_fail_validation() {
        for enc in [Encoding::Bincode, Encoding::Json] {
            assert_eq!(Encoding::from_tag(enc.tag()), Some(enc));
        }
        let mut r = record();
        r.encoding = Some(9);
        assert!(r.check_invariants().is_err());
    }

    #[test]
    fn version_4_records_read_with_their_last_error_as_the_history() {
        let r = JobRecord {
            state: StoredState::Ready,
            attempts: 2,
            ..record()
        };
        let v4 = JobRecordV4 {
            state: r.state.clone(),
            priority: r.priority,
            run_at_ms: r.run_at_ms,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_ms: r.lease_ms,
            created_ms: r.created_ms,
            seq: r.seq,
            idempotency_key: r.idempotency_key.clone(),
            dedup_key: r.dedup_key.clone(),
            last_error: Some("late".into()),
            payload: r.payload.clone(),
            retry: r.retry,
            dedup_window_ms: r.dedup_window_ms,
            payload_apart: r.payload_apart,
            snoozes: r.snoozes,
            encoding: r.encoding,
        };
        let mut bytes = vec![4u8];
        bincode::serde::encode_into_std_write(&v4, &mut bytes, record_config()).unwrap();
        let sum = fnv1a64(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
        let back = JobRecord::decode(&bytes).unwrap();
        // The error ended the last attempt made (2: the job is ready, not leased).
        assert_eq!(
            back.errors,
            vec![StoredError {
                attempt: 2,
                at_ms: None,
                message: "late".into()
            }]
        );
        assert_eq!(
            back,
            JobRecord {
                errors: back.errors.clone(),
                ..r
            }
        );
        assert_eq!(back.last_error(), Some("late"));
    }

    #[test]
    fn the_error_history_keeps_the_last_errors_kept() {
        let mut r = JobRecord {
            errors: Vec::new(),
            ..record()
        };
        for i in 0..(ERRORS_KEPT as u32 + 3) {
            r.push_error(i.min(3), Some(u64::from(i)), format!("e{i}"));
        }
        assert_eq!(r.errors.len(), ERRORS_KEPT);
        assert_eq!(r.errors[0].message, "e3");
        assert_eq!(
            r.last_error(),
            Some(format!("e{}", ERRORS_KEPT + 2).as_str())
        );
        assert_eq!(JobRecord::decode(&r.encode().unwrap()).unwrap(), r);
        r.errors.push(r.errors[0].clone());
        assert!(r.check_invariants().is_err(), "one more than ERRORS_KEPT");
    }

    #[test]
    fn ended_states_round_trip_and_are_bounded() {
        for state in [
            StoredState::Completed { result: None },
            StoredState::Completed {
                result: Some(b"ok".to_vec()),
            },
            StoredState::Cancelled {
                reason: "user".into(),
                fenced_until_ms: 9,
            },
        ] {
            let r = JobRecord {
                state,
                status: Some("waiting".into()),
                ..record()
            };
            assert_eq!(JobRecord::decode(&r.encode().unwrap()).unwrap(), r);
        }
        let big = JobRecord {
            state: StoredState::Completed {
                result: Some(vec![0; RESULT_BYTES_MAX + 1]),
            },
            ..record()
        };
        assert!(big.check_invariants().is_err());
        let never_ran = JobRecord {
            state: StoredState::Completed { result: None },
            attempts: 0,
            ..record()
        };
        assert!(never_ran.check_invariants().is_err());
        let until_started_without_key = JobRecord {
            dedup_until_started: true,
            dedup_key: None,
            ..record()
        };
        assert!(until_started_without_key.check_invariants().is_err());
    }

    #[test]
    fn version_3_records_read_as_never_snoozed_without_encoding() {
        let r = record();
        let v3 = JobRecordV3 {
            state: r.state.clone(),
            priority: r.priority,
            run_at_ms: r.run_at_ms,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_ms: r.lease_ms,
            created_ms: r.created_ms,
            seq: r.seq,
            idempotency_key: r.idempotency_key.clone(),
            dedup_key: r.dedup_key.clone(),
            last_error: r.last_error().map(str::to_owned),
            payload: r.payload.clone(),
            retry: r.retry,
            dedup_window_ms: r.dedup_window_ms,
            payload_apart: r.payload_apart,
        };
        let mut bytes = vec![3u8];
        bincode::serde::encode_into_std_write(&v3, &mut bytes, record_config()).unwrap();
        let sum = fnv1a64(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
        let back = JobRecord::decode(&bytes).unwrap();
        assert_eq!(
            back,
            JobRecord {
                snoozes: 0,
                encoding: None,
                ..r
            }
        );
    }
}
