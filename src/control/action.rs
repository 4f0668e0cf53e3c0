//! The actions a control channel carries out: one [`Action`] per write command of the tool
//! and per button of the dashboard, applied on a file's handle the same way whether it came
//! from this process ([`Action::apply`]) or from another one (the channel), with one JSON
//! answer shape per action.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::token::invalid;
use crate::{
    CancelOutcome, EnqueueOptions, Enqueued, Error, JobId, JobState, OnDuplicate, Queue, Result,
};

/// How a queue selector names the default (unnamed) queue: `queue=(default)` in the API,
/// `--queue '(default)'` in the tool. No named queue can be called this (names are ASCII
/// letters, digits, `_`, `-` and `.`).
pub const DEFAULT_QUEUE: &str = "(default)";

/// One change to a queue file, carried out on the file's own handle: by [`Action::apply`]
/// in the process that has the file open, or by another process through the app's control
/// channel ([`Client::act`](super::Client::act)), which applies it in the app with the app's
/// own handle and commits. Either way the answer is the same JSON value, and the errors are
/// the same [`Error`]s.
///
/// A `queue` selector of `None` covers every queue of the file (for an action on one job:
/// whichever queue holds it; ids are unique in a file); `Some("(default)")`
/// ([`DEFAULT_QUEUE`]) the default queue; `Some(name)` that named queue, which must exist
/// (else `QueueNotFound`). Each action is the queue call it names, with that call's errors;
/// over several queues, one commit per queue, in order (the default queue first, then the
/// named ones by name), stopping at the first error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// [`Queue::cancel`] with `reason`. Answers `{"id":N,"queue":Q,"was":"ready"}`: the
    /// job's queue (`null` for the default one) and the state it was in.
    Cancel {
        /// The job.
        id: JobId,
        /// Where to look for it.
        queue: Option<String>,
        /// Recorded with the job (at most [`REASON_BYTES_MAX`](crate::REASON_BYTES_MAX)).
        reason: String,
    },
    /// [`Queue::retry`]: a dead, completed or cancelled job runs again, a scheduled one
    /// runs now. Answers
    /// `{"id":N,"queue":Q}`.
    Retry {
        /// The job.
        id: JobId,
        /// Where to look for it.
        queue: Option<String>,
    },
    /// [`Queue::promote`]: a scheduled job is ready now. Answers `{"id":N,"queue":Q}`.
    Promote {
        /// The job.
        id: JobId,
        /// Where to look for it.
        queue: Option<String>,
    },
    /// [`Queue::remove`]: the job is deleted (not a leased one). Answers
    /// `{"id":N,"queue":Q}`.
    Remove {
        /// The job.
        id: JobId,
        /// Where to look for it.
        queue: Option<String>,
    },
    /// [`Queue::requeue_dead`]: a dead job is ready again, attempts reset. Answers
    /// `{"id":N,"queue":Q}`.
    RequeueDead {
        /// The job.
        id: JobId,
        /// Where to look for it.
        queue: Option<String>,
    },
    /// [`Queue::requeue_dead_all`] in each selected queue. Answers
    /// `{"queues":[{"queue":Q,"count":N},…]}`.
    RequeueDeadAll {
        /// The queues.
        queue: Option<String>,
    },
    /// [`Queue::purge`] of one state (not `Leased`: `InvalidOption`) in each selected queue.
    /// Answers `{"queues":[{"queue":Q,"count":N},…]}`.
    Purge {
        /// The queues.
        queue: Option<String>,
        /// The state whose jobs are deleted.
        state: JobState,
    },
    /// [`Queue::pause`] of each selected queue. Answers
    /// `{"queues":[{"queue":Q,"changed":B},…]}` (`changed`: it was running).
    Pause {
        /// The queues.
        queue: Option<String>,
    },
    /// [`Queue::resume`] of each selected queue. Answers
    /// `{"queues":[{"queue":Q,"changed":B},…]}` (`changed`: it was paused).
    Resume {
        /// The queues.
        queue: Option<String>,
    },
    /// [`Queue::remove_schedule`] of the default queue (`queue` of `None`) or of the one
    /// named. Answers `{"queue":Q,"name":NAME}`; `ScheduleNotFound` when that queue has no
    /// schedule of that name.
    RemoveSchedule {
        /// The schedule's queue: `None` (or `"(default)"`) for the default one.
        queue: Option<String>,
        /// The schedule's name.
        name: String,
    },
    /// [`Queue::pause_schedule`] of a schedule of the default queue (`queue` of `None`) or
    /// of the one named. Answers `{"queue":Q,"name":NAME,"changed":B}` (`changed`: it was
    /// running); `ScheduleNotFound` when that queue has no schedule of that name.
    PauseSchedule {
        /// The schedule's queue: `None` (or `"(default)"`) for the default one.
        queue: Option<String>,
        /// The schedule's name.
        name: String,
    },
    /// [`Queue::resume_schedule`], as [`Action::PauseSchedule`] (`changed`: it was paused).
    ResumeSchedule {
        /// The schedule's queue: `None` (or `"(default)"`) for the default one.
        queue: Option<String>,
        /// The schedule's name.
        name: String,
    },
    /// [`Queue::trigger_schedule`]: one instance now. Answers
    /// `{"queue":Q,"name":NAME,"id":N}`; `ScheduleNotFound` as [`Action::PauseSchedule`].
    TriggerSchedule {
        /// The schedule's queue: `None` (or `"(default)"`) for the default one.
        queue: Option<String>,
        /// The schedule's name.
        name: String,
    },
    /// [`Queue::prune`] of every queue, with the retentions of the handle it is applied on
    /// (through a channel: the app's own). Answers
    /// `{"queues":[{"queue":Q,"applied":N,"dead":N,"dedup_windows":N},…]}`.
    Prune,
    /// [`Queue::enqueue`]. Answers `{"outcome":O,"id":N}`, `O` one of `new`, `duplicate`,
    /// `duplicate_dead`, `replaced` ([`Enqueued`]).
    Enqueue(Enqueue),
    /// [`Queue::set_limit`] of the default queue (`queue` of `None`) or of the one named:
    /// sets its size limit, or with `limit` of `None` removes it. Answers
    /// `{"queue":Q,"changed":B,"limit":LIMIT}` (`LIMIT` as [`crate::json::queue_limit`], or
    /// `null`).
    SetLimit {
        /// The queue: `None` (or `"(default)"`) for the default one (never made).
        queue: Option<String>,
        /// The limit, or `None` to remove it.
        limit: Option<crate::QueueLimit>,
    },
}

