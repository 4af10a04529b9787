//! The sparse PN-counter: one `(p, n)` slot per replica that ever wrote.
//!
//! Invariants kept here: a replica raises only its own slot ([`PnCounter::checked_add`]
//! takes the writer's id and touches only that slot); merge is slot-wise max of
//! `p` and of `n`; no arithmetic wraps: an add that would take a slot past
//! `u64::MAX` or the value outside `i64` fails and changes nothing, and a merged
//! total outside `i64` is reported by [`PnCounter::value`] as an error.

use std::fmt;

use super::fold::FoldedBase;
use super::Crdt;

/// One replica incarnation's id: random, created with its data directory.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct ReplicaId(pub u64);

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// One replica's part of a counter: the sums of its increments and decrements.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Slot {
    /// Sum of the replica's increments.
    pub p: u64,
    /// Sum of the magnitudes of the replica's decrements.
    pub n: u64,
}

impl Slot {
    /// The slot's contribution to the value, exact.
    pub fn net(self) -> i128 {
        i128::from(self.p) - i128::from(self.n)
    }
}

/// Why an add was refused. Nothing changed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum AddError {
    /// The delta was zero; an add must change something.
    #[error("the delta is 0; an add must change the counter (use a negative delta to subtract)")]
    ZeroDelta,
    /// The replica's increment or decrement sum would pass `u64::MAX`.
    #[error("the counter's {which} sum for this replica would pass u64::MAX; nothing was added")]
    SlotOverflow {
        /// `"increment"` or `"decrement"`.
        which: &'static str,
    },
    /// The counter's value would leave the signed 64-bit range.
    #[error("the counter's value would leave the signed 64-bit range; nothing was added")]
    ValueOutOfRange,
}

/// The merged total is outside the signed 64-bit range (only possible when
/// several replicas each stayed in range on their own).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("the counter's merged value {0} is outside the signed 64-bit range")]
pub struct ValueOutOfRange(pub i128);

/// A PN-counter, sparse: only replicas that wrote have a slot. Slots are kept
/// sorted by replica id, so equal states compare and hash equal. Writers that
/// were retired and folded (see `crdt/fold.rs`) no longer have a slot: their
/// sums live in the counter's [`FoldedBase`], tagged with the fold epoch.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct PnCounter {
    pub(super) slots: Vec<(ReplicaId, Slot)>,
    pub(super) folded: FoldedBase,
}

impl PnCounter {
    /// An empty counter (value 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a counter from slots in any order; a replica named twice keeps
    /// the max of each sum, and empty slots are dropped. One sort and one
    /// pass: inserting the slots one by one into the sorted list was
    /// quadratic, which a peer could use to burn CPU with one large counter.
    pub fn from_slots(slots: impl IntoIterator<Item = (ReplicaId, Slot)>) -> Self {
        let mut slots: Vec<(ReplicaId, Slot)> = slots.into_iter().collect();
        slots.sort_unstable_by_key(|(replica, _)| *replica);
        let mut merged: Vec<(ReplicaId, Slot)> = Vec::with_capacity(slots.len());
        for (replica, slot) in slots {
            match merged.last_mut() {
                Some((last, mine)) if *last == replica => {
                    mine.p = mine.p.max(slot.p);
                    mine.n = mine.n.max(slot.n);
                }
                _ => merged.push((replica, slot)),
            }
        }
        merged.retain(|(_, slot)| *slot != Slot::default());
        PnCounter {
            slots: merged,
            folded: FoldedBase::default(),
        }
    }

    /// The slots, sorted by replica id.
    pub fn slots(&self) -> &[(ReplicaId, Slot)] {
        &self.slots
    }

    /// The slot of `replica`, zero if it never wrote.
    pub fn slot(&self, replica: ReplicaId) -> Slot {
        match self.slots.binary_search_by_key(&replica, |(id, _)| *id) {
            Ok(index) => self.slots[index].1,
            Err(_) => Slot::default(),
        }
    }

