//! Tests of the replica core with the in-memory store: group commit, durable
//! serving, the hot-key trap, idempotency, refusals, crashes and convergence.

use super::*;
use crate::crdt::Slot;
use crate::storage::{MemoryStore, Store};
use version::ProtocolWindow;

pub(super) struct Node {
    pub(super) replica: Replica,
    pub(super) store: MemoryStore,
}

pub(super) const CLUSTER: &str = "test";

/// The partition count of the tests of partitioned sets (16).
pub(super) fn sixteen() -> crate::partition::PartitionCount {
    crate::partition::PartitionCount::new(16).unwrap()
}

/// The first key `{prefix}-0`, `{prefix}-1` ... of `partition` (of 16).
pub(super) fn key_in(prefix: &str, partition: u32) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|key| sixteen().of_key(key.as_bytes()) == crate::partition::Partition(partition))
        .unwrap()
}

/// The set of `partitions` (of 16).
pub(super) fn partitions_of(partitions: &[u32]) -> crate::partition::PartitionSet {
    let mut set = crate::partition::PartitionSet::empty(sixteen());
    set.extend(partitions.iter().map(|p| crate::partition::Partition(*p)));
    set
}

fn config() -> ReplicaConfig {
    ReplicaConfig {
        cluster_id: CLUSTER.into(),
        ..Default::default()
    }
}

impl Node {
    pub(super) fn new(id: u64, region: &str) -> Node {
        let identity = Identity {
            replica: ReplicaId(id),
            region: region.into(),
        };
        let store = MemoryStore::new(identity.clone());
        Node {
            replica: Replica::open(identity, config(), store.recover(0).unwrap(), 0),
            store,
        }
    }

    /// Restarts from what the store holds (after `crash` or a clean stop).
    pub(super) fn restart(self) -> Node {
        let recovered = self.store.recover(0).unwrap();
        let identity = self.store.identity().clone();
        Node {
            replica: Replica::open(identity, config(), recovered, 0),
            store: self.store,
        }
    }

    #[track_caller]
    pub(super) fn add(&mut self, key: &str, delta: i64) -> AddAccepted {
        self.replica
            .handle_add(
                1,
                &self.store,
                AddRequest {
                    key,
                    delta,
                    idempotency_key: None,
                },
            )
            .unwrap()
    }

    pub(super) fn value(&mut self, key: &str) -> i64 {
        self.replica
            .handle_get(1, &self.store, key)
            .unwrap()
            .value()
            .unwrap()
    }

    /// Writes and flushes one group commit; returns its sequence.
    pub(super) fn commit(&mut self) -> Option<u64> {
        let batch = self.replica.poll_commit()?;
        self.store.write(&batch).unwrap();
        self.store.flush().unwrap();
        self.replica.handle_commit_done(batch.seq);
        Some(batch.seq)
    }

    /// Pulls everything `source` offers, chunk by chunk, as the runtime does.
    pub(super) fn pull_from(&mut self, source: &Node, max_bytes: usize) -> usize {
        let peer = source.replica.identity().replica;
        let mut chunks = 0;
        loop {
            let request = PullRequest {
                cluster_id: CLUSTER.into(),
                caller: self.replica.identity().replica,
                expected: Some(peer),
                after: self.replica.peers().watermark(peer),
                max_bytes,
                directory_digest: self.replica.peers().directory_digest(peer),
                protocol: self.replica.peers().own_protocol(),
                deltas_after: Some(self.replica.peers().delta_watermark(peer)),
                records_from: Some(self.replica.peers().records_watermark(peer)),
                scope: None,
            };
            let chunk = source.replica.handle_pull(&source.store, &request).unwrap();
            let complete = chunk.is_last();
            self.replica
                .handle_pull_chunk(2, &self.store, peer, chunk)
                .unwrap();
            chunks += 1;
            if complete {
                return chunks;
            }
        }
    }
}

