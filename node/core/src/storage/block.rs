//! Counter blocks: many counters of one partition in one immutable value,
//! the unit of the compact layout that issue 45 builds (DESIGN.md
//! "Storage"). Pure: bytes in, bytes out; the store decides where blocks
//! live and when runs are merged.
//!
//! A block holds counters in strictly increasing key order. Each key is
//! written as the length of the prefix it shares with the key before it and
//! the rest (a *restart* every [`RESTART_INTERVAL`] entries writes a whole
//! key, so a read seeks by binary search over the restarts and then scans
//! at most that many entries). Each counter's slots name their replica by
//! the store's ordinal ([`super::Ordinals`]) and their `p` and `n` as
//! varints; the fold epoch is written once per block (the first counter's)
//! and again only on a counter whose epoch differs, and a folded base only
//! where there is one. Sequential 20-byte keys of three slots each take
//! 20.2 bytes a counter (the seed's budget is 20; the row format takes 35
//! on its own and sled's entry about 180 more).
//!
//! ```text
//! block   = version (1) | epoch (varint) | entry* | restart (u32 LE)* | restarts (u32 LE)
//! entry   = shared (varint) | rest length (varint) | rest | head (varint)
//!           | [epoch (varint)] | [base p, base n (varint128)] | slot*
//! head    = slots << 2 | has base << 1 | own epoch
//! slot    = ordinal (varint) | p (varint) | n (varint)
//! ```
//!
//! Invariants: a block reads back exactly the counters it was built from
//! (slots, base and epoch), and a damaged or truncated block is reported as
//! corrupt, never read as zero and never a panic. Merging runs
//! ([`merge_runs`]) joins the states of a key with the caller's join (the
//! CRDT merge, with the fold rule), so runs merge in any order to the same
//! result, and a flush never has to read before it writes.

use std::cmp::Ordering;

use crate::crdt::{FoldedBase, PnCounter, ReplicaId, Slot};
use crate::replica::StorageError;

use super::encoding::{corrupt, put_varint, Reader};

/// The block format written by this build.
pub const BLOCK_VERSION: u8 = 1;
/// Entries between two whole keys.
pub const RESTART_INTERVAL: usize = 16;

const WHAT: &str = "counter block";

/// Builds one block from counters pushed in increasing key order.
#[derive(Debug, Default)]
pub struct BlockBuilder {
    entries: Vec<u8>,
    restarts: Vec<u32>,
    last_key: String,
    count: usize,
    epoch: u64,
}

impl BlockBuilder {
    /// An empty block.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counters pushed so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no counter was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The bytes the block would take if finished now.
    pub fn size(&self) -> usize {
        1 + 10 + self.entries.len() + 4 * (self.restarts.len() + 1)
    }

    /// Appends `counter` under `key`, naming each slot's replica by
    /// `ordinal_of`. Keys must strictly increase: a key at or below the
    /// last one is refused and changes nothing.
    pub fn push(
        &mut self,
        key: &str,
        counter: &PnCounter,
        ordinal_of: &mut impl FnMut(ReplicaId) -> u32,
    ) -> Result<(), StorageError> {
        if self.count > 0 && key <= self.last_key.as_str() {
            return Err(StorageError(format!(
                "a block takes keys in increasing order: {key:?} after {:?}",
                self.last_key
            )));
        }
        let base = counter.folded();
        if self.count == 0 {
            self.epoch = base.epoch;
        }
        let shared = match self.count % RESTART_INTERVAL {
            0 => {
                let offset = u32::try_from(self.entries.len())
                    .map_err(|_| StorageError("a block outgrew 4 GiB".into()))?;
                self.restarts.push(offset);
                0
            }
            _ => shared_prefix(&self.last_key, key),
        };
        let rest = &key.as_bytes()[shared..];
        put_varint(&mut self.entries, shared as u64);
        put_varint(&mut self.entries, rest.len() as u64);
        self.entries.extend_from_slice(rest);
        let has_base = base.p != 0 || base.n != 0;
        let own_epoch = base.epoch != self.epoch;
        let slots = counter.slots();
        let head = (slots.len() as u64) << 2 | u64::from(has_base) << 1 | u64::from(own_epoch);
        put_varint(&mut self.entries, head);
        if own_epoch {
            put_varint(&mut self.entries, base.epoch);
        }
        if has_base {
            put_varint128(&mut self.entries, base.p);
            put_varint128(&mut self.entries, base.n);
        }
        for (replica, slot) in slots {
            put_varint(&mut self.entries, u64::from(ordinal_of(*replica)));
            put_varint(&mut self.entries, slot.p);
            put_varint(&mut self.entries, slot.n);
        }
        self.last_key.clear();
        self.last_key.push_str(key);
        self.count += 1;
        Ok(())
    }

