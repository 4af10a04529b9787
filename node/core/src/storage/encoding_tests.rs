//! Unit tests of the byte encodings: round trips of every record format
//! this build writes, records of older formats (which it only reads, so
//! they are spelled out byte by byte as older builds wrote them), and
//! records of newer formats named as such.

use super::*;

/// Ordinal n is replica 1000 + n, for records made in tests.
fn ordinal_of(replica: ReplicaId) -> u32 {
    u32::try_from(replica.0 - 1000).unwrap()
}

fn replica_of(ordinal: u32) -> Option<ReplicaId> {
    (ordinal < 10).then(|| ReplicaId(1000 + u64::from(ordinal)))
}

#[test]
fn counters_round_trip_at_the_extremes_with_small_records() {
    let state = PnCounter::from_slots([
        (ReplicaId(1009), Slot { p: u64::MAX, n: 0 }),
        (ReplicaId(1000), Slot { p: 0, n: u64::MAX }),
    ]);
    let bytes = encode_counter(u64::MAX, &state, ordinal_of);
    assert_eq!(bytes[0], COUNTER_VERSION);
    assert_eq!(
        decode_counter(&bytes, replica_of).unwrap(),
        StoredCounter {
            seq: u64::MAX,
            state
        }
    );
    // Three regions' slots of a liked post: 14 bytes, not 35.
    let post =
        PnCounter::from_slots((0..3).map(|r| (ReplicaId(1000 + r), Slot { p: 120 + r, n: 1 })));
    assert_eq!(encode_counter(40_000, &post, ordinal_of).len(), 14);
}

#[test]
fn a_counter_record_of_format_1_still_reads() {
    // As builds before cluster version 2 wrote it: seq, slot count, then
    // each slot's 8-byte replica id inline and its p and n as varints.
    let mut bytes = vec![1];
    put_varint(&mut bytes, 9);
    put_varint(&mut bytes, 2);
    for (replica, p, n) in [(u64::MAX, 300, 2), (3, 0, u64::MAX)] {
        bytes.extend_from_slice(&replica.to_le_bytes());
        put_varint(&mut bytes, p);
        put_varint(&mut bytes, n);
    }
    let read = decode_counter(&bytes, |_| None).unwrap();
    let state = PnCounter::from_slots([
        (ReplicaId(u64::MAX), Slot { p: 300, n: 2 }),
        (ReplicaId(3), Slot { p: 0, n: u64::MAX }),
    ]);
    assert_eq!((read.seq, read.state), (9, state));
    assert_eq!(decode_counter_seq(&bytes).unwrap(), 9);
    for cut in 0..bytes.len() {
        assert!(decode_counter(&bytes[..cut], |_| None).is_err());
    }
}

#[test]
fn a_record_of_a_newer_format_is_not_called_corrupt() {
    let error = decode_counter(&[COUNTER_FOLDED_VERSION + 1, 1, 0], |_| None).unwrap_err();
    assert!(!error.0.contains("corrupt"), "{error}");
    assert!(error.0.contains("newer"), "{error}");
    let error = decode_counter(&[0, 1, 0], |_| None).unwrap_err();
    assert!(error.0.contains("corrupt"), "{error}");
}

#[test]
fn version_1_records_with_inline_replica_ids_still_read() {
    let mut v1 = vec![1, 7, 1];
    v1.extend_from_slice(&u64::MAX.to_le_bytes());
    v1.extend_from_slice(&[0xac, 0x02, 2]);
    let expected = PnCounter::from_slots([(ReplicaId(u64::MAX), Slot { p: 300, n: 2 })]);
    let read = decode_counter(&v1, |_| None).unwrap();
    assert_eq!((read.seq, read.state), (7, expected));
    assert_eq!(decode_counter_seq(&v1).unwrap(), 7);
}

#[test]
fn damaged_records_are_errors_not_panics() {
    let state = PnCounter::from_slots([(ReplicaId(1003), Slot { p: 300, n: 2 })]);
    let bytes = encode_counter(7, &state, ordinal_of);
    for cut in 0..bytes.len() {
        assert!(
            decode_counter(&bytes[..cut], replica_of).is_err(),
            "cut at {cut}"
        );
    }
    let mut future = bytes.clone();
    future[0] = 9;
    assert!(decode_counter(&future, replica_of)
        .unwrap_err()
        .0
        .contains("in format 9, written by a newer Tally build"));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(decode_counter(&longer, replica_of).is_err());
    assert!(decode_counter(&bytes, |_| None)
        .unwrap_err()
        .0
        .contains("unknown replica ordinal 3"));
    let (ordinal, replica) = decode_ordinal(&ordinal_key(3), &encode_u64(1003)).unwrap();
    assert_eq!((ordinal, replica), (3, ReplicaId(1003)));
    assert!(decode_ordinal(b"r\0\0", &encode_u64(1)).is_err());
}

#[test]
fn a_counter_store_key_and_its_commit_read_back_alone() {
    let bytes = encode_counter(300, &PnCounter::default(), ordinal_of);
    assert_eq!(decode_counter_seq(&bytes).unwrap(), 300);
    assert!(decode_counter_seq(&bytes[..1]).is_err());
    assert_eq!(
        decode_counter_key(&counter_key("post:1")).unwrap(),
        "post:1"
    );
    assert!(decode_counter_key(b"c").is_err());
    assert!(decode_counter_key(b"xpost").is_err());
    assert!(decode_counter_key(b"c\xff").is_err());
}

