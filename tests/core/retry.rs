//! The retry policy: a nack without an explicit backoff, an expired lease and a failing
//! `ack_with` closure wait for the policy's delay, counted from when the attempt ended (C27,
//! C28); a reopen after a crash returns leases at once.
//!
//! Adversarial tests of the "run for years" work (issue 9): the retry policy through the API.

use crate::common::{Fixture, T0_MS, assert_consistent, ms, secs};
use leaseq::{Clock, EnqueueOptions, Error, JobId, JobInfo, JobState, Queue, RetryPolicy};
use std::collections::BTreeSet;
use std::time::Duration;

fn open(f: &Fixture, retry: RetryPolicy) -> Queue {
    f.builder().retry(retry).open(&f.path).unwrap()
}

/// C27 through the public API: at attempts 1, 2, 30, 64, 310, 1,000,000 and `u32::MAX - 1`,
/// every delay is finite, within the cap, never zero, non-decreasing without jitter; with
/// jitter (added before the cap) the cap still holds; a caller's own cap holds too.
#[test]
fn c27_retry_arithmetic_at_extreme_attempts() {
    let attempts = [1u32, 2, 30, 64, 310, 1_000_000, u32::MAX - 1];
    let cap = secs(600);
    let plain = RetryPolicy::exponential(Duration::from_millis(100), cap);
    let jittered = plain.with_jitter(100);
    let mut last = 0;
    for a in attempts {
        let d = plain.delay_ms(JobId(42), a);
        assert!((1..=600_000).contains(&d), "attempt {a}: {d}");
        assert!(d >= last, "attempt {a}: {d} < {last}");
        last = d;
        for id in 1..50 {
            let j = jittered.delay_ms(JobId(id), a);
            assert!(
                j >= plain.delay_ms(JobId(id), a) && j <= 600_000,
                "attempt {a}: {j}"
            );
        }
    }
    assert_eq!(plain.delay_ms(JobId(42), 1), 100);
    assert_eq!(last, 600_000);
    let d = RetryPolicy::default();
    assert!((1_000..=1_100).contains(&d.delay_ms(JobId(1), 1)));
    assert_eq!(d.delay_ms(JobId(1), u32::MAX - 1), 3_600_000);
}

/// C28: `enq(A, lease=1h)`; `deq` at t=0; the job runs 10 minutes; `nack` with a 60 s backoff:
/// due at t=11min, not t=1min. The backoff counts from the nack, whether it comes from the
/// policy or from `nack_after`.
#[test]
fn c28_backoff_counts_from_the_nack() {
    for explicit in [false, true] {
        let f = Fixture::new();
        let q = open(&f, RetryPolicy::fixed(secs(60)));
        let a = q
            .enqueue(b"A", EnqueueOptions::default().lease(secs(3600)))
            .unwrap()
            .id();
        let l = q.dequeue().unwrap().unwrap();
        f.clock.advance(secs(600));
        let state = if explicit {
            l.nack_after("try later", secs(60)).unwrap()
        } else {
            l.nack("try later").unwrap()
        };
        assert_eq!(state, JobState::Scheduled);
        assert_eq!(q.job(a).unwrap().unwrap().run_at_ms, T0_MS + 660_000);
        f.clock.set_ms(T0_MS + 659_000);
        assert!(
            q.dequeue().unwrap().is_none(),
            "explicit={explicit}: at 10:59"
        );
        f.clock.set_ms(T0_MS + 661_000);
        let again = q.dequeue().unwrap().expect("at 11:01");
        assert_eq!((again.id(), again.attempt()), (a, 2));
    }
}

/// The default policy backs off exponentially: 1 s (up to 10 % more) after the first attempt,
/// 2 s after the second, and `nack_after(ZERO)` still gives back at once.
#[test]
fn the_default_policy_backs_off_exponentially() {
    let f = Fixture::new();
    let q = Queue::builder()
        .clock(f.clock.clone())
        .open(&f.path)
        .unwrap();
    let a = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let due_after = |q: &Queue| q.job(a).unwrap().unwrap().run_at_ms - f.clock.now_ms();
    q.dequeue().unwrap().unwrap().nack("1").unwrap();
    assert!(
        (1_000..=1_100).contains(&due_after(&q)),
        "{}",
        due_after(&q)
    );
    f.clock.advance(secs(2));
    q.dequeue().unwrap().unwrap().nack("2").unwrap();
    assert!(
        (2_000..=2_200).contains(&due_after(&q)),
        "{}",
        due_after(&q)
    );
    f.clock.advance(secs(3));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.attempt(), 3);
    assert_eq!(
        l.nack_after("now", Duration::ZERO).unwrap(),
        JobState::Ready
    );
    assert_eq!(q.dequeue().unwrap().unwrap().attempt(), 4);
}

