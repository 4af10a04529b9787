//! The wire side of replicated durability: the `Copy` RPC's conversions and
//! handler, the `durability` field of adds, and the call deadline a
//! replicated add waits within.
//!
//! Invariant: a malformed push (bad key, zero replica, region name the node
//! would refuse) is refused whole with `INVALID_ARGUMENT` and merges nothing;
//! a push is answered `OK` only once every slot of it is durable here.

use std::time::Duration;

use tally_proto::v1 as pb;
use tonic::{Code, Status};

use super::convert::{folded_from, folded_to, id_key_from, id_key_to, record_from, record_to};
use crate::crdt::{ReplicaId, Slot};
use crate::engine::{Durability, Engine};
use crate::replica::version::ProtocolWindow;
use crate::replica::{
    check_name, parse_key, CopyPush, CopyRefused, MAX_CHUNK_RECORDS, MAX_PUSH_COUNTERS,
};

/// A push from the wire. A malformed one is refused whole.
pub fn copy_request_from(request: pb::CopyRequest) -> Result<CopyPush, Status> {
    if request.source_replica == 0 {
        return Err(Status::invalid_argument(
            "a copy push must name its source replica (0 is no replica)",
        ));
    }
    check_name("region", &request.source_region)
        .map_err(|e| Status::invalid_argument(format!("copy push: {e}")))?;
    if request.counters.len() > MAX_PUSH_COUNTERS {
        return Err(Status::invalid_argument(format!(
            "a copy push of {} counters is too large; the limit is {MAX_PUSH_COUNTERS}",
            request.counters.len()
        )));
    }
    if request.records.len() > MAX_CHUNK_RECORDS {
        return Err(Status::invalid_argument(format!(
            "a copy push of {} idempotency records is too large; the limit is {MAX_CHUNK_RECORDS}",
            request.records.len()
        )));
    }
    let mut counters = Vec::with_capacity(request.counters.len());
    for counter in request.counters {
        let key = parse_key(&counter.key)
            .map_err(|e| Status::invalid_argument(format!("copy push: bad counter key: {e}")))?;
        counters.push((
            key,
            Slot {
                p: counter.p,
                n: counter.n,
            },
            counter.folded.map(folded_from).unwrap_or_default(),
        ));
    }
    Ok(CopyPush {
        cluster_id: request.cluster_id,
        source: ReplicaId(request.source_replica),
        region: request.source_region,
        upto_seq: request.upto_seq,
        counters,
        protocol: ProtocolWindow::announced(request.protocol_oldest, request.protocol_version),
        id_keys: request.id_keys.iter().map(id_key_from).collect(),
        records: request.records.into_iter().map(record_from).collect(),
    })
}

/// A push for the wire.
pub fn copy_request_to(push: &CopyPush) -> pb::CopyRequest {
    pb::CopyRequest {
        cluster_id: push.cluster_id.clone(),
        source_replica: push.source.0,
        source_region: push.region.clone(),
        upto_seq: push.upto_seq,
        counters: push
            .counters
            .iter()
            .map(|(key, slot, base)| pb::CopiedSlot {
                key: key.as_bytes().to_vec().into(),
                p: slot.p,
                n: slot.n,
                folded: folded_to(*base),
            })
            .collect(),
        protocol_version: push.protocol.newest,
        protocol_oldest: push.protocol.oldest,
        records: push.records.iter().map(record_to).collect(),
        id_keys: push.id_keys.iter().map(|key| id_key_to(*key)).collect(),
    }
}

/// The status of a refused push.
pub fn copy_status(refused: &CopyRefused) -> Status {
    let code = match refused {
        CopyRefused::WrongCluster { .. } => Code::PermissionDenied,
        CopyRefused::IncompatibleProtocol { .. }
        | CopyRefused::FromItself(_)
        | CopyRefused::OtherRegion { .. }
        | CopyRefused::RegionConflict { .. }
        | CopyRefused::Unmergeable { .. }
        | CopyRefused::NotHeld { .. } => Code::FailedPrecondition,
        CopyRefused::Oversized(_)
        | CopyRefused::OversizedRecords(_)
        | CopyRefused::DuplicateKey(_) => Code::InvalidArgument,
        CopyRefused::Storage(_) => Code::Unavailable,
    };
    Status::new(code, refused.to_string())
}

