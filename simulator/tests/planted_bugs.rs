//! A checker that cannot fail is worth nothing: each bug planted in the core
//! (feature `planted-bugs` of tally-node, enabled for these tests) is caught
//! within a bounded number of seeds, with the violation that names it, and
//! the failing plan shrinks to a smaller one that still fails.

mod common;

use tally_sim::shrink::shrink;
use tally_sim::{run, BugName, RunResult, SimOptions};

const MAX_SEEDS: u64 = 40;

#[track_caller]
fn first_failure(bug: BugName, options: &SimOptions) -> RunResult {
    let options = SimOptions {
        planted_bug: Some(bug),
        ..options.clone()
    };
    for seed in 0..MAX_SEEDS {
        let result = run(seed, &options, None, false);
        if !result.passed() {
            return result;
        }
    }
    panic!("{bug:?} went unnoticed over {MAX_SEEDS} seeds");
}

#[track_caller]
fn caught_as(bug: BugName, kinds: &[&str]) -> RunResult {
    let result = first_failure(bug, &common::scenario());
    let kind = result.failure_kind().unwrap();
    assert!(
        kinds.contains(&kind),
        "{bug:?} caught as {kind:?}: {:?}",
        result.violations
    );
    result
}

#[test]
fn serving_live_state_is_caught() {
    caught_as(
        BugName::ServeLiveState,
        &["non-durable slot shipped", "own slot below a peer's copy"],
    );
}

#[test]
fn reusing_the_replica_id_after_a_wipe_is_caught() {
    caught_as(BugName::ReuseReplicaIdAfterWipe, &["replica id reused"]);
}

#[test]
fn merging_by_addition_is_caught() {
    caught_as(
        BugName::MergeByAddition,
        &["non-durable slot shipped", "slot does not match the adds"],
    );
}

#[test]
fn applying_a_retry_twice_is_caught() {
    caught_as(BugName::ApplyRetryTwice, &["slot does not match the adds"]);
}

#[test]
fn a_like_set_merge_taking_the_last_writers_length_is_caught() {
    let options = SimOptions {
        sets: true,
        ..common::scenario()
    };
    let result = first_failure(BugName::LastWriterLength, &options);
    let kind = result.failure_kind().unwrap();
    assert!(
        [
            "like sets differ",
            "like length not exact",
            "no convergence"
        ]
        .contains(&kind),
        "caught as {kind:?}: {:?}",
        result.violations
    );
}

#[test]
fn swapping_p_and_n_is_caught() {
    caught_as(BugName::SwapPAndN, &["slot does not match the adds"]);
}

#[test]
fn the_exact_slot_check_alone_catches_a_retry_applied_twice_without_faults_in_the_plan() {
    // No crash, pause or partition: retries come from slow fsyncs alone, and
    // only the final per-slot decoding can see the double application.
    let options = SimOptions {
        planted_bug: Some(BugName::ApplyRetryTwice),
        client_timeout_ms: 20,
        ..common::scenario()
    };
    let caught = (0..MAX_SEEDS).any(|seed| {
        let result = run(seed, &options, Some(Default::default()), false);
        result.failure_kind() == Some("slot does not match the adds")
    });
    assert!(caught);
}

#[test]
fn a_failing_plan_shrinks_and_still_fails() {
    let options = SimOptions {
        planted_bug: Some(BugName::ReuseReplicaIdAfterWipe),
        ..common::scenario()
    };
    let failing = first_failure(BugName::ReuseReplicaIdAfterWipe, &options);
    let kind = failing.failure_kind().unwrap();
    let shrunk = shrink(failing.seed, &options, &failing.plan, kind, 100);
    assert!(shrunk.plan.0.len() <= failing.plan.0.len());
    assert!(shrunk.plan.0.len() <= 2, "{}", shrunk.plan);
    assert!(
        shrunk.plan.0.iter().any(|op| op.kind() == "crash-wipe"),
        "{}",
        shrunk.plan
    );
    let replay = run(failing.seed, &options, Some(shrunk.plan), false);
    assert_eq!(replay.failure_kind(), Some(kind));
}
