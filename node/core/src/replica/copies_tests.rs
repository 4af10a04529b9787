//! Tests of replicated durability in the core: what a push carries, when
//! `replicated_seq` moves, retries of failed pushes and commits, and the
//! copy's side (merge, ticket, refusals).

use super::*;
use crate::crdt::{FoldedBase, PnCounter, Slot};
use crate::replica::tests::Node;
use crate::replica::CopyRefused;
use crate::replica::{Identity, ReplicaConfig};
use crate::storage::{MemoryStore, Store};

const CLUSTER: &str = "test";

/// The core's test node, with what these tests add to it.
trait Copies {
    fn add_as(&mut self, key: &str, delta: i64, replicated: bool, idempotency: Option<&str>)
        -> u64;
    fn take(&mut self, push: &CopyPush, key: &str) -> PnCounter;
}

impl Copies for Node {
    #[track_caller]
    fn add_as(
        &mut self,
        key: &str,
        delta: i64,
        replicated: bool,
        idempotency: Option<&str>,
    ) -> u64 {
        let request = AddRequest {
            key,
            delta,
            idempotency_key: idempotency,
        };
        let accepted = if replicated {
            self.replica.handle_add_replicated(1, &self.store, request)
        } else {
            self.replica.handle_add(1, &self.store, request)
        };
        accepted.unwrap().durable_at_seq
    }

    /// Takes `push` as a copy, commits until it is durable; returns the
    /// copy's state of `key`.
    #[track_caller]
    fn take(&mut self, push: &CopyPush, key: &str) -> PnCounter {
        let accepted = self.replica.handle_copy_push(1, &self.store, push).unwrap();
        while self.replica.durable_seq() < accepted.durable_at_seq {
            self.commit().expect("the ticket's commit comes");
        }
        self.store.load_counter(key).unwrap().unwrap().state
    }
}

fn slot(p: u64) -> Slot {
    Slot { p, n: 0 }
}

#[test]
fn a_replicated_add_is_pushed_after_its_commit_and_confirmed_by_the_push() {
    let mut a = Node::new(1, "eu");
    let ticket = a.add_as("likes", 5, true, None);
    a.add_as("likes", 2, true, None);
    assert!(a.replica.poll_push().is_none(), "nothing is durable yet");
    assert_eq!(a.commit(), Some(ticket));
    assert_eq!(a.replica.replicated_seq(), 0, "durable here, not on a copy");
    let push = a.replica.poll_push().unwrap();
    assert_eq!(push.source, ReplicaId(1));
    assert_eq!(push.upto_seq, ticket);
    assert_eq!(
        push.counters,
        vec![("likes".into(), slot(7), FoldedBase::default())]
    );
    assert!(a.replica.poll_push().is_none(), "one push at a time");
    a.replica.handle_push_done(push.upto_seq);
    assert_eq!(a.replica.replicated_seq(), ticket);
}

#[test]
fn sync_adds_are_never_pushed_and_do_not_hold_replicated_seq_back() {
    let mut a = Node::new(1, "eu");
    let ticket = a.add_as("views", 1, false, None);
    a.commit();
    assert!(a.replica.poll_push().is_none());
    assert_eq!(a.replica.replicated_seq(), ticket);
}

#[test]
fn adds_gather_while_a_push_is_in_flight_and_a_hot_key_is_pushed_once() {
    let mut a = Node::new(1, "eu");
    a.add_as("hot", 1, true, None);
    a.commit();
    let first = a.replica.poll_push().unwrap();
    for _ in 0..100 {
        a.add_as("hot", 1, true, None);
    }
    let second_ticket = a.commit().unwrap();
    assert!(a.replica.poll_push().is_none());
    a.replica.handle_push_done(first.upto_seq);
    assert_eq!(
        a.replica.replicated_seq(),
        first.upto_seq,
        "the second commit waits for its own push"
    );
    let second = a.replica.poll_push().unwrap();
    assert_eq!(
        second.counters,
        vec![("hot".into(), slot(101), FoldedBase::default())]
    );
    a.replica.handle_push_done(second.upto_seq);
    assert_eq!(a.replica.replicated_seq(), second_ticket);
}

