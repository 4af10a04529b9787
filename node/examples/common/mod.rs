//! What the store examples share: the size of a data directory on disk, and
//! the real engine over a fresh sled store.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tally_node::engine::{CommitterHandle, Durability, Engine};
use tally_node::metrics::Metrics;
use tally_node::replica::version::NEWEST;
use tally_node::replica::{DurableState, ReplicaConfig};
use tally_node::store::{OnCorrupt, SledStore, Store};

/// The bytes of every file under `path`, recursively.
pub fn dir_bytes(path: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(path).unwrap().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        total += if meta.is_dir() {
            dir_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// The engine in `sync` durability over a new sled store in `dir` at the
/// newest format, with its group committer running.
#[allow(dead_code)] // not every example drives the engine
pub fn open_engine(dir: &Path) -> (Arc<SledStore>, Arc<Engine>, CommitterHandle) {
    let store = SledStore::open(dir, "eu", 1, OnCorrupt::Refuse).unwrap();
    store.raise_format(NEWEST).unwrap();
    let store = Arc::new(store);
    let engine = Engine::open(
        store.clone(),
        ReplicaConfig::default(),
        Durability::Sync,
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let committer = engine.spawn_committer(|_, _| {});
    (store, engine, committer)
}

/// Prints each file and folder directly in `dir` with its size.
#[allow(dead_code)] // not every example lists its data directory
pub fn print_entries(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let size = if path.is_dir() {
            dir_bytes(&path)
        } else {
            entry.metadata().unwrap().len()
        };
        println!("  {}: {size} bytes", path.display());
    }
}

/// Records and key + value bytes in `store`, by [`record_kind`].
#[allow(dead_code)] // not every example reads a store back
pub fn records_by_kind(store: &SledStore) -> BTreeMap<&'static str, (u64, u64)> {
    const PAGE: usize = 10_000;
    let mut by_kind: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut from = vec![0u8];
    loop {
        let page = store.scan_records(&from, &[0xff; 8], PAGE).unwrap();
        for (key, value) in &page {
            let entry = by_kind.entry(record_kind(key[0])).or_default();
            entry.0 += 1;
            entry.1 += (key.len() + value.len()) as u64;
        }
        match page.last() {
            Some((key, _)) if page.len() == PAGE => {
                from = key.clone();
                from.push(0);
            }
            _ => break,
        }
    }
    by_kind
}

/// A bare sled database in `dir`, configured as the layout examples measure
/// it (no periodic flush); exits with a message when it cannot be opened.
#[allow(dead_code)] // only the sled-alone examples
pub fn open_sled(dir: &Path) -> sled::Db {
    sled::Config::new()
        .path(dir)
        .cache_capacity(128 << 20)
        .flush_every_ms(None)
        .open()
        .unwrap_or_else(|error| {
            eprintln!("cannot open sled at {}: {error}", dir.display());
            std::process::exit(2);
        })
}

/// Closes `db`, then returns the size of `dir` after the load and after a
/// reopen and flush, and deletes `dir`.
#[allow(dead_code)] // only the sled-alone examples
pub fn sizes_then_delete(db: sled::Db, dir: &Path) -> (u64, u64) {
    drop(db);
    let loaded = dir_bytes(dir);
    open_sled(dir).flush().unwrap();
    let reopened = dir_bytes(dir);
    let _ = std::fs::remove_dir_all(dir);
    (loaded, reopened)
}

/// The kind of a store record, from its one-byte prefix.
#[allow(dead_code)] // not every example reads a store back
pub fn record_kind(prefix: u8) -> &'static str {
    match prefix {
        b's' => "member records",
        b'n' => "like counts",
        b'h' => "uniques registers",
        b'j' => "uniques register chunks",
        b'e' => "delta log",
        b'i' => "idempotency records",
        b'm' => "meta",
        _ => "other",
    }
}

/// The example's arguments, each a number.
#[allow(dead_code)] // not every example takes numbers only
pub fn numeric_args() -> Vec<u64> {
    std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are numbers"))
        .collect()
}
