//! The schedule record: what one row of `leaseq_schedules` holds (since format 8), and its
//! checked encode and decode. docs/format.md describes the table and its due-time index.
//!
//! As a job record: a version byte, the bincode body (fixed-width integers, a decode limit so
//! no length field makes leaseq allocate more than the row's size), an FNV-1a checksum, then
//! [`ScheduleRecord::check_invariants`].

use bincode::config::{self, Configuration, Fixint, Limit, LittleEndian};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::record::{StoredRetry, fnv1a64};
use crate::limits::{
    CRON_TEXT_BYTES_MAX, DELAY_MAX, LEASE_MAX, MAX_ATTEMPTS_CAP, SCHEDULE_PAYLOAD_BYTES_MAX,
};

/// First byte of every encoded schedule record: 2 since format 12 (`paused_ms` added); a
/// version-1 body is a version-2 body without its last field.
const SCHEDULE_VERSION: u8 = 2;
/// The schedule record of formats 8 to 11: read as version 2 with `paused_ms` absent.
const SCHEDULE_VERSION_1: u8 = 1;

/// `next_due_ms` of a schedule with no due time left (a cron expression with no match ahead).
pub(crate) const NO_DUE_MS: u64 = u64::MAX;
/// The value of a `leaseq_schedule_instances` entry while its instance is live (not ended).
pub(crate) const INSTANCE_LIVE: u64 = u64::MAX;
/// `overlap`: a due time skips while the last instance runs.
pub(crate) const OVERLAP_SKIP: u8 = 0;
/// `overlap`: a due time enqueues one more while the last instance runs.
pub(crate) const OVERLAP_ENQUEUE: u8 = 1;
/// `missed`: due times missed while the file was closed enqueue one job at open.
pub(crate) const MISSED_RUN_ONCE: u8 = 0;
/// `missed`: due times missed while the file was closed are skipped.
pub(crate) const MISSED_SKIP: u8 = 1;

/// Decoding reads no more than this: the payload, two cron texts and the fixed fields.
const SCHEDULE_BYTES_MAX: usize = SCHEDULE_PAYLOAD_BYTES_MAX + 2 * CRON_TEXT_BYTES_MAX + 1024;

type ScheduleConfig = Configuration<LittleEndian, Fixint, Limit<SCHEDULE_BYTES_MAX>>;

fn schedule_config() -> ScheduleConfig {
    config::standard()
        .with_fixed_int_encoding()
        .with_limit::<SCHEDULE_BYTES_MAX>()
}

/// When a schedule is due, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum StoredTiming {
    /// Due at `start_ms + k * every_ms` for k = 0, 1, 2, ...
    Interval { every_ms: u64, start_ms: u64 },
    /// Due at each match of a cron expression in an IANA time zone.
    Cron {
        expression: String,
        time_zone: String,
    },
}

/// What the jobs a schedule enqueues are made of, resolved when the schedule was set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredTemplate {
    pub priority: i32,
    pub max_attempts: u32,
    pub lease_ms: Option<u64>,
    pub retry: Option<StoredRetry>,
    /// An encoding tag ([`Encoding::tag`](crate::format::payload::Encoding)), as in a job.
    pub encoding: Option<u8>,
    pub payload: Vec<u8>,
}

/// One row of `leaseq_schedules`, under (queue number, schedule name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScheduleRecord {
    pub timing: StoredTiming,
    pub template: StoredTemplate,
    /// 0: skip a due time while the last instance runs; 1: enqueue one more then.
    pub overlap: u8,
    /// 0: due times missed while the file was closed enqueue one job at open; 1: skipped.
    pub missed: u8,
    /// The next due time (Unix ms); `u64::MAX` for none (a cron expression with no match
    /// left). `leaseq_schedule_due` holds exactly this entry for the schedule.
    pub next_due_ms: u64,
    /// The last job this schedule enqueued, and the due time it was enqueued for.
    pub last_job: Option<(u64, u64)>,
    /// Jobs enqueued, and due times that enqueued none (an instance still pending, or
    /// running without overlap, or missed while closed).
    pub fired: u64,
    pub skipped: u64,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// When it was paused (Unix ms), while it is: a paused schedule has no due time
    /// (`next_due_ms` is `NO_DUE_MS`) and fires nothing until resumed. Since version 2.
    pub paused_ms: Option<u64>,
}