#[test]
fn a_failed_push_goes_into_the_next_one_and_nothing_is_confirmed_meanwhile() {
    let mut a = Node::new(1, "eu");
    a.add_as("k1", 1, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    a.add_as("k2", 1, true, None);
    let later = a.commit().unwrap();
    a.replica.handle_push_failed(push.upto_seq);
    assert_eq!(a.replica.replicated_seq(), 0);
    let retry = a.replica.poll_push().unwrap();
    let mut keys: Vec<&str> = retry.counters.iter().map(|(k, ..)| k.as_ref()).collect();
    keys.sort();
    assert_eq!(keys, vec!["k1", "k2"]);
    a.replica.handle_push_done(retry.upto_seq);
    assert_eq!(a.replica.replicated_seq(), later);
}

#[test]
fn a_stale_push_answer_changes_nothing() {
    let mut a = Node::new(1, "eu");
    a.add_as("k", 1, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    a.replica.handle_push_done(push.upto_seq + 7);
    a.replica.handle_push_failed(push.upto_seq + 7);
    assert_eq!(a.replica.replicated_seq(), 0);
    assert_eq!(a.replica.copies_pending(), (0, true));
}

#[test]
fn a_failed_commit_moves_the_want_to_the_next_commit() {
    let mut a = Node::new(1, "eu");
    let ticket = a.add_as("k", 3, true, None);
    let batch = a.replica.poll_commit().unwrap();
    assert_eq!(batch.seq, ticket);
    drop(batch);
    a.replica.handle_commit_failed(ticket);
    let seq = a.commit().unwrap();
    assert!(seq > ticket);
    assert_eq!(
        a.replica.replicated_seq(),
        0,
        "the retried commit is pushed"
    );
    let push = a.replica.poll_push().unwrap();
    assert_eq!(
        push.counters,
        vec![("k".into(), slot(3), FoldedBase::default())]
    );
}

#[test]
fn a_replicated_retry_of_a_sync_add_pushes_its_counter() {
    let mut a = Node::new(1, "eu");
    a.add_as("k", 4, false, Some("once"));
    a.commit();
    assert!(a.replica.poll_push().is_none());
    let ticket = a.add_as("k", 4, true, Some("once"));
    assert!(
        ticket > a.replica.durable_seq(),
        "it waits for a new commit"
    );
    a.commit();
    let push = a.replica.poll_push().unwrap();
    assert_eq!(
        push.counters,
        vec![("k".into(), slot(4), FoldedBase::default())],
        "counted once"
    );
    a.replica.handle_push_done(push.upto_seq);
    assert!(a.replica.replicated_seq() >= ticket);
}

#[test]
fn counters_waiting_for_copies_are_not_evicted() {
    let identity = Identity {
        replica: ReplicaId(1),
        region: "eu".into(),
    };
    let store = MemoryStore::new(identity.clone());
    let config = ReplicaConfig {
        cluster_id: CLUSTER.into(),
        cache_capacity: 1,
        ..Default::default()
    };
    let mut a = Node {
        replica: Replica::open(identity, config, store.recover(0).unwrap(), 0),
        store,
    };
    for key in ["a", "b", "c"] {
        a.add_as(key, 1, true, None);
    }
    a.commit();
    a.replica.tick(10);
    assert_eq!(a.replica.cached_counters(), 3);
    let push = a.replica.poll_push().unwrap();
    assert_eq!(push.counters.len(), 3);
    a.replica.handle_push_done(push.upto_seq);
    a.replica.tick(20);
    assert!(a.replica.cached_counters() < 3);
}

#[test]
fn a_copy_merges_the_slot_and_names_the_commit_that_makes_it_durable() {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "eu");
    b.add_as("likes", 10, false, None);
    a.add_as("likes", 5, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    let accepted = b.replica.handle_copy_push(1, &b.store, &push).unwrap();
    assert_eq!(accepted.durable_at_seq, b.replica.durable_seq() + 1);
    assert_eq!(accepted.changed.len(), 1);
    let state = b.take(&push, "likes");
    assert_eq!(state.slot(ReplicaId(1)), slot(5));
    assert_eq!(state.slot(ReplicaId(2)), slot(10));
    assert_eq!(b.replica.region_of(ReplicaId(1)), Some("eu"));
    // The same push again: nothing changes and nothing waits.
    let again = b.replica.handle_copy_push(1, &b.store, &push).unwrap();
    assert_eq!((again.durable_at_seq, again.changed.len()), (0, 0));
}

#[test]
fn a_push_that_merges_nothing_waits_for_the_commit_in_flight() {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "eu");
    a.add_as("k", 5, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    b.replica.handle_copy_push(1, &b.store, &push).unwrap();
    let batch = b.replica.poll_commit().unwrap();
    // The state is being written: the same push must wait for that commit.
    let again = b.replica.handle_copy_push(1, &b.store, &push).unwrap();
    assert_eq!(again.durable_at_seq, batch.seq);
}

#[test]
fn a_copy_refuses_what_is_not_a_push_of_its_region() {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "eu");
    let mut us = Node::new(3, "us");
    a.add_as("k", 1, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    let refused = |node: &mut Node, push: &CopyPush| {
        node.replica
            .handle_copy_push(1, &node.store, push)
            .unwrap_err()
    };
    assert!(matches!(
        refused(&mut us, &push),
        CopyRefused::OtherRegion { .. }
    ));
    assert!(matches!(refused(&mut a, &push), CopyRefused::FromItself(_)));
    let other_cluster = CopyPush {
        cluster_id: "other".into(),
        ..push.clone()
    };
    assert!(matches!(
        refused(&mut b, &other_cluster),
        CopyRefused::WrongCluster { .. }
    ));
    let twice = CopyPush {
        counters: vec![
            ("k".into(), slot(1), FoldedBase::default()),
            ("k".into(), slot(2), FoldedBase::default()),
        ],
        ..push.clone()
    };
    assert!(matches!(
        refused(&mut b, &twice),
        CopyRefused::DuplicateKey(_)
    ));
    let unknown = super::super::version::NEWEST + 1;
    let newer = CopyPush {
        protocol: ProtocolWindow::at(unknown, unknown),
        ..push.clone()
    };
    assert!(matches!(
        refused(&mut b, &newer),
        CopyRefused::IncompatibleProtocol { .. }
    ));
    // Nothing of a refused push was merged.
    assert_eq!(
        b.replica.handle_get(1, &b.store, "k").unwrap(),
        PnCounter::new()
    );
}

#[test]
fn a_wiped_writer_s_slot_survives_on_its_copy() {
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "eu");
    a.add_as("votes", 3, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    b.take(&push, "votes");
    a.replica.handle_push_done(push.upto_seq);
    drop(a); // the disk is gone
    let mut c = Node::new(4, "eu"); // the wiped node's new replica
    let peer = b.replica.identity().replica;
    let request = crate::replica::PullRequest {
        cluster_id: CLUSTER.into(),
        caller: ReplicaId(4),
        expected: Some(peer),
        after: Default::default(),
        max_bytes: 1 << 20,
        directory_digest: None,
        protocol: c.replica.peers().own_protocol(),
        deltas_after: None,
        records_from: None,
        scope: None,
    };
    let chunk = b.replica.handle_pull(&b.store, &request).unwrap();
    c.replica
        .handle_pull_chunk(1, &c.store, peer, chunk)
        .unwrap();
    let state = c.replica.handle_get(1, &c.store, "votes").unwrap();
    assert_eq!(state.slot(ReplicaId(1)), slot(3));
}

#[test]
fn a_push_carries_its_commits_records_and_the_copy_recognises_a_retry_once_it_answers() {
    let (mut a, mut b) = (Node::new(1, "eu"), Node::new(2, "eu"));
    a.add_as("votes", 3, true, Some("req-1"));
    a.add_as("views", 1, false, Some("sync-1"));
    a.commit();
    let push = a.replica.poll_push().unwrap();
    assert_eq!(push.records.len(), 2, "the replicated commit's records");
    assert!(push.id_keys.contains(&a.replica.id_keys()[0]));
    // A failed push keeps its records for the next one.
    a.replica.handle_push_failed(push.upto_seq);
    let push = a.replica.poll_push().unwrap();
    assert_eq!(
        push.records.len(),
        2,
        "the records go with the retried push"
    );
    b.take(&push, "votes");
    let retry = b
        .replica
        .handle_add(
            1,
            &b.store,
            AddRequest {
                key: "votes",
                delta: 3,
                idempotency_key: Some("req-1"),
            },
        )
        .unwrap();
    assert!(
        retry.duplicate,
        "the copy knows the record once it answered"
    );
    assert_eq!(retry.value, 3);
    // A commit of sync adds only pushes nothing, records included.
    a.replica.handle_push_done(push.upto_seq);
    a.add_as("views", 1, false, Some("sync-2"));
    a.commit();
    assert!(a.replica.poll_push().is_none());
}

#[test]
fn a_push_carries_at_most_a_chunk_of_records_and_the_rest_ride_with_the_next() {
    let mut a = Node::new(1, "eu");
    let keys: Vec<String> = (0..=MAX_CHUNK_RECORDS)
        .map(|i| format!("req-{i}"))
        .collect();
    for key in &keys {
        a.add_as("votes", 1, true, Some(key));
    }
    a.commit();
    let push = a.replica.poll_push().unwrap();
    assert_eq!(push.records.len(), MAX_CHUNK_RECORDS, "a copy refuses more");
    a.replica.handle_push_done(push.upto_seq);
    a.add_as("votes", 1, true, None);
    a.commit();
    let next = a.replica.poll_push().unwrap();
    assert_eq!(next.records.len(), 1, "the one left over");
}

#[test]
fn more_pending_counters_than_a_push_takes_go_in_several_and_hold_replicated_seq_back() {
    // Before, one push carried every pending counter, which a copy refuses
    // above MAX_PUSH_COUNTERS: after a commit of that many keys (a disk
    // stall, a burst over many keys), every push was refused for good and no
    // replicated add was acknowledged again.
    let mut a = Node::new(1, "eu");
    let first = a.add_as("k-0", 1, true, None);
    for i in 1..=MAX_PUSH_COUNTERS {
        a.add_as(&format!("k-{i}"), 1, true, None);
    }
    assert_eq!(a.commit(), Some(first));
    let later = a.add_as("late", 1, true, None);
    assert_eq!(a.commit(), Some(later));
    let push = a.replica.poll_push().unwrap();
    assert_eq!(
        push.counters.len(),
        MAX_PUSH_COUNTERS,
        "a copy takes this many"
    );
    assert_eq!(&*push.counters[0].0, "k-0", "oldest first");
    a.replica.handle_push_done(push.upto_seq);
    assert_eq!(
        a.replica.replicated_seq(),
        first - 1,
        "the first commit still has a counter to push"
    );
    let rest = a.replica.poll_push().unwrap();
    let keys: Vec<String> = rest
        .counters
        .iter()
        .map(|(key, ..)| key.to_string())
        .collect();
    assert_eq!(
        keys,
        vec![format!("k-{MAX_PUSH_COUNTERS}"), "late".to_string()]
    );
    a.replica.handle_push_failed(rest.upto_seq);
    assert_eq!(a.replica.replicated_seq(), first - 1);
    let retry = a.replica.poll_push().unwrap();
    assert_eq!(
        retry.counters.len(),
        2,
        "a failed push's counters come back"
    );
    a.replica.handle_push_done(retry.upto_seq);
    assert_eq!(a.replica.replicated_seq(), later);
    assert!(a.replica.poll_push().is_none());
}

/// A copy of a partition the copy does not keep (a top-up, or a sender
/// that had not yet seen it release the partition) is taken and made
/// durable like any other, then dropped by a purge pass it starts, down to
/// the copy's own slot: no owner pulls it from there, and it would stay
/// forever.
#[test]
fn a_copy_of_a_partition_not_kept_is_durable_then_purged_to_the_own_slot() {
    use crate::partition::{PartitionCount, PartitionSet};
    let count = PartitionCount::new(16).unwrap();
    let partition_of = |key: &str| count.of_key(key.as_bytes());
    let kept_key = (0..)
        .map(|i| format!("k-{i}"))
        .find(|key| partition_of(key).0 == 1)
        .unwrap();
    let stray_key = (0..)
        .map(|i| format!("k-{i}"))
        .find(|key| partition_of(key).0 == 2)
        .unwrap();
    let mut a = Node::new(1, "eu");
    let mut b = Node::new(2, "eu");
    b.add_as(&stray_key, 3, false, None);
    b.commit();
    // Counters b stored before the copy came: its pass does not walk them.
    let earlier: Vec<String> = (0..)
        .map(|i| format!("earlier-{i}"))
        .filter(|key| partition_of(key).0 == 1)
        .take(50)
        .collect();
    for key in &earlier {
        b.add_as(key, 1, false, None);
    }
    b.commit();
    let mut kept = PartitionSet::empty(count);
    kept.insert(partition_of(&kept_key));
    b.replica.set_kept(Some(kept.clone()));
    a.add_as(&kept_key, 5, true, None);
    a.add_as(&stray_key, 7, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    assert!(!b.replica.purging());
    let state = b.take(&push, &stray_key);
    assert_eq!(
        state.slot(ReplicaId(1)),
        slot(7),
        "durable before the purge"
    );
    assert!(b.replica.purging(), "the stray copy started a purge pass");
    let mut visited = 0;
    loop {
        let step = b
            .replica
            .poll_purge(1, &b.store, 100, |key| kept.contains(partition_of(key)))
            .unwrap();
        visited += step.visited;
        b.commit();
        if step.done {
            break;
        }
    }
    assert!(
        visited <= 2,
        "the pass starts at the copy's commit: it looked at {visited} counters, not the {} stored before",
        earlier.len()
    );
    let stray = b.store.load_counter(&stray_key).unwrap().unwrap().state;
    assert_eq!(
        stray,
        PnCounter::from_slots([(ReplicaId(2), slot(3))]),
        "only b's own slot of the stray key stays"
    );
    let kept_state = b.store.load_counter(&kept_key).unwrap().unwrap().state;
    assert_eq!(
        kept_state.slot(ReplicaId(1)),
        slot(5),
        "the kept key's copy stays"
    );
}

#[test]
fn a_counter_short_of_holders_is_parked_and_holds_back_only_its_own_adds() {
    let mut a = Node::new(1, "eu");
    let short = a.add_as("short", 1, true, None);
    let fine = a.add_as("fine", 2, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    let keys: Vec<&str> = push.counters.iter().map(|(key, ..)| key.as_ref()).collect();
    let confirmed: Vec<bool> = keys.iter().map(|key| *key == "fine").collect();
    a.replica.handle_push_partly_done(push.upto_seq, &confirmed);
    assert!(
        a.replica.replicated_for("fine", fine),
        "its copy confirmed it"
    );
    assert!(
        !a.replica.replicated_for("short", short),
        "no copy holds it"
    );
    assert!(
        a.replica.replicated_seq() >= fine,
        "the parked counter stalls nothing"
    );
    // It waits for the runtime's pause: the next adds go on without it.
    assert!(a.replica.has_parked());
    let later = a.add_as("other", 1, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    assert_eq!(push.counters.len(), 1, "{push:?}");
    a.replica.handle_push_done(push.upto_seq);
    assert!(a.replica.replicated_for("other", later));
    // A later add of the parked counter waits with it.
    let again = a.add_as("short", 1, true, None);
    a.commit();
    assert!(!a.replica.replicated_for("short", again));
    a.replica.retry_parked();
    assert!(!a.replica.has_parked());
    let retry = a.replica.poll_push().unwrap();
    assert_eq!(
        retry.counters,
        vec![("short".into(), slot(2), FoldedBase::default())]
    );
    assert!(
        !a.replica.replicated_for("short", short),
        "not until confirmed"
    );
    a.replica.handle_push_partly_done(retry.upto_seq, &[true]);
    assert!(a.replica.replicated_for("short", short));
    assert!(a.replica.replicated_for("short", again));
    assert_eq!(a.replica.copies_pending(), (0, false));
}

#[test]
fn a_copy_refuses_a_push_of_a_partition_it_does_not_serve_and_merges_nothing() {
    use crate::partition::{PartitionCount, PartitionSet};
    let (mut a, mut b) = (Node::new(1, "eu"), Node::new(2, "eu"));
    a.add_as("votes", 3, true, None);
    a.add_as("views", 1, true, None);
    a.commit();
    let push = a.replica.poll_push().unwrap();
    let count = PartitionCount::new(8).unwrap();
    let votes = count.of_key(b"votes");
    let mut serving = PartitionSet::empty(count);
    serving.insert(votes);
    b.replica.set_serving(Some(serving.clone()));
    b.replica.set_kept(Some(serving));
    assert_ne!(count.of_key(b"views"), votes, "the keys' partitions differ");
    match b.replica.handle_copy_push(1, &b.store, &push) {
        Err(CopyRefused::NotHeld { key, .. }) => assert_eq!(key, "views"),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(b.replica.handle_get(1, &b.store, "votes").is_ok());
    assert_eq!(
        b.store.load_counter("votes").unwrap(),
        None,
        "nothing merged"
    );
}
