//! What a uniques key ("seen by" counts) costs on disk once its registers
//! are dense (issue 14 expects about 12 KB: 16,384 registers of 6 bits).
//! Drives the real engine over a real sled store (`sync` durability, its
//! group committer) with observes of distinct members on `KEYS` keys, in
//! calls of `BATCH` members, visiting the keys in turn so that each commit
//! touches several; then prints the data directory's growth per key next to
//! the stored records' own bytes per key, by kind of record.
//!
//! `cargo run --release -p tally-node --example uniques_disk -- [KEYS] [MEMBERS_PER_KEY] [BATCH]`
//! (defaults: 200 keys, 20000 members each, calls of 256). 20,000 distinct
//! members make a key dense (it turns dense past about 3,000).

use tally_node::store::{OnCorrupt, SledStore, Store};

mod common;
use common::{dir_bytes, numeric_args, open_engine, print_entries, records_by_kind};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = numeric_args();
    let keys = args.first().copied().unwrap_or(200).max(1);
    let per_key = args.get(1).copied().unwrap_or(20_000);
    let batch = args.get(2).copied().unwrap_or(256).max(1);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("eu");
    let (store, engine, committer) = open_engine(&dir);
    let before = dir_bytes(&dir);

    let mut next = 0u64;
    for round in 0..per_key.div_ceil(batch) {
        let n = batch.min(per_key - round * batch);
        for key in 0..keys {
            let members: Vec<String> = (0..n)
                .map(|_| {
                    next += 1;
                    format!("{:016x}", next.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                })
                .collect();
            let members: Vec<&[u8]> = members.iter().map(|m| m.as_bytes()).collect();
            let key = format!("video:{key:09}:seen");
            engine.observe(key.as_bytes(), &members).await.unwrap();
        }
    }
    let estimate = engine
        .distinct(&["video:000000000:seen".as_bytes()])
        .unwrap()
        .estimate();
    committer.shutdown().await;
    store.flush().unwrap();
    let after = dir_bytes(&dir);

    let by_kind = records_by_kind(&store);
    println!(
        "{keys} uniques keys, {per_key} distinct 16-byte members each in calls of {batch} \
         (the first key estimates {estimate:.0})"
    );
    println!(
        "data directory: {before} bytes before, {after} after: {:.0} bytes per key",
        (after - before) as f64 / keys as f64
    );
    print_entries(&dir);
    for (kind, (records, bytes)) in &by_kind {
        println!(
            "  {kind}: {records} records, {bytes} bytes of key + value, {:.0} per key",
            *bytes as f64 / keys as f64
        );
    }
    // Does sled give the rewritten registers' space back on a reopen?
    store.close().unwrap();
    drop(engine);
    drop(store);
    let reopened = SledStore::open(&dir, "eu", 1, OnCorrupt::Refuse).unwrap();
    reopened.flush().unwrap();
    drop(reopened);
    println!(
        "after a reopen: {:.0} bytes per key",
        (dir_bytes(&dir) - before) as f64 / keys as f64
    );
    print_entries(&dir);
}
