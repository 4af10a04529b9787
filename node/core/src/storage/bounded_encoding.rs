//! The byte encoding of a bounded counter's state ([`BoundedCounter`],
//! issue 44), for the store and the wire alike: compact (varints; each
//! writer's 8-byte id written once), versioned, and canonical in its
//! order, so that two replicas holding the same state write the same
//! bytes. Decoding never panics: damaged, truncated or trailing bytes,
//! rows or receivers out of order or repeated, a transfer to oneself, an
//! index out of range and a circle of heirs are reported as corrupt.
//!
//! Layout, after the version byte [`BOUNDED_VERSION`]:
//!
//! | field      | encoding                                                   |
//! |------------|------------------------------------------------------------|
//! | bound      | zigzag varint                                              |
//! | writers    | count, then each id as 8 bytes little-endian, strictly increasing: every writer the rows, transfers and folds name |
//! | rows       | count, then per row: writer index (strictly increasing), put, took, sent count, then per receiver: its index (strictly increasing, not the row's own), amount |
//! | heirs      | count, then per retired writer: its index (strictly increasing), its heir's index (not its own) |
//!
//! Indexes are varints into the writers table. A counter of three writers
//! that each sent to the other two takes 59 bytes (see the tests).

use std::collections::{BTreeMap, BTreeSet};

use crate::crdt::{BoundedCounter, ReplicaId, RightsRow};
use crate::replica::StorageError;

use super::{corrupt, put_varint, unzigzag, zigzag, Reader};

/// The format of a bounded counter written by this build.
pub const BOUNDED_VERSION: u8 = 1;

const WHAT: &str = "bounded counter";

/// Encodes a bounded counter's state.
pub fn encode_bounded(counter: &BoundedCounter) -> Vec<u8> {
    let named = counter
        .rows()
        .iter()
        .flat_map(|(writer, row)| std::iter::once(writer).chain(row.sent.keys()))
        .chain(
            counter
                .heirs()
                .iter()
                .flat_map(|(retired, heir)| [retired, heir]),
        );
    let writers: Vec<ReplicaId> = named
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let index = |writer: &ReplicaId| -> u64 {
        let at = writers
            .binary_search(writer)
            .expect("the table holds every writer it was built from");
        at as u64
    };
    let mut out = Vec::with_capacity(4 + writers.len() * 14);
    out.push(BOUNDED_VERSION);
    put_varint(&mut out, zigzag(counter.bound()));
    put_varint(&mut out, writers.len() as u64);
    for writer in &writers {
        out.extend_from_slice(&writer.0.to_le_bytes());
    }
    put_varint(&mut out, counter.rows().len() as u64);
    for (writer, row) in counter.rows() {
        put_varint(&mut out, index(writer));
        put_varint(&mut out, row.put);
        put_varint(&mut out, row.took);
        put_varint(&mut out, row.sent.len() as u64);
        for (to, amount) in &row.sent {
            put_varint(&mut out, index(to));
            put_varint(&mut out, *amount);
        }
    }
    put_varint(&mut out, counter.heirs().len() as u64);
    for (retired, heir) in counter.heirs() {
        put_varint(&mut out, index(retired));
        put_varint(&mut out, index(heir));
    }
    out
}

/// Decodes [`encode_bounded`].
pub fn decode_bounded(bytes: &[u8]) -> Result<BoundedCounter, StorageError> {
    let mut reader = Reader::versioned_as(bytes, WHAT, BOUNDED_VERSION)?;
    let bound = unzigzag(reader.varint()?);
    let writers = read_writers(&mut reader, bytes.len())?;
    let table = IndexReader {
        writers: &writers,
        bytes: bytes.len(),
    };
    let mut rows = BTreeMap::new();
    let mut last = None;
    for _ in 0..table.count(&mut reader, "row")? {
        let at = table.next_index(&mut reader, &mut last, "rows")?;
        let mut row = RightsRow {
            put: reader.varint()?,
            took: reader.varint()?,
            sent: BTreeMap::new(),
        };
        let mut last_receiver = None;
        for _ in 0..table.count(&mut reader, "receiver")? {
            let to = table.next_index(&mut reader, &mut last_receiver, "receivers")?;
            if to == at {
                return Err(corrupt(WHAT, "a writer's transfer to itself"));
            }
            row.sent.insert(writers[to], reader.varint()?);
        }
        rows.insert(writers[at], row);
    }
    let mut heirs = BTreeMap::new();
    let mut last = None;
    for _ in 0..table.count(&mut reader, "heir")? {
        let retired = table.next_index(&mut reader, &mut last, "retired writers")?;
        let heir = table.index(&mut reader)?;
        if heir == retired {
            return Err(corrupt(WHAT, "a retired writer its own heir"));
        }
        heirs.insert(writers[retired], writers[heir]);
    }
    reader.finish()?;
    let counter = BoundedCounter::from_parts(bound, rows, heirs);
    if counter
        .heirs()
        .keys()
        .any(|retired| counter.holder_of(*retired).is_none())
    {
        return Err(corrupt(WHAT, "a circle of heirs"));
    }
    Ok(counter)
}

fn read_writers(reader: &mut Reader<'_>, len: usize) -> Result<Vec<ReplicaId>, StorageError> {
    let count = reader.varint()?;
    if count.saturating_mul(8) > len as u64 {
        return Err(corrupt(WHAT, "writer count larger than the value"));
    }
    let mut writers: Vec<ReplicaId> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let writer = ReplicaId(reader.u64()?);
        if writers.last().is_some_and(|last| *last >= writer) {
            return Err(corrupt(WHAT, "writers out of order or repeated"));
        }
        writers.push(writer);
    }
    Ok(writers)
}

/// Reads indexes into the writers table, and counts bounded by the value.
struct IndexReader<'t> {
    writers: &'t [ReplicaId],
    bytes: usize,
}

impl IndexReader<'_> {
    fn count(&self, reader: &mut Reader<'_>, what: &str) -> Result<u64, StorageError> {
        let count = reader.varint()?;
        if count > self.bytes as u64 {
            return Err(corrupt(
                WHAT,
                &format!("{what} count larger than the value"),
            ));
        }
        Ok(count)
    }

    fn index(&self, reader: &mut Reader<'_>) -> Result<usize, StorageError> {
        usize::try_from(reader.varint()?)
            .ok()
            .filter(|at| *at < self.writers.len())
            .ok_or_else(|| corrupt(WHAT, "writer index out of range"))
    }

    /// An index above `last`, which it becomes.
    fn next_index(
        &self,
        reader: &mut Reader<'_>,
        last: &mut Option<usize>,
        what: &str,
    ) -> Result<usize, StorageError> {
        let at = self.index(reader)?;
        if last.is_some_and(|last| last >= at) {
            return Err(corrupt(WHAT, &format!("{what} out of order or repeated")));
        }
        *last = Some(at);
        Ok(at)
    }
}

#[cfg(test)]
#[path = "bounded_encoding_tests.rs"]
mod tests;
