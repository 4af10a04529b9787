//! A node's view of its cluster's membership, and what follows from it: a
//! partition's owners in each region, where to route a key, which
//! partitions are under-replicated, and whether an operator's drain or
//! removal may go ahead. Pure: the runtime builds a [`ClusterView`] from
//! gossip, with the time as an input.
//!
//! Invariants kept here:
//! - the owners of a partition in a region are the `RF` nodes with the
//!   highest [`rendezvous_weight`] among the region's *eligible* nodes
//!   (joining or active, and not down for `dead_after` or longer), so a join
//!   or a leave moves only the partitions whose top weights it changes;
//! - ownership follows lifecycle changes and a node down for `dead_after`,
//!   never a missed heartbeat: a node that is down for less keeps its
//!   partitions (adds fail over to the next live owner meanwhile);
//! - a route names only nodes that hold the partition up to date.

use std::collections::BTreeMap;

use super::hash::{rendezvous_weight, Partition, PartitionCount};
use super::set::PartitionSet;

/// A node's lifecycle state, published by the node in gossip.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum NodeState {
    /// New: it owns partitions and is copying them in; it serves none of
    /// them until each is caught up.
    Joining,
    /// It owns and serves its partitions.
    Active,
    /// Handing its partitions away: it owns none, and serves those it still
    /// holds until every new owner has caught up.
    Draining,
    /// Gone: drained, or removed by an operator. It owns nothing.
    Left,
}

impl NodeState {
    /// The state's name in gossip, in `tally status` and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Joining => "joining",
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Left => "left",
        }
    }

    /// Parses [`NodeState::as_str`]'s names.
    pub fn parse(text: &str) -> Option<NodeState> {
        [
            NodeState::Joining,
            NodeState::Active,
            NodeState::Draining,
            NodeState::Left,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
    }

    /// Whether a node in this state may be chosen as an owner.
    pub fn takes_ownership(self) -> bool {
        matches!(self, NodeState::Joining | NodeState::Active)
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One node as a view sees it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NodeInfo {
    /// Its node name (unique in the cluster; the rendezvous input).
    pub name: String,
    /// Its region.
    pub region: String,
    /// Its lifecycle state.
    pub state: NodeState,
    /// Whether failure detection thinks it is up.
    pub alive: bool,
    /// Since when this observer has seen it down, if it is down.
    pub down_since_ms: Option<u64>,
    /// The partitions it holds up to date and serves (ready or releasing).
    pub holding: PartitionSet,
    /// Those of `holding` that it is handing away.
    pub releasing: PartitionSet,
}

/// An operator's drain or removal that is refused.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum AdminRefusal {
    /// No such node in the view.
    #[error("no node named {node:?} in this cluster; `tally status` lists the nodes")]
    UnknownNode {
        /// The name given.
        node: String,
    },
    /// Draining it would leave its region without a node to own partitions.
    #[error(
        "node {node:?} is the last node of region {region:?} that can own partitions; \
         add a node to {region:?} first, then drain {node:?}"
    )]
    LastNodeOfRegion {
        /// The node.
        node: String,
        /// Its region.
        region: String,
    },
    /// Removal is for nodes that are gone for good; this one is up.
    #[error(
        "node {node:?} is alive: to take it out of service drain it \
         (`tally admin drain {node}`); remove only a node that is down for good"
    )]
    RemoveLiveNode {
        /// The node.
        node: String,
    },
    /// A drain is something the node does: a node that is down cannot.
    #[error(
        "node {node:?} is down, so it cannot hand its partitions away: start it again and \
         drain it, or, if it is gone for good, remove it (`tally admin remove {node}`)"
    )]
    DrainDownNode {
        /// The node.
        node: String,
    },
    /// It has already left.
    #[error("node {node:?} has already left the cluster")]
    AlreadyLeft {
        /// The node.
        node: String,
    },
}

/// A node's view of the cluster at one moment (see the module documentation).
#[derive(Clone, Debug)]
pub struct ClusterView {
    partitions: PartitionCount,
    replication_factor: u32,
    dead_after_ms: u64,
    now_ms: u64,
    nodes: BTreeMap<String, NodeInfo>,
}

impl ClusterView {
    /// A view of `nodes` (the observer included) at `now_ms`.
    pub fn new(
        partitions: PartitionCount,
        replication_factor: u32,
        dead_after_ms: u64,
        now_ms: u64,
        nodes: impl IntoIterator<Item = NodeInfo>,
    ) -> Self {
        ClusterView {
            partitions,
            replication_factor: replication_factor.max(1),
            dead_after_ms,
            now_ms,
            nodes: nodes
                .into_iter()
                .map(|node| (node.name.clone(), node))
                .collect(),
        }
    }

    /// The cluster's partition count.
    pub fn partitions(&self) -> PartitionCount {
        self.partitions
    }

    /// The configured replication factor (per region).
    pub fn replication_factor(&self) -> u32 {
        self.replication_factor
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.get(name)
    }

