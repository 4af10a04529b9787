//! Partitioned regions on [`Client`]: the partition map a node computes
//! from membership (`Admin.PartitionMap`), and the operator's drain and
//! removal of a node (`Admin.Drain`, `Admin.Remove`).

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};
use tonic::Response;

use crate::client::Client;
use crate::request::with_timeout;
use crate::Error;

/// One node of a region, as a partition map shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct PartitionNode {
    /// Its name, unique in the cluster.
    pub node_name: String,
    /// Its region.
    pub region: String,
    /// Its replica id.
    pub replica: u64,
    /// Where it serves gRPC (`host:port`).
    pub grpc_addr: String,
    /// `joining`, `active`, `draining` or `left`.
    pub state: String,
    /// Whether failure detection holds it up.
    pub alive: bool,
    /// Down for `--dead-after` or longer: it owns nothing until it is back.
    pub gone: bool,
    /// How many partitions it owns.
    pub partitions_owned: u32,
    /// How many partitions it holds caught up and serves (owned and ready,
    /// or being handed away); 0 from a build before handoff.
    #[cfg_attr(feature = "serde", serde(default))]
    pub partitions_held: u32,
    /// Of those held, how many it is handing away (no longer owned).
    #[cfg_attr(feature = "serde", serde(default))]
    pub partitions_releasing: u32,
    /// How many counters it stores, as it last gossiped (about RF/N of the
    /// region's); `None` before it was heard, or from an older build.
    #[cfg_attr(feature = "serde", serde(default))]
    pub counters_stored: Option<u64>,
}

/// The partition map of one region, as one node computes it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct PartitionMap {
    /// The cluster's partition count P.
    pub partitions: u32,
    /// The configured replication factor.
    pub replication_factor: u32,
    /// The factor in effect in the region: `min(RF, nodes that may own)`.
    pub effective_replication: u32,
    /// Partitions of the region that fewer live owners hold up to date than
    /// `effective_replication` asks (an owner down, or catching up); 0 from
    /// a node that does not count them.
    #[cfg_attr(feature = "serde", serde(default))]
    pub under_replicated: u32,
    /// The region.
    pub region: String,
    /// The region's nodes, by name.
    pub nodes: Vec<PartitionNode>,
    /// Per partition (partition 0 first), its owners as indexes into
    /// `nodes`, first owner first.
    pub owners: Vec<Vec<u32>>,
    /// The node that answered.
    pub answered_by: String,
}

impl PartitionMap {
    /// The names of `partition`'s owners, first owner first (empty for a
    /// partition out of range).
    pub fn owners_of(&self, partition: u32) -> Vec<&str> {
        self.owners
            .get(partition as usize)
            .map(|owners| {
                owners
                    .iter()
                    .filter_map(|index| self.nodes.get(*index as usize))
                    .map(|node| node.node_name.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl From<tally_proto::v1::PartitionMapResponse> for PartitionMap {
    fn from(map: tally_proto::v1::PartitionMapResponse) -> Self {
        PartitionMap {
            partitions: map.partitions,
            replication_factor: map.replication_factor,
            effective_replication: map.effective_replication,
            under_replicated: map.under_replicated,
            region: map.region,
            nodes: map
                .nodes
                .into_iter()
                .map(|node| PartitionNode {
                    node_name: node.node_name,
                    region: node.region,
                    replica: node.replica,
                    grpc_addr: node.grpc_addr,
                    state: node.state,
                    alive: node.alive,
                    gone: node.gone,
                    partitions_owned: node.partitions_owned,
                    partitions_held: node.partitions_held,
                    partitions_releasing: node.partitions_releasing,
                    counters_stored: node.counters_stored,
                })
                .collect(),
            owners: map.owners.into_iter().map(|owners| owners.nodes).collect(),
            answered_by: map.answered_by,
        }
    }
}

impl Client {
    /// The partition map of `region` (`None`: the answering node's own
    /// region) as the node computes it from membership. `NotFound` for a
    /// region the node knows no node of.
    pub async fn partition_map(&self, region: Option<&str>) -> Result<PartitionMap, Error> {
        let request = tally_proto::v1::PartitionMapRequest {
            region: region.unwrap_or_default().to_string(),
        };
        self.policy()
            .run("partition_map", |timeout| {
                let mut admin = self.admin_stub();
                let request = with_timeout(request.clone(), timeout);
                async move { admin.partition_map(request).await.map(Response::into_inner) }
            })
            .await
            .map(PartitionMap::from)
    }

    /// Drains the node named `node` (`Admin.Drain`): it owns no partition
    /// from then on, and the other nodes of its region take them over.
    /// Returns false when it was draining already. Refused (`NotFound`,
    /// `FailedPrecondition`) for an unknown node, the last node of a region,
    /// a node that is down or has left. Safe to repeat.
    pub async fn drain(&self, node: &str) -> Result<bool, Error> {
        let request = tally_proto::v1::DrainRequest {
            node: node.to_string(),
        };
        let response = self
            .policy()
            .run("drain", |timeout| {
                let mut admin = self.admin_stub();
                let request = with_timeout(request.clone(), timeout);
                async move { admin.drain(request).await.map(Response::into_inner) }
            })
            .await?;
        Ok(response.newly_draining)
    }

    /// Removes the node named `node`, which must be down for good
    /// (`Admin.Remove`): its replica ids are `left` on every node from then
    /// on. Returns the replica ids newly removed (empty when none was new).
    /// Refused (`FailedPrecondition`, `NotFound`) for a live node, one that
    /// has left, or an unknown one.
    pub async fn remove(&self, node: &str) -> Result<Vec<u64>, Error> {
        let request = tally_proto::v1::RemoveRequest {
            node: node.to_string(),
        };
        let response = self
            .policy()
            .run("remove", |timeout| {
                let mut admin = self.admin_stub();
                let request = with_timeout(request.clone(), timeout);
                async move { admin.remove(request).await.map(Response::into_inner) }
            })
            .await?;
        Ok(response.removed)
    }
}
