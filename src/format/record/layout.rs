//! The body of a record of versions 7 and 8, written and read by hand (version 8 is written:
//! version 7's bytes with one more flagged field, the execution timeout; a version-7 body
//! with that flag is an error).
//!
//! The fields a lease or an extend rewrites sit at fixed offsets in a fixed-size head, so a
//! change of state alone keeps the record's size: a job's leaf in `leaseq_jobs` is never split
//! by a lease. (What a job gathers over its life, an error per failed attempt, a snooze reason,
//! a result, still adds to it.) The fields set once (keys,
//! policies, the group) follow only when present, each marked by a bit of the head's flags,
//! with 16-bit lengths (every such field is bounded far below 64 KiB); the inline payload is
//! the rest of the body, its length implied. docs/format.md draws the bytes.
//!
//! Reading never trusts a length: every length is checked against the bytes left before
//! anything is allocated, and an encoding has one form only (a flag, tag or slot that a
//! record of its state cannot have is an error), so a record written again from what was
//! read is the same bytes.

use super::{
    JobRecord, PayloadRef, PayloadSum, StoredError, StoredProgress, StoredRetry, StoredState,
};
use crate::error::{Error, Result};

/// The head's size in bytes: state, flags, priority, attempts, max attempts, snoozes,
/// run_at, created, seq, token, deadline.
pub(super) const HEAD_BYTES: usize = 1 + 2 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8 + 8;
// docs/format.md draws a 59-byte head.
const _: () = assert!(HEAD_BYTES == 59);

// The flags: which optional fields follow the head, in this order.
const LEASE_MS: u16 = 1;
const IDEMPOTENCY_KEY: u16 = 1 << 1;
const DEDUP_KEY: u16 = 1 << 2;
const RETRY: u16 = 1 << 3;
const DEDUP_WINDOW: u16 = 1 << 4;
const PAYLOAD_APART: u16 = 1 << 5;
/// The payload apart carries an FNV-1a 64 checksum (kept from a record of version 6 or older)
/// instead of XXH3-64.
const PAYLOAD_SUM_FNV: u16 = 1 << 6;
const ENCODING: u16 = 1 << 7;
const STATUS: u16 = 1 << 8;
const PROGRESS: u16 = 1 << 9;
const GROUP: u16 = 1 << 10;
const DEDUP_UNTIL_STARTED: u16 = 1 << 11;
const ERRORS: u16 = 1 << 12;
const RESULT: u16 = 1 << 13;
/// Since record version 8.
const TIMEOUT_MS: u16 = 1 << 14;

/// The flags a body of record version `version` (7 or 8) may hold.
fn known_flags(version: u8) -> u16 {
    if version >= 8 {
        (1 << 15) - 1
    } else {
        (1 << 14) - 1
    }
}

