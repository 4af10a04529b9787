//! The `tally-sim` command: `run` (deterministic simulation, one seed or a
//! sweep) and `chaos` (real processes). See `docs/src/simulator.md`.

fn main() -> std::process::ExitCode {
    tally_sim::cli::main()
}
