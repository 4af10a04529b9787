//! The chaos fault schedule: a value drawn from the seed before the run and
//! printed one fault a line, so a failing run shows a script a person can
//! read. Faults run one after the other; each is undone (restart, SIGCONT,
//! heal) before the next one starts, so the final heal only waits. Faults
//! overlap inside one step: `overlap` partitions the cluster while a node is
//! down and brings the node back inside the partition.
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
];

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

/// Draws the schedule for `duration_ms` of load.
pub fn draw(
    seed: u64,
    faults: &[String],
    topology: &Topology,
    duration_ms: u64,
) -> Vec<ScheduledFault> {
    let mut rng = stream(seed, Subsystem::Plan);
    let n = topology.nodes();
    let mut schedule = Vec::new();
    let mut now = 0;
    if faults.is_empty() || n == 0 {
        return schedule;
    }
    loop {
        let gap_ms = between(&mut rng, 500, 2_000);
        let name = faults[between(&mut rng, 0, faults.len() as u64 - 1) as usize].as_str();
        let target = between(&mut rng, 0, n as u64 - 1) as usize;
        let (fault, hold_ms) = match name {
            "kill" => (Fault::Kill(target), between(&mut rng, 300, 3_000)),
            "stop" => (Fault::Stop(target), between(&mut rng, 300, 3_000)),
            "wipe" => (Fault::Wipe(target), between(&mut rng, 300, 1_500)),
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
            _ => continue,
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_a_function_of_the_seed_and_fits_the_duration() {
        let faults = parse_faults("kill,stop,cut,partition,wipe").unwrap();
        let topology = Topology::new(2, 2);
        let one = draw(5, &faults, &topology, 20_000);
        assert_eq!(one, draw(5, &faults, &topology, 20_000));
        assert!(!one.is_empty());
        assert!(one.iter().all(|f| f.at_ms < 20_000));
        let partitions = parse_faults("partition").unwrap();
        assert!(draw(5, &partitions, &topology, 20_000)
            .iter()
            .all(|f| matches!(f.fault, Fault::Partition(_))));
    }

    #[test]
    fn overlapping_and_client_faults_are_drawn_and_printed() {
        let faults = parse_faults("overlap,client").unwrap();
        let topology = Topology::new(3, 1);
        let schedule = draw(3, &faults, &topology, 30_000);
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
        let alone = draw(3, &faults, &Topology::new(1, 1), 30_000);
        assert!(alone
            .iter()
            .all(|f| matches!(f.fault, Fault::CutClients(0))));
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
