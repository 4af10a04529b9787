//! The public `Likes` gRPC service (like sets and uniques): a thin shell
//! over the engine's functions in `engine/sets.rs`, which validate every
//! request; a bad one gets `INVALID_ARGUMENT` with a message, and changes
//! nothing. In a
//! `LikeBatch` each item is validated on its own: a bad item gets its own
//! error in its result and the others are applied.
//!
//! A like set or uniques key belongs to its key's partition (protocol
//! version 9), as a counter does: in a region of several nodes, every call
//! of a key this node is not the first live owner of is forwarded to that
//! owner ([`super::forward`]), a `LikeBatch` is split by owner, and
//! `Distinct` over keys of several owners asks each for its keys' registers
//! (`with_registers`) and estimates their union here. With one node in the
//! region nothing is forwarded. The HTTP API's like and uniques endpoints
//! call this service in-process, so they route alike.

use std::future::Future;
use std::sync::Arc;

use tally_proto::v1 as pb;
use tally_proto::v1::likes_client::LikesClient;
use tally_proto::v1::likes_server::Likes;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::convert::{item_error, status_of};
use super::copies::deadline_of;
use super::counters::{charge_items, check_batch_size, wire_error};
use super::forward::{group_by_first_owner, hint_owners, is_forwarded, Forwarded, Forwarder};
use crate::crdt::{Crdt, HyperLogLog};
use crate::engine::{Engine, LikeItem};
use crate::partition::Route;
use crate::replica::LikeAccepted;

/// See the module documentation.
pub struct LikesService {
    engine: Arc<Engine>,
    forwarder: Arc<Forwarder>,
}

impl LikesService {
    /// The service over `engine`, forwarding by `forwarder`'s routes.
    pub fn new(engine: Arc<Engine>, forwarder: Arc<Forwarder>) -> Self {
        LikesService { engine, forwarder }
    }

    /// Sends a call of one `key` to the key's first live owner when this
    /// node is not it, and returns the owner's answer; `None`: serve it
    /// here (this node owns the key, the call was forwarded to it, or no
    /// owner answered).
    async fn to_owner<M, T, F, Fut>(
        &self,
        method: &'static str,
        request: &Request<M>,
        key: &[u8],
        call: F,
    ) -> Option<Result<Response<T>, Status>>
    where
        M: Clone,
        F: Fn(LikesClient<Channel>, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let routes = self.forwarder.routes_for(request.metadata())?;
        let Route::Forward(hops) = routes.route(key) else {
            return None;
        };
        let deadline = deadline_of(request.metadata());
        let message = request.get_ref().clone();
        match self
            .forwarder
            .forward(method, &hops, message, deadline, call)
            .await
        {
            Forwarded::Answered(result, owner) => Some(hint_owners(result, &[owner])),
            Forwarded::ServeHere => None,
        }
    }

    /// Serves `request` here with `serve`, marking the answer for a
    /// forwarder when the request was forwarded.
    async fn here<M, T, Fut>(
        &self,
        request: Request<M>,
        serve: impl FnOnce(M) -> Fut,
    ) -> Result<Response<T>, Status>
    where
        Fut: Future<Output = Result<T, Status>>,
    {
        let forwarded = is_forwarded(request.metadata());
        let result = serve(request.into_inner()).await.map(Response::new);
        self.forwarder.mark_served(forwarded, result)
    }

    async fn like_here(
        &self,
        request: pb::LikeRequest,
        like: bool,
    ) -> Result<pb::LikeResponse, Status> {
        let idempotency_key =
            (!request.idempotency_key.is_empty()).then_some(request.idempotency_key.as_str());
        let accepted = self
            .engine
            .like(&request.key, &request.member, like, idempotency_key)
            .await
            .map_err(|e| status_of(&e))?;
        Ok(like_response(&accepted))
    }

    /// Applies a batch here; a refusal of the whole batch (the store, the
    /// cluster version) is an error.
    async fn like_batch_here(
        &self,
        items: Vec<pb::LikeItem>,
    ) -> Result<Vec<pb::LikeResult>, Status> {
        let like_items: Vec<LikeItem<'_>> = items
            .iter()
            .map(|item| LikeItem {
                key: &item.key,
                member: &item.member,
                like: !item.unlike,
                idempotency_key: (!item.idempotency_key.is_empty())
                    .then_some(item.idempotency_key.as_str()),
            })
            .collect();
        let results = self
            .engine
            .like_batch(&like_items)
            .await
            .map_err(|e| status_of(&e))?;
        Ok(results
            .into_iter()
            .map(|result| pb::LikeResult {
                outcome: Some(match result {
                    Ok(accepted) => pb::like_result::Outcome::Ok(like_response(&accepted)),
                    Err(error) => pb::like_result::Outcome::Error(item_error(&error)),
                }),
            })
            .collect())
    }

