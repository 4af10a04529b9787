//! The chaos fault schedule: a value drawn from the seed before the run and
//! printed one fault a line, so a failing run shows a script a person can
//! read. Faults run one after the other; each is undone (restart, SIGCONT,
//! heal) before the next one starts, so the final heal only waits. Faults
//! overlap inside one step: `overlap` partitions the cluster while a node is
//! down and brings the node back inside the partition.
//!
//! With partitioned regions (`--replication-factor`) the menu also changes
//! membership: `join` starts a region's spare node, `drain` drains an active
//! one, `remove` kills one for good and has it removed. The draw keeps a
//! [`Roster`] of who runs, who is drained and who is removed, so that a
//! fault never targets a spare that has not joined or a removed node, a
//! drained node is never wiped (its name has left), and a drain or a removal
//! always leaves `keep_active` nodes of its region active.
//!
//! Times in the schedule are nominal: a restart waits for the node to answer,
//! which shifts what follows. The run prints the actual start of each fault.

use std::fmt;

use anyhow::bail;

use super::links::{Partition, Topology};
use crate::rng::{between, stream, Subsystem};

/// The fault names `--faults` accepts.
pub const FAULT_NAMES: &[&str] = &[
    "kill",
    "stop",
    "cut",
    "partition",
    "wipe",
    "overlap",
    "client",
    "join",
    "drain",
    "remove",
];

/// The faults that change membership: only with partitioned regions.
pub const MEMBERSHIP_FAULTS: &[&str] = &["join", "drain", "remove"];

/// One fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9`, then a restart on the same data directory.
    Kill(usize),
    /// SIGSTOP, then SIGCONT.
    Stop(usize),
    /// `kill -9`, delete the data directory, restart: a new replica.
    Wipe(usize),
    /// Cut the links of a partition shape, then heal them.
    Partition(Partition),
    /// Two faults at once: `kill -9` of `down`; a third of the hold later the
    /// partition `shape` (which may or may not involve `down`); at two thirds
    /// `down` restarts, inside the partition; at the end the partition heals.
    PartitionWhileDown {
        /// The node killed and restarted.
        down: usize,
        /// The partition cut while it is down.
        shape: Partition,
    },
    /// The clients of a node are cut off from it mid-add: their requests
    /// still reach it, but every answer is dropped with its connection, so
    /// the adds apply and the clients do not learn it. Each client retries
    /// with the same idempotency key until it gets an answer.
    CutClients(usize),
    /// A spare node of a region starts for the first time: it joins the
    /// region, and partitions move to it.
    Join(usize),
    /// The node is drained (`Admin.Drain`, asked of another node of its
    /// region): it hands its partitions to the others and leaves.
    Drain(usize),
    /// The node is lost for good: `kill -9`, never restarted, and removed
    /// (`Admin.Remove`, asked of another node of its region once it is seen
    /// down); the others take its partitions from the remaining holders.
    Remove(usize),
}

/// Who runs when the load starts, and what the schedule did to membership
/// so far (see the module documentation).
#[derive(Clone, Debug)]
pub struct Roster {
    /// Per node: running (false: a spare that has not joined yet).
    pub started: Vec<bool>,
    /// Per node: drained by an earlier fault.
    pub drained: Vec<bool>,
    /// Per node: removed by an earlier fault (it runs no more).
    pub removed: Vec<bool>,
    /// A drain leaves at least this many active nodes in its region.
    pub keep_active: usize,
}

impl Roster {
    /// Every node from the start, none drained or removed.
    pub fn all(nodes: usize, keep_active: usize) -> Self {
        Roster {
            started: vec![true; nodes],
            drained: vec![false; nodes],
            removed: vec![false; nodes],
            keep_active,
        }
    }

    fn running(&self) -> Vec<usize> {
        (0..self.started.len())
            .filter(|i| self.started[*i] && !self.removed[*i])
            .collect()
    }

    fn active_in(&self, topology: &Topology, region: usize) -> usize {
        self.running()
            .into_iter()
            .filter(|i| topology.region_of[*i] == region && !self.drained[*i])
            .count()
    }

    /// Whether `node` may leave its region now (drained or removed): it is
    /// active, and its region keeps `keep_active` active nodes without it.
    fn may_leave(&self, topology: &Topology, node: usize) -> bool {
        !self.drained[node] && self.active_in(topology, topology.region_of[node]) > self.keep_active
    }
}