/// A job to enqueue ([`Action::Enqueue`]): the payload and the options the tool's `enqueue`
/// takes, each as [`EnqueueOptions`]' setter of that name (`None`: the queue's default).
/// Its `Debug` shows the payload's length, never its bytes (actions are logged).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Enqueue {
    /// The queue: `None` (or `"(default)"`) for the default one; a named queue is created
    /// if missing, as [`Queue::named`].
    pub queue: Option<String>,
    /// The payload's bytes.
    pub payload: Vec<u8>,
    /// [`EnqueueOptions::priority`].
    pub priority: Option<i32>,
    /// [`EnqueueOptions::delay`], in ms.
    pub delay_ms: Option<u64>,
    /// [`EnqueueOptions::dedup_key`].
    pub dedup_key: Option<String>,
    /// [`EnqueueOptions::dedup_window`], in ms.
    pub dedup_window_ms: Option<u64>,
    /// [`EnqueueOptions::on_duplicate`].
    pub on_duplicate: OnDuplicate,
    /// [`EnqueueOptions::idempotency_key`].
    pub idempotency_key: Option<String>,
    /// [`EnqueueOptions::max_attempts`].
    pub max_attempts: Option<u32>,
    /// [`EnqueueOptions::lease`], in ms.
    pub lease_ms: Option<u64>,
}

impl std::fmt::Debug for Enqueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enqueue")
            .field("queue", &self.queue)
            .field("payload_bytes", &self.payload.len())
            .field("priority", &self.priority)
            .field("delay_ms", &self.delay_ms)
            .field("dedup_key", &self.dedup_key)
            .field("dedup_window_ms", &self.dedup_window_ms)
            .field("on_duplicate", &self.on_duplicate)
            .field("idempotency_key", &self.idempotency_key)
            .field("max_attempts", &self.max_attempts)
            .field("lease_ms", &self.lease_ms)
            .finish()
    }
}

