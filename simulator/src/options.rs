//! The options of one simulated run: topology, timings, workload, which faults
//! are switched on, and (in test builds) a planted bug.
//!
//! Invariant: the options and the seed determine the run. [`SimOptions::to_args`]
//! prints exactly the flags that differ from the defaults, so a failing run's
//! replay command (`tally-sim run --seed S <flags>`) reproduces it.

use std::fmt;
use std::str::FromStr;

/// The faults a run may inject, each switchable on the command line.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FaultSet {
    /// Network partitions of every shape.
    pub partition: bool,
    /// Crashes that keep the disk (unflushed writes are lost).
    pub crash: bool,
    /// Crashes that wipe the disk (a new replica id).
    pub wipe: bool,
    /// Pauses (the process stops, then resumes).
    pub pause: bool,
    /// Per-node clock offsets.
    pub skew: bool,
    /// Message loss windows.
    pub loss: bool,
    /// Message duplication windows.
    pub dup: bool,
    /// Message reordering windows (extra random delay).
    pub reorder: bool,
    /// Heavy-tailed WAN latency and fsync delays.
    pub tail: bool,
}

/// Every fault's name, in the order they print.
pub const FAULT_NAMES: [&str; 9] = [
    "partition",
    "crash",
    "wipe",
    "pause",
    "skew",
    "loss",
    "dup",
    "reorder",
    "tail",
];

impl FaultSet {
    /// Every fault on.
    pub fn all() -> Self {
        FaultSet {
            partition: true,
            crash: true,
            wipe: true,
            pause: true,
            skew: true,
            loss: true,
            dup: true,
            reorder: true,
            tail: true,
        }
    }

    fn flags(&self) -> [bool; 9] {
        [
            self.partition,
            self.crash,
            self.wipe,
            self.pause,
            self.skew,
            self.loss,
            self.dup,
            self.reorder,
            self.tail,
        ]
    }

    fn flag_mut(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "partition" => &mut self.partition,
            "crash" => &mut self.crash,
            "wipe" => &mut self.wipe,
            "pause" => &mut self.pause,
            "skew" => &mut self.skew,
            "loss" => &mut self.loss,
            "dup" => &mut self.dup,
            "reorder" => &mut self.reorder,
            "tail" => &mut self.tail,
            _ => return None,
        })
    }

    /// True when any message-level fault (loss, duplication, reordering) is on.
    pub fn flaky_network(&self) -> bool {
        self.loss || self.dup || self.reorder
    }
}

impl fmt::Display for FaultSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<&str> = FAULT_NAMES
            .iter()
            .zip(self.flags())
            .filter(|(_, on)| *on)
            .map(|(name, _)| *name)
            .collect();
        if on.is_empty() {
            write!(f, "none")
        } else if on.len() == FAULT_NAMES.len() {
            write!(f, "all")
        } else {
            write!(f, "{}", on.join(","))
        }
    }
}

impl FromStr for FaultSet {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "all" => return Ok(FaultSet::all()),
            "none" | "" => return Ok(FaultSet::default()),
            _ => {}
        }
        let mut set = FaultSet::default();
        for name in text.split(',').map(str::trim) {
            let (name, on) = match name.strip_prefix('-') {
                Some(rest) => (rest, false),
                None => (name, true),
            };
            if name == "all" {
                set = FaultSet::all();
                continue;
            }
            *set.flag_mut(name).ok_or_else(|| {
                format!(
                    "unknown fault {name:?}: use all, none, or a comma list of {}",
                    FAULT_NAMES.join(", ")
                )
            })? = on;
        }
        Ok(set)
    }
}

/// A bug to plant in the replica core (needs the `planted-bugs` feature).
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum BugName {
    /// Serve live state instead of durable state.
    ServeLiveState,
    /// Reuse the replica id after a wipe.
    ReuseReplicaIdAfterWipe,
    /// Merge by adding slots instead of taking the max.
    MergeByAddition,
    /// Apply a retried add twice.
    ApplyRetryTwice,
    /// Swap p and n.
    SwapPAndN,
    /// A like set's merge takes the incoming member length instead of the max
    /// (caught only with `--sets`).
    LastWriterLength,
    /// A copy answers a push before the commit that makes it durable there
    /// (caught only with `--durability replicated`).
    AckBeforeCopyDurable,
    /// A merge takes a folded writer's slot again after its fold (a double
    /// count; caught only with `--retire`).
    MergeKeepsFoldedSlot,
    /// A fold waits only for the members that are up, not for every member
    /// (a loss; caught only with `--retire`).
    FoldBeforeAgreement,
}

