//! Tests of folding: the merge laws across fold epochs and invariant 9 (a fold
//! never changes a value) by proptest against an unfolded model, and each
//! refusal of the fold book and of the folded merge.

use proptest::prelude::*;

use super::*;
use crate::crdt::Crdt;
use crate::crdt::PnCounter;

const WRITERS: usize = 6;

/// Final slots of six writers and the epoch each is folded at (0: never).
#[derive(Clone, Debug)]
struct World {
    finals: Vec<Slot>,
    fold_epoch: Vec<u64>,
    book: FoldBook,
}

fn writer(index: usize) -> ReplicaId {
    ReplicaId(100 + index as u64)
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::collection::vec((0u64..1000, 0u64..1000), WRITERS),
        prop::collection::vec(0u64..4, WRITERS),
    )
        .prop_map(|(finals, raw)| {
            let mut used: Vec<u64> = raw.iter().copied().filter(|e| *e > 0).collect();
            used.sort_unstable();
            used.dedup();
            let fold_epoch: Vec<u64> = raw
                .iter()
                .map(|e| match used.iter().position(|u| u == e) {
                    Some(index) => index as u64 + 1,
                    None => 0,
                })
                .collect();
            let mut book = FoldBook::new();
            for epoch in 1..=used.len() as u64 {
                let writers = (0..WRITERS)
                    .filter(|w| fold_epoch[*w] == epoch)
                    .map(|w| (writer(w), WriterDigest::default()));
                book.accept(FoldRecord::new(epoch, writers)).unwrap();
            }
            World {
                finals: finals.into_iter().map(|(p, n)| Slot { p, n }).collect(),
                fold_epoch,
                book,
            }
        })
}

/// How a view holds each writer: its epoch choice and, per writer, how much
/// of the final sums it has seen (out of 4; 4 is final).
type ViewShape = (u64, Vec<(u64, u64)>);

fn view_shape() -> impl Strategy<Value = ViewShape> {
    (
        0u64..4,
        prop::collection::vec((0u64..=4, 0u64..=4), WRITERS),
    )
}

/// A state a node could hold: folded up to some epoch, every other writer's
/// slot at most its final state.
fn view(world: &World, (epoch, seen): &ViewShape) -> PnCounter {
    let epoch = (*epoch).min(world.book.epoch());
    let mut base = FoldedBase {
        epoch,
        ..FoldedBase::default()
    };
    let mut slots = Vec::new();
    for (w, (p, n)) in seen.iter().enumerate() {
        let last = world.finals[w];
        if world.fold_epoch[w] != 0 && world.fold_epoch[w] <= epoch {
            base.p += u128::from(last.p);
            base.n += u128::from(last.n);
        } else {
            let slot = Slot {
                p: last.p * p / 4,
                n: last.n * n / 4,
            };
            slots.push((writer(w), slot));
        }
    }
    PnCounter::from_parts(slots, base)
}

/// The view with every writer counted by slot: folded ones at their final state.
fn unfolded(world: &World, state: &PnCounter) -> Vec<Slot> {
    (0..WRITERS)
        .map(|w| {
            let at = world.fold_epoch[w];
            if at != 0 && at <= state.folded().epoch {
                assert_eq!(state.slot(writer(w)), Slot::default(), "folded slot kept");
                world.finals[w]
            } else {
                state.slot(writer(w))
            }
        })
        .collect()
}

fn max_of(a: &[Slot], b: &[Slot]) -> Vec<Slot> {
    a.iter()
        .zip(b)
        .map(|(x, y)| Slot {
            p: x.p.max(y.p),
            n: x.n.max(y.n),
        })
        .collect()
}

fn value_of(slots: &[Slot]) -> i128 {
    slots.iter().map(|slot| slot.net()).sum()
}

#[track_caller]
fn merged(world: &World, a: &PnCounter, b: &PnCounter) -> PnCounter {
    let mut out = a.clone();
    out.merge_folded(b, &world.book, None).unwrap();
    out
}

