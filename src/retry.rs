//! The retry policy: how long a job waits before its next attempt after one that did not ack
//! (a `nack` without an explicit backoff, a lease that expired, an `ack_with` whose closure
//! failed).

use std::time::Duration;

use crate::clock::duration_ms;
use crate::error::{Error, Result};
use crate::job::state::JobId;

/// How long a job waits before its next attempt after an attempt that ended without an ack:
/// a [`Lease::nack`](crate::Lease::nack) (without an explicit backoff), a lease that expired,
/// an [`ack_with`](crate::Lease::ack_with) whose closure failed. The wait counts from the
/// moment the attempt ended (the nack, or the dequeue that found the lease expired), on the
/// queue's [`Clock`](crate::Clock). A job waiting for its retry never blocks the jobs behind
/// it. Leases returned by a reopen after a crash are ready at once, whatever the policy.
///
/// Set per queue with [`Builder::retry`](crate::Builder::retry). The default is
/// [`RetryPolicy::default`]: exponential from 1 s, doubling, capped at 1 hour, with 10 %
/// jitter (as Oban and River back off by default; BullMQ and SQS retry at once, which is
/// [`RetryPolicy::immediate`]).
///
/// ```
/// use leaseq::{JobId, RetryPolicy};
/// use std::time::Duration;
/// let p = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60));
/// assert_eq!(p.delay_ms(JobId(1), 1), 1_000);
/// assert_eq!(p.delay_ms(JobId(1), 3), 4_000);
/// assert_eq!(p.delay_ms(JobId(1), 30), 60_000); // capped
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryPolicy {
    pub(crate) kind: RetryKind,
    pub(crate) base_ms: u64,
    pub(crate) cap_ms: u64,
    pub(crate) jitter_percent: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RetryKind {
    Immediate,
    Fixed,
    Exponential,
}

impl Default for RetryPolicy {
    /// Exponential from 1 s, doubling, capped at 1 hour, with 10 % jitter.
    fn default() -> RetryPolicy {
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60 * 60))
            .with_jitter(10)
    }
}

impl RetryPolicy {
    /// Retry at once: the job is ready again, behind the jobs already ready (as BullMQ
    /// without a backoff, or SQS once a visibility timeout ends).
    pub const fn immediate() -> RetryPolicy {
        RetryPolicy {
            kind: RetryKind::Immediate,
            base_ms: 0,
            cap_ms: 0,
            jitter_percent: 0,
        }
    }

    /// Wait `delay` (whole milliseconds, from 1 ms to [`DELAY_MAX`](crate::DELAY_MAX),
    /// checked where the policy is set) before every retry; with jitter, up to that share
    /// more (at most `DELAY_MAX`).
    pub fn fixed(delay: Duration) -> RetryPolicy {
        RetryPolicy {
            kind: RetryKind::Fixed,
            base_ms: duration_ms(delay),
            cap_ms: duration_ms(crate::limits::DELAY_MAX),
            jitter_percent: 0,
        }
    }

    /// Wait `base × 2^(n−1)` after the n-th attempt, at most `cap` (whole milliseconds; base
    /// from 1 ms, cap from base to [`DELAY_MAX`](crate::DELAY_MAX), checked where the policy
    /// is set), as BullMQ's exponential backoff.
    pub fn exponential(base: Duration, cap: Duration) -> RetryPolicy {
        RetryPolicy {
            kind: RetryKind::Exponential,
            base_ms: duration_ms(base),
            cap_ms: duration_ms(cap),
            jitter_percent: 0,
        }
    }

    /// Adds up to `percent` % (0 to 100, checked where the policy is set) to every delay,
    /// before the cap is applied, so the cap always holds: jobs that failed together
    /// retry spread out, except where their delays reach the cap (an exponential policy's
    /// late attempts all wait exactly the cap). The share is drawn from the job's id and attempt, so the delay of
    /// a given job and attempt is always the same (no random state, and tests can predict
    /// it). Default 0 for [`fixed`](RetryPolicy::fixed) and
    /// [`exponential`](RetryPolicy::exponential).
    pub fn with_jitter(mut self, percent: u8) -> RetryPolicy {
        self.jitter_percent = percent;
        self
    }

