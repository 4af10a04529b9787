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
//! In memory a record costs what a million of them make visible. Records sit
//! in one queue in the order they expire (every record gets the same TTL when
//! it is inserted, and recovery sorts them), 56 bytes each; the lookup by id
//! is a hash table of queue positions, 8 bytes (plus a control byte) per
//! bucket. A map from id to record, with a separate expiry queue, took about
//! twice as much.
//!
//! Ids are keyed hashes of the clients' keys ([`IdHasher`]). Records also
//! travel between the nodes of a region (`idempotency_sync.rs`), so that a
//! retry that fails over to another owner is recognised: a record made on
//! another node keeps the id that node gave it, under that node's key, and
//! the table looks a key up under its own key and under every key of the
//! region it has learned.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use crate::crdt::stable_hash;
use crate::partition::Partition;

use super::types::IdempotencyRecord;

/// The id that builds before keyed ids gave an idempotency key: two unkeyed
/// 64-bit hashes, so a client could craft two keys with one id and have a
/// real add dropped as a "duplicate". Still computed to recognise retries of
/// records written by those builds, until the last of them expires.
pub fn legacy_idempotency_id(key: &str) -> u128 {
    let high = stable_hash(0x7461_6c6c_795f_6964, &[key.as_bytes()]);
    let low = stable_hash(0x6964_656d_706f_7465, &[key.as_bytes()]);
    (u128::from(high) << 64) | u128::from(low)
}

/// How an idempotency key becomes the id that is remembered: SipHash-1-3
/// with a 128-bit output under the store's secret key (random, created with
/// the store and kept in it, so ids are stable across restarts and nobody
/// outside can aim two keys at one id). Records of older builds carry
/// unkeyed ids ([`legacy_idempotency_id`]); those are also looked for until
/// the last of them has expired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdHasher {
    key: u128,
    legacy_until_ms: u64,
    /// The keys of other nodes whose records this table may hold (learned
    /// with their records; a few per region).
    others: Vec<u128>,
}

impl IdHasher {
    /// Ids under `key`; records with unkeyed ids may be remembered until
    /// `legacy_until_ms` (0: none are).
    pub fn new(key: u128, legacy_until_ms: u64) -> Self {
        IdHasher {
            key,
            legacy_until_ms,
            others: Vec::new(),
        }
    }

    /// Ids made under `key` by another node are looked for too. Returns
    /// false when the key was known already (or is this table's own).
    pub fn learn(&mut self, key: u128) -> bool {
        if key == self.key || self.others.contains(&key) {
            return false;
        }
        self.others.push(key);
        true
    }

    /// Every key ids are looked for under: this table's own (the one its
    /// new records are made under) first, then the other nodes' learned.
    pub fn keys(&self) -> impl Iterator<Item = u128> + '_ {
        std::iter::once(self.key).chain(self.others.iter().copied())
    }

    /// The id of an idempotency key, as this build remembers it.
    pub fn id(&self, idempotency_key: &str) -> u128 {
        id_under(self.key, idempotency_key)
    }

    /// The ids other nodes of the region gave the key (under their keys).
    fn others_ids<'a>(&'a self, idempotency_key: &'a str) -> impl Iterator<Item = u128> + 'a {
        self.others
            .iter()
            .map(|key| id_under(*key, idempotency_key))
    }

    /// The id older builds gave the key, while records of theirs may still
    /// be remembered.
    fn legacy_id(&self, idempotency_key: &str, now_ms: u64) -> Option<u128> {
        (now_ms < self.legacy_until_ms).then(|| legacy_idempotency_id(idempotency_key))
    }
}

/// The id of `idempotency_key` under the id key `key`.
fn id_under(key: u128, idempotency_key: &str) -> u128 {
    siphasher::sip128::SipHasher13::new_with_key(&key.to_le_bytes())
        .hash(idempotency_key.as_bytes())
        .as_u128()
}

