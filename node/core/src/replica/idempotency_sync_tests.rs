//! Idempotency records travel within a region: a retry that fails over to
//! another node of the region is answered as a duplicate once the first
//! node's record reached it, and never before the add it describes is
//! durable; nodes of other regions are not sent them.

use crate::crdt::ReplicaId;
use crate::partition::{Partition, PartitionCount, PartitionSet};
use crate::replica::tests::Node;
use crate::replica::{AddRequest, DurableState, LikeRequest, Member, RecordsCursor};

fn vote(idempotency_key: &str) -> AddRequest<'_> {
    AddRequest {
        key: "votes",
        delta: 2,
        idempotency_key: Some(idempotency_key),
    }
}

/// Every node hears of every other as membership would tell it.
fn meet(nodes: &mut [&mut Node]) {
    let members: Vec<Member> = nodes
        .iter()
        .map(|node| Member {
            replica: node.replica.identity().replica,
            region: node.replica.identity().region.clone(),
            alive: true,
            ..Default::default()
        })
        .collect();
    for node in nodes.iter_mut() {
        let own = node.replica.identity().replica;
        let others = members.iter().filter(|m| m.replica != own).cloned();
        node.replica.peers_mut().handle_membership(others.collect());
    }
}

fn add(node: &mut Node, idempotency_key: &str) -> (i64, bool) {
    let accepted = node
        .replica
        .handle_add(5, &node.store, vote(idempotency_key))
        .unwrap();
    (accepted.value, accepted.duplicate)
}

#[test]
fn a_retry_that_fails_over_within_the_region_is_a_duplicate() {
    let (mut a, mut b) = (Node::new(1, "eu"), Node::new(2, "eu"));
    meet(&mut [&mut a, &mut b]);
    assert_eq!(add(&mut a, "req-1"), (2, false));
    a.commit();
    b.pull_from(&a, 1 << 20);
    assert_eq!(
        add(&mut b, "req-1"),
        (2, true),
        "b answers the retry as a held it: applied once, with a's value"
    );
    b.commit();
    assert_eq!(b.value("votes"), 2, "b's own slot took nothing");
    assert_eq!(b.replica.durable_seq(), 1, "b's commit holds the record");
    // The record and a's key survive b's restart.
    let mut b = b.restart();
    assert_eq!(add(&mut b, "req-1"), (2, true));
    // A fresh key is applied, and a reused key is still refused.
    assert_eq!(add(&mut b, "req-2"), (4, false));
    let reused = AddRequest {
        delta: 7,
        ..vote("req-1")
    };
    assert!(b.replica.handle_add(5, &b.store, reused).is_err());
}

#[test]
fn records_travel_only_once_durable_and_only_within_the_region() {
    let (mut a, mut b, mut us) = (Node::new(1, "eu"), Node::new(2, "eu"), Node::new(3, "us"));
    meet(&mut [&mut a, &mut b, &mut us]);
    add(&mut a, "req-1");
    b.pull_from(&a, 1 << 20);
    assert_eq!(
        add(&mut b, "req-1"),
        (2, false),
        "a's record was not durable: it did not travel (the documented window)"
    );
    a.commit();
    us.pull_from(&a, 1 << 20);
    assert_eq!(
        add(&mut us, "req-1"),
        (4, false),
        "a node of another region is not sent the region's records (a's 2 merged, us's own 2 applied)"
    );
    assert_eq!(
        us.replica.peers().records_watermark(ReplicaId(1)),
        RecordsCursor::default()
    );
    let asks = |node: &mut Node, region: &str| {
        let plans = node.replica.peers_mut().poll_pulls(10, region);
        assert!(!plans.is_empty());
        plans
            .iter()
            .map(|plan| plan.records_from)
            .collect::<Vec<_>>()
    };
    assert_eq!(asks(&mut us, "us"), [None], "nor asks for them");
    assert_eq!(
        asks(&mut b, "eu"),
        [Some(RecordsCursor::after_seq(0)), None],
        "a node of the region asks it"
    );
}

#[test]
fn records_pass_through_a_third_node_and_come_back_unchanged() {
    let (mut a, mut b, mut c) = (Node::new(1, "eu"), Node::new(2, "eu"), Node::new(3, "eu"));
    meet(&mut [&mut a, &mut b, &mut c]);
    add(&mut a, "req-1");
    a.commit();
    b.pull_from(&a, 1 << 20);
    b.commit();
    // c never talks to a: b hands it a's record and a's key.
    c.pull_from(&b, 1 << 20);
    assert_eq!(add(&mut c, "req-1"), (2, true));
    c.commit();
    // a pulls its own record back from b and c: nothing changes, nothing to commit.
    a.pull_from(&b, 1 << 20);
    a.pull_from(&c, 1 << 20);
    let batch = a.replica.poll_commit().expect("a learned b's and c's keys");
    assert!(
        batch.idempotency_put.is_empty(),
        "known records write nothing"
    );
    assert_eq!(batch.id_keys_put.len(), 2, "b's and c's own keys, once");
    assert_eq!(add(&mut a, "req-1"), (2, true));
}

