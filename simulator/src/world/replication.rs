//! The node's runtime around the core, as `node/src/engine` and
//! `node/src/gossip/anti_entropy.rs` do it: the group committer (write, fsync
//! delay, flush, `handle_commit_done`, then acknowledge the adds it made
//! durable), housekeeping, and the anti-entropy loop (every interval
//! `poll_pulls`, a `Pull` per plan, answers served chunk by chunk with
//! `handle_pull` up to a byte budget, merged with `handle_pull_chunk`, ended
//! with `handle_pull_finished` or, on refusal or timeout, `handle_pull_failed`).
//!
//! Invariants: one commit in flight per node, and a crash between its write
//! and its flush loses it (the `MemoryStore` keeps only flushed writes); an
//! answer stream is delivered to the core in order and without duplicates, as
//! gRPC over TCP does (loss stalls the stream until the pull times out); every
//! merged change and every commit is shown to the checker.

use tally_node::replica::PullRequest;
use tally_node::store::Store;

use super::node::{PullState, CLUSTER};
use super::{Event, NetMsg, World, FSYNC_BASE_MAX_MS, FSYNC_TAIL_MAX_MS};
use crate::rng::{between, chance, pareto};

/// Housekeeping period, as the node's committer (100 ms).
pub const HOUSEKEEPING_MS: u64 = 100;

fn chunk_bytes(chunk: &tally_node::replica::PullChunk) -> usize {
    32 + chunk
        .counters
        .iter()
        .map(|(key, state)| key.len() + 8 + 26 * state.slots().len())
        .sum::<usize>()
        + chunk
            .deltas
            .iter()
            .map(|delta| delta.estimated_bytes())
            .sum::<usize>()
        + chunk.records.len() * tally_node::replica::RECORD_BYTES
}

