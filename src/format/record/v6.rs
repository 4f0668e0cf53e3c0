//! The body of a record of versions 5 and 6, read by hand: the same bytes bincode 2 writes for
//! [`JobRecord`] under the record configuration (little endian, fixed-size
//! integers; an enum variant as its `u32` index, an `Option` as a `u8` tag, a byte or text
//! string as a `u64` length and its bytes; fields in declaration order), without serde's
//! per-field machinery. Version 7 ([`super::layout`]) replaced it; files keep version-6 rows
//! until their jobs next change. The writer is the tests' only: they check the two ways agree
//! byte for byte with bincode, so the reader reads what older builds wrote.
//!
//! Reading never trusts a length: every length is checked against the bytes left before
//! anything is allocated, so a damaged length is an error, not an allocation.

use super::layout::{Bytes, bad};
use super::{
    JobRecord, PayloadRef, PayloadSum, StoredError, StoredProgress, StoredRetry, StoredState,
};
use crate::error::{Error, Result};

/// Appends the version-6 bincode body of `record` to `out`.
#[cfg(test)]
pub(super) fn write(record: &JobRecord, out: &mut Vec<u8>) {
    match record.state {
        StoredState::Scheduled => u32_(out, 0),
        StoredState::Ready => u32_(out, 1),
        StoredState::Leased { token, deadline_ms } => {
            u32_(out, 2);
            u64_(out, token);
            u64_(out, deadline_ms);
        }
        StoredState::Dead => u32_(out, 3),
        StoredState::Completed { ref result } => {
            u32_(out, 4);
            opt(out, result.as_ref(), |o, v| bytes(o, v));
        }
        StoredState::Cancelled {
            ref reason,
            fenced_until_ms,
        } => {
            u32_(out, 5);
            bytes(out, reason.as_bytes());
            u64_(out, fenced_until_ms);
        }
    }
    out.extend_from_slice(&record.priority.to_le_bytes());
    u64_(out, record.run_at_ms);
    u32_(out, record.attempts);
    u32_(out, record.max_attempts);
    opt(out, record.lease_ms.as_ref(), |o, v| u64_(o, *v));
    u64_(out, record.created_ms);
    u64_(out, record.seq);
    opt(out, record.idempotency_key.as_ref(), |o, v| bytes(o, v));
    opt(out, record.dedup_key.as_ref(), |o, v| bytes(o, v));
    u64_(out, record.errors.len() as u64);
    for e in &record.errors {
        u32_(out, e.attempt);
        opt(out, e.at_ms.as_ref(), |o, v| u64_(o, *v));
        bytes(out, e.message.as_bytes());
    }
    bytes(out, &record.payload);
    opt(out, record.retry.as_ref(), |o, r| {
        o.push(r.kind);
        u64_(o, r.base_ms);
        u64_(o, r.cap_ms);
        o.push(r.jitter_percent);
    });
    opt(out, record.dedup_window_ms.as_ref(), |o, v| u64_(o, *v));
    opt(out, record.payload_apart.as_ref(), |o, r| {
        u64_(o, r.len);
        u64_(o, r.checksum);
    });
    u32_(out, record.snoozes);
    opt(out, record.encoding.as_ref(), |o, v| o.push(*v));
    opt(out, record.status.as_ref(), |o, v| bytes(o, v.as_bytes()));
    out.push(u8::from(record.dedup_until_started));
    opt(out, record.progress.as_ref(), |o, p| {
        u64_(o, p.at_ms);
        bytes(o, &p.value);
    });
    opt(out, record.group.as_ref(), |o, g| bytes(o, g));
    u64_(out, record.group_order);
}

