//! Tests of the fold accounting (`fold_check.rs`): whole folds, scoped
//! folds phase by phase, records that conflict or chain, and records whose
//! holders all lost their disks.

use super::*;
use tally_node::crdt::{FoldBook, FoldRecord, FoldedBase, WriterDigest};

const W: ReplicaId = ReplicaId(7);
const LIVE: ReplicaId = ReplicaId(9);

fn slot(p: u64, n: u64) -> Slot {
    Slot { p, n }
}

/// One key; writer W folded at epoch 1 with final slot (5, 1).
const HOLDER: ReplicaId = ReplicaId(1);

fn kept(_: ReplicaId) -> bool {
    false
}

fn accounting() -> FoldAccounting {
    let mut folds = FoldAccounting::new(1);
    let record = folds.record(1, &FoldShape::whole(&[W]), HOLDER, &kept, |_| {
        vec![slot(5, 1)]
    });
    assert_eq!(record, Ok(true));
    folds
}

fn book() -> FoldBook {
    FoldBook::from_records([FoldRecord::new(1, [(W, WriterDigest::default())])]).unwrap()
}

fn folded(base: (u128, u128), slots: &[(ReplicaId, Slot)]) -> PnCounter {
    let base = FoldedBase {
        epoch: 1,
        p: base.0,
        n: base.1,
    };
    PnCounter::from_parts(slots.iter().copied(), base)
}

#[test]
fn a_correct_fold_passes() {
    let folds = accounting();
    let old = PnCounter::from_slots([(W, slot(5, 1)), (LIVE, slot(2, 0))]);
    let mut new = old.clone();
    assert!(new.apply_folds(&book(), 1, None));
    assert_eq!(folds.check_state(0, &new), None);
    assert!(folds.check_change(0, &old, &new).is_empty());
    // A state that held less of the writer takes the base by a merge.
    let behind = PnCounter::from_slots([(W, slot(3, 0))]);
    assert!(folds.check_change(0, &behind, &new).is_empty());
}

#[test]
fn a_base_short_of_the_final_slots_is_a_loss() {
    let folds = accounting();
    let (kind, detail) = folds.check_state(0, &folded((4, 1), &[])).unwrap();
    assert_eq!(kind, "fold base wrong");
    assert!(detail.contains("lost"), "{detail}");
    let (_, detail) = folds.check_state(0, &folded((10, 2), &[])).unwrap();
    assert!(detail.contains("counted twice"), "{detail}");
}

#[test]
fn a_folded_writers_slot_next_to_the_base_is_a_double_count() {
    let folds = accounting();
    let twice = folded((5, 1), &[(W, slot(5, 1))]);
    assert_eq!(
        folds.check_state(0, &twice).map(|v| v.0),
        Some("folded writer counted twice")
    );
}

#[test]
fn dropping_more_than_the_final_slot_is_a_loss() {
    let folds = accounting();
    let ahead = PnCounter::from_slots([(W, slot(6, 1))]);
    let found = folds.check_change(0, &ahead, &folded((5, 1), &[]));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, "fold lost adds");
}

#[test]
fn epochs_only_go_forward_and_must_be_committed() {
    let folds = accounting();
    let kinds: Vec<_> = folds
        .check_change(0, &folded((5, 1), &[]), &PnCounter::new())
        .into_iter()
        .map(|v| v.0)
        .collect();
    assert_eq!(kinds, ["fold epoch went backwards"]);
    let mut unknown = folded((5, 1), &[]);
    unknown = PnCounter::from_parts(
        unknown.slots().iter().copied(),
        FoldedBase {
            epoch: 2,
            ..unknown.folded()
        },
    );
    assert_eq!(
        folds.check_state(0, &unknown).map(|v| v.0),
        Some("unknown fold epoch")
    );
}

#[test]
fn records_must_agree_and_chain() {
    let mut folds = accounting();
    let other = ReplicaId(2);
    let none = |_| -> Vec<Slot> { unreachable!() };
    assert_eq!(
        folds.record(1, &FoldShape::whole(&[W]), other, &kept, none),
        Ok(false)
    );
    let conflict = folds.record(1, &FoldShape::whole(&[LIVE]), other, &kept, none);
    assert_eq!(conflict.unwrap_err().0, "fold records conflict");
    let gap = folds.record(3, &FoldShape::whole(&[LIVE]), other, &kept, none);
    assert_eq!(gap.unwrap_err().0, "fold records conflict");
    let again = folds.record(2, &FoldShape::whole(&[W]), other, &kept, none);
    assert_eq!(again.unwrap_err().0, "writer folded twice");
    let next = folds.record(2, &FoldShape::whole(&[LIVE]), other, &kept, |_| {
        vec![slot(1, 0)]
    });
    assert_eq!(next, Ok(true));
    assert_eq!(folds.check_state(0, &PnCounter::new()), None);
}

