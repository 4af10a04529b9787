//! A few nodes of one region as `tally-node` runs them, over instant
//! messages: a join hands partitions over and the former holder runs its
//! purge; a drained node leaves holding nothing; a node whose record cannot
//! be stored changes nothing until it can.

use std::collections::BTreeMap;

use tally_node::partition::{NodeState, PartitionCount, PartitionSet, ViewSettings};
use tally_node::replica::{AddRequest, DurableState};

use super::*;

const REGION: &str = "eu";

fn settings(replication_factor: u32) -> ViewSettings {
    ViewSettings {
        partitions: PartitionCount::new(8).unwrap(),
        replication_factor,
        dead_after_ms: 60_000,
    }
}

/// The nodes of the region, and the time.
struct Region {
    nodes: Vec<ScopedNode>,
    now: u64,
    /// What was acknowledged per key.
    added: BTreeMap<String, i64>,
    /// Per node, the stored counters its purges looked at.
    purged: BTreeMap<String, usize>,
}

impl Region {
    fn new(nodes: &[&str], replication_factor: u32) -> Region {
        let mut region = Region {
            nodes: Vec::new(),
            now: 1_000,
            added: BTreeMap::new(),
            purged: BTreeMap::new(),
        };
        for name in nodes {
            region.join(name, replication_factor);
        }
        region
    }

    fn join(&mut self, name: &str, replication_factor: u32) {
        let id = self.nodes.len() as u64 + 1;
        let node = ScopedNode::new(name, REGION, id, settings(replication_factor), self.now);
        self.nodes.push(node);
    }

    fn index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| node.name == name)
            .unwrap()
    }

    /// One gossip round, sync round, confirmation round and purge at
    /// every node.
    fn tick(&mut self) {
        self.now += 1_000;
        let now = self.now;
        let facts: Vec<MemberFacts> = self.nodes.iter().map(ScopedNode::facts).collect();
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let members = facts
                .iter()
                .enumerate()
                .filter(|(other, _)| *other != index)
                .map(|(_, facts)| facts.clone())
                .collect();
            node.round(now, members);
        }
        for puller in 0..self.nodes.len() {
            for source in 0..self.nodes.len() {
                if puller != source {
                    let (puller, source) = pair(&mut self.nodes, puller, source);
                    pull(now, puller, source);
                }
            }
        }
        for asker in 0..self.nodes.len() {
            let mut asking = self.nodes.remove(asker);
            confirm(&mut asking, &self.nodes.iter().collect::<Vec<_>>());
            self.nodes.insert(asker, asking);
        }
        for node in &mut self.nodes {
            node.commit_all();
            let purged = node.purge(now);
            if purged > 0 {
                *self.purged.entry(node.name.clone()).or_default() += purged;
            }
        }
    }

    fn ticks(&mut self, n: usize) {
        for _ in 0..n {
            self.tick();
        }
    }

    /// An add at the key's serving node (the first that serves it).
    #[track_caller]
    fn add(&mut self, key: &str, delta: i64) {
        let partition = settings(1).partitions.of_key(key.as_bytes());
        let now = self.now;
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.partitions.holdings().0.contains(partition))
            .expect("some node serves every partition");
        node.core
            .handle_add(
                now,
                &node.store,
                AddRequest {
                    key,
                    delta,
                    idempotency_key: None,
                },
            )
            .expect("a served partition takes adds");
        node.commit_all();
        *self.added.entry(key.to_string()).or_default() += delta;
    }

    /// Every key reads what was added at every node that serves it.
    #[track_caller]
    fn check_values(&mut self) {
        let now = self.now;
        for (key, expected) in &self.added {
            let partition = settings(1).partitions.of_key(key.as_bytes());
            let mut read = 0;
            for node in &mut self.nodes {
                if !node.partitions.holdings().0.contains(partition) {
                    continue;
                }
                let value = node.core.handle_get(now, &node.store, key).unwrap();
                assert_eq!(value.value().unwrap(), *expected, "{key} at {}", node.name);
                read += 1;
            }
            assert!(read > 0, "{key} is served somewhere");
        }
    }

    /// The partitions each node keeps.
    fn kept(&self) -> Vec<PartitionSet> {
        self.nodes
            .iter()
            .map(|node| {
                let (serving, receiving, _) = node.partitions.holdings();
                serving.union(&receiving)
            })
            .collect()
    }
}

