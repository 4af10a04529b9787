//! Retiring writers and agreeing on folds: the pure protocol. Membership and
//! the other members' reports come in as values; nothing here does IO.
//!
//! - **Retired** writers are a grow-only set: an operator retires a replica,
//!   or a node retires an old incarnation of a node whose newer incarnation
//!   is alive once the old one has been dead for `retire_after`; members
//!   learn retirements from each other's reports. A retired writer is fenced
//!   (the node refuses to serve with that id).
//! - Every member keeps a [`WriterDigest`] of each writer's slots over every
//!   counter it holds and reports those of retired, unfolded writers.
//! - **Agreement rule**: a retired writer is ready to fold when every
//!   counted member reports the same digest as ours. Counted members are
//!   every replica this node has ever learned of (its directory, all
//!   regions, live or down, and every member gossip shows), less the retired
//!   ones: a member that was never removed counts even when it is down or
//!   cut off, so a fold waits through partitions instead of guessing. A node
//!   proposes or joins a fold only of a writer it has learned of by state
//!   (in its directory): a node that just started on an empty disk knows
//!   nobody yet, and "every member I know agrees" would hold of nobody.
//! - **A retired writer that is up** (a node restarted on its old data
//!   directory, retired while it was down) may still take adds until it
//!   hears of its retirement, so the others agreeing is not enough: while
//!   gossip shows it alive, a node neither proposes nor joins its fold until
//!   its own report shows it fenced (it lists itself retired) with the same
//!   digest. This is what makes the restart hold safe to end on any live
//!   peer's report: a peer that has not heard of the retirement has agreed
//!   to no fold of the writer, it counts, and it sees the writer up.
//! - **Epochs**: a node whose ready writers are not folded proposes a
//!   candidate record for the next epoch; candidates only grow (a member's
//!   agreeing writers are added), and a node commits its candidate once every
//!   counted member reports the same candidate, or a committed record of
//!   that epoch. A committed record is frozen and adopted by every other
//!   member, whose own candidate gives way. Two members cannot commit
//!   different records for one epoch: each would have seen the other report
//!   its own candidate, and a candidate only grows until it is committed.
//! - A node applies a committed epoch to its own counters only when its own
//!   digest of each writer equals the record's (`Folds::applicable_upto`);
//!   otherwise it says why and its counters reach the fold through merges
//!   from members that applied it.
//!
//! Two more files hold parts of `impl Folds`: `fold_retirements.rs` (how a
//! writer becomes retired) and `fold_partition_state.rs` (the state kept by
//! partition from cluster version 10, whose rules are in
//! `fold_partitions.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::crdt::{
    FoldBook, FoldError, FoldRecord, PartitionDigests, ReplicaId, Slot, WriterDigest,
};

use super::fold_partitions::{ByPartition, PartitionReport, PartitionWait};
pub use super::fold_waits::FoldWait;
pub use scoped::{ScopedRetirement, WriteGate};

/// Why a writer was retired.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RetireReason {
    /// An operator retired it (`tally admin retire`).
    Operator,
    /// A newer incarnation of its node is alive and it was dead long enough.
    Replaced {
        /// The newer incarnation.
        by: ReplicaId,
    },
    /// Learned from another member's report.
    Reported {
        /// The member that reported it first.
        by: ReplicaId,
    },
}

impl std::fmt::Display for RetireReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetireReason::Operator => write!(f, "retired by an operator"),
            RetireReason::Replaced { by } => write!(f, "replaced by {by}"),
            RetireReason::Reported { by } => write!(f, "reported retired by {by}"),
        }
    }
}

