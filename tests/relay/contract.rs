//! The NATS JetStream relay (feature `nats`) against a real `nats-server` on 127.0.0.1: jobs
//! out to a stream and messages in from one, the bad inputs, and an unreachable server.
//! The kill tests (server and relay SIGKILLed during 10,000 jobs) are in
//! `tests/relay/kills.rs`.
//!
//! Adversarial tests of the NATS JetStream relay (feature `nats`) against a real
//! `nats-server`: they try to break the promises of the module docs (`src/relay/mod.rs`) with
//! priorities and delays, short per-job leases, payloads at the server's limit, streams that
//! vanish or refuse, frozen and killed servers, concurrent relays, closed files, odd message
//! ids and consumers, and repeated restarts (threads, CPU).
//!
//! Every check is on what was committed: the local file's jobs and the stream's messages.
//! A server is frozen with SIGSTOP (its connections stay up while it answers nothing) and
//! killed with SIGKILL. Tests that count this process's relay threads or their CPU run alone
//! (an exclusive lock); the others share it.

use crate::nats::{Js, NatsServer, thread_cpu_ticks};
use crate::{exclusive, shared};
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::stream::{Config as StreamConfig, DiscardPolicy, Source};
use leaseq::relay::{Inbound, Outbound, RelayError, RelayStats, message_id};
use leaseq::{EnqueueOptions, JobId, JobInfo, JobState, Queue, RetryPolicy};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

const READY: Duration = Duration::from_secs(20);

fn temp_queue() -> (tempfile::TempDir, Queue) {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("edge.leaseq")).unwrap();
    (dir, q)
}

#[test]
fn outbound_publishes_every_job_once_with_its_message_id_and_acks_locally() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("EVENTS", &["events.>"], None);
    let (_dir, file) = temp_queue();
    let outbox = file.named("outbox").unwrap();
    let mut expected = Vec::new();
    for i in 0..600u32 {
        // Every third job carries an idempotency key: its message id is the key.
        let opts = if i % 3 == 0 {
            EnqueueOptions::default().idempotency_key(format!("order-{i}"))
        } else {
            EnqueueOptions::default()
        };
        let id = outbox
            .enqueue(format!("event {i}").as_bytes(), opts)
            .unwrap()
            .id();
        expected.push((i, id));
    }
    // A job of another queue of the same file stays where it is.
    file.enqueue(b"not relayed", EnqueueOptions::default())
        .unwrap();
    let relay = Outbound::builder(&outbox, &server.url(), "EVENTS", "events.edge")
        .max_in_flight(100)
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    wait_for(Duration::from_secs(30), "the outbox to drain", || {
        outbox.stats().unwrap().total == 0
    });
    let stats = relay.shutdown();
    assert_eq!(
        (stats.moved, stats.nacked, stats.dead),
        (600, 0, 0),
        "{stats:?}"
    );
    assert!(stats.last_error.is_none(), "{stats:?}");

    let messages = js.messages("EVENTS");
    assert_eq!(messages.len(), 600);
    let file_id = file.file_id().unwrap();
    for ((_, msg_id, payload), (i, job)) in messages.iter().zip(&expected) {
        // In queue order (one priority: by age), each with its derived id.
        assert_eq!(payload, format!("event {i}").as_bytes());
        let key = (i % 3 == 0).then(|| format!("order-{i}"));
        let want = message_id(file_id, *job, key.as_deref().map(str::as_bytes));
        assert_eq!(msg_id.as_deref(), Some(want.as_str()));
    }
    assert_eq!(
        file.stats().unwrap().ready,
        1,
        "the default queue was not relayed"
    );
    assert_eq!(file.file_id().unwrap(), file_id, "the file id is stable");
}

#[test]
fn inbound_enqueues_each_message_once_and_acks_after_the_commit() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("CMDS", &["cmds.>"], None);
    for i in 0..300u32 {
        let id = format!("cmd-{i}");
        // Every fifth message has no id: its key is the stream and sequence.
        let msg_id = (i % 5 != 0).then_some(id.as_str());
        js.publish("cmds.edge-1", msg_id, format!("command {i}").as_bytes());
    }
    js.publish("cmds.edge-2", Some("other"), b"for another edge");
    let (_dir, file) = temp_queue();
    let inbox = file.named("inbox").unwrap();
    let relay = Inbound::builder(&inbox, &server.url(), "CMDS", "edge-1")
        .filter_subject("cmds.edge-1")
        .batch(64)
        .fetch_wait(Duration::from_millis(200))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    wait_for(Duration::from_secs(30), "300 local jobs", || {
        inbox.stats().unwrap().total == 300
    });
    wait_for(Duration::from_secs(30), "the consumer to be acked", || {
        js.consumer_pending("CMDS", "edge-1") == (0, 0)
    });
    let stats = relay.shutdown();
    assert_eq!(
        (stats.moved, stats.duplicates, stats.refused),
        (300, 0, 0),
        "{stats:?}"
    );
    let mut seen = HashSet::new();
    let created = js.stream_created_ns("CMDS");
    for i in 0..300u32 {
        let lease = inbox
            .dequeue()
            .unwrap()
            .expect("a job per message, in stream order");
        assert_eq!(lease.payload(), format!("command {i}").as_bytes());
        let key = if i % 5 == 0 {
            format!("CMDS:{created}:{}", i + 1)
        } else {
            format!("cmd-{i}")
        };
        assert_eq!(lease.idempotency_key(), Some(key.as_bytes()));
        assert!(seen.insert(key));
        lease.ack_with(|_| Ok(())).unwrap();
    }
    assert!(inbox.dequeue().unwrap().is_none());
}

#[test]
fn inbound_keeps_one_local_job_when_a_message_is_delivered_again() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    // No duplicate window to speak of: the stream stores the same id twice, as after the
    // window; the local queue must still keep one job, and apply it once.
    js.create_stream("DUP", &["dup"], Some(Duration::from_millis(100)));
    js.publish("dup", Some("same"), b"first copy");
    std::thread::sleep(Duration::from_millis(300));
    js.publish("dup", Some("same"), b"second copy");
    assert_eq!(js.count("DUP"), 2);
    let (_dir, file) = temp_queue();
    let relay = Inbound::builder(&file, &server.url(), "DUP", "c")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(20), "both copies acked", || {
        relay.stats().moved + relay.stats().duplicates == 2
    });
    let stats = relay.shutdown();
    assert_eq!((stats.moved, stats.duplicates), (1, 1), "{stats:?}");
    assert_eq!(file.stats().unwrap().total, 1);
    let lease = file.dequeue().unwrap().unwrap();
    assert_eq!(lease.payload(), b"first copy");
    assert_eq!(lease.ack_with(|_| Ok(())).unwrap(), leaseq::Applied::Now);
    // The same id again after the job ended: a new local job, whose effect is not applied.
    js.publish("dup", Some("same"), b"third copy");
    let relay = Inbound::builder(&file, &server.url(), "DUP", "c")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(20), "the third copy", || {
        file.stats().unwrap().total == 1
    });
    relay.shutdown();
    let lease = file.dequeue().unwrap().unwrap();
    assert_eq!(
        lease.ack_with(|_| panic!("applied twice")).unwrap(),
        leaseq::Applied::AlreadyApplied
    );
}

