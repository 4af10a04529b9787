//! The plain values the client hands back, and their conversion from the
//! generated protobuf types (done here, once, so no prost type appears in the
//! public API).
//!
//! With the `serde` feature (off by default; the `tally` CLI turns it on for
//! its `--json` output) every value is `Serialize`/`Deserialize`. In JSON, 64-bit ids and digests are 16-digit lowercase hex strings (a JSON
//! number loses precision past 2^53) and durations are whole milliseconds in a
//! field whose name ends in `_ms` (`null` when absent).

use std::time::Duration;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};
use tally_proto::v1 as proto;

use crate::Error;

/// The answer to an add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct AddOutcome {
    /// The counter's value on the answering node right after the add.
    pub value: i64,
    /// True when the server had already applied an add with this idempotency
    /// key: nothing was added now, and `value` is the one the first add got.
    pub duplicate: bool,
}

/// A counter read with its per-region breakdown.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Counter {
    /// The counter's key.
    pub key: String,
    /// The counter's value: the sum of the regions' values.
    pub value: i64,
    /// One entry per region that ever wrote the counter.
    pub regions: Vec<RegionValue>,
}

/// One region's part of a counter, as the answering node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct RegionValue {
    /// The region's name.
    pub region: String,
    /// The region's contribution: its increments minus its decrements.
    pub value: i64,
    /// The sum of the region's increments.
    pub increments: u64,
    /// The sum of the region's decrements (a positive number).
    pub decrements: u64,
    /// True for the answering node's own region, whose part is exact.
    pub local: bool,
    /// Time since the answering node last synced with a node of this region:
    /// how stale this part may be. `None` for the local region and for a
    /// region never synced with. JSON: `since_last_sync_ms`.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "since_last_sync_ms", with = "optional_millis")
    )]
    pub since_last_sync: Option<Duration>,
}

/// A key taking many operations on the answering node right now.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct HotKey {
    /// The counter.
    pub key: String,
    /// `"add"` or `"get"`.
    pub op: String,
    /// Operations per second over the node's last complete window (an upper bound).
    pub rate_per_sec: f64,
}

/// The cluster as one node sees it.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct ClusterStatus {
    /// The cluster's name; nodes of other clusters are refused.
    pub cluster_id: String,
    /// The node that answered.
    pub node: Member,
    /// Every other member the answering node knows of, alive or not.
    pub members: Vec<Member>,
    /// True when every live member publishes the same digest of its state:
    /// the cluster has converged. From cluster version 10: when every two
    /// live members hold the same state of the partitions both keep.
    pub converged: bool,
    /// How `converged` was judged when not by whole-node digests (cluster
    /// version 10: the pairs of live members compared, or why they do not
    /// agree yet); empty otherwise.
    #[cfg_attr(feature = "serde", serde(default))]
    pub convergence: String,
    /// The answering node's hottest keys, for adds and for gets, hottest first.
    #[cfg_attr(feature = "serde", serde(default))]
    pub hot_keys: Vec<HotKey>,
    /// The cluster version the answering node has persisted: the newest
    /// record format it writes (see `docs/src/operations/upgrades.md`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub cluster_version: u32,
    /// Retired writers as the answering node knows them, folded or pending.
    #[cfg_attr(feature = "serde", serde(default))]
    pub retired: Vec<RetiredWriter>,
    /// Live writers' slots in one partition retired and not folded yet
    /// (the partition moved away from the writer for good).
    #[cfg_attr(feature = "serde", serde(default))]
    pub retired_partitions: Vec<RetiredPartition>,
    /// The fold epoch the answering node is done with (every fold up to it
    /// applied to its counters, or nothing of its writers held here).
    #[cfg_attr(feature = "serde", serde(default))]
    pub folds_applied: u64,
    /// The cluster's partition count P as the answering node's data
    /// directory records it (0: a build before partitions).
    #[cfg_attr(feature = "serde", serde(default))]
    pub partitions: u32,
}

/// A live writer's slots in one partition, retired (the partition moved
/// away from it for good) and waiting for their fold.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RetiredPartition {
    /// The writer's replica id.
    pub replica: u64,
    /// The partition.
    pub partition: u32,
    /// Which of the writer's phases there (0 before any fold of the pair).
    pub phase: u32,
    /// Why the fold waits; empty when about to be folded.
    pub waiting: String,
}

/// A retired writer (a replica id that never writes again) and its fold.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RetiredWriter {
    /// The replica id.
    pub replica: u64,
    /// Why it was retired.
    pub reason: String,
    /// The fold epoch its slots were folded at; 0 while the fold is pending.
    pub folded_epoch: u64,
    /// Why the fold waits (which member has not reported, or disagrees);
    /// empty when folded.
    pub waiting: String,
}

