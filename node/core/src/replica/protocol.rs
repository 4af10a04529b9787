//! The anti-entropy protocol inside the core: serving a pull
//! ([`Replica::handle_pull`]) and merging what a pull brought back
//! ([`Replica::handle_pull_chunk`]).
//!
//! Invariant 2 of DESIGN.md lives here: a pull is answered with durable state
//! only. The change log is read up to the durable sequence, a counter that is
//! cached is served from its `durable` copy (never its `live` one), and a
//! counter that is not cached cannot be in a commit being written, so what the
//! store returns for it is durable. Because the log is stamped per commit and
//! every commit rewrites each counter it holds, the hottest key is shipped in
//! every round, never starved. A refused message merges nothing. A pull from
//! a node that shares no protocol version with this one, or that announces
//! another partition count, is refused.

use crate::crdt::{FoldError, PnCounter, ReplicaId};

use super::idempotency_sync::{RecordsCursor, RecordsRead, MAX_CHUNK_RECORDS};
use super::sets::SetDelta;
use super::sets_sync::{DeltaCursor, MAX_CHUNK_ELEMENTS};
use super::types::{Cursor, DurableState, IdempotencyRecord, Key, StorageError};
use super::version::ProtocolWindow;
use super::Replica;
use crate::partition::PartitionSet;

/// The most counters one chunk may carry.
pub const MAX_CHUNK_COUNTERS: usize = 16_384;
/// The most change-log entries one chunk reads: a scoped pull skips the
/// entries of other partitions, and a chunk that finds none of its own ends
/// here, not at the end of the log.
const MAX_CHUNK_SCANNED: usize = 4 * MAX_CHUNK_COUNTERS;

/// A request for changes after a cursor.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PullRequest {
    /// The caller's cluster.
    pub cluster_id: String,
    /// The caller.
    pub caller: ReplicaId,
    /// The replica the caller means to pull from, if it knows.
    pub expected: Option<ReplicaId>,
    /// Changes strictly after this.
    pub after: Cursor,
    /// Size bound of this chunk, in (estimated) bytes.
    pub max_bytes: usize,
    /// The source's directory digest as the caller last received it with
    /// the whole directory ([`PullChunk::directory_digest`]): while it is the
    /// source's current one, chunks leave `replicas` out.
    pub directory_digest: Option<u64>,
    /// The protocol versions the caller speaks.
    pub protocol: ProtocolWindow,
    /// Serve the delta log (like sets, uniques) after this cursor too; `None`
    /// from a caller without one (a build before protocol version 3).
    pub deltas_after: Option<DeltaCursor>,
    /// Serve the idempotency records from this position too
    /// (`idempotency_sync.rs`); `None` from a caller of another region or
    /// a build without it. Served to callers of this node's region only.
    pub records_from: Option<RecordsCursor>,
    /// Serve only counters and set deltas of these partitions (`scope.rs`;
    /// set deltas of every partition to a caller before protocol version 9,
    /// which keeps every set); `None`: of every partition (a caller that
    /// keeps them all, or a build before partition-scoped storage).
    pub scope: Option<PartitionSet>,
}

/// Part of the answer to a pull.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct PullChunk {
    /// The answering replica.
    pub source: ReplicaId,
    /// Changed counters with their durable state, in change-log order.
    pub counters: Vec<(Key, PnCounter)>,
    /// The source's whole directory (replica → region), which covers every
    /// slot in `counters`; empty when the request's directory digest is the
    /// source's current one (the caller knows all of it already).
    pub replicas: Vec<(ReplicaId, String)>,
    /// The cursor after this chunk: the caller's next watermark.
    pub next: Cursor,
    /// True when `next` reaches the source's durable sequence.
    pub complete: bool,
    /// The digest of `replicas` when they are sent.
    pub directory_digest: Option<u64>,
    /// Delta-log records (like sets, uniques), when the request asked.
    pub deltas: Vec<SetDelta>,
    /// The delta-log cursor after `deltas`, when the request asked.
    pub deltas_next: Option<DeltaCursor>,
    /// True when `deltas_next` reaches the source's durable sequence (or
    /// the request did not ask for the delta log).
    pub deltas_complete: bool,
    /// Idempotency records, when the request asked (and came from this
    /// node's region).
    pub records: Vec<IdempotencyRecord>,
    /// The id keys `records` were made under: the source's own and those it
    /// learned (sent with records only).
    pub id_keys: Vec<u128>,
    /// The position to ask records from next time, when served.
    pub records_next: Option<RecordsCursor>,
    /// True when `records_next` reaches the source's durable sequence (or
    /// no records were asked for or served).
    pub records_complete: bool,
    /// For a scoped request: the partitions of its scope this chunk served
    /// (those the source serves now). A puller counts a partition as copied
    /// only if every chunk of its pull served it.
    pub served: Option<PartitionSet>,
}

