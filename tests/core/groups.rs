//! Ordered groups (`EnqueueOptions::group`). Goal: the jobs of a group are delivered one at a
//! time in enqueue order while other groups flow around a busy one; a retry waiting for its
//! backoff blocks its group, a dead job does not; listings, stats, purge and recovery see
//! held jobs; bad keys are typed errors. Method: a manual clock, the public API, `check()`.

use crate::common::{Fixture, assert_consistent, ms, secs};
use leaseq::{EnqueueOptions, Error, JobId, JobState, Lease, Queue};
use std::time::Duration;

fn in_group(g: &str) -> EnqueueOptions {
    EnqueueOptions::default().group(g)
}

fn add(q: &Queue, payload: &str, opts: EnqueueOptions) -> JobId {
    q.enqueue(payload.as_bytes(), opts).unwrap().id()
}

fn payloads(leases: &[Lease]) -> Vec<String> {
    leases
        .iter()
        .map(|l| String::from_utf8(l.payload().to_vec()).unwrap())
        .collect()
}

#[test]
fn one_job_of_a_group_at_a_time_in_order_while_others_flow() {
    let f = Fixture::new();
    let q = f.open();
    for p in ["a1", "a2", "a3"] {
        add(&q, p, in_group("doc-a"));
    }
    add(&q, "b1", in_group("doc-b"));
    add(&q, "b2", in_group("doc-b"));
    add(&q, "free", EnqueueOptions::default());
    let s = q.stats().unwrap();
    assert_eq!(
        (s.total, s.ready),
        (6, 6),
        "held jobs count as ready: {s:?}"
    );
    let first = q.dequeue_batch(10).unwrap();
    assert_eq!(payloads(&first), vec!["a1", "b1", "free"]);
    assert!(q.dequeue().unwrap().is_none(), "both groups busy");
    assert_consistent(&q);
    let mut order = Vec::new();
    let mut running = first;
    while !running.is_empty() {
        for l in running.drain(..) {
            order.push(String::from_utf8(l.payload().to_vec()).unwrap());
            l.ack().unwrap();
        }
        running = q.dequeue_batch(10).unwrap();
        assert_consistent(&q);
    }
    assert_eq!(order, vec!["a1", "b1", "free", "a2", "b2", "a3"]);
    assert_eq!(q.stats().unwrap().total, 0);
}

#[test]
fn a_retry_waiting_for_its_backoff_blocks_its_group() {
    let f = Fixture::new();
    let q = f.open();
    let a1 = add(&q, "a1", in_group("g"));
    add(&q, "a2", in_group("g"));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), a1);
    l.nack_after("offline", secs(30)).unwrap();
    assert_eq!(q.job(a1).unwrap().unwrap().state, JobState::Scheduled);
    assert!(q.dequeue().unwrap().is_none(), "a2 waits behind a1's retry");
    f.clock.advance(secs(30));
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!((again.id(), again.attempt()), (a1, 2));
    again.ack().unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().payload(), b"a2");
    assert_consistent(&q);
}

#[test]
fn a_dead_job_does_not_block_its_group_and_a_requeue_goes_to_the_end() {
    let f = Fixture::new();
    let q = f.open();
    let a1 = add(&q, "a1", in_group("g").max_attempts(1));
    add(&q, "a2", in_group("g"));
    add(&q, "a3", in_group("g"));
    q.dequeue().unwrap().unwrap().fail("broken").unwrap();
    assert_eq!(q.job(a1).unwrap().unwrap().state, JobState::Dead);
    let a2 = q.dequeue().unwrap().unwrap();
    assert_eq!(a2.payload(), b"a2", "the dead one is out of the way");
    q.requeue_dead(a1).unwrap();
    assert!(q.dequeue().unwrap().is_none(), "a2 still runs");
    a2.ack().unwrap();
    let next = q.dequeue().unwrap().unwrap();
    assert_eq!(next.payload(), b"a3", "the requeued one went to the end");
    next.ack().unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().id(), a1);
    assert_consistent(&q);
}

