//! A real `nats-server` with JetStream for the relay tests: started on 127.0.0.1 on a free
//! port with its store in a temporary directory, killed with SIGKILL and restarted on the same
//! port and store, stopped on drop. Plus a small synchronous JetStream client for the checks.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;

/// The `nats-server` binary: `$NATS_SERVER`, else on `PATH`, else the distribution's
/// `/usr/sbin/nats-server` (Debian installs it there, outside a normal user's `PATH`).
pub fn find_nats_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("nats-server"));
    on_path
        .chain([
            "/usr/sbin/nats-server".into(),
            "/usr/bin/nats-server".into(),
        ])
        .find(|candidate| candidate.is_file())
}

/// [`find_nats_server`], or a panic that says what to install.
pub fn nats_server_bin() -> PathBuf {
    find_nats_server().unwrap_or_else(|| {
        panic!(
            "the relay tests need nats-server with JetStream (2.9 or later): \
             `apt-get install nats-server`, or set NATS_SERVER to its path"
        )
    })
}

pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    extra: String,
    /// Its `server_name` in a cluster ([`NatsServer::start_cluster`]).
    pub name: Option<String>,
}

impl NatsServer {
    /// A server with JetStream, its store in a fresh temporary directory.
    pub fn start() -> NatsServer {
        NatsServer::start_with("")
    }

    /// A server with extra configuration lines (such as `max_payload: 4096`).
    pub fn start_with(extra: &str) -> NatsServer {
        for _ in 0..5 {
            let port = free_port();
            let mut s = NatsServer {
                child: None,
                port,
                dir: tempfile::tempdir().unwrap(),
                extra: extra.to_string(),
                name: None,
            };
            if s.launch() {
                return s;
            }
        }
        panic!("nats-server did not start in 5 tries");
    }

    /// `n` servers with JetStream forming one cluster (`leaseq-test`, members `n0`, `n1`…,
    /// routes to every member), started in turn. Each is ready for clients at once; the
    /// cluster's JetStream needs a moment more to elect its leader (see
    /// [`Js::create_replicated_stream`]). A member killed and restarted rejoins.
    pub fn start_cluster(n: usize) -> Vec<NatsServer> {
        let routes: Vec<u16> = (0..n).map(|_| route_port()).collect();
        // A name of its own: two clusters of one name whose route lists met would merge.
        let all = routes
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ");
        (0..n)
            .map(|i| {
                let mut s = NatsServer::start_with(&format!(
                    "server_name: n{i}\ncluster {{\n  name: leaseq-test-{}\n  \
                     listen: 127.0.0.1:{}\n  routes: [{all}]\n}}",
                    routes[0], routes[i]
                ));
                s.name = Some(format!("n{i}"));
                s
            })
            .collect()
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Starts the process on this server's port and store; whether it became ready.
    fn launch(&mut self) -> bool {
        let conf = self.dir.path().join("server.conf");
        let store = self.dir.path().join("js");
        let mut f = std::fs::File::create(&conf).unwrap();
        writeln!(
            f,
            "listen: 127.0.0.1:{}\njetstream {{ store_dir: {:?} }}\n{}",
            self.port,
            store.display().to_string(),
            self.extra
        )
        .unwrap();
        let log = std::fs::File::create(self.log()).unwrap();
        let child = Command::new(nats_server_bin())
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(self.log()).unwrap_or_default();
            if text.contains("Server is ready") {
                return true;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                eprintln!("nats-server exited ({status}): {text}");
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "nats-server not ready in 20 s: {}",
            std::fs::read_to_string(self.log()).unwrap_or_default()
        );
    }

    /// Replaces the extra configuration lines, taken at the next [`NatsServer::restart`]
    /// (such as other credentials).
    pub fn set_extra(&mut self, extra: &str) {
        self.extra = extra.to_string();
    }

    /// SIGKILLs the server (no clean shutdown) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.launch() {
                return;
            }
            // The port may linger for a moment after the kill.
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("nats-server did not restart on port {}", self.port);
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port for a cluster's routes, free now: from a counter of this process (no two clusters
/// of the tests running beside each other get one port, as two `free_port` calls can once the
/// first port is released) below Linux's ephemeral range (32768 and up), which no outgoing
/// connection takes.
fn route_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20_000 + (std::process::id() % 4_000) as u16 * 2,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::AcqRel);
        assert!(port < 32_000, "no route port left");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A blocking JetStream client for the tests' own checks and set-up.
