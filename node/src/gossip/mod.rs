//! Membership (chitchat), the anti-entropy loop over gRPC, the pusher of
//! replicated durability's copies, and the node's lifecycle and partition
//! map ([`lifecycle`]), and the end of a handoff: confirmations and the
//! purge ([`release`]).
//!
//! The pure parts (copy sessions, copy plans, the fold report's text, the
//! lifecycle round's decisions) live in tally-core's `runtime`; the old
//! paths below re-export them.

pub mod anti_entropy;
pub mod copier;
pub mod lifecycle;
pub mod membership;
pub mod release;
pub mod seal;
pub mod sealed_transport;

// Moved whole to tally-core (issue 42, item 2); these keep the
// `tally_node::gossip::...` and `super::...` paths working.
pub use tally_core::runtime::{copy_plan, copy_sessions, fold_report, pusher};