impl Enqueue {
    /// The [`EnqueueOptions`] these fields make.
    pub fn options(&self) -> EnqueueOptions {
        let mut o = EnqueueOptions::default();
        if let Some(p) = self.priority {
            o = o.priority(p);
        }
        if let Some(ms) = self.delay_ms {
            o = o.delay(Duration::from_millis(ms));
        }
        if let Some(k) = &self.dedup_key {
            o = o.dedup_key(k);
        }
        if self.on_duplicate != OnDuplicate::Keep {
            o = o.on_duplicate(self.on_duplicate);
        }
        if let Some(ms) = self.dedup_window_ms {
            o = o.dedup_window(Duration::from_millis(ms));
        }
        if let Some(k) = &self.idempotency_key {
            o = o.idempotency_key(k);
        }
        if let Some(n) = self.max_attempts {
            o = o.max_attempts(n);
        }
        if let Some(ms) = self.lease_ms {
            o = o.lease(Duration::from_millis(ms));
        }
        o
    }
}

impl Action {
    /// Carries the action out on `file`, a handle of the file (any of its queues: the action
    /// picks its own), and returns its answer (each variant's docs give its shape).
    ///
    /// # Errors
    /// Those of the queue call the variant names; `QueueNotFound` for a selector naming a
    /// queue the file does not have; `JobNotFound` for a job no selected queue holds;
    /// `ScheduleNotFound` for a schedule to remove that is not there; `InvalidOption` for a
    /// purge of leased jobs.
    pub fn apply(&self, file: &Queue) -> Result<Value> {
        let file = file.default_queue();
        match self {
            Action::Cancel { id, queue, reason } => on_job(&file, queue, *id, |q| {
                // The API's answer as before: a job that already ended is `InvalidState`
                // (409), as the tool and the dashboard show it.
                match q.cancel(*id, reason)? {
                    CancelOutcome::Cancelled { was } => Ok(json!({ "was": was.as_str() })),
                    CancelOutcome::AlreadyEnded { state } => Err(Error::InvalidState {
                        job_id: *id,
                        actual: state,
                        expected: "Scheduled, Ready, Leased or Dead",
                    }),
                    _ => Err(Error::JobNotFound { job_id: *id }),
                }
            }),
            Action::Retry { id, queue } => on_job(&file, queue, *id, |q| {
                q.retry(*id)?;
                Ok(json!({}))
            }),
            Action::Promote { id, queue } => on_job(&file, queue, *id, |q| {
                q.promote(*id)?;
                Ok(json!({}))
            }),
            Action::Remove { id, queue } => on_job(&file, queue, *id, |q| {
                q.remove(*id)?;
                Ok(json!({}))
            }),
            Action::RequeueDead { id, queue } => on_job(&file, queue, *id, |q| {
                q.requeue_dead(*id)?;
                Ok(json!({}))
            }),
            Action::RequeueDeadAll { queue } => on_queues(&file, queue, |q| {
                Ok(json!({ "count": q.requeue_dead_all()? }))
            }),
            Action::Purge { queue, state } => {
                if *state == JobState::Leased {
                    return Err(invalid(
                        "state",
                        "leased jobs are not purged: a leased job is ended through its lease \
                         (ack, nack, fail), or cancelled",
                    ));
                }
                on_queues(&file, queue, |q| Ok(json!({ "count": q.purge(*state)? })))
            }
            Action::Pause { queue } => {
                on_queues(&file, queue, |q| Ok(json!({ "changed": q.pause()? })))
            }
            Action::Resume { queue } => {
                on_queues(&file, queue, |q| Ok(json!({ "changed": q.resume()? })))
            }
            Action::RemoveSchedule { queue, name } => {
                let q = schedule_queue(&file, queue)?;
                if !q.remove_schedule(name)? {
                    return Err(Error::ScheduleNotFound { name: name.clone() });
                }
                Ok(json!({ "queue": q.name(), "name": name }))
            }
            Action::PauseSchedule { queue, name } => {
                let q = schedule_queue(&file, queue)?;
                let changed = q.pause_schedule(name)?;
                Ok(json!({ "queue": q.name(), "name": name, "changed": changed }))
            }
            Action::ResumeSchedule { queue, name } => {
                let q = schedule_queue(&file, queue)?;
                let changed = q.resume_schedule(name)?;
                Ok(json!({ "queue": q.name(), "name": name, "changed": changed }))
            }
            Action::TriggerSchedule { queue, name } => {
                let q = schedule_queue(&file, queue)?;
                let id = q.trigger_schedule(name)?;
                Ok(json!({ "queue": q.name(), "name": name, "id": id.0 }))
            }
            Action::SetLimit { queue, limit } => {
                let q = schedule_queue(&file, queue)?;
                let changed = q.set_limit(*limit)?;
                Ok(json!({
                    "queue": q.name(),
                    "changed": changed,
                    "limit": limit.as_ref().map(crate::json::queue_limit),
                }))
            }
            Action::Prune => on_queues(&file, &None, |q| {
                let p = q.prune()?;
                Ok(json!({
                    "applied": p.applied,
                    "dead": p.dead,
                    "dedup_windows": p.dedup_windows,
                }))
            }),
            Action::Enqueue(e) => {
                // A refused enqueue makes no queue: its input is checked first.
                file.validate_enqueue(&e.payload, &e.options())?;
                let q = match e.queue.as_deref() {
                    None | Some(DEFAULT_QUEUE) => file,
                    Some(n) => file.named(n)?,
                };
                let (outcome, id) = match q.enqueue(&e.payload, e.options())? {
                    Enqueued::New(id) => ("new", id),
                    Enqueued::Duplicate(id) => ("duplicate", id),
                    Enqueued::DuplicateDead(id) => ("duplicate_dead", id),
                    Enqueued::Replaced(id) => ("replaced", id),
                };
                Ok(json!({ "outcome": outcome, "id": id.0 }))
            }
        }
    }

