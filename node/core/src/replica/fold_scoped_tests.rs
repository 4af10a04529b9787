//! Tests of folding a live writer's slots in a partition that moved away
//! from it: the keepers' agreement, the writer's promise, the gate before
//! it writes there again, and a second fold of the same pair whose slot
//! values equal the first phase's (the phases are digested apart).

use std::collections::BTreeMap;

use crate::crdt::{ReplicaId, Slot, WriterDigest};
use crate::partition::{Partition, PartitionCount, PartitionSet};
use crate::replica::folds::{
    DigestChanges, FoldMember, FoldWait, Folds, ScopedRetirement, WriteGate,
};

/// The live writer whose partition 0 moved away.
const W: ReplicaId = ReplicaId(1);
const A: ReplicaId = ReplicaId(2);
const B: ReplicaId = ReplicaId(3);
const COUNT: u64 = 4;

fn count() -> PartitionCount {
    PartitionCount::new(COUNT).unwrap()
}

/// A key of partition 0.
fn key0() -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|key| count().of_key(key.as_bytes()) == Partition(0))
        .unwrap()
}

fn slot(p: u64) -> Slot {
    Slot { p, n: 0 }
}

/// A node keeping `kept`, agreeing by partition.
fn node(kept: &[u32]) -> Folds {
    let mut folds = Folds::default();
    folds.track_partitions(count(), Default::default());
    let mut set = PartitionSet::empty(count());
    for partition in kept {
        set.insert(Partition(*partition));
    }
    folds.set_kept(Some(set));
    folds
}

/// A commit of `writer`'s slot in `key` going from `old` to `new`, each
/// with its phase, as `Replica::commit` hands it to the fold state.
fn write(folds: &mut Folds, key: &str, writer: ReplicaId, old: (Slot, u32), new: (Slot, u32)) {
    let mut changes = DigestChanges::default();
    folds.note_change(&mut changes, key, writer, old, new);
    let by_partition: Vec<_> = changes
        .by_partition
        .into_iter()
        .map(|((writer, partition, phase), digest)| (writer, partition, phase, digest))
        .collect();
    folds.set_partition_digests(&by_partition);
    let whole: Vec<_> = changes.whole.into_iter().collect();
    folds.set_digests(&whole);
}

/// W keeps partitions 1-3 (0 moved away from it), A keeps 0 and 1, B keeps
/// 0, 2 and 3; A and B hold W's +5 in a key of partition 0.
fn cluster() -> BTreeMap<ReplicaId, Folds> {
    let mut nodes = BTreeMap::from([
        (W, node(&[1, 2, 3])),
        (A, node(&[0, 1])),
        (B, node(&[0, 2, 3])),
    ]);
    for id in [A, B] {
        let folds = nodes.get_mut(&id).unwrap();
        write(folds, &key0(), W, (Slot::default(), 0), (slot(5), 0));
    }
    nodes
}

/// One synchronous round: every node reads the others' reports; `down`
/// members are seen down (their last report stays) and read nothing.
fn round(nodes: &mut BTreeMap<ReplicaId, Folds>, down: &[ReplicaId]) {
    round_deaf(nodes, down, &[]);
}

/// [`round`] in which the `deaf` members report but read nothing yet.
fn round_deaf(nodes: &mut BTreeMap<ReplicaId, Folds>, down: &[ReplicaId], deaf: &[ReplicaId]) {
    let reports: BTreeMap<ReplicaId, _> = nodes.iter().map(|(id, f)| (*id, f.report())).collect();
    for (id, folds) in nodes.iter_mut() {
        if down.contains(id) || deaf.contains(id) {
            continue;
        }
        let others: Vec<FoldMember> = reports
            .iter()
            .filter(|(other, _)| *other != id)
            .map(|(other, report)| FoldMember {
                replica: *other,
                alive: !down.contains(other),
                node_name: format!("n{}", other.0),
                // A member down is still known by its last report.
                report: Some(report.clone()),
            })
            .collect();
        let counted: Vec<ReplicaId> = others.iter().map(|m| m.replica).collect();
        folds.handle_reports(&counted, &others).unwrap();
    }
}

