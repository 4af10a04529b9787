//! The checker's exact accounting of folds (`--retire`, and the scoped
//! folds of partitioned regions): which writers each fold epoch folded,
//! whole or in some partitions, and each folded writer's final slot there.
//!
//! A writer's slots in a counter live in **phases**: the first phase until
//! the first fold of the writer in that counter's partition, the next one
//! from that fold's epoch until the next, and so on. A whole fold (a
//! retired writer) ends its last phase everywhere; a scoped fold (a live
//! writer whose partition moved away, `replica/fold_scoped.rs`) ends it in
//! the partitions it names, and the writer's slot there starts again from 0
//! in the new phase once it writes the partition again. A state at fold
//! epoch `e` holds the writer's slot of the phase `e` is in; merges never
//! take an older phase's slot for a newer one's.
//!
//! A phase's final slot is taken when the first member commits the record
//! that ends it, as the most that any replica then holds of it (on disk or
//! in memory, in a state whose epoch is in that phase): the writer wrote
//! its last there before the record could be made, so under a correct
//! protocol every member holds that same state. Invariant 9 (DESIGN.md)
//! then reads, per counter state:
//!
//! - the folded base at epoch `e` is exactly the sum of the final slots of
//!   the phases ended at epochs `1..=e` (a missing part is a loss, an extra
//!   part a double count);
//! - a state at epoch `e` holds no slot of a writer folded whole at or
//!   below `e` (that writer would be counted twice);
//! - moving a state across the end of a phase never drops more of the
//!   writer's slot than that phase's final slot (otherwise the fold lost
//!   adds someone held), and within a phase no slot goes back;
//! - epochs never go back, and no state is at an epoch no member committed;
//! - two members never hold different records of one epoch. One exception
//!   is no conflict: a record whose every holder lost its disk before any
//!   other member heard of it (a member that committed and was then wiped
//!   and retired) is gone with its states, which no other member could
//!   merge (a state at an epoch a member holds no record of is refused);
//!   the next record of that epoch replaces it.
//!
//! The exact slot check at the end counts a writer's adds in a counter as
//! the final slots of its ended phases plus its slot in the final state.

use std::collections::{BTreeMap, BTreeSet};

use tally_node::crdt::{FoldRecord, PnCounter, ReplicaId, Slot};

/// What one fold record folds: writers whole, and live writers in some
/// partitions (sorted, as the record lists them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldShape {
    /// Writers folded whole.
    pub whole: Vec<ReplicaId>,
    /// Writers folded in the partitions listed.
    pub scoped: Vec<(ReplicaId, Vec<u32>)>,
}

impl FoldShape {
    /// The shape of `record`.
    pub fn of(record: &FoldRecord) -> Self {
        FoldShape {
            whole: record.writers.iter().map(|(writer, _)| *writer).collect(),
            scoped: record
                .scoped
                .iter()
                .map(|(writer, parts)| (*writer, parts.iter().map(|(p, _)| *p).collect()))
                .collect(),
        }
    }

    /// Writers folded whole.
    pub fn whole(writers: &[ReplicaId]) -> Self {
        FoldShape {
            whole: writers.to_vec(),
            scoped: Vec::new(),
        }
    }

