//! How a page shows a count: "999", "1K", "40.2K", "1.2M", "2.1B".
//!
//! The rule, as social sites apply it: below 1,000 the exact number; from
//! there on one decimal, **truncated** toward zero (1,999 is "1.9K", never
//! "2K": a count is never shown higher than it is), and a trailing ".0"
//! dropped. Suffixes: K (10^3), M (10^6), B (10^9), T (10^12) and Q
//! (quadrillion, 10^15), the largest; quintillions stay in Q, so `i64::MAX`
//! is "9223.3Q". Negative counts keep their sign.

/// The suffixes, largest first, with the value one unit of each stands for.
const UNITS: [(u64, &str); 5] = [
    (1_000_000_000_000_000, "Q"),
    (1_000_000_000_000, "T"),
    (1_000_000_000, "B"),
    (1_000_000, "M"),
    (1_000, "K"),
];

/// Renders a count the way a page shows it next to a post: exact below 1,000,
/// then one truncated decimal and a suffix (K, M, B, T, Q), with ".0" dropped.
///
/// ```
/// use tally_client::format_count;
/// assert_eq!(format_count(999), "999");
/// assert_eq!(format_count(1_000), "1K");
/// assert_eq!(format_count(1_999), "1.9K");
/// assert_eq!(format_count(40_213), "40.2K");
/// assert_eq!(format_count(1_204_311), "1.2M");
/// assert_eq!(format_count(2_100_000_000), "2.1B");
/// assert_eq!(format_count(-40_213), "-40.2K");
/// assert_eq!(format_count(i64::MAX), "9223.3Q");
/// ```
pub fn format_count(count: i64) -> String {
    let sign = if count < 0 { "-" } else { "" };
    // unsigned_abs has room for i64::MIN's magnitude; nothing below overflows.
    let magnitude = count.unsigned_abs();
    let Some(&(unit, suffix)) = UNITS.iter().find(|(unit, _)| magnitude >= *unit) else {
        return count.to_string();
    };
    let tenths = magnitude / (unit / 10);
    let (whole, tenth) = (tenths / 10, tenths % 10);
    if tenth == 0 {
        format!("{sign}{whole}{suffix}")
    } else {
        format!("{sign}{whole}.{tenth}{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn assert_shown(count: i64, expected: &str) {
        assert_eq!(format_count(count), expected, "count {count}");
    }

    #[test]
    fn small_counts_are_exact() {
        assert_shown(0, "0");
        assert_shown(7, "7");
        assert_shown(999, "999");
        assert_shown(-999, "-999");
    }

    #[test]
    fn whole_units_drop_the_decimal() {
        assert_shown(1_000, "1K");
        assert_shown(1_000_000, "1M");
        assert_shown(1_000_000_000, "1B");
        assert_shown(1_000_000_000_000, "1T");
        assert_shown(1_000_000_000_000_000, "1Q");
        assert_shown(1_049, "1K");
    }

    #[test]
    fn one_decimal_is_truncated_never_rounded_up() {
        assert_shown(1_999, "1.9K");
        assert_shown(40_213, "40.2K");
        assert_shown(999_999, "999.9K");
        assert_shown(1_204_311, "1.2M");
        assert_shown(1_999_999, "1.9M");
        assert_shown(2_100_000_000, "2.1B");
        assert_shown(2_199_999_999, "2.1B");
        assert_shown(5_550_000_000_000, "5.5T");
    }

    #[test]
    fn negative_counts_keep_the_sign_and_truncate_toward_zero() {
        assert_shown(-1_000, "-1K");
        assert_shown(-1_999, "-1.9K");
        assert_shown(-40_213, "-40.2K");
        assert_shown(-1_204_311, "-1.2M");
    }

    #[test]
    fn extremes_do_not_overflow() {
        assert_shown(i64::MAX, "9223.3Q");
        assert_shown(i64::MIN, "-9223.3Q");
        assert_shown(i64::MIN + 1, "-9223.3Q");
    }

    #[test]
    fn the_shown_value_is_never_above_the_true_one() {
        let mut count: i64 = 1;
        while count < i64::MAX / 3 {
            let shown = format_count(count);
            let (number, suffix) =
                shown.split_at(shown.trim_end_matches(char::is_alphabetic).len());
            let scale = match suffix {
                "" => 1.0,
                "K" => 1e3,
                "M" => 1e6,
                "B" => 1e9,
                "T" => 1e12,
                "Q" => 1e15,
                other => panic!("unexpected suffix {other:?}"),
            };
            let value: f64 = number.parse::<f64>().unwrap() * scale;
            assert!(
                value <= count as f64 * (1.0 + 1e-12),
                "{count} shown as {shown}"
            );
            count = count * 3 + 1;
        }
    }
}
