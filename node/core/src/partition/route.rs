//! Where this node sends a key's requests (issue 11, items 3 and 7): a
//! [`RouteTable`] built from a [`ClusterView`] once per membership change,
//! looked up per request. Pure: the view and the nodes' addresses are inputs.
//!
//! Invariants kept here:
//! - a key's route lists the live nodes of the node's region that serve its
//!   partition ([`ClusterView::route`]: the owners that hold it caught up,
//!   first owner first, then any other node still holding it, one handing it
//!   away), so every node that sees the same membership sends a key to the
//!   same node, and never to one still copying the partition in;
//! - when this node is the first of them, or when none is live, the route is
//!   [`Route::Local`]: the request is served here if this node serves the
//!   partition, and refused as not served otherwise (the replica decides);
//! - a table in which every key is local (one node in the region, the
//!   single-node setup) says so with [`RouteTable::all_local`], so the
//!   request path skips hashing altogether.

use super::hash::PartitionCount;
use super::view::{ClusterView, NodeState};

/// A node of the region that some route forwards to.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RouteNode {
    /// Its node name.
    pub name: String,
    /// Where it serves gRPC (`host:port`).
    pub grpc_addr: String,
}

/// One entry of a route: another node, or this one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hop<'a> {
    /// This node: serve here.
    Here,
    /// Another node: forward to it.
    Node(&'a RouteNode),
}

/// Where a key's request goes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Route<'a> {
    /// Serve it here.
    Local,
    /// Forward it to the first hop; if that one does not answer, to the
    /// next, and so on ([`Hop::Here`] and the end of the list both mean
    /// "serve it here").
    Forward(Vec<Hop<'a>>),
}

/// Index of this node in a route's hops.
const HERE: u16 = u16::MAX;

/// The routes of every partition in one region (see the module documentation).
#[derive(Clone, Debug)]
pub struct RouteTable {
    partitions: PartitionCount,
    nodes: Vec<RouteNode>,
    /// Per partition: the live owners, first owner first, as indexes into
    /// `nodes` ([`HERE`] for this node). Empty for a table with no routes.
    owners: Vec<Vec<u16>>,
    /// Per partition: how many of the first `owners` own it (the rest
    /// hold it as releasing).
    owning: Vec<u16>,
    all_local: bool,
}

impl RouteTable {
    /// A table that serves every key here (before the first membership view).
    pub fn local(partitions: PartitionCount) -> RouteTable {
        RouteTable {
            partitions,
            nodes: Vec::new(),
            owners: Vec::new(),
            owning: Vec::new(),
            all_local: true,
        }
    }

    /// The routes of `own_name`'s region in `view`; `grpc_addr` gives each
    /// node's address (a node without one is not routed to).
    pub fn build(
        view: &ClusterView,
        own_name: &str,
        grpc_addr: impl Fn(&str) -> Option<String>,
    ) -> RouteTable {
        let partitions = view.partitions();
        let Some(own) = view.node(own_name) else {
            return RouteTable::local(partitions);
        };
        let region = own.region.clone();
        let mut nodes: Vec<RouteNode> = Vec::new();
        let mut all_local = true;
        let mut owning = Vec::with_capacity(partitions.get() as usize);
        let owners: Vec<Vec<u16>> = partitions
            .iter()
            .map(|partition| {
                let route = view.route(&region, partition);
                let owner_names = view.owners(&region, partition);
                let mut owning_here = 0;
                let live: Vec<u16> = route
                    .into_iter()
                    .filter_map(|name| {
                        if name == own_name {
                            return Some((name, HERE));
                        }
                        let node = view.node(name)?;
                        if view.is_gone(node) || node.state == NodeState::Left {
                            return None;
                        }
                        let grpc_addr = grpc_addr(name).filter(|addr| !addr.is_empty())?;
                        let index = match nodes.iter().position(|known| known.name == name) {
                            Some(index) => index,
                            None => {
                                nodes.push(RouteNode {
                                    name: name.to_string(),
                                    grpc_addr,
                                });
                                nodes.len() - 1
                            }
                        };
                        Some((name, index as u16))
                    })
                    // The route lists the owners first.
                    .inspect(|(name, _)| {
                        if owner_names.contains(name) {
                            owning_here += 1;
                        }
                    })
                    .map(|(_, index)| index)
                    .collect();
                if live.first().is_some_and(|first| *first != HERE) {
                    all_local = false;
                }
                owning.push(owning_here);
                live
            })
            .collect();
        if all_local {
            return RouteTable::local(partitions);
        }
        RouteTable {
            partitions,
            nodes,
            owners,
            owning,
            all_local,
        }
    }

