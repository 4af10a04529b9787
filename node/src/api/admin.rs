//! The `Admin` gRPC service: the cluster as this node sees it, for
//! `tally status` and the status page, the backup stream of
//! `tally admin backup` ([`super::backup`]), and the partition map, drain
//! and remove of partitioned regions ([`super::partitions`]).

use std::sync::Arc;

use tally_proto::v1 as pb;
use tally_proto::v1::admin_server::Admin;
use tonic::{Request, Response, Status};

use crate::engine::{now_ms, Engine};
use crate::gossip::lifecycle::Partitioning;

/// How many hot keys per operation the status shows.
pub const HOT_KEYS_IN_STATUS: usize = 10;

/// What this node tells about itself.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// The cluster id.
    pub cluster_id: String,
    /// The node's name.
    pub node_name: String,
    /// The gRPC address peers and clients use.
    pub grpc_addr: String,
    /// The gossip address.
    pub gossip_addr: String,
    /// The newest protocol version this node speaks (what finalize moves to).
    pub protocol_newest: u32,
}

/// See the module documentation.
pub struct AdminService {
    engine: Arc<Engine>,
    info: NodeInfo,
    partitioning: Arc<Partitioning>,
    gossip_interval: std::time::Duration,
}

impl AdminService {
    /// The service over `engine` and the node's lifecycle and partition map.
    pub fn new(
        engine: Arc<Engine>,
        info: NodeInfo,
        partitioning: Arc<Partitioning>,
        gossip_interval: std::time::Duration,
    ) -> Self {
        AdminService {
            engine,
            info,
            partitioning,
            gossip_interval,
        }
    }
}

/// True when two members publish the same state: the same counter digest,
/// and the same sets digest unless one of them publishes none (a build
/// before sets digests: its like sets cannot be compared, and holding that
/// against it would report a rolling upgrade as diverged until it ends).
pub fn same_state(a: &pb::Member, b: &pb::Member) -> bool {
    a.digest == b.digest
        && match (a.sets_digest, b.sets_digest) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
}

/// Whether the live members converged, and how that was judged (empty:
/// whole-node digests, as before folds went by partition). Once members
/// report by partition (cluster version 10) the answer compares, for every
/// two live members, their digests of the partitions both keep: in a
/// partitioned region whole-node digests differ by design.
fn convergence(
    core: &crate::replica::Replica,
    own_name: &str,
    members: &[pb::Member],
    own: &pb::Member,
) -> (bool, String) {
    use crate::replica::convergence::{shared_convergence, SharedView};
    let report = core.fold_report();
    let Some(own_parts) = report.partitions.as_ref() else {
        let converged = members
            .iter()
            .filter(|m| m.alive)
            .all(|m| same_state(m, own));
        return (converged, String::new());
    };
    let mut views = vec![SharedView {
        replica: core.identity().replica,
        name: own_name,
        report: Some(own_parts),
    }];
    for peer in core.peers().peers().filter(|peer| peer.member.alive) {
        views.push(SharedView {
            replica: peer.member.replica,
            name: &peer.member.node_name,
            report: peer
                .member
                .folds
                .as_ref()
                .and_then(|folds| folds.partitions.as_ref()),
        });
    }
    match shared_convergence(&views) {
        Ok(pairs) => (
            true,
            format!(
                "every two of the {} live members hold the same state of the partitions both keep ({pairs} pairs)",
                views.len()
            ),
        ),
        Err(why) => (false, why),
    }
}

