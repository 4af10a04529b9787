//! `tally-sim partitioned`: one seed or a sweep of a partitioned world, with
//! its report lines.
//!
//! Invariant: the report of a seed is the same every time for the same
//! options (only the `timing:` line depends on the machine), and the exit
//! status is non-zero whenever a seed broke an invariant.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Args;

use super::{
    replay_command, run, PartitionBug, PartitionedOptions, PartitionedPlan, PartitionedResult,
};
use crate::options::{Durability, FaultSet};

/// Options of `tally-sim partitioned`.
#[derive(Args, Debug)]
pub struct PartitionedArgs {
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds (a sweep), from --first-seed on.
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed of a sweep.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Worker threads of a sweep (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Replay this plan instead of the seed's ('op; op; ...', or @FILE).
    #[arg(long)]
    plan: Option<String>,
    /// Regions.
    #[arg(long, default_value_t = 3)]
    regions: usize,
    /// Nodes each region starts with.
    #[arg(long, default_value_t = 3)]
    nodes_per_region: usize,
    /// Spare node slots per region, for joins.
    #[arg(long, default_value_t = 1)]
    spare_per_region: usize,
    /// Owners of each partition per region (RF).
    #[arg(long, default_value_t = 2)]
    replication_factor: u32,
    /// Partitions (P).
    #[arg(long, default_value_t = 16)]
    partitions: u32,
    /// How long a node is down before its partitions move (ms).
    #[arg(long, default_value_t = 3_000)]
    dead_after_ms: u64,
    /// How long a partition stays away from a writer before its slots there
    /// are retired and folded (the node's --retire-after, ms).
    #[arg(long, default_value_t = 2_000)]
    retire_after_ms: u64,
    /// No joins, drains or removals in generated plans.
    #[arg(long)]
    no_membership: bool,
    /// Network, process and clock faults: all, none, or a comma list of
    /// partition, crash, wipe (allows removals), pause, skew, loss, dup,
    /// reorder, tail.
    #[arg(
        long,
        default_value = "partition,crash,wipe,pause,skew,loss,dup,reorder"
    )]
    faults: FaultSet,
    /// When an add is acknowledged: sync (durable on its owner) or
    /// replicated (also on --write-copies - 1 more nodes of the region).
    #[arg(long, value_enum, default_value_t = Durability::Sync)]
    durability: Durability,
    /// Nodes of the region that hold a replicated add before it is
    /// acknowledged, the taking node included.
    #[arg(long, default_value_t = 2)]
    write_copies: usize,
    /// Simulated time with clients and faults (ms).
    #[arg(long, default_value_t = 20_000)]
    duration_ms: u64,
    /// The longest the cluster may take to settle after the heal (ms).
    #[arg(long, default_value_t = 30_000)]
    settle_ms: u64,
    /// Anti-entropy interval (ms).
    #[arg(long, default_value_t = 200)]
    sync_interval_ms: u64,
    /// Keys.
    #[arg(long, default_value_t = 48)]
    keys: usize,
    /// Zipf exponent of key popularity.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Clients per region.
    #[arg(long, default_value_t = 3)]
    clients_per_region: usize,
    /// Mean think time of a client (ms).
    #[arg(long, default_value_t = 100)]
    think_ms: u64,
    /// Client timeout (ms).
    #[arg(long, default_value_t = 300)]
    client_timeout_ms: u64,
    /// Retries of a keyed add.
    #[arg(long, default_value_t = 3)]
    max_retries: u32,
    /// Plant a bug in the runtime around the partition core.
    #[arg(long, value_enum)]
    planted_bug: Option<PartitionBug>,
}

impl PartitionedArgs {
    fn options(&self) -> PartitionedOptions {
        PartitionedOptions {
            regions: self.regions,
            nodes_per_region: self.nodes_per_region,
            spare_per_region: self.spare_per_region,
            replication: self.replication_factor,
            partitions: self.partitions,
            dead_after_ms: self.dead_after_ms,
            retire_after_ms: self.retire_after_ms,
            membership: !self.no_membership,
            faults: self.faults,
            durability: self.durability,
            write_copies: self.write_copies,
            duration_ms: self.duration_ms,
            settle_ms: self.settle_ms,
            sync_interval_ms: self.sync_interval_ms,
            keys: self.keys,
            zipf: self.zipf,
            clients_per_region: self.clients_per_region,
            think_ms: self.think_ms,
            client_timeout_ms: self.client_timeout_ms,
            max_retries: self.max_retries,
            bug: self.planted_bug,
        }
    }
}

