//! Tests of a node's lifecycle round over a replica on the in-memory store,
//! as the node's shell drives it: a joining node becomes active once it
//! receives nothing, a round whose record is not stored changes nothing,
//! a released partition goes only once its owners confirmed it, and a
//! draining node leaves once it keeps nothing.

use std::collections::BTreeSet;

use super::*;
use crate::crdt::ReplicaId;
use crate::partition::{
    LifecycleRecord, MemberFacts, NodeState, Partition, PartitionCount, PartitionSet, ViewSettings,
};
use crate::replica::{Identity, Replica, ReplicaConfig};
use crate::storage::{MemoryStore, Store};

const REGION: &str = "eu";
const NOW: u64 = 1_000;

fn count() -> PartitionCount {
    PartitionCount::new(8).unwrap()
}

fn settings(replication_factor: u32) -> ViewSettings {
    ViewSettings {
        partitions: count(),
        replication_factor,
        dead_after_ms: 60_000,
    }
}

/// What gossip says of node `name` (replica `id`), alive, serving `holding`.
fn member(name: &str, id: u64, state: NodeState, holding: &PartitionSet) -> MemberFacts {
    MemberFacts {
        replica: ReplicaId(id),
        name: name.into(),
        region: REGION.into(),
        grpc_addr: format!("{name}:7000"),
        alive: true,
        state,
        removed: BTreeSet::new(),
        drain_requests: BTreeSet::new(),
        holding: Some(holding.clone()),
        releasing: Some(PartitionSet::empty(count())),
    }
}

/// One node: its partitions and its replica, on an in-memory store.
struct Node {
    partitions: NodePartitions,
    core: Replica,
}

impl Node {
    /// Node `name` (replica `id`) recovered from `record`, serving
    /// `serving`, started.
    fn new(
        name: &str,
        id: u64,
        record: Option<LifecycleRecord>,
        serving: &PartitionSet,
        replication_factor: u32,
    ) -> Node {
        let identity = Identity {
            replica: ReplicaId(id),
            region: REGION.into(),
        };
        let store = MemoryStore::new(identity.clone());
        let config = ReplicaConfig {
            cluster_id: "test".into(),
            ..Default::default()
        };
        let mut core = Replica::open(identity, config, store.recover(0).unwrap(), 0);
        let mut partitions = NodePartitions::new(
            ReplicaId(id),
            name,
            REGION,
            record,
            serving,
            0,
            settings(replication_factor),
        );
        partitions.start(&mut core);
        Node { partitions, core }
    }

    /// A round whose record is stored: committed.
    #[track_caller]
    fn round(&mut self, members: &[MemberFacts]) -> RoundOutcome {
        let durable_seq = self.core.durable_seq();
        self.partitions
            .handle_round(NOW, members.to_vec(), true, durable_seq, &mut self.core)
            .commit(&mut self.core)
    }

    /// Everything a round can change, as the shell and peers see it.
    fn snapshot(&self) -> impl PartialEq + std::fmt::Debug {
        (
            self.partitions.record(),
            self.partitions.holdings(),
            self.partitions.has_view(),
            self.partitions.publication(),
            self.core.serving().cloned(),
            self.core.kept().cloned(),
        )
    }

    fn receiving(&self) -> PartitionSet {
        self.partitions.holdings().1
    }

    fn releasing(&self) -> PartitionSet {
        self.partitions.holdings().2
    }
}

fn active(serving: &PartitionSet) -> Option<LifecycleRecord> {
    record(NodeState::Active, serving)
}

fn record(state: NodeState, serving: &PartitionSet) -> Option<LifecycleRecord> {
    Some(LifecycleRecord {
        state,
        removed: BTreeSet::new(),
        serving: Some(serving.clone()),
    })
}

#[test]
fn a_joining_node_becomes_active_once_it_receives_nothing() {
    let (none, all) = (PartitionSet::empty(count()), PartitionSet::full(count()));
    let mut b = Node::new("b", 2, None, &none, 2);
    let members = [member("a", 1, NodeState::Active, &all)];
    assert_eq!(b.round(&members).state_change, None);
    assert_eq!(b.partitions.state(), NodeState::Joining);
    assert_eq!(
        b.receiving(),
        all,
        "with RF 2 of 2 nodes, b owns every partition"
    );
    // It has a view now, but receives every partition: still joining.
    assert_eq!(b.round(&members).state_change, None);
    assert_eq!(b.partitions.state(), NodeState::Joining);
    let scope = b.partitions.pull_scope("a").unwrap();
    assert_eq!(scope.copy, all);
    b.partitions.handle_pulled(&scope, &all, 10, &scope.copy);
    assert!(b.receiving().is_empty());
    let outcome = b.round(&members);
    assert_eq!(
        outcome.state_change,
        Some((NodeState::Joining, NodeState::Active))
    );
    assert_eq!(outcome.publication.serving, all);
    assert_eq!(b.partitions.record().state, NodeState::Active);
    assert_eq!(b.core.serving(), None, "serving every partition: no filter");
}