    /// Which policy this is: `"immediate"`, `"fixed"` or `"exponential"` (for export and
    /// display; rebuild it with the constructor of that name).
    pub fn kind(&self) -> &'static str {
        match self.kind {
            RetryKind::Immediate => "immediate",
            RetryKind::Fixed => "fixed",
            RetryKind::Exponential => "exponential",
        }
    }

    /// The delay of a fixed policy, or the first delay of an exponential one, in ms (0 for
    /// immediate).
    pub fn base_ms(&self) -> u64 {
        self.base_ms
    }

    /// The longest delay, in ms: an exponential policy's cap, `DELAY_MAX` for a fixed one, 0
    /// for immediate.
    pub fn cap_ms(&self) -> u64 {
        self.cap_ms
    }

    /// The jitter share, in percent (0 to 100).
    pub fn jitter_percent(&self) -> u8 {
        self.jitter_percent
    }

    /// The wait, in milliseconds, before the attempt that follows attempt `attempt` (1 for
    /// the first delivery) of job `job_id`. For a policy whose settings pass the checks made
    /// where it is set (an invalid one is refused there with `InvalidOption`, never used), and
    /// every attempt from 1 to `u32::MAX`: finite, at most the cap (`DELAY_MAX` for a fixed
    /// policy), never 0 except for [`immediate`](RetryPolicy::immediate), and non-decreasing
    /// in `attempt` without jitter.
    /// Attempt 0 is treated as 1.
    pub fn delay_ms(&self, job_id: JobId, attempt: u32) -> u64 {
        let raw = match self.kind {
            RetryKind::Immediate => return 0,
            RetryKind::Fixed => self.base_ms,
            RetryKind::Exponential => {
                let doublings = attempt.max(1) - 1;
                // base × 2^doublings, saturating: past 63 doublings every base overflows.
                match 1u64.checked_shl(doublings) {
                    Some(factor) if doublings < 64 => self.base_ms.saturating_mul(factor),
                    _ => u64::MAX,
                }
            }
        };
        let jitter = if self.jitter_percent == 0 {
            0
        } else {
            // raw × percent / 100 × share, share in [0, 1) from the job and attempt; u128
            // so no product can wrap.
            let span = u128::from(raw) * u128::from(self.jitter_percent) / 100;
            let share = u128::from(mix(job_id.0, attempt) >> 32);
            u64::try_from((span * share) >> 32).unwrap_or(u64::MAX)
        };
        raw.saturating_add(jitter).min(self.cap_ms)
    }

    /// Checks the settings: a base of at least 1 ms, a cap from the base to `DELAY_MAX`,
    /// jitter at most 100 %.
    pub(crate) fn validate(&self, field: &'static str) -> Result<()> {
        let delay_max_ms = duration_ms(crate::limits::DELAY_MAX);
        let fail = |why: String| Err(Error::invalid_option(field, why));
        match self.kind {
            RetryKind::Immediate => Ok(()),
            _ if self.base_ms == 0 => fail("the delay (base) must be at least 1 ms".into()),
            _ if self.cap_ms < self.base_ms => fail(format!(
                "the cap ({} ms) is below the base ({} ms)",
                self.cap_ms, self.base_ms
            )),
            _ if self.cap_ms > delay_max_ms => fail(format!(
                "{} ms is above DELAY_MAX ({delay_max_ms} ms)",
                self.cap_ms
            )),
            _ if self.jitter_percent > 100 => fail(format!(
                "jitter of {} % is above 100 %",
                self.jitter_percent
            )),
            _ => Ok(()),
        }
    }
}

