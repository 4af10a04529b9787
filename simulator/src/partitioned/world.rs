//! The discrete-event loop of a partitioned world: the clock, the event
//! queue, the nodes and their views of the cluster, the fault plan, and the
//! result of a run.
//!
//! Invariant: a run is a pure function of (seed, options, plan). Events are
//! ordered by (time, insertion number), random draws come from per-subsystem
//! streams of the seed, and every handled event is folded into a trace hash.
//! A node's lifecycle round takes what the other nodes publish (state,
//! removals, drain requests, the partitions they serve and release) and
//! whether it can reach them, at its own round times, so views are stale
//! and disagree while faults last. A paused node's events wait until it
//! resumes (and the others do not hear from it meanwhile); each node's
//! core reads its own clock, offset by the plan's skews.

use tally_node::crdt::ReplicaId;
use tally_node::partition::{
    ClusterView, NodeInfo, NodeState, Partition, PartitionCount, ViewSettings,
};
use tally_node::replica::{DurableState, Member};

pub use super::events::{Ev, Msg, PartitionStats, PartitionedResult};
use super::node::PartNode;
use super::plan::{MemberOp, PartitionedPlan, PlanOp};
use super::scoped::ScopedNode;
use super::PartitionedOptions;
use crate::checker::Checker;
use crate::faults::Op;
use crate::ledger::Ledger;
use crate::network::{LatencyMatrix, Network};
use crate::options::SimOptions;
use crate::queue::EventQueue;
use crate::rng::{between, stream, SimRng, Subsystem, TraceHasher, Zipf};
use crate::set_ledger::SetLedger;
use crate::world::{CopyStats, EPOCH_MS};

/// Time between two settle probes after the heal (ms).
pub const PROBE_MS: u64 = 50;

/// See the module documentation.
pub struct PWorld<'a> {
    pub(super) options: &'a PartitionedOptions,
    pub(super) net_options: SimOptions,
    seed: u64,
    plan: PartitionedPlan,
    pub(super) now: u64,
    queue: EventQueue<Ev>,
    pub(super) count: PartitionCount,
    pub(super) settings: ViewSettings,
    pub(super) nodes: Vec<PartNode>,
    /// Per client: its region and the add it waits for.
    pub(super) clients: Vec<(usize, Option<u32>)>,
    /// Per add: when its latest attempt was sent, and whether its caller
    /// has its answer.
    pub(super) attempts: Vec<(u64, bool)>,
    pub(super) net: Network,
    pub(super) ledger: Ledger,
    /// Each add's latest application by each replica (not a duplicate):
    /// (add, replica) to the commit that held it, and whether a crash lost
    /// that commit.
    pub(super) applied_tickets: std::collections::HashMap<(u32, ReplicaId), (u64, bool)>,
    pub(super) checker: Checker,
    pub(super) trace: TraceHasher,
    pub(super) key_names: Vec<String>,
    /// Each key name's index in `key_names`.
    pub(super) key_indexes: std::collections::HashMap<String, usize>,
    pub(super) key_partition: Vec<Partition>,
    pub(super) workload_rng: SimRng,
    pub(super) zipf: Zipf,
    pub(super) disk_rng: SimRng,
    id_rng: SimRng,
    pub(super) clients_stopped: bool,
    pub(super) heal_at: Option<u64>,
    deadline: u64,
    pub(super) settled_at: Option<u64>,
    events: u64,
    pub(super) next_pull: u64,
    pub(super) stats: PartitionStats,
    pub(super) copies: CopyStats,
    /// The like-set and uniques workload.
    pub(super) sets: SetLedger,
}

/// Runs one seed (with the seed's plan unless one is given).
pub fn run(
    seed: u64,
    options: &PartitionedOptions,
    plan: Option<PartitionedPlan>,
) -> PartitionedResult {
    PWorld::new(seed, options, plan).run()
}

