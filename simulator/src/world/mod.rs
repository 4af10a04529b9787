//! The discrete-event simulation: a simulated clock, a queue of events, R
//! regions × K nodes running the real replica core, their clients, the
//! network, the disks, membership, and the fault plan.
//!
//! Invariant: a run is a pure function of (seed, options, plan). Events are
//! ordered by (time, insertion number); every random draw comes from a
//! per-subsystem stream of the seed; nothing iterates a hash map where the
//! order could matter. Each handled event is folded into a trace hash, so two
//! runs of a seed can be compared with one number.

mod clients;
mod copies;
mod folds;
mod membership;
mod node;
mod replication;
mod sets;

use std::collections::HashMap;

use tally_node::crdt::{counter_digest, PnCounter, ReplicaId};
use tally_node::replica::{DurableState, PullChunk, PullRequest, MAX_BACKOFF_MS};

use crate::checker::{Checker, SlotStats, Violation};
use crate::faults::{FaultPlan, Op};
use crate::ledger::{Ledger, WorkloadStats};
use crate::network::{LatencyMatrix, NetStats, Network};
use crate::options::SimOptions;
use crate::queue::EventQueue;
use crate::rng::{between, stream, SimRng, Subsystem, TraceHasher, Zipf};

pub use copies::{copy_wait_ms, retry_pause_ms, CopyStats, PUSH_TIMEOUT_MS};
pub use folds::{FoldStats, FOLD_PERIOD_MS};
pub use membership::Membership;
pub use node::{SimNode, CLUSTER, EPOCH_MS};

/// The longest fsync delay without the tail.
pub const FSYNC_BASE_MAX_MS: u64 = 4;
/// The longest extra delay the fsync tail adds.
pub const FSYNC_TAIL_MAX_MS: u64 = 400;
/// The longest a node takes to see that another is up again.
pub const UP_DELAY_MAX_MS: u64 = 400;
/// Time between two convergence probes after the heal.
pub const PROBE_MS: u64 = 5;
/// How long the replicas must stay equal before the run ends.
pub const STABLE_MS: u64 = 1_000;
/// Time between two report samples.
pub const SAMPLE_MS: u64 = 250;

/// A message between nodes.
#[derive(Clone, Debug)]
pub enum NetMsg {
    /// A pull request.
    Pull {
        /// The puller's pull id.
        pull: u64,
        /// The request.
        request: PullRequest,
    },
    /// One chunk of an answer stream.
    Chunk {
        /// The pull it answers.
        pull: u64,
        /// The answer stream (a duplicated request is answered twice).
        serve: u64,
        /// Its place in the stream.
        index: u32,
        /// The stream ends after it.
        last: bool,
        /// The chunk.
        chunk: PullChunk,
    },
    /// The pull was refused.
    Refused {
        /// The pull.
        pull: u64,
    },
    /// A push to a copy (replicated durability).
    Copy {
        /// The sender's push id.
        push: u64,
        /// The push.
        data: std::sync::Arc<tally_node::replica::CopyPush>,
    },
    /// A copy's answer to a push: `ok` once durable there, or refused.
    CopyAnswer {
        /// The push it answers.
        push: u64,
        /// Durable on the copy.
        ok: bool,
    },
}