/// The hash of what an add asks for, to tell a retry from a reused key.
pub fn request_fingerprint(counter: &str, delta: i64) -> u64 {
    stable_hash(0x6670, &[counter.as_bytes(), &delta.to_le_bytes()])
}

/// A record's id as stored (a `u128` would be 16-byte aligned and pad
/// every record).
type Id = [u64; 2];

fn split(id: u128) -> Id {
    [(id >> 64) as u64, id as u64]
}

fn join(id: Id) -> u128 {
    (u128::from(id[0]) << 64) | u128::from(id[1])
}

/// A remembered record, and the segment (commit) that holds it on disk; 0
/// while it waits for its commit.
#[derive(Debug)]
struct Slot {
    id: Id,
    fingerprint: u64,
    value: i64,
    seq: u64,
    expires_at_ms: u64,
    segment: u64,
}

impl Slot {
    fn new(record: &IdempotencyRecord, segment: u64) -> Self {
        Slot {
            id: split(record.id),
            fingerprint: record.fingerprint,
            value: record.value,
            seq: record.seq,
            expires_at_ms: record.expires_at_ms,
            segment,
        }
    }

    /// The record, as a lookup answers it: without its partition, which
    /// only the segment on disk keeps (8 bytes more per record in memory,
    /// and a lookup needs none).
    fn record(&self) -> IdempotencyRecord {
        IdempotencyRecord {
            id: join(self.id),
            fingerprint: self.fingerprint,
            value: self.value,
            seq: self.seq,
            expires_at_ms: self.expires_at_ms,
            partition: None,
        }
    }
}

/// Remembered keyed adds, bounded in time and in count.
#[derive(Debug)]
pub struct IdempotencyTable {
    /// Records in the order they expire. A record replaced by a newer one
    /// with the same id stays here, unlisted, until it reaches the front.
    queue: VecDeque<Slot>,
    /// The position of `queue`'s front since the table began: positions
    /// count every record ever queued, so they survive pops at the front.
    front: u64,
    /// The position of the current record of each remembered id.
    positions: HashTable<u64>,
    hasher: RandomState,
    /// Records still remembered per segment.
    segments: BTreeMap<u64, usize>,
    /// Segments emptied outside [`Self::expire`] (their last record replaced
    /// by a newer one of its id): the next `expire` hands them out for
    /// deletion, or they would stay on disk forever.
    emptied: Vec<u64>,
    ttl_ms: u64,
    capacity: usize,
    ids: IdHasher,
}

/// The table's hash of an id. Ids are hashes of what clients send, but not
/// keyed ones, so the table hashes them again with a per-process key: a
/// client cannot pick keys that pile into one bucket.
fn hash(hasher: &RandomState, id: &Id) -> u64 {
    hasher.hash_one(id)
}

impl IdempotencyTable {
    /// An empty table whose ids are keyed with `ids`.
    pub fn new(ttl_ms: u64, capacity: usize, ids: IdHasher) -> Self {
        IdempotencyTable {
            ids,
            queue: VecDeque::new(),
            front: 0,
            positions: HashTable::new(),
            hasher: RandomState::new(),
            segments: BTreeMap::new(),
            emptied: Vec::new(),
            ttl_ms,
            capacity: capacity.max(1),
        }
    }

    /// The table with the records recovered from disk (with their segments),
    /// expired ones dropped.
    pub fn recovered(
        ttl_ms: u64,
        capacity: usize,
        ids: IdHasher,
        mut records: Vec<(u64, IdempotencyRecord)>,
        now_ms: u64,
    ) -> Self {
        let mut table = Self::new(ttl_ms, capacity, ids);
        records.retain(|(_, record)| record.expires_at_ms > now_ms);
        records.sort_by_key(|(_, record)| record.expires_at_ms);
        table.queue.reserve_exact(records.len());
        table.positions.reserve(records.len(), |_| 0);
        for (segment, record) in records {
            table.push(Slot::new(&record, segment));
        }
        table
    }

    fn slot(&self, position: u64) -> &Slot {
        &self.queue[(position - self.front) as usize]
    }