impl<'a> PWorld<'a> {
    fn new(seed: u64, options: &'a PartitionedOptions, plan: Option<PartitionedPlan>) -> Self {
        let plan = plan.unwrap_or_else(|| PartitionedPlan::generate(seed, options));
        let net_options = options.network_options();
        let matrix = LatencyMatrix::generate(seed, &net_options);
        let count = PartitionCount::new(u64::from(options.partitions)).expect("validated");
        let nodes = (0..options.slot_count())
            .map(|i| PartNode::new(i, net_options.region_name(options.region_of(i))))
            .collect();
        let key_names = crate::world::key_names(options.keys);
        let key_partition = key_names
            .iter()
            .map(|key| count.of_key(key.as_bytes()))
            .collect();
        let clients = (0..options.regions)
            .flat_map(|region| (0..options.clients_per_region).map(move |_| (region, None)))
            .collect();
        let mut world = PWorld {
            options,
            net: Network::new(seed, &net_options, matrix),
            net_options,
            seed,
            plan,
            now: 0,
            queue: EventQueue::default(),
            count,
            settings: ViewSettings {
                partitions: count,
                replication_factor: options.replication,
                dead_after_ms: options.dead_after_ms,
            },
            nodes,
            clients,
            attempts: Vec::new(),
            // Lanes are kept per key and sign across the whole cluster (one
            // "node" in the ledger): an add's attempts may reach several
            // owners, and each slot's unknown adds must hold distinct lanes.
            ledger: Ledger::new(1, options.keys),
            applied_tickets: std::collections::HashMap::new(),
            checker: Checker::new(0, options.keys),
            trace: TraceHasher::default(),
            key_indexes: key_names
                .iter()
                .enumerate()
                .map(|(index, name)| (name.clone(), index))
                .collect(),
            key_names,
            key_partition,
            workload_rng: stream(seed, Subsystem::Workload),
            zipf: Zipf::new(options.keys, options.zipf),
            disk_rng: stream(seed, Subsystem::Disk),
            id_rng: stream(seed, Subsystem::Identity),
            clients_stopped: false,
            heal_at: None,
            deadline: u64::MAX,
            settled_at: None,
            events: 0,
            next_pull: 1,
            stats: PartitionStats::default(),
            copies: CopyStats::default(),
            sets: SetLedger::new(stream(seed, Subsystem::Sets)),
        };
        if world.replicated() {
            world.checker.require_replicated();
        }
        let partition_of = world.key_partition.iter().map(|p| p.0).collect();
        world.checker.folds.set_partitions(partition_of);
        world.start();
        world
    }

    pub(super) fn schedule(&mut self, delay: u64, event: Ev) {
        self.queue.schedule(self.now + delay, event);
    }

    fn start(&mut self) {
        // Every node starts on a new data directory and joins; a partition
        // nobody serves yet is ready at once (nothing to copy).
        for node in 0..self.nodes.len() {
            if self.options.is_initial(node) {
                self.start_node(node);
            }
        }
        for client in 0..self.clients.len() {
            let delay = between(&mut self.workload_rng, 0, self.options.think_ms);
            self.schedule(delay, Ev::ClientWake(client as u32));
        }
        let duration = self.options.duration_ms;
        for (i, op) in self.plan.0.clone().iter().enumerate() {
            if op.start_ms() >= duration {
                continue;
            }
            self.schedule(op.start_ms(), Ev::Fault(i, true));
            if let PlanOp::Fault(op) = op {
                self.schedule(op.end_ms().min(duration), Ev::Fault(i, false));
            }
        }
        self.schedule(1, Ev::SetOp);
        self.schedule(duration, Ev::HealAll);
    }

    /// The replica settings of every node: the simulator's, with the
    /// core's planted bug if one was asked for.
    fn replica_config(&self) -> tally_node::replica::ReplicaConfig {
        let config = super::scoped::config();
        #[cfg(feature = "planted-bugs")]
        let config = tally_node::replica::ReplicaConfig {
            planted_bug: self.options.bug.and_then(|bug| bug.core_bug()),
            ..config
        };
        config
    }

