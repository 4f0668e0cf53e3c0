//! The commands that change a file: `enqueue`, `requeue-dead`, `cancel`, `retry`, `promote`,
//! `purge`, `pause`, `resume`, `schedule-remove`, `prune`, `compact`.

use std::io::{IsTerminal, Read};
use std::path::Path;

use leaseq::control::{Action, Client, Enqueue};
use leaseq::{Builder, JobId, JobState};
use serde::Serialize;
use serde_json::Value;

use crate::args::{
    CancelArgs, ControlArgs, EnqueueArgs, FileArg, JobArgs, LimitArgs, PruneArgs, PurgeArgs,
    RequeueDeadArgs, ScheduleNameArgs, StateArg, WhenFullArg,
};
use crate::fail::{CliResult, Fail, one_line};
use crate::files::{self, Missing};
use crate::output::{Out, state_name};

/// Reads at most [`leaseq::PAYLOAD_BYTES_MAX_CAP`] bytes from `r`; more is refused.
fn read_payload(r: impl Read, what: &str) -> CliResult<Vec<u8>> {
    let cap = leaseq::PAYLOAD_BYTES_MAX_CAP;
    let mut buf = Vec::new();
    r.take(cap as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Fail::io(what, e))?;
    if buf.len() > cap {
        return Err(Fail::error(format!(
            "{what}: payload larger than the limit of {cap} bytes"
        )));
    }
    Ok(buf)
}

fn payload_of(a: &EnqueueArgs) -> CliResult<Vec<u8>> {
    if let Some(data) = &a.data {
        return Ok(data.as_bytes().to_vec());
    }
    if let Some(path) = &a.payload_file {
        let what = path.display().to_string();
        let f = std::fs::File::open(path).map_err(|e| Fail::io(&what, e))?;
        return read_payload(f, &what);
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(Fail::error(
            "no payload: give --data STRING, --file PATH, or pipe it on stdin",
        ));
    }
    read_payload(stdin.lock(), "stdin")
}

/// The job `leaseq enqueue` asks for.
fn enqueue_of(a: &EnqueueArgs, payload: Vec<u8>) -> Enqueue {
    let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_millis() as u64);
    Enqueue {
        queue: a.queue.clone(),
        payload,
        priority: a.priority,
        delay_ms: ms(a.delay),
        dedup_key: a.dedup_key.clone(),
        dedup_window_ms: ms(a.dedup_window),
        on_duplicate: a.on_duplicate.into(),
        idempotency_key: a.idempotency_key.clone(),
        max_attempts: a.max_attempts,
        lease_ms: ms(a.lease),
    }
}

/// Carries `action` out: through the control channel of the app that has `file` open
/// (`leaseq::control`), else on the file opened here with `builder` (made if missing when
/// `missing` says so). A control file no app answers at (left by an app that was killed) is
/// said on stderr and passed by.
fn act(file: &Path, missing: Missing, builder: Builder, action: &Action) -> CliResult<Value> {
    let client = match Client::for_file(file) {
        Ok(client) => client,
        // A control file this user may not read, or not one: the file itself, and that
        // error if the file turns out held.
        Err(e) => {
            return match files::open_with(file, missing, builder) {
                Ok(queue) => action.apply(&queue).map_err(|e| Fail::leaseq(file, e)),
                Err(f) if f.held => Err(Fail::leaseq(file, e)),
                Err(f) => Err(f),
            };
        }
    };
    if let Some(client) = client {
        match client.act(action) {
            Ok(answer) => {
                tracing::info!(
                    pid = client.pid(),
                    "carried out by the app, through its control channel"
                );
                return Ok(answer);
            }
            Err(leaseq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                eprintln!(
                    "leaseq: note: no app answers at the control channel {} names (process {}); \
                     opening the file",
                    leaseq::control::control_file_path(file).display(),
                    client.pid()
                );
            }
            Err(e) => return Err(Fail::leaseq(file, e)),
        }
    }
    let queue = files::open_with(file, missing, builder)?;
    action.apply(&queue).map_err(|e| Fail::leaseq(file, e))
}