/// Reads a body written by [`write()`] (or by bincode for the same version); every byte must be
/// used. `version` 5 is the same body without its last three fields: the progress, the
/// group and its order.
pub(super) fn read(body: &[u8], version: u8) -> Result<JobRecord> {
    debug_assert!(version == 5 || version == 6);
    let mut r = Bytes { rest: body };
    let state = match r.u32()? {
        0 => StoredState::Scheduled,
        1 => StoredState::Ready,
        2 => StoredState::Leased {
            token: r.u64()?,
            deadline_ms: r.u64()?,
        },
        3 => StoredState::Dead,
        4 => StoredState::Completed {
            result: r.tagged(Bytes::long_bytes)?,
        },
        5 => StoredState::Cancelled {
            reason: r.long_text()?,
            fenced_until_ms: r.u64()?,
        },
        v => return Err(bad(format!("state variant {v}"))),
    };
    let record = JobRecord {
        state,
        priority: i32::from_le_bytes(r.array()?),
        run_at_ms: r.u64()?,
        attempts: r.u32()?,
        max_attempts: r.u32()?,
        lease_ms: r.tagged(Bytes::u64)?,
        created_ms: r.u64()?,
        seq: r.u64()?,
        idempotency_key: r.tagged(Bytes::long_bytes)?,
        dedup_key: r.tagged(Bytes::long_bytes)?,
        errors: r.long_errors()?,
        payload: r.long_bytes()?,
        retry: r.tagged(|r| {
            Ok(StoredRetry {
                kind: r.u8()?,
                base_ms: r.u64()?,
                cap_ms: r.u64()?,
                jitter_percent: r.u8()?,
            })
        })?,
        dedup_window_ms: r.tagged(Bytes::u64)?,
        payload_apart: r.tagged(|r| {
            Ok(PayloadRef {
                len: r.u64()?,
                checksum: r.u64()?,
                sum: PayloadSum::Fnv1a64,
            })
        })?,
        snoozes: r.u32()?,
        encoding: r.tagged(Bytes::u8)?,
        status: r.tagged(Bytes::long_text)?,
        dedup_until_started: match r.u8()? {
            0 => false,
            1 => true,
            b => return Err(bad(format!("bool {b}"))),
        },
        progress: if version >= 6 {
            r.tagged(|r| {
                Ok(StoredProgress {
                    at_ms: r.u64()?,
                    value: r.long_bytes()?,
                })
            })?
        } else {
            None
        },
        group: if version >= 6 {
            r.tagged(Bytes::long_bytes)?
        } else {
            None
        },
        group_order: if version >= 6 { r.u64()? } else { 0 },
        timeout_ms: None,
    };
    if !r.rest.is_empty() {
        return Err(Error::corrupted("job record: trailing bytes"));
    }
    Ok(record)
}

#[cfg(test)]
fn u32_(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
fn u64_(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
fn bytes(out: &mut Vec<u8>, v: &[u8]) {
    u64_(out, v.len() as u64);
    out.extend_from_slice(v);
}

#[cfg(test)]
fn opt<T>(out: &mut Vec<u8>, v: Option<&T>, f: impl FnOnce(&mut Vec<u8>, &T)) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            f(out, v);
        }
    }
}

