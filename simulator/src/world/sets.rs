//! Like sets and uniques in the simulation (`--sets`): while the clients run,
//! a stream of likes, unlikes (a few like sets, a small member universe, so
//! members toggle often and regions race on them) and observes (one uniques
//! key) is applied at random live nodes through the core, and each is
//! recorded with the commit that makes it durable.
//!
//! The checker's rules, once the cluster has converged after the heal:
//! - every node holds the same length for every member, and the same
//!   registers ("like sets differ");
//! - every node's derived count equals a recount of its members ("derived
//!   count wrong");
//! - every member's length is exactly the max over the operations that
//!   became durable ("like length not exact"); an operation whose node
//!   crashed before its commit is lost with it, and one of an incarnation that
//!   was later wiped may or may not have reached a peer, so with wipes the
//!   length lies between the max over survivors and the max over all durable;
//! - each register likewise ("uniques register not exact").

use std::collections::BTreeMap;

use tally_node::crdt::hll::{hash_member, position};
use tally_node::crdt::{member_digest, register_digest, ReplicaId, SetsDigest};
use tally_node::replica::LikeRequest;

use super::{Event, World};
use crate::rng::{between, chance, SimRng};

/// Like sets in the workload.
const LIKE_KEYS: usize = 3;
/// Members each like set's likes are drawn from.
const MEMBERS: usize = 24;
/// The uniques key.
const UNIQUES_KEY: &str = "video:seen";
/// Members observes are drawn from.
const VIEWERS: u64 = 5_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Pending,
    Durable,
    Lost,
}

/// One like, unlike or observed member, as the node answered it.
#[derive(Clone, Debug)]
struct Recorded {
    node: usize,
    replica: ReplicaId,
    ticket: u64,
    fate: Fate,
    /// (like set, member) and the length the node answered, or (register,
    /// rank) for an observe.
    target: Target,
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Member {
        key: usize,
        member: usize,
        length: u64,
    },
    Register {
        index: u16,
        rank: u8,
    },
}

/// What one node holds: member lengths per like set, counts, registers.
type SetsHeld = (Vec<[u64; MEMBERS]>, Vec<u64>, tally_node::crdt::HyperLogLog);

/// The set workload's state.
pub(super) struct SetWorkload {
    rng: SimRng,
    recorded: Vec<Recorded>,
    /// Incarnations whose disk was wiped.
    wiped: Vec<ReplicaId>,
}

impl SetWorkload {
    pub(super) fn new(rng: SimRng) -> Self {
        SetWorkload {
            rng,
            recorded: Vec::new(),
            wiped: Vec::new(),
        }
    }
}

fn like_key(key: usize) -> String {
    format!("post:{key}")
}

fn member_name(member: usize) -> String {
    format!("user-{member}")
}