/// Appends the version-8 body of `record` to `out`. Fails only on a field longer than a
/// 16-bit length can say, which [`JobRecord::check_invariants`] already refuses.
pub(super) fn write(record: &JobRecord, out: &mut Vec<u8>) -> Result<()> {
    let (tag, token, deadline_ms) = match record.state {
        StoredState::Scheduled => (0u8, 0, 0),
        StoredState::Ready => (1, 0, 0),
        StoredState::Leased { token, deadline_ms } => (2, token, deadline_ms),
        StoredState::Dead => (3, 0, 0),
        StoredState::Completed { .. } => (4, 0, 0),
        StoredState::Cancelled {
            fenced_until_ms, ..
        } => (5, 0, fenced_until_ms),
    };
    let result = match &record.state {
        StoredState::Completed { result } => result.as_deref(),
        _ => None,
    };
    let flag = |on: bool, bit: u16| if on { bit } else { 0 };
    let apart_fnv = record
        .payload_apart
        .is_some_and(|r| r.sum == PayloadSum::Fnv1a64);
    let flags = flag(record.lease_ms.is_some(), LEASE_MS)
        | flag(record.idempotency_key.is_some(), IDEMPOTENCY_KEY)
        | flag(record.dedup_key.is_some(), DEDUP_KEY)
        | flag(record.retry.is_some(), RETRY)
        | flag(record.dedup_window_ms.is_some(), DEDUP_WINDOW)
        | flag(record.payload_apart.is_some(), PAYLOAD_APART)
        | flag(apart_fnv, PAYLOAD_SUM_FNV)
        | flag(record.encoding.is_some(), ENCODING)
        | flag(record.status.is_some(), STATUS)
        | flag(record.progress.is_some(), PROGRESS)
        | flag(record.group.is_some(), GROUP)
        | flag(record.dedup_until_started, DEDUP_UNTIL_STARTED)
        | flag(!record.errors.is_empty(), ERRORS)
        | flag(result.is_some(), RESULT)
        | flag(record.timeout_ms.is_some(), TIMEOUT_MS);
    debug_assert!(
        record.group.is_some() || record.group_order == 0,
        "a group order without a group"
    );
    let start = out.len();
    out.reserve(HEAD_BYTES + record.payload.len() + 8);
    out.push(tag);
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&record.priority.to_le_bytes());
    out.extend_from_slice(&record.attempts.to_le_bytes());
    out.extend_from_slice(&record.max_attempts.to_le_bytes());
    out.extend_from_slice(&record.snoozes.to_le_bytes());
    for v in [
        record.run_at_ms,
        record.created_ms,
        record.seq,
        token,
        deadline_ms,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    debug_assert_eq!(out.len() - start, HEAD_BYTES);
    if let Some(v) = record.lease_ms {
        u64_(out, v);
    }
    if let Some(k) = &record.idempotency_key {
        short(out, k)?;
    }
    if let Some(k) = &record.dedup_key {
        short(out, k)?;
    }
    if let Some(r) = &record.retry {
        out.push(r.kind);
        u64_(out, r.base_ms);
        u64_(out, r.cap_ms);
        out.push(r.jitter_percent);
    }
    if let Some(w) = record.dedup_window_ms {
        u64_(out, w);
    }
    if let Some(r) = &record.payload_apart {
        u64_(out, r.len);
        u64_(out, r.checksum);
    }
    if let Some(e) = record.encoding {
        out.push(e);
    }
    if let Some(s) = &record.status {
        short(out, s.as_bytes())?;
    }
    if let Some(p) = &record.progress {
        u64_(out, p.at_ms);
        short(out, &p.value)?;
    }
    if let Some(g) = &record.group {
        short(out, g)?;
        u64_(out, record.group_order);
    }
    if !record.errors.is_empty() {
        let n = u8::try_from(record.errors.len())
            .map_err(|_| bad(format!("{} errors", record.errors.len())))?;
        out.push(n);
        for e in &record.errors {
            out.extend_from_slice(&e.attempt.to_le_bytes());
            match e.at_ms {
                None => out.push(0),
                Some(at) => {
                    out.push(1);
                    u64_(out, at);
                }
            }
            short(out, e.message.as_bytes())?;
        }
    }
    if let Some(r) = result {
        short(out, r)?;
    }
    if let StoredState::Cancelled { reason, .. } = &record.state {
        short(out, reason.as_bytes())?;
    }
    if let Some(t) = record.timeout_ms {
        u64_(out, t);
    }
    out.extend_from_slice(&record.payload);
    Ok(())
}

/// Reads a body of record version `version` (7 or 8) written by [`write()`] (or by a build
/// that wrote version 7); the payload is whatever follows the last field.
pub(super) fn read(body: &[u8], version: u8) -> Result<JobRecord> {
    let mut r = Bytes { rest: body };
    let tag = r.u8()?;
    let flags = u16::from_le_bytes(r.array()?);
    if flags & !known_flags(version) != 0 {
        return Err(bad(format!("unknown flags {flags:#06x}")));
    }
    let on = |bit: u16| flags & bit != 0;
    let priority = i32::from_le_bytes(r.array()?);
    let attempts = r.u32()?;
    let max_attempts = r.u32()?;
    let snoozes = r.u32()?;
    let run_at_ms = r.u64()?;
    let created_ms = r.u64()?;
    let seq = r.u64()?;
    let token = r.u64()?;
    let deadline_ms = r.u64()?;
    // Slots and flags a state cannot have: one encoding per record.
    let leased = tag == 2;
    if (!leased && token != 0) || (!leased && tag != 5 && deadline_ms != 0) {
        return Err(bad(format!("state {tag} with a lease slot set")));
    }
    if on(RESULT) && tag != 4 {
        return Err(bad(format!("a result in state {tag}")));
    }
    if on(PAYLOAD_SUM_FNV) && !on(PAYLOAD_APART) {
        return Err(bad("a payload checksum kind without a payload apart".into()));
    }
    let lease_ms = r.opt(on(LEASE_MS), Bytes::u64)?;
    let idempotency_key = r.opt(on(IDEMPOTENCY_KEY), Bytes::short)?;
    let dedup_key = r.opt(on(DEDUP_KEY), Bytes::short)?;
    let retry = r.opt(on(RETRY), |r| {
        Ok(StoredRetry {
            kind: r.u8()?,
            base_ms: r.u64()?,
            cap_ms: r.u64()?,
            jitter_percent: r.u8()?,
        })
    })?;
    let dedup_window_ms = r.opt(on(DEDUP_WINDOW), Bytes::u64)?;
    let payload_apart = r.opt(on(PAYLOAD_APART), |r| {
        Ok(PayloadRef {
            len: r.u64()?,
            checksum: r.u64()?,
            sum: if on(PAYLOAD_SUM_FNV) {
                PayloadSum::Fnv1a64
            } else {
                PayloadSum::Xxh3
            },
        })
    })?;
    let encoding = r.opt(on(ENCODING), Bytes::u8)?;
    let status = r.opt(on(STATUS), Bytes::text)?;
    let progress = r.opt(on(PROGRESS), |r| {
        Ok(StoredProgress {
            at_ms: r.u64()?,
            value: r.short()?,
        })
    })?;
    let (group, group_order) = match r.opt(on(GROUP), |r| Ok((r.short()?, r.u64()?)))? {
        Some((g, order)) => (Some(g), order),
        None => (None, 0),
    };
    let errors = if on(ERRORS) { r.errors()? } else { Vec::new() };
    let state = match tag {
        0 => StoredState::Scheduled,
        1 => StoredState::Ready,
        2 => StoredState::Leased { token, deadline_ms },
        3 => StoredState::Dead,
        4 => StoredState::Completed {
            result: r.opt(on(RESULT), Bytes::short)?,
        },
        5 => StoredState::Cancelled {
            reason: r.text()?,
            fenced_until_ms: deadline_ms,
        },
        t => return Err(bad(format!("state {t}"))),
    };
    let timeout_ms = r.opt(on(TIMEOUT_MS), Bytes::u64)?;
    Ok(JobRecord {
        state,
        priority,
        run_at_ms,
        attempts,
        max_attempts,
        lease_ms,
        created_ms,
        seq,
        idempotency_key,
        dedup_key,
        errors,
        payload: r.rest.to_vec(),
        retry,
        dedup_window_ms,
        payload_apart,
        snoozes,
        encoding,
        status,
        dedup_until_started: on(DEDUP_UNTIL_STARTED),
        progress,
        group,
        group_order,
        timeout_ms,
    })
}