#[test]
fn a_change_log_snapshot_round_trips_and_damage_is_detected() {
    let mut changes = super::super::ChangeIndex::new();
    for (seq, key) in [(3, "a"), (3, "b"), (9, "post:1"), (300, "ü")] {
        changes.push_recovered(seq, key);
    }
    let bytes = encode_change_snapshot(301, &changes);
    let (seq, back) = decode_change_snapshot(&bytes).unwrap();
    assert_eq!(seq, 301);
    let listed = |index: &super::super::ChangeIndex| -> Vec<(u64, String)> {
        index
            .after(&Cursor::default(), 100)
            .into_iter()
            .map(|c| (c.seq, c.key.to_string()))
            .collect()
    };
    assert_eq!(listed(&back), listed(&changes));
    for cut in 0..bytes.len() {
        assert!(
            decode_change_snapshot(&bytes[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    let mut flipped = bytes.clone();
    flipped[12] ^= 1;
    assert!(decode_change_snapshot(&flipped).is_err());
    let empty = encode_change_snapshot(0, &super::super::ChangeIndex::new());
    assert!(decode_change_snapshot(&empty).unwrap().1.is_empty());
}

#[test]
fn idempotency_segments_are_small_and_versions_1_and_2_still_read() {
    let records: Vec<IdempotencyRecord> = (0..100u64)
        .map(|i| IdempotencyRecord {
            id: u128::from(i) << 70 | 0xabcdef,
            fingerprint: i * 7,
            value: 1_000 + i as i64,
            seq: 500,
            expires_at_ms: 1_800_000_000_000 + i,
            partition: (i % 3 > 0).then_some(Partition(i as u32 * 650)),
        })
        .collect();
    let bytes = encode_idempotency(500, &records);
    assert!(bytes.len() <= 12 + 100 * 32, "{} bytes", bytes.len());
    assert_eq!(
        decode_idempotency(&idempotency_key(500), &bytes).unwrap(),
        (500, records.clone())
    );
    for cut in 0..bytes.len() {
        assert!(decode_idempotency(&idempotency_key(500), &bytes[..cut]).is_err());
    }

    // Version 2, as builds before record partitions wrote it (until the
    // cluster version reached 8): the same without partitions.
    let mut v2 = vec![2];
    put_varint(&mut v2, 1);
    put_varint(&mut v2, records[3].expires_at_ms);
    v2.extend_from_slice(&records[3].id.to_be_bytes());
    v2.extend_from_slice(&records[3].fingerprint.to_le_bytes());
    put_varint(&mut v2, zigzag(records[3].value));
    put_varint(&mut v2, zigzag(0)); // seq - segment
    put_varint(&mut v2, 0); // expiry - base expiry
    assert_eq!(
        decode_idempotency(&idempotency_key(500), &v2).unwrap(),
        (
            500,
            vec![IdempotencyRecord {
                partition: None,
                ..records[3].clone()
            }]
        )
    );

    // Version 1, as earlier builds wrote it: fixed 8-byte fields.
    let mut v1 = vec![1, 1];
    v1.extend_from_slice(&records[3].id.to_be_bytes());
    for field in [7u64 * 3, 1_003, 500, 1_800_000_000_003] {
        v1.extend_from_slice(&field.to_le_bytes());
    }
    assert_eq!(
        decode_idempotency(&idempotency_key(500), &v1).unwrap(),
        (
            500,
            vec![IdempotencyRecord {
                partition: None,
                ..records[3].clone()
            }]
        )
    );
    let mut future = bytes;
    future[0] = 4;
    assert!(decode_idempotency(&idempotency_key(500), &future)
        .unwrap_err()
        .0
        .contains("in format 4, written by a newer Tally build"));
}

#[test]
fn the_hash_key_round_trips() {
    let hash_key = HashKey {
        key: u128::MAX - 7,
        keyed_from: 42,
    };
    let bytes = encode_hash_key(&hash_key);
    assert_eq!(decode_hash_key(&bytes).unwrap(), hash_key);
    assert!(decode_hash_key(&bytes[..bytes.len() - 1]).is_err());
}

#[test]
fn other_records_round_trip() {
    let record = IdempotencyRecord {
        id: u128::MAX - 5,
        fingerprint: 9,
        value: -4,
        seq: 3,
        expires_at_ms: 77,
        partition: None,
    };
    let other = IdempotencyRecord {
        id: 1,
        fingerprint: 2,
        value: i64::MIN,
        seq: 4,
        expires_at_ms: 5,
        partition: None,
    };
    let bytes = encode_idempotency(12, &[record.clone(), other.clone()]);
    assert_eq!(
        decode_idempotency(&idempotency_key(12), &bytes).unwrap(),
        (12, vec![record, other])
    );
    assert!(decode_idempotency(&idempotency_key(12), &bytes[..bytes.len() - 1]).is_err());
    let identity = Identity {
        replica: ReplicaId(5),
        region: "eu-west".into(),
    };
    assert_eq!(
        decode_identity(&encode_identity(&identity)).unwrap(),
        identity
    );
    let cursor = Cursor {
        seq: 12,
        key: "post:1".into(),
    };
    assert_eq!(decode_cursor(&encode_cursor(&cursor)).unwrap(), cursor);
    assert_eq!(decode_u64(&encode_u64(42), "x").unwrap(), 42);
    assert_eq!(decode_text(&encode_text("ap"), "x").unwrap(), "ap");
    assert_eq!(
        decode_replica_key(&replica_key(DIRECTORY, ReplicaId(8))).unwrap(),
        ReplicaId(8)
    );
}
