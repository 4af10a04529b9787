//! A set of partitions as a bitmap, with the compact text form that a node
//! publishes in gossip (which partitions it holds, which it is releasing).
//!
//! The text form is hexadecimal, partition 0 in the lowest bit of the first
//! byte, with trailing zero bytes dropped (so an empty set is `""` and 256
//! partitions take at most 64 characters).

use super::hash::{Partition, PartitionCount};

/// A set of partitions out of a fixed count.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct PartitionSet {
    count: PartitionCount,
    bits: Vec<u64>,
}

/// A gossiped partition set that does not parse.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("partition set {0:?} is not valid hexadecimal for this partition count")]
pub struct BadPartitionSet(pub String);

impl PartitionSet {
    /// The empty set.
    pub fn empty(count: PartitionCount) -> Self {
        PartitionSet {
            count,
            bits: vec![0; count.get().div_ceil(64) as usize],
        }
    }

    /// Every partition.
    pub fn full(count: PartitionCount) -> Self {
        let mut set = PartitionSet::empty(count);
        for partition in count.iter() {
            set.insert(partition);
        }
        set
    }

    /// The partition count the set is drawn from.
    pub fn count(&self) -> PartitionCount {
        self.count
    }

    /// Adds `partition`; true if it was not there.
    pub fn insert(&mut self, partition: Partition) -> bool {
        let (word, bit) = self.place(partition);
        let fresh = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        fresh
    }

    /// Removes `partition`; true if it was there.
    pub fn remove(&mut self, partition: Partition) -> bool {
        let (word, bit) = self.place(partition);
        let present = self.bits[word] & bit != 0;
        self.bits[word] &= !bit;
        present
    }

    /// Whether `partition` is in the set (false for one out of range).
    pub fn contains(&self, partition: Partition) -> bool {
        partition.0 < self.count.get() && {
            let (word, bit) = self.place(partition);
            self.bits[word] & bit != 0
        }
    }

    /// How many partitions are in the set.
    pub fn len(&self) -> usize {
        self.bits
            .iter()
            .map(|word| word.count_ones() as usize)
            .sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|word| *word == 0)
    }

    /// Whether every partition is in the set.
    pub fn is_full(&self) -> bool {
        self.len() == self.count.get() as usize
    }

    /// The partitions, in order.
    pub fn iter(&self) -> impl Iterator<Item = Partition> + '_ {
        self.count
            .iter()
            .filter(|partition| self.contains(*partition))
    }

    /// The partitions in `self` but not in `other`.
    pub fn difference(&self, other: &PartitionSet) -> PartitionSet {
        self.zip(other, |a, b| a & !b)
    }

    /// The partitions in both.
    pub fn intersection(&self, other: &PartitionSet) -> PartitionSet {
        self.zip(other, |a, b| a & b)
    }

    /// The partitions in either.
    pub fn union(&self, other: &PartitionSet) -> PartitionSet {
        self.zip(other, |a, b| a | b)
    }

    /// The gossip text form (see the module documentation).
    pub fn to_hex(&self) -> String {
        let mut bytes: Vec<u8> = self.bits.iter().flat_map(|w| w.to_le_bytes()).collect();
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// Parses the gossip text form; bits beyond the count are refused.
    pub fn from_hex(count: PartitionCount, text: &str) -> Result<Self, BadPartitionSet> {
        let bad = || BadPartitionSet(text.to_string());
        // `% 2`, not `is_multiple_of` (Rust 1.87): this crate keeps the
        // workspace's rust-version, 1.85.
        if text.len() % 2 != 0 || !text.is_ascii() {
            return Err(bad());
        }
        let mut set = PartitionSet::empty(count);
        for (index, pair) in text.as_bytes().chunks(2).enumerate() {
            let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
            let byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
            for bit in 0..8 {
                if byte & (1 << bit) != 0 {
                    let partition = (index * 8 + bit) as u64;
                    if partition >= u64::from(count.get()) {
                        return Err(bad());
                    }
                    set.insert(Partition(partition as u32));
                }
            }
        }
        Ok(set)
    }

    fn place(&self, partition: Partition) -> (usize, u64) {
        assert!(
            partition.0 < self.count.get(),
            "partition {partition} out of {}",
            self.count
        );
        ((partition.0 / 64) as usize, 1u64 << (partition.0 % 64))
    }

    fn zip(&self, other: &PartitionSet, op: impl Fn(u64, u64) -> u64) -> PartitionSet {
        assert_eq!(
            self.count, other.count,
            "sets of different partition counts"
        );
        PartitionSet {
            count: self.count,
            bits: self
                .bits
                .iter()
                .zip(&other.bits)
                .map(|(a, b)| op(*a, *b))
                .collect(),
        }
    }
}

impl Extend<Partition> for PartitionSet {
    fn extend<I: IntoIterator<Item = Partition>>(&mut self, partitions: I) {
        for partition in partitions {
            self.insert(partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn count(n: u64) -> PartitionCount {
        PartitionCount::new(n).unwrap()
    }

    #[test]
    fn the_text_form_is_short_and_pinned() {
        let mut set = PartitionSet::empty(count(256));
        assert_eq!(set.to_hex(), "");
        set.insert(Partition(0));
        set.insert(Partition(9));
        assert_eq!(set.to_hex(), "0102");
        assert_eq!(PartitionSet::full(count(256)).to_hex().len(), 64);
        assert_eq!(PartitionSet::full(count(10)).to_hex(), "ff03");
    }

    #[test]
    fn bad_text_is_refused() {
        for text in ["0", "zz", "ff07", "é0"] {
            assert!(PartitionSet::from_hex(count(10), text).is_err(), "{text}");
        }
        assert!(PartitionSet::from_hex(count(10), "ff03").unwrap().is_full());
    }

    proptest! {
        #[test]
        fn the_text_form_round_trips(n in 1u64..300, members in proptest::collection::vec(0u32..300, 0..40)) {
            let mut set = PartitionSet::empty(count(n));
            for member in members {
                if u64::from(member) < n {
                    set.insert(Partition(member));
                }
            }
            let back = PartitionSet::from_hex(count(n), &set.to_hex()).unwrap();
            prop_assert_eq!(&back, &set);
            prop_assert_eq!(back.iter().count(), set.len());
        }
    }
}
