//! Folds in partitioned regions (issue 13, cluster version 10,
//! `version::FOLDS_BY_PARTITION`): each writer's digest per partition, what
//! a member reports of them, the agreement rule partition by partition, and
//! the fold epoch applied to each partition's counters. Pure; `folds.rs`
//! drives it.
//!
//! In a region whose nodes keep only some of the partitions, two members'
//! digests of a writer cover different counters and never agree. Partition
//! by partition they do: once anti-entropy has run, every member that keeps
//! partition `p` holds the same final state of a retired writer's slots in
//! `p` (a writer writes only partitions it serves, and a partition is
//! deleted from a holder only after its new owners caught up with it).
//!
//! - **Agreement**: a writer's final state is agreed when, for every
//!   partition, every counted member that keeps it reports the same digest
//!   and at least one member keeps it. The record carries every partition's
//!   agreed digest ([`FoldRecord::by_partition`]).
//! - **Application** (invariant 9): a node raises partition `p`'s counters
//!   to an epoch only while it keeps `p` and its own digest of each of the
//!   record's writers in `p` is the record's: it then holds every counter of
//!   `p` with a slot of the writer, at its final state, so a counter of `p`
//!   it does not hold has no slot of the writer and may enter at that epoch.
//!   Any other partition's counters take the fold through merges. A
//!   partition that stops being kept (its purge may delete some of its
//!   counters) drops back to epoch 0: lowering what is applied is always
//!   safe (a counter keeps its own epoch; one below a fold keeps the
//!   writer's slot, which merges then drop against a folded copy).

use std::collections::{BTreeMap, HashMap};

use crate::crdt::{digest_in, FoldBook, FoldRecord, PartitionDigests, ReplicaId, WriterDigest};
use crate::partition::{Partition, PartitionCount, PartitionSet};

/// Each writer's digest per partition over the counters a node holds: of
/// its slots of phase 0 (written before any fold of the writer in that
/// partition while it lived on; every slot of a writer never so folded).
pub type DigestsByPartition = HashMap<ReplicaId, BTreeMap<u32, WriterDigest>>;

/// Digests of slots of later phases, by (writer, partition, phase >= 1)
/// ([`crate::crdt::FoldBook::phase`]). Kept apart from phase 0 because a
/// live writer's slot values in two phases can be equal (+5 before its fold
/// in a partition, +5 after): one digest over both could not tell a counter
/// still holding the old phase from one holding the new, and a fold agreed
/// on it could count one phase twice and the other never. Agreement and
/// application compare a writer's *current* phase only.
pub type LaterPhases = BTreeMap<(ReplicaId, u32, u32), WriterDigest>;

/// What [`set_partition_count_with`](super::Replica::set_partition_count_with)
/// computes when no current [`SavedDigests`] are given: each writer's
/// digests by partition (of phase 0, and of later phases), and each
/// partition's sets digest.
pub type ComputedDigests = ((DigestsByPartition, LaterPhases), Vec<u64>);

/// What a clean stop saves of the digests by partition: the writers'
/// ([`DigestsByPartition`]) and the like sets and uniques' (one per
/// partition).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SavedDigests {
    /// The durable sequence they are current at.
    pub durable_seq: u64,
    /// The partition count they are drawn over.
    pub partitions: u32,
    /// Each writer's digest per partition.
    pub writers: DigestsByPartition,
    /// Each partition's sets digest.
    pub sets: Vec<u64>,
}

/// What a member reports by partition (cluster version 10 on).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PartitionReport {
    /// The partitions it keeps (`None`: every one).
    pub kept: Option<PartitionSet>,
    /// Its digests per partition of each retired, unfolded writer it lists
    /// in [`super::folds::FoldReport::digests`].
    pub digests: Vec<(ReplicaId, PartitionDigests)>,
    /// Per other member whose kept partitions it knows: the digest of its
    /// state in the partitions both keep
    /// ([`shared_digest`](super::convergence::shared_digest)). Two members
    /// whose digests of each other agree hold the same state there: what
    /// `tally status` calls converged in a partitioned region.
    pub shared: Vec<(ReplicaId, u64)>,
    /// Its digest of each unfolded scoped retirement whose partition it
    /// keeps, in the phase retired (`fold_scoped.rs`).
    pub scoped: Vec<(super::folds::ScopedRetirement, WriterDigest)>,
}

