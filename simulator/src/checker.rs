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
//!   (what it shipped before the wipe), never out of order.

use std::collections::{BTreeMap, BTreeSet};

use tally_node::crdt::{PnCounter, ReplicaId, Slot};

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
}

/// See the module documentation.
pub struct Checker {
    keys: usize,
    views: Vec<PnCounter>,
    durable: Vec<PnCounter>,
    owners: Vec<(ReplicaId, Owner)>,
    dead: Vec<Vec<PnCounter>>,
    node_ids: Vec<ReplicaId>,
    /// Violations, in the order found (at most [`MAX_KEPT`]).
    pub violations: Vec<Violation>,
    /// How many were found in all.
    pub violation_count: u64,
    heal_at: Option<u64>,
    last_change: Vec<u64>,
}

/// Violations kept in full; the rest are only counted.
pub const MAX_KEPT: usize = 20;

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
            owners: Vec::new(),
            dead: Vec::new(),
            node_ids: vec![ReplicaId(0); nodes],
            violations: Vec::new(),
            violation_count: 0,
            heal_at: None,
            last_change: vec![0; keys],
        }
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

    /// Node `node` holds `state` for key `key` (after an add or a merge).
    pub fn observe(&mut self, now: u64, node: usize, key: usize, state: &PnCounter) {
        let index = node * self.keys + key;
        if !self.views[index].is_covered_by(state) {
            let detail = self.views[index]
                .slots()
                .iter()
                .find(|(id, slot)| {
                    let new = state.slot(*id);
                    new.p < slot.p || new.n < slot.n
                })
                .map(|(id, slot)| {
                    format!(
                        "n{node} key {key}: slot of {id} went from {} to {}",
                        slot_text(*slot),
                        slot_text(state.slot(*id))
                    )
                })
                .unwrap_or_default();
            self.violate(now, "slot went backwards", detail);
        }
        let own = self.node_ids[node];
        for (replica, slot) in state.slots() {
            if *replica == own {
                continue;
            }
            let durable = match self.owner(*replica) {
                Some(Owner::Live(owner)) => self.durable[owner * self.keys + key].slot(*replica),
                Some(Owner::Dead(dead)) => self.dead[dead][key].slot(*replica),
                None => {
                    self.violate(
                        now,
                        "unknown replica",
                        format!("n{node} key {key} holds a slot of {replica}, which never existed"),
                    );
                    continue;
                }
            };
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
        if !self.durable[index].is_covered_by(state) {
            self.violate(
                now,
                "slot went backwards",
                format!("n{node} key {key}: a commit wrote less than the previous one"),
            );
        }
        self.durable[index] = state.clone();
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

    /// Marks the current incarnation of `node` as gone with its disk.
    fn bury(&mut self, node: usize) {
        let old = self.node_ids[node];
        if let Some(entry) = self.owners.iter_mut().find(|(id, _)| *id == old) {
            let range = node * self.keys..(node + 1) * self.keys;
            self.dead.push(self.durable[range.clone()].to_vec());
            entry.1 = Owner::Dead(self.dead.len() - 1);
            for state in &mut self.durable[range.clone()] {
                *state = PnCounter::new();
            }
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
        self.started_fresh(now, writer, replica);
        writer
    }

    /// Writer `writer` lost its disk for good: its acknowledged adds that no
    /// other replica holds may be missing from the final state.
    pub fn writer_lost(&mut self, writer: usize) {
        self.bury(writer);
    }

    /// Node `node` restarted on its kept disk; `loaded(key)` reads its store.
    pub fn restarted(
        &mut self,
        now: u64,
        node: usize,
        replica: ReplicaId,
        mut loaded: impl FnMut(usize) -> PnCounter,
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
            let state = loaded(key);
            if !self.durable[index].is_covered_by(&state) {
                self.violate(
                    now,
                    "restart lost a commit",
                    format!("n{node} key {key}: the disk holds less than its last commit"),
                );
            }
            let own = state.slot(replica);
            for other in (0..nodes).filter(|other| *other != node) {
                let theirs = self.views[other * self.keys + key].slot(replica);
                if theirs.p > own.p || theirs.n > own.n {
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
        for (key, state) in finals.iter().enumerate() {
            for (replica, slot) in state.slots() {
                if !groups.contains_key(&(key, *replica)) && *slot != Slot::default() {
                    self.violate(
                        now,
                        "slot without adds",
                        format!(
                            "key {key}: replica {replica} has slot {} but no add ever reached it",
                            slot_text(*slot)
                        ),
                    );
                }
            }
        }
        let mut stats = SlotStats::default();
        let mut applied_at: BTreeMap<u32, u32> = BTreeMap::new();
        for ((key, replica), mut group) in groups {
            stats.slots += 1;
            let slot = finals[key].slot(replica);
            group.certain.sort_unstable();
            // Cuts: how many of the acknowledged adds (by commit) count. A
            // replica that is still alive must count them all.
            let mut cuts = vec![group.certain.len()];
            if self.is_dead(replica) {
                cuts = (0..=group.certain.len())
                    .rev()
                    .filter(|i| {
                        *i == 0
                            || *i == group.certain.len()
                            || group.certain[*i].0 != group.certain[*i - 1].0
                    })
                    .collect();
            }
            let fits = |cut: usize| -> Option<(u64, u64)> {
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
            match cuts.iter().find_map(|cut| fits(*cut)) {
                Some((rest_p, rest_n)) => {
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
                    let (p, n) = group.certain.iter().fold((0u64, 0u64), |(p, n), c| {
                        if c.1 {
                            (p, n + c.2)
                        } else {
                            (p + c.2, n)
                        }
                    });
                    let state = if self.is_dead(replica) {
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
