//! A web dashboard for a queue file (feature `dashboard`), as Bull Board, Oban Web and River
//! UI are for their peers: per queue, the counts per state, the longest wait of a ready job
//! and the rates over the last 24 hours (a chart from [`Queue::metrics`], whole minutes
//! only); the jobs of each state with paging both ways (dead, completed and cancelled newest
//! first), a search by id or key in one state or all, progress as a percentage, leases whose
//! heartbeats stopped (or that run past [`Dashboard::stalled_after`]) marked stalled, how
//! long each leased job has run, and why a ready job waits (held behind its group's head,
//! paused, or rate limited until when); the run times of the last minutes (p50, p95); a
//! job's detail (payload as text, JSON or hex, its error history, attempts); the dead
//! letters with retry and remove, one, selected or all; pause and resume; cancel; the
//! schedules of every queue with run now, pause, resume and remove; the worker pools
//! ([`Dashboard::pool`]) with their last heartbeat.
//!
//! Served in the app, on the app's own handle ([`serve`], [`Dashboard::new`]), or for a file
//! by another process ([`Dashboard::for_file`]; the tool's `leaseq dashboard FILE`). Plain
//! HTML from the server, a small script that refreshes a page's content in place every 2 s
//! (the overview, a list's first page, a job with a payload of at most 64 KiB, the
//! schedules; not while the tab is hidden or someone types), no build step and no resource
//! from another site. The HTTP server is
//! [hyper](https://docs.rs/hyper) (HTTP/1.1) on a small tokio runtime of the dashboard's own,
//! on a thread of its own: an app need not run tokio, and a tokio app's runtime is not used.
//! Pages and actions run on at most 4 blocking threads.
//!
//! ```no_run
//! # fn main() -> leaseq::Result<()> {
//! let queue = leaseq::Queue::open("jobs.leaseq")?;
//! let server = leaseq::dashboard::serve(&queue, "127.0.0.1:0")?;
//! // Print the URL once: it carries the access token.
//! println!("dashboard: {}", server.url());
//! // ... the app runs; dropping `server` stops the dashboard.
//! # Ok(()) }
//! ```
//!
//! # Access
//! - **Loopback only by default**: an address that is not a loopback one is refused
//!   (`InvalidOption`) unless [`Dashboard::allow_remote`] says otherwise. The dashboard has
//!   no TLS: off the machine, put it behind a proxy that has, serving on loopback with
//!   `allow_remote(true)` (which turns the `Host` check off) and a proxy that passes the
//!   browser's `Host` header on (nginx: `proxy_set_header Host $host;`), or actions are
//!   refused as cross-site.
//! - **An access token**: 128 random bits from the system's generator, or
//!   [`Dashboard::token`]. [`Server::url`] carries it once (`/?token=…`); the dashboard
//!   then sets it as an `HttpOnly`, `SameSite=Strict` cookie (named after the port) and
//!   sends the browser on to the URL without it. Scripts send `Authorization: Bearer
//!   <token>`. A request without the token, or with a wrong one, is answered `401` and reads
//!   nothing (only the stylesheet and the script, which hold no data, are served without
//!   it). Browsers do not tell cookies apart by port: a server on another port of the
//!   same host name that the browser visits receives the cookie too. On a machine shared
//!   with people who should not act on the queue, stop the dashboard when done (a restart
//!   makes a new token).
//! - **Actions are protected from cross-site requests**: they are `POST` forms carrying a
//!   second token that only the dashboard's own pages hold; an `Origin` header other than
//!   the dashboard's own (`null` too) and a `Sec-Fetch-Site` other than `same-origin` or
//!   `none` are refused. On a loopback address without `allow_remote`, any request whose
//!   `Host` is not the address served (`127.0.0.1:PORT`, `[::1]:PORT`, `localhost:PORT`) is
//!   refused too (DNS rebinding). Refused requests are answered `403` and write nothing.
//! - **Read-only mode** ([`Dashboard::read_only`]): no buttons, and every action is
//!   answered `403`.
//! - **The JSON API** of the control channel (`leaseq::control`'s module docs: routes,
//!   answers, errors) is served under `/api/v1` too, for bearers of the token only (the
//!   cookie does not admit it, so no page of another site can make a browser act); its
//!   actions are refused (`403`) in read-only mode.
//! - **Bounds**: at most 128 connections (more are closed at once; a refused request's
//!   connection is closed after its answer), 8 KiB of request head read within 10 s, 16 KiB
//!   of body within 10 s (`413` for more, `408` for slower; an API enqueue by a bearer of
//!   the token carries a payload of up to
//!   [`PAYLOAD_BYTES_MAX_CAP`](crate::PAYLOAD_BYTES_MAX_CAP)), 5 minutes per connection. A
//!   file's dashboard ([`Dashboard::for_file`]) answers its pages and actions one at a time.
//!
//! # Answers
//! `200` for a page; `303` after an action, to the page it came from with a notice of what
//! was done. `400` for bad input (an id that is not a number, an unknown state or action, a
//! cursor that is not one, a malformed request); `404` for a job, queue or page that does
//! not exist (or a file gone since); `405` for a page with another method than GET or HEAD
//! (an action with another than POST); `431` for a request head over 8 KiB (one not sent
//! within 10 s is cut off without an answer). `409` for an
//! action on a job in the wrong state (retrying a ready job, removing a leased one,
//! cancelling a completed one), with leaseq's message and nothing written: each action is
//! one of the queue's calls ([`Queue::retry`], [`Queue::remove`], [`Queue::cancel`],
//! [`Queue::promote`], [`Queue::requeue_dead_all`], [`Queue::purge`] of the dead,
//! [`Queue::remove_schedule`], [`Queue::trigger_schedule`], [`Queue::pause_schedule`],
//! [`Queue::resume_schedule`], [`Queue::pause`], [`Queue::resume`]), with their errors; a
//! bulk action is one call per job selected, each answered on its own. For a file another process has open, an action goes through that
//! app's control channel when it opened one (`leaseq::control`, which it answers as its own
//! calls), and is otherwise `409` (the file cannot be opened for writing; the page names the
//! channel); a page is `409` once an app without live reads holds the file. `503` once the app closed its queue. `500` for a storage error
//! (with its message; the page does not claim nothing changed: a failed commit's outcome is
//! unknown) or a failure of the dashboard itself (logged with `tracing`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::{Error, Queue, Result};

