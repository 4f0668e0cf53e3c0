//! Taking jobs under leases and ending them in batches: the dequeue family, the batch acks,
//! the `ack_with` replay loop, and the waits of blocked consumers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::ReadableDatabase;

use super::Queue;
use crate::commit::refuse;
use crate::error::catch_engine_panic;
use crate::error::{BoxError, Error, Result};
use crate::job::{Applied, JobId, JobState};
use crate::lease::{AckThen, Lease};
use crate::stop::StopSignal;
use crate::store;

/// A batch ack's effect per lease: the transaction and the lease's position in the batch.
type AckEach<'a> = dyn FnMut(&crate::tx::Tx<'_>, usize) -> std::result::Result<(), BoxError> + 'a;

/// A batch ack's effect for all its leases: the transaction and the positions it covers.
type AckAll<'a> = dyn FnMut(&crate::tx::Tx<'_>, &[usize]) -> std::result::Result<(), BoxError> + 'a;

impl Queue {
    /// Takes the next job if one is available now, or returns `None` at once.
    ///
    /// Before taking one, moves due delayed jobs to ready and reclaims expired leases (at most
    /// 256 of each per call; an expired job with attempts left is given back through its
    /// retry policy, due after the delay (ready at once, at the back of its priority, with
    /// [`RetryPolicy::immediate`](crate::RetryPolicy::immediate)), otherwise dead with "lease expired"). The job is leased for its lease
    /// duration under a fresh token, its attempt counted, and it is returned only after that
    /// commit. A check that finds nothing costs a read, not a commit.
    ///
    /// One bad row never stops it: a job row that fails its checks is quarantined
    /// ([`Queue::quarantined`]), an index entry that does not match its job is dropped (the
    /// job keeps its own entry), and the dequeue goes on with the next job; it answers `None`
    /// only when no job is available.
    ///
    /// # Errors
    /// `Closed` after [`Queue::close`] (nothing leased); `CommitFailed`, `Storage` or
    /// `Reentrant`; `Corrupted` only for damage redb itself reports.
    pub fn dequeue(&self) -> Result<Option<Lease>> {
        Ok(self.try_dequeue()?.0)
    }

    pub(super) fn try_dequeue(&self) -> Result<(Option<Lease>, Option<u64>)> {
        let (mut leases, next_due_ms) = self.try_dequeue_batch(1)?;
        Ok((leases.pop(), next_due_ms))
    }

    pub(super) fn try_dequeue_batch(&self, max: usize) -> Result<(Vec<Lease>, Option<u64>)> {
        if max == 0 || max > crate::limits::BATCH_MAX {
            return Err(Error::batch_too_large("max"));
        }
        match self.peek_work()? {
            (true, _) => self.take_now(max),
            (false, next_due_ms) => Ok((Vec::new(), next_due_ms)),
        }
    }

    /// A look before a dequeue's commit, with a read: whether a job may be available now,
    /// and the earliest due time of the queue's waiting jobs and leases (`None` with nothing
    /// to wait for). While the queue is paused: whether a scheduled job is due (for
    /// [`Queue::take_now`] to move to ready, delivering nothing), and the earliest due time
    /// of its scheduled jobs (`None` without any: only a resume wakes it then).
    ///
    /// # Errors
    /// `Closed` once the file is closed to deliveries; `Reentrant`; `Storage`.
    pub(crate) fn peek_work(&self) -> Result<(bool, Option<u64>)> {
        self.ensure_delivering()?;
        // Before the probe: from inside an `ack_with` closure, "nothing ready" must not
        // pass for an answer (and `dequeue_timeout` must not wait for a commit this very
        // thread is holding up).
        self.inner.committer.ensure_not_reentrant()?;
        let paused = self.is_paused();
        let now_ms = self.now_ms();
        catch_engine_panic(|| {
            let rtx = self.inner.db.get().begin_read()?;
            if paused {
                return store::peek_due_paused(&rtx, self.config.schema, now_ms);
            }
            store::peek_due(&rtx, self.config.schema, now_ms, self.config.dead_jobs_max)
        })
    }