    /// Every writer the record folds, whole or scoped.
    pub fn writers(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        let scoped = self.scoped.iter().map(|(writer, _)| *writer);
        self.whole.iter().copied().chain(scoped)
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct FoldAccounting {
    keys: usize,
    /// The partition of each counter (empty where no scoped fold can be).
    partition_of: Vec<u32>,
    /// What epoch `e` folds, at index `e - 1`.
    shapes: Vec<FoldShape>,
    /// The replicas that committed or adopted the record of epoch `e`.
    holders: Vec<BTreeSet<ReplicaId>>,
    /// Writers folded whole, with their epoch.
    folded_at: BTreeMap<ReplicaId, u64>,
    /// Per writer and counter: the ends of its phases, in epoch order, each
    /// with the phase's final slot.
    phases: BTreeMap<(ReplicaId, usize), Vec<(u64, Slot)>>,
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

    /// Counters live in partitions (`partition_of[key]`), so scoped folds
    /// can be accounted.
    pub fn set_partitions(&mut self, partition_of: Vec<u32>) {
        assert_eq!(partition_of.len(), self.keys, "one partition per counter");
        self.partition_of = partition_of;
    }

    /// The newest epoch any member committed.
    pub fn epoch(&self) -> u64 {
        self.shapes.len() as u64
    }

    /// Writers folded whole so far.
    pub fn writers_folded(&self) -> usize {
        self.folded_at.len()
    }

    /// (writer, partition) phases ended by scoped folds so far.
    pub fn scoped_folded(&self) -> usize {
        self.shapes
            .iter()
            .flat_map(|shape| &shape.scoped)
            .map(|(_, partitions)| partitions.len())
            .sum()
    }

    /// True when `writer` is folded whole at an epoch up to `epoch`.
    pub fn folded_by(&self, writer: ReplicaId, epoch: u64) -> bool {
        self.folded_at.get(&writer).is_some_and(|at| *at <= epoch)
    }

    /// True when `writer` is folded whole at all.
    pub fn is_folded(&self, writer: ReplicaId) -> bool {
        self.folded_at.contains_key(&writer)
    }

    fn ends(&self, writer: ReplicaId, key: usize) -> &[(u64, Slot)] {
        self.phases
            .get(&(writer, key))
            .map_or(&[], |ends| ends.as_slice())
    }

    /// Which phase of `writer` in counter `key` a state at fold epoch
    /// `epoch` holds (0 first).
    pub fn phase(&self, writer: ReplicaId, key: usize, epoch: u64) -> usize {
        self.ends(writer, key)
            .iter()
            .take_while(|(at, _)| *at <= epoch)
            .count()
    }

    /// True when states of counter `key` at epochs `a` and `b` hold the
    /// same phase of `writer`'s slot (so their slots compare).
    pub fn same_phase(&self, writer: ReplicaId, key: usize, a: u64, b: u64) -> bool {
        self.phase(writer, key, a) == self.phase(writer, key, b)
    }

    /// The final slot of the phase a state at `from` holds of `writer` in
    /// counter `key`, when a fold at an epoch in `from + 1..=to` ended it.
    pub fn ended_between(&self, writer: ReplicaId, key: usize, from: u64, to: u64) -> Option<Slot> {
        self.ends(writer, key)
            .iter()
            .find(|(at, _)| *at > from)
            .filter(|(at, _)| *at <= to)
            .map(|(_, last)| *last)
    }

    /// Per counter: the epoch the current phase of `writer` began at (0
    /// for the first): a phase's final slot is taken from states at or
    /// above it.
    pub fn phase_floors(&self, writer: ReplicaId) -> Vec<u64> {
        (0..self.keys)
            .map(|key| self.ends(writer, key).last().map_or(0, |(at, _)| *at))
            .collect()
    }

    /// What the base of counter `key` at `epoch` counts of `writer`: the
    /// final slots of its phases ended up to `epoch`.
    pub fn counted(&self, writer: ReplicaId, key: usize, epoch: u64) -> Slot {
        self.ends(writer, key)
            .iter()
            .take_while(|(at, _)| *at <= epoch)
            .fold(Slot::default(), |sum, (_, last)| Slot {
                p: sum.p + last.p,
                n: sum.n + last.n,
            })
    }

    /// The writers the base of counter `key` at `epoch` counts, with what
    /// it counts of each.
    pub fn counted_writers(&self, key: usize, epoch: u64) -> Vec<(ReplicaId, Slot)> {
        self.phases
            .keys()
            .filter(|(_, k)| *k == key)
            .map(|(writer, _)| (*writer, self.counted(*writer, key, epoch)))
            .filter(|(_, slot)| *slot != Slot::default())
            .collect()
    }

    /// True when the record of `epoch` that folds `shape` is held.
    pub fn holds(&self, epoch: u64, shape: &FoldShape) -> bool {
        epoch
            .checked_sub(1)
            .and_then(|index| self.shapes.get(index as usize))
            .is_some_and(|held| held == shape)
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
    /// `shape`. The first record of an epoch is registered, with each
    /// folded writer's final slots from `final_slots` (per counter, the
    /// most held in its current phase: see [`Self::phase_floors`]; only
    /// the named partitions' counters are taken of a scoped writer); a
    /// later one must fold the same, unless every holder of the one
    /// registered is `gone` (its disk lost), which voids it and the epochs
    /// after it. Returns true when the epoch is new.
    pub fn record(
        &mut self,
        epoch: u64,
        shape: &FoldShape,
        holder: ReplicaId,
        gone: &dyn Fn(ReplicaId) -> bool,
        mut final_slots: impl FnMut(ReplicaId) -> Vec<Slot>,
    ) -> Result<bool, FoldViolation> {
        if let Some(held) = epoch
            .checked_sub(1)
            .and_then(|index| self.shapes.get(index as usize))
        {
            if held == shape {
                self.holders[epoch as usize - 1].insert(holder);
                return Ok(false);
            }
            if !self.lost_from(epoch, gone) {
                return Err((
                    "fold records conflict",
                    format!("epoch {epoch} folds {shape:?} here, {held:?} elsewhere"),
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
        if let Some(writer) = shape.writers().find(|writer| self.is_folded(*writer)) {
            return Err((
                "writer folded twice",
                format!(
                    "epoch {epoch} folds {writer} again (folded whole at epoch {})",
                    self.folded_at[&writer]
                ),
            ));
        }
        if !shape.scoped.is_empty() && self.partition_of.is_empty() {
            return Err((
                "scoped fold without partitions",
                format!("epoch {epoch} folds {:?} by partition", shape.scoped),
            ));
        }
        let mut bases = self
            .bases
            .last()
            .cloned()
            .unwrap_or_else(|| vec![(0, 0); self.keys]);
        let whole = shape.whole.iter().map(|writer| (*writer, None));
        let scoped = shape
            .scoped
            .iter()
            .map(|(writer, partitions)| (*writer, Some(partitions)));
        for (writer, partitions) in whole.chain(scoped).collect::<Vec<_>>() {
            let slots = final_slots(writer);
            for (key, slot) in slots.iter().enumerate() {
                let named = partitions.is_none_or(|parts| parts.contains(&self.partition_of[key]));
                if !named {
                    continue;
                }
                bases[key].0 += u128::from(slot.p);
                bases[key].1 += u128::from(slot.n);
                self.phases
                    .entry((writer, key))
                    .or_default()
                    .push((epoch, *slot));
            }
            if partitions.is_none() {
                self.folded_at.insert(writer, epoch);
            }
        }
        self.bases.push(bases);
        self.shapes.push(shape.clone());
        self.holders.push(BTreeSet::from([holder]));
        Ok(true)
    }

    /// Forgets the records after `epoch`.
    fn truncate(&mut self, epoch: u64) {
        self.shapes.truncate(epoch as usize);
        self.folded_at.retain(|_, at| *at <= epoch);
        for ends in self.phases.values_mut() {
            ends.retain(|(at, _)| *at <= epoch);
        }
        self.phases.retain(|_, ends| !ends.is_empty());
        self.holders.truncate(epoch as usize);
        self.bases.truncate(epoch as usize);
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
    /// whose phase ended between the two epochs was at most that phase's
    /// final slot, and every other slot does not go back (reported as "slot
    /// went backwards").
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
            if let Some(last) = self.ended_between(*writer, key, before, after) {
                if slot.p > last.p || slot.n > last.n {
                    found.push((
                        "fold lost adds",
                        format!(
                            "key {key}: slot {} of {writer} was folded by epoch {after} as {}",
                            slot_text(*slot),
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
#[path = "fold_check_tests.rs"]
mod tests;
