//! The JSON API of counters under `/v1/`: add, get (with the per-region
//! breakdown, and the live writers' slots with the folded base, on request),
//! batch add and batch get. Each handler calls the gRPC `Counters` service
//! in-process ([`crate::api::CountersService`]), so it answers exactly as
//! gRPC does: the same validation and messages, the same idempotency (the
//! `Idempotency-Key` header is gRPC's `idempotency_key`), and, in a region
//! of several nodes, the same routing: a key this node does not own is
//! forwarded to its first live owner, and a batch is split by owner.
//! Errors are problem documents with the gRPC code's meaning
//! ([`super::problem`]).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use prost::bytes::Bytes;
use tally_proto::v1 as pb;
use tally_proto::v1::counters_server::Counters;
use tonic::{Request, Status};

use super::extract::{CounterKey, IdempotencyKey, JsonBody, QueryParams};
use super::problem::Problem;
use super::HttpState;
use crate::api::counters::{check_batch_size, MAX_BATCH_ITEMS};
use crate::api::forward::OWNER_HEADER;
use crate::security::ItemCharge;

/// When an add asks to be acknowledged. The node applies the stronger of
/// this and its own `--durability` (async < sync < replicated), so a request
/// can ask for more than the node's default, never less.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AddDurability {
    /// Once the group commit that holds it is on this node's disk.
    Sync,
    /// Once it is on this node's disk and on the other copies of its region
    /// (`--write-copies`): a lost disk loses no acknowledged add. Too few
    /// copies within 5 s: 503, and the add's outcome is unknown (retry it
    /// with the same `Idempotency-Key`).
    Replicated,
    /// As soon as it is applied in memory (only weaker than the node's
    /// default on a node whose default is async: the stronger mode wins).
    Async,
}

/// The gRPC field of an asked durability. `async` is never stronger than
/// a node's own mode, so it asks for nothing: the node's own applies, as
/// for no ask at all.
fn wire_durability(asked: Option<AddDurability>) -> i32 {
    let wire = match asked {
        None | Some(AddDurability::Async) => pb::Durability::Unspecified,
        Some(AddDurability::Sync) => pb::Durability::Sync,
        Some(AddDurability::Replicated) => pb::Durability::Replicated,
    };
    wire as i32
}

/// The body of an add.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddBody {
    /// The amount to add: non-zero, negative to subtract.
    #[schema(schema_with = non_zero_delta)]
    #[serde(deserialize_with = "super::integer::deserialize")]
    pub delta: i64,
    /// Optional: when to acknowledge (default: the node's `--durability`).
    #[serde(default)]
    pub durability: Option<AddDurability>,
}

/// The answer to an add.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AddResult {
    /// The counter's name.
    pub key: String,
    /// The counter's value on this node right after the add.
    pub value: i64,
    /// True when the `Idempotency-Key` had been seen: nothing was added now
    /// and `value` is the one the first request got.
    pub duplicate: bool,
}

/// A counter's value on the answering node.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CounterValue {
    /// The counter's name.
    pub key: String,
    /// The sum of every region's part (0 for a counter never written).
    pub value: i64,
    /// Present when asked for (`breakdown=true`): one entry per region that
    /// ever wrote the counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<Vec<RegionValue>>,
    /// Present when asked for (`slots=true`): one entry per writer whose
    /// slot the counter holds, in replica id order. Read from the same state
    /// as `value` and `folded`: `value` is `folded.p - folded.n` plus every
    /// slot's `p - n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<Vec<WriterSlot>>,
    /// Present when asked for (`slots=true`): the sums of the writers
    /// retired and folded into the counter (all zero when none was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folded: Option<FoldedSums>,
}

/// One live writer's slot in a counter (as `tally get --slots --json`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WriterSlot {
    /// The writing replica's id: 16 hex digits, as in `tally status`.
    #[schema(pattern = "^[0-9a-f]{16}$", min_length = 16, max_length = 16)]
    pub replica: String,
    /// Its region, or `unknown` when the answering node has not learned it.
    pub region: String,
    /// The sum of its increments.
    pub p: u64,
    /// The sum of its decrements (a positive number).
    pub n: u64,
}

/// The sums of a counter's folded writers: retired writers whose slots were
/// moved into the counter's base (DESIGN.md, "Retiring replicas").
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FoldedSums {
    /// The fold epoch the sums are complete up to (0: nothing folded).
    pub epoch: u64,
    /// The sum of the folded writers' increments (may exceed 64 bits).
    #[schema(schema_with = unsigned_sum)]
    pub p: u128,
    /// The sum of the folded writers' decrements (may exceed 64 bits).
    #[schema(schema_with = unsigned_sum)]
    pub n: u128,
}

