//! Records of like sets and uniques, and the delta log: their keys, values and reads, over any store's
//! [`DurableState::get_record`] and [`DurableState::scan_records`].
//!
//! - member `s` + (key length - 1) as a byte + key + member → v1, length
//!   (varint). One record per (set, member): a commit writes only the
//!   members it changed, never the whole set. The key-length byte keeps the
//!   members of key `a` apart from those of key `ab`; members sort in byte
//!   order under their set, which is the listing order.
//! - count `n` + key → v1, derived count (varint), seq of the commit that
//!   wrote it (varint): `tally admin verify` compares it with a recount and
//!   uses the seq to see that no commit landed during the recount.
//! - uniques `h` + key → v1, registers ([`HyperLogLog::to_bytes`]: sparse,
//!   or whole dense as written before cluster version 11: read, never
//!   written any more, and kept because a key no commit raised since stays
//!   in it), or v1 + form 2: dense, in chunk records.
//! - uniques chunk `j` + (key length - 1) as a byte + key + chunk (u8, 0 to
//!   63) → v1, registers `256 * chunk ..` packed as in the dense form (192
//!   bytes). A commit writes only the chunks holding a register it raised
//!   (all of them when the key may have turned dense), so a hot key's late
//!   commits, which raise a register or two, rewrite a few hundred bytes
//!   instead of 12 KB: sled keeps a rewritten value's old copy until it
//!   cleans its segment, which made a hot key cost tens of megabytes on disk
//!   (`deploy/CAPACITY.md`, "Uniques keys on disk", with the chunk size
//!   measured). Chunk records also override their registers in a whole
//!   dense `h` record written by an older format, so a directory moves to
//!   chunks one write at a time.
//! - delta log `e` + seq (BE u64) + kind + key → v1, then per like set
//!   (member length, member, length)*, per uniques (index BE u16, rank)*,
//!   after a varint count. What peers pull.
//! - delta watermark `y` + replica (BE u64) → v1, cursor bytes.
//! - `msetsdigest` → v1, seq of the commit that wrote it (varint), sets
//!   digest (LE u64): written by every commit, so a build that kept no sets
//!   digest and committed since leaves it behind the durable sequence, and
//!   the store then computes the digest once from every member and register
//!   ([`recover_digest`]).
//!
//! Invariant: a value is read back exactly or reported corrupt, never a
//! panic and never read as zero.

use crate::crdt::hll::check_register;
use crate::crdt::hll::{DENSE_BYTES, REGISTERS, SPARSE_LIMIT};
use crate::crdt::{member_digest, register_digest, HyperLogLog, SetsDigest};
use crate::replica::{
    CommitBatch, DeltaCursor, DurableState, Key, SetDelta, SetKind, StorageError, UniqueWrite,
};

use super::encoding::{corrupt, put_varint, Reader, VERSION};
use super::Op;

/// Member prefix.
pub const MEMBER: u8 = b's';
/// Like-count prefix.
pub const LIKE_COUNT: u8 = b'n';
/// Uniques prefix.
pub const UNIQUES: u8 = b'h';
/// Uniques chunk prefix (cluster version 11).
pub const UNIQUES_CHUNK: u8 = b'j';
/// Registers in one chunk record of a dense uniques key.
pub const CHUNK_REGISTERS: usize = 256;
/// Chunk records of a dense uniques key.
pub const CHUNKS: usize = REGISTERS / CHUNK_REGISTERS;
/// Bytes of one chunk's packed registers (6 bits each).
pub const CHUNK_BYTES: usize = DENSE_BYTES / CHUNKS;
/// The register form, in an `h` record, of dense registers kept in chunks
/// (forms 0 and 1 are [`HyperLogLog::to_bytes`]'s sparse and dense).
pub const FORM_CHUNKED: u8 = 2;
/// The form byte of [`HyperLogLog::to_bytes`]'s dense registers.
const FORM_DENSE: u8 = 1;
/// Delta-log prefix.
pub const DELTA: u8 = b'e';
/// Delta-watermark prefix.
pub const DELTA_WATERMARK: u8 = b'y';
/// The sets digest and the commit that wrote it.
pub const META_SETS_DIGEST: &[u8] = b"msetsdigest";
/// Records read per scan while computing a sets digest from scratch.
const DIGEST_SCAN: usize = 4096;

