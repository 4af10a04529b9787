//! What the core needs of partition-scoped storage (issue 11, DESIGN.md
//! "Partitioned regions"): which partitions this replica serves, pulls
//! scoped to a set of partitions, and each partition's latest change. The
//! handoff state machine (`partition/handoff.rs`) decides; this is where the
//! core applies its decisions.
//!
//! - **Serving.** [`Replica::set_serving`] names the partitions this replica
//!   takes adds for and answers pulls of (`None`, the default: every one, as
//!   a node that stores every counter does). An add of a key in another
//!   partition (a counter, a like set or a uniques key) is refused with
//!   [`AddRefused::NotServed`], and changes nothing: a partition being
//!   copied in, or already handed away, never takes a write that its
//!   handoff would not account for.
//! - **Scoped pulls.** A [`PullRequest`](super::PullRequest) with a `scope`
//!   gets only the counters (and, for a caller of protocol version 9, the
//!   set deltas) of the scope's partitions that this replica serves, and
//!   the chunk says which those are
//!   ([`PullChunk::served`](super::PullChunk::served)): a puller counts a
//!   partition as copied from this replica only if it was served in every
//!   chunk of the pull (a partition still being copied in here is never
//!   passed on as if it were whole: invariant 8).
//! - **Latest change.** Once [`Replica::track_partition_changes`] is on,
//!   every commit stamps the partitions of its counters and sets with its
//!   sequence ([`Replica::latest_change`]). A releasing partition may be
//!   deleted only once its owners confirmed they pulled through that
//!   sequence, and [`Replica::partition_quiet`] says no change to it waits
//!   for a commit. Off until the node first releases a partition (the
//!   lifecycle keeper turns it on then): hashing every committed key would
//!   cost the single-node path for nothing.
//! - **Departing.** Once its node drains or has left
//!   ([`Replica::set_departing`]), this replica never takes a partition
//!   again, so it needs no slot of its own in the partitions it no longer
//!   keeps: their purge deletes its counters whole instead of keeping its
//!   slot to continue from (`purge.rs`), and a drained node holds nothing.

use crate::partition::{Partition, PartitionCount, PartitionSet};

use super::types::Key;
use super::{AddRefused, PullRefused, Replica};

/// The core's partition scoping (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Scope {
    /// The partitions served; `None`: every one.
    serving: Option<PartitionSet>,
    /// The partitions kept (served, being copied in, or being handed away);
    /// `None`: every one.
    kept: Option<PartitionSet>,
    /// Per partition, the sequence of the latest commit that changed it,
    /// while tracking is on.
    latest_change: Option<(PartitionCount, Vec<u64>)>,
    /// This replica never takes a partition again (its node drains or
    /// has left).
    departing: bool,
}

impl Scope {
    /// Stamps the partition of `key` as changed by commit `seq`.
    pub(super) fn note_change(&mut self, key: &str, seq: u64) {
        if let Some((count, latest)) = &mut self.latest_change {
            let slot = &mut latest[count.of_key(key.as_bytes()).0 as usize];
            *slot = (*slot).max(seq);
        }
    }
}

impl Replica {
    /// The partitions this replica serves from now on (`None`: every one).
    /// Pulls answered after this serve only these, and adds of keys of other
    /// partitions are refused. A full set is kept as `None`: it means the
    /// same, and then no request hashes its key (a single node, or a region
    /// whose every node holds every partition, pays nothing).
    pub fn set_serving(&mut self, serving: Option<PartitionSet>) {
        self.scope.serving = serving.filter(|set| !set.is_full());
    }

    /// The partitions this replica serves (`None`: every one).
    pub fn serving(&self) -> Option<&PartitionSet> {
        self.scope.serving.as_ref()
    }

    /// The partitions this replica keeps from now on (`None`: every one).
    /// A pulled chunk's counters of other partitions are dropped unmerged:
    /// a pull still in flight when a partition was deleted here must not
    /// store it again after its purge (nothing would purge it again).
    pub fn set_kept(&mut self, kept: Option<PartitionSet>) {
        self.scope.kept = kept.filter(|set| !set.is_full());
        let own = self.identity.replica;
        self.folds.set_kept_by(own, self.scope.kept.clone());
    }

    /// Whether this replica's node drains or has left: it never owns a
    /// partition again (a drain is not undone, and a node that left is
    /// started again only on a wiped data directory, as a new replica), so
    /// the purge drops its own slots too (see the module documentation).
    /// Returns true when this turns it on: start a purge pass then, for
    /// the counters already cut down to this replica's slot.
    pub fn set_departing(&mut self, departing: bool) -> bool {
        let started = departing && !self.scope.departing;
        self.scope.departing = departing;
        started
    }

