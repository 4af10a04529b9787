//! The idempotency table: which keyed adds were applied, and what they answered.
//!
//! Invariant 5 of DESIGN.md: a retried add with the same idempotency key is
//! applied once. Records are kept for a time-to-live (default 24 h) and at most
//! `capacity` of them (the oldest go first), and they are written to disk in the
//! same commit as the add they describe, so a crash never splits them.

use std::collections::{HashMap, VecDeque};

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

/// Remembered keyed adds, bounded in time and in count.
#[derive(Debug)]
pub struct IdempotencyTable {
    records: HashMap<u128, IdempotencyRecord>,
    /// Record ids in the order they expire.
    expiry: VecDeque<(u64, u128)>,
    ttl_ms: u64,
    capacity: usize,
}

impl IdempotencyTable {
    /// An empty table.
    pub fn new(ttl_ms: u64, capacity: usize) -> Self {
        IdempotencyTable {
            records: HashMap::new(),
            expiry: VecDeque::new(),
            ttl_ms,
            capacity: capacity.max(1),
        }
    }

    /// The table with the records recovered from disk, expired ones dropped.
    pub fn recovered(
        ttl_ms: u64,
        capacity: usize,
        mut records: Vec<IdempotencyRecord>,
        now_ms: u64,
    ) -> Self {
        let mut table = Self::new(ttl_ms, capacity);
        records.sort_by_key(|record| record.expires_at_ms);
        for record in records
            .into_iter()
            .filter(|record| record.expires_at_ms > now_ms)
        {
            table.expiry.push_back((record.expires_at_ms, record.id));
            table.records.insert(record.id, record);
        }
        table
    }

    /// The live record for `id`, if any.
    pub fn get(&self, id: u128, now_ms: u64) -> Option<&IdempotencyRecord> {
        self.records
            .get(&id)
            .filter(|record| record.expires_at_ms > now_ms)
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
        self.expiry.push_back((record.expires_at_ms, id));
        self.records.insert(id, record.clone());
        record
    }

    /// Forgets expired records and, past the capacity, the oldest ones.
    /// Returns the ids to delete from disk.
    pub fn expire(&mut self, now_ms: u64) -> Vec<u128> {
        let mut forgotten = Vec::new();
        while let Some(&(expires_at, id)) = self.expiry.front() {
            if expires_at > now_ms && self.records.len() <= self.capacity {
                break;
            }
            self.expiry.pop_front();
            // A record replaced by a newer one with the same id keeps its newer expiry.
            if self
                .records
                .get(&id)
                .is_some_and(|record| record.expires_at_ms == expires_at)
            {
                self.records.remove(&id);
                forgotten.push(id);
            }
        }
        forgotten
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
        assert_eq!(table.get(id, 999).map(|r| r.value), Some(5));
        assert!(table.get(id, 1_000).is_none());
        assert_eq!(table.expire(1_000), vec![id]);
        assert!(table.is_empty());
    }

    #[test]
    fn the_oldest_records_go_past_the_capacity() {
        let mut table = IdempotencyTable::new(1_000_000, 2);
        let ids: Vec<u128> = (0..3).map(|i| idempotency_id(&format!("k{i}"))).collect();
        for (at, id) in ids.iter().enumerate() {
            table.insert(*id, 0, 0, 1, at as u64);
        }
        assert_eq!(table.expire(10), vec![ids[0]]);
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
        let table = IdempotencyTable::recovered(100, 10, vec![live, dead], 10);
        assert_eq!(table.len(), 1);
        assert!(table.get(1, 10).is_some());
    }

    #[test]
    fn ids_and_fingerprints_differ_by_input() {
        assert_ne!(idempotency_id("a"), idempotency_id("b"));
        assert_ne!(request_fingerprint("a", 1), request_fingerprint("a", 2));
        assert_ne!(request_fingerprint("a", 1), request_fingerprint("b", 1));
    }
}
