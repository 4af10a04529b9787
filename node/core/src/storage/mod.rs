//! The pure half of durable storage: the narrow [`Store`] trait that the
//! node's sled store (`tally-node`, `store/`) and the in-memory one
//! ([`MemoryStore`], which keeps a durable and a pending part, so tests and
//! the simulator can crash it) both implement, and the key layout and record
//! encodings they share.
//!
//! Both keep the same ordered key space (see [`encoding`] and [`sets`]) and
//! write a [`CommitBatch`] as one batch of puts and deletes ([`batch_ops`])
//! that a crash leaves whole, so one test suite runs against both. Both keep
//! the change log in memory ([`ChangeIndex`], rebuilt from the counter records
//! by [`rebuild_changes`]) and number replicas for their counter records
//! ([`Ordinals`]). Writes become durable only at [`Store::flush`] or
//! [`Store::commit`], which the node's group committer calls once per batch.
//!
//! The replica state machine never calls into this module: it reads through
//! the [`DurableState`] trait that `replica` defines, and a store implements
//! that trait's like-set, uniques, idempotency and delta-log reads with
//! [`crate::durable_layout_reads!`] (the reads by this key layout). So
//! `storage` depends on `replica` and never the other way round
//! (`tests/module_graph.rs` fails on a circle).

pub mod block;
mod change_index;
pub mod encoding;
mod layout_reads;
mod memory;
mod memory_space;
mod ordinals;
mod saved_digests;
pub mod sets;

use crate::crdt::ReplicaId;
use crate::replica::{
    CommitBatch, DurableState, IdempotencyRecord, Identity, Recovered, StorageError,
};

pub use change_index::ChangeIndex;
pub use memory::MemoryStore;
pub use ordinals::Ordinals;
pub use saved_digests::{saved_partition_digests, set_partition_count};

/// Durable storage of one replica.
pub trait Store: DurableState + Send + Sync + 'static {
    /// The replica identity stored with the data.
    fn identity(&self) -> &Identity;
    /// Reads back what the replica needs at start.
    fn recover(&self, now_ms: u64) -> Result<Recovered, StorageError>;
    /// Writes a batch atomically. It may be visible to reads before it is durable.
    fn write(&self, batch: &CommitBatch) -> Result<(), StorageError>;
    /// Makes everything written so far durable.
    fn flush(&self) -> Result<(), StorageError>;
    /// Writes a batch and makes it durable: what the group committer calls
    /// once per batch. A store may do it faster than [`Store::write`] and
    /// [`Store::flush`] (sled appends it to its commit log).
    fn commit(&self, batch: &CommitBatch) -> Result<(), StorageError> {
        self.write(batch)?;
        self.flush()
    }
    /// [`Store::commit`], calling `on_durable` once the batch survives a
    /// crash, which may be before the call returns: sled calls it once its
    /// commit log is synced, before the batch reaches sled's tree. The
    /// engine answers the adds waiting on the batch from there. Once it
    /// returns, every read sees the batch, though sled's tree may take it
    /// later (on the store's own thread, `sled_apply.rs`). On an error
    /// `on_durable` may have been called (the batch is durable, applying it
    /// failed) or not. It may run with the store's own locks held: it must
    /// not call the store.
    fn commit_then(&self, batch: &CommitBatch, on_durable: &dyn Fn()) -> Result<(), StorageError> {
        self.commit(batch)?;
        on_durable();
        Ok(())
    }
    /// The node stops and writes nothing more: the store may save what
    /// makes its next open faster, but must open correctly without it.
    fn close(&self) -> Result<(), StorageError> {
        self.flush()
    }
    /// Bytes the store takes on disk, when known.
    fn size_on_disk(&self) -> Option<u64> {
        None
    }
    /// Counters stored (each listed once in the change log), when known.
    fn counters_stored(&self) -> Option<u64> {
        None
    }
    /// The record format the store writes: the cluster version as last
    /// persisted (see [`crate::replica::version`]).
    fn format(&self) -> u32 {
        crate::replica::version::NEWEST
    }
    /// The cluster version: the record format, as what the
    /// [`crate::replica::version::Feature`]s written are asked of.
    fn cluster_version(&self) -> crate::replica::version::ClusterVersion {
        crate::replica::version::ClusterVersion(self.format())
    }
    /// The newest protocol version of the build that created the store (0
    /// when it was created by a build that did not record it).
    fn born_at(&self) -> u32 {
        crate::replica::version::NEWEST
    }
    /// Moves to record format `format`: records it durably first, then
    /// writes in it. Never moves back.
    fn raise_format(&self, format: u32) -> Result<(), StorageError> {
        let _ = format;
        Ok(())
    }
}