fn digest_of(values: &[(&str, u64)]) -> WriterDigest {
    let mut digest = WriterDigest::default();
    for (key, p) in values {
        digest.replace(key, Slot::default(), slot(*p));
    }
    digest
}

#[test]
fn a_live_writers_partition_folds_once_its_keepers_agree_and_the_writer_promised() {
    let mut nodes = cluster();
    let w = nodes.get_mut(&W).unwrap();
    assert_eq!(w.writes_in(W, 0), Ok(()));
    assert!(w.retire_partition(W, 0));
    assert!(!w.retire_partition(W, 0), "made once");
    assert!(!w.retire_partition(W, 4), "no such partition");
    assert_eq!(
        w.writes_in(W, 0),
        Err(WriteGate::Retired {
            partition: 0,
            phase: 0
        })
    );
    assert_eq!(w.writes_in(W, 1), Ok(()), "its other partitions are served");
    for _ in 0..4 {
        round(&mut nodes, &[]);
    }
    let want = digest_of(&[(&key0(), 5)]);
    for (id, folds) in &nodes {
        let record = folds
            .book()
            .record(1)
            .unwrap_or_else(|| panic!("node {id} holds no fold"));
        assert!(record.writers.is_empty(), "W is not folded whole");
        assert_eq!(record.scoped, vec![(W, vec![(0, want)])], "node {id}");
        assert_eq!(folds.book().folded_at(W), None, "W lives on");
        assert_eq!(folds.unfolded_scoped().count(), 0, "node {id}");
    }
    // The keepers of partition 0 hold W's final state there: they apply.
    assert_eq!(nodes[&A].applied_for(&key0()), 1);
    assert_eq!(nodes[&B].applied_for(&key0()), 1);
    // W does not keep partition 0: it writes there only once it holds the
    // partition again and its counters reached the fold.
    assert_eq!(
        nodes[&W].writes_in(W, 0),
        Err(WriteGate::NotApplied {
            partition: 0,
            epoch: 1,
            applied: 0
        })
    );
}

#[test]
fn keepers_that_differ_hold_the_fold_back_and_a_writer_up_must_promise() {
    // B has not received W's last add in partition 0.
    let mut nodes = cluster();
    let b = nodes.get_mut(&B).unwrap();
    write(b, &key0(), W, (slot(5), 0), (slot(3), 0));
    nodes.get_mut(&W).unwrap().retire_partition(W, 0);
    for _ in 0..3 {
        round(&mut nodes, &[]);
    }
    let retirement = ScopedRetirement {
        writer: W,
        partition: 0,
        phase: 0,
    };
    assert_eq!(nodes[&A].book().epoch(), 0);
    assert!(
        matches!(
            nodes[&A].scoped_waits().get(&retirement),
            Some(FoldWait::DiffersIn { partition: 0, .. })
        ),
        "{:?}",
        nodes[&A].scoped_waits()
    );
    // Anti-entropy brings B up to date: the fold goes through.
    let b = nodes.get_mut(&B).unwrap();
    write(b, &key0(), W, (slot(3), 0), (slot(5), 0));
    for _ in 0..4 {
        round(&mut nodes, &[]);
    }
    assert_eq!(nodes[&A].book().epoch(), 1);

    // A retirement W does not list itself yet (learned by A alone: W lost
    // it, say, and has not read A's report) waits while W is up...
    let mut nodes = cluster();
    let a = nodes.get_mut(&A).unwrap();
    assert!(a.learn_scoped(retirement));
    for _ in 0..3 {
        round_deaf(&mut nodes, &[], &[W]);
    }
    assert_eq!(nodes[&A].book().epoch(), 0);
    assert_eq!(
        nodes[&A].scoped_waits().get(&retirement),
        Some(&FoldWait::WriterServes {
            writer: W,
            partition: 0
        })
    );
    // ...and W, once it reads a report listing it, fences itself there.
    let mut heard = cluster();
    heard.get_mut(&A).unwrap().learn_scoped(retirement);
    round(&mut heard, &[]);
    assert_eq!(
        heard[&W].writes_in(W, 0),
        Err(WriteGate::Retired {
            partition: 0,
            phase: 0
        })
    );
    // While W is down its promise is not needed (the restart hold keeps a
    // returning W from writing before it has heard a live member), but W
    // is a member: the record waits for it to agree, as every fold waits
    // for a member that is down.
    for _ in 0..3 {
        round(&mut nodes, &[W]);
    }
    assert_eq!(nodes[&A].book().epoch(), 0);
    assert!(
        matches!(
            nodes[&A].scoped_waits().get(&retirement),
            Some(FoldWait::NotAgreed { member: W, .. })
        ),
        "{:?}",
        nodes[&A].scoped_waits()
    );
    for _ in 0..4 {
        round(&mut nodes, &[]);
    }
    for id in [W, A, B] {
        assert_eq!(nodes[&id].book().epoch(), 1, "node {id}");
    }
}

