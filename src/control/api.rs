//! The JSON API (version 1), under `/api/v1/`: who may call it (a bearer token), its routes,
//! its answers and its errors. The control channel serves it alone; the dashboard serves it
//! beside its pages.

use std::collections::HashMap;
use std::path::PathBuf;

use parking_lot::RwLock;
use serde_json::{Value, json};

use super::action::Action;
use super::server::{Asked, BODY_BYTES_MAX, Handler, Reply};
use super::token::{API_VERSION, invalid, same};
use crate::json::JobView;
use crate::{Error, JobCursor, JobId, JobInfo, JobState, PoolMonitor, Queue, Reader, Result};

/// Jobs per page of `GET /api/v1/jobs` unless `limit` says otherwise.
pub(crate) const LIST_LIMIT_DEFAULT: usize = 100;
/// Jobs per page of `GET /api/v1/jobs` at most.
pub(crate) const LIST_LIMIT_MAX: usize = 1000;
/// Bytes of a payload `GET /api/v1/jobs/ID?payload=1` carries in its JSON at most (the
/// bytes themselves from `GET /api/v1/jobs/ID/payload`).
pub(crate) const INLINE_PAYLOAD_MAX: usize = 1 << 20;

/// The API's root.
pub(crate) const ROOT: &str = "/api/v1";

/// Where the API reads and acts.
pub(crate) trait Access: Send + Sync {
    /// A reader of the file (its default queue).
    ///
    /// # Errors
    /// `Closed` once the app closed its file; a file's open errors.
    fn reader(&self) -> Result<Reader>;

    /// Carries `action` out and returns its answer ([`Action::apply`]).
    ///
    /// # Errors
    /// The action's; `Closed` once the app closed its file.
    fn act(&self, action: &Action) -> Result<Value>;

    /// The app's worker pools, as `GET /api/v1/workers` answers them.
    ///
    /// # Errors
    /// A file's dashboard: those of the app's channel.
    fn workers(&self) -> Result<Value> {
        Ok(json!({ "pools": [] }))
    }
}

/// The workers view of `pools`: each pool's name, queue, threads, busy and idle ones, and
/// its counts (`null` once the pool is gone).
pub(crate) fn workers_json(pools: &[PoolMonitor]) -> Value {
    let pools: Vec<Value> = pools
        .iter()
        .map(|p| {
            let stats = p.stats();
            let busy = stats.map(|s| s.in_flight);
            json!({
                "name": p.name(),
                "queue": p.queue(),
                "threads": p.threads(),
                "busy": busy,
                "idle": busy.map(|b| (p.threads() as u64).saturating_sub(b)),
                "state": match (&stats, p.is_stopping()) {
                    (None, _) => "gone",
                    (Some(_), true) => "stopping",
                    (Some(_), false) => "running",
                },
                "stats": stats.map(|s| json!({
                    "polls": s.polls,
                    "jobs": s.jobs,
                    "acked": s.acked,
                    "already_applied": s.already_applied,
                    "retried": s.retried,
                    "panics": s.panics,
                    "failed": s.failed,
                    "dead": s.dead,
                    "snoozed": s.snoozed,
                    "timed_out": s.timed_out,
                    "lost": s.lost,
                    "cancelled": s.cancelled,
                    "heartbeats": s.heartbeats,
                    "last_heartbeat_ms": s.last_heartbeat_ms,
                    "heartbeats_lost": s.heartbeats_lost,
                    "errors": s.errors,
                })),
            })
        })
        .collect();
    json!({ "pools": pools })
}

/// The app's own handle of its file, let go of once the app closes the file
/// ([`Queue::close`], [`Queue::shutdown`]): a shutdown waits for every handle, and a
/// server's must not keep it from releasing the file.
pub(crate) struct Held(RwLock<Option<Queue>>);

impl Held {
    pub(crate) fn new(queue: &Queue) -> Held {
        Held(RwLock::new(Some(queue.clone())))
    }

    /// The app's handle while the app has not closed the file; dropped once it has.
    ///
    /// # Errors
    /// `Closed` once the app closed the file.
    pub(crate) fn queue(&self) -> Result<Queue> {
        if let Some(queue) = self.0.read().as_ref()
            && !queue.is_closed()
        {
            return Ok(queue.clone());
        }
        self.release_if_closed();
        Err(Error::Closed)
    }

