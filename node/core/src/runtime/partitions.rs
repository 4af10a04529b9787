//! One node's lifecycle and partition holdings as its runtime drives them
//! (DESIGN.md "Partitioned regions"): [`NodePartitions`] holds the node's
//! [`Lifecycle`], its [`Holdings`] (which partitions it receives, serves and
//! releases), whether it has had a view of the cluster, and what its replica
//! was last told to serve and keep. No IO: the caller persists the
//! lifecycle record, publishes, logs and sets metrics with what comes out.
//!
//! The anti-entropy loop asks it what to pull from whom
//! ([`NodePartitions::pull_scope`]) and reports complete pulls
//! ([`NodePartitions::handle_pulled`]). Releasing partitions are kept and
//! served until every owner confirmed holding this node's changes of them
//! ([`NodePartitions::confirm_requests`]); then a round (`round.rs`) stops
//! serving them, and the purge ([`NodePartitions::purge_step`]) deletes
//! what is stored of them.
//!
//! Invariants: a change that cannot be persisted is not made. An operator's
//! drain or removal is computed on a copy of the lifecycle
//! ([`PendingChange`]), which the caller commits only once the record it
//! names is stored; the borrow of the struct lasts until then, so nothing
//! else changes it in between. The owners come from the pure core only:
//! every node with the same membership facts serves the same map.

use std::collections::{BTreeMap, BTreeSet};

use crate::crdt::ReplicaId;
use crate::partition::{
    AdminRefusal, ClusterView, DrainStep, Holdings, Lifecycle, LifecycleRecord, NodeState,
    Partition, PartitionCount, PartitionSet, PullScope, ViewSettings,
};
use crate::replica::{DurableState, PurgeStep, Replica, StorageError};

/// The partitions a replica serves, and those it keeps (served, being
/// copied in, or being handed away).
pub type ReplicaScope = (PartitionSet, PartitionSet);

/// Tells the replica what `holdings` serve and keep; returns it.
pub(super) fn scope_replica(core: &mut Replica, holdings: &Holdings) -> ReplicaScope {
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
    partitions: PartitionCount,
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

/// What a node publishes in gossip of its lifecycle and holdings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    /// Its own state.
    pub state: NodeState,
    /// The replicas it knows to be removed.
    pub removed: BTreeSet<ReplicaId>,
    /// The drains it asks of others.
    pub drain_requests: BTreeSet<ReplicaId>,
    /// The partitions it serves (ready or releasing).
    pub serving: PartitionSet,
    /// Those of `serving` it is handing away.
    pub releasing: PartitionSet,
}

impl Publication {
    pub(super) fn of(lifecycle: &Lifecycle, holdings: &Holdings) -> Self {
        Publication {
            state: lifecycle.state(),
            removed: lifecycle.removed().clone(),
            drain_requests: lifecycle.drain_requests().clone(),
            serving: holdings.serving(),
            releasing: holdings.releasing(),
        }
    }
}

/// One node's lifecycle and partition map; see the module documentation.
#[derive(Clone, Debug)]
pub struct NodePartitions {
    pub(super) lifecycle: Lifecycle,
    pub(super) holdings: Holdings,
    /// Whether `holdings` has had a view of the cluster: until then this
    /// node serves only what it recovered, and knows no route.
    pub(super) has_view: bool,
    /// What the replica was last told to serve, and to keep. `holdings`
    /// changes between rounds too (a pull completes a copy), and only a
    /// round persists, applies and publishes what it serves.
    pub(super) replica_scope: Option<ReplicaScope>,
    pub(super) settings: ViewSettings,
}

