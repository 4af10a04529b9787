//! Membership: which other nodes are in the cluster, how to reach them, and
//! whether they are up, as chitchat (scuttlebutt gossip over UDP with a
//! phi-accrual failure detector) sees it.
//!
//! Chitchat carries small metadata only: each node publishes its region, node
//! name, replica id, gRPC address, durable sequence, state digest, protocol
//! versions and partition count as key-values. Counter state travels over gRPC (the anti-entropy loop), never
//! here.
//!
//! Invariants of [`MembershipHandle::members`]:
//! - it never lists this node, nor any incarnation of it with its replica id;
//! - it lists at most one member per replica id, and every live replica: two
//!   live processes that claim one node name are both listed (and pulled
//!   from), never one in place of the other. A restarted node (chitchat
//!   generation id = its start time in ms) supersedes its older incarnations
//!   once they are not alive, so a node restarted with a wiped disk shows up
//!   under its new replica id only;
//! - a node whose key-values are missing or unparsable is skipped;
//! - a node of another cluster is never listed: that refusal is chitchat's own
//!   check (a SYN with another cluster id is answered `BadCluster` and nothing
//!   of it is recorded), not re-done here.
//!
//! Node names: a node that finds its name held by another live replica at
//! start refuses to start ([`MembershipHandle::wait_for_name_holders`]);
//! one that meets such a holder later logs an error at once and every
//! [`NAME_CONFLICT_LOG_PERIOD`] while it lasts.
//!
//! Liveness: a node that leaves through [`MembershipHandle::shutdown`] gossips
//! a `leaving` key first and is listed as not alive as soon as that arrives. A
//! node that stops without leaving is marked not alive by the failure
//! detector, after about 8 times its observed heartbeat interval (about 1 s at
//! a 100 ms gossip interval), and is forgotten [`DEAD_NODE_GRACE_PERIOD`]
//! later.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chitchat::transport::{Transport, UdpTransport};
use chitchat::{
    spawn_chitchat, Chitchat, ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig,
    ProtocolVersion,
};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::{debug, error, info};

use crate::crdt::ReplicaId;
use crate::partition::{MemberFacts, NodeState, PartitionCount, PartitionSet};
use crate::replica::version::ProtocolWindow;
use crate::replica::Member;

const KEY_REGION: &str = "region";
const KEY_NODE_NAME: &str = "node_name";
const KEY_REPLICA: &str = "replica";
const KEY_GRPC_ADDR: &str = "grpc_addr";
const KEY_DURABLE_SEQ: &str = "durable_seq";
const KEY_DIGEST: &str = "digest";
/// The sets digest (like sets and uniques), apart from `digest` so that the
/// counter digest means the same on every build; absent from older builds.
const KEY_SETS_DIGEST: &str = "sets_digest";
/// The newest protocol version the node speaks (absent: 1, a build before versions).
const KEY_PROTOCOL: &str = "protocol";
/// The oldest protocol version the node speaks (it rises with the cluster version).
const KEY_PROTOCOL_OLDEST: &str = "protocol_oldest";
/// The cluster's partition count as the node has it (absent: a build before partitions).
const KEY_PARTITIONS: &str = "partitions";
/// The newest version of the build that created the node's data directory
/// (absent: a build before it was announced).
const KEY_BORN_AT: &str = "born_at";
/// Set (to `true`) by a node that is shutting down.
const KEY_LEAVING: &str = "leaving";
/// The node's lifecycle state (absent: a build before lifecycles, `active`).
const KEY_STATE: &str = "state";
/// The replicas the node knows to be removed, hex ids joined by commas.
const KEY_REMOVED: &str = "removed";
/// The replicas the node asks to drain, hex ids joined by commas.
const KEY_DRAIN: &str = "drain";
/// The partitions the node serves (ready or releasing), as
/// [`PartitionSet::to_hex`] writes them (absent: a build before handoff,
/// which holds every partition).
const KEY_HOLDING: &str = "holding";
/// Those of `holding` the node is handing away.
const KEY_RELEASING: &str = "releasing";
/// How many counters the node stores (absent: a build before it was
/// published), for the partition map's per-node counts.
const KEY_COUNTERS_STORED: &str = "counters_stored";