    /// Drops the handle if the app closed the file (called at every request and by the
    /// serving thread while idle).
    pub(crate) fn release_if_closed(&self) {
        let closed = self.0.read().as_ref().is_some_and(Queue::is_closed);
        if closed {
            tracing::info!("leaseq: a server lets go of the closed queue");
            *self.0.write() = None;
        }
    }

    /// Whether the handle was let go of (the app closed its queue).
    pub(crate) fn is_released(&self) -> bool {
        self.0.read().is_none()
    }

    /// The file's path, while the handle is held.
    #[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
    pub(crate) fn path(&self) -> Option<PathBuf> {
        self.0
            .read()
            .as_ref()?
            .path()
            .map(std::path::Path::to_path_buf)
    }
}

impl Access for Held {
    fn reader(&self) -> Result<Reader> {
        Ok(self.queue()?.reader())
    }

    fn act(&self, action: &Action) -> Result<Value> {
        action.apply(&self.queue()?)
    }
}

/// Whether `asked` carries `Authorization: Bearer <token>`.
pub(crate) fn bearer_is(headers: &HashMap<String, String>, token: &str) -> bool {
    headers
        .get("authorization")
        // The scheme's name is case-insensitive (RFC 9110).
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .is_some_and(|(_, given)| same(given.trim(), token))
}

/// Whether a request to `path` may carry a payload (an enqueue).
pub(crate) fn carries_payload(method: &str, path: &str) -> bool {
    method == "POST" && path == format!("{ROOT}/enqueue")
}

/// The answer to a request under [`ROOT`] (already admitted: its token checked).
pub(crate) fn answer(access: &dyn Access, asked: &Asked) -> Reply {
    let rest = asked
        .path
        .strip_prefix(ROOT)
        .map(|r| r.trim_start_matches('/'))
        .unwrap_or("");
    // A parameter given twice is refused: which one counts is not for the API to guess
    // (`delay_ms=60000&delay_ms=0`).
    if let Some(name) = &asked.repeated {
        let e = invalid(
            "query",
            format!("the parameter {name:?} is given more than once"),
        );
        return Reply::json(status_of(&e), &error_json(&e));
    }
    // A parameter the route does not take is refused, never ignored: `delay=5000` for
    // `delay_ms=5000` would enqueue a job ready at once.
    if let Some(taken) = params_of(rest)
        && let Some(unknown) = asked
            .query
            .keys()
            .filter(|k| !taken.contains(&k.as_str()))
            .min()
    {
        let e = invalid(
            "query",
            if taken.is_empty() {
                format!("{ROOT}/{rest} takes no parameter, not {unknown:?}")
            } else {
                format!(
                    "{ROOT}/{rest} takes no parameter {unknown:?} (it takes {})",
                    taken.join(", ")
                )
            },
        );
        return Reply::json(status_of(&e), &error_json(&e));
    }
    if matches!(asked.method.as_str(), "GET" | "HEAD")
        && let Some(id) = rest
            .strip_prefix("jobs/")
            .and_then(|r| r.strip_suffix("/payload"))
    {
        return match payload(access, id, asked) {
            Ok(bytes) => Reply::with(200, "application/octet-stream", bytes),
            Err(e) => Reply::json(status_of(&e), &error_json(&e)),
        };
    }
    // An action asked with GET, or a read with POST: the method is wrong, not the route.
    let action_route = !matches!(
        Action::from_request(rest, &HashMap::new(), Vec::new()),
        Ok(None)
    );
    let read_route = !action_route
        && (matches!(
            rest,
            "" | "stats" | "jobs" | "workers" | "schedules" | "check" | "overview"
        ) || rest.starts_with("jobs/"));
    let found = match asked.method.as_str() {
        "GET" | "HEAD" if action_route => {
            return error_reply(405, "method_not_allowed", "an action is a POST request");
        }
        "POST" if read_route => {
            return error_reply(405, "method_not_allowed", "a read is a GET request");
        }
        "GET" | "HEAD" => read(access, rest, asked),
        "POST" => match Action::from_request(rest, &asked.query, asked.body.clone()) {
            Ok(Some(action)) => {
                let done = access.act(&action);
                if done.is_ok() {
                    tracing::info!(?action, "leaseq: action through the API");
                }
                done.map(Some)
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        },
        _ => {
            return error_reply(
                405,
                "method_not_allowed",
                "the API reads with GET and acts with POST",
            );
        }
    };
    match found {
        Ok(Some(value)) => Reply::json(200, &value),
        Ok(None) => error_reply(
            404,
            "no_route",
            &format!(
                "no route {} {} in API version {API_VERSION}",
                asked.method, asked.path
            ),
        ),
        Err(e) => Reply::json(status_of(&e), &error_json(&e)),
    }
}

/// The query parameters route `rest` (the path under [`ROOT`]) takes, whatever the method;
/// `None` for a path that is no route (answered 404 or 405 as such).
fn params_of(rest: &str) -> Option<&'static [&'static str]> {
    const QUEUE: &[&str] = &["queue"];
    Some(match rest.split('/').collect::<Vec<_>>().as_slice() {
        [""] | ["workers"] | ["prune"] | ["check"] => &[],
        ["overview"] => &["queue", "since_ms", "dead"],
        ["stats"] | ["schedules"] | ["requeue-dead"] | ["pause"] | ["resume"] => QUEUE,
        ["jobs"] => &["queue", "state", "limit", "after", "before", "order"],
        ["jobs", _] => &["queue", "payload"],
        ["jobs", _, "cancel"] => &["queue", "reason"],
        [
            "jobs",
            _,
            "payload" | "retry" | "promote" | "remove" | "requeue-dead",
        ] => QUEUE,
        ["purge"] => &["queue", "state"],
        ["limit"] => &["queue", "max_jobs", "max_bytes", "when_full", "wait_ms"],
        ["limit-remove"] => QUEUE,
        ["schedule-remove" | "schedule-pause" | "schedule-resume" | "schedule-trigger"] => {
            &["queue", "name"]
        }
        ["enqueue"] => &[
            "queue",
            "priority",
            "delay_ms",
            "dedup_key",
            "dedup_window_ms",
            "on_duplicate",
            "idempotency_key",
            "max_attempts",
            "lease_ms",
        ],
        _ => return None,
    })
}

