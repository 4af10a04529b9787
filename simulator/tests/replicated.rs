//! Replicated durability in the simulation (issue 12): nodes take adds with
//! `handle_add_replicated`, push their own slot to `write_copies - 1` copies
//! of the region over the simulated network, and answer only once the copies
//! made it durable. With wipes in the fault mix the checker then allows no
//! acknowledged add lost with its disk, where `sync` mode loses (and counts)
//! some in the same scenario; and a copy that answers before its commit
//! (planted bug `ack-before-copy-durable`) is caught.

mod common;

use tally_sim::sweep::sweep;
use tally_sim::{run, BugName, Durability, SimOptions};

/// The scenario: 2 nodes per region, every fault on (wipes included) and
/// wipes frequent.
fn scenario(durability: Durability) -> SimOptions {
    SimOptions {
        nodes_per_region: 2,
        durability,
        write_copies: 2,
        ..common::scenario()
    }
}

#[test]
fn a_replicated_sweep_with_wipes_loses_no_acknowledged_add() {
    let options = scenario(Durability::Replicated);
    let summary = sweep(0, 60, common::threads(), &options, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&options, None));
    let sum = |f: fn(&tally_sim::RunResult) -> u64| -> u64 { summary.results.iter().map(f).sum() };
    assert_eq!(sum(|r| r.slots.acked_lost_to_wipe), 0);
    assert!(
        sum(|r| r.workload.acked) > 10_000,
        "{}",
        sum(|r| r.workload.acked)
    );
    assert!(sum(|r| r.copies.confirmed) > 1_000);
    // The copies were really exercised: some pushes failed (partitions,
    // crashes) and some adds outlived their wait and were retried.
    assert!(sum(|r| r.copies.failed) > 0);
    assert!(sum(|r| r.copies.unconfirmed_adds) > 0);

    // The same seeds in sync mode lose acknowledged adds with their disks:
    // the wipes do hit adds that no peer held yet.
    let sync = scenario(Durability::Sync);
    let summary = sweep(0, 60, common::threads(), &sync, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&sync, None));
    let lost: u64 = summary
        .results
        .iter()
        .map(|r| r.slots.acked_lost_to_wipe)
        .sum();
    assert!(lost > 0, "sync mode lost no acknowledged add to a wipe");
}

#[test]
fn three_nodes_per_region_and_three_copies_pass() {
    let options = SimOptions {
        nodes_per_region: 3,
        write_copies: 3,
        regions: 2,
        ..scenario(Durability::Replicated)
    };
    let summary = sweep(500, 20, common::threads(), &options, None, false);
    assert_eq!(summary.failed, 0, "{}", summary.render(&options, None));
}

#[test]
fn a_copy_that_answers_before_its_commit_is_caught() {
    let options = SimOptions {
        planted_bug: Some(BugName::AckBeforeCopyDurable),
        ..scenario(Durability::Replicated)
    };
    let failing = (0..20)
        .map(|seed| run(seed, &options, None, false))
        .find(|result| !result.passed())
        .expect("ack-before-copy-durable went unnoticed over 20 seeds");
    let kinds: Vec<&str> = failing.violations.iter().map(|v| v.kind).collect();
    assert!(
        kinds.contains(&"copy answered before durable"),
        "{:?}",
        failing.violations
    );
}

#[test]
fn a_replicated_run_replays_exactly() {
    let options = scenario(Durability::Replicated);
    let first = run(11, &options, None, false);
    let again = run(11, &options, None, false);
    assert!(first.copies.pushes > 0);
    assert_eq!(
        (first.trace_hash, first.events, first.copies),
        (again.trace_hash, again.events, again.copies)
    );
}

#[test]
fn replicated_mode_needs_enough_nodes_per_region() {
    let options = SimOptions {
        nodes_per_region: 1,
        ..scenario(Durability::Replicated)
    };
    let error = options.validate().unwrap_err();
    assert!(error.contains("--nodes-per-region"), "{error}");
    let options = SimOptions {
        write_copies: 8,
        nodes_per_region: 8,
        ..scenario(Durability::Replicated)
    };
    assert!(options.validate().unwrap_err().contains("--write-copies"));
}
