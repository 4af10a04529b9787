//! The replica's side of retiring and folding writers: retirement by an
//! operator or by replacement, a round of the fold protocol on the members'
//! reports (`folds.rs`), fencing, and the fold sweep that brings every stored
//! counter to the applied epoch in bounded steps.
//!
//! Invariants kept here: a fenced replica (its id retired) takes no add; a
//! counter is folded only up to the epoch this node may apply (its state of
//! every writer of the record is the record's, see [`Folds`]); a fold
//! changes a counter like any other change, so it reaches the disk through
//! the group commit in the same atomic batch as the fold record and the
//! applied epoch, and after a crash the sweep resumes from what is durable
//! (folding a counter twice changes nothing).

use crate::crdt::{FoldBook, FoldError, FoldRecord, PnCounter, ReplicaId, Slot, WriterDigest};

use super::fold_partitions::{ComputedDigests, SavedDigests};
use super::folds::{FoldMember, Folds, RetireRefused};
use super::types::{Cursor, DurableState, StorageError};
use super::{AddRefused, Replica};

/// The store-wide fold pass: which epoch every stored counter is folded up
/// to, and the pass in progress.
#[derive(Debug, Default)]
pub(super) struct FoldSweep {
    swept: u64,
    running: Option<Pass>,
    /// Every cached counter is folded up to this epoch: a counter enters
    /// the cache folded to the applied epoch ([`Replica::entry`]), so the
    /// cache needs a pass only when that epoch moves.
    cached: u64,
}

#[derive(Debug)]
struct Pass {
    target: u64,
    after: Cursor,
    stop_seq: u64,
}

impl FoldSweep {
    pub(super) fn recovered(swept: u64) -> Self {
        FoldSweep {
            swept,
            running: None,
            cached: 0,
        }
    }

    /// Every stored counter is folded up to this epoch.
    pub(super) fn swept(&self) -> u64 {
        self.swept
    }
}

/// One writer's slot before and after a commit, each with its phase
/// ([`FoldBook::phase`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct SlotChange {
    pub writer: ReplicaId,
    pub old: (Slot, u32),
    pub new: (Slot, u32),
}

/// The writers whose slot differs between `old` and `new` (a counter of
/// `partition`), with both slots (an absent slot is empty) and their
/// phases: a slot whose value stayed but whose phase moved (a merge took a
/// newer phase's slot of the same value) changed too. One pass over the
/// two sorted lists.
pub(super) fn changed_slots(
    old: Option<&PnCounter>,
    new: &PnCounter,
    book: &FoldBook,
    partition: Option<u32>,
) -> Vec<SlotChange> {
    let old_epoch = old.map_or(0, |counter| counter.folded().epoch);
    let new_epoch = new.folded().epoch;
    let old = old.map_or(&[][..], PnCounter::slots);
    let new = new.slots();
    let mut changed = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        let (writer, before, after) = match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.0 == b.0 => {
                i += 1;
                j += 1;
                (a.0, a.1, b.1)
            }
            (Some(a), Some(b)) if a.0 < b.0 => {
                i += 1;
                (a.0, a.1, Slot::default())
            }
            (Some(a), None) => {
                i += 1;
                (a.0, a.1, Slot::default())
            }
            (_, Some(b)) => {
                j += 1;
                (b.0, Slot::default(), b.1)
            }
            (None, None) => break,
        };
        let old_phase = book.phase(writer, partition, old_epoch);
        let new_phase = book.phase(writer, partition, new_epoch);
        if before != after || (old_phase != new_phase && before != Slot::default()) {
            changed.push(SlotChange {
                writer,
                old: (before, old_phase),
                new: (after, new_phase),
            });
        }
    }
    changed
}

impl Replica {
    /// Retired writers, fold records, digests and why folds wait.
    pub fn folds(&self) -> &Folds {
        &self.folds
    }

    /// Remembers the members' node names (`Folds::note_node_names`); the
    /// fold keeper calls it every round, before its cluster folds too.
    pub fn note_node_names(&mut self, members: &[FoldMember]) {
        self.folds.note_node_names(members);
    }

    /// The fold epoch this node is done with (`Folds::folds_done`, over
    /// the partitions it serves).
    pub fn folds_done(&self) -> u64 {
        self.folds.folds_done(self.serving())
    }

    /// The members as the fold protocol sees them: the peer book's members
    /// (from gossip) with their last fold reports.
    pub fn fold_members(&self) -> Vec<FoldMember> {
        self.peers
            .peers()
            .map(|peer| FoldMember {
                replica: peer.member.replica,
                alive: peer.member.alive,
                node_name: peer.member.node_name.clone(),
                report: peer.member.folds.clone(),
            })
            .collect()
    }