/// The reads: `GET /api/v1` (the file and its queues), `GET /api/v1/stats`.
fn read(access: &dyn Access, rest: &str, asked: &Asked) -> Result<Option<Value>> {
    match rest {
        "" => {
            let reader = access.reader()?;
            let mut queues = vec![Value::Null];
            queues.extend(reader.queue_names()?.into_iter().map(Value::String));
            Ok(Some(json!({
                "api": API_VERSION,
                "file": reader.path().display().to_string(),
                "format": crate::FORMAT_VERSION,
                "queues": queues,
            })))
        }
        "workers" => access.workers().map(Some),
        "schedules" => {
            let reader = access.reader()?;
            let mut out = Vec::new();
            for q in readers(&reader, asked.param("queue"))? {
                for s in q.schedules()? {
                    out.push(json!(crate::json::ScheduleView::new(q.name(), &s)));
                }
            }
            Ok(Some(json!({ "schedules": out })))
        }
        "check" => {
            let reader = access.reader()?;
            Ok(Some(crate::json::check(&reader.check()?)))
        }
        "overview" => {
            let reader = access.reader()?;
            let number = |name: &'static str, default: u64| -> Result<u64> {
                asked.param(name).map_or(Ok(default), |v| {
                    v.parse().map_err(|_| invalid(name, "a whole number"))
                })
            };
            let since_ms = number("since_ms", 0)?;
            let dead = number("dead", 5)?;
            if dead > crate::json::OVERVIEW_DEAD_MAX as u64 {
                return Err(invalid(
                    "dead",
                    format!("at most {}", crate::json::OVERVIEW_DEAD_MAX),
                ));
            }
            let now_ms = crate::Clock::now_ms(&crate::SystemClock);
            let mut out = Vec::new();
            for q in readers(&reader, asked.param("queue"))? {
                out.push(crate::json::overview(&q, now_ms, since_ms, dead as usize)?);
            }
            Ok(Some(json!({ "now_ms": now_ms, "queues": out })))
        }
        "stats" => {
            let reader = access.reader()?;
            let mut out = Vec::new();
            for q in readers(&reader, asked.param("queue"))? {
                out.push(crate::json::stats(&q)?);
            }
            Ok(Some(json!({ "queues": out })))
        }
        "jobs" => {
            let state = asked
                .param("state")
                .and_then(JobState::from_name)
                .ok_or_else(|| {
                    invalid(
                        "state",
                        "one of ready, scheduled, leased, dead, completed, cancelled",
                    )
                })?;
            let limit = match asked.param("limit") {
                None => LIST_LIMIT_DEFAULT,
                Some(text) => text
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=LIST_LIMIT_MAX).contains(n))
                    .ok_or_else(|| {
                        invalid("limit", format!("1 to {LIST_LIMIT_MAX} jobs per page"))
                    })?,
            };
            let after = asked.param("after").map(JobCursor::parse).transpose()?;
            let before = asked.param("before").map(JobCursor::parse).transpose()?;
            let backward = match asked.param("order") {
                None | Some("asc") => before.is_some(),
                Some("desc") => true,
                Some(_) => return Err(invalid("order", "asc or desc")),
            };
            if backward && after.is_some() {
                return Err(invalid(
                    "after",
                    "a page read backward starts before a cursor (before=), not after one",
                ));
            }
            let reader = access.reader()?;
            let q = match asked.param("queue") {
                None | Some(super::DEFAULT_QUEUE) => reader.default_queue(),
                Some(name) => reader.existing(name)?,
            };
            let page = if backward {
                q.jobs_before(state, before, limit)?
            } else {
                q.jobs(state, after, limit)?
            };
            let jobs: Vec<Value> = page
                .jobs
                .iter()
                .map(|info| view(q.name(), info, None))
                .collect();
            Ok(Some(json!({
                "queue": q.name(),
                "jobs": jobs,
                "next": page.next.map(|c| c.to_text()),
                "first": page.first.map(|c| c.to_text()),
            })))
        }
        _ => {
            let Some(id) = rest.strip_prefix("jobs/") else {
                return Ok(None);
            };
            let id = job_id(id)?;
            let reader = access.reader()?;
            for q in readers(&reader, asked.param("queue"))? {
                let Some(info) = q.job(id)? else {
                    continue;
                };
                let payload = match asked.param("payload") {
                    Some("1" | "true") => {
                        if info.payload_bytes > INLINE_PAYLOAD_MAX {
                            return Err(invalid(
                                "payload",
                                format!(
                                    "the payload is {} bytes: above {INLINE_PAYLOAD_MAX} it is \
                                     read from {ROOT}/jobs/{id}/payload",
                                    info.payload_bytes
                                ),
                            ));
                        }
                        q.payload(id)?
                    }
                    _ => None,
                };
                return Ok(Some(view(q.name(), &info, payload.as_deref())));
            }
            Err(Error::JobNotFound { job_id: id })
        }
    }
}

