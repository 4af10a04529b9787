//! Starting and stopping a whole node: store, engine and committer, gRPC and
//! HTTP servers, membership and the anti-entropy loop.
//!
//! Shutdown runs in the order that loses nothing: stop being ready, stop
//! serving, stop pulling, commit and flush what is pending, leave the cluster.
//! `/readyz` keeps answering "not ready" until the end. A store that failed
//! (fail-stop) is not closed: nothing more is written to it.
//!
//! A node that cannot start says why with a [`StartError`] that names the
//! setting or directory to look at.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::serve::spawn_grpc;
use crate::api::NodeInfo;
use crate::config::Settings;
use crate::engine::{CommitterHandle, Engine, StoreHealth};
use crate::gossip::anti_entropy::{spawn_anti_entropy, AntiEntropyConfig, AntiEntropyHandle};
use crate::gossip::copier::{spawn_copier, CopierHandle};
use crate::gossip::membership::{MembershipConfig, MembershipError, MembershipHandle};
use crate::metrics::Metrics;
use crate::replica::version::ProtocolWindow;
use crate::replica::ReplicaConfig;
use crate::replica::StorageError;
use crate::security::Security;
use crate::store::{FaultyStore, OpenError, SledStore, Store};
use crate::upgrade::{spawn_upgrade_keeper, UpgradeConfig};

/// Why a node did not start. Each message names what to look at. The
/// io and store errors are in the messages, not `source`s, so that a
/// `{:#}` chain prints them once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// TLS material or the token file could not be loaded (the security
    /// module's message names the flag and the file).
    #[error("{0:#}")]
    Security(anyhow::Error),
    /// The task opening the store panicked or was cancelled.
    #[error("the store opener died: {0}")]
    StoreOpenerDied(tokio::task::JoinError),
    /// The store would not open (its message says what to do).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The data directory belongs to another cluster or partition count.
    #[error(transparent)]
    ClusterFile(#[from] crate::cluster_file::ClusterFileError),
    /// The data directory's lifecycle file cannot be read.
    #[error(transparent)]
    LifecycleFile(#[from] crate::lifecycle_file::LifecycleFileError),
    /// The store opened but its state could not be read back.
    #[error("cannot recover the store in {}: {error}", dir.display())]
    Recover {
        /// The data directory.
        dir: PathBuf,
        /// What the store said.
        error: StorageError,
    },
    /// A listening port could not be bound.
    #[error("cannot listen on {setting} {addr}: {error}")]
    Listen {
        /// `--grpc-addr` or `--http-addr`.
        setting: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// The gossip layer did not start.
    #[error("cannot start gossip on --gossip-addr {addr}: {error}")]
    Gossip {
        /// The gossip address.
        addr: SocketAddr,
        /// Why.
        error: MembershipError,
    },
    /// Another live node already uses this node's name.
    #[error(
        "--node-name {name} is already used by another live node: replica {replica} in \
         region {region}, gRPC {grpc}, gossip {gossip}. Node names must be unique in the \
         cluster: start this node with another --node-name, or stop the other process \
         first (this node served nothing; its data directory {} is unchanged)",
        dir.display()
    )]
    NameTaken {
        /// This node's name.
        name: String,
        /// The other node's replica id.
        replica: String,
        /// The other node's region.
        region: String,
        /// The other node's gRPC address.
        grpc: String,
        /// The other node's gossip address.
        gossip: String,
        /// This node's data directory.
        dir: PathBuf,
    },
    /// The data directory's replica id was retired by the cluster.
    #[error("this data directory's replica {replica} was retired by the cluster (its slots are folded into the other nodes' counters): it must never write again. Move {} aside or wipe it and start again: the node joins with a new replica id and gets its data back from its peers", dir.display())]
    Retired {
        /// The retired replica id.
        replica: String,
        /// The data directory.
        dir: PathBuf,
    },
    /// The HTTP port's TLS material could not be loaded (the message names the flag).
    #[error("{0:#}")]
    HttpTls(anyhow::Error),
    /// The gRPC server did not start.
    #[error("{0:#}")]
    Grpc(anyhow::Error),
}

