//! Idempotency records travel within a region (issue 11, item 6): a retry
//! that fails over from a key's first owner to another node of the region
//! is recognised there once the first owner's record has reached it.
//!
//! Invariant 5 of DESIGN.md across failover. A pull from a peer of the same
//! region also asks for the peer's idempotency segments from a position in
//! them ([`RecordsCursor`], [`RecordsRead`]); a segment is keyed by the
//! commit that wrote it, so "from sequence S" is a range read, a segment
//! larger than a chunk (a commit that gathered many keyed adds, as after a
//! stall) is sent in parts, and only durable segments are served (invariant
//! 2: a record never travels ahead of the add it describes). Durable
//! segments never change, so the node reads them without holding the
//! core's lock: the core only says up to where ([`Replica::records_read`]).
//! The puller remembers each record under the id its maker gave it, with
//! the maker's expiry, in its own next commit, and learns the maker's id
//! key so that a lookup finds it ([`super::IdHasher`]). Records it already
//! holds change nothing, so records may come back and forth, by any path,
//! any number of times; a pull leaves out the records learned from the
//! puller itself, which holds them (`record_sources.rs`).
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
use crate::partition::PartitionSet;

use super::protocol::{PullChunk, PullRequest};
use super::record_sources::Run;
use super::types::{DurableState, IdempotencyRecord, StorageError};
use super::Replica;

/// The wire size of one record, for the chunk's byte budget: five fixed
/// and varint fields (about 44 bytes with their tags and the message's
/// length) and the partition (3 more up to partition 16,383).
pub const RECORD_BYTES: usize = 47;
/// The most records one chunk (or copy push) may carry: about 700 KB.
pub const MAX_CHUNK_RECORDS: usize = 16_384;

/// A position in a replica's idempotency segments: every segment before
/// commit `seq` was sent, and the first `skip` records of segment `seq`.
/// Ordered by position.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default)]
pub struct RecordsCursor {
    /// The first commit sequence whose segment was not sent whole.
    pub seq: u64,
    /// Records of that segment already sent.
    pub skip: u32,
}

impl RecordsCursor {
    /// Everything up to commit `seq` sent.
    pub fn after_seq(seq: u64) -> Self {
        RecordsCursor {
            seq: seq.saturating_add(1),
            skip: 0,
        }
    }
}

/// The most segments read (and decoded whole) from the store at a time. A
/// read starts with one and doubles while the segments leave budget: a
/// chunk's budget is a few hundred records, and a node that learned a
/// peer's records holds them in segments of thousands, so reading 64 at once
/// decoded up to 64 large segments for every chunk (the join profile on the
/// book's Benchmarks page, `docs/src/benchmarks/index.md`).
const SEGMENTS_PER_READ: usize = 64;

/// The most records one chunk looks at, sent or passed over: a scoped pull
/// passes over the records of other partitions, and a chunk must not read
/// a whole long history to find the few it sends.
const MAX_SCANNED_PER_CHUNK: usize = 8 * MAX_CHUNK_RECORDS;

/// The records part of a pull's answer, as the core bounds it under its
/// lock; [`RecordsRead::serve`] reads the segments, which needs no lock.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RecordsRead {
    /// Where the caller asked to start.
    from: RecordsCursor,
    /// Just past the source's durable sequence: nothing from there is sent.
    done: RecordsCursor,
    /// The most records to send.
    budget: usize,
    /// The id keys the records were made under (the source's own and those
    /// it learned).
    id_keys: Vec<u128>,
    /// Positions of segments learned from the caller, left out
    /// (`record_sources.rs`), by segment.
    left_out: Vec<(u64, Run)>,
    /// The partitions the caller asked for (`None`: every one). A record of
    /// another partition is passed over; one whose partition is unknown
    /// (an older format, a like set's) is sent.
    scope: Option<PartitionSet>,
}

impl RecordsRead {
    /// Reads the durable segments from the caller's position into `chunk`:
    /// about the budget of records (at least one, at most
    /// [`MAX_CHUNK_RECORDS`]), the position after them, and the id keys
    /// when any record is sent.
    pub fn serve(
        self,
        store: &(impl DurableState + ?Sized),
        chunk: &mut PullChunk,
    ) -> Result<(), StorageError> {
        let (records, next, complete) = self.read(store)?;
        if !records.is_empty() {
            chunk.id_keys = self.id_keys;
        }
        chunk.records = records;
        chunk.records_next = Some(next);
        chunk.records_complete = complete;
        Ok(())
    }

    /// Whether the record at `position` of `segment` is left out: learned
    /// from the caller, or of a partition the caller did not ask for.
    fn is_left_out(&self, segment: u64, position: usize, record: &IdempotencyRecord) -> bool {
        let out_of_scope = match (&self.scope, record.partition) {
            (Some(scope), Some(partition)) => !scope.contains(partition),
            _ => false,
        };
        out_of_scope
            || self.left_out.iter().any(|(seq, run)| {
                *seq == segment && (run.start as usize..run.end as usize).contains(&position)
            })
    }