#[test]
fn records_are_served_in_bounded_chunks_and_all_arrive() {
    let (mut a, mut b) = (Node::new(1, "eu"), Node::new(2, "eu"));
    meet(&mut [&mut a, &mut b]);
    let keys: Vec<String> = (0..300).map(|i| format!("req-{i}")).collect();
    for batch in keys.chunks(7) {
        for key in batch {
            add(&mut a, key);
        }
        a.commit();
    }
    let chunks = b.pull_from(&a, 2_000);
    assert!(
        chunks > 5,
        "a small budget splits the records: {chunks} chunks"
    );
    for key in &keys {
        assert!(add(&mut b, key).1, "{key} arrived");
    }
}

#[test]
fn a_commit_with_more_records_than_a_chunk_holds_is_sent_in_parts() {
    let (mut a, mut b) = (Node::new(1, "eu"), Node::new(2, "eu"));
    meet(&mut [&mut a, &mut b]);
    // One commit gathers 500 keyed adds (as after a stall of the disk).
    let keys: Vec<String> = (0..500).map(|i| format!("req-{i}")).collect();
    for key in &keys {
        add(&mut a, key);
    }
    a.commit();
    add(&mut a, "after");
    a.commit();
    // About 11 records per chunk: the commit's segment comes in parts.
    let chunks = b.pull_from(&a, 2_000);
    assert!(chunks > 40, "{chunks} chunks");
    for key in keys.iter().chain([&"after".to_string()]) {
        assert!(add(&mut b, key).1, "{key} arrived");
    }
    assert_eq!(
        b.replica.peers().records_watermark(ReplicaId(1)),
        RecordsCursor::after_seq(2)
    );
}

/// The ids of the records `by` gets pulling `from` from the start, chunk by
/// chunk, without merging them.
fn records_sent(by: &Node, from: &Node, max_bytes: usize) -> Vec<u128> {
    records_sent_in(by, from, max_bytes, None).0
}

/// [`records_sent`] for a pull scoped to `scope`, and how many chunks it took.
fn records_sent_in(
    by: &Node,
    from: &Node,
    max_bytes: usize,
    scope: Option<PartitionSet>,
) -> (Vec<u128>, usize) {
    let mut cursor = RecordsCursor::default();
    let mut ids = Vec::new();
    let mut chunks = 0;
    loop {
        let request = crate::replica::PullRequest {
            cluster_id: crate::replica::tests::CLUSTER.into(),
            caller: by.replica.identity().replica,
            expected: None,
            after: crate::replica::Cursor::default(),
            max_bytes,
            directory_digest: None,
            protocol: by.replica.peers().own_protocol(),
            deltas_after: None,
            records_from: Some(cursor),
            scope: scope.clone(),
        };
        let chunk = from.replica.handle_pull(&from.store, &request).unwrap();
        ids.extend(chunk.records.iter().map(|record| record.id));
        cursor = chunk.records_next.unwrap();
        chunks += 1;
        if chunk.records_complete {
            return (ids, chunks);
        }
    }
}

#[test]
fn records_never_travel_back_to_the_node_they_came_from() {
    let (mut a, mut b, mut c) = (Node::new(1, "eu"), Node::new(2, "eu"), Node::new(3, "eu"));
    meet(&mut [&mut a, &mut b, &mut c]);
    for i in 0..5 {
        add(&mut a, &format!("a-{i}"));
    }
    a.commit();
    b.pull_from(&a, 1 << 20);
    add(&mut b, "b-0");
    b.commit();
    assert_eq!(
        records_sent(&c, &b, 1 << 20).len(),
        6,
        "a third node gets all"
    );
    assert_eq!(
        records_sent(&a, &b, 1 << 20).len(),
        1,
        "a gets b's own record, not its own five back"
    );
    // In small chunks the left-out records still move the cursor on.
    assert_eq!(records_sent(&a, &b, 200).len(), 1);
    assert_eq!(records_sent(&c, &b, 200).len(), 6);
}

