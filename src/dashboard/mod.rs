//! A web dashboard for a queue file (feature `dashboard`), as Bull Board, Oban Web and River
//! UI are for their peers: per queue, the counts per state and the rates over the last hour
//! (a chart from [`Queue::metrics`]); the jobs of each state with paging and a search by
//! key; a job's detail (payload as text, JSON or hex, its error history, attempts); the dead
//! letters with retry and remove; pause and resume; cancel; the schedules.
//!
//! Served in the app, on the app's own handle ([`serve`], [`Dashboard::new`]), or for a file
//! by another process ([`Dashboard::for_file`]; the tool's `leaseq dashboard FILE`). Plain
//! HTML from the server, a small script that refreshes the counts every 2 s, no build step
//! and no resource from another site. The HTTP server is [`tiny_http`], answering on 4
//! threads of its own.
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
//!   no TLS: off the machine, put it behind a proxy that has.
//! - **An access token**: 128 random bits from the system's generator, or
//!   [`Dashboard::token`]. [`Server::url`] carries it once (`/?token=…`); the dashboard
//!   then sets it as an `HttpOnly`, `SameSite=Strict` cookie and sends the browser on to the
//!   URL without it. Scripts send `Authorization: Bearer <token>`. A request without the
//!   token, or with a wrong one, is answered `401` and reads nothing.
//! - **Actions are protected from cross-site requests**: they are `POST` forms carrying a
//!   second token that only the dashboard's own pages hold; an `Origin` header of another
//!   site is refused, and so is a `Host` other than the address served (DNS rebinding).
//!   Refused actions are answered `403` and write nothing.
//! - **Read-only mode** ([`Dashboard::read_only`]): no buttons, and every action is
//!   answered `403`.
//!
//! # Answers
//! A job that does not exist: `404`. An action on a job in the wrong state (retrying a
//! ready job, removing a leased one, cancelling a completed one): `409` with leaseq's
//! message, nothing written (each action is one of the queue's calls: [`Queue::retry`],
//! [`Queue::remove`], [`Queue::cancel`], [`Queue::promote`], [`Queue::requeue_dead_all`],
//! [`Queue::pause`], [`Queue::resume`], with their errors). For a file held by another
//! process, an action is `409` (the file cannot be opened for writing): act from that
//! app's own dashboard, or stop it first.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::{Error, Queue, Result};

mod http;
mod pages;
mod view;

/// Threads answering requests: a slow client holds one of them, not the dashboard.
const THREADS: usize = 4;

/// Bytes of an access token given to [`Dashboard::token`]: at least this many.
pub const TOKEN_BYTES_MIN: usize = 16;
/// Bytes of an access token given to [`Dashboard::token`]: at most this many.
pub const TOKEN_BYTES_MAX: usize = 128;

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
pub struct Dashboard {
    target: view::Target,
    read_only: bool,
    allow_remote: bool,
    token: Option<String>,
}

impl Dashboard {
    /// A dashboard of the app's own file, through `queue` (a clone is kept; any queue of the
    /// file is shown). Reads and actions go through the app's handle: nothing else opens the
    /// file, and the counts include the metrics not written yet. Once the app closes the file
    /// ([`Queue::close`], or a [`Queue::shutdown`] starting), the dashboard drops its handle
    /// within 100 ms, so the shutdown can release the file, and answers `503` from then on.
    pub fn new(queue: &Queue) -> Dashboard {
        Dashboard::with_target(view::Target::App(parking_lot::RwLock::new(Some(
            queue.clone(),
        ))))
    }

    /// A dashboard of the file at `path`, for a process that is not the app (the tool's
    /// `leaseq dashboard`). Each page opens the file read-only for that page only
    /// ([`Reader`](crate::Reader)), so it never holds the file between requests: beside an
    /// app opened with [`Builder::live_reads`](crate::Builder::live_reads) it shows the
    /// live state; with nobody writing, the file. Each action opens the file for writing for
    /// that action only ([`Queue::open`]: leases of a process that died are returned then),
    /// which fails (`409`) while an app has it open.
    pub fn for_file(path: impl AsRef<Path>) -> Dashboard {
        Dashboard::with_target(view::Target::File {
            path: PathBuf::from(path.as_ref()),
            verified: AtomicBool::new(false),
        })
    }

