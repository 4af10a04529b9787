//! The stable hashes of partitioning, from the protocol crate
//! ([`tally_proto::partition`]), where the client shares them: a key's
//! partition and the rendezvous weight of a (partition, node) pair. One copy,
//! pinned by that module's tests, so that a node and a routing client never
//! disagree on where a key lives.

pub use tally_proto::partition::{
    key_hash, rendezvous_weight, BadPartitionCount, Partition, PartitionCount, DEFAULT_PARTITIONS,
    MAX_PARTITIONS,
};