/// A running node.
pub struct NodeHandle {
    /// The engine, for in-process tests and the dev cluster.
    pub engine: Arc<Engine>,
    /// Where the gRPC API listens.
    pub grpc_addr: SocketAddr,
    /// Where the HTTP endpoints listen.
    pub http_addr: SocketAddr,
    /// This node's settings.
    pub settings: Settings,
    ready: Arc<AtomicBool>,
    grpc_stop: Option<oneshot::Sender<()>>,
    http_stop: Option<oneshot::Sender<()>>,
    grpc_task: JoinHandle<Result<(), tonic::transport::Error>>,
    http_task: JoinHandle<std::io::Result<()>>,
    /// Samples the status page's charts.
    chart_task: JoinHandle<()>,
    membership: Arc<MembershipHandle>,
    membership_task: JoinHandle<()>,
    upgrade_task: JoinHandle<()>,
    recount_task: JoinHandle<()>,
    fold_task: JoinHandle<()>,
    lifecycle_task: JoinHandle<()>,
    /// The confirmer and the purger of released partitions.
    release_tasks: [JoinHandle<()>; 2],
    anti_entropy: AntiEntropyHandle,
    copier: CopierHandle,
    committer: CommitterHandle,
}

/// Opens the store and starts every part of the node.
pub async fn start(settings: Settings) -> Result<NodeHandle, StartError> {
    let security = Security::load(&settings.security).map_err(StartError::Security)?;
    if let Some(tls) = &security.tls {
        crate::security::identity::check_own_certificate(&tls.chain, &settings.node_name)
            .map_err(|message| StartError::Security(anyhow::anyhow!(message)))?;
    }
    let http_tls = crate::http::serve::load_tls(&settings.http).map_err(StartError::HttpTls)?;
    if settings.warn_if_insecure {
        security.warn_if_insecure();
        if security.auth.is_some() && http_tls.is_none() {
            tracing::warn!(
                "--auth-tokens is set but the HTTP port speaks plain HTTP: tokens sent to the JSON \
                 API and the status page cross the network in clear text; set --http-tls-cert and \
                 --http-tls-key (they may name the node's own --tls-cert and --tls-key)"
            );
        }
    }
    let data_dir = settings.data_dir.clone();
    let region = settings.region.clone();
    let on_corrupt = settings.on_corrupt;
    let cache_bytes = settings.store_cache_bytes;
    let newest = crate::replica::version::NEWEST;
    let store = tokio::task::spawn_blocking(move || {
        SledStore::open_with_cache(&data_dir, &region, rand::random(), on_corrupt, cache_bytes)
    })
    .await
    .map_err(StartError::StoreOpenerDied)??;
    if let Some(aside) = &store.moved_aside {
        tracing::warn!(to = %aside.display(), "the damaged store was moved aside; this node is a new replica and rebuilds from its peers");
    }
    let identity = store.identity().clone();
    let cluster = crate::cluster_file::settle(
        &settings.data_dir,
        &settings.cluster_id,
        settings.partitions,
    )?;
    let lifecycle_record = crate::lifecycle_file::load(&settings.data_dir, cluster.partitions)?;
    let protocol = ProtocolWindow::at(store.format(), newest);
    let store: Arc<dyn Store> = match &settings.test_store_fault_file {
        Some(file) => {
            tracing::warn!(file = %file.display(), "test fault injection is on: this node's store fails or hangs when that file says so");
            Arc::new(FaultyStore::new(store, file.clone()))
        }
        None => Arc::new(store),
    };
    let metrics = Arc::new(Metrics::new());
    let replica_config = ReplicaConfig {
        cluster_id: settings.cluster_id.clone(),
        cache_capacity: settings.cache_capacity,
        idempotency_ttl_ms: settings.idempotency_ttl.as_millis() as u64,
        idempotency_capacity: settings.idempotency_capacity,
        sync_interval_ms: settings.sync_interval.as_millis() as u64,
        #[cfg(feature = "planted-bugs")]
        planted_bug: None,
    };
    let engine =
        Engine::open(store, replica_config, settings.durability, metrics).map_err(|error| {
            StartError::Recover {
                dir: settings.data_dir.clone(),
                error,
            }
        })?;
    if engine.core().is_fenced() {
        return Err(StartError::Retired {
            replica: engine.core().identity().replica.to_string(),
            dir: settings.data_dir.clone(),
        });
    }
    hold_adds_after_restart(&engine, &settings);
    engine.watch_disk(
        settings.data_dir.clone(),
        settings.min_free_disk,
        settings.node_name.clone(),
    );
    engine.core().peers_mut().set_own_protocol(protocol);
    engine.set_write_copies(settings.write_copies);
    engine.set_replication_factor(settings.replication_factor as usize);
    // The writers' digests by partition that folds in a partitioned region
    // compare: as the last clean stop saved them, or from every counter.
    let started = std::time::Instant::now();
    {
        let saved = crate::store::take_saved_partition_digests(&settings.data_dir);
        let store = Arc::clone(engine.store());
        let used = crate::store::set_partition_count(
            &mut engine.core(),
            cluster.partitions,
            &*store,
            saved.as_deref(),
        )
        .map_err(|error| StartError::Recover {
            dir: settings.data_dir.clone(),
            error,
        })?;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match used {
            true => tracing::debug!(
                elapsed_ms,
                "read the writer digests by partition saved at the last stop"
            ),
            false => tracing::info!(
                elapsed_ms,
                "computed the writer digests by partition from the stored counters"
            ),
        }
    }
    let recovered_seq = engine.core().durable_seq();
    let serving = crate::gossip::lifecycle::recovered_serving(
        lifecycle_record.as_ref(),
        cluster.partitions,
        recovered_seq > 0,
    );

    let listen = |setting: &'static str, addr: SocketAddr| {
        move |error| StartError::Listen {
            setting,
            addr,
            error,
        }
    };
    let grpc_listener = tokio::net::TcpListener::bind(settings.grpc_addr)
        .await
        .map_err(listen("--grpc-addr", settings.grpc_addr))?;
    let http_listener = tokio::net::TcpListener::bind(settings.http_addr)
        .await
        .map_err(listen("--http-addr", settings.http_addr))?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(listen("--grpc-addr", settings.grpc_addr))?;
    let http_addr = http_listener
        .local_addr()
        .map_err(listen("--http-addr", settings.http_addr))?;
    let advertise_grpc = if settings.advertise_grpc_addr == settings.grpc_addr.to_string() {
        grpc_addr.to_string()
    } else {
        settings.advertise_grpc_addr.clone()
    };

    let gossip_transport: Box<dyn chitchat::transport::Transport> = match &security.gossip_keys {
        Some(keys) => Box::new(crate::gossip::sealed_transport::SealedTransport::new(
            keys.clone(),
            engine.metrics().clone(),
            security.gossip_accept_plain,
        )),
        None => Box::new(chitchat::transport::UdpTransport),
    };
    let membership = MembershipHandle::spawn_with_transport(
        MembershipConfig {
            cluster_id: settings.cluster_id.clone(),
            node_name: settings.node_name.clone(),
            region: identity.region.clone(),
            replica: identity.replica,
            gossip_listen: settings.gossip_addr,
            gossip_advertise: settings.advertise_gossip_addr,
            grpc_advertise: advertise_grpc.clone(),
            seeds: settings.seeds.clone(),
            gossip_interval: settings.gossip_interval,
            protocol,
            partitions: cluster.partitions.get(),
            born_at: engine.store().born_at(),
            holding: Some(serving.clone()),
            state: Some(
                lifecycle_record
                    .as_ref()
                    .map_or(crate::partition::NodeState::Joining, |record| record.state),
            ),
        },
        gossip_transport.as_ref(),
    )
    .await
    .map_err(|error| StartError::Gossip {
        addr: settings.gossip_addr,
        error,
    })?;
    // A second process with this node's name must not start: it would
    // look like the same node to every tally status reader (issue #10, item 1).
    let holders = membership.wait_for_name_holders().await;
    if let Some(holder) = holders.first() {
        let _ = membership.shutdown().await;
        return Err(StartError::NameTaken {
            name: settings.node_name.clone(),
            replica: holder.replica.to_string(),
            region: holder.region.to_string(),
            grpc: holder.grpc_addr.to_string(),
            gossip: holder.gossip_addr.to_string(),
            dir: settings.data_dir.clone(),
        });
    }
    let membership = Arc::new(membership);
    let partitioning = crate::gossip::lifecycle::Partitioning::new(
        lifecycle_record,
        &serving,
        recovered_seq,
        settings.data_dir.clone(),
        identity.replica,
        &settings.node_name,
        &identity.region,
        &advertise_grpc,
        crate::partition::ViewSettings {
            partitions: cluster.partitions,
            replication_factor: settings.replication_factor,
            dead_after_ms: settings.dead_after.as_millis() as u64,
        },
        membership.clone(),
    );
    partitioning.start(&engine);
    let lifecycle_task = crate::gossip::lifecycle::spawn_lifecycle_keeper(
        engine.clone(),
        partitioning.clone(),
        settings.gossip_interval,
    );
    let membership_task = spawn_membership_feed(engine.clone(), membership.clone());
    let mut upgrade_config = UpgradeConfig::for_gossip_interval(
        newest,
        settings.gossip_interval,
        !settings.seeds.is_empty(),
    );
    upgrade_config.manual =
        settings.cluster_version_upgrade == crate::config::ClusterVersionUpgrade::Manual;
    let upgrade_task = spawn_upgrade_keeper(engine.clone(), membership.clone(), upgrade_config);
    let fold_task = crate::fold_keeper::spawn_fold_keeper(
        engine.clone(),
        membership.clone(),
        partitioning.clone(),
        crate::fold_keeper::FoldKeeperConfig {
            node_name: settings.node_name.clone(),
            retire_after: settings.retire_after,
            period: settings
                .gossip_interval
                .max(std::time::Duration::from_millis(100)),
        },
    );
    let committer = engine.spawn_committer(|_, _| {});
    let recount_task =
        crate::engine::sets::spawn_recount(engine.clone(), crate::engine::sets::RECOUNT_INTERVAL);
    let mut anti_entropy_config =
        AntiEntropyConfig::for_interval(settings.cluster_id.clone(), settings.sync_interval);
    anti_entropy_config.tls = security.tls.as_ref().map(|tls| tls.client.clone());
    anti_entropy_config.source_ip = settings.peer_source_ip;
    let copier = spawn_copier(
        engine.clone(),
        partitioning.clone(),
        anti_entropy_config.clone(),
    );
    let forwarder = Arc::new(crate::api::forward::Forwarder::new(
        partitioning.clone(),
        anti_entropy_config.clone(),
        engine.metrics().clone(),
    ));
    let confirmer =
        crate::gossip::release::spawn_confirmer(partitioning.clone(), anti_entropy_config.clone());
    let purger = crate::gossip::release::spawn_purger(engine.clone(), partitioning.clone());
    let anti_entropy =
        spawn_anti_entropy(engine.clone(), partitioning.clone(), anti_entropy_config);

    let info = NodeInfo {
        cluster_id: settings.cluster_id.clone(),
        node_name: settings.node_name.clone(),
        grpc_addr: advertise_grpc,
        gossip_addr: settings.advertise_gossip_addr.to_string(),
        protocol_newest: newest,
    };
    let (grpc_stop, grpc_stop_rx) = oneshot::channel::<()>();
    // One service for gRPC and the HTTP API: both route and forward alike.
    let likes = Arc::new(crate::api::LikesService::new(
        engine.clone(),
        forwarder.clone(),
    ));
    let counters = Arc::new(crate::api::CountersService::new(engine.clone(), forwarder));
    let grpc_task = spawn_grpc(
        engine.clone(),
        info.clone(),
        partitioning.clone(),
        counters.clone(),
        likes.clone(),
        settings.gossip_interval,
        &security,
        grpc_listener,
        http_addr.port(),
        async {
            let _ = grpc_stop_rx.await;
        },
    )
    .await
    .map_err(StartError::Grpc)?;

    let ready = Arc::new(AtomicBool::new(true));
    let (http_stop, http_stop_rx) = oneshot::channel::<()>();
    let charts = Arc::new(crate::http::charts::ChartHistory::default());
    let chart_task =
        crate::http::charts::spawn_sampler(engine.clone(), info.clone(), charts.clone());
    let router = crate::http::router(crate::http::HttpState {
        engine: engine.clone(),
        ready: ready.clone(),
        info,
        auth: security.auth.clone(),
        settings: settings.http.clone(),
        partitioning,
        counters,
        likes,
        charts,
    });
    let http_task = crate::http::serve::spawn_http(
        http_listener,
        router,
        http_tls,
        engine.metrics().clone(),
        async {
            let _ = http_stop_rx.await;
        },
    );

    tracing::info!(
        replica = %identity.replica,
        region = %identity.region,
        node = %settings.node_name,
        grpc = %grpc_addr,
        http = %http_addr,
        gossip = %settings.gossip_addr,
        durability = ?settings.durability,
        write_copies = settings.write_copies,
        protocol = %protocol,
        data_dir = %settings.data_dir.display(),
        "tally-node started"
    );
    Ok(NodeHandle {
        engine,
        grpc_addr,
        http_addr,
        settings,
        ready,
        grpc_stop: Some(grpc_stop),
        http_stop: Some(http_stop),
        grpc_task,
        http_task,
        chart_task,
        membership,
        membership_task,
        upgrade_task,
        recount_task,
        fold_task,
        lifecycle_task,
        release_tasks: [confirmer, purger],
        anti_entropy,
        copier,
        committer,
    })
}

