//! What the dashboard answers: access (token, host, cross-site checks), routing, actions.
//! The HTTP connections themselves are `server.rs`'s.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;

use super::invalid;
use super::pages::{self, Page};
use super::view::Target;
use crate::control::api;
use crate::control::server::{Asked, BODY_BYTES_MAX, Handler, Reply};
use crate::control::{Action, DEFAULT_QUEUE};
use crate::{Error, JobId};
/// Jobs one bulk action may name (a page's worth, and then some).
const BULK_MAX: usize = 1000;
/// The reason [`Queue::cancel`](crate::Queue::cancel) records for a cancel from the dashboard.
pub(super) const CANCEL_REASON: &str = "cancelled from the dashboard";

const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

/// The dashboard's state on its thread.
pub(super) struct App {
    pub(super) target: Target,
    pub(super) read_only: bool,
    /// The access token (cookie, bearer header, or `?token=` once).
    token: String,
    /// The token every action's form carries, known to the dashboard's own pages only.
    pub(super) csrf: String,
    /// The cookie's name: cookies are not told apart by port, so two dashboards of one host
    /// would otherwise overwrite each other's.
    cookie: String,
    /// `Host` values accepted (empty: any, for a server allowed off loopback).
    hosts: Vec<String>,
    /// The worker pools the app showed ([`Dashboard::pool`](super::Dashboard::pool)).
    pools: Vec<crate::PoolMonitor>,
    /// A leased job that has run longer is marked stalled
    /// ([`Dashboard::stalled_after`](super::Dashboard::stalled_after)), in ms.
    pub(super) stalled_after_ms: Option<u64>,
}

impl App {
    pub(super) fn new(
        target: Target,
        read_only: bool,
        allow_remote: bool,
        token: String,
        csrf: String,
        addr: SocketAddr,
        pools: Vec<crate::PoolMonitor>,
    ) -> App {
        let port = addr.port();
        let hosts = if allow_remote || addr.ip().is_unspecified() {
            Vec::new()
        } else {
            let mut hosts = vec![addr.to_string(), format!("localhost:{port}")];
            if addr.ip().is_loopback() && addr.is_ipv4() {
                hosts.push(format!("[::1]:{port}"));
            } else if addr.ip().is_loopback() {
                hosts.push(format!("127.0.0.1:{port}"));
            }
            hosts
        };
        App {
            target,
            read_only,
            token,
            csrf,
            cookie: format!("leaseq_dashboard_{port}"),
            hosts,
            pools,
            stalled_after_ms: None,
        }
    }

    /// The answer to one request.
    pub(super) fn answer(&self, asked: &Asked) -> Reply {
        self.target.release_if_closed();
        match (asked.method.as_str(), asked.path.as_str()) {
            // Shared by every page, holding no data: served without the token.
            ("GET" | "HEAD", "/static/dashboard.css") => {
                Reply::with(200, "text/css; charset=utf-8", CSS.as_bytes().to_vec())
            }
            ("GET" | "HEAD", "/static/dashboard.js") => Reply::with(
                200,
                "text/javascript; charset=utf-8",
                JS.as_bytes().to_vec(),
            ),
            _ if asked.path == api::ROOT || asked.path.starts_with("/api/v1/") => self.api(asked),
            _ => match self.refused(asked) {
                Some(reply) => reply,
                None => {
                    // A file's pages and actions take turns ([`Target::turn`]).
                    let _turn = self.target.turn();
                    self.route(asked)
                }
            },
        }
    }