    /// A dequeue's commit, after [`Queue::peek_work`] saw work: up to `max` leases, and,
    /// when it took none (another consumer took the job, a bounded sweep has more to do, or
    /// the queue is paused), now as the time to look again. In a paused queue it only moves
    /// the due scheduled jobs to ready ([`Queue::pause`]).
    pub(crate) fn take_now(&self, max: usize) -> Result<(Vec<Lease>, Option<u64>)> {
        let (now_ms, config) = (self.now_ms(), self.config);
        let leased = self.run(&mut |ctx| {
            // Again in the group: a pause that returned while this call waited to join wins,
            // and so does a close or a shutdown (an async dequeue may wait for a helper).
            if self.is_paused() {
                store::promote_due_paused(ctx, config.schema, now_ms)?;
                return Ok(Ok(Vec::new()));
            }
            if self.is_closed() {
                return refuse(Error::Closed);
            }
            store::dequeue(ctx, &config, now_ms, max).map(Ok)
        })?;
        let next_due_ms = leased.is_empty().then_some(now_ms);
        Ok((
            leased
                .into_iter()
                .map(|l| Lease::from_delivery(self, l))
                .collect(),
            next_due_ms,
        ))
    }

    /// How long a consumer that found nothing waits before it looks again: until `deadline`
    /// (`None`: an hour at most), the next due time, and at most
    /// [`DUE_RECHECK_MAX`](crate::DUE_RECHECK_MAX) while a due time is pending (a clock that
    /// jumps). `None` once `deadline` passed.
    pub(crate) fn wait_before_looking(
        &self,
        deadline: Option<Instant>,
        next_due_ms: Option<u64>,
    ) -> Option<Duration> {
        let now = Instant::now();
        let mut wait = match deadline {
            Some(d) if now >= d => return None,
            Some(d) => d - now,
            None => Duration::from_secs(3600),
        };
        if let Some(due_ms) = next_due_ms {
            let until_due = due_ms.saturating_sub(self.now_ms()).max(1);
            wait = wait
                .min(Duration::from_millis(until_due))
                .min(crate::limits::DUE_RECHECK_MAX);
        }
        Some(wait)
    }

    /// The wake-up of this queue's consumers.
    pub(crate) fn work_signal(&self) -> Arc<crate::signal::WakeSignal> {
        self.inner
            .committer
            .work()
            .of(self.config().schema.queue_number)
    }

    /// Which queue a lease of this handle is from: the file's committer id and the queue's
    /// number in the file.
    pub(crate) fn lease_owner(&self) -> (u64, u32) {
        (self.inner.committer.id(), self.config.schema.queue_number)
    }

    /// Takes up to `max` jobs available now (at most [`BATCH_MAX`](crate::BATCH_MAX)) in one
    /// commit, in queue order; an empty `Vec` if none is available. Each is leased, counted
    /// and fenced as by [`Queue::dequeue`]. Fewer than `max` when their payloads would add up
    /// to more than [`Builder::dequeue_batch_bytes`](crate::Builder::dequeue_batch_bytes) (16 MiB by default; the first job is
    /// always taken): the jobs left stay ready, in place.
    ///
    /// # Errors
    /// `InvalidOption` for `max` of 0 or above `BATCH_MAX`; otherwise as [`Queue::dequeue`].
    pub fn dequeue_batch(&self, max: usize) -> Result<Vec<Lease>> {
        Ok(self.try_dequeue_batch(max)?.0)
    }