#[test]
fn an_unreachable_server_leaves_every_job_and_costs_no_busy_loop() {
    let _g = exclusive();
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let (_dir, file) = temp_queue();
    for i in 0..50u32 {
        file.enqueue(&i.to_le_bytes(), EnqueueOptions::default().max_attempts(1))
            .unwrap();
    }
    let before = thread_cpu_ticks("leaseq-relay");
    let relay = Outbound::builder(&file, &url, "EVENTS", "events.x")
        .max_backoff(Duration::from_millis(400))
        .start()
        .unwrap();
    let err = relay.wait_ready(Duration::from_millis(500)).unwrap_err();
    assert!(matches!(err, RelayError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains(&url), "{err}");
    std::thread::sleep(Duration::from_secs(3));
    // Up to 3 s of waiting: a busy loop would burn hundreds of ticks.
    let used = thread_cpu_ticks("leaseq-relay") - before;
    let stats = relay.shutdown();
    assert!(
        used <= 30,
        "the relay used {used} ticks of CPU in 3.5 s while offline"
    );
    assert!(!stats.ready);
    let s = file.stats().unwrap();
    assert_eq!((s.ready, s.leased, s.dead), (50, 0, 0), "{s:?}");
    let job = file.jobs(JobState::Ready, None, 1).unwrap().jobs.remove(0);
    assert_eq!(job.attempts, 0, "no attempt is charged while offline");
}

#[test]
fn a_server_that_appears_later_gets_the_jobs_kept_meanwhile() {
    let _g = shared();
    let mut server = NatsServer::start();
    let url = server.url();
    server.kill();
    let (_dir, file) = temp_queue();
    let relay = Outbound::builder(&file, &url, "LATE", "late")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    for i in 0..100u32 {
        file.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    assert!(relay.wait_ready(Duration::from_millis(300)).is_err());
    server.restart();
    let js = Js::connect(&url);
    js.create_stream("LATE", &["late"], None);
    relay.wait_ready(READY).unwrap();
    wait_for(
        Duration::from_secs(30),
        "the jobs kept offline to go out",
        || file.stats().unwrap().total == 0,
    );
    relay.shutdown();
    let got: Vec<Vec<u8>> = js.messages("LATE").into_iter().map(|m| m.2).collect();
    let want: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().to_vec()).collect();
    assert_eq!(got, want, "in queue order, once each");
}

#[test]
fn bad_url_and_options_are_refused_at_start() {
    let _g = shared();
    let (_dir, file) = temp_queue();
    let e = Outbound::builder(&file, "nats://:::bad", "S", "s")
        .start()
        .err()
        .unwrap();
    assert!(matches!(e, RelayError::BadUrl { .. }), "{e:?}");
    let e = Inbound::builder(&file, "not a url at all::", "S", "c")
        .start()
        .err()
        .unwrap();
    assert!(matches!(e, RelayError::BadUrl { .. }), "{e:?}");
    for subject in ["s.*", "s.>", "", "a..b", "a b"] {
        let e = Outbound::builder(&file, "nats://127.0.0.1:4222", "S", subject)
            .start()
            .err()
            .unwrap();
        assert!(
            matches!(e, RelayError::InvalidOption(_)),
            "{subject:?}: {e:?}"
        );
    }
    for stream in ["", "A.B", "A*"] {
        let e = Outbound::builder(&file, "nats://127.0.0.1:4222", stream, "s")
            .start()
            .err()
            .unwrap();
        assert!(
            matches!(e, RelayError::InvalidOption(_)),
            "{stream:?}: {e:?}"
        );
    }
    let bad = [
        Outbound::builder(&file, "nats://127.0.0.1:4222", "S", "s").max_in_flight(0),
        Outbound::builder(&file, "nats://127.0.0.1:4222", "S", "s")
            .max_in_flight(leaseq::BATCH_MAX + 1),
        Outbound::builder(&file, "nats://127.0.0.1:4222", "S", "s")
            .publish_timeout(Duration::from_secs(20)),
        Outbound::builder(&file, "nats://127.0.0.1:4222", "S", "s").lease(Duration::ZERO),
        Outbound::builder(&file, "nats://127.0.0.1:4222", "S", "s").connect_timeout(Duration::ZERO),
    ];
    for b in bad {
        let e = b.start().err().unwrap();
        assert!(matches!(e, RelayError::InvalidOption(_)), "{e:?}");
    }
    let bad = [
        Inbound::builder(&file, "nats://127.0.0.1:4222", "S", "c").batch(0),
        Inbound::builder(&file, "nats://127.0.0.1:4222", "S", "c.d"),
        Inbound::builder(&file, "nats://127.0.0.1:4222", "S", "c").fetch_wait(Duration::ZERO),
        Inbound::builder(&file, "nats://127.0.0.1:4222", "S", "c")
            .ack_wait(Duration::from_millis(10)),
    ];
    for b in bad {
        let e = b.start().err().unwrap();
        assert!(matches!(e, RelayError::InvalidOption(_)), "{e:?}");
    }
    assert_eq!(file.stats().unwrap().total, 0);
}

#[test]
fn a_missing_stream_or_an_uncovered_subject_is_a_typed_error_and_jobs_stay() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    let (_dir, file) = temp_queue();
    for i in 0..20u32 {
        file.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    let relay = Outbound::builder(&file, &server.url(), "NOPE", "nope.x")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    let e = relay.wait_ready(Duration::from_secs(3)).unwrap_err();
    match &e {
        RelayError::MissingStream { stream, reason } => {
            assert_eq!(stream, "NOPE");
            assert!(reason.contains("stream not found"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    relay.shutdown();

    js.create_stream("ORDERS", &["orders.eu.*"], None);
    let relay = Outbound::builder(&file, &server.url(), "ORDERS", "orders.us.new")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    let e = relay.wait_ready(Duration::from_secs(3)).unwrap_err();
    match &e {
        RelayError::SubjectNotCovered {
            stream, subjects, ..
        } => {
            assert_eq!(stream, "ORDERS");
            assert_eq!(subjects, &["orders.eu.*".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    relay.shutdown();

    // A window shorter than the lease plus the publish timeout: refused, jobs stay.
    js.create_stream("SHORT", &["short"], Some(Duration::from_secs(10)));
    let relay = Outbound::builder(&file, &server.url(), "SHORT", "short")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    let e = relay.wait_ready(Duration::from_secs(3)).unwrap_err();
    assert!(
        matches!(&e, RelayError::InvalidOption(m) if m.contains("duplicate window")),
        "{e:?}"
    );
    relay.shutdown();

    let s = file.stats().unwrap();
    assert_eq!((s.ready, s.leased, s.dead), (20, 0, 0), "{s:?}");
    assert_eq!(js.count("ORDERS") + js.count("SHORT"), 0);

    // The inbound side: a missing stream.
    let inbound = Inbound::builder(&file, &server.url(), "NOPE", "c")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    let e = inbound.wait_ready(Duration::from_secs(3)).unwrap_err();
    assert!(matches!(e, RelayError::MissingStream { .. }), "{e:?}");
    inbound.shutdown();
}

#[test]
fn a_job_too_large_for_the_server_is_dead_with_the_servers_reason_and_the_rest_go() {
    let _g = shared();
    let server = NatsServer::start_with("max_payload: 4096");
    let js = Js::connect(&server.url());
    js.create_stream("SMALL", &["small"], None);
    let (_dir, file) = temp_queue();
    let small = file
        .enqueue(b"fits", EnqueueOptions::default())
        .unwrap()
        .id();
    let big = file
        .enqueue(&vec![7u8; 10_000], EnqueueOptions::default())
        .unwrap()
        .id();
    let after = file
        .enqueue(b"fits too", EnqueueOptions::default())
        .unwrap()
        .id();
    let relay = Outbound::builder(&file, &server.url(), "SMALL", "small")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(20), "the two that fit", || {
        file.stats().unwrap().pending() == 0 && file.stats().unwrap().dead == 1
    });
    let stats = relay.shutdown();
    assert_eq!((stats.moved, stats.dead), (2, 1), "{stats:?}");
    match stats.last_error {
        Some(RelayError::TooLarge { job, reason }) => {
            assert_eq!(job, big);
            assert!(reason.contains("4096"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let dead = file.job(big).unwrap().unwrap();
    assert_eq!(dead.state, JobState::Dead);
    assert!(dead.last_error.unwrap().contains("too large"));
    assert!(file.job(small).unwrap().is_none() && file.job(after).unwrap().is_none());
    assert_eq!(js.count("SMALL"), 2);
}

#[test]
fn a_message_too_large_for_the_local_queue_stays_in_the_stream() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("IN", &["in"], None);
    js.publish("in", Some("a"), b"small");
    js.publish("in", Some("b"), &vec![1u8; 5_000]);
    js.publish("in", Some("c"), b"small too");
    let dir = tempfile::tempdir().unwrap();
    let file = Queue::builder()
        .payload_bytes_max(1_024)
        .open(dir.path().join("q.leaseq"))
        .unwrap();
    let relay = Inbound::builder(&file, &server.url(), "IN", "c")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(20), "the refusal", || {
        relay.stats().refused >= 1
    });
    let stats = relay.shutdown();
    assert_eq!(stats.moved, 2, "{stats:?}");
    match stats.last_error {
        Some(RelayError::TooLargeForQueue {
            key, stream_seq, ..
        }) => {
            assert_eq!((key.as_str(), stream_seq), ("b", 2));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(file.stats().unwrap().total, 2);
    assert_eq!(
        js.count("IN"),
        3,
        "the refused message is still in the stream"
    );
    let (pending, ack_pending) = js.consumer_pending("IN", "c");
    assert_eq!(
        (pending, ack_pending),
        (0, 1),
        "only the refused one is unacked"
    );
}

/// A local queue's size limit holds on the way in: with room for two jobs, a pull of three
/// moves two (one commit refused, then each message on its own) and leaves the third in the
/// stream, unacked, as `RelayError::QueueFull`.
#[test]
fn a_message_the_full_local_queue_refuses_stays_in_the_stream() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("IN", &["in"], None);
    for (id, payload) in [("a", &b"one"[..]), ("b", b"two"), ("c", b"three")] {
        js.publish("in", Some(id), payload);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = Queue::open(dir.path().join("q.leaseq")).unwrap();
    file.set_limit(Some(leaseq::QueueLimit::jobs(2))).unwrap();
    let relay = Inbound::builder(&file, &server.url(), "IN", "c")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(20), "the refusal", || {
        relay.stats().refused >= 1
    });
    let stats = relay.shutdown();
    assert_eq!(stats.moved, 2, "{stats:?}");
    match stats.last_error {
        Some(RelayError::QueueFull {
            key, stream_seq, ..
        }) => assert_eq!((key.as_str(), stream_seq), ("c", 3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(file.stats().unwrap().pending(), 2);
    let (pending, ack_pending) = js.consumer_pending("IN", "c");
    assert_eq!(
        (pending, ack_pending),
        (0, 1),
        "only the refused one is unacked"
    );
}

#[test]
fn closing_the_file_stops_the_relay_without_losing_a_job() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("C", &["c"], None);
    let (_dir, file) = temp_queue();
    let relay = Outbound::builder(&file, &server.url(), "C", "c")
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    file.close();
    let stats = relay.shutdown();
    assert_eq!(stats.moved, 0);
    assert!(matches!(
        file.enqueue(b"x", EnqueueOptions::default()),
        Err(leaseq::Error::Closed)
    ));
}

/// Waits until `f` holds, at most `limit`; whether it did.
fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `f` holds, at most `limit`; panics with `what` otherwise.
fn wait_for(limit: Duration, what: &str, f: impl FnMut() -> bool) {
    assert!(wait_until(limit, f), "timed out waiting for {what}");
}

fn file() -> (tempfile::TempDir, PathBuf, Queue) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.leaseq");
    let q = Queue::open(&path).unwrap();
    (dir, path, q)
}

/// Runs `f` on its own thread; its result comes on the channel.
fn background<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> (mpsc::Receiver<T>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    (rx, h)
}

/// The pid of a harness server's process (found by its config file on the command line).
fn server_pid(server: &NatsServer) -> u32 {
    let conf = server.dir.path().join("server.conf");
    let needle = conf.to_string_lossy().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("nats-server") && cmdline.contains(&needle) {
            return pid;
        }
    }
    panic!("no nats-server process for {needle}");
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// A server frozen by SIGSTOP (its TCP connections stay up, it reads and answers nothing);
/// thawed by SIGCONT on `thaw` or drop.
struct Frozen(Option<u32>);

impl Frozen {
    fn freeze(server: &NatsServer) -> Frozen {
        let pid = server_pid(server);
        signal(pid, "STOP");
        Frozen(Some(pid))
    }

    fn thaw(&mut self) {
        if let Some(pid) = self.0.take() {
            // The process may be gone (killed while stopped).
            let _ = std::process::Command::new("kill")
                .arg("-CONT")
                .arg(pid.to_string())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.thaw();
    }
}

/// Threads of this process named by a relay (`leaseq-relay-out`, `leaseq-relay-in` and
/// their runtimes' `-io` threads; `comm` keeps 15 bytes).
fn relay_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .unwrap_or_default()
                .starts_with("leaseq-relay")
        })
        .count()
}

/// Every job of the queue in `state` (up to 10,000).
fn jobs(q: &Queue, state: JobState) -> Vec<JobInfo> {
    q.jobs(state, None, 10_000).unwrap().jobs
}

/// All local jobs' payloads, by state.
fn local_payloads(q: &Queue) -> HashMap<Vec<u8>, JobState> {
    let mut out = HashMap::new();
    for state in [
        JobState::Scheduled,
        JobState::Ready,
        JobState::Leased,
        JobState::Dead,
    ] {
        for j in jobs(q, state) {
            out.insert(q.payload(j.id).unwrap().unwrap(), state);
        }
    }
    out
}

fn stream_config(name: &str, subjects: &[&str]) -> StreamConfig {
    StreamConfig {
        name: name.to_string(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    }
}

/// The wire size of the relay's headers for one message (as the client and server count
/// them): `NATS/1.0\r\n`, each `Name: value\r\n`, and `\r\n`.
fn header_wire_len(msg_id: &str, job: JobId) -> usize {
    let line = |name: &str, value: &str| name.len() + 2 + value.len() + 2;
    10 + line("Nats-Msg-Id", msg_id)
        + line("Leaseq-Job-Id", &job.0.to_string())
        + line("Leaseq-Encoding", "bincode")
        + 2
}

/// A queue opened again at `path` within `limit` (the relays must have let go of it).
fn reopen_within(path: &Path, limit: Duration) -> Result<Queue, leaseq::Error> {
    let deadline = Instant::now() + limit;
    loop {
        match Queue::open(path) {
            Ok(q) => return Ok(q),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Outbound: order, delays, leases, sizes.
// ---------------------------------------------------------------------------------------

#[test]
fn priorities_go_out_first_and_delayed_jobs_wait_for_their_time() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("ORD", &["ord"], None);
    let (_dir, _path, file) = file();
    let mut immediate = Vec::new();
    let prios = [5, -3, 0, 7, -3];
    for i in 0..30usize {
        let p = prios[i % prios.len()];
        let payload = format!("p{p}-{i:02}");
        file.enqueue(payload.as_bytes(), EnqueueOptions::default().priority(p))
            .unwrap();
        immediate.push((p, i, payload));
    }
    let delay = Duration::from_secs(4);
    let enqueued_late = Instant::now();
    let late: Vec<String> = (0..5).map(|i| format!("late-{i}")).collect();
    for l in &late {
        // The best priority of all: only their delay keeps them back.
        file.enqueue(
            l.as_bytes(),
            EnqueueOptions::default().priority(-100).delay(delay),
        )
        .unwrap();
    }
    let relay = Outbound::builder(&file, &server.url(), "ORD", "ord")
        .max_in_flight(7)
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    // While the delay runs, the stream gets exactly the immediate jobs.
    wait_for(Duration::from_secs(15), "the 30 immediate jobs", || {
        js.count("ORD") >= 30
    });
    let mut early_count = js.count("ORD");
    while enqueued_late.elapsed() < delay - Duration::from_millis(300) {
        early_count = early_count.max(js.count("ORD"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        early_count, 30,
        "a delayed job went out before its delay ran out"
    );
    assert_eq!(file.stats().unwrap().scheduled, 5);
    wait_for(Duration::from_secs(15), "the delayed jobs", || {
        file.stats().unwrap().total == 0
    });
    let stats = relay.shutdown();
    assert_eq!(
        (stats.moved, stats.nacked, stats.dead),
        (35, 0, 0),
        "{stats:?}"
    );
    immediate.sort_by_key(|(p, i, _)| (*p, *i));
    let want: Vec<String> = immediate
        .into_iter()
        .map(|(_, _, s)| s)
        .chain(late)
        .collect();
    let got: Vec<String> = js
        .messages("ORD")
        .into_iter()
        .map(|m| String::from_utf8(m.2).unwrap())
        .collect();
    assert_eq!(got, want, "priority, then age; the delayed ones last");
}

#[test]
fn a_job_whose_own_lease_ends_during_the_publish_is_not_dead_once_it_is_in_the_stream() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("LEASE", &["lease"], None);
    let (_dir, _path, file) = file();
    // Two relays on one queue (as the docs allow): the idle one reclaims expired leases.
    let start = || {
        Outbound::builder(&file, &server.url(), "LEASE", "lease")
            .publish_timeout(Duration::from_secs(3))
            .start()
            .unwrap()
    };
    let (a, b) = (start(), start());
    a.wait_ready(READY).unwrap();
    b.wait_ready(READY).unwrap();
    let mut frozen = Frozen::freeze(&server);
    // The job's own lease (100 ms) is far shorter than the relays' (30 s) and than the
    // publish timeout (3 s): "a job's own lease wins".
    let id = file
        .enqueue(
            b"short lease",
            EnqueueOptions::default()
                .lease(Duration::from_millis(100))
                .max_attempts(1),
        )
        .unwrap()
        .id();
    wait_for(Duration::from_secs(5), "a relay to lease the job", || {
        file.job(id).unwrap().is_some_and(|j| j.attempts == 1)
    });
    // The PubAck is late (frozen server), but well within the publish timeout.
    std::thread::sleep(Duration::from_millis(1000));
    frozen.thaw();
    wait_for(Duration::from_secs(10), "the message in the stream", || {
        js.count("LEASE") == 1
    });
    wait_for(Duration::from_secs(10), "the relays to settle", || {
        let (sa, sb) = (a.stats(), b.stats());
        sa.moved + sb.moved + sa.refused + sb.refused >= 1
    });
    let (sa, sb) = (a.shutdown(), b.shutdown());
    let job = file.job(id).unwrap();
    assert!(
        job.is_none(),
        "the job's message is in the stream (PubAck received), yet the job is still local: \
         {job:?}; relay stats {sa:?} / {sb:?}"
    );
}

#[test]
fn payloads_at_the_servers_limit_count_headers_exactly() {
    let _g = shared();
    let server = NatsServer::start_with("max_payload: 4096");
    let js = Js::connect(&server.url());
    js.create_stream("EDGE", &["edge"], None);
    let (_dir, _path, file) = file();
    // Learn the next job ids: the header carries the job id, so its length counts.
    let probe = file
        .enqueue(b"probe", EnqueueOptions::default())
        .unwrap()
        .id();
    file.remove(probe).unwrap();
    let (fit_id, over_id) = (JobId(probe.0 + 1), JobId(probe.0 + 2));
    let fit_len = 4096 - header_wire_len("fit", fit_id);
    let over_len = 4096 - header_wire_len("over", over_id) + 1;
    let fit = file
        .enqueue(
            &vec![b'f'; fit_len],
            EnqueueOptions::default().idempotency_key("fit"),
        )
        .unwrap()
        .id();
    let over = file
        .enqueue(
            &vec![b'o'; over_len],
            EnqueueOptions::default().idempotency_key("over"),
        )
        .unwrap()
        .id();
    assert_eq!((fit, over), (fit_id, over_id), "job ids as predicted");
    let after = file
        .enqueue(b"after", EnqueueOptions::default())
        .unwrap()
        .id();
    let relay = Outbound::builder(&file, &server.url(), "EDGE", "edge")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(15), "the queue to settle", || {
        let s = file.stats().unwrap();
        s.pending() == 0
    });
    let stats = relay.shutdown();
    assert_eq!(
        (stats.moved, stats.dead, stats.given_back, stats.nacked),
        (2, 1, 0, 0),
        "{stats:?}"
    );
    match &stats.last_error {
        Some(RelayError::TooLarge { job, .. }) => assert_eq!(*job, over),
        other => panic!("{other:?}"),
    }
    assert!(file.job(fit).unwrap().is_none() && file.job(after).unwrap().is_none());
    assert_eq!(file.job(over).unwrap().unwrap().state, JobState::Dead);
    let msgs = js.messages("EDGE");
    assert_eq!(msgs.len(), 2);
    assert_eq!(
        msgs[0].2.len(),
        fit_len,
        "exactly at the limit: stored whole"
    );
    assert_eq!(msgs[0].1.as_deref(), Some("fit"));
    assert_eq!(msgs[1].2, b"after");
}

#[test]
fn max_in_flight_above_the_clients_ack_permits_does_not_deadlock() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("BIG", &["big"], None);
    let (_dir, _path, file) = file();
    const N: u32 = 6_000;
    let jobs: Vec<(Vec<u8>, EnqueueOptions)> = (0..N)
        .map(|i| (i.to_le_bytes().to_vec(), EnqueueOptions::default()))
        .collect();
    file.enqueue_batch(jobs.iter().map(|(p, o)| (p.as_slice(), o.clone())))
        .unwrap();
    // Within 1..=BATCH_MAX, as the builder allows.
    let relay = Outbound::builder(&file, &server.url(), "BIG", "big")
        .max_in_flight(N as usize)
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    let drained = wait_until(Duration::from_secs(15), || file.stats().unwrap().total == 0);
    if !drained {
        let (stored, s) = (js.count("BIG"), file.stats().unwrap());
        let (rx, _stuck) = background(move || relay.shutdown());
        let returned = rx.recv_timeout(Duration::from_secs(3)).is_ok();
        panic!(
            "after 15 s, {stored} of {N} jobs in the stream and {} still leased locally; \
             shutdown returned within 3 s: {returned}",
            s.leased
        );
    }
    let stats = relay.shutdown();
    assert_eq!(stats.moved, u64::from(N), "{stats:?}");
    assert_eq!(js.count("BIG"), u64::from(N));
}

// ---------------------------------------------------------------------------------------
// Outbound: streams that vanish or refuse.
// ---------------------------------------------------------------------------------------

#[test]
fn a_stream_deleted_while_relaying_keeps_the_jobs_at_no_cost_and_they_go_once_it_is_back() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("DEL", &["del"], None);
    let (_dir, _path, file) = file();
    let relay = Outbound::builder(&file, &server.url(), "DEL", "del")
        .max_in_flight(10)
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    for i in 0..20u32 {
        file.enqueue(format!("before-{i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    wait_for(Duration::from_secs(10), "the first 20", || {
        file.stats().unwrap().total == 0
    });
    js.block_on(js.js.delete_stream("DEL")).unwrap();
    // One attempt each: a wrongly charged attempt kills them.
    let want: Vec<String> = (0..30).map(|i| format!("after-{i}")).collect();
    for w in &want {
        file.enqueue(w.as_bytes(), EnqueueOptions::default().max_attempts(1))
            .unwrap();
    }
    wait_for(Duration::from_secs(10), "a typed MissingStream", || {
        matches!(
            relay.stats().last_error,
            Some(RelayError::MissingStream { .. })
        )
    });
    // Checked again a few times; nothing is spent meanwhile.
    std::thread::sleep(Duration::from_millis(700));
    // The batch in flight when the stream went is held leased, in its place (at most
    // max_in_flight); the rest wait ready; none is dead.
    let s = file.stats().unwrap();
    assert_eq!((s.total, s.dead), (30, 0), "{s:?}");
    assert!(s.leased <= 10, "{s:?}");
    for j in jobs(&file, JobState::Ready) {
        assert_eq!(j.attempts, 0, "an attempt was charged: {j:?}");
    }
    assert!(!relay.stats().ready);
    js.create_stream("DEL", &["del"], None);
    wait_for(
        Duration::from_secs(15),
        "the jobs after the recreation",
        || file.stats().unwrap().total == 0,
    );
    let stats = relay.shutdown();
    assert_eq!(stats.dead, 0, "{stats:?}");
    let got: Vec<String> = js
        .messages("DEL")
        .into_iter()
        .map(|m| String::from_utf8(m.2).unwrap())
        .collect();
    let mut sorted = got.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 30, "each once: {got:?}");
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(sorted, want_sorted);
}

#[test]
fn a_full_stream_with_discard_new_nacks_then_dead_letters_with_the_servers_reason() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.block_on(js.js.create_stream(StreamConfig {
        max_messages: 3,
        discard: DiscardPolicy::New,
        ..stream_config("FULL", &["full"])
    }))
    .unwrap();
    let (_dir, _path, file) = file();
    let ids: Vec<JobId> = (0..6u32)
        .map(|i| {
            file.enqueue(
                format!("m{i}").as_bytes(),
                EnqueueOptions::default()
                    .max_attempts(2)
                    .retry(RetryPolicy::immediate()),
            )
            .unwrap()
            .id()
        })
        .collect();
    let relay = Outbound::builder(&file, &server.url(), "FULL", "full")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(15), "three dead, none pending", || {
        let s = file.stats().unwrap();
        s.pending() == 0 && s.dead == 3
    });
    let stats = relay.shutdown();
    assert_eq!(
        (stats.moved, stats.nacked, stats.dead, stats.given_back),
        (3, 6, 3, 0),
        "{stats:?}"
    );
    assert!(matches!(
        stats.last_error,
        Some(RelayError::Server { job: Some(_), .. })
    ));
    let got: Vec<Vec<u8>> = js.messages("FULL").into_iter().map(|m| m.2).collect();
    assert_eq!(got, [b"m0".to_vec(), b"m1".to_vec(), b"m2".to_vec()]);
    for id in &ids[3..] {
        let j = file.job(*id).unwrap().unwrap();
        assert_eq!((j.state, j.attempts), (JobState::Dead, 2), "{j:?}");
        let why = j.last_error.unwrap();
        assert!(why.contains("maximum messages"), "{why}");
    }
}

#[test]
fn a_stream_that_takes_no_publishes_is_a_typed_error_not_a_busy_loop() {
    let _g = exclusive();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("EV", &["ev.>"], None);
    // A mirror has no subjects of its own: a publish to its name reaches no stream.
    js.block_on(js.js.create_stream(StreamConfig {
        name: "MIR".into(),
        mirror: Some(Source {
            name: "EV".into(),
            ..Default::default()
        }),
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    }))
    .unwrap();
    let (_dir, _path, file) = file();
    for i in 0..20u32 {
        file.enqueue(&i.to_le_bytes(), EnqueueOptions::default().max_attempts(1))
            .unwrap();
    }
    let before = thread_cpu_ticks("leaseq-relay");
    let relay = Outbound::builder(&file, &server.url(), "MIR", "MIR")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let used = thread_cpu_ticks("leaseq-relay") - before;
    let stats = relay.shutdown();
    let snoozes: u32 = jobs(&file, JobState::Ready).iter().map(|j| j.snoozes).sum();
    let s = file.stats().unwrap();
    assert_eq!((s.ready, s.dead), (20, 0), "{s:?}");
    assert!(
        used <= 30 && snoozes <= 20 * 20,
        "the relay spun: {used} ticks of CPU in 3 s, the 20 jobs leased and given back \
         {snoozes} times in all; {stats:?}"
    );
    assert!(
        matches!(
            stats.last_error,
            Some(RelayError::SubjectNotCovered { .. } | RelayError::MissingStream { .. })
        ),
        "{stats:?}"
    );
}

#[test]
fn a_stream_that_never_sends_pub_acks_does_not_kill_jobs_it_stored() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.block_on(js.js.create_stream(StreamConfig {
        no_ack: true,
        ..stream_config("NOACK", &["noack"])
    }))
    .unwrap();
    let (_dir, _path, file) = file();
    for i in 0..3u32 {
        file.enqueue(
            format!("n{i}").as_bytes(),
            EnqueueOptions::default()
                .max_attempts(2)
                .retry(RetryPolicy::immediate()),
        )
        .unwrap();
    }
    let relay = Outbound::builder(&file, &server.url(), "NOACK", "noack")
        .publish_timeout(Duration::from_millis(500))
        .lease(Duration::from_secs(2))
        .start()
        .unwrap();
    // Either the relay refuses the stream (jobs wait) or it gets all three out; give it
    // time for every attempt.
    wait_until(Duration::from_secs(6), || file.stats().unwrap().dead == 3);
    let stats = relay.shutdown();
    let stored: HashSet<Vec<u8>> = js.messages("NOACK").into_iter().map(|m| m.2).collect();
    let dead_but_stored: Vec<String> = local_payloads(&file)
        .into_iter()
        .filter(|(p, st)| *st == JobState::Dead && stored.contains(p))
        .map(|(p, _)| String::from_utf8(p).unwrap())
        .collect();
    assert!(
        dead_but_stored.is_empty(),
        "jobs dead locally although the stream stored them: {dead_but_stored:?}; {stats:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Outbound: concurrent relays, outages, shutdown, drop, close.
// ---------------------------------------------------------------------------------------

#[test]
fn two_relays_on_one_queue_put_each_job_in_the_stream_once() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("TWO", &["two"], None);
    let (_dir, _path, file) = file();
    const N: u32 = 2_000;
    let jobs_in: Vec<(Vec<u8>, EnqueueOptions)> = (0..N)
        .map(|i| (i.to_le_bytes().to_vec(), EnqueueOptions::default()))
        .collect();
    let start = || {
        Outbound::builder(&file, &server.url(), "TWO", "two")
            .max_in_flight(50)
            .start()
            .unwrap()
    };
    let (a, b) = (start(), start());
    file.enqueue_batch(jobs_in.iter().map(|(p, o)| (p.as_slice(), o.clone())))
        .unwrap();
    wait_for(Duration::from_secs(20), "the queue to drain", || {
        file.stats().unwrap().total == 0
    });
    let (sa, sb) = (a.shutdown(), b.shutdown());
    assert_eq!(sa.moved + sb.moved, u64::from(N), "{sa:?} {sb:?}");
    assert_eq!(sa.duplicates + sb.duplicates, 0, "{sa:?} {sb:?}");
    let msgs = js.messages("TWO");
    assert_eq!(msgs.len(), N as usize);
    let ids: HashSet<_> = msgs.iter().map(|m| m.1.clone().unwrap()).collect();
    let payloads: HashSet<_> = msgs.iter().map(|m| m.2.clone()).collect();
    assert_eq!((ids.len(), payloads.len()), (N as usize, N as usize));
}

#[test]
fn jobs_in_flight_when_the_server_dies_keep_their_place_in_the_queue() {
    let _g = shared();
    let mut server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("ORDER", &["order"], None);
    drop(js);
    let (_dir, _path, file) = file();
    let relay = Outbound::builder(&file, &server.url(), "ORDER", "order")
        .max_in_flight(10)
        .publish_timeout(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    let frozen = Frozen::freeze(&server);
    let want: Vec<String> = (0..40).map(|i| format!("job-{i:02}")).collect();
    let batch: Vec<(Vec<u8>, EnqueueOptions)> = want
        .iter()
        .map(|w| (w.as_bytes().to_vec(), EnqueueOptions::default()))
        .collect();
    file.enqueue_batch(batch.iter().map(|(p, o)| (p.as_slice(), o.clone())))
        .unwrap();
    wait_for(Duration::from_secs(5), "the first batch in flight", || {
        file.stats().unwrap().leased == 10
    });
    server.kill(); // while frozen: nothing of the batch reached the stream
    drop(frozen);
    wait_for(Duration::from_secs(10), "the batch given back", || {
        relay.stats().given_back >= 10
    });
    server.restart();
    wait_for(Duration::from_secs(20), "the queue to drain", || {
        file.stats().unwrap().total == 0
    });
    let stats = relay.shutdown();
    assert_eq!(stats.dead, 0, "{stats:?}");
    let js = Js::connect(&server.url());
    let got: Vec<String> = js
        .messages("ORDER")
        .into_iter()
        .map(|m| String::from_utf8(m.2).unwrap())
        .collect();
    assert_eq!(
        got, want,
        "the jobs went out of queue order (priority, then age) after the outage"
    );
}

#[test]
fn shutdown_while_the_server_dies_mid_batch_returns_soon_and_gives_every_job_back_free() {
    let _g = shared();
    let mut server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("MID", &["mid"], None);
    drop(js);
    let (_dir, _path, file) = file();
    let publish_timeout = Duration::from_secs(3);
    let relay = Outbound::builder(&file, &server.url(), "MID", "mid")
        .publish_timeout(publish_timeout)
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    let frozen = Frozen::freeze(&server);
    // One commit, so the relay takes them in one batch.
    let batch: Vec<(Vec<u8>, EnqueueOptions)> = (0..20u32)
        .map(|i| {
            (
                i.to_le_bytes().to_vec(),
                EnqueueOptions::default().max_attempts(1),
            )
        })
        .collect();
    file.enqueue_batch(batch.iter().map(|(p, o)| (p.as_slice(), o.clone())))
        .unwrap();
    wait_for(Duration::from_secs(5), "the batch in flight", || {
        file.stats().unwrap().leased == 20
    });
    server.kill();
    drop(frozen);
    let t0 = Instant::now();
    let (rx, h) = background(move || relay.shutdown());
    let stats = rx.recv_timeout(publish_timeout + Duration::from_secs(10));
    let took = t0.elapsed();
    let stats: RelayStats = stats.expect("shutdown did not return in 13 s");
    h.join().unwrap();
    assert!(
        took <= publish_timeout + Duration::from_secs(2),
        "shutdown took {took:?}"
    );
    let s = file.stats().unwrap();
    assert_eq!((s.ready, s.leased, s.dead), (20, 0, 0), "{s:?} {stats:?}");
    for j in jobs(&file, JobState::Ready) {
        assert_eq!(j.attempts, 0, "{j:?}");
    }
    assert_eq!(stats.given_back, 20, "{stats:?}");
}

#[test]
fn shutdown_with_a_large_batch_on_a_frozen_server_takes_at_most_the_publish_timeout() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("FRZ", &["frz"], None);
    let (_dir, _path, file) = file();
    const N: usize = 4_000;
    let publish_timeout = Duration::from_secs(1);
    let relay = Outbound::builder(&file, &server.url(), "FRZ", "frz")
        .max_in_flight(N)
        .publish_timeout(publish_timeout)
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    let mut frozen = Frozen::freeze(&server);
    // 80 MB: more than the socket buffers and the client's write buffer take.
    let batch: Vec<(Vec<u8>, EnqueueOptions)> = (0..N)
        .map(|i| {
            let mut p = vec![0u8; 20_000];
            p[..8].copy_from_slice(&(i as u64).to_le_bytes());
            (p, EnqueueOptions::default().max_attempts(50))
        })
        .collect();
    file.enqueue_batch(batch.iter().map(|(p, o)| (p.as_slice(), o.clone())))
        .unwrap();
    // The first batches (about 16 MB each: a dequeue's byte cap) fill the socket and the
    // client's buffers and time out; by now a later batch is in flight behind them.
    wait_for(Duration::from_secs(10), "a batch in flight", || {
        file.stats().unwrap().leased > 0
    });
    std::thread::sleep(Duration::from_secs(4));
    let t0 = Instant::now();
    let (rx, h) = background(move || relay.shutdown());
    let first = rx.recv_timeout(publish_timeout + Duration::from_secs(5));
    let took = t0.elapsed();
    frozen.thaw();
    let stats = first.or_else(|_| rx.recv_timeout(Duration::from_secs(120)));
    let stats = stats.expect("shutdown did not return even after the server was thawed");
    h.join().unwrap();
    assert!(
        took <= publish_timeout + Duration::from_secs(5),
        "shutdown took more than {:?} (returned only after the server was thawed): {stats:?}",
        publish_timeout + Duration::from_secs(5)
    );
    let s = file.stats().unwrap();
    assert_eq!(s.leased, 0, "{s:?}");
    let ids: Vec<String> = js
        .messages("FRZ")
        .into_iter()
        .map(|m| m.1.unwrap())
        .collect();
    let unique: HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a job twice in the stream");
    assert!(s.total + ids.len() as u64 >= N as u64, "a job lost: {s:?}");
}

/// Stops a relay mid-way by `stop`, then checks: no job leased, and every job is either in
/// the stream (once) and gone locally, or local and not in the stream.
fn stop_mid_way(stop: impl FnOnce(Outbound, &Queue)) {
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("STOP", &["stop"], None);
    let (_dir, _path, file) = file();
    const N: u32 = 3_000;
    let batch: Vec<(Vec<u8>, EnqueueOptions)> = (0..N)
        .map(|i| (format!("s{i}").into_bytes(), EnqueueOptions::default()))
        .collect();
    file.enqueue_batch(batch.iter().map(|(p, o)| (p.as_slice(), o.clone())))
        .unwrap();
    let relay = Outbound::builder(&file, &server.url(), "STOP", "stop")
        .max_in_flight(100)
        .start()
        .unwrap();
    wait_for(Duration::from_secs(15), "some jobs out", || {
        js.count("STOP") >= 300
    });
    stop(relay, &file);
    let s = file.stats().unwrap();
    assert_eq!((s.leased, s.dead), (0, 0), "{s:?}");
    let local = local_payloads(&file);
    let stream: Vec<Vec<u8>> = js.messages("STOP").into_iter().map(|m| m.2).collect();
    let stream_set: HashSet<_> = stream.iter().cloned().collect();
    assert_eq!(stream_set.len(), stream.len(), "a job twice in the stream");
    for i in 0..N {
        let p = format!("s{i}").into_bytes();
        assert!(
            stream_set.contains(&p) != local.contains_key(&p),
            "job s{i}: in the stream {}, local {:?}",
            stream_set.contains(&p),
            local.get(&p)
        );
    }
}

#[test]
fn dropping_a_relay_without_shutdown_leaves_no_job_leased_or_lost() {
    let _g = shared();
    stop_mid_way(|relay, _| drop(relay));
}

#[test]
fn closing_the_file_while_relaying_leaves_no_job_leased_or_lost() {
    let _g = shared();
    stop_mid_way(|relay, file| {
        file.close();
        // The relay stops by itself; shutdown only joins it.
        let (rx, h) = background(move || relay.shutdown());
        let stats = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the relay did not stop after close");
        h.join().unwrap();
        assert_eq!(stats.dead, 0, "{stats:?}");
    });
}

#[test]
fn an_offline_outbound_relay_lets_go_of_a_closed_file() {
    let _g = shared();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (_dir, path, file) = file();
    file.enqueue(b"kept", EnqueueOptions::default()).unwrap();
    let relay = Outbound::builder(&file, &format!("nats://127.0.0.1:{port}"), "S", "s")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    assert!(relay.wait_ready(Duration::from_millis(300)).is_err());
    // "The relay stops ... when the file is closed": the app closes it and opens it again.
    file.close();
    drop(file);
    let reopened = reopen_within(&path, Duration::from_secs(5));
    relay.shutdown();
    let q = reopened.expect("the file is still held 5 s after close by the (offline) relay");
    assert_eq!(q.stats().unwrap().ready, 1);
}

// ---------------------------------------------------------------------------------------
// Message ids.
// ---------------------------------------------------------------------------------------

#[test]
fn a_key_shaped_like_another_jobs_message_id_does_not_lose_that_job() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("IDS", &["ids"], None);
    let (_dir, _path, file) = file();
    let a = file
        .enqueue(b"job without a key", EnqueueOptions::default())
        .unwrap()
        .id();
    let forged = message_id(file.file_id().unwrap(), a, None);
    // A printable key (allowed: up to 512 bytes of anything), not starting with `hex:`.
    file.enqueue(
        b"job with an lq-shaped key",
        EnqueueOptions::default().idempotency_key(&forged),
    )
    .unwrap();
    let relay = Outbound::builder(&file, &server.url(), "IDS", "ids")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "the queue to drain", || {
        file.stats().unwrap().total == 0
    });
    let stats = relay.shutdown();
    let got: Vec<Vec<u8>> = js.messages("IDS").into_iter().map(|m| m.2).collect();
    assert_eq!(
        got,
        [
            b"job without a key".to_vec(),
            b"job with an lq-shaped key".to_vec()
        ],
        "a job was acked locally but dropped by the stream as a duplicate of another: \
         both had message id {forged:?}; {stats:?}"
    );
}

#[test]
fn a_binary_key_goes_out_as_hex_and_comes_back_in_under_the_same_message_id() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("RT", &["rt.>"], None);
    let (_d1, _p1, edge) = file();
    let key = [0x00u8, 0xff, b'a', b' '];
    let job = edge
        .enqueue(
            b"binary key",
            EnqueueOptions::default().idempotency_key(key),
        )
        .unwrap()
        .id();
    let msg_id = message_id(edge.file_id().unwrap(), job, Some(&key));
    assert_eq!(msg_id, "hex:00ff6120");
    let out = Outbound::builder(&edge, &server.url(), "RT", "rt.edge")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "out", || {
        edge.stats().unwrap().total == 0
    });
    out.shutdown();
    let (_d2, _p2, hub) = file();
    let inb = Inbound::builder(&hub, &server.url(), "RT", "hub")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "in", || {
        hub.stats().unwrap().total == 1
    });
    inb.shutdown();
    let info = jobs(&hub, JobState::Ready).remove(0);
    assert_eq!(hub.payload(info.id).unwrap().unwrap(), b"binary key");
    assert_eq!(info.idempotency_key.as_deref(), Some(msg_id.as_bytes()));
    assert_eq!(info.dedup_key.as_deref(), Some(msg_id.as_bytes()));
    // Forwarded on from the hub, it keeps its message id: the stream drops the copy.
    let fwd = Outbound::builder(&hub, &server.url(), "RT", "rt.hub")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "forwarded", || {
        hub.stats().unwrap().total == 0
    });
    let stats = fwd.shutdown();
    assert_eq!((stats.moved, stats.duplicates), (1, 1), "{stats:?}");
    assert_eq!(js.count("RT"), 1);
}

#[test]
fn a_long_binary_key_keeps_its_message_id_through_inbound_and_is_applied_once() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("LONG", &["long"], None);
    let (_d1, _p1, edge) = file();
    // 300 bytes: a valid key (at most KEY_BYTES_MAX = 512), not printable.
    let key = vec![0x01u8; 300];
    let job = edge
        .enqueue(b"long key", EnqueueOptions::default().idempotency_key(&key))
        .unwrap()
        .id();
    let msg_id = message_id(edge.file_id().unwrap(), job, Some(&key));
    let out = Outbound::builder(&edge, &server.url(), "LONG", "long")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "out", || {
        edge.stats().unwrap().total == 0
    });
    out.shutdown();
    let msgs = js.messages("LONG");
    assert_eq!(msgs[0].1.as_deref(), Some(msg_id.as_str()));
    // The same message stored twice (published again after the duplicate window, which the
    // docs say a consumer applying by message id absorbs).
    js.block_on(js.js.update_stream(StreamConfig {
        duplicate_window: Duration::from_millis(100),
        ..stream_config("LONG", &["long"])
    }))
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    js.publish("long", Some(&msg_id), b"long key");
    assert_eq!(js.count("LONG"), 2);
    let (_d2, _p2, hub) = file();
    let inb = Inbound::builder(&hub, &server.url(), "LONG", "hub")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "both copies in", || {
        let s = inb.stats();
        s.moved + s.duplicates == 2
    });
    inb.shutdown();
    let mut applied = 0;
    let mut keys = Vec::new();
    while let Some(lease) = hub.dequeue().unwrap() {
        keys.push(String::from_utf8_lossy(lease.idempotency_key().unwrap()).into_owned());
        lease
            .ack_with(|_| {
                applied += 1;
                Ok(())
            })
            .unwrap();
    }
    assert_eq!(
        applied,
        1,
        "one message id ({} bytes), applied {applied} times under keys {keys:?}",
        msg_id.len()
    );
}