pub(super) fn bad(what: String) -> Error {
    Error::corrupted(format!("job record decode: {what}"))
}

fn u64_(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A byte string of at most `u16::MAX` bytes: its length as a `u16`, then its bytes.
fn short(out: &mut Vec<u8>, v: &[u8]) -> Result<()> {
    let len = u16::try_from(v.len()).map_err(|_| bad(format!("a field of {} bytes", v.len())))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(v);
    Ok(())
}

/// A bounded reader over a record's body: every read checks the bytes left first. Version 6's
/// reader (`v6.rs`) adds its own field shapes to it.
pub(super) struct Bytes<'a> {
    pub(super) rest: &'a [u8],
}

impl<'a> Bytes<'a> {
    #[inline]
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(bad(format!("{n} bytes wanted, {} left", self.rest.len())));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    #[inline]
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    #[inline]
    pub(super) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    pub(super) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    #[inline]
    pub(super) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A byte string with a 16-bit length, checked against the bytes left before the copy.
    fn short(&mut self) -> Result<Vec<u8>> {
        let len = usize::from(u16::from_le_bytes(self.array()?));
        if len > self.rest.len() {
            return Err(bad(format!("length {len} past the record's end")));
        }
        Ok(self.take(len)?.to_vec())
    }

    fn text(&mut self) -> Result<String> {
        String::from_utf8(self.short()?).map_err(|_| bad("text that is not UTF-8".into()))
    }

    /// The error history: a count of 1 to 255 (none is a clear flag, not a zero count), then
    /// the entries; each takes at least 7 bytes, so nothing is allocated past the record.
    fn errors(&mut self) -> Result<Vec<StoredError>> {
        let n = usize::from(self.u8()?);
        if n == 0 || n > self.rest.len() / 7 {
            return Err(bad(format!("{n} errors")));
        }
        let mut errors = Vec::with_capacity(n);
        for _ in 0..n {
            let attempt = self.u32()?;
            let at_ms = match self.u8()? {
                0 => None,
                1 => Some(self.u64()?),
                t => return Err(bad(format!("option tag {t}"))),
            };
            errors.push(StoredError {
                attempt,
                at_ms,
                message: self.text()?,
            });
        }
        Ok(errors)
    }

