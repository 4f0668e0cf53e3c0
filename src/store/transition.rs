//! State transitions shared by the operations: ending an attempt (ready again, or dead),
//! snoozing and failing a leased job, ending a lease entry, leasing a ready record.

use crate::commit::Ctx;
use crate::error::Result;
use crate::events::Event;
use crate::format::record::{JobRecord, StoredState};
use crate::job::{JobId, JobState};

use super::tables::{Row, Tables};
use super::validate::{REASON_ABANDONED, truncate_reason};
use super::{Delivery, QueueConfig};

pub(crate) const REASON_EXPIRED: &str = "lease expired";

/// When a job whose attempt `rec.attempts` just ended without an ack is due again: now plus
/// the retry policy's delay.
pub(super) fn retry_at_ms(config: &QueueConfig, id: u64, record: &JobRecord, now_ms: u64) -> u64 {
    // A stored policy was validated when the record was read.
    let policy = record
        .retry
        .and_then(|r| r.policy().ok())
        .unwrap_or(config.retry);
    now_ms.saturating_add(policy.delay_ms(JobId(id), record.attempts))
}

/// What ending one lease entry did.
pub(super) enum Ended {
    Returned,
    Dead,
    Quarantined,
    Stray,
}

/// Where a job given back to ready goes within its priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadyPlace {
    /// Behind every job already ready (a new position).
    Back,
    /// Where it was when it was leased (its old position): before every job that became
    /// ready after it.
    Kept,
}

/// Why a lease ended without an ack, nack or fail: the job's last error and when it is due.
#[derive(Clone, Copy)]
pub(super) enum LeaseEnd<'c> {
    /// Its deadline passed ([`REASON_EXPIRED`]): due after the queue's retry policy.
    Expired(&'c QueueConfig),
    /// Its process died ([`REASON_ABANDONED`], recovery at open): due at once, in the place
    /// it had ([`ReadyPlace::Kept`]), as persist-queue serves an interrupted item first: the
    /// job was not at fault, and an outbox that syncs edits keeps their order.
    Abandoned,
}

/// Ends the attempt behind lease entry `(deadline_ms, id)`: ready or dead as
/// [`Tables::end_attempt`], with the last error and due time of `end`; a damaged row is
/// quarantined and an entry that does not match its row is dropped, so one bad row never
/// stops the pass.
pub(super) fn end_lease_entry(
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    (deadline_ms, id): (u64, u64),
    end: LeaseEnd<'_>,
    now_ms: u64,
) -> Result<Ended> {
    match tables.row(id)? {
        Row::Good(record) if matches!(record.state, StoredState::Leased { deadline_ms: d, .. } if d == deadline_ms) =>
        {
            let (reason, at_ms, place) = match end {
                LeaseEnd::Expired(config) => (
                    REASON_EXPIRED,
                    retry_at_ms(config, id, &record, now_ms),
                    ReadyPlace::Back,
                ),
                LeaseEnd::Abandoned => (REASON_ABANDONED, now_ms, ReadyPlace::Kept),
            };
            Ok(
                match tables.end_attempt_at(ctx, id, record, reason, now_ms, at_ms, place)? {
                    JobState::Dead => {
                        // An expired delivery stopped at its deadline (a due time after it
                        // finds the instance ended). One abandoned by a closed file is left
                        // unstamped: the due times missed while closed are Missed's to decide.
                        if let LeaseEnd::Expired(_) = end {
                            tables.note_instance_end(id, deadline_ms.min(now_ms))?;
                        }
                        Ended::Dead
                    }
                    _ => Ended::Returned,
                },
            )
        }
        row => {
            tables.leases_mut()?.remove((deadline_ms, id))?;
            Ok(if tables.repair_stray_entry(id, row, now_ms)? {
                Ended::Quarantined
            } else {
                Ended::Stray
            })
        }
    }
}