#[test]
fn a_failed_commit_keeps_track_of_where_its_learned_records_came_from() {
    let (mut a, mut b, mut c) = (Node::new(1, "eu"), Node::new(2, "eu"), Node::new(3, "eu"));
    let mut third = Node::new(4, "eu");
    meet(&mut [&mut a, &mut b, &mut c, &mut third]);
    add(&mut a, "a-0");
    a.commit();
    add(&mut c, "c-0");
    c.commit();
    b.pull_from(&a, 1 << 20);
    add(&mut b, "b-0");
    let failed = b.replica.poll_commit().unwrap();
    // b-1 waits for the next commit; the failed commit's records queue
    // behind it (a's, then b-0), then c's.
    add(&mut b, "b-1");
    b.replica.handle_commit_failed(failed.seq);
    b.pull_from(&c, 1 << 20);
    b.commit();
    assert_eq!(records_sent(&a, &b, 1 << 20).len(), 3, "b's two and c's");
    assert_eq!(records_sent(&c, &b, 1 << 20).len(), 3, "b's two and a's");
    assert_eq!(records_sent(&third, &b, 1 << 20).len(), 4);
}

/// A keyed add of 1 to `counter` on `node`.
fn add_to(node: &mut Node, counter: &str, idempotency_key: &str) {
    let request = AddRequest {
        key: counter,
        delta: 1,
        idempotency_key: Some(idempotency_key),
    };
    node.replica.handle_add(5, &node.store, request).unwrap();
}

#[test]
fn a_keyed_add_s_or_like_s_record_keeps_its_key_s_partition() {
    let count = PartitionCount::new(16).unwrap();
    let mut a = Node::new(1, "eu");
    add_to(&mut a, "c-0", "req-0");
    a.replica.peers_mut().set_own_partitions(16);
    add_to(&mut a, "c-1", "req-1");
    let like = LikeRequest {
        key: "post",
        member: "sam",
        like: true,
        idempotency_key: Some("tap-1"),
    };
    a.replica.handle_like(5, &a.store, like).unwrap();
    a.commit();
    let kept: Vec<Option<Partition>> = a
        .store
        .idempotency_segments_after(0, 10)
        .unwrap()
        .into_iter()
        .flat_map(|(_, records)| records)
        .map(|record| record.partition)
        .collect();
    assert_eq!(
        kept,
        [
            None,
            Some(count.of_key(b"c-1")),
            Some(count.of_key(b"post"))
        ],
        "unknown without a partition count; a like's record has its like set's partition"
    );
}

#[test]
fn a_scoped_pull_carries_only_the_records_of_its_partitions() {
    let count = PartitionCount::new(16).unwrap();
    let (mut a, mut b) = (Node::new(1, "eu"), Node::new(2, "eu"));
    meet(&mut [&mut a, &mut b]);
    // One record of unknown partition (made before the count was known).
    add_to(&mut a, "old", "req-old");
    a.replica.peers_mut().set_own_partitions(16);
    let counters: Vec<String> = (0..200).map(|i| format!("c-{i}")).collect();
    for (i, counter) in counters.iter().enumerate() {
        add_to(&mut a, counter, &format!("req-{i}"));
        if i % 9 == 0 {
            a.commit();
        }
    }
    a.commit();
    let mut scope = PartitionSet::empty(count);
    scope.extend((0..16).filter(|p| p % 3 == 0).map(Partition));
    let id = |key: &str| a.replica.idempotency.id_of(key);
    let mut expected: Vec<u128> = counters
        .iter()
        .enumerate()
        .filter(|(_, counter)| scope.contains(count.of_key(counter.as_bytes())))
        .map(|(i, _)| id(&format!("req-{i}")))
        .chain([id("req-old")])
        .collect();
    expected.sort_unstable();
    assert!(expected.len() > 20 && expected.len() < 150);
    for max_bytes in [1 << 20, 300] {
        let (mut sent, _) = records_sent_in(&b, &a, max_bytes, Some(scope.clone()));
        sent.sort_unstable();
        assert_eq!(sent, expected, "with chunks of {max_bytes} bytes");
    }
    assert_eq!(records_sent(&b, &a, 1 << 20).len(), 201, "unscoped: all");
    // A scope of nothing reads through to the end and sends only the
    // record of unknown partition.
    let (sent, _) = records_sent_in(&b, &a, 1 << 20, Some(PartitionSet::empty(count)));
    assert_eq!(sent, [id("req-old")]);
}

#[test]
fn a_chunk_passes_over_a_bounded_number_of_records() {
    let count = PartitionCount::new(16).unwrap();
    let (mut a, mut b) = (Node::new(1, "eu"), Node::new(2, "eu"));
    meet(&mut [&mut a, &mut b]);
    a.replica.peers_mut().set_own_partitions(16);
    let total = super::MAX_SCANNED_PER_CHUNK + 100;
    for i in 0..total {
        add_to(&mut a, "one-counter", &format!("req-{i}"));
    }
    a.commit();
    let mut others = PartitionSet::full(count);
    others.remove(count.of_key(b"one-counter"));
    let (sent, chunks) = records_sent_in(&b, &a, 1 << 20, Some(others));
    assert!(sent.is_empty());
    assert_eq!(chunks, 2, "one chunk stops after the most it may pass over");
}
