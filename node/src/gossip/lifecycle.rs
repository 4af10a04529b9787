//! The runtime shell of the node's lifecycle and partition map (DESIGN.md
//! "Partitioned regions"): once per gossip round, [`spawn_lifecycle_keeper`]
//! feeds the members' gossiped lifecycle facts to the pure
//! [`Lifecycle`], persists its record in the
//! data directory's `LIFECYCLE` file when it changes (before publishing it),
//! publishes the node's state, removals and drain requests, and sets the
//! partition metrics. [`Partitioning`] is what the Admin RPCs use: the
//! current [`ClusterView`], `drain` and `remove`.
//!
//! Invariants: a lifecycle change is on disk before any peer can see it (so
//! a crash never makes a node take back what it announced); a change that
//! cannot be persisted is not made (the operator's call fails, or the round
//! is retried). The owners come from the pure core only: every node with
//! the same membership facts serves the same map.
//!
//! It also drives the node's [`Holdings`] (which partitions it receives,
//! serves and releases): each round after the node has heard the cluster
//! (see [`Partitioning::has_view`]) the view goes in, the served partitions
//! are persisted (in `LIFECYCLE`), then handed to the replica (which refuses
//! adds of others), then published in gossip, in that order, so that no
//! peer routes a key here before this node takes it, and a restart resumes
//! serving every partition that took adds here. The anti-entropy loop asks
//! it what to pull from whom ([`Partitioning::pull_scope`]) and reports
//! complete pulls ([`Partitioning::handle_pulled`]). A joining node becomes
//! active once it receives nothing. Releasing partitions are kept and served
//! until every owner confirmed holding this node's changes of them
//! ([`Partitioning::confirm_requests`], asked by `release.rs`); then each
//! round stops serving them (under the core's lock, so no add slips in),
//! persists and publishes that, and starts the purge of what is stored of
//! them ([`Partitioning::purge_step`]).
//!
//! It also keeps the node's [`RouteTable`] ([`Partitioning::routes`]),
//! rebuilt when membership, liveness, an address or what a node holds
//! changes, which the `Counters` service forwards by.

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
    AdminRefusal, ClusterView, DrainStep, Holdings, Lifecycle, LifecycleRecord, MemberFacts,
    NodeState, Partition, PartitionSet, PullScope, RouteTable, ViewSettings,
};
use crate::replica::PurgeStep;

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

struct Inner {
    lifecycle: Lifecycle,
    holdings: Holdings,
    /// Whether `holdings` has had a view of the cluster: until then this
    /// node serves only what it recovered, and knows no route.
    has_view: bool,
    /// What the replica was last told to serve, and to keep. `holdings`
    /// changes between rounds too (a pull completes a copy), and only a
    /// round persists, applies and publishes what it serves.
    replica_scope: Option<ReplicaScope>,
}

/// The partitions a replica serves, and those it keeps (served, being
/// copied in, or being handed away).
type ReplicaScope = (PartitionSet, PartitionSet);

/// Tells the replica what `holdings` serve and keep; returns it.
fn scope_replica(core: &mut crate::replica::Replica, holdings: &Holdings) -> ReplicaScope {
    let scope = (holdings.serving(), holdings.kept());
    core.set_serving(Some(scope.0.clone()));
    core.set_kept(Some(scope.1.clone()));
    scope
}

/// The partitions a node recovers as served from its `LIFECYCLE` record:
/// those the record names; every one for a directory of a build before
/// handoff (the record names none, or there is no record but the store
/// holds data: such a node stored every counter and may hold adds no other
/// node has); none for a new directory.
pub fn recovered_serving(
    record: Option<&LifecycleRecord>,
    partitions: crate::partition::PartitionCount,
    store_has_data: bool,
) -> PartitionSet {
    match record {
        Some(LifecycleRecord {
            serving: Some(serving),
            ..
        }) => serving.clone(),
        Some(_) => PartitionSet::full(partitions),
        None if store_has_data => PartitionSet::full(partitions),
        None => PartitionSet::empty(partitions),
    }
}

