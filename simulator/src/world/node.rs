//! One simulated node: the real replica core (`tally_node::replica::Replica`)
//! on a `MemoryStore` disk, plus the little runtime state the node's engine
//! keeps around it (the commit in flight, adds waiting for durability, pulls in
//! flight, the push to the copies in flight and pushes taken as a copy,
//! events held while paused).
//!
//! Invariant: the core is opened exactly as the node opens it — from
//! `store.recover` after a crash that kept the disk, or on a fresh store with
//! an id from `establish(None, region, fresh random)` after a wipe — and the
//! node's clock is the simulated clock plus its skew.

use std::collections::BTreeMap;
use std::sync::Arc;

use tally_node::crdt::ReplicaId;
use tally_node::replica::{establish, CommitBatch, PullChunk, Replica, ReplicaConfig};
use tally_node::store::{MemoryStore, Store};

use super::Event;
use crate::options::SimOptions;

/// The cluster id every simulated replica uses.
pub const CLUSTER: &str = "tally-sim";
/// The simulated clock starts here, so that negative skews stay positive.
pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// A pull this node has in flight.
#[derive(Debug)]
pub struct PullState {
    /// The peer pulled from.
    pub peer: ReplicaId,
    /// The serve (answer stream) accepted, the first one to arrive.
    pub serve: Option<u64>,
    /// The next chunk index to merge.
    pub next_index: u32,
    /// Chunks that arrived early, by index (reordering, as TCP would undo it).
    pub buffer: BTreeMap<u32, (PullChunk, bool)>,
}

/// An add waiting for its commit: (client, add, attempt).
pub type Waiter = (u32, u32, u8);

/// The push to the copies this node has in flight (replicated durability).
#[derive(Debug)]
pub struct PushState {
    /// Its id (answers and the timeout name it).
    pub id: u64,
    /// The durable sequence it brings the copies up to.
    pub upto_seq: u64,
    /// The copies it was sent to.
    pub targets: usize,
    /// Copies that answered that it is durable there.
    pub confirmed: usize,
    /// Copies that answered at all.
    pub answered: usize,
}

/// A push this node took as a copy, to be answered once durable here:
/// (the sender's node, its push id, the sending replica, the pushed slots).
pub type CopyWaiter = (usize, u64, ReplicaId, super::copies::PushedSlots);

/// See the module documentation.
pub struct SimNode {
    /// Its region's index.
    pub region: usize,
    /// Its region's name.
    pub region_name: String,
    /// Acknowledges before the flush.
    pub is_async: bool,
    /// Running (not crashed).
    pub up: bool,
    /// Stopped by a pause.
    pub paused: bool,
    /// Bumped at each crash; events of an older epoch are dropped.
    pub epoch: u32,
    /// The next restart wipes the disk.
    pub wipe_on_restart: bool,
    /// The core.
    pub replica: Replica,
    /// The disk.
    pub store: MemoryStore,
    /// Clock offset (ms).
    pub skew_ms: i64,
    /// The batch being written.
    pub committing: Option<Arc<CommitBatch>>,
    /// Sync-mode adds by the commit that makes them durable.
    pub waiting: BTreeMap<u64, Vec<Waiter>>,
    /// Async-acknowledged adds by the commit that makes them durable.
    pub async_pending: BTreeMap<u64, Vec<u32>>,
    /// Pulls in flight, by pull id.
    pub pulls: BTreeMap<u64, PullState>,
    /// Events held while paused.
    pub deferred: Vec<Event>,
    /// Crashes so far.
    pub crashes: u32,
    /// Takes adds in replicated mode (`handle_add_replicated`); its sync-mode
    /// waiters are answered at `replicated_seq` instead of `durable_seq`.
    pub replicated: bool,
    /// The push to the copies in flight.
    pub push: Option<PushState>,
    /// Failed pushes in a row (the pause before the next attempt doubles).
    pub push_failures: u32,
    /// A retry of a failed push is scheduled.
    pub push_retry_scheduled: bool,
    /// Successive pushes rotate over the region's copies.
    pub push_turn: u64,
    /// Pushes taken as a copy, by the commit that makes them durable here.
    pub copy_waiting: BTreeMap<u64, Vec<CopyWaiter>>,
}