/// A fault with its place in the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledFault {
    /// Nominal start, from the start of the load (ms).
    pub at_ms: u64,
    /// Quiet time before it starts (ms).
    pub gap_ms: u64,
    /// How long it holds before it is undone (ms).
    pub hold_ms: u64,
    /// What.
    pub fault: Fault,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill(node) => write!(f, "kill -9 n{node}, restart on its disk"),
            Fault::Stop(node) => write!(f, "SIGSTOP n{node}, then SIGCONT"),
            Fault::Wipe(node) => write!(f, "wipe n{node}: kill -9, delete its data, restart"),
            Fault::Partition(shape) => write!(f, "partition {shape}"),
            Fault::PartitionWhileDown { down, shape } => write!(
                f,
                "overlap: kill -9 n{down}, partition {shape} while it is down, restart it inside the partition"
            ),
            Fault::CutClients(node) => {
                write!(f, "cut n{node}'s clients off mid-add (answers dropped)")
            }
            Fault::Join(node) => write!(f, "join: start spare n{node}, a new node of its region"),
            Fault::Drain(node) => write!(f, "drain n{node}: it hands its partitions away and leaves"),
            Fault::Remove(node) => write!(
                f,
                "remove n{node}: kill -9 for good, then tally admin remove it"
            ),
        }
    }
}

impl fmt::Display for ScheduledFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at {:6.1} s: {} for {} ms",
            self.at_ms as f64 / 1000.0,
            self.fault,
            self.hold_ms
        )
    }
}

/// Parses `--faults` (a comma list of [`FAULT_NAMES`]).
pub fn parse_faults(text: &str) -> anyhow::Result<Vec<String>> {
    let faults: Vec<String> = text
        .split(',')
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty() && f != "none")
        .collect();
    for fault in &faults {
        if !FAULT_NAMES.contains(&fault.as_str()) {
            bail!(
                "unknown chaos fault {fault:?}: use a comma list of {}",
                FAULT_NAMES.join(", ")
            );
        }
    }
    Ok(faults)
}