    /// Starts slot `node` on a new data directory, as a new replica.
    fn start_node(&mut self, node: usize) {
        let id = self.fresh_id();
        let now = self.clock(node);
        let settings = (self.settings, self.replica_config());
        let state = &mut self.nodes[node];
        let scoped = ScopedNode::with_config(&state.name, &state.region, id, settings, now);
        state.writer = self.checker.add_writer(self.now, scoped.id());
        state.node = Some(scoped);
        state.exists = true;
        state.up = true;
        self.start_timers(node);
    }

    fn start_timers(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        let offset = between(&mut self.disk_rng, 0, self.options.sync_interval_ms - 1);
        self.schedule(offset, Ev::SyncRound(node as u16, epoch));
        let offset = between(&mut self.disk_rng, 1, 100);
        self.schedule(offset, Ev::ViewRefresh(node as u16, epoch));
        self.start_fold_rounds(node);
    }

    fn run(mut self) -> PartitionedResult {
        while let Some((at, event)) = self.queue.pop() {
            if at > self.deadline || self.settled_at.is_some() {
                break;
            }
            self.now = at;
            self.handle(event);
        }
        self.finish()
    }

    fn handle(&mut self, event: Ev) {
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
        if matches!(event, Ev::Probe) {
            self.probe();
            return;
        }
        self.events += 1;
        self.trace.mix(self.now);
        self.trace.mix(event.tag());
        match event {
            Ev::Fault(i, starting) => self.fault(i, starting),
            Ev::HealAll => self.heal_all(),
            Ev::ClientWake(client) => self.client_wake(client),
            Ev::ClientTimeout(client, add, attempt) => self.client_timeout(client, add, attempt),
            Ev::ClientRetry(client, add) => self.client_retry(client, add),
            Ev::AddAtEntry(node, client, add, attempt) => {
                self.add_at_entry(node as usize, client, add, attempt)
            }
            Ev::AddReply {
                client,
                add,
                attempt,
                answer,
            } => self.add_reply(client, add, attempt, answer),
            Ev::FsyncDone(node, _, seq) => self.fsync_done(node as usize, seq),
            Ev::FoldRound(node, _) => self.fold_round(node as usize),
            Ev::SetOp => self.set_op(),
            Ev::SyncRound(node, _) => self.sync_round(node as usize),
            Ev::ViewRefresh(node, _) => {
                self.lifecycle_round(node as usize);
                let epoch = self.nodes[node as usize].epoch;
                let delay = between(&mut self.disk_rng, 100, 300);
                self.schedule(delay, Ev::ViewRefresh(node, epoch));
            }
            Ev::Deliver { to, from, msg } => self.deliver(to as usize, from as usize, *msg),
            Ev::PullTimeout(node, _, pull) => self.pull_timed_out(node as usize, pull),
            Ev::PushTimeout(node, _, push) => self.push_timeout(node as usize, push),
            Ev::PushRetry(node, _) => self.push_retry(node as usize),
            Ev::CopyWaitExpired(node, _, ticket, client, add, attempt) => {
                self.copy_wait_expired(node as usize, ticket, (client, add, attempt))
            }
            Ev::AddUnavailable(client, add, attempt) => self.add_unavailable(client, add, attempt),
            Ev::Answered(add, replica, ticket) => self.answered(add, replica, ticket),
            Ev::Probe => unreachable!("handled above"),
        }
    }

    pub(super) fn fresh_id(&mut self) -> u64 {
        rand::Rng::random(&mut self.id_rng)
    }

    /// Whether `observer` hears from `index` now.
    fn hears(&self, observer: usize, index: usize) -> bool {
        index == observer
            || (self.nodes[index].running()
                && !self.net.is_blocked(observer, index)
                && !self.net.is_blocked(index, observer))
    }

