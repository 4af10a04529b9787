//! What sled 0.34 makes of counters stored as blocks (issue 45's layout,
//! `tally-core`'s `storage/block.rs`): the footprint bench's counters
//! (`post:1NNNNNNNN:likes`, each written once by three regions, so three
//! slots each) grouped by partition, sorted, and cut into blocks of about
//! BLOCK_KB, one sled entry per block under `B` + partition + first key.
//! This is the store's state once compaction has merged a partition's runs
//! into one; with RUNS above 1 each partition holds that many runs of equal
//! size instead (what flushes leave before compaction). It prints the data
//! directory's size per counter after the load and after a reopen, and the
//! bytes handed to sled per counter.
//!
//! `cargo run --release -p tally-node --example block_layout -- [COUNTERS] [BLOCK_KB] [PARTITIONS] [RUNS]`
//! (defaults: 1000000 counters, 16 KB blocks, 256 partitions, 1 run).
//! Deletes its data directory when done.

use std::time::Instant;

use tally_node::crdt::{FoldedBase, PnCounter, ReplicaId, Slot};
use tally_node::partition::PartitionCount;
use tally_node::store::block::build_blocks;

mod common;
use common::{open_sled, sizes_then_delete};

const REGIONS: u64 = 3;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|arg| {
            arg.parse()
                .expect("COUNTERS BLOCK_KB PARTITIONS RUNS: numbers")
        })
        .collect();
    let counters = args.first().copied().unwrap_or(1_000_000);
    let block_kb = args.get(1).copied().unwrap_or(16);
    let partitions = args.get(2).copied().unwrap_or(256);
    let runs = args.get(3).copied().unwrap_or(1).max(1);
    let count = PartitionCount::new(partitions).expect("PARTITIONS: a valid partition count");

    let mut by_partition: Vec<Vec<(String, PnCounter)>> = vec![Vec::new(); partitions as usize];
    for i in 0..counters {
        let key = format!("post:1{i:08}:likes");
        let slots = (0..REGIONS).map(|region| (ReplicaId(region), Slot { p: 1, n: 0 }));
        let counter = PnCounter::from_parts(slots, FoldedBase::default());
        by_partition[count.of_key(key.as_bytes()).0 as usize].push((key, counter));
    }

    let dir = std::env::temp_dir().join(format!("tally-block-layout-{}", std::process::id()));
    let db = open_sled(&dir);
    let started = Instant::now();
    let (mut handed, mut blocks) = (0u64, 0u64);
    for (partition, mut counters) in by_partition.into_iter().enumerate() {
        counters.sort_by(|a, b| a.0.cmp(&b.0));
        // Runs of one partition each hold every `runs`-th counter, as
        // flushes of interleaved writes would.
        for run in 0..runs as usize {
            let part: Vec<(String, PnCounter)> = counters
                .iter()
                .skip(run)
                .step_by(runs as usize)
                .cloned()
                .collect();
            let built = build_blocks(&part, block_kb as usize * 1024, |replica| replica.0 as u32)
                .expect("keys in order");
            let mut first = 0;
            for block in built {
                let mut store_key = vec![b'B'];
                store_key.extend_from_slice(&(partition as u32).to_be_bytes());
                store_key.extend_from_slice(&(run as u32).to_be_bytes());
                store_key.extend_from_slice(part[first].0.as_bytes());
                first += tally_node::store::block::Block::parse(&block)
                    .expect("a block just built")
                    .iter(|ordinal| Some(ReplicaId(u64::from(ordinal))))
                    .count();
                handed += (store_key.len() + block.len()) as u64;
                db.insert(store_key, block).unwrap();
                blocks += 1;
            }
        }
    }
    db.flush().unwrap();
    let elapsed = started.elapsed();
    let (loaded, reopened) = sizes_then_delete(db, &dir);
    println!(
        "{counters} counters in {partitions} partitions, {runs} run(s) each, blocks of about {block_kb} KB ({blocks} blocks): \
         on disk {:.1} B/counter after the load, {:.1} B/counter after a reopen; handed to sled {:.1} B/counter; {:.1} s",
        loaded as f64 / counters as f64,
        reopened as f64 / counters as f64,
        handed as f64 / counters as f64,
        elapsed.as_secs_f64(),
    );
}
