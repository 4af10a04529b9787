//! Byte encodings of the retire/fold records (`replica/folds.rs`): fold
//! records, retirements and per-writer digests, each under its own key
//! prefix, and the meta values of the fold's progress. Versioned like every
//! other value ([`super`]); a short or unknown value is corrupt, never zero.

use crate::crdt::{FoldRecord, PartitionDigests, ReplicaId, WriterDigest};
use crate::replica::fold_partitions::DigestsByPartition;
// Defined by the replica (what it saves), encoded here; re-exported so
// `encoding::SavedDigests` keeps naming it.
pub use crate::replica::fold_partitions::SavedDigests;
use crate::replica::folds::{RetireReason, ScopedRetirement};
use crate::replica::StorageError;

use super::{corrupt, prefixed, put_varint, Reader, VERSION};

/// Fold-record prefix (key: the epoch, big-endian).
pub const FOLD: u8 = b'f';
/// Retired-writer prefix (key: the replica id, big-endian).
pub const RETIRED: u8 = b'x';
/// Writer-digest prefix (key: the writer's id, big-endian).
pub const WRITER_DIGEST: u8 = b'g';
/// Node-name prefix (key: a replica id, big-endian; value: the name of the
/// node it was an incarnation of, text): what tells an old incarnation's
/// node after a restart, once gossip no longer lists it
/// (`Folds::note_node_names`). Deleted when the replica is retired.
pub const NODE_NAME: u8 = b'o';
/// Dead-since prefix (key: a replica id, big-endian; value: when this node
/// first saw it down, ms since the epoch, u64): the start of its wait of
/// `--retire-after`, kept across restarts. Deleted when the replica is seen
/// up again or retired.
pub const DEAD_SINCE: u8 = b'q';
/// Scoped-retirement prefix (key: writer id, partition and phase, each
/// big-endian; value: the version byte): a live writer's slots in one
/// partition retired (`replica/fold_scoped.rs`), kept until their fold.
/// Older builds never scan it.
pub const SCOPED_RETIRED: u8 = b'p';
/// Released-partition prefix (key: a partition, big-endian u32; value:
/// when this node released it holding slots of its own, ms since the epoch,
/// u64): the start of its wait of `--retire-after` before the node retires
/// its slots there (`replica/fold_released.rs`). Older builds never scan it.
pub const RELEASED: u8 = b't';
/// Fold epochs up to this one are applied to this node's counters.
pub const META_FOLD_APPLIED: &[u8] = b"mfoldapplied";
/// The partitions whose applied fold epoch is above [`META_FOLD_APPLIED`],
/// with theirs (`replica/fold_partitions.rs`).
pub const META_FOLD_APPLIED_PARTITIONS: &[u8] = b"mfoldappliedparts";
/// Every stored counter is folded up to this epoch.
pub const META_FOLD_SWEPT: &[u8] = b"mfoldswept";
/// The durable sequence the writer digests are current at (a build that
/// does not keep them leaves it behind, and the next open recomputes them).
pub const META_WRITER_DIGESTS_AT: &[u8] = b"mwdigests";

/// The store key of a released partition.
pub fn released_key(partition: u32) -> Vec<u8> {
    prefixed(RELEASED, &partition.to_be_bytes())
}

/// Reads the partition out of a released-partition key.
pub fn decode_released_key(key: &[u8]) -> Result<u32, StorageError> {
    let raw: [u8; 4] = key
        .get(1..)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("released partition", "key of the wrong length"))?;
    Ok(u32::from_be_bytes(raw))
}

/// The store key of a scoped retirement.
pub fn scoped_retired_key(retirement: &ScopedRetirement) -> Vec<u8> {
    let mut rest = Vec::with_capacity(16);
    rest.extend_from_slice(&retirement.writer.0.to_be_bytes());
    rest.extend_from_slice(&retirement.partition.to_be_bytes());
    rest.extend_from_slice(&retirement.phase.to_be_bytes());
    prefixed(SCOPED_RETIRED, &rest)
}

