//! Folding a retired writer of a bounded counter into an heir, exactly
//! (issue 44; DESIGN.md "Bounded counters", invariant 10: rights "survive
//! folds exactly").
//!
//! A retired writer W (fenced: it never writes again, which the fold
//! protocol guarantees, as for PN-counter folds) still holds rights: its
//! row's `put - took - sent` plus what others sent it. A fold gives them to
//! an heir H without moving a number. The state records the **fact**
//! "W's heir is H" in a map merged by union, and a live writer's rights
//! ([`BoundedCounter::rights`]) count, besides its own, the row rights of
//! every retired writer whose chain of heirs leads to it; a retired writer
//! holds none. So:
//!
//! - **Counted once.** The fold adds no amount anywhere: applying it twice,
//!   at two replicas, or merging it with states that have not applied it
//!   yet only ever yields the same map entry, and W's rights are read from
//!   W's row, which merges by max like every row. The sum of the live
//!   writers' rights stays `value - bound` (each row's rights are counted
//!   at exactly one live writer, and transfers cancel out).
//! - **A stale fold creates nothing.** A fold carries the frozen row it was
//!   computed from ([`RetiredFold`]); applying it merges that row into W's
//!   (by max) and never stores a sum derived from it. A fold computed from
//!   an older row of W, merged with a later row, yields W's later row: the
//!   heir inherits what that row leaves, never what the older one did. A
//!   replica that already knows a later row than the fold's refuses it
//!   ([`BoundedFoldRefused::StaleFrozenRow`]): the protocol's premise (the row is
//!   final) is broken there.
//! - **Escrow still holds at the heir.** On the heir's replica its view of
//!   W's row rights is W's final row (exact) plus the transfers to W it has
//!   seen (at most the truth), so the heir's view of its rights stays at
//!   most the truth. This needs the frozen row to be W's final row, which
//!   the caller guarantees (every member held the same final state of W
//!   before the fold was decided); transfers sent to W later, by writers
//!   that had not seen the fold, reach the heir the same way.
//! - **Chains.** If the heir retires in turn, its fold names its own heir,
//!   and W's rights follow the chain to the first live writer.
//! - **One heir.** The heir is a function of the fold's inputs: the lowest
//!   live writer id given to [`RetiredFold::new`]. Two folds of W naming
//!   different heirs, or heirs that would lead in a circle (W to H and H
//!   to W, decided concurrently), are refused by
//!   [`BoundedCounter::fold_retired`] and [`BoundedCounter::check_merge`];
//!   merged regardless, the map keeps the lower heir (so merge stays a
//!   lattice) and a circle's rights are held by no one: lost, never
//!   created.

use std::collections::{btree_map::Entry, BTreeMap};

use super::bounded::{BoundedCounter, RightsRow};
use super::ReplicaId;

/// A fold of one retired writer into its heir, with the frozen row it was
/// computed from. Several nodes may apply it, in any order, any number of
/// times.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RetiredFold {
    retired: ReplicaId,
    heir: ReplicaId,
    frozen: RightsRow,
}

impl RetiredFold {
    /// The fold of `retired`, whose final row is `frozen`, into the lowest
    /// id of `live` other than `retired` (the same inputs give the same
    /// heir at every node).
    pub fn new(
        retired: ReplicaId,
        frozen: RightsRow,
        live: impl IntoIterator<Item = ReplicaId>,
    ) -> Result<Self, BoundedFoldRefused> {
        let heir = live
            .into_iter()
            .filter(|writer| *writer != retired)
            .min()
            .ok_or(BoundedFoldRefused::NoHeir { retired })?;
        Ok(RetiredFold {
            retired,
            heir,
            frozen,
        })
    }

    /// The retired writer.
    pub fn retired(&self) -> ReplicaId {
        self.retired
    }

    /// The writer that holds its rights from now on.
    pub fn heir(&self) -> ReplicaId {
        self.heir
    }

    /// The retired writer's final row, as the fold saw it.
    pub fn frozen(&self) -> &RightsRow {
        &self.frozen
    }
}

/// Why a fold, or a merge of states with folds, was refused; nothing
/// changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoundedFoldRefused {
    /// No live writer was given to inherit the rights.
    #[error(
        "writer {retired} cannot be folded: no other live writer was given to inherit its rights"
    )]
    NoHeir {
        /// The writer to retire.
        retired: ReplicaId,
    },
    /// Two folds of one writer name different heirs.
    #[error("writer {retired} was folded into {ours} here and into {theirs} there; the fold protocol must decide one heir")]
    HeirConflict {
        /// The retired writer.
        retired: ReplicaId,
        /// Its heir here.
        ours: ReplicaId,
        /// Its heir in the other fold or state.
        theirs: ReplicaId,
    },
    /// The heirs would lead in a circle, where nobody holds the rights.
    #[error("folding writer {retired} would make a circle of heirs; fold into a live writer")]
    HeirCycle {
        /// A retired writer on the circle.
        retired: ReplicaId,
    },
    /// This replica knows a later row of the writer than the fold's frozen
    /// row: the row was not final, and the fold would give rights it spent.
    #[error("the fold of writer {retired} was computed from an older row than this replica holds; fold again from its final row")]
    StaleFrozenRow {
        /// The retired writer.
        retired: ReplicaId,
    },
}

