//! Folding retired writers: the folded base of a counter, the fold records
//! that say which writers were folded at which epoch, and the merge that
//! knows about both.
//!
//! A retired writer never writes again. Once every member holds the same
//! final state of its slots (checked by [`WriterDigest`]s, see
//! `replica/folds.rs`), a [`FoldRecord`] names it with the next epoch. A
//! counter at epoch `e` holds, in its [`FoldedBase`], the sums of every writer
//! folded at an epoch `<= e` and no slot of theirs.
//!
//! Invariant 9 (DESIGN.md), kept here: a fold never changes a counter's value.
//! [`PnCounter::apply_folds`](crate::crdt::PnCounter::apply_folds) moves a writer's `p` and `n` into the base as
//! they are; [`PnCounter::merge_folded`](crate::crdt::PnCounter::merge_folded) takes the base of the higher epoch
//! and ignores slots of writers folded at or below it, which is exact because
//! a folded writer's slot anywhere is at most its final state, and the base
//! holds exactly that. A state at an epoch this node has no record of is not
//! merged (it waits for the record): without it the merge cannot tell which
//! slots the other base already counts.
//!
//! A record may also fold a writer that lives on in some partitions only
//! ([`FoldRecord::scoped`]: its slots of a partition that moved away from it,
//! issue 13). Such a writer may write the partition again after the fold,
//! in counters at the fold's epoch or later, from a slot that starts at 0.
//! The merge rule that keeps this exact: of two states of a counter of
//! partition `p`, the one at the lower epoch loses the writer's slot when
//! the writer was folded in `p` at an epoch above it and at most the higher
//! one (the higher state's base counts that slot, and its own slot of the
//! writer is what the writer wrote since). For a writer folded whole this
//! is the rule above: a state at or above its epoch never holds its slot.
//! Scoped records are written from cluster version 12: the trigger, the
//! agreement among the partition's keepers and the writer's gate are in
//! `replica/fold_released.rs` and `replica/fold_scoped.rs` (in words:
//! `node/ALGORITHM.md`, "Folds").

use std::collections::HashMap;

use super::digest::stable_hash;
use super::{ReplicaId, Slot};

/// The sums of the writers folded into one counter, and the fold epoch they
/// are complete up to. 128 bits: the sum of many `u64` sums never wraps.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct FoldedBase {
    /// Every writer folded at an epoch up to this one is counted here.
    pub epoch: u64,
    /// Sum of the folded writers' increments.
    pub p: u128,
    /// Sum of the folded writers' decrements.
    pub n: u128,
}

impl FoldedBase {
    /// The base's contribution to the value. A counter's value fits `i64`,
    /// so a base that does not fit `i128` is unreachable; it saturates.
    pub fn net(self) -> i128 {
        let p = i128::try_from(self.p).unwrap_or(i128::MAX);
        let n = i128::try_from(self.n).unwrap_or(i128::MAX);
        p.saturating_sub(n)
    }
}

/// A member's summary of one writer's slots over every counter it holds:
/// how many counters have a slot of the writer, and an order-independent
/// hash of (key, p, n) over them. Equal digests at every member mean every
/// member holds the same final state of the writer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct WriterDigest {
    /// Counters holding a non-empty slot of the writer.
    pub counters: u64,
    /// Wrapping sum of [`writer_slot_hash`] over those counters.
    pub hash: u64,
}

impl WriterDigest {
    /// Replaces the writer's slot in counter `key`: `old` out, `new` in (an
    /// empty slot counts as absent).
    pub fn replace(&mut self, key: &str, old: Slot, new: Slot) {
        if old != Slot::default() {
            self.counters = self.counters.wrapping_sub(1);
            self.hash = self.hash.wrapping_sub(writer_slot_hash(key, old));
        }
        if new != Slot::default() {
            self.counters = self.counters.wrapping_add(1);
            self.hash = self.hash.wrapping_add(writer_slot_hash(key, new));
        }
    }

