//! Like sets and uniques in partitioned regions: while the clients run, the
//! shared workload (`set_ledger.rs`) sends a like, unlike or observe every
//! few milliseconds to a node of a random region, which routes it by its
//! own view to the key's first live owner; the owner applies it through
//! its core (a replica that does not serve the key refuses it, and nothing
//! is applied or recorded).
//!
//! Settled needs every holder of a set key to hold the same members or
//! registers, and every other node to hold none of them (the purge deletes
//! what a node no longer keeps); the final check then applies the ledger's
//! rules: every node's counts and digest, and the exact lengths and
//! registers as one holder of each key holds them.

use super::world::{local_now, slot_of, Ev, PWorld};
use crate::rng::between;
use crate::set_ledger::{
    check_held, like_key, read_sets, SetViolation, SetsHeld, LIKE_KEYS, UNIQUES_KEY,
};

impl PWorld<'_> {
    /// Applies one set operation at the owner an entry node routes it to,
    /// then schedules the next.
    pub(super) fn set_op(&mut self) {
        if self.clients_stopped {
            return;
        }
        let next = between(&mut self.sets.rng, 1, 8);
        let entries: Vec<usize> = (0..self.nodes.len())
            .filter(|n| self.nodes[*n].running() && !self.nodes[*n].removed)
            .collect();
        self.schedule(next, Ev::SetOp);
        if entries.is_empty() {
            return;
        }
        let entry = entries[between(&mut self.sets.rng, 0, entries.len() as u64 - 1) as usize];
        let op = self.sets.draw();
        let partition = self.count.of_key(op.key().as_bytes());
        let state = &self.nodes[entry];
        let owner = state.view.as_ref().and_then(|view| {
            let route = view.route(&state.region, partition);
            route.first().map(|name| slot_of(name))
        });
        let Some(owner) = owner.filter(|owner| self.nodes[*owner].running()) else {
            return;
        };
        let now = self.clock(owner);
        let scoped = self.nodes[owner].scoped_mut();
        let applied = self
            .sets
            .apply(owner, now, &scoped.store, &mut scoped.core, &op);
        match applied {
            Some(ticket) => {
                self.stats.set_ops += 1;
                self.trace.mix_all(&[owner as u64, ticket]);
                self.wake_commit(owner);
            }
            None => self.stats.set_refused += 1,
        }
    }

    /// What every live node holds of the set keys (`None` for the others).
    fn read_all_sets(&mut self) -> Vec<Option<SetsHeld>> {
        let now = local_now(self.now);
        self.nodes
            .iter_mut()
            .map(|node| {
                let live = node.exists && node.up && !node.removed;
                let scoped = node.node.as_mut().filter(|_| live)?;
                Some(read_sets(now, &scoped.store, &mut scoped.core))
            })
            .collect()
    }

    /// Why the set keys have not settled yet: a holder differs from
    /// another, or a node that does not keep a key still holds some of it.
    pub(super) fn sets_unsettled(&mut self) -> Option<String> {
        let held = self.read_all_sets();
        for key in 0..=LIKE_KEYS {
            let name = match key < LIKE_KEYS {
                true => like_key(key),
                false => UNIQUES_KEY.to_string(),
            };
            let partition = self.count.of_key(name.as_bytes());
            let mut reference: Option<&SetsHeld> = None;
            for (node, sets) in held.iter().enumerate() {
                let Some(sets) = sets else { continue };
                if !self.nodes[node].keeps(partition) {
                    if !same_key(sets, &SetsHeld::empty_like(sets), key) {
                        return Some(format!(
                            "n{node} still holds some of {name} (partition {partition})"
                        ));
                    }
                    continue;
                }
                match reference {
                    None => reference = Some(sets),
                    Some(reference) if !same_key(sets, reference, key) => {
                        return Some(format!(
                            "the holders of {name} (partition {partition}) differ"
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        None
    }

    /// The ledger's rules (see `set_ledger.rs`) on the settled cluster.
    pub(super) fn check_sets(&mut self) {
        let held = self.read_all_sets();
        let mut found: Vec<SetViolation> = Vec::new();
        for (node, sets) in held.iter().enumerate() {
            if let Some(sets) = sets {
                let digest = self.nodes[node].scoped().core.sets_digest();
                found.extend(check_held(node, sets, digest));
            }
        }
        for key in 0..=LIKE_KEYS {
            let name = match key < LIKE_KEYS {
                true => like_key(key),
                false => UNIQUES_KEY.to_string(),
            };
            let partition = self.count.of_key(name.as_bytes());
            let holder = held.iter().enumerate().find_map(|(node, sets)| {
                sets.as_ref().filter(|_| self.nodes[node].keeps(partition))
            });
            let Some(sets) = holder else { continue };
            found.extend(match key < LIKE_KEYS {
                true => self.sets.check_exact(sets, &[key], false),
                false => self.sets.check_exact(sets, &[], true),
            });
        }
        for (kind, detail) in found {
            self.checker.violate(self.now, kind, detail);
        }
    }
}

/// Whether `a` and `b` hold the same of set key `key` (a like set's
/// members, or, for `key == LIKE_KEYS`, the uniques registers).
fn same_key(a: &SetsHeld, b: &SetsHeld, key: usize) -> bool {
    match key < LIKE_KEYS {
        true => a.members[key] == b.members[key],
        false => a.registers == b.registers,
    }
}
