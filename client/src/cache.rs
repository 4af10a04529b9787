//! The optional read cache of a [`Client`](crate::Client): the values of the
//! most recently used counters, each answered locally for a short TTL.
//!
//! It holds at most `capacity` counters (least recently used out first) and
//! a fixed table of add guards, so its memory is bounded. All times are
//! passed in.
//!
//! Invariants:
//!
//! - A value is served only while it is younger than the TTL, its age being
//!   counted from when the request that fetched it was sent (an upper bound).
//! - Read-your-writes on one client: once a local add has been answered, a
//!   value served for that counter reflects it. For that, every answered add
//!   raises the guard of its counter's slot in the guard table to the time
//!   of its answer; a read's value is stored only if the read was sent after
//!   the guard (so the node applied those adds before reading), and an add's
//!   own answer replaces the cached value only if no other local add of that
//!   counter was answered since it was sent, else the entry is dropped (as
//!   it is by a duplicate, whose value is its first application's). Two
//!   counters may share a guard slot: that only costs a store now and then.
//! - A get never overwrites a value with one fetched by an older request.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::AddOutcome;

/// No slot (the end of the recency list).
const NIL: usize = usize::MAX;

/// Guard slots per cached counter (rounded up to a power of two, within
/// the bounds below): fewer shared slots, fewer dropped stores.
const GUARDS_PER_ENTRY: usize = 4;
const MIN_GUARDS: usize = 64;
const MAX_GUARDS: usize = 1 << 16;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ReadCache {
    ttl: Duration,
    inner: Mutex<Lru>,
}

#[derive(Debug)]
struct Entry {
    key: Arc<str>,
    value: i64,
    /// When the request that fetched `value` was sent.
    as_of: Instant,
    /// Toward the most recently used entry.
    newer: usize,
    /// Toward the least recently used entry.
    older: usize,
}

#[derive(Debug)]
struct Lru {
    capacity: usize,
    index: HashMap<Arc<str>, usize>,
    entries: Vec<Entry>,
    free: Vec<usize>,
    newest: usize,
    oldest: usize,
    /// The latest answer time of a local add, per slot of counter keys.
    guards: Vec<Option<Instant>>,
    hasher: RandomState,
}

impl ReadCache {
    /// A cache of at most `capacity` counters (at least 1), each served for
    /// `ttl`.
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Self {
        let capacity = capacity.max(1);
        let guards = (capacity * GUARDS_PER_ENTRY)
            .clamp(MIN_GUARDS, MAX_GUARDS)
            .next_power_of_two();
        ReadCache {
            ttl,
            inner: Mutex::new(Lru {
                capacity,
                index: HashMap::with_capacity(capacity),
                entries: Vec::with_capacity(capacity),
                free: Vec::new(),
                newest: NIL,
                oldest: NIL,
                guards: vec![None; guards],
                hasher: RandomState::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lru> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cached value of `key` if it is fresh at `now`.
    pub(crate) fn fresh(&self, key: &str, now: Instant) -> Option<i64> {
        let mut lru = self.lock();
        let slot = *lru.index.get(key)?;
        let entry = &lru.entries[slot];
        if now.saturating_duration_since(entry.as_of) >= self.ttl {
            return None;
        }
        let value = entry.value;
        lru.touch(slot);
        Some(value)
    }

    /// Stores `value`, read from the node by a request sent at `sent_at`.
    pub(crate) fn record_read(&self, key: &str, sent_at: Instant, value: i64) {
        let mut lru = self.lock();
        let guard = lru.guard_slot(key);
        if lru.guards[guard].is_some_and(|answered| sent_at < answered) {
            return;
        }
        match lru.index.get(key) {
            Some(&slot) => {
                let entry = &mut lru.entries[slot];
                if sent_at >= entry.as_of {
                    entry.value = value;
                    entry.as_of = sent_at;
                }
                lru.touch(slot);
            }
            None => lru.insert(key, value, sent_at),
        }
    }

    /// Takes the answer to a local add of `key` sent at `sent_at` and
    /// answered at `answered_at`. A fresh add's `value` (the counter's value
    /// right after it) replaces the cached one; a duplicate's value is the
    /// one its first application got, maybe long ago, so it drops the entry.
    pub(crate) fn record_add(
        &self,
        key: &str,
        sent_at: Instant,
        answered_at: Instant,
        outcome: AddOutcome,
    ) {
        let mut lru = self.lock();
        let guard = lru.guard_slot(key);
        let raced =
            outcome.duplicate || lru.guards[guard].is_some_and(|answered| sent_at < answered);
        lru.guards[guard] = Some(lru.guards[guard].map_or(answered_at, |g| g.max(answered_at)));
        let Some(&slot) = lru.index.get(key) else {
            return;
        };
        if raced {
            lru.remove(slot);
        } else {
            let entry = &mut lru.entries[slot];
            entry.value = outcome.value;
            entry.as_of = sent_at;
        }
    }

    /// How many counters are cached.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().index.len()
    }
}

impl Lru {
    fn guard_slot(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) & (self.guards.len() - 1)
    }

    fn insert(&mut self, key: &str, value: i64, as_of: Instant) {
        if self.index.len() >= self.capacity && self.oldest != NIL {
            self.remove(self.oldest);
        }
        let key: Arc<str> = Arc::from(key);
        let entry = Entry {
            key: Arc::clone(&key),
            value,
            as_of,
            newer: NIL,
            older: NIL,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.entries[slot] = entry;
                slot
            }
            None => {
                self.entries.push(entry);
                self.entries.len() - 1
            }
        };
        self.index.insert(key, slot);
        self.link_newest(slot);
    }

    fn remove(&mut self, slot: usize) {
        self.unlink(slot);
        let key = Arc::clone(&self.entries[slot].key);
        self.index.remove(&*key);
        self.free.push(slot);
    }

    /// Marks `slot` most recently used.
    fn touch(&mut self, slot: usize) {
        if self.newest != slot {
            self.unlink(slot);
            self.link_newest(slot);
        }
    }

    fn unlink(&mut self, slot: usize) {
        let (newer, older) = (self.entries[slot].newer, self.entries[slot].older);
        match newer {
            NIL => self.newest = older,
            newer => self.entries[newer].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            older => self.entries[older].newer = newer,
        }
    }

    fn link_newest(&mut self, slot: usize) {
        self.entries[slot].newer = NIL;
        self.entries[slot].older = self.newest;
        match self.newest {
            NIL => self.oldest = slot,
            newest => self.entries[newest].newer = slot,
        }
        self.newest = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);

    fn fresh_add(value: i64) -> AddOutcome {
        AddOutcome {
            value,
            duplicate: false,
        }
    }

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    #[test]
    fn a_value_is_served_until_its_ttl_runs_out() {
        let cache = ReadCache::new(10, TTL);
        let t0 = Instant::now();
        assert_eq!(cache.fresh("k", t0), None);
        cache.record_read("k", t0, 41);
        assert_eq!(cache.fresh("k", at(t0, 1_999)), Some(41));
        assert_eq!(cache.fresh("k", at(t0, 2_000)), None);
    }

    #[test]
    fn the_least_recently_used_counter_goes_first() {
        let cache = ReadCache::new(2, TTL);
        let t0 = Instant::now();
        cache.record_read("a", t0, 1);
        cache.record_read("b", t0, 2);
        assert_eq!(cache.fresh("a", t0), Some(1)); // b is now the oldest
        cache.record_read("c", t0, 3);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.fresh("b", t0), None);
        assert_eq!(cache.fresh("a", t0), Some(1));
        assert_eq!(cache.fresh("c", t0), Some(3));
        for i in 0..100 {
            cache.record_read(&format!("k{i}"), t0, i);
        }
        assert_eq!(cache.len(), 2, "bounded");
        assert_eq!(cache.fresh("k99", t0), Some(99));
        assert_eq!(cache.fresh("k98", t0), Some(98));
    }

