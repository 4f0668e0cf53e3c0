//! An async wait on a queue's wake-up ([`WakeSignal`]) with a time limit: the task is woken
//! by the queue's next notify (a commit that made work available, a close, a stop, a clock
//! jump) or when the time is up, whichever comes first. No thread waits for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_timer::Delay;

use crate::signal::WakeSignal;

pub(crate) struct SignalWait {
    signal: Arc<WakeSignal>,
    epoch: u64,
    key: Option<u64>,
    timer: Delay,
}

impl SignalWait {
    /// Waits until `signal`'s epoch moves past `epoch` or `timeout` passes.
    pub(crate) fn new(signal: Arc<WakeSignal>, epoch: u64, timeout: Duration) -> SignalWait {
        SignalWait {
            signal,
            epoch,
            key: None,
            timer: Delay::new(timeout),
        }
    }
}

impl Future for SignalWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this
            .signal
            .moved_or_register(this.epoch, &mut this.key, cx.waker())
        {
            return Poll::Ready(());
        }
        Pin::new(&mut this.timer).poll(cx)
    }
}

impl Drop for SignalWait {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.signal.unregister(key);
        }
    }
}
