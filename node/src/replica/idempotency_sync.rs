//! Idempotency records travel within a region (issue 11, item 6): a retry
//! that fails over from a key's first owner to another node of the region
//! is recognised there once the first owner's record has reached it.
//!
//! Invariant 5 of DESIGN.md across failover. A pull from a peer of the same
//! region also asks for the peer's idempotency segments after a commit
//! sequence of the peer's ([`Replica::handle_pull_records`]); a segment is
//! keyed by the commit that wrote it, so "after sequence S" is a range read,
//! and only durable segments are served (invariant 2: a record never
//! travels ahead of the add it describes). The puller remembers each record
//! under the id its maker gave it, with the maker's expiry, in its own next
//! commit, and learns the maker's id key so that a lookup finds it
//! ([`super::IdHasher`]). Records it already holds change nothing, so
//! records may come back and forth, by any path, any number of times.
//!
//! The window: a retry that reaches another node before the first owner's
//! record did (the owner died before a peer pulled its commit) is applied
//! again. Anti-entropy runs every interval, so the window is about one sync
//! interval after the first add's commit.
//!
//! Only peers of the same region are asked: a client retries through its
//! own region. The records watermark is kept in memory; after a restart the
//! records are pulled once more and change nothing.

use crate::crdt::ReplicaId;

use super::types::{DurableState, IdempotencyRecord, StorageError};
use super::Replica;

/// The wire size of one record, for the chunk's byte budget.
pub const RECORD_BYTES: usize = 44;
/// The most records one chunk may carry.
pub const MAX_CHUNK_RECORDS: usize = 65_536;
/// Segments read from the store at a time.
const SEGMENTS_PER_READ: usize = 64;

/// The idempotency records of a pull's answer.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct RecordsChunk {
    /// Records of the segments after the request's sequence, in segment order.
    pub records: Vec<IdempotencyRecord>,
    /// The sequence to ask after next time.
    pub next: u64,
    /// True when `next` reaches the source's durable sequence.
    pub complete: bool,
}

impl Replica {
    /// The idempotency records of durable segments after commit `after`,
    /// about `max_bytes` of them (at least one segment's worth when any is
    /// left, however large: a segment is never split across chunks).
    pub fn handle_pull_records(
        &self,
        store: &(impl DurableState + ?Sized),
        after: u64,
        max_bytes: usize,
    ) -> Result<RecordsChunk, StorageError> {
        let durable = self.durable_seq;
        let mut chunk = RecordsChunk {
            next: after,
            ..Default::default()
        };
        loop {
            if chunk.next >= durable {
                chunk.complete = true;
                chunk.next = chunk.next.max(durable);
                return Ok(chunk);
            }
            let segments = store.idempotency_segments_after(chunk.next, SEGMENTS_PER_READ)?;
            if segments.is_empty() {
                chunk.complete = true;
                chunk.next = durable;
                return Ok(chunk);
            }
            for (segment, records) in segments {
                if segment > durable {
                    chunk.complete = true;
                    chunk.next = durable;
                    return Ok(chunk);
                }
                let full = chunk.records.len() + records.len() > MAX_CHUNK_RECORDS;
                if full && !chunk.records.is_empty() {
                    return Ok(chunk);
                }
                chunk.records.extend(records);
                chunk.next = segment;
                if chunk.records.len() * RECORD_BYTES >= max_bytes {
                    return Ok(chunk);
                }
            }
        }
    }

    /// The id keys a chunk with records carries: this node's own and every
    /// one it learned, so that a puller can look up every record it gets.
    pub fn id_keys(&self) -> Vec<u128> {
        let hasher = self.idempotency.hasher();
        std::iter::once(hasher.own_key())
            .chain(hasher.other_keys().iter().copied())
            .collect()
    }

    /// Remembers the records pulled from `peer` (those not known yet, and
    /// not expired) and the id keys they were made under, all written by
    /// the next commit; moves the peer's records watermark to `next`.
    /// Returns how many records were new here.
    pub fn handle_pull_records_chunk(
        &mut self,
        now_ms: u64,
        peer: ReplicaId,
        records: &[IdempotencyRecord],
        id_keys: &[u128],
        next: u64,
    ) -> usize {
        let learned = self.learn_records(now_ms, records, id_keys, self.last_seq + 1);
        self.peers.advance_records_watermark(peer, next);
        learned
    }

    /// Remembers records made elsewhere in the region (those not known yet,
    /// and not expired) and the keys they were made under, to be written by
    /// the commit `seq` (the next one). Returns how many were new here.
    pub(super) fn learn_records(
        &mut self,
        now_ms: u64,
        records: &[IdempotencyRecord],
        id_keys: &[u128],
        seq: u64,
    ) -> usize {
        for key in id_keys {
            if self.idempotency.learn_key(*key) {
                self.id_keys_put.push(*key);
            }
        }
        let mut learned = 0;
        for record in records {
            if let Some(record) = self.idempotency.insert_made_elsewhere(record, seq, now_ms) {
                self.idempotency_put.push(record);
                learned += 1;
                let forgotten = self.idempotency.expire(0, super::EVICT_PER_ADD);
                self.idempotency_delete.extend(forgotten);
            }
        }
        learned
    }
}

#[cfg(test)]
#[path = "idempotency_sync_tests.rs"]
mod tests;
