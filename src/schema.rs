//! The on-disk format: every table leaseq owns, its key layout, and the format version.
//!
//! All names start with `leaseq_`; the caller's own tables may share the file. Integer tuple
//! keys compare numerically in redb, so the orderings below need no manual byte encoding.
//!
//! | table | key | value | meaning |
//! |---|---|---|---|
//! | `leaseq_jobs` | job id | encoded [`JobRecord`](crate::codec::JobRecord) | every live job, one row each |
//! | `leaseq_ready` | (priority rank, seq, job id) | () | jobs a dequeue may take; the first entry is served first; `seq` is drawn each time a job becomes ready, so within a priority jobs are served in the order they became ready, whatever the clock does |
//! | `leaseq_scheduled` | (run_at_ms, job id) | () | delayed or backing-off jobs, due at `run_at_ms` |
//! | `leaseq_leases` | (deadline_ms, job id) | () | leased jobs by lease deadline |
//! | `leaseq_dead` | job id | () | dead-lettered jobs |
//! | `leaseq_dead_by_time` | (died_ms, job id) | () | the same by when they died, for `Builder::dead_retention` |
//! | `leaseq_dedup` | dedup key | job id | producer dedup: the job that holds the key (live; or, within its dedup window, possibly gone) |
//! | `leaseq_dedup_windows` | dedup key | expires_ms | keys held for a window after enqueue: until then, whatever the job does |
//! | `leaseq_dedup_expiry` | (expires_ms, dedup key) | () | the same windows by end, for pruning |
//! | `leaseq_applied` | applied key | kept_since_ms | idempotency keys whose effect committed; the marker's retention counts from `kept_since_ms`: when it was applied, or later, when a prune last found a live job carrying the key |
//! | `leaseq_applied_by_time` | (kept_since_ms, applied key) | () | the same markers by age, for pruning |
//! | `leaseq_idem_jobs` | (applied key, job id) | () | every live job (scheduled, ready, leased, dead) that carries a caller idempotency key: a marker it names is never pruned |
//! | `leaseq_payloads` | job id | payload bytes | payloads of more than `PAYLOAD_INLINE_MAX` (1 KiB) bytes, stored apart from their record (which holds their length and checksum), so a state change never rewrites them |
//! | `leaseq_meta` | name | u64 | format version and counters |
//! | `leaseq_queues` | queue name | u32 | the named queues and their numbers |
//! | `leaseq_quarantine` | job id | (quarantined_ms, reason, raw record bytes) | job rows that failed their checks, moved aside whole so the rest of the queue goes on |
//!
//! Version history:
//! - 1: the first format.
//! - 2: applied markers get a time index (`leaseq_applied_by_time`) and the caller idempotency
//!   keys of live jobs an index (`leaseq_idem_jobs`), so markers can be pruned by age without
//!   ever removing one a live job carries; no marker is written for a job's own id. Dedup
//!   keys can be held for a window (`leaseq_dedup_windows`, `leaseq_dedup_expiry`). Job
//!   records are of record version 2 (a job's own retry policy and dedup window). Dead jobs
//!   are indexed by when they died (`leaseq_dead_by_time`). The
//!   upgrade from 1 builds both indexes from `leaseq_applied` and `leaseq_jobs` in one
//!   transaction at the first writable open (a version-1 build then refuses the file: it
//!   would not keep the indexes).
//!
//! - 3: payloads of more than 1 KiB are stored apart from their record, in `leaseq_payloads`
//!   (record version 3 holds their length and checksum); smaller ones stay inline. The
//!   upgrade from 2 moves every larger inline payload out, in one transaction at the first
//!   writable open.
//! - 4: named queues. `leaseq_queues` maps each queue name to its number (1 and up); queue
//!   `n` has every table above but `leaseq_meta` (shared: ids and tokens are unique in the
//!   file) under the name `leaseq_q{n}_…` (`leaseq_q1_jobs`, `leaseq_q1_ready`, …). The
//!   tables listed above are the default (unnamed) queue's. The upgrade from 3 creates the
//!   empty registry.
//! - 5: job records of record version 4: a snooze count and the encoding of a typed payload.
//!   No table changes; records of version 3 are still read (never snoozed, no recorded
//!   encoding), so the upgrade from 4 only sets the version (a version-4 build then refuses
//!   the file instead of quarantining the records it cannot read).
//!
//! `leaseq_quarantine` (added within version 1) is created by the first `ack_with` (held open
//! while closures run, so they cannot open it) or the first quarantine; a file without it has
//! nothing quarantined.

