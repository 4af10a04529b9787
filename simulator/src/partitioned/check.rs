//! The end of a partitioned run: when the cluster has settled after the
//! heal, and the final checks.
//!
//! Settled means: no add awaits an answer, no node is joining or draining,
//! every change is durable, every partition is kept in each region by
//! exactly its RF owners (per the true membership) and by no one else, each
//! of them ready, and every holder of a partition in every region holds the
//! same state (replica digests). The final check then takes each key's state
//! from one holder and runs the simulator's exact per-slot accounting
//! against what the callers know.

use std::collections::BTreeSet;

use tally_node::crdt::PnCounter;
use tally_node::partition::{Holding, NodeState};

use super::node::PartNode;
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
            if matches!(node.state, NodeState::Joining | NodeState::Draining) {
                return Some(format!("{} is still {}", node.name, node.state));
            }
            if !node.up {
                return Some(format!("{} is down", node.name));
            }
            if node.durable_seq() < node.seq {
                return Some(format!("{} has changes not yet durable", node.name));
            }
        }
        let truth = self.truth();
        for region in truth.regions() {
            for partition in self.count.iter() {
                let owners: BTreeSet<&str> = truth.owners(region, partition).into_iter().collect();
                let keepers: BTreeSet<&str> = live()
                    .filter(|node| node.region == region && node.holdings.keeps(partition))
                    .map(|node| node.name.as_str())
                    .collect();
                if owners.len() != truth.effective_replication(region) || keepers != owners {
                    return Some(format!(
                        "partition {partition} in {region} is kept by {keepers:?}, \
                         its owners are {owners:?}"
                    ));
                }
                for node in live().filter(|node| owners.contains(node.name.as_str())) {
                    if node.holdings.state(partition) != Some(&Holding::Ready) {
                        return Some(format!(
                            "{} is not ready for partition {partition}",
                            node.name
                        ));
                    }
                }
            }
        }
        for partition in self.count.iter() {
            let digests: BTreeSet<u64> = live()
                .filter_map(|node| node.parts.get(&partition))
                .map(|part| part.replica.digest().0)
                .collect();
            if digests.len() > 1 {
                return Some(format!(
                    "the holders of partition {partition} differ ({} states)",
                    digests.len()
                ));
            }
        }
        None
    }

    /// The exact per-slot check over each key's final state, read from its
    /// first holder (all holders equal once settled).
    pub(super) fn final_check(&mut self) -> SlotStats {
        let now = PartNode::local_now(self.now);
        let mut finals = Vec::with_capacity(self.key_names.len());
        for key in 0..self.key_names.len() {
            let partition = self.key_partition[key];
            let holder = self
                .nodes
                .iter_mut()
                .filter(|node| node.exists && !node.removed && node.up)
                .find_map(|node| node.parts.get_mut(&partition));
            let state = match holder {
                Some(part) => part
                    .replica
                    .handle_get(now, &part.store, &self.key_names[key])
                    .unwrap_or_default(),
                None => PnCounter::new(),
            };
            finals.push(state);
        }
        self.checker.check_slots(self.now, &self.ledger, &finals)
    }
}
