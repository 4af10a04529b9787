//! Random numbers for the client, without an RNG crate: the random part of
//! generated idempotency keys and the jitter of retry backoffs.
//!
//! std's `RandomState` is keyed from the OS's random source once per thread
//! (128 bits), and every new instance on a thread bumps that key by one. So
//! hashing a constant with a fresh instance evaluates SipHash, a keyed
//! pseudorandom function, at a new point each time: values that are unique
//! per thread (the inputs differ), unpredictable without the thread's key,
//! and independent between threads and processes (their keys are drawn
//! apart). That is what idempotency keys need (no two adds may share one)
//! and more than jitter needs, at the cost of one SipHash (~20 ns).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A fresh pseudorandom 64-bit value.
pub(crate) fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0x7a11_7a11_7a11_7a11);
    hasher.finish()
}

/// A jitter drawn uniformly from `[0, 1)`, for [`crate::retry::Backoff::delay`].
pub(crate) fn jitter() -> f64 {
    // The top 53 bits fill an f64's mantissa exactly.
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn values_do_not_repeat_within_or_across_threads() {
        let draw = || (0..10_000).map(|_| random_u64()).collect::<Vec<_>>();
        let here = draw();
        let there = std::thread::spawn(draw).join().unwrap();
        let distinct: HashSet<u64> = here.iter().chain(&there).copied().collect();
        assert_eq!(distinct.len(), 20_000);
    }

    #[test]
    fn every_bit_takes_both_values_about_half_the_time() {
        let draws: Vec<u64> = (0..4_000).map(|_| random_u64()).collect();
        for bit in 0..64 {
            let ones = draws.iter().filter(|draw| *draw >> bit & 1 == 1).count();
            assert!(
                (1_700..2_300).contains(&ones),
                "bit {bit}: {ones} ones in 4,000"
            );
        }
    }

    #[test]
    fn jitter_is_uniform_enough_to_spread_retries() {
        let draws: Vec<f64> = (0..4_000).map(|_| jitter()).collect();
        assert!(draws.iter().all(|draw| (0.0..1.0).contains(draw)));
        // Each quarter of [0, 1) gets about 1,000 draws; a constant, or a
        // value stuck in one half, would leave some quarter nearly empty.
        for quarter in 0..4 {
            let low = f64::from(quarter) / 4.0;
            let count = draws
                .iter()
                .filter(|draw| (low..low + 0.25).contains(*draw))
                .count();
            assert!(
                (800..1_200).contains(&count),
                "quarter {quarter}: {count} draws"
            );
        }
    }
}
