//! The command line: one clap struct per subcommand.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::parse_duration;

const AFTER_HELP: &str = "\
Queues: without --queue, commands that read or change existing jobs (stats, ls, show,
requeue-dead, purge, pause, resume, export), schedules and watch cover every queue of the file;
enqueue and the schedule-* commands work on the default queue and import on the queue each line
names. `--queue '(default)'` selects the default (unnamed) queue alone, as the tables show it.

Durations: a whole number and a unit: 1500ms, 30s, 5m, 2h, 1d (at most 365d).

Exit codes:
  0  success
  1  the command ran but found a problem: check found violations or damage; show or
     requeue-dead of a job that does not exist or is not dead; a schedule-* command on a
     schedule that does not exist; a --queue that does not exist
  2  usage or runtime error: bad arguments, no such file, a file in use by another process,
     not a leaseq file, I/O errors

Errors are one line on stderr starting with `leaseq: `. Read commands (stats, ls, show,
check, queues, schedules, export, watch, and dashboard's pages) open the file read-only: they never create or write
it, never return a lease, and work beside a running app that opened the file with
Builder::live_reads(true). Write commands open it as the library does: that returns the
leases of a process that died, upgrades a file of an older format (said on stderr), and
enqueues the jobs of schedules due while the file was closed.

Beside a running app that opened its control channel (leaseq::control::serve), the write
commands but compact and import go through the app, and stats, ls, show, queues, schedules,
check and watch read through it (docs/cli.md, \"Beside a running app\").";

/// What every subcommand's help ends with.
const EXIT_CODES: &str = "\
Exit codes: 0 success; 1 the command ran but found a problem; 2 usage or runtime error
(see leaseq --help).";

/// Inspect and manage leaseq job queue files.
#[derive(Debug, Parser)]
#[command(name = "leaseq", version, after_help = AFTER_HELP, propagate_version = true)]
pub struct Cli {
    /// Log what leaseq does to stderr (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Counts of jobs per state, applied markers, dedup keys and quarantined rows, per queue.
    #[command(after_help = EXIT_CODES)]
    Stats(StatsArgs),
    /// List jobs (without payloads), in each state's order.
    #[command(after_help = EXIT_CODES)]
    Ls(LsArgs),
    /// Show one job: every field and its payload.
    #[command(after_help = EXIT_CODES)]
    Show(ShowArgs),
    /// Add a job; prints its id (or the id of the job holding the dedup key).
    #[command(after_help = EXIT_CODES)]
    Enqueue(EnqueueArgs),
    /// Move dead jobs back to ready, attempts reset.
    #[command(after_help = EXIT_CODES)]
    RequeueDead(RequeueDeadArgs),
    /// Cancel a job in any live state, with a reason; a leased job's delivery is fenced.
    #[command(after_help = EXIT_CODES)]
    Cancel(CancelArgs),
    /// Run a dead, completed or cancelled job again, attempts reset; a scheduled one now.
    #[command(after_help = EXIT_CODES)]
    Retry(JobArgs),
    /// Run a scheduled job now.
    #[command(after_help = EXIT_CODES)]
    Promote(JobArgs),
    /// Delete every job in a state (never leased ones).
    #[command(after_help = EXIT_CODES)]
    Purge(PurgeArgs),
    /// Pause queues: they deliver nothing until resumed (stored in the file). Without
    /// --queue, every queue of the file.
    #[command(after_help = EXIT_CODES)]
    Pause(ControlArgs),
    /// Resume paused queues. Without --queue, every queue of the file.
    #[command(after_help = EXIT_CODES)]
    Resume(ControlArgs),
    /// Remove applied markers and dead jobs past their retention, ended dedup windows, and
    /// completed or cancelled jobs past their queue's history, in every queue.
    #[command(after_help = EXIT_CODES)]
    Prune(PruneArgs),
    /// Give the file's free pages back to the file system.
    #[command(after_help = EXIT_CODES)]
    Compact(FileArg),
    /// Check every invariant of the file; exit 1 listing the violations found.
    #[command(after_help = EXIT_CODES)]
    Check(CheckArgs),
    /// List the named queues of the file.
    #[command(after_help = EXIT_CODES)]
    Queues(QueuesArgs),
    /// List the schedules (periodic jobs) with their next due time, per queue.
    #[command(after_help = EXIT_CODES)]
    Schedules(SchedulesArgs),
    /// Remove a schedule; the jobs it already enqueued stay.
    #[command(after_help = EXIT_CODES)]
    ScheduleRemove(ScheduleNameArgs),
    /// Pause a schedule: it fires nothing until resumed (kept across restarts).
    #[command(after_help = EXIT_CODES)]
    SchedulePause(ScheduleNameArgs),
    /// Resume a paused schedule: due at its next time from now (missed times not made up).
    #[command(after_help = EXIT_CODES)]
    ScheduleResume(ScheduleNameArgs),
    /// Enqueue one instance of a schedule now, whatever its next due time.
    #[command(after_help = EXIT_CODES)]
    ScheduleTrigger(ScheduleNameArgs),
    /// Set a queue's size limit (at most N jobs, B payload bytes; when full refuse, block
    /// or drop the oldest), or remove it with --remove. Stored in the file.
    #[command(after_help = EXIT_CODES)]
    Limit(LimitArgs),
    /// Write jobs as JSON lines (one job per line) to stdout.
    #[command(after_help = EXIT_CODES)]
    Export(ExportArgs),
    /// Read jobs as JSON lines from stdin; all or nothing for the whole input.
    #[command(after_help = EXIT_CODES)]
    Import(ImportArgs),
    /// A live view, refreshed every interval: counts per state, enqueue, completion and retry
    /// rates, the oldest ready job's age, the latest dead letters. In place on a terminal;
    /// one line per queue and refresh (and per new dead letter) when piped.
    #[command(after_help = EXIT_CODES)]
    Watch(WatchArgs),
    /// Serve the web dashboard of the file until interrupted: counts, rates, jobs, payloads,
    /// dead letters, schedules, with retry, retry all dead, remove, cancel, promote, pause and
    /// resume. Prints its URL
    /// once, with the access token. Pages read the file read-only (beside an app opened with
    /// live reads); an action goes through the app's control channel when it opened one,
    /// else opens the file for writing, refused while an app has it open.
    #[command(after_help = EXIT_CODES)]
    Dashboard(DashboardArgs),
}

/// The queue file alone.
#[derive(Debug, Args)]
pub struct FileArg {
    /// The queue file.
    pub file: PathBuf,
}

/// `--queue NAME`.
#[derive(Debug, Args, Clone, Default)]
pub struct QueueArg {
    /// Only this queue; `(default)` is the default (unnamed) queue.
    #[arg(long, short = 'q', value_name = "NAME")]
    pub queue: Option<String>,
}

/// `leaseq stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The queue file.
    pub file: PathBuf,
    #[command(flatten)]
    pub queue: QueueArg,
    /// One JSON object per queue and line.
    #[arg(long)]
    pub json: bool,
}

/// A job state as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Available to the next dequeue.
    Ready,
    /// Waiting for a delay or a backoff.
    Scheduled,
    /// Under a lease.
    Leased,
    /// Dead-lettered.
    Dead,
    /// Acked and kept in the queue's history.
    Completed,
    /// Cancelled.
    Cancelled,
}

