//! Folding a live writer's slots of a partition that moved away from it
//! (issue 13, item 1): the retirements, the agreement among the
//! partition's keepers, and the gate the writer passes before it writes
//! the partition again. Pure; `folds.rs` runs it in its rounds.
//!
//! - A **scoped retirement** `(W, p, phase)` says writer `W` (alive, and
//!   serving other partitions) writes no more in partition `p` until the
//!   fold of its slots there: the `phase`-th such fold of the pair (0
//!   first). `W` makes it, once `p` was handed away from it (its new
//!   owners caught up and its own copy purged) and stayed away for
//!   `--retire-after`; members learn it from reports. It is done once the
//!   book holds `phase + 1` scoped folds of the pair.
//! - **The promise**: a node that lists `(own, p, phase)` takes no add in
//!   `p` ([`Folds::writes_in`]) until that fold is committed and applied
//!   to its counters of `p`. So while `W` is up, a fold of the pair waits
//!   for `W`'s report to list it; a `W` that is down holds its adds at the
//!   restart until it heard a live member's report (the restart hold), and
//!   a member that has not heard of the retirement has agreed to nothing.
//! - **Agreement**: every counted member that keeps `p` reports the same
//!   digest of `W`'s slots in `p` of the phase folded (slots of different
//!   phases are digested apart, `fold_partitions.rs`), and at least one
//!   member keeps `p`. The record names the digest
//!   ([`FoldRecord::scoped`]) and each node applies it to `p` only where
//!   its own digest is the record's (invariant 9, as for whole folds).
//! - **The gate**: `W` writes `p` again only once its applied epoch of `p`
//!   reached the pair's last fold: every counter of `p` it writes is then
//!   folded past it, and its new slot there starts from 0 in the new
//!   phase, which merges never take for the old one.

use std::collections::{BTreeMap, HashMap};

use crate::crdt::{ReplicaId, WriterDigest};
use crate::partition::PartitionSet;

use super::{FoldMember, FoldReport, FoldWait, Folds};
use crate::replica::fold_partitions::{keeps, PartitionReport};

/// A live writer's slots in one partition, retired (see the module
/// documentation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ScopedRetirement {
    /// The writer.
    pub writer: ReplicaId,
    /// The partition it no longer writes.
    pub partition: u32,
    /// Which of its phases there: 0 before any fold of the pair.
    pub phase: u32,
}

impl std::fmt::Display for ScopedRetirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "writer {} in partition {} (phase {})",
            self.writer, self.partition, self.phase
        )
    }
}

/// Why this node takes no add in a partition now ([`Folds::writes_in`]).
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum WriteGate {
    /// Its slots there are retired and not folded yet.
    #[error("this node's slots in partition {partition} are retired (phase {phase}) and wait for their fold; another owner takes the adds")]
    Retired {
        /// The partition.
        partition: u32,
        /// The phase retired.
        phase: u32,
    },
    /// Its last fold there is committed but not applied here yet.
    #[error("this node's slots in partition {partition} were folded at epoch {epoch}, applied here up to {applied} only; it writes there again once its counters reach the fold")]
    NotApplied {
        /// The partition.
        partition: u32,
        /// The fold's epoch.
        epoch: u64,
        /// The epoch applied to the partition here.
        applied: u64,
    },
}

impl Folds {
    /// Retires this node's (`own`) slots in `partition`, in their current
    /// phase. Returns false when that retirement was made already (or the
    /// node does not track partitions). From then on the node takes no add
    /// in `partition` until the fold (see [`Self::writes_in`]).
    pub fn retire_partition(&mut self, own: ReplicaId, partition: u32) -> bool {
        let Some(bp) = self.by_partition.as_ref() else {
            return false;
        };
        if partition >= bp.count().get() {
            return false;
        }
        let retirement = ScopedRetirement {
            writer: own,
            partition,
            phase: self.book.scoped_epochs(own, partition).len() as u32,
        };
        self.learn_scoped(retirement)
    }

    pub(super) fn learn_scoped(&mut self, retirement: ScopedRetirement) -> bool {
        // A retirement of a folded phase is done: nothing to learn.
        let done = self
            .book
            .scoped_epochs(retirement.writer, retirement.partition)
            .len() as u32
            > retirement.phase;
        if done || !self.retired_scoped.insert(retirement) {
            return false;
        }
        self.pending_scoped.push((retirement, true));
        true
    }

    /// The scoped retirements recovered from disk (unfolded at the last
    /// commit; one folded since by a record recovered with it is dropped).
    pub fn recover_scoped(&mut self, retired: Vec<ScopedRetirement>) {
        for retirement in retired {
            let done = self
                .book
                .scoped_epochs(retirement.writer, retirement.partition)
                .len() as u32
                > retirement.phase;
            if !done {
                self.retired_scoped.insert(retirement);
            }
        }
    }

    /// The scoped retirements to write (`true`) or delete (`false`) with
    /// the next commit.
    pub fn take_pending_scoped(&mut self) -> Vec<(ScopedRetirement, bool)> {
        std::mem::take(&mut self.pending_scoped)
    }

