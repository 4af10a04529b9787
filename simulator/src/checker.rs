//! The checker: monitors that run after every add, merge, commit and restart,
//! and the exact per-slot check after the final heal.
//!
//! Invariants checked (DESIGN.md numbers):
//! - **no slot goes backwards** as seen by any replica while it runs, and a
//!   restart never loses a completed commit;
//! - **durable only (2)**: whatever a replica holds of another replica's slot
//!   is at most that replica's durable slot (checked on every merge);
//! - **identity (3)**: a wiped node comes back with an id never seen before,
//!   and a restarted node's own slot is at least what any peer holds of it;
//! - **convergence (7)**: after the heal every replica holds the same full
//!   state for every counter;
//! - **exact slots (4, 5, 1)**: for each replica id, `p` and `n` separately
//!   equal the sum of its acknowledged adds plus a subset of its unacknowledged
//!   ones, each at most once (see `ledger.rs` for why the subset decodes
//!   uniquely). For a wiped replica, acknowledged adds count up to some commit
//!   (what it shipped before the wipe), never out of order; the ones past
//!   that commit are counted as lost to the wipe;
//! - **replicated durability**: with `--durability replicated`, when a
//!   replica's disk is lost, the other nodes together hold durably every add
//!   it acknowledged ("acknowledged add lost to a wipe" otherwise), and a copy
//!   answers a push only once the pushed slots are durable there (checked as
//!   it answers, in `world/copies.rs`).
//! - **folds (9)**, with `--retire`: every state a replica holds or commits
//!   is checked against the fold accounting (`fold_check.rs`), and a folded
//!   writer's adds are counted once, through its final slot in the base.

use std::collections::{BTreeMap, BTreeSet};

use tally_node::crdt::{PnCounter, ReplicaId, Slot};

use crate::fold_check::FoldAccounting;
use crate::ledger::Ledger;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    /// Simulated time (ms).
    pub at_ms: u64,
    /// Which invariant.
    pub kind: &'static str,
    /// What exactly.
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Live(usize),
    Dead(usize),
}

/// Totals of the final check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SlotStats {
    /// Replica slots checked (per key and replica).
    pub slots: u64,
    /// Unacknowledged adds that the check found applied.
    pub unacked_applied: u64,
    /// Unacknowledged adds that the check found lost.
    pub unacked_lost: u64,
    /// Adds applied by two incarnations of one node: a retry after a wipe
    /// (the idempotency table went with the disk). Reported, not a violation.
    pub applied_across_wipe: u64,
    /// Acknowledged adds of wiped replicas missing from the final state:
    /// lost with their disk before any peer held them. Allowed in `sync`
    /// mode (counted); in `replicated` mode only after every other disk that
    /// held them was lost too.
    pub acked_lost_to_wipe: u64,
}

/// See the module documentation.
pub struct Checker {
    keys: usize,
    views: Vec<PnCounter>,
    durable: Vec<PnCounter>,
    /// Per (node, key): a purge deleted the counter there, and its own
    /// slot's mark in `durable` is not back in what it stores yet.
    forgotten: Vec<bool>,
    owners: Vec<(ReplicaId, Owner)>,
    dead: Vec<Vec<PnCounter>>,
    node_ids: Vec<ReplicaId>,
    /// Violations, in the order found (at most [`MAX_KEPT`]).
    pub violations: Vec<Violation>,
    /// How many were found in all.
    pub violation_count: u64,
    heal_at: Option<u64>,
    last_change: Vec<u64>,
    /// Replicated durability: every acknowledged add must be held by another
    /// node when its replica's disk is lost.
    replicated: bool,
    /// Per dead incarnation (as `dead`), per key: the most any other node
    /// held durably of its slot at the moment its disk was lost.
    held_at_wipe: Vec<Vec<Slot>>,
    /// The folds committed, and each folded writer's final slots.
    pub folds: FoldAccounting,
}

/// Violations kept in full; the rest are only counted.
pub const MAX_KEPT: usize = 20;

