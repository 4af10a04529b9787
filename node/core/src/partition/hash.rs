//! The stable hashes of partitioned regions (DESIGN.md "Partitioned
//! regions"): which partition a key belongs to, and the rendezvous weight of
//! a (partition, node) pair. The node (which computes owners) and the client
//! (which sends each key to its owner) must agree on them bit for bit, and
//! the client may not depend on the node: this is the only copy, and the
//! protocol crate re-exports it as `tally_proto::partition` for the client.
//!
//! Invariant: these functions never change, across builds, platforms and
//! versions. Every node of every region must put a key in the same partition,
//! and a node restarted with a newer build must find its partitions where it
//! left them. So they are written out here (FNV-1a over the bytes, then the
//! MurmurHash3 64-bit finalizer for avalanche) instead of borrowing a library
//! hasher whose output may change, and the tests pin a few values.

/// One of a cluster's partitions, `0..count`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Partition(pub u32);

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The partition count used when none is given: 1024. P is fixed for a
/// cluster's life and caps how far a region can grow: a node should own a
/// dozen or more partitions per replica for the counters to spread evenly
/// (the spread is about `1/sqrt(partitions per node)`), so 1024 serves
/// regions of up to ~250 nodes at RF 3, and a node's partition set is 256
/// hex characters of gossip. Beyond that, create the cluster with more (see
/// deploy/CAPACITY.md for the seed's scale).
pub const DEFAULT_PARTITIONS: u32 = 1024;

/// The largest partition count accepted.
pub const MAX_PARTITIONS: u32 = 65_536;

/// A cluster's partition count `P`, fixed when the cluster is created.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PartitionCount(u32);

/// A partition count out of range.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("the partition count must be between 1 and {MAX_PARTITIONS}, not {0}")]
pub struct BadPartitionCount(pub u64);

impl PartitionCount {
    /// `count` partitions, 1 to [`MAX_PARTITIONS`].
    pub fn new(count: u64) -> Result<Self, BadPartitionCount> {
        if (1..=u64::from(MAX_PARTITIONS)).contains(&count) {
            Ok(PartitionCount(count as u32))
        } else {
            Err(BadPartitionCount(count))
        }
    }

    /// How many partitions.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The partition of `key` (its bytes as UTF-8).
    pub fn of_key(self, key: &[u8]) -> Partition {
        // Range reduction by multiply-shift: uniform and cheaper than `%`.
        Partition(((u128::from(key_hash(key)) * u128::from(self.0)) >> 64) as u32)
    }

    /// Every partition, in order.
    pub fn iter(self) -> impl Iterator<Item = Partition> {
        (0..self.0).map(Partition)
    }
}

impl Default for PartitionCount {
    fn default() -> Self {
        PartitionCount(DEFAULT_PARTITIONS)
    }
}

impl std::fmt::Display for PartitionCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits, continuing from `state`.
fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state ^= u64::from(byte);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// The MurmurHash3 64-bit finalizer: every input bit flips about half of the
/// output bits, which FNV-1a alone does not do for short keys.
fn finalize(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The stable 64-bit hash of a key's bytes.
pub fn key_hash(key: &[u8]) -> u64 {
    finalize(fnv1a(FNV_OFFSET, key))
}

/// The rendezvous (highest-random-weight) weight of `node_name` for
/// `partition`: the owners of a partition are the nodes with the highest
/// weights, so adding or removing a node moves only the partitions whose top
/// weights it holds.
pub fn rendezvous_weight(partition: Partition, node_name: &str) -> u64 {
    let state = fnv1a(FNV_OFFSET, &partition.0.to_le_bytes());
    // A separator byte that no name contains keeps (p, name) pairs apart.
    let state = fnv1a(state, &[0xff]);
    finalize(fnv1a(state, node_name.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These values must never change: a change moves every key of every
    /// existing cluster to another partition. (Checked against an
    /// independent Python implementation of the same functions.)
    #[test]
    fn the_hashes_are_pinned() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(key_hash(b"post:1"), PINNED_POST_1);
        assert_eq!(key_hash(b"likes"), PINNED_LIKES);
        let count = PartitionCount::new(256).unwrap();
        assert_eq!(count.of_key(b"post:1"), Partition(PINNED_POST_1_PARTITION));
        assert_eq!(rendezvous_weight(Partition(7), "node-a"), PINNED_WEIGHT);
    }

    const PINNED_POST_1: u64 = 0x476c_656c_a680_063c;
    const PINNED_LIKES: u64 = 0xc456_06eb_8a25_58c4;
    const PINNED_POST_1_PARTITION: u32 = 71;
    const PINNED_WEIGHT: u64 = 0x2306_58d8_7ec4_70d9;

    #[test]
    fn partition_counts_out_of_range_are_refused() {
        assert!(PartitionCount::new(0).is_err());
        assert!(PartitionCount::new(u64::from(MAX_PARTITIONS) + 1).is_err());
        assert_eq!(PartitionCount::new(1).unwrap().of_key(b"x"), Partition(0));
        let message = PartitionCount::new(0).unwrap_err().to_string();
        assert!(message.contains("between 1 and 65536"), "{message}");
    }

    #[test]
    fn keys_spread_evenly_over_partitions() {
        let count = PartitionCount::new(64).unwrap();
        let mut per_partition = vec![0u32; 64];
        for i in 0..64_000 {
            per_partition[count.of_key(format!("post:{i}").as_bytes()).0 as usize] += 1;
        }
        // 1,000 expected per partition; 5 standard deviations is ~160.
        for (partition, keys) in per_partition.iter().enumerate() {
            assert!((840..=1160).contains(keys), "partition {partition}: {keys}");
        }
    }
}
