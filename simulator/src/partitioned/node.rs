//! One node slot of a partitioned region: the node as `tally-node` runs it
//! (a [`ScopedNode`]: one scoped `Replica` on one `MemoryStore`, its
//! lifecycle and holdings in tally-core's `NodePartitions`, its copy
//! sessions), and what its runtime has in flight around it: the group
//! commit being flushed, the adds waiting for their commit, its pulls, and
//! the pulls merged but not yet durable.
//!
//! Invariants: a pull is reported to the partitions only once every change
//! it merged is durable here (`PulledPending::needed`), so a confirmation
//! never vouches for state a crash could take back; an add is answered
//! only once the commit that holds it is flushed. A crash loses what was
//! not flushed and everything in flight; a restart recovers the replica
//! from its store and the holdings from its stored `LIFECYCLE` record, as
//! the node does.

use std::collections::BTreeMap;
use std::sync::Arc;

use tally_core::runtime::copy_sessions::PullReport;
use tally_core::runtime::pusher::Pusher;
use tally_node::crdt::ReplicaId;
use tally_node::partition::{ClusterView, MemberFacts, NodeState, Partition, PullScope};
use tally_node::replica::folds::FoldReport;
use tally_node::replica::{CommitBatch, CopyPush, Member};

use super::events::Ev;
use super::scoped::ScopedNode;
use crate::world::EPOCH_MS;

/// An add waiting for its commit: (client, add, attempt).
pub type Waiter = (u32, u32, u8);

/// A push a copy took, waiting for the commit that makes it durable there:
/// (pusher's slot, push id, the push, the pusher's true epochs).
pub type CopyWaiter = (usize, u64, Arc<CopyPush>, Arc<Vec<u64>>);

/// A pull this node has in flight.
pub struct PullInFlight {
    /// The peer's replica.
    pub peer: ReplicaId,
    /// What the partitions planned, as the copy sessions fitted it.
    pub scope: PullScope,
}

/// A pull whose merges wait to be durable before the partitions hear of it.
pub struct PulledPending {
    /// What the copy sessions report.
    pub report: PullReport,
    /// The commit sequence that makes its merges durable.
    pub needed: u64,
}

/// See the module documentation.
pub struct PartNode {
    /// Its slot.
    pub index: usize,
    /// Its node name (the rendezvous input).
    pub name: String,
    /// Its region's name.
    pub region: String,
    /// Started (an initial node, or a spare that joined).
    pub exists: bool,
    /// Running (possibly paused).
    pub up: bool,
    /// Stopped by a pause: its events wait in `deferred` until it resumes.
    pub paused: bool,
    /// Events for it that arrived while it was paused.
    pub deferred: Vec<Ev>,
    /// What its clock is off by (ms).
    pub skew_ms: i64,
    /// Gone for good (removed: its disk is lost).
    pub removed: bool,
    /// Bumped at each crash; events of an older epoch are dropped.
    pub epoch: u32,
    /// The node, once started (kept while it is down: its disk).
    pub node: Option<ScopedNode>,
    /// Its replica's index among the checker's writers.
    pub writer: usize,
    /// The commit being flushed.
    pub committing: Option<Arc<CommitBatch>>,
    /// Adds waiting for their commit, by the commit that holds them.
    pub waiting: BTreeMap<u64, Vec<Waiter>>,
    /// Pulls in flight, by pull id.
    pub pulls: BTreeMap<u64, PullInFlight>,
    /// Pulls merged, waiting to be durable.
    pub pulled: Vec<PulledPending>,
    /// The view of its last lifecycle round, which it routes adds by.
    pub view: Option<ClusterView>,
    /// The fold report it published last.
    pub report: Option<FoldReport>,
    /// Its pusher of replicated durability (the push in flight, parked
    /// counters and their pause).
    pub pusher: Pusher,
    /// The end of the pause of parked counters is scheduled.
    pub push_retry_scheduled: bool,
    /// Pushes it took as a copy, by the commit that makes them durable here.
    pub copy_waiting: BTreeMap<u64, Vec<CopyWaiter>>,
}

impl PartNode {
    /// Slot `index` of `region`, not started yet.
    pub fn new(index: usize, region: String) -> PartNode {
        PartNode {
            index,
            name: format!("n{index}"),
            region,
            exists: false,
            up: false,
            paused: false,
            deferred: Vec::new(),
            skew_ms: 0,
            removed: false,
            epoch: 0,
            node: None,
            writer: 0,
            committing: None,
            waiting: BTreeMap::new(),
            pulls: BTreeMap::new(),
            pulled: Vec::new(),
            view: None,
            report: None,
            pusher: Pusher::new(0),
            push_retry_scheduled: false,
            copy_waiting: BTreeMap::new(),
        }
    }

