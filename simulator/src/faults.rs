//! The fault plan: a value (`Vec<Op>`) generated from the seed, printed one
//! operation a line, parsed back and replayed.
//!
//! Invariant: a plan is data. The simulator applies exactly the plan's
//! operations (plus the final heal at the end of the run), so a printed plan,
//! fed back with `--plan`, replays the same faults; the shrinker removes
//! operations from it and nothing else.

use std::fmt;
use std::str::FromStr;

use crate::options::SimOptions;
use crate::rng::{between, chance, stream, SimRng, Subsystem};

/// Which links a partition cuts.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Shape {
    /// One node against the rest.
    IsolateNode(usize),
    /// One region against the rest.
    IsolateRegion(usize),
    /// Two groups that cannot talk to each other.
    Split(Vec<usize>, Vec<usize>),
    /// Each node reaches only its ring neighbours within distance
    /// `max(1, N / 4)` (every node sees a different majority, for N >= 4).
    MajoritiesRing,
    /// Two groups that only the bridge node reaches both of.
    Bridge(Vec<usize>, usize, Vec<usize>),
    /// Messages from the first group to the second are dropped; the other
    /// direction works.
    OneWay(Vec<usize>, Vec<usize>),
}

impl Shape {
    /// True when a message from `from` to `to` is dropped.
    pub fn blocks(&self, from: usize, to: usize, options: &SimOptions) -> bool {
        if from == to {
            return false;
        }
        match self {
            Shape::IsolateNode(node) => (from == *node) != (to == *node),
            Shape::IsolateRegion(region) => {
                (options.region_of(from) == *region) != (options.region_of(to) == *region)
            }
            Shape::Split(left, right) => {
                (left.contains(&from) && right.contains(&to))
                    || (right.contains(&from) && left.contains(&to))
            }
            Shape::MajoritiesRing => {
                let n = options.node_count();
                let distance = from.abs_diff(to).min(n - from.abs_diff(to));
                distance > (n / 4).max(1)
            }
            Shape::Bridge(left, _, right) => {
                (left.contains(&from) && right.contains(&to))
                    || (right.contains(&from) && left.contains(&to))
            }
            Shape::OneWay(senders, receivers) => senders.contains(&from) && receivers.contains(&to),
        }
    }
}

/// One fault operation. Times are simulated milliseconds from the start.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Op {
    /// Cut links from `at_ms` to `heal_at_ms`.
    Partition {
        /// Which links.
        shape: Shape,
        /// Start.
        at_ms: u64,
        /// End.
        heal_at_ms: u64,
    },
    /// Kill a node; with `wipe` its disk is lost and it restarts as a new replica.
    Crash {
        /// The node.
        node: usize,
        /// When.
        at_ms: u64,
        /// Whether the disk is wiped.
        wipe: bool,
        /// When it starts again.
        restart_at_ms: u64,
    },
    /// Stop a node's process (SIGSTOP) and resume it (SIGCONT).
    Pause {
        /// The node.
        node: usize,
        /// When it stops.
        at_ms: u64,
        /// When it resumes.
        resume_at_ms: u64,
    },
    /// From `at_ms` on, the node's clock is off by `offset_ms`.
    Skew {
        /// The node.
        node: usize,
        /// The offset added to the time the node hands its core.
        offset_ms: i64,
        /// When.
        at_ms: u64,
    },
    /// A flaky network between `at_ms` and `until_ms`: each message between
    /// nodes is lost, duplicated or delayed (reordered) with these percentages.
    Flaky {
        /// Loss, percent.
        loss_pct: u32,
        /// Duplication, percent.
        dup_pct: u32,
        /// Reordering (an extra delay of up to three times the latency), percent.
        reorder_pct: u32,
        /// Start.
        at_ms: u64,
        /// End.
        until_ms: u64,
    },
    /// An operator retires a stopped node (`tally admin retire`, sent to a
    /// running node), having wiped its data directory first as the docs
    /// ask: the node comes back with a new id. Refused, changing nothing,
    /// while the cluster still sees the node up (only with `--retire`).
    Retire {
        /// The node whose current id is retired.
        node: usize,
        /// When.
        at_ms: u64,
    },
}

impl Op {
    /// When the operation starts.
    pub fn start_ms(&self) -> u64 {
        match self {
            Op::Partition { at_ms, .. }
            | Op::Crash { at_ms, .. }
            | Op::Pause { at_ms, .. }
            | Op::Skew { at_ms, .. }
            | Op::Flaky { at_ms, .. }
            | Op::Retire { at_ms, .. } => *at_ms,
        }
    }

