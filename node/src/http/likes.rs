//! Like sets and uniques over JSON (issue 14's types, issue 16's API): a
//! thin shell over the gRPC `Likes` service, called in-process, so the same
//! validation, messages, idempotency and routing (a key this node does not
//! own is forwarded to its owner) apply.
//!
//! - `PUT /v1/likes/{key}/members/{member}` likes, `DELETE` unlikes (a
//!   double tap changes nothing; `Idempotency-Key` as for adds);
//! - `GET /v1/likes/{key}/members/{member}`: 200 when liked, 404 when not;
//! - `GET /v1/likes/{key}`: the count; `GET /v1/likes/{key}/members`: a page
//!   of liked members (`page_token` is the hex of gRPC's token);
//! - `POST /v1/uniques/{key}` observes members; `GET /v1/uniques/{key}` and
//!   `POST /v1/distinct` estimate distinct members.

use crate::hex::{from_hex, to_hex};
use axum::extract::State;
use axum::Json;
use prost::bytes::Bytes;
use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;
use tally_proto::v1::likes_server::Likes;
use tonic::Request;
use utoipa::ToSchema;

use super::extract::{CounterKey, IdempotencyKey, JsonBody, Member, QueryParams};
use super::problem::Problem;
use super::HttpState;

/// The answer to a like or an unlike.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LikeResult {
    /// False when nothing changed (already liked, or not liked to unlike).
    pub changed: bool,
    /// Whether the member likes it now.
    pub liked: bool,
    /// The set's count of liked members now.
    pub count: u64,
    /// True for a retry with an `Idempotency-Key` already applied.
    pub duplicate: bool,
    /// The member's causal length on this node right after the operation
    /// (odd: liked; it only grows, and regions merge it by max); 0 for a
    /// duplicate, whose first answer's length is not kept.
    pub length: u64,
}

/// A member who likes it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LikedResult {
    /// The member.
    pub member: String,
    /// Always true (a member who does not like it is a 404).
    pub liked: bool,
}

/// A like set's count.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LikeCount {
    /// The set's name.
    pub key: String,
    /// Its count of liked members on this node.
    pub count: u64,
}

/// The query of a page of members.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// At most this many members (0 or absent: 1,000, the most; a larger
    /// number means 1,000). Any 32-bit unsigned number is accepted, so the
    /// schema says int64 with its range (utoipa's `u32` would say int32,
    /// which stops at 2^31 - 1).
    #[serde(default)]
    #[param(value_type = u64, minimum = 0, maximum = 4294967295_i64)]
    pub limit: u32,
    /// `next_token` of the previous page, as it came (absent or empty: the
    /// first page). Opaque: the node refuses with 400 a token it did not give.
    #[serde(default)]
    #[param(pattern = "^(01[0-9a-fA-F]{16}([0-9a-fA-F]{2}){1,128})?$")]
    pub page_token: Option<String>,
}

/// A page of liked members.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LikesPage {
    /// Liked members, in member order.
    pub members: Vec<String>,
    /// The token of the next page; absent after the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

/// Members seen by a uniques key.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ObserveBody {
    /// The members (1 to 128 bytes each), at most 10,000.
    #[schema(schema_with = members_schema)]
    pub members: Vec<String>,
}

/// The answer to an observe.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ObserveResult {
    /// Registers raised (0: every member was already counted).
    pub registers_raised: u64,
    /// The key's estimate of distinct members after.
    pub estimate: u64,
}

/// Keys whose distinct members to estimate together.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DistinctBody {
    /// The uniques keys, 1 to 1,000.
    #[schema(schema_with = keys_schema)]
    pub keys: Vec<String>,
}

/// An estimate of distinct members.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DistinctResult {
    /// The estimate (HyperLogLog, about 0.8% standard error).
    pub estimate: u64,
    /// A digest of the merged registers: equal on two nodes means they agree.
    pub registers_digest: String,
}

/// An array of strings of `1..=max_len` characters, `min_items..=max_items` long.
fn strings(max_len: usize, min_items: usize, max_items: usize) -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(max_len)),
        )
        .min_items(Some(min_items))
        .max_items(Some(max_items))
        .into()
}

fn members_schema() -> utoipa::openapi::schema::Schema {
    strings(128, 0, crate::replica::MAX_MEMBERS_PER_CALL)
}

fn keys_schema() -> utoipa::openapi::schema::Schema {
    strings(256, 1, crate::replica::MAX_KEYS_PER_CALL)
}