    /// The answer to a request that may not go on: a `Host` not served, or no access token.
    /// A valid `?token=` is answered with its cookie and the same URL without it.
    fn refused(&self, asked: &Asked) -> Option<Reply> {
        if !self.hosts.is_empty() {
            let host = asked.header("host").unwrap_or("");
            if !self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
                return Some(Reply::text(
                    403,
                    format!("403: host {host:?} is not this dashboard's address"),
                ));
            }
        }
        if let Some(given) = asked.query.get("token") {
            if !crate::control::same(given, &self.token) {
                return Some(unauthorized());
            }
            let mut rest: Vec<(&String, &String)> =
                asked.query.iter().filter(|(k, _)| *k != "token").collect();
            rest.sort();
            let mut to = known_page(&asked.path).to_string();
            if !rest.is_empty() {
                to.push('?');
                to.push_str(&encode(rest.into_iter()));
            }
            let mut reply = Reply::redirect(to);
            reply.headers.push((
                "Set-Cookie",
                format!(
                    "{}={}; Path=/; HttpOnly; SameSite=Strict",
                    self.cookie, self.token
                ),
            ));
            return Some(reply);
        }
        let bearer = asked
            .header("authorization")
            // The scheme's name is case-insensitive (RFC 9110).
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
            .is_some_and(|t| crate::control::same(t.trim(), &self.token));
        let cookie = asked.header("cookie").is_some_and(|cookies| {
            cookies.split(';').any(|c| {
                c.trim().split_once('=').is_some_and(|(name, value)| {
                    name == self.cookie && crate::control::same(value, &self.token)
                })
            })
        });
        if bearer || cookie {
            None
        } else {
            Some(unauthorized())
        }
    }

    /// A request of the JSON API (`leaseq::control`'s, version 1): for bearers of the token
    /// only (no cookie: no page of another site can make a browser send it), actions refused
    /// in read-only mode.
    fn api(&self, asked: &Asked) -> Reply {
        if !api::bearer_is(&asked.headers, &self.token) {
            return api::error_reply(
                401,
                "unauthorized",
                "no access token, or a wrong one: send 'Authorization: Bearer <token>' with \
                 the dashboard's token",
            );
        }
        if self.read_only && asked.method == "POST" {
            return api::error_reply(403, "read_only", "this dashboard is read-only");
        }
        let _turn = self.target.turn();
        api::answer(self, asked)
    }

    fn route(&self, asked: &Asked) -> Reply {
        let get = matches!(asked.method.as_str(), "GET" | "HEAD");
        let page = match asked.path.as_str() {
            "/" if get => pages::overview(self, asked),
            "/jobs" if get => pages::jobs(self, asked),
            "/job" if get => pages::job(self, asked),
            "/schedules" if get => pages::schedules(self, asked),
            "/search" if get => pages::search(self, asked),
            "/payload" if get => return self.payload(asked),
            "/api/overview" if get => {
                return match pages::overview_json(self) {
                    Ok(json) => Reply::with(200, "application/json", json.into_bytes()),
                    Err(e) => Reply::text(status_of(&e), format!("{}: {e}", status_of(&e))),
                };
            }
            "/action" if asked.method == "POST" => return self.action(asked),
            "/action" => {
                let mut reply = Reply::text(405, "405: actions are POST forms");
                reply.headers.push(("Allow", "POST".into()));
                return reply;
            }
            "/" | "/jobs" | "/job" | "/schedules" | "/search" | "/payload" | "/api/overview" => {
                let mut reply = Reply::text(405, "405: pages are read with GET");
                reply.headers.push(("Allow", "GET, HEAD".into()));
                return reply;
            }
            _ => return Reply::text(404, format!("404: no page {}", asked.path)),
        };
        match page {
            Ok(Page { html }) => Reply::html(200, html),
            Err(e) => Reply::html(status_of(&e), pages::error_page(self, status_of(&e), &e)),
        }
    }

    /// The raw payload, as a download.
    fn payload(&self, asked: &Asked) -> Reply {
        let found = pages::job_id(asked).and_then(|id| {
            let view = self.target.view(asked.param("q"))?;
            view.payload(id)?.ok_or(Error::JobNotFound { job_id: id })
        });
        match found {
            Ok(bytes) => {
                let mut reply = Reply::with(200, "application/octet-stream", bytes);
                let id = asked.param("id").unwrap_or("job");
                let id: String = id.chars().filter(char::is_ascii_digit).collect();
                reply.headers.push((
                    "Content-Disposition",
                    format!("attachment; filename=\"job-{id}.bin\""),
                ));
                reply
            }
            Err(e) => Reply::html(status_of(&e), pages::error_page(self, status_of(&e), &e)),
        }
    }

    /// A `POST /action`: checked for its origin and its form token, then one queue call.
    fn action(&self, asked: &Asked) -> Reply {
        if self.read_only {
            return Reply::text(403, "403: this dashboard is read-only");
        }
        if let Some(origin) = asked.header("origin") {
            let host = asked.header("host").unwrap_or("");
            let own = ["http://", "https://"]
                .iter()
                .any(|scheme| origin.eq_ignore_ascii_case(&format!("{scheme}{host}")));
            if !own {
                return Reply::text(403, format!("403: a request from {origin:?} may not act"));
            }
        }
        if asked
            .header("sec-fetch-site")
            .is_some_and(|site| site != "same-origin" && site != "none")
        {
            return Reply::text(403, "403: a cross-site request may not act");
        }
        let form: HashMap<String, String> =
            form_urlencoded::parse(&asked.body).into_owned().collect();
        if !form
            .get("csrf")
            .is_some_and(|t| crate::control::same(t, &self.csrf))
        {
            return Reply::text(
                403,
                "403: the form's token is missing or wrong: act from the dashboard's own pages",
            );
        }
        let back = form.get("back").map(String::as_str).unwrap_or("/");
        let done = match form.get("op").and_then(|op| op.strip_prefix("bulk_")) {
            Some(op) => {
                let ids: Vec<String> = form_urlencoded::parse(&asked.body)
                    .filter(|(k, _)| k == "id")
                    .map(|(_, v)| v.into_owned())
                    .collect();
                self.act_on_each(&form, op, &ids)
            }
            None => self.act(&form),
        };
        match done {
            Ok(done) => Reply::redirect(back_to(back, &done)),
            Err(e) => Reply::html(status_of(&e), pages::error_page(self, status_of(&e), &e)),
        }
    }

    /// Runs `op` (`retry`, `cancel`, `remove`) on each job the form selected, one commit
    /// each, and says how many were done and why the others were refused (a refusal does
    /// not stop the rest; a failure of the storage does).
    fn act_on_each(
        &self,
        form: &HashMap<String, String>,
        op: &str,
        ids: &[String],
    ) -> crate::Result<String> {
        if ids.is_empty() {
            return Err(invalid("id", "select one or more jobs first"));
        }
        if ids.len() > BULK_MAX {
            return Err(invalid("id", format!("at most {BULK_MAX} jobs at once")));
        }
        if !matches!(op, "retry" | "cancel" | "remove") {
            return Err(invalid(
                "op",
                format!(
                    "bulk_{:?} is not a bulk action (bulk_retry, bulk_cancel, bulk_remove)",
                    pages::short(op, 40)
                ),
            ));
        }
        let queue = form_queue(form);
        let mut parsed = Vec::with_capacity(ids.len());
        for text in ids {
            let id = text
                .parse()
                .map(JobId)
                .map_err(|_| invalid("id", "a job id (a decimal number)"))?;
            parsed.push(id);
        }
        let actions: Vec<Action> = parsed
            .into_iter()
            .map(|id| {
                let queue = queue.clone();
                match op {
                    "retry" => Action::Retry { id, queue },
                    "cancel" => Action::Cancel {
                        id,
                        queue,
                        reason: CANCEL_REASON.into(),
                    },
                    _ => Action::Remove { id, queue },
                }
            })
            .collect();
        let (mut done, mut refused) = (0usize, Vec::new());
        for result in self.target.act_each(&actions) {
            match result {
                Ok(_) => done += 1,
                Err(e) if status_of(&e) < 500 => refused.push(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        let verb = match op {
            "retry" => "run again",
            "cancel" => "cancelled",
            _ => "removed",
        };
        let mut notice = format!("{done} jobs {verb}");
        if !refused.is_empty() {
            let _ = write!(
                notice,
                "; {} refused: {}",
                refused.len(),
                refused
                    .iter()
                    .take(3)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            if refused.len() > 3 {
                notice.push_str("; …");
            }
        }
        tracing::info!(
            op,
            done,
            refused = refused.len(),
            "leaseq: dashboard bulk action"
        );
        Ok(notice)
    }

    /// Runs the action a form names ([`Action`], as the API's); returns what was done, for
    /// the notice.
    fn act(&self, form: &HashMap<String, String>) -> crate::Result<String> {
        let queue = form_queue(form);
        let op = form.get("op").map(String::as_str).unwrap_or("");
        let id = || -> crate::Result<JobId> {
            form.get("id")
                .and_then(|id| id.parse().ok())
                .map(JobId)
                .ok_or_else(|| invalid("id", "a job id (a decimal number)"))
        };
        let action = match op {
            "retry" => Action::Retry { id: id()?, queue },
            "remove" => Action::Remove { id: id()?, queue },
            "cancel" => Action::Cancel {
                id: id()?,
                queue,
                reason: CANCEL_REASON.into(),
            },
            "promote" => Action::Promote { id: id()?, queue },
            "retry_dead" => Action::RequeueDeadAll { queue },
            "remove_dead" => Action::Purge {
                queue,
                state: crate::JobState::Dead,
            },
            "remove_schedule" | "pause_schedule" | "resume_schedule" | "trigger_schedule" => {
                let name = form
                    .get("name")
                    .cloned()
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| invalid("name", "the schedule's name"))?;
                match op {
                    "remove_schedule" => Action::RemoveSchedule { queue, name },
                    "pause_schedule" => Action::PauseSchedule { queue, name },
                    "resume_schedule" => Action::ResumeSchedule { queue, name },
                    _ => Action::TriggerSchedule { queue, name },
                }
            }
            "pause" => Action::Pause { queue },
            "resume" => Action::Resume { queue },
            other => {
                return Err(invalid(
                    "op",
                    format!(
                        "{:?} is not an action (retry, remove, cancel, promote, retry_dead, \
                         remove_dead, remove_schedule, pause_schedule, resume_schedule, \
                         trigger_schedule, pause, resume, bulk_retry, bulk_cancel, bulk_remove)",
                        pages::short(other, 40)
                    ),
                ));
            }
        };
        let done = self.target.act(&action)?;
        let first = &done["queues"][0];
        let notice = match &action {
            Action::Retry { id, .. } => format!("job {id} runs again: ready"),
            Action::Remove { id, .. } => format!("job {id} removed"),
            Action::Cancel { id, .. } => {
                format!(
                    "job {id} cancelled ({})",
                    done["was"].as_str().unwrap_or("?")
                )
            }
            Action::Promote { id, .. } => format!("job {id} promoted: ready now"),
            Action::RequeueDeadAll { .. } => {
                format!(
                    "{} dead jobs run again",
                    first["count"].as_u64().unwrap_or(0)
                )
            }
            Action::Purge { .. } => {
                format!("{} dead jobs removed", first["count"].as_u64().unwrap_or(0))
            }
            Action::RemoveSchedule { name, .. } => format!("schedule {name:?} removed"),
            // A schedule's action answers for the one schedule (no per-queue list).
            Action::PauseSchedule { name, .. } if done["changed"] == true => {
                format!("schedule {name:?} paused")
            }
            Action::PauseSchedule { name, .. } => format!("schedule {name:?} was already paused"),
            Action::ResumeSchedule { name, .. } if done["changed"] == true => {
                format!("schedule {name:?} resumed")
            }
            Action::ResumeSchedule { name, .. } => format!("schedule {name:?} was not paused"),
            Action::TriggerSchedule { name, .. } => match done["id"].as_u64() {
                Some(id) => format!("schedule {name:?} enqueued job {id}"),
                None => format!("schedule {name:?} enqueued a job"),
            },
            Action::Pause { .. } if first["changed"] == true => "queue paused".into(),
            Action::Pause { .. } => "queue was already paused".into(),
            Action::Resume { .. } if first["changed"] == true => "queue resumed".into(),
            _ => "queue was not paused".into(),
        };
        tracing::info!(op, ?action, "leaseq: dashboard action");
        Ok(notice)
    }
}

impl api::Access for App {
    fn reader(&self) -> crate::Result<crate::Reader> {
        self.target.view(None)
    }

    fn act(&self, action: &Action) -> crate::Result<serde_json::Value> {
        self.target.act(action)
    }

    /// The app's pools; for a file, the pools of the channel of the app that has it open
    /// (none when no channel answers).
    fn workers(&self) -> crate::Result<serde_json::Value> {
        let mut value = api::workers_json(&self.pools);
        // The app's pools when its channel answers at once; a page is never held up or
        // failed by a channel that does not (a control file this user may not read, an app
        // gone or hung).
        if let Some(path) = self.target.file_path()
            && let Ok(Some(client)) = crate::control::Client::for_file(path)
            && let Ok(theirs) = client
                .timeout(std::time::Duration::from_secs(2))
                .get("workers")
            && let (Some(mine), Some(theirs)) =
                (value["pools"].as_array_mut(), theirs["pools"].as_array())
        {
            mine.extend(theirs.iter().cloned());
        }
        Ok(value)
    }
}

impl Handler for App {
    fn name(&self) -> &'static str {
        "dashboard"
    }

    fn answer(&self, asked: &Asked) -> Reply {
        App::answer(self, asked)
    }

    fn idle(&self) {
        self.target.release_if_closed();
    }

    fn body_bytes_max(&self, method: &str, path: &str, headers: &HashMap<String, String>) -> usize {
        if !self.read_only
            && api::carries_payload(method, path)
            && api::bearer_is(headers, &self.token)
        {
            crate::PAYLOAD_BYTES_MAX_CAP
        } else {
            BODY_BYTES_MAX
        }
    }
}

/// The queue a form names, as an [`Action`]'s selector: its `q`, or the default queue when
/// it has none (a form always acts on one queue).
fn form_queue(form: &HashMap<String, String>) -> Option<String> {
    Some(
        form.get("q")
            .map(String::as_str)
            .filter(|q| !q.is_empty())
            .unwrap_or(DEFAULT_QUEUE)
            .to_string(),
    )
}

/// The HTTP status of an error a page or an action met (the API's).
pub(super) fn status_of(e: &Error) -> u16 {
    api::status_of(e)
}

fn unauthorized() -> Reply {
    let mut reply = Reply::text(
        401,
        "401: no access token, or a wrong one. Open the URL the dashboard printed when it \
         started (it ends in ?token=...), or send 'Authorization: Bearer <token>'.",
    );
    reply.headers.push((
        "WWW-Authenticate",
        "Bearer realm=\"leaseq dashboard\"".into(),
    ));
    reply
}

/// The dashboard's own page `path` names, else `/`: a redirect never leaves the dashboard.
fn known_page(path: &str) -> &'static str {
    ["/jobs", "/job", "/schedules", "/search"]
        .into_iter()
        .find(|p| *p == path)
        .unwrap_or("/")
}

/// Where an action's answer sends the browser: the page `back` names (one of the
/// dashboard's, its query decoded and encoded again, so nothing else reaches the
/// `Location` header), with `notice`.
fn back_to(back: &str, notice: &str) -> String {
    let (path, query) = back.split_once('?').unwrap_or((back, ""));
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if matches!(
            &*k,
            "q" | "state" | "after" | "before" | "key" | "id" | "view"
        ) {
            out.append_pair(&k, &v);
        }
    }
    out.append_pair("notice", notice);
    format!("{}?{}", known_page(path), out.finish())
}

/// `key=value&…`, form-encoded.
pub(super) fn encode<'a>(pairs: impl Iterator<Item = (&'a String, &'a String)>) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        out.append_pair(k, v);
    }
    out.finish()
}
