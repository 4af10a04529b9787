//! What sled 0.34 makes of a like set's members on disk, for issue 14's goal
//! of at most 40 bytes per (post, member) with 8-byte members, by layout
//! (`deploy/CAPACITY.md`, "Like sets on disk", asked for this before a
//! format change):
//!
//! - `entry`: one sled entry per member, as Tally stores them
//!   (`store::sets::member_key` → version byte + causal length);
//! - `bucket:N`: members grouped by hash into buckets of about N, one sled
//!   value per bucket of sorted (member, length), each bucket a commit
//!   touches rewritten whole once per commit;
//! - `runs:F`: a log-structured merge on sled: each commit writes its own
//!   members as one sorted run, cut in pages of at most 4 KiB, and F runs of
//!   one size merge into one of the next (old pages deleted), so a member
//!   is rewritten about log_F(likes / commit) times.
//!
//! The load: likes of distinct random 8-byte members on one post, in
//! commits of `BATCH` (the coalescing client's batches), a flush every
//! `FLUSH_EVERY` likes (about the node's checkpoint interval at 50,000
//! likes/s). Only the member records are written (no idempotency records,
//! no delta log), so the figure is what the members alone cost on sled. It
//! prints the data directory's size per like after the load and after a
//! reopen, the bytes handed to sled per like, and the time per like.
//!
//! `cargo run --release -p tally-node --example like_layouts -- [LIKES] [LAYOUT] [BATCH]`
//! (defaults: 200000 likes, `entry`, 256). Deletes its data directory.

use std::time::Instant;

use tally_node::crdt::stable_hash;
use tally_node::store::sets::member_key;

mod common;
use common::{open_sled, sizes_then_delete};

const FLUSH_EVERY: u64 = 50_000;
const POST: &str = "post:100000042:likes";
const PAGE_BYTES: usize = 4096;
/// The set's short id in bucket and run keys (a hash of its key).
const SET_ID: u64 = 0x0005_e71d;

enum Layout {
    Entry,
    Bucket(u64),
    Runs(usize),
}

/// A sorted run of (member, causal length), encoded as (length byte,
/// member, length byte)*: 10 bytes per 8-byte member.
fn encode(entries: &[(Vec<u8>, u8)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 10);
    for (member, length) in entries {
        out.push(member.len() as u8);
        out.extend_from_slice(member);
        out.push(*length);
    }
    out
}

fn decode(bytes: &[u8]) -> Vec<(Vec<u8>, u8)> {
    let mut entries = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = bytes[at] as usize;
        entries.push((bytes[at + 1..at + 1 + len].to_vec(), bytes[at + 1 + len]));
        at += 2 + len;
    }
    entries
}

fn keyed(tag: u8, parts: &[u64]) -> Vec<u8> {
    let mut key = vec![tag];
    key.extend_from_slice(&SET_ID.to_be_bytes());
    for part in parts {
        key.extend_from_slice(&part.to_be_bytes());
    }
    key
}

/// The log-structured layout: runs by level, each a list of page keys.
struct Runs {
    fanout: usize,
    levels: Vec<Vec<(u64, usize)>>, // (run id, pages)
    next_run: u64,
}

impl Runs {
    /// Writes one sorted run in pages; its (run id, pages).
    fn write_run(
        &mut self,
        db: &sled::Db,
        entries: &[(Vec<u8>, u8)],
        handed: &mut u64,
    ) -> (u64, usize) {
        let run = self.next_run;
        self.next_run += 1;
        let chunks = entries.chunks(PAGE_BYTES / 10);
        let pages = chunks.len();
        for (page, chunk) in chunks.enumerate() {
            let key = keyed(b'R', &[run, page as u64]);
            let value = encode(chunk);
            *handed += (key.len() + value.len()) as u64;
            db.insert(key, value).unwrap();
        }
        (run, pages)
    }

