//! The inbound relay: a JetStream stream consumed into a local queue.

use super::{
    Backoff, MSG_ID_HEADER, RelayConfig, RelayError, RelayState, RelayStats, RelayThread,
    is_closed, spawn,
};
use crate::{BATCH_MAX, EnqueueOptions, Enqueued, KEY_BYTES_MAX, Queue};
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{AckPolicy, Consumer, pull};
use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a message the local queue refused stays away before JetStream offers it again.
const REFUSED_DELAY: Duration = Duration::from_secs(60);

/// The longest the acks of one pull may take to go out (a server gone makes them wait).
const ACK_PHASE_MAX: Duration = Duration::from_secs(2);

/// Pulls in a row that dropped the connection before the relay reports a message it cannot
/// read.
const POISON_PULLS: u32 = 3;

/// Options of an [`Inbound`] relay; [`InboundBuilder::start`] starts it.
pub struct InboundBuilder {
    queue: Queue,
    common: RelayConfig,
    consumer: String,
    filter_subject: Option<String>,
    batch: usize,
    fetch_wait: Duration,
    ack_wait: Duration,
    job_options: EnqueueOptions,
}

impl InboundBuilder {
    /// Takes only messages of this subject (wildcards allowed) when the relay creates the
    /// consumer. An existing consumer keeps its own filter.
    pub fn filter_subject(mut self, subject: &str) -> InboundBuilder {
        self.filter_subject = Some(subject.to_string());
        self
    }

    /// Fetches at most `n` messages at a time (1 to [`BATCH_MAX`]; 256 by
    /// default), enqueued in one local commit.
    pub fn batch(mut self, n: usize) -> InboundBuilder {
        self.batch = n;
        self
    }

    /// How long one pull waits for messages on an idle stream (10 ms to 60 s; 1 s by
    /// default): the longest a shutdown waits, and the pace of an idle relay.
    pub fn fetch_wait(mut self, wait: Duration) -> InboundBuilder {
        self.fetch_wait = wait;
        self
    }

    /// The consumer's `AckWait` when the relay creates it (at least 1 s; 30 s by default):
    /// how long after a delivery JetStream offers an unacked message again (a relay that died
    /// before its ack). An existing consumer keeps its own.
    pub fn ack_wait(mut self, wait: Duration) -> InboundBuilder {
        self.ack_wait = wait;
        self
    }

    /// The options every job starts from (priority, attempts, retry policy, lease, delay).
    /// The relay sets the dedup key and the idempotency key to the message's id, replacing
    /// any given here.
    pub fn job_options(mut self, options: EnqueueOptions) -> InboundBuilder {
        self.job_options = options;
        self
    }

    /// TLS and credentials for the servers ([`Connection`](super::Connection): none, and
    /// TLS only where a URL or the server asks for it, by default).
    pub fn connection(mut self, connection: super::Connection) -> InboundBuilder {
        self.common.connection = connection;
        self
    }

    /// How long one connection attempt may take (above 0; 5 s by default).
    pub fn connect_timeout(mut self, timeout: Duration) -> InboundBuilder {
        self.common.connect_timeout = timeout;
        self
    }

    /// The longest wait between two tries at an unreachable server or a missing stream (at
    /// least 100 ms; 5 s by default).
    pub fn max_backoff(mut self, cap: Duration) -> InboundBuilder {
        self.common.max_backoff = cap;
        self
    }

