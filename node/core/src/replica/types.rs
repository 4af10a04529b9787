//! Values the replica core exchanges with its runtime: keys, change-log
//! cursors, stored records, commit batches and the sync protocol's messages.
//!
//! Keys are validated once, here, when they enter the core: UTF-8, 1 to 256 bytes.

use std::fmt;
use std::sync::Arc;

use crate::crdt::{
    FoldRecord, HyperLogLog, PnCounter, ReplicaId, SetsDigest, StateDigest, WriterDigest,
};
use crate::partition::Partition;

use super::folds::RetireReason;
use super::purge_sets::SetDeletion;
use super::sets::{LikeWrite, SetDelta, SetKind, UniqueWrite};
use super::sets_sync::DeltaCursor;

/// The longest counter key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// The longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;

/// A counter's name, validated. Cheap to clone.
pub type Key = Arc<str>;

/// Why a key was refused.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum KeyError {
    /// The key had no bytes.
    #[error("the counter key is empty; give a key of 1 to {MAX_KEY_BYTES} bytes")]
    Empty,
    /// The key was longer than [`MAX_KEY_BYTES`].
    #[error("the counter key is {0} bytes long; the limit is {MAX_KEY_BYTES} bytes")]
    TooLong(usize),
    /// The key's bytes were not UTF-8.
    #[error("the counter key is not valid UTF-8")]
    NotUtf8,
}

/// Checks a key's bytes and returns it as a [`Key`].
pub fn parse_key(bytes: &[u8]) -> Result<Key, KeyError> {
    Ok(Arc::from(check_key(bytes)?))
}

/// Checks a key's bytes without allocating.
pub fn check_key(bytes: &[u8]) -> Result<&str, KeyError> {
    if bytes.is_empty() {
        return Err(KeyError::Empty);
    }
    if bytes.len() > MAX_KEY_BYTES {
        return Err(KeyError::TooLong(bytes.len()));
    }
    std::str::from_utf8(bytes).map_err(|_| KeyError::NotUtf8)
}

/// A position in a replica's change log. Changes are ordered by `(seq, key)`;
/// a cursor with an empty key stands after every change of `seq` and before.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Default, Hash)]
pub struct Cursor {
    /// The commit sequence.
    pub seq: u64,
    /// The last key of `seq` already covered, or empty for all of `seq`.
    pub key: String,
}

impl Cursor {
    /// The cursor after every change up to and including `seq`.
    pub fn after_seq(seq: u64) -> Self {
        Cursor {
            seq,
            key: String::new(),
        }
    }

    /// True when the cursor covers every change of `seq` and before.
    pub fn covers_seq(&self, seq: u64) -> bool {
        self.seq > seq || (self.seq == seq && self.key.is_empty())
    }

    /// The sequence through which every change is covered.
    pub fn complete_seq(&self) -> u64 {
        if self.key.is_empty() {
            self.seq
        } else {
            self.seq.saturating_sub(1)
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.seq)
        } else {
            write!(f, "{}/{:?}", self.seq, self.key)
        }
    }
}

/// One entry of the change log: counter `key` changed in commit `seq`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Change {
    /// The commit that wrote it.
    pub seq: u64,
    /// The counter.
    pub key: Key,
}

/// A counter as stored: its state and the commit that last wrote it.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct StoredCounter {
    /// The commit that last wrote this counter.
    pub seq: u64,
    /// The counter's durable state.
    pub state: PnCounter,
}

/// A replica incarnation: its id and the region it belongs to, both fixed for life.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Identity {
    /// Random, created with the data directory.
    pub replica: ReplicaId,
    /// The region the replica serves.
    pub region: String,
}

/// A remembered idempotent add.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct IdempotencyRecord {
    /// 128-bit keyed hash of the idempotency key ([`super::IdHasher`]).
    pub id: u128,
    /// Hash of the request (counter key and delta), to spot a key reused for another request.
    pub fingerprint: u64,
    /// The value the first request answered.
    pub value: i64,
    /// The commit that made the first request durable.
    pub seq: u64,
    /// When the record may be forgotten, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// The partition of the counter the add went to, so that a pull scoped
    /// to some partitions carries only their records
    /// (`idempotency_sync.rs`); for a like or an unlike, its like set's.
    /// `None` when unknown: records of older formats and builds (and likes
    /// of builds before protocol version 9, which held every set), and a
    /// node without a partition count.
    pub partition: Option<Partition>,
}

