//! What a fold costs at scale, at the store level (issue 13): a sled store
//! with N counters (default 1,000,000; `TALLY_FOLD_BENCH_COUNTERS`), each
//! holding a slot of this node and one of a retired writer, is folded by the
//! core's sweep in group commits, as the node's fold keeper does it. Prints
//! the time, the rate and the store's size before and after; the second
//! test folds partition by partition (cluster version 10, P 1024, every
//! partition kept) and prints the start-up scan of the digests by
//! partition too. A measurement, not a check of speed: run it by hand,
//! `cargo test --release -p tally-node --test fold_cost -- --ignored --nocapture --test-threads=1`.

use std::sync::Arc;
use std::time::Instant;

use tally_node::crdt::{PnCounter, ReplicaId, Slot, WriterDigest};
use tally_node::partition::PartitionCount;
use tally_node::replica::{CommitBatch, DurableState, Replica, ReplicaConfig};
use tally_node::store::{OnCorrupt, SledStore, Store};

const RETIRED: ReplicaId = ReplicaId(0xdead);

#[test]
#[ignore]
fn fold_cost_at_a_million_counters() {
    fold_cost(None);
}

#[test]
#[ignore]
fn fold_cost_by_partition_at_a_million_counters() {
    fold_cost(Some(PartitionCount::new(1024).unwrap()));
}

fn fold_cost(partitions: Option<PartitionCount>) {
    let counters: usize = std::env::var("TALLY_FOLD_BENCH_COUNTERS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&dir.path().join("data"), "eu", 7, OnCorrupt::Refuse).unwrap();
    let own = store.identity().replica;
    // N counters written by this node and by a writer of another region.
    let mut digest = WriterDigest::default();
    let started = Instant::now();
    for (index, first) in (0..counters).step_by(10_000).enumerate() {
        let mut batch = CommitBatch {
            seq: index as u64 + 1,
            ..Default::default()
        };
        for n in first..(first + 10_000).min(counters) {
            let key = format!("post:{n}:likes");
            let theirs = Slot {
                p: n as u64 + 1,
                n: 0,
            };
            digest.replace(&key, Slot::default(), theirs);
            let state = PnCounter::from_slots([(own, Slot { p: 3, n: 1 }), (RETIRED, theirs)]);
            batch.counters.push((Arc::from(key.as_str()), state));
        }
        if index == 0 {
            batch.directory_put = vec![(own, "eu".into()), (RETIRED, "us".into())];
        }
        batch.writer_digests = vec![(RETIRED, digest)];
        store.write(&batch).unwrap();
    }
    store.flush().unwrap();
    let before = store.size_on_disk().unwrap_or(0);
    println!(
        "{counters} counters written in {:?}; store {before} bytes",
        started.elapsed()
    );

    let identity = store.identity().clone();
    let config = ReplicaConfig {
        cache_capacity: 20_000,
        ..ReplicaConfig::default()
    };
    let mut core = Replica::open(identity, config, store.recover(0).unwrap(), 0);
    assert_eq!(core.folds().digest_of(RETIRED), digest);
    if let Some(count) = partitions {
        // What a start after a crash does (a clean stop saves them).
        let scan = Instant::now();
        assert!(
            !tally_node::store::set_partition_count(&mut core, count, &store, None).unwrap(),
            "computed, not saved"
        );
        println!(
            "digests by partition of {counters} counters computed in {:?}",
            scan.elapsed()
        );
    }
    core.handle_retire(RETIRED, &[]).unwrap();
    // No other member: this node alone agrees, and commits the record.
    let committed = core.handle_fold_round(1, "eu-1", &[], None).unwrap();
    assert_eq!(committed.len(), 1);
    assert_eq!(committed[0].by_partition.is_some(), partitions.is_some());
    assert_eq!(core.folds().applied(), 1);
    let started = Instant::now();
    let mut commits = 0;
    loop {
        let visited = core.poll_fold_sweep(2, &store, 2_000).unwrap();
        while let Some(batch) = core.poll_commit() {
            store.write(&batch).unwrap();
            store.flush().unwrap();
            core.handle_commit_done(batch.seq);
            commits += 1;
        }
        core.tick(3);
        if visited == 0 {
            break;
        }
    }
    let took = started.elapsed();
    let after = store.size_on_disk().unwrap_or(0);
    println!(
        "folded {counters} counters in {took:?} ({:.0} counters/s, {commits} group commits); \
         store {before} -> {after} bytes",
        counters as f64 / took.as_secs_f64()
    );
    // Every stored counter is folded: one slot left, the base holds the rest.
    for n in [0, counters / 2, counters - 1] {
        let stored = store
            .load_counter(&format!("post:{n}:likes"))
            .unwrap()
            .unwrap();
        assert_eq!(stored.state.slots().len(), 1);
        assert_eq!(stored.state.folded().epoch, 1);
        assert_eq!(stored.state.exact_value(), 2 + n as i128 + 1);
    }
}
