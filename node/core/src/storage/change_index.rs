//! The change log, kept in memory: for every counter, the commit that last
//! wrote it, walked in (commit, key) order by pulls ([`ChangeIndex::after`]).
//!
//! It is derived data, so no store writes it: every counter record carries
//! the commit that wrote it, and a store rebuilds the index from its counter
//! records when it opens (or, for the in-memory store, after a crash). Kept
//! in sled as one entry per counter, the log took more than half of a node's
//! disk at a million counters, and every commit rewrote the tail of the tree.
//!
//! What a pull may rely on (the cursor semantics of DESIGN.md's anti-entropy):
//! every counter has an entry at the commit that last wrote it, and entries
//! come out strictly after the cursor in (commit, key) order. An entry that a
//! later commit superseded may still be listed until the store is told (the
//! core skips it, as the later entry serves the counter); an entry is never
//! missing.
//!
//! A commit's keys are packed into one string, sorted, with a flag per key
//! for the ones superseded since: about 25 bytes per counter, and a commit
//! whose keys are all superseded is dropped.

use std::collections::BTreeMap;

use crate::replica::{Change, CommitBatch, Cursor};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct ChangeIndex {
    commits: BTreeMap<u64, Commit>,
    live: usize,
}

/// The keys whose latest change a commit holds.
#[derive(Debug, Default)]
struct Commit {
    /// The keys, sorted, one after the other.
    text: String,
    /// Where each key ends in `text`.
    ends: Vec<u32>,
    /// Per key: superseded by a later commit.
    superseded: Vec<bool>,
    live: usize,
}

/// Below this many keys a commit is not worth compacting.
const COMPACT_FROM: usize = 32;

impl Commit {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn key(&self, index: usize) -> &str {
        let start = index.checked_sub(1).map_or(0, |i| self.ends[i] as usize);
        &self.text[start..self.ends[index] as usize]
    }

    /// The position of `key`, or where it would go.
    fn find(&self, key: &str) -> Result<usize, usize> {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let middle = (low + high) / 2;
            match self.key(middle).cmp(key) {
                std::cmp::Ordering::Less => low = middle + 1,
                std::cmp::Ordering::Greater => high = middle,
                std::cmp::Ordering::Equal => return Ok(middle),
            }
        }
        Err(low)
    }

    /// Appends a key greater than every key held.
    fn push(&mut self, key: &str) {
        debug_assert!(self.len() == 0 || self.key(self.len() - 1) < key);
        self.text.push_str(key);
        self.ends
            .push(u32::try_from(self.text.len()).expect("a commit's keys fit in 4 GiB"));
        self.superseded.push(false);
        self.live += 1;
    }

    /// The live keys, in order.
    fn live_keys(&self) -> impl Iterator<Item = &str> {
        (0..self.len())
            .filter(|i| !self.superseded[*i])
            .map(|i| self.key(i))
    }

    /// Rebuilds the commit from its live keys and `extra` (sorted, unique).
    fn rebuilt_with(&self, extra: &[&str]) -> Commit {
        let mut keys: Vec<&str> = self.live_keys().chain(extra.iter().copied()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut commit = Commit::default();
        for key in keys {
            commit.push(key);
        }
        commit.shrink();
        commit
    }

    fn shrink(&mut self) {
        self.text.shrink_to_fit();
        self.ends.shrink_to_fit();
        self.superseded.shrink_to_fit();
    }
}

