//! The pure replica state machine: local adds, group commits, reads, and the
//! anti-entropy protocol. No tokio, sled, tonic or prost: the node's runtime
//! and the simulator drive this very code, passing time in as `now_ms`.
//!
//! The core keeps every counter it has touched recently in memory (`live`
//! state) together with its last committed (`durable`) state. Storage is read
//! through [`DurableState`] and written only through [`CommitBatch`]es that the
//! core hands out with [`Replica::poll_commit`]; the runtime writes and flushes
//! a batch and reports back with [`Replica::handle_commit_done`]. Invariants
//! kept here (DESIGN.md): the replica raises only its own slot (1); it offers
//! peers durable state only, never `live` state (2, see `protocol.rs`); it
//! recovers its identity and state from disk (3); an add's ticket says which
//! commit makes it durable, so the runtime acknowledges it only then (4);
//! keyed retries apply once (5); no arithmetic wraps (6).

pub mod convergence;
mod copies;
mod copies_taken;
mod directory;
pub mod fold_partitions;
mod fold_waits;
pub mod folds;
mod idempotency;
mod idempotency_sync;
mod identity;
mod lru;
mod protocol;
mod purge;
mod purge_sets;
mod record_sources;
mod retire;
mod scope;
mod sets;
mod sets_sync;
mod sync;
mod types;
pub mod version;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::crdt::{AddError, FoldedBase, PnCounter, ReplicaId, SetsDigest, StateDigest};
use crate::partition::Partition;
use directory::Directory;
use folds::Folds;

pub use copies::{CopyPush, MAX_PUSH_COUNTERS};
pub use copies_taken::{CopyAccepted, CopyRefused};
pub use idempotency::{legacy_idempotency_id, request_fingerprint, IdHasher, IdempotencyTable};
pub use idempotency_sync::{RecordsCursor, RecordsRead, MAX_CHUNK_RECORDS, RECORD_BYTES};
pub use identity::{check_name, establish, IdentityError, MAX_NAME_BYTES};
pub use protocol::{
    ChunkRefused, MergeReport, PullChunk, PullRefused, PullRequest, SyncMessage, MAX_CHUNK_COUNTERS,
};
pub use purge::PurgeStep;
pub use purge_sets::{SetDeletion, MEMBERS_PER_DELETION};
pub use sets::{
    LikeAccepted, LikeRefused, LikeRequest, LikeWrite, ObserveAccepted, SetDelta, SetKind,
    UniqueWrite, MAX_KEYS_PER_CALL, MAX_MEMBERS_PER_CALL,
};
pub use sets_sync::{DeltaChunk, DeltaCursor, MAX_CHUNK_ELEMENTS};
pub use sync::{Member, PeerBook, PeerState, PullPlan, MAX_BACKOFF_MS};
pub use types::{
    check_key, parse_key, Change, CommitBatch, Cursor, DurableState, IdempotencyRecord, Identity,
    Key, KeyError, RecordVisitor, Recovered, StorageError, StoredCounter,
    MAX_IDEMPOTENCY_KEY_BYTES, MAX_KEY_BYTES,
};

/// Settings of the core.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The cluster's id; pulls from another cluster are refused.
    pub cluster_id: String,
    /// Counters kept in memory; clean ones beyond this are evicted.
    pub cache_capacity: usize,
    /// How long an idempotency key is remembered.
    pub idempotency_ttl_ms: u64,
    /// How many idempotency keys are remembered at most.
    pub idempotency_capacity: usize,
    /// The anti-entropy round interval.
    pub sync_interval_ms: u64,
    /// A bug planted on purpose, for the simulator's checker tests.
    #[cfg(feature = "planted-bugs")]
    pub planted_bug: Option<PlantedBug>,
}