/// The p and n sums of (ticket, negative, magnitude) adds.
fn sums(adds: &[(u64, bool, u64)]) -> (u64, u64) {
    adds.iter()
        .fold((0, 0), |(p, n), (_, negative, magnitude)| {
            if *negative {
                (p, n + magnitude)
            } else {
                (p + magnitude, n)
            }
        })
}

fn slot_text(slot: Slot) -> String {
    format!("(p {}, n {})", slot.p, slot.n)
}

impl Checker {
    /// A checker for `nodes` nodes and `keys` keys.
    pub fn new(nodes: usize, keys: usize) -> Self {
        Checker {
            keys,
            views: vec![PnCounter::new(); nodes * keys],
            durable: vec![PnCounter::new(); nodes * keys],
            forgotten: vec![false; nodes * keys],
            owners: Vec::new(),
            dead: Vec::new(),
            node_ids: vec![ReplicaId(0); nodes],
            violations: Vec::new(),
            violation_count: 0,
            heal_at: None,
            last_change: vec![0; keys],
            replicated: false,
            held_at_wipe: Vec::new(),
            folds: FoldAccounting::new(keys),
        }
    }

    /// Replicated durability is on: a wiped replica's acknowledged adds must
    /// all be durable on some other node at the moment of the wipe
    /// ("acknowledged add lost to a wipe" otherwise).
    pub fn require_replicated(&mut self) {
        self.replicated = true;
    }

    /// What node `node` last committed of `replica`'s slot of key `key`.
    pub fn durable_slot(&self, node: usize, key: usize, replica: ReplicaId) -> Slot {
        self.durable[node * self.keys + key].slot(replica)
    }

    /// Node `node` answers `OK` to a push of `replica`'s `slot` of `key`,
    /// which the pusher's durable state at fold epoch `epoch` held: the
    /// node's last completed commit must hold that slot of that phase, or
    /// a later phase (a fold ended the pushed one and its base counts it).
    pub fn copy_answered(
        &mut self,
        now: u64,
        node: usize,
        key: usize,
        (replica, slot, epoch): (ReplicaId, Slot, u64),
    ) {
        let state = &self.durable[node * self.keys + key];
        let pushed = self.folds.phase(replica, key, epoch);
        let held = self.folds.phase(replica, key, state.folded().epoch);
        let have = match held.cmp(&pushed) {
            std::cmp::Ordering::Greater => return,
            std::cmp::Ordering::Equal => state.slot(replica),
            std::cmp::Ordering::Less => Slot::default(),
        };
        if have.p < slot.p || have.n < slot.n {
            self.violate(
                now,
                "copy answered before durable",
                format!(
                    "n{node} confirmed a push of key {key} with slot {} of {replica} (phase \
                     {pushed}), but its last completed commit holds {} of that phase",
                    slot_text(slot),
                    slot_text(have)
                ),
            );
        }
    }

    /// The fold epoch of what node `node` last committed of key `key`.
    pub fn durable_epoch(&self, node: usize, key: usize) -> u64 {
        self.durable[node * self.keys + key].folded().epoch
    }

    /// Records a violation.
    pub fn violate(&mut self, at_ms: u64, kind: &'static str, detail: String) {
        self.violation_count += 1;
        if self.violations.len() < MAX_KEPT {
            self.violations.push(Violation {
                at_ms,
                kind,
                detail,
            });
        }
    }

    fn owner(&self, replica: ReplicaId) -> Option<Owner> {
        self.owners
            .iter()
            .find(|(id, _)| *id == replica)
            .map(|(_, owner)| *owner)
    }

    /// The node whose current incarnation is `replica`, if any.
    pub fn live_node_of(&self, replica: ReplicaId) -> Option<usize> {
        match self.owner(replica) {
            Some(Owner::Live(node)) => Some(node),
            _ => None,
        }
    }

    /// True when `replica` was the id of a wiped incarnation.
    pub fn is_dead(&self, replica: ReplicaId) -> bool {
        matches!(self.owner(replica), Some(Owner::Dead(_)))
    }