impl PullChunk {
    /// True when the counters, the delta log and the records are caught up.
    pub fn is_last(&self) -> bool {
        self.complete && self.deltas_complete && self.records_complete
    }
}

/// The protocol's messages, as the simulator carries them between replicas.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SyncMessage {
    /// "Send me your changes after this cursor."
    Pull(PullRequest),
    /// A part of the answer.
    Chunk(PullChunk),
    /// The pull was refused.
    Refused(PullRefused),
}

/// Why a pull was refused.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PullRefused {
    /// The caller belongs to another cluster.
    #[error("pull from cluster {theirs:?} refused: this node belongs to cluster {ours:?}")]
    WrongCluster {
        /// Ours.
        ours: String,
        /// The caller's.
        theirs: String,
    },
    /// The caller expected another replica (this one was wiped or replaced).
    #[error("the caller expected replica {expected} but this is replica {actual}")]
    WrongReplica {
        /// Whom the caller expected.
        expected: ReplicaId,
        /// Who answered.
        actual: ReplicaId,
    },
    /// The caller and this node share no protocol version.
    #[error("pull refused: the caller speaks protocol versions {theirs}, this node speaks {ours}; {advice}")]
    IncompatibleProtocol {
        /// Ours.
        ours: ProtocolWindow,
        /// The caller's.
        theirs: ProtocolWindow,
        /// What to do ([`ProtocolWindow::refusal_advice`]).
        advice: String,
    },
    /// The caller announces another partition count than this node's.
    #[error("pull refused: the caller announces {theirs} partitions, this node {ours}; a cluster's partition count is fixed: restart the caller with --partitions {ours} and a new --data-dir")]
    PartitionCount {
        /// Ours.
        ours: u32,
        /// The caller's.
        theirs: u32,
    },
    /// The change log could not be read.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Why a chunk was refused; nothing of it was merged.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ChunkRefused {
    /// The chunk came from another replica than the one pulled from.
    #[error("chunk from replica {actual} while pulling from {expected}")]
    WrongSource {
        /// The replica pulled from.
        expected: ReplicaId,
        /// The chunk's source.
        actual: ReplicaId,
    },
    /// Too many counters in one chunk.
    #[error("chunk of {0} counters refused: the limit is {MAX_CHUNK_COUNTERS}")]
    Oversized(usize),
    /// Too many idempotency records in one chunk.
    #[error("chunk of {0} idempotency records refused: the limit is {MAX_CHUNK_RECORDS}")]
    OversizedRecords(usize),
    /// Too many like-set members and uniques registers in one chunk.
    #[error("chunk of {0} set members and registers refused: the limit is {MAX_CHUNK_ELEMENTS}")]
    OversizedDeltas(usize),
    /// A slot belongs to a replica whose region nobody told us.
    #[error("counter {key:?} has a slot of replica {replica}, whose region is unknown")]
    UnknownReplica {
        /// The counter.
        key: String,
        /// The replica.
        replica: ReplicaId,
    },
    /// The chunk says a replica is in another region than we know it to be.
    #[error("replica {replica} is in region {known:?}, the chunk says {claimed:?}")]
    RegionConflict {
        /// The replica.
        replica: ReplicaId,
        /// What we know.
        known: String,
        /// What the chunk says.
        claimed: String,
    },
    /// The chunk names the same counter twice.
    #[error("counter {0:?} appears twice in one chunk")]
    DuplicateKey(String),
    /// The chunk has a delta of a set this node is deleting (it held it
    /// for a partition it no longer kept) and keeps again: pulled again
    /// once the deletion is durable (`purge_sets.rs`).
    #[error("like set or uniques key {0:?} is being deleted here; the chunk is pulled again once that is done")]
    SetBeingDeleted(String),
    /// A counter could not be loaded to merge into.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A counter is folded at an epoch this node holds no record of yet
    /// (the chunk is pulled again once the record arrives by gossip).
    #[error("counter {key:?}: {error}")]
    Fold {
        /// The counter.
        key: String,
        /// Why.
        error: FoldError,
    },
}

