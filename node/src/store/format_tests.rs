//! Tests of the data directory's format (the persisted cluster version): a
//! new directory writes format 1, a raised one format 2 and says so in its
//! marker first, idempotency records keep their partitions from version 8,
//! and a build that writes only older formats refuses it without calling it
//! corrupt.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::crdt::{PnCounter, ReplicaId, Slot, StateDigest};
use crate::partition::Partition;
use crate::replica::version::{NEWEST, OLDEST};
use crate::replica::{CommitBatch, DurableState, IdempotencyRecord};

use super::{OnCorrupt, OpenError, SledStore, Store, DEFAULT_CACHE_BYTES};

fn open(path: &Path, newest: u32) -> Result<SledStore, OpenError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match SledStore::open_versioned(
            path,
            "eu",
            7,
            OnCorrupt::MoveAside,
            DEFAULT_CACHE_BYTES,
            newest,
        ) {
            Err(OpenError::Locked(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => return other,
        }
    }
}

/// Commit `seq`'s batch, with one idempotency record (of `partition`).
fn keyed_batch(seq: u64, partition: Option<Partition>) -> CommitBatch {
    CommitBatch {
        seq,
        idempotency_put: vec![IdempotencyRecord {
            id: u128::from(seq),
            fingerprint: 1,
            value: 1,
            seq,
            expires_at_ms: u64::MAX,
            partition,
        }],
        digest: StateDigest(seq),
        ..Default::default()
    }
}

fn commit(store: &SledStore, seq: u64, key: &str) {
    let batch = CommitBatch {
        counters: vec![(
            Arc::from(key),
            PnCounter::from_slots([(ReplicaId(7), Slot { p: seq, n: 0 })]),
        )],
        ..keyed_batch(seq, None)
    };
    store.write(&batch).unwrap();
    store.flush().unwrap();
}

/// The version byte of each counter record and idempotency segment.
fn record_versions(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let db = loop {
        match sled::Config::new().path(path.join("db")).open() {
            Ok(db) => break db,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => panic!("{error}"),
        }
    };
    let first_bytes = |prefix: u8| {
        db.scan_prefix([prefix])
            .map(|item| item.unwrap().1[0])
            .collect::<Vec<u8>>()
    };
    (
        first_bytes(super::encoding::COUNTER),
        first_bytes(super::encoding::IDEMPOTENCY),
    )
}

fn marker(path: &Path) -> String {
    std::fs::read_to_string(path.join(super::sled_store::MARKER_FILE)).unwrap()
}

#[test]
fn a_new_directory_writes_format_1_until_the_format_is_raised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path, NEWEST).unwrap();
    assert_eq!(store.format(), OLDEST);
    assert!(marker(&path).ends_with("format 1\n"), "{}", marker(&path));
    commit(&store, 1, "a");
    store.raise_format(2).unwrap();
    assert!(marker(&path).ends_with("format 2\n"), "persisted first");
    commit(&store, 2, "b");
    drop(store);
    assert_eq!(record_versions(&path), (vec![1, 2], vec![1, 2]));

    let store = open(&path, NEWEST).unwrap();
    assert_eq!(store.format(), 2, "the raised format survives a restart");
    assert_eq!(store.load_counter("a").unwrap().unwrap().seq, 1);
    assert_eq!(store.load_counter("b").unwrap().unwrap().seq, 2);
    store.raise_format(1).unwrap();
    assert_eq!(store.format(), 2, "the format never goes back");
}

#[test]
fn record_partitions_are_written_from_version_8_on() {
    use crate::replica::version::RECORD_PARTITIONS;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path, NEWEST).unwrap();
    store.raise_format(RECORD_PARTITIONS - 1).unwrap();
    store.write(&keyed_batch(1, Some(Partition(5)))).unwrap();
    store.raise_format(RECORD_PARTITIONS).unwrap();
    store.write(&keyed_batch(2, Some(Partition(5)))).unwrap();
    store.flush().unwrap();
    let partitions: Vec<(u64, Option<Partition>)> = store
        .idempotency_segments_after(0, 10)
        .unwrap()
        .into_iter()
        .map(|(seq, records)| (seq, records[0].partition))
        .collect();
    assert_eq!(
        partitions,
        [(1, None), (2, Some(Partition(5)))],
        "before version 8 a segment is written in format 2, which has no partitions"
    );
    drop(store);
    assert_eq!(record_versions(&path).1, [2, 3]);
}

#[test]
fn a_build_that_writes_only_older_formats_refuses_the_directory_without_calling_it_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path, NEWEST).unwrap();
    store.raise_format(2).unwrap();
    drop(store);
    // Even with --on-corrupt move-aside, nothing is moved.
    let error = open(&path, 1).unwrap_err();
    assert!(
        matches!(
            error,
            OpenError::NewerFormat {
                found: 2,
                newest: 1,
                ..
            }
        ),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("format 2") && message.contains("up to 1"),
        "{message}"
    );
    assert!(
        !message.contains("corrupt") && !message.contains("move-aside"),
        "{message}"
    );
    assert!(marker(&path).ends_with("format 2\n"));
    // A build posing as version 1 cannot be asked to write format 2 either.
    let old = open(&dir.path().join("old"), 1).unwrap();
    assert!(old.raise_format(2).is_err());
    assert_eq!(old.format(), 1);
}

#[test]
fn a_directory_remembers_the_version_of_the_build_that_created_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path, OLDEST).unwrap();
    assert_eq!(store.born_at(), OLDEST);
    drop(store);
    // Opened (and raised) by a newer build, it stays born at the old one:
    // its cluster once ran that build, so a rollback must still be possible.
    let store = open(&path, NEWEST).unwrap();
    assert_eq!(store.born_at(), OLDEST);
    store.raise_format(NEWEST).unwrap();
    drop(store);
    assert_eq!(open(&path, NEWEST).unwrap().born_at(), OLDEST);

    let fresh = tempfile::tempdir().unwrap();
    let store = open(&fresh.path().join("data"), NEWEST).unwrap();
    assert_eq!(store.born_at(), NEWEST);
}
