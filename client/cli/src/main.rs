//! `tally`: the command-line client of a Tally cluster.
//!
//! Parses the command line, runs the command on a tokio runtime, and turns any
//! failure into exactly one line on stderr, `error: <message>`, and exit
//! status 1 (clap exits with 2 on bad usage). The commands and their output
//! formats are described in `src/cli/mod.rs`.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // `bench` picks its own thread count (it shares the machine with a node);
    // every other command runs on tokio's default runtime.
    let threads = match &args.command {
        cli::Command::Bench(bench) => Some(bench.threads()),
        _ => None,
    };
    let runtime = match threads {
        None => tokio::runtime::Runtime::new(),
        Some(1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(threads) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`tally watch KEY | head -1`): not a failure.
        Err(error) if cli::output::is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", cli::output::one_line(&error));
            ExitCode::FAILURE
        }
    }
}
