//! A queue's size limit: [`QueueLimit`] bounds the jobs a queue holds (a count and the bytes of
//! their payloads) and [`WhenFull`] says what an enqueue into a full queue does, as RabbitMQ's
//! `x-max-length` / `x-max-length-bytes` with `x-overflow`, NATS JetStream's `max_msgs` /
//! `max_bytes` with `discard`, and Vector's buffers with `when_full`. Stored in the file with
//! the queue ([`Queue::set_limit`](crate::Queue::set_limit)). The `Queue` calls are
//! `queue/controls.rs`; the engine's side is `store/queue_limit.rs`.

/// At most `max_jobs` jobs and `max_bytes` bytes of payload in a queue, counting the jobs
/// [`Queue::len`](crate::Queue::len) counts: scheduled, ready (held behind an ordered group's
/// head included) and leased. Dead, completed and cancelled jobs are not counted (dead jobs
/// have their own limit, [`Builder::dead_jobs_max`](crate::Builder::dead_jobs_max)).
///
/// A limit bounds enqueues only: a job that comes back (a nack, an expired lease, a retry
/// or requeue of a dead job) always finds its place, and so does a new payload given to a
/// waiting job ([`Queue::update_payload`](crate::Queue::update_payload)), so a queue can be over its limit after
/// a limit was lowered or a dead job was requeued; enqueues then wait for (or make) room as
/// [`WhenFull`] says.
///
/// Two ways the check is stricter than it need be (each refuses, never lets a queue grow
/// past its limit): a job an `ack_with` closure enqueues into its own full queue is refused
/// though the acked job leaves in the same commit (the closure may go on without it; passing
/// the refusal on makes the attempt fail); and a duplicate under
/// [`OnDuplicate::Replace`](crate::OnDuplicate::Replace) or `Debounce` counts its whole
/// payload toward `max_bytes`, replaced or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimit {
    /// The most jobs the queue holds (at least 1), or `None` for no count limit.
    pub max_jobs: Option<u64>,
    /// The most bytes of payload its jobs hold together (at least 1), or `None` for no byte
    /// limit. Payload bytes only: a job's row, keys and index entries take
    /// around 100 more bytes each on disk.
    pub max_bytes: Option<u64>,
    /// What an enqueue that does not fit does.
    pub when_full: WhenFull,
}

/// What an enqueue into a full queue does (a [`QueueLimit`]'s `when_full`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// Refuse it: [`Error::QueueFull`](crate::Error::QueueFull), nothing written (RabbitMQ's
    /// `reject-publish`, JetStream's `discard: new`). The default.
    #[default]
    Refuse,
    /// Wait up to `wait_ms` (1 ms to one hour) for room, then refuse it as `Refuse` does
    /// (persist-queue's `put(block=True, timeout)`, Vector's `block`), trying again at least
    /// every 50 ms. A blocking `Queue` call waits on its thread; an `AsyncQueue` call awaits
    /// a timer between tries, holding no thread (neither the runtime's nor a helper's).
    /// Inside a transaction ([`Tx::enqueue`](crate::Tx::enqueue), an `ack_with` closure)
    /// nothing can wait: the enqueue is refused at once.
    Block {
        /// The longest wait, in ms.
        wait_ms: u64,
    },
    /// Make room by deleting the oldest waiting jobs (RabbitMQ's `drop-head`, JetStream's
    /// `discard: old`): ready jobs first, those a dequeue would serve last by priority (the
    /// highest `priority` value) first and in their order of delivery within a priority,
    /// then scheduled jobs by due time. A leased job is never
    /// dropped, nor a job held behind its ordered group's head. Each dropped job is an
    /// [`Event::Dropped`](crate::Event::Dropped), counted in [`Stats::dropped`](crate::Stats::dropped)
    /// and in the minute's metrics; it is deleted as [`Queue::remove`](crate::Queue::remove)
    /// deletes (its dedup key released), in the enqueue's commit, and never delivered. If
    /// the jobs that can be dropped do not make room, the enqueue is refused as `Refuse`
    /// does and nothing is dropped.
    DropOldest,
}

impl QueueLimit {
    /// At most `max_jobs` jobs, refusing the enqueues that do not fit.
    pub fn jobs(max_jobs: u64) -> QueueLimit {
        QueueLimit {
            max_jobs: Some(max_jobs),
            max_bytes: None,
            when_full: WhenFull::Refuse,
        }
    }

    /// At most `max_bytes` bytes of payload, refusing the enqueues that do not fit.
    pub fn bytes(max_bytes: u64) -> QueueLimit {
        QueueLimit {
            max_jobs: None,
            max_bytes: Some(max_bytes),
            when_full: WhenFull::Refuse,
        }
    }

    /// This limit with a count limit of `max_jobs` as well.
    pub fn and_jobs(mut self, max_jobs: u64) -> QueueLimit {
        self.max_jobs = Some(max_jobs);
        self
    }

    /// This limit with a byte limit of `max_bytes` as well.
    pub fn and_bytes(mut self, max_bytes: u64) -> QueueLimit {
        self.max_bytes = Some(max_bytes);
        self
    }

    /// This limit doing `when_full` when full.
    pub fn when_full(mut self, when_full: WhenFull) -> QueueLimit {
        self.when_full = when_full;
        self
    }
}

impl WhenFull {
    /// [`WhenFull::Block`] for up to `wait` (whole ms).
    pub fn block(wait: std::time::Duration) -> WhenFull {
        WhenFull::Block {
            wait_ms: crate::clock::duration_ms(wait),
        }
    }
}
