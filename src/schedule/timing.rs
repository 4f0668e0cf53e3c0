//! When a schedule is due: the next due time after an instant, for a fixed interval or a cron
//! expression in an IANA time zone. Pure: no clock, no file.
//!
//! Cron expressions are parsed by `croner` (POSIX/Vixie cron with an optional seconds field,
//! `L`, `#`, `W` and the `@daily` aliases); time zones come from `chrono-tz`, which carries
//! the IANA database inside the binary, so a due time is the same on every platform and does
//! not depend on the system's zone files. Daylight saving time follows croner: a wall-clock
//! time skipped by a spring-forward gap runs at the first instant after the gap, and a fixed
//! time of day repeated by a fall-back runs once.

use crate::error::{Error, Result};
use crate::format::schedule::StoredTiming;
#[cfg(feature = "cron")]
use crate::limits::CRON_TEXT_BYTES_MAX;

/// Whether this build computes cron due times (feature `cron`). Without it a cron schedule is
/// refused when set, and one already in a file is left as it is: never fired, its due entry
/// and record untouched, for a build with the feature.
pub(crate) const CRON_SUPPORTED: bool = cfg!(feature = "cron");

/// A parsed cron timing, ready to compute due times.
#[cfg(feature = "cron")]
pub(crate) struct CronTiming {
    cron: croner::Cron,
    zone: chrono_tz::Tz,
}

/// A build without the `cron` feature: no cron timing parses.
#[cfg(not(feature = "cron"))]
pub(crate) enum CronTiming {}

#[cfg(not(feature = "cron"))]
impl CronTiming {
    /// `InvalidOption` naming `cron`: this build has no cron support.
    pub(crate) fn parse(expression: &str, _time_zone: &str) -> Result<CronTiming> {
        Err(Error::invalid_option(
            "cron",
            format!(
                "{expression:?}: cron expressions need leaseq's `cron` feature (on by default); \
                 this build runs interval schedules only"
            ),
        ))
    }

    pub(crate) fn next_after(&self, _after_ms: u64) -> Option<u64> {
        match *self {}
    }
}

#[cfg(feature = "cron")]
impl CronTiming {
    /// Parses `expression` (5 fields, or 6 with seconds first) and `time_zone` (an IANA name
    /// such as `Europe/Berlin` or `UTC`). `InvalidOption` naming `cron` or `time_zone` for
    /// text that is empty, too long or not understood.
    pub(crate) fn parse(expression: &str, time_zone: &str) -> Result<CronTiming> {
        if expression.trim().is_empty() || expression.len() > CRON_TEXT_BYTES_MAX {
            return Err(Error::invalid_option(
                "cron",
                format!("{expression:?}: 1 to {CRON_TEXT_BYTES_MAX} bytes"),
            ));
        }
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|e| Error::invalid_option("cron", format!("{expression:?}: {e}")))?;
        if time_zone.is_empty() || time_zone.len() > CRON_TEXT_BYTES_MAX {
            return Err(Error::invalid_option(
                "time_zone",
                format!(
                    "{time_zone:?}: an IANA time zone name such as \"Europe/Berlin\" or \"UTC\""
                ),
            ));
        }
        let zone: chrono_tz::Tz = time_zone.parse().map_err(|_| {
            Error::invalid_option(
                "time_zone",
                format!("{time_zone:?} is not an IANA time zone name (such as \"Europe/Berlin\" or \"UTC\")"),
            )
        })?;
        Ok(CronTiming { cron, zone })
    }

    /// The first match strictly after `after_ms` (Unix ms), in Unix ms; `None` when there is
    /// none within croner's search limit (an expression such as February 30th never matches)
    /// or past the year 9999.
    pub(crate) fn next_after(&self, after_ms: u64) -> Option<u64> {
        use chrono::TimeZone;
        let after_ms = i64::try_from(after_ms).ok()?;
        let start = self.zone.timestamp_millis_opt(after_ms).single()?;
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        let next_ms = u64::try_from(next.timestamp_millis()).ok()?;
        // croner works in whole seconds: a start within a matching second could give that
        // second back; the next due time is always later.
        (next_ms > after_ms as u64).then_some(next_ms)
    }
}

/// The first due time of `timing` strictly after `after_ms` (Unix ms); `None` when it has no
/// more (a cron expression with no match left, or an interval past `u64::MAX` ms).
///
/// An interval is due at `start_ms + k * every_ms`: due times come from the start, never from
/// when a run ended, so they do not drift.
pub(crate) fn next_due_after(timing: &StoredTiming, after_ms: u64) -> Result<Option<u64>> {
    match timing {
        StoredTiming::Interval { every_ms, start_ms } => {
            debug_assert!(*every_ms > 0);
            if after_ms < *start_ms {
                return Ok(Some(*start_ms));
            }
            let k = (after_ms - start_ms) / every_ms + 1;
            Ok(k.checked_mul(*every_ms)
                .and_then(|d| d.checked_add(*start_ms)))
        }
        StoredTiming::Cron {
            expression,
            time_zone,
        } => {
            // A stored expression parsed when it was set; one that no longer does (another
            // build of croner) is damage for `check()`, and has no due time.
            let cron = CronTiming::parse(expression, time_zone)
                .map_err(|e| Error::corrupted(format!("schedule: {e}")))?;
            Ok(cron.next_after(after_ms))
        }
    }
}

