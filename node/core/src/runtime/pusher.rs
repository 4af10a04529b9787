//! The pusher of replicated durability, sans IO (issue 42, item 2): what
//! `tally-node`'s copier (`gossip/copier.rs`, over gRPC) and the
//! partitioned simulator (over its network) both decide around the core's
//! push calls. The caller moves messages and keeps time; the pusher says
//! what to send, when a push is over and when its parked counters go out
//! again.
//!
//! - [`Pusher::poll`] takes the core's next push ([`Replica::poll_push`]),
//!   plans its copies over the region's routes ([`plan_copies_by_routes`]:
//!   nodes holding each key's partition) and hands out one part per target.
//!   One push is in flight at a time; successive pushes rotate over the
//!   candidates (`turn`).
//! - The caller reports each target's answer ([`Pusher::handle_answer`]);
//!   once enough copies confirmed every group, or every target answered, or
//!   [`PUSH_TIMEOUT_MS`] passed, it ends the push ([`Pusher::end`]): the
//!   counters of each confirmed group are done, the others parked in the
//!   core ([`Replica::handle_push_partly_done`]).
//! - After a push that left counters unconfirmed, the parked counters go
//!   into a push again once a pause is over ([`Pusher::retry_due`]); the
//!   pause doubles while pushes keep failing, from [`RETRY_PAUSE_MS`] to
//!   [`MAX_RETRY_PAUSE_MS`]. New counters are pushed meanwhile.
//!
//! Invariants kept here: a counter is confirmed only by `needed` distinct
//! targets of its group that each answered `OK` to a part carrying it (an
//! answer delivered twice, or one for another push, counts for nothing);
//! the core's push in flight is always the pusher's, so it is ended exactly
//! once.

use crate::partition::RouteTable;
use crate::replica::{CopyPush, Replica};

use super::copy_plan::{plan_copies_by_routes, CopyPlan, CopyTarget};

/// The longest one push to one copy may take (its commit included).
pub const PUSH_TIMEOUT_MS: u64 = 1_500;
/// The pause before a failed push's counters are tried again; it doubles
/// with each failure in a row, up to [`MAX_RETRY_PAUSE_MS`].
pub const RETRY_PAUSE_MS: u64 = 50;
/// The longest pause between two attempts of a failing counter.
pub const MAX_RETRY_PAUSE_MS: u64 = 1_000;

/// The pause before the next attempt after `failures` failed pushes in a
/// row (at least 1): [`RETRY_PAUSE_MS`], doubling, at most
/// [`MAX_RETRY_PAUSE_MS`].
pub fn retry_pause_ms(failures: u32) -> u64 {
    (RETRY_PAUSE_MS << (failures.clamp(1, 5) - 1)).min(MAX_RETRY_PAUSE_MS)
}

/// One push to send: a part per target, each with the counters of every
/// group that target is a copy for, and all of the push's records.
#[derive(Clone, Debug)]
pub struct PushOut {
    /// The push's id (answers name it).
    pub id: u64,
    /// The durable sequence the push brings its copies up to.
    pub upto_seq: u64,
    /// Per target: the node, and its part of the push.
    pub parts: Vec<(CopyTarget, CopyPush)>,
}

/// How a push ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushEnd {
    /// The push's id.
    pub id: u64,
    /// Whether every counter was confirmed.
    pub confirmed: bool,
    /// Targets that answered `OK`.
    pub targets_confirmed: usize,
    /// The fewest targets any group of counters had (below `needed`: some
    /// key had too few nodes to copy to).
    pub fewest_targets: usize,
    /// Copies each counter needed (this node not included).
    pub needed: usize,
}

/// The push in flight.
#[derive(Clone, Debug)]
struct InFlight {
    id: u64,
    upto_seq: u64,
    plan: CopyPlan,
    answers: Vec<Option<bool>>,
    counters: usize,
    needed: usize,
}

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Pusher {
    turn: u64,
    next_id: u64,
    failures: u32,
    retry_at_ms: Option<u64>,
    in_flight: Option<InFlight>,
}

impl Pusher {
    /// A pusher whose pushes are numbered from `first_id` (a runtime that
    /// may receive an answer meant for an earlier incarnation starts each
    /// one elsewhere).
    pub fn new(first_id: u64) -> Pusher {
        Pusher {
            next_id: first_id,
            ..Pusher::default()
        }
    }

