//! The public `Counters` gRPC service: a thin shell over the [`Engine`].
//! Every request is validated by the engine and the core; a bad one gets an
//! `INVALID_ARGUMENT` or `OUT_OF_RANGE` status with a message and changes nothing.
//!
//! In a region of several nodes, `Add`, `AddBatch`, `Get` and `GetBatch`
//! for a key this node is not the first live owner of are forwarded to that
//! owner ([`super::forward`]); a batch is split by owner. `Watch` relays
//! the owner's stream ([`super::watch_relay`]). With one node in the region
//! (or one node in all), nothing is forwarded and the only cost is one
//! atomic load per request.
//!
//! The HTTP API's counter endpoints call this service in-process, so they
//! route, forward and answer exactly as gRPC does.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tally_proto::v1 as pb;
use tally_proto::v1::counters_client::CountersClient;
use tally_proto::v1::counters_server::Counters;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::engine::{now_ms, CounterRead, Engine, ReadParts};
use crate::replica::RegionPart;
use crate::security::ItemCharge;

use super::convert::{item_error, status_of};
use super::copies::{admission_deadline, deadline_of, durability_from, refuse_if_late};
use super::forward::{hint_owners, is_forwarded, Forwarded, Forwarder};
use super::watch_relay::ValueStream;
use crate::partition::Route;

/// The shortest gap between two updates of one `Watch` stream.
pub const WATCH_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The most items one batch call may carry.
pub const MAX_BATCH_ITEMS: usize = 10_000;

/// See the module documentation.
pub struct CountersService {
    engine: Arc<Engine>,
    forwarder: Arc<Forwarder>,
}

impl CountersService {
    /// The service over `engine`, forwarding by `forwarder`'s routes.
    pub fn new(engine: Arc<Engine>, forwarder: Arc<Forwarder>) -> Self {
        CountersService { engine, forwarder }
    }

    async fn add_here(
        &self,
        add: pb::AddRequest,
        deadline: Option<Duration>,
    ) -> Result<Response<pb::AddResponse>, Status> {
        let durability = durability_from(add.durability)?
            .map_or(self.engine.durability(), |asked| {
                asked.stronger(self.engine.durability())
            });
        let accepted = self
            .engine
            .add_as(
                &add.key,
                add.delta,
                idempotency_key(&add.idempotency_key),
                durability,
                deadline,
            )
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::AddResponse {
            value: accepted.value,
            duplicate: accepted.duplicate,
        }))
    }

    /// The items of a batch served here, each with its own answer.
    async fn add_batch_here(
        &self,
        adds: Vec<pb::AddRequest>,
        for_batch: Option<crate::engine::Durability>,
        deadline: Option<Duration>,
    ) -> Result<Vec<pb::AddResult>, Status> {
        let mut asked = Vec::with_capacity(adds.len());
        for add in &adds {
            let own = durability_from(add.durability)?;
            asked.push(match (own, for_batch) {
                (Some(own), Some(batch)) => Some(own.stronger(batch)),
                (own, batch) => own.or(batch),
            });
        }
        let results = self
            .engine
            .add_batch(
                adds.iter().zip(asked).map(|(add, durability)| {
                    (
                        add.key.as_ref(),
                        add.delta,
                        idempotency_key(&add.idempotency_key),
                        durability,
                    )
                }),
                deadline,
            )
            .await;
        Ok(results
            .into_iter()
            .map(|result| pb::AddResult {
                outcome: Some(match result {
                    Ok(accepted) => pb::add_result::Outcome::Ok(pb::AddResponse {
                        value: accepted.value,
                        duplicate: accepted.duplicate,
                    }),
                    Err(error) => pb::add_result::Outcome::Error(item_error(&error)),
                }),
            })
            .collect())
    }

    /// The values of `key` for a watcher (gRPC `Watch`, the HTTP event
    /// stream), from its first live owner ([`super::watch_relay`]).
    pub async fn values(
        &self,
        key: prost::bytes::Bytes,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<ValueStream, Status> {
        super::watch_relay::values(&self.engine, &self.forwarder, key, metadata).await
    }

    fn get_batch_here(&self, gets: Vec<pb::GetRequest>) -> Vec<pb::GetResult> {
        gets.into_iter()
            .map(|get| pb::GetResult {
                outcome: Some(match self.engine.read(&get.key, read_parts(&get)) {
                    Ok(read) => pb::get_result::Outcome::Ok(get_response(get.key, read)),
                    Err(error) => pb::get_result::Outcome::Error(item_error(&error)),
                }),
            })
            .collect()
    }
}

fn add_item_error(status: Status) -> pb::AddResult {
    pb::AddResult {
        outcome: Some(pb::add_result::Outcome::Error(wire_error(&status))),
    }
}

fn get_item_error(status: Status) -> pb::GetResult {
    pb::GetResult {
        outcome: Some(pb::get_result::Outcome::Error(wire_error(&status))),
    }
}