/// Decodes a scoped retirement from its key and value.
pub fn decode_scoped_retired(key: &[u8], value: &[u8]) -> Result<ScopedRetirement, StorageError> {
    const WHAT: &str = "scoped retirement";
    Reader::versioned(value, WHAT)?.finish()?;
    let field = |range: std::ops::Range<usize>| {
        key.get(range).ok_or_else(|| corrupt(WHAT, "key too short"))
    };
    if key.len() != 17 {
        return Err(corrupt(WHAT, "key of the wrong length"));
    }
    Ok(ScopedRetirement {
        writer: ReplicaId(u64::from_be_bytes(
            field(1..9)?.try_into().expect("8 bytes"),
        )),
        partition: u32::from_be_bytes(field(9..13)?.try_into().expect("4 bytes")),
        phase: u32::from_be_bytes(field(13..17)?.try_into().expect("4 bytes")),
    })
}

/// The store key of the fold record of `epoch`.
pub fn fold_key(epoch: u64) -> Vec<u8> {
    prefixed(FOLD, &epoch.to_be_bytes())
}

/// Encodes a fold record (its epoch is in the key). A record with digests
/// per partition (cluster version 10) appends, per writer in the same
/// order, the count of its partitions and each partition's number and
/// digest; a build before it refuses such a record as corrupt, and only a
/// cluster whose every member reads it writes one. A record that folds
/// live writers in some partitions (cluster version 12) appends their
/// count, then per writer its id, the count of its partitions and each
/// partition's number and digest (a record of them alone names no writer
/// whole: a count of 0 first).
pub fn encode_fold_record(record: &FoldRecord) -> Vec<u8> {
    let mut out = vec![VERSION];
    put_varint(&mut out, record.writers.len() as u64);
    for (writer, digest) in &record.writers {
        out.extend_from_slice(&writer.0.to_le_bytes());
        put_varint(&mut out, digest.counters);
        out.extend_from_slice(&digest.hash.to_le_bytes());
    }
    for (_, digests) in record.by_partition.iter().flatten() {
        put_partition_digests(&mut out, digests);
    }
    if !record.scoped.is_empty() {
        debug_assert!(
            record.by_partition.is_some(),
            "scoped records are by partition"
        );
        put_varint(&mut out, record.scoped.len() as u64);
        for (writer, digests) in &record.scoped {
            out.extend_from_slice(&writer.0.to_le_bytes());
            put_partition_digests(&mut out, digests);
        }
    }
    out
}

fn put_partition_digests(out: &mut Vec<u8>, digests: &PartitionDigests) {
    put_varint(out, digests.len() as u64);
    for (partition, digest) in digests {
        put_varint(out, u64::from(*partition));
        put_varint(out, digest.counters);
        out.extend_from_slice(&digest.hash.to_le_bytes());
    }
}

fn read_partition_digests(
    reader: &mut Reader<'_>,
    len_bound: usize,
) -> Result<PartitionDigests, StorageError> {
    const WHAT: &str = "fold record";
    let len = reader.varint()?;
    if len > len_bound as u64 {
        return Err(corrupt(WHAT, "partition count larger than the record"));
    }
    let mut digests = Vec::with_capacity(len as usize);
    for _ in 0..len {
        let partition =
            u32::try_from(reader.varint()?).map_err(|_| corrupt(WHAT, "partition out of range"))?;
        let counters = reader.varint()?;
        let hash = reader.u64()?;
        digests.push((partition, WriterDigest { counters, hash }));
    }
    Ok(digests)
}

/// Encodes the applied epochs of partitions (see
/// [`META_FOLD_APPLIED_PARTITIONS`]).
pub fn encode_applied_partitions(parts: &[(u32, u64)]) -> Vec<u8> {
    let mut out = vec![VERSION];
    put_varint(&mut out, parts.len() as u64);
    for (partition, epoch) in parts {
        put_varint(&mut out, u64::from(*partition));
        put_varint(&mut out, *epoch);
    }
    out
}