    /// The other started nodes, each with whether `observer` hears from it.
    fn others_heard(&self, observer: usize) -> Vec<(usize, bool)> {
        (0..self.nodes.len())
            .filter(|index| *index != observer && self.nodes[*index].exists)
            .map(|index| (index, self.hears(observer, index)))
            .collect()
    }

    /// What membership tells node `observer`'s peer book of the others.
    fn members_for(&self, observer: usize) -> Vec<Member> {
        let others = self.others_heard(observer);
        others
            .iter()
            .map(|(index, alive)| self.nodes[*index].member(*alive))
            .collect()
    }

    /// Node `node`'s peer book hears what membership says of the others now.
    pub(super) fn refresh_peer_book(&mut self, node: usize) {
        let members = self.members_for(node);
        let book = self.nodes[node].scoped_mut().core.peers_mut();
        book.handle_membership(members);
    }

    /// The cluster as it is (what an operator's check sees).
    pub(super) fn truth(&self) -> ClusterView {
        let infos = self.nodes.iter().filter(|node| node.exists).map(|node| {
            let (serving, _, releasing) = node.scoped().partitions.holdings();
            NodeInfo {
                name: node.name.clone(),
                region: node.region.clone(),
                state: if node.removed {
                    NodeState::Left
                } else {
                    node.state()
                },
                alive: node.up,
                down_since_ms: None,
                holding: serving,
                releasing,
            }
        });
        ClusterView::new(
            self.count,
            self.options.replication,
            self.options.dead_after_ms,
            self.now,
            infos,
        )
    }

    /// Node `node`'s lifecycle round, as the node's lifecycle keeper runs
    /// it: the members' facts in, the record stored, the round committed;
    /// the partitions it handed off checked against invariant 8.
    pub(super) fn lifecycle_round(&mut self, node: usize) {
        self.refresh_peer_book(node);
        let facts = self
            .others_heard(node)
            .iter()
            .map(|(index, alive)| self.nodes[*index].facts(*alive))
            .collect();
        let now = self.clock(node);
        let state = &mut self.nodes[node];
        let scoped = state.scoped_mut();
        let releasing = scoped.partitions.holdings().2;
        let Some(outcome) = scoped.round(now, facts) else {
            return;
        };
        state.view = Some(scoped.partitions.view(now));
        match outcome.state_change {
            Some((NodeState::Joining, NodeState::Active)) if !self.options.is_initial(node) => {
                self.stats.joined += 1
            }
            Some((_, NodeState::Left)) => self.stats.drained += 1,
            _ => {}
        }
        for partition in outcome.deleted {
            self.stats.released += 1;
            if releasing.contains(partition) {
                self.check_release(node, partition);
            }
        }
        self.finish_pulls(node);
        self.wake_commit(node);
        let serving = self.nodes[node].scoped().partitions.holdings().0;
        self.trace.mix(serving.len() as u64);
    }

    fn fault(&mut self, index: usize, starting: bool) {
        let op = self.plan.0[index].clone();
        self.trace.mix(index as u64);
        match op {
            PlanOp::Fault(Op::Partition { shape, .. }) => {
                if starting {
                    self.net.start_partition(index, shape, &self.net_options);
                } else {
                    self.net.heal_partition(index, &self.net_options);
                }
            }
            PlanOp::Fault(Op::Crash { node, .. }) => {
                if starting {
                    self.crash(node, false);
                } else {
                    self.restart(node);
                }
            }
            PlanOp::Fault(Op::Flaky {
                loss_pct,
                dup_pct,
                reorder_pct,
                ..
            }) => {
                if starting {
                    self.net.start_flaky(index, loss_pct, dup_pct, reorder_pct);
                } else {
                    self.net.end_flaky(index);
                }
            }
            PlanOp::Fault(Op::Pause { node, .. }) => match starting {
                true => self.pause(node),
                false => self.resume(node),
            },
            PlanOp::Fault(Op::Skew {
                node, offset_ms, ..
            }) => {
                if starting {
                    self.nodes[node].skew_ms = offset_ms;
                }
            }
            PlanOp::Fault(Op::Retire { .. }) => {}
            PlanOp::Member(op) => self.member(op),
        }
    }

