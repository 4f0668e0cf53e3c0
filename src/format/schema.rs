//! The names and key layouts of every table leaseq owns, the meta keys, and the format
//! version. docs/format.md (this folder's module doc) describes each table and holds the
//! version history.

use redb::TableDefinition;

/// The format version this build writes, and the newest it reads.
pub const FORMAT_VERSION: u64 = 15;

pub(crate) type ReadyKey = (u32, u64, u64);

pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");
pub(crate) const QUEUES: TableDefinition<&str, u32> = TableDefinition::new("leaseq_queues");
/// The paused queues of the file: queue number → when it was paused (Unix ms). Since format 6.
pub(crate) const PAUSED: TableDefinition<u32, u64> = TableDefinition::new("leaseq_paused");
/// The completed history each queue keeps: queue number → (most jobs kept, longest kept in
/// ms; 0 for no bound of that kind). A queue without a row keeps none. Since format 7.
pub(crate) const HISTORY_LIMITS: TableDefinition<u32, (u64, u64)> =
    TableDefinition::new("leaseq_history_limits");
/// The schedules of the file (periodic jobs): (queue number, schedule name) → an encoded
/// [`ScheduleRecord`](crate::format::schedule::ScheduleRecord). Since format 8.
pub(crate) const SCHEDULES: TableDefinition<(u32, &str), &[u8]> =
    TableDefinition::new("leaseq_schedules");
/// Each schedule's next due time: (queue number, due time in Unix ms, schedule name), one
/// entry per schedule that has one. Since format 8.
pub(crate) const SCHEDULE_DUE: TableDefinition<(u32, u64, &str), ()> =
    TableDefinition::new("leaseq_schedule_due");
/// The last instance of each schedule: (queue number, job id) → when it ended in Unix ms
/// (acked, dead, cancelled or removed), or [`INSTANCE_LIVE`](crate::format::schedule::INSTANCE_LIVE)
/// while it is live. One entry per schedule that fired; so a due time can tell whether the
/// instance ended before it. Since format 8.
pub(crate) const SCHEDULE_INSTANCES: TableDefinition<(u32, u64), u64> =
    TableDefinition::new("leaseq_schedule_instances");
/// Each rate-limited queue's limit and its current window: queue number → (most deliveries
/// per window, the window in ms, when the current window started in Unix ms, deliveries
/// in it). A queue without a row is not limited. Since format 8.
pub(crate) const RATE_LIMITS: TableDefinition<u32, (u64, u64, u64, u64)> =
    TableDefinition::new("leaseq_rate_limits");
/// What each queue did per minute: (queue number, kind, minute since the Unix epoch) → how
/// many changes of that kind the minute's commits made (never 0). Kinds: 0 enqueued,
/// 1 completed, 2 retried, 3 dead, 4 cancelled, 5 dropped (since format 13)
/// ([`METRIC_KINDS`] of them). The last
/// [`METRICS_MINUTES_KEPT`](crate::METRICS_MINUTES_KEPT) minutes are kept: each commit that
/// counts in a queue removes up to 64 older rows of each kind of that queue. Since format 9.
pub(crate) const METRICS: TableDefinition<(u32, u8, u64), u64> =
    TableDefinition::new("leaseq_metrics");
/// How long the deliveries each queue's consumers ended in each minute ran, as a histogram:
/// (queue number, minute since the Unix epoch, bucket) → how many runs fell in the bucket
/// (never 0). Bucket `b` holds runs of `b` ms for `b` < 8, then four buckets per doubling
/// (`format::run_time::bucket`), [`RUN_BUCKETS`] of them. Kept and pruned as
/// `leaseq_metrics` is. Since format 12.
pub(crate) const RUN_TIMES: TableDefinition<(u32, u64, u8), u64> =
    TableDefinition::new("leaseq_run_times");
/// Each size-limited queue's limit and the payload bytes of the jobs it counts: queue number
/// → a [`LimitRow`](crate::format::queue_limit::LimitRow). A queue without a row has no
/// limit. Since format 13.
pub(crate) const QUEUE_LIMITS: TableDefinition<u32, (u64, u64, u64, u64)> =
    TableDefinition::new("leaseq_queue_limits");
