//! Byte encodings of everything Tally stores. Every value starts with a
//! version byte, so a later format can read (or migrate) an older one; a value
//! whose version is unknown or whose bytes are short is reported as corrupt,
//! never read as zero and never a panic.
//!
//! All records live in one ordered key space, told apart by a one-byte prefix,
//! so that a commit is one batch of puts and deletes:
//!
//! | prefix | key                      | value                                   |
//! |--------|--------------------------|-----------------------------------------|
//! | `c`    | counter key (UTF-8)      | v2, seq, slots (replica ordinal, p, n) (v1: the 8-byte replica id, still read) |
//! | `r`    | ordinal (BE u32)         | v1, replica id (see [`super::Ordinals`]) |
//! | `l`    | seq (BE u64) + counter key | retired: the change log of older builds, removed at open |
//! | `i`    | commit seq (BE u64)      | v3, count, base expiry, (id, fingerprint, value, seq - segment, expiry - base, partition + 1)* (v2: no partition; v1: fixed 8-byte fields; both still read) |
//! | `d`    | replica (BE u64)         | v1, region                              |
//! | `w`    | replica (BE u64)         | v1, cursor seq, cursor key              |
//! | `m`    | meta name                | v1, payload                             |
//! | `s`    | like-set member: key length - 1 (u8), set key, member | v1, causal length (varint) (see [`super::sets`]) |
//! | `n`    | like-set key             | v1, derived count (varint)              |
//! | `h`    | uniques key              | v1, HyperLogLog registers               |
//! | `e`    | seq (BE u64), kind, key  | v1, the members or registers that commit changed (the delta log) |
//! | `y`    | replica (BE u64)         | v1, delta-log cursor pulled up to       |
//! | `f`    | fold epoch (BE u64)      | v1, writer count, (writer id, digest counters, digest hash)* |
//! | `x`    | retired replica (BE u64) | v1, reason tag, by (u64)                |
//! | `g`    | writer replica (BE u64)  | v1, digest counters, digest hash        |
//! | `o`    | replica (BE u64)         | v1, its node's name (until it is retired) |
//!
//! A bounded counter's state has its own versioned encoding
//! ([`encode_bounded`], `bounded_encoding.rs`), for the store and the wire;
//! no key prefix holds it yet.
//!
//! A counter with a folded base is written as record v3 (v2 plus the base's
//! epoch, p and n); one without a base is written exactly as before, so the
//! format changes only once a fold happened (cluster version 4).
//!
//! Old record formats: since the version window closed at 12, this build
//! writes only its own formats (the writers of counter records v1 and
//! idempotency segments v1 and v2 are gone), and still **reads** every
//! format an older build wrote. A data directory at cluster version 12 may
//! hold records from long before it, because a record is rewritten only
//! when it changes: a counter written once at version 1 and never since is
//! still a v1 record, an idempotency segment lives until its records
//! expire, a whole dense uniques record until its key takes a new register,
//! and a fold record is kept forever. No migration rewrites them, so
//! nothing shows they cannot remain, and the readers stay (tested with
//! fixed bytes in `encoding_tests.rs`).

use crate::crdt::{stable_hash, FoldedBase, PnCounter, ReplicaId, Slot};
use crate::partition::Partition;
use crate::replica::{Cursor, IdempotencyRecord, Identity, StorageError, StoredCounter};

/// The format version written by this build.
pub const VERSION: u8 = 1;

/// Key prefixes.
pub const COUNTER: u8 = b'c';
/// The change log's prefix in stores written by builds before the log moved
/// to memory ([`super::ChangeIndex`]); such entries are removed at open.
pub const RETIRED_CHANGE: u8 = b'l';
/// Idempotency prefix.
pub const IDEMPOTENCY: u8 = b'i';
/// Directory prefix.
pub const DIRECTORY: u8 = b'd';
/// Watermark prefix.
pub const WATERMARK: u8 = b'w';
/// Meta prefix.
pub const META: u8 = b'm';
/// Replica-ordinal prefix.
pub const ORDINAL: u8 = b'r';
/// Prefix of the id keys of other nodes whose idempotency records this store
/// holds (`replica/idempotency_sync.rs`); the key follows, the value is empty.
pub const ID_KEY: u8 = b'k';

