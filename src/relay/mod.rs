//! Store-and-forward between a leaseq queue and a NATS JetStream stream (feature `nats`).
//!
//! leaseq stays an embedded, single-process queue; a relay makes it the durable edge buffer of
//! a fleet's stream. Built on leaseq's public API only (as another crate could be) and on
//! [`async_nats`], whose small runtime (one tokio worker thread per relay) stays inside the
//! relay: the queue and your code stay synchronous.
//!
//! ```toml
//! leaseq = { version = "0.1", features = ["nats"] }
//! ```
//!
//! | direction | what the relay does | what is promised |
//! |---|---|---|
//! | out ([`Outbound`]) | leases up to `max_in_flight` jobs (256) from a local queue in one commit, publishes each to a JetStream subject with a `Nats-Msg-Id` header, waits for every `PubAck` (one shared timeout per batch), acks the stored ones locally in one commit | a job leaves the file only after the stream stored it; it goes again if its `PubAck` never came (the server, the network or the relay died), with the same message id, which the stream drops as a duplicate within its window |
//! | in ([`Inbound`]) | a durable pull consumer; each pull (up to 256 messages) enqueued in one local commit with the message id as the job's dedup key and idempotency key; the JetStream acks after that commit | a message is acked only once it is a local job; one delivered again finds its job (dedup key) or, once that job ended, its applied marker ([`Lease::ack_with`](crate::Lease::ack_with) runs the effect once) |
//!
//! While the server is unreachable the jobs wait in the file and the app keeps enqueueing;
//! they go out in queue order (priority, then age) when it returns.
//!
//! A relay does not create streams (their replicas, limits and duplicate window are the
//! fleet's choice): make the stream first, with the `nats` tool or a client; until it exists
//! the relay reports [`RelayError::MissingStream`] and checks again. An [`Inbound`] relay makes
//! its durable consumer itself.
//!
//! ```no_run
//! use leaseq::relay::{Inbound, Outbound};
//! use leaseq::{EnqueueOptions, Queue};
//! use std::time::Duration;
//!
//! let file = Queue::open("edge.leaseq")?;
//! let events = file.named("events")?;
//! // Out: every job of `events` is published to `events.edge-1` of the stream EVENTS, then
//! // acked locally. Works offline: the jobs wait in the file until the server is back.
//! let out = Outbound::builder(&events, "nats://127.0.0.1:4222", "EVENTS", "events.edge-1").start()?;
//! // The key is the message id in the whole stream: unique across devices.
//! events.enqueue(b"door opened", EnqueueOptions::default().idempotency_key("edge-1/evt-17"))?;
//!
//! // In: the fleet's commands for this edge become jobs of `commands`, each acked to
//! // JetStream only after its local commit.
//! let commands = file.named("commands")?;
//! let inbound = Inbound::builder(&commands, "nats://127.0.0.1:4222", "COMMANDS", "edge-1")
//!     .filter_subject("commands.edge-1")
//!     .start()?;
//! if let Some(lease) = commands.dequeue_timeout(Duration::from_secs(1))? {
//!     lease.ack_with(|_tx| Ok(()))?; // your writes: applied once per message id
//! }
//! println!("{:?} {:?}", out.stats(), inbound.stats().last_error);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `cargo run --release --features nats --example edge_sync` runs an edge app recording
//! offline, syncing when a server appears, and taking commands applied once. Measured
//! throughput: `docs/performance.md` in the source repository.
//!
//! # Message ids and the windows
//!
//! A job's message id ([`message_id`]) is its idempotency key when it has one that is
//! printable ASCII (`!` to `~`), `hex:` and the key's bytes in hex for any other key, and
//! otherwise `lq:{file id:016x}:{job id}` ([`Queue::file_id`](crate::Queue::file_id) makes job
//! ids unique across files). **JetStream deduplicates per stream, not per subject or sender**:
//! an idempotency key is the message's id in the whole stream, so keys must be unique across
//! every producer into it (put the device or app id in the key: `edge-7/evt-17`); two devices
//! sending `evt-17` to one stream store one message.
//!
//! A job is published again only when its `PubAck` did not reach the relay (the server, the
//! network or the relay died in between): JetStream drops such a second copy if it arrives
//! within the stream's duplicate window (`duplicate_window`, 2 minutes by default, as SQS
//! FIFO's 5-minute deduplication interval). The relay keeps its retries inside the window: it
//! publishes a failed job again as soon as the server answers, keeps its lease renewed
//! meanwhile, and a restarted relay gets the jobs of a dead one back at the file's reopen; it
//! does not publish to a stream whose window is shorter than its lease plus its publish
//! timeout ([`OutboundBuilder::lease`]; 30 s and 5 s by default, so a window of at least 35 s;
//! its last error is then [`RelayError::InvalidOption`]). **A copy published after the window is stored
//! twice**: a relay (or its app) down for longer than the window between a publish and its
//! local ack. The message id is the same in both copies, so a consumer that applies by
//! message id (as [`Inbound`] does, with `ack_with`) still applies it once.
//!
//! On the way in, the local key is the message id ([`message_key`]: a digest for an id longer
//! than [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX)), or `{stream}:{stream created, ns}:{stream
//! sequence}` for a message without one, so one key follows the work from one file to
//! another. The dedup key keeps one live local job per message,
//! and the idempotency key makes [`Lease::ack_with`](crate::Lease::ack_with) apply a message
//! whose job already ended (a redelivery after the local job was acked) at most once, for as
//! long as its applied marker is kept (`applied_retention`, 7 days by default). A message
//! carries the job's payload encoding (`Leaseq-Encoding`), which the receiving job records, so
//! [`Lease::decode`](crate::Lease::decode) reads a typed payload as it was written.
//!
//! # Faults
//!
//! Which failures cost a job an attempt (as [`Lease::nack`](crate::Lease::nack) through the
//! job's retry policy), and which do not:
//!
//! | failure | the job |
//! |---|---|
//! | the connection never made (no server answers; TLS or credentials refused) | not taken: it stays ready in the file, no attempt counted ([`RelayError::Unreachable`], [`RelayError::Tls`], [`RelayError::Auth`]) |
//! | the connection lost; no `PubAck` for a whole batch while the connection stays open (a stopped server, a link dropping packets) | kept leased, in its place, renewed, and published again first when the server answers: no attempt counted, the queue's order kept ([`RelayError::Unreachable`]) |
//! | no stream takes the subject any more | the same, while the relay checks the stream again ([`RelayError::MissingStream`]) |
//! | an error the server returned (the stream's `max_msg_size`, a full stream with `discard: new`); no `PubAck` in time for some jobs of a batch while others got theirs | nacked: an attempt counted, retried after its backoff, dead after its last attempt with the server's reason ([`RelayError::Server`]) |
//! | larger than the server's `max_payload` (payload and headers: about 100 bytes of headers) | dead at once, with the server's limit ([`RelayError::TooLarge`]): requeue it when the limit is raised |
//!
//! On the way in, a message too large for the local queue stays in the stream, unacked (a
//! `nak` with a delay of a minute: [`RelayError::TooLargeForQueue`]); an existing consumer
//! must use explicit acks and the filter asked for, or [`Inbound`] refuses it
//! ([`RelayError::InvalidOption`]). A message that does not fit the local queue's size limit
//! ([`Queue::set_limit`](crate::Queue::set_limit), refusing or waiting when full) stays in the
//! stream the same way ([`RelayError::QueueFull`]); under `WhenFull::DropOldest` it is taken
//! and the oldest local jobs waiting are dropped.
//!
//! Every error is kept as the relay's [`RelayStats::last_error`], typed, and
//! [`Outbound::wait_ready`] returns it; none stops the relay, which retries with a backoff
//! from 100 ms to [`OutboundBuilder::max_backoff`] (no busy loop: 50 jobs and an unreachable
//! server cost under 0.3 s of CPU in 3.5 s, tested). A disconnection shows at once (`ready`
//! false). The relay stops when
//! [`Outbound::shutdown`] is called, when it is dropped, or when the file is closed
//! ([`Queue::close`](crate::Queue::close)); jobs it still held go back then at no cost, behind
//! the jobs waiting (as [`Lease::snooze`](crate::Lease::snooze)).
//!
//! **Limits.** async-nats drops its
//! connection on a message header that is not UTF-8, at each delivery of that message: an
//! [`Inbound`] relay then reports it (a pinned [`RelayError::Server`] naming the consumer) and
//! cannot pass it; it stays in the stream for an operator to remove. A certificate refused at
//! a reconnect (after the relay's first connection: say the server's certificate was replaced
//! by one the relay does not trust) reaches leaseq from async-nats as an I/O error only, so
//! the last error stays [`RelayError::Unreachable`] ("connection lost; reconnecting") while
//! the client tries again; at a first connection it is [`RelayError::Tls`]. async-nats 0.51
//! also loads the platform's root certificates at every TLS connection, even when a CA is
//! given, and refuses to connect if any of them fails to load (a broken link among them):
//! every connection is then refused as [`RelayError::Tls`] ("could not load platform certs").
//! Both are async-nats's behaviour, kept until it changes.
//!
//! # TLS and credentials
//!
//! [`Connection`] sets them, as the official clients' connection options do: the CA to trust
//! (a PEM file or bytes; the platform's roots by default), a client certificate for mutual
//! TLS, "TLS required", and one of user and password, token, NKey seed or `.creds` file.
//! Credentials may instead be given in the URL, as the official clients read it
//! (`nats://user:password@host`, `nats://token@host`, percent-encoded); given in both places,
//! or as two logins in one server list, they are refused by `start` ([`RelayError::InvalidOption`],
//! [`RelayError::BadUrl`]). A refused certificate is [`RelayError::Tls`], refused credentials
//! [`RelayError::Auth`], also when a reconnect is refused because the server's credentials
//! changed; both are kept as the last error and tried again with the backoff, and the jobs
//! stay in the file. No secret is kept in the queue file, shown by `Debug`, or put in an
//! error or a `tracing` event, leaseq's or async-nats's (the client is given the URLs
//! without their user information; tested at TRACE level).
//!
//! ```no_run
//! use leaseq::relay::{Connection, Inbound};
//! use leaseq::Queue;
//! let file = Queue::open("edge.leaseq")?;
//! let commands = file.named("commands")?;
//! let nats = Connection::new()
//!     .root_certificates_file("/etc/fleet/ca.pem")
//!     .user_password("edge-7", &std::env::var("FLEET_PASSWORD")?);
//! let inbound = Inbound::builder(&commands, "tls://nats.fleet:4222", "COMMANDS", "edge-7")
//!     .connection(nats)
//!     .start()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Several servers
//!
//! The `url` of [`Outbound::builder`] and [`Inbound::builder`] may list the servers of a
//! cluster separated by commas (`nats://a:4222,nats://b:4222`), as the official clients and
//! the `nats` tool take them; the servers a cluster advertises are added to the list, so one
//! member's URL is enough to reach the others once it has answered. The client connects to one
//! of them and moves to another when it is lost; the promises stay the same on any member: a
//! job leaves the file only after a `PubAck`, a message is acked only after its local commit,
//! and message ids do not change, so a publish whose `PubAck` a dying leader never sent is
//! dropped as a copy by the next one (within the stream's duplicate window). A password in a
//! URL (`nats://user:pass@host`) is shown as `nats://***@host` in errors and logs.
//!
//! # Tested against a real `nats-server`
//!
//! `tests/relay/` (`contract.rs`, `kills.rs`): 10,000 jobs out
//! while the server is SIGKILLed and restarted three times and the relay's process six times,
//! each kill timed while jobs are in flight: every job in the stream exactly once (by message
//! id and by payload), none left locally. 10,000 messages in, with the same kills of the
//! worker's process: every message applied exactly once through `ack_with`. Both fail when the
//! message ids or keys are made unstable across restarts. `secure.rs`: TLS with certificates
//! made in the test (the CA as a file or bytes, mutual TLS from files or bytes; an unknown CA,
//! another host's name, an expired certificate and TLS required from a plain server each
//! refused as `Tls`), user and password, token and NKey (each wrong one refused as `Auth`,
//! retried a handful of times in 3 s, its secret in no error), a `.creds` file against a
//! server run by an operator with a memory resolver (JWTs signed in the test: a stranger's
//! user and an expired one refused as `Auth`; a file renewed before its JWT expires taken at
//! the reconnect the expiry forces), a password withdrawn while connected (`Auth`
//! at the reconnect, the jobs kept, then relayed once it is accepted again), and a list whose
//! first server is down. `cluster.rs`: a three-server cluster with replicated streams, each
//! relay given one member's URL; that member SIGKILLed mid-relay, then the stream's (or the
//! consumer's) leader: 10,000 jobs out, each in the stream once; 10,000 messages in, each
//! applied once.