#[test]
fn order_within_a_group_beats_priority() {
    let f = Fixture::new();
    let q = f.open();
    add(&q, "a1", in_group("g").priority(5));
    add(&q, "a2", in_group("g").priority(-5));
    add(&q, "other", EnqueueOptions::default().priority(0));
    let got = q.dequeue_batch(10).unwrap();
    // a1 is the group's head: it competes with its own priority; a2 waits.
    assert_eq!(payloads(&got), vec!["other", "a1"]);
    for l in got {
        l.ack().unwrap();
    }
    assert_eq!(q.dequeue().unwrap().unwrap().payload(), b"a2");
    assert_consistent(&q);
}

#[test]
fn a_waiting_consumer_wakes_when_the_head_ends() {
    let f = Fixture::new();
    let q = f.open();
    add(&q, "a1", in_group("g"));
    add(&q, "a2", in_group("g"));
    let head = q.dequeue().unwrap().unwrap();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || q.dequeue_timeout(Duration::from_secs(20)).unwrap())
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(!waiter.is_finished(), "a2 is held");
    head.ack().unwrap();
    let got = waiter.join().unwrap().expect("woken by the ack");
    assert_eq!(got.payload(), b"a2");
    got.ack().unwrap();
    assert_consistent(&q);
}

#[test]
fn cancel_remove_and_purge_move_the_group_on() {
    let f = Fixture::new();
    let q = f.open();
    let a1 = add(&q, "a1", in_group("g"));
    let a2 = add(&q, "a2", in_group("g"));
    add(&q, "a3", in_group("g"));
    add(&q, "a4", in_group("g"));
    let head = q.dequeue().unwrap().unwrap();
    q.cancel(a1, "user closed the document").unwrap();
    assert!(matches!(head.ack(), Err(Error::Cancelled { .. })));
    q.remove(a2).unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().payload(), b"a3");
    assert_consistent(&q);
    // Purging the ready ones takes the held one too.
    assert_eq!(q.purge(JobState::Ready).unwrap(), 1);
    assert_eq!(q.stats().unwrap().ready, 0);
    assert_consistent(&q);
}

#[test]
fn listings_show_the_held_jobs_after_the_deliverable_ones() {
    let f = Fixture::new();
    let q = f.open();
    let ids: Vec<JobId> = (0..5)
        .map(|i| add(&q, &format!("a{i}"), in_group("g")))
        .collect();
    let free = add(&q, "free", EnqueueOptions::default());
    // Page through the ready jobs two at a time.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = q.jobs(JobState::Ready, cursor, 2).unwrap();
        seen.extend(page.jobs.iter().map(|j| j.id));
        match page.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut expected = vec![ids[0], free];
    expected.extend(&ids[1..]);
    assert_eq!(seen, expected);
    assert!(q.job(ids[3]).unwrap().unwrap().group.as_deref() == Some(&b"g"[..]));
    assert_consistent(&q);
}

/// Found by a new user's trial: the held jobs were listed by id, so a job requeued to the
/// end of its group showed first. They are listed in the order the group will deliver them,
/// on every page.
#[test]
fn held_jobs_are_listed_in_the_order_their_group_delivers_them() {
    let f = Fixture::new();
    let q = f.open();
    let once = || in_group("A").max_attempts(1);
    let ids: Vec<JobId> = (1..=4).map(|i| add(&q, &format!("a{i}"), once())).collect();
    add(&q, "b1", in_group("B"));
    q.dequeue().unwrap().unwrap().fail("x").unwrap();
    q.requeue_dead(ids[0]).unwrap();
    let listed = |limit: usize| {
        let (mut out, mut cursor) = (Vec::new(), None);
        loop {
            let page = q.jobs(JobState::Ready, cursor, limit).unwrap();
            out.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(c) => cursor = Some(c),
                None => return out,
            }
        }
    };
    let all = listed(100);
    assert_eq!(listed(1), all, "the same order page by page");
    // Deliverable: A's head a2 and B's b1; then A's held ones in its order: a3, a4, a1.
    assert_eq!(&all[2..], &[ids[2], ids[3], ids[0]]);
    // And that is the order group A delivers them in.
    let mut delivered = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        if l.id() != all[0] && l.id() != all[1] && l.payload() != b"b1" {
            delivered.push(l.id());
        }
        l.ack().unwrap();
    }
    assert_eq!(delivered, &all[2..]);
    assert_consistent(&q);
}