proptest! {
    /// Merging across epochs equals merging the unfolded states: nothing is
    /// counted twice through the base and nothing is lost.
    #[test]
    fn merge_across_epochs_equals_the_unfolded_merge(
        world in world(), a in view_shape(), b in view_shape(),
    ) {
        let (a, b) = (view(&world, &a), view(&world, &b));
        let m = merged(&world, &a, &b);
        let expected = max_of(&unfolded(&world, &a), &unfolded(&world, &b));
        prop_assert_eq!(unfolded(&world, &m), expected.clone());
        prop_assert_eq!(m.exact_value(), value_of(&expected));
        prop_assert_eq!(m.folded().epoch, a.folded().epoch.max(b.folded().epoch));
    }

    #[test]
    fn folded_merge_is_commutative_associative_idempotent(
        world in world(), a in view_shape(), b in view_shape(), c in view_shape(),
    ) {
        let (a, b, c) = (view(&world, &a), view(&world, &b), view(&world, &c));
        prop_assert_eq!(merged(&world, &a, &b), merged(&world, &b, &a));
        prop_assert_eq!(
            merged(&world, &merged(&world, &a, &b), &c),
            merged(&world, &a, &merged(&world, &b, &c))
        );
        let mut once = merged(&world, &a, &b);
        prop_assert!(!once.merge_folded(&b, &world.book, None).unwrap());
        prop_assert_eq!(&merged(&world, &a, &a), &a);
    }

    /// Invariant 9: folding a state that holds each folded writer's final
    /// state never changes its value, and folding twice is folding once.
    #[test]
    fn a_fold_never_changes_the_value(
        world in world(), shape in view_shape(), upto in 0u64..4,
    ) {
        let mut state = view(&world, &shape);
        // The agreement rule: a node folds only once it holds the final state.
        for w in 0..WRITERS {
            if world.fold_epoch[w] > state.folded().epoch {
                state.merge_slot(writer(w), world.finals[w]);
            }
        }
        let before = (state.exact_value(), unfolded(&world, &state));
        let mut folded = state.clone();
        folded.apply_folds(&world.book, upto, None);
        prop_assert_eq!((folded.exact_value(), unfolded(&world, &folded)), before);
        prop_assert_eq!(folded.folded().epoch, upto.min(world.book.epoch()).max(state.folded().epoch));
        let mut twice = folded.clone();
        prop_assert!(!twice.apply_folds(&world.book, upto, None));
        prop_assert_eq!(&twice, &folded);
        // A folded and an unfolded copy of the same state merge to either.
        prop_assert_eq!(merged(&world, &state, &folded), folded.clone());
        prop_assert_eq!(merged(&world, &folded, &state), folded);
    }
}

fn slot(p: u64, n: u64) -> Slot {
    Slot { p, n }
}

fn book_folding(writers: &[u64]) -> FoldBook {
    let mut book = FoldBook::new();
    for (index, id) in writers.iter().enumerate() {
        let record = FoldRecord::new(
            index as u64 + 1,
            [(ReplicaId(*id), WriterDigest::default())],
        );
        book.accept(record).unwrap();
    }
    book
}

#[test]
fn a_state_at_an_unknown_epoch_waits_and_changes_nothing() {
    let book = book_folding(&[1]);
    let mut ours = PnCounter::from_slots([(ReplicaId(2), slot(3, 0))]);
    let theirs = PnCounter::from_parts(
        [(ReplicaId(2), slot(4, 0))],
        FoldedBase {
            epoch: 2,
            p: 7,
            n: 0,
        },
    );
    let before = ours.clone();
    assert_eq!(
        ours.merge_folded(&theirs, &book, None),
        Err(FoldError::UnknownEpoch { epoch: 2, known: 1 })
    );
    assert_eq!(ours, before);
}

