//! The applier against a real sled tree: reads and scans see a batch the
//! tree does not hold yet, a batch waits for the one before it, a drain
//! waits for the tree, and a failed write is reported by everything after.

use std::sync::mpsc;
use std::time::Duration;

use super::*;

fn put(key: &str, value: &str) -> Op {
    Op::Put(key.as_bytes().to_vec(), value.as_bytes().to_vec())
}

fn delete(key: &str) -> Op {
    Op::Delete(key.as_bytes().to_vec())
}

fn tree() -> (tempfile::TempDir, sled::Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::Config::new()
        .path(dir.path().join("db"))
        .open()
        .unwrap();
    (dir, db)
}

fn in_tree(db: &sled::Db, key: &str) -> Option<String> {
    db.get(key.as_bytes())
        .unwrap()
        .map(|value| String::from_utf8(value.to_vec()).unwrap())
}

fn read(applier: &Applier, db: &sled::Db, key: &str) -> Option<String> {
    match applier.read(key.as_bytes()) {
        Some(pending) => pending.map(|value| String::from_utf8(value).unwrap()),
        None => in_tree(db, key),
    }
}

fn scan(applier: &Applier, db: &sled::Db, from: &str, to: &str, limit: usize) -> Vec<String> {
    applier
        .merge_scan(from.as_bytes(), to.as_bytes(), limit, |limit| {
            Ok(db
                .range(from.as_bytes()..to.as_bytes())
                .take(limit)
                .map(|item| {
                    let (key, value) = item.unwrap();
                    (key.to_vec(), value.to_vec())
                })
                .collect())
        })
        .unwrap()
        .into_iter()
        .map(|(key, value)| {
            format!(
                "{}={}",
                String::from_utf8(key).unwrap(),
                String::from_utf8(value).unwrap()
            )
        })
        .collect()
}

#[test]
fn a_batch_is_read_from_the_overlay_until_the_tree_holds_it() {
    let (_dir, db) = tree();
    db.insert("b", "old").unwrap();
    let applier = Applier::start(db.clone()).unwrap();
    let held = applier.hold();
    applier
        .hand_over(vec![put("a", "1"), delete("b"), put("seq", "1")])
        .unwrap();
    assert_eq!(in_tree(&db, "a"), None, "the tree does not hold it yet");
    assert_eq!(in_tree(&db, "b").as_deref(), Some("old"));
    assert_eq!(read(&applier, &db, "a").as_deref(), Some("1"));
    assert_eq!(
        read(&applier, &db, "b"),
        None,
        "a pending deletion hides the tree's value"
    );
    assert_eq!(read(&applier, &db, "c"), None);
    drop(held);
    applier.drain().unwrap();
    assert_eq!(in_tree(&db, "a").as_deref(), Some("1"));
    assert_eq!(in_tree(&db, "b"), None);
    assert_eq!(in_tree(&db, "seq").as_deref(), Some("1"));
    assert_eq!(
        applier.read(b"a"),
        None,
        "the overlay is empty once the tree holds the batch"
    );
    assert_eq!(applier.read(b"b"), None);
}

#[test]
fn a_scan_merges_pending_puts_and_deletions_and_still_returns_a_full_page() {
    let (_dir, db) = tree();
    for key in ["k1", "k2", "k3", "k4", "k5"] {
        db.insert(key, "tree").unwrap();
    }
    db.insert("z", "outside").unwrap();
    let applier = Applier::start(db.clone()).unwrap();
    let held = applier.hold();
    applier
        .hand_over(vec![
            delete("k1"),
            delete("k2"),
            put("k0", "new"),
            put("k4", "new"),
            put("k9", "new"),
            put("y", "outside"),
        ])
        .unwrap();
    // Two deletions at the front: a page of three must still be three.
    assert_eq!(
        scan(&applier, &db, "k", "l", 3),
        ["k0=new", "k3=tree", "k4=new"]
    );
    assert_eq!(
        scan(&applier, &db, "k1", "k9", 3),
        ["k3=tree", "k4=new", "k5=tree"]
    );
    assert_eq!(
        scan(&applier, &db, "k", "l", 10),
        ["k0=new", "k3=tree", "k4=new", "k5=tree", "k9=new"]
    );
    assert_eq!(scan(&applier, &db, "k2", "k4", 10), ["k3=tree"]);
    drop(held);
    applier.drain().unwrap();
    assert_eq!(
        scan(&applier, &db, "k", "l", 10),
        ["k0=new", "k3=tree", "k4=new", "k5=tree", "k9=new"],
        "the same once the tree holds it"
    );
}

#[test]
fn a_batch_is_handed_over_only_once_the_one_before_is_in_the_tree() {
    let (_dir, db) = tree();
    let applier = std::sync::Arc::new(Applier::start(db.clone()).unwrap());
    let held = applier.hold();
    applier.hand_over(vec![put("a", "1")]).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let second = {
        let applier = applier.clone();
        std::thread::spawn(move || {
            applier.hand_over(vec![put("a", "2")]).unwrap();
            done_tx.send(()).unwrap();
        })
    };
    // However long it waits, the second batch is not taken while the first
    // is out of the tree.
    assert!(done_rx.recv_timeout(Duration::from_millis(100)).is_err());
    assert_eq!(read(&applier, &db, "a").as_deref(), Some("1"));
    drop(held);
    done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    second.join().unwrap();
    applier.drain().unwrap();
    assert_eq!(in_tree(&db, "a").as_deref(), Some("2"));
    assert_eq!(applier.read(b"a"), None);
}

#[test]
fn after_a_failed_write_every_hand_over_and_drain_says_so_and_reads_stay_right() {
    let (_dir, db) = tree();
    let applier = Applier::start(db.clone()).unwrap();
    let held = applier.hold();
    applier.hand_over(vec![put("a", "1")]).unwrap();
    applier.fail("disk full");
    drop(held);
    let error = applier.drain().unwrap_err().0;
    assert!(
        error.contains("disk full") && error.contains("commit log"),
        "{error}"
    );
    let error = applier.hand_over(vec![put("b", "2")]).unwrap_err().0;
    assert!(error.contains("disk full"), "{error}");
    assert_eq!(
        in_tree(&db, "a"),
        None,
        "nothing is written after the failure"
    );
    assert_eq!(
        read(&applier, &db, "a").as_deref(),
        Some("1"),
        "the overlay keeps what the tree lacks"
    );
    assert_eq!(
        applier.read(b"b"),
        None,
        "a refused batch is not handed over"
    );
}

#[test]
fn dropping_the_applier_writes_the_batch_it_holds_and_releases_the_tree() {
    let (dir, db) = tree();
    let applier = Applier::start(db.clone()).unwrap();
    applier.hand_over(vec![put("a", "1")]).unwrap();
    drop(applier);
    assert_eq!(in_tree(&db, "a").as_deref(), Some("1"));
    drop(db);
    // sled's lock on the directory is gone with the thread's handle.
    let reopened = sled::Config::new().path(dir.path().join("db")).open();
    assert!(reopened.is_ok());
}
