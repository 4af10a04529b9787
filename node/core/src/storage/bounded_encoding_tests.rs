//! Tests of the bounded counter's encoding: round trips, a layout checked
//! byte by byte, the size of a typical counter, and damaged bytes (cut,
//! flipped, reordered, repeated, trailing) refused without a panic.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::crdt::RetiredFold;

fn w(id: u64) -> ReplicaId {
    ReplicaId(id)
}

fn row_strategy(ids: Vec<u64>) -> impl Strategy<Value = RightsRow> {
    let sent =
        prop::collection::btree_map(prop::sample::select(ids).prop_map(w), any::<u64>(), 0..3);
    (any::<u64>(), any::<u64>(), sent).prop_map(|(put, took, sent)| RightsRow { put, took, sent })
}

/// Any state, with writer ids small and large; heirs always lower than the
/// retired writer, so that they never make a circle.
fn state_strategy() -> impl Strategy<Value = BoundedCounter> {
    let ids = prop::collection::vec(prop_oneof![0u64..6, any::<u64>()], 1..5);
    ids.prop_flat_map(|ids| {
        let rows = prop::collection::btree_map(
            prop::sample::select(ids.clone()),
            row_strategy(ids.clone()),
            0..4,
        );
        let pairs = (prop::sample::select(ids.clone()), prop::sample::select(ids));
        let heirs = prop::collection::vec(pairs, 0..3);
        (any::<i64>(), rows, heirs)
    })
    .prop_map(|(bound, rows, pairs)| {
        let rows = rows
            .into_iter()
            .map(|(writer, mut row)| {
                row.sent.remove(&w(writer));
                (w(writer), row)
            })
            .collect();
        let heirs = pairs
            .into_iter()
            .filter(|(retired, heir)| heir < retired)
            .map(|(retired, heir)| (w(retired), w(heir)))
            .collect();
        BoundedCounter::from_parts(bound, rows, heirs)
    })
}

proptest! {
    #[test]
    fn every_state_round_trips(state in state_strategy()) {
        let bytes = encode_bounded(&state);
        prop_assert_eq!(decode_bounded(&bytes).unwrap(), state);
    }

    #[test]
    fn cut_or_flipped_bytes_never_panic(
        state in state_strategy(),
        flip in any::<prop::sample::Index>(),
        bits in 1u8..=255,
    ) {
        let bytes = encode_bounded(&state);
        for cut in 0..bytes.len() {
            prop_assert!(decode_bounded(&bytes[..cut]).is_err(), "cut at {}", cut);
        }
        let mut flipped = bytes.clone();
        flipped[flip.index(bytes.len())] ^= bits;
        // Damage may still read as some state; it must not panic.
        let _ = decode_bounded(&flipped);
        let mut longer = bytes;
        longer.push(0);
        prop_assert!(decode_bounded(&longer).is_err(), "trailing bytes");
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut versioned = vec![BOUNDED_VERSION];
        versioned.extend_from_slice(&bytes);
        let _ = decode_bounded(&versioned);
    }
}

/// Writer 5 put 300 and sent 7 to writer 9, which took 1 and retired into
/// writer 5.
fn small() -> BoundedCounter {
    let mut state = BoundedCounter::new(-3);
    state.put(w(5), 300).unwrap();
    state.transfer(w(5), w(9), 7).unwrap();
    state.take(w(9), 1).unwrap();
    let final_row = state.rows()[&w(9)].clone();
    let fold = RetiredFold::new(w(9), final_row, [w(5)]).unwrap();
    state.fold_retired(&fold).unwrap();
    state
}

#[test]
fn the_layout_of_a_small_counter_is_as_documented() {
    let mut expected = vec![
        BOUNDED_VERSION,
        5, // bound -3, zigzag
        2, // writers
    ];
    expected.extend_from_slice(&5u64.to_le_bytes());
    expected.extend_from_slice(&9u64.to_le_bytes());
    expected.extend_from_slice(&[
        2, // rows
        0, 0xac, 0x02, 0, 1, 1, 7, // writer 5: put 300, took 0, sent 7 to 9
        1, 0, 1, 0, // writer 9: put 0, took 1, sent nothing
        1, 1, 0, // heirs: writer 9's is writer 5
    ]);
    assert_eq!(encode_bounded(&small()), expected);
    assert_eq!(decode_bounded(&expected).unwrap(), small());
}