    /// Whether this replica is departing (see [`Self::set_departing`]).
    pub fn departing(&self) -> bool {
        self.scope.departing
    }

    /// The partitions this replica keeps (`None`: every one).
    pub fn kept(&self) -> Option<&PartitionSet> {
        self.scope.kept.as_ref()
    }

    /// Whether `key`'s partition is kept here.
    pub(super) fn keeps(&self, key: &str) -> bool {
        self.scope
            .kept
            .as_ref()
            .is_none_or(|kept| kept.contains(kept.count().of_key(key.as_bytes())))
    }

    /// Starts stamping each partition's latest change (see the module
    /// documentation), for a cluster of `count` partitions. Commits before
    /// this count as changes at `since_seq` for every partition.
    pub fn track_partition_changes(&mut self, count: PartitionCount, since_seq: u64) {
        if self.scope.latest_change.is_none() {
            self.scope.latest_change = Some((count, vec![since_seq; count.get() as usize]));
        }
    }

    /// The sequence of the latest commit that changed `partition`, while
    /// tracking is on (`None` otherwise).
    pub fn latest_change(&self, partition: Partition) -> Option<u64> {
        let (_, latest) = self.scope.latest_change.as_ref()?;
        latest.get(partition.0 as usize).copied()
    }

    /// Whether no change to `partition` waits for a commit or is being
    /// committed: with [`Self::latest_change`] at most the durable sequence,
    /// everything this replica holds of it is durable.
    pub fn partition_quiet(&self, count: PartitionCount, partition: Partition) -> bool {
        let of = |key: &Key| count.of_key(key.as_bytes()) == partition;
        let committing = self.in_flight.as_ref().is_some_and(|batch| {
            batch.counters.iter().any(|(key, _)| of(key))
                || batch.likes.iter().any(|write| of(&write.key))
                || batch.uniques.iter().any(|write| of(&write.key))
        });
        !committing && !self.dirty.iter().any(of) && !self.sets.has_dirty_in(of)
    }

    /// The commit sequence whose durability makes every change made so far
    /// durable: the last handed out, or the next one while changes wait for
    /// a commit. A puller waits for it before it vouches for what it merged.
    pub fn changes_durable_at(&self) -> u64 {
        if self.dirty.is_empty() && !self.sets.has_dirty_in(|_| true) {
            self.last_seq
        } else {
            self.last_seq + 1
        }
    }

    /// Refuses an add or a read of `key` when its partition is not served
    /// here: this node may hold nothing of it, or a copy still coming in.
    pub fn check_served(&self, key: &str) -> Result<(), AddRefused> {
        let Some(serving) = &self.scope.serving else {
            return Ok(());
        };
        let partition = serving.count().of_key(key.as_bytes());
        if serving.contains(partition) {
            return Ok(());
        }
        Err(AddRefused::NotServed {
            key: key.to_string(),
            partition: partition.0,
        })
    }

    /// The partition of `key` under this node's partition count, if it has
    /// one (a node that stores every counter may have none).
    pub(super) fn partition_of(&self, key: &str) -> Option<Partition> {
        let count = match &self.scope.serving {
            Some(serving) => serving.count(),
            None => PartitionCount::new(u64::from(self.peers.own_partitions())).ok()?,
        };
        Some(count.of_key(key.as_bytes()))
    }

    /// Refuses a pull scope drawn from another partition count than this
    /// node's (a stranger's, or a member's of another cluster layout):
    /// comparing it with the partitions served would mean nothing.
    pub(super) fn check_scope(&self, scope: &PartitionSet) -> Result<(), PullRefused> {
        let theirs = scope.count().get();
        let ours = match &self.scope.serving {
            Some(serving) => serving.count().get(),
            None => self.peers.own_partitions(),
        };
        if ours != 0 && ours != theirs {
            return Err(PullRefused::PartitionCount { ours, theirs });
        }
        Ok(())
    }

    /// The partitions of `requested` this replica serves, for the answer to
    /// a scoped pull (its count checked by [`Self::check_scope`]).
    pub(super) fn served_of(&self, requested: &PartitionSet) -> PartitionSet {
        match &self.scope.serving {
            Some(serving) => requested.intersection(serving),
            None => requested.clone(),
        }
    }
}

#[cfg(test)]
#[path = "scope_tests.rs"]
mod tests;