    fn member(&mut self, op: MemberOp) {
        let node = op.node();
        let now = self.clock(node);
        match op {
            MemberOp::Join { .. } => {
                if !self.nodes[node].exists {
                    self.start_node(node);
                }
            }
            MemberOp::Drain { .. } => {
                let state = &mut self.nodes[node];
                if !state.exists || state.removed || !state.up {
                    return;
                }
                let name = state.name.clone();
                let scoped = state.scoped_mut();
                match scoped.partitions.drain(now, &name) {
                    Ok(pending) => {
                        if let Some(record) = pending.record_to_persist() {
                            scoped.record = Some(record);
                        }
                        pending.commit();
                    }
                    Err(_) => self.stats.drains_refused += 1,
                }
            }
            MemberOp::Remove { .. } => {
                if !self.nodes[node].exists || self.nodes[node].removed {
                    return;
                }
                self.crash(node, false);
                // An operator asks a node that is up, as `tally admin remove`.
                let name = self.nodes[node].name.clone();
                let Some(asked) = (0..self.nodes.len()).find(|other| {
                    let other = &self.nodes[*other];
                    other.exists && other.up && !other.removed
                }) else {
                    return;
                };
                // It asks once its view shows the node down.
                self.lifecycle_round(asked);
                let scoped = self.nodes[asked].scoped_mut();
                let Ok(pending) = scoped.partitions.remove(now, &name) else {
                    self.stats.removals_refused += 1;
                    return;
                };
                if let Some(record) = pending.record_to_persist() {
                    scoped.record = Some(record);
                }
                pending.commit();
                let state = &mut self.nodes[node];
                state.removed = true;
                self.checker.writer_lost(state.writer);
                let replica = state.id();
                self.sets.crashed(node, replica, true);
                self.stats.removed += 1;
            }
        }
    }

    /// Kills node `node` if it runs: the set workload's operations it had
    /// not made durable are lost with it.
    fn crash(&mut self, node: usize, disk_lost: bool) {
        let state = &mut self.nodes[node];
        if state.exists && state.up {
            let (replica, durable) = (state.id(), state.scoped().core.durable_seq());
            state.crash();
            self.sets.crashed(node, replica, disk_lost);
            // Adds it applied in commits that were not flushed are gone.
            for ((_, applier), (ticket, lost)) in &mut self.applied_tickets {
                if *applier == replica && *ticket > durable {
                    *lost = true;
                }
            }
        }
    }

    pub(super) fn restart(&mut self, node: usize) {
        let state = &self.nodes[node];
        if !state.exists || state.up || state.removed {
            return;
        }
        let now = self.clock(node);
        self.nodes[node].restart(now);
        let state = &self.nodes[node];
        let (writer, id) = (state.writer, state.id());
        let store = &state.scoped().store;
        let names = &self.key_names;
        let partitions = &self.key_partition;
        // What it keeps comes back whole; of the rest it may hold its own
        // slots, all it held (a crash before the purge), or nothing: not
        // checked, but what its disk holds is what it holds from now on.
        let stored = |key: usize| {
            store
                .load_counter(&names[key])
                .ok()
                .flatten()
                .map(|stored| stored.state)
                .unwrap_or_default()
        };
        self.checker.restarted_holding(self.now, writer, id, |key| {
            state.keeps(partitions[key]).then(|| stored(key))
        });
        for key in (0..names.len()).filter(|key| !state.keeps(partitions[*key])) {
            self.checker.stored_unchecked(writer, key, &stored(key));
        }
        self.start_timers(node);
    }

    /// Stops node `node`'s process: it handles nothing until it resumes,
    /// and the others stop hearing from it.
    fn pause(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if state.running() {
            state.paused = true;
        }
    }