impl NodePartitions {
    /// Node `node_name` of `region` (replica `replica`), with the lifecycle
    /// as its data directory recorded it (`None`: a new directory, the node
    /// joins) and its holdings recovered from it: `serving` (see
    /// [`recovered_serving`]) as of durable sequence `recovered_seq`. Call
    /// [`NodePartitions::start`] before the replica serves requests.
    pub fn new(
        replica: ReplicaId,
        node_name: &str,
        region: &str,
        record: Option<LifecycleRecord>,
        serving: &PartitionSet,
        recovered_seq: u64,
        settings: ViewSettings,
    ) -> Self {
        let mut lifecycle = Lifecycle::new(replica, node_name, region, record);
        let holdings = Holdings::recover(
            node_name,
            region,
            settings.partitions,
            serving,
            recovered_seq,
        );
        lifecycle.set_own_holding(holdings.serving(), holdings.releasing());
        NodePartitions {
            lifecycle,
            holdings,
            has_view: false,
            replica_scope: None,
            settings,
        }
    }

    /// The replica serves and keeps what was recovered.
    pub fn start(&mut self, core: &mut Replica) {
        self.replica_scope = Some(scope_replica(core, &self.holdings));
    }

    /// The settings views are built with.
    pub fn settings(&self) -> ViewSettings {
        self.settings
    }

    /// Whether this node has had a view of the cluster to decide what it
    /// holds and where keys go.
    pub fn has_view(&self) -> bool {
        self.has_view
    }

    /// This node's state.
    pub fn state(&self) -> NodeState {
        self.lifecycle.state()
    }

    /// The replicas removed from the cluster (by an operator, here or
    /// learned through gossip).
    pub fn removed(&self) -> &BTreeSet<ReplicaId> {
        self.lifecycle.removed()
    }

    /// What this node publishes now.
    pub fn publication(&self) -> Publication {
        Publication::of(&self.lifecycle, &self.holdings)
    }

    /// The record of the lifecycle as committed (what is on disk).
    pub fn record(&self) -> LifecycleRecord {
        self.lifecycle.record()
    }

    /// Partitions held here per state: (serving, receiving, releasing).
    pub fn holdings(&self) -> (PartitionSet, PartitionSet, PartitionSet) {
        let holdings = &self.holdings;
        (
            holdings.serving(),
            holdings.receiving(),
            holdings.releasing(),
        )
    }

    /// The cluster as this node sees it at `now_ms`.
    pub fn view(&self, now_ms: u64) -> ClusterView {
        self.lifecycle.view(now_ms, self.settings)
    }

    /// The other nodes of the view, by name, with their replica id and
    /// gRPC address.
    pub fn endpoints(&self) -> BTreeMap<String, (ReplicaId, String)> {
        self.lifecycle
            .representatives()
            .into_iter()
            .map(|(name, member)| (name.to_string(), (member.replica, member.grpc_addr.clone())))
            .collect()
    }

    /// The state replica `replica` publishes, as this node last heard it.
    pub fn published_state(&self, replica: ReplicaId) -> Option<NodeState> {
        self.lifecycle
            .members()
            .iter()
            .find(|member| member.replica == replica)
            .map(|member| member.state)
    }

    /// What to pull from the node named `peer` now: the partitions it
    /// serves that this node keeps; `None` for a node that serves none.
    pub fn pull_scope(&self, peer: &str) -> Option<PullScope> {
        self.holdings.poll_pull_scope(peer)
    }

