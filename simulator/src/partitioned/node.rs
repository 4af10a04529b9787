//! One simulated node of a partitioned region: its lifecycle state, its real
//! `Holdings`, its view of the cluster, and one real `Replica` on a
//! `MemoryStore` per partition it keeps.
//!
//! Invariants: the node's change sequence (what `Holdings` counts in) rises
//! by one for every add and every merge that changed a partition, and a
//! change is durable once the commit of its partition's replica that holds
//! it completed; `durable_seq` is the highest sequence below which every
//! change is durable. A crash loses what was not flushed and every pull and
//! waiter in flight; a restart recovers the partitions the node had
//! persisted as served (`Holdings::recover`) and drops the copies it was
//! still receiving (they are copied again).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tally_node::crdt::ReplicaId;
use tally_node::partition::{
    ClusterView, DownClock, Holdings, NodeState, Partition, PartitionCount, PartitionSet, PullScope,
};
use tally_node::replica::{establish, CommitBatch, Replica, ReplicaConfig};
use tally_node::store::{MemoryStore, Store};

use crate::world::{CLUSTER, EPOCH_MS};

/// An add waiting for its commit: (client, add, attempt).
pub type Waiter = (u32, u32, u8);

/// One partition kept by a node: a replica of its own.
pub struct PartReplica {
    /// The core.
    pub replica: Replica,
    /// Its disk.
    pub store: MemoryStore,
    /// Its index among the checker's writers.
    pub writer: usize,
    /// The batch being written.
    pub committing: Option<Arc<CommitBatch>>,
    /// Node sequences of changes not in a batch yet.
    pub unbatched: Vec<u64>,
    /// Node sequences of changes by the commit that holds them.
    pub batched: BTreeMap<u64, Vec<u64>>,
    /// Adds waiting for their commit, by commit.
    pub waiting: BTreeMap<u64, Vec<Waiter>>,
}

impl PartReplica {
    /// A new, empty replica of a partition.
    pub fn fresh(region: &str, fresh_id: u64, now: u64, writer: usize) -> PartReplica {
        let identity = establish(None, region, fresh_id).expect("simulated region names are valid");
        let store = MemoryStore::new(identity.clone());
        let recovered = store.recover(now).expect("a new memory store recovers");
        let replica = Replica::open(identity, config(), recovered, now);
        PartReplica::around(replica, store, writer)
    }

    fn around(replica: Replica, store: MemoryStore, writer: usize) -> PartReplica {
        PartReplica {
            replica,
            store,
            writer,
            committing: None,
            unbatched: Vec::new(),
            batched: BTreeMap::new(),
            waiting: BTreeMap::new(),
        }
    }

    /// Its replica id.
    pub fn id(&self) -> ReplicaId {
        self.replica.identity().replica
    }

    /// Node sequences of every change not yet durable here.
    pub fn pending_changes(&self) -> impl Iterator<Item = u64> + '_ {
        self.unbatched
            .iter()
            .chain(self.batched.values().flatten())
            .copied()
    }
}

fn config() -> ReplicaConfig {
    ReplicaConfig {
        cluster_id: CLUSTER.into(),
        cache_capacity: 64,
        ..Default::default()
    }
}

/// A pull this node has in flight.
pub struct PullInFlight {
    /// The peer's slot.
    pub peer: usize,
    /// What `Holdings` planned.
    pub scope: PullScope,
}

/// A pull whose merges wait to be durable before `Holdings` hears of it
/// (an owner confirms only what it would still hold after a crash).
pub struct PulledPending {
    /// What was planned.
    pub scope: PullScope,
    /// What the peer served.
    pub served: PartitionSet,
    /// The peer's sequence the pull covers.
    pub through: u64,
    /// This node's sequence that must be durable first.
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
    /// Running.
    pub up: bool,
    /// Gone for good (removed: its disk is lost).
    pub removed: bool,
    /// Its published lifecycle state.
    pub state: NodeState,
    /// Bumped at each crash; events of an older epoch are dropped.
    pub epoch: u32,
    /// The handoff state machine.
    pub holdings: Holdings,
    /// The partitions kept, each a replica.
    pub parts: BTreeMap<Partition, PartReplica>,
    /// Its last view of the cluster.
    pub view: Option<ClusterView>,
    /// Since when it has seen each other node down.
    pub down_clock: DownClock,
    /// Its latest change sequence.
    pub seq: u64,
    /// Changes not durable yet.
    pub outstanding: BTreeSet<u64>,
    /// The partitions it has persisted as served (what it recovers).
    pub persisted: PartitionSet,
    /// Pulls in flight, by pull id.
    pub pulls: BTreeMap<u64, PullInFlight>,
    /// Pulls merged, waiting to be durable.
    pub pulled: Vec<PulledPending>,
    /// Per (peer slot, partition): the peer's replica this node pulled from last.
    pub sources: BTreeMap<(usize, Partition), ReplicaId>,
    /// Sync rounds so far (rotates the remote owner pulled from).
    pub rounds: u64,
}