/// How many jobs each queue dropped to make room for newer ones
/// ([`WhenFull::DropOldest`](crate::WhenFull::DropOldest)): queue number → the count since
/// the queue began (never 0; a queue that dropped none has no row). Since format 13.
pub(crate) const DROPPED: TableDefinition<u32, u64> = TableDefinition::new("leaseq_dropped");
/// The cancelled deliveries an ordered group still waits for: (queue number, the fenced
/// lease's deadline in Unix ms, job id) → that lease's token, one entry per job of a group
/// cancelled while leased whose delivery has not ended. The job stays its group's member (in `leaseq_groups`) while
/// its entry lasts: until the ack, nack, snooze or fail of that token is answered
/// `Cancelled`, the deadline passes (a dequeue's sweep), or the next open (the worker's
/// process is gone). Since format 14.
pub(crate) const GROUP_FENCES: TableDefinition<(u32, u64, u64), u64> =
    TableDefinition::new("leaseq_group_fences");
/// How many run-time buckets `leaseq_run_times` holds (0 to this, exclusive).
pub(crate) const RUN_BUCKETS: u8 = super::run_time::BUCKETS;
/// How many kinds of metric `leaseq_metrics` holds (the kinds are 0 to this, exclusive).
pub(crate) const METRIC_KINDS: u8 = crate::metrics::METRIC_KINDS as u8;
/// A quarantined row: when it was moved aside (Unix ms), why, and its bytes as they were found.
pub(crate) type QuarantineValue = (u64, &'static str, &'static [u8]);

/// One queue's schema: the names of its tables. The default queue's are the names in the
/// table above; a named queue's carry its number (`leaseq_q7_jobs`, ...). `leaseq_meta` is the
/// file's, shared.
#[derive(Debug)]
pub(crate) struct QueueSchema {
    /// The queue's number: 0 for the default queue.
    pub queue_number: u32,
    jobs: &'static str,
    ready: &'static str,
    scheduled: &'static str,
    leases: &'static str,
    dead: &'static str,
    dead_by_time: &'static str,
    dedup: &'static str,
    dedup_windows: &'static str,
    dedup_expiry: &'static str,
    applied: &'static str,
    applied_by_time: &'static str,
    idem_jobs: &'static str,
    payloads: &'static str,
    quarantine: &'static str,
    completed: &'static str,
    cancelled: &'static str,
    groups: &'static str,
    held: &'static str,
}

/// The default queue's tables.
pub(crate) static DEFAULT_SCHEMA: QueueSchema = QueueSchema {
    queue_number: 0,
    jobs: "leaseq_jobs",
    ready: "leaseq_ready",
    scheduled: "leaseq_scheduled",
    leases: "leaseq_leases",
    dead: "leaseq_dead",
    dead_by_time: "leaseq_dead_by_time",
    dedup: "leaseq_dedup",
    dedup_windows: "leaseq_dedup_windows",
    dedup_expiry: "leaseq_dedup_expiry",
    applied: "leaseq_applied",
    applied_by_time: "leaseq_applied_by_time",
    idem_jobs: "leaseq_idem_jobs",
    payloads: "leaseq_payloads",
    quarantine: "leaseq_quarantine",
    completed: "leaseq_completed",
    cancelled: "leaseq_cancelled",
    groups: "leaseq_groups",
    held: "leaseq_held",
};

