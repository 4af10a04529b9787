//! An in-memory [`Store`] with a durable part and a pending part: writes land
//! in the pending part (visible to reads, like sled before a flush), a flush
//! moves them to the durable part, and [`MemoryStore::crash`] drops whatever
//! was not flushed (and rebuilds the change log from what is left, as a
//! restart of the sled store would). Tests of the core and the simulator use it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::replica::{
    Change, CommitBatch, Cursor, DurableState, Identity, Recovered, StorageError, StoredCounter,
};

use super::encoding::{self, COUNTER, ORDINAL};
use super::{
    batch_ops, rebuild_changes, recover_from, recover_ordinals, ChangeIndex, Op, Ordinals, Store,
};

type Space = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Debug, Default)]
struct Layers {
    visible: Space,
    durable: Space,
    pending: Vec<Vec<Op>>,
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
    space.range(vec![prefix]..vec![prefix + 1]).map(Ok)
}

fn apply(space: &mut Space, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Put(key, value) => {
                space.insert(key.clone(), value.clone());
            }
            Op::Delete(key) => {
                space.remove(key);
            }
        }
    }
}

/// [`apply`] of ops no longer needed elsewhere: their keys and values move
/// into the space instead of being copied (a flush; the simulator's
/// profile had the store's copies among its largest costs).
fn apply_owned(space: &mut Space, ops: Vec<Op>) {
    for op in ops {
        match op {
            Op::Put(key, value) => {
                space.insert(key, value);
            }
            Op::Delete(key) => {
                space.remove(&key);
            }
        }
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
        let entry = (
            encoding::META_IDEMPOTENCY_HASH_KEY.to_vec(),
            encoding::encode_hash_key(&encoding::HashKey {
                key: hash_key,
                keyed_from: 0,
            }),
        );
        layers.visible.insert(entry.0.clone(), entry.1.clone());
        layers.durable.insert(entry.0, entry.1);
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
        layers.pending.clear();
        layers.visible = layers.durable.clone();
        let changes = rebuild_changes(scan(&layers.visible, COUNTER));
        layers.changes = changes.expect("the memory store's own records decode");
        let ordinals = recover_ordinals(scan(&layers.visible, ORDINAL));
        layers.ordinals = ordinals.expect("the memory store's own entries decode");
    }

    /// Writes not yet flushed.
    pub fn pending_batches(&self) -> usize {
        self.layers().pending.len()
    }

    /// Writes `ops` as they are, durable at once, outside any batch: what a
    /// test plants as damage (public for tally-node's store tests).
    pub fn plant(&self, ops: &[Op]) {
        let mut layers = self.layers();
        apply(&mut layers.visible, ops);
        apply(&mut layers.durable, ops);
    }
}

impl DurableState for MemoryStore {
    fn load_counter(&self, key: &str) -> Result<Option<StoredCounter>, StorageError> {
        let layers = self.layers();
        layers
            .visible
            .get(&encoding::counter_key(key))
            .map(|bytes| encoding::decode_counter(bytes, |o| layers.ordinals.replica(o)))
            .transpose()
    }

    fn changes_after(&self, after: &Cursor, limit: usize) -> Result<Vec<Change>, StorageError> {
        let layers = self.layers();
        Ok(layers.changes.after(after, limit))
    }

    fn get_record(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.layers().visible.get(key).cloned())
    }

    fn scan_records(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StorageError> {
        if from >= to {
            return Ok(Vec::new());
        }
        let layers = self.layers();
        Ok(layers
            .visible
            .range(from.to_vec()..to.to_vec())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
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
        let space = &layers.visible;
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
        apply(&mut layers.visible, &ops);
        layers.pending.push(ops);
        layers.changes.apply(batch);
        Ok(())
    }

    fn flush(&self) -> Result<(), StorageError> {
        let mut layers = self.layers();
        let pending = std::mem::take(&mut layers.pending);
        for ops in pending {
            apply_owned(&mut layers.durable, ops);
        }
        Ok(())
    }
}
