//! Tests of the like-set, uniques and delta-log records, against both stores.

use crate::crdt::HyperLogLog;
use crate::crdt::ReplicaId;
use crate::replica::{CommitBatch, Identity, LikeWrite, UniqueWrite};
use crate::replica::{DeltaCursor, SetDelta};
use crate::store::encoding::VERSION;
use crate::store::sets::*;
use crate::store::{MemoryStore, SledStore, Store};

fn batch(seq: u64, likes: Vec<LikeWrite>, uniques: Vec<UniqueWrite>) -> CommitBatch {
    CommitBatch {
        seq,
        likes,
        uniques,
        ..Default::default()
    }
}

fn likes(key: &str, count: u64, members: &[(&str, u64)]) -> LikeWrite {
    LikeWrite {
        key: key.into(),
        count,
        members: members.iter().map(|(m, l)| (Box::from(*m), *l)).collect(),
    }
}

fn run(store: &impl Store) {
    let mut sketch = HyperLogLog::new();
    sketch.observe(b"x");
    let registers = sketch.set_registers();
    store
        .write(&batch(
            1,
            vec![
                likes("a", 2, &[("sam", 1), ("bo", 1), ("zed", 2)]),
                likes("ab", 1, &[("x", 1)]),
            ],
            vec![UniqueWrite {
                key: "a".into(),
                state: sketch.clone(),
                registers: registers.clone(),
            }],
        ))
        .unwrap();
    store
        .write(&batch(2, vec![likes("a", 3, &[("cy", 1)])], Vec::new()))
        .unwrap();
    store.flush().unwrap();
    // Key "a" and key "ab" keep their members apart.
    let members = scan_members(store, "a", None, 10).unwrap();
    let names: Vec<&str> = members.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(names, ["bo", "cy", "sam", "zed"]);
    let after = scan_members(store, "a", Some("cy"), 10).unwrap();
    assert_eq!(after.len(), 2);
    assert_eq!(store.load_member("a", "zed").unwrap(), 2);
    assert_eq!(store.load_member("a", "nobody").unwrap(), 0);
    assert_eq!(load_like_count(store, "a").unwrap(), (3, 2));
    assert_eq!(store.load_like_count("missing").unwrap(), 0);
    assert_eq!(store.load_uniques("a").unwrap(), Some(sketch));
    assert_eq!(store.load_uniques("ab").unwrap(), None);
    assert_eq!(like_keys_after(store, None, 10).unwrap(), ["a", "ab"]);
    // The delta log, in commit order, resumable after any record.
    let all = store.deltas_after(&DeltaCursor::default(), 10).unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(
        all.iter().map(|(c, _)| c.seq()).collect::<Vec<_>>(),
        [1, 1, 1, 2]
    );
    let rest = store.deltas_after(&all[1].0, 10).unwrap();
    assert_eq!(rest.len(), 2);
    assert!(
        store
            .deltas_after(&DeltaCursor::after_seq(1), 10)
            .unwrap()
            .len()
            == 1
    );
    assert!(matches!(
        &all[3].1,
        SetDelta::Likes { key, members } if &**key == "a" && members.len() == 1
    ));
    let uniques = all
        .iter()
        .find(|(_, d)| matches!(d, SetDelta::Uniques { .. }));
    assert!(matches!(
        uniques,
        Some((_, SetDelta::Uniques { registers: r, .. })) if *r == registers
    ));
}

fn identity() -> Identity {
    Identity {
        replica: ReplicaId(7),
        region: "eu".into(),
    }
}

#[test]
fn records_round_trip_in_the_memory_store() {
    run(&MemoryStore::new(identity()));
}

#[test]
fn records_round_trip_in_sled_and_watermarks_are_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), "eu", 7, crate::store::OnCorrupt::Refuse).unwrap();
    run(&store);
    let mut watermarks = batch(3, Vec::new(), Vec::new());
    watermarks.delta_watermarks = vec![(ReplicaId(9), DeltaCursor::after_seq(4))];
    store.write(&watermarks).unwrap();
    store.flush().unwrap();
    let recovered = store.recover(0).unwrap();
    assert_eq!(
        recovered.delta_watermarks,
        [(ReplicaId(9), DeltaCursor::after_seq(4))]
    );
}

#[test]
fn damaged_values_are_errors_never_zero() {
    assert!(decode_length(&[]).is_err());
    assert!(decode_length(&[9, 1]).is_err());
    assert!(decode_length(&[VERSION, 0x80]).is_err());
    assert!(decode_delta(b"e", &[VERSION, 0]).is_err());
    let mut key = vec![DELTA];
    key.extend_from_slice(&1u64.to_be_bytes());
    key.push(2);
    key.push(b'k');
    // A register past 16383 in a uniques delta.
    assert!(decode_delta(&key, &[VERSION, 1, 0xff, 0xff, 1]).is_err());
    assert!(decode_delta(&key, &[VERSION, 1, 0, 1, 1]).is_ok());
    key[9] = 7;
    assert!(decode_delta(&key, &[VERSION, 0]).is_err());
}