/// What a member publishes about retirements and folds.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct FoldReport {
    /// The retired writers it knows.
    pub retired: Vec<ReplicaId>,
    /// Its digest of each retired, not yet folded writer.
    pub digests: Vec<(ReplicaId, WriterDigest)>,
    /// Its committed fold records, oldest first.
    pub records: Vec<FoldRecord>,
    /// Its candidate for the next epoch.
    pub candidate: Option<FoldRecord>,
    /// Its state by partition (from cluster version 10; see
    /// `fold_partitions.rs`).
    pub partitions: Option<PartitionReport>,
    /// The scoped retirements it knows that are not folded yet
    /// (`fold_scoped.rs`).
    pub retired_scoped: Vec<ScopedRetirement>,
}

/// Why `tally admin retire` was refused. Nothing changed.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum RetireRefused {
    /// The node's own id.
    #[error("{0} is this node's own replica id; retire it from another node once it is stopped")]
    Own(ReplicaId),
    /// No such replica known.
    #[error("no replica {0} is known to this node (see tally status for the ids)")]
    Unknown(ReplicaId),
    /// The replica is alive.
    #[error("replica {0} is alive; stop it (and wipe its data directory) before retiring it")]
    Alive(ReplicaId),
}

/// A member as the fold protocol sees it: its id, whether it is up, and its
/// last report (none if it never published one).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FoldMember {
    /// Its replica id.
    pub replica: ReplicaId,
    /// Whether failure detection thinks it is up.
    pub alive: bool,
    /// Its node name.
    pub node_name: String,
    /// Its last report.
    pub report: Option<FoldReport>,
}

/// The fold protocol's state at one node. See the module documentation.
#[derive(Debug, Default)]
pub struct Folds {
    retired: BTreeMap<ReplicaId, RetireReason>,
    book: Arc<FoldBook>,
    candidate: Option<FoldRecord>,
    digests: HashMap<ReplicaId, WriterDigest>,
    /// Epochs up to this one are applied to this node's counters as they load.
    applied: u64,
    /// Retirements and records not yet handed to a commit.
    pending_retired: Vec<(ReplicaId, RetireReason)>,
    pending_records: Vec<FoldRecord>,
    /// Node names first seen since the last commit.
    pending_node_names: Vec<(ReplicaId, String)>,
    waits: BTreeMap<ReplicaId, FoldWait>,
    /// Live writers' slots retired in some partitions and not folded yet
    /// (`fold_scoped.rs`).
    retired_scoped: BTreeSet<ScopedRetirement>,
    /// Scoped retirements learned (`true`) or folded (`false`) and not
    /// yet handed to a commit.
    pending_scoped: Vec<(ScopedRetirement, bool)>,
    /// Why each unfolded scoped retirement waits.
    scoped_waits: BTreeMap<ScopedRetirement, FoldWait>,
    /// Partitions this node released holding slots of its own, and since
    /// when (`fold_released.rs`; `None`: not stamped yet).
    released: BTreeMap<u32, Option<u64>>,
    /// Release times set or cleared since the last commit.
    pending_released: Vec<(u32, Option<u64>)>,
    /// When each named replica, down now, was first seen down (persisted,
    /// so a restart does not start `--retire-after` over).
    dead_since_ms: HashMap<ReplicaId, u64>,
    /// Dead-since times set (`Some`) or cleared since the last commit.
    pending_dead_since: Vec<(ReplicaId, Option<u64>)>,
    /// The node name of every replica seen and not retired (persisted, so a
    /// restart still knows an old incarnation gossip no longer lists).
    node_names: HashMap<ReplicaId, String>,
    /// Digests and applied epochs by partition, once the node's partition
    /// count is known ([`Self::track_partitions`]).
    by_partition: Option<ByPartition>,
    /// Applied epochs by partition recovered from disk, until then.
    recovered_parts: Vec<(u32, u64)>,
}

/// A retired writer's final state as a fold record names it.
#[derive(Clone, PartialEq, Eq, Debug)]
enum Final {
    /// Its digest over every counter (clusters before version 10).
    Whole(WriterDigest),
    /// Its digest per partition (cluster version 10 on).
    ByPartition(PartitionDigests),
}