mod connection;
mod inbound;
mod outbound;

pub use connection::{CONNECTION_FILE_BYTES_MAX, Connection};
pub use inbound::{Inbound, InboundBuilder};
pub use outbound::{Outbound, OutboundBuilder};

use crate::JobId;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The header JetStream deduplicates publishes by, within the stream's duplicate window.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// The header naming the job a message was published from (its id in the sender's file).
pub const JOB_ID_HEADER: &str = "Leaseq-Job-Id";
/// The header carrying the payload's encoding (`bincode` or `json`), as the sender's lease
/// saw it: an [`Inbound`] relay records it on the job, so `Lease::decode` reads it right.
pub const ENCODING_HEADER: &str = "Leaseq-Encoding";

/// The header value of an encoding.
fn encoding_name(e: crate::Encoding) -> &'static str {
    match e {
        crate::Encoding::Json => "json",
        _ => "bincode",
    }
}

/// The encoding a header value names, if any.
fn encoding_of(name: &str) -> Option<crate::Encoding> {
    match name {
        "json" => Some(crate::Encoding::Json),
        "bincode" => Some(crate::Encoding::Bincode),
        _ => None,
    }
}

/// The smallest wait between two tries at an unreachable server or a missing stream.
const BACKOFF_MIN: Duration = Duration::from_millis(100);

