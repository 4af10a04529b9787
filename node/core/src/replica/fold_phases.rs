//! The writers' digests a node keeps by partition and by phase ([`ByPartition`]'s
//! digest half; the rules that use them are in `fold_partitions.rs`): phase 0
//! in [`DigestsByPartition`], later phases (after folds of a live writer in a
//! partition, `fold_scoped.rs`) in [`LaterPhases`], and each (writer,
//! partition)'s current phase as the book's records set it. Kept apart so
//! that a fold compares the phase it folds only: invariant 9 rests on a
//! record being applied only where the node holds the writer's state it
//! names.

use std::collections::HashMap;

use crate::crdt::{FoldRecord, PartitionDigests, ReplicaId, WriterDigest};

use super::{ByPartition, DigestsByPartition, LaterPhases};

impl ByPartition {
    /// Every writer's digests by partition, phase 0.
    pub fn all_digests(&self) -> &DigestsByPartition {
        &self.digests
    }

    /// Every digest of a later phase.
    pub fn later_phases(&self) -> &LaterPhases {
        &self.later
    }

    /// A record was committed: the phases of the writers it folds in some
    /// partitions move on (their slots held now are of an earlier phase).
    pub fn note_record(&mut self, record: &FoldRecord) {
        note_phases(&mut self.phases, record);
    }

    /// The current phase of `writer`'s slots in `partition`.
    pub fn phase(&self, writer: ReplicaId, partition: u32) -> u32 {
        if self.phases.is_empty() {
            return 0;
        }
        self.phases.get(&(writer, partition)).copied().unwrap_or(0)
    }

    /// `writer`'s digest in `partition`, of its current phase.
    pub fn digest(&self, writer: ReplicaId, partition: u32) -> WriterDigest {
        self.digest_at(writer, partition, self.phase(writer, partition))
    }

    /// `writer`'s digest in `partition` of the slots of `phase`.
    pub fn digest_at(&self, writer: ReplicaId, partition: u32, phase: u32) -> WriterDigest {
        if phase > 0 {
            return self
                .later
                .get(&(writer, partition, phase))
                .copied()
                .unwrap_or_default();
        }
        self.digests
            .get(&writer)
            .and_then(|parts| parts.get(&partition))
            .copied()
            .unwrap_or_default()
    }

    /// The (partition, phase) of each non-empty digest of `writer` here.
    pub(super) fn held_in(&self, writer: ReplicaId) -> impl Iterator<Item = (u32, u32)> + '_ {
        let phase_0 = self.digests.get(&writer).into_iter().flatten();
        let later = self
            .later
            .range((writer, 0, 0)..=(writer, u32::MAX, u32::MAX))
            .map(|((_, partition, phase), digest)| ((*partition, *phase), digest));
        phase_0
            .map(|(partition, digest)| ((*partition, 0), digest))
            .chain(later)
            .filter(|(_, digest)| **digest != WriterDigest::default())
            .map(|(held, _)| held)
    }

    /// `writer`'s digests per partition, of each partition's current phase,
    /// empty ones left out.
    pub fn digests_of(&self, writer: ReplicaId) -> PartitionDigests {
        let mut digests: PartitionDigests = self
            .digests
            .get(&writer)
            .map(|parts| {
                parts
                    .iter()
                    .filter(|(p, _)| self.phase(writer, **p) == 0)
                    .map(|(p, d)| (*p, *d))
                    .collect()
            })
            .unwrap_or_default();
        if !self.later.is_empty() {
            let later = self
                .later
                .range((writer, 0, 0)..=(writer, u32::MAX, u32::MAX));
            digests.extend(
                later
                    .filter(|((_, p, phase), _)| self.phase(writer, *p) == *phase)
                    .map(|((_, p, _), d)| (*p, *d)),
            );
            digests.sort_unstable_by_key(|(partition, _)| *partition);
        }
        digests
    }

    /// Sets `writer`'s digest of `phase` in `partition` (an empty one is
    /// dropped).
    pub fn set_digest_at(
        &mut self,
        writer: ReplicaId,
        partition: u32,
        phase: u32,
        digest: WriterDigest,
    ) {
        if phase == 0 {
            self.set_digest(writer, partition, digest);
        } else if digest == WriterDigest::default() {
            self.later.remove(&(writer, partition, phase));
        } else {
            self.later.insert((writer, partition, phase), digest);
        }
    }

    /// Sets `writer`'s digest of phase 0 in `partition` (an empty one is
    /// dropped).
    pub fn set_digest(&mut self, writer: ReplicaId, partition: u32, digest: WriterDigest) {
        if digest == WriterDigest::default() {
            if let Some(parts) = self.digests.get_mut(&writer) {
                parts.remove(&partition);
                if parts.is_empty() {
                    self.digests.remove(&writer);
                }
            }
        } else {
            self.digests
                .entry(writer)
                .or_default()
                .insert(partition, digest);
        }
    }
}

/// Moves on the phase of each (writer, partition) `record` folds while the
/// writer lives on.
pub(super) fn note_phases(phases: &mut HashMap<(ReplicaId, u32), u32>, record: &FoldRecord) {
    for (writer, digests) in &record.scoped {
        for (partition, _) in digests {
            *phases.entry((*writer, *partition)).or_default() += 1;
        }
    }
}