impl PartitionReport {
    fn keeps(&self, partition: u32) -> bool {
        keeps(self.kept.as_ref(), partition)
    }

    fn digests_of(&self, writer: ReplicaId) -> Option<&PartitionDigests> {
        self.digests
            .iter()
            .find(|(w, _)| *w == writer)
            .map(|(_, digests)| digests)
    }
}

pub(super) fn keeps(kept: Option<&PartitionSet>, partition: u32) -> bool {
    kept.is_none_or(|kept| kept.contains(Partition(partition)))
}

/// Why a writer's state by partition is not agreed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PartitionWait {
    /// A counted member reports no state by partition (its report predates
    /// it, or lists no digest of the writer).
    NotReported(ReplicaId),
    /// Two members that keep `partition` hold different states of it.
    Differs {
        /// The member whose digest differs from the first one seen.
        member: ReplicaId,
        /// The partition.
        partition: u32,
        /// The first digest seen (this node's, if it keeps the partition).
        ours: WriterDigest,
        /// The member's.
        theirs: WriterDigest,
    },
    /// No member reports keeping `partition`.
    Unkept(u32),
}

/// Why a committed record is not applied to a partition's counters here.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Refusal {
    /// The writer whose digest differs.
    pub writer: ReplicaId,
    /// The partition (`None`: a record without digests per partition).
    pub partition: Option<u32>,
    /// The record's epoch.
    pub epoch: u64,
    /// This node's digest.
    pub ours: WriterDigest,
    /// The record's.
    pub theirs: WriterDigest,
}

/// The fold state this node keeps by partition (see the module documentation).
#[derive(Debug)]
pub struct ByPartition {
    count: PartitionCount,
    /// Each writer's digest per partition over the counters held, phase 0.
    digests: DigestsByPartition,
    /// The same of later phases.
    later: LaterPhases,
    /// Each (writer, partition) folded while the writer lived on: its
    /// current phase (how many such folds the book holds).
    phases: HashMap<(ReplicaId, u32), u32>,
    /// The partitions kept (`None`: every one).
    kept: Option<PartitionSet>,
    /// Per partition, fold epochs up to this one are applied to its counters.
    applied: Vec<u64>,
    /// The applied epochs changed since they were last handed to a commit.
    applied_dirty: bool,
}

impl ByPartition {
    /// The state of a node of `count` partitions holding `digests` (and
    /// `later` phases), each partition applied up to `applied` except where
    /// `overrides` says, with the phases of `book`'s records.
    pub fn new(
        count: PartitionCount,
        (digests, later): (DigestsByPartition, LaterPhases),
        applied: u64,
        overrides: &[(u32, u64)],
        book: &FoldBook,
    ) -> Self {
        let mut epochs = vec![applied; count.get() as usize];
        for (partition, epoch) in overrides {
            if let Some(slot) = epochs.get_mut(*partition as usize) {
                *slot = *epoch;
            }
        }
        let mut phases = HashMap::new();
        for record in book.records() {
            phases::note_phases(&mut phases, record);
        }
        ByPartition {
            count,
            digests,
            later,
            phases,
            kept: None,
            applied: epochs,
            applied_dirty: false,
        }
    }

    /// The partition count.
    pub fn count(&self) -> PartitionCount {
        self.count
    }

    /// The partition of `key`.
    pub fn of_key(&self, key: &str) -> u32 {
        self.count.of_key(key.as_bytes()).0
    }

    /// Whether `partition` is kept here.
    pub fn keeps(&self, partition: u32) -> bool {
        keeps(self.kept.as_ref(), partition)
    }

    /// The partitions kept from now on. A partition no longer kept drops
    /// back to epoch 0 (see the module documentation).
    pub fn set_kept(&mut self, kept: Option<PartitionSet>) {
        self.kept = kept;
        for partition in 0..self.count.get() {
            if !self.keeps(partition) && self.applied[partition as usize] != 0 {
                self.applied[partition as usize] = 0;
                self.applied_dirty = true;
            }
        }
    }