/// The runbook's way out of a partition held back for a fold ("A
/// partition held back for a fold"): a keeper down for good holds the fold
/// back however long the others wait, and once it is removed (retired, so
/// no longer counted) the fold commits without it.
#[test]
fn a_partition_fold_waiting_for_a_keeper_gone_for_good_commits_once_it_is_removed() {
    let mut nodes = cluster();
    nodes.get_mut(&W).unwrap().retire_partition(W, 0);
    for _ in 0..20 {
        round(&mut nodes, &[B]);
    }
    let retirement = ScopedRetirement {
        writer: W,
        partition: 0,
        phase: 0,
    };
    for id in [W, A] {
        assert_eq!(nodes[&id].book().epoch(), 0, "node {id}");
        assert!(
            matches!(
                nodes[&id].scoped_waits().get(&retirement),
                Some(
                    FoldWait::NotAgreed { member: B, .. }
                        | FoldWait::NotReportedByPartition { member: B, .. }
                )
            ),
            "node {id} waits for B: {:?}",
            nodes[&id].scoped_waits()
        );
    }
    // `tally admin remove B`: B is retired wherever the removal is heard.
    let down = FoldMember {
        replica: B,
        alive: false,
        node_name: "n3".into(),
        report: None,
    };
    nodes
        .get_mut(&A)
        .unwrap()
        .retire(B, A, true, std::slice::from_ref(&down))
        .unwrap();
    for _ in 0..4 {
        round(&mut nodes, &[B]);
    }
    for id in [W, A] {
        let folds = &nodes[&id];
        assert_eq!(folds.unfolded_scoped().count(), 0, "node {id}");
        assert!(
            (1..=folds.book().epoch())
                .filter_map(|epoch| folds.book().record(epoch))
                .any(|record| record.scoped.iter().any(|(writer, _)| *writer == W)),
            "node {id} holds the fold of W's slots in partition 0"
        );
    }
    // A keeps partition 0 and holds W's final state there: it applies.
    assert!(nodes[&A].applied_for(&key0()) >= 1);
}

