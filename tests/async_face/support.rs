//! Helpers the async-face tests share: polling a future by hand, a waker that counts, and
//! holding the file's commits so that a first poll is reliably `Pending`.

use crate::common::eventually;
use leaseq::{AsyncLease, AsyncQueue};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Polls `fut` once with `waker`; `Some` if it finished.
pub fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>, waker: &Waker) -> Option<F::Output> {
    let mut cx = Context::from_waker(waker);
    match fut.poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Holds the file's commits: a `write` on another thread whose closure waits until the
/// guard is dropped. A dequeue future polled under it cannot have finished its commit yet,
/// so a first poll is `Pending` however fast the helper thread runs (under wine it often
/// finished before the poll looked).
pub struct CommitsHeld {
    release: Option<std::sync::mpsc::Sender<()>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

pub fn hold_commits(q: &leaseq::Queue) -> CommitsHeld {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Mutex::new(released);
    let q = q.clone();
    let writer = std::thread::spawn(move || {
        q.write(|_| {
            let _ = entered_tx.send(());
            let _ = released.lock().unwrap().recv();
            Ok(())
        })
        .unwrap();
    });
    entered.recv().expect("the holding write started");
    CommitsHeld {
        release: Some(release),
        writer: Some(writer),
    }
}

impl Drop for CommitsHeld {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(w) = self.writer.take() {
            w.join().expect("the holding write ended");
        }
    }
}

/// A waker that counts its wakes; its `Arc`'s strong count tells how many copies of it the
/// queue (or anything else) still keeps.
pub struct CountingWaker {
    pub wakes: AtomicUsize,
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

pub fn counting_waker() -> (Arc<CountingWaker>, Waker) {
    let c = Arc::new(CountingWaker {
        wakes: AtomicUsize::new(0),
    });
    (Arc::clone(&c), Waker::from(Arc::clone(&c)))
}

/// The future of an async dequeue.
pub type Dequeue<'a> = Pin<Box<dyn Future<Output = leaseq::Result<Option<AsyncLease>>> + 'a>>;

/// A dequeue future polled once (its commit starts on a helper) under held commits, so that
/// poll is `Pending`; returned once its commit took the one ready job's lease, unread.
pub fn a_dequeue_that_took_the_lease(q: &AsyncQueue) -> Dequeue<'_> {
    let (_c, waker) = counting_waker();
    let mut fut: Dequeue<'_> = Box::pin(q.dequeue());
    let held = hold_commits(q.blocking());
    assert!(poll_once(fut.as_mut(), &waker).is_none());
    drop(held);
    assert!(eventually(|| q.blocking().stats().unwrap().leased == 1));
    fut
}

/// [`a_dequeue_that_took_the_lease`], dropped unread; returns once the give-back landed.
pub fn take_and_drop_a_dequeue(q: &AsyncQueue) {
    drop(a_dequeue_that_took_the_lease(q));
    assert!(eventually(|| q.blocking().stats().unwrap().leased == 0));
}
