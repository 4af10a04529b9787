//! Tests of folds by partition (cluster version 10): members that keep
//! different partitions agree partition by partition and fold; a partition
//! whose keepers differ, or that nobody keeps, holds the fold back; a node
//! applies a record only to partitions it keeps and holds at the record's
//! state; a partition no longer kept drops back; the applied epochs survive
//! a restart.

use crate::crdt::{ReplicaId, Slot, WriterDigest};
use crate::partition::{Partition, PartitionCount, PartitionSet};
use crate::replica::folds::{FoldMember, FoldReport, FoldWait, Folds};

const W: ReplicaId = ReplicaId(90);
const COUNT: u64 = 4;

fn count() -> PartitionCount {
    PartitionCount::new(COUNT).unwrap()
}

/// A key of each partition.
fn keys() -> Vec<String> {
    (0..COUNT as u32)
        .map(|partition| {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|key| count().of_key(key.as_bytes()) == Partition(partition))
                .unwrap()
        })
        .collect()
}

fn set_of(partitions: &[u32]) -> PartitionSet {
    let mut set = PartitionSet::empty(count());
    for partition in partitions {
        set.insert(Partition(*partition));
    }
    set
}

/// A node keeping `kept`, holding W's slot `p = 10 + partition` in the key
/// of each partition it keeps, agreeing by partition.
fn node(kept: &[u32]) -> Folds {
    let mut folds = Folds::default();
    folds.track_partitions(count(), Default::default());
    folds.set_kept(Some(set_of(kept)));
    for partition in kept {
        let slot = Slot {
            p: 10 + u64::from(*partition),
            n: 0,
        };
        folds.note_slot(&keys()[*partition as usize], W, Slot::default(), slot);
    }
    folds
}

/// A live member with its report.
fn member(replica: ReplicaId, report: FoldReport) -> FoldMember {
    FoldMember {
        replica,
        alive: true,
        node_name: format!("n{}", replica.0),
        report: Some(report),
    }
}

/// One synchronous round: every node reads every other's report.
fn round(nodes: &mut [(ReplicaId, Folds)]) {
    let reports: Vec<_> = nodes.iter().map(|(id, f)| (*id, f.report())).collect();
    for (id, folds) in nodes.iter_mut() {
        let others: Vec<FoldMember> = reports
            .iter()
            .filter(|(other, _)| other != id)
            .map(|(other, report)| member(*other, report.clone()))
            .collect();
        let counted: Vec<ReplicaId> = others.iter().map(|m| m.replica).collect();
        folds.handle_reports(&counted, &others).unwrap();
    }
}

fn three() -> Vec<(ReplicaId, Folds)> {
    let mut nodes = vec![
        (ReplicaId(1), node(&[0, 1, 2])),
        (ReplicaId(2), node(&[1, 2, 3])),
        (ReplicaId(3), node(&[0, 3])),
    ];
    assert_eq!(nodes[0].1.retire(W, ReplicaId(1), true, &[]), Ok(true));
    nodes
}

#[test]
fn members_keeping_different_partitions_fold_a_writer_partition_by_partition() {
    let mut nodes = three();
    for _ in 0..4 {
        round(&mut nodes);
    }
    for (id, folds) in &nodes {
        assert_eq!(folds.book().folded_at(W), Some(1), "node {id}");
        let record = folds.book().record(1).unwrap();
        for partition in 0..COUNT as u32 {
            let want = WriterDigest::default().tap(&keys()[partition as usize], 10 + partition);
            assert_eq!(record.partition_digest(W, partition), Some(want));
            let applied = folds.applied_for(&keys()[partition as usize]);
            let kept = folds_keeps(*id, partition);
            assert_eq!(applied, u64::from(kept), "node {id} partition {partition}");
        }
        assert_eq!(folds.folds_done(None), 1);
    }
}

fn folds_keeps(id: ReplicaId, partition: u32) -> bool {
    match id.0 {
        1 => [0, 1, 2].contains(&partition),
        2 => [1, 2, 3].contains(&partition),
        _ => [0, 3].contains(&partition),
    }
}

trait Tap {
    fn tap(self, key: &str, p: u32) -> Self;
}

impl Tap for WriterDigest {
    fn tap(mut self, key: &str, p: u32) -> Self {
        self.replace(
            key,
            Slot::default(),
            Slot {
                p: u64::from(p),
                n: 0,
            },
        );
        self
    }
}