    /// The request that carries this action: the path and query under the API's root, and
    /// the body (an enqueue's payload; empty otherwise). Always a `POST`.
    pub(crate) fn to_request(&self) -> (String, Vec<u8>) {
        let mut query = form_urlencoded::Serializer::new(String::new());
        let selector = |query: &mut form_urlencoded::Serializer<'_, String>,
                        queue: &Option<String>| {
            if let Some(q) = queue {
                query.append_pair("queue", q);
            }
        };
        let mut body = Vec::new();
        let path = match self {
            Action::Cancel { id, queue, reason } => {
                selector(&mut query, queue);
                // In the body: a reason of 4 KiB, percent-encoded, would not fit in a head.
                body = reason.as_bytes().to_vec();
                format!("jobs/{id}/cancel")
            }
            Action::Retry { id, queue } => {
                selector(&mut query, queue);
                format!("jobs/{id}/retry")
            }
            Action::Promote { id, queue } => {
                selector(&mut query, queue);
                format!("jobs/{id}/promote")
            }
            Action::Remove { id, queue } => {
                selector(&mut query, queue);
                format!("jobs/{id}/remove")
            }
            Action::RequeueDead { id, queue } => {
                selector(&mut query, queue);
                format!("jobs/{id}/requeue-dead")
            }
            Action::RequeueDeadAll { queue } => {
                selector(&mut query, queue);
                "requeue-dead".into()
            }
            Action::Purge { queue, state } => {
                selector(&mut query, queue);
                query.append_pair("state", state.as_str());
                "purge".into()
            }
            Action::Pause { queue } => {
                selector(&mut query, queue);
                "pause".into()
            }
            Action::Resume { queue } => {
                selector(&mut query, queue);
                "resume".into()
            }
            Action::RemoveSchedule { queue, name } => {
                selector(&mut query, queue);
                query.append_pair("name", name);
                "schedule-remove".into()
            }
            Action::PauseSchedule { queue, name } => {
                selector(&mut query, queue);
                query.append_pair("name", name);
                "schedule-pause".into()
            }
            Action::ResumeSchedule { queue, name } => {
                selector(&mut query, queue);
                query.append_pair("name", name);
                "schedule-resume".into()
            }
            Action::TriggerSchedule { queue, name } => {
                selector(&mut query, queue);
                query.append_pair("name", name);
                "schedule-trigger".into()
            }
            Action::Prune => "prune".into(),
            Action::SetLimit { queue, limit } => {
                selector(&mut query, queue);
                match limit {
                    None => "limit-remove".into(),
                    Some(l) => {
                        if let Some(n) = l.max_jobs {
                            query.append_pair("max_jobs", &n.to_string());
                        }
                        if let Some(n) = l.max_bytes {
                            query.append_pair("max_bytes", &n.to_string());
                        }
                        let (when_full, wait_ms) = match l.when_full {
                            crate::WhenFull::Refuse => ("refuse", None),
                            crate::WhenFull::Block { wait_ms } => ("block", Some(wait_ms)),
                            crate::WhenFull::DropOldest => ("drop_oldest", None),
                        };
                        query.append_pair("when_full", when_full);
                        if let Some(ms) = wait_ms {
                            query.append_pair("wait_ms", &ms.to_string());
                        }
                        "limit".into()
                    }
                }
            }
            Action::Enqueue(e) => {
                selector(&mut query, &e.queue);
                let mut pair = |k: &str, v: Option<String>| {
                    if let Some(v) = v {
                        query.append_pair(k, &v);
                    }
                };
                pair("priority", e.priority.map(|v| v.to_string()));
                pair("delay_ms", e.delay_ms.map(|v| v.to_string()));
                pair("dedup_key", e.dedup_key.clone());
                pair("dedup_window_ms", e.dedup_window_ms.map(|v| v.to_string()));
                pair(
                    "on_duplicate",
                    Some(on_duplicate_name(e.on_duplicate).to_string()),
                );
                pair("idempotency_key", e.idempotency_key.clone());
                pair("max_attempts", e.max_attempts.map(|v| v.to_string()));
                pair("lease_ms", e.lease_ms.map(|v| v.to_string()));
                body = e.payload.clone();
                "enqueue".into()
            }
        };
        let query = query.finish();
        if query.is_empty() {
            (path, body)
        } else {
            (format!("{path}?{query}"), body)
        }
    }

