//! Which idempotency records of this node's segments it learned from which
//! peer, so that a pull never sends a peer back the records that came from
//! it (`idempotency_sync.rs`). Before, every record travelled back to its
//! maker, which decoded it and looked it up under the core's lock for
//! nothing: twice the record bytes of a region, and about 0.9 ms of a
//! 2-node region's hot-key p99 (`docs/src/benchmarks/index.md`, "Idempotency
//! records between the nodes of a region").
//!
//! Records learned in one merge (a pull chunk or a copy push) sit side by
//! side in the commit that writes them, so the core keeps *runs*: for the
//! records waiting for the next commit, and per committed segment, which
//! positions came from which peer. They follow the records exactly: into
//! the commit that takes them, back behind the records queued since when
//! that commit fails, away with the segment when it is deleted.
//!
//! Only what is left out changes, never what is sent: a record is left out
//! of a pull only for the peer that sent it here, which holds it (it served
//! it durable). A third node still gets it through this one. The runs are
//! kept in memory for the newest [`MAX_TRACKED_SEGMENTS`] segments that have
//! any; after a restart, or for older segments, records echo back as before,
//! which changes nothing.

use std::collections::BTreeMap;

use crate::crdt::ReplicaId;

/// The most committed segments whose runs are kept (the oldest go first).
pub const MAX_TRACKED_SEGMENTS: usize = 8_192;

/// Positions `start..end` of a segment (or of the records waiting for the
/// next commit) that were learned from `source`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Run {
    /// The peer the records came from.
    pub source: ReplicaId,
    /// The first position.
    pub start: u32,
    /// Just past the last position.
    pub end: u32,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct RecordSources {
    /// Runs of the records waiting for the next commit.
    pending: Vec<Run>,
    /// Runs of committed (or in flight) segments, by commit sequence.
    segments: BTreeMap<u64, Vec<Run>>,
}

impl RecordSources {
    /// `count` records learned from `source` were queued at positions
    /// `start..` of the records waiting for the next commit.
    pub(super) fn note_learned(&mut self, source: ReplicaId, start: usize, count: usize) {
        if count == 0 {
            return;
        }
        let (start, end) = (start as u32, (start + count) as u32);
        match self.pending.last_mut() {
            Some(last) if last.source == source && last.end == start => last.end = end,
            _ => self.pending.push(Run { source, start, end }),
        }
    }

    /// The records waiting went into commit `seq`.
    pub(super) fn commit(&mut self, seq: u64) {
        if self.pending.is_empty() {
            return;
        }
        self.segments.insert(seq, std::mem::take(&mut self.pending));
        while self.segments.len() > MAX_TRACKED_SEGMENTS {
            self.segments.pop_first();
        }
    }

    /// Commit `seq` failed: its records are queued again behind the
    /// `queued` records waiting now, and so are their runs.
    pub(super) fn commit_failed(&mut self, seq: u64, queued: usize) {
        let Some(runs) = self.segments.remove(&seq) else {
            return;
        };
        for run in runs {
            let start = queued + run.start as usize;
            self.note_learned(run.source, start, (run.end - run.start) as usize);
        }
    }

    /// Segment `seq` is deleted.
    pub(super) fn forget(&mut self, seq: u64) {
        self.segments.remove(&seq);
    }

    /// The runs learned from `source` in segments `from..until`, in order:
    /// what a pull by `source` leaves out.
    pub(super) fn learned_from(&self, source: ReplicaId, from: u64, until: u64) -> Vec<(u64, Run)> {
        if from >= until {
            return Vec::new();
        }
        self.segments
            .range(from..until)
            .flat_map(|(seq, runs)| runs.iter().map(move |run| (*seq, *run)))
            .filter(|(_, run)| run.source == source)
            .collect()
    }
}
