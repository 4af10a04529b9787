//! The same seed gives the same trace (hash of every event) and prints the
//! same lines; another seed gives another trace; a printed plan replays.

mod common;

use tally_sim::cli::render_run;
use tally_sim::{run, FaultPlan};

#[test]
fn a_seed_replays_to_the_same_trace_and_lines() {
    let options = common::scenario();
    for seed in [1u64, 7, 42] {
        let first = run(seed, &options, None, false);
        let second = run(seed, &options, None, false);
        assert_eq!(first.trace_hash, second.trace_hash, "seed {seed}");
        assert_eq!(first.events, second.events);
        assert_eq!(
            render_run(&first, &options, None),
            render_run(&second, &options, None)
        );
        assert!(first.events > 2_000, "the scenario does something");
    }
}

#[test]
fn different_seeds_give_different_traces() {
    let options = common::scenario();
    let hashes: Vec<u64> = (0..5)
        .map(|seed| run(seed, &options, None, false).trace_hash)
        .collect();
    for (i, a) in hashes.iter().enumerate() {
        for b in &hashes[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn a_printed_plan_replays_the_same_run() {
    let options = common::scenario();
    let generated = run(3, &options, None, false);
    let plan: FaultPlan = generated.plan.to_string().parse().unwrap();
    let replayed = run(3, &options, Some(plan), false);
    assert_eq!(generated.trace_hash, replayed.trace_hash);
    let without_faults = run(3, &options, Some(FaultPlan::default()), false);
    assert_ne!(generated.trace_hash, without_faults.trace_hash);
    assert!(without_faults.passed());
}

#[test]
fn recording_a_report_does_not_change_the_run() {
    let options = common::scenario();
    let plain = run(5, &options, None, false);
    let recorded = run(5, &options, None, true);
    assert_eq!(plain.trace_hash, recorded.trace_hash);
    assert!(recorded
        .series
        .as_ref()
        .is_some_and(|s| !s.at_ms.is_empty()));
}
