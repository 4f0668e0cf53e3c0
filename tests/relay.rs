//! The NATS JetStream relay (feature `nats`) against a real `nats-server` on 127.0.0.1: jobs
//! out to a stream and messages in from one, the bad inputs, and an unreachable server.
//! The kill tests (server and relay SIGKILLed during 10,000 jobs) are in
//! `tests/relay_kill.rs`.

mod common;
#[path = "common/nats.rs"]
mod nats;

use leaseq::relay::{Inbound, Outbound, RelayError, message_id};
use leaseq::{EnqueueOptions, JobState, Queue};
use nats::{Js, NatsServer, thread_cpu_ticks};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const READY: Duration = Duration::from_secs(20);

/// Waits until `f` holds, at most `limit`; panics with `what` otherwise.
fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn file() -> (tempfile::TempDir, Queue) {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("edge.leaseq")).unwrap();
    (dir, q)
}

#[test]
fn outbound_publishes_every_job_once_with_its_message_id_and_acks_locally() {
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("EVENTS", &["events.>"], None);
    let (_dir, file) = file();
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
    let (_dir, file) = file();
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
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    // No duplicate window to speak of: the stream stores the same id twice, as after the
    // window; the local queue must still keep one job, and apply it once.
    js.create_stream("DUP", &["dup"], Some(Duration::from_millis(100)));
    js.publish("dup", Some("same"), b"first copy");
    std::thread::sleep(Duration::from_millis(300));
    js.publish("dup", Some("same"), b"second copy");
    assert_eq!(js.count("DUP"), 2);
    let (_dir, file) = file();
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
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let (_dir, file) = file();
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
    let mut server = NatsServer::start();
    let url = server.url();
    server.kill();
    let (_dir, file) = file();
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
    let (_dir, file) = file();
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
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    let (_dir, file) = file();
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
    let server = NatsServer::start_with("max_payload: 4096");
    let js = Js::connect(&server.url());
    js.create_stream("SMALL", &["small"], None);
    let (_dir, file) = file();
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

#[test]
fn closing_the_file_stops_the_relay_without_losing_a_job() {
    let server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("C", &["c"], None);
    let (_dir, file) = file();
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
