//! The backend of an offline-first notes app on tokio, built on leaseq's async face: what
//! the guide's "Building an app" chapter (`leaseq::guide::building_an_app`) walks through.
//!
//! ```text
//! cargo run --release -- check [KILLS]      # the kill test (CI runs it)
//! cargo run --release -- server PORT        # the flaky sync server alone
//! cargo run --release -- app DIR URL NOTES  # the app alone (Ctrl-C stops it cleanly)
//! ```
//!
//! **The app** (`app`): one instance per data directory (a second start finds the file
//! `AlreadyOpen` and says so); saves each note and the job that syncs it in one transaction
//! (the outbox, `AsyncQueue::write`); an async staged pool sends each note to the server with
//! the job's idempotency key as its `Idempotency-Key` header (off the write lock, awaiting
//! the HTTP call), then commits the "synced" mark with the ack and the next step's job (index
//! the note, on a named queue worked by hand-written async consumers with `ack_with`); a
//! status task follows the
//! queue's change events (no polling); Ctrl-C, or all notes synced, shuts everything down in
//! order and releases the file, so the next start reports no repair.
//!
//! **The server** (`server`): HTTP on 127.0.0.1 that fails a fifth of the requests before
//! applying them (503) and a tenth after applying them (500: the reply is "lost"), and applies
//! each idempotency key once.
//!
//! **The kill test** (`check`): runs the server in this process and the app as a child,
//! killed with SIGKILL (TerminateProcess on Windows) at random moments, started again, once
//! stopped with Ctrl-C (Unix), then left to finish; a second instance is refused while one
//! runs. Then it verifies every note was applied by the server exactly once, is marked synced
//! in the app's table, and that the queue is empty with nothing dead.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use leaseq::redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use leaseq::worker::effect;
use leaseq::{AsyncLease, EnqueueOptions, Error as QueueError, Event, Outcome, Queue, WorkerPool};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The app's own tables, in the queue's file: note id -> text, and note id -> the attempt
/// that synced it.
const NOTES: TableDefinition<&str, &str> = TableDefinition::new("notes");
const SYNCED: TableDefinition<&str, u32> = TableDefinition::new("synced");
/// The app's search index: note id -> indexed (a step after the sync, on its own queue).
const INDEXED: TableDefinition<&str, u8> = TableDefinition::new("indexed");

/// Exit status of a second instance.
const EXIT_ALREADY_RUNNING: i32 = 3;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match args.first().map(String::as_str) {
        Some("app") => {
            let dir = PathBuf::from(args.get(1).ok_or("app DIR URL NOTES")?);
            let url = args.get(2).ok_or("app DIR URL NOTES")?.clone();
            let notes: usize = args.get(3).ok_or("app DIR URL NOTES")?.parse()?;
            let code = rt.block_on(app(&dir, &url, notes))?;
            std::process::exit(code);
        }
        Some("server") => {
            let port: u16 = args.get(1).map_or(Ok(8080), |p| p.parse())?;
            rt.block_on(async {
                let (url, _server) = serve(port).await?;
                println!("serving on {url}; Ctrl-C stops");
                tokio::signal::ctrl_c().await?;
                Ok(())
            })
        }
        Some("check") => {
            let kills: usize = args.get(1).map_or(Ok(12), |k| k.parse())?;
            rt.block_on(check(kills))
        }
        _ => Err("usage: notes_app check [KILLS] | server [PORT] | app DIR URL NOTES".into()),
    }
}

// ---------------------------------------------------------------------------------------
// The app.