/// Phi above which a node is dead. Chitchat's phi is linear: the silence
/// divided by the mean heartbeat interval.
const PHI_THRESHOLD: f64 = 8.0;
/// Longer heartbeat intervals are not sampled (a pause, not a rate).
const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// How long a dead node stays listed (as not alive) before chitchat forgets it.
pub const DEAD_NODE_GRACE_PERIOD: Duration = Duration::from_secs(60 * 60);
/// How long tombstoned keys are kept (this module deletes none).
const TOMBSTONE_GRACE_PERIOD: Duration = Duration::from_secs(60 * 60);
/// How often a node repeats its error while another live replica holds its name.
pub const NAME_CONFLICT_LOG_PERIOD: Duration = Duration::from_secs(60);
/// The longest [`MembershipHandle::shutdown`] waits for its leave to spread.
const MAX_LEAVE_ANNOUNCEMENT: Duration = Duration::from_secs(1);

/// How to join the cluster and what to tell it.
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    /// Nodes of another cluster id are refused.
    pub cluster_id: String,
    /// This node's name, unique in the cluster (chitchat's node id).
    pub node_name: String,
    /// This node's region.
    pub region: String,
    /// This node's replica id.
    pub replica: ReplicaId,
    /// Where to bind UDP.
    pub gossip_listen: SocketAddr,
    /// What others use to reach us (usually `gossip_listen`).
    pub gossip_advertise: SocketAddr,
    /// Where our gRPC server can be reached, e.g. `127.0.0.1:7100`.
    pub grpc_advertise: String,
    /// Seed nodes, `host:port` (names are resolved again every minute).
    pub seeds: Vec<String>,
    /// The gossip round period (100 ms in practice).
    pub gossip_interval: Duration,
    /// The protocol versions this node speaks at start.
    pub protocol: ProtocolWindow,
    /// The cluster's partition count (a peer announcing another is refused).
    pub partitions: u32,
    /// The newest version of the build that created the data directory
    /// ([`crate::store::Store::born_at`]).
    pub born_at: u32,
    /// The partitions the node serves at start (recovered from its data
    /// directory), gossiped from the first round so that no peer reads the
    /// absent key as "every partition" meanwhile; `None` publishes none
    /// until [`MembershipHandle::publish_holding`].
    pub holding: Option<PartitionSet>,
    /// The node's lifecycle state at start (from its data directory),
    /// gossiped from the first round for the same reason: an absent state
    /// reads as `active` (a build before lifecycles).
    pub state: Option<NodeState>,
}

/// What [`MembershipHandle::publish`] last received.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
struct Published {
    durable_seq: u64,
    digest: u64,
    sets_digest: u64,
    /// How many counters the store holds (`None`: a store that cannot say).
    counters_stored: Option<u64>,
    /// Set once the protocol window changed (the cluster version moved).
    protocol: Option<ProtocolWindow>,
    /// The fold report's text ([`super::fold_report`]), once there is one.
    folds: Option<String>,
    /// The lifecycle keys (state, removed, drain), once there are any.
    lifecycle: Option<[String; 3]>,
    /// The holding keys (holding, releasing), once there are any.
    holding: Option<[String; 2]>,
}

/// A running membership: the chitchat server and a task that applies
/// [`publish`](Self::publish) and refreshes the member list once per gossip
/// round. Dropping it stops both within a round, without leaving.
pub struct MembershipHandle {
    chitchat_handle: ChitchatHandle,
    publish_tx: watch::Sender<Published>,
    members_rx: watch::Receiver<Vec<Member>>,
    lifecycle_rx: watch::Receiver<Vec<MemberFacts>>,
    refresh_task: JoinHandle<()>,
    gossip_interval: Duration,
    node_name: String,
    has_seeds: bool,
    started: tokio::time::Instant,
}

