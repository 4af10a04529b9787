//! The counter's side of folding: building a counter with a folded base,
//! applying fold records to it, and the merge across fold epochs (the rules
//! are in the parent module's documentation; invariant 9: none of these
//! changes a counter's value).

use super::{FoldBook, FoldError, FoldedBase, WriterDigest};
use crate::crdt::{PnCounter, ReplicaId, Slot};

impl PnCounter {
    /// A counter with `slots` and the folded `base`; slots of writers that
    /// `book` says are folded at or below the base's epoch are dropped.
    pub fn with_base(
        slots: impl IntoIterator<Item = (ReplicaId, Slot)>,
        base: FoldedBase,
        book: &FoldBook,
    ) -> Self {
        let mut counter = PnCounter::from_slots(slots);
        counter.folded = base;
        counter
            .slots
            .retain(|(writer, _)| !folded_by(book, *writer, base.epoch));
        counter
    }

    /// A counter with `slots` and `base` as given, trusting that no slot
    /// belongs to a writer folded into the base (a decoded record this node
    /// wrote itself).
    pub fn from_parts(
        slots: impl IntoIterator<Item = (ReplicaId, Slot)>,
        base: FoldedBase,
    ) -> Self {
        let mut counter = PnCounter::from_slots(slots);
        counter.folded = base;
        counter
    }

    /// Folds, up to epoch `upto`, the writers of `book`'s records that this
    /// counter has not folded yet: their slots move into the base as they
    /// are (a scoped writer's only when the record folds it in `partition`,
    /// the counter's). Applying an epoch twice changes nothing (the base
    /// records the epoch it is complete up to). Returns true when the state
    /// changed. The caller folds only after checking that its state of each
    /// writer is the final one the record names (see `replica/folds.rs`).
    pub fn apply_folds(&mut self, book: &FoldBook, upto: u64, partition: Option<u32>) -> bool {
        let upto = upto.min(book.epoch());
        if upto <= self.folded.epoch {
            return false;
        }
        let mut base = self.folded;
        for epoch in self.folded.epoch + 1..=upto {
            let record = book
                .record(epoch)
                .expect("epochs up to book.epoch() are held");
            let scoped = record.scoped.iter().filter(|(_, digests)| {
                partition.is_some_and(|p| digest_index(digests, p).is_some())
            });
            let whole = record.writers.iter().map(|(writer, _)| writer);
            for writer in whole.chain(scoped.map(|(writer, _)| writer)) {
                // Zeroed as it moves: a writer folded in this partition at
                // two of these epochs is counted once, as it is held now.
                let slot = self.slot(*writer);
                base.p += u128::from(slot.p);
                base.n += u128::from(slot.n);
                self.slots.retain(|(w, _)| w != writer);
            }
        }
        let from = self.folded.epoch;
        base.epoch = upto;
        self.folded = base;
        self.slots.retain(|(writer, _)| {
            !folded_by(book, *writer, upto) && !book.scoped_between(*writer, partition, from, upto)
        });
        true
    }

    /// Merges `other` into `self` across fold epochs: the result takes the
    /// base of the higher epoch and drops the slots of writers folded at or
    /// below it, and each state's slots of writers folded in `partition`
    /// (the counter's) above its own epoch; then it takes the slot-wise max
    /// of the rest. Refused, changing nothing, when either state is at an
    /// epoch `book` does not hold yet, or when two states at one epoch
    /// disagree on the base. Returns true when `self` changed.
    pub fn merge_folded(
        &mut self,
        other: &PnCounter,
        book: &FoldBook,
        partition: Option<u32>,
    ) -> Result<bool, FoldError> {
        let base = self.merged_base(other, book)?;
        let epoch = base.epoch;
        if book.epoch() == 0 {
            // The common case: no fold ever, plain slot-wise max.
            return Ok(crate::crdt::Crdt::merge(self, other));
        }
        let before = self.clone();
        let kept = |state: &PnCounter, writer: ReplicaId| {
            !folded_by(book, writer, epoch)
                && !book.scoped_between(writer, partition, state.folded.epoch, epoch)
        };
        let theirs = other
            .slots
            .iter()
            .filter(|(writer, _)| kept(other, *writer));
        let mine = self.slots.iter().filter(|(writer, _)| kept(self, *writer));
        let mut merged = PnCounter::from_slots(mine.chain(theirs).copied());
        merged.folded = base;
        *self = merged;
        Ok(*self != before)
    }

    /// Whether [`PnCounter::merge_folded`] of `other` into this state would
    /// be refused, without merging: a caller that must take a whole batch
    /// or none of it checks every counter first.
    pub fn check_merge_folded(&self, other: &PnCounter, book: &FoldBook) -> Result<(), FoldError> {
        self.merged_base(other, book).map(|_| ())
    }

    /// The base of the merge of `self` and `other`: the higher epoch's.
    /// Refused when that epoch is one `book` does not hold, or when both
    /// are at one epoch with different bases.
    fn merged_base(&self, other: &PnCounter, book: &FoldBook) -> Result<FoldedBase, FoldError> {
        let epoch = self.folded.epoch.max(other.folded.epoch);
        if epoch > book.epoch() {
            return Err(FoldError::UnknownEpoch {
                epoch,
                known: book.epoch(),
            });
        }
        match self.folded.epoch.cmp(&other.folded.epoch) {
            std::cmp::Ordering::Less => Ok(other.folded),
            std::cmp::Ordering::Greater => Ok(self.folded),
            std::cmp::Ordering::Equal if self.folded == other.folded => Ok(self.folded),
            std::cmp::Ordering::Equal => Err(FoldError::BaseConflict {
                epoch,
                ours_p: self.folded.p,
                ours_n: self.folded.n,
                theirs_p: other.folded.p,
                theirs_n: other.folded.n,
            }),
        }
    }
}

/// Where `partition` is in a sorted list of digests per partition.
fn digest_index(digests: &[(u32, WriterDigest)], partition: u32) -> Option<usize> {
    digests.binary_search_by_key(&partition, |(p, _)| *p).ok()
}

fn folded_by(book: &FoldBook, writer: ReplicaId, epoch: u64) -> bool {
    book.folded_at(writer).is_some_and(|at| at <= epoch)
}
