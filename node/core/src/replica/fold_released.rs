//! The trigger of a scoped retirement (`fold_scoped.rs`): a partition that
//! moved away from this node while it held slots of its own there. Pure;
//! the fold keeper drives it with the time.
//!
//! When a partition leaves the set this node keeps (its handoff is done:
//! every new owner confirmed holding this node's changes, and its copy is
//! being purged) and this node's digest of its own slots there is not
//! empty, the partition is *released*. Once it has stayed away for
//! `--retire-after` (the release time is persisted, so a restart does not
//! start the wait over), the node retires its slots there
//! ([`Folds::retire_partition`]). A released partition that comes back
//! before that is no longer released: the node writes its slot there on,
//! and it is retired at the next release.

use crate::crdt::ReplicaId;
use crate::partition::PartitionSet;

use super::Folds;

impl Folds {
    /// The partitions kept from now on by this node (`own`), noting those
    /// it released holding slots of its own, and forgetting the release
    /// of those it keeps again.
    pub fn set_kept_by(&mut self, own: ReplicaId, kept: Option<PartitionSet>) {
        if let Some(bp) = self.by_partition.as_ref() {
            for partition in 0..bp.count().get() {
                let keeps_now = kept
                    .as_ref()
                    .is_none_or(|set| set.contains(crate::partition::Partition(partition)));
                if keeps_now {
                    if self.released.remove(&partition).flatten().is_some() {
                        self.pending_released.push((partition, None));
                    }
                } else if bp.keeps(partition)
                    && bp.digest(own, partition) != crate::crdt::WriterDigest::default()
                {
                    self.released.entry(partition).or_insert(None);
                }
            }
        }
        self.set_kept(kept);
    }

    /// The partitions released and when (`None`: not stamped by a round
    /// yet).
    pub fn released(&self) -> impl Iterator<Item = (u32, Option<u64>)> + '_ {
        self.released.iter().map(|(p, since)| (*p, *since))
    }

    /// One round of the trigger at `now_ms`: stamps the partitions released
    /// since the last round, and, once partitions are tracked, retires this
    /// node's (`own`) slots in each released for `retire_after_ms`.
    /// Returns the partitions retired now.
    pub fn retire_released(
        &mut self,
        own: ReplicaId,
        now_ms: u64,
        retire_after_ms: u64,
    ) -> Vec<u32> {
        let allowed = self.agrees_by_partition();
        let mut due = Vec::new();
        for (partition, since) in self.released.iter_mut() {
            let since = *since.get_or_insert_with(|| {
                self.pending_released.push((*partition, Some(now_ms)));
                now_ms
            });
            if allowed && now_ms.saturating_sub(since) >= retire_after_ms {
                due.push(*partition);
            }
        }
        let mut retired = Vec::new();
        for partition in due {
            self.released.remove(&partition);
            self.pending_released.push((partition, None));
            if self.retire_partition(own, partition) {
                retired.push(partition);
            }
        }
        retired
    }

    /// The release times recovered from disk.
    pub fn recover_released(&mut self, released: Vec<(u32, u64)>) {
        for (partition, since) in released {
            self.released.insert(partition, Some(since));
        }
    }

    /// Release times set (`Some`) or cleared (`None`) since the last
    /// commit, for it to persist.
    pub fn take_pending_released(&mut self) -> Vec<(u32, Option<u64>)> {
        std::mem::take(&mut self.pending_released)
    }

    /// A failed commit: its release changes go first in the next one.
    pub fn restore_pending_released(&mut self, mut changes: Vec<(u32, Option<u64>)>) {
        changes.append(&mut self.pending_released);
        self.pending_released = changes;
    }
}
