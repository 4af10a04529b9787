//! What sled 0.34 makes of a counter's bytes on disk, for the layouts issue
//! 15 (goal 3, at most 100 bytes a counter) and issue 14 (like sets in
//! buckets, `deploy/CAPACITY.md`) proposed: one sled entry per counter, as
//! Tally stores them, or counters grouped by key hash into buckets of about
//! `PER_BUCKET` each, one sled value per bucket, rewritten whole (read,
//! change, write) on every change.
//!
//! The load is the footprint bench's (`deploy/bench/footprint`): every key
//! `post:1NNNNNNNN:likes` is written once by each of three regions, so each
//! counter ends with three slots; each pass visits the keys in a random
//! order, and a flush follows every 25,000 writes (about a second of a
//! node's checkpoints at the million-key rate). Records are Tally's own
//! (`tally-core`'s `storage/encoding.rs`): the key with its one-byte prefix, and the counter
//! record of format 2, 14 bytes with three slots. It prints the data
//! directory's size per counter after the load and after a reopen, the
//! bytes handed to sled per counter, and the time per write.
//!
//! `cargo run --release -p tally-node --example sled_layouts -- [COUNTERS] [PER_BUCKET]`
//! (defaults: 200000 counters, 0 = one entry per counter). Deletes its data
//! directory when done.
//!
//! sled's own zstd compression cannot be tried here: its `compression`
//! feature needs zstd-sys 1.6 while chitchat links zstd-sys 2, and cargo
//! allows one crate linking `zstd` per build.

use std::time::Instant;

use tally_node::crdt::{stable_hash, PnCounter, ReplicaId, Slot};
use tally_node::store::encoding;

mod common;
use common::{open_sled, sizes_then_delete};

const FLUSH_EVERY: u64 = 25_000;
const REGIONS: u64 = 3;

/// xorshift64: a fixed, seedable order of visits without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn shuffle(&mut self, items: &mut [u64]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// A counter record as Tally writes it (`tally-core`'s `storage/encoding.rs`, format 2): one
/// add in each of the first `regions` replicas' slots, written by commit
/// `seq`, replicas numbered by ordinals 1, 2, 3.
fn counter_record(seq: u64, regions: u64) -> Vec<u8> {
    let state = PnCounter::from_slots((1..=regions).map(|r| (ReplicaId(r), Slot { p: 1, n: 0 })));
    encoding::encode_counter(seq, &state, |replica| replica.0 as u32)
}

/// A bucket's counters, sorted by key: (key length, key, value length, value)*.
fn decode_bucket(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut entries = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let key_len = bytes[at] as usize;
        let key = bytes[at + 1..at + 1 + key_len].to_vec();
        at += 1 + key_len;
        let value_len = bytes[at] as usize;
        entries.push((key, bytes[at + 1..at + 1 + value_len].to_vec()));
        at += 1 + value_len;
    }
    entries
}

fn encode_bucket(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in entries {
        out.push(key.len() as u8);
        out.extend_from_slice(key);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let counters: u64 = args
        .first()
        .map_or(200_000, |s| s.parse().expect("COUNTERS"));
    let per_bucket: u64 = args.get(1).map_or(0, |s| s.parse().expect("PER_BUCKET"));
    // 0 buckets: one entry per counter.
    let buckets = counters.checked_div(per_bucket).map_or(0, |n| n.max(1));
    let dir = std::env::temp_dir().join(format!("tally-sled-layouts-{}", std::process::id()));
    let db = open_sled(&dir);

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let started = Instant::now();
    let (mut writes, mut handed) = (0u64, 0u64);
    for region in 1..=REGIONS {
        let mut order: Vec<u64> = (0..counters).collect();
        rng.shuffle(&mut order);
        for key in order {
            let key = format!("post:1{key:08}:likes");
            let value = counter_record(writes / 250 + 1, region);
            if buckets == 0 {
                let store_key = encoding::counter_key(&key);
                handed += (store_key.len() + value.len()) as u64;
                db.insert(store_key, value).unwrap();
            } else {
                let bucket = stable_hash(0, &[key.as_bytes()]) % buckets;
                let mut store_key = vec![b'b'];
                store_key.extend_from_slice(&(bucket as u32).to_be_bytes());
                let mut entries = db
                    .get(&store_key)
                    .unwrap()
                    .map_or_else(Vec::new, |v| decode_bucket(&v));
                match entries.binary_search_by(|(k, _)| k.as_slice().cmp(key.as_bytes())) {
                    Ok(i) => entries[i].1 = value,
                    Err(i) => entries.insert(i, (key.into_bytes(), value)),
                }
                let bucket_value = encode_bucket(&entries);
                handed += (store_key.len() + bucket_value.len()) as u64;
                db.insert(store_key, bucket_value).unwrap();
            }
            writes += 1;
            if writes % FLUSH_EVERY == 0 {
                db.flush().unwrap();
            }
        }
    }
    db.flush().unwrap();
    let elapsed = started.elapsed();
    let (loaded, reopened) = sizes_then_delete(db, &dir);

    let layout = if per_bucket == 0 {
        "one entry per counter".to_string()
    } else {
        format!("buckets of about {per_bucket} counters")
    };
    println!(
        "{counters} counters, {layout}: on disk {} B/counter after the load, {} B/counter after a reopen; \
         handed to sled {} B/counter; {:.1} µs a write ({writes} writes in {:.1} s)",
        loaded / counters,
        reopened / counters,
        handed / counters,
        elapsed.as_secs_f64() * 1e6 / writes as f64,
        elapsed.as_secs_f64(),
    );
}