impl ScheduleRecord {
    /// The record's invariants: every bound a schedule is created under.
    pub(crate) fn check_invariants(&self) -> Result<()> {
        let fail = |what: &str| Err(Error::corrupted(format!("schedule record: {what}")));
        match &self.timing {
            StoredTiming::Interval { every_ms, .. } => {
                if *every_ms == 0 || *every_ms > crate::clock::duration_ms(DELAY_MAX) {
                    return fail("interval out of range");
                }
            }
            StoredTiming::Cron {
                expression,
                time_zone,
            } => {
                if expression.is_empty()
                    || expression.len() > CRON_TEXT_BYTES_MAX
                    || time_zone.is_empty()
                    || time_zone.len() > CRON_TEXT_BYTES_MAX
                {
                    return fail("cron text out of range");
                }
            }
        }
        let t = &self.template;
        if t.max_attempts == 0 || t.max_attempts > MAX_ATTEMPTS_CAP {
            return fail("max attempts out of range");
        }
        if t.lease_ms
            .is_some_and(|ms| ms == 0 || ms > crate::clock::duration_ms(LEASE_MAX))
        {
            return fail("lease out of range");
        }
        if t.retry.is_some_and(|r| r.policy().is_err()) {
            return fail("retry policy");
        }
        if t.payload.len() > SCHEDULE_PAYLOAD_BYTES_MAX {
            return fail("payload above the limit");
        }
        if !matches!(self.overlap, OVERLAP_SKIP | OVERLAP_ENQUEUE)
            || !matches!(self.missed, MISSED_RUN_ONCE | MISSED_SKIP)
        {
            return fail("unknown policy");
        }
        if t.encoding
            .is_some_and(|tag| crate::format::payload::Encoding::from_tag(tag).is_none())
        {
            return fail("unknown payload encoding");
        }
        if self.last_job.is_some_and(|(id, _)| id == 0) {
            return fail("job id 0");
        }
        if self.paused_ms.is_some() && self.next_due_ms != NO_DUE_MS {
            return fail("paused with a due time");
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        debug_assert!(
            self.check_invariants().is_ok(),
            "encoding an invalid schedule: {self:?}"
        );
        let mut out = vec![SCHEDULE_VERSION];
        bincode::serde::encode_into_std_write(self, &mut out, schedule_config())
            .map_err(|e| Error::corrupted(format!("schedule record encode: {e}")))?;
        let sum = fnv1a64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<ScheduleRecord> {
        if bytes.len() < 1 + 8 {
            return Err(Error::corrupted("schedule record: too short"));
        }
        if bytes.len() > SCHEDULE_BYTES_MAX + 9 {
            return Err(Error::corrupted("schedule record: longer than its cap"));
        }
        let (checked, sum) = bytes.split_at(bytes.len() - 8);
        let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
        if fnv1a64(checked) != sum {
            return Err(Error::corrupted("schedule record: checksum mismatch"));
        }
        let (&version, body) = checked.split_first().expect("at least 1 byte");
        // Version 1 lacks the last field, `paused_ms`: its `None` (a 0 tag) is added.
        let v1_body;
        let body = match version {
            SCHEDULE_VERSION => body,
            SCHEDULE_VERSION_1 => {
                v1_body = [body, &[0u8]].concat();
                &v1_body[..]
            }
            _ => {
                return Err(Error::corrupted(format!(
                    "schedule record: unknown version {version}"
                )));
            }
        };
        let (record, used): (ScheduleRecord, usize) =
            bincode::serde::decode_from_slice(body, schedule_config())
                .map_err(|e| Error::corrupted(format!("schedule record decode: {e}")))?;
        if used != body.len() {
            return Err(Error::corrupted("schedule record: trailing bytes"));
        }
        record.check_invariants()?;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ScheduleRecord {
        ScheduleRecord {
            timing: StoredTiming::Cron {
                expression: "0 3 * * *".into(),
                time_zone: "Europe/Berlin".into(),
            },
            template: StoredTemplate {
                priority: -3,
                max_attempts: 5,
                lease_ms: Some(30_000),
                retry: None,
                encoding: None,
                payload: b"clean up".to_vec(),
            },
            overlap: 1,
            missed: 0,
            next_due_ms: 1_700_000_000_000,
            last_job: Some((42, 1_699_999_000_000)),
            fired: 7,
            skipped: 2,
            created_ms: 1_600_000_000_000,
            updated_ms: 1_650_000_000_000,
            paused_ms: None,
        }
    }

    /// A version-1 record (formats 8 to 11) reads as the same schedule, not paused; a paused
    /// one round-trips; paused with a due time is refused.
    #[test]
    fn a_version_1_record_reads_as_not_paused() {
        let r = sample();
        let v2 = r.encode().unwrap();
        // Version 1: the version-2 bytes without the last field's tag, checksummed again.
        let mut v1 = vec![SCHEDULE_VERSION_1];
        v1.extend_from_slice(&v2[1..v2.len() - 8 - 1]);
        let sum = fnv1a64(&v1);
        v1.extend_from_slice(&sum.to_le_bytes());
        assert_eq!(ScheduleRecord::decode(&v1).unwrap(), r);
        let mut paused = sample();
        paused.paused_ms = Some(1_700_000_000_000);
        paused.next_due_ms = NO_DUE_MS;
        assert_eq!(
            ScheduleRecord::decode(&paused.encode().unwrap()).unwrap(),
            paused
        );
        let mut due = paused.clone();
        due.next_due_ms = 1;
        assert!(due.check_invariants().is_err());
    }

    #[test]
    fn a_record_round_trips_and_every_flipped_byte_is_refused() {
        let r = sample();
        let bytes = r.encode().unwrap();
        assert_eq!(ScheduleRecord::decode(&bytes).unwrap(), r);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(ScheduleRecord::decode(&bad).is_err(), "byte {i}");
        }
        for n in 0..bytes.len() {
            assert!(ScheduleRecord::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
    }

    #[test]
    fn a_huge_length_field_allocates_nothing_beyond_the_cap() {
        // A well-formed checksum over a body whose string length claims 2^40 bytes.
        let mut body = vec![SCHEDULE_VERSION, 1, 0, 0, 0];
        body.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let sum = fnv1a64(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        assert!(ScheduleRecord::decode(&body).is_err());
    }

    #[test]
    fn records_out_of_range_are_refused() {
        let mut r = sample();
        r.overlap = 2;
        assert!(r.check_invariants().is_err());
        let mut r = sample();
        r.timing = StoredTiming::Interval {
            every_ms: 0,
            start_ms: 0,
        };
        assert!(r.check_invariants().is_err());
        let mut r = sample();
        r.template.max_attempts = 0;
        assert!(r.check_invariants().is_err());
        let mut r = sample();
        r.last_job = Some((0, 1));
        assert!(r.check_invariants().is_err());
        // A tag no encoding has: refused here, so a firing never builds a job it refuses.
        let mut r = sample();
        r.template.encoding = Some(200);
        assert!(r.check_invariants().is_err());
    }
}
