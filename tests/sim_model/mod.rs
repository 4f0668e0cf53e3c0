//! Model-based crash test harness, shared by `tests/sim/crash_model.rs` and the fuzz
//! targets in `fuzz/`.
//!
//! One seed (or one fuzzer input) drives a single-threaded, deterministic workload over leaseq's
//! public API on a [`SimDisk`]: enqueues (single and batch, with every option, some invalid on
//! purpose), dequeues (single and batch), acks, `ack_with` effects on a caller table (single,
//! batch, `ack_and_next`, `ack_with_and_next`, effects that fail after writing; half the
//! `ack_with` calls enqueue a follow-up job from each closure, which the model expects to
//! exist iff its parent's ack committed), `Queue::write` calls that write an effect row and
//! enqueue into the named queue "side" with `enqueue_to` (both exist iff the write committed),
//! nacks, extends,
//! fails, `requeue_dead`, `remove`, `prune`, `compact`, `flush`, periodic jobs (interval
//! schedules of a few names created, updated, upserted and removed, with random `Overlap` and
//! `Missed`; dequeues and reopens fire them), ordered groups (a third of the enqueues name
//! one of three groups: the model delivers a group's jobs one at a time, in order), rate
//! limits (set, changed, removed; the model keeps the stored window and predicts what each
//! dequeue may take), size limits (`set_limit`: a bound on the jobs, the payload bytes or
//! both, often near what the queue holds, with `Refuse`, `DropOldest`, or `Block` for a few ms,
//! which a single-threaded workload cannot see end otherwise than `Refuse`; changed, removed,
//! some invalid on purpose: the model predicts every enqueue, follow-up and schedule instance
//! refused `QueueFull` with its counts, and exactly which jobs `DropOldest` drops, which must
//! never be delivered, not after a power loss either; the limit, the payload bytes counted and
//! `Stats::dropped` are compared with the rest), clock steps (also backwards),
//! clean reopens, process kills, power cuts between calls, and crashes at a random I/O call
//! (`crash_after`), sometimes a second one during the recovery open. One seed in six runs with `Durability::None`.
//!
//! A [`model::Model`] tracks what each `Ok` promised; every answer is checked against it, and
//! every few calls and after every reopen the whole queue (every job, the stats, the applied-ids
//! markers, the effect table, `check()`) must equal it. A call the crash hit returned `Err` and
//! may or may not have committed: the queue must hold it wholly or not at all. With
//! `Durability::None`, a crash may lose the calls since the last durable point (a flush, a clean
//! close), but only a suffix of them: the queue must equal the model after some prefix.
//!
//! Some states differ only in what the API does not show (the id and token counters, the order
//! of the ready line: an uncommitted `extend` changes nothing else once the reopen returns the
//! lease). So the harness keeps every state that agrees with all answers so far (its "worlds",
//! usually one) and lets the answers that follow tell them apart; it fails when none is left.
//!
//! Schedules: the model fires them as leaseq documents (in a dequeue's sweep, after due jobs
//! are promoted and expired leases reclaimed, and at open after the leases came back, `Missed`
//! deciding there). Their
//! instances' ids are not predicted: after a call that fired one, the schedules as the queue
//! shows them name it (`last_job`), and must equal the model's; one the power cut hid is named
//! by its delivery or by the reopen, as an enqueue the crash hit. Beside the exact comparison,
//! `compare` checks what the schedules promise about the file on its own (instances in the
//! file plus those gone equal `fired`; one live instance at most without `Overlap::Enqueue` or
//! a requeue), the reopen checks that no due time was lost (`check_open_decisions`), and with
//! `Durability::Immediate` `fired` and the last due time never go back (`check_floors`).
#![allow(dead_code)]

pub mod corrupt;
pub mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use leaseq::sim::SimDisk;
use leaseq::{
    Applied, Clock, Durability, EnqueueOptions, Enqueued, Error, JobId, JobInfo, JobState, Lease,
    ManualClock, Missed, Overlap, Queue, QueueLimit, RateLimit, Schedule, ScheduleInfo, Timing,
    WhenFull,
};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use model::{
    DeqPred, EKind, EnqSpec, LastErr, MEnq, MFull, MJob, MLimit, MRes, MState, Model, PENDING_BASE,
    SchedDef, SchedView, SetMode,
};

/// The caller's own table that `ack_with` effects increment: effect key -> count.
pub const EFFECTS: TableDefinition<&str, u64> = TableDefinition::new("effects");
/// The named queue `Queue::write` calls enqueue into.
pub const SIDE: &str = "side";

/// The clock's start (Unix ms).
pub const T0_MS: u64 = 1_700_000_000_000;
/// The queue's default lease and max attempts in every workload.
pub const LEASE_MS: u64 = 1_000;
pub const MAX_ATTEMPTS: u32 = 3;
/// Idempotency keys are drawn from this many names, so several jobs share one effect.
const IDEM_KEYS: u64 = 6;
const DEDUP_KEYS: u64 = 4;
/// Live jobs above this make the workload consume instead of produce.
const LIVE_JOBS_SOFT_MAX: usize = 40;
const HELD_LEASES_MAX: usize = 8;
/// Ordered groups are drawn from this many names.
const GROUPS: u64 = 3;
/// The names the workload's schedules are drawn from.
const SCHED_NAMES: [&str; 3] = ["s0", "s1", "s2"];

/// Where the workload's choices come from: a seeded RNG (tests) or fuzzer bytes.
pub enum Src {
    Rng(fastrand::Rng),
    Bytes { data: Vec<u8>, pos: usize },
}

impl Src {
    /// A number in `0..n` (`n >= 1`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n >= 1);
        match self {
            Src::Rng(r) => r.u64(0..n),
            Src::Bytes { data, pos } => {
                if n == 1 {
                    return 0;
                }
                let width = if n <= 256 { 1 } else { 4 };
                let mut v = 0u64;
                for _ in 0..width {
                    v = (v << 8) | u64::from(data.get(*pos).copied().unwrap_or(0));
                    *pos += 1;
                }
                v % n
            }
        }
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Fuzzer bytes all used.
    pub fn exhausted(&self) -> bool {
        matches!(self, Src::Bytes { data, pos } if *pos >= data.len())
    }
}

/// How long a workload runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Steps per workload: `min_steps..=max_steps` (fuzzer inputs stop when their bytes run out).
    pub min_steps: usize,
    pub max_steps: usize,
    /// Compare the whole queue with the model every this many steps (besides every reopen).
    pub full_check_every: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            min_steps: 40,
            max_steps: 160,
            full_check_every: 6,
        }
    }
}

/// What one workload did and found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub seed: u64,
    pub steps: usize,
    /// Planned power failures (`crash_after`) that hit an I/O call and were reopened from the
    /// crash image, including those during a recovery open.
    pub crashes: u64,
    /// Of those, the ones that hit the recovery open itself.
    pub crashes_in_recovery: u64,
    /// Crashes whose hit call returned `Err` while it had reached the disk: outcome uncertain.
    pub uncertain_calls: u64,
    /// Of those, how many turned out committed.
    pub uncertain_committed: u64,
    /// Other reopens: clean closes, process kills, power cuts between calls.
    pub reopens: u64,
    /// Durability::None reopens that found the queue as it was some calls back.
    pub non_durable_lost: u64,
    /// Reopens after which more than one state agreed with everything seen (told apart by the
    /// calls that followed).
    pub ambiguous_reopens: u64,
    /// The most such states at once.
    pub worlds_max: u64,
    /// Schedule calls made (create, update, upsert, remove).
    pub schedule_calls: u64,
    /// Due-time decisions of schedules seen: instances enqueued and due times skipped, by
    /// dequeues, and by opens.
    pub schedule_fired: u64,
    pub schedule_skipped: u64,
    pub open_fired: u64,
    pub open_skipped: u64,
    /// Dequeues made while a ready job waited behind its group's head, and while the rate
    /// limit allowed fewer jobs than asked for (as the model saw it before the call).
    pub group_waits: u64,
    pub rate_limited: u64,
    /// `set_limit` calls; calls refused `QueueFull` (enqueues and `trigger_schedule`, as the
    /// model saw them); jobs dropped to make room (in the first state kept after each call).
    pub limit_calls: u64,
    pub queue_full: u64,
    pub jobs_dropped: u64,
    /// Opens with `Builder::live_reads`.
    pub live_read_opens: u64,
    pub violation: Option<String>,
    pub log: Vec<String>,
}

impl Outcome {
    /// The seed's report: the violation and the op log.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "crash-sim seed {} VIOLATION after {} steps: {}",
            self.seed,
            self.steps,
            self.violation.as_deref().unwrap_or("none")
        );
        let _ = writeln!(s, "op log ({} lines):", self.log.len());
        for line in &self.log {
            let _ = writeln!(s, "  {line}");
        }
        s
    }
}

/// Runs the workload of `seed`.
pub fn run_seed(seed: u64, settings: Settings) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(seed);
    let steps = rng.usize(settings.min_steps..=settings.max_steps);
    run(Src::Rng(rng), seed, steps, settings)
}

/// Runs the workload a fuzzer input describes: 8 bytes of disk seed, then one byte per choice.
pub fn run_bytes(data: &[u8], settings: Settings) -> Outcome {
    let mut seed_bytes = [0u8; 8];
    let n = data.len().min(8);
    seed_bytes[..n].copy_from_slice(&data[..n]);
    let seed = u64::from_le_bytes(seed_bytes);
    let src = Src::Bytes {
        data: data[n..].to_vec(),
        pos: 0,
    };
    run(src, seed, settings.max_steps, settings)
}

fn run(src: Src, seed: u64, steps: usize, settings: Settings) -> Outcome {
    let mut r = Runner::new(src, seed, settings);
    // A panic (in leaseq or here) is a violation too; keep the op log that led to it.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.run(steps)))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("PANIC: {msg}"))
        });
    // The workload ended with a reopen, checked like every other: the close of the queue it
    // opened would only write to a disk no one reads again (clean closes are reboots of their
    // own), so the power goes first and the close stops at its first write.
    r.power_off();
    r.leases.clear();
    r.queue = None;
    r.out.steps = r.step;
    let mut out = std::mem::take(&mut r.out);
    out.seed = seed;
    out.log = std::mem::take(&mut r.log);
    if let Err(v) = result {
        out.violation = Some(v);
    }
    out
}

/// One state the queue may be in: the model, and with `Durability::None` the model at the last
/// durable point (a flush, a clean close) and after every call since, oldest first: a crash may
/// leave any of them (a prefix of the calls), nothing else.
#[derive(Clone)]
struct World {
    m: Model,
    hist: Vec<Model>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reboot {
    /// Drop the queue (clean close), reopen on the same disk.
    Clean,
    /// Drop the queue, reopen a copy of the file on a new disk.
    CleanCopy,
    /// Kill the process: the file as the OS has it (live image), without the close.
    Kill,
    /// Power fails between calls: the crash image of the disk now.
    PowerCut,
    /// Power failed at a planned I/O call: the crash image.
    Crash,
}

struct Runner {
    src: Src,
    seed: u64,
    settings: Settings,
    /// The queue file.
    disk: SimDisk,
    /// Its write-ahead journal: a second file on the queue file's power line (a crash or a
    /// power cut hits both at one call).
    journal: SimDisk,
    disks_made: u64,
    /// `Queue::write` calls so far: names each one's effect key and side payload.
    side_writes: u64,
    clock: ManualClock,
    queue: Option<Queue>,
    leases: Vec<Lease>,
    /// The worlds if the call the crash hit did commit.
    uncertain: Option<(String, Vec<World>)>,
    crash_armed: bool,
    /// The queue runs with `Durability::None`: calls return before their commit is durable.
    none_mode: bool,
    /// Every state the queue may be in that agrees with all answers so far (usually one; more
    /// when a reopen left states that differ only in what the API does not show, such as the
    /// id and token counters or the order of the ready line; later answers tell them apart).
    worlds: Vec<World>,
    quick_repair: bool,
    small_cache: bool,
    /// Opens with `Builder::live_reads` (redb's SingleWriter mode: two-phase commits and the
    /// simulator's byte-range locks); drawn apart from the seed's stream, so the other
    /// choices of a seed stay as they were.
    live_reads: bool,
    enqueues: u64,
    /// Schedule definitions set so far: names each one's payload tag.
    sched_calls: u64,
    /// With `Durability::Immediate`: per schedule, what the file showed last, which may not go
    /// back (until a remove of the name).
    sched_floor: BTreeMap<String, Floor>,
    step: usize,
    log: Vec<String>,
    out: Outcome,
}

/// What the file showed of a schedule (`Durability::Immediate`): its `fired` count never goes
/// back, nor the due time of its `last_job` while the definition stays. A new definition counts
/// a new timing from now, and the clock can have stepped back: its first due times may be
/// earlier than the last instance's. So the due time is not followed from a definition call
/// until the schedule fired past the count it had then (due times then rise again).
#[derive(Debug, Clone, Copy)]
struct Floor {
    fired: u64,
    last_due: Option<u64>,
    /// Without `last_due`: the `fired` count at the last definition call.
    rearm_after: u64,
}

/// A leaseq error, as the model names it.
fn ekind(e: &Error) -> Option<EKind> {
    Some(match e {
        // A cancelled delivery's calls are refused as a lost one's: the model does not tell
        // the two apart.
        Error::LeaseLost { .. } | Error::Cancelled { .. } => EKind::LeaseLost,
        Error::InvalidOption { .. } => EKind::InvalidOption,
        Error::KeyTooLong { .. } => EKind::KeyTooLong,
        Error::JobNotFound { .. } => EKind::JobNotFound,
        Error::InvalidState { .. } => EKind::InvalidState,
        Error::Effect(_) => EKind::Effect,
        Error::ScheduleExists { .. } => EKind::ScheduleExists,
        Error::ScheduleNotFound { .. } => EKind::ScheduleNotFound,
        Error::QueueFull {
            queue,
            jobs,
            bytes,
            max_jobs,
            max_bytes,
            needs_jobs,
            needs_bytes,
        } if queue == "(default)" => EKind::QueueFull {
            jobs: *jobs,
            bytes: *bytes,
            max_jobs: *max_jobs,
            max_bytes: *max_bytes,
            needs_jobs: *needs_jobs,
            needs_bytes: *needs_bytes,
        },
        _ => return None,
    })
}

fn fmt_err(e: &Error) -> String {
    let s = e.to_string();
    if s.chars().count() > 160 {
        format!("{}...", s.chars().take(160).collect::<String>())
    } else {
        s
    }
}

/// A size limit as the model names it.
fn to_mlimit(l: &QueueLimit) -> MLimit {
    MLimit {
        max_jobs: l.max_jobs,
        max_bytes: l.max_bytes,
        when_full: match l.when_full {
            WhenFull::Refuse => MFull::Refuse,
            WhenFull::Block { wait_ms } => MFull::Block(wait_ms),
            WhenFull::DropOldest => MFull::DropOldest,
        },
    }
}

/// The `QueueLimit` the model's limit describes.
fn of_mlimit(l: &MLimit) -> QueueLimit {
    QueueLimit {
        max_jobs: l.max_jobs,
        max_bytes: l.max_bytes,
        when_full: match l.when_full {
            MFull::Refuse => WhenFull::Refuse,
            MFull::Block(wait_ms) => WhenFull::Block { wait_ms },
            MFull::DropOldest => WhenFull::DropOldest,
        },
    }
}

/// What a delivered lease showed, and its token.
type Delivered = (DeqPred, u64);

fn delivered(l: &Lease) -> Delivered {
    (
        DeqPred {
            id: l.id().0,
            attempt: l.attempt(),
            deadline_ms: l.deadline_ms(),
            payload: l.payload().to_vec(),
        },
        l.token(),
    )
}

/// An answer, reduced to what the model predicts.
enum Got {
    Enq(Vec<Enqueued>),
    Deq(Vec<Delivered>),
    Unit,
    Acked(Vec<Result<(), Option<EKind>>>),
    Applied(Vec<Result<Applied, Option<EKind>>>),
    /// `Applied` with the ids of the follow-up jobs the closures enqueued (for the leases
    /// applied now, in lease order).
    AppliedF(Vec<Result<Applied, Option<EKind>>>, Vec<u64>),
    Next(Option<Applied>, Option<Delivered>),
    State(JobState),
    /// A cancel's `CancelOutcome::Gone`.
    Gone,
    Deadline(u64),
    Flag(bool),
    /// A schedule as a create, update or upsert stored it.
    Sched(SchedView),
}

/// A delivery for the op log: id, attempt, deadline, token, payload size.
fn fmt_delivery(d: &Delivered) -> String {
    format!(
        "job {} attempt {} deadline {} token {} ({}B)",
        d.0.id,
        d.0.attempt,
        d.0.deadline_ms as i64 - T0_MS as i64,
        d.1,
        d.0.payload.len()
    )
}

impl std::fmt::Debug for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::Enq(v) => write!(f, "{v:?}"),
            Got::Deq(v) => write!(
                f,
                "[{}]",
                v.iter().map(fmt_delivery).collect::<Vec<_>>().join(", ")
            ),
            Got::Unit => write!(f, "()"),
            Got::Acked(v) => write!(f, "{v:?}"),
            Got::Applied(v) => write!(f, "{v:?}"),
            Got::AppliedF(v, ids) => write!(f, "{v:?}, follow-ups {ids:?}"),
            Got::Next(a, n) => write!(f, "{a:?}, next {:?}", n.as_ref().map(fmt_delivery)),
            Got::State(s) => write!(f, "{s:?}"),
            Got::Gone => write!(f, "Gone"),
            Got::Flag(b) => write!(f, "{b}"),
            Got::Deadline(d) => write!(f, "deadline {}", *d as i64 - T0_MS as i64),
            Got::Sched(v) => write!(f, "{v:?}"),
        }
    }
}

