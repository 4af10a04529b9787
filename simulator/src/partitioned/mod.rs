//! Partitioned regions in simulation: R regions of several nodes, each key
//! in one of P partitions held by RF owners per region, over the code a
//! partitioned node runs.
//!
//! Each node is a [`scoped::ScopedNode`]: one scoped `Replica` on one
//! `MemoryStore`, whose lifecycle and holdings move by tally-core's
//! `NodePartitions` round (members' facts in, the `LIFECYCLE` record
//! stored, then committed), with its commits, pulls (planned by the peer
//! book, fitted by the copy sessions), confirmations and purge as timed
//! events over the simulated network (`sync.rs`). Adds go to a node of the
//! client's region, which routes them by its own (stale) view to the key's
//! first live owner; a replica that does not serve the key refuses it.
//! Membership changes (join, drain, remove, a crash past `dead_after`) are
//! plan operations; drains and removals are asked of a node, as an
//! operator does.
//!
//! The checker keeps the simulator's exact per-slot accounting (every
//! node's replica is a writer of the checker), checks invariant 8 when a
//! node hands a partition off (what it stored is held by another node of
//! the region), and after the heal checks that every partition is kept by
//! exactly its RF owners per region, all ready and equal, and that no other
//! node stores more than its own slots of it.

mod bugs;
mod check;
pub mod cli;
mod clients;
mod copies;
mod events;
mod folds;
mod node;
pub mod plan;
pub mod scoped;
mod sets;
mod sync;
mod world;

use std::fmt;

pub use bugs::PartitionBug;
pub use plan::{MemberOp, PartitionedPlan, PlanOp};
pub use world::{run, PartitionedResult};

use crate::options::{Durability, FaultSet, SimOptions};

/// Settings of one partitioned run.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionedOptions {
    /// Regions.
    pub regions: usize,
    /// Nodes each region starts with.
    pub nodes_per_region: usize,
    /// Spare node slots per region, which join operations start.
    pub spare_per_region: usize,
    /// Owners of each partition per region (RF).
    pub replication: u32,
    /// Partitions (P).
    pub partitions: u32,
    /// How long a node is down before the others take its partitions.
    pub dead_after_ms: u64,
    /// How long a partition that moved away from a writer stays away before
    /// the writer retires its slots there and the keepers fold them (the
    /// node's `--retire-after`; scoped folds).
    pub retire_after_ms: u64,
    /// Whether plans include joins, drains and removals.
    pub membership: bool,
    /// Faults switched on (partition, crash, pause, skew, loss, dup,
    /// reorder, tail; `wipe` allows removals, which lose a disk).
    pub faults: FaultSet,
    /// When an add is acknowledged: once durable on its owner (`sync`), or
    /// also on `write_copies - 1` other nodes of the region (`replicated`).
    pub durability: Durability,
    /// Nodes of the region that hold a replicated add before it is
    /// acknowledged, the taking node included.
    pub write_copies: usize,
    /// Simulated time with clients and faults (ms); the heal follows.
    pub duration_ms: u64,
    /// The longest the cluster may take to settle after the heal (ms).
    pub settle_ms: u64,
    /// The anti-entropy interval (ms).
    pub sync_interval_ms: u64,
    /// Keys.
    pub keys: usize,
    /// Zipf exponent of key popularity.
    pub zipf: f64,
    /// Clients per region.
    pub clients_per_region: usize,
    /// Mean think time of a client (ms).
    pub think_ms: u64,
    /// How long a caller waits for an answer (ms).
    pub client_timeout_ms: u64,
    /// Retries of a keyed add.
    pub max_retries: u32,
    /// A bug planted in the runtime.
    pub bug: Option<PartitionBug>,
}

impl Default for PartitionedOptions {
    fn default() -> Self {
        PartitionedOptions {
            regions: 3,
            nodes_per_region: 3,
            spare_per_region: 1,
            replication: 2,
            partitions: 16,
            dead_after_ms: 3_000,
            retire_after_ms: 2_000,
            membership: true,
            faults: "partition,crash,wipe,pause,skew,loss,dup,reorder"
                .parse()
                .expect("valid"),
            durability: Durability::Sync,
            write_copies: 2,
            duration_ms: 20_000,
            settle_ms: 30_000,
            sync_interval_ms: 200,
            keys: 48,
            zipf: 1.1,
            clients_per_region: 3,
            think_ms: 100,
            client_timeout_ms: 300,
            max_retries: 3,
            bug: None,
        }
    }
}

impl PartitionedOptions {
    /// Node slots per region (initial and spare).
    pub fn slots_per_region(&self) -> usize {
        self.nodes_per_region + self.spare_per_region
    }

    /// Node slots in all.
    pub fn slot_count(&self) -> usize {
        self.regions * self.slots_per_region()
    }

    /// Whether slot `node` is one of the nodes the cluster starts with.
    pub fn is_initial(&self, node: usize) -> bool {
        node % self.slots_per_region() < self.nodes_per_region
    }

    /// The region of slot `node`.
    pub fn region_of(&self, node: usize) -> usize {
        node / self.slots_per_region()
    }

