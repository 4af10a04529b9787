//! The HTTP endpoints: `/healthz` (the process answers), `/readyz` (the node
//! serves: its store is open, its commits succeed, and it is not shutting
//! down; the body says why not), `/metrics`
//! (OpenMetrics when the scraper asks for it, as Prometheus does; the classic
//! Prometheus text otherwise), and the status page `/status` (HTML) and `/status.json`.
//!
//! With tokens on (`--auth-tokens`), the status page and its JSON require the
//! same `Authorization: Bearer TOKEN` as the gRPC `Admin` service (they show
//! members, addresses and hot key names); health, readiness and metrics stay
//! open for probes and scrapers.

pub mod status_page;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::engine::Engine;

/// What the HTTP handlers read.
#[derive(Clone)]
pub struct HttpState {
    /// The engine, for metrics.
    pub engine: Arc<Engine>,
    /// True while the node serves.
    pub ready: Arc<AtomicBool>,
    /// What the node tells about itself.
    pub info: crate::api::NodeInfo,
    /// The client tokens, when on: the status page requires one.
    pub auth: Option<Arc<crate::security::Auth>>,
}

/// The router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status_html))
        .route("/status.json", get(status_json))
        .with_state(state)
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    use crate::engine::StoreHealth;
    let unready = |why: String| (StatusCode::SERVICE_UNAVAILABLE, why);
    match state.engine.store_health() {
        StoreHealth::Healthy if state.ready.load(Ordering::Acquire) => {
            (StatusCode::OK, "ready\n".into())
        }
        StoreHealth::Healthy => unready("not ready: shutting down\n".into()),
        StoreHealth::Failing(cause) => {
            unready(format!("not ready: commits are failing: {cause}\n"))
        }
        StoreHealth::Failed(cause) => unready(format!("not ready: the store failed: {cause}\n")),
        StoreHealth::Stopped => unready("not ready: shutting down\n".into()),
    }
}

/// OpenMetrics for a scraper that asks for it (Prometheus does), the
/// classic text format otherwise (curl, `promtool check metrics`).
async fn metrics(State(state): State<HttpState>, headers: HeaderMap) -> impl IntoResponse {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            state.engine.metrics().encode(),
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            state.engine.metrics().encode_text(),
        )
    }
}

async fn status_html(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(refused) = refusal(&state, &headers) {
        return refused;
    }
    let status = crate::api::admin::status(&state.engine, &state.info);
    axum::response::Html(status_page::render(&status)).into_response()
}

async fn status_json(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(refused) = refusal(&state, &headers) {
        return refused;
    }
    let status = crate::api::admin::status(&state.engine, &state.info);
    axum::Json(status_page::to_json(&status)).into_response()
}

/// Checks the bearer token as the gRPC interceptor does (same tokens, same
/// rate limit, same refusal counter); `Some` is the answer to send instead.
fn refusal(state: &HttpState, headers: &HeaderMap) -> Option<Response> {
    let auth = state.auth.as_ref()?;
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    let refused = match auth.check(authorization) {
        Ok(_) => return None,
        Err(refused) => refused,
    };
    let limited = refused.code() == tonic::Code::ResourceExhausted;
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
    let code = if limited {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::UNAUTHORIZED
    };
    Some(
        (
            code,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"tally\"")],
            format!(
                "{}\nThis node requires a client token for the status page: send \
             `Authorization: Bearer TOKEN` (e.g. curl -H 'Authorization: Bearer TOKEN').\n",
                refused.message()
            ),
        )
            .into_response(),
    )
}
