//! How values are written for people: state names, times, bytes, and the writer every
//! command prints through (a closed pipe ends the command quietly).

use std::io::{BufWriter, StdoutLock, Write};

use leaseq::JobState;

use crate::fail::{CliResult, Fail};

/// The state's name on the command line and in JSON.
pub fn state_name(state: JobState) -> &'static str {
    state.as_str()
}

/// Unix milliseconds as an RFC 3339 UTC time, `2024-05-01T12:00:00.000Z`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to a (year, month, day) of the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A text cut to `max` characters on one line (newlines and tabs shown as spaces).
pub fn short(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// Buffered stdout; every write error becomes a [`Fail`] (a closed pipe: a quiet end).
pub struct Out {
    w: BufWriter<StdoutLock<'static>>,
}

impl Out {
    /// Stdout, locked and buffered.
    pub fn new() -> Out {
        Out {
            w: BufWriter::with_capacity(64 << 10, std::io::stdout().lock()),
        }
    }

    /// Writes one line.
    pub fn line(&mut self, text: impl AsRef<str>) -> CliResult {
        let w = &mut self.w;
        w.write_all(text.as_ref().as_bytes())
            .and_then(|()| w.write_all(b"\n"))
            .map_err(|e| Fail::io("stdout", e))
    }

    /// Writes one value as a JSON line.
    pub fn json(&mut self, value: &impl serde::Serialize) -> CliResult {
        serde_json::to_writer(&mut self.w, value).map_err(|e| match e.io_error_kind() {
            Some(kind) => Fail::io("stdout", kind.into()),
            None => Fail::error(format!("json: {e}")),
        })?;
        self.w.write_all(b"\n").map_err(|e| Fail::io("stdout", e))
    }

    /// Writes bytes as they are.
    pub fn bytes(&mut self, bytes: &[u8]) -> CliResult {
        self.w.write_all(bytes).map_err(|e| Fail::io("stdout", e))
    }

    /// Flushes what is buffered.
    pub fn flush(&mut self) -> CliResult {
        self.w.flush().map_err(|e| Fail::io("stdout", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_of_known_times() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