/// Turns the ready record `record` of job `id` into a leased one (a fresh token, the attempt
/// counted, the deadline from its lease) and returns the delivery, its key and payload left
/// empty.
pub(super) fn lease_record(
    ctx: &mut Ctx<'_>,
    config: &QueueConfig,
    now_ms: u64,
    id: u64,
    record: &mut JobRecord,
) -> Delivery {
    let token = ctx.alloc_token();
    let lease_ms = record.lease_ms.unwrap_or(config.lease_ms);
    let deadline_ms = now_ms.saturating_add(lease_ms);
    record.attempts += 1;
    record.state = StoredState::Leased { token, deadline_ms };
    // A leased job's run_at_ms is when its delivery began (docs/format.md): "running for".
    let ready_ms = std::mem::replace(&mut record.run_at_ms, now_ms);
    // A snooze's reason, and the last delivery's progress, hold until the job runs again.
    let status = record.status.take();
    let progress = record.progress.take();
    Delivery {
        id,
        token,
        attempt: record.attempts,
        max_attempts: record.max_attempts,
        snoozes: record.snoozes,
        deadline_ms,
        lease_ms,
        timeout_ms: record.timeout_ms,
        // Moved from the record once it is written.
        idempotency_key: None,
        encoding: record
            .encoding
            .and_then(crate::format::payload::Encoding::from_tag),
        payload: Vec::new(),
        undo: super::Undo {
            status,
            until_started_key: None,
            progress,
            ready_ms,
        },
    }
}

/// Makes waiting `record` (ready or scheduled, unindexed) due at `due_ms`: scheduled if that
/// is in the future; otherwise a scheduled one becomes ready at the back of its priority, and
/// a ready one keeps its place. Wakes the queue's blocked consumers (they re-read the
/// earliest due time).
pub(super) fn set_due(
    ctx: &mut Ctx<'_>,
    queue_number: u32,
    record: &mut JobRecord,
    due_ms: u64,
    now_ms: u64,
) {
    debug_assert!(matches!(
        record.state,
        StoredState::Ready | StoredState::Scheduled
    ));
    if due_ms > now_ms {
        ctx.wake(queue_number);
        record.run_at_ms = due_ms;
        record.state = StoredState::Scheduled;
    } else if record.state == StoredState::Scheduled {
        ctx.wake(queue_number);
        record.run_at_ms = now_ms;
        record.seq = ctx.alloc_seq();
        record.state = StoredState::Ready;
    }
}

