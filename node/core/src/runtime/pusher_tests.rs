//! Tests of the sans-IO pusher over a replica on the in-memory store: one
//! push at a time, parts per target, a counter confirmed only by enough
//! distinct targets, the others parked until the pause is over, and the
//! pause doubling while pushes keep failing.

use super::*;
use crate::crdt::ReplicaId;
use crate::replica::{AddRequest, Identity, Member, ReplicaConfig};
use crate::storage::{MemoryStore, Store};

/// A replica of `eu` that knows `peers` (live nodes of eu taking copies).
fn node(peers: &[&str]) -> (Replica, MemoryStore) {
    let identity = Identity {
        replica: ReplicaId(1),
        region: "eu".into(),
    };
    let store = MemoryStore::new(identity.clone());
    let config = ReplicaConfig {
        cluster_id: "test".into(),
        ..Default::default()
    };
    let mut core = Replica::open(identity, config, store.recover(0).unwrap(), 0);
    let members = peers
        .iter()
        .enumerate()
        .map(|(index, name)| Member {
            replica: ReplicaId(10 + index as u64),
            region: "eu".into(),
            node_name: name.to_string(),
            grpc_addr: format!("{name}:7100"),
            alive: true,
            ..Default::default()
        })
        .collect();
    core.peers_mut().handle_membership(members);
    (core, store)
}

/// A replicated add of 1 to each of `keys`, committed.
fn add_and_commit(core: &mut Replica, store: &mut MemoryStore, keys: &[&str]) -> u64 {
    let mut ticket = 0;
    for key in keys {
        let request = AddRequest {
            key,
            delta: 1,
            idempotency_key: None,
        };
        ticket = core
            .handle_add_replicated(1, store, request)
            .unwrap()
            .durable_at_seq;
    }
    let batch = core.poll_commit().unwrap();
    store.write(&batch).unwrap();
    store.flush().unwrap();
    core.handle_commit_done(batch.seq);
    ticket
}

#[test]
fn a_push_goes_out_in_parts_and_ends_once_enough_copies_answered() {
    let (mut core, mut store) = node(&["b", "c"]);
    let ticket = add_and_commit(&mut core, &mut store, &["votes", "views"]);
    let mut pusher = Pusher::default();
    let out = pusher.poll(&mut core, None, 1).expect("a push");
    assert_eq!(
        out.parts.len(),
        1,
        "no routes: one copy, the first candidate"
    );
    assert_eq!(out.parts[0].1.counters.len(), 2);
    assert!(
        pusher.poll(&mut core, None, 1).is_none(),
        "one push at a time"
    );
    let target = out.parts[0].0 .0.clone();
    assert!(
        !pusher.handle_answer(out.id + 1, &target, true),
        "another push"
    );
    assert!(
        !pusher.handle_answer(out.id, "stranger", true),
        "not a target"
    );
    assert!(pusher.handle_answer(out.id, &target, true));
    let end = pusher.end(5, &mut core, out.id).unwrap();
    assert!(end.confirmed, "{end:?}");
    assert!(core.replicated_for("votes", ticket) && core.replicated_for("views", ticket));
    assert_eq!(pusher.end(5, &mut core, out.id), None, "ended once");
    assert_eq!(pusher.retry_at_ms(), None);
    // The next push rotates to the other candidate.
    add_and_commit(&mut core, &mut store, &["votes"]);
    let next = pusher.poll(&mut core, None, 1).unwrap();
    assert_ne!(next.parts[0].0 .0, target);
}

#[test]
fn unconfirmed_counters_are_parked_until_the_pause_and_the_pause_doubles() {
    let (mut core, mut store) = node(&["b"]);
    let ticket = add_and_commit(&mut core, &mut store, &["votes"]);
    let mut pusher = Pusher::default();
    let out = pusher.poll(&mut core, None, 1).unwrap();
    assert!(
        pusher.handle_answer(out.id, "b", false),
        "every target answered"
    );
    let end = pusher.end(1_000, &mut core, out.id).unwrap();
    assert!(!end.confirmed);
    assert_eq!(end.targets_confirmed, 0);
    assert!(!core.replicated_for("votes", ticket));
    assert_eq!(pusher.retry_at_ms(), Some(1_000 + RETRY_PAUSE_MS));
    // Parked: nothing to push before the pause is over.
    assert!(pusher.poll(&mut core, None, 1).is_none());
    assert!(!pusher.retry_due(1_000 + RETRY_PAUSE_MS - 1, &mut core));
    assert!(pusher.retry_due(1_000 + RETRY_PAUSE_MS, &mut core));
    let retry = pusher.poll(&mut core, None, 1).unwrap();
    // Its time runs out: the second failure in a row doubles the pause.
    pusher.end(2_000, &mut core, retry.id).unwrap();
    assert_eq!(pusher.retry_at_ms(), Some(2_000 + 2 * RETRY_PAUSE_MS));
    assert!(pusher.retry_due(3_000, &mut core));
    let third = pusher.poll(&mut core, None, 1).unwrap();
    pusher.handle_answer(third.id, "b", true);
    assert!(pusher.end(3_000, &mut core, third.id).unwrap().confirmed);
    assert!(core.replicated_for("votes", ticket), "confirmed at last");
    assert_eq!(retry_pause_ms(1), RETRY_PAUSE_MS);
    assert_eq!(retry_pause_ms(40), retry_pause_ms(5));
    assert!(retry_pause_ms(40) <= MAX_RETRY_PAUSE_MS);
}

#[test]
fn no_copy_needed_confirms_at_once() {
    let (mut core, mut store) = node(&[]);
    let ticket = add_and_commit(&mut core, &mut store, &["votes"]);
    let mut pusher = Pusher::default();
    let out = pusher.poll(&mut core, None, 0).unwrap();
    assert!(out.parts.is_empty());
    assert!(pusher.end(0, &mut core, out.id).unwrap().confirmed);
    assert!(core.replicated_for("votes", ticket));
    assert_eq!(pusher.in_flight(), None);
}