/// The node's lifecycle and partition map, shared by the keeper and the
/// Admin RPCs.
pub struct Partitioning {
    inner: Mutex<Inner>,
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
        let mut lifecycle = Lifecycle::new(replica, node_name, region, record);
        let holdings = Holdings::recover(
            node_name,
            region,
            settings.partitions,
            serving,
            recovered_seq,
        );
        lifecycle.set_own_holding(holdings.serving(), holdings.releasing());
        if lifecycle.state() == NodeState::Left {
            tracing::error!(
                replica = %replica,
                "this node has left the cluster (drained, or removed by tally admin remove): it owns and holds no partition; \
                 to bring this machine back, wipe its data directory and start it again as a new node"
            );
        }
        let partitioning = Arc::new(Partitioning {
            inner: Mutex::new(Inner {
                lifecycle,
                holdings,
                has_view: false,
                replica_scope: None,
            }),
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
            partitioning.publish(&inner.lifecycle, &inner.holdings);
        }
        partitioning
    }

    /// Before the node serves: the replica serves what was recovered, and
    /// the first round runs now if the node has heard the cluster already
    /// (it waited for its name's holders), so that a node that is alone, or
    /// whose seeds answered, is ready with its routes.
    pub fn start(&self, engine: &Engine) {
        {
            let mut inner = self.lock();
            let scope = scope_replica(&mut engine.core(), &inner.holdings);
            inner.replica_scope = Some(scope);
        }
        self.handle_round(engine, self.membership.member_lifecycles());
    }

    /// Whether this node has had a view of the cluster to decide what it
    /// holds and where keys go (`/readyz` waits for it).
    pub fn has_view(&self) -> bool {
        self.lock().has_view
    }

    /// The replicas removed from the cluster (`tally admin remove`, here
    /// or learned through gossip): every partition they wrote moved away
    /// for good, so the fold keeper retires them. Takes this module's lock,
    /// which is taken before the core's: never call it holding the core.
    pub fn removed(&self) -> Vec<ReplicaId> {
        self.lock().lifecycle.removed().iter().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, lifecycle: &Lifecycle, holdings: &Holdings) {
        self.membership.publish_lifecycle(
            lifecycle.state(),
            lifecycle.removed(),
            lifecycle.drain_requests(),
        );
        self.membership
            .publish_holding(&holdings.serving(), &holdings.releasing());
    }

    /// What to pull from the node named `peer` now: the partitions it
    /// serves that this node keeps; `None` for a node that serves none.
    pub fn pull_scope(&self, peer: &str) -> Option<PullScope> {
        self.lock().holdings.poll_pull_scope(peer)
    }

    /// The names of the nodes worth pulling from now: those that serve a
    /// partition this node keeps (see [`Self::pull_scope`]).
    pub fn pull_sources(&self) -> BTreeSet<String> {
        let inner = self.lock();
        inner
            .lifecycle
            .representatives()
            .into_iter()
            .filter(|(name, _)| inner.holdings.poll_pull_scope(name).is_some())
            .map(|(name, _)| name.to_string())
            .collect()
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
            .holdings
            .handle_pulled(scope, served, through_seq, read_from_scratch);
    }

    /// Decides which released partitions go now (see
    /// [`Holdings::poll_deletions`]), and stops serving them, under the
    /// core's lock: their latest changes and quietness are read there, and
    /// no add can land in a partition between the check and the replica's
    /// refusal of it. Tracking each partition's latest change starts with
    /// the first release (commits before count as changing every partition).
    fn delete_released(&self, engine: &Engine, holdings: &mut Holdings) -> Vec<Partition> {
        let releasing = holdings.releasing();
        let receiving = holdings.receiving();
        if releasing.is_empty() && receiving.is_empty() {
            return Vec::new();
        }
        let count = self.settings.partitions;
        let mut core = engine.core();
        if !releasing.is_empty() {
            let since = core.changes_durable_at();
            core.track_partition_changes(count, since);
        }
        for partition in releasing.iter() {
            if let Some(seq) = core.latest_change(partition) {
                holdings.handle_change(partition, seq);
            }
        }
        holdings.handle_durable(core.durable_seq());
        let deleted = holdings.poll_deletions(|partition| core.partition_quiet(count, partition));
        if !deleted.is_empty() {
            scope_replica(&mut core, holdings);
        }
        deleted
    }

    /// Holds back from serving the partitions this node may not write yet
    /// (its slots there wait for a fold, `replica/fold_scoped.rs`): caught
    /// up, they stay receiving and the other owners serve them. With
    /// `raise`, each caught up and held back first raises its applied fold
    /// epoch past the records it holds no slot of (it was copied folded),
    /// which opens the gate once the fold of its own slots is behind it.
    fn hold_back_gated(&self, engine: &Engine, holdings: &mut Holdings, raise: bool) {
        let all = PartitionSet::full(self.settings.partitions);
        let mut core = engine.core();
        if raise {
            for partition in holdings.caught_up_held_back() {
                let epoch = core.raise_copied(partition);
                tracing::debug!(
                    partition = partition.0,
                    epoch,
                    "a partition copied in waits for this node's write gate"
                );
            }
        }
        holdings.set_held_back(core.write_gated(&all));
    }

