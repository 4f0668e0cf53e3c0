//! Change events (`Queue::events`, issue 23): one per job and change, after the commit, in
//! commit order; nothing from a refused or rolled-back call; per queue; bounded with a count
//! of what a slow reader missed; ended when the file closes.

use crate::common::{Fixture, LEASE, enqueue_n, keyed, plain};
use leaseq::{Event, JobState, Queue};
use std::collections::HashSet;
use std::time::Duration;

fn drain(events: &leaseq::Events) -> Vec<Event> {
    std::iter::from_fn(|| events.try_recv()).collect()
}

#[test]
fn every_change_has_its_event_in_commit_order() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events().unwrap();
    let ids = enqueue_n(&q, 4, plain().max_attempts(2));
    assert_eq!(
        drain(&events),
        ids.iter()
            .map(|&id| Event::Enqueued { id })
            .collect::<Vec<_>>()
    );
    // A duplicate adds nothing; a refused call says nothing.
    q.enqueue(b"k", keyed("d").dedup_key("d")).unwrap();
    q.enqueue(b"k", keyed("d").dedup_key("d")).unwrap();
    assert!(q.enqueue(&[0; 2 << 20], plain()).is_err());
    let kept = drain(&events);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(matches!(kept[0], Event::Enqueued { .. }), "{kept:?}");
    // Each ending, in order.
    let l = q.dequeue().unwrap().unwrap();
    l.nack("once").unwrap();
    assert_eq!(
        drain(&events),
        vec![Event::Retried {
            id: ids[0],
            attempt: 1
        }]
    );
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), ids[1]);
    l.fail("bad").unwrap();
    let l = q.dequeue().unwrap().unwrap();
    l.snooze(Duration::from_secs(60)).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    l.ack().unwrap();
    assert_eq!(
        drain(&events),
        vec![
            Event::Dead { id: ids[1] },
            Event::Snoozed { id: ids[2] },
            Event::Completed { id: ids[3] },
        ]
    );
    // A failing ack_with closure gives the job back: the rolled-back effect says nothing,
    // the give-back says Retried.
    let l = q.dequeue().unwrap().unwrap();
    let _ = l.ack_with(|_| Err("no".into()));
    assert_eq!(
        drain(&events),
        vec![Event::Retried {
            id: l.id(),
            attempt: 1
        }]
    );
    // An expired lease taken back by a dequeue's sweep.
    let l = q.dequeue().unwrap().unwrap();
    let expired = l.id();
    drop(l);
    f.clock.advance(LEASE + Duration::from_secs(1));
    let again = q.dequeue().unwrap().unwrap();
    let got = drain(&events);
    assert!(
        got.contains(&Event::Retried {
            id: expired,
            attempt: 1
        }) || got.contains(&Event::Dead { id: expired }),
        "{got:?}"
    );
    again.ack().unwrap();
    // Cancel, requeue, pause and resume.
    let doomed = q.enqueue(b"doomed", plain()).unwrap().id();
    assert_eq!(
        q.cancel(doomed, "gone").unwrap().was(),
        Some(JobState::Ready)
    );
    q.requeue_dead(ids[1]).unwrap();
    q.pause().unwrap();
    q.pause().unwrap(); // already paused: nothing
    q.resume().unwrap();
    let got = drain(&events);
    assert_eq!(
        &got[got.len() - 4..],
        &[
            Event::Cancelled { id: doomed },
            Event::Requeued { id: ids[1] },
            Event::Paused,
            Event::Resumed,
        ],
        "{got:?}"
    );
    // A write that rolls back says nothing; one that commits says what it enqueued.
    let _ = q.write(|tx| {
        tx.enqueue(b"rolled back", plain())?;
        Err::<(), _>("no".into())
    });
    assert!(drain(&events).is_empty());
    let id = q
        .write(|tx| Ok(tx.enqueue(b"kept", plain())?.id()))
        .unwrap();
    assert_eq!(drain(&events), vec![Event::Enqueued { id }]);
    assert_eq!(events.missed(), 0);
}

/// Drained: said by the commit that ends the last leased job while none is ready; not while
/// another is still leased or ready.
#[test]
fn drained_comes_once_when_the_last_running_job_ends() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events().unwrap();
    enqueue_n(&q, 3, plain());
    let a = q.dequeue().unwrap().unwrap();
    let b = q.dequeue().unwrap().unwrap();
    a.ack().unwrap();
    b.ack().unwrap();
    let got = drain(&events);
    assert!(!got.contains(&Event::Drained), "one still ready: {got:?}");
    let c = q.dequeue().unwrap().unwrap();
    q.enqueue(b"later", plain().delay(Duration::from_secs(60)))
        .unwrap();
    c.ack().unwrap();
    let got = drain(&events);
    assert_eq!(
        got.last(),
        Some(&Event::Drained),
        "scheduled jobs may remain: {got:?}"
    );
    assert_eq!(got.iter().filter(|e| **e == Event::Drained).count(), 1);
    // A batch ack that ends the last two: one Drained.
    enqueue_n(&q, 2, plain());
    let leases = q.dequeue_batch(2).unwrap();
    drain(&events);
    for r in q.ack_batch(&leases).unwrap() {
        r.unwrap();
    }
    let got = drain(&events);
    assert_eq!(
        got.iter().filter(|e| **e == Event::Drained).count(),
        1,
        "{got:?}"
    );
}