#[test]
fn an_add_is_durable_after_the_commit_its_ticket_names() {
    let mut node = Node::new(1, "eu");
    let first = node.add("likes", 3);
    assert_eq!(
        (first.value, first.duplicate, first.durable_at_seq),
        (3, false, 1)
    );
    assert_eq!(node.replica.durable_seq(), 0);
    assert_eq!(node.commit(), Some(1));
    assert_eq!(node.replica.durable_seq(), 1);
    assert_eq!(node.commit(), None, "nothing changed, nothing to commit");
    assert_eq!(node.add("likes", -1).durable_at_seq, 2);
    assert_eq!(node.value("likes"), 2);
}

#[test]
fn adds_during_a_commit_go_into_the_next_one() {
    let mut node = Node::new(1, "eu");
    node.add("likes", 1);
    let batch = node.replica.poll_commit().unwrap();
    assert!(
        node.replica.poll_commit().is_none(),
        "one commit in flight at a time"
    );
    let during = node.add("likes", 1);
    assert_eq!(during.durable_at_seq, 2);
    node.store.write(&batch).unwrap();
    node.store.flush().unwrap();
    node.replica.handle_commit_done(batch.seq);
    let next = node.replica.poll_commit().unwrap();
    assert_eq!(next.seq, 2);
    assert_eq!(next.counters[0].1.slot(ReplicaId(1)), Slot { p: 2, n: 0 });
}

#[test]
fn a_pull_is_served_durable_state_only_never_live_state() {
    let mut source = Node::new(1, "eu");
    let mut puller = Node::new(2, "us");
    source.add("post", 5);
    puller.pull_from(&source, 1 << 20);
    assert_eq!(puller.value("post"), 0, "nothing was durable yet");
    source.commit();
    source.add("post", 100); // live, not durable
    let batch = source.replica.poll_commit().unwrap();
    source.store.write(&batch).unwrap(); // visible in the store, not yet flushed
    puller.pull_from(&source, 1 << 20);
    assert_eq!(
        puller.value("post"),
        5,
        "only the committed value is offered"
    );
    source.store.flush().unwrap();
    source.replica.handle_commit_done(batch.seq);
    puller.pull_from(&source, 1 << 20);
    assert_eq!(puller.value("post"), 105);
}

#[test]
fn a_crash_between_write_and_flush_never_hides_a_durable_change_from_a_peer() {
    // `a` changes in commit 1 (durable) and again in commit 2, whose write is
    // visible but never flushed. A pull during commit 2 must still ship `a`@1.
    let mut source = Node::new(1, "eu");
    let mut puller = Node::new(2, "us");
    source.add("a", 1);
    source.commit();
    source.add("a", 1);
    let batch = source.replica.poll_commit().unwrap();
    source.store.write(&batch).unwrap();
    puller.pull_from(&source, 1 << 20);
    assert_eq!(puller.value("a"), 1);
    source.store.crash();
    let mut source = source.restart();
    assert_eq!(source.value("a"), 1);
    source.add("b", 1);
    source.commit();
    puller.pull_from(&source, 1 << 20);
    assert_eq!(puller.value("a"), 1);
    assert_eq!(puller.value("b"), 1);
}

#[test]
fn the_hottest_key_is_shipped_every_round() {
    let mut source = Node::new(1, "eu");
    let mut puller = Node::new(2, "us");
    let mut acknowledged = 0;
    for round in 0..20 {
        // Adds never pause: one is always pending when the pull comes.
        for _ in 0..50 {
            source.add("hot", 1);
            acknowledged += 1;
            source.commit();
        }
        source.add("hot", 1);
        puller.pull_from(&source, 1 << 20);
        assert_eq!(
            puller.value("hot"),
            acknowledged,
            "round {round}: the durable value arrives"
        );
        acknowledged += 1;
        source.commit();
    }
}

