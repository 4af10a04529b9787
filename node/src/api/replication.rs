//! The internal `Replication` gRPC service: answers a peer's pull with the
//! core's durable state, chunk by chunk, and takes a region peer's copy
//! pushes (replicated durability, `super::copies`). The core's lock is taken
//! per chunk only, so a large full sync never holds up adds for long.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use prost::Message;
use tally_proto::v1 as pb;
use tally_proto::v1::replication_server::Replication;
use tonic::{Request, Response, Status};

use crate::engine::Engine;
use crate::metrics::PeerLabels;

use super::convert::{chunk_to, pull_request_from, pull_status};

/// The most bytes one pull is answered with; the caller pulls again for more.
pub const MAX_PULL_BYTES: usize = 4 << 20;
/// The target size of one streamed chunk: about 500 counters of three
/// slots, which the puller merges into one commit.
pub const CHUNK_BYTES: usize = 32 << 10;

/// See the module documentation.
pub struct ReplicationService {
    engine: Arc<Engine>,
    require_peer_certificate: bool,
    /// What answers a releasing node's confirmations (`None`: confirms
    /// nothing).
    partitioning: Option<Arc<crate::gossip::lifecycle::Partitioning>>,
}

impl ReplicationService {
    /// The service over `engine`. With `require_peer_certificate` (TLS on), a
    /// caller must have presented a certificate that chains to the cluster CA
    /// (the TLS layer has verified any it presented).
    pub fn new(engine: Arc<Engine>, require_peer_certificate: bool) -> Self {
        ReplicationService {
            engine,
            require_peer_certificate,
            partitioning: None,
        }
    }

    /// Answers confirmations of released partitions from `partitioning`.
    pub fn with_partitioning(
        mut self,
        partitioning: Arc<crate::gossip::lifecycle::Partitioning>,
    ) -> Self {
        self.partitioning = Some(partitioning);
        self
    }
}

impl ReplicationService {
    /// With TLS on, a caller that presented no node certificate is refused
    /// (`what` names the call: "pulling", "pushing copies").
    fn check_peer_certificate<T>(&self, request: &Request<T>, what: &str) -> Result<(), Status> {
        if self.require_peer_certificate
            && request.peer_certs().is_none_or(|certs| certs.is_empty())
        {
            self.engine.metrics().refused("no_peer_certificate");
            tracing::warn!(remote = ?request.remote_addr(), "{what} refused: the caller presented no node certificate");
            return Err(Status::unauthenticated(format!(
                "{what} requires mutual TLS: present a node certificate signed by the cluster CA"
            )));
        }
        Ok(())
    }
}

