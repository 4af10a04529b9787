//! The anti-entropy loop: every sync interval, ask the core whom to pull from
//! ([`crate::replica::PeerBook::poll_pulls`]), run those pulls concurrently
//! over gRPC, and feed each chunk to the core. The loop only moves messages;
//! what to pull, what to merge and what to refuse is the core's decision.
//!
//! Each pull is bounded in time (`pull_timeout`, doubled for a peer after
//! each of its pulls that timed out, up to 16 times) and in bytes
//! (`max_bytes`); a peer with a pull still in flight is skipped, so one slow
//! or dead peer never stalls the others.
//!
//! Pulls are scoped by partition: only peers that serve a partition this
//! node keeps are pulled from, each for those partitions
//! ([`Partitioning::pull_scope`], shaped by [`CopySessions`]), and a pull
//! that reached the peer's durable sequence is reported back once what it
//! merged is durable here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use tally_proto::v1::replication_client::ReplicationClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use super::copy_sessions::{CopySessions, PullOutcome};
use super::lifecycle::Partitioning;
use crate::api::convert::{chunk_from, pull_request_to};
use crate::crdt::ReplicaId;
use crate::engine::{now_ms, Engine};
use crate::metrics::PeerLabels;
use crate::partition::PullScope;
use crate::replica::{PullPlan, PullRequest};

/// Settings of the loop.
#[derive(Clone, Debug)]
pub struct AntiEntropyConfig {
    /// The cluster id sent with every pull.
    pub cluster_id: String,
    /// Time between rounds.
    pub interval: Duration,
    /// The longest one pull may take.
    pub pull_timeout: Duration,
    /// The most bytes one pull asks for.
    pub max_bytes: usize,
    /// TLS towards peers (https, presenting this node's certificate), when on.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The local IP that outgoing pulls are bound to (`--peer-source-ip`);
    /// `None` lets the system choose.
    pub source_ip: Option<std::net::IpAddr>,
}

impl AntiEntropyConfig {
    /// Settings for a sync interval: a pull may take ten intervals (at least two seconds).
    pub fn for_interval(cluster_id: String, interval: Duration) -> Self {
        AntiEntropyConfig {
            cluster_id,
            interval,
            pull_timeout: (interval * 10).max(Duration::from_secs(2)),
            max_bytes: crate::api::replication::MAX_PULL_BYTES,
            tls: None,
            source_ip: None,
        }
    }
}

