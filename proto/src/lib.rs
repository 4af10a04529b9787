//! Tally's wire protocol, generated from `proto/tally/v1/*.proto`.
//!
//! `Counters` is the public API, `Replication` the node-to-node anti-entropy
//! API and `Admin` the operator API. Conversions to the node's core types live
//! in the node (`tally_node::api`), never here. [`backup`] frames the
//! `Admin.Backup` stream as a file; [`partition`] re-exports the pinned key
//! hash of partitioned regions from the pure core (`tally-core`), which the
//! node and the client share.

#![deny(missing_docs)]

/// The encoded `FileDescriptorSet` of every Tally proto, for gRPC server
/// reflection (so that `grpcurl` works without the .proto files).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tally_descriptor.bin"));

pub mod backup;
pub mod partition;

/// Package `tally.v1`.
pub mod v1 {
    tonic::include_proto!("tally.v1");
}
