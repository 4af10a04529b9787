//! One test suite, run against every [`Store`]: batches read back, the change
//! log's order and cursor semantics, superseded entries, recovery, versioned
//! encodings, nothing left behind by a failed flush or by idempotency records
//! that expired while the node was down, and (for sled) identity and
//! directory checks across reopen.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::crdt::{PnCounter, ReplicaId, Slot, StateDigest};
use crate::replica::{Change, CommitBatch, Cursor, DurableState, IdempotencyRecord, Identity, Key};

use super::{MemoryStore, OnCorrupt, OpenError, SledStore, Store};

fn state(replica: u64, p: u64, n: u64) -> PnCounter {
    PnCounter::from_slots([(ReplicaId(replica), Slot { p, n })])
}

fn key(name: &str) -> Key {
    Arc::from(name)
}

fn batch(seq: u64, counters: &[(&str, PnCounter)]) -> CommitBatch {
    CommitBatch {
        seq,
        counters: counters.iter().map(|(k, s)| (key(k), s.clone())).collect(),
        digest: StateDigest(seq * 11),
        ..Default::default()
    }
}

fn keys_after(store: &impl Store, after: Cursor, limit: usize) -> Vec<(u64, String)> {
    store
        .changes_after(&after, limit)
        .unwrap()
        .into_iter()
        .map(|c| (c.seq, c.key.to_string()))
        .collect()
}

fn run_suite(store: &impl Store) {
    assert_eq!(store.load_counter("a").unwrap(), None);
    store
        .write(&batch(1, &[("b", state(1, 2, 0)), ("a", state(1, 1, 0))]))
        .unwrap();
    store.write(&batch(2, &[("c", state(1, 0, 4))])).unwrap();
    store.flush().unwrap();

    let a = store.load_counter("a").unwrap().unwrap();
    assert_eq!((a.seq, a.state), (1, state(1, 1, 0)));

    // The change log is ordered by (seq, key); a cursor is exclusive.
    assert_eq!(
        keys_after(store, Cursor::default(), 10),
        vec![(1, "a".into()), (1, "b".into()), (2, "c".into())]
    );
    assert_eq!(
        keys_after(
            store,
            Cursor {
                seq: 1,
                key: "a".into()
            },
            10
        ),
        vec![(1, "b".into()), (2, "c".into())]
    );
    assert_eq!(
        keys_after(store, Cursor::after_seq(1), 10),
        vec![(2, "c".into())]
    );
    assert_eq!(
        keys_after(store, Cursor::default(), 1),
        vec![(1, "a".into())]
    );
    assert!(keys_after(store, Cursor::after_seq(u64::MAX), 10).is_empty());

    // A later commit supersedes an entry; the superseded one is deleted later.
    let mut third = batch(3, &[("a", state(1, 9, 0))]);
    third.superseded = vec![Change {
        seq: 1,
        key: key("b"),
    }];
    third.idempotency_put = vec![IdempotencyRecord {
        id: 7,
        fingerprint: 1,
        value: 9,
        seq: 3,
        expires_at_ms: 1_000,
        partition: None,
    }];
    third.directory_put = vec![(ReplicaId(1), "eu".into())];
    third.watermarks = vec![(
        ReplicaId(2),
        Cursor {
            seq: 5,
            key: "x".into(),
        },
    )];
    store.write(&third).unwrap();
    store.flush().unwrap();
    assert_eq!(
        keys_after(store, Cursor::default(), 10),
        vec![(1, "a".into()), (2, "c".into()), (3, "a".into())]
    );
    assert_eq!(store.load_counter("a").unwrap().unwrap().seq, 3);

    let recovered = store.recover(500).unwrap();
    assert_eq!(recovered.durable_seq, 3);
    assert_eq!(recovered.digest, StateDigest(33));
    assert_eq!(recovered.directory, vec![(ReplicaId(1), "eu".to_string())]);
    assert_eq!(
        recovered.watermarks,
        vec![(
            ReplicaId(2),
            Cursor {
                seq: 5,
                key: "x".into()
            }
        )]
    );
    assert_eq!(recovered.idempotency.len(), 1);
    // Expired idempotency records are not recovered.
    assert!(store.recover(1_000).unwrap().idempotency.is_empty());

    let mut fourth = batch(4, &[]);
    fourth.idempotency_delete = vec![3];
    store.write(&fourth).unwrap();
    store.flush().unwrap();
    assert!(store.recover(0).unwrap().idempotency.is_empty());
}

