//! A job's identity and state: the leaf types every layer names (errors included).

use std::fmt;

/// A job's id: unique in its file, assigned at enqueue, increasing, never reused. Not dense:
/// ids are reserved in blocks of 1,024, and a reopen skips the rest of a block, so an id is no
/// count of jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The state a job is in. A job is in exactly one state:
///
/// ```text
/// enqueue ──► Scheduled (delay) ──due, promote──► Ready ──dequeue──► Leased
/// Leased ──ack──► gone, or Completed (a queue that keeps a history)
/// Leased ──nack / snooze / lease expiry / reopen──► Ready or Scheduled
/// Leased ──fail, or attempts exhausted──► Dead ──requeue_dead, retry──► Ready
/// Scheduled, Ready, Leased, Dead ──cancel──► gone, or Cancelled (kept: a history, a fenced lease)
/// Completed, Cancelled ──retry──► Ready        Ready ──reschedule──► Scheduled
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for its due time (a delay or a backoff).
    Scheduled,
    /// Available to the next dequeue.
    Ready,
    /// Handed to a consumer under a lease.
    Leased,
    /// In the dead-letter state: out of attempts, or failed on purpose.
    Dead,
    /// Acked, and kept in the queue's completed history
    /// ([`Queue::set_history`](crate::Queue::set_history)); a queue without a history deletes
    /// a job at its ack. Since format 7.
    Completed,
    /// Cancelled ([`Queue::cancel`](crate::Queue::cancel)), with its reason. Kept in the
    /// history like a completed job, and while it fences a cancelled lease. Since format 7.
    Cancelled,
}

impl JobState {
    /// Every state, in the order a job usually passes through them.
    pub const ALL: [JobState; 6] = [
        JobState::Scheduled,
        JobState::Ready,
        JobState::Leased,
        JobState::Dead,
        JobState::Completed,
        JobState::Cancelled,
    ];

    /// The state's name in lower case (`"ready"`, `"dead"`, ...): the name the `leaseq` tool
    /// and the dashboard use, and [`JobState::from_name`] reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Ready => "ready",
            JobState::Leased => "leased",
            JobState::Dead => "dead",
            JobState::Completed => "completed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The state named `name` ([`JobState::as_str`]); `None` for any other text.
    pub fn from_name(name: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