/// Bugs that a test build can plant in the core, to show that the simulator's
/// checker catches them. Compiled only with the `planted-bugs` feature.
#[cfg(feature = "planted-bugs")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PlantedBug {
    /// Pulls are served the live (possibly not durable) state of cached counters.
    ServeLiveState,
    /// The replica id comes from the region name, so a wiped node takes its old id back.
    ReuseReplicaIdAfterWipe,
    /// A merge adds the incoming slots to ours instead of taking the max.
    MergeByAddition,
    /// A keyed add skips the idempotency lookup, so a retry applies again.
    ApplyRetryTwice,
    /// An increment raises `n` and a decrement raises `p`.
    SwapPAndN,
    /// A like set's merge takes the incoming (last writer's) length of a
    /// member instead of the max.
    LastWriterLength,
    /// A copy answers a push before the commit that makes it durable there.
    AckBeforeCopyDurable,
    /// A merge takes a folded writer's slot from a state of a lower fold
    /// epoch again, though the base already counts it (a double count).
    MergeKeepsFoldedSlot,
    /// The fold agreement counts only the members failure detection says
    /// are up, so a fold is taken before a down or cut-off member reported
    /// the writer's final state (a loss).
    FoldBeforeAgreement,
    /// The purge trims a counter of a partition no longer kept to this
    /// node's own slot at fold epoch 0, so a slot written after a fold of
    /// its slots there reads as the folded phase (the defect of issue 42).
    TrimToEpochZero,
    /// A node raises the fold epoch of a partition it was held back from
    /// though it copied the partition from nobody (its holders out of
    /// reach), so its counters there enter the epoch with a base of 0.
    RaiseCopiedFromNobody,
    /// A replicated add's push carries no folded base, even for a slot
    /// written after a fold of the writer's slots in its partition: a copy
    /// takes it for the folded phase, drops it and answers `OK` (the first
    /// defect of issue 42).
    PushWithoutPhase,
    /// A copy takes a push of a partition it does not hold (and drops it
    /// at its next purge), and the pusher tops a key short of holders up
    /// with any live node of the region: a replicated add acknowledged on
    /// such a copy is on one disk once the copy is purged.
    CopyToAnyNode,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            cluster_id: "tally".to_string(),
            cache_capacity: 100_000,
            idempotency_ttl_ms: 24 * 60 * 60 * 1000,
            idempotency_capacity: 1_000_000,
            sync_interval_ms: 200,
            #[cfg(feature = "planted-bugs")]
            planted_bug: None,
        }
    }
}

/// An add as the core takes it; the key is already validated.
#[derive(Clone, Copy, Debug)]
pub struct AddRequest<'a> {
    /// The counter.
    pub key: &'a str,
    /// The non-zero delta.
    pub delta: i64,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<&'a str>,
}

/// An add that was applied (or recognised as a retry).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AddAccepted {
    /// The counter's value right after the add (for a retry: what the first try answered).
    pub value: i64,
    /// True when this was a retry of an add already applied.
    pub duplicate: bool,
    /// The add is durable once the durable sequence reaches this.
    pub durable_at_seq: u64,
}

/// Why an add was refused. Nothing changed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum AddRefused {
    /// Zero delta, slot or value overflow.
    #[error(transparent)]
    Counter(#[from] AddError),
    /// The idempotency key was used before for a different key or delta.
    #[error("idempotency key {0:?} was already used for a different counter or delta; use a new key for a new add")]
    IdempotencyKeyReused(String),
    /// The idempotency key was longer than allowed.
    #[error(
        "the idempotency key is {0} bytes long; the limit is {MAX_IDEMPOTENCY_KEY_BYTES} bytes"
    )]
    IdempotencyKeyTooLong(usize),
    /// The counter could not be read from disk.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// This replica was retired: it never writes again.
    #[error("this node's replica id {0} was retired by the cluster and is fenced: it takes no adds; stop it, wipe its data directory and start it again to join with a new id")]
    Fenced(ReplicaId),
    /// Restarted on its old directory, this replica has not yet heard from a
    /// peer whether its id was retired: adds wait (`Replica::hold_adds_until`).
    #[error("this node restarted on its old data directory and holds adds until a peer tells it whether its replica id {replica} was retired (at most {remaining_ms} ms more); retry, or send the add to another node")]
    HeldAfterRestart {
        /// This replica's id.
        replica: ReplicaId,
        /// How long the hold lasts at most.
        remaining_ms: u64,
    },
    /// The key's partition (of a counter, a like set or a uniques key) is
    /// not served here (being copied in, or handed away): see `scope.rs`.
    #[error("this node does not serve partition {partition} of key {key:?} (it is being copied in, or it is held by other nodes of the region); send the request to a node that holds it (tally status lists what each node holds), or to any node over gRPC, which forwards it")]
    NotServed {
        /// The counter.
        key: String,
        /// Its partition.
        partition: u32,
    },
    /// This node's slots in the key's partition wait for a fold (the
    /// partition moved away from it, and is coming back or came back
    /// before the fold): see `folds::WriteGate`.
    #[error("{0}")]
    WriteGated(#[from] folds::WriteGate),
}

