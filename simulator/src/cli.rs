//! The command line: `tally-sim run` (one seed, or a sweep of many across the
//! cores) and `tally-sim chaos` (real processes).
//!
//! Invariant: `run --seed S` prints the same lines every time for the same
//! options (only the final `timing:` line depends on the machine), and the
//! exit status is non-zero whenever a seed broke an invariant.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};

use crate::faults::FaultPlan;
use crate::network::LatencyMatrix;
use crate::options::{BugName, Durability, FaultSet, SimOptions};
use crate::replay::replay_command;
use crate::shrink::shrink;
use crate::sweep::{sweep, SweepSummary};
use crate::world::{run, RunResult};

/// Deterministic simulation and chaos testing of Tally.
#[derive(Parser, Debug)]
#[command(name = "tally-sim", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate the cluster over the real replica core: one seed, or a sweep.
    Run(Box<RunArgs>),
    /// Run the checker against real tally-node processes on loopback.
    Chaos(crate::chaos::ChaosArgs),
    /// Simulate partitioned regions (several nodes per region, RF owners per
    /// partition) with joins, drains and removals: one seed, or a sweep.
    Partitioned(Box<crate::partitioned::cli::PartitionedArgs>),
}

/// Options of `tally-sim run`.
#[derive(Args, Debug)]
pub struct RunArgs {
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
    /// Replay this fault plan instead of the seed's ('op; op; ...', or @FILE).
    #[arg(long)]
    plan: Option<String>,
    /// Write report.json and report.html to this directory.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Do not shrink a failing plan.
    #[arg(long)]
    no_shrink: bool,
    /// Most runs the shrinker may spend.
    #[arg(long, default_value_t = 200)]
    shrink_budget: u32,
    #[command(flatten)]
    sim: SimArgs,
}

/// The simulation's settings (see `SimOptions`).
#[derive(Args, Debug)]
pub struct SimArgs {
    /// Regions.
    #[arg(long, default_value_t = 3)]
    regions: usize,
    /// Nodes per region.
    #[arg(long, default_value_t = 1)]
    nodes_per_region: usize,
    /// Simulated time with clients and faults, in milliseconds (the heal follows).
    #[arg(long, default_value_t = 60_000)]
    duration_ms: u64,
    /// Faults: all, none, or a comma list of partition, crash, wipe, pause,
    /// skew, loss, dup, reorder, tail (prefix one with - to remove it from all).
    #[arg(long, default_value = "all")]
    faults: FaultSet,
    /// Fault operations per simulated minute (about).
    #[arg(long, default_value_t = 12)]
    fault_rate: u32,
    /// Anti-entropy interval (ms).
    #[arg(long, default_value_t = 200)]
    sync_interval_ms: u64,
    /// Ordinary clients per region.
    #[arg(long, default_value_t = 3)]
    clients_per_region: usize,
    /// Mean think time of an ordinary client (ms).
    #[arg(long, default_value_t = 200)]
    think_ms: u64,
    /// Keys (key 0 is the hot post).
    #[arg(long, default_value_t = 64)]
    keys: usize,
    /// Zipf exponent of key popularity.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Burst clients per region on the hot key.
    #[arg(long, default_value_t = 2)]
    burst_clients_per_region: usize,
    /// Length of the hot-key burst (ms).
    #[arg(long, default_value_t = 4_000)]
    burst_ms: u64,
    /// Nodes (the last ones) in async durability mode.
    #[arg(long, default_value_t = 0)]
    async_nodes: usize,
    /// When the other nodes acknowledge an add: sync (once flushed on the
    /// node) or replicated (also on --write-copies - 1 more nodes of the
    /// region; needs that many nodes per region).
    #[arg(long, value_enum, default_value_t = Durability::Sync)]
    durability: Durability,
    /// Nodes of the region that hold a replicated add before it is
    /// acknowledged, the taking node included (2 to 7).
    #[arg(long, default_value_t = 2)]
    write_copies: usize,
    /// Client timeout (ms).
    #[arg(long, default_value_t = 300)]
    client_timeout_ms: u64,
    /// Retries of a keyed add.
    #[arg(long, default_value_t = 3)]
    max_retries: u32,
    /// Byte budget of one pull.
    #[arg(long, default_value_t = 16 << 10)]
    pull_budget_bytes: usize,
    /// Chunk size of a pull's answer.
    #[arg(long, default_value_t = 1 << 10)]
    chunk_bytes: usize,
    /// Counters each replica caches.
    #[arg(long, default_value_t = 48)]
    cache_capacity: usize,
    /// Plant a bug in the core (needs the planted-bugs feature).
    #[arg(long, value_enum)]
    planted_bug: Option<BugName>,
    /// Also like, unlike and observe on like sets and uniques keys, and check
    /// every member's final length, the derived counts and the registers.
    #[arg(long)]
    sets: bool,
    /// Retire writers and fold them: a wiped node's old id is retired after
    /// --retire-after-ms, operators retire stopped nodes, and the checker
    /// counts every folded writer's adds once, through the folded base.
    #[arg(long)]
    retire: bool,
    /// The simulated --retire-after, in milliseconds (with --retire).
    #[arg(long, default_value_t = 2_000)]
    retire_after_ms: u64,
    /// With --retire: folds agree and apply partition by partition over
    /// this many partitions, as from cluster version 10 (0: whole).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=65_536))]
    fold_partitions: u32,
}

