//! Tests of the fold protocol: the agreement rule (every counted member,
//! down ones included), the refusals of `retire`, replaced incarnations, and
//! by proptest that members reading each other's reports late and out of
//! step never commit two different records for one epoch, and all fold once
//! they hear each other.

use proptest::prelude::*;

use super::*;

const W: ReplicaId = ReplicaId(90);
const W2: ReplicaId = ReplicaId(91);

fn slot(p: u64) -> Slot {
    Slot { p, n: 0 }
}

/// Nodes 1..=n, each holding the same state of writers `W` and `W2`.
fn nodes(n: u64) -> Vec<(ReplicaId, Folds)> {
    (1..=n)
        .map(|id| {
            let mut folds = Folds::default();
            folds.note_slot("a", W, Slot::default(), slot(5));
            folds.note_slot("b", W2, Slot::default(), slot(7));
            (ReplicaId(id), folds)
        })
        .collect()
}

fn member(replica: ReplicaId, report: Option<FoldReport>) -> FoldMember {
    FoldMember {
        replica,
        alive: true,
        node_name: format!("node-{}", replica.0),
        report,
    }
}

/// One synchronous round: every node reads every other's current report.
fn round(nodes: &mut [(ReplicaId, Folds)]) {
    let reports: Vec<(ReplicaId, FoldReport)> = nodes
        .iter()
        .map(|(id, folds)| (*id, folds.report()))
        .collect();
    for (id, folds) in nodes.iter_mut() {
        let others: Vec<FoldMember> = reports
            .iter()
            .filter(|(other, _)| other != id)
            .map(|(other, report)| member(*other, Some(report.clone())))
            .collect();
        let counted: Vec<ReplicaId> = others.iter().map(|m| m.replica).collect();
        folds.handle_reports(&counted, &others).unwrap();
    }
}

#[test]
fn every_member_folds_the_same_record_once_all_agree() {
    let mut nodes = nodes(3);
    let own = nodes[0].0;
    assert_eq!(nodes[0].1.retire(W, own, true, &[]), Ok(true));
    for _ in 0..4 {
        round(&mut nodes);
    }
    for (_, folds) in &nodes {
        assert_eq!(folds.book().epoch(), 1);
        assert_eq!(folds.book().folded_at(W), Some(1));
        assert_eq!(folds.applied(), 1);
        assert!(folds.waits().is_empty(), "{:?}", folds.waits());
    }
    let record = nodes[0].1.book().record(1).unwrap().clone();
    assert_eq!(record.writers, vec![(W, nodes[0].1.digest_of(W))]);
    let (retired, records) = nodes[1].1.take_pending();
    assert_eq!(records, vec![record]);
    assert!(matches!(retired[..], [(W, RetireReason::Reported { .. })]));
}

#[test]
fn a_down_member_that_never_reported_holds_the_fold_back() {
    let mut nodes = nodes(2);
    let own = nodes[0].0;
    nodes[0].1.retire(W, own, true, &[]).unwrap();
    let down = ReplicaId(3);
    for round in 0..4 {
        let reports: Vec<FoldReport> = nodes.iter().map(|(_, f)| f.report()).collect();
        for (index, (id, folds)) in nodes.iter_mut().enumerate() {
            let other = 1 - index;
            let members = [
                member(ReplicaId(other as u64 + 1), Some(reports[other].clone())),
                FoldMember {
                    alive: false,
                    ..member(down, None)
                },
            ];
            let counted = [members[0].replica, down];
            folds.handle_reports(&counted, &members).unwrap();
            assert_eq!(folds.book().epoch(), 0, "{id} folded without {down}");
            if round == 0 {
                continue;
            }
            assert_eq!(
                folds.waits().get(&W),
                Some(&FoldWait::NotReported {
                    member: down,
                    writer: W
                })
            );
        }
    }
}