impl ClusterStatus {
    /// The answering node first, then the other members.
    pub fn all_members(&self) -> impl Iterator<Item = &Member> {
        std::iter::once(&self.node).chain(&self.members)
    }
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
pub struct Member {
    /// The region the node belongs to.
    pub region: String,
    /// The node's name.
    pub node_name: String,
    /// The node's replica id (new whenever its data directory is new).
    /// JSON: 16 hex digits.
    #[cfg_attr(feature = "serde", serde(with = "hex_u64"))]
    pub replica: u64,
    /// Where the node serves gRPC.
    pub grpc_addr: String,
    /// Where the node gossips membership.
    pub gossip_addr: String,
    /// Whether the failure detector holds the node alive.
    pub alive: bool,
    /// The node's published digest of its durable state. JSON: 16 hex digits.
    #[cfg_attr(feature = "serde", serde(with = "hex_u64"))]
    pub digest: u64,
    /// The node's published digest of its durable like sets and uniques;
    /// `None` from a build that publishes none. JSON: 16 hex digits or `null`.
    #[cfg_attr(feature = "serde", serde(default, with = "optional_hex_u64"))]
    pub sets_digest: Option<u64>,
    /// The node's published durable sequence number.
    pub durable_seq: u64,
    /// Time since the answering node last completed a pull from this member;
    /// `None` if never (and for the answering node itself). JSON:
    /// `since_last_sync_ms`.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "since_last_sync_ms", with = "optional_millis")
    )]
    pub since_last_sync: Option<Duration>,
    /// How many sequence numbers the answering node's watermark for this
    /// member trails the member's durable sequence.
    pub seq_lag: u64,
    /// The newest protocol version the member announces (1 for a build that
    /// announces none).
    #[cfg_attr(feature = "serde", serde(default))]
    pub protocol_version: u32,
    /// The oldest protocol version the member still speaks.
    #[cfg_attr(feature = "serde", serde(default))]
    pub protocol_oldest: u32,
    /// True when the member shares no protocol version with the answering
    /// node (the two exchange no state until the older one is upgraded), or
    /// announces another partition count.
    #[cfg_attr(feature = "serde", serde(default))]
    pub refused: bool,
    /// The partition count the member announces (0: a build before
    /// partitions, which holds every partition).
    #[cfg_attr(feature = "serde", serde(default))]
    pub partitions: u32,
    /// The newest protocol version of the build that created the member's
    /// data directory (0: a build that does not announce it). A cluster whose
    /// every member was created at the newest version moves to it without
    /// `tally admin finalize`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub born_at: u32,
}

impl Member {
    /// The replica id as 16 lowercase hex digits, as logs and the CLI show it.
    pub fn replica_hex(&self) -> String {
        format!("{:016x}", self.replica)
    }

    /// The digest as 16 lowercase hex digits.
    pub fn digest_hex(&self) -> String {
        format!("{:016x}", self.digest)
    }
}

impl From<proto::AddResponse> for AddOutcome {
    fn from(response: proto::AddResponse) -> Self {
        AddOutcome {
            value: response.value,
            duplicate: response.duplicate,
        }
    }
}

/// Builds a [`Counter`] from the answer to a read of `key` (the key asked
/// for is used rather than the echoed bytes, which are the same).
pub(crate) fn counter_from_proto(key: &str, response: proto::GetResponse) -> Counter {
    Counter {
        key: key.to_owned(),
        value: response.value,
        regions: response
            .regions
            .into_iter()
            .map(region_from_proto)
            .collect(),
    }
}

fn region_from_proto(region: proto::RegionValue) -> RegionValue {
    RegionValue {
        region: region.region,
        value: region.value,
        increments: region.increments,
        decrements: region.decrements,
        local: region.local,
        since_last_sync: region.since_last_sync_ms.map(Duration::from_millis),
    }
}

pub(crate) fn status_from_proto(response: proto::StatusResponse) -> Result<ClusterStatus, Error> {
    let node = response.self_.ok_or_else(|| {
        Error::Protocol("the status answer does not describe the answering node".to_owned())
    })?;
    Ok(ClusterStatus {
        cluster_id: response.cluster_id,
        node: member_from_proto(node),
        members: response
            .members
            .into_iter()
            .map(member_from_proto)
            .collect(),
        converged: response.converged,
        convergence: response.convergence,
        cluster_version: response.cluster_version,
        partitions: response.partitions,
        hot_keys: response
            .hot_keys
            .into_iter()
            .map(|hot| HotKey {
                key: String::from_utf8_lossy(&hot.key).into_owned(),
                op: hot.op,
                rate_per_sec: hot.rate_per_sec,
            })
            .collect(),
        retired: response
            .retired
            .into_iter()
            .map(|writer| RetiredWriter {
                replica: writer.replica,
                reason: writer.reason,
                folded_epoch: writer.folded_epoch,
                waiting: writer.waiting,
            })
            .collect(),
        retired_partitions: response
            .retired_partitions
            .into_iter()
            .map(|retired| RetiredPartition {
                replica: retired.replica,
                partition: retired.partition,
                phase: retired.phase,
                waiting: retired.waiting,
            })
            .collect(),
        folds_applied: response.folds_applied,
    })
}