/// Decodes [`encode_applied_partitions`].
pub fn decode_applied_partitions(value: &[u8]) -> Result<Vec<(u32, u64)>, StorageError> {
    const WHAT: &str = "applied fold epochs by partition";
    let mut reader = Reader::versioned(value, WHAT)?;
    let count = reader.varint()?;
    if count > value.len() as u64 {
        return Err(corrupt(WHAT, "count larger than the value"));
    }
    let mut parts = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let partition =
            u32::try_from(reader.varint()?).map_err(|_| corrupt(WHAT, "partition out of range"))?;
        parts.push((partition, reader.varint()?));
    }
    reader.finish()?;
    Ok(parts)
}

/// Decodes a fold record from its key and value.
pub fn decode_fold_record(key: &[u8], value: &[u8]) -> Result<FoldRecord, StorageError> {
    const WHAT: &str = "fold record";
    let epoch: [u8; 8] = key
        .get(1..9)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt(WHAT, "key too short"))?;
    let mut reader = Reader::versioned(value, WHAT)?;
    let count = reader.varint()?;
    if count > value.len() as u64 {
        return Err(corrupt(WHAT, "writer count larger than the record"));
    }
    let mut writers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let writer = ReplicaId(reader.u64()?);
        let counters = reader.varint()?;
        let hash = reader.u64()?;
        writers.push((writer, WriterDigest { counters, hash }));
    }
    let epoch = u64::from_be_bytes(epoch);
    if reader.is_empty() {
        return Ok(FoldRecord::new(epoch, writers));
    }
    let mut parts = Vec::with_capacity(writers.len());
    for (writer, _) in &writers {
        parts.push((*writer, read_partition_digests(&mut reader, value.len())?));
    }
    let mut scoped = Vec::new();
    if !reader.is_empty() {
        let count = reader.varint()?;
        if count == 0 || count > value.len() as u64 {
            return Err(corrupt(WHAT, "scoped writer count out of range"));
        }
        for _ in 0..count {
            let writer = ReplicaId(reader.u64()?);
            let digests = read_partition_digests(&mut reader, value.len())?;
            if digests.is_empty() {
                return Err(corrupt(WHAT, "a scoped writer folded in no partition"));
            }
            scoped.push((writer, digests));
        }
    }
    reader.finish()?;
    let mut record = FoldRecord::by_partition(epoch, parts);
    if record.writers != writers {
        return Err(corrupt(
            WHAT,
            "whole digests are not the sums of the partitions'",
        ));
    }
    if !scoped.is_empty() {
        record = record.with_scoped(scoped);
    }
    Ok(record)
}

/// The file in the data directory where a clean stop saves the writers'
/// digests by partition (`replica/fold_partitions.rs`), so that the next
/// start need not read every counter to compute them.
pub const SAVED_PARTITION_DIGESTS: &str = "partition-digests.saved";

const SAVED_DIGESTS_SEED: u64 = 0x7061_7274_6467_7374;

/// Encodes [`SavedDigests`], with a checksum: a torn, stale or foreign file
/// is detected and ignored.
pub fn encode_partition_digests(saved: &SavedDigests) -> Vec<u8> {
    let (durable_seq, partitions, digests) = (saved.durable_seq, saved.partitions, &saved.writers);
    let mut out = vec![VERSION];
    out.extend_from_slice(&durable_seq.to_le_bytes());
    put_varint(&mut out, u64::from(partitions));
    let mut writers: Vec<_> = digests.iter().collect();
    writers.sort_unstable_by_key(|(writer, _)| **writer);
    put_varint(&mut out, writers.len() as u64);
    for (writer, parts) in writers {
        out.extend_from_slice(&writer.0.to_le_bytes());
        put_varint(&mut out, parts.len() as u64);
        for (partition, digest) in parts {
            put_varint(&mut out, u64::from(*partition));
            put_varint(&mut out, digest.counters);
            out.extend_from_slice(&digest.hash.to_le_bytes());
        }
    }
    let sets: Vec<(usize, u64)> = saved
        .sets
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, digest)| *digest != 0)
        .collect();
    put_varint(&mut out, sets.len() as u64);
    for (partition, digest) in sets {
        put_varint(&mut out, partition as u64);
        out.extend_from_slice(&digest.to_le_bytes());
    }
    let checksum = crate::crdt::stable_hash(SAVED_DIGESTS_SEED, &[&out]);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