impl BugName {
    /// Every planted bug.
    pub const ALL: [BugName; 9] = [
        BugName::ServeLiveState,
        BugName::ReuseReplicaIdAfterWipe,
        BugName::MergeByAddition,
        BugName::ApplyRetryTwice,
        BugName::SwapPAndN,
        BugName::LastWriterLength,
        BugName::AckBeforeCopyDurable,
        BugName::MergeKeepsFoldedSlot,
        BugName::FoldBeforeAgreement,
    ];

    /// The core's bug of that name.
    #[cfg(feature = "planted-bugs")]
    pub fn core(&self) -> tally_node::replica::PlantedBug {
        use tally_node::replica::PlantedBug;
        match self {
            BugName::ServeLiveState => PlantedBug::ServeLiveState,
            BugName::ReuseReplicaIdAfterWipe => PlantedBug::ReuseReplicaIdAfterWipe,
            BugName::MergeByAddition => PlantedBug::MergeByAddition,
            BugName::ApplyRetryTwice => PlantedBug::ApplyRetryTwice,
            BugName::SwapPAndN => PlantedBug::SwapPAndN,
            BugName::LastWriterLength => PlantedBug::LastWriterLength,
            BugName::AckBeforeCopyDurable => PlantedBug::AckBeforeCopyDurable,
            BugName::MergeKeepsFoldedSlot => PlantedBug::MergeKeepsFoldedSlot,
            BugName::FoldBeforeAgreement => PlantedBug::FoldBeforeAgreement,
        }
    }

    /// The name on the command line.
    pub fn flag(&self) -> &'static str {
        match self {
            BugName::ServeLiveState => "serve-live-state",
            BugName::ReuseReplicaIdAfterWipe => "reuse-replica-id-after-wipe",
            BugName::MergeByAddition => "merge-by-addition",
            BugName::ApplyRetryTwice => "apply-retry-twice",
            BugName::SwapPAndN => "swap-p-and-n",
            BugName::LastWriterLength => "last-writer-length",
            BugName::AckBeforeCopyDurable => "ack-before-copy-durable",
            BugName::MergeKeepsFoldedSlot => "merge-keeps-folded-slot",
            BugName::FoldBeforeAgreement => "fold-before-agreement",
        }
    }
}

/// When the (non-async) nodes acknowledge an add.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, clap::ValueEnum)]
pub enum Durability {
    /// Once the group commit that holds it is flushed on the taking node.
    #[default]
    Sync,
    /// Once it is flushed there and on `write_copies - 1` other nodes of the
    /// region (the copies), by the core's copy pushes (`world/copies.rs`).
    Replicated,
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Durability::Sync => "sync",
            Durability::Replicated => "replicated",
        })
    }
}

/// Settings of one run. See the module documentation.
#[derive(Clone, Debug, PartialEq)]
pub struct SimOptions {
    /// Regions.
    pub regions: usize,
    /// Nodes in each region.
    pub nodes_per_region: usize,
    /// Simulated time with clients and faults (ms); the heal follows.
    pub duration_ms: u64,
    /// The faults switched on.
    pub faults: FaultSet,
    /// How many fault operations per simulated minute (roughly).
    pub fault_rate: u32,
    /// The anti-entropy interval (ms).
    pub sync_interval_ms: u64,
    /// Ordinary clients per region.
    pub clients_per_region: usize,
    /// Mean think time of an ordinary client (ms).
    pub think_ms: u64,
    /// Keys in the key space (key 0 is the hot post).
    pub keys: usize,
    /// Zipf exponent of key popularity.
    pub zipf: f64,
    /// Clients per region that hammer the hot key during the burst.
    pub burst_clients_per_region: usize,
    /// The burst's length (ms); it starts at a seeded time.
    pub burst_ms: u64,
    /// Nodes (the last ones) that acknowledge before the flush (async mode).
    pub async_nodes: usize,
    /// When the other nodes acknowledge.
    pub durability: Durability,
    /// Nodes of the region that hold a replicated add before it is
    /// acknowledged, the taking node included (as `--write-copies`).
    pub write_copies: usize,
    /// How long a caller waits for an answer (ms).
    pub client_timeout_ms: u64,
    /// Retries of a keyed add before the caller gives up.
    pub max_retries: u32,
    /// Byte budget of one pull (split in chunks of `chunk_bytes`).
    pub pull_budget_bytes: usize,
    /// Target size of one chunk.
    pub chunk_bytes: usize,
    /// Counters a replica keeps cached (small, to exercise eviction).
    pub cache_capacity: usize,
    /// A bug planted in the core.
    pub planted_bug: Option<BugName>,
    /// Likes, unlikes and observes on like sets and uniques keys too
    /// (`world/sets.rs`), checked exactly at the end.
    pub sets: bool,
    /// Retirements and folds (`world/folds.rs`): each node runs the fold
    /// protocol, a wiped node's old id is retired once it has been gone for
    /// `retire_after_ms` while its new incarnation is up, and operators
    /// retire stopped nodes (`retire` operations of the plan).
    pub retire: bool,
    /// The simulated `--retire-after` (ms).
    pub retire_after_ms: u64,
    /// With `retire`: folds agree and apply by partition over this many
    /// partitions (0: whole, as before cluster version 10).
    pub fold_partitions: u32,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            regions: 3,
            nodes_per_region: 1,
            duration_ms: 60_000,
            faults: FaultSet::all(),
            fault_rate: 12,
            sync_interval_ms: 200,
            clients_per_region: 3,
            think_ms: 200,
            keys: 64,
            zipf: 1.1,
            burst_clients_per_region: 2,
            burst_ms: 4_000,
            async_nodes: 0,
            durability: Durability::Sync,
            write_copies: 2,
            client_timeout_ms: 300,
            max_retries: 3,
            pull_budget_bytes: 16 << 10,
            chunk_bytes: 1 << 10,
            cache_capacity: 48,
            planted_bug: None,
            sets: false,
            retire: false,
            retire_after_ms: 2_000,
            fold_partitions: 0,
        }
    }
}

