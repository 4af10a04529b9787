//! Errors of the JSON API as `application/problem+json` (RFC 9457), with the
//! same meaning as the gRPC status the same request gets: the body carries
//! the gRPC code's name (`code`) and the engine's own message (`detail`), and
//! the HTTP status is the one a client of a REST API expects for it.
//!
//! A wrong method on a path that exists (405) is one too, with its `Allow`
//! header ([`method_not_allowed`]).
//!
//! Invariant: bad input is a 4xx with a message a person can act on, never a
//! 5xx; only the node's own trouble is: 503 (shutting down, a failing store)
//! or 507 (its disk is below `--min-free-disk`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tonic::Code;
use utoipa::ToSchema;

use crate::engine::EngineError;

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem document (RFC 9457). Every error of the JSON API is one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem: `urn:tally:problem:` and the gRPC
    /// code's name in kebab case (e.g. `urn:tally:problem:invalid-argument`).
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind of problem (the HTTP reason phrase).
    pub title: String,
    /// The HTTP status code of the answer.
    pub status: u16,
    /// What went wrong, for a person: the same message gRPC gives.
    pub detail: String,
    /// The gRPC status code the same request gets, by name (`INVALID_ARGUMENT`, ...).
    pub code: String,
    /// When present, how long to wait before retrying, in milliseconds (also
    /// in the `Retry-After` header, in whole seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// The HTTP status of a gRPC code, as Tally's JSON API answers it.
///
/// Two choices differ from Google's table, on purpose: an add that would
/// overflow (`OUT_OF_RANGE`) conflicts with the counter's state, so 409; an
/// idempotency key reused for another add (`FAILED_PRECONDITION`) is 422,
/// as the IETF `Idempotency-Key` draft says.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::OutOfRange => StatusCode::CONFLICT,
        Code::FailedPrecondition => StatusCode::UNPROCESSABLE_ENTITY,
        Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Cancelled | Code::Unknown | Code::Internal | Code::DataLoss => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// `INVALID_ARGUMENT` -> `invalid-argument`.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

impl Problem {
    /// A problem with the gRPC code's meaning and its usual HTTP status.
    pub fn new(code: Code, detail: impl Into<String>) -> Problem {
        Problem::with_status(http_status(code), code, detail)
    }

    /// A problem whose HTTP status is not the code's usual one (413 and 415:
    /// HTTP has a closer status for what went wrong than gRPC).
    pub fn with_status(status: StatusCode, code: Code, detail: impl Into<String>) -> Problem {
        let name = code_name(code);
        Problem {
            kind: format!(
                "urn:tally:problem:{}",
                name.to_ascii_lowercase().replace('_', "-")
            ),
            title: status.canonical_reason().unwrap_or("Error").to_string(),
            status: status.as_u16(),
            detail: detail.into(),
            code: name.to_string(),
            retry_after_ms: None,
        }
    }

    /// The problem of an engine error: the code gRPC gives it, its message.
    pub fn of_engine(error: &EngineError) -> Problem {
        Problem::new(crate::api::convert::code_of(error), error.to_string()).retry_if_unavailable()
    }

    /// The problem of a gRPC status (the in-process `Counters` service's
    /// answer, or a forwarded one): its code's meaning, its message.
    pub fn of_status(status: &tonic::Status) -> Problem {
        Problem::new(status.code(), status.message()).retry_if_unavailable()
    }

    /// A 503 asks the client to wait a second: the node is stopping or its
    /// store is failing, and another node of the region can take the
    /// request now, this one maybe in a moment.
    fn retry_if_unavailable(self) -> Problem {
        if self.status == StatusCode::SERVICE_UNAVAILABLE.as_u16() {
            self.retry_after(1_000)
        } else {
            self
        }
    }

    /// A `400 INVALID_ARGUMENT`.
    pub fn invalid(detail: impl Into<String>) -> Problem {
        Problem::new(Code::InvalidArgument, detail)
    }

    /// The same problem, asking the client to wait `ms` before retrying.
    pub fn retry_after(mut self, ms: u64) -> Problem {
        self.retry_after_ms = Some(ms);
        self
    }

    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(ms) = self.retry_after_ms {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000)));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tally\""),
            );
        }
        response
    }
}

/// Turns the router's bare 405 (a path that exists, asked with a method it
/// does not answer) into a problem document like every other refusal,
/// keeping its `Allow` header and naming the allowed methods in the detail.
pub async fn method_not_allowed(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if response.status() != StatusCode::METHOD_NOT_ALLOWED || is_problem {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let allowed = allow
        .as_ref()
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .replace(',', ", ");
    let mut problem = Problem::with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        Code::Unimplemented,
        format!(
            "{method} is not allowed on {path}; it answers {allowed} (the JSON API is described at /v1/openapi.json)"
        ),
    )
    .into_response();
    if let Some(allow) = allow {
        problem.headers_mut().insert(header::ALLOW, allow);
    }
    problem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_fault_code_is_a_4xx_and_the_nodes_own_trouble_a_5xx() {
        for code in [
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::FailedPrecondition,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::NotFound,
        ] {
            let status = http_status(code);
            assert!(status.is_client_error(), "{code:?} -> {status}");
        }
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        // The only RESOURCE_EXHAUSTED an engine gives is a full disk: the
        // node's trouble, not the caller's (the rate limit is a 429, from
        // the access layer).
        assert_eq!(
            http_status(Code::ResourceExhausted),
            StatusCode::INSUFFICIENT_STORAGE
        );
    }

    #[test]
    fn a_problem_names_its_grpc_code_and_carries_retry_after() {
        let problem = Problem::new(Code::Unavailable, "stopping").retry_after(1_500);
        assert_eq!(problem.kind, "urn:tally:problem:unavailable");
        assert_eq!(problem.code, "UNAVAILABLE");
        assert_eq!(problem.title, "Service Unavailable");
        let response = problem.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn engine_errors_keep_their_message() {
        let error = EngineError::Key(crate::replica::KeyError::Empty);
        let problem = Problem::of_engine(&error);
        assert_eq!(problem.status, 400);
        assert_eq!(problem.code, "INVALID_ARGUMENT");
        assert_eq!(problem.detail, error.to_string());
    }
}