    /// Adds the digest of slots in other counters (digests of disjoint sets
    /// of counters add up: a writer's digest is the sum of its partitions').
    pub fn add(&mut self, other: WriterDigest) {
        self.counters = self.counters.wrapping_add(other.counters);
        self.hash = self.hash.wrapping_add(other.hash);
    }
}

impl std::fmt::Display for WriterDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} counters/{:016x}", self.counters, self.hash)
    }
}

/// The hash of one writer's slot in counter `key`.
pub fn writer_slot_hash(key: &str, slot: Slot) -> u64 {
    stable_hash(
        9,
        &[key.as_bytes(), &slot.p.to_le_bytes(), &slot.n.to_le_bytes()],
    )
}

/// A writer's digests per partition, sorted by partition; a partition left
/// out holds no slot of the writer.
pub type PartitionDigests = Vec<(u32, WriterDigest)>;

/// The digest of `partition` in a sorted list of digests per partition
/// (empty when left out).
pub fn digest_in(digests: &[(u32, WriterDigest)], partition: u32) -> WriterDigest {
    digests
        .binary_search_by_key(&partition, |(p, _)| *p)
        .map(|index| digests[index].1)
        .unwrap_or_default()
}

/// One fold: the writers folded at `epoch`, each with the digest of the final
/// state of its slots that every member reported. Kept forever.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct FoldRecord {
    /// 1 for the first fold of the cluster, then one more each time.
    pub epoch: u64,
    /// The writers folded, sorted by id, with their final-state digests.
    pub writers: Vec<(ReplicaId, WriterDigest)>,
    /// From cluster version 10 (`replica/version.rs::FOLDS_BY_PARTITION`):
    /// each writer's final-state digest per partition, in `writers`' order,
    /// the sums of which are `writers`' digests. A node applies such a
    /// record partition by partition, to the partitions it keeps and whose
    /// digests equal the record's; a record without them (`None`, older
    /// clusters) is applied whole or not at all.
    pub by_partition: Option<Vec<(ReplicaId, PartitionDigests)>>,
    /// Live writers folded only in some partitions, sorted by id, each with
    /// its final-state digest per partition folded (sorted, never empty).
    /// Not in `writers`: a writer is folded whole or scoped by one record.
    pub scoped: Vec<(ReplicaId, PartitionDigests)>,
}

impl FoldRecord {
    /// A record of `writers` (any order) at `epoch`.
    pub fn new(epoch: u64, writers: impl IntoIterator<Item = (ReplicaId, WriterDigest)>) -> Self {
        let mut writers: Vec<_> = writers.into_iter().collect();
        writers.sort_unstable_by_key(|(writer, _)| *writer);
        writers.dedup_by_key(|(writer, _)| *writer);
        FoldRecord {
            epoch,
            writers,
            by_partition: None,
            scoped: Vec::new(),
        }
    }

    /// A record of `writers` (any order) at `epoch` with their digests per
    /// partition (empty digests are left out); each writer's whole digest is
    /// the sum of its partitions'.
    pub fn by_partition(
        epoch: u64,
        writers: impl IntoIterator<Item = (ReplicaId, PartitionDigests)>,
    ) -> Self {
        let mut parts: Vec<(ReplicaId, PartitionDigests)> = writers
            .into_iter()
            .map(|(writer, mut digests)| {
                digests.retain(|(_, digest)| *digest != WriterDigest::default());
                digests.sort_unstable_by_key(|(partition, _)| *partition);
                digests.dedup_by_key(|(partition, _)| *partition);
                (writer, digests)
            })
            .collect();
        parts.sort_unstable_by_key(|(writer, _)| *writer);
        parts.dedup_by_key(|(writer, _)| *writer);
        let writers = parts
            .iter()
            .map(|(writer, digests)| {
                let mut total = WriterDigest::default();
                for (_, digest) in digests {
                    total.add(*digest);
                }
                (*writer, total)
            })
            .collect();
        FoldRecord {
            epoch,
            writers,
            by_partition: Some(parts),
            scoped: Vec::new(),
        }
    }

