//! What a caller's closure inside a group transaction reaches through its [`Tx`]: the
//! [`Sink`] over the operation's tables ([`TablesSink`]: enqueues, and the control calls
//! [`TxCall`]), and [`write`], the operation of [`crate::Queue::write`].

use crate::commit::{Ctx, Refusal, Verdict};
use crate::error::{BoxError, Error, Result};
use crate::format::schema::QueueSchema;
use crate::job::Enqueued;
use crate::tx::{Sink, TxAnswer, TxCall};

use super::QueueConfig;
use super::enqueue::{enqueue_into, run_closure};
use super::tables::Tables;
use super::validate::NewJob;

/// The [`Sink`] of one closure run. A storage error part-way through an enqueue leaves its
/// writes half done: `broken` then makes the operation fail whatever the closure returns.
pub(crate) struct TablesSink<'s, 't, 'c> {
    pub(super) tables: &'s mut Tables<'t>,
    pub(super) ctx: &'s mut Ctx<'c>,
    /// The jobs the running operation acks (deletes) when it commits: a dedup key one of them
    /// holds only while live is free for a job enqueued here.
    pub(super) acked: &'s [u64],
    /// The leases the running operation ends (`ack_with`'s batch): the transaction's control
    /// calls refuse their jobs, whose rows it read before the closures ran.
    pub(super) leases: &'s [(u64, u64)],
    pub(super) broken: Option<String>,
}

impl Sink for TablesSink<'_, '_, '_> {
    fn put(&mut self, schema: &'static QueueSchema, records: &[NewJob]) -> Result<Vec<Enqueued>> {
        if let Some(why) = &self.broken {
            return Err(Error::Effect(
                format!("an earlier enqueue in this transaction failed: {why}").into(),
            ));
        }
        let r = if schema.queue_number == self.tables.schema.queue_number {
            self.release_acked_keys(records)
                .and_then(|()| enqueue_into(self.tables, self.ctx, records, None))
        } else {
            // Another queue of the file: its tables, opened for this enqueue only.
            self.tables
                .open_other(schema)
                .and_then(|mut other| enqueue_into(&mut other, self.ctx, records, None))
        };
        // A refusal wrote nothing (validation comes first): the transaction is whole, and
        // the closure may go on without that job.
        if let Err(e) = &r
            && !e.is_input_refusal()
        {
            self.broken = Some(e.to_string());
        }
        r
    }

    fn control(&mut self, schema: &'static QueueSchema, call: TxCall<'_>) -> Result<TxAnswer> {
        if let Some(why) = &self.broken {
            return Err(Error::Effect(
                format!("an earlier call in this transaction failed: {why}").into(),
            ));
        }
        let id = job_of(&call);
        if schema.queue_number == self.tables.schema.queue_number
            && self.leases.iter().any(|&(j, _)| j == id)
        {
            return Err(Error::InvalidState {
                job_id: crate::job::JobId(id),
                actual: crate::job::JobState::Leased,
                expected: "a job this ack_with does not end (its lease ends it when it commits)",
            });
        }
        let next_id = self.ctx.next_id();
        let r = if schema.queue_number == self.tables.schema.queue_number {
            run_call(call, self.tables, self.ctx, next_id)
        } else {
            self.tables
                .open_other(schema)
                .and_then(|mut other| run_call(call, &mut other, self.ctx, next_id))
        };
        match r {
            Ok(Ok(answer)) => Ok(answer),
            // A refusal wrote nothing: the transaction is whole.
            Ok(Err(Refusal(e))) => Err(e),
            Err(e) => {
                self.broken = Some(e.to_string());
                Err(e)
            }
        }
    }
}

/// The job a control call names.
fn job_of(call: &TxCall<'_>) -> u64 {
    match *call {
        TxCall::Cancel { id, .. } | TxCall::Retry { id, .. } | TxCall::Remove { id, .. } => id,
    }
}

/// Runs control call `call` on `tables` (`next_id`: the file's next id, for a cancel's
/// answer).
fn run_call(
    call: TxCall<'_>,
    tables: &mut Tables<'_>,
    ctx: &mut Ctx<'_>,
    next_id: u64,
) -> Verdict<TxAnswer> {
    Ok(match call {
        TxCall::Cancel { id, reason, now_ms } => {
            super::admin::cancel_in(tables, next_id, id, reason, now_ms)?.map(TxAnswer::Cancel)
        }
        TxCall::Retry { id, now_ms } => {
            super::admin::retry_in(tables, ctx, id, now_ms)?.map(|()| TxAnswer::Done)
        }
        TxCall::Remove { id, now_ms } => {
            super::admin::remove_in(tables, id, now_ms)?.map(|()| TxAnswer::Done)
        }
    })
}

impl TablesSink<'_, '_, '_> {
    /// Releases the dedup keys of `records` held (while live, not by a window) by a job this
    /// operation acks: that job is gone when the transaction commits, so a follow-up with its
    /// key takes the key instead of being answered `Duplicate` of a job that will not exist.
    fn release_acked_keys(&mut self, jobs: &[NewJob]) -> Result<()> {
        if self.acked.is_empty() {
            return Ok(());
        }
        for NewJob { record, .. } in jobs {
            if let Some(k) = &record.dedup_key
                && let Some((owner, false)) = self.tables.key_holder(k, record.created_ms)?
                && self.acked.contains(&owner)
            {
                self.tables.dedup_mut()?.remove(k.as_slice())?;
            }
        }
        Ok(())
    }

    /// The closure's result, unless an enqueue inside it broke the transaction: then the
    /// error the closure passed on if it is leaseq's (that enqueue's, surfaced by the
    /// caller), else `Effect` saying so.
    pub(super) fn into_result<T>(self, ran: Result<T, BoxError>) -> Result<T> {
        match (self.broken, ran) {
            (Some(_), Err(e)) if e.downcast_ref::<Error>().is_some() => Err(Error::Effect(e)),
            (Some(why), _) => Err(Error::Effect(
                format!("an enqueue inside the transaction failed: {why}").into(),
            )),
            (None, ran) => ran.map_err(Error::Effect),
        }
    }
}

/// Runs a caller's closure in the group transaction ([`crate::Queue::write`]): its own writes
/// and the jobs it enqueues commit with the group. The closure's error (or panic) fails the
/// call with `Effect`, and the group aborts so nothing of it commits.
pub(crate) fn write<T>(
    ctx: &mut Ctx<'_>,
    config: &QueueConfig,
    now_ms: u64,
    f: &mut dyn FnMut(&crate::tx::Tx<'_>) -> Result<T, BoxError>,
) -> Result<T> {
    let schema = config.schema;
    // The caller's writes are unknown to leaseq: the group commits (the transaction handed
    // to the caller marks it).
    let tx = ctx.group().caller_transaction();
    let mut tables = Tables::open(ctx, schema)?;
    let mut sink = TablesSink {
        tables: &mut tables,
        ctx,
        acked: &[],
        leases: &[],
        broken: None,
    };
    let ran = run_closure(|| f(&crate::tx::Tx::new(tx, *config, now_ms, &mut sink)));
    sink.into_result(ran)
}