/// Meta names.
pub const META_IDENTITY: &[u8] = b"mid";
/// Durable sequence.
pub const META_DURABLE_SEQ: &[u8] = b"mseq";
/// Digest.
pub const META_DIGEST: &[u8] = b"mdigest";
/// The idempotency hash key ([`HashKey`]).
pub const META_IDEMPOTENCY_HASH_KEY: &[u8] = b"midkey";
/// The newest protocol version of the build that created the store (absent
/// in a store created by a build before it was recorded): see
/// [`crate::replica::version::new_cluster_version`].
pub const META_BORN_AT: &[u8] = b"mborn";

/// The store key of a counter.
pub fn counter_key(key: &str) -> Vec<u8> {
    prefixed(COUNTER, key.as_bytes())
}

/// The counter key of a counter's store key.
pub fn decode_counter_key(bytes: &[u8]) -> Result<&str, StorageError> {
    match bytes.split_first() {
        Some((&COUNTER, key)) if !key.is_empty() => {
            std::str::from_utf8(key).map_err(|_| corrupt("counter key", "not UTF-8"))
        }
        _ => Err(corrupt("counter key", "no counter prefix or no key")),
    }
}

/// The store key of the idempotency segment written by commit `seq`.
pub fn idempotency_key(seq: u64) -> Vec<u8> {
    prefixed(IDEMPOTENCY, &seq.to_be_bytes())
}

/// The store key that records another node's idempotency id key.
pub fn id_key_key(key: u128) -> Vec<u8> {
    prefixed(ID_KEY, &key.to_be_bytes())
}

/// Reads the id key out of its store key.
pub fn decode_id_key_key(bytes: &[u8]) -> Result<u128, StorageError> {
    let raw: [u8; 16] = bytes
        .get(1..17)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("id key entry", "too short"))?;
    Ok(u128::from_be_bytes(raw))
}

/// The store key of a directory or watermark entry.
pub fn replica_key(prefix: u8, replica: ReplicaId) -> Vec<u8> {
    prefixed(prefix, &replica.0.to_be_bytes())
}

/// Reads the replica id out of a directory or watermark store key.
pub fn decode_replica_key(bytes: &[u8]) -> Result<ReplicaId, StorageError> {
    let raw: [u8; 8] = bytes
        .get(1..9)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("replica key", "too short"))?;
    Ok(ReplicaId(u64::from_be_bytes(raw)))
}

fn prefixed(prefix: u8, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + rest.len());
    out.push(prefix);
    out.extend_from_slice(rest);
    out
}

pub(super) fn corrupt(what: &str, why: &str) -> StorageError {
    StorageError(format!("corrupt {what}: {why}"))
}

/// The counter record format written by this build: each slot's replica by
/// its ordinal ([`super::Ordinals`]). Version 1 (the 8-byte replica id
/// inline) is still read.
pub const COUNTER_VERSION: u8 = 2;
/// The counter record format of a counter with a folded base (cluster
/// version 4): format 2 followed by the base.
pub const COUNTER_FOLDED_VERSION: u8 = 3;
/// Every counter record format this build reads.
const COUNTER_VERSIONS: &[u8] = &[1, COUNTER_VERSION, COUNTER_FOLDED_VERSION];

