//! State transitions shared by the operations: ending an attempt (ready again, or dead),
//! snoozing and failing a leased job, ending a lease entry, leasing a ready record.

use crate::commit::Ctx;
use crate::error::Result;
use crate::format::record::{JobRecord, StoredState};
use crate::job::{JobId, JobState};

use super::tables::{Row, Tables};
use super::validate::truncate_reason;
use super::{Delivery, QueueConfig};

pub(crate) const REASON_EXPIRED: &str = "lease expired";
pub(crate) const REASON_ABANDONED: &str =
    "lease abandoned: still held when the file was closed or its process exited";

/// When a job whose attempt `rec.attempts` just ended without an ack is due again: now plus
/// the retry policy's delay.
pub(super) fn retry_at_ms(cfg: &QueueConfig, id: u64, rec: &JobRecord, now_ms: u64) -> u64 {
    // A stored policy was validated when the record was read.
    let policy = rec.retry.and_then(|r| r.policy().ok()).unwrap_or(cfg.retry);
    now_ms.saturating_add(policy.delay_ms(JobId(id), rec.attempts))
}

/// What ending one lease entry did.
pub(super) enum Ended {
    Returned,
    Dead,
    Quarantined,
    Stray,
}

/// Ends the attempt behind lease entry `(deadline_ms, id)` (lease expiry, recovery at open):
/// ready or dead as [`Tables::end_attempt`], due after the retry policy of `retry` (`None`:
/// at once); a damaged row is quarantined and an entry that does not match its row is
/// dropped, so one bad row never stops the pass.
pub(super) fn end_lease_entry(
    t: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    (deadline_ms, id): (u64, u64),
    reason: &str,
    retry: Option<&QueueConfig>,
    now_ms: u64,
) -> Result<Ended> {
    match t.row(id)? {
        Row::Good(rec) if matches!(rec.state, StoredState::Leased { deadline_ms: d, .. } if d == deadline_ms) =>
        {
            let at_ms = retry.map_or(now_ms, |cfg| retry_at_ms(cfg, id, &rec, now_ms));
            Ok(match t.end_attempt(ctx, id, rec, reason, now_ms, at_ms)? {
                JobState::Dead => Ended::Dead,
                _ => Ended::Returned,
            })
        }
        row => {
            t.leases_mut()?.remove((deadline_ms, id))?;
            Ok(if t.repair_stray_entry(id, row, now_ms)? {
                Ended::Quarantined
            } else {
                Ended::Stray
            })
        }
    }
}

/// Turns the ready record `rec` of job `id` into a leased one (a fresh token, the attempt
/// counted, the deadline from its lease) and returns the delivery, its key and payload left
/// empty.
pub(super) fn lease_record(
    ctx: &mut Ctx<'_>,
    cfg: &QueueConfig,
    now_ms: u64,
    id: u64,
    rec: &mut JobRecord,
) -> Delivery {
    let token = ctx.alloc_token();
    let lease_ms = rec.lease_ms.unwrap_or(cfg.lease_ms);
    let deadline_ms = now_ms.saturating_add(lease_ms);
    rec.attempts += 1;
    rec.state = StoredState::Leased { token, deadline_ms };
    Delivery {
        id,
        token,
        attempt: rec.attempts,
        max_attempts: rec.max_attempts,
        deadline_ms,
        lease_ms,
        // Moved from the record once it is written.
        idempotency_key: None,
        encoding: rec
            .encoding
            .and_then(crate::format::payload::Encoding::from_tag),
        payload: Vec::new(),
    }
}

impl Tables<'_> {
    /// Gives a leased job back without charging its attempt (see [`snooze`](super::fenced::snooze)).
    pub(super) fn snooze_leased(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        mut rec: JobRecord,
        now_ms: u64,
        delay_ms: u64,
    ) -> Result<()> {
        // A leased job's delivery was counted when it was leased.
        debug_assert!(rec.attempts >= 1, "leased with no attempt counted");
        ctx.wake(self.tq.qid);
        self.unindex(id, &rec)?;
        let at = now_ms.saturating_add(delay_ms);
        rec.attempts = rec.attempts.saturating_sub(1);
        rec.snoozes = rec.snoozes.saturating_add(1);
        rec.run_at_ms = at;
        rec.state = if at > now_ms {
            StoredState::Scheduled
        } else {
            rec.seq = ctx.alloc_seq();
            StoredState::Ready
        };
        self.put(id, &rec)
    }

    /// Moves a leased job to the dead-letter state now, with `reason`.
    pub(super) fn fail_leased(
        &mut self,
        id: u64,
        mut rec: JobRecord,
        reason: &str,
        now_ms: u64,
    ) -> Result<()> {
        self.unindex(id, &rec)?;
        rec.last_error = Some(truncate_reason(reason));
        tracing::info!(queue = self.tq.qid, job_id = id, %reason, "leaseq: job dead-lettered by fail");
        rec.state = StoredState::Dead;
        rec.run_at_ms = now_ms;
        self.put(id, &rec)
    }

    /// Ends a delivery that did not ack: back to ready at `requeue_at_ms` (the back of its
    /// priority: a job whose leases keep expiring never starves the jobs behind it),
    /// scheduled if that is in the future, or dead when the attempts are used up.
    pub(super) fn end_attempt(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        mut rec: JobRecord,
        reason: &str,
        now_ms: u64,
        requeue_at_ms: u64,
    ) -> Result<JobState> {
        debug_assert!(matches!(rec.state, StoredState::Leased { .. }));
        self.unindex(id, &rec)?;
        rec.last_error = Some(truncate_reason(reason));
        if rec.attempts >= rec.max_attempts {
            tracing::info!(
                queue = self.tq.qid,
                job_id = id,
                attempts = rec.attempts,
                %reason,
                "leaseq: job dead-lettered (no attempts left)"
            );
            rec.state = StoredState::Dead;
            rec.run_at_ms = now_ms;
        } else {
            rec.run_at_ms = requeue_at_ms;
            rec.state = if requeue_at_ms > now_ms {
                StoredState::Scheduled
            } else {
                rec.seq = ctx.alloc_seq();
                StoredState::Ready
            };
        }
        self.put(id, &rec)?;
        Ok(rec.state.job_state())
    }
}
