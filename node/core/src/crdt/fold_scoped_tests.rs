//! Tests of folds scoped to partitions (a live writer's slots of a
//! partition that moved away): the book's rules, and by proptest that a
//! writer folded in its partition again and again, writing between the
//! folds, is counted exactly once by every order of merges and
//! applications, while the same counter in another partition keeps its slot.

use proptest::prelude::*;

use super::*;
use crate::crdt::PnCounter;

const W: ReplicaId = ReplicaId(7);
const OTHER: ReplicaId = ReplicaId(8);
const P: u32 = 3;

fn digest(counters: u64) -> WriterDigest {
    WriterDigest {
        counters,
        hash: counters * 31,
    }
}

/// A book whose epochs 1..=folds each fold W in partition P (scoped).
fn scoped_book(folds: u64) -> FoldBook {
    let mut book = FoldBook::new();
    for epoch in 1..=folds {
        let record = FoldRecord::by_partition(epoch, []).with_scoped([(W, vec![(P, digest(1))])]);
        book.accept(record).unwrap();
    }
    book
}

#[test]
fn the_book_takes_repeated_scoped_folds_and_refuses_bad_scopes() {
    let mut book = scoped_book(2);
    assert!(book.has_scoped());
    assert!(book.scoped_between(W, Some(P), 0, 1));
    assert!(book.scoped_between(W, Some(P), 1, 2));
    assert!(!book.scoped_between(W, Some(P), 2, 2));
    assert!(!book.scoped_between(W, Some(P + 1), 0, 2));
    assert!(!book.scoped_between(W, None, 0, 2));
    assert_eq!(book.folded_at(W), None, "W lives on");
    // A writer folded whole and scoped by one record, or scoped with no
    // partition: refused, the book unchanged.
    let both = FoldRecord::new(3, [(W, digest(1))]).with_scoped([(W, vec![(P, digest(1))])]);
    assert!(matches!(book.accept(both), Err(FoldError::BadScope { .. })));
    let nowhere = FoldRecord::by_partition(3, []).with_scoped([(OTHER, vec![])]);
    assert!(matches!(
        book.accept(nowhere),
        Err(FoldError::BadScope { .. })
    ));
    assert_eq!(book.epoch(), 2);
    // Folded whole later (a wipe): taken; scoped after that: refused.
    book.accept(FoldRecord::new(3, [(W, digest(2))])).unwrap();
    let after = FoldRecord::by_partition(4, []).with_scoped([(W, vec![(P, digest(1))])]);
    assert!(matches!(
        book.accept(after),
        Err(FoldError::AlreadyFolded { at: 3, .. })
    ));
    // Scoped writers change a record's digest; a record without keeps its own.
    let plain = FoldRecord::by_partition(1, [(OTHER, vec![(P, digest(1))])]);
    let with = plain.clone().with_scoped([(W, vec![(P, digest(1))])]);
    assert_ne!(plain.digest(), with.digest());
    assert_ne!(
        with.digest(),
        plain
            .clone()
            .with_scoped([(W, vec![(P, digest(2))])])
            .digest()
    );
}

/// What W wrote in partition P between folds (phase i: after the fold of
/// epoch i, before that of epoch i + 1; the last phase is still open), and
/// what OTHER wrote (never folded).
#[derive(Clone, Debug)]
struct History {
    phases: Vec<Slot>,
    other: Slot,
}

/// A state some node holds of the counter: at one epoch, with some prefix
/// of W's phase at that epoch and of OTHER's slot (out of 4; 4 is final).
#[derive(Clone, Debug)]
struct View {
    epoch: u64,
    w_seen: u64,
    other_seen: u64,
}

fn history() -> impl Strategy<Value = History> {
    (
        prop::collection::vec((0u64..500, 0u64..500), 1..5),
        (0u64..500, 0u64..500),
    )
        .prop_map(|(phases, (p, n))| History {
            phases: phases.into_iter().map(|(p, n)| Slot { p, n }).collect(),
            other: Slot { p, n },
        })
}

fn part(slot: Slot, seen: u64) -> Slot {
    Slot {
        p: slot.p * seen / 4,
        n: slot.n * seen / 4,
    }
}

impl History {
    fn folds(&self) -> u64 {
        self.phases.len() as u64 - 1
    }