#[test]
fn two_bases_at_one_epoch_that_differ_are_refused() {
    let book = book_folding(&[1]);
    let base = |p| FoldedBase { epoch: 1, p, n: 0 };
    let mut ours = PnCounter::from_parts([], base(5));
    let theirs = PnCounter::from_parts([], base(6));
    let before = ours.clone();
    let refused = ours.merge_folded(&theirs, &book, None).unwrap_err();
    assert!(matches!(refused, FoldError::BaseConflict { epoch: 1, .. }));
    assert!(refused.to_string().contains("different bases"), "{refused}");
    assert_eq!(ours, before);
}

#[test]
fn a_folded_writers_late_slot_is_ignored() {
    let book = book_folding(&[1]);
    let mut ours = PnCounter::from_slots([(ReplicaId(1), slot(5, 1)), (ReplicaId(2), slot(2, 0))]);
    assert!(ours.apply_folds(&book, 1, None));
    assert_eq!(ours.slots(), &[(ReplicaId(2), slot(2, 0))]);
    assert_eq!(ours.exact_value(), 6);
    // A peer that has not folded yet sends the writer's slot again.
    let late = PnCounter::from_slots([(ReplicaId(1), slot(5, 1)), (ReplicaId(2), slot(3, 0))]);
    assert!(ours.merge_folded(&late, &book, None).unwrap());
    assert_eq!(ours.slots(), &[(ReplicaId(2), slot(3, 0))]);
    assert_eq!(ours.exact_value(), 7);
    assert!(!ours.is_empty());
}

#[test]
fn the_book_refuses_gaps_conflicts_empty_records_and_second_folds() {
    let mut book = book_folding(&[1]);
    let digest = WriterDigest::default();
    let again = FoldRecord::new(1, [(ReplicaId(1), digest)]);
    assert_eq!(book.accept(again), Ok(false));
    let other = FoldRecord::new(1, [(ReplicaId(2), digest)]);
    assert!(matches!(
        book.accept(other),
        Err(FoldError::Conflict { epoch: 1, .. })
    ));
    let gap = FoldRecord::new(3, [(ReplicaId(3), digest)]);
    assert_eq!(
        book.accept(gap),
        Err(FoldError::Gap {
            epoch: 3,
            missing: 2
        })
    );
    assert_eq!(
        book.accept(FoldRecord::new(2, [])),
        Err(FoldError::Empty(2))
    );
    let twice = FoldRecord::new(2, [(ReplicaId(1), digest)]);
    assert_eq!(
        book.accept(twice),
        Err(FoldError::AlreadyFolded {
            writer: ReplicaId(1),
            at: 1,
            epoch: 2
        })
    );
    assert_eq!(book.epoch(), 1);
    assert_eq!(book.folded_at(ReplicaId(1)), Some(1));
    assert_eq!(FoldBook::from_records(book.records().to_vec()), Ok(book));
}

#[test]
fn the_writer_digest_is_incremental_and_order_independent() {
    let mut one = WriterDigest::default();
    one.replace("a", Slot::default(), slot(1, 0));
    one.replace("b", Slot::default(), slot(2, 0));
    one.replace("a", slot(1, 0), slot(3, 1));
    let mut two = WriterDigest::default();
    two.replace("a", Slot::default(), slot(3, 1));
    two.replace("b", Slot::default(), slot(2, 0));
    assert_eq!(one, two);
    assert_eq!(one.counters, 2);
    two.replace("b", slot(2, 0), Slot::default());
    assert_eq!(two.counters, 1);
    assert_ne!(one, two);
}

#[test]
fn plain_merge_of_same_epoch_states_keeps_the_base() {
    let base = FoldedBase {
        epoch: 1,
        p: 4,
        n: 1,
    };
    let mut a = PnCounter::from_parts([(ReplicaId(2), slot(1, 0))], base);
    let b = PnCounter::from_parts([(ReplicaId(3), slot(2, 0))], base);
    assert!(a.merge(&b));
    assert_eq!(a.exact_value(), 6);
    assert_eq!(a.folded(), base);
}