/// A relay's error: why it cannot move jobs right now, or why one job could not go. Kept as
/// [`RelayStats::last_error`]; returned by [`Outbound::wait_ready`] / [`Inbound::wait_ready`],
/// and by the builders' `start` for a bad option or URL.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// A builder option out of range (the text says which); returned by `start`.
    #[error("invalid relay option: {0}")]
    InvalidOption(String),
    /// The server URL does not parse; returned by `start`.
    #[error("invalid NATS server URL {url:?}: {reason}")]
    BadUrl {
        /// The URL given (user information shown as `***`).
        url: String,
        /// The client's reason.
        reason: String,
    },
    /// TLS could not be set up with the server: its certificate does not chain to a trusted
    /// root, has expired or names another host; it asked for a client certificate that was
    /// not given or not accepted; or TLS is required and the server does not offer it. Jobs
    /// wait in the local queue; the relay tries again with its backoff.
    #[error("TLS with NATS server {url} failed: {reason}")]
    Tls {
        /// The URL given (user information shown as `***`).
        url: String,
        /// The client's reason.
        reason: String,
    },
    /// The server refused the credentials (wrong, missing, expired, or not allowed), or they
    /// could not sign its challenge. Jobs wait in the local queue; the relay tries again with
    /// its backoff, without a busy loop.
    #[error("NATS server {url} refused the credentials: {reason}")]
    Auth {
        /// The URL given (user information shown as `***`).
        url: String,
        /// The server's or client's reason (never the secret).
        reason: String,
    },
    /// No connection to the server (refused, timed out, or lost and not back yet). Jobs wait
    /// in the local queue; the relay keeps trying.
    #[error("NATS server {url} unreachable: {reason}")]
    Unreachable {
        /// The URL given (user information shown as `***`).
        url: String,
        /// The client's reason.
        reason: String,
    },
    /// The stream does not exist (or JetStream is not enabled). Jobs wait in the local queue;
    /// the relay checks again with its backoff.
    #[error("JetStream stream {stream:?} not found: {reason}")]
    MissingStream {
        /// The stream name given.
        stream: String,
        /// The server's reason.
        reason: String,
    },
    /// The stream exists but none of its subjects covers the relay's subject. Jobs wait in
    /// the local queue; the relay checks again with its backoff.
    #[error("stream {stream:?} does not cover subject {subject:?} (its subjects: {subjects:?})")]
    SubjectNotCovered {
        /// The stream name given.
        stream: String,
        /// The relay's subject.
        subject: String,
        /// The stream's subjects.
        subjects: Vec<String>,
    },
    /// A job larger than the server accepts: it is dead in the local queue with this reason.
    #[error("job {job:?} is too large for the server: {reason}")]
    TooLarge {
        /// The job.
        job: JobId,
        /// The server's limit, as the client reports it.
        reason: String,
    },
    /// A message larger than the local queue accepts: it stays in the stream, unacked
    /// (redelivered after a minute, as a JetStream `nak` with a delay).
    #[error(
        "message {key:?} (stream sequence {stream_seq}) is too large for the local queue: {reason}"
    )]
    TooLargeForQueue {
        /// The message's id (its dedup key).
        key: String,
        /// Its stream sequence.
        stream_seq: u64,
        /// leaseq's reason.
        reason: String,
    },
    /// An inbound message the local queue had no room for: its size limit
    /// ([`Queue::set_limit`](crate::Queue::set_limit)) refused it
    /// ([`Error::QueueFull`](crate::Error::QueueFull)), or the file is within its disk
    /// reserve ([`Error::StorageFull`](crate::Error::StorageFull)). It stays in the stream, unacked (a
    /// `nak` with a delay of a minute), and comes again once there may be room.
    #[error("message {key:?} (stream sequence {stream_seq}) found the local queue full: {reason}")]
    QueueFull {
        /// The message's id (its dedup key).
        key: String,
        /// Its stream sequence.
        stream_seq: u64,
        /// leaseq's reason.
        reason: String,
    },
    /// A publish or consume the server answered with an error, or did not answer in time on
    /// a live connection. A job this happened to was nacked (an attempt counted).
    #[error("JetStream: {reason}")]
    Server {
        /// The job, for a publish.
        job: Option<JobId>,
        /// The server's or client's reason.
        reason: String,
    },
    /// The local queue refused a call (other than because it was closed, which stops the
    /// relay).
    #[error("local queue: {0}")]
    Queue(Arc<crate::Error>),
}