    /// Acks every lease in one commit and returns one outcome per lease, in order: `Ok(())`
    /// for each lease acked; `Err(LeaseLost)` for a lease that is no longer current, or
    /// `Err(Corrupted)` for one whose job row is damaged, neither of which holds up the
    /// others (as SQS's `DeleteMessageBatch` reports each entry). The leases stay with the
    /// caller: after a whole-call error every one of them is as current as before.
    ///
    /// # Errors
    /// For the whole call, nothing written: `InvalidOption` for an empty or oversized batch or
    /// a lease of another queue; `Reentrant`; `CommitFailed` or `Storage`.
    #[must_use = "a lease of the batch may be LeaseLost: its outcome is in the Vec"]
    pub fn ack_batch(&self, leases: &[Lease]) -> Result<Vec<Result<()>>> {
        self.ack_batch_of(&leases.iter().collect::<Vec<_>>())
    }

    /// [`Queue::ack_batch`] over borrowed leases (the async face's are shared).
    pub(crate) fn ack_batch_of(&self, leases: &[&Lease]) -> Result<Vec<Result<()>>> {
        let keys = self.batch_keys(leases)?;
        let results: Vec<Option<Vec<u8>>> = leases.iter().map(|l| l.result()).collect();
        let now_ms = self.now_ms();
        let out = self
            .run(&mut |ctx| store::ack(ctx, self.config.schema, &keys, &results, now_ms).map(Ok))?;
        leases
            .iter()
            .zip(&out)
            .for_each(|(l, r)| l.release_if_ended(r));
        Ok(out)
    }

