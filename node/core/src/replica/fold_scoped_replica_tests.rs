//! The whole cycle of a live node's partition through the replica core (in
//! memory stores, real commits, pulls and purges): the partition moves away
//! from the writer, its release waits `--retire-after`, its slots there are
//! retired and folded at every node with no value changed, the partition
//! comes back copied folded, the writer's gate opens only once its counters
//! reach the fold, and its new adds count exactly once next to the old.
//! After the fold, a replicated add is on its copy when the copy answers,
//! or the copy refuses the push, and a purge keeps the slot of the new
//! phase until that phase is folded too (issue 42).

use super::super::tests::{key_in, partitions_of, sixteen, Node};
use super::*;
use crate::crdt::{FoldedBase, Slot};
use crate::replica::folds::WriteGate;
use crate::replica::{AddRefused, AddRequest};

const RETIRE_AFTER: u64 = 100;

/// One fold round at every node at `now`, then a commit each.
fn round(nodes: &mut [&mut Node], now: u64) {
    super::tests::fold_round_at(nodes, &[], now, Some(RETIRE_AFTER));
}

fn partitioned(id: u64, region: &str, kept: &[u32]) -> Node {
    configured(Node::new(id, region), kept)
}

/// `node` as the runtime sets it up at a start: 16 partitions, folds by
/// partition and scoped, serving and keeping `kept` (every one if empty).
fn configured(mut node: Node, kept: &[u32]) -> Node {
    crate::storage::set_partition_count(&mut node.replica, sixteen(), &node.store, None).unwrap();
    if !kept.is_empty() {
        node.replica.set_serving(Some(partitions_of(kept)));
        node.replica.set_kept(Some(partitions_of(kept)));
    }
    node
}

fn exchange(nodes: &mut [&mut Node]) {
    for _ in 0..2 {
        for i in 0..nodes.len() {
            for j in 0..nodes.len() {
                if i != j {
                    let (source, target) = pick(nodes, i, j);
                    target.pull_from(source, 1 << 20);
                    target.commit();
                }
            }
        }
    }
}

fn pick<'n>(nodes: &'n mut [&mut Node], source: usize, target: usize) -> (&'n Node, &'n mut Node) {
    let (low, high) = nodes.split_at_mut(source.max(target));
    if source < target {
        (&*low[source], &mut *high[0])
    } else {
        (&*high[0], &mut *low[target])
    }
}

