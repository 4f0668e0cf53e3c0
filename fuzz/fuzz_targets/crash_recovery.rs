//! Drives the model-based crash harness of `tests/sim/crash_model.rs` from fuzzer bytes: the first 8
//! bytes seed the simulated disks' crash images, every later byte is one choice of the workload
//! (which call, its options, where power fails). A violation of the model panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/sim_model/mod.rs"]
mod sim_model;

fuzz_target!(|data: &[u8]| {
    let settings = sim_model::Settings {
        min_steps: 0,
        max_steps: 400,
        full_check_every: 4,
    };
    let out = sim_model::run_bytes(data, settings);
    if out.violation.is_some() {
        panic!("{}", out.report());
    }
});