impl World<'_> {
    fn fsync_delay(&mut self) -> u64 {
        let mut delay = between(&mut self.disk_rng, 1, FSYNC_BASE_MAX_MS);
        if self.options.faults.tail && chance(&mut self.disk_rng, 0.01) {
            delay += pareto(&mut self.disk_rng, 5.0, 1.2, FSYNC_TAIL_MAX_MS as f64) as u64;
        }
        delay
    }

    /// Starts a group commit if none is in flight and something changed.
    pub(super) fn wake_commit(&mut self, node: usize) {
        if self.nodes[node].committing.is_some() {
            return;
        }
        let Some(batch) = self.nodes[node].replica.poll_commit() else {
            return;
        };
        let state = &mut self.nodes[node];
        state
            .store
            .write(&batch)
            .expect("the memory store always writes");
        let seq = batch.seq;
        let epoch = state.epoch;
        state.committing = Some(batch);
        let delay = self.fsync_delay();
        self.schedule(delay, Event::FsyncDone(node as u16, epoch, seq));
    }

    pub(super) fn fsync_done(&mut self, node: usize, seq: u64) {
        let state = &mut self.nodes[node];
        let Some(batch) = state.committing.take_if(|batch| batch.seq == seq) else {
            return;
        };
        state
            .store
            .flush()
            .expect("the memory store always flushes");
        for (key, counter) in &batch.counters {
            if let Some(&index) = self.key_index.get(&**key) {
                self.checker.committed(self.now, node, index, counter);
            }
        }
        drop(batch);
        let state = &mut self.nodes[node];
        state.replica.handle_commit_done(seq);
        self.commits += 1;
        let durable = state.replica.durable_seq();
        let replica = state.id();
        self.trace
            .mix_all(&[node as u64, seq, state.replica.digest().0]);
        let later = state.async_pending.split_off(&(durable + 1));
        let made_durable = std::mem::replace(&mut state.async_pending, later);
        self.release_waiters(node);
        self.sets_durable(node, durable);
        for add in made_durable.into_values().flatten() {
            self.ledger.async_durable(add, replica);
        }
        self.copies_durable(node);
        self.wake_commit(node);
        self.pump_push(node);
    }

    /// Answers the waiting adds whose ticket is reached: the durable
    /// sequence, or in replicated mode the replicated one (durable here and
    /// on the copies).
    pub(super) fn release_waiters(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        let reached = if state.replicated {
            state.replica.replicated_seq()
        } else {
            state.replica.durable_seq()
        };
        let replica = state.id();
        let later = state.waiting.split_off(&(reached + 1));
        let ready = std::mem::replace(&mut state.waiting, later);
        for (ticket, waiters) in ready {
            for (client, add, _) in waiters {
                self.reply(client, add, replica, ticket, false);
            }
        }
    }

    pub(super) fn housekeeping(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        let now = state.local_now(self.now);
        state.replica.tick(now);
        let epoch = state.epoch;
        self.schedule(HOUSEKEEPING_MS, Event::Housekeeping(node as u16, epoch));
        self.wake_commit(node);
        self.pump_push(node);
    }

    pub(super) fn sync_round(&mut self, node: usize) {
        let epoch = self.nodes[node].epoch;
        self.schedule(
            self.options.sync_interval_ms,
            Event::SyncRound(node as u16, epoch),
        );
        let state = &mut self.nodes[node];
        let now = state.local_now(self.now);
        let own = state.id();
        let plans = state
            .replica
            .peers_mut()
            .poll_pulls(now, &state.region_name);
        self.trace.mix(plans.len() as u64);
        let timeout = self.options.pull_timeout_ms();
        for plan in plans {
            let pull = self.next_pull;
            self.next_pull += 1;
            self.pulls += 1;
            let Ok(peer_node) = plan.grpc_addr.parse::<usize>() else {
                let interval = self.options.sync_interval_ms;
                self.nodes[node]
                    .replica
                    .peers_mut()
                    .handle_pull_failed(now, plan.peer, interval);
                continue;
            };
            self.nodes[node].pulls.insert(
                pull,
                PullState {
                    peer: plan.peer,
                    serve: None,
                    next_index: 0,
                    buffer: Default::default(),
                },
            );
            let request = PullRequest {
                cluster_id: CLUSTER.into(),
                caller: own,
                expected: Some(plan.peer),
                after: plan.after,
                max_bytes: self.options.pull_budget_bytes,
                directory_digest: plan.directory_digest,
                protocol: self.nodes[node].replica.peers().own_protocol(),
                deltas_after: Some(plan.deltas_after),
                records_from: plan.records_from,
                scope: None,
            };
            self.send(node, peer_node, NetMsg::Pull { pull, request });
            self.schedule(timeout, Event::PullTimeout(node as u16, epoch, pull));
        }
    }

    pub(super) fn send(&mut self, from: usize, to: usize, msg: NetMsg) {
        let deliveries = self.net.send(from, to);
        if let Some(second) = deliveries.second {
            self.schedule(
                second,
                Event::Deliver {
                    to: to as u16,
                    from: from as u16,
                    msg: Box::new(msg.clone()),
                },
            );
        }
        if let Some(first) = deliveries.first {
            self.schedule(
                first,
                Event::Deliver {
                    to: to as u16,
                    from: from as u16,
                    msg: Box::new(msg),
                },
            );
        }
    }

    pub(super) fn deliver(&mut self, to: usize, from: usize, msg: NetMsg) {
        match msg {
            NetMsg::Pull { pull, request } => self.serve(to, from, pull, request),
            NetMsg::Chunk {
                pull,
                serve,
                index,
                last,
                chunk,
            } => self.chunk_arrives(to, pull, serve, index, last, chunk),
            NetMsg::Refused { pull } => {
                self.trace.mix(pull);
                self.end_pull(to, pull, false);
            }
            NetMsg::Copy { push, data } => self.copy_arrives(to, from, push, &data),
            NetMsg::CopyAnswer { push, ok } => self.copy_answered(to, push, ok),
        }
    }

    /// Answers a pull as `node/src/api/replication.rs` does: chunks of at most
    /// `chunk_bytes` until the state is complete or the budget is spent.
    fn serve(&mut self, node: usize, caller: usize, pull: u64, mut request: PullRequest) {
        let serve = self.next_serve;
        self.next_serve += 1;
        let mut remaining = request.max_bytes;
        let mut out: Vec<NetMsg> = Vec::new();
        let state = &self.nodes[node];
        loop {
            request.max_bytes = remaining.min(self.options.chunk_bytes);
            match state.replica.handle_pull(&state.store, &request) {
                Ok(chunk) => {
                    remaining = remaining.saturating_sub(chunk_bytes(&chunk).max(1));
                    let last = chunk.is_last() || remaining == 0;
                    request.after = chunk.next.clone();
                    request.deltas_after = chunk.deltas_next.clone();
                    request.records_from = chunk.records_next;
                    out.push(NetMsg::Chunk {
                        pull,
                        serve,
                        index: out.len() as u32,
                        last,
                        chunk,
                    });
                    if last {
                        break;
                    }
                }
                Err(_) => {
                    // A refusal of the first chunk is the call's status; a
                    // later one ends the stream early.
                    match out.last_mut() {
                        Some(NetMsg::Chunk { last, .. }) => *last = true,
                        _ => out.push(NetMsg::Refused { pull }),
                    }
                    break;
                }
            }
        }
        self.trace.mix_all(&[node as u64, pull, out.len() as u64]);
        for msg in out {
            self.send(node, caller, msg);
        }
    }

    fn chunk_arrives(
        &mut self,
        node: usize,
        pull: u64,
        serve: u64,
        index: u32,
        last: bool,
        chunk: tally_node::replica::PullChunk,
    ) {
        let state = &mut self.nodes[node];
        let Some(pending) = state.pulls.get_mut(&pull) else {
            return;
        };
        if *pending.serve.get_or_insert(serve) != serve
            || index < pending.next_index
            || pending.buffer.contains_key(&index)
        {
            return;
        }
        pending.buffer.insert(index, (chunk, last));
        self.trace.mix_all(&[node as u64, pull, index as u64]);
        loop {
            let state = &mut self.nodes[node];
            let Some(pending) = state.pulls.get_mut(&pull) else {
                return;
            };
            let next = pending.next_index;
            let Some((chunk, last)) = pending.buffer.remove(&next) else {
                return;
            };
            pending.next_index += 1;
            let peer = pending.peer;
            let now = state.local_now(self.now);
            match state
                .replica
                .handle_pull_chunk(now, &state.store, peer, chunk)
            {
                Ok(report) => {
                    self.trace
                        .mix_all(&[report.received as u64, report.changed.len() as u64]);
                    let changed = !report.changed.is_empty();
                    for (key, counter) in &report.changed {
                        if let Some(&index) = self.key_index.get(&**key) {
                            self.checker.observe(self.now, node, index, counter);
                        }
                    }
                    if changed {
                        self.wake_commit(node);
                    }
                    if last {
                        self.end_pull(node, pull, true);
                        return;
                    }
                }
                Err(_) => {
                    self.trace.mix(u64::MAX - 1);
                    self.end_pull(node, pull, false);
                    return;
                }
            }
        }
    }

    fn end_pull(&mut self, node: usize, pull: u64, ok: bool) {
        let state = &mut self.nodes[node];
        let Some(pending) = state.pulls.remove(&pull) else {
            return;
        };
        let now = state.local_now(self.now);
        let peers = state.replica.peers_mut();
        if ok {
            peers.handle_pull_finished(now, pending.peer);
        } else {
            peers.handle_pull_failed(now, pending.peer, self.options.sync_interval_ms);
        }
    }

    pub(super) fn pull_timeout(&mut self, node: usize, pull: u64) {
        self.trace.mix(pull);
        self.end_pull(node, pull, false);
    }
}