/// A subscription sees its own queue only.
#[test]
fn events_are_per_queue() {
    let f = Fixture::new();
    let q = f.open();
    let mail = q.named("mail").unwrap();
    let (on_default, on_mail) = (q.events().unwrap(), mail.events().unwrap());
    let a = q.enqueue(b"a", plain()).unwrap().id();
    let b = mail.enqueue(b"b", plain()).unwrap().id();
    mail.pause().unwrap();
    assert_eq!(drain(&on_default), vec![Event::Enqueued { id: a }]);
    assert_eq!(
        drain(&on_mail),
        vec![Event::Enqueued { id: b }, Event::Paused]
    );
}

/// A reader slower than the queue misses events, counted, and never slows the queue.
#[test]
fn a_slow_reader_misses_events_and_counts_them() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events_with_capacity(4).unwrap();
    let ids = enqueue_n(&q, 10, plain());
    assert_eq!(events.len(), 4);
    assert_eq!(events.missed(), 6);
    assert_eq!(
        drain(&events),
        ids[..4]
            .iter()
            .map(|&id| Event::Enqueued { id })
            .collect::<Vec<_>>()
    );
    assert!(matches!(
        q.events_with_capacity(0),
        Err(leaseq::Error::InvalidOption { .. })
    ));
}

/// Concurrent producers sharing commits: the events name exactly the jobs enqueued, once
/// each; and an event is seen only after its commit (the job is there to read).
#[test]
fn events_of_group_commits_name_every_job_once_after_its_commit() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events_with_capacity(10_000).unwrap();
    let reader = {
        let q = q.clone();
        std::thread::spawn(move || {
            let mut seen = HashSet::new();
            while seen.len() < 800 {
                match events.recv_timeout(Duration::from_secs(30)) {
                    Some(Event::Enqueued { id }) => {
                        assert!(q.job(id).unwrap().is_some(), "published before its commit");
                        assert!(seen.insert(id), "{id:?} twice");
                    }
                    other => panic!("{other:?}"),
                }
            }
            seen
        })
    };
    let producers: Vec<_> = (0..8)
        .map(|_| {
            let q = q.clone();
            std::thread::spawn(move || enqueue_n(&q, 100, plain()))
        })
        .collect();
    let mut made = HashSet::new();
    for p in producers {
        made.extend(p.join().unwrap());
    }
    assert_eq!(reader.join().unwrap(), made);
}

/// Subscriptions are bounded per file; a dropped one frees its place; every subscription ends
/// when the file closes.
#[test]
fn subscriptions_are_bounded_and_end_with_the_file() {
    let f = Fixture::new();
    let q = f.open();
    let mut subs: Vec<_> = (0..leaseq::SUBSCRIBERS_MAX)
        .map(|_| q.events().unwrap())
        .collect();
    assert!(matches!(
        q.events(),
        Err(leaseq::Error::InvalidOption { .. })
    ));
    subs.pop();
    let last = q.events().unwrap();
    let waiter = std::thread::spawn(move || last.recv());
    std::thread::sleep(Duration::from_millis(50));
    drop(q);
    assert_eq!(
        waiter.join().unwrap(),
        None,
        "the file closed: the subscription ended"
    );
    assert!(subs[0].recv_timeout(Duration::from_secs(5)).is_none());
    // Released: the subscriptions held no handle.
    let _again = Queue::open(&f.path).unwrap();
}

/// No `Drained` while a scheduled job is already due (the next dequeue will take it), nor
/// when an ack-and-next takes it in the same commit (found by review).
#[test]
fn a_due_scheduled_job_keeps_the_queue_from_draining() {
    let f = Fixture::new();
    let q = f.open();
    let events = q.events().unwrap();
    q.enqueue(b"a", plain()).unwrap();
    q.enqueue(b"b", plain().delay(Duration::from_secs(5)))
        .unwrap();
    let a = q.dequeue().unwrap().unwrap();
    f.clock.advance(Duration::from_secs(6));
    let b = a.ack_and_next().unwrap().expect("b is due");
    assert!(!drain(&events).contains(&Event::Drained));
    b.ack().unwrap();
    assert_eq!(drain(&events).last(), Some(&Event::Drained));
    // A dropped subscription stops costing: a new one starts from nothing.
    drop(events);
    let again = q.events().unwrap();
    assert!(again.is_empty());
}
