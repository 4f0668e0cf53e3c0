//! The helper threads the async face runs its blocking calls on, so a runtime thread never
//! waits for a commit: a task is a closure; its answer comes back through a oneshot channel
//! whose future ([`Call`]) the caller awaits.
//!
//! Process-wide, started on demand: a helper is spawned when a task finds every helper busy
//! (up to [`ASYNC_THREADS_MAX`]), and exits after [`HELPER_IDLE_EXIT`] without work. Helpers
//! hold no queue handle between tasks, so they never keep a file open. Several helpers
//! committing at once share commits (group commit), as threads do.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use futures_channel::oneshot;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::limits::ASYNC_THREADS_MAX;

/// How long a helper waits for a task before it exits.
const HELPER_IDLE_EXIT: Duration = Duration::from_secs(10);

type Task = Box<dyn FnOnce() + Send + 'static>;

struct Helpers {
    tx: Sender<Task>,
    rx: Receiver<Task>,
    counts: Mutex<Counts>,
}

/// Helpers alive, of those the ones waiting for a task, and the tasks sent that no helper
/// took yet.
struct Counts {
    live: usize,
    idle: usize,
    pending: usize,
}

fn helpers() -> &'static Helpers {
    static HELPERS: OnceLock<Helpers> = OnceLock::new();
    HELPERS.get_or_init(|| {
        // As many tasks as the app has futures awaiting them.
        let (tx, rx) = crossbeam_channel::unbounded();
        Helpers {
            tx,
            rx,
            counts: Mutex::new(Counts {
                live: 0,
                idle: 0,
                pending: 0,
            }),
        }
    })
}

/// Runs `task` on a helper thread, starting one if every helper is busy.
pub(crate) fn submit(task: Task) {
    let h = helpers();
    let mut counts = h.counts.lock();
    if let Err(unsent) = h.tx.send(task) {
        // The receiver lives in a static: not reached. Run it rather than lose it.
        drop(counts);
        run(unsent.0);
        return;
    }
    counts.pending += 1;
    // A helper that took a task but has not said so yet still counts as idle, and its task
    // as pending: the two cancel out.
    if counts.pending > counts.idle && counts.live < ASYNC_THREADS_MAX {
        counts.live += 1;
        drop(counts);
        let spawned = std::thread::Builder::new()
            .name("leaseq-async".into())
            .spawn(|| helper(helpers()));
        if let Err(e) = spawned {
            h.counts.lock().live -= 1;
            tracing::warn!(error = %e, "leaseq: no helper thread for the async face; running its task here");
            // With no helper alive, the task would wait forever: run what waits here.
            if h.counts.lock().live == 0 {
                while let Ok(t) = h.rx.try_recv() {
                    h.counts.lock().pending -= 1;
                    run(t);
                }
            }
        }
    }
}

fn helper(h: &'static Helpers) {
    loop {
        h.counts.lock().idle += 1;
        let got = h.rx.recv_timeout(HELPER_IDLE_EXIT);
        let mut counts = h.counts.lock();
        counts.idle -= 1;
        match got {
            Ok(task) => {
                counts.pending -= 1;
                drop(counts);
                run(task);
            }
            // A task sent as the wait ended is taken on the next round.
            Err(RecvTimeoutError::Timeout) if !h.rx.is_empty() => {}
            Err(_) => {
                counts.live -= 1;
                return;
            }
        }
    }
}

/// Runs one task; a panic in it (leaseq catches its callers' panics itself, so only a bug)
/// drops its answer's sender, which its [`Call`] reports.
fn run(task: Task) {
    if catch_unwind(AssertUnwindSafe(task)).is_err() {
        tracing::error!("leaseq: a task of the async face panicked");
    }
}

/// The answer of a blocking call run on a helper: a future of its `Result`.
///
/// Dropped before the answer was read, the call still completes on its helper (a commit
/// under way cannot be taken back); with an `abandon` hook, an answer that no one will read
/// is handed to it (on a helper), so what it holds (a lease) is given back.
pub(crate) struct Call<T: Send + 'static> {
    rx: Option<oneshot::Receiver<Result<T>>>,
    abandon: Option<fn(Result<T>)>,
}

/// Runs `f` on a helper thread; the returned future resolves to its answer.
pub(crate) fn call<T, F>(f: F) -> Call<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    start(f, None)
}

/// [`call`] whose answer goes to `abandon` (on a helper) when the future is dropped before
/// reading it.
pub(crate) fn call_or_abandon<T, F>(f: F, abandon: fn(Result<T>)) -> Call<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    start(f, Some(abandon))
}

fn start<T, F>(f: F, abandon: Option<fn(Result<T>)>) -> Call<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    // From inside a `write` or `ack_with` closure (a `block_on` there): the helper would wait
    // for the transaction this thread holds, and this thread for the helper. Refused, as the
    // blocking calls are.
    if crate::commit::Committer::in_any_group() {
        let _ = tx.send(Err(Error::Reentrant));
        return Call {
            rx: Some(rx),
            abandon: None,
        };
    }
    submit(Box::new(move || {
        let answer = f();
        if let Err(unread) = tx.send(answer)
            && let Some(abandon) = abandon
        {
            abandon(unread);
        }
    }));
    Call {
        rx: Some(rx),
        abandon,
    }
}

impl<T: Send + 'static> Future for Call<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(Err(helper_lost()));
        };
        match Pin::new(rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(answer) => {
                self.rx = None;
                Poll::Ready(answer.unwrap_or_else(|_| Err(helper_lost())))
            }
        }
    }
}

impl<T: Send + 'static> Drop for Call<T> {
    fn drop(&mut self) {
        let (Some(mut rx), Some(abandon)) = (self.rx.take(), self.abandon) else {
            return;
        };
        // From now on the helper's send fails and hands the answer to `abandon` itself; an
        // answer sent before this is taken here.
        rx.close();
        if let Ok(Some(unread)) = rx.try_recv() {
            submit(Box::new(move || abandon(unread)));
        }
    }
}

fn helper_lost() -> Error {
    Error::Io(std::io::Error::other(
        "leaseq: the async face's helper thread stopped before answering",
    ))
}
