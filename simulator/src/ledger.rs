//! What the callers know: every logical add, its magnitude, its attempts, the
//! replicas those attempts reached, and whether it was acknowledged.
//!
//! Invariant (the decoding scheme of the checker): an add's magnitude is
//! `2^lane`, where the lane is free for its (node, key, sign) when the add is
//! created and stays held until the add is known durable (a sync
//! acknowledgement, or an async one whose commit completed). So all the adds
//! of one replica slot whose fate is unknown hold distinct lanes, and the part
//! of a slot that acknowledged adds do not explain decodes, bit by bit, into
//! exactly which unknown adds were applied. Abandoned adds hold their lane
//! forever, and so do adds acknowledged by one replica and applied by
//! another too (an attempt that reached a second owner): at the other,
//! their fate stays unknown. Lanes stay below [`MAX_LANES`], so no slot or value overflows.

use tally_node::crdt::ReplicaId;

/// Lanes per (node, key, sign): magnitudes are 1 to 2^(MAX_LANES-1).
pub const MAX_LANES: u32 = 40;

/// The fate of a logical add, as its caller knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No answer yet.
    Pending,
    /// Acknowledged after the flush (sync mode) by `replica`; durable at `ticket`.
    Acked {
        /// The replica that answered.
        replica: ReplicaId,
        /// The commit that made it durable.
        ticket: u64,
    },
    /// Acknowledged before the flush (async mode); `durable` once its commit completed.
    AsyncAcked {
        /// The replica that answered.
        replica: ReplicaId,
        /// The commit that makes it durable.
        ticket: u64,
        /// Whether that commit completed before any crash.
        durable: bool,
    },
    /// The caller gave up without learning whether it landed.
    Abandoned,
    /// The node refused it. Never expected in the simulator (its checker
    /// reports the refusal); in a chaos run, a refusal that means "not
    /// applied" of the add's only attempt ([`Ledger::not_applied`]).
    Refused,
}

/// One add as the caller issued it, with all its attempts.
#[derive(Clone, Debug)]
pub struct LogicalAdd {
    /// The client that issued it.
    pub client: u32,
    /// The node it was sent to (retries go to the same node).
    pub node: u16,
    /// The key's index.
    pub key: u32,
    /// A decrement.
    pub negative: bool,
    /// Its lane: the magnitude is `2^lane`.
    pub lane: u8,
    /// Whether it carries an idempotency key (only those are retried).
    pub keyed: bool,
    /// Attempts sent.
    pub attempts: u8,
    /// What the caller knows.
    pub outcome: Outcome,
    /// The replicas that applied (or recognised) one of its attempts.
    pub delivered: Vec<ReplicaId>,
    /// An async node made it durable before its answer arrived.
    pub durable_early: Option<ReplicaId>,
    /// The attempt that was answered `UNAVAILABLE` (replicated mode: too few
    /// copies confirmed in time), 0 for none.
    pub unavailable_at: u8,
}

impl LogicalAdd {
    /// The magnitude.
    pub fn magnitude(&self) -> u64 {
        1u64 << self.lane
    }

    /// The signed delta.
    pub fn delta(&self) -> i64 {
        let magnitude = self.magnitude() as i64;
        if self.negative {
            -magnitude
        } else {
            magnitude
        }
    }

    /// True when the add is known to be durable at `replica`.
    pub fn certain_at(&self, replica: ReplicaId) -> Option<u64> {
        match self.outcome {
            Outcome::Acked { replica: r, ticket } if r == replica => Some(ticket),
            Outcome::AsyncAcked {
                replica: r,
                ticket,
                durable: true,
            } if r == replica => Some(ticket),
            _ => None,
        }
    }
}

/// Counters of the workload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkloadStats {
    /// Logical adds issued.
    pub adds: u64,
    /// Attempts sent (first tries and retries).
    pub attempts: u64,
    /// Retries.
    pub retries: u64,
    /// Acknowledged after the flush.
    pub acked: u64,
    /// Acknowledged before the flush.
    pub async_acked: u64,
    /// Given up.
    pub abandoned: u64,
    /// Answers that said "already applied".
    pub duplicates: u64,
    /// Adds not issued because every lane of their slot was held.
    pub lane_skips: u64,
    /// Adds on the hot key.
    pub hot_adds: u64,
    /// Attempts answered `UNAVAILABLE` (replicated mode: too few copies
    /// confirmed in time; the outcome is unknown to the caller).
    pub unavailable: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Ledger {
    /// Every logical add, by id.
    pub adds: Vec<LogicalAdd>,
    lanes: Vec<u64>,
    keys: usize,
    /// Counters.
    pub stats: WorkloadStats,
}

impl Ledger {
    /// An empty ledger for `nodes` nodes and `keys` keys.
    pub fn new(nodes: usize, keys: usize) -> Self {
        Ledger {
            adds: Vec::new(),
            lanes: vec![0; nodes * keys * 2],
            keys,
            stats: WorkloadStats::default(),
        }
    }

    fn lane_index(&self, node: usize, key: usize, negative: bool) -> usize {
        (node * self.keys + key) * 2 + usize::from(negative)
    }

