//! The replica directory: which region every known replica belongs to, with
//! the entries learned since the last commit and an order-independent digest
//! of the whole map.
//!
//! Invariants: an entry never changes once known (a chunk that claims
//! another region for a known replica is refused before it gets here), so
//! the digest is the wrapping sum of one hash per entry and two directories
//! with equal digests hold the same entries (up to a 64-bit hash collision).
//! A source sends its whole directory with its digest; the puller learns
//! every entry and sends the digest back with its next pulls, and while it
//! is still the source's digest the source leaves the directory out, since
//! every replica with a slot in its chunks is one the puller knows
//! (replication bytes per add, issue #5).

use std::collections::BTreeMap;

use crate::crdt::{stable_hash, ReplicaId};

/// Seed of the per-entry hash (distinct from the counter digest's).
const DIRECTORY_SEED: u64 = 0x7461_6c6c_7964_6972; // "tallydir"

/// Replica → region, the entries not yet committed, and the digest.
#[derive(Debug, Default)]
pub(crate) struct Directory {
    regions: BTreeMap<ReplicaId, String>,
    pending: Vec<(ReplicaId, String)>,
    digest: u64,
}

impl Directory {
    /// The directory as recovered from disk (nothing pending).
    pub(crate) fn recovered(entries: impl IntoIterator<Item = (ReplicaId, String)>) -> Self {
        let mut directory = Directory::default();
        for (replica, region) in entries {
            directory.digest = directory.digest.wrapping_add(entry_hash(replica, &region));
            directory.regions.insert(replica, region);
        }
        directory
    }

    /// The region of `replica`, if known.
    pub(crate) fn get(&self, replica: &ReplicaId) -> Option<&String> {
        self.regions.get(replica)
    }

    /// Whether `replica`'s region is known.
    pub(crate) fn contains(&self, replica: &ReplicaId) -> bool {
        self.regions.contains_key(replica)
    }

    /// Learns a new entry, to be written with the next commit; a replica
    /// already known is left as it is (the caller refuses a conflict first).
    pub(crate) fn learn(&mut self, replica: ReplicaId, region: String) {
        if self.regions.contains_key(&replica) {
            return;
        }
        self.digest = self.digest.wrapping_add(entry_hash(replica, &region));
        self.regions.insert(replica, region.clone());
        self.pending.push((replica, region));
    }

    /// Forgets a folded writer's entry (its deletion is written with the
    /// next commit by the caller). Returns whether it was known.
    pub(crate) fn forget(&mut self, replica: ReplicaId) -> bool {
        let Some(region) = self.regions.remove(&replica) else {
            return false;
        };
        self.digest = self.digest.wrapping_sub(entry_hash(replica, &region));
        self.pending.retain(|(id, _)| *id != replica);
        true
    }

    /// Every entry, by replica id.
    pub(crate) fn entries(&self) -> Vec<(ReplicaId, String)> {
        self.regions
            .iter()
            .map(|(replica, region)| (*replica, region.clone()))
            .collect()
    }

    /// The digest of every entry.
    pub(crate) fn digest(&self) -> u64 {
        self.digest
    }

    /// Whether entries wait to be committed.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The entries to write with a commit.
    pub(crate) fn take_pending(&mut self) -> Vec<(ReplicaId, String)> {
        std::mem::take(&mut self.pending)
    }

    /// Entries of a failed commit, to write with the next one.
    pub(crate) fn restore_pending(&mut self, entries: Vec<(ReplicaId, String)>) {
        self.pending.extend(entries);
    }
}

fn entry_hash(replica: ReplicaId, region: &str) -> u64 {
    stable_hash(
        DIRECTORY_SEED,
        &[&replica.0.to_le_bytes(), region.as_bytes()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_depends_on_the_entries_not_their_order() {
        let mut learned = Directory::default();
        learned.learn(ReplicaId(2), "us-east".into());
        learned.learn(ReplicaId(1), "eu-west".into());
        let recovered = Directory::recovered([
            (ReplicaId(1), "eu-west".to_owned()),
            (ReplicaId(2), "us-east".to_owned()),
        ]);
        assert_eq!(learned.digest(), recovered.digest());
        assert_eq!(learned.take_pending().len(), 2);
        assert!(!recovered.has_pending());

        let other_region = Directory::recovered([
            (ReplicaId(1), "eu-west".to_owned()),
            (ReplicaId(2), "ap-south".to_owned()),
        ]);
        assert_ne!(other_region.digest(), recovered.digest());
        let fewer = Directory::recovered([(ReplicaId(1), "eu-west".to_owned())]);
        assert_ne!(fewer.digest(), recovered.digest());
    }
}
