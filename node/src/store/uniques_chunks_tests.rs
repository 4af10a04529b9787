//! Tests of dense uniques keys in chunk records: what a
//! commit writes, what a read puts back together over both stores and over
//! a whole dense record of an older format, deletion, and damage.

use crate::crdt::hll::{DENSE_BYTES, SPARSE_LIMIT};
use crate::crdt::{register_digest, HyperLogLog, SetsDigest};
use crate::replica::{CommitBatch, Identity, SetDeletion, UniqueWrite};
use crate::replica::{DurableState, SetKind};
use crate::store::encoding::VERSION;
use crate::store::sets::*;
use crate::store::Op;
use crate::store::{MemoryStore, SledStore, Store};

fn identity() -> Identity {
    Identity {
        replica: crate::crdt::ReplicaId(7),
        region: "eu".into(),
    }
}

/// A dense sketch of `members` distinct members.
fn dense(members: u32) -> HyperLogLog {
    let mut sketch = HyperLogLog::new();
    for member in 0..members {
        sketch.observe(format!("member-{member}").as_bytes());
    }
    assert!(sketch.is_dense());
    sketch
}

/// A register of `chunk` that `sketch` holds below the highest rank.
fn raisable(sketch: &HyperLogLog, chunk: usize) -> (u16, u8) {
    (chunk * CHUNK_REGISTERS..(chunk + 1) * CHUNK_REGISTERS)
        .map(|index| index as u16)
        .find_map(|index| {
            let rank = sketch.register(index);
            (rank < 20).then_some((index, rank + 1))
        })
        .unwrap()
}

fn write_of(key: &str, state: &HyperLogLog, registers: Vec<(u16, u8)>) -> CommitBatch {
    CommitBatch {
        seq: 1,
        uniques: vec![UniqueWrite {
            key: key.into(),
            state: state.clone(),
            registers,
        }],
        ..Default::default()
    }
}

/// The uniques records (`h` and `j`) that `ops` put.
fn puts(ops: &[Op]) -> Vec<(u8, usize)> {
    ops.iter()
        .filter_map(|op| match op {
            Op::Put(key, value) if key[0] == UNIQUES || key[0] == UNIQUES_CHUNK => {
                Some((key[0], value.len()))
            }
            _ => None,
        })
        .collect()
}

fn records(store: &impl Store, prefix: u8) -> Vec<(Vec<u8>, Vec<u8>)> {
    store.scan_records(&[prefix], &[prefix + 1], 100).unwrap()
}

#[test]
fn a_dense_key_is_written_in_chunks_and_a_commit_rewrites_only_the_chunks_it_raised() {
    let mut sketch = dense(20_000);
    // Turning dense (or possibly so): the `h` record says "chunks", and every chunk.
    let mut ops = Vec::new();
    set_ops(&write_of("v", &sketch, sketch.set_registers()), &mut ops);
    let written = puts(&ops);
    assert_eq!(written[0], (UNIQUES, 2));
    assert_eq!(written.len(), 1 + CHUNKS);
    assert!(written[1..]
        .iter()
        .all(|&(prefix, len)| prefix == UNIQUES_CHUNK && len == 1 + CHUNK_BYTES));
    // Later: two raised registers in chunks 3 and 12 rewrite those two chunks only.
    let raised = [raisable(&sketch, 3), raisable(&sketch, 12)];
    for (index, rank) in raised {
        sketch.raise(index, rank);
    }
    let mut ops = Vec::new();
    set_ops(&write_of("v", &sketch, raised.to_vec()), &mut ops);
    assert_eq!(
        puts(&ops),
        [
            (UNIQUES_CHUNK, 1 + CHUNK_BYTES),
            (UNIQUES_CHUNK, 1 + CHUNK_BYTES)
        ]
    );
    // A sparse key stays in its `h` record.
    let mut sparse = HyperLogLog::new();
    sparse.observe(b"one");
    let mut ops = Vec::new();
    set_ops(&write_of("s", &sparse, sparse.set_registers()), &mut ops);
    assert_eq!(puts(&ops), [(UNIQUES, 2 + 2 + 3)]);
}

/// Writes the key sparse, then dense, then raises one register per chunk
/// in turn, one commit each; every read in between is the state written.
fn grow_and_read(store: &impl Store) {
    let mut sketch = HyperLogLog::new();
    let mut seq = 0;
    let mut commit = |state: &HyperLogLog, registers: Vec<(u16, u8)>| {
        seq += 1;
        let mut batch = write_of("video:1:seen", state, registers);
        batch.seq = seq;
        store.write(&batch).unwrap();
        assert_eq!(
            store.load_uniques("video:1:seen").unwrap().as_ref(),
            Some(state)
        );
    };
    sketch.observe(b"first");
    commit(&sketch, sketch.set_registers());
    let before = sketch.clone();
    for member in 0..20_000 {
        sketch.observe(format!("member-{member}").as_bytes());
    }
    let raised: Vec<(u16, u8)> = sketch
        .set_registers()
        .into_iter()
        .filter(|(index, rank)| before.register(*index) != *rank)
        .collect();
    commit(&sketch, raised);
    for chunk in 0..CHUNKS {
        let (index, rank) = raisable(&sketch, chunk);
        sketch.raise(index, rank);
        commit(&sketch, vec![(index, rank)]);
    }
    store.flush().unwrap();
    assert_eq!(records(store, UNIQUES).len(), 1);
    assert_eq!(records(store, UNIQUES_CHUNK).len(), CHUNKS);
    assert_eq!(
        set_keys_after(store, SetKind::Uniques, None, 10).unwrap(),
        ["video:1:seen"]
    );
    // The digest computed from the records is the registers'.
    let mut expected = SetsDigest::default();
    for (index, rank) in sketch.set_registers() {
        expected.apply(register_digest("video:1:seen", index, rank));
    }
    assert_eq!(compute_digest(store).unwrap(), expected);
    // A purge deletes the `h` record and every chunk.
    store
        .write(&CommitBatch {
            seq: 100,
            set_deletions: vec![SetDeletion {
                kind: SetKind::Uniques,
                key: "video:1:seen".into(),
                members: Vec::new(),
                count_after: None,
            }],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(store.load_uniques("video:1:seen").unwrap(), None);
    assert!(records(store, UNIQUES_CHUNK).is_empty());
}

#[test]
fn registers_read_back_exactly_from_chunks_in_the_memory_store() {
    grow_and_read(&MemoryStore::new(identity()));
}

#[test]
fn registers_read_back_exactly_from_chunks_in_sled_and_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), "eu", 7, crate::store::OnCorrupt::Refuse).unwrap();
    grow_and_read(&store);
    let sketch = dense(5_000);
    store
        .write(&write_of("kept", &sketch, sketch.set_registers()))
        .unwrap();
    store.close().unwrap();
    drop(store);
    let store = crate::store::suite::reopen(dir.path(), 7);
    assert_eq!(store.load_uniques("kept").unwrap(), Some(sketch));
}

