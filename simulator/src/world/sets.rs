//! Like sets and uniques in the simulation (`--sets`): while the clients
//! run, the shared workload (`set_ledger.rs`) applies a like, unlike or
//! observe at a random live node through its core every few milliseconds.
//! Every node holds every key, so once the cluster has converged after the
//! heal every node must hold the same like sets and registers, and the
//! ledger's exact rules are checked on them.

use super::{Event, World};
use crate::rng::between;
use crate::set_ledger::{check_held, read_sets, SetLedger, SetsHeld, LIKE_KEYS};

/// The set workload's state.
pub(super) type SetWorkload = SetLedger;

impl World<'_> {
    /// Applies one set operation at a random live node, then schedules the next.
    pub(super) fn set_op(&mut self) {
        if self.clients_stopped {
            return;
        }
        let Some(sets) = self.sets.as_mut() else {
            return;
        };
        let next = between(&mut sets.rng, 1, 8);
        let live: Vec<usize> = (0..self.nodes.len())
            .filter(|n| self.nodes[*n].up && !self.nodes[*n].paused)
            .collect();
        if !live.is_empty() {
            let node = live[between(&mut sets.rng, 0, live.len() as u64 - 1) as usize];
            let op = sets.draw();
            let state = &mut self.nodes[node];
            let now = state.local_now(self.now);
            let ticket = sets
                .apply(node, now, &state.store, &mut state.replica, &op)
                .expect("every node serves every key");
            self.trace.mix_all(&[node as u64, ticket]);
            self.wake_commit(node);
        }
        self.schedule(next, Event::SetOp);
    }

    /// A node's commits are durable up to `durable`.
    pub(super) fn sets_durable(&mut self, node: usize, durable: u64) {
        if let Some(sets) = self.sets.as_mut() {
            sets.durable(node, durable);
        }
    }

    /// A node crashed: what it had not made durable is lost; a wipe loses
    /// the incarnation's durable state too, unless a peer had pulled it.
    pub(super) fn sets_crashed(&mut self, node: usize, wipe: bool) {
        let replica = self.nodes[node].id();
        if let Some(sets) = self.sets.as_mut() {
            sets.crashed(node, replica, wipe);
        }
    }

    /// Every node's like sets, derived counts and uniques registers.
    fn read_sets(&mut self) -> Vec<SetsHeld> {
        let now = self.now;
        self.nodes
            .iter_mut()
            .map(|state| {
                let now = state.local_now(now);
                read_sets(now, &state.store, &mut state.replica)
            })
            .collect()
    }

    /// True when every node holds the same like sets and registers (or
    /// there is no set workload).
    pub(super) fn sets_converged(&mut self) -> bool {
        if self.sets.is_none() {
            return true;
        }
        let held = self.read_sets();
        held.iter().all(|sets| same(sets, &held[0]))
    }

    /// The ledger's rules (see `set_ledger.rs`), on the converged cluster.
    pub(super) fn check_sets(&mut self) {
        let Some(sets) = self.sets.take() else {
            return;
        };
        let finals = self.read_sets();
        let mut found = Vec::new();
        for (node, held) in finals.iter().enumerate() {
            found.extend(check_held(
                node,
                held,
                self.nodes[node].replica.sets_digest(),
            ));
            if !same(held, &finals[0]) {
                found.push((
                    "like sets differ",
                    format!("n{node} and n0 hold different like sets or uniques registers"),
                ));
            }
        }
        let keys: Vec<usize> = (0..LIKE_KEYS).collect();
        found.extend(sets.check_exact(&finals[0], &keys, true));
        for (kind, detail) in found {
            self.checker.violate(self.now, kind, detail);
        }
    }
}

/// Whether two nodes hold the same members and registers.
fn same(a: &SetsHeld, b: &SetsHeld) -> bool {
    (&a.members, &a.registers) == (&b.members, &b.registers)
}