#[test]
fn a_keyed_retry_is_applied_once_and_answers_as_the_first_did() {
    let mut node = Node::new(1, "eu");
    let request = AddRequest {
        key: "votes",
        delta: 2,
        idempotency_key: Some("req-1"),
    };
    let first = node.replica.handle_add(1, &node.store, request).unwrap();
    node.add("votes", 10);
    let retry = node.replica.handle_add(1, &node.store, request).unwrap();
    assert_eq!(
        (retry.value, retry.duplicate, retry.durable_at_seq),
        (2, true, first.durable_at_seq)
    );
    assert_eq!(node.value("votes"), 12);
    let reused = AddRequest {
        delta: 3,
        ..request
    };
    assert!(matches!(
        node.replica.handle_add(1, &node.store, reused),
        Err(AddRefused::IdempotencyKeyReused(_))
    ));
    let long = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1);
    let too_long = AddRequest {
        idempotency_key: Some(&long),
        ..request
    };
    assert!(matches!(
        node.replica.handle_add(1, &node.store, too_long),
        Err(AddRefused::IdempotencyKeyTooLong(_))
    ));
    // The record survives a restart with the add it describes.
    node.commit();
    let mut node = node.restart();
    let after = node.replica.handle_add(1, &node.store, request).unwrap();
    assert!(after.duplicate);
    assert_eq!(node.value("votes"), 12);
}

#[test]
fn a_refused_add_changes_nothing() {
    let mut node = Node::new(1, "eu");
    node.add("big", i64::MAX);
    node.commit();
    let refused = node.replica.handle_add(
        1,
        &node.store,
        AddRequest {
            key: "big",
            delta: 1,
            idempotency_key: Some("x"),
        },
    );
    assert_eq!(refused, Err(AddRefused::Counter(AddError::ValueOutOfRange)));
    assert!(
        node.replica.poll_commit().is_none(),
        "nothing dirty, nothing remembered"
    );
    assert_eq!(node.value("big"), i64::MAX);
}

#[test]
fn a_crash_before_the_flush_loses_only_unacknowledged_adds() {
    let mut node = Node::new(1, "eu");
    node.add("c", 7);
    node.commit();
    node.add("c", 5);
    let batch = node.replica.poll_commit().unwrap();
    node.store.write(&batch).unwrap();
    node.store.crash();
    let mut node = node.restart();
    assert_eq!(node.value("c"), 7, "the slot restarts from what is on disk");
    assert_eq!(
        node.add("c", 1).durable_at_seq,
        2,
        "the lost sequence is reused: it was never offered"
    );
}

#[test]
fn refused_chunks_merge_nothing() {
    let mut node = Node::new(1, "eu");
    let state = PnCounter::from_slots([(ReplicaId(9), Slot { p: 4, n: 0 })]);
    let chunk = PullChunk {
        source: ReplicaId(9),
        counters: vec![
            (
                Key::from("a"),
                PnCounter::from_slots([(ReplicaId(1), Slot { p: 0, n: 0 })]),
            ),
            (Key::from("b"), state.clone()),
        ],
        next: Cursor::after_seq(3),
        complete: true,
        ..Default::default()
    };
    let refused = node
        .replica
        .handle_pull_chunk(0, &node.store, ReplicaId(9), chunk.clone());
    assert!(
        matches!(refused, Err(ChunkRefused::UnknownReplica { .. })),
        "{refused:?}"
    );
    let wrong = node
        .replica
        .handle_pull_chunk(0, &node.store, ReplicaId(8), chunk.clone());
    assert!(matches!(wrong, Err(ChunkRefused::WrongSource { .. })));
    let mut conflicting = chunk.clone();
    conflicting.replicas = vec![(ReplicaId(9), "us".into()), (ReplicaId(1), "ap".into())];
    assert!(matches!(
        node.replica
            .handle_pull_chunk(0, &node.store, ReplicaId(9), conflicting),
        Err(ChunkRefused::RegionConflict { .. })
    ));
    let mut twice = chunk.clone();
    twice.replicas = vec![(ReplicaId(9), "us".into())];
    twice.counters.push((Key::from("b"), state.clone()));
    assert!(matches!(
        node.replica
            .handle_pull_chunk(0, &node.store, ReplicaId(9), twice),
        Err(ChunkRefused::DuplicateKey(_))
    ));
    assert_eq!(node.value("b"), 0);
    assert_eq!(
        node.replica.peers().watermark(ReplicaId(9)),
        Cursor::default()
    );
    assert!(
        node.replica.poll_commit().unwrap().counters.is_empty(),
        "only reads happened"
    );

    let mut good = chunk;
    good.replicas = vec![(ReplicaId(9), "us".into())];
    let report = node
        .replica
        .handle_pull_chunk(0, &node.store, ReplicaId(9), good)
        .unwrap();
    assert_eq!(report.changed.len(), 1);
    assert_eq!(node.value("b"), 4);
    assert_eq!(node.replica.region_of(ReplicaId(9)), Some("us"));
}