/// Runs `tally-sim partitioned`; true when every seed passed.
pub fn main(args: PartitionedArgs) -> anyhow::Result<bool> {
    let options = args.options();
    options.validate().map_err(|e| anyhow::anyhow!(e))?;
    let plan = match &args.plan {
        Some(text) => {
            let text = match text.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read the plan file {path}: {e}"))?,
                None => text.clone(),
            };
            let plan: PartitionedPlan = text
                .parse()
                .map_err(|e| anyhow::anyhow!("bad --plan: {e}"))?;
            plan.validate(&options)
                .map_err(|e| anyhow::anyhow!("bad --plan: {e}"))?;
            Some(plan)
        }
        None => None,
    };
    let started = Instant::now();
    if let Some(count) = args.seeds {
        let threads = args.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let results = sweep(args.first_seed, count, threads, &options, plan.as_ref());
        print!("{}", render_sweep(&results, &options, plan.as_ref()));
        let wall = started.elapsed().as_secs_f64();
        println!(
            "timing: {wall:.2} s wall on {threads} thread(s), {:.0} seeds/min",
            results.len() as f64 * 60.0 / wall.max(f64::EPSILON)
        );
        return Ok(results.iter().all(PartitionedResult::passed));
    }
    let result = run(args.seed.unwrap_or(0), &options, plan.clone());
    print!("{}", render_run(&result, &options, plan.as_ref()));
    println!("timing: {:.3} s wall", started.elapsed().as_secs_f64());
    Ok(result.passed())
}

/// Runs seeds `first..first + count` on `threads` threads, in seed order.
pub fn sweep(
    first: u64,
    count: u64,
    threads: usize,
    options: &PartitionedOptions,
    plan: Option<&PartitionedPlan>,
) -> Vec<PartitionedResult> {
    let next = AtomicU64::new(0);
    let slots: Mutex<Vec<Option<PartitionedResult>>> =
        Mutex::new((0..count).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1).min(count.max(1) as usize) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    return;
                }
                let result = run(first + index, options, plan.cloned());
                slots.lock().expect("results lock")[index as usize] = Some(result);
            });
        }
    });
    slots
        .into_inner()
        .expect("results lock")
        .into_iter()
        .map(|result| result.expect("every seed ran"))
        .collect()
}

/// The deterministic report of one run.
pub fn render_run(
    result: &PartitionedResult,
    options: &PartitionedOptions,
    plan: Option<&PartitionedPlan>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", replay_command(result.seed, options, plan));
    let _ = writeln!(out, "{options}");
    let _ = writeln!(out, "plan ({} ops):", result.plan.0.len());
    for op in &result.plan.0 {
        let _ = writeln!(out, "  {op}");
    }
    let w = &result.workload;
    let s = &result.stats;
    let _ = writeln!(
        out,
        "workload: {} adds, {} acked, {} abandoned, {} retries, {} duplicate answers; \
         {} taken directly, {} forwarded to the owner, {} refused (no owner in view); \
         {} likes, unlikes and observes ({} refused)",
        w.adds,
        w.acked,
        w.abandoned,
        w.retries,
        w.duplicates,
        s.direct,
        s.forwarded,
        s.refused,
        s.set_ops,
        s.set_refused
    );
    let _ = writeln!(
        out,
        "membership: {} joined, {} drained ({} drains refused), {} removed ({} refused); \
         {} fold epochs: {} writers folded whole, {} in one partition ({} rounds refused a record)",
        s.joined,
        s.drained,
        s.drains_refused,
        s.removed,
        s.removals_refused,
        s.fold_epochs,
        s.writers_folded,
        s.scoped_folded,
        s.fold_errors
    );
    let _ = writeln!(
        out,
        "handoff: {} pulls, {} partitions streamed from scratch, {} confirmations asked, \
         {} partitions handed off, {} stored counters purged",
        s.pulls, s.from_scratch, s.confirms, s.released, s.purged
    );
    if options.durability == Durability::Replicated {
        let c = &result.copies;
        let _ = writeln!(
            out,
            "copies: {} pushes, {} confirmed, {} failed, {} taken by copies; {} adds answered \
             UNAVAILABLE",
            c.pushes, c.confirmed, c.failed, c.taken, c.unconfirmed_adds
        );
    }
    let held: Vec<String> = result
        .held
        .iter()
        .map(|(name, partitions, counters)| {
            format!("{name} {partitions} partitions/{counters} keys")
        })
        .collect();
    let _ = writeln!(out, "held at the end: {}", held.join(", "));
    let n = &result.net;
    let _ = writeln!(
        out,
        "network: {} messages, {} cut, {} lost, {} duplicated",
        n.sent, n.cut, n.lost, n.duplicated
    );
    let sl = &result.slots;
    let _ = writeln!(
        out,
        "slots: {} checked; unacknowledged adds applied {}, lost {}; applied by two owners {}",
        sl.slots, sl.unacked_applied, sl.unacked_lost, sl.applied_across_wipe
    );
    match result.settled_ms {
        Some(ms) => {
            let _ = writeln!(
                out,
                "settled: {ms} ms after the heal at {} ms",
                result.heal_ms
            );
        }
        None => {
            let _ = writeln!(out, "settled: never");
        }
    }
    let _ = writeln!(
        out,
        "trace: {:016x} ({} events, {} simulated ms)",
        result.trace_hash, result.events, result.sim_ms
    );
    if result.passed() {
        let _ = writeln!(out, "result: PASS");
    } else {
        let _ = writeln!(
            out,
            "result: FAIL, {} violation(s) (seed {})",
            result.violation_count, result.seed
        );
        for v in &result.violations {
            let _ = writeln!(out, "  at {} ms: {}: {}", v.at_ms, v.kind, v.detail);
        }
    }
    out
}

