//! Who may call the JSON API, as on gRPC: with `--auth-tokens`, every `/v1/`
//! call and the status page need `Authorization: Bearer TOKEN` (the same
//! tokens and roles, the same per-token rate limit and burst, the same
//! refusal counter), checked by [`gate`] before a byte of the body is read;
//! a batch is charged per item. A refusal is a problem document: 401 with
//! `WWW-Authenticate`, 403 for a token without the role, or 429 with
//! `Retry-After`. Bodies are bounded per route ([`body_limit`]).
//!
//! The event stream alone also takes the token as an `access_token` query
//! parameter (RFC 6750, section 2.3): a browser's `EventSource` cannot send
//! headers. CORS is off unless `--http-cors-origin` names origins.

use std::collections::HashMap;

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tonic::Code;
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::problem::Problem;
use super::HttpState;
use crate::security::auth::Role;
use crate::security::ItemCharge;

/// Counts a refusal as the gRPC interceptor does; true when it was the rate limit.
pub(super) fn count_refusal(state: &HttpState, refused: &tonic::Status) -> bool {
    state
        .engine
        .metrics()
        .auth_refusals
        .get_or_create(&crate::metrics::ReasonLabels {
            reason: crate::security::auth::refusal_reason(refused).into(),
        })
        .inc();
    refused.code() == Code::ResourceExhausted
}

/// The token of a request: its `Authorization` header, or on the event
/// stream its `access_token` query parameter.
fn authorization(request: &Request) -> Option<String> {
    if let Some(value) = request.headers().get(header::AUTHORIZATION) {
        return value.to_str().ok().map(str::to_string);
    }
    if !request.uri().path().ends_with("/events") {
        return None;
    }
    let query =
        axum::extract::Query::<HashMap<String, String>>::try_from_uri(request.uri()).ok()?;
    query
        .0
        .get("access_token")
        .map(|token| format!("Bearer {token}"))
}

/// The most bytes of body a route that takes small bodies reads (an add, a
/// like, the seed's API); larger bodies are refused with 413 before they are
/// read.
pub const SMALL_BODY_BYTES: usize = 64 << 10;

/// The body limit of a request: batches, observes and unions take up to the
/// largest message; everything else a small body.
pub fn body_limit(method: &Method, path: &str) -> usize {
    let large = *method == Method::POST
        && (path.starts_with("/v1/batch/")
            || path.starts_with("/v1/uniques/")
            || path == "/v1/distinct");
    if large {
        super::MAX_BODY_BYTES
    } else {
        SMALL_BODY_BYTES
    }
}

/// What a path needs of the caller's token when tokens are on: `None` for
/// the open paths (probes, metrics, the OpenAPI document, the demo page).
pub fn needed_role(method: &Method, path: &str) -> Option<Role> {
    let guarded = (path.starts_with("/v1/") && path != "/v1/openapi.json")
        || path == "/status"
        || path == "/status.json";
    if !guarded {
        return None;
    }
    let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
        || (*method == Method::POST && (path == "/v1/batch/get" || path == "/v1/distinct"));
    Some(if reads { Role::Read } else { Role::Write })
}

/// The gate in front of the whole router, before any body is read: the
/// token and its role (where the path needs one), then the route's body
/// limit by `Content-Length`. A refusal here says `Connection: close`, as
/// the body stays unread; a body without a length is bounded as it is read
/// (413 past the route's limit, see `extract::read_body_first`).
pub async fn gate(State(state): State<HttpState>, mut request: Request, next: Next) -> Response {
    let (role, limit, status_page) = {
        let (method, path) = (request.method(), request.uri().path());
        (
            needed_role(method, path),
            body_limit(method, path),
            path == "/status" || path == "/status.json",
        )
    };
    if let (Some(auth), Some(role)) = (state.auth.clone(), role) {
        match auth.check(authorization(&request).as_deref(), role) {
            Ok(name) => {
                request.extensions_mut().insert(ItemCharge::new(auth, name));
            }
            Err(refused) => return closing(refusal_response(&state, &refused, status_page)),
        }
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        state.engine.metrics().refused("http_body_too_large");
        return closing(super::extract::too_large(limit).into_response());
    }
    request
        .extensions_mut()
        .insert(super::extract::BodyLimit(limit));
    let request =
        request.map(|body| axum::body::Body::new(http_body_util::Limited::new(body, limit)));
    let response = next.run(request).await;
    // The body reader's refusals (a body without a length that grew past
    // the limit, or one too slow to arrive) are counted here.
    match response.status() {
        StatusCode::PAYLOAD_TOO_LARGE => state.engine.metrics().refused("http_body_too_large"),
        StatusCode::REQUEST_TIMEOUT => state.engine.metrics().refused("http_body_timeout"),
        _ => {}
    }
    response
}

fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The answer to a refused token: a problem document (401 with
/// `WWW-Authenticate`, 403 for a missing role, 429 with `Retry-After`), or
/// for the status page the same codes in plain text.
fn refusal_response(state: &HttpState, refused: &tonic::Status, status_page: bool) -> Response {
    let limited = count_refusal(state, refused);
    if status_page {
        let code = match refused.code() {
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        };
        return (
            code,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"tally\"")],
            format!(
                "{}\nThis node requires a client token for the status page: send \
                 `Authorization: Bearer TOKEN` (e.g. curl -H 'Authorization: Bearer TOKEN').\n",
                refused.message()
            ),
        )
            .into_response();
    }
    if limited {
        let wait_ms = refused
            .metadata()
            .get("retry-after-ms")
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse().ok())
            .unwrap_or(1_000);
        return Problem::with_status(
            StatusCode::TOO_MANY_REQUESTS,
            Code::ResourceExhausted,
            refused.message(),
        )
        .retry_after(wait_ms)
        .into_response();
    }
    if refused.code() == Code::PermissionDenied {
        return Problem::new(Code::PermissionDenied, refused.message()).into_response();
    }
    Problem::new(
        Code::Unauthenticated,
        format!(
            "{}; send `Authorization: Bearer TOKEN` (a token from the node's --auth-tokens file)",
            refused.message()
        ),
    )
    .into_response()
}

/// The CORS layer for `--http-cors-origin`: `None` (CORS off) when no origin
/// is named; `*` allows any origin.
pub fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|origin| origin == "*") {
        AllowOrigin::any()
    } else {
        // The settings checked each origin (see `check_cors_origin`).
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|origin| HeaderValue::from_str(origin).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::PUT])
            .allow_headers([
                header::CONTENT_TYPE,
                header::AUTHORIZATION,
                HeaderName::from_static(super::extract::IDEMPOTENCY_KEY),
                HeaderName::from_static("last-event-id"),
            ])
            .expose_headers([
                header::RETRY_AFTER,
                HeaderName::from_static(super::counters::OWNER_HINT),
            ]),
    )
}

/// Checks one `--http-cors-origin`: `*`, or `http(s)://host[:port]` with no
/// path (the form of a browser's `Origin` header).
pub fn check_cors_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| format!("{origin:?} is not an origin: give `*` or scheme://host[:port], e.g. https://example.com"))?;
    if rest.is_empty()
        || rest.contains(['/', '?', '#', ' '])
        || HeaderValue::from_str(origin).is_err()
    {
        return Err(format!(
            "{origin:?} is not an origin: give scheme://host[:port] with no path or trailing slash, e.g. https://example.com"
        ));
    }
    Ok(())
}