/// One region's part of a counter.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RegionValue {
    /// The region's name.
    pub region: String,
    /// The region's contribution: its increments minus its decrements.
    pub value: i64,
    /// The sum of the region's increments.
    pub increments: u64,
    /// The sum of the region's decrements (a positive number).
    pub decrements: u64,
    /// True for the region of the node that answered: its part is exact.
    pub local: bool,
    /// Milliseconds since this node last completed a sync with that region;
    /// absent for the local region and a region never synced with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_last_sync_ms: Option<u64>,
}

/// The query of a read.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct GetQuery {
    /// Also return the per-region breakdown and how fresh each part is.
    #[serde(default)]
    pub breakdown: bool,
    /// Also return the live writers' slots and the folded base (`slots`
    /// and `folded`), read from the same state as the value.
    #[serde(default)]
    pub slots: bool,
}

/// One add of a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAddItem {
    /// The counter's name (checked per item: a bad one fails that item only).
    pub key: String,
    /// The amount to add (non-zero; checked per item).
    #[serde(deserialize_with = "super::integer::deserialize")]
    pub delta: i64,
    /// Optional: as the `Idempotency-Key` header of a single add.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Optional: when to acknowledge this add (the stronger of this, the
    /// batch's and the node's own applies).
    #[serde(default)]
    pub durability: Option<AddDurability>,
}

/// Many adds, each applied and answered on its own.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAddBody {
    /// The adds, at most 10,000.
    #[schema(max_items = 10_000)]
    pub adds: Vec<BatchAddItem>,
    /// Optional: when to acknowledge every add of the batch (default: the
    /// node's `--durability`; an item may ask for a stronger one).
    #[serde(default)]
    pub durability: Option<AddDurability>,
}

/// The answer to one add of a batch: exactly one of `ok` and `error`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchAddOutcome {
    /// The add was applied (or was a duplicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<AddResult>,
    /// The add failed and nothing changed; `status` is what a single add would have got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// The answers to a batch add, in request order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchAddResults {
    /// One per add, in request order.
    pub results: Vec<BatchAddOutcome>,
}

/// One read of a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchGetItem {
    /// The counter's name (checked per item).
    pub key: String,
    /// Also return the per-region breakdown.
    #[serde(default)]
    pub breakdown: bool,
}

/// Many reads, each answered on its own.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchGetBody {
    /// The reads, at most 10,000.
    #[schema(max_items = 10_000)]
    pub gets: Vec<BatchGetItem>,
}

/// The answer to one read of a batch: exactly one of `ok` and `error`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchGetOutcome {
    /// The counter's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<CounterValue>,
    /// Why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// The answers to a batch get, in request order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchGetResults {
    /// One per read, in request order.
    pub results: Vec<BatchGetOutcome>,
}

/// The schema of a delta: a non-zero signed 64-bit integer, stated as two
/// ranges so that a client generated from the schema never sends 0.
fn non_zero_delta() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type};
    let range = |min: i64, max: i64| {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(min))
            .maximum(Some(max))
    };
    OneOfBuilder::new()
        .item(range(1, i64::MAX))
        .item(range(i64::MIN, -1))
        .description(Some("A non-zero amount; negative to subtract."))
        .into()
}

/// The schema of a folded sum: a JSON integer from 0 up to 2^128 - 1 (the
/// sum of many writers' `u64` sums).
fn unsigned_sum() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(0))
        .description(Some(
            "A sum over the folded writers (p: increments, n: decrements); it may exceed 64 bits.",
        ))
        .into()
}

/// The response header naming the owners that served a request this node
/// forwarded (gRPC's `tally-owner`): the key lives on another node.
pub const OWNER_HINT: &str = "tally-owner";

/// The [`OWNER_HINT`] header of a forwarded answer (none when served here).
fn owner_hint<T>(answer: &tonic::Response<T>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let owners = answer
        .metadata()
        .get(OWNER_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| HeaderValue::from_str(value).ok());
    if let Some(owners) = owners {
        headers.insert(OWNER_HINT, owners);
    }
    headers
}

fn add_result(key: String, answer: pb::AddResponse) -> AddResult {
    AddResult {
        key,
        value: answer.value,
        duplicate: answer.duplicate,
    }
}