#[test]
fn a_round_whose_record_is_not_stored_changes_nothing() {
    let (none, all) = (PartitionSet::empty(count()), PartitionSet::full(count()));
    let mut b = Node::new("b", 2, None, &none, 2);
    let members = [member("a", 1, NodeState::Active, &all)];
    b.round(&members);
    assert_eq!(b.receiving(), all);
    let scope = b.partitions.pull_scope("a").unwrap();
    b.partitions.handle_pulled(&scope, &all, 10, &scope.copy);
    // Caught up: this round would make the node active.
    let before = b.snapshot();
    let pending = b
        .partitions
        .handle_round(NOW, members.to_vec(), true, 0, &mut b.core);
    assert_eq!(
        pending.record_to_persist().map(|record| record.state),
        Some(NodeState::Active)
    );
    drop(pending);
    assert_eq!(b.snapshot(), before);
    assert_eq!(b.partitions.state(), NodeState::Joining);
    // The retry does what the dropped round would have done.
    let outcome = b.round(&members);
    assert_eq!(
        outcome.state_change,
        Some((NodeState::Joining, NodeState::Active))
    );
    let before = b.snapshot();
    // An operator's drain that is not stored changes nothing either.
    let pending = b.partitions.drain(NOW, "b").unwrap();
    assert!(pending.record_to_persist().is_some());
    drop(pending);
    assert_eq!(b.snapshot(), before);
}

#[test]
fn a_released_partition_goes_only_once_every_owner_confirmed_it() {
    let all = PartitionSet::full(count());
    let mut a = Node::new("a", 1, active(&all), &all, 1);
    let members = [member("b", 2, NodeState::Active, &all)];
    assert!(a.round(&members).deleted.is_empty());
    let released = a.releasing();
    assert!(!released.is_empty(), "with RF 1, b owns some partitions");
    assert!(released.len() < all.len(), "and a the others");
    // Unconfirmed, they are served and kept, round after round.
    for _ in 0..3 {
        let outcome = a.round(&members);
        assert!(outcome.deleted.is_empty());
        assert!(!outcome.purge_started);
    }
    assert_eq!(a.releasing(), released);
    assert!(a.core.serving().is_none(), "every partition still served");
    let requests = a.partitions.confirm_requests();
    assert_eq!(requests.get("b"), Some(&released));
    // b confirms one of them: that one goes, the others stay.
    let first: Partition = released.iter().next().unwrap();
    a.partitions.handle_confirms("b", &[(first, 0)]);
    let outcome = a.round(&members);
    assert_eq!(outcome.deleted, vec![first]);
    assert!(outcome.purge_started);
    assert!(!outcome.publication.serving.contains(first));
    let served = a.core.serving().unwrap();
    assert!(!served.contains(first), "the replica refuses its adds");
    assert!(!a.core.kept().unwrap().contains(first));
    let rest: Vec<Partition> = released.iter().filter(|p| *p != first).collect();
    assert!(rest.iter().all(|p| served.contains(*p)));
    let answers: Vec<(Partition, u64)> = rest.iter().map(|p| (*p, 0)).collect();
    a.partitions.handle_confirms("b", &answers);
    let outcome = a.round(&members);
    assert_eq!(outcome.deleted, rest);
    assert!(a.releasing().is_empty());
    assert_eq!(outcome.state_change, None, "an active node stays active");
}

#[test]
fn a_draining_node_leaves_once_it_keeps_nothing() {
    let all = PartitionSet::full(count());
    let mut a = Node::new("a", 1, record(NodeState::Draining, &all), &all, 1);
    let members = [member("b", 2, NodeState::Active, &all)];
    let first = a.round(&members);
    assert!(first.purge_started, "a departing node purges its own slots");
    assert!(a.core.departing());
    for _ in 0..3 {
        assert_eq!(a.round(&members).state_change, None);
    }
    assert_eq!(a.releasing(), all, "a draining node owns nothing");
    assert_eq!(a.partitions.state(), NodeState::Draining);
    let answers: Vec<(Partition, u64)> = all.iter().map(|p| (p, 0)).collect();
    a.partitions.handle_confirms("b", &answers);
    let durable_seq = a.core.durable_seq();
    let pending = a
        .partitions
        .handle_round(NOW, members.to_vec(), true, durable_seq, &mut a.core);
    let stored = pending.record_to_persist().unwrap();
    assert_eq!(stored.state, NodeState::Left);
    assert_eq!(stored.serving, Some(PartitionSet::empty(count())));
    let outcome = pending.commit(&mut a.core);
    assert_eq!(outcome.deleted.len(), all.len());
    assert_eq!(
        outcome.state_change,
        Some((NodeState::Draining, NodeState::Left))
    );
    assert_eq!(outcome.publication.state, NodeState::Left);
}

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