/// Why membership could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// A gossip interval of zero.
    #[error("the gossip interval must be above zero (--gossip-interval)")]
    ZeroGossipInterval,
    /// The clock, which orders a node's incarnations, is unusable.
    #[error("the system clock is before 1970: set the clock, then start the node")]
    ClockBeforeEpoch,
    /// chitchat could not start on the gossip address.
    #[error("cannot start gossip on {addr}/UDP: {reason}; is the port free (--gossip-addr)?")]
    Start {
        /// The gossip listen address.
        addr: SocketAddr,
        /// What chitchat said.
        reason: String,
    },
    /// The gossip task failed while stopping.
    #[error("the gossip task failed while leaving the cluster: {0}")]
    Stop(String),
}

impl MembershipHandle {
    /// Binds UDP and starts gossiping.
    pub async fn spawn(config: MembershipConfig) -> Result<MembershipHandle, MembershipError> {
        Self::spawn_with_transport(config, &UdpTransport).await
    }

    /// Same, over a given chitchat transport (for tests with
    /// `chitchat::transport::ChannelTransport`).
    pub async fn spawn_with_transport(
        config: MembershipConfig,
        transport: &dyn Transport,
    ) -> Result<MembershipHandle, MembershipError> {
        if config.gossip_interval.is_zero() {
            return Err(MembershipError::ZeroGossipInterval);
        }
        // The start time orders a node's incarnations: a restart supersedes.
        let generation_id = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| MembershipError::ClockBeforeEpoch)?
            .as_millis() as u64;
        let chitchat_id = ChitchatId::new(
            config.node_name.clone(),
            generation_id,
            config.gossip_advertise,
        );
        let initial_interval = config.gossip_interval * 2;
        let chitchat_config = ChitchatConfig {
            chitchat_id: chitchat_id.clone(),
            cluster_id: config.cluster_id.clone(),
            gossip_interval: config.gossip_interval,
            listen_addr: config.gossip_listen,
            seed_nodes: config.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: PHI_THRESHOLD,
                initial_interval,
                max_interval: MAX_HEARTBEAT_INTERVAL.max(initial_interval),
                dead_node_grace_period: DEAD_NODE_GRACE_PERIOD,
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: TOMBSTONE_GRACE_PERIOD,
            catchup_callback: None,
            extra_liveness_predicate: None,
            // V1 only compresses the digest, which is small for our cluster
            // sizes; V0 is understood by every chitchat version.
            protocol_version: ProtocolVersion::V0,
        };
        let mut initial_key_values = vec![
            (KEY_REGION.to_string(), config.region.clone()),
            (KEY_NODE_NAME.to_string(), config.node_name.clone()),
            (KEY_REPLICA.to_string(), hex(config.replica.0)),
            (KEY_GRPC_ADDR.to_string(), config.grpc_advertise.clone()),
            (KEY_DURABLE_SEQ.to_string(), "0".to_string()),
            (KEY_DIGEST.to_string(), hex(0)),
            (KEY_SETS_DIGEST.to_string(), hex(0)),
            (KEY_PROTOCOL.to_string(), config.protocol.newest.to_string()),
            (
                KEY_PROTOCOL_OLDEST.to_string(),
                config.protocol.oldest.to_string(),
            ),
            (KEY_PARTITIONS.to_string(), config.partitions.to_string()),
            (KEY_BORN_AT.to_string(), config.born_at.to_string()),
        ];
        if let Some(state) = config.state {
            initial_key_values.push((KEY_STATE.to_string(), state.as_str().to_string()));
        }
        if let Some(holding) = &config.holding {
            let none = PartitionSet::empty(holding.count());
            initial_key_values.push((KEY_HOLDING.to_string(), holding.to_hex()));
            initial_key_values.push((KEY_RELEASING.to_string(), none.to_hex()));
        }
        let chitchat_handle = spawn_chitchat(chitchat_config, initial_key_values, transport)
            .await
            .map_err(|error| MembershipError::Start {
                addr: config.gossip_listen,
                reason: format!("{error:#}"),
            })?;
        info!(
            node = %config.node_name,
            replica = %config.replica,
            listen = %config.gossip_listen,
            seeds = ?config.seeds,
            "gossip started"
        );

