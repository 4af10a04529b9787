//! The JSON API's extractors, each of which refuses bad input with a
//! [`Problem`] (never axum's plain-text rejections): the counter key of the
//! path ([`CounterKey`], checked as gRPC checks a key), a JSON body
//! ([`JsonBody`]: 400 for bad JSON, 413 over the size limit, 415 for another
//! media type) and the `Idempotency-Key` header ([`IdempotencyKey`]).
//!
//! [`read_body_first`] reads every request's body before anything answers
//! it. A refusal made before the body was read (a bad key in the path, a
//! missing token, an unknown path) otherwise made hyper close the connection
//! whenever the body had not arrived yet, without saying so, and a
//! keep-alive client sent its next request into the closed connection
//! ("Peer disconnected"): a race that depended on timing alone.

use std::marker::PhantomData;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, JsonRejection, RawPathParamsRejection};
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use tonic::Code;

use super::problem::Problem;
use crate::replica::{check_key, KeyError};

/// The `{key}` of the path, percent-decoded and checked: UTF-8, 1 to 256 bytes.
#[derive(Clone, Debug)]
pub struct CounterKey(pub String);

/// The percent-decoded path parameter `name` ("" when absent); a value that
/// is not UTF-8 is refused with `not_utf8`.
async fn path_param(parts: &mut Parts, name: &str, not_utf8: &str) -> Result<String, Problem> {
    let params = RawPathParams::from_request_parts(parts, &())
        .await
        .map_err(|rejection| match rejection {
            RawPathParamsRejection::InvalidUtf8InPathParam(_) => Problem::invalid(not_utf8),
            other => Problem::invalid(other.body_text()),
        })?;
    Ok(params
        .iter()
        .find(|(param, _)| *param == name)
        .map(|(_, value)| value.to_string())
        .unwrap_or_default())
}

impl<S: Send + Sync> FromRequestParts<S> for CounterKey {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let key = path_param(parts, "key", &KeyError::NotUtf8.to_string()).await?;
        check_key(key.as_bytes()).map_err(|error| Problem::invalid(error.to_string()))?;
        Ok(CounterKey(key))
    }
}

/// The `{member}` of the path, percent-decoded (the engine checks it as
/// gRPC's `member`).
#[derive(Clone, Debug)]
pub struct Member(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Member {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        path_param(parts, "member", "the member is not valid UTF-8")
            .await
            .map(Member)
    }
}

/// A JSON body; see the module documentation for its refusals. It must be
/// a JSON object: serde's derived structs also take an array of the fields
/// in order (`[1]` for `{"delta": 1}`), which no documented call accepts.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Problem> {
        let limit = request
            .extensions()
            .get::<BodyLimit>()
            .map_or(super::MAX_BODY_BYTES, |limit| limit.0);
        match axum::Json::<ObjectOnly<T>>::from_request(request, state).await {
            Ok(axum::Json(ObjectOnly(value))) => Ok(JsonBody(value)),
            Err(rejection) => Err(json_problem(rejection, limit)),
        }
    }
}

/// `T` read from a JSON object only.
struct ObjectOnly<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(Object(PhantomData))
            .map(ObjectOnly)
    }
}

/// The longest a request's body may take to arrive once its headers did.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads the request's whole body (up to the body limit) before the rest of
/// the router sees the request (see the module documentation). A body over
/// the limit, or one that cannot be read, is refused here, and the answer
/// says `Connection: close`: the rest of that body is never read.
pub async fn read_body_first(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let limit = parts
        .extensions
        .get::<BodyLimit>()
        .map_or(super::MAX_BODY_BYTES, |limit| limit.0);
    let mut probe = Request::new(body);
    *probe.extensions_mut() = parts.extensions.clone();
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, Bytes::from_request(probe, &())).await;
    let Ok(read) = read else {
        let mut response = Problem::with_status(
            StatusCode::REQUEST_TIMEOUT,
            Code::DeadlineExceeded,
            format!(
                "the body did not arrive within {} s; send it at once after the headers",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    };
    match read {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(rejection) => {
            let mut response = body_problem(rejection, limit).into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

fn body_problem(rejection: BytesRejection, limit: usize) -> Problem {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large(limit)
    } else {
        Problem::invalid(format!(
            "the body could not be read: {}",
            rejection.body_text()
        ))
    }
}

/// The route's body limit, put in a request's extensions by the access gate.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimit(pub usize);

/// 413: a body over the route's limit of `limit` bytes.
pub fn too_large(limit: usize) -> Problem {
    Problem::with_status(
        StatusCode::PAYLOAD_TOO_LARGE,
        Code::ResourceExhausted,
        format!(
            "the body is larger than this endpoint accepts ({limit} bytes); split the batch \
             or send less"
        ),
    )
}

fn json_problem(rejection: JsonRejection, limit: usize) -> Problem {
    match rejection {
        JsonRejection::MissingJsonContentType(_) => Problem::with_status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::InvalidArgument,
            "the body must be JSON: send `Content-Type: application/json`",
        ),
        JsonRejection::BytesRejection(rejection) => body_problem(rejection, limit),
        other => Problem::invalid(format!(
            "the body is not the JSON this call takes: {}",
            other.body_text()
        )),
    }
}

/// The `Idempotency-Key` header (IETF draft `httpapi-idempotency-key-header`),
/// as gRPC's `idempotency_key`: absent or empty means none. Its length is
/// checked by the core, as for gRPC.
#[derive(Clone, Debug, Default)]
pub struct IdempotencyKey(pub Option<String>);

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl IdempotencyKey {
    /// The key, as the engine takes it.
    pub fn as_deref(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let mut values = parts.headers.get_all(IDEMPOTENCY_KEY).iter();
        let Some(value) = values.next() else {
            return Ok(IdempotencyKey(None));
        };
        if values.next().is_some() {
            return Err(Problem::invalid(
                "the Idempotency-Key header is given more than once; send one",
            ));
        }
        let text = std::str::from_utf8(value.as_bytes())
            .map_err(|_| Problem::invalid("the Idempotency-Key header is not valid UTF-8"))?;
        Ok(IdempotencyKey((!text.is_empty()).then(|| text.to_string())))
    }
}

/// The query string, deserialized; a bad one is a 400 problem.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| QueryParams(value))
            .map_err(|rejection| {
                Problem::invalid(format!(
                    "the query string is not one this call takes: {}",
                    rejection.body_text()
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug, PartialEq)]
    struct Add {
        delta: i64,
        #[serde(default)]
        note: Option<String>,
    }

    #[test]
    fn a_body_must_be_an_object() {
        let read = |text: &str| serde_json::from_str::<ObjectOnly<Add>>(text).map(|o| o.0);
        assert_eq!(
            read(r#"{"delta": 1}"#).unwrap(),
            Add {
                delta: 1,
                note: None
            }
        );
        assert_eq!(read(r#"{"note": "x", "delta": -2}"#).unwrap().delta, -2);
        for refused in ["[1]", "[1, null]", "[[]]", "1", "\"x\"", "null"] {
            let error = read(refused).unwrap_err().to_string();
            assert!(
                error.contains("expected a JSON object"),
                "{refused}: {error}"
            );
        }
        assert!(
            read(r#"{"delta": "1"}"#).is_err(),
            "fields are still checked"
        );
    }
}