impl From<crate::Error> for RelayError {
    fn from(e: crate::Error) -> RelayError {
        RelayError::Queue(Arc::new(e))
    }
}

/// What a relay did so far, and its state now. Counters start at 0 at `start`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RelayStats {
    /// Connected to the server and the stream (and, inbound, the consumer) checked.
    pub ready: bool,
    /// Outbound: jobs published and acked locally (`duplicates` among them). Inbound:
    /// messages enqueued locally (new jobs) and acked to JetStream.
    pub moved: u64,
    /// Outbound: publishes the server answered as a duplicate (already in the stream).
    /// Inbound: messages whose local job already existed (`Duplicate`), acked without a new
    /// job.
    pub duplicates: u64,
    /// Outbound: publishes that failed at no cost to their job (the connection lost, the
    /// server not answering, the stream gone): the job kept its place and went again.
    pub given_back: u64,
    /// Outbound: jobs nacked (an attempt counted) after a server error or a timeout.
    pub nacked: u64,
    /// Outbound: jobs dead-lettered (too large for the server, or out of attempts by a nack).
    pub dead: u64,
    /// Outbound: local acks refused because the lease had already ended (`LeaseLost`): the
    /// job is published again by its next delivery, and JetStream drops the copy within its
    /// duplicate window. Inbound: messages left unacked (`nak`) because the local queue
    /// refused them.
    pub refused: u64,
    /// The last error met, if any (cleared when the relay gets ready again).
    pub last_error: Option<RelayError>,
}

