//! Tests of folding inside the replica core (in-memory store): digests kept
//! by commits, fencing, a fold through a pull between two replicas, and the
//! sweep with a crash in the middle.

use super::super::tests::Node;
use super::*;
use crate::crdt::{FoldedBase, WriterDigest};
use crate::replica::folds::{FoldReport, FoldWait};
use crate::replica::{AddAccepted, AddRefused, AddRequest};
use crate::storage::{compute_writer_digests, Store};

const W: ReplicaId = ReplicaId(3);

pub(super) fn member(node: &Node, alive: bool) -> FoldMember {
    FoldMember {
        replica: node.replica.identity().replica,
        alive,
        node_name: format!("node-{}", node.replica.identity().replica.0),
        report: Some(node.replica.folds().report()),
    }
}

/// One round of the fold protocol at every live node, then a commit each.
fn fold_round(live: &mut [&mut Node], dead: &[FoldMember]) {
    fold_round_at(live, dead, 5, None);
}

/// [`fold_round`] at `now_ms`, retiring after `retire_after_ms` (when set).
pub(super) fn fold_round_at(
    live: &mut [&mut Node],
    dead: &[FoldMember],
    now_ms: u64,
    retire_after_ms: Option<u64>,
) {
    let members: Vec<FoldMember> = live
        .iter()
        .map(|node| member(node, true))
        .chain(dead.iter().cloned())
        .collect();
    for node in live.iter_mut() {
        let own = node.replica.identity().replica;
        let others: Vec<FoldMember> = members
            .iter()
            .filter(|m| m.replica != own)
            .cloned()
            .collect();
        node.replica
            .handle_fold_round(now_ms, "x", &others, retire_after_ms)
            .unwrap();
        node.commit();
    }
}

/// Two live nodes that hold everything a third, now dead, wrote.
fn cluster() -> (Node, Node, FoldMember) {
    let (a, b, w) = cluster_and_writer();
    let dead = FoldMember {
        alive: false,
        report: None,
        ..member(&w, false)
    };
    (a, b, dead)
}

/// Two nodes that hold everything the third, the writer `W`, wrote.
fn cluster_and_writer() -> (Node, Node, Node) {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "us");
    let mut w = Node::new(W.0, "ap");
    for (key, delta) in [("likes", 5), ("likes", -2), ("views", 7)] {
        w.add(key, delta);
        a.add(key, 1);
        b.add(key, 10);
    }
    for node in [&mut a, &mut b, &mut w] {
        node.commit();
    }
    a.pull_from(&w, 1 << 20);
    b.pull_from(&w, 1 << 20);
    a.commit();
    b.commit();
    b.pull_from(&a, 1 << 20);
    a.pull_from(&b, 1 << 20);
    a.commit();
    b.commit();
    (a, b, w)
}

/// The cluster with W retired by an operator at `a`, after `rounds` rounds.
fn retired_cluster(rounds: usize) -> (Node, Node, FoldMember) {
    let (mut a, mut b, dead) = cluster();
    a.replica
        .handle_retire(W, std::slice::from_ref(&dead))
        .unwrap();
    for _ in 0..rounds {
        fold_round(&mut [&mut a, &mut b], std::slice::from_ref(&dead));
    }
    (a, b, dead)
}

#[test]
fn a_fold_moves_the_writers_slots_into_the_base_and_changes_no_value() {
    let (mut a, mut b, dead) = cluster();
    let before = [
        (a.value("likes"), a.value("views")),
        (b.value("likes"), b.value("views")),
    ];
    assert_eq!(before[0], (25, 18));
    assert_eq!(before[0], before[1]);
    assert_eq!(a.replica.folds().digest_of(W).counters, 2);
    assert_eq!(
        a.replica.handle_retire(W, std::slice::from_ref(&dead)),
        Ok(true)
    );
    for _ in 0..3 {
        fold_round(&mut [&mut a, &mut b], std::slice::from_ref(&dead));
    }
    for node in [&mut a, &mut b] {
        assert_eq!(node.replica.folds().book().folded_at(W), Some(1));
        assert_eq!(node.replica.folds().applied(), 1);
        assert_eq!((node.value("likes"), node.value("views")), before[0]);
        let likes = node.replica.handle_get(9, &node.store, "likes").unwrap();
        assert_eq!(likes.slot(W), crate::crdt::Slot::default());
        assert_eq!(
            likes.folded(),
            FoldedBase {
                epoch: 1,
                p: 5,
                n: 2
            }
        );
    }
    // The fold survives a restart: record, applied epoch and folded counters.
    let mut a = a.restart();
    assert_eq!(a.replica.folds().book().epoch(), 1);
    assert_eq!(a.replica.folds().applied(), 1);
    assert_eq!(a.value("likes"), 25);
    // Merges between folded nodes stay exact; so does a late unfolded state.
    a.add("likes", 1);
    a.commit();
    b.pull_from(&a, 1 << 20);
    assert_eq!(b.value("likes"), 26);
}