    /// True when the id was ever handed out.
    pub fn known(&self, replica: ReplicaId) -> bool {
        self.owner(replica).is_some()
    }

    /// The final heal happened at `at_ms`; from now on changes are timed.
    pub fn healed(&mut self, at_ms: u64) {
        self.heal_at = Some(at_ms);
    }

    /// Per key: the last time any replica's view of it changed after the heal.
    pub fn key_convergence_ms(&self) -> Vec<u64> {
        let heal = self.heal_at.unwrap_or(0);
        self.last_change
            .iter()
            .map(|at| at.saturating_sub(heal))
            .collect()
    }

    /// Checks that node `node`'s state of `key` may go from `old` to `new`
    /// (`what` says which copy): no slot goes back, and folds are exact.
    fn check_change(
        &mut self,
        now: u64,
        node: usize,
        key: usize,
        old: &PnCounter,
        new: &PnCounter,
        what: &str,
    ) {
        let mut found = Vec::new();
        found.extend(self.folds.check_state(key, new));
        found.extend(self.folds.check_change(key, old, new));
        for (kind, detail) in found {
            self.violate(now, kind, format!("n{node} {what}: {detail}"));
        }
    }

    /// Node `node` holds `state` for key `key` (after an add or a merge).
    pub fn observe(&mut self, now: u64, node: usize, key: usize, state: &PnCounter) {
        let index = node * self.keys + key;
        let old = std::mem::take(&mut self.views[index]);
        self.check_change(now, node, key, &old, state, "in memory");
        let own = self.node_ids[node];
        for (replica, slot) in state.slots() {
            if *replica == own {
                continue;
            }
            let durable = match self.owner(*replica) {
                Some(Owner::Live(owner)) => &self.durable[owner * self.keys + key],
                Some(Owner::Dead(dead)) => &self.dead[dead][key],
                None => {
                    self.violate(
                        now,
                        "unknown replica",
                        format!("n{node} key {key} holds a slot of {replica}, which never existed"),
                    );
                    continue;
                }
            };
            // A slot of another phase than the owner's durable state's is
            // checked against its phase's final slot when that phase ends.
            let epochs = (state.folded().epoch, durable.folded().epoch);
            if !self.folds.same_phase(*replica, key, epochs.0, epochs.1) {
                continue;
            }
            let durable = durable.slot(*replica);
            if slot.p > durable.p || slot.n > durable.n {
                self.violate(
                    now,
                    "non-durable slot shipped",
                    format!(
                        "n{node} key {key} holds {} of replica {replica}, whose durable slot is {}",
                        slot_text(*slot),
                        slot_text(durable)
                    ),
                );
            }
        }
        self.views[index] = state.clone();
        if self.heal_at.is_some() {
            self.last_change[key] = now;
        }
    }

    /// Node `node` completed a commit that wrote `state` for `key`.
    pub fn committed(&mut self, now: u64, node: usize, key: usize, state: &PnCounter) {
        let index = node * self.keys + key;
        let old = std::mem::take(&mut self.durable[index]);
        let own = self.node_ids[node];
        let epochs = (old.folded().epoch, state.folded().epoch);
        if !self.forgotten[index] || !self.folds.same_phase(own, key, epochs.0, epochs.1) {
            self.forgotten[index] = false;
            self.check_change(now, node, key, &old, state, "commit");
            self.durable[index] = state.clone();
            return;
        }
        // The first states after a purge deleted the counter here (a copy
        // pushed to a node that no longer keeps it) are not compared with
        // what it held; its own slot's mark stays until the slot is back
        // (or a fold ended its phase).
        self.check_change(now, node, key, &PnCounter::new(), state, "commit");
        let (mark, slot) = (old.slot(own), state.slot(own));
        if slot.p >= mark.p && slot.n >= mark.n {
            self.forgotten[index] = false;
            self.durable[index] = state.clone();
        } else {
            let slots = state.slots().iter().copied().chain([(own, mark)]);
            self.durable[index] = PnCounter::from_parts(slots, state.folded());
        }
    }

