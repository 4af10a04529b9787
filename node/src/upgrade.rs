//! The runtime side of rolling upgrades: keeps the cluster version
//! ([`crate::replica::version`]) and says which peers are refused.
//!
//! Once per period the keeper reads the members the core knows and:
//! - logs, once per peer and window, each peer that shares no protocol
//!   version with this node, and once per peer and count each peer that
//!   announces another partition count (the core never pulls from either and
//!   refuses their pulls; `tally status` shows them);
//! - moves the cluster version up when every member speaks a newer version
//!   than the data directory is in. The store persists the new format first
//!   ([`crate::store::Store::raise_format`]); only then does the node write
//!   it and announce its new window.
//!
//! In manual mode (`--cluster-version-upgrade manual`, the default) the
//! keeper moves the version only to follow a member that was finalized
//! ([`crate::replica::version::followed_cluster_version`]), or when the cluster is new: every data
//! directory in it was created by a build of this version
//! ([`crate::replica::version::new_cluster_version`]). `tally admin finalize` ([`finalize`])
//! persists the new version first and the keeper then announces it, so the
//! rest of the cluster follows through gossip.
//!
//! Invariant: the version moves by this node's own decision (a new
//! cluster, auto mode) only after the node has listened to gossip for the
//! settle time (and, when it has seeds, has heard of a member), so a node
//! that has just started never finalizes an upgrade over members it has
//! not met yet. Following a member that was finalized already (its window
//! starts at the version) waits for nothing: that closes no rollback that
//! was still open.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::crdt::ReplicaId;
use crate::engine::Engine;
use crate::gossip::membership::MembershipHandle;
use crate::replica::version::{cluster_version_target, finalize_target, Moves, ProtocolWindow};
use crate::replica::Member;

/// Settings of the keeper.
#[derive(Clone, Debug)]
pub struct UpgradeConfig {
    /// The newest version this node speaks.
    pub newest: u32,
    /// How long the node listens to gossip before it may move the version.
    pub settle: Duration,
    /// Whether the node was given seeds (then it waits to hear of a member).
    pub has_seeds: bool,
    /// How often it looks.
    pub period: Duration,
    /// Manual mode: move only to follow a finalized member.
    pub manual: bool,
}

impl UpgradeConfig {
    /// The settle time for a gossip interval: twenty rounds, at least two
    /// seconds (chitchat spreads a new node's state in a few rounds).
    pub fn for_gossip_interval(newest: u32, gossip_interval: Duration, has_seeds: bool) -> Self {
        UpgradeConfig {
            newest,
            settle: (gossip_interval * 20).max(Duration::from_secs(2)),
            has_seeds,
            period: gossip_interval.max(Duration::from_millis(100)),
            manual: false,
        }
    }
}