    /// Checks the options and starts the relay's thread (named `leaseq-relay-in`), which
    /// connects in the background (see [`Inbound::wait_ready`]). The consumer is made (durable,
    /// pull, explicit acks, from the stream's first message) if it does not exist.
    ///
    /// # Errors
    /// `BadUrl` for a URL that does not parse; `InvalidOption` for an option out of range, a
    /// bad stream or consumer name, a [`Connection`](super::Connection) whose file cannot be
    /// read or does not parse, credentials given twice.
    pub fn start(self) -> Result<Inbound, RelayError> {
        self.common.validate_for(&self.queue)?;
        if let Some(f) = &self.filter_subject
            && !super::valid_filter(f)
        {
            return Err(RelayError::InvalidOption(format!(
                "filter subject {f:?}: dot-separated tokens of printable ASCII, `*` for a \
                 token, `>` last"
            )));
        }
        if !super::valid_stream_name(&self.consumer) {
            return Err(RelayError::InvalidOption(format!(
                "consumer name {:?}: 1 to 255 printable ASCII bytes, none of ` . * > / \\`",
                self.consumer
            )));
        }
        if self.batch == 0 || self.batch > BATCH_MAX {
            return Err(RelayError::InvalidOption(format!(
                "batch {} is not within 1..={BATCH_MAX}",
                self.batch
            )));
        }
        if self.fetch_wait < Duration::from_millis(10) || self.fetch_wait > Duration::from_secs(60)
        {
            return Err(RelayError::InvalidOption(
                "fetch_wait must be within 10 ms..=60 s".into(),
            ));
        }
        if self.ack_wait < Duration::from_secs(1) {
            return Err(RelayError::InvalidOption(
                "ack_wait must be at least 1 s".into(),
            ));
        }
        let shared = RelayState::new();
        let url = self.common.url.clone();
        let worker = Worker {
            queue: self.queue,
            common: self.common,
            consumer: self.consumer,
            filter_subject: self.filter_subject,
            batch: self.batch,
            fetch_wait: self.fetch_wait,
            ack_wait: self.ack_wait,
            job_options: self.job_options,
            shared: Arc::clone(&shared),
        };
        let thread = spawn("leaseq-relay-in", &shared, move || worker.run())?;
        Ok(Inbound {
            handle: RelayThread {
                shared,
                url,
                thread: Some(thread),
            },
        })
    }
}

/// A running inbound relay: messages of a JetStream stream, through a durable pull consumer,
/// enqueued into a local queue; each message is acked to JetStream only after its local
/// enqueue committed, so a crash in between redelivers it, and its id (the `Nats-Msg-Id`
/// header, or `{stream}:{stream sequence}` for a message without one or with an id longer
/// than [`KEY_BYTES_MAX`]) keeps one local job (dedup key) and one
/// effect (idempotency key, with [`Lease::ack_with`](crate::Lease::ack_with)). See the
/// [module docs](crate::relay).
///
/// ```no_run
/// use leaseq::relay::Inbound;
/// use leaseq::Queue;
/// use std::time::Duration;
///
/// let dir = tempfile::tempdir()?;
/// let file = Queue::open(dir.path().join("edge.leaseq"))?;
/// let commands = file.named("commands")?;
/// let relay = Inbound::builder(&commands, "nats://127.0.0.1:4222", "COMMANDS", "edge-1")
///     .filter_subject("commands.edge-1")
///     .start()?;
/// while let Some(lease) = commands.dequeue_timeout(Duration::from_secs(1))? {
///     lease.ack_with(|_tx| Ok(()))?; // your writes here: applied once per message
/// }
/// relay.shutdown();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Inbound {
    handle: RelayThread,
}

impl Inbound {
    /// A relay of the stream `stream` on the server at `url` (several servers of a cluster
    /// separated by commas, as [the module docs](crate::relay#several-servers) say) into
    /// `queue` (the default queue or a named one), through the durable pull consumer
    /// `consumer`. Nothing is checked until [`InboundBuilder::start`].
    pub fn builder(queue: &Queue, url: &str, stream: &str, consumer: &str) -> InboundBuilder {
        InboundBuilder {
            queue: queue.clone(),
            common: RelayConfig::new(url, stream, "leaseq-relay-in"),
            consumer: consumer.to_string(),
            filter_subject: None,
            batch: 256,
            fetch_wait: Duration::from_secs(1),
            ack_wait: Duration::from_secs(30),
            job_options: EnqueueOptions::default(),
        }
    }

    /// Waits until the relay is connected and has its consumer, at most `timeout`.
    ///
    /// # Errors
    /// The relay's last error if it is not ready in time: `Unreachable`, `Tls` (a refused
    /// certificate), `Auth` (refused credentials, or a `.creds` file gone bad), `MissingStream`
    /// (the relay does not create streams), `Server` (the consumer could not be made),
    /// `Queue`.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), RelayError> {
        self.handle.wait_ready(timeout)
    }

    /// What the relay did so far, and its last error.
    pub fn stats(&self) -> RelayStats {
        self.handle.stats()
    }

    /// Stops the relay: the pull in progress ends (at most the fetch wait), its messages are
    /// enqueued and acked, and the thread ends. Returns the final stats. Dropping the relay
    /// does the same.
    pub fn shutdown(mut self) -> RelayStats {
        self.handle.stop()
    }
}

