//! Tests of a node's lifecycle: states only move forward, removals spread
//! and stick, a drain request is adopted by its target, a node down for less
//! than `dead_after` keeps its partitions, and every node computes the same
//! owners from the same facts.

use std::collections::BTreeSet;

use super::*;
use crate::partition::Partition;

const DEAD_AFTER_MS: u64 = 5_000;

fn settings() -> ViewSettings {
    ViewSettings {
        partitions: PartitionCount::new(256).unwrap(),
        replication_factor: 2,
        dead_after_ms: DEAD_AFTER_MS,
    }
}

fn replica(n: u64) -> ReplicaId {
    ReplicaId(n)
}

fn facts(n: u64, region: &str, state: NodeState) -> MemberFacts {
    MemberFacts {
        replica: replica(n),
        name: format!("node-{n}"),
        region: region.to_string(),
        grpc_addr: format!("127.0.0.1:{}", 7000 + n),
        alive: true,
        state,
        removed: BTreeSet::new(),
        drain_requests: BTreeSet::new(),
        holding: None,
        releasing: None,
    }
}

fn active(n: u64) -> Lifecycle {
    Lifecycle::new(
        replica(n),
        &format!("node-{n}"),
        "eu",
        Some(LifecycleRecord {
            state: NodeState::Active,
            removed: BTreeSet::new(),
            serving: None,
        }),
    )
}

/// The facts `lifecycle` publishes, as another node receives them.
fn published(n: u64, lifecycle: &Lifecycle) -> MemberFacts {
    MemberFacts {
        state: lifecycle.state(),
        removed: lifecycle.removed().clone(),
        drain_requests: lifecycle.drain_requests().clone(),
        ..facts(n, "eu", NodeState::Active)
    }
}

#[track_caller]
fn owned(view: &ClusterView, node: &str) -> usize {
    view.owned_by(node).len()
}

#[test]
fn a_new_node_joins_until_caught_up_then_stays_active() {
    let mut node = Lifecycle::new(replica(1), "node-1", "eu", None);
    assert_eq!(node.state(), NodeState::Joining);
    assert!(!node.handle_members(0, vec![facts(2, "eu", NodeState::Active)], false));
    assert_eq!(node.state(), NodeState::Joining);
    assert!(node.handle_members(1, vec![facts(2, "eu", NodeState::Active)], true));
    assert_eq!(node.state(), NodeState::Active);
    assert!(
        !node.handle_members(2, vec![], false),
        "never back to joining"
    );
    assert_eq!(node.state(), NodeState::Active);
}

#[test]
fn a_drain_request_is_adopted_by_its_target_and_dropped_once_it_complies() {
    let mut asker = active(1);
    let mut target = active(2);
    let members = vec![
        facts(2, "eu", NodeState::Active),
        facts(3, "eu", NodeState::Active),
    ];
    asker.handle_members(0, members.clone(), true);
    let view = asker.view(0, settings());
    assert_eq!(
        asker.handle_drain("node-2", &view),
        Ok(DrainStep::Requested(replica(2)))
    );
    assert_eq!(asker.drain_requests(), &BTreeSet::from([replica(2)]));
    // The target sees the request in gossip: it drains, and must persist it.
    assert!(target.handle_members(1, vec![published(1, &asker)], true));
    assert_eq!(target.state(), NodeState::Draining);
    assert_eq!(target.record().state, NodeState::Draining);
    // A drained node owns nothing; the others own everything between them.
    let mut members = members;
    members[0] = published(2, &target);
    asker.handle_members(2, members, true);
    assert!(
        asker.drain_requests().is_empty(),
        "complied: request dropped"
    );
    let view = asker.view(2, settings());
    assert_eq!(owned(&view, "node-2"), 0);
    assert_eq!(owned(&view, "node-1") + owned(&view, "node-3"), 2 * 256);
    assert_eq!(
        asker.handle_drain("node-2", &view),
        Ok(DrainStep::AlreadyDraining)
    );
    // A draining node never goes back to active, whatever it is told.
    assert!(!target.handle_members(3, vec![], true));
    assert_eq!(target.state(), NodeState::Draining);
    // It has left once it holds nothing more, and only then.
    assert!(!target.handle_drained(false));
    assert_eq!(target.state(), NodeState::Draining);
    assert!(target.handle_drained(true));
    assert_eq!(target.record().state, NodeState::Left);
    assert!(
        !active(4).handle_drained(true),
        "only a draining node leaves"
    );
}

