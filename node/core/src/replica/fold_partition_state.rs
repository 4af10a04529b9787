//! The fold state a node keeps by partition (cluster version 10), as
//! [`Folds`] exposes it: tracking from a partition count, the partitions
//! kept, the applied epochs and their persistence, the writers' digests by
//! partition and how commits change them. The rules are in
//! `fold_partitions.rs` ([`ByPartition`]); invariant 9 (a fold never
//! changes a value) rests on them applying a record only where the node
//! holds the writer's final state.

use crate::crdt::{ReplicaId, Slot, WriterDigest};
use crate::partition::{PartitionCount, PartitionSet};

use super::super::fold_partitions::{ByPartition, DigestsByPartition, LaterPhases};
use super::{DigestChanges, Folds};

impl Folds {
    /// The applied epochs by partition that differ from the recovered
    /// floor (persisted by a node that tracked partitions), used once
    /// [`Self::track_partitions`] is called.
    pub fn set_recovered_partitions(&mut self, parts: Vec<(u32, u64)>) {
        self.recovered_parts = parts;
    }

    /// Starts tracking digests and applied epochs by partition, for a node
    /// of `count` partitions whose stored counters give `digests` (per
    /// writer and partition, phase 0, and of later phases).
    pub fn track_partitions(
        &mut self,
        count: PartitionCount,
        digests: (DigestsByPartition, LaterPhases),
    ) {
        let parts = std::mem::take(&mut self.recovered_parts);
        self.by_partition = Some(ByPartition::new(
            count,
            digests,
            self.applied,
            &parts,
            &self.book,
        ));
        // A candidate proposed before partitions were tracked names whole
        // writers: it gives way to one by partition.
        if self
            .candidate
            .as_ref()
            .is_some_and(|candidate| candidate.by_partition.is_none())
        {
            self.candidate = None;
        }
        self.advance_applied();
    }

    /// The partition count and every writer's digests by partition (phase
    /// 0; and of later phases), once tracked.
    pub fn partition_digests(&self) -> Option<(PartitionCount, &DigestsByPartition, &LaterPhases)> {
        let bp = self.by_partition.as_ref()?;
        Some((bp.count(), bp.all_digests(), bp.later_phases()))
    }

    /// The digest of each partition's counter slots, once tracked.
    pub fn counter_digests(&self) -> Option<Vec<u64>> {
        self.by_partition.as_ref().map(ByPartition::counter_digests)
    }

    /// The partition count, once tracked.
    pub fn partition_count(&self) -> Option<PartitionCount> {
        self.by_partition.as_ref().map(ByPartition::count)
    }

    /// Whether folds agree and are recorded partition by partition: on a
    /// node that tracks partitions (every cluster this build opens is at
    /// version 10 or later).
    pub fn agrees_by_partition(&self) -> bool {
        self.by_partition.is_some()
    }

    /// The partitions this node keeps from now on (`None`: every one).
    pub fn set_kept(&mut self, kept: Option<PartitionSet>) {
        if let Some(bp) = self.by_partition.as_mut() {
            bp.set_kept(kept);
        }
    }

    /// The fold epoch this node is done with (`tally status`'s
    /// `folds_applied`, the metric `tally_folds_done`), given the
    /// partitions it serves: the epoch applied, or by partition as
    /// [`ByPartition::done_where_kept`] says.
    pub fn folds_done(&self, serving: Option<&PartitionSet>) -> u64 {
        match &self.by_partition {
            Some(bp) => bp.done_where_kept(&self.book, serving),
            None => self.applied,
        }
    }

    /// The partition of `key`, once the node's partition count is known,
    /// for merges and applications to look scoped folds up by
    /// (`crdt/fold.rs`); `None` while no record folds a writer in some
    /// partitions only (none does yet), which spares hashing the key.
    pub fn partition_of(&self, key: &str) -> Option<u32> {
        if !self.book.has_scoped() {
            return None;
        }
        self.by_partition.as_ref().map(|bp| bp.of_key(key))
    }

    /// Fold epochs up to this one are applied to the counter `key`.
    pub fn applied_for(&self, key: &str) -> u64 {
        match &self.by_partition {
            Some(bp) => bp.applied(bp.of_key(key)),
            None => self.applied,
        }
    }

    /// A number that changes whenever an applied epoch does (the fold
    /// sweep's target): the applied epoch, or the sum over partitions.
    pub fn applied_mark(&self) -> u64 {
        match &self.by_partition {
            Some(bp) => bp.applied_sum(),
            None => self.applied,
        }
    }

    /// Applied epochs by partition for the next commit, if they changed.
    pub fn take_applied_partitions(&mut self) -> Option<Vec<(u32, u64)>> {
        self.by_partition.as_mut()?.take_applied()
    }

    /// A commit that carried [`Self::take_applied_partitions`] failed.
    pub fn restore_applied_partitions(&mut self) {
        if let Some(bp) = self.by_partition.as_mut() {
            bp.restore_applied();
        }
    }

    /// This node's digest of `writer`'s slots in `partition` (empty when
    /// partitions are not tracked).
    pub fn partition_digest_of(&self, writer: ReplicaId, partition: u32) -> WriterDigest {
        self.by_partition
            .as_ref()
            .map(|bp| bp.digest(writer, partition))
            .unwrap_or_default()
    }

    /// Adds a slot change of a commit to `changes` (see [`DigestChanges`]).
    /// Slots come with their phases ([`crate::crdt::FoldBook::phase`]): a
    /// slot whose phase moved leaves the old phase's digest and enters the
    /// new one's.
    pub fn note_change(
        &self,
        changes: &mut DigestChanges,
        key: &str,
        writer: ReplicaId,
        old: (Slot, u32),
        new: (Slot, u32),
    ) {
        // Whole digests are compared only by records without digests per
        // partition (clusters before version 10, which fold no writer in
        // some partitions only): values alone, as `compute_writer_digests`
        // computes them.
        changes
            .whole
            .entry(writer)
            .or_insert_with(|| self.digest_of(writer))
            .replace(key, old.0, new.0);
        let Some(bp) = &self.by_partition else {
            return;
        };
        let partition = bp.of_key(key);
        let mut change = |phase: u32, old: Slot, new: Slot| {
            changes
                .by_partition
                .entry((writer, partition, phase))
                .or_insert_with(|| bp.digest_at(writer, partition, phase))
                .replace(key, old, new);
        };
        if old.1 == new.1 {
            change(old.1, old.0, new.0);
        } else {
            change(old.1, old.0, Slot::default());
            change(new.1, Slot::default(), new.0);
        }
    }

    /// Sets writers' digests by partition to what a durable commit made them.
    /// Each is (writer, partition, phase, digest).
    pub fn set_partition_digests(&mut self, digests: &[(ReplicaId, u32, u32, WriterDigest)]) {
        if let Some(bp) = self.by_partition.as_mut() {
            for (writer, partition, phase, digest) in digests {
                bp.set_digest_at(*writer, *partition, *phase, *digest);
            }
        }
    }
}