        let (publish_tx, publish_rx) = watch::channel(Published::default());
        let (members_tx, members_rx) = watch::channel(Vec::new());
        let (lifecycle_tx, lifecycle_rx) = watch::channel(Vec::new());
        let refresher = Refresher {
            self_id: chitchat_id,
            name_conflict_logged_at: None,
            self_replica: config.replica,
            publish_rx,
            members_tx,
            lifecycle_tx,
            skipped: HashSet::new(),
        };
        let termination = chitchat_handle.termination_watcher();
        let refresh_task = tokio::spawn(refresher.run(
            chitchat_handle.chitchat(),
            config.gossip_interval,
            termination,
        ));
        Ok(MembershipHandle {
            chitchat_handle,
            publish_tx,
            members_rx,
            lifecycle_rx,
            refresh_task,
            gossip_interval: config.gossip_interval,
            node_name: config.node_name.clone(),
            has_seeds: !config.seeds.is_empty(),
            started: tokio::time::Instant::now(),
        })
    }

    /// Whether this node has heard the cluster, or can stop waiting to: it
    /// has no seeds, it knows a member, or its seeds stayed silent for the
    /// time [`Self::wait_for_name_holders`] gives them (it then starts as a
    /// cluster of its own, and meets the others when they answer).
    pub fn has_heard_the_cluster(&self) -> bool {
        !self.has_seeds
            || !self.members_rx.borrow().is_empty()
            || self.started.elapsed() >= self.seeds_give_up()
    }

    /// How long a node waits for its seeds to answer.
    fn seeds_give_up(&self) -> Duration {
        (self.gossip_interval * 50).max(Duration::from_secs(5))
    }

    /// Publishes this node's durable sequence and digests (counters, and
    /// like sets with uniques), and how many counters it stores. Cheap and
    /// never blocks: only the latest values are kept, and they reach
    /// chitchat at the next gossip round.
    pub fn publish(
        &self,
        durable_seq: u64,
        digest: u64,
        sets_digest: u64,
        counters_stored: Option<u64>,
    ) {
        self.publish_tx.send_if_modified(|current| {
            let new = (durable_seq, digest, sets_digest, counters_stored);
            let old = (
                current.durable_seq,
                current.digest,
                current.sets_digest,
                current.counters_stored,
            );
            current.durable_seq = durable_seq;
            current.digest = digest;
            current.sets_digest = sets_digest;
            current.counters_stored = counters_stored;
            old != new
        });
    }

    /// Publishes the protocol versions this node speaks from now on (after
    /// the cluster version moved), at the next gossip round.
    pub fn publish_protocol(&self, protocol: ProtocolWindow) {
        self.publish_tx.send_if_modified(|current| {
            let changed = current.protocol != Some(protocol);
            current.protocol = Some(protocol);
            changed
        });
    }

    /// Publishes this node's fold report, at the next gossip round.
    pub fn publish_folds(&self, report: &crate::replica::folds::FoldReport) {
        let text = super::fold_report::encode(report);
        self.publish_tx.send_if_modified(|current| {
            let changed = current.folds.as_ref() != Some(&text);
            current.folds = Some(text);
            changed
        });
    }

    /// Publishes this node's lifecycle: its state, the replicas it knows to
    /// be removed and those it asks to drain, at the next gossip round.
    pub fn publish_lifecycle(
        &self,
        state: NodeState,
        removed: &BTreeSet<ReplicaId>,
        drain_requests: &BTreeSet<ReplicaId>,
    ) {
        let keys = [
            state.as_str().to_string(),
            hex_list(removed),
            hex_list(drain_requests),
        ];
        self.publish_tx.send_if_modified(|current| {
            let changed = current.lifecycle.as_ref() != Some(&keys);
            current.lifecycle = Some(keys);
            changed
        });
    }

    /// Publishes the partitions this node serves and, of those, releases.
    pub fn publish_holding(&self, serving: &PartitionSet, releasing: &PartitionSet) {
        let keys = [serving.to_hex(), releasing.to_hex()];
        self.publish_tx.send_if_modified(|current| {
            let changed = current.holding.as_ref() != Some(&keys);
            current.holding = Some(keys);
            changed
        });
    }

    /// The lifecycle facts of the members ([`Self::members`], in the same
    /// order): their published state, removals and drain requests.
    pub fn member_lifecycles(&self) -> Vec<MemberFacts> {
        self.lifecycle_rx.borrow().clone()
    }

    /// Every other node of the cluster chitchat knows, alive or not, sorted by
    /// replica id; at most one gossip round old.
    pub fn members(&self) -> Vec<Member> {
        self.members_rx.borrow().clone()
    }

    /// At start: waits until this node knows whether another live replica
    /// holds its node name, and returns those holders (empty when none).
    ///
    /// A holder counts once it has stayed alive for two seconds (twenty
    /// rounds if longer): an earlier incarnation of this node that died
    /// just before (a crash, then a restart with a wiped disk) can look alive
    /// for a moment from relayed heartbeats, but the failure detector marks
    /// it dead well within that. Without seeds there is no one to ask; if no
    /// other node answers within five seconds (fifty rounds if longer), the
    /// node starts, and a holder met later is logged by the refresher.
    pub async fn wait_for_name_holders(&self) -> Vec<Member> {
        if !self.has_seeds {
            return Vec::new();
        }
        let round = self.gossip_interval;
        let confirm = (round * 20).max(Duration::from_secs(2));
        let quiet = round * 10;
        let started = tokio::time::Instant::now();
        let give_up = self.seeds_give_up();
        let mut first_contact = None;
        let mut alive_since: BTreeMap<ReplicaId, tokio::time::Instant> = BTreeMap::new();
        loop {
            let now = tokio::time::Instant::now();
            let members = self.members();
            if !members.is_empty() {
                first_contact.get_or_insert(now);
            }
            let holders: Vec<Member> = members
                .into_iter()
                .filter(|member| member.alive && member.node_name == self.node_name)
                .collect();
            alive_since.retain(|replica, _| holders.iter().any(|h| h.replica == *replica));
            for holder in &holders {
                alive_since.entry(holder.replica).or_insert(now);
            }
            let confirmed: Vec<Member> = holders
                .into_iter()
                .filter(|holder| now.duration_since(alive_since[&holder.replica]) >= confirm)
                .collect();
            if !confirmed.is_empty() {
                return confirmed;
            }
            // A holder seen alive is followed until it is confirmed or dies.
            let settled = alive_since.is_empty()
                && (first_contact.is_some_and(|at| now.duration_since(at) >= quiet)
                    || now.duration_since(started) >= give_up);
            if settled {
                return Vec::new();
            }
            tokio::time::sleep(round).await;
        }
    }

    /// A watch channel updated whenever the member list (liveness or
    /// published values) changes.
    pub fn subscribe(&self) -> watch::Receiver<Vec<Member>> {
        self.members_rx.clone()
    }

    /// Leaves the cluster (tells the live nodes that are not leaving
    /// themselves, waiting at most `MAX_LEAVE_ANNOUNCEMENT` for it to spread)
    /// and stops the gossip task.
    pub async fn shutdown(self) -> Result<(), MembershipError> {
        let MembershipHandle {
            chitchat_handle,
            refresh_task,
            gossip_interval,
            ..
        } = self;
        let live_peers: Vec<SocketAddr> = chitchat_handle
            .with_chitchat(|chitchat| {
                chitchat.self_node_state().set(KEY_LEAVING, "true");
                let self_id = chitchat.self_chitchat_id();
                chitchat
                    .live_nodes()
                    .filter(|id| *id != self_id)
                    .filter(|id| {
                        chitchat
                            .node_state(id)
                            .is_some_and(|state| state.get(KEY_LEAVING).is_none())
                    })
                    .map(|id| id.gossip_advertise_addr)
                    .collect()
            })
            .await;
        if !live_peers.is_empty() {
            // A SYN now: the peer's SYN-ACK brings our ACK, which carries the flag.
            for peer in &live_peers {
                let _ = chitchat_handle.gossip(*peer);
            }
            tokio::time::sleep((gossip_interval * 5).min(MAX_LEAVE_ANNOUNCEMENT)).await;
        }
        refresh_task.abort();
        let _ = refresh_task.await;
        let self_id = chitchat_handle.chitchat_id().clone();
        chitchat_handle
            .shutdown()
            .await
            .map_err(|error| MembershipError::Stop(format!("{error:#}")))?;
        info!(node = ?self_id, "left the cluster");
        Ok(())
    }
}