/// The store-key prefix of a like set's members.
pub fn member_prefix(key: &str) -> Vec<u8> {
    debug_assert!(!key.is_empty() && key.len() <= 256);
    let mut out = Vec::with_capacity(2 + key.len());
    out.push(MEMBER);
    out.push((key.len() - 1) as u8);
    out.extend_from_slice(key.as_bytes());
    out
}

/// The store key of one member.
pub fn member_key(key: &str, member: &str) -> Vec<u8> {
    let mut out = member_prefix(key);
    out.extend_from_slice(member.as_bytes());
    out
}

/// The store key of `key` under record `prefix` (a like count, uniques).
pub fn keyed(prefix: u8, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(prefix);
    out.extend_from_slice(key.as_bytes());
    out
}

fn versioned_varints(values: &[u64]) -> Vec<u8> {
    let mut out = vec![VERSION];
    for value in values {
        put_varint(&mut out, *value);
    }
    out
}

/// Reads a member's length value.
pub fn decode_length(bytes: &[u8]) -> Result<u64, StorageError> {
    let mut reader = Reader::versioned(bytes, "like-set member")?;
    let length = reader.varint()?;
    reader.finish()?;
    Ok(length)
}

/// The stored length of a member (0 when never stored).
pub fn load_member(
    store: &(impl DurableState + ?Sized),
    key: &str,
    member: &str,
) -> Result<u64, StorageError> {
    store
        .get_record(&member_key(key, member))?
        .map_or(Ok(0), |bytes| decode_length(&bytes))
}

/// The stored derived count of a like set and the commit that wrote it.
pub fn load_like_count(
    store: &(impl DurableState + ?Sized),
    key: &str,
) -> Result<(u64, u64), StorageError> {
    let Some(bytes) = store.get_record(&keyed(LIKE_COUNT, key))? else {
        return Ok((0, 0));
    };
    let mut reader = Reader::versioned(&bytes, "like count")?;
    let count = reader.varint()?;
    let seq = reader.varint()?;
    reader.finish()?;
    Ok((count, seq))
}

/// The stored registers of a uniques key.
pub fn load_uniques(
    store: &(impl DurableState + ?Sized),
    key: &str,
) -> Result<Option<HyperLogLog>, StorageError> {
    let Some(bytes) = store.get_record(&keyed(UNIQUES, key))? else {
        return Ok(None);
    };
    decode_uniques(store, key, &bytes).map(Some)
}

/// The registers of uniques key `key` whose `h` record is `bytes`: sparse
/// as stored, or dense from the whole record or zeros (form 2), with every
/// chunk record of the key over it.
fn decode_uniques(
    store: &(impl DurableState + ?Sized),
    key: &str,
    bytes: &[u8],
) -> Result<HyperLogLog, StorageError> {
    let registers = Reader::versioned(bytes, "uniques")?.rest();
    let mut dense = match registers {
        [FORM_CHUNKED] => {
            let mut zeros = vec![0; 1 + DENSE_BYTES];
            zeros[0] = FORM_DENSE;
            zeros
        }
        [FORM_DENSE, packed @ ..] if packed.len() == DENSE_BYTES => registers.to_vec(),
        _ => {
            return HyperLogLog::from_bytes(registers)
                .map_err(|error| corrupt("uniques", &error.to_string()))
        }
    };
    let prefix = chunk_prefix(key);
    let mut end = prefix.clone();
    end.push(CHUNKS as u8);
    for (record, value) in store.scan_records(&prefix, &end, CHUNKS)? {
        let chunk = usize::from(record[prefix.len()..].first().copied().unwrap_or(u8::MAX));
        let packed = Reader::versioned(&value, "uniques chunk")?.rest();
        if record.len() != prefix.len() + 1 || chunk >= CHUNKS || packed.len() != CHUNK_BYTES {
            return Err(corrupt("uniques chunk", "key or length"));
        }
        dense[1 + chunk * CHUNK_BYTES..][..CHUNK_BYTES].copy_from_slice(packed);
    }
    HyperLogLog::from_bytes(&dense).map_err(|error| corrupt("uniques", &error.to_string()))
}

/// The store-key prefix of a uniques key's chunk records.
pub fn chunk_prefix(key: &str) -> Vec<u8> {
    debug_assert!(!key.is_empty() && key.len() <= 256);
    let mut out = Vec::with_capacity(3 + key.len());
    out.push(UNIQUES_CHUNK);
    out.push((key.len() - 1) as u8);
    out.extend_from_slice(key.as_bytes());
    out
}

