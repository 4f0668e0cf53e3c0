//! The user guide: how to use leaseq well, one concept per chapter.
//!
//! These modules hold no code, only documentation (as clap's `_tutorial`); every example in
//! them is compiled and run by `cargo test --doc` (in a temporary directory; the HTTP client
//! of the outbox example is a stand-in). The reference for each type and call is on its own
//! page; the chapters explain how the calls fit together and why.
//!
//! | chapter | what it covers |
//! |---|---|
//! | `building_an_app` (feature `tokio`) | an app on tokio from start to quit: one instance, the async face and pools, a staged handler calling a server, a status view from events, a clean shutdown (features `async`, `tokio`) |
//! | [`exactly_once`] | why delivery cannot be exactly-once, and how [`Lease::ack_with`](crate::Lease::ack_with) makes the *effect* exactly-once; fencing tokens; external effects (an HTTP call) under an idempotency key; the outbox |
//! | [`typed_jobs`] | serde values as payloads; bincode or JSON; changing a job type across app versions |
//! | [`stopping`] | closing the file, stopping some consumers, jobs longer than their lease (extend, heartbeats), and the ways of giving a job back (nack, snooze, fail, [`Outcome`](crate::Outcome)) |
//! | [`named_queues`] | several queues in one file, and a job's next step in another queue in the same commit |
//! | [`flow_control`] | ordered groups (one job per document at a time), rate limits, execution timeouts, progress |
//! | [`periodic_jobs`] | schedules stored in the file: intervals and cron in a time zone, overlap, missed due times, crashes; against River, Oban and BullMQ |
//! | [`operations`] | running for years: what grows, retention, compaction, format upgrades, logs |
//! | [`durability`] | the durability and integrity switches and what they cost; group commit; the crash demo |
//! | [`comparison`] | when you outgrow one machine: leaseq's concepts in SQS, River and NATS JetStream; moving the jobs |
//! | [`platforms`] | file systems, per-platform advice, 32-bit targets |
//!
//! Elsewhere: the worker pool's guide is its module page, [`worker`](crate::worker); the NATS
//! JetStream relay's is `leaseq::relay` (feature `nats`).

#[cfg(feature = "tokio")]
#[doc = include_str!("building_an_app.md")]
pub mod building_an_app {}

#[doc = include_str!("exactly_once.md")]
pub mod exactly_once {}

#[doc = include_str!("typed_jobs.md")]
pub mod typed_jobs {}

#[doc = include_str!("stopping.md")]
pub mod stopping {}

#[doc = include_str!("named_queues.md")]
pub mod named_queues {}

#[doc = include_str!("flow_control.md")]
pub mod flow_control {}

#[doc = include_str!("periodic_jobs.md")]
pub mod periodic_jobs {}

#[doc = include_str!("operations.md")]
pub mod operations {}

#[doc = include_str!("durability.md")]
pub mod durability {}

#[doc = include_str!("comparison.md")]
pub mod comparison {}

#[doc = include_str!("platforms.md")]
pub mod platforms {}