    /// Epochs up to this one are applied to `partition`'s counters.
    pub fn applied(&self, partition: u32) -> u64 {
        self.applied.get(partition as usize).copied().unwrap_or(0)
    }

    /// The fold epoch this node is done with, what `tally status` shows as
    /// `folds_applied`: per partition, the epoch applied to it, and in a
    /// partition it serves (caught up) past that every next record whose
    /// writers it holds no slot of there: a node that copied a partition
    /// after its fold holds it folded already, and its own digests never
    /// equal the record's, so it applies nothing itself and merges bring
    /// the bases. The lowest over the partitions it keeps (one still being
    /// copied in or handed away counts at its applied epoch), or over all
    /// of them when it keeps none (a drained node).
    pub fn done_where_kept(&self, book: &FoldBook, serving: Option<&PartitionSet>) -> u64 {
        // Per partition, the first record above its applied epoch whose
        // writers hold a slot in it here: one pass over the records above
        // the floor and their writers' digests, not one per partition (a
        // node that applies nothing itself would walk every record kept
        // since, for each of P partitions, at every status and metric tick).
        let mut blocked: Vec<Option<u64>> = vec![None; self.applied.len()];
        for epoch in self.applied_floor() + 1..=book.epoch() {
            let Some(record) = book.record(epoch) else {
                break;
            };
            let whole = record.writers.iter().flat_map(|(writer, _)| {
                self.held_in(*writer)
                    .map(|(partition, _)| (*writer, partition))
            });
            let scoped = record.scoped.iter().flat_map(|(writer, digests)| {
                digests.iter().map(|(partition, _)| (*writer, *partition))
            });
            for (writer, partition) in whole.chain(scoped) {
                // A slot of a phase up to the one the record folds blocks
                // it; one written since (a later phase) does not.
                let folded = book.phase(writer, Some(partition), epoch - 1);
                let held = (0..=folded).any(|phase| {
                    self.digest_at(writer, partition, phase) != WriterDigest::default()
                });
                let index = partition as usize;
                if held && blocked[index].is_none() && epoch > self.applied[index] {
                    blocked[index] = Some(epoch);
                }
            }
        }
        let done = |partition: u32, past_empty: bool| {
            let applied = self.applied[partition as usize];
            if !past_empty {
                return applied;
            }
            blocked[partition as usize]
                .map_or(book.epoch(), |epoch| epoch - 1)
                .max(applied)
        };
        let served = |partition: u32| serving.is_none_or(|set| set.contains(Partition(partition)));
        let partitions = 0..self.count.get();
        let kept = partitions
            .clone()
            .filter(|partition| self.keeps(*partition));
        kept.map(|partition| done(partition, served(partition)))
            .min()
            .unwrap_or_else(|| {
                partitions
                    .map(|partition| done(partition, true))
                    .min()
                    .unwrap_or(0)
            })
    }

    /// Raises `partition`'s applied epoch past every next record whose
    /// writers this node holds no slot of there, of the phases the record
    /// folds: for a partition it keeps and has just copied in from every
    /// up-to-date holder (the caller knows; `partition/handoff.rs`). Such a
    /// node holds every counter of the partition that holds a slot of a
    /// folded writer anywhere (each fold's keepers held them all, and a
    /// partition leaves a holder only for one caught up with it), so what
    /// it holds without such slots was copied folded already, and a counter
    /// it does not hold has none: raising them to the epoch changes no
    /// value (invariant 9). Returns the epoch applied now.
    pub fn raise_copied(&mut self, book: &FoldBook, partition: u32) -> u64 {
        let index = partition as usize;
        let Some(&applied) = self.applied.get(index) else {
            return 0;
        };
        let mut upto = applied;
        while let Some(record) = book.record(upto + 1) {
            let whole = record.writers.iter().map(|(writer, _)| *writer);
            let scoped = record
                .scoped
                .iter()
                .filter(|(_, digests)| digests.iter().any(|(p, _)| *p == partition))
                .map(|(writer, _)| *writer);
            let held = whole.chain(scoped).any(|writer| {
                let folded = book.phase(writer, Some(partition), record.epoch - 1);
                (0..=folded).any(|phase| {
                    self.digest_at(writer, partition, phase) != WriterDigest::default()
                })
            });
            if held {
                break;
            }
            upto += 1;
        }
        if upto != applied {
            self.applied[index] = upto;
            self.applied_dirty = true;
        }
        upto
    }