/// Sets the restart hold (see `--restart-hold`): a node restarted on a
/// directory that had peers takes no add until a peer's fold report says
/// whether its id was retired while it was down, or the bound passes.
fn hold_adds_after_restart(engine: &Engine, settings: &Settings) {
    let mut core = engine.core();
    if settings.restart_hold.is_zero() || !core.needs_restart_hold(!settings.seeds.is_empty()) {
        return;
    }
    let hold_ms = settings.restart_hold.as_millis() as u64;
    core.hold_adds_until(crate::engine::now_ms().saturating_add(hold_ms));
    tracing::info!(
        hold_ms,
        "restarted on an existing data directory: adds are held until a peer's fold report says whether this replica was retired while it was down"
    );
}

/// Feeds membership changes to the core's peer book, and this node's durable
/// sequence and digest to membership after each commit.
fn spawn_membership_feed(engine: Arc<Engine>, membership: Arc<MembershipHandle>) -> JoinHandle<()> {
    let mut members_rx = membership.subscribe();
    let mut durable_rx = engine.durable_seq();
    tokio::spawn(async move {
        let mut members_changed = true;
        loop {
            if members_changed {
                let members = members_rx.borrow_and_update().clone();
                let own = engine.core().identity().replica;
                let others: Vec<_> = members.into_iter().filter(|m| m.replica != own).collect();
                engine
                    .metrics()
                    .live_members
                    .set(others.iter().filter(|m| m.alive).count() as i64);
                engine.core().peers_mut().handle_membership(others);
            }
            durable_rx.borrow_and_update();
            let (seq, digest, sets_digest) = {
                let core = engine.core();
                (core.durable_seq(), core.digest().0, core.sets_digest().0)
            };
            let counters = engine.store().counters_stored();
            membership.publish(seq, digest, sets_digest, counters);
            members_changed = tokio::select! {
                changed = members_rx.changed() => match changed {
                    Ok(()) => true,
                    Err(_) => return,
                },
                changed = durable_rx.changed() => match changed {
                    Ok(()) => false,
                    Err(_) => return,
                },
            };
        }
    })
}

