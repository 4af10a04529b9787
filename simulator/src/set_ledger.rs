//! The like-set and uniques workload and its exact check, shared by the
//! whole-cluster world (`world/sets.rs`) and the partitioned one
//! (`partitioned/sets.rs`): a stream of likes, unlikes (a few like sets, a
//! small member universe, so members toggle often and regions race on
//! them) and observes (one uniques key), each applied through a node's
//! core and recorded with the commit that makes it durable.
//!
//! The rules, once the holders of a key have converged after the heal:
//! - every holder of a key holds the same length for every member, and the
//!   same registers ("like sets differ");
//! - every node's derived count equals a recount of its members ("derived
//!   count wrong"), and its sets digest is the digest of what it holds
//!   ("sets digest wrong");
//! - every member's length is exactly the max over the operations that
//!   became durable ("like length not exact"); an operation whose node
//!   crashed before its commit is lost with it, and one of an incarnation
//!   whose disk was later lost may or may not have reached a peer, so then
//!   the length lies between the max over survivors and the max over all
//!   durable;
//! - each register likewise ("uniques register not exact").

use std::collections::BTreeMap;

use tally_node::crdt::hll::{hash_member, position};
use tally_node::crdt::{member_digest, register_digest, HyperLogLog, ReplicaId, SetsDigest};
use tally_node::replica::{AddRefused, DurableState, LikeRefused, LikeRequest, Replica};

use crate::rng::{between, chance, SimRng};

/// Like sets in the workload.
pub const LIKE_KEYS: usize = 3;
/// Members each like set's likes are drawn from.
pub const MEMBERS: usize = 24;
/// The uniques key.
pub const UNIQUES_KEY: &str = "video:seen";
/// Members observes are drawn from.
const VIEWERS: u64 = 5_000;

/// The name of like set `key`.
pub fn like_key(key: usize) -> String {
    format!("post:{key}")
}

fn member_name(member: usize) -> String {
    format!("user-{member}")
}

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
    target: Target,
}

/// (like set, member) and the length the node answered, or (register,
/// rank) for an observe.
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

/// One operation drawn by the workload.
#[derive(Clone, Debug)]
pub enum SetOp {
    /// Like (`true`) or unlike member `member` of like set `key`.
    Like {
        /// The like set.
        key: usize,
        /// The member.
        member: usize,
        /// Like or unlike.
        like: bool,
    },
    /// Observe these viewers in the uniques key.
    Observe(Vec<u64>),
}

impl SetOp {
    /// The key it writes.
    pub fn key(&self) -> String {
        match self {
            SetOp::Like { key, .. } => like_key(*key),
            SetOp::Observe(_) => UNIQUES_KEY.to_string(),
        }
    }
}

/// What one node holds: member lengths per like set, counts, registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetsHeld {
    /// Per like set, each member's length.
    pub members: Vec<[u64; MEMBERS]>,
    /// Per like set, its derived count.
    pub counts: Vec<u64>,
    /// The uniques key's registers.
    pub registers: HyperLogLog,
}

impl SetsHeld {
    /// Nothing held, in the shape of `like`.
    pub fn empty_like(like: &SetsHeld) -> SetsHeld {
        SetsHeld {
            members: vec![[0; MEMBERS]; like.members.len()],
            counts: vec![0; like.counts.len()],
            registers: HyperLogLog::default(),
        }
    }
}