    /// Node `node` started as a new replica (first start or after a wipe).
    pub fn started_fresh(&mut self, now: u64, node: usize, replica: ReplicaId) {
        if self.known(replica) {
            self.violate(
                now,
                "replica id reused",
                format!(
                    "n{node} started on an empty disk with id {replica}, which was used before"
                ),
            );
        }
        self.bury(node);
        self.owners.retain(|(id, _)| *id != replica);
        self.owners.push((replica, Owner::Live(node)));
        self.node_ids[node] = replica;
    }

    /// Node `node` is gone for good with its disk (removed from its
    /// region): its replica is checked as a wiped one is.
    pub fn removed(&mut self, node: usize) {
        self.bury(node);
    }

    /// Marks the current incarnation of `node` as gone with its disk.
    fn bury(&mut self, node: usize) {
        let old = self.node_ids[node];
        if let Some(entry) = self.owners.iter_mut().find(|(id, _)| *id == old) {
            let range = node * self.keys..(node + 1) * self.keys;
            let writers = self.node_ids.len();
            // What a state holds of the writer's adds: the phases its base
            // counts, and its slot of the phase it holds.
            let held = (0..self.keys)
                .map(|key| {
                    (0..writers)
                        .filter(|other| *other != node)
                        .map(|other| {
                            let state = &self.durable[other * self.keys + key];
                            let counted = self.folds.counted(old, key, state.folded().epoch);
                            let slot = state.slot(old);
                            Slot {
                                p: counted.p + slot.p,
                                n: counted.n + slot.n,
                            }
                        })
                        .fold(Slot::default(), |most, slot| Slot {
                            p: most.p.max(slot.p),
                            n: most.n.max(slot.n),
                        })
                })
                .collect();
            self.held_at_wipe.push(held);
            self.dead.push(self.durable[range.clone()].to_vec());
            entry.1 = Owner::Dead(self.dead.len() - 1);
            for state in &mut self.durable[range.clone()] {
                *state = PnCounter::new();
            }
            self.forgotten[range.clone()].fill(false);
            for state in &mut self.views[range] {
                *state = PnCounter::new();
            }
        }
    }

    /// One more writer, `replica` (a world whose nodes run several replicas,
    /// one per partition, registers each as a writer of its own); returns
    /// its index, which stands for a node in the other methods.
    pub fn add_writer(&mut self, now: u64, replica: ReplicaId) -> usize {
        let writer = self.node_ids.len();
        self.node_ids.push(ReplicaId(0));
        let grown = self.views.len() + self.keys;
        self.views.resize(grown, PnCounter::new());
        self.durable.resize(grown, PnCounter::new());
        self.forgotten.resize(grown, false);
        self.started_fresh(now, writer, replica);
        writer
    }

    /// Writer `writer` lost its disk for good: its acknowledged adds that no
    /// other replica holds may be missing from the final state.
    pub fn writer_lost(&mut self, writer: usize) {
        self.bury(writer);
    }

    /// Node `node` no longer holds `key` whole (a purge deleted it, or
    /// trimmed it to the node's own slot): what it held is not compared
    /// with what it holds next, but its own slot's durable high mark stays
    /// (the others may hold it, and never more).
    pub fn forget(&mut self, node: usize, key: usize) {
        let index = node * self.keys + key;
        let own = self.node_ids[node];
        let slot = self.durable[index].slot(own);
        self.durable[index] = PnCounter::from_slots(
            [(own, slot)]
                .into_iter()
                .filter(|_| slot != Slot::default()),
        );
        self.views[index] = PnCounter::new();
        self.forgotten[index] = true;
    }