/// The writer digests a commit changes, whole and per partition, each
/// starting from the node's durable digest.
#[derive(Debug, Default)]
pub struct DigestChanges {
    /// Per writer.
    pub whole: BTreeMap<ReplicaId, WriterDigest>,
    /// Per writer, partition and phase (when the node tracks partitions).
    pub by_partition: BTreeMap<(ReplicaId, u32, u32), WriterDigest>,
}

impl Folds {
    /// The state recovered from disk: retirements, committed records (a
    /// record that does not chain is left out, and so are those after it),
    /// every writer's digest, and the epoch applied to this node's counters.
    pub fn recovered(
        retired: Vec<(ReplicaId, RetireReason)>,
        mut records: Vec<FoldRecord>,
        digests: Vec<(ReplicaId, WriterDigest)>,
        applied: u64,
    ) -> Self {
        records.sort_by_key(|record| record.epoch);
        let mut book = FoldBook::new();
        for record in records {
            if book.accept(record).is_err() {
                break;
            }
        }
        let applied = applied.min(book.epoch());
        let mut folds = Folds {
            retired: retired.into_iter().collect(),
            book: Arc::new(book),
            digests: digests.into_iter().collect(),
            applied,
            ..Folds::default()
        };
        folds.advance_applied();
        folds
    }

    /// The committed fold records.
    pub fn book(&self) -> &FoldBook {
        &self.book
    }

    /// The committed fold records, shared (cheap to clone).
    pub fn shared_book(&self) -> Arc<FoldBook> {
        self.book.clone()
    }

    /// Sets writers' digests to what a durable commit made them.
    pub fn set_digests(&mut self, digests: &[(ReplicaId, WriterDigest)]) {
        for (writer, digest) in digests {
            if *digest == WriterDigest::default() {
                self.digests.remove(writer);
            } else {
                self.digests.insert(*writer, *digest);
            }
        }
    }

    /// Epochs up to this one are applied to every partition's counters
    /// (the lowest partition's, when partitions are tracked).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The retired writers and why.
    pub fn retired(&self) -> &BTreeMap<ReplicaId, RetireReason> {
        &self.retired
    }

    /// Whether `writer` is retired (fenced).
    pub fn is_retired(&self, writer: ReplicaId) -> bool {
        self.retired.contains_key(&writer)
    }

    /// Why each retired, unfolded writer waits (as of the last round).
    pub fn waits(&self) -> &BTreeMap<ReplicaId, FoldWait> {
        &self.waits
    }

    /// The candidate record for the next epoch, if any.
    pub fn candidate(&self) -> Option<&FoldRecord> {
        self.candidate.as_ref()
    }

    /// This node's digest of `writer`'s slots.
    pub fn digest_of(&self, writer: ReplicaId) -> WriterDigest {
        self.digests.get(&writer).copied().unwrap_or_default()
    }

    /// Records that `writer`'s slot of counter `key` went from `old` to `new`
    /// in a commit.
    pub fn note_slot(&mut self, key: &str, writer: ReplicaId, old: Slot, new: Slot) {
        if old == new {
            return;
        }
        if let Some(bp) = self.by_partition.as_mut() {
            let partition = bp.of_key(key);
            let mut digest = bp.digest(writer, partition);
            digest.replace(key, old, new);
            bp.set_digest(writer, partition, digest);
        }
        let digest = self.digests.entry(writer).or_default();
        digest.replace(key, old, new);
        if *digest == WriterDigest::default() {
            self.digests.remove(&writer);
        }
    }

