//! Which counter each bench request goes to: `--keys`, `--key-format`,
//! `--distribution`, `--sequential` and `--ops`.
//!
//! A key's number is drawn uniformly or from a Zipf distribution over
//! `--keys` numbers. Zipf ranks are scattered over the key numbers by a fixed
//! bijection, so the most popular keys are not neighbours in key order (a
//! store that groups neighbouring keys would otherwise be flattered). Up to
//! [`NAMED_UPFRONT`] keys are named once before the run; above that (10
//! million keys would take a gigabyte of names) each request names its key.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::Rng;

/// The most keys named before the run (about 40 MB of names).
const NAMED_UPFRONT: u32 = 1 << 20;

/// The largest Zipf exponent accepted: above it nearly every request goes to
/// the first key, which `--keys 1` says more plainly.
const MAX_ZIPF_EXPONENT: f64 = 10.0;

/// A `--key-format`: the text around one `{}` or `{:0N}`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KeyFormat {
    before: String,
    width: usize,
    after: String,
}

impl KeyFormat {
    pub(crate) fn parse(text: &str) -> Result<KeyFormat, String> {
        let open = text
            .find('{')
            .ok_or("give a format with {} (or {:0N}) where the key's number goes")?;
        let close = open
            + text[open..]
                .find('}')
                .ok_or("the key format's { has no closing }")?;
        let width = match &text[open + 1..close] {
            "" => 0,
            spec => spec
                .strip_prefix(":0")
                .and_then(|digits| digits.parse::<usize>().ok())
                .filter(|width| (1..=20).contains(width))
                .ok_or_else(|| format!("{{{spec}}} is not {{}} or {{:0N}} with N from 1 to 20"))?,
        };
        let after = &text[close + 1..];
        if after.contains(['{', '}']) {
            return Err("the key format takes one {} (or {:0N}) only".into());
        }
        Ok(KeyFormat {
            before: text[..open].into(),
            width,
            after: after.into(),
        })
    }

    /// The name of key number `n`.
    pub fn name(&self, n: u32) -> String {
        format!(
            "{}{:0width$}{}",
            self.before,
            n,
            self.after,
            width = self.width
        )
    }
}

/// A `--distribution`: how a random request picks its key's number.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// The key of popularity rank r (from 1) is picked with a probability
    /// proportional to 1 / r^S: `zipf:0.99` is the classic web workload.
    Zipf(f64),
}

impl KeyDistribution {
    pub(crate) fn parse(text: &str) -> Result<KeyDistribution, String> {
        if text == "uniform" {
            return Ok(KeyDistribution::Uniform);
        }
        let exponent = text
            .strip_prefix("zipf:")
            .ok_or_else(|| format!("{text:?} is not uniform or zipf:S (e.g. zipf:0.99)"))?;
        match exponent.parse::<f64>() {
            Ok(s) if s > 0.0 && s <= MAX_ZIPF_EXPONENT => Ok(KeyDistribution::Zipf(s)),
            _ => Err(format!(
                "the Zipf exponent {exponent:?} is not a number above 0 and at most {MAX_ZIPF_EXPONENT}"
            )),
        }
    }
}

impl fmt::Display for KeyDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyDistribution::Uniform => f.write_str("uniform"),
            KeyDistribution::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

/// The sampler behind a [`KeyDistribution`] over `count` key numbers.
enum Sampler {
    Uniform,
    /// Zipf ranks (rejection-inversion sampling, O(1) per draw), scattered
    /// by `rank * stride mod count` (a bijection: `stride` is coprime with
    /// `count`).
    Zipf {
        ranks: rand_distr::Zipf<f64>,
        stride: u64,
    },
}

/// The workers' keys and how each request picks one: at random (uniform or
/// Zipf), or in order with `--sequential`. With `--sequential` or `--ops`
/// the workers share one request counter (only then: an atomic touched by
/// every worker costs).
pub(super) struct KeyChooser {
    format: KeyFormat,
    count: u32,
    /// The keys' names when there are at most [`NAMED_UPFRONT`] of them.
    names: Option<Box<[String]>>,
    sampler: Sampler,
    next: AtomicU64,
    sequential: bool,
    limit: Option<u64>,
}

impl KeyChooser {
    pub(super) fn new(
        format: KeyFormat,
        count: u32,
        distribution: KeyDistribution,
        sequential: bool,
        limit: Option<u64>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(count > 0, "--keys must be at least 1");
        let sampler = match distribution {
            KeyDistribution::Uniform => Sampler::Uniform,
            KeyDistribution::Zipf(s) => Sampler::Zipf {
                ranks: rand_distr::Zipf::new(f64::from(count), s)
                    .map_err(|error| anyhow::anyhow!("--distribution zipf:{s}: {error}"))?,
                stride: coprime_stride(u64::from(count)),
            },
        };
        let names = (count <= NAMED_UPFRONT).then(|| (0..count).map(|n| format.name(n)).collect());
        Ok(KeyChooser {
            format,
            count,
            names,
            sampler,
            next: AtomicU64::new(0),
            sequential,
            limit,
        })
    }

