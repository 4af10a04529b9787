//! Retirements and folds in the simulator (`--retire`): the real core's fold
//! protocol passes a sweep with every fault on and folds writers in it, and
//! each fold bug planted in the core is caught by the checker's accounting;
//! the same with folds agreed and applied partition by partition
//! (`--fold-partitions`, cluster version 10).

mod common;

use tally_sim::sweep::sweep;
use tally_sim::{run, BugName, RunResult, SimOptions};

/// The test scenario with retirements: more wipes, so that most runs fold.
fn retiring() -> SimOptions {
    SimOptions {
        retire: true,
        retire_after_ms: 1_000,
        ..common::scenario()
    }
}

#[test]
fn a_sweep_with_retirements_passes_and_folds() {
    let options = retiring();
    let summary = sweep(0, 60, common::threads(), &options, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&options, None));
    let folded: u64 = summary.results.iter().map(|r| r.folds.writers_folded).sum();
    let runs_folding = summary
        .results
        .iter()
        .filter(|r| r.folds.writers_folded > 0)
        .count();
    let by_operator: u64 = summary
        .results
        .iter()
        .map(|r| r.folds.operator_retired)
        .sum();
    assert!(
        runs_folding >= 10,
        "only {runs_folding} runs folded ({folded} writers)"
    );
    assert!(by_operator > 0, "no operator retirement was accepted");
}

/// [`retiring`], folding partition by partition over 16 partitions.
fn retiring_by_partition() -> SimOptions {
    SimOptions {
        fold_partitions: 16,
        ..retiring()
    }
}

#[test]
fn a_sweep_folding_partition_by_partition_passes_and_folds() {
    let options = retiring_by_partition();
    let summary = sweep(10_000, 40, common::threads(), &options, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&options, None));
    let runs_folding = summary
        .results
        .iter()
        .filter(|r| r.folds.writers_folded > 0)
        .count();
    assert!(runs_folding >= 5, "only {runs_folding} runs folded");
}

#[test]
fn regions_of_two_nodes_fold_too() {
    let options = SimOptions {
        nodes_per_region: 2,
        async_nodes: 1,
        ..retiring()
    };
    let summary = sweep(5_000, 20, common::threads(), &options, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&options, None));
    assert!(summary.results.iter().any(|r| r.folds.writers_folded > 0));
}

#[track_caller]
fn caught(bug: BugName, kinds: &[&str], options: SimOptions) -> RunResult {
    let options = SimOptions {
        planted_bug: Some(bug),
        ..options
    };
    for seed in 0..60 {
        let result = run(seed, &options, None, false);
        if let Some(kind) = result.failure_kind() {
            assert!(
                kinds.contains(&kind),
                "{bug:?} caught as {kind:?}: {:?}",
                result.violations
            );
            return result;
        }
    }
    panic!("{bug:?} went unnoticed over 60 seeds");
}

#[test]
fn a_merge_that_keeps_a_folded_writers_slot_is_caught() {
    caught(
        BugName::MergeKeepsFoldedSlot,
        &["folded writer counted twice"],
        retiring(),
    );
}

#[test]
fn a_fold_before_every_member_reported_is_caught() {
    caught(
        BugName::FoldBeforeAgreement,
        &["fold base wrong", "fold lost adds"],
        retiring(),
    );
}

#[test]
fn the_fold_bugs_are_caught_when_folds_go_partition_by_partition() {
    caught(
        BugName::MergeKeepsFoldedSlot,
        &["folded writer counted twice"],
        retiring_by_partition(),
    );
    caught(
        BugName::FoldBeforeAgreement,
        &["fold base wrong", "fold lost adds"],
        retiring_by_partition(),
    );
}

#[test]
fn the_fold_bugs_are_harmless_without_retirements() {
    // Without retirements nothing folds, so the planted fold bugs never
    // act: the checker must not blame them for anything.
    for bug in [BugName::MergeKeepsFoldedSlot, BugName::FoldBeforeAgreement] {
        let options = SimOptions {
            planted_bug: Some(bug),
            ..common::scenario()
        };
        for seed in 0..5 {
            let result = run(seed, &options, None, false);
            assert!(
                result.passed(),
                "{bug:?} seed {seed}: {:?}",
                result.violations
            );
        }
    }
}
