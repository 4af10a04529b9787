//! Tests of the purge: counters of partitions not kept are deleted, or cut
//! down to this replica's own slot; the digests, the change log and a
//! restart agree with what is stored; busy counters and failed commits are
//! retried; a partition taken back continues this replica's slot.

use crate::crdt::{counter_digest, ReplicaId, StateDigest};
use crate::partition::{Partition, PartitionCount};
use crate::replica::tests::{Node, CLUSTER};
use crate::replica::{Cursor, DurableState, PullRequest};
use crate::storage::{compute_partition_digests, compute_writer_digests, Store};

fn count() -> PartitionCount {
    PartitionCount::new(16).unwrap()
}

/// The first key `k-0`, `k-1` ... of `partition`.
fn key_of(partition: u32) -> String {
    (0..)
        .map(|i| format!("k-{i}"))
        .find(|key| count().of_key(key.as_bytes()) == Partition(partition))
        .unwrap()
}

fn kept(partitions: &'static [u32]) -> impl Fn(&str) -> bool {
    move |key| partitions.contains(&count().of_key(key.as_bytes()).0)
}

/// Runs a whole purge pass, `limit` counters a step, and commits.
fn purge(node: &mut Node, keeps: impl Fn(&str) -> bool, limit: usize) {
    node.replica.start_purge();
    finish_purge(node, keeps, limit);
}

/// Runs the passes that remain, committing after each step.
fn finish_purge(node: &mut Node, keeps: impl Fn(&str) -> bool, limit: usize) {
    loop {
        let step = node
            .replica
            .poll_purge(1, &node.store, limit, &keeps)
            .unwrap();
        node.commit();
        if step.done {
            return;
        }
    }
}

/// The stored counters, from the change log, checked against the digests
/// the replica keeps.
fn stored_keys(node: &Node) -> Vec<String> {
    let changes = node.store.changes_after(&Cursor::default(), 1000).unwrap();
    let mut digest = StateDigest::default();
    let mut keys = Vec::new();
    for change in changes {
        let stored = node.store.load_counter(&change.key).unwrap().unwrap();
        assert_eq!(stored.seq, change.seq, "the log lists each record once");
        digest.0 = digest
            .0
            .wrapping_add(counter_digest(&change.key, &stored.state));
        keys.push(change.key.to_string());
    }
    assert_eq!(node.replica.digest(), digest, "the state digest");
    let writer_digests = compute_writer_digests(&node.store).unwrap();
    for writer in [ReplicaId(1), ReplicaId(2)] {
        let stored = writer_digests
            .iter()
            .copied()
            .find(|(w, _)| *w == writer)
            .map(|(_, d)| d)
            .unwrap_or_default();
        assert_eq!(node.replica.folds.digest_of(writer), stored, "{writer}");
    }
    if let Some((count, kept, later)) = node.replica.folds().partition_digests() {
        let book = node.replica.folds().book();
        let stored = compute_partition_digests(&node.store, count, book).unwrap();
        assert_eq!(
            (kept, later),
            (&stored.0, &stored.1),
            "the writers' digests by partition"
        );
    }
    keys.sort();
    keys
}

/// Pulls every counter `source` stores, from the start of its log.
fn copy_from_scratch(node: &mut Node, source: &Node) {
    let peer = source.replica.identity().replica;
    let mut after = Cursor::default();
    loop {
        let request = PullRequest {
            cluster_id: CLUSTER.into(),
            caller: node.replica.identity().replica,
            expected: Some(peer),
            after: after.clone(),
            max_bytes: usize::MAX / 2,
            directory_digest: None,
            protocol: node.replica.peers().own_protocol(),
            deltas_after: None,
            records_from: None,
            scope: None,
        };
        let chunk = source.replica.handle_pull(&source.store, &request).unwrap();
        let last = chunk.is_last();
        after = chunk.next.clone();
        node.replica
            .handle_pull_chunk(2, &node.store, peer, chunk)
            .unwrap();
        if last {
            return;
        }
    }
}

/// A node that keeps the writers' digests by partition (as a node does).
fn tracking(id: u64, region: &str) -> Node {
    let mut node = Node::new(id, region);
    crate::storage::set_partition_count(&mut node.replica, count(), &node.store, None).unwrap();
    node
}