    fn slot_mut(&mut self, position: u64) -> &mut Slot {
        &mut self.queue[(position - self.front) as usize]
    }

    /// Where the current record of `id` is queued, if it is remembered.
    fn position(&self, id: &Id) -> Option<u64> {
        self.positions
            .find(hash(&self.hasher, id), |position| {
                self.slot(*position).id == *id
            })
            .copied()
    }

    /// Queues `slot` as the current record of its id; a record it replaces
    /// gives up its segment.
    fn push(&mut self, slot: Slot) {
        let Self {
            queue,
            front,
            positions,
            hasher,
            ..
        } = self;
        let id = slot.id;
        let position = *front + queue.len() as u64;
        if slot.segment != 0 {
            *self.segments.entry(slot.segment).or_default() += 1;
        }
        queue.push_back(slot);
        let at = |position: &u64| &queue[(*position - *front) as usize];
        let replaced = match positions.find_mut(hash(hasher, &id), |p| at(p).id == id) {
            Some(current) => Some(std::mem::replace(current, position)),
            None => {
                positions.insert_unique(hash(hasher, &id), position, |p| hash(hasher, &at(p).id));
                None
            }
        };
        if let Some(old) = replaced {
            let segment = self.slot(old).segment;
            self.release_later(segment);
        }
    }

    /// The id an idempotency key is remembered under from now on.
    pub fn id_of(&self, idempotency_key: &str) -> u128 {
        self.ids.id(idempotency_key)
    }

    /// The live record of an idempotency key, if any: under its id, under
    /// the id another node of the region gave it, or under the id an older
    /// build gave it.
    pub fn lookup(&self, idempotency_key: &str, now_ms: u64) -> Option<IdempotencyRecord> {
        self.get(self.ids.id(idempotency_key), now_ms)
            .or_else(|| {
                self.ids
                    .others_ids(idempotency_key)
                    .find_map(|id| self.get(id, now_ms))
            })
            .or_else(|| {
                self.ids
                    .legacy_id(idempotency_key, now_ms)
                    .and_then(|id| self.get(id, now_ms))
            })
    }

    /// The hasher of ids: this table's key and those it learned.
    pub fn hasher(&self) -> &IdHasher {
        &self.ids
    }

    /// Looks for ids made under `key` too (another node's, learned with its
    /// records). Returns true when the key is new.
    pub fn learn_key(&mut self, key: u128) -> bool {
        self.ids.learn(key)
    }

    /// The live record for `id`, if any.
    pub fn get(&self, id: u128, now_ms: u64) -> Option<IdempotencyRecord> {
        self.position(&split(id))
            .map(|position| self.slot(position))
            .filter(|slot| slot.expires_at_ms > now_ms)
            .map(Slot::record)
    }

    /// Remembers an applied add (to a counter of `partition`, if known) and
    /// returns the record to persist.
    pub fn insert(
        &mut self,
        id: u128,
        fingerprint: u64,
        value: i64,
        seq: u64,
        partition: Option<Partition>,
        now_ms: u64,
    ) -> IdempotencyRecord {
        let record = IdempotencyRecord {
            id,
            fingerprint,
            value,
            seq,
            expires_at_ms: now_ms.saturating_add(self.ttl_ms),
            partition,
        };
        self.push(Slot::new(&record, 0));
        record
    }

    /// Remembers a record that another node made (its id under that node's
    /// key, its expiry as that node set it), to be written in the commit
    /// `seq`; returns the record as kept. `None`, and nothing changes, when
    /// a live record of the same id is remembered already or the record has
    /// expired.
    pub fn insert_made_elsewhere(
        &mut self,
        record: &IdempotencyRecord,
        seq: u64,
        now_ms: u64,
    ) -> Option<IdempotencyRecord> {
        if record.expires_at_ms <= now_ms || self.get(record.id, now_ms).is_some() {
            return None;
        }
        let record = IdempotencyRecord { seq, ..*record };
        self.push(Slot::new(&record, 0));
        Some(record)
    }