/// The short label of a refusal, for the refused-messages metric.
pub fn copy_refusal_reason(refused: &CopyRefused) -> &'static str {
    match refused {
        CopyRefused::WrongCluster { .. } => "wrong_cluster",
        CopyRefused::IncompatibleProtocol { theirs, .. } => {
            crate::replica::version::ProtocolWindow::refusal_reason(theirs)
        }
        CopyRefused::FromItself(_) | CopyRefused::OtherRegion { .. } => "wrong_copy",
        CopyRefused::RegionConflict { .. } => "region_conflict",
        CopyRefused::Oversized(_) | CopyRefused::OversizedRecords(_) => "oversized",
        CopyRefused::DuplicateKey(_) => "malformed",
        CopyRefused::Unmergeable { .. } => "unmergeable",
        CopyRefused::NotHeld { .. } => "not_held",
        CopyRefused::Storage(_) => "storage",
    }
}

/// The durability an add asks for: `None` for the node's default.
pub fn durability_from(field: i32) -> Result<Option<Durability>, Status> {
    match pb::Durability::try_from(field) {
        Ok(pb::Durability::Unspecified) => Ok(None),
        Ok(pb::Durability::Sync) => Ok(Some(Durability::Sync)),
        Ok(pb::Durability::Replicated) => Ok(Some(Durability::Replicated)),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown durability {field}: use 0 (the node's default), 1 (sync) or 2 (replicated)"
        ))),
    }
}

/// How long a replicated add of this call may wait for its copies: the
/// call's gRPC timeout less a margin (so that the caller gets the node's
/// answer, naming the copies reached, rather than its own timeout), or
/// `None` when the call carries none.
pub fn deadline_of(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    let timeout = parse_grpc_timeout(text)?;
    let margin = (timeout / 10).max(Duration::from_millis(100));
    Some(timeout.saturating_sub(margin))
}

/// When the caller's deadline (`grpc-timeout`, counted from the request's
/// arrival as [`crate::security::auth::Received`] marks it) ends, if it set
/// one.
pub fn admission_deadline<T>(request: &tonic::Request<T>) -> Option<tokio::time::Instant> {
    let text = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let timeout = parse_grpc_timeout(text)?;
    let received = request
        .extensions()
        .get::<crate::security::auth::Received>()
        .map_or_else(tokio::time::Instant::now, |received| received.0);
    Some(received + timeout)
}

/// Refuses a write whose caller's deadline passed before it was admitted:
/// `DEADLINE_EXCEEDED`, and nothing is applied. Once admitted, a write
/// completes whatever the deadline (its outcome is then the caller's to
/// learn, by a retry with the same idempotency key).
pub fn refuse_if_late(admit_by: Option<tokio::time::Instant>) -> Result<(), Status> {
    match admit_by {
        Some(deadline) if tokio::time::Instant::now() >= deadline => {
            Err(Status::deadline_exceeded(
                "the call's deadline (grpc-timeout) passed before the node admitted it; \
                 nothing was applied: send it again with a longer deadline",
            ))
        }
        _ => Ok(()),
    }
}

