//! The public `Likes` gRPC service (like sets and uniques): a thin shell
//! over the engine's functions in `engine/sets.rs`, which validate every
//! request; a bad one gets `INVALID_ARGUMENT` (or `FAILED_PRECONDITION`
//! before cluster version 3) with a message, and changes nothing. In a
//! `LikeBatch` each item is validated on its own: a bad item gets its own
//! error in its result and the others are applied.

use std::sync::Arc;

use tally_proto::v1 as pb;
use tally_proto::v1::likes_server::Likes;
use tonic::{Request, Response, Status};

use super::convert::{item_error, status_of};
use super::counters::{charge_items, check_batch_size};
use crate::engine::{Engine, LikeItem};
use crate::replica::LikeAccepted;

/// See the module documentation.
pub struct LikesService {
    engine: Arc<Engine>,
}

impl LikesService {
    /// The service over `engine`.
    pub fn new(engine: Arc<Engine>) -> Self {
        LikesService { engine }
    }

    async fn like_or_unlike(
        &self,
        request: Request<pb::LikeRequest>,
        like: bool,
    ) -> Result<Response<pb::LikeResponse>, Status> {
        let request = request.into_inner();
        let idempotency_key =
            (!request.idempotency_key.is_empty()).then_some(request.idempotency_key.as_str());
        let accepted = self
            .engine
            .like(&request.key, &request.member, like, idempotency_key)
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(like_response(&accepted)))
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

#[tonic::async_trait]
impl Likes for LikesService {
    async fn like(
        &self,
        request: Request<pb::LikeRequest>,
    ) -> Result<Response<pb::LikeResponse>, Status> {
        self.like_or_unlike(request, true).await
    }

    async fn unlike(
        &self,
        request: Request<pb::LikeRequest>,
    ) -> Result<Response<pb::LikeResponse>, Status> {
        self.like_or_unlike(request, false).await
    }

    async fn like_batch(
        &self,
        request: Request<pb::LikeBatchRequest>,
    ) -> Result<Response<pb::LikeBatchResponse>, Status> {
        charge_items(&request, request.get_ref().items.len());
        let items = request.into_inner().items;
        check_batch_size(items.len())?;
        self.engine
            .metrics()
            .like_batch_items
            .observe(items.len() as f64);
        let items: Vec<LikeItem<'_>> = items
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
            .like_batch(&items)
            .await
            .map_err(|e| status_of(&e))?;
        let results = results
            .into_iter()
            .map(|result| pb::LikeResult {
                outcome: Some(match result {
                    Ok(accepted) => pb::like_result::Outcome::Ok(like_response(&accepted)),
                    Err(error) => pb::like_result::Outcome::Error(item_error(&error)),
                }),
            })
            .collect();
        Ok(Response::new(pb::LikeBatchResponse { results }))
    }

    async fn liked(
        &self,
        request: Request<pb::LikedRequest>,
    ) -> Result<Response<pb::LikedResponse>, Status> {
        charge_items(&request, request.get_ref().members.len());
        let request = request.into_inner();
        let members: Vec<&[u8]> = request.members.iter().map(|m| m.as_ref()).collect();
        let liked = self
            .engine
            .liked(&request.key, &members)
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::LikedResponse { liked }))
    }

    async fn like_count(
        &self,
        request: Request<pb::LikeCountRequest>,
    ) -> Result<Response<pb::LikeCountResponse>, Status> {
        let count = self
            .engine
            .like_count(&request.into_inner().key)
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::LikeCountResponse { count }))
    }

    async fn list_likes(
        &self,
        request: Request<pb::ListLikesRequest>,
    ) -> Result<Response<pb::ListLikesResponse>, Status> {
        let request = request.into_inner();
        let page = self
            .engine
            .list_likes(&request.key, &request.page_token, request.limit as usize)
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::ListLikesResponse {
            members: page.members,
            next_token: page.next_token.unwrap_or_default().into(),
        }))
    }

    async fn verify_likes(
        &self,
        request: Request<pb::LikeCountRequest>,
    ) -> Result<Response<pb::VerifyLikesResponse>, Status> {
        let recount = self
            .engine
            .verify_likes(&request.into_inner().key)
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::VerifyLikesResponse {
            stored_count: recount.stored,
            recounted: recount.recounted,
            members_scanned: recount.scanned,
            consistent: recount.is_consistent(),
        }))
    }

    async fn observe(
        &self,
        request: Request<pb::ObserveRequest>,
    ) -> Result<Response<pb::ObserveResponse>, Status> {
        charge_items(&request, request.get_ref().members.len());
        let request = request.into_inner();
        let members: Vec<&[u8]> = request.members.iter().map(|m| m.as_ref()).collect();
        let (accepted, estimate) = self
            .engine
            .observe(&request.key, &members)
            .await
            .map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::ObserveResponse {
            registers_raised: accepted.raised as u32,
            estimate: estimate.round() as u64,
        }))
    }

    async fn distinct(
        &self,
        request: Request<pb::DistinctRequest>,
    ) -> Result<Response<pb::DistinctResponse>, Status> {
        let request = request.into_inner();
        let keys: Vec<&[u8]> = request.keys.iter().map(|k| k.as_ref()).collect();
        let union = self.engine.distinct(&keys).map_err(|e| status_of(&e))?;
        Ok(Response::new(pb::DistinctResponse {
            estimate: union.estimate().round() as u64,
            registers_digest: union.digest(),
        }))
    }
}
