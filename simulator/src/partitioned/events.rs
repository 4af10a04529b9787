//! The values a partitioned world passes around: the messages between
//! nodes, the events of the queue (ordered by time, then insertion), and
//! the counters and result of a run.
//!
//! Invariant: an event names the node it is for and, when it belongs to one
//! incarnation of that node (timers, commits, pull deadlines), its epoch, so
//! nothing of a crashed incarnation runs after its restart.

use std::sync::Arc;

use tally_node::crdt::ReplicaId;
use tally_node::partition::{Partition, PartitionSet};
use tally_node::replica::{CopyPush, PullChunk, PullRequest};

use super::plan::PartitionedPlan;
use crate::checker::{SlotStats, Violation};
use crate::ledger::WorkloadStats;
use crate::network::NetStats;
use crate::world::CopyStats;

/// A message between nodes.
#[derive(Clone, Debug)]
pub enum Msg {
    /// An add forwarded by the node a client reached to the key's owner.
    Forward {
        /// The client.
        client: u32,
        /// The add.
        add: u32,
        /// The attempt.
        attempt: u8,
    },
    /// A pull, as the peer book planned it and the copy sessions fitted it.
    Pull {
        /// The puller's pull id.
        pull: u64,
        /// The first request.
        request: PullRequest,
    },
    /// The answer: every chunk the peer streamed, or why it refused.
    Pulled {
        /// The pull.
        pull: u64,
        /// The chunks.
        chunks: Result<Vec<PullChunk>, String>,
    },
    /// A releasing node asks an owner to confirm it holds these partitions.
    Confirm {
        /// The releasing node.
        asker: String,
        /// The partitions.
        partitions: PartitionSet,
    },
    /// The owner's answer: per partition it confirms, through which
    /// sequence of the asker it pulled it.
    Confirmed {
        /// The owner.
        owner: String,
        /// Its answers.
        answers: Vec<(Partition, u64)>,
    },
    /// A push of replicated durability to a copy.
    Copy {
        /// The pusher's push id.
        push: u64,
        /// The push (the part for this copy).
        data: Arc<CopyPush>,
        /// Per counter of the push, the fold epoch of the pusher's durable
        /// state when it pushed: the truth the checker compares the copy's
        /// answer with, whatever the push itself says.
        epochs: Arc<Vec<u64>>,
    },
    /// A copy's answer: `ok` once what the push brought is durable there.
    CopyAnswer {
        /// The push.
        push: u64,
        /// Taken and durable (false: refused).
        ok: bool,
    },
}

/// Everything that happens.
#[derive(Clone, Debug)]
pub enum Ev {
    /// Plan operation `i` starts (true) or ends (false).
    Fault(usize, bool),
    /// The end of the run: faults heal, clients stop.
    HealAll,
    /// A client may issue its next add.
    ClientWake(u32),
    /// An attempt timed out: (client, add, attempt).
    ClientTimeout(u32, u32, u8),
    /// A client retries: (client, add).
    ClientRetry(u32, u32),
    /// An attempt reaches the node the client chose: (node, client, add, attempt).
    AddAtEntry(u16, u32, u32, u8),
    /// An answer reaches a client.
    AddReply {
        /// The client.
        client: u32,
        /// The add.
        add: u32,
        /// The attempt.
        attempt: u8,
        /// The replica that took it and the commit that makes it durable;
        /// none when refused (no owner serves the key at that node).
        answer: Option<(ReplicaId, u64)>,
    },
    /// A node's group commit is flushed: (node, epoch, seq).
    FsyncDone(u16, u32, u64),
    /// A node's sync round: (node, epoch).
    SyncRound(u16, u32),
    /// A node's lifecycle round over what gossip tells it: (node, epoch).
    ViewRefresh(u16, u32),
    /// A message arrives.
    Deliver {
        /// Receiver.
        to: u16,
        /// Sender.
        from: u16,
        /// The message.
        msg: Box<Msg>,
    },
    /// The next like, unlike or observe.
    SetOp,
    /// A node's fold round: (node, epoch).
    FoldRound(u16, u32),
    /// A pull's deadline: (node, epoch, pull).
    PullTimeout(u16, u32, u64),
    /// A push's deadline: (node, epoch, push).
    PushTimeout(u16, u32, u64),
    /// The pause after a failed push is over: (node, epoch).
    PushRetry(u16, u32),
    /// A replicated add waited for its copies past its deadline:
    /// (node, epoch, ticket, client, add, attempt).
    CopyWaitExpired(u16, u32, u64, u32, u32, u8),
    /// The owner answered `UNAVAILABLE` (its copies did not confirm in
    /// time; the add may have landed): (client, add, attempt).
    AddUnavailable(u32, u32, u8),
    /// The ledger learns an answer, once no other attempt of the add can
    /// still be applied anywhere: (add, replica, ticket).
    Answered(u32, ReplicaId, u64),
    /// Settle probe (after the heal).
    Probe,
}

