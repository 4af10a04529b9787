//! The callers: ordinary clients in every region that add to Zipf-chosen keys
//! (increments and decrements), and burst clients that hammer the hot post
//! during the burst window. Each caller has one add in flight, retries a keyed
//! add on timeout with the same idempotency key (always to the same node), and
//! gives up after a few tries without learning whether the add landed.
//!
//! Invariant: a sync-mode answer is sent only once the node's durable
//! sequence reaches the add's `durable_at_seq` (see `replication.rs`), a
//! replicated-mode one only once its replicated sequence does (`copies.rs`;
//! past its deadline the add is answered `UNAVAILABLE`, which the caller
//! treats as a timeout); an async-mode answer is sent at once and the add
//! counts as durable only when its commit completes before any crash.

use tally_node::crdt::ReplicaId;
use tally_node::replica::AddRequest;

use super::{Event, World};
use crate::rng::{between, chance, exponential};

/// Local latency between a client and the node of its region (ms).
pub const LOCAL_MS: u64 = 1;

impl World<'_> {
    fn think(&mut self, client: u32) -> u64 {
        if self.clients[client as usize].burst {
            between(&mut self.workload_rng, 0, 2)
        } else {
            exponential(&mut self.workload_rng, self.options.think_ms as f64)
        }
    }

    pub(super) fn client_wake(&mut self, client: u32) {
        if self.clients_stopped || self.clients[client as usize].current.is_some() {
            return;
        }
        let (burst_start, burst_end) = self.burst;
        let node = self.clients[client as usize].node;
        let is_burst = self.clients[client as usize].burst;
        if is_burst {
            if self.now < burst_start {
                self.schedule(burst_start - self.now, Event::ClientWake(client));
                return;
            }
            if self.now >= burst_end {
                return;
            }
        }
        let mut issued = None;
        for _ in 0..4 {
            let (key, negative) = if is_burst {
                (0, chance(&mut self.workload_rng, 0.05))
            } else {
                (
                    self.zipf.sample(&mut self.workload_rng),
                    chance(&mut self.workload_rng, 0.3),
                )
            };
            let keyed = chance(&mut self.workload_rng, 0.8);
            if let Some(id) = self.ledger.issue(client, node, key, negative, keyed) {
                issued = Some(id);
                break;
            }
        }
        let Some(add) = issued else {
            let delay = self.think(client).max(10);
            self.schedule(delay, Event::ClientWake(client));
            return;
        };
        self.clients[client as usize].current = Some(add);
        self.send_attempt(client, add);
    }

    fn send_attempt(&mut self, client: u32, add: u32) {
        let entry = &mut self.ledger.adds[add as usize];
        entry.attempts += 1;
        let attempt = entry.attempts;
        let node = entry.node;
        self.ledger.stats.attempts += 1;
        self.schedule(LOCAL_MS, Event::AddArrives(node, client, add, attempt));
        self.schedule(
            self.options.client_timeout_ms,
            Event::ClientTimeout(client, add, attempt),
        );
    }

    pub(super) fn client_timeout(&mut self, client: u32, add: u32, attempt: u8) {
        let entry = &self.ledger.adds[add as usize];
        if entry.outcome != crate::ledger::Outcome::Pending
            || entry.attempts != attempt
            || entry.unavailable_at == attempt
        {
            return;
        }
        self.attempt_failed(client, add);
    }

    /// An attempt ended without an answer that says whether it landed.
    fn attempt_failed(&mut self, client: u32, add: u32) {
        let entry = &self.ledger.adds[add as usize];
        let retry = entry.keyed
            && u32::from(entry.attempts) <= self.options.max_retries
            && !self.clients_stopped;
        if retry {
            let backoff = between(&mut self.workload_rng, 10, 100);
            self.schedule(backoff, Event::ClientRetry(client, add));
        } else {
            self.give_up(client, add);
        }
    }

    pub(super) fn client_retry(&mut self, client: u32, add: u32) {
        if self.ledger.adds[add as usize].outcome != crate::ledger::Outcome::Pending {
            return;
        }
        if self.clients_stopped {
            self.give_up(client, add);
            return;
        }
        self.ledger.stats.retries += 1;
        self.send_attempt(client, add);
    }

    fn give_up(&mut self, client: u32, add: u32) {
        self.ledger.abandon(add);
        self.client_done(client, add);
    }

    fn client_done(&mut self, client: u32, add: u32) {
        let state = &mut self.clients[client as usize];
        if state.current == Some(add) {
            state.current = None;
            let delay = self.think(client);
            self.schedule(delay, Event::ClientWake(client));
        }
    }

    pub(super) fn add_arrives(&mut self, node: usize, client: u32, add: u32, attempt: u8) {
        let entry = &self.ledger.adds[add as usize];
        let key = entry.key as usize;
        let delta = entry.delta();
        let idempotency_key = entry.keyed.then(|| format!("c{client}-a{add}"));
        let state = &mut self.nodes[node];
        let now = state.local_now(self.now);
        let request = AddRequest {
            key: &self.key_names[key],
            delta,
            idempotency_key: idempotency_key.as_deref(),
        };
        let result = if state.replicated {
            state
                .replica
                .handle_add_replicated(now, &state.store, request)
        } else {
            state.replica.handle_add(now, &state.store, request)
        };
        self.trace
            .mix_all(&[node as u64, add as u64, attempt as u64]);
        let accepted = match result {
            Ok(accepted) => accepted,
            Err(refused) => {
                self.trace.mix(u64::MAX);
                self.checker.violate(
                    self.now,
                    "add refused",
                    format!("n{node} refused add {add} ({delta:+} on key {key}): {refused}"),
                );
                self.ledger.refused(add);
                self.client_done(client, add);
                return;
            }
        };
        self.trace.mix_all(&[
            accepted.value as u64,
            accepted.durable_at_seq,
            accepted.duplicate as u64,
        ]);
        let replica = state.id();
        let durable = if state.replicated {
            state.replica.replicated_seq()
        } else {
            state.replica.durable_seq()
        };
        let is_async = state.is_async;
        let replicated = state.replicated;
        let epoch = state.epoch;
        if let Some(live) = state.replica.cached_state(&self.key_names[key]) {
            let live = live.clone();
            self.checker.observe(self.now, node, key, &live);
        }
        self.ledger.delivered(add, replica);
        if accepted.duplicate {
            self.ledger.stats.duplicates += 1;
        }
        let ticket = accepted.durable_at_seq;
        if ticket <= durable {
            self.reply(client, add, replica, ticket, false);
        } else if is_async {
            self.nodes[node]
                .async_pending
                .entry(ticket)
                .or_default()
                .push(add);
            self.reply(client, add, replica, ticket, true);
        } else {
            self.nodes[node]
                .waiting
                .entry(ticket)
                .or_default()
                .push((client, add, attempt));
            if replicated {
                let wait = self.copy_wait_ms();
                self.schedule(
                    wait,
                    Event::CopyWaitExpired(node as u16, epoch, ticket, client, add, attempt),
                );
            }
        }
        self.wake_commit(node);
    }

    /// The node answered `UNAVAILABLE` (too few copies confirmed in time):
    /// the caller does not know whether the add landed and treats it as a
    /// timeout, retrying a keyed add with the same idempotency key.
    pub(super) fn add_unavailable(&mut self, client: u32, add: u32, attempt: u8) {
        self.trace
            .mix_all(&[client as u64, add as u64, attempt as u64]);
        let entry = &mut self.ledger.adds[add as usize];
        if entry.outcome != crate::ledger::Outcome::Pending || entry.attempts != attempt {
            return;
        }
        entry.unavailable_at = attempt;
        self.ledger.stats.unavailable += 1;
        self.attempt_failed(client, add);
    }

    pub(super) fn reply(
        &mut self,
        client: u32,
        add: u32,
        replica: ReplicaId,
        ticket: u64,
        is_async: bool,
    ) {
        self.schedule(
            LOCAL_MS,
            Event::AddReply {
                client,
                add,
                replica,
                ticket,
                is_async,
            },
        );
    }

    pub(super) fn add_reply(
        &mut self,
        client: u32,
        add: u32,
        replica: ReplicaId,
        ticket: u64,
        is_async: bool,
    ) {
        self.trace.mix_all(&[client as u64, add as u64]);
        if self.ledger.answered(add, replica, ticket, is_async) {
            self.client_done(client, add);
        }
    }
}