    /// This record, also folding `writers` (any order) in the partitions
    /// listed with each (their digests there; the partitions are kept even
    /// when a digest is empty: the writer's slots there are folded, none or
    /// not).
    pub fn with_scoped(
        mut self,
        writers: impl IntoIterator<Item = (ReplicaId, PartitionDigests)>,
    ) -> Self {
        let mut scoped: Vec<(ReplicaId, PartitionDigests)> = writers
            .into_iter()
            .map(|(writer, mut digests)| {
                digests.sort_unstable_by_key(|(partition, _)| *partition);
                digests.dedup_by_key(|(partition, _)| *partition);
                (writer, digests)
            })
            .collect();
        scoped.sort_unstable_by_key(|(writer, _)| *writer);
        scoped.dedup_by_key(|(writer, _)| *writer);
        self.scoped = scoped;
        self
    }

    /// The record's digest of `writer`'s slots in `partition`: `None` for a
    /// record without digests per partition or a writer it does not fold.
    pub fn partition_digest(&self, writer: ReplicaId, partition: u32) -> Option<WriterDigest> {
        let parts = self.by_partition.as_ref()?;
        let (_, digests) = parts.iter().find(|(w, _)| *w == writer)?;
        Some(digest_in(digests, partition))
    }

    /// The record's own digest, for members to compare records cheaply.
    pub fn digest(&self) -> u64 {
        let mut parts: Vec<[u8; 24]> = Vec::with_capacity(self.writers.len());
        for (writer, digest) in &self.writers {
            let mut bytes = [0u8; 24];
            bytes[..8].copy_from_slice(&writer.0.to_le_bytes());
            bytes[8..16].copy_from_slice(&digest.counters.to_le_bytes());
            bytes[16..].copy_from_slice(&digest.hash.to_le_bytes());
            parts.push(bytes);
        }
        let epoch = self.epoch.to_le_bytes();
        let mut slices: Vec<&[u8]> = vec![&epoch];
        slices.extend(parts.iter().map(|part| &part[..]));
        if !self.scoped.is_empty() {
            // A separate seed: a record without scoped writers keeps the
            // digest older builds computed.
            let scoped = scoped_bytes(&self.scoped);
            let whole = self.by_partition.as_deref().map(partition_bytes);
            slices.push(&scoped);
            slices.extend(whole.as_deref());
            return stable_hash(12, &slices);
        }
        let Some(by_partition) = &self.by_partition else {
            return stable_hash(10, &slices);
        };
        let mut partitions: Vec<[u8; 28]> = Vec::new();
        for (writer, digests) in by_partition {
            for (partition, digest) in digests {
                let mut bytes = [0u8; 28];
                bytes[..8].copy_from_slice(&writer.0.to_le_bytes());
                bytes[8..12].copy_from_slice(&partition.to_le_bytes());
                bytes[12..20].copy_from_slice(&digest.counters.to_le_bytes());
                bytes[20..].copy_from_slice(&digest.hash.to_le_bytes());
                partitions.push(bytes);
            }
        }
        slices.extend(partitions.iter().map(|part| &part[..]));
        stable_hash(11, &slices)
    }
}