#[test]
fn a_record_whose_holders_all_lost_their_disks_is_replaced() {
    let mut folds = accounting();
    // Another holder heard of it: a different record is a conflict.
    let second = ReplicaId(2);
    assert_eq!(
        folds.record(
            1,
            &FoldShape::whole(&[W]),
            second,
            &kept,
            |_| unreachable!()
        ),
        Ok(false)
    );
    let only_first = |holder: ReplicaId| holder == HOLDER;
    let conflict = folds.record(
        1,
        &FoldShape::whole(&[W, LIVE]),
        ReplicaId(3),
        &only_first,
        |_| unreachable!(),
    );
    assert_eq!(conflict.unwrap_err().0, "fold records conflict");
    // Both holders wiped: the record went with them.
    let everyone = |_| true;
    let replaced = folds.record(
        1,
        &FoldShape::whole(&[W, LIVE]),
        ReplicaId(3),
        &everyone,
        |writer| vec![if writer == W { slot(5, 1) } else { slot(2, 0) }],
    );
    assert_eq!(replaced, Ok(true));
    assert_eq!(folds.epoch(), 1);
    assert!(folds.folded_by(LIVE, 1));
    assert_eq!(folds.check_state(0, &folded((7, 1), &[])), None);
}

/// Writer W folded in partition 0 only (key 0 lives there, key 1 in
/// partition 1) at epoch 1 with final slot (5, 1) there; it writes
/// partition 0 again from 0 in its next phase.
fn scoped() -> FoldAccounting {
    let mut folds = FoldAccounting::new(2);
    folds.set_partitions(vec![0, 1]);
    let shape = FoldShape {
        whole: Vec::new(),
        scoped: vec![(W, vec![0])],
    };
    let record = folds.record(1, &shape, HOLDER, &kept, |_| vec![slot(5, 1), slot(9, 9)]);
    assert_eq!(record, Ok(true));
    folds
}

#[test]
fn a_scoped_fold_ends_a_phase_in_its_partition_only() {
    let folds = scoped();
    assert_eq!(folds.scoped_folded(), 1);
    assert_eq!(folds.writers_folded(), 0);
    assert_eq!((folds.phase(W, 0, 0), folds.phase(W, 0, 1)), (0, 1));
    assert_eq!(folds.phase(W, 1, 1), 0, "the other partition is untouched");
    assert_eq!(folds.counted(W, 0, 1), slot(5, 1));
    assert_eq!(folds.counted(W, 1, 1), slot(0, 0));
    assert_eq!(folds.phase_floors(W), vec![1, 0]);
    // The base of key 0 counts the phase; key 1's counts nothing.
    assert_eq!(
        folds.check_state(0, &folded((5, 1), &[(W, slot(2, 0))])),
        None
    );
    let wrong = PnCounter::from_parts(
        [],
        FoldedBase {
            epoch: 1,
            p: 9,
            n: 9,
        },
    );
    assert_eq!(
        folds.check_state(1, &wrong).map(|v| v.0),
        Some("fold base wrong")
    );
    // Across the fold, the old phase's slot may be dropped up to its
    // final slot, and the new phase starts below it.
    let before = PnCounter::from_slots([(W, slot(5, 1))]);
    let after = folded((5, 1), &[(W, slot(2, 0))]);
    assert!(folds.check_change(0, &before, &after).is_empty());
    let ahead = PnCounter::from_slots([(W, slot(6, 1))]);
    let found = folds.check_change(0, &ahead, &after);
    assert_eq!(
        found.iter().map(|v| v.0).collect::<Vec<_>>(),
        ["fold lost adds"]
    );
    // Within the new phase, and in the other partition, no slot goes back.
    let later = folded((5, 1), &[(W, slot(1, 0))]);
    let found = folds.check_change(0, &after, &later);
    assert_eq!(
        found.iter().map(|v| v.0).collect::<Vec<_>>(),
        ["slot went backwards"]
    );
    let other = PnCounter::from_parts(
        [(W, slot(1, 0))],
        FoldedBase {
            epoch: 1,
            p: 0,
            n: 0,
        },
    );
    let found = folds.check_change(1, &before, &other);
    assert_eq!(
        found.iter().map(|v| v.0).collect::<Vec<_>>(),
        ["slot went backwards"]
    );
}

#[test]
fn a_later_fold_takes_the_next_phase_from_its_floor() {
    let mut folds = scoped();
    // W is folded whole at epoch 2: its second phase in partition 0
    // (final (2, 0)), its first in partition 1 (final (3, 0)).
    let record = folds.record(2, &FoldShape::whole(&[W]), HOLDER, &kept, |_| {
        vec![slot(2, 0), slot(3, 0)]
    });
    assert_eq!(record, Ok(true));
    assert_eq!(folds.counted(W, 0, 2), slot(7, 1));
    assert_eq!(folds.counted(W, 1, 2), slot(3, 0));
    assert_eq!(folds.counted_writers(0, 1), vec![(W, slot(5, 1))]);
    let at_two = PnCounter::from_parts(
        [],
        FoldedBase {
            epoch: 2,
            p: 7,
            n: 1,
        },
    );
    assert_eq!(folds.check_state(0, &at_two), None);
    assert_eq!(folds.ended_between(W, 0, 0, 2), Some(slot(5, 1)));
    assert_eq!(folds.ended_between(W, 0, 1, 2), Some(slot(2, 0)));
    assert_eq!(folds.ended_between(W, 0, 2, 5), None);
    let again = folds.record(
        3,
        &FoldShape::whole(&[W]),
        HOLDER,
        &kept,
        |_| unreachable!(),
    );
    assert_eq!(again.unwrap_err().0, "writer folded twice");
}

#[test]
fn a_scoped_record_needs_the_counters_partitions() {
    let mut folds = FoldAccounting::new(1);
    let shape = FoldShape {
        whole: Vec::new(),
        scoped: vec![(W, vec![0])],
    };
    let record = folds.record(1, &shape, HOLDER, &kept, |_| unreachable!());
    assert_eq!(record.unwrap_err().0, "scoped fold without partitions");
}
