//! Counter blocks: every counter reads back exactly (by scan and by key,
//! with bases and epochs), keys out of order and damaged bytes are refused,
//! runs merge to the same result in any order, and the bytes a counter
//! takes in the footprint's shape (sequential 20-byte keys, three slots).

use proptest::prelude::*;

use super::*;
use crate::crdt::Crdt;

fn replica_of(ordinal: u32) -> Option<ReplicaId> {
    (ordinal < 8).then_some(ReplicaId(1000 + u64::from(ordinal)))
}

fn ordinal_of(replica: ReplicaId) -> u32 {
    (replica.0 - 1000) as u32
}

fn counter(slots: &[(u64, u64, u64)], base: FoldedBase) -> PnCounter {
    PnCounter::from_parts(
        slots
            .iter()
            .map(|(ordinal, p, n)| (ReplicaId(1000 + ordinal), Slot { p: *p, n: *n })),
        base,
    )
}

fn block_of(counters: &[(String, PnCounter)]) -> Vec<u8> {
    let mut builder = BlockBuilder::new();
    for (key, state) in counters {
        builder.push(key, state, &mut ordinal_of).unwrap();
    }
    builder.finish()
}

fn read_all(bytes: &[u8]) -> Vec<(String, PnCounter)> {
    Block::parse(bytes)
        .unwrap()
        .iter(replica_of)
        .collect::<Result<_, _>>()
        .unwrap()
}

