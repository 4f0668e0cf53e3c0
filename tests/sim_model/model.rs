//! The reference model: what leaseq's public contract says the queue holds after every call
//! that returned `Ok`, as a pure, deterministic state machine (the guarantees of the README and
//! the invariants of ARCHITECTURE.md).
//!
//! It mirrors the documented semantics only: states and their transitions, attempts counted per
//! delivery, dead-lettering at `max_attempts`, priority order (lower first, then in the order jobs
//! became ready: enqueued, found due by a dequeue, or given back), dedup keys owned by one live
//! job, applied-ids markers and the caller's effect table. Job ids and lease tokens are not predicted: they are taken from the
//! queue's answers and only checked to be fresh (larger than every one seen before).

use std::collections::{BTreeMap, BTreeSet};

use leaseq::{Applied, JobState};

pub const DELAY_MAX_MS: u64 = leaseq::DELAY_MAX.as_millis() as u64;
pub const LEASE_MAX_MS: u64 = leaseq::LEASE_MAX.as_millis() as u64;
pub const BATCH_MAX: usize = leaseq::BATCH_MAX;
pub const KEY_BYTES_MAX: usize = leaseq::KEY_BYTES_MAX;
/// leaseq keeps at most this many bytes of a reason (cut at a char boundary).
pub const REASON_BYTES_MAX: usize = 4096;
/// Placeholder ids of jobs whose ids are not known yet: the model adds a job under
/// `PENDING_BASE + n` at enqueue, and names it when the answer (or, for an enqueue the crash
/// hit, the reopened queue) gives its id. They sort after every real id, in enqueue order, as
/// the real ids will.
pub const PENDING_BASE: u64 = u64::MAX - 4096;
/// Every reason the workload passes to `nack`/`fail` starts with this, so leaseq's own reasons
/// ("lease expired", ...) can be told apart.
pub const REASON_PREFIX: &str = "why:";
/// The error of every `ack_with` closure the workload makes fail: the last error its job
/// records when it is given back.
/// The payload of the follow-up job an effect with `key` enqueues.
pub fn follow_payload(key: &str) -> Vec<u8> {
    format!("follow-up of {key}").into_bytes()
}

pub const EFFECT_ERROR: &str = "effect refused on purpose (after writing)";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MState {
    Scheduled,
    Ready,
    Leased { token: u64, deadline_ms: u64 },
    Dead,
}

impl MState {
    pub fn public(&self) -> JobState {
        match self {
            MState::Scheduled => JobState::Scheduled,
            MState::Ready => JobState::Ready,
            MState::Leased { .. } => JobState::Leased,
            MState::Dead => JobState::Dead,
        }
    }
}

/// The last error a job records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastErr {
    None,
    /// A reason the workload gave (already truncated as leaseq keeps it).
    Reason(String),
    /// leaseq's own reason for a lease that expired and was reclaimed by a dequeue.
    Expired,
    /// leaseq's own reason for a lease returned by a reopen.
    Abandoned,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MJob {
    pub payload: Vec<u8>,
    pub priority: i32,
    pub max_attempts: u32,
    pub lease_ms: Option<u64>,
    pub idem: Option<String>,
    pub dedup: Option<String>,
    pub created_ms: u64,
    pub attempts: u32,
    /// Scheduled: due time. Ready: when it became available.
    pub run_at_ms: u64,
    /// Ready: its place in line within its priority (the model's own counter).
    pub seq: u64,
    pub state: MState,
    pub last_error: LastErr,
    /// Times given back with `snooze` (the attempt not charged).
    pub snoozes: u32,
    /// Its dedup key is held until its first delivery (`dedup_until_started`).
    pub until_started: bool,
    /// An instance of a schedule: the tag its payload starts with ([`sched_tag`]).
    pub sched: Option<Vec<u8>>,
    /// Its ordered group ([`EnqSpec::group`]) and its place in it (the model's own counter:
    /// only the order matters). A job of a group is delivered only while no live job
    /// (scheduled, ready, leased) of the group has an earlier place.
    pub group: Option<String>,
    pub group_order: u64,
    /// Its own execution timeout (`EnqueueOptions::timeout`), kept in its record.
    pub timeout_ms: Option<u64>,
}

impl MJob {
    /// The key of this job's effect in the caller's table and in the applied-ids markers: its
    /// idempotency key, or its id when it has none (leaseq's default).
    pub fn effect_key(&self, id: u64) -> String {
        match &self.idem {
            Some(k) => k.clone(),
            None => format!("#{id}"),
        }
    }
}

/// One enqueue as the workload asks for it (possibly invalid on purpose).
#[derive(Debug, Clone, Default)]
pub struct EnqSpec {
    pub payload: Vec<u8>,
    pub idem: Option<String>,
    pub dedup: Option<String>,
    pub priority: i32,
    pub delay_ms: Option<u64>,
    pub max_attempts: Option<u32>,
    pub lease_ms: Option<u64>,
    /// `dedup_until_started` (with a dedup key).
    pub until_started: bool,
    /// `on_duplicate`: 0 keep, 1 replace, 2 debounce (with a dedup key).
    pub on_duplicate: u8,
    /// `group`: an ordered group (a replaced job keeps its own).
    pub group: Option<String>,
    /// `timeout`: its own execution timeout (a replaced job keeps its own).
    pub timeout_ms: Option<u64>,
}

/// The kinds of error the model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EKind {
    LeaseLost,
    InvalidOption,
    KeyTooLong,
    JobNotFound,
    InvalidState,
    Effect,
    ScheduleExists,
    ScheduleNotFound,
    /// `QueueFull`, with what it reports: the jobs and payload bytes the queue counted, its
    /// bounds, and what the refused call needed.
    QueueFull {
        jobs: u64,
        bytes: u64,
        max_jobs: Option<u64>,
        max_bytes: Option<u64>,
        needs_jobs: u64,
        needs_bytes: u64,
    },
}

/// One predicted enqueue result; ids at or above [`PENDING_BASE`] are placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MEnq {
    New(u64),
    Duplicate(u64),
    /// The key is held by a dead job.
    DuplicateDead(u64),
    /// The key is held by a waiting job whose payload (and due time) this replaced.
    Replaced(u64),
}

/// What a dequeue is predicted to hand out (the token is not predicted).
#[derive(Clone, PartialEq, Eq)]
pub struct DeqPred {
    pub id: u64,
    pub attempt: u32,
    pub deadline_ms: u64,
    pub payload: Vec<u8>,
}

impl std::fmt::Debug for DeqPred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {} attempt {} deadline_ms {} ({}B, tag {:?})",
            self.id,
            self.attempt,
            self.deadline_ms,
            self.payload.len(),
            self.payload.get(..8.min(self.payload.len()))
        )
    }
}

/// A predicted result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MRes {
    /// `enqueue` (one entry) or `enqueue_batch`.
    Enq(Vec<MEnq>),
    /// `dequeue` (at most one entry) or `dequeue_batch`.
    Deq(Vec<DeqPred>),
    Unit,
    /// `ack_batch`: one outcome per lease.
    Acked(Vec<Result<(), EKind>>),
    /// `ack_with` (one entry, `Ok`) or `ack_with_batch` (one outcome per lease).
    Applied(Vec<Result<Applied, EKind>>),
    /// The same, with closures that enqueue a follow-up job each: how many were created
    /// (pending jobs, named by the ids the closures saw).
    AppliedF(Vec<Result<Applied, EKind>>, usize),
    /// `ack_and_next` (no `Applied`) or `ack_with_and_next`.
    Next(Option<Applied>, Option<DeqPred>),
    State(JobState),
    /// `cancel` of a job that ended and whose row went: nothing written.
    Gone,
    /// `pause` or `resume`: whether the queue's state changed.
    Flag(bool),
    /// `create_schedule`, `update_schedule` or `upsert_schedule`: the schedule as stored.
    Sched(SchedView),
    Deadline(u64),
    /// A refusal: the call changed nothing.
    Err(EKind),
    /// An error after which the call still ended the attempt (`ack_with` whose closure
    /// failed gives the job back).
    EndedErr(EKind),
}

impl MRes {
    /// Whether a call with this answer changed the queue.
    pub fn changes(&self) -> bool {
        match self {
            MRes::Enq(v) => v
                .iter()
                .any(|e| matches!(e, MEnq::New(_) | MEnq::Replaced(_))),
            MRes::Deq(v) => !v.is_empty(),
            MRes::Acked(v) => v.iter().any(Result::is_ok),
            MRes::Applied(v) | MRes::AppliedF(v, _) => {
                v.iter().any(|r| matches!(r, Ok(_) | Err(EKind::Effect)))
            }
            MRes::Err(_) | MRes::Gone => false,
            _ => true,
        }
    }
}

// ---- Periodic jobs (schedules) ----

/// The longest schedule name leaseq takes (`SCHEDULE_NAME_BYTES_MAX`).
pub const SCHEDULE_NAME_BYTES_MAX: usize = leaseq::SCHEDULE_NAME_BYTES_MAX;

