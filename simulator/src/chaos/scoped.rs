//! Live replicas whose slot of a key was partly folded (cluster version 12,
//! `node/src/replica/fold_scoped.rs`): when the key's partition moved away
//! from a node that lives on and stayed away for `--retire-after`, that
//! node's slots there were folded into the counters' bases; if the
//! partition came back, the node writes it again from a fresh slot.
//!
//! The exact check of such a (key, replica). The node took no add of the
//! key between its release of the partition and the fold (it does not serve
//! it, and promised), so the adds it applied split at one instant `T`: those
//! sent before `T` are in the base (the acknowledged ones certainly, those
//! of unknown fate maybe), those sent after are in its final slot (the
//! same). So the final slot must be the acknowledged adds sent after some
//! `T` plus some of the unknown ones sent after it, and the base then holds,
//! besides the folded replicas' parts (`folds.rs`), this replica's adds
//! sent before `T`: a [`SlotAt`] among the base's candidates
//! (`base_search.rs`). A slot that all its adds explain (`T` at the start)
//! is checked as any live slot; a slot that no instant explains is left to
//! that check, which reports it.

use std::collections::{BTreeMap, BTreeSet};

use tally_node::crdt::{PnCounter, ReplicaId, Slot};

use super::check::{AddTimes, SlotAt};
use crate::ledger::Ledger;

/// The base part of each split (key, live replica): one [`SlotAt`] per
/// instant that explains its final slot.
pub(super) type Splits = BTreeMap<(usize, ReplicaId), Vec<SlotAt>>;

/// The (key, live replica) pairs whose final slot holds only the adds sent
/// after some instant, with the base parts those instants leave.
pub(super) fn live_splits(
    ledger: &Ledger,
    times: &AddTimes,
    finals: &[PnCounter],
    dead: &BTreeSet<ReplicaId>,
) -> Splits {
    let mut groups: BTreeMap<(usize, ReplicaId), Vec<u32>> = BTreeMap::new();
    for (id, add) in ledger.adds.iter().enumerate() {
        for replica in add.delivered.iter().filter(|r| !dead.contains(r)) {
            groups
                .entry((add.key as usize, *replica))
                .or_default()
                .push(id as u32);
        }
    }
    let mut splits = Splits::new();
    for ((key, replica), adds) in groups {
        let Some(state) = finals.get(key) else {
            continue;
        };
        let slot = state.slot(replica);
        let parts = base_parts(ledger, times, &adds, replica, slot);
        // An instant at the start: every add in the slot, nothing folded.
        if parts.iter().any(|part| *part == SlotAt::default()) || parts.is_empty() {
            continue;
        }
        splits.insert((key, replica), parts);
    }
    splits
}

/// For each instant `T` (the start, and just after each send) at which
/// `slot` is the acknowledged adds sent after `T` plus some of the unknown
/// ones sent after it: the part sent before `T`.
fn base_parts(
    ledger: &Ledger,
    times: &AddTimes,
    adds: &[u32],
    replica: ReplicaId,
    slot: Slot,
) -> Vec<SlotAt> {
    let mut instants: Vec<u64> = vec![0];
    instants.extend(adds.iter().map(|id| times.sent[*id as usize] * 2 + 1));
    instants.sort_unstable();
    instants.dedup();
    let mut parts = Vec::new();
    for t in instants {
        let (mut before, mut after) = (SlotAt::default(), SlotAt::default());
        for id in adds {
            let add = &ledger.adds[*id as usize];
            let part = match times.sent[*id as usize] * 2 < t {
                true => &mut before,
                false => &mut after,
            };
            let certain = add.certain_at(replica).is_some();
            match (certain, add.negative) {
                (true, false) => part.p += add.magnitude(),
                (true, true) => part.n += add.magnitude(),
                (false, false) => part.unknown_p |= add.magnitude(),
                (false, true) => part.unknown_n |= add.magnitude(),
            }
        }
        if after.explains(slot) {
            parts.push(before);
        }
    }
    parts
}

/// The ledger and final states without the split pairs, for the check of
/// live slots (their slots are checked with the bases instead).
pub(super) fn without_splits(
    ledger: &Ledger,
    finals: &[PnCounter],
    splits: &Splits,
) -> (Ledger, Vec<PnCounter>) {
    let mut live = Ledger::new(0, 0);
    live.adds = ledger
        .adds
        .iter()
        .map(|add| {
            let mut add = add.clone();
            add.delivered
                .retain(|replica| !splits.contains_key(&(add.key as usize, *replica)));
            add
        })
        .collect();
    let finals = finals
        .iter()
        .enumerate()
        .map(|(key, state)| {
            PnCounter::from_slots(
                state
                    .slots()
                    .iter()
                    .filter(|(replica, _)| !splits.contains_key(&(key, *replica)))
                    .copied(),
            )
        })
        .collect();
    (live, finals)
}

#[cfg(test)]
#[path = "scoped_tests.rs"]
mod tests;
