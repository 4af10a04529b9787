//! Live like counts: `GET /v1/likes/{key}/events` streams a like set's count
//! of liked members as server-sent events, for the like-button page.
//!
//! - One `count` event when the stream opens (the current count), then one
//!   per change, read at most every [`COUNT_POLL`]: a hot set costs a
//!   browser at most four events a second.
//! - The count is read as `GET /v1/likes/{key}` reads it, through the
//!   in-process gRPC `Likes` service, so a node that does not own the set
//!   asks its owner, and the count includes every region's members as far as
//!   they have replicated here. (Like sets have no change notification like
//!   counters' `Watch`: the stream reads the count, which is a lookup in the
//!   owner's memory.)
//! - Each event's `id` is the count it carries; a client reconnecting with
//!   `Last-Event-ID` equal to the current count starts at the next change.
//! - A read that fails after the stream opened (the owner is briefly
//!   unreachable) sends nothing and is tried again at the next poll; the
//!   first read's failure is the request's error.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use futures::Stream;
use prost::bytes::Bytes;
use serde::{Deserialize, Serialize};
use tally_proto::v1 as pb;
use tally_proto::v1::likes_server::Likes;
use tonic::Request;
use utoipa::ToSchema;

use super::events::{last_event_id, with_heartbeat, EventsQuery, RETRY_MS};
use super::extract::{CounterKey, QueryParams};
use super::problem::Problem;
use super::HttpState;

/// The data of a `count` event.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CountEvent {
    /// The like set's name.
    pub key: String,
    /// Its count of liked members (on the set's first live owner).
    pub count: u64,
}

/// How often an open stream reads the count.
pub const COUNT_POLL: Duration = Duration::from_millis(250);

async fn read_count(state: &HttpState, key: &str) -> Result<u64, Problem> {
    let request = Request::new(pb::LikeCountRequest {
        key: Bytes::from(key.to_string()),
    });
    state
        .likes
        .like_count(request)
        .await
        .map(|answer| answer.into_inner().count)
        .map_err(|status| Problem::of_status(&status))
}

fn count_event(key: &str, count: u64) -> Event {
    Event::default()
        .event("count")
        .id(count.to_string())
        .retry(Duration::from_millis(RETRY_MS))
        .json_data(CountEvent {
            key: key.to_string(),
            count,
        })
        .unwrap_or_else(|_| Event::default())
}

/// Streams a like set's count as server-sent events.
#[utoipa::path(
    get,
    path = "/v1/likes/{key}/events",
    tag = "likes",
    params(
        ("key" = String, Path, min_length = 1, max_length = 256,
         description = "The like set: UTF-8, 1 to 256 bytes (percent-encoded in the path)."),
        ("Last-Event-ID" = Option<String>, Header,
         description = "The id of the last event received: when it is the current count, \
                        the stream starts at the next change."),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "An endless stream of `count` events (data: a CountEvent) \
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
    let first = read_count(&state, &key).await?;
    let resume_at: Option<u64> = last_event_id(&headers);
    let sse_state = state.clone();
    let opened = super::events::StreamGauge::open(state.engine.metrics().clone());
    // The state: the last count sent (None: nothing sent yet), and whether
    // the first read is still to be sent.
    let pending_first = (resume_at != Some(first)).then_some(first);
    let stream = futures::stream::unfold(
        (
            state,
            key,
            resume_at.filter(|at| *at == first),
            pending_first,
        ),
        move |(state, key, mut last_sent, mut pending)| {
            let _held = &opened;
            async move {
                loop {
                    let count = match pending.take() {
                        Some(count) => count,
                        None => {
                            tokio::time::sleep(COUNT_POLL).await;
                            match read_count(&state, &key).await {
                                Ok(count) => count,
                                Err(_) => continue,
                            }
                        }
                    };
                    if last_sent != Some(count) {
                        last_sent = Some(count);
                        let event = count_event(&key, count);
                        return Some((Ok(event), (state, key, last_sent, None)));
                    }
                }
            }
        },
    );
    Ok(with_heartbeat(stream, &sse_state))
}