#[test]
fn a_reopen_keeps_the_order_and_returns_the_head_first() {
    let f = Fixture::new();
    let a1;
    {
        let q = f.open();
        a1 = add(&q, "a1", in_group("g"));
        add(&q, "a2", in_group("g"));
        drop(q.dequeue().unwrap().unwrap()); // left leased
    }
    let q = f.open();
    assert_eq!(q.recovery().leases_returned, 1);
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt()), (a1, 2));
    assert!(q.dequeue().unwrap().is_none());
    l.ack().unwrap();
    assert_eq!(q.dequeue().unwrap().unwrap().payload(), b"a2");
    assert_consistent(&q);
}

#[test]
fn bad_group_keys_are_typed_errors_that_write_nothing() {
    let f = Fixture::new();
    let q = f.open();
    let long = vec![b'g'; leaseq::KEY_BYTES_MAX + 1];
    match q.enqueue(b"x", EnqueueOptions::default().group(&long)) {
        Err(Error::KeyTooLong { field, .. }) => assert_eq!(field, "group"),
        other => panic!("{other:?}"),
    }
    match q.enqueue(b"x", EnqueueOptions::default().group("")) {
        Err(Error::InvalidOption { field, .. }) => assert_eq!(field, "group"),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.stats().unwrap().total, 0);
    q.enqueue(
        b"x",
        EnqueueOptions::default().group(vec![b'g'; leaseq::KEY_BYTES_MAX]),
    )
    .unwrap();
    assert_consistent(&q);
}

#[test]
fn a_pool_keeps_each_group_in_order() {
    let f = Fixture::new();
    let q = f.open();
    for i in 0..20 {
        for g in ["a", "b", "c"] {
            add(&q, &format!("{g}{i:02}"), in_group(g));
        }
    }
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let running = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let pool = {
        let (seen, running) = (seen.clone(), running.clone());
        leaseq::WorkerPool::builder(&q)
            .threads(4)
            .start(move |lease: &Lease| {
                let p = String::from_utf8(lease.payload().to_vec()).unwrap();
                let g = p[..1].to_string();
                assert!(
                    running.lock().unwrap().insert(g.clone()),
                    "two of {g} at once"
                );
                std::thread::sleep(Duration::from_millis(2));
                seen.lock().unwrap().push(p);
                running.lock().unwrap().remove(&g);
                Ok(())
            })
            .unwrap()
    };
    assert!(crate::common::eventually(
        || seen.lock().unwrap().len() == 60
    ));
    let report = pool.shutdown(Duration::from_secs(5));
    assert_eq!(
        (report.stats.acked, report.stats.panics),
        (60, 0),
        "{report:?}"
    );
    let seen = seen.lock().unwrap().clone();
    for g in ["a", "b", "c"] {
        let mine: Vec<&String> = seen.iter().filter(|p| p.starts_with(g)).collect();
        let mut sorted = mine.clone();
        sorted.sort();
        assert_eq!(mine, sorted, "group {g} out of order");
    }
    assert_consistent(&q);
}

/// `Reader::held_behind` names the head a ready member waits behind, and nothing for a job
/// that is not held: the head itself, a member of another group, a job with no group, a
/// scheduled member, a job not there.
#[test]
fn held_behind_names_the_head_a_ready_member_waits_for() {
    let f = Fixture::new();
    let q = f.open();
    let a1 = add(&q, "a1", in_group("doc-a"));
    let a2 = add(&q, "a2", in_group("doc-a"));
    let a3 = add(&q, "a3", in_group("doc-a"));
    let b1 = add(&q, "b1", in_group("doc-b"));
    let free = add(&q, "free", EnqueueOptions::default());
    let later = add(&q, "later", in_group("doc-c").delay(secs(60)));
    let r = q.reader();
    assert_eq!(r.held_behind(a1).unwrap(), None, "the head is not held");
    assert_eq!(r.held_behind(a2).unwrap(), Some(a1));
    assert_eq!(r.held_behind(a3).unwrap(), Some(a1));
    assert_eq!(r.held_behind(b1).unwrap(), None);
    assert_eq!(r.held_behind(free).unwrap(), None);
    assert_eq!(r.held_behind(later).unwrap(), None, "scheduled, not ready");
    assert_eq!(r.held_behind(JobId(999_999)).unwrap(), None);
    // The head leased: the others still wait behind it; acked, the next is the head.
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(lease.id(), a1);
    assert_eq!(r.held_behind(a2).unwrap(), Some(a1));
    lease.ack().unwrap();
    assert_eq!(r.held_behind(a2).unwrap(), None);
    assert_eq!(r.held_behind(a3).unwrap(), Some(a2));
    assert_consistent(&q);
}