#[test]
fn a_second_fold_of_the_pair_tells_the_phases_apart_when_their_values_are_equal() {
    let mut nodes = cluster();
    nodes.get_mut(&W).unwrap().retire_partition(W, 0);
    for _ in 0..4 {
        round(&mut nodes, &[]);
    }
    assert_eq!(nodes[&A].book().epoch(), 1);
    // Partition 0 came back to W, which wrote +5 again in the same key (a
    // new slot from 0, in counters at epoch 1: phase 1). A holds that; B's
    // counter is still the one below the fold, holding the old +5 (B
    // applied the fold, its sweep has not reached the counter yet). Then
    // the partition moved away from W again.
    let a = nodes.get_mut(&A).unwrap();
    write(a, &key0(), W, (slot(5), 0), (Slot::default(), 0));
    write(a, &key0(), W, (Slot::default(), 1), (slot(5), 1));
    let w = nodes.get_mut(&W).unwrap();
    assert!(w.retire_partition(W, 0));
    let second = ScopedRetirement {
        writer: W,
        partition: 0,
        phase: 1,
    };
    assert_eq!(w.unfolded_scoped().collect::<Vec<_>>(), vec![second]);
    for _ in 0..3 {
        round(&mut nodes, &[]);
    }
    // By value alone A and B hold the same (key, +5); by phase they do
    // not, and the fold of phase 1 waits.
    assert_eq!(
        nodes[&A].book().epoch(),
        1,
        "{:?}",
        nodes[&A].scoped_waits()
    );
    assert!(matches!(
        nodes[&A].scoped_waits().get(&second),
        Some(FoldWait::DiffersIn { partition: 0, .. })
    ));
    // B merges A's counter (epoch 1, W's new +5): the old slot leaves
    // phase 0, the new one enters phase 1. Now they agree.
    let b = nodes.get_mut(&B).unwrap();
    write(b, &key0(), W, (slot(5), 0), (slot(5), 1));
    for _ in 0..4 {
        round(&mut nodes, &[]);
    }
    let record = nodes[&B].book().record(2).expect("the second fold");
    assert_eq!(
        record.scoped,
        vec![(W, vec![(0, digest_of(&[(&key0(), 5)]))])]
    );
    assert_eq!(nodes[&A].applied_for(&key0()), 2);
    assert_eq!(nodes[&B].applied_for(&key0()), 2);
    assert_eq!(nodes[&A].book().scoped_epochs(W, 0), &[1, 2]);
}

#[test]
fn scoped_retirements_are_reported_and_learned() {
    let mut nodes = cluster();
    nodes.get_mut(&W).unwrap().retire_partition(W, 0);
    let report = nodes[&W].report();
    let retirement = ScopedRetirement {
        writer: W,
        partition: 0,
        phase: 0,
    };
    assert_eq!(report.retired_scoped, vec![retirement]);
    round(&mut nodes, &[]);
    // A keeper reports its digest of the pair; a node that does not keep
    // the partition reports none.
    let a = nodes[&A].report();
    assert_eq!(a.retired_scoped, vec![retirement]);
    assert_eq!(
        a.partitions.as_ref().unwrap().scoped,
        vec![(retirement, digest_of(&[(&key0(), 5)]))]
    );
    assert!(nodes[&W].report().partitions.unwrap().scoped.is_empty());
    // Committed records with scoped writers, and a candidate, too.
    for _ in 0..4 {
        round(&mut nodes, &[]);
    }
    let b = nodes[&B].report();
    assert!(!b.records[0].scoped.is_empty());
    assert!(
        b.retired_scoped.is_empty(),
        "a folded retirement is not reported"
    );
}

#[test]
fn a_writer_retired_whole_while_its_partition_fold_is_proposed_is_folded_whole() {
    let mut nodes = cluster();
    nodes.get_mut(&W).unwrap().retire_partition(W, 0);
    for _ in 0..2 {
        round(&mut nodes, &[]);
    }
    assert!(
        nodes[&A]
            .candidate()
            .is_some_and(|candidate| !candidate.scoped.is_empty()),
        "the partition's fold is proposed: {:?}",
        nodes[&A].candidate()
    );
    // W goes down for good and an operator retires it before the record
    // is committed: the record folds it whole (a record may not fold a
    // writer both ways), and nothing is refused.
    let down = FoldMember {
        replica: W,
        alive: false,
        node_name: "n1".into(),
        report: None,
    };
    for id in [A, B] {
        let folds = nodes.get_mut(&id).unwrap();
        assert_eq!(
            folds.retire(W, id, true, std::slice::from_ref(&down)),
            Ok(true)
        );
    }
    for _ in 0..4 {
        round(&mut nodes, &[W]);
    }
    for id in [A, B] {
        let record = nodes[&id].book().record(1).expect("a record");
        assert!(record.scoped.is_empty(), "{record:?}");
        assert_eq!(nodes[&id].book().folded_at(W), Some(1));
        assert_eq!(nodes[&id].unfolded_scoped().count(), 0);
    }
}