/// The commit that turns a key dense may raise one register only: every
/// chunk is written then, since the sparse registers were in no chunk.
fn turn_dense_with_one_register(store: &impl Store) {
    let mut sketch = HyperLogLog::new();
    let mut member = 0;
    while sketch.set_count() < SPARSE_LIMIT {
        sketch.observe(format!("m{member}").as_bytes());
        member += 1;
    }
    assert!(!sketch.is_dense());
    store
        .write(&write_of("v", &sketch, sketch.set_registers()))
        .unwrap();
    let raised = loop {
        member += 1;
        let before = sketch.set_count();
        if let Some(raised) = sketch.observe(format!("m{member}").as_bytes()) {
            if sketch.set_count() > before {
                break raised;
            }
        }
    };
    assert!(sketch.is_dense());
    let mut batch = write_of("v", &sketch, vec![raised]);
    batch.seq = 2;
    store.write(&batch).unwrap();
    assert_eq!(store.load_uniques("v").unwrap(), Some(sketch));
}

#[test]
fn a_key_turned_dense_by_one_register_reads_back_exactly() {
    turn_dense_with_one_register(&MemoryStore::new(identity()));
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), "eu", 7, crate::store::OnCorrupt::Refuse).unwrap();
    turn_dense_with_one_register(&store);
}

/// A directory that wrote a key whole before version 11 keeps that record
/// (this build never writes one: it is planted here as older builds wrote
/// it); its changed chunks are written over it.
#[test]
fn a_whole_dense_record_of_an_older_format_takes_chunk_records_over_it() {
    let store = MemoryStore::new(identity());
    let mut sketch = dense(20_000);
    let whole = [vec![VERSION], sketch.to_bytes()].concat();
    store.plant(&[Op::Put(keyed(UNIQUES, "v"), whole)]);
    assert_eq!(records(&store, UNIQUES)[0].1.len(), 2 + DENSE_BYTES);
    assert_eq!(store.load_uniques("v").unwrap().as_ref(), Some(&sketch));
    let raised = raisable(&sketch, 9);
    sketch.raise(raised.0, raised.1);
    let mut batch = write_of("v", &sketch, vec![raised]);
    batch.seq = 2;
    store.write(&batch).unwrap();
    assert_eq!(records(&store, UNIQUES)[0].1.len(), 2 + DENSE_BYTES);
    assert_eq!(records(&store, UNIQUES_CHUNK).len(), 1);
    assert_eq!(store.load_uniques("v").unwrap(), Some(sketch));
}

#[test]
fn a_damaged_chunk_is_an_error_never_zero() {
    let sketch = dense(20_000);
    // A store holding the key in chunks, with `planted` written over it.
    let holding = |planted: Option<(Vec<u8>, Vec<u8>)>| {
        let store = MemoryStore::new(identity());
        store
            .write(&write_of("v", &sketch, sketch.set_registers()))
            .unwrap();
        if let Some((key, value)) = planted {
            store.plant(&[Op::Put(key, value)]);
        }
        store
    };
    assert_eq!(
        holding(None).load_uniques("v").unwrap(),
        Some(sketch.clone())
    );
    let damages = [
        (chunk_key("v", 4), vec![VERSION, 1, 2, 3]),
        (chunk_key("v", 4), vec![9; 1 + CHUNK_BYTES]),
        (chunk_key("v", 4), Vec::new()),
        // A register of rank 63, past the highest a 64-bit hash gives.
        (
            chunk_key("v", 4),
            [vec![VERSION], vec![0xff; CHUNK_BYTES]].concat(),
        ),
        (keyed(UNIQUES, "v"), vec![VERSION, FORM_CHUNKED, 0]),
    ];
    for (key, damage) in damages {
        let damaged = holding(Some((key.clone(), damage)));
        assert!(damaged.load_uniques("v").is_err(), "{key:?}");
        assert!(compute_digest(&damaged).is_err(), "{key:?}");
    }
    // A chunk number past the last, under the key's prefix but past its
    // chunks, is not read as one of them.
    let mut past_the_last = chunk_prefix("v");
    past_the_last.push(CHUNKS as u8 + 1);
    let stray = holding(Some((past_the_last, vec![VERSION; 1 + CHUNK_BYTES])));
    assert_eq!(stray.load_uniques("v").unwrap(), Some(sketch));
}