#[test]
fn a_read_of_a_counter_nobody_wrote_writes_nothing_after_a_fold() {
    let (mut a, _, _) = retired_cluster(3);
    assert_eq!(a.replica.folds().applied(), 1);
    assert!(a.replica.poll_commit().is_none(), "the fold is committed");
    // Found by the simulator: reading an unknown key at a folded node made
    // an empty counter at the fold's epoch dirty, so a read wrote it to
    // disk and every peer pulled it.
    let unknown = a.replica.handle_get(9, &a.store, "never-written").unwrap();
    assert_eq!(unknown.exact_value(), 0);
    assert!(unknown.slots().is_empty());
    assert_eq!(a.replica.dirty_counters(), 0);
    assert!(a.replica.poll_commit().is_none());
    // A first add to it is written at the node's epoch, as any other.
    a.add("never-written", 4);
    a.commit();
    let written = a.replica.handle_get(9, &a.store, "never-written").unwrap();
    assert_eq!((written.exact_value(), written.folded().epoch), (4, 1));
}

#[test]
fn the_sweep_folds_every_stored_counter_and_resumes_after_a_crash() {
    let (a, mut b, dead) = cluster();
    // Nothing cached: only the sweep reaches the stored counters.
    let mut a = a.restart();
    a.replica
        .handle_retire(W, std::slice::from_ref(&dead))
        .unwrap();
    for _ in 0..3 {
        fold_round(&mut [&mut a, &mut b], std::slice::from_ref(&dead));
    }
    // Crash before the sweep: the cache is gone, the store still has W's slots
    // in counters nobody touched.
    a.store.crash();
    let mut a = a.restart();
    assert_eq!(a.replica.folds().applied(), 1);
    assert_eq!(a.replica.fold_swept(), 0);
    let stored = a.store.load_counter("views").unwrap().unwrap();
    assert_eq!(stored.state.folded().epoch, 0, "not folded on disk yet");
    let mut visited = 0;
    loop {
        let step = a.replica.poll_fold_sweep(1, &a.store, 1).unwrap();
        if step == 0 {
            break;
        }
        visited += step;
        a.commit();
    }
    assert!(visited >= 2, "{visited}");
    assert_eq!(a.replica.fold_swept(), 1);
    for key in ["likes", "views"] {
        let stored = a.store.load_counter(key).unwrap().unwrap();
        assert_eq!(stored.state.folded().epoch, 1, "{key}");
        assert_eq!(stored.state.slot(W), crate::crdt::Slot::default());
    }
    assert_eq!((a.value("likes"), a.value("views")), (25, 18));
    // The digest of W is empty: no counter holds a slot of it.
    assert_eq!(a.replica.folds().digest_of(W), WriterDigest::default());
    assert_eq!(a.restart().replica.fold_swept(), 1);
}

/// `a` runs a fold round on a report of `b` that lists `a` as retired.
fn hear_own_retirement(a: &mut Node, b: &Node) {
    let report = FoldReport {
        retired: vec![a.replica.identity().replica],
        ..FoldReport::default()
    };
    let others = [FoldMember {
        report: Some(report),
        ..member(b, true)
    }];
    a.replica.handle_fold_round(1, "x", &others, None).unwrap();
}

#[test]
fn a_retired_replica_is_fenced() {
    let (mut a, b, _) = cluster();
    hear_own_retirement(&mut a, &b);
    assert!(a.replica.is_fenced());
    let refused = a.replica.handle_add(
        1,
        &a.store,
        AddRequest {
            key: "likes",
            delta: 1,
            idempotency_key: None,
        },
    );
    assert!(matches!(refused, Err(AddRefused::Fenced(_))));
    assert!(refused
        .unwrap_err()
        .to_string()
        .contains("wipe its data directory"));
    assert_eq!(a.value("likes"), 25);
}