    /// When it ends (the start, for an instant operation).
    pub fn end_ms(&self) -> u64 {
        match self {
            Op::Partition { heal_at_ms, .. } => *heal_at_ms,
            Op::Crash { restart_at_ms, .. } => *restart_at_ms,
            Op::Pause { resume_at_ms, .. } => *resume_at_ms,
            Op::Skew { at_ms, .. } | Op::Retire { at_ms, .. } => *at_ms,
            Op::Flaky { until_ms, .. } => *until_ms,
        }
    }

    /// A short kind name (for reports).
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Partition { .. } => "partition",
            Op::Crash { wipe: false, .. } => "crash",
            Op::Crash { wipe: true, .. } => "crash-wipe",
            Op::Pause { .. } => "pause",
            Op::Skew { .. } => "skew",
            Op::Flaky { .. } => "flaky-net",
            Op::Retire { .. } => "retire",
        }
    }
}

/// `n1,n2,...`: a list of nodes as plans and schedules print it.
pub(crate) fn nodes(list: &[usize]) -> String {
    list.iter()
        .map(|n| format!("n{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::IsolateNode(node) => write!(f, "isolate-node n{node}"),
            Shape::IsolateRegion(region) => write!(f, "isolate-region r{region}"),
            Shape::Split(left, right) => write!(f, "split {}|{}", nodes(left), nodes(right)),
            Shape::MajoritiesRing => write!(f, "majorities-ring"),
            Shape::Bridge(left, bridge, right) => {
                write!(f, "bridge {}|n{bridge}|{}", nodes(left), nodes(right))
            }
            Shape::OneWay(from, to) => write!(f, "one-way {}->{}", nodes(from), nodes(to)),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Partition {
                shape,
                at_ms,
                heal_at_ms,
            } => write!(f, "partition {shape} from {at_ms} to {heal_at_ms}"),
            Op::Crash {
                node,
                at_ms,
                wipe,
                restart_at_ms,
            } => {
                let verb = if *wipe { "crash-wipe" } else { "crash" };
                write!(f, "{verb} n{node} at {at_ms} restart {restart_at_ms}")
            }
            Op::Pause {
                node,
                at_ms,
                resume_at_ms,
            } => write!(f, "pause n{node} from {at_ms} to {resume_at_ms}"),
            Op::Skew {
                node,
                offset_ms,
                at_ms,
            } => write!(f, "skew n{node} {offset_ms:+} at {at_ms}"),
            Op::Flaky {
                loss_pct,
                dup_pct,
                reorder_pct,
                at_ms,
                until_ms,
            } => write!(
                f,
                "flaky-net loss {loss_pct}% dup {dup_pct}% reorder {reorder_pct}% from {at_ms} to {until_ms}"
            ),
            Op::Retire { node, at_ms } => write!(f, "retire n{node} at {at_ms}"),
        }
    }
}

/// A whole plan: operations in start order.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct FaultPlan(pub Vec<Op>);

