//! leaseq against effectum 0.7 (`benches/peers`): leaseq's side and effectum's two sides
//! (`peers_effectum`), each group in one run. Results:
//! `$CARGO_TARGET_DIR/criterion/effectum.<group>/<side>/new/estimates.json`.
//!
//! Before criterion, a self check runs 200 jobs through each effectum side and asserts that
//! each was completed exactly once as effectum's API reports it (so a broken side cannot
//! produce a fast number). `LEASEQ_PEERS_CHECK=1`: the check only.

use criterion::Criterion;
use peers_common::{LeaseqSide, for_each_group, run};
use peers_effectum::{AsShipped, EffectumAsShipped, EffectumWalFull, WalFull, check};

fn main() {
    let listing = std::env::args().any(|a| a == "--list");
    if !listing {
        println!("{}", check::<AsShipped>());
        println!("{}", check::<WalFull>());
        if std::env::var_os("LEASEQ_PEERS_CHECK").is_some_and(|v| v == "1") {
            return;
        }
    }
    let mut c = Criterion::default().configure_from_args();
    for_each_group(&mut c, "effectum", |group, kind| {
        run::<LeaseqSide>(group, kind);
        run::<EffectumAsShipped>(group, kind);
        run::<EffectumWalFull>(group, kind);
    });
    c.final_summary();
}
