//! Unit tests of the HyperLogLog: the merge laws by proptest, the form chosen
//! by the registers alone, the byte encoding, the pinned hash, and the error
//! at 10^3, 10^5 and 10^6 distinct members against the published bound.

use proptest::prelude::*;

use super::*;

/// The published standard error of HyperLogLog with 2^14 registers.
const STANDARD_ERROR: f64 = 1.04 / 128.0;

fn sketch_strategy() -> impl Strategy<Value = HyperLogLog> {
    // Up to 3,000 registers so that both forms (and the switch) are covered.
    prop::collection::vec((0u16..REGISTERS as u16, 1u8..=MAX_RANK), 0..3000).prop_map(|regs| {
        let mut sketch = HyperLogLog::new();
        for (index, rank) in regs {
            sketch.raise(index, rank);
        }
        sketch
    })
}

fn merged(a: &HyperLogLog, b: &HyperLogLog) -> HyperLogLog {
    let mut out = a.clone();
    out.merge(b);
    out
}

fn observed(prefix: &str, range: std::ops::Range<u64>) -> HyperLogLog {
    let mut sketch = HyperLogLog::new();
    for i in range {
        sketch.observe(format!("{prefix}-{i}").as_bytes());
    }
    sketch
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn merge_obeys_the_crdt_laws(a in sketch_strategy(), b in sketch_strategy(), c in sketch_strategy()) {
        crate::crdt::laws::check_laws(&a, &b, &c)?;
    }

    #[test]
    fn merge_is_inflationary(a in sketch_strategy(), b in sketch_strategy()) {
        let m = merged(&a, &b);
        for (index, rank) in a.set_registers().into_iter().chain(b.set_registers()) {
            prop_assert!(m.register(index) >= rank);
        }
    }

    /// The form is a function of the registers: sparse exactly while at
    /// most SPARSE_LIMIT are set, whatever the order of raises and merges.
    #[test]
    fn form_depends_on_the_registers_only(a in sketch_strategy()) {
        prop_assert_eq!(a.is_dense(), a.set_registers().len() > SPARSE_LIMIT);
        let mut reversed = HyperLogLog::new();
        for (index, rank) in a.set_registers().into_iter().rev() {
            reversed.raise(index, rank);
        }
        prop_assert_eq!(&reversed, &a);
    }

    #[test]
    fn bytes_round_trip(a in sketch_strategy()) {
        prop_assert_eq!(HyperLogLog::from_bytes(&a.to_bytes()).unwrap(), a);
    }
}

#[test]
fn hash_and_position_are_pinned() {
    // If these change, every stored register is in the wrong place.
    assert_eq!(hash_member(b""), 0x6434_0b54_e015_6f04);
    assert_eq!(hash_member(b"sam"), 0xdc4e_f56b_4b4e_669b);
    assert_eq!(hash_member(b"user-1"), 0x2847_9a97_949e_1310);
    assert_eq!(position(0), (0, MAX_RANK));
    assert_eq!(position(u64::MAX), (16383, 1));
    assert_eq!(position(1), (0, 50));
    assert_eq!(position(1 << 49), (0, 1));
    assert_eq!(position(1 << 48), (0, 2));
}

#[test]
fn the_dense_form_packs_into_12_kib() {
    let sketch = observed("dense", 0..20_000);
    assert!(sketch.is_dense());
    assert_eq!(sketch.to_bytes().len(), 1 + DENSE_BYTES);
    assert_eq!(DENSE_BYTES, 12_288);
    let sparse = observed("sparse", 0..100);
    assert!(!sparse.is_dense());
    assert!(sparse.to_bytes().len() <= 3 + 3 * 100);
}

#[test]
fn malformed_bytes_are_refused() {
    assert!(HyperLogLog::from_bytes(&[]).is_err());
    assert!(HyperLogLog::from_bytes(&[7]).is_err());
    assert!(HyperLogLog::from_bytes(&[0, 0, 1, 0, 0]).is_err());
    assert_eq!(
        HyperLogLog::from_bytes(&[0, 0, 1, 0, 0, 52]),
        Err(RegisterError::Rank(52))
    );
    assert_eq!(
        HyperLogLog::from_bytes(&[0, 0, 1, 0xff, 0xff, 1]),
        Err(RegisterError::Index(65535))
    );
    assert!(HyperLogLog::from_bytes(&[1, 0, 0]).is_err());
    assert_eq!(check_register(16384, 1), Err(RegisterError::Index(16384)));
    assert_eq!(check_register(0, 0), Err(RegisterError::Rank(0)));
}

#[test]
fn an_empty_sketch_estimates_zero_and_repeats_count_once() {
    assert_eq!(HyperLogLog::new().estimate(), 0.0);
    let mut sketch = HyperLogLog::new();
    assert!(sketch.observe(b"sam").is_some());
    for _ in 0..100 {
        assert_eq!(sketch.observe(b"sam"), None);
    }
    assert!((sketch.estimate() - 1.0).abs() < 0.01);
}

#[track_caller]
fn assert_within(estimate: f64, truth: f64, bound: f64) {
    let error = (estimate - truth) / truth;
    assert!(
        error.abs() <= bound,
        "estimate {estimate:.0} of {truth} is off by {:.3}% (bound {:.3}%)",
        error * 100.0,
        bound * 100.0
    );
}

/// At 10^3 the sketch is nearly exact; at 10^5 and 10^6 every trial is
/// within three standard errors (99.7% of sketches) and the root mean square
/// of the trials within 1.5 of one (the published 0.81%).
#[test]
fn error_at_1e3_1e5_1e6_is_within_the_published_bounds() {
    for trial in 0..8 {
        let sketch = observed(&format!("k{trial}"), 0..1_000);
        assert_within(sketch.estimate(), 1e3, STANDARD_ERROR);
    }
    for (truth, trials) in [(100_000u64, 6), (1_000_000u64, 2)] {
        let mut squares = 0.0;
        for trial in 0..trials {
            let estimate = observed(&format!("t{trial}"), 0..truth).estimate();
            eprintln!("{truth} distinct: estimate {estimate:.0}");
            assert_within(estimate, truth as f64, 3.0 * STANDARD_ERROR);
            squares += ((estimate - truth as f64) / truth as f64).powi(2);
        }
        let rms = (squares / f64::from(trials)).sqrt();
        assert!(
            rms <= 1.5 * STANDARD_ERROR,
            "rms error {:.3}% at {truth}",
            rms * 100.0
        );
    }
}

#[test]
fn union_estimates_the_members_of_all_keys_once() {
    let a = observed("u", 0..60_000);
    let b = observed("u", 40_000..100_000);
    assert_within(
        HyperLogLog::union_estimate([&a, &b]),
        1e5,
        3.0 * STANDARD_ERROR,
    );
    let whole = observed("u", 0..100_000);
    assert_eq!(merged(&a, &b), whole);
}