/// Stops the loop.
pub struct AntiEntropyHandle {
    stop_tx: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl AntiEntropyHandle {
    /// Stops starting rounds; pulls in flight are dropped (merges are idempotent).
    pub async fn shutdown(mut self) {
        if let Some(stop_tx) = self.stop_tx.take() {
            let _ = stop_tx.send(());
        }
        let _ = self.task.await;
    }
}

/// Starts the loop.
pub fn spawn_anti_entropy(
    engine: Arc<Engine>,
    partitioning: Arc<Partitioning>,
    config: AntiEntropyConfig,
) -> AntiEntropyHandle {
    let (stop_tx, mut stop_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let channels: Channels = Arc::default();
        let sessions: Arc<Mutex<CopySessions>> = Arc::default();
        let timeouts: Timeouts = Arc::default();
        let mut interval = tokio::time::interval(config.interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pulls = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = &mut stop_rx => break,
            }
            while pulls.try_join_next().is_some() {}
            // Asked before the core is locked: the lifecycle keeper locks
            // the partitioning first and the core second.
            let sources = partitioning.pull_sources();
            let (plans, own, protocol) = {
                let mut core = engine.core();
                let region = core.identity().region.clone();
                let own = core.identity().replica;
                let protocol = core.peers().own_protocol();
                let plans = core
                    .peers_mut()
                    .poll_pulls_among(now_ms(), &region, |member| {
                        sources.contains(&member.node_name)
                    });
                let plans: Vec<(PullPlan, String)> = plans
                    .into_iter()
                    .map(|plan| {
                        let name = core
                            .peers()
                            .member(plan.peer)
                            .map(|member| member.node_name.clone())
                            .unwrap_or_default();
                        (plan, name)
                    })
                    .collect();
                (plans, own, protocol)
            };
            update_lag_metrics(&engine);
            for (plan, name) in plans {
                let Some(scope) = partitioning.pull_scope(&name) else {
                    engine.core().peers_mut().handle_pull_skipped(plan.peer);
                    continue;
                };
                let Some(channel) = channel_for(&channels, &plan.grpc_addr, &config) else {
                    engine.core().peers_mut().handle_pull_failed(
                        now_ms(),
                        plan.peer,
                        config.interval.as_millis() as u64,
                    );
                    continue;
                };
                let mut request = PullRequest {
                    cluster_id: config.cluster_id.clone(),
                    caller: own,
                    expected: Some(plan.peer),
                    after: plan.after.clone(),
                    max_bytes: config.max_bytes,
                    directory_digest: plan.directory_digest,
                    protocol,
                    deltas_after: Some(plan.deltas_after.clone()),
                    records_from: plan.records_from,
                    scope: None,
                };
                let scope = lock(&sessions).prepare(now_ms(), plan.peer, &scope, &mut request);
                if request.after != plan.after || request.records_from != plan.records_from {
                    tracing::debug!(peer = %plan.peer, copy = %scope.copy.to_hex(), "a copy session starts: every cursor of the peer goes back to the start");
                }
                let scoped = Scoped {
                    partitioning: partitioning.clone(),
                    sessions: sessions.clone(),
                    scope,
                    timeouts: timeouts.clone(),
                };
                pulls.spawn(pull_once(
                    engine.clone(),
                    channels.clone(),
                    channel,
                    plan,
                    request,
                    scoped,
                    config.clone(),
                ));
            }
        }
        pulls.shutdown().await;
    });
    AntiEntropyHandle {
        stop_tx: Some(stop_tx),
        task,
    }
}

/// The cached channel to a peer's gRPC address, dialled lazily on first use
/// (also used by the copy pusher, `copier.rs`).
pub(crate) fn channel_for(
    channels: &Channels,
    addr: &str,
    config: &AntiEntropyConfig,
) -> Option<Channel> {
    let mut channels = channels.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(channel) = channels.get(addr) {
        return Some(channel.clone());
    }
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}")).and_then(|endpoint| {
        match &config.tls {
            Some(tls) => endpoint.tls_config(tls.clone()),
            None => Ok(endpoint),
        }
    });
    let endpoint = match endpoint {
        Ok(endpoint) => endpoint,
        Err(error) => {
            tracing::warn!(%addr, %error, "a peer published an unusable gRPC address");
            return None;
        }
    };
    let channel = endpoint
        .connect_timeout(config.pull_timeout.min(Duration::from_secs(1)))
        .tcp_nodelay(true)
        .local_address(config.source_ip)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(3))
        .keep_alive_while_idle(true)
        .connect_lazy();
    channels.insert(addr.to_string(), channel.clone());
    Some(channel)
}

/// Drops a peer's cached channel after a failed pull, so that the next round
/// dials again (and resolves the name again: a restarted peer may have a new
/// address) instead of waiting for HTTP/2 keep-alive to give up.
pub(crate) fn forget_channel(channels: &Mutex<HashMap<String, Channel>>, addr: &str) {
    channels
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(addr);
}

fn labels(engine: &Engine, peer: ReplicaId) -> PeerLabels {
    let core = engine.core();
    let region = match core.peers().peer(peer) {
        Some(state) => state.member.region.clone(),
        None => core.region_of(peer).unwrap_or("unknown").to_string(),
    };
    PeerLabels {
        peer: peer.to_string(),
        region,
    }
}

