//! The commands that change a file: `enqueue`, `requeue-dead`, `cancel`, `retry`, `promote`,
//! `purge`, `pause`, `resume`, `schedule-remove`, `prune`, `compact`.

use std::io::{IsTerminal, Read};
use std::path::Path;

use leaseq::{EnqueueOptions, Enqueued, JobId, JobState, Queue};
use serde::Serialize;

use crate::args::{
    CancelArgs, ControlArgs, EnqueueArgs, FileArg, JobArgs, PruneArgs, PurgeArgs, RequeueDeadArgs,
    ScheduleRemoveArgs, StateArg,
};
use crate::fail::{CliResult, Fail, one_line};
use crate::files::{self, Missing, path_of, queue_label};
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

fn options_of(a: &EnqueueArgs) -> EnqueueOptions {
    let mut o = EnqueueOptions::default();
    if let Some(p) = a.priority {
        o = o.priority(p);
    }
    if let Some(d) = a.delay {
        o = o.delay(d);
    }
    if let Some(k) = &a.dedup_key {
        o = o.dedup_key(k);
    }
    if a.on_duplicate != crate::args::OnDuplicateArg::Keep {
        o = o.on_duplicate(a.on_duplicate.into());
    }
    if let Some(w) = a.dedup_window {
        o = o.dedup_window(w);
    }
    if let Some(k) = &a.idempotency_key {
        o = o.idempotency_key(k);
    }
    if let Some(n) = a.max_attempts {
        o = o.max_attempts(n);
    }
    if let Some(l) = a.lease {
        o = o.lease(l);
    }
    o
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
    let opts = options_of(a);
    let queue_name = a.queue.as_deref();
    let rehearse = |q: Queue| -> leaseq::Result<Enqueued> {
        match queue_name {
            None | Some(files::DEFAULT_QUEUE) => q.enqueue(&payload, opts.clone()),
            Some(name) => q.named(name)?.enqueue(&payload, opts.clone()),
        }
    };
    files::in_memory()
        .and_then(rehearse)
        .map_err(|e| Fail::error(one_line(&e.to_string())))?;

    let queue = files::open(&a.file, Missing::Create)?;
    let q = files::named_or_default(&queue, queue_name)?;
    let outcome = q
        .enqueue(&payload, opts)
        .map_err(|e| Fail::leaseq(&a.file, e))?;
    let (word, id) = match outcome {
        Enqueued::New(id) => ("new", id),
        Enqueued::Duplicate(id) => ("duplicate", id),
        Enqueued::DuplicateDead(id) => ("duplicate_dead", id),
        Enqueued::Replaced(id) => ("replaced", id),
    };
    let mut out = Out::new();
    if a.json {
        out.json(&EnqueuedJson {
            outcome: word,
            id: id.0,
        })?;
    } else {
        match outcome {
            Enqueued::New(id) => out.line(id.to_string())?,
            Enqueued::Duplicate(id) => {
                out.line(format!("duplicate {id} (job {id} holds the dedup key)"))?
            }
            Enqueued::DuplicateDead(id) => out.line(format!(
                "duplicate {id} (dead job {id} holds the dedup key; requeue-dead or purge it)"
            ))?,
            Enqueued::Replaced(id) => out.line(format!(
                "replaced {id} (the waiting job {id} holds the dedup key and got this payload)"
            ))?,
        }
    }
    out.flush()
}

/// `leaseq requeue-dead`.
pub fn requeue_dead(a: &RequeueDeadArgs) -> CliResult {
    let queue = files::open(&a.file, Missing::Refuse)?;
    let path = path_of(&queue);
    let name = a.queue.queue.as_deref();
    let mut out = Out::new();
    if let Some(id) = a.id {
        let Some((q, info)) = files::find_job_to_write(&queue, name, id)? else {
            return Err(Fail::problem(format!("{}: no job {id}", path.display())));
        };
        if info.state != JobState::Dead {
            return Err(Fail::problem(format!(
                "{}: job {id} is {}, not dead",
                path.display(),
                state_name(info.state)
            )));
        }
        q.requeue_dead(JobId(id))
            .map_err(|e| Fail::leaseq(path, e))?;
        out.line(format!("requeued {id}"))?;
        return out.flush();
    }
    for q in files::selected_queues(&queue, name)? {
        let n = q.requeue_dead_all().map_err(|e| Fail::leaseq(path, e))?;
        out.line(format!("{}: requeued {n} dead jobs", queue_label(q.name())))?;
    }
    out.flush()
}

/// `leaseq cancel`: the job, found in the selected queues.
pub fn cancel(a: &CancelArgs) -> CliResult {
    on_job(&a.file, a.queue.queue.as_deref(), a.id, |q, id| {
        q.cancel(id, &a.reason)
            .map(|was| format!("cancelled {} (was {})", id.0, state_name(was)))
    })
}