pub(super) fn wire_error(status: &Status) -> pb::Error {
    pb::Error {
        code: status.code() as i32,
        message: status.message().to_string(),
    }
}

fn idempotency_key(key: &str) -> Option<&str> {
    (!key.is_empty()).then_some(key)
}

/// A region's net part, clamped to `i64` (a part can exceed it while the
/// total does not).
pub fn region_net(part: &RegionPart) -> i64 {
    i64::try_from(part.net).unwrap_or(if part.net < 0 { i64::MIN } else { i64::MAX })
}

/// How long ago this node last synced with a remote region (none for the local one).
pub fn since_last_sync_ms(part: &RegionPart, now: u64) -> Option<u64> {
    if part.local {
        None
    } else {
        part.last_sync_ms.map(|at| now.saturating_sub(at))
    }
}

fn get_response(key: prost::bytes::Bytes, read: CounterRead) -> pb::GetResponse {
    let now = now_ms();
    pb::GetResponse {
        key,
        value: read.value,
        regions: read
            .regions
            .into_iter()
            .map(|part| pb::RegionValue {
                value: region_net(&part),
                increments: part.increments,
                decrements: part.decrements,
                local: part.local,
                since_last_sync_ms: since_last_sync_ms(&part, now),
                region: part.region,
            })
            .collect(),
        slots: read.slots.as_ref().map_or_else(Vec::new, |(slots, _)| {
            slots
                .iter()
                .map(|writer| pb::WriterSlot {
                    replica: writer.replica.0,
                    region: writer.region.clone(),
                    p: writer.slot.p,
                    n: writer.slot.n,
                })
                .collect()
        }),
        folded: read.slots.map(|(_, base)| pb::FoldedSums {
            epoch: base.epoch,
            p_low: base.p as u64,
            p_high: (base.p >> 64) as u64,
            n_low: base.n as u64,
            n_high: (base.n >> 64) as u64,
        }),
    }
}

/// The parts a `GetRequest` asks for besides the value.
fn read_parts(get: &pb::GetRequest) -> ReadParts {
    ReadParts {
        breakdown: get.breakdown,
        slots: get.slots,
    }
}

/// A counter's values from `receiver`: the current one first, then the
/// newest after each change, at most one per [`WATCH_MIN_INTERVAL`] (a hot
/// key must not flood a watcher). A value outside `i64` is the last item.
/// Shared by gRPC `Watch` and the HTTP event stream.
pub fn coalesced_values<E: Clone + Send + Sync + 'static>(
    receiver: tokio::sync::watch::Receiver<Result<i64, E>>,
) -> impl Stream<Item = Result<i64, E>> + Send {
    futures::stream::unfold(
        (receiver, true, false),
        |(mut receiver, first, ended)| async move {
            if ended {
                return None;
            }
            if !first {
                // Coalesce: at most one update per interval, always the newest value.
                tokio::time::sleep(WATCH_MIN_INTERVAL).await;
                receiver.changed().await.ok()?;
            }
            let value = receiver.borrow_and_update().clone();
            let ended = value.is_err();
            Some((value, (receiver, false, ended)))
        },
    )
}

/// A batch counts as one request per item for its token's rate limit (the
/// interceptor charged the first).
pub(super) fn charge_items<T>(request: &Request<T>, items: usize) {
    if let Some(charge) = request.extensions().get::<ItemCharge>() {
        charge.charge(items.saturating_sub(1));
    }
}

