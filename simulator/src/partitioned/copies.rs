//! Replicated durability in a partitioned world, as `tally-node`'s pusher
//! (`node/src/gossip/copier.rs`) and engine run it around the same core
//! calls, through the core's sans-IO pusher (`runtime/pusher.rs`, which
//! the node's copier drives too): after a commit leaves counters pending,
//! one push at a time (`Replica::poll_push`) goes to the copies
//! `copy_plan::plan_copies` picks from the node's routes (each key's other
//! live owners first, then the nodes still handing its partition away,
//! nobody else); each copy merges
//! it (`handle_copy_push`, which refuses a partition it does not serve),
//! commits it and answers only once that commit is durable; once every copy
//! answered or the time ran out, the counters of each group that
//! `write_copies - 1` copies confirmed are done, and the others are parked
//! in the core until a retry after a doubling pause (the next push goes at
//! once). A replicated add is answered once `Replica::replicated_for` says
//! its counter is copied through its ticket, or `UNAVAILABLE` (fate unknown
//! to its caller, who retries with the same idempotency key) when its wait
//! runs past its deadline.
//!
//! Invariants kept and checked here: a push is confirmed only by distinct
//! copies that each answered `OK` (an answer delivered twice counts once);
//! a copy answers `OK` only when its last completed commit holds the pushed
//! slot of the phase the pusher wrote it in (the checker's
//! `copy_answered`, which takes that phase from the pusher's durable state,
//! not from what the push says), and only for a partition it serves (a
//! copy elsewhere is purged while the writer's disk is the only other one
//! holding the add); and when a removal loses a writer's disk,
//! every add it acknowledged is held by another node (the checker's
//! "acknowledged add lost to a wipe").

use std::sync::Arc;

use tally_core::runtime::pusher::PUSH_TIMEOUT_MS;
use tally_node::partition::RouteTable;

use super::bugs::PartitionBug;
use super::node::CopyWaiter;
use super::world::{slot_of, Ev, Msg, PWorld};
use crate::options::Durability;
use crate::world::copy_wait_ms;

