//! The runtime of a partitioned node around its core, as `tally-node`'s
//! shell runs it, with every step a timed event: one group commit at a time
//! (written, then flushed after a simulated fsync); sync rounds that pull
//! from the peers the peer book plans (`poll_pulls_among`, among those that
//! serve a partition this node keeps: every node of the region in turn, one
//! per other region) with the scope the partitions ask for, fitted by the
//! copy sessions; pulls answered with the replica's delta protocol;
//! confirmations of releases asked and answered; and the purge of what is
//! no longer kept, a bounded step per round.
//!
//! Invariants: a pull is reported to the partitions only once every change
//! it merged is durable here, so a confirmation never vouches for state a
//! crash could take back; when a round hands a partition off, the checker
//! verifies invariant 8 (every counter of it is held, at least as high, by
//! another node of the region that keeps it).

use tally_node::crdt::PnCounter;
use tally_node::partition::Partition;
use tally_node::replica::DurableState;

use super::node::{PartNode, PullInFlight, PulledPending};
use super::scoped::{merge_pulled, pull_request, serve_pull};
use super::world::{slot_of, Ev, Msg, PWorld};
use super::PartitionBug;
use crate::rng::between;
use crate::world::FSYNC_BASE_MAX_MS;

/// Stored counters one purge step looks at.
const PURGE_STEP: usize = 64;

