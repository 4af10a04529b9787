//! Replicated durability in the simulated runtime, as `node/src/gossip/copier.rs`
//! and `node/src/engine/replicated.rs` do it around the same core calls: after
//! a commit leaves counters pending, one push at a time
//! ([`Replica::poll_push`](tally_node::replica::Replica::poll_push)) goes over
//! the simulated network to `write_copies - 1` live nodes of the region chosen
//! by the core (`choose_copies`, rotating); each copy merges it
//! (`handle_copy_push`), group-commits it and answers only once that commit is
//! durable; the push is confirmed when enough copies answered, and failed (then
//! retried on other copies after a doubling pause) when they refused or did not
//! answer within [`PUSH_TIMEOUT_MS`]. A replicated add is answered once the
//! core's `replicated_seq` reaches its ticket, or with `UNAVAILABLE` (outcome
//! unknown to the caller, who retries with the same idempotency key) when its
//! wait runs past its deadline.
//!
//! Invariants kept and checked here: a push is confirmed only by
//! `write_copies - 1` distinct copies that each answered `OK`; a copy answers
//! `OK` only when what the push brought is durable there (the checker's
//! monitor "copy answered before durable" compares the copy's last completed
//! commit with the pushed slots at the moment it answers).

use std::sync::Arc;

use tally_node::crdt::{FoldedBase, Slot};
use tally_node::replica::{CopyPush, Key};

use super::{Event, NetMsg, World};

/// The node's pusher's timings, shared with the core's sans-IO pusher.
pub use tally_core::runtime::pusher::{retry_pause_ms, PUSH_TIMEOUT_MS};

/// How long a replicated add waits for its copies: the caller's timeout
/// less a tenth, at least 100 ms (as the node derives it from the gRPC
/// deadline).
pub fn copy_wait_ms(client_timeout_ms: u64) -> u64 {
    (client_timeout_ms * 9 / 10).max(100)
}

/// The slots a push carried (each with its counter's folded base when the
/// slot is of a phase after a fold), kept by the copy until it answers.
pub type PushedSlots = Arc<Vec<(Key, Slot, FoldedBase)>>;

/// Counters of replicated durability over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CopyStats {
    /// Pushes sent (each to one or more copies).
    pub pushes: u64,
    /// Pushes confirmed by enough copies.
    pub confirmed: u64,
    /// Pushes that failed (refused, timed out, or too few copies alive).
    pub failed: u64,
    /// Pushes taken by a copy and answered `OK`.
    pub taken: u64,
    /// Replicated adds answered `UNAVAILABLE` after waiting for their copies.
    pub unconfirmed_adds: u64,
}