async fn like_or_unlike(
    state: &HttpState,
    key: &str,
    member: &str,
    like: bool,
    idempotency: &IdempotencyKey,
) -> Result<Json<LikeResult>, Problem> {
    let request = Request::new(pb::LikeRequest {
        key: Bytes::from(key.to_string()),
        member: Bytes::from(member.to_string()),
        idempotency_key: idempotency.as_deref().unwrap_or_default().to_string(),
    });
    let answer = if like {
        state.likes.like(request).await
    } else {
        state.likes.unlike(request).await
    };
    let accepted = answer
        .map_err(|status| Problem::of_status(&status))?
        .into_inner();
    Ok(Json(LikeResult {
        changed: accepted.changed,
        liked: accepted.liked,
        count: accepted.count,
        duplicate: accepted.duplicate,
        length: accepted.length,
    }))
}

/// Likes: the member likes the set's object (once, however often).
#[utoipa::path(
    put,
    path = "/v1/likes/{key}/members/{member}",
    tag = "likes",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256, description = "The like set: UTF-8, 1 to 256 bytes."),
        ("member" = String, Path, min_length = 1, max_length = 128, description = "Who likes: UTF-8, 1 to 128 bytes."),
        ("Idempotency-Key" = Option<String>, Header, max_length = 128, description = "Optional: a retry with the same key is answered as the first."),
    ),
    responses(
        (status = 200, description = "Liked (changed tells whether it was not before).", body = LikeResult),
        (status = 400, description = "A bad key, member or Idempotency-Key.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Idempotency-Key was used for another request, or the cluster does not take like sets yet.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503, 507).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn like(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
    Member(member): Member,
    idempotency: IdempotencyKey,
) -> Result<Json<LikeResult>, Problem> {
    like_or_unlike(&state, &key, &member, true, &idempotency).await
}

/// Unlikes: the member no longer likes it.
#[utoipa::path(
    delete,
    path = "/v1/likes/{key}/members/{member}",
    tag = "likes",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256, description = "The like set: UTF-8, 1 to 256 bytes."),
        ("member" = String, Path, min_length = 1, max_length = 128, description = "Who unlikes: UTF-8, 1 to 128 bytes."),
        ("Idempotency-Key" = Option<String>, Header, max_length = 128, description = "Optional: a retry with the same key is answered as the first."),
    ),
    responses(
        (status = 200, description = "Not liked now (changed tells whether it was).", body = LikeResult),
        (status = 400, description = "A bad key, member or Idempotency-Key.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Idempotency-Key was used for another request, or the cluster does not take like sets yet.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503, 507).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn unlike(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
    Member(member): Member,
    idempotency: IdempotencyKey,
) -> Result<Json<LikeResult>, Problem> {
    like_or_unlike(&state, &key, &member, false, &idempotency).await
}

/// Whether a member likes it.
#[utoipa::path(
    get,
    path = "/v1/likes/{key}/members/{member}",
    tag = "likes",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256, description = "The like set."),
        ("member" = String, Path, min_length = 1, max_length = 128, description = "The member."),
    ),
    responses(
        (status = 200, description = "The member likes it.", body = LikedResult),
        (status = 400, description = "A bad key or member.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The member does not like it (never did, or unliked).", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn liked(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
    Member(member): Member,
) -> Result<Json<LikedResult>, Problem> {
    let request = Request::new(pb::LikedRequest {
        key: Bytes::from(key.clone()),
        members: vec![Bytes::from(member.clone())],
    });
    let liked = state
        .likes
        .liked(request)
        .await
        .map_err(|status| Problem::of_status(&status))?
        .into_inner()
        .liked;
    if !liked.first().copied().unwrap_or(false) {
        // As a starred-repository API answers: the membership is the resource.
        return Err(Problem::new(
            tonic::Code::NotFound,
            format!("{member:?} does not like {key:?}"),
        ));
    }
    Ok(Json(LikedResult {
        liked: true,
        member,
    }))
}

/// A like set's count.
#[utoipa::path(
    get,
    path = "/v1/likes/{key}",
    tag = "likes",
    params(("key" = String, Path, min_length = 1, max_length = 256, description = "The like set.")),
    responses(
        (status = 200, description = "The count of liked members.", body = LikeCount),
        (status = 400, description = "A bad key.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn count(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
) -> Result<Json<LikeCount>, Problem> {
    let request = Request::new(pb::LikeCountRequest {
        key: Bytes::from(key.clone()),
    });
    let count = state
        .likes
        .like_count(request)
        .await
        .map_err(|status| Problem::of_status(&status))?
        .into_inner()
        .count;
    Ok(Json(LikeCount { key, count }))
}

/// A page of the members who like it.
#[utoipa::path(
    get,
    path = "/v1/likes/{key}/members",
    tag = "likes",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256, description = "The like set."),
        PageQuery,
    ),
    responses(
        (status = 200, description = "Liked members in member order, and the next page's token.", body = LikesPage),
        (status = 400, description = "A bad key or page token.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn members(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
    QueryParams(query): QueryParams<PageQuery>,
) -> Result<Json<LikesPage>, Problem> {
    let token = match query.page_token.as_deref() {
        None | Some("") => Vec::new(),
        Some(text) => from_hex(text).ok_or_else(|| {
            Problem::invalid(
                "page_token is not a token this node gave (pass next_token as it came)",
            )
        })?,
    };
    let request = Request::new(pb::ListLikesRequest {
        key: Bytes::from(key),
        limit: query.limit,
        page_token: Bytes::from(token),
    });
    let page = state
        .likes
        .list_likes(request)
        .await
        .map_err(|status| Problem::of_status(&status))?
        .into_inner();
    Ok(Json(LikesPage {
        members: page.members,
        next_token: (!page.next_token.is_empty()).then(|| to_hex(&page.next_token)),
    }))
}

/// Observes members in a uniques key ("seen by").
#[utoipa::path(
    post,
    path = "/v1/uniques/{key}",
    tag = "likes",
    params(("key" = String, Path, min_length = 1, max_length = 256, description = "The uniques key.")),
    request_body = ObserveBody,
    responses(
        (status = 200, description = "Observed; the key's estimate after.", body = ObserveResult),
        (status = 400, description = "A bad key, member or body, or more than 10,000 members.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The cluster does not take uniques yet.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 413, 415, 429, 503, 507).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn observe(
    State(state): State<HttpState>,
    charge: Option<axum::Extension<crate::security::ItemCharge>>,
    CounterKey(key): CounterKey,
    JsonBody(body): JsonBody<ObserveBody>,
) -> Result<Json<ObserveResult>, Problem> {
    super::counters::charge_items(charge, body.members.len());
    let request = Request::new(pb::ObserveRequest {
        key: Bytes::from(key),
        members: body.members.into_iter().map(Bytes::from).collect(),
    });
    let observed = state
        .likes
        .observe(request)
        .await
        .map_err(|status| Problem::of_status(&status))?
        .into_inner();
    Ok(Json(ObserveResult {
        registers_raised: u64::from(observed.registers_raised),
        estimate: observed.estimate,
    }))
}

async fn distinct_of(
    state: &HttpState,
    keys: Vec<String>,
) -> Result<Json<DistinctResult>, Problem> {
    let request = Request::new(pb::DistinctRequest {
        keys: keys.into_iter().map(Bytes::from).collect(),
        with_registers: false,
    });
    let union = state
        .likes
        .distinct(request)
        .await
        .map_err(|status| Problem::of_status(&status))?
        .into_inner();
    Ok(Json(DistinctResult {
        estimate: union.estimate,
        registers_digest: format!("{:016x}", union.registers_digest),
    }))
}

/// One uniques key's estimate of distinct members.
#[utoipa::path(
    get,
    path = "/v1/uniques/{key}",
    tag = "likes",
    params(("key" = String, Path, min_length = 1, max_length = 256, description = "The uniques key.")),
    responses(
        (status = 200, description = "The estimate.", body = DistinctResult),
        (status = 400, description = "A bad key.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn estimate(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
) -> Result<Json<DistinctResult>, Problem> {
    distinct_of(&state, vec![key]).await
}

/// The distinct members of several uniques keys together.
#[utoipa::path(
    post,
    path = "/v1/distinct",
    tag = "likes",
    request_body = DistinctBody,
    responses(
        (status = 200, description = "The estimate of the union.", body = DistinctResult),
        (status = 400, description = "A bad key or body, or not 1 to 1,000 keys.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 413, 415, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn distinct(
    State(state): State<HttpState>,
    JsonBody(body): JsonBody<DistinctBody>,
) -> Result<Json<DistinctResult>, Problem> {
    distinct_of(&state, body.keys).await
}