/// The store key of chunk `chunk` of a uniques key.
pub fn chunk_key(key: &str, chunk: usize) -> Vec<u8> {
    let mut out = chunk_prefix(key);
    out.push(chunk as u8);
    out
}

/// The writes of one uniques key's registers: the whole registers in the
/// `h` record (sparse), or the chunks holding a raised register. Every chunk, and the `h`
/// record saying the registers are in chunks, when the key may have been
/// sparse before this commit (it then had no chunk records): at most
/// `SPARSE_LIMIT` registers were set before unless more are set now than
/// this commit raised.
fn uniques_ops(write: &UniqueWrite, ops: &mut Vec<Op>) {
    let whole = write.state.to_bytes();
    if !write.state.is_dense() {
        let mut value = vec![VERSION];
        value.extend_from_slice(&whole);
        ops.push(Op::Put(keyed(UNIQUES, &write.key), value));
        return;
    }
    let was_dense = write
        .state
        .set_count()
        .saturating_sub(write.registers.len())
        > SPARSE_LIMIT;
    let mut chunks: Vec<usize> = if was_dense {
        write
            .registers
            .iter()
            .map(|(index, _)| usize::from(*index) / CHUNK_REGISTERS)
            .collect()
    } else {
        ops.push(Op::Put(
            keyed(UNIQUES, &write.key),
            vec![VERSION, FORM_CHUNKED],
        ));
        (0..CHUNKS).collect()
    };
    chunks.sort_unstable();
    chunks.dedup();
    for chunk in chunks {
        let mut value = Vec::with_capacity(1 + CHUNK_BYTES);
        value.push(VERSION);
        value.extend_from_slice(&whole[1 + chunk * CHUNK_BYTES..][..CHUNK_BYTES]);
        ops.push(Op::Put(chunk_key(&write.key, chunk), value));
    }
}

/// Members of a like set strictly after `after` (all when `None`), in
/// member order, with their lengths; at most `limit`.
pub fn scan_members(
    store: &(impl DurableState + ?Sized),
    key: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, u64)>, StorageError> {
    let prefix = member_prefix(key);
    let mut from = prefix.clone();
    if let Some(after) = after {
        from.extend_from_slice(after.as_bytes());
        // The smallest key after `after`'s own.
        from.push(0);
    }
    let mut to = prefix.clone();
    // No UTF-8 member contains the byte 0xff.
    to.push(0xff);
    store
        .scan_records(&from, &to, limit)?
        .into_iter()
        .map(|(record, value)| {
            let member = std::str::from_utf8(&record[prefix.len()..])
                .map_err(|_| corrupt("like-set member", "not UTF-8"))?;
            Ok((member.to_string(), decode_length(&value)?))
        })
        .collect()
}

