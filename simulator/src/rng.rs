//! Seeded randomness, split per subsystem.
//!
//! Invariant: every random choice of a run comes from the one seed. Each
//! subsystem (fault plan, network, workload, disk, membership, replica ids,
//! topology) draws from its own ChaCha8 stream, derived from the seed and the
//! subsystem's number, so removing a fault from the plan does not shift the
//! workload's or the network's draws. Nothing here reads a clock.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The generator every subsystem uses.
pub type SimRng = ChaCha8Rng;

/// The subsystems that draw random numbers, each from its own stream.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub enum Subsystem {
    /// The fault plan.
    Plan = 1,
    /// Message latency, loss, duplication, reordering.
    Network = 2,
    /// Clients: keys, signs, think times.
    Workload = 3,
    /// Fsync delays.
    Disk = 4,
    /// Failure-detection delays.
    Membership = 5,
    /// Fresh replica ids.
    Identity = 6,
    /// The latency matrix and start offsets.
    Topology = 7,
    /// Likes, unlikes and observes (`--sets`).
    Sets = 8,
    /// Plan operations added after the first plans (a joined node that
    /// drains later), drawn apart so that the earlier operations of a
    /// seed's plan stay what they were.
    PlanChurn = 9,
}

/// The stream of `subsystem` for `seed`.
pub fn stream(seed: u64, subsystem: Subsystem) -> SimRng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(subsystem as u64);
    rng
}

/// True with probability `p` (0 to 1).
pub fn chance(rng: &mut SimRng, p: f64) -> bool {
    p > 0.0 && rng.random::<f64>() < p
}

/// A uniform integer in `lo..=hi`.
pub fn between(rng: &mut SimRng, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

/// An exponentially distributed delay with the given mean, at least 1.
pub fn exponential(rng: &mut SimRng, mean: f64) -> u64 {
    let u: f64 = rng.random::<f64>().max(1e-12);
    ((-u.ln()) * mean).max(1.0) as u64
}

/// A Pareto-distributed extra (heavy tail) of scale `scale` and shape
/// `alpha`, capped at `cap`.
pub fn pareto(rng: &mut SimRng, scale: f64, alpha: f64, cap: f64) -> f64 {
    let u: f64 = rng.random::<f64>().max(1e-12);
    (scale * (u.powf(-1.0 / alpha) - 1.0)).min(cap)
}

/// Samples ranks `0..n` with probability proportional to `1 / (rank + 1)^s`.
#[derive(Clone, Debug)]
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    /// A sampler over `n` ranks (at least one) with exponent `s`.
    pub fn new(n: usize, s: f64) -> Self {
        let mut total = 0.0;
        let cumulative = (0..n.max(1))
            .map(|rank| {
                total += 1.0 / ((rank + 1) as f64).powf(s);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    /// One rank.
    pub fn sample(&self, rng: &mut SimRng) -> usize {
        let total = *self.cumulative.last().expect("at least one rank");
        let x = rng.random::<f64>() * total;
        self.cumulative
            .partition_point(|c| *c <= x)
            .min(self.cumulative.len() - 1)
    }
}

/// A 64-bit running hash of the event trace: fixed, fast, the same on every
/// platform (a multiply-rotate mix, not for adversaries).
#[derive(Clone, Copy, Debug)]
pub struct TraceHasher(u64);

impl Default for TraceHasher {
    fn default() -> Self {
        TraceHasher(0x9e37_79b9_7f4a_7c15)
    }
}

impl TraceHasher {
    /// Mixes one word in.
    #[inline]
    pub fn mix(&mut self, word: u64) {
        let x = (self.0 ^ word).wrapping_mul(0xff51_afd7_ed55_8ccd);
        self.0 = x.rotate_left(29) ^ (x >> 31);
    }

    /// Mixes several words in.
    pub fn mix_all(&mut self, words: &[u64]) {
        for word in words {
            self.mix(*word);
        }
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_independent() {
        let a: Vec<u64> = (0..4)
            .map(|_| stream(7, Subsystem::Network).random())
            .collect();
        let mut one = stream(7, Subsystem::Network);
        let mut two = stream(7, Subsystem::Network);
        let mut other = stream(7, Subsystem::Workload);
        let x: u64 = one.random();
        assert_eq!(x, two.random::<u64>());
        assert_ne!(x, other.random::<u64>());
        assert_eq!(a[0], a[1], "a fresh stream starts at the same place");
    }

    #[test]
    fn zipf_prefers_low_ranks() {
        let zipf = Zipf::new(100, 1.1);
        let mut rng = stream(1, Subsystem::Workload);
        let mut counts = [0usize; 100];
        for _ in 0..10_000 {
            counts[zipf.sample(&mut rng)] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[50]);
        assert!(counts.iter().all(|c| *c < 10_000));
    }
}
