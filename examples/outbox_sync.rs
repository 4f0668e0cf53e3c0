//! A desktop app's outbox, synced to a flaky server with retries and backoff.
//!
//! ```text
//! cargo run --example outbox_sync [-- SEED]
//! ```
//!
//! - The app saves each note in its own redb table **and** enqueues the job that syncs it, in
//!   one [`Queue::write`] transaction (the transactional outbox): a note never exists without
//!   its sync job, and a sync job never without its note.
//! - A sync worker thread dequeues, reads the note, and "sends" it to a server simulated in
//!   this process (a thread behind a channel). The request carries the job's idempotency key
//!   as its `Idempotency-Key`, and the server keeps every key it has applied, as a real server
//!   honouring that header does: a repeated request is answered from the saved result and
//!   applied no second time.
//! - The server is offline for its first 150 ms, then fails 30 % of the requests: half of those
//!   before applying them (a 503), half after applying them with the reply lost (the case no
//!   queue can tell apart from the first: only the key makes the retry harmless).
//! - On success the worker records the sync in the app's own table and acks, in one commit
//!   (`ack_with`), so the app's "synced" mark and the end of the job never disagree. When the
//!   server cannot be reached or answers 503 it snoozes the job with a reason ("waiting for
//!   network"): the job goes back without charging its attempt, so an outage, however long,
//!   never dead-letters a note (an app with a network watcher would pause the queue instead,
//!   as the guide's outbox loop does). On any other failure it nacks, so the queue's
//!   [`RetryPolicy::exponential`] backs the job off (5 ms doubling to 100 ms here, so the
//!   example runs in a second; real apps use seconds to minutes).
//!
//! At the end it asserts that every note is on the server exactly once (the server's count of
//! applied requests per key is 1 for every note), that the queue is empty, and that nothing
//! died; then it prints a summary.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leaseq::redb::{ReadableDatabase, TableDefinition};
use leaseq::{EnqueueOptions, Queue, RetryPolicy, StopSignal};

/// The app's own table: note id -> text.
const NOTES: TableDefinition<&str, &str> = TableDefinition::new("notes");
/// The app's own table: note id -> the attempt that synced it.
const SYNCED: TableDefinition<&str, u32> = TableDefinition::new("synced");

const NOTES_TOTAL: usize = 40;
const SERVER_OFFLINE: Duration = Duration::from_millis(150);
const FAILURE_PERCENT: u32 = 30;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One HTTP-like request to the server.
struct Request {
    idempotency_key: String,
    body: String,
    reply: mpsc::Sender<Result<(), String>>,
}

/// What the server saw, returned when it shuts down.
#[derive(Default, Debug)]
struct ServerLog {
    /// Applied requests per idempotency key (must end at exactly 1 for every note).
    applied: HashMap<String, u32>,
    /// The notes as stored on the server.
    notes: HashMap<String, String>,
    requests: u32,
    offline: u32,
    failed_before_applying: u32,
    reply_lost_after_applying: u32,
    duplicates_answered_from_key: u32,
}

/// The server: offline at first, then failing `FAILURE_PERCENT` % of requests, deduplicating by
/// idempotency key. Runs until every sender is dropped.
fn server(requests: mpsc::Receiver<Request>, seed: u64) -> ServerLog {
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut log = ServerLog::default();
    for req in requests {
        log.requests += 1;
        if started.elapsed() < SERVER_OFFLINE {
            log.offline += 1;
            let _ = req.reply.send(Err("connection refused".into()));
            continue;
        }
        let roll = rng.u32(0..100);
        if roll < FAILURE_PERCENT / 2 {
            log.failed_before_applying += 1;
            let _ = req.reply.send(Err("503 service unavailable".into()));
            continue;
        }
        // Idempotency-Key: a key seen before is answered from the saved result, not applied.
        if log.applied.contains_key(&req.idempotency_key) {
            log.duplicates_answered_from_key += 1;
        } else {
            log.applied.insert(req.idempotency_key.clone(), 1);
            log.notes.insert(req.idempotency_key.clone(), req.body);
        }
        if roll < FAILURE_PERCENT {
            // Applied, but the reply never reaches the client (a timeout on its side).
            log.reply_lost_after_applying += 1;
            drop(req.reply);
            continue;
        }
        let _ = req.reply.send(Ok(()));
    }
    log
}

#[derive(Default, Debug)]
struct WorkerLog {
    acks: u32,
    nacks: u32,
    snoozes: u32,
}

