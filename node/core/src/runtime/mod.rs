//! The pure half of the node's runtime (issue 42, item 2): what a node
//! decides around its replica, with no IO, so that the tokio node
//! (`tally-node`, over sled, gRPC and chitchat) and the deterministic
//! simulator drive the same code.
//!
//! - [`copy_sessions`]: how a pull's scope and cursors follow from what
//!   the holdings ask for (partition-scoped pulls over one cursor per peer).
//! - [`copy_plan`]: which nodes a push of replicated durability goes to.
//! - [`fold_report`]: the text form of a member's gossiped fold report.
//!
//! Modules here use `crdt`, `partition` and `replica`, and nothing uses
//! them back.

pub mod copy_plan;
pub mod copy_sessions;
pub mod fold_report;