/// `leaseq retry`: the job, found in the selected queues.
pub fn retry(a: &JobArgs) -> CliResult {
    on_job(&a.file, a.queue.queue.as_deref(), a.id, |q, id| {
        q.retry(id).map(|()| format!("retried {}", id.0))
    })
}

/// `leaseq promote`: the job, found in the selected queues.
pub fn promote(a: &JobArgs) -> CliResult {
    on_job(&a.file, a.queue.queue.as_deref(), a.id, |q, id| {
        q.promote(id).map(|()| format!("promoted {}", id.0))
    })
}

/// Finds job `id` in the queues `name` selects and applies `f` to it; prints what `f` says.
fn on_job(
    file: &std::path::Path,
    name: Option<&str>,
    id: u64,
    f: impl Fn(&Queue, JobId) -> leaseq::Result<String>,
) -> CliResult {
    let queue = files::open(file, Missing::Refuse)?;
    let path = path_of(&queue);
    let Some((q, _)) = files::find_job_to_write(&queue, name, id)? else {
        return Err(Fail::problem(format!("{}: no job {id}", path.display())));
    };
    let said = f(&q, JobId(id)).map_err(|e| Fail::leaseq(path, e))?;
    let mut out = Out::new();
    out.line(said)?;
    out.flush()
}

/// `leaseq pause`: each selected queue, one commit each.
pub fn pause(a: &ControlArgs) -> CliResult {
    control(a, |q| q.pause(), "paused", "already paused")
}

/// `leaseq resume`: each selected queue, one commit each.
pub fn resume(a: &ControlArgs) -> CliResult {
    control(a, |q| q.resume(), "resumed", "not paused")
}

/// Applies `f` to each selected queue; says `changed` or `unchanged` per queue.
fn control(
    a: &ControlArgs,
    f: impl Fn(&Queue) -> leaseq::Result<bool>,
    changed: &str,
    unchanged: &str,
) -> CliResult {
    let queue = files::open(&a.file, Missing::Refuse)?;
    let path = path_of(&queue);
    let mut out = Out::new();
    for q in files::selected_queues(&queue, a.queue.queue.as_deref())? {
        let did = f(&q).map_err(|e| Fail::leaseq(path, e))?;
        let what = if did { changed } else { unchanged };
        out.line(format!("{}: {what}", queue_label(q.name())))?;
    }
    out.flush()
}

/// `leaseq schedule-remove`: the schedule of the queue `--queue` names (never made), else of
/// the default queue; one commit. Exit 1 when that queue has no schedule of that name.
pub fn schedule_remove(a: &ScheduleRemoveArgs) -> CliResult {
    let queue = files::open(&a.file, Missing::Refuse)?;
    let path = path_of(&queue);
    let q = match a.queue.as_deref() {
        Some(name) => files::writable(&queue, &files::existing(&queue.reader(), name)?)?,
        None => queue.clone(),
    };
    let removed = q
        .remove_schedule(&a.name)
        .map_err(|e| Fail::leaseq(path, e))?;
    if !removed {
        return Err(Fail::problem(format!(
            "{}: no schedule named {:?} in queue {}",
            path.display(),
            a.name,
            queue_label(q.name())
        )));
    }
    let mut out = Out::new();
    out.line(format!(
        "{}: removed schedule {:?}",
        queue_label(q.name()),
        a.name
    ))?;
    out.flush()
}

/// `leaseq purge`. Leased jobs are refused before the file is opened.
pub fn purge(a: &PurgeArgs) -> CliResult {
    if a.state == StateArg::Leased {
        return Err(Fail::error(
            "purge refuses leased jobs: a leased job is ended through its lease (ack, nack, fail)",
        ));
    }
    let state: JobState = a.state.into();
    let queue = files::open(&a.file, Missing::Refuse)?;
    let path = path_of(&queue);
    let mut out = Out::new();
    for q in files::selected_queues(&queue, a.queue.queue.as_deref())? {
        let n = q.purge(state).map_err(|e| Fail::leaseq(path, e))?;
        out.line(format!(
            "{}: purged {n} {} jobs",
            queue_label(q.name()),
            state_name(state)
        ))?;
    }
    out.flush()
}

/// `leaseq prune`: every queue of the file.
pub fn prune(a: &PruneArgs) -> CliResult {
    let builder = files::builder()
        .applied_retention(a.applied_retention)
        .dead_retention(a.dead_retention);
    let queue = files::open_with(&a.file, Missing::Refuse, builder)?;
    let path = path_of(&queue);
    let mut out = Out::new();
    for q in files::selected_queues(&queue, None)? {
        let p = q.prune().map_err(|e| Fail::leaseq(path, e))?;
        out.line(format!(
            "{}: removed {} applied markers, {} dead jobs, released {} dedup windows",
            queue_label(q.name()),
            p.applied,
            p.dead,
            p.dedup_windows
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
    let mut queue = files::open(&a.file, Missing::Refuse)?;
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