#[test]
fn a_member_with_another_state_of_the_writer_holds_the_fold_back() {
    let mut nodes = nodes(2);
    nodes[1].1.note_slot("a", W, slot(5), slot(6));
    let own = nodes[0].0;
    nodes[0].1.retire(W, own, true, &[]).unwrap();
    for _ in 0..4 {
        round(&mut nodes);
    }
    assert_eq!(nodes[0].1.book().epoch(), 0);
    let wait = nodes[0].1.waits().get(&W).unwrap();
    assert!(matches!(wait, FoldWait::Differs { member, .. } if *member == ReplicaId(2)));
    assert!(
        wait.to_string().contains("another state of writer"),
        "{wait}"
    );
    // Anti-entropy brings node 1 up to date: the fold goes ahead.
    nodes[0].1.note_slot("a", W, slot(5), slot(6));
    for _ in 0..4 {
        round(&mut nodes);
    }
    assert_eq!(nodes[0].1.book().folded_at(W), Some(1));
    assert_eq!(nodes[1].1.book().folded_at(W), Some(1));
}

#[test]
fn retire_refuses_own_unknown_and_live_ids_and_changes_nothing() {
    let mut folds = Folds::default();
    let own = ReplicaId(1);
    let live = member(ReplicaId(2), None);
    let down = FoldMember {
        alive: false,
        ..member(ReplicaId(3), None)
    };
    let members = [live, down];
    assert_eq!(
        folds.retire(own, own, true, &members),
        Err(RetireRefused::Own(own))
    );
    assert_eq!(
        folds.retire(ReplicaId(2), own, true, &members),
        Err(RetireRefused::Alive(ReplicaId(2)))
    );
    assert_eq!(
        folds.retire(ReplicaId(4), own, false, &members),
        Err(RetireRefused::Unknown(ReplicaId(4)))
    );
    assert!(folds.retired().is_empty() && !folds.has_pending());
    let message = RetireRefused::Alive(ReplicaId(2)).to_string();
    assert!(message.contains("stop it"), "{message}");
    assert_eq!(folds.retire(ReplicaId(3), own, false, &members), Ok(true));
    assert_eq!(folds.retire(ReplicaId(3), own, false, &members), Ok(false));
    assert_eq!(
        folds.take_pending().0,
        vec![(ReplicaId(3), RetireReason::Operator)]
    );
}

#[test]
fn an_old_incarnation_is_retired_after_retire_after_and_not_before() {
    let mut folds = Folds::default();
    let own = ReplicaId(1);
    let old = FoldMember {
        alive: false,
        node_name: "b".into(),
        ..member(ReplicaId(5), None)
    };
    let new = FoldMember {
        node_name: "b".into(),
        ..member(ReplicaId(6), None)
    };
    let lonely = FoldMember {
        alive: false,
        node_name: "c".into(),
        ..member(ReplicaId(7), None)
    };
    let members = [old, new, lonely];
    assert!(folds
        .retire_replaced(1_000, own, "a", &members, 500)
        .is_empty());
    assert!(folds
        .retire_replaced(1_400, own, "a", &members, 500)
        .is_empty());
    assert_eq!(
        folds.retire_replaced(1_500, own, "a", &members, 500),
        vec![ReplicaId(5)]
    );
    assert_eq!(
        folds.retired().get(&ReplicaId(5)),
        Some(&RetireReason::Replaced { by: ReplicaId(6) })
    );
    // A down node with no newer incarnation is never retired on its own.
    assert!(!folds.is_retired(ReplicaId(7)));
    // Our own old incarnation (same node name as ours) is replaced by us.
    let mine = [FoldMember {
        alive: false,
        node_name: "a".into(),
        ..member(ReplicaId(8), None)
    }];
    folds.retire_replaced(2_000, own, "a", &mine, 0);
    assert_eq!(
        folds.retired().get(&ReplicaId(8)),
        Some(&RetireReason::Replaced { by: own })
    );
}

#[test]
fn an_incarnation_seen_only_before_folds_began_is_retired_once_replaced() {
    // Node b's first incarnation is seen alive while the cluster is too
    // young to fold; by the first fold round gossip has dropped it (its
    // successor is up), so only the names noted before know it was b's.
    let own = ReplicaId(1);
    let first = FoldMember {
        node_name: "b".into(),
        ..member(ReplicaId(5), None)
    };
    let second = FoldMember {
        node_name: "b".into(),
        ..member(ReplicaId(6), None)
    };
    let rounds = |folds: &mut Folds| {
        let members = std::slice::from_ref(&second);
        folds.retire_replaced(1_000, own, "a", members, 500);
        folds.retire_replaced(1_600, own, "a", members, 500)
    };
    let mut noted = Folds::default();
    noted.note_node_names(std::slice::from_ref(&first));
    assert_eq!(rounds(&mut noted), vec![ReplicaId(5)]);
    let mut unnoted = Folds::default();
    assert!(rounds(&mut unnoted).is_empty(), "never seen as b's");
}

