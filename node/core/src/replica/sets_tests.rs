//! Tests of like sets and uniques in the core, over the in-memory store:
//! likes and unlikes, the derived count through commits and restarts, a
//! commit writes only changed members, durability tickets, delta
//! anti-entropy between regions (durable only, deltas not whole sets), and
//! keyed retries.

use super::super::sets::{LikeAccepted, LikeRequest};
use super::super::*;
use super::Node;
use crate::crdt::HyperLogLog;
use crate::storage::Store;

impl Node {
    #[track_caller]
    fn like(&mut self, key: &str, member: &str, like: bool) -> LikeAccepted {
        self.replica
            .handle_like(
                1,
                &self.store,
                LikeRequest {
                    key,
                    member,
                    like,
                    idempotency_key: None,
                },
            )
            .unwrap()
    }

    fn count(&mut self, key: &str) -> u64 {
        self.replica.handle_like_count(1, &self.store, key).unwrap()
    }

    fn length(&mut self, key: &str, member: &str) -> u64 {
        self.replica
            .member_length(1, &self.store, key, member)
            .unwrap()
    }

    fn uniques(&mut self, key: &str) -> HyperLogLog {
        self.replica.handle_uniques(1, &self.store, key).unwrap()
    }
}

#[test]
fn double_likes_and_strange_unlikes_change_nothing_and_say_so() {
    let mut node = Node::new(1, "eu");
    let first = node.like("post", "sam", true);
    assert!(first.changed && first.liked);
    assert_eq!((first.count, first.length), (1, 1));
    let again = node.like("post", "sam", true);
    assert!(!again.changed && again.liked);
    assert_eq!((again.count, again.length), (1, 1));
    let stranger = node.like("post", "ann", false);
    assert!(!stranger.changed && !stranger.liked);
    assert_eq!(stranger.length, 0);
    assert_eq!((node.length("post", "ann"), node.count("post")), (0, 1));
    for round in 0..3 {
        // Each answer carries the member's length right after it.
        assert_eq!(node.like("post", "sam", false).length, 2 + 2 * round);
        assert_eq!(node.like("post", "sam", true).length, 3 + 2 * round);
    }
    assert_eq!((node.length("post", "sam"), node.count("post")), (7, 1));
}

#[test]
fn a_commit_writes_only_the_changed_members_and_the_count_survives_a_restart() {
    let mut node = Node::new(1, "eu");
    for i in 0..100 {
        node.like("post", &format!("u{i}"), true);
    }
    node.commit().unwrap();
    node.like("post", "u7", false);
    node.like("post", "new", true);
    let batch = node.replica.poll_commit().unwrap();
    assert_eq!(batch.likes.len(), 1);
    let mut written: Vec<&str> = batch.likes[0].members.iter().map(|(m, _)| &**m).collect();
    written.sort();
    assert_eq!(
        written,
        ["new", "u7"],
        "a commit rewrote more than the changed members"
    );
    assert_eq!(batch.likes[0].count, 100);
    node.store.write(&batch).unwrap();
    node.store.flush().unwrap();
    node.replica.handle_commit_done(batch.seq);
    let mut node = node.restart();
    assert_eq!(node.count("post"), 100);
    assert_eq!(
        (node.length("post", "u7"), node.length("post", "new")),
        (2, 1)
    );
    // The same name is a counter, a like set and a uniques key apart.
    assert_eq!(
        node.replica
            .handle_get(1, &node.store, "post")
            .unwrap()
            .value(),
        Ok(0)
    );
    assert_eq!(node.uniques("post").estimate(), 0.0);
}

#[test]
fn an_answer_waits_for_the_commit_that_makes_what_it_reports_durable() {
    let mut node = Node::new(1, "eu");
    let like = node.like("post", "sam", true);
    assert_eq!(like.durable_at_seq, 1);
    let batch = node.replica.poll_commit().unwrap();
    // A double tap while the first is being written waits for that commit.
    assert_eq!(node.like("post", "sam", true).durable_at_seq, batch.seq);
    node.store.write(&batch).unwrap();
    node.store.flush().unwrap();
    node.replica.handle_commit_done(batch.seq);
    // Once durable, a double tap waits for nothing new.
    assert_eq!(node.like("post", "sam", true).durable_at_seq, 1);
    assert_eq!(node.replica.poll_commit().map(|b| b.seq), None);
}