/// The background task: applies publications, refreshes the member list.
struct Refresher {
    self_id: ChitchatId,
    self_replica: ReplicaId,
    publish_rx: watch::Receiver<Published>,
    members_tx: watch::Sender<Vec<Member>>,
    lifecycle_tx: watch::Sender<Vec<MemberFacts>>,
    /// Nodes already reported as skipped (to log each once).
    skipped: HashSet<ChitchatId>,
    /// When the error about another live holder of our name was last logged.
    name_conflict_logged_at: Option<tokio::time::Instant>,
}

impl Refresher {
    async fn run(
        mut self,
        chitchat: Arc<Mutex<Chitchat>>,
        period: Duration,
        termination: impl std::future::Future<Output = anyhow::Result<()>>,
    ) {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tokio::pin!(termination);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                result = &mut termination => {
                    // Only reached if the server stopped on its own.
                    error!(?result, "the gossip server stopped; every member is now unknown");
                    self.members_tx.send_modify(|members| {
                        members.iter_mut().for_each(|member| member.alive = false)
                    });
                    self.lifecycle_tx.send_modify(|members| {
                        members.iter_mut().for_each(|member| member.alive = false)
                    });
                    return;
                }
            }
            let publication = match self.publish_rx.has_changed() {
                Err(_) => return, // the handle was dropped
                Ok(true) => Some(self.publish_rx.borrow_and_update().clone()),
                Ok(false) => None,
            };
            let members = {
                let mut chitchat = chitchat.lock().await;
                if let Some(published) = publication {
                    let state = chitchat.self_node_state();
                    state.set(KEY_DURABLE_SEQ, published.durable_seq);
                    state.set(KEY_DIGEST, hex(published.digest));
                    state.set(KEY_SETS_DIGEST, hex(published.sets_digest));
                    if let Some(counters) = published.counters_stored {
                        state.set(KEY_COUNTERS_STORED, counters);
                    }
                    if let Some(protocol) = published.protocol {
                        state.set(KEY_PROTOCOL, protocol.newest);
                        state.set(KEY_PROTOCOL_OLDEST, protocol.oldest);
                    }
                    if let Some(folds) = &published.folds {
                        state.set(super::fold_report::KEY_FOLDS, folds.clone());
                    }
                    if let Some([node_state, removed, drain]) = &published.lifecycle {
                        state.set(KEY_STATE, node_state.clone());
                        state.set(KEY_REMOVED, removed.clone());
                        state.set(KEY_DRAIN, drain.clone());
                    }
                    if let Some([holding, releasing]) = &published.holding {
                        state.set(KEY_HOLDING, holding.clone());
                        state.set(KEY_RELEASING, releasing.clone());
                    }
                }
                self.collect_members(&chitchat)
            };
            let (members, lifecycles): (Vec<Member>, Vec<MemberFacts>) =
                members.into_iter().unzip();
            self.lifecycle_tx.send_if_modified(|current| {
                let changed = *current != lifecycles;
                if changed {
                    *current = lifecycles;
                }
                changed
            });
            self.log_name_conflict(&members);
            self.members_tx.send_if_modified(|current| {
                let changed = *current != members;
                if changed {
                    *current = members;
                }
                changed
            });
        }
    }

    /// Logs an error, at once and then every [`NAME_CONFLICT_LOG_PERIOD`],
    /// while another live replica holds this node's name.
    fn log_name_conflict(&mut self, members: &[Member]) {
        let name = &*self.self_id.node_id;
        let holders: Vec<String> = members
            .iter()
            .filter(|member| member.alive && member.node_name == name)
            .map(|member| format!("replica {} at {}", member.replica, member.grpc_addr))
            .collect();
        if holders.is_empty() {
            self.name_conflict_logged_at = None;
            return;
        }
        let now = tokio::time::Instant::now();
        if self
            .name_conflict_logged_at
            .is_some_and(|at| now.duration_since(at) < NAME_CONFLICT_LOG_PERIOD)
        {
            return;
        }
        self.name_conflict_logged_at = Some(now);
        error!(
            node = %name,
            replica = %self.self_replica,
            others = ?holders,
            "another live node uses this node's name; both are replicated, but node names \
             must be unique: stop the other process or restart it with another --node-name"
        );
    }

    fn collect_members(&mut self, chitchat: &Chitchat) -> Vec<(Member, MemberFacts)> {
        let live: HashSet<&ChitchatId> = chitchat.live_nodes().collect();
        let mut candidates = Vec::new();
        let mut lifecycles = HashMap::new();
        for (chitchat_id, state) in chitchat.node_states() {
            if *chitchat_id == self.self_id {
                continue;
            }
            match parse_member(chitchat_id, live.contains(chitchat_id), |key| {
                state.get(key)
            }) {
                Ok(member) => {
                    self.skipped.remove(chitchat_id);
                    let facts = parse_lifecycle(&member, |key| state.get(key));
                    lifecycles.insert(chitchat_id.clone(), facts);
                    candidates.push((chitchat_id.clone(), member));
                }
                Err(reason) => {
                    if self.skipped.insert(chitchat_id.clone()) {
                        debug!(node = ?chitchat_id, %reason, "skipping a gossip node");
                    }
                }
            }
        }
        self.skipped
            .retain(|id| chitchat.node_states().contains_key(id));
        resolve_members(&self.self_id, self.self_replica, candidates)
            .into_iter()
            .map(|(chitchat_id, member)| {
                let facts = lifecycles
                    .remove(&chitchat_id)
                    .unwrap_or_else(|| parse_lifecycle(&member, |_| None));
                (member, facts)
            })
            .collect()
    }
}

