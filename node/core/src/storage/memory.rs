//! An in-memory [`Store`] with a durable part and a pending part: writes land
//! in the pending part (visible to reads, like sled before a flush), a flush
//! makes them durable, and [`MemoryStore::crash`] drops whatever was not
//! flushed (and rebuilds the change log from what is left, as a restart of
//! the sled store would). Tests of the core and the simulator use it.
//!
//! One ordered key space (`memory_space.rs`) holds what reads see
//! (durable and pending together); the pending part is an undo log: for
//! each write since the last flush, its key and what the key held before. A
//! flush forgets the log, a crash plays it backwards, which leaves the
//! space as it was at the last flush. (Two maps, a visible and a durable
//! one, each written at every write and flush, were the simulator's
//! largest cost.)
//!
//! Invariant: the space with the undo log played backwards is the durable
//! part; scans yield the space's entries in key order.

use std::convert::Infallible;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::replica::{
    Change, CommitBatch, Cursor, DurableState, Identity, RecordVisitor, Recovered, StorageError,
    StoredCounter,
};

use super::encoding::{self, COUNTER, ORDINAL};
use super::memory_space::Space;
use super::{
    batch_ops, rebuild_changes, recover_from, recover_ordinals, ChangeIndex, Op, Ordinals, Store,
};

/// A key written since the last flush and what it held before (`None`:
/// nothing).
type Undo = (Vec<u8>, Option<Vec<u8>>);

#[derive(Debug, Default)]
struct Layers {
    /// Durable and pending records: what reads see.
    space: Space,
    /// The writes since the last flush, oldest first.
    undo: Vec<Undo>,
    /// Batches written since the last flush.
    pending_batches: usize,
    changes: ChangeIndex,
    ordinals: Ordinals,
}

/// See the module documentation.
#[derive(Debug)]
pub struct MemoryStore {
    identity: Identity,
    layers: Mutex<Layers>,
}

/// The entries under one key prefix, in order, as a store's scan yields them.
fn scan(
    space: &Space,
    prefix: u8,
) -> impl Iterator<Item = Result<(&Vec<u8>, &Vec<u8>), Infallible>> {
    space.range(&[prefix], &[prefix + 1]).map(Ok)
}

impl Layers {
    /// Applies `ops` (moved into the map, not copied), logging what each
    /// key held before.
    fn write(&mut self, ops: Vec<Op>) {
        for op in ops {
            match op {
                Op::Put(key, value) => match self.space.get_mut(&key) {
                    Some(slot) => {
                        let before = std::mem::replace(slot, value);
                        self.undo.push((key, Some(before)));
                    }
                    None => {
                        self.space.insert(key.clone(), value);
                        self.undo.push((key, None));
                    }
                },
                Op::Delete(key) => {
                    if let Some(before) = self.space.remove(&key) {
                        self.undo.push((key, Some(before)));
                    }
                }
            }
        }
    }

    /// Puts back what the writes since the last flush replaced, newest first.
    fn roll_back(&mut self) {
        for (key, before) in std::mem::take(&mut self.undo).into_iter().rev() {
            match before {
                Some(value) => self.space.insert(key, value),
                None => self.space.remove(&key),
            };
        }
        self.pending_batches = 0;
    }
}

impl MemoryStore {
    /// An empty store for `identity`. Its idempotency hash key is derived
    /// from the replica id, so a simulation replays exactly (a real store's
    /// is random).
    pub fn new(identity: Identity) -> Self {
        let hash_key = u128::from(identity.replica.0) << 64
            | u128::from(crate::crdt::stable_hash(
                0x6b6579,
                &[&identity.replica.0.to_le_bytes()],
            ));
        let mut layers = Layers::default();
        layers.space.insert(
            encoding::META_IDEMPOTENCY_HASH_KEY.to_vec(),
            encoding::encode_hash_key(&encoding::HashKey {
                key: hash_key,
                keyed_from: 0,
            }),
        );
        MemoryStore {
            identity,
            layers: Mutex::new(layers),
        }
    }

    /// The layers, locked; a poisoned lock is taken over, as the sled store does.
    fn layers(&self) -> MutexGuard<'_, Layers> {
        self.layers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Loses everything written since the last flush, as a crash would.
    pub fn crash(&self) {
        let mut layers = self.layers();
        layers.roll_back();
        let changes = rebuild_changes(scan(&layers.space, COUNTER));
        layers.changes = changes.expect("the memory store's own records decode");
        let ordinals = recover_ordinals(scan(&layers.space, ORDINAL));
        layers.ordinals = ordinals.expect("the memory store's own entries decode");
    }

    /// Writes not yet flushed.
    pub fn pending_batches(&self) -> usize {
        self.layers().pending_batches
    }

    /// Writes `ops` as they are, durable at once, outside any batch: what a
    /// test plants as damage (public for tally-node's store tests). A
    /// planted key keeps its planted value through a crash, and through a
    /// flush of writes to it made before the plant.
    pub fn plant(&self, ops: &[Op]) {
        let mut layers = self.layers();
        for op in ops {
            let (key, value) = match op {
                Op::Put(key, value) => (key, Some(value)),
                Op::Delete(key) => (key, None),
            };
            match value {
                Some(value) => layers.space.insert(key.clone(), value.clone()),
                None => layers.space.remove(key),
            };
            // The durable part holds it too: a roll-back ends on it.
            for (written, before) in &mut layers.undo {
                if written == key {
                    *before = value.cloned();
                }
            }
        }
    }
}