impl PartNode {
    /// Slot `index`, not started yet (or started now when `exists`).
    pub fn new(index: usize, region: String, count: PartitionCount, exists: bool) -> PartNode {
        let name = format!("n{index}");
        let empty = PartitionSet::empty(count);
        PartNode {
            holdings: Holdings::recover(&name, &region, count, &empty, 0),
            index,
            name,
            region,
            exists,
            up: exists,
            removed: false,
            state: NodeState::Active,
            epoch: 0,
            parts: BTreeMap::new(),
            view: None,
            down_clock: DownClock::default(),
            seq: 0,
            outstanding: BTreeSet::new(),
            persisted: empty,
            pulls: BTreeMap::new(),
            pulled: Vec::new(),
            sources: BTreeMap::new(),
            rounds: 0,
        }
    }

    /// The time its clock shows at simulated time `now`.
    pub fn local_now(now: u64) -> u64 {
        EPOCH_MS + now
    }

    /// The highest sequence through which every change is durable.
    pub fn durable_seq(&self) -> u64 {
        self.outstanding
            .first()
            .map_or(self.seq, |first| first.saturating_sub(1))
    }

    /// A change to `partition`: stamps it and tells `Holdings`.
    pub fn changed(&mut self, partition: Partition) -> u64 {
        self.seq += 1;
        let seq = self.seq;
        self.outstanding.insert(seq);
        if let Some(part) = self.parts.get_mut(&partition) {
            part.unbatched.push(seq);
        }
        self.holdings.handle_change(partition, seq);
        seq
    }

    /// Changes became durable (or went with a deleted partition).
    pub fn settle_changes(&mut self, seqs: impl IntoIterator<Item = u64>) {
        for seq in seqs {
            self.outstanding.remove(&seq);
        }
        self.holdings.handle_durable(self.durable_seq());
    }

    /// Persists what it serves (the runtime does so on every change).
    pub fn persist(&mut self) {
        self.persisted = self.holdings.serving();
    }

    /// Kills the process; the disks keep only what was flushed.
    pub fn crash(&mut self) {
        self.up = false;
        self.epoch += 1;
        for part in self.parts.values_mut() {
            part.store.crash();
            part.committing = None;
            part.unbatched.clear();
            part.batched.clear();
            part.waiting.clear();
        }
        self.outstanding.clear();
        self.pulls.clear();
        self.pulled.clear();
        self.view = None;
    }

    /// Starts again on its disks: the partitions it persisted as served come
    /// back (each replica recovered from its store); the others are dropped.
    /// Returns the partitions recovered.
    pub fn restart(&mut self, count: PartitionCount, now: u64) -> Vec<Partition> {
        let local = Self::local_now(now);
        let persisted = self.persisted.clone();
        self.parts
            .retain(|partition, _| persisted.contains(*partition));
        let mut recovered = Vec::new();
        for (partition, part) in std::mem::take(&mut self.parts) {
            let state = part
                .store
                .recover(local)
                .expect("the memory store recovers");
            let identity = part.store.identity().clone();
            let replica = Replica::open(identity, config(), state, local);
            self.parts.insert(
                partition,
                PartReplica::around(replica, part.store, part.writer),
            );
            recovered.push(partition);
        }
        self.holdings = Holdings::recover(&self.name, &self.region, count, &persisted, self.seq);
        self.sources.clear();
        self.up = true;
        recovered
    }
}
