//! Queue size limits (`Queue::set_limit`). Goal: an enqueue into a full queue is refused
//! with nothing written, waits for room, or drops the oldest waiting jobs (never a leased or
//! held one), as its limit says; batches fit whole or not at all; the outbox and schedules
//! honour the limit; the payload bytes counted match the jobs through every change (`check()`
//! verifies the count); the limit survives a reopen. Method: the public API, a manual clock.

use crate::common::{Fixture, assert_consistent, enqueue_n, plain, secs};
use leaseq::{EnqueueOptions, Enqueued, Error, Event, JobState, QueueLimit, WhenFull};
use std::time::{Duration, Instant};

fn full(e: leaseq::Result<impl std::fmt::Debug>) -> (u64, u64, u64) {
    match e {
        Err(Error::QueueFull {
            jobs,
            bytes,
            needs_jobs,
            ..
        }) => (jobs, bytes, needs_jobs),
        other => panic!("expected QueueFull, got {other:?}"),
    }
}

#[test]
fn a_full_queue_refuses_and_writes_nothing_then_takes_again_once_a_job_ends() {
    let f = Fixture::new();
    let q = f.open();
    assert!(q.set_limit(Some(QueueLimit::jobs(3))).unwrap());
    assert!(
        !q.set_limit(Some(QueueLimit::jobs(3))).unwrap(),
        "the same limit"
    );
    assert_eq!(q.limit().unwrap(), Some(QueueLimit::jobs(3)));
    enqueue_n(&q, 3, plain());
    let before = q.stats().unwrap();
    assert_eq!(full(q.enqueue(b"four", plain())), (3, 15, 1));
    // A batch that does not fit whole adds nothing.
    q.remove(q.jobs(JobState::Ready, None, 1).unwrap().jobs[0].id)
        .unwrap();
    let batch = q.enqueue_batch([(&b"a"[..], plain()), (&b"b"[..], plain())]);
    assert_eq!(full(batch).2, 2);
    assert_eq!(q.stats().unwrap().ready, 2);
    q.enqueue(b"fits", plain()).unwrap();
    let after = q.stats().unwrap();
    assert_eq!(after.ready, before.ready);
    assert_eq!(after.dropped, 0);
    // A leased job counts; its end makes room.
    let lease = q.dequeue().unwrap().unwrap();
    assert!(matches!(
        q.enqueue(b"x", plain()),
        Err(Error::QueueFull { .. })
    ));
    lease.ack().unwrap();
    q.enqueue(b"x", plain()).unwrap();
    // A duplicate of a held key adds no job: answered as ever, even when full.
    q.remove(q.jobs(JobState::Ready, None, 1).unwrap().jobs[0].id)
        .unwrap();
    let held = q.enqueue(b"k", plain().dedup_key("k")).unwrap();
    assert!(matches!(held, Enqueued::New(_)));
    assert!(matches!(
        q.enqueue(b"k2", plain().dedup_key("k")).unwrap(),
        Enqueued::Duplicate(_)
    ));
    assert_consistent(&q);
}

