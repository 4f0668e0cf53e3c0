#![doc = include_str!("../../docs/format.md")]
//!
//! In the code: `schema.rs` names the tables, keys and meta keys; `record.rs` is the job
//! record and its versions (the bytes of version 4 in `record/layout.rs`); `payload.rs` is
//! how typed payloads are encoded (the record stores only its tag); `schedule.rs` is the
//! schedule record (periodic jobs); `run_time.rs` the buckets of the run-time histogram; `queue_limit.rs` the row of a queue's
//! size limit.
//! `journal.rs` is the journal's bytes. A new on-disk rule lives
//! here and nowhere else.

pub(crate) mod journal;
pub(crate) mod payload;
pub(crate) mod queue_limit;
pub(crate) mod rate_log;
pub(crate) mod record;
pub(crate) mod run_time;
pub(crate) mod schedule;
pub(crate) mod schema;
