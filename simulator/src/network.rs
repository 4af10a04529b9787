//! The simulated network between nodes: a one-way latency matrix per region
//! pair with jitter and a heavy tail, partitions of any shape, and windows of
//! loss, duplication and reordering.
//!
//! Invariant: whether a message arrives, when, and how many times, is decided
//! here at send time from the network's own seeded stream and the active
//! faults, and from nothing else. Messages between a client and the node of
//! its own region are local (1 ms) and never cut: partitions model the WAN.

use std::fmt;

use crate::faults::Shape;
use crate::options::SimOptions;
use crate::rng::{between, chance, pareto, stream, SimRng, Subsystem};

/// Jitter around the base latency: plus or minus this fraction.
pub const JITTER: f64 = 0.1;
/// Probability that a message takes the heavy tail (when the tail is on).
pub const TAIL_PROBABILITY: f64 = 0.02;
/// Pareto shape of the tail.
pub const TAIL_ALPHA: f64 = 1.5;

/// One-way latencies between regions, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyMatrix {
    /// `base[a][b]`: the median one-way latency from region a to b.
    pub base: Vec<Vec<u64>>,
    /// Region names, for printing.
    pub names: Vec<String>,
    /// Whether the heavy tail is on.
    pub tail: bool,
    /// The longest extra delay the tail adds (ms).
    pub tail_cap_ms: u64,
}

impl LatencyMatrix {
    /// The matrix for `seed`: 1 ms inside a region, 20 to 150 ms between
    /// regions (symmetric).
    pub fn generate(seed: u64, options: &SimOptions) -> Self {
        let mut rng = stream(seed, Subsystem::Topology);
        let r = options.regions;
        let mut base = vec![vec![1u64; r]; r];
        #[allow(clippy::needless_range_loop)] // symmetric fill: both indices needed
        for a in 0..r {
            for b in (a + 1)..r {
                let ms = between(&mut rng, 20, 150);
                base[a][b] = ms;
                base[b][a] = ms;
            }
        }
        LatencyMatrix {
            base,
            names: (0..r).map(|i| options.region_name(i)).collect(),
            tail: options.faults.tail,
            // A pull's round trip stays under the pull timeout even in the tail.
            tail_cap_ms: options.pull_timeout_ms() / 4,
        }
    }

    /// The longest one-way latency a message can take.
    pub fn max_one_way_ms(&self) -> u64 {
        let base = self.base.iter().flatten().copied().max().unwrap_or(1);
        let jittered = (base as f64 * (1.0 + JITTER)).ceil() as u64;
        jittered + if self.tail { self.tail_cap_ms } else { 0 }
    }
}

impl fmt::Display for LatencyMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "latency (one-way ms, ±{:.0}% jitter{}):\n{:>10}",
            JITTER * 100.0,
            if self.tail {
                format!(
                    ", {:.0}% heavy tail up to +{} ms",
                    TAIL_PROBABILITY * 100.0,
                    self.tail_cap_ms
                )
            } else {
                String::new()
            },
            ""
        )?;
        for name in &self.names {
            write!(f, "{name:>10}")?;
        }
        for (a, row) in self.base.iter().enumerate() {
            write!(f, "\n{:>10}", self.names[a])?;
            for ms in row {
                write!(f, "{ms:>10}")?;
            }
        }
        Ok(())
    }
}

/// What the network did, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NetStats {
    /// Messages handed to the network.
    pub sent: u64,
    /// Dropped by a partition.
    pub cut: u64,
    /// Lost by a flaky window.
    pub lost: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Delayed out of order.
    pub reordered: u64,
    /// Took the heavy tail.
    pub tail: u64,
}

#[derive(Clone, Copy, Debug)]
struct Flaky {
    id: usize,
    loss: f64,
    dup: f64,
    reorder: f64,
}

/// See the module documentation.
pub struct Network {
    matrix: LatencyMatrix,
    region_of: Vec<usize>,
    n: usize,
    partitions: Vec<(usize, Shape)>,
    blocked: Vec<bool>,
    flaky: Vec<Flaky>,
    rng: SimRng,
    /// Counters.
    pub stats: NetStats,
}

impl Network {
    /// A network with no fault active.
    pub fn new(seed: u64, options: &SimOptions, matrix: LatencyMatrix) -> Self {
        let n = options.node_count();
        Network {
            matrix,
            region_of: (0..n).map(|node| options.region_of(node)).collect(),
            n,
            partitions: Vec::new(),
            blocked: vec![false; n * n],
            flaky: Vec::new(),
            rng: stream(seed, Subsystem::Network),
            stats: NetStats::default(),
        }
    }

    /// The latency matrix.
    pub fn matrix(&self) -> &LatencyMatrix {
        &self.matrix
    }

    /// Starts partition `id`.
    pub fn start_partition(&mut self, id: usize, shape: Shape, options: &SimOptions) {
        self.partitions.push((id, shape));
        self.recompute(options);
    }