/// State shared between a relay's thread and its handle.
struct RelayState {
    stop: AtomicBool,
    stop_signal: crate::StopSignal,
    stats: Mutex<RelayStats>,
    changed: Condvar,
    /// Bumped at every disconnection of the client: a publish whose ack did not come while
    /// the epoch moved is the connection's fault, not the job's.
    disconnects: AtomicU64,
    /// An error that stays the last error while its cause lasts, whatever else happens in
    /// between (the disconnections an unreadable message causes, say).
    pinned: Mutex<Option<RelayError>>,
}

impl RelayState {
    fn new() -> Arc<RelayState> {
        Arc::new(RelayState {
            stop: AtomicBool::new(false),
            stop_signal: crate::StopSignal::new(),
            stats: Mutex::new(RelayStats::default()),
            changed: Condvar::new(),
            disconnects: AtomicU64::new(0),
            pinned: Mutex::new(None),
        })
    }

    /// Pins `e` as the last error until the next call (`None` unpins).
    fn pin(&self, e: Option<RelayError>) {
        if let Some(e) = &e {
            tracing::warn!(target: "leaseq::relay", error = %e, "relay");
        }
        *self.pinned.lock() = e;
        self.update(|_| {});
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.stop_signal.stop();
        let _guard = self.stats.lock();
        self.changed.notify_all();
    }

    fn update(&self, f: impl FnOnce(&mut RelayStats)) {
        let pinned = self.pinned.lock().clone();
        let mut stats = self.stats.lock();
        f(&mut stats);
        if pinned.is_some() {
            stats.last_error = pinned;
        }
        self.changed.notify_all();
    }

    fn fail(&self, e: RelayError) {
        tracing::warn!(target: "leaseq::relay", error = %e, "relay");
        self.update(|s| {
            s.ready = false;
            s.last_error = Some(e);
        });
    }

    fn note(&self, e: RelayError) {
        tracing::warn!(target: "leaseq::relay", error = %e, "relay");
        self.update(|s| s.last_error = Some(e));
    }

    fn set_ready(&self) {
        self.update(|s| {
            s.ready = true;
            s.last_error = None;
        });
    }

    /// Sleeps up to `d`, returning early when the relay is told to stop.
    fn sleep(&self, d: Duration) {
        let deadline = Instant::now() + d;
        let mut stats = self.stats.lock();
        while !self.stopping() {
            if self.changed.wait_until(&mut stats, deadline).timed_out() {
                break;
            }
        }
    }

    /// Waits until the relay is ready, up to `timeout`; the last error if it is not.
    fn wait_ready(&self, url: &str, timeout: Duration) -> Result<(), RelayError> {
        let deadline = Instant::now() + timeout;
        let mut stats = self.stats.lock();
        loop {
            if stats.ready {
                return Ok(());
            }
            if self.stopping() || self.changed.wait_until(&mut stats, deadline).timed_out() {
                if stats.ready {
                    return Ok(());
                }
                return Err(stats
                    .last_error
                    .clone()
                    .unwrap_or_else(|| RelayError::Unreachable {
                        url: url.to_string(),
                        reason: format!("not connected within {} ms", timeout.as_millis()),
                    }));
            }
        }
    }
}

/// A running relay's thread and state, behind [`Outbound`] and [`Inbound`]: stopped and
/// joined on drop.
struct RelayThread {
    shared: Arc<RelayState>,
    url: String,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RelayThread {
    fn wait_ready(&self, timeout: Duration) -> Result<(), RelayError> {
        self.shared.wait_ready(&self.url, timeout)
    }

    fn stats(&self) -> RelayStats {
        self.shared.stats.lock().clone()
    }

    fn stop(&mut self) -> RelayStats {
        self.shared.stop();
        if let Some(t) = self.thread.take() {
            // A panic of the relay thread was already reported by the panic hook.
            let _ = t.join();
        }
        self.stats()
    }
}

impl Drop for RelayThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The wait before the next try: doubling from 100 ms to the cap, reset on success.
struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    fn new(cap: Duration) -> Backoff {
        Backoff {
            next: BACKOFF_MIN,
            cap,
        }
    }

    fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        d
    }

    fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }

    /// The client's own wait before its reconnect attempt `attempts` (counted from 1 since
    /// the last connection): none for the first, then 100 ms doubling to `cap`, as a
    /// [`Backoff`]'s steps (async-nats's default doubles from 2 ms to 4 s whatever the cap).
    fn reconnect_delay(attempts: usize, cap: Duration) -> Duration {
        if attempts <= 1 {
            return Duration::ZERO;
        }
        let doublings = u32::try_from(attempts - 2).unwrap_or(u32::MAX).min(16);
        BACKOFF_MIN.saturating_mul(1 << doublings).min(cap)
    }
}

/// The options both relays share.
#[derive(Clone)]
struct RelayConfig {
    /// The server URLs as given, for display: user information replaced by `***`.
    url: String,
    /// The server URLs as given (comma-separated), secrets included: only parsed.
    servers: String,
    stream: String,
    connect_timeout: Duration,
    max_backoff: Duration,
    name: String,
    connection: Connection,
}

impl RelayConfig {
    fn new(url: &str, stream: &str, name: &str) -> RelayConfig {
        RelayConfig {
            url: connection::redact_url(url),
            servers: url.to_string(),
            stream: stream.to_string(),
            connect_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            name: name.to_string(),
            connection: Connection::new(),
        }
    }

    fn validate_for(&self, queue: &crate::Queue) -> Result<(), RelayError> {
        if queue.is_closed() {
            return Err(crate::Error::Closed.into());
        }
        let servers =
            connection::server_addrs(&self.servers).map_err(|reason| RelayError::BadUrl {
                url: self.url.clone(),
                reason,
            })?;
        self.connection.validate(&servers)?;
        if !valid_stream_name(&self.stream) {
            return Err(RelayError::InvalidOption(format!(
                "stream name {:?}: 1 to 255 printable ASCII bytes, none of ` . * > / \\`",
                self.stream
            )));
        }
        if self.connect_timeout.is_zero() || self.max_backoff < BACKOFF_MIN {
            return Err(RelayError::InvalidOption(format!(
                "connect_timeout must be above 0 and max_backoff at least {} ms",
                BACKOFF_MIN.as_millis()
            )));
        }
        Ok(())
    }

    /// The tokio runtime of one relay: one worker thread, which also runs the client's
    /// connection task while the relay's own thread is in a queue call.
    fn runtime(&self) -> Result<tokio::runtime::Runtime, RelayError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("{}-io", self.name))
            .enable_all()
            .build()
            .map_err(|e| RelayError::InvalidOption(format!("cannot start the runtime: {e}")))
    }

    /// One connection attempt; the client then reconnects by itself (without limit, with
    /// its own backoff), counting disconnections in `shared`.
    /// A shutdown does not wait for the attempt: it ends it within 50 ms.
    async fn connect(&self, shared: &Arc<RelayState>) -> Result<async_nats::Client, RelayError> {
        let events = Arc::clone(shared);
        let url = self.url.clone();
        let servers =
            connection::server_addrs(&self.servers).map_err(|reason| RelayError::BadUrl {
                url: url.clone(),
                reason,
            })?;
        let base = self
            .connection
            .options(&servers, false)
            // `start` checked the rest: what fails now is a certificate file gone bad.
            .map_err(|reason| RelayError::Tls {
                url: self.url.clone(),
                reason,
            })?;
        let cap = self.max_backoff;
        let connect = base
            .name(&self.name)
            .connection_timeout(self.connect_timeout)
            .reconnect_delay_callback(move |attempts| Backoff::reconnect_delay(attempts, cap))
            .event_callback(move |event| {
                let (events, url) = (Arc::clone(&events), url.clone());
                async move {
                    if let Some(refused) = connection::refused_reconnect(&event, &url) {
                        // A reconnect refused: the credentials changed on the server, or TLS.
                        events.fail(refused);
                    } else if matches!(event, async_nats::Event::Disconnected) {
                        events.disconnects.fetch_add(1, Ordering::AcqRel);
                        // Seen at once, not at the end of a batch's publish timeout.
                        events.fail(RelayError::Unreachable {
                            url,
                            reason: "connection lost; reconnecting".into(),
                        });
                    }
                }
            })
            .connect(servers.addrs);
        let stopped = async {
            while !shared.stopping() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let (connect, stopped) = (std::pin::pin!(connect), std::pin::pin!(stopped));
        match futures_util::future::select(connect, stopped).await {
            futures_util::future::Either::Left((connected, _)) => connected.map_err(|e| {
                use async_nats::ConnectErrorKind as K;
                let (url, reason) = (self.url.clone(), e.to_string());
                match e.kind() {
                    K::Tls => RelayError::Tls { url, reason },
                    // A refused certificate comes as an I/O error holding rustls's.
                    _ if connection::is_tls_failure(&e) => RelayError::Tls { url, reason },
                    K::Authentication | K::AuthorizationViolation => {
                        RelayError::Auth { url, reason }
                    }
                    _ => RelayError::Unreachable { url, reason },
                }
            }),
            futures_util::future::Either::Right(_) => Err(RelayError::Unreachable {
                url: self.url.clone(),
                reason: "stopped while connecting".into(),
            }),
        }
    }

    /// The stream's configuration, or why it cannot be had.
    async fn stream_info(
        &self,
        js: &async_nats::jetstream::Context,
    ) -> Result<async_nats::jetstream::stream::Stream, RelayError> {
        use async_nats::jetstream::context::GetStreamErrorKind;
        match js.get_stream(&self.stream).await {
            Ok(s) => Ok(s),
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(_) => Err(RelayError::MissingStream {
                    stream: self.stream.clone(),
                    reason: e.to_string(),
                }),
                _ => Err(RelayError::Unreachable {
                    url: self.url.clone(),
                    reason: e.to_string(),
                }),
            },
        }
    }
}