impl From<StateArg> for leaseq::JobState {
    fn from(s: StateArg) -> leaseq::JobState {
        match s {
            StateArg::Ready => leaseq::JobState::Ready,
            StateArg::Scheduled => leaseq::JobState::Scheduled,
            StateArg::Leased => leaseq::JobState::Leased,
            StateArg::Dead => leaseq::JobState::Dead,
            StateArg::Completed => leaseq::JobState::Completed,
            StateArg::Cancelled => leaseq::JobState::Cancelled,
        }
    }
}

/// `--on-duplicate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnDuplicateArg {
    /// Nothing is added or changed.
    Keep,
    /// The waiting job's payload becomes this one.
    Replace,
    /// Its payload and due time become this enqueue's.
    Debounce,
}

impl From<OnDuplicateArg> for leaseq::OnDuplicate {
    fn from(a: OnDuplicateArg) -> leaseq::OnDuplicate {
        match a {
            OnDuplicateArg::Keep => leaseq::OnDuplicate::Keep,
            OnDuplicateArg::Replace => leaseq::OnDuplicate::Replace,
            OnDuplicateArg::Debounce => leaseq::OnDuplicate::Debounce,
        }
    }
}

/// `leaseq ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// The queue file.
    pub file: PathBuf,
    /// Only jobs in this state (default: every state, ready first).
    #[arg(long, short = 's', value_enum)]
    pub state: Option<StateArg>,
    #[command(flatten)]
    pub queue: QueueArg,
    /// At most this many jobs (default: all).
    #[arg(long, short = 'n', value_name = "N")]
    pub limit: Option<u64>,
    /// One JSON object per job and line.
    #[arg(long)]
    pub json: bool,
}