#[test]
fn a_node_on_an_empty_disk_never_folds_a_writer_it_holds_nothing_of() {
    // Found by the simulator: a node restarted on a wiped disk heard from
    // the others' reports that its old id was retired; its directory held
    // only itself, so "every counted member agrees" held of nobody, and it
    // committed a fold of the writer at an empty state. Everyone adopted
    // the record and merged its empty base over the writer's real slots.
    let (mut a, mut b, dead) = retired_cluster(1);
    assert!(a.replica.folds().is_retired(W) && b.replica.folds().is_retired(W));
    let mut fresh = Node::new(4, "ap");
    let others = [member(&a, true), member(&b, true), dead.clone()];
    for _ in 0..3 {
        fresh
            .replica
            .handle_fold_round(1, "x", &others, None)
            .unwrap();
        assert!(fresh.replica.folds().is_retired(W));
        assert_eq!(fresh.replica.folds().book().epoch(), 0);
        assert_eq!(fresh.replica.folds().candidate(), None);
    }
    assert!(matches!(
        fresh.replica.folds().waits().get(&W),
        Some(FoldWait::NotLearned { .. })
    ));
    // Once it pulled the writer's state it counts the members it pulled
    // from, and the fold goes on with everyone.
    fresh.pull_from(&a, 1 << 20);
    fresh.commit();
    for _ in 0..4 {
        fold_round(
            &mut [&mut a, &mut b, &mut fresh],
            std::slice::from_ref(&dead),
        );
    }
    for node in [&mut a, &mut b, &mut fresh] {
        assert_eq!(node.replica.folds().book().folded_at(W), Some(1));
        assert_eq!((node.value("likes"), node.value("views")), (25, 18));
    }
}

#[test]
fn a_chunk_folded_at_an_unknown_epoch_is_refused_whole() {
    let (a, _, _) = retired_cluster(3);
    let mut fresh = Node::new(4, "eu");
    fresh.add("likes", 100);
    fresh.commit();
    let request = crate::replica::PullRequest {
        cluster_id: super::super::tests::CLUSTER.into(),
        caller: ReplicaId(4),
        expected: None,
        after: Cursor::default(),
        max_bytes: 1 << 20,
        directory_digest: None,
        protocol: fresh.replica.peers().own_protocol(),
        deltas_after: None,
        records_from: None,
        scope: None,
    };
    let chunk = a.replica.handle_pull(&a.store, &request).unwrap();
    let refused = fresh
        .replica
        .handle_pull_chunk(1, &fresh.store, ReplicaId(1), chunk)
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("holds fold records up to epoch 0"),
        "{refused}"
    );
    assert_eq!(fresh.value("likes"), 100);
    assert_eq!(fresh.value("views"), 0);
    // Once it has the record (by gossip), the same pull merges exactly.
    let others = [member(&a, true)];
    fresh
        .replica
        .handle_fold_round(1, "x", &others, None)
        .unwrap();
    fresh.pull_from(&a, 1 << 20);
    assert_eq!(fresh.value("likes"), 125);
    assert_eq!(fresh.value("views"), 18);
}

#[test]
fn writer_digests_kept_by_commits_equal_a_full_recomputation() {
    let (a, _, _) = cluster();
    let kept: Vec<_> = {
        let mut all: Vec<_> = a.replica.folds().digests().collect();
        all.sort_by_key(|(writer, _)| *writer);
        all
    };
    let computed = compute_writer_digests(&a.store).unwrap();
    assert_eq!(kept, computed);
    assert_eq!(kept.len(), 3);
    let recovered = a.store.recover(0).unwrap();
    assert!(recovered.writer_digests_current);
    let mut stored = recovered.writer_digests;
    stored.sort_by_key(|(writer, _)| *writer);
    assert_eq!(stored, kept);
}

fn add_one(node: &mut Node, now_ms: u64) -> Result<AddAccepted, AddRefused> {
    node.replica.handle_add(
        now_ms,
        &node.store,
        AddRequest {
            key: "likes",
            delta: 1,
            idempotency_key: None,
        },
    )
}

#[test]
fn a_restart_hold_refuses_adds_until_released_or_expired_and_says_why() {
    let (mut a, _, _) = cluster();
    a.replica.hold_adds_until(1_000);
    let before = a.value("likes");
    let held = add_one(&mut a, 400).unwrap_err();
    assert!(
        matches!(
            held,
            AddRefused::HeldAfterRestart {
                remaining_ms: 600,
                ..
            }
        ),
        "{held:?}"
    );
    assert!(
        held.to_string()
            .contains("holds adds until a peer tells it"),
        "{held}"
    );
    assert_eq!(a.value("likes"), before, "a held add changed nothing");
    // The bound passes with no peer heard: adds are taken.
    assert!(add_one(&mut a, 1_000).is_ok());
    assert!(!a.replica.restart_hold_on(1_000));
    // A release (a peer's report was handled) ends it at once.
    a.replica.hold_adds_until(5_000);
    assert!(a.replica.release_restart_hold());
    assert!(add_one(&mut a, 2_000).is_ok());
}