    /// True when no replica ever wrote.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.folded == FoldedBase::default()
    }

    /// The folded base: the sums of retired writers folded into this counter.
    pub fn folded(&self) -> FoldedBase {
        self.folded
    }

    /// `base + sum(p) - sum(n)`, computed in 128 bits so that it never wraps.
    pub fn exact_value(&self) -> i128 {
        self.folded.net() + self.slots.iter().map(|(_, slot)| slot.net()).sum::<i128>()
    }

    /// The value, or an error when the merged total is outside `i64`.
    pub fn value(&self) -> Result<i64, ValueOutOfRange> {
        let exact = self.exact_value();
        i64::try_from(exact).map_err(|_| ValueOutOfRange(exact))
    }

    /// Adds `delta` to `replica`'s own slot and returns the new value. Fails,
    /// changing nothing, on a zero delta, a slot sum past `u64::MAX` or a value
    /// leaving `i64`.
    pub fn checked_add(&mut self, replica: ReplicaId, delta: i64) -> Result<i64, AddError> {
        if delta == 0 {
            return Err(AddError::ZeroDelta);
        }
        let mut slot = self.slot(replica);
        if delta > 0 {
            slot.p = slot
                .p
                .checked_add(delta.unsigned_abs())
                .ok_or(AddError::SlotOverflow { which: "increment" })?;
        } else {
            slot.n = slot
                .n
                .checked_add(delta.unsigned_abs())
                .ok_or(AddError::SlotOverflow { which: "decrement" })?;
        }
        let value = self.exact_value() + i128::from(delta);
        let value = i64::try_from(value).map_err(|_| AddError::ValueOutOfRange)?;
        self.set_slot(replica, slot);
        Ok(value)
    }

    /// Raises `replica`'s slot to at least `slot`, sum by sum. Returns true when it changed.
    pub fn merge_slot(&mut self, replica: ReplicaId, slot: Slot) -> bool {
        match self.slots.binary_search_by_key(&replica, |(id, _)| *id) {
            Ok(index) => {
                let mine = &mut self.slots[index].1;
                let merged = Slot {
                    p: mine.p.max(slot.p),
                    n: mine.n.max(slot.n),
                };
                let changed = merged != *mine;
                *mine = merged;
                changed
            }
            Err(index) => {
                if slot == Slot::default() {
                    return false;
                }
                self.slots.insert(index, (replica, slot));
                true
            }
        }
    }

    fn set_slot(&mut self, replica: ReplicaId, slot: Slot) {
        match self.slots.binary_search_by_key(&replica, |(id, _)| *id) {
            Ok(index) => self.slots[index].1 = slot,
            Err(index) => self.slots.insert(index, (replica, slot)),
        }
    }

    /// True when every slot of `self` is at or below the same slot of `other`
    /// (the CRDT's partial order).
    pub fn is_covered_by(&self, other: &PnCounter) -> bool {
        self.slots.iter().all(|(replica, slot)| {
            let theirs = other.slot(*replica);
            slot.p <= theirs.p && slot.n <= theirs.n
        })
    }
}

impl Crdt for PnCounter {
    /// Slot-wise max, for two states at the same fold epoch (whose bases are
    /// then equal): the base is left alone. States at different epochs merge
    /// with [`PnCounter::merge_folded`], which knows which slots were folded.
    /// Both slot lists are sorted: one pass over the two when `other` brings
    /// replicas `self` lacks (inserting each was quadratic), slot by slot
    /// in place when it brings none.
    fn merge(&mut self, other: &Self) -> bool {
        debug_assert_eq!(self.folded.epoch, other.folded.epoch);
        let known = other
            .slots
            .iter()
            .filter(|(_, slot)| *slot != Slot::default())
            .all(|(replica, _)| {
                self.slots
                    .binary_search_by_key(replica, |(id, _)| *id)
                    .is_ok()
            });
        if known {
            let mut changed = false;
            for (replica, slot) in &other.slots {
                changed |= self.merge_slot(*replica, *slot);
            }
            return changed;
        }
        let mut merged = Vec::with_capacity(self.slots.len() + other.slots.len());
        let (mut mine, mut theirs) = (self.slots.iter().peekable(), other.slots.iter().peekable());
        loop {
            let next = match (mine.peek(), theirs.peek()) {
                (Some((a, x)), Some((b, y))) if a == b => {
                    let slot = Slot {
                        p: x.p.max(y.p),
                        n: x.n.max(y.n),
                    };
                    mine.next();
                    theirs.next();
                    (*a, slot)
                }
                (Some((a, _)), Some((b, _))) if a < b => *mine.next().unwrap(),
                (_, Some(_)) => *theirs.next().unwrap(),
                (Some(_), None) => *mine.next().unwrap(),
                (None, None) => break,
            };
            if next.1 != Slot::default() {
                merged.push(next);
            }
        }
        // Some slot of `other` is new and non-empty, so the state changed.
        self.slots = merged;
        true
    }
}

#[cfg(test)]
#[path = "pn_counter_tests.rs"]
mod tests;
