//! The edge between prost and the core: conversions of the replication
//! messages, and the mapping of core errors to gRPC statuses. The only place
//! where the two kinds of types meet.

use tally_proto::v1 as pb;
use tonic::{Code, Status};

use crate::crdt::hll::check_register;
use crate::crdt::{check_member, FoldedBase, PnCounter, ReplicaId, Slot};
use crate::engine::EngineError;
use crate::partition::{Partition, PartitionCount, PartitionSet};
use crate::replica::version::ProtocolWindow;
use crate::replica::{
    check_name, parse_key, AddRefused, Cursor, DeltaCursor, IdempotencyRecord, PullChunk,
    PullRefused, PullRequest, RecordsCursor, SetDelta, MAX_CHUNK_COUNTERS, MAX_CHUNK_ELEMENTS,
    MAX_CHUNK_RECORDS,
};

/// The gRPC status of an engine error: a code a client can act on and the
/// error's own message.
pub fn status_of(error: &EngineError) -> Status {
    let code = code_of(error);
    Status::new(code, error.to_string())
}

/// The gRPC code of an engine error.
pub fn code_of(error: &EngineError) -> Code {
    use crate::crdt::AddError;
    match error {
        EngineError::Key(_) => Code::InvalidArgument,
        EngineError::Add(AddRefused::Counter(AddError::ZeroDelta)) => Code::InvalidArgument,
        EngineError::Add(AddRefused::Counter(_)) => Code::OutOfRange,
        EngineError::Add(AddRefused::IdempotencyKeyTooLong(_)) => Code::InvalidArgument,
        EngineError::Add(AddRefused::IdempotencyKeyReused(_)) => Code::FailedPrecondition,
        EngineError::Add(AddRefused::Fenced(_)) => Code::FailedPrecondition,
        EngineError::Add(AddRefused::HeldAfterRestart { .. }) => Code::Unavailable,
        EngineError::Add(AddRefused::NotServed { .. } | AddRefused::WriteGated(_)) => {
            Code::Unavailable
        }
        EngineError::Add(AddRefused::Storage(_)) | EngineError::Storage(_) => Code::Unavailable,
        EngineError::OutOfRange(_) => Code::OutOfRange,
        EngineError::ShuttingDown => Code::Unavailable,
        EngineError::StoreFailing(_) | EngineError::StoreFailed(_) => Code::Unavailable,
        EngineError::DiskFull { .. } => Code::ResourceExhausted,
        EngineError::Set(error) => {
            use crate::engine::sets::SetError;
            use crate::replica::LikeRefused;
            match error {
                SetError::Member(_) | SetError::TooMany { .. } | SetError::NoKeys => {
                    Code::InvalidArgument
                }
                SetError::PageToken(_) => Code::InvalidArgument,
                SetError::Like(LikeRefused::Overflow(_)) => Code::OutOfRange,
                SetError::Like(LikeRefused::Add(add)) => code_of(&EngineError::Add(add.clone())),
            }
        }
        EngineError::CopiesUnconfirmed { .. } => Code::Unavailable,
        EngineError::RegionTooSmall { .. } | EngineError::TooFewOwners { .. } => {
            Code::FailedPrecondition
        }
    }
}

/// The per-item error of a batch.
pub fn item_error(error: &EngineError) -> pb::Error {
    pb::Error {
        code: code_of(error) as i32,
        message: error.to_string(),
    }
}

/// The status of a refused pull.
pub fn pull_status(refused: &PullRefused) -> Status {
    let code = match refused {
        PullRefused::WrongCluster { .. } => Code::PermissionDenied,
        PullRefused::WrongReplica { .. } => Code::FailedPrecondition,
        PullRefused::IncompatibleProtocol { .. } => Code::FailedPrecondition,
        PullRefused::PartitionCount { .. } => Code::FailedPrecondition,
        PullRefused::Storage(_) => Code::Unavailable,
    };
    Status::new(code, refused.to_string())
}

