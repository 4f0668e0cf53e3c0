//! A running app's control channel (feature `control`): other processes act on the app's
//! queue file while the app holds it, through the app, as River UI's and Bull Board's JSON
//! APIs act on their queues. The app opts in with one call ([`serve`]); the `leaseq` tool's
//! write commands and `leaseq dashboard FILE` then work beside it, and scripts use the JSON
//! API (below) or a [`Client`].
//!
//! ```no_run
//! # fn main() -> leaseq::Result<()> {
//! let queue = leaseq::Queue::open("jobs.leaseq")?;
//! let channel = leaseq::control::serve(&queue)?;
//! // `leaseq retry jobs.leaseq 1025` in a shell now asks this app to retry job 1025.
//! // ... the app runs; dropping `channel` (or closing the queue) stops it.
//! # drop(channel); Ok(()) }
//! ```
//!
//! # How it works
//! - **One writer.** The app carries every action out with its own handle, in its own
//!   commits, with the same checks and errors as its own calls: the channel never makes a
//!   second writer of the file. An action is an [`Action`], the same one
//!   [`Action::apply`] runs in-process.
//! - **Found through a file.** [`serve`] listens on `127.0.0.1` at a port the system picks
//!   and writes the control file `<queue file>-control` beside the queue file
//!   ([`control_file_path`]): the address, an access token (128 random bits, new at every
//!   start; [`Control::token`] adds one of the app's choosing for its scripts) and the
//!   app's process id, as JSON. The channel removes it once the app closes its queue, and
//!   a [`Channel`] dropped or stopped removes it. An app that was killed leaves it behind:
//!   the next [`serve`] replaces it, and a [`Client`] finds nobody answering there
//!   (`ConnectionRefused`).
//! - **Admitted: the app's user, and the queue file's group if it may write the file.** On
//!   Unix the control file is readable by its owner (the app's user), and by the queue
//!   file's group when that group may read and write the queue file (and the app's user
//!   belongs to it); by nobody else. On Windows it inherits the access
//!   list of its directory, as the queue file and its journal do: keep a queue file in a
//!   directory only its users can read. Every request carries the token (`Authorization:
//!   Bearer <token>`); one without it, or with another, is answered `401` and reads and
//!   writes nothing.
//! - **Bounded.** At most 128 connections, 8 KiB of request head read within 10 s, a body of
//!   16 KiB within 10 s (an enqueue's payload, from a caller holding the token: up to
//!   [`PAYLOAD_BYTES_MAX_CAP`](crate::PAYLOAD_BYTES_MAX_CAP)), 5 minutes per connection, 4
//!   requests answered at once (more wait their turn). The server is hyper's HTTP/1.1 on a
//!   tokio runtime of the channel's own, on one thread: an app need not run tokio.
//! - **Let go at close.** Once the app closes its queue ([`Queue::close`], a
//!   [`Queue::shutdown`] starting), the channel drops its handle within 100 ms (so the
//!   shutdown can release the file) and answers `503` (`closed`).
//!
//! # The JSON API, version 1
//! Under `/api/v1`, with `Authorization: Bearer <token>`; answers are JSON objects. A queue
//! is named in JSON by its name, `null` for the default queue; in a query, `queue=NAME`, or
//! `queue=(default)` ([`DEFAULT_QUEUE`]) for the default queue, and no `queue` for every
//! queue (an action on one job looks for it in each).
//!
//! | request | does | answers |
//! |---|---|---|
//! | `GET /api/v1` | the file | `{"api":1,"file":PATH,"format":N,"queues":[null,"mail",…]}` |
//! | `GET /api/v1/workers` | the app's worker pools given to [`Control::pool`] | `{"pools":[{"name":N,"queue":Q,"threads":N,"busy":N,"idle":N,"state":"running"\|"stopping"\|"gone","stats":{"jobs":N,"acked":N,"retried":N,"dead":N,"timed_out":N,"heartbeats":N,"last_heartbeat_ms":MS\|null,"heartbeats_lost":N,"errors":N,…}},…]}` |
//! | `GET /api/v1/schedules[?queue=Q]` | [`Queue::schedules`] of each queue, as `leaseq schedules --json` ([`crate::json::ScheduleView`]) | `{"schedules":[{"queue":Q,"name":N,"timing":{..},"next_due_ms":MS,…,"paused_ms":MS\|null},…]}` |
//! | `GET /api/v1/overview[?queue=Q&since_ms=MS&dead=N]` | each queue at a glance, as `leaseq watch` reads it ([`crate::json::overview`]): its counts, the longest wait of a ready job, whether the rate limit holds ready jobs back, its minutes since `since_ms` (default 0: all kept) with run times, and its `N` latest dead letters (default 5, at most 1,000) | `{"now_ms":MS,"queues":[{"queue":Q,"stats":{..},"oldest_ready_ms":MS\|null,"rate_limited_until_ms":MS\|null,"minutes":[..],"latest_dead":[{"id":N,"died_ms":MS,"last_error":TEXT},…]},…]}` |
//! | `GET /api/v1/check` | [`Queue::check`] of the file, as `leaseq check --json` | `{"ok":B,"violations":[{"job_id":N\|null,"detail":TEXT},…]}` |
//! | `GET /api/v1/stats[?queue=Q]` | counts per queue | `{"queues":[{"queue":Q,"total":N,"ready":N,…},…]}`, each entry as a line of `leaseq stats --json` |
//! | `GET /api/v1/jobs?state=S[&queue=Q&after=CURSOR&limit=N]` | a page of one queue's jobs in a state (`queue` absent: the default queue), in [`Queue::jobs`]' order, `limit` 1 to 1000 (default 100); with `order=desc` or `before=CURSOR`, backward ([`Queue::jobs_before`]: newest first; not for `ready`) | `{"queue":Q,"jobs":[JOB,…],"next":CURSOR\|null,"first":CURSOR\|null}`: pass `next` as `after` (as `before` backward) for the next page, `first` the other way |
//! | `GET /api/v1/jobs/ID[?queue=Q&payload=1]` | one job, found in the selected queues; with `payload=1` its payload too (up to 1 MiB) | `JOB`, as `leaseq show --json` writes it ([`JobView`](crate::json::JobView)) |
//! | `GET /api/v1/jobs/ID/payload[?queue=Q]` | the payload's bytes | `application/octet-stream` |
//! | `POST /api/v1/jobs/ID/cancel[?queue=Q&reason=TEXT]` (or the reason as the body, UTF-8) | [`Action::Cancel`] | `{"id":ID,"queue":Q,"was":STATE}` |
//! | `POST /api/v1/jobs/ID/retry`, `…/promote`, `…/remove`, `…/requeue-dead` | [`Action::Retry`], [`Action::Promote`], [`Action::Remove`], [`Action::RequeueDead`] | `{"id":ID,"queue":Q}` |
//! | `POST /api/v1/requeue-dead[?queue=Q]` | [`Action::RequeueDeadAll`] | `{"queues":[{"queue":Q,"count":N},…]}` |
//! | `POST /api/v1/purge?state=S[&queue=Q]` | [`Action::Purge`] | `{"queues":[{"queue":Q,"count":N},…]}` |
//! | `POST /api/v1/pause[?queue=Q]`, `…/resume` | [`Action::Pause`], [`Action::Resume`] | `{"queues":[{"queue":Q,"changed":B},…]}` |
//! | `POST /api/v1/schedule-remove?name=NAME[&queue=Q]` | [`Action::RemoveSchedule`] | `{"queue":Q,"name":NAME}` |
//! | `POST /api/v1/schedule-pause?name=NAME[&queue=Q]`, `…/schedule-resume` | [`Action::PauseSchedule`], [`Action::ResumeSchedule`] | `{"queue":Q,"name":NAME,"changed":B}` |
//! | `POST /api/v1/schedule-trigger?name=NAME[&queue=Q]` | [`Action::TriggerSchedule`]: one instance now | `{"queue":Q,"name":NAME,"id":N}` |
//! | `POST /api/v1/limit?[queue=Q&]max_jobs=N&max_bytes=B&when_full=refuse\|block\|drop_oldest[&wait_ms=MS]` (a bound may be left out, not both; `wait_ms` with `block` only), `POST /api/v1/limit-remove[?queue=Q]` | [`Action::SetLimit`]: the queue's size limit set or removed ([`Queue::set_limit`]) | `{"queue":Q,"changed":B,"limit":{"max_jobs":N\|null,"max_bytes":N\|null,"when_full":W,"wait_ms":MS\|null}\|null}` |
//! | `POST /api/v1/prune` | [`Action::Prune`], with the app's retentions | `{"queues":[{"queue":Q,"applied":N,"dead":N,"dedup_windows":N},…]}` |
//! | `POST /api/v1/enqueue[?queue=Q&priority=P&delay_ms=MS&dedup_key=K&dedup_window_ms=MS&on_duplicate=keep\|replace\|debounce&idempotency_key=K&max_attempts=N&lease_ms=MS]`, the payload as the body | [`Action::Enqueue`] | `{"outcome":"new"\|"duplicate"\|"duplicate_dead"\|"replaced","id":N}` |
//!
//! An error is `{"error":{"kind":K,"message":TEXT,…}}` with the fields a caller acts on:
//! `404` for `job_not_found` (`job_id`), `queue_not_found` and `schedule_not_found` (`name`),
//! or `no_route`; `409` for `invalid_state` (`job_id`, `actual`, `expected` as text and
//! `expected_states` as a list of state names), `key_held`
//! (`job_id`, `holder`), `schedule_exists` and `busy`; `400` for `invalid_option` (`field`),
//! `payload_too_large` and `key_too_long`; `401` `unauthorized`; `405`
//! (`method_not_allowed`) for an action asked with GET, a read with POST, or another method;
//! `408` (`timeout`) and `413` (`too_large`) for a body too slow or over its bound; `503`
//! `closed` (or `stopping`), and `queue_full` (`queue`, `jobs`, `bytes`, `max_jobs`,
//! `max_bytes`: the queue's size limit refused the enqueue); `507` `storage_full`
//! (`available_bytes`, `file_bytes`, `reserve_bytes`, `file_bytes_max`, `needs_bytes`: the
//! file is within its disk reserve, enqueues refused while the drain goes on, or the call
//! alone needed `needs_bytes`, more than the room above it); `500` for a storage error (`failed`, `corrupted`,
//! `commit_failed`: a failed commit's outcome is unknown). A refused request wrote nothing.
//! A query parameter the route does not take (above), or one given twice, is refused, `400`
//! `invalid_option` with `field` `query`, naming it (and the ones the route takes): never
//! ignored or guessed (a typo of `delay_ms` would enqueue a job ready at once). A refused
//! enqueue makes no queue.
//! A request head over 8 KiB is refused by the HTTP layer with `431` and no JSON.
//!
//! A `queue=` left empty selects as if absent. An enqueue to a named queue that does not
//! exist creates it (as [`Queue::named`]). Worker pools appear in `GET /api/v1/workers` only
//! when given to [`Control::pool`].
//!
//! Version 1 grows only by new routes and new fields; a change to an existing one is
//! version 2, under `/api/v2`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Error, Queue, Result};

