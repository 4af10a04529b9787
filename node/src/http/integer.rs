//! JSON numbers that are integers, read exactly. JSON Schema calls `1.0`
//! and `1e3` integers, and clients generated from the OpenAPI document (or
//! written in languages whose numbers are doubles) send them; serde reads
//! them as floats, which round above 2^53. This module reads the number's
//! own text instead, so `1e3` is 1000 and `9007199254740993.0` is exactly
//! that, and anything with a fraction or outside `i64` is refused.

use serde::de::Error;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The integer a JSON number's text denotes, when it is one within `i64`.
pub fn exact_integer(text: &str) -> Option<i64> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((_, "")) => return None,
        Some(parts) => parts,
        None => (mantissa, ""),
    };
    if whole.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits: String = whole.chars().chain(fraction.chars()).collect();
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    // value = digits * 10^scale
    let scale = exponent.checked_sub(fraction.len() as i64)?;
    let digits = if scale < 0 {
        let cut = usize::try_from(-scale).ok()?;
        if cut >= digits.len() {
            // Every digit is fractional and at least one is not 0.
            return None;
        }
        let (kept, dropped) = digits.split_at(digits.len() - cut);
        if dropped.bytes().any(|b| b != b'0') {
            return None;
        }
        kept.to_string()
    } else {
        let zeros = usize::try_from(scale).ok().filter(|zeros| *zeros <= 20)?;
        format!("{digits}{}", "0".repeat(zeros))
    };
    if digits.len() > 20 {
        return None;
    }
    let magnitude: i128 = digits.parse().ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

/// Deserializes a JSON number that is an integer within `i64`, exactly.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let raw = Box::<RawValue>::deserialize(deserializer)?;
    let text = raw.get().trim();
    if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Err(D::Error::custom(format!(
            "expected an integer, found {text}"
        )));
    }
    exact_integer(text).ok_or_else(|| {
        D::Error::custom(format!(
            "{text} is not an integer from -9223372036854775808 to 9223372036854775807"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_in_any_json_spelling_are_read_exactly() {
        for (text, value) in [
            ("0", 0),
            ("-0", 0),
            ("0.0", 0),
            ("0e400", 0),
            ("1", 1),
            ("-14804.0", -14804),
            ("1e3", 1000),
            ("1E+3", 1000),
            ("12.50e1", 125),
            ("1500e-2", 15),
            ("9007199254740993.0", 9_007_199_254_740_993),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808", i64::MIN),
            ("-9223372036854775808.000", i64::MIN),
        ] {
            assert_eq!(exact_integer(text), Some(value), "{text}");
        }
    }

    #[test]
    fn fractions_and_out_of_range_numbers_are_refused() {
        for text in [
            "1.5",
            "0.1",
            "1e-1",
            "15e-1",
            "9223372036854775808",
            "-9223372036854775809",
            "1e19",
            "1e400",
            "",
            "-",
            ".5",
            "1.",
        ] {
            assert_eq!(exact_integer(text), None, "{text}");
        }
    }
}