/// An expired lease and a failing effect go through the policy too; a failing job never
/// blocks the jobs behind it.
#[test]
fn expiry_and_failing_effects_wait_for_the_policy_without_blocking_others() {
    let f = Fixture::new();
    let q = open(&f, RetryPolicy::fixed(secs(5)));
    let a = q
        .enqueue(b"A", EnqueueOptions::default().lease(secs(1)))
        .unwrap()
        .id();
    let b = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    let la = q.dequeue().unwrap().unwrap();
    assert_eq!(la.id(), a);
    f.clock.advance(Duration::from_millis(1_001));
    let lb = q.dequeue().unwrap().expect("B is served while A waits");
    assert_eq!(lb.id(), b);
    let info = q.job(a).unwrap().unwrap();
    assert_eq!(
        info.state,
        JobState::Scheduled,
        "the sweep found A's lease expired"
    );
    assert_eq!(info.run_at_ms, f.clock.now_ms() + 5_000);
    assert!(matches!(la.ack(), Err(Error::LeaseLost { .. })));
    // B's effect fails: B waits 5 s too.
    assert!(matches!(
        lb.ack_with(|_| Err("no".into())),
        Err(Error::Effect(_))
    ));
    let info = q.job(b).unwrap().unwrap();
    assert_eq!(
        (info.state, info.run_at_ms),
        (JobState::Scheduled, f.clock.now_ms() + 5_000)
    );
    assert!(q.dequeue().unwrap().is_none());
    f.clock.advance(secs(5));
    let got: Vec<JobId> = q.dequeue_batch(5).unwrap().iter().map(|l| l.id()).collect();
    assert_eq!(got, [a, b]);
    assert_consistent(&q);
}

/// A reopen after the process died returns every lease at once, whatever the policy.
#[test]
fn reopen_returns_leases_at_once_whatever_the_policy() {
    let f = Fixture::new();
    let q = open(&f, RetryPolicy::fixed(secs(3600)));
    let a = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    drop(l);
    drop(q);
    let q = open(&f, RetryPolicy::fixed(secs(3600)));
    assert_eq!(q.recovery().leases_returned, 1);
    let again = q.dequeue().unwrap().expect("ready at once");
    assert_eq!((again.id(), again.attempt()), (a, 2));
}

/// A zero or overflowing delay, a cap below the base, jitter above 100 %: `InvalidOption`
/// at open, before any file is created.
#[test]
fn bad_retry_settings_are_refused_before_anything_is_written() {
    let bad = [
        RetryPolicy::fixed(Duration::ZERO),
        RetryPolicy::exponential(Duration::ZERO, secs(1)),
        RetryPolicy::exponential(secs(10), secs(1)),
        RetryPolicy::exponential(secs(1), leaseq::DELAY_MAX + Duration::from_millis(1)),
        RetryPolicy::fixed(Duration::MAX),
        RetryPolicy::fixed(secs(1)).with_jitter(101),
    ];
    for p in bad {
        let f = Fixture::new();
        let r = f.builder().retry(p).open(&f.path);
        assert!(
            matches!(r, Err(Error::InvalidOption { field: "retry", .. })),
            "{p:?}: {r:?}"
        );
        assert!(!f.path.exists(), "{p:?}: a file was created");
    }
}

/// Every job in `state`, page by page; panics on a repeated id.
fn all_pages(q: &Queue, state: JobState, limit: usize) -> (Vec<JobInfo>, Vec<usize>) {
    let mut out: Vec<JobInfo> = Vec::new();
    let mut sizes = Vec::new();
    let mut after = None;
    loop {
        let page = q.jobs(state, after, limit).unwrap();
        sizes.push(page.jobs.len());
        out.extend(page.jobs);
        match page.next {
            Some(c) => after = Some(c),
            None => break,
        }
        assert!(sizes.len() < 100_000, "paging does not end");
    }
    let ids: BTreeSet<JobId> = out.iter().map(|j| j.id).collect();
    assert_eq!(ids.len(), out.len(), "{state:?}: a job seen twice");
    (out, sizes)
}