/// Every schedule instance's payload starts with this, then `<name>/<call>/`: the tag of the
/// definition (one create, update or upsert call) it was enqueued from. No other payload of
/// the workload starts with it (theirs start with a small counter, or `follow-up`).
pub const SCHED_TAG_PREFIX: &[u8] = b"\xFF\xFESCHED/";

/// The payload of the schedule definition set by call number `call` for `name`: its tag, then
/// `pad` filler bytes.
pub fn sched_payload(name: &str, call: u64, pad: usize) -> Vec<u8> {
    let mut p = SCHED_TAG_PREFIX.to_vec();
    p.extend_from_slice(format!("{name}/{call}/").as_bytes());
    p.extend(std::iter::repeat_n(b'.', pad));
    p
}

/// The tag a schedule payload starts with (the prefix, the name and the call number), if
/// `payload` is one.
pub fn sched_tag(payload: &[u8]) -> Option<&[u8]> {
    let rest = payload.strip_prefix(SCHED_TAG_PREFIX)?;
    let first = rest.iter().position(|&b| b == b'/')?;
    let second = rest[first + 1..].iter().position(|&b| b == b'/')?;
    Some(&payload[..SCHED_TAG_PREFIX.len() + first + 1 + second + 1])
}

/// How a schedule call treats a name that exists (or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// `create_schedule`: `ScheduleExists` if it exists.
    Create,
    /// `update_schedule`: `ScheduleNotFound` if it does not.
    Update,
    /// `upsert_schedule`: either.
    Upsert,
}

/// One interval schedule definition as the workload passes it (possibly invalid on purpose).
#[derive(Debug, Clone)]
pub struct SchedDef {
    pub every_ms: u64,
    /// `starting_at_ms`.
    pub start_ms: Option<u64>,
    pub payload: Vec<u8>,
    pub priority: i32,
    pub max_attempts: Option<u32>,
    pub lease_ms: Option<u64>,
    /// `Overlap::Enqueue` (else `Skip`).
    pub overlap_enqueue: bool,
    /// `Missed::Skip` (else `RunOnce`).
    pub missed_skip: bool,
    /// An option a schedule refuses, set on purpose: 1 a delay, 2 an idempotency key, 3 a
    /// dedup key, 4 a group (0: none).
    pub forbidden_option: u8,
}

/// A schedule as the file holds it (what `ScheduleInfo` shows), and what the harness keeps
/// about its instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MSched {
    pub every_ms: u64,
    pub start_ms: u64,
    pub payload: Vec<u8>,
    pub priority: i32,
    /// Resolved with the queue's default.
    pub max_attempts: u32,
    pub lease_ms: Option<u64>,
    pub overlap_enqueue: bool,
    pub missed_skip: bool,
    pub next_due_ms: u64,
    /// The last instance (a placeholder id until known) and the due time it was enqueued for.
    pub last_job: Option<(u64, u64)>,
    pub fired: u64,
    pub skipped: u64,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The payload tags of this schedule's definitions since it was created (a remove and a
    /// new create start over): its instances are the jobs whose payload carries one.
    pub tags: BTreeSet<Vec<u8>>,
    /// Its instances that left the queue (acked, cancelled, removed): with the live ones in
    /// the file, they are all it fired.
    pub ended: u64,
    /// Its due times skipped because the instance did not fit the queue's size limit (in
    /// `skipped` too): an open may skip under `Missed::RunOnce` for that.
    pub skipped_full: u64,
    /// Whether two of its instances may be live (not dead) at once: it had
    /// `Overlap::Enqueue`, or a dead instance was requeued. Otherwise a due time fires only
    /// when the last instance ended, and an ended one never comes back.
    pub multi_live: bool,
    /// When its last instance ended (acked, died, cancelled, removed), as leaseq records it:
    /// under `Overlap::Skip` a due time fires only if it came at or after that end.
    pub last_ended_ms: Option<u64>,
    /// When it was paused, while it is (`next_due_ms` is then `u64::MAX`: never due).
    pub paused_ms: Option<u64>,
}

/// A schedule as `ScheduleInfo` shows it (interval timing only), for answers and checks.
#[derive(Clone, PartialEq, Eq)]
pub struct SchedView {
    pub name: String,
    pub every_ms: u64,
    pub start_ms: u64,
    pub next_due_ms: Option<u64>,
    pub last_job: Option<(u64, u64)>,
    pub fired: u64,
    pub skipped: u64,
    pub overlap_enqueue: bool,
    pub missed_skip: bool,
    pub priority: i32,
    pub payload_bytes: usize,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub paused_ms: Option<u64>,
}

/// Times relative to the workload's clock start.
pub fn rel(ms: u64) -> i64 {
    ms as i64 - super::T0_MS as i64
}

impl std::fmt::Debug for SchedView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} every {}ms from {:+} next {:?} last {:?} fired {} skipped {} {}/{} prio {} \
             {}B created {:+} updated {:+} paused {:?}",
            self.name,
            self.every_ms,
            rel(self.start_ms),
            self.next_due_ms.map(rel),
            self.last_job.map(|(id, at)| (id, rel(at))),
            self.fired,
            self.skipped,
            if self.overlap_enqueue {
                "Enqueue"
            } else {
                "Skip"
            },
            if self.missed_skip {
                "MissedSkip"
            } else {
                "RunOnce"
            },
            self.priority,
            self.payload_bytes,
            rel(self.created_ms),
            rel(self.updated_ms),
            self.paused_ms.map(rel)
        )
    }
}

/// A rate-limit row as its window stands at `now_ms` (leaseq's fixed window): restarted with
/// no deliveries once it ended, or when the clock went back a whole window before its start.
pub fn rate_window(row: (u64, u64, u64, u64), now_ms: u64) -> (u64, u64, u64, u64) {
    let (max, per, start, count) = row;
    if now_ms.saturating_add(per) <= start || now_ms >= start.saturating_add(per) {
        (max, per, now_ms, 0)
    } else {
        (max, per, start, count)
    }
}

/// A queue's rate limit as the model keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MRate {
    /// leaseq's fixed window as it stores it: (max, per_ms, window start, deliveries in it).
    Fixed((u64, u64, u64, u64)),
    /// A sliding window: at most `max` deliveries in any span of `per` ms. `log` holds the
    /// time each delivery was counted at, oldest first: the dequeue's time, never before the
    /// one logged before it (the clock may step back).
    Sliding { max: u64, per: u64, log: Vec<u64> },
}

impl MRate {
    /// (max, per_ms, sliding).
    pub fn setting(&self) -> (u64, u64, bool) {
        match self {
            MRate::Fixed((max, per, ..)) => (*max, *per, false),
            MRate::Sliding { max, per, .. } => (*max, *per, true),
        }
    }

    /// The sliding log as it stands at `now_ms`: empty once the clock went back a whole
    /// window before its newest delivery.
    fn sliding_log(log: &[u64], per: u64, now_ms: u64) -> &[u64] {
        match log.last() {
            Some(&last) if now_ms.saturating_add(per) <= last => &[],
            _ => log,
        }
    }

    /// How many deliveries may go at `now_ms`.
    pub fn allowed(&self, now_ms: u64) -> u64 {
        match self {
            MRate::Fixed(row) => {
                let (max, _, _, count) = rate_window(*row, now_ms);
                max.saturating_sub(count)
            }
            MRate::Sliding { max, per, log } => {
                let counted = Self::sliding_log(log, *per, now_ms)
                    .iter()
                    .filter(|&&t| t.saturating_add(*per) > now_ms)
                    .count() as u64;
                max.saturating_sub(counted)
            }
        }
    }

    /// Counts `n` deliveries made at `now_ms`.
    pub fn charge(&mut self, now_ms: u64, n: u64) {
        match self {
            MRate::Fixed(row) => {
                let (max, per, start, count) = rate_window(*row, now_ms);
                *row = (max, per, start, count + n);
            }
            MRate::Sliding { per, log, .. } => {
                if Self::sliding_log(log, *per, now_ms).is_empty() {
                    log.clear();
                }
                log.retain(|&t| t.saturating_add(*per) > now_ms);
                let at = now_ms.max(log.last().copied().unwrap_or(0));
                log.extend(std::iter::repeat_n(at, n as usize));
            }
        }
    }

    /// `Reader::rate_limited_until(now_ms)`: when a delivery may go again, if none may now.
    pub fn limited_until(&self, now_ms: u64) -> Option<u64> {
        if self.allowed(now_ms) > 0 {
            return None;
        }
        match self {
            MRate::Fixed(row) => {
                let (_, per, start, _) = rate_window(*row, now_ms);
                Some(start + per)
            }
            MRate::Sliding { max, per, log } => {
                let counted: Vec<u64> = Self::sliding_log(log, *per, now_ms)
                    .iter()
                    .copied()
                    .filter(|&t| t.saturating_add(*per) > now_ms)
                    .collect();
                // The oldest `counted - max + 1` must leave for one more to go.
                let k = counted.len() - *max as usize;
                Some(counted[k] + per)
            }
        }
    }
}

/// The longest wait of `WhenFull::Block` leaseq takes (one hour).
pub const BLOCK_WAIT_MAX_MS: u64 = 3_600_000;