    /// The field `f` reads if its flag is `on`.
    #[inline]
    fn opt<T>(&mut self, on: bool, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        if on { f(self).map(Some) } else { Ok(None) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::v6::tests::plain;
    use super::*;
    use proptest::prelude::*;

    /// Any record a version-8 body can hold: v6's strategy, with either payload checksum
    /// kind, no group order without a group, and an execution timeout or none.
    fn any_record() -> impl Strategy<Value = JobRecord> {
        (
            super::super::v6::tests::any_record(),
            any::<bool>(),
            any::<Option<u64>>(),
        )
            .prop_map(|(mut r, xxh, timeout_ms)| {
                r.timeout_ms = timeout_ms;
                if let Some(p) = &mut r.payload_apart
                    && xxh
                {
                    p.sum = PayloadSum::Xxh3;
                }
                if r.group.is_none() {
                    r.group_order = 0;
                }
                r
            })
    }

    fn body(record: &JobRecord) -> Vec<u8> {
        let mut out = Vec::new();
        write(record, &mut out).unwrap();
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Every record reads back as itself.
        #[test]
        fn round_trips(record in any_record()) {
            prop_assert_eq!(read(&body(&record), 8).unwrap(), record);
        }

        /// A body cut short is an error; a body with a byte changed is an error or a record
        /// that writes back to exactly those bytes (one encoding per record).
        #[test]
        fn damaged_bodies_fail_or_read_canonically(record in any_record(),
                                                   cut in any::<prop::sample::Index>(),
                                                   at in any::<prop::sample::Index>(),
                                                   to in any::<u8>()) {
            let b = body(&record);
            let payload_starts = b.len() - record.payload.len();
            let short = &b[..cut.index(b.len())];
            if short.len() < payload_starts {
                prop_assert!(read(short, 8).is_err());
            }
            let mut flipped = b.clone();
            let i = at.index(flipped.len());
            flipped[i] = to;
            if let Ok(r) = read(&flipped, 8) {
                prop_assert_eq!(body(&r), flipped);
            }
        }

        /// The head is fixed: a change of state alone (scheduled, ready, leased, a lease
        /// extended, dead, completed without a result) never changes the record's size.
        #[test]
        fn state_changes_keep_the_size(record in any_record(), token in 1..u64::MAX,
                                       deadline in any::<u64>()) {
            let ready = JobRecord { state: StoredState::Ready, ..record };
            let n = body(&ready).len();
            for state in [
                StoredState::Scheduled,
                StoredState::Leased { token, deadline_ms: deadline },
                StoredState::Leased { token: token ^ 1, deadline_ms: deadline / 2 },
                StoredState::Dead,
                StoredState::Completed { result: None },
            ] {
                let other = JobRecord { state, ..ready.clone() };
                prop_assert_eq!(body(&other).len(), n);
            }
        }
    }

    #[test]
    fn a_plain_job_is_the_head_and_its_payload() {
        let b = body(&plain());
        assert_eq!(b.len(), HEAD_BYTES + 3);
        assert_eq!(&b[HEAD_BYTES..], b"abc");
    }

    #[test]
    fn a_length_past_the_end_is_an_error_without_allocating() {
        let r = JobRecord {
            idempotency_key: Some(b"key".to_vec()),
            ..plain()
        };
        let mut b = body(&r);
        b[HEAD_BYTES..HEAD_BYTES + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        let e = read(&b, 8).unwrap_err();
        assert!(e.to_string().contains("past the record's end"), "{e}");
    }

    #[test]
    fn unknown_flags_slots_and_states_are_errors() {
        let good = body(&plain());
        let with = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            read(&b, 8).unwrap_err().to_string()
        };
        assert!(with(1, &(1u16 << 15).to_le_bytes()).contains("unknown flags"));
        // A token in a ready record; a deadline in a dead one.
        assert!(with(HEAD_BYTES - 16, &[1]).contains("lease slot"));
        let mut dead = good.clone();
        dead[0] = 3;
        dead[HEAD_BYTES - 8] = 1;
        assert!(
            read(&dead, 8)
                .unwrap_err()
                .to_string()
                .contains("lease slot")
        );
        assert!(with(0, &[6]).contains("state 6"));
        // A result flag outside the completed state.
        assert!(with(1, &RESULT.to_le_bytes()).contains("result"));
        // An error-history flag with a count of zero.
        let mut b = good[..HEAD_BYTES].to_vec();
        b[1..3].copy_from_slice(&ERRORS.to_le_bytes());
        b.push(0);
        assert!(read(&b, 8).unwrap_err().to_string().contains("0 errors"));
    }

    /// A version-7 body is a version-8 body without the timeout: it reads as the same record
    /// with none, and a version-7 body with the timeout's flag is an error.
    #[test]
    fn a_version_7_body_reads_without_a_timeout_and_refuses_its_flag() {
        let cancelled = JobRecord {
            state: StoredState::Cancelled {
                reason: "stop".into(),
                fenced_until_ms: 9,
            },
            ..plain()
        };
        for r in [plain(), cancelled] {
            let b = body(&r);
            assert_eq!(read(&b, 7).unwrap(), r);
            assert_eq!(read(&b, 8).unwrap(), r);
            let timed = JobRecord {
                timeout_ms: Some(1_500),
                ..r.clone()
            };
            let t = body(&timed);
            assert_eq!(t.len(), b.len() + 8);
            assert_eq!(read(&t, 8).unwrap(), timed);
            let e = read(&t, 7).unwrap_err();
            assert!(e.to_string().contains("unknown flags"), "{e}");
        }
    }
}