/// The JSON of a `Get` answer; `slots` (with the folded base) when asked.
fn counter_value(
    key: String,
    answer: pb::GetResponse,
    breakdown: bool,
    slots: bool,
) -> CounterValue {
    CounterValue {
        key,
        value: answer.value,
        regions: breakdown.then(|| {
            answer
                .regions
                .into_iter()
                .map(|part| RegionValue {
                    region: part.region,
                    value: part.value,
                    increments: part.increments,
                    decrements: part.decrements,
                    local: part.local,
                    since_last_sync_ms: part.since_last_sync_ms,
                })
                .collect()
        }),
        slots: slots.then(|| answer.slots.into_iter().map(writer_slot).collect()),
        folded: slots.then(|| folded_sums(answer.folded.unwrap_or_default())),
    }
}

fn writer_slot(writer: pb::WriterSlot) -> WriterSlot {
    WriterSlot {
        replica: format!("{:016x}", writer.replica),
        region: writer.region,
        p: writer.p,
        n: writer.n,
    }
}

fn folded_sums(base: pb::FoldedSums) -> FoldedSums {
    let wide = |low: u64, high: u64| (u128::from(high) << 64) | u128::from(low);
    FoldedSums {
        epoch: base.epoch,
        p: wide(base.p_low, base.p_high),
        n: wide(base.n_low, base.n_high),
    }
}

/// The problem of a batch item's error.
fn item_problem(error: pb::Error) -> Problem {
    Problem::of_status(&Status::new(tonic::Code::from(error.code), error.message))
}

