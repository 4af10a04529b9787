//! The seed design's REST API, literally (`shared/seeds/004`):
//!
//! - `POST /v1/counter/` with `object_id` and `activity_type` returns a
//!   `counter_id`. It is formed as `ACTIVITY_TYPE:OBJECT_ID` (e.g.
//!   `like:dQw4w9WgXcQ`) and is the counter's key: any Tally API reads the same
//!   counter under it. Forming it changes nothing (every counter exists, at 0).
//!   `activity_type` is 1 to 32 of `a-z 0-9 _ -` (so the `:` is unambiguous)
//!   and `object_id` 1 to 200 printable ASCII characters without spaces, so
//!   an id is at most 233 bytes, within a key's 256.
//! - `PUT /v1/counter/` with a `counter_id` increments it by one (with an
//!   optional `Idempotency-Key`, as the seed's "future improvements" ask)
//!   and returns nothing (204).
//! - `GET /v1/counter/?counter_id=...` returns `{"value": ...}`.
//!
//! A `counter_id` that `POST` could not have formed is a 400 with the rule.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use prost::bytes::Bytes;
use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;
use tally_proto::v1::counters_server::Counters;
use tonic::Request;
use utoipa::ToSchema;

use super::extract::{IdempotencyKey, JsonBody, QueryParams};
use super::problem::Problem;
use super::HttpState;

/// The longest `activity_type`.
pub const MAX_ACTIVITY_TYPE: usize = 32;
/// The longest `object_id`.
pub const MAX_OBJECT_ID: usize = 200;

/// What a counter counts: the seed's `POST /v1/counter/` parameters.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCounter {
    /// The id of the object this counter is associated to (a video, a post):
    /// 1 to 200 printable ASCII characters, no spaces.
    #[schema(min_length = 1, max_length = 200, pattern = "^[!-~]+$")]
    pub object_id: String,
    /// The type of activity this counter captures (`like`, `view`): 1 to 32
    /// of `a-z`, `0-9`, `_` and `-`.
    #[schema(min_length = 1, max_length = 32, pattern = "^[a-z0-9_-]+$")]
    pub activity_type: String,
}

/// A counter's id, as `POST /v1/counter/` returns it and `PUT` takes it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CounterId {
    /// `ACTIVITY_TYPE:OBJECT_ID`; the counter's key in every Tally API.
    #[schema(pattern = "^[a-z0-9_-]{1,32}:[!-~]{1,200}$")]
    pub counter_id: String,
}

/// The seed's answer to `GET /v1/counter/`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SeedValue {
    /// The counter's value on this node.
    pub value: i64,
}

/// The query of `GET /v1/counter/`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CounterIdQuery {
    /// A `counter_id` from `POST /v1/counter/`.
    #[param(pattern = "^[a-z0-9_-]{1,32}:[!-~]{1,200}$")]
    pub counter_id: String,
}

fn is_activity_type(text: &str) -> bool {
    (1..=MAX_ACTIVITY_TYPE).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn is_object_id(text: &str) -> bool {
    (1..=MAX_OBJECT_ID).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_graphic())
}

/// Checks a counter id; the error says what a valid one looks like.
pub fn check_counter_id(counter_id: &str) -> Result<(), Problem> {
    match counter_id.split_once(':') {
        Some((activity, object)) if is_activity_type(activity) && is_object_id(object) => Ok(()),
        _ => Err(Problem::invalid(format!(
            "{counter_id:?} is not a counter_id: it must be ACTIVITY_TYPE:OBJECT_ID as \
             POST /v1/counter/ returns it (ACTIVITY_TYPE is 1 to {MAX_ACTIVITY_TYPE} of a-z, 0-9, \
             _ and -; OBJECT_ID is 1 to {MAX_OBJECT_ID} printable ASCII characters, no spaces)"
        ))),
    }
}

/// Returns the counter id of an object's activity (the seed's `POST /v1/counter/`).
#[utoipa::path(
    post,
    path = "/v1/counter/",
    tag = "seed",
    request_body = NewCounter,
    responses(
        (status = 200, description = "The counter's id (nothing is created: every counter exists at 0).", body = CounterId),
        (status = 400, description = "A bad object_id or activity_type.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 413, 415, 429).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create(JsonBody(body): JsonBody<NewCounter>) -> Result<Json<CounterId>, Problem> {
    if !is_activity_type(&body.activity_type) {
        return Err(Problem::invalid(format!(
            "activity_type {:?} must be 1 to {MAX_ACTIVITY_TYPE} of a-z, 0-9, _ and -",
            body.activity_type
        )));
    }
    if !is_object_id(&body.object_id) {
        return Err(Problem::invalid(format!(
            "object_id {:?} must be 1 to {MAX_OBJECT_ID} printable ASCII characters, no spaces",
            body.object_id
        )));
    }
    Ok(Json(CounterId {
        counter_id: format!("{}:{}", body.activity_type, body.object_id),
    }))
}

/// Increments a counter by one (the seed's `PUT /v1/counter/`).
#[utoipa::path(
    put,
    path = "/v1/counter/",
    tag = "seed",
    params(
        ("Idempotency-Key" = Option<String>, Header, max_length = 128,
         description = "Optional. A retry with the same key increments once."),
    ),
    request_body = CounterId,
    responses(
        (status = 204, description = "Incremented (or a duplicate of an increment already applied)."),
        (status = 400, description = "Not a counter_id, or a bad Idempotency-Key.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The counter is at its largest value.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The Idempotency-Key was used for another add.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 413, 415, 429, 503, 507).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn increment(
    State(state): State<HttpState>,
    idempotency: IdempotencyKey,
    JsonBody(body): JsonBody<CounterId>,
) -> Result<StatusCode, Problem> {
    check_counter_id(&body.counter_id)?;
    let add = pb::AddRequest {
        key: Bytes::from(body.counter_id),
        delta: 1,
        idempotency_key: idempotency.0.unwrap_or_default(),
        durability: pb::Durability::Unspecified as i32,
    };
    state
        .counters
        .add(Request::new(add))
        .await
        .map_err(|status| Problem::of_status(&status))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Reads a counter (the seed's `GET /v1/counter/`).
#[utoipa::path(
    get,
    path = "/v1/counter/",
    tag = "seed",
    params(CounterIdQuery),
    responses(
        (status = 200, description = "The counter's value.", body = SeedValue),
        (status = 400, description = "Not a counter_id.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn read(
    State(state): State<HttpState>,
    QueryParams(query): QueryParams<CounterIdQuery>,
) -> Result<Json<SeedValue>, Problem> {
    check_counter_id(&query.counter_id)?;
    let get = pb::GetRequest {
        key: Bytes::from(query.counter_id),
        breakdown: false,
        slots: false,
    };
    let answer = state
        .counters
        .get(Request::new(get))
        .await
        .map_err(|status| Problem::of_status(&status))?;
    Ok(Json(SeedValue {
        value: answer.into_inner().value,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_ids_are_what_post_forms() {
        for good in [
            "like:dQw4w9WgXcQ",
            "view:a:b",
            "x:~",
            &format!("{}:{}", "a".repeat(32), "o".repeat(200)),
        ] {
            assert!(check_counter_id(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "like",
            ":x",
            "like:",
            "Like:x",
            "like:a b",
            "like:é",
            &format!("{}:x", "a".repeat(33)),
            &format!("a:{}", "o".repeat(201)),
        ] {
            assert!(check_counter_id(bad).is_err(), "{bad}");
        }
    }
}