impl Tables<'_> {
    /// Gives a leased job back without charging its attempt (see [`snooze`](super::fenced::snooze)),
    /// with `reason` as its status until its next delivery.
    pub(super) fn snooze_leased(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        mut record: JobRecord,
        now_ms: u64,
        delay_ms: u64,
        reason: Option<&str>,
    ) -> Result<()> {
        // A leased job's delivery was counted when it was leased.
        debug_assert!(record.attempts >= 1, "leased with no attempt counted");
        ctx.wake(self.schema.queue_number);
        self.unindex(id, &record)?;
        let at = now_ms.saturating_add(delay_ms);
        record.attempts = record.attempts.saturating_sub(1);
        record.snoozes = record.snoozes.saturating_add(1);
        record.status = reason.map(truncate_reason);
        record.run_at_ms = at;
        record.state = if at > now_ms {
            StoredState::Scheduled
        } else {
            record.seq = ctx.alloc_seq();
            StoredState::Ready
        };
        self.put(id, &record)?;
        let q = self.schema.queue_number;
        self.log().event(q, Event::Snoozed { id: JobId(id) });
        self.note_drained(now_ms)
    }

    /// Undoes a delivery no consumer ever saw (an async dequeue dropped before it handed the
    /// lease out): the job is ready again in the place it had, its attempt not charged, its
    /// snooze count and last error as they were.
    /// `undo` is what the delivery changed: its snooze reason comes back, and a key it held
    /// until it started is held again, unless another job took it meanwhile.
    pub(super) fn release_unseen(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        mut record: JobRecord,
        undo: &super::Undo,
        now_ms: u64,
    ) -> Result<()> {
        debug_assert!(record.attempts >= 1, "leased with no attempt counted");
        ctx.wake(self.schema.queue_number);
        self.unindex(id, &record)?;
        record.attempts = record.attempts.saturating_sub(1);
        record.state = StoredState::Ready;
        record.run_at_ms = undo.ready_ms;
        record.status = undo.status.clone();
        record.progress = undo.progress.clone();
        if let Some(k) = &undo.until_started_key
            && record.dedup_key.is_none()
            && self.key_holder(k, now_ms)?.is_none()
        {
            self.dedup_mut()?.insert(k.as_slice(), id)?;
            record.dedup_key = Some(k.clone());
            record.dedup_until_started = true;
        }
        self.put(id, &record)
    }

    /// Moves a leased job to the dead-letter state now, with `reason`.
    pub(super) fn fail_leased(
        &mut self,
        id: u64,
        mut record: JobRecord,
        reason: &str,
        now_ms: u64,
    ) -> Result<()> {
        self.unindex(id, &record)?;
        record.push_error(record.attempts, Some(now_ms), truncate_reason(reason));
        tracing::info!(queue = self.schema.queue_number, job_id = id, %reason, "leaseq: job dead-lettered by fail");
        record.state = StoredState::Dead;
        record.run_at_ms = now_ms;
        self.put(id, &record)?;
        self.note_instance_end(id, now_ms)?;
        let q = self.schema.queue_number;
        self.log().event(q, Event::Dead { id: JobId(id) });
        self.note_drained(now_ms)
    }

    /// Ends a delivery that did not ack: back to ready at `requeue_at_ms` (at the back of its
    /// priority: a job whose leases keep expiring never starves the jobs behind it),
    /// scheduled if that is in the future, or dead when the attempts are used up (at
    /// `now_ms`: a nack, an effect that failed).
    pub(super) fn end_attempt(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        record: JobRecord,
        reason: &str,
        now_ms: u64,
        requeue_at_ms: u64,
    ) -> Result<JobState> {
        let state = self.end_attempt_at(
            ctx,
            id,
            record,
            reason,
            now_ms,
            requeue_at_ms,
            ReadyPlace::Back,
        )?;
        if state == JobState::Dead {
            self.note_instance_end(id, now_ms)?;
        }
        Ok(state)
    }

    /// [`Tables::end_attempt`], back to ready at `place` of its priority.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn end_attempt_at(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        mut record: JobRecord,
        reason: &str,
        now_ms: u64,
        requeue_at_ms: u64,
        place: ReadyPlace,
    ) -> Result<JobState> {
        debug_assert!(matches!(record.state, StoredState::Leased { .. }));
        self.unindex(id, &record)?;
        record.push_error(record.attempts, Some(now_ms), truncate_reason(reason));
        if record.attempts >= record.max_attempts {
            tracing::info!(
                queue = self.schema.queue_number,
                job_id = id,
                attempts = record.attempts,
                %reason,
                "leaseq: job dead-lettered (no attempts left)"
            );
            record.state = StoredState::Dead;
            record.run_at_ms = now_ms;
        } else {
            record.run_at_ms = requeue_at_ms;
            record.state = if requeue_at_ms > now_ms {
                StoredState::Scheduled
            } else {
                if place == ReadyPlace::Back {
                    record.seq = ctx.alloc_seq();
                }
                StoredState::Ready
            };
        }
        self.put(id, &record)?;
        let q = self.schema.queue_number;
        self.log().event(
            q,
            match record.state {
                StoredState::Dead => Event::Dead { id: JobId(id) },
                _ => Event::Retried {
                    id: JobId(id),
                    attempt: record.attempts,
                },
            },
        );
        self.note_drained(now_ms)?;
        Ok(record.state.job_state())
    }
}

/// Ends the acked leased jobs `leases[i].0` (records `records[i]`): kept as completed
/// (with `results[i]`, each at most `RESULT_BYTES_MAX`) in a queue that keeps a history,
/// deleted otherwise; then prunes the history a bounded few per job.
pub(super) fn complete_leased(
    tables: &mut Tables<'_>,
    leases: &[(u64, u64)],
    records: Vec<JobRecord>,
    results: Vec<Option<Vec<u8>>>,
    now_ms: u64,
) -> Result<()> {
    debug_assert_eq!(leases.len(), results.len());
    debug_assert!(
        results
            .iter()
            .flatten()
            .all(|r| r.len() <= crate::limits::RESULT_BYTES_MAX)
    );
    for &(id, _) in leases {
        let q = tables.schema.queue_number;
        tables.log().event(q, Event::Completed { id: JobId(id) });
    }
    if tables.history()?.is_off() {
        tables.delete_leased(leases, &records, now_ms)?;
    } else {
        for ((&(id, _), record), result) in leases.iter().zip(records).zip(results) {
            let end = StoredState::Completed { result };
            tables.end_job(id, record, end, now_ms, true)?;
        }
    }
    let max = (crate::limits::PRUNE_PER_ACK_MAX * leases.len()).min(crate::limits::SWEEP_MAX);
    super::retention::prune_history(tables, now_ms, max)?;
    tables.note_drained(now_ms)
}