    /// Node `node` runs again and handles what arrived meanwhile, in order;
    /// a client request whose deadline passed is refused before it is
    /// applied, as the node refuses a late add (`DEADLINE_EXCEEDED`).
    fn resume(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if !state.up || !state.paused {
            return;
        }
        state.paused = false;
        for event in std::mem::take(&mut state.deferred) {
            let request = match &event {
                Ev::AddAtEntry(_, _, add, attempt) => Some((*add, *attempt)),
                Ev::Deliver { msg, .. } => match **msg {
                    Msg::Forward { add, attempt, .. } => Some((add, attempt)),
                    _ => None,
                },
                _ => None,
            };
            if let Some((add, attempt)) = request {
                // An earlier attempt's deadline passed before a later one
                // was sent.
                let latest = self.ledger.adds[add as usize].attempts == attempt;
                let sent = self.attempts[add as usize].0;
                if !latest || self.now > sent + self.options.client_timeout_ms {
                    continue;
                }
            }
            self.schedule(0, event);
        }
    }

    fn heal_all(&mut self) {
        self.net.heal_all(&self.net_options);
        for node in 0..self.nodes.len() {
            self.resume(node);
            self.restart(node);
        }
        self.clients_stopped = true;
        self.heal_at = Some(self.now);
        self.deadline = self.now + self.options.settle_ms;
        self.schedule(PROBE_MS, Ev::Probe);
    }

    /// Why the cluster has not settled yet (counters and partitions first,
    /// then the set keys), or `None` once it has.
    fn why_unsettled(&mut self) -> Option<String> {
        let why = self.unsettled();
        why.or_else(|| self.sets_unsettled())
    }

    fn probe(&mut self) {
        if self.why_unsettled().is_none() {
            self.settled_at = Some(self.now);
        } else {
            self.schedule(PROBE_MS, Ev::Probe);
        }
    }

    fn finish(mut self) -> PartitionedResult {
        let heal = self.heal_at.unwrap_or(self.now);
        if self.settled_at.is_none() {
            let why = self.why_unsettled().unwrap_or_default();
            self.checker.violate(
                self.now,
                "never settled",
                format!("{} ms after the heal: {why}", self.now.saturating_sub(heal)),
            );
        }
        let slots = self.final_check();
        self.stats.writers_folded = self.checker.folds.writers_folded() as u64;
        self.stats.scoped_folded = self.checker.folds.scoped_folded() as u64;
        if self.settled_at.is_some() {
            self.check_sets();
        }
        let held = self
            .nodes
            .iter()
            .filter(|node| node.exists && !node.removed)
            .map(|node| {
                let counters = self
                    .key_partition
                    .iter()
                    .filter(|p| node.keeps(**p))
                    .count();
                let kept = self.count.iter().filter(|p| node.keeps(*p)).count();
                (node.name.clone(), kept, counters)
            })
            .collect();
        PartitionedResult {
            seed: self.seed,
            plan: self.plan,
            trace_hash: self.trace.finish(),
            events: self.events,
            sim_ms: self.now,
            heal_ms: heal,
            settled_ms: self.settled_at.map(|at| at - heal),
            violations: self.checker.violations.clone(),
            violation_count: self.checker.violation_count,
            workload: self.ledger.stats,
            net: self.net.stats,
            slots,
            stats: self.stats,
            copies: self.copies,
            held,
        }
    }
}

impl PWorld<'_> {
    /// The time node `node`'s clock shows now (its skew included).
    pub(super) fn clock(&self, node: usize) -> u64 {
        self.nodes[node].clock(self.now)
    }
}

/// The time an unskewed clock shows at simulated time `now`.
pub(super) fn local_now(now: u64) -> u64 {
    EPOCH_MS + now
}

/// The slot of a node name (`n7` is slot 7).
pub(super) fn slot_of(name: &str) -> usize {
    name.strip_prefix('n')
        .and_then(|index| index.parse().ok())
        .expect("simulated node names are n<slot>")
}