    #[test]
    fn a_local_add_updates_the_cached_value() {
        let cache = ReadCache::new(10, TTL);
        let t0 = Instant::now();
        cache.record_read("k", t0, 10);
        cache.record_add("k", at(t0, 5), at(t0, 6), fresh_add(11));
        assert_eq!(cache.fresh("k", at(t0, 7)), Some(11));
        // Counted from the add's send: fresh until 2.005 s.
        assert_eq!(cache.fresh("k", at(t0, 2_004)), Some(11));
        assert_eq!(cache.fresh("k", at(t0, 2_005)), None);
    }

    #[test]
    fn a_read_sent_before_a_local_add_was_answered_is_not_stored() {
        let cache = ReadCache::new(10, TTL);
        let t0 = Instant::now();
        // The read leaves at 0, the add is answered at 2, the read's (older)
        // value arrives at 3.
        cache.record_add("k", at(t0, 1), at(t0, 2), fresh_add(11));
        cache.record_read("k", t0, 10);
        assert_eq!(cache.fresh("k", at(t0, 3)), None);
        cache.record_read("k", at(t0, 4), 11);
        assert_eq!(cache.fresh("k", at(t0, 5)), Some(11));
    }

    #[test]
    fn racing_local_adds_drop_the_entry() {
        let cache = ReadCache::new(10, TTL);
        let t0 = Instant::now();
        cache.record_read("k", t0, 10);
        // Two adds in flight together; whichever the node applied last, the
        // cache cannot tell, so it forgets the counter.
        cache.record_add("k", at(t0, 1), at(t0, 3), fresh_add(12));
        assert_eq!(cache.fresh("k", at(t0, 3)), Some(12));
        cache.record_add("k", at(t0, 2), at(t0, 4), fresh_add(11));
        assert_eq!(cache.fresh("k", at(t0, 4)), None);
    }

    #[test]
    fn a_duplicate_add_drops_the_entry() {
        let cache = ReadCache::new(10, TTL);
        let t0 = Instant::now();
        cache.record_read("k", t0, 10);
        let duplicate = AddOutcome {
            value: 3,
            duplicate: true,
        };
        cache.record_add("k", at(t0, 1), at(t0, 2), duplicate);
        assert_eq!(cache.fresh("k", at(t0, 3)), None);
    }

    #[test]
    fn an_older_read_does_not_overwrite_a_newer_one() {
        let cache = ReadCache::new(10, TTL);
        let t0 = Instant::now();
        cache.record_read("k", at(t0, 2), 20);
        cache.record_read("k", at(t0, 1), 10);
        assert_eq!(cache.fresh("k", at(t0, 3)), Some(20));
    }
}
