//! The short scenario the tests sweep: 10 simulated seconds, every fault on
//! and at a higher rate, a 1 s burst on the hot key.

use tally_sim::SimOptions;

/// The test scenario.
pub fn scenario() -> SimOptions {
    SimOptions {
        duration_ms: 10_000,
        burst_ms: 1_000,
        burst_clients_per_region: 1,
        clients_per_region: 2,
        fault_rate: 30,
        ..Default::default()
    }
}

/// Worker threads for sweeps (not every test file sweeps).
#[allow(dead_code)]
pub fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}