    /// The records of `ids` are written in the commit (segment) `seq`.
    pub fn assign_segment(&mut self, seq: u64, ids: impl Iterator<Item = u128>) {
        for id in ids {
            if let Some(position) = self.position(&split(id)) {
                let slot = self.slot_mut(position);
                let previous = std::mem::replace(&mut slot.segment, seq);
                self.release_later(previous);
                *self.segments.entry(seq).or_default() += 1;
            }
        }
    }

    /// The commit `seq` failed: its records wait for the next one.
    pub fn unassign_segment(&mut self, seq: u64) {
        if self.segments.remove(&seq).is_some() {
            for slot in self.queue.iter_mut().filter(|slot| slot.segment == seq) {
                slot.segment = 0;
            }
        }
    }

    /// [`Self::release`], keeping an emptied segment for the next `expire`.
    fn release_later(&mut self, segment: u64) {
        let mut emptied = std::mem::take(&mut self.emptied);
        self.release(segment, &mut emptied);
        self.emptied = emptied;
    }

    /// One record fewer in `segment` (0: none yet).
    fn release(&mut self, segment: u64, emptied: &mut Vec<u64>) {
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
        let mut emptied = std::mem::take(&mut self.emptied);
        let mut spent = 0;
        while let Some(slot) = self.queue.front() {
            if spent >= budget || (slot.expires_at_ms > now_ms && self.len() <= self.capacity) {
                break;
            }
            spent += 1;
            let (id, front) = (slot.id, self.front);
            // A replaced record is no longer listed: only the current one is.
            let listed = self
                .positions
                .find_entry(hash(&self.hasher, &id), |position| *position == front);
            if let Ok(entry) = listed {
                entry.remove();
                let segment = slot.segment;
                self.release(segment, &mut emptied);
            }
            self.queue.pop_front();
            self.front += 1;
        }
        emptied
    }

    /// How many records are remembered.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_expire_after_the_ttl() {
        let mut table = IdempotencyTable::new(1_000, 10, IdHasher::default());
        let id = IdHasher::default().id("retry-1");
        table.insert(id, 1, 5, 1, None, 0);
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
    fn a_segment_emptied_by_a_newer_record_of_its_id_is_handed_out_for_deletion() {
        let mut table = IdempotencyTable::new(1_000, 10, IdHasher::default());
        let id = IdHasher::default().id("retry-1");
        table.insert(id, 1, 5, 1, None, 0);
        table.assign_segment(1, [id].into_iter());
        // Expired but not forgotten yet: the same key applies again.
        assert!(table.get(id, 1_500).is_none());
        table.insert(id, 1, 6, 2, None, 1_500);
        table.assign_segment(2, [id].into_iter());
        assert_eq!(
            table.expire(1_500, usize::MAX),
            vec![1],
            "segment 1 lost its only record: it must be deleted from disk"
        );
        assert_eq!(table.get(id, 1_500).map(|r| r.value), Some(6));
        assert!(table.expire(1_500, usize::MAX).is_empty());
    }

    #[test]
    fn the_oldest_records_go_past_the_capacity() {
        let mut table = IdempotencyTable::new(1_000_000, 2, IdHasher::default());
        let ids: Vec<u128> = (0..3)
            .map(|i| IdHasher::default().id(&format!("k{i}")))
            .collect();
        for (at, id) in ids.iter().enumerate() {
            table.insert(*id, 0, 0, 1, None, at as u64);
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
            partition: None,
        };
        let dead = IdempotencyRecord {
            id: 2,
            fingerprint: 0,
            value: 3,
            seq: 1,
            expires_at_ms: 5,
            partition: None,
        };
        let table = IdempotencyTable::recovered(
            100,
            10,
            IdHasher::default(),
            vec![(3, live), (2, dead)],
            10,
        );
        assert_eq!(table.len(), 1);
        assert!(table.get(1, 10).is_some());
    }

