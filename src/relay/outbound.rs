//! The outbound relay: a local queue published to a JetStream subject.

use super::{
    Backoff, ENCODING_HEADER, JOB_ID_HEADER, MSG_ID_HEADER, RelayConfig, RelayError, RelayState,
    RelayStats, RelayThread, encoding_name, is_closed, message_id, spawn, subject_matches,
    valid_subject,
};
use crate::{BATCH_MAX, Lease, Queue};
use async_nats::jetstream::context::PublishErrorKind;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a relay waits for a job when its queue is empty before it looks at the
/// connection again.
const IDLE_POLL: Duration = Duration::from_millis(500);

/// Options of an [`Outbound`] relay; [`OutboundBuilder::start`] starts it.
pub struct OutboundBuilder {
    queue: Queue,
    common: RelayConfig,
    subject: String,
    max_in_flight: usize,
    publish_timeout: Duration,
    lease: Duration,
}

impl OutboundBuilder {
    /// Publishes at most `n` jobs before waiting for their `PubAck`s (1 to
    /// [`BATCH_MAX`]; 256 by default): the jobs are leased in one commit
    /// and acked locally in one commit per batch.
    pub fn max_in_flight(mut self, n: usize) -> OutboundBuilder {
        self.max_in_flight = n;
        self
    }

    /// How long a batch waits for its `PubAck`s (whole milliseconds, above 0; 5 s by default).
    /// A job whose `PubAck` did not come in that time on a live connection is nacked.
    pub fn publish_timeout(mut self, timeout: Duration) -> OutboundBuilder {
        self.publish_timeout = timeout;
        self
    }

    /// The lease the relay takes its jobs under (at least twice the publish timeout; 30 s by
    /// default); a job whose own [`EnqueueOptions::lease`](crate::EnqueueOptions::lease) is
    /// shorter is extended to it when taken. The stream's duplicate window must be at least
    /// the lease plus the publish timeout, or the relay does not publish
    /// ([`RelayError::InvalidOption`] as its last error): a job published again after a lost
    /// `PubAck` must still meet the window.
    pub fn lease(mut self, lease: Duration) -> OutboundBuilder {
        self.lease = lease;
        self
    }

    /// TLS and credentials for the servers ([`Connection`](super::Connection): none, and
    /// TLS only where a URL or the server asks for it, by default).
    pub fn connection(mut self, connection: super::Connection) -> OutboundBuilder {
        self.common.connection = connection;
        self
    }

    /// How long one connection attempt may take (above 0; 5 s by default).
    pub fn connect_timeout(mut self, timeout: Duration) -> OutboundBuilder {
        self.common.connect_timeout = timeout;
        self
    }

    /// The longest wait between two tries at an unreachable server or a missing stream (at
    /// least 100 ms; 5 s by default). The waits double from 100 ms up to it.
    pub fn max_backoff(mut self, cap: Duration) -> OutboundBuilder {
        self.common.max_backoff = cap;
        self
    }

    /// Checks the options and starts the relay's thread (named `leaseq-relay-out`), which
    /// connects in the background: `start` does not wait for the server (see
    /// [`Outbound::wait_ready`]). Draws the file's id ([`Queue::file_id`]) if it has none.
    ///
    /// # Errors
    /// `BadUrl` for a URL that does not parse; `InvalidOption` for an option out of range, a
    /// subject with wildcards or empty tokens, a bad stream name, a
    /// [`Connection`](super::Connection) whose file cannot be read or does not parse,
    /// credentials given twice; `Queue` if the file id cannot be had (a closed file without
    /// one, a storage error).
    pub fn start(self) -> Result<Outbound, RelayError> {
        self.common.validate_for(&self.queue)?;
        if !valid_subject(&self.subject) {
            return Err(RelayError::InvalidOption(format!(
                "subject {:?}: dot-separated tokens of printable ASCII, no wildcards",
                self.subject
            )));
        }
        if self.max_in_flight == 0 || self.max_in_flight > BATCH_MAX {
            return Err(RelayError::InvalidOption(format!(
                "max_in_flight {} is not within 1..={BATCH_MAX}",
                self.max_in_flight
            )));
        }
        if self.publish_timeout.as_millis() == 0 || self.lease < self.publish_timeout * 2 {
            return Err(RelayError::InvalidOption(format!(
                "lease {} ms with publish_timeout {} ms: the publish timeout must be at least \
                 1 ms and the lease at least twice it (a lease must outlast a batch's wait)",
                self.lease.as_millis(),
                self.publish_timeout.as_millis()
            )));
        }
        let queue = self.queue.with_lease(self.lease)?;
        let file_id = queue.file_id()?;
        let shared = RelayState::new();
        let worker = Worker {
            queue,
            common: self.common.clone(),
            subject: self.subject,
            max_in_flight: self.max_in_flight,
            publish_timeout: self.publish_timeout,
            lease: self.lease,
            file_id,
            shared: Arc::clone(&shared),
        };
        let thread = spawn("leaseq-relay-out", &shared, move || worker.run())?;
        Ok(Outbound {
            handle: RelayThread {
                shared,
                url: self.common.url,
                thread: Some(thread),
            },
        })
    }
}