impl Got {
    fn changes(&self) -> bool {
        match self {
            Got::Enq(v) => v
                .iter()
                .any(|e| matches!(e, Enqueued::New(_) | Enqueued::Replaced(_))),
            Got::Flag(changed) => *changed,
            Got::Deq(v) => !v.is_empty(),
            Got::Acked(v) => v.iter().any(Result::is_ok),
            Got::Applied(v) | Got::AppliedF(v, _) => v
                .iter()
                .any(|r| matches!(r, Ok(_) | Err(Some(EKind::Effect)))),
            _ => true,
        }
    }
}

/// Whether a batch call's per-lease outcomes are the predicted ones.
fn same_outcomes<T: PartialEq + Copy>(
    pred: &[Result<T, EKind>],
    got: &[Result<T, Option<EKind>>],
) -> bool {
    pred.len() == got.len() && pred.iter().zip(got).all(|(p, g)| p.map_err(Some) == *g)
}

/// Per-lease outcomes of a batch call, reduced to what the model names.
fn outcomes<T>(v: Vec<Result<T, Error>>) -> Vec<Result<T, Option<EKind>>> {
    v.into_iter().map(|r| r.map_err(|e| ekind(&e))).collect()
}

/// What an `Ok` answer names that the model learns from it: new job ids in order, and the
/// tokens of the leases handed out.
#[derive(Default)]
struct Learned {
    ids: Vec<u64>,
    tokens: Vec<(u64, u64)>,
    duplicates: Vec<u64>,
    /// Instances a sweep enqueued that the call delivered, whose ids no read named (the disk
    /// lost power before it): (placeholder, id).
    named: Vec<(u64, u64)>,
}

/// Checks an `Ok` answer against the prediction; ids and tokens must be fresh and increasing.
fn check_answer(pred: &MRes, got: &Got, max_id: u64, max_token: u64) -> Result<Learned, String> {
    let mut learned = Learned::default();
    let mismatch = || format!("answered Ok {got:?}, the model expects {pred:?}");
    let check_delivery = |p: &DeqPred, g: &Delivered, learned: &mut Learned| {
        if p.id >= PENDING_BASE {
            // An instance the call's sweep enqueued, its id unknown: any fresh one.
            let id = g.0.id;
            let fresh = id > max_id && id < PENDING_BASE && learned.named.iter().all(|n| n.1 != id);
            if !fresh || (DeqPred { id, ..p.clone() }) != g.0 {
                return Err(mismatch());
            }
            learned.named.push((p.id, id));
        } else if p != &g.0 {
            return Err(mismatch());
        }
        let last = learned.tokens.last().map_or(max_token, |t| t.1);
        if g.1 <= last {
            return Err(format!(
                "delivered job {} under token {}, not above every token before ({last})",
                g.0.id, g.1
            ));
        }
        learned.tokens.push((g.0.id, g.1));
        Ok(())
    };
    match (pred, got) {
        (MRes::Enq(p), Got::Enq(g)) if p.len() == g.len() => {
            let mut named: BTreeMap<u64, u64> = BTreeMap::new();
            for (p, g) in p.iter().zip(g) {
                match (p, g) {
                    (MEnq::New(pending), Enqueued::New(JobId(id))) => {
                        let last = learned.ids.last().copied().unwrap_or(max_id);
                        if *id <= last || *id >= PENDING_BASE {
                            return Err(format!(
                                "enqueue returned id {id}, not above every id before ({last})"
                            ));
                        }
                        named.insert(*pending, *id);
                        learned.ids.push(*id);
                    }
                    (MEnq::Duplicate(owner), Enqueued::Duplicate(JobId(id)))
                    | (MEnq::DuplicateDead(owner), Enqueued::DuplicateDead(JobId(id)))
                    | (MEnq::Replaced(owner), Enqueued::Replaced(JobId(id))) => {
                        let want = if *owner >= PENDING_BASE {
                            named.get(owner).copied()
                        } else {
                            Some(*owner)
                        };
                        if want != Some(*id) {
                            return Err(mismatch());
                        }
                        learned.duplicates.push(*id);
                    }
                    _ => return Err(mismatch()),
                }
            }
        }
        (MRes::Deq(p), Got::Deq(g)) if p.len() == g.len() => {
            for (p, g) in p.iter().zip(g) {
                check_delivery(p, g, &mut learned)?;
            }
        }
        (MRes::Unit, Got::Unit) => {}
        (MRes::Acked(a), Got::Acked(b)) if same_outcomes(a, b) => {}
        (MRes::Applied(a), Got::Applied(b)) if same_outcomes(a, b) => {}
        (MRes::AppliedF(a, n), Got::AppliedF(b, ids)) if same_outcomes(a, b) && *n == ids.len() => {
            for &id in ids {
                let last = learned.ids.last().copied().unwrap_or(max_id);
                if id <= last || id >= PENDING_BASE {
                    return Err(format!(
                        "a follow-up got id {id}, not above every id before ({last})"
                    ));
                }
                learned.ids.push(id);
            }
        }
        (MRes::State(a), Got::State(b)) if a == b => {}
        (MRes::Gone, Got::Gone) => {}
        (MRes::Flag(a), Got::Flag(b)) if a == b => {}
        (MRes::Deadline(a), Got::Deadline(b)) if a == b => {}
        (MRes::Sched(a), Got::Sched(b)) if a == b => {}
        (MRes::Next(pa, pn), Got::Next(ga, gn)) if pa == ga => match (pn, gn) {
            (None, None) => {}
            (Some(p), Some(g)) => check_delivery(p, g, &mut learned)?,
            _ => return Err(mismatch()),
        },
        _ => return Err(mismatch()),
    }
    Ok(learned)
}

impl Runner {
    fn new(src: Src, seed: u64, settings: Settings) -> Runner {
        let disk = SimDisk::new(seed);
        let journal = disk.sibling(seed ^ 0x4a4f);
        Runner {
            src,
            seed,
            settings,
            disk,
            journal,
            disks_made: 1,
            side_writes: 0,
            clock: ManualClock::new(T0_MS),
            queue: None,
            leases: Vec::new(),
            uncertain: None,
            crash_armed: false,
            none_mode: false,
            worlds: vec![World {
                m: Model::new(LEASE_MS, MAX_ATTEMPTS),
                hist: Vec::new(),
            }],
            quick_repair: false,
            small_cache: false,
            live_reads: false,
            enqueues: 0,
            sched_calls: 0,
            sched_floor: BTreeMap::new(),
            step: 0,
            log: Vec::new(),
            out: Outcome::default(),
        }
    }