#[utoipa::path(
    post,
    path = "/v1/counters/{key}",
    tag = "counters",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256,
         description = "The counter's name: UTF-8, 1 to 256 bytes (percent-encoded in the path)."),
        ("Idempotency-Key" = Option<String>, Header, max_length = 128,
         description = "Optional. A retry with the same key (and the same counter and delta) \
                        returns the first answer and changes nothing. At most 128 bytes."),
    ),
    request_body = AddBody,
    responses(
        (status = 200, description = "Added (or a duplicate of an add already applied).", body = AddResult,
         headers(("Tally-Owner" = String, description = "When this node forwarded the add: the node that owns the key and served it."))),
        (status = 400, description = "A bad key, delta, body or Idempotency-Key.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The add would overflow the counter; nothing changed.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Idempotency-Key was used for another add.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The node cannot take adds now, or (durability replicated) too few copies confirmed the add in time: its outcome is unknown, retry it with the same Idempotency-Key.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 413, 415, 429, 507).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn add(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
    idempotency: IdempotencyKey,
    JsonBody(body): JsonBody<AddBody>,
) -> Result<(HeaderMap, Json<AddResult>), Problem> {
    let add = pb::AddRequest {
        key: Bytes::from(key.clone()),
        delta: body.delta,
        idempotency_key: idempotency.0.unwrap_or_default(),
        durability: wire_durability(body.durability),
    };
    let answer = state
        .counters
        .add(Request::new(add))
        .await
        .map_err(|status| Problem::of_status(&status))?;
    Ok((
        owner_hint(&answer),
        Json(add_result(key, answer.into_inner())),
    ))
}

/// Reads one counter.
#[utoipa::path(
    get,
    path = "/v1/counters/{key}",
    tag = "counters",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256,
         description = "The counter's name: UTF-8, 1 to 256 bytes (percent-encoded in the path)."),
        GetQuery,
    ),
    responses(
        (status = 200, description = "The counter's value on its first live owner (this node, or the one it forwarded the read to).", body = CounterValue,
         headers(("Tally-Owner" = String, description = "When this node forwarded the read: the node that owns the key and served it."))),
        (status = 400, description = "A bad key or query (`breakdown` and `slots` take `true` or `false`).", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
    QueryParams(query): QueryParams<GetQuery>,
) -> Result<(HeaderMap, Json<CounterValue>), Problem> {
    let get = pb::GetRequest {
        key: Bytes::from(key.clone()),
        breakdown: query.breakdown,
        slots: query.slots,
    };
    let answer = state
        .counters
        .get(Request::new(get))
        .await
        .map_err(|status| Problem::of_status(&status))?;
    let hint = owner_hint(&answer);
    let value = counter_value(key, answer.into_inner(), query.breakdown, query.slots);
    Ok((hint, Json(value)))
}

/// Charges a batch's items beyond the first to the caller's token.
pub(super) fn charge_items(charge: Option<axum::Extension<ItemCharge>>, items: usize) {
    if let Some(axum::Extension(charge)) = charge {
        charge.charge(items.saturating_sub(1));
    }
}

/// Adds to many counters; each add gets its own result, in request order.
#[utoipa::path(
    post,
    path = "/v1/batch/add",
    tag = "counters",
    request_body = BatchAddBody,
    responses(
        (status = 200, description = "One outcome per add, in request order.", body = BatchAddResults),
        (status = 400, description = "A body that is not a batch, or more than 10,000 items.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 413, 415, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn batch_add(
    State(state): State<HttpState>,
    charge: Option<axum::Extension<ItemCharge>>,
    JsonBody(body): JsonBody<BatchAddBody>,
) -> Result<Json<BatchAddResults>, Problem> {
    charge_items(charge, body.adds.len());
    check_batch_size(body.adds.len()).map_err(|status| Problem::invalid(status.message()))?;
    let keys: Vec<String> = body.adds.iter().map(|add| add.key.clone()).collect();
    let batch = pb::AddBatchRequest {
        adds: body
            .adds
            .into_iter()
            .map(|add| pb::AddRequest {
                key: Bytes::from(add.key),
                delta: add.delta,
                idempotency_key: add.idempotency_key.unwrap_or_default(),
                durability: wire_durability(add.durability),
            })
            .collect(),
        durability: wire_durability(body.durability),
    };
    let answers = state
        .counters
        .add_batch(Request::new(batch))
        .await
        .map_err(|status| Problem::of_status(&status))?;
    let results = keys
        .into_iter()
        .zip(answers.into_inner().results)
        .map(|(key, result)| match result.outcome {
            Some(pb::add_result::Outcome::Ok(answer)) => BatchAddOutcome {
                ok: Some(add_result(key, answer)),
                error: None,
            },
            Some(pb::add_result::Outcome::Error(error)) => BatchAddOutcome {
                ok: None,
                error: Some(item_problem(error)),
            },
            None => BatchAddOutcome {
                ok: None,
                error: Some(Problem::new(
                    tonic::Code::Internal,
                    "no answer for this item",
                )),
            },
        })
        .collect();
    Ok(Json(BatchAddResults { results }))
}

/// Reads many counters; each read gets its own result, in request order.
#[utoipa::path(
    post,
    path = "/v1/batch/get",
    tag = "counters",
    request_body = BatchGetBody,
    responses(
        (status = 200, description = "One outcome per read, in request order.", body = BatchGetResults),
        (status = 400, description = "A body that is not a batch, or more than 10,000 items.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 413, 415, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn batch_get(
    State(state): State<HttpState>,
    charge: Option<axum::Extension<ItemCharge>>,
    JsonBody(body): JsonBody<BatchGetBody>,
) -> Result<Json<BatchGetResults>, Problem> {
    charge_items(charge, body.gets.len());
    check_batch_size(body.gets.len()).map_err(|status| Problem::invalid(status.message()))?;
    let asked: Vec<(String, bool)> = body
        .gets
        .iter()
        .map(|get| (get.key.clone(), get.breakdown))
        .collect();
    let batch = pb::GetBatchRequest {
        gets: body
            .gets
            .into_iter()
            .map(|get| pb::GetRequest {
                key: Bytes::from(get.key),
                breakdown: get.breakdown,
                slots: false,
            })
            .collect(),
    };
    let answers = state
        .counters
        .get_batch(Request::new(batch))
        .await
        .map_err(|status| Problem::of_status(&status))?;
    let results = asked
        .into_iter()
        .zip(answers.into_inner().results)
        .map(|((key, breakdown), result)| match result.outcome {
            Some(pb::get_result::Outcome::Ok(answer)) => BatchGetOutcome {
                ok: Some(counter_value(key, answer, breakdown, false)),
                error: None,
            },
            Some(pb::get_result::Outcome::Error(error)) => BatchGetOutcome {
                ok: None,
                error: Some(item_problem(error)),
            },
            None => BatchGetOutcome {
                ok: None,
                error: Some(Problem::new(
                    tonic::Code::Internal,
                    "no answer for this item",
                )),
            },
        })
        .collect();
    Ok(Json(BatchGetResults { results }))
}

const _: () = assert!(
    MAX_BATCH_ITEMS == 10_000,
    "the schema's max_items says 10,000"
);