fn member_from_proto(member: proto::Member) -> Member {
    Member {
        region: member.region,
        node_name: member.node_name,
        replica: member.replica,
        grpc_addr: member.grpc_addr,
        gossip_addr: member.gossip_addr,
        alive: member.alive,
        digest: member.digest,
        sets_digest: member.sets_digest,
        durable_seq: member.durable_seq,
        since_last_sync: member.since_last_sync_ms.map(Duration::from_millis),
        seq_lag: member.seq_lag,
        protocol_version: member.protocol_version,
        protocol_oldest: member.protocol_oldest,
        refused: member.refused,
        partitions: member.partitions,
        born_at: member.born_at,
    }
}

/// `Option<Duration>` as whole milliseconds, or `null`.
#[cfg(feature = "serde")]
mod optional_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => {
                let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
                serializer.serialize_some(&millis)
            }
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_millis))
    }
}

/// `u64` as 16 lowercase hex digits.
#[cfg(feature = "serde")]
pub(crate) mod hex_u64 {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{value:016x}"))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        u64::from_str_radix(&text, 16)
            .map_err(|error| D::Error::custom(format!("{text:?} is not a hex u64: {error}")))
    }
}

/// `Option<u64>` as 16 hex digits, or `null`.
#[cfg(feature = "serde")]
mod optional_hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<u64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => super::hex_u64::serialize(value, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u64>, D::Error> {
        #[derive(Deserialize)]
        struct Hex(#[serde(with = "super::hex_u64")] u64);
        Ok(Option::<Hex>::deserialize(deserializer)?.map(|Hex(value)| value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto_member(name: &str, replica: u64) -> proto::Member {
        proto::Member {
            region: "eu-west".to_owned(),
            node_name: name.to_owned(),
            replica,
            grpc_addr: "10.0.0.1:7100".to_owned(),
            alive: true,
            digest: 0xdead_beef,
            durable_seq: 42,
            since_last_sync_ms: Some(1500),
            seq_lag: 3,
            gossip_addr: "10.0.0.1:7200".to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn status_maps_every_field_and_puts_the_answering_node_first() {
        let status = status_from_proto(proto::StatusResponse {
            self_: Some(proto_member("n1", 1)),
            members: vec![proto_member("n2", u64::MAX)],
            converged: true,
            cluster_id: "prod".to_owned(),
            ..Default::default()
        })
        .unwrap();
        let names: Vec<_> = status.all_members().map(|m| m.node_name.as_str()).collect();
        assert_eq!(names, ["n1", "n2"]);
        assert_eq!(
            status.members[0].since_last_sync,
            Some(Duration::from_millis(1500))
        );
        assert_eq!(status.members[0].replica_hex(), "ffffffffffffffff");
        assert_eq!(status.node.digest_hex(), "00000000deadbeef");
        assert!(status.converged);
    }

    #[test]
    fn status_without_the_answering_node_is_a_protocol_error() {
        let result = status_from_proto(proto::StatusResponse::default());
        assert!(matches!(result, Err(Error::Protocol(_))));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn json_uses_hex_ids_and_millisecond_durations_and_round_trips() {
        let member = member_from_proto(proto_member("n1", u64::MAX));
        let json = serde_json::to_value(&member).unwrap();
        assert_eq!(json["replica"], "ffffffffffffffff");
        assert_eq!(json["digest"], "00000000deadbeef");
        assert_eq!(json["since_last_sync_ms"], 1500);
        let back: Member = serde_json::from_value(json).unwrap();
        assert_eq!(back, member);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn region_without_a_sync_serializes_null() {
        let region = region_from_proto(proto::RegionValue {
            region: "us-east".to_owned(),
            value: -5,
            increments: 10,
            decrements: 15,
            local: true,
            since_last_sync_ms: None,
        });
        let json = serde_json::to_value(&region).unwrap();
        assert_eq!(json["since_last_sync_ms"], serde_json::Value::Null);
        assert_eq!(json["value"], -5);
    }
}

/// How durable an add must be before the node acknowledges it (see
/// [`crate::ClientConfig::with_durability`]). The node applies the stronger
/// of this and its own `--durability`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// The node's `--durability` (`sync` unless its operator chose otherwise).
    #[default]
    NodeDefault,
    /// On the disk of the node that took it.
    Sync,
    /// On the disk of the node that took it and of its copies in the region
    /// (the node's `--write-copies`, that node included). When too few copies
    /// confirm it in time the add fails with `UNAVAILABLE` naming how many
    /// did, and its outcome is unknown: retry it with its idempotency key
    /// ([`crate::Client::add_with_key`]).
    Replicated,
}

impl Durability {
    /// The value of the `durability` field on the wire.
    pub(crate) fn wire(self) -> i32 {
        use tally_proto::v1::Durability as Wire;
        match self {
            Durability::NodeDefault => Wire::Unspecified as i32,
            Durability::Sync => Wire::Sync as i32,
            Durability::Replicated => Wire::Replicated as i32,
        }
    }
}