/// A command that needs the file to itself (`compact`, `import`) refused beside a running
/// app: said so, with what works, whatever the app opened.
pub fn needs_the_file(f: Fail, command: &str, path: &Path) -> Fail {
    if !f.held {
        return f;
    }
    Fail::error(format!(
        "{}: in use by another process: {command} needs the file to itself, even beside an app \
         with a control channel; stop the app first (or call it from the app: Queue::compact, \
         Queue::import_batch)",
        path.display()
    ))
}

/// The tool's name of the queue an answer names (`null`: the default queue).
fn label(queue: &Value) -> &str {
    queue.as_str().unwrap_or(files::DEFAULT_QUEUE)
}

/// The per-queue answers of an action over queues.
fn per_queue(answer: &Value) -> &[Value] {
    answer["queues"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

#[derive(Serialize)]
struct EnqueuedJson<'a> {
    outcome: &'a str,
    id: u64,
}

/// `leaseq enqueue`: the same call first on an empty queue in memory, so an option the
/// library refuses is refused before the file is opened (or created).
pub fn enqueue(a: &EnqueueArgs) -> CliResult {
    let payload = payload_of(a)?;
    let action = Action::Enqueue(enqueue_of(a, payload));
    files::in_memory()
        .and_then(|q| action.apply(&q))
        .map_err(|e| Fail::error(one_line(&e.to_string())))?;
    let answer = act(&a.file, Missing::Create, files::builder(), &action)?;
    let word = answer["outcome"].as_str().unwrap_or("new");
    let id = answer["id"].as_u64().unwrap_or(0);
    let mut out = Out::new();
    if a.json {
        out.json(&EnqueuedJson { outcome: word, id })?;
    } else {
        match word {
            "duplicate" => out.line(format!("duplicate {id} (job {id} holds the dedup key)"))?,
            "duplicate_dead" => out.line(format!(
                "duplicate {id} (dead job {id} holds the dedup key; requeue-dead or purge it)"
            ))?,
            "replaced" => out.line(format!(
                "replaced {id} (the waiting job {id} holds the dedup key and got this payload)"
            ))?,
            _ => out.line(id.to_string())?,
        }
    }
    out.flush()
}

/// `leaseq requeue-dead`.
pub fn requeue_dead(a: &RequeueDeadArgs) -> CliResult {
    let queue = a.queue.queue.clone();
    let mut out = Out::new();
    if let Some(id) = a.id {
        let action = Action::RequeueDead {
            id: JobId(id),
            queue,
        };
        match act(&a.file, Missing::Refuse, files::builder(), &action) {
            Err(f) if f.code == 1 && f.message.contains("the command needs Dead") => {
                return Err(Fail::problem(
                    f.message.replace(", the command needs Dead", ", not dead"),
                ));
            }
            done => done?,
        };
        out.line(format!("requeued {id}"))?;
        return out.flush();
    }
    let answer = act(
        &a.file,
        Missing::Refuse,
        files::builder(),
        &Action::RequeueDeadAll { queue },
    )?;
    for q in per_queue(&answer) {
        out.line(format!(
            "{}: requeued {} dead jobs",
            label(&q["queue"]),
            q["count"]
        ))?;
    }
    out.flush()
}

/// `leaseq cancel`: the job, found in the selected queues.
pub fn cancel(a: &CancelArgs) -> CliResult {
    let action = Action::Cancel {
        id: JobId(a.id),
        queue: a.queue.queue.clone(),
        reason: a.reason.clone(),
    };
    let answer = act(&a.file, Missing::Refuse, files::builder(), &action)?;
    let was = answer["was"].as_str().unwrap_or("?");
    say(format!("cancelled {} (was {was})", a.id))
}

/// `leaseq retry`: the job, found in the selected queues.
pub fn retry(a: &JobArgs) -> CliResult {
    let action = Action::Retry {
        id: JobId(a.id),
        queue: a.queue.queue.clone(),
    };
    act(&a.file, Missing::Refuse, files::builder(), &action)?;
    say(format!("retried {}", a.id))
}

/// `leaseq promote`: the job, found in the selected queues.
pub fn promote(a: &JobArgs) -> CliResult {
    let action = Action::Promote {
        id: JobId(a.id),
        queue: a.queue.queue.clone(),
    };
    act(&a.file, Missing::Refuse, files::builder(), &action)?;
    say(format!("promoted {}", a.id))
}

/// One line on stdout.
fn say(line: String) -> CliResult {
    let mut out = Out::new();
    out.line(line)?;
    out.flush()
}

/// `leaseq pause`: each selected queue, one commit each.
pub fn pause(a: &ControlArgs) -> CliResult {
    let queue = a.queue.queue.clone();
    control(a, Action::Pause { queue }, "paused", "already paused")
}

/// `leaseq resume`: each selected queue, one commit each.
pub fn resume(a: &ControlArgs) -> CliResult {
    let queue = a.queue.queue.clone();
    control(a, Action::Resume { queue }, "resumed", "not paused")
}

/// Carries out `action` over the selected queues; says `changed` or `unchanged` per queue.
fn control(a: &ControlArgs, action: Action, changed: &str, unchanged: &str) -> CliResult {
    let answer = act(&a.file, Missing::Refuse, files::builder(), &action)?;
    let mut out = Out::new();
    for q in per_queue(&answer) {
        let what = if q["changed"] == true {
            changed
        } else {
            unchanged
        };
        out.line(format!("{}: {what}", label(&q["queue"])))?;
    }
    out.flush()
}

/// What a `leaseq schedule-*` command does.
#[derive(Debug, Clone, Copy)]
pub enum ScheduleOp {
    Remove,
    Pause,
    Resume,
    Trigger,
}

/// `leaseq schedule-remove`, `schedule-pause`, `schedule-resume`, `schedule-trigger`: on
/// the schedule of the queue `--queue` names (never made), else of the default queue; one
/// commit. Exit 1 when that queue has no schedule of that name.
pub fn schedule(a: &ScheduleNameArgs, op: ScheduleOp) -> CliResult {
    let (queue, name) = (a.queue.clone(), a.name.clone());
    let action = match op {
        ScheduleOp::Remove => Action::RemoveSchedule { queue, name },
        ScheduleOp::Pause => Action::PauseSchedule { queue, name },
        ScheduleOp::Resume => Action::ResumeSchedule { queue, name },
        ScheduleOp::Trigger => Action::TriggerSchedule { queue, name },
    };
    let answer = match act(&a.file, Missing::Refuse, files::builder(), &action) {
        Err(f) if f.code == 1 && f.message.contains("no schedule named") => {
            return Err(Fail::problem(format!(
                "{}: no schedule named {:?} in queue {}",
                a.file.display(),
                a.name,
                a.queue.as_deref().unwrap_or(files::DEFAULT_QUEUE)
            )));
        }
        answer => answer?,
    };
    let queue = label(&answer["queue"]);
    let name = &a.name;
    let changed = answer["changed"] == true;
    say(match op {
        ScheduleOp::Remove => format!("{queue}: removed schedule {name:?}"),
        ScheduleOp::Pause if changed => format!("{queue}: paused schedule {name:?}"),
        ScheduleOp::Pause => format!("{queue}: schedule {name:?} was already paused"),
        ScheduleOp::Resume if changed => format!("{queue}: resumed schedule {name:?}"),
        ScheduleOp::Resume => format!("{queue}: schedule {name:?} was not paused"),
        ScheduleOp::Trigger => format!(
            "{queue}: schedule {name:?} enqueued job {}",
            answer["id"].as_u64().unwrap_or(0)
        ),
    })
}

/// `leaseq limit`: sets or removes the size limit of the queue `--queue` names (never
/// made), else of the default queue; one commit. Bad settings are refused (exit 2) before
/// the file is opened.
pub fn limit(a: &LimitArgs) -> CliResult {
    let limit = if a.remove {
        None
    } else {
        if a.max_jobs.is_none() && a.max_bytes.is_none() {
            return Err(Fail::error(
                "limit needs --max-jobs, --max-bytes or both (or --remove to remove the limit)",
            ));
        }
        let when_full = match (a.when_full, a.wait) {
            (WhenFullArg::Block, Some(wait)) => leaseq::WhenFull::block(wait),
            (WhenFullArg::Block, None) => {
                return Err(Fail::error(
                    "--when-full block needs --wait (e.g. --wait 5s)",
                ));
            }
            (_, Some(_)) => return Err(Fail::error("--wait goes with --when-full block only")),
            (WhenFullArg::Refuse, None) => leaseq::WhenFull::Refuse,
            (WhenFullArg::DropOldest, None) => leaseq::WhenFull::DropOldest,
        };
        Some(leaseq::QueueLimit {
            max_jobs: a.max_jobs,
            max_bytes: a.max_bytes,
            when_full,
        })
    };
    let action = Action::SetLimit {
        queue: a.queue.clone(),
        limit,
    };
    let answer = act(&a.file, Missing::Refuse, files::builder(), &action)?;
    let queue = label(&answer["queue"]);
    let changed = answer["changed"] == true;
    say(match (limit, changed) {
        (Some(_), true) => format!(
            "{queue}: limit set: {}",
            crate::read::limit_cell(&answer["limit"])
        ),
        (Some(_), false) => format!(
            "{queue}: the limit was already {}",
            crate::read::limit_cell(&answer["limit"])
        ),
        (None, true) => format!("{queue}: limit removed"),
        (None, false) => format!("{queue}: had no limit"),
    })
}

/// `leaseq purge`. Leased jobs are refused before the file is opened.
pub fn purge(a: &PurgeArgs) -> CliResult {
    if a.state == StateArg::Leased {
        return Err(Fail::error(
            "purge refuses leased jobs: a leased job is ended through its lease (ack, nack, fail)",
        ));
    }
    let state: JobState = a.state.into();
    let action = Action::Purge {
        queue: a.queue.queue.clone(),
        state,
    };
    let answer = act(&a.file, Missing::Refuse, files::builder(), &action)?;
    let mut out = Out::new();
    for q in per_queue(&answer) {
        out.line(format!(
            "{}: purged {} {} jobs",
            label(&q["queue"]),
            q["count"],
            state_name(state)
        ))?;
    }
    out.flush()
}

/// `leaseq prune`: every queue of the file. Through a running app's control channel the app
/// prunes with its own retentions, so the options are refused there.
pub fn prune(a: &PruneArgs) -> CliResult {
    let given = a.applied_retention.is_some() || a.dead_retention.is_some();
    let app_runs = || {
        Client::for_file(&a.file)
            .ok()
            .flatten()
            .is_some_and(|c| c.get("").is_ok())
    };
    if given && app_runs() {
        return Err(Fail::error(format!(
            "{}: an app has it open: it prunes with its own retentions \
             (Builder::applied_retention, Builder::dead_retention), which the tool cannot \
             change; run `leaseq prune FILE` without --applied-retention and \
             --dead-retention to have the app prune now, or stop the app first",
            a.file.display()
        )));
    }
    let builder = files::builder()
        .applied_retention(a.applied_retention)
        .dead_retention(a.dead_retention);
    let answer = act(&a.file, Missing::Refuse, builder, &Action::Prune)?;
    let mut out = Out::new();
    for q in per_queue(&answer) {
        out.line(format!(
            "{}: removed {} applied markers, {} dead jobs, released {} dedup windows",
            label(&q["queue"]),
            q["applied"],
            q["dead"],
            q["dedup_windows"]
        ))?;
    }
    out.flush()
}

fn file_bytes(path: &Path) -> CliResult<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| Fail::io(&path.display().to_string(), e))
}

/// `leaseq compact`.
pub fn compact(a: &FileArg) -> CliResult {
    let mut queue =
        files::open(&a.file, Missing::Refuse).map_err(|f| needs_the_file(f, "compact", &a.file))?;
    let before = file_bytes(&a.file)?;
    let bar = files::bar(None, "compacting");
    let compacted = queue.compact();
    bar.finish_and_clear();
    compacted.map_err(|e| Fail::leaseq(&a.file, e))?;
    drop(queue);
    let after = file_bytes(&a.file)?;
    let mut out = Out::new();
    out.line(format!(
        "{}: {} -> {} bytes",
        a.file.display(),
        before,
        after
    ))?;
    out.flush()
}