#[test]
fn a_crash_before_the_flush_loses_only_unacknowledged_likes_and_the_count_follows() {
    let mut node = Node::new(1, "eu");
    node.like("post", "a", true);
    node.commit();
    node.like("post", "b", true);
    let batch = node.replica.poll_commit().unwrap();
    node.store.write(&batch).unwrap();
    node.store.crash();
    let mut node = node.restart();
    assert_eq!((node.count("post"), node.length("post", "b")), (1, 0));
}

#[test]
fn a_failed_commit_writes_its_members_with_the_next_one() {
    let mut node = Node::new(1, "eu");
    node.like("post", "a", true);
    let batch = node.replica.poll_commit().unwrap();
    node.replica.handle_commit_failed(batch.seq);
    node.like("post", "b", true);
    let retry = node.replica.poll_commit().unwrap();
    assert_eq!(retry.likes[0].members.len(), 2);
    assert_eq!(retry.likes[0].count, 2);
}

#[test]
fn concurrent_likes_in_three_regions_count_once_and_converge_by_deltas() {
    let mut nodes = [Node::new(1, "eu"), Node::new(2, "us"), Node::new(3, "ap")];
    for node in nodes.iter_mut() {
        node.like("post", "sam", true);
        node.like(
            "post",
            &format!("own-{}", node.replica.identity().region),
            true,
        );
        node.replica
            .handle_observe(1, &node.store, "seen", &["x", "y"])
            .unwrap();
        node.commit();
    }
    pull_every_pair(&mut nodes, |_| {});
    let registers = nodes[0].uniques("seen");
    for node in nodes.iter_mut() {
        assert_eq!(node.count("post"), 4);
        assert_eq!(node.length("post", "sam"), 1);
        assert_eq!(node.uniques("seen"), registers);
    }
    assert!((registers.estimate() - 2.0).abs() < 0.1);
}

/// Two rounds of every node pulling from every other and committing, with
/// `check` on the puller after each commit.
fn pull_every_pair(nodes: &mut [Node], mut check: impl FnMut(&Node)) {
    for _round in 0..2 {
        for i in 0..nodes.len() {
            for j in 0..nodes.len() {
                if i != j {
                    let (a, b) = if i < j {
                        let (left, right) = nodes.split_at_mut(j);
                        (&mut left[i], &right[0])
                    } else {
                        let (left, right) = nodes.split_at_mut(i);
                        (&mut right[0], &left[j])
                    };
                    a.pull_from(b, 1 << 20);
                    a.commit();
                    check(a);
                }
            }
        }
    }
}

#[test]
fn a_pull_serves_durable_deltas_only_and_never_the_whole_set() {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "us");
    for i in 0..50 {
        a.like("post", &format!("u{i}"), true);
    }
    a.commit();
    b.pull_from(&a, 1 << 20);
    b.commit();
    assert_eq!(b.count("post"), 50);
    // A new like, not yet committed on `a`: not served.
    a.like("post", "late", true);
    let request = PullRequest {
        cluster_id: "test".into(),
        caller: ReplicaId(2),
        expected: Some(ReplicaId(1)),
        after: b.replica.peers().watermark(ReplicaId(1)),
        max_bytes: 1 << 20,
        directory_digest: None,
        protocol: b.replica.peers().own_protocol(),
        deltas_after: Some(b.replica.peers().delta_watermark(ReplicaId(1))),
        records_from: None,
        scope: None,
    };
    let chunk = a.replica.handle_pull(&a.store, &request).unwrap();
    assert!(chunk.deltas.is_empty(), "served a like that is not durable");
    a.commit();
    let chunk = a.replica.handle_pull(&a.store, &request).unwrap();
    // Only the changed member travels, not the 51-member set.
    assert_eq!(chunk.deltas.len(), 1);
    assert_eq!(chunk.deltas[0].len(), 1);
    b.pull_from(&a, 1 << 20);
    assert_eq!(b.count("post"), 51);
}