#[test]
fn a_retirement_heard_during_the_hold_fences_instead() {
    let (mut a, b, _) = cluster();
    a.replica.hold_adds_until(10_000);
    hear_own_retirement(&mut a, &b);
    a.replica.release_restart_hold();
    assert!(matches!(add_one(&mut a, 2), Err(AddRefused::Fenced(_))));
}

#[test]
fn only_a_directory_that_had_peers_needs_a_restart_hold() {
    // A single node that never had a peer: no hold, seeds or not... unless
    // it holds committed state and has seeds (a peer may know it).
    let mut alone = Node::new(9, "eu");
    assert!(!alone.replica.needs_restart_hold(false));
    assert!(!alone.replica.needs_restart_hold(true), "a fresh directory");
    alone.add("likes", 1);
    alone.commit();
    assert!(!alone.replica.needs_restart_hold(false));
    assert!(alone.replica.needs_restart_hold(true));
    // A member that pulled a peer's state knows it.
    let (a, _, _) = cluster();
    assert!(a.replica.needs_restart_hold(false));
}

#[test]
fn a_folded_writer_is_pruned_for_good_and_a_peer_that_kept_it_does_not_bring_it_back() {
    let (mut a, b, dead) = retired_cluster(3);
    // Nothing is pruned while this node's digest says a stored counter
    // holds a slot of W: the fold rounds folded the cached counters.
    // a pulled from W: it knows W's region and keeps a watermark of it.
    assert_eq!(a.replica.region_of(W), Some("ap"));
    assert_ne!(a.replica.peers().watermark(W), Cursor::default());
    while a.replica.poll_fold_sweep(1, &a.store, 100).unwrap() > 0 {
        a.commit();
    }
    a.commit();
    assert_eq!(a.replica.folds().digest_of(W), WriterDigest::default());
    assert_eq!(a.replica.prune_folded(), vec![(W, Some("ap".to_owned()))]);
    a.commit();
    assert_eq!(a.replica.region_of(W), None);
    assert_eq!(a.replica.peers().watermark(W), Cursor::default());
    assert!(a.replica.prune_folded().is_empty(), "pruned once");
    // The deletions were committed: a restart does not bring W back.
    let mut a = a.restart();
    assert_eq!(a.replica.region_of(W), None);
    assert_eq!(a.replica.peers().watermark(W), Cursor::default());
    // b has not pruned W: its whole directory, sent with a pull, still
    // names it, and a does not learn it again. Values are unchanged.
    assert_eq!(b.replica.region_of(W), Some("ap"));
    a.pull_from(&b, 1 << 20);
    a.commit();
    assert_eq!(a.replica.region_of(W), None);
    assert_eq!((a.value("likes"), a.value("views")), (25, 18));
    // W is still known as retired: retiring it again is no error.
    assert_eq!(
        a.replica.handle_retire(W, std::slice::from_ref(&dead)),
        Ok(false)
    );
}