/// Region names, then `r<i>` past the list.
const REGION_NAMES: [&str; 8] = [
    "eu-west", "us-east", "ap-south", "sa-east", "af-south", "us-west", "ap-east", "eu-north",
];

impl SimOptions {
    /// The partition count folds work over (`--fold-partitions`), if any.
    pub fn fold_partition_count(&self) -> Option<tally_node::partition::PartitionCount> {
        if self.fold_partitions == 0 {
            return None;
        }
        tally_node::partition::PartitionCount::new(u64::from(self.fold_partitions)).ok()
    }

    /// Every node.
    pub fn node_count(&self) -> usize {
        self.regions * self.nodes_per_region
    }

    /// The region of node `node`.
    pub fn region_of(&self, node: usize) -> usize {
        node / self.nodes_per_region
    }

    /// A region's name.
    pub fn region_name(&self, region: usize) -> String {
        REGION_NAMES
            .get(region)
            .map(|name| name.to_string())
            .unwrap_or_else(|| format!("r{region}"))
    }

    /// The pull timeout, as the real node sets it: ten intervals, at least two seconds.
    pub fn pull_timeout_ms(&self) -> u64 {
        (self.sync_interval_ms * 10).max(2_000)
    }

    /// True when node `node` acknowledges before the flush.
    pub fn is_async(&self, node: usize) -> bool {
        node + self.async_nodes >= self.node_count()
    }

