//! The checker's exact accounting of folds (`--retire`): which writers each
//! fold epoch folded, and each folded writer's final slot in every counter.
//!
//! A folded writer's final slot is taken when the first member commits its
//! fold record, as the most that any replica then holds of it (on disk or in
//! memory, at a fold epoch below the record's): the writer is retired and
//! never writes again, so under a correct protocol every member holds that
//! same state. Invariant 9 (DESIGN.md) then reads, per counter state:
//!
//! - the folded base at epoch `e` is exactly the sum of the final slots of
//!   the writers folded at epochs `1..=e` (a missing part is a loss, an extra
//!   part a double count);
//! - a state at epoch `e` holds no slot of a writer folded at or below `e`
//!   (that writer would be counted twice);
//! - moving a state to an epoch that folds a writer never drops more of it
//!   than its final slot (otherwise the fold lost adds someone held);
//! - epochs never go back, and no state is at an epoch no member committed;
//! - two members never hold different records of one epoch. One exception
//!   is no conflict: a record whose every holder lost its disk before any
//!   other member heard of it (a member that committed and was then wiped
//!   and retired) is gone with its states, which no other member could
//!   merge (a state at an epoch a member holds no record of is refused);
//!   the next record of that epoch replaces it.
//!
//! The exact slot check at the end counts a folded writer's adds through
//! its final slot here, once.

use std::collections::{BTreeMap, BTreeSet};

use tally_node::crdt::{PnCounter, ReplicaId, Slot};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct FoldAccounting {
    keys: usize,
    /// The writers of epoch `e` at index `e - 1`.
    epochs: Vec<Vec<ReplicaId>>,
    /// The replicas that committed or adopted the record of epoch `e`.
    holders: Vec<BTreeSet<ReplicaId>>,
    folded_at: BTreeMap<ReplicaId, u64>,
    /// Per folded writer: its final slot in each counter.
    finals: BTreeMap<ReplicaId, Vec<Slot>>,
    /// Per epoch `e` (index `e - 1`), per counter: the base it must hold.
    bases: Vec<Vec<(u128, u128)>>,
}