// ---------------------------------------------------------------------------------------
// Inbound.
// ---------------------------------------------------------------------------------------

#[test]
fn inbound_takes_empty_payloads_and_odd_message_ids() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("ODD", &["odd"], None);
    let huge = "a".repeat(600);
    let max = "b".repeat(leaseq::KEY_BYTES_MAX);
    let cyrillic = "заказ-№1";
    js.publish("odd", Some("empty"), b"");
    js.publish("odd", Some(&huge), b"huge id");
    js.publish("odd", Some(cyrillic), b"non-ascii id");
    js.publish("odd", Some(&max), b"512-byte id");
    let (_dir, _path, file) = file();
    let relay = Inbound::builder(&file, &server.url(), "ODD", "c")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "four jobs", || {
        file.stats().unwrap().total == 4
    });
    wait_for(Duration::from_secs(10), "all acked", || {
        js.consumer_pending("ODD", "c") == (0, 0)
    });
    let stats = relay.shutdown();
    assert_eq!((stats.moved, stats.refused), (4, 0), "{stats:?}");
    let want: [(&[u8], &[u8]); 4] = [
        (b"", b"empty"),
        (b"huge id", leaseq::relay::message_key(&huge).leak()),
        (b"non-ascii id", cyrillic.as_bytes()),
        (b"512-byte id", max.as_bytes()),
    ];
    for (payload, key) in want {
        let lease = file.dequeue().unwrap().unwrap();
        assert_eq!(lease.payload(), payload);
        assert_eq!(lease.idempotency_key(), Some(key));
        assert_eq!(lease.ack_with(|_| Ok(())).unwrap(), leaseq::Applied::Now);
    }
}