    /// The options the shared network model takes (every slot a node).
    pub fn network_options(&self) -> SimOptions {
        SimOptions {
            regions: self.regions,
            nodes_per_region: self.slots_per_region(),
            faults: self.faults,
            sync_interval_ms: self.sync_interval_ms,
            ..SimOptions::default()
        }
    }

    /// Checks the options.
    pub fn validate(&self) -> Result<(), String> {
        if self.regions == 0 || self.nodes_per_region == 0 {
            return Err("--regions and --nodes-per-region must be at least 1".into());
        }
        if self.slot_count() > 64 {
            return Err("at most 64 node slots (regions x (nodes + spare))".into());
        }
        if self.replication == 0 {
            return Err("--replication-factor must be at least 1".into());
        }
        tally_node::partition::PartitionCount::new(u64::from(self.partitions))
            .map_err(|e| format!("--partitions: {e}"))?;
        if let Some(name) = self.bug.and_then(|bug| bug.core_name()) {
            if !cfg!(feature = "planted-bugs") {
                return Err(format!(
                    "--planted-bug {name} needs a build with the `planted-bugs` feature \
                     (cargo run -p tally-sim --features planted-bugs)"
                ));
            }
        }
        if self.durability == Durability::Replicated
            && !(2..=self.nodes_per_region.min(7)).contains(&self.write_copies)
        {
            return Err(format!(
                "--durability replicated --write-copies {} needs 2 to 7 copies and at least \
                 that many nodes per region (--nodes-per-region {})",
                self.write_copies, self.nodes_per_region
            ));
        }
        if self.durability == Durability::Replicated
            && self.write_copies > self.replication as usize
        {
            return Err(format!(
                "--durability replicated --write-copies {} needs --replication-factor at least \
                 {} (it is {}): a key's copies go only to nodes holding its partition",
                self.write_copies, self.write_copies, self.replication
            ));
        }
        if self.keys == 0 || self.sync_interval_ms == 0 || self.duration_ms < 1_000 {
            return Err(
                "--keys and --sync-interval-ms must be positive, --duration-ms at least 1000"
                    .into(),
            );
        }
        Ok(())
    }

    /// The flags that differ from the defaults, as `tally-sim partitioned` takes them.
    pub fn to_args(&self) -> String {
        let d = PartitionedOptions::default();
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
        flag!(spare_per_region, "spare-per-region");
        flag!(replication, "replication-factor");
        flag!(partitions, "partitions");
        flag!(dead_after_ms, "dead-after-ms");
        flag!(retire_after_ms, "retire-after-ms");
        if !self.membership {
            args.push("--no-membership".to_string());
        }
        flag!(faults, "faults");
        if self.durability == Durability::Replicated {
            args.push(format!(
                "--durability replicated --write-copies {}",
                self.write_copies
            ));
        }
        flag!(duration_ms, "duration-ms");
        flag!(settle_ms, "settle-ms");
        flag!(sync_interval_ms, "sync-interval-ms");
        flag!(keys, "keys");
        flag!(zipf, "zipf");
        flag!(clients_per_region, "clients-per-region");
        flag!(think_ms, "think-ms");
        flag!(client_timeout_ms, "client-timeout-ms");
        flag!(max_retries, "max-retries");
        if let Some(bug) = self.bug {
            args.push(format!("--planted-bug {}", bug.flag()));
        }
        args.join(" ")
    }
}

impl fmt::Display for PartitionedOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "topology: {} region(s) x {} node(s) (+{} spare), RF {}, {} partitions, dead-after {} ms, \
             retire-after {} ms",
            self.regions,
            self.nodes_per_region,
            self.spare_per_region,
            self.replication,
            self.partitions,
            self.dead_after_ms,
            self.retire_after_ms
        )?;
        writeln!(
            f,
            "faults: {}{}; run {} ms, then heal and settle (at most {} ms)",
            self.faults,
            if self.membership {
                " + join, drain, remove"
            } else {
                ""
            },
            self.duration_ms,
            self.settle_ms
        )?;
        write!(
            f,
            "workload: {} keys (zipf {}), {} client(s)/region (think {} ms), timeout {} ms, \
             {} retries; sync every {} ms",
            self.keys,
            self.zipf,
            self.clients_per_region,
            self.think_ms,
            self.client_timeout_ms,
            self.max_retries,
            self.sync_interval_ms
        )?;
        if self.durability == Durability::Replicated {
            write!(
                f,
                "\ndurability: replicated, {} copies (the taking node included)",
                self.write_copies
            )?;
        }
        if let Some(bug) = self.bug {
            write!(f, "\nplanted bug: {}", bug.flag())?;
        }
        Ok(())
    }
}

/// The replay command of a partitioned run.
pub fn replay_command(
    seed: u64,
    options: &PartitionedOptions,
    plan: Option<&PartitionedPlan>,
) -> String {
    crate::replay::replay_line(
        "partitioned",
        seed,
        &options.to_args(),
        plan.map(PartitionedPlan::one_line),
    )
}
