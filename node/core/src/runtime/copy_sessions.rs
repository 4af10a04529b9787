//! Partition-scoped pulls over one cursor per peer (issue 11, handoff): the
//! anti-entropy loop asks [`Holdings`](crate::partition::Holdings) what to
//! pull from a peer, and this module turns that [`PullScope`] into the
//! request's scope and cursors, and a pull's outcome into what to report
//! back. No IO.
//!
//! A node keeps one set of cursors per peer (counters, set deltas,
//! idempotency records), not one per partition. A partition this node is
//! receiving, or that the peer releases, and that this node has not copied
//! from the peer yet (`PullScope::copy`) needs the peer's whole history of
//! it, so a *copy session* starts: every cursor goes back to the start and the
//! scope's partitions are read again from there (the ones already held are
//! merged again, which changes nothing). The session lasts over as many
//! pulls as the copy takes (each pull is bounded in time and bytes) and ends
//! at the pull that reaches the peer's durable sequence.
//!
//! A partition this node serves already (recovered after a restart, when
//! `Holdings` has covered nothing yet) is not copied again: its cursors were
//! persisted with what they merged, and what the peer changed of it before
//! serving it were copies of other holders' writes, which this node has
//! from them. Deltas cover it from the next pull that reaches the end, for
//! convergence and for a receiving node's catching up. They do not make it
//! *copied* ([`Coverage::copied`](crate::partition::Coverage)), which a
//! releasing peer's confirmation needs: the peer may hold writes it merged
//! while this node's cursor passed them by (the partition was not in the
//! scope then) from a holder that is gone since. So when the peer starts
//! releasing it, a session copies it from scratch.
//!
//! Invariant: a pull is reported to `Holdings` only when it reached the
//! peer's durable sequence, and a partition is reported as served only if
//! every chunk of every pull of its session served it, so that a partition
//! the peer was itself still copying in is never taken as copied whole
//! (invariant 8).
//!
//! A partition to copy from scratch that the session did not start with (a
//! peer that starts releasing more, a later move) restarts the session
//! from the start with it while the session is young
//! ([`RESTART_WITHIN_MS`]: a join's sets grow in its first gossip rounds,
//! and a restart then loses little). Later it waits for the next session:
//! it is left out of the pulls' scope until this session ends, since the
//! cursors are past its beginning. Restarting at any time threw the
//! session's headway away each time the set grew, and a session that took
//! longer than the set stayed the same never ended.

use std::collections::HashMap;

use crate::crdt::ReplicaId;
use crate::partition::{PartitionSet, PullScope};
use crate::replica::{Cursor, DeltaCursor, PullRequest, RecordsCursor};

/// A session younger than this restarts from the start for a partition
/// it did not start with; an older one finishes first (see the module
/// documentation).
pub const RESTART_WITHIN_MS: u64 = 2_000;

/// A copy from scratch in progress from one peer.
#[derive(Clone, Debug)]
struct Session {
    /// When it started (ms).
    started_ms: u64,
    /// The partitions it copies from scratch.
    partitions: PartitionSet,
    /// Those the peer served in every chunk so far.
    served: PartitionSet,
    /// The holdings' deletion epoch when it started.
    epoch: u64,
}

/// How one pull ended (`default()`: no chunk yet).
#[derive(Clone, Debug, Default)]
pub struct PullOutcome {
    /// Whether the last chunk reached the peer's durable sequence (counters,
    /// deltas and records).
    pub reached_end: bool,
    /// The partitions every chunk served (`None`: the peer named none, a
    /// build that serves every partition).
    pub served: Option<PartitionSet>,
    /// The peer's sequence the counters were pulled through.
    pub through_seq: u64,
}

impl PullOutcome {
    /// Takes in one chunk's facts.
    pub fn add_chunk(&mut self, served: Option<&PartitionSet>, through_seq: u64, last: bool) {
        if let Some(served) = served {
            self.served = Some(match self.served.take() {
                Some(before) => before.intersection(served),
                None => served.clone(),
            });
        }
        self.through_seq = through_seq;
        self.reached_end = last;
    }
}

/// What to tell `Holdings` after a pull: the scope, the partitions served
/// throughout, the peer's sequence reached, and the partitions read from
/// scratch (a session reads every partition of its scope from the start).
pub type PullReport = (PullScope, PartitionSet, u64, PartitionSet);

/// The copy sessions of every peer (see the module documentation).
#[derive(Debug, Default)]
pub struct CopySessions {
    sessions: HashMap<ReplicaId, Session>,
}

impl CopySessions {
    /// Fits `request` (planned with the peer's cursors) to `scope`: its
    /// partitions, and every cursor at the start when a session starts now
    /// (for the partitions of `scope.copy`). Returns the scope of this
    /// pull, which [`CopySessions::finish`] takes: `scope` without the
    /// partitions to copy that wait for the next session.
    pub fn prepare(
        &mut self,
        now_ms: u64,
        peer: ReplicaId,
        scope: &PullScope,
        request: &mut PullRequest,
    ) -> PullScope {
        request.scope = Some(scope.partitions.clone());
        let copy = scope.copy.clone();
        if copy.is_empty() {
            self.sessions.remove(&peer);
            return scope.clone();
        }
        if let Some(session) = self.sessions.get(&peer) {
            let waiting = copy.difference(&session.partitions);
            let young = now_ms.saturating_sub(session.started_ms) < RESTART_WITHIN_MS;
            if !waiting.is_empty() && young {
                return self.start(now_ms, peer, scope, request);
            }
            let fitted = PullScope {
                partitions: scope.partitions.difference(&waiting),
                copy: copy.intersection(&session.partitions),
                ..scope.clone()
            };
            request.scope = Some(fitted.partitions.clone());
            return fitted;
        }
        self.start(now_ms, peer, scope, request)
    }

    /// Starts a session of `scope.copy` with every cursor at the start.
    fn start(
        &mut self,
        now_ms: u64,
        peer: ReplicaId,
        scope: &PullScope,
        request: &mut PullRequest,
    ) -> PullScope {
        let copy = scope.copy.clone();
        self.sessions.insert(
            peer,
            Session {
                started_ms: now_ms,
                partitions: copy,
                served: scope.partitions.clone(),
                epoch: scope.epoch,
            },
        );
        request.after = Cursor::default();
        request.deltas_after = request
            .deltas_after
            .as_ref()
            .map(|_| DeltaCursor::default());
        request.records_from = request.records_from.map(|_| RecordsCursor::default());
        scope.clone()
    }

    /// A pull made with `scope` ended with `outcome`: what to report, if it
    /// reached the peer's durable sequence (the session, if any, ends).
    pub fn finish(
        &mut self,
        peer: ReplicaId,
        scope: &PullScope,
        outcome: &PullOutcome,
    ) -> Option<PullReport> {
        let served = outcome
            .served
            .clone()
            .unwrap_or_else(|| scope.partitions.clone());
        let Some(session) = self.sessions.get_mut(&peer) else {
            let none = PartitionSet::empty(scope.partitions.count());
            return outcome
                .reached_end
                .then(|| (scope.clone(), served, outcome.through_seq, none));
        };
        session.served = session.served.intersection(&served);
        if !outcome.reached_end {
            return None;
        }
        let session = self.sessions.remove(&peer)?;
        let reported = PullScope {
            epoch: session.epoch,
            ..scope.clone()
        };
        Some((
            reported,
            session.served.clone(),
            outcome.through_seq,
            session.served,
        ))
    }
}

#[cfg(test)]
#[path = "copy_sessions_tests.rs"]
mod tests;