/// The region name under which [`Replica::breakdown`] lists a counter's folded base.
pub const FOLDED_REGION: &str = "(folded)";

/// One region's part of a counter.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RegionPart {
    /// The region.
    pub region: String,
    /// Sum of its replicas' increments (saturating: exact parts are per slot).
    pub increments: u64,
    /// Sum of its replicas' decrements (saturating).
    pub decrements: u64,
    /// Its net contribution, exact.
    pub net: i128,
    /// True for this replica's own region.
    pub local: bool,
    /// When this replica last completed a pull from a node of that region.
    pub last_sync_ms: Option<u64>,
}

/// One live writer's slot in a counter, with the writer's region, as
/// `tally get --slots` shows it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WriterSlot {
    /// The writing replica.
    pub replica: ReplicaId,
    /// Its region, or `"unknown"` when this replica has not learned it.
    pub region: String,
    /// Its increments and decrements.
    pub slot: crate::crdt::Slot,
}

#[derive(Debug)]
struct Entry {
    live: PnCounter,
    /// The last committed state; `None` when the counter was never committed.
    durable: Option<PnCounter>,
    /// The commit that wrote `durable` (0 when never committed).
    durable_seq: u64,
    /// Changed since it was last put in a batch.
    dirty: bool,
    /// In the batch being committed.
    committing: bool,
    /// Its own slot waits for a push to the copies (replicated durability).
    copy_pending: bool,
    /// In the push to the copies in flight.
    copy_in_flight: bool,
    last_used_ms: u64,
}

impl Entry {
    fn from_store(stored: Option<StoredCounter>, now_ms: u64) -> Self {
        let (durable, durable_seq) = match stored {
            Some(stored) => (Some(stored.state), stored.seq),
            None => (None, 0),
        };
        Entry {
            live: durable.clone().unwrap_or_default(),
            durable,
            durable_seq,
            dirty: false,
            committing: false,
            copy_pending: false,
            copy_in_flight: false,
            last_used_ms: now_ms,
        }
    }
}

/// An idempotency lookup's answer ([`Replica::check_idempotency`]).
enum Keyed {
    /// Not seen before: the id and fingerprint to remember, if keyed.
    Fresh(Option<(u128, u64)>),
    /// A retry of a request already applied.
    Retry(IdempotencyRecord),
}

/// The replica core. See the module documentation.
#[derive(Debug)]
pub struct Replica {
    identity: Identity,
    config: ReplicaConfig,
    counters: HashMap<Key, Entry>,
    dirty: Vec<Key>,
    in_flight: Option<Arc<CommitBatch>>,
    /// The last commit sequence handed out.
    last_seq: u64,
    durable_seq: u64,
    /// Digest of the durable state.
    digest: StateDigest,
    /// Digest of the durable like sets and uniques.
    sets_digest: SetsDigest,
    directory: Directory,
    superseded_pending: Vec<Change>,
    idempotency: IdempotencyTable,
    idempotency_put: Vec<IdempotencyRecord>,
    idempotency_delete: Vec<u64>,
    /// Id keys of other nodes learned with their records, for the next
    /// commit to write (`idempotency_sync.rs`).
    id_keys_put: Vec<u128>,
    /// A tick passed since the last commit: housekeeping may commit alone.
    housekeeping_due: bool,
    peers: PeerBook,
    /// Retired writers, fold records and per-writer digests (`folds.rs`).
    folds: Folds,
    /// The store-wide fold pass in progress (`retire.rs`).
    fold_sweep: retire::FoldSweep,
    /// Until when (ms) adds wait after a restart for a peer to say whether
    /// this replica was retired (`retire.rs`); `None`: no hold.
    restart_hold_until_ms: Option<u64>,
    /// Folded writers whose directory entry and watermarks the next commit
    /// deletes (`retire.rs`, pruning).
    pruned_pending: Vec<ReplicaId>,
    /// Like sets and uniques (`sets.rs`).
    sets: sets::Sets,
    /// What waits for a push to the copies (replicated durability).
    copies: copies::CopyBook,
    /// The partitions served, and each one's latest change (`scope.rs`).
    scope: scope::Scope,
    /// Which learned records of each segment came from which peer
    /// (`record_sources.rs`).
    record_sources: record_sources::RecordSources,
    /// Counters of partitions no longer kept, being dropped (`purge.rs`).
    purge: purge::Purge,
    set_purge: purge_sets::SetPurge,
}

