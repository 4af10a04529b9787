//! The retire/fold records through every [`Store`]: a counter with a folded
//! base (record v3), writer digests, retirements, fold records and the fold
//! progress written in one batch read back after a restart, and a folded
//! base kept even when the cluster version still writes format 1.

use std::sync::Arc;

use crate::crdt::{FoldRecord, FoldedBase, PnCounter, ReplicaId, Slot, WriterDigest};
use crate::replica::folds::{RetireReason, ScopedRetirement};
use crate::replica::{CommitBatch, Identity};

use super::{batch_ops, encoding, MemoryStore, OnCorrupt, Op, Ordinals, SledStore, Store};

fn folded_counter() -> PnCounter {
    PnCounter::from_parts(
        [(ReplicaId(1), Slot { p: 4, n: 1 })],
        FoldedBase {
            epoch: 2,
            p: u128::from(u64::MAX) + 3,
            n: 9,
        },
    )
}

fn digest(counters: u64) -> WriterDigest {
    WriterDigest {
        counters,
        hash: counters * 77,
    }
}

fn fold_batch() -> CommitBatch {
    CommitBatch {
        seq: 1,
        counters: vec![(Arc::from("likes"), folded_counter())],
        writer_digests: vec![(ReplicaId(1), digest(1)), (ReplicaId(8), digest(0))],
        retired: vec![
            (ReplicaId(8), RetireReason::Operator),
            (ReplicaId(9), RetireReason::Replaced { by: ReplicaId(1) }),
        ],
        fold_records: vec![
            FoldRecord::new(1, [(ReplicaId(9), digest(3))]),
            FoldRecord::new(2, [(ReplicaId(8), digest(2))]),
            // Cluster version 10: a record with digests per partition.
            FoldRecord::by_partition(
                3,
                [
                    (ReplicaId(7), vec![(0, digest(1)), (900, digest(2))]),
                    (ReplicaId(6), vec![]),
                ],
            ),
            // Cluster version 12: live writers folded in some partitions,
            // one also folded whole elsewhere, one alone (no whole writer).
            FoldRecord::by_partition(4, [(ReplicaId(5), vec![(2, digest(1))])])
                .with_scoped([(ReplicaId(1), vec![(7, digest(2)), (8, digest(0))])]),
            FoldRecord::by_partition(5, []).with_scoped([(ReplicaId(1), vec![(7, digest(3))])]),
        ],
        // Scoped retirements: one kept, one made and folded in this batch.
        scoped_retired: vec![
            (scoped(1, 7, 2), true),
            (scoped(2, 3, 0), true),
            (scoped(2, 3, 0), false),
        ],
        // Replica 8 is retired in this batch: its name is not kept.
        node_names: vec![(ReplicaId(8), "eu-3".into()), (ReplicaId(4), "eu-2".into())],
        // Replica 8 is retired in this batch: its time is not kept; 3's is
        // set, then cleared (seen up) in the same batch.
        dead_since: vec![
            (ReplicaId(8), Some(70)),
            (ReplicaId(4), Some(90)),
            (ReplicaId(3), Some(10)),
            (ReplicaId(3), None),
        ],
        fold_applied: 2,
        fold_applied_partitions: Some(vec![(4, 3), (1023, 3)]),
        fold_swept: 1,
        ..Default::default()
    }
}

fn check_fold_records(store: &impl Store) {
    let stored = store.load_counter("likes").unwrap().unwrap();
    assert_eq!(stored.state, folded_counter());
    let recovered = store.recover(0).unwrap();
    assert!(recovered.writer_digests_current);
    // An empty digest deletes the writer's entry.
    assert_eq!(recovered.writer_digests, vec![(ReplicaId(1), digest(1))]);
    assert_eq!(recovered.retired, fold_batch().retired);
    assert_eq!(recovered.fold_records, fold_batch().fold_records);
    assert_eq!((recovered.fold_applied, recovered.fold_swept), (2, 1));
    assert_eq!(recovered.fold_applied_partitions, vec![(4, 3), (1023, 3)]);
    assert_eq!(recovered.node_names, vec![(ReplicaId(4), "eu-2".into())]);
    assert_eq!(recovered.dead_since, vec![(ReplicaId(4), 90)]);
    assert_eq!(recovered.scoped_retired, vec![scoped(1, 7, 2)]);
}

fn scoped(writer: u64, partition: u32, phase: u32) -> ScopedRetirement {
    ScopedRetirement {
        writer: ReplicaId(writer),
        partition,
        phase,
    }
}

/// A later retirement deletes the replica's node name and dead-since time.
fn retire_named(store: &impl Store) {
    store
        .write(&CommitBatch {
            seq: 2,
            retired: vec![(ReplicaId(4), RetireReason::Operator)],
            ..Default::default()
        })
        .unwrap();
    store.flush().unwrap();
    let recovered = store.recover(0).unwrap();
    assert!(recovered.node_names.is_empty());
    assert!(recovered.dead_since.is_empty());
    // A scoped retirement is deleted once folded.
    store
        .write(&CommitBatch {
            seq: 3,
            scoped_retired: vec![(scoped(1, 7, 2), false)],
            ..Default::default()
        })
        .unwrap();
    store.flush().unwrap();
    assert!(store.recover(0).unwrap().scoped_retired.is_empty());
}