    /// The block's bytes.
    pub fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size());
        out.push(BLOCK_VERSION);
        put_varint(&mut out, self.epoch);
        out.extend_from_slice(&self.entries);
        for restart in &self.restarts {
            out.extend_from_slice(&restart.to_le_bytes());
        }
        out.extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        out
    }
}

/// A block read back: its entries and restarts, checked for shape.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    epoch: u64,
    entries: &'a [u8],
    restarts: &'a [u8],
}

impl<'a> Block<'a> {
    /// Reads a block's frame (version, epoch, restart table); entries are
    /// checked as they are read.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, StorageError> {
        let mut reader = Reader::versioned_as(bytes, WHAT, BLOCK_VERSION)?;
        let epoch = reader.varint()?;
        let body = reader.rest();
        let (body, count) = body
            .split_last_chunk::<4>()
            .ok_or_else(|| corrupt(WHAT, "no restart count"))?;
        let restarts = u32::from_le_bytes(*count) as usize;
        let table = restarts
            .checked_mul(4)
            .filter(|len| *len <= body.len())
            .ok_or_else(|| corrupt(WHAT, "restart table longer than the block"))?;
        let (entries, restarts) = body.split_at(body.len() - table);
        let block = Block {
            epoch,
            entries,
            restarts,
        };
        for index in 0..block.restart_count() {
            let offset = block.restart(index);
            if offset >= entries.len() || (index == 0 && offset != 0) {
                return Err(corrupt(WHAT, "restart outside its entries"));
            }
        }
        if block.restart_count() == 0 && !entries.is_empty() {
            return Err(corrupt(WHAT, "entries without a restart"));
        }
        Ok(block)
    }

    fn restart_count(&self) -> usize {
        self.restarts.len() / 4
    }

    fn restart(&self, index: usize) -> usize {
        let at = index * 4;
        let bytes: [u8; 4] = self.restarts[at..at + 4].try_into().expect("4 bytes");
        u32::from_le_bytes(bytes) as usize
    }

    /// Every counter in key order.
    pub fn iter<F>(&self, replica_of: F) -> BlockIter<'a, F>
    where
        F: Fn(u32) -> Option<ReplicaId>,
    {
        BlockIter {
            reader: Reader::raw(self.entries, WHAT),
            epoch: self.epoch,
            key: String::new(),
            replica_of,
            failed: false,
        }
    }

    /// The counter stored under `key`, if any: a binary search over the
    /// restarts, then a scan of at most [`RESTART_INTERVAL`] entries.
    pub fn get(
        &self,
        key: &str,
        replica_of: impl Fn(u32) -> Option<ReplicaId>,
    ) -> Result<Option<PnCounter>, StorageError> {
        let (mut low, mut high) = (0, self.restart_count());
        while high - low > 1 {
            let middle = (low + high) / 2;
            let mut reader = Reader::raw(&self.entries[self.restart(middle)..], WHAT);
            let mut first = String::new();
            read_key(&mut reader, &mut first)?;
            match first.as_str().cmp(key) {
                Ordering::Greater => high = middle,
                _ => low = middle,
            }
        }
        if self.restart_count() == 0 {
            return Ok(None);
        }
        let mut iter = BlockIter {
            reader: Reader::raw(&self.entries[self.restart(low)..], WHAT),
            epoch: self.epoch,
            key: String::new(),
            replica_of,
            failed: false,
        };
        for _ in 0..RESTART_INTERVAL {
            match iter.next().transpose()? {
                Some((found, counter)) => match found.as_str().cmp(key) {
                    Ordering::Less => continue,
                    Ordering::Equal => return Ok(Some(counter)),
                    Ordering::Greater => return Ok(None),
                },
                None => return Ok(None),
            }
        }
        Ok(None)
    }
}

/// The counters of a block in key order ([`Block::iter`]); stops after the
/// first error.
pub struct BlockIter<'a, F> {
    reader: Reader<'a>,
    epoch: u64,
    key: String,
    replica_of: F,
    failed: bool,
}