#[test]
fn a_node_whose_state_differs_from_a_committed_record_does_not_apply_it() {
    let mut folds = Folds::default();
    folds.note_slot("a", W, Slot::default(), slot(4));
    let record = FoldRecord::new(
        1,
        [(W, {
            let mut digest = WriterDigest::default();
            digest.replace("a", Slot::default(), slot(5));
            digest
        })],
    );
    let peer = member(
        ReplicaId(2),
        Some(FoldReport {
            retired: vec![W],
            records: vec![record],
            ..FoldReport::default()
        }),
    );
    folds
        .handle_reports(&[ReplicaId(2)], std::slice::from_ref(&peer))
        .unwrap();
    assert_eq!(folds.book().epoch(), 1);
    assert_eq!(folds.applied(), 0);
    assert!(matches!(
        folds.waits().get(&W),
        Some(FoldWait::NotApplicable { epoch: 1, .. })
    ));
    // Once its state of W is the record's, it applies the fold.
    folds.note_slot("a", W, slot(4), slot(5));
    folds.handle_reports(&[ReplicaId(2)], &[peer]).unwrap();
    assert_eq!(folds.applied(), 1);
}

proptest! {
    /// Members read each other's reports late (any older report, never going
    /// back) and in any order; two of them retire a writer each at once.
    /// No two members ever hold different records for one epoch, and once
    /// they hear each other, every member has folded both writers.
    #[test]
    fn members_never_commit_two_records_for_one_epoch(
        steps in prop::collection::vec((0usize..4, prop::collection::vec(0usize..12, 4)), 0..100),
    ) {
        let mut nodes = nodes(4);
        let ids: Vec<ReplicaId> = nodes.iter().map(|(id, _)| *id).collect();
        nodes[0].1.retire(W, ids[0], true, &[]).unwrap();
        nodes[3].1.retire(W2, ids[3], true, &[]).unwrap();
        let mut history: Vec<Vec<FoldReport>> = nodes.iter().map(|(_, f)| vec![f.report()]).collect();
        let mut seen = [[0usize; 4]; 4];
        for (observer, picks) in steps {
            let mut members = Vec::new();
            for other in (0..4).filter(|other| *other != observer) {
                let latest = history[other].len() - 1;
                let index = seen[observer][other].max(picks[other].min(latest));
                seen[observer][other] = index;
                members.push(member(ids[other], Some(history[other][index].clone())));
            }
            let counted: Vec<ReplicaId> = members.iter().map(|m| m.replica).collect();
            nodes[observer].1.handle_reports(&counted, &members).unwrap();
            history[observer].push(nodes[observer].1.report());
            for (_, a) in &nodes {
                for (_, b) in &nodes {
                    for epoch in 1..=a.book().epoch().min(b.book().epoch()) {
                        prop_assert_eq!(a.book().record(epoch), b.book().record(epoch));
                    }
                }
            }
        }
        for _ in 0..8 {
            round(&mut nodes);
        }
        for (_, folds) in &nodes {
            prop_assert!(folds.book().folded_at(W).is_some());
            prop_assert!(folds.book().folded_at(W2).is_some());
            prop_assert_eq!(folds.book().records(), nodes[0].1.book().records());
        }
    }
}

#[test]
fn an_old_incarnation_dropped_from_the_member_list_is_retired_too() {
    let mut folds = Folds::default();
    let own = ReplicaId(1);
    let old = FoldMember {
        node_name: "b".into(),
        ..member(ReplicaId(5), None)
    };
    let new = FoldMember {
        node_name: "b".into(),
        ..member(ReplicaId(6), None)
    };
    folds.retire_replaced(0, own, "a", std::slice::from_ref(&old), 100);
    // Membership lists only the new incarnation once it appears.
    let members = [new];
    assert!(folds
        .retire_replaced(50, own, "a", &members, 100)
        .is_empty());
    assert!(folds
        .retire_replaced(120, own, "a", &members, 100)
        .is_empty());
    assert_eq!(
        folds.retire_replaced(150, own, "a", &members, 100),
        vec![ReplicaId(5)]
    );
}

/// W's report while it runs unfenced: it has not heard of any retirement.
fn unfenced() -> FoldReport {
    FoldReport::default()
}