#[test]
fn payload_bytes_are_counted_through_every_change_and_bound_enqueues() {
    let f = Fixture::new();
    let q = f.open();
    // Jobs before the limit are counted when it is set: 10 + 2000 (stored apart).
    q.enqueue(&[1; 10], plain()).unwrap();
    q.enqueue(&[2; 2000], plain()).unwrap();
    q.set_limit(Some(QueueLimit::bytes(5000))).unwrap();
    assert_eq!(q.stats().unwrap().payload_bytes, Some(2010));
    let (_, bytes, _) = full(q.enqueue(&[3; 3000], plain()));
    assert_eq!(bytes, 2010);
    q.enqueue(&[3; 2990], plain()).unwrap();
    assert_eq!(q.stats().unwrap().payload_bytes, Some(5000));
    assert_consistent(&q);
    // Dequeue (one and a batch), nack, fail to dead, requeue, ack in a batch, cancel,
    // update, remove: each keeps the count right (check() compares it with the jobs).
    let one = q.dequeue().unwrap().unwrap();
    one.nack("again").unwrap();
    assert_consistent(&q);
    let batch = q.dequeue_batch(10).unwrap();
    assert_eq!(batch.len(), 3);
    assert_consistent(&q);
    batch[0].fail("broken").unwrap();
    assert_consistent(&q);
    let dead = q.jobs(JobState::Dead, None, 10).unwrap().jobs[0].id;
    q.requeue_dead(dead).unwrap();
    assert_consistent(&q);
    for r in q.ack_batch(&batch[1..]).unwrap() {
        r.unwrap();
    }
    assert_consistent(&q);
    let left = q.stats().unwrap();
    assert_eq!(left.pending(), 1);
    let id = q.jobs(JobState::Ready, None, 1).unwrap().jobs[0].id;
    let len = q.payload(id).unwrap().unwrap().len() as u64;
    assert_eq!(left.payload_bytes, Some(len));
    q.update_payload(id, &[9; 4000]).unwrap();
    assert_eq!(q.stats().unwrap().payload_bytes, Some(4000));
    assert_consistent(&q);
    q.enqueue(&[7; 500], plain().delay(secs(60))).unwrap();
    q.cancel(id, "not needed").unwrap();
    assert_eq!(q.stats().unwrap().payload_bytes, Some(500));
    assert_consistent(&q);
    f.clock.advance(secs(61));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.payload().len(), 500);
    drop(l);
    assert_consistent(&q);
    // The lease expires and comes back: still counted once.
    f.clock.advance(secs(3600));
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(q.stats().unwrap().payload_bytes, Some(500));
    l.ack().unwrap();
    assert_eq!(q.stats().unwrap().payload_bytes, Some(0));
    assert_consistent(&q);
    // Removing the limit forgets the count; setting one again counts afresh.
    q.enqueue(&[1; 5], plain()).unwrap();
    assert!(q.set_limit(None).unwrap());
    assert_eq!(q.stats().unwrap().payload_bytes, None);
    q.enqueue(&[1; 6], plain()).unwrap();
    q.set_limit(Some(QueueLimit::bytes(100))).unwrap();
    assert_eq!(q.stats().unwrap().payload_bytes, Some(11));
    assert_consistent(&q);
}

#[test]
fn drop_oldest_drops_the_priority_served_last_first_never_a_leased_or_held_job() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events().unwrap();
    q.set_limit(Some(QueueLimit::jobs(4).when_full(WhenFull::DropOldest)))
        .unwrap();
    // Lower priority values are served first: -5 before 0.
    let urgent = q.enqueue(b"urgent", plain().priority(-5)).unwrap();
    let old = q.enqueue(b"old", plain()).unwrap();
    let later = q.enqueue(b"later", plain().delay(secs(60))).unwrap();
    let newer = q.enqueue(b"newer", plain()).unwrap();
    // Full: the next enqueue drops `old` (the priority served last, first in line), then
    // `newer`, then `urgent` (first in line of what is ready); the scheduled `later` only
    // once no ready job is left.
    q.enqueue(b"n1", plain().priority(-5)).unwrap();
    let ids = |e: &Enqueued| match e {
        Enqueued::New(id) => *id,
        other => panic!("{other:?}"),
    };
    assert!(q.job(ids(&old)).unwrap().is_none(), "old dropped");
    q.enqueue(b"n2", plain().priority(-5)).unwrap();
    assert!(q.job(ids(&newer)).unwrap().is_none(), "newer dropped");
    q.enqueue(b"n3", plain().priority(-5)).unwrap();
    assert!(q.job(ids(&urgent)).unwrap().is_none(), "urgent next");
    assert!(
        q.job(ids(&later)).unwrap().is_some(),
        "scheduled jobs go after ready ones"
    );
    let stats = q.stats().unwrap();
    assert_eq!((stats.dropped, stats.pending()), (3, 4));
    let mut dropped = Vec::new();
    while let Some(e) = events.try_recv() {
        if let Event::Dropped { id } = e {
            dropped.push(id);
        }
    }
    assert_eq!(dropped, vec![ids(&old), ids(&newer), ids(&urgent)]);
    let minute = q.metrics(0).unwrap();
    assert_eq!(minute.iter().map(|m| m.dropped).sum::<u64>(), 3);
    // Leased jobs are never dropped: with all four leased, an enqueue is refused.
    f.clock.advance(secs(61));
    let leases = q.dequeue_batch(4).unwrap();
    assert_eq!(leases.len(), 4);
    assert!(matches!(
        q.enqueue(b"n4", plain()),
        Err(Error::QueueFull { .. })
    ));
    assert_eq!(q.stats().unwrap().dropped, 3, "a refusal drops nothing");
    for l in leases {
        l.ack().unwrap();
    }
    // Held group members are not dropped either: the head leased, three held behind it.
    for i in 0..4u8 {
        q.enqueue(&[i], plain().group("g")).unwrap();
    }
    let head = q.dequeue().unwrap().unwrap();
    assert_eq!(head.payload(), &[0]);
    assert!(matches!(
        q.enqueue(b"n5", plain()),
        Err(Error::QueueFull { .. })
    ));
    head.ack().unwrap();
    q.enqueue(b"n5", plain()).unwrap();
    assert_eq!(q.stats().unwrap().dropped, 3, "room was left by the ack");
    // The next member became ready (the group's head), first in line: it is the one
    // dropped; the members held behind it are not.
    q.enqueue(b"n6", plain()).unwrap();
    assert_eq!(q.stats().unwrap().dropped, 4);
    let left: Vec<Vec<u8>> = q
        .jobs(JobState::Ready, None, 10)
        .unwrap()
        .jobs
        .into_iter()
        .map(|j| q.payload(j.id).unwrap().unwrap())
        .collect();
    assert!(!left.contains(&vec![1]), "{left:?}");
    // [2] is its group's head now, in line by its place; [3] waits behind it.
    assert_eq!(left, vec![vec![2], b"n5".to_vec(), b"n6".to_vec(), vec![3]]);
    assert_consistent(&q);
}