impl<F: Fn(u32) -> Option<ReplicaId>> BlockIter<'_, F> {
    fn read_entry(&mut self) -> Result<(String, PnCounter), StorageError> {
        read_key(&mut self.reader, &mut self.key)?;
        let head = self.reader.varint()?;
        let slots = head >> 2;
        let epoch = match head & 1 {
            1 => self.reader.varint()?,
            _ => self.epoch,
        };
        let (p, n) = match head & 2 {
            2 => (
                read_varint128(&mut self.reader)?,
                read_varint128(&mut self.reader)?,
            ),
            _ => (0, 0),
        };
        let mut read = Vec::with_capacity(slots.min(64) as usize);
        for _ in 0..slots {
            let ordinal = self.reader.varint()?;
            let replica = u32::try_from(ordinal)
                .ok()
                .and_then(&self.replica_of)
                .ok_or_else(|| corrupt(WHAT, &format!("unknown replica ordinal {ordinal}")))?;
            let slot = Slot {
                p: self.reader.varint()?,
                n: self.reader.varint()?,
            };
            read.push((replica, slot));
        }
        let base = FoldedBase { epoch, p, n };
        Ok((self.key.clone(), PnCounter::from_parts(read, base)))
    }
}

impl<F: Fn(u32) -> Option<ReplicaId>> Iterator for BlockIter<'_, F> {
    type Item = Result<(String, PnCounter), StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.reader.is_empty() {
            return None;
        }
        let entry = self.read_entry();
        self.failed = entry.is_err();
        Some(entry)
    }
}

/// Joins runs of counters into one run in key order: where several runs
/// hold a key, `join` merges each further state into the first (the CRDT
/// merge with the fold rule, so the order of `runs` does not matter).
pub fn merge_runs(
    runs: &[Block<'_>],
    replica_of: impl Fn(u32) -> Option<ReplicaId> + Copy,
    mut join: impl FnMut(&mut PnCounter, &PnCounter),
) -> Result<Vec<(String, PnCounter)>, StorageError> {
    let mut iters: Vec<_> = runs.iter().map(|run| run.iter(replica_of)).collect();
    let mut heads: Vec<Option<(String, PnCounter)>> = Vec::with_capacity(iters.len());
    for iter in &mut iters {
        heads.push(iter.next().transpose()?);
    }
    let mut merged = Vec::new();
    loop {
        let Some(least) = heads.iter().flatten().map(|(key, _)| key).min().cloned() else {
            return Ok(merged);
        };
        let mut joined: Option<PnCounter> = None;
        for (head, iter) in heads.iter_mut().zip(&mut iters) {
            if head.as_ref().is_some_and(|(key, _)| *key == least) {
                let (_, state) = head.take().expect("checked");
                match &mut joined {
                    Some(into) => join(into, &state),
                    None => joined = Some(state),
                }
                *head = iter.next().transpose()?;
            }
        }
        merged.push((least, joined.expect("a run held the least key")));
    }
}

/// Cuts counters in key order into blocks of about `target` bytes each.
pub fn build_blocks(
    counters: &[(String, PnCounter)],
    target: usize,
    mut ordinal_of: impl FnMut(ReplicaId) -> u32,
) -> Result<Vec<Vec<u8>>, StorageError> {
    let mut blocks = Vec::new();
    let mut builder = BlockBuilder::new();
    for (key, counter) in counters {
        builder.push(key, counter, &mut ordinal_of)?;
        if builder.size() >= target {
            blocks.push(std::mem::take(&mut builder).finish());
        }
    }
    if !builder.is_empty() {
        blocks.push(builder.finish());
    }
    Ok(blocks)
}

fn shared_prefix(a: &str, b: &str) -> usize {
    let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    // A key is cut only between characters, so every rest is UTF-8.
    (0..=common)
        .rev()
        .find(|at| b.is_char_boundary(*at))
        .unwrap_or(0)
}

fn read_key(reader: &mut Reader<'_>, key: &mut String) -> Result<(), StorageError> {
    let shared = reader.varint()? as usize;
    let len = reader.varint()? as usize;
    if shared > key.len() || !key.is_char_boundary(shared) {
        return Err(corrupt(WHAT, "a key shares more than the key before it"));
    }
    let rest =
        std::str::from_utf8(reader.take(len)?).map_err(|_| corrupt(WHAT, "key not UTF-8"))?;
    key.truncate(shared);
    key.push_str(rest);
    Ok(())
}

fn put_varint128(out: &mut Vec<u8>, mut value: u128) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint128(reader: &mut Reader<'_>) -> Result<u128, StorageError> {
    let mut value = 0u128;
    for shift in (0..128).step_by(7) {
        let byte = reader.take(1)?[0];
        value |= u128::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(corrupt(WHAT, "varint too long"))
}

#[cfg(test)]
#[path = "block_tests.rs"]
mod tests;