/// Encodes a counter record, numbering replicas with `ordinal_of`.
pub fn encode_counter(
    seq: u64,
    state: &PnCounter,
    ordinal_of: impl Fn(ReplicaId) -> u32,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + state.slots().len() * 8);
    let base = state.folded();
    let folded = base != FoldedBase::default();
    out.push(if folded {
        COUNTER_FOLDED_VERSION
    } else {
        COUNTER_VERSION
    });
    put_varint(&mut out, seq);
    put_varint(&mut out, state.slots().len() as u64);
    for (replica, slot) in state.slots() {
        put_varint(&mut out, u64::from(ordinal_of(*replica)));
        put_varint(&mut out, slot.p);
        put_varint(&mut out, slot.n);
    }
    if folded {
        // Varints, low half then high half: a base is usually a few bytes.
        put_varint(&mut out, base.epoch);
        for sum in [base.p, base.n] {
            put_varint(&mut out, sum as u64);
            put_varint(&mut out, (sum >> 64) as u64);
        }
    }
    out
}

/// The commit that wrote a counter record, read without the slots.
pub fn decode_counter_seq(bytes: &[u8]) -> Result<u64, StorageError> {
    let (_, mut reader) = Reader::any_version(bytes, "counter record", COUNTER_VERSIONS)?;
    reader.varint()
}

/// Decodes a counter record, naming replicas with `replica_of`.
pub fn decode_counter(
    bytes: &[u8],
    replica_of: impl Fn(u32) -> Option<ReplicaId>,
) -> Result<StoredCounter, StorageError> {
    const WHAT: &str = "counter record";
    let (version, mut reader) = Reader::any_version(bytes, WHAT, COUNTER_VERSIONS)?;
    let seq = reader.varint()?;
    let count = reader.varint()?;
    if count > bytes.len() as u64 {
        return Err(corrupt(WHAT, "slot count larger than the record"));
    }
    let mut slots = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let replica = if version == 1 {
            ReplicaId(reader.u64()?)
        } else {
            let ordinal = u32::try_from(reader.varint()?)
                .map_err(|_| corrupt(WHAT, "replica ordinal out of range"))?;
            replica_of(ordinal)
                .ok_or_else(|| corrupt(WHAT, &format!("unknown replica ordinal {ordinal}")))?
        };
        slots.push((
            replica,
            Slot {
                p: reader.varint()?,
                n: reader.varint()?,
            },
        ));
    }
    let base = if version == COUNTER_FOLDED_VERSION {
        FoldedBase {
            epoch: reader.varint()?,
            p: reader.u128()?,
            n: reader.u128()?,
        }
    } else {
        FoldedBase::default()
    };
    reader.finish()?;
    Ok(StoredCounter {
        seq,
        state: PnCounter::from_parts(slots, base),
    })
}

/// The store key of replica ordinal `ordinal`.
pub fn ordinal_key(ordinal: u32) -> Vec<u8> {
    prefixed(ORDINAL, &ordinal.to_be_bytes())
}

/// Decodes a replica-ordinal entry: (ordinal, replica).
pub fn decode_ordinal(key: &[u8], value: &[u8]) -> Result<(u32, ReplicaId), StorageError> {
    let raw: [u8; 4] = key
        .get(1..)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("replica ordinal key", "not 4 bytes"))?;
    Ok((
        u32::from_be_bytes(raw),
        ReplicaId(decode_u64(value, "replica ordinal")?),
    ))
}

/// The idempotency segment format written by this build: format 2, and
/// after each record its partition as a varint, plus one (0: unknown),
/// 28 to about 36 bytes a record.
pub const IDEMPOTENCY_VERSION: u8 = 3;

/// Format 2: records of 27 to about 34 bytes (48 in format 1), the sequence
/// and the expiry as varints relative to the segment, no partition. Written
/// from cluster version 2 until version 8; read still.
pub const IDEMPOTENCY_VERSION_2: u8 = 2;

/// Encodes the idempotency records of commit (segment) `segment` in this
/// build's format (with each record's partition).
pub fn encode_idempotency(segment: u64, records: &[IdempotencyRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + records.len() * 36);
    out.push(IDEMPOTENCY_VERSION);
    put_varint(&mut out, records.len() as u64);
    let base_expiry = records.iter().map(|r| r.expires_at_ms).min().unwrap_or(0);
    put_varint(&mut out, base_expiry);
    for record in records {
        out.extend_from_slice(&record.id.to_be_bytes());
        out.extend_from_slice(&record.fingerprint.to_le_bytes());
        put_varint(&mut out, zigzag(record.value));
        put_varint(&mut out, zigzag(record.seq.wrapping_sub(segment) as i64));
        put_varint(&mut out, record.expires_at_ms - base_expiry);
        put_varint(&mut out, record.partition.map_or(0, |p| u64::from(p.0) + 1));
    }
    out
}