    /// A failed commit: its scoped retirements go first in the next one.
    pub fn restore_pending_scoped(&mut self, mut changes: Vec<(ScopedRetirement, bool)>) {
        changes.append(&mut self.pending_scoped);
        self.pending_scoped = changes;
    }

    /// Scoped retirements not folded yet, of writers not retired whole (a
    /// writer retired whole is folded in every partition at once).
    pub fn unfolded_scoped(&self) -> impl Iterator<Item = ScopedRetirement> + '_ {
        self.retired_scoped.iter().copied().filter(|r| {
            !self.is_retired(r.writer)
                && self.book.scoped_epochs(r.writer, r.partition).len() as u32 == r.phase
        })
    }

    /// Why each unfolded scoped retirement waits (as of the last round).
    pub fn scoped_waits(&self) -> &BTreeMap<ScopedRetirement, FoldWait> {
        &self.scoped_waits
    }

    /// Whether any write may be gated: some scoped retirement or scoped
    /// fold exists (the add path's one check otherwise).
    pub fn gates_writes(&self) -> bool {
        !self.retired_scoped.is_empty() || self.book.has_scoped()
    }

    /// Whether this node (replica `own`) may take an add in `partition`
    /// now: not while its slots there are retired and unfolded (its
    /// promise), nor before its counters of `partition` reached the last
    /// fold of its slots there.
    pub fn writes_in(&self, own: ReplicaId, partition: u32) -> Result<(), WriteGate> {
        if !self.gates_writes() {
            return Ok(());
        }
        if let Some(r) = self
            .unfolded_scoped()
            .find(|r| r.writer == own && r.partition == partition)
        {
            return Err(WriteGate::Retired {
                partition,
                phase: r.phase,
            });
        }
        let Some(&epoch) = self.book.scoped_epochs(own, partition).last() else {
            return Ok(());
        };
        let applied = self
            .by_partition
            .as_ref()
            .map_or(self.applied, |bp| bp.applied(partition));
        if applied < epoch {
            return Err(WriteGate::NotApplied {
                partition,
                epoch,
                applied,
            });
        }
        Ok(())
    }

    /// The partitions of `kept` in which this node (`own`) may not take an
    /// add now ([`Self::writes_in`]).
    pub fn write_gated(&self, own: ReplicaId, kept: &PartitionSet) -> PartitionSet {
        let mut gated = PartitionSet::empty(kept.count());
        if !self.gates_writes() {
            return gated;
        }
        for partition in kept.iter() {
            if self.writes_in(own, partition.0).is_err() {
                gated.insert(partition);
            }
        }
        gated
    }

    /// `partition` was copied in from every up-to-date holder: its applied
    /// epoch rises past the records whose writers this node holds no slot
    /// of there (`ByPartition::raise_copied`), which may open this node's
    /// gate there. Returns the epoch applied now.
    pub fn raise_copied(&mut self, partition: u32) -> u64 {
        let Some(bp) = self.by_partition.as_mut() else {
            return self.applied;
        };
        bp.raise_copied(&self.book, partition)
    }

    /// What this node reports of its scoped retirements: the unfolded ones
    /// it knows, and its digest of each in a partition it keeps.
    pub(super) fn scoped_report(
        &self,
    ) -> (Vec<ScopedRetirement>, Vec<(ScopedRetirement, WriterDigest)>) {
        let retired: Vec<ScopedRetirement> = self.unfolded_scoped().collect();
        let Some(bp) = self.by_partition.as_ref() else {
            return (retired, Vec::new());
        };
        let digests = retired
            .iter()
            .filter(|r| bp.keeps(r.partition))
            .map(|r| (*r, bp.digest_at(r.writer, r.partition, r.phase)))
            .collect();
        (retired, digests)
    }

    /// This round's scoped part of the candidate for epoch `next`: what
    /// our candidate holds, the retirements agreed now, and what other
    /// members' candidates propose that this node agrees with (it knows
    /// the retirement, holds the same state where it keeps the partition,
    /// and the writer promised).
    pub(super) fn scoped_candidates(
        &mut self,
        next: u64,
        counted: &[ReplicaId],
        members: &[FoldMember],
        reports: &HashMap<ReplicaId, &FoldReport>,
        learned: &dyn Fn(ReplicaId) -> bool,
    ) -> BTreeMap<(ReplicaId, u32), WriterDigest> {
        let report_of = |member: ReplicaId| reports.get(&member).copied();
        let mut scoped: BTreeMap<(ReplicaId, u32), WriterDigest> = self
            .candidate
            .iter()
            .filter(|candidate| candidate.epoch == next)
            .flat_map(|candidate| candidate.scoped.iter())
            .flat_map(|(writer, digests)| {
                digests
                    .iter()
                    .map(|(partition, digest)| ((*writer, *partition), *digest))
            })
            .collect();
        let unfolded: Vec<ScopedRetirement> = self.unfolded_scoped().collect();
        for retirement in unfolded {
            let agreement = match learned(retirement.writer) {
                true => self.scoped_agreement(retirement, counted, members, &report_of),
                false => Err(FoldWait::NotLearned {
                    writer: retirement.writer,
                }),
            };
            match agreement {
                Ok(digest) => {
                    scoped
                        .entry((retirement.writer, retirement.partition))
                        .or_insert(digest);
                }
                Err(wait) => {
                    self.scoped_waits.insert(retirement, wait);
                }
            }
        }
        let theirs = reports
            .values()
            .filter_map(|report| report.candidate.as_ref())
            .filter(|candidate| candidate.epoch == next && candidate.by_partition.is_some());
        for candidate in theirs {
            for (writer, digests) in &candidate.scoped {
                for (partition, digest) in digests {
                    let retirement = ScopedRetirement {
                        writer: *writer,
                        partition: *partition,
                        phase: self.book.scoped_epochs(*writer, *partition).len() as u32,
                    };
                    let agrees = self.retired_scoped.contains(&retirement)
                        && !self.is_retired(*writer)
                        && learned(*writer)
                        && self.holds_scoped(retirement, *digest)
                        && self
                            .scoped_promised(retirement, members, &report_of)
                            .is_ok();
                    if agrees {
                        scoped.entry((*writer, *partition)).or_insert(*digest);
                    }
                }
            }
        }
        // A writer retired whole since is folded in every partition by its
        // own record: a record may not fold it both ways.
        scoped.retain(|(writer, _), _| !self.is_retired(*writer));
        scoped
    }

    /// The agreement rule for one scoped retirement over the counted
    /// members' reports: the digest every keeper of the partition reports
    /// (this node's, when it keeps it), or why there is none.
    pub(super) fn scoped_agreement<'r>(
        &self,
        retirement: ScopedRetirement,
        counted: &[ReplicaId],
        members: &[FoldMember],
        report_of: &dyn Fn(ReplicaId) -> Option<&'r FoldReport>,
    ) -> Result<WriterDigest, FoldWait> {
        let ScopedRetirement {
            writer, partition, ..
        } = retirement;
        let bp = self
            .by_partition
            .as_ref()
            .ok_or(FoldWait::NotReportedByPartition {
                member: writer,
                writer,
            })?;
        let mut agreed = bp
            .keeps(partition)
            .then(|| bp.digest_at(writer, partition, retirement.phase));
        for member in counted {
            let report = report_of(*member).ok_or(FoldWait::NotReported {
                member: *member,
                writer,
            })?;
            let parts = report
                .partitions
                .as_ref()
                .filter(|parts| parts.kept.as_ref().is_none_or(|k| k.count() == bp.count()))
                .ok_or(FoldWait::NotReportedByPartition {
                    member: *member,
                    writer,
                })?;
            if !keeps(parts.kept.as_ref(), partition) {
                continue;
            }
            let theirs =
                reported_digest(parts, retirement).ok_or(FoldWait::NotReportedByPartition {
                    member: *member,
                    writer,
                })?;
            match agreed {
                None => agreed = Some(theirs),
                Some(ours) if ours != theirs => {
                    return Err(FoldWait::DiffersIn {
                        member: *member,
                        writer,
                        partition,
                        ours,
                        theirs,
                    })
                }
                Some(_) => {}
            }
        }
        let digest = agreed.ok_or(FoldWait::Unkept { writer, partition })?;
        self.scoped_promised(retirement, members, report_of)?;
        Ok(digest)
    }

    /// The writer's promise: while gossip shows it up, its own report must
    /// list the retirement (it takes no add in the partition until the
    /// fold). A writer that is down or unseen adds nothing.
    pub(super) fn scoped_promised<'r>(
        &self,
        retirement: ScopedRetirement,
        members: &[FoldMember],
        report_of: &dyn Fn(ReplicaId) -> Option<&'r FoldReport>,
    ) -> Result<(), FoldWait> {
        let writer = retirement.writer;
        if !members.iter().any(|m| m.replica == writer && m.alive) {
            return Ok(());
        }
        match report_of(writer) {
            Some(report) if report.retired_scoped.contains(&retirement) => Ok(()),
            _ => Err(FoldWait::WriterServes {
                writer,
                partition: retirement.partition,
            }),
        }
    }

    /// Whether this node's own state agrees with `digest` as the final
    /// state of `retirement` (it holds nothing to compare where it does
    /// not keep the partition).
    pub(super) fn holds_scoped(&self, retirement: ScopedRetirement, digest: WriterDigest) -> bool {
        self.by_partition.as_ref().is_some_and(|bp| {
            !bp.keeps(retirement.partition)
                || bp.digest_at(retirement.writer, retirement.partition, retirement.phase) == digest
        })
    }
}

/// A member's reported digest of `retirement`, if it lists one.
fn reported_digest(report: &PartitionReport, retirement: ScopedRetirement) -> Option<WriterDigest> {
    report
        .scoped
        .iter()
        .find(|(r, _)| *r == retirement)
        .map(|(_, digest)| *digest)
}

#[cfg(test)]
#[path = "fold_scoped_tests.rs"]
mod tests;