/// What a merged chunk changed.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct MergeReport {
    /// Counters whose state changed, with their new state.
    pub changed: Vec<(Key, PnCounter)>,
    /// Counters received.
    pub received: usize,
    /// Counters in which a peer held more for our own slot than we did (only
    /// after a disk was restored from an old copy; the max repairs it).
    pub own_slot_raised: usize,
    /// Counters left unchanged because the peer's folded base at the same
    /// epoch differs from ours (never expected; each is a bug to report).
    pub fold_conflicts: Vec<(Key, FoldError)>,
    /// Like-set members and uniques registers that the chunk's deltas changed.
    pub set_elements_changed: usize,
    /// Idempotency records of the region that were new here.
    pub records_learned: usize,
    /// Counters of partitions this replica no longer keeps, dropped
    /// unmerged (see [`Replica::set_kept`]).
    pub not_kept: usize,
}

/// The estimated wire size of one counter in a chunk.
fn estimated_bytes(key: &str, state: &PnCounter) -> usize {
    key.len() + 8 + 26 * state.slots().len()
}

impl Replica {
    /// Answers one chunk of a pull with durable state only, all but its
    /// idempotency records: those come from the [`RecordsRead`] returned
    /// with it, which a runtime serves after releasing the core (durable
    /// segments never change).
    pub fn handle_pull_parts(
        &self,
        store: &(impl DurableState + ?Sized),
        request: &PullRequest,
    ) -> Result<(PullChunk, Option<RecordsRead>), PullRefused> {
        if request.cluster_id != self.config.cluster_id {
            return Err(PullRefused::WrongCluster {
                ours: self.config.cluster_id.clone(),
                theirs: request.cluster_id.clone(),
            });
        }
        let ours = self.peers().own_protocol();
        if !ours.talks_with(&request.protocol) {
            return Err(PullRefused::IncompatibleProtocol {
                ours,
                theirs: request.protocol,
                advice: ours.refusal_advice(&request.protocol),
            });
        }
        if let Some(caller) = self
            .peers()
            .member(request.caller)
            .filter(|caller| !self.peers().partitions_agree(caller))
        {
            return Err(PullRefused::PartitionCount {
                ours: self.peers().own_partitions(),
                theirs: caller.partitions,
            });
        }
        if let Some(expected) = request
            .expected
            .filter(|expected| *expected != self.identity.replica)
        {
            return Err(PullRefused::WrongReplica {
                expected,
                actual: self.identity.replica,
            });
        }
        if let Some(scope) = &request.scope {
            self.check_scope(scope)?;
        }
        let served = request.scope.as_ref().map(|scope| self.served_of(scope));
        let mut chunk = PullChunk {
            source: self.identity.replica,
            next: request.after.clone(),
            deltas_complete: true,
            records_complete: true,
            served: served.clone(),
            ..Default::default()
        };
        let in_scope = |key: &str| {
            served
                .as_ref()
                .is_none_or(|served| served.contains(served.count().of_key(key.as_bytes())))
        };
        let bytes = self.pull_counters(store, request, &in_scope, &mut chunk)?;
        if let Some(after) = &request.deltas_after {
            // The delta log gets what the counters left of the budget, and
            // at least a share of it, so that neither starves the other.
            let budget = request
                .max_bytes
                .saturating_sub(bytes)
                .max(request.max_bytes / 4)
                .max(1);
            // Like sets and uniques follow their key's partition.
            let deltas = self.handle_pull_deltas(store, after, budget, &in_scope)?;
            chunk.deltas = deltas.deltas;
            chunk.deltas_next = Some(deltas.next);
            chunk.deltas_complete = deltas.complete;
        }
        Ok((chunk, self.records_read(request)))
    }

    /// Answers one chunk of a pull, its idempotency records included (see
    /// [`Self::handle_pull_parts`]).
    pub fn handle_pull(
        &self,
        store: &(impl DurableState + ?Sized),
        request: &PullRequest,
    ) -> Result<PullChunk, PullRefused> {
        let (mut chunk, records) = self.handle_pull_parts(store, request)?;
        if let Some(records) = records {
            records.serve(store, &mut chunk)?;
        }
        Ok(chunk)
    }