/// What an enqueue into a full queue does (`WhenFull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MFull {
    Refuse,
    /// Wait up to so many ms: the workload is single-threaded, so nothing makes room while it
    /// waits and it ends as `Refuse` does.
    Block(u64),
    DropOldest,
}

/// A queue's size limit (`QueueLimit`), possibly invalid on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MLimit {
    pub max_jobs: Option<u64>,
    pub max_bytes: Option<u64>,
    pub when_full: MFull,
}

/// One job an enqueue adds (or would): its payload size, its dedup key, and whether a
/// duplicate keeps the holder's payload (`OnDuplicate::Keep`).
pub type Adding<'a> = (u64, Option<&'a str>, bool);

/// The first due time of an interval strictly after `after_ms` (leaseq's `next_due_after`).
pub fn interval_due_after(every_ms: u64, start_ms: u64, after_ms: u64) -> u64 {
    if after_ms < start_ms {
        return start_ms;
    }
    start_ms + ((after_ms - start_ms) / every_ms + 1) * every_ms
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// The queue's default lease and max attempts (builder settings).
    pub lease_ms: u64,
    pub max_attempts: u32,
    pub jobs: BTreeMap<u64, MJob>,
    /// Jobs acked (`ack`, `ack_with`) or removed (`remove`) with `Ok`, or found so after a
    /// crash: they must never come back.
    pub gone: BTreeSet<u64>,
    /// Jobs that ended with `Ok` (also in `gone`) whose rows may stay: cancelled ones (while
    /// they fence a lease, or in a history), and acked ones while the queue kept a history.
    /// Calls that would tell a gone row from a kept one are not aimed at them.
    pub kept_rows: BTreeSet<u64>,
    /// The history set with `set_history` (`keep_jobs`; `None`: off).
    pub history: Option<u64>,
    pub dedup: BTreeMap<String, u64>,
    /// Effect keys whose applied-ids marker exists.
    pub applied: BTreeSet<String>,
    /// The caller's effect table: effect key -> times applied.
    pub effects: BTreeMap<String, u64>,
    /// The largest job id and lease token the queue has handed out so far.
    pub max_id: u64,
    pub max_token: u64,
    /// The next place in the ready line.
    pub next_seq: u64,
    /// The payloads of the jobs `Queue::write` put into the named queue "side" (never
    /// consumed): each exists iff its write committed, as does its effect row.
    pub side: BTreeSet<Vec<u8>>,
    /// Whether the queue is paused (`Queue::pause`): it delivers nothing until resumed.
    pub paused: bool,
    /// The queue's schedules (periodic jobs), by name.
    pub schedules: BTreeMap<String, MSched>,
    /// The next place at the end of a group.
    pub next_group_order: u64,
    /// The queue's rate limit with the deliveries it counts.
    pub rate_limit: Option<MRate>,
    /// The queue's size limit (`Queue::set_limit`).
    pub limit: Option<MLimit>,
    /// Jobs dropped to make room (`Stats::dropped`): never reset.
    pub dropped: u64,
    /// Placeholders of jobs dropped (to make room) before their ids were known: a follow-up
    /// that a later follow-up of the same `ack_with` batch dropped, an instance that a later
    /// instance of the same sweep dropped. Named by the answer, or by the schedules shown.
    pub dropped_pending: BTreeSet<u64>,
    /// The clock at the call being applied (set by the harness before each).
    pub now_ms: u64,
    /// Cancelled deliveries their groups wait for: job id -> (group, its place, the fenced
    /// lease's deadline, its token). Until that token's ending call (answered `Cancelled`),
    /// the deadline (a dequeue's sweep) or the next open, the job holds its place at the head
    /// of its group.
    pub fences: BTreeMap<u64, (String, u64, u64, u64)>,
}