type PullStream = Pin<Box<dyn Stream<Item = Result<pb::PullChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Replication for ReplicationService {
    type PullStream = PullStream;

    async fn pull(
        &self,
        request: Request<pb::PullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        self.check_peer_certificate(&request, "pulling")?;
        let mut pull = pull_request_from(request.into_inner(), MAX_PULL_BYTES)?;
        let engine = self.engine.clone();
        let labels = caller_labels(&engine, pull.caller);
        let remaining = pull.max_bytes;
        pull.max_bytes = remaining.min(CHUNK_BYTES);
        // The first chunk is computed now, so a refusal is the call's status.
        let first = engine.serve_pull(&pull).map_err(|refused| {
            engine.metrics().refused(refusal_reason(&refused));
            tracing::warn!(caller = %pull.caller, %refused, "pull refused");
            pull_status(&refused)
        })?;
        let stream = futures::stream::unfold(Some((first, pull, remaining)), move |state| {
            let engine = engine.clone();
            let labels = labels.clone();
            async move {
                let (chunk, mut pull, mut remaining) = state?;
                let wire = chunk_to(&chunk);
                let bytes = wire.encoded_len();
                engine
                    .metrics()
                    .sync_sent_bytes
                    .get_or_create(&labels)
                    .inc_by(bytes as u64);
                engine
                    .metrics()
                    .sync_sent_counters
                    .get_or_create(&labels)
                    .inc_by(chunk.counters.len() as u64);
                remaining = remaining.saturating_sub(bytes.max(1));
                let next = if chunk.is_last() || remaining == 0 {
                    None
                } else {
                    pull.after = chunk.next.clone();
                    pull.deltas_after = chunk.deltas_next.clone();
                    pull.records_from = chunk.records_next;
                    pull.max_bytes = remaining.min(CHUNK_BYTES);
                    match engine.serve_pull(&pull) {
                        Ok(next) => Some((next, pull, remaining)),
                        Err(refused) => {
                            tracing::warn!(caller = %pull.caller, %refused, "pull stopped");
                            None
                        }
                    }
                };
                Some((Ok(wire), next))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn copy(
        &self,
        request: Request<pb::CopyRequest>,
    ) -> Result<Response<pb::CopyResponse>, Status> {
        self.check_peer_certificate(&request, "pushing copies")?;
        super::copies::serve(&self.engine, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn confirm_holding(
        &self,
        request: Request<pb::ConfirmHoldingRequest>,
    ) -> Result<Response<pb::ConfirmHoldingResponse>, Status> {
        self.check_peer_certificate(&request, "confirming a handoff")?;
        let request = request.into_inner();
        let ours = self.engine.core().config().cluster_id.clone();
        if request.cluster_id != ours {
            self.engine.metrics().refused("foreign_cluster");
            return Err(Status::failed_precondition(format!(
                "cluster id mismatch: this node belongs to cluster '{ours}', the caller to '{}'",
                request.cluster_id
            )));
        }
        if request.asker.is_empty() {
            return Err(Status::invalid_argument(
                "asker is empty: name the node releasing the partitions",
            ));
        }
        let Some(partitioning) = &self.partitioning else {
            return Ok(Response::new(pb::ConfirmHoldingResponse::default()));
        };
        let count = partitioning.settings().partitions;
        let partitions = request
            .partitions
            .ok_or_else(|| {
                Status::invalid_argument("partitions is missing: name the partitions to confirm")
            })
            .and_then(|set| {
                super::convert::partition_set_from(set).map_err(|error| {
                    Status::invalid_argument(format!("partitions is not a partition set: {error}"))
                })
            })?;
        if partitions.count() != count {
            return Err(Status::failed_precondition(format!(
                "partition count mismatch: this node's cluster has {} partitions, the request {}",
                count.get(),
                partitions.count().get()
            )));
        }
        let confirmations = partitioning
            .answer_confirms(&request.asker, &partitions)
            .into_iter()
            .map(|(partition, through_seq)| pb::HoldingConfirmation {
                partition: partition.0,
                through_seq,
            })
            .collect();
        Ok(Response::new(pb::ConfirmHoldingResponse { confirmations }))
    }
}

/// The metric labels of a pull's caller: its replica id and region when it
/// is a current member, `unknown` for both otherwise. The caller chooses
/// the id it sends, so labelling by anything else would let anyone who can
/// reach the port grow the metrics without bound.
fn caller_labels(engine: &Engine, caller: crate::crdt::ReplicaId) -> PeerLabels {
    let core = engine.core();
    match core.peers().peer(caller) {
        Some(member) => PeerLabels {
            peer: caller.to_string(),
            region: member.member.region.clone(),
        },
        None => PeerLabels {
            peer: "unknown".to_string(),
            region: "unknown".to_string(),
        },
    }
}

fn refusal_reason(refused: &crate::replica::PullRefused) -> &'static str {
    match refused {
        crate::replica::PullRefused::WrongCluster { .. } => "wrong_cluster",
        crate::replica::PullRefused::WrongReplica { .. } => "wrong_replica",
        crate::replica::PullRefused::IncompatibleProtocol { .. } => "incompatible_protocol",
        crate::replica::PullRefused::PartitionCount { .. } => "partition_count",
        crate::replica::PullRefused::Storage(_) => "storage",
    }
}