    /// Whether every key is served here: the request path need not look.
    pub fn all_local(&self) -> bool {
        self.all_local
    }

    /// Where `key`'s request goes.
    pub fn route(&self, key: &[u8]) -> Route<'_> {
        if self.all_local {
            return Route::Local;
        }
        let partition = self.partitions.of_key(key);
        let owners = &self.owners[partition.0 as usize];
        match owners.first() {
            None | Some(&HERE) => Route::Local,
            Some(_) => Route::Forward(
                owners
                    .iter()
                    .map(|index| match *index {
                        HERE => Hop::Here,
                        index => Hop::Node(&self.nodes[index as usize]),
                    })
                    .collect(),
            ),
        }
    }

    /// Where replicated durability's copies of `key` may go: its other
    /// live owners that hold it caught up (first owner first), and the
    /// other live nodes still holding it as releasing (which purge it once
    /// the owners confirmed it).
    pub fn other_holders(&self, key: &[u8]) -> (Vec<&str>, Vec<&str>) {
        if self.all_local {
            return (Vec::new(), Vec::new());
        }
        let partition = self.partitions.of_key(key).0 as usize;
        let route = &self.owners[partition];
        let (owners, releasing) =
            route.split_at(usize::from(self.owning[partition]).min(route.len()));
        let names = |hops: &[u16]| -> Vec<&str> {
            hops.iter()
                .filter(|index| **index != HERE)
                .map(|index| self.nodes[*index as usize].name.as_str())
                .collect()
        };
        (names(owners), names(releasing))
    }

    /// The name of `key`'s first live owner, `None` when it is this node.
    pub fn first_owner(&self, key: &[u8]) -> Option<&str> {
        match self.route(key) {
            Route::Forward(hops) => match hops.first() {
                Some(Hop::Node(node)) => Some(node.name.as_str()),
                _ => None,
            },
            Route::Local => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{NodeInfo, Partition, PartitionSet};

    #[track_caller]
    fn node(name: &str, region: &str, state: NodeState, alive: bool) -> NodeInfo {
        NodeInfo {
            name: name.to_string(),
            region: region.to_string(),
            state,
            alive,
            down_since_ms: (!alive).then_some(0),
            holding: if state == NodeState::Joining {
                PartitionSet::empty(PartitionCount::new(16).unwrap())
            } else {
                PartitionSet::full(PartitionCount::new(16).unwrap())
            },
            releasing: PartitionSet::empty(PartitionCount::new(16).unwrap()),
        }
    }

    fn view(nodes: Vec<NodeInfo>, now_ms: u64) -> ClusterView {
        ClusterView::new(PartitionCount::new(16).unwrap(), 2, 1_000, now_ms, nodes)
    }

    fn addr(name: &str) -> Option<String> {
        Some(format!("{name}:7100"))
    }

    fn keys() -> impl Iterator<Item = String> {
        (0..200).map(|i| format!("post:{i}"))
    }

    #[test]
    fn one_node_per_region_serves_every_key_here() {
        let view = view(
            vec![
                node("eu-1", "eu", NodeState::Active, true),
                node("us-1", "us", NodeState::Active, true),
            ],
            0,
        );
        let table = RouteTable::build(&view, "eu-1", addr);
        assert!(table.all_local());
        assert!(keys().all(|key| table.route(key.as_bytes()) == Route::Local));
    }

    #[test]
    fn keys_go_to_their_first_owner_and_every_node_agrees() {
        let nodes = vec![
            node("eu-1", "eu", NodeState::Active, true),
            node("eu-2", "eu", NodeState::Active, true),
            node("eu-3", "eu", NodeState::Active, true),
            node("us-1", "us", NodeState::Active, true),
        ];
        let view = view(nodes, 0);
        let tables: Vec<(&str, RouteTable)> = ["eu-1", "eu-2", "eu-3"]
            .into_iter()
            .map(|name| (name, RouteTable::build(&view, name, addr)))
            .collect();
        let mut forwarded = 0;
        for key in keys() {
            let partition = view.partitions().of_key(key.as_bytes());
            let first = view.owners("eu", partition)[0];
            for (name, table) in &tables {
                assert!(!table.all_local());
                match table.route(key.as_bytes()) {
                    Route::Local => assert_eq!(first, *name, "{key}"),
                    Route::Forward(hops) => {
                        forwarded += 1;
                        assert_eq!(
                            hops[0],
                            Hop::Node(&RouteNode {
                                name: first.to_string(),
                                grpc_addr: format!("{first}:7100"),
                            })
                        );
                        // The second owner is the failover (RF 2), then the
                        // node that holds the partition without owning it.
                        assert_eq!(hops.len(), 3, "{key}");
                        let owners = view.owners("eu", partition);
                        let name = |hop: &Hop| match hop {
                            Hop::Here => name.to_string(),
                            Hop::Node(node) => node.name.clone(),
                        };
                        assert_eq!(name(&hops[1]), owners[1], "{key}");
                        assert!(!owners.contains(&name(&hops[2]).as_str()), "{key}");
                        assert_eq!(table.first_owner(key.as_bytes()), Some(first));
                    }
                }
            }
        }
        // Two of three nodes forward each key.
        assert_eq!(forwarded, 2 * 200);
    }

    #[test]
    fn a_down_or_joining_first_owner_is_skipped_and_no_live_owner_means_here() {
        let mut nodes = vec![
            node("eu-1", "eu", NodeState::Active, true),
            node("eu-2", "eu", NodeState::Active, true),
            node("eu-3", "eu", NodeState::Active, true),
        ];
        let full = view(nodes.clone(), 0);
        nodes[1].alive = false;
        nodes[1].down_since_ms = Some(0);
        nodes[2].state = NodeState::Joining;
        nodes[2].holding = PartitionSet::empty(PartitionCount::new(16).unwrap());
        // Down for less than dead-after: eu-2 still owns, but is not live.
        let partial = view(nodes, 10);
        let table = RouteTable::build(&partial, "eu-1", addr);
        for key in keys() {
            let partition = full.partitions().of_key(key.as_bytes());
            assert_eq!(
                partial.owners("eu", partition),
                full.owners("eu", partition)
            );
            // Neither eu-2 (down) nor eu-3 (joining, holds nothing yet) is
            // ever a hop.
            assert_eq!(table.route(key.as_bytes()), Route::Local, "{key}");
        }
    }

    #[test]
    fn a_node_that_does_not_hold_a_partition_is_skipped_and_a_holder_that_is_no_owner_comes_last() {
        let mut nodes = vec![
            node("eu-1", "eu", NodeState::Active, true),
            node("eu-2", "eu", NodeState::Active, true),
            node("eu-3", "eu", NodeState::Draining, true),
        ];
        // eu-2 still copies partition 5 in; eu-3 hands everything away.
        nodes[1].holding.remove(Partition(5));
        nodes[2].releasing = nodes[2].holding.clone();
        let view = view(nodes, 0);
        let key = keys()
            .find(|key| view.partitions().of_key(key.as_bytes()) == Partition(5))
            .unwrap();
        // RF 2 of the two active nodes: both own partition 5, and only eu-1
        // holds it caught up; eu-3 holds it but owns nothing.
        assert_eq!(view.owners("eu", Partition(5)).len(), 2);
        let hop = |name: &str| RouteNode {
            name: name.to_string(),
            grpc_addr: format!("{name}:7100"),
        };
        let (eu_1, eu_3) = (hop("eu-1"), hop("eu-3"));
        assert_eq!(
            RouteTable::build(&view, "eu-1", addr).route(key.as_bytes()),
            Route::Local
        );
        assert_eq!(
            RouteTable::build(&view, "eu-2", addr).route(key.as_bytes()),
            Route::Forward(vec![Hop::Node(&eu_1), Hop::Node(&eu_3)])
        );
        assert_eq!(
            RouteTable::build(&view, "eu-3", addr).route(key.as_bytes()),
            Route::Forward(vec![Hop::Node(&eu_1), Hop::Here])
        );
        // Copies of eu-1's adds: no other owner holds it caught up, eu-3
        // still holds it as releasing; eu-3's go to eu-1, an owner.
        assert_eq!(
            RouteTable::build(&view, "eu-1", addr).other_holders(key.as_bytes()),
            (vec![], vec!["eu-3"])
        );
        assert_eq!(
            RouteTable::build(&view, "eu-3", addr).other_holders(key.as_bytes()),
            (vec!["eu-1"], vec![])
        );
    }

    #[test]
    fn this_node_as_a_later_owner_is_a_hop_here() {
        let view = view(
            vec![
                node("eu-1", "eu", NodeState::Active, true),
                node("eu-2", "eu", NodeState::Active, true),
            ],
            0,
        );
        let table = RouteTable::build(&view, "eu-1", addr);
        let key = keys()
            .find(|key| table.route(key.as_bytes()) != Route::Local)
            .unwrap();
        let Route::Forward(hops) = table.route(key.as_bytes()) else {
            unreachable!()
        };
        assert_eq!(hops[1], Hop::Here);
    }
}
