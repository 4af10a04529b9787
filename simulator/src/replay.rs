//! The replay command of a seed: the one line a person pastes to run a
//! failing (or interesting) simulation again.
//!
//! It lives apart from the command line, the sweep and the report so that all
//! three can print it without importing each other in a circle (`cli` runs
//! sweeps and writes reports; neither of those needs `cli`).
//!
//! Invariant: the line names every option that differs from the default (via
//! [`SimOptions::to_args`]) and the plan when one is given, so running it
//! repeats the run exactly.

use crate::faults::FaultPlan;
use crate::options::SimOptions;

/// The replay command of a seed, with the options and (when given) the plan.
pub fn replay_command(seed: u64, options: &SimOptions, plan: Option<&FaultPlan>) -> String {
    replay_line(
        "run",
        seed,
        &options.to_args(),
        plan.map(FaultPlan::one_line),
    )
}

/// `tally-sim SUBCOMMAND --seed S ARGS --plan 'PLAN'`, leaving out what is empty.
pub fn replay_line(subcommand: &str, seed: u64, args: &str, plan: Option<String>) -> String {
    let mut command = format!("tally-sim {subcommand} --seed {seed}");
    if !args.is_empty() {
        command.push(' ');
        command.push_str(args);
    }
    if let Some(plan) = plan {
        command.push_str(&format!(" --plan '{plan}'"));
    }
    command
}

#[cfg(test)]
mod tests {
    /// The sweep and the report print replay commands; they must take them
    /// from here, not from `cli` (which imports both of them).
    #[test]
    fn neither_the_sweep_nor_the_report_imports_the_command_line() {
        for (name, source) in [
            ("sweep.rs", include_str!("sweep.rs")),
            ("report.rs", include_str!("report.rs")),
        ] {
            assert!(
                !source.contains("crate::cli"),
                "{name} imports crate::cli, which imports it back"
            );
        }
    }
}