// ---------------------------------------------------------------------------------------
// Retry policy through the API
// ---------------------------------------------------------------------------------------

/// `RetryPolicy::fixed(d).with_jitter(p)` is accepted at open, and its docs say jitter "adds
/// up to p % to every delay ... jobs that failed together do not all retry together". But a
/// fixed policy's cap is its delay, and jitter is added before the cap: every job waits
/// exactly `d`, the jitter is silently dropped.
#[test]

fn fixed_policy_with_jitter_spreads_retries() {
    let p = RetryPolicy::fixed(secs(10)).with_jitter(50);
    let direct: BTreeSet<u64> = (1..100).map(|id| p.delay_ms(JobId(id), 1)).collect();
    let f = Fixture::new();
    let q = f.builder().retry(p).open(&f.path).unwrap();
    for i in 0..20 {
        q.enqueue(format!("{i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    let leases = q.dequeue_batch(20).unwrap();
    for l in &leases {
        assert_eq!(l.nack("fail together").unwrap(), JobState::Scheduled);
    }
    let (jobs, _) = all_pages(&q, JobState::Scheduled, 100);
    let due: BTreeSet<u64> = jobs.iter().map(|j| j.run_at_ms).collect();
    assert!(
        direct.len() > 1 && due.len() > 1,
        "jitter 50 % on a fixed 10 s policy: delay_ms gives {direct:?}, due times {due:?}"
    );
}

/// What does hold: with jitter, the cap is never exceeded through the API, and a job's due
/// time after a nack is exactly now + `delay_ms(id, attempt)`, at every attempt up to 70 with
/// the most extreme settings (base 1 ms, cap `DELAY_MAX`, jitter 100 %; cap == base).
#[test]
fn extreme_policies_through_nack_match_delay_ms_and_hold_the_cap() {
    let policies = [
        RetryPolicy::exponential(ms(1), leaseq::DELAY_MAX).with_jitter(100),
        RetryPolicy::exponential(ms(7), ms(7)).with_jitter(100),
        RetryPolicy::exponential(leaseq::DELAY_MAX, leaseq::DELAY_MAX).with_jitter(100),
        RetryPolicy::fixed(leaseq::DELAY_MAX).with_jitter(100),
        RetryPolicy::fixed(ms(1)),
    ];
    let cap_ms = |p: &RetryPolicy| p.delay_ms(JobId(1), u32::MAX);
    for p in policies {
        let f = Fixture::new();
        let q = f.builder().retry(p).max_attempts(70).open(&f.path).unwrap();
        let id = q.enqueue(b"x", EnqueueOptions::default()).unwrap().id();
        let cap = cap_ms(&p);
        for attempt in 1..70u32 {
            let l = q.dequeue().unwrap().expect("due");
            assert_eq!((l.id(), l.attempt()), (id, attempt), "{p:?}");
            let now = f.clock_now();
            assert_eq!(l.nack("again").unwrap(), JobState::Scheduled, "{p:?}");
            let info = q.job(id).unwrap().unwrap();
            let want = p.delay_ms(id, attempt);
            assert!((1..=cap).contains(&want), "{p:?} attempt {attempt}: {want}");
            assert_eq!(info.run_at_ms - now, want, "{p:?} attempt {attempt}");
            drop(l);
            f.clock.advance(ms(want));
        }
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.nack("last").unwrap(), JobState::Dead);
        assert_consistent(&q);
    }
}

/// An expired lease found by the sweep waits for the policy from the sweep; with a huge cap
/// and a clock near the end of time the due time saturates instead of wrapping.
#[test]
fn expiry_backoff_near_the_end_of_time_saturates() {
    let f = Fixture::new();
    let q = f
        .builder()
        .retry(RetryPolicy::exponential(
            leaseq::DELAY_MAX,
            leaseq::DELAY_MAX,
        ))
        .open(&f.path)
        .unwrap();
    let id = q.enqueue(b"x", EnqueueOptions::default()).unwrap().id();
    let l = q.dequeue().unwrap().unwrap();
    drop(l);
    f.clock.set_ms(u64::MAX - 10);
    assert!(q.dequeue().unwrap().is_none());
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(info.state, JobState::Scheduled);
    assert_eq!(info.run_at_ms, u64::MAX);
    assert_consistent(&q);
}
