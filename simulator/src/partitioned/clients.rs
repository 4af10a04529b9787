//! The callers of a partitioned world and the routing of their adds: a
//! client sends each attempt to a node of its region (any node accepts any
//! request), which forwards it in one hop to the key's first live owner per
//! its own view (the next live owner while the first is down); the owner
//! takes the add into its own slot of the partition's replica and answers
//! once that commit is durable. A node that does not serve the key refuses,
//! and the client retries.
//!
//! Invariant: an attempt is applied only by a node whose replica serves the
//! key's partition (the replica refuses it otherwise: `NotServed`), and
//! answered only after the commit that holds it completed. A refusal that
//! means "not applied" is answered as one, and the exact check counts it
//! so. A keyed add keeps its idempotency key on every retry; the records
//! travel with the region's pulls, so a retry that reaches another owner
//! is recognised once that owner has pulled the record (before that, the
//! checker reports such an add as applied twice, and
//! `docs/src/simulator.md` documents the window).
//!
//! The ledger's lanes (see `crate::ledger`) stay held until no attempt of
//! an add can be applied any more: attempts may reach different owners, so
//! an answer reaches the ledger only a client timeout after the latest
//! attempt was sent (every attempt is applied or lost well before that); a
//! lane reused earlier could give one slot two unknown adds of one lane.

use tally_node::crdt::ReplicaId;
use tally_node::replica::{AddRefused, AddRequest};

use super::world::{Ev, Msg, PWorld};
use crate::ledger::Outcome;
use crate::rng::{between, chance, exponential};

/// Latency between a client and a node of its region, and of a forward (ms).
pub const LOCAL_MS: u64 = 1;