impl PWorld<'_> {
    /// Starts the node's next group commit if none is in flight.
    pub(super) fn wake_commit(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if !state.up || state.committing.is_some() {
            return;
        }
        let Some(batch) = state.scoped_mut().start_commit() else {
            return;
        };
        let (epoch, seq) = (state.epoch, batch.seq);
        state.committing = Some(batch);
        let delay = between(&mut self.disk_rng, 1, FSYNC_BASE_MAX_MS);
        self.schedule(delay, Ev::FsyncDone(node as u16, epoch, seq));
    }

    /// The node's commit `seq` is flushed: the checker hears what it wrote,
    /// the adds it holds are answered, and the pulls it made durable are
    /// reported.
    pub(super) fn fsync_done(&mut self, node: usize, seq: u64) {
        let state = &mut self.nodes[node];
        let Some(batch) = state.committing.take_if(|batch| batch.seq == seq) else {
            return;
        };
        state.scoped_mut().finish_commit(seq);
        let writer = state.writer;
        for (key, counter) in &batch.counters {
            if let Some(index) = self.key_index(key) {
                if !self.nodes[node].keeps(self.key_partition[index]) {
                    // A purge trimmed it to this node's own slot.
                    self.checker.trimmed(writer, index);
                }
                self.checker.committed(self.now, writer, index, counter);
            }
        }
        for key in &batch.deleted {
            if let Some(index) = self.key_index(key) {
                self.checker.forget(writer, index);
            }
        }
        let durable = self.nodes[node].scoped().core.durable_seq();
        self.sets.durable(node, durable);
        self.trace
            .mix_all(&[node as u64, seq, self.nodes[node].scoped().core.digest().0]);
        self.answer_waiters(node);
        self.copies_durable(node);
        self.finish_pulls(node);
        self.pump_push(node);
        self.wake_commit(node);
    }

    /// Answers node `node`'s adds whose commit is durable (in `replicated`
    /// mode: on its copies too).
    pub(super) fn answer_waiters(&mut self, node: usize) {
        let replicated = self.replicated();
        let state = &mut self.nodes[node];
        let core = &state.scoped().core;
        let acked = match replicated {
            true => core.replicated_seq(),
            false => core.durable_seq(),
        };
        let later = state.waiting.split_off(&(acked + 1));
        let ready = std::mem::replace(&mut state.waiting, later);
        let id = state.id();
        for (ticket, waiters) in ready {
            for (client, add, attempt) in waiters {
                // A parked counter's adds wait for a push that confirms it.
                let key = &self.key_names[self.ledger.adds[add as usize].key as usize];
                let core = &self.nodes[node].scoped().core;
                if replicated && !core.replicated_for(key, ticket) {
                    self.nodes[node].wait_for(ticket, (client, add, attempt));
                    continue;
                }
                self.reply(client, add, attempt, id, ticket);
            }
        }
    }

    /// The index of a checked key.
    pub(super) fn key_index(&self, key: &str) -> Option<usize> {
        self.key_indexes.get(key).copied()
    }

    pub(super) fn send(&mut self, from: usize, to: usize, msg: Msg) {
        let mut deliveries = self.net.send(from, to);
        if matches!(
            msg,
            Msg::Forward { .. }
                | Msg::Pull { .. }
                | Msg::Pulled { .. }
                | Msg::Copy { .. }
                | Msg::CopyAnswer { .. }
        ) {
            // One gRPC call or stream: TCP never delivers it twice.
            deliveries.second = None;
        }
        for delay in deliveries.delays() {
            self.schedule(
                delay,
                Ev::Deliver {
                    to: to as u16,
                    from: from as u16,
                    msg: Box::new(msg.clone()),
                },
            );
        }
    }

    /// Node `node`'s sync round: pulls, confirmation requests, a purge step.
    pub(super) fn sync_round(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        let interval = self.options.sync_interval_ms;
        self.schedule(interval, Ev::SyncRound(node as u16, epoch));
        let now = self.clock(node);
        self.nodes[node].scoped_mut().core.tick(now);
        self.start_pulls(node);
        let requests = self.nodes[node].scoped().partitions.confirm_requests();
        let asker = self.nodes[node].name.clone();
        for (owner, partitions) in requests {
            self.stats.confirms += 1;
            let msg = Msg::Confirm {
                asker: asker.clone(),
                partitions,
            };
            self.send(node, slot_of(&owner), msg);
        }
        let state = &mut self.nodes[node];
        if self.options.bug != Some(PartitionBug::KeepReleased) && state.committing.is_none() {
            if let Some(step) = state.scoped_mut().purge_step(now, PURGE_STEP) {
                self.stats.purged += step.visited as u64;
            }
        }
        self.pump_push(node);
        self.wake_commit(node);
    }

    /// Starts the pulls the peer book plans now.
    fn start_pulls(&mut self, node: usize) {
        let now = self.clock(node);
        let epoch = self.nodes[node].epoch;
        let timeout = (self.options.sync_interval_ms * 10).max(2_000);
        let region = self.nodes[node].region.clone();
        let scoped = self.nodes[node].scoped_mut();
        let sources = scoped.partitions.pull_sources();
        let plans = scoped
            .core
            .peers_mut()
            .poll_pulls_among(now, &region, |member| sources.contains(&member.node_name));
        for plan in plans {
            let scoped = self.nodes[node].scoped_mut();
            let name = scoped
                .core
                .peers()
                .member(plan.peer)
                .map(|member| member.node_name.clone())
                .unwrap_or_default();
            let Some(scope) = scoped.partitions.pull_scope(&name) else {
                scoped.core.peers_mut().handle_pull_skipped(plan.peer);
                continue;
            };
            let mut request = pull_request(scoped, &plan);
            let scope = scoped
                .sessions
                .prepare(now, plan.peer, &scope, &mut request);
            let pull = self.next_pull;
            self.next_pull += 1;
            self.stats.pulls += 1;
            self.stats.from_scratch += scope.copy.len() as u64;
            let peer_slot = slot_of(&name);
            self.nodes[node].pulls.insert(
                pull,
                PullInFlight {
                    peer: plan.peer,
                    scope,
                },
            );
            self.send(node, peer_slot, Msg::Pull { pull, request });
            self.schedule(timeout, Ev::PullTimeout(node as u16, epoch, pull));
        }
    }

    /// A pull got no answer in time: the peer is tried again after a back-off.
    pub(super) fn pull_timed_out(&mut self, node: usize, pull: u64) {
        let now = self.clock(node);
        let state = &mut self.nodes[node];
        if let Some(pull) = state.pulls.remove(&pull) {
            let interval = self.options.sync_interval_ms;
            let book = state.scoped_mut().core.peers_mut();
            book.handle_pull_failed(now, pull.peer, interval);
        }
    }

    pub(super) fn deliver(&mut self, to: usize, from: usize, msg: Msg) {
        match msg {
            Msg::Forward {
                client,
                add,
                attempt,
            } => self.add_at_owner(to, client, add, attempt),
            Msg::Pull { pull, request } => {
                let chunks = serve_pull(self.nodes[to].scoped(), request);
                self.send(to, from, Msg::Pulled { pull, chunks });
            }
            Msg::Pulled { pull, chunks } => self.pulled(to, pull, chunks),
            Msg::Confirm { asker, partitions } => {
                let owner = &self.nodes[to];
                let answers = match self.options.bug {
                    Some(PartitionBug::ConfirmBeforeCaughtUp) => partitions
                        .iter()
                        .filter(|partition| owner.keeps(*partition))
                        .map(|partition| (partition, u64::MAX))
                        .collect(),
                    _ => owner
                        .scoped()
                        .partitions
                        .answer_confirms(&asker, &partitions),
                };
                let owner = owner.name.clone();
                self.send(to, from, Msg::Confirmed { owner, answers });
            }
            Msg::Confirmed { owner, answers } => {
                let partitions = &mut self.nodes[to].scoped_mut().partitions;
                partitions.handle_confirms(&owner, &answers);
            }
            Msg::Copy { push, data, epochs } => {
                self.copy_arrives(to, from, push, (from, push, data, epochs))
            }
            Msg::CopyAnswer { push, ok } => self.copy_answered(to, from, push, ok),
        }
    }

    /// Merges what a pull brought; the partitions hear of it once it is
    /// durable.
    fn pulled(
        &mut self,
        node: usize,
        pull: u64,
        chunks: Result<Vec<tally_node::replica::PullChunk>, String>,
    ) {
        let Some(PullInFlight { peer, scope, .. }) = self.nodes[node].pulls.remove(&pull) else {
            return;
        };
        let now = self.clock(node);
        let interval = self.options.sync_interval_ms;
        let scoped = self.nodes[node].scoped_mut();
        let merged = chunks.and_then(|chunks| merge_pulled(now, scoped, peer, chunks));
        let (outcome, changed) = match merged {
            Ok(merged) => merged,
            Err(_) => {
                scoped
                    .core
                    .peers_mut()
                    .handle_pull_failed(now, peer, interval);
                return;
            }
        };
        scoped.core.peers_mut().handle_pull_finished(now, peer);
        let report = scoped.sessions.finish(peer, &scope, &outcome);
        let needed = scoped.core.changes_durable_at();
        let writer = self.nodes[node].writer;
        for (key, counter) in changed {
            if let Some(index) = self.key_index(&key) {
                self.checker.observe(self.now, writer, index, &counter);
            }
        }
        if let Some(report) = report {
            let state = &mut self.nodes[node];
            state.pulled.push(PulledPending { report, needed });
        }
        self.wake_commit(node);
        self.finish_pulls(node);
    }

    /// Reports to the partitions the pulls whose merges are durable now.
    pub(super) fn finish_pulls(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        let durable = state.scoped().core.durable_seq();
        let ready = state
            .pulled
            .iter()
            .take_while(|p| p.needed <= durable)
            .count();
        let done: Vec<PulledPending> = state.pulled.drain(..ready).collect();
        let partitions = &mut state.scoped_mut().partitions;
        for PulledPending { report, .. } in done {
            let (scope, served, through, read_from_scratch) = report;
            partitions.handle_pulled(&scope, &served, through, &read_from_scratch);
        }
    }

    /// Invariant 8: what node `node` handed off of `partition` is held by
    /// another node of its region that keeps the partition.
    pub(super) fn check_release(&mut self, node: usize, partition: Partition) {
        let region = self.nodes[node].region.clone();
        let keys: Vec<usize> = (0..self.key_names.len())
            .filter(|key| self.key_partition[*key] == partition)
            .collect();
        for key in keys {
            let name = &self.key_names[key];
            let mine = stored(&self.nodes[node], name);
            let others: Vec<PnCounter> = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(other, state)| {
                    *other != node
                        && state.exists
                        && !state.removed
                        && state.region == region
                        && state.keeps(partition)
                })
                .map(|(_, state)| stored(state, name))
                .collect();
            let folds = &self.checker.folds;
            let epoch = mine.folded().epoch;
            // Each slot is held as high by another holder in the same phase,
            // or its phase was folded there (then the base holds its final
            // slot).
            let lacking = mine.slots().iter().find(|(writer, slot)| {
                let folded = others.iter().any(|state| {
                    let to = state.folded().epoch;
                    folds.ended_between(*writer, key, epoch, to).is_some()
                });
                let same_phase = others
                    .iter()
                    .filter(|state| folds.same_phase(*writer, key, epoch, state.folded().epoch));
                let (p, n) = same_phase.fold((0, 0), |(p, n), state| {
                    let theirs = state.slot(*writer);
                    (p.max(theirs.p), n.max(theirs.n))
                });
                !folded && (slot.p > p || slot.n > n)
            });
            if let Some((writer, slot)) = lacking {
                let detail = format!(
                    "n{node} handed off partition {partition} holding key {name} with \
                     slot (p {}, n {}) of {writer}, which no other holder of region \
                     {region} holds as high",
                    slot.p, slot.n
                );
                self.checker.violate(
                    self.now,
                    "partition deleted from its last up-to-date holder",
                    detail,
                );
                return;
            }
        }
    }
}

/// What node `node` has durably stored of `key`.
pub(super) fn stored(node: &PartNode, key: &str) -> PnCounter {
    let store = &node.scoped().store;
    store
        .load_counter(key)
        .ok()
        .flatten()
        .map(|stored| stored.state)
        .unwrap_or_default()
}
