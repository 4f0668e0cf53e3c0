//! The relay's contract under kills, against a real `nats-server`: 10,000 jobs out while the
//! server is SIGKILLed and restarted and the relay's process is SIGKILLed and restarted, every
//! job in the stream exactly once and none left locally; 10,000 messages in, with the local
//! worker's process killed mid-way, every message applied once through `ack_with`.
//!
//! The app is a child process re-running this test binary (`tests/common`'s `ChildProc`).
//! `LEASEQ_RELAY_KILL_ROUNDS=N` runs more rounds of kills.

use crate::common::{ChildProc, child_scenario, say};
use crate::nats::{APPLIED, Js, NatsServer, app_inbound, apply};
use leaseq::relay::Outbound;
use leaseq::{EnqueueOptions, Queue};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const JOBS: u64 = 10_000;

/// The app's own bookkeeping, in the queue's file: how many jobs it has enqueued (written in
/// the same transaction as the jobs: an outbox).
const PRODUCED: TableDefinition<&str, u64> = TableDefinition::new("produced");

fn rounds() -> u64 {
    std::env::var("LEASEQ_RELAY_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

fn read_u64(q: &Queue, table: TableDefinition<&str, u64>, key: &str) -> u64 {
    let rtx = q.database().begin_read().unwrap();
    match rtx.open_table(table) {
        Ok(t) => t.get(key).unwrap().map_or(0, |v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => panic!("{e}"),
    }
}

fn applied(q: &Queue) -> HashMap<String, u64> {
    let rtx = q.database().begin_read().unwrap();
    match rtx.open_table(APPLIED) {
        Ok(t) => t
            .iter()
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.value().to_string(), v.value())
            })
            .collect(),
        Err(redb::TableError::TableDoesNotExist(_)) => HashMap::new(),
        Err(e) => panic!("{e}"),
    }
}

/// The child side: the app, selected by scenario; runs until killed.
#[test]
fn child_entry_relay() {
    let Some((scenario, path)) = child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    let url = std::env::var("LEASEQ_TEST_NATS_URL").unwrap();
    let file = Queue::open(&path).unwrap();
    match scenario.as_str() {
        "out" => run_outbound_app(&file, &url),
        "in" => run_inbound_app(&file, &url),
        other => panic!("unknown scenario {other}"),
    }
}