/// Reads a member's lifecycle keys; a build that publishes none is
/// `active`, and an unparsable value is read as absent (logged at debug).
fn parse_lifecycle<'a>(member: &Member, get: impl Fn(&str) -> Option<&'a str>) -> MemberFacts {
    let state = match get(KEY_STATE) {
        None => NodeState::Active,
        Some(text) => NodeState::parse(text).unwrap_or_else(|| {
            debug!(node = %member.node_name, state = %text, "unknown lifecycle state; read as active");
            NodeState::Active
        }),
    };
    let list = |key: &str| -> BTreeSet<ReplicaId> {
        get(key)
            .unwrap_or_default()
            .split(',')
            .filter(|text| !text.is_empty())
            .filter_map(|text| parse_hex(text).map(ReplicaId))
            .collect()
    };
    // Drawn from the member's own partition count: a set of another count
    // than this node's holds none of its partitions (`Lifecycle::view`).
    let partitions = |key: &str| -> Option<PartitionSet> {
        let text = get(key)?;
        let count = PartitionCount::new(u64::from(member.partitions)).ok()?;
        PartitionSet::from_hex(count, text)
            .map_err(|error| debug!(node = %member.node_name, %key, %error, "unreadable partition set; read as absent"))
            .ok()
    };
    MemberFacts {
        replica: member.replica,
        name: member.node_name.clone(),
        region: member.region.clone(),
        grpc_addr: member.grpc_addr.clone(),
        alive: member.alive,
        state,
        removed: list(KEY_REMOVED),
        drain_requests: list(KEY_DRAIN),
        holding: partitions(KEY_HOLDING),
        releasing: partitions(KEY_RELEASING),
    }
}