    /// The lowest epoch applied to any partition.
    pub fn applied_floor(&self) -> u64 {
        self.applied.iter().copied().min().unwrap_or(0)
    }

    /// The sum of every partition's applied epoch: it changes whenever one
    /// does (the fold sweep runs a pass when it moves).
    pub fn applied_sum(&self) -> u64 {
        self.applied.iter().sum()
    }

    /// Raises each partition's applied epoch as far as `applicable` allows,
    /// one record after the other; returns the first refusal met per
    /// writer, for `tally status`.
    /// `whole_differs` checks a record without digests per partition (an
    /// older cluster's) against this node's whole digests.
    pub fn advance(
        &mut self,
        book: &FoldBook,
        whole_differs: impl Fn(&FoldRecord) -> Option<(ReplicaId, WriterDigest, WriterDigest)>,
    ) -> Vec<Refusal> {
        let mut refusals: BTreeMap<ReplicaId, Refusal> = BTreeMap::new();
        for partition in 0..self.count.get() {
            let mut upto = self.applied[partition as usize];
            while let Some(record) = book.record(upto + 1) {
                let differs = match &record.by_partition {
                    None => whole_differs(record),
                    Some(_) if !self.keeps(partition) => break,
                    Some(_) => self.differs_in(book, record, partition),
                };
                if let Some((writer, ours, theirs)) = differs {
                    refusals.entry(writer).or_insert(Refusal {
                        writer,
                        partition: record.by_partition.is_some().then_some(partition),
                        epoch: record.epoch,
                        ours,
                        theirs,
                    });
                    break;
                }
                upto += 1;
            }
            if upto != self.applied[partition as usize] {
                self.applied[partition as usize] = upto;
                self.applied_dirty = true;
            }
        }
        refusals.into_values().collect()
    }

    /// The first writer `record` folds in `partition` whose digest here
    /// differs from the record's: writers folded whole, then those folded
    /// in `partition` while living on. Each is compared in the phase the
    /// record folds (its phase before the record's epoch): slots written
    /// since, of a later phase, are not the record's.
    fn differs_in(
        &self,
        book: &FoldBook,
        record: &FoldRecord,
        partition: u32,
    ) -> Option<(ReplicaId, WriterDigest, WriterDigest)> {
        let before = record.epoch - 1;
        let whole = record.writers.iter().map(|(writer, _)| {
            let theirs = record
                .partition_digest(*writer, partition)
                .unwrap_or_default();
            (*writer, theirs)
        });
        let scoped = record.scoped.iter().filter_map(|(writer, digests)| {
            digests
                .binary_search_by_key(&partition, |(p, _)| *p)
                .ok()
                .map(|index| (*writer, digests[index].1))
        });
        whole.chain(scoped).find_map(|(writer, theirs)| {
            let phase = book.phase(writer, Some(partition), before);
            let ours = self.digest_at(writer, partition, phase);
            (ours != theirs).then_some((writer, ours, theirs))
        })
    }

    /// The applied epochs that differ from the floor, for the next commit,
    /// if they changed since the last one.
    pub fn take_applied(&mut self) -> Option<Vec<(u32, u64)>> {
        if !std::mem::take(&mut self.applied_dirty) {
            return None;
        }
        let floor = self.applied_floor();
        Some(
            self.applied
                .iter()
                .enumerate()
                .filter(|(_, epoch)| **epoch != floor)
                .map(|(partition, epoch)| (partition as u32, *epoch))
                .collect(),
        )
    }

    /// A commit that carried [`Self::take_applied`] failed: the next one
    /// carries the epochs again.
    pub fn restore_applied(&mut self) {
        self.applied_dirty = true;
    }