    /// Heals partition `id` (if active).
    pub fn heal_partition(&mut self, id: usize, options: &SimOptions) {
        self.partitions.retain(|(active, _)| *active != id);
        self.recompute(options);
    }

    /// Heals everything: partitions and flaky windows.
    pub fn heal_all(&mut self, options: &SimOptions) {
        self.partitions.clear();
        self.flaky.clear();
        self.recompute(options);
    }

    fn recompute(&mut self, options: &SimOptions) {
        for from in 0..self.n {
            for to in 0..self.n {
                self.blocked[from * self.n + to] = self
                    .partitions
                    .iter()
                    .any(|(_, shape)| shape.blocks(from, to, options));
            }
        }
    }

    /// True when a message from `from` to `to` would be cut now.
    pub fn is_blocked(&self, from: usize, to: usize) -> bool {
        self.blocked[from * self.n + to]
    }

    /// True while any partition is active.
    pub fn partitioned(&self) -> bool {
        !self.partitions.is_empty()
    }

    /// Starts flaky window `id`.
    pub fn start_flaky(&mut self, id: usize, loss_pct: u32, dup_pct: u32, reorder_pct: u32) {
        self.flaky.push(Flaky {
            id,
            loss: f64::from(loss_pct) / 100.0,
            dup: f64::from(dup_pct) / 100.0,
            reorder: f64::from(reorder_pct) / 100.0,
        });
    }

    /// Ends flaky window `id`.
    pub fn end_flaky(&mut self, id: usize) {
        self.flaky.retain(|window| window.id != id);
    }

    fn latency(&mut self, from: usize, to: usize) -> u64 {
        let base = self.matrix.base[self.region_of[from]][self.region_of[to]] as f64;
        let jitter = 1.0 + JITTER * (2.0 * self.rng.random_f64() - 1.0);
        let mut ms = base * jitter;
        if self.matrix.tail && chance(&mut self.rng, TAIL_PROBABILITY) {
            self.stats.tail += 1;
            ms += pareto(
                &mut self.rng,
                base,
                TAIL_ALPHA,
                self.matrix.tail_cap_ms as f64,
            );
        }
        (ms.round() as u64).max(1)
    }

    /// Sends a message from node `from` to node `to`: the delays after which
    /// it arrives (none when cut or lost, two when duplicated).
    pub fn send(&mut self, from: usize, to: usize) -> Deliveries {
        self.stats.sent += 1;
        if self.is_blocked(from, to) {
            self.stats.cut += 1;
            return Deliveries::default();
        }
        let (mut loss, mut dup, mut reorder) = (0.0f64, 0.0f64, 0.0f64);
        for window in &self.flaky {
            loss = loss.max(window.loss);
            dup = dup.max(window.dup);
            reorder = reorder.max(window.reorder);
        }
        if chance(&mut self.rng, loss) {
            self.stats.lost += 1;
            return Deliveries::default();
        }
        let mut first = self.latency(from, to);
        if chance(&mut self.rng, reorder) {
            self.stats.reordered += 1;
            first += between(&mut self.rng, 1, 3 * first);
        }
        let second = if chance(&mut self.rng, dup) {
            self.stats.duplicated += 1;
            let again = self.latency(from, to);
            Some(again + between(&mut self.rng, 0, again))
        } else {
            None
        };
        Deliveries {
            first: Some(first),
            second,
        }
    }
}

/// When copies of a message arrive, as delays from now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Deliveries {
    /// The first copy.
    pub first: Option<u64>,
    /// A duplicate.
    pub second: Option<u64>,
}

impl Deliveries {
    /// Every delay.
    pub fn delays(self) -> impl Iterator<Item = u64> {
        self.first.into_iter().chain(self.second)
    }
}

trait RandomF64 {
    fn random_f64(&mut self) -> f64;
}

impl RandomF64 for SimRng {
    fn random_f64(&mut self) -> f64 {
        rand::Rng::random::<f64>(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cut_and_heal() {
        let options = SimOptions::default();
        let matrix = LatencyMatrix::generate(1, &options);
        let mut net = Network::new(1, &options, matrix);
        assert!(net.send(0, 1).first.is_some());
        net.start_partition(7, Shape::IsolateNode(1), &options);
        assert!(net.send(0, 1).first.is_none());
        assert!(net.send(0, 2).first.is_some());
        net.heal_partition(7, &options);
        assert!(!net.is_blocked(0, 1));
        assert_eq!(net.stats.cut, 1);
    }

    #[test]
    fn latency_stays_within_the_matrix_bounds() {
        let options = SimOptions::default();
        let matrix = LatencyMatrix::generate(3, &options);
        let max = matrix.max_one_way_ms();
        let mut net = Network::new(3, &options, matrix);
        for _ in 0..2_000 {
            let delay = net.send(0, 2).first.unwrap();
            assert!(delay >= 1 && delay <= max, "{delay} > {max}");
        }
    }
}
