//! Tests of like sets and uniques in partitioned regions: a scoped pull
//! carries only the set deltas of its partitions; a chunk's deltas of partitions not kept here are skipped unmerged; a
//! like of a partition not served is refused and changes nothing, a retry
//! of an applied one is still recognised, and the record keeps the set's
//! partition.

use super::super::sets::{LikeRequest, SetDelta};
use super::super::*;
use super::{key_in, partitions_of, sixteen, Node, CLUSTER};
use crate::partition::PartitionSet;
use crate::replica::version::ProtocolWindow;

fn node(id: u64) -> Node {
    let mut node = Node::new(id, "eu");
    node.replica.peers_mut().set_own_partitions(sixteen().get());
    node
}

fn like(node: &mut Node, key: &str, idempotency_key: Option<&str>) -> Result<u64, LikeRefused> {
    let request = LikeRequest {
        key,
        member: "sam",
        like: true,
        idempotency_key,
    };
    Ok(node.replica.handle_like(1, &node.store, request)?.count)
}

/// The set deltas a pull of `scope` gets, by key.
fn pulled_set_keys(source: &Node, scope: PartitionSet) -> Vec<String> {
    let request = PullRequest {
        cluster_id: CLUSTER.into(),
        caller: ReplicaId(2),
        expected: None,
        after: Cursor::default(),
        max_bytes: 1 << 20,
        directory_digest: None,
        protocol: ProtocolWindow::default(),
        deltas_after: Some(DeltaCursor::default()),
        records_from: None,
        scope: Some(scope),
    };
    let chunk = source.replica.handle_pull(&source.store, &request).unwrap();
    assert!(chunk.deltas_complete);
    let mut keys: Vec<String> = chunk.deltas.iter().map(|d| d.key().to_string()).collect();
    keys.sort();
    keys
}

#[test]
fn a_scoped_pull_carries_the_set_deltas_of_its_partitions() {
    let mut a = node(1);
    let (likes_1, likes_2) = (key_in("post", 1), key_in("post", 2));
    let seen_3 = key_in("seen", 3);
    like(&mut a, &likes_1, None).unwrap();
    like(&mut a, &likes_2, None).unwrap();
    a.replica
        .handle_observe(1, &a.store, &seen_3, &["ann", "bob"])
        .unwrap();
    a.commit();
    let mut in_scope = vec![likes_1.clone(), seen_3.clone()];
    in_scope.sort();
    assert_eq!(pulled_set_keys(&a, partitions_of(&[1, 3])), in_scope);
    let mut every = vec![likes_1, likes_2, seen_3];
    every.sort();
    assert_eq!(pulled_set_keys(&a, partitions_of(&[1, 2, 3])), every);
    // A partition this node does not serve is not sent, sets included.
    a.replica.set_serving(Some(partitions_of(&[3])));
    assert_eq!(
        pulled_set_keys(&a, partitions_of(&[1, 3])),
        vec![key_in("seen", 3)]
    );
}

#[test]
fn a_pulled_delta_of_a_partition_not_kept_here_is_skipped() {
    let mut a = node(1);
    let (kept, other) = (key_in("post", 1), key_in("post", 2));
    like(&mut a, &kept, None).unwrap();
    like(&mut a, &other, None).unwrap();
    a.commit();
    let mut b = node(2);
    b.replica.set_kept(Some(partitions_of(&[1])));
    // A source may send deltas of partitions b does not keep (its view of
    // b's scope is behind); what b does not keep stays out.
    let chunk = PullChunk {
        source: ReplicaId(1),
        deltas: vec![
            SetDelta::Likes {
                key: kept.as_str().into(),
                members: vec![("sam".into(), 1)],
            },
            SetDelta::Likes {
                key: other.as_str().into(),
                members: vec![("sam".into(), 1)],
            },
        ],
        deltas_next: Some(DeltaCursor::after_seq(1)),
        deltas_complete: true,
        complete: true,
        records_complete: true,
        ..Default::default()
    };
    let report = b
        .replica
        .handle_pull_chunk(2, &b.store, ReplicaId(1), chunk)
        .unwrap();
    assert_eq!(report.set_elements_changed, 1);
    assert_eq!(b.replica.handle_like_count(2, &b.store, &kept).unwrap(), 1);
    assert_eq!(b.replica.handle_like_count(2, &b.store, &other).unwrap(), 0);
    assert_eq!(
        b.replica.dirty_sets(),
        1,
        "only the kept set waits for a commit"
    );
    assert_eq!(
        b.replica.peers().delta_watermark(ReplicaId(1)),
        DeltaCursor::after_seq(1),
        "the skipped delta is passed, not asked for again"
    );
}

#[test]
fn a_like_of_a_partition_not_served_is_refused_and_changes_nothing() {
    let mut a = node(1);
    let (served, other) = (key_in("post", 1), key_in("post", 2));
    assert_eq!(like(&mut a, &other, Some("tap-1")), Ok(1));
    a.commit();
    a.replica.set_serving(Some(partitions_of(&[1])));
    let refused = like(&mut a, &other, Some("tap-2")).unwrap_err();
    assert_eq!(
        refused,
        LikeRefused::Add(AddRefused::NotServed {
            key: other.clone(),
            partition: 2
        })
    );
    assert!(
        refused.to_string().contains("does not serve partition 2"),
        "{refused}"
    );
    assert_eq!(a.replica.dirty_sets(), 0, "nothing waits for a commit");
    // A retry of the like applied before is recognised, as for an add.
    let retry = a
        .replica
        .handle_like(
            1,
            &a.store,
            LikeRequest {
                key: &other,
                member: "sam",
                like: true,
                idempotency_key: Some("tap-1"),
            },
        )
        .unwrap();
    assert!(retry.duplicate);
    assert_eq!(like(&mut a, &served, None), Ok(1));
    a.replica.set_serving(None);
    assert_eq!(a.replica.handle_like_count(1, &a.store, &other).unwrap(), 1);
}
