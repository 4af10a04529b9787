//! `Watch` of a counter in a region of several nodes (issue 11, items 3 and
//! 7): a watcher sees the values of the key's first live owner, whichever
//! node it asked. The gRPC `Watch` and the HTTP event stream share it.
//!
//! A node that does not serve the key's partition holds none of its state
//! (or only a copy coming in), so it must not answer from it. Instead the
//! watch is **relayed**: this node opens the owner's own `Watch` (marked
//! forwarded, so the owner serves it from its state, one hop) and passes
//! each value on. A relay:
//! - opens before it answers, so the watcher's first value is the owner's
//!   current one, and a refusal (a bad key, no owner serving) is the
//!   watcher's error;
//! - follows the key: when the owner's stream breaks, or the key's first
//!   live owner changes (a join, a drain, a failover; checked every
//!   [`ROUTE_CHECK`]), it opens again where the routes now point, this node
//!   included, and passes on only values that differ from the last one;
//! - keeps the last value while no owner answers, and retries every
//!   [`REOPEN_PAUSE`];
//! - ends when its watcher goes away, or after an out-of-range value (as a
//!   local watch does).
//!
//! With one node in the region (no routes) or for a forwarded request, the
//! node's own watch is used directly: no task, no relay. The relays open
//! now are the gauge `tally_watch_relays`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use prost::bytes::Bytes;
use tally_proto::v1 as pb;
use tally_proto::v1::counters_client::CountersClient;
use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use super::convert::status_of;
use super::counters::coalesced_values;
use super::forward::{Forwarded, Forwarder, DEFAULT_FORWARD_TIMEOUT};
use crate::crdt::ValueOutOfRange;
use crate::engine::Engine;
use crate::partition::Route;

/// A watched counter's value, or the message of a value outside `i64`
/// (which ends the stream).
pub type WatchValue = Result<i64, String>;
/// A watcher's values: the current one first, then changes, coalesced.
pub type ValueStream = Pin<Box<dyn Stream<Item = WatchValue> + Send>>;

/// How often a relay checks whether the key's first live owner changed.
pub const ROUTE_CHECK: Duration = Duration::from_secs(1);
/// How long a relay waits before it opens again.
pub const REOPEN_PAUSE: Duration = Duration::from_millis(500);

/// Where a relay's values come from.
enum Source {
    /// The owner's `Watch` stream.
    Owner {
        name: String,
        events: Box<Streaming<pb::WatchEvent>>,
    },
    /// This node's own watch (it serves the key, or no owner answered and
    /// it serves the partition).
    Here(watch::Receiver<Result<i64, ValueOutOfRange>>),
}

/// How following a source ended.
enum Ended {
    NoWatcher,
    OutOfRange,
    /// The stream broke, or the key's first owner changed: open again.
    Reopen,
}

/// The values of `key` for a watcher whose request carried `metadata`
/// (see the module documentation).
pub async fn values(
    engine: &Arc<Engine>,
    forwarder: &Arc<Forwarder>,
    key: Bytes,
    metadata: &MetadataMap,
) -> Result<ValueStream, Status> {
    if forwarder.routes_for(metadata).is_none() {
        let receiver = engine.watch(&key).map_err(|e| status_of(&e))?;
        return Ok(Box::pin(
            coalesced_values(receiver).map(|value| value.map_err(|e| e.to_string())),
        ));
    }
    let (source, first) = open(engine, forwarder, &key).await?;
    let (sender, receiver) = watch::channel(first);
    let relays = engine.metrics().watch_relays.clone();
    relays.inc();
    let relay = relay(engine.clone(), forwarder.clone(), key, source, sender);
    tokio::spawn(async move {
        relay.await;
        relays.dec();
    });
    Ok(Box::pin(coalesced_values(receiver)))
}

