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
//! [`PnCounter::apply_folds`] moves a writer's `p` and `n` into the base as
//! they are; [`PnCounter::merge_folded`] takes the base of the higher epoch
//! and ignores slots of writers folded at or below it, which is exact because
//! a folded writer's slot anywhere is at most its final state, and the base
//! holds exactly that. A state at an epoch this node has no record of is not
//! merged (it waits for the record): without it the merge cannot tell which
//! slots the other base already counts.

use std::collections::HashMap;

use super::digest::stable_hash;
use super::{PnCounter, ReplicaId, Slot};

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
        }
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
        if record.writers.is_empty() {
            return Err(FoldError::Empty(record.epoch));
        }
        for (writer, _) in &record.writers {
            if let Some(at) = self.folded_at(*writer) {
                return Err(FoldError::AlreadyFolded {
                    writer: *writer,
                    at,
                    epoch: record.epoch,
                });
            }
        }
        for (writer, _) in &record.writers {
            self.folded_at.insert(*writer, record.epoch);
        }
        self.records.push(record);
        Ok(true)
    }
}

impl PnCounter {
    /// A counter with `slots` and the folded `base`; slots of writers that
    /// `book` says are folded at or below the base's epoch are dropped.
    pub fn with_base(
        slots: impl IntoIterator<Item = (ReplicaId, Slot)>,
        base: FoldedBase,
        book: &FoldBook,
    ) -> Self {
        let mut counter = PnCounter::from_slots(slots);
        counter.folded = base;
        counter
            .slots
            .retain(|(writer, _)| !folded_by(book, *writer, base.epoch));
        counter
    }

    /// A counter with `slots` and `base` as given, trusting that no slot
    /// belongs to a writer folded into the base (a decoded record this node
    /// wrote itself).
    pub fn from_parts(
        slots: impl IntoIterator<Item = (ReplicaId, Slot)>,
        base: FoldedBase,
    ) -> Self {
        let mut counter = PnCounter::from_slots(slots);
        counter.folded = base;
        counter
    }

    /// Folds, up to epoch `upto`, the writers of `book`'s records that this
    /// counter has not folded yet: their slots move into the base as they
    /// are. Applying an epoch twice changes nothing (the base records the
    /// epoch it is complete up to). Returns true when the state changed.
    /// The caller folds only after checking that its state of each writer is
    /// the final one the record names (see `replica/folds.rs`).
    pub fn apply_folds(&mut self, book: &FoldBook, upto: u64) -> bool {
        let upto = upto.min(book.epoch());
        if upto <= self.folded.epoch {
            return false;
        }
        let mut base = self.folded;
        for epoch in self.folded.epoch + 1..=upto {
            let record = book
                .record(epoch)
                .expect("epochs up to book.epoch() are held");
            for (writer, _) in &record.writers {
                let slot = self.slot(*writer);
                base.p += u128::from(slot.p);
                base.n += u128::from(slot.n);
            }
        }
        base.epoch = upto;
        self.folded = base;
        self.slots
            .retain(|(writer, _)| !folded_by(book, *writer, upto));
        true
    }

    /// Merges `other` into `self` across fold epochs: the result takes the
    /// base of the higher epoch and drops the slots of writers folded at or
    /// below it, then takes the slot-wise max of the rest. Refused, changing
    /// nothing, when either state is at an epoch `book` does not hold yet, or
    /// when two states at one epoch disagree on the base. Returns true when
    /// `self` changed.
    pub fn merge_folded(&mut self, other: &PnCounter, book: &FoldBook) -> Result<bool, FoldError> {
        let epoch = self.folded.epoch.max(other.folded.epoch);
        if epoch > book.epoch() {
            return Err(FoldError::UnknownEpoch {
                epoch,
                known: book.epoch(),
            });
        }
        let base = match self.folded.epoch.cmp(&other.folded.epoch) {
            std::cmp::Ordering::Less => other.folded,
            std::cmp::Ordering::Greater => self.folded,
            std::cmp::Ordering::Equal if self.folded == other.folded => self.folded,
            std::cmp::Ordering::Equal => {
                return Err(FoldError::BaseConflict {
                    epoch,
                    ours_p: self.folded.p,
                    ours_n: self.folded.n,
                    theirs_p: other.folded.p,
                    theirs_n: other.folded.n,
                })
            }
        };
        if book.epoch() == 0 {
            // The common case: no fold ever, plain slot-wise max.
            return Ok(super::Crdt::merge(self, other));
        }
        let before = self.clone();
        let theirs = other
            .slots
            .iter()
            .filter(|(writer, _)| !folded_by(book, *writer, epoch));
        let mine = self
            .slots
            .iter()
            .filter(|(writer, _)| !folded_by(book, *writer, epoch));
        let mut merged = PnCounter::from_slots(mine.chain(theirs).copied());
        merged.folded = base;
        *self = merged;
        Ok(*self != before)
    }
}

fn folded_by(book: &FoldBook, writer: ReplicaId, epoch: u64) -> bool {
    book.folded_at(writer).is_some_and(|at| at <= epoch)
}

#[cfg(test)]
#[path = "fold_tests.rs"]
mod tests;
