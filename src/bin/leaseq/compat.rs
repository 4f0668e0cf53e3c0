//! The job fields of the issue-11 API (`JobInfo::snoozes`, `lease_ms`, `retry`,
//! `dedup_window_ms`, `encoding`) in their JSON form.

use leaseq::JobInfo;

use crate::jsonl::RetryJson;

/// The fields of a job that the export carries besides the basic ones.
#[derive(Debug, Default)]
pub struct Extra {
    pub dedup_window_ms: Option<u64>,
    pub lease_ms: Option<u64>,
    pub retry: Option<RetryJson>,
    pub snoozes: u32,
    pub encoding: Option<String>,
}

/// Placeholder until the core API lands: none of these fields is known yet.
pub fn extra(_info: &JobInfo) -> Extra {
    Extra::default()
}