#[test]
fn inbound_with_an_existing_consumer_that_does_not_wait_for_acks_loses_no_message() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    let mut report = Vec::new();
    for (stream, policy) in [("NONE", AckPolicy::None), ("ALL", AckPolicy::All)] {
        let subject = stream.to_lowercase();
        js.create_stream(stream, &[&subject], None);
        js.publish(&subject, Some("a"), b"small");
        js.publish(&subject, Some("b"), &vec![1u8; 5_000]);
        js.publish(&subject, Some("c"), b"small too");
        js.block_on(async {
            js.js
                .get_stream(stream)
                .await
                .unwrap()
                .create_consumer(pull::Config {
                    durable_name: Some("c".into()),
                    ack_policy: policy,
                    ..Default::default()
                })
                .await
                .unwrap();
        });
        let dir = tempfile::tempdir().unwrap();
        let file = Queue::builder()
            .payload_bytes_max(1_024)
            .open(dir.path().join("q.leaseq"))
            .unwrap();
        let relay = Inbound::builder(&file, &server.url(), stream, "c")
            .fetch_wait(Duration::from_millis(100))
            .max_backoff(Duration::from_millis(200))
            .start()
            .unwrap();
        // Either the relay refuses the consumer (typed error, nothing taken), or it takes
        // the two that fit and leaves "b" for later.
        wait_until(Duration::from_secs(5), || relay.stats().refused >= 1);
        std::thread::sleep(Duration::from_millis(300));
        let stats = relay.shutdown();
        let (pending, ack_pending) = js.consumer_pending(stream, "c");
        let local = file.stats().unwrap().total;
        // "b" is lost if it is neither local nor still to be delivered by the consumer.
        if local < 3 && pending + ack_pending as u64 == 0 {
            report.push(format!(
                "{policy:?}: {local} local jobs, consumer (pending {pending}, ack pending \
                 {ack_pending}): the refused message is gone; {stats:?}"
            ));
        }
    }
    assert!(report.is_empty(), "{report:#?}");
}

