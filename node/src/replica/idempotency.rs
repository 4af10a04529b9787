//! The idempotency table: which keyed adds were applied, and what they answered.
//!
//! Invariant 5 of DESIGN.md: a retried add with the same idempotency key is
//! applied once. Records are kept for a time-to-live (default 24 h) and at most
//! `capacity` of them (the oldest go first), and they are written to disk in the
//! same commit as the add they describe, so a crash never splits them.
//!
//! On disk, the records of one commit form one *segment* keyed by the commit's
//! sequence: one store write per commit, however many keyed adds it holds, and
//! appended in order (a random key per record made the store copy a leaf per
//! add). A segment is deleted once every record in it is forgotten.
//!
//! In memory a record costs what a million of them make visible: the id is
//! the map's key only (as two `u64`s, so nothing is padded to 16 bytes), and
//! the expiry queue holds (expiry, id) pairs of 24 bytes.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::crdt::stable_hash;

use super::types::IdempotencyRecord;

/// The hash of an idempotency key, as remembered.
pub fn idempotency_id(key: &str) -> u128 {
    let high = stable_hash(0x7461_6c6c_795f_6964, &[key.as_bytes()]);
    let low = stable_hash(0x6964_656d_706f_7465, &[key.as_bytes()]);
    (u128::from(high) << 64) | u128::from(low)
}

/// The hash of what an add asks for, to tell a retry from a reused key.
pub fn request_fingerprint(counter: &str, delta: i64) -> u64 {
    stable_hash(0x6670, &[counter.as_bytes(), &delta.to_le_bytes()])
}

/// A record's id as the table keys it (a `u128` would be 16-byte aligned
/// and pad every entry).
type Id = [u64; 2];

fn split(id: u128) -> Id {
    [(id >> 64) as u64, id as u64]
}

/// A remembered record without its id (the map's key), and the segment
/// (commit) that holds it on disk; 0 while it waits for its commit.
#[derive(Debug)]
struct Entry {
    fingerprint: u64,
    value: i64,
    seq: u64,
    expires_at_ms: u64,
    segment: u64,
}

impl Entry {
    fn new(record: &IdempotencyRecord, segment: u64) -> Self {
        Entry {
            fingerprint: record.fingerprint,
            value: record.value,
            seq: record.seq,
            expires_at_ms: record.expires_at_ms,
            segment,
        }
    }