#[test]
fn a_batch_larger_than_the_limit_is_refused_even_when_dropping() {
    let f = Fixture::new();
    let q = f.open();
    q.set_limit(Some(QueueLimit::jobs(2).when_full(WhenFull::DropOldest)))
        .unwrap();
    enqueue_n(&q, 2, plain());
    let three = [
        (&b"a"[..], plain()),
        (&b"b"[..], plain()),
        (&b"c"[..], plain()),
    ];
    assert!(matches!(
        q.enqueue_batch(three),
        Err(Error::QueueFull { .. })
    ));
    let stats = q.stats().unwrap();
    assert_eq!((stats.ready, stats.dropped), (2, 0));
    // Two fit by dropping both.
    q.enqueue_batch([(&b"a"[..], plain()), (&b"b"[..], plain())])
        .unwrap();
    assert_eq!(q.stats().unwrap().dropped, 2);
    assert_consistent(&q);
}

#[test]
fn a_blocked_producer_waits_for_room_or_gives_up_after_its_wait() {
    let f = Fixture::new();
    let q = f.open();
    q.set_limit(Some(
        QueueLimit::jobs(1).when_full(WhenFull::block(Duration::from_secs(30))),
    ))
    .unwrap();
    q.enqueue(b"first", plain()).unwrap();
    let producer = {
        let q = q.clone();
        std::thread::spawn(move || q.enqueue(b"second", plain()))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!producer.is_finished(), "it waits while the queue is full");
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert!(matches!(producer.join().unwrap(), Ok(Enqueued::New(_))));
    assert_eq!(
        q.dequeue().unwrap().unwrap().payload(),
        b"second",
        "the waiting job was added once room was made"
    );
    // A short wait ends in QueueFull, nothing added.
    q.set_limit(Some(
        QueueLimit::jobs(1).when_full(WhenFull::Block { wait_ms: 100 }),
    ))
    .unwrap();
    let started = Instant::now();
    assert!(matches!(
        q.enqueue(b"third", plain()),
        Err(Error::QueueFull { .. })
    ));
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(q.stats().unwrap().pending(), 1);
    assert_consistent(&q);
}