#[test]
fn inbound_stops_when_the_file_is_closed_and_the_messages_come_again_after_reopen() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("CL", &["cl"], None);
    let (_dir, path, file) = file();
    let relay = Inbound::builder(&file, &server.url(), "CL", "c")
        .fetch_wait(Duration::from_millis(100))
        .ack_wait(Duration::from_secs(1))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    file.close();
    drop(file);
    for i in 0..20u32 {
        js.publish("cl", Some(&format!("m{i}")), format!("m{i}").as_bytes());
    }
    let file = reopen_within(&path, Duration::from_secs(10))
        .expect("the relay still holds the file after close and traffic");
    let stats = relay.shutdown();
    assert_eq!(stats.moved, 0, "{stats:?}");
    assert_eq!(file.stats().unwrap().total, 0);
    let relay = Inbound::builder(&file, &server.url(), "CL", "c")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(15), "the 20 messages", || {
        file.stats().unwrap().total == 20
    });
    wait_for(Duration::from_secs(10), "all acked", || {
        js.consumer_pending("CL", "c") == (0, 0)
    });
    let stats = relay.shutdown();
    assert_eq!(stats.moved, 20, "{stats:?}");
    let mut keys = HashSet::new();
    while let Some(l) = file.dequeue().unwrap() {
        assert!(keys.insert(l.idempotency_key().unwrap().to_vec()));
        l.ack().unwrap();
    }
    assert_eq!(keys.len(), 20);
}

