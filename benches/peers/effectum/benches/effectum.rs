//! leaseq against effectum 0.7 (`benches/peers`): leaseq's side and effectum's two sides
//! (`peers_effectum`), each group in one run. Results:
//! `$CARGO_TARGET_DIR/criterion/effectum.<group>/<side>/new/estimates.json`.
//!
//! Before criterion, a self check runs 200 jobs through each effectum side and asserts that
//! each was completed exactly once as effectum's API reports it (so a broken side cannot
//! produce a fast number), and leaseq's side is checked the same way. `LEASEQ_PEERS_CHECK=1`:
//! the checks only.

use criterion::Criterion;
use peers_common::{LeaseqSide, check_leaseq, check_only, for_each_group, run, run_sides};
use peers_effectum::{AsShipped, EffectumAsShipped, EffectumWalFull, WalFull, check};

fn main() {
    let listing = std::env::args().any(|a| a == "--list");
    if !listing {
        println!("{}", check_leaseq());
        println!("{}", check::<AsShipped>());
        println!("{}", check::<WalFull>());
        if check_only() {
            return;
        }
    }
    let mut c = Criterion::default().configure_from_args();
    for_each_group(&mut c, "effectum", |group, kind| {
        run_sides(
            group,
            kind,
            &[
                run::<LeaseqSide>,
                run::<EffectumAsShipped>,
                run::<EffectumWalFull>,
            ],
        );
    });
    c.final_summary();
}