mod action;
pub(crate) mod api;
mod client;
mod file;
pub(crate) mod server;
mod token;

pub use action::{Action, DEFAULT_QUEUE, Enqueue};
pub use client::Client;
#[cfg(feature = "dashboard")]
pub(crate) use token::same;
pub use token::{API_VERSION, CONTROL_FILE_SUFFIX, TOKEN_BYTES_MAX, TOKEN_BYTES_MIN};
pub(crate) use token::{invalid, random_token, validate_token};

/// The control file of the queue file at `queue_path`: its path with
/// [`CONTROL_FILE_SUFFIX`] appended (`app.leaseq-control`).
pub fn control_file_path(queue_path: impl AsRef<Path>) -> PathBuf {
    file::path_of(queue_path.as_ref())
}

/// Opens the control channel of `queue`'s file with the defaults of [`Control`]: a random
/// token. Stops when the returned [`Channel`] is dropped.
///
/// # Errors
/// As [`Control::serve`].
pub fn serve(queue: &Queue) -> Result<Channel> {
    Control::new(queue).serve()
}

/// A control channel to be opened: the queue it acts on, and its token. Built with chained
/// setters, then [`Control::serve`].
#[must_use = "a Control serves nothing until Control::serve"]
pub struct Control {
    queue: Queue,
    token: Option<String>,
    pools: Vec<crate::PoolMonitor>,
}