    /// The action a `POST` to `path` (under the API's root, without its leading `/`) with
    /// `query` and `body` asks for; `Ok(None)` when `path` names no action.
    ///
    /// # Errors
    /// `InvalidOption` for a parameter that does not parse (naming it).
    pub(crate) fn from_request(
        path: &str,
        query: &HashMap<String, String>,
        body: Vec<u8>,
    ) -> Result<Option<Action>> {
        // An empty `queue=` is no selector, as for the reads.
        let queue = query.get("queue").filter(|q| !q.is_empty()).cloned();
        let parts: Vec<&str> = path.split('/').collect();
        let action = match parts.as_slice() {
            ["jobs", id, verb] => {
                let id = JobId(
                    id.parse()
                        .map_err(|_| invalid("id", "a job id (a decimal number)"))?,
                );
                match *verb {
                    "cancel" => Action::Cancel {
                        id,
                        queue,
                        // `reason=` in the query, else the body as UTF-8 text.
                        reason: match query.get("reason") {
                            Some(r) => r.clone(),
                            None => String::from_utf8(body).map_err(|_| {
                                invalid("reason", "the body is the reason, as UTF-8 text")
                            })?,
                        },
                    },
                    "retry" => Action::Retry { id, queue },
                    "promote" => Action::Promote { id, queue },
                    "remove" => Action::Remove { id, queue },
                    "requeue-dead" => Action::RequeueDead { id, queue },
                    _ => return Ok(None),
                }
            }
            ["requeue-dead"] => Action::RequeueDeadAll { queue },
            ["purge"] => {
                let state = query.get("state").map(String::as_str).unwrap_or("");
                let state = JobState::from_name(state).ok_or_else(|| {
                    invalid(
                        "state",
                        "one of ready, scheduled, dead, completed, cancelled",
                    )
                })?;
                Action::Purge { queue, state }
            }
            ["pause"] => Action::Pause { queue },
            ["resume"] => Action::Resume { queue },
            [
                verb @ ("schedule-remove" | "schedule-pause" | "schedule-resume"
                | "schedule-trigger"),
            ] => {
                let name = query
                    .get("name")
                    .filter(|n| !n.is_empty())
                    .cloned()
                    .ok_or_else(|| invalid("name", "the schedule's name"))?;
                match *verb {
                    "schedule-remove" => Action::RemoveSchedule { queue, name },
                    "schedule-pause" => Action::PauseSchedule { queue, name },
                    "schedule-resume" => Action::ResumeSchedule { queue, name },
                    _ => Action::TriggerSchedule { queue, name },
                }
            }
            ["prune"] => Action::Prune,
            ["limit-remove"] => Action::SetLimit { queue, limit: None },
            ["limit"] => {
                let when_full = match query.get("when_full").map(String::as_str) {
                    None | Some("refuse") => crate::WhenFull::Refuse,
                    Some("drop_oldest") => crate::WhenFull::DropOldest,
                    Some("block") => crate::WhenFull::Block {
                        wait_ms: number(query, "wait_ms")?.ok_or_else(|| {
                            invalid("wait_ms", "the longest wait of when_full=block, in ms")
                        })?,
                    },
                    Some(_) => {
                        return Err(invalid(
                            "when_full",
                            "one of refuse, block (with wait_ms), drop_oldest",
                        ));
                    }
                };
                if !matches!(when_full, crate::WhenFull::Block { .. })
                    && query.contains_key("wait_ms")
                {
                    return Err(invalid("wait_ms", "only with when_full=block"));
                }
                Action::SetLimit {
                    queue,
                    limit: Some(crate::QueueLimit {
                        max_jobs: number(query, "max_jobs")?,
                        max_bytes: number(query, "max_bytes")?,
                        when_full,
                    }),
                }
            }
            ["enqueue"] => Action::Enqueue(Enqueue {
                queue,
                payload: body,
                priority: number(query, "priority")?,
                delay_ms: number(query, "delay_ms")?,
                dedup_key: query.get("dedup_key").cloned(),
                dedup_window_ms: number(query, "dedup_window_ms")?,
                on_duplicate: match query.get("on_duplicate").map(String::as_str) {
                    None | Some("keep") => OnDuplicate::Keep,
                    Some("replace") => OnDuplicate::Replace,
                    Some("debounce") => OnDuplicate::Debounce,
                    Some(_) => {
                        return Err(invalid("on_duplicate", "one of keep, replace, debounce"));
                    }
                },
                idempotency_key: query.get("idempotency_key").cloned(),
                max_attempts: number(query, "max_attempts")?,
                lease_ms: number(query, "lease_ms")?,
            }),
            _ => return Ok(None),
        };
        Ok(Some(action))
    }
}

