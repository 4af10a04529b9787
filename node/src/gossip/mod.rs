//! Membership (chitchat), the anti-entropy loop over gRPC, and the pusher of
//! replicated durability's copies.

pub mod anti_entropy;
pub mod copier;
pub mod fold_report;
pub mod membership;