/// A record's stored partition: 0 for none, else the partition plus one.
fn decode_partition(stored: u64) -> Result<Option<Partition>, StorageError> {
    match stored.checked_sub(1) {
        None => Ok(None),
        Some(partition) => u32::try_from(partition)
            .map(|p| Some(Partition(p)))
            .map_err(|_| corrupt("idempotency segment", "partition out of range")),
    }
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// Decodes an idempotency segment stored under `key`: (segment, records).
/// Reads this build's format and version 1.
pub fn decode_idempotency(
    key: &[u8],
    bytes: &[u8],
) -> Result<(u64, Vec<IdempotencyRecord>), StorageError> {
    const WHAT: &str = "idempotency segment";
    let raw: [u8; 8] = key
        .get(1..9)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("idempotency segment key", "too short"))?;
    let segment = u64::from_be_bytes(raw);
    let (version, mut reader) = Reader::any_version(
        bytes,
        WHAT,
        &[1, IDEMPOTENCY_VERSION_2, IDEMPOTENCY_VERSION],
    )?;
    let count = reader.varint()?;
    let smallest = if version == 1 { 48 } else { 27 };
    if count.saturating_mul(smallest) > bytes.len() as u64 {
        return Err(corrupt(WHAT, "record count larger than the segment"));
    }
    let base_expiry = if version == 1 { 0 } else { reader.varint()? };
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let high = reader.u64_be()?;
        let low = reader.u64_be()?;
        let id = (u128::from(high) << 64) | u128::from(low);
        let fingerprint = reader.u64()?;
        let record = if version == 1 {
            IdempotencyRecord {
                id,
                fingerprint,
                value: reader.u64()? as i64,
                seq: reader.u64()?,
                expires_at_ms: reader.u64()?,
                partition: None,
            }
        } else {
            IdempotencyRecord {
                id,
                fingerprint,
                value: unzigzag(reader.varint()?),
                seq: segment.wrapping_add(unzigzag(reader.varint()?) as u64),
                expires_at_ms: base_expiry
                    .checked_add(reader.varint()?)
                    .ok_or_else(|| corrupt(WHAT, "expiry out of range"))?,
                partition: match version {
                    IDEMPOTENCY_VERSION_2 => None,
                    _ => decode_partition(reader.varint()?)?,
                },
            }
        };
        records.push(record);
    }
    reader.finish()?;
    Ok((segment, records))
}

/// Encodes a UTF-8 string value (a region).
pub fn encode_text(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + text.len());
    out.push(VERSION);
    out.extend_from_slice(text.as_bytes());
    out
}

/// Decodes a UTF-8 string value.
pub fn decode_text(bytes: &[u8], what: &str) -> Result<String, StorageError> {
    let reader = Reader::versioned(bytes, what)?;
    String::from_utf8(reader.rest().to_vec()).map_err(|_| corrupt(what, "not UTF-8"))
}

/// The secret key of idempotency ids, and the first commit (segment) whose
/// records carry ids under it: segments before it were written by builds
/// with unkeyed ids ([`crate::replica::legacy_idempotency_id`]). Kept in the
/// store's meta, not in the segments, so that the segment formats (which the
/// cluster version gates) stay what every build of a format reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HashKey {
    /// The secret key.
    pub key: u128,
    /// The first segment keyed with it.
    pub keyed_from: u64,
}

/// Encodes the idempotency hash key.
pub fn encode_hash_key(hash_key: &HashKey) -> Vec<u8> {
    let mut out = vec![VERSION];
    out.extend_from_slice(&hash_key.key.to_le_bytes());
    out.extend_from_slice(&hash_key.keyed_from.to_le_bytes());
    out
}