/// A cursor from the wire (absent means "from the start").
pub fn cursor_from(cursor: Option<pb::Cursor>) -> Result<Cursor, String> {
    let Some(cursor) = cursor else {
        return Ok(Cursor::default());
    };
    let key = String::from_utf8(cursor.key.to_vec())
        .map_err(|_| "cursor key is not UTF-8".to_string())?;
    Ok(Cursor {
        seq: cursor.seq,
        key,
    })
}

/// A cursor for the wire.
pub fn cursor_to(cursor: &Cursor) -> pb::Cursor {
    pb::Cursor {
        seq: cursor.seq,
        key: cursor.key.clone().into_bytes().into(),
    }
}

/// A pull request from the wire, with the server's cap on its size.
pub fn pull_request_from(
    request: pb::PullRequest,
    max_bytes_cap: usize,
) -> Result<PullRequest, Status> {
    let after = cursor_from(request.after).map_err(Status::invalid_argument)?;
    let asked = if request.max_bytes == 0 {
        max_bytes_cap
    } else {
        request.max_bytes as usize
    };
    Ok(PullRequest {
        cluster_id: request.cluster_id,
        caller: ReplicaId(request.caller_replica),
        expected: (request.expected_replica != 0).then_some(ReplicaId(request.expected_replica)),
        after,
        max_bytes: asked.min(max_bytes_cap),
        directory_digest: request.directory_digest,
        protocol: ProtocolWindow::announced(request.protocol_oldest, request.protocol_version),
        deltas_after: request
            .deltas_after
            .map(|bytes| DeltaCursor(bytes.to_vec())),
        records_from: request.records_from.map(|seq| RecordsCursor {
            seq,
            skip: request.records_skip,
        }),
        scope: request
            .scope
            .map(partition_set_from)
            .transpose()
            .map_err(|e| Status::invalid_argument(format!("bad pull scope: {e}")))?,
    })
}

/// A partition set from the wire.
pub fn partition_set_from(set: pb::PartitionSet) -> Result<PartitionSet, String> {
    let count = PartitionCount::new(u64::from(set.partitions)).map_err(|e| e.to_string())?;
    PartitionSet::from_hex(count, &set.hex).map_err(|e| e.to_string())
}

/// A partition set for the wire.
pub fn partition_set_to(set: &PartitionSet) -> pb::PartitionSet {
    pb::PartitionSet {
        partitions: set.count().get(),
        hex: set.to_hex(),
    }
}

/// A pull request for the wire.
pub fn pull_request_to(request: &PullRequest) -> pb::PullRequest {
    pb::PullRequest {
        cluster_id: request.cluster_id.clone(),
        caller_replica: request.caller.0,
        expected_replica: request.expected.map_or(0, |id| id.0),
        after: Some(cursor_to(&request.after)),
        max_bytes: request.max_bytes.min(u32::MAX as usize) as u32,
        directory_digest: request.directory_digest,
        protocol_version: request.protocol.newest,
        protocol_oldest: request.protocol.oldest,
        deltas_after: request
            .deltas_after
            .as_ref()
            .map(|cursor| cursor.0.clone().into()),
        records_from: request.records_from.map(|cursor| cursor.seq),
        records_skip: request.records_from.map_or(0, |cursor| cursor.skip),
        scope: request.scope.as_ref().map(partition_set_to),
    }
}