/// A running outbound relay: jobs of a local queue published to a JetStream subject, each
/// acked locally only after the server's `PubAck` (store-and-forward, at-least-once into the
/// stream, duplicates dropped by the stream's `Nats-Msg-Id` window). See the
/// [module docs](crate::relay) for the message ids, the windows and the faults.
///
/// ```no_run
/// use leaseq::relay::Outbound;
/// use leaseq::{EnqueueOptions, Queue};
/// use std::time::Duration;
///
/// let dir = tempfile::tempdir()?;
/// let file = Queue::open(dir.path().join("edge.leaseq"))?;
/// let outbox = file.named("outbox")?;
/// outbox.enqueue(b"reading 21.5", EnqueueOptions::default())?; // works offline
/// let relay = Outbound::builder(&outbox, "nats://127.0.0.1:4222", "EVENTS", "events.edge")
///     .start()?;
/// relay.wait_ready(Duration::from_secs(5))?; // Err(Unreachable { .. }) while offline
/// let stats = relay.shutdown();
/// println!("{} published", stats.moved);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Outbound {
    handle: RelayThread,
}

impl Outbound {
    /// A relay of `queue`'s jobs (the default queue or a named one) to `subject` (a literal
    /// subject: no wildcards) of the JetStream stream `stream` on the server at `url` (such
    /// as `nats://127.0.0.1:4222`; several servers of a cluster separated by commas, as
    /// [the module docs](crate::relay#several-servers) say). Nothing is checked until
    /// [`OutboundBuilder::start`].
    pub fn builder(queue: &Queue, url: &str, stream: &str, subject: &str) -> OutboundBuilder {
        OutboundBuilder {
            queue: queue.clone(),
            common: RelayConfig::new(url, stream, "leaseq-relay-out"),
            subject: subject.to_string(),
            max_in_flight: 256,
            publish_timeout: Duration::from_secs(5),
            lease: Duration::from_secs(30),
        }
    }

    /// Waits until the relay is connected and has checked the stream and subject, at most
    /// `timeout`.
    ///
    /// # Errors
    /// The relay's last error if it is not ready in time: `Unreachable`, `Tls` (a refused
    /// certificate), `Auth` (refused credentials, or a `.creds` file gone bad), `MissingStream`
    /// (the relay does not create streams), `SubjectNotCovered`, `InvalidOption` (the
    /// stream's duplicate window is too short for the lease), `Queue`.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), RelayError> {
        self.handle.wait_ready(timeout)
    }

    /// What the relay did so far, and its last error.
    pub fn stats(&self) -> RelayStats {
        self.handle.stats()
    }

    /// Stops the relay: no new job is leased; the batch in flight waits for its `PubAck`s (at
    /// most the publish timeout), is acked or given back, and the thread ends. Returns the
    /// final stats. Dropping the relay does the same.
    pub fn shutdown(mut self) -> RelayStats {
        self.handle.stop()
    }
}

/// The relay's thread.
struct Worker {
    queue: Queue,
    common: RelayConfig,
    subject: String,
    max_in_flight: usize,
    publish_timeout: Duration,
    lease: Duration,
    file_id: u64,
    shared: Arc<RelayState>,
}

/// What became of one publish.
enum Sent {
    Stored { duplicate: bool },
    Failed(async_nats::jetstream::context::PublishError),
}

