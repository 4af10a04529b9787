//! Membership (chitchat) and the anti-entropy loop over gRPC.

pub mod anti_entropy;
pub mod fold_report;
pub mod membership;