    /// Issues a new add if its slot has a free lane; returns its id.
    pub fn issue(
        &mut self,
        client: u32,
        node: usize,
        key: usize,
        negative: bool,
        keyed: bool,
    ) -> Option<u32> {
        let index = self.lane_index(node, key, negative);
        let held = self.lanes[index];
        let lane = (!held).trailing_zeros();
        if lane >= MAX_LANES {
            self.stats.lane_skips += 1;
            return None;
        }
        self.lanes[index] |= 1 << lane;
        let id = self.adds.len() as u32;
        self.adds.push(LogicalAdd {
            client,
            node: node as u16,
            key: key as u32,
            negative,
            lane: lane as u8,
            keyed,
            attempts: 0,
            outcome: Outcome::Pending,
            delivered: Vec::new(),
            durable_early: None,
            unavailable_at: 0,
        });
        self.stats.adds += 1;
        if key == 0 {
            self.stats.hot_adds += 1;
        }
        Some(id)
    }

    fn release(&mut self, id: u32) {
        let add = &self.adds[id as usize];
        let index = self.lane_index(add.node as usize, add.key as usize, add.negative);
        self.lanes[index] &= !(1u64 << add.lane);
    }

    /// An attempt of `id` reached `replica`, which applied or recognised it.
    pub fn delivered(&mut self, id: u32, replica: ReplicaId) {
        let add = &mut self.adds[id as usize];
        if !add.delivered.contains(&replica) {
            add.delivered.push(replica);
        }
    }

    /// The caller got an answer. Returns true when it resolves a pending add.
    pub fn answered(&mut self, id: u32, replica: ReplicaId, ticket: u64, is_async: bool) -> bool {
        let add = &mut self.adds[id as usize];
        if add.outcome != Outcome::Pending {
            return false;
        }
        if is_async {
            let durable = add.durable_early == Some(replica);
            add.outcome = Outcome::AsyncAcked {
                replica,
                ticket,
                durable,
            };
            self.stats.async_acked += 1;
            if durable {
                self.release(id);
            }
        } else {
            add.outcome = Outcome::Acked { replica, ticket };
            self.stats.acked += 1;
            // Applied by another replica too (an attempt that reached
            // another owner): its fate there stays unknown for good.
            if add.delivered.iter().all(|applied| *applied == replica) {
                self.release(id);
            }
        }
        true
    }

    /// An async-acknowledged add's commit completed at `replica`.
    pub fn async_durable(&mut self, id: u32, replica: ReplicaId) {
        let add = &mut self.adds[id as usize];
        if add.outcome == Outcome::Pending {
            add.durable_early = Some(replica);
        }
        if let Outcome::AsyncAcked { durable, .. } = &mut add.outcome {
            if !*durable {
                *durable = true;
                self.release(id);
            }
        }
    }

    /// The caller gave up.
    pub fn abandon(&mut self, id: u32) {
        let add = &mut self.adds[id as usize];
        if add.outcome == Outcome::Pending {
            add.outcome = Outcome::Abandoned;
            self.stats.abandoned += 1;
        }
    }

    /// The node refused the add.
    pub fn refused(&mut self, id: u32) {
        let add = &mut self.adds[id as usize];
        if add.outcome == Outcome::Pending {
            add.outcome = Outcome::Refused;
        }
    }

    /// The node of `replica` answered the add's only attempt with a refusal
    /// that means "not applied" (`chaos/workload.rs`): the add is not
    /// delivered there, so no check explains a slot with it. Its lane stays
    /// held, so a node that applied it anyway holds a bit of its slot that
    /// no add explains, and the check fails.
    pub fn not_applied(&mut self, id: u32, replica: ReplicaId) {
        let add = &mut self.adds[id as usize];
        if add.outcome == Outcome::Pending {
            add.outcome = Outcome::Refused;
            add.delivered.retain(|delivered| *delivered != replica);
        }
    }

    /// True while some add awaits an answer.
    pub fn any_pending(&self) -> bool {
        self.adds.iter().any(|add| add.outcome == Outcome::Pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_held_until_the_add_is_durable() {
        let mut ledger = Ledger::new(1, 1);
        let a = ledger.issue(0, 0, 0, false, true).unwrap();
        let b = ledger.issue(0, 0, 0, false, true).unwrap();
        assert_eq!(
            (ledger.adds[a as usize].lane, ledger.adds[b as usize].lane),
            (0, 1)
        );
        let c = ledger.issue(0, 0, 0, true, true).unwrap();
        assert_eq!(
            ledger.adds[c as usize].lane, 0,
            "signs have their own lanes"
        );
        ledger.answered(a, ReplicaId(1), 1, false);
        let e = ledger.issue(0, 0, 0, false, true).unwrap();
        assert_eq!(ledger.adds[e as usize].lane, 0);
        ledger.answered(b, ReplicaId(1), 1, true);
        let d = ledger.issue(0, 0, 0, false, true).unwrap();
        assert_eq!(
            ledger.adds[d as usize].lane, 2,
            "an async ack holds the lane"
        );
        ledger.async_durable(b, ReplicaId(1));
        let f = ledger.issue(0, 0, 0, false, true).unwrap();
        assert_eq!(ledger.adds[f as usize].lane, 1);
    }

    #[test]
    fn a_full_slot_refuses_new_adds() {
        let mut ledger = Ledger::new(1, 1);
        for _ in 0..MAX_LANES {
            let id = ledger.issue(0, 0, 0, false, false).unwrap();
            ledger.abandon(id);
        }
        assert!(ledger.issue(0, 0, 0, false, false).is_none());
        assert_eq!(ledger.stats.lane_skips, 1);
    }
}
