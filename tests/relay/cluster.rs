//! The relay against a three-server JetStream cluster whose members are SIGKILLed mid-relay:
//! 10,000 jobs out and 10,000 messages in, each relay given one member's URL only (it learns
//! the others from the cluster). That member is killed (the relay goes on through the
//! others), restarted, and then the stream's leader (outbound) or the consumer's (inbound)
//! is killed while jobs are in flight. Every job is in the replicated stream exactly once;
//! every message is applied once locally.

use crate::nats::{APPLIED, Js, NatsServer, app_inbound, apply};
use crate::shared;
use leaseq::relay::{Outbound, RelayStats};
use leaseq::{EnqueueOptions, Queue};
use redb::{ReadableDatabase, ReadableTableMetadata};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const JOBS: u64 = 10_000;

/// Jobs (outbound) or messages (inbound) made per 100 ms by the app or the fleet: the relay
/// is busy for about 10 s, through both kills.
const BATCH: u64 = 100;

/// Waits up to 90 s for `f`; panics naming `what` (with the relay's stats) otherwise.
fn wait_for(what: &str, stats: impl Fn() -> RelayStats, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The cluster, and the test's own client, which knows every member.
fn cluster() -> (Vec<NatsServer>, String, Js) {
    let servers = NatsServer::start_cluster(3);
    let all = servers
        .iter()
        .map(|s| s.url())
        .collect::<Vec<_>>()
        .join(",");
    let js = Js::connect(&all);
    (servers, all, js)
}

/// SIGKILLs the member leading `stream` (or its `consumer`), waiting up to 10 s for a
/// leader; returns its index.
fn kill_leader(servers: &mut [NatsServer], js: &Js, stream: &str, consumer: Option<&str>) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(leader) = js.leader(stream, consumer) {
            let i = servers
                .iter()
                .position(|s| s.name.as_deref() == Some(leader.as_str()))
                .unwrap_or_else(|| panic!("leader {leader} is not a member"));
            servers[i].kill();
            return i;
        }
        assert!(Instant::now() < deadline, "{stream} has no leader");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills the relay's only member at 3,000 done, restarts it at 6,000, and kills the leader
/// at 7,000, restarting it once all are done; `done` counts jobs out or messages applied.
fn kill_members(
    servers: &mut [NatsServer],
    relays_member: usize,
    js: &Js,
    leader_of: (&str, Option<&str>),
    done: impl Fn() -> u64,
    stats: impl Fn() -> RelayStats,
) {
    wait_for("3,000 done", &stats, || done() >= 3_000);
    servers[relays_member].kill();
    // The relay knows no other URL: what follows goes through the members the cluster
    // advertised.
    wait_for("6,000 done", &stats, || done() >= 6_000);
    servers[relays_member].restart();
    wait_for("7,000 done", &stats, || done() >= 7_000);
    let leader = kill_leader(servers, js, leader_of.0, leader_of.1);
    let at = done();
    assert!(at < JOBS, "the leader died after the relay was done");
    eprintln!("killed the leader {leader} at {at} done");
    wait_for("all done", &stats, || done() >= JOBS);
    servers[leader].restart();
}

#[test]
fn a_relay_out_to_a_cluster_losing_members_puts_every_job_in_the_stream_once() {
    let _g = shared();
    let (mut servers, _all, js) = cluster();
    js.create_replicated_stream("OUT", &["out.>"], 3);
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("edge.leaseq")).unwrap();
    let outbox = q.named("outbox").unwrap();
    let relay = Outbound::builder(&outbox, &servers[0].url(), "OUT", "out.edge")
        .publish_timeout(Duration::from_secs(1))
        .max_in_flight(200)
        .max_backoff(Duration::from_millis(200))
        .start()
        .unwrap();
    relay.wait_ready(Duration::from_secs(20)).unwrap();
    // The app enqueues while the relay runs, every other job with an idempotency key (its
    // message id), the rest identified by job id.
    let producer = {
        let outbox = outbox.clone();
        std::thread::spawn(move || {
            for batch in 0..JOBS / BATCH {
                outbox
                    .write(|tx| {
                        for j in batch * BATCH..(batch + 1) * BATCH {
                            let opts = if j % 2 == 0 {
                                EnqueueOptions::default().idempotency_key(format!("key-{j}"))
                            } else {
                                EnqueueOptions::default()
                            };
                            tx.enqueue(format!("job-{j}").as_bytes(), opts)?;
                        }
                        Ok(())
                    })
                    .unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    kill_members(
        &mut servers,
        0,
        &js,
        ("OUT", None),
        || relay.stats().moved,
        || relay.stats(),
    );
    producer.join().unwrap();
    assert_eq!(outbox.stats().unwrap().total, 0);
    let stats = relay.shutdown();
    assert_eq!(stats.moved, JOBS, "{stats:?}");

    let messages = js.messages("OUT");
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut ids = HashSet::new();
    for (_, id, payload) in &messages {
        *seen.entry(payload.clone()).or_default() += 1;
        assert!(
            ids.insert(id.clone().expect("a message id")),
            "{id:?} twice"
        );
    }
    assert_eq!(messages.len() as u64, JOBS, "{stats:?}");
    for j in 0..JOBS {
        assert_eq!(seen.get(format!("job-{j}").as_bytes()), Some(&1), "job-{j}");
    }
}

#[test]
fn a_relay_in_from_a_cluster_losing_members_applies_every_message_once() {
    let _g = shared();
    let (mut servers, all, js) = cluster();
    js.create_replicated_stream("IN", &["in.>"], 3);
    // The fleet publishes while the relay runs, each message with its id; a batch a kill
    // interrupted goes again (the stream drops the copies it holds).
    let publisher = std::thread::spawn(move || {
        let fleet = Js::connect(&all);
        for batch in 0..JOBS / BATCH {
            let messages = || {
                (batch * BATCH..(batch + 1) * BATCH)
                    .map(|i| (format!("m-{i}"), format!("msg-{i}").into_bytes()))
            };
            let mut tries = 0;
            while let Err(e) = fleet.try_publish_many("in.edge", messages()) {
                tries += 1;
                assert!(tries < 100, "batch {batch}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("edge.leaseq")).unwrap();
    let inbox = q.named("inbox").unwrap();
    let relay = app_inbound(&inbox, &servers[1].url());
    relay.wait_ready(Duration::from_secs(20)).unwrap();
    // The app's worker applies each job: its effect (a count per message, in the file)
    // commits with the ack. `done` counts the effects committed, for the test's pacing.
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (inbox, done, stop) = (inbox.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let Some(lease) = inbox.dequeue_timeout(Duration::from_millis(100)).unwrap() else {
                    continue;
                };
                let payload = String::from_utf8(lease.payload().to_vec()).unwrap();
                // A message delivered again after its job ended (its JetStream ack lost with a
                // leader) is a new job that meets its applied marker: AlreadyApplied, the
                // effect not run again (the module docs' table). The file's counts below
                // check that each effect ran once.
                if lease.ack_with(|tx| apply(tx, &payload)).unwrap() == leaseq::Applied::Now {
                    done.fetch_add(1, Ordering::AcqRel);
                }
            }
        })
    };
    kill_members(
        &mut servers,
        1,
        &js,
        ("IN", Some("edge")),
        || done.load(Ordering::Acquire),
        || relay.stats(),
    );
    publisher.join().unwrap();
    // The relay acks a message once its job is committed, before the worker ran it: the
    // worker stops once the stream is acked and the inbox is drained.
    wait_for(
        "the consumer acked and the inbox drained",
        || relay.stats(),
        || js.consumer_pending("IN", "edge") == (0, 0) && inbox.stats().unwrap().total == 0,
    );
    stop.store(true, Ordering::Release);
    worker.join().unwrap();
    let stats = relay.shutdown();
    assert_eq!(inbox.stats().unwrap().total, 0, "{stats:?}");
    assert_eq!(js.count("IN"), JOBS);
    let rtx = q.database().begin_read().unwrap();
    let table = rtx.open_table(APPLIED).unwrap();
    assert_eq!(table.len().unwrap(), JOBS, "{stats:?}");
    for i in 0..JOBS {
        let n = table
            .get(format!("msg-{i}").as_str())
            .unwrap()
            .map(|v| v.value());
        assert_eq!(n, Some(1), "msg-{i}");
    }
}
