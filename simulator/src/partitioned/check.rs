//! The end of a partitioned run: when the cluster has settled after the
//! heal, and the final checks.
//!
//! Settled means: no add awaits an answer, no node is joining or draining,
//! every change is durable and every merged pull reported, every partition
//! is kept in each region by exactly its RF owners (per the true
//! membership) and by no one else, each of them ready, every holder of a
//! partition in every region stores the same state of each of its keys,
//! and every other node stores at most its own slot of them (what the
//! purge trim leaves until the slot is retired). The final check then
//! takes each key's state from one holder and runs the simulator's exact
//! per-slot accounting against what the callers know.

use std::collections::BTreeSet;

use tally_node::crdt::PnCounter;
use tally_node::partition::NodeState;

use super::sync::stored;
use super::world::PWorld;
use crate::checker::SlotStats;

impl PWorld<'_> {
    /// Why the cluster has not settled yet, or `None` once it has.
    pub(super) fn unsettled(&self) -> Option<String> {
        if self.ledger.any_pending() {
            return Some("an add still awaits its answer".into());
        }
        let live = || {
            self.nodes
                .iter()
                .filter(|node| node.exists && !node.removed)
        };
        for node in live() {
            if matches!(node.state(), NodeState::Joining | NodeState::Draining) {
                return Some(format!("{} is still {}", node.name, node.state()));
            }
            if !node.up {
                return Some(format!("{} is down", node.name));
            }
            if !node.all_durable() || !node.pulled.is_empty() {
                return Some(format!("{} has changes not yet durable", node.name));
            }
        }
        let truth = self.truth();
        for region in truth.regions() {
            for partition in self.count.iter() {
                let owners: BTreeSet<&str> = truth.owners(region, partition).into_iter().collect();
                let keepers: BTreeSet<&str> = live()
                    .filter(|node| node.region == region && node.keeps(partition))
                    .map(|node| node.name.as_str())
                    .collect();
                if owners.len() != truth.effective_replication(region) || keepers != owners {
                    return Some(format!(
                        "partition {partition} in {region} is kept by {keepers:?}, \
                         its owners are {owners:?}"
                    ));
                }
                for node in live().filter(|node| owners.contains(node.name.as_str())) {
                    if !node.ready(partition) {
                        return Some(format!(
                            "{} is not ready for partition {partition}",
                            node.name
                        ));
                    }
                }
            }
        }
        for (key, name) in self.key_names.iter().enumerate() {
            let partition = self.key_partition[key];
            let mut held: Vec<PnCounter> = Vec::new();
            for node in live() {
                let state = stored(node, name);
                if node.keeps(partition) {
                    if !held.contains(&state) {
                        held.push(state);
                    }
                } else if state
                    .slots()
                    .iter()
                    .any(|(replica, _)| *replica != node.id())
                {
                    return Some(format!(
                        "{} still stores others' slots of {name} (partition {partition})",
                        node.name
                    ));
                }
            }
            if held.len() > 1 {
                return Some(format!(
                    "the holders of {name} (partition {partition}) differ ({} states)",
                    held.len()
                ));
            }
        }
        None
    }

    /// The exact per-slot check over each key's final state, read from its
    /// first holder (all holders equal once settled).
    pub(super) fn final_check(&mut self) -> SlotStats {
        let mut finals = Vec::with_capacity(self.key_names.len());
        for (key, name) in self.key_names.iter().enumerate() {
            let partition = self.key_partition[key];
            let holder = self
                .nodes
                .iter()
                .find(|node| node.exists && !node.removed && node.up && node.keeps(partition));
            finals.push(holder.map_or_else(PnCounter::new, |node| stored(node, name)));
        }
        self.checker.check_slots(self.now, &self.ledger, &finals)
    }
}