fn valid_stream_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b".*>/\\".contains(&b))
}

/// A subject relays publish to: literal tokens of printable ASCII, no wildcards.
fn valid_subject(subject: &str) -> bool {
    !subject.is_empty()
        && subject.len() <= 1024
        && subject.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && t.bytes().all(|b| b.is_ascii_graphic())
        })
}

/// A consumer's filter: tokens of printable ASCII, `*` for one token, `>` for the rest (last).
fn valid_filter(filter: &str) -> bool {
    let tokens: Vec<&str> = filter.split('.').collect();
    !filter.is_empty()
        && filter.len() <= 1024
        && tokens.iter().enumerate().all(|(i, t)| {
            !t.is_empty()
                && (*t != ">" || i == tokens.len() - 1)
                && t.bytes().all(|b| b.is_ascii_graphic())
        })
}

/// Whether the stream subject `pattern` (with `*` for one token, `>` for the rest) matches
/// the literal `subject`, by NATS's rules.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The `Nats-Msg-Id` of a job: its idempotency key if printable ASCII (`!` to `~`), as it is
/// (so a key that came in as a message id goes out under the same id when a job is forwarded
/// on); `hex:` and the key's bytes in lowercase hex for any other key, and for a key shaped
/// like this file's own ids (`lq:{file_id:016x}:…`), so no key takes the id of a keyless job;
/// else `lq:{file_id:016x}:{job id}`. A printable key `hex:…` and the binary key it spells
/// share an id: they are one key, seen before and after a relay. The same job always gets the
/// same id, in every process, so JetStream can drop a copy published again within its
/// duplicate window.
pub fn message_id(file_id: u64, job: JobId, idempotency_key: Option<&[u8]>) -> String {
    match idempotency_key {
        Some(k)
            if !k.is_empty()
                && k.iter().all(|b| b.is_ascii_graphic())
                && !is_own_id(file_id, k) =>
        {
            String::from_utf8_lossy(k).into_owned()
        }
        Some(k) if !k.is_empty() => {
            let mut s = String::with_capacity(4 + 2 * k.len());
            s.push_str("hex:");
            for b in k {
                s.push_str(&format!("{b:02x}"));
            }
            s
        }
        _ => format!("lq:{file_id:016x}:{}", job.0),
    }
}

/// Whether `key` is shaped like one of this file's own message ids (`lq:{file_id:016x}:…`),
/// checked without building the prefix (this runs for every job published).
fn is_own_id(file_id: u64, key: &[u8]) -> bool {
    let Some(rest) = key.strip_prefix(b"lq:") else {
        return false;
    };
    rest.len() >= 17
        && rest[16] == b':'
        && std::str::from_utf8(&rest[..16])
            .ok()
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            == Some(file_id)
        && rest[..16]
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Starts a relay's thread; a panic in it becomes the relay's last error.
fn spawn(
    name: &str,
    shared: &Arc<RelayState>,
    body: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, RelayError> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn({
            let shared = Arc::clone(shared);
            move || {
                // A bug of the relay (or its client) must not die silently: it is the last error.
                if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                    shared.fail(RelayError::Server {
                        job: None,
                        reason: format!(
                            "the relay thread panicked and stopped: {}",
                            crate::error::panic_message(&*panic)
                        ),
                    });
                }
            }
        })
        .map_err(|e| RelayError::InvalidOption(format!("cannot start the relay thread: {e}")))
}

/// What `Queue` calls the relay stops on.
fn is_closed(e: &crate::Error) -> bool {
    matches!(e, crate::Error::Closed)
}