#[test]
fn the_outbox_is_refused_inside_its_transaction_and_nothing_of_it_commits_if_it_gives_up() {
    let f = Fixture::new();
    let q = f.open();
    q.set_limit(Some(
        QueueLimit::jobs(1).when_full(WhenFull::block(Duration::from_secs(60))),
    ))
    .unwrap();
    q.enqueue(b"one", plain()).unwrap();
    let started = Instant::now();
    let out = q.write(|tx| {
        // No waiting inside a transaction: refused at once.
        match tx.enqueue(b"two", EnqueueOptions::default()) {
            Err(Error::QueueFull { .. }) => Ok("refused"),
            other => panic!("{other:?}"),
        }
    });
    assert_eq!(out.unwrap(), "refused");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(q.stats().unwrap().pending(), 1);
    assert_consistent(&q);
}

#[test]
fn a_schedule_due_into_a_full_queue_skips_its_due_time() {
    let f = Fixture::new();
    let q = f.open();
    q.create_schedule(
        "tick",
        &leaseq::Schedule::every(secs(60)).starting_at_ms(f.clock_now() + 60_000),
    )
    .unwrap();
    q.set_limit(Some(QueueLimit::jobs(1))).unwrap();
    q.enqueue(b"fills it", plain()).unwrap();
    f.clock.advance(secs(60));
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(lease.payload(), b"fills it");
    let info = q.schedule("tick").unwrap().unwrap();
    assert_eq!((info.fired, info.skipped), (0, 1));
    // Running, the job still counts: the trigger is refused too.
    assert!(matches!(
        q.trigger_schedule("tick"),
        Err(Error::QueueFull { .. })
    ));
    lease.ack().unwrap();
    q.trigger_schedule("tick").unwrap();
    assert_eq!(q.schedule("tick").unwrap().unwrap().fired, 1);
    assert_consistent(&q);
}