    /// The state a view stands for: the base of every phase folded before
    /// its epoch, W's slot of its phase (as far as seen), OTHER's.
    fn state(&self, view: &View) -> PnCounter {
        let mut base = FoldedBase {
            epoch: view.epoch,
            ..FoldedBase::default()
        };
        for slot in &self.phases[..view.epoch as usize] {
            base.p += u128::from(slot.p);
            base.n += u128::from(slot.n);
        }
        PnCounter::from_parts(
            [
                (W, part(self.phases[view.epoch as usize], view.w_seen)),
                (OTHER, part(self.other, view.other_seen)),
            ]
            .into_iter()
            .filter(|(_, slot)| *slot != Slot::default()),
            base,
        )
    }

    /// The exact value once everything is seen.
    fn total(&self) -> i128 {
        let all = self.phases.iter().chain([&self.other]);
        all.map(|slot| i128::from(slot.p) - i128::from(slot.n))
            .sum()
    }
}

fn views(folds: u64) -> impl Strategy<Value = Vec<View>> {
    prop::collection::vec((0..=folds, 0u64..=4, 0u64..=4), 1..6).prop_map(|raw| {
        raw.into_iter()
            .map(|(epoch, w_seen, other_seen)| View {
                epoch,
                w_seen,
                other_seen,
            })
            .collect()
    })
}

fn history_and_views() -> impl Strategy<Value = (History, Vec<View>)> {
    history().prop_flat_map(|history| {
        let folds = history.folds();
        (Just(history), views(folds))
    })
}

proptest! {
    /// Merging every view, in any order, with the final state of the last
    /// phase among them, gives the exact total: each phase of W once, via a
    /// base or its live slot, never both.
    #[test]
    fn every_order_of_merges_counts_each_phase_once((history, mut views) in history_and_views(), seed in any::<u64>()) {
        let book = scoped_book(history.folds());
        views.push(View { epoch: history.folds(), w_seen: 4, other_seen: 4 });
        // A seeded shuffle: the order of merges.
        let mut order: Vec<usize> = (0..views.len()).collect();
        let mut x = seed | 1;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut merged = history.state(&views[order[0]]);
        for &index in &order[1..] {
            merged.merge_folded(&history.state(&views[index]), &book, Some(P)).unwrap();
        }
        prop_assert_eq!(merged.folded().epoch, history.folds());
        prop_assert_eq!(i128::from(merged.value().unwrap()), history.total());
        // The other way round gives the same state.
        let mut reversed = history.state(&views[order[order.len() - 1]]);
        for &index in order[..order.len() - 1].iter().rev() {
            reversed.merge_folded(&history.state(&views[index]), &book, Some(P)).unwrap();
        }
        prop_assert_eq!(reversed, merged);
    }

    /// A node holding the final state of W's phase at its epoch that applies
    /// the next fold holds what merging with a state at that fold (W's next
    /// phase not begun) gives, and applying it twice changes nothing.
    #[test]
    fn applying_the_next_scoped_fold_equals_merging_with_a_folded_state((history, views) in history_and_views()) {
        let book = scoped_book(history.folds());
        for view in views.into_iter().filter(|view| view.epoch < history.folds()) {
            let final_view = View { w_seen: 4, ..view };
            let mut applied = history.state(&final_view);
            prop_assert!(applied.apply_folds(&book, view.epoch + 1, Some(P)));
            prop_assert!(!applied.clone().apply_folds(&book, view.epoch + 1, Some(P)));
            let next = View { epoch: view.epoch + 1, w_seen: 0, other_seen: view.other_seen };
            let mut merged = history.state(&next);
            merged.merge_folded(&history.state(&final_view), &book, Some(P)).unwrap();
            prop_assert_eq!(applied, merged);
        }
    }
}

/// In another partition the same writer is not folded: its slot stays, in
/// merges and applications alike, while the epoch moves.
#[test]
fn a_counter_of_another_partition_keeps_the_writers_slot() {
    let book = scoped_book(1);
    let slot = Slot { p: 9, n: 2 };
    let mut counter = PnCounter::from_slots([(W, slot)]);
    assert!(counter.apply_folds(&book, 1, Some(P + 1)));
    assert_eq!(counter.slot(W), slot);
    assert_eq!(counter.folded().epoch, 1);
    let mut old = PnCounter::from_slots([(W, slot)]);
    old.merge_folded(&counter, &book, Some(P + 1)).unwrap();
    assert_eq!(old.slot(W), slot);
    assert_eq!(old.value(), Ok(7));
    // In P the slot moves into the base.
    let mut in_p = PnCounter::from_slots([(W, slot)]);
    assert!(in_p.apply_folds(&book, 1, Some(P)));
    assert_eq!(in_p.slot(W), Slot::default());
    assert_eq!((in_p.folded().p, in_p.folded().n), (9, 2));
    assert_eq!(in_p.value(), Ok(7));
}