struct Worker {
    queue: Queue,
    common: RelayConfig,
    consumer: String,
    filter_subject: Option<String>,
    batch: usize,
    fetch_wait: Duration,
    ack_wait: Duration,
    job_options: EnqueueOptions,
    shared: Arc<RelayState>,
}

/// One fetched message and its key.
struct Fetched {
    msg: async_nats::jetstream::Message,
    key: Vec<u8>,
    stream_seq: u64,
    /// The sender's payload encoding (`Leaseq-Encoding`), if it said.
    encoding: Option<crate::Encoding>,
}

/// The consumer a relay pulls from, and when its stream was created (nanoseconds since the
/// Unix epoch): messages without an id are keyed by stream, creation and sequence, so a
/// stream deleted and made again (its sequences starting over) gives new keys.
struct Pull {
    consumer: Consumer<pull::Config>,
    created_ns: i128,
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
        let mut client: Option<async_nats::Client> = None;
        let mut consumer: Option<Pull> = None;
        // Pulls in a row during which the connection dropped: a message the client cannot
        // read (a header that is not UTF-8) drops it at every delivery.
        let mut dropped_pulls = 0u32;
        while !self.shared.stopping() && !self.queue.is_closed() {
            let Some(c) = &client else {
                match rt.block_on(self.common.connect(&self.shared)) {
                    Ok(c) => client = Some(c),
                    // A shutdown during the attempt keeps the error met before it.
                    Err(_) if self.shared.stopping() => {}
                    Err(e) => {
                        self.shared.fail(e);
                        self.shared.sleep(backoff.step());
                    }
                }
                continue;
            };
            if c.connection_state() != async_nats::connection::State::Connected {
                if consumer.take().is_some() {
                    self.shared.fail(RelayError::Unreachable {
                        url: self.common.url.clone(),
                        reason: "connection lost; reconnecting".into(),
                    });
                }
                self.shared
                    .sleep(backoff.step().min(Duration::from_millis(500)));
                continue;
            }
            let Some(cons) = &consumer else {
                match rt.block_on(self.consumer(c)) {
                    Ok(made) => {
                        consumer = Some(made);
                        self.shared.set_ready();
                    }
                    Err(e) => {
                        self.shared.fail(e);
                        self.shared.sleep(backoff.step());
                    }
                }
                continue;
            };
            let epoch = self.shared.disconnects.load(Ordering::Acquire);
            let pulled = rt.block_on(self.fetch(cons));
            if self.shared.disconnects.load(Ordering::Acquire) == epoch {
                if dropped_pulls >= POISON_PULLS {
                    self.shared.pin(None);
                }
                dropped_pulls = 0;
            } else {
                dropped_pulls += 1;
                if dropped_pulls >= POISON_PULLS {
                    // Kept as the last error through the reconnections it causes.
                    self.shared.pin(Some(self.poisoned(dropped_pulls)));
                }
            }
            let fetched = match pulled {
                Ok(f) => f,
                Err(e) => {
                    // The consumer may be gone with the server's restart: make sure of it
                    // again once connected.
                    consumer = None;
                    self.shared.fail(e);
                    self.shared.sleep(backoff.step());
                    continue;
                }
            };
            if fetched.is_empty() {
                continue;
            }
            backoff.reset();
            match self.enqueue(&fetched) {
                Ok(outcomes) => {
                    // A server gone before the acks: they are lost, and the messages come
                    // again after the ack wait, to find their jobs (the dedup key).
                    let acked = rt.block_on(tokio::time::timeout(
                        ACK_PHASE_MAX,
                        self.ack(c, fetched, outcomes),
                    ));
                    if acked.is_err() {
                        self.shared.note(RelayError::Server {
                            job: None,
                            reason: format!(
                                "acks not sent within {} ms; the messages will be delivered \
                                 again and find their local jobs",
                                ACK_PHASE_MAX.as_millis()
                            ),
                        });
                    }
                }
                Err(e) if is_closed(&e) => break,
                Err(e) => {
                    // Nothing committed; the messages come again after the ack wait.
                    self.shared.note(e.into());
                    self.shared.sleep(backoff.step());
                }
            }
        }
    }

    fn poisoned(&self, pulls: u32) -> RelayError {
        RelayError::Server {
            job: None,
            reason: format!(
                "the connection dropped during {pulls} pulls in a row from consumer {:?}: a \
                 message the client cannot read (such as a header that is not UTF-8) may be \
                 blocking it; it stays in the stream (remove or terminate it there)",
                self.consumer
            ),
        }
    }

    /// The stream checked and the durable consumer made or found.
    async fn consumer(&self, client: &async_nats::Client) -> Result<Pull, RelayError> {
        let js = async_nats::jetstream::new(client.clone());
        let stream = self.common.stream_info(&js).await?;
        let config = pull::Config {
            durable_name: Some(self.consumer.clone()),
            filter_subject: self.filter_subject.clone().unwrap_or_default(),
            ack_wait: self.ack_wait,
            max_ack_pending: i64::try_from(self.batch * 4).unwrap_or(i64::MAX).max(1_000),
            ..Default::default()
        };
        let consumer = stream
            .get_or_create_consumer(&self.consumer, config)
            .await
            .map_err(|e| RelayError::Server {
                job: None,
                reason: format!("consumer {:?}: {e}", self.consumer),
            })?;
        // An existing consumer that does not wait for each ack would let a message go that
        // the local queue never took.
        let found = &consumer.cached_info().config;
        if let Some(want) = &self.filter_subject
            && found.filter_subject != *want
        {
            return Err(RelayError::InvalidOption(format!(
                "consumer {:?} exists with filter subject {:?}, not {want:?}: use another \
                 consumer name, or delete that consumer",
                self.consumer, found.filter_subject
            )));
        }
        let policy = found.ack_policy;
        if policy != AckPolicy::Explicit {
            return Err(RelayError::InvalidOption(format!(
                "consumer {:?} has ack policy {policy:?}: the relay needs explicit acks \
                 (AckPolicy::Explicit), so a message is done only once it is a local job",
                self.consumer
            )));
        }
        Ok(Pull {
            consumer,
            created_ns: stream.cached_info().created.unix_timestamp_nanos(),
        })
    }

    /// One pull: up to `batch` messages, waiting at most the fetch wait for the first.
    async fn fetch(&self, pull: &Pull) -> Result<Vec<Fetched>, RelayError> {
        let server = |e: &dyn std::fmt::Display| RelayError::Server {
            job: None,
            reason: format!("fetch from consumer {:?}: {e}", self.consumer),
        };
        let mut batch = pull
            .consumer
            .fetch()
            .max_messages(self.batch)
            .expires(self.fetch_wait)
            .messages()
            .await
            .map_err(|e| server(&e))?;
        let mut out = Vec::with_capacity(self.batch);
        // The server ends the batch at its expiry; the guard covers a server that vanished.
        let deadline = tokio::time::Instant::now() + self.fetch_wait * 2 + Duration::from_secs(1);
        loop {
            let next = match tokio::time::timeout_at(deadline, batch.next()).await {
                Ok(next) => next,
                Err(_) => break,
            };
            let Some(msg) = next else { break };
            let msg = match msg {
                Ok(m) => m,
                // Messages already taken are enqueued; the rest come with the next pull.
                Err(e) if !out.is_empty() => {
                    self.shared.note(server(&e));
                    break;
                }
                Err(e) => return Err(server(&e)),
            };
            let (stream, stream_seq) = match msg.info() {
                Ok(info) => (info.stream.to_string(), info.stream_sequence),
                Err(e) => return Err(server(&e)),
            };
            let header = |name: &str| {
                msg.headers
                    .as_ref()
                    .and_then(|h| h.get(name))
                    .map(|v| v.as_str())
            };
            let key = header(MSG_ID_HEADER)
                .filter(|id| !id.is_empty())
                .map(super::message_key)
                .unwrap_or_else(|| {
                    format!("{stream}:{}:{stream_seq}", pull.created_ns).into_bytes()
                });
            debug_assert!(key.len() <= KEY_BYTES_MAX);
            let encoding = header(super::ENCODING_HEADER).and_then(super::encoding_of);
            out.push(Fetched {
                msg,
                key,
                stream_seq,
                encoding,
            });
            if out.len() >= self.batch {
                break;
            }
        }
        Ok(out)
    }

    /// One local commit for the whole pull; if the queue refuses the batch for one message
    /// (too large, say) or for its size limit (`Queue::set_limit`: full), each message on
    /// its own, so only the refused ones stay behind (nakked with a delay, kept in the stream).
    /// Returns, per message, whether it is now a local job (new or already there).
    fn enqueue(&self, fetched: &[Fetched]) -> crate::Result<Vec<Result<Enqueued, crate::Error>>> {
        let options = |f: &Fetched| {
            let o = self
                .job_options
                .clone()
                .dedup_key(&f.key)
                .idempotency_key(&f.key);
            match f.encoding {
                Some(e) => o.encoding(e),
                None => o,
            }
        };
        let all = self
            .queue
            .enqueue_batch(fetched.iter().map(|f| (f.msg.payload.as_ref(), options(f))));
        match all {
            Ok(done) => Ok(done.into_iter().map(Ok).collect()),
            // A full file refuses each of them the same: no one-by-one tries.
            Err(e @ crate::Error::StorageFull { .. }) => Ok(fetched
                .iter()
                .filter_map(|_| e.storage_full_copy())
                .map(Err)
                .collect()),
            // A full queue (its size limit) may still have room for some of them.
            Err(e) if refuses_input(&e) || is_full(&e) => {
                let mut each = Vec::with_capacity(fetched.len());
                for f in fetched {
                    match self.queue.enqueue(f.msg.payload.as_ref(), options(f)) {
                        Err(e) if !refuses_input(&e) && !is_full(&e) => {
                            return Err(e);
                        }
                        r => each.push(r),
                    }
                }
                Ok(each)
            }
            Err(e) => Err(e),
        }
    }

    /// Acks to JetStream every message that is now a local job; a `nak` with a delay for each
    /// one the queue refused (it stays in the stream).
    async fn ack(
        &self,
        client: &async_nats::Client,
        fetched: Vec<Fetched>,
        outcomes: Vec<Result<Enqueued, crate::Error>>,
    ) {
        let (mut moved, mut duplicates, mut refused) = (0, 0, 0);
        let mut last = None;
        for (f, outcome) in fetched.into_iter().zip(outcomes) {
            let kind = match outcome {
                Ok(Enqueued::New(_)) => {
                    moved += 1;
                    AckKind::Ack
                }
                Ok(_) => {
                    duplicates += 1;
                    AckKind::Ack
                }
                Err(e) => {
                    refused += 1;
                    let (key, stream_seq, reason) = (
                        String::from_utf8_lossy(&f.key).into_owned(),
                        f.stream_seq,
                        e.to_string(),
                    );
                    last = Some(match e {
                        crate::Error::QueueFull { .. } | crate::Error::StorageFull { .. } => {
                            RelayError::QueueFull {
                                key,
                                stream_seq,
                                reason,
                            }
                        }
                        _ => RelayError::TooLargeForQueue {
                            key,
                            stream_seq,
                            reason,
                        },
                    });
                    AckKind::Nak(Some(REFUSED_DELAY))
                }
            };
            // A lost ack is a redelivery later, which the dedup key absorbs.
            if let Err(e) = f.msg.ack_with(kind).await {
                last = Some(RelayError::Server {
                    job: None,
                    reason: format!("ack: {e}"),
                });
            }
        }
        if let Err(e) = client.flush().await {
            last = Some(RelayError::Server {
                job: None,
                reason: format!("ack: {e}"),
            });
        }
        self.shared.update(|s| {
            s.moved += moved;
            s.duplicates += duplicates;
            s.refused += refused;
        });
        if let Some(e) = last {
            self.shared.note(e);
        }
    }
}

/// Errors by which the queue refuses one message's input, not the call.
fn refuses_input(e: &crate::Error) -> bool {
    matches!(
        e,
        crate::Error::PayloadTooLarge { .. } | crate::Error::KeyTooLong { .. }
    )
}

/// Whether `e` refuses a job for want of room: the queue's size limit (`QueueFull`) or the
/// file's disk reserve (`StorageFull`). The message stays in the stream and comes again.
fn is_full(e: &crate::Error) -> bool {
    matches!(
        e,
        crate::Error::QueueFull { .. } | crate::Error::StorageFull { .. }
    )
}
