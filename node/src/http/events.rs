//! Live counts: `GET /v1/counters/{key}/events` streams a counter's value as
//! server-sent events (`text/event-stream`), for a browser's `EventSource`.
//!
//! - One `value` event per change, coalesced exactly as gRPC `Watch` is
//!   ([`crate::api::counters::coalesced_values`]): at most one per 100 ms,
//!   always the newest value, so a hot key costs a browser at most ten
//!   events a second.
//! - The values are the key's first live owner's: a node that does not own
//!   the key relays the owner's stream, as gRPC `Watch` does
//!   ([`crate::api::watch_relay`]).
//! - Each event's `id` is the value it carries. A client that reconnects with
//!   `Last-Event-ID` equal to the current value gets no repeat of it: the
//!   stream starts at the next change. (The event is the state, so there is
//!   nothing older to replay: any other id gets the current value at once.)
//! - A comment line (`: heartbeat`) every `--http-event-heartbeat` keeps
//!   proxies from closing an idle stream; the first event says `retry: 1000`.
//! - A value outside `i64` ends the stream with an `error` event holding the
//!   problem document (as gRPC `Watch` ends with `OUT_OF_RANGE`).

use std::convert::Infallible;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, KeepAliveStream, Sse};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{CounterKey, QueryParams};
use super::problem::Problem;
use super::HttpState;

/// The data of a `value` event.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ValueEvent {
    /// The counter's name.
    pub key: String,
    /// Its value on the key's first live owner.
    pub value: i64,
}

/// The query of an event stream (a counter's, or a like set's: [`super::like_events`]).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// The bearer token, for a browser's `EventSource`, which cannot send an
    /// `Authorization` header (RFC 6750, section 2.3). Only this endpoint
    /// takes it.
    #[serde(default)]
    pub access_token: Option<String>,
}

/// How long a browser waits before reconnecting a dropped stream.
pub(super) const RETRY_MS: u64 = 1_000;

/// Streams a counter's value as server-sent events.
#[utoipa::path(
    get,
    path = "/v1/counters/{key}/events",
    tag = "counters",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256,
         description = "The counter's name: UTF-8, 1 to 256 bytes (percent-encoded in the path)."),
        ("Last-Event-ID" = Option<String>, Header,
         description = "The id of the last event received: when it is the current value, \
                        the stream starts at the next change."),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "An endless stream of `value` events (data: a ValueEvent) \
                                      and heartbeat comments.",
         body = String, content_type = "text/event-stream"),
        (status = 400, description = "A bad key.", body = Problem, content_type = "application/problem+json"),
        (status = "default", description = "Any other problem (401, 429, 503).", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn events(
    State(state): State<HttpState>,
    CounterKey(key): CounterKey,
    QueryParams(_query): QueryParams<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let values = state
        .counters
        .values(key.clone().into(), &tonic::metadata::MetadataMap::new())
        .await
        .map_err(|status| Problem::of_status(&status))?;
    let resume_at: Option<i64> = last_event_id(&headers);
    let mut first = true;
    let stream = values
        .filter(move |value| {
            // Skip the current value when the client already has it.
            let skip = first && value.as_ref().ok() == resume_at.as_ref();
            first = false;
            std::future::ready(!skip)
        })
        .map(move |value| {
            let event = match value {
                Ok(value) => Event::default()
                    .event("value")
                    .id(value.to_string())
                    .retry(std::time::Duration::from_millis(RETRY_MS))
                    .json_data(ValueEvent {
                        key: key.clone(),
                        value,
                    }),
                Err(out_of_range) => Event::default()
                    .event("error")
                    .json_data(Problem::new(tonic::Code::OutOfRange, out_of_range)),
            };
            Ok(event.unwrap_or_else(|_| Event::default()))
        });
    let opened = StreamGauge::open(state.engine.metrics().clone());
    let stream = stream.map(move |event| {
        let _held = &opened;
        event
    });
    Ok(with_heartbeat(stream, &state))
}

/// The `Last-Event-ID` a reconnecting client sent, when it parses as `T`.
pub(super) fn last_event_id<T: std::str::FromStr>(headers: &HeaderMap) -> Option<T> {
    headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse().ok())
}

/// An event stream with a `: heartbeat` comment every `--http-event-heartbeat`.
pub(super) fn with_heartbeat<S>(stream: S, state: &HttpState) -> Sse<KeepAliveStream<S>>
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(stream).keep_alive(
        KeepAlive::new()
            .interval(state.settings.event_heartbeat)
            .text("heartbeat"),
    )
}

/// One open event stream in the gauge `tally_http_event_streams`: counted
/// when opened, uncounted when the stream is dropped.
pub(super) struct StreamGauge(std::sync::Arc<crate::metrics::Metrics>);

impl StreamGauge {
    /// Counts a stream that opens now.
    pub(super) fn open(metrics: std::sync::Arc<crate::metrics::Metrics>) -> StreamGauge {
        metrics.http_event_streams.inc();
        StreamGauge(metrics)
    }
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        self.0.http_event_streams.dec();
    }
}