impl ChangeIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counters listed (one entry each, once told of every superseded entry).
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no counter is listed.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Every commit with a listed key, in order, with its listed keys in order.
    pub fn commits(&self) -> impl Iterator<Item = (u64, Vec<&str>)> {
        self.commits
            .iter()
            .map(|(seq, commit)| (*seq, commit.live_keys().collect()))
    }

    /// Lists `key` at `seq` while rebuilding from counter records read in
    /// key order (so each commit's keys arrive sorted); call
    /// [`Self::finish_rebuild`] after the last one.
    pub fn push_recovered(&mut self, seq: u64, key: &str) {
        let commit = self.commits.entry(seq).or_default();
        if commit.len() > 0 && commit.key(commit.len() - 1) >= key {
            // Not in key order after all: take the slow, general path.
            *commit = commit.rebuilt_with(&[key]);
            self.live = self.commits.values().map(|c| c.live).sum();
            return;
        }
        commit.push(key);
        self.live += 1;
    }

    /// Gives back the spare capacity that a rebuild grew.
    pub fn finish_rebuild(&mut self) {
        self.commits.values_mut().for_each(Commit::shrink);
    }

    /// Lists what `batch` writes and forgets what it says is superseded.
    pub fn apply(&mut self, batch: &CommitBatch) {
        for change in &batch.superseded {
            self.forget(change.seq, &change.key);
        }
        if batch.counters.is_empty() {
            return;
        }
        let mut keys: Vec<&str> = batch.counters.iter().map(|(key, _)| &**key).collect();
        keys.sort_unstable();
        keys.dedup();
        let commit = self.commits.entry(batch.seq).or_default();
        let before = commit.live;
        if commit.len() == 0 {
            for key in keys {
                commit.push(key);
            }
            commit.shrink();
        } else {
            // The same commit written twice (never by the core; kept correct).
            *commit = commit.rebuilt_with(&keys);
        }
        self.live = self.live - before + commit.live;
    }

    /// Forgets the entry of `key` at `seq`, if listed.
    fn forget(&mut self, seq: u64, key: &str) {
        let Some(commit) = self.commits.get_mut(&seq) else {
            return;
        };
        let Ok(index) = commit.find(key) else {
            return;
        };
        if commit.superseded[index] {
            return;
        }
        commit.superseded[index] = true;
        commit.live -= 1;
        self.live -= 1;
        if commit.live == 0 {
            self.commits.remove(&seq);
        } else if commit.len() >= COMPACT_FROM && commit.live * 2 < commit.len() {
            *commit = commit.rebuilt_with(&[]);
        }
    }

    /// Entries strictly after `after`, in (commit, key) order, at most `limit`.
    /// A cursor with an empty key stands after every entry of its commit.
    pub fn after(&self, after: &Cursor, limit: usize) -> Vec<Change> {
        let mut changes = Vec::new();
        let (first, within) = if after.key.is_empty() {
            match after.seq.checked_add(1) {
                Some(next) => (next, None),
                None => return changes,
            }
        } else {
            (after.seq, Some(after.key.as_str()))
        };
        for (&seq, commit) in self.commits.range(first..) {
            let start = match within {
                Some(key) if seq == after.seq => match commit.find(key) {
                    Ok(index) => index + 1,
                    Err(index) => index,
                },
                _ => 0,
            };
            for index in start..commit.len() {
                if commit.superseded[index] {
                    continue;
                }
                if changes.len() >= limit {
                    return changes;
                }
                changes.push(Change {
                    seq,
                    key: commit.key(index).into(),
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crdt::PnCounter;

    fn batch(seq: u64, keys: &[&str], superseded: &[(u64, &str)]) -> CommitBatch {
        CommitBatch {
            seq,
            counters: keys
                .iter()
                .map(|k| ((*k).into(), PnCounter::default()))
                .collect(),
            superseded: superseded
                .iter()
                .map(|(seq, key)| Change {
                    seq: *seq,
                    key: (*key).into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn listed(index: &ChangeIndex, after: Cursor, limit: usize) -> Vec<(u64, String)> {
        index
            .after(&after, limit)
            .into_iter()
            .map(|c| (c.seq, c.key.to_string()))
            .collect()
    }

    fn at(seq: u64, key: &str) -> Cursor {
        Cursor {
            seq,
            key: key.into(),
        }
    }

    #[test]
    fn entries_come_in_commit_then_key_order_after_an_exclusive_cursor() {
        let mut index = ChangeIndex::new();
        index.apply(&batch(1, &["b", "a", "c"], &[]));
        index.apply(&batch(4, &["d"], &[]));
        let all = vec![
            (1, "a".to_string()),
            (1, "b".into()),
            (1, "c".into()),
            (4, "d".into()),
        ];
        assert_eq!(listed(&index, Cursor::default(), 10), all);
        assert_eq!(listed(&index, at(1, "a"), 10), all[1..]);
        assert_eq!(
            listed(&index, at(1, "aa"), 10),
            all[1..],
            "a cursor between keys"
        );
        assert_eq!(listed(&index, at(1, "c"), 10), all[3..]);
        assert_eq!(listed(&index, Cursor::after_seq(1), 10), all[3..]);
        assert_eq!(listed(&index, at(2, "zz"), 10), all[3..]);
        assert_eq!(listed(&index, Cursor::default(), 2), all[..2]);
        assert!(listed(&index, Cursor::after_seq(4), 10).is_empty());
        assert!(listed(&index, Cursor::after_seq(u64::MAX), 10).is_empty());
        assert_eq!(index.len(), 4);
    }

    #[test]
    fn superseded_entries_go_and_an_emptied_commit_with_them() {
        let mut index = ChangeIndex::new();
        index.apply(&batch(1, &["a", "b"], &[]));
        index.apply(&batch(2, &["a"], &[]));
        assert_eq!(index.len(), 3, "listed until the store is told");
        index.apply(&batch(3, &["b"], &[(1, "a"), (1, "zz"), (9, "a")]));
        assert_eq!(
            listed(&index, Cursor::default(), 10),
            vec![(1, "b".to_string()), (2, "a".into()), (3, "b".into())]
        );
        index.apply(&batch(4, &[], &[(1, "b"), (1, "b")]));
        assert_eq!(
            listed(&index, Cursor::default(), 10),
            vec![(2, "a".to_string()), (3, "b".into())]
        );
        assert_eq!(index.len(), 2);
        assert_eq!(index.commits.len(), 2, "commit 1 is gone");
    }

    #[test]
    fn a_mostly_superseded_commit_is_compacted_and_still_answers() {
        let mut index = ChangeIndex::new();
        let keys: Vec<String> = (0..100).map(|i| format!("k{i:03}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        index.apply(&batch(1, &refs, &[]));
        let gone: Vec<(u64, &str)> = refs[..90].iter().map(|k| (1, *k)).collect();
        index.apply(&batch(2, &refs[..90], &gone));
        let first = &index.commits[&1];
        assert_eq!(first.live, 10);
        assert!(first.len() < 50, "compacted: {} keys kept", first.len());
        assert_eq!(index.len(), 100);
        let after = listed(&index, at(1, "k094"), 3);
        assert_eq!(
            after,
            vec![
                (1, "k095".to_string()),
                (1, "k096".into()),
                (1, "k097".into())
            ]
        );
        index.apply(&batch(3, &[], &[(1, "k095")]));
        assert_eq!(
            listed(&index, at(1, "k094"), 1),
            vec![(1, "k096".to_string())]
        );
    }

    #[test]
    fn a_rebuild_lists_what_the_batches_listed() {
        let mut written = ChangeIndex::new();
        written.apply(&batch(1, &["a", "b", "c"], &[]));
        written.apply(&batch(2, &["b"], &[]));
        written.apply(&batch(3, &["c"], &[(1, "b")]));
        written.apply(&batch(4, &[], &[(1, "c")]));
        // Counter records in key order: a@1, b@2, c@3.
        let mut rebuilt = ChangeIndex::new();
        for (seq, key) in [(1, "a"), (2, "b"), (3, "c")] {
            rebuilt.push_recovered(seq, key);
        }
        rebuilt.finish_rebuild();
        assert_eq!(
            listed(&rebuilt, Cursor::default(), 10),
            listed(&written, Cursor::default(), 10)
        );
        // Out of order is still right, only slower.
        rebuilt.push_recovered(1, "0");
        assert_eq!(
            listed(&rebuilt, Cursor::default(), 1),
            vec![(1, "0".to_string())]
        );
        assert_eq!(rebuilt.len(), 4);
    }

    #[test]
    fn the_same_commit_written_twice_lists_the_union() {
        let mut index = ChangeIndex::new();
        index.apply(&batch(5, &["b", "a"], &[]));
        index.apply(&batch(5, &["c", "a"], &[]));
        assert_eq!(
            listed(&index, Cursor::default(), 10),
            vec![(5, "a".to_string()), (5, "b".into()), (5, "c".into())]
        );
        assert_eq!(index.len(), 3);
    }
}