/// Everything that happens.
#[derive(Clone, Debug)]
pub enum Event {
    /// A fault operation starts.
    FaultStart(usize),
    /// A fault operation ends.
    FaultEnd(usize),
    /// The end of the run: every fault healed, clients stop.
    HealAll,
    /// A client may issue its next add.
    ClientWake(u32),
    /// A client's attempt timed out.
    ClientTimeout(u32, u32, u8),
    /// A client retries an add.
    ClientRetry(u32, u32),
    /// An attempt reaches its node: (node, client, add, attempt).
    AddArrives(u16, u32, u32, u8),
    /// An answer reaches a client.
    AddReply {
        /// The client.
        client: u32,
        /// The add.
        add: u32,
        /// The replica that answered.
        replica: ReplicaId,
        /// The commit that makes it durable.
        ticket: u64,
        /// Answered before the flush.
        is_async: bool,
    },
    /// A node's fsync completed: (node, epoch, seq).
    FsyncDone(u16, u32, u64),
    /// A node's anti-entropy round: (node, epoch).
    SyncRound(u16, u32),
    /// A node's housekeeping tick: (node, epoch).
    Housekeeping(u16, u32),
    /// A message arrives at node `to` from node `from`.
    Deliver {
        /// Receiver.
        to: u16,
        /// Sender.
        from: u16,
        /// The message.
        msg: Box<NetMsg>,
    },
    /// A pull's deadline: (node, epoch, pull).
    PullTimeout(u16, u32, u64),
    /// A node's membership view is refreshed: (node, epoch).
    MembershipRefresh(u16, u32),
    /// Convergence probe (after the heal).
    Probe,
    /// Report sample.
    Sample,
    /// The next like, unlike or observe (`--sets`).
    SetOp,
    /// A push to the copies got no (or too few) answers in time: (node,
    /// epoch, push).
    PushTimeout(u16, u32, u64),
    /// A failed push may be tried again: (node, epoch).
    PushRetry(u16, u32),
    /// A replicated add's wait for its copies ends: (node, epoch, ticket,
    /// client, add, attempt).
    CopyWaitExpired(u16, u32, u64, u32, u32, u8),
    /// A replicated add's attempt is answered `UNAVAILABLE`: (client, add,
    /// attempt).
    AddUnavailable(u32, u32, u8),
    /// A node's fold round (`--retire`): (node, epoch).
    FoldRound(u16, u32),
}

impl Event {
    fn target(&self) -> Option<(usize, Option<u32>)> {
        match self {
            Event::AddArrives(node, ..) => Some((*node as usize, None)),
            Event::Deliver { to, .. } => Some((*to as usize, None)),
            Event::FsyncDone(node, epoch, _)
            | Event::SyncRound(node, epoch)
            | Event::Housekeeping(node, epoch)
            | Event::PullTimeout(node, epoch, _)
            | Event::MembershipRefresh(node, epoch)
            | Event::PushTimeout(node, epoch, _)
            | Event::PushRetry(node, epoch)
            | Event::CopyWaitExpired(node, epoch, ..)
            | Event::FoldRound(node, epoch) => Some((*node as usize, Some(*epoch))),
            _ => None,
        }
    }

    fn tag(&self) -> u64 {
        match self {
            Event::FaultStart(_) => 1,
            Event::FaultEnd(_) => 2,
            Event::HealAll => 3,
            Event::ClientWake(_) => 4,
            Event::ClientTimeout(..) => 5,
            Event::ClientRetry(..) => 6,
            Event::AddArrives(..) => 7,
            Event::AddReply { .. } => 8,
            Event::FsyncDone(..) => 9,
            Event::SyncRound(..) => 10,
            Event::Housekeeping(..) => 11,
            Event::Deliver { .. } => 12,
            Event::PullTimeout(..) => 13,
            Event::MembershipRefresh(..) => 14,
            Event::Probe => 15,
            Event::Sample => 16,
            Event::SetOp => 17,
            Event::PushTimeout(..) => 18,
            Event::PushRetry(..) => 19,
            Event::CopyWaitExpired(..) => 20,
            Event::AddUnavailable(..) => 21,
            Event::FoldRound(..) => 22,
        }
    }
}

/// A client.
#[derive(Clone, Debug)]
pub struct Client {
    /// Its home node (every attempt of an add goes there).
    pub node: usize,
    /// Hammers the hot key during the burst.
    pub burst: bool,
    /// The add it waits for.
    pub current: Option<u32>,
}

/// The hot key's value at each node over time, and the replicas' spread.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Series {
    /// Sample times (ms).
    pub at_ms: Vec<u64>,
    /// Per node: the hot key's value as that node holds it (None while down).
    pub hot_value: Vec<Vec<Option<i64>>>,
    /// Max minus min of the hot key's value over the running nodes.
    pub spread: Vec<i64>,
    /// Node names with their region.
    pub node_labels: Vec<String>,
}