use crate::control::server;
use crate::control::{random_token, validate_token};

mod http;
mod pages;
mod view;

/// Bytes of an access token given to [`Dashboard::token`]: at least this many.
pub const TOKEN_BYTES_MIN: usize = crate::control::TOKEN_BYTES_MIN;
/// Bytes of an access token given to [`Dashboard::token`]: at most this many.
pub const TOKEN_BYTES_MAX: usize = crate::control::TOKEN_BYTES_MAX;

/// Serves the dashboard of `queue`'s file (all its queues) at `addr`, with the defaults of
/// [`Dashboard`]: loopback only, a random access token, actions allowed. Port 0 picks a free
/// port ([`Server::local_addr`]). Stops when the returned [`Server`] is dropped.
///
/// # Errors
/// As [`Dashboard::serve`].
pub fn serve(queue: &Queue, addr: impl ToSocketAddrs) -> Result<Server> {
    Dashboard::new(queue).serve(addr)
}

/// A dashboard to be served: what it shows, and who may do what. Built with chained setters,
/// then [`Dashboard::serve`].
#[must_use = "a Dashboard serves nothing until Dashboard::serve"]
pub struct Dashboard {
    target: view::Target,
    read_only: bool,
    allow_remote: bool,
    token: Option<String>,
    pools: Vec<crate::PoolMonitor>,
    stalled_after: Option<Duration>,
}

