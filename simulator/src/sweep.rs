//! Sweeps: many seeds across the cores (plain std threads), a progress bar on
//! standard error, and a summary table.
//!
//! Invariant: the summary lists results in seed order, whatever thread ran
//! which seed, so it reads the same on every machine (timings aside).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::faults::FaultPlan;
use crate::options::SimOptions;
use crate::replay::replay_command;
use crate::world::{run, RunResult};

/// The results of a sweep.
#[derive(Debug)]
pub struct SweepSummary {
    /// Every run, in seed order (without report series).
    pub results: Vec<RunResult>,
    /// Failing runs.
    pub failed: u64,
    /// Wall time.
    pub wall: Duration,
    /// Threads used.
    pub threads: usize,
}

/// The `q` quantile (0 to 1) of sorted `values`.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Runs seeds `first..first + count` on `threads` threads.
pub fn sweep(
    first: u64,
    count: u64,
    threads: usize,
    options: &SimOptions,
    plan: Option<&FaultPlan>,
    progress: bool,
) -> SweepSummary {
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let slots: Mutex<Vec<Option<RunResult>>> = Mutex::new((0..count).map(|_| None).collect());
    let threads = threads.max(1).min(count.max(1) as usize);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    return;
                }
                // A seed that panics must not leave the progress loop
                // waiting for it forever: it is counted, then re-raised.
                let seed = first + index;
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run(seed, options, plan.cloned(), false)
                }));
                let result = match outcome {
                    Ok(result) => result,
                    Err(panic) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        failed.fetch_add(1, Ordering::Relaxed);
                        eprintln!("seed {seed} panicked");
                        std::panic::resume_unwind(panic);
                    }
                };
                if !result.passed() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                slots.lock().expect("results lock")[index as usize] = Some(result);
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
        if progress {
            // A terminal gets a bar redrawn in place; a log (CI) gets a line
            // every ten seconds instead of thousands of carriage returns.
            let tty = std::io::stderr().is_terminal();
            let mut last_line = started;
            loop {
                let finished = done.load(Ordering::Relaxed);
                let failed = failed.load(Ordering::Relaxed);
                if tty {
                    draw_bar(finished, count, failed, started);
                } else if finished >= count || last_line.elapsed() >= Duration::from_secs(10) {
                    eprintln!("{finished}/{count} seeds, {failed} failed");
                    last_line = Instant::now();
                }
                if finished >= count {
                    if tty {
                        eprintln!();
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    });
    let results: Vec<RunResult> = slots
        .into_inner()
        .expect("results lock")
        .into_iter()
        .map(|r| r.expect("every seed ran"))
        .collect();
    SweepSummary {
        failed: results.iter().filter(|r| !r.passed()).count() as u64,
        results,
        wall: started.elapsed(),
        threads,
    }
}

fn draw_bar(done: u64, total: u64, failed: u64, started: Instant) {
    const WIDTH: u64 = 30;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r[{bar}] {done}/{total} seeds, {failed} failed, {rate:.0} seeds/s "
    );
    let _ = err.flush();
}