/// What a run produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunResult {
    /// The seed.
    pub seed: u64,
    /// The plan that ran.
    #[serde(serialize_with = "plan_lines")]
    pub plan: FaultPlan,
    /// Hash of the event trace.
    pub trace_hash: u64,
    /// Events handled.
    pub events: u64,
    /// Simulated time at the end (ms).
    pub sim_ms: u64,
    /// The heal (ms).
    pub heal_ms: u64,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// How many in all.
    pub violation_count: u64,
    /// From the heal to every replica equal (ms), if reached.
    pub convergence_ms: Option<u64>,
    /// The bound it must stay under (ms).
    pub bound_ms: u64,
    /// Per key: the last change after the heal (ms after the heal).
    pub key_convergence_ms: Vec<u64>,
    /// Workload counters.
    pub workload: WorkloadStats,
    /// Network counters.
    pub net: NetStats,
    /// Final slot check counters.
    pub slots: SlotStats,
    /// Commits completed.
    pub commits: u64,
    /// Pulls started.
    pub pulls: u64,
    /// Commits completed while every replica already held the same state
    /// (the last second of the run, nothing left to ship).
    pub idle_commits: u64,
    /// Replica incarnations created.
    pub replicas: usize,
    /// Hot key's final value.
    pub hot_value: i64,
    /// Replicated durability: pushes, copies, adds left unconfirmed.
    pub copies: CopyStats,
    /// Retirements and folds (`--retire`).
    pub folds: FoldStats,
    /// Report series, when asked for.
    #[serde(skip)]
    pub series: Option<Series>,
}

fn plan_lines<S: serde::Serializer>(plan: &FaultPlan, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(plan.0.iter().map(|op| op.to_string()))
}

impl RunResult {
    /// True when no invariant broke.
    pub fn passed(&self) -> bool {
        self.violation_count == 0
    }

    /// The kind of the first violation.
    pub fn failure_kind(&self) -> Option<&'static str> {
        self.violations.first().map(|v| v.kind)
    }
}

/// See the module documentation.
pub struct World<'a> {
    options: &'a SimOptions,
    seed: u64,
    plan: FaultPlan,
    now: u64,
    queue: EventQueue<Event>,
    nodes: Vec<SimNode>,
    clients: Vec<Client>,
    net: Network,
    membership: Membership,
    ledger: Ledger,
    checker: Checker,
    trace: TraceHasher,
    key_names: Vec<String>,
    key_index: HashMap<String, usize>,
    workload_rng: SimRng,
    zipf: Zipf,
    disk_rng: SimRng,
    id_rng: SimRng,
    burst: (u64, u64),
    clients_stopped: bool,
    heal_at: Option<u64>,
    deadline: u64,
    bound_ms: u64,
    equal_since: Option<u64>,
    finished: bool,
    events: u64,
    commits: u64,
    pulls: u64,
    next_pull: u64,
    next_serve: u64,
    next_push: u64,
    copy_stats: CopyStats,
    series: Option<Series>,
    max_skew_jump: u64,
    commits_at_equal: u64,
    idle_commits: u64,
    /// The like-set and uniques workload, with `--sets`.
    sets: Option<sets::SetWorkload>,
    /// Retirements and folds so far (`--retire`).
    fold_stats: FoldStats,
}