/// One write of a batch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Op {
    /// Store `value` under `key`.
    Put(Vec<u8>, Vec<u8>),
    /// Remove `key`.
    Delete(Vec<u8>),
}

/// The puts and deletes that write `batch`, in order, with the replica
/// numbers in `ordinals` and the batch's `new` ones (from [`Ordinals::plan`]),
/// in this build's record formats (cluster version 12: counters with replica
/// ordinals, idempotency segments with partitions, dense uniques in chunks).
/// The writers of older formats were deleted when the version window closed
/// at 12; their readers stay (`encoding.rs`).
pub fn batch_ops(batch: &CommitBatch, ordinals: &Ordinals, new: &[(u32, ReplicaId)]) -> Vec<Op> {
    use encoding::*;
    let mut ops = Vec::with_capacity(batch.counters.len() + new.len() + 8);
    for (ordinal, replica) in new {
        ops.push(Op::Put(ordinal_key(*ordinal), encode_u64(replica.0)));
    }
    for (key, state) in &batch.counters {
        let ordinal_of = |replica| ordinals::ordinal_in(ordinals, new, replica);
        let value = encode_counter(batch.seq, state, ordinal_of);
        ops.push(Op::Put(counter_key(key), value));
    }
    for key in &batch.deleted {
        ops.push(Op::Delete(counter_key(key)));
    }
    if !batch.idempotency_put.is_empty() {
        let value = encode_idempotency(batch.seq, &batch.idempotency_put);
        ops.push(Op::Put(idempotency_key(batch.seq), value));
    }
    for segment in &batch.idempotency_delete {
        ops.push(Op::Delete(idempotency_key(*segment)));
    }
    for key in &batch.id_keys_put {
        ops.push(Op::Put(id_key_key(*key), Vec::new()));
    }
    for (replica, region) in &batch.directory_put {
        ops.push(Op::Put(
            replica_key(DIRECTORY, *replica),
            encode_text(region),
        ));
    }
    for (replica, cursor) in &batch.watermarks {
        ops.push(Op::Put(
            replica_key(WATERMARK, *replica),
            encode_cursor(cursor),
        ));
    }
    for replica in &batch.pruned {
        ops.push(Op::Delete(replica_key(DIRECTORY, *replica)));
        ops.push(Op::Delete(replica_key(WATERMARK, *replica)));
        ops.push(Op::Delete(replica_key(sets::DELTA_WATERMARK, *replica)));
    }
    for (writer, digest) in &batch.writer_digests {
        let key = replica_key(WRITER_DIGEST, *writer);
        if *digest == crate::crdt::WriterDigest::default() {
            ops.push(Op::Delete(key));
        } else {
            ops.push(Op::Put(key, encode_writer_digest(digest)));
        }
    }
    for (replica, name) in &batch.node_names {
        ops.push(Op::Put(replica_key(NODE_NAME, *replica), encode_text(name)));
    }
    for (replica, since) in &batch.dead_since {
        let key = replica_key(DEAD_SINCE, *replica);
        ops.push(match since {
            Some(since_ms) => Op::Put(key, encode_u64(*since_ms)),
            None => Op::Delete(key),
        });
    }
    for (partition, since) in &batch.released {
        let key = released_key(*partition);
        ops.push(match since {
            Some(since_ms) => Op::Put(key, encode_u64(*since_ms)),
            None => Op::Delete(key),
        });
    }
    for (retirement, kept) in &batch.scoped_retired {
        let key = scoped_retired_key(retirement);
        ops.push(match kept {
            true => Op::Put(key, vec![encoding::VERSION]),
            false => Op::Delete(key),
        });
    }
    for (writer, reason) in &batch.retired {
        ops.push(Op::Put(
            replica_key(RETIRED, *writer),
            encode_retired(reason),
        ));
        // A retired replica's node no longer matters (pruning, issue 13).
        ops.push(Op::Delete(replica_key(NODE_NAME, *writer)));
        ops.push(Op::Delete(replica_key(DEAD_SINCE, *writer)));
    }
    for record in &batch.fold_records {
        ops.push(Op::Put(fold_key(record.epoch), encode_fold_record(record)));
    }
    if let Some(parts) = &batch.fold_applied_partitions {
        ops.push(Op::Put(
            META_FOLD_APPLIED_PARTITIONS.to_vec(),
            encode_applied_partitions(parts),
        ));
    }
    if batch.fold_applied > 0 || batch.fold_swept > 0 {
        ops.push(Op::Put(
            META_FOLD_APPLIED.to_vec(),
            encode_u64(batch.fold_applied),
        ));
        ops.push(Op::Put(
            META_FOLD_SWEPT.to_vec(),
            encode_u64(batch.fold_swept),
        ));
    }
    ops.push(Op::Put(
        META_WRITER_DIGESTS_AT.to_vec(),
        encode_u64(batch.seq),
    ));
    sets::set_ops(batch, &mut ops);
    ops.push(Op::Put(META_DIGEST.to_vec(), encode_u64(batch.digest.0)));
    // Last: a store that writes the operations one by one (sled with its
    // commit log) has written the whole batch once it holds this sequence.
    ops.push(Op::Put(META_DURABLE_SEQ.to_vec(), encode_u64(batch.seq)));
    ops
}