/// The API's name of an [`OnDuplicate`].
fn on_duplicate_name(o: OnDuplicate) -> &'static str {
    match o {
        OnDuplicate::Keep => "keep",
        OnDuplicate::Replace => "replace",
        OnDuplicate::Debounce => "debounce",
    }
}

/// The number in query parameter `field`, if given.
fn number<T: std::str::FromStr>(
    query: &HashMap<String, String>,
    field: &'static str,
) -> Result<Option<T>> {
    match query.get(field) {
        None => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| invalid(field, format!("not a number: {text:?}"))),
    }
}

/// The queues `selector` covers on `file` (its default queue's handle): every queue (the
/// default one first, then the named ones by name), the default one, or one named.
///
/// # Errors
/// `QueueNotFound` for a name the file does not have.
pub(crate) fn selected(file: &Queue, selector: Option<&str>) -> Result<Vec<Queue>> {
    match selector {
        Some(DEFAULT_QUEUE) => Ok(vec![file.clone()]),
        Some(name) => Ok(vec![file.existing(name)?]),
        None => {
            let mut out = vec![file.clone()];
            for name in file.queue_names()? {
                out.push(file.existing(&name)?);
            }
            Ok(out)
        }
    }
}

/// Runs `f` on the queue holding job `id` among the selected ones; its answer with the
/// job's id and queue added.
fn on_job(
    file: &Queue,
    selector: &Option<String>,
    id: JobId,
    f: impl FnOnce(&Queue) -> Result<Value>,
) -> Result<Value> {
    for q in selected(file, selector.as_deref())? {
        if q.job(id)?.is_some() {
            let mut answer = f(&q)?;
            answer["id"] = json!(id.0);
            answer["queue"] = json!(q.name());
            return Ok(answer);
        }
    }
    Err(Error::JobNotFound { job_id: id })
}

/// Runs `f` on each selected queue; `{"queues":[…]}` of its answers, each with its queue.
fn on_queues(
    file: &Queue,
    selector: &Option<String>,
    f: impl Fn(&Queue) -> Result<Value>,
) -> Result<Value> {
    let mut answers = Vec::new();
    for q in selected(file, selector.as_deref())? {
        let mut answer = f(&q)?;
        answer["queue"] = json!(q.name());
        answers.push(answer);
    }
    Ok(json!({ "queues": answers }))
}

/// The queue a schedule action names: the default one for `None` or `"(default)"`, else an
/// existing named queue (`QueueNotFound` otherwise: a schedule action never makes one).
fn schedule_queue(file: &Queue, queue: &Option<String>) -> Result<Queue> {
    match queue.as_deref() {
        None | Some(DEFAULT_QUEUE) => Ok(file.clone()),
        Some(n) => file.existing(n),
    }
}
