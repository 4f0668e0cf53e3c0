//! An edge app that records events while offline and syncs them when a server appears, and
//! takes commands from the fleet: leaseq as the durable edge buffer of NATS JetStream.
//!
//! ```text
//! cargo run --release --features nats --example edge_sync
//! ```
//!
//! Needs `nats-server` (2.9 or later, with JetStream): `apt-get install nats-server` on
//! Debian and Ubuntu, `brew install nats-server` on macOS, or a release from
//! <https://github.com/nats-io/nats-server/releases>; set `NATS_SERVER` to its path if it is
//! not on `PATH`. The example starts its own server on 127.0.0.1 with a temporary store, and
//! stops it at the end.
//!
//! 1. The app records 20,000 events into its `events` queue with no server anywhere: the
//!    outbound relay reports the server unreachable, nothing is lost, nothing spins.
//! 2. A server appears (started here, on the port the relay was told): the relay sends every
//!    event, in order, each acked locally only after JetStream's `PubAck`.
//! 3. The fleet publishes 20,000 commands for this edge; the inbound relay enqueues them
//!    into the `commands` queue and a worker applies each once with `ack_with`.
//!
//! Every step checks its result and the run fails if one is off.

#[path = "../tests/common/nats.rs"]
mod nats;

use leaseq::relay::{Inbound, Outbound};
use leaseq::{EnqueueOptions, Queue};
use redb::{ReadableTableMetadata, TableDefinition};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const EVENTS: u64 = 20_000;
const COMMANDS: u64 = 20_000;
/// The app's own table: each command's effect, written in the same transaction as its ack.
const SETTINGS: TableDefinition<&str, &str> = TableDefinition::new("settings");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if nats::find_nats_server().is_none() {
        eprintln!(
            "edge_sync needs nats-server (2.9 or later, with JetStream) on PATH:\n  \
             apt-get install nats-server     (Debian, Ubuntu)\n  \
             brew install nats-server        (macOS)\n  \
             or https://github.com/nats-io/nats-server/releases; or set NATS_SERVER"
        );
        std::process::exit(2);
    }
    let dir = tempfile::tempdir()?;
    let file = Queue::open(dir.path().join("edge.leaseq"))?;
    let events = file.named("events")?;

    // 1. Offline: the relay is told where the server will be; nobody listens there yet.
    let mut server = nats::NatsServer::start();
    let url = server.url();
    server.kill();
    let relay = Outbound::builder(&events, &url, "EVENTS", "events.edge-1")
        .max_backoff(Duration::from_millis(500))
        .start()?;
    for batch in 0..EVENTS / 1_000 {
        let readings: Vec<Vec<u8>> = (0..1_000)
            .map(|i| {
                format!(
                    "reading {} = {:.1}",
                    batch * 1_000 + i,
                    20.0 + (i % 50) as f64 / 10.0
                )
                .into_bytes()
            })
            .collect();
        events.enqueue_batch(
            readings
                .iter()
                .map(|r| (r.as_slice(), EnqueueOptions::default())),
        )?;
    }
    let offline = relay.wait_ready(Duration::from_secs(1)).unwrap_err();
    println!(
        "offline: {} events kept in the file; the relay says: {offline}",
        events.len()?
    );
    assert_eq!(events.len()?, EVENTS);

    // 2. The server appears, with the fleet's streams.
    server.restart();
    let js = nats::Js::connect(&url);
    js.create_stream("EVENTS", &["events.>"], None);
    js.create_stream("COMMANDS", &["commands.>"], None);
    let appeared = Instant::now();
    relay.wait_ready(Duration::from_secs(30))?;
    let reconnect_s = appeared.elapsed().as_secs_f64();
    let start = Instant::now();
    while !events.is_empty()? {
        std::thread::sleep(Duration::from_millis(5));
    }
    let out_s = start.elapsed().as_secs_f64();
    let stats = relay.shutdown();
    let stored = js.messages("EVENTS");
    let distinct: HashSet<&Option<String>> = stored.iter().map(|m| &m.1).collect();
    assert_eq!(
        (stored.len() as u64, distinct.len() as u64),
        (EVENTS, EVENTS)
    );
    assert!(stored.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(stored[0].2, b"reading 0 = 20.0");
    println!(
        "online: the relay was back {reconnect_s:.2} s after the server; {} events out in {:.2} s ({:.0} jobs/s), each in the stream once; {} duplicates dropped",
        stats.moved,
        out_s,
        stats.moved as f64 / out_s,
        stats.duplicates
    );

    // 3. Commands from the fleet, applied once each.
    js.publish_many(
        "commands.edge-1",
        (0..COMMANDS).map(|i| {
            (
                Some(format!("cmd-{i}")),
                format!("interval={}", 10 + i % 50).into_bytes(),
            )
        }),
    );
    let commands = file.named("commands")?;
    let start = Instant::now();
    let inbound = Inbound::builder(&commands, &url, "COMMANDS", "edge-1")
        .filter_subject("commands.edge-1")
        .start()?;
    inbound.wait_ready(Duration::from_secs(30))?;
    let mut applied = 0u64;
    let mut relayed_s = None;
    while applied < COMMANDS {
        if relayed_s.is_none() && inbound.stats().moved == COMMANDS {
            relayed_s = Some(start.elapsed().as_secs_f64());
        }
        let leases = commands.dequeue_batch(500)?;
        if leases.is_empty() {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let outcomes = commands.ack_with_batch(&leases, |tx, lease| {
            let key = String::from_utf8_lossy(lease.idempotency_key().unwrap_or_default());
            let value = String::from_utf8_lossy(lease.payload());
            tx.open_table(SETTINGS)?
                .insert(key.as_ref(), value.as_ref())?;
            Ok(())
        })?;
        for o in outcomes {
            o?;
            applied += 1;
        }
    }
    let in_s = start.elapsed().as_secs_f64();
    let relayed_s = relayed_s.unwrap_or(in_s);
    let stats = inbound.shutdown();
    let settings = {
        use redb::ReadableDatabase;
        file.database().begin_read()?.open_table(SETTINGS)?.len()?
    };
    assert_eq!((stats.moved, settings), (COMMANDS, COMMANDS));
    println!(
        "commands: {COMMANDS} in through the relay in {relayed_s:.2} s ({:.0} jobs/s), applied once each ({:.0} jobs/s end to end)",
        COMMANDS as f64 / relayed_s,
        COMMANDS as f64 / in_s
    );
    println!("edge_sync: verified");
    Ok(())
}
