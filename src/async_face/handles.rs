//! The async face's handles and the file's life through them: opening, named queues, the
//! `with_*` settings, close and compaction, and what the open found.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::AsyncQueue;
use crate::commit::CommitStats;
use crate::error::Result;
use crate::file::Recovery;
use crate::format::payload::Encoding;
use crate::open::Builder;
use crate::queue::Queue;
use crate::retry::RetryPolicy;

use super::offload::call;

impl AsyncQueue {
    /// The async form of [`Queue::open`]: opens (or creates) the queue file at `path` with
    /// default settings on a helper thread (an open reads and checks the file, and may
    /// replay its journal and return leases: not work for a runtime thread), and returns its
    /// async face. Dropped before it answered, the open still completes on its helper and
    /// the queue it opened is dropped there (the file closed again).
    ///
    /// # Errors
    /// As [`Builder::open`].
    pub async fn open(path: impl AsRef<Path>) -> Result<AsyncQueue> {
        AsyncQueue::open_with(&Builder::default(), path).await
    }

    /// [`AsyncQueue::open`] with `builder`'s settings (copied): the async form of
    /// [`Builder::open`].
    ///
    /// # Errors
    /// As [`Builder::open`].
    pub async fn open_with(builder: &Builder, path: impl AsRef<Path>) -> Result<AsyncQueue> {
        let (builder, path): (Builder, PathBuf) = (builder.clone(), path.as_ref().to_path_buf());
        call(move || builder.open(path))
            .await
            .map(Queue::into_async)
    }

    /// The async form of [`Queue::named`]: the queue named `name` in this file, made (in one
    /// commit on a helper) if it does not exist yet.
    ///
    /// # Errors
    /// As [`Queue::named`].
    pub async fn named(&self, name: &str) -> Result<AsyncQueue> {
        let name = name.to_string();
        self.on_helper(move |q| q.named(&name).map(Queue::into_async))
            .await
    }

    /// The async form of [`Queue::existing`]: the queue named `name` if it exists, never
    /// made (a read on a helper).
    ///
    /// # Errors
    /// As [`Queue::existing`].
    pub async fn existing(&self, name: &str) -> Result<AsyncQueue> {
        let name = name.to_string();
        self.on_helper(move |q| q.existing(&name).map(Queue::into_async))
            .await
    }

    /// [`Queue::default_queue`]: the file's default queue, with this handle's settings. No
    /// I/O.
    pub fn default_queue(&self) -> AsyncQueue {
        self.queue.default_queue().into_async()
    }

    /// [`Queue::name`]: this handle's queue name; `None` for the default queue.
    pub fn name(&self) -> Option<&str> {
        self.queue.name()
    }

    /// [`Queue::with_lease`]: this handle with another default lease (whole ms). No I/O.
    ///
    /// # Errors
    /// As [`Queue::with_lease`].
    pub fn with_lease(&self, lease: Duration) -> Result<AsyncQueue> {
        self.queue.with_lease(lease).map(Queue::into_async)
    }

    /// [`Queue::with_max_attempts`]: this handle with another default number of attempts.
    /// No I/O.
    ///
    /// # Errors
    /// As [`Queue::with_max_attempts`].
    pub fn with_max_attempts(&self, max_attempts: u32) -> Result<AsyncQueue> {
        self.queue
            .with_max_attempts(max_attempts)
            .map(Queue::into_async)
    }

    /// [`Queue::with_encoding`]: this handle with another [`Encoding`] for
    /// [`enqueue_value`](AsyncQueue::enqueue_value). No I/O.
    pub fn with_encoding(&self, encoding: Encoding) -> AsyncQueue {
        self.queue.with_encoding(encoding).into_async()
    }

    /// [`Queue::with_retry`]: this handle with another default retry policy. No I/O.
    ///
    /// # Errors
    /// As [`Queue::with_retry`].
    pub fn with_retry(&self, retry: RetryPolicy) -> Result<AsyncQueue> {
        self.queue.with_retry(retry).map(Queue::into_async)
    }

    /// [`Queue::close`]: closes the file to new work for every handle; waiting tasks wake
    /// with `Err(Closed)`. A flag and wake-ups in memory: it does not wait.
    pub fn close(&self) {
        self.queue.close();
    }

    /// [`Queue::is_closed`], read from memory.
    pub fn is_closed(&self) -> bool {
        self.queue.is_closed()
    }

    /// [`Queue::commit_stats`], read from memory.
    pub fn commit_stats(&self) -> CommitStats {
        self.queue.commit_stats()
    }

    /// [`Queue::recovery`]: what the open found, read from memory.
    pub fn recovery(&self) -> Recovery {
        self.queue.recovery()
    }

    /// [`Queue::path`]: the file's path, when opened from a path.
    pub fn path(&self) -> Option<&Path> {
        self.queue.path()
    }

    /// The async form of [`Queue::compact`], on a helper (it rewrites most of the file:
    /// seconds for hundreds of MiB). It needs the queue to itself, so it takes this handle
    /// and gives it back with the answer (also on an error: `Busy` while other handles,
    /// readers or leases of the queue are alive). Dropped before it answered, the compaction
    /// still completes on its helper, and the handle is dropped there.
    ///
    /// # Errors
    /// As [`Queue::compact`].
    pub async fn compact(self) -> (AsyncQueue, Result<bool>) {
        // Refused here rather than by the helper's call, which would drop the handle.
        if crate::commit::Committer::in_any_group() {
            return (self, Err(crate::error::Error::Reentrant));
        }
        let mut q = self.queue;
        let answer = call(move || {
            // The handle comes back whatever the compaction does: a panic (not expected:
            // redb's calls run under the engine's guard) is its answer, not the task's end.
            let compacted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| q.compact()))
                .unwrap_or_else(|p| {
                    Err(crate::error::Error::corrupted(format!(
                        "compaction panicked: {}",
                        crate::error::panic_message(&*p)
                    )))
                });
            Ok((q, compacted))
        })
        .await;
        match answer {
            Ok((q, compacted)) => (q.into_async(), compacted),
            // The task above always answers, and reentrancy was refused before it.
            Err(e) => unreachable!("a compaction's helper did not answer: {e}"),
        }
    }
}
