//! Tests of the data directory's format (the persisted cluster version): a
//! new directory is at this build's oldest version and writes only this
//! build's record formats; the format never goes back and never passes what
//! this build writes; a directory of a newer build is refused without being
//! called corrupt, and one older than the window is refused naming the
//! release to upgrade through; both are left untouched.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::crdt::{PnCounter, ReplicaId, Slot, StateDigest};
use crate::partition::Partition;
use crate::replica::version::{NEWEST, OLDEST, UPGRADE_THROUGH};
use crate::replica::{CommitBatch, DurableState, IdempotencyRecord};

use super::{OnCorrupt, OpenError, SledStore, Store, DEFAULT_CACHE_BYTES};

fn open(path: &Path) -> Result<SledStore, OpenError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match SledStore::open_with_cache(path, "eu", 7, OnCorrupt::MoveAside, DEFAULT_CACHE_BYTES) {
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

/// A data directory whose marker says `format`, and nothing else: what a
/// build of another window left, as far as the refusals below look.
fn directory_at(path: &Path, format: u32) {
    std::fs::create_dir_all(path).unwrap();
    std::fs::write(
        path.join(super::sled_store::MARKER_FILE),
        format!("tally data directory, format {format}\n"),
    )
    .unwrap();
}

/// The names of the files in `path`.
fn listing(path: &Path) -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = std::fs::read_dir(path)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    names.sort();
    names
}

#[test]
fn a_new_directory_is_at_the_oldest_version_and_writes_this_builds_formats() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path).unwrap();
    assert_eq!(store.format(), OLDEST);
    assert!(
        marker(&path).ends_with(&format!("format {OLDEST}\n")),
        "{}",
        marker(&path)
    );
    commit(&store, 1, "a");
    store.write(&keyed_batch(2, Some(Partition(5)))).unwrap();
    store.flush().unwrap();
    let partitions: Vec<Option<Partition>> = store
        .idempotency_segments_after(0, 10)
        .unwrap()
        .into_iter()
        .map(|(_, records)| records[0].partition)
        .collect();
    assert_eq!(
        partitions,
        [None, Some(Partition(5))],
        "partitions are kept"
    );
    store.raise_format(OLDEST - 1).unwrap();
    assert_eq!(store.format(), OLDEST, "the format never goes back");
    assert!(store.raise_format(NEWEST + 1).is_err());
    assert_eq!(store.format(), NEWEST);
    drop(store);
    // Counter records v2, idempotency segments v3: no older writer is left.
    assert_eq!(record_versions(&path), (vec![2], vec![3, 3]));
    let store = open(&path).unwrap();
    assert_eq!(store.load_counter("a").unwrap().unwrap().seq, 1);
}

#[test]
fn a_directory_of_a_newer_build_is_refused_without_calling_it_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    directory_at(&path, NEWEST + 1);
    // Even with --on-corrupt move-aside, nothing is moved.
    let error = open(&path).unwrap_err();
    assert!(
        matches!(error, OpenError::NewerFormat { found, newest, .. } if found == NEWEST + 1 && newest == NEWEST),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&format!("format {}", NEWEST + 1))
            && message.contains(&format!("up to {NEWEST}")),
        "{message}"
    );
    assert!(
        !message.contains("corrupt") && !message.contains("move-aside"),
        "{message}"
    );
    assert!(marker(&path).ends_with(&format!("format {}\n", NEWEST + 1)));
    assert_eq!(listing(&path), [super::sled_store::MARKER_FILE]);
}

#[test]
fn a_directory_older_than_the_window_is_refused_naming_the_release_to_upgrade_through() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    directory_at(&path, OLDEST - 1);
    let error = open(&path).unwrap_err();
    assert!(
        matches!(error, OpenError::OlderFormat { found, .. } if found == OLDEST - 1),
        "{error}"
    );
    let message = error.to_string();
    for words in [
        UPGRADE_THROUGH,
        "--data-dir",
        &format!("cluster version {}", OLDEST - 1),
        "tally admin finalize",
    ] {
        assert!(message.contains(words), "{words:?} in {message}");
    }
    assert!(
        !message.contains("corrupt") && !message.contains("move-aside"),
        "{message}"
    );
    // Nothing was created or moved, even with --on-corrupt move-aside.
    assert!(marker(&path).ends_with(&format!("format {}\n", OLDEST - 1)));
    assert_eq!(listing(&path), [super::sled_store::MARKER_FILE]);
    assert_eq!(listing(dir.path()), ["data"]);
}

#[test]
fn a_directory_remembers_the_version_of_the_build_that_created_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path).unwrap();
    assert_eq!(store.born_at(), NEWEST);
    drop(store);
    assert_eq!(open(&path).unwrap().born_at(), NEWEST);
}
