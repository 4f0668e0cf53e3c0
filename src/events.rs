//! Change events: what happened in a queue, pushed to subscribers after the commit that did
//! it ([`Queue::events`](crate::Queue::events)). A leaf: the engine records events in the
//! group's log (`commit::GroupLog`); the committer publishes them once the group committed
//! ([`EventHub::publish`]); an aborted group's events are dropped with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;

use crate::job::JobId;

use crate::limits::SUBSCRIBERS_MAX;

/// What happened in a queue, published after the commit that did it (so a reader that looks
/// at the queue on an event sees it done). One event per job and change; a call over many
/// jobs (a batch, a dequeue's sweep of expired leases) gives one per job, in the order the
/// commit made them. As BullMQ's `QueueEvents` (`added`, `completed`, `failed`, `drained`,
/// `paused`, `resumed`) and Oban's telemetry events.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A new job was added, ready or scheduled (any enqueue: single, batch, inside a
    /// transaction, imported). A duplicate that was kept, replaced or debounced adds none.
    Enqueued {
        /// The new job.
        id: JobId,
    },
    /// A job was acked (`ack`, `ack_with`, a batch ack, a pool's): deleted, or kept as
    /// completed in a queue with a history.
    Completed {
        /// The job.
        id: JobId,
    },
    /// An attempt ended without an ack and the job will run again, ready or after its
    /// backoff: a nack, a failing `ack_with` closure, an expired lease taken back by a
    /// dequeue.
    Retried {
        /// The job.
        id: JobId,
        /// The attempt that ended (1 for the first).
        attempt: u32,
    },
    /// A leased job was snoozed: back later, its attempt not charged.
    Snoozed {
        /// The job.
        id: JobId,
    },
    /// A job moved to the dead letters: out of attempts, or failed on purpose.
    Dead {
        /// The job.
        id: JobId,
    },
    /// A job was cancelled ([`Queue::cancel`](crate::Queue::cancel)).
    Cancelled {
        /// The job.
        id: JobId,
    },
    /// A dead, completed or cancelled job was put back to run again
    /// ([`Queue::requeue_dead`](crate::Queue::requeue_dead), [`Queue::retry`](crate::Queue::retry)).
    Requeued {
        /// The job.
        id: JobId,
    },
    /// A running job recorded its progress ([`Lease::set_progress`](crate::Lease::set_progress));
    /// read it with [`Queue::job`](crate::Queue::job). One per commit of a progress, not per
    /// call (a lease commits its progress at most every
    /// [`PROGRESS_COMMIT_INTERVAL`](crate::PROGRESS_COMMIT_INTERVAL)).
    Progress {
        /// The job.
        id: JobId,
    },
    /// A waiting job was deleted to make room for a newer one in a full queue whose limit
    /// drops the oldest ([`WhenFull::DropOldest`](crate::WhenFull::DropOldest)); it will never
    /// be delivered. Since format 13.
    Dropped {
        /// The job.
        id: JobId,
    },
    /// The queue was paused ([`Queue::pause`](crate::Queue::pause)).
    Paused,
    /// The queue was resumed ([`Queue::resume`](crate::Queue::resume)).
    Resumed,
    /// The queue drained: a commit ended the last job under a lease while none was ready or
    /// due (jobs scheduled for later may remain), as BullMQ's `drained`.
    Drained,
    /// The file turned *storage full* at `since_ms` (Unix ms): its disk, or its file limit,
    /// is within the disk reserve ([`Builder::disk_reserve`](crate::Builder::disk_reserve)),
    /// and enqueues are refused with [`Error::StorageFull`](crate::Error::StorageFull) while
    /// the drain goes on. A file-wide event: every queue's subscriptions get it.
    StorageFull {
        /// When the state began (Unix ms), as [`Stats::storage_full_ms`](crate::Stats::storage_full_ms).
        since_ms: u64,
    },
    /// The file has room again (the drain, or a clean-up, freed twice the reserve):
    /// enqueues are taken. File-wide, as [`Event::StorageFull`].
    StorageAvailable,
}

/// The metric an event counts in ([`MinuteCounts`](crate::MinuteCounts)' kinds: 0 enqueued,
/// 1 completed, 2 retried, 3 dead, 4 cancelled, 5 dropped), if any.
pub(crate) fn metric_kind(event: &Event) -> Option<usize> {
    Some(match event {
        Event::Enqueued { .. } => 0,
        Event::Completed { .. } => 1,
        Event::Retried { .. } => 2,
        Event::Dead { .. } => 3,
        Event::Cancelled { .. } => 4,
        Event::Dropped { .. } => 5,
        _ => return None,
    })
}

/// One subscription's side in the hub.
struct Subscriber {
    queue_number: u32,
    tx: Sender<Event>,
    shared: Arc<Shared>,
}

/// What a subscription shares with the hub: the count of events it missed, and the waker
/// of an async reader.
struct Shared {
    missed: AtomicU64,
    waker: Mutex<Option<std::task::Waker>>,
    /// The hub's count of live subscriptions, which this one leaves when dropped.
    live: Arc<AtomicUsize>,
}

/// The subscriptions of one file.
#[derive(Default)]
pub(crate) struct EventHub {
    subs: Mutex<Vec<Subscriber>>,
    /// The live subscriptions (their `Events` not dropped), read without the lock by every
    /// operation: nothing is recorded while it is 0.
    live: Arc<AtomicUsize>,
}

impl EventHub {
    /// Whether anyone listens: a group records events only then.
    pub(crate) fn listening(&self) -> bool {
        self.live.load(Ordering::SeqCst) > 0
    }