/// `GET /api/v1/jobs/ID/payload`: the payload's bytes.
fn payload(access: &dyn Access, id: &str, asked: &Asked) -> Result<Vec<u8>> {
    let id = job_id(id)?;
    let reader = access.reader()?;
    for q in readers(&reader, asked.param("queue"))? {
        if let Some(bytes) = q.payload(id)? {
            return Ok(bytes);
        }
    }
    Err(Error::JobNotFound { job_id: id })
}

/// A job id in a path.
fn job_id(text: &str) -> Result<JobId> {
    text.parse()
        .map(JobId)
        .map_err(|_| invalid("id", "a job id (a decimal number)"))
}

/// A job as `leaseq show --json` writes it ([`JobView`]), with its payload if given.
fn view(queue: Option<&str>, info: &JobInfo, payload: Option<&[u8]>) -> Value {
    serde_json::to_value(JobView::new(queue, info, payload)).unwrap_or(Value::Null)
}

/// The readers `selector` covers ([`selected`]'s order).
fn readers(reader: &Reader, selector: Option<&str>) -> Result<Vec<Reader>> {
    match selector {
        Some(super::DEFAULT_QUEUE) => Ok(vec![reader.default_queue()]),
        Some(name) => Ok(vec![reader.existing(name)?]),
        None => {
            let mut out = vec![reader.default_queue()];
            for name in reader.queue_names()? {
                out.push(reader.existing(&name)?);
            }
            Ok(out)
        }
    }
}

