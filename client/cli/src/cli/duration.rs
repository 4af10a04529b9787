//! Durations on the command line (`200us`, `500ms`, `10s`, `1.5s`, `2m`, `1h`) and in
//! printed tables (`850ms`, `1.2s`, `3m05s`, `2h07m`). Pure functions.

use std::time::Duration;

/// Parses a number followed by a unit: `us`, `ms`, `s`, `m` or `h`. The number may
/// have a fraction (`1.5s`). A bare number is refused, since it is unclear
/// whether it means seconds or milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit; write e.g. 500ms, 10s, 2m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let seconds_per_unit = match unit.trim() {
        "us" | "µs" => 0.000_001,
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}; use us, ms, s, m or h"
            ))
        }
    };
    let amount: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number; write e.g. 10s"))?;
    Duration::try_from_secs_f64(amount * seconds_per_unit)
        .map_err(|_| format!("{text:?} is too long a duration"))
}

/// Like [`parse_duration`], refusing zero.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!("{text:?} is zero; give a positive duration"));
    }
    Ok(duration)
}

/// Shows a duration in a table cell, without spaces: `850ms` below a second,
/// `1.2s` below a minute, `3m05s` below an hour, then `2h07m`. Truncates.
pub fn format_age(age: Duration) -> String {
    let millis = age.as_millis();
    let seconds = age.as_secs();
    if millis < 1_000 {
        format!("{millis}ms")
    } else if seconds < 60 {
        format!("{seconds}.{}s", age.subsec_millis() / 100)
    } else if seconds < 3_600 {
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    } else {
        format!("{}h{:02}m", seconds / 3_600, seconds % 3_600 / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn assert_parses(text: &str, expected: Duration) {
        assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
    }

    #[track_caller]
    fn assert_refused(text: &str, needle: &str) {
        match parse_duration(text) {
            Err(message) => assert!(message.contains(needle), "{message:?} lacks {needle:?}"),
            Ok(duration) => panic!("{text:?} parsed as {duration:?}"),
        }
    }

    #[test]
    fn the_documented_forms_parse() {
        assert_parses("500ms", Duration::from_millis(500));
        assert_parses("200us", Duration::from_micros(200));
        assert_parses("0.5ms", Duration::from_micros(500));
        assert_parses("10s", Duration::from_secs(10));
        assert_parses("2m", Duration::from_secs(120));
        assert_parses("1h", Duration::from_secs(3600));
        assert_parses("1.5s", Duration::from_millis(1500));
        assert_parses("0s", Duration::ZERO);
        assert_parses(" 3s ", Duration::from_secs(3));
    }

    #[test]
    fn malformed_durations_are_refused_with_a_hint() {
        assert_refused("10", "no unit");
        assert_refused("", "no unit");
        assert_refused("10sec", "unknown unit");
        assert_refused("10d", "unknown unit");
        assert_refused("s", "does not start with a number");
        assert_refused("1.2.3s", "does not start with a number");
        assert_refused("-1s", "unknown unit");
    }

    #[test]
    fn zero_is_refused_where_a_positive_duration_is_needed() {
        assert!(parse_positive_duration("0ms").is_err());
        assert_eq!(parse_positive_duration("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn ages_are_short_and_have_no_spaces() {
        assert_eq!(format_age(Duration::from_millis(0)), "0ms");
        assert_eq!(format_age(Duration::from_millis(850)), "850ms");
        assert_eq!(format_age(Duration::from_millis(1_299)), "1.2s");
        assert_eq!(format_age(Duration::from_millis(59_999)), "59.9s");
        assert_eq!(format_age(Duration::from_secs(185)), "3m05s");
        assert_eq!(
            format_age(Duration::from_secs(2 * 3600 + 7 * 60 + 59)),
            "2h07m"
        );
    }
}