    /// [`Lease::ack_with`](crate::Lease::ack_with) for many leases in one transaction and one commit: for each current
    /// lease whose idempotency key is not yet applied, `effect(tx, lease)` runs, then the
    /// markers and acks are written; they commit together. Returns one outcome per lease, in
    /// order: `Ok(Applied)`; `Err(LeaseLost)` or `Err(Corrupted)` as in
    /// [`Queue::ack_batch`] (the closure did not run for it); `Err(Effect)` for a lease whose
    /// closure failed: that job was given back with the closure's error as its last error
    /// (as by [`Lease::ack_with`](crate::Lease::ack_with)), and the other leases' effects still commit (their closures
    /// run again in a fresh transaction, one more per failing lease). Two leases with the same
    /// idempotency key: the first applies, the second is `AlreadyApplied`.
    ///
    /// # Errors
    /// As [`Queue::ack_batch`].
    #[must_use = "a lease of the batch may be LeaseLost or Effect: its outcome is in the Vec"]
    pub fn ack_with_batch<F>(&self, leases: &[Lease], mut effect: F) -> Result<Vec<Result<Applied>>>
    where
        F: FnMut(&crate::tx::Tx<'_>, &Lease) -> std::result::Result<(), crate::error::BoxError>,
    {
        let mut each = |tx: &crate::tx::Tx<'_>, i: usize| effect(tx, &leases[i]);
        self.ack_with_each(&leases.iter().collect::<Vec<_>>(), &mut each)
    }

    /// [`Queue::ack_with_batch`] over borrowed leases, `each(tx, i)` the effect of the `i`th
    /// (the async face's leases are shared, and its closure is given its own lease type).
    pub(crate) fn ack_with_each(
        &self,
        leases: &[&Lease],
        each: &mut AckEach<'_>,
    ) -> Result<Vec<Result<Applied>>> {
        self.ack_with_leases(leases, &mut store::AckClosure::Each(each))
    }

    /// [`Queue::ack_with_all`] over borrowed leases, `all(tx, at)` the effect of the leases at
    /// the indices `at`.
    pub(crate) fn ack_with_all_at(
        &self,
        leases: &[&Lease],
        all: &mut AckAll<'_>,
    ) -> Result<Vec<Result<Applied>>> {
        self.ack_with_leases(leases, &mut store::AckClosure::All(all))
    }

    /// `ack_with` over a batch of leases (checked first), each ending its lease as its outcome
    /// says.
    fn ack_with_leases(
        &self,
        leases: &[&Lease],
        closure: &mut store::AckClosure<'_, '_>,
    ) -> Result<Vec<Result<Applied>>> {
        let keys = self.batch_keys(leases)?;
        let results: Vec<Option<Vec<u8>>> = leases.iter().map(|l| l.result()).collect();
        let (applied, _) = self.ack_with_keys(&keys, &results, closure, AckThen::Stop)?;
        leases
            .iter()
            .zip(&applied)
            .for_each(|(l, r)| l.release_if_ended(r));
        Ok(applied
            .into_iter()
            .map(|r| r.map_err(Error::surfaced))
            .collect())
    }

    /// [`Queue::ack_with_batch`] with one call of `effect` for the whole batch: `effect(tx,
    /// leases)` runs once, with the leases of the batch that are current and whose idempotency
    /// key is not yet applied (in the order given; two leases with the same key: the first),
    /// then the markers and acks are written, and all commit together. For an effect that
    /// writes the same tables for every job: it opens each table once per batch rather than
    /// once per job (a redb `open_table` costs about what an insert does). The closure does not
    /// run when no lease needs it. Returns one outcome per lease, in order: `Ok(Now)` for each
    /// lease passed to the closure; `Ok(AlreadyApplied)`; `Err(LeaseLost)` or
    /// `Err(Corrupted)` as in [`Queue::ack_batch`]. If the closure fails (an error, a panic,
    /// an [`Outcome`](crate::Outcome)), none of its writes commit and every lease it was given
    /// is given back as by a failing [`Lease::ack_with`](crate::Lease::ack_with) closure (the error as its last error,
    /// or as the `Outcome` says), `Err(Effect)` in its place (the closure's own error at the
    /// first, its text at the others; an enqueue's refusal the closure passed on is that
    /// error itself at the first, as from [`Lease::ack_with`](crate::Lease::ack_with)); the other leases' outcomes
    /// stand and commit.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::{EnqueueOptions, redb::TableDefinition};
    /// const TOTALS: TableDefinition<u64, u64> = TableDefinition::new("totals");
    ///
    /// for n in 1..=3u64 {
    ///     queue.enqueue(&n.to_le_bytes(), EnqueueOptions::default())?;
    /// }
    /// let leases = queue.dequeue_batch(10)?;
    /// let outcomes = queue.ack_with_all(&leases, |tx, leases| {
    ///     let mut totals = tx.open_table(TOTALS)?; // opened once for the batch
    ///     for lease in leases {
    ///         let n = u64::from_le_bytes(lease.payload().try_into()?);
    ///         totals.insert(lease.id().0, n * 10)?;
    ///     }
    ///     Ok(())
    /// })?;
    /// assert!(outcomes.iter().all(|o| matches!(o, Ok(leaseq::Applied::Now))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Queue::ack_batch`].
    #[must_use = "a lease of the batch may be LeaseLost or Effect: its outcome is in the Vec"]
    pub fn ack_with_all<F>(&self, leases: &[Lease], mut effect: F) -> Result<Vec<Result<Applied>>>
    where
        F: FnMut(&crate::tx::Tx<'_>, &[&Lease]) -> std::result::Result<(), crate::error::BoxError>,
    {
        let mut all = |tx: &crate::tx::Tx<'_>, at: &[usize]| {
            let chosen: Vec<&Lease> = at.iter().map(|&i| &leases[i]).collect();
            effect(tx, &chosen)
        };
        self.ack_with_all_at(&leases.iter().collect::<Vec<_>>(), &mut all)
    }

    /// Runs `store::ack_with` over `keys` (then, with [`AckThen::LeaseNext`], a dequeue of one)
    /// in one commit.
    /// A closure that fails drops the transaction; the call then runs again with that lease
    /// marked, so its job is given back with the closure's error and the other leases' effects
    /// commit (no dequeue once a closure has failed). At most one run more than there are
    /// leases. The closure errors come back in their leases' places.
    pub(crate) fn ack_with_keys(
        &self,
        keys: &[(u64, u64)],
        results: &[Option<Vec<u8>>],
        closure: &mut store::AckClosure<'_, '_>,
        then: AckThen,
    ) -> Result<(Vec<Result<Applied>>, Vec<store::Delivery>)> {
        let (now_ms, config) = (self.now_ms(), self.config);
        // After `close`, an ack-and-next acks and takes nothing.
        let next = then == AckThen::LeaseNext && !self.is_closed() && !self.is_paused();
        let mut failed: Vec<Option<store::ClosureFailure>> = vec![None; keys.len()];
        let mut errors: Vec<Option<crate::error::BoxError>> = keys.iter().map(|_| None).collect();
        for _ in 0..=keys.len() {
            // The leases the closure that ran last was given.
            let mut failing: Vec<usize> = Vec::new();
            let dequeue = next && errors.iter().all(Option::is_none);
            let ran = self.run(&mut |ctx| {
                // Left set after the closure returns: an `Effect` error of the operation
                // comes from the closure that ran last (its error or panic, or a storage
                // error inside one of its enqueues that it swallowed).
                let (mut each, mut all);
                let mut tracked = match closure {
                    store::AckClosure::Each(f) => {
                        each = |tx: &crate::tx::Tx<'_>, i: usize| {
                            failing = vec![i];
                            f(tx, i)
                        };
                        store::AckClosure::Each(&mut each)
                    }
                    store::AckClosure::All(f) => {
                        all = |tx: &crate::tx::Tx<'_>, at: &[usize]| {
                            failing = at.to_vec();
                            f(tx, at)
                        };
                        store::AckClosure::All(&mut all)
                    }
                };
                let applied =
                    store::ack_with(ctx, keys, results, &config, now_ms, &failed, &mut tracked)?;
                // The next job only after an ack that happened: a refused one leases nothing.
                let leased = if dequeue && !self.is_paused() && applied.iter().all(Result::is_ok) {
                    store::dequeue(ctx, &config, now_ms, 1)?
                } else {
                    Vec::new()
                };
                Ok(Ok((applied, leased)))
            });
            match (ran, failing) {
                (Ok((mut applied, leased)), _) => {
                    // The closure's own error in place of its text, where the job was given
                    // back (a lease that went stale in between keeps its `LeaseLost`).
                    for (outcome, error) in applied.iter_mut().zip(errors) {
                        if let (Some(e), Err(Error::Effect(_))) = (error, &outcome) {
                            *outcome = Err(Error::Effect(e));
                        }
                    }
                    return Ok((applied, leased));
                }
                (Err(Error::Effect(e)), at)
                    if !at.is_empty() && at.iter().all(|&i| failed[i].is_none()) =>
                {
                    // Every lease the failing closure was given goes back with its error.
                    let failure = store::ClosureFailure::of(&e);
                    for &i in &at[1..] {
                        failed[i] = Some(failure.clone());
                        errors[i] = Some(e.to_string().into());
                    }
                    failed[at[0]] = Some(failure);
                    errors[at[0]] = Some(e);
                }
                (Err(e), _) => return Err(e),
            }
        }
        Err(Error::corrupted(
            "ack_with: more failing closures than leases",
        ))
    }

    fn batch_keys(&self, leases: &[&Lease]) -> Result<Vec<(u64, u64)>> {
        if leases.is_empty() {
            return Err(Error::invalid_option("leases", "the batch is empty"));
        }
        if leases.len() > crate::limits::BATCH_MAX {
            return Err(Error::batch_too_large("leases"));
        }
        if leases.iter().any(|l| l.owner() != self.lease_owner()) {
            return Err(Error::invalid_option("leases", "a lease of another queue"));
        }
        Ok(leases.iter().map(|l| l.fenced_key()).collect())
    }

    /// Takes the next job, waiting up to `timeout` for one. Wakes when a commit makes work
    /// available (an enqueue, a nack, a requeue) and at the next due time or lease deadline,
    /// never by polling in a tight loop. While a due time is pending it reads the clock again
    /// at least every [`DUE_RECHECK_MAX`](crate::DUE_RECHECK_MAX) (250 ms), so a clock that
    /// jumps forward (an NTP step) delivers the job within that; a
    /// [`ManualClock`](crate::ManualClock) wakes it at once. A write transaction the caller holds on
    /// [`Queue::database`] blocks it (like every queue write) until that transaction ends,
    /// whatever the timeout.
    ///
    /// # Errors
    /// As [`Queue::dequeue`]; a call blocked when [`Queue::close`] is called wakes and
    /// returns `Closed`.
    pub fn dequeue_timeout(&self, timeout: Duration) -> Result<Option<Lease>> {
        self.wait_for_job(timeout, None)
    }

    /// [`Queue::dequeue_timeout`] that also returns `Ok(None)` as soon as `stop` is stopped:
    /// a blocked call wakes at once, and a signal already stopped returns before dequeuing
    /// anything (also on a closed file: the signal is looked at first). This is how a thread pool stops its idle consumers without closing the file
    /// for the rest of the app (as Go's `context` cancellation or .NET's
    /// `CancellationToken`); [`Queue::close`] stops every consumer of the file instead.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
    /// use leaseq::StopSignal;
    /// use std::time::Duration;
    ///
    /// let stop = StopSignal::new();
    /// let consumer = {
    ///     let (queue, stop) = (queue.clone(), stop.clone());
    ///     std::thread::spawn(move || queue.dequeue_until(Duration::from_secs(3600), &stop))
    /// };
    /// stop.stop(); // the consumer returns Ok(None) now, not in an hour
    /// assert!(consumer.join().unwrap()?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`Queue::dequeue_timeout`].
    pub fn dequeue_until(&self, timeout: Duration, stop: &StopSignal) -> Result<Option<Lease>> {
        self.wait_for_job(timeout, Some(stop))
    }

    pub(super) fn wait_for_job(
        &self,
        timeout: Duration,
        stop: Option<&StopSignal>,
    ) -> Result<Option<Lease>> {
        self.inner.committer.ensure_not_reentrant()?;
        // A timeout too long to add to the monotonic clock waits without end.
        let deadline = Instant::now().checked_add(timeout);
        let work = self.work_signal();
        if let Some(stop) = stop {
            stop.watch(&work);
        }
        loop {
            // The epoch before the flags: a close or a stop after this read moves the epoch,
            // so the wait below returns at once.
            let epoch = work.epoch();
            if stop.is_some_and(StopSignal::is_stopped) {
                return Ok(None);
            }
            let (lease, next_due_ms) = self.try_dequeue()?;
            if lease.is_some() {
                return Ok(lease);
            }
            match self.wait_before_looking(deadline, next_due_ms) {
                Some(wait) => work.wait(epoch, wait),
                None => return Ok(None),
            }
        }
    }

    /// Whether the delivery of job `id` under `token` was cancelled (a read, for
    /// [`Lease::is_cancelled`](crate::Lease::is_cancelled)): `true` if the job is cancelled, `false` while that delivery
    /// is current, `LeaseLost` once it is neither (the job was retried, redelivered, ended or
    /// its cancelled row went).
    pub(crate) fn is_delivery_cancelled(&self, id: JobId, token: u64) -> Result<bool> {
        match self.job(id)? {
            Some(j) if j.state == JobState::Cancelled => Ok(true),
            Some(j) if j.lease_token == Some(token) => Ok(false),
            _ => Err(Error::LeaseLost { job_id: id, token }),
        }
    }

    /// `Err(Closed)` once the file was closed to new deliveries (a close, or a shutdown
    /// under way).
    pub(crate) fn ensure_delivering(&self) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        Ok(())
    }
}