/// A broken rule: its kind and what exactly.
pub type SetViolation = (&'static str, String);

/// The workload's state: its random stream and what was answered.
pub struct SetLedger {
    /// Its random stream.
    pub rng: SimRng,
    recorded: Vec<Recorded>,
    /// The indices in `recorded` of the operations still pending: a commit
    /// or a crash looks at these only, not at every operation recorded
    /// (that walk was a twentieth of the partitioned simulator's time).
    pending: Vec<usize>,
    /// Incarnations whose disk was lost.
    lost: Vec<ReplicaId>,
}

impl SetLedger {
    /// A ledger drawing from `rng`.
    pub fn new(rng: SimRng) -> Self {
        SetLedger {
            rng,
            recorded: Vec::new(),
            pending: Vec::new(),
            lost: Vec::new(),
        }
    }

    /// Draws the next operation.
    pub fn draw(&mut self) -> SetOp {
        let rng = &mut self.rng;
        let observe = chance(rng, 0.2);
        let key = between(rng, 0, LIKE_KEYS as u64 - 1) as usize;
        let member = between(rng, 0, MEMBERS as u64 - 1) as usize;
        let like = chance(rng, 0.6);
        let viewers = (0..between(rng, 1, 3))
            .map(|_| between(rng, 0, VIEWERS - 1))
            .collect();
        match observe {
            true => SetOp::Observe(viewers),
            false => SetOp::Like { key, member, like },
        }
    }

    /// Applies `op` at node `node` through its `core`, and records it;
    /// returns its commit ticket, or `None` when the core refused it
    /// because the key's partition is not served there (nothing applied).
    pub fn apply(
        &mut self,
        node: usize,
        now: u64,
        store: &impl DurableState,
        core: &mut Replica,
        op: &SetOp,
    ) -> Option<u64> {
        let replica = core.identity().replica;
        let mut targets = Vec::new();
        let ticket = match op {
            SetOp::Observe(viewers) => {
                core.check_served(UNIQUES_KEY).ok()?;
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
            }
            SetOp::Like { key, member, like } => {
                let (key_name, name) = (like_key(*key), member_name(*member));
                let request = LikeRequest {
                    key: &key_name,
                    member: &name,
                    like: *like,
                    idempotency_key: None,
                };
                let accepted = match core.handle_like(now, store, request) {
                    Ok(accepted) => accepted,
                    // Not applied: the key's partition is not served here,
                    // or this writer may not write it yet (its slots there
                    // wait for a fold, or a restart's hold).
                    Err(LikeRefused::Add(
                        AddRefused::NotServed { .. }
                        | AddRefused::WriteGated(_)
                        | AddRefused::HeldAfterRestart { .. },
                    )) => return None,
                    Err(refused) => panic!("a like within the model is taken: {refused}"),
                };
                let length = core
                    .member_length(now, store, &key_name, &name)
                    .expect("the memory store reads");
                targets.push(Target::Member {
                    key: *key,
                    member: *member,
                    length,
                });
                accepted.durable_at_seq
            }
        };
        let fate = match ticket <= core.durable_seq() {
            true => Fate::Durable,
            false => Fate::Pending,
        };
        for target in targets {
            if fate == Fate::Pending {
                self.pending.push(self.recorded.len());
            }
            self.recorded.push(Recorded {
                node,
                replica,
                ticket,
                fate,
                target,
            });
        }
        Some(ticket)
    }

    /// Node `node`'s commits are durable up to `durable`.
    pub fn durable(&mut self, node: usize, durable: u64) {
        let recorded = &mut self.recorded;
        self.pending.retain(|&at| {
            let op = &mut recorded[at];
            let now_durable = op.node == node && op.ticket <= durable;
            if now_durable {
                op.fate = Fate::Durable;
            }
            !now_durable
        });
    }

    /// Node `node` (replica `replica`) crashed: what it had not made durable
    /// is lost; with `disk_lost`, its durable state too unless a peer had
    /// pulled it.
    pub fn crashed(&mut self, node: usize, replica: ReplicaId, disk_lost: bool) {
        let recorded = &mut self.recorded;
        self.pending.retain(|&at| {
            let op = &mut recorded[at];
            if op.node == node {
                op.fate = Fate::Lost;
            }
            op.node != node
        });
        if disk_lost {
            self.lost.push(replica);
        }
    }

    /// The exact rules on the final state of the like sets `keys` and, with
    /// `registers`, of the uniques key, as one holder of each holds them.
    pub fn check_exact(
        &self,
        held: &SetsHeld,
        keys: &[usize],
        registers: bool,
    ) -> Vec<SetViolation> {
        // (lower, upper) per member and per register.
        let mut lengths: BTreeMap<(usize, usize), (u64, u64)> = BTreeMap::new();
        let mut ranks: BTreeMap<u16, (u8, u8)> = BTreeMap::new();
        for op in &self.recorded {
            if op.fate == Fate::Lost {
                continue;
            }
            let survives = op.fate == Fate::Durable && !self.lost.contains(&op.replica);
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
        let mut found = Vec::new();
        for &key in keys {
            for (member, length) in held.members[key].iter().enumerate() {
                let (lower, upper) = lengths.get(&(key, member)).copied().unwrap_or_default();
                if *length < lower || *length > upper {
                    found.push((
                        "like length not exact",
                        format!(
                            "{} {}: length {length}, durable operations say {lower}..={upper}",
                            like_key(key),
                            member_name(member)
                        ),
                    ));
                }
            }
        }
        if !registers {
            return found;
        }
        for (index, (lower, upper)) in &ranks {
            let rank = held.registers.register(*index);
            if rank < *lower || rank > *upper {
                found.push((
                    "uniques register not exact",
                    format!(
                        "register {index}: rank {rank}, durable observes say {lower}..={upper}"
                    ),
                ));
            }
        }
        for (index, rank) in held.registers.set_registers() {
            if !ranks.contains_key(&index) {
                found.push((
                    "uniques register not exact",
                    format!("register {index} holds {rank}, but no observe reached it"),
                ));
            }
        }
        found
    }
}

/// What a node holds of the workload's keys, read through its core.
pub fn read_sets(now: u64, store: &impl DurableState, core: &mut Replica) -> SetsHeld {
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
    SetsHeld {
        members,
        counts,
        registers,
    }
}

/// The rules every node keeps on its own: its derived counts are recounts
/// of its members, and `digest` (the core's sets digest) is the digest of
/// what it holds.
pub fn check_held(node: usize, held: &SetsHeld, digest: SetsDigest) -> Vec<SetViolation> {
    let mut found = Vec::new();
    let mut computed = SetsDigest::default();
    for (key, lengths) in held.members.iter().enumerate() {
        for (member, length) in lengths.iter().enumerate() {
            computed.apply(member_digest(&like_key(key), &member_name(member), *length));
        }
    }
    for (index, rank) in held.registers.set_registers() {
        computed.apply(register_digest(UNIQUES_KEY, index, rank));
    }
    if digest != computed {
        found.push((
            "sets digest wrong",
            format!("n{node}: the sets digest does not match the like sets and uniques it holds"),
        ));
    }
    for (key, count) in held.counts.iter().enumerate() {
        let recount = held.members[key].iter().filter(|len| *len % 2 == 1).count() as u64;
        if *count != recount {
            found.push((
                "derived count wrong",
                format!(
                    "n{node} {}: count {count}, members liked {recount}",
                    like_key(key)
                ),
            ));
        }
    }
    found
}