    /// The union of the registers of `keys`, those of keys this node does
    /// not own asked of their owners (see the module documentation).
    async fn union_of(
        &self,
        request: &Request<pb::DistinctRequest>,
    ) -> Result<HyperLogLog, Status> {
        let keys: Vec<&[u8]> = request.get_ref().keys.iter().map(|k| k.as_ref()).collect();
        let Some(routes) = self.forwarder.routes_for(request.metadata()) else {
            return self.engine.distinct(&keys).map_err(|e| status_of(&e));
        };
        // Checked here first, so that a bad call is refused whole, as on a
        // node that holds every key.
        crate::engine::sets::check_distinct_keys(&keys).map_err(|e| status_of(&e))?;
        let (mut local, by_owner) = group_by_first_owner(&routes, keys.iter().copied(), |key| key);
        let deadline = deadline_of(request.metadata());
        let calls = by_owner.into_iter().map(|(hops, keys)| async move {
            let message = pb::DistinctRequest {
                keys: keys.iter().map(|key| key.to_vec().into()).collect(),
                with_registers: true,
            };
            let sent = self
                .forwarder
                .forward(
                    "distinct",
                    &hops,
                    message,
                    deadline,
                    |mut client: LikesClient<Channel>, request| async move {
                        client.distinct(request).await
                    },
                )
                .await;
            (keys, sent)
        });
        let mut union = HyperLogLog::new();
        for (keys, sent) in futures::future::join_all(calls).await {
            match sent {
                Forwarded::Answered(Ok(answer), owner) => {
                    let registers = HyperLogLog::from_bytes(&answer.into_inner().registers)
                        .map_err(|error| {
                            Status::internal(format!(
                                "the owner {owner} answered unreadable registers: {error}"
                            ))
                        })?;
                    union.merge(&registers);
                }
                Forwarded::Answered(Err(status), owner) => {
                    return Err(Status::new(
                        status.code(),
                        format!("{} (forwarded to {owner})", status.message()),
                    ));
                }
                Forwarded::ServeHere => local.extend(keys),
            }
        }
        if !local.is_empty() {
            let here = self.engine.distinct(&local).map_err(|e| status_of(&e))?;
            union.merge(&here);
        }
        Ok(union)
    }
}

fn like_response(accepted: &LikeAccepted) -> pb::LikeResponse {
    pb::LikeResponse {
        changed: accepted.changed,
        liked: accepted.liked,
        count: accepted.count,
        duplicate: accepted.duplicate,
        length: accepted.length,
    }
}

fn like_item_error(status: Status) -> pb::LikeResult {
    pb::LikeResult {
        outcome: Some(pb::like_result::Outcome::Error(wire_error(&status))),
    }
}

#[tonic::async_trait]
impl Likes for LikesService {
    async fn like(
        &self,
        request: Request<pb::LikeRequest>,
    ) -> Result<Response<pb::LikeResponse>, Status> {
        let key = request.get_ref().key.clone();
        let sent = self.to_owner("like", &request, &key, |mut client, request| async move {
            client.like(request).await
        });
        if let Some(answer) = sent.await {
            return answer;
        }
        self.here(request, |like| self.like_here(like, true)).await
    }

    async fn unlike(
        &self,
        request: Request<pb::LikeRequest>,
    ) -> Result<Response<pb::LikeResponse>, Status> {
        let key = request.get_ref().key.clone();
        let sent = self.to_owner("unlike", &request, &key, |mut client, request| async move {
            client.unlike(request).await
        });
        if let Some(answer) = sent.await {
            return answer;
        }
        self.here(request, |unlike| self.like_here(unlike, false))
            .await
    }

    async fn like_batch(
        &self,
        request: Request<pb::LikeBatchRequest>,
    ) -> Result<Response<pb::LikeBatchResponse>, Status> {
        charge_items(&request, request.get_ref().items.len());
        check_batch_size(request.get_ref().items.len())?;
        self.engine
            .metrics()
            .like_batch_items
            .observe(request.get_ref().items.len() as f64);
        let deadline = deadline_of(request.metadata());
        let forwarded = is_forwarded(request.metadata());
        let routes = self.forwarder.routes_for(request.metadata());
        let items = request.into_inner().items;
        let Some(routes) = routes else {
            let result = self
                .like_batch_here(items)
                .await
                .map(|results| Response::new(pb::LikeBatchResponse { results }));
            return self.forwarder.mark_served(forwarded, result);
        };
        let (results, owners) = self
            .forwarder
            .split_batch(
                "like_batch",
                &routes,
                items,
                |item| item.key.as_ref(),
                deadline,
                |mut client: LikesClient<Channel>, request| async move {
                    let (metadata, extensions, items) = request.into_parts();
                    let request =
                        Request::from_parts(metadata, extensions, pb::LikeBatchRequest { items });
                    client
                        .like_batch(request)
                        .await
                        .map(|response| response.map(|batch| batch.results))
                },
                |items| async move {
                    // Refused whole here (the store, the cluster version):
                    // each of these items says so.
                    let count = items.len();
                    self.like_batch_here(items).await.unwrap_or_else(|status| {
                        (0..count)
                            .map(|_| like_item_error(status.clone()))
                            .collect()
                    })
                },
                like_item_error,
            )
            .await;
        hint_owners(
            Ok(Response::new(pb::LikeBatchResponse { results })),
            &owners,
        )
    }

