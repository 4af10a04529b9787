//! The pure half of the node's runtime (issue 42, item 2): what a node
//! decides around its replica, with no IO, so that the tokio node
//! (`tally-node`, over sled, gRPC and chitchat) and the deterministic
//! simulator drive the same code. Time, membership and the replica come in
//! as arguments; what the caller must do (persist, publish, log) goes out
//! as values.
//!
//! - [`partitions`]: [`NodePartitions`], one node's lifecycle and
//!   partition holdings: what to pull from whom, the confirmations of a
//!   release, the purge of partitions no longer kept, the operator's drain
//!   and removal.
//! - [`round`]: the lifecycle round ([`NodePartitions::handle_round`]), in
//!   two phases: a [`PendingRound`] computed on copies, committed by the
//!   caller once the lifecycle record it names is on disk.
//! - [`copy_sessions`]: how a pull's scope and cursors follow from what
//!   the holdings ask for (partition-scoped pulls over one cursor per peer).
//! - [`copy_plan`]: which nodes a push of replicated durability goes to.
//! - [`pusher`]: the pusher of replicated durability (one push in flight,
//!   parts per target, answers, parked counters and their pause).
//! - [`fold_report`]: the text form of a member's gossiped fold report.
//! - [`rights_plan`]: where a bounded counter's rights should move, by
//!   demand and on request.
//!
//! Invariants kept here: a change to a node's lifecycle or holdings is made
//! only through a commit, which the caller makes once the record is
//! persisted (a change that cannot be persisted is not made); the replica
//! serves and keeps exactly what the holdings last committed serve and
//! keep, except that a partition handed off stops being served at once,
//! under the same borrow of the replica as the check that let it go.
//! Modules here use `crdt`, `partition` and `replica`, and nothing uses
//! them back.

pub mod copy_plan;
pub mod copy_sessions;
pub mod fold_report;
pub mod partitions;
pub mod pusher;
pub mod rights_plan;
pub mod round;

#[cfg(test)]
mod round_tests;

pub use partitions::{recovered_serving, NodePartitions, PendingChange, Publication};
pub use round::{PendingRound, RoundOutcome};