/// The summary of a sweep.
pub fn render_sweep(
    results: &[PartitionedResult],
    options: &PartitionedOptions,
    plan: Option<&PartitionedPlan>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{options}");
    let failed: Vec<&PartitionedResult> = results.iter().filter(|r| !r.passed()).collect();
    let mut kinds = std::collections::BTreeMap::new();
    for result in results {
        for op in &result.plan.0 {
            *kinds.entry(op.kind(options.dead_after_ms)).or_insert(0u64) += 1;
        }
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(out, "operations planned: {}", kinds.join(", "));
    let total = |f: fn(&PartitionedResult) -> u64| results.iter().map(f).sum::<u64>();
    let _ = writeln!(
        out,
        "{} seeds: {} adds, {} acked; {} joins, {} drains, {} removals completed; \
         {} partitions streamed from scratch, {} handed off; {} fold epochs ({} writers folded \
         whole, {} in one partition)",
        results.len(),
        total(|r| r.workload.adds),
        total(|r| r.workload.acked),
        total(|r| r.stats.joined),
        total(|r| r.stats.drained),
        total(|r| r.stats.removed),
        total(|r| r.stats.from_scratch),
        total(|r| r.stats.released),
        total(|r| r.stats.fold_epochs),
        total(|r| r.stats.writers_folded),
        total(|r| r.stats.scoped_folded)
    );
    let _ = writeln!(
        out,
        "slots: {} checked; unacknowledged adds applied {}, lost {}; applied by two owners {}",
        total(|r| r.slots.slots),
        total(|r| r.slots.unacked_applied),
        total(|r| r.slots.unacked_lost),
        total(|r| r.slots.applied_across_wipe)
    );
    let mut settle: Vec<u64> = results.iter().filter_map(|r| r.settled_ms).collect();
    settle.sort_unstable();
    if let Some(max) = settle.last() {
        let _ = writeln!(
            out,
            "settled after the heal: median {} ms, max {max} ms",
            settle[settle.len() / 2]
        );
    }
    for result in failed.iter().take(10) {
        if let Some(v) = result.violations.first() {
            let _ = writeln!(out, "  seed {}: {}: {}", result.seed, v.kind, v.detail);
        }
        let _ = writeln!(
            out,
            "    replay: {}",
            replay_command(result.seed, options, plan)
        );
    }
    let _ = writeln!(
        out,
        "result: {} ({} of {} seeds failed)",
        if failed.is_empty() { "PASS" } else { "FAIL" },
        failed.len(),
        results.len()
    );
    out
}