    /// A new subscription to queue `queue_number`'s events.
    pub(crate) fn subscribe(&self, queue_number: u32, capacity: usize) -> Option<Events> {
        let mut subs = self.subs.lock();
        if subs.len() >= SUBSCRIBERS_MAX {
            // Subscriptions dropped since the last publish.
            subs.retain(|s| Arc::strong_count(&s.shared) > 1);
            if subs.len() >= SUBSCRIBERS_MAX {
                return None;
            }
        }
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        let shared = Arc::new(Shared {
            missed: AtomicU64::new(0),
            waker: Mutex::new(None),
            live: Arc::clone(&self.live),
        });
        subs.push(Subscriber {
            queue_number,
            tx,
            shared: Arc::clone(&shared),
        });
        self.live.fetch_add(1, Ordering::SeqCst);
        Some(Events { rx, shared })
    }

    /// Hands a file-wide event to every subscription, whatever its queue.
    pub(crate) fn publish_file(&self, event: Event) {
        let mut queues: Vec<u32> = self.subs.lock().iter().map(|s| s.queue_number).collect();
        queues.sort_unstable();
        queues.dedup();
        self.publish(queues.into_iter().map(|q| (q, event.clone())).collect());
    }

    /// Hands a committed group's events to the subscribers of their queues: a full
    /// subscription counts the event as missed; a dropped one is forgotten.
    pub(crate) fn publish(&self, events: Vec<(u32, Event)>) {
        if events.is_empty() {
            return;
        }
        let mut subs = self.subs.lock();
        // Subscriptions dropped since: forgotten.
        subs.retain(|s| Arc::strong_count(&s.shared) > 1);
        let mut wake = Vec::new();
        for sub in subs.iter() {
            let mut sent = false;
            let mut last: Option<&Event> = None;
            for (queue_number, event) in &events {
                if *queue_number != sub.queue_number {
                    continue;
                }
                // A group that drained a queue twice says so once.
                if matches!(event, Event::Drained) && last == Some(&Event::Drained) {
                    continue;
                }
                last = Some(event);
                match sub.tx.try_send(event.clone()) {
                    Ok(()) => sent = true,
                    Err(TrySendError::Full(_)) => {
                        sub.shared.missed.fetch_add(1, Ordering::Relaxed);
                    }
                    // Dropped meanwhile: forgotten at the next publish.
                    Err(TrySendError::Disconnected(_)) => break,
                }
            }
            if sent {
                let waker = sub.shared.waker.lock().take();
                wake.extend(waker);
            }
        }
        drop(subs);
        // Outside the locks: an executor may poll the stream inline on wake.
        wake.into_iter().for_each(std::task::Waker::wake);
    }
}

impl Drop for Events {
    /// Unsubscribes: from now on this subscription costs nothing.
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for EventHub {
    /// The file closed: every subscription ends (its channel disconnects), and an async
    /// reader waiting on one is woken to see it.
    fn drop(&mut self) {
        for sub in std::mem::take(&mut *self.subs.lock()) {
            let waker = sub.shared.waker.lock().take();
            drop(sub.tx);
            waker.into_iter().for_each(std::task::Waker::wake);
        }
    }
}

/// A subscription to one queue's [`Event`]s ([`Queue::events`](crate::Queue::events)):
/// a bounded channel the queue's commits feed, read as a blocking channel or (feature
/// `async`) as a `Stream`. A reader slower than the queue misses events rather than slowing
/// it: once `capacity` events wait unread, the next ones are dropped and counted
/// ([`Events::missed`]); a UI then reads [`Queue::stats`](crate::Queue::stats) again. It
/// holds no handle to the file: once the file closes (every handle dropped) it ends (`recv`
/// returns `None`, the stream ends). `Send`; dropping it unsubscribes.
pub struct Events {
    rx: Receiver<Event>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("waiting", &self.rx.len())
            .field("missed", &self.missed())
            .finish()
    }
}

impl Events {
    /// The next event, waiting for it; `None` once the file closed.
    pub fn recv(&self) -> Option<Event> {
        self.rx.recv().ok()
    }

    /// The next event, waiting up to `timeout`; `None` if none came (or the file closed).
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Event> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next event if one is waiting, at once.
    pub fn try_recv(&self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// The events as a blocking iterator ([`Events::recv`] in a loop): it ends once the
    /// file closed. (Async code reads the subscription as a `Stream`, feature `async`.)
    pub fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        std::iter::from_fn(|| self.recv())
    }

    /// Events waiting to be read now.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no event waits to be read.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Events dropped since the subscription began because `capacity` events were waiting
    /// unread: a count to show, or a sign to read the queue's stats again.
    pub fn missed(&self) -> u64 {
        self.shared.missed.load(Ordering::Relaxed)
    }
}

#[cfg(feature = "async")]
impl futures_core::Stream for Events {
    type Item = Event;

    /// The next event, without a thread: woken by the commit that publishes it; ends once
    /// the file closed.
    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Event>> {
        use crossbeam_channel::TryRecvError;
        use std::task::Poll;
        let this = self.get_mut();
        match this.rx.try_recv() {
            Ok(e) => return Poll::Ready(Some(e)),
            Err(TryRecvError::Disconnected) => return Poll::Ready(None),
            Err(TryRecvError::Empty) => {}
        }
        let old = this.shared.waker.lock().replace(cx.waker().clone());
        drop(old);
        // Again after registering: an event published in between took no waker.
        match this.rx.try_recv() {
            Ok(e) => Poll::Ready(Some(e)),
            Err(TryRecvError::Disconnected) => Poll::Ready(None),
            Err(TryRecvError::Empty) => Poll::Pending,
        }
    }
}