impl SweepSummary {
    /// The summary table.
    pub fn render(&self, options: &SimOptions, plan: Option<&FaultPlan>) -> String {
        let mut out = String::new();
        let n = self.results.len() as u64;
        let first = self.results.first().map(|r| r.seed).unwrap_or(0);
        let _ = writeln!(out, "sweep: seeds {first}..{}", first + n);
        let _ = writeln!(out, "{options}");
        let events: u64 = self.results.iter().map(|r| r.events).sum();
        let mut convergence: Vec<u64> = self
            .results
            .iter()
            .filter_map(|r| r.convergence_ms)
            .collect();
        convergence.sort_unstable();
        let mut per_key: Vec<u64> = self
            .results
            .iter()
            .flat_map(|r| r.key_convergence_ms.iter().copied())
            .collect();
        per_key.sort_unstable();
        let bounds: Vec<u64> = self.results.iter().map(|r| r.bound_ms).collect();
        let adds: u64 = self.results.iter().map(|r| r.workload.adds).sum();
        let hot: u64 = self.results.iter().map(|r| r.workload.hot_adds).sum();
        let applied: u64 = self.results.iter().map(|r| r.slots.unacked_applied).sum();
        let lost: u64 = self.results.iter().map(|r| r.slots.unacked_lost).sum();
        let across: u64 = self
            .results
            .iter()
            .map(|r| r.slots.applied_across_wipe)
            .sum();
        let _ = writeln!(out, "{:<28}{:>12}", "seeds", n);
        let _ = writeln!(out, "{:<28}{:>12}", "passed", n - self.failed);
        let _ = writeln!(out, "{:<28}{:>12}", "failed", self.failed);
        let _ = writeln!(out, "{:<28}{:>12}", "simulated events", events);
        let _ = writeln!(
            out,
            "{:<28}{:>12}",
            "adds (hot key)",
            format!("{adds} ({hot})")
        );
        let _ = writeln!(
            out,
            "{:<28}{:>12}",
            "unacked applied / lost",
            format!("{applied} / {lost}")
        );
        let _ = writeln!(out, "{:<28}{:>12}", "applied across a wipe", across);
        let acked_lost: u64 = self
            .results
            .iter()
            .map(|r| r.slots.acked_lost_to_wipe)
            .sum();
        let acked: u64 = self.results.iter().map(|r| r.workload.acked).sum();
        let _ = writeln!(
            out,
            "{:<28}{:>12}",
            "acked lost to a wipe",
            format!("{acked_lost} of {acked}")
        );
        if options.durability == crate::options::Durability::Replicated {
            let sum = |f: fn(&crate::world::CopyStats) -> u64| -> u64 {
                self.results.iter().map(|r| f(&r.copies)).sum()
            };
            let _ = writeln!(
                out,
                "{:<28}{:>12}",
                "pushes confirmed / failed",
                format!("{} / {}", sum(|c| c.confirmed), sum(|c| c.failed))
            );
            let _ = writeln!(
                out,
                "{:<28}{:>12}",
                "adds copies-unconfirmed",
                sum(|c| c.unconfirmed_adds)
            );
        }
        if options.retire {
            let sum = |f: fn(&RunResult) -> u64| self.results.iter().map(f).sum::<u64>();
            let _ = writeln!(
                out,
                "{:<28}{:>12}",
                "retired / folded writers",
                format!(
                    "{} / {}",
                    sum(|r| r.folds.retired),
                    sum(|r| r.folds.writers_folded)
                )
            );
            let _ = writeln!(out, "{:<28}{:>12}", "fold epochs", sum(|r| r.folds.epochs));
            let _ = writeln!(
                out,
                "{:<28}{:>12}",
                "operator retire ok/refused",
                format!(
                    "{} / {}",
                    sum(|r| r.folds.operator_retired),
                    sum(|r| r.folds.operator_refused)
                )
            );
        }
        let _ = writeln!(
            out,
            "{:<28}{:>12}",
            "convergence p50/p99/max ms",
            format!(
                "{}/{}/{}",
                quantile(&convergence, 0.5),
                quantile(&convergence, 0.99),
                convergence.last().copied().unwrap_or(0)
            )
        );
        let _ = writeln!(
            out,
            "{:<28}{:>12}",
            "per-key p50/p99/max ms",
            format!(
                "{}/{}/{}",
                quantile(&per_key, 0.5),
                quantile(&per_key, 0.99),
                per_key.last().copied().unwrap_or(0)
            )
        );
        let _ = writeln!(
            out,
            "{:<28}{:>12}",
            "bound min/max ms",
            format!(
                "{}/{}",
                bounds.iter().min().unwrap_or(&0),
                bounds.iter().max().unwrap_or(&0)
            )
        );
        let mut kinds: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for result in self.results.iter().filter(|r| !r.passed()) {
            let kind = result.failure_kind().unwrap_or("?");
            let entry = kinds.entry(kind).or_insert((0, result.seed));
            entry.0 += 1;
        }
        if !kinds.is_empty() {
            let _ = writeln!(out, "failures by kind (count, first seed):");
            for (kind, (count, seed)) in &kinds {
                let _ = writeln!(out, "  {kind:<34}{count:>6}  seed {seed}");
            }
            let _ = writeln!(out, "failing seeds (first 10):");
            for result in self.results.iter().filter(|r| !r.passed()).take(10) {
                if let Some(v) = result.violations.first() {
                    let _ = writeln!(out, "  seed {}: {}: {}", result.seed, v.kind, v.detail);
                }
                let _ = writeln!(
                    out,
                    "    replay: {}",
                    replay_command(result.seed, options, plan)
                );
            }
        }
        let secs = self.wall.as_secs_f64().max(1e-9);
        let _ = writeln!(
            out,
            "result: {}",
            if self.failed == 0 { "PASS" } else { "FAIL" }
        );
        let _ = writeln!(
            out,
            "timing: {:.2} s wall on {} thread(s), {:.0} seeds/min, {:.2} M simulated events/s",
            secs,
            self.threads,
            n as f64 * 60.0 / secs,
            events as f64 / secs / 1e6
        );
        out
    }
}