impl BoundedCounter {
    /// Applies `fold`: merges its frozen row into the retired writer's row
    /// and records its heir. Returns whether the state changed (a second
    /// application changes nothing). Refused, changing nothing, when the
    /// writer was folded into another heir, when the heirs would make a
    /// circle, or when this state knows a later row of the writer.
    pub fn fold_retired(&mut self, fold: &RetiredFold) -> Result<bool, BoundedFoldRefused> {
        let retired = fold.retired;
        if let Some(ours) = self.heirs.get(&retired) {
            if *ours != fold.heir {
                return Err(BoundedFoldRefused::HeirConflict {
                    retired,
                    ours: *ours,
                    theirs: fold.heir,
                });
            }
        }
        if self.chain_reaches(fold.heir, retired) {
            return Err(BoundedFoldRefused::HeirCycle { retired });
        }
        if let Some(row) = self.rows.get(&retired) {
            if !covers(&fold.frozen, row) {
                return Err(BoundedFoldRefused::StaleFrozenRow { retired });
            }
        }
        let changed = self.merge_row(retired, &fold.frozen);
        Ok(self.heirs.insert(retired, fold.heir).is_none() || changed)
    }

    /// Each retired writer's heir.
    pub fn heirs(&self) -> &BTreeMap<ReplicaId, ReplicaId> {
        &self.heirs
    }

    /// The live writer that holds `writer`'s rights: itself if it is not
    /// retired, else the end of its chain of heirs; `None` on a circle.
    pub fn holder_of(&self, writer: ReplicaId) -> Option<ReplicaId> {
        let mut at = writer;
        for _ in 0..=self.heirs.len() {
            match self.heirs.get(&at) {
                None => return Some(at),
                Some(heir) => at = *heir,
            }
        }
        None
    }

    /// Whether following heirs from `from` (itself included) meets `target`.
    fn chain_reaches(&self, from: ReplicaId, target: ReplicaId) -> bool {
        let mut at = from;
        for _ in 0..=self.heirs.len() {
            if at == target {
                return true;
            }
            match self.heirs.get(&at) {
                None => return false,
                Some(heir) => at = *heir,
            }
        }
        true
    }

    /// Whether `other`'s folds agree with ours: one heir per retired writer,
    /// and no circle once merged.
    pub(super) fn check_fold_merge(
        &self,
        other: &BoundedCounter,
    ) -> Result<(), BoundedFoldRefused> {
        for (retired, theirs) in &other.heirs {
            match self.heirs.get(retired) {
                Some(ours) if ours != theirs => {
                    return Err(BoundedFoldRefused::HeirConflict {
                        retired: *retired,
                        ours: *ours,
                        theirs: *theirs,
                    })
                }
                _ => {}
            }
        }
        let mut merged = self.clone();
        merged.merge_heirs(other);
        match merged
            .heirs
            .keys()
            .find(|r| merged.holder_of(**r).is_none())
        {
            Some(retired) => Err(BoundedFoldRefused::HeirCycle { retired: *retired }),
            None => Ok(()),
        }
    }

    /// The union of the heirs; on a conflict (which
    /// [`BoundedCounter::check_merge`] refuses) the lower heir, so that
    /// merge stays commutative, associative and idempotent.
    pub(super) fn merge_heirs(&mut self, other: &BoundedCounter) -> bool {
        let mut changed = false;
        for (retired, theirs) in &other.heirs {
            match self.heirs.entry(*retired) {
                Entry::Vacant(entry) => {
                    entry.insert(*theirs);
                    changed = true;
                }
                Entry::Occupied(mut entry) if theirs < entry.get() => {
                    entry.insert(*theirs);
                    changed = true;
                }
                Entry::Occupied(_) => {}
            }
        }
        changed
    }
}

/// Whether `row` is at least `older` in every field (a later or equal state
/// of one writer's row).
fn covers(row: &RightsRow, older: &RightsRow) -> bool {
    row.put >= older.put
        && row.took >= older.took
        && older
            .sent
            .iter()
            .all(|(to, sent)| row.sent.get(to).copied().unwrap_or(0) >= *sent)
}

#[cfg(test)]
#[path = "bounded_fold_tests.rs"]
mod tests;