/// One broken fold invariant: its kind and what exactly.
pub type FoldViolation = (&'static str, String);

fn slot_text(slot: Slot) -> String {
    format!("(p {}, n {})", slot.p, slot.n)
}

impl FoldAccounting {
    /// Accounting for `keys` counters, before any fold.
    pub fn new(keys: usize) -> Self {
        FoldAccounting {
            keys,
            ..Default::default()
        }
    }

    /// The newest epoch any member committed.
    pub fn epoch(&self) -> u64 {
        self.epochs.len() as u64
    }

    /// Writers folded so far.
    pub fn writers_folded(&self) -> usize {
        self.folded_at.len()
    }

    /// True when `writer` is folded at an epoch up to `epoch`.
    pub fn folded_by(&self, writer: ReplicaId, epoch: u64) -> bool {
        self.folded_at.get(&writer).is_some_and(|at| *at <= epoch)
    }

    /// True when `writer` is folded at all.
    pub fn is_folded(&self, writer: ReplicaId) -> bool {
        self.folded_at.contains_key(&writer)
    }

    /// The final slot of folded `writer` in counter `key`.
    pub fn final_slot(&self, writer: ReplicaId, key: usize) -> Option<Slot> {
        self.finals.get(&writer).map(|slots| slots[key])
    }

    /// The folded writers with their final slots.
    pub fn finals(&self) -> impl Iterator<Item = (ReplicaId, &[Slot])> {
        self.finals
            .iter()
            .map(|(writer, slots)| (*writer, slots.as_slice()))
    }

    /// True when the record of `epoch` that folds `writers` is held.
    pub fn holds(&self, epoch: u64, writers: &[ReplicaId]) -> bool {
        epoch
            .checked_sub(1)
            .and_then(|index| self.epochs.get(index as usize))
            .is_some_and(|held| held == writers)
    }

    /// The first epoch whose record holders were all lost (`gone`), and
    /// after which only those holders' records follow.
    fn lost_from(&self, epoch: u64, gone: &dyn Fn(ReplicaId) -> bool) -> bool {
        let index = epoch as usize - 1;
        self.holders[index..]
            .iter()
            .all(|holders| holders.iter().all(|holder| gone(*holder)))
    }

    /// `holder` committed (or adopted) the record of `epoch` folding
    /// `writers`. The first record of an epoch is registered, with each
    /// writer's final slots from `final_slots`; a later one must name the
    /// same writers, unless every holder of the one registered is `gone`
    /// (its disk lost), which voids it and the epochs after it. Returns
    /// true when the epoch is new.
    pub fn record(
        &mut self,
        epoch: u64,
        writers: &[ReplicaId],
        holder: ReplicaId,
        gone: &dyn Fn(ReplicaId) -> bool,
        mut final_slots: impl FnMut(ReplicaId) -> Vec<Slot>,
    ) -> Result<bool, FoldViolation> {
        if let Some(held) = epoch
            .checked_sub(1)
            .and_then(|index| self.epochs.get(index as usize))
        {
            if held == writers {
                self.holders[epoch as usize - 1].insert(holder);
                return Ok(false);
            }
            if !self.lost_from(epoch, gone) {
                return Err((
                    "fold records conflict",
                    format!("epoch {epoch} folds {writers:?} here, {held:?} elsewhere"),
                ));
            }
            self.truncate(epoch - 1);
        }
        if epoch != self.epoch() + 1 {
            return Err((
                "fold records conflict",
                format!(
                    "a record of epoch {epoch} was committed while epoch {} was the newest",
                    self.epoch()
                ),
            ));
        }
        if let Some(writer) = writers.iter().find(|writer| self.is_folded(**writer)) {
            return Err((
                "writer folded twice",
                format!(
                    "epoch {epoch} folds {writer} again (folded at epoch {})",
                    self.folded_at[writer]
                ),
            ));
        }
        let mut bases = self
            .bases
            .last()
            .cloned()
            .unwrap_or_else(|| vec![(0, 0); self.keys]);
        for writer in writers {
            let slots = final_slots(*writer);
            for (key, slot) in slots.iter().enumerate() {
                bases[key].0 += u128::from(slot.p);
                bases[key].1 += u128::from(slot.n);
            }
            self.finals.insert(*writer, slots);
            self.folded_at.insert(*writer, epoch);
        }
        self.bases.push(bases);
        self.epochs.push(writers.to_vec());
        self.holders.push(BTreeSet::from([holder]));
        Ok(true)
    }

    /// Forgets the records after `epoch`.
    fn truncate(&mut self, epoch: u64) {
        let keep = epoch as usize;
        for writers in self.epochs.drain(keep..) {
            for writer in writers {
                self.folded_at.remove(&writer);
                self.finals.remove(&writer);
            }
        }
        self.holders.truncate(keep);
        self.bases.truncate(keep);
    }

    /// Checks one state of counter `key` on its own: its base is the one of
    /// its epoch, and it holds no slot of a writer folded into that base.
    pub fn check_state(&self, key: usize, state: &PnCounter) -> Option<FoldViolation> {
        let base = state.folded();
        if base.epoch == 0 {
            return None;
        }
        let Some(&(p, n)) = self
            .bases
            .get(base.epoch as usize - 1)
            .map(|bases| &bases[key])
        else {
            return Some((
                "unknown fold epoch",
                format!(
                    "key {key} is folded at epoch {}, but members committed only up to {}",
                    base.epoch,
                    self.epoch()
                ),
            ));
        };
        if (base.p, base.n) != (p, n) {
            let what = if base.p > p || base.n > n {
                "counted twice"
            } else {
                "lost"
            };
            return Some((
                "fold base wrong",
                format!(
                    "key {key} at epoch {}: base (p {}, n {}) but the folded writers' final \
                     slots sum to (p {p}, n {n}): adds {what}",
                    base.epoch, base.p, base.n
                ),
            ));
        }
        if let Some((writer, slot)) = state
            .slots()
            .iter()
            .find(|(writer, _)| self.folded_by(*writer, base.epoch))
        {
            return Some((
                "folded writer counted twice",
                format!(
                    "key {key} at epoch {} holds slot {} of {writer}, which the base already \
                     counts (folded at epoch {})",
                    base.epoch,
                    slot_text(*slot),
                    self.folded_at[writer]
                ),
            ));
        }
        None
    }

    /// Checks a change of counter `key` from `old` to `new` at one replica
    /// (after `check_state` of `new`): the epoch does not go back, a slot
    /// the new epoch folds was at most its final slot, and every other slot
    /// does not go back (reported as "slot went backwards").
    pub fn check_change(&self, key: usize, old: &PnCounter, new: &PnCounter) -> Vec<FoldViolation> {
        let mut found = Vec::new();
        let (before, after) = (old.folded().epoch, new.folded().epoch);
        if after < before {
            found.push((
                "fold epoch went backwards",
                format!("key {key} went from fold epoch {before} to {after}"),
            ));
        }
        for (writer, slot) in old.slots() {
            if self.folded_by(*writer, after) {
                let last = self.final_slot(*writer, key).unwrap_or_default();
                if slot.p > last.p || slot.n > last.n {
                    found.push((
                        "fold lost adds",
                        format!(
                            "key {key}: slot {} of {writer} was folded at epoch {} as {}",
                            slot_text(*slot),
                            self.folded_at[writer],
                            slot_text(last)
                        ),
                    ));
                }
                continue;
            }
            let now = new.slot(*writer);
            if now.p < slot.p || now.n < slot.n {
                found.push((
                    "slot went backwards",
                    format!(
                        "key {key}: slot of {writer} went from {} to {}",
                        slot_text(*slot),
                        slot_text(now)
                    ),
                ));
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
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
        let record = folds.record(1, &[W], HOLDER, &kept, |_| vec![slot(5, 1)]);
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
        assert_eq!(folds.record(1, &[W], other, &kept, none), Ok(false));
        let conflict = folds.record(1, &[LIVE], other, &kept, none);
        assert_eq!(conflict.unwrap_err().0, "fold records conflict");
        let gap = folds.record(3, &[LIVE], other, &kept, none);
        assert_eq!(gap.unwrap_err().0, "fold records conflict");
        let again = folds.record(2, &[W], other, &kept, none);
        assert_eq!(again.unwrap_err().0, "writer folded twice");
        let next = folds.record(2, &[LIVE], other, &kept, |_| vec![slot(1, 0)]);
        assert_eq!(next, Ok(true));
        assert_eq!(folds.check_state(0, &PnCounter::new()), None);
    }

    #[test]
    fn a_record_whose_holders_all_lost_their_disks_is_replaced() {
        let mut folds = accounting();
        // Another holder heard of it: a different record is a conflict.
        let second = ReplicaId(2);
        assert_eq!(
            folds.record(1, &[W], second, &kept, |_| unreachable!()),
            Ok(false)
        );
        let only_first = |holder: ReplicaId| holder == HOLDER;
        let conflict = folds.record(1, &[W, LIVE], ReplicaId(3), &only_first, |_| unreachable!());
        assert_eq!(conflict.unwrap_err().0, "fold records conflict");
        // Both holders wiped: the record went with them.
        let everyone = |_| true;
        let replaced = folds.record(1, &[W, LIVE], ReplicaId(3), &everyone, |writer| {
            vec![if writer == W { slot(5, 1) } else { slot(2, 0) }]
        });
        assert_eq!(replaced, Ok(true));
        assert_eq!(folds.epoch(), 1);
        assert!(folds.folded_by(LIVE, 1));
        assert_eq!(folds.check_state(0, &folded((7, 1), &[])), None);
    }
}