impl World<'_> {
    /// Applies one set operation at a random live node, then schedules the next.
    pub(super) fn set_op(&mut self) {
        if self.clients_stopped {
            return;
        }
        let Some(sets) = self.sets.as_mut() else {
            return;
        };
        let next = between(&mut sets.rng, 1, 8);
        let live: Vec<usize> = (0..self.nodes.len())
            .filter(|n| self.nodes[*n].up && !self.nodes[*n].paused)
            .collect();
        if !live.is_empty() {
            let node = live[between(&mut sets.rng, 0, live.len() as u64 - 1) as usize];
            let observe = chance(&mut sets.rng, 0.2);
            let key = between(&mut sets.rng, 0, LIKE_KEYS as u64 - 1) as usize;
            let member = between(&mut sets.rng, 0, MEMBERS as u64 - 1) as usize;
            let like = chance(&mut sets.rng, 0.6);
            let viewers: Vec<u64> = (0..between(&mut sets.rng, 1, 3))
                .map(|_| between(&mut sets.rng, 0, VIEWERS - 1))
                .collect();
            let state = &mut self.nodes[node];
            let now = state.local_now(self.now);
            let replica = state.id();
            let (store, core) = (&state.store, &mut state.replica);
            let mut targets = Vec::new();
            let ticket = if observe {
                let names: Vec<String> = viewers.iter().map(|v| format!("viewer-{v}")).collect();
                let members: Vec<&str> = names.iter().map(String::as_str).collect();
                let accepted = core
                    .handle_observe(now, store, UNIQUES_KEY, &members)
                    .expect("the memory store reads");
                for name in &names {
                    let (index, rank) = position(hash_member(name.as_bytes()));
                    targets.push(Target::Register { index, rank });
                }
                accepted.durable_at_seq
            } else {
                let (key_name, name) = (like_key(key), member_name(member));
                let request = LikeRequest {
                    key: &key_name,
                    member: &name,
                    like,
                    idempotency_key: None,
                };
                let accepted = core
                    .handle_like(now, store, request)
                    .expect("lengths stay far below u64::MAX");
                let length = core
                    .member_length(now, store, &key_name, &name)
                    .expect("the memory store reads");
                targets.push(Target::Member {
                    key,
                    member,
                    length,
                });
                accepted.durable_at_seq
            };
            let fate = if ticket <= core.durable_seq() {
                Fate::Durable
            } else {
                Fate::Pending
            };
            self.trace.mix_all(&[node as u64, ticket]);
            let sets = self.sets.as_mut().expect("checked above");
            for target in targets {
                sets.recorded.push(Recorded {
                    node,
                    replica,
                    ticket,
                    fate,
                    target,
                });
            }
            self.wake_commit(node);
        }
        self.schedule(next, Event::SetOp);
    }

    /// A node's commits are durable up to `durable`.
    pub(super) fn sets_durable(&mut self, node: usize, durable: u64) {
        let Some(sets) = self.sets.as_mut() else {
            return;
        };
        for op in sets.recorded.iter_mut().rev() {
            if op.node == node && op.fate == Fate::Pending && op.ticket <= durable {
                op.fate = Fate::Durable;
            }
        }
    }

    /// A node crashed: what it had not made durable is lost; a wipe loses
    /// the incarnation's durable state too, unless a peer had pulled it.
    pub(super) fn sets_crashed(&mut self, node: usize, wipe: bool) {
        let replica = self.nodes[node].id();
        let Some(sets) = self.sets.as_mut() else {
            return;
        };
        for op in sets.recorded.iter_mut() {
            if op.node == node && op.fate == Fate::Pending {
                op.fate = Fate::Lost;
            }
        }
        if wipe {
            sets.wiped.push(replica);
        }
    }

    /// Every node's like sets (lengths of the member universe), derived
    /// counts and uniques registers.
    fn read_sets(&mut self) -> Vec<SetsHeld> {
        let mut finals = Vec::new();
        for node in 0..self.nodes.len() {
            let now = self.nodes[node].local_now(self.now);
            let state = &mut self.nodes[node];
            let (store, core) = (&state.store, &mut state.replica);
            let mut members = vec![[0u64; MEMBERS]; LIKE_KEYS];
            let mut counts = Vec::new();
            for (key, lengths) in members.iter_mut().enumerate() {
                for (member, length) in lengths.iter_mut().enumerate() {
                    *length = core
                        .member_length(now, store, &like_key(key), &member_name(member))
                        .unwrap_or(0);
                }
                counts.push(
                    core.handle_like_count(now, store, &like_key(key))
                        .unwrap_or(0),
                );
            }
            let registers = core
                .handle_uniques(now, store, UNIQUES_KEY)
                .unwrap_or_default();
            finals.push((members, counts, registers));
        }
        finals
    }

    /// True when every node holds the same like sets and registers (or
    /// there is no set workload).
    pub(super) fn sets_converged(&mut self) -> bool {
        if self.sets.is_none() {
            return true;
        }
        let held = self.read_sets();
        held.iter()
            .all(|(members, _, registers)| (members, registers) == (&held[0].0, &held[0].2))
    }

    /// The checks of the module documentation, on the converged cluster.
    pub(super) fn check_sets(&mut self) {
        let Some(sets) = self.sets.take() else {
            return;
        };
        // (lower, upper) per member and per register.
        let mut lengths: BTreeMap<(usize, usize), (u64, u64)> = BTreeMap::new();
        let mut ranks: BTreeMap<u16, (u8, u8)> = BTreeMap::new();
        for op in &sets.recorded {
            if op.fate == Fate::Lost {
                continue;
            }
            let survives = op.fate == Fate::Durable && !sets.wiped.contains(&op.replica);
            match op.target {
                Target::Member {
                    key,
                    member,
                    length,
                } => {
                    let bounds = lengths.entry((key, member)).or_default();
                    bounds.1 = bounds.1.max(length);
                    if survives {
                        bounds.0 = bounds.0.max(length);
                    }
                }
                Target::Register { index, rank } => {
                    let bounds = ranks.entry(index).or_default();
                    bounds.1 = bounds.1.max(rank);
                    if survives {
                        bounds.0 = bounds.0.max(rank);
                    }
                }
            }
        }
        let finals = self.read_sets();
        for (node, (members, counts, registers)) in finals.iter().enumerate() {
            // The digest `tally status` compares, kept incrementally by the
            // core, is the digest of what the node holds.
            let mut held = SetsDigest::default();
            for (key, lengths) in members.iter().enumerate() {
                for (member, length) in lengths.iter().enumerate() {
                    held.apply(member_digest(&like_key(key), &member_name(member), *length));
                }
            }
            for (index, rank) in registers.set_registers() {
                held.apply(register_digest(UNIQUES_KEY, index, rank));
            }
            if self.nodes[node].replica.sets_digest() != held {
                self.checker.violate(
                    self.now,
                    "sets digest wrong",
                    format!("n{node}: the sets digest does not match the like sets and uniques it holds"),
                );
            }
            if (members, registers) != (&finals[0].0, &finals[0].2) {
                self.checker.violate(
                    self.now,
                    "like sets differ",
                    format!("n{node} and n0 hold different like sets or uniques registers"),
                );
            }
            for (key, count) in counts.iter().enumerate() {
                let recount = members[key].iter().filter(|len| *len % 2 == 1).count() as u64;
                if *count != recount {
                    self.checker.violate(
                        self.now,
                        "derived count wrong",
                        format!(
                            "n{node} {}: count {count}, members liked {recount}",
                            like_key(key)
                        ),
                    );
                }
            }
        }
        let (members, _, registers) = &finals[0];
        for (key, lengths_held) in members.iter().enumerate() {
            for (member, length) in lengths_held.iter().enumerate() {
                let (lower, upper) = lengths.get(&(key, member)).copied().unwrap_or_default();
                if *length < lower || *length > upper {
                    self.checker.violate(
                        self.now,
                        "like length not exact",
                        format!(
                            "{} {}: length {length}, durable operations say {lower}..={upper}",
                            like_key(key),
                            member_name(member)
                        ),
                    );
                }
            }
        }
        for (index, (lower, upper)) in &ranks {
            let rank = registers.register(*index);
            if rank < *lower || rank > *upper {
                self.checker.violate(
                    self.now,
                    "uniques register not exact",
                    format!(
                        "register {index}: rank {rank}, durable observes say {lower}..={upper}"
                    ),
                );
            }
        }
        for (index, rank) in registers.set_registers() {
            if !ranks.contains_key(&index) {
                self.checker.violate(
                    self.now,
                    "uniques register not exact",
                    format!("register {index} holds {rank}, but no observe reached it"),
                );
            }
        }
    }
}