/// Everything one group commit writes, in one atomic batch, then makes durable.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct CommitBatch {
    /// The commit's sequence: every counter in it is stamped with it.
    pub seq: u64,
    /// Counters to write, with their full state.
    pub counters: Vec<(Key, PnCounter)>,
    /// Counters to delete (of partitions this node no longer keeps; their
    /// change-log entries are in `superseded`).
    pub deleted: Vec<Key>,
    /// Change-log entries superseded by an earlier, already durable commit.
    pub superseded: Vec<Change>,
    /// Idempotency records to write, as one segment keyed by `seq`.
    pub idempotency_put: Vec<IdempotencyRecord>,
    /// Idempotency segments (commit sequences) whose records are all forgotten.
    pub idempotency_delete: Vec<u64>,
    /// Id keys of other nodes of the region, learned with their records
    /// (kept forever: a few per region).
    pub id_keys_put: Vec<u128>,
    /// Replica-to-region facts learned since the last commit.
    pub directory_put: Vec<(ReplicaId, String)>,
    /// Pull watermarks per peer replica, all of them.
    pub watermarks: Vec<(ReplicaId, Cursor)>,
    /// Digest of the whole durable state once this batch is durable.
    pub digest: StateDigest,
    /// Digest of the durable like sets and uniques once this batch is durable.
    pub sets_digest: SetsDigest,
    /// Per-writer digests that this batch changes, with their new value
    /// (an empty digest: the writer has no slot left; delete it).
    pub writer_digests: Vec<(ReplicaId, WriterDigest)>,
    /// Per-writer digests by partition that this batch changes (kept in
    /// memory only: a node computes them from its counters when it starts,
    /// `fold_partitions.rs`).
    pub partition_digests: Vec<(ReplicaId, u32, u32, WriterDigest)>,
    /// Writers retired since the last commit (kept forever; their node
    /// names are deleted).
    pub retired: Vec<(ReplicaId, RetireReason)>,
    /// Replicas whose node name was first seen since the last commit (kept
    /// until the replica is retired: after a restart they still tell an old
    /// incarnation's node, `Folds::note_node_names`).
    pub node_names: Vec<(ReplicaId, String)>,
    /// When replicas were first seen down (`Some`: kept until they are seen
    /// up again or retired) or that they were seen up (`None`: deleted), so
    /// a restart does not start `--retire-after` over.
    pub dead_since: Vec<(ReplicaId, Option<u64>)>,
    /// Scoped retirements learned (`true`: kept until folded) or folded
    /// (`false`: deleted) since the last commit (`replica/fold_scoped.rs`).
    pub scoped_retired: Vec<(super::folds::ScopedRetirement, bool)>,
    /// Partitions released holding this node's slots, and since when
    /// (`Some`), or no longer (`None`: deleted; `replica/fold_released.rs`).
    pub released: Vec<(u32, Option<u64>)>,
    /// Fold records committed since the last commit (kept forever).
    pub fold_records: Vec<FoldRecord>,
    /// Fold epochs up to this one are applied to this node's counters
    /// (the lowest of the partitions', when they are tracked).
    pub fold_applied: u64,
    /// When they changed: the partitions whose applied epoch is above
    /// `fold_applied`, with theirs (a partition left out is at it).
    pub fold_applied_partitions: Option<Vec<(u32, u64)>>,
    /// Every stored counter is folded up to this epoch (the sweep's progress).
    pub fold_swept: u64,
    /// Like sets to write: changed members, count, a delta-log record each.
    pub likes: Vec<LikeWrite>,
    /// Uniques to write: registers and a delta-log record each.
    pub uniques: Vec<UniqueWrite>,
    /// Like sets and uniques of partitions no longer kept, deleted (a
    /// bounded part of a large like set each; `purge_sets.rs`).
    pub set_deletions: Vec<SetDeletion>,
    /// Delta-log pull watermarks per peer replica, all of them (when one moved).
    pub delta_watermarks: Vec<(ReplicaId, DeltaCursor)>,
    /// Folded writers whose directory entry and pull watermarks this batch
    /// deletes (issue 13, pruning: their slots are gone from every counter).
    pub pruned: Vec<ReplicaId>,
}

impl CommitBatch {
    /// True when the batch writes nothing a peer or a restart would see.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
            && self.deleted.is_empty()
            && self.superseded.is_empty()
            && self.idempotency_put.is_empty()
            && self.idempotency_delete.is_empty()
            && self.id_keys_put.is_empty()
            && self.directory_put.is_empty()
            && self.pruned.is_empty()
            && self.retired.is_empty()
            && self.node_names.is_empty()
            && self.dead_since.is_empty()
            && self.scoped_retired.is_empty()
            && self.released.is_empty()
            && self.fold_records.is_empty()
            && self.likes.is_empty()
            && self.set_deletions.is_empty()
            && self.uniques.is_empty()
    }
}

