//! Where a like's bytes on disk go: drives the real engine over a real sled
//! store (in `sync` durability, with its group committer) with likes of
//! distinct members on one post, sent in batches with an idempotency key
//! each as the coalescing client sends them, then prints the data
//! directory's size per like next to the stored records' own bytes (key +
//! value) per like, by kind of record. The difference is sled's overhead.
//!
//! `cargo run --release -p tally-node --example like_disk -- [LIKES] [BATCH] [MEMBER_BYTES] [KEY_BYTES]`
//! (defaults: 200000 likes, batches of 256, 16-byte members as `tally bench`
//! sends: 8 random bytes in hex, and a 20-byte post key as the seeds').

use tally_node::engine::LikeItem;
use tally_node::store::Store;

mod common;
use common::{dir_bytes, numeric_args, open_engine, print_entries, records_by_kind};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = numeric_args();
    let likes = args.first().copied().unwrap_or(200_000) as usize;
    let batch = args.get(1).copied().unwrap_or(256) as usize;
    let member_bytes = args.get(2).copied().unwrap_or(16) as usize;
    let post = "post:100000042:likes";
    let post = &post[post.len() - (args.get(3).copied().unwrap_or(20) as usize).min(20)..];
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("eu");
    let (store, engine, committer) = open_engine(&dir);
    let before = dir_bytes(&dir);
    let mut next = 0u64;
    let mut sent = 0;
    while sent < likes {
        let n = batch.min(likes - sent);
        let owned: Vec<(String, String)> = (0..n)
            .map(|_| {
                next += 1;
                let mixed = next.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let member = format!("{mixed:016x}{}", "0".repeat(member_bytes.max(16) - 16));
                let member = member[..member_bytes].to_string();
                (member, format!("0190a6e4-7c1e-7000-8000-{next:012}"))
            })
            .collect();
        let items: Vec<LikeItem<'_>> = owned
            .iter()
            .map(|(member, key)| LikeItem {
                key: post.as_bytes(),
                member: member.as_bytes(),
                like: true,
                idempotency_key: Some(key),
            })
            .collect();
        for result in engine.like_batch(&items).await.unwrap() {
            result.unwrap();
        }
        sent += n;
    }
    committer.shutdown().await;
    store.flush().unwrap();
    let after = dir_bytes(&dir);
    let by_kind = records_by_kind(&store);
    let likes = likes as f64;
    println!(
        "likes: {likes}, batches of {batch}, members of {member_bytes} bytes, post key {post:?}"
    );
    println!(
        "data directory: {} bytes before, {} after: {:.1} bytes per like",
        before,
        after,
        (after - before) as f64 / likes
    );
    print_entries(&dir);
    let mut logical = 0;
    for (kind, (records, bytes)) in &by_kind {
        logical += bytes;
        println!(
            "  {kind}: {records} records, {bytes} bytes of key + value, {:.1} per like",
            *bytes as f64 / likes
        );
    }
    println!(
        "records' own bytes: {:.1} per like; the rest ({:.1} per like) is sled's overhead and the files' fixed parts",
        logical as f64 / likes,
        (after - before) as f64 / likes - logical as f64 / likes
    );
    // What deleting the whole delta log gives back, at once and after as
    // many likes again (does sled reuse the space?).
    store.close().unwrap();
    drop(engine);
    drop(store);
    let db = sled::Config::new()
        .path(dir.join("db"))
        .flush_every_ms(None)
        .mode(sled::Mode::LowSpace)
        .open()
        .unwrap();
    let mut deleted = 0;
    for item in db.range(vec![b'e']..vec![b'e' + 1]) {
        let (key, _) = item.unwrap();
        db.remove(key).unwrap();
        deleted += 1;
    }
    db.flush().unwrap();
    println!(
        "after deleting the {deleted} delta-log records: db {} bytes",
        dir_bytes(&dir.join("db"))
    );
}