impl NodeHandle {
    /// Stops the node without losing anything acknowledged or pending.
    pub async fn shutdown(mut self) {
        self.ready.store(false, Ordering::Release);
        if let Some(stop) = self.grpc_stop.take() {
            let _ = stop.send(());
        }
        // Streams such as Watch would hold the server open; give them a moment.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), &mut self.grpc_task).await;
        self.anti_entropy.shutdown().await;
        self.copier.shutdown().await;
        self.committer.shutdown().await;
        if !matches!(self.engine.store_health(), StoreHealth::Failed(_)) {
            // Saved before the store closes: the next start reads them
            // instead of every counter (only if nothing was committed since).
            let saved = crate::store::saved_partition_digests(&self.engine.core());
            if let Some(bytes) = saved {
                let dir = self.settings.data_dir.clone();
                let written = tokio::task::spawn_blocking(move || {
                    crate::store::save_partition_digests(&dir, &bytes)
                })
                .await;
                if !matches!(written, Ok(Ok(()))) {
                    tracing::warn!("cannot save the writer digests by partition; the next start computes them from the counters");
                }
            }
        }
        if let StoreHealth::Failed(cause) = self.engine.store_health() {
            tracing::warn!(%cause, "not closing the failed store: the next start recovers from what is durable");
        } else {
            let store = Arc::clone(self.engine.store());
            match tokio::task::spawn_blocking(move || store.close()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "closing the store failed; the next start rebuilds what it would have saved")
                }
                Err(error) => tracing::warn!(%error, "closing the store failed"),
            }
        }
        if let Some(stop) = self.http_stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), &mut self.http_task).await;
        self.chart_task.abort();
        let _ = self.chart_task.await;
        self.membership_task.abort();
        let _ = self.membership_task.await;
        self.upgrade_task.abort();
        let _ = self.upgrade_task.await;
        self.recount_task.abort();
        let _ = self.recount_task.await;
        self.fold_task.abort();
        let _ = self.fold_task.await;
        self.lifecycle_task.abort();
        let _ = self.lifecycle_task.await;
        for task in self.release_tasks {
            task.abort();
            let _ = task.await;
        }
        match Arc::try_unwrap(self.membership) {
            Ok(membership) => {
                if let Err(error) = membership.shutdown().await {
                    tracing::warn!(%error, "leaving the cluster failed");
                }
            }
            Err(_) => {
                tracing::warn!("membership still in use at shutdown; not announcing the leave")
            }
        }
        tracing::info!(
            durable_seq = *self.engine.durable_seq().borrow(),
            "tally-node stopped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_in_use_is_a_typed_error_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut settings = Settings::defaults(dir.path().join("data"));
        settings.grpc_addr = held.local_addr().unwrap();
        settings.http_addr = "127.0.0.1:0".parse().unwrap();
        settings.gossip_addr = "127.0.0.1:0".parse().unwrap();
        settings.advertise_gossip_addr = settings.gossip_addr;
        let error = match start(settings).await {
            Ok(_) => panic!("the node started on a port that is in use"),
            Err(error) => error,
        };
        assert!(
            matches!(&error, StartError::Listen { setting: "--grpc-addr", addr, .. } if *addr == held.local_addr().unwrap()),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.starts_with("cannot listen on --grpc-addr 127.0.0.1:"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
    }
}