/// Found by a new user (2026-12-04): cancelling the running head of a group let the next job
/// out at once, so a slow worker's cancelled job was applied after its successor. The group
/// now waits for the cancelled delivery to end: its worker's ending call (answered
/// `Cancelled`), its lease's deadline, or the next open.
#[test]
fn a_cancelled_running_job_holds_its_group_until_its_delivery_ends() {
    let f = Fixture::new();
    // Each way the cancelled delivery can end, in its own group, with a history kept in
    // half the runs (the cancelled row stays either way while it fences its lease).
    for keep in [false, true] {
        let q = f.open();
        if keep {
            q.set_history(leaseq::History::off().keep_jobs(100))
                .unwrap();
        }
        let ways = ["ack", "nack", "snooze", "fail", "ack_with", "deadline"];
        let mut heads = Vec::new();
        for way in ways {
            add(&q, &format!("{way}-1"), in_group(way));
            add(&q, &format!("{way}-2"), in_group(way));
        }
        for _ in ways {
            let l = q.dequeue().unwrap().unwrap();
            q.cancel(l.id(), "the user deleted it").unwrap();
            heads.push(l);
        }
        assert_consistent(&q);
        assert!(
            q.dequeue().unwrap().is_none(),
            "every group waits for its cancelled delivery"
        );
        // A new job of a waiting group waits too.
        add(&q, "ack-3", in_group("ack"));
        assert!(q.dequeue().unwrap().is_none());
        assert_eq!(
            q.stats().unwrap().ready,
            7,
            "held jobs still count as ready"
        );
        assert_consistent(&q);
        let mut deadline = None;
        for l in heads {
            let way = String::from_utf8(l.payload().to_vec()).unwrap();
            let way = way.trim_end_matches("-1").to_string();
            let r = match way.as_str() {
                "ack" => l.ack(),
                "nack" => l.nack("x").map(drop),
                "snooze" => l.snooze(secs(1)),
                "fail" => l.fail("x"),
                "ack_with" => l.ack_with(|_| Ok(())).map(drop),
                _ => {
                    deadline = Some(l);
                    continue;
                }
            };
            assert!(matches!(r, Err(Error::Cancelled { .. })), "{way}: {r:?}");
            let next = q.dequeue().unwrap().expect("the group goes on");
            assert_eq!(next.payload(), format!("{way}-2").as_bytes());
            next.ack().unwrap();
            if way == "ack" {
                // The job that came while the group waited is next.
                let last = q.dequeue().unwrap().expect("ack-3");
                assert_eq!(last.payload(), b"ack-3");
                last.ack().unwrap();
            }
            assert_consistent(&q);
        }
        // An extend or a progress report is not the end of the delivery (an extend moves
        // the deadline the group waits for, as it would have moved the lease's).
        let l = deadline.unwrap();
        assert!(matches!(l.extend(secs(60)), Err(Error::Cancelled { .. })));
        assert!(q.dequeue().unwrap().is_none(), "still running");
        f.clock.advance(secs(60) - Duration::from_millis(1));
        assert!(q.dequeue().unwrap().is_none(), "one ms before the deadline");
        f.clock.advance(Duration::from_millis(1));
        let next = q.dequeue().unwrap().expect("the lease ran out");
        assert_eq!(next.payload(), b"deadline-2");
        next.ack().unwrap();
        assert!(q.dequeue().unwrap().is_none());
        assert!(matches!(
            l.ack(),
            Err(Error::Cancelled { .. }) | Err(Error::LeaseLost { .. })
        ));
        assert_consistent(&q);
        q.close();
    }
}