/// The status as this node sees it.
pub fn status(engine: &Engine, info: &NodeInfo) -> pb::StatusResponse {
    let now = now_ms();
    let core = engine.core();
    let identity = core.identity().clone();
    let own = pb::Member {
        region: identity.region,
        node_name: info.node_name.clone(),
        replica: identity.replica.0,
        grpc_addr: info.grpc_addr.clone(),
        alive: true,
        digest: core.digest().0,
        sets_digest: Some(core.sets_digest().0),
        durable_seq: core.durable_seq(),
        since_last_sync_ms: None,
        seq_lag: 0,
        gossip_addr: info.gossip_addr.clone(),
        protocol_version: core.peers().own_protocol().newest,
        protocol_oldest: core.peers().own_protocol().oldest,
        refused: false,
        partitions: core.peers().own_partitions(),
        born_at: engine.store().born_at(),
    };
    let members: Vec<pb::Member> = core
        .peers()
        .peers()
        .map(|peer| {
            let watermark = core.peers().watermark(peer.member.replica);
            pb::Member {
                region: peer.member.region.clone(),
                node_name: peer.member.node_name.clone(),
                replica: peer.member.replica.0,
                grpc_addr: peer.member.grpc_addr.clone(),
                alive: peer.member.alive,
                digest: peer.member.digest,
                sets_digest: peer.member.sets_digest,
                durable_seq: peer.member.durable_seq,
                since_last_sync_ms: peer.last_success_ms.map(|at| now.saturating_sub(at)),
                seq_lag: peer
                    .member
                    .durable_seq
                    .saturating_sub(watermark.complete_seq()),
                gossip_addr: peer.member.gossip_addr.clone(),
                protocol_version: peer.member.protocol.newest,
                protocol_oldest: peer.member.protocol.oldest,
                refused: !core.peers().talks_with(&peer.member),
                partitions: peer.member.partitions,
                born_at: peer.member.born_at,
            }
        })
        .collect();
    let (converged, convergence) = convergence(&core, &info.node_name, &members, &own);
    let folds = core.folds();
    let held = core.kept().map(|kept| (kept.len(), kept.count().get()));
    let retired: Vec<pb::RetiredWriter> = folds
        .retired()
        .iter()
        .map(|(writer, reason)| pb::RetiredWriter {
            replica: writer.0,
            reason: reason.to_string(),
            folded_epoch: folds.book().folded_at(*writer).unwrap_or(0),
            waiting: folds
                .waits()
                .get(writer)
                .map(|wait| wait.explain(held))
                .unwrap_or_default(),
        })
        .collect();
    let retired_partitions: Vec<pb::RetiredPartition> = folds
        .unfolded_scoped()
        .map(|retirement| pb::RetiredPartition {
            replica: retirement.writer.0,
            partition: retirement.partition,
            phase: retirement.phase,
            waiting: folds
                .scoped_waits()
                .get(&retirement)
                .map(ToString::to_string)
                .unwrap_or_default(),
        })
        .collect();
    let folds_applied = core.folds_done();
    let core_partitions = core.peers().own_partitions();
    drop(core);
    pb::StatusResponse {
        self_: Some(own),
        members,
        converged,
        convergence,
        cluster_id: info.cluster_id.clone(),
        cluster_version: engine.store().format(),
        retired,
        retired_partitions,
        folds_applied,
        partitions: core_partitions,
        hot_keys: engine
            .hot_keys(HOT_KEYS_IN_STATUS)
            .into_iter()
            .map(|hot| pb::HotKey {
                key: hot.key.as_bytes().to_vec().into(),
                op: hot.op.as_str().to_string(),
                rate_per_sec: hot.rate_per_sec,
                count: hot.count,
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    type BackupStream = super::backup::BackupStream;

    async fn backup(
        &self,
        _request: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        Ok(Response::new(super::backup::backup_stream(
            self.engine.clone(),
            &self.info,
        )))
    }

    async fn finalize(
        &self,
        _request: Request<pb::FinalizeRequest>,
    ) -> Result<Response<pb::FinalizeResponse>, Status> {
        match crate::upgrade::finalize(&self.engine, self.info.protocol_newest).await {
            Ok((previous_version, cluster_version)) => Ok(Response::new(pb::FinalizeResponse {
                previous_version,
                cluster_version,
            })),
            Err(error @ crate::upgrade::FinalizeError::MembersBehind { .. }) => {
                Err(Status::failed_precondition(error.to_string()))
            }
            Err(error) => Err(Status::unavailable(error.to_string())),
        }
    }

    async fn retire(
        &self,
        request: Request<pb::RetireRequest>,
    ) -> Result<Response<pb::RetireResponse>, Status> {
        use crate::replica::folds::RetireRefused;
        let writer = crate::crdt::ReplicaId(request.into_inner().replica);
        let outcome = {
            let mut core = self.engine.core();
            let members = core.fold_members();
            core.handle_retire(writer, &members)
        };
        match outcome {
            Ok(newly_retired) => {
                self.engine.wake_committer();
                if newly_retired {
                    tracing::info!(replica = %writer, "replica retired by an operator; its slots are folded once every member holds their final state");
                }
                Ok(Response::new(pb::RetireResponse { newly_retired }))
            }
            Err(refused @ RetireRefused::Alive(_)) => {
                Err(Status::failed_precondition(refused.to_string()))
            }
            Err(refused) => Err(Status::invalid_argument(refused.to_string())),
        }
    }

    async fn partition_map(
        &self,
        request: Request<pb::PartitionMapRequest>,
    ) -> Result<Response<pb::PartitionMapResponse>, Status> {
        let region = request.into_inner().region;
        let counters = super::partitions::counters_stored(&self.engine);
        super::partitions::partition_map(&self.partitioning, &region, &counters).map(Response::new)
    }

    async fn drain(
        &self,
        request: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainResponse>, Status> {
        let node = request.into_inner().node;
        let newly_draining =
            super::partitions::drain(&self.partitioning, &node, self.gossip_interval).await?;
        Ok(Response::new(pb::DrainResponse { newly_draining }))
    }

    async fn remove(
        &self,
        request: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::RemoveResponse>, Status> {
        let node = request.into_inner().node;
        let removed = super::partitions::remove(&self.partitioning, &node)?;
        Ok(Response::new(pb::RemoveResponse { removed }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(status(&self.engine, &self.info)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(digest: u64, sets_digest: Option<u64>) -> pb::Member {
        pb::Member {
            digest,
            sets_digest,
            ..Default::default()
        }
    }

    #[test]
    fn members_agree_on_both_digests_or_on_the_counters_with_an_older_build() {
        assert!(same_state(&member(1, Some(2)), &member(1, Some(2))));
        assert!(
            !same_state(&member(1, Some(2)), &member(1, Some(3))),
            "like sets differ"
        );
        assert!(
            !same_state(&member(1, Some(2)), &member(4, Some(2))),
            "counters differ"
        );
        // A build before sets digests publishes none: not held against it.
        assert!(same_state(&member(1, Some(2)), &member(1, None)));
        assert!(same_state(&member(1, None), &member(1, Some(2))));
        assert!(!same_state(&member(1, None), &member(4, Some(2))));
    }
}
