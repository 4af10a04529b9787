//! Unit tests of the sled store: poisoned locks, environment failures that are
//! not damage, move-aside, and the keyed idempotency ids it keeps across restarts.

use super::*;

/// Commit 1: counter `a` with replica 5's slot at `p`.
fn one_counter_batch(p: u64) -> CommitBatch {
    CommitBatch {
        seq: 1,
        counters: vec![(
            "a".into(),
            crate::crdt::PnCounter::from_slots([(
                crate::crdt::ReplicaId(5),
                crate::crdt::Slot { p, n: 0 },
            )]),
        )],
        ..Default::default()
    }
}

#[test]
fn a_poisoned_lock_does_not_panic_later_reads_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&dir.path().join("data"), "eu", 5, OnCorrupt::Refuse).unwrap();
    std::thread::scope(|scope| {
        let poisoner = scope.spawn(|| {
            let _changes = store.changes.lock().unwrap();
            let _ordinals = store.ordinals.write().unwrap();
            panic!("a thread dies holding the store's locks");
        });
        assert!(poisoner.join().is_err());
    });
    assert!(store.changes.is_poisoned() && store.ordinals.is_poisoned());
    let batch = one_counter_batch(2);
    store.write(&batch).unwrap();
    store.flush().unwrap();
    assert_eq!(store.load_counter("a").unwrap().unwrap().seq, 1);
    assert_eq!(
        store.changes_after(&Cursor::default(), 10).unwrap().len(),
        1
    );
    store.close().unwrap();
}

/// A start that ran out of space while sled wrote a snapshot leaves an empty
/// `snap.<lsn>.generating`; sled took it for the newest snapshot and called
/// the intact store corrupt on every later start.
#[test]
fn an_unfinished_snapshot_does_not_make_an_intact_store_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = SledStore::open(&data, "eu", 5, OnCorrupt::Refuse).unwrap();
    let batch = one_counter_batch(7);
    store.write(&batch).unwrap();
    store.flush().unwrap();
    store.close().unwrap();
    drop(store);
    let unfinished = data.join("db").join("snap.FFFFFFFFFFFFFFFF.generating");
    std::fs::write(&unfinished, b"").unwrap();
    let store = crate::store::suite::reopen(&data, 5);
    let counter = store.load_counter("a").unwrap().unwrap();
    assert_eq!(counter.state.value(), Ok(7));
    assert!(!unfinished.exists());
    store.close().unwrap();
}

#[track_caller]
fn assert_environment(raw: std::io::Error, cause: &str) {
    let error = classify(Path::new("/data/tally"), sled::Error::Io(raw));
    let text = error.to_string();
    assert!(matches!(error, OpenError::Io { .. }), "{text}");
    assert!(
        text.contains(cause) && text.contains("/data/tally"),
        "{text}"
    );
    assert!(!text.contains("move-aside"), "{text}");
}

#[test]
fn failures_of_the_environment_are_not_damage() {
    use std::io::{Error, ErrorKind};
    assert_environment(
        Error::from(ErrorKind::PermissionDenied),
        "permission denied",
    );
    assert_environment(Error::from_raw_os_error(30), "read-only");
    assert_environment(Error::from_raw_os_error(28), "no space left");
    assert_environment(Error::from_raw_os_error(122), "quota");
    assert_environment(Error::from_raw_os_error(24), "too many open files");
    assert_environment(Error::from_raw_os_error(23), "too many open files");
    assert_environment(Error::from_raw_os_error(20), "is a file");
    let damage = classify(
        Path::new("/d"),
        sled::Error::Corruption { at: None, bt: () },
    );
    assert!(matches!(damage, OpenError::Corrupt { .. }), "{damage}");
}

#[test]
fn move_aside_leaves_a_store_it_may_not_use() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("data");
    std::fs::write(&file, b"x").unwrap();
    let error = SledStore::open(&file, "eu", 1, OnCorrupt::MoveAside).unwrap_err();
    assert!(matches!(error, OpenError::IsAFile(_)), "{error}");
    assert!(error.to_string().contains("is a file"), "{error}");
    assert!(file.is_file(), "the file was moved");
}

mod idempotency_id_tests {
    use super::super::*;
    use crate::replica::{legacy_idempotency_id, AddRequest, IdempotencyRecord, Replica};

    fn core_over(store: &SledStore, now_ms: u64) -> Replica {
        let recovered = store.recover(now_ms).unwrap();
        Replica::open(
            store.identity().clone(),
            Default::default(),
            recovered,
            now_ms,
        )
    }

