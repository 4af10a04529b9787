//! The checker passes the real core over a few hundred seeds, with every
//! fault on, and the convergence stays under its bound.

mod common;

use tally_sim::sweep::sweep;
use tally_sim::SimOptions;

#[test]
fn three_hundred_seeds_pass_on_the_correct_core() {
    let options = common::scenario();
    let summary = sweep(0, 300, common::threads(), &options, None, false);
    let failures: Vec<String> = summary
        .results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("seed {}: {:?}", r.seed, r.violations.first()))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
    let converged = summary
        .results
        .iter()
        .filter(|r| r.convergence_ms.is_some())
        .count();
    assert_eq!(converged, 300);
    let adds: u64 = summary.results.iter().map(|r| r.workload.adds).sum();
    let unacked_applied: u64 = summary
        .results
        .iter()
        .map(|r| r.slots.unacked_applied)
        .sum();
    assert!(adds > 100_000, "{adds}");
    assert!(
        unacked_applied > 0,
        "faults left some adds unacknowledged yet applied"
    );
}

#[test]
fn regions_of_several_nodes_and_async_nodes_pass_too() {
    let options = SimOptions {
        nodes_per_region: 2,
        async_nodes: 2,
        ..common::scenario()
    };
    let summary = sweep(1_000, 40, common::threads(), &options, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&options, None));
    assert!(summary.results.iter().any(|r| r.workload.async_acked > 0));
}

#[test]
fn like_sets_and_uniques_pass_with_every_fault() {
    let options = SimOptions {
        sets: true,
        nodes_per_region: 2,
        async_nodes: 1,
        ..common::scenario()
    };
    let summary = sweep(2_000, 40, common::threads(), &options, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&options, None));
}