use redb::TableDefinition;

/// The format version this build writes, and the newest it reads.
pub const FORMAT_VERSION: u64 = 5;

pub(crate) type ReadyKey = (u32, u64, u64);

pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");
pub(crate) const QUEUES: TableDefinition<&str, u32> = TableDefinition::new("leaseq_queues");
/// A quarantined row: when it was moved aside (Unix ms), why, and its bytes as they were found.
pub(crate) type QuarantineValue = (u64, &'static str, &'static [u8]);

/// The names of one queue's tables. The default queue's are the names in the table above;
/// a named queue's carry its number (`leaseq_q7_jobs`, ...). `leaseq_meta` is the file's, shared.
#[derive(Debug)]
pub(crate) struct QueueTables {
    /// The queue's number: 0 for the default queue.
    pub qid: u32,
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
}

/// The default queue's tables.
pub(crate) static DEFAULT_TABLES: QueueTables = QueueTables {
    qid: 0,
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
};

impl QueueTables {
    /// The tables of named queue number `qid` (at least 1). Their names are made once per
    /// number and kept for the life of the process (at most `QUEUES_MAX` sets).
    pub(crate) fn named(qid: u32) -> &'static QueueTables {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static NAMED: OnceLock<Mutex<HashMap<u32, &'static QueueTables>>> = OnceLock::new();
        debug_assert!((1..=crate::QUEUES_MAX).contains(&qid), "queue number {qid}");
        let mut map = NAMED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(qid).or_insert_with(|| {
            let name = |suffix: &str| -> &'static str {
                Box::leak(format!("leaseq_q{qid}_{suffix}").into_boxed_str())
            };
            Box::leak(Box::new(QueueTables {
                qid,
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
            }))
        })
    }

    /// Creates every table of this queue that does not exist yet (`leaseq_quarantine` is
    /// made on first use).
    pub(crate) fn create(&self, tx: &redb::WriteTransaction) -> Result<(), redb::TableError> {
        tx.open_table(self.jobs())?;
        tx.open_table(self.ready())?;
        tx.open_table(self.scheduled())?;
        tx.open_table(self.leases())?;
        tx.open_table(self.dead())?;
        tx.open_table(self.dead_by_time())?;
        tx.open_table(self.dedup())?;
        tx.open_table(self.dedup_windows())?;
        tx.open_table(self.dedup_expiry())?;
        tx.open_table(self.applied())?;
        tx.open_table(self.applied_by_time())?;
        tx.open_table(self.idem_jobs())?;
        tx.open_table(self.payloads())?;
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

    /// Checks a queue name: 1 to `QUEUE_NAME_BYTES_MAX` bytes of ASCII letters, digits, `_`,
    /// `-` and `.`.
    pub(crate) fn check_name(name: &str) -> crate::Result<()> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty() || name.len() > crate::QUEUE_NAME_BYTES_MAX || !name.chars().all(ok_char)
        {
            return Err(crate::Error::invalid_option(
                "queue name",
                format!(
                    "{name:?}: 1 to {} bytes of ASCII letters, digits, '_', '-' and '.'",
                    crate::QUEUE_NAME_BYTES_MAX
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

/// Ready-queue rank of a priority: lower priority values are served first, as in Oban, River
/// and BullMQ. The map is order-preserving from `i32` onto `u32`.
pub(crate) fn priority_rank(priority: i32) -> u32 {
    (i64::from(priority) - i64::from(i32::MIN)) as u32
}

/// The key under which an effect's applied-ids marker is stored: a caller's idempotency key
/// (tag 1) or, by default, the job id (tag 0), so the two can never collide.
pub(crate) fn applied_key(idempotency_key: Option<&[u8]>, job_id: u64) -> Vec<u8> {
    match idempotency_key {
        Some(k) => {
            let mut v = Vec::with_capacity(k.len() + 1);
            v.push(1);
            v.extend_from_slice(k);
            v
        }
        None => {
            let mut v = Vec::with_capacity(9);
            v.push(0);
            v.extend_from_slice(&job_id.to_be_bytes());
            v
        }
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
    fn applied_keys_of_ids_and_caller_keys_never_collide() {
        let by_id = applied_key(None, 7);
        let by_key = applied_key(Some(&7u64.to_be_bytes()), 0);
        assert_ne!(by_id, by_key);
        assert_eq!(by_id[0], 0);
        assert_eq!(by_key[0], 1);
    }
}
