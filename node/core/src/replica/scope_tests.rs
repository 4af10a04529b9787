//! Tests of the core's partition scoping: a scoped pull serves only the
//! partitions asked for and served here, and says which; an add of a
//! partition not served is refused and changes nothing; commits stamp each
//! partition's latest change; a partition is quiet only once nothing of it
//! waits for a commit.

use crate::crdt::ReplicaId;
use crate::partition::{Partition, PartitionCount, PartitionSet};
use crate::replica::tests::{Node, CLUSTER};
use crate::replica::version::ProtocolWindow;
use crate::replica::{
    AddRefused, AddRequest, Cursor, PullChunk, PullRefused, PullRequest, MAX_CHUNK_COUNTERS,
};
use crate::storage::Store;

fn count() -> PartitionCount {
    PartitionCount::new(16).unwrap()
}

/// The first `n` keys `k-0`, `k-1` ... of `partition`.
fn keys_of(partition: u32, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("k-{i}"))
        .filter(|key| count().of_key(key.as_bytes()) == Partition(partition))
        .take(n)
        .collect()
}

fn set(partitions: &[u32]) -> PartitionSet {
    let mut set = PartitionSet::empty(count());
    set.extend(partitions.iter().map(|p| Partition(*p)));
    set
}

fn scoped_pull(scope: Option<PartitionSet>) -> PullRequest {
    PullRequest {
        cluster_id: CLUSTER.into(),
        caller: ReplicaId(2),
        expected: None,
        after: Cursor::default(),
        max_bytes: usize::MAX / 2,
        directory_digest: None,
        protocol: ProtocolWindow::default(),
        deltas_after: None,
        records_from: None,
        scope,
    }
}

fn node() -> Node {
    let mut node = Node::new(1, "eu");
    node.replica.peers_mut().set_own_partitions(count().get());
    node
}

fn pulled_keys(chunk: &PullChunk) -> Vec<String> {
    let mut keys: Vec<String> = chunk.counters.iter().map(|(k, _)| k.to_string()).collect();
    keys.sort();
    keys
}

#[test]
fn a_scoped_pull_serves_only_the_partitions_asked_for_and_served_here() {
    let mut a = node();
    let (p1, p2, p3) = (keys_of(1, 2), keys_of(2, 2), keys_of(3, 2));
    for key in p1.iter().chain(&p2).chain(&p3) {
        a.add(key, 1);
    }
    a.commit();

    let whole = a.replica.handle_pull(&a.store, &scoped_pull(None)).unwrap();
    assert_eq!(
        whole.counters.len(),
        6,
        "an unscoped pull serves everything"
    );
    assert_eq!(whole.served, None);

    let chunk = a
        .replica
        .handle_pull(&a.store, &scoped_pull(Some(set(&[1, 3]))))
        .unwrap();
    let mut expected: Vec<String> = p1.iter().chain(&p3).cloned().collect();
    expected.sort();
    assert_eq!(pulled_keys(&chunk), expected);
    assert_eq!(chunk.served, Some(set(&[1, 3])));
    assert!(chunk.complete);

    // Partition 3 being copied in here: it is neither sent nor said served,
    // so the caller never counts it as copied from this node.
    a.replica.set_serving(Some(set(&[1, 2])));
    let chunk = a
        .replica
        .handle_pull(&a.store, &scoped_pull(Some(set(&[1, 3]))))
        .unwrap();
    assert_eq!(pulled_keys(&chunk), {
        let mut keys = p1.clone();
        keys.sort();
        keys
    });
    assert_eq!(chunk.served, Some(set(&[1])));

    // A scope of another partition count is refused, not compared.
    let other = PartitionSet::full(PartitionCount::new(32).unwrap());
    let refused = a
        .replica
        .handle_pull(&a.store, &scoped_pull(Some(other)))
        .unwrap_err();
    assert_eq!(
        refused,
        PullRefused::PartitionCount {
            ours: 16,
            theirs: 32
        }
    );
}

#[test]
fn a_scoped_pull_that_finds_nothing_of_its_own_stops_after_a_bounded_scan() {
    let mut a = node();
    for key in keys_of(1, MAX_CHUNK_COUNTERS * 4 + 10) {
        a.add(&key, 1);
    }
    a.commit();
    let mine = keys_of(2, 1).remove(0);
    a.add(&mine, 1);
    a.commit();
    let mut request = scoped_pull(Some(set(&[2])));
    let first = a.replica.handle_pull(&a.store, &request).unwrap();
    assert!(first.counters.is_empty());
    assert!(!first.complete, "a chunk reads a bounded part of the log");
    assert!(first.next > request.after, "and moves the cursor past it");
    request.after = first.next;
    let second = a.replica.handle_pull(&a.store, &request).unwrap();
    assert_eq!(pulled_keys(&second), vec![mine]);
    assert!(second.complete);
}