    /// Every writer's digest (for the commit that persists them).
    pub fn digests(&self) -> impl Iterator<Item = (ReplicaId, WriterDigest)> + '_ {
        self.digests
            .iter()
            .map(|(writer, digest)| (*writer, *digest))
    }

    /// What this node publishes.
    pub fn report(&self) -> FoldReport {
        let (retired_scoped, scoped_digests) = self.scoped_report();
        FoldReport {
            retired: self.retired.keys().copied().collect(),
            digests: self
                .unfolded_retired()
                .map(|writer| (writer, self.digest_of(writer)))
                .collect(),
            records: self.book.records().to_vec(),
            candidate: self.candidate.clone(),
            partitions: self.by_partition.as_ref().map(|bp| PartitionReport {
                scoped: scoped_digests,
                ..bp.report(self.unfolded_retired())
            }),
            retired_scoped,
        }
    }

    fn unfolded_retired(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.retired
            .keys()
            .copied()
            .filter(|writer| self.book.folded_at(*writer).is_none())
    }

    /// One round of the protocol on the members' latest reports, by a node
    /// that has learned of every writer. `counted` is every replica this
    /// node knows (its directory and the members) other than itself;
    /// retired ones are left out here. Returns the records committed or
    /// adopted in this round.
    pub fn handle_reports(
        &mut self,
        counted: &[ReplicaId],
        members: &[FoldMember],
    ) -> Result<Vec<FoldRecord>, FoldError> {
        self.handle_reports_knowing(counted, members, &|_| true)
    }

    /// [`Self::handle_reports`], where `learned(writer)` says whether this
    /// node has learned of a writer by state: it proposes and joins folds of
    /// those only (committed records are adopted all the same).
    pub fn handle_reports_knowing(
        &mut self,
        counted: &[ReplicaId],
        members: &[FoldMember],
        learned: &dyn Fn(ReplicaId) -> bool,
    ) -> Result<Vec<FoldRecord>, FoldError> {
        let committed = self.round(counted, members, learned);
        self.advance_applied();
        committed
    }

    fn round(
        &mut self,
        counted: &[ReplicaId],
        members: &[FoldMember],
        learned: &dyn Fn(ReplicaId) -> bool,
    ) -> Result<Vec<FoldRecord>, FoldError> {
        let reports: HashMap<ReplicaId, &FoldReport> = members
            .iter()
            .filter_map(|member| Some((member.replica, member.report.as_ref()?)))
            .collect();
        self.waits.clear();
        self.scoped_waits.clear();
        for (member, report) in &reports {
            for writer in &report.retired {
                self.learn_retired(*writer, RetireReason::Reported { by: *member });
            }
            for retirement in &report.retired_scoped {
                self.learn_scoped(*retirement);
            }
        }
        let mut committed = Vec::new();
        // Adopt records other members committed, in epoch order.
        loop {
            let next = self.book.epoch() + 1;
            let found = reports
                .values()
                .find_map(|report| report.records.iter().find(|r| r.epoch == next));
            let Some(record) = found.cloned() else { break };
            self.commit(record.clone())?;
            committed.push(record);
        }
        let counted: Vec<ReplicaId> = counted
            .iter()
            .copied()
            .filter(|replica| !self.is_retired(*replica))
            .collect();
        let next = self.book.epoch() + 1;
        // Propose, or grow our candidate with what others propose and we agree on.
        let by_partition = self.agrees_by_partition();
        let ready: Vec<(ReplicaId, Final)> = self
            .unfolded_retired()
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|writer| {
                let agreement = match learned(writer) {
                    true => self
                        .agreement(writer, &counted, &reports)
                        .and_then(|final_state| {
                            self.settled(writer, &final_state, members, &reports)
                                .map(|()| final_state)
                        }),
                    false => Err(FoldWait::NotLearned { writer }),
                };
                match agreement {
                    Ok(final_state) => Some((writer, final_state)),
                    Err(wait) => {
                        self.waits.insert(writer, wait);
                        None
                    }
                }
            })
            .collect();
        let mut writers: BTreeMap<ReplicaId, Final> =
            self.candidate.iter().flat_map(finals).collect();
        writers.extend(ready);
        for report in reports.values() {
            let Some(theirs) = report
                .candidate
                .as_ref()
                .filter(|c| c.epoch == next && c.by_partition.is_some() == by_partition)
            else {
                continue;
            };
            for (writer, final_state) in finals(theirs) {
                let agrees = self.is_retired(writer)
                    && self.book.folded_at(writer).is_none()
                    && learned(writer)
                    && self.holds(writer, &final_state)
                    && self
                        .settled(writer, &final_state, members, &reports)
                        .is_ok();
                if agrees {
                    writers.entry(writer).or_insert(final_state);
                }
            }
        }
        let scoped = match by_partition {
            true => self.scoped_candidates(next, &counted, members, &reports, learned),
            false => BTreeMap::new(),
        };
        if writers.is_empty() && scoped.is_empty() {
            return Ok(committed);
        }
        let candidate = match by_partition {
            true => FoldRecord::by_partition(
                next,
                writers
                    .into_iter()
                    .map(|(writer, final_state)| match final_state {
                        Final::ByPartition(digests) => (writer, digests),
                        Final::Whole(_) => unreachable!("one kind of candidate per mode"),
                    }),
            )
            .with_scoped(group_scoped(scoped)),
            false => FoldRecord::new(
                next,
                writers
                    .into_iter()
                    .map(|(writer, final_state)| match final_state {
                        Final::Whole(digest) => (writer, digest),
                        Final::ByPartition(_) => unreachable!("one kind of candidate per mode"),
                    }),
            ),
        };
        self.candidate = Some(candidate.clone());
        for member in &counted {
            let agreed = reports.get(member).is_some_and(|report| {
                report.candidate.as_ref() == Some(&candidate) || report.records.contains(&candidate)
            });
            if !agreed {
                let wait = FoldWait::NotAgreed {
                    member: *member,
                    epoch: next,
                };
                for (writer, _) in &candidate.writers {
                    self.waits.insert(*writer, wait.clone());
                }
                for retirement in scoped_in(&candidate, &self.book) {
                    self.scoped_waits.insert(retirement, wait.clone());
                }
                return Ok(committed);
            }
        }
        self.commit(candidate.clone())?;
        committed.push(candidate);
        Ok(committed)
    }

    /// Whether this node's own state of `writer` is `final_state` (by
    /// partition: in every partition it keeps).
    fn holds(&self, writer: ReplicaId, final_state: &Final) -> bool {
        match (final_state, &self.by_partition) {
            (Final::Whole(digest), _) => self.digest_of(writer) == *digest,
            (Final::ByPartition(digests), Some(bp)) => bp.own_matches(writer, digests),
            (Final::ByPartition(_), None) => false,
        }
    }

    /// The agreement rule for one writer: every counted member reports our
    /// digest; by partition, every member keeping a partition reports the
    /// same digest of it (`fold_partitions.rs`).
    fn agreement(
        &self,
        writer: ReplicaId,
        counted: &[ReplicaId],
        reports: &HashMap<ReplicaId, &FoldReport>,
    ) -> Result<Final, FoldWait> {
        if let Some(bp) = self.by_partition.as_ref() {
            return bp
                .agreement(writer, counted, |member| {
                    reports.get(&member)?.partitions.as_ref()
                })
                .map(Final::ByPartition)
                .map_err(|wait| match wait {
                    PartitionWait::NotReported(member) if !reports.contains_key(&member) => {
                        FoldWait::NotReported { member, writer }
                    }
                    PartitionWait::NotReported(member) => {
                        FoldWait::NotReportedByPartition { member, writer }
                    }
                    PartitionWait::Differs {
                        member,
                        partition,
                        ours,
                        theirs,
                    } => FoldWait::DiffersIn {
                        member,
                        writer,
                        partition,
                        ours,
                        theirs,
                    },
                    PartitionWait::Unkept(partition) => FoldWait::Unkept { writer, partition },
                });
        }
        let ours = self.digest_of(writer);
        for member in counted {
            let theirs = reports
                .get(member)
                .and_then(|report| report.digests.iter().find(|(w, _)| *w == writer))
                .map(|(_, digest)| *digest)
                .ok_or(FoldWait::NotReported {
                    member: *member,
                    writer,
                })?;
            if theirs != ours {
                return Err(FoldWait::Differs {
                    member: *member,
                    writer,
                    ours,
                    theirs,
                });
            }
        }
        Ok(Final::Whole(ours))
    }

    /// The rule for a retired writer that gossip shows up: its slots may
    /// still grow (a node restarted on its old data directory takes adds
    /// until it hears of its retirement), so the others' agreeing digests
    /// are not its final state. It is ready only once its own report lists
    /// it retired (it has fenced itself and takes no more adds) with the
    /// same state (by partition: in every partition it keeps). A writer
    /// that is down, or that this node does not see, adds nothing to the
    /// rule.
    fn settled(
        &self,
        writer: ReplicaId,
        final_state: &Final,
        members: &[FoldMember],
        reports: &HashMap<ReplicaId, &FoldReport>,
    ) -> Result<(), FoldWait> {
        if !members.iter().any(|m| m.replica == writer && m.alive) {
            return Ok(());
        }
        let Some(own) = reports
            .get(&writer)
            .filter(|report| report.retired.contains(&writer))
        else {
            return Err(FoldWait::WriterUp { writer });
        };
        match final_state {
            Final::Whole(digest) => match own.digests.iter().find(|(w, _)| *w == writer) {
                None => Err(FoldWait::WriterUp { writer }),
                Some((_, theirs)) if theirs != digest => Err(FoldWait::Differs {
                    member: writer,
                    writer,
                    ours: *digest,
                    theirs: *theirs,
                }),
                Some(_) => Ok(()),
            },
            Final::ByPartition(digests) => {
                let (Some(report), Some(count)) = (&own.partitions, self.partition_count()) else {
                    return Err(FoldWait::WriterUp { writer });
                };
                ByPartition::report_matches(report, writer, digests, count).map_err(
                    |(partition, ours, theirs)| FoldWait::DiffersIn {
                        member: writer,
                        writer,
                        partition,
                        ours,
                        theirs,
                    },
                )
            }
        }
    }

    fn commit(&mut self, record: FoldRecord) -> Result<(), FoldError> {
        Arc::make_mut(&mut self.book).accept(record.clone())?;
        if let Some(bp) = self.by_partition.as_mut() {
            bp.note_record(&record);
        }
        if !record.scoped.is_empty() {
            let book = &self.book;
            let pending = &mut self.pending_scoped;
            self.retired_scoped.retain(|r| {
                let unfolded = book.scoped_epochs(r.writer, r.partition).len() as u32 <= r.phase;
                if !unfolded {
                    pending.push((*r, false));
                }
                unfolded
            });
        }
        if self
            .candidate
            .as_ref()
            .is_some_and(|candidate| candidate.epoch <= record.epoch)
        {
            self.candidate = None;
        }
        self.pending_records.push(record);
        self.advance_applied();
        Ok(())
    }

    /// Raises the applied epochs as far as this node may: every epoch up to
    /// one names, for each writer, the digest this node holds (by
    /// partition: of that partition, which it keeps), or the node already
    /// applied it.
    fn advance_applied(&mut self) {
        let Some(bp) = self.by_partition.as_mut() else {
            self.applied = self.applicable_upto();
            return;
        };
        let digests = &self.digests;
        let refusals = bp.advance(&self.book, |record| {
            record.writers.iter().find_map(|(writer, digest)| {
                let ours = digests.get(writer).copied().unwrap_or_default();
                (ours != *digest).then_some((*writer, ours, *digest))
            })
        });
        self.applied = bp.applied_floor();
        for refusal in refusals {
            let wait = match refusal.partition {
                Some(partition) => FoldWait::NotApplicableIn {
                    epoch: refusal.epoch,
                    writer: refusal.writer,
                    partition,
                    ours: refusal.ours,
                    record: refusal.theirs,
                },
                None => FoldWait::NotApplicable {
                    epoch: refusal.epoch,
                    writer: refusal.writer,
                    ours: refusal.ours,
                    record: refusal.theirs,
                },
            };
            self.waits.insert(refusal.writer, wait);
        }
    }

    /// The newest epoch this node may apply to its own counters, whole:
    /// every epoch up to it names, for each writer, the digest this node
    /// holds (or the node already applied it).
    fn applicable_upto(&mut self) -> u64 {
        let mut upto = self.applied;
        while let Some(record) = self.book.record(upto + 1) {
            let differs = record
                .writers
                .iter()
                .find(|(writer, digest)| self.digest_of(*writer) != *digest);
            if let Some((writer, digest)) = differs {
                self.waits.insert(
                    *writer,
                    FoldWait::NotApplicable {
                        epoch: record.epoch,
                        writer: *writer,
                        ours: self.digest_of(*writer),
                        record: *digest,
                    },
                );
                break;
            }
            upto += 1;
        }
        upto
    }

    /// The retirements and records to persist with the next commit.
    pub fn take_pending(&mut self) -> (Vec<(ReplicaId, RetireReason)>, Vec<FoldRecord>) {
        (
            std::mem::take(&mut self.pending_retired),
            std::mem::take(&mut self.pending_records),
        )
    }

    /// Whether retirements or records wait for a commit.
    pub fn has_pending(&self) -> bool {
        !self.pending_retired.is_empty()
            || !self.pending_records.is_empty()
            || !self.pending_node_names.is_empty()
            || !self.pending_dead_since.is_empty()
            || !self.pending_scoped.is_empty()
            || !self.pending_released.is_empty()
    }

    /// A failed commit: its retirements and records go into the next one.
    pub fn restore_pending(
        &mut self,
        retired: Vec<(ReplicaId, RetireReason)>,
        records: Vec<FoldRecord>,
    ) {
        self.pending_retired.extend(retired);
        self.pending_records.extend(records);
    }
}

