//! The async face (feature `async`, and the async pool of feature `tokio`) on tokio, in one binary: calls that never block a
//! runtime thread on a commit, consumers woken by the queue's own signal, cancel-safe
//! dequeues, and the app's lifecycle (close, stop, shutdown) seen from async code.

#[path = "../common/mod.rs"]
mod common;

mod adversarial;
mod calls;
mod face;
mod pool;
mod support;