impl QueueSchema {
    /// The tables of named queue number `queue_number` (at least 1). Their names are made once per
    /// number and kept for the life of the process (at most `QUEUES_MAX` sets).
    pub(crate) fn named(queue_number: u32) -> &'static QueueSchema {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static NAMED: OnceLock<Mutex<HashMap<u32, &'static QueueSchema>>> = OnceLock::new();
        debug_assert!(
            (1..=crate::limits::QUEUES_MAX).contains(&queue_number),
            "queue number {queue_number}"
        );
        let mut map = NAMED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(queue_number).or_insert_with(|| {
            let name = |suffix: &str| -> &'static str {
                Box::leak(format!("leaseq_q{queue_number}_{suffix}").into_boxed_str())
            };
            Box::leak(Box::new(QueueSchema {
                queue_number,
                jobs: name("jobs"),
                ready: name("ready"),
                scheduled: name("scheduled"),
                leases: name("leases"),
                dead: name("dead"),
                dead_by_time: name("dead_by_time"),
                dedup: name("dedup"),
                dedup_windows: name("dedup_windows"),
                dedup_expiry: name("dedup_expiry"),
                applied: name("applied"),
                applied_by_time: name("applied_by_time"),
                idem_jobs: name("idem_jobs"),
                payloads: name("payloads"),
                quarantine: name("quarantine"),
                completed: name("completed"),
                cancelled: name("cancelled"),
                groups: name("groups"),
                held: name("held"),
            }))
        })
    }

    /// Creates every table of this queue that does not exist yet (`leaseq_quarantine` is
    /// made on first use).
    pub(crate) fn create(&self, tx: &impl CreateTables) -> Result<(), redb::TableError> {
        tx.create_table(self.jobs())?;
        tx.create_table(self.ready())?;
        tx.create_table(self.scheduled())?;
        tx.create_table(self.leases())?;
        tx.create_table(self.dead())?;
        tx.create_table(self.dead_by_time())?;
        tx.create_table(self.dedup())?;
        tx.create_table(self.dedup_windows())?;
        tx.create_table(self.dedup_expiry())?;
        tx.create_table(self.applied())?;
        tx.create_table(self.applied_by_time())?;
        tx.create_table(self.idem_jobs())?;
        tx.create_table(self.payloads())?;
        tx.create_table(self.completed())?;
        tx.create_table(self.cancelled())?;
        tx.create_table(self.groups())?;
        tx.create_table(self.held())?;
        Ok(())
    }

    /// The queue number in a named queue's table name (`leaseq_q7_jobs` → 7), if it is one.
    pub(crate) fn number_in(table: &str) -> Option<u32> {
        let rest = table.strip_prefix("leaseq_q")?;
        let (digits, _) = rest.split_once('_')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// Validates a queue name: 1 to `QUEUE_NAME_BYTES_MAX` bytes of ASCII letters, digits, `_`,
    /// `-` and `.`.
    pub(crate) fn validate_queue_name(name: &str) -> crate::error::Result<()> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty()
            || name.len() > crate::limits::QUEUE_NAME_BYTES_MAX
            || !name.chars().all(ok_char)
        {
            return Err(crate::error::Error::invalid_option(
                "queue name",
                format!(
                    "{name:?}: 1 to {} bytes of ASCII letters, digits, '_', '-' and '.'",
                    crate::limits::QUEUE_NAME_BYTES_MAX
                ),
            ));
        }
        Ok(())
    }
    pub(crate) fn jobs(&self) -> TableDefinition<'static, u64, &'static [u8]> {
        TableDefinition::new(self.jobs)
    }
    pub(crate) fn ready(&self) -> TableDefinition<'static, ReadyKey, ()> {
        TableDefinition::new(self.ready)
    }
    pub(crate) fn scheduled(&self) -> TableDefinition<'static, (u64, u64), ()> {
        TableDefinition::new(self.scheduled)
    }
    pub(crate) fn leases(&self) -> TableDefinition<'static, (u64, u64), ()> {
        TableDefinition::new(self.leases)
    }
    pub(crate) fn dead(&self) -> TableDefinition<'static, u64, ()> {
        TableDefinition::new(self.dead)
    }
    pub(crate) fn dead_by_time(&self) -> TableDefinition<'static, (u64, u64), ()> {
        TableDefinition::new(self.dead_by_time)
    }
    pub(crate) fn dedup(&self) -> TableDefinition<'static, &'static [u8], u64> {
        TableDefinition::new(self.dedup)
    }
    pub(crate) fn dedup_windows(&self) -> TableDefinition<'static, &'static [u8], u64> {
        TableDefinition::new(self.dedup_windows)
    }
    pub(crate) fn dedup_expiry(&self) -> TableDefinition<'static, (u64, &'static [u8]), ()> {
        TableDefinition::new(self.dedup_expiry)
    }
    pub(crate) fn applied(&self) -> TableDefinition<'static, &'static [u8], u64> {
        TableDefinition::new(self.applied)
    }
    pub(crate) fn applied_by_time(&self) -> TableDefinition<'static, (u64, &'static [u8]), ()> {
        TableDefinition::new(self.applied_by_time)
    }
    pub(crate) fn idem_jobs(&self) -> TableDefinition<'static, (&'static [u8], u64), ()> {
        TableDefinition::new(self.idem_jobs)
    }
    pub(crate) fn payloads(&self) -> TableDefinition<'static, u64, &'static [u8]> {
        TableDefinition::new(self.payloads)
    }
    /// Completed jobs kept in the history, by when they completed: (completed_ms, job id).
    pub(crate) fn completed(&self) -> TableDefinition<'static, (u64, u64), ()> {
        TableDefinition::new(self.completed)
    }
    /// Cancelled jobs, by when their row may go: (history_ms, job id).
    pub(crate) fn cancelled(&self) -> TableDefinition<'static, (u64, u64), ()> {
        TableDefinition::new(self.cancelled)
    }
    /// The live members of each ordered group: (group key, the job's group order) → job id,
    /// for its scheduled, ready and leased jobs; its first member is the group's head. Since
    /// format 8.
    pub(crate) fn groups(&self) -> TableDefinition<'static, (&'static [u8], u64), u64> {
        TableDefinition::new(self.groups)
    }
    /// Ready jobs held behind their group's head, by (group key, job id): they are in no
    /// `ready` entry until they become the head. Since format 8.
    pub(crate) fn held(&self) -> TableDefinition<'static, (&'static [u8], u64), ()> {
        TableDefinition::new(self.held)
    }
    pub(crate) fn quarantine(&self) -> TableDefinition<'static, u64, QuarantineValue> {
        TableDefinition::new(self.quarantine)
    }
}