/// Decodes [`encode_partition_digests`].
pub fn decode_partition_digests(bytes: &[u8]) -> Result<SavedDigests, StorageError> {
    const WHAT: &str = "saved digests by partition";
    let (body, checksum) = bytes
        .split_last_chunk::<8>()
        .ok_or_else(|| corrupt(WHAT, "truncated"))?;
    if crate::crdt::stable_hash(SAVED_DIGESTS_SEED, &[body]) != u64::from_le_bytes(*checksum) {
        return Err(corrupt(WHAT, "checksum mismatch"));
    }
    let mut reader = Reader::versioned(body, WHAT)?;
    let durable_seq = reader.u64()?;
    let partitions = u32::try_from(reader.varint()?)
        .map_err(|_| corrupt(WHAT, "partition count out of range"))?;
    let mut digests = DigestsByPartition::new();
    for _ in 0..reader.varint()? {
        let writer = ReplicaId(reader.u64()?);
        let parts = digests.entry(writer).or_default();
        for _ in 0..reader.varint()? {
            let partition = u32::try_from(reader.varint()?)
                .ok()
                .filter(|partition| *partition < partitions)
                .ok_or_else(|| corrupt(WHAT, "partition out of range"))?;
            let counters = reader.varint()?;
            let hash = reader.u64()?;
            parts.insert(partition, WriterDigest { counters, hash });
        }
    }
    let mut sets = vec![0u64; partitions as usize];
    for _ in 0..reader.varint()? {
        let slot = usize::try_from(reader.varint()?)
            .ok()
            .and_then(|partition| sets.get_mut(partition))
            .ok_or_else(|| corrupt(WHAT, "partition out of range"))?;
        *slot = reader.u64()?;
    }
    reader.finish()?;
    Ok(SavedDigests {
        durable_seq,
        partitions,
        writers: digests,
        sets,
    })
}

/// Encodes why a writer was retired.
pub fn encode_retired(reason: &RetireReason) -> Vec<u8> {
    let (tag, by) = match reason {
        RetireReason::Operator => (0u8, 0u64),
        RetireReason::Replaced { by } => (1, by.0),
        RetireReason::Reported { by } => (2, by.0),
    };
    let mut out = vec![VERSION, tag];
    out.extend_from_slice(&by.to_le_bytes());
    out
}

/// Decodes why a writer was retired.
pub fn decode_retired(value: &[u8]) -> Result<RetireReason, StorageError> {
    const WHAT: &str = "retired writer";
    let mut reader = Reader::versioned(value, WHAT)?;
    let tag = reader.take(1)?[0];
    let by = ReplicaId(reader.u64()?);
    reader.finish()?;
    match tag {
        0 => Ok(RetireReason::Operator),
        1 => Ok(RetireReason::Replaced { by }),
        2 => Ok(RetireReason::Reported { by }),
        other => Err(corrupt(WHAT, &format!("unknown reason tag {other}"))),
    }
}

/// Encodes a writer digest.
pub fn encode_writer_digest(digest: &WriterDigest) -> Vec<u8> {
    let mut out = vec![VERSION];
    put_varint(&mut out, digest.counters);
    out.extend_from_slice(&digest.hash.to_le_bytes());
    out
}

/// Decodes a writer digest.
pub fn decode_writer_digest(value: &[u8]) -> Result<WriterDigest, StorageError> {
    let mut reader = Reader::versioned(value, "writer digest")?;
    let counters = reader.varint()?;
    let hash = reader.u64()?;
    reader.finish()?;
    Ok(WriterDigest { counters, hash })
}