#[test]
fn a_partition_that_moved_away_is_folded_and_its_writer_writes_it_again_after_the_fold() {
    let moved = key_in("post", 0);
    let stays = key_in("post", 1);
    // W serves partitions 0 and 1; A and B (another region) keep every one.
    let mut w = partitioned(3, "eu", &[0, 1]);
    let mut a = partitioned(1, "eu", &[]);
    let mut b = partitioned(2, "us", &[]);
    w.add(&moved, 5);
    w.add(&moved, -1);
    w.add(&stays, 2);
    a.add(&moved, 10);
    w.commit();
    a.commit();
    exchange(&mut [&mut w, &mut a, &mut b]);
    for node in [&mut w, &mut a, &mut b] {
        assert_eq!(node.value(&moved), 14);
    }

    // Partition 0 moves away from W (its handoff done): released, purged.
    w.replica.set_serving(Some(partitions_of(&[1])));
    w.replica.set_kept(Some(partitions_of(&[1])));
    assert_eq!(
        w.replica.folds().released().collect::<Vec<_>>(),
        vec![(0, None)]
    );
    w.replica.start_purge();
    while w.replica.purging() {
        let kept = partitions_of(&[1]);
        w.replica
            .poll_purge(50, &w.store, 100, |key| {
                kept.contains(sixteen().of_key(key.as_bytes()))
            })
            .unwrap();
        w.commit();
    }
    // The release waits --retire-after (stamped by the first round), then
    // W retires its slots there and takes no add there until the fold.
    round(&mut [&mut w, &mut a, &mut b], 1_000);
    assert!(w.replica.folds().unfolded_scoped().next().is_none());
    w = configured(w.restart(), &[1]);
    assert_eq!(
        w.replica.folds().released().collect::<Vec<_>>(),
        vec![(0, Some(1_000))],
        "the release time survives a restart"
    );
    round(&mut [&mut w, &mut a, &mut b], 1_050);
    assert!(
        w.replica.folds().unfolded_scoped().next().is_none(),
        "not yet"
    );
    round(&mut [&mut w, &mut a, &mut b], 1_100);
    assert_eq!(
        w.replica.folds().writes_in(ReplicaId(3), 0),
        Err(WriteGate::Retired {
            partition: 0,
            phase: 0
        })
    );
    for now in [1_200, 1_300, 1_400] {
        round(&mut [&mut w, &mut a, &mut b], now);
    }
    for node in [&mut w, &mut a, &mut b] {
        let book = node.replica.folds().book();
        assert_eq!(book.scoped_epochs(ReplicaId(3), 0), &[1], "folded once");
        assert_eq!(book.folded_at(ReplicaId(3)), None, "W lives on");
    }
    for node in [&mut a, &mut b] {
        assert_eq!(node.value(&moved), 14, "a fold changes no value");
        let counter = node.replica.handle_get(9, &node.store, &moved).unwrap();
        assert_eq!(counter.slot(ReplicaId(3)), Slot::default());
        assert_eq!(
            counter.folded(),
            FoldedBase {
                epoch: 1,
                p: 5,
                n: 1
            }
        );
        let other = node.replica.handle_get(9, &node.store, &stays).unwrap();
        assert_eq!(
            other.slot(ReplicaId(3)),
            Slot { p: 2, n: 0 },
            "partition 1 keeps W's slot"
        );
    }

    // Partition 0 comes back to W: copied in from A, folded already. W
    // holds no slot of its own there, so its digest is not the record's and
    // the fold is not applied to it: the gate stays shut...
    w.replica.set_kept(Some(partitions_of(&[0, 1])));
    w.pull_from(&a, 1 << 20);
    w.commit();
    assert_eq!(
        w.replica.folds().writes_in(ReplicaId(3), 0),
        Err(WriteGate::NotApplied {
            partition: 0,
            epoch: 1,
            applied: 0
        })
    );
    assert_eq!(
        w.replica.write_gated(&partitions_of(&[0, 1])),
        partitions_of(&[0])
    );
    // ...until the handoff, caught up, raises the partition past it.
    assert_eq!(w.replica.raise_copied(crate::partition::Partition(0)), 1);
    assert_eq!(w.replica.folds().writes_in(ReplicaId(3), 0), Ok(()));
    w.replica.set_serving(Some(partitions_of(&[0, 1])));
    w.add(&moved, 3);
    // A key of the partition nobody wrote yet, written by W and by A before
    // they exchange: W's counter enters at the fold's epoch (a counter
    // below it would lose W's new slot to A's at the first merge).
    let fresh = key_in("fresh", 0);
    w.add(&fresh, 4);
    a.add(&fresh, 1);
    w.commit();
    a.commit();
    exchange(&mut [&mut w, &mut a, &mut b]);
    for node in [&mut w, &mut a, &mut b] {
        assert_eq!(node.value(&moved), 17, "the old phase once, the new once");
        let counter = node.replica.handle_get(9, &node.store, &moved).unwrap();
        assert_eq!(counter.slot(ReplicaId(3)), Slot { p: 3, n: 0 });
        assert_eq!(counter.folded().p, 5);
        assert_eq!(node.value(&fresh), 5);
    }
}

#[test]
fn a_partition_back_before_the_wait_ends_is_not_retired_and_a_gated_add_is_refused() {
    let moved = key_in("post", 0);
    let mut w = partitioned(3, "eu", &[0, 1]);
    let mut a = partitioned(1, "eu", &[]);
    w.add(&moved, 5);
    w.commit();
    exchange(&mut [&mut w, &mut a]);
    w.replica.set_kept(Some(partitions_of(&[1])));
    round(&mut [&mut w, &mut a], 1_000);
    w.replica.set_kept(Some(partitions_of(&[0, 1])));
    assert_eq!(w.replica.folds().released().count(), 0, "back: no release");
    round(&mut [&mut w, &mut a], 2_000);
    assert!(w.replica.folds().unfolded_scoped().next().is_none());

    // Released again and retired: an add to the partition is refused with
    // the gate's reason, and nothing changes.
    w.replica.set_kept(Some(partitions_of(&[1])));
    round(&mut [&mut w, &mut a], 3_000);
    round(&mut [&mut w, &mut a], 3_100);
    assert_eq!(w.replica.folds().unfolded_scoped().count(), 1);
    w.replica.set_kept(Some(partitions_of(&[0, 1])));
    let before = w.value(&moved);
    let refused = w
        .replica
        .handle_add(
            1,
            &w.store,
            AddRequest {
                key: &moved,
                delta: 1,
                idempotency_key: None,
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            refused,
            AddRefused::WriteGated(WriteGate::Retired { partition: 0, .. })
        ),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("another owner takes the adds"),
        "{refused}"
    );
    assert_eq!(w.value(&moved), before);
}