    /// Node `node`, forgotten `key` (see [`Self::forget`]), holds `stored`
    /// of it on disk: a later copy or pull that merges nothing new is
    /// durable there as far as `stored` goes. Its own slot's mark stays.
    pub fn stored_unchecked(&mut self, node: usize, key: usize, stored: &PnCounter) {
        let index = node * self.keys + key;
        let own = self.node_ids[node];
        let mark = self.durable[index].slot(own);
        let slot = stored.slot(own);
        let top = Slot {
            p: mark.p.max(slot.p),
            n: mark.n.max(slot.n),
        };
        let slots = stored.slots().iter().copied().filter(|(r, _)| *r != own);
        let own_slot = [(own, top)]
            .into_iter()
            .filter(|(_, s)| *s != Slot::default());
        self.durable[index] = PnCounter::from_parts(slots.chain(own_slot), stored.folded());
    }

    /// Node `node` trims `key` to its own slot (a purge of a partition it no
    /// longer keeps): what it held of the others is not compared with what
    /// it holds next, but its own slot and the state's fold epoch and base
    /// stay, and the trimmed state must keep them (the epoch names the
    /// slot's phase).
    pub fn trimmed(&mut self, node: usize, key: usize) {
        let index = node * self.keys + key;
        let own = self.node_ids[node];
        let held = &self.durable[index];
        let slot = held.slot(own);
        let slots = [(own, slot)]
            .into_iter()
            .filter(|_| slot != Slot::default());
        self.durable[index] = PnCounter::from_parts(slots, held.folded());
        self.views[index] = PnCounter::new();
    }

    /// Node `node` restarted on its kept disk; `loaded(key)` reads its store.
    pub fn restarted(
        &mut self,
        now: u64,
        node: usize,
        replica: ReplicaId,
        mut loaded: impl FnMut(usize) -> PnCounter,
    ) {
        self.restarted_holding(now, node, replica, |key| Some(loaded(key)));
    }

    /// [`Self::restarted`] for a node that holds only some keys whole:
    /// `loaded(key)` is `None` for the others (their stored state, a purged
    /// or trimmed one, is not checked, and is forgotten).
    pub fn restarted_holding(
        &mut self,
        now: u64,
        node: usize,
        replica: ReplicaId,
        mut loaded: impl FnMut(usize) -> Option<PnCounter>,
    ) {
        if replica != self.node_ids[node] {
            self.violate(
                now,
                "replica id changed",
                format!(
                    "n{node} restarted on its disk as {replica}, not {}",
                    self.node_ids[node]
                ),
            );
        }
        let nodes = self.node_ids.len();
        for key in 0..self.keys {
            let index = node * self.keys + key;
            let Some(state) = loaded(key) else {
                self.forget(node, key);
                continue;
            };
            // A forgotten counter's own slot mark is not on its disk yet.
            let durable = &self.durable[index];
            let committed = match self.forgotten[index] {
                true => PnCounter::from_parts(
                    durable
                        .slots()
                        .iter()
                        .copied()
                        .filter(|(r, _)| *r != replica),
                    durable.folded(),
                ),
                false => durable.clone(),
            };
            if !committed.is_covered_by(&state) {
                self.violate(
                    now,
                    "restart lost a commit",
                    format!("n{node} key {key}: the disk holds less than its last commit"),
                );
            }
            let own = state.slot(replica);
            for other in (0..nodes).filter(|other| *other != node) {
                let view = &self.views[other * self.keys + key];
                let epochs = (view.folded().epoch, state.folded().epoch);
                let theirs = view.slot(replica);
                let comparable = self.folds.same_phase(replica, key, epochs.0, epochs.1);
                if comparable && (theirs.p > own.p || theirs.n > own.n) {
                    self.violate(
                        now,
                        "own slot below a peer's copy",
                        format!(
                            "n{node} key {key} restarted with its own slot at {} but n{other} holds {}",
                            slot_text(own),
                            slot_text(theirs)
                        ),
                    );
                }
            }
            self.views[index] = state;
        }
    }