fn counters_strategy() -> impl Strategy<Value = Vec<(String, PnCounter)>> {
    let slot = (0u64..8, any::<u64>(), any::<u64>());
    let base = (0u64..4, any::<u128>(), 0u128..1000);
    let state = (prop::collection::vec(slot, 0..5), prop::option::of(base));
    let key = "[a-c]{0,3}(é|:|x)[0-9]{0,4}";
    prop::collection::btree_map(key, state, 0..80).prop_map(|map| {
        map.into_iter()
            .map(|(key, (slots, base))| {
                let base = base.map_or(FoldedBase::default(), |(epoch, p, n)| FoldedBase {
                    epoch,
                    p,
                    n,
                });
                (key, counter(&slots, base))
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn every_counter_reads_back_by_scan_and_by_key(counters in counters_strategy()) {
        let bytes = block_of(&counters);
        prop_assert_eq!(&read_all(&bytes), &counters);
        let block = Block::parse(&bytes).unwrap();
        for (key, state) in &counters {
            let found = block.get(key, replica_of).unwrap();
            prop_assert_eq!(found.as_ref(), Some(state));
            let absent = format!("{key}~");
            if !counters.iter().any(|(k, _)| *k == absent) {
                prop_assert_eq!(block.get(&absent, replica_of).unwrap(), None);
            }
        }
        prop_assert_eq!(block.get("", replica_of).unwrap().is_some(), counters.iter().any(|(k, _)| k.is_empty()));
    }

    #[test]
    fn damaged_bytes_are_an_error_never_a_panic(
        counters in counters_strategy(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        bits in 1u8..=255,
    ) {
        let bytes = block_of(&counters);
        let short = &bytes[..cut.index(bytes.len())];
        if let Ok(block) = Block::parse(short) {
            let _ = block.iter(replica_of).count();
            let _ = block.get("b", replica_of);
        }
        let mut flipped = bytes.clone();
        let at = flip.index(flipped.len());
        flipped[at] ^= bits;
        if let Ok(block) = Block::parse(&flipped) {
            let _ = block.iter(replica_of).count();
            for (key, _) in &counters {
                let _ = block.get(key, replica_of);
            }
        }
    }

    #[test]
    fn runs_merge_to_one_result_in_any_order(
        a in counters_strategy(),
        b in counters_strategy(),
        c in counters_strategy(),
    ) {
        // States of one epoch, as the slot-wise max joins them (across
        // epochs the store joins with the fold rule, `merge_folded`).
        let unfolded = |run: Vec<(String, PnCounter)>| -> Vec<(String, PnCounter)> {
            run.into_iter()
                .map(|(key, state)| {
                    let slots = state.slots().to_vec();
                    (key, PnCounter::from_slots(slots))
                })
                .collect()
        };
        let (a, b, c) = (unfolded(a), unfolded(b), unfolded(c));
        let blocks = [block_of(&a), block_of(&b), block_of(&c)];
        let runs: Vec<Block> = blocks.iter().map(|bytes| Block::parse(bytes).unwrap()).collect();
        let join = |into: &mut PnCounter, other: &PnCounter| {
            into.merge(other);
        };
        let forward = merge_runs(&runs, replica_of, join).unwrap();
        let backward: Vec<Block> = runs.iter().rev().copied().collect();
        prop_assert_eq!(&merge_runs(&backward, replica_of, join).unwrap(), &forward);
        // The same as merging the counters one by one.
        let mut expected: std::collections::BTreeMap<String, PnCounter> = Default::default();
        for (key, state) in a.iter().chain(&b).chain(&c) {
            expected
                .entry(key.clone())
                .and_modify(|into| {
                    into.merge(state);
                })
                .or_insert_with(|| state.clone());
        }
        prop_assert_eq!(forward.clone(), expected.into_iter().collect::<Vec<_>>());
        // Cut into blocks again, they read back whole.
        let rebuilt = build_blocks(&forward, 256, ordinal_of).unwrap();
        let read: Vec<(String, PnCounter)> = rebuilt.iter().flat_map(|bytes| read_all(bytes)).collect();
        prop_assert_eq!(read, forward);
    }
}

#[test]
fn keys_out_of_order_are_refused_and_change_nothing() {
    let one = counter(&[(0, 1, 0)], FoldedBase::default());
    let mut builder = BlockBuilder::new();
    builder.push("b", &one, &mut ordinal_of).unwrap();
    let size = builder.size();
    for key in ["a", "b"] {
        let error = builder.push(key, &one, &mut ordinal_of).unwrap_err();
        assert!(error.0.contains("increasing order"), "{error}");
    }
    assert_eq!((builder.len(), builder.size()), (1, size));
    assert_eq!(read_all(&builder.finish()), vec![("b".to_string(), one)]);
}

#[test]
fn an_unknown_ordinal_or_a_newer_format_is_named() {
    let bytes = block_of(&[("k".into(), counter(&[(7, 1, 0)], FoldedBase::default()))]);
    let block = Block::parse(&bytes).unwrap();
    let error = block.iter(|_| None).next().unwrap().unwrap_err();
    assert!(error.0.contains("unknown replica ordinal 7"), "{error}");
    let mut newer = bytes.clone();
    newer[0] = BLOCK_VERSION + 1;
    let error = Block::parse(&newer).unwrap_err();
    assert!(error.0.contains("newer Tally build"), "{error}");
    assert!(Block::parse(&[]).is_err());
}

#[test]
fn an_empty_block_holds_nothing() {
    let bytes = BlockBuilder::new().finish();
    assert!(read_all(&bytes).is_empty());
    assert_eq!(
        Block::parse(&bytes).unwrap().get("k", replica_of).unwrap(),
        None
    );
}

/// The footprint bench's shape (`deploy/bench/footprint`): keys
/// `post:1NNNNNNNN:likes` in order, each written once by three regions.
#[test]
fn a_counter_of_three_slots_under_a_sequential_key_takes_about_20_bytes() {
    const COUNTERS: usize = 100_000;
    let counters: Vec<(String, PnCounter)> = (0..COUNTERS)
        .map(|i| {
            let key = format!("post:1{i:08}:likes");
            (
                key,
                counter(&[(0, 1, 0), (1, 1, 0), (2, 1, 0)], FoldedBase::default()),
            )
        })
        .collect();
    let blocks = build_blocks(&counters, 16 * 1024, ordinal_of).unwrap();
    let bytes: usize = blocks.iter().map(Vec::len).sum();
    let per_counter = bytes as f64 / COUNTERS as f64;
    assert!(
        per_counter <= 21.0,
        "{per_counter:.1} B a counter in {} blocks",
        blocks.len()
    );
    let read: Vec<(String, PnCounter)> = blocks.iter().flat_map(|bytes| read_all(bytes)).collect();
    assert_eq!(read, counters);
}