#[test]
fn a_retired_writer_that_came_back_is_folded_only_at_the_state_it_fenced_itself_at() {
    // The restart hold's gap. a retires W while W is down; b has not heard
    // yet. W restarts on its old directory and holds adds, hears only b,
    // which knows no retirement, and ends its hold (as the fold keeper
    // does). It takes adds: some reach b and a, the last one does not yet.
    let (mut a, mut b, w) = cluster_and_writer();
    let down = FoldMember {
        alive: false,
        report: None,
        ..member(&w, false)
    };
    a.replica
        .handle_retire(W, std::slice::from_ref(&down))
        .unwrap();
    a.commit();
    let mut w = w.restart();
    w.replica.hold_adds_until(u64::MAX);
    w.replica
        .handle_fold_round(1, "x", &[member(&b, true)], None)
        .unwrap();
    assert!(!w.replica.is_fenced(), "b knows no retirement");
    assert!(w.replica.release_restart_hold());
    w.add("likes", 100);
    w.commit();
    b.pull_from(&w, 1 << 20);
    b.commit();
    a.pull_from(&b, 1 << 20);
    a.commit();
    w.add("likes", 1_000);
    w.commit();
    let acknowledged = 25 + 100 + 1_000;
    // Everyone hears everyone: b and W learn the retirement, W fences
    // itself. While W's own report does not carry its final state, a and b
    // (whose states of W agree, without the last add) must not fold it.
    for _ in 0..4 {
        fold_round(&mut [&mut a, &mut b, &mut w], &[]);
    }
    assert!(w.replica.is_fenced());
    assert_eq!(
        a.replica.folds().book().epoch(),
        0,
        "folded without W's last add"
    );
    assert!(
        matches!(
            a.replica.folds().waits().get(&W),
            Some(FoldWait::Differs { member: W, .. })
        ),
        "{:?}",
        a.replica.folds().waits()
    );
    // Anti-entropy brings W's final state to a and b: the fold goes ahead,
    // at that state, and no acknowledged add is lost anywhere.
    a.pull_from(&w, 1 << 20);
    b.pull_from(&w, 1 << 20);
    a.commit();
    b.commit();
    let final_state = w.replica.folds().digest_of(W);
    assert_eq!(a.replica.folds().digest_of(W), final_state);
    for _ in 0..4 {
        fold_round(&mut [&mut a, &mut b, &mut w], &[]);
    }
    w.pull_from(&a, 1 << 20);
    w.commit();
    for node in [&mut a, &mut b, &mut w] {
        assert_eq!(node.replica.folds().book().folded_at(W), Some(1));
        assert_eq!(node.replica.folds().applied(), 1);
        assert_eq!(node.value("likes"), acknowledged);
    }
    let record = a.replica.folds().book().record(1).unwrap();
    assert_eq!(record.writers, vec![(W, final_state)]);
}

/// The writers' digests by partition: computed from the counters when a
/// node starts tracking them, kept by every commit after (equal to a fresh
/// computation), saved at a clean stop and read back at the next start only
/// while nothing was committed since.
#[test]
fn digests_by_partition_are_kept_by_commits_and_read_back_only_when_current() {
    let count = super::super::tests::sixteen();
    let keys: Vec<String> = (0..4)
        .map(|partition| super::super::tests::key_in("k", partition))
        .collect();
    let mut a = Node::new(1, "eu");
    a.add(&keys[0], 2);
    a.commit();
    assert!(!crate::storage::set_partition_count(&mut a.replica, count, &a.store, None).unwrap());
    for (i, key) in keys.iter().enumerate() {
        a.add(key, i as i64 + 1);
    }
    a.commit();
    let (computed, later) =
        crate::storage::compute_partition_digests(&a.store, count, a.replica.folds().book())
            .unwrap();
    assert!(later.is_empty(), "no fold of a live writer, no later phase");
    let (_, kept, _) = a.replica.folds().partition_digests().unwrap();
    assert_eq!(kept, &computed, "commits keep what a computation finds");
    assert_eq!(
        kept[&ReplicaId(1)].len(),
        4,
        "one digest per partition written: {kept:?}"
    );

    // Saved at a clean stop, read back at the next start (not recomputed:
    // a doctored copy with the same sequence is taken as it is).
    let saved = crate::storage::saved_partition_digests(&a.replica).unwrap();
    let mut doctored = computed.clone();
    doctored
        .get_mut(&ReplicaId(1))
        .unwrap()
        .remove(&keys_partition(&keys[3], count));
    let doctored = crate::storage::encoding::encode_partition_digests(
        &crate::storage::encoding::SavedDigests {
            durable_seq: a.replica.durable_seq(),
            partitions: count.get(),
            writers: doctored,
            sets: vec![0; 16],
        },
    );
    let mut b = a.restart();
    assert!(
        crate::storage::set_partition_count(&mut b.replica, count, &b.store, Some(&doctored))
            .unwrap()
    );
    assert_eq!(
        b.replica.folds().partition_digests().unwrap().1[&ReplicaId(1)].len(),
        3
    );
    // The true copy, after a restart: used.
    let mut c = b.restart();
    assert!(
        crate::storage::set_partition_count(&mut c.replica, count, &c.store, Some(&saved)).unwrap()
    );
    assert_eq!(c.replica.folds().partition_digests().unwrap().1, &computed);
    // A commit since the save: the copy is stale and is computed instead;
    // so is a damaged one, or one of another partition count.
    c.add(&keys[1], 5);
    c.commit();
    let (now, _) =
        crate::storage::compute_partition_digests(&c.store, count, c.replica.folds().book())
            .unwrap();
    let mut damaged = saved.clone();
    damaged[3] ^= 1;
    let other = crate::storage::encoding::encode_partition_digests(
        &crate::storage::encoding::SavedDigests {
            durable_seq: c.replica.durable_seq(),
            partitions: 8,
            writers: now.clone(),
            sets: vec![0; 8],
        },
    );
    for stale in [saved, damaged, other] {
        c = c.restart();
        assert!(!crate::storage::set_partition_count(
            &mut c.replica,
            count,
            &c.store,
            Some(&stale)
        )
        .unwrap());
        assert_eq!(c.replica.folds().partition_digests().unwrap().1, &now);
    }
}