/// The scoped retirements `record` folds, as named before it: each
/// (writer, partition) in the phase it folds, for a record of the book's
/// next epoch.
fn scoped_in(record: &FoldRecord, book: &FoldBook) -> Vec<ScopedRetirement> {
    record
        .scoped
        .iter()
        .flat_map(|(writer, digests)| {
            digests.iter().map(|(partition, _)| ScopedRetirement {
                writer: *writer,
                partition: *partition,
                phase: book.phase(*writer, Some(*partition), record.epoch - 1),
            })
        })
        .collect()
}

/// Agreed scoped digests by (writer, partition), grouped per writer as a
/// record lists them.
fn group_scoped(
    scoped: BTreeMap<(ReplicaId, u32), WriterDigest>,
) -> Vec<(ReplicaId, PartitionDigests)> {
    let mut grouped: BTreeMap<ReplicaId, PartitionDigests> = BTreeMap::new();
    for ((writer, partition), digest) in scoped {
        grouped.entry(writer).or_default().push((partition, digest));
    }
    grouped.into_iter().collect()
}

/// A record's writers with their final states.
fn finals(record: &FoldRecord) -> Vec<(ReplicaId, Final)> {
    match &record.by_partition {
        Some(parts) => parts
            .iter()
            .map(|(writer, digests)| (*writer, Final::ByPartition(digests.clone())))
            .collect(),
        None => record
            .writers
            .iter()
            .map(|(writer, digest)| (*writer, Final::Whole(*digest)))
            .collect(),
    }
}

#[path = "fold_partition_state.rs"]
mod partition_state;
#[path = "fold_released.rs"]
mod released;
#[path = "fold_retirements.rs"]
mod retirements;
#[path = "fold_scoped.rs"]
mod scoped;
#[cfg(test)]
#[path = "folds_tests.rs"]
mod tests;