/// Runs the app until every note is written and synced (or Ctrl-C); returns the exit status.
async fn app(dir: &Path, url: &str, notes: usize) -> Result<i32, Error> {
    // One instance per data directory: the file's lock says whether another runs.
    let queue = match Queue::builder()
        .lease(Duration::from_secs(10))
        .retry(leaseq::RetryPolicy::exponential(
            Duration::from_millis(20),
            Duration::from_millis(200),
        ))
        .max_attempts(1000)
        .open(dir.join("notes.leaseq"))
    {
        Ok(q) => q,
        Err(QueueError::AlreadyOpen { .. }) => {
            say("ALREADY_RUNNING");
            return Ok(EXIT_ALREADY_RUNNING);
        }
        Err(e) => return Err(e.into()),
    };
    let r = queue.recovery();
    say(format!(
        "RECOVERY repaired={} leases_returned={}",
        r.repaired, r.leases_returned
    ));
    let aq = queue.to_async();

    // The status view: live counts from the change events, without polling.
    let mut events = queue.events()?;
    let status = {
        let q = queue.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut completed = 0u64;
            while let Some(event) = events.next().await {
                match event {
                    Event::Completed { .. } => completed += 1,
                    Event::Drained => {
                        let s = q.stats();
                        if let Ok(s) = s {
                            say(format!(
                                "STATUS synced_now={completed} waiting={} missed={}",
                                s.ready + s.scheduled,
                                events.missed()
                            ));
                        }
                    }
                    _ => {}
                }
            }
        })
    };

    // The sync: a staged async pool. The HTTP call is the first stage (awaited, off the
    // write lock); the "synced" mark commits with the ack.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    // A second step on a queue of its own: index each synced note, by hand-written async
    // consumers (below).
    let index = queue.named("index")?;
    let (sync_url, db_queue, next_step) = (format!("{url}/notes"), queue.clone(), index.clone());
    let pool =
        WorkerPool::builder(&queue)
            .threads(4)
            .start_async_staged(move |lease: AsyncLease| {
                let (client, url, q) = (client.clone(), sync_url.clone(), db_queue.clone());
                let next_step = next_step.clone();
                async move {
                    let id = String::from_utf8(lease.payload().to_vec())?;
                    let text = read_note(&q, &id)?.ok_or("a sync job without its note")?;
                    let key =
                        String::from_utf8(lease.idempotency_key().unwrap_or_default().to_vec())?;
                    let sent = client
                        .post(&url)
                        .header("Idempotency-Key", key)
                        .body(text)
                        .send()
                        .await;
                    match sent.map(|r| r.status()) {
                        Ok(s) if s.is_success() => {}
                        // Offline, or the server busy: not the job's fault, no attempt charged.
                        Err(_) => return Err(Outcome::Snooze(Duration::from_millis(30)).into()),
                        Ok(s) if s == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                            return Err(Outcome::Snooze(Duration::from_millis(30)).into());
                        }
                        Ok(s) => return Err(format!("server answered {s}").into()),
                    }
                    let attempt = lease.attempt();
                    // The "synced" mark, the ack and the next step's job: one commit.
                    Ok(effect(move |tx| {
                        tx.open_table(SYNCED)?.insert(id.as_str(), attempt)?;
                        let key = format!("index-{id}");
                        tx.enqueue_to(
                            &next_step,
                            id.as_bytes(),
                            EnqueueOptions::default().idempotency_key(&key),
                        )?;
                        Ok(())
                    }))
                }
            })?;

    // Hand-written async consumers of the index queue: each waits without a thread, applies
    // its effect exactly once (`ack_with`: the index row, the applied marker and the ack in
    // one commit), and ends when the file shuts down (`Closed`).
    let indexers: Vec<_> = (0..2)
        .map(|_| {
            let index = index.to_async();
            tokio::spawn(async move {
                while let Ok(lease) = index.next().await {
                    let id = String::from_utf8_lossy(lease.payload()).into_owned();
                    let indexed = lease
                        .ack_with(move |tx| {
                            tx.open_table(INDEXED)?.insert(id.as_str(), 1)?;
                            Ok(())
                        })
                        .await;
                    if let Err(e) = indexed {
                        say(format!("INDEX_ERROR {e}"));
                    }
                }
            })
        })
        .collect();
    drop(index);

    // The user writes notes: each note and its sync job in one transaction (the outbox).
    let writer = {
        let aq = aq.clone();
        tokio::spawn(async move {
            for n in 0..notes {
                let id = format!("note-{n}");
                aq.write(move |tx| {
                    let mut table = tx.open_table(NOTES)?;
                    if table.get(id.as_str())?.is_some() {
                        return Ok(()); // saved before a restart
                    }
                    table.insert(id.as_str(), format!("text of {id}").as_str())?;
                    drop(table);
                    tx.enqueue(
                        id.as_bytes(),
                        EnqueueOptions::default().idempotency_key(&id),
                    )?;
                    Ok(())
                })
                .await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Ok::<(), leaseq::Error>(())
        })
    };

    // Until every note is synced, or Ctrl-C.
    let finished = tokio::select! {
        done = all_synced(&queue, notes) => { done?; true }
        _ = tokio::signal::ctrl_c() => false,
    };
    // The clean shutdown, in order: the tasks that hold handles of the file (the writer,
    // the status view), the pool (its handlers finish and commit their effects), then the
    // file itself, from its last handle (released: the next start reports no repair).
    writer.abort();
    status.abort();
    let _ = (writer.await, status.await);
    let pool_report = pool.shutdown(Duration::from_secs(5)).await;
    drop(queue);
    // The indexers end on their own when the shutdown starts (their `next` says `Closed`).
    let report = tokio::spawn(aq.shutdown(Duration::from_secs(5)));
    for indexer in indexers {
        let _ = indexer.await;
    }
    let report = report.await?;
    say(format!(
        "{} released={} given_back={}",
        if finished { "DONE" } else { "STOPPED" },
        report.released,
        pool_report.given_back
    ));
    Ok(0)
}