/// A chunk for the wire.
pub fn chunk_to(chunk: &PullChunk) -> pb::PullChunk {
    pb::PullChunk {
        source_replica: chunk.source.0,
        counters: chunk
            .counters
            .iter()
            .map(|(key, state)| pb::CounterState {
                key: key.as_bytes().to_vec().into(),
                slots: state
                    .slots()
                    .iter()
                    .map(|(replica, slot)| pb::Slot {
                        replica: replica.0,
                        p: slot.p,
                        n: slot.n,
                    })
                    .collect(),
                folded: folded_to(state.folded()),
            })
            .collect(),
        replicas: chunk
            .replicas
            .iter()
            .map(|(replica, region)| pb::ReplicaInfo {
                replica: replica.0,
                region: region.clone(),
            })
            .collect(),
        next: Some(cursor_to(&chunk.next)),
        complete: chunk.complete,
        directory_digest: chunk.directory_digest,
        set_deltas: chunk.deltas.iter().map(delta_to).collect(),
        deltas_next: chunk.deltas_next.as_ref().map(|c| c.0.clone().into()),
        deltas_complete: chunk.deltas_complete,
        records: chunk.records.iter().map(record_to).collect(),
        records_next: chunk.records_next.map(|cursor| cursor.seq),
        records_next_skip: chunk.records_next.map_or(0, |cursor| cursor.skip),
        records_complete: chunk.records_complete,
        id_keys: chunk.id_keys.iter().map(|key| id_key_to(*key)).collect(),
        served: chunk.served.as_ref().map(partition_set_to),
    }
}

pub(crate) fn id_key_to(key: u128) -> pb::IdKey {
    pb::IdKey {
        high: (key >> 64) as u64,
        low: key as u64,
    }
}

pub(crate) fn id_key_from(key: &pb::IdKey) -> u128 {
    (u128::from(key.high) << 64) | u128::from(key.low)
}

pub(crate) fn record_to(record: &IdempotencyRecord) -> pb::IdempotencyRecord {
    pb::IdempotencyRecord {
        id_high: (record.id >> 64) as u64,
        id_low: record.id as u64,
        fingerprint: record.fingerprint,
        value: record.value,
        expires_at_ms: record.expires_at_ms,
        partition: record.partition.map(|partition| partition.0),
    }
}

/// A record from the wire; its `seq` is the receiver's to set.
pub(crate) fn record_from(record: pb::IdempotencyRecord) -> IdempotencyRecord {
    IdempotencyRecord {
        id: (u128::from(record.id_high) << 64) | u128::from(record.id_low),
        fingerprint: record.fingerprint,
        value: record.value,
        seq: 0,
        expires_at_ms: record.expires_at_ms,
        partition: record.partition.map(Partition),
    }
}

fn delta_to(delta: &SetDelta) -> pb::SetDelta {
    match delta {
        SetDelta::Likes { key, members } => pb::SetDelta {
            key: key.as_bytes().to_vec().into(),
            kind: 1,
            members: members
                .iter()
                .map(|(member, length)| pb::MemberLength {
                    member: member.as_bytes().to_vec().into(),
                    length: *length,
                })
                .collect(),
            registers: Vec::new(),
        },
        SetDelta::Uniques { key, registers } => pb::SetDelta {
            key: key.as_bytes().to_vec().into(),
            kind: 2,
            members: Vec::new(),
            registers: registers
                .iter()
                .map(|(index, rank)| pb::Register {
                    index: u32::from(*index),
                    rank: u32::from(*rank),
                })
                .collect(),
        },
    }
}

/// A delta from the wire: key, members and registers checked as the node
/// checks its own.
fn delta_from(delta: pb::SetDelta) -> Result<SetDelta, (&'static str, String)> {
    let key = parse_key(&delta.key).map_err(|e| ("malformed", format!("bad set key: {e}")))?;
    match delta.kind {
        1 if delta.registers.is_empty() => {
            let mut members = Vec::with_capacity(delta.members.len());
            for entry in delta.members {
                let member = check_member(&entry.member)
                    .map_err(|e| ("malformed", format!("like set {key:?}: {e}")))?;
                members.push((Box::from(member), entry.length));
            }
            Ok(SetDelta::Likes { key, members })
        }
        2 if delta.members.is_empty() => {
            let mut registers = Vec::with_capacity(delta.registers.len());
            for register in delta.registers {
                registers.push(
                    check_register(register.index, register.rank)
                        .map_err(|e| ("malformed", format!("uniques {key:?}: {e}")))?,
                );
            }
            Ok(SetDelta::Uniques { key, registers })
        }
        kind => Err((
            "malformed",
            format!("set delta of kind {kind} for {key:?} (1: members only, 2: registers only)"),
        )),
    }
}