/// Opens `path` again once the store dropped just before has let go of its
/// lock: sled's threads can hold it for a moment after the drop.
pub(super) fn reopen(path: &Path, fresh_id: u64) -> SledStore {
    open_unlocked(path, "eu", fresh_id, OnCorrupt::Refuse).unwrap()
}

/// [`SledStore::open`], waiting (up to 10 s) while the directory is locked
/// by a store of this process that was just dropped.
fn open_unlocked(
    path: &Path,
    region: &str,
    fresh_id: u64,
    on_corrupt: OnCorrupt,
) -> Result<SledStore, OpenError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match SledStore::open(path, region, fresh_id, on_corrupt) {
            Err(OpenError::Locked(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => return other,
        }
    }
}

/// [`reopen`] for sled itself, to see or plant raw entries.
fn open_raw(db: &Path) -> sled::Db {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match sled::Config::new().path(db).open() {
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            other => return other.unwrap(),
        }
    }
}

fn identity() -> Identity {
    Identity {
        replica: ReplicaId(5),
        region: "eu".into(),
    }
}

#[test]
fn memory_store_passes_the_suite() {
    run_suite(&MemoryStore::new(identity()));
}

#[test]
fn sled_store_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&dir.path().join("data"), "eu", 5, OnCorrupt::Refuse).unwrap();
    run_suite(&store);
}

#[test]
fn memory_store_crash_loses_only_what_was_not_flushed() {
    let store = MemoryStore::new(identity());
    store.write(&batch(1, &[("a", state(5, 1, 0))])).unwrap();
    store.flush().unwrap();
    store.write(&batch(2, &[("a", state(5, 2, 0))])).unwrap();
    assert_eq!(
        store.load_counter("a").unwrap().unwrap().seq,
        2,
        "written is visible before the flush"
    );
    store.crash();
    assert_eq!(store.load_counter("a").unwrap().unwrap().seq, 1);
    assert_eq!(
        keys_after(&store, Cursor::default(), 10),
        vec![(1, "a".into())],
        "the change log is rebuilt from what was flushed"
    );
    assert_eq!(store.recover(0).unwrap().durable_seq, 1);
}

#[test]
fn replica_numbers_survive_a_reopen_and_a_crash_forgets_unflushed_ones() {
    let two = |a: u64, b: u64| {
        PnCounter::from_slots([
            (ReplicaId(a), Slot { p: 1, n: 0 }),
            (ReplicaId(b), Slot { p: 2, n: 1 }),
        ])
    };
    let memory = MemoryStore::new(identity());
    memory.write(&batch(1, &[("a", two(5, 6))])).unwrap();
    memory.flush().unwrap();
    memory.write(&batch(2, &[("b", two(5, 7))])).unwrap();
    memory.crash();
    // Replica 7's number was lost with the batch; replica 8 takes it now.
    memory.write(&batch(2, &[("c", two(8, 6))])).unwrap();
    memory.flush().unwrap();
    assert_eq!(memory.load_counter("a").unwrap().unwrap().state, two(5, 6));
    assert_eq!(memory.load_counter("b").unwrap(), None);
    assert_eq!(memory.load_counter("c").unwrap().unwrap().state, two(8, 6));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    {
        let store = open_unlocked(&path, "eu", 5, OnCorrupt::Refuse).unwrap();
        store.write(&batch(1, &[("a", two(5, 6))])).unwrap();
        store.write(&batch(2, &[("b", two(7, 5))])).unwrap();
        store.flush().unwrap();
    }
    let store = reopen(&path, 5);
    assert_eq!(store.load_counter("a").unwrap().unwrap().state, two(5, 6));
    assert_eq!(store.load_counter("b").unwrap().unwrap().state, two(7, 5));
    store.write(&batch(3, &[("c", two(9, 7))])).unwrap();
    assert_eq!(store.load_counter("c").unwrap().unwrap().state, two(9, 7));
}

#[test]
fn sled_keeps_its_identity_and_data_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    {
        let store = open_unlocked(&path, "eu", 42, OnCorrupt::Refuse).unwrap();
        assert_eq!(store.identity().replica, ReplicaId(42));
        store.write(&batch(1, &[("a", state(42, 3, 0))])).unwrap();
        store.flush().unwrap();
    }
    let store = reopen(&path, 99);
    assert_eq!(
        store.identity().replica,
        ReplicaId(42),
        "an existing directory keeps its id"
    );
    assert_eq!(
        store.load_counter("a").unwrap().unwrap().state,
        state(42, 3, 0)
    );
    drop(store);

    std::fs::remove_dir_all(&path).unwrap();
    let wiped = open_unlocked(&path, "eu", 99, OnCorrupt::Refuse).unwrap();
    assert_eq!(
        wiped.identity().replica,
        ReplicaId(99),
        "a wiped directory gets a new id"
    );
    assert_eq!(wiped.load_counter("a").unwrap(), None);
}

