//! Partitioned regions (DESIGN.md "Partitioned regions"): the pure core of
//! partitioning. No tokio, sled, tonic or prost, and no clock: the node's
//! runtime and the simulator feed it membership views and events and act on
//! what it returns.
//!
//! - [`hash`]: the stable key hash, a key's [`Partition`] out of the
//!   cluster's fixed [`PartitionCount`] `P`, and the rendezvous weight of a
//!   (partition, node name) pair. These never change across builds; the
//!   routing client shares them through `tally_proto::partition`.
//! - [`set`]: [`PartitionSet`], a bitmap with a short text form for gossip.
//! - [`view`]: a node's [`ClusterView`] (its nodes, their [`NodeState`],
//!   liveness, and the partitions each serves), from which follow a
//!   partition's owners per region (the `RF` eligible nodes of highest
//!   rendezvous weight), the route of a key, the under-replicated partitions
//!   and the operator checks of a drain or a removal. [`DownClock`] turns
//!   failure detection into "down since", for `--dead-after`.
//! - [`lifecycle`]: one node's own [`NodeState`] and the cluster's removed
//!   replicas, decided from gossiped [`MemberFacts`], and the
//!   [`ClusterView`] a node builds from them.
//! - [`route`]: [`RouteTable`], where this node sends each key's requests:
//!   here, or its first live owner (then the next ones, on failover).
//! - [`handoff`]: [`Holdings`], one node's per-partition state machine
//!   (receiving, ready, releasing) that decides when it serves a partition,
//!   what it pulls from whom, whom it asks to confirm a release, and when it
//!   may delete. It keeps invariant 8: a partition is never deleted from its
//!   last up-to-date holder in a region, whatever the views of the nodes.
//!
//! How a runtime drives one node (the simulator does the same in-process):
//! build a [`ClusterView`] from membership at `now`, call
//! [`Holdings::handle_view`]; stamp every local change with
//! [`Holdings::handle_change`] and every commit with
//! [`Holdings::handle_durable`]; each sync round, for each peer, pull what
//! [`Holdings::poll_pull_scope`] says and report it with
//! [`Holdings::handle_pulled`]; ask each owner in
//! [`Holdings::poll_confirm_requests`] (the owner answers with
//! [`Holdings::answer_confirm`]) and report with
//! [`Holdings::handle_confirm`]; delete what [`Holdings::poll_deletions`]
//! returns; publish [`Holdings::serving`] and [`Holdings::releasing`] in
//! gossip; take adds and reads only for partitions it
//! [`Holdings::serves`], and route others with [`ClusterView::route`].

pub mod handoff;
pub mod hash;
pub mod lifecycle;
pub mod route;
pub mod set;
pub mod view;

#[cfg(test)]
mod handoff_tests;
#[cfg(test)]
mod view_tests;

pub use handoff::{ConfirmRequest, Coverage, Holding, Holdings, PullScope};
pub use hash::{
    key_hash, rendezvous_weight, BadPartitionCount, Partition, PartitionCount, DEFAULT_PARTITIONS,
    MAX_PARTITIONS,
};
pub use lifecycle::{DrainStep, Lifecycle, LifecycleRecord, MemberFacts, ViewSettings};
pub use route::{Hop, Route, RouteNode, RouteTable};
pub use set::{BadPartitionSet, PartitionSet};
pub use view::{AdminRefusal, ClusterView, DownClock, NodeInfo, NodeState};