impl DurableState for MemoryStore {
    fn load_counter(&self, key: &str) -> Result<Option<StoredCounter>, StorageError> {
        let layers = self.layers();
        layers
            .space
            .get(&encoding::counter_key(key))
            .map(|bytes| encoding::decode_counter(bytes, |o| layers.ordinals.replica(o)))
            .transpose()
    }

    fn changes_after(&self, after: &Cursor, limit: usize) -> Result<Vec<Change>, StorageError> {
        let layers = self.layers();
        Ok(layers.changes.after(after, limit))
    }

    fn get_record(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.layers().space.get(key).cloned())
    }

    fn scan_records(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StorageError> {
        let layers = self.layers();
        Ok(layers
            .space
            .range(from, to)
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn visit_records(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
        visit: &mut RecordVisitor<'_>,
    ) -> Result<(), StorageError> {
        let layers = self.layers();
        for (key, value) in layers.space.range(from, to).take(limit) {
            visit(key, value)?;
        }
        Ok(())
    }

    crate::durable_layout_reads!();
}

impl Store for MemoryStore {
    fn counters_stored(&self) -> Option<u64> {
        Some(self.layers().changes.len() as u64)
    }

    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn recover(&self, now_ms: u64) -> Result<Recovered, StorageError> {
        let layers = self.layers();
        let space = &layers.space;
        let mut recovered = recover_from::<Infallible>(
            |key| Ok(space.get(key).cloned()),
            |prefix| {
                Box::new(scan(space, prefix).map(|item| item.map(|(k, v)| (k.clone(), v.clone()))))
            },
            now_ms,
        )?;
        drop(layers);
        if !recovered.writer_digests_current {
            recovered.writer_digests = super::compute_writer_digests(self)?;
            recovered.writer_digests_current = true;
        }
        recovered.sets_digest = super::sets::recover_digest(self, recovered.durable_seq)?;
        Ok(recovered)
    }

    fn write(&self, batch: &CommitBatch) -> Result<(), StorageError> {
        let mut layers = self.layers();
        let new = layers.ordinals.plan(batch);
        let ops = batch_ops(batch, &layers.ordinals, &new);
        layers.ordinals.extend(&new);
        layers.write(ops);
        layers.pending_batches += 1;
        layers.changes.apply(batch);
        Ok(())
    }

    fn flush(&self) -> Result<(), StorageError> {
        let mut layers = self.layers();
        layers.undo.clear();
        layers.pending_batches = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::crdt::{PnCounter, ReplicaId, Slot};
    use crate::replica::{Change, Key};

    fn key(name: &str) -> Key {
        Arc::from(name)
    }

    fn batch(seq: u64, counters: &[(&str, u64)], deleted: &[(&str, u64)]) -> CommitBatch {
        let state = |p| PnCounter::from_slots([(ReplicaId(5), Slot { p, n: 0 })]);
        CommitBatch {
            seq,
            counters: counters.iter().map(|(k, p)| (key(k), state(*p))).collect(),
            deleted: deleted.iter().map(|(k, _)| key(k)).collect(),
            superseded: deleted
                .iter()
                .map(|(k, at)| Change {
                    seq: *at,
                    key: key(k),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Every record, in key order.
    #[track_caller]
    fn records(store: &MemoryStore) -> Vec<(Vec<u8>, Vec<u8>)> {
        store.scan_records(&[], &[u8::MAX; 4], usize::MAX).unwrap()
    }

    fn store() -> MemoryStore {
        MemoryStore::new(Identity {
            replica: ReplicaId(5),
            region: "eu".into(),
        })
    }

    #[test]
    fn a_crash_leaves_exactly_the_records_of_the_last_flush() {
        let store = store();
        store.write(&batch(1, &[("a", 1), ("b", 1)], &[])).unwrap();
        store.flush().unwrap();
        let flushed = records(&store);
        // Overwrites, a new key, a delete, and a key written twice.
        store
            .write(&batch(2, &[("a", 2), ("c", 2)], &[("b", 1)]))
            .unwrap();
        store.write(&batch(3, &[("a", 3), ("c", 3)], &[])).unwrap();
        assert_eq!(store.pending_batches(), 2);
        assert_ne!(records(&store), flushed);
        store.crash();
        assert_eq!(records(&store), flushed);
        assert_eq!(store.pending_batches(), 0);
        assert_eq!(store.load_counter("a").unwrap().unwrap().seq, 1);
        assert!(store.load_counter("c").unwrap().is_none());
    }

    #[test]
    fn a_flush_keeps_what_was_written() {
        let store = store();
        store.write(&batch(1, &[("a", 1)], &[])).unwrap();
        store.flush().unwrap();
        store.write(&batch(2, &[("a", 2), ("b", 2)], &[])).unwrap();
        store.flush().unwrap();
        let written = records(&store);
        store.crash();
        assert_eq!(records(&store), written);
        assert_eq!(store.load_counter("b").unwrap().unwrap().seq, 2);
    }

    #[test]
    fn a_planted_record_survives_a_crash_over_pending_writes() {
        let store = store();
        store.write(&batch(1, &[("a", 1)], &[])).unwrap();
        // A record the pending batch wrote (every commit writes it).
        let damage = (crate::storage::sets::META_SETS_DIGEST.to_vec(), vec![9, 9]);
        store.plant(&[Op::Put(damage.0.clone(), damage.1.clone())]);
        store.plant(&[Op::Put(b"zz".to_vec(), vec![1])]);
        store.crash();
        assert_eq!(store.get_record(&damage.0).unwrap(), Some(damage.1));
        assert_eq!(store.get_record(b"zz").unwrap(), Some(vec![1]));
    }
}