/// The local key (dedup and idempotency) of a message whose id is `id`: the id itself, or, for
/// an id longer than [`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX) (a long binary key's `hex:`
/// form, say), `digest:` and 128 bits of SipHash-2-4 of it in hex: the same for every copy of
/// the message, so a long id is deduplicated and applied once like a short one.
pub fn message_key(id: &str) -> Vec<u8> {
    if id.len() <= crate::KEY_BYTES_MAX {
        return id.as_bytes().to_vec();
    }
    #[allow(deprecated)] // SipHash-2-4 by name: a fixed algorithm, unlike DefaultHasher's.
    let half = |k0: u64, k1: u64| {
        use std::hash::Hasher;
        let mut h = std::hash::SipHasher::new_with_keys(k0, k1);
        h.write(id.as_bytes());
        h.finish()
    };
    let (a, b) = (half(0x6c65_6173_6571, 1), half(0x6c65_6173_6571, 2));
    format!("digest:{a:016x}{b:016x}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_reconnects_wait_as_the_relays_backoff() {
        let cap = Duration::from_millis(700);
        let waits: Vec<u128> = (0..8)
            .map(|a| Backoff::reconnect_delay(a, cap).as_millis())
            .collect();
        assert_eq!(waits, [0, 0, 100, 200, 400, 700, 700, 700]);
        assert_eq!(Backoff::reconnect_delay(usize::MAX, cap), cap);
    }

    #[test]
    fn subjects_match_by_nats_rules() {
        assert!(subject_matches("orders.>", "orders.eu.new"));
        assert!(subject_matches("orders.*", "orders.eu"));
        assert!(!subject_matches("orders.*", "orders.eu.new"));
        assert!(!subject_matches("orders.>", "orders"));
        assert!(subject_matches("orders", "orders"));
        assert!(!subject_matches("orders", "orders.eu"));
        assert!(subject_matches("*.eu.*", "orders.eu.new"));
        assert!(!subject_matches("*.us.*", "orders.eu.new"));
    }

    #[test]
    fn subjects_and_streams_are_checked() {
        assert!(valid_subject("events.sensor-1"));
        assert!(!valid_subject("events.*"));
        assert!(!valid_subject("events.>"));
        assert!(!valid_subject("events..x"));
        assert!(!valid_subject("ev ents"));
        assert!(!valid_subject(""));
        assert!(valid_stream_name("EVENTS_1"));
        assert!(!valid_stream_name("A.B"));
        assert!(!valid_stream_name(""));
        assert!(valid_filter("cmds.*.x") && valid_filter("cmds.>") && valid_filter("a"));
        assert!(!valid_filter("a..b") && !valid_filter("a.>.b") && !valid_filter(""));
    }

    #[test]
    fn message_ids_are_stable_and_distinct() {
        let j = JobId(7);
        assert_eq!(message_id(0xab, j, None), "lq:00000000000000ab:7");
        assert_eq!(message_id(0xab, j, Some(b"order-42")), "order-42");
        assert_eq!(message_id(0xab, j, Some(b"a b")), "hex:612062");
        assert_eq!(message_id(0xab, j, Some(&[0xff, 0x00])), "hex:ff00");
        // A key shaped like this file's own ids goes as hex: it cannot take a keyless job's id.
        let own = message_id(0xab, JobId(2), None);
        assert_ne!(message_id(0xab, JobId(1), Some(own.as_bytes())), own);
        assert!(message_id(0xab, JobId(1), Some(own.as_bytes())).starts_with("hex:"));
        // Another file's id, or a hex form, passes as it is: forwarded on, it keeps its id.
        assert_eq!(message_id(0xcd, j, Some(own.as_bytes())), own);
        assert_eq!(message_id(0xab, j, Some(b"hex:ff00")), "hex:ff00");
        // The same rule as building the prefix and comparing.
        for key in [
            "lq:00000000000000ab:",
            "lq:00000000000000AB:1",
            "lq:ab:1",
            "lq:",
        ] {
            let by_prefix = key.starts_with(&format!("lq:{:016x}:", 0xab));
            assert_eq!(is_own_id(0xab, key.as_bytes()), by_prefix, "{key}");
        }
        assert_ne!(message_id(1, j, None), message_id(2, j, None));
        assert_ne!(message_id(1, JobId(8), None), message_id(1, j, None));
    }

    #[test]
    fn long_message_ids_get_a_fixed_length_key() {
        assert_eq!(message_key("m-1"), b"m-1");
        let long = format!("hex:{}", "ab".repeat(300));
        let key = message_key(&long);
        assert_eq!(key.len(), "digest:".len() + 32);
        assert_eq!(key, message_key(&long), "the same for every copy");
        let other = format!("hex:{}", "ab".repeat(299) + "ac");
        assert_ne!(key, message_key(&other));
        let at_limit = "x".repeat(crate::KEY_BYTES_MAX);
        assert_eq!(message_key(&at_limit), at_limit.as_bytes());
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500));
        let steps: Vec<u128> = (0..5).map(|_| b.step().as_millis()).collect();
        assert_eq!(steps, [100, 200, 400, 500, 500]);
        b.reset();
        assert_eq!(b.step().as_millis(), 100);
    }
}