#[test]
fn an_idle_inbound_relay_lets_go_of_a_closed_file() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("IDLE", &["idle"], None);
    let (_dir, path, file) = file();
    let relay = Inbound::builder(&file, &server.url(), "IDLE", "c")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    file.close();
    drop(file);
    let reopened = reopen_within(&path, Duration::from_secs(5));
    relay.shutdown();
    reopened.expect("the file is still held 5 s after close by the (idle) inbound relay");
}

#[test]
fn inbound_shutdown_returns_when_the_server_dies_between_commit_and_ack() {
    let _g = shared();
    let mut server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("FL", &["fl"], None);
    let (_dir, _path, file) = file();
    let fetch_wait = Duration::from_millis(100);
    let relay = Inbound::builder(&file, &server.url(), "FL", "c")
        .fetch_wait(fetch_wait)
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    // Hold the file's commits: the relay fetches, then waits to enqueue. Released on every
    // path (a panic included), or the relay's drop would wait for it forever.
    let release = Release(Arc::new(AtomicBool::new(false)));
    let entered = Arc::new(AtomicBool::new(false));
    let writer = {
        let (file, entered, release) = (file.clone(), entered.clone(), release.0.clone());
        std::thread::spawn(move || {
            file.write(|_| {
                entered.store(true, Ordering::SeqCst);
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(())
            })
            .unwrap();
        })
    };
    wait_for(Duration::from_secs(5), "the write to hold the file", || {
        entered.load(Ordering::SeqCst)
    });
    for i in 0..5u32 {
        js.publish("fl", Some(&format!("f{i}")), b"x");
    }
    // The relay has fetched some (unacked, delivered), and waits to commit them.
    wait_for(
        Duration::from_secs(10),
        "the relay to have messages",
        || js.consumer_pending("FL", "c").1 >= 1,
    );
    std::thread::sleep(Duration::from_millis(300));
    let taken = js.consumer_pending("FL", "c").1 as u64;
    drop(js);
    server.kill();
    release.0.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    wait_for(Duration::from_secs(10), "the local commit", || {
        file.stats().unwrap().total == taken
    });
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let (rx, h) = background(move || relay.shutdown());
    let first = rx.recv_timeout(Duration::from_secs(6));
    let took = t0.elapsed();
    server.restart();
    let stats = first.or_else(|_| rx.recv_timeout(Duration::from_secs(60)));
    let stats = stats.expect("shutdown did not return even after the server came back");
    h.join().unwrap();
    assert!(
        took <= Duration::from_secs(6),
        "shutdown returned only after the server came back ({:?}): {stats:?}",
        t0.elapsed()
    );
    assert_eq!(file.stats().unwrap().total, taken);
}

