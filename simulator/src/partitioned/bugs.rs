//! The bugs `tally-sim partitioned --planted-bug NAME` plants, to show that
//! its checker catches each: two in the runtime around the core, the rest
//! in the core itself (they need a build with the `planted-bugs` feature,
//! and are refused, naming it, in a build without). The core bugs of
//! `tally-sim run` ([`BugName`]) are planted here too, under the same
//! names, so the partitioned command can be shown to catch them as well.

use crate::options::BugName;

/// See the module documentation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum PartitionBug {
    /// An owner confirms a release without having pulled the partition: the
    /// releasing node deletes it before the new owner caught up.
    ConfirmBeforeCaughtUp,
    /// The purge never runs: released partitions stay stored on former owners.
    KeepReleased,
    /// In the core: the purge trims a counter to the node's own slot at fold
    /// epoch 0, so its slot written after a scoped fold reads as the folded
    /// one.
    TrimToEpochZero,
    /// In the core: a node raises the fold epoch of a partition it copied
    /// from nobody while a holder was out of reach, so its counters there
    /// enter the epoch with a base of 0.
    RaiseCopiedFromNobody,
    /// In the core: a replicated add's push names no phase, so a copy takes
    /// a slot written after a fold of the writer's slots for the folded one,
    /// drops it and answers `OK`.
    PushWithoutPhase,
    /// In the core and the pusher: a key short of holders is copied to any
    /// live node of the region, which takes a partition it does not hold
    /// and drops it at its next purge (needs `--durability replicated`).
    CopyToAnyNode,
    /// In the core: pulls are served live, not durable, state.
    ServeLiveState,
    /// In the core: a merge adds slots instead of taking the max.
    MergeByAddition,
    /// In the core: a retried add is applied again.
    ApplyRetryTwice,
    /// In the core: an increment raises `n` and a decrement `p`.
    SwapPAndN,
    /// In the core: a like set's merge takes the incoming member length.
    LastWriterLength,
    /// In the core: a copy answers a push before its commit is durable
    /// (needs `--durability replicated`).
    AckBeforeCopyDurable,
    /// In the core: a merge takes a folded writer's slot again.
    MergeKeepsFoldedSlot,
    /// In the core: a fold waits only for the members that are up.
    FoldBeforeAgreement,
}

impl PartitionBug {
    /// The name on the command line.
    pub fn flag(&self) -> &'static str {
        if let Some(bug) = self.shared() {
            return bug.flag();
        }
        match self {
            PartitionBug::ConfirmBeforeCaughtUp => "confirm-before-caught-up",
            PartitionBug::KeepReleased => "keep-released",
            PartitionBug::TrimToEpochZero => "trim-to-epoch-zero",
            PartitionBug::RaiseCopiedFromNobody => "raise-copied-from-nobody",
            PartitionBug::PushWithoutPhase => "push-without-phase",
            PartitionBug::CopyToAnyNode => "copy-to-any-node",
            _ => unreachable!("the other bugs are `tally-sim run`'s"),
        }
    }

    /// The bug of `tally-sim run` it is, if any.
    fn shared(&self) -> Option<BugName> {
        Some(match self {
            PartitionBug::ServeLiveState => BugName::ServeLiveState,
            PartitionBug::MergeByAddition => BugName::MergeByAddition,
            PartitionBug::ApplyRetryTwice => BugName::ApplyRetryTwice,
            PartitionBug::SwapPAndN => BugName::SwapPAndN,
            PartitionBug::LastWriterLength => BugName::LastWriterLength,
            PartitionBug::AckBeforeCopyDurable => BugName::AckBeforeCopyDurable,
            PartitionBug::MergeKeepsFoldedSlot => BugName::MergeKeepsFoldedSlot,
            PartitionBug::FoldBeforeAgreement => BugName::FoldBeforeAgreement,
            _ => return None,
        })
    }

    /// The flag of a bug that lives in the core.
    pub(super) fn core_name(&self) -> Option<&'static str> {
        match self {
            PartitionBug::ConfirmBeforeCaughtUp | PartitionBug::KeepReleased => None,
            _ => Some(self.flag()),
        }
    }

    /// The core's bug of that name.
    #[cfg(feature = "planted-bugs")]
    pub fn core_bug(&self) -> Option<tally_node::replica::PlantedBug> {
        use tally_node::replica::PlantedBug;
        if let Some(bug) = self.shared() {
            return Some(bug.core());
        }
        match self {
            PartitionBug::TrimToEpochZero => Some(PlantedBug::TrimToEpochZero),
            PartitionBug::RaiseCopiedFromNobody => Some(PlantedBug::RaiseCopiedFromNobody),
            PartitionBug::PushWithoutPhase => Some(PlantedBug::PushWithoutPhase),
            PartitionBug::CopyToAnyNode => Some(PlantedBug::CopyToAnyNode),
            _ => None,
        }
    }
}