impl Dashboard {
    /// A dashboard of the app's own file, through `queue` (a clone is kept; any queue of the
    /// file is shown). Reads and actions go through the app's handle: nothing else opens the
    /// file, and the counts include the metrics not written yet. Once the app closes the file
    /// ([`Queue::close`], or a [`Queue::shutdown`] starting), the dashboard drops its handle
    /// within 100 ms, so the shutdown can release the file, and answers `503` from then on.
    pub fn new(queue: &Queue) -> Dashboard {
        Dashboard::with_target(view::Target::App(crate::control::api::Held::new(queue)))
    }

    /// A dashboard of the file at `path`, for a process that is not the app (the tool's
    /// `leaseq dashboard`). Each page opens the file read-only for that page only
    /// ([`Reader`](crate::Reader)), so it never holds the file between requests: beside an
    /// app opened with [`Builder::live_reads`](crate::Builder::live_reads) it shows the
    /// live state; with nobody writing, the file. Each action goes through the control
    /// channel of the app that has the file open, when the control file beside it names one
    /// that answers ([`control::Client`](crate::control::Client)); else it opens the file for
    /// writing for that action only ([`Queue::open`]: leases of a process that died are
    /// returned then), which fails (`409`) while another process has it open: an app, or a
    /// reader such as `leaseq watch` or another dashboard's page.
    pub fn for_file(path: impl AsRef<Path>) -> Dashboard {
        Dashboard::with_target(view::Target::File {
            path: PathBuf::from(path.as_ref()),
            turns: parking_lot::Mutex::new(()),
            verified: AtomicBool::new(false),
        })
    }

    fn with_target(target: view::Target) -> Dashboard {
        Dashboard {
            target,
            read_only: false,
            allow_remote: false,
            token: None,
            pools: Vec::new(),
            stalled_after: None,
        }
    }

    /// Shows a worker pool in the overview's workers view, as Sidekiq's processes page and
    /// Oban Web's nodes: its threads busy and idle, its jobs started, acked, retried and
    /// dead, timeouts, heartbeats (lost ones too) and errors, or that it is stopping or
    /// gone ([`WorkerPool::monitor`](crate::WorkerPool::monitor)). Call once per pool. A
    /// file's dashboard shows the pools of the app's control channel instead
    /// (`Control::pool`).
    pub fn pool(mut self, monitor: crate::PoolMonitor) -> Dashboard {
        self.pools.push(monitor);
        self
    }

    /// Marks a leased job stalled once it has run longer than `limit` since its dequeue
    /// ([`JobInfo::leased_ms`](crate::JobInfo::leased_ms)), as Sidekiq's Busy page and Oban
    /// Web show how long each job runs: a hung handler whose heartbeats keep extending its
    /// lease looks healthy otherwise. A job whose lease ended without an extend is marked
    /// stalled whatever this says. Default: none (only lapsed leases). Whole milliseconds;
    /// `serve` refuses zero with `InvalidOption`.
    pub fn stalled_after(mut self, limit: Duration) -> Dashboard {
        self.stalled_after = Some(limit);
        self
    }

    /// Read-only: the pages show no buttons and every action is answered `403`. Default
    /// `false`.
    pub fn read_only(mut self, read_only: bool) -> Dashboard {
        self.read_only = read_only;
        self
    }

    /// Whether [`Dashboard::serve`] may listen on an address that is not loopback (`0.0.0.0`,
    /// a LAN address). Default `false`. The token still guards every request, but it travels
    /// in clear text: use a proxy with TLS. It also turns the `Host` check (DNS rebinding)
    /// off, on a loopback address too: a proxy passes its own host name on.
    pub fn allow_remote(mut self, allow: bool) -> Dashboard {
        self.allow_remote = allow;
        self
    }

    /// The access token instead of a random one: [`TOKEN_BYTES_MIN`] to [`TOKEN_BYTES_MAX`]
    /// bytes of ASCII letters, digits, `-` and `_` (it travels in a URL and a cookie).
    pub fn token(mut self, token: impl Into<String>) -> Dashboard {
        self.token = Some(token.into());
        self
    }

