//! Copy sessions: when cursors go back to the start, how long a session
//! lasts, and what a finished pull reports.

use super::*;
use crate::partition::{Partition, PartitionCount};
use crate::replica::version::ProtocolWindow;

const PEER: ReplicaId = ReplicaId(7);

fn set(partitions: &[u32]) -> PartitionSet {
    let mut set = PartitionSet::empty(PartitionCount::new(8).unwrap());
    for partition in partitions {
        set.insert(Partition(*partition));
    }
    set
}

/// A scope of `partitions`, `from_scratch` of them not copied yet, `copy`
/// of those to copy now.
fn scope(partitions: &[u32], from_scratch: &[u32], copy: &[u32]) -> PullScope {
    PullScope {
        peer: "eu-2".into(),
        partitions: set(partitions),
        from_scratch: set(from_scratch),
        copy: set(copy),
        epoch: 3,
    }
}

/// A request as the peer book plans it: cursors well past the start.
fn planned() -> PullRequest {
    PullRequest {
        cluster_id: "c".into(),
        caller: ReplicaId(1),
        expected: Some(PEER),
        after: Cursor::after_seq(40),
        max_bytes: 1 << 20,
        directory_digest: None,
        protocol: ProtocolWindow::at(1, 1),
        deltas_after: Some(DeltaCursor::after_seq(40)),
        records_from: Some(RecordsCursor::after_seq(40)),
        scope: None,
    }
}

fn outcome(served: Option<&[u32]>, through_seq: u64, last: bool) -> PullOutcome {
    let mut outcome = PullOutcome::default();
    outcome.add_chunk(served.map(set).as_ref(), through_seq, last);
    outcome
}

#[test]
fn a_delta_pull_keeps_its_cursors_and_reports_only_when_it_reached_the_end() {
    let mut sessions = CopySessions::default();
    let scope = scope(&[1, 2], &[1], &[]);
    let mut request = planned();
    sessions.prepare(0, PEER, &scope, &mut request);
    assert_eq!(request.after, Cursor::after_seq(40));
    assert_eq!(request.scope, Some(set(&[1, 2])));
    assert!(sessions
        .finish(PEER, &scope, &outcome(Some(&[1, 2]), 50, false))
        .is_none());
    let (reported, served, through, read) = sessions
        .finish(PEER, &scope, &outcome(Some(&[2]), 60, true))
        .unwrap();
    assert_eq!((reported, served, through), (scope, set(&[2]), 60));
    assert_eq!(read, set(&[]), "deltas copy nothing from scratch");
}

#[test]
fn a_partition_being_received_starts_a_session_from_the_start_that_lasts_until_the_end() {
    let mut sessions = CopySessions::default();
    let first = scope(&[1, 3], &[1, 3], &[3]);
    let mut request = planned();
    sessions.prepare(0, PEER, &first, &mut request);
    assert_eq!(request.after, Cursor::default());
    assert_eq!(request.deltas_after, Some(DeltaCursor::default()));
    assert_eq!(request.records_from, Some(RecordsCursor::default()));
    // The first pull stops half way, with partition 1 not served in one chunk.
    assert!(sessions
        .finish(PEER, &first, &outcome(Some(&[3]), 20, false))
        .is_none());
    // The next pull goes on from where the cursors are: no restart.
    let mut request = planned();
    sessions.prepare(0, PEER, &first, &mut request);
    assert_eq!(request.after, Cursor::after_seq(40));
    let (reported, served, through, read) = sessions
        .finish(PEER, &first, &outcome(Some(&[1, 3]), 45, true))
        .unwrap();
    // Partition 1 missed a chunk of the session: not served throughout.
    assert_eq!(served, set(&[3]));
    assert_eq!(read, set(&[3]), "read from the start throughout");
    assert_eq!((reported.epoch, through), (3, 45));
    // The session is over: the next pull is a delta pull again.
    let mut request = planned();
    sessions.prepare(0, PEER, &scope(&[1, 3], &[], &[]), &mut request);
    assert_eq!(request.after, Cursor::after_seq(40));
}

#[test]
fn a_new_partition_to_copy_waits_for_the_next_session_and_a_served_one_never_starts_one() {
    let mut sessions = CopySessions::default();
    let mut request = planned();
    sessions.prepare(0, PEER, &scope(&[2, 3], &[3], &[3]), &mut request);
    assert!(sessions
        .finish(
            PEER,
            &scope(&[2, 3], &[3], &[3]),
            &outcome(Some(&[2, 3]), 20, false)
        )
        .is_none());
    // 4 now needs copying too. A young session restarts with it (a join's
    // sets grow in its first rounds); this one is older: it goes on (its
    // cursors keep their headway) without 4, which is not pulled meanwhile.
    let grown = scope(&[2, 3, 4], &[3, 4], &[3, 4]);
    let mut young = CopySessions::default();
    young.prepare(0, PEER, &scope(&[2, 3], &[3], &[3]), &mut planned());
    let mut request = planned();
    let restarted = young.prepare(RESTART_WITHIN_MS - 1, PEER, &grown, &mut request);
    assert_eq!(
        (request.after, restarted),
        (Cursor::default(), grown.clone())
    );
    let mut request = planned();
    let fitted = sessions.prepare(RESTART_WITHIN_MS, PEER, &grown, &mut request);
    assert_eq!(request.after, Cursor::after_seq(40), "no restart");
    assert_eq!(request.scope, Some(set(&[2, 3])));
    assert_eq!(
        (fitted.partitions.clone(), fitted.copy.clone()),
        (set(&[2, 3]), set(&[3]))
    );
    let (reported, _, _, read) = sessions
        .finish(PEER, &fitted, &outcome(Some(&[2, 3]), 30, true))
        .unwrap();
    assert_eq!(read, set(&[2, 3]), "read from the start: 2 and 3, not 4");
    assert!(
        !reported.partitions.contains(Partition(4)),
        "4 is not covered"
    );
    // The next pull starts 4's own session from the start.
    let mut request = planned();
    let fitted = sessions.prepare(
        RESTART_WITHIN_MS,
        PEER,
        &scope(&[2, 3, 4], &[4], &[4]),
        &mut request,
    );
    assert_eq!(
        request.after,
        Cursor::default(),
        "4 is copied from the start"
    );
    assert_eq!(request.records_from, Some(RecordsCursor::default()));
    assert_eq!(fitted.partitions, set(&[2, 3, 4]));
    // Recovered after a restart: served, not copied yet, not received, and
    // the peer does not release it.
    let mut fresh = CopySessions::default();
    let mut request = planned();
    fresh.prepare(0, PEER, &scope(&[5], &[5], &[]), &mut request);
    assert_eq!(request.after, Cursor::after_seq(40));
}

#[test]
fn a_peer_that_names_no_served_partitions_serves_the_whole_scope() {
    let mut sessions = CopySessions::default();
    let scope = scope(&[1, 2], &[], &[]);
    let mut request = planned();
    sessions.prepare(0, PEER, &scope, &mut request);
    let (_, served, _, _) = sessions
        .finish(PEER, &scope, &outcome(None, 9, true))
        .unwrap();
    assert_eq!(served, set(&[1, 2]));
}