/// Channels to peers by gRPC address, reused across rounds.
pub(crate) type Channels = Arc<Mutex<HashMap<String, Channel>>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a pull reports its partitions to.
struct Scoped {
    partitioning: Arc<Partitioning>,
    sessions: Arc<Mutex<CopySessions>>,
    scope: PullScope,
    /// Per peer, its pulls that timed out in a row.
    timeouts: Timeouts,
}

/// Per peer, how many of its pulls timed out in a row.
type Timeouts = Arc<Mutex<HashMap<ReplicaId, u32>>>;

/// The most a pull's time limit is doubled after pulls that timed out.
const MAX_TIMEOUT_DOUBLINGS: u32 = 4;

impl Scoped {
    /// The time limit of a pull from `peer`: `base`, doubled for each of its
    /// last pulls that timed out in a row (at most 16 times `base`). A pull
    /// that must read much from the start (a copy session; records learned
    /// from a third node) may not fit in `base` on a loaded machine, and a
    /// pull cut short makes no headway next time either.
    fn time_limit(&self, peer: ReplicaId, base: Duration) -> Duration {
        let timed_out = lock(&self.timeouts).get(&peer).copied().unwrap_or(0);
        base * 2u32.pow(timed_out.min(MAX_TIMEOUT_DOUBLINGS))
    }

    /// Counts a pull from `peer` that timed out (or not).
    fn note_timeout(&self, peer: ReplicaId, timed_out: bool) {
        let mut timeouts = lock(&self.timeouts);
        if timed_out {
            *timeouts.entry(peer).or_default() += 1;
        } else {
            timeouts.remove(&peer);
        }
    }

    /// Reports a pull that ended well, once what it merged is durable here
    /// (a partition is counted as copied only when a crash cannot take the
    /// copy back); a pull whose merges do not become durable within
    /// `limit` is not reported (the next one will be).
    async fn report(
        &self,
        engine: &Engine,
        peer: ReplicaId,
        outcome: &PullOutcome,
        limit: Duration,
    ) {
        let Some((scope, served, through, read_from_scratch)) =
            lock(&self.sessions).finish(peer, &self.scope, outcome)
        else {
            return;
        };
        let needed = engine.core().changes_durable_at();
        let mut durable = engine.durable_seq();
        engine.wake_committer();
        let reached = tokio::time::timeout(limit, durable.wait_for(|seq| *seq >= needed)).await;
        let durable = matches!(reached, Ok(Ok(_)));
        tracing::debug!(%peer, partitions = %scope.partitions.to_hex(), served = %served.to_hex(), through, durable, "a scoped pull reached the peer's durable sequence");
        if durable {
            self.partitioning
                .handle_pulled(&scope, &served, through, &read_from_scratch);
        }
    }
}

async fn pull_once(
    engine: Arc<Engine>,
    channels: Channels,
    channel: Channel,
    plan: PullPlan,
    request: PullRequest,
    scoped: Scoped,
    config: AntiEntropyConfig,
) {
    let limit = scoped.time_limit(plan.peer, config.pull_timeout);
    let outcome = tokio::time::timeout(limit, run_pull(&engine, channel, &plan, &request)).await;
    scoped.note_timeout(plan.peer, outcome.is_err());
    let labels = labels(&engine, plan.peer);
    let interval_ms = config.interval.as_millis() as u64;
    match outcome {
        Ok(Ok(outcome)) => {
            scoped
                .report(&engine, plan.peer, &outcome, config.pull_timeout)
                .await;
            engine
                .core()
                .peers_mut()
                .handle_pull_finished(now_ms(), plan.peer);
            engine.metrics().sync_rounds.get_or_create(&labels).inc();
        }
        Ok(Err(error)) => pull_failed(&engine, &channels, &plan, &labels, interval_ms, &error),
        Err(_) => pull_failed(&engine, &channels, &plan, &labels, interval_ms, "timed out"),
    }
}