impl PWorld<'_> {
    pub(super) fn client_wake(&mut self, client: u32) {
        if self.clients_stopped || self.clients[client as usize].1.is_some() {
            return;
        }
        let mut issued = None;
        for _ in 0..4 {
            let key = self.zipf.sample(&mut self.workload_rng);
            let negative = chance(&mut self.workload_rng, 0.3);
            let keyed = chance(&mut self.workload_rng, 0.8);
            if let Some(id) = self.ledger.issue(client, 0, key, negative, keyed) {
                issued = Some(id);
                break;
            }
        }
        let Some(add) = issued else {
            self.schedule(self.options.think_ms.max(10), Ev::ClientWake(client));
            return;
        };
        self.clients[client as usize].1 = Some(add);
        self.send_attempt(client, add);
    }

    /// Sends the next attempt of `add` to a node of the client's region
    /// that has joined and not left (as a load balancer would).
    fn send_attempt(&mut self, client: u32, add: u32) {
        let region = self.clients[client as usize].0;
        let candidates: Vec<usize> = self
            .nodes
            .iter()
            .filter(|node| {
                node.exists && !node.removed && self.options.region_of(node.index) == region
            })
            .filter(|node| node.state() != tally_node::partition::NodeState::Left)
            .map(|node| node.index)
            .collect();
        if self.attempts.len() <= add as usize {
            self.attempts.resize(add as usize + 1, (0, false));
        }
        self.attempts[add as usize].0 = self.now;
        let entry = &mut self.ledger.adds[add as usize];
        entry.attempts += 1;
        let attempt = entry.attempts;
        self.ledger.stats.attempts += 1;
        if !candidates.is_empty() {
            let pick = between(&mut self.workload_rng, 0, candidates.len() as u64 - 1);
            let node = candidates[pick as usize] as u16;
            self.schedule(LOCAL_MS, Ev::AddAtEntry(node, client, add, attempt));
        }
        self.schedule(
            self.options.client_timeout_ms,
            Ev::ClientTimeout(client, add, attempt),
        );
    }

    pub(super) fn client_timeout(&mut self, client: u32, add: u32, attempt: u8) {
        if self.is_open(add, attempt) {
            self.retry_or_give_up(client, add);
        }
    }

    fn retry_or_give_up(&mut self, client: u32, add: u32) {
        let entry = &self.ledger.adds[add as usize];
        let retry = entry.keyed
            && u32::from(entry.attempts) <= self.options.max_retries
            && !self.clients_stopped;
        if retry {
            let backoff = between(&mut self.workload_rng, 10, 100);
            self.schedule(backoff, Ev::ClientRetry(client, add));
        } else {
            self.ledger.abandon(add);
            self.client_done(client, add);
        }
    }

    /// Whether `attempt` is the latest of an add whose caller still waits.
    fn is_open(&self, add: u32, attempt: u8) -> bool {
        let entry = &self.ledger.adds[add as usize];
        entry.outcome == Outcome::Pending
            && entry.attempts == attempt
            && !self.attempts[add as usize].1
    }

    pub(super) fn client_retry(&mut self, client: u32, add: u32) {
        if self.ledger.adds[add as usize].outcome != Outcome::Pending {
            return;
        }
        if self.clients_stopped {
            self.ledger.abandon(add);
            self.client_done(client, add);
            return;
        }
        self.ledger.stats.retries += 1;
        self.send_attempt(client, add);
    }

    fn client_done(&mut self, client: u32, add: u32) {
        let state = &mut self.clients[client as usize];
        if state.1 == Some(add) {
            state.1 = None;
            let delay = exponential(&mut self.workload_rng, self.options.think_ms as f64);
            self.schedule(delay, Ev::ClientWake(client));
        }
    }

    /// An attempt reaches the node the client chose: it routes it by its view.
    pub(super) fn add_at_entry(&mut self, node: usize, client: u32, add: u32, attempt: u8) {
        let partition = self.key_partition[self.ledger.adds[add as usize].key as usize];
        let region = self.nodes[node].region.clone();
        let target = self.nodes[node].view.as_ref().and_then(|view| {
            view.route(&region, partition)
                .first()
                .and_then(|name| name.strip_prefix('n'))
                .and_then(|index| index.parse::<usize>().ok())
        });
        match target {
            Some(target) if target == node => {
                self.stats.direct += 1;
                self.add_at_owner(node, client, add, attempt);
            }
            Some(target) => {
                self.stats.forwarded += 1;
                self.send(
                    node,
                    target,
                    Msg::Forward {
                        client,
                        add,
                        attempt,
                    },
                );
            }
            None => self.refuse(client, add, attempt),
        }
    }

    fn refuse(&mut self, client: u32, add: u32, attempt: u8) {
        self.stats.refused += 1;
        self.schedule(
            LOCAL_MS,
            Ev::AddReply {
                client,
                add,
                attempt,
                answer: None,
            },
        );
    }

    /// The add reaches the node chosen as its owner.
    pub(super) fn add_at_owner(&mut self, node: usize, client: u32, add: u32, attempt: u8) {
        let entry = &self.ledger.adds[add as usize];
        let key = entry.key as usize;
        let delta = entry.delta();
        let idempotency_key = entry.keyed.then(|| format!("c{client}-a{add}"));
        let now = self.clock(node);
        let replicated = self.replicated();
        let state = &mut self.nodes[node];
        let scoped = state.scoped_mut();
        let request = AddRequest {
            key: &self.key_names[key],
            delta,
            idempotency_key: idempotency_key.as_deref(),
        };
        let result = match replicated {
            true => scoped
                .core
                .handle_add_replicated(now, &scoped.store, request),
            false => scoped.core.handle_add(now, &scoped.store, request),
        };
        self.trace
            .mix_all(&[node as u64, add as u64, attempt as u64]);
        let accepted = match result {
            Ok(accepted) => accepted,
            Err(
                AddRefused::NotServed { .. }
                | AddRefused::WriteGated(_)
                | AddRefused::HeldAfterRestart { .. },
            ) => {
                // Not applied: the caller retries elsewhere.
                self.refuse(client, add, attempt);
                return;
            }
            Err(refused) => {
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
        let replica = scoped.id();
        let durable = scoped.core.durable_seq();
        let live = scoped.core.cached_state(&self.key_names[key]).cloned();
        let writer = state.writer;
        if let Some(live) = live {
            self.checker.observe(self.now, writer, key, &live);
        }
        // A duplicate was applied where its idempotency record was made
        // (here, or by a replica this one learned the record from).
        if accepted.duplicate {
            self.ledger.stats.duplicates += 1;
        } else {
            let applied = (accepted.durable_at_seq, false);
            self.applied_tickets.insert((add, replica), applied);
            self.ledger.delivered(add, replica);
        }
        let ticket = accepted.durable_at_seq;
        let answered = match replicated {
            true => {
                let core = &self.nodes[node].scoped().core;
                core.replicated_for(&self.key_names[key], ticket)
            }
            false => ticket <= durable,
        };
        if answered {
            self.reply(client, add, attempt, replica, ticket);
        } else {
            let state = &mut self.nodes[node];
            state.wait_for(ticket, (client, add, attempt));
            if replicated {
                let epoch = state.epoch;
                let wait = self.copy_wait_ms();
                let expired = Ev::CopyWaitExpired(node as u16, epoch, ticket, client, add, attempt);
                self.schedule(wait, expired);
            }
        }
        self.wake_commit(node);
    }

    /// The owner answered `UNAVAILABLE`: the caller does not know whether
    /// the add landed, and treats it as a timeout (a keyed add retries
    /// with the same idempotency key).
    pub(super) fn add_unavailable(&mut self, client: u32, add: u32, attempt: u8) {
        self.trace
            .mix_all(&[client as u64, add as u64, attempt as u64]);
        if !self.is_open(add, attempt) {
            return;
        }
        self.ledger.adds[add as usize].unavailable_at = attempt;
        self.ledger.stats.unavailable += 1;
        self.retry_or_give_up(client, add);
    }

    pub(super) fn reply(
        &mut self,
        client: u32,
        add: u32,
        attempt: u8,
        replica: ReplicaId,
        ticket: u64,
    ) {
        self.schedule(
            2 * LOCAL_MS,
            Ev::AddReply {
                client,
                add,
                attempt,
                answer: Some((replica, ticket)),
            },
        );
    }

    pub(super) fn add_reply(
        &mut self,
        client: u32,
        add: u32,
        attempt: u8,
        answer: Option<(ReplicaId, u64)>,
    ) {
        self.trace.mix_all(&[client as u64, add as u64]);
        match answer {
            Some((replica, ticket)) => {
                let (sent, answered) = &mut self.attempts[add as usize];
                if self.ledger.adds[add as usize].outcome != Outcome::Pending || *answered {
                    return;
                }
                *answered = true;
                let quiet = (*sent + self.options.client_timeout_ms).saturating_sub(self.now);
                self.schedule(quiet, Ev::Answered(add, replica, ticket));
                self.client_done(client, add);
            }
            None => {
                if self.is_open(add, attempt) {
                    self.retry_or_give_up(client, add);
                }
            }
        }
    }

    /// The ledger learns the answer `replica` gave with `ticket`, once no
    /// attempt of the add can still be applied anywhere. An answer speaks
    /// for a replica whose application of the add is durable: the one that
    /// answered, or, for a retry it answered as a duplicate from an
    /// idempotency record it learned (with the slot, from the durable state
    /// of a replica that applied the add; its own application may have
    /// been lost in a crash), the first other replica whose application a
    /// crash did not take back. With none, the add's fate stays unknown.
    pub(super) fn answered(&mut self, add: u32, replica: ReplicaId, ticket: u64) {
        let durable = |applier: &ReplicaId| {
            self.applied_tickets
                .get(&(add, *applier))
                .filter(|(_, lost)| !lost)
                .map(|(ticket, _)| *ticket)
        };
        if durable(&replica).is_some() {
            self.ledger.answered(add, replica, ticket, false);
            return;
        }
        let delivered = &self.ledger.adds[add as usize].delivered;
        match delivered.iter().find_map(|r| durable(r).map(|t| (*r, t))) {
            Some((applier, ticket)) => {
                self.ledger.answered(add, applier, ticket, false);
            }
            None => self.ledger.abandon(add),
        }
    }
}