/// Rebuilds [`Recovered`] from the key space, read by prefix.
pub fn recover_from<'a, E>(
    meta: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, E>,
    scan: impl Fn(u8) -> Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>), E>> + 'a>,
    now_ms: u64,
) -> Result<Recovered, StorageError>
where
    E: std::fmt::Display,
{
    use encoding::*;
    let durable_seq = meta(META_DURABLE_SEQ)
        .map_err(scan_error)?
        .map(|v| decode_u64(&v, "durable sequence"))
        .transpose()?;
    let digest = meta(META_DIGEST)
        .map_err(scan_error)?
        .map(|v| decode_u64(&v, "digest"))
        .transpose()?;
    let hash_key = meta(META_IDEMPOTENCY_HASH_KEY)
        .map_err(scan_error)?
        .ok_or_else(|| StorageError("the store has no idempotency hash key".into()))?;
    let hash_key = decode_hash_key(&hash_key)?;
    let mut recovered = Recovered {
        durable_seq: durable_seq.unwrap_or(0),
        digest: crate::crdt::StateDigest(digest.unwrap_or(0)),
        idempotency_hash_key: hash_key.key,
        ..Default::default()
    };
    let meta_u64 = |name: &[u8], what: &str| -> Result<Option<u64>, StorageError> {
        meta(name)
            .map_err(scan_error)?
            .map(|v| decode_u64(&v, what))
            .transpose()
    };
    recovered.fold_applied = meta_u64(META_FOLD_APPLIED, "applied fold epoch")?.unwrap_or(0);
    recovered.fold_swept = meta_u64(META_FOLD_SWEPT, "swept fold epoch")?.unwrap_or(0);
    if let Some(value) = meta(META_FOLD_APPLIED_PARTITIONS).map_err(scan_error)? {
        recovered.fold_applied_partitions = decode_applied_partitions(&value)?;
    }
    recovered.writer_digests_current =
        meta_u64(META_WRITER_DIGESTS_AT, "writer digests' sequence")? == durable_seq
            || durable_seq.is_none();
    for item in scan(WRITER_DIGEST) {
        let (key, value) = item.map_err(scan_error)?;
        recovered
            .writer_digests
            .push((decode_replica_key(&key)?, decode_writer_digest(&value)?));
    }
    for item in scan(RETIRED) {
        let (key, value) = item.map_err(scan_error)?;
        recovered
            .retired
            .push((decode_replica_key(&key)?, decode_retired(&value)?));
    }
    for item in scan(NODE_NAME) {
        let (key, value) = item.map_err(scan_error)?;
        recovered
            .node_names
            .push((decode_replica_key(&key)?, decode_text(&value, "node name")?));
    }
    for item in scan(RELEASED) {
        let (key, value) = item.map_err(scan_error)?;
        recovered.released.push((
            decode_released_key(&key)?,
            decode_u64(&value, "release time")?,
        ));
    }
    for item in scan(SCOPED_RETIRED) {
        let (key, value) = item.map_err(scan_error)?;
        recovered
            .scoped_retired
            .push(decode_scoped_retired(&key, &value)?);
    }
    for item in scan(DEAD_SINCE) {
        let (key, value) = item.map_err(scan_error)?;
        recovered.dead_since.push((
            decode_replica_key(&key)?,
            decode_u64(&value, "dead-since time")?,
        ));
    }
    for item in scan(FOLD) {
        let (key, value) = item.map_err(scan_error)?;
        recovered
            .fold_records
            .push(decode_fold_record(&key, &value)?);
    }
    for item in scan(DIRECTORY) {
        let (key, value) = item.map_err(scan_error)?;
        recovered.directory.push((
            decode_replica_key(&key)?,
            decode_text(&value, "directory entry")?,
        ));
    }
    for item in scan(ID_KEY) {
        let (key, _) = item.map_err(scan_error)?;
        recovered.id_keys.push(decode_id_key_key(&key)?);
    }
    for item in scan(WATERMARK) {
        let (key, value) = item.map_err(scan_error)?;
        recovered
            .watermarks
            .push((decode_replica_key(&key)?, decode_cursor(&value)?));
    }
    for item in scan(sets::DELTA_WATERMARK) {
        let (key, value) = item.map_err(scan_error)?;
        recovered.delta_watermarks.push((
            decode_replica_key(&key)?,
            sets::decode_delta_watermark(&value)?,
        ));
    }
    for item in scan(IDEMPOTENCY) {
        let (key, value) = item.map_err(scan_error)?;
        let (segment, records) = decode_idempotency(&key, &value)?;
        let keyed = segment >= hash_key.keyed_from;
        let before = recovered.idempotency.len();
        let live: Vec<IdempotencyRecord> = records
            .into_iter()
            .filter(|record| record.expires_at_ms > now_ms)
            .collect();
        if !keyed {
            let last = live.iter().map(|record| record.expires_at_ms).max();
            recovered.legacy_idempotency_until_ms =
                recovered.legacy_idempotency_until_ms.max(last.unwrap_or(0));
        }
        recovered
            .idempotency
            .extend(live.into_iter().map(|record| (segment, record)));
        if recovered.idempotency.len() == before {
            recovered.expired_segments.push(segment);
        }
    }
    Ok(recovered)
}