/// Enqueues job 0..JOBS in batches of 50 (each batch and the app's counter in one
/// transaction), while the relay sends them out; says DRAINED once all are produced and the
/// outbox is empty.
fn run_outbound_app(file: &Queue, url: &str) -> ! {
    let outbox = file.named("outbox").unwrap();
    let _relay = Outbound::builder(&outbox, url, "OUT", "out.edge")
        .publish_timeout(Duration::from_secs(1))
        .lease(Duration::from_secs(5))
        .max_in_flight(200)
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    report_busy(&outbox, true);
    loop {
        let next = read_u64(file, PRODUCED, "next");
        if next >= JOBS {
            break;
        }
        let end = (next + 50).min(JOBS);
        outbox
            .write(|tx| {
                for j in next..end {
                    // Every other job has an idempotency key (its message id).
                    let opts = if j.is_multiple_of(2) {
                        EnqueueOptions::default().idempotency_key(format!("key-{j}"))
                    } else {
                        EnqueueOptions::default()
                    };
                    tx.enqueue(format!("job-{j}").as_bytes(), opts)?;
                }
                tx.open_table(PRODUCED)?.insert("next", end)?;
                Ok(())
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(25));
    }
    loop {
        if outbox.stats().unwrap().total == 0 {
            say("DRAINED");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the inbound relay and a worker applying each job once through `ack_with`; says
/// DRAINED once every message is applied and the inbox is empty.
fn run_inbound_app(file: &Queue, url: &str) -> ! {
    let inbox = file.named("inbox").unwrap();
    let _relay = app_inbound(&inbox, url);
    report_busy(&inbox, false);
    loop {
        if let Some(lease) = inbox.dequeue_timeout(Duration::from_millis(200)).unwrap() {
            let key = String::from_utf8(lease.idempotency_key().unwrap().to_vec()).unwrap();
            lease.ack_with(|tx| apply(tx, &key)).unwrap();
        } else if inbox.stats().unwrap().total == 0 && applied(file).len() as u64 == JOBS {
            say("DRAINED");
        }
    }
}

/// In the app: says BUSY while the queue holds leased (outbound: published, not yet acked
/// locally) or waiting jobs (inbound: enqueued, the JetStream ack perhaps not yet sent), and
/// IDLE otherwise, every few milliseconds, so the parent can kill it inside those windows.
fn report_busy(queue: &Queue, outbound: bool) {
    let queue = queue.clone();
    std::thread::spawn(move || {
        loop {
            let s = queue.stats().unwrap();
            let busy = if outbound { s.leased > 0 } else { s.total > 0 };
            say(if busy { "BUSY" } else { "IDLE" });
            std::thread::sleep(Duration::from_millis(3));
        }
    });
}

fn spawn_app(scenario: &str, path: &std::path::Path, url: &str) -> ChildProc {
    ChildProc::spawn_env(
        "kills::child_entry_relay",
        scenario,
        path,
        &[("LEASEQ_TEST_NATS_URL", url)],
    )
}

/// Kills the app every round and the server every other round, each at the first moment the
/// app is busy (see `report_busy`) after a seeded random delay. Returns how many kills landed
/// while it was busy.
fn chaos(server: &mut NatsServer, scenario: &str, path: &std::path::Path, seed: u64) -> u64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let url = server.url();
    let mut busy_kills = 0;
    for round in 0..rounds() {
        let mut app = spawn_app(scenario, path, &url);
        busy_kills += u64::from(wait_busy(&mut app, rng.u64(200..1_200)));
        if round % 2 == 0 {
            server.kill();
            std::thread::sleep(Duration::from_millis(rng.u64(200..1_000)));
            server.restart();
            busy_kills += u64::from(wait_busy(&mut app, rng.u64(100..800)));
        }
        app.kill();
    }
    busy_kills
}

/// Reads the app's reports for `ms` milliseconds, then until it reports BUSY (at most 5 s
/// more); whether it did.
fn wait_busy(app: &mut ChildProc, ms: u64) -> bool {
    let start = Instant::now();
    while let Some(m) = app.next_message() {
        let elapsed = start.elapsed();
        if elapsed >= Duration::from_millis(ms) && m == "BUSY" {
            return true;
        }
        if elapsed >= Duration::from_millis(ms + 5_000) {
            return false;
        }
    }
    false
}

/// Runs the app until it says DRAINED (at most `limit`), then kills it.
fn until_drained(scenario: &str, path: &std::path::Path, url: &str, limit: Duration) {
    let mut app = spawn_app(scenario, path, url);
    let deadline = Instant::now() + limit;
    loop {
        assert!(
            Instant::now() < deadline,
            "the app did not drain in {limit:?}"
        );
        match app.next_message() {
            Some(m) if m == "DRAINED" => break,
            Some(_) => {}
            None => panic!("the app exited before it drained"),
        }
    }
    app.kill();
}

#[test]
fn outbound_10000_jobs_through_server_and_relay_kills_reach_the_stream_exactly_once() {
    let mut server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("OUT", &["out.>"], None);
    drop(js);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.leaseq");
    let busy_kills = chaos(&mut server, "out", &path, 0x5eed_0001);
    assert!(
        busy_kills >= 3,
        "only {busy_kills} kills landed with jobs in flight"
    );
    until_drained("out", &path, &server.url(), Duration::from_secs(180));

    let file = Queue::open(&path).unwrap();
    assert_eq!(read_u64(&file, PRODUCED, "next"), JOBS);
    let outbox = file.named("outbox").unwrap();
    let s = outbox.stats().unwrap();
    assert_eq!(s.total, 0, "jobs left locally: {s:?}");
    let file_id = file.file_id().unwrap();
    drop(file);

    let js = Js::connect(&server.url());
    let messages = js.messages("OUT");
    let mut payloads = HashSet::new();
    let mut ids = HashSet::new();
    for (seq, id, payload) in &messages {
        let payload = String::from_utf8(payload.clone()).unwrap();
        let j: u64 = payload.strip_prefix("job-").unwrap().parse().unwrap();
        let id = id
            .clone()
            .unwrap_or_else(|| panic!("message {seq} has no id"));
        if j.is_multiple_of(2) {
            assert_eq!(id, format!("key-{j}"));
        } else {
            assert!(id.starts_with(&format!("lq:{file_id:016x}:")), "{id}");
        }
        assert!(
            payloads.insert(payload.clone()),
            "{payload} is in the stream twice"
        );
        assert!(
            ids.insert(id.clone()),
            "message id {id} is in the stream twice"
        );
    }
    assert_eq!(payloads.len() as u64, JOBS, "jobs missing from the stream");
    assert_eq!(messages.len() as u64, JOBS);
}

#[test]
fn inbound_10000_messages_through_worker_and_server_kills_are_applied_once_each() {
    let mut server = NatsServer::start();
    let js = Js::connect(&server.url());
    js.create_stream("IN", &["in.>"], None);
    let mut expected = HashSet::new();
    let created = js.stream_created_ns("IN");
    let messages = (0..JOBS).map(|i| {
        // Every fourth message has no id: its key is the stream and sequence.
        let id = (!i.is_multiple_of(4)).then(|| format!("m-{i}"));
        expected.insert(
            id.clone()
                .unwrap_or_else(|| format!("IN:{created}:{}", i + 1)),
        );
        (id, format!("message {i}").into_bytes())
    });
    js.publish_many("in.cmd", messages);
    assert_eq!(js.count("IN"), JOBS);
    drop(js);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.leaseq");
    let busy_kills = chaos(&mut server, "in", &path, 0x5eed_0002);
    assert!(
        busy_kills >= 3,
        "only {busy_kills} kills landed with jobs in flight"
    );
    until_drained("in", &path, &server.url(), Duration::from_secs(180));

    let file = Queue::open(&path).unwrap();
    let counts = applied(&file);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    let got: HashSet<String> = counts.into_keys().collect();
    let missing: Vec<_> = expected.difference(&got).take(5).collect();
    let extra: Vec<_> = got.difference(&expected).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} applied, {} expected; never applied (first 5): {missing:?}; not sent (first 5): {extra:?}",
        got.len(),
        expected.len()
    );
    assert_eq!(file.named("inbox").unwrap().stats().unwrap().total, 0);
    drop(file);
    let js = Js::connect(&server.url());
    let deadline = Instant::now() + Duration::from_secs(30);
    while js.consumer_pending("IN", "edge") != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            js.consumer_pending("IN", "edge")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
