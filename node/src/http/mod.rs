//! The HTTP port: `/`, an HTML index of what follows ([`index`]), `/healthz` (the process answers), `/readyz` (the node
//! serves: its store is open, its commits succeed, it is not shutting
//! down and not holding adds after a restart; the body says why not), `/metrics`
//! (OpenMetrics when the scraper asks for it, as Prometheus does; the classic
//! Prometheus text otherwise), the status page `/status` (HTML, with charts
//! of the node's last two minutes: [`charts`]) and `/status.json`,
//! and the JSON API under `/v1/` ([`counters`], [`seed`], [`events`], [`likes`],
//! [`like_events`]) with its
//! OpenAPI document ([`openapi`]) and a like-button page at `/demo/{key}` ([`demo`]).
//!
//! With tokens on (`--auth-tokens`), the status page, its JSON and the JSON
//! API require the same `Authorization: Bearer TOKEN` as the gRPC services,
//! checked before any body is read ([`access`]); health, readiness,
//! metrics (without key names), the OpenAPI document and the demo page
//! (which sends the token it is given) stay open. A gRPC call sent here by
//! mistake gets a gRPC answer naming the gRPC port ([`wrong_port`]).

pub mod access;
pub mod charts;
pub mod counters;
pub mod demo;
pub mod events;
pub mod extract;
pub mod index;
pub mod integer;
pub mod like_events;
pub mod likes;
pub mod openapi;
pub mod problem;
pub mod seed;
pub mod serve;
pub mod status_page;
pub mod wrong_port;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::engine::Engine;

/// The largest request body the JSON API reads (as gRPC's largest message).
pub const MAX_BODY_BYTES: usize = crate::api::serve::MAX_MESSAGE_BYTES;

/// The HTTP port's own settings.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// Origins allowed by CORS (`--http-cors-origin`); empty: CORS off; `*`: any.
    pub cors_origins: Vec<String>,
    /// PEM certificate chain served on the HTTP port (`--http-tls-cert`).
    pub tls_cert: Option<std::path::PathBuf>,
    /// Its private key (`--http-tls-key`).
    pub tls_key: Option<std::path::PathBuf>,
    /// The gap between heartbeats of an idle event stream (`--http-event-heartbeat`).
    pub event_heartbeat: std::time::Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            cors_origins: Vec::new(),
            tls_cert: None,
            tls_key: None,
            event_heartbeat: std::time::Duration::from_secs(15),
        }
    }
}

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
    /// The HTTP port's settings.
    pub settings: HttpSettings,
    /// Ownership of partitions, for the status page's partition map.
    pub partitioning: Arc<crate::gossip::lifecycle::Partitioning>,
    /// The gRPC `Counters` service, called in-process by the counter
    /// endpoints: they route and forward a key to its owner as gRPC does.
    pub counters: Arc<crate::api::CountersService>,
    /// The gRPC likes service, called in-process: like sets and uniques
    /// route and forward as over gRPC.
    pub likes: Arc<crate::api::LikesService>,
    /// The status page's charts: the last two minutes of this node's numbers.
    pub charts: Arc<charts::ChartHistory>,
}

/// The router: the probes, the status page, and the JSON API.
pub fn router(state: HttpState) -> Router {
    let (api, document) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(counters::add, counters::get))
        .routes(routes!(events::events))
        .routes(routes!(counters::batch_add))
        .routes(routes!(counters::batch_get))
        .routes(routes!(seed::create, seed::increment, seed::read))
        .routes(routes!(likes::like, likes::unlike, likes::liked))
        .routes(routes!(likes::count))
        .routes(routes!(like_events::events))
        .routes(routes!(likes::members))
        .routes(routes!(likes::observe, likes::estimate))
        .routes(routes!(likes::distinct))
        .split_for_parts();
    let document = openapi::finish(document, state.auth.is_some());
    let document: Arc<str> = document
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
        .into();
    // The token and the body limit are checked for the whole router, below.
    let mut api = api;
    if let Some(cors) = access::cors_layer(&state.settings.cors_origins) {
        api = api.layer(cors);
    }
    let routes = Router::new()
        .route("/", get(index_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status_html))
        .route("/status.json", get(status_json))
        .route(
            "/v1/openapi.json",
            get(move || {
                let document = document.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        document.to_string(),
                    )
                }
            }),
        )
        .route("/demo/{key}", get(demo::page))
        .merge(api)
        .fallback(not_found)
        .with_state(state.clone())
        .layer(axum::middleware::from_fn(extract::read_body_first))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::gate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state,
            wrong_port::answer_grpc,
        ));
    // Around the whole router, where a 405 already carries its `Allow`
    // header (the routes' own layers run before it is added).
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn(problem::method_not_allowed))
}

/// Any other path: a problem document pointing at the API's description.
async fn not_found(uri: axum::http::Uri) -> problem::Problem {
    problem::Problem::new(
        tonic::Code::NotFound,
        format!(
            "no endpoint at {}: the JSON API is described at /v1/openapi.json",
            uri.path()
        ),
    )
}

/// `/`: links to what the port serves ([`index`]).
async fn index_page(State(state): State<HttpState>) -> Response {
    axum::response::Html(index::render(&state.info)).into_response()
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    use crate::engine::StoreHealth;
    let unready = |why: String| (StatusCode::SERVICE_UNAVAILABLE, why);
    match state.engine.store_health() {
        StoreHealth::Healthy
            if state.ready.load(Ordering::Acquire) && !state.partitioning.has_view() =>
        {
            unready("not ready: waiting to hear the cluster, to learn which partitions this node holds and where the others are\n".into())
        }
        StoreHealth::Healthy if state.ready.load(Ordering::Acquire) => {
            match state.engine.core().restart_hold_remaining(crate::engine::now_ms()) {
                Some(ms) => unready(format!("not ready: restarted on its old data directory, it holds adds until a peer says whether its replica id was retired (at most {ms} ms more)\n")),
                None => (StatusCode::OK, "ready\n".into()),
            }
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
            public_metrics(&state, state.engine.metrics().encode()),
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            public_metrics(&state, state.engine.metrics().encode_text()),
        )
    }
}

/// `/metrics` stays open for scrapers, so with tokens on it names no key:
/// the hot keys' series are left out (the authenticated status page lists
/// them).
fn public_metrics(state: &HttpState, text: String) -> String {
    if state.auth.is_none() {
        return text;
    }
    crate::metrics::without_key_names(&text)
}

async fn status_html(State(state): State<HttpState>) -> Response {
    let status = crate::api::admin::status(&state.engine, &state.info);
    let map = own_partition_map(&state);
    let samples = state.charts.samples();
    axum::response::Html(status_page::render(&status, map.as_ref(), &samples)).into_response()
}

/// This node's region's partition map (`None` before membership knows the
/// region, which the page then leaves out).
fn own_partition_map(state: &HttpState) -> Option<tally_proto::v1::PartitionMapResponse> {
    let counters = crate::api::partitions::counters_stored(&state.engine);
    crate::api::partitions::partition_map(&state.partitioning, "", &counters).ok()
}

async fn status_json(State(state): State<HttpState>) -> Response {
    let status = crate::api::admin::status(&state.engine, &state.info);
    let map = own_partition_map(&state);
    let samples = state.charts.samples();
    axum::Json(status_page::to_json(&status, map.as_ref(), &samples)).into_response()
}
