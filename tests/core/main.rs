//! leaseq's integration tests on the default features, in one binary (one link against
//! leaseq and redb instead of one per file): the public API on real files with a manual
//! clock, and real processes killed with SIGKILL. One module per subject; each opens with
//! its goal and method. Scenario ids (C01-C39) are listed in `docs/testing.md`.
//!
//! Parts that need the power-loss simulator are gated on the `sim` feature inside their
//! subject's module (`cargo test --all-features` runs them). Tests that re-run this binary as
//! a child process name their child test by its path in this binary (`recovery::...`).

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod adversarial_flow;
mod bad_files;
mod batch;
mod clock_wakeups;
mod compact;
mod controls;
mod controls_adversarial;
mod dedup;
mod disk_reserve;
mod effect;
mod events;
mod files;
mod group_commit;
mod groups;
mod import;
mod io_faults;
mod journal;
mod lease;
mod lifecycle;
mod lifecycle_adversarial;
mod metrics;
mod named;
mod outbox;
mod pause;
mod process_kill;
mod progress;
mod quarantine;
mod queue_limits;
mod rate_limit;
mod reader;
mod recovery;
mod retention;
mod retry;
mod schedules;
mod snooze;
mod stopping;
mod stranded_leases;
mod typed;
mod upgrade;
mod worker;
mod write_amplification;