pub struct Js {
    rt: tokio::runtime::Runtime,
    pub js: jetstream::Context,
}

impl Js {
    pub fn connect(url: &str) -> Js {
        Js::connect_with(url, async_nats::ConnectOptions::new())
    }

    /// [`Js::connect`] with the client's own options (TLS, credentials). `url` may list
    /// several servers, separated by commas.
    pub fn connect_with(url: &str, options: async_nats::ConnectOptions) -> Js {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // One URL, or a comma-separated list of a cluster's members.
        let servers: Vec<async_nats::ServerAddr> =
            url.split(',').map(|u| u.trim().parse().unwrap()).collect();
        let client = rt.block_on(options.connect(servers)).unwrap();
        let js = {
            let _runtime = rt.enter();
            jetstream::new(client.clone())
        };
        Js { rt, js }
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// A file-stored stream over `subjects`, with the default 2-minute duplicate window
    /// unless `duplicate_window` is given.
    pub fn create_stream(&self, name: &str, subjects: &[&str], duplicate_window: Option<Duration>) {
        let config = jetstream::stream::Config {
            name: name.to_string(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            duplicate_window: duplicate_window.unwrap_or(Duration::from_secs(120)),
            ..Default::default()
        };
        self.block_on(self.js.create_stream(config)).unwrap();
    }

    /// A file-stored stream over `subjects` kept by `replicas` members of a cluster, tried
    /// again for up to 60 s while the cluster's JetStream has no leader yet.
    pub fn create_replicated_stream(&self, name: &str, subjects: &[&str], replicas: usize) {
        let config = jetstream::stream::Config {
            name: name.to_string(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            num_replicas: replicas,
            ..Default::default()
        };
        // Asked every second, not at the client's 5 s timeout.
        let mut js = self.js.clone();
        js.set_timeout(Duration::from_secs(1));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.block_on(js.create_stream(config.clone())) {
                Ok(_) => return,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("creating {name}: {e}; trying again");
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => panic!("creating {name}: {e}"),
            }
        }
    }

    /// The name of the cluster member leading `stream` (or, given `consumer`, that consumer),
    /// if it has a leader now.
    pub fn leader(&self, stream: &str, consumer: Option<&str>) -> Option<String> {
        self.block_on(async {
            let s = self.js.get_stream(stream).await.ok()?;
            let cluster = match consumer {
                None => s.cached_info().cluster.clone(),
                Some(name) => {
                    let c: jetstream::consumer::Consumer<jetstream::consumer::pull::Config> =
                        s.get_consumer(name).await.ok()?;
                    c.cached_info().cluster.clone()
                }
            };
            cluster?.leader
        })
    }

    /// [`Js::publish_many`] that reports a failed publish (a member killed under it) instead
    /// of panicking; the caller publishes the same ids again.
    pub fn try_publish_many(
        &self,
        subject: &str,
        messages: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<(), String> {
        self.block_on(async {
            let mut acks = Vec::new();
            for (id, payload) in messages {
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", id.as_str());
                let sent = self
                    .js
                    .publish_with_headers(subject.to_string(), h, payload.into())
                    .await;
                acks.push(sent.map_err(|e| e.to_string())?);
            }
            for a in acks {
                a.await.map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }

    /// Publishes and waits for the `PubAck`; `msg_id` as `Nats-Msg-Id` if given.
    pub fn publish(&self, subject: &str, msg_id: Option<&str>, payload: &[u8]) {
        let mut h = async_nats::HeaderMap::new();
        if let Some(id) = msg_id {
            h.insert("Nats-Msg-Id", id);
        }
        let payload = bytes::Bytes::copy_from_slice(payload);
        self.block_on(async {
            self.js
                .publish_with_headers(subject.to_string(), h, payload)
                .await
                .unwrap()
                .await
                .unwrap()
        });
    }

    /// Publishes every `(id, payload)` to `subject`, 500 in flight at a time, and waits for
    /// all the `PubAck`s.
    pub fn publish_many(
        &self,
        subject: &str,
        messages: impl IntoIterator<Item = (Option<String>, Vec<u8>)>,
    ) {
        self.block_on(async {
            let mut acks = Vec::new();
            for (id, payload) in messages {
                let mut h = async_nats::HeaderMap::new();
                if let Some(id) = id {
                    h.insert("Nats-Msg-Id", id.as_str());
                }
                let sent = self
                    .js
                    .publish_with_headers(subject.to_string(), h, payload.into());
                acks.push(sent.await.unwrap());
                if acks.len() == 500 {
                    for a in acks.drain(..) {
                        a.await.unwrap();
                    }
                }
            }
            for a in acks {
                a.await.unwrap();
            }
        });
    }

    /// The stream, asked again for up to 30 s while the server does not answer (a cluster
    /// electing the stream's leader after a member's restart).
    async fn stream(&self, stream: &str) -> jetstream::stream::Stream {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.js.get_stream(stream).await {
                Ok(s) => return s,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("stream {stream}: {e}; asking again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("stream {stream}: {e}"),
            }
        }
    }

    /// Every message of the stream, in order: (stream sequence, `Nats-Msg-Id`, payload).
    pub fn messages(&self, stream: &str) -> Vec<(u64, Option<String>, Vec<u8>)> {
        self.block_on(async {
            let s = self.stream(stream).await;
            let info = s.cached_info().state.clone();
            let mut out = Vec::new();
            for seq in info.first_sequence..=info.last_sequence {
                if info.messages == 0 {
                    break;
                }
                let mut tries = 0;
                let m = loop {
                    match s.get_raw_message(seq).await {
                        Ok(m) => break m,
                        Err(e) if tries < 20 => {
                            eprintln!("message {seq} of {stream}: {e}; asking again");
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        Err(e) => panic!("message {seq} of {stream}: {e}"),
                    }
                };
                let id = m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_string());
                out.push((seq, id, m.payload.to_vec()));
            }
            out
        })
    }

    /// When the stream was created, in nanoseconds since the Unix epoch: part of the local key
    /// an `Inbound` relay gives a message without an id (`{stream}:{created}:{sequence}`).
    pub fn stream_created_ns(&self, stream: &str) -> i128 {
        self.block_on(async {
            let s = self.stream(stream).await;
            s.cached_info().created.unix_timestamp_nanos()
        })
    }

    /// The number of messages in the stream.
    pub fn count(&self, stream: &str) -> u64 {
        self.block_on(async {
            let s = self.stream(stream).await;
            s.cached_info().state.messages
        })
    }

    /// (pending, ack pending) of a consumer.
    pub fn consumer_pending(&self, stream: &str, consumer: &str) -> (u64, usize) {
        self.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let s = self.stream(stream).await;
                let c: Result<jetstream::consumer::Consumer<jetstream::consumer::pull::Config>, _> =
                    s.get_consumer(consumer).await;
                match c {
                    Ok(c) => {
                        let info = c.cached_info();
                        return (info.num_pending, info.num_ack_pending);
                    }
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("consumer {consumer}: {e}; asking again");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(e) => panic!("consumer {consumer}: {e}"),
                }
            }
        })
    }
}

/// CPU time (user + system, in clock ticks of 1/100 s) used so far by this process's threads
/// whose names start with `prefix`, from `/proc/self/task/*/stat`.
pub fn thread_cpu_ticks(prefix: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the command (which is in parentheses and may hold spaces).
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
        let utime: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0);
        let stime: u64 = fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
        total += utime + stime;
    }
    total
}

/// The inbound apps' effects, in the queue's file: message key -> times applied.
pub const APPLIED: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("applied_effects");

/// The inbound apps' effect: counts one application of `key` in the ack's transaction.
pub fn apply(tx: &leaseq::Tx<'_>, key: &str) -> Result<(), leaseq::BoxError> {
    use redb::ReadableTable;
    let mut t = tx.open_table(APPLIED)?;
    let n = t.get(key)?.map_or(0, |v| v.value());
    t.insert(key, n + 1)?;
    Ok(())
}

/// The inbound relay the kill and cluster tests' apps run: stream `IN`, durable consumer
/// `edge`, batches of 100, a 2 s ack wait, backoff up to 200 ms.
pub fn app_inbound(inbox: &leaseq::Queue, url: &str) -> leaseq::relay::Inbound {
    leaseq::relay::Inbound::builder(inbox, url, "IN", "edge")
        .batch(100)
        .fetch_wait(Duration::from_millis(200))
        .ack_wait(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap()
}