/// Runs purge passes at `node`, which keeps `kept` only, until none is left.
fn purge_all(node: &mut Node, kept: &[u32]) {
    node.replica.start_purge();
    while node.replica.purging() {
        let kept = partitions_of(kept);
        node.replica
            .poll_purge(50, &node.store, 100, |key| {
                kept.contains(sixteen().of_key(key.as_bytes()))
            })
            .unwrap();
        node.commit();
    }
}

/// W (3, eu) wrote `moved` (+5) in partition 0; the partition moved away
/// from W, W's slots there were folded at epoch 1, and it came back: W
/// serves partitions 0 and 1 again, copied folded from A (1, eu). B (2, us)
/// keeps every partition.
fn back_after_fold(moved: &str) -> (Node, Node, Node) {
    let mut w = partitioned(3, "eu", &[0, 1]);
    let mut a = partitioned(1, "eu", &[]);
    let mut b = partitioned(2, "us", &[]);
    w.add(moved, 5);
    w.commit();
    exchange(&mut [&mut w, &mut a, &mut b]);
    w.replica.set_serving(Some(partitions_of(&[1])));
    w.replica.set_kept(Some(partitions_of(&[1])));
    purge_all(&mut w, &[1]);
    for now in [1_000, 1_100, 1_200, 1_300, 1_400] {
        round(&mut [&mut w, &mut a, &mut b], now);
    }
    for node in [&w, &a, &b] {
        let book = node.replica.folds().book();
        assert_eq!(book.scoped_epochs(ReplicaId(3), 0), &[1], "folded once");
    }
    w.replica.set_kept(Some(partitions_of(&[0, 1])));
    w.pull_from(&a, 1 << 20);
    w.commit();
    assert_eq!(w.replica.raise_copied(crate::partition::Partition(0)), 1);
    assert_eq!(w.replica.folds().writes_in(ReplicaId(3), 0), Ok(()));
    w.replica.set_serving(Some(partitions_of(&[0, 1])));
    (w, a, b)
}

/// A `replicated` add at `node`; returns its ticket.
#[track_caller]
fn add_replicated(node: &mut Node, key: &str, delta: i64) -> u64 {
    let request = AddRequest {
        key,
        delta,
        idempotency_key: None,
    };
    node.replica
        .handle_add_replicated(1, &node.store, request)
        .unwrap()
        .durable_at_seq
}

/// Issue 42, item 1: after the fold, W's slot in partition 0 is of the
/// next phase. A push that carried it with no epoch was taken by the copy
/// as a phase-0 slot, dropped as folded, and answered OK: W then
/// acknowledged the add as on two disks while it was on W's alone.
#[test]
fn a_replicated_add_after_the_fold_is_on_the_copy_when_the_copy_answers() {
    let moved = key_in("post", 0);
    let fresh = key_in("fresh", 0);
    let (mut w, mut a, mut b) = back_after_fold(&moved);
    let ticket = add_replicated(&mut w, &moved, 3);
    add_replicated(&mut w, &fresh, 4);
    w.commit();
    let push = w.replica.poll_push().unwrap();
    let accepted = a.replica.handle_copy_push(1, &a.store, &push).unwrap();
    while a.replica.durable_seq() < accepted.durable_at_seq {
        a.commit().expect("the ticket's commit comes");
    }
    // A answered OK: W acknowledges both adds as replicated.
    w.replica.handle_push_done(push.upto_seq);
    assert!(w.replica.replicated_seq() >= ticket);
    for (key, p) in [(&moved, 3), (&fresh, 4)] {
        let held = a.store.load_counter(key).unwrap().map(|s| s.state);
        assert_eq!(
            held.map(|state| state.slot(ReplicaId(3))),
            Some(Slot { p, n: 0 }),
            "A answered OK: its disk must hold W's acknowledged add to {key}"
        );
    }
    // W's disk is lost: what A and B hold still counts both adds.
    exchange(&mut [&mut a, &mut b]);
    for node in [&mut a, &mut b] {
        assert_eq!(node.value(&moved), 8, "5 folded, 3 acknowledged since");
        assert_eq!(node.value(&fresh), 4);
    }
}