    /// The node (it has started).
    pub fn scoped(&self) -> &ScopedNode {
        self.node.as_ref().expect("a started slot has a node")
    }

    /// The node, to change (it has started).
    pub fn scoped_mut(&mut self) -> &mut ScopedNode {
        self.node.as_mut().expect("a started slot has a node")
    }

    /// Its pusher and its core, to drive a push.
    pub fn pusher_and_core(&mut self) -> (&mut Pusher, &mut tally_node::replica::Replica) {
        let node = self.node.as_mut().expect("a started slot has a node");
        (&mut self.pusher, &mut node.core)
    }

    /// Up and not paused: it handles requests now.
    pub fn running(&self) -> bool {
        self.up && !self.paused
    }

    /// The time its clock shows at simulated time `now`.
    pub fn clock(&self, now: u64) -> u64 {
        (EPOCH_MS as i64 + now as i64 + self.skew_ms) as u64
    }

    /// Its replica id.
    pub fn id(&self) -> ReplicaId {
        self.scoped().id()
    }

    /// Its lifecycle state as it publishes it.
    pub fn state(&self) -> NodeState {
        self.node
            .as_ref()
            .map_or(NodeState::Joining, |node| node.partitions.state())
    }

    /// Whether it keeps `partition` (serves it, copies it in, or hands it away).
    pub fn keeps(&self, partition: Partition) -> bool {
        self.node.as_ref().is_some_and(|node| {
            let (serving, receiving, _) = node.partitions.holdings();
            serving.contains(partition) || receiving.contains(partition)
        })
    }

    /// An add (see [`Waiter`]) waits for the commit or push of `ticket`.
    pub fn wait_for(&mut self, ticket: u64, waiter: Waiter) {
        self.waiting.entry(ticket).or_default().push(waiter);
    }

    /// Whether it serves `partition` (ready, or handing it away).
    pub fn serves(&self, partition: Partition) -> bool {
        self.node
            .as_ref()
            .is_some_and(|node| node.partitions.holdings().0.contains(partition))
    }

    /// Whether it serves `partition` and is not handing it away.
    pub fn ready(&self, partition: Partition) -> bool {
        self.node.as_ref().is_some_and(|node| {
            let (serving, _, releasing) = node.partitions.holdings();
            serving.contains(partition) && !releasing.contains(partition)
        })
    }

    /// Whether every change it made is durable.
    pub fn all_durable(&self) -> bool {
        let core = &self.scoped().core;
        self.committing.is_none() && core.changes_durable_at() <= core.durable_seq()
    }

    /// What gossip tells the others of it (`alive` as they see it).
    pub fn facts(&self, alive: bool) -> MemberFacts {
        MemberFacts {
            alive,
            ..self.scoped().facts()
        }
    }

    /// What membership tells the others' peer books of it.
    pub fn member(&self, alive: bool) -> Member {
        let core = &self.scoped().core;
        Member {
            replica: core.identity().replica,
            region: self.region.clone(),
            node_name: self.name.clone(),
            grpc_addr: self.name.clone(),
            gossip_addr: String::new(),
            alive,
            durable_seq: core.durable_seq(),
            digest: core.digest().0,
            sets_digest: Some(core.sets_digest().0),
            protocol: core.peers().own_protocol(),
            folds: self.report.clone(),
            partitions: core.peers().own_partitions(),
            born_at: tally_node::replica::version::NEWEST,
            counters_stored: None,
        }
    }

    /// Kills the process: the disk keeps only what was flushed, and
    /// everything in flight is gone.
    pub fn crash(&mut self) {
        self.up = false;
        self.paused = false;
        self.deferred.clear();
        self.epoch += 1;
        if let Some(node) = &self.node {
            node.store.crash();
        }
        self.committing = None;
        self.waiting.clear();
        self.pulls.clear();
        self.pulled.clear();
        self.view = None;
        // Ids of this incarnation's pushes never match a late answer to
        // the last one's.
        self.pusher = Pusher::new(u64::from(self.epoch) << 32);
        self.push_retry_scheduled = false;
        self.copy_waiting.clear();
    }

    /// Starts again on its disk and its stored record.
    pub fn restart(&mut self, now: u64) {
        let node = self.node.take().expect("a started slot has a node");
        self.node = Some(node.restart(now));
        self.up = true;
    }
}