    fn retry(key: &str) -> AddRequest<'_> {
        AddRequest {
            key: "votes",
            delta: 2,
            idempotency_key: Some(key),
        }
    }

    /// The secret key is created with the store and kept: ids are stable
    /// across restarts, and another store has another key.
    #[test]
    fn the_hash_key_is_random_per_store_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let first = SledStore::open(&path, "eu", 5, OnCorrupt::Refuse).unwrap();
        let key = first.recover(0).unwrap().idempotency_hash_key;
        drop(first);
        let again = crate::store::suite::reopen(&path, 5);
        assert_eq!(again.recover(0).unwrap().idempotency_hash_key, key);
        let other = SledStore::open(&dir.path().join("other"), "eu", 5, OnCorrupt::Refuse).unwrap();
        assert_ne!(other.recover(0).unwrap().idempotency_hash_key, key);
    }

    /// A store of a build before keyed ids (no hash key, a segment with an
    /// unkeyed id) opened by this one: the key is created, later segments
    /// are keyed, and the old record still makes its retry a duplicate.
    #[test]
    fn records_of_an_older_build_still_catch_retries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let now = 1_000_000;
        let store = SledStore::open(&path, "eu", 5, OnCorrupt::Refuse).unwrap();
        let record = IdempotencyRecord {
            id: legacy_idempotency_id("old"),
            fingerprint: crate::replica::request_fingerprint("votes", 2),
            value: 40,
            seq: 7,
            expires_at_ms: now + 60_000,
            partition: None,
        };
        let db = &store.db;
        db.remove(encoding::META_IDEMPOTENCY_HASH_KEY).unwrap();
        db.insert(encoding::META_DURABLE_SEQ, encoding::encode_u64(7))
            .unwrap();
        db.insert(
            encoding::idempotency_key(7),
            encoding::encode_idempotency(7, &[record]),
        )
        .unwrap();
        db.flush().unwrap();
        drop(store);
        let store = crate::store::suite::reopen(&path, 5);
        let mut core = core_over(&store, now);
        let first = core.handle_add(now, &store, retry("new")).unwrap();

        let recovered = store.recover(now).unwrap();
        assert_eq!(recovered.legacy_idempotency_until_ms, now + 60_000);
        let mut core = core_over(&store, now);
        let old = core.handle_add(now + 1, &store, retry("old")).unwrap();
        assert!(old.duplicate && old.value == 40, "{old:?}");
        assert!(!first.duplicate);
        // Once it has expired, the old key is a new add.
        let later = core.handle_add(now + 60_000, &store, retry("old")).unwrap();
        assert!(!later.duplicate, "{later:?}");
    }
}

/// With the commit log, `commit_then` returns once the batch is logged and
/// handed to the applier (`sled_apply.rs`): reads, scans and the change log
/// see it while sled's tree does not hold it yet, and a crash at that moment
/// loses nothing (the log's replay writes it).
#[test]
fn a_logged_batch_is_read_before_the_tree_holds_it_and_a_crash_then_loses_nothing() {
    use super::super::commit_log_tests::{batch, copy_tree, open};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path);
    store.raise_format(crate::replica::version::NEWEST).unwrap();
    store.commit(&batch(1, "a")).unwrap();
    store.flush().unwrap();

    let held = store.applier.hold();
    store.commit_then(&batch(2, "b"), &|| {}).unwrap();
    assert_eq!(store.db.get(encoding::counter_key("b")).unwrap(), None);
    assert_eq!(store.load_counter("b").unwrap().unwrap().seq, 2);
    let listed: Vec<Vec<u8>> = store
        .scan_records(&[COUNTER], &[COUNTER + 1], 10)
        .unwrap()
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(
        listed,
        [encoding::counter_key("a"), encoding::counter_key("b")]
    );
    let changed: Vec<String> = store
        .changes_after(&Cursor::default(), 10)
        .unwrap()
        .into_iter()
        .map(|change| change.key.to_string())
        .collect();
    assert_eq!(changed, ["a", "b"]);
    let crashed = dir.path().join("crashed");
    copy_tree(&path, &crashed);
    drop(held);
    store.close().unwrap();
    assert!(store.db.get(encoding::counter_key("b")).unwrap().is_some());
    drop(store);

    let reopened = open(&crashed);
    assert_eq!(reopened.recover(0).unwrap().durable_seq, 2);
    assert_eq!(reopened.load_counter("b").unwrap().unwrap().seq, 2);
}