/// Sets its flag on drop.
struct Release(Arc<AtomicBool>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Publishes one message with a header that is not UTF-8 (as a client in another language
/// may), speaking the NATS protocol directly.
fn publish_raw_bad_header(port: u16, subject: &str) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("INFO"), "{line}");
    let headers: &[u8] = b"NATS/1.0\r\nX-Origin: \xff\xfe\r\n\r\n";
    let payload: &[u8] = b"poison";
    let mut out = Vec::new();
    out.extend_from_slice(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\n");
    out.extend_from_slice(
        format!(
            "HPUB {subject} {} {}\r\n",
            headers.len(),
            headers.len() + payload.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(headers);
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\nPING\r\n");
    s.write_all(&out).unwrap();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        assert!(!line.starts_with("-ERR"), "{line}");
        if line.starts_with("PONG") {
            break;
        }
    }
}

/// async-nats drops its connection on a header that is not UTF-8, at every delivery of that
/// message, so the consumer cannot pass it: the relay must say so (typed, naming the
/// consumer), keep what came before it, and lose nothing (the message stays in the stream).
#[test]
fn one_message_with_a_non_utf8_header_is_reported_and_loses_nothing() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("POISON", &["poison"], None);
    js.publish("poison", Some("good-1"), b"good 1");
    publish_raw_bad_header(server.port, "poison");
    js.publish("poison", Some("good-2"), b"good 2");
    assert_eq!(js.count("POISON"), 3);
    let (_dir, _path, file) = file();
    let relay = Inbound::builder(&file, &server.url(), "POISON", "c")
        .fetch_wait(Duration::from_millis(100))
        .ack_wait(Duration::from_secs(1))
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    let reported = wait_until(Duration::from_secs(20), || {
        matches!(&relay.stats().last_error,
            Some(RelayError::Server { reason, .. }) if reason.contains("cannot read"))
    });
    let stats = relay.shutdown();
    let local: Vec<String> = local_payloads(&file)
        .into_keys()
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .collect();
    assert!(
        reported,
        "no typed report of the unreadable message: {stats:?}"
    );
    match &stats.last_error {
        Some(RelayError::Server { reason, .. }) => assert!(reason.contains("\"c\""), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(local.contains(&"good 1".to_string()), "{local:?}");
    assert!(!local.contains(&"poison".to_string()), "{local:?}");
    let js = Js::connect(&server.url());
    assert_eq!(
        js.count("POISON"),
        3,
        "every message is still in the stream"
    );
}

// ---------------------------------------------------------------------------------------
// Threads and CPU.
// ---------------------------------------------------------------------------------------

#[test]
fn relays_started_and_stopped_repeatedly_leave_no_thread_behind() {
    let _g = exclusive();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("RS", &["rs"], None);
    let (_dir, _path, file) = file();
    let before = relay_threads();
    for round in 0..12u32 {
        file.enqueue(&round.to_le_bytes(), EnqueueOptions::default())
            .unwrap();
        let out = Outbound::builder(&file, &server.url(), "RS", "rs")
            .start()
            .unwrap();
        out.wait_ready(READY).unwrap();
        let inb = Inbound::builder(&file.named("in").unwrap(), &server.url(), "RS", "c")
            .fetch_wait(Duration::from_millis(50))
            .start()
            .unwrap();
        inb.wait_ready(READY).unwrap();
        if round % 2 == 0 {
            out.shutdown();
            inb.shutdown();
        } else {
            drop(out);
            drop(inb);
        }
    }
    let after = relay_threads();
    assert_eq!(
        after, before,
        "relay threads before {before}, after 12 rounds {after}"
    );
    assert_eq!(js.count("RS"), 12);
}

#[test]
fn a_missing_stream_costs_little_cpu_and_no_attempt() {
    let _g = exclusive();
    let server = NatsServer::start();
    let (_dir, _path, file) = file();
    for i in 0..20u32 {
        file.enqueue(&i.to_le_bytes(), EnqueueOptions::default().max_attempts(1))
            .unwrap();
    }
    let before = thread_cpu_ticks("leaseq-relay");
    let relay = Outbound::builder(&file, &server.url(), "GONE", "gone")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    let inbound_file = file.named("in").unwrap();
    let inbound = Inbound::builder(&inbound_file, &server.url(), "GONE", "c")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let used = thread_cpu_ticks("leaseq-relay") - before;
    let (out, inb) = (relay.shutdown(), inbound.shutdown());
    assert!(used <= 30, "{used} ticks in 3 s with the stream missing");
    assert!(
        matches!(out.last_error, Some(RelayError::MissingStream { .. })),
        "{out:?}"
    );
    assert!(
        matches!(inb.last_error, Some(RelayError::MissingStream { .. })),
        "{inb:?}"
    );
    let s = file.stats().unwrap();
    assert_eq!((s.ready, s.leased, s.dead), (20, 0, 0));
    for j in jobs(&file, JobState::Ready) {
        assert_eq!((j.attempts, j.snoozes), (0, 0), "{j:?}");
    }
}

// ---------------------------------------------------------------------------------------
// From a new user's trial.
// ---------------------------------------------------------------------------------------

/// A server that stops answering on an open connection (SIGSTOP: a hung server, a link that
/// drops packets silently) must cost no attempt: jobs with one attempt each all arrive once
/// after it answers again, none dead, and meanwhile the relay says the server is not
/// answering.
#[test]
fn a_stalled_server_costs_no_attempt_and_loses_nothing() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("STALL", &["stall"], None);
    let (_dir, _path, file) = file();
    let relay = Outbound::builder(&file, &server.url(), "STALL", "stall")
        .publish_timeout(Duration::from_millis(300))
        .lease(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    let mut frozen = Frozen::freeze(&server);
    for i in 0..20u32 {
        file.enqueue(
            format!("s-{i:02}").as_bytes(),
            EnqueueOptions::default().max_attempts(1),
        )
        .unwrap();
    }
    // Several publish timeouts, and longer than a lease: held jobs are renewed.
    std::thread::sleep(Duration::from_secs(4));
    let stats = relay.stats();
    assert!(!stats.ready, "{stats:?}");
    assert!(
        matches!(&stats.last_error, Some(RelayError::Unreachable { .. })),
        "{stats:?}"
    );
    assert_eq!((stats.nacked, stats.dead), (0, 0), "{stats:?}");
    assert_eq!(file.stats().unwrap().dead, 0);
    frozen.thaw();
    wait_for(Duration::from_secs(20), "the jobs out", || {
        file.stats().unwrap().total == 0
    });
    let stats = relay.shutdown();
    assert_eq!(stats.dead, 0, "{stats:?}");
    let got: Vec<String> = js
        .messages("STALL")
        .into_iter()
        .map(|m| String::from_utf8(m.2).unwrap())
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("s-{i:02}")).collect();
    assert_eq!(got, want, "once each, in order");
}

/// A killed server is seen at once (the client's disconnection), not at the end of the
/// batch's publish timeout.
#[test]
fn a_killed_server_shows_in_the_stats_at_once() {
    let _g = shared();
    let mut server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("KS", &["ks"], None);
    drop(js);
    let (_dir, _path, file) = file();
    let relay = Outbound::builder(&file, &server.url(), "KS", "ks")
        .publish_timeout(Duration::from_secs(10))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    server.kill();
    assert!(
        wait_until(Duration::from_secs(2), || !relay.stats().ready),
        "still ready 2 s after the server died: {:?}",
        relay.stats()
    );
    assert!(matches!(
        relay.stats().last_error,
        Some(RelayError::Unreachable { .. })
    ));
}

/// A shutdown does not wait out a connection attempt to a server that never answers.
#[test]
fn shutdown_does_not_wait_for_a_connection_attempt() {
    let _g = shared();
    // Accepts connections (the kernel's backlog) and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("nats://{}", silent.local_addr().unwrap());
    let (_dir, _path, file) = file();
    let out = Outbound::builder(&file, &url, "S", "s")
        .connect_timeout(Duration::from_secs(30))
        .start()
        .unwrap();
    let inb = Inbound::builder(&file, &url, "S", "c")
        .connect_timeout(Duration::from_secs(30))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    out.shutdown();
    inb.shutdown();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// Start refuses what can never work: a closed file, an empty URL, a bad filter.
#[test]
fn start_refuses_a_closed_file_an_empty_url_and_a_bad_filter() {
    let (_dir, _path, file) = file();
    let e = Outbound::builder(&file, "", "S", "s")
        .start()
        .err()
        .unwrap();
    assert!(matches!(e, RelayError::BadUrl { .. }), "{e:?}");
    let e = Inbound::builder(&file, "nats://127.0.0.1:4222", "S", "c")
        .filter_subject("a..b")
        .start()
        .err()
        .unwrap();
    assert!(matches!(e, RelayError::InvalidOption(_)), "{e:?}");
    file.close();
    let e = Outbound::builder(&file, "nats://127.0.0.1:4222", "S", "s")
        .start()
        .err()
        .unwrap();
    assert!(
        matches!(&e, RelayError::Queue(q) if matches!(**q, leaseq::Error::Closed)),
        "{e:?}"
    );
    let e = Inbound::builder(&file, "nats://127.0.0.1:4222", "S", "c")
        .start()
        .err()
        .unwrap();
    assert!(matches!(e, RelayError::Queue(_)), "{e:?}");
}

/// A typed payload keeps its encoding through the stream: the receiving job decodes with
/// the sender's encoding, whatever the receiving handle's default.
#[test]
fn a_typed_payload_keeps_its_encoding_from_sender_to_receiver() {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    #[serde(tag = "kind")]
    enum Cmd {
        Reboot { delay_s: u32 },
    }
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("ENC", &["enc"], None);
    let (_d1, _p1, edge) = file();
    let json = edge.with_encoding(leaseq::Encoding::Json);
    json.enqueue_value(&Cmd::Reboot { delay_s: 5 }, EnqueueOptions::default())
        .unwrap();
    let out = Outbound::builder(&edge, &server.url(), "ENC", "enc")
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "out", || {
        edge.stats().unwrap().total == 0
    });
    out.shutdown();
    let (_d2, _p2, hub) = file(); // default encoding: bincode
    let inb = Inbound::builder(&hub, &server.url(), "ENC", "hub")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    wait_for(Duration::from_secs(10), "in", || {
        hub.stats().unwrap().total == 1
    });
    inb.shutdown();
    let lease = hub.dequeue().unwrap().unwrap();
    assert_eq!(lease.encoding(), leaseq::Encoding::Json);
    assert_eq!(lease.decode::<Cmd>().unwrap(), Cmd::Reboot { delay_s: 5 });
}

/// Messages without an id are keyed by stream, creation time and sequence: a stream deleted
/// and made again (its sequences start over) brings new keys, not old applied ones.
#[test]
fn messages_without_an_id_in_a_recreated_stream_are_new_work() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("RE", &["re"], None);
    js.publish("re", None, b"first life");
    let (_dir, _path, file) = file();
    let run = |want: &[u8]| {
        let inb = Inbound::builder(&file, &server.url(), "RE", "c")
            .fetch_wait(Duration::from_millis(100))
            .start()
            .unwrap();
        wait_for(Duration::from_secs(10), "the message", || {
            file.stats().unwrap().total == 1
        });
        inb.shutdown();
        let lease = file.dequeue().unwrap().unwrap();
        assert_eq!(lease.payload(), want);
        lease.ack_with(|_| Ok(())).unwrap()
    };
    assert_eq!(run(b"first life"), leaseq::Applied::Now);
    js.block_on(js.js.delete_stream("RE")).unwrap();
    // Creation times have a resolution the server rounds to; make sure they differ.
    std::thread::sleep(Duration::from_millis(20));
    js.create_stream("RE", &["re"], None);
    js.publish("re", None, b"second life");
    assert_eq!(
        run(b"second life"),
        leaseq::Applied::Now,
        "taken for the old message"
    );
}

/// An existing consumer with another filter is refused, not silently used.
#[test]
fn an_existing_consumer_with_another_filter_is_refused() {
    let _g = shared();
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("CF", &["cf.>"], None);
    js.publish("cf.edge-1", Some("for-1"), b"edge 1's");
    let (_dir, _path, file) = file();
    let first = Inbound::builder(&file, &server.url(), "CF", "edge")
        .filter_subject("cf.edge-1")
        .fetch_wait(Duration::from_millis(100))
        .start()
        .unwrap();
    first.wait_ready(READY).unwrap();
    first.shutdown();
    let second = Inbound::builder(&file, &server.url(), "CF", "edge")
        .filter_subject("cf.edge-2")
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    let e = second.wait_ready(Duration::from_secs(3)).unwrap_err();
    assert!(
        matches!(&e, RelayError::InvalidOption(m) if m.contains("cf.edge-1")),
        "{e:?}"
    );
    second.shutdown();
}
