//! The check of a live replica's slot partly folded with a partition that
//! moved away from its node: the adds before one instant in the base, those
//! after it in the slot, each acknowledged add exactly once.

use std::collections::BTreeSet;

use tally_node::crdt::{FoldedBase, PnCounter, ReplicaId, Slot};

use crate::chaos::check::{check_all, AddTimes};
use crate::checker::Checker;
use crate::ledger::Ledger;

/// Live replica 9 took three acknowledged increments of 1 on key 0, one
/// after the other (clock 1-2, 3-4, 10-11). The final state holds `slot`
/// of it and a base of `base_p`. Returns (violations, split pairs).
fn check(slot: u64, base_p: u128) -> (u64, u64) {
    let live = ReplicaId(9);
    let mut checker = Checker::new(1, 1);
    checker.started_fresh(0, 0, live);
    let mut ledger = Ledger::new(1, 1);
    let mut times = AddTimes::default();
    for (sent, answered) in [(1, 2), (3, 4), (10, 11)] {
        let id = ledger.issue(0, 0, 0, false, true).unwrap();
        ledger.delivered(id, live);
        ledger.answered(id, live, 0, false);
        times.sent.push(sent);
        times.answered.push(answered);
    }
    let base = FoldedBase {
        epoch: u64::from(base_p > 0),
        p: base_p,
        n: 0,
    };
    let slots = (slot > 0).then_some((live, Slot { p: slot, n: 0 }));
    let finals = vec![PnCounter::from_parts(slots, base)];
    let (_, stats) = check_all(&mut checker, &ledger, &times, &finals, &BTreeSet::new());
    (checker.violation_count, stats.split)
}

#[test]
fn a_live_slot_split_by_a_fold_counts_each_add_once() {
    assert_eq!(check(3, 0), (0, 0), "nothing folded: an ordinary live slot");
    assert_eq!(
        check(1, 2),
        (0, 1),
        "the first two adds folded, the third after"
    );
    assert_eq!(check(0, 3), (0, 1), "every add folded, none since");
    assert_ne!(check(1, 1).0, 0, "an acknowledged add in neither");
    assert_ne!(check(1, 3).0, 0, "an add in both the base and the slot");
    assert_ne!(check(2, 2).0, 0, "the second add in both");
    assert_ne!(
        check(3, 1).0,
        0,
        "a base no add explains beside a whole slot"
    );
}

/// Live replica 9's adds: a (+1, clock 1-2), then b (+1, sent at 3 and
/// answered only at 20: a retry that reached the node after the fold, say)
/// and c (+2, 10-11) in flight together. Returns the violations.
fn check_straddling(slot: u64, base_p: u128) -> u64 {
    let live = ReplicaId(9);
    let mut checker = Checker::new(1, 1);
    checker.started_fresh(0, 0, live);
    let mut ledger = Ledger::new(1, 1);
    let mut times = AddTimes::default();
    let a = ledger.issue(0, 0, 0, false, true).unwrap();
    ledger.delivered(a, live);
    ledger.answered(a, live, 0, false);
    let b = ledger.issue(0, 0, 0, false, true).unwrap();
    let c = ledger.issue(0, 0, 0, false, true).unwrap();
    for id in [b, c] {
        ledger.delivered(id, live);
        ledger.answered(id, live, 0, false);
    }
    assert_eq!(
        [a, b, c].map(|id| ledger.adds[id as usize].magnitude()),
        [1, 1, 2],
        "b and c in flight together hold distinct lanes"
    );
    times.sent.extend([1, 3, 10]);
    times.answered.extend([2, 20, 11]);
    let base = FoldedBase {
        epoch: 1,
        p: base_p,
        n: 0,
    };
    let slots = (slot > 0).then_some((live, Slot { p: slot, n: 0 }));
    let finals = vec![PnCounter::from_parts(slots, base)];
    check_all(&mut checker, &ledger, &times, &finals, &BTreeSet::new());
    checker.violation_count
}

#[test]
fn an_add_answered_across_the_fold_is_on_one_side_exactly() {
    assert_eq!(check_straddling(2 + 1, 1), 0, "b applied after the fold");
    assert_eq!(check_straddling(2, 1 + 1), 0, "b applied before it");
    assert_ne!(check_straddling(2, 1), 0, "b in neither");
    assert_ne!(check_straddling(2 + 1, 1 + 1), 0, "b in both");
}