    /// Every node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.values()
    }

    /// The regions, in order.
    pub fn regions(&self) -> Vec<&str> {
        let mut regions: Vec<&str> = self.nodes.values().map(|n| n.region.as_str()).collect();
        regions.dedup();
        regions.sort_unstable();
        regions.dedup();
        regions
    }

    /// Whether `node` has been down for `dead_after` or longer.
    pub fn is_gone(&self, node: &NodeInfo) -> bool {
        !node.alive
            && node
                .down_since_ms
                .is_some_and(|since| self.now_ms.saturating_sub(since) >= self.dead_after_ms)
    }

    /// Whether `node` may be chosen as an owner.
    pub fn is_eligible(&self, node: &NodeInfo) -> bool {
        node.state.takes_ownership() && !self.is_gone(node)
    }

    /// The replication factor in effect in `region`: the configured one, or
    /// fewer when the region has fewer eligible nodes.
    pub fn effective_replication(&self, region: &str) -> usize {
        let eligible = self
            .nodes
            .values()
            .filter(|node| node.region == region && self.is_eligible(node))
            .count();
        eligible.min(self.replication_factor as usize)
    }

    /// Every node of `region`, highest rendezvous weight for `partition` first.
    pub fn ranked(&self, region: &str, partition: Partition) -> Vec<&NodeInfo> {
        let mut nodes: Vec<(u64, &NodeInfo)> = self
            .nodes
            .values()
            .filter(|node| node.region == region)
            .map(|node| (rendezvous_weight(partition, &node.name), node))
            .collect();
        nodes.sort_by(|(wa, a), (wb, b)| wb.cmp(wa).then_with(|| a.name.cmp(&b.name)));
        nodes.into_iter().map(|(_, node)| node).collect()
    }

    /// The owners of `partition` in `region`, first owner first.
    pub fn owners(&self, region: &str, partition: Partition) -> Vec<&str> {
        self.ranked(region, partition)
            .into_iter()
            .filter(|node| self.is_eligible(node))
            .take(self.replication_factor as usize)
            .map(|node| node.name.as_str())
            .collect()
    }

    /// Whether `name` owns `partition` in its region.
    pub fn owns(&self, name: &str, partition: Partition) -> bool {
        self.node(name)
            .is_some_and(|node| self.owners(&node.region, partition).contains(&name))
    }

    /// The partitions that `name` owns.
    pub fn owned_by(&self, name: &str) -> PartitionSet {
        let mut owned = PartitionSet::empty(self.partitions);
        owned.extend(
            self.partitions
                .iter()
                .filter(|partition| self.owns(name, *partition)),
        );
        owned
    }

    /// Where an add or a read of a key in `partition` goes in `region`, in
    /// order of preference: the live owners that hold it up to date (first
    /// owner first), then any other live node that still holds it (one
    /// handing it away). Empty when no live node of the region holds it.
    pub fn route(&self, region: &str, partition: Partition) -> Vec<&str> {
        let owners = self.owners(region, partition);
        let holds = |node: &NodeInfo| node.alive && node.holding.contains(partition);
        let mut route: Vec<&str> = owners
            .iter()
            .filter(|name| self.nodes.get(**name).is_some_and(holds))
            .copied()
            .collect();
        for node in self.ranked(region, partition) {
            if holds(node) && !route.contains(&node.name.as_str()) {
                route.push(&node.name);
            }
        }
        route
    }

    /// The partitions of `region` held up to date by fewer *live* owners than
    /// the effective replication factor: while an owner is down (and not yet
    /// gone, when its partitions move), or still catching up, its partitions
    /// have fewer copies that serve and replicate than RF asks.
    pub fn under_replicated(&self, region: &str) -> PartitionSet {
        let want = self.effective_replication(region);
        let mut under = PartitionSet::empty(self.partitions);
        for partition in self.partitions.iter() {
            let held = self
                .owners(region, partition)
                .iter()
                .filter(|name| {
                    self.nodes
                        .get(**name)
                        .is_some_and(|node| node.alive && node.holding.contains(partition))
                })
                .count();
            if held < want {
                under.insert(partition);
            }
        }
        under
    }

    /// Whether an operator may drain `name`: not the last eligible node of
    /// its region.
    pub fn check_drain(&self, name: &str) -> Result<(), AdminRefusal> {
        let node = self.known(name)?;
        let others = self
            .nodes
            .values()
            .filter(|other| other.region == node.region && other.name != name)
            .any(|other| self.is_eligible(other));
        if !others {
            return Err(AdminRefusal::LastNodeOfRegion {
                node: name.to_string(),
                region: node.region.clone(),
            });
        }
        Ok(())
    }

    /// Whether an operator may remove `name`: a node that is down (the
    /// others then take its partitions over at once, without waiting for
    /// `dead_after`).
    pub fn check_remove(&self, name: &str) -> Result<(), AdminRefusal> {
        let node = self.known(name)?;
        if node.alive {
            return Err(AdminRefusal::RemoveLiveNode {
                node: name.to_string(),
            });
        }
        Ok(())
    }

    fn known(&self, name: &str) -> Result<&NodeInfo, AdminRefusal> {
        let node = self.node(name).ok_or_else(|| AdminRefusal::UnknownNode {
            node: name.to_string(),
        })?;
        if node.state == NodeState::Left {
            return Err(AdminRefusal::AlreadyLeft {
                node: name.to_string(),
            });
        }
        Ok(node)
    }
}

/// Turns failure detection's up/down flags over time into "down since",
/// so that a node is taken out of ownership only after `dead_after`.
#[derive(Clone, Debug, Default)]
pub struct DownClock {
    since: BTreeMap<String, u64>,
}

impl DownClock {
    /// Records that `name` is up or down at `now_ms`; returns since when it
    /// has been down (the first time it was seen down in this stretch).
    pub fn observe(&mut self, name: &str, alive: bool, now_ms: u64) -> Option<u64> {
        if alive {
            self.since.remove(name);
            None
        } else {
            Some(*self.since.entry(name.to_string()).or_insert(now_ms))
        }
    }
}