    /// The exact per-slot check over the final states (`finals[key]`, all
    /// replicas already found equal) against what the callers know.
    pub fn check_slots(&mut self, now: u64, ledger: &Ledger, finals: &[PnCounter]) -> SlotStats {
        #[derive(Default)]
        struct Group {
            certain: Vec<(u64, bool, u64)>,
            unknown_p: u64,
            unknown_n: u64,
            adds: Vec<u32>,
        }
        let mut groups: BTreeMap<(usize, ReplicaId), Group> = BTreeMap::new();
        for (id, add) in ledger.adds.iter().enumerate() {
            for replica in &add.delivered {
                let group = groups.entry((add.key as usize, *replica)).or_default();
                group.adds.push(id as u32);
                match add.certain_at(*replica) {
                    Some(ticket) => group.certain.push((ticket, add.negative, add.magnitude())),
                    None if add.negative => group.unknown_n |= add.magnitude(),
                    None => group.unknown_p |= add.magnitude(),
                }
            }
        }
        // A writer's adds in a counter: what the base counts of its ended
        // phases, and its slot in the final state.
        let final_slot = |folds: &FoldAccounting, key: usize, replica: ReplicaId| {
            let state = &finals[key];
            let counted = folds.counted(replica, key, state.folded().epoch);
            let slot = state.slot(replica);
            Slot {
                p: counted.p + slot.p,
                n: counted.n + slot.n,
            }
        };
        let mut fold_found = Vec::new();
        for (key, state) in finals.iter().enumerate() {
            fold_found.extend(self.folds.check_state(key, state));
        }
        for (kind, detail) in fold_found {
            self.violate(now, kind, format!("final state: {detail}"));
        }
        for (key, state) in finals.iter().enumerate() {
            let slots = state.slots().iter().copied();
            let counted = self.folds.counted_writers(key, state.folded().epoch);
            for (replica, slot) in slots.chain(counted) {
                if !groups.contains_key(&(key, replica)) && slot != Slot::default() {
                    self.violate(
                        now,
                        "slot without adds",
                        format!(
                            "key {key}: replica {replica} has slot {} but no add ever reached it",
                            slot_text(slot)
                        ),
                    );
                }
            }
        }
        let mut stats = SlotStats::default();
        let mut applied_at: BTreeMap<u32, u32> = BTreeMap::new();
        for ((key, replica), mut group) in groups {
            stats.slots += 1;
            let slot = final_slot(&self.folds, key, replica);
            group.certain.sort_unstable();
            // Cuts: how many of the acknowledged adds (by commit) count. A
            // replica that is still alive must count them all (a folded one
            // was retired: it counts what it shipped, as a wiped one).
            let mut cuts = vec![group.certain.len()];
            if self.is_dead(replica) || self.folds.is_folded(replica) {
                cuts = (0..=group.certain.len())
                    .rev()
                    .filter(|i| {
                        *i == 0
                            || *i == group.certain.len()
                            || group.certain[*i].0 != group.certain[*i - 1].0
                    })
                    .collect();
            }
            let fits = |cut: usize, slot: Slot| -> Option<(u64, u64)> {
                let (mut p, mut n) = (0u64, 0u64);
                for (_, negative, magnitude) in &group.certain[..cut] {
                    if *negative {
                        n += magnitude;
                    } else {
                        p += magnitude;
                    }
                }
                let rest_p = slot.p.checked_sub(p)?;
                let rest_n = slot.n.checked_sub(n)?;
                (rest_p & !group.unknown_p == 0 && rest_n & !group.unknown_n == 0)
                    .then_some((rest_p, rest_n))
            };
            if let (true, Some(Owner::Dead(dead))) = (self.replicated, self.owner(replica)) {
                // Held by another node when the disk was lost, or reaching
                // one later from a message in flight (a push a copy took
                // after the wipe, answering a retry from its record).
                let held = self.held_at_wipe[dead][key];
                let all = group.certain.len();
                if fits(all, held).is_none() && fits(all, slot).is_none() {
                    let (p, n) = sums(&group.certain);
                    self.violate(
                        now,
                        "acknowledged add lost to a wipe",
                        format!(
                            "key {key}, replica {replica} (wiped): its acknowledged adds sum to \
                             (p {p}, n {n}), but when its disk was lost the other nodes held \
                             only {} of its slot (replicated durability)",
                            slot_text(held)
                        ),
                    );
                }
            }
            let found = cuts
                .iter()
                .find_map(|cut| fits(*cut, slot).map(|rest| (*cut, rest)));
            match found {
                Some((cut, (rest_p, rest_n))) => {
                    stats.acked_lost_to_wipe += (group.certain.len() - cut) as u64;
                    let applied = rest_p.count_ones() + rest_n.count_ones();
                    let unknown = group.unknown_p.count_ones() + group.unknown_n.count_ones();
                    stats.unacked_applied += u64::from(applied);
                    stats.unacked_lost += u64::from(unknown - applied);
                    for id in &group.adds {
                        let add = &ledger.adds[*id as usize];
                        let rest = if add.negative { rest_n } else { rest_p };
                        if add.certain_at(replica).is_some() || rest & add.magnitude() != 0 {
                            *applied_at.entry(*id).or_default() += 1;
                        }
                    }
                }
                None => {
                    let (p, n) = sums(&group.certain);
                    let state = if self.folds.folded_by(replica, finals[key].folded().epoch) {
                        "folded"
                    } else if self.is_dead(replica) {
                        "wiped"
                    } else {
                        "live"
                    };
                    self.violate(
                        now,
                        "slot does not match the adds",
                        format!(
                            "key {key}, {state} replica {replica}: final slot {} but acknowledged adds \
                             sum to (p {p}, n {n}) and the unacknowledged ones it may hold are \
                             p lanes {:#x}, n lanes {:#x}",
                            slot_text(slot),
                            group.unknown_p,
                            group.unknown_n
                        ),
                    );
                }
            }
        }
        stats.applied_across_wipe = applied_at.values().filter(|count| **count > 1).count() as u64;
        stats
    }