#[test]
fn sled_rebuilds_the_change_log_at_open_and_removes_a_retired_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    {
        let store = open_unlocked(&path, "eu", 42, OnCorrupt::Refuse).unwrap();
        store
            .write(&batch(1, &[("b", state(42, 1, 0)), ("a", state(42, 1, 0))]))
            .unwrap();
        store.write(&batch(2, &[("a", state(42, 2, 0))])).unwrap();
        store.flush().unwrap();
    }
    {
        // What a build that kept the log in sled left behind.
        let raw = open_raw(&path.join("db"));
        raw.insert(b"l\0\0\0\0\0\0\0\x01a", &[]).unwrap();
        raw.flush().unwrap();
    }
    let store = reopen(&path, 99);
    assert_eq!(
        keys_after(&store, Cursor::default(), 10),
        vec![(1, "b".into()), (2, "a".into())],
        "each counter listed once, at the commit that last wrote it"
    );
    drop(store);
    let raw = open_raw(&path.join("db"));
    assert_eq!(raw.scan_prefix(b"l").count(), 0, "the retired log is gone");
}

#[test]
fn sled_reads_the_change_log_saved_at_a_clean_stop_only_while_it_matches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let saved = path.join("changes.snapshot");
    let store = open_unlocked(&path, "eu", 42, OnCorrupt::Refuse).unwrap();
    store.write(&batch(1, &[("a", state(42, 1, 0))])).unwrap();
    store.write(&batch(2, &[("b", state(42, 1, 0))])).unwrap();
    store.close().unwrap();
    drop(store);
    let at_stop = std::fs::read(&saved).unwrap();

    // A saved log that matches the store's durable sequence is what a reopen
    // lists (this one is doctored to tell it from a rebuild), and it is used once.
    let mut doctored = super::ChangeIndex::new();
    doctored.push_recovered(2, "b");
    std::fs::write(
        &saved,
        super::encoding::encode_change_snapshot(2, &doctored),
    )
    .unwrap();
    let store = reopen(&path, 42);
    assert_eq!(
        keys_after(&store, Cursor::default(), 10),
        vec![(2, "b".into())]
    );
    assert!(!saved.exists(), "the saved log is used once");
    store.write(&batch(3, &[("a", state(42, 2, 0))])).unwrap();
    store.flush().unwrap();
    drop(store);

    // After a stop without close (a crash), an older saved log is ignored.
    std::fs::write(&saved, &at_stop).unwrap();
    let store = reopen(&path, 42);
    assert_eq!(
        keys_after(&store, Cursor::default(), 10),
        vec![(2, "b".into()), (3, "a".into())]
    );
    drop(store);

    // So is a damaged one.
    std::fs::write(&saved, &at_stop[..at_stop.len() - 1]).unwrap();
    let store = reopen(&path, 42);
    assert_eq!(keys_after(&store, Cursor::default(), 10).len(), 2);
}

#[test]
fn sled_refuses_foreign_locked_and_other_region_directories() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    assert!(matches!(
        SledStore::open(&foreign, "eu", 1, OnCorrupt::Refuse),
        Err(OpenError::NotTally(_))
    ));

    let path = dir.path().join("data");
    let open = open_unlocked(&path, "eu", 1, OnCorrupt::Refuse).unwrap();
    drop(open);
    let err = open_unlocked(&path, "us", 1, OnCorrupt::Refuse).unwrap_err();
    assert!(err.to_string().contains("--region eu"), "{err}");
}

#[test]
fn damaged_sled_store_is_refused_or_moved_aside_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    drop(open_unlocked(&path, "eu", 1, OnCorrupt::Refuse).unwrap());
    // Overwrite sled's config file with garbage.
    std::fs::write(path.join("db").join("conf"), b"\xff\xfe garbage").unwrap();
    let err = open_unlocked(&path, "eu", 2, OnCorrupt::Refuse).unwrap_err();
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("--on-corrupt move-aside"), "{err}");
    let store = open_unlocked(&path, "eu", 2, OnCorrupt::MoveAside).unwrap();
    assert_eq!(
        store.identity().replica,
        ReplicaId(2),
        "a store moved aside starts as a new replica"
    );
    assert!(store.moved_aside.as_ref().unwrap().exists());
}