    /// The confirmations to ask for now: per owner, the partitions this
    /// node releases that it has not confirmed through their latest change.
    pub fn confirm_requests(&self) -> BTreeMap<String, PartitionSet> {
        let inner = self.lock();
        let mut requests: BTreeMap<String, PartitionSet> = BTreeMap::new();
        for request in inner.holdings.poll_confirm_requests() {
            requests
                .entry(request.owner)
                .or_insert_with(|| PartitionSet::empty(self.settings.partitions))
                .insert(request.partition);
        }
        requests
    }

    /// Answers node `asker`, which releases `partitions`: for each that this
    /// node holds up to date and has pulled from the asker, the asker's
    /// sequence it pulled through.
    pub fn answer_confirms(&self, asker: &str, partitions: &PartitionSet) -> Vec<(Partition, u64)> {
        let inner = self.lock();
        partitions
            .iter()
            .filter_map(|partition| {
                let seq = inner.holdings.answer_confirm(partition, asker)?;
                Some((partition, seq))
            })
            .collect()
    }

    /// Owner `owner`'s answers (partitions it left out are not confirmed).
    pub fn handle_confirms(&self, owner: &str, answers: &[(Partition, u64)]) {
        let mut inner = self.lock();
        for (partition, seq) in answers {
            inner.holdings.handle_confirm(*partition, owner, Some(*seq));
        }
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
        if !inner.has_view {
            return Ok(None);
        }
        let kept = inner.holdings.kept();
        let count = self.settings.partitions;
        let store = engine.store().clone();
        let mut core = engine.core();
        if !core.purging() {
            return Ok(None);
        }
        core.poll_purge(now_ms(), &*store, limit, |key| {
            kept.contains(count.of_key(key.as_bytes()))
        })
        .map(Some)
    }

    /// Partitions held here per state, for status: (serving, receiving, releasing).
    pub fn holdings(&self) -> (PartitionSet, PartitionSet, PartitionSet) {
        let inner = self.lock();
        let holdings = &inner.holdings;
        (
            holdings.serving(),
            holdings.receiving(),
            holdings.releasing(),
        )
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
        self.lock().lifecycle.state()
    }

    /// The cluster as this node sees it now, with each node's replica id and
    /// gRPC address (this node's included), by name.
    pub fn view(&self) -> (ClusterView, BTreeMap<String, (ReplicaId, String)>) {
        let inner = self.lock();
        let view = inner.lifecycle.view(now_ms(), self.settings);
        let mut endpoints: BTreeMap<String, (ReplicaId, String)> = inner
            .lifecycle
            .representatives()
            .into_iter()
            .map(|(name, member)| (name.to_string(), (member.replica, member.grpc_addr.clone())))
            .collect();
        endpoints.insert(
            self.node_name.clone(),
            (self.replica, self.grpc_addr.clone()),
        );
        (view, endpoints)
    }