    fn record(&self, id: u128) -> IdempotencyRecord {
        IdempotencyRecord {
            id,
            fingerprint: self.fingerprint,
            value: self.value,
            seq: self.seq,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

/// Remembered keyed adds, bounded in time and in count.
#[derive(Debug)]
pub struct IdempotencyTable {
    records: HashMap<Id, Entry>,
    /// Record ids in the order they expire.
    expiry: VecDeque<(u64, Id)>,
    /// Records still remembered per segment.
    segments: BTreeMap<u64, usize>,
    ttl_ms: u64,
    capacity: usize,
}

impl IdempotencyTable {
    /// An empty table.
    pub fn new(ttl_ms: u64, capacity: usize) -> Self {
        IdempotencyTable {
            records: HashMap::new(),
            expiry: VecDeque::new(),
            segments: BTreeMap::new(),
            ttl_ms,
            capacity: capacity.max(1),
        }
    }

    /// The table with the records recovered from disk (with their segments),
    /// expired ones dropped.
    pub fn recovered(
        ttl_ms: u64,
        capacity: usize,
        mut records: Vec<(u64, IdempotencyRecord)>,
        now_ms: u64,
    ) -> Self {
        let mut table = Self::new(ttl_ms, capacity);
        records.sort_by_key(|(_, record)| record.expires_at_ms);
        for (segment, record) in records
            .into_iter()
            .filter(|(_, record)| record.expires_at_ms > now_ms)
        {
            table
                .expiry
                .push_back((record.expires_at_ms, split(record.id)));
            *table.segments.entry(segment).or_default() += 1;
            table
                .records
                .insert(split(record.id), Entry::new(&record, segment));
        }
        table
    }

    /// The live record for `id`, if any.
    pub fn get(&self, id: u128, now_ms: u64) -> Option<IdempotencyRecord> {
        self.records
            .get(&split(id))
            .filter(|entry| entry.expires_at_ms > now_ms)
            .map(|entry| entry.record(id))
    }

    /// Remembers an applied add and returns the record to persist.
    pub fn insert(
        &mut self,
        id: u128,
        fingerprint: u64,
        value: i64,
        seq: u64,
        now_ms: u64,
    ) -> IdempotencyRecord {
        let record = IdempotencyRecord {
            id,
            fingerprint,
            value,
            seq,
            expires_at_ms: now_ms.saturating_add(self.ttl_ms),
        };
        self.expiry.push_back((record.expires_at_ms, split(id)));
        let replaced = self.records.insert(split(id), Entry::new(&record, 0));
        if let Some(old) = replaced {
            self.release(old.segment, &mut Vec::new());
        }
        record
    }

    /// The records of `ids` are written in the commit (segment) `seq`.
    pub fn assign_segment(&mut self, seq: u64, ids: impl Iterator<Item = u128>) {
        for id in ids {
            if let Some(entry) = self.records.get_mut(&split(id)) {
                entry.segment = seq;
                *self.segments.entry(seq).or_default() += 1;
            }
        }
    }

    /// The commit `seq` failed: its records wait for the next one.
    pub fn unassign_segment(&mut self, seq: u64) {
        if self.segments.remove(&seq).is_some() {
            for entry in self
                .records
                .values_mut()
                .filter(|entry| entry.segment == seq)
            {
                entry.segment = 0;
            }
        }
    }

    fn release(&mut self, segment: u64, emptied: &mut Vec<u64>) {
        if segment == 0 {
            return;
        }
        if let Some(count) = self.segments.get_mut(&segment) {
            *count -= 1;
            if *count == 0 {
                self.segments.remove(&segment);
                emptied.push(segment);
            }
        }
    }

    /// Forgets expired records and, past the capacity, the oldest ones; at
    /// most `budget` of them. Returns the segments left empty, to delete from disk.
    pub fn expire(&mut self, now_ms: u64, budget: usize) -> Vec<u64> {
        let mut emptied = Vec::new();
        let mut spent = 0;
        while let Some(&(expires_at, id)) = self.expiry.front() {
            if spent >= budget || (expires_at > now_ms && self.records.len() <= self.capacity) {
                break;
            }
            spent += 1;
            self.expiry.pop_front();
            // A record replaced by a newer one with the same id keeps its newer expiry.
            let current = self
                .records
                .get(&id)
                .is_some_and(|entry| entry.expires_at_ms == expires_at);
            if current {
                let entry = self.records.remove(&id).expect("checked above");
                self.release(entry.segment, &mut emptied);
            }
        }
        emptied
    }

    /// How many records are remembered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_expire_after_the_ttl() {
        let mut table = IdempotencyTable::new(1_000, 10);
        let id = idempotency_id("retry-1");
        table.insert(id, 1, 5, 1, 0);
        table.assign_segment(1, [id].into_iter());
        assert_eq!(table.get(id, 999).map(|r| r.value), Some(5));
        assert_eq!(
            table.get(id, 999).map(|r| r.id),
            Some(id),
            "the id comes back whole"
        );
        assert!(table.get(id, 1_000).is_none());
        assert_eq!(
            table.expire(1_000, usize::MAX),
            vec![1],
            "the segment is emptied"
        );
        assert!(table.is_empty());
    }

    #[test]
    fn the_oldest_records_go_past_the_capacity() {
        let mut table = IdempotencyTable::new(1_000_000, 2);
        let ids: Vec<u128> = (0..3).map(|i| idempotency_id(&format!("k{i}"))).collect();
        for (at, id) in ids.iter().enumerate() {
            table.insert(*id, 0, 0, 1, at as u64);
        }
        table.assign_segment(4, ids[..2].iter().copied());
        table.assign_segment(5, ids[2..].iter().copied());
        assert!(
            table.expire(10, usize::MAX).is_empty(),
            "segment 4 still holds a record"
        );
        assert_eq!(table.len(), 2);
        assert!(table.get(ids[2], 10).is_some());
    }

    #[test]
    fn recovery_drops_expired_records() {
        let live = IdempotencyRecord {
            id: 1,
            fingerprint: 0,
            value: 3,
            seq: 1,
            expires_at_ms: 50,
        };
        let dead = IdempotencyRecord {
            id: 2,
            fingerprint: 0,
            value: 3,
            seq: 1,
            expires_at_ms: 5,
        };
        let table = IdempotencyTable::recovered(100, 10, vec![(3, live), (2, dead)], 10);
        assert_eq!(table.len(), 1);
        assert!(table.get(1, 10).is_some());
    }

    #[test]
    fn a_failed_commit_returns_its_records_to_the_next_segment() {
        let mut table = IdempotencyTable::new(1_000, 10);
        table.insert(9, 0, 0, 1, 0);
        table.assign_segment(1, [9].into_iter());
        table.unassign_segment(1);
        table.assign_segment(2, [9].into_iter());
        assert_eq!(table.expire(5_000, usize::MAX), vec![2]);
    }

    #[test]
    fn an_entry_and_its_queue_item_stay_small() {
        // A million remembered adds are a million of each (times the map's
        // spare capacity): 56 and 24 bytes, not the 80 and 32 of u128 keys.
        assert_eq!(std::mem::size_of::<(Id, Entry)>(), 56);
        assert_eq!(std::mem::size_of::<(u64, Id)>(), 24);
    }

    #[test]
    fn ids_and_fingerprints_differ_by_input() {
        assert_ne!(idempotency_id("a"), idempotency_id("b"));
        assert_ne!(request_fingerprint("a", 1), request_fingerprint("a", 2));
        assert_ne!(request_fingerprint("a", 1), request_fingerprint("b", 1));
    }
}
