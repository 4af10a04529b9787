//! The runtime of a partitioned node around its cores, as issue 11 asks of
//! the real node: group commits per partition replica, sync rounds that pull
//! what `Holdings::poll_pull_scope` plans (from every peer of the region
//! that serves a kept partition, and from one owner per other region,
//! rotating), answers served with the replica's delta protocol (from scratch
//! for the partitions the plan says), confirmations of releases, and the
//! deletions `Holdings::poll_deletions` allows.
//!
//! Invariants: a pull is reported to `Holdings` (`handle_pulled`) only once
//! every change it merged is durable here, so a confirmation never vouches
//! for state a crash could take back; a partition is deleted only when
//! `poll_deletions` returns it, and then the checker verifies invariant 8
//! (every counter of it is held, at least as high, by another node of the
//! region that keeps it).

use std::collections::BTreeMap;

use tally_node::crdt::{PnCounter, ReplicaId};
use tally_node::partition::{Holding, Partition, PartitionSet, PullScope};
use tally_node::replica::{Cursor, PullRequest};
use tally_node::store::Store;

use super::node::{PartNode, PullInFlight, PulledPending};
use super::world::{Ev, Msg, PWorld};
use super::PartitionBug;
use crate::rng::between;
use crate::world::{CLUSTER, FSYNC_BASE_MAX_MS};