/// Draws the schedule for `duration_ms` of load, starting from `roster`.
pub fn draw(
    seed: u64,
    faults: &[String],
    topology: &Topology,
    mut roster: Roster,
    duration_ms: u64,
) -> Vec<ScheduledFault> {
    let mut rng = stream(seed, Subsystem::Plan);
    let n = topology.nodes();
    let mut schedule = Vec::new();
    let mut now = 0;
    if faults.is_empty() || n == 0 {
        return schedule;
    }
    // Draws that found no target in a row (every spare joined, no node
    // left to drain): the menu is exhausted.
    let mut misses = 0;
    while misses < 1_000 {
        misses += 1;
        let gap_ms = between(&mut rng, 500, 2_000);
        let name = faults[between(&mut rng, 0, faults.len() as u64 - 1) as usize].as_str();
        let running = roster.running();
        if running.is_empty() {
            return schedule;
        }
        let target = running[between(&mut rng, 0, running.len() as u64 - 1) as usize];
        let (fault, hold_ms) = match name {
            "kill" => (Fault::Kill(target), between(&mut rng, 300, 3_000)),
            "stop" => (Fault::Stop(target), between(&mut rng, 300, 3_000)),
            "wipe" if !roster.drained[target] => {
                (Fault::Wipe(target), between(&mut rng, 300, 1_500))
            }
            "cut" if n >= 2 => (
                Fault::Partition(Partition::IsolateNode(target)),
                between(&mut rng, 300, 3_000),
            ),
            "partition" => match Partition::draw(&mut rng, topology) {
                Some(shape) => (Fault::Partition(shape), between(&mut rng, 1_000, 5_000)),
                None => continue,
            },
            "overlap" => match Partition::draw(&mut rng, topology) {
                Some(shape) => (
                    Fault::PartitionWhileDown {
                        down: target,
                        shape,
                    },
                    between(&mut rng, 1_500, 4_500),
                ),
                None => continue,
            },
            "client" => (Fault::CutClients(target), between(&mut rng, 300, 3_000)),
            "join" => {
                let spares: Vec<usize> = (0..n).filter(|i| !roster.started[*i]).collect();
                if spares.is_empty() {
                    continue;
                }
                let spare = spares[between(&mut rng, 0, spares.len() as u64 - 1) as usize];
                roster.started[spare] = true;
                (Fault::Join(spare), between(&mut rng, 1_000, 3_000))
            }
            "drain" => {
                if !roster.may_leave(topology, target) {
                    continue;
                }
                roster.drained[target] = true;
                (Fault::Drain(target), between(&mut rng, 1_000, 3_000))
            }
            "remove" => {
                if !roster.may_leave(topology, target) {
                    continue;
                }
                roster.removed[target] = true;
                (Fault::Remove(target), between(&mut rng, 1_000, 3_000))
            }
            _ => continue,
        };
        misses = 0;
        if now + gap_ms >= duration_ms {
            return schedule;
        }
        now += gap_ms;
        schedule.push(ScheduledFault {
            at_ms: now,
            gap_ms,
            hold_ms,
            fault,
        });
        now += hold_ms;
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node runs from the start; no spare, no drain.
    fn all(nodes: usize) -> Roster {
        Roster::all(nodes, usize::MAX)
    }

    #[test]
    fn a_schedule_is_a_function_of_the_seed_and_fits_the_duration() {
        let faults = parse_faults("kill,stop,cut,partition,wipe").unwrap();
        let topology = Topology::new(2, 2);
        let one = draw(5, &faults, &topology, all(4), 20_000);
        assert_eq!(one, draw(5, &faults, &topology, all(4), 20_000));
        assert!(!one.is_empty());
        assert!(one.iter().all(|f| f.at_ms < 20_000));
        let partitions = parse_faults("partition").unwrap();
        assert!(draw(5, &partitions, &topology, all(4), 20_000)
            .iter()
            .all(|f| matches!(f.fault, Fault::Partition(_))));
    }

    #[test]
    fn overlapping_and_client_faults_are_drawn_and_printed() {
        let faults = parse_faults("overlap,client").unwrap();
        let topology = Topology::new(3, 1);
        let schedule = draw(3, &faults, &topology, all(3), 30_000);
        assert!(schedule
            .iter()
            .any(|f| matches!(f.fault, Fault::PartitionWhileDown { .. })));
        assert!(schedule
            .iter()
            .any(|f| matches!(f.fault, Fault::CutClients(_))));
        let text: Vec<String> = schedule.iter().map(|f| f.to_string()).collect();
        assert!(
            text.iter().any(|line| line.contains("while it is down")),
            "{text:?}"
        );
        // One node: nothing to partition, but its clients can be cut off.
        let alone = draw(3, &faults, &Topology::new(1, 1), all(1), 30_000);
        assert!(alone
            .iter()
            .all(|f| matches!(f.fault, Fault::CutClients(0))));
    }

    #[test]
    fn membership_faults_respect_the_roster() {
        // Two regions of three nodes and a spare (nodes 3 and 7).
        let topology = Topology::new(2, 4);
        let faults = parse_faults("kill,stop,wipe,client,join,drain,remove").unwrap();
        let (mut joins_and_drains, mut removals) = (0, 0);
        for seed in 0..50 {
            let mut roster = Roster {
                started: (0..8).map(|i| i % 4 != 3).collect(),
                ..Roster::all(8, 2)
            };
            let schedule = draw(seed, &faults, &topology, roster.clone(), 60_000);
            for step in &schedule {
                let touches = match step.fault {
                    Fault::Kill(n) | Fault::Stop(n) | Fault::Wipe(n) | Fault::CutClients(n) => {
                        assert!(
                            !roster.removed[n],
                            "seed {seed}: {} after its removal",
                            step.fault
                        );
                        n
                    }
                    Fault::Join(n) => {
                        assert!(!roster.started[n], "seed {seed}: n{n} joins twice");
                        roster.started[n] = true;
                        joins_and_drains += 1;
                        n
                    }
                    Fault::Drain(n) => {
                        assert!(!roster.drained[n], "seed {seed}: n{n} drained twice");
                        roster.drained[n] = true;
                        let region = topology.region_of[n];
                        assert!(
                            roster.active_in(&topology, region) >= 2,
                            "seed {seed}: a drain left fewer than 2 active nodes"
                        );
                        joins_and_drains += 1;
                        n
                    }
                    Fault::Remove(n) => {
                        assert!(
                            !roster.removed[n] && !roster.drained[n],
                            "seed {seed}: n{n} removed after it left"
                        );
                        roster.removed[n] = true;
                        let region = topology.region_of[n];
                        assert!(
                            roster.active_in(&topology, region) >= 2,
                            "seed {seed}: a removal left fewer than 2 active nodes"
                        );
                        removals += 1;
                        n
                    }
                    _ => continue,
                };
                assert!(
                    roster.started[touches],
                    "seed {seed}: {} before its join",
                    step.fault
                );
                if let Fault::Wipe(n) = step.fault {
                    assert!(!roster.drained[n], "seed {seed}: wipe of drained n{n}");
                }
            }
        }
        assert!(joins_and_drains > 50, "{joins_and_drains}");
        assert!(removals > 10, "{removals}");
        // Only membership faults, all spent: the schedule ends.
        let spent = draw(1, &parse_faults("join").unwrap(), &topology, all(8), 60_000);
        assert!(spent.is_empty());
    }

    #[test]
    fn unknown_faults_are_refused_by_name() {
        let err = parse_faults("kill,explode").unwrap_err().to_string();
        assert!(
            err.contains("explode") && err.contains("partition"),
            "{err}"
        );
        assert!(parse_faults("none").unwrap().is_empty());
    }
}