    /// The records from `from`, the position after them, and whether that
    /// reaches `done` (the runs learned from the caller left out).
    fn read(
        &self,
        store: &(impl DurableState + ?Sized),
    ) -> Result<(Vec<IdempotencyRecord>, RecordsCursor, bool), StorageError> {
        let done = self.done;
        let mut records_out = Vec::new();
        let mut next = self.from;
        let mut per_read = 1;
        let mut scanned = 0;
        loop {
            if next >= done {
                return Ok((records_out, next.max(done), true));
            }
            let after = next.seq.saturating_sub(1);
            let segments = store.idempotency_segments_after(after, per_read)?;
            per_read = (per_read * 2).min(SEGMENTS_PER_READ);
            if segments.is_empty() {
                return Ok((records_out, done, true));
            }
            for (segment, records) in segments {
                if segment >= done.seq {
                    return Ok((records_out, done, true));
                }
                let skip = match segment == next.seq {
                    true => (next.skip as usize).min(records.len()),
                    false => 0,
                };
                for (position, record) in records.iter().enumerate().skip(skip) {
                    if scanned == MAX_SCANNED_PER_CHUNK {
                        let next = RecordsCursor {
                            seq: segment,
                            skip: position as u32,
                        };
                        return Ok((records_out, next, false));
                    }
                    scanned += 1;
                    if self.is_left_out(segment, position, record) {
                        continue;
                    }
                    if records_out.len() == self.budget {
                        let next = RecordsCursor {
                            seq: segment,
                            skip: position as u32,
                        };
                        return Ok((records_out, next, false));
                    }
                    records_out.push(record.clone());
                }
                next = RecordsCursor::after_seq(segment);
                if records_out.len() >= self.budget {
                    return Ok((records_out, next, false));
                }
            }
        }
    }
}

impl Replica {
    /// The records part of the answer to `request`, bounded by this node's
    /// durable sequence and by a quarter of the request's byte budget;
    /// `None` when the request does not ask for records or its caller is not
    /// of this node's region.
    pub fn records_read(&self, request: &PullRequest) -> Option<RecordsRead> {
        let from = request.records_from?;
        if !self.in_own_region(request.caller) {
            return None;
        }
        Some(RecordsRead {
            from,
            done: RecordsCursor::after_seq(self.durable_seq),
            budget: (request.max_bytes / 4 / RECORD_BYTES).clamp(1, MAX_CHUNK_RECORDS),
            id_keys: self.id_keys(),
            left_out: self.record_sources.learned_from(
                request.caller,
                from.seq,
                self.durable_seq.saturating_add(1),
            ),
            scope: request.scope.clone(),
        })
    }

    /// Whether `replica` is a node of this node's region, as membership or
    /// the directory knows it.
    fn in_own_region(&self, replica: ReplicaId) -> bool {
        let region = match self.peers().member(replica) {
            Some(member) => Some(member.region.as_str()),
            None => self.directory.get(&replica).map(String::as_str),
        };
        region == Some(self.identity.region.as_str())
    }

    /// The id keys a chunk with records carries: this node's own and every
    /// one it learned, so that a puller can look up every record it gets.
    pub fn id_keys(&self) -> Vec<u128> {
        self.idempotency.hasher().keys().collect()
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
        next: RecordsCursor,
    ) -> usize {
        let learned = self.learn_records(now_ms, peer, records, id_keys, self.last_seq + 1);
        self.peers.advance_records_watermark(peer, next);
        learned
    }

    /// Remembers records made elsewhere in the region, sent by `source`
    /// (those not known yet, and not expired), and the keys they were made
    /// under, to be written by the commit `seq` (the next one). Returns how
    /// many were new here.
    pub(super) fn learn_records(
        &mut self,
        now_ms: u64,
        source: ReplicaId,
        records: &[IdempotencyRecord],
        id_keys: &[u128],
        seq: u64,
    ) -> usize {
        for key in id_keys {
            if self.idempotency.learn_key(*key) {
                self.id_keys_put.push(*key);
            }
        }
        let start = self.idempotency_put.len();
        let mut learned = 0;
        for record in records {
            if let Some(record) = self.idempotency.insert_made_elsewhere(record, seq, now_ms) {
                self.idempotency_put.push(record);
                learned += 1;
                let forgotten = self.idempotency.expire(0, super::EVICT_PER_ADD);
                self.idempotency_delete.extend(forgotten);
            }
        }
        self.record_sources.note_learned(source, start, learned);
        learned
    }
}

#[cfg(test)]
#[path = "idempotency_sync_tests.rs"]
mod tests;