/// The HTTP status of an error a read or an action met.
pub(crate) fn status_of(e: &Error) -> u16 {
    match e {
        Error::JobNotFound { .. }
        | Error::QueueNotFound { .. }
        | Error::ScheduleNotFound { .. } => 404,
        Error::InvalidState { .. }
        | Error::KeyHeld { .. }
        | Error::ScheduleExists { .. }
        | Error::AlreadyOpen { .. }
        | Error::HeldExclusively { .. }
        | Error::Busy { .. } => 409,
        Error::InvalidOption { .. } | Error::PayloadTooLarge { .. } | Error::KeyTooLong { .. } => {
            400
        }
        // The app closed its queue (shutting down), or the queue is full: try again later.
        Error::Closed | Error::QueueFull { .. } => 503,
        // The file is within its disk reserve (WebDAV's Insufficient Storage).
        Error::StorageFull { .. } => 507,
        Error::Remote { status, .. } => *status,
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => 404,
        _ => 500,
    }
}

/// An error as the API answers it: `{"error":{"kind":K,"message":M,…}}`, with the fields
/// of the kinds a caller acts on (`job_id`, `name`, `actual`, `expected` and
/// `expected_states`, `holder`, `field`,
/// `size_bytes`, `limit_bytes`, `detail`).
pub(crate) fn error_json(e: &Error) -> Value {
    let message = e.to_string();
    let (kind, fields) = match e {
        Error::JobNotFound { job_id } => ("job_not_found", json!({ "job_id": job_id.0 })),
        Error::QueueNotFound { name } => ("queue_not_found", json!({ "name": name })),
        Error::ScheduleNotFound { name } => ("schedule_not_found", json!({ "name": name })),
        Error::ScheduleExists { name } => ("schedule_exists", json!({ "name": name })),
        Error::InvalidState {
            job_id,
            actual,
            expected,
        } => (
            "invalid_state",
            json!({
                "job_id": job_id.0,
                "actual": actual.as_str(),
                "expected": expected,
                "expected_states": expected_states(expected),
            }),
        ),
        Error::KeyHeld { job_id, holder } => (
            "key_held",
            json!({ "job_id": job_id.0, "holder": holder.0 }),
        ),
        Error::InvalidOption { field, .. } => ("invalid_option", json!({ "field": field })),
        Error::PayloadTooLarge {
            size_bytes,
            limit_bytes,
        } => (
            "payload_too_large",
            json!({ "size_bytes": size_bytes, "limit_bytes": limit_bytes }),
        ),
        Error::KeyTooLong { field, .. } => ("key_too_long", json!({ "field": field })),
        Error::Busy { detail } => ("busy", json!({ "detail": detail })),
        Error::QueueFull {
            queue,
            jobs,
            bytes,
            max_jobs,
            max_bytes,
            ..
        } => (
            "queue_full",
            json!({ "queue": queue, "jobs": jobs, "bytes": bytes, "max_jobs": max_jobs, "max_bytes": max_bytes }),
        ),
        Error::StorageFull {
            available_bytes,
            file_bytes,
            reserve_bytes,
            file_bytes_max,
            needs_bytes,
            ..
        } => (
            "storage_full",
            json!({
                "available_bytes": available_bytes,
                "file_bytes": file_bytes,
                "reserve_bytes": reserve_bytes,
                "file_bytes_max": file_bytes_max,
                "needs_bytes": needs_bytes,
            }),
        ),
        Error::Closed => ("closed", json!({})),
        Error::Corrupted { .. } => ("corrupted", json!({})),
        Error::CommitFailed { .. } => ("commit_failed", json!({})),
        Error::Remote { kind, .. } => (kind.as_str(), json!({})),
        _ => ("failed", json!({})),
    };
    let mut error = fields;
    error["kind"] = json!(kind);
    error["message"] = json!(message);
    json!({ "error": error })
}

/// The states an `InvalidState`'s prose names (`"Dead, Completed or Cancelled"`), as the
/// API names states (`["dead","completed","cancelled"]`), for scripts.
fn expected_states(expected: &str) -> Vec<&'static str> {
    expected
        .split([',', ' '])
        .filter_map(|word| JobState::from_name(&word.to_ascii_lowercase()))
        .map(JobState::as_str)
        .collect()
}