impl PWorld<'_> {
    /// Starts a commit of `partition`'s replica if none is in flight.
    pub(super) fn wake_commit(&mut self, node: usize, partition: Partition) {
        let epoch = self.nodes[node].epoch;
        let Some(part) = self.nodes[node].parts.get_mut(&partition) else {
            return;
        };
        if part.committing.is_some() {
            return;
        }
        let Some(batch) = part.replica.poll_commit() else {
            // Nothing to write: whatever was counted as changed is durable.
            let done = std::mem::take(&mut part.unbatched);
            self.nodes[node].settle_changes(done);
            return;
        };
        part.store.write(&batch).expect("the memory store writes");
        let seq = batch.seq;
        let id = part.id();
        let changes = std::mem::take(&mut part.unbatched);
        part.batched.insert(seq, changes);
        part.committing = Some(batch);
        let delay = between(&mut self.disk_rng, 1, FSYNC_BASE_MAX_MS);
        self.schedule(delay, Ev::FsyncDone(node as u16, epoch, partition, id, seq));
    }

    pub(super) fn fsync_done(
        &mut self,
        node: usize,
        partition: Partition,
        id: ReplicaId,
        seq: u64,
    ) {
        let Some(part) = self.nodes[node].parts.get_mut(&partition) else {
            return;
        };
        if part.id() != id {
            return;
        }
        let Some(batch) = part.committing.take_if(|batch| batch.seq == seq) else {
            return;
        };
        part.store.flush().expect("the memory store flushes");
        for (key, counter) in &batch.counters {
            if let Some(index) = self.key_names.iter().position(|name| **name == **key) {
                self.checker
                    .committed(self.now, part.writer, index, counter);
            }
        }
        part.replica.handle_commit_done(seq);
        let durable = part.replica.durable_seq();
        let later = part.batched.split_off(&(seq + 1));
        let done = std::mem::replace(&mut part.batched, later);
        let later = part.waiting.split_off(&(durable + 1));
        let ready = std::mem::replace(&mut part.waiting, later);
        self.trace
            .mix_all(&[node as u64, seq, part.replica.digest().0]);
        self.nodes[node].settle_changes(done.into_values().flatten());
        for (ticket, waiters) in ready {
            for (client, add, attempt) in waiters {
                self.reply(client, add, attempt, id, ticket);
            }
        }
        self.finish_pulls(node);
        self.wake_commit(node, partition);
    }

    pub(super) fn send(&mut self, from: usize, to: usize, msg: Msg) {
        let mut deliveries = self.net.send(from, to);
        if matches!(msg, Msg::Forward { .. }) {
            // A forward is one gRPC call: TCP never delivers it twice.
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

    /// The peers to pull from now, with the partitions of each.
    fn plan_pulls(&mut self, node: usize) -> Vec<(usize, PullScope)> {
        let state = &self.nodes[node];
        let Some(view) = &state.view else {
            return Vec::new();
        };
        let kept = state.holdings.kept();
        let mut remote: BTreeMap<usize, PartitionSet> = BTreeMap::new();
        for region in view.regions() {
            if region == state.region {
                continue;
            }
            for partition in kept.iter() {
                let route = view.route(region, partition);
                if route.is_empty() {
                    continue;
                }
                // A stable choice per node (it moves only when the route
                // does), so that the pulls from it stay deltas.
                let pick = route[state.index % route.len()];
                remote
                    .entry(slot_of(pick))
                    .or_insert_with(|| PartitionSet::empty(self.count))
                    .insert(partition);
            }
        }
        let mut pulls = Vec::new();
        for peer in view.nodes() {
            let index = slot_of(&peer.name);
            if index == node || !peer.alive || state.pulls.values().any(|p| p.peer == index) {
                continue;
            }
            let Some(mut scope) = state.holdings.poll_pull_scope(&peer.name) else {
                continue;
            };
            if peer.region != state.region {
                let Some(chosen) = remote.get(&index) else {
                    continue;
                };
                scope.partitions = scope.partitions.intersection(chosen);
                scope.from_scratch = scope.from_scratch.intersection(chosen);
                if scope.partitions.is_empty() {
                    continue;
                }
            }
            pulls.push((index, scope));
        }
        pulls
    }

    pub(super) fn sync_round(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        self.schedule(
            self.options.sync_interval_ms,
            Ev::SyncRound(node as u16, epoch),
        );
        self.nodes[node].rounds += 1;
        let now = PartNode::local_now(self.now);
        for part in self.nodes[node].parts.values_mut() {
            part.replica.tick(now);
        }
        let partitions: Vec<Partition> = self.nodes[node].parts.keys().copied().collect();
        for partition in partitions {
            self.wake_commit(node, partition);
        }
        let timeout = (self.options.sync_interval_ms * 10).max(2_000);
        for (peer, scope) in self.plan_pulls(node) {
            let pull = self.next_pull;
            self.next_pull += 1;
            self.stats.pulls += 1;
            self.stats.from_scratch += scope.from_scratch.len() as u64;
            let state = &self.nodes[node];
            let after = scope
                .partitions
                .iter()
                .filter(|p| !scope.from_scratch.contains(*p))
                .filter_map(|p| {
                    let source = *state.sources.get(&(peer, p))?;
                    let cursor = state.parts.get(&p)?.replica.peers().watermark(source);
                    Some((p, source, cursor))
                })
                .collect();
            self.nodes[node].pulls.insert(
                pull,
                PullInFlight {
                    peer,
                    scope: scope.clone(),
                },
            );
            self.send(node, peer, Msg::Pull { pull, scope, after });
            self.schedule(timeout, Ev::PullTimeout(node as u16, epoch, pull));
        }
        let asker = self.nodes[node].name.clone();
        for request in self.nodes[node].holdings.poll_confirm_requests() {
            self.stats.confirms += 1;
            let msg = Msg::Confirm {
                partition: request.partition,
                asker: asker.clone(),
            };
            self.send(node, slot_of(&request.owner), msg);
        }
        self.delete(node);
    }

    pub(super) fn deliver(&mut self, to: usize, from: usize, msg: Msg) {
        match msg {
            Msg::Forward {
                client,
                add,
                attempt,
            } => self.add_at_owner(to, client, add, attempt),
            Msg::Pull { pull, scope, after } => self.serve(to, from, pull, &scope, after),
            Msg::Pulled {
                pull,
                served,
                through,
                parts,
            } => self.pulled(to, pull, served, through, parts),
            Msg::Confirm { partition, asker } => {
                let owner = &self.nodes[to];
                let answer = match self.options.bug {
                    Some(PartitionBug::ConfirmBeforeCaughtUp)
                        if owner.holdings.keeps(partition) =>
                    {
                        Some(u64::MAX)
                    }
                    _ => owner.holdings.answer_confirm(partition, &asker),
                };
                let msg = Msg::Confirmed {
                    partition,
                    owner: owner.name.clone(),
                    answer,
                };
                self.send(to, from, msg);
            }
            Msg::Confirmed {
                partition,
                owner,
                answer,
            } => {
                self.nodes[to]
                    .holdings
                    .handle_confirm(partition, &owner, answer);
                self.delete(to);
            }
        }
    }

    /// Answers a pull with every served partition's durable changes.
    fn serve(
        &mut self,
        node: usize,
        caller: usize,
        pull: u64,
        scope: &PullScope,
        after: Vec<(Partition, ReplicaId, Cursor)>,
    ) {
        let state = &self.nodes[node];
        let through = state.durable_seq();
        let mut served = PartitionSet::empty(self.count);
        let mut parts = Vec::new();
        for partition in scope.partitions.iter() {
            if !state.holdings.serves(partition) {
                continue;
            }
            let part = &state.parts[&partition];
            let source = part.id();
            let cursor = after
                .iter()
                .find(|(p, id, _)| *p == partition && *id == source)
                .map(|(_, _, cursor)| cursor.clone())
                .unwrap_or_default();
            let mut request = PullRequest {
                cluster_id: CLUSTER.into(),
                caller: ReplicaId(0),
                expected: Some(source),
                after: cursor,
                max_bytes: usize::MAX / 2,
                directory_digest: None,
                protocol: part.replica.peers().own_protocol(),
                deltas_after: None,
                records_from: None,
                scope: None,
            };
            let mut chunks = Vec::new();
            loop {
                let chunk = part
                    .replica
                    .handle_pull(&part.store, &request)
                    .expect("a partition replica serves its own cluster");
                request.after = chunk.next.clone();
                let complete = chunk.complete;
                chunks.push(chunk);
                if complete {
                    break;
                }
            }
            served.insert(partition);
            parts.push((partition, source, chunks));
        }
        let msg = Msg::Pulled {
            pull,
            served,
            through,
            parts,
        };
        self.send(node, caller, msg);
    }

    /// Merges what a pull brought; `Holdings` hears of it once it is durable.
    fn pulled(
        &mut self,
        node: usize,
        pull: u64,
        mut served: PartitionSet,
        through: u64,
        parts: Vec<(Partition, ReplicaId, Vec<tally_node::replica::PullChunk>)>,
    ) {
        let Some(PullInFlight { peer, scope }) = self.nodes[node].pulls.remove(&pull) else {
            return;
        };
        let now = PartNode::local_now(self.now);
        for (partition, source, chunks) in parts {
            let state = &mut self.nodes[node];
            let Some(part) = state.parts.get_mut(&partition) else {
                served.remove(partition);
                continue;
            };
            let writer = part.writer;
            let mut changed = Vec::new();
            let mut refused = false;
            for chunk in chunks {
                match part
                    .replica
                    .handle_pull_chunk(now, &part.store, source, chunk)
                {
                    Ok(report) => changed.extend(report.changed),
                    Err(_) => refused = true,
                }
            }
            if refused {
                served.remove(partition);
            }
            state.sources.insert((peer, partition), source);
            if !changed.is_empty() {
                state.changed(partition);
            }
            for (key, counter) in changed {
                if let Some(index) = self.key_names.iter().position(|name| **name == *key) {
                    self.checker.observe(self.now, writer, index, &counter);
                }
            }
            self.wake_commit(node, partition);
        }
        let needed = self.nodes[node].seq;
        self.nodes[node].pulled.push(PulledPending {
            scope,
            served,
            through,
            needed,
        });
        self.finish_pulls(node);
    }

    /// Reports to `Holdings` the pulls whose merges are durable now.
    pub(super) fn finish_pulls(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        let durable = state.durable_seq();
        let ready = state
            .pulled
            .iter()
            .take_while(|p| p.needed <= durable)
            .count();
        if ready == 0 {
            return;
        }
        for pending in state.pulled.drain(..ready).collect::<Vec<_>>() {
            // Each partition has its own cursors here: those not copied yet
            // were read from the start.
            let read_from_scratch = pending.scope.from_scratch.intersection(&pending.served);
            state.holdings.handle_pulled(
                &pending.scope,
                &pending.served,
                pending.through,
                &read_from_scratch,
            );
        }
        state.persist();
    }

    /// Deletes what `Holdings` allows, checking invariant 8 for releases.
    fn delete(&mut self, node: usize) {
        let before: BTreeMap<Partition, bool> = self.nodes[node]
            .parts
            .keys()
            .map(|p| {
                let releasing = matches!(
                    self.nodes[node].holdings.state(*p),
                    Some(Holding::Releasing { .. })
                );
                (*p, releasing)
            })
            .collect();
        if self.options.bug == Some(PartitionBug::KeepReleased) {
            return;
        }
        // As the node does: a partition with a change still waiting for its
        // commit is not released yet (its latest change would move).
        let state = &mut self.nodes[node];
        let parts = &state.parts;
        let deletions = state.holdings.poll_deletions(|partition| {
            parts
                .get(&partition)
                .is_none_or(|part| part.pending_changes().next().is_none())
        });
        for partition in deletions {
            if before.get(&partition) == Some(&true) {
                self.stats.released += 1;
                self.check_release(node, partition);
            } else {
                self.stats.dropped += 1;
            }
            let state = &mut self.nodes[node];
            if let Some(part) = state.parts.remove(&partition) {
                let gone: Vec<u64> = part.pending_changes().collect();
                state.settle_changes(gone);
            }
            state.sources.retain(|(_, p), _| *p != partition);
            state.persist();
        }
        self.finish_pulls(node);
    }

    /// Invariant 8: what node `node` deletes of `partition` is held by
    /// another node of its region that keeps the partition.
    fn check_release(&mut self, node: usize, partition: Partition) {
        let now = PartNode::local_now(self.now);
        let region = self.nodes[node].region.clone();
        let keys: Vec<usize> = (0..self.key_names.len())
            .filter(|key| self.key_partition[*key] == partition)
            .collect();
        for key in keys {
            let name = self.key_names[key].clone();
            let mine = read(&mut self.nodes[node], partition, now, &name);
            let mut others = PnCounter::new();
            for other in 0..self.nodes.len() {
                let state = &self.nodes[other];
                if other == node || state.region != region || state.removed {
                    continue;
                }
                if state.parts.contains_key(&partition) {
                    let theirs = read(&mut self.nodes[other], partition, now, &name);
                    tally_node::crdt::Crdt::merge(&mut others, &theirs);
                }
            }
            if !mine.is_covered_by(&others) {
                self.checker.violate(
                    self.now,
                    "partition deleted from its last up-to-date holder",
                    format!(
                        "n{node} deleted partition {partition} holding key {name} at {}; \
                         the other holders of region {region} have {}",
                        mine.exact_value(),
                        others.exact_value()
                    ),
                );
                return;
            }
        }
    }
}

fn read(node: &mut PartNode, partition: Partition, now: u64, key: &str) -> PnCounter {
    let part = node.parts.get_mut(&partition).expect("kept");
    part.replica
        .handle_get(now, &part.store, key)
        .unwrap_or_default()
}

/// The slot of a node name (`n7` is slot 7).
pub(super) fn slot_of(name: &str) -> usize {
    name.strip_prefix('n')
        .and_then(|index| index.parse().ok())
        .expect("simulated node names are n<slot>")
}