/// W's report once it has fenced itself: it lists itself retired, with its
/// digest of its own slots.
fn fenced(digest: WriterDigest) -> FoldReport {
    FoldReport {
        retired: vec![W],
        digests: vec![(W, digest)],
        ..FoldReport::default()
    }
}

/// Rounds in which node 1 does not see W, and node 2 sees it up with
/// `w_report` (gossip reaches W through node 2 only).
fn rounds_with_w_seen_by_node_2(nodes: &mut [(ReplicaId, Folds)], w_report: &FoldReport) {
    for _ in 0..4 {
        let reports: Vec<FoldReport> = nodes.iter().map(|(_, f)| f.report()).collect();
        let first = [member(ReplicaId(2), Some(reports[1].clone()))];
        nodes[0].1.handle_reports(&[ReplicaId(2)], &first).unwrap();
        let second = [
            member(ReplicaId(1), Some(reports[0].clone())),
            member(W, Some(w_report.clone())),
        ];
        nodes[1]
            .1
            .handle_reports(&[ReplicaId(1), W], &second)
            .unwrap();
    }
}

#[test]
fn a_retired_writer_seen_up_is_folded_only_at_the_state_it_fenced_itself_at() {
    // W was retired while down and came back on its old directory: until it
    // has heard of its retirement it takes adds, so the others' agreeing
    // digests are not its final state. Node 2 sees it up: it neither
    // proposes the fold nor joins node 1's (node 1 does not see W).
    let mut nodes = nodes(2);
    let own = nodes[0].0;
    nodes[0].1.retire(W, own, true, &[]).unwrap();
    rounds_with_w_seen_by_node_2(&mut nodes, &unfenced());
    for (id, folds) in &nodes {
        assert_eq!(
            folds.book().epoch(),
            0,
            "{id} folded a writer still writing"
        );
    }
    assert_eq!(
        nodes[1].1.waits().get(&W),
        Some(&FoldWait::WriterUp { writer: W })
    );
    let message = FoldWait::WriterUp { writer: W }.to_string();
    assert!(message.contains("has not fenced itself"), "{message}");
    // W fences itself with one more add than the others hold: still no fold.
    let mut last = nodes[1].1.digest_of(W);
    last.replace("a", slot(5), slot(6));
    rounds_with_w_seen_by_node_2(&mut nodes, &fenced(last));
    assert_eq!(nodes[0].1.book().epoch(), 0);
    assert!(matches!(
        nodes[1].1.waits().get(&W),
        Some(FoldWait::Differs {
            member: W,
            writer: W,
            ..
        })
    ));
    // Once both hold W's final state, the fold goes ahead at it.
    for (_, folds) in nodes.iter_mut() {
        folds.note_slot("a", W, slot(5), slot(6));
    }
    rounds_with_w_seen_by_node_2(&mut nodes, &fenced(last));
    for (_, folds) in &nodes {
        assert_eq!(
            folds.book().record(1).map(|r| r.writers.clone()),
            Some(vec![(W, last)])
        );
    }
}

#[test]
fn a_differing_state_on_a_node_that_keeps_some_partitions_is_explained_as_lasting() {
    let differs = FoldWait::Differs {
        member: ReplicaId(2),
        writer: W,
        ours: WriterDigest::default(),
        theirs: WriterDigest {
            counters: 3,
            hash: 7,
        },
    };
    let everywhere = differs.explain(None);
    assert_eq!(everywhere, differs.to_string());
    assert!(everywhere.contains("waiting for anti-entropy"));
    assert_eq!(differs.explain(Some((16, 16))), differs.to_string());

    let partial = differs.explain(Some((11, 16)));
    assert!(
        partial.starts_with("member 0000000000000002 holds another state of writer"),
        "{partial}"
    );
    assert!(
        partial.contains("keeps 11 of the region's 16 partitions")
            && partial.contains("differ for good")
            && partial.contains("partition by partition"),
        "{partial}"
    );
    assert!(!partial.contains("anti-entropy"), "{partial}");
    // A wait that has nothing to do with held partitions reads the same.
    let not_reported = FoldWait::NotReported {
        member: ReplicaId(2),
        writer: W,
    };
    assert_eq!(
        not_reported.explain(Some((11, 16))),
        not_reported.to_string()
    );
}
