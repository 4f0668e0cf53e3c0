//! Opens corrupted leaseq files and uses them: no panic may cross leaseq's API (leaseq catches
//! redb's panics at its boundary and returns `Error::Corrupted`); any `Err` is fine. The input
//! format is described in `tests/sim_model/corrupt.rs`: a mode byte (base image closed cleanly
//! or killed, with schedules or without; opened on a `SimDisk` or from a file), then 4-byte XOR
//! edits, then an optional truncation.
#![no_main]

use std::sync::Once;

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/sim_model/mod.rs"]
mod sim_model;

fuzz_target!(|data: &[u8]| {
    static HOOK: Once = Once::new();
    // libfuzzer-sys aborts on any panic, even one leaseq catches at its boundary (redb panics
    // on some corrupt files): keep panics silent and let the harness judge what escapes.
    // LEASEQ_FUZZ_PANIC_TRACE=1 prints every panic with its backtrace (to find where one
    // came from).
    HOOK.call_once(|| {
        if std::env::var_os("LEASEQ_FUZZ_PANIC_TRACE").is_some() {
            std::panic::set_hook(Box::new(|info| {
                eprintln!("{info}\n{}", std::backtrace::Backtrace::force_capture());
            }));
        } else {
            std::panic::set_hook(Box::new(|_| {}));
        }
    });
    if let Err(e) = sim_model::corrupt::open_corrupt(data) {
        eprintln!("{e}");
        std::process::abort();
    }
});