#[test]
fn draining_itself_a_down_node_or_the_last_node_is_decided_here() {
    let mut node = active(1);
    node.handle_members(0, vec![facts(2, "eu", NodeState::Active)], true);
    let view = node.view(0, settings());
    assert_eq!(
        node.handle_drain("node-1", &view),
        Ok(DrainStep::DrainingNow)
    );
    assert_eq!(node.state(), NodeState::Draining);
    // Now node-2 is the region's last owner: refused, and nothing changes.
    let view = node.view(0, settings());
    assert!(matches!(
        node.handle_drain("node-2", &view),
        Err(AdminRefusal::LastNodeOfRegion { .. })
    ));
    assert!(node.drain_requests().is_empty());
    let mut node = active(1);
    let mut down = facts(2, "eu", NodeState::Active);
    down.alive = false;
    node.handle_members(0, vec![down, facts(3, "eu", NodeState::Active)], true);
    let view = node.view(0, settings());
    let refusal = node.handle_drain("node-2", &view).unwrap_err();
    assert!(matches!(refusal, AdminRefusal::DrainDownNode { .. }));
    assert!(refusal.to_string().contains("tally admin remove node-2"));
    assert!(matches!(
        node.handle_drain("node-9", &view),
        Err(AdminRefusal::UnknownNode { .. })
    ));
}

#[test]
fn a_removal_is_for_down_nodes_spreads_through_gossip_and_sticks() {
    let mut one = active(1);
    let mut three = active(3);
    let mut two = facts(2, "eu", NodeState::Active);
    one.handle_members(
        0,
        vec![two.clone(), facts(3, "eu", NodeState::Active)],
        true,
    );
    let view = one.view(0, settings());
    let owned_before = owned(&view, "node-2");
    assert!(owned_before > 0);
    assert!(matches!(
        one.handle_remove("node-2", &view),
        Err(AdminRefusal::RemoveLiveNode { .. })
    ));
    assert!(one.removed().is_empty());
    two.alive = false;
    one.handle_members(
        10,
        vec![two.clone(), facts(3, "eu", NodeState::Active)],
        true,
    );
    let view = one.view(10, settings());
    assert_eq!(
        owned(&view, "node-2"),
        owned_before,
        "down for less than dead_after"
    );
    assert_eq!(one.handle_remove("node-2", &view), Ok(vec![replica(2)]));
    let view = one.view(10, settings());
    assert_eq!(view.node("node-2").unwrap().state, NodeState::Left);
    assert_eq!(owned(&view, "node-2"), 0);
    assert_eq!((owned(&view, "node-1"), owned(&view, "node-3")), (256, 256));
    assert!(matches!(
        one.handle_remove("node-2", &view),
        Err(AdminRefusal::AlreadyLeft { .. })
    ));
    // Node 3 learns it from node 1's gossip, and keeps it (persist).
    assert!(three.handle_members(11, vec![two.clone(), published(1, &one)], true));
    assert_eq!(three.removed(), &BTreeSet::from([replica(2)]));
    assert!(
        !three.handle_members(12, vec![two.clone()], true),
        "a set that only grows"
    );
    // The removed node, back with its old directory, learns it has left.
    let mut back = Lifecycle::new(replica(2), "node-2", "eu", Some(active(2).record()));
    assert!(back.handle_members(13, vec![published(3, &three)], true));
    assert_eq!(back.state(), NodeState::Left);
    let restarted = Lifecycle::new(replica(2), "node-2", "eu", Some(three.record()));
    assert_eq!(restarted.state(), NodeState::Left);
}