    /// Replicas ever created.
    pub fn replica_count(&self) -> usize {
        self.owners.len()
    }

    /// Ids of dead incarnations.
    pub fn dead_ids(&self) -> BTreeSet<ReplicaId> {
        self.owners
            .iter()
            .filter(|(_, owner)| matches!(owner, Owner::Dead(_)))
            .map(|(id, _)| *id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ReplicaId = ReplicaId(0xa);
    const B: ReplicaId = ReplicaId(0xb);
    const C: ReplicaId = ReplicaId(0xc);

    /// n0 (replica A) acknowledges one add of 1 on key 0; n1 (B) holds
    /// `copy` of A's slot durably when n0's disk is lost (n0 comes back as C).
    fn wiped_with_copy(replicated: bool, copy: u64) -> (Checker, SlotStats) {
        let mut checker = Checker::new(2, 1);
        if replicated {
            checker.require_replicated();
        }
        checker.started_fresh(0, 0, A);
        checker.started_fresh(0, 1, B);
        let mut ledger = Ledger::new(2, 1);
        let add = ledger.issue(0, 0, 0, false, true).unwrap();
        ledger.delivered(add, A);
        ledger.answered(add, A, 1, false);
        let slot = |p| PnCounter::from_slots([(A, Slot { p, n: 0 })]);
        checker.committed(1, 0, 0, &slot(1));
        checker.committed(1, 1, 0, &slot(copy));
        checker.started_fresh(2, 0, C);
        let stats = checker.check_slots(3, &ledger, &[slot(copy)]);
        (checker, stats)
    }

    #[test]
    fn a_wipe_may_lose_an_acknowledged_add_only_in_sync_mode() {
        let (checker, stats) = wiped_with_copy(false, 0);
        assert_eq!(checker.violation_count, 0, "{:?}", checker.violations);
        assert_eq!(stats.acked_lost_to_wipe, 1);

        let (checker, _) = wiped_with_copy(true, 0);
        assert_eq!(
            checker.violations.first().map(|v| v.kind),
            Some("acknowledged add lost to a wipe"),
            "{:?}",
            checker.violations
        );

        let (checker, stats) = wiped_with_copy(true, 1);
        assert_eq!(checker.violation_count, 0, "{:?}", checker.violations);
        assert_eq!(stats.acked_lost_to_wipe, 0);
    }
}