/// `leaseq_meta` keys.
pub(crate) const META_FORMAT_VERSION: &str = "format_version";
/// The next job id to hand out (ids start at 1, never reused).
pub(crate) const META_NEXT_ID: &str = "next_id";
/// The next lease token to hand out (tokens start at 1, never reused, across reopens).
pub(crate) const META_NEXT_TOKEN: &str = "next_token";
/// A random id of the file (any `u64` but 0), written by the first `Queue::file_id` call and
/// never changed; relays make message ids unique across files from it. An optional key: a file
/// without it is complete, so adding it needs no format version.
pub(crate) const META_FILE_ID: &str = "file_id";

/// The journal's meta keys (optional: a file that never had a journal has none of them, so
/// adding them needs no format version; docs/format.md, "The journal"). The id of the
/// journal session whose frames the file may need (drawn at each writable open with the
/// journal on; its header and every frame carry it).
pub(crate) const META_JOURNAL_ID: &str = "journal_id";
/// The last frame (sequence number) this file holds: replay applies the frames after it.
/// Written by every checkpoint.
pub(crate) const META_JOURNAL_SEQ: &str = "journal_seq";
/// 1 while a session journals into the file's journal, 0 once it closed cleanly (its last
/// checkpoint holds everything): with 1, a missing journal is reported.
pub(crate) const META_JOURNAL_OPEN: &str = "journal_open";
/// Since when (Unix ms) the file is storage full (its disk reserve reached), 0 or missing
/// while it has room; written by the commit after the state turns. An optional key, as
/// `file_id`: a file without it has room, so adding it needs no format version.
pub(crate) const META_STORAGE_FULL_MS: &str = "storage_full_ms";

/// Ready-queue rank of a priority: lower priority values are served first, as in Oban, River
/// and BullMQ. The map is order-preserving from `i32` onto `u32`.
pub(crate) fn priority_rank(priority: i32) -> u32 {
    (i64::from(priority) - i64::from(i32::MIN)) as u32
}

/// The first byte of an applied marker's key made from a caller's idempotency key.
pub(crate) const MARKER_TAG_KEY: u8 = 1;

/// The first byte of an applied marker's key made from a job id (8 bytes, big-endian). Only
/// format 1 wrote such markers; the upgrade to format 2 removes them.
pub(crate) const MARKER_TAG_ID: u8 = 0;

/// The key under which the applied-ids marker of a caller's idempotency key is stored: the
/// key behind [`MARKER_TAG_KEY`], so it never collides with a format-1 marker of a job id.
pub(crate) fn marker_key(idempotency_key: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(idempotency_key.len() + 1);
    v.push(MARKER_TAG_KEY);
    v.extend_from_slice(idempotency_key);
    v
}

/// What creates a table that does not exist: a write transaction (a new file's), or a
/// group's (`commit::GroupTx`, which marks the group).
pub(crate) trait CreateTables {
    /// Creates table `def` unless it exists.
    fn create_table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<'static, K, V>,
    ) -> Result<(), redb::TableError>;
}

impl CreateTables for redb::WriteTransaction {
    fn create_table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<'static, K, V>,
    ) -> Result<(), redb::TableError> {
        self.open_table(def).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_rank_preserves_order_at_both_ends() {
        let ps = [i32::MIN, i32::MIN + 1, -1, 0, 1, i32::MAX - 1, i32::MAX];
        for w in ps.windows(2) {
            assert!(priority_rank(w[0]) < priority_rank(w[1]), "{w:?}");
        }
        assert_eq!(priority_rank(i32::MIN), 0);
        assert_eq!(priority_rank(i32::MAX), u32::MAX);
    }

    #[test]
    fn marker_keys_never_collide_with_format_1_id_markers() {
        // A caller key of 8 bytes looks like a job id; its tag keeps it apart.
        let id_like = 7u64.to_be_bytes();
        let key = marker_key(&id_like);
        assert_eq!(key[0], MARKER_TAG_KEY);
        assert_ne!(MARKER_TAG_KEY, MARKER_TAG_ID);
        assert_eq!(&key[1..], &id_like);
        assert_eq!(marker_key(b""), vec![MARKER_TAG_KEY]);
    }
}