    /// One commit's members as a new run, then the merges it completes.
    fn commit(&mut self, db: &sled::Db, mut entries: Vec<(Vec<u8>, u8)>, handed: &mut u64) {
        entries.sort();
        let written = self.write_run(db, &entries, handed);
        self.push(0, written);
        let mut level = 0;
        while level < self.levels.len() && self.levels[level].len() >= self.fanout {
            let mut merged: Vec<(Vec<u8>, u8)> = Vec::new();
            for (run, pages) in std::mem::take(&mut self.levels[level]) {
                for page in 0..pages {
                    let key = keyed(b'R', &[run, page as u64]);
                    merged.extend(decode(&db.remove(key).unwrap().unwrap()));
                }
            }
            // Distinct members here; a real merge keeps each member's max length.
            merged.sort();
            let written = self.write_run(db, &merged, handed);
            self.push(level + 1, written);
            level += 1;
        }
    }

    fn push(&mut self, level: usize, run: (u64, usize)) {
        if self.levels.len() <= level {
            self.levels.resize_with(level + 1, Vec::new);
        }
        self.levels[level].push(run);
    }
}

fn parse_layout(text: &str) -> Layout {
    match text.split_once(':') {
        None if text == "entry" => Layout::Entry,
        Some(("bucket", n)) => Layout::Bucket(n.parse().expect("bucket:N")),
        Some(("runs", f)) => Layout::Runs(f.parse().expect("runs:F")),
        _ => {
            eprintln!("like_layouts: LAYOUT is entry, bucket:N or runs:F, not {text:?}");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let likes: u64 = args.first().map_or(200_000, |s| s.parse().expect("LIKES"));
    let layout = parse_layout(args.get(1).map_or("entry", String::as_str));
    let batch: u64 = args.get(2).map_or(256, |s| s.parse().expect("BATCH"));
    let dir = std::env::temp_dir().join(format!("tally-like-layouts-{}", std::process::id()));
    let db = open_sled(&dir);
    let mut runs = match layout {
        Layout::Runs(fanout) => Some(Runs {
            fanout: fanout.max(2),
            levels: Vec::new(),
            next_run: 0,
        }),
        _ => None,
    };

    let started = Instant::now();
    let (mut written, mut handed) = (0u64, 0u64);
    while written < likes {
        let n = batch.min(likes - written);
        let members: Vec<Vec<u8>> = (written..written + n)
            .map(|i| {
                let mixed = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                format!("{:08x}", mixed >> 32).into_bytes()
            })
            .collect();
        match layout {
            Layout::Entry => {
                for member in &members {
                    let key = member_key(POST, std::str::from_utf8(member).unwrap());
                    handed += key.len() as u64 + 2;
                    db.insert(key, vec![1u8, 1]).unwrap();
                }
            }
            Layout::Bucket(per_bucket) => {
                let buckets = (likes / per_bucket).max(1);
                let mut touched: Vec<(u64, &Vec<u8>)> = members
                    .iter()
                    .map(|m| (stable_hash(0, &[m]) % buckets, m))
                    .collect();
                touched.sort();
                for group in touched.chunk_by(|a, b| a.0 == b.0) {
                    let key = keyed(b'S', &[group[0].0]);
                    let mut entries = db.get(&key).unwrap().map_or_else(Vec::new, |v| decode(&v));
                    for (_, member) in group {
                        if let Err(i) = entries.binary_search_by(|(m, _)| m.cmp(member)) {
                            entries.insert(i, ((*member).clone(), 1));
                        }
                    }
                    let value = encode(&entries);
                    handed += (key.len() + value.len()) as u64;
                    db.insert(key, value).unwrap();
                }
            }
            Layout::Runs(_) => {
                let entries = members.into_iter().map(|m| (m, 1)).collect();
                runs.as_mut().unwrap().commit(&db, entries, &mut handed);
            }
        }
        let flushes_before = written / FLUSH_EVERY;
        written += n;
        if written / FLUSH_EVERY != flushes_before {
            db.flush().unwrap();
        }
    }
    db.flush().unwrap();
    let elapsed = started.elapsed();
    let (loaded, reopened) = sizes_then_delete(db, &dir);

    let layout = args.get(1).map_or("entry", String::as_str);
    println!(
        "{likes} likes of 8-byte members on one post, {layout}, commits of {batch}: on disk {:.1} B/like \
         after the load, {:.1} B/like after a reopen; handed to sled {:.1} B/like; {:.2} µs a like ({:.1} s)",
        loaded as f64 / likes as f64,
        reopened as f64 / likes as f64,
        handed as f64 / likes as f64,
        elapsed.as_secs_f64() * 1e6 / likes as f64,
        elapsed.as_secs_f64(),
    );
}