/// The idempotency segments of commits after `after`, at most `limit`, each
/// with its records (see [`DurableState::idempotency_segments_after`]).
pub fn idempotency_segments_after(
    store: &(impl DurableState + ?Sized),
    after: u64,
    limit: usize,
) -> Result<Vec<(u64, Vec<IdempotencyRecord>)>, StorageError> {
    let Some(from) = after.checked_add(1) else {
        return Ok(Vec::new());
    };
    let to = [encoding::IDEMPOTENCY + 1];
    store
        .scan_records(&encoding::idempotency_key(from), &to, limit)?
        .iter()
        .map(|(key, value)| encoding::decode_idempotency(key, value))
        .collect()
}

/// Every writer's digest over the counters `store` holds, computed by
/// reading every counter once: for a store whose digests are not current
/// (written by a build that did not keep them).
pub fn compute_writer_digests(
    store: &(impl DurableState + ?Sized),
) -> Result<Vec<(ReplicaId, crate::crdt::WriterDigest)>, StorageError> {
    let mut digests: std::collections::BTreeMap<ReplicaId, crate::crdt::WriterDigest> =
        Default::default();
    for_each_counter(store, |key, counter| {
        for (writer, slot) in counter.slots() {
            digests
                .entry(*writer)
                .or_default()
                .replace(key, crate::crdt::Slot::default(), *slot);
        }
    })?;
    Ok(digests.into_iter().collect())
}