/// A `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m,
/// u, n).
fn parse_grpc_timeout(text: &str) -> Option<Duration> {
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// Serves one `Copy` call.
pub async fn serve(engine: &Engine, request: pb::CopyRequest) -> Result<pb::CopyResponse, Status> {
    let push = copy_request_from(request).inspect_err(|_| {
        engine.metrics().refused("malformed");
    })?;
    engine.serve_copy(&push).await.map_err(|refused| {
        engine.metrics().refused(copy_refusal_reason(&refused));
        tracing::warn!(source = %push.source, %refused, "copy push refused");
        copy_status(&refused)
    })?;
    Ok(pb::CopyResponse {
        copy_replica: engine.core().identity().replica.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crdt::FoldedBase;

    #[tokio::test(start_paused = true)]
    async fn a_write_whose_deadline_passed_before_admission_is_refused() {
        let request = |timeout: &str, arrived: tokio::time::Instant| {
            let mut request = tonic::Request::new(());
            request
                .metadata_mut()
                .insert("grpc-timeout", timeout.parse().unwrap());
            request
                .extensions_mut()
                .insert(crate::security::auth::Received(arrived));
            request
        };
        let arrived = tokio::time::Instant::now();
        let one_ns = admission_deadline(&request("1n", arrived));
        let five_s = admission_deadline(&request("5S", arrived));
        tokio::time::advance(Duration::from_millis(1)).await;
        let refused = refuse_if_late(one_ns).unwrap_err();
        assert_eq!(refused.code(), Code::DeadlineExceeded);
        assert!(
            refused.message().contains("nothing was applied"),
            "{refused}"
        );
        assert!(refuse_if_late(five_s).is_ok());
        assert!(refuse_if_late(admission_deadline(&tonic::Request::new(()))).is_ok());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(refuse_if_late(five_s).is_err());
    }

    fn push() -> CopyPush {
        CopyPush {
            cluster_id: "c".into(),
            source: ReplicaId(7),
            region: "eu".into(),
            upto_seq: 3,
            counters: vec![
                ("likes".into(), Slot { p: 5, n: 1 }, FoldedBase::default()),
                (
                    "views".into(),
                    Slot { p: 2, n: 0 },
                    FoldedBase {
                        epoch: 3,
                        p: u128::from(u64::MAX) + 7,
                        n: 1,
                    },
                ),
            ],
            protocol: ProtocolWindow::at(1, 6),
            records: vec![crate::replica::IdempotencyRecord {
                id: u128::MAX,
                fingerprint: 3,
                value: -4,
                seq: 0,
                expires_at_ms: 1_000,
                partition: None,
            }],
            id_keys: vec![9, u128::MAX - 1],
        }
    }

    #[test]
    fn pushes_round_trip() {
        assert_eq!(copy_request_from(copy_request_to(&push())).unwrap(), push());
    }

    #[test]
    fn malformed_pushes_are_refused_whole() {
        let mut zero = copy_request_to(&push());
        zero.source_replica = 0;
        assert_eq!(
            copy_request_from(zero).unwrap_err().code(),
            Code::InvalidArgument
        );
        let mut bad_key = copy_request_to(&push());
        bad_key.counters[0].key = vec![0xff].into();
        assert_eq!(
            copy_request_from(bad_key).unwrap_err().code(),
            Code::InvalidArgument
        );
        let mut bad_region = copy_request_to(&push());
        bad_region.source_region = String::new();
        assert_eq!(
            copy_request_from(bad_region).unwrap_err().code(),
            Code::InvalidArgument
        );
        let mut flood = copy_request_to(&push());
        flood.records = vec![flood.records[0]; MAX_CHUNK_RECORDS + 1];
        assert_eq!(
            copy_request_from(flood).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn the_durability_field_is_checked() {
        assert_eq!(durability_from(0).unwrap(), None);
        assert_eq!(durability_from(2).unwrap(), Some(Durability::Replicated));
        let refused = durability_from(9).unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(refused.message().contains("replicated"));
    }

    #[test]
    fn grpc_timeouts_parse_and_leave_a_margin() {
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("5X"), None);
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert_eq!(deadline_of(&metadata), None);
        metadata.insert("grpc-timeout", "5S".parse().unwrap());
        assert_eq!(deadline_of(&metadata), Some(Duration::from_millis(4_500)));
        metadata.insert("grpc-timeout", "300m".parse().unwrap());
        assert_eq!(deadline_of(&metadata), Some(Duration::from_millis(200)));
    }
}
