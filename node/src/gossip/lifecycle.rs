//! The runtime shell of the node's lifecycle and partition map (DESIGN.md
//! "Partitioned regions"): once per gossip round, [`spawn_lifecycle_keeper`]
//! feeds the members' gossiped lifecycle facts to the pure
//! [`Lifecycle`](crate::partition::Lifecycle), persists its record in the
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
//! It also keeps the node's [`RouteTable`] ([`Partitioning::routes`]),
//! rebuilt when membership, liveness or an address changes, which the
//! `Counters` service forwards by. Storage and sync are not scoped by
//! ownership yet (every node still holds every counter).

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
    AdminRefusal, ClusterView, DrainStep, Lifecycle, LifecycleRecord, MemberFacts, NodeState,
    RouteTable, ViewSettings,
};

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
/// alive, and its gRPC address.
type RouteInput = (OwnershipInput, bool, String);

struct Inner {
    lifecycle: Lifecycle,
    /// While joining: each live peer of the region's durable sequence when
    /// first seen; caught up once every watermark reaches it.
    join_targets: BTreeMap<ReplicaId, u64>,
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
    /// directory, the node joins), published at once.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        record: Option<LifecycleRecord>,
        data_dir: PathBuf,
        replica: ReplicaId,
        node_name: &str,
        region: &str,
        grpc_addr: &str,
        settings: ViewSettings,
        membership: Arc<MembershipHandle>,
    ) -> Arc<Partitioning> {
        let lifecycle = Lifecycle::new(replica, node_name, region, record);
        if lifecycle.state() == NodeState::Left {
            tracing::error!(
                replica = %replica,
                "this node was removed from the cluster (tally admin remove): it owns no partition; \
                 to bring this machine back, wipe its data directory and start it again as a new node"
            );
        }
        let partitioning = Arc::new(Partitioning {
            inner: Mutex::new(Inner {
                lifecycle,
                join_targets: BTreeMap::new(),
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
        partitioning.publish(&partitioning.lock().lifecycle);
        partitioning
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, lifecycle: &Lifecycle) {
        self.membership.publish_lifecycle(
            lifecycle.state(),
            lifecycle.removed(),
            lifecycle.drain_requests(),
        );
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
        self.publish(&next);
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

    /// One round: the members' facts in, the record persisted if it
    /// changed, the lifecycle published, the metrics set.
    fn handle_round(&self, engine: &Engine, members: Vec<MemberFacts>) {
        let caught_up = {
            let mut inner = self.lock();
            inner.lifecycle.state() != NodeState::Joining || {
                let Inner { join_targets, .. } = &mut *inner;
                caught_up(engine, &self.region, join_targets)
            }
        };
        let before = self.state();
        let result = self.change(|lifecycle| {
            lifecycle.handle_members(now_ms(), members, caught_up);
            Ok(())
        });
        if let Err(error) = result {
            tracing::error!(%error, "cannot persist this node's lifecycle; retrying next round");
            return;
        }
        let after = self.state();
        if before != after {
            tracing::info!(from = %before, to = %after, "lifecycle state changed");
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

/// Whether a joining node has caught up with its region: every live peer
/// of the region it talks with has been pulled from up to the durable
/// sequence that peer published when this node first saw it.
fn caught_up(engine: &Engine, region: &str, targets: &mut BTreeMap<ReplicaId, u64>) -> bool {
    let core = engine.core();
    let peers = core.peers();
    let caught_up = peers
        .peers()
        .filter(|peer| {
            peer.member.region == region && peer.member.alive && peers.talks_with(&peer.member)
        })
        .all(|peer| {
            let target = *targets
                .entry(peer.member.replica)
                .or_insert(peer.member.durable_seq);
            peers.watermark(peer.member.replica).complete_seq() >= target
        });
    caught_up
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