#[test]
fn a_node_down_longer_than_dead_after_loses_its_partitions_a_short_outage_does_not() {
    let mut node = active(1);
    let mut two = facts(2, "eu", NodeState::Active);
    let three = facts(3, "eu", NodeState::Active);
    node.handle_members(0, vec![two.clone(), three.clone()], true);
    let full = node.view(0, settings());
    two.alive = false;
    node.handle_members(1_000, vec![two.clone(), three.clone()], true);
    for now in [1_000, 1_000 + DEAD_AFTER_MS - 1] {
        let view = node.view(now, settings());
        for partition in settings().partitions.iter() {
            assert_eq!(view.owners("eu", partition), full.owners("eu", partition));
        }
    }
    let view = node.view(1_000 + DEAD_AFTER_MS, settings());
    assert_eq!(owned(&view, "node-2"), 0);
    assert_eq!(owned(&view, "node-1"), 256);
    // Back up: it owns its partitions again (it never left).
    two.alive = true;
    node.handle_members(9_000, vec![two, three], true);
    let view = node.view(9_000, settings());
    for partition in settings().partitions.iter() {
        assert_eq!(view.owners("eu", partition), full.owners("eu", partition));
    }
}

#[test]
fn every_node_computes_the_same_owners_from_the_same_facts() {
    let names = [1, 2, 3];
    let mut lifecycles: Vec<Lifecycle> = names.iter().map(|n| active(*n)).collect();
    for (i, lifecycle) in lifecycles.iter_mut().enumerate() {
        let mut others: Vec<MemberFacts> = names
            .iter()
            .filter(|n| **n != names[i])
            .map(|n| facts(*n, "eu", NodeState::Active))
            .collect();
        others.push(facts(9, "us", NodeState::Active));
        lifecycle.handle_members(0, others, true);
    }
    let views: Vec<ClusterView> = lifecycles.iter().map(|l| l.view(0, settings())).collect();
    for partition in settings().partitions.iter() {
        let first = views[0].owners("eu", partition);
        assert_eq!(first.len(), 2);
        for view in &views[1..] {
            assert_eq!(view.owners("eu", partition), first);
        }
        assert_eq!(views[0].owners("us", partition), vec!["node-9"]);
    }
    // RF/N each, roughly: 256 * 2 / 3 = 171.
    for node in ["node-1", "node-2", "node-3"] {
        let owned = owned(&views[0], node);
        assert!((130..=210).contains(&owned), "{node} owns {owned}");
    }
}

#[test]
fn a_view_shows_what_each_node_publishes_as_held_and_every_partition_for_an_older_build() {
    let count = settings().partitions;
    let mut mine = PartitionSet::empty(count);
    mine.extend([Partition(1), Partition(2)]);
    let mut releasing = PartitionSet::empty(count);
    releasing.insert(Partition(2));
    let mut node = active(1);
    // Before the runtime sets it, this node holds every partition.
    assert!(node
        .view(0, settings())
        .node("node-1")
        .unwrap()
        .holding
        .is_full());
    node.set_own_holding(mine.clone(), releasing.clone());
    assert_eq!(node.record().serving, Some(mine.clone()));
    let publishing = MemberFacts {
        holding: Some(releasing.clone()),
        releasing: Some(releasing.clone()),
        ..facts(2, "eu", NodeState::Active)
    };
    let older = facts(3, "eu", NodeState::Active);
    let foreign = MemberFacts {
        holding: Some(PartitionSet::full(PartitionCount::new(16).unwrap())),
        ..facts(4, "eu", NodeState::Active)
    };
    node.handle_members(0, vec![publishing, older, foreign], false);
    let view = node.view(0, settings());
    let holding = |name: &str| view.node(name).unwrap().holding.clone();
    assert_eq!(holding("node-1"), mine);
    assert_eq!(view.node("node-1").unwrap().releasing, releasing);
    assert_eq!(holding("node-2"), releasing);
    assert!(
        holding("node-3").is_full(),
        "a build before handoff holds all"
    );
    assert!(
        holding("node-4").is_empty(),
        "a set of another partition count holds none of ours"
    );
    // What the record says comes back after a restart.
    let restarted = Lifecycle::new(replica(1), "node-1", "eu", Some(node.record()));
    assert_eq!(restarted.record().serving, Some(mine));
}