/// An error the API makes itself (not leaseq's).
pub(crate) fn error_reply(status: u16, kind: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &json!({ "error": { "kind": kind, "message": message } }),
    )
}

/// The control channel: the API alone, for bearers of its token, on the app's handle.
pub(crate) struct ControlApp {
    pub(crate) held: Held,
    /// The tokens admitted: the control file's, and one the app chose.
    pub(crate) tokens: Vec<String>,
    pub(crate) pools: Vec<PoolMonitor>,
    /// The queue file and what its control file says: removed once the app closes the
    /// queue, so other processes open the file themselves.
    pub(crate) control_file: (PathBuf, super::file::Found),
}

impl ControlApp {
    fn admitted(&self, headers: &HashMap<String, String>) -> bool {
        self.tokens.iter().any(|t| bearer_is(headers, t))
    }

    /// Lets go of the app's handle, and removes the control file, once the app closed the
    /// queue.
    fn release_if_closed(&self) {
        self.held.release_if_closed();
        if self.held.is_released() {
            let (path, found) = &self.control_file;
            super::file::remove(path, found);
        }
    }
}

impl Access for ControlApp {
    fn reader(&self) -> Result<Reader> {
        self.held.reader()
    }

    fn act(&self, action: &Action) -> Result<Value> {
        self.held.act(action)
    }

    fn workers(&self) -> Result<Value> {
        Ok(workers_json(&self.pools))
    }
}

impl Handler for ControlApp {
    fn name(&self) -> &'static str {
        "control"
    }

    fn answer(&self, asked: &Asked) -> Reply {
        self.release_if_closed();
        if !self.admitted(&asked.headers) {
            let mut reply = error_reply(
                401,
                "unauthorized",
                "no access token, or a wrong one: send 'Authorization: Bearer <token>' with \
                 the token of the control file beside the queue file (<file>-control)",
            );
            reply
                .headers
                .push(("WWW-Authenticate", "Bearer realm=\"leaseq control\"".into()));
            return reply;
        }
        if asked.path != ROOT && !asked.path.starts_with(&format!("{ROOT}/")) {
            return error_reply(
                404,
                "no_route",
                &format!("the API's routes are under {ROOT}/"),
            );
        }
        answer(self, asked)
    }

    fn idle(&self) {
        self.release_if_closed();
    }

    fn refusal(&self, status: u16, kind: &'static str, message: &str) -> Reply {
        error_reply(status, kind, message)
    }

    fn body_bytes_max(&self, method: &str, path: &str, headers: &HashMap<String, String>) -> usize {
        if carries_payload(method, path) && self.admitted(headers) {
            crate::PAYLOAD_BYTES_MAX_CAP
        } else {
            BODY_BYTES_MAX
        }
    }
}

#[cfg(test)]
mod tests {
    //! The statuses and kinds of the two "no room" refusals (the control module's doc
    //! promises them): a full queue is 503 `queue_full`, a storage-full file 507
    //! `storage_full`, each with the fields a caller acts on.

    use super::*;

    #[test]
    fn full_refusals_answer_their_status_kind_and_fields() {
        let queue_full = Error::QueueFull {
            queue: "telemetry".into(),
            jobs: 10,
            bytes: 100,
            max_jobs: Some(10),
            max_bytes: None,
            needs_jobs: 1,
            needs_bytes: 10,
        };
        assert_eq!(status_of(&queue_full), 503);
        let j = error_json(&queue_full);
        assert_eq!(j["error"]["kind"], "queue_full", "{j}");
        assert_eq!(j["error"]["max_jobs"], 10, "{j}");
        let storage_full = Error::StorageFull {
            available_bytes: 1,
            file_bytes: 2,
            reusable_bytes: 0,
            reserve_bytes: 3,
            file_bytes_max: Some(4),
            needs_bytes: 0,
        };
        assert_eq!(status_of(&storage_full), 507);
        let j = error_json(&storage_full);
        assert_eq!(j["error"]["kind"], "storage_full", "{j}");
        assert_eq!(
            (&j["error"]["reserve_bytes"], &j["error"]["file_bytes_max"]),
            (&3.into(), &4.into()),
            "{j}"
        );
    }
}