    /// Fills `chunk` with changed counters after the request's cursor, of
    /// the keys `in_scope`; returns their estimated bytes.
    fn pull_counters(
        &self,
        store: &(impl DurableState + ?Sized),
        request: &PullRequest,
        in_scope: &dyn Fn(&str) -> bool,
        chunk: &mut PullChunk,
    ) -> Result<usize, PullRefused> {
        let durable_seq = self.durable_seq;
        if request.after.covers_seq(durable_seq) {
            chunk.complete = true;
            chunk.next = Cursor::after_seq(durable_seq);
            return Ok(0);
        }
        let mut bytes = 0usize;
        let mut scanned = 0usize;
        let mut cursor = request.after.clone();
        'scan: loop {
            let changes = store.changes_after(&cursor, 256)?;
            if changes.is_empty() {
                chunk.complete = true;
                chunk.next = Cursor::after_seq(durable_seq);
                break;
            }
            for change in changes {
                if change.seq > durable_seq {
                    chunk.complete = true;
                    chunk.next = Cursor::after_seq(durable_seq);
                    break 'scan;
                }
                cursor = Cursor {
                    seq: change.seq,
                    key: change.key.to_string(),
                };
                scanned += 1;
                if !in_scope(&change.key) {
                    chunk.next = cursor.clone();
                    if scanned >= MAX_CHUNK_SCANNED {
                        break 'scan;
                    }
                    continue;
                }
                if let Some(state) = self.durable_state_at(store, &change.key, change.seq)? {
                    bytes += estimated_bytes(&change.key, &state);
                    chunk.counters.push((change.key, state));
                }
                chunk.next = cursor.clone();
                if bytes >= request.max_bytes || chunk.counters.len() >= MAX_CHUNK_COUNTERS {
                    break 'scan;
                }
            }
        }
        // Every replica with a slot here is in our directory. A caller that
        // holds the directory as it is now needs none of it: the region list
        // would be most of a hot key's bytes in every round.
        if request.directory_digest != Some(self.directory.digest()) {
            chunk.replicas = self.directory.entries();
            chunk.directory_digest = Some(self.directory.digest());
        }
        Ok(bytes)
    }

    /// The durable state of `key` if the change-log entry at `seq` is its
    /// newest durable one; `None` for an entry that a later commit superseded
    /// (that later entry serves the counter).
    fn durable_state_at(
        &self,
        store: &(impl DurableState + ?Sized),
        key: &str,
        seq: u64,
    ) -> Result<Option<PnCounter>, StorageError> {
        #[cfg(feature = "planted-bugs")]
        if self.config.planted_bug == Some(super::PlantedBug::ServeLiveState) {
            if let Some(entry) = self.counters.get(key) {
                return Ok(Some(entry.live.clone()).filter(|_| entry.durable_seq <= seq));
            }
        }
        if let Some(entry) = self.counters.get(key) {
            return Ok(entry.durable.clone().filter(|_| entry.durable_seq <= seq));
        }
        Ok(store
            .load_counter(key)?
            .filter(|stored| stored.seq <= seq)
            .map(|stored| stored.state))
    }

    /// Merges one chunk pulled from `peer` and moves its watermark. Checks the
    /// whole chunk first: a refused chunk merges nothing.
    pub fn handle_pull_chunk(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        peer: ReplicaId,
        chunk: PullChunk,
    ) -> Result<MergeReport, ChunkRefused> {
        if chunk.source != peer {
            return Err(ChunkRefused::WrongSource {
                expected: peer,
                actual: chunk.source,
            });
        }
        if chunk.counters.len() > MAX_CHUNK_COUNTERS {
            return Err(ChunkRefused::Oversized(chunk.counters.len()));
        }
        let elements: usize = chunk.deltas.iter().map(SetDelta::len).sum();
        if elements > MAX_CHUNK_ELEMENTS {
            return Err(ChunkRefused::OversizedDeltas(elements));
        }
        if chunk.records.len() > MAX_CHUNK_RECORDS {
            return Err(ChunkRefused::OversizedRecords(chunk.records.len()));
        }
        self.check_sets_not_deleted(&chunk.deltas)?;
        let book = self.folds.shared_book();
        let mut learned: Vec<(ReplicaId, String)> = Vec::new();
        for (replica, region) in &chunk.replicas {
            match self.directory.get(replica) {
                Some(known) if known != region => {
                    return Err(ChunkRefused::RegionConflict {
                        replica: *replica,
                        known: known.clone(),
                        claimed: region.clone(),
                    })
                }
                Some(_) => {}
                // A folded writer's entry was pruned here; a source that has
                // not pruned it yet does not bring it back.
                None if book.folded_at(*replica).is_some() => {}
                None => learned.push((*replica, region.clone())),
            }
        }
        let mut seen = std::collections::HashSet::with_capacity(chunk.counters.len());
        for (key, state) in &chunk.counters {
            if !seen.insert(key.as_ref()) {
                return Err(ChunkRefused::DuplicateKey(key.to_string()));
            }
            if state.folded().epoch > book.epoch() {
                return Err(ChunkRefused::Fold {
                    key: key.to_string(),
                    error: FoldError::UnknownEpoch {
                        epoch: state.folded().epoch,
                        known: book.epoch(),
                    },
                });
            }
            for (replica, _) in state.slots() {
                // A folded writer's slot is dropped by the merge below.
                if book.folded_at(*replica).is_some() {
                    continue;
                }
                let known =
                    self.directory.contains(replica) || learned.iter().any(|(id, _)| id == replica);
                if !known {
                    return Err(ChunkRefused::UnknownReplica {
                        key: key.to_string(),
                        replica: *replica,
                    });
                }
            }
        }
        for (replica, region) in learned {
            self.directory.learn(replica, region);
        }
        let own = self.identity.replica;
        let mut report = MergeReport {
            received: chunk.counters.len(),
            ..Default::default()
        };
        #[cfg(feature = "planted-bugs")]
        let by_addition = self.config.planted_bug == Some(super::PlantedBug::MergeByAddition);
        #[cfg(feature = "planted-bugs")]
        let keeps_folded = self.config.planted_bug == Some(super::PlantedBug::MergeKeepsFoldedSlot);
        for (key, incoming) in chunk.counters {
            // A partition deleted while the pull was in flight.
            if !self.keeps(&key) {
                report.not_kept += 1;
                continue;
            }
            let partition = self.folds.partition_of(&key);
            let entry = self.entry(store, &key, now_ms)?;
            #[cfg(feature = "planted-bugs")]
            let incoming = match by_addition {
                true => PnCounter::from_slots(incoming.slots().iter().map(|(id, slot)| {
                    let ours = entry.live.slot(*id);
                    let p = ours.p.saturating_add(slot.p);
                    (
                        *id,
                        crate::crdt::Slot {
                            p,
                            n: ours.n.saturating_add(slot.n),
                        },
                    )
                })),
                false => incoming,
            };
            let ours = entry.live.slot(own);
            let theirs = incoming.slot(own);
            if theirs.p > ours.p || theirs.n > ours.n {
                report.own_slot_raised += 1;
            }
            #[cfg(feature = "planted-bugs")]
            let folded_slots: Vec<(ReplicaId, crate::crdt::Slot)> = match keeps_folded {
                true => incoming
                    .slots()
                    .iter()
                    .filter(|(writer, _)| book.folded_at(*writer).is_some())
                    .copied()
                    .collect(),
                false => Vec::new(),
            };
            let merged = entry.live.merge_folded(&incoming, &book, partition);
            #[cfg(feature = "planted-bugs")]
            let merged = merged.map(|changed| {
                let epoch = entry.live.folded().epoch;
                let mut again = false;
                for (writer, slot) in &folded_slots {
                    if book.folded_at(*writer).is_some_and(|at| at <= epoch) {
                        again |= entry.live.merge_slot(*writer, *slot);
                    }
                }
                changed || again
            });
            match merged {
                Ok(true) => {
                    report.changed.push((key.clone(), entry.live.clone()));
                    self.mark_dirty(&key);
                }
                Ok(false) => {}
                Err(error) => report.fold_conflicts.push((key.clone(), error)),
            }
        }
        if let Some(digest) = chunk.directory_digest {
            // Every entry listed was learned above (or known and equal).
            self.peers.note_directory(peer, digest);
        }
        self.peers
            .advance_watermark(peer, chunk.next, report.received > 0);
        if let Some(next) = chunk.records_next {
            report.records_learned =
                self.handle_pull_records_chunk(now_ms, peer, &chunk.records, &chunk.id_keys, next);
        }
        if let Some(next) = chunk.deltas_next {
            report.set_elements_changed =
                self.handle_pull_deltas_chunk(now_ms, store, peer, &chunk.deltas, next)?;
        }
        Ok(report)
    }
}
