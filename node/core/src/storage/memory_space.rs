//! The memory store's ordered key space: one ordered map per first key
//! byte (the record's kind, see [`super::encoding`] and [`super::sets`]),
//! so that a write of a counter or a watermark searches only the records of
//! its kind, not the delta log and the idempotency segments that outnumber
//! them. (In one map, the search was the largest part of the partitioned
//! simulator's commits.)
//!
//! Invariant: a key lives in the map of its first byte (the empty key in
//! that of byte 0, where it sorts first), so the maps taken in byte order
//! hold the keys in key order, and a range read goes through them so.

use std::collections::btree_map::{self, BTreeMap};
use std::ops::Bound;

type Shard = BTreeMap<Vec<u8>, Vec<u8>>;

/// See the module documentation.
#[derive(Debug)]
pub(super) struct Space {
    /// One map per first key byte.
    shards: Vec<Shard>,
}

impl Default for Space {
    fn default() -> Self {
        Space {
            shards: (0..=u8::MAX).map(|_| Shard::new()).collect(),
        }
    }
}

/// The map that holds `key`.
fn shard_of(key: &[u8]) -> usize {
    key.first().map_or(0, |byte| usize::from(*byte))
}

impl Space {
    pub(super) fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.shards[shard_of(key)].get(key)
    }

    pub(super) fn get_mut(&mut self, key: &[u8]) -> Option<&mut Vec<u8>> {
        self.shards[shard_of(key)].get_mut(key)
    }

    pub(super) fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) -> Option<Vec<u8>> {
        self.shards[shard_of(&key)].insert(key, value)
    }

    pub(super) fn remove(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        self.shards[shard_of(key)].remove(key)
    }

    /// The entries with keys in `from..to` (`from` included), in key
    /// order; none when `to` is not after `from`.
    pub(super) fn range<'a>(
        &'a self,
        from: &[u8],
        to: &[u8],
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a Vec<u8>)> {
        let bounds = (Bound::Included(from), Bound::Excluded(to));
        let shards = match from < to {
            true => shard_of(from)..shard_of(to) + 1,
            false => 0..0,
        };
        // The ranges are made here, so the iterator keeps no borrow of the
        // bounds; most reads cross one or two maps.
        let ranges: Vec<btree_map::Range<'a, Vec<u8>, Vec<u8>>> = shards
            .map(|shard| self.shards[shard].range::<[u8], _>(bounds))
            .collect();
        ranges.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn keys(space: &Space, from: &[u8], to: &[u8]) -> Vec<Vec<u8>> {
        space.range(from, to).map(|(key, _)| key.clone()).collect()
    }

    #[test]
    fn ranges_across_maps_are_in_key_order() {
        let mut space = Space::default();
        let all: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 9],
            vec![b'c'],
            vec![b'c', 1],
            vec![b'c', 2],
            vec![b'e', 0],
            vec![b'm', b's'],
            vec![255],
            vec![255, 255],
        ];
        for key in all.iter().rev() {
            assert_eq!(space.insert(key.clone(), key.clone()), None);
        }
        assert_eq!(keys(&space, &[], &[255, 255, 255]), all);
        assert_eq!(keys(&space, b"c", b"d"), all[3..6].to_vec());
        assert_eq!(keys(&space, &[0, 1], &[b'e', 1]), all[2..7].to_vec());
        assert_eq!(keys(&space, &[], &[0]), vec![Vec::<u8>::new()]);
        assert!(keys(&space, b"e", b"e").is_empty());
        assert!(keys(&space, b"m", b"c").is_empty());
        assert_eq!(space.remove(&[b'c', 1]), Some(vec![b'c', 1]));
        assert_eq!(space.get(&[b'c', 1]), None);
        assert_eq!(space.get(&[b'c', 2]), Some(&vec![b'c', 2]));
    }
}