    /// Sets this node's partition count (the data directory's) and starts
    /// keeping fold state by partition: each writer's digest per partition
    /// (`fold_partitions.rs`), maintained by every commit after. They come
    /// from `saved` (what [`Self::saved_partition_digests`] gave at the last
    /// clean stop) when it is current, and are otherwise computed by
    /// `compute`, which reads every stored counter once (given this node's
    /// fold book). Returns whether `saved` was used. The store's side
    /// (decoding `saved`, the reads) is `storage::set_partition_count`.
    pub fn set_partition_count_with(
        &mut self,
        count: crate::partition::PartitionCount,
        saved: Option<SavedDigests>,
        compute: impl FnOnce(&FoldBook) -> Result<ComputedDigests, StorageError>,
    ) -> Result<bool, StorageError> {
        self.peers.set_own_partitions(count.get());
        if self.folds.partition_count() == Some(count) {
            return Ok(false);
        }
        let current = saved.filter(|saved| {
            saved.durable_seq == self.durable_seq && saved.partitions == count.get()
        });
        let used = current.is_some();
        let (writers, sets) = match current {
            Some(saved) => ((saved.writers, Default::default()), saved.sets),
            None => compute(self.folds.book())?,
        };
        self.folds.track_partitions(count, writers);
        self.folds.set_kept(self.kept().cloned());
        self.sets.track_partitions(count, sets);
        Ok(used)
    }

    /// The writers' digests by partition of the durable state, for the next
    /// start (a clean stop saves them once nothing is committing; `None`
    /// when partitions are not tracked or a commit is in flight). The store
    /// encodes them (`storage::saved_partition_digests`).
    pub fn saved_partition_digests(&self) -> Option<SavedDigests> {
        if self.in_flight.is_some() {
            return None;
        }
        let (count, digests, later) = self.folds.partition_digests()?;
        if !later.is_empty() {
            // The saved form has no phases: computed again at the start.
            return None;
        }
        Some(SavedDigests {
            durable_seq: self.durable_seq,
            partitions: count.get(),
            writers: digests.clone(),
            sets: self.sets.partition_digests()?.to_vec(),
        })
    }

    /// What this node publishes of retirements and folds: its fold report,
    /// with (once folds go by partition) its digest of the partitions it
    /// shares with each other member whose kept partitions it knows.
    pub fn fold_report(&self) -> super::folds::FoldReport {
        let mut report = self.folds.report();
        let (Some(own), Some(count), Some(sets)) = (
            report.partitions.as_mut(),
            self.folds.partition_count(),
            self.sets.partition_digests(),
        ) else {
            return report;
        };
        let counters = self.folds.counter_digests().unwrap_or_default();
        for peer in self.peers.peers() {
            let Some(theirs) = peer
                .member
                .folds
                .as_ref()
                .and_then(|folds| folds.partitions.as_ref())
                .filter(|theirs| {
                    theirs
                        .kept
                        .as_ref()
                        .is_none_or(|kept| kept.count() == count)
                })
            else {
                continue;
            };
            let both =
                super::convergence::kept_by_both(count, own.kept.as_ref(), theirs.kept.as_ref());
            own.shared.push((
                peer.member.replica,
                super::convergence::shared_digest(both, &counters, sets),
            ));
        }
        report
    }

    /// True when this replica's own id was retired: it must not serve.
    pub fn is_fenced(&self) -> bool {
        self.folds.is_retired(self.identity.replica)
    }

    /// Holds adds until `until_ms` or until [`Replica::release_restart_hold`]:
    /// set at start on a recovered directory that has peers, so that a
    /// replica retired while it was down takes no add before a peer's fold
    /// report tells it so (and it fences itself).
    pub fn hold_adds_until(&mut self, until_ms: u64) {
        self.restart_hold_until_ms = Some(until_ms);
    }

    /// Ends the restart hold (a round of the fold protocol ran on a live
    /// peer's report). Returns whether a hold was on. Safe even when that
    /// peer has not heard of a retirement of this replica: while this node
    /// is up, no member folds it before its own report shows it fenced
    /// (see [`Folds`]).
    pub fn release_restart_hold(&mut self) -> bool {
        self.restart_hold_until_ms.take().is_some()
    }

    /// Whether adds are held at `now_ms`.
    pub fn restart_hold_on(&self, now_ms: u64) -> bool {
        self.restart_hold_remaining(now_ms).is_some()
    }

    /// How long adds are held at most from `now_ms`, if they are.
    pub fn restart_hold_remaining(&self, now_ms: u64) -> Option<u64> {
        self.restart_hold_until_ms
            .filter(|until| now_ms < *until)
            .map(|until| until - now_ms)
    }

