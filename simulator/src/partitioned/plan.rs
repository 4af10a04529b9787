//! The fault plan of a partitioned world: the network and crash faults of
//! `crate::faults` plus membership changes (join, drain, remove), one value
//! per operation, printed one a line and parsed back.
//!
//! Invariant: a plan is data. The world applies exactly its operations (and
//! the final heal), so a printed plan fed back with `--plan` replays the same
//! run. A crash whose restart comes `dead_after` or more after it is the
//! "crash past dead-after" of issue 11: the others take its partitions over.

use std::fmt;
use std::str::FromStr;

use super::PartitionedOptions;
use crate::faults::{Op, Shape};
use crate::rng::{between, chance, stream, Subsystem};

/// A change of membership, as an operator or a machine makes it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum MemberOp {
    /// A new node (a spare slot) starts, empty, and joins its region.
    Join {
        /// The node.
        node: usize,
        /// When.
        at_ms: u64,
    },
    /// An operator drains a node (`tally admin drain`): it hands its
    /// partitions away, then leaves.
    Drain {
        /// The node.
        node: usize,
        /// When.
        at_ms: u64,
    },
    /// A node's machine is lost for good (its disk too), and an operator
    /// removes it (`tally admin remove`).
    Remove {
        /// The node.
        node: usize,
        /// When.
        at_ms: u64,
    },
}

impl MemberOp {
    /// The node it changes.
    pub fn node(&self) -> usize {
        match self {
            MemberOp::Join { node, .. }
            | MemberOp::Drain { node, .. }
            | MemberOp::Remove { node, .. } => *node,
        }
    }

    /// When it happens.
    pub fn at_ms(&self) -> u64 {
        match self {
            MemberOp::Join { at_ms, .. }
            | MemberOp::Drain { at_ms, .. }
            | MemberOp::Remove { at_ms, .. } => *at_ms,
        }
    }
}

impl fmt::Display for MemberOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self {
            MemberOp::Join { .. } => "join",
            MemberOp::Drain { .. } => "drain",
            MemberOp::Remove { .. } => "remove",
        };
        write!(f, "{verb} n{} at {}", self.node(), self.at_ms())
    }
}

/// One operation of a partitioned world's plan.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PlanOp {
    /// A network or crash fault (partition, crash, flaky-net).
    Fault(Op),
    /// A membership change.
    Member(MemberOp),
}

impl PlanOp {
    /// When it starts.
    pub fn start_ms(&self) -> u64 {
        match self {
            PlanOp::Fault(op) => op.start_ms(),
            PlanOp::Member(op) => op.at_ms(),
        }
    }

    /// A short kind name (for summaries): `crash-past-dead-after` for a
    /// crash that lasts `dead_after_ms` or longer.
    pub fn kind(&self, dead_after_ms: u64) -> &'static str {
        match self {
            PlanOp::Fault(Op::Crash {
                at_ms,
                restart_at_ms,
                ..
            }) if restart_at_ms.saturating_sub(*at_ms) >= dead_after_ms => "crash-past-dead-after",
            PlanOp::Fault(op) => op.kind(),
            PlanOp::Member(MemberOp::Join { .. }) => "join",
            PlanOp::Member(MemberOp::Drain { .. }) => "drain",
            PlanOp::Member(MemberOp::Remove { .. }) => "remove",
        }
    }
}

impl fmt::Display for PlanOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanOp::Fault(op) => op.fmt(f),
            PlanOp::Member(op) => op.fmt(f),
        }
    }
}

impl FromStr for PlanOp {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let member = |node: usize, at_ms: u64| match words[0] {
            "join" => MemberOp::Join { node, at_ms },
            "drain" => MemberOp::Drain { node, at_ms },
            _ => MemberOp::Remove { node, at_ms },
        };
        match words.first() {
            Some(&("join" | "drain" | "remove")) => {
                let [_, node, at, time] = words[..] else {
                    return Err(format!("expected \"{} nN at MS\", got {line:?}", words[0]));
                };
                let node = node
                    .strip_prefix('n')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("expected a node like n3, got {node:?}"))?;
                if at != "at" {
                    return Err(format!("expected \"at\", got {at:?}"));
                }
                let at_ms = time.parse().map_err(|_| format!("bad time {time:?}"))?;
                Ok(PlanOp::Member(member(node, at_ms)))
            }
            _ => {
                let op: Op = line.parse()?;
                match op {
                    Op::Retire { .. } => Err(format!(
                        "{op}: operator retirements are not modelled in the partitioned world \
                         (a partition that moves away is retired by its writer)"
                    )),
                    op => Ok(PlanOp::Fault(op)),
                }
            }
        }
    }
}

/// A whole plan, in start order.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct PartitionedPlan(pub Vec<PlanOp>);

