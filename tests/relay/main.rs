//! The NATS JetStream relay (feature `nats`) against a real `nats-server`, in one binary: its
//! contract with the adversarial attempts to break it, and the kill tests.
//!
//! Tests that count this process's relay threads or their CPU run alone (an exclusive lock,
//! [`exclusive`]); every other test that starts a relay in this process shares it
//! ([`shared`]), whichever module it is in.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/nats.rs"]
mod nats;

mod cluster;
mod contract;
mod kills;
mod secure;

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Tests that measure this process's relay threads (count, CPU) hold it exclusively.
static GATE: RwLock<()> = RwLock::new(());

/// For a test that starts relays in this process.
fn shared() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(|e| e.into_inner())
}

/// For a test that counts this process's relay threads or their CPU.
fn exclusive() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(|e| e.into_inner())
}