impl SimArgs {
    fn options(&self) -> SimOptions {
        SimOptions {
            regions: self.regions,
            nodes_per_region: self.nodes_per_region,
            duration_ms: self.duration_ms,
            faults: self.faults,
            fault_rate: self.fault_rate,
            sync_interval_ms: self.sync_interval_ms,
            clients_per_region: self.clients_per_region,
            think_ms: self.think_ms,
            keys: self.keys,
            zipf: self.zipf,
            burst_clients_per_region: self.burst_clients_per_region,
            burst_ms: self.burst_ms,
            async_nodes: self.async_nodes,
            durability: self.durability,
            write_copies: self.write_copies,
            client_timeout_ms: self.client_timeout_ms,
            max_retries: self.max_retries,
            pull_budget_bytes: self.pull_budget_bytes,
            chunk_bytes: self.chunk_bytes,
            cache_capacity: self.cache_capacity,
            planted_bug: self.planted_bug,
            sets: self.sets,
            retire: self.retire,
            retire_after_ms: self.retire_after_ms,
            fold_partitions: self.fold_partitions,
        }
    }
}

/// The entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Run(args) => run_command(*args),
        Command::Chaos(args) => crate::chaos::main(args),
        Command::Partitioned(args) => crate::partitioned::cli::main(*args),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("tally-sim: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn load_plan(text: &str, options: &SimOptions) -> anyhow::Result<FaultPlan> {
    let text = match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the plan file {path}: {e}"))?,
        None => text.to_string(),
    };
    let plan: FaultPlan = text
        .parse()
        .map_err(|e| anyhow::anyhow!("bad --plan: {e}"))?;
    plan.validate(options)
        .map_err(|e| anyhow::anyhow!("bad --plan: {e}"))?;
    Ok(plan)
}

fn run_command(args: RunArgs) -> anyhow::Result<bool> {
    let options = args.sim.options();
    options.validate().map_err(|e| anyhow::anyhow!(e))?;
    let plan = args
        .plan
        .as_deref()
        .map(|text| load_plan(text, &options))
        .transpose()?;
    if let Some(seeds) = args.seeds {
        let threads = args.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let summary = sweep(
            args.first_seed,
            seeds,
            threads,
            &options,
            plan.as_ref(),
            true,
        );
        print!("{}", summary.render(&options, plan.as_ref()));
        let failing = summary.first_failure().cloned();
        if let Some(result) = &failing {
            if !args.no_shrink && plan.is_none() {
                print_shrunk(result, &options, args.shrink_budget);
            }
        }
        if let Some(dir) = &args.report {
            let focus = failing.as_ref().map(|r| r.seed).unwrap_or(args.first_seed);
            let detailed = run(focus, &options, plan.clone(), true);
            crate::report::write(dir, &options, &detailed, Some(&summary))?;
            println!("report: {}", dir.join("report.html").display());
        }
        return Ok(summary.failed == 0);
    }
    let seed = args.seed.unwrap_or(0);
    let started = Instant::now();
    let result = run(seed, &options, plan.clone(), args.report.is_some());
    let elapsed = started.elapsed();
    print!("{}", render_run(&result, &options, plan.as_ref()));
    if !result.passed() && !args.no_shrink && plan.is_none() {
        print_shrunk(&result, &options, args.shrink_budget);
    }
    if let Some(dir) = &args.report {
        crate::report::write(dir, &options, &result, None)?;
        println!("report: {}", dir.join("report.html").display());
    }
    println!(
        "timing: {:.3} s wall, {:.2} M simulated events/s",
        elapsed.as_secs_f64(),
        result.events as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6
    );
    Ok(result.passed())
}

fn print_shrunk(result: &RunResult, options: &SimOptions, budget: u32) {
    let Some(kind) = result.failure_kind() else {
        return;
    };
    let shrunk = shrink(result.seed, options, &result.plan, kind, budget);
    println!(
        "shrunk fault plan ({} of {} ops, {} runs), still fails with \"{kind}\":",
        shrunk.plan.0.len(),
        result.plan.0.len(),
        shrunk.runs
    );
    for op in &shrunk.plan.0 {
        println!("  {op}");
    }
    println!(
        "replay shrunk: {}",
        replay_command(result.seed, options, Some(&shrunk.plan))
    );
}