impl Ev {
    pub(super) fn target(&self) -> Option<(usize, Option<u32>)> {
        match self {
            Ev::AddAtEntry(node, ..) => Some((*node as usize, None)),
            Ev::Deliver { to, .. } => Some((*to as usize, None)),
            Ev::FsyncDone(node, epoch, ..)
            | Ev::SyncRound(node, epoch)
            | Ev::ViewRefresh(node, epoch)
            | Ev::FoldRound(node, epoch)
            | Ev::PullTimeout(node, epoch, _)
            | Ev::PushTimeout(node, epoch, _)
            | Ev::PushRetry(node, epoch)
            | Ev::CopyWaitExpired(node, epoch, ..) => Some((*node as usize, Some(*epoch))),
            _ => None,
        }
    }

    pub(super) fn tag(&self) -> u64 {
        match self {
            Ev::Fault(..) => 1,
            Ev::HealAll => 2,
            Ev::ClientWake(_) => 3,
            Ev::ClientTimeout(..) => 4,
            Ev::ClientRetry(..) => 5,
            Ev::AddAtEntry(..) => 6,
            Ev::AddReply { .. } => 7,
            Ev::FsyncDone(..) => 8,
            Ev::SyncRound(..) => 9,
            Ev::ViewRefresh(..) => 10,
            Ev::Deliver { .. } => 11,
            Ev::PullTimeout(..) => 12,
            Ev::Answered(..) => 13,
            Ev::Probe => 14,
            Ev::FoldRound(..) => 15,
            Ev::SetOp => 16,
            Ev::PushTimeout(..) => 17,
            Ev::PushRetry(..) => 18,
            Ev::CopyWaitExpired(..) => 19,
            Ev::AddUnavailable(..) => 20,
        }
    }
}

/// Counters of the partition machinery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionStats {
    /// Adds taken by the node the client reached (it was the owner).
    pub direct: u64,
    /// Adds forwarded to the owner.
    pub forwarded: u64,
    /// Attempts refused: no live owner serves the key in the entry's view.
    pub refused: u64,
    /// Pulls started (in region and across).
    pub pulls: u64,
    /// Partitions pulled from scratch (handoff streams).
    pub from_scratch: u64,
    /// Confirmation requests sent.
    pub confirms: u64,
    /// Partitions handed off (no longer served nor kept) after every owner
    /// confirmed, or dropped before they were copied in.
    pub released: u64,
    /// Stored counters the purges looked at.
    pub purged: u64,
    /// Joins of spare slots that completed (the node became active; the
    /// initial nodes join a new cluster too, and are not counted).
    pub joined: u64,
    /// Drains that completed (the node left).
    pub drained: u64,
    /// Drains refused by the operator check.
    pub drains_refused: u64,
    /// Nodes removed.
    pub removed: u64,
    /// Removals refused by the asked node's check.
    pub removals_refused: u64,
    /// Likes, unlikes and observes applied.
    pub set_ops: u64,
    /// Those refused (the owner in the entry's view did not serve the key).
    pub set_refused: u64,
    /// Fold epochs committed.
    pub fold_epochs: u64,
    /// Writers folded whole (removed nodes').
    pub writers_folded: u64,
    /// Phases of live writers folded in one partition (scoped folds).
    pub scoped_folded: u64,
    /// Fold rounds that returned an error (a refused record).
    pub fold_errors: u64,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct PartitionedResult {
    /// The seed.
    pub seed: u64,
    /// The plan that ran.
    pub plan: PartitionedPlan,
    /// Hash of the event trace.
    pub trace_hash: u64,
    /// Events handled.
    pub events: u64,
    /// Simulated time at the end (ms).
    pub sim_ms: u64,
    /// The heal (ms).
    pub heal_ms: u64,
    /// From the heal to settled (ms), if reached.
    pub settled_ms: Option<u64>,
    /// Broken invariants (the first ones).
    pub violations: Vec<Violation>,
    /// How many in all.
    pub violation_count: u64,
    /// Workload counters.
    pub workload: WorkloadStats,
    /// Network counters.
    pub net: NetStats,
    /// Final slot check counters.
    pub slots: SlotStats,
    /// Partition counters.
    pub stats: PartitionStats,
    /// Replicated durability's counters (all 0 in `sync` mode).
    pub copies: CopyStats,
    /// Per live node at the end: (name, partitions kept, counters held).
    pub held: Vec<(String, usize, usize)>,
}

impl PartitionedResult {
    /// True when no invariant broke.
    pub fn passed(&self) -> bool {
        self.violation_count == 0
    }

    /// The kind of the first violation.
    pub fn failure_kind(&self) -> Option<&'static str> {
        self.violations.first().map(|v| v.kind)
    }
}