impl fmt::Display for FaultPlan {
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

impl FaultPlan {
    /// The plan on one line, `;`-separated (for a replay command).
    pub fn one_line(&self) -> String {
        self.0
            .iter()
            .map(Op::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn parse_node(word: &str) -> Result<usize, String> {
    word.strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("expected a node like n3, got {word:?}"))
}

fn parse_nodes(text: &str) -> Result<Vec<usize>, String> {
    text.split(',').map(parse_node).collect()
}

fn parse_num<T: FromStr>(word: Option<&str>, what: &str) -> Result<T, String> {
    let word = word.ok_or_else(|| format!("missing {what}"))?;
    word.trim_end_matches('%')
        .parse()
        .map_err(|_| format!("bad {what}: {word:?}"))
}

fn expect(word: Option<&str>, wanted: &str) -> Result<(), String> {
    match word {
        Some(word) if word == wanted => Ok(()),
        other => Err(format!("expected {wanted:?}, got {other:?}")),
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        let verb = words.next().ok_or("empty operation")?;
        let op = match verb {
            "partition" => {
                let shape = match words.next().ok_or("missing partition shape")? {
                    "isolate-node" => {
                        Shape::IsolateNode(parse_node(words.next().ok_or("missing node")?)?)
                    }
                    "isolate-region" => Shape::IsolateRegion(
                        words
                            .next()
                            .and_then(|r| r.strip_prefix('r'))
                            .and_then(|r| r.parse().ok())
                            .ok_or("expected a region like r1")?,
                    ),
                    "split" => {
                        let groups = words.next().ok_or("missing groups")?;
                        let (left, right) = groups.split_once('|').ok_or("expected a|b")?;
                        Shape::Split(parse_nodes(left)?, parse_nodes(right)?)
                    }
                    "majorities-ring" => Shape::MajoritiesRing,
                    "bridge" => {
                        let groups: Vec<&str> =
                            words.next().ok_or("missing groups")?.split('|').collect();
                        if groups.len() != 3 {
                            return Err("expected left|bridge|right".into());
                        }
                        Shape::Bridge(
                            parse_nodes(groups[0])?,
                            parse_node(groups[1])?,
                            parse_nodes(groups[2])?,
                        )
                    }
                    "one-way" => {
                        let groups = words.next().ok_or("missing groups")?;
                        let (from, to) = groups.split_once("->").ok_or("expected a->b")?;
                        Shape::OneWay(parse_nodes(from)?, parse_nodes(to)?)
                    }
                    other => return Err(format!("unknown partition shape {other:?}")),
                };
                expect(words.next(), "from")?;
                let at_ms = parse_num(words.next(), "start")?;
                expect(words.next(), "to")?;
                let heal_at_ms = parse_num(words.next(), "end")?;
                Op::Partition {
                    shape,
                    at_ms,
                    heal_at_ms,
                }
            }
            "crash" | "crash-wipe" => {
                let node = parse_node(words.next().ok_or("missing node")?)?;
                expect(words.next(), "at")?;
                let at_ms = parse_num(words.next(), "time")?;
                expect(words.next(), "restart")?;
                let restart_at_ms = parse_num(words.next(), "restart time")?;
                Op::Crash {
                    node,
                    at_ms,
                    wipe: verb == "crash-wipe",
                    restart_at_ms,
                }
            }
            "pause" => {
                let node = parse_node(words.next().ok_or("missing node")?)?;
                expect(words.next(), "from")?;
                let at_ms = parse_num(words.next(), "start")?;
                expect(words.next(), "to")?;
                let resume_at_ms = parse_num(words.next(), "end")?;
                Op::Pause {
                    node,
                    at_ms,
                    resume_at_ms,
                }
            }
            "skew" => {
                let node = parse_node(words.next().ok_or("missing node")?)?;
                let offset_ms =
                    parse_num(words.next().map(|w| w.trim_start_matches('+')), "offset")?;
                expect(words.next(), "at")?;
                let at_ms = parse_num(words.next(), "time")?;
                Op::Skew {
                    node,
                    offset_ms,
                    at_ms,
                }
            }
            "flaky-net" => {
                expect(words.next(), "loss")?;
                let loss_pct = parse_num(words.next(), "loss")?;
                expect(words.next(), "dup")?;
                let dup_pct = parse_num(words.next(), "dup")?;
                expect(words.next(), "reorder")?;
                let reorder_pct = parse_num(words.next(), "reorder")?;
                expect(words.next(), "from")?;
                let at_ms = parse_num(words.next(), "start")?;
                expect(words.next(), "to")?;
                let until_ms = parse_num(words.next(), "end")?;
                Op::Flaky {
                    loss_pct,
                    dup_pct,
                    reorder_pct,
                    at_ms,
                    until_ms,
                }
            }
            "retire" => {
                let node = parse_node(words.next().ok_or("missing node")?)?;
                expect(words.next(), "at")?;
                let at_ms = parse_num(words.next(), "time")?;
                Op::Retire { node, at_ms }
            }
            other => return Err(format!("unknown operation {other:?}")),
        };
        if let Some(extra) = words.next() {
            return Err(format!("unexpected {extra:?} at the end of {line:?}"));
        }
        Ok(op)
    }
}

/// The operations of a plan's text: separated by `;` or new lines, `#`
/// starting a comment; an error names the line that does not parse.
pub(crate) fn parse_lines<T: FromStr<Err = String>>(text: &str) -> Result<Vec<T>, String> {
    let mut ops = Vec::new();
    for line in text.split(['\n', ';']) {
        let line = line.split('#').next().unwrap_or("").trim();
        if !line.is_empty() {
            ops.push(line.parse().map_err(|e| format!("{line:?}: {e}"))?);
        }
    }
    Ok(ops)
}

impl FromStr for FaultPlan {
    type Err = String;

    /// Operations separated by `;` or new lines; `#` starts a comment.
    fn from_str(text: &str) -> Result<Self, String> {
        parse_lines(text).map(FaultPlan)
    }
}

impl FaultPlan {
    /// Checks that every node and region named exists.
    pub fn validate(&self, options: &SimOptions) -> Result<(), String> {
        let n = options.node_count();
        let node_ok = |node: &usize| *node < n;
        for op in &self.0 {
            let ok = match op {
                Op::Partition { shape, .. } => match shape {
                    Shape::IsolateNode(node) => node_ok(node),
                    Shape::IsolateRegion(region) => *region < options.regions,
                    Shape::Split(a, b) | Shape::OneWay(a, b) => a.iter().chain(b).all(node_ok),
                    Shape::Bridge(a, bridge, b) => {
                        node_ok(bridge) && a.iter().chain(b).all(node_ok)
                    }
                    Shape::MajoritiesRing => true,
                },
                Op::Crash { node, .. }
                | Op::Pause { node, .. }
                | Op::Skew { node, .. }
                | Op::Retire { node, .. } => node_ok(node),
                Op::Flaky { .. } => true,
            };
            if !ok {
                return Err(format!("{op}: names a node or region this topology lacks"));
            }
        }
        Ok(())
    }

    /// The plan for `seed`: operations of the switched-on kinds, spread over
    /// the run, each over before the final heal.
    pub fn generate(seed: u64, options: &SimOptions) -> FaultPlan {
        let mut rng = stream(seed, Subsystem::Plan);
        let faults = options.faults;
        let mut kinds: Vec<&str> = Vec::new();
        if faults.partition {
            kinds.push("partition");
        }
        if faults.crash {
            kinds.push("crash");
        }
        if faults.wipe {
            kinds.push("wipe");
        }
        if faults.pause {
            kinds.push("pause");
        }
        if faults.flaky_network() {
            kinds.push("flaky");
        }
        let n = options.node_count();
        let end = options.duration_ms;
        let mut ops = Vec::new();
        if faults.skew {
            for node in 0..n {
                if chance(&mut rng, 0.5) {
                    let offset = between(&mut rng, 0, 1_000) as i64 - 500;
                    let at_ms = if chance(&mut rng, 0.5) {
                        0
                    } else {
                        between(&mut rng, 0, end)
                    };
                    ops.push(Op::Skew {
                        node,
                        offset_ms: offset,
                        at_ms,
                    });
                }
            }
        }
        let count = if kinds.is_empty() {
            0
        } else {
            let expected = options.fault_rate as u64 * end / 60_000;
            between(&mut rng, expected / 2, expected + expected / 2).max(1)
        };
        for _ in 0..count {
            let kind = kinds[between(&mut rng, 0, kinds.len() as u64 - 1) as usize];
            let at_ms = between(&mut rng, 500, end.saturating_sub(500).max(500));
            let length =
                |rng: &mut SimRng, lo: u64, hi: u64| (at_ms + between(rng, lo, hi)).min(end);
            let node = between(&mut rng, 0, n as u64 - 1) as usize;
            let op = match kind {
                "partition" => Op::Partition {
                    shape: random_shape(&mut rng, options),
                    at_ms,
                    heal_at_ms: length(&mut rng, 500, 8_000),
                },
                "crash" | "wipe" => Op::Crash {
                    node,
                    at_ms,
                    wipe: kind == "wipe",
                    restart_at_ms: length(&mut rng, 50, 4_000),
                },
                "pause" => Op::Pause {
                    node,
                    at_ms,
                    resume_at_ms: length(&mut rng, 100, 4_000),
                },
                _ => {
                    let pct = |rng: &mut SimRng, on: bool, hi: u64| {
                        if on {
                            between(rng, 1, hi) as u32
                        } else {
                            0
                        }
                    };
                    Op::Flaky {
                        loss_pct: pct(&mut rng, faults.loss, 30),
                        dup_pct: pct(&mut rng, faults.dup, 20),
                        reorder_pct: pct(&mut rng, faults.reorder, 40),
                        at_ms,
                        until_ms: length(&mut rng, 1_000, 10_000),
                    }
                }
            };
            ops.push(op);
        }
        if options.retire {
            // An operator retires some stopped nodes while they are down
            // (sometimes too early, while the cluster still sees them up).
            let crashes: Vec<(usize, u64, u64)> = ops
                .iter()
                .filter_map(|op| match op {
                    Op::Crash {
                        node,
                        at_ms,
                        restart_at_ms,
                        ..
                    } => Some((*node, *at_ms, *restart_at_ms)),
                    _ => None,
                })
                .collect();
            for (node, at_ms, restart_at_ms) in crashes {
                if chance(&mut rng, 0.4) {
                    ops.push(Op::Retire {
                        node,
                        at_ms: between(&mut rng, at_ms, restart_at_ms),
                    });
                }
            }
        }
        ops.sort_by_key(|op| (op.start_ms(), op.end_ms()));
        FaultPlan(ops)
    }
}

fn random_shape(rng: &mut SimRng, options: &SimOptions) -> Shape {
    let n = options.node_count();
    let mut order: Vec<usize> = (0..n).collect();
    // A seeded shuffle (Fisher-Yates).
    for i in (1..n).rev() {
        let j = between(rng, 0, i as u64) as usize;
        order.swap(i, j);
    }
    let half = (n / 2).max(1);
    match between(rng, 0, 5) {
        0 => Shape::IsolateNode(order[0]),
        1 if options.regions > 1 => {
            Shape::IsolateRegion(between(rng, 0, options.regions as u64 - 1) as usize)
        }
        2 if n >= 2 => {
            let mut left = order[..half].to_vec();
            let mut right = order[half..].to_vec();
            left.sort_unstable();
            right.sort_unstable();
            Shape::Split(left, right)
        }
        3 if n >= 4 => Shape::MajoritiesRing,
        4 if n >= 3 => {
            let bridge = order[0];
            let rest = &order[1..];
            let cut = (rest.len() / 2).max(1);
            let mut left = rest[..cut].to_vec();
            let mut right = rest[cut..].to_vec();
            left.sort_unstable();
            right.sort_unstable();
            Shape::Bridge(left, bridge, right)
        }
        5 if n >= 2 => {
            let mut from = order[..half].to_vec();
            let mut to = order[half..].to_vec();
            from.sort_unstable();
            to.sort_unstable();
            Shape::OneWay(from, to)
        }
        _ => Shape::IsolateNode(order[0]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_plan_prints_and_parses_back() {
        for retire in [false, true] {
            let options = SimOptions {
                regions: 3,
                nodes_per_region: 2,
                retire,
                ..Default::default()
            };
            let mut retirements = 0;
            for seed in 0..50 {
                let plan = FaultPlan::generate(seed, &options);
                let parsed: FaultPlan = plan.to_string().parse().unwrap();
                assert_eq!(parsed, plan);
                let one_line: FaultPlan = plan.one_line().parse().unwrap();
                assert_eq!(one_line, plan);
                plan.validate(&options).unwrap();
                assert!(plan.0.iter().all(|op| op.end_ms() <= options.duration_ms));
                retirements += plan.0.iter().filter(|op| op.kind() == "retire").count();
            }
            assert_eq!(
                retirements > 0,
                retire,
                "retire operations only with --retire"
            );
        }
    }

    #[test]
    fn retirements_leave_the_other_operations_as_they_were() {
        let options = SimOptions::default();
        let retiring = SimOptions {
            retire: true,
            ..SimOptions::default()
        };
        for seed in 0..20 {
            let plain = FaultPlan::generate(seed, &options);
            let mut with = FaultPlan::generate(seed, &retiring);
            with.0.retain(|op| op.kind() != "retire");
            assert_eq!(with, plain, "seed {seed}");
        }
    }

    #[test]
    fn shapes_block_the_right_links() {
        let options = SimOptions {
            regions: 2,
            nodes_per_region: 2,
            ..Default::default()
        };
        let one_way = Shape::OneWay(vec![0], vec![1, 2]);
        assert!(one_way.blocks(0, 1, &options) && !one_way.blocks(1, 0, &options));
        let region = Shape::IsolateRegion(1);
        assert!(region.blocks(0, 2, &options) && !region.blocks(2, 3, &options));
        let bridge = Shape::Bridge(vec![0], 1, vec![2, 3]);
        assert!(bridge.blocks(0, 2, &options) && !bridge.blocks(0, 1, &options));
        assert!(!bridge.blocks(1, 3, &options));
        let ring = Shape::MajoritiesRing;
        assert!(!ring.blocks(0, 1, &options) && ring.blocks(0, 2, &options));
        assert!(!ring.blocks(0, 3, &options), "the ring wraps around");
        assert!("partition sideways n1 from 1 to 2".parse::<Op>().is_err());
    }
}