fn keys_partition(key: &str, count: crate::partition::PartitionCount) -> u32 {
    count.of_key(key.as_bytes()).0
}

#[test]
fn a_node_restarted_after_gossip_dropped_an_old_incarnation_still_retires_it() {
    // `a` saw W up, as node-3's incarnation, and committed since.
    let (mut a, _b, w) = cluster_and_writer();
    let seen = member(&w, true);
    a.replica.note_node_names(std::slice::from_ref(&seen));
    a.commit();
    // Every node restarts (a rolling upgrade) and gossip now lists only
    // node-3's new incarnation: what `a` knows of W's node is on its disk.
    let mut a = a.restart();
    let successor = FoldMember {
        replica: ReplicaId(30),
        report: None,
        ..seen
    };
    for now_ms in [1_000, 1_600] {
        a.replica
            .handle_fold_round(now_ms, "x", std::slice::from_ref(&successor), Some(500))
            .unwrap();
    }
    assert!(a.replica.folds().is_retired(W), "W is retired as replaced");
    // Its retirement deletes its node name from the disk.
    a.commit();
    let names = a.store.recover(0).unwrap().node_names;
    assert!(names.iter().all(|(replica, _)| *replica != W), "{names:?}");
    assert!(names.iter().any(|(replica, _)| *replica == ReplicaId(30)));
}

#[test]
fn a_restart_does_not_start_the_wait_for_an_old_incarnation_over() {
    let (mut a, _b, w) = cluster_and_writer();
    let seen = member(&w, true);
    let successor = FoldMember {
        replica: ReplicaId(30),
        report: None,
        ..seen.clone()
    };
    // `a` sees W go down at 1,000 while its successor is up, and commits.
    a.replica.note_node_names(std::slice::from_ref(&seen));
    a.replica
        .handle_fold_round(1_000, "x", std::slice::from_ref(&successor), Some(500))
        .unwrap();
    assert!(!a.replica.folds().is_retired(W));
    a.commit();
    assert_eq!(a.store.recover(0).unwrap().dead_since, [(W, 1_000)]);
    // Restarted before the wait is over, it goes on from 1,000: retired at
    // 1,600, not at 500 ms after the restart.
    let mut a = a.restart();
    a.replica
        .handle_fold_round(1_600, "x", std::slice::from_ref(&successor), Some(500))
        .unwrap();
    assert!(a.replica.folds().is_retired(W), "W is retired as replaced");
    // The retirement deletes its dead-since time with its name.
    a.commit();
    let recovered = a.store.recover(0).unwrap();
    assert!(
        recovered.dead_since.is_empty(),
        "{:?}",
        recovered.dead_since
    );
}

#[test]
fn a_replica_seen_up_again_loses_its_dead_since_time() {
    let (mut a, _b, w) = cluster_and_writer();
    let up = member(&w, true);
    let down = FoldMember {
        alive: false,
        ..up.clone()
    };
    a.replica.note_node_names(std::slice::from_ref(&up));
    a.replica
        .handle_fold_round(1_000, "x", std::slice::from_ref(&down), Some(500))
        .unwrap();
    a.commit();
    assert_eq!(a.store.recover(0).unwrap().dead_since, [(W, 1_000)]);
    a.replica
        .handle_fold_round(1_200, "x", std::slice::from_ref(&up), Some(500))
        .unwrap();
    a.commit();
    assert!(a.store.recover(0).unwrap().dead_since.is_empty());
    // Down again later: the wait starts at the new time.
    let mut a = a.restart();
    a.replica
        .handle_fold_round(5_000, "x", std::slice::from_ref(&down), Some(500))
        .unwrap();
    a.commit();
    assert_eq!(a.store.recover(0).unwrap().dead_since, [(W, 5_000)]);
}