/// A pull by replica 2 of this cluster, from the start.
fn pull_from_2() -> PullRequest {
    PullRequest {
        cluster_id: CLUSTER.into(),
        caller: ReplicaId(2),
        expected: None,
        after: Cursor::default(),
        max_bytes: 1000,
        directory_digest: None,
        protocol: ProtocolWindow::default(),
        deltas_after: None,
        records_from: None,
        scope: None,
    }
}

#[test]
fn pulls_from_another_cluster_or_replica_are_refused() {
    let node = Node::new(1, "eu");
    let mut request = PullRequest {
        cluster_id: "other".into(),
        ..pull_from_2()
    };
    assert!(matches!(
        node.replica.handle_pull(&node.store, &request),
        Err(PullRefused::WrongCluster { .. })
    ));
    request.cluster_id = CLUSTER.into();
    request.expected = Some(ReplicaId(3));
    assert!(matches!(
        node.replica.handle_pull(&node.store, &request),
        Err(PullRefused::WrongReplica { .. })
    ));
}

#[test]
fn pulls_from_a_member_with_another_partition_count_are_refused() {
    let mut node = Node::new(1, "eu");
    let request = pull_from_2();
    node.replica.peers_mut().set_own_partitions(64);
    let caller = |partitions| crate::replica::Member {
        replica: ReplicaId(2),
        region: "us".into(),
        partitions,
        ..Default::default()
    };
    node.replica.peers_mut().handle_membership(vec![caller(64)]);
    assert!(node.replica.handle_pull(&node.store, &request).is_ok());
    node.replica
        .peers_mut()
        .handle_membership(vec![caller(128)]);
    let refused = node.replica.handle_pull(&node.store, &request).unwrap_err();
    assert!(matches!(
        refused,
        PullRefused::PartitionCount {
            ours: 64,
            theirs: 128
        }
    ));
    assert!(refused.to_string().contains("--partitions 64"), "{refused}");
}