    /// The next request's key, or `None` once `--ops` requests are sent.
    pub(super) fn pick(&self, rng: &mut SmallRng) -> Option<Cow<'_, str>> {
        let number = self.pick_number(rng)?;
        Some(match &self.names {
            Some(names) => Cow::Borrowed(names[number as usize].as_str()),
            None => Cow::Owned(self.format.name(number)),
        })
    }

    /// The next request's key number.
    fn pick_number(&self, rng: &mut SmallRng) -> Option<u32> {
        let count = u64::from(self.count);
        if self.sequential || self.limit.is_some() {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if self.limit.is_some_and(|limit| index >= limit) {
                return None;
            }
            if self.sequential {
                return Some((index % count) as u32);
            }
        }
        if count == 1 {
            return Some(0);
        }
        Some(match &self.sampler {
            Sampler::Uniform => rng.random_range(0..self.count),
            Sampler::Zipf { ranks, stride } => {
                // Ranks are 1..=count as floats; rank 1 is the most popular.
                let rank = (rng.sample(ranks) as u64).clamp(1, count) - 1;
                ((rank * stride) % count) as u32
            }
        })
    }

    /// How many requests took a number from the shared counter.
    #[cfg(test)]
    fn shared_draws(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }
}

/// A stride coprime with `count` (so `rank * stride mod count` visits every
/// number once), far from 1 so that neighbouring ranks land far apart.
fn coprime_stride(count: u64) -> u64 {
    // 2654435761 is prime (Knuth's multiplicative hash constant).
    let mut stride = 2_654_435_761 % count;
    while gcd(stride, count) != 1 {
        stride += 1;
    }
    stride
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rand::SeedableRng;

    use super::*;

    fn chooser(count: u32, distribution: KeyDistribution) -> KeyChooser {
        let format = KeyFormat::parse("k{}").unwrap();
        KeyChooser::new(format, count, distribution, false, None).unwrap()
    }

    #[test]
    fn sequential_keys_go_in_order_and_ops_stop_after_the_limit() {
        let mut rng = SmallRng::seed_from_u64(1);
        let format = KeyFormat::parse("k{}").unwrap();
        let ordered = KeyChooser::new(format, 2, KeyDistribution::Uniform, true, Some(3)).unwrap();
        let picked: Vec<Option<String>> = (0..5)
            .map(|_| ordered.pick(&mut rng).map(Cow::into_owned))
            .collect();
        let expected = [Some("k0"), Some("k1"), Some("k0"), None, None];
        assert_eq!(picked, expected.map(|key| key.map(String::from)));
        let random = chooser(2, KeyDistribution::Uniform);
        assert!((0..100).all(|_| random.pick(&mut rng).is_some()));
        assert_eq!(random.shared_draws(), 0, "no shared counter");
    }

    #[test]
    fn distributions_parse_and_bad_ones_are_refused() {
        assert_eq!(
            KeyDistribution::parse("uniform"),
            Ok(KeyDistribution::Uniform)
        );
        assert_eq!(
            KeyDistribution::parse("zipf:0.99"),
            Ok(KeyDistribution::Zipf(0.99))
        );
        assert_eq!(KeyDistribution::Zipf(0.99).to_string(), "zipf:0.99");
        for bad in [
            "", "zipf", "zipf:", "zipf:0", "zipf:-1", "zipf:nan", "zipf:11", "normal",
        ] {
            assert!(
                KeyDistribution::parse(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn zipf_keys_are_skewed_and_the_hottest_are_not_neighbours() {
        let mut rng = SmallRng::seed_from_u64(7);
        let keys = chooser(10_000, KeyDistribution::Zipf(0.99));
        let mut hits = vec![0u32; 10_000];
        for _ in 0..100_000 {
            hits[keys.pick_number(&mut rng).unwrap() as usize] += 1;
        }
        let mut by_popularity: Vec<usize> = (0..hits.len()).collect();
        by_popularity.sort_by_key(|&n| std::cmp::Reverse(hits[n]));
        // With s = 0.99 over 10^4 keys the top key takes about 10% of the
        // draws (1 / H(10^4, 0.99) ~ 0.095) and the top 1% about half; a
        // uniform draw would give each key 0.01%.
        let top = hits[by_popularity[0]];
        assert!((7_000..13_000).contains(&top), "top key drew {top}");
        let top_hundred: u32 = by_popularity[..100].iter().map(|&n| hits[n]).sum();
        assert!(top_hundred > 40_000, "top 1% drew {top_hundred}");
        // Rank 1 and rank 2 are scattered apart, not keys 0 and 1.
        let (first, second) = (by_popularity[0], by_popularity[1]);
        assert!(first.abs_diff(second) > 1, "{first} and {second}");
    }

    #[test]
    fn uniform_keys_cover_the_range() {
        let mut rng = SmallRng::seed_from_u64(3);
        let keys = chooser(100, KeyDistribution::Uniform);
        let seen: HashSet<u32> = (0..5_000)
            .map(|_| keys.pick_number(&mut rng).unwrap())
            .collect();
        assert_eq!(seen.len(), 100);
    }

    #[test]
    fn many_keys_are_named_per_request_with_the_same_names() {
        let mut rng = SmallRng::seed_from_u64(5);
        let keys = chooser(NAMED_UPFRONT + 1, KeyDistribution::Zipf(0.99));
        assert!(keys.names.is_none(), "not named up front");
        for _ in 0..1_000 {
            let key = keys.pick(&mut rng).unwrap();
            let number: u32 = key.strip_prefix('k').unwrap().parse().unwrap();
            assert!(number <= NAMED_UPFRONT);
        }
    }

    #[test]
    fn scattering_is_a_bijection() {
        for count in [1u64, 2, 3, 10, 97, 1_000, 1 << 20] {
            let stride = coprime_stride(count);
            let hit: HashSet<u64> = (0..count.min(5_000))
                .map(|rank| (rank * stride) % count)
                .collect();
            assert_eq!(hit.len() as u64, count.min(5_000), "count {count}");
        }
    }

    #[test]
    fn key_formats_name_keys() {
        let posts = KeyFormat::parse("post:1{:08}:likes").unwrap();
        assert_eq!(posts.name(23_456_789), "post:123456789:likes");
        assert_eq!(posts.name(5), "post:100000005:likes");
    }
}