impl Worker {
    fn run(self) {
        let rt = match self.common.runtime() {
            Ok(rt) => rt,
            Err(e) => return self.shared.fail(e),
        };
        // The client's JetStream context spawns onto the current runtime.
        let _runtime = rt.enter();
        let mut backoff = Backoff::new(self.common.max_backoff);
        let mut conn: Option<(async_nats::Client, async_nats::jetstream::Context)> = None;
        let mut ready = false;
        // Jobs whose publish failed at no cost to them (the connection or the stream went
        // away): kept leased, in queue order, and published again first, so an outage never
        // reorders the queue. Renewed while they wait.
        let mut held = Held::default();
        while !self.shared.stopping() && !self.queue.is_closed() {
            let Some((client, js)) = &conn else {
                match rt.block_on(self.common.connect(&self.shared)) {
                    Ok(client) => {
                        let js = async_nats::jetstream::context::ContextBuilder::new()
                            .timeout(self.publish_timeout)
                            .ack_timeout(self.publish_timeout)
                            // Every publish of a batch may wait for its PubAck at once.
                            .max_ack_inflight(self.max_in_flight)
                            .build(client.clone());
                        conn = Some((client, js));
                    }
                    // A shutdown during the attempt keeps the error met before it.
                    Err(_) if self.shared.stopping() => {}
                    Err(e) => {
                        self.shared.fail(e);
                        self.shared.sleep(backoff.step());
                    }
                }
                continue;
            };
            if client.connection_state() != async_nats::connection::State::Connected {
                if ready {
                    ready = false;
                    self.shared.fail(RelayError::Unreachable {
                        url: self.common.url.clone(),
                        reason: "connection lost; reconnecting".into(),
                    });
                }
                self.renew(&mut held);
                // The client reconnects by itself; look again soon, without spinning.
                self.shared.sleep(backoff.step().min(IDLE_POLL));
                continue;
            }
            if !ready {
                match rt.block_on(self.verify(js)) {
                    Ok(()) => {
                        ready = true;
                        self.shared.set_ready();
                    }
                    Err(e) => {
                        self.shared.fail(e);
                        self.renew(&mut held);
                        self.shared.sleep(backoff.step().min(self.lease / 4));
                        continue;
                    }
                }
            }
            let leases = if held.leases.is_empty() {
                match self.take() {
                    Ok(leases) => leases,
                    Err(e) if is_closed(&e) => break,
                    Err(e) => {
                        self.shared.note(e.into());
                        self.shared.sleep(backoff.step());
                        continue;
                    }
                }
            } else {
                std::mem::take(&mut held.leases)
            };
            if leases.is_empty() {
                continue;
            }
            let epoch = self.shared.disconnects.load(Ordering::Acquire);
            let sent = rt.block_on(self.publish(js, &leases));
            let connection_lost = self.shared.disconnects.load(Ordering::Acquire) != epoch
                || client.connection_state() != async_nats::connection::State::Connected;
            // Not one PubAck in time on an open connection: the server (or the network) is
            // not answering, which is no job's fault (a stopped server, a link dropping
            // packets silently).
            let stalled = !connection_lost
                && sent.iter().all(
                    |s| matches!(s, Sent::Failed(e) if e.kind() == PublishErrorKind::TimedOut),
                );
            let jobs = leases.len();
            let settled = self.finish_batch(leases, sent, connection_lost || stalled);
            if stalled {
                ready = false;
                self.shared.fail(RelayError::Unreachable {
                    url: self.common.url.clone(),
                    reason: format!(
                        "no PubAck for any of {jobs} jobs within {} ms: the server or the \
                         network is not answering",
                        self.publish_timeout.as_millis()
                    ),
                });
                self.shared.sleep(backoff.step().min(self.lease / 4));
            }
            if settled.stored {
                backoff.reset();
            }
            if !settled.held.is_empty() {
                held = Held {
                    leases: settled.held,
                    renewed: Instant::now(),
                };
            }
            if settled.stream_gone {
                // The stream no longer takes the subject: check it again, after a pause.
                ready = false;
                self.shared.sleep(backoff.step().min(self.lease / 4));
            }
        }
        // Jobs still held go back at no cost (they lose their place: the relay stops).
        for lease in held.leases.drain(..) {
            if let Err(e) = lease.snooze(Duration::ZERO)
                && !matches!(e, crate::Error::LeaseLost { .. })
            {
                self.shared.note(e.into());
            }
        }
        if let Some((client, _)) = conn {
            // Whatever was sent was settled above; nothing waits on the connection.
            drop(client);
        }
        drop(rt);
    }

    /// Keeps the held jobs leased: each lease is renewed (to the relay's lease) once a third
    /// of it has passed since the last renewal. A lease found lost is dropped (its job is
    /// another delivery's now).
    fn renew(&self, held: &mut Held) {
        if held.leases.is_empty() || held.renewed.elapsed() < self.lease / 3 {
            return;
        }
        self.extend(&mut held.leases, |_| true);
        held.renewed = Instant::now();
    }