/// The most expired idempotency records one tick forgets (bounded work under the lock).
const EXPIRE_PER_TICK: usize = 10_000;
/// The most records one keyed add evicts past the capacity (amortised, never in bulk).
const EVICT_PER_ADD: usize = 2;

impl Replica {
    /// Starts the core on what was recovered from disk.
    pub fn open(
        identity: Identity,
        config: ReplicaConfig,
        recovered: Recovered,
        now_ms: u64,
    ) -> Self {
        #[cfg(feature = "planted-bugs")]
        let identity = match config.planted_bug {
            Some(PlantedBug::ReuseReplicaIdAfterWipe) => Identity {
                replica: ReplicaId(crate::crdt::stable_hash(1, &[identity.region.as_bytes()])),
                ..identity
            },
            _ => identity,
        };
        let mut directory = Directory::recovered(recovered.directory);
        if !directory.contains(&identity.replica) {
            directory.learn(identity.replica, identity.region.clone());
        }
        let mut ids = IdHasher::new(
            recovered.idempotency_hash_key,
            recovered.legacy_idempotency_until_ms,
        );
        for key in &recovered.id_keys {
            ids.learn(*key);
        }
        let idempotency = IdempotencyTable::recovered(
            config.idempotency_ttl_ms,
            config.idempotency_capacity,
            ids,
            recovered.idempotency,
            now_ms,
        );
        let mut folds = Folds::recovered(
            recovered.retired,
            recovered.fold_records,
            recovered.writer_digests,
            recovered.fold_applied,
        );
        folds.set_recovered_partitions(recovered.fold_applied_partitions);
        folds.recover_node_names(recovered.node_names);
        folds.recover_dead_since(recovered.dead_since);
        folds.recover_scoped(recovered.scoped_retired);
        folds.recover_released(recovered.released);
        Replica {
            identity,
            counters: HashMap::new(),
            dirty: Vec::new(),
            in_flight: None,
            last_seq: recovered.durable_seq,
            durable_seq: recovered.durable_seq,
            digest: recovered.digest,
            sets_digest: recovered.sets_digest,
            directory,
            superseded_pending: Vec::new(),
            idempotency,
            idempotency_put: Vec::new(),
            // Segments that expired while the node was down: deleted with the
            // first commit (a tick's housekeeping, if nothing else comes).
            idempotency_delete: recovered.expired_segments,
            id_keys_put: Vec::new(),
            housekeeping_due: false,
            folds,
            fold_sweep: retire::FoldSweep::recovered(recovered.fold_swept),
            restart_hold_until_ms: None,
            pruned_pending: Vec::new(),
            peers: PeerBook::new(recovered.watermarks)
                .with_delta_watermarks(recovered.delta_watermarks),
            sets: sets::Sets::recovered(recovered.sets_digest),
            copies: copies::CopyBook::starting_at(recovered.durable_seq),
            scope: scope::Scope::default(),
            record_sources: record_sources::RecordSources::default(),
            purge: purge::Purge::default(),
            set_purge: purge_sets::SetPurge::default(),
            config,
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The core's settings.
    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    /// The last durable commit.
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// The digest of the durable state.
    pub fn digest(&self) -> StateDigest {
        self.digest
    }

    /// The digest of the durable like sets and uniques (apart from
    /// [`Self::digest`], which older builds publish alone).
    pub fn sets_digest(&self) -> SetsDigest {
        self.sets_digest
    }

    /// Idempotency records held (at most the configured capacity; past it
    /// the oldest are forgotten before their time).
    pub fn idempotency_records(&self) -> usize {
        self.idempotency.len()
    }

    /// Counters changed since they were last put in a commit.
    pub fn dirty_counters(&self) -> usize {
        self.dirty.len()
    }

    /// Counters held in memory.
    pub fn cached_counters(&self) -> usize {
        self.counters.len()
    }

    /// The peers and their sync state.
    pub fn peers(&self) -> &PeerBook {
        &self.peers
    }

    /// The peers, to feed membership and pull results in.
    pub fn peers_mut(&mut self) -> &mut PeerBook {
        &mut self.peers
    }

    /// The region of a replica, if known.
    pub fn region_of(&self, replica: ReplicaId) -> Option<&str> {
        self.directory.get(&replica).map(String::as_str)
    }

    /// True when the counter is in memory (a read of it needs no store read).
    pub fn is_cached(&self, key: &str) -> bool {
        self.counters.contains_key(key)
    }

    fn entry(
        &mut self,
        store: &(impl DurableState + ?Sized),
        key: &str,
        now_ms: u64,
    ) -> Result<&mut Entry, StorageError> {
        if !self.counters.contains_key(key) {
            let stored = store.load_counter(key)?;
            self.counters
                .insert(Key::from(key), Entry::from_store(stored, now_ms));
        }
        let entry = self.counters.get_mut(key).expect("inserted above");
        entry.last_used_ms = now_ms;
        // Folds this node applied since the counter was written reach it as
        // it is used (and the fold sweep reaches the rest). A counter nobody
        // wrote only takes the epoch: nothing to write (a read must not).
        let written = !entry.live.is_empty();
        if entry.live.apply_folds(
            self.folds.book(),
            self.folds.applied_for(key),
            self.folds.partition_of(key),
        ) && written
        {
            self.mark_dirty(key);
        }
        Ok(self.counters.get_mut(key).expect("inserted above"))
    }

    fn mark_dirty(&mut self, key: &str) {
        let Some(entry) = self.counters.get_mut(key) else {
            return;
        };
        if entry.dirty {
            return;
        }
        entry.dirty = true;
        let shared = self
            .counters
            .get_key_value(key)
            .expect("present above")
            .0
            .clone();
        self.dirty.push(shared);
    }

    /// Applies a local add to this replica's own slot.
    pub fn handle_add(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        request: AddRequest<'_>,
    ) -> Result<AddAccepted, AddRefused> {
        let fingerprint = request_fingerprint(request.key, request.delta);
        let keyed = match self.check_idempotency(now_ms, request.idempotency_key, fingerprint)? {
            Keyed::Retry(record) => {
                return Ok(AddAccepted {
                    value: record.value,
                    duplicate: true,
                    durable_at_seq: record.seq,
                })
            }
            Keyed::Fresh(keyed) => keyed,
        };
        #[cfg(feature = "planted-bugs")]
        let request = match self.config.planted_bug {
            Some(PlantedBug::SwapPAndN) => AddRequest {
                delta: request.delta.saturating_neg(),
                ..request
            },
            _ => request,
        };
        let replica = self.identity.replica;
        if self.folds.is_retired(replica) {
            return Err(AddRefused::Fenced(replica));
        }
        self.check_restart_hold(now_ms)?;
        self.check_served(request.key)?;
        self.check_write_gate(request.key)?;
        let entry = self.entry(store, request.key, now_ms)?;
        let value = entry.live.checked_add(replica, request.delta)?;
        self.mark_dirty(request.key);
        let durable_at_seq = self.last_seq + 1;
        let partition = keyed.and_then(|_| self.partition_of(request.key));
        self.remember_idempotent(now_ms, keyed, value, durable_at_seq, partition);
        Ok(AddAccepted {
            value,
            duplicate: false,
            durable_at_seq,
        })
    }

    /// Looks an idempotency key up: a retry of a request already applied
    /// (its record), or a fresh request with the id and fingerprint to
    /// remember once it is applied (none without a key). A key used before
    /// for another request is refused.
    fn check_idempotency(
        &self,
        now_ms: u64,
        idempotency_key: Option<&str>,
        fingerprint: u64,
    ) -> Result<Keyed, AddRefused> {
        let Some(key) = idempotency_key else {
            return Ok(Keyed::Fresh(None));
        };
        if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(AddRefused::IdempotencyKeyTooLong(key.len()));
        }
        let known = self.idempotency.lookup(key, now_ms);
        #[cfg(feature = "planted-bugs")]
        let known = known.filter(|_| self.config.planted_bug != Some(PlantedBug::ApplyRetryTwice));
        match known {
            Some(record) if record.fingerprint != fingerprint => {
                Err(AddRefused::IdempotencyKeyReused(key.to_string()))
            }
            Some(record) => Ok(Keyed::Retry(record)),
            None => Ok(Keyed::Fresh(Some((
                self.idempotency.id_of(key),
                fingerprint,
            )))),
        }
    }

    /// Remembers an applied keyed request (made durable by commit `seq`) to
    /// a key of `partition` (`None`: unknown, on a node without a
    /// partition count).
    fn remember_idempotent(
        &mut self,
        now_ms: u64,
        keyed: Option<(u128, u64)>,
        value: i64,
        seq: u64,
        partition: Option<Partition>,
    ) {
        let Some((id, fingerprint)) = keyed else {
            return;
        };
        let record = self
            .idempotency
            .insert(id, fingerprint, value, seq, partition, now_ms);
        self.idempotency_put.push(record);
        // Past the capacity, forget the oldest records now, a few per add,
        // rather than thousands at once in a tick under the lock.
        let forgotten = self.idempotency.expire(0, EVICT_PER_ADD);
        self.idempotency_delete.extend(forgotten);
    }

    /// The counter's merged state as this replica holds it (its own slot exact,
    /// the others as fresh as the last sync).
    pub fn handle_get(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        key: &str,
    ) -> Result<PnCounter, StorageError> {
        Ok(self.entry(store, key, now_ms)?.live.clone())
    }

    /// The value of a cached counter without touching storage, if cached.
    pub fn cached_state(&self, key: &str) -> Option<&PnCounter> {
        self.counters.get(key).map(|entry| &entry.live)
    }

    /// The per-region breakdown of a counter's state.
    pub fn breakdown(&self, state: &PnCounter) -> Vec<RegionPart> {
        let mut parts: BTreeMap<&str, RegionPart> = BTreeMap::new();
        for (replica, slot) in state.slots() {
            let region = self.region_of(*replica).unwrap_or("unknown");
            let part = parts.entry(region).or_insert_with(|| RegionPart {
                region: region.to_string(),
                increments: 0,
                decrements: 0,
                net: 0,
                local: region == self.identity.region,
                last_sync_ms: self.peers.last_region_sync_ms(region),
            });
            part.increments = part.increments.saturating_add(slot.p);
            part.decrements = part.decrements.saturating_add(slot.n);
            part.net += slot.net();
        }
        let mut parts: Vec<RegionPart> = parts.into_values().collect();
        let base = state.folded();
        if base != FoldedBase::default() {
            // Folded writers' regions are not kept per counter: one part.
            parts.push(RegionPart {
                region: FOLDED_REGION.to_string(),
                increments: u64::try_from(base.p).unwrap_or(u64::MAX),
                decrements: u64::try_from(base.n).unwrap_or(u64::MAX),
                net: base.net(),
                local: false,
                last_sync_ms: None,
            });
        }
        parts
    }

    /// A counter's slots, one per live writer, in replica id order. Folded
    /// writers have none: their sums are in the counter's [`PnCounter::folded`].
    pub fn writer_slots(&self, state: &PnCounter) -> Vec<WriterSlot> {
        state
            .slots()
            .iter()
            .map(|(replica, slot)| WriterSlot {
                replica: *replica,
                region: self.region_of(*replica).unwrap_or("unknown").to_string(),
                slot: *slot,
            })
            .collect()
    }

    /// Hands out the next group commit: every counter changed since the last
    /// one, stamped with a new sequence. `None` while a commit is in flight or
    /// when there is nothing to write.
    pub fn poll_commit(&mut self) -> Option<Arc<CommitBatch>> {
        if self.in_flight.is_some() {
            return None;
        }
        let (watermarks, watermarks_dirty) = self.peers.take_watermarks();
        let (delta_watermarks, delta_watermarks_dirty) = self.peers.take_delta_watermarks();
        let data = !self.dirty.is_empty()
            || self.folds.has_pending()
            || self.sets.has_dirty()
            || delta_watermarks_dirty
            || !self.idempotency_put.is_empty()
            || !self.id_keys_put.is_empty()
            || self.directory.has_pending()
            || !self.pruned_pending.is_empty()
            || self.purge.has_pending()
            || self.set_purge.has_pending()
            || watermarks_dirty;
        let housekeeping =
            !self.idempotency_delete.is_empty() || !self.superseded_pending.is_empty();
        // Deleting superseded log entries and forgotten idempotency segments
        // rides along with the next data commit; on its own it waits for a
        // tick, or every data commit would cost a second flush.
        let housekeeping_alone = housekeeping && self.housekeeping_due;
        if !(data || housekeeping_alone) {
            return None;
        }
        self.housekeeping_due = false;
        let seq = self.last_seq + 1;
        self.last_seq = seq;
        let (retired, fold_records) = self.folds.take_pending();
        let mut digest = self.digest;
        let mut counters = Vec::with_capacity(self.dirty.len());
        let mut writer_digests = folds::DigestChanges::default();
        for key in self.dirty.drain(..) {
            let entry = self
                .counters
                .get_mut(&key)
                .expect("a dirty counter stays cached");
            entry.dirty = false;
            entry.committing = true;
            digest.replace(&key, entry.durable.as_ref(), &entry.live);
            let partition = self.folds.partition_of(&key);
            let book = self.folds.book();
            for change in
                retire::changed_slots(entry.durable.as_ref(), &entry.live, book, partition)
            {
                self.folds.note_change(
                    &mut writer_digests,
                    &key,
                    change.writer,
                    change.old,
                    change.new,
                );
            }
            self.scope.note_change(&key, seq);
            counters.push((key, entry.live.clone()));
        }
        let (deleted, ended) = self.commit_purge(&mut digest, &mut writer_digests);
        let mut superseded = std::mem::take(&mut self.superseded_pending);
        superseded.extend(ended);
        let set_deletions = self.commit_set_purge();
        let (likes, uniques, sets_digest) = self.sets.take_writes();
        for key in likes
            .iter()
            .map(|w| &w.key)
            .chain(uniques.iter().map(|w| &w.key))
        {
            self.scope.note_change(key, seq);
        }
        let batch = CommitBatch {
            likes,
            uniques,
            set_deletions,
            delta_watermarks,
            seq,
            counters,
            deleted,
            superseded,
            idempotency_put: std::mem::take(&mut self.idempotency_put),
            idempotency_delete: std::mem::take(&mut self.idempotency_delete),
            id_keys_put: std::mem::take(&mut self.id_keys_put),
            directory_put: self.directory.take_pending(),
            pruned: std::mem::take(&mut self.pruned_pending),
            watermarks,
            digest,
            sets_digest,
            writer_digests: writer_digests.whole.into_iter().collect(),
            partition_digests: writer_digests
                .by_partition
                .into_iter()
                .map(|((writer, partition, phase), digest)| (writer, partition, phase, digest))
                .collect(),
            retired,
            node_names: self.folds.take_pending_node_names(),
            dead_since: self.folds.take_pending_dead_since(),
            scoped_retired: self.folds.take_pending_scoped(),
            released: self.folds.take_pending_released(),
            fold_records,
            fold_applied: self.folds.applied(),
            fold_applied_partitions: self.folds.take_applied_partitions(),
            fold_swept: self.fold_sweep.swept(),
        };
        self.idempotency
            .assign_segment(seq, batch.idempotency_put.iter().map(|record| record.id));
        self.record_sources.commit(seq);
        for deleted in &batch.idempotency_delete {
            self.record_sources.forget(*deleted);
        }
        let batch = Arc::new(batch);
        self.in_flight = Some(batch.clone());
        Some(batch)
    }

    /// The batch handed out by [`Self::poll_commit`] is durable.
    pub fn handle_commit_done(&mut self, seq: u64) {
        let Some(batch) = self.in_flight.take_if(|batch| batch.seq == seq) else {
            return;
        };
        // The runtime has normally dropped its handle by now; clone only if not.
        let batch = Arc::try_unwrap(batch).unwrap_or_else(|shared| (*shared).clone());
        let keys: Vec<Key> = batch.counters.iter().map(|(key, _)| key.clone()).collect();
        for (key, state) in batch.counters {
            let entry = self
                .counters
                .get_mut(&key)
                .expect("a committing counter stays cached");
            if entry.durable_seq != 0 {
                self.superseded_pending.push(Change {
                    seq: entry.durable_seq,
                    key: key.clone(),
                });
            }
            entry.durable = Some(state);
            entry.durable_seq = seq;
            entry.committing = false;
        }
        self.sets.commit_done(&batch.likes, &batch.uniques);
        self.purge.commit_done();
        self.set_purge.commit_done();
        self.durable_seq = seq;
        self.digest = batch.digest;
        self.sets_digest = batch.sets_digest;
        self.folds.set_digests(&batch.writer_digests);
        self.folds.set_partition_digests(&batch.partition_digests);
        self.note_committed_for_copies(seq, &keys, batch.idempotency_put);
    }

    /// The batch handed out by [`Self::poll_commit`] failed: everything in it
    /// goes into the next one. The failed batch may still reach the disk (a
    /// write that landed before its flush failed, flushed later), so the next
    /// one also supersedes its change-log entries and deletes its idempotency
    /// segment: nothing of the failed sequence is left behind.
    pub fn handle_commit_failed(&mut self, seq: u64) {
        let Some(batch) = self.in_flight.take_if(|batch| batch.seq == seq) else {
            return;
        };
        self.idempotency.unassign_segment(seq);
        self.note_commit_failed_for_copies(seq);
        self.purge.commit_failed();
        self.set_purge.commit_failed();
        let batch = Arc::try_unwrap(batch).unwrap_or_else(|shared| (*shared).clone());
        if !batch.idempotency_put.is_empty() {
            self.idempotency_delete.push(seq);
        }
        for (key, _) in batch.counters {
            self.superseded_pending.push(Change {
                seq,
                key: key.clone(),
            });
            if let Some(entry) = self.counters.get_mut(&key) {
                entry.committing = false;
                if !entry.dirty {
                    entry.dirty = true;
                    self.dirty.push(key);
                }
            }
        }
        self.superseded_pending.extend(batch.superseded);
        self.record_sources
            .commit_failed(seq, self.idempotency_put.len());
        self.idempotency_put.extend(batch.idempotency_put);
        self.idempotency_delete.extend(batch.idempotency_delete);
        self.id_keys_put.extend(batch.id_keys_put);
        self.directory.restore_pending(batch.directory_put);
        self.pruned_pending.extend(batch.pruned);
        self.folds
            .restore_pending(batch.retired, batch.fold_records);
        self.folds.restore_pending_node_names(batch.node_names);
        self.folds.restore_pending_dead_since(batch.dead_since);
        self.folds.restore_pending_scoped(batch.scoped_retired);
        self.folds.restore_pending_released(batch.released);
        if batch.fold_applied_partitions.is_some() {
            self.folds.restore_applied_partitions();
        }
        self.peers.mark_watermarks_dirty();
        self.sets.commit_failed(batch.likes, batch.uniques);
    }

    /// What was handed out or changed but is not durable: counters waiting
    /// for a commit or in the commit in flight, and the last sequence handed
    /// out (everything above [`Self::durable_seq`] up to it is not durable).
    pub fn uncommitted(&self) -> (usize, u64) {
        let in_flight = self
            .in_flight
            .as_ref()
            .map_or(0, |b| b.counters.len() + b.likes.len() + b.uniques.len());
        (self.dirty.len() + in_flight, self.last_seq)
    }

    /// Housekeeping: forgets expired idempotency keys and evicts clean
    /// counters past the cache capacity (least recently used first).
    pub fn tick(&mut self, now_ms: u64) {
        self.housekeeping_due = true;
        let forgotten = self.idempotency.expire(now_ms, EXPIRE_PER_TICK);
        self.idempotency_delete.extend(forgotten);
        let capacity = self.config.cache_capacity.max(1);
        self.sets.evict(capacity);
        if self.counters.len() <= capacity {
            return;
        }
        let target = capacity - capacity / 10;
        let excess = self.counters.len().saturating_sub(target);
        lru::evict(&mut self.counters, excess, |entry| {
            let busy =
                entry.dirty || entry.committing || entry.copy_pending || entry.copy_in_flight;
            (!busy).then_some(entry.last_used_ms)
        });
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
