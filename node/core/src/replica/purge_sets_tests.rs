//! Tests of the set purge: the like sets and uniques of partitions not kept
//! go (and the others stay), with the sets digest moved to match the store;
//! a large like set goes in parts, each leaving a consistent set; and a set
//! kept again is not deleted, and no chunk merges into it while a deletion
//! of it waits or is in flight.

use crate::crdt::ReplicaId;
use crate::partition::PartitionSet;
use crate::replica::sets::{LikeRequest, SetDelta};
use crate::replica::tests::{key_in, partitions_of, sixteen, Node};
use crate::replica::{ChunkRefused, DeltaCursor, DurableState, PullChunk};
use crate::storage::Store;

use super::MEMBERS_PER_DELETION;

fn node() -> Node {
    let mut node = Node::new(1, "eu");
    crate::storage::set_partition_count(&mut node.replica, sixteen(), &node.store, None).unwrap();
    node
}

/// The sets digest the commits wrote, whole and per partition, is the
/// store's.
#[track_caller]
fn check_digests(node: &Node) {
    assert_eq!(
        node.replica.sets_digest(),
        crate::storage::sets::compute_digest(&node.store).unwrap(),
        "the digest the commits wrote is the store's"
    );
    assert_eq!(
        node.replica.sets.partition_digests().unwrap(),
        &crate::storage::sets::compute_digests_by_partition(&node.store, sixteen()).unwrap()[..],
        "per partition too"
    );
}

fn like(node: &mut Node, key: &str, member: &str, like: bool) {
    let request = LikeRequest {
        key,
        member,
        like,
        idempotency_key: None,
    };
    node.replica.handle_like(1, &node.store, request).unwrap();
}

/// Runs purge steps (committing after each) until the purge is over.
fn purge(node: &mut Node, kept: &PartitionSet) -> usize {
    let mut deletions = 0;
    for _ in 0..1_000 {
        let step = node
            .replica
            .poll_purge(1, &node.store, 64, |key| {
                kept.contains(sixteen().of_key(key.as_bytes()))
            })
            .unwrap();
        deletions += step.sets_deleted;
        node.commit();
        if step.done && !node.replica.purging() {
            return deletions;
        }
    }
    panic!("the purge never ended");
}

/// Runs purge steps (no commit) until one queues a set deletion (the
/// counters' pass goes first).
fn step_to_a_deletion(node: &mut Node, kept: &PartitionSet) {
    for _ in 0..10 {
        let step = node
            .replica
            .poll_purge(1, &node.store, 64, |key| {
                kept.contains(sixteen().of_key(key.as_bytes()))
            })
            .unwrap();
        if step.sets_deleted > 0 {
            assert_eq!(step.sets_deleted, 1);
            return;
        }
    }
    panic!("no set deletion queued");
}

/// A like set's stored count and the liked members it stores.
fn stored(node: &Node, key: &str) -> (u64, u64, usize) {
    let members = node
        .store
        .like_members_after(key, None, usize::MAX)
        .unwrap();
    let liked = members.iter().filter(|(_, length)| length % 2 == 1).count() as u64;
    (
        node.store.load_like_count(key).unwrap(),
        liked,
        members.len(),
    )
}

#[test]
fn the_sets_of_partitions_not_kept_go_and_the_digest_follows_the_store() {
    let mut a = node();
    let (kept_set, gone_set) = (key_in("post", 1), key_in("post", 2));
    let gone_seen = key_in("seen", 3);
    for member in ["ann", "bob", "cid"] {
        like(&mut a, &kept_set, member, true);
        like(&mut a, &gone_set, member, true);
    }
    like(&mut a, &gone_set, "bob", false);
    a.replica
        .handle_observe(1, &a.store, &gone_seen, &["ann", "bob"])
        .unwrap();
    a.commit();
    let kept = partitions_of(&[1]);
    a.replica.set_kept(Some(kept.clone()));
    a.replica.start_purge();
    assert_eq!(purge(&mut a, &kept), 2);
    assert_eq!(stored(&a, &kept_set), (3, 3, 3));
    assert_eq!(stored(&a, &gone_set), (0, 0, 0));
    assert_eq!(a.store.load_uniques(&gone_seen).unwrap(), None);
    check_digests(&a);
    // A restart reads the same.
    let mut a = a.restart();
    assert_eq!(
        a.replica.handle_like_count(1, &a.store, &kept_set).unwrap(),
        3
    );
    assert_eq!(
        a.replica.handle_like_count(1, &a.store, &gone_set).unwrap(),
        0
    );
}

