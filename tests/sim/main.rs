//! leaseq's tests on the power-loss simulator (`leaseq::sim`, feature `sim`), in one binary:
//! the simulator itself (one file, then files sharing a power line), what a returned `Ok`
//! promises when the power fails, and the model-based crash test shared with the fuzz targets
//! (`tests/sim_model`). The smaller simulator-backed parts of other subjects stay in their
//! modules of `tests/core`, gated on the feature.

#[path = "../common/mod.rs"]
mod common;
#[path = "../sim_model/mod.rs"]
mod sim_model;

mod crash_model;
mod durability;
mod journal;
mod power_line;
mod simulator;