fn identity() -> Identity {
    Identity {
        replica: ReplicaId(5),
        region: "eu".into(),
    }
}

#[test]
fn memory_store_keeps_fold_records() {
    let store = MemoryStore::new(identity());
    store.write(&fold_batch()).unwrap();
    store.flush().unwrap();
    check_fold_records(&store);
    store.crash();
    check_fold_records(&store);
    retire_named(&store);
}

#[test]
fn sled_store_keeps_fold_records_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = SledStore::open(&path, "eu", 5, OnCorrupt::Refuse).unwrap();
    store.write(&fold_batch()).unwrap();
    store.flush().unwrap();
    check_fold_records(&store);
    store.close().unwrap();
    drop(store);
    let store = crate::store::suite::reopen(&path, 5);
    check_fold_records(&store);
    retire_named(&store);
}

#[test]
fn a_counter_is_written_with_its_folded_base_only_when_it_has_one() {
    let batch = fold_batch();
    let mut ordinals = Ordinals::new();
    let new = ordinals.plan(&batch);
    ordinals.extend(&new);
    let record_of = |ops: &[Op], key: &str| -> Vec<u8> {
        ops.iter()
            .find_map(|op| match op {
                Op::Put(put, value) if *put == encoding::counter_key(key) => Some(value.clone()),
                _ => None,
            })
            .unwrap()
    };
    let record = record_of(&batch_ops(&batch, &ordinals, &[]), "likes");
    assert_eq!(record[0], encoding::COUNTER_FOLDED_VERSION);
    let decoded = encoding::decode_counter(&record, |o| ordinals.replica(o)).unwrap();
    assert_eq!(decoded.state, folded_counter());
    // A counter without a base is written in the format without one.
    let plain = CommitBatch {
        counters: vec![(
            Arc::from("views"),
            PnCounter::from_slots([(ReplicaId(1), Slot { p: 1, n: 0 })]),
        )],
        ..Default::default()
    };
    let new = ordinals.plan(&plain);
    let record = record_of(&batch_ops(&plain, &ordinals, &new), "views");
    assert_eq!(record[0], encoding::COUNTER_VERSION);
}

#[test]
fn a_damaged_fold_value_is_corrupt_never_zero() {
    assert!(encoding::decode_writer_digest(&[1, 3]).is_err());
    assert!(encoding::decode_retired(&[1, 7, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    let key = encoding::fold_key(1);
    assert!(encoding::decode_fold_record(&key, &[1, 5]).is_err());
    // A record by partition cut short, or whose whole digest is not the
    // sum of its partitions'.
    let by_partition = FoldRecord::by_partition(1, [(ReplicaId(7), vec![(3, digest(2))])]);
    let mut value = encoding::encode_fold_record(&by_partition);
    assert_eq!(encoding::decode_fold_record(&key, &value), Ok(by_partition));
    value.pop();
    assert!(encoding::decode_fold_record(&key, &value).is_err());
    let mut forged = FoldRecord::new(1, [(ReplicaId(7), digest(5))]);
    forged.by_partition = Some(vec![(ReplicaId(7), vec![(3, digest(2))])]);
    assert!(encoding::decode_fold_record(&key, &encoding::encode_fold_record(&forged)).is_err());
    assert!(encoding::decode_applied_partitions(&[1, 2, 0]).is_err());
    // A record with scoped writers cut short, or naming a scoped writer
    // folded in no partition, or a count of none.
    let with_scoped =
        FoldRecord::by_partition(1, []).with_scoped([(ReplicaId(7), vec![(3, digest(2))])]);
    let mut value = encoding::encode_fold_record(&with_scoped);
    assert_eq!(encoding::decode_fold_record(&key, &value), Ok(with_scoped));
    value.pop();
    assert!(encoding::decode_fold_record(&key, &value).is_err());
    let mut bare = vec![1, 0, 1];
    bare.extend_from_slice(&7u64.to_le_bytes());
    bare.push(0);
    assert!(encoding::decode_fold_record(&key, &bare).is_err());
    assert!(encoding::decode_fold_record(&key, &[1, 0, 0]).is_err());
    let retired_key = encoding::scoped_retired_key(&scoped(1, 7, 2));
    assert_eq!(
        encoding::decode_scoped_retired(&retired_key, &[1]),
        Ok(scoped(1, 7, 2))
    );
    assert!(encoding::decode_scoped_retired(&retired_key, &[1, 0]).is_err());
    assert!(encoding::decode_scoped_retired(&retired_key[..16], &[1]).is_err());
    let mut record = encoding::encode_counter(3, &folded_counter(), |_| 0);
    record.pop();
    assert!(encoding::decode_counter(&record, |_| Some(ReplicaId(1))).is_err());
}