    async fn liked(
        &self,
        request: Request<pb::LikedRequest>,
    ) -> Result<Response<pb::LikedResponse>, Status> {
        charge_items(&request, request.get_ref().members.len());
        let key = request.get_ref().key.clone();
        let sent = self.to_owner("liked", &request, &key, |mut client, request| async move {
            client.liked(request).await
        });
        if let Some(answer) = sent.await {
            return answer;
        }
        self.here(request, |request| async move {
            let members: Vec<&[u8]> = request.members.iter().map(|m| m.as_ref()).collect();
            let liked = self
                .engine
                .liked(&request.key, &members)
                .map_err(|e| status_of(&e))?;
            Ok(pb::LikedResponse { liked })
        })
        .await
    }

    async fn like_count(
        &self,
        request: Request<pb::LikeCountRequest>,
    ) -> Result<Response<pb::LikeCountResponse>, Status> {
        let key = request.get_ref().key.clone();
        let sent = self.to_owner(
            "like_count",
            &request,
            &key,
            |mut client, request| async move { client.like_count(request).await },
        );
        if let Some(answer) = sent.await {
            return answer;
        }
        self.here(request, |request| async move {
            let count = self
                .engine
                .like_count(&request.key)
                .map_err(|e| status_of(&e))?;
            Ok(pb::LikeCountResponse { count })
        })
        .await
    }

    async fn list_likes(
        &self,
        request: Request<pb::ListLikesRequest>,
    ) -> Result<Response<pb::ListLikesResponse>, Status> {
        let key = request.get_ref().key.clone();
        let sent = self.to_owner(
            "list_likes",
            &request,
            &key,
            |mut client, request| async move { client.list_likes(request).await },
        );
        if let Some(answer) = sent.await {
            return answer;
        }
        self.here(request, |request| async move {
            let page = self
                .engine
                .list_likes(&request.key, &request.page_token, request.limit as usize)
                .map_err(|e| status_of(&e))?;
            Ok(pb::ListLikesResponse {
                members: page.members,
                next_token: page.next_token.unwrap_or_default().into(),
            })
        })
        .await
    }

    async fn verify_likes(
        &self,
        request: Request<pb::LikeCountRequest>,
    ) -> Result<Response<pb::VerifyLikesResponse>, Status> {
        let key = request.get_ref().key.clone();
        let sent = self.to_owner(
            "verify_likes",
            &request,
            &key,
            |mut client, request| async move { client.verify_likes(request).await },
        );
        if let Some(answer) = sent.await {
            return answer;
        }
        self.here(request, |request| async move {
            let recount = self
                .engine
                .verify_likes(&request.key)
                .map_err(|e| status_of(&e))?;
            Ok(pb::VerifyLikesResponse {
                stored_count: recount.stored,
                recounted: recount.recounted,
                members_scanned: recount.scanned,
                consistent: recount.is_consistent(),
            })
        })
        .await
    }

    async fn observe(
        &self,
        request: Request<pb::ObserveRequest>,
    ) -> Result<Response<pb::ObserveResponse>, Status> {
        charge_items(&request, request.get_ref().members.len());
        let key = request.get_ref().key.clone();
        let sent = self.to_owner(
            "observe",
            &request,
            &key,
            |mut client, request| async move { client.observe(request).await },
        );
        if let Some(answer) = sent.await {
            return answer;
        }
        self.here(request, |request| async move {
            let members: Vec<&[u8]> = request.members.iter().map(|m| m.as_ref()).collect();
            let (accepted, estimate) = self
                .engine
                .observe(&request.key, &members)
                .await
                .map_err(|e| status_of(&e))?;
            Ok(pb::ObserveResponse {
                registers_raised: accepted.raised as u32,
                estimate: estimate.round() as u64,
            })
        })
        .await
    }

    async fn distinct(
        &self,
        request: Request<pb::DistinctRequest>,
    ) -> Result<Response<pb::DistinctResponse>, Status> {
        let forwarded = is_forwarded(request.metadata());
        let with_registers = request.get_ref().with_registers;
        let result = self.union_of(&request).await.map(|union| {
            Response::new(pb::DistinctResponse {
                estimate: union.estimate().round() as u64,
                registers_digest: union.digest(),
                registers: if with_registers {
                    union.to_bytes().into()
                } else {
                    Default::default()
                },
            })
        });
        self.forwarder.mark_served(forwarded, result)
    }
}