fn hex_list(replicas: &BTreeSet<ReplicaId>) -> String {
    replicas
        .iter()
        .map(|replica| hex(replica.0))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads a member from a chitchat node's key-values.
fn parse_member<'a>(
    chitchat_id: &ChitchatId,
    alive: bool,
    get: impl Fn(&str) -> Option<&'a str>,
) -> Result<Member, String> {
    let field = |key: &str| get(key).ok_or_else(|| format!("no `{key}`"));
    let hex_field = |key: &str| {
        let text = field(key)?;
        parse_hex(text).ok_or_else(|| format!("`{key}` is not 16 hex digits: {text:?}"))
    };
    let durable_seq = field(KEY_DURABLE_SEQ)?;
    // Absent in builds before versions: they speak version 1 only.
    let version = |key: &str| -> Result<u32, String> {
        get(key).map_or(Ok(0), |text| {
            text.parse()
                .map_err(|_| format!("`{key}` is not a number: {text:?}"))
        })
    };
    let protocol = ProtocolWindow::announced(version(KEY_PROTOCOL_OLDEST)?, version(KEY_PROTOCOL)?);
    Ok(Member {
        replica: ReplicaId(hex_field(KEY_REPLICA)?),
        region: field(KEY_REGION)?.to_string(),
        node_name: field(KEY_NODE_NAME)?.to_string(),
        grpc_addr: field(KEY_GRPC_ADDR)?.to_string(),
        gossip_addr: chitchat_id.gossip_advertise_addr.to_string(),
        alive: alive && get(KEY_LEAVING).is_none(),
        durable_seq: durable_seq
            .parse()
            .map_err(|_| format!("`{KEY_DURABLE_SEQ}` is not a number: {durable_seq:?}"))?,
        digest: hex_field(KEY_DIGEST)?,
        sets_digest: get(KEY_SETS_DIGEST)
            .map(|_| hex_field(KEY_SETS_DIGEST))
            .transpose()?,
        protocol,
        folds: get(super::fold_report::KEY_FOLDS).and_then(super::fold_report::decode),
        partitions: version(KEY_PARTITIONS)?,
        born_at: version(KEY_BORN_AT)?,
        counters_stored: get(KEY_COUNTERS_STORED).and_then(|text| text.parse().ok()),
    })
}