    /// What this node reports by partition of `writers` (its digests of
    /// each other member's shared partitions are added by the replica).
    pub fn report(&self, writers: impl Iterator<Item = ReplicaId>) -> PartitionReport {
        PartitionReport {
            kept: self.kept.clone(),
            digests: writers
                .map(|writer| (writer, self.digests_of(writer)))
                .collect(),
            shared: Vec::new(),
            scoped: Vec::new(),
        }
    }

    /// The digest of each partition's counter slots: the sum over writers
    /// of their digests there, of every phase.
    pub fn counter_digests(&self) -> Vec<u64> {
        let mut sums = vec![0u64; self.count.get() as usize];
        let phase_0 = self.digests.values().flatten();
        let later = self.later.iter().map(|((_, p, _), d)| (p, d));
        for (partition, digest) in phase_0.chain(later) {
            let slot = &mut sums[*partition as usize];
            *slot = slot.wrapping_add(digest.hash);
        }
        sums
    }

    /// The agreement rule by partition for `writer` over the `counted`
    /// members' reports: each partition's agreed digest (empty ones left
    /// out), or why there is none.
    pub fn agreement<'r>(
        &self,
        writer: ReplicaId,
        counted: &[ReplicaId],
        report_of: impl Fn(ReplicaId) -> Option<&'r PartitionReport>,
    ) -> Result<PartitionDigests, PartitionWait> {
        let mut agreed: Vec<Option<WriterDigest>> = vec![None; self.count.get() as usize];
        for partition in 0..self.count.get() {
            if self.keeps(partition) {
                agreed[partition as usize] = Some(self.digest(writer, partition));
            }
        }
        for member in counted {
            let report = report_of(*member).ok_or(PartitionWait::NotReported(*member))?;
            let digests = report
                .digests_of(writer)
                .ok_or(PartitionWait::NotReported(*member))?;
            if report
                .kept
                .as_ref()
                .is_some_and(|kept| kept.count() != self.count)
            {
                return Err(PartitionWait::NotReported(*member));
            }
            for partition in 0..self.count.get() {
                if !report.keeps(partition) {
                    continue;
                }
                let theirs = digest_in(digests, partition);
                match agreed[partition as usize] {
                    None => agreed[partition as usize] = Some(theirs),
                    Some(ours) if ours != theirs => {
                        return Err(PartitionWait::Differs {
                            member: *member,
                            partition,
                            ours,
                            theirs,
                        })
                    }
                    Some(_) => {}
                }
            }
        }
        let mut digests = Vec::new();
        for (partition, digest) in agreed.into_iter().enumerate() {
            let digest = digest.ok_or(PartitionWait::Unkept(partition as u32))?;
            if digest != WriterDigest::default() {
                digests.push((partition as u32, digest));
            }
        }
        Ok(digests)
    }

    /// Whether a member's `report` agrees with `digests` (the final state
    /// of `writer`) in every partition it keeps; the first that does not.
    pub fn report_matches(
        report: &PartitionReport,
        writer: ReplicaId,
        digests: &[(u32, WriterDigest)],
        count: PartitionCount,
    ) -> Result<(), (u32, WriterDigest, WriterDigest)> {
        let theirs = report.digests_of(writer).map(Vec::as_slice).unwrap_or(&[]);
        for partition in 0..count.get() {
            if !report.keeps(partition) {
                continue;
            }
            let (ours, theirs) = (digest_in(digests, partition), digest_in(theirs, partition));
            if ours != theirs {
                return Err((partition, ours, theirs));
            }
        }
        Ok(())
    }

    /// Whether this node's own digests agree with `digests` in every
    /// partition it keeps.
    pub fn own_matches(&self, writer: ReplicaId, digests: &[(u32, WriterDigest)]) -> bool {
        (0..self.count.get())
            .filter(|partition| self.keeps(*partition))
            .all(|partition| self.digest(writer, partition) == digest_in(digests, partition))
    }
}

#[path = "fold_phases.rs"]
mod phases;

#[cfg(test)]
#[path = "fold_partitions_tests.rs"]
mod tests;
