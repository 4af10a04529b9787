//! The public `Counters` gRPC service: a thin shell over the [`Engine`].
//! Every request is validated by the engine and the core; a bad one gets an
//! `INVALID_ARGUMENT` or `OUT_OF_RANGE` status with a message and changes nothing.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tally_proto::v1 as pb;
use tally_proto::v1::counters_server::Counters;
use tonic::{Request, Response, Status};

use crate::crdt::ValueOutOfRange;
use crate::engine::{now_ms, CounterRead, Engine};
use crate::replica::RegionPart;
use crate::security::ItemCharge;

use super::convert::{item_error, status_of};
use super::copies::{deadline_of, durability_from};

/// The shortest gap between two updates of one `Watch` stream.
pub const WATCH_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The most items one batch call may carry.
pub const MAX_BATCH_ITEMS: usize = 10_000;

/// See the module documentation.
pub struct CountersService {
    engine: Arc<Engine>,
}

impl CountersService {
    /// The service over `engine`.
    pub fn new(engine: Arc<Engine>) -> Self {
        CountersService { engine }
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
    }
}

/// A counter's values from `receiver`: the current one first, then the
/// newest after each change, at most one per [`WATCH_MIN_INTERVAL`] (a hot
/// key must not flood a watcher). A value outside `i64` is the last item.
/// Shared by gRPC `Watch` and the HTTP event stream.
pub fn coalesced_values(
    receiver: tokio::sync::watch::Receiver<Result<i64, ValueOutOfRange>>,
) -> impl Stream<Item = Result<i64, ValueOutOfRange>> + Send {
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
            let value = *receiver.borrow_and_update();
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
        let add = request.into_inner();
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

    async fn add_batch(
        &self,
        request: Request<pb::AddBatchRequest>,
    ) -> Result<Response<pb::AddBatchResponse>, Status> {
        charge_items(&request, request.get_ref().adds.len());
        let deadline = deadline_of(request.metadata());
        let batch = request.into_inner();
        let adds = batch.adds;
        check_batch_size(adds.len())?;
        let for_batch = durability_from(batch.durability)?;
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
        let results = results
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
            .collect();
        Ok(Response::new(pb::AddBatchResponse { results }))
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let get = request.into_inner();
        let read = self
            .engine
            .get(&get.key, get.breakdown)
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(get_response(get.key, read)))
    }

    async fn get_batch(
        &self,
        request: Request<pb::GetBatchRequest>,
    ) -> Result<Response<pb::GetBatchResponse>, Status> {
        charge_items(&request, request.get_ref().gets.len());
        let gets = request.into_inner().gets;
        check_batch_size(gets.len())?;
        let results = gets
            .into_iter()
            .map(|get| pb::GetResult {
                outcome: Some(match self.engine.get(&get.key, get.breakdown) {
                    Ok(read) => pb::get_result::Outcome::Ok(get_response(get.key, read)),
                    Err(error) => pb::get_result::Outcome::Error(item_error(&error)),
                }),
            })
            .collect();
        Ok(Response::new(pb::GetBatchResponse { results }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let key = request.into_inner().key;
        let receiver = self.engine.watch(&key).map_err(|e| status_of(&e))?;
        let stream = coalesced_values(receiver).map(move |value| match value {
            Ok(value) => Ok(pb::WatchEvent {
                key: key.clone(),
                value,
            }),
            Err(out_of_range) => Err(Status::out_of_range(out_of_range.to_string())),
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