    /// Applies `change` to a copy of the lifecycle, persists the copy's
    /// record if it changed, then keeps and publishes it: a change that
    /// cannot be persisted is not made.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Lifecycle) -> Result<T, LifecycleError>,
    ) -> Result<T, LifecycleError> {
        let mut inner = self.lock();
        let mut next = inner.lifecycle.clone();
        let outcome = change(&mut next)?;
        if next.record() != inner.lifecycle.record() {
            lifecycle_file::store(&self.data_dir, &next.record())?;
        }
        self.publish(&next, &inner.holdings);
        inner.lifecycle = next;
        Ok(outcome)
    }

    /// `tally admin drain NODE`.
    pub fn drain(&self, node: &str) -> Result<DrainStep, LifecycleError> {
        let settings = self.settings;
        let step = self.change(|lifecycle| {
            let view = lifecycle.view(now_ms(), settings);
            Ok(lifecycle.handle_drain(node, &view)?)
        })?;
        if step == DrainStep::DrainingNow {
            tracing::info!(node = %node, "draining: this node owns no partition from now on");
        }
        Ok(step)
    }

    /// `tally admin remove NODE`: returns the replicas newly removed.
    pub fn remove(&self, node: &str) -> Result<Vec<ReplicaId>, LifecycleError> {
        let settings = self.settings;
        let removed = self.change(|lifecycle| {
            let view = lifecycle.view(now_ms(), settings);
            Ok(lifecycle.handle_remove(node, &view)?)
        })?;
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
        self.lock()
            .lifecycle
            .members()
            .iter()
            .find(|member| member.replica == replica)
            .map(|member| member.state)
    }

    /// One round: the members' facts in; once the node has heard the
    /// cluster, the view to the holdings; the record persisted if it
    /// changed, the served partitions handed to the replica, the lifecycle
    /// and holdings published; the routes and metrics updated.
    fn handle_round(&self, engine: &Engine, members: Vec<MemberFacts>) {
        let heard = self.membership.has_heard_the_cluster();
        let durable_seq = *engine.durable_seq().borrow();
        let (before, after, deleted) = {
            let mut inner = self.lock();
            let before = inner.lifecycle.state();
            let now = now_ms();
            let mut lifecycle = inner.lifecycle.clone();
            let mut holdings = inner.holdings.clone();
            // A joining node is caught up once it receives nothing more.
            let caught_up = inner.has_view && holdings.receiving().is_empty();
            lifecycle.handle_members(now, members, caught_up);
            let mut deleted = Vec::new();
            if heard {
                holdings.handle_durable(durable_seq);
                // Against the last round's view, which the routes in use
                // were built from: a partition goes only once they send
                // its keys to owners that hold it (see `poll_deletions`).
                deleted = self.delete_released(engine, &mut holdings);
                if !deleted.is_empty() {
                    // The replica was told at once (see `delete_released`).
                    inner.replica_scope = Some((holdings.serving(), holdings.kept()));
                }
                self.hold_back_gated(engine, &mut holdings, false);
                holdings.handle_view(&lifecycle.view(now, self.settings));
                self.hold_back_gated(engine, &mut holdings, true);
                lifecycle.set_own_holding(holdings.serving(), holdings.releasing());
                lifecycle.handle_drained(inner.has_view && holdings.kept().is_empty());
            }
            if lifecycle.record() != inner.lifecycle.record() {
                if let Err(error) = lifecycle_file::store(&self.data_dir, &lifecycle.record()) {
                    tracing::error!(%error, "cannot persist this node's lifecycle; retrying next round");
                    return;
                }
            }
            let scope = (holdings.serving(), holdings.kept());
            if inner.replica_scope.as_ref() != Some(&scope) {
                inner.replica_scope = Some(scope_replica(&mut engine.core(), &holdings));
            }
            self.publish(&lifecycle, &holdings);
            let after = lifecycle.state();
            // What is stored of a partition goes only once the record no
            // longer names it as served: a restart never serves a
            // partition half purged. The first view purges what a crash
            // left of partitions no longer kept.
            let first_view = heard && !inner.has_view;
            // A node that drains or has left never owns a partition again:
            // its purge drops its own slots too, those kept before included.
            let departing = engine
                .core()
                .set_departing(!lifecycle.state().takes_ownership());
            if !deleted.is_empty() || departing || (first_view && !holdings.kept().is_full()) {
                engine.core().start_purge();
            }
            inner.lifecycle = lifecycle;
            inner.holdings = holdings;
            inner.has_view |= heard;
            (before, after, deleted)
        };
        if !deleted.is_empty() {
            let deleted: Vec<String> = deleted.iter().map(|p| p.0.to_string()).collect();
            tracing::info!(partitions = %deleted.join(","), "partitions handed off: every owner confirmed holding this node's changes of them (or they were copies only); no longer served here, their counters are being deleted");
        }
        if before != after {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{Partition, PartitionCount};

    #[test]
    fn a_directory_serves_what_its_record_names_or_everything_it_held_before_handoff() {
        let count = PartitionCount::new(8).unwrap();
        let mut named = PartitionSet::empty(count);
        named.insert(Partition(5));
        let record = |serving: Option<PartitionSet>| LifecycleRecord {
            state: NodeState::Active,
            removed: Default::default(),
            serving,
        };
        let with = record(Some(named.clone()));
        assert_eq!(recovered_serving(Some(&with), count, true), named);
        let before_handoff = record(None);
        assert!(recovered_serving(Some(&before_handoff), count, false).is_full());
        assert!(
            recovered_serving(None, count, true).is_full(),
            "data, no record"
        );
        assert!(
            recovered_serving(None, count, false).is_empty(),
            "a new directory"
        );
    }
}
