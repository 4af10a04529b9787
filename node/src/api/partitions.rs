//! The Admin RPCs of partitioned regions: `PartitionMap`, `Drain` and
//! `Remove`, over the node's [`Partitioning`]. The conversions between the
//! core's view and the prost messages live here only, and so does the
//! mapping of the core's refusals to gRPC codes.

use std::collections::BTreeMap;
use std::time::Duration;

use tally_proto::v1 as pb;
use tonic::Status;

use crate::engine::Engine;
use crate::gossip::lifecycle::{LifecycleError, Partitioning};
use crate::partition::{AdminRefusal, DrainStep, NodeState};

/// How long a drain of another node waits for it to publish `draining`:
/// a few gossip rounds each way take well under a second, and the answer
/// must come within a client's default deadline (5 s).
pub const DRAIN_CONFIRM_WAIT: Duration = Duration::from_secs(3);

/// How many counters each node stores, by replica id: this node's from its
/// store, the others' as they last gossiped (those that published none are
/// left out).
pub fn counters_stored(engine: &Engine) -> BTreeMap<u64, u64> {
    let core = engine.core();
    let mut counters: BTreeMap<u64, u64> = core
        .peers()
        .peers()
        .filter_map(|peer| Some((peer.member.replica.0, peer.member.counters_stored?)))
        .collect();
    if let Some(own) = engine.store().counters_stored() {
        counters.insert(core.identity().replica.0, own);
    }
    counters
}

/// The partition map of `region` (empty: this node's) as this node sees
/// it, with each node's count of `counters` (by replica id,
/// [`counters_stored`]).
pub fn partition_map(
    partitioning: &Partitioning,
    region: &str,
    counters: &BTreeMap<u64, u64>,
) -> Result<pb::PartitionMapResponse, Status> {
    let region = if region.is_empty() {
        partitioning.region().to_string()
    } else {
        region.to_string()
    };
    let (view, endpoints) = partitioning.view();
    if !view.regions().contains(&region.as_str()) {
        return Err(Status::not_found(format!(
            "no node of region {region:?} is known to this node; regions: {}",
            view.regions().join(", ")
        )));
    }
    let members: Vec<&crate::partition::NodeInfo> =
        view.nodes().filter(|node| node.region == region).collect();
    let index: std::collections::BTreeMap<&str, u32> = members
        .iter()
        .enumerate()
        .map(|(i, node)| (node.name.as_str(), i as u32))
        .collect();
    let mut owned = vec![0u32; members.len()];
    let owners: Vec<pb::PartitionOwners> = view
        .partitions()
        .iter()
        .map(|partition| {
            let nodes: Vec<u32> = view
                .owners(&region, partition)
                .into_iter()
                .map(|name| index[name])
                .collect();
            for node in &nodes {
                owned[*node as usize] += 1;
            }
            pb::PartitionOwners { nodes }
        })
        .collect();
    let nodes = members
        .iter()
        .zip(owned)
        .map(|(node, partitions_owned)| {
            let (replica, grpc_addr) = endpoints
                .get(&node.name)
                .cloned()
                .unwrap_or((crate::crdt::ReplicaId(0), String::new()));
            pb::PartitionNode {
                node_name: node.name.clone(),
                region: node.region.clone(),
                replica: replica.0,
                grpc_addr,
                state: node.state.as_str().to_string(),
                alive: node.alive,
                gone: view.is_gone(node),
                partitions_owned,
                partitions_held: node.holding.len() as u32,
                partitions_releasing: node.releasing.len() as u32,
                counters_stored: counters.get(&replica.0).copied(),
            }
        })
        .collect();
    Ok(pb::PartitionMapResponse {
        partitions: view.partitions().get(),
        replication_factor: view.replication_factor(),
        effective_replication: view.effective_replication(&region) as u32,
        under_replicated: view.under_replicated(&region).len() as u32,
        region,
        nodes,
        owners,
        answered_by: partitioning.node_name().to_string(),
    })
}

/// `tally admin drain NODE`: true when it was not draining before.
pub async fn drain(
    partitioning: &Partitioning,
    node: &str,
    gossip_interval: Duration,
) -> Result<bool, Status> {
    let replica = match partitioning.drain(node).map_err(to_status)? {
        DrainStep::DrainingNow => return Ok(true),
        DrainStep::AlreadyDraining => return Ok(false),
        DrainStep::Requested(replica) => replica,
    };
    let deadline = tokio::time::Instant::now() + DRAIN_CONFIRM_WAIT;
    loop {
        if partitioning.published_state(replica) == Some(NodeState::Draining) {
            tracing::info!(node = %node, "draining, as asked through gossip");
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Status::unavailable(format!(
                "node {node:?} was asked to drain but has not confirmed within {} s; the request \
                 stays published and it drains when it sees it: check tally status",
                DRAIN_CONFIRM_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(gossip_interval).await;
    }
}

/// `tally admin remove NODE`: the replica ids newly removed.
pub fn remove(partitioning: &Partitioning, node: &str) -> Result<Vec<u64>, Status> {
    let removed = partitioning.remove(node).map_err(to_status)?;
    Ok(removed.into_iter().map(|replica| replica.0).collect())
}

fn to_status(error: LifecycleError) -> Status {
    match &error {
        LifecycleError::Refused(AdminRefusal::UnknownNode { .. }) => {
            Status::not_found(error.to_string())
        }
        LifecycleError::Refused(_) => Status::failed_precondition(error.to_string()),
        LifecycleError::Persist(_) => Status::unavailable(error.to_string()),
    }
}
