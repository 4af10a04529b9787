//! Tests of the sled store with its commit log (every directory has one): commits
//! go through the log, a copy of the directory taken between checkpoints
//! (what a crash leaves) opens with every commit, replay skips what sled
//! already holds, and a flush starts the log over.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::crdt::{PnCounter, ReplicaId, Slot, StateDigest};
use crate::replica::{CommitBatch, DurableState};

use super::commit_log::{self, COMMIT_LOG_FILE};
use super::encoding::{counter_key, encode_u64, META_DURABLE_SEQ};
use super::{OnCorrupt, Op, SledStore, Store, DEFAULT_CACHE_BYTES};

pub(super) fn open(path: &Path) -> SledStore {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match SledStore::open_with_cache(path, "eu", 7, OnCorrupt::Refuse, DEFAULT_CACHE_BYTES) {
            Err(super::OpenError::Locked(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => return other.unwrap(),
        }
    }
}

pub(super) fn batch(seq: u64, key: &str) -> CommitBatch {
    CommitBatch {
        seq,
        counters: vec![(
            Arc::from(key),
            PnCounter::from_slots([(ReplicaId(7), Slot { p: seq, n: 0 })]),
        )],
        digest: StateDigest(seq),
        ..Default::default()
    }
}

/// Copies a directory tree as it is on disk now (sled's lock is not a file).
pub(super) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A bare sled tree whose durable sequence is `seq` (the directory goes
/// with it).
fn sled_at_seq(seq: u64) -> (tempfile::TempDir, sled::Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(dir.path().join("db"))
        .temporary(true)
        .open()
        .unwrap();
    db.insert(META_DURABLE_SEQ, encode_u64(seq)).unwrap();
    (dir, db)
}

#[test]
fn a_crash_between_checkpoints_loses_no_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path);
    assert!(
        path.join(COMMIT_LOG_FILE).exists(),
        "created with the directory"
    );
    store.commit(&batch(1, "a")).unwrap();
    store.flush().unwrap();
    // These commits are durable in the log only (no checkpoint is due
    // within a second of the flush, and the log is far from full).
    for seq in 2..=40 {
        store.commit(&batch(seq, &format!("k{}", seq % 7))).unwrap();
    }
    let crashed = dir.path().join("crashed");
    copy_tree(&path, &crashed);
    drop(store);

    // The copy has every commit, newest state of each key.
    let reopened = open(&crashed);
    assert_eq!(reopened.recover(0).unwrap().durable_seq, 40);
    assert_eq!(reopened.load_counter("a").unwrap().unwrap().seq, 1);
    for key in 0..7u64 {
        let last = (2..=40).filter(|seq| seq % 7 == key).max().unwrap();
        let counter = reopened.load_counter(&format!("k{key}")).unwrap().unwrap();
        assert_eq!(counter.seq, last, "k{key}");
        assert_eq!(counter.state.value().unwrap(), last as i64);
    }
    // And it goes on committing after the replay.
    reopened.commit(&batch(41, "a")).unwrap();
    drop(reopened);
    let again = open(&crashed);
    assert_eq!(again.load_counter("a").unwrap().unwrap().seq, 41);
}

#[test]
fn replay_applies_only_what_sled_does_not_hold_yet() {
    let (_dir, db) = sled_at_seq(5);
    let logged = |seq: u64, value: &[u8]| {
        commit_log::LoggedBatch::new(
            seq,
            vec![
                Op::Put(counter_key("k"), value.to_vec()),
                Op::Put(META_DURABLE_SEQ.to_vec(), encode_u64(seq)),
            ],
        )
    };
    db.insert(counter_key("k"), b"at-5".to_vec()).unwrap();
    // Seq 4 is older than what sled holds: replaying it would roll k back.
    let applied = commit_log::replay(&db, &[logged(4, b"at-4"), logged(6, b"at-6")]).unwrap();
    assert!(applied);
    assert_eq!(&*db.get(counter_key("k")).unwrap().unwrap(), b"at-6");
    assert!(!commit_log::replay(&db, &[logged(6, b"at-6")]).unwrap());
}

#[test]
fn a_flush_starts_the_log_over_and_a_clean_stop_replays_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path);
    for seq in 1..=3 {
        store.commit(&batch(seq, "a")).unwrap();
    }
    store.close().unwrap();
    drop(store);
    let (log, logged) = commit_log::open_existing(&path).unwrap().unwrap();
    drop(log);
    // The records are still there (the log is reused in place), but sled
    // holds them all: nothing to replay.
    assert_eq!(logged.last().map(|batch| batch.seq), Some(3));
    let store = open(&path);
    assert_eq!(store.recover(0).unwrap().durable_seq, 3);
    assert_eq!(store.load_counter("a").unwrap().unwrap().seq, 3);
}

#[test]
fn a_commit_says_durable_once_its_log_record_is_written_and_before_sled_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path);
    store.commit(&batch(1, "a")).unwrap();
    store.flush().unwrap();
    let crashed = dir.path().join("crashed");
    let told = std::cell::Cell::new(0);
    store
        .commit_then(&batch(2, "b"), &|| {
            told.set(told.get() + 1);
            // The engine answers adds from here: sled's tree has not taken
            // the batch yet, and the files on disk already hold it.
            assert_eq!(store.get_record(&counter_key("b")).unwrap(), None);
            copy_tree(&path, &crashed);
        })
        .unwrap();
    assert_eq!(told.get(), 1, "told exactly once");
    assert!(store.get_record(&counter_key("b")).unwrap().is_some());
    drop(store);
    let reopened = open(&crashed);
    assert_eq!(reopened.recover(0).unwrap().durable_seq, 2);
    assert_eq!(reopened.load_counter("b").unwrap().unwrap().seq, 2);
}

#[test]
fn a_batch_written_key_by_key_holds_its_sequence_last() {
    let ordinals = super::Ordinals::new();
    let batch = batch(9, "a");
    let new = ordinals.plan(&batch);
    let ops = super::batch_ops(&batch, &ordinals, &new);
    assert!(ops.len() > 2);
    match ops.last() {
        Some(Op::Put(key, value)) => {
            assert_eq!(key.as_slice(), META_DURABLE_SEQ);
            assert_eq!(value.as_slice(), encode_u64(9).as_slice());
        }
        other => panic!("the last operation is {other:?}"),
    }
}

#[test]
fn a_batch_that_reached_sled_without_its_sequence_is_replayed_whole() {
    // sled recovers a prefix of its own log: after a crash it may hold the
    // first writes of a batch written key by key, not its sequence.
    let (_dir, db) = sled_at_seq(1);
    let ops = vec![
        Op::Put(counter_key("a"), b"at-2".to_vec()),
        Op::Delete(counter_key("gone")),
        Op::Put(counter_key("b"), b"at-2".to_vec()),
        Op::Put(META_DURABLE_SEQ.to_vec(), encode_u64(2)),
    ];
    db.insert(counter_key("gone"), b"at-1".to_vec()).unwrap();
    db.insert(counter_key("a"), b"at-2".to_vec()).unwrap();
    let logged = commit_log::LoggedBatch::new(2, ops);
    assert!(commit_log::replay(&db, &[logged]).unwrap());
    assert_eq!(&*db.get(counter_key("b")).unwrap().unwrap(), b"at-2");
    assert_eq!(db.get(counter_key("gone")).unwrap(), None);
    assert_eq!(
        &*db.get(META_DURABLE_SEQ).unwrap().unwrap(),
        encode_u64(2).as_slice()
    );
}