/// Resolves chitchat's incarnations into members, by replica id: a name
/// alone never hides a replica, so two live processes that claim one node
/// name are both members and both are pulled from (issue #10, item 1).
/// - This node's own incarnations (its chitchat id or its replica id) are
///   dropped.
/// - An incarnation that is not alive is dropped when a newer one of the same
///   name exists (this node included): that node restarted, perhaps with a
///   wiped disk and so a new replica id.
/// - Per replica id, the highest generation is kept (a node restarted on the
///   same disk, perhaps under another name).
///
/// Sorted by replica id, each with the chitchat id it came from.
fn resolve_members(
    self_id: &ChitchatId,
    self_replica: ReplicaId,
    candidates: Vec<(ChitchatId, Member)>,
) -> Vec<(ChitchatId, Member)> {
    let mut newest_by_name: HashMap<&str, u64> = HashMap::new();
    newest_by_name.insert(&self_id.node_id, self_id.generation_id);
    for (chitchat_id, _) in &candidates {
        let newest = newest_by_name.entry(&chitchat_id.node_id).or_default();
        *newest = (*newest).max(chitchat_id.generation_id);
    }
    let mut by_replica: BTreeMap<ReplicaId, (ChitchatId, Member)> = BTreeMap::new();
    for (chitchat_id, member) in &candidates {
        if chitchat_id == self_id || member.replica == self_replica {
            continue;
        }
        let generation = chitchat_id.generation_id;
        if !member.alive && newest_by_name[&*chitchat_id.node_id] > generation {
            continue;
        }
        match by_replica.get(&member.replica) {
            Some((newest, _)) if newest.generation_id >= generation => {}
            _ => {
                by_replica.insert(member.replica, (chitchat_id.clone(), member.clone()));
            }
        }
    }
    by_replica.into_values().collect()
}

fn hex(value: u64) -> String {
    format!("{value:016x}")
}

fn parse_hex(text: &str) -> Option<u64> {
    if text.len() != 16 {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;