#[test]
fn a_typical_counter_takes_59_bytes() {
    // Concert seats sold in three regions: region a put the stock and sent
    // each other region a share; each sold some and sent a little on.
    let (a, b, c) = (
        w(0x9e37_79b9_7f4a_7c15),
        w(0x1234_5678_9abc_def0),
        w(u64::MAX),
    );
    let mut state = BoundedCounter::new(0);
    state.put(a, 5000).unwrap();
    state.transfer(a, b, 1500).unwrap();
    state.transfer(a, c, 1500).unwrap();
    state.take(b, 1200).unwrap();
    state.transfer(b, a, 100).unwrap();
    state.transfer(b, c, 50).unwrap();
    state.take(c, 900).unwrap();
    state.transfer(c, a, 200).unwrap();
    state.transfer(c, b, 100).unwrap();
    // 1 version + 1 bound + 1 + 3 x 8 writers + 1 row count
    // + a: index, put (2), took, count, 2 x (index, amount (2)) = 11
    // + b: index, put, took (2), count, 2 x (index, amount) = 9
    // + c: index, put, took (2), count, (index, 2), (index, 1) = 10
    // + 1 heir count.
    let bytes = encode_bounded(&state);
    assert_eq!(bytes.len(), 1 + 1 + 1 + 24 + 1 + 11 + 9 + 10 + 1);
    assert_eq!(bytes.len(), 59);
    assert_eq!(decode_bounded(&bytes).unwrap(), state);
}

#[track_caller]
fn assert_corrupt(bytes: &[u8], why: &str) {
    let error = decode_bounded(bytes).unwrap_err();
    assert!(error.0.contains(why), "{error} does not say {why}");
}

#[test]
fn out_of_order_repeated_and_self_references_are_refused() {
    let good = encode_bounded(&small());
    // Offsets in the small layout: writers at 3..19, rows from 19, writer
    // 5's receiver at 25, writer 9's row at 27, the heirs at 31..34.
    let edit = |at: usize, value: u8| {
        let mut bytes = good.clone();
        bytes[at] = value;
        bytes
    };
    let mut swapped = good.clone();
    swapped[3..19].rotate_left(8);
    assert_corrupt(&swapped, "writers out of order");
    let mut repeated = good.clone();
    repeated.copy_within(3..11, 11);
    assert_corrupt(&repeated, "writers out of order");
    assert_corrupt(&edit(27, 0), "rows out of order");
    assert_corrupt(&edit(25, 0), "transfer to itself");
    assert_corrupt(&edit(25, 2), "index out of range");
    assert_corrupt(&edit(33, 1), "its own heir");
    assert_corrupt(&edit(32, 0), "its own heir");
    let circle =
        BoundedCounter::from_parts(0, BTreeMap::new(), [(w(1), w(2)), (w(2), w(1))].into());
    assert_corrupt(&encode_bounded(&circle), "circle of heirs");
    // Two receivers, the second repeating the first.
    let mut twice = small();
    twice.transfer(w(5), w(1), 1).unwrap();
    let mut bytes = encode_bounded(&twice);
    // writers 1, 5, 9: writer 5's row starts at 28 (index 1, put 2 bytes,
    // took, count 2), then (0, 1), (2, 7).
    assert_eq!(&bytes[28..36], &[1, 0xac, 0x02, 0, 2, 0, 1, 2]);
    bytes[35] = 0;
    assert_corrupt(&bytes, "receivers out of order");
}

#[test]
fn a_newer_format_is_named_as_such() {
    let mut bytes = encode_bounded(&small());
    bytes[0] = BOUNDED_VERSION + 1;
    let error = decode_bounded(&bytes).unwrap_err();
    assert!(error.0.contains("newer"), "{error}");
    assert!(decode_bounded(&[]).is_err());
}