/// A counter's folded base for the wire; none when no writer was folded.
pub fn folded_to(base: FoldedBase) -> Option<pb::FoldedBase> {
    (base != FoldedBase::default()).then_some(pb::FoldedBase {
        epoch: base.epoch,
        p_low: base.p as u64,
        p_high: (base.p >> 64) as u64,
        n_low: base.n as u64,
        n_high: (base.n >> 64) as u64,
    })
}

/// A folded base from the wire.
pub fn folded_from(base: pb::FoldedBase) -> FoldedBase {
    FoldedBase {
        epoch: base.epoch,
        p: u128::from(base.p_high) << 64 | u128::from(base.p_low),
        n: u128::from(base.n_high) << 64 | u128::from(base.n_low),
    }
}

/// The most slots (writer replicas) a counter from the wire may have. Every
/// node incarnation that ever wrote a counter has a slot in it; a counter
/// with more is refused rather than kept in memory and on disk forever.
pub const MAX_COUNTER_SLOTS: usize = 4_096;
/// The most replica-to-region entries one chunk may carry (the entries are
/// kept forever).
pub const MAX_CHUNK_REPLICAS: usize = 16_384;

/// A chunk from the wire. A malformed chunk is refused whole, with a reason
/// for the log and a short label for the metric: too many counters, slots
/// or directory entries, a bad key, a zero or repeated replica, a region
/// name the node would refuse for itself.
pub fn chunk_from(chunk: pb::PullChunk) -> Result<PullChunk, (&'static str, String)> {
    if chunk.replicas.len() > MAX_CHUNK_REPLICAS {
        return Err((
            "oversized",
            format!(
                "{} replica entries in one chunk; the limit is {MAX_CHUNK_REPLICAS}",
                chunk.replicas.len()
            ),
        ));
    }
    for entry in &chunk.replicas {
        if entry.replica == 0 {
            return Err(("malformed", "a replica entry has the id 0".to_string()));
        }
        check_name("region", &entry.region)
            .map_err(|e| ("malformed", format!("replica {:016x}: {e}", entry.replica)))?;
    }
    if chunk.counters.len() > MAX_CHUNK_COUNTERS {
        return Err((
            "oversized",
            format!(
                "{} counters in one chunk; the limit is {MAX_CHUNK_COUNTERS}",
                chunk.counters.len()
            ),
        ));
    }
    let mut counters = Vec::with_capacity(chunk.counters.len());
    for counter in chunk.counters {
        let key =
            parse_key(&counter.key).map_err(|e| ("malformed", format!("bad counter key: {e}")))?;
        if counter.slots.len() > MAX_COUNTER_SLOTS {
            return Err((
                "oversized",
                format!(
                    "counter {key:?} has {} slots; the limit is {MAX_COUNTER_SLOTS}",
                    counter.slots.len()
                ),
            ));
        }
        let mut ids: Vec<u64> = counter.slots.iter().map(|slot| slot.replica).collect();
        ids.sort_unstable();
        if ids.first() == Some(&0) || ids.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err((
                "malformed",
                format!("counter {key:?} has a zero or repeated replica id"),
            ));
        }
        let mut slots = Vec::with_capacity(counter.slots.len());
        for slot in counter.slots {
            slots.push((
                ReplicaId(slot.replica),
                Slot {
                    p: slot.p,
                    n: slot.n,
                },
            ));
        }
        let base = counter.folded.map(folded_from).unwrap_or_default();
        counters.push((key, PnCounter::from_parts(slots, base)));
    }
    let next = cursor_from(chunk.next).map_err(|e| ("malformed", e))?;
    let elements: usize = chunk
        .set_deltas
        .iter()
        .map(|d| d.members.len() + d.registers.len())
        .sum();
    if elements > MAX_CHUNK_ELEMENTS {
        return Err((
            "oversized",
            format!("{elements} set members and registers in one chunk; the limit is {MAX_CHUNK_ELEMENTS}"),
        ));
    }
    let deltas = chunk
        .set_deltas
        .into_iter()
        .map(delta_from)
        .collect::<Result<Vec<_>, _>>()?;
    if chunk.records.len() > MAX_CHUNK_RECORDS {
        return Err((
            "oversized",
            format!(
                "{} idempotency records in one chunk; the limit is {MAX_CHUNK_RECORDS}",
                chunk.records.len()
            ),
        ));
    }
    Ok(PullChunk {
        source: ReplicaId(chunk.source_replica),
        counters,
        replicas: chunk
            .replicas
            .into_iter()
            .map(|r| (ReplicaId(r.replica), r.region))
            .collect(),
        next,
        complete: chunk.complete,
        directory_digest: chunk.directory_digest,
        // A source without a delta log never says so: nothing more to wait for.
        deltas_complete: chunk.deltas_complete || chunk.deltas_next.is_none(),
        deltas,
        deltas_next: chunk.deltas_next.map(|bytes| DeltaCursor(bytes.to_vec())),
        records: chunk.records.into_iter().map(record_from).collect(),
        id_keys: chunk.id_keys.iter().map(id_key_from).collect(),
        // A source that serves no records never says so either.
        records_complete: chunk.records_complete || chunk.records_next.is_none(),
        served: chunk
            .served
            .map(partition_set_from)
            .transpose()
            .map_err(|e| ("malformed", format!("bad served partitions: {e}")))?,
        records_next: chunk.records_next.map(|seq| RecordsCursor {
            seq,
            skip: chunk.records_next_skip,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::Key;

    #[test]
    fn chunks_round_trip() {
        let chunk = PullChunk {
            source: ReplicaId(3),
            counters: vec![
                (
                    Key::from("a"),
                    PnCounter::from_slots([(ReplicaId(3), Slot { p: 4, n: 1 })]),
                ),
                (
                    Key::from("b"),
                    PnCounter::from_parts(
                        [(ReplicaId(3), Slot { p: 4, n: 1 })],
                        FoldedBase {
                            epoch: 3,
                            p: u128::from(u64::MAX) * 3,
                            n: 7,
                        },
                    ),
                ),
            ],
            replicas: vec![(ReplicaId(3), "eu".into())],
            next: Cursor {
                seq: 9,
                key: "a".into(),
            },
            complete: false,
            directory_digest: Some(5),
            deltas: vec![
                SetDelta::Likes {
                    key: Key::from("post"),
                    members: vec![("sam".into(), 3)],
                },
                SetDelta::Uniques {
                    key: Key::from("seen"),
                    registers: vec![(16383, 51)],
                },
            ],
            deltas_next: Some(DeltaCursor(vec![0, 0, 0, 0, 0, 0, 0, 4, 1, b'p'])),
            deltas_complete: false,
            records: vec![IdempotencyRecord {
                id: u128::MAX - 5,
                fingerprint: 7,
                value: i64::MIN,
                seq: 0,
                expires_at_ms: 99,
                partition: None,
            }],
            id_keys: vec![u128::MAX / 3, 1],
            records_next: Some(RecordsCursor { seq: 12, skip: 3 }),
            records_complete: false,
            served: Some({
                let mut set = PartitionSet::empty(PartitionCount::new(1024).unwrap());
                set.extend([
                    crate::partition::Partition(3),
                    crate::partition::Partition(1023),
                ]);
                set
            }),
        };
        assert_eq!(chunk_from(chunk_to(&chunk)).unwrap(), chunk);
    }

    #[test]
    fn pull_scopes_round_trip_and_a_malformed_one_is_refused() {
        let mut scope = PartitionSet::empty(PartitionCount::new(16).unwrap());
        scope.extend([crate::partition::Partition(15)]);
        let request = PullRequest {
            cluster_id: "c".into(),
            caller: ReplicaId(2),
            expected: None,
            after: Cursor::default(),
            max_bytes: 100,
            directory_digest: None,
            protocol: ProtocolWindow::default(),
            deltas_after: None,
            records_from: None,
            scope: Some(scope),
        };
        assert_eq!(
            pull_request_from(pull_request_to(&request), 100).unwrap(),
            request
        );
        for (partitions, hex) in [(16, "000001"), (16, "zz"), (0, "")] {
            let mut wire = pull_request_to(&request);
            wire.scope = Some(pb::PartitionSet {
                partitions,
                hex: hex.into(),
            });
            let status = pull_request_from(wire, 100).unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument);
            assert!(status.message().starts_with("bad pull scope"), "{status:?}");
        }
    }

    #[test]
    fn malformed_chunks_are_refused() {
        let mut wire = chunk_to(&PullChunk::default());
        wire.counters.push(pb::CounterState {
            key: vec![0xff].into(),
            slots: vec![],
            folded: None,
        });
        assert_eq!(chunk_from(wire.clone()).unwrap_err().0, "malformed");
        wire.counters[0].key = b"ok".to_vec().into();
        wire.counters[0].slots = vec![
            pb::Slot {
                replica: 1,
                p: 1,
                n: 0,
            },
            pb::Slot {
                replica: 1,
                p: 2,
                n: 0,
            },
        ];
        assert_eq!(chunk_from(wire).unwrap_err().0, "malformed");
    }

    fn slots(count: u64) -> Vec<pb::Slot> {
        (1..=count)
            .rev()
            .map(|replica| pb::Slot {
                replica,
                p: replica,
                n: 0,
            })
            .collect()
    }

    #[test]
    fn counters_with_too_many_slots_are_refused() {
        let mut wire = chunk_to(&PullChunk::default());
        wire.counters.push(pb::CounterState {
            key: b"big".to_vec().into(),
            slots: slots(MAX_COUNTER_SLOTS as u64),
            folded: None,
        });
        let chunk = chunk_from(wire.clone()).expect("a counter at the limit");
        let counter = &chunk.counters[0].1;
        assert_eq!(counter.slots().len(), MAX_COUNTER_SLOTS);
        assert!(counter.slots().windows(2).all(|w| w[0].0 < w[1].0));
        wire.counters[0].slots = slots(MAX_COUNTER_SLOTS as u64 + 1);
        let (label, reason) = chunk_from(wire).unwrap_err();
        assert_eq!(label, "oversized", "{reason}");
        assert!(reason.contains("slots"), "{reason}");
    }

    #[test]
    fn directory_entries_are_checked_as_the_node_checks_its_own() {
        let entry = |replica: u64, region: &str| pb::ReplicaInfo {
            replica,
            region: region.into(),
        };
        let mut wire = chunk_to(&PullChunk::default());
        wire.replicas = vec![entry(1, "eu-west-1")];
        assert!(chunk_from(wire.clone()).is_ok());
        for bad in ["", "a b", "x\u{0}y", &"r".repeat(65), "<script>"] {
            wire.replicas = vec![entry(1, bad)];
            let (label, reason) = chunk_from(wire.clone()).unwrap_err();
            assert_eq!(label, "malformed", "{bad:?}: {reason}");
            assert!(reason.contains("region"), "{reason}");
        }
        wire.replicas = vec![entry(0, "eu")];
        assert_eq!(chunk_from(wire.clone()).unwrap_err().0, "malformed");
        wire.replicas = (1..=MAX_CHUNK_REPLICAS as u64 + 1)
            .map(|replica| entry(replica, "eu"))
            .collect();
        assert_eq!(chunk_from(wire).unwrap_err().0, "oversized");
    }
}