/// Every writer's digest per partition over the counters `store` holds, for
/// a node of `count` partitions (`replica/fold_partitions.rs`), computed by
/// reading every counter once: of phase 0, and of later phases, each slot's
/// phase by its counter's epoch in `book` ([`crate::crdt::FoldBook::phase`]).
pub fn compute_partition_digests(
    store: &(impl DurableState + ?Sized),
    count: crate::partition::PartitionCount,
    book: &crate::crdt::FoldBook,
) -> Result<
    (
        crate::replica::fold_partitions::DigestsByPartition,
        crate::replica::fold_partitions::LaterPhases,
    ),
    StorageError,
> {
    let mut digests = crate::replica::fold_partitions::DigestsByPartition::default();
    let mut later = crate::replica::fold_partitions::LaterPhases::default();
    for_each_counter(store, |key, counter| {
        let partition = count.of_key(key.as_bytes()).0;
        let epoch = counter.folded().epoch;
        for (writer, slot) in counter.slots() {
            let digest = match book.phase(*writer, Some(partition), epoch) {
                0 => digests
                    .entry(*writer)
                    .or_default()
                    .entry(partition)
                    .or_default(),
                phase => later.entry((*writer, partition, phase)).or_default(),
            };
            digest.replace(key, crate::crdt::Slot::default(), *slot);
        }
    })?;
    Ok((digests, later))
}

/// Calls `visit` with every stored counter once, in change order.
fn for_each_counter(
    store: &(impl DurableState + ?Sized),
    mut visit: impl FnMut(&str, &crate::crdt::PnCounter),
) -> Result<(), StorageError> {
    let mut after = crate::replica::Cursor::default();
    loop {
        let changes = store.changes_after(&after, 4096)?;
        let Some(last) = changes.last() else { break };
        after = crate::replica::Cursor {
            seq: last.seq,
            key: last.key.to_string(),
        };
        for change in &changes {
            let Some(stored) = store.load_counter(&change.key)? else {
                continue;
            };
            if stored.seq != change.seq {
                continue; // a superseded entry: the newer one counts it
            }
            visit(&change.key, &stored.state);
        }
    }
    Ok(())
}

/// A failed read of a store scan, as the core sees it.
fn scan_error(error: impl std::fmt::Display) -> StorageError {
    StorageError(error.to_string())
}

/// Rebuilds the change log from every counter record, read in key order.
pub fn rebuild_changes<E>(
    counters: impl Iterator<Item = Result<(impl AsRef<[u8]>, impl AsRef<[u8]>), E>>,
) -> Result<ChangeIndex, StorageError>
where
    E: std::fmt::Display,
{
    let mut changes = ChangeIndex::new();
    for item in counters {
        let (key, value) = item.map_err(scan_error)?;
        let key = encoding::decode_counter_key(key.as_ref())?;
        changes.push_recovered(encoding::decode_counter_seq(value.as_ref())?, key);
    }
    changes.finish_rebuild();
    Ok(changes)
}

/// Reads the replica numbering back from its entries, in key order.
pub fn recover_ordinals<E>(
    entries: impl Iterator<Item = Result<(impl AsRef<[u8]>, impl AsRef<[u8]>), E>>,
) -> Result<Ordinals, StorageError>
where
    E: std::fmt::Display,
{
    let mut ordinals = Ordinals::new();
    for item in entries {
        let (key, value) = item.map_err(scan_error)?;
        let (ordinal, replica) = encoding::decode_ordinal(key.as_ref(), value.as_ref())?;
        ordinals.recover(ordinal, replica)?;
    }
    Ok(ordinals)
}

/// Reads the stored identity, if any.
pub fn stored_identity(bytes: Option<&[u8]>) -> Result<Option<Identity>, StorageError> {
    bytes.map(encoding::decode_identity).transpose()
}