    /// One open in three with live reads (never with `Durability::None`, which refuses them),
    /// from a hash of the seed and the opens so far rather than the seed's stream.
    fn draw_live_reads(&mut self) {
        let opens = self.out.reopens + self.out.crashes + 1;
        let h = self
            .seed
            .wrapping_add(opens.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        self.live_reads = !self.none_mode && (h >> 33).is_multiple_of(3);
        self.out.live_read_opens += u64::from(self.live_reads);
    }

    fn log(&mut self, line: String) {
        let t = self.clock.now_ms() as i64 - T0_MS as i64;
        self.log.push(format!("#{:<3} t={t:+} {line}", self.step));
    }

    /// The power fails now, for every disk of the simulated machine: the queue file and its
    /// journal, one power line. Every later I/O call fails, so a close that follows stops at
    /// its first write.
    fn power_off(&self) {
        if !self.disk.is_crashed() {
            self.disk.crash_now();
        }
    }

    fn fresh_disk_seed(&mut self) -> u64 {
        self.disks_made += 1;
        self.seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(self.disks_made)
    }

    fn open(&mut self) -> Result<Queue, Error> {
        let mut b = Queue::builder()
            .retry(leaseq::RetryPolicy::immediate())
            .lease(Duration::from_millis(LEASE_MS))
            .max_attempts(MAX_ATTEMPTS)
            .clock(self.clock.clone())
            .quick_repair(self.quick_repair)
            .live_reads(self.live_reads)
            .durability(if self.none_mode {
                Durability::None
            } else {
                Durability::Immediate
            });
        if self.small_cache {
            b = b.cache_bytes(256 << 10);
        }
        b.open_backends(self.disk.backend(), self.journal.backend())
    }

    /// The queue file and its journal from `images`, on a fresh power line.
    fn boot(&mut self, images: (Vec<u8>, Vec<u8>)) {
        let s = self.fresh_disk_seed();
        self.disk = SimDisk::from_image(images.0, s);
        self.journal = self.disk.sibling_from_image(images.1, s ^ 0x4a4f);
    }

    /// Both files as a killed process leaves them (the OS keeps what was written).
    fn live_images(&self) -> (Vec<u8>, Vec<u8>) {
        (self.disk.live_image(), self.journal.live_image())
    }

    /// Both files as a power cut leaves them.
    fn crash_images(&self) -> (Vec<u8>, Vec<u8>) {
        (self.disk.crash_image(), self.journal.crash_image())
    }

    fn q(&self) -> Queue {
        self.queue.clone().expect("queue open")
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn run(&mut self, steps: usize) -> Result<(), String> {
        self.quick_repair = self.src.chance(1, 3);
        self.small_cache = self.src.chance(1, 4);
        self.none_mode = self.src.chance(1, 6);
        self.draw_live_reads();
        let q = self
            .open()
            .map_err(|e| format!("creating the queue on an empty disk failed: {e}"))?;
        self.log(format!(
            "open new queue (quick_repair={}, small_cache={}, durability {}, live_reads={})",
            self.quick_repair,
            self.small_cache,
            if self.none_mode { "None" } else { "Immediate" },
            self.live_reads
        ));
        for w in &mut self.worlds {
            w.hist = vec![w.m.clone()];
        }
        self.queue = Some(q);
        while self.step < steps && !self.src.exhausted() {
            self.step += 1;
            self.one_step()?;
            if !self.disk.is_crashed() && self.step.is_multiple_of(self.settings.full_check_every) {
                self.full_check()?;
            }
            // A planned crash can hit an operation or the reads of a check.
            if self.disk.is_crashed() {
                self.after_crash()?;
            }
        }
        // Finish with a reopen of some kind, checked like every other.
        self.step += 1;
        let kind = if self.crash_armed {
            Reboot::Clean // the close may hit the planned crash
        } else {
            self.pick_reboot()
        };
        self.reboot(kind)
    }

    fn pick_reboot(&mut self) -> Reboot {
        self.src.pick(&[
            Reboot::Clean,
            Reboot::CleanCopy,
            Reboot::Kill,
            Reboot::Kill,
            Reboot::PowerCut,
        ])
    }

    /// The first world: what the workload's choices are made from.
    fn model(&self) -> &Model {
        &self.worlds[0].m
    }

    /// Compares the queue with every world; keeps those that agree.
    ///
    /// The check only reads, but a read can write: with `Durability::None` and a small cache,
    /// redb writes cached pages of commits that are not durable yet back to the file to make
    /// room. A planned crash (`crash_after`) can therefore fire inside the check, which then
    /// sees I/O errors: that is a crash between calls, not a disagreement. The worlds are then
    /// kept as they were, and the caller reboots from the crash image (`after_crash`), which is
    /// compared with the model as after every crash.
    fn full_check(&mut self) -> Result<(), String> {
        let q = self.q();
        let crashed_before = self.disk.is_crashed();
        let checked = check_queue(&q);
        let now = self.now();
        let results: Vec<Result<Model, Vec<String>>> = self
            .worlds
            .iter()
            .map(|w| {
                let mut m = w.m.clone();
                compare(&q, &checked, &mut m, now).map(|()| m)
            })
            .collect();
        if !crashed_before && self.disk.is_crashed() {
            self.log("  ^ the planned crash hit the check's reads (a cache write-back)".into());
            return Ok(());
        }
        let mut first_diff = None;
        let mut kept = Vec::new();
        for (mut w, r) in std::mem::take(&mut self.worlds).into_iter().zip(results) {
            match r {
                Ok(m) => {
                    w.m = m;
                    kept.push(w);
                }
                Err(d) => {
                    first_diff.get_or_insert(d);
                }
            }
        }
        if kept.is_empty() {
            return Err(format!(
                "queue disagrees with the model (no crash): {}",
                first_diff.unwrap_or_default().join("; ")
            ));
        }
        self.worlds = kept;
        self.check_floors()
    }

    fn one_step(&mut self) -> Result<(), String> {
        let mut choice = self.src.below(100);
        if choice < 21 && self.model().jobs.len() >= LIVE_JOBS_SOFT_MAX {
            choice += 21; // consume instead of producing
        }
        if (40..71).contains(&choice) && self.leases.is_empty() {
            choice = 25; // nothing held: dequeue
        }
        if self.none_mode && (78..84).contains(&choice) {
            choice = 98; // flush often: the durable points of Durability::None
        }
        match choice {
            0..13 => self.op_enqueue(1),
            13..16 => match self.src.below(10) {
                0 | 1 => self.op_schedule_remove(),
                2..5 => self.op_rate_limit(),
                5 => self.op_schedule_control(),
                _ => self.op_schedule_set(),
            },
            16..21 => {
                let n = 2 + self.src.below(4) as usize;
                self.op_enqueue(n)
            }
            21..35 => self.op_dequeue(1),
            35..40 => {
                let max = if self.src.chance(1, 20) {
                    0
                } else {
                    1 + self.src.below(4) as usize
                };
                self.op_dequeue(max)
            }
            40..45 => self.op_ack(1),
            45..48 => {
                let n = 1 + self.src.below(3) as usize;
                self.op_ack(n)
            }
            48..56 => self.op_ack_with(1, false),
            56..59 => {
                let n = 1 + self.src.below(3) as usize;
                self.op_ack_with(n, true)
            }
            59..62 => self.op_ack_next(false),
            62..65 => self.op_ack_next(true),
            65..69 => self.op_nack(),
            69..70 => self.op_snooze(),
            70..71 => self.op_drop_lease(),
            71..74 => {
                if self.leases.is_empty() {
                    self.op_dequeue(1)
                } else {
                    self.op_extend()
                }
            }
            74..76 => {
                if self.leases.is_empty() {
                    self.op_dequeue(1)
                } else {
                    self.op_fail()
                }
            }
            76..77 => match self.src.below(4) {
                0 | 1 => self.op_requeue_dead(),
                2 => self.op_reschedule(),
                _ => self.op_update(),
            },
            77..78 => match self.src.below(8) {
                0 => self.op_pause(),
                1 => self.op_cancel(),
                2 => self.op_write_cancel(),
                3 => self.op_set_history(),
                _ => self.op_remove(),
            },
            78..86 => {
                self.op_clock();
                Ok(())
            }
            86 => self.op_queue_limit(),
            87..89 => self.op_write_side(),
            89 => self.op_prune(),
            90 => self.op_compact(),
            91..95 => {
                if !self.crash_armed {
                    let n = self.src.below(48);
                    self.disk.crash_after(n);
                    self.crash_armed = true;
                    self.log(format!(
                        "arm crash at mutating op +{n} (disk at {})",
                        self.disk.mutating_ops()
                    ));
                }
                Ok(())
            }
            95..98 => {
                if self.crash_armed {
                    return self.op_dequeue(1);
                }
                let kind = self.pick_reboot();
                self.reboot(kind)
            }
            98 => self.op_flush(),
            _ => {
                self.log("full check".to_string());
                self.full_check()
            }
        }
    }

    /// `flush`: an empty durable commit; changes nothing the model sees.
    /// `prune`: with the default retentions (7 days for markers, dead jobs kept) and no dedup
    /// windows in these workloads, nothing live is due: it must remove nothing but rows of
    /// ended jobs kept (cancelled, or in a history), and change nothing the model sees.
    /// `Queue::write`: an effect row and a job in the named queue "side" (`enqueue_to`), in one
    /// transaction; one in five fails after both writes, leaving neither.
    fn op_write_side(&mut self) -> Result<(), String> {
        let n = self.side_writes;
        self.side_writes += 1;
        let key = format!("w{n}");
        let payload = format!("side {n}").into_bytes();
        let fails = self.src.chance(1, 5);
        let crashed_before = self.disk.is_crashed();
        let q = self.q();
        let side = match q.named(SIDE) {
            Ok(s) => s,
            Err(e) => {
                self.log(format!("named({SIDE}) -> Err {}", fmt_err(&e)));
                if self.disk.is_crashed() {
                    return Ok(());
                }
                return Err(format!("named({SIDE}) failed without a crash: {e}"));
            }
        };
        let apply = |m: &mut Model| {
            if fails {
                MRes::Err(EKind::Effect)
            } else {
                m.effects.insert(key.clone(), 1);
                m.side.insert(payload.clone());
                MRes::Unit
            }
        };
        let got = q
            .write(|tx| {
                let mut t = tx.open_table(EFFECTS)?;
                t.insert(key.as_str(), 1)?;
                drop(t);
                tx.enqueue_to(&side, &payload, EnqueueOptions::default())?;
                if fails {
                    return Err(model::EFFECT_ERROR.into());
                }
                Ok(())
            })
            .map(|()| Got::Unit);
        let what = format!(
            "write effect {key} + side job {n}{}",
            if fails { " (fails)" } else { "" }
        );
        self.settle(&what, &apply, got, crashed_before)?;
        Ok(())
    }

    /// The job a cancel aims at: a live one (4 in 5), one gone for good (acked or removed:
    /// `Gone`), or an id never handed out (`JobNotFound`; ids are reserved in blocks, so one
    /// far above).
    fn cancel_target(&mut self) -> u64 {
        // Often a job a held lease runs: its worker goes on (extends, ends) while cancelled.
        if !self.leases.is_empty() && self.src.chance(1, 3) {
            let i = self.src.below(self.leases.len() as u64) as usize;
            return self.leases[i].id().0;
        }
        let ids: Vec<u64> = self.model().jobs.keys().copied().collect();
        let gone: Vec<u64> = {
            let m = self.model();
            m.gone.difference(&m.kept_rows).copied().collect()
        };
        if !ids.is_empty() && self.src.chance(4, 5) {
            ids[self.src.below(ids.len() as u64) as usize]
        } else if !gone.is_empty() && self.src.chance(1, 2) {
            gone[self.src.below(gone.len() as u64) as usize]
        } else {
            (1 << 40) + self.src.below(3)
        }
    }

    /// `Queue::write` whose closure writes an effect row and cancels a job with `Tx::cancel`
    /// (an app deleting a report and its sync job in one commit): both or neither. A job as
    /// [`Self::op_cancel`] picks; a refused cancel (an id never handed out) is passed on, so
    /// nothing commits.
    fn op_write_cancel(&mut self) -> Result<(), String> {
        let id = self.cancel_target();
        let n = self.side_writes;
        self.side_writes += 1;
        let key = format!("wc{n}");
        let apply = |m: &mut Model| match m.cancel(id) {
            r @ (MRes::State(_) | MRes::Gone) => {
                m.effects.insert(key.clone(), 1);
                r
            }
            other => other,
        };
        let crashed_before = self.disk.is_crashed();
        let got = self
            .q()
            .write(|tx| {
                let mut t = tx.open_table(EFFECTS)?;
                t.insert(key.as_str(), 1)?;
                drop(t);
                Ok(tx.cancel(JobId(id), "deleted with its report")?)
            })
            .and_then(|o| match o {
                leaseq::CancelOutcome::Cancelled { was } => Ok(Got::State(was)),
                leaseq::CancelOutcome::Gone => Ok(Got::Gone),
                other => Err(Error::Corrupted {
                    detail: format!("cancel answered {other:?}"),
                }),
            });
        self.settle(
            &format!("write effect {key} + Tx::cancel job {id}"),
            &apply,
            got,
            crashed_before,
        )?;
        Ok(())
    }

    fn op_prune(&mut self) -> Result<(), String> {
        match self.q().prune() {
            Ok(p) => {
                self.log(format!("prune -> Ok {p:?}"));
                // Rows of ended jobs kept (cancelled, or in a history) may go; nothing live.
                let live = (p.applied, p.dedup_windows, p.dead);
                let kept = self.model().kept_rows.len() as u64;
                if (live != (0, 0, 0) || p.history > kept) && !self.disk.is_crashed() {
                    return Err(format!("prune removed {p:?}; nothing live was due"));
                }
            }
            Err(e) => {
                self.log(format!("prune -> Err {}", fmt_err(&e)));
                if !self.disk.is_crashed() {
                    return Err(format!("prune failed without a crash: {e}"));
                }
            }
        }
        Ok(())
    }

    /// `compact`: the held leases are dropped first (it needs the queue alone; the jobs stay
    /// leased). It changes no job, whether it completes or power fails inside it.
    fn op_compact(&mut self) -> Result<(), String> {
        let held = self.leases.len();
        self.leases.clear();
        let r = match self.queue.as_mut() {
            Some(q) => q.compact(),
            None => return Ok(()),
        };
        match r {
            Ok(done) => self.log(format!("compact (dropped {held} leases) -> Ok {done}")),
            Err(e) => {
                self.log(format!(
                    "compact (dropped {held} leases) -> Err {}",
                    fmt_err(&e)
                ));
                if !self.disk.is_crashed() {
                    return Err(format!("compact failed without a crash: {e}"));
                }
            }
        }
        Ok(())
    }

    fn op_flush(&mut self) -> Result<(), String> {
        match self.q().flush() {
            Ok(()) => {
                self.log("flush -> Ok".to_string());
                if self.none_mode && !self.disk.is_crashed() {
                    for w in &mut self.worlds {
                        w.hist = vec![w.m.clone()];
                    }
                }
            }
            Err(e) => {
                self.log(format!("flush -> Err {}", fmt_err(&e)));
                if !self.disk.is_crashed() {
                    return Err(format!("flush failed without a crash: {e}"));
                }
            }
        }
        Ok(())
    }

    /// Takes up to `n` held leases out, at random.
    fn take_leases(&mut self, n: usize) -> Vec<Lease> {
        let mut out = Vec::new();
        while out.len() < n && !self.leases.is_empty() {
            let i = self.src.below(self.leases.len() as u64) as usize;
            out.push(self.leases.swap_remove(i));
        }
        out
    }

    fn take_lease(&mut self) -> Lease {
        self.take_leases(1).pop().expect("a lease is held")
    }

    /// Holds leases again after a call on them returned an error (without a crash): a
    /// refused call leaves the attempt with the caller, who can still end it; a lease the
    /// call did end is stale, and every later call on it must be refused.
    fn hold_after_error(&mut self, leases: Vec<Lease>, answered: bool) {
        if !answered && !self.disk.is_crashed() {
            for l in leases {
                self.hold(l);
            }
        }
    }

    fn hold(&mut self, lease: Lease) {
        if self.leases.len() >= HELD_LEASES_MAX {
            let old = self.leases.swap_remove(0);
            self.log(format!("  drop lease of job {} (too many held)", old.id()));
        }
        self.leases.push(lease);
    }

    /// Settles one call: compares the answer with what `apply` predicts in every world, keeps
    /// the worlds that agree (moved by the call) and fails if none does. Returns the answer if
    /// it was `Ok`.
    fn settle(
        &mut self,
        what: &str,
        apply: &dyn Fn(&mut Model) -> MRes,
        got: Result<Got, Error>,
        crashed_before: bool,
    ) -> Result<Option<Got>, String> {
        let crashed_after = self.disk.is_crashed();
        let now_ms = self.now();
        let worlds = std::mem::take(&mut self.worlds);
        let preds: Vec<(Model, MRes)> = worlds
            .iter()
            .map(|w| {
                let mut m1 = w.m.clone();
                m1.now_ms = now_ms;
                let pred = apply(&mut m1);
                // Worlds compare equal on what they hold, not on when they were moved.
                m1.now_ms = 0;
                (m1, pred)
            })
            .collect();
        // A call that dropped jobs to make room changed the queue, whatever it answered (an
        // enqueue of duplicates whose payloads may replace their holders' needs bytes).
        let drops = |w: &World, m1: &Model| m1.dropped != w.m.dropped;
        if matches!(preds[0].1, MRes::Err(EKind::QueueFull { .. })) {
            self.out.queue_full += 1;
        }
        match got {
            Ok(got) => {
                self.log(format!("{what} -> Ok {got:?}"));
                let dropped = worlds.iter().zip(&preds).any(|(w, (m1, _))| drops(w, m1));
                if crashed_before && (got.changes() || dropped) && !self.none_mode {
                    return Err(format!(
                        "{what}: answered Ok {got:?} on a disk that had already lost power: \
                         that promise cannot be durable"
                    ));
                }
                let mut first_err = None;
                let mut duplicates = Vec::new();
                // A call whose sweep fired or skipped schedules (dequeues): the schedules as the
                // queue shows them now name the instances it enqueued, and must be the model's.
                let touched = worlds
                    .iter()
                    .zip(&preds)
                    .any(|(w, (m1, _))| m1.schedules != w.m.schedules);
                let shown = if touched {
                    self.read_schedules(what)?
                } else {
                    None
                };
                let before0 = touched.then(|| worlds[0].m.schedules.clone());
                let dropped0 = worlds[0].m.dropped;
                let gone0 = if dropped {
                    worlds[0].m.gone.clone()
                } else {
                    BTreeSet::new()
                };
                for (w, (mut m1, mut pred)) in worlds.into_iter().zip(preds) {
                    if let Some(shown) = &shown
                        && let Err(e) = name_instances(&w.m, &mut m1, &mut pred, shown)
                    {
                        first_err.get_or_insert(e);
                        continue;
                    }
                    match check_answer(&pred, &got, w.m.max_id, w.m.max_token) {
                        Ok(learned) => {
                            for &(placeholder, id) in &learned.named {
                                m1.name_job(placeholder, id);
                            }
                            if !learned.ids.is_empty() {
                                m1.assign_ids(&learned.ids);
                            }
                            for (id, token) in learned.tokens {
                                m1.set_token(id, token);
                            }
                            let mut hist = w.hist;
                            // A state a non-durable commit may be the last of: every change of
                            // the model, also one the answer does not show (a dequeue that
                            // found nothing but dead-lettered an expired lease on its way).
                            if self.none_mode && (got.changes() || m1 != w.m) {
                                hist.push(m1.clone());
                            }
                            duplicates = learned.duplicates;
                            self.worlds.push(World { m: m1, hist });
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                if self.worlds.is_empty() {
                    return Err(format!("{what}: {}", first_err.unwrap_or_default()));
                }
                if dropped {
                    let m = &self.worlds[0].m;
                    let n = m.dropped - dropped0;
                    self.out.jobs_dropped += n;
                    let ids: Vec<u64> = m.gone.difference(&gone0).copied().collect();
                    self.log(format!(
                        "  dropped {n} jobs to make room (left the queue: {ids:?})"
                    ));
                }
                if let Some(before0) = before0 {
                    let after = &self.worlds[0].m.schedules;
                    let (fired, skipped, line) = sched_decisions(&before0, after);
                    self.out.schedule_fired += fired;
                    self.out.schedule_skipped += skipped;
                    if !line.is_empty() {
                        self.log(format!("  schedules: {line}"));
                    }
                }
                if !crashed_after {
                    // The dedup invariant: a Duplicate names a job the queue can find.
                    let q = self.q();
                    for id in duplicates {
                        match q.job(JobId(id)) {
                            Ok(Some(_)) => {}
                            other => {
                                return Err(format!(
                                    "{what}: answered Duplicate({id}) but job({id}) is {other:?}"
                                ));
                            }
                        }
                    }
                }
                Ok(Some(got))
            }
            Err(e) => {
                self.log(format!("{what} -> Err {}", fmt_err(&e)));
                if !crashed_after {
                    let first_pred = preds[0].1.clone();
                    for (w, (m1, pred)) in worlds.into_iter().zip(preds) {
                        match pred {
                            // A refusal changes nothing: the world stays as it was. But for
                            // the cancelled delivery's worker, answered `Cancelled`: its
                            // ending call ends its group's wait, its extend moves it.
                            MRes::Err(k) if ekind(&e) == Some(k) && m1.fences != w.m.fences => {
                                let mut hist = w.hist;
                                if self.none_mode {
                                    hist.push(m1.clone());
                                }
                                self.worlds.push(World { m: m1, hist });
                            }
                            MRes::Err(k) if ekind(&e) == Some(k) => self.worlds.push(w),
                            // An error that still ended the attempt: the world moved.
                            MRes::EndedErr(k) if ekind(&e) == Some(k) => {
                                let mut hist = w.hist;
                                if self.none_mode {
                                    hist.push(m1.clone());
                                }
                                self.worlds.push(World { m: m1, hist });
                            }
                            _ => {}
                        }
                    }
                    if self.worlds.is_empty() {
                        return Err(format!(
                            "{what}: failed without a crash: {e}; the model expects {first_pred:?}"
                        ));
                    }
                } else {
                    if !crashed_before {
                        // The crash hit this call: it may or may not have committed.
                        // A dequeue that delivered nothing may still have fired schedules,
                        // or moved due jobs to ready (a paused queue's).
                        let committed: Vec<World> = worlds
                            .iter()
                            .zip(&preds)
                            .filter(|(w, (m1, pred))| {
                                pred.changes()
                                    || m1.schedules != w.m.schedules
                                    || m1.jobs != w.m.jobs
                                    || m1.fences != w.m.fences
                                    || drops(w, m1)
                            })
                            .map(|(w, (m1, _))| {
                                let mut hist = w.hist.clone();
                                if self.none_mode {
                                    hist.push(m1.clone());
                                }
                                World {
                                    m: m1.clone(),
                                    hist,
                                }
                            })
                            .collect();
                        if !committed.is_empty() {
                            self.log("  ^ the crash hit this call: outcome uncertain".to_string());
                            self.uncertain = Some((what.to_string(), committed));
                        }
                    }
                    self.worlds = worlds;
                }
                Ok(None)
            }
        }
    }

    fn gen_spec(&mut self) -> EnqSpec {
        self.enqueues += 1;
        let len = match self.src.below(20) {
            0 => self.src.below(20_000) as usize,
            1 => 0,
            _ => 8 + self.src.below(56) as usize,
        };
        let tag = self.enqueues;
        let payload: Vec<u8> = (0..len)
            .map(|i| {
                if i < 8 {
                    tag.to_le_bytes()[i]
                } else {
                    (i as u64 ^ tag.wrapping_mul(31)) as u8
                }
            })
            .collect();
        let mut spec = EnqSpec {
            payload,
            ..EnqSpec::default()
        };
        if self.src.chance(3, 5) {
            spec.idem = Some(format!("k{}", self.src.below(IDEM_KEYS)));
        }
        if self.src.chance(1, 4) {
            spec.dedup = Some(format!("d{}", self.src.below(DEDUP_KEYS)));
            spec.until_started = self.src.chance(1, 3);
            spec.on_duplicate = self.src.pick(&[0, 0, 1, 2]);
        }
        if self.src.chance(1, 3) {
            spec.group = Some(format!("g{}", self.src.below(GROUPS)));
        }
        spec.priority = self.src.pick(&[0, 0, 0, -1, 1, 7, i32::MIN, i32::MAX]);
        if self.src.chance(1, 3) {
            spec.delay_ms = Some(self.src.pick(&[0, 1, 50, 500, 1_000, 5_000]));
        }
        if self.src.chance(2, 5) {
            spec.max_attempts = Some(self.src.pick(&[1, 1, 2, 4]));
        }
        if self.src.chance(1, 3) {
            spec.lease_ms = Some(self.src.pick(&[1, 20, 300, 2_000]));
        }
        // An execution timeout on every fifth job, from its tag: no draw from the source, so
        // a seed's workload is what it was; the record field is written and read back.
        if tag.is_multiple_of(5) {
            spec.timeout_ms = Some([1, 250, model::LEASE_MAX_MS][(tag / 5 % 3) as usize]);
        }
        if self.src.chance(1, 40) {
            // Invalid on purpose: a typed error that writes nothing.
            match self.src.below(8) {
                0 => spec.max_attempts = Some(0),
                1 => spec.idem = Some(String::new()),
                2 => spec.lease_ms = Some(0),
                3 => spec.dedup = Some("x".repeat(model::KEY_BYTES_MAX + 1)),
                4 => spec.delay_ms = Some(model::DELAY_MAX_MS + 1),
                5 => spec.group = Some(String::new()),
                6 => spec.group = Some("g".repeat(model::KEY_BYTES_MAX + 1)),
                _ => spec.lease_ms = Some(model::LEASE_MAX_MS + 1),
            }
        }
        spec
    }

    fn op_enqueue(&mut self, n: usize) -> Result<(), String> {
        let specs: Vec<EnqSpec> = (0..n).map(|_| self.gen_spec()).collect();
        let opts: Vec<EnqueueOptions> = specs
            .iter()
            .map(|spec| {
                let mut o = EnqueueOptions::default().priority(spec.priority);
                if let Some(k) = &spec.idem {
                    o = o.idempotency_key(k);
                }
                if let Some(k) = &spec.dedup {
                    o = o.dedup_key(k);
                    if spec.until_started {
                        o = o.dedup_until_started();
                    }
                    o = o.on_duplicate(match spec.on_duplicate {
                        0 => leaseq::OnDuplicate::Keep,
                        1 => leaseq::OnDuplicate::Replace,
                        _ => leaseq::OnDuplicate::Debounce,
                    });
                }
                if let Some(d) = spec.delay_ms {
                    o = o.delay(Duration::from_millis(d));
                }
                if let Some(m) = spec.max_attempts {
                    o = o.max_attempts(m);
                }
                if let Some(l) = spec.lease_ms {
                    o = o.lease(Duration::from_millis(l));
                }
                if let Some(t) = spec.timeout_ms {
                    o = o.timeout(Duration::from_millis(t));
                }
                if let Some(g) = &spec.group {
                    o = o.group(g);
                }
                o
            })
            .collect();
        let what = format!(
            "{} [{}]",
            if n == 1 { "enqueue" } else { "enqueue_batch" },
            specs
                .iter()
                .map(|s| format!(
                    "{}B idem={:?} dedup={:?}{} prio={} delay={:?} max={:?} lease={:?} timeout={:?} group={:?}",
                    s.payload.len(),
                    s.idem,
                    s.dedup
                        .as_ref()
                        .map(|d| if d.len() > 8 { "<too long>" } else { d }),
                    if s.until_started {
                        " until started"
                    } else {
                        ""
                    },
                    s.priority,
                    s.delay_ms,
                    s.max_attempts,
                    s.lease_ms,
                    s.timeout_ms,
                    s.group
                        .as_ref()
                        .map(|g| if g.len() > 8 { "<too long>" } else { g })
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        let now = self.now();
        let apply = |m: &mut Model| m.enqueue(now, &specs);
        let crashed_before = self.disk.is_crashed();
        let q = self.q();
        let got = if n == 1 {
            let o = opts.into_iter().next().expect("one");
            q.enqueue(&specs[0].payload, o).map(|e| Got::Enq(vec![e]))
        } else {
            q.enqueue_batch(specs.iter().map(|s| s.payload.as_slice()).zip(opts))
                .map(Got::Enq)
        };
        self.settle(&what, &apply, got, crashed_before)?;
        Ok(())
    }

    fn op_dequeue(&mut self, max: usize) -> Result<(), String> {
        let now = self.now();
        let (group_waits, allowed) = self.model().flow_now(now);
        self.out.group_waits += u64::from(group_waits > 0);
        self.out.rate_limited += u64::from(allowed.is_some_and(|a| a < max as u64));
        let apply = |m: &mut Model| m.dequeue(now, max);
        let crashed_before = self.disk.is_crashed();
        let q = self.q();
        let (got, leases) = if max == 1 && self.src.chance(4, 5) {
            match q.dequeue() {
                Ok(l) => {
                    let leases: Vec<Lease> = l.into_iter().collect();
                    (Ok(Got::Deq(leases.iter().map(delivered).collect())), leases)
                }
                Err(e) => (Err(e), Vec::new()),
            }
        } else {
            match q.dequeue_batch(max) {
                Ok(leases) => (Ok(Got::Deq(leases.iter().map(delivered).collect())), leases),
                Err(e) => (Err(e), Vec::new()),
            }
        };
        let what = if max == 1 {
            "dequeue".to_string()
        } else {
            format!("dequeue_batch({max})")
        };
        if self.settle(&what, &apply, got, crashed_before)?.is_some() {
            for l in leases {
                self.hold(l);
            }
        }
        Ok(())
    }

    fn op_drop_lease(&mut self) -> Result<(), String> {
        let lease = self.take_lease();
        self.log(format!(
            "drop lease of job {} (token {})",
            lease.id(),
            lease.token()
        ));
        drop(lease);
        Ok(())
    }

    fn op_ack(&mut self, n: usize) -> Result<(), String> {
        let leases = self.take_leases(n);
        let keys: Vec<(u64, u64)> = leases.iter().map(|l| (l.id().0, l.token())).collect();
        let batch = n > 1;
        let apply = |m: &mut Model| {
            if batch {
                m.ack(&keys)
            } else {
                m.ack_one(keys[0].0, keys[0].1)
            }
        };
        let crashed_before = self.disk.is_crashed();
        let (what, got) = if batch {
            let got = self.q().ack_batch(&leases).map(|v| Got::Acked(outcomes(v)));
            ("ack_batch", got)
        } else if self.src.chance(1, 3) {
            // The result is kept only in a history; either way it is an ack.
            let got = leases[0].ack_with_result(b"done").map(|()| Got::Unit);
            ("ack_with_result", got)
        } else {
            ("ack", leases[0].ack().map(|()| Got::Unit))
        };
        let answered = self
            .settle(&format!("{what} {keys:?}"), &apply, got, crashed_before)?
            .is_some();
        self.hold_after_error(leases, answered);
        Ok(())
    }

    /// The effect key of a job: its idempotency key as the queue holds it, or its id; for a
    /// stale lease of a job already gone any key will do: its closure must not run.
    fn effect_key(&self, id: u64) -> String {
        match self.queue.as_ref().map(|q| q.job(JobId(id))) {
            Some(Ok(Some(info))) => match info.idempotency_key {
                Some(k) => String::from_utf8_lossy(&k).into_owned(),
                None => format!("#{id}"),
            },
            _ => match self.model().jobs.get(&id) {
                Some(j) => j.effect_key(id),
                None => format!("#{id}"),
            },
        }
    }

    fn op_ack_with(&mut self, n: usize, batch: bool) -> Result<(), String> {
        let leases = self.take_leases(n);
        let keys: Vec<(u64, u64)> = leases.iter().map(|l| (l.id().0, l.token())).collect();
        let effect_keys: BTreeMap<u64, String> = keys
            .iter()
            .map(|&(id, _)| (id, self.effect_key(id)))
            .collect();
        let fails_at = self
            .src
            .chance(1, 10)
            .then(|| self.src.below(keys.len() as u64) as usize);
        // The lease (id and token) whose closure fails: a batch may hold a stale and the
        // current lease of one job.
        let fails = fails_at.map(|i| keys[i]);
        let fails_id = fails.map(|(id, _)| id);
        let now = self.now();
        // Half the calls enqueue a follow-up job from each closure (chosen from the first job's
        // id, so the workload's random choices stay as they were).
        let follow = keys[0].0.is_multiple_of(2);
        let apply = |m: &mut Model| {
            if batch {
                m.ack_with(&keys, fails_at, now, follow)
            } else {
                m.ack_with_one(keys[0].0, keys[0].1, fails_at.is_some(), now, follow)
            }
        };
        // The follow-up id each lease's closure saw in its last run.
        let follow_ids = std::cell::RefCell::new(BTreeMap::<(u64, u64), u64>::new());
        let crashed_before = self.disk.is_crashed();
        let effect = |tx: &leaseq::Tx<'_>, l: &Lease| -> Result<(), leaseq::BoxError> {
            let key = effect_keys[&l.id().0].as_str();
            let mut t = tx.open_table(EFFECTS)?;
            let n = t.get(key)?.map_or(0, |v| v.value());
            t.insert(key, n + 1)?;
            drop(t);
            if follow {
                match tx.enqueue(&model::follow_payload(key), EnqueueOptions::default()) {
                    Ok(Enqueued::New(id)) => {
                        follow_ids.borrow_mut().insert((l.id().0, l.token()), id.0);
                    }
                    Ok(e) => return Err(format!("follow-up enqueue answered {e:?}").into()),
                    // The queue's size limit has no room: refused with nothing written (also
                    // under `Block`: a transaction never waits), and the transaction goes on
                    // without the follow-up.
                    Err(Error::QueueFull { .. }) => {
                        follow_ids.borrow_mut().remove(&(l.id().0, l.token()));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if fails == Some((l.id().0, l.token())) {
                return Err(model::EFFECT_ERROR.into());
            }
            Ok(())
        };
        let got = if batch {
            self.q()
                .ack_with_batch(&leases, effect)
                .map(|v| Got::Applied(outcomes(v)))
        } else {
            leases[0]
                .ack_with(|tx| effect(tx, &leases[0]))
                .map(|a| Got::Applied(vec![Ok(a)]))
        };
        let got = got.map(|g| match g {
            Got::Applied(v) if follow => {
                let seen = follow_ids.borrow();
                let ids = keys
                    .iter()
                    .zip(&v)
                    .filter(|(_, r)| matches!(r, Ok(Applied::Now)))
                    .filter_map(|(k, _)| seen.get(k).copied())
                    .collect();
                Got::AppliedF(v, ids)
            }
            other => other,
        });
        let what = format!(
            "{}{} {keys:?} keys {:?}{}",
            if batch { "ack_with_batch" } else { "ack_with" },
            if follow { " (+follow-ups)" } else { "" },
            effect_keys.values().collect::<Vec<_>>(),
            match fails_id {
                Some(id) => format!(" (effect of job {id} fails)"),
                None => String::new(),
            }
        );
        let answered = self.settle(&what, &apply, got, crashed_before)?.is_some();
        self.hold_after_error(leases, answered);
        Ok(())
    }

    fn op_ack_next(&mut self, with_effect: bool) -> Result<(), String> {
        let lease = self.take_lease();
        let (id, token) = (lease.id().0, lease.token());
        let key = self.effect_key(id);
        let effect_fails = with_effect && self.src.chance(1, 10);
        let now = self.now();
        let apply = |m: &mut Model| m.ack_next(id, token, now, with_effect, effect_fails);
        let crashed_before = self.disk.is_crashed();
        let (got, next) = if with_effect {
            let r = lease.ack_with_and_next(|tx| {
                let mut t = tx.open_table(EFFECTS)?;
                let n = t.get(key.as_str())?.map_or(0, |v| v.value());
                t.insert(key.as_str(), n + 1)?;
                if effect_fails {
                    return Err(model::EFFECT_ERROR.into());
                }
                Ok(())
            });
            match r {
                Ok((a, next)) => (Ok(Got::Next(Some(a), next.as_ref().map(delivered))), next),
                Err(e) => (Err(e), None),
            }
        } else {
            match lease.ack_and_next() {
                Ok(next) => (Ok(Got::Next(None, next.as_ref().map(delivered))), next),
                Err(e) => (Err(e), None),
            }
        };
        let what = format!(
            "{} job {id} token {token}{}",
            if with_effect {
                format!("ack_with_and_next key {key}")
            } else {
                "ack_and_next".to_string()
            },
            if effect_fails { " (effect fails)" } else { "" }
        );
        let answered = self.settle(&what, &apply, got, crashed_before)?.is_some();
        if answered && let Some(l) = next {
            self.hold(l);
        }
        self.hold_after_error(vec![lease], answered);
        Ok(())
    }

    fn reason(&mut self) -> String {
        if self.src.chance(1, 30) {
            // Longer than leaseq keeps, with multi-byte characters at the cut.
            format!("{}{}", model::REASON_PREFIX, "é".repeat(3000))
        } else {
            format!("{}{}", model::REASON_PREFIX, self.step)
        }
    }

    fn op_nack(&mut self) -> Result<(), String> {
        let lease = self.take_lease();
        let (id, token) = (lease.id().0, lease.token());
        let backoff_ms = if self.src.chance(1, 30) {
            model::DELAY_MAX_MS + 1
        } else {
            self.src.pick(&[0, 0, 1, 100, 2_000])
        };
        let reason = self.reason();
        let now = self.now();
        let apply = |m: &mut Model| m.nack(id, token, now, backoff_ms, &reason);
        let crashed_before = self.disk.is_crashed();
        let got = if backoff_ms == 0 && self.src.chance(1, 2) {
            lease.nack(&reason)
        } else {
            lease.nack_after(&reason, Duration::from_millis(backoff_ms))
        }
        .map(Got::State);
        let what = format!("nack job {id} token {token} backoff {backoff_ms}ms");
        let answered = self.settle(&what, &apply, got, crashed_before)?.is_some();
        self.hold_after_error(vec![lease], answered);
        Ok(())
    }

    fn op_snooze(&mut self) -> Result<(), String> {
        let lease = self.take_lease();
        let (id, token) = (lease.id().0, lease.token());
        let delay_ms = if self.src.chance(1, 30) {
            model::DELAY_MAX_MS + 1
        } else {
            self.src.pick(&[0, 0, 1, 100, 2_000])
        };
        let now = self.now();
        let apply = |m: &mut Model| m.snooze(id, token, now, delay_ms);
        let crashed_before = self.disk.is_crashed();
        // Half with a reason (the job's status: the model does not look at it).
        let because = self.src.chance(1, 2);
        let got = if because {
            lease.snooze_because(Duration::from_millis(delay_ms), "waiting for network")
        } else {
            lease.snooze(Duration::from_millis(delay_ms))
        }
        .map(|()| Got::Unit);
        let what = format!("snooze job {id} token {token} delay {delay_ms}ms (reason: {because})");
        let answered = self.settle(&what, &apply, got, crashed_before)?.is_some();
        self.hold_after_error(vec![lease], answered);
        Ok(())
    }

    fn op_fail(&mut self) -> Result<(), String> {
        let lease = self.take_lease();
        let (id, token) = (lease.id().0, lease.token());
        let reason = self.reason();
        let apply = |m: &mut Model| m.fail(id, token, &reason);
        let crashed_before = self.disk.is_crashed();
        let got = lease.fail(&reason).map(|()| Got::Unit);
        let what = format!("fail job {id} token {token}");
        let answered = self.settle(&what, &apply, got, crashed_before)?.is_some();
        self.hold_after_error(vec![lease], answered);
        Ok(())
    }

    fn op_extend(&mut self) -> Result<(), String> {
        let i = self.src.below(self.leases.len() as u64) as usize;
        let by_ms = if self.src.chance(1, 30) {
            self.src.pick(&[0, model::LEASE_MAX_MS + 1])
        } else {
            self.src.pick(&[1, 50, 1_000, 5_000])
        };
        let (id, token) = (self.leases[i].id().0, self.leases[i].token());
        let now = self.now();
        let apply = |m: &mut Model| m.extend(id, token, now, by_ms);
        let crashed_before = self.disk.is_crashed();
        let lease = &mut self.leases[i];
        let got = lease
            .extend(Duration::from_millis(by_ms))
            .map(|()| Got::Deadline(lease.deadline_ms()));
        let what = format!("extend job {id} token {token} by {by_ms}ms");
        self.settle(&what, &apply, got, crashed_before)?;
        Ok(())
    }

    fn op_requeue_dead(&mut self) -> Result<(), String> {
        let dead: Vec<u64> = self
            .model()
            .jobs
            .iter()
            .filter(|(_, j)| j.state == MState::Dead)
            .map(|(&id, _)| id)
            .collect();
        let id = if !dead.is_empty() && self.src.chance(3, 4) {
            dead[self.src.below(dead.len() as u64) as usize]
        } else if !self.model().jobs.is_empty() && self.src.chance(1, 2) {
            // A live job that is not dead: InvalidState.
            let ids: Vec<u64> = self.model().jobs.keys().copied().collect();
            ids[self.src.below(ids.len() as u64) as usize]
        } else {
            // Acked, or never handed out: JobNotFound.
            let m = self.model();
            let gone: Vec<u64> = m.gone.difference(&m.kept_rows).copied().collect();
            if gone.is_empty() || self.src.chance(1, 3) {
                self.model().max_id + 1 + self.src.below(3)
            } else {
                gone[self.src.below(gone.len() as u64) as usize]
            }
        };
        let now = self.now();
        let apply = |m: &mut Model| m.requeue_dead(id, now);
        let crashed_before = self.disk.is_crashed();
        let got = self.q().requeue_dead(JobId(id)).map(|()| Got::Unit);
        self.settle(
            &format!("requeue_dead job {id}"),
            &apply,
            got,
            crashed_before,
        )?;
        Ok(())
    }

    /// `pause` or `resume` of the queue (resume more often: a paused queue delivers nothing).
    /// `set_rate_limit`: a small limit, fixed or sliding (so that dequeues meet it), none,
    /// the same again, or an invalid one on purpose.
    fn op_rate_limit(&mut self) -> Result<(), String> {
        let limit = match self.src.below(9) {
            0 | 1 => None,
            2 => self.model().rate_limit.as_ref().map(model::MRate::setting),
            3 if self.src.chance(1, 4) => Some((0, 100, self.src.chance(1, 2))),
            3 if self.src.chance(1, 3) => Some((10_001, 1_000, true)),
            3 => Some((2, self.src.pick(&[0, model::DELAY_MAX_MS + 1]), false)),
            4..6 => Some((
                1 + self.src.below(3),
                self.src.pick(&[50, 500, 2_000]),
                true,
            )),
            _ => Some((
                1 + self.src.below(3),
                self.src.pick(&[50, 500, 2_000]),
                false,
            )),
        };
        let apply = move |m: &mut Model| m.set_rate_limit(limit);
        let crashed_before = self.disk.is_crashed();
        let q = self.q();
        let got = q
            .set_rate_limit(limit.map(|(max, per, sliding)| RateLimit {
                max: max as u32,
                per_ms: per,
                window: if sliding {
                    leaseq::RateWindow::Sliding
                } else {
                    leaseq::RateWindow::Fixed
                },
            }))
            .map(Got::Flag);
        self.settle(
            &format!("set_rate_limit({limit:?})"),
            &apply,
            got,
            crashed_before,
        )?;
        Ok(())
    }

    /// `set_limit`: a size limit (a bound on the jobs, the bytes or both, often near what the
    /// queue holds so that enqueues meet it; `Refuse`, `DropOldest`, or `Block` with a wait
    /// of a few ms), none, the same again, or an invalid one on purpose.
    fn op_queue_limit(&mut self) -> Result<(), String> {
        self.out.limit_calls += 1;
        let (jobs, bytes) = self.model().counted();
        let limit = match self.src.below(20) {
            0..4 => None,
            4 | 5 => self.model().limit,
            6 => {
                let mut l = self.gen_limit(jobs, bytes);
                match self.src.below(4) {
                    0 => (l.max_jobs, l.max_bytes) = (None, None),
                    1 => l.max_jobs = Some(0),
                    2 => l.max_bytes = Some(0),
                    _ => {
                        l.when_full =
                            MFull::Block(self.src.pick(&[0, model::BLOCK_WAIT_MAX_MS + 1]));
                    }
                }
                Some(l)
            }
            _ => Some(self.gen_limit(jobs, bytes)),
        };
        let apply = move |m: &mut Model| m.set_limit(limit);
        let crashed_before = self.disk.is_crashed();
        let got = self
            .q()
            .set_limit(limit.as_ref().map(of_mlimit))
            .map(Got::Flag);
        self.settle(
            &format!("set_limit({limit:?}) (holding {jobs} jobs, {bytes} bytes)"),
            &apply,
            got,
            crashed_before,
        )?;
        Ok(())
    }

    /// A valid size limit for a queue holding `jobs` jobs of `bytes` payload bytes.
    fn gen_limit(&mut self, jobs: u64, bytes: u64) -> MLimit {
        let max_jobs = match self.src.below(3) {
            0 => Some(self.src.pick(&[1, 2, 3, 5, 8, 13, 30])),
            1 => Some((jobs + self.src.below(5)).saturating_sub(2).max(1)),
            _ => None,
        };
        let max_bytes = match self.src.below(3) {
            0 => Some(self.src.pick(&[1, 40, 120, 400, 1_500, 6_000, 40_000])),
            1 => {
                let up = self.src.pick(&[0, 8, 60, 800]);
                let down = self.src.pick(&[0, 8, 60]);
                Some((bytes + up).saturating_sub(down).max(1))
            }
            _ => None,
        };
        let max_jobs = if max_jobs.is_none() && max_bytes.is_none() {
            Some(self.src.pick(&[2, 4, 10]))
        } else {
            max_jobs
        };
        let when_full = match self.src.below(10) {
            0..3 => MFull::Refuse,
            3..8 => MFull::DropOldest,
            _ => MFull::Block(1 + self.src.below(5)),
        };
        MLimit {
            max_jobs,
            max_bytes,
            when_full,
        }
    }

    fn op_pause(&mut self) -> Result<(), String> {
        let pause = self.src.chance(1, 3);
        let apply = move |m: &mut Model| m.set_paused(pause);
        let crashed_before = self.disk.is_crashed();
        let q = self.q();
        let got = if pause { q.pause() } else { q.resume() }.map(Got::Flag);
        let what = if pause { "pause" } else { "resume" };
        self.settle(what, &apply, got, crashed_before)?;
        Ok(())
    }

    /// A live job's id (four in five), else one never handed out.
    fn pick_live_or_unknown(&mut self) -> u64 {
        let ids: Vec<u64> = self.model().jobs.keys().copied().collect();
        if !ids.is_empty() && self.src.chance(4, 5) {
            ids[self.src.below(ids.len() as u64) as usize]
        } else {
            self.model().max_id + 1 + self.src.below(3)
        }
    }

    /// `promote` or `reschedule` of a live job (or an unknown id).
    fn op_reschedule(&mut self) -> Result<(), String> {
        let id = self.pick_live_or_unknown();
        let now = self.now();
        let crashed_before = self.disk.is_crashed();
        if self.src.chance(1, 2) {
            let apply = |m: &mut Model| m.promote(id, now);
            let got = self.q().promote(JobId(id)).map(|()| Got::Unit);
            self.settle(&format!("promote job {id}"), &apply, got, crashed_before)?;
        } else {
            let delay_ms = self.src.pick(&[0, 0, 50, 1_000]);
            let apply = |m: &mut Model| m.reschedule(id, now, delay_ms);
            let got = self
                .q()
                .reschedule(JobId(id), Duration::from_millis(delay_ms))
                .map(|()| Got::Unit);
            let what = format!("reschedule job {id} by {delay_ms}ms");
            self.settle(&what, &apply, got, crashed_before)?;
        }
        Ok(())
    }

    /// `set_priority`, `update_payload` (across the inline limit sometimes) or `retry` of a
    /// live job (or an unknown id).
    fn op_update(&mut self) -> Result<(), String> {
        let id = self.pick_live_or_unknown();
        let now = self.now();
        let crashed_before = self.disk.is_crashed();
        match self.src.below(3) {
            0 => {
                let p = self.src.pick(&[-2, 0, 3, i32::MIN]);
                let apply = |m: &mut Model| m.update(id, Some(p), None);
                let got = self.q().set_priority(JobId(id), p).map(|()| Got::Unit);
                self.settle(
                    &format!("set_priority job {id} {p}"),
                    &apply,
                    got,
                    crashed_before,
                )?;
            }
            1 => {
                self.enqueues += 1;
                let len = self.src.pick(&[0usize, 9, 2_000]);
                let tag = self.enqueues;
                let mut payload: Vec<u8> = (0..len)
                    .map(|i| if i < 8 { tag.to_le_bytes()[i] } else { i as u8 })
                    .collect();
                // A schedule's instance keeps its tag: the file's instances stay countable.
                if let Some(t) = self.model().jobs.get(&id).and_then(|j| j.sched.clone()) {
                    payload.splice(0..0, t);
                }
                let apply = |m: &mut Model| m.update(id, None, Some(&payload));
                let got = self
                    .q()
                    .update_payload(JobId(id), &payload)
                    .map(|()| Got::Unit);
                let what = format!("update_payload job {id} ({len}B)");
                self.settle(&what, &apply, got, crashed_before)?;
            }
            _ => {
                let apply = |m: &mut Model| m.retry(id, now);
                let got = self.q().retry(JobId(id)).map(|()| Got::Unit);
                self.settle(&format!("retry job {id}"), &apply, got, crashed_before)?;
            }
        }
        Ok(())
    }

    /// `set_history`: off, or a few jobs kept, or many.
    fn op_set_history(&mut self) -> Result<(), String> {
        let keep: Option<u64> = self.src.pick(&[None, Some(1), Some(3), Some(50)]);
        let apply = move |m: &mut Model| m.set_history(keep);
        let crashed_before = self.disk.is_crashed();
        let h = keep.map_or(leaseq::History::off(), |n| {
            leaseq::History::off().keep_jobs(n)
        });
        let got = self.q().set_history(h).map(Got::Flag);
        self.settle(
            &format!("set_history {keep:?}"),
            &apply,
            got,
            crashed_before,
        )?;
        Ok(())
    }

    /// `cancel` of a live job (any state), of one gone for good (acked or removed: `Gone`),
    /// or of an id never handed out (`JobNotFound`; ids are reserved in blocks, so one far
    /// above). Not of a cancelled one: whether its row is still kept (fencing) depends on
    /// pruning the model leaves out.
    fn op_cancel(&mut self) -> Result<(), String> {
        let id = self.cancel_target();
        let apply = |m: &mut Model| m.cancel(id);
        let crashed_before = self.disk.is_crashed();
        let got = self.q().cancel(JobId(id), "stop").and_then(|o| match o {
            leaseq::CancelOutcome::Cancelled { was } => Ok(Got::State(was)),
            leaseq::CancelOutcome::Gone => Ok(Got::Gone),
            other => Err(Error::Corrupted {
                detail: format!("cancel answered {other:?}"),
            }),
        });
        self.settle(&format!("cancel job {id}"), &apply, got, crashed_before)?;
        Ok(())
    }

    fn op_remove(&mut self) -> Result<(), String> {
        let ids: Vec<u64> = self.model().jobs.keys().copied().collect();
        let id = if !ids.is_empty() && self.src.chance(4, 5) {
            ids[self.src.below(ids.len() as u64) as usize]
        } else {
            self.model().max_id + 1
        };
        let apply = |m: &mut Model| m.remove(id);
        let crashed_before = self.disk.is_crashed();
        let got = self.q().remove(JobId(id)).map(|()| Got::Unit);
        self.settle(&format!("remove job {id}"), &apply, got, crashed_before)?;
        Ok(())
    }

    /// One interval schedule definition for `name`: intervals from shorter than the clock's
    /// small steps to longer than its big ones, now and then a start of its own (before now,
    /// now, later), instance options, random `Overlap` and `Missed`; one in thirty is refused
    /// on purpose.
    fn gen_sched_def(&mut self, name: &str) -> SchedDef {
        self.sched_calls += 1;
        let pad = self.src.pick(&[0usize, 0, 24, 700]);
        let mut def = SchedDef {
            every_ms: self.src.pick(&[50, 300, 1_000, 1_000, 2_500]),
            start_ms: None,
            payload: model::sched_payload(name, self.sched_calls, pad),
            priority: self.src.pick(&[0, 0, -1, 7]),
            max_attempts: None,
            lease_ms: None,
            overlap_enqueue: self.src.chance(1, 3),
            missed_skip: self.src.chance(1, 3),
            forbidden_option: 0,
        };
        if self.src.chance(1, 5) {
            let at = self.now().saturating_sub(700) + self.src.pick(&[0, 699, 700, 900, 2_200]);
            def.start_ms = Some(at);
        }
        if self.src.chance(1, 3) {
            def.max_attempts = Some(self.src.pick(&[1, 2, 4]));
        }
        if self.src.chance(1, 4) {
            def.lease_ms = Some(self.src.pick(&[20, 300, 2_000]));
        }
        if self.src.chance(1, 30) {
            match self.src.below(4) {
                0 => def.every_ms = 0,
                1 => def.forbidden_option = 1 + self.src.below(4) as u8,
                2 => def.max_attempts = Some(0),
                _ => def.lease_ms = Some(0),
            }
        }
        def
    }

    /// `create_schedule`, `update_schedule` or `upsert_schedule` of one of a few names (now and
    /// then an invalid one).
    fn op_schedule_set(&mut self) -> Result<(), String> {
        let name = if self.src.chance(1, 40) {
            self.src.pick(&["", "bad\nname"]).to_string()
        } else {
            SCHED_NAMES[self.src.below(SCHED_NAMES.len() as u64) as usize].to_string()
        };
        let mode = self.src.pick(&[
            SetMode::Create,
            SetMode::Create,
            SetMode::Upsert,
            SetMode::Upsert,
            SetMode::Upsert,
            SetMode::Update,
        ]);
        let def = self.gen_sched_def(&name);
        let now = self.now();
        let apply = |m: &mut Model| m.set_schedule(now, &name, &def, mode);
        // A new timing counts from now, and the clock can have stepped back: its due times
        // may be earlier than the last instance's (see `Floor`).
        let fired_now = self.model().schedules.get(&name).map_or(0, |s| s.fired);
        let f = self.sched_floor.entry(name.clone()).or_insert(Floor {
            fired: 0,
            last_due: None,
            rearm_after: 0,
        });
        f.last_due = None;
        f.rearm_after = fired_now;
        self.out.schedule_calls += 1;
        let crashed_before = self.disk.is_crashed();
        let schedule = schedule_of(&def);
        let q = self.q();
        let r = match mode {
            SetMode::Create => q.create_schedule(&name, &schedule),
            SetMode::Update => q.update_schedule(&name, &schedule),
            SetMode::Upsert => q.upsert_schedule(&name, &schedule),
        };
        let what = format!(
            "{} {name:?} every {}ms start {:?} prio {} max {:?} lease {:?} {} {} {}B{}",
            match mode {
                SetMode::Create => "create_schedule",
                SetMode::Update => "update_schedule",
                SetMode::Upsert => "upsert_schedule",
            },
            def.every_ms,
            def.start_ms.map(model::rel),
            def.priority,
            def.max_attempts,
            def.lease_ms,
            if def.overlap_enqueue {
                "Enqueue"
            } else {
                "Skip"
            },
            if def.missed_skip {
                "MissedSkip"
            } else {
                "RunOnce"
            },
            def.payload.len(),
            match def.forbidden_option {
                0 => "",
                1 => " (with a delay)",
                2 => " (with an idempotency key)",
                3 => " (with a dedup key)",
                _ => " (with a group)",
            }
        );
        let got = match r {
            Ok(info) => match to_view(&info) {
                Ok(v) => Ok(Got::Sched(v)),
                Err(e) => return Err(format!("{what}: {e}")),
            },
            Err(e) => Err(e),
        };
        self.settle(&what, &apply, got, crashed_before)?;
        Ok(())
    }

    /// `remove_schedule` of one of the names (now and then one never used).
    fn op_schedule_remove(&mut self) -> Result<(), String> {
        let name = if self.src.chance(1, 8) {
            "never".to_string()
        } else {
            SCHED_NAMES[self.src.below(SCHED_NAMES.len() as u64) as usize].to_string()
        };
        // A schedule created again under the name starts its counters over.
        self.sched_floor.remove(&name);
        self.out.schedule_calls += 1;
        let apply = |m: &mut Model| m.remove_schedule(&name);
        let crashed_before = self.disk.is_crashed();
        let got = self.q().remove_schedule(&name).map(Got::Flag);
        self.settle(
            &format!("remove_schedule {name:?}"),
            &apply,
            got,
            crashed_before,
        )?;
        Ok(())
    }

    /// `pause_schedule`, `resume_schedule` or `trigger_schedule` of one of the names (now
    /// and then one never used).
    fn op_schedule_control(&mut self) -> Result<(), String> {
        let name = if self.src.chance(1, 8) {
            "never".to_string()
        } else {
            SCHED_NAMES[self.src.below(SCHED_NAMES.len() as u64) as usize].to_string()
        };
        self.out.schedule_calls += 1;
        let crashed_before = self.disk.is_crashed();
        let call = self.src.below(3);
        let (what, got) = match call {
            0 => (
                format!("pause_schedule {name:?}"),
                self.q().pause_schedule(&name).map(Got::Flag),
            ),
            1 => (
                format!("resume_schedule {name:?}"),
                self.q().resume_schedule(&name).map(Got::Flag),
            ),
            _ => (
                format!("trigger_schedule {name:?}"),
                self.q().trigger_schedule(&name).map(|_| Got::Unit),
            ),
        };
        let apply = |m: &mut Model| {
            let now_ms = m.now_ms;
            match call {
                0 => m.pause_schedule(now_ms, &name),
                1 => m.resume_schedule(now_ms, &name),
                _ => m.trigger_schedule(now_ms, &name),
            }
        };
        self.settle(&what, &apply, got, crashed_before)?;
        Ok(())
    }

    /// The schedules as the queue shows them now, after a call; `None` when the disk lost
    /// power, before the read or during it (a read can write cached pages back, see
    /// `full_check`).
    fn read_schedules(&mut self, what: &str) -> Result<Option<Vec<SchedView>>, String> {
        if self.disk.is_crashed() {
            return Ok(None);
        }
        let r = self.q().schedules();
        if self.disk.is_crashed() {
            self.log("  ^ the planned crash hit the read of the schedules".to_string());
            return Ok(None);
        }
        let infos = r.map_err(|e| format!("{what}: schedules() failed without a crash: {e}"))?;
        infos
            .iter()
            .map(to_view)
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(|e| format!("{what}: {e}"))
    }

    /// With `Durability::Immediate` every answered call is durable: a schedule's `fired`
    /// never goes back, nor its `last_job` due time, across calls, crashes and reopens
    /// (until the name is removed; a new definition may move the due times back).
    fn check_floors(&mut self) -> Result<(), String> {
        if self.none_mode || self.disk.is_crashed() {
            return Ok(());
        }
        let r = self.q().schedules();
        if self.disk.is_crashed() {
            return Ok(()); // a crash between calls: the main loop reboots
        }
        let infos = r.map_err(|e| format!("schedules() failed without a crash: {e}"))?;
        for i in infos {
            let due = i.last_job.map(|(_, at)| at);
            let floor = match self.sched_floor.get(&i.name) {
                None => Floor {
                    fired: i.fired,
                    last_due: due,
                    rearm_after: 0,
                },
                Some(&f) => {
                    if i.fired < f.fired {
                        return Err(format!(
                            "FIRED WENT BACK: schedule {:?} shows fired {}, the file showed {} \
                             before (no remove since)",
                            i.name, i.fired, f.fired
                        ));
                    }
                    if let Some(last) = f.last_due
                        && due.is_none_or(|d| d < last)
                    {
                        return Err(format!(
                            "LAST DUE TIME WENT BACK: schedule {:?} shows last_job due at {:?}, \
                             the file showed {:+} before (no new definition since)",
                            i.name,
                            due.map(model::rel),
                            model::rel(last)
                        ));
                    }
                    let follow = f.last_due.is_some() || i.fired > f.rearm_after;
                    Floor {
                        fired: i.fired,
                        last_due: if follow { due } else { None },
                        rearm_after: f.rearm_after,
                    }
                }
            };
            self.sched_floor.insert(i.name.clone(), floor);
        }
        Ok(())
    }

    fn op_clock(&mut self) {
        if self.src.chance(1, 15) {
            let back = self.src.pick(&[1, 100, 700]);
            self.clock.set_ms(self.clock.now_ms() - back);
            self.log(format!("clock back {back}ms"));
        } else {
            let by = self.src.pick(&[1, 10, 100, 500, 1_000, 1_000, 3_000]);
            self.clock.advance(Duration::from_millis(by));
            self.log(format!("clock +{by}ms"));
        }
    }

    /// The disk lost power during the last step. Make a call or two more (each must fail, or
    /// answer without promising a change), then reboot from the crash image.
    fn after_crash(&mut self) -> Result<(), String> {
        let extra = self.src.below(3);
        for _ in 0..extra {
            // A sweep that answered on the dead disk (`Durability::None`) left instances whose
            // ids no read could name: the reopen names them (by id order), before any call.
            if self.worlds.iter().any(|w| !w.m.pending().is_empty()) {
                break;
            }
            self.step += 1;
            match self.src.below(3) {
                0 => self.op_enqueue(1)?,
                1 => self.op_dequeue(1)?,
                _ => {
                    if self.leases.is_empty() {
                        self.op_enqueue(1)?;
                    } else {
                        self.op_ack_with(1, false)?;
                    }
                }
            }
        }
        self.step += 1;
        self.reboot(Reboot::Crash)
    }

    fn reboot(&mut self, kind: Reboot) -> Result<(), String> {
        self.leases.clear();
        let queue = self.queue.take().expect("queue open");
        let image = match kind {
            Reboot::Clean => {
                drop(queue);
                None
            }
            Reboot::CleanCopy => {
                drop(queue);
                Some(self.live_images())
            }
            Reboot::Kill => {
                let image = self.live_images();
                // The close of a killed process never runs: cut the power first, so that it
                // stops at its first write instead of writing to a disk no one reads again.
                self.power_off();
                drop(queue);
                Some(image)
            }
            Reboot::PowerCut => {
                self.power_off();
                drop(queue);
                Some(self.crash_images())
            }
            Reboot::Crash => {
                drop(queue);
                Some(self.crash_images())
            }
        };
        // A planned crash can also hit the close of a clean reboot.
        let (kind, image) =
            if matches!(kind, Reboot::Clean | Reboot::CleanCopy) && self.disk.is_crashed() {
                self.log("  ^ the planned crash hit the close".to_string());
                (Reboot::Crash, Some(self.crash_images()))
            } else {
                (kind, image)
            };
        if kind == Reboot::Crash {
            self.out.crashes += 1;
        } else {
            self.out.reopens += 1;
        }
        if let Some(images) = image {
            self.boot(images);
            self.crash_armed = false;
        }
        self.quick_repair = self.src.chance(1, 3);
        self.draw_live_reads();
        // Sometimes power fails again during the recovery open.
        let second = self.src.chance(1, 4);
        if second {
            let n = self.src.below(24);
            self.disk.crash_after(n);
            self.crash_armed = true;
        }
        self.log(format!(
            "reboot {kind:?} (quick_repair={}, live_reads={}{})",
            self.quick_repair,
            self.live_reads,
            if second {
                ", crash armed during open"
            } else {
                ""
            }
        ));
        let mut two_opens = false;
        let q = match self.open() {
            Ok(q) => q,
            Err(e) => {
                if !self.disk.is_crashed() {
                    return Err(format!("reopen after {kind:?} failed: {e}"));
                }
                self.log(format!(
                    "  open -> Err {} (crash during recovery)",
                    fmt_err(&e)
                ));
                self.out.crashes += 1;
                self.out.crashes_in_recovery += 1;
                two_opens = true;
                let images = self.crash_images();
                self.boot(images);
                self.crash_armed = false;
                self.open().map_err(|e| {
                    format!("reopen after a crash during the recovery open failed: {e}")
                })?
            }
        };
        if self.crash_armed && !self.disk.is_crashed() && self.src.chance(1, 2) {
            self.disk.crash_after(u64::MAX); // disarm
            self.crash_armed = false;
        }
        let rec = q.recovery();
        self.log(format!(
            "  open -> Ok (returned {}, dead-lettered {}, repaired {})",
            rec.leases_returned, rec.leases_dead_lettered, rec.repaired
        ));
        let now = self.now();
        // What the file may hold, in every world: the world; with the call the crash hit, if
        // any; with Durability::None after anything but a clean close, the state after any
        // prefix of the calls since the last durable point.
        let clean = matches!(kind, Reboot::Clean | Reboot::CleanCopy);
        let uncertain = self.uncertain.take();
        if let Some((what, _)) = &uncertain {
            self.out.uncertain_calls += 1;
            self.log(format!("  uncertain: {what}"));
        }
        let mut sources: Vec<(&'static str, &World)> = Vec::new();
        if let Some((_, ws)) = &uncertain {
            sources.extend(ws.iter().map(|w| ("committed", w)));
        }
        sources.extend(self.worlds.iter().map(|w| ("as is", w)));
        let mut candidates: Vec<(&'static str, Model)> = Vec::new();
        for (label, w) in &sources {
            candidates.push((label, w.m.clone()));
            if self.none_mode && !clean {
                for m in w.hist.iter().rev().skip(1) {
                    candidates.push(("prefix", m.clone()));
                }
            }
        }
        // Compares the reopened queue with every candidate: those that agree, and the first
        // differences of the others.
        let match_candidates = |q: &Queue, rec: leaseq::Recovery, two_opens: bool| {
            let checked = check_queue(q);
            let mut matched: Vec<(&'static str, World)> = Vec::new();
            let mut diffs = Vec::new();
            let mut seen: Vec<Model> = Vec::new();
            for (label, cand) in candidates.iter().cloned() {
                if seen.contains(&cand) {
                    continue;
                }
                seen.push(cand.clone());
                let mut m = cand.clone();
                let (returned, dead) = m.recover(now);
                // The same commit fires the schedules due while the file was closed.
                let recovered = (!m.schedules.is_empty()).then(|| m.clone());
                m.open_schedules(now);
                let mut d = Vec::new();
                if !two_opens && (rec.leases_returned, rec.leases_dead_lettered) != (returned, dead)
                {
                    d.push(format!(
                        "recovery returned {} and dead-lettered {} leases, the model expects \
                         {returned} and {dead}",
                        rec.leases_returned, rec.leases_dead_lettered
                    ));
                }
                let (fired, skipped) = match &recovered {
                    Some(r) => {
                        let (f, s, _) = sched_decisions(&r.schedules, &m.schedules);
                        (f, s)
                    }
                    None => (0, 0),
                };
                if !two_opens && (rec.schedules_fired, rec.schedules_skipped) != (fired, skipped) {
                    d.push(format!(
                        "recovery fired {} and skipped {} schedules, the model expects {fired} \
                         and {skipped}",
                        rec.schedules_fired, rec.schedules_skipped
                    ));
                }
                if d.is_empty()
                    && let Err(more) = compare(q, &checked, &mut m, now)
                {
                    d.extend(more);
                }
                if d.is_empty()
                    && let Some(recovered) = &recovered
                {
                    d.extend(check_open_decisions(recovered, &m, now));
                }
                if d.is_empty() {
                    // The state found is on the new disk, durable; the recovery commit may not be.
                    let mut before = cand;
                    let named: Vec<u64> = m
                        .jobs
                        .keys()
                        .copied()
                        .filter(|id| *id > before.max_id && *id < model::PENDING_BASE)
                        .collect();
                    // Its pending jobs got the first of them (the open's instances came after),
                    // unless an instance of the open dropped one to make room (its id is
                    // then never shown).
                    let k = before.pending().len();
                    let kept = before
                        .pending()
                        .iter()
                        .all(|p| !m.dropped_pending.contains(p));
                    if named.len() >= k && kept {
                        before.assign_ids(&named[..k]);
                    }
                    // What no answer or read named is gone for good, never delivered.
                    m.forget_dropped_pending();
                    matched.push((
                        label,
                        World {
                            hist: vec![before, m.clone()],
                            m,
                        },
                    ));
                } else if diffs.len() < 3 {
                    diffs.push(format!("[{label}] {}", d.join("; ")));
                }
            }
            (matched, diffs)
        };
        let crashed_at_open = self.disk.is_crashed();
        let (mut matched, mut diffs) = match_candidates(&q, rec, two_opens);
        let mut q = q;
        // The comparison only reads, but a read can write back cached pages (see `full_check`):
        // a crash still armed after the open can hit it. That is a crash during the recovery
        // (the recovery commit may be lost): reopen from the crash image and compare again.
        if !crashed_at_open && self.disk.is_crashed() {
            self.log("  ^ the planned crash hit the reads of the comparison".to_string());
            self.out.crashes += 1;
            self.out.crashes_in_recovery += 1;
            drop(q);
            let images = self.crash_images();
            self.boot(images);
            self.crash_armed = false;
            q = self.open().map_err(|e| {
                format!("reopen after a crash during the recovery comparison failed: {e}")
            })?;
            let rec = q.recovery();
            self.log(format!(
                "  open -> Ok (returned {}, dead-lettered {}, repaired {})",
                rec.leases_returned, rec.leases_dead_lettered, rec.repaired
            ));
            (matched, diffs) = match_candidates(&q, rec, true);
        }
        if matched.is_empty() {
            return Err(format!(
                "after reboot {kind:?}, the queue matches no outcome the calls allow: {}",
                diffs.join(" | ")
            ));
        }
        let labels: Vec<&str> = matched.iter().map(|(l, _)| *l).collect();
        if labels.iter().all(|l| *l == "committed") {
            self.out.uncertain_committed += 1;
        }
        if labels.iter().all(|l| *l == "prefix") {
            self.out.non_durable_lost += 1;
        }
        if matched.len() > 1 {
            self.out.ambiguous_reopens += 1;
        }
        self.out.worlds_max = self.out.worlds_max.max(matched.len() as u64);
        if let Some((_, w)) = matched.first()
            && let Some(recovered) = w.hist.first()
        {
            // What the open decided (against the state found, its leases returned: the same
            // schedules).
            let (fired, skipped, line) = sched_decisions(&recovered.schedules, &w.m.schedules);
            self.out.open_fired += fired;
            self.out.open_skipped += skipped;
            if !line.is_empty() {
                self.log(format!("  the open decided: {line}"));
            }
            // Jobs the open's instances dropped to make room.
            let n = w.m.dropped - recovered.dropped;
            if n > 0 {
                self.out.jobs_dropped += n;
                self.log(format!("  the open dropped {n} jobs to make room"));
            }
        }
        self.log(format!("  the file holds: {labels:?}"));
        self.worlds = matched.into_iter().map(|(_, w)| w).collect();
        self.queue = Some(q);
        self.check_floors()
    }
}

/// The due-time decisions between two states of the schedules (for the op log): instances
/// enqueued, due times skipped, and a line naming them.
fn sched_decisions(
    before: &BTreeMap<String, model::MSched>,
    after: &BTreeMap<String, model::MSched>,
) -> (u64, u64, String) {
    let (mut fired, mut skipped, mut parts) = (0, 0, Vec::new());
    for (name, b) in after {
        let Some(a) = before.get(name) else { continue };
        if b.fired > a.fired {
            fired += b.fired - a.fired;
            parts.push(format!(
                "{name} fired job {:?}",
                b.last_job.map(|(id, at)| (id, model::rel(at)))
            ));
        }
        if b.skipped > a.skipped {
            skipped += b.skipped - a.skipped;
            parts.push(format!("{name} skipped {:+}", model::rel(a.next_due_ms)));
        }
    }
    (fired, skipped, parts.join(", "))
}

/// A schedule as the model names it (interval timing only: the workload sets no other).
fn to_view(i: &ScheduleInfo) -> Result<SchedView, String> {
    let Timing::Interval { every_ms, start_ms } = i.timing else {
        return Err(format!(
            "schedule {:?} has timing {:?}; the workload sets intervals only",
            i.name, i.timing
        ));
    };
    Ok(SchedView {
        name: i.name.clone(),
        every_ms,
        start_ms,
        next_due_ms: i.next_due_ms,
        last_job: i.last_job.map(|(id, at)| (id.0, at)),
        fired: i.fired,
        skipped: i.skipped,
        overlap_enqueue: i.overlap == Overlap::Enqueue,
        missed_skip: i.missed == Missed::Skip,
        priority: i.priority,
        payload_bytes: i.payload_bytes,
        created_ms: i.created_ms,
        updated_ms: i.updated_ms,
        paused_ms: i.paused_ms,
    })
}

/// The `Schedule` a definition describes.
fn schedule_of(def: &SchedDef) -> Schedule {
    let mut o = EnqueueOptions::default().priority(def.priority);
    if let Some(m) = def.max_attempts {
        o = o.max_attempts(m);
    }
    if let Some(l) = def.lease_ms {
        o = o.lease(Duration::from_millis(l));
    }
    match def.forbidden_option {
        0 => {}
        1 => o = o.delay(Duration::from_millis(100)),
        2 => o = o.idempotency_key("k0"),
        3 => o = o.dedup_key("d0"),
        _ => o = o.group("g0"),
    }
    let mut s = Schedule::every(Duration::from_millis(def.every_ms))
        .payload(def.payload.clone())
        .options(o)
        .overlap(if def.overlap_enqueue {
            Overlap::Enqueue
        } else {
            Overlap::Skip
        })
        .missed(if def.missed_skip {
            Missed::Skip
        } else {
            Missed::RunOnce
        });
    if let Some(start) = def.start_ms {
        s = s.starting_at_ms(start);
    }
    s
}

/// A schedule's last job as the queue shows it: (id, due time).
type LastJob = Option<(u64, u64)>;

/// The id the queue gave placeholder `p` of `m1`, a schedule's last instance in the model:
/// `None` if `p` is no schedule's last instance; `Some(Ok(id))` when the schedule `shown`
/// names a new job (above `before`'s ids, not in `m1`) due when the model says; else
/// `Some(Err((name, due, shown last job)))`.
fn instance_id(
    before: &Model,
    m1: &Model,
    shown: &[SchedView],
    p: u64,
) -> Option<Result<u64, (String, u64, LastJob)>> {
    let (name, due) = m1.schedules.iter().find_map(|(n, s)| match s.last_job {
        Some((id, at)) if id == p => Some((n.clone(), at)),
        _ => None,
    })?;
    let last = shown
        .iter()
        .find(|v| v.name == name)
        .and_then(|v| v.last_job);
    Some(match last {
        Some((id, at))
            if at == due
                && id > before.max_id
                && id < PENDING_BASE
                && !m1.jobs.contains_key(&id) =>
        {
            Ok(id)
        }
        other => Err((name, due, other)),
    })
}

/// Names the instances a call's sweep enqueued (placeholders `m1` has and `before` had not)
/// with the ids the queue's schedules `shown` after the call give as their `last_job`, in the
/// model and in its prediction; then every schedule must be as the model has it (fired or
/// skipped, next due time, counters).
fn name_instances(
    before: &Model,
    m1: &mut Model,
    pred: &mut MRes,
    shown: &[SchedView],
) -> Result<(), String> {
    let made: Vec<u64> = m1
        .pending()
        .into_iter()
        .filter(|p| !before.jobs.contains_key(p))
        .collect();
    for p in made {
        match instance_id(before, m1, shown, p) {
            None => {}
            Some(Ok(id)) => {
                m1.name_job(p, id);
                match pred {
                    MRes::Deq(v) => {
                        for d in v.iter_mut().filter(|d| d.id == p) {
                            d.id = id;
                        }
                    }
                    MRes::Next(_, Some(d)) if d.id == p => d.id = id,
                    _ => {}
                }
            }
            Some(Err((name, due, other))) => {
                return Err(format!(
                    "SCHEDULE DID NOT FIRE: {name:?} was due at {:+}, the model expects a new \
                     instance; the queue's last_job is {:?} ({} schedules shown: {shown:?})",
                    model::rel(due),
                    other.map(|(id, at)| (id, model::rel(at))),
                    shown.len()
                ));
            }
        }
    }
    // Instances the sweep enqueued and a later instance of the same sweep dropped to make
    // room: their schedules still name them as their last instance.
    let dropped: Vec<u64> = m1
        .dropped_pending
        .difference(&before.dropped_pending)
        .copied()
        .collect();
    for p in dropped {
        match instance_id(before, m1, shown, p) {
            None => {}
            Some(Ok(id)) => m1.name_dropped(p, id),
            Some(Err((name, due, other))) => {
                return Err(format!(
                    "SCHEDULE DID NOT FIRE: {name:?} was due at {:+}, the model expects an \
                     instance (dropped since by another); the queue's last_job is {:?}",
                    model::rel(due),
                    other.map(|(id, at)| (id, model::rel(at)))
                ));
            }
        }
    }
    let want: Vec<SchedView> = m1
        .schedules
        .keys()
        .filter_map(|n| m1.sched_view(n))
        .collect();
    if want != shown {
        return Err(format!(
            "SCHEDULES: after the call the queue shows {shown:?}, the model expects {want:?}"
        ));
    }
    Ok(())
}

/// What the open at `now_ms` decided for each schedule, against the documented promise:
/// `recovered` is the model after the leases came back, `opened` after the open's commit,
/// equal to the file. Every schedule due at the open decided once for all its missed due
/// times: `Missed::Skip` skips; `RunOnce` fires for the schedule's next due time, or skips only
/// while its last instance is pending (no lease outlives an open) or when the instance does
/// not fit the queue's size limit. No due time is left behind.
fn check_open_decisions(recovered: &Model, opened: &Model, now_ms: u64) -> Vec<String> {
    let mut d = Vec::new();
    for (name, a) in &recovered.schedules {
        let Some(b) = opened.schedules.get(name) else {
            d.push(format!("SCHEDULE LOST: {name:?} is gone after the open"));
            continue;
        };
        if b.next_due_ms <= now_ms {
            d.push(format!(
                "DUE TIME LEFT BEHIND: {name:?} is still due at {:+} after the open",
                model::rel(b.next_due_ms)
            ));
        }
        if a.next_due_ms > now_ms {
            continue;
        }
        let decided = (b.fired + b.skipped) as i64 - (a.fired + a.skipped) as i64;
        let pending = a
            .last_job
            .and_then(|(id, _)| recovered.jobs.get(&id))
            .is_some_and(|j| matches!(j.state, MState::Ready | MState::Scheduled));
        // Under Overlap::Skip, a last instance (not live) that ended after every due time
        // that passed: those passed while it ran, so they are skipped, not missed.
        let last_live = a
            .last_job
            .and_then(|(id, _)| recovered.jobs.get(&id))
            .is_some_and(|j| j.state != MState::Dead);
        let ended_late = !a.overlap_enqueue
            && !last_live
            && a.last_ended_ms.is_some_and(|e| {
                e <= now_ms
                    && model::interval_due_after(a.every_ms, a.start_ms, e.saturating_sub(1))
                        > now_ms
            });
        let fired_for = b.last_job.map(|(_, at)| at);
        // A due time at the open's very millisecond did not pass while the file was closed:
        // `Missed` does not decide it.
        let skip = a.missed_skip && a.next_due_ms < now_ms;
        let wrong = if decided != 1 {
            Some(format!("{decided} decisions"))
        } else if skip && b.fired != a.fired {
            Some("fired under Missed::Skip".to_string())
        } else if ended_late && b.fired != a.fired {
            Some("fired for a due time that passed while its last instance ran (Skip)".to_string())
        } else if !skip
            && b.fired == a.fired
            && !pending
            && !ended_late
            && b.skipped_full == a.skipped_full
        {
            Some("DUE TIME LOST: skipped under RunOnce, no instance pending".to_string())
        } else if b.fired > a.fired && fired_for != Some(a.next_due_ms) {
            Some(format!(
                "fired for due time {:?}",
                fired_for.map(model::rel)
            ))
        } else {
            None
        };
        if let Some(w) = wrong {
            d.push(format!(
                "OPEN DECISION: {name:?} was due at {:+} ({}) when the file opened at {:+}: {w}",
                model::rel(a.next_due_ms),
                if a.missed_skip {
                    "MissedSkip"
                } else {
                    "RunOnce"
                },
                model::rel(now_ms)
            ));
        }
    }
    d
}

/// Reads the caller's effect table.
/// The payloads in the named queue "side" (all ready: nothing consumes it); none if the
/// queue was never made (or its creation was lost with a crash).
fn read_side(q: &Queue) -> Result<BTreeSet<Vec<u8>>, String> {
    let side = match q.existing(SIDE) {
        Ok(s) => s,
        Err(Error::QueueNotFound { .. }) => return Ok(BTreeSet::new()),
        Err(e) => return Err(format!("existing({SIDE}): {e}")),
    };
    let stats = side.stats().map_err(|e| format!("side stats: {e}"))?;
    let page = side
        .jobs(JobState::Ready, None, 1000)
        .map_err(|e| format!("side jobs: {e}"))?;
    if stats.total != stats.ready || page.jobs.len() as u64 != stats.total {
        return Err(format!("side queue: {stats:?}, {} listed", page.jobs.len()));
    }
    let mut out = BTreeSet::new();
    for j in page.jobs {
        let p = side
            .payload(j.id)
            .map_err(|e| format!("side payload: {e}"))?
            .ok_or("side job without a payload")?;
        out.insert(p);
    }
    Ok(out)
}

fn read_effects(q: &Queue) -> Result<BTreeMap<String, u64>, String> {
    let rtx = q
        .database()
        .begin_read()
        .map_err(|e| format!("begin_read: {e}"))?;
    let table = match rtx.open_table(EFFECTS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("open effects table: {e}")),
    };
    let mut out = BTreeMap::new();
    for row in table.iter().map_err(|e| format!("effects iter: {e}"))? {
        let (k, v) = row.map_err(|e| format!("effects row: {e}"))?;
        out.insert(k.value().to_string(), v.value());
    }
    Ok(out)
}

/// One job as the queue shows it against the model; the differences, named by the contract
/// they break.
fn compare_job(id: u64, got: &JobInfo, want: &MJob) -> Vec<String> {
    let mut d = Vec::new();
    let mut diff = |what: &str, g: String, w: String| {
        if g != w {
            d.push(format!("job {id}: {what} is {g}, expected {w}"));
        }
    };
    if got.attempts < want.attempts {
        diff(
            "ATTEMPTS LOST: attempts",
            got.attempts.to_string(),
            want.attempts.to_string(),
        );
    } else if got.attempts > want.attempts {
        diff(
            "ATTEMPTS DOUBLE-COUNTED: attempts",
            got.attempts.to_string(),
            want.attempts.to_string(),
        );
    }
    diff(
        "state",
        format!("{:?}", got.state),
        format!("{:?}", want.state.public()),
    );
    diff(
        "max_attempts",
        got.max_attempts.to_string(),
        want.max_attempts.to_string(),
    );
    diff("snoozes", got.snoozes.to_string(), want.snoozes.to_string());
    diff(
        "priority",
        got.priority.to_string(),
        want.priority.to_string(),
    );
    diff(
        "created_ms",
        got.created_ms.to_string(),
        want.created_ms.to_string(),
    );
    diff(
        "payload_bytes",
        got.payload_bytes.to_string(),
        want.payload.len().to_string(),
    );
    diff(
        "idempotency_key",
        format!("{:?}", got.idempotency_key),
        format!("{:?}", want.idem.as_ref().map(|k| k.as_bytes().to_vec())),
    );
    diff(
        "dedup_key",
        format!("{:?}", got.dedup_key),
        format!("{:?}", want.dedup.as_ref().map(|k| k.as_bytes().to_vec())),
    );
    diff(
        "group",
        format!("{:?}", got.group),
        format!("{:?}", want.group.as_ref().map(|k| k.as_bytes().to_vec())),
    );
    diff(
        "timeout_ms",
        format!("{:?}", got.timeout_ms),
        format!("{:?}", want.timeout_ms),
    );
    if matches!(want.state, MState::Ready | MState::Scheduled) {
        diff(
            "run_at_ms",
            got.run_at_ms.to_string(),
            want.run_at_ms.to_string(),
        );
    }
    let (tok, dl) = match want.state {
        MState::Leased { token, deadline_ms } => (Some(token), Some(deadline_ms)),
        _ => (None, None),
    };
    diff(
        "lease_token",
        format!("{:?}", got.lease_token),
        format!("{tok:?}"),
    );
    diff(
        "lease_deadline_ms",
        format!("{:?}", got.lease_deadline_ms),
        format!("{dl:?}"),
    );
    let last_ok = match (&want.last_error, &got.last_error) {
        (LastErr::None, None) => true,
        (LastErr::Reason(w), Some(g)) => w == g,
        (LastErr::Expired | LastErr::Abandoned, Some(g)) => !g.starts_with(model::REASON_PREFIX),
        _ => false,
    };
    if !last_ok {
        let g = got
            .last_error
            .as_ref()
            .map(|s| s.chars().take(40).collect::<String>());
        d.push(format!(
            "job {id}: last_error is {g:?}, expected {:?}",
            match &want.last_error {
                LastErr::Reason(r) => LastErr::Reason(r.chars().take(40).collect()),
                other => other.clone(),
            }
        ));
    }
    d
}

/// What `check()` finds in the queue as it is now, or why it failed: read once for every state
/// the queue is compared with (a reopen compares it with each outcome the calls allow).
pub fn check_queue(q: &Queue) -> Result<Vec<leaseq::Violation>, String> {
    q.check().map_err(|e| format!("check() failed: {e}"))
}

/// Compares the whole queue with the model: `check()` (its findings `checked`, read by
/// [`check_queue`]), every job ever enqueued (by id), the stats, the applied-ids markers of
/// every idempotency key, and the effect table. A pending job (an enqueue the crash hit, id
/// never returned) is looked for above the largest known id and named in the model when found.
/// Returns the differences (at most 12).
pub fn compare(
    q: &Queue,
    checked: &Result<Vec<leaseq::Violation>, String>,
    m: &mut Model,
    now_ms: u64,
) -> Result<(), Vec<String>> {
    let mut d: Vec<String> = Vec::new();
    let fail = |what: String| vec![what];
    match checked {
        Ok(v) if v.is_empty() => {}
        Ok(v) => d.push(format!(
            "CHECK: check() reports {} violations: {}",
            v.len(),
            v.iter()
                .take(5)
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Err(e) => return Err(fail(e.clone())),
    }
    let stats = q
        .stats()
        .map_err(|e| fail(format!("stats() failed: {e}")))?;
    // The largest id the model knew before naming what it found (an instance dropped by a
    // later one has a smaller id than that one).
    let known_max_id = m.max_id;
    let pending = m.pending();
    if !pending.is_empty() {
        // Enqueues the crash hit whose jobs are there: find them above every id handed out
        // (ids are reserved in blocks, so a reopen may skip some), in order.
        if stats.total != m.jobs.len() as u64 {
            return Err(fail(format!(
                "the queue holds {} jobs, not {} (the model with the uncertain enqueue)",
                stats.total,
                m.jobs.len()
            )));
        }
        let mut found = Vec::new();
        let mut id = m.max_id + 1;
        while found.len() < pending.len() && id < m.max_id + 8192 {
            match q.job(JobId(id)) {
                Ok(Some(_)) => found.push(id),
                Ok(None) => {}
                Err(e) => return Err(fail(format!("job({id}) failed: {e}"))),
            }
            id += 1;
        }
        if found.len() < pending.len() {
            return Err(fail(format!(
                "the uncertain enqueue's {} jobs are counted but only {} found by id",
                pending.len(),
                found.len()
            )));
        }
        m.assign_ids(&found);
    }
    // Instances dropped before anything named them (a sweep or an open whose answer no read
    // followed): named by their schedules' last_job, if the file shows them.
    for p in m.dropped_pending.clone() {
        let Some(name) = m
            .schedules
            .iter()
            .find_map(|(n, s)| s.last_job.is_some_and(|(id, _)| id == p).then(|| n.clone()))
        else {
            continue;
        };
        let shown = q
            .schedule(&name)
            .map_err(|e| fail(format!("schedule({name:?}) failed: {e}")))?;
        if let Some((JobId(id), _)) = shown.and_then(|i| i.last_job)
            && id > known_max_id
            && id < PENDING_BASE
            && !m.jobs.contains_key(&id)
        {
            m.name_dropped(p, id);
        }
    }
    m.self_check();
    for (&id, want) in &m.jobs {
        match q.job(JobId(id)) {
            Ok(Some(got)) => d.extend(compare_job(id, &got, want)),
            Ok(None) => d.push(format!(
                "LOST JOB: job {id} ({:?}, attempts {}) whose enqueue returned Ok is gone",
                want.state.public(),
                want.attempts
            )),
            Err(e) => return Err(fail(format!("job({id}) failed: {e}"))),
        }
        if d.len() >= 12 {
            return Err(d);
        }
    }
    if stats.total != m.jobs.len() as u64 {
        // Some job the model does not hold is there: name it.
        for id in 1..=m.max_id + 1 {
            if m.jobs.contains_key(&id) {
                continue;
            }
            match q.job(JobId(id)) {
                Ok(Some(g)) if m.gone.contains(&id) => d.push(format!(
                    "ACKED JOB CAME BACK: job {id}, acked with Ok, is {:?} (attempts {})",
                    g.state, g.attempts
                )),
                Ok(Some(g)) => d.push(format!(
                    "UNKNOWN JOB: job {id} ({:?}) was never enqueued with Ok",
                    g.state
                )),
                Ok(None) => {}
                Err(e) => return Err(fail(format!("job({id}) failed: {e}"))),
            }
        }
    }
    let (total, scheduled, ready, leased, dead) = m.counts();
    let want = (
        total,
        scheduled,
        ready,
        leased,
        dead,
        m.applied.len() as u64,
    );
    let got = (
        stats.total,
        stats.scheduled,
        stats.ready,
        stats.leased,
        stats.dead,
        stats.applied,
    );
    if got != want {
        d.push(format!(
            "stats (total, scheduled, ready, leased, dead, applied) are {got:?}, expected {want:?}"
        ));
    }
    let side = read_side(q).map_err(fail)?;
    if side != m.side {
        d.push(format!(
            "SIDE: the named queue holds {:?}, expected {:?}",
            side.iter()
                .map(|p| String::from_utf8_lossy(p))
                .collect::<Vec<_>>(),
            m.side
                .iter()
                .map(|p| String::from_utf8_lossy(p))
                .collect::<Vec<_>>()
        ));
    }
    let effects = read_effects(q).map_err(fail)?;
    for (k, &n) in &effects {
        if n > 1 {
            d.push(format!(
                "EFFECT APPLIED TWICE: effect {k} applied {n} times"
            ));
        }
    }
    if effects != m.effects {
        d.push(format!(
            "EFFECTS: the effect table is {effects:?}, expected {:?}",
            m.effects
        ));
    }
    for i in 0..IDEM_KEYS {
        let k = format!("k{i}");
        let got = q
            .is_applied(&k)
            .map_err(|e| fail(format!("is_applied failed: {e}")))?;
        let want = m.applied.contains(&k);
        if got != want {
            d.push(format!(
                "MARKER: is_applied({k}) is {got}, expected {want} (effect count {:?})",
                effects.get(&k)
            ));
        }
        if got != effects.contains_key(&k) {
            d.push(format!(
                "MARKER WITHOUT EFFECT (or effect without marker): key {k}, marker {got}, effect {:?}",
                effects.get(&k)
            ));
        }
    }
    let limit = q
        .rate_limit()
        .map_err(|e| fail(format!("rate_limit() failed: {e}")))?
        .map(|l| {
            (
                u64::from(l.max),
                l.per_ms,
                l.window == leaseq::RateWindow::Sliding,
            )
        });
    let want_limit = m.rate_limit.as_ref().map(model::MRate::setting);
    if limit != want_limit {
        d.push(format!(
            "RATE LIMIT: rate_limit() is {limit:?}, expected {want_limit:?}"
        ));
    }
    let until = q
        .reader()
        .rate_limited_until(now_ms)
        .map_err(|e| fail(format!("rate_limited_until() failed: {e}")))?;
    let want_until = m.rate_limit.as_ref().and_then(|r| r.limited_until(now_ms));
    if until != want_until {
        d.push(format!(
            "RATE LIMIT: rate_limited_until({now_ms}) is {until:?}, expected {want_until:?} \
             ({:?})",
            m.rate_limit
        ));
    }
    d.extend(compare_size_limit(q, &stats, m)?);
    d.extend(compare_schedules(q, m)?);
    if d.is_empty() {
        Ok(())
    } else {
        d.truncate(12);
        Err(d)
    }
}

/// The size limit against the model: as `limit()` and `stats()` show it, the payload bytes
/// counted (exactly those of the jobs the limit counts) and the jobs dropped so far.
fn compare_size_limit(
    q: &Queue,
    stats: &leaseq::Stats,
    m: &Model,
) -> Result<Vec<String>, Vec<String>> {
    let mut d = Vec::new();
    let shown = q
        .limit()
        .map_err(|e| vec![format!("limit() failed: {e}")])?
        .as_ref()
        .map(to_mlimit);
    if shown != m.limit || stats.limit.as_ref().map(to_mlimit) != m.limit {
        d.push(format!(
            "SIZE LIMIT: limit() is {shown:?}, stats() shows {:?}, expected {:?}",
            stats.limit, m.limit
        ));
    }
    let want_bytes = m.limit.map(|_| m.counted().1);
    if stats.payload_bytes != want_bytes {
        d.push(format!(
            "PAYLOAD BYTES: stats().payload_bytes is {:?}, expected {want_bytes:?} (the jobs \
             the limit counts)",
            stats.payload_bytes
        ));
    }
    if stats.dropped != m.dropped {
        d.push(format!(
            "DROPPED: stats().dropped is {}, expected {}",
            stats.dropped, m.dropped
        ));
    }
    Ok(d)
}

/// The schedules against the model: each as `schedules()` and `schedule(name)` show it, then
/// what their counters promise about the jobs in the file. A schedule's instances carry one of
/// its payload tags; with those that left the queue (acked, cancelled, removed: the model
/// counts them), the live ones must be exactly the `fired` it shows; and a schedule that never
/// had `Overlap::Enqueue` nor a dead instance requeued has at most one instance that is not
/// dead (a due time fires only once the last one ended, and an ended one does not come back).
fn compare_schedules(q: &Queue, m: &Model) -> Result<Vec<String>, Vec<String>> {
    let fail = |what: String| vec![what];
    let mut d = Vec::new();
    let infos = q
        .schedules()
        .map_err(|e| fail(format!("schedules() failed: {e}")))?;
    let mut shown = BTreeMap::new();
    for i in &infos {
        shown.insert(i.name.clone(), to_view(i).map_err(fail)?);
    }
    let names: BTreeSet<&String> = shown.keys().chain(m.schedules.keys()).collect();
    for name in names {
        let got = shown.get(name);
        let want = m.sched_view(name);
        match (got, &want) {
            (Some(g), Some(w)) if g == w => {}
            (Some(g), Some(w)) => d.push(format!("SCHEDULE {name:?} is {g:?}, expected {w:?}")),
            (Some(g), None) => d.push(format!(
                "UNKNOWN SCHEDULE: {g:?}, never created with Ok (or removed with Ok)"
            )),
            (None, _) => d.push(format!(
                "SCHEDULE LOST: {want:?}, created with Ok, is not listed"
            )),
        }
        let one = q
            .schedule(name)
            .map_err(|e| fail(format!("schedule({name:?}) failed: {e}")))?;
        let one = one.as_ref().map(to_view).transpose().map_err(fail)?;
        if one.as_ref() != got {
            d.push(format!(
                "schedule({name:?}) is {one:?}, schedules() lists {got:?}"
            ));
        }
    }
    if m.schedules.is_empty() || !d.is_empty() {
        return Ok(d);
    }
    // Live jobs in the file by payload tag: (all, not dead).
    let mut live: BTreeMap<Vec<u8>, (u64, u64)> = BTreeMap::new();
    for state in [
        JobState::Ready,
        JobState::Scheduled,
        JobState::Leased,
        JobState::Dead,
    ] {
        let page = q
            .jobs(state, None, 1000)
            .map_err(|e| fail(format!("jobs({state:?}) failed: {e}")))?;
        for j in page.jobs {
            let payload = q
                .payload(j.id)
                .map_err(|e| fail(format!("payload({}) failed: {e}", j.id)))?
                .ok_or_else(|| fail(format!("job {} listed {state:?} has no payload", j.id)))?;
            if let Some(tag) = model::sched_tag(&payload) {
                let e = live.entry(tag.to_vec()).or_default();
                e.0 += 1;
                if state != JobState::Dead {
                    e.1 += 1;
                }
            }
        }
    }
    for (name, s) in &m.schedules {
        let fired = shown.get(name).map_or(0, |v| v.fired);
        let (n, not_dead) = s
            .tags
            .iter()
            .filter_map(|t| live.get(t))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        if n + s.ended != fired {
            d.push(format!(
                "INSTANCES: schedule {name:?} shows fired {fired}, the file holds {n} of its \
                 instances and {} left the queue",
                s.ended
            ));
        }
        if !s.multi_live && not_dead > 1 {
            d.push(format!(
                "SECOND INSTANCE: schedule {name:?} (Overlap::Skip, no instance requeued) has \
                 {not_dead} instances that are not dead"
            ));
        }
    }
    Ok(d)
}
