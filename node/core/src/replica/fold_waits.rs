//! Why a retired writer is not folded yet ([`FoldWait`]), as the fold
//! protocol (`folds.rs`) records it per writer and `tally status` shows it.
//! No invariant lives here; the waits only explain what the protocol holds
//! back.

use crate::crdt::{ReplicaId, WriterDigest};

/// Why a retired writer is not folded yet.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum FoldWait {
    /// A counted member has not reported its state of the writer.
    #[error("member {member} has not reported its state of writer {writer} (down or cut off?)")]
    NotReported {
        /// The member.
        member: ReplicaId,
        /// The writer.
        writer: ReplicaId,
    },
    /// A member holds another state of the writer than this node.
    #[error("member {member} holds another state of writer {writer} ({theirs}; here {ours}); waiting for anti-entropy")]
    Differs {
        /// The member.
        member: ReplicaId,
        /// The writer.
        writer: ReplicaId,
        /// Our digest.
        ours: WriterDigest,
        /// Theirs.
        theirs: WriterDigest,
    },
    /// The retired writer itself is up (gossip shows it alive) and its own
    /// report does not show it fenced: a node restarted on its old data
    /// directory takes adds until it hears of its retirement, so nobody else
    /// holds its final state yet.
    #[error("writer {writer} is up and has not fenced itself yet (restarted on its old data directory?); its fold waits for its own report of its final state")]
    WriterUp {
        /// The writer.
        writer: ReplicaId,
    },
    /// A live writer whose slots in a partition are retired is up and its
    /// own report does not list the retirement: it may still take adds
    /// there, so nobody holds its final state of the partition yet.
    #[error("writer {writer} is up and has not reported its slots in partition {partition} retired; the fold waits for its promise to take no more adds there")]
    WriterServes {
        /// The writer.
        writer: ReplicaId,
        /// The partition.
        partition: u32,
    },
    /// This node has not learned of the writer by state yet (a node that
    /// just started on an empty disk): it cannot tell who holds its slots.
    #[error("this node has no state of writer {writer} yet (it joined after it); it waits for anti-entropy")]
    NotLearned {
        /// The writer.
        writer: ReplicaId,
    },
    /// A counted member does not report its state of the writer by
    /// partition (a report of an older build, or not yet one of this
    /// cluster version).
    #[error("member {member} has not reported its state of writer {writer} by partition yet")]
    NotReportedByPartition {
        /// The member.
        member: ReplicaId,
        /// The writer.
        writer: ReplicaId,
    },
    /// Two members that keep a partition hold different states of the
    /// writer's slots in it.
    #[error("member {member} holds another state of writer {writer} in partition {partition} ({theirs}; {ours} elsewhere); waiting for anti-entropy")]
    DiffersIn {
        /// The member.
        member: ReplicaId,
        /// The writer.
        writer: ReplicaId,
        /// The partition.
        partition: u32,
        /// The digest it was compared with.
        ours: WriterDigest,
        /// The member's.
        theirs: WriterDigest,
    },
    /// No counted member reports keeping a partition (its owners are not
    /// members yet, or its state is lost with retired replicas).
    #[error("no member reports keeping partition {partition}, so nobody vouches for writer {writer}'s slots in it")]
    Unkept {
        /// The writer.
        writer: ReplicaId,
        /// The partition.
        partition: u32,
    },
    /// A member has not committed the candidate for the epoch yet.
    #[error("member {member} has not agreed to fold epoch {epoch} yet")]
    NotAgreed {
        /// The member.
        member: ReplicaId,
        /// The epoch of the candidate.
        epoch: u64,
    },
    /// The record is committed, but this node's state of a writer in a
    /// partition it keeps differs from the record's, so that partition's
    /// counters take the fold by merges only.
    #[error("fold epoch {epoch} is committed but this node's state of writer {writer} in partition {partition} ({ours}) is not the record's ({record}); that partition's counters take the fold from peers")]
    NotApplicableIn {
        /// The epoch.
        epoch: u64,
        /// The writer.
        writer: ReplicaId,
        /// The partition.
        partition: u32,
        /// Our digest.
        ours: WriterDigest,
        /// The record's.
        record: WriterDigest,
    },
    /// The record is committed, but this node's state of a writer differs
    /// from the record's, so its counters take the fold by merges only.
    #[error("fold epoch {epoch} is committed but this node's state of writer {writer} ({ours}) is not the record's ({record}); its counters take the fold from peers")]
    NotApplicable {
        /// The epoch.
        epoch: u64,
        /// The writer.
        writer: ReplicaId,
        /// Our digest.
        ours: WriterDigest,
        /// The record's.
        record: WriterDigest,
    },
}

impl FoldWait {
    /// The wait as `tally status` shows it, on a node that keeps `held` of
    /// the region's partitions (`None`: every one). A node that keeps only
    /// some of them (a partitioned region whose replication factor is below
    /// its node count) holds a writer's slots in those partitions only, so
    /// its state differs from a member that keeps others however long
    /// anti-entropy runs: folds need every member to hold every counter of
    /// the writer, which such a region never has. The status says so
    /// instead of promising that anti-entropy will settle it.
    pub fn explain(&self, held: Option<(usize, u32)>) -> String {
        let Some((kept, count)) = held.filter(|(kept, count)| (*kept as u64) < u64::from(*count))
        else {
            return self.to_string();
        };
        let lasting = format!(
            "this node keeps {kept} of the region's {count} partitions and other members keep others, so their whole states of a writer differ for good: in such a region folds agree partition by partition, from cluster version 10 (`tally admin finalize` once every node runs a build that speaks it); until then the writer's slots stay (counted once, as live slots)"
        );
        match self {
            FoldWait::Differs {
                member,
                writer,
                ours,
                theirs,
            } => format!(
                "member {member} holds another state of writer {writer} ({theirs}; here {ours}): {lasting}"
            ),
            FoldWait::NotApplicable { .. } => format!("{self}: {lasting}"),
            _ => self.to_string(),
        }
    }
}