#[test]
fn keepers_that_differ_or_a_partition_nobody_keeps_hold_the_fold_back() {
    let mut nodes = three();
    // Node 2 lacks W's last add in partition 1.
    let key = keys()[1].clone();
    nodes[1]
        .1
        .note_slot(&key, W, Slot { p: 11, n: 0 }, Slot { p: 9, n: 0 });
    for _ in 0..4 {
        round(&mut nodes);
    }
    assert_eq!(nodes[0].1.book().epoch(), 0);
    let wait = nodes[0].1.waits().get(&W).cloned();
    assert!(
        matches!(wait, Some(FoldWait::DiffersIn { partition: 1, .. })),
        "{wait:?}"
    );
    assert!(wait.unwrap().to_string().contains("partition 1"));
    // Anti-entropy brings it: the fold goes through.
    nodes[1]
        .1
        .note_slot(&key, W, Slot { p: 9, n: 0 }, Slot { p: 11, n: 0 });
    for _ in 0..4 {
        round(&mut nodes);
    }
    assert!(nodes.iter().all(|(_, f)| f.book().folded_at(W) == Some(1)));

    // Nobody keeps partition 3: no member vouches for it.
    let mut gap = vec![(ReplicaId(1), node(&[0, 1])), (ReplicaId(2), node(&[1, 2]))];
    gap[0].1.retire(W, ReplicaId(1), true, &[]).unwrap();
    for _ in 0..4 {
        round(&mut gap);
    }
    assert_eq!(gap[0].1.book().epoch(), 0);
    assert_eq!(
        gap[0].1.waits().get(&W),
        Some(&FoldWait::Unkept {
            writer: W,
            partition: 3
        })
    );
}

#[test]
fn a_node_applies_a_record_only_where_it_keeps_and_holds_the_final_state() {
    let mut nodes = three();
    for _ in 0..4 {
        round(&mut nodes);
    }
    // A node that joined after the fold keeps partitions 0 and 1 and holds
    // W's final slot in partition 0 only (partition 1 not copied yet).
    let mut late = Folds::default();
    late.track_partitions(count(), Default::default());
    late.set_kept(Some(set_of(&[0, 1])));
    late.note_slot(&keys()[0], W, Slot::default(), Slot { p: 10, n: 0 });
    let members: Vec<FoldMember> = nodes
        .iter()
        .map(|(id, folds)| member(*id, folds.report()))
        .collect();
    late.handle_reports(&[], &members).unwrap();
    assert_eq!(late.book().epoch(), 1);
    assert_eq!(late.applied_for(&keys()[0]), 1);
    assert_eq!(
        late.applied_for(&keys()[1]),
        0,
        "partition 1 is not held whole"
    );
    assert_eq!(late.applied_for(&keys()[2]), 0, "partition 2 is not kept");
    assert!(matches!(
        late.waits().get(&W),
        Some(FoldWait::NotApplicableIn { partition: 1, .. })
    ));
    // Its copy of partition 1 completes: applied there too.
    late.note_slot(&keys()[1], W, Slot::default(), Slot { p: 11, n: 0 });
    late.handle_reports(&[], &members).unwrap();
    assert_eq!(late.applied_for(&keys()[1]), 1);
}

#[test]
fn a_node_that_copied_its_partitions_already_folded_is_done_with_the_fold() {
    let mut nodes = three();
    for _ in 0..4 {
        round(&mut nodes);
    }
    let members: Vec<FoldMember> = nodes
        .iter()
        .map(|(id, folds)| member(*id, folds.report()))
        .collect();
    // Joined after the fold, keeping partitions 0 and 1, copied folded: it
    // holds no slot of W, so its digests are not the record's and it
    // applies nothing, yet nothing is left to fold here.
    let mut late = Folds::default();
    late.track_partitions(count(), Default::default());
    late.set_kept(Some(set_of(&[0, 1])));
    late.handle_reports(&[], &members).unwrap();
    assert_eq!(late.applied_for(&keys()[0]), 0);
    assert_eq!(late.folds_done(Some(&set_of(&[0, 1]))), 1);
    assert_eq!(
        late.folds_done(Some(&set_of(&[0]))),
        0,
        "partition 1 is still being copied in"
    );
    // A merge brings a state of W that is not the final one: not done.
    late.note_slot(&keys()[0], W, Slot::default(), Slot { p: 3, n: 0 });
    late.handle_reports(&[], &members).unwrap();
    assert_eq!(late.folds_done(Some(&set_of(&[0, 1]))), 0);
    // A node keeping nothing (drained) and holding no slot of W is done.
    let mut drained = Folds::default();
    drained.track_partitions(count(), Default::default());
    drained.set_kept(Some(set_of(&[])));
    drained.handle_reports(&[], &members).unwrap();
    assert_eq!(drained.folds_done(Some(&set_of(&[]))), 1);
}