/// A blocked consumer wakes when a cancelled delivery's lease runs out, as at an expired one.
#[test]
fn a_waiting_consumer_wakes_when_the_cancelled_delivery_runs_out() {
    let f = Fixture::new();
    let q = Queue::builder()
        .lease(Duration::from_millis(300))
        .open(&f.path)
        .unwrap();
    add(&q, "a1", in_group("g"));
    add(&q, "a2", in_group("g"));
    let head = q.dequeue().unwrap().unwrap();
    q.cancel(head.id(), "stop").unwrap();
    let t = std::time::Instant::now();
    let got = q
        .dequeue_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("a2 once a1's lease ran out");
    assert_eq!(got.payload(), b"a2");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    got.ack().unwrap();
    assert_consistent(&q);
}

/// The worker of a cancelled delivery dies with its process: the next open lets its group go
/// on. A retry or remove of the cancelled job is refused while its worker may run; once it
/// reported back, a retry puts it at the end of its group.
#[test]
fn reopen_and_retry_end_a_cancelled_delivery_wait() {
    let f = Fixture::new();
    {
        let q = f.open();
        add(&q, "a1", in_group("g"));
        add(&q, "a2", in_group("g"));
        let l = q.dequeue().unwrap().unwrap();
        q.cancel(l.id(), "stop").unwrap();
        assert!(q.dequeue().unwrap().is_none());
        drop(l);
        q.close();
    }
    let q = f.open();
    assert_consistent(&q);
    let next = q
        .dequeue()
        .unwrap()
        .expect("the process that ran a1 is gone");
    assert_eq!(next.payload(), b"a2");
    next.ack().unwrap();

    q.set_history(leaseq::History::off().keep_jobs(100))
        .unwrap();
    let b1 = add(&q, "b1", in_group("h"));
    add(&q, "b2", in_group("h"));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), b1);
    q.cancel(b1, "stop").unwrap();
    assert!(q.dequeue().unwrap().is_none());
    for r in [q.retry(b1), q.remove(b1)] {
        assert!(
            matches!(
                r,
                Err(Error::InvalidState {
                    actual: JobState::Cancelled,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    // A purge takes the cancelled rows that fence nothing (a1's, kept to its deadline) and
    // leaves this one.
    assert_eq!(q.purge(JobState::Cancelled).unwrap(), 1);
    assert_eq!(q.job(b1).unwrap().unwrap().state, JobState::Cancelled);
    assert!(q.dequeue().unwrap().is_none());
    assert!(matches!(l.ack(), Err(Error::Cancelled { .. })));
    q.retry(b1).unwrap();
    assert_consistent(&q);
    let order: Vec<Vec<u8>> = (0..2)
        .map(|_| {
            let l = q.dequeue().unwrap().expect("next");
            l.ack().unwrap();
            l.payload().to_vec()
        })
        .collect();
    assert_eq!(order, vec![b"b2".to_vec(), b"b1".to_vec()]);
    assert_consistent(&q);
}

/// Found by review: the group waits for the delivery that was cancelled, not for any
/// delivery of the job. An older delivery's worker (its lease expired, the job delivered
/// again) reporting back changes nothing; an extend answered `Cancelled` keeps the lease able
/// to report its end.
#[test]
fn only_the_cancelled_delivery_ends_its_groups_wait() {
    let f = Fixture::new();
    let q = f.open();
    add(&q, "a1", in_group("g"));
    add(&q, "a2", in_group("g"));
    let old = q.dequeue().unwrap().unwrap();
    f.clock.advance(crate::common::LEASE);
    let current = q.dequeue().unwrap().expect("a1 again, its lease ran out");
    assert_eq!(current.id(), old.id());
    q.cancel(current.id(), "stop").unwrap();
    assert!(matches!(
        old.ack(),
        Err(Error::Cancelled { .. }) | Err(Error::LeaseLost { .. })
    ));
    assert!(
        q.dequeue().unwrap().is_none(),
        "the current worker still runs"
    );
    assert!(matches!(
        current.extend(secs(10)),
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        current.set_progress(b"half"),
        Err(Error::Cancelled { .. })
    ));
    assert!(q.dequeue().unwrap().is_none());
    assert!(matches!(current.ack(), Err(Error::Cancelled { .. })));
    let next = q.dequeue().unwrap().expect("the cancelled delivery ended");
    assert_eq!(next.payload(), b"a2");
    next.ack().unwrap();
    assert_consistent(&q);
}

/// A cancelled delivery's worker that extends its lease (answered `Cancelled`) keeps its
/// group waiting past the deadline the lease had at the cancel, as the lease would have; an
/// extend that would shorten the wait changes nothing.
#[test]
fn a_cancelled_workers_extends_keep_its_group_waiting() {
    let f = Fixture::new();
    let q = f.open();
    add(&q, "a1", in_group("g"));
    add(&q, "a2", in_group("g"));
    let running = q.dequeue().unwrap().unwrap();
    let lease_ms = running.deadline_ms() - f.clock_now();
    q.cancel(running.id(), "stop").unwrap();
    f.clock.advance(Duration::from_millis(lease_ms - 1));
    assert!(matches!(
        running.extend(Duration::from_millis(lease_ms)),
        Err(Error::Cancelled { .. })
    ));
    // A heartbeat of the same lease moves it too, and never shortens it.
    let beat = running.heartbeat();
    assert!(matches!(beat.extend(ms(1)), Err(Error::Cancelled { .. })));
    assert_consistent(&q);
    f.clock.advance(Duration::from_millis(lease_ms - 1));
    assert!(
        q.dequeue().unwrap().is_none(),
        "past the cancel's deadline, within the extended one"
    );
    assert_eq!(
        q.job(running.id()).unwrap().unwrap().state,
        JobState::Cancelled
    );
    f.clock.advance(ms(1));
    let next = q.dequeue().unwrap().expect("the extended deadline passed");
    assert_eq!(next.payload(), b"a2");
    assert!(matches!(
        running.ack(),
        Err(Error::Cancelled { .. }) | Err(Error::LeaseLost { .. })
    ));
    next.ack().unwrap();
    assert_consistent(&q);
}

/// The new user's case: a pool's handler of a group's head, cancelled, runs past the deadline
/// its lease had at the cancel. Its heartbeats go on (answered `Cancelled`), so the group's
/// next job does not start until it returns.
#[test]
fn a_pools_cancelled_handler_holds_its_group_until_it_returns() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};
    let f = Fixture::new();
    let q = f.open();
    let a = add(&q, "a", in_group("doc"));
    add(&q, "b", in_group("doc"));
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(parking_lot::Mutex::new(release_rx));
    let b_started = Arc::new(AtomicBool::new(false));
    let pool = {
        let b_started = Arc::clone(&b_started);
        let started_tx = parking_lot::Mutex::new(started_tx);
        leaseq::WorkerPool::builder(&q)
            .threads(2)
            .heartbeat_every(ms(20))
            .start(move |l| {
                if l.payload() == b"a" {
                    started_tx.lock().send(()).unwrap();
                    release_rx.lock().recv().unwrap();
                } else {
                    b_started.store(true, Ordering::SeqCst);
                }
                Ok(())
            })
            .unwrap()
    };
    started_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    q.cancel(a, "user deleted the document").unwrap();
    // Three times the lease in all, a third at a time, with time for several beats each.
    for _ in 0..9 {
        f.clock.advance(crate::common::LEASE / 3);
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            !b_started.load(Ordering::SeqCst),
            "b ran beside the cancelled a"
        );
    }
    release_tx.send(()).unwrap();
    assert!(crate::common::eventually(
        || b_started.load(Ordering::SeqCst)
    ));
    let report = pool.shutdown(Duration::from_secs(10));
    assert_eq!(
        (
            report.stats.cancelled,
            report.stats.lost,
            report.stats.acked
        ),
        (1, 0, 1),
        "{report:?}"
    );
    assert_consistent(&q);
}