    #[test]
    fn a_failed_commit_returns_its_records_to_the_next_segment() {
        let mut table = IdempotencyTable::new(1_000, 10, IdHasher::default());
        table.insert(9, 0, 0, 1, None, 0);
        table.assign_segment(1, [9].into_iter());
        table.unassign_segment(1);
        table.assign_segment(2, [9].into_iter());
        assert_eq!(table.expire(5_000, usize::MAX), vec![2]);
    }

    #[test]
    fn an_entry_and_its_queue_item_stay_small() {
        // A million remembered adds are a million records (and, with the
        // table's spare capacity, up to two million 8-byte positions).
        assert_eq!(std::mem::size_of::<Slot>(), 56);
    }

    #[test]
    fn positions_survive_the_front_moving_and_a_replaced_record() {
        let mut table = IdempotencyTable::new(100, 1_000, IdHasher::default());
        for i in 0..50u128 {
            table.insert(i, i as u64, i as i64, 1, None, i as u64);
        }
        table.assign_segment(1, 0..50);
        assert!(table.expire(120, usize::MAX).is_empty());
        assert_eq!(table.len(), 29, "ids 0 to 20 expired");
        for i in 21..50u128 {
            assert_eq!(table.get(i, 120).map(|r| r.value), Some(i as i64));
        }
        // Id 30 expired at 130 but is still queued; used again, it is replaced.
        assert!(table.get(30, 131).is_none());
        table.insert(30, 7, -1, 2, None, 131);
        table.assign_segment(2, [30].into_iter());
        assert_eq!(
            table.expire(150, usize::MAX),
            vec![1],
            "the old record of id 30 leaves the queue without taking the new one"
        );
        assert_eq!(table.len(), 1);
        assert_eq!(table.get(30, 150).map(|r| (r.value, r.seq)), Some((-1, 2)));
        assert_eq!(table.expire(231, usize::MAX), vec![2]);
        assert!(table.is_empty());
    }

    #[test]
    fn ids_are_keyed_and_stable() {
        let (one, other) = (IdHasher::new(7, 0), IdHasher::new(8, 0));
        assert_eq!(one.id("retry-1"), IdHasher::new(7, 0).id("retry-1"));
        assert_ne!(
            one.id("retry-1"),
            other.id("retry-1"),
            "the id ignores the key"
        );
        assert_ne!(one.id("retry-1"), legacy_idempotency_id("retry-1"));
        // Pinned: a change of the hash would forget every remembered add.
        assert_eq!(
            IdHasher::new(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210, 0).id("retry-1"),
            0xfe2d_2a25_84a8_9569_9294_0c30_d754_761d
        );
    }

    #[test]
    fn records_of_older_builds_are_found_until_they_expire() {
        let ids = IdHasher::new(99, 1_000);
        let old = IdempotencyRecord {
            id: legacy_idempotency_id("retry-1"),
            fingerprint: 4,
            value: 3,
            seq: 1,
            expires_at_ms: 1_000,
            partition: None,
        };
        let table = IdempotencyTable::recovered(1_000, 10, ids.clone(), vec![(1, old)], 0);
        assert_eq!(table.lookup("retry-1", 999).map(|r| r.value), Some(3));
        assert!(table.lookup("retry-2", 999).is_none());
        assert!(table.lookup("retry-1", 1_000).is_none());
        let mut table = IdempotencyTable::new(1_000, 10, ids);
        let id = table.id_of("retry-1");
        table.insert(id, 4, 5, 2, None, 0);
        assert_eq!(table.lookup("retry-1", 10).map(|r| r.value), Some(5));
    }

    #[test]
    fn ids_and_fingerprints_differ_by_input() {
        let ids = IdHasher::new(1, 0);
        assert_ne!(ids.id("a"), ids.id("b"));
        assert_ne!(request_fingerprint("a", 1), request_fingerprint("a", 2));
        assert_ne!(request_fingerprint("a", 1), request_fingerprint("b", 1));
    }
}