#[test]
fn the_limit_and_the_counts_survive_a_reopen_and_bad_limits_write_nothing() {
    let f = Fixture::new();
    let limit = QueueLimit::jobs(10)
        .and_bytes(1 << 20)
        .when_full(WhenFull::DropOldest);
    {
        let q = f.open();
        let named = q.named("telemetry").unwrap();
        named.set_limit(Some(limit)).unwrap();
        named.enqueue(&[0; 100], plain()).unwrap();
        for bad in [
            QueueLimit {
                max_jobs: None,
                max_bytes: None,
                when_full: WhenFull::Refuse,
            },
            QueueLimit::jobs(0),
            QueueLimit::bytes(0),
            QueueLimit::jobs(1).when_full(WhenFull::Block { wait_ms: 0 }),
            QueueLimit::jobs(1).when_full(WhenFull::Block { wait_ms: 3_600_001 }),
        ] {
            assert!(
                matches!(named.set_limit(Some(bad)), Err(Error::InvalidOption { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(q.limit().unwrap(), None, "the default queue has none");
        q.close();
    }
    let q = f.open();
    let named = q.existing("telemetry").unwrap();
    assert_eq!(named.limit().unwrap(), Some(limit));
    assert_eq!(named.stats().unwrap().payload_bytes, Some(100));
    assert_eq!(q.reader().limit().unwrap(), None);
    assert_consistent(&q);
}

/// `Builder::dead_jobs_max`: a queue keeps at most that many dead jobs, the oldest deleted
/// (with their dedup keys) by the next dequeue's sweep and by `prune`; 0 is refused at open.
#[test]
fn dead_jobs_over_their_count_go_oldest_first() {
    let f = Fixture::new();
    let q = f.builder().dead_jobs_max(Some(3)).open(&f.path).unwrap();
    let mut died = Vec::new();
    for i in 0..5u8 {
        let id = q
            .enqueue(&[i], plain().dedup_key(format!("k{i}")))
            .unwrap()
            .id();
        died.push(id);
    }
    // Taken in one dequeue, then failed one a second: they die in order.
    for lease in q.dequeue_batch(5).unwrap() {
        lease.fail("broken").unwrap();
        f.clock.advance(secs(1));
    }
    assert_eq!(
        q.stats().unwrap().dead,
        5,
        "deaths are not pruned by the fail itself"
    );
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().dead, 3);
    for (i, id) in died.iter().enumerate() {
        assert_eq!(q.job(*id).unwrap().is_some(), i >= 2, "job {i}");
    }
    // The deleted jobs' dedup keys are free again; the kept ones' are not.
    assert!(matches!(
        q.enqueue(b"again", plain().dedup_key("k0")).unwrap(),
        Enqueued::New(_)
    ));
    assert!(matches!(
        q.enqueue(b"again", plain().dedup_key("k4")).unwrap(),
        Enqueued::DuplicateDead(_)
    ));
    // prune does the same without a dequeue.
    q.dequeue().unwrap().unwrap().fail("broken").unwrap();
    assert_eq!(q.stats().unwrap().dead, 4);
    assert_eq!(q.prune().unwrap().dead, 1);
    assert_eq!(q.stats().unwrap().dead, 3);
    assert_consistent(&q);
    drop(q);
    assert!(matches!(
        f.builder().dead_jobs_max(Some(0)).open(&f.path),
        Err(Error::InvalidOption { field, .. }) if field == "dead_jobs_max"
    ));
    // None keeps them all.
    let q = f.builder().dead_jobs_max(None).open(&f.path).unwrap();
    q.enqueue(b"one more", plain()).unwrap();
    q.dequeue().unwrap().unwrap().fail("broken").unwrap();
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().dead, 4);
}

/// The child of [`a_crash_loop_leaves_at_most_one_dead_instance_per_schedule`]: opens the
/// file, takes the schedule's instance (waiting for its due time) and is killed holding it.
#[test]
fn child_entry_crash_loop() {
    let Some((_, path)) = crate::common::child_scenario() else {
        return; // Only meaningful when re-executed by the parent test.
    };
    let q = leaseq::Queue::open(&path).unwrap();
    match q.dequeue_timeout(Duration::from_secs(30)).unwrap() {
        Some(lease) => {
            crate::common::say(format!("LEASED {} {}", lease.id().0, lease.attempt()));
            std::mem::forget(lease);
        }
        None => crate::common::say("NONE"),
    }
    crate::common::ready_to_die()
}

/// An app killed again and again while it runs a schedule's instance (each kill spends an
/// attempt; the open after the last one dead-letters the instance) keeps at most one dead
/// instance of the schedule: each new instance replaces a dead last one.
#[test]
fn a_crash_loop_leaves_at_most_one_dead_instance_per_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    {
        let q = leaseq::Queue::open(&path).unwrap();
        q.create_schedule(
            "tick",
            &leaseq::Schedule::every(Duration::from_millis(200))
                .options(EnqueueOptions::default().max_attempts(2)),
        )
        .unwrap();
    }
    let (mut dead_lettered, mut leased) = (0, Vec::new());
    for _ in 0..8 {
        let mut child =
            crate::common::ChildProc::spawn("queue_limits::child_entry_crash_loop", "loop", &path);
        let said = child.until_ready();
        child.kill();
        assert!(said[0].starts_with("LEASED "), "{said:?}");
        leased.push(said[0].clone());
        // The parent's open returns the lease, or dead-letters it at its last attempt.
        let q = leaseq::Queue::open(&path).unwrap();
        dead_lettered += q.recovery().leases_dead_lettered;
        let stats = q.stats().unwrap();
        assert!(stats.dead <= 1, "{} dead after {leased:?}", stats.dead);
        assert_consistent(&q);
    }
    // Two kills per instance: four instances died; at most the last is left (this open
    // may fire a due time that passed, whose new instance replaces it).
    assert_eq!(dead_lettered, 4, "{leased:?}");
    let q = leaseq::Queue::open(&path).unwrap();
    assert!(q.stats().unwrap().dead <= 1);
    assert!(q.schedule("tick").unwrap().unwrap().fired >= 4);
}

/// The child of [`a_killed_producer_never_leaves_a_queue_over_its_limit_or_a_job_lost`]:
/// enqueues into the limited queue as fast as it can, acking now and then, saying each
/// enqueue and ack after it returned, until it is killed.
#[test]
fn child_entry_limit_kill() {
    let Some((scenario, path)) = crate::common::child_scenario() else {
        return; // Only meaningful when re-executed by the parent test.
    };
    let round: u64 = scenario.parse().unwrap();
    let q = leaseq::Queue::open(&path).unwrap();
    crate::common::say("READY");
    for i in 0u64.. {
        let size = 1 + (i * 7919 + round) % 300;
        let payload = vec![b'x'; size as usize];
        match q.enqueue(&payload, plain()) {
            Ok(e) => crate::common::say(format!("E {}", e.id().0)),
            Err(e) => panic!("{e}"),
        }
        if i % 3 == 0
            && let Some(lease) = q.dequeue().unwrap()
        {
            let id = lease.id().0;
            crate::common::say(format!("T {id}"));
            lease.ack().unwrap();
            crate::common::say(format!("A {id}"));
        }
    }
}

/// SIGKILLed producers of a queue limited to 40 jobs and 4,000 payload bytes that drops the
/// oldest: after every kill the queue is within its limit, `check()` agrees with the bytes
/// count, every job the child was told it enqueued is still there, acked, or counted as
/// dropped, and no job is there that the child did not enqueue (but the one whose answer
/// the kill cut off).
#[test]
fn a_killed_producer_never_leaves_a_queue_over_its_limit_or_a_job_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.leaseq");
    {
        let q = leaseq::Queue::open(&path).unwrap();
        q.set_limit(Some(
            QueueLimit::jobs(40)
                .and_bytes(4_000)
                .when_full(WhenFull::DropOldest),
        ))
        .unwrap();
    }
    let mut enqueued = std::collections::BTreeSet::new();
    let mut acked = std::collections::BTreeSet::new();
    let mut taken = std::collections::BTreeSet::new();
    for round in 0..6u64 {
        let mut child = crate::common::ChildProc::spawn(
            "queue_limits::child_entry_limit_kill",
            &round.to_string(),
            &path,
        );
        child.until_ready();
        std::thread::sleep(Duration::from_millis(40 + 37 * round));
        for line in child.kill_and_collect() {
            let mut words = line.split(' ');
            let (what, id) = (
                words.next(),
                words.next().map(|w| w.parse::<u64>().unwrap()),
            );
            match (what, id) {
                (Some("E"), Some(id)) => assert!(enqueued.insert(id)),
                (Some("A"), Some(id)) => assert!(acked.insert(id)),
                // Taken again after a kill cut off its ack: the lease came back at the open.
                (Some("T"), Some(id)) => {
                    taken.insert(id);
                }
                _ => panic!("{line}"),
            }
        }
        let q = leaseq::Queue::open(&path).unwrap();
        assert_consistent(&q);
        let stats = q.stats().unwrap();
        assert!(stats.pending() <= 40, "{stats:?}");
        assert!(stats.payload_bytes.unwrap() <= 4_000, "{stats:?}");
        let mut present = std::collections::BTreeSet::new();
        for state in [JobState::Ready, JobState::Leased, JobState::Scheduled] {
            let mut after = None;
            loop {
                let page = q.jobs(state, after, 100).unwrap();
                present.extend(page.jobs.iter().map(|j| j.id.0));
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
        // The enqueue the kill cut off may have committed without its `E` line: one a round,
        // known from then on.
        let unknown: Vec<u64> = present.difference(&enqueued).copied().collect();
        assert!(unknown.len() <= 1, "jobs nobody enqueued: {unknown:?}");
        enqueued.extend(unknown);
        let gone: Vec<u64> = enqueued
            .iter()
            .copied()
            .filter(|id| !present.contains(id) && !acked.contains(id))
            .collect();
        // A job taken as the kill came may have been acked without its `A` line.
        let cut = gone.iter().filter(|id| taken.contains(id)).count() as u64;
        assert_eq!(
            gone.len() as u64 - cut,
            stats.dropped,
            "round {round}: every job gone was dropped or acked: {gone:?}, {stats:?}"
        );
    }
    assert!(
        enqueued.len() > 100,
        "the children enqueued {}",
        enqueued.len()
    );
}