/// Version 6's fields, bincode-shaped (64-bit lengths and counts, tagged options), read with
/// version 7's primitives.
impl Bytes<'_> {
    /// A length-prefixed byte string, its length checked against the bytes left first.
    fn long_bytes(&mut self) -> Result<Vec<u8>> {
        let len = self.u64()?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| n <= self.rest.len())
            .ok_or_else(|| bad(format!("length {len} past the record's end")))?;
        Ok(self.take(len)?.to_vec())
    }

    fn long_text(&mut self) -> Result<String> {
        String::from_utf8(self.long_bytes()?).map_err(|_| bad("text that is not UTF-8".into()))
    }

    /// The error history: a count, checked against the bytes left (an entry takes at least
    /// 13) before anything is allocated, then the entries.
    fn long_errors(&mut self) -> Result<Vec<StoredError>> {
        let n = self.u64()?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.rest.len() / 13)
            .ok_or_else(|| bad(format!("{n} errors past the record's end")))?;
        let mut errors = Vec::with_capacity(n);
        for _ in 0..n {
            errors.push(StoredError {
                attempt: self.u32()?,
                at_ms: self.tagged(Bytes::u64)?,
                message: self.long_text()?,
            });
        }
        Ok(errors)
    }

    fn tagged<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => f(self).map(Some),
            t => Err(bad(format!("option tag {t}"))),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bincode_body(record: &JobRecord) -> Vec<u8> {
        bincode::serde::encode_to_vec(record, super::super::record_config()).unwrap()
    }

    fn state() -> impl Strategy<Value = StoredState> {
        prop_oneof![
            Just(StoredState::Scheduled),
            Just(StoredState::Ready),
            (any::<u64>(), any::<u64>())
                .prop_map(|(token, deadline_ms)| StoredState::Leased { token, deadline_ms }),
            Just(StoredState::Dead),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|result| StoredState::Completed { result }),
            (".{0,40}", any::<u64>()).prop_map(|(reason, fenced_until_ms)| {
                StoredState::Cancelled {
                    reason,
                    fenced_until_ms,
                }
            }),
        ]
    }

    fn errors() -> impl Strategy<Value = Vec<StoredError>> {
        proptest::collection::vec(
            (any::<u32>(), any::<Option<u64>>(), ".{0,30}").prop_map(
                |(attempt, at_ms, message)| StoredError {
                    attempt,
                    at_ms,
                    message,
                },
            ),
            0..4,
        )
    }

    pub(in crate::format::record) fn any_record() -> impl Strategy<Value = JobRecord> {
        (
            (
                state(),
                any::<i32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
            ),
            (
                any::<Option<u64>>(),
                any::<u64>(),
                any::<u64>(),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            ),
            (
                errors(),
                proptest::collection::vec(any::<u8>(), 0..300),
                proptest::option::of((any::<u8>(), any::<u64>(), any::<u64>(), any::<u8>())),
                any::<Option<u64>>(),
                any::<Option<(u64, u64)>>(),
                any::<u32>(),
                any::<Option<u8>>(),
            ),
            (
                proptest::option::of(".{0,40}"),
                any::<bool>(),
                proptest::option::of((any::<u64>(), proptest::collection::vec(any::<u8>(), 0..40))),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                any::<u64>(),
            ),
        )
            .prop_map(|(a, b, c, d)| JobRecord {
                state: a.0,
                priority: a.1,
                run_at_ms: a.2,
                attempts: a.3,
                max_attempts: a.4,
                lease_ms: b.0,
                created_ms: b.1,
                seq: b.2,
                idempotency_key: b.3,
                dedup_key: b.4,
                errors: c.0,
                payload: c.1,
                retry: c
                    .2
                    .map(|(kind, base_ms, cap_ms, jitter_percent)| StoredRetry {
                        kind,
                        base_ms,
                        cap_ms,
                        jitter_percent,
                    }),
                dedup_window_ms: c.3,
                payload_apart: c.4.map(|(len, checksum)| PayloadRef {
                    len,
                    checksum,
                    sum: PayloadSum::Fnv1a64,
                }),
                snoozes: c.5,
                encoding: c.6,
                status: d.0,
                dedup_until_started: d.1,
                progress: d.2.map(|(at_ms, value)| StoredProgress { at_ms, value }),
                group: d.3,
                group_order: d.4,
                timeout_ms: None,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The hand-written body is bincode's, byte for byte, and reads back both ways.
        #[test]
        fn same_bytes_as_bincode(record in any_record()) {
            let mut mine = Vec::new();
            write(&record, &mut mine);
            prop_assert_eq!(&mine, &bincode_body(&record));
            prop_assert_eq!(read(&mine, 6).unwrap(), record.clone());
            let (theirs, used): (JobRecord, usize) =
                bincode::serde::decode_from_slice(&mine, super::super::record_config()).unwrap();
            prop_assert_eq!(used, mine.len());
            prop_assert_eq!(theirs, record);
        }

        /// Damaged bodies (cut, or a byte changed) are errors or other records, never a panic;
        /// bincode and the hand reader agree on which.
        #[test]
        fn damaged_bodies_agree_with_bincode(record in any_record(), cut in any::<prop::sample::Index>(),
                                            at in any::<prop::sample::Index>(), to in any::<u8>()) {
            let mut body = Vec::new();
            write(&record, &mut body);
            let short = &body[..cut.index(body.len())];
            prop_assert!(read(short, 6).is_err());
            let mut flipped = body.clone();
            let i = at.index(flipped.len());
            flipped[i] = to;
            let mine = read(&flipped, 6).ok();
            let theirs = bincode::serde::decode_from_slice::<JobRecord, _>(
                &flipped,
                super::super::record_config(),
            )
            .ok()
            .filter(|(_, used)| *used == flipped.len())
            .map(|(r, _)| r);
            prop_assert_eq!(mine, theirs);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// A record version 5 body is a version 6 body without the progress and the group: it
        /// reads back as the same record with neither.
        #[test]
        fn a_version_5_body_reads_with_no_progress(record in any_record()) {
            let record = JobRecord { progress: None, group: None, group_order: 0, ..record };
            let mut body = Vec::new();
            write(&record, &mut body);
            body.truncate(body.len() - 10);
            prop_assert_eq!(read(&body, 5).unwrap(), record);
            // A version 6 reader wants the progress tag.
            prop_assert!(read(&body, 6).is_err());
        }
    }

    /// A ready job with a 3-byte payload and no options.
    pub(in crate::format::record) fn plain() -> JobRecord {
        JobRecord {
            state: StoredState::Ready,
            priority: 0,
            run_at_ms: 1,
            attempts: 0,
            max_attempts: 1,
            lease_ms: None,
            created_ms: 1,
            seq: 1,
            idempotency_key: None,
            dedup_key: None,
            errors: Vec::new(),
            payload: b"abc".to_vec(),
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

    #[test]
    fn a_huge_length_is_an_error_without_allocating() {
        let mut body = Vec::new();
        write(&plain(), &mut body);
        // The payload length sits after 4+4+8+4+4+1+8+8+1+1+8 bytes (the last 8: the count
        // of errors).
        let at = 4 + 4 + 8 + 4 + 4 + 1 + 8 + 8 + 1 + 1 + 8;
        body[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = read(&body, 6).unwrap_err();
        assert!(e.to_string().contains("past the record's end"), "{e}");
    }
}