/// The like sets with a stored count, strictly after `after`, at most `limit`.
pub fn like_keys_after(
    store: &(impl DurableState + ?Sized),
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StorageError> {
    set_keys_after(store, SetKind::Likes, after, limit)
}

/// The like sets with a stored count, or the uniques keys with stored
/// registers, strictly after `after`, in key order, at most `limit`.
pub fn set_keys_after(
    store: &(impl DurableState + ?Sized),
    kind: SetKind,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StorageError> {
    let prefix = match kind {
        SetKind::Likes => LIKE_COUNT,
        SetKind::Uniques => UNIQUES,
    };
    let mut from = vec![prefix];
    if let Some(after) = after {
        from.extend_from_slice(after.as_bytes());
        from.push(0);
    }
    store
        .scan_records(&from, &[prefix + 1], limit)?
        .into_iter()
        .map(|(record, _)| {
            std::str::from_utf8(&record[1..])
                .map(str::to_string)
                .map_err(|_| corrupt("like count or uniques key", "not UTF-8"))
        })
        .collect()
}

fn delta_key(seq: u64, kind: SetKind, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + key.len());
    out.push(DELTA);
    out.extend_from_slice(&seq.to_be_bytes());
    out.push(kind.byte());
    out.extend_from_slice(key.as_bytes());
    out
}

fn encode_like_delta(members: &[(Box<str>, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + members.len() * 12);
    out.push(VERSION);
    put_varint(&mut out, members.len() as u64);
    for (member, length) in members {
        out.push(member.len() as u8);
        out.extend_from_slice(member.as_bytes());
        put_varint(&mut out, *length);
    }
    out
}

fn encode_uniques_delta(registers: &[(u16, u8)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + registers.len() * 3);
    out.push(VERSION);
    put_varint(&mut out, registers.len() as u64);
    for (index, rank) in registers {
        out.extend_from_slice(&index.to_be_bytes());
        out.push(*rank);
    }
    out
}

/// Reads one delta-log record back.
pub fn decode_delta(record: &[u8], value: &[u8]) -> Result<(DeltaCursor, SetDelta), StorageError> {
    const WHAT: &str = "delta-log record";
    if record.len() < 11 || record[0] != DELTA {
        return Err(corrupt(WHAT, "key too short"));
    }
    let cursor = DeltaCursor(record[1..].to_vec());
    let kind = SetKind::from_byte(record[9]).ok_or_else(|| corrupt(WHAT, "unknown kind"))?;
    let key: Key = std::str::from_utf8(&record[10..])
        .map_err(|_| corrupt(WHAT, "key not UTF-8"))?
        .into();
    let mut reader = Reader::versioned(value, WHAT)?;
    let count = reader.varint()?;
    let delta = match kind {
        SetKind::Likes => {
            let mut members = Vec::with_capacity(count.min(4096) as usize);
            for _ in 0..count {
                let len = reader.take(1)?[0];
                let member = std::str::from_utf8(reader.take(usize::from(len))?)
                    .map_err(|_| corrupt(WHAT, "member not UTF-8"))?;
                members.push((member.into(), reader.varint()?));
            }
            SetDelta::Likes { key, members }
        }
        SetKind::Uniques => {
            let mut registers = Vec::with_capacity(count.min(16384) as usize);
            for _ in 0..count {
                let raw = reader.take(3)?;
                let index = u32::from(u16::from_be_bytes([raw[0], raw[1]]));
                let register = check_register(index, u32::from(raw[2]))
                    .map_err(|error| corrupt(WHAT, &error.to_string()))?;
                registers.push(register);
            }
            SetDelta::Uniques { key, registers }
        }
    };
    reader.finish()?;
    Ok((cursor, delta))
}

/// Delta-log records strictly after `after`, at most `limit`.
pub fn deltas_after(
    store: &(impl DurableState + ?Sized),
    after: &DeltaCursor,
    limit: usize,
) -> Result<Vec<(DeltaCursor, SetDelta)>, StorageError> {
    let mut from = vec![DELTA];
    from.extend_from_slice(&after.0);
    if !after.0.is_empty() {
        from.push(0);
    }
    let mut deltas = Vec::new();
    store.visit_records(&from, &[DELTA + 1], limit, &mut |record, value| {
        deltas.push(decode_delta(record, value)?);
        Ok(())
    })?;
    Ok(deltas)
}

/// The puts that write the batch's like sets, uniques and delta
/// watermarks: each set's changed members (or registers), its count, and
/// one delta-log record; and the deletes of the sets the batch purges.
/// Uniques are written as `uniques_ops` says.
pub fn set_ops(batch: &CommitBatch, ops: &mut Vec<Op>) {
    for write in &batch.likes {
        for (member, length) in &write.members {
            ops.push(Op::Put(
                member_key(&write.key, member),
                versioned_varints(&[*length]),
            ));
        }
        ops.push(Op::Put(
            keyed(LIKE_COUNT, &write.key),
            versioned_varints(&[write.count, batch.seq]),
        ));
        ops.push(Op::Put(
            delta_key(batch.seq, SetKind::Likes, &write.key),
            encode_like_delta(&write.members),
        ));
    }
    for write in &batch.uniques {
        uniques_ops(write, ops);
        ops.push(Op::Put(
            delta_key(batch.seq, SetKind::Uniques, &write.key),
            encode_uniques_delta(&write.registers),
        ));
    }
    // Sets of partitions no longer kept (`replica/purge_sets.rs`): their
    // records go, with no delta-log record (peers keep what they have).
    for deletion in &batch.set_deletions {
        match deletion.kind {
            SetKind::Likes => {
                for member in &deletion.members {
                    ops.push(Op::Delete(member_key(&deletion.key, member)));
                }
                let count = keyed(LIKE_COUNT, &deletion.key);
                match deletion.count_after {
                    Some(count_after) => {
                        ops.push(Op::Put(count, versioned_varints(&[count_after, batch.seq])))
                    }
                    None => ops.push(Op::Delete(count)),
                }
            }
            SetKind::Uniques => {
                ops.push(Op::Delete(keyed(UNIQUES, &deletion.key)));
                for chunk in 0..CHUNKS {
                    ops.push(Op::Delete(chunk_key(&deletion.key, chunk)));
                }
            }
        }
    }
    let mut digest = versioned_varints(&[batch.seq]);
    digest.extend_from_slice(&batch.sets_digest.0.to_le_bytes());
    ops.push(Op::Put(META_SETS_DIGEST.to_vec(), digest));
    for (replica, cursor) in &batch.delta_watermarks {
        let mut value = vec![VERSION];
        value.extend_from_slice(&cursor.0);
        ops.push(Op::Put(
            super::encoding::replica_key(DELTA_WATERMARK, *replica),
            value,
        ));
    }
}

/// The sets digest of the durable state at `durable_seq`: the stored one
/// when the commit at `durable_seq` wrote it, else computed from every
/// member and register (once, after a build that kept none wrote).
pub fn recover_digest(
    store: &(impl DurableState + ?Sized),
    durable_seq: u64,
) -> Result<SetsDigest, StorageError> {
    if let Some(bytes) = store.get_record(META_SETS_DIGEST)? {
        let mut reader = Reader::versioned(&bytes, "sets digest")?;
        let seq = reader.varint()?;
        let digest = reader.take(8)?;
        reader.finish()?;
        if seq == durable_seq {
            return Ok(SetsDigest(u64::from_le_bytes(
                digest.try_into().expect("took 8 bytes"),
            )));
        }
    }
    compute_digest(store)
}

/// The sets digest computed from every stored member and register.
pub fn compute_digest(store: &(impl DurableState + ?Sized)) -> Result<SetsDigest, StorageError> {
    let mut digest = SetsDigest::default();
    for_each_digest_part(store, |_, part| digest.apply(part))?;
    Ok(digest)
}

/// The sets digest of each partition of `count` (the like sets and uniques
/// keys of that partition), computed from every stored member and register.
pub fn compute_digests_by_partition(
    store: &(impl DurableState + ?Sized),
    count: crate::partition::PartitionCount,
) -> Result<Vec<u64>, StorageError> {
    let mut digests = vec![0u64; count.get() as usize];
    for_each_digest_part(store, |key, part| {
        let slot = &mut digests[count.of_key(key.as_bytes()).0 as usize];
        *slot = slot.wrapping_add(part);
    })?;
    Ok(digests)
}

/// Calls `visit(key, part)` with the digest part of every stored member
/// and register.
fn for_each_digest_part(
    store: &(impl DurableState + ?Sized),
    mut visit: impl FnMut(&str, u64),
) -> Result<(), StorageError> {
    let mut from = vec![MEMBER];
    loop {
        let records = store.scan_records(&from, &[MEMBER + 1], DIGEST_SCAN)?;
        for (record, value) in &records {
            let key_len = usize::from(
                *record
                    .get(1)
                    .ok_or_else(|| corrupt("like-set member", "key too short"))?,
            ) + 1;
            let (key, member) = record
                .get(2..2 + key_len)
                .zip(record.get(2 + key_len..))
                .ok_or_else(|| corrupt("like-set member", "key too short"))?;
            let text = |bytes| {
                std::str::from_utf8(bytes).map_err(|_| corrupt("like-set member", "not UTF-8"))
            };
            let key = text(key)?;
            visit(
                key,
                member_digest(key, text(member)?, decode_length(value)?),
            );
        }
        match records.last() {
            Some((last, _)) if records.len() == DIGEST_SCAN => {
                from = last.clone();
                from.push(0);
            }
            _ => break,
        }
    }
    let mut from = vec![UNIQUES];
    loop {
        let records = store.scan_records(&from, &[UNIQUES + 1], DIGEST_SCAN)?;
        for (record, value) in &records {
            let key = std::str::from_utf8(&record[1..])
                .map_err(|_| corrupt("uniques", "key not UTF-8"))?;
            let state = decode_uniques(store, key, value)?;
            for index in 0..REGISTERS as u16 {
                visit(key, register_digest(key, index, state.register(index)));
            }
        }
        match records.last() {
            Some((last, _)) if records.len() == DIGEST_SCAN => {
                from = last.clone();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok(())
}

/// Reads a delta watermark's value back.
pub fn decode_delta_watermark(bytes: &[u8]) -> Result<DeltaCursor, StorageError> {
    let reader = Reader::versioned(bytes, "delta watermark")?;
    Ok(DeltaCursor(reader.rest().to_vec()))
}