#[test]
fn a_partition_no_longer_kept_drops_back_and_applied_epochs_survive_a_restart() {
    let mut nodes = three();
    for _ in 0..4 {
        round(&mut nodes);
    }
    let folds = &mut nodes[0].1;
    folds.take_applied_partitions();
    assert_eq!(folds.applied_for(&keys()[1]), 1);
    folds.set_kept(Some(set_of(&[0, 2])));
    assert_eq!(folds.applied_for(&keys()[1]), 0, "partition 1 handed away");
    assert_eq!(folds.applied_for(&keys()[0]), 1);
    let persisted = folds.take_applied_partitions().expect("changed");
    assert_eq!(persisted, vec![(0, 1), (2, 1)], "above the floor of 0");
    assert_eq!(folds.applied(), 0);
    assert!(folds.take_applied_partitions().is_none(), "nothing new");

    // What a restart recovers: the floor, the records, the partitions above it.
    let records = folds.book().records().to_vec();
    let mut recovered = Folds::recovered(vec![], records, vec![], folds.applied());
    recovered.set_recovered_partitions(persisted);
    recovered.track_partitions(count(), Default::default());
    recovered.set_kept(Some(set_of(&[0, 2])));
    for partition in 0..COUNT as u32 {
        let key = &keys()[partition as usize];
        assert_eq!(
            recovered.applied_for(key),
            folds.applied_for(key),
            "partition {partition}"
        );
    }
}

#[test]
fn members_converge_when_every_two_agree_on_the_partitions_both_keep() {
    use crate::replica::convergence::{
        kept_by_both, shared_convergence, shared_digest, SharedView,
    };
    use crate::replica::fold_partitions::PartitionReport;
    // Three members keeping {0,1,2}, {1,2,3}, {0,3}, holding the same state
    // of every partition (counters c, sets s), except where noted.
    let counters = [11u64, 12, 13, 14];
    let sets = [21u64, 22, 23, 24];
    let kept = [set_of(&[0, 1, 2]), set_of(&[1, 2, 3]), set_of(&[0, 3])];
    let report = |me: usize, counters: &[u64]| PartitionReport {
        kept: Some(kept[me].clone()),
        digests: Vec::new(),
        shared: (0..3)
            .filter(|other| *other != me)
            .map(|other| {
                let both = kept_by_both(count(), Some(&kept[me]), Some(&kept[other]));
                (
                    ReplicaId(other as u64),
                    shared_digest(both, counters, &sets),
                )
            })
            .collect(),
        scoped: Vec::new(),
    };
    let reports: Vec<PartitionReport> = (0..3).map(|me| report(me, &counters)).collect();
    fn views(reports: &[PartitionReport]) -> Vec<SharedView<'_>> {
        ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, name)| SharedView {
                replica: ReplicaId(i as u64),
                name,
                report: reports.get(i),
            })
            .collect()
    }
    assert_eq!(shared_convergence(&views(&reports)), Ok(3));
    // b sees another state of partition 3: b and c differ (they share 3),
    // a and b still agree (they share 1 and 2 only).
    let mut diverged = reports.clone();
    diverged[1] = report(1, &[11, 12, 13, 99]);
    let why = shared_convergence(&views(&diverged)).unwrap_err();
    assert_eq!(
        why,
        "b and c hold different states of the partitions both keep"
    );
    // A member without a report yet.
    let why = shared_convergence(&views(&reports[..2])).unwrap_err();
    assert_eq!(why, "c has not reported the digests of its partitions yet");
    // A member that has not learned of another yet.
    let mut unaware = reports.clone();
    unaware[0].shared.retain(|(peer, _)| *peer != ReplicaId(2));
    let why = shared_convergence(&views(&unaware)).unwrap_err();
    assert_eq!(
        why,
        "a has no digest of the partitions it shares with c yet"
    );
    // The digest covers exactly the partitions both keep.
    let ab: Vec<u32> = kept_by_both(count(), Some(&kept[0]), Some(&kept[1])).collect();
    assert_eq!(ab, vec![1, 2]);
    assert_eq!(kept_by_both(count(), None, None).count(), COUNT as usize);
}