#[test]
fn an_add_of_a_partition_not_served_is_refused_and_changes_nothing() {
    let mut a = node();
    let (served, other) = (keys_of(1, 1).remove(0), keys_of(2, 1).remove(0));
    a.add(&other, 5);
    a.commit();
    a.replica.set_serving(Some(set(&[1])));
    a.add(&served, 1);
    let refused = a
        .replica
        .handle_add(
            1,
            &a.store,
            AddRequest {
                key: &other,
                delta: 1,
                idempotency_key: Some("retry-me"),
            },
        )
        .unwrap_err();
    assert_eq!(
        refused,
        AddRefused::NotServed {
            key: other.clone(),
            partition: 2
        }
    );
    assert!(
        refused
            .to_string()
            .contains("send the request to a node that holds it"),
        "{refused}"
    );
    assert_eq!(a.replica.dirty_counters(), 1, "only the served add waits");
    a.replica.set_serving(None);
    assert_eq!(a.value(&other), 5);
    let retry = a.replica.handle_add(
        1,
        &a.store,
        AddRequest {
            key: &other,
            delta: 1,
            idempotency_key: Some("retry-me"),
        },
    );
    assert!(
        !retry.unwrap().duplicate,
        "the refused add left no idempotency record"
    );
}

#[test]
fn commits_stamp_each_partition_s_latest_change_once_tracking_is_on() {
    let mut a = node();
    let (one, two) = (keys_of(1, 1).remove(0), keys_of(2, 1).remove(0));
    a.add(&one, 1);
    a.commit();
    assert_eq!(
        a.replica.latest_change(Partition(1)),
        None,
        "off by default"
    );
    a.replica.track_partition_changes(count(), 1);
    assert_eq!(a.replica.latest_change(Partition(1)), Some(1));
    a.add(&two, 1);
    assert!(!a.replica.partition_quiet(count(), Partition(2)), "dirty");
    assert!(a.replica.partition_quiet(count(), Partition(1)));
    let batch = a.replica.poll_commit().unwrap();
    assert!(
        !a.replica.partition_quiet(count(), Partition(2)),
        "committing"
    );
    a.store.write(&batch).unwrap();
    a.store.flush().unwrap();
    a.replica.handle_commit_done(batch.seq);
    assert!(a.replica.partition_quiet(count(), Partition(2)));
    assert_eq!(a.replica.latest_change(Partition(2)), Some(batch.seq));
    assert_eq!(a.replica.latest_change(Partition(1)), Some(1));
    assert_eq!(a.replica.latest_change(Partition(5)), Some(1));
}

#[test]
fn serving_every_partition_is_kept_as_serving_all() {
    let mut a = node();
    a.replica.set_serving(Some(PartitionSet::full(count())));
    assert_eq!(a.replica.serving(), None, "no key is hashed per request");
    a.replica.set_serving(Some(set(&[1])));
    assert_eq!(a.replica.serving(), Some(&set(&[1])));
}

/// A pull in flight when a partition was deleted here must not store it
/// again: a chunk's counters of partitions not kept are dropped unmerged.
#[test]
fn a_chunk_s_counters_of_partitions_not_kept_are_dropped() {
    let mut a = node();
    let (p1, p2) = (keys_of(1, 2), keys_of(2, 2));
    for key in p1.iter().chain(&p2) {
        a.add(key, 1);
    }
    a.commit();
    let mut b = Node::new(2, "eu");
    b.replica.peers_mut().set_own_partitions(count().get());
    b.replica.set_kept(Some(set(&[1])));
    let chunk = a.replica.handle_pull(&a.store, &scoped_pull(None)).unwrap();
    let report = b
        .replica
        .handle_pull_chunk(0, &b.store, ReplicaId(1), chunk)
        .unwrap();
    assert_eq!((report.received, report.not_kept), (4, 2));
    for key in &p1 {
        assert_eq!(b.value(key), 1, "{key} is kept");
    }
    for key in &p2 {
        assert_eq!(b.value(key), 0, "{key} is not kept");
    }
    b.commit();
    assert_eq!(
        b.store.counters_stored(),
        Some(2),
        "only the kept partition's counters are stored"
    );
    // Every partition kept again (`None`, or a full set): all merge.
    b.replica.set_kept(Some(PartitionSet::full(count())));
    let chunk = a.replica.handle_pull(&a.store, &scoped_pull(None)).unwrap();
    let report = b
        .replica
        .handle_pull_chunk(0, &b.store, ReplicaId(1), chunk)
        .unwrap();
    assert_eq!(report.not_kept, 0);
    assert_eq!(b.value(&p2[0]), 1);
}
