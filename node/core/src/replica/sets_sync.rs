//! Anti-entropy of like sets and uniques: the delta log. Every commit that
//! changes a set writes one delta-log record, keyed by (commit sequence,
//! kind, key), holding the changed members with their lengths (or the changed
//! registers with their ranks) as of that commit. A peer pulls the records
//! after its cursor, in the same pull as counters, and merges them by max.
//!
//! Invariant 2 of DESIGN.md, for sets: only records of durable commits are
//! served (the scan stops at the durable sequence), and a record holds what
//! its commit made durable, never live state. Changes are shipped as deltas,
//! never whole sets: a hot post's round costs the members that changed in
//! it. A merge that changes something is stamped with a local commit like a
//! local like, so changes travel on through this replica too.
//!
//! Like sets and uniques belong to their key's partition, as counters do
//! (protocol version 9): a scoped pull from a caller that speaks it gets only
//! the records of the partitions served in the chunk (`protocol.rs`), and a
//! chunk's records of partitions this replica does not keep are skipped
//! unmerged (a build before version 9 sends every record), so a node stores
//! the sets of its partitions only.

use crate::crdt::ReplicaId;

use super::sets::SetDelta;
use super::types::{DurableState, StorageError};
use super::Replica;

/// The most members and registers one chunk may carry.
pub const MAX_CHUNK_ELEMENTS: usize = 65_536;
/// The most delta-log records one chunk reads, sent or skipped: a scoped
/// pull past a long stretch of other partitions' records ends its chunk
/// there and goes on in the next one.
const MAX_CHUNK_SCANNED_RECORDS: usize = 16_384;

/// A position in the delta log: every record up to and including this one
/// is covered. The bytes are the record's (seq BE u64, kind, key); empty
/// means "from the start".
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Default, Hash)]
pub struct DeltaCursor(pub Vec<u8>);

impl DeltaCursor {
    /// The cursor after every record of commit `seq` and before.
    pub fn after_seq(seq: u64) -> Self {
        let mut bytes = seq.to_be_bytes().to_vec();
        bytes.push(0xff);
        DeltaCursor(bytes)
    }

    /// The commit sequence the cursor is in (0 from the start).
    pub fn seq(&self) -> u64 {
        self.0
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_be_bytes)
    }
}

/// Delta-log records answering a pull.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct DeltaChunk {
    /// Records after the request's cursor, in log order.
    pub deltas: Vec<SetDelta>,
    /// The cursor after them.
    pub next: DeltaCursor,
    /// True when `next` reaches the durable sequence.
    pub complete: bool,
}

impl Replica {
    /// Serves delta-log records after `after`, of durable commits only, up
    /// to about `max_bytes`, and only those of keys `in_scope` (the others
    /// are passed over: the cursor moves past them).
    pub fn handle_pull_deltas(
        &self,
        store: &(impl DurableState + ?Sized),
        after: &DeltaCursor,
        max_bytes: usize,
        in_scope: &dyn Fn(&str) -> bool,
    ) -> Result<DeltaChunk, StorageError> {
        let durable = self.durable_seq;
        let done = DeltaCursor::after_seq(durable);
        let mut chunk = DeltaChunk {
            next: after.clone(),
            ..Default::default()
        };
        let (mut bytes, mut elements, mut scanned) = (0usize, 0usize, 0usize);
        loop {
            if chunk.next >= done {
                chunk.complete = true;
                chunk.next = chunk.next.max(done);
                return Ok(chunk);
            }
            let records = store.deltas_after(&chunk.next, 64)?;
            if records.is_empty() {
                chunk.complete = true;
                chunk.next = done;
                return Ok(chunk);
            }
            for (cursor, delta) in records {
                if cursor.seq() > durable {
                    chunk.complete = true;
                    chunk.next = done;
                    return Ok(chunk);
                }
                if scanned == MAX_CHUNK_SCANNED_RECORDS {
                    return Ok(chunk);
                }
                scanned += 1;
                if !in_scope(delta.key()) {
                    chunk.next = cursor;
                    continue;
                }
                if elements + delta.len() > MAX_CHUNK_ELEMENTS && !chunk.deltas.is_empty() {
                    return Ok(chunk);
                }
                bytes += delta.estimated_bytes();
                elements += delta.len();
                chunk.deltas.push(delta);
                chunk.next = cursor;
                if bytes >= max_bytes {
                    return Ok(chunk);
                }
            }
        }
    }

    /// Merges pulled delta-log records from `peer` and moves its delta
    /// watermark to `next`. Returns the members and registers that changed.
    /// The records were checked at the edge (keys, members, registers).
    /// Records of partitions this replica does not keep are skipped: a
    /// sender before protocol version 9 sends every record, and a pull in
    /// flight when a partition was deleted here must not store it again.
    pub fn handle_pull_deltas_chunk(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        peer: ReplicaId,
        deltas: &[SetDelta],
        next: DeltaCursor,
    ) -> Result<usize, StorageError> {
        #[cfg(feature = "planted-bugs")]
        let last_writer_wins = self.config.planted_bug == Some(super::PlantedBug::LastWriterLength);
        #[cfg(not(feature = "planted-bugs"))]
        let last_writer_wins = false;
        let mut changed = 0;
        for delta in deltas {
            if !self.keeps(delta.key()) {
                continue;
            }
            changed += self
                .sets
                .merge_delta(store, delta, now_ms, last_writer_wins)?;
        }
        self.peers
            .advance_delta_watermark(peer, next, !deltas.is_empty());
        Ok(changed)
    }
}