    /// Listens at `addr` and serves on threads of its own until the [`Server`] is dropped or
    /// stopped. For a file ([`Dashboard::for_file`]), the file is opened once first (verified
    /// as an open does), so a file that cannot be read fails here rather than on every page.
    ///
    /// Listens on the first address `addr` resolves to (`"localhost:8080"` is one of
    /// `127.0.0.1` and `::1`).
    ///
    /// # Errors
    /// - `InvalidOption` for an address that does not parse or resolves to nothing, one that
    ///   is not loopback without [`Dashboard::allow_remote`], a token outside the rules
    ///   of [`Dashboard::token`], or a zero [`Dashboard::stalled_after`];
    /// - `Io` if the address cannot be listened on (in use, not permitted), the system gives
    ///   no random bytes (the tokens), or no thread or runtime can be started;
    /// - for a file, the errors of [`Builder::open_reader`](crate::Builder::open_reader):
    ///   `NotLeaseq`, `Truncated`, `Corrupted`, `UnsupportedVersion`, `HeldExclusively` (an
    ///   app has it open without live reads), `AlreadyOpen` (a file that needs a repair
    ///   while another process holds its writer lock), `Storage`, `Io`.
    pub fn serve(self, addr: impl ToSocketAddrs) -> Result<Server> {
        let addr = addr
            .to_socket_addrs()
            .map_err(|e| invalid("addr", format!("not an address: {e}")))?
            .next()
            .ok_or_else(|| invalid("addr", "resolves to no address"))?;
        if !addr.ip().is_loopback() && !self.allow_remote {
            return Err(invalid(
                "addr",
                format!(
                    "{addr} is not a loopback address: the dashboard listens on 127.0.0.1 or \
                     ::1 unless Dashboard::allow_remote(true)"
                ),
            ));
        }
        let token = match self.token {
            Some(token) => validate_token(token)?,
            None => random_token()?,
        };
        let stalled_after_ms = match self.stalled_after {
            Some(limit) if limit.as_millis() == 0 => {
                return Err(invalid("stalled_after", "must be at least 1 ms"));
            }
            Some(limit) => Some(u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)),
            None => None,
        };
        if let view::Target::File { .. } = self.target {
            drop(self.target.view(None)?);
        }
        let listener = std::net::TcpListener::bind(addr).map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("the dashboard cannot listen at {addr}: {e}"),
            ))
        })?;
        let local_addr = listener.local_addr()?;
        let mut app = http::App::new(
            self.target,
            self.read_only,
            self.allow_remote,
            token.clone(),
            random_token()?,
            local_addr,
            self.pools,
        );
        app.stalled_after_ms = stalled_after_ms;
        let running = server::Running::start(listener, Arc::new(app))?;
        tracing::info!(addr = %local_addr, "leaseq: dashboard listening");
        Ok(Server {
            local_addr,
            token,
            running,
        })
    }
}

/// A running dashboard. Dropping it (or [`Server::stop`]) stops it: the port closes, and
/// answers in progress get up to 2 s to end (as [`Server::stop`] says).
#[must_use = "the dashboard stops when its Server is dropped"]
pub struct Server {
    local_addr: SocketAddr,
    token: String,
    running: server::Running,
}

impl Server {
    /// The address listened at (with the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The URL to open, with the access token: `http://127.0.0.1:PORT/?token=…`. Print it
    /// once, to whoever may use the dashboard; it grants every action (but in read-only
    /// mode). The host is the address listened at (`0.0.0.0` for every interface: use the
    /// machine's name there).
    pub fn url(&self) -> String {
        format!("http://{}/?token={}", self.local_addr, self.token)
    }

    /// The access token (for `Authorization: Bearer` from scripts).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Stops listening, closes the connections, and waits up to 2 s for the pages and
    /// actions being answered; one still running then goes on in the background (an action
    /// may still commit) and `stop` returns.
    pub fn stop(mut self) {
        self.running.stop();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.running.stop();
    }
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("path", &self.target.path())
            .field("read_only", &self.read_only)
            .field("allow_remote", &self.allow_remote)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// `InvalidOption` for `field` (built from the public variant: the dashboard uses the
/// public API only).
pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidOption {
        field,
        reason: reason.into(),
    }
}
