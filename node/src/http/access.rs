//! Who may call the JSON API, as on gRPC: with `--auth-tokens`, every `/v1/`
//! call needs `Authorization: Bearer TOKEN` (the same tokens, the same
//! per-token rate limit and burst, the same refusal counter); a batch is
//! charged per item. A refusal is a problem document: 401 with
//! `WWW-Authenticate`, or 429 with `Retry-After`.
//!
//! The event stream alone also takes the token as an `access_token` query
//! parameter (RFC 6750, section 2.3): a browser's `EventSource` cannot send
//! headers. CORS is off unless `--http-cors-origin` names origins.

use std::collections::HashMap;

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tonic::Code;
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::problem::Problem;
use super::HttpState;
use crate::security::ItemCharge;

/// Counts a refusal as the gRPC interceptor does; true when it was the rate limit.
pub(super) fn count_refusal(state: &HttpState, refused: &tonic::Status) -> bool {
    let limited = refused.code() == Code::ResourceExhausted;
    state
        .engine
        .metrics()
        .auth_refusals
        .get_or_create(&crate::metrics::ReasonLabels {
            reason: if limited {
                "rate_limited"
            } else {
                "unauthenticated"
            }
            .into(),
        })
        .inc();
    limited
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

/// The middleware in front of `/v1/`.
pub async fn require_token(
    State(state): State<HttpState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(auth) = state.auth.clone() else {
        return next.run(request).await;
    };
    match auth.check(authorization(&request).as_deref()) {
        Ok(name) => {
            request.extensions_mut().insert(ItemCharge::new(auth, name));
            next.run(request).await
        }
        Err(refused) => {
            if count_refusal(&state, &refused) {
                let wait_ms = refused
                    .metadata()
                    .get("retry-after-ms")
                    .and_then(|value| value.to_str().ok())
                    .and_then(|text| text.parse().ok())
                    .unwrap_or(1_000);
                Problem::with_status(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    Code::ResourceExhausted,
                    refused.message(),
                )
                .retry_after(wait_ms)
                .into_response()
            } else {
                Problem::new(
                    Code::Unauthenticated,
                    format!(
                        "{}; send `Authorization: Bearer TOKEN` (a token from the node's --auth-tokens file)",
                        refused.message()
                    ),
                )
                .into_response()
            }
        }
    }
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