    /// The stream exists, covers the subject, and its duplicate window is long enough.
    async fn verify(&self, js: &async_nats::jetstream::Context) -> Result<(), RelayError> {
        let stream = self.common.stream_info(js).await?;
        let config = &stream.cached_info().config;
        // A stream without subjects (a mirror, or one fed only by sources) takes no publish.
        let subjects = config.subjects.clone();
        if !subjects.iter().any(|p| subject_matches(p, &self.subject)) {
            return Err(RelayError::SubjectNotCovered {
                stream: self.common.stream.clone(),
                subject: self.subject.clone(),
                subjects,
            });
        }
        if config.no_ack {
            return Err(RelayError::InvalidOption(format!(
                "stream {:?} does not acknowledge publishes (no_ack): the relay cannot know a \
                 job was stored, so it would never ack one locally",
                self.common.stream
            )));
        }
        let window = config.duplicate_window;
        if window < self.lease + self.publish_timeout {
            return Err(RelayError::InvalidOption(format!(
                "stream {:?} has a duplicate window of {} ms, shorter than the relay's lease \
                 ({} ms) plus publish timeout ({} ms): a job published again could be stored \
                 twice; raise the window or shorten the lease",
                self.common.stream,
                window.as_millis(),
                self.lease.as_millis(),
                self.publish_timeout.as_millis()
            )));
        }
        Ok(())
    }

    /// Up to `max_in_flight` jobs in one commit, waiting (on the queue's wake-up, not
    /// polling) up to [`IDLE_POLL`] when there is none.
    fn take(&self) -> crate::Result<Vec<Lease>> {
        let leases = self.queue.dequeue_batch(self.max_in_flight)?;
        if !leases.is_empty() {
            return Ok(self.at_least_relay_lease(leases));
        }
        let Some(first) = self
            .queue
            .dequeue_until(IDLE_POLL, &self.shared.stop_signal)?
        else {
            return Ok(Vec::new());
        };
        let mut leases = vec![first];
        if self.max_in_flight > 1 {
            match self.queue.dequeue_batch(self.max_in_flight - 1) {
                Ok(more) => leases.extend(more),
                // The first is published anyway; the error shows in the next take.
                Err(e) => self.shared.note(e.into()),
            }
        }
        Ok(self.at_least_relay_lease(leases))
    }

    /// Extends to the relay's lease every lease `needs` picks (one commit each); a lease found
    /// lost is dropped (its job is another delivery's now) and counted as refused.
    fn extend(&self, leases: &mut Vec<Lease>, needs: impl Fn(&Lease) -> bool) {
        let mut lost = 0;
        leases.retain(|lease| {
            if !needs(lease) {
                return true;
            }
            match lease.extend(self.lease) {
                Ok(()) => true,
                Err(crate::Error::LeaseLost { .. }) => {
                    lost += 1;
                    false
                }
                Err(e) => {
                    self.shared.note(e.into());
                    true
                }
            }
        });
        if lost > 0 {
            self.shared.update(|s| s.refused += lost);
        }
    }

    /// A job's own lease shorter than the relay's could end while its publish waits for the
    /// PubAck (its job then delivered again, or dead): such leases are extended to the
    /// relay's first (one commit each; jobs with the queue's lease cost nothing).
    fn at_least_relay_lease(&self, mut leases: Vec<Lease>) -> Vec<Lease> {
        let relay_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        self.extend(&mut leases, |lease| lease.lease_ms() < relay_ms);
        leases
    }

    /// Publishes every job, in order, then waits for all their `PubAck`s until one shared
    /// deadline (so a dead server costs one timeout per batch, not one per job).
    async fn publish(&self, js: &async_nats::jetstream::Context, leases: &[Lease]) -> Vec<Sent> {
        // One deadline for the whole batch, sends included: a server that stops reading
        // costs one publish timeout, not one per job.
        let deadline = tokio::time::Instant::now() + self.publish_timeout;
        let mut pending = Vec::with_capacity(leases.len());
        for lease in leases {
            let mut headers = async_nats::HeaderMap::new();
            let id = message_id(self.file_id, lease.id(), lease.idempotency_key());
            headers.insert(MSG_ID_HEADER, id.as_str());
            headers.insert(JOB_ID_HEADER, lease.id().0.to_string().as_str());
            headers.insert(ENCODING_HEADER, encoding_name(lease.encoding()));
            let payload = bytes::Bytes::copy_from_slice(lease.payload());
            let send = js.publish_with_headers(self.subject.clone(), headers, payload);
            pending.push(match tokio::time::timeout_at(deadline, send).await {
                Ok(sent) => sent,
                Err(_) => Err(PublishErrorKind::TimedOut.into()),
            });
        }
        let mut sent = Vec::with_capacity(pending.len());
        for p in pending {
            let outcome = match p {
                Err(e) => Sent::Failed(e),
                Ok(ack) => match tokio::time::timeout_at(deadline, ack.into_future()).await {
                    Ok(Ok(ack)) => Sent::Stored {
                        duplicate: ack.duplicate,
                    },
                    Ok(Err(e)) => Sent::Failed(e),
                    Err(_) => Sent::Failed(PublishErrorKind::TimedOut.into()),
                },
            };
            sent.push(outcome);
        }
        sent
    }