/// Writers' digests per partition, as bytes for a record's digest.
fn partition_bytes(parts: &[(ReplicaId, PartitionDigests)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (writer, digests) in parts {
        for (partition, digest) in digests {
            bytes.extend_from_slice(&writer.0.to_le_bytes());
            bytes.extend_from_slice(&partition.to_le_bytes());
            bytes.extend_from_slice(&digest.counters.to_le_bytes());
            bytes.extend_from_slice(&digest.hash.to_le_bytes());
        }
    }
    bytes
}

/// Scoped writers as bytes for a record's digest (each writer's entry
/// delimited by its partition count, so an empty digest still counts).
fn scoped_bytes(scoped: &[(ReplicaId, PartitionDigests)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (writer, digests) in scoped {
        bytes.extend_from_slice(&(digests.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&partition_bytes(&[(*writer, digests.clone())]));
    }
    bytes
}

/// Why a fold record or a folded state was refused. Nothing changed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum FoldError {
    /// A record names no writer.
    #[error("fold record of epoch {0} names no writer")]
    Empty(u64),
    /// A record skips epochs this node has no record of.
    #[error("fold record of epoch {epoch} arrived before the record of epoch {missing}; it waits for it")]
    Gap {
        /// The record's epoch.
        epoch: u64,
        /// The first epoch missing before it.
        missing: u64,
    },
    /// Two different records claim the same epoch.
    #[error("fold record of epoch {epoch} (digest {theirs:016x}) conflicts with the one held (digest {ours:016x}); it is refused")]
    Conflict {
        /// The epoch.
        epoch: u64,
        /// The held record's digest.
        ours: u64,
        /// The refused record's digest.
        theirs: u64,
    },
    /// A writer was folded already.
    #[error("writer {writer} was already folded at epoch {at}; a record of epoch {epoch} cannot fold it again")]
    AlreadyFolded {
        /// The writer.
        writer: ReplicaId,
        /// The epoch it was folded at.
        at: u64,
        /// The refused record's epoch.
        epoch: u64,
    },
    /// A record folds a writer whole and in some partitions at once, or
    /// in no partition at all.
    #[error("fold record of epoch {epoch} folds writer {writer} in some partitions and names none, or folds it whole too; it is refused")]
    BadScope {
        /// The writer.
        writer: ReplicaId,
        /// The record's epoch.
        epoch: u64,
    },
    /// A state carries a fold epoch this node holds no record of.
    #[error("the state is folded up to epoch {epoch}, but this node holds fold records up to epoch {known} only; it waits for the records")]
    UnknownEpoch {
        /// The state's epoch.
        epoch: u64,
        /// The newest epoch this node has a record of.
        known: u64,
    },
    /// Two states at the same epoch have different bases.
    #[error("two states folded at epoch {epoch} have different bases ({ours_p}-{ours_n} here, {theirs_p}-{theirs_n} received); the received state is refused")]
    BaseConflict {
        /// The epoch.
        epoch: u64,
        /// Our base's p.
        ours_p: u128,
        /// Our base's n.
        ours_n: u128,
        /// Their base's p.
        theirs_p: u128,
        /// Their base's n.
        theirs_n: u128,
    },
}

/// Every fold record this node holds, epochs `1..=epoch()` without a gap.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct FoldBook {
    records: Vec<FoldRecord>,
    folded_at: HashMap<ReplicaId, u64>,
    /// The epochs, ascending, at which each (writer, partition) was folded
    /// while the writer lived on ([`FoldRecord::scoped`]).
    scoped_at: HashMap<(ReplicaId, u32), Vec<u64>>,
}

impl FoldBook {
    /// An empty book (no fold yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// A book of `records` (recovered from disk), which must chain from epoch 1.
    pub fn from_records(records: impl IntoIterator<Item = FoldRecord>) -> Result<Self, FoldError> {
        let mut records: Vec<FoldRecord> = records.into_iter().collect();
        records.sort_by_key(|record| record.epoch);
        let mut book = FoldBook::new();
        for record in records {
            book.accept(record)?;
        }
        Ok(book)
    }

    /// The newest epoch held (0 before the first fold).
    pub fn epoch(&self) -> u64 {
        self.records.len() as u64
    }

    /// The records, oldest first.
    pub fn records(&self) -> &[FoldRecord] {
        &self.records
    }

    /// The record of `epoch`, if held.
    pub fn record(&self, epoch: u64) -> Option<&FoldRecord> {
        let index = usize::try_from(epoch.checked_sub(1)?).ok()?;
        self.records.get(index)
    }

    /// The epoch `writer` was folded at, if it was.
    pub fn folded_at(&self, writer: ReplicaId) -> Option<u64> {
        self.folded_at.get(&writer).copied()
    }

    /// Whether `writer` was folded in `partition` (while living on) at an
    /// epoch in `after + 1..=upto`: a state at epoch `after` then holds a
    /// slot of it that a state at `upto` counts in its base. `None`: a
    /// partition this node cannot name (no partition count yet), where no
    /// scoped fold applies.
    pub fn scoped_between(
        &self,
        writer: ReplicaId,
        partition: Option<u32>,
        after: u64,
        upto: u64,
    ) -> bool {
        let Some(partition) = partition else {
            return false;
        };
        !self.scoped_at.is_empty()
            && after < upto
            && self
                .scoped_at
                .get(&(writer, partition))
                .is_some_and(|epochs| epochs.iter().any(|e| *e > after && *e <= upto))
    }

    /// The phase of `writer`'s slot in a counter of `partition` folded up
    /// to `epoch`: how many records up to `epoch` folded the writer in that
    /// partition while it lived on (applying one moves the slot into the
    /// base, so a counter's slot of the writer was written after the last
    /// of them). 0 when there is none, or no partition. A record committed
    /// later has a higher epoch: a slot's phase never changes while its
    /// counter's epoch stays.
    pub fn phase(&self, writer: ReplicaId, partition: Option<u32>, epoch: u64) -> u32 {
        let Some(partition) = partition else {
            return 0;
        };
        if self.scoped_at.is_empty() {
            return 0;
        }
        self.scoped_epochs(writer, partition)
            .iter()
            .filter(|e| **e <= epoch)
            .count() as u32
    }

    /// The epochs at which `writer` was folded in `partition` while it
    /// lived on, oldest first: the current phase of its slots there is
    /// their count.
    pub fn scoped_epochs(&self, writer: ReplicaId, partition: u32) -> &[u64] {
        self.scoped_at
            .get(&(writer, partition))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether any record folds a writer in some partitions only.
    pub fn has_scoped(&self) -> bool {
        !self.scoped_at.is_empty()
    }

    /// Adds the next record. Returns false when the same record is already
    /// held; refuses a gap, a conflicting record, an empty one, or one that
    /// folds a writer again. Nothing changes on a refusal.
    pub fn accept(&mut self, record: FoldRecord) -> Result<bool, FoldError> {
        if let Some(held) = self.record(record.epoch) {
            if *held == record {
                return Ok(false);
            }
            return Err(FoldError::Conflict {
                epoch: record.epoch,
                ours: held.digest(),
                theirs: record.digest(),
            });
        }
        if record.epoch != self.epoch() + 1 {
            return Err(FoldError::Gap {
                epoch: record.epoch,
                missing: self.epoch() + 1,
            });
        }
        if record.writers.is_empty() && record.scoped.is_empty() {
            return Err(FoldError::Empty(record.epoch));
        }
        let scoped = record.scoped.iter().map(|(writer, _)| writer);
        for writer in record
            .writers
            .iter()
            .map(|(writer, _)| writer)
            .chain(scoped)
        {
            if let Some(at) = self.folded_at(*writer) {
                return Err(FoldError::AlreadyFolded {
                    writer: *writer,
                    at,
                    epoch: record.epoch,
                });
            }
        }
        for (writer, digests) in &record.scoped {
            let whole = record.writers.iter().any(|(w, _)| w == writer);
            if whole || digests.is_empty() {
                return Err(FoldError::BadScope {
                    writer: *writer,
                    epoch: record.epoch,
                });
            }
        }
        for (writer, _) in &record.writers {
            self.folded_at.insert(*writer, record.epoch);
        }
        for (writer, digests) in &record.scoped {
            for (partition, _) in digests {
                self.scoped_at
                    .entry((*writer, *partition))
                    .or_default()
                    .push(record.epoch);
            }
        }
        self.records.push(record);
        Ok(true)
    }
}

#[path = "fold_merge.rs"]
mod merge;

#[cfg(test)]
#[path = "fold_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "fold_scoped_tests.rs"]
mod scoped_tests;