impl Control {
    /// A channel acting on `queue`'s file (a clone is kept; any queue of the file is
    /// reached).
    pub fn new(queue: &Queue) -> Control {
        Control {
            queue: queue.clone(),
            token: None,
            pools: Vec::new(),
        }
    }

    /// Shows a worker pool in `GET /api/v1/workers` (and so in the workers view of
    /// `leaseq dashboard FILE`): its threads busy and idle and its counts
    /// ([`WorkerPool::monitor`](crate::WorkerPool::monitor)). Call once per pool.
    pub fn pool(mut self, monitor: crate::PoolMonitor) -> Control {
        self.pools.push(monitor);
        self
    }

    /// A token the channel accepts besides its own random one (the same across restarts,
    /// for the app's scripts): [`TOKEN_BYTES_MIN`] to [`TOKEN_BYTES_MAX`] bytes of ASCII
    /// letters, digits, `-` and `_`. The control file always holds the random one, so a
    /// control file read after the app stopped admits nobody to the next run.
    pub fn token(mut self, token: impl Into<String>) -> Control {
        self.token = Some(token.into());
        self
    }

    /// Listens on `127.0.0.1` (a port the system picks), writes the control file, and
    /// serves on a thread of its own until the [`Channel`] is dropped or stopped.
    ///
    /// # Errors
    /// - `InvalidOption` for a queue with no file (one opened on a backend: `"queue"`), or a
    ///   token outside the rules of [`Control::token`];
    /// - `Closed` if the queue's file is closed;
    /// - `Io` if no port can be listened on, the system gives no random bytes, no thread or
    ///   runtime can be started, or the control file cannot be written.
    pub fn serve(self) -> Result<Channel> {
        let Some(path) = self.queue.path().map(Path::to_path_buf) else {
            return Err(invalid(
                "queue",
                "a control channel is for a queue file (its control file sits beside it); \
                 this queue has none",
            ));
        };
        if self.queue.is_closed() {
            return Err(Error::Closed);
        }
        // The control file always holds a token of this channel's own: one read from a file
        // a killed app left behind opens nothing after a restart. A token the app chose
        // is accepted besides it, for its scripts.
        let token = random_token()?;
        let mut tokens = vec![token.clone()];
        if let Some(chosen) = self.token {
            tokens.push(validate_token(chosen)?);
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("the control channel cannot listen on 127.0.0.1: {e}"),
            ))
        })?;
        let local_addr = listener.local_addr()?;
        let found = file::Found {
            addr: local_addr,
            token: token.clone(),
            pid: std::process::id(),
        };
        let app = api::ControlApp {
            held: api::Held::new(&self.queue),
            tokens,
            pools: self.pools,
            control_file: (path.clone(), found.clone()),
        };
        let running = server::Running::start(listener, Arc::new(app))?;
        let control_file = match file::write(&path, &found) {
            Ok(control_file) => control_file,
            Err(e) => {
                let mut running = running;
                running.stop();
                return Err(e);
            }
        };
        tracing::info!(addr = %local_addr, file = %control_file.display(), "leaseq: control channel open");
        Ok(Channel {
            local_addr,
            token,
            queue_path: path,
            control_file,
            found,
            running,
        })
    }
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("path", &self.queue.path())
            .finish_non_exhaustive()
    }
}

/// A running control channel. Dropping it (or [`Channel::stop`]) stops it: the control file
/// is removed (if it is still this channel's), the port closes, and answers in progress get
/// up to 2 s to end.
#[must_use = "the control channel stops when its Channel is dropped"]
pub struct Channel {
    local_addr: SocketAddr,
    token: String,
    queue_path: PathBuf,
    control_file: PathBuf,
    found: file::Found,
    running: server::Running,
}

impl Channel {
    /// The address listened at (`127.0.0.1` and the port the system picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The channel's own access token, the one its control file holds (for
    /// `Authorization: Bearer`); random, new at every [`Control::serve`].
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The control file's path ([`control_file_path`]).
    pub fn control_file(&self) -> &Path {
        &self.control_file
    }

    /// Removes the control file, stops listening, closes the connections, and waits up to
    /// 2 s for the answers in progress; one still running then goes on in the background
    /// (an action may still commit) and `stop` returns.
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        file::remove(&self.queue_path, &self.found);
        self.running.stop();
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.end();
    }
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("local_addr", &self.local_addr)
            .field("control_file", &self.control_file)
            .finish_non_exhaustive()
    }
}