/// Opens `key`'s values where the routes point now, with the first value.
async fn open(
    engine: &Engine,
    forwarder: &Forwarder,
    key: &Bytes,
) -> Result<(Source, WatchValue), Status> {
    if let Some(routes) = forwarder.routes_for(&MetadataMap::new()) {
        if let Route::Forward(hops) = routes.route(key) {
            let request = pb::WatchRequest { key: key.clone() };
            let opened = forwarder
                .open_stream(
                    "watch",
                    &hops,
                    request,
                    |mut client: CountersClient<Channel>, request| async move {
                        client.watch(request).await
                    },
                )
                .await;
            match opened {
                Forwarded::Answered(Ok(response), name) => {
                    let mut events = Box::new(response.into_inner());
                    let first = first_value(&mut events, &name).await?;
                    return Ok((Source::Owner { name, events }, first));
                }
                Forwarded::Answered(Err(status), name) => {
                    return Err(Status::new(
                        status.code(),
                        format!("{} (forwarded to {name})", status.message()),
                    ))
                }
                Forwarded::ServeHere => {}
            }
        }
    }
    let receiver = engine.watch(key).map_err(|e| status_of(&e))?;
    let first = receiver.borrow().map_err(|e| e.to_string());
    Ok((Source::Here(receiver), first))
}

/// The first value of an owner's stream: its current value.
async fn first_value(
    events: &mut Streaming<pb::WatchEvent>,
    owner: &str,
) -> Result<WatchValue, Status> {
    match tokio::time::timeout(DEFAULT_FORWARD_TIMEOUT, events.message()).await {
        Ok(Ok(Some(event))) => Ok(Ok(event.value)),
        Ok(Err(status)) if status.code() == Code::OutOfRange => {
            Ok(Err(status.message().to_string()))
        }
        Ok(Err(status)) => Err(status),
        Ok(Ok(None)) => Err(Status::unavailable(format!(
            "the key's owner {owner} ended the watch before its first value; watch again"
        ))),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "the key's owner {owner} sent no value in {} s; watch again",
            DEFAULT_FORWARD_TIMEOUT.as_secs()
        ))),
    }
}

/// Passes `source`'s values to `sender` until the watcher goes away,
/// opening again when the source breaks or moves.
async fn relay(
    engine: Arc<Engine>,
    forwarder: Arc<Forwarder>,
    key: Bytes,
    mut source: Source,
    sender: watch::Sender<WatchValue>,
) {
    loop {
        match follow(&forwarder, &key, &mut source, &sender).await {
            Ended::NoWatcher | Ended::OutOfRange => return,
            Ended::Reopen => {}
        }
        loop {
            tokio::select! {
                _ = sender.closed() => return,
                _ = tokio::time::sleep(REOPEN_PAUSE) => {}
            }
            match open(&engine, &forwarder, &key).await {
                Ok((opened, first)) => {
                    source = opened;
                    publish(&sender, first);
                    break;
                }
                Err(status) => {
                    tracing::debug!(key = ?key, %status, "a watch relay could not open; keeping the last value")
                }
            }
        }
    }
}

/// The name of `key`'s first live owner now (`None`: this node).
fn first_owner(forwarder: &Forwarder, key: &[u8]) -> Option<String> {
    let routes = forwarder.routes_for(&MetadataMap::new())?;
    routes.first_owner(key).map(str::to_string)
}

async fn follow(
    forwarder: &Forwarder,
    key: &Bytes,
    source: &mut Source,
    sender: &watch::Sender<WatchValue>,
) -> Ended {
    let followed = match source {
        Source::Owner { name, .. } => Some(name.clone()),
        Source::Here(_) => None,
    };
    let mut check = tokio::time::interval(ROUTE_CHECK);
    check.tick().await;
    loop {
        let next = async {
            match source {
                Source::Owner { events, .. } => match events.message().await {
                    Ok(Some(event)) => Some(Ok(event.value)),
                    Err(status) if status.code() == Code::OutOfRange => {
                        Some(Err(status.message().to_string()))
                    }
                    Ok(None) | Err(_) => None,
                },
                Source::Here(receiver) => match receiver.changed().await {
                    Ok(()) => Some(receiver.borrow_and_update().map_err(|e| e.to_string())),
                    Err(_) => None,
                },
            }
        };
        tokio::select! {
            _ = sender.closed() => return Ended::NoWatcher,
            _ = check.tick() => {
                if first_owner(forwarder, key) != followed {
                    return Ended::Reopen;
                }
            }
            next = next => match next {
                Some(value) => {
                    let out_of_range = value.is_err();
                    publish(sender, value);
                    if out_of_range {
                        return Ended::OutOfRange;
                    }
                }
                None => return Ended::Reopen,
            },
        }
    }
}

/// Sends `value` when it differs from the last one sent.
fn publish(sender: &watch::Sender<WatchValue>, value: WatchValue) {
    sender.send_if_modified(|current| {
        if *current == value {
            return false;
        }
        *current = value;
        true
    });
}
