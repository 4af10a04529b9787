//! The runtime side of rolling upgrades: keeps the cluster version
//! ([`crate::replica::version`]) and says which peers are refused.
//!
//! Once per period the keeper reads the members the core knows and:
//! - logs, once per peer and window, each peer that shares no protocol
//!   version with this node (the core never pulls from it and refuses its
//!   pulls; `tally status` shows it);
//! - moves the cluster version up when every member speaks a newer version
//!   than the data directory is in. The store persists the new format first
//!   ([`crate::store::Store::raise_format`]); only then does the node write
//!   it and announce its new window.
//!
//! Invariant: the version moves only after the node has listened to gossip
//! for the settle time (and, when it has seeds, has heard of a member), so a
//! node that has just started never finalizes an upgrade over members it
//! has not met yet.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::crdt::ReplicaId;
use crate::engine::Engine;
use crate::gossip::membership::MembershipHandle;
use crate::replica::version::{next_cluster_version, ProtocolWindow};
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
        let mut ticker = tokio::time::interval(config.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let (members, own): (Vec<Member>, ProtocolWindow) = {
                let core = engine.core();
                let members = core.peers().peers().map(|p| p.member.clone()).collect();
                (members, core.peers().own_protocol())
            };
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
                        "refusing a peer that shares no protocol version with this node: \
                         no state is exchanged with it until the older of the two is upgraded \
                         (see \"Upgrading\" in the README)"
                    );
                }
            }
            let settled = started.elapsed() >= config.settle;
            if !settled || (config.has_seeds && members.is_empty()) {
                continue;
            }
            let current = engine.store().format();
            let target = next_cluster_version(current, config.newest, &members);
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
            tracing::info!(
                from = current,
                to = target,
                members = members.len(),
                "cluster version moved: every member speaks version {target}; \
                 records are now written in format {target}, and builds that \
                 speak only older versions are refused"
            );
        }
    })
}