fn pull_failed(
    engine: &Engine,
    channels: &Channels,
    plan: &PullPlan,
    labels: &PeerLabels,
    interval_ms: u64,
    error: &str,
) {
    tracing::debug!(peer = %plan.peer, addr = %plan.grpc_addr, %error, "pull failed");
    forget_channel(channels, &plan.grpc_addr);
    engine
        .core()
        .peers_mut()
        .handle_pull_failed(now_ms(), plan.peer, interval_ms);
    engine.metrics().sync_errors.get_or_create(labels).inc();
}

async fn run_pull(
    engine: &Engine,
    channel: Channel,
    plan: &PullPlan,
    request: &PullRequest,
) -> Result<PullOutcome, String> {
    let mut outcome = PullOutcome::default();
    let mut client = ReplicationClient::new(channel).max_decoding_message_size(16 << 20);
    let mut stream = client
        .pull(pull_request_to(request))
        .await
        .map_err(|s| s.to_string())?
        .into_inner();
    let labels = labels(engine, plan.peer);
    while let Some(wire) = stream.message().await.map_err(|s| s.to_string())? {
        engine
            .metrics()
            .sync_received_bytes
            .get_or_create(&labels)
            .inc_by(wire.encoded_len() as u64);
        let chunk = chunk_from(wire).map_err(|(reason, message)| {
            engine.metrics().refused(reason);
            tracing::warn!(peer = %plan.peer, %message, "refused a chunk from a peer; nothing of it was merged");
            message
        })?;
        engine
            .metrics()
            .sync_received_counters
            .get_or_create(&labels)
            .inc_by(chunk.counters.len() as u64);
        let (served, through, last) = (chunk.served.clone(), chunk.next.seq, chunk.is_last());
        engine.merge_chunk(plan.peer, chunk).map_err(|refused| {
            engine.metrics().refused(chunk_refusal_reason(&refused));
            tracing::warn!(peer = %plan.peer, %refused, "refused a chunk from a peer; nothing of it was merged");
            refused.to_string()
        })?;
        outcome.add_chunk(served.as_ref(), through, last);
        engine.wait_for_commit_backlog(MERGED_AWAITING_COMMIT).await;
    }
    Ok(outcome)
}

/// Changed counters that may wait for a commit before the next chunk of a
/// pull is merged (see [`Engine::wait_for_commit_backlog`]).
const MERGED_AWAITING_COMMIT: usize = 256;

fn chunk_refusal_reason(refused: &crate::replica::ChunkRefused) -> &'static str {
    use crate::replica::ChunkRefused::*;
    match refused {
        WrongSource { .. } => "wrong_source",
        Oversized(_) | OversizedDeltas(_) | OversizedRecords(_) => "oversized",
        UnknownReplica { .. } => "unknown_replica",
        RegionConflict { .. } => "region_conflict",
        DuplicateKey(_) => "malformed",
        SetBeingDeleted(_) => "set_being_deleted",
        Storage(_) => "storage",
        Fold { .. } => "fold_epoch",
    }
}

fn update_lag_metrics(engine: &Engine) {
    let now = now_ms();
    let core = engine.core();
    for peer in core.peers().peers() {
        let labels = PeerLabels {
            peer: peer.member.replica.to_string(),
            region: peer.member.region.clone(),
        };
        engine.metrics().touch_peer(&labels);
        let watermark = core.peers().watermark(peer.member.replica);
        let lag = peer
            .member
            .durable_seq
            .saturating_sub(watermark.complete_seq());
        engine
            .metrics()
            .sync_lag_seq
            .get_or_create(&labels)
            .set(lag as i64);
        if let Some(at) = peer.last_success_ms {
            engine
                .metrics()
                .sync_age_seconds
                .get_or_create(&labels)
                .set(now.saturating_sub(at) as f64 / 1000.0);
        }
    }
}