#[test]
fn an_unlike_in_one_region_wins_over_the_like_it_saw_everywhere() {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "us");
    a.like("post", "sam", true);
    a.commit();
    b.pull_from(&a, 1 << 20);
    b.like("post", "sam", false);
    b.commit();
    a.pull_from(&b, 1 << 20);
    assert_eq!((a.count("post"), a.length("post", "sam")), (0, 2));
    // And a later like wins over the unlike.
    a.like("post", "sam", true);
    a.commit();
    b.pull_from(&a, 1 << 20);
    assert_eq!((b.count("post"), b.length("post", "sam")), (1, 3));
}

#[test]
fn a_keyed_retry_of_a_like_is_applied_once_even_after_an_unlike() {
    let mut node = Node::new(1, "eu");
    let keyed = |like| LikeRequest {
        key: "post",
        member: "sam",
        like,
        idempotency_key: Some("tap-1"),
    };
    let first = node
        .replica
        .handle_like(1, &node.store, keyed(true))
        .unwrap();
    assert!(first.changed && !first.duplicate);
    node.commit();
    node.like("post", "sam", false);
    let retry = node
        .replica
        .handle_like(1, &node.store, keyed(true))
        .unwrap();
    assert!(retry.duplicate && !retry.changed);
    assert_eq!(retry.length, 0, "a duplicate's length is not kept");
    assert_eq!(node.count("post"), 0, "the retry liked again");
    // The same key for another request is refused.
    assert!(node
        .replica
        .handle_like(1, &node.store, keyed(false))
        .is_err());
}

/// The sets digest the node's store holds, computed from every record.
#[track_caller]
fn stored_digest(node: &Node) -> crate::crdt::SetsDigest {
    crate::storage::sets::compute_digest(&node.store).unwrap()
}

#[test]
fn the_sets_digest_is_the_durable_states_and_equal_iff_the_states_are() {
    let mut nodes = [Node::new(1, "eu"), Node::new(2, "us"), Node::new(3, "ap")];
    // Each region does its own likes, unlikes and observes, in its own order.
    for (at, node) in nodes.iter_mut().enumerate() {
        let region = node.replica.identity().region.clone();
        node.like("post", "sam", true);
        if at == 1 {
            node.like("post", "sam", false);
            node.like("post", "sam", true);
        }
        node.like("post", &format!("own-{region}"), true);
        node.like("post", &format!("gone-{region}"), true);
        node.like("post", &format!("gone-{region}"), false);
        node.like("other", "sam", true);
        let seen = [
            format!("{region}-1"),
            format!("{region}-2"),
            "shared".into(),
        ];
        let seen: Vec<&str> = seen.iter().map(String::as_str).collect();
        node.replica
            .handle_observe(1, &node.store, "seen", &seen)
            .unwrap();
        // Not durable yet: the published digest has not moved.
        assert_eq!(node.replica.sets_digest(), Default::default());
        // A failed commit's changes ride with the next one, digest and all.
        let failed = node.replica.poll_commit().unwrap();
        node.replica.handle_commit_failed(failed.seq);
        node.commit();
        assert_eq!(node.replica.sets_digest(), stored_digest(node));
    }
    assert_ne!(
        nodes[0].replica.sets_digest(),
        nodes[1].replica.sets_digest()
    );
    // The counters' digest knows nothing of sets.
    assert_eq!(nodes[0].replica.digest(), nodes[1].replica.digest());
    pull_every_pair(&mut nodes, |node| {
        assert_eq!(node.replica.sets_digest(), stored_digest(node));
    });
    let converged = nodes[0].replica.sets_digest();
    assert_ne!(converged, Default::default());
    for node in nodes.iter_mut() {
        assert_eq!(node.replica.sets_digest(), converged);
        assert_eq!(node.length("post", "sam"), 3, "us's unlike and like won");
    }
    // One member one length further apart: the digests differ.
    nodes[2].like("post", "sam", false);
    nodes[2].commit();
    assert_ne!(nodes[2].replica.sets_digest(), converged);
    assert_eq!(nodes[2].replica.sets_digest(), stored_digest(&nodes[2]));
    // A restart reads the digest back; a store whose digest a build without
    // one left behind (an older sequence) computes it from the records.
    let [a, _, c] = nodes;
    let c = c.restart();
    assert_eq!(c.replica.sets_digest(), stored_digest(&c));
    let stale =
        crate::storage::sets::recover_digest(&a.store, a.replica.durable_seq() + 1).unwrap();
    assert_eq!(stale, converged);
}
