//! The runtime shell of the node's lifecycle and partition map (DESIGN.md
//! "Partitioned regions"): once per gossip round, [`spawn_lifecycle_keeper`]
//! feeds the members' gossiped lifecycle facts to the pure
//! [`NodePartitions`] (tally-core's `runtime`, which decides), persists the
//! lifecycle record in the data directory's `LIFECYCLE` file when it
//! changes (before publishing it), publishes the node's state, removals,
//! drain requests and holdings in chitchat, and sets the partition metrics.
//! [`Partitioning`] is what the Admin RPCs use: the current
//! [`ClusterView`], `drain` and `remove`.
//!
//! Invariants: a lifecycle change is on disk before any peer can see it (so
//! a crash never makes a node take back what it announced); a change that
//! cannot be persisted is not made (the operator's call fails, or the round
//! is retried): the core computes each change as a pending one, committed
//! here only once its record is stored. The owners come from the pure core
//! only: every node with the same membership facts serves the same map.
//!
//! The core's round drives the node's [`Holdings`](crate::partition::Holdings)
//! (which partitions it receives, serves and releases): each round after
//! the node has heard the cluster (see [`Partitioning::has_view`]) the view
//! goes in, the served partitions are persisted (in `LIFECYCLE`), then
//! handed to the replica (which refuses adds of others), then published in
//! gossip, in that order, so that no peer routes a key here before this
//! node takes it, and a restart resumes serving every partition that took
//! adds here. The anti-entropy loop asks it what to pull from whom
//! ([`Partitioning::pull_scope`]) and reports complete pulls
//! ([`Partitioning::handle_pulled`]). A joining node becomes active once it
//! receives nothing. Releasing partitions are kept and served until every
//! owner confirmed holding this node's changes of them
//! ([`Partitioning::confirm_requests`], asked by `release.rs`); then each
//! round stops serving them (under the core's lock, so no add slips in),
//! persists and publishes that, and starts the purge of what is stored of
//! them ([`Partitioning::purge_step`]).
//!
//! It also keeps the node's [`RouteTable`] ([`Partitioning::routes`]),
//! rebuilt when membership, liveness, an address or what a node holds
//! changes, which the `Counters` service forwards by.
//!
//! Lock order: this module's lock, then the core's (the engine's replica).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::membership::MembershipHandle;
use crate::crdt::ReplicaId;
use crate::engine::{now_ms, Engine};
use crate::lifecycle_file::{self, LifecycleFileError};
use crate::partition::{
    AdminRefusal, ClusterView, DrainStep, LifecycleRecord, MemberFacts, NodeState, Partition,
    PartitionSet, PullScope, RouteTable, ViewSettings,
};
use crate::replica::PurgeStep;
pub use tally_core::runtime::recovered_serving;
use tally_core::runtime::{NodePartitions, PendingChange, Publication};