/// Two distinct nodes, one to change and one to read.
fn pair(nodes: &mut [ScopedNode], a: usize, b: usize) -> (&mut ScopedNode, &ScopedNode) {
    if a < b {
        let (left, right) = nodes.split_at_mut(b);
        (&mut left[a], &right[0])
    } else {
        let (left, right) = nodes.split_at_mut(a);
        (&mut right[0], &left[b])
    }
}

fn keys() -> Vec<String> {
    (0..40).map(|i| format!("k-{i}")).collect()
}

#[test]
fn a_join_hands_partitions_over_and_the_former_holder_runs_its_purge() {
    let mut region = Region::new(&["a"], 1);
    region.ticks(3);
    assert_eq!(region.nodes[0].partitions.state(), NodeState::Active);
    for key in keys() {
        region.add(&key, 2);
    }
    region.join("b", 1);
    region.ticks(10);
    let b = region.index("b");
    assert_eq!(region.nodes[b].partitions.state(), NodeState::Active);
    let kept = region.kept();
    assert!(kept[0].intersection(&kept[1]).is_empty(), "{kept:?}");
    assert!(kept[0].union(&kept[1]).is_full(), "{kept:?}");
    assert!(!kept[1].is_empty(), "b took some partitions");
    // Its own slots of them stay until they are retired (issue 42).
    assert!(region.purged["a"] > 0, "a purged what it handed over");
    region.check_values();
    for key in keys() {
        region.add(&key, 1);
    }
    region.ticks(2);
    region.check_values();
}

#[test]
fn a_drained_node_leaves_holding_nothing_and_loses_no_add() {
    let mut region = Region::new(&["a", "b"], 1);
    region.ticks(4);
    for key in keys() {
        region.add(&key, 3);
    }
    let a = region.index("a");
    let now = region.now;
    let node = &mut region.nodes[a];
    let pending = node.partitions.drain(now, "a").unwrap();
    node.record = pending.record_to_persist().or(node.record.take());
    pending.commit();
    region.ticks(10);
    assert_eq!(region.nodes[a].partitions.state(), NodeState::Left);
    assert!(region.kept()[a].is_empty());
    assert!(region.kept()[1 - a].is_full());
    region.check_values();
    // Departing, its purge deleted its own slots too: it stores nothing.
    let drained = &region.nodes[a];
    for key in keys() {
        let stored = drained.store.load_counter(&key).unwrap();
        assert!(stored.is_none(), "{key} is still stored at a");
    }
}

#[test]
fn a_node_whose_record_cannot_be_stored_changes_nothing_until_it_can() {
    let mut region = Region::new(&["a"], 1);
    region.nodes[0].record_fails = true;
    region.ticks(3);
    assert_eq!(region.nodes[0].partitions.state(), NodeState::Joining);
    assert!(region.nodes[0].record.is_none());
    region.nodes[0].record_fails = false;
    region.ticks(3);
    assert_eq!(region.nodes[0].partitions.state(), NodeState::Active);
    let stored = region.nodes[0].record.clone().unwrap();
    assert_eq!(stored.state, NodeState::Active);
    // A restart resumes from the record: active, serving everything.
    for key in keys() {
        region.add(&key, 1);
    }
    let node = region.nodes.remove(0);
    region.nodes.push(node.restart(region.now));
    assert_eq!(region.nodes[0].partitions.state(), NodeState::Active);
    assert!(region.nodes[0].partitions.holdings().0.is_full());
    region.check_values();
}