/// The core's settings in the simulator.
pub fn replica_config(options: &SimOptions) -> ReplicaConfig {
    #[allow(unused_mut)]
    let mut config = ReplicaConfig {
        cluster_id: CLUSTER.into(),
        cache_capacity: options.cache_capacity,
        sync_interval_ms: options.sync_interval_ms,
        ..Default::default()
    };
    #[cfg(feature = "planted-bugs")]
    {
        config.planted_bug = options.planted_bug.map(|bug| bug.core());
    }
    config
}

impl SimNode {
    /// A node on a fresh disk.
    pub fn fresh(options: &SimOptions, index: usize, fresh_id: u64, now_ms: u64) -> SimNode {
        let region = options.region_of(index);
        let region_name = options.region_name(region);
        let (replica, store) = open_fresh(options, &region_name, fresh_id, now_ms);
        SimNode {
            region,
            region_name,
            is_async: options.is_async(index),
            up: true,
            paused: false,
            epoch: 0,
            wipe_on_restart: false,
            replica,
            store,
            skew_ms: 0,
            committing: None,
            waiting: BTreeMap::new(),
            async_pending: BTreeMap::new(),
            pulls: BTreeMap::new(),
            deferred: Vec::new(),
            crashes: 0,
            replicated: options.durability == crate::options::Durability::Replicated
                && !options.is_async(index),
            push: None,
            push_failures: 0,
            push_retry_scheduled: false,
            push_turn: 0,
            copy_waiting: BTreeMap::new(),
        }
    }

    /// The time this node's clock shows at simulated time `now`.
    pub fn local_now(&self, now: u64) -> u64 {
        (EPOCH_MS as i64 + now as i64 + self.skew_ms) as u64
    }

    /// This incarnation's replica id.
    pub fn id(&self) -> ReplicaId {
        self.replica.identity().replica
    }

    /// Kills the process: the runtime state goes, and with `wipe` the disk
    /// too at restart; without it, the unflushed writes go now.
    pub fn crash(&mut self, wipe: bool) {
        self.up = false;
        self.paused = false;
        self.epoch += 1;
        self.crashes += 1;
        self.wipe_on_restart = wipe;
        self.store.crash();
        self.committing = None;
        self.waiting.clear();
        self.async_pending.clear();
        self.pulls.clear();
        self.deferred.clear();
        self.push = None;
        self.push_failures = 0;
        self.push_retry_scheduled = false;
        self.copy_waiting.clear();
    }

    /// Starts the process again, on the kept disk or on a fresh one.
    pub fn restart(&mut self, options: &SimOptions, fresh_id: u64, now: u64) {
        let local = self.local_now(now);
        if self.wipe_on_restart {
            let (replica, store) = open_fresh(options, &self.region_name, fresh_id, local);
            self.replica = replica;
            self.store = store;
        } else {
            let recovered = self
                .store
                .recover(local)
                .expect("the memory store always recovers");
            let identity = self.store.identity().clone();
            self.replica = Replica::open(identity, replica_config(options), recovered, local);
            fold_by_partition(options, &mut self.replica, &self.store);
        }
        self.up = true;
        self.wipe_on_restart = false;
    }
}

fn open_fresh(
    options: &SimOptions,
    region: &str,
    fresh_id: u64,
    now_ms: u64,
) -> (Replica, MemoryStore) {
    let identity = establish(None, region, fresh_id).expect("simulated region names are valid");
    let store = MemoryStore::new(identity.clone());
    // A new store holds its idempotency hash key already.
    let recovered = store.recover(now_ms).expect("a new memory store recovers");
    let mut replica = Replica::open(identity, replica_config(options), recovered, now_ms);
    fold_by_partition(options, &mut replica, &store);
    (replica, store)
}

/// With `--fold-partitions P`: the replica tracks writers' digests over `P`
/// partitions and folds agree and apply partition by partition (cluster
/// version 10, `tally_node::replica::fold_partitions`), as a node of a
/// cluster with that partition count does; every simulated node keeps every
/// partition. The digests are computed from the store, as a node does when
/// it starts without saved ones.
fn fold_by_partition(options: &SimOptions, replica: &mut Replica, store: &MemoryStore) {
    let Some(count) = options.fold_partition_count() else {
        return;
    };
    tally_node::store::set_partition_count(replica, count, store, None)
        .expect("the memory store always reads");
}