/// Decodes the idempotency hash key.
pub fn decode_hash_key(bytes: &[u8]) -> Result<HashKey, StorageError> {
    let mut reader = Reader::versioned(bytes, "idempotency hash key")?;
    let low = reader.u64()?;
    let high = reader.u64()?;
    let keyed_from = reader.u64()?;
    reader.finish()?;
    Ok(HashKey {
        key: u128::from(high) << 64 | u128::from(low),
        keyed_from,
    })
}

/// Encodes a u64 meta value.
pub fn encode_u64(value: u64) -> Vec<u8> {
    let mut out = vec![VERSION];
    out.extend_from_slice(&value.to_le_bytes());
    out
}

/// Decodes a u64 meta value.
pub fn decode_u64(bytes: &[u8], what: &str) -> Result<u64, StorageError> {
    let mut reader = Reader::versioned(bytes, what)?;
    let value = reader.u64()?;
    reader.finish()?;
    Ok(value)
}

/// Encodes a replica identity.
pub fn encode_identity(identity: &Identity) -> Vec<u8> {
    let mut out = vec![VERSION];
    out.extend_from_slice(&identity.replica.0.to_le_bytes());
    out.extend_from_slice(identity.region.as_bytes());
    out
}

/// Decodes a replica identity.
pub fn decode_identity(bytes: &[u8]) -> Result<Identity, StorageError> {
    let mut reader = Reader::versioned(bytes, "replica identity")?;
    let replica = ReplicaId(reader.u64()?);
    let region = String::from_utf8(reader.rest().to_vec())
        .map_err(|_| corrupt("replica identity", "region not UTF-8"))?;
    Ok(Identity { replica, region })
}

/// Encodes a watermark cursor.
pub fn encode_cursor(cursor: &Cursor) -> Vec<u8> {
    let mut out = vec![VERSION];
    put_varint(&mut out, cursor.seq);
    out.extend_from_slice(cursor.key.as_bytes());
    out
}

/// Decodes a watermark cursor.
pub fn decode_cursor(bytes: &[u8]) -> Result<Cursor, StorageError> {
    let mut reader = Reader::versioned(bytes, "watermark")?;
    let seq = reader.varint()?;
    let key = String::from_utf8(reader.rest().to_vec())
        .map_err(|_| corrupt("watermark", "key not UTF-8"))?;
    Ok(Cursor { seq, key })
}

/// Encodes the change log as a node leaves it ([`super::ChangeIndex`]), to
/// be read back at the next open instead of scanning every counter. It
/// holds the store's durable sequence when it was taken, and ends with a
/// checksum: a torn or stale file is detected and ignored.
pub fn encode_change_snapshot(durable_seq: u64, changes: &super::ChangeIndex) -> Vec<u8> {
    let mut out = vec![VERSION];
    out.extend_from_slice(&durable_seq.to_le_bytes());
    for (seq, keys) in changes.commits() {
        put_varint(&mut out, seq);
        put_varint(&mut out, keys.len() as u64);
        for key in keys {
            put_varint(&mut out, key.len() as u64);
            out.extend_from_slice(key.as_bytes());
        }
    }
    let checksum = stable_hash(SNAPSHOT_SEED, &[&out]);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

const SNAPSHOT_SEED: u64 = 0x0063_6861_6e67_6573;

/// Decodes a change-log snapshot: (the durable sequence it was taken at,
/// the log).
pub fn decode_change_snapshot(bytes: &[u8]) -> Result<(u64, super::ChangeIndex), StorageError> {
    const WHAT: &str = "change-log snapshot";
    let (body, checksum) = bytes
        .split_last_chunk::<8>()
        .ok_or_else(|| corrupt(WHAT, "truncated"))?;
    if stable_hash(SNAPSHOT_SEED, &[body]) != u64::from_le_bytes(*checksum) {
        return Err(corrupt(WHAT, "checksum mismatch"));
    }
    let mut reader = Reader::versioned(body, WHAT)?;
    let durable_seq = reader.u64()?;
    let mut changes = super::ChangeIndex::new();
    while !reader.bytes.is_empty() {
        let seq = reader.varint()?;
        for _ in 0..reader.varint()? {
            let len = usize::try_from(reader.varint()?).unwrap_or(usize::MAX);
            let key = reader.take(len)?;
            let key = std::str::from_utf8(key).map_err(|_| corrupt(WHAT, "key not UTF-8"))?;
            changes.push_recovered(seq, key);
        }
    }
    changes.finish_rebuild();
    Ok((durable_seq, changes))
}

pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    what: &'a str,
}