/// `leaseq show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The queue file.
    pub file: PathBuf,
    /// The job's id.
    pub id: u64,
    #[command(flatten)]
    pub queue: QueueArg,
    /// The job as one JSON object.
    #[arg(long, conflicts_with = "raw")]
    pub json: bool,
    /// Write the payload's bytes to stdout, nothing else.
    #[arg(long)]
    pub raw: bool,
}

/// `leaseq enqueue`.
#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The queue file (created if missing).
    pub file: PathBuf,
    /// The named queue to add to (created if missing; default: the default queue).
    #[arg(long, short = 'q', value_name = "NAME")]
    pub queue: Option<String>,
    /// Make the job due after this long (e.g. 30s, 5m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub delay: Option<Duration>,
    /// Priority: lower is served first (default 0).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Producer dedup key: while a job holds it, another enqueue adds nothing.
    #[arg(long, value_name = "KEY")]
    pub dedup_key: Option<String>,
    /// Hold the dedup key for this long after the enqueue instead of while the job lives.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true, requires = "dedup_key")]
    pub dedup_window: Option<Duration>,
    /// When the dedup key is held by a waiting job: keep it (default), replace its payload,
    /// or debounce (replace its payload and due time).
    #[arg(long, value_enum, requires = "dedup_key", default_value = "keep")]
    pub on_duplicate: OnDuplicateArg,
    /// The key ack_with records the job's effect under.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Deliveries allowed before the job is dead-lettered (default 5).
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,
    /// The job's own lease (visibility timeout), at most 12h.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub lease: Option<Duration>,
    /// The payload, as given (UTF-8). Without --data or --file the payload is read from
    /// stdin.
    #[arg(
        long,
        short = 'd',
        value_name = "STRING",
        conflicts_with = "file_payload"
    )]
    pub data: Option<String>,
    /// Read the payload from this file (bytes as they are).
    #[arg(long = "file", short = 'f', value_name = "PATH", id = "file_payload")]
    pub payload_file: Option<PathBuf>,
    /// Print {"outcome":..,"id":..} instead of the id.
    #[arg(long)]
    pub json: bool,
}

/// `leaseq requeue-dead`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["id", "all"]))]
pub struct RequeueDeadArgs {
    /// The queue file.
    pub file: PathBuf,
    /// The dead job to requeue.
    pub id: Option<u64>,
    /// Every dead job.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// A command on one job: `leaseq retry`, `leaseq promote`.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// The queue file.
    pub file: PathBuf,
    /// The job's id.
    pub id: u64,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// `leaseq cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The queue file.
    pub file: PathBuf,
    /// The job's id.
    pub id: u64,
    /// Why (kept with the job, shown by `show`).
    #[arg(long, default_value = "cancelled with the leaseq tool")]
    pub reason: String,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// `leaseq pause` and `leaseq resume`.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The queue file.
    pub file: PathBuf,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// `leaseq purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// The queue file.
    pub file: PathBuf,
    /// Delete every job in this state (ready, scheduled or dead; leased is refused).
    #[arg(long, short = 's', value_enum)]
    pub state: StateArg,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// `leaseq prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The queue file.
    pub file: PathBuf,
    /// Remove applied markers older than this. Without it markers are kept: the tool cannot
    /// know your application's `applied_retention`, and a marker removed lets a duplicate
    /// under its idempotency key apply again. Give the same value the application uses.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub applied_retention: Option<Duration>,
    /// Also delete dead jobs that died longer ago than this (default: keep them).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub dead_retention: Option<Duration>,
}