/// Refuses a batch of more than [`MAX_BATCH_ITEMS`] items.
pub fn check_batch_size(items: usize) -> Result<(), Status> {
    if items > MAX_BATCH_ITEMS {
        return Err(Status::invalid_argument(format!(
            "a batch of {items} items is too large; send at most {MAX_BATCH_ITEMS} per call"
        )));
    }
    Ok(())
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Counters for CountersService {
    async fn add(
        &self,
        request: Request<pb::AddRequest>,
    ) -> Result<Response<pb::AddResponse>, Status> {
        let deadline = deadline_of(request.metadata());
        let admit_by = admission_deadline(&request);
        let forwarded = is_forwarded(request.metadata());
        if let Some(routes) = self.forwarder.routes_for(request.metadata()) {
            if let Route::Forward(hops) = routes.route(&request.get_ref().key) {
                let add = request.into_inner();
                let sent = self
                    .forwarder
                    .forward(
                        "add",
                        &hops,
                        add.clone(),
                        deadline,
                        |mut client: CountersClient<Channel>, request| async move {
                            client.add(request).await
                        },
                    )
                    .await;
                return match sent {
                    Forwarded::Answered(result, owner) => hint_owners(result, &[owner]),
                    Forwarded::ServeHere => {
                        refuse_if_late(admit_by)?;
                        self.add_here(add, deadline).await
                    }
                };
            }
        }
        let add = request.into_inner();
        let result = match refuse_if_late(admit_by) {
            Ok(()) => self.add_here(add, deadline).await,
            Err(late) => Err(late),
        };
        self.forwarder.mark_served(forwarded, result)
    }

    async fn add_batch(
        &self,
        request: Request<pb::AddBatchRequest>,
    ) -> Result<Response<pb::AddBatchResponse>, Status> {
        charge_items(&request, request.get_ref().adds.len());
        let deadline = deadline_of(request.metadata());
        let admit_by = admission_deadline(&request);
        let forwarded = is_forwarded(request.metadata());
        let routes = self.forwarder.routes_for(request.metadata());
        let batch = request.into_inner();
        let adds = batch.adds;
        check_batch_size(adds.len())?;
        let for_batch = durability_from(batch.durability)?;
        for add in &adds {
            durability_from(add.durability)?;
        }
        let Some(routes) = routes else {
            if let Err(late) = refuse_if_late(admit_by) {
                return self.forwarder.mark_served(forwarded, Err(late));
            }
            let results = self.add_batch_here(adds, for_batch, deadline).await;
            let result = results.map(|results| Response::new(pb::AddBatchResponse { results }));
            return self.forwarder.mark_served(forwarded, result);
        };
        let batch_durability = batch.durability;
        let (results, owners) = self
            .forwarder
            .split_batch(
                "add_batch",
                &routes,
                adds,
                |add| add.key.as_ref(),
                deadline,
                |mut client: CountersClient<Channel>, request| async move {
                    let (metadata, extensions, adds) = request.into_parts();
                    let request = Request::from_parts(
                        metadata,
                        extensions,
                        pb::AddBatchRequest {
                            adds,
                            durability: batch_durability,
                        },
                    );
                    client
                        .add_batch(request)
                        .await
                        .map(|response| response.map(|batch| batch.results))
                },
                |adds| async move {
                    if let Err(late) = refuse_if_late(admit_by) {
                        return adds.iter().map(|_| add_item_error(late.clone())).collect();
                    }
                    // Durabilities were checked above: this cannot fail.
                    self.add_batch_here(adds, for_batch, deadline)
                        .await
                        .unwrap_or_default()
                },
                add_item_error,
            )
            .await;
        hint_owners(Ok(Response::new(pb::AddBatchResponse { results })), &owners)
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let forwarded = is_forwarded(request.metadata());
        if let Some(routes) = self.forwarder.routes_for(request.metadata()) {
            if let Route::Forward(hops) = routes.route(&request.get_ref().key) {
                let deadline = deadline_of(request.metadata());
                let get = request.get_ref().clone();
                let sent = self
                    .forwarder
                    .forward(
                        "get",
                        &hops,
                        get,
                        deadline,
                        |mut client: CountersClient<Channel>, request| async move {
                            client.get(request).await
                        },
                    )
                    .await;
                if let Forwarded::Answered(result, owner) = sent {
                    return hint_owners(result, &[owner]);
                }
            }
        }
        let get = request.into_inner();
        let result = self
            .engine
            .read(&get.key, read_parts(&get))
            .map_err(|e| status_of(&e))
            .map(|read| Response::new(get_response(get.key, read)));
        self.forwarder.mark_served(forwarded, result)
    }

    async fn get_batch(
        &self,
        request: Request<pb::GetBatchRequest>,
    ) -> Result<Response<pb::GetBatchResponse>, Status> {
        charge_items(&request, request.get_ref().gets.len());
        let deadline = deadline_of(request.metadata());
        let forwarded = is_forwarded(request.metadata());
        let routes = self.forwarder.routes_for(request.metadata());
        let gets = request.into_inner().gets;
        check_batch_size(gets.len())?;
        let Some(routes) = routes else {
            let results = self.get_batch_here(gets);
            let result = Ok(Response::new(pb::GetBatchResponse { results }));
            return self.forwarder.mark_served(forwarded, result);
        };
        let (results, owners) = self
            .forwarder
            .split_batch(
                "get_batch",
                &routes,
                gets,
                |get| get.key.as_ref(),
                deadline,
                |mut client: CountersClient<Channel>, request| async move {
                    let (metadata, extensions, gets) = request.into_parts();
                    let request =
                        Request::from_parts(metadata, extensions, pb::GetBatchRequest { gets });
                    client
                        .get_batch(request)
                        .await
                        .map(|response| response.map(|batch| batch.results))
                },
                |gets| async move { self.get_batch_here(gets) },
                get_item_error,
            )
            .await;
        hint_owners(Ok(Response::new(pb::GetBatchResponse { results })), &owners)
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let forwarded = is_forwarded(request.metadata());
        let (metadata, _, watch) = request.into_parts();
        let key = watch.key;
        let result = self.values(key.clone(), &metadata).await.map(|values| {
            let stream: WatchStream = Box::pin(values.map(move |value| match value {
                Ok(value) => Ok(pb::WatchEvent {
                    key: key.clone(),
                    value,
                }),
                Err(out_of_range) => Err(Status::out_of_range(out_of_range)),
            }));
            Response::new(stream)
        });
        self.forwarder.mark_served(forwarded, result)
    }
}