/// Why an operator's drain or removal failed.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The core refused it (unknown node, last node of a region, live node ...).
    #[error(transparent)]
    Refused(#[from] AdminRefusal),
    /// The decision could not be persisted; nothing changed.
    #[error("{0}; nothing changed, try again")]
    Persist(#[from] LifecycleFileError),
}

/// What a node's ownership depends on, per node: name, region, state,
/// eligible (not gone).
type OwnershipInput = (String, String, NodeState, bool);

fn ownership_input(view: &ClusterView, node: &crate::partition::NodeInfo) -> OwnershipInput {
    (
        node.name.clone(),
        node.region.clone(),
        node.state,
        view.is_eligible(node),
    )
}

/// What the routes depend on, per node: its ownership input, whether it is
/// alive, its gRPC address, and the partitions it holds.
type RouteInput = (OwnershipInput, bool, String, PartitionSet);

/// The node's lifecycle and partition map, shared by the keeper and the
/// Admin RPCs.
pub struct Partitioning {
    inner: Mutex<NodePartitions>,
    settings: ViewSettings,
    data_dir: PathBuf,
    node_name: String,
    region: String,
    grpc_addr: String,
    replica: ReplicaId,
    membership: Arc<MembershipHandle>,
    /// The ownership inputs the metrics were last computed from.
    last_inputs: Mutex<Option<Vec<OwnershipInput>>>,
    /// Where each key's requests go, rebuilt when its inputs change.
    routes: RwLock<Arc<RouteTable>>,
    /// Whether `routes` serves every key here: read on every request, so
    /// the single-node and one-node-per-region paths cost one atomic load.
    routes_all_local: AtomicBool,
    /// The route inputs `routes` was last built from.
    last_route_inputs: Mutex<Option<Vec<RouteInput>>>,
}

impl Partitioning {
    /// The lifecycle as `data_dir`'s file recorded it (`None`: a new
    /// directory, the node joins), published at once, with the node's
    /// holdings recovered from it: `serving` (see [`recovered_serving`]) as
    /// of durable sequence `recovered_seq`. Call [`Partitioning::start`]
    /// before serving requests.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        record: Option<LifecycleRecord>,
        serving: &PartitionSet,
        recovered_seq: u64,
        data_dir: PathBuf,
        replica: ReplicaId,
        node_name: &str,
        region: &str,
        grpc_addr: &str,
        settings: ViewSettings,
        membership: Arc<MembershipHandle>,
    ) -> Arc<Partitioning> {
        let partitions = NodePartitions::new(
            replica,
            node_name,
            region,
            record,
            serving,
            recovered_seq,
            settings,
        );
        if partitions.state() == NodeState::Left {
            tracing::error!(
                replica = %replica,
                "this node has left the cluster (drained, or removed by tally admin remove): it owns and holds no partition; \
                 to bring this machine back, wipe its data directory and start it again as a new node"
            );
        }
        let partitioning = Arc::new(Partitioning {
            inner: Mutex::new(partitions),
            settings,
            data_dir,
            node_name: node_name.to_string(),
            region: region.to_string(),
            grpc_addr: grpc_addr.to_string(),
            replica,
            membership,
            last_inputs: Mutex::new(None),
            routes: RwLock::new(Arc::new(RouteTable::local(settings.partitions))),
            routes_all_local: AtomicBool::new(true),
            last_route_inputs: Mutex::new(None),
        });
        {
            let inner = partitioning.lock();
            partitioning.publish(&inner.publication());
        }
        partitioning
    }

    /// Before the node serves: the replica serves what was recovered, and
    /// the first round runs now if the node has heard the cluster already
    /// (it waited for its name's holders), so that a node that is alone, or
    /// whose seeds answered, is ready with its routes.
    pub fn start(&self, engine: &Engine) {
        self.lock().start(&mut engine.core());
        self.handle_round(engine, self.membership.member_lifecycles());
    }

    /// Whether this node has had a view of the cluster to decide what it
    /// holds and where keys go (`/readyz` waits for it).
    pub fn has_view(&self) -> bool {
        self.lock().has_view()
    }

    /// The replicas removed from the cluster (`tally admin remove`, here
    /// or learned through gossip): every partition they wrote moved away
    /// for good, so the fold keeper retires them. Takes this module's lock,
    /// which is taken before the core's: never call it holding the core.
    pub fn removed(&self) -> Vec<ReplicaId> {
        self.lock().removed().iter().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NodePartitions> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, publication: &Publication) {
        self.membership.publish_lifecycle(
            publication.state,
            &publication.removed,
            &publication.drain_requests,
        );
        self.membership
            .publish_holding(&publication.serving, &publication.releasing);
    }

    /// What to pull from the node named `peer` now: the partitions it
    /// serves that this node keeps; `None` for a node that serves none.
    pub fn pull_scope(&self, peer: &str) -> Option<PullScope> {
        self.lock().pull_scope(peer)
    }

    /// The names of the nodes worth pulling from now: those that serve a
    /// partition this node keeps (see [`Self::pull_scope`]).
    pub fn pull_sources(&self) -> BTreeSet<String> {
        self.lock().pull_sources()
    }

    /// A pull planned by [`Self::pull_scope`] (or a series of pulls that
    /// copied from scratch) reached the peer's durable sequence
    /// `through_seq`, having been served `served` throughout, and what it
    /// merged is durable here.
    pub fn handle_pulled(
        &self,
        scope: &PullScope,
        served: &PartitionSet,
        through_seq: u64,
        read_from_scratch: &PartitionSet,
    ) {
        self.lock()
            .handle_pulled(scope, served, through_seq, read_from_scratch);
    }

    /// The confirmations to ask for now: per owner, the partitions this
    /// node releases that it has not confirmed through their latest change.
    pub fn confirm_requests(&self) -> BTreeMap<String, PartitionSet> {
        self.lock().confirm_requests()
    }

    /// Answers node `asker`, which releases `partitions`: for each that this
    /// node holds up to date and has pulled from the asker, the asker's
    /// sequence it pulled through.
    pub fn answer_confirms(&self, asker: &str, partitions: &PartitionSet) -> Vec<(Partition, u64)> {
        self.lock().answer_confirms(asker, partitions)
    }

    /// Owner `owner`'s answers (partitions it left out are not confirmed).
    pub fn handle_confirms(&self, owner: &str, answers: &[(Partition, u64)]) {
        self.lock().handle_confirms(owner, answers);
    }

    /// One bounded step of the purge of partitions no longer kept (see
    /// `replica/purge.rs`): `None` when no pass runs. The partitioning's
    /// lock is held throughout, so no partition becomes kept (and starts
    /// being copied in) while the step decides what is not.
    pub fn purge_step(
        &self,
        engine: &Engine,
        limit: usize,
    ) -> Result<Option<PurgeStep>, crate::replica::StorageError> {
        let inner = self.lock();
        if !inner.has_view() {
            return Ok(None);
        }
        let store = engine.store().clone();
        let mut core = engine.core();
        inner.purge_step(now_ms(), &mut core, &*store, limit)
    }

    /// Partitions held here per state, for status: (serving, receiving, releasing).
    pub fn holdings(&self) -> (PartitionSet, PartitionSet, PartitionSet) {
        self.lock().holdings()
    }

    /// The settings views are built with.
    pub fn settings(&self) -> ViewSettings {
        self.settings
    }

    /// This node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// This node's region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// This node's state.
    pub fn state(&self) -> NodeState {
        self.lock().state()
    }

    /// The cluster as this node sees it now, with each node's replica id and
    /// gRPC address (this node's included), by name.
    pub fn view(&self) -> (ClusterView, BTreeMap<String, (ReplicaId, String)>) {
        let inner = self.lock();
        let view = inner.view(now_ms());
        let mut endpoints = inner.endpoints();
        endpoints.insert(
            self.node_name.clone(),
            (self.replica, self.grpc_addr.clone()),
        );
        (view, endpoints)
    }

    /// Persists the record of the core's pending `change` if it changed,
    /// then publishes and commits it: a change that cannot be persisted is
    /// not made (dropping a pending change changes nothing).
    fn change<T>(
        &self,
        change: impl FnOnce(&mut NodePartitions) -> Result<PendingChange<'_, T>, AdminRefusal>,
    ) -> Result<T, LifecycleError> {
        let mut inner = self.lock();
        let pending = change(&mut inner)?;
        if let Some(record) = pending.record_to_persist() {
            lifecycle_file::store(&self.data_dir, &record)?;
        }
        self.publish(&pending.publication());
        Ok(pending.commit())
    }

    /// `tally admin drain NODE`.
    pub fn drain(&self, node: &str) -> Result<DrainStep, LifecycleError> {
        let step = self.change(|partitions| partitions.drain(now_ms(), node))?;
        if step == DrainStep::DrainingNow {
            tracing::info!(node = %node, "draining: this node owns no partition from now on");
        }
        Ok(step)
    }

    /// `tally admin remove NODE`: returns the replicas newly removed.
    pub fn remove(&self, node: &str) -> Result<Vec<ReplicaId>, LifecycleError> {
        let removed = self.change(|partitions| partitions.remove(now_ms(), node))?;
        for replica in &removed {
            tracing::info!(node = %node, %replica, "node removed by an operator: it owns no partition from now on");
        }
        Ok(removed)
    }

    /// Where keys' requests go, or `None` when every key is served here
    /// (one node in the region, or no view yet): the request path's check.
    pub fn routes(&self) -> Option<Arc<RouteTable>> {
        if self.routes_all_local.load(Ordering::Acquire) {
            return None;
        }
        Some(
            self.routes
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }

    /// Rebuilds the route table from `view`, and recounts the
    /// under-replicated partitions of every region, when what they depend on
    /// changed.
    fn update_routes(
        &self,
        view: &ClusterView,
        endpoints: &BTreeMap<String, (ReplicaId, String)>,
        metrics: &crate::metrics::Metrics,
    ) {
        let inputs: Vec<RouteInput> = view
            .nodes()
            .map(|node| {
                (
                    ownership_input(view, node),
                    node.alive,
                    endpoints
                        .get(&node.name)
                        .map(|(_, addr)| addr.clone())
                        .unwrap_or_default(),
                    node.holding.clone(),
                )
            })
            .collect();
        let mut last = self
            .last_route_inputs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.as_ref() == Some(&inputs) {
            return;
        }
        let table = RouteTable::build(view, &self.node_name, |name| {
            endpoints.get(name).map(|(_, addr)| addr.clone())
        });
        let all_local = table.all_local();
        *self.routes.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
        self.routes_all_local.store(all_local, Ordering::Release);
        *last = Some(inputs);
        for region in view.regions() {
            metrics
                .partitions_under_replicated
                .get_or_create(&crate::metrics::RegionLabels {
                    region: region.to_string(),
                })
                .set(view.under_replicated(region).len() as i64);
        }
    }

    /// The state `node` publishes, as this node last heard it.
    pub fn published_state(&self, replica: ReplicaId) -> Option<NodeState> {
        self.lock().published_state(replica)
    }

    /// One round: the members' facts to the core's round; its record
    /// persisted if it changed (or nothing changes: the next round retries),
    /// then the round committed (the replica told what it serves), the
    /// lifecycle and holdings published; the routes and metrics updated.
    fn handle_round(&self, engine: &Engine, members: Vec<MemberFacts>) {
        let heard = self.membership.has_heard_the_cluster();
        let durable_seq = *engine.durable_seq().borrow();
        let outcome = {
            let mut inner = self.lock();
            let pending =
                inner.handle_round(now_ms(), members, heard, durable_seq, &mut engine.core());
            if let Some(record) = pending.record_to_persist() {
                if let Err(error) = lifecycle_file::store(&self.data_dir, &record) {
                    tracing::error!(%error, "cannot persist this node's lifecycle; retrying next round");
                    return;
                }
            }
            let outcome = pending.commit(&mut engine.core());
            self.publish(&outcome.publication);
            outcome
        };
        let deleted = &outcome.deleted;
        if !deleted.is_empty() {
            let deleted: Vec<String> = deleted.iter().map(|p| p.0.to_string()).collect();
            tracing::info!(partitions = %deleted.join(","), "partitions handed off: every owner confirmed holding this node's changes of them (or they were copies only); no longer served here, their counters are being deleted");
        }
        if let Some((before, after)) = outcome.state_change {
            tracing::info!(from = %before, to = %after, "lifecycle state changed");
        }
        let (serving, receiving, releasing) = self.holdings();
        for (state, count) in [
            ("receiving", receiving.len()),
            ("ready", serving.len() - releasing.len()),
            ("releasing", releasing.len()),
        ] {
            engine
                .metrics()
                .partitions_held
                .get_or_create(&crate::metrics::HoldingLabels {
                    state: state.to_string(),
                })
                .set(count as i64);
        }
        let (view, endpoints) = self.view();
        self.update_routes(&view, &endpoints, engine.metrics());
        // Ownership is a function of these inputs only: recount (P rankings
        // of the region's nodes) only when they change, not every round.
        let inputs: Vec<OwnershipInput> = view
            .nodes()
            .map(|node| ownership_input(&view, node))
            .collect();
        let metrics = engine.metrics();
        {
            let mut last = self.last_inputs.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_ref() != Some(&inputs) {
                metrics
                    .partitions_owned
                    .set(view.owned_by(&self.node_name).len() as i64);
                *last = Some(inputs);
            }
        }
        let regions: BTreeSet<&str> = view.regions().into_iter().collect();
        for region in regions {
            for state in [
                NodeState::Joining,
                NodeState::Active,
                NodeState::Draining,
                NodeState::Left,
            ] {
                let count = view
                    .nodes()
                    .filter(|node| node.region == region && node.state == state)
                    .count();
                metrics
                    .nodes
                    .get_or_create(&crate::metrics::NodeStateLabels {
                        region: region.to_string(),
                        state: state.as_str().to_string(),
                    })
                    .set(count as i64);
            }
        }
    }
}

/// Runs the lifecycle once per `period` until aborted.
pub fn spawn_lifecycle_keeper(
    engine: Arc<Engine>,
    partitioning: Arc<Partitioning>,
    period: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let members = partitioning.membership.member_lifecycles();
            partitioning.handle_round(&engine, members);
        }
    })
}