    pub(super) fn check_restart_hold(&mut self, now_ms: u64) -> Result<(), AddRefused> {
        match self.restart_hold_until_ms {
            Some(until) if now_ms < until => Err(AddRefused::HeldAfterRestart {
                replica: self.identity.replica,
                remaining_ms: until - now_ms,
            }),
            Some(_) => {
                // The bound passed with no peer heard: serve.
                self.restart_hold_until_ms = None;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Whether a restart hold is needed at all: the recovered directory knows
    /// another replica, or it holds committed state and the node has seeds.
    /// A fresh directory (a new id nobody can have retired) and a node that
    /// never had a peer (a single-node cluster) need none.
    pub fn needs_restart_hold(&self, has_seeds: bool) -> bool {
        let own = self.identity.replica;
        let knows_peer = self
            .directory
            .entries()
            .into_iter()
            .any(|(replica, _)| replica != own);
        knows_peer || (has_seeds && self.durable_seq > 0)
    }

    /// Every stored counter is folded up to this epoch.
    pub fn fold_swept(&self) -> u64 {
        self.fold_sweep.swept
    }

    /// Refuses an add to `key` while this node's slots in its partition
    /// wait for a fold (`folds::WriteGate`).
    pub(super) fn check_write_gate(&self, key: &str) -> Result<(), AddRefused> {
        if !self.folds.gates_writes() {
            return Ok(());
        }
        let Some(partition) = self.partition_of(key) else {
            return Ok(());
        };
        Ok(self.folds.writes_in(self.identity.replica, partition.0)?)
    }

    /// The partitions of `kept` this node may not write yet (its slots
    /// there wait for a fold): the handoff holds them back from serving.
    pub fn write_gated(
        &self,
        kept: &crate::partition::PartitionSet,
    ) -> crate::partition::PartitionSet {
        self.folds.write_gated(self.identity.replica, kept)
    }

    /// `partition` was copied in from every up-to-date holder and is held
    /// back: its applied epoch rises past records this node holds no slot
    /// of there (`Folds::raise_copied`). Returns the epoch applied now.
    pub fn raise_copied(&mut self, partition: crate::partition::Partition) -> u64 {
        let epoch = self.folds.raise_copied(partition.0);
        self.fold_cached();
        epoch
    }

    /// `tally admin retire`: retires `writer` (persisted with the next
    /// commit). Refused for this node's own id, an id it never heard of, and
    /// a live member.
    pub fn handle_retire(
        &mut self,
        writer: ReplicaId,
        members: &[FoldMember],
    ) -> Result<bool, RetireRefused> {
        // A folded writer's directory entry is pruned; it is still known.
        let known = self.directory.contains(&writer) || self.folds.is_retired(writer);
        self.folds
            .retire(writer, self.identity.replica, known, members)
    }

    /// One round of the fold protocol on the members' latest reports:
    /// retires replaced incarnations (when `retire_after_ms` is set), learns
    /// and commits fold records, and folds cached counters up to the epoch
    /// this node may apply. Returns the records committed or adopted.
    pub fn handle_fold_round(
        &mut self,
        now_ms: u64,
        node_name: &str,
        members: &[FoldMember],
        retire_after_ms: Option<u64>,
    ) -> Result<Vec<FoldRecord>, FoldError> {
        let own = self.identity.replica;
        if let Some(after) = retire_after_ms {
            self.folds
                .retire_replaced(now_ms, own, node_name, members, after);
            for partition in self.folds.retire_released(own, now_ms, after) {
                tracing::info!(partition, "a partition moved away from this node for --retire-after: its slots there are retired, to be folded once the partition's keepers agree; it takes no add there until then");
            }
        }
        // Every replica learned of by state, and every member gossip shows
        // (a member counts before any of its state reached this node).
        let mut counted: Vec<ReplicaId> = self
            .directory
            .entries()
            .into_iter()
            .map(|(replica, _)| replica)
            .collect();
        for member in members {
            if !self.directory.contains(&member.replica) {
                counted.push(member.replica);
            }
        }
        counted.retain(|replica| *replica != own);
        #[cfg(feature = "planted-bugs")]
        let counted = match self.config.planted_bug {
            Some(super::PlantedBug::FoldBeforeAgreement) => counted
                .into_iter()
                .filter(|replica| members.iter().any(|m| m.replica == *replica && m.alive))
                .collect(),
            _ => counted,
        };
        let directory = &self.directory;
        // A node knows its own slots by state (a scoped retirement of its
        // own is folded with its agreement).
        let committed = self
            .folds
            .handle_reports_knowing(&counted, members, &|writer| {
                writer == own || directory.contains(&writer)
            })?;
        // What this node kept of its own slots in partitions it no longer
        // keeps is folded now: the purge deletes it (`purge.rs`).
        if committed
            .iter()
            .any(|record| record.scoped.iter().any(|(writer, _)| *writer == own))
        {
            self.start_purge();
        }
        self.fold_cached();
        Ok(committed)
    }

    /// Prunes what this node keeps per folded writer besides fold records:
    /// its directory entry and its pull watermarks (deleted with the next
    /// commit, so the pruning survives a restart) and its in-memory peer
    /// state. Only once no stored counter holds a slot of the writer (its
    /// digest here is empty: the sweep folded them all, or this node never
    /// held any), so no counter still needs its region. Returns each writer
    /// pruned now, with its region if it was known, for the caller to drop
    /// its metric labels.
    pub fn prune_folded(&mut self) -> Vec<(ReplicaId, Option<String>)> {
        let own = self.identity.replica;
        let folded: Vec<ReplicaId> = self
            .folds
            .book()
            .records()
            .iter()
            .flat_map(|record| record.writers.iter().map(|(writer, _)| *writer))
            .filter(|writer| *writer != own)
            .filter(|writer| self.folds.digest_of(*writer) == WriterDigest::default())
            .collect();
        let mut pruned = Vec::new();
        for writer in folded {
            let region = self.directory.get(&writer).cloned().or_else(|| {
                self.peers
                    .peer(writer)
                    .map(|state| state.member.region.clone())
            });
            let had_entry = self.directory.forget(writer);
            let had_watermark = self.peers.forget(writer);
            if had_entry || had_watermark {
                self.pruned_pending.push(writer);
                pruned.push((writer, region));
            }
        }
        pruned
    }

    /// Folds every cached counter up to the epoch applied to its partition.
    fn fold_cached(&mut self) {
        let mark = self.folds.applied_mark();
        // Each fold round (every gossip interval) walked the whole cache
        // under the core's lock, fold or no fold: 3.5% of the machine's
        // samples in a join's profile with no writer retired.
        if mark == self.fold_sweep.cached {
            return;
        }
        self.fold_sweep.cached = mark;
        let mut changed = Vec::new();
        for (key, entry) in self.counters.iter_mut() {
            // A counter nobody wrote only takes the epoch (see `entry`).
            let written = !entry.live.is_empty();
            let applied = self.folds.applied_for(key);
            let partition = self.folds.partition_of(key);
            if entry
                .live
                .apply_folds(self.folds.book(), applied, partition)
                && written
            {
                changed.push(key.clone());
            }
        }
        for key in changed {
            self.mark_dirty(&key);
        }
    }

    /// One bounded step of the fold sweep: loads up to `limit` stored
    /// counters, folding each to the applied epoch (a folded counter is
    /// written by the next commit). Returns the counters visited; 0 when
    /// every stored counter is folded up to the applied epoch.
    pub fn poll_fold_sweep(
        &mut self,
        now_ms: u64,
        store: &(impl DurableState + ?Sized),
        limit: usize,
    ) -> Result<usize, StorageError> {
        // The mark moves whenever an applied epoch does (whole: the epoch;
        // by partition: their sum, which a pass is needed for whether it
        // rose or fell back).
        let mark = self.folds.applied_mark();
        if self.fold_sweep.swept == mark && self.fold_sweep.running.is_none() {
            return Ok(0);
        }
        let durable_seq = self.durable_seq;
        let pass = self.fold_sweep.running.get_or_insert_with(|| Pass {
            target: mark,
            after: Cursor::default(),
            // Counters written after this were folded as they were written.
            stop_seq: durable_seq,
        });
        let target = pass.target;
        let stop_seq = pass.stop_seq;
        let changes = store.changes_after(&pass.after, limit.max(1))?;
        let mut visited = 0;
        let mut done = changes.is_empty();
        for change in changes {
            if change.seq > stop_seq {
                done = true;
                break;
            }
            self.entry(store, &change.key, now_ms)?;
            visited += 1;
            if let Some(pass) = self.fold_sweep.running.as_mut() {
                pass.after = Cursor {
                    seq: change.seq,
                    key: change.key.to_string(),
                };
            }
        }
        if done {
            // Persisted with the next commit, after the counters it folded.
            self.fold_sweep.swept = target;
            self.fold_sweep.running = None;
            self.housekeeping_due = true;
        }
        Ok(visited.max(usize::from(done)))
    }
}

#[cfg(test)]
#[path = "retire_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "fold_scoped_replica_tests.rs"]
mod scoped_tests;