/// Issue 42, item 1: a copy that does not hold the fold record (it joined
/// after the fold) cannot tell the phase of W's slot; it refuses the push
/// rather than answer OK, and W confirms nothing.
#[test]
fn a_copy_without_the_fold_refuses_the_push_and_nothing_is_confirmed() {
    let moved = key_in("post", 0);
    let (mut w, _a, _b) = back_after_fold(&moved);
    let mut c = partitioned(4, "eu", &[]);
    assert_eq!(c.replica.folds().book().epoch(), 0);
    let ticket = add_replicated(&mut w, &moved, 3);
    w.commit();
    let push = w.replica.poll_push().unwrap();
    let answer = c.replica.handle_copy_push(1, &c.store, &push);
    assert!(
        answer.is_err(),
        "C cannot place W's slot after the fold; it must not answer OK: {answer:?}"
    );
    while c.commit().is_some() {}
    assert!(
        c.store.load_counter(&moved).unwrap().is_none(),
        "a refused push merges nothing"
    );
    w.replica.handle_push_failed(push.upto_seq);
    assert!(w.replica.replicated_seq() < ticket, "not acknowledged");
    assert_eq!(w.replica.copies_pending(), (1, false), "pushed again later");
}

/// Issue 42, item 2: W's slot written after the fold (phase 1) in a
/// partition that moves away from W again is W's to keep until phase 1 is
/// folded too. The purge used to cut the counter down to the slot at epoch
/// 0, where it reads as phase 0 (folded already), and the next pass deleted
/// it: taking the partition back with no holder to copy from, W restarted
/// its slot at 0 and the max-merge swallowed its next adds.
#[test]
fn a_purge_keeps_the_slot_written_after_the_fold_until_that_phase_is_folded() {
    let moved = key_in("post", 0);
    let fresh = key_in("fresh", 0);
    let (mut w, mut a, mut b) = back_after_fold(&moved);
    w.add(&moved, 3);
    w.add(&fresh, 4);
    w.commit();
    exchange(&mut [&mut w, &mut a, &mut b]);
    let book = w.replica.folds().book().clone();
    let before = w.store.load_counter(&moved).unwrap().unwrap().state;
    assert_eq!(book.phase(ReplicaId(3), Some(0), before.folded().epoch), 1);

    // Partition 0 moves away from W again; two passes (the second finds
    // what the first rewrote).
    w.replica.set_serving(Some(partitions_of(&[1])));
    w.replica.set_kept(Some(partitions_of(&[1])));
    purge_all(&mut w, &[1]);
    purge_all(&mut w, &[1]);
    for (key, p) in [(&moved, 3), (&fresh, 4)] {
        let stored = w.store.load_counter(key).unwrap().map(|s| s.state);
        let Some(stored) = stored else {
            panic!(
                "W's phase-1 slot of {key} (p {p}) was deleted, though phase 1 was never folded"
            );
        };
        assert_eq!(stored.slot(ReplicaId(3)), Slot { p, n: 0 }, "{key}");
        assert_eq!(
            book.phase(ReplicaId(3), Some(0), stored.folded().epoch),
            1,
            "{key}: the slot kept is still of phase 1 ({:?})",
            stored.folded()
        );
    }

    // It comes back before any other fold, with nobody to copy from (the
    // handoff has nothing to wait for): W's gate opens at the fold's epoch,
    // W continues its slot, and the next add counts.
    w.replica.set_kept(Some(partitions_of(&[0, 1])));
    assert_eq!(w.replica.raise_copied(crate::partition::Partition(0)), 1);
    assert_eq!(w.replica.folds().writes_in(ReplicaId(3), 0), Ok(()));
    w.replica.set_serving(Some(partitions_of(&[0, 1])));
    w.add(&moved, 2);
    w.commit();
    exchange(&mut [&mut w, &mut a, &mut b]);
    for node in [&mut w, &mut a, &mut b] {
        assert_eq!(node.value(&moved), 10, "5 folded, then 3 and 2");
    }
}