/// Starts the keeper. Abort the task to stop it.
pub fn spawn_upgrade_keeper(
    engine: Arc<Engine>,
    membership: Arc<MembershipHandle>,
    config: UpgradeConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut refused_logged: HashSet<(ReplicaId, ProtocolWindow, ProtocolWindow)> =
            HashSet::new();
        let mut partitions_logged: HashSet<(ReplicaId, u32)> = HashSet::new();
        let mut published = engine.store().format();
        let mut ticker = tokio::time::interval(config.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let (members, own, own_partitions) = {
                let core = engine.core();
                let members: Vec<Member> = core.peers().peers().map(|p| p.member.clone()).collect();
                let refused: Vec<bool> = members
                    .iter()
                    .map(|member| !core.peers().partitions_agree(member))
                    .collect();
                let own_partitions = core.peers().own_partitions();
                let members: Vec<(Member, bool)> = members.into_iter().zip(refused).collect();
                (members, core.peers().own_protocol(), own_partitions)
            };
            for (member, _) in members.iter().filter(|(_, refused)| *refused) {
                if partitions_logged.insert((member.replica, member.partitions)) {
                    tracing::error!(
                        peer = %member.node_name,
                        replica = %member.replica,
                        region = %member.region,
                        theirs = member.partitions,
                        ours = own_partitions,
                        "refusing a peer that announces another partition count: a cluster's \
                         partition count is fixed at creation; restart that node with \
                         --partitions {own_partitions} and a new --data-dir"
                    );
                }
            }
            let members: Vec<Member> = members.into_iter().map(|(member, _)| member).collect();
            for member in &members {
                if !own.talks_with(&member.protocol)
                    && refused_logged.insert((member.replica, member.protocol, own))
                {
                    tracing::warn!(
                        peer = %member.node_name,
                        replica = %member.replica,
                        region = %member.region,
                        grpc = %member.grpc_addr,
                        theirs = %member.protocol,
                        ours = %own,
                        advice = %own.refusal_advice(&member.protocol),
                        "refusing a peer that shares no protocol version with this node: \
                         no state is exchanged with it until it is upgraded as the advice says"
                    );
                }
            }
            // `tally admin finalize` persisted a new version: announce it.
            let persisted = engine.store().format();
            if persisted > published {
                let window = ProtocolWindow::at(persisted, config.newest);
                engine.core().peers_mut().set_own_protocol(window);
                membership.publish_protocol(window);
                published = persisted;
                tracing::info!(
                    to = persisted,
                    protocol = %window,
                    "cluster version moved by tally admin finalize: records are now written \
                     in format {persisted}; announcing it so the other members follow"
                );
            }
            let current = engine.store().format();
            let settled =
                started.elapsed() >= config.settle && !(config.has_seeds && members.is_empty());
            let mode = match (settled, config.manual) {
                (false, _) => Moves::FollowOnly,
                (true, true) => Moves::Manual {
                    born_at: engine.store().born_at(),
                },
                (true, false) => Moves::Auto,
            };
            let target = cluster_version_target(mode, current, config.newest, &members);
            if target <= current {
                continue;
            }
            let store = Arc::clone(engine.store());
            match tokio::task::spawn_blocking(move || store.raise_format(target)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "cannot move the cluster version; trying again");
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot move the cluster version; trying again");
                    continue;
                }
            }
            let window = ProtocolWindow::at(target, config.newest);
            engine.core().peers_mut().set_own_protocol(window);
            membership.publish_protocol(window);
            published = target;
            tracing::info!(
                from = current,
                to = target,
                protocol = %window,
                members = members.len(),
                "cluster version moved: every member speaks version {target}; \
                 records are now written in format {target}, and builds that \
                 speak only older versions are refused"
            );
        }
    })
}

/// Why `tally admin finalize` did not move the cluster version.
#[derive(Debug, thiserror::Error)]
pub enum FinalizeError {
    /// Some members do not speak the newest version yet.
    #[error(
        "cannot finalize version {target}: {members} do not speak it yet; upgrade them \
         (or remove them from the cluster) and run tally admin finalize again"
    )]
    MembersBehind {
        /// The version asked for.
        target: u32,
        /// The members, each as `name (region, speaks a..=b)`.
        members: String,
    },
    /// The store could not persist the new version.
    #[error("cannot persist cluster version {target}: {cause}; nothing changed, try again")]
    Storage {
        /// The version asked for.
        target: u32,
        /// What failed.
        cause: String,
    },
}

/// `tally admin finalize`: moves the cluster version to the newest version
/// this node speaks when every member it knows speaks it. The new version is
/// persisted in the data directory first; then this node writes it and
/// refuses older builds, and the keeper announces it (other nodes follow).
/// Returns the versions before and after.
pub async fn finalize(engine: &Arc<Engine>, newest: u32) -> Result<(u32, u32), FinalizeError> {
    let current = engine.store().format();
    let members: Vec<Member> = {
        let core = engine.core();
        let members = core.peers().peers().map(|p| p.member.clone()).collect();
        members
    };
    let target = finalize_target(current, newest, &members).map_err(|behind| {
        FinalizeError::MembersBehind {
            target: newest,
            members: behind
                .iter()
                .map(|m| format!("{} ({}, speaks {})", m.node_name, m.region, m.protocol))
                .collect::<Vec<_>>()
                .join(", "),
        }
    })?;
    if target > current {
        let store = Arc::clone(engine.store());
        let storage = |cause: String| FinalizeError::Storage { target, cause };
        tokio::task::spawn_blocking(move || store.raise_format(target))
            .await
            .map_err(|error| storage(error.to_string()))?
            .map_err(|error| storage(error.to_string()))?;
        engine
            .core()
            .peers_mut()
            .set_own_protocol(ProtocolWindow::at(target, newest));
    }
    Ok((current, target))
}