impl World<'_> {
    /// How long a replicated add waits for its copies: the caller's timeout
    /// less a tenth, at least 100 ms (as the node derives it from the gRPC
    /// deadline).
    pub(super) fn copy_wait_ms(&self) -> u64 {
        copy_wait_ms(self.options.client_timeout_ms)
    }

    /// Sends the next push if none is in flight, no retry pause is running,
    /// and the core has counters waiting for their copies.
    pub(super) fn pump_push(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if !state.replicated || state.push.is_some() || state.push_retry_scheduled {
            return;
        }
        let Some(push) = state.replica.poll_push() else {
            return;
        };
        let needed = self.options.write_copies.saturating_sub(1);
        let turn = state.push_turn;
        state.push_turn = state.push_turn.wrapping_add(1);
        let targets: Vec<usize> = state
            .replica
            .peers()
            .choose_copies(&state.region_name, needed, turn)
            .into_iter()
            .filter_map(|member| member.grpc_addr.parse().ok())
            .collect();
        let id = self.next_push;
        self.next_push += 1;
        self.copy_stats.pushes += 1;
        let upto_seq = push.upto_seq;
        self.trace
            .mix_all(&[node as u64, id, upto_seq, targets.len() as u64]);
        let state = &mut self.nodes[node];
        state.push = Some(super::node::PushState {
            id,
            upto_seq,
            targets: targets.len(),
            confirmed: 0,
            answered: 0,
        });
        if targets.is_empty() {
            self.push_failed(node);
            return;
        }
        let epoch = state.epoch;
        let data = Arc::new(push);
        for target in targets {
            self.send(
                node,
                target,
                NetMsg::Copy {
                    push: id,
                    data: data.clone(),
                },
            );
        }
        self.schedule(PUSH_TIMEOUT_MS, Event::PushTimeout(node as u16, epoch, id));
    }

    fn push_failed(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        let Some(push) = state.push.take() else {
            return;
        };
        state.replica.handle_push_failed(push.upto_seq);
        state.push_failures = state.push_failures.saturating_add(1);
        state.push_retry_scheduled = true;
        let pause = retry_pause_ms(state.push_failures);
        let epoch = state.epoch;
        self.copy_stats.failed += 1;
        self.trace.mix_all(&[node as u64, push.id, u64::MAX - 2]);
        self.schedule(pause, Event::PushRetry(node as u16, epoch));
    }

    /// The pause after a failed push is over.
    pub(super) fn push_retry(&mut self, node: usize) {
        self.nodes[node].push_retry_scheduled = false;
        self.pump_push(node);
    }

    /// The push in flight timed out (a copy did not answer).
    pub(super) fn push_timeout(&mut self, node: usize, id: u64) {
        if self.nodes[node].push.as_ref().is_some_and(|p| p.id == id) {
            self.push_failed(node);
        }
    }

    /// A copy answered push `id`.
    pub(super) fn copy_answered(&mut self, node: usize, id: u64, ok: bool) {
        let needed = self.options.write_copies.saturating_sub(1);
        let state = &mut self.nodes[node];
        let Some(push) = state.push.as_mut().filter(|p| p.id == id) else {
            return;
        };
        push.answered += 1;
        if ok {
            push.confirmed += 1;
        }
        self.trace.mix_all(&[node as u64, id, ok as u64]);
        if push.confirmed >= needed {
            let upto_seq = push.upto_seq;
            state.push = None;
            state.push_failures = 0;
            state.replica.handle_push_done(upto_seq);
            self.copy_stats.confirmed += 1;
            self.release_waiters(node);
            self.pump_push(node);
        } else if push.answered >= push.targets {
            self.push_failed(node);
        }
    }

    /// A push arrives at a copy: merge it, commit it, answer once durable.
    pub(super) fn copy_arrives(&mut self, node: usize, from: usize, id: u64, push: &CopyPush) {
        let state = &mut self.nodes[node];
        let now = state.local_now(self.now);
        let result = state.replica.handle_copy_push(now, &state.store, push);
        let accepted = match result {
            Ok(accepted) => accepted,
            Err(_) => {
                self.trace.mix(u64::MAX - 3);
                self.send(
                    node,
                    from,
                    NetMsg::CopyAnswer {
                        push: id,
                        ok: false,
                    },
                );
                return;
            }
        };
        self.trace.mix_all(&[
            node as u64,
            id,
            accepted.durable_at_seq,
            accepted.changed.len() as u64,
        ]);
        for (key, counter) in &accepted.changed {
            if let Some(&index) = self.key_index.get(&**key) {
                self.checker.observe(self.now, node, index, counter);
            }
        }
        let slots: PushedSlots = Arc::new(push.counters.clone());
        let state = &mut self.nodes[node];
        if accepted.durable_at_seq <= state.replica.durable_seq() {
            self.answer_copy(node, from, id, push.source, &slots);
        } else {
            state
                .copy_waiting
                .entry(accepted.durable_at_seq)
                .or_default()
                .push((from, id, push.source, slots));
        }
        self.wake_commit(node);
    }

    /// Answers the pushes whose commit is now durable on this copy.
    pub(super) fn copies_durable(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if state.copy_waiting.is_empty() {
            return;
        }
        let durable = state.replica.durable_seq();
        let later = state.copy_waiting.split_off(&(durable + 1));
        let ready = std::mem::replace(&mut state.copy_waiting, later);
        for (from, id, source, slots) in ready.into_values().flatten() {
            self.answer_copy(node, from, id, source, &slots);
        }
    }

    /// Sends `OK` for push `id`, after checking that what it brought is
    /// durable here (the copy's last completed commit covers its slots).
    fn answer_copy(
        &mut self,
        node: usize,
        from: usize,
        id: u64,
        source: tally_node::crdt::ReplicaId,
        slots: &PushedSlots,
    ) {
        for (key, slot, _) in slots.iter() {
            let Some(&index) = self.key_index.get(&**key) else {
                continue;
            };
            let durable = self.checker.durable_slot(node, index, source);
            if durable.p < slot.p || durable.n < slot.n {
                self.checker.violate(
                    self.now,
                    "copy answered before durable",
                    format!(
                        "n{node} confirmed push {id} of key {key} with slot (p {}, n {}) of {source}, \
                         but its last completed commit holds (p {}, n {})",
                        slot.p, slot.n, durable.p, durable.n
                    ),
                );
                break;
            }
        }
        self.copy_stats.taken += 1;
        self.send(node, from, NetMsg::CopyAnswer { push: id, ok: true });
    }

    /// A replicated add waited past its deadline: answer `UNAVAILABLE` (the
    /// caller does not learn whether it landed; its retry reuses the key).
    pub(super) fn copy_wait_expired(
        &mut self,
        node: usize,
        ticket: u64,
        client: u32,
        add: u32,
        attempt: u8,
    ) {
        let state = &mut self.nodes[node];
        let Some(waiters) = state.waiting.get_mut(&ticket) else {
            return;
        };
        let Some(at) = waiters.iter().position(|w| *w == (client, add, attempt)) else {
            return;
        };
        waiters.remove(at);
        if waiters.is_empty() {
            state.waiting.remove(&ticket);
        }
        self.copy_stats.unconfirmed_adds += 1;
        self.trace.mix_all(&[node as u64, add as u64, u64::MAX - 4]);
        self.schedule(
            super::clients::LOCAL_MS,
            Event::AddUnavailable(client, add, attempt),
        );
    }
}