impl PWorld<'_> {
    /// Whether adds are acknowledged only once their copies hold them.
    pub(super) fn replicated(&self) -> bool {
        self.options.durability == Durability::Replicated
    }

    /// How long a replicated add waits for its copies.
    pub(super) fn copy_wait_ms(&self) -> u64 {
        copy_wait_ms(self.options.client_timeout_ms)
    }

    /// Sends node `node`'s next push if none is in flight and its core has
    /// counters waiting for their copies (the core's pusher plans it).
    pub(super) fn pump_push(&mut self, node: usize) {
        let replicated = self.replicated();
        let state = &mut self.nodes[node];
        if !replicated || !state.up {
            return;
        }
        // The planted bug `copy-to-any-node` plans as if every node of the
        // region held every key (and its copies take what they get).
        let any_node = self.options.bug == Some(PartitionBug::CopyToAnyNode);
        let routes = state
            .view
            .as_ref()
            .filter(|_| !any_node)
            .map(|view| RouteTable::build(view, &state.name, |name| Some(name.to_string())));
        let needed = self.options.write_copies - 1;
        let (pusher, core) = state.pusher_and_core();
        let Some(out) = pusher.poll(core, routes.as_ref(), needed) else {
            return;
        };
        let (writer, epoch) = (state.writer, state.epoch);
        self.copies.pushes += 1;
        self.trace
            .mix_all(&[node as u64, out.id, out.upto_seq, out.parts.len() as u64]);
        if out.parts.is_empty() {
            self.push_ended(node, out.id);
            return;
        }
        for ((name, _), part) in out.parts {
            // What the pusher's durable state held of each counter: the
            // phase the checker holds a copy's answer to.
            let epochs = part
                .counters
                .iter()
                .map(|(key, ..)| {
                    self.key_index(key)
                        .map_or(0, |index| self.checker.durable_epoch(writer, index))
                })
                .collect();
            let msg = Msg::Copy {
                push: out.id,
                data: Arc::new(part),
                epochs: Arc::new(epochs),
            };
            self.send(node, slot_of(&name), msg);
        }
        self.schedule(PUSH_TIMEOUT_MS, Ev::PushTimeout(node as u16, epoch, out.id));
    }

    /// Node `node`'s push `id` is over (every copy answered, or its time
    /// ran out): its pusher tells the core which counters enough copies
    /// confirmed; the others wait out a pause, and the next push goes at
    /// once.
    fn push_ended(&mut self, node: usize, id: u64) {
        let now = self.clock(node);
        let state = &mut self.nodes[node];
        let (pusher, core) = state.pusher_and_core();
        let Some(end) = pusher.end(now, core, id) else {
            return;
        };
        let retry_at = pusher.retry_at_ms();
        if end.confirmed {
            self.copies.confirmed += 1;
        } else {
            self.copies.failed += 1;
            self.trace.mix_all(&[node as u64, id, u64::MAX - 2]);
        }
        self.schedule_push_retry(node, now, retry_at);
        self.answer_waiters(node);
        self.pump_push(node);
    }

    /// Schedules the end of node `node`'s pause of parked counters, due at
    /// `retry_at` on its clock (now `now`), unless one is scheduled.
    fn schedule_push_retry(&mut self, node: usize, now: u64, retry_at: Option<u64>) {
        let state = &mut self.nodes[node];
        let Some(at) = retry_at.filter(|_| !state.push_retry_scheduled) else {
            return;
        };
        state.push_retry_scheduled = true;
        let epoch = state.epoch;
        self.schedule(at.saturating_sub(now), Ev::PushRetry(node as u16, epoch));
    }

    /// The pause of node `node`'s parked counters is over: they go into
    /// the next push.
    pub(super) fn push_retry(&mut self, node: usize) {
        let now = self.clock(node);
        let state = &mut self.nodes[node];
        state.push_retry_scheduled = false;
        let (pusher, core) = state.pusher_and_core();
        if !pusher.retry_due(now, core) {
            let retry_at = pusher.retry_at_ms();
            self.schedule_push_retry(node, now, retry_at);
        }
        self.pump_push(node);
    }

    /// Push `id` of node `node` timed out (a copy did not answer).
    pub(super) fn push_timeout(&mut self, node: usize, id: u64) {
        if self.nodes[node].pusher.in_flight() == Some(id) {
            self.push_ended(node, id);
        }
    }

    /// Copy `from` answered push `id` of node `node`.
    pub(super) fn copy_answered(&mut self, node: usize, from: usize, id: u64, ok: bool) {
        let target = format!("n{from}");
        if self.nodes[node].pusher.in_flight() != Some(id) {
            return;
        }
        self.trace.mix_all(&[node as u64, id, ok as u64]);
        if self.nodes[node].pusher.handle_answer(id, &target, ok) {
            self.push_ended(node, id);
        }
    }

    /// A push of node `from` arrives at copy `node`: merged, committed,
    /// answered once durable here (at once when refused).
    pub(super) fn copy_arrives(&mut self, node: usize, from: usize, id: u64, waiter: CopyWaiter) {
        let (_, _, push, _) = &waiter;
        let now = self.clock(node);
        let state = &mut self.nodes[node];
        let scoped = state.scoped_mut();
        let accepted = match scoped.core.handle_copy_push(now, &scoped.store, push) {
            Ok(accepted) => accepted,
            Err(_) => {
                self.trace.mix(u64::MAX - 3);
                self.send(
                    node,
                    from,
                    Msg::CopyAnswer {
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
        let writer = state.writer;
        for (key, counter) in &accepted.changed {
            if let Some(index) = self.key_index(key) {
                self.checker.observe(self.now, writer, index, counter);
            }
        }
        let state = &mut self.nodes[node];
        if accepted.durable_at_seq <= state.scoped().core.durable_seq() {
            self.answer_copy(node, waiter);
        } else {
            state
                .copy_waiting
                .entry(accepted.durable_at_seq)
                .or_default()
                .push(waiter);
        }
        self.wake_commit(node);
    }

    /// Answers the pushes copy `node` took whose commit is now durable.
    pub(super) fn copies_durable(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        if state.copy_waiting.is_empty() {
            return;
        }
        let durable = state.scoped().core.durable_seq();
        let later = state.copy_waiting.split_off(&(durable + 1));
        let ready = std::mem::replace(&mut state.copy_waiting, later);
        for waiter in ready.into_values().flatten() {
            self.answer_copy(node, waiter);
        }
    }

    /// Copy `node` answers `OK`, after the checker verified that its last
    /// completed commit holds what the push brought.
    fn answer_copy(&mut self, node: usize, (from, id, push, epochs): CopyWaiter) {
        let writer = self.nodes[node].writer;
        for ((key, slot, _), epoch) in push.counters.iter().zip(epochs.iter()) {
            if let Some(index) = self.key_index(key) {
                let pushed = (push.source, *slot, *epoch);
                self.checker.copy_answered(self.now, writer, index, pushed);
                // Only a holder keeps a copy until the owners hold it.
                let partition = self.key_partition[index];
                if !self.nodes[node].serves(partition) {
                    self.checker.violate(
                        self.now,
                        "copy answered for a partition it does not hold",
                        format!(
                            "n{node} answered n{from}'s push of key {key} (partition {}), \
                             which it does not serve: no owner pulls it from there",
                            partition.0
                        ),
                    );
                }
            }
        }
        self.copies.taken += 1;
        self.send(node, from, Msg::CopyAnswer { push: id, ok: true });
    }

    /// A replicated add waited past its deadline: `UNAVAILABLE` (the caller
    /// does not learn whether it landed; a retry reuses its key).
    pub(super) fn copy_wait_expired(&mut self, node: usize, ticket: u64, waiter: (u32, u32, u8)) {
        let state = &mut self.nodes[node];
        let Some(waiters) = state.waiting.get_mut(&ticket) else {
            return;
        };
        let Some(at) = waiters.iter().position(|w| *w == waiter) else {
            return;
        };
        waiters.remove(at);
        if waiters.is_empty() {
            state.waiting.remove(&ticket);
        }
        self.copies.unconfirmed_adds += 1;
        let (client, add, attempt) = waiter;
        self.trace.mix_all(&[node as u64, add as u64, u64::MAX - 4]);
        self.schedule(
            super::clients::LOCAL_MS,
            Ev::AddUnavailable(client, add, attempt),
        );
    }
}