/// A well-mixed 64-bit value from a job id and an attempt (splitmix64's finalizer).
fn mix(job_id: u64, attempt: u32) -> u64 {
    let mut z = job_id
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(attempt));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ATTEMPTS: [u32; 9] = [1, 2, 3, 30, 63, 64, 65, 310, 1_000_000];

    /// C27: at attempts 1, 2, 30, 64, 310, 1,000,000 and `u32::MAX - 1`, every delay is
    /// finite, at most the cap, never zero, non-decreasing without jitter; with jitter the cap
    /// still holds.
    #[test]
    fn c27_exponential_delays_are_bounded_and_monotonic_at_every_attempt() {
        let caps = [1, 999, 60_000, duration_ms(crate::limits::DELAY_MAX)];
        for base in [1u64, 7, 1_000, 86_400_000] {
            for cap in caps.into_iter().filter(|&c| c >= base) {
                for jitter in [0u8, 10, 50, 100] {
                    let p = RetryPolicy::exponential(
                        Duration::from_millis(base),
                        Duration::from_millis(cap),
                    )
                    .with_jitter(jitter);
                    p.validate("retry").unwrap();
                    let mut last = 0;
                    let mut attempts: Vec<u32> = ATTEMPTS.to_vec();
                    attempts.extend([u32::MAX - 1, u32::MAX]);
                    for a in attempts {
                        for id in [1u64, 2, 1 << 40, u64::MAX] {
                            let d = p.delay_ms(JobId(id), a);
                            assert!((1..=cap).contains(&d), "{p:?} attempt {a}: {d}");
                            if jitter == 0 {
                                assert!(d >= last, "{p:?} attempt {a}: {d} < {last}");
                                last = d;
                            } else {
                                let raw = RetryPolicy {
                                    jitter_percent: 0,
                                    ..p
                                }
                                .delay_ms(JobId(id), a);
                                assert!(d >= raw, "jitter only adds: {d} < {raw}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn exponential_doubles_from_the_base_until_the_cap() {
        let p = RetryPolicy::exponential(Duration::from_millis(250), Duration::from_secs(10));
        let got: Vec<u64> = (1..=8).map(|a| p.delay_ms(JobId(9), a)).collect();
        assert_eq!(got, [250, 500, 1_000, 2_000, 4_000, 8_000, 10_000, 10_000]);
        assert_eq!(
            p.delay_ms(JobId(9), 0),
            250,
            "attempt 0 counts as the first"
        );
    }

    #[test]
    fn fixed_and_immediate_policies() {
        let f = RetryPolicy::fixed(Duration::from_secs(3));
        assert!(ATTEMPTS.iter().all(|&a| f.delay_ms(JobId(4), a) == 3_000));
        let i = RetryPolicy::immediate();
        assert!(ATTEMPTS.iter().all(|&a| i.delay_ms(JobId(4), a) == 0));
        i.validate("retry").unwrap();
    }

    #[test]
    fn jitter_spreads_jobs_and_is_the_same_for_the_same_job_and_attempt() {
        let p = RetryPolicy::fixed(Duration::from_secs(10)).with_jitter(50);
        p.validate("retry").unwrap();
        let delays: std::collections::BTreeSet<u64> =
            (1..200).map(|id| p.delay_ms(JobId(id), 1)).collect();
        assert!(
            delays.len() > 100,
            "jitter spreads: {} distinct",
            delays.len()
        );
        assert!(delays.iter().all(|d| (10_000..=15_000).contains(d)));
        assert_eq!(p.delay_ms(JobId(5), 2), p.delay_ms(JobId(5), 2));
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        let s = Duration::from_secs;
        let bad = [
            RetryPolicy::fixed(Duration::ZERO),
            RetryPolicy::exponential(Duration::ZERO, s(1)),
            RetryPolicy::exponential(s(10), s(1)),
            RetryPolicy::exponential(s(1), crate::limits::DELAY_MAX + Duration::from_millis(1)),
            RetryPolicy::fixed(Duration::MAX),
            RetryPolicy::fixed(s(1)).with_jitter(101),
        ];
        for p in bad {
            assert!(
                matches!(
                    p.validate("retry"),
                    Err(Error::InvalidOption { field: "retry", .. })
                ),
                "{p:?}"
            );
        }
        RetryPolicy::default().validate("retry").unwrap();
    }
}
