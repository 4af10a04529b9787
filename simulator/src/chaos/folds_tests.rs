//! The check of folded bases: decoding sums of several replicas' adds.

use std::collections::BTreeSet;

use tally_node::crdt::{FoldedBase, PnCounter, ReplicaId, Slot};

use super::*;
use crate::chaos::check::{check_all, AddTimes};

/// Node 0 wiped twice: replica 7 took two acknowledged increments (1 and
/// 2, in flight together) and replica 8 one (1, after those); 9 is live.
/// Both dead replicas are folded into key 0's base `base_p`; `extra` is a
/// slot left in the final state. Returns the violations.
fn check_fold(base_p: u128, extra: Option<(ReplicaId, Slot)>) -> u64 {
    let (first, second) = (ReplicaId(7), ReplicaId(8));
    let mut checker = Checker::new(1, 1);
    checker.started_fresh(0, 0, first);
    let mut ledger = Ledger::new(1, 1);
    let mut times = AddTimes::default();
    let a = ledger.issue(0, 0, 0, false, true).unwrap();
    let b = ledger.issue(0, 0, 0, false, true).unwrap();
    for (id, answered) in [(a, 3), (b, 4)] {
        ledger.delivered(id, first);
        ledger.answered(id, first, 0, false);
        times.sent.push(id as u64 + 1);
        times.answered.push(answered);
    }
    checker.started_fresh(0, 0, second);
    let c = ledger.issue(0, 0, 0, false, true).unwrap();
    ledger.delivered(c, second);
    ledger.answered(c, second, 0, false);
    times.sent.push(5);
    times.answered.push(6);
    checker.started_fresh(0, 0, ReplicaId(9));
    let base = FoldedBase {
        epoch: 2,
        p: base_p,
        n: 0,
    };
    let finals = vec![PnCounter::from_parts(extra, base)];
    let folded = BTreeSet::from([first, second]);
    let (_, wiped) = check_all(&mut checker, &ledger, &times, &finals, &folded);
    assert_eq!(wiped.slots, 2, "one (key, replica) pair per folded replica");
    checker.violation_count
}

#[test]
fn a_folded_base_is_the_folded_replicas_adds_up_to_one_instant_each() {
    assert_eq!(check_fold(1 + 2 + 1, None), 0, "every add folded");
    assert_eq!(
        check_fold(1 + 2, None),
        0,
        "the second replica's add lost with its disk"
    );
    assert_eq!(
        check_fold(1, None),
        0,
        "the first add only, the second in flight then"
    );
    assert_eq!(check_fold(0, None), 0, "nothing pulled before either wipe");
    assert_ne!(check_fold(1 + 2 + 1 + 1, None), 0, "an add counted twice");
    assert_ne!(check_fold(8, None), 0, "a magnitude no add had");
    assert_ne!(
        check_fold(1 + 2 + 1, Some((ReplicaId(8), Slot { p: 1, n: 0 }))),
        0,
        "a folded replica's slot kept beside the base"
    );
}

#[test]
fn a_later_add_is_never_folded_without_an_earlier_acknowledged_one() {
    // Replica 7 alone: an increment acknowledged, then a decrement sent
    // after that answer and acknowledged too.
    let old = ReplicaId(7);
    let run = |p: u128, n: u128| {
        let mut checker = Checker::new(1, 1);
        checker.started_fresh(0, 0, old);
        let mut ledger = Ledger::new(1, 1);
        let mut times = AddTimes::default();
        for (clock, negative) in [(1, false), (3, true)] {
            let id = ledger.issue(0, 0, 0, negative, true).unwrap();
            ledger.delivered(id, old);
            ledger.answered(id, old, 0, false);
            times.sent.push(clock);
            times.answered.push(clock + 1);
        }
        checker.started_fresh(0, 0, ReplicaId(8));
        let base = FoldedBase { epoch: 1, p, n };
        let finals = vec![PnCounter::from_parts(None, base)];
        check_all(
            &mut checker,
            &ledger,
            &times,
            &finals,
            &BTreeSet::from([old]),
        );
        checker.violation_count
    };
    assert_eq!(run(0, 0), 0);
    assert_eq!(run(1, 0), 0);
    assert_eq!(run(1, 1), 0);
    assert_ne!(
        run(0, 1),
        0,
        "the decrement without the increment before it"
    );
}

#[test]
fn a_live_replica_folded_is_a_violation() {
    let mut checker = Checker::new(1, 1);
    checker.started_fresh(0, 0, ReplicaId(7));
    let ledger = Ledger::new(1, 1);
    let finals = vec![PnCounter::new()];
    let folded = BTreeSet::from([ReplicaId(7)]);
    check_all(
        &mut checker,
        &ledger,
        &AddTimes::default(),
        &finals,
        &folded,
    );
    assert_eq!(checker.violation_count, 1);
}