/// A core over `store`, as a (re)start builds it at `now_ms`.
fn core_over(store: &impl Store, now_ms: u64) -> crate::replica::Replica {
    let config = crate::replica::ReplicaConfig {
        idempotency_ttl_ms: 1_000,
        ..Default::default()
    };
    let recovered = store.recover(now_ms).unwrap();
    crate::replica::Replica::open(store.identity().clone(), config, recovered, now_ms)
}

fn keyed_add(core: &mut crate::replica::Replica, store: &impl Store, now_ms: u64, id: &str) {
    let request = crate::replica::AddRequest {
        key: "a",
        delta: 1,
        idempotency_key: Some(id),
    };
    core.handle_add(now_ms, store, request).unwrap();
}

/// Writes and flushes the core's next commit; returns its sequence.
fn commit(core: &mut crate::replica::Replica, store: &impl Store) -> u64 {
    let batch = core.poll_commit().expect("something to commit");
    store.write(&batch).unwrap();
    store.flush().unwrap();
    core.handle_commit_done(batch.seq);
    batch.seq
}

fn segments(store: &impl Store) -> Vec<u64> {
    let recovered = store.recover(0).unwrap();
    recovered.idempotency.iter().map(|(s, _)| *s).collect()
}

/// A commit whose write lands but whose flush fails, then its retry: the
/// failed sequence leaves no change-log entry and no idempotency segment
/// behind, even when its write reaches the disk with the retry's flush.
fn failed_flush_leaves_no_orphans(store: &impl Store) -> u64 {
    let mut core = core_over(store, 0);
    keyed_add(&mut core, store, 0, "k1");
    let failed = core.poll_commit().unwrap();
    store.write(&failed).unwrap();
    // The flush fails here (sled's ENOSPC, EIO): the runtime reports it.
    let failed_seq = failed.seq;
    drop(failed);
    core.handle_commit_failed(failed_seq);
    let retried = commit(&mut core, store);
    assert!(retried > failed_seq);
    assert_eq!(
        keys_after(store, Cursor::default(), 10),
        vec![(retried, "a".into())],
        "the failed sequence's change-log entry is superseded"
    );
    assert_eq!(
        segments(store),
        vec![retried],
        "the failed sequence's idempotency segment is deleted"
    );
    retried
}

#[test]
fn memory_store_keeps_no_orphans_of_a_failed_flush() {
    failed_flush_leaves_no_orphans(&MemoryStore::new(identity()));
}

#[test]
fn sled_store_keeps_no_orphans_of_a_failed_flush_even_in_the_saved_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_unlocked(&path, "eu", 5, OnCorrupt::Refuse).unwrap();
    let retried = failed_flush_leaves_no_orphans(&store);
    store.close().unwrap();
    drop(store);
    let store = reopen(&path, 5);
    assert_eq!(
        keys_after(&store, Cursor::default(), 10),
        vec![(retried, "a".into())],
        "the change log saved at the stop has no orphan either"
    );
    assert_eq!(segments(&store), vec![retried]);
}

/// Records that all expired while the node was down: their segment is
/// deleted by the first commit after the restart.
fn expired_segment_is_deleted_after_restart(store: &impl Store) {
    let mut before = core_over(store, 0);
    keyed_add(&mut before, store, 0, "k1");
    let written = commit(&mut before, store);
    assert_eq!(segments(store), vec![written]);
}

fn restart_after_expiry(store: &impl Store) {
    let now = 10_000;
    let mut after = core_over(store, now);
    after.tick(now);
    // Nothing else to commit: the deletion goes alone, at a tick.
    if let Some(batch) = after.poll_commit() {
        store.write(&batch).unwrap();
        store.flush().unwrap();
        after.handle_commit_done(batch.seq);
    }
    assert!(
        segments(store).is_empty(),
        "the expired segment is deleted from the store"
    );
    assert!(store.recover(now).unwrap().expired_segments.is_empty());
}

#[test]
fn memory_store_loses_expired_idempotency_segments_after_a_restart() {
    let store = MemoryStore::new(identity());
    expired_segment_is_deleted_after_restart(&store);
    restart_after_expiry(&store);
}

#[test]
fn sled_store_loses_expired_idempotency_segments_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_unlocked(&path, "eu", 5, OnCorrupt::Refuse).unwrap();
    expired_segment_is_deleted_after_restart(&store);
    drop(store);
    let store = reopen(&path, 5);
    restart_after_expiry(&store);
}
