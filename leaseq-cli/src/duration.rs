//! Durations on the command line: a whole number and a unit (`1500ms`, `30s`, `5m`, `2h`,
//! `1d`), at most [`leaseq::DELAY_MAX`].

use std::time::Duration;

/// The units accepted and their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Parses `"30s"` and the like. Refuses an empty text, a sign, a missing or unknown unit, a
/// fraction, and anything above [`leaseq::DELAY_MAX`], each with a message saying so.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration (expected e.g. 30s, 5m, 2h, 1500ms, 1d)".into());
    }
    if t.starts_with('-') {
        return Err(format!("negative duration {t:?} (durations are 0 or more)"));
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "{t:?} does not start with a whole number (expected e.g. 30s, 5m, 2h, 1500ms, 1d)"
        ));
    }
    if unit.is_empty() {
        return Err(format!(
            "{t:?} has no unit (use ms, s, m, h or d, e.g. {number}s)"
        ));
    }
    let Some(&(_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!(
            "unknown unit {unit:?} in {t:?} (use ms, s, m, h or d; whole numbers only)"
        ));
    };
    let max_ms = leaseq::DELAY_MAX.as_millis() as u64;
    let too_long = || {
        format!(
            "{t:?} is longer than the maximum of {}d",
            max_ms / 86_400_000
        )
    };
    let n: u64 = number.parse().map_err(|_| too_long())?;
    let ms = n.checked_mul(unit_ms).ok_or_else(too_long)?;
    if ms > max_ms {
        return Err(too_long());
    }
    Ok(Duration::from_millis(ms))
}

/// A duration in the largest unit that keeps it whole (`90000` ms is `90s`, `120000` is `2m`).
pub fn format_ms(ms: u64) -> String {
    for &(name, unit_ms) in UNITS.iter().rev() {
        if ms >= unit_ms && ms.is_multiple_of(unit_ms) {
            return format!("{}{name}", ms / unit_ms);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("365d"), Ok(leaseq::DELAY_MAX));
    }

    #[test]
    fn bad_input_is_refused() {
        for bad in [
            "",
            " ",
            "-5s",
            "5",
            "5x",
            "s",
            "1.5h",
            "366d",
            "99999999999999999999s",
            "18446744073709551615d",
            "5 s",
            "+5s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn format_picks_the_largest_whole_unit() {
        assert_eq!(format_ms(0), "0ms");
        assert_eq!(format_ms(1500), "1500ms");
        assert_eq!(format_ms(90_000), "90s");
        assert_eq!(format_ms(120_000), "2m");
        assert_eq!(format_ms(86_400_000), "1d");
    }
}
