//! leaseq's side: a `WorkerPool` whose handler does nothing (each job acked by the pool, with
//! `ack_and_next`: the ack and the next lease in one commit), and completions counted from the
//! queue's change events (`Event::Completed`, published after the commit of the ack). Every
//! call durable before it returns (the default durability: one fsync per group commit).
//!
//! The events are subscribed to only where workers run: with no listener, leaseq records no
//! events, so `enqueue_1` measures the enqueue alone.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use leaseq::{EnqueueOptions, Event, JobId, Queue, WorkerPool};

use crate::{Completions, Side, payload};

/// How long a drop waits for the pool's handlers (they do nothing: well within it).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// leaseq with its worker pool.
pub struct LeaseqSide {
    queue: Option<Queue>,
    pool: Option<WorkerPool>,
    completions: Arc<Completions>,
    /// The event listener; it returns how many events its subscription missed.
    listener: Option<JoinHandle<u64>>,
    /// The completed jobs' ids, kept by the self check only.
    seen: Option<Arc<Mutex<Vec<JobId>>>>,
}

impl LeaseqSide {
    fn open_with(dir: &Path, consumers: usize, record: bool) -> Self {
        let queue = Queue::open(dir.join("bench.leaseq")).expect("open leaseq");
        let completions = Arc::new(Completions::default());
        let seen = record.then(|| Arc::new(Mutex::new(Vec::new())));
        let listener = (consumers > 0).then(|| {
            // Room for every event of a benchmark's backlog; a missed event fails the drop.
            let events = queue.events_with_capacity(1 << 16).expect("events");
            let completions = Arc::clone(&completions);
            let seen = seen.clone();
            thread::spawn(move || {
                // Ends when the queue's file is closed (the last handle dropped).
                while let Some(event) = events.recv() {
                    if let Event::Completed { id } = event {
                        if let Some(seen) = &seen {
                            seen.lock().unwrap_or_else(PoisonError::into_inner).push(id);
                        }
                        completions.add(1);
                    }
                }
                events.missed()
            })
        });
        let pool = (consumers > 0).then(|| {
            WorkerPool::builder(&queue)
                .threads(consumers)
                .start(|_lease| Ok(()))
                .expect("start the pool")
        });
        LeaseqSide {
            queue: Some(queue),
            pool,
            completions,
            listener,
            seen,
        }
    }

    fn queue(&self) -> &Queue {
        self.queue.as_ref().expect("open until dropped")
    }
}

impl Side for LeaseqSide {
    const NAME: &'static str = "leaseq";

    fn open(dir: &Path, consumers: usize) -> Self {
        Self::open_with(dir, consumers, false)
    }

    fn enqueue(&self, payload: &[u8]) {
        self.queue()
            .enqueue(payload, EnqueueOptions::default())
            .expect("enqueue");
    }

    fn enqueue_batch(&self, payloads: &[Vec<u8>]) {
        self.queue()
            .enqueue_batch(payloads.iter().map(|p| (&p[..], EnqueueOptions::default())))
            .expect("enqueue_batch");
    }

    fn wait_completed(&self, n: usize) {
        self.completions.wait(n);
    }
}

impl Drop for LeaseqSide {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let report = pool.shutdown(SHUTDOWN_GRACE);
            // A worker still running keeps a handle, and the listener would wait for it. Not
            // while unwinding: a second panic would abort the benchmark without its message.
            if !thread::panicking() {
                assert_eq!(report.still_running, 0, "a handler outlived the shutdown");
            }
        }
        // The last handle dropped closes the file, which ends the listener's subscription.
        drop(self.queue.take());
        if let Some(listener) = self.listener.take() {
            let missed = listener.join().expect("the event listener panicked");
            if !thread::panicking() {
                assert_eq!(missed, 0, "the event listener missed events");
            }
        }
    }
}

/// The self check of leaseq's side, run by each peer's binary before criterion: 200 jobs (100
/// single enqueues from 4 threads, two batches of 50) through 4 workers; asserts every job was
/// completed exactly once as the events report it, no event was missed, no completion
/// follows, and the queue is empty. Returns a one-line summary.
pub fn check_leaseq() -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let side = LeaseqSide::open_with(dir.path(), 4, true);
    let payload = payload();
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| (0..25).for_each(|_| side.enqueue(&payload)));
        }
        let batch = vec![payload.clone(); 50];
        side.enqueue_batch(&batch);
        side.enqueue_batch(&batch);
    });
    side.wait_completed(200);
    thread::sleep(Duration::from_millis(300));
    let ids = side
        .seen
        .as_ref()
        .expect("recorded")
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(ids.len(), 200, "completions after the last job: {ids:?}");
    let distinct: HashSet<JobId> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 200, "a job completed twice");
    assert!(side.queue().is_empty().expect("is_empty"), "jobs left");
    drop(side);
    "leaseq: 200 jobs through 4 workers, each completed once, no event missed".to_string()
}