    fn with_target(target: view::Target) -> Dashboard {
        Dashboard {
            target,
            read_only: false,
            allow_remote: false,
            token: None,
        }
    }

    /// Read-only: the pages show no buttons and every action is answered `403`. Default
    /// `false`.
    pub fn read_only(mut self, read_only: bool) -> Dashboard {
        self.read_only = read_only;
        self
    }

    /// Whether [`Dashboard::serve`] may listen on an address that is not loopback (`0.0.0.0`,
    /// a LAN address). Default `false`. The token still guards every request, but it travels
    /// in clear text: use a proxy with TLS.
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
    /// # Errors
    /// - `InvalidOption` for an address that is not loopback without
    ///   [`Dashboard::allow_remote`], an address that resolves to nothing, or a token outside
    ///   the rules of [`Dashboard::token`];
    /// - `Io` if the address cannot be listened on (in use, not permitted) or the system
    ///   gives no random bytes for the token;
    /// - for a file, the errors of [`Reader::open`](crate::Reader::open): `NotLeaseq`,
    ///   `Truncated`, `Corrupted`, `UnsupportedVersion`, `HeldExclusively` (an app has it
    ///   open without live reads), `Io`.
    pub fn serve(self, addr: impl ToSocketAddrs) -> Result<Server> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::invalid_option("addr", "resolves to no address"))?;
        if !addr.ip().is_loopback() && !self.allow_remote {
            return Err(Error::invalid_option(
                "addr",
                format!(
                    "{addr} is not a loopback address: the dashboard listens on 127.0.0.1 or \
                     ::1 unless Dashboard::allow_remote(true)"
                ),
            ));
        }
        let token = match self.token {
            Some(token) => check_token(token)?,
            None => random_token()?,
        };
        if let view::Target::File { .. } = self.target {
            drop(self.target.view(None)?);
        }
        let listener = tiny_http::Server::http(addr).map_err(|e| {
            Error::Io(std::io::Error::other(format!(
                "dashboard cannot listen at {addr}: {e}"
            )))
        })?;
        let local_addr = listener.server_addr().to_ip().ok_or_else(|| {
            Error::Io(std::io::Error::other(
                "dashboard listener has no IP address",
            ))
        })?;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let app = http::App::new(
            self.target,
            self.read_only,
            self.allow_remote,
            token.clone(),
            random_token()?,
            local_addr,
        );
        let app = Arc::new(app);
        let mut server = Server {
            local_addr,
            token,
            listener,
            stop,
            threads: Vec::with_capacity(THREADS),
        };
        for _ in 0..THREADS {
            let (app, listener, stop) = (app.clone(), server.listener.clone(), server.stop.clone());
            // On an error the threads started so far stop with `server`'s drop.
            let thread = std::thread::Builder::new()
                .name("leaseq-dashboard".into())
                .spawn(move || app.run(&listener, &stop))?;
            server.threads.push(thread);
        }
        tracing::info!(addr = %local_addr, "leaseq: dashboard listening");
        Ok(server)
    }
}

/// A running dashboard. Dropping it (or [`Server::stop`]) stops it: the listener closes,
/// the requests being answered end first.
pub struct Server {
    local_addr: SocketAddr,
    token: String,
    listener: Arc<tiny_http::Server>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// The address listened at (with the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The URL to open, with the access token: `http://127.0.0.1:PORT/?token=…`. Print it
    /// once, to whoever may use the dashboard; it grants every action.
    pub fn url(&self) -> String {
        format!("http://{}/?token={}", self.local_addr, self.token)
    }

    /// The access token (for `Authorization: Bearer` from scripts).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Stops listening and waits for the requests being answered.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for _ in 0..self.threads.len() {
            self.listener.unblock();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

fn check_token(token: String) -> Result<String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if !(TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&token.len()) || !token.chars().all(ok_char) {
        return Err(Error::invalid_option(
            "token",
            format!("{TOKEN_BYTES_MIN} to {TOKEN_BYTES_MAX} ASCII letters, digits, '-' or '_'"),
        ));
    }
    Ok(token)
}

/// 128 bits from the system's generator, as 32 hex digits.
fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Io(std::io::Error::other(format!("no random bytes: {e}"))))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