    /// The next push, if none is in flight and the core has counters
    /// waiting: planned over `routes` (`None`: every candidate holds every
    /// key) for `needed` copies per counter among the region's live nodes
    /// that take copies. A push with no part (no copy needed, or no node to
    /// copy to) is ended by the caller at once.
    pub fn poll(
        &mut self,
        core: &mut Replica,
        routes: Option<&RouteTable>,
        needed: usize,
    ) -> Option<PushOut> {
        if self.in_flight.is_some() {
            return None;
        }
        let push = core.poll_push()?;
        let turn = self.turn;
        self.turn = self.turn.wrapping_add(1);
        let region = core.identity().region.clone();
        let candidates: Vec<CopyTarget> = core
            .peers()
            .choose_copies(&region, usize::MAX, turn)
            .into_iter()
            .map(|member| (member.node_name.clone(), member.grpc_addr.clone()))
            .collect();
        let keys = push.counters.iter().map(|(key, ..)| key.as_bytes());
        let plan = plan_copies_by_routes(keys, routes, &candidates, needed, turn);
        let id = self.next_id;
        self.next_id += 1;
        let parts = plan
            .targets
            .iter()
            .enumerate()
            .map(|(index, target)| {
                let part = CopyPush {
                    counters: plan
                        .counters_for(index)
                        .into_iter()
                        .map(|counter| push.counters[counter].clone())
                        .collect(),
                    cluster_id: push.cluster_id.clone(),
                    source: push.source,
                    region: push.region.clone(),
                    upto_seq: push.upto_seq,
                    protocol: push.protocol,
                    records: push.records.clone(),
                    id_keys: push.id_keys.clone(),
                };
                (target.clone(), part)
            })
            .collect();
        self.in_flight = Some(InFlight {
            id,
            upto_seq: push.upto_seq,
            answers: vec![None; plan.targets.len()],
            counters: push.counters.len(),
            plan,
            needed,
        });
        Some(PushOut {
            id,
            upto_seq: push.upto_seq,
            parts,
        })
    }

    /// The id of the push in flight.
    pub fn in_flight(&self) -> Option<u64> {
        self.in_flight.as_ref().map(|push| push.id)
    }

    /// Target `target` (a node name) answered push `id`, `OK` or not.
    /// Returns true when the push may end now: every group confirmed, or
    /// every target answered.
    pub fn handle_answer(&mut self, id: u64, target: &str, ok: bool) -> bool {
        let Some(push) = self.in_flight.as_mut().filter(|push| push.id == id) else {
            return false;
        };
        let Some(index) = push
            .plan
            .targets
            .iter()
            .position(|(name, _)| name == target)
        else {
            return false;
        };
        if push.answers[index].is_none() {
            push.answers[index] = Some(ok);
        }
        let confirmed: Vec<bool> = push.answers.iter().map(|a| *a == Some(true)).collect();
        push.plan.confirmed(&confirmed, push.needed) || push.answers.iter().all(Option::is_some)
    }

    /// Ends push `id` (every answer is in, or its time ran out) at `now_ms`:
    /// the core learns which counters enough copies confirmed, and the
    /// others are parked until a pause is over. `None` for another push.
    pub fn end(&mut self, now_ms: u64, core: &mut Replica, id: u64) -> Option<PushEnd> {
        let push = self.in_flight.take_if(|push| push.id == id)?;
        let answered: Vec<bool> = push.answers.iter().map(|a| *a == Some(true)).collect();
        let counters = push
            .plan
            .confirmed_counters(&answered, push.needed, push.counters);
        core.handle_push_partly_done(push.upto_seq, &counters);
        let confirmed = counters.iter().all(|ok| *ok);
        if !confirmed {
            self.failures = self.failures.saturating_add(1);
            self.retry_at_ms
                .get_or_insert(now_ms + retry_pause_ms(self.failures));
        } else if self.retry_at_ms.is_none() && !core.has_parked() {
            self.failures = 0;
        }
        Some(PushEnd {
            id,
            confirmed,
            targets_confirmed: answered.iter().filter(|ok| **ok).count(),
            fewest_targets: push.plan.fewest_targets(),
            needed: push.needed,
        })
    }

    /// Puts the parked counters back into the core's pushes once their
    /// pause is over at `now_ms`; returns whether it did.
    pub fn retry_due(&mut self, now_ms: u64, core: &mut Replica) -> bool {
        if self.retry_at_ms.is_none_or(|at| at > now_ms) {
            return false;
        }
        self.retry_at_ms = None;
        core.retry_parked();
        true
    }

    /// When the parked counters go out again, if any wait.
    pub fn retry_at_ms(&self) -> Option<u64> {
        self.retry_at_ms
    }
}

#[cfg(test)]
#[path = "pusher_tests.rs"]
mod tests;
