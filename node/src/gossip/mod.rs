//! Membership (chitchat), the anti-entropy loop over gRPC, the pusher of
//! replicated durability's copies, and the node's lifecycle and partition
//! map ([`lifecycle`]), and the end of a handoff: confirmations and the
//! purge ([`release`]).

pub mod anti_entropy;
pub mod copier;
pub mod copy_plan;
pub mod copy_sessions;
pub mod fold_report;
pub mod lifecycle;
pub mod membership;
pub mod release;
pub mod seal;
pub mod sealed_transport;