/// The sync worker: one job at a time until `stop`.
fn sync_worker(
    queue: Queue,
    server: mpsc::Sender<Request>,
    stop: StopSignal,
) -> Result<WorkerLog, Error> {
    let mut log = WorkerLog::default();
    while let Some(lease) = queue.dequeue_until(Duration::from_secs(5), &stop)? {
        let note_id = std::str::from_utf8(lease.payload())?.to_string();
        // Read transactions on the queue's database are fine alongside the queue.
        let body = {
            let read = queue.database().begin_read()?;
            let notes = read.open_table(NOTES)?;
            let note = notes
                .get(note_id.as_str())?
                .ok_or("a sync job without its note")?;
            note.value().to_string()
        };
        // The job's own key, enqueued with it: the same on every retry of this job.
        let key = lease.idempotency_key().ok_or("every sync job has a key")?;
        let (reply, answer) = mpsc::channel();
        server.send(Request {
            idempotency_key: String::from_utf8(key.to_vec())?,
            body,
            reply,
        })?;
        match answer.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(())) => {
                // The app's record of the sync and the ack, in one commit.
                let attempt = lease.attempt();
                lease.ack_with(|tx| {
                    tx.open_table(SYNCED)?.insert(note_id.as_str(), attempt)?;
                    Ok(())
                })?;
                log.acks += 1;
            }
            // The server is unreachable: not the note's fault, so no attempt is charged.
            Ok(Err(why)) if why.contains("connection refused") || why.starts_with("503") => {
                lease.snooze_because(Duration::from_millis(20), "waiting for network")?;
                log.snoozes += 1;
            }
            Ok(Err(why)) => {
                lease.nack(&why)?; // back off through the queue's retry policy
                log.nacks += 1;
            }
            Err(_) => {
                lease.nack("no reply from the server")?;
                log.nacks += 1;
            }
        }
    }
    Ok(log)
}

fn main() -> Result<(), Error> {
    let seed = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 7,
    };
    let dir = tempfile::tempdir()?;
    let queue = Queue::builder()
        .retry(
            RetryPolicy::exponential(Duration::from_millis(5), Duration::from_millis(100))
                .with_jitter(20),
        )
        .max_attempts(50)
        .open(dir.path().join("app.leaseq"))?;

    let (to_server, requests) = mpsc::channel();
    let server = std::thread::spawn(move || server(requests, seed));
    let stop = StopSignal::new();
    let worker = {
        let (queue, stop, to_server) = (queue.clone(), stop.clone(), to_server.clone());
        std::thread::spawn(move || sync_worker(queue, to_server, stop))
    };
    drop(to_server); // the worker holds the only sender now

    // The app: each note and its sync job in one transaction.
    let started = Instant::now();
    for i in 0..NOTES_TOTAL {
        let id = format!("note-{i}");
        queue.write(|tx| {
            tx.open_table(NOTES)?
                .insert(id.as_str(), format!("text of {id}").as_str())?;
            tx.enqueue(
                id.as_bytes(),
                EnqueueOptions::default().idempotency_key(&id),
            )?;
            Ok(())
        })?;
        std::thread::sleep(Duration::from_millis(5)); // the user types
    }

    // Wait until the outbox drains (each failed job waits out its backoff first).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !queue.is_empty()? {
        assert!(
            Instant::now() < deadline,
            "the outbox did not drain in 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.stop();
    let worker_log = worker.join().expect("worker thread")?;
    let server_log = server.join().expect("server thread");
    let elapsed = started.elapsed();

    // Every note on the server exactly once, the queue empty, nothing dead.
    let stats = queue.stats()?;
    assert_eq!(stats.total, 0, "queue not empty: {stats:?}");
    assert_eq!(
        server_log.applied.len(),
        NOTES_TOTAL,
        "notes missing on the server"
    );
    for i in 0..NOTES_TOTAL {
        let id = format!("note-{i}");
        assert_eq!(server_log.applied.get(&id), Some(&1), "{id} applied ≠ once");
        assert_eq!(server_log.notes[&id], format!("text of {id}"));
    }
    assert_eq!(worker_log.acks as usize, NOTES_TOTAL, "one ack per note");
    let read = queue.database().begin_read()?;
    let synced = read.open_table(SYNCED)?;
    for i in 0..NOTES_TOTAL {
        let id = format!("note-{i}");
        assert!(synced.get(id.as_str())?.is_some(), "{id} not marked synced");
    }
    assert_eq!(
        server_log.requests,
        worker_log.acks + worker_log.nacks + worker_log.snoozes,
        "every request ended in an ack, a nack or a snooze"
    );
    assert!(
        worker_log.snoozes > 0,
        "the offline period was snoozed through"
    );
    assert!(server_log.offline > 0, "the offline period was exercised");
    assert!(
        server_log.duplicates_answered_from_key >= server_log.reply_lost_after_applying,
        "every lost reply was retried and answered from its key"
    );

    println!(
        "outbox_sync (seed {seed}): {NOTES_TOTAL} notes saved with their sync jobs, \
         {} on the server, each applied exactly once, in {} ms",
        server_log.applied.len(),
        elapsed.as_millis()
    );
    println!(
        "  requests {}: refused while offline {}, failed before applying {}, \
         reply lost after applying {}",
        server_log.requests,
        server_log.offline,
        server_log.failed_before_applying,
        server_log.reply_lost_after_applying
    );
    println!(
        "  retries answered from the Idempotency-Key (not applied again): {}",
        server_log.duplicates_answered_from_key
    );
    println!(
        "  worker: {} acks, {} nacks (each backed off by the retry policy), {} snoozes (offline, \
         uncharged); queue: {} jobs, {} dead",
        worker_log.acks, worker_log.nacks, worker_log.snoozes, stats.total, stats.dead
    );
    Ok(())
}
