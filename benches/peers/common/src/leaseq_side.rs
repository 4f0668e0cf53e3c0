//! leaseq's side: a `WorkerPool` whose handler does nothing (each job acked by the pool), and
//! completions counted from the queue's change events (`Event::Completed`, published after
//! the commit of the ack). Every call durable before it returns (the default durability:
//! one fsync per group commit).

use std::path::Path;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use leaseq::{EnqueueOptions, Event, Queue, WorkerPool};

use crate::{Completions, Side};

/// leaseq with its worker pool.
pub struct LeaseqSide {
    queue: Option<Queue>,
    pool: Option<WorkerPool>,
    completions: Arc<Completions>,
    listener: Option<JoinHandle<()>>,
}

impl Side for LeaseqSide {
    const NAME: &'static str = "leaseq";

    fn open(dir: &Path, consumers: usize) -> Self {
        let queue = Queue::open(dir.join("bench.leaseq")).expect("open leaseq");
        let completions = Arc::new(Completions::default());
        // Room for every event of a benchmark's backlog: a missed event would be a missed
        // completion (the wait would then panic).
        let events = queue.events_with_capacity(1 << 16).expect("events");
        let listener = {
            let completions = Arc::clone(&completions);
            thread::spawn(move || {
                // Ends when the queue's file is closed (the subscription ends).
                while let Some(event) = events.recv() {
                    if let Event::Completed { .. } = event {
                        completions.add(1);
                    }
                }
            })
        };
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
            listener: Some(listener),
        }
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

impl LeaseqSide {
    fn queue(&self) -> &Queue {
        self.queue.as_ref().expect("open until dropped")
    }
}

impl Drop for LeaseqSide {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.shutdown(Duration::from_secs(10));
        }
        // The last handle dropped closes the file, which ends the listener's subscription.
        drop(self.queue.take());
        if let Some(listener) = self.listener.take() {
            let _ = listener.join();
        }
    }
}