#[cfg(all(test, feature = "cron"))]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    fn cron(expression: &str, time_zone: &str) -> StoredTiming {
        StoredTiming::Cron {
            expression: expression.into(),
            time_zone: time_zone.into(),
        }
    }

    #[test]
    fn interval_due_times_come_from_the_start_not_from_the_last_run() {
        let t = StoredTiming::Interval {
            every_ms: 1000,
            start_ms: 10_000,
        };
        assert_eq!(next_due_after(&t, 0).unwrap(), Some(10_000));
        assert_eq!(next_due_after(&t, 9_999).unwrap(), Some(10_000));
        assert_eq!(next_due_after(&t, 10_000).unwrap(), Some(11_000));
        // A run that ended late (at 11 999) does not move the grid.
        assert_eq!(next_due_after(&t, 11_999).unwrap(), Some(12_000));
        assert_eq!(next_due_after(&t, 12_000).unwrap(), Some(13_000));
        let far = StoredTiming::Interval {
            every_ms: u64::MAX / 2,
            start_ms: u64::MAX / 2,
        };
        assert_eq!(next_due_after(&far, u64::MAX - 1).unwrap(), None);
    }

    #[test]
    fn a_daily_cron_in_a_time_zone_follows_its_wall_clock() {
        // 2026-03-28 12:00 UTC; Berlin moves to summer time on 2026-03-29 at 02:00.
        let before_ms = 1_774_699_200_000;
        let t = cron("0 3 * * *", "Europe/Berlin");
        let first = next_due_after(&t, before_ms).unwrap().unwrap();
        // 2026-03-29 03:00 CEST = 01:00 UTC.
        assert_eq!(first, 1_774_746_000_000);
        let second = next_due_after(&t, first).unwrap().unwrap();
        // 2026-03-30 03:00 CEST: 24 h later, as the wall clock says.
        assert_eq!(second - first, 24 * HOUR);
        // The same expression in UTC is due at 03:00 UTC.
        let utc = next_due_after(&cron("0 3 * * *", "UTC"), before_ms)
            .unwrap()
            .unwrap();
        assert_eq!(utc, 1_774_753_200_000);
    }

    #[test]
    fn a_wall_clock_time_in_a_spring_forward_gap_runs_once_after_it() {
        // 02:30 does not exist in Berlin on 2026-03-29 (02:00 → 03:00).
        let t = cron("30 2 * * *", "Europe/Berlin");
        let before_ms = 1_774_699_200_000; // 2026-03-28 12:00 UTC
        let due = next_due_after(&t, before_ms).unwrap().unwrap();
        // The first instant after the gap: 03:00 CEST = 01:00 UTC on 2026-03-29.
        assert_eq!(due, 1_774_746_000_000);
        let next = next_due_after(&t, due).unwrap().unwrap();
        // Then 02:30 CEST on the 30th.
        assert_eq!(next, 1_774_830_600_000);
    }

    #[test]
    fn seconds_are_optional_and_aliases_work() {
        let t = cron("*/10 * * * * *", "UTC");
        assert_eq!(next_due_after(&t, 1_000).unwrap(), Some(10_000));
        assert_eq!(next_due_after(&t, 10_000).unwrap(), Some(20_000));
        assert_eq!(next_due_after(&t, 10_500).unwrap(), Some(20_000));
        let daily = cron("@daily", "UTC");
        assert_eq!(next_due_after(&daily, 1).unwrap(), Some(24 * HOUR));
    }

    #[test]
    fn bad_text_is_a_typed_error_naming_the_field() {
        for (expr, tz, field) in [
            ("not cron", "UTC", "cron"),
            ("", "UTC", "cron"),
            ("61 * * * *", "UTC", "cron"),
            ("0 3 * * *", "Mars/Olympus", "time_zone"),
            ("0 3 * * *", "", "time_zone"),
        ] {
            match CronTiming::parse(expr, tz) {
                Err(Error::InvalidOption { field: f, .. }) => {
                    assert_eq!(f, field, "{expr:?} {tz:?}")
                }
                Err(e) => panic!("{expr:?} {tz:?}: {e}"),
                Ok(_) => panic!("{expr:?} {tz:?} accepted"),
            }
        }
        let long = "*".repeat(CRON_TEXT_BYTES_MAX + 1);
        assert!(CronTiming::parse(&long, "UTC").is_err());
    }

    #[test]
    fn an_expression_that_never_matches_has_no_due_time() {
        let t = CronTiming::parse("0 0 30 2 *", "UTC").unwrap();
        assert_eq!(t.next_after(0), None);
    }
}