#[test]
fn pulls_from_a_node_without_a_shared_protocol_version_are_refused() {
    use crate::replica::version::{NEWEST, OLDEST, UPGRADE_THROUGH};
    let node = Node::new(1, "eu");
    let mut request = pull_from_2();
    assert!(node.replica.handle_pull(&node.store, &request).is_ok());
    // A caller behind this build's window is told the release to upgrade
    // it through.
    request.protocol = ProtocolWindow {
        oldest: 1,
        newest: OLDEST - 1,
    };
    let refused = node.replica.handle_pull(&node.store, &request).unwrap_err();
    assert!(
        matches!(refused, PullRefused::IncompatibleProtocol { .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains(UPGRADE_THROUGH), "{refused}");
    // A newer release that finalized: this node is the one to upgrade.
    request.protocol = ProtocolWindow::at(NEWEST + 1, NEWEST + 1);
    let refused = node.replica.handle_pull(&node.store, &request).unwrap_err();
    assert!(
        refused.to_string().contains("upgrade this node"),
        "{refused}"
    );
    // The next release before it finalizes shares a version: served.
    request.protocol = ProtocolWindow::at(NEWEST, NEWEST + 1);
    assert!(node.replica.handle_pull(&node.store, &request).is_ok());
}

#[test]
fn three_regions_converge_on_the_sum_with_small_chunks() {
    let mut nodes = [Node::new(1, "eu"), Node::new(2, "us"), Node::new(3, "ap")];
    let mut expected = 0i64;
    for i in 0..300i64 {
        let node = &mut nodes[(i % 3) as usize];
        let delta = if i % 7 == 0 { -(i + 1) } else { i + 1 };
        node.add(&format!("k{}", i % 17), delta);
        expected += delta;
        if i % 11 == 0 {
            node.commit();
        }
    }
    for node in nodes.iter_mut() {
        node.commit();
    }
    for _ in 0..2 {
        for target in 0..3 {
            for source in 0..3 {
                if source == target {
                    continue;
                }
                let (source, target) = if source < target {
                    let (low, high) = nodes.split_at_mut(target);
                    (&low[source], &mut high[0])
                } else {
                    let (low, high) = nodes.split_at_mut(source);
                    (&high[0], &mut low[target])
                };
                target.pull_from(source, 64);
                target.commit();
            }
        }
    }
    let digests: Vec<_> = nodes.iter().map(|n| n.replica.digest()).collect();
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    for node in nodes.iter_mut() {
        let total: i64 = (0..17).map(|k| node.value(&format!("k{k}"))).sum();
        assert_eq!(total, expected);
        let state = node.replica.handle_get(0, &node.store, "k1").unwrap();
        let parts = node.replica.breakdown(&state);
        assert!(
            parts.iter().all(|part| part.region != "unknown"),
            "{parts:?}"
        );
    }
}

#[test]
fn eviction_keeps_dirty_counters_and_reloads_clean_ones() {
    let mut node = Node::new(1, "eu");
    node.replica.config.cache_capacity = 10;
    for i in 0..30 {
        node.add(&format!("k{i}"), 1);
    }
    node.replica.tick(5);
    assert_eq!(
        node.replica.cached_counters(),
        30,
        "dirty counters are never evicted"
    );
    node.commit();
    node.replica.tick(5);
    assert!(node.replica.cached_counters() <= 10);
    assert!((0..30).all(|i| node.value(&format!("k{i}")) == 1));
}

#[test]
fn a_failed_commit_is_retried_whole() {
    let mut node = Node::new(1, "eu");
    node.replica
        .handle_add(
            1,
            &node.store,
            AddRequest {
                key: "a",
                delta: 1,
                idempotency_key: Some("i"),
            },
        )
        .unwrap();
    let batch = node.replica.poll_commit().unwrap();
    node.replica.handle_commit_failed(batch.seq);
    let retry = node.replica.poll_commit().unwrap();
    assert_eq!(retry.seq, batch.seq + 1);
    assert_eq!(retry.counters, batch.counters);
    assert_eq!(retry.idempotency_put, batch.idempotency_put);
}

#[test]
fn idle_replicas_stop_committing() {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "us");
    a.add("k", 1);
    a.commit();
    b.pull_from(&a, 1 << 20);
    b.commit();
    a.pull_from(&b, 1 << 20);
    a.commit();
    // Nothing changes any more: rounds of pulls must not create commits.
    for _ in 0..5 {
        b.pull_from(&a, 1 << 20);
        a.pull_from(&b, 1 << 20);
        assert_eq!(a.commit(), None, "an idle replica committed");
        assert_eq!(b.commit(), None, "an idle replica committed");
    }
}

#[test]
fn housekeeping_rides_along_with_data_and_commits_alone_only_after_a_tick() {
    let mut node = Node::new(1, "eu");
    node.add("k", 1);
    node.commit();
    node.add("k", 1);
    node.commit(); // supersedes the change-log entry of k in commit 1
    assert_eq!(
        node.commit(),
        None,
        "no second flush just to delete a superseded entry"
    );
    node.add("j", 1);
    let batch = node.replica.poll_commit().unwrap();
    assert_eq!(
        batch.superseded.len(),
        1,
        "it rides along with the next data commit"
    );
    node.store.write(&batch).unwrap();
    node.store.flush().unwrap();
    node.replica.handle_commit_done(batch.seq);
    node.add("j", 1);
    node.commit();
    assert_eq!(node.commit(), None);
    node.replica.tick(0);
    let alone = node
        .replica
        .poll_commit()
        .expect("after a tick, housekeeping commits alone");
    assert!(alone.counters.is_empty() && alone.superseded.len() == 1);
}

#[test]
fn the_directory_is_sent_only_until_the_caller_holds_it_as_it_is() {
    let [mut eu, mut us, mut ap] = [Node::new(1, "eu"), Node::new(2, "us"), Node::new(3, "ap")];
    let us_id = us.replica.identity().replica;
    // What `us` answers `eu` after one more add, asked as the runtime asks.
    let answer = |us: &mut Node, eu: &Node, delta: i64| {
        us.add("hot", delta);
        us.commit();
        let request = PullRequest {
            cluster_id: CLUSTER.into(),
            caller: eu.replica.identity().replica,
            expected: Some(us_id),
            after: eu.replica.peers().watermark(us_id),
            max_bytes: 1 << 20,
            directory_digest: eu.replica.peers().directory_digest(us_id),
            protocol: eu.replica.peers().own_protocol(),
            deltas_after: None,
            records_from: None,
            scope: None,
        };
        us.replica.handle_pull(&us.store, &request).unwrap()
    };
    let regions = |chunk: &PullChunk| -> Vec<String> {
        chunk
            .replicas
            .iter()
            .map(|(_, region)| region.clone())
            .collect()
    };

    // The first answer carries us's whole directory and its digest.
    let chunk = answer(&mut us, &eu, 1);
    assert_eq!(regions(&chunk), ["us"]);
    assert!(chunk.directory_digest.is_some());
    eu.replica
        .handle_pull_chunk(1, &eu.store, us_id, chunk)
        .unwrap();
    // eu holds it now: the next answer leaves it out and still merges.
    let chunk = answer(&mut us, &eu, 2);
    assert!(chunk.replicas.is_empty(), "{chunk:?}");
    assert_eq!(chunk.directory_digest, None);
    assert_eq!(chunk.counters.len(), 1);
    eu.replica
        .handle_pull_chunk(2, &eu.store, us_id, chunk)
        .unwrap();
    assert_eq!(eu.value("hot"), 3);

    // us learns a third replica: its directory changed, so the next answer
    // carries it again, and eu learns the new replica's region.
    ap.add("hot", 10);
    ap.commit();
    us.pull_from(&ap, 1 << 20);
    us.commit();
    let chunk = answer(&mut us, &eu, 4);
    assert_eq!(regions(&chunk).len(), 2, "{chunk:?}");
    assert!(regions(&chunk).contains(&"ap".to_owned()), "{chunk:?}");
    eu.replica
        .handle_pull_chunk(3, &eu.store, us_id, chunk)
        .unwrap();
    assert_eq!(eu.value("hot"), 17);
    assert_eq!(
        eu.replica.region_of(ap.replica.identity().replica),
        Some("ap")
    );
    assert!(answer(&mut us, &eu, 1).replicas.is_empty());
}

#[path = "sets_tests.rs"]
mod sets_tests;

#[path = "sets_scope_tests.rs"]
mod sets_scope_tests;
