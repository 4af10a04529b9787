//! The stable hashes of partitioned regions: which partition a key belongs
//! to, and the rendezvous weight of a (partition, node) pair, which a routing
//! client and the node must compute alike. The one copy is in the pure core,
//! `tally_core::partition::hash`, with its pinned values; this module
//! re-exports it, so the client reaches it through the protocol crate as
//! before.

pub use tally_core::partition::hash::{
    key_hash, rendezvous_weight, BadPartitionCount, Partition, PartitionCount, DEFAULT_PARTITIONS,
    MAX_PARTITIONS,
};