pub fn truncate_reason(reason: &str) -> String {
    if reason.len() <= REASON_BYTES_MAX {
        return reason.to_string();
    }
    let mut end = REASON_BYTES_MAX;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

impl Model {
    pub fn new(lease_ms: u64, max_attempts: u32) -> Model {
        Model {
            lease_ms,
            max_attempts,
            jobs: BTreeMap::new(),
            gone: BTreeSet::new(),
            kept_rows: BTreeSet::new(),
            history: None,
            dedup: BTreeMap::new(),
            applied: BTreeSet::new(),
            effects: BTreeMap::new(),
            max_id: 0,
            max_token: 0,
            next_seq: 1,
            side: BTreeSet::new(),
            paused: false,
            schedules: BTreeMap::new(),
            next_group_order: 1,
            rate_limit: None,
            limit: None,
            dropped: 0,
            dropped_pending: BTreeSet::new(),
            now_ms: 0,
            fences: BTreeMap::new(),
        }
    }

    /// A place at the end of every group.
    fn group_place(&mut self) -> u64 {
        self.next_group_order += 1;
        self.next_group_order - 1
    }

    /// Whether job `id` is first in its group (or has none): no live job of its group has
    /// an earlier place. Dead jobs have left their group.
    fn group_head(&self, id: u64) -> bool {
        let job = &self.jobs[&id];
        let Some(g) = &job.group else {
            return true;
        };
        !self.jobs.iter().any(|(&other, j)| {
            other != id
                && j.group.as_ref() == Some(g)
                && j.state != MState::Dead
                && j.group_order < job.group_order
        }) && !self
            .fences
            .values()
            .any(|(fg, order, _, _)| fg == g && *order < job.group_order)
    }

    /// An ending call of lease `(id, token)` refused: if it was the cancelled delivery its
    /// group waited for, the worker has reported back and the group goes on (an older
    /// delivery's token changes nothing).
    fn ended_refused(&mut self, id: u64, token: u64) {
        if self.fences.get(&id).is_some_and(|f| f.3 == token) {
            self.fences.remove(&id);
        }
    }

    /// Makes a job ready: it goes behind every job already ready.
    fn make_ready(&mut self, id: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let job = self.jobs.get_mut(&id).expect("job made ready");
        job.seq = seq;
        job.state = MState::Ready;
    }

    fn leased(&self, id: u64, token: u64) -> Result<(), EKind> {
        match self.jobs.get(&id).map(|j| &j.state) {
            Some(MState::Leased { token: t, .. }) if *t == token => Ok(()),
            _ => Err(EKind::LeaseLost),
        }
    }

    /// A job leaves the queue (ack): its dedup key is released if it still owns it.
    fn delete(&mut self, id: u64) {
        if self.jobs[&id].state != MState::Dead {
            self.note_end(id, self.now_ms);
        }
        let job = self.jobs.remove(&id).expect("deleting a live job");
        if let Some(s) = self.sched_of(&job) {
            s.ended += 1;
        }
        if let Some(k) = &job.dedup
            && self.dedup.get(k) == Some(&id)
        {
            self.dedup.remove(k);
        }
        self.gone.insert(id);
        if self.history.is_some() {
            self.kept_rows.insert(id);
        }
        if id >= PENDING_BASE {
            self.dropped_pending.insert(id);
        }
    }

    /// Job `id` left the live states at `at_ms`: if it is a schedule's last instance, the
    /// schedule keeps when.
    fn note_end(&mut self, id: u64, at_ms: u64) {
        for s in self.schedules.values_mut() {
            if s.last_job.is_some_and(|(last, _)| last == id) {
                s.last_ended_ms = Some(at_ms);
            }
        }
    }

    /// Ends a delivery that did not ack (nack, expiry, reopen).
    fn end_attempt(&mut self, id: u64, err: LastErr, now_ms: u64, requeue_at_ms: u64) -> JobState {
        let job = self.jobs.get_mut(&id).expect("ending a live job's attempt");
        debug_assert!(matches!(job.state, MState::Leased { .. }));
        job.last_error = err;
        if job.attempts >= job.max_attempts {
            job.state = MState::Dead;
        } else {
            job.run_at_ms = requeue_at_ms;
            if requeue_at_ms > now_ms {
                job.state = MState::Scheduled;
            } else {
                self.make_ready(id);
            }
        }
        self.jobs[&id].state.public()
    }

    fn validate(&self, spec: &EnqSpec) -> Result<(), EKind> {
        for key in [&spec.idem, &spec.dedup, &spec.group].into_iter().flatten() {
            if key.len() > KEY_BYTES_MAX {
                return Err(EKind::KeyTooLong);
            }
            if key.is_empty() {
                return Err(EKind::InvalidOption);
            }
        }
        let max_attempts = spec.max_attempts.unwrap_or(self.max_attempts);
        if max_attempts == 0
            || spec.lease_ms.is_some_and(|l| l == 0 || l > LEASE_MAX_MS)
            || spec.timeout_ms.is_some_and(|t| t == 0 || t > LEASE_MAX_MS)
            || spec.delay_ms.is_some_and(|d| d > DELAY_MAX_MS)
        {
            return Err(EKind::InvalidOption);
        }
        Ok(())
    }

    /// `enqueue` is a batch of one. All or nothing: the first invalid job refuses the batch.
    /// A dedup key held by a live job or an earlier job of the batch gives `Duplicate`.
    pub fn enqueue(&mut self, now_ms: u64, specs: &[EnqSpec]) -> MRes {
        if specs.is_empty() || specs.len() > BATCH_MAX {
            return MRes::Err(EKind::InvalidOption);
        }
        for spec in specs {
            if let Err(e) = self.validate(spec) {
                return MRes::Err(e);
            }
        }
        let adding: Vec<Adding<'_>> = specs
            .iter()
            .map(|s| {
                (
                    s.payload.len() as u64,
                    s.dedup.as_deref(),
                    s.on_duplicate == 0,
                )
            })
            .collect();
        if let Err(full) = self.make_room(&adding) {
            return MRes::Err(full);
        }
        let mut out = Vec::new();
        for spec in specs {
            if let Some(k) = &spec.dedup
                && let Some(&owner) = self.dedup.get(k)
            {
                // Replace or debounce a holder still waiting.
                if spec.on_duplicate > 0
                    && let Some(job) = self.jobs.get_mut(&owner)
                    && matches!(job.state, MState::Ready | MState::Scheduled)
                {
                    job.payload = spec.payload.clone();
                    if spec.on_duplicate == 2 {
                        let due = now_ms + spec.delay_ms.unwrap_or(0);
                        if due > now_ms {
                            job.run_at_ms = due;
                            job.state = MState::Scheduled;
                        } else if job.state == MState::Scheduled {
                            job.run_at_ms = now_ms;
                            self.make_ready(owner);
                        }
                    }
                    out.push(MEnq::Replaced(owner));
                    continue;
                }
                let dead = self
                    .jobs
                    .get(&owner)
                    .is_some_and(|j| j.state == MState::Dead);
                out.push(if dead {
                    MEnq::DuplicateDead(owner)
                } else {
                    MEnq::Duplicate(owner)
                });
                continue;
            }
            let delay_ms = spec.delay_ms.unwrap_or(0);
            let job = MJob {
                payload: spec.payload.clone(),
                priority: spec.priority,
                max_attempts: spec.max_attempts.unwrap_or(self.max_attempts),
                lease_ms: spec.lease_ms,
                timeout_ms: spec.timeout_ms,
                idem: spec.idem.clone(),
                dedup: spec.dedup.clone(),
                created_ms: now_ms,
                attempts: 0,
                run_at_ms: now_ms + delay_ms,
                seq: 0,
                state: MState::Scheduled,
                last_error: LastErr::None,
                snoozes: 0,
                until_started: spec.until_started,
                sched: None,
                group: spec.group.clone(),
                group_order: 0,
            };
            let mut job = job;
            if job.group.is_some() {
                job.group_order = self.group_place();
            }
            let id = self.next_placeholder();
            if let Some(k) = &spec.dedup {
                self.dedup.insert(k.clone(), id);
            }
            self.jobs.insert(id, job);
            if delay_ms == 0 {
                self.make_ready(id);
            }
            out.push(MEnq::New(id));
        }
        MRes::Enq(out)
    }

    /// The placeholder ids, in enqueue order.
    pub fn pending(&self) -> Vec<u64> {
        self.jobs.range(PENDING_BASE..).map(|(&id, _)| id).collect()
    }

    /// Names the pending jobs, in enqueue order, with their real ids; with the placeholders
    /// of jobs dropped before they were named among them (in order) when `ids` names those
    /// too (the follow-ups of an `ack_with` batch, one of which a later one dropped).
    pub fn assign_ids(&mut self, ids: &[u64]) {
        let mut all: Vec<u64> = self.pending();
        all.extend(self.dropped_pending.iter().copied());
        all.sort_unstable();
        if !self.dropped_pending.is_empty() && all.len() == ids.len() {
            for (&p, &id) in all.iter().zip(ids) {
                if self.dropped_pending.contains(&p) {
                    self.name_dropped(p, id);
                } else {
                    self.name_pending(p, id);
                }
            }
            return;
        }
        let pending = self.pending();
        assert_eq!(pending.len(), ids.len(), "model: naming pending jobs");
        for (&p, &id) in pending.iter().zip(ids) {
            self.name_pending(p, id);
        }
    }

    /// Names the job of placeholder `p` (live) `id`.
    fn name_pending(&mut self, p: u64, id: u64) {
        let job = self.jobs.remove(&p).expect("pending job");
        if let Some(k) = &job.dedup
            && self.dedup.get(k) == Some(&p)
        {
            self.dedup.insert(k.clone(), id);
        }
        assert!(self.jobs.insert(id, job).is_none(), "model: id {id} reused");
        self.max_id = self.max_id.max(id);
        self.rename_last_job(p, id);
    }

    /// Names a job dropped before its id was known (`dropped_pending`): the id goes where the
    /// placeholder was (gone, kept rows, a schedule's last instance).
    pub fn name_dropped(&mut self, p: u64, id: u64) {
        assert!(
            self.dropped_pending.remove(&p),
            "model: naming a dropped placeholder"
        );
        assert!(
            id < PENDING_BASE && !self.jobs.contains_key(&id),
            "model: id {id} of a dropped job reused"
        );
        for set in [&mut self.gone, &mut self.kept_rows] {
            if set.remove(&p) {
                set.insert(id);
            }
        }
        self.max_id = self.max_id.max(id);
        self.rename_last_job(p, id);
    }

    /// Forgets the dropped placeholders no answer named (a drop the queue never showed: after
    /// a reopen nothing will): they were never delivered and are not in the file.
    pub fn forget_dropped_pending(&mut self) {
        for p in std::mem::take(&mut self.dropped_pending) {
            self.gone.remove(&p);
            self.kept_rows.remove(&p);
        }
    }

    /// The next placeholder id: after every pending one (and every dropped one not named
    /// yet), so placeholders sort in the order their jobs were made (and will get their ids).
    pub fn next_placeholder(&self) -> u64 {
        let last = self.pending().last().copied();
        let dropped = self.dropped_pending.last().copied();
        last.max(dropped).map_or(PENDING_BASE, |p| p + 1)
    }

    /// Names one pending job (an instance a sweep enqueued) with its real id.
    pub fn name_job(&mut self, placeholder: u64, id: u64) {
        assert!(placeholder >= PENDING_BASE && id < PENDING_BASE);
        let job = self
            .jobs
            .remove(&placeholder)
            .expect("model: naming a pending job");
        debug_assert!(job.dedup.is_none(), "model: an instance holds no dedup key");
        assert!(self.jobs.insert(id, job).is_none(), "model: id {id} reused");
        self.max_id = self.max_id.max(id);
        self.rename_last_job(placeholder, id);
    }

    fn rename_last_job(&mut self, placeholder: u64, id: u64) {
        for s in self.schedules.values_mut() {
            if let Some((last, _)) = &mut s.last_job
                && *last == placeholder
            {
                *last = id;
            }
        }
    }

    /// Whether a dequeue at `now_ms` finds anything to do (ready jobs, due delays, expired
    /// leases).
    pub fn has_work(&self, now_ms: u64) -> bool {
        self.jobs.values().any(|j| match j.state {
            MState::Ready => true,
            MState::Scheduled => j.run_at_ms <= now_ms,
            MState::Leased { deadline_ms, .. } => deadline_ms <= now_ms,
            MState::Dead => false,
        }) || self.schedules.values().any(|s| s.next_due_ms <= now_ms)
            || self.fences.values().any(|f| f.2 <= now_ms)
    }

    /// Promotes due scheduled jobs, reclaims expired leases, then fires due schedules (the
    /// sweep of every dequeue).
    fn sweep(&mut self, now_ms: u64) {
        self.promote_due(now_ms);
        let mut expired: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                MState::Leased { deadline_ms, .. } if deadline_ms <= now_ms => {
                    Some((deadline_ms, id))
                }
                _ => None,
            })
            .collect();
        expired.sort_unstable();
        assert!(
            expired.len() <= 256,
            "model: workload exceeds the sweep bound"
        );
        for (deadline_ms, id) in expired {
            // An expired delivery stopped at its deadline.
            if self.end_attempt(id, LastErr::Expired, now_ms, now_ms) == JobState::Dead {
                self.note_end(id, deadline_ms.min(now_ms));
            }
        }
        // Cancelled deliveries whose lease ran out: their groups go on.
        self.fences.retain(|_, f| f.2 > now_ms);
        // Due schedules last: each sees its last instance as it now is (an expired lease just
        // given back is pending), and an instance enqueued now is ready for this very dequeue.
        self.fire_due(now_ms, false);
    }

    /// Moves the due scheduled jobs to ready, in due order (a sweep's first step, and all a
    /// paused queue's dequeue does).
    fn promote_due(&mut self, now_ms: u64) {
        let mut due: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == MState::Scheduled && j.run_at_ms <= now_ms)
            .map(|(&id, j)| (j.run_at_ms, id))
            .collect();
        due.sort_unstable();
        assert!(due.len() <= 256, "model: workload exceeds the sweep bound");
        for (_, id) in due {
            self.make_ready(id);
        }
    }

    /// The job a dequeue takes next: lowest priority value, then first to become ready, of
    /// the ready jobs first in their group.
    fn first_ready(&self) -> Option<u64> {
        self.jobs
            .iter()
            .filter(|&(&id, j)| j.state == MState::Ready && self.group_head(id))
            .min_by_key(|&(&id, j)| (j.priority, j.seq, id))
            .map(|(&id, _)| id)
    }

    /// `dequeue` (`max` 1) or `dequeue_batch`: sweeps, then leases up to `max` ready jobs in
    /// queue order. Leased jobs get token 0 until [`Model::set_token`] names it.
    pub fn dequeue(&mut self, now_ms: u64, max: usize) -> MRes {
        if max == 0 || max > BATCH_MAX {
            return MRes::Err(EKind::InvalidOption);
        }
        MRes::Deq(self.dequeue_inner(now_ms, max))
    }

    fn dequeue_inner(&mut self, now_ms: u64, max: usize) -> Vec<DeqPred> {
        let mut out = Vec::new();
        // A paused queue delivers nothing; it only moves its due scheduled jobs to ready (no
        // other part of the sweep).
        if self.paused {
            self.promote_due(now_ms);
            return out;
        }
        if !self.has_work(now_ms) {
            return out;
        }
        // A rate-limited queue takes what its window has left; with nothing left, it does
        // nothing else either.
        let max = match &self.rate_limit {
            Some(rate) => max.min(rate.allowed(now_ms) as usize),
            None => max,
        };
        if max == 0 {
            return out;
        }
        self.sweep(now_ms);
        while out.len() < max {
            let Some(id) = self.first_ready() else {
                break;
            };
            let default_lease = self.lease_ms;
            let job = self.jobs.get_mut(&id).expect("ready job");
            // A key held until the start is let go of at the first delivery, for good.
            if job.until_started {
                job.until_started = false;
                if let Some(k) = job.dedup.take()
                    && self.dedup.get(&k) == Some(&id)
                {
                    self.dedup.remove(&k);
                }
            }
            let job = self.jobs.get_mut(&id).expect("ready job");
            job.attempts += 1;
            let deadline_ms = now_ms.saturating_add(job.lease_ms.unwrap_or(default_lease));
            job.state = MState::Leased {
                token: 0,
                deadline_ms,
            };
            out.push(DeqPred {
                id,
                attempt: job.attempts,
                deadline_ms,
                payload: job.payload.clone(),
            });
        }
        if let Some(rate) = &mut self.rate_limit
            && !out.is_empty()
        {
            rate.charge(now_ms, out.len() as u64);
        }
        out
    }

    /// For the harness's counts: how many ready jobs wait behind their group's head, and how
    /// many deliveries the rate limit allows at `now_ms` (`None`: no limit).
    pub fn flow_now(&self, now_ms: u64) -> (usize, Option<u64>) {
        let waiting = self
            .jobs
            .iter()
            .filter(|&(&id, j)| j.state == MState::Ready && !self.group_head(id))
            .count();
        let allowed = self.rate_limit.as_ref().map(|rate| rate.allowed(now_ms));
        (waiting, allowed)
    }

    /// `Queue::set_rate_limit` of `(max, per_ms, sliding)`: whether the setting changed.
    /// The same limit keeps its window. A different fixed one starts a fresh window; a
    /// sliding one changed to another sliding one keeps its newest `max` deliveries, and one
    /// replacing a fixed limit or none starts empty. `(0, _)`, a window of 0 ms or above
    /// `DELAY_MAX`, or a sliding `max` above 10,000 is refused.
    pub fn set_rate_limit(&mut self, limit: Option<(u64, u64, bool)>) -> MRes {
        match limit {
            Some((max, per, sliding))
                if max == 0 || per == 0 || per > DELAY_MAX_MS || (sliding && max > 10_000) =>
            {
                MRes::Err(EKind::InvalidOption)
            }
            None => MRes::Flag(self.rate_limit.take().is_some()),
            Some(setting) => {
                if self.rate_limit.as_ref().map(MRate::setting) == Some(setting) {
                    return MRes::Flag(false);
                }
                let (max, per, sliding) = setting;
                self.rate_limit = Some(match (sliding, self.rate_limit.take()) {
                    (false, _) => MRate::Fixed((max, per, 0, 0)),
                    (true, Some(MRate::Sliding { mut log, .. })) => {
                        let drop = log.len().saturating_sub(max as usize);
                        log.drain(..drop);
                        MRate::Sliding { max, per, log }
                    }
                    (true, _) => MRate::Sliding {
                        max,
                        per,
                        log: Vec::new(),
                    },
                });
                MRes::Flag(true)
            }
        }
    }

    /// `Queue::set_limit`: whether the setting changed. A limit without a bound, a bound of 0,
    /// or a block wait of 0 ms or above an hour is refused.
    pub fn set_limit(&mut self, limit: Option<MLimit>) -> MRes {
        let Some(l) = limit else {
            return MRes::Flag(self.limit.take().is_some());
        };
        let bad_wait = matches!(l.when_full, MFull::Block(w) if w == 0 || w > BLOCK_WAIT_MAX_MS);
        if (l.max_jobs.is_none() && l.max_bytes.is_none())
            || l.max_jobs == Some(0)
            || l.max_bytes == Some(0)
            || bad_wait
        {
            return MRes::Err(EKind::InvalidOption);
        }
        let changed = self.limit != Some(l);
        self.limit = Some(l);
        MRes::Flag(changed)
    }

    /// The jobs a size limit counts (scheduled, ready, held behind a group's head included,
    /// and leased: not dead) and their payload bytes.
    pub fn counted(&self) -> (u64, u64) {
        self.jobs
            .values()
            .filter(|j| j.state != MState::Dead)
            .fold((0, 0), |(n, b), j| (n + 1, b + j.payload.len() as u64))
    }

    /// What an enqueue of `adding` adds at most: (jobs, payload bytes). A job whose dedup key
    /// is held (by a live or dead job, or an earlier job of the batch) adds no job, and its
    /// payload only if it may replace the holder's (whether or not the holder still waits).
    fn needs(&self, adding: &[Adding<'_>]) -> (u64, u64) {
        let mut seen = BTreeSet::new();
        let (mut jobs, mut bytes) = (0u64, 0u64);
        for &(len, key, keep) in adding {
            let held = key.is_some_and(|k| !seen.insert(k) || self.dedup.contains_key(k));
            if !held {
                jobs += 1;
                bytes += len;
            } else if !keep {
                bytes += len;
            }
        }
        (jobs, bytes)
    }

    /// The jobs `WhenFull::DropOldest` may drop, in the order it drops them: ready jobs first
    /// in their group (a held one never goes), the highest priority value (served last)
    /// first and in their place in line within a priority; then scheduled jobs by due time
    /// (then id). Leased and dead jobs never go.
    pub fn drop_order(&self) -> Vec<u64> {
        let mut ready: Vec<(std::cmp::Reverse<i32>, u64, u64)> = self
            .jobs
            .iter()
            .filter(|&(&id, j)| j.state == MState::Ready && self.group_head(id))
            .map(|(&id, j)| (std::cmp::Reverse(j.priority), j.seq, id))
            .collect();
        ready.sort_unstable();
        let mut scheduled: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state == MState::Scheduled)
            .map(|(&id, j)| (j.run_at_ms, id))
            .collect();
        scheduled.sort_unstable();
        ready
            .into_iter()
            .map(|r| r.2)
            .chain(scheduled.into_iter().map(|s| s.1))
            .collect()
    }

    /// Before the first write of an enqueue of `adding` (a batch, a follow-up, a schedule's
    /// instance): whether it fits the size limit, the oldest waiting jobs dropped first
    /// (deleted as `remove` deletes, counted in `dropped`) when the limit says so; if not,
    /// the `QueueFull` refusal, nothing changed. A job holding one of the enqueue's own dedup
    /// keys is never dropped; if every job that can go is not enough, none goes.
    pub fn make_room(&mut self, adding: &[Adding<'_>]) -> Result<(), EKind> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let (needs_jobs, needs_bytes) = self.needs(adding);
        let (jobs, bytes) = self.counted();
        let fits = |n: u64, b: u64| {
            limit
                .max_jobs
                .is_none_or(|m| needs_jobs == 0 || n.saturating_add(needs_jobs) <= m)
                && limit
                    .max_bytes
                    .is_none_or(|m| needs_bytes == 0 || b.saturating_add(needs_bytes) <= m)
        };
        if fits(jobs, bytes) {
            return Ok(());
        }
        let full = EKind::QueueFull {
            jobs,
            bytes,
            max_jobs: limit.max_jobs,
            max_bytes: limit.max_bytes,
            needs_jobs,
            needs_bytes,
        };
        if limit.when_full != MFull::DropOldest {
            return Err(full);
        }
        let keys: BTreeSet<&str> = adding.iter().filter_map(|a| a.1).collect();
        let (mut n, mut b) = (jobs, bytes);
        let mut victims = Vec::new();
        for id in self.drop_order() {
            let job = &self.jobs[&id];
            if job.dedup.as_deref().is_some_and(|k| keys.contains(k)) {
                continue;
            }
            n -= 1;
            b -= job.payload.len() as u64;
            victims.push(id);
            if fits(n, b) {
                for &id in &victims {
                    self.delete(id);
                }
                self.dropped += victims.len() as u64;
                return Ok(());
            }
        }
        Err(full)
    }

    pub fn set_token(&mut self, id: u64, token: u64) {
        let job = self
            .jobs
            .get_mut(&id)
            .expect("model: naming the token of a live job");
        match &mut job.state {
            MState::Leased { token: t, .. } => *t = token,
            other => panic!("model: token for a job in state {other:?}"),
        }
        self.max_token = self.max_token.max(token);
    }

    /// `ack_batch`: every current lease is acked; a stale one is `LeaseLost` in its place and
    /// holds up nothing.
    pub fn ack(&mut self, leases: &[(u64, u64)]) -> MRes {
        if leases.is_empty() || leases.len() > BATCH_MAX {
            return MRes::Err(EKind::InvalidOption);
        }
        let out = leases
            .iter()
            .map(|&(id, token)| self.leased(id, token))
            .collect::<Vec<_>>();
        for (&(id, token), r) in leases.iter().zip(&out) {
            if r.is_ok() {
                self.delete(id);
            } else {
                self.ended_refused(id, token);
            }
        }
        MRes::Acked(out)
    }

    /// `Lease::ack`: the batch of one, as a plain answer.
    pub fn ack_one(&mut self, id: u64, token: u64) -> MRes {
        match self.ack(&[(id, token)]) {
            MRes::Acked(v) => match v[0] {
                Ok(()) => MRes::Unit,
                Err(k) => MRes::Err(k),
            },
            other => other,
        }
    }

    /// `ack_with_batch`, whose closure increments each job's effect key; the closure of the
    /// lease at `fails_at` fails after writing: none of its writes stay, its job is given back
    /// with the closure's error as its last error (`Effect` in its place), and the other
    /// current leases are acked with their effects. A stale lease is `LeaseLost` in its place.
    /// A key applied before, or by an earlier lease of the batch, acks without running the
    /// closure.
    ///
    /// With `follow`, each closure that applies enqueues a follow-up job (payload
    /// [`follow_payload`] of the parent's effect key) in the same transaction: it exists iff
    /// the parent's ack committed.
    pub fn ack_with(
        &mut self,
        leases: &[(u64, u64)],
        fails_at: Option<usize>,
        now_ms: u64,
        follow: bool,
    ) -> MRes {
        if leases.is_empty() || leases.len() > BATCH_MAX {
            return MRes::Err(EKind::InvalidOption);
        }
        let mut out = Vec::new();
        let mut follow_ups = 0;
        // The acked jobs are deleted after every closure ran: until then they count for the
        // size limit the follow-ups meet.
        let mut acked = Vec::new();
        for (i, &(id, token)) in leases.iter().enumerate() {
            if let Err(e) = self.leased(id, token) {
                self.ended_refused(id, token);
                out.push(Err(e));
                continue;
            }
            let key = self.jobs[&id].effect_key(id);
            if self.applied.contains(&key) {
                out.push(Ok(Applied::AlreadyApplied));
            } else if fails_at == Some(i) {
                let reason = LastErr::Reason(EFFECT_ERROR.to_string());
                if self.end_attempt(id, reason, now_ms, now_ms) == JobState::Dead {
                    self.note_end(id, now_ms);
                }
                out.push(Err(EKind::Effect));
                continue;
            } else {
                *self.effects.entry(key.clone()).or_insert(0) += 1;
                // Only caller keys get a marker (a job's own id guards nothing once it is gone).
                if self.jobs[&id].idem.is_some() {
                    self.applied.insert(key.clone());
                }
                if follow {
                    let spec = EnqSpec {
                        payload: follow_payload(&key),
                        ..EnqSpec::default()
                    };
                    // A follow-up that does not fit the size limit is refused, nothing
                    // written: the closure goes on without it.
                    match self.enqueue(now_ms, &[spec]) {
                        MRes::Enq(_) => follow_ups += 1,
                        MRes::Err(EKind::QueueFull { .. }) => {}
                        other => panic!("model: a follow-up enqueue answered {other:?}"),
                    }
                }
                out.push(Ok(Applied::Now));
            }
            acked.push(id);
        }
        for id in acked {
            self.delete(id);
        }
        if follow {
            MRes::AppliedF(out, follow_ups)
        } else {
            MRes::Applied(out)
        }
    }

    /// `Lease::ack_with`: the batch of one, as a plain answer (an `Effect` error ended the
    /// attempt).
    pub fn ack_with_one(
        &mut self,
        id: u64,
        token: u64,
        fails: bool,
        now_ms: u64,
        follow: bool,
    ) -> MRes {
        let single = |v: &[Result<Applied, EKind>], ok: MRes| match v[0] {
            Ok(_) => ok,
            Err(EKind::Effect) => MRes::EndedErr(EKind::Effect),
            Err(k) => MRes::Err(k),
        };
        match self.ack_with(&[(id, token)], fails.then_some(0), now_ms, follow) {
            MRes::Applied(v) => single(&v, MRes::Applied(v.clone())),
            MRes::AppliedF(v, n) => single(&v, MRes::AppliedF(v.clone(), n)),
            other => other,
        }
    }

    /// `ack_and_next` (`with_effect` false) or `ack_with_and_next`: the ack, then a dequeue of
    /// one, in one commit; nothing if the ack is refused.
    pub fn ack_next(
        &mut self,
        id: u64,
        token: u64,
        now_ms: u64,
        with_effect: bool,
        effect_fails: bool,
    ) -> MRes {
        let applied = if with_effect {
            match self.ack_with_one(id, token, effect_fails, now_ms, false) {
                MRes::Applied(a) => Some(a[0].expect("ack_with_one answers Ok in a vec")),
                err => return err,
            }
        } else {
            match self.ack_one(id, token) {
                MRes::Unit => None,
                err => return err,
            }
        };
        MRes::Next(applied, self.dequeue_inner(now_ms, 1).pop())
    }

    pub fn nack(
        &mut self,
        id: u64,
        token: u64,
        now_ms: u64,
        backoff_ms: u64,
        reason: &str,
    ) -> MRes {
        if backoff_ms > DELAY_MAX_MS {
            return MRes::Err(EKind::InvalidOption);
        }
        if let Err(e) = self.leased(id, token) {
            self.ended_refused(id, token);
            return MRes::Err(e);
        }
        let at = now_ms + backoff_ms;
        let state = self.end_attempt(id, LastErr::Reason(truncate_reason(reason)), now_ms, at);
        if state == JobState::Dead {
            self.note_end(id, now_ms);
        }
        MRes::State(state)
    }

    /// `Lease::snooze`: back to scheduled (ready at once for 0) without charging the attempt.
    pub fn snooze(&mut self, id: u64, token: u64, now_ms: u64, delay_ms: u64) -> MRes {
        if delay_ms > DELAY_MAX_MS {
            return MRes::Err(EKind::InvalidOption);
        }
        if let Err(e) = self.leased(id, token) {
            self.ended_refused(id, token);
            return MRes::Err(e);
        }
        let job = self.jobs.get_mut(&id).expect("leased job");
        job.attempts -= 1;
        job.snoozes += 1;
        job.run_at_ms = now_ms + delay_ms;
        if delay_ms > 0 {
            job.state = MState::Scheduled;
        } else {
            self.make_ready(id);
        }
        MRes::Unit
    }

    pub fn fail(&mut self, id: u64, token: u64, reason: &str) -> MRes {
        if let Err(e) = self.leased(id, token) {
            self.ended_refused(id, token);
            return MRes::Err(e);
        }
        let job = self.jobs.get_mut(&id).expect("leased job");
        job.last_error = LastErr::Reason(truncate_reason(reason));
        job.state = MState::Dead;
        self.note_end(id, self.now_ms);
        MRes::Unit
    }

    pub fn extend(&mut self, id: u64, token: u64, now_ms: u64, by_ms: u64) -> MRes {
        if by_ms == 0 || by_ms > LEASE_MAX_MS {
            return MRes::Err(EKind::InvalidOption);
        }
        let deadline_ms = now_ms.saturating_add(by_ms);
        if let Err(e) = self.leased(id, token) {
            // A cancelled delivery's extend (refused) still moves its group's wait later.
            if let Some(f) = self.fences.get_mut(&id)
                && f.3 == token
            {
                f.2 = f.2.max(deadline_ms);
            }
            return MRes::Err(e);
        }
        self.jobs.get_mut(&id).expect("leased job").state = MState::Leased { token, deadline_ms };
        MRes::Deadline(deadline_ms)
    }

    pub fn requeue_dead(&mut self, id: u64, now_ms: u64) -> MRes {
        let Some(job) = self.jobs.get_mut(&id) else {
            return MRes::Err(EKind::JobNotFound);
        };
        if job.state != MState::Dead {
            return MRes::Err(EKind::InvalidState);
        }
        let job = job.clone();
        if let Some(s) = self.sched_of(&job) {
            // A dead instance back to ready: it may now wait beside a newer one.
            s.multi_live = true;
        }
        let place = self.group_place();
        let job = self.jobs.get_mut(&id).expect("dead job");
        if job.group.is_some() {
            // Back at the end of its group.
            job.group_order = place;
        }
        job.attempts = 0;
        job.run_at_ms = now_ms;
        self.make_ready(id);
        MRes::Unit
    }

    /// `Queue::set_history` with `keep_jobs` (`None`: off): whether the setting changed. What
    /// the history keeps is not modelled: its rows are not live, and calls are not aimed at
    /// them (`kept_rows`).
    pub fn set_history(&mut self, keep_jobs: Option<u64>) -> MRes {
        let changed = self.history != keep_jobs;
        self.history = keep_jobs;
        MRes::Flag(changed)
    }

    /// `Queue::retry` (history off): a dead job back to ready, attempts reset, as
    /// `requeue_dead`; a scheduled one ready now, as `promote`; a ready or leased job is
    /// `InvalidState`.
    pub fn retry(&mut self, id: u64, now_ms: u64) -> MRes {
        match self.jobs.get(&id).map(|j| &j.state) {
            Some(MState::Scheduled) => self.promote(id, now_ms),
            _ => self.requeue_dead(id, now_ms),
        }
    }

    /// `Queue::promote`: a scheduled job ready now, at the back of its priority.
    pub fn promote(&mut self, id: u64, now_ms: u64) -> MRes {
        match self.jobs.get_mut(&id) {
            None => MRes::Err(EKind::JobNotFound),
            Some(job) if job.state == MState::Scheduled => {
                job.run_at_ms = now_ms;
                self.make_ready(id);
                MRes::Unit
            }
            Some(_) => MRes::Err(EKind::InvalidState),
        }
    }

    /// `Queue::reschedule`: a ready or scheduled job due `delay_ms` from now (a ready one given
    /// zero keeps its place).
    pub fn reschedule(&mut self, id: u64, now_ms: u64, delay_ms: u64) -> MRes {
        if delay_ms > DELAY_MAX_MS {
            return MRes::Err(EKind::InvalidOption);
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return MRes::Err(EKind::JobNotFound);
        };
        match job.state {
            MState::Ready | MState::Scheduled if delay_ms > 0 => {
                job.run_at_ms = now_ms + delay_ms;
                job.state = MState::Scheduled;
            }
            MState::Scheduled => {
                job.run_at_ms = now_ms;
                self.make_ready(id);
            }
            MState::Ready => {}
            _ => return MRes::Err(EKind::InvalidState),
        }
        MRes::Unit
    }

    /// `Queue::set_priority` (`Some`) or `Queue::update_payload`: ready, scheduled or dead jobs.
    pub fn update(&mut self, id: u64, priority: Option<i32>, payload: Option<&[u8]>) -> MRes {
        let Some(job) = self.jobs.get_mut(&id) else {
            return MRes::Err(EKind::JobNotFound);
        };
        if matches!(job.state, MState::Leased { .. }) {
            return MRes::Err(EKind::InvalidState);
        }
        if let Some(p) = priority {
            job.priority = p;
        }
        if let Some(bytes) = payload {
            job.payload = bytes.to_vec();
        }
        MRes::Unit
    }

    /// `Queue::cancel`: a live job ends now, its dedup key released, its lease (if any)
    /// fenced; returns the state it was in. A job gone for good is `Gone`. A cancelled lease's calls are answered as lost
    /// (`Cancelled` is mapped to `LeaseLost`).
    pub fn cancel(&mut self, id: u64) -> MRes {
        let Some(job) = self.jobs.get(&id) else {
            // A job acked or removed for good is gone; an id never handed out is not found.
            if self.gone.contains(&id) && !self.kept_rows.contains(&id) {
                return MRes::Gone;
            }
            return MRes::Err(EKind::JobNotFound);
        };
        let was = job.state.public();
        if let (MState::Leased { deadline_ms, token }, Some(g)) = (&job.state, &job.group)
            && *deadline_ms > self.now_ms
        {
            // Its worker may still run: the group waits for that delivery to end.
            let fence = (g.clone(), job.group_order, *deadline_ms, *token);
            self.fences.insert(id, fence);
        }
        self.delete(id);
        self.kept_rows.insert(id);
        MRes::State(was)
    }

    /// `Queue::pause` (`pause`) or `Queue::resume`: whether the state changed.
    pub fn set_paused(&mut self, pause: bool) -> MRes {
        let changed = self.paused != pause;
        self.paused = pause;
        MRes::Flag(changed)
    }

    /// `Queue::remove`: deletes a job that is not leased, releasing its dedup key.
    pub fn remove(&mut self, id: u64) -> MRes {
        match self.jobs.get(&id).map(|j| &j.state) {
            None => MRes::Err(EKind::JobNotFound),
            Some(MState::Leased { .. }) => MRes::Err(EKind::InvalidState),
            Some(_) => {
                self.delete(id);
                MRes::Unit
            }
        }
    }

    /// What an open does before handing the queue out: every lease goes back to ready, in the
    /// place its job had (its `seq` from when it was last ready), or to dead when out of
    /// attempts, attempts unchanged. Returns (returned, dead-lettered).
    pub fn recover(&mut self, now_ms: u64) -> (u64, u64) {
        let mut leased: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                MState::Leased { deadline_ms, .. } => Some((deadline_ms, id)),
                _ => None,
            })
            .collect();
        leased.sort_unstable();
        // The workers of cancelled deliveries are gone with their process.
        self.fences.clear();
        let (mut returned, mut dead) = (0, 0);
        for (_, id) in leased {
            let place = self.jobs[&id].seq;
            match self.end_attempt(id, LastErr::Abandoned, now_ms, now_ms) {
                JobState::Dead => dead += 1,
                _ => {
                    self.jobs.get_mut(&id).expect("returned job").seq = place;
                    returned += 1;
                }
            }
        }
        (returned, dead)
    }

    /// Counts per state: (total, scheduled, ready, leased, dead).
    pub fn counts(&self) -> (u64, u64, u64, u64, u64) {
        let mut c = (self.jobs.len() as u64, 0, 0, 0, 0);
        for j in self.jobs.values() {
            match j.state {
                MState::Scheduled => c.1 += 1,
                MState::Ready => c.2 += 1,
                MState::Leased { .. } => c.3 += 1,
                MState::Dead => c.4 += 1,
            }
        }
        c
    }

    /// The schedule of this incarnation whose instance `job` is, if it still exists.
    fn sched_of(&mut self, job: &MJob) -> Option<&mut MSched> {
        let tag = job.sched.as_ref()?;
        self.schedules.values_mut().find(|s| s.tags.contains(tag))
    }

    /// A schedule as `ScheduleInfo` shows it.
    pub fn sched_view(&self, name: &str) -> Option<SchedView> {
        let s = self.schedules.get(name)?;
        Some(SchedView {
            name: name.to_string(),
            every_ms: s.every_ms,
            start_ms: s.start_ms,
            next_due_ms: s.paused_ms.is_none().then_some(s.next_due_ms),
            last_job: s.last_job,
            fired: s.fired,
            skipped: s.skipped,
            overlap_enqueue: s.overlap_enqueue,
            missed_skip: s.missed_skip,
            priority: s.priority,
            payload_bytes: s.payload.len(),
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
            paused_ms: s.paused_ms,
        })
    }

    /// Fires the due schedules at `now_ms`, in due-time order (then by name), each once: an
    /// instance, ready now at the back of its priority, unless the last instance is pending
    /// (ready or scheduled), or running under `Overlap::Skip`; at open (`at_open`), a
    /// `Missed::Skip` schedule skips. Then the next due time after now (due times that
    /// passed together make one decision).
    fn fire_due(&mut self, now_ms: u64, at_open: bool) {
        let mut due: Vec<(u64, String)> = self
            .schedules
            .iter()
            .filter(|(_, s)| s.next_due_ms <= now_ms)
            .map(|(n, s)| (s.next_due_ms, n.clone()))
            .collect();
        due.sort();
        assert!(due.len() <= 256, "model: workload exceeds the sweep bound");
        for (at, name) in due {
            let s = &self.schedules[&name];
            // A due time at the open's very millisecond is due now, not missed.
            let fire = if at_open && s.missed_skip && at < now_ms {
                false
            } else {
                match s
                    .last_job
                    .and_then(|(id, _)| self.jobs.get(&id))
                    .map(|j| &j.state)
                {
                    Some(MState::Ready | MState::Scheduled) => false,
                    Some(MState::Leased { .. }) => s.overlap_enqueue,
                    // Under Skip, due times that passed before the last instance ended are
                    // skipped: one fires only if a due time came at or after its end.
                    // (An end after now, the clock having gone back, tells nothing.)
                    Some(MState::Dead) | None => match s.last_ended_ms {
                        Some(ended) if !s.overlap_enqueue && ended <= now_ms => {
                            interval_due_after(s.every_ms, s.start_ms, ended.saturating_sub(1))
                                <= now_ms
                        }
                        _ => true,
                    },
                }
            };
            // A due time whose instance does not fit the queue's size limit is skipped.
            let len = s.payload.len() as u64;
            let full = fire && self.make_room(&[(len, None, true)]).is_err();
            let fire = fire && !full;
            // A schedule keeps at most one dead instance: firing deletes a dead last one.
            if fire {
                self.drop_dead_instance(&name);
            }
            let id = self.next_placeholder();
            if fire {
                let job = instance_of(&self.schedules[&name], now_ms);
                self.jobs.insert(id, job);
                self.make_ready(id);
            }
            let s = self.schedules.get_mut(&name).expect("due schedule");
            if fire {
                s.last_job = Some((id, at));
                s.last_ended_ms = None;
                s.fired += 1;
            } else {
                s.skipped += 1;
                s.skipped_full += u64::from(full);
            }
            s.next_due_ms = interval_due_after(s.every_ms, s.start_ms, now_ms);
        }
    }

    /// What an open does after it returned the leases ([`Model::recover`]), in the same
    /// commit: every due schedule decided, `Missed` deciding for due times missed while the
    /// file was closed.
    pub fn open_schedules(&mut self, now_ms: u64) {
        // Jobs an instance drops to make room end now.
        let called_at = std::mem::replace(&mut self.now_ms, now_ms);
        self.fire_due(now_ms, true);
        self.now_ms = called_at;
    }

    /// `create_schedule`, `update_schedule` or `upsert_schedule` of an interval schedule at
    /// `now_ms`. Every refusal writes nothing. A change keeps the next due time when the
    /// interval stays (and no new start is given, or the same one); another timing counts
    /// from now. The last instance and the counters are kept.
    pub fn set_schedule(&mut self, now_ms: u64, name: &str, def: &SchedDef, mode: SetMode) -> MRes {
        let bad_name = name.is_empty()
            || name.len() > SCHEDULE_NAME_BYTES_MAX
            || name.chars().any(char::is_control);
        if bad_name
            || def.every_ms == 0
            || def.every_ms > DELAY_MAX_MS
            || def.forbidden_option != 0
            || def.max_attempts == Some(0)
            || def.lease_ms.is_some_and(|l| l == 0 || l > LEASE_MAX_MS)
        {
            return MRes::Err(EKind::InvalidOption);
        }
        let old = self.schedules.get(name).cloned();
        match (&old, mode) {
            (Some(_), SetMode::Create) => return MRes::Err(EKind::ScheduleExists),
            (None, SetMode::Update) => return MRes::Err(EKind::ScheduleNotFound),
            _ => {}
        }
        let kept = old
            .as_ref()
            .filter(|o| o.every_ms == def.every_ms && def.start_ms.is_none_or(|s| s == o.start_ms));
        let (start_ms, next_due_ms) = match kept {
            Some(o) => (o.start_ms, o.next_due_ms),
            None => {
                let start = def.start_ms.unwrap_or(now_ms + def.every_ms);
                let next = if start >= now_ms {
                    start
                } else {
                    interval_due_after(def.every_ms, start, now_ms - 1)
                };
                (start, next)
            }
        };
        // A paused schedule stays paused, never due, until resumed.
        let paused_ms = old.as_ref().and_then(|o| o.paused_ms);
        let next_due_ms = if paused_ms.is_some() {
            u64::MAX
        } else {
            next_due_ms
        };
        let mut tags = old.as_ref().map(|o| o.tags.clone()).unwrap_or_default();
        if let Some(t) = sched_tag(&def.payload) {
            tags.insert(t.to_vec());
        }
        let s = MSched {
            every_ms: def.every_ms,
            start_ms,
            payload: def.payload.clone(),
            priority: def.priority,
            max_attempts: def.max_attempts.unwrap_or(self.max_attempts),
            lease_ms: def.lease_ms,
            overlap_enqueue: def.overlap_enqueue,
            missed_skip: def.missed_skip,
            next_due_ms,
            last_job: old.as_ref().and_then(|o| o.last_job),
            fired: old.as_ref().map_or(0, |o| o.fired),
            skipped: old.as_ref().map_or(0, |o| o.skipped),
            created_ms: old.as_ref().map_or(now_ms, |o| o.created_ms),
            updated_ms: now_ms,
            tags,
            ended: old.as_ref().map_or(0, |o| o.ended),
            skipped_full: old.as_ref().map_or(0, |o| o.skipped_full),
            multi_live: old.as_ref().is_some_and(|o| o.multi_live) || def.overlap_enqueue,
            last_ended_ms: old.as_ref().and_then(|o| o.last_ended_ms),
            paused_ms,
        };
        self.schedules.insert(name.to_string(), s);
        MRes::Sched(self.sched_view(name).expect("just set"))
    }

    /// `pause_schedule`: whether it was running; never due until resumed.
    pub fn pause_schedule(&mut self, now_ms: u64, name: &str) -> MRes {
        let Some(s) = self.schedules.get_mut(name) else {
            return MRes::Err(EKind::ScheduleNotFound);
        };
        if s.paused_ms.is_some() {
            return MRes::Flag(false);
        }
        s.paused_ms = Some(now_ms);
        s.next_due_ms = u64::MAX;
        MRes::Flag(true)
    }

    /// `resume_schedule`: whether it was paused; due at its first due time from now (its
    /// start if not past, else the next multiple at or after now).
    pub fn resume_schedule(&mut self, now_ms: u64, name: &str) -> MRes {
        let Some(s) = self.schedules.get_mut(name) else {
            return MRes::Err(EKind::ScheduleNotFound);
        };
        if s.paused_ms.is_none() {
            return MRes::Flag(false);
        }
        s.paused_ms = None;
        s.next_due_ms = if s.start_ms >= now_ms {
            s.start_ms
        } else {
            interval_due_after(s.every_ms, s.start_ms, now_ms - 1)
        };
        MRes::Flag(true)
    }

    /// `trigger_schedule`: one instance now, ready at the back of its priority, the
    /// schedule's last instance (named once the queue shows it), counted as fired; the due
    /// time and a pause stay.
    pub fn trigger_schedule(&mut self, now_ms: u64, name: &str) -> MRes {
        let Some(s) = self.schedules.get(name) else {
            return MRes::Err(EKind::ScheduleNotFound);
        };
        let len = s.payload.len() as u64;
        if let Err(full) = self.make_room(&[(len, None, true)]) {
            return MRes::Err(full);
        }
        let s = &self.schedules[name];
        // The instance before it may still be live: two live at once.
        let live_before = s
            .last_job
            .and_then(|(id, _)| self.jobs.get(&id))
            .is_some_and(|j| j.state != MState::Dead);
        self.drop_dead_instance(name);
        let s = &self.schedules[name];
        let job = instance_of(s, now_ms);
        let id = self.next_placeholder();
        self.jobs.insert(id, job);
        self.make_ready(id);
        let s = self.schedules.get_mut(name).expect("checked above");
        s.last_job = Some((id, now_ms));
        s.last_ended_ms = None;
        s.fired += 1;
        s.multi_live |= live_before;
        MRes::Unit
    }

    /// A new instance of schedule `name` replaces its last one: if that one is dead, it is
    /// deleted (a schedule keeps at most one dead instance).
    fn drop_dead_instance(&mut self, name: &str) {
        if let Some((prev, _)) = self.schedules[name].last_job
            && self
                .jobs
                .get(&prev)
                .is_some_and(|j| j.state == MState::Dead)
        {
            self.delete(prev);
        }
    }

    /// `remove_schedule`: whether it existed. Its instances stay, as plain jobs.
    pub fn remove_schedule(&mut self, name: &str) -> MRes {
        MRes::Flag(self.schedules.remove(name).is_some())
    }

    /// The model's own invariants; a failure here is a bug in the model, not in leaseq.
    /// (Effect keys: `#id` for jobs without a caller key, `k…` for caller keys, which carry a
    /// marker, `w…` for `Queue::write` rows, which do not.)
    pub fn self_check(&self) {
        for (k, &n) in &self.effects {
            assert_eq!(n, 1, "model: effect {k} applied {n} times");
            assert!(
                self.applied.contains(k) || k.starts_with('#') || k.starts_with('w'),
                "model: effect {k} of a caller key without marker"
            );
        }
        for (k, owner) in &self.dedup {
            let job = self.jobs.get(owner).expect("model: dedup owner is live");
            assert_eq!(job.dedup.as_deref(), Some(k.as_str()));
        }
        for j in self.jobs.values() {
            assert!(j.attempts <= j.max_attempts, "model: attempts above max");
            if matches!(j.state, MState::Ready | MState::Scheduled) {
                assert!(
                    j.attempts < j.max_attempts,
                    "model: runnable without attempts"
                );
            }
        }
    }
}

/// A new instance of schedule `s` enqueued at `now_ms`: ready (placed by `make_ready`), made
/// of its template, carrying its tag.
fn instance_of(s: &MSched, now_ms: u64) -> MJob {
    MJob {
        payload: s.payload.clone(),
        priority: s.priority,
        max_attempts: s.max_attempts,
        lease_ms: s.lease_ms,
        idem: None,
        dedup: None,
        created_ms: now_ms,
        attempts: 0,
        run_at_ms: now_ms,
        seq: 0,
        state: MState::Ready,
        last_error: LastErr::None,
        snoozes: 0,
        until_started: false,
        sched: sched_tag(&s.payload).map(<[u8]>::to_vec),
        group: None,
        group_order: 0,
        timeout_ms: None,
    }
}