impl<'a> Reader<'a> {
    pub(super) fn versioned(bytes: &'a [u8], what: &'a str) -> Result<Self, StorageError> {
        Self::any_version(bytes, what, &[VERSION]).map(|(_, reader)| reader)
    }

    /// A reader of a value in `version` of a format of its own (a block's,
    /// `block.rs`), not the records' [`VERSION`].
    pub(super) fn versioned_as(
        bytes: &'a [u8],
        what: &'a str,
        version: u8,
    ) -> Result<Self, StorageError> {
        Self::any_version(bytes, what, &[version]).map(|(_, reader)| reader)
    }

    /// A reader of bytes with no version byte of their own (inside a
    /// versioned value).
    pub(super) fn raw(bytes: &'a [u8], what: &'a str) -> Self {
        Reader { bytes, what }
    }

    /// A reader of a value in one of `versions`, and the version it is in.
    fn any_version(
        bytes: &'a [u8],
        what: &'a str,
        versions: &[u8],
    ) -> Result<(u8, Self), StorageError> {
        match bytes.first() {
            Some(version) if versions.contains(version) => Ok((
                *version,
                Reader {
                    bytes: &bytes[1..],
                    what,
                },
            )),
            Some(other) => {
                let known = match versions {
                    [one] => format!("version {one}"),
                    many => format!("versions {many:?}"),
                };
                if versions.iter().all(|known| other > known) {
                    // Not damage: a newer build wrote it (see "Upgrading").
                    return Err(StorageError(format!(
                        "{what} in format {other}, written by a newer Tally build; this build \
                         reads {known}: run the newer build (or one at least as new)"
                    )));
                }
                Err(corrupt(
                    what,
                    &format!("unknown format version {other}; this build reads {known}"),
                ))
            }
            None => Err(corrupt(what, "empty")),
        }
    }

    fn u64(&mut self) -> Result<u64, StorageError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<8>()
            .ok_or_else(|| corrupt(self.what, "truncated"))?;
        self.bytes = rest;
        Ok(u64::from_le_bytes(*head))
    }

    fn u128(&mut self) -> Result<u128, StorageError> {
        let low = self.varint()?;
        let high = self.varint()?;
        Ok(u128::from(high) << 64 | u128::from(low))
    }

    pub(super) fn u64_be(&mut self) -> Result<u64, StorageError> {
        Ok(self.u64()?.swap_bytes())
    }

    pub(super) fn varint(&mut self) -> Result<u64, StorageError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self
                .bytes
                .split_first()
                .ok_or_else(|| corrupt(self.what, "truncated varint"))?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(corrupt(self.what, "varint too long"))
    }

    pub(super) fn take(&mut self, len: usize) -> Result<&'a [u8], StorageError> {
        if len > self.bytes.len() {
            return Err(corrupt(self.what, "truncated"));
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    pub(super) fn rest(self) -> &'a [u8] {
        self.bytes
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(super) fn finish(self) -> Result<(), StorageError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(corrupt(self.what, "trailing bytes"))
        }
    }
}

#[path = "fold_encoding.rs"]
mod fold;
pub use fold::*;

#[path = "bounded_encoding.rs"]
mod bounded;
pub use bounded::*;

#[cfg(test)]
#[path = "encoding_tests.rs"]
mod tests;
