//! Choosing what the caches evict: the least recently used of the clean
//! entries, by selection rather than by sorting.
//!
//! Eviction runs in housekeeping under the core lock, over every clean
//! entry of a cache that holds 100,000 counters by default. Sorting them
//! (by last use, then by key, as tuple order does) cost milliseconds per
//! tick at a million cold keys, most of it comparing keys whose last use
//! fell in the same millisecond, and every add waited behind it. A
//! selection is linear and compares times only. Which of several entries
//! used in the same millisecond goes first is arbitrary, as LRU allows.
//! What it keeps: only the entries offered (the caller's clean ones) are
//! ever chosen, so a dirty or committing entry is never evicted.

use std::collections::HashMap;

use super::Key;

/// Removes from `cache` the `excess` least recently used of the entries
/// that `last_use_if_clean` says may go (their last use in ms; `None` for
/// an entry that must stay), or all of those when there are fewer.
pub(super) fn evict<V>(
    cache: &mut HashMap<Key, V>,
    excess: usize,
    last_use_if_clean: impl Fn(&V) -> Option<u64>,
) {
    let clean = cache
        .iter()
        .filter_map(|(key, entry)| Some((last_use_if_clean(entry)?, key)));
    for key in least_recently_used(clean, excess) {
        cache.remove(&key);
    }
}

/// The keys of the `excess` least recently used of `candidates` (last use
/// in ms, key), in no particular order; all of them when there are fewer.
fn least_recently_used<'a>(
    candidates: impl Iterator<Item = (u64, &'a Key)>,
    excess: usize,
) -> Vec<Key> {
    if excess == 0 {
        return Vec::new();
    }
    let mut candidates: Vec<(u64, &Key)> = candidates.collect();
    if candidates.len() > excess {
        candidates.select_nth_unstable_by_key(excess - 1, |(used, _)| *used);
        candidates.truncate(excess);
    }
    candidates.into_iter().map(|(_, key)| key.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<Key> {
        (0..n).map(|i| Key::from(format!("k{i}"))).collect()
    }

    #[test]
    fn the_least_recently_used_are_chosen() {
        let keys = keys(100);
        // Used at 1000 - i: the highest indexes are the oldest.
        let candidates = keys.iter().enumerate().map(|(i, k)| (1000 - i as u64, k));
        let mut chosen = least_recently_used(candidates, 10);
        chosen.sort();
        let mut oldest: Vec<Key> = keys[90..].to_vec();
        oldest.sort();
        assert_eq!(chosen, oldest);
    }

    #[test]
    fn ties_are_broken_but_never_past_an_older_entry() {
        let keys = keys(50);
        // Ten used at 5, forty at 7: choosing 15 takes all ten of 5.
        let candidates = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (if i < 10 { 5 } else { 7 }, k));
        let chosen = least_recently_used(candidates, 15);
        assert_eq!(chosen.len(), 15);
        for key in &keys[..10] {
            assert!(chosen.contains(key), "{key} (used at 5) was kept");
        }
    }

    #[test]
    fn only_entries_that_may_go_are_evicted() {
        // (last use, may go): the two oldest must stay.
        let mut cache: HashMap<Key, (u64, bool)> = keys(6)
            .into_iter()
            .zip([
                (1, false),
                (2, false),
                (3, true),
                (4, true),
                (5, true),
                (6, true),
            ])
            .collect();
        evict(&mut cache, 3, |&(used, clean)| clean.then_some(used));
        let mut left: Vec<u64> = cache.values().map(|(used, _)| *used).collect();
        left.sort();
        assert_eq!(left, [1, 2, 6]);
    }

    #[test]
    fn nothing_or_everything() {
        let keys = keys(5);
        assert!(least_recently_used(keys.iter().map(|k| (1, k)), 0).is_empty());
        assert_eq!(least_recently_used(keys.iter().map(|k| (1, k)), 9).len(), 5);
    }
}
