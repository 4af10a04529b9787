//! Live replicas whose slot of a key was partly folded (cluster version 12,
//! `node/core/src/replica/fold_scoped.rs`): when the key's partition moved away
//! from a node that lives on and stayed away for `--retire-after`, that
//! node's slots there were folded into the counters' bases; if the
//! partition came back, the node writes it again from a fresh slot.
//!
//! The exact check of such a (key, replica). The node took no add of the
//! key between its release of the partition and the fold (it does not serve
//! it, and promised), so the adds it applied split at one instant `T`:
//! those applied before `T` are in the base, those after in its final slot
//! (`base_parts` says which adds may be on which side). So the base holds,
//! besides the folded replicas' parts (`folds.rs`), this replica's part
//! before some `T` that explains its slot: a [`SlotAt`] among the base's
//! candidates (`base_search.rs`). A slot that all its adds explain (`T` at
//! the start) is checked as any live slot; a slot that no instant explains
//! is left to that check, which reports it.

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

/// For each instant `T` (the start, and just after each send and each
/// answer) that can split `slot`'s adds: the part before `T`, in the base.
///
/// An add acknowledged before `T` was applied before it, one sent after
/// `T` after it; an acknowledged add sent before `T` and answered after it
/// (a retry that reached the node late, say) may be on either side, and so
/// may an add of unknown fate sent before `T`. Those hold distinct lanes
/// (`ledger.rs`), so what the slot holds beyond the adds certainly after
/// `T` names exactly which of them are in the slot: each acknowledged one
/// that is not is certainly in the base, each unknown one that is not may
/// be. So every acknowledged add is counted exactly once, on one side.
fn base_parts(
    ledger: &Ledger,
    times: &AddTimes,
    adds: &[u32],
    replica: ReplicaId,
    slot: Slot,
) -> Vec<SlotAt> {
    let mut instants: Vec<u64> = vec![0];
    for id in adds {
        instants.push(times.sent[*id as usize] * 2 + 1);
        let answered = times.answered[*id as usize];
        if answered != u64::MAX {
            instants.push(answered * 2 + 1);
        }
    }
    instants.sort_unstable();
    instants.dedup();
    let mut parts = Vec::new();
    for t in instants {
        // Per sign: (sure before, sure after, acknowledged either side,
        // unknown before, unknown after).
        let mut sides = [[0u64; 5]; 2];
        for id in adds {
            let add = &ledger.adds[*id as usize];
            let sent = times.sent[*id as usize] * 2;
            let answered = times.answered[*id as usize].saturating_mul(2);
            let side = match (add.certain_at(replica).is_some(), sent > t, answered < t) {
                (true, _, true) => 0,
                (true, true, _) => 1,
                (true, false, false) => 2,
                (false, false, _) => 3,
                (false, true, _) => 4,
            };
            let sign = &mut sides[usize::from(add.negative)];
            match side {
                0 | 1 => sign[side] += add.magnitude(),
                _ => sign[side] |= add.magnitude(),
            }
        }
        let split = |[before, after, either, unknown_before, unknown_after]: [u64; 5],
                     held: u64| {
            let rest = held.checked_sub(after)?;
            if rest & !(either | unknown_before | unknown_after) != 0 {
                return None;
            }
            Some((before + (either & !rest), unknown_before & !rest))
        };
        if let (Some((p, unknown_p)), Some((n, unknown_n))) =
            (split(sides[0], slot.p), split(sides[1], slot.n))
        {
            parts.push(SlotAt {
                p,
                n,
                unknown_p,
                unknown_n,
                lost: 0,
            });
        }
    }
    parts
}

/// The ledger and final states without the (key, replica) pairs `drop`
/// names: their adds' deliveries and their slots.
pub(super) fn without_slots(
    ledger: &Ledger,
    finals: &[PnCounter],
    drop: impl Fn(usize, ReplicaId) -> bool,
) -> (Ledger, Vec<PnCounter>) {
    let mut kept = Ledger::new(0, 0);
    kept.adds = ledger
        .adds
        .iter()
        .map(|add| {
            let mut add = add.clone();
            add.delivered
                .retain(|replica| !drop(add.key as usize, *replica));
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
                    .filter(|(replica, _)| !drop(key, *replica))
                    .copied(),
            )
        })
        .collect();
    (kept, finals)
}

#[cfg(test)]
#[path = "scoped_tests.rs"]
mod tests;