    /// The names of the nodes worth pulling from now: those that serve a
    /// partition this node keeps (see [`Self::pull_scope`]).
    pub fn pull_sources(&self) -> BTreeSet<String> {
        self.lifecycle
            .representatives()
            .into_iter()
            .filter(|(name, _)| self.holdings.poll_pull_scope(name).is_some())
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// A pull planned by [`Self::pull_scope`] (or a series of pulls that
    /// copied from scratch) reached the peer's durable sequence
    /// `through_seq`, having been served `served` throughout, and what it
    /// merged is durable here.
    pub fn handle_pulled(
        &mut self,
        scope: &PullScope,
        served: &PartitionSet,
        through_seq: u64,
        read_from_scratch: &PartitionSet,
    ) {
        self.holdings
            .handle_pulled(scope, served, through_seq, read_from_scratch);
    }

    /// The confirmations to ask for now: per owner, the partitions this
    /// node releases that it has not confirmed through their latest change.
    pub fn confirm_requests(&self) -> BTreeMap<String, PartitionSet> {
        let mut requests: BTreeMap<String, PartitionSet> = BTreeMap::new();
        for request in self.holdings.poll_confirm_requests() {
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
        partitions
            .iter()
            .filter_map(|partition| {
                let seq = self.holdings.answer_confirm(partition, asker)?;
                Some((partition, seq))
            })
            .collect()
    }

    /// Owner `owner`'s answers (partitions it left out are not confirmed).
    pub fn handle_confirms(&mut self, owner: &str, answers: &[(Partition, u64)]) {
        for (partition, seq) in answers {
            self.holdings.handle_confirm(*partition, owner, Some(*seq));
        }
    }

    /// One bounded step of the purge of partitions no longer kept (see
    /// `replica/purge.rs`) at `now_ms`, over `store`: `None` when no pass
    /// runs (no view yet, or no purge started). `self` stays borrowed
    /// throughout, so no partition becomes kept (and starts being copied
    /// in) while the step decides what is not.
    pub fn purge_step(
        &self,
        now_ms: u64,
        core: &mut Replica,
        store: &(impl DurableState + ?Sized),
        limit: usize,
    ) -> Result<Option<PurgeStep>, StorageError> {
        if !self.has_view || !core.purging() {
            return Ok(None);
        }
        let kept = self.holdings.kept();
        let count = self.settings.partitions;
        core.poll_purge(now_ms, store, limit, |key| {
            kept.contains(count.of_key(key.as_bytes()))
        })
        .map(Some)
    }

    /// `tally admin drain NODE` at `now_ms`, on a copy of the lifecycle:
    /// persist [`PendingChange::record_to_persist`], then commit.
    pub fn drain(
        &mut self,
        now_ms: u64,
        node: &str,
    ) -> Result<PendingChange<'_, DrainStep>, AdminRefusal> {
        self.change(|lifecycle, settings| {
            let view = lifecycle.view(now_ms, settings);
            lifecycle.handle_drain(node, &view)
        })
    }

    /// `tally admin remove NODE` at `now_ms`, on a copy of the lifecycle:
    /// the replicas newly removed, once committed.
    pub fn remove(
        &mut self,
        now_ms: u64,
        node: &str,
    ) -> Result<PendingChange<'_, Vec<ReplicaId>>, AdminRefusal> {
        self.change(|lifecycle, settings| {
            let view = lifecycle.view(now_ms, settings);
            lifecycle.handle_remove(node, &view)
        })
    }

    /// Applies `change` to a copy of the lifecycle, kept pending until the
    /// caller commits it.
    fn change<T>(
        &mut self,
        change: impl FnOnce(&mut Lifecycle, ViewSettings) -> Result<T, AdminRefusal>,
    ) -> Result<PendingChange<'_, T>, AdminRefusal> {
        let mut next = self.lifecycle.clone();
        let outcome = change(&mut next, self.settings)?;
        Ok(PendingChange {
            partitions: self,
            next,
            outcome,
        })
    }
}

/// The record to store before `next` replaces `current`, if it changed.
pub(super) fn changed_record(current: &Lifecycle, next: &Lifecycle) -> Option<LifecycleRecord> {
    let record = next.record();
    (record != current.record()).then_some(record)
}

/// An operator's change computed on a copy of the lifecycle: nothing is
/// changed until [`PendingChange::commit`]; dropping it changes nothing.
#[must_use = "persist its record, then commit it (dropping it changes nothing)"]
pub struct PendingChange<'a, T> {
    partitions: &'a mut NodePartitions,
    next: Lifecycle,
    outcome: T,
}

impl<T> PendingChange<'_, T> {
    /// The record to store before committing, if it changed.
    pub fn record_to_persist(&self) -> Option<LifecycleRecord> {
        changed_record(&self.partitions.lifecycle, &self.next)
    }

    /// What to publish once committed.
    pub fn publication(&self) -> Publication {
        Publication::of(&self.next, &self.partitions.holdings)
    }

    /// Makes the change (its record is on disk); returns its outcome.
    pub fn commit(self) -> T {
        self.partitions.lifecycle = self.next;
        self.outcome
    }
}