/// `leaseq check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The queue file.
    pub file: PathBuf,
    /// One JSON object: {"ok":..,"violations":[..]}.
    #[arg(long)]
    pub json: bool,
}

/// `leaseq queues`.
#[derive(Debug, Args)]
pub struct QueuesArgs {
    /// The queue file.
    pub file: PathBuf,
    /// One JSON object: {"queues":[..]}.
    #[arg(long)]
    pub json: bool,
}

/// `leaseq schedules`.
#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// The queue file.
    pub file: PathBuf,
    #[command(flatten)]
    pub queue: QueueArg,
    /// One JSON object per schedule and line.
    #[arg(long)]
    pub json: bool,
}

/// `leaseq watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The queue file.
    pub file: PathBuf,
    #[command(flatten)]
    pub queue: QueueArg,
    /// Time between refreshes (at least 100ms).
    #[arg(long, short = 'i', default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long, short = 'n', value_name = "N")]
    pub count: Option<u64>,
    /// One JSON object per queue and refresh (and `{"dead_letter":..}` per new dead letter).
    #[arg(long)]
    pub json: bool,
}

/// `leaseq dashboard`.
#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// The queue file.
    pub file: PathBuf,
    /// Where to listen: a loopback address unless --allow-remote (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// No actions: pages only, no buttons, every action refused (403).
    #[arg(long)]
    pub read_only: bool,
    /// Allow an address that is not loopback (the token travels in clear text: put a proxy
    /// with TLS in front).
    #[arg(long)]
    pub allow_remote: bool,
    /// Mark a leased job stalled once it has run this long (its heartbeats may keep its
    /// lease alive while it hangs); a job whose lease lapsed is marked stalled anyway.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub stalled_after: Option<Duration>,
}

/// `leaseq schedule-remove`, `schedule-pause`, `schedule-resume`, `schedule-trigger`.
#[derive(Debug, Args)]
pub struct ScheduleNameArgs {
    /// The queue file.
    pub file: PathBuf,
    /// The schedule's name.
    pub name: String,
    /// The queue the schedule belongs to (default: the default queue).
    #[arg(long, short = 'q', value_name = "NAME")]
    pub queue: Option<String>,
}

/// `leaseq limit`.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// The queue file.
    pub file: PathBuf,
    /// The queue (default: the default queue).
    #[arg(long, short = 'q', value_name = "NAME")]
    pub queue: Option<String>,
    /// At most this many jobs (scheduled, ready and leased).
    #[arg(long, value_name = "N")]
    pub max_jobs: Option<u64>,
    /// At most this many bytes of payload.
    #[arg(long, value_name = "BYTES")]
    pub max_bytes: Option<u64>,
    /// What an enqueue into a full queue does.
    #[arg(long, value_enum, default_value = "refuse")]
    pub when_full: WhenFullArg,
    /// With --when-full block: the longest wait for room (e.g. 5s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Remove the queue's limit.
    #[arg(long, conflicts_with_all = ["max_jobs", "max_bytes", "wait"])]
    pub remove: bool,
}

/// `--when-full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WhenFullArg {
    /// Refuse the enqueue (nothing written).
    Refuse,
    /// Wait up to --wait for room, then refuse.
    Block,
    /// Drop the oldest waiting jobs to make room.
    DropOldest,
}

/// `leaseq export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The queue file.
    pub file: PathBuf,
    #[command(flatten)]
    pub queue: QueueArg,
}

/// `leaseq import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The queue file (created if missing).
    pub file: PathBuf,
    /// Put every job into this queue (created if missing), whatever its line names.
    #[arg(long, short = 'q', value_name = "NAME")]
    pub queue: Option<String>,
}