impl fmt::Display for PartitionedPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, op) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{op}")?;
        }
        Ok(())
    }
}

impl FromStr for PartitionedPlan {
    type Err = String;

    /// Operations separated by `;` or new lines; `#` starts a comment.
    fn from_str(text: &str) -> Result<Self, String> {
        crate::faults::parse_lines(text).map(PartitionedPlan)
    }
}

impl PartitionedPlan {
    /// The plan on one line, `;`-separated (for a replay command).
    pub fn one_line(&self) -> String {
        self.0
            .iter()
            .map(PlanOp::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Checks that every node named exists (as a slot) and that joins name
    /// spare slots.
    pub fn validate(&self, options: &PartitionedOptions) -> Result<(), String> {
        let slots = options.slot_count();
        for op in &self.0 {
            let bad_node = match op {
                PlanOp::Member(MemberOp::Join { node, .. }) => {
                    (*node >= slots || options.is_initial(*node)).then_some(*node)
                }
                PlanOp::Member(op) => (op.node() >= slots).then_some(op.node()),
                PlanOp::Fault(
                    Op::Crash { node, .. } | Op::Pause { node, .. } | Op::Skew { node, .. },
                ) => (*node >= slots).then_some(*node),
                PlanOp::Fault(Op::Partition { shape, .. }) => match shape {
                    Shape::IsolateNode(node) => (*node >= slots).then_some(*node),
                    Shape::Split(a, b) | Shape::OneWay(a, b) => {
                        a.iter().chain(b).find(|n| **n >= slots).copied()
                    }
                    Shape::Bridge(a, bridge, b) => a
                        .iter()
                        .chain(b)
                        .chain([bridge])
                        .find(|n| **n >= slots)
                        .copied(),
                    Shape::IsolateRegion(region) if *region >= options.regions => {
                        return Err(format!("{op}: there are {} regions", options.regions));
                    }
                    Shape::IsolateRegion(_) | Shape::MajoritiesRing => None,
                },
                PlanOp::Fault(_) => None,
            };
            if let Some(node) = bad_node {
                let slots = options.slots_per_region();
                let what = if node < options.slot_count() {
                    "is one of the nodes the cluster starts with and cannot join"
                } else {
                    "is not a node slot of this topology"
                };
                return Err(format!(
                    "{op}: n{node} {what}; each region has {slots} slots, of which the last \
                     {} are spares that a join starts (n{} is the first spare of region 0)",
                    options.spare_per_region, options.nodes_per_region
                ));
            }
        }
        Ok(())
    }

    /// The plan for `seed`: joins of spare slots, drains, at most one
    /// removal, crashes (about half of them past `dead_after`), partitions
    /// and flaky windows, each over before the final heal.
    pub fn generate(seed: u64, options: &PartitionedOptions) -> PartitionedPlan {
        let mut rng = stream(seed, Subsystem::Plan);
        let mut churn = stream(seed, Subsystem::PlanChurn);
        let end = options.duration_ms;
        let mut ops = Vec::new();
        let slots = options.slots_per_region();
        let time = |rng: &mut _, lo: u64, hi: u64| between(rng, end * lo / 100, end * hi / 100);
        if options.membership {
            for region in 0..options.regions {
                for spare in options.nodes_per_region..slots {
                    if chance(&mut rng, 0.6) {
                        let at_ms = time(&mut rng, 5, 60);
                        let node = region * slots + spare;
                        ops.push(PlanOp::Member(MemberOp::Join { node, at_ms }));
                        // A node added for a while: its partitions go back
                        // to the nodes that gave them up, after their slots
                        // there were folded.
                        if chance(&mut churn, 0.4) {
                            let at_ms = at_ms + between(&mut churn, end / 5, end / 3);
                            if at_ms < end {
                                ops.push(PlanOp::Member(MemberOp::Drain { node, at_ms }));
                            }
                        }
                    }
                }
            }
            // Drains and a removal leave each region at least one initial node.
            let mut taken = vec![0usize; options.regions];
            let mut busy = Vec::new();
            for _ in 0..between(&mut rng, 0, 2) {
                let region = between(&mut rng, 0, options.regions as u64 - 1) as usize;
                let node = region * slots
                    + between(&mut rng, 0, options.nodes_per_region as u64 - 1) as usize;
                if taken[region] + 1 >= options.nodes_per_region || busy.contains(&node) {
                    continue;
                }
                taken[region] += 1;
                busy.push(node);
                let at_ms = time(&mut rng, 10, 70);
                let op = if options.faults.wipe && chance(&mut rng, 0.3) {
                    MemberOp::Remove { node, at_ms }
                } else {
                    MemberOp::Drain { node, at_ms }
                };
                ops.push(PlanOp::Member(op));
            }
        }
        let initial: Vec<usize> = (0..options.slot_count())
            .filter(|node| options.is_initial(*node))
            .collect();
        let pick = |rng: &mut _| initial[between(rng, 0, initial.len() as u64 - 1) as usize];
        if options.faults.crash {
            for _ in 0..between(&mut rng, 0, 3) {
                let node = pick(&mut rng);
                let at_ms = time(&mut rng, 5, 70);
                let down = if chance(&mut rng, 0.5) {
                    between(
                        &mut rng,
                        options.dead_after_ms + 200,
                        options.dead_after_ms * 2,
                    )
                } else {
                    between(&mut rng, 100, options.dead_after_ms / 2)
                };
                ops.push(PlanOp::Fault(Op::Crash {
                    node,
                    at_ms,
                    wipe: false,
                    restart_at_ms: (at_ms + down).min(end),
                }));
            }
        }
        if options.faults.partition {
            for _ in 0..between(&mut rng, 0, 2) {
                let shape = match between(&mut rng, 0, 2) {
                    0 => Shape::IsolateNode(pick(&mut rng)),
                    1 => Shape::IsolateRegion(
                        between(&mut rng, 0, options.regions as u64 - 1) as usize
                    ),
                    _ => {
                        // Split one region's slots in two: owners disagree.
                        let region = between(&mut rng, 0, options.regions as u64 - 1) as usize;
                        let cut = between(&mut rng, 1, slots as u64 - 1) as usize;
                        let base = region * slots;
                        Shape::Split(
                            (base..base + cut).collect(),
                            (base + cut..base + slots).collect(),
                        )
                    }
                };
                let at_ms = time(&mut rng, 5, 80);
                let heal_at_ms = (at_ms + between(&mut rng, 300, 4_000)).min(end);
                ops.push(PlanOp::Fault(Op::Partition {
                    shape,
                    at_ms,
                    heal_at_ms,
                }));
            }
        }
        // Pauses (a stopped process: its timers and messages wait, and
        // its callers time out) and clock offsets, from the churn stream.
        if options.faults.pause {
            for _ in 0..between(&mut churn, 0, 2) {
                let node = initial[between(&mut churn, 0, initial.len() as u64 - 1) as usize];
                let at_ms = time(&mut churn, 5, 80);
                let paused = between(&mut churn, 100, options.dead_after_ms * 3 / 2);
                ops.push(PlanOp::Fault(Op::Pause {
                    node,
                    at_ms,
                    resume_at_ms: (at_ms + paused).min(end),
                }));
            }
        }
        if options.faults.skew {
            for &node in &initial {
                if chance(&mut churn, 0.3) {
                    let offset_ms = between(&mut churn, 0, 1_000) as i64 - 500;
                    let at_ms = match chance(&mut churn, 0.5) {
                        true => 0,
                        false => time(&mut churn, 5, 80),
                    };
                    ops.push(PlanOp::Fault(Op::Skew {
                        node,
                        offset_ms,
                        at_ms,
                    }));
                }
            }
        }
        if options.faults.flaky_network() && chance(&mut rng, 0.4) {
            let at_ms = time(&mut rng, 5, 80);
            ops.push(PlanOp::Fault(Op::Flaky {
                loss_pct: if options.faults.loss {
                    between(&mut rng, 5, 20) as u32
                } else {
                    0
                },
                dup_pct: if options.faults.dup {
                    between(&mut rng, 0, 10) as u32
                } else {
                    0
                },
                reorder_pct: if options.faults.reorder {
                    between(&mut rng, 0, 20) as u32
                } else {
                    0
                },
                at_ms,
                until_ms: (at_ms + between(&mut rng, 500, 3_000)).min(end),
            }));
        }
        ops.sort_by_key(PlanOp::start_ms);
        PartitionedPlan(ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_print_and_parse_back() {
        let options = PartitionedOptions::default();
        let mut seen_member = false;
        for seed in 0..40 {
            let plan = PartitionedPlan::generate(seed, &options);
            plan.validate(&options).unwrap();
            seen_member |= plan.0.iter().any(|op| matches!(op, PlanOp::Member(_)));
            let back: PartitionedPlan = plan.one_line().parse().unwrap();
            assert_eq!(back, plan, "seed {seed}");
        }
        assert!(seen_member, "40 seeds planned no membership change");
        let op: PlanOp = "drain n4 at 700".parse().unwrap();
        assert_eq!(
            op,
            PlanOp::Member(MemberOp::Drain {
                node: 4,
                at_ms: 700
            })
        );
        assert!("retire n1 at 2".parse::<PlanOp>().is_err());
        assert!("pause n1 from 1 to 2".parse::<PlanOp>().is_ok());
        assert!("join n0 at 5"
            .parse::<PartitionedPlan>()
            .unwrap()
            .validate(&options)
            .unwrap_err()
            .contains("cannot join"));
    }
}