#[test]
fn a_purge_deletes_what_is_not_kept_but_this_replica_s_own_slot() {
    let mut a = tracking(1, "eu");
    let mut b = Node::new(2, "us");
    let (one, two, three) = (key_of(1), key_of(2), key_of(3));
    a.add(&one, 5);
    a.add(&two, 7);
    a.commit();
    for key in [&one, &two, &three] {
        b.add(key, 100);
    }
    b.commit();
    a.pull_from(&b, usize::MAX / 2);
    a.commit();

    purge(&mut a, kept(&[1]), 1);

    let mut expected = vec![one.clone(), two.clone()];
    expected.sort();
    assert_eq!(stored_keys(&a), expected, "{three} held only b's slot");
    assert_eq!(a.value(&one), 105, "a kept partition is untouched");
    let stored = a.store.load_counter(&two).unwrap().unwrap();
    assert_eq!(stored.state.slots().len(), 1, "only a's own slot is left");
    assert_eq!(stored.state.slot(ReplicaId(1)).p, 7);

    // A second pass finds nothing more to do, and a restart agrees.
    purge(&mut a, kept(&[1]), 1);
    let mut a = a.restart();
    crate::storage::set_partition_count(&mut a.replica, count(), &a.store, None).unwrap();
    assert_eq!(stored_keys(&a), expected);

    // Taken back: copied again from scratch (as a copy session does), and
    // a's slot continues from its value.
    copy_from_scratch(&mut a, &b);
    a.add(&two, 1);
    a.commit();
    b.pull_from(&a, usize::MAX / 2);
    assert_eq!(a.value(&two), 108);
    assert_eq!(b.value(&two), 108);
    assert_eq!(a.value(&three), 100);
}

/// Commits what waits for a housekeeping tick too (the change-log entries
/// a commit superseded ride along with the next commit).
fn settle(node: &mut Node) {
    node.replica.tick(2);
    node.commit();
}

#[test]
fn a_departing_replica_s_purge_deletes_its_own_slots_too() {
    let mut a = tracking(1, "eu");
    let mut b = Node::new(2, "us");
    let (one, two) = (key_of(1), key_of(2));
    a.add(&one, 5);
    a.add(&two, 7);
    a.commit();
    b.pull_from(&a, usize::MAX / 2);
    b.add(&two, 100);
    b.commit();
    a.pull_from(&b, usize::MAX / 2);
    a.commit();

    // Partition 2 was handed away while a was active: its own slot stays.
    purge(&mut a, kept(&[1]), 1);
    settle(&mut a);
    let mut expected = vec![one.clone(), two.clone()];
    expected.sort();
    assert_eq!(stored_keys(&a), expected);

    // Its node drains: turning departing on asks for a pass, which drops
    // the slot kept before; what a still keeps is untouched.
    assert!(a.replica.set_departing(true), "turned on");
    assert!(!a.replica.set_departing(true), "already on");
    purge(&mut a, kept(&[1]), 1);
    settle(&mut a);
    assert_eq!(stored_keys(&a), vec![one.clone()]);
    assert_eq!(a.value(&one), 5);

    // Once nothing is kept, nothing is stored, and a restart agrees.
    purge(&mut a, kept(&[]), 1);
    settle(&mut a);
    assert_eq!(stored_keys(&a), Vec::<String>::new());
    let mut a = a.restart();
    crate::storage::set_partition_count(&mut a.replica, count(), &a.store, None).unwrap();
    assert_eq!(stored_keys(&a), Vec::<String>::new());

    // Its slots live on where the partitions went.
    assert_eq!(b.value(&one), 5);
    assert_eq!(b.value(&two), 107);
}

/// Node 1 holding a copy of node 2's counter `two` (partition 2).
fn holding_a_copy(two: &str) -> (Node, Node) {
    let mut a = tracking(1, "eu");
    let mut b = Node::new(2, "us");
    b.add(two, 3);
    b.commit();
    a.pull_from(&b, usize::MAX / 2);
    a.commit();
    (a, b)
}

#[test]
fn a_counter_with_a_change_waiting_is_left_for_the_next_pass() {
    let two = key_of(2);
    let (mut a, mut b) = holding_a_copy(&two);
    // A pull planned before the deletion merges into it again.
    b.add(&two, 1);
    b.commit();
    a.pull_from(&b, usize::MAX / 2);
    a.replica.start_purge();
    let step = a.replica.poll_purge(1, &a.store, 10, kept(&[])).unwrap();
    assert_eq!(
        (step.deleted, step.done),
        (0, false),
        "busy: another pass follows"
    );
    a.commit();
    finish_purge(&mut a, kept(&[]), 10);
    assert!(stored_keys(&a).is_empty());
}

#[test]
fn a_failed_commit_puts_its_deletions_back() {
    let (mut a, _b) = holding_a_copy(&key_of(2));
    a.replica.start_purge();
    a.replica.poll_purge(1, &a.store, 10, kept(&[])).unwrap();
    let failed = a.replica.poll_commit().unwrap();
    assert_eq!(failed.deleted.len(), 1);
    a.replica.handle_commit_failed(failed.seq);
    let retry = a.replica.poll_commit().unwrap();
    assert_eq!(retry.deleted, failed.deleted);
    assert_eq!(retry.digest, failed.digest);
    a.store.write(&retry).unwrap();
    a.store.flush().unwrap();
    a.replica.handle_commit_done(retry.seq);
    assert!(stored_keys(&a).is_empty());
    assert_eq!(a.replica.digest(), StateDigest::default());
}