impl<'a> World<'a> {
    /// A world for `seed`, with the plan generated from the seed unless one is given.
    pub fn new(seed: u64, options: &'a SimOptions, plan: Option<FaultPlan>, record: bool) -> Self {
        let plan = plan.unwrap_or_else(|| FaultPlan::generate(seed, options));
        let n = options.node_count();
        let matrix = LatencyMatrix::generate(seed, options);
        let mut id_rng = stream(seed, Subsystem::Identity);
        let nodes: Vec<SimNode> = (0..n)
            .map(|i| SimNode::fresh(options, i, rand::Rng::random(&mut id_rng), EPOCH_MS))
            .collect();
        let key_names = key_names(options.keys);
        let key_index = key_names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), i))
            .collect();
        let mut clients = Vec::new();
        for region in 0..options.regions {
            let per_region = options.clients_per_region + options.burst_clients_per_region;
            for j in 0..per_region {
                clients.push(Client {
                    node: region * options.nodes_per_region + j % options.nodes_per_region,
                    burst: j >= options.clients_per_region,
                    current: None,
                });
            }
        }
        let mut workload_rng = stream(seed, Subsystem::Workload);
        let burst_start = between(
            &mut workload_rng,
            options.duration_ms / 4,
            options.duration_ms / 2,
        );
        let burst_end = (burst_start + options.burst_ms).min(options.duration_ms);
        let max_skew_jump = plan
            .0
            .iter()
            .filter_map(|op| match op {
                Op::Skew { offset_ms, .. } => Some(offset_ms.unsigned_abs() * 2),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let mut world = World {
            options,
            seed,
            membership: Membership::new(seed, n, options.retire),
            net: Network::new(seed, options, matrix),
            ledger: Ledger::new(n, options.keys),
            checker: Checker::new(n, options.keys),
            plan,
            now: 0,
            queue: EventQueue::default(),
            nodes,
            clients,
            trace: TraceHasher::default(),
            key_names,
            key_index,
            workload_rng,
            zipf: Zipf::new(options.keys, options.zipf),
            disk_rng: stream(seed, Subsystem::Disk),
            id_rng,
            burst: (burst_start, burst_end),
            clients_stopped: false,
            heal_at: None,
            deadline: u64::MAX,
            bound_ms: 0,
            equal_since: None,
            finished: false,
            events: 0,
            commits: 0,
            pulls: 0,
            next_pull: 1,
            next_serve: 1,
            next_push: 1,
            copy_stats: CopyStats::default(),
            series: record.then(Series::default),
            max_skew_jump,
            commits_at_equal: 0,
            idle_commits: 0,
            sets: options
                .sets
                .then(|| sets::SetWorkload::new(stream(seed, Subsystem::Sets))),
            fold_stats: FoldStats::default(),
        };
        if options.durability == crate::options::Durability::Replicated {
            world.checker.require_replicated();
        }
        world.start();
        world
    }

    fn schedule(&mut self, delay: u64, event: Event) {
        self.queue.schedule(self.now + delay, event);
    }

    fn start(&mut self) {
        let n = self.nodes.len();
        for node in 0..n {
            let id = self.nodes[node].id();
            self.checker.started_fresh(0, node, id);
            self.start_node_timers(node);
        }
        for node in 0..n {
            let _ = self.membership.refresh(node, 0, &mut self.nodes);
        }
        for client in 0..self.clients.len() {
            let delay = between(&mut self.workload_rng, 0, self.options.think_ms);
            self.schedule(delay, Event::ClientWake(client as u32));
        }
        let duration = self.options.duration_ms;
        for (i, op) in self.plan.0.clone().iter().enumerate() {
            if op.start_ms() >= duration {
                continue;
            }
            self.schedule(op.start_ms(), Event::FaultStart(i));
            if !matches!(op, Op::Skew { .. } | Op::Retire { .. }) {
                self.schedule(op.end_ms().min(duration), Event::FaultEnd(i));
            }
        }
        self.schedule(duration, Event::HealAll);
        if self.sets.is_some() {
            self.schedule(0, Event::SetOp);
        }
        if self.series.is_some() {
            let labels = (0..n)
                .map(|i| format!("n{i} {}", self.nodes[i].region_name))
                .collect();
            if let Some(series) = &mut self.series {
                series.node_labels = labels;
                series.hot_value = vec![Vec::new(); n];
            }
            self.schedule(0, Event::Sample);
        }
    }

    fn start_node_timers(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        let offset = between(&mut self.disk_rng, 0, self.options.sync_interval_ms - 1);
        self.schedule(offset, Event::SyncRound(node as u16, epoch));
        let offset = between(&mut self.disk_rng, 0, 99);
        self.schedule(offset, Event::Housekeeping(node as u16, epoch));
        self.start_fold_rounds(node);
    }

    /// Runs to the end and checks everything.
    pub fn run(mut self) -> RunResult {
        while let Some((at, event)) = self.queue.pop() {
            if at > self.deadline {
                break;
            }
            self.now = at;
            self.handle(event);
            if self.finished {
                break;
            }
        }
        self.finish()
    }

    fn handle(&mut self, event: Event) {
        if let Some((node, epoch)) = event.target() {
            let state = &mut self.nodes[node];
            if !state.up || epoch.is_some_and(|epoch| epoch != state.epoch) {
                return;
            }
            if state.paused {
                state.deferred.push(event);
                return;
            }
        }
        if matches!(event, Event::Probe | Event::Sample) {
            match event {
                Event::Probe => self.probe(),
                _ => self.sample(),
            }
            return;
        }
        self.events += 1;
        self.trace.mix(self.now);
        self.trace.mix(event.tag());
        match event {
            Event::FaultStart(i) => self.fault(i, true),
            Event::FaultEnd(i) => self.fault(i, false),
            Event::HealAll => self.heal_all(),
            Event::ClientWake(client) => self.client_wake(client),
            Event::ClientTimeout(client, add, attempt) => self.client_timeout(client, add, attempt),
            Event::ClientRetry(client, add) => self.client_retry(client, add),
            Event::AddArrives(node, client, add, attempt) => {
                self.add_arrives(node as usize, client, add, attempt)
            }
            Event::AddReply {
                client,
                add,
                replica,
                ticket,
                is_async,
            } => self.add_reply(client, add, replica, ticket, is_async),
            Event::FsyncDone(node, _, seq) => self.fsync_done(node as usize, seq),
            Event::SyncRound(node, _) => self.sync_round(node as usize),
            Event::Housekeeping(node, _) => self.housekeeping(node as usize),
            Event::Deliver { to, from, msg } => self.deliver(to as usize, from as usize, *msg),
            Event::PullTimeout(node, _, pull) => self.pull_timeout(node as usize, pull),
            Event::MembershipRefresh(node, _) => {
                self.trace.mix(node as u64);
                let (alive, next) =
                    self.membership
                        .refresh(node as usize, self.now, &mut self.nodes);
                self.trace.mix(alive);
                if let Some(delay) = next {
                    let epoch = self.nodes[node as usize].epoch;
                    self.schedule(delay, Event::MembershipRefresh(node, epoch));
                }
            }
            Event::SetOp => self.set_op(),
            Event::PushTimeout(node, _, push) => self.push_timeout(node as usize, push),
            Event::PushRetry(node, _) => self.push_retry(node as usize),
            Event::CopyWaitExpired(node, _, ticket, client, add, attempt) => {
                self.copy_wait_expired(node as usize, ticket, client, add, attempt)
            }
            Event::AddUnavailable(client, add, attempt) => {
                self.add_unavailable(client, add, attempt)
            }
            Event::FoldRound(node, _) => self.fold_round(node as usize),
            Event::Probe | Event::Sample => unreachable!("handled above"),
        }
    }

    fn fresh_id(&mut self) -> u64 {
        rand::Rng::random(&mut self.id_rng)
    }

    fn fault(&mut self, index: usize, starting: bool) {
        let op = self.plan.0[index].clone();
        self.trace.mix(index as u64);
        match op {
            Op::Partition { shape, .. } => {
                if starting {
                    self.net.start_partition(index, shape, self.options);
                } else {
                    self.net.heal_partition(index, self.options);
                }
                self.membership_changed();
            }
            Op::Crash { node, wipe, .. } => {
                if starting {
                    self.crash(node, wipe);
                } else {
                    self.restart(node);
                }
            }
            Op::Pause { node, .. } => {
                if starting {
                    self.pause(node);
                } else {
                    self.resume(node);
                }
            }
            Op::Skew {
                node, offset_ms, ..
            } => self.nodes[node].skew_ms = offset_ms,
            Op::Flaky {
                loss_pct,
                dup_pct,
                reorder_pct,
                ..
            } => {
                if starting {
                    self.net.start_flaky(index, loss_pct, dup_pct, reorder_pct);
                } else {
                    self.net.end_flaky(index);
                }
            }
            Op::Retire { node, .. } => {
                if starting {
                    self.operator_retire(node);
                }
            }
        }
    }

    fn crash(&mut self, node: usize, wipe: bool) {
        if !self.nodes[node].up {
            return;
        }
        self.sets_crashed(node, wipe);
        self.nodes[node].crash(wipe);
        self.membership_changed();
    }

    fn restart(&mut self, node: usize) {
        if self.nodes[node].up {
            return;
        }
        let fresh = self.fresh_id();
        let wiped = self.nodes[node].wipe_on_restart;
        let now = self.now;
        self.nodes[node].restart(self.options, fresh, now);
        let id = self.nodes[node].id();
        self.trace.mix(id.0);
        if wiped {
            self.checker.started_fresh(now, node, id);
        } else {
            let SimNode { store, .. } = &self.nodes[node];
            let names = &self.key_names;
            self.checker.restarted(now, node, id, |key| {
                store
                    .load_counter(&names[key])
                    .ok()
                    .flatten()
                    .map(|stored| stored.state)
                    .unwrap_or_default()
            });
        }
        self.start_node_timers(node);
        let epoch = self.nodes[node].epoch;
        self.schedule(
            self.membership.up_delay(node),
            Event::MembershipRefresh(node as u16, epoch),
        );
        self.membership_changed();
    }

    fn pause(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if !state.up || state.paused {
            return;
        }
        state.paused = true;
        self.membership_changed();
    }

    fn resume(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if !state.up || !state.paused {
            return;
        }
        state.paused = false;
        let held = std::mem::take(&mut state.deferred);
        for event in held {
            self.schedule(0, event);
        }
        self.membership_changed();
    }

    fn membership_changed(&mut self) {
        let refreshes = self.membership.changed(self.now, &self.nodes, &self.net);
        for (node, delay) in refreshes {
            let epoch = self.nodes[node].epoch;
            self.schedule(delay, Event::MembershipRefresh(node as u16, epoch));
        }
    }

    fn heal_all(&mut self) {
        self.net.heal_all(self.options);
        for node in 0..self.nodes.len() {
            if self.nodes[node].paused {
                self.resume(node);
            }
            if !self.nodes[node].up {
                self.restart(node);
            }
        }
        self.membership_changed();
        self.clients_stopped = true;
        self.heal_at = Some(self.now);
        self.checker.healed(self.now);
        self.bound_ms = self.convergence_bound();
        self.deadline = self.now + self.bound_ms + 2 * STABLE_MS;
        self.schedule(PROBE_MS, Event::Probe);
    }

    /// The convergence bound (see `simulator/README.md`, "What is checked"):
    ///
    /// `D_up + T_pull + B_max + S_max + K·R·(I + 2·L_max + F_max) + F_max`
    ///
    /// with `D_up` the longest delay before membership sees a node up again,
    /// `T_pull` the pull timeout (a pull lost at the heal fails only then),
    /// `B_max` the longest back-off after failed pulls, `S_max` the largest
    /// backward clock jump of a skewed node (its back-off deadlines move by
    /// that much), `K` nodes per region (a change may first spread inside its
    /// region, one rotation step per round, before a remote pull picks it
    /// up), `R` the pulls needed to ship the whole state within the byte
    /// budget, `I` the sync interval, `L_max` the longest one-way latency
    /// (jitter and tail included), `F_max` the longest fsync (a merged change
    /// is served on only once committed).
    fn convergence_bound(&self) -> u64 {
        let o = self.options;
        let replicas = self.checker.replica_count() as u64;
        let state_bytes = o.keys as u64 * (16 + 8 + 26 * replicas);
        let rounds = state_bytes
            .div_ceil(o.pull_budget_bytes.max(1) as u64)
            .max(1);
        let latency = self.net.matrix().max_one_way_ms();
        let fsync = FSYNC_BASE_MAX_MS + if o.faults.tail { FSYNC_TAIL_MAX_MS } else { 0 };
        self.fold_window_ms()
            + UP_DELAY_MAX_MS
            + o.pull_timeout_ms()
            + MAX_BACKOFF_MS
            + self.max_skew_jump
            + o.nodes_per_region as u64 * rounds * (o.sync_interval_ms + 2 * latency + fsync)
            + fsync
    }

    fn probe(&mut self) {
        let first = self.nodes[0].replica.digest();
        let equal =
            self.nodes.iter().all(|node| node.replica.digest() == first) && self.sets_converged();
        if !equal {
            self.equal_since = None;
        } else if self.equal_since.is_none() {
            self.equal_since = Some(self.now);
            self.commits_at_equal = self.commits;
        }
        let stable = self
            .equal_since
            .is_some_and(|since| self.now - since >= STABLE_MS);
        let folds_done = self
            .heal_at
            .is_some_and(|heal| self.now >= heal + self.fold_window_ms());
        if stable && folds_done && !self.ledger.any_pending() {
            self.finished = true;
            self.idle_commits = self.commits - self.commits_at_equal;
        } else {
            self.schedule(PROBE_MS, Event::Probe);
        }
    }

    fn read_state(&self, node: usize, key: usize) -> PnCounter {
        let state = &self.nodes[node];
        if let Some(cached) = state.replica.cached_state(&self.key_names[key]) {
            return cached.clone();
        }
        state
            .store
            .load_counter(&self.key_names[key])
            .ok()
            .flatten()
            .map(|stored| stored.state)
            .unwrap_or_default()
    }

    fn sample(&mut self) {
        let n = self.nodes.len();
        let values: Vec<Option<i64>> = (0..n)
            .map(|node| {
                self.nodes[node]
                    .up
                    .then(|| self.read_state(node, 0).exact_value() as i64)
            })
            .collect();
        let running: Vec<i64> = values.iter().flatten().copied().collect();
        let spread = running.iter().max().unwrap_or(&0) - running.iter().min().unwrap_or(&0);
        if let Some(series) = &mut self.series {
            series.at_ms.push(self.now);
            for (node, value) in values.into_iter().enumerate() {
                series.hot_value[node].push(value);
            }
            series.spread.push(spread);
        }
        if !self.finished {
            self.schedule(SAMPLE_MS, Event::Sample);
        }
    }

    fn finish(mut self) -> RunResult {
        let heal = self.heal_at.unwrap_or(self.now);
        let convergence_ms = self.equal_since.map(|since| since - heal);
        match convergence_ms {
            None => self.checker.violate(
                self.now,
                "no convergence",
                format!(
                    "the replicas were not all equal {} ms after the heal (bound {} ms)",
                    self.now.saturating_sub(heal),
                    self.bound_ms
                ),
            ),
            Some(ms) if ms > self.bound_ms => self.checker.violate(
                self.now,
                "slow convergence",
                format!(
                    "converged {ms} ms after the heal, over the bound of {} ms",
                    self.bound_ms
                ),
            ),
            _ => {}
        }
        // Final states, read through the core as a client would.
        let keys = self.options.keys;
        let n = self.nodes.len();
        let mut finals: Vec<Vec<PnCounter>> = Vec::with_capacity(n);
        for node in 0..n {
            let now = self.nodes[node].local_now(self.now);
            let SimNode { replica, store, .. } = &mut self.nodes[node];
            let states = (0..keys)
                .map(|key| {
                    let state = replica
                        .handle_get(now, &*store, &self.key_names[key])
                        .unwrap_or_default();
                    // A counter nobody wrote reads at the node's fold epoch,
                    // which differs between nodes that folded and nodes that
                    // took the folds by merges: it is absent all the same.
                    let base = state.folded();
                    match state.slots().is_empty() && base.p == 0 && base.n == 0 {
                        true => PnCounter::new(),
                        false => state,
                    }
                })
                .collect();
            finals.push(states);
        }
        if convergence_ms.is_some() {
            self.check_final_equality(&finals);
            self.check_sets();
        }
        let slots = self.checker.check_slots(self.now, &self.ledger, &finals[0]);
        self.finish_fold_stats(&finals);
        let hot_value = finals[0][0].exact_value() as i64;
        self.trace.mix(hot_value as u64);
        RunResult {
            seed: self.seed,
            plan: self.plan,
            trace_hash: self.trace.finish(),
            events: self.events,
            sim_ms: self.now,
            heal_ms: heal,
            violations: self.checker.violations.clone(),
            violation_count: self.checker.violation_count,
            convergence_ms,
            bound_ms: self.bound_ms,
            key_convergence_ms: self.checker.key_convergence_ms(),
            workload: self.ledger.stats,
            net: self.net.stats,
            slots,
            commits: self.commits,
            pulls: self.pulls,
            idle_commits: self.idle_commits,
            replicas: self.checker.replica_count(),
            hot_value,
            copies: self.copy_stats,
            folds: self.fold_stats,
            series: self.series,
        }
    }

    fn check_final_equality(&mut self, finals: &[Vec<PnCounter>]) {
        for key in 0..self.options.keys {
            if let Some(node) = (1..finals.len()).find(|node| finals[*node][key] != finals[0][key])
            {
                self.checker.violate(
                    self.now,
                    "replicas differ",
                    format!(
                        "key {} after quiesce: n0 holds {:?}, n{node} holds {:?}",
                        self.key_names[key], finals[0][key], finals[node][key]
                    ),
                );
                break;
            }
        }
        for (node, states) in finals.iter().enumerate() {
            let digest = states.iter().enumerate().fold(0u64, |sum, (key, state)| {
                sum.wrapping_add(counter_digest(&self.key_names[key], state))
            });
            if digest != self.nodes[node].replica.digest().0 {
                self.checker.violate(
                    self.now,
                    "digest mismatch",
                    format!("n{node}: the digest does not match its durable state"),
                );
            }
        }
    }
}

/// The names of `keys` keys: key 0 is the hot post, the others `k001`...
pub fn key_names(keys: usize) -> Vec<String> {
    (0..keys)
        .map(|k| {
            if k == 0 {
                "post:hot:likes".to_string()
            } else {
                format!("k{k:03}")
            }
        })
        .collect()
}

/// Runs one seed.
pub fn run(seed: u64, options: &SimOptions, plan: Option<FaultPlan>, record: bool) -> RunResult {
    World::new(seed, options, plan, record).run()
}