    /// Acks the stored jobs in one commit, nacks or dead-letters those the server is blamed
    /// for, and hands back (in order) those whose failure costs them nothing.
    fn finish_batch(&self, leases: Vec<Lease>, sent: Vec<Sent>, connection_lost: bool) -> Settled {
        debug_assert_eq!(leases.len(), sent.len());
        let mut held = Vec::new();
        let mut stored = Vec::with_capacity(leases.len());
        let (mut duplicates, mut given_back, mut nacked, mut dead, mut refused) = (0, 0, 0, 0, 0);
        let mut stream_gone = false;
        let mut last: Option<RelayError> = None;
        for (lease, outcome) in leases.into_iter().zip(sent) {
            let e = match outcome {
                Sent::Stored { duplicate } => {
                    duplicates += u64::from(duplicate);
                    stored.push(lease);
                    continue;
                }
                Sent::Failed(e) => e,
            };
            let job = lease.id();
            let done = match e.kind() {
                PublishErrorKind::MaxPayloadExceeded => {
                    let reason = e.to_string();
                    last = Some(RelayError::TooLarge {
                        job,
                        reason: reason.clone(),
                    });
                    dead += 1;
                    lease.fail(&format!("too large for the NATS server: {reason}"))
                }
                PublishErrorKind::StreamNotFound => {
                    stream_gone = true;
                    given_back += 1;
                    held.push(lease);
                    continue;
                }
                PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => {
                    given_back += 1;
                    held.push(lease);
                    continue;
                }
                _ if connection_lost => {
                    given_back += 1;
                    held.push(lease);
                    continue;
                }
                _ => {
                    let reason = e.to_string();
                    last = Some(RelayError::Server {
                        job: Some(job),
                        reason: reason.clone(),
                    });
                    nacked += 1;
                    match lease.nack(&format!("JetStream publish: {reason}")) {
                        Ok(crate::JobState::Dead) => {
                            dead += 1;
                            Ok(())
                        }
                        Ok(_) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
            };
            match done {
                Ok(()) => {}
                Err(crate::Error::LeaseLost { .. }) => refused += 1,
                Err(e) => last = Some(e.into()),
            }
        }
        let mut moved = 0;
        let any_stored = !stored.is_empty();
        if !stored.is_empty() {
            match self.queue.ack_batch(&stored) {
                Ok(outcomes) => {
                    for r in outcomes {
                        match r {
                            Ok(()) => moved += 1,
                            Err(crate::Error::LeaseLost { .. }) => refused += 1,
                            Err(e) => last = Some(e.into()),
                        }
                    }
                }
                // The leases stay as they were: they end by their deadline and go again,
                // which the stream's window turns into duplicates it drops.
                Err(e) => last = Some(e.into()),
            }
        }
        self.shared.update(|s| {
            s.moved += moved;
            s.duplicates += duplicates;
            s.given_back += given_back;
            s.nacked += nacked;
            s.dead += dead;
            s.refused += refused;
        });
        if let Some(e) = last {
            self.shared.note(e);
        }
        Settled {
            held,
            stream_gone,
            stored: any_stored,
        }
    }
}

/// What [`Worker::finish_batch`] leaves to the loop.
struct Settled {
    /// Jobs to publish again, first, in order (their failure cost them nothing).
    held: Vec<Lease>,
    /// The server said no stream takes the subject.
    stream_gone: bool,
    /// At least one job of the batch is in the stream.
    stored: bool,
}

/// Jobs kept leased through an outage, and when their leases were last renewed.
struct Held {
    leases: Vec<Lease>,
    renewed: Instant,
}

impl Default for Held {
    fn default() -> Held {
        Held {
            leases: Vec::new(),
            renewed: Instant::now(),
        }
    }
}
