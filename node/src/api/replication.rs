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

use crate::crdt::ReplicaId;
use crate::engine::Engine;
use crate::metrics::PeerLabels;
use crate::security::identity::{RefusalLog, NODE_URI_PREFIX};
use crate::security::PeerIdentity;

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
    /// Refusals logged recently, so a peer is logged once a minute.
    refusal_log: RefusalLog,
    /// What answers a releasing node's confirmations (`None`: confirms
    /// nothing).
    partitioning: Option<Arc<crate::gossip::lifecycle::Partitioning>>,
}

impl ReplicationService {
    /// The service over `engine`. With `require_peer_certificate` (TLS on), a
    /// caller must have presented a node certificate of the cluster CA (the
    /// TLS layer has verified any it presented) and speak for itself.
    pub fn new(engine: Arc<Engine>, require_peer_certificate: bool) -> Self {
        ReplicationService {
            engine,
            require_peer_certificate,
            refusal_log: RefusalLog::default(),
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
    /// With TLS on, a caller must present a node certificate
    /// ([`PeerIdentity`]): none is `UNAUTHENTICATED`, a client's is
    /// `PERMISSION_DENIED` (`what` names the call: "pulling", "pushing
    /// copies"). Each refusal is counted and logged once a minute per peer.
    fn check_peer<T>(&self, request: &Request<T>, what: &str) -> Result<PeerIdentity, Status> {
        let identity = PeerIdentity::of_request(request);
        if !self.require_peer_certificate || identity.is_node() {
            return Ok(identity);
        }
        let reason = match identity {
            PeerIdentity::Anonymous => "no_peer_certificate",
            _ => "not_a_node",
        };
        self.refuse(request, reason, &identity, what);
        Err(match identity {
            PeerIdentity::Anonymous => Status::unauthenticated(format!(
                "{what} requires mutual TLS: present a node certificate signed by the cluster CA"
            )),
            _ => Status::permission_denied(format!(
                "{what} is for nodes only: the caller presented {}, and a node certificate \
                 carries the URI {NODE_URI_PREFIX}NAME",
                identity.describe()
            )),
        })
    }

    /// Checks that a node identity speaks for the node named `claimed` (the
    /// name of the replica or asker the request says it comes from).
    fn check_speaks_for<T>(
        &self,
        request: &Request<T>,
        identity: &PeerIdentity,
        claimed: &str,
        what: &str,
    ) -> Result<(), Status> {
        if !self.require_peer_certificate || identity.speaks_for(claimed) {
            return Ok(());
        }
        self.refuse(request, "impersonation", identity, what);
        Err(Status::permission_denied(format!(
            "{what} refused: the request speaks for node {claimed:?}, but the caller presented \
             {}; a node speaks only for itself",
            identity.describe()
        )))
    }

    fn refuse<T>(&self, request: &Request<T>, reason: &str, identity: &PeerIdentity, what: &str) {
        self.engine.metrics().refused(reason);
        let remote = request.remote_addr();
        if self
            .refusal_log
            .should_log(remote.map(|addr| addr.ip()), reason)
        {
            tracing::warn!(?remote, identity = %identity.describe(), reason, "{what} refused");
        }
    }

    /// The node name of the current member `replica`, if membership knows it.
    fn member_name(&self, replica: ReplicaId) -> Option<(String, String)> {
        let core = self.engine.core();
        core.peers()
            .member(replica)
            .map(|member| (member.node_name.clone(), member.region.clone()))
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
        let identity = self.check_peer(&request, "pulling")?;
        let mut pull = pull_request_from(request.get_ref().clone(), MAX_PULL_BYTES)?;
        // Counters go to any node; idempotency records and their hash keys
        // only to a current member the certificate speaks for (records are
        // then served to the nodes of this region only, by the core).
        if self.require_peer_certificate && pull.records_from.is_some() {
            match self.member_name(pull.caller) {
                Some((name, _)) => self.check_speaks_for(&request, &identity, &name, "pulling")?,
                None => pull.records_from = None,
            }
        }
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
        let identity = self.check_peer(&request, "pushing copies")?;
        if self.require_peer_certificate {
            // A push carries the pushing node's own slots only: its source
            // must be a member this certificate speaks for, of that region.
            let source = ReplicaId(request.get_ref().source_replica);
            let Some((name, region)) = self.member_name(source) else {
                self.refuse(&request, "unknown_source", &identity, "pushing copies");
                return Err(Status::unavailable(format!(
                    "copy push refused: replica {source} is not a member this node knows yet; \
                     retry once membership has it"
                )));
            };
            self.check_speaks_for(&request, &identity, &name, "pushing copies")?;
            if region != request.get_ref().source_region {
                self.refuse(&request, "impersonation", &identity, "pushing copies");
                return Err(Status::permission_denied(format!(
                    "copy push refused: replica {source} is of region {region:?}, the push says {:?}",
                    request.get_ref().source_region
                )));
            }
        }
        super::copies::serve(&self.engine, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn confirm_holding(
        &self,
        request: Request<pb::ConfirmHoldingRequest>,
    ) -> Result<Response<pb::ConfirmHoldingResponse>, Status> {
        let identity = self.check_peer(&request, "confirming a handoff")?;
        self.check_speaks_for(
            &request,
            &identity,
            &request.get_ref().asker,
            "confirming a handoff",
        )?;
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
        crate::replica::PullRefused::IncompatibleProtocol { theirs, .. } => {
            crate::replica::version::ProtocolWindow::refusal_reason(theirs)
        }
        crate::replica::PullRefused::PartitionCount { .. } => "partition_count",
        crate::replica::PullRefused::Storage(_) => "storage",
    }
}