/// Waits until `notes` notes are saved and every one is synced (the queue empty).
async fn all_synced(queue: &Queue, notes: usize) -> Result<(), Error> {
    loop {
        let (saved, synced, indexed) = {
            let rtx = queue.database().begin_read()?;
            (
                table_len(&rtx, NOTES)?,
                table_len(&rtx, SYNCED)?,
                table_len(&rtx, INDEXED)?,
            )
        };
        let done = saved == notes as u64 && synced == saved && indexed == saved;
        if done && queue.is_empty()? && queue.named("index")?.is_empty()? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn table_len<V: leaseq::redb::Value + 'static>(
    rtx: &leaseq::redb::ReadTransaction,
    table: TableDefinition<&str, V>,
) -> Result<u64, Error> {
    match rtx.open_table(table) {
        Ok(t) => Ok(t.len()?),
        Err(leaseq::redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

fn read_note(q: &Queue, id: &str) -> Result<Option<String>, Error> {
    let rtx = q.database().begin_read()?;
    let notes = rtx.open_table(NOTES)?;
    Ok(notes.get(id)?.map(|v| v.value().to_string()))
}

fn say(line: impl std::fmt::Display) {
    println!("@@ {line}");
}

// ---------------------------------------------------------------------------------------
// The flaky server.

#[derive(Default)]
struct Server {
    /// Applied requests per idempotency key (each must end at 1).
    applied: HashMap<String, u32>,
    requests: u64,
    repeats: u64,
}

type Shared = Arc<Mutex<Server>>;

async fn serve(port: u16) -> Result<(String, Shared), Error> {
    let shared: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/notes", post(receive))
        .route("/applied", get(applied))
        .with_state(Arc::clone(&shared));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, shared))
}

async fn receive(State(s): State<Shared>, headers: HeaderMap, _body: String) -> StatusCode {
    let Some(key) = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return StatusCode::BAD_REQUEST;
    };
    let roll = fastrand::u32(..100);
    let mut s = s.lock().unwrap();
    s.requests += 1;
    if roll < 20 {
        return StatusCode::SERVICE_UNAVAILABLE; // before applying
    }
    match s.applied.get(&key) {
        Some(_) => s.repeats += 1, // a retry of an applied request: answered, not applied
        None => {
            s.applied.insert(key, 1);
        }
    }
    if roll < 30 {
        return StatusCode::INTERNAL_SERVER_ERROR; // applied, the reply "lost"
    }
    StatusCode::OK
}

async fn applied(State(s): State<Shared>) -> String {
    serde_json::to_string(&s.lock().unwrap().applied).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The kill test.

const NOTES_TOTAL: usize = 300;

async fn check(kills: usize) -> Result<(), Error> {
    let (url, server) = serve(0).await?;
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let mut repaired = 0;
    // Killed at random moments.
    for round in 0..kills {
        let mut child = AppProc::start(dir.path(), &url)?;
        let recovery = child.wait_for("RECOVERY")?;
        repaired += usize::from(recovery.contains("repaired=true"));
        if round == 0 {
            // A second instance on the same data is refused while this one runs.
            let second = AppProc::start(dir.path(), &url)?.wait_exit()?;
            assert_eq!(
                second,
                Some(EXIT_ALREADY_RUNNING),
                "a second instance must be refused"
            );
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(30..400))).await;
        child.kill()?;
    }
    // Ctrl-C: a clean stop, so the next start finds no repair to do.
    if cfg!(unix) {
        let mut child = AppProc::start(dir.path(), &url)?;
        child.wait_for("RECOVERY")?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        child.interrupt()?;
        let line = child.wait_for("STOPPED")?;
        assert!(line.contains("released=true"), "{line}");
        assert_eq!(child.wait_exit()?, Some(0));
        let mut next = AppProc::start(dir.path(), &url)?;
        let recovery = next.wait_for("RECOVERY")?;
        assert!(
            recovery.contains("repaired=false"),
            "a clean stop leaves no repair: {recovery}"
        );
        next.kill()?;
    }
    // Then left to finish.
    let mut child = AppProc::start(dir.path(), &url)?;
    let done = child.wait_for("DONE")?;
    assert!(done.contains("released=true"), "{done}");
    assert_eq!(child.wait_exit()?, Some(0));

    // Every note applied by the server exactly once, marked synced, and nothing left.
    let s = server.lock().unwrap();
    assert_eq!(
        s.applied.len(),
        NOTES_TOTAL,
        "every note reached the server"
    );
    assert!(s.applied.values().all(|&n| n == 1), "each applied once");
    let queue = Queue::open(dir.path().join("notes.leaseq"))?;
    assert!(!queue.recovery().repaired, "the last run closed cleanly");
    let stats = queue.stats()?;
    assert_eq!((stats.total, stats.dead), (0, 0), "{stats:?}");
    let rtx = queue.database().begin_read()?;
    assert_eq!(table_len(&rtx, NOTES)?, NOTES_TOTAL as u64);
    assert_eq!(table_len(&rtx, SYNCED)?, NOTES_TOTAL as u64);
    assert_eq!(table_len(&rtx, INDEXED)?, NOTES_TOTAL as u64);
    let index = queue.named("index")?.stats()?;
    assert_eq!((index.total, index.dead), (0, 0), "{index:?}");
    println!(
        "notes_app check: {NOTES_TOTAL} notes, {kills} kills ({repaired} starts repaired a crashed file), \
         {} requests, {} repeats answered without applying, every note applied once and indexed once ({:.1} s)",
        s.requests,
        s.repeats,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The app as a child process, its `@@` lines read from its stdout.
struct AppProc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl AppProc {
    fn start(dir: &Path, url: &str) -> Result<AppProc, Error> {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "app",
                &dir.display().to_string(),
                url,
                &NOTES_TOTAL.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(msg) = line.strip_prefix("@@ ") {
                    let _ = tx.send(msg.to_string());
                }
            }
        });
        Ok(AppProc { child, lines })
    }

    /// The first line starting with `what`, within a minute.
    fn wait_for(&mut self, what: &str) -> Result<String, Error> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(what) => return Ok(line),
                Ok(_) => {}
                Err(_) => return Err(format!("the app never said {what}").into()),
            }
        }
    }

    fn wait_exit(&mut self) -> Result<Option<i32>, Error> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.code());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err("the app did not exit".into())
    }

    fn kill(&mut self) -> Result<(), Error> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Ctrl-C (SIGINT), as a terminal sends it.
    fn interrupt(&mut self) -> Result<(), Error> {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()?;
        if !status.success() {
            return Err("kill -INT failed".into());
        }
        Ok(())
    }
}
