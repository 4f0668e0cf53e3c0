//! The one place bytes become values: job records and typed payloads (bincode 2).
//!
//! Records read from disk are checked before use: a version byte, a checksum (redb checks its
//! pages only when it repairs, so a flipped payload byte would otherwise pass unseen), a decode
//! limit so no length field can make leaseq allocate more than the record's own size, and the
//! invariants of [`JobRecord::validate`].
//!
//! Record layout: `[version: u8][bincode body][FNV-1a 64 of version and body: u64 LE]`.

use bincode::config::{self, Configuration, Fixint, Limit, LittleEndian};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::JobState;

/// First byte of every encoded record.
const RECORD_VERSION: u8 = 1;

/// Decoding never reads or allocates past this many bytes (the payload cap plus headroom for
/// keys and the error text).
const RECORD_BYTES_MAX: usize = crate::PAYLOAD_BYTES_MAX_CAP + 64 * 1024;

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
    Leased { token: u64, deadline_ms: u64 },
    Dead,
}

impl StoredState {
    pub(crate) fn public(&self) -> JobState {
        match self {
            StoredState::Scheduled => JobState::Scheduled,
            StoredState::Ready => JobState::Ready,
            StoredState::Leased { .. } => JobState::Leased,
            StoredState::Dead => JobState::Dead,
        }
    }
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
    pub last_error: Option<String>,
    pub payload: Vec<u8>,
}

impl JobRecord {
    /// Checks the invariants every stored record keeps; used before every write and after
    /// every read.
    pub(crate) fn validate(&self) -> Result<()> {
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
        if self.payload.len() > crate::PAYLOAD_BYTES_MAX_CAP {
            return fail("payload above the cap");
        }
        let key_too_long =
            |k: &Option<Vec<u8>>| k.as_ref().is_some_and(|k| k.len() > crate::KEY_BYTES_MAX);
        if key_too_long(&self.idempotency_key) || key_too_long(&self.dedup_key) {
            return fail("key above the limit");
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        debug_assert!(
            self.validate().is_ok(),
            "encoding an invalid record: {self:?}"
        );
        let mut out = Vec::with_capacity(self.payload.len() + 80);
        out.push(RECORD_VERSION);
        bincode::serde::encode_into_std_write(self, &mut out, record_config())
            .map_err(|e| Error::corrupted(format!("job record encode: {e}")))?;
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<JobRecord> {
        if bytes.len() < 1 + 8 {
            return Err(Error::corrupted("job record: too short"));
        }
        let (checked, sum) = bytes.split_at(bytes.len() - 8);
        let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
        if fnv1a64(checked) != sum {
            return Err(Error::corrupted("job record: checksum mismatch"));
        }
        let (&version, body) = checked.split_first().expect("at least 1 byte");
        if version != RECORD_VERSION {
            return Err(Error::corrupted(format!(
                "job record: unknown record version {version}"
            )));
        }
        if body.len() > RECORD_BYTES_MAX {
            return Err(Error::corrupted("job record: longer than the record cap"));
        }
        let (record, used): (JobRecord, usize) =
            bincode::serde::decode_from_slice(body, record_config())
                .map_err(|e| Error::corrupted(format!("job record decode: {e}")))?;
        if used != body.len() {
            return Err(Error::corrupted("job record: trailing bytes"));
        }
        record.validate()?;
        Ok(record)
    }
}

/// FNV-1a, 64-bit: a cheap checksum against bit rot and stray writes (not an adversary).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Encodes a typed payload (bincode 2, standard configuration, via serde).
pub(crate) fn encode_payload<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, config::standard()).map_err(|e| Error::PayloadCodec {
        detail: e.to_string(),
    })
}

/// Decodes a typed payload written by [`encode_payload`]; trailing bytes are an error.
pub(crate) fn decode_payload<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let cfg = config::standard().with_limit::<{ crate::PAYLOAD_BYTES_MAX_CAP }>();
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, cfg).map_err(|e| Error::PayloadCodec {
            detail: e.to_string(),
        })?;
    if used != bytes.len() {
        return Err(Error::PayloadCodec {
            detail: format!("{} trailing bytes", bytes.len() - used),
        });
    }
    Ok(value)
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
            last_error: Some("boom".into()),
            payload: b"hello".to_vec(),
        }
    }

    #[test]
    fn record_round_trips() {
        let r = record();
        assert_eq!(JobRecord::decode(&r.encode().unwrap()).unwrap(), r);
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

    /// Re-seals `bytes` (a record whose body was edited) with a valid checksum.
    fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
        let n = bytes.len() - 8;
        let sum = fnv1a64(&bytes[..n]);
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
        bytes
    }

    #[test]
    fn a_huge_length_prefix_does_not_allocate() {
        // A payload length claiming ~2^60 bytes, behind a valid checksum.
        let mut bytes = record().encode().unwrap();
        let n = bytes.len() - 8;
        // The payload length is the 8 bytes before the 5-byte payload itself.
        bytes[n - 5 - 8..n - 5].copy_from_slice(&(1u64 << 60).to_le_bytes());
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
        bincode::serde::encode_into_std_write(&r, &mut bytes, record_config()).unwrap();
        bytes.extend_from_slice(&[0; 8]);
        let err = JobRecord::decode(&reseal(bytes)).unwrap_err();
        assert!(
            matches!(&err, Error::Corrupted { detail } if detail.contains("no attempt")),
            "{err:?}"
        );
    }

    #[test]
    fn typed_payload_round_trips_and_rejects_trailing_bytes() {
        let v = ("order", 42u32, vec![1.5f64]);
        let bytes = encode_payload(&v).unwrap();
        let back: (String, u32, Vec<f64>) = decode_payload(&bytes).unwrap();
        assert_eq!(back, ("order".to_string(), 42, vec![1.5]));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode_payload::<(String, u32, Vec<f64>)>(&longer),
            Err(Error::PayloadCodec { .. })
        ));
    }
}
