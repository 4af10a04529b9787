//! The `tally-sim` command: `run` (deterministic simulation, one seed or a
//! sweep) and `chaos` (real processes). See `docs/src/simulator.md`.

/// mimalloc instead of glibc's malloc, as in the node (`node/src/main.rs`):
/// glibc's malloc and free were about 30% of the partitioned simulator's
/// time (issue 42). Results do not depend on it; only the speed does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tally_sim::cli::main()
}