    /// Checks the options.
    pub fn validate(&self) -> Result<(), String> {
        if self.regions == 0 || self.nodes_per_region == 0 {
            return Err("--regions and --nodes-per-region must be at least 1".into());
        }
        if self.node_count() > 64 {
            return Err("at most 64 nodes".into());
        }
        if self.keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        if self.sync_interval_ms == 0 || self.duration_ms < 1_000 {
            return Err("--sync-interval-ms must be positive and --duration-s at least 1".into());
        }
        if self.async_nodes > self.node_count() {
            return Err("--async-nodes is more than the nodes".into());
        }
        if self.durability == Durability::Replicated {
            if !(2..=7).contains(&self.write_copies) {
                return Err("--write-copies must be 2 to 7 (the taking node included)".into());
            }
            if self.write_copies > self.nodes_per_region {
                return Err(format!(
                    "--durability replicated --write-copies {} needs at least {} nodes per region \
                     (--nodes-per-region is {})",
                    self.write_copies, self.write_copies, self.nodes_per_region
                ));
            }
            if self.async_nodes > 0 {
                return Err("--async-nodes and --durability replicated do not mix".into());
            }
        }
        if self.planted_bug.is_some() && !cfg!(feature = "planted-bugs") {
            return Err(
                "--planted-bug needs a build with the `planted-bugs` feature \
                 (cargo run -p tally-sim --features planted-bugs)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The flags that differ from the defaults, as `tally-sim run` takes them.
    pub fn to_args(&self) -> String {
        let d = SimOptions::default();
        let mut args = Vec::new();
        macro_rules! flag {
            ($field:ident, $name:expr) => {
                if self.$field != d.$field {
                    args.push(format!("--{} {}", $name, self.$field));
                }
            };
        }
        flag!(regions, "regions");
        flag!(nodes_per_region, "nodes-per-region");
        if self.duration_ms != d.duration_ms {
            args.push(format!("--duration-ms {}", self.duration_ms));
        }
        if self.faults != d.faults {
            args.push(format!("--faults {}", self.faults));
        }
        flag!(fault_rate, "fault-rate");
        flag!(sync_interval_ms, "sync-interval-ms");
        flag!(clients_per_region, "clients-per-region");
        flag!(think_ms, "think-ms");
        flag!(keys, "keys");
        flag!(zipf, "zipf");
        flag!(burst_clients_per_region, "burst-clients-per-region");
        flag!(burst_ms, "burst-ms");
        flag!(async_nodes, "async-nodes");
        flag!(durability, "durability");
        if self.durability == Durability::Replicated {
            args.push(format!("--write-copies {}", self.write_copies));
        }
        flag!(client_timeout_ms, "client-timeout-ms");
        flag!(max_retries, "max-retries");
        flag!(pull_budget_bytes, "pull-budget-bytes");
        flag!(chunk_bytes, "chunk-bytes");
        flag!(cache_capacity, "cache-capacity");
        if let Some(bug) = self.planted_bug {
            args.push(format!("--planted-bug {}", bug.flag()));
        }
        if self.sets {
            args.push("--sets".to_string());
        }
        if self.retire {
            args.push("--retire".to_string());
        }
        flag!(retire_after_ms, "retire-after-ms");
        flag!(fold_partitions, "fold-partitions");
        args.join(" ")
    }
}

impl fmt::Display for SimOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "topology: {} region(s) x {} node(s); async nodes: {}",
            self.regions, self.nodes_per_region, self.async_nodes
        )?;
        if self.durability == Durability::Replicated {
            writeln!(
                f,
                "durability: replicated, {} copies (the taking node included)",
                self.write_copies
            )?;
        }
        writeln!(
            f,
            "faults: {} ({} ops/min); run {} ms, then heal and quiesce",
            self.faults, self.fault_rate, self.duration_ms
        )?;
        writeln!(
            f,
            "sync: every {} ms, pull timeout {} ms, budget {} B in {} B chunks, cache {} counters",
            self.sync_interval_ms,
            self.pull_timeout_ms(),
            self.pull_budget_bytes,
            self.chunk_bytes,
            self.cache_capacity
        )?;
        write!(
            f,
            "workload: {} keys (zipf {}), {} client(s)/region (think {} ms), {} burst client(s)/region \
             on the hot key for {} ms, timeout {} ms, {} retries",
            self.keys,
            self.zipf,
            self.clients_per_region,
            self.think_ms,
            self.burst_clients_per_region,
            self.burst_ms,
            self.client_timeout_ms,
            self.max_retries
        )?;
        if self.sets {
            write!(
                f,
                "\nsets: likes, unlikes and observes on like sets and uniques keys"
            )?;
        }
        if self.retire {
            write!(
                f,
                "\nretirements: wiped ids retired after {} ms, operator retirements, folds",
                self.retire_after_ms
            )?;
            if self.fold_partitions > 0 {
                write!(
                    f,
                    " agreed and applied over {} partitions",
                    self.fold_partitions
                )?;
            }
        }
        if let Some(bug) = self.planted_bug {
            write!(f, "\nplanted bug: {}", bug.flag())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_sets_parse_and_print() {
        assert_eq!("all".parse::<FaultSet>().unwrap(), FaultSet::all());
        let set: FaultSet = "crash,pause".parse().unwrap();
        assert!(set.crash && set.pause && !set.partition);
        assert_eq!(set.to_string(), "crash,pause");
        let most: FaultSet = "all,-tail".parse().unwrap();
        assert!(!most.tail && most.wipe);
        assert!("fire".parse::<FaultSet>().is_err());
    }

    #[test]
    fn args_list_only_what_differs() {
        assert_eq!(SimOptions::default().to_args(), "");
        let options = SimOptions {
            regions: 4,
            faults: "crash".parse().unwrap(),
            ..Default::default()
        };
        assert_eq!(options.to_args(), "--regions 4 --faults crash");
    }
}