#[test]
fn a_large_like_set_goes_in_parts_each_leaving_it_consistent() {
    let mut a = node();
    let big = key_in("post", 2);
    let members = MEMBERS_PER_DELETION + 10;
    for i in 0..members {
        like(&mut a, &big, &format!("m{i:05}"), true);
    }
    for i in (0..members).step_by(3) {
        like(&mut a, &big, &format!("m{i:05}"), false);
    }
    a.commit();
    let kept = partitions_of(&[1]);
    a.replica.set_kept(Some(kept.clone()));
    a.replica.start_purge();
    // One deletion takes the first part; its commit leaves a smaller set
    // whose count is its liked members.
    step_to_a_deletion(&mut a, &kept);
    a.commit();
    let (count_left, liked_left, stored_left) = stored(&a, &big);
    assert_eq!(stored_left, 10);
    assert_eq!(count_left, liked_left);
    assert_eq!(purge(&mut a, &kept), 1, "the rest in one more part");
    assert_eq!(stored(&a, &big), (0, 0, 0));
    check_digests(&a);
}

/// A chunk from replica 2 with one delta: `member` of `key` at `length`.
fn chunk(key: &str, member: &str, length: u64) -> PullChunk {
    PullChunk {
        source: ReplicaId(2),
        deltas: vec![SetDelta::Likes {
            key: key.into(),
            members: vec![(member.into(), length)],
        }],
        deltas_next: Some(DeltaCursor::after_seq(1)),
        deltas_complete: true,
        complete: true,
        records_complete: true,
        ..Default::default()
    }
}

#[test]
fn a_set_kept_again_is_not_deleted_and_takes_no_merge_while_deleting() {
    let mut a = node();
    let key = key_in("post", 2);
    like(&mut a, &key, "ann", true);
    like(&mut a, &key, "bob", true);
    a.commit();
    let kept = partitions_of(&[1]);
    a.replica.set_kept(Some(kept.clone()));
    a.replica.start_purge();
    step_to_a_deletion(&mut a, &kept);
    // The partition comes back before the deletion's commit: a merge into
    // the set waits, and the commit drops the deletion.
    a.replica.set_kept(None);
    let refused = a
        .replica
        .handle_pull_chunk(1, &a.store, ReplicaId(2), chunk(&key, "cid", 1))
        .unwrap_err();
    assert_eq!(refused, ChunkRefused::SetBeingDeleted(key.clone()));
    a.commit();
    assert_eq!(stored(&a, &key), (2, 2, 2), "not deleted");
    a.replica
        .handle_pull_chunk(1, &a.store, ReplicaId(2), chunk(&key, "cid", 1))
        .unwrap();
    a.commit();
    assert_eq!(stored(&a, &key), (3, 3, 3));

    // Now with the deletion in flight when the partition comes back.
    a.replica.set_kept(Some(kept.clone()));
    a.replica.start_purge();
    step_to_a_deletion(&mut a, &kept);
    let batch = a.replica.poll_commit().unwrap();
    assert_eq!(batch.set_deletions.len(), 1);
    a.replica.set_kept(None);
    assert!(a
        .replica
        .handle_pull_chunk(1, &a.store, ReplicaId(2), chunk(&key, "dan", 1))
        .is_err());
    a.store.write(&batch).unwrap();
    a.store.flush().unwrap();
    a.replica.handle_commit_done(batch.seq);
    assert_eq!(stored(&a, &key), (0, 0, 0), "deleted whole");
    // Pulled again after: the set holds what the chunk brings, consistently.
    a.replica
        .handle_pull_chunk(1, &a.store, ReplicaId(2), chunk(&key, "dan", 1))
        .unwrap();
    a.commit();
    assert_eq!(stored(&a, &key), (1, 1, 1));
}