/// What a replica recovers from its disk at start.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Recovered {
    /// Every writer's digest over the stored counters (complete: a store
    /// that kept none computes them when it opens).
    pub writer_digests: Vec<(ReplicaId, WriterDigest)>,
    /// False when the stored digests are not those of the last commit (a
    /// build that did not keep them wrote since): the store recomputes them.
    pub writer_digests_current: bool,
    /// The retired writers, and why.
    pub retired: Vec<(ReplicaId, RetireReason)>,
    /// The node names of replicas not retired.
    pub node_names: Vec<(ReplicaId, String)>,
    /// When replicas down at the last commit were first seen down.
    pub dead_since: Vec<(ReplicaId, u64)>,
    /// The scoped retirements not folded at the last commit.
    pub scoped_retired: Vec<super::folds::ScopedRetirement>,
    /// Partitions released holding this node's slots, and since when.
    pub released: Vec<(u32, u64)>,
    /// The committed fold records.
    pub fold_records: Vec<FoldRecord>,
    /// Fold epochs up to this one are applied to this node's counters.
    pub fold_applied: u64,
    /// Partitions applied above `fold_applied`, with their epochs.
    pub fold_applied_partitions: Vec<(u32, u64)>,
    /// Every stored counter is folded up to this epoch.
    pub fold_swept: u64,
    /// The last durable commit.
    pub durable_seq: u64,
    /// The digest of the durable state.
    pub digest: StateDigest,
    /// The digest of the durable like sets and uniques (complete: a store
    /// that kept none computes it when it opens).
    pub sets_digest: SetsDigest,
    /// Pull watermarks per peer.
    pub watermarks: Vec<(ReplicaId, Cursor)>,
    /// Delta-log pull watermarks per peer.
    pub delta_watermarks: Vec<(ReplicaId, DeltaCursor)>,
    /// Regions of known replicas.
    pub directory: Vec<(ReplicaId, String)>,
    /// Unexpired idempotency records, with the segment that holds each.
    pub idempotency: Vec<(u64, IdempotencyRecord)>,
    /// Idempotency segments whose records had all expired: the core deletes
    /// them with its next commit (else they would stay on disk forever).
    pub expired_segments: Vec<u64>,
    /// The store's secret key for idempotency ids ([`super::IdHasher`]).
    pub idempotency_hash_key: u128,
    /// Other nodes' id keys, learned with their records.
    pub id_keys: Vec<u128>,
    /// When the last unexpired record written by an older build (with an
    /// unkeyed id) expires; 0 when there is none.
    pub legacy_idempotency_until_ms: u64,
}

/// A storage failure as the core sees it: a message for the log.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("storage error: {0}")]
pub struct StorageError(pub String);

/// One stored record: its store key and value.
pub type Record = (Vec<u8>, Vec<u8>);

/// What [`DurableState::visit_records`] calls with each record's key and
/// value.
pub type RecordVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StorageError> + 'a;

/// The read side of durable storage that the core needs. The store writes only
/// what [`CommitBatch`]es say, so what it returns for a counter that is not in
/// a batch being committed is durable.
///
/// The first four reads are raw; the rest depend on the store's key layout,
/// which is `storage`'s business, not the replica's: a store of that layout
/// writes them with [`crate::durable_layout_reads!`].
pub trait DurableState {
    /// The stored record of one counter.
    fn load_counter(&self, key: &str) -> Result<Option<StoredCounter>, StorageError>;
    /// Change-log entries strictly after `after`, in order, at most `limit`.
    fn changes_after(&self, after: &Cursor, limit: usize) -> Result<Vec<Change>, StorageError>;
    /// One stored record by its store key (like sets and uniques are read
    /// through this and [`Self::scan_records`]; see `storage/sets.rs`).
    fn get_record(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// Stored records with keys in `from..to` (`from` included), in key
    /// order, at most `limit`.
    fn scan_records(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Record>, StorageError>;
    /// Calls `visit` with each record [`Self::scan_records`] would return,
    /// in key order, and stops at its first error: the same read without
    /// copying the records, for a store that can lend them (the in-memory
    /// one). `visit` must not call the store: it may run with the store's
    /// locks held.
    fn visit_records(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
        visit: &mut RecordVisitor<'_>,
    ) -> Result<(), StorageError> {
        for (key, value) in self.scan_records(from, to, limit)? {
            visit(&key, &value)?;
        }
        Ok(())
    }

    /// The stored causal length of a like set's member (0 when never stored).
    fn load_member(&self, key: &str, member: &str) -> Result<u64, StorageError>;
    /// The stored derived count of a like set (0 when never stored).
    fn load_like_count(&self, key: &str) -> Result<u64, StorageError>;
    /// The stored registers of a uniques key.
    fn load_uniques(&self, key: &str) -> Result<Option<HyperLogLog>, StorageError>;
    /// The stored like sets (or uniques keys) strictly after `after`, in
    /// key order, at most `limit`.
    fn set_keys_after(
        &self,
        kind: SetKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StorageError>;
    /// A like set's stored members strictly after `after` (all when
    /// `None`), in member order, with their lengths; at most `limit`.
    fn like_members_after(
        &self,
        key: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, StorageError>;
    /// Idempotency segments written by commits after `after`, in order, at
    /// most `limit`, each with its records.
    fn idempotency_segments_after(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<IdempotencyRecord>)>, StorageError>;
    /// Delta-log records strictly after `after`, in order, at most `limit`,
    /// each with its cursor.
    fn deltas_after(
        &self,
        after: &DeltaCursor,
        limit: usize,
    ) -> Result<Vec<(DeltaCursor, SetDelta)>, StorageError>;
}