/// The deterministic report of one run.
pub fn render_run(result: &RunResult, options: &SimOptions, plan: Option<&FaultPlan>) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{}", replay_command(result.seed, options, plan));
    let _ = writeln!(out, "{options}");
    let _ = writeln!(out, "{}", LatencyMatrix::generate(result.seed, options));
    let _ = writeln!(out, "fault plan ({} ops):", result.plan.0.len());
    for op in &result.plan.0 {
        let _ = writeln!(out, "  {op}");
    }
    let w = &result.workload;
    let _ = writeln!(
        out,
        "workload: {} adds ({} on the hot key), {} acked, {} async-acked, {} abandoned, \
         {} retries, {} duplicate answers, {} lane skips",
        w.adds,
        w.hot_adds,
        w.acked,
        w.async_acked,
        w.abandoned,
        w.retries,
        w.duplicates,
        w.lane_skips
    );
    let n = &result.net;
    let _ = writeln!(
        out,
        "network: {} messages, {} cut, {} lost, {} duplicated, {} reordered, {} in the tail",
        n.sent, n.cut, n.lost, n.duplicated, n.reordered, n.tail
    );
    let s = &result.slots;
    let _ = writeln!(
        out,
        "replication: {} commits, {} pulls, {} replica incarnations; hot key ends at {}",
        result.commits, result.pulls, result.replicas, result.hot_value
    );
    let _ = writeln!(
        out,
        "idle: {} commits in the last {} ms, with every replica already equal and no client",
        result.idle_commits,
        crate::world::STABLE_MS
    );
    let _ = writeln!(
        out,
        "slots: {} checked; unacknowledged adds applied {}, lost {}; applied by two incarnations \
         across a wipe {}; acknowledged adds lost to a wipe {}",
        s.slots, s.unacked_applied, s.unacked_lost, s.applied_across_wipe, s.acked_lost_to_wipe
    );
    if options.durability == crate::options::Durability::Replicated {
        let c = &result.copies;
        let _ = writeln!(
            out,
            "copies: {} pushes, {} confirmed, {} failed; {} taken by copies; {} adds answered \
             UNAVAILABLE (copies unconfirmed in time)",
            c.pushes, c.confirmed, c.failed, c.taken, c.unconfirmed_adds
        );
    }
    if options.retire {
        let f = &result.folds;
        let _ = writeln!(
            out,
            "folds: {} retired ({} by an operator, {} refused), {} writers folded in {} epochs, \
             at most {} slots per counter at the end",
            f.retired,
            f.operator_retired,
            f.operator_refused,
            f.writers_folded,
            f.epochs,
            f.max_slots
        );
    }
    match result.convergence_ms {
        Some(ms) => {
            let _ = writeln!(
                out,
                "convergence: {ms} ms after the heal at {} ms (bound {} ms)",
                result.heal_ms, result.bound_ms
            );
        }
        None => {
            let _ = writeln!(out, "convergence: never (bound {} ms)", result.bound_ms);
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
        let _ = writeln!(
            out,
            "replay: {}",
            replay_command(result.seed, options, plan)
        );
    }
    out
}

impl SweepSummary {
    /// The first failing run, if any.
    pub fn first_failure(&self) -> Option<&RunResult> {
        self.results.iter().find(|r| !r.passed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits a command line as a shell would, for the one quoting that
    /// `replay_command` uses (single quotes around the plan).
    fn shell_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '\'' => quoted = !quoted,
                ' ' if !quoted => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                _ => word.push(c),
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        words
    }

    #[test]
    fn the_replay_command_parses_back_into_the_same_run() {
        let options = SimOptions {
            regions: 4,
            nodes_per_region: 2,
            async_nodes: 1,
            faults: "crash,partition".parse().unwrap(),
            ..SimOptions::default()
        };
        let plan = FaultPlan::generate(7, &options);
        assert!(
            !plan.one_line().is_empty(),
            "seed 7 should plan some faults"
        );
        let line = replay_command(7, &options, Some(&plan));
        let mut words = shell_words(&line);
        assert_eq!(words.remove(0), "tally-sim", "{line}");
        let cli = Cli::try_parse_from(std::iter::once("tally-sim".to_string()).chain(words))
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        let Command::Run(args) = cli.command else {
            panic!("{line} is not a run command");
        };
        assert_eq!(args.seed, Some(7));
        assert_eq!(args.sim.options(), options);
        let replayed = load_plan(args.plan.as_deref().unwrap(), &options).unwrap();
        assert_eq!(replayed, plan);

        let replicated = SimOptions {
            nodes_per_region: 3,
            durability: Durability::Replicated,
            write_copies: 3,
            ..SimOptions::default()
        };
        let line = replay_command(7, &replicated, None);
        assert!(
            line.contains("--durability replicated --write-copies 3"),
            "{line}"
        );
        let cli = Cli::try_parse_from(shell_words(&line)).unwrap_or_else(|e| panic!("{line}: {e}"));
        let Command::Run(args) = cli.command else {
            panic!("{line} is not a run command");
        };
        assert_eq!(args.sim.options(), replicated);
    }
}
