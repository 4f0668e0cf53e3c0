//! Crash recovery with real processes: a child re-runs this test binary, works on the queue
//! and is killed with SIGKILL; the parent reopens the file and checks what was promised.
//! Scenario ids refer to docs/testing.md (Scenarios).

use crate::common;
use crate::common::{ChildProc, Fixture, assert_consistent, child_scenario, ready_to_die, say};
use leaseq::{Applied, EnqueueOptions, JobState, Queue};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

const EFFECTS: TableDefinition<&str, u64> = TableDefinition::new("effects");

fn effect_count(q: &Queue, key: &str) -> u64 {
    let rtx = q.database().begin_read().unwrap();
    match rtx.open_table(EFFECTS) {
        Ok(t) => t.get(key).unwrap().map_or(0, |v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => panic!("{e}"),
    }
}

/// Adds one to the effect counter of `key` in the caller's table.
fn bump(tx: &redb::WriteTransaction, key: &str) -> Result<(), leaseq::BoxError> {
    let mut t = tx.open_table(EFFECTS)?;
    let n = t.get(key)?.map_or(0, |v| v.value());
    t.insert(key, n + 1)?;
    Ok(())
}

/// The child side of every test here, selected by the scenario name.
#[test]
fn child_entry_recovery() {
    let Some((scenario, path)) = child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    let q = Queue::builder().max_attempts(3).open(&path).unwrap();
    match scenario.as_str() {
        "lease_one" => {
            let l = q.dequeue().unwrap().unwrap();
            say(format!("{} {}", l.id(), l.attempt()));
            ready_to_die();
        }
        "enq5_deq2_ack1" => {
            for i in 0..5 {
                let _ = q
                    .enqueue(format!("job{i}").as_bytes(), EnqueueOptions::default())
                    .unwrap();
            }
            let first = q.dequeue().unwrap().unwrap();
            let _second = q.dequeue().unwrap().unwrap();
            first.ack().unwrap();
            ready_to_die();
        }
        "die_inside_effect" => {
            let l = q.dequeue().unwrap().unwrap();
            let _ = l.ack_with(|tx| {
                bump(tx, "E")?;
                ready_to_die() // killed with the effect written but not committed
            });
            unreachable!();
        }
        "effect_then_die" => {
            let l = q.dequeue().unwrap().unwrap();
            let outcome = l.ack_with(|tx| bump(tx, "E")).unwrap();
            say(format!("{outcome:?}"));
            ready_to_die();
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn open(f: &Fixture) -> Queue {
    Queue::builder().max_attempts(3).open(&f.path).unwrap()
}

// C05: the killed process's lease comes back at once, at attempt 2; B is still served.
#[test]
fn killed_consumer_lease_is_redelivered_at_reopen() {
    let f = Fixture::new();
    let (a, b) = {
        let q = open(&f);
        let a = q.enqueue(b"A", EnqueueOptions::default()).unwrap().id();
        let b = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
        (a, b)
    };
    let mut child = ChildProc::spawn("recovery::child_entry_recovery", "lease_one", &f.path);
    let said = child.until_ready();
    assert_eq!(said, vec![format!("{a} 1")]);
    child.kill();

    let q = open(&f);
    assert_eq!(q.recovery().leases_returned, 1);
    assert_consistent(&q);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.ready, s.leased, s.dead), (2, 2, 0, 0));
    let mut seen = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        seen.push((l.id(), l.attempt()));
        l.ack().unwrap();
    }
    seen.sort();
    assert_eq!(seen, vec![(a, 2), (b, 1)]);
}

/// Issue 22 item 7: a lease returned at open goes back to the place its job had within its
/// priority (before every job that became ready after it), as persist-queue serves an
/// interrupted item first; not behind them, as a nack or an expiry would.
#[test]
fn leases_returned_at_open_keep_their_place_in_each_priority() {
    let f = Fixture::new();
    let opts = |p: i32| EnqueueOptions::default().priority(p);
    let ids = {
        let q = open(&f);
        let a = q.enqueue(b"A", opts(0)).unwrap().id();
        let b = q.enqueue(b"B", opts(0)).unwrap().id();
        let low = q.enqueue(b"F", opts(5)).unwrap().id();
        // Held, never acked: the handle and its leases go as a crash would leave them.
        let held: Vec<_> = (0..3).map(|_| q.dequeue().unwrap().unwrap()).collect();
        assert_eq!(
            held.iter().map(|l| l.id()).collect::<Vec<_>>(),
            vec![a, b, low]
        );
        let c = q.enqueue(b"C", opts(0)).unwrap().id();
        let d = q.enqueue(b"D", opts(0)).unwrap().id();
        let urgent = q.enqueue(b"E", opts(-1)).unwrap().id();
        let later_low = q.enqueue(b"G", opts(5)).unwrap().id();
        vec![urgent, a, b, c, d, low, later_low]
    };
    let q = open(&f);
    assert_eq!(q.recovery().leases_returned, 3);
    assert_consistent(&q);
    let mut order = Vec::new();
    while let Some(l) = q.dequeue().unwrap() {
        order.push(l.id());
        l.ack().unwrap();
    }
    assert_eq!(order, ids);
}

// C06: crash while holding A, three times: each reopen makes A available at once, and after
// the third crash A is dead, never lost.
#[test]
fn repeated_crashes_dead_letter_after_max_attempts() {
    let f = Fixture::new();
    let a = open(&f)
        .enqueue(b"A", EnqueueOptions::default())
        .unwrap()
        .id();
    for attempt in 1..=3u32 {
        let mut child = ChildProc::spawn("recovery::child_entry_recovery", "lease_one", &f.path);
        assert_eq!(child.until_ready(), vec![format!("{a} {attempt}")]);
        child.kill();
        if attempt < 3 {
            // Peek without consuming: a fresh open shows it ready right away.
            let q = open(&f);
            assert_eq!(q.recovery().leases_returned, 1);
            assert_eq!(q.job(a).unwrap().unwrap().state, JobState::Ready);
            assert_consistent(&q);
        }
    }
    let q = open(&f);
    assert_eq!(q.recovery().leases_dead_lettered, 1);
    let info = q.job(a).unwrap().unwrap();
    assert_eq!((info.state, info.attempts), (JobState::Dead, 3));
    assert!(info.last_error.unwrap().contains("abandoned"));
    assert!(q.dequeue().unwrap().is_none());
    assert_consistent(&q);
}

// C07: counters agree with a scan after a crash, and the drain yields exactly the rest.
#[test]
fn counters_match_scan_after_crash_and_drain_yields_the_rest() {
    let f = Fixture::new();
    drop(open(&f));
    let mut child = ChildProc::spawn("recovery::child_entry_recovery", "enq5_deq2_ack1", &f.path);
    child.until_ready();
    child.kill();
    let q = open(&f);
    assert_consistent(&q);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.ready, s.leased, s.dead), (4, 4, 0, 0));
    let mut drained = 0;
    while let Some(l) = q.dequeue().unwrap() {
        assert!(!q.is_empty().unwrap(), "is_empty before the drain ends");
        l.ack().unwrap();
        drained += 1;
    }
    assert_eq!(drained, 4);
    assert!(q.is_empty().unwrap());
}

// C09, abort half: killed inside the effect transaction, neither the effect nor the applied
// marker exists; the redelivery applies the effect once.
#[test]
fn crash_inside_effect_leaves_nothing_and_redelivery_applies_once() {
    let f = Fixture::new();
    let a = open(&f)
        .enqueue(b"A", EnqueueOptions::default().idempotency_key("order-1"))
        .unwrap()
        .id();
    let mut child = ChildProc::spawn(
        "recovery::child_entry_recovery",
        "die_inside_effect",
        &f.path,
    );
    child.until_ready();
    child.kill();
    let q = open(&f);
    assert_eq!(effect_count(&q, "E"), 0);
    assert!(!q.is_applied("order-1").unwrap());
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!((l.id(), l.attempt()), (a, 2));
    assert_eq!(l.ack_with(|tx| bump(tx, "E")).unwrap(), Applied::Now);
    assert_eq!(effect_count(&q, "E"), 1);
    assert!(q.is_applied("order-1").unwrap());
    assert_consistent(&q);
}

// C09, commit half: the effect committed with its marker and ack; after the crash the job is
// gone, and a second job with the same idempotency key (a redelivery by the producer) finds
// it applied and does not run the effect again.
#[test]
fn committed_effect_survives_crash_and_is_never_applied_twice() {
    let f = Fixture::new();
    open(&f)
        .enqueue(b"A", EnqueueOptions::default().idempotency_key("order-2"))
        .unwrap();
    let mut child = ChildProc::spawn("recovery::child_entry_recovery", "effect_then_die", &f.path);
    assert_eq!(child.until_ready(), vec!["Now".to_string()]);
    child.kill();
    let q = open(&f);
    assert_eq!(q.recovery().leases_returned, 0);
    assert_eq!(q.len().unwrap(), 0);
    assert_eq!(effect_count(&q, "E"), 1);
    q.enqueue(
        b"A again",
        EnqueueOptions::default().idempotency_key("order-2"),
    )
    .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    let mut ran = false;
    let outcome = l
        .ack_with(|tx| {
            ran = true;
            bump(tx, "E")
        })
        .unwrap();
    assert_eq!(outcome, Applied::AlreadyApplied);
    assert!(!ran);
    assert_eq!(effect_count(&q, "E"), 1);
    let rtx = q.database().begin_read().unwrap();
    assert_eq!(rtx.open_table(EFFECTS).unwrap().len().unwrap(), 1);
    drop(rtx);
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// The child side of `c12_a_delayed_job_keeps_its_due_time_across_a_crash`: at t = 0 it
/// enqueues A with a 10 s delay and dies without closing the file (the crash, at t = 2 s).
#[test]
fn child_entry_delay() {
    let Some((scenario, path)) = child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    assert_eq!(scenario, "enqueue_delayed");
    let clock = leaseq::ManualClock::new(common::T0_MS);
    let q = Queue::builder().clock(clock).open(&path).unwrap();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().delay(std::time::Duration::from_secs(10)),
        )
        .unwrap()
        .id();
    say(a);
    ready_to_die();
}

// C12: a job delayed 10 s at t = 0, then a crash. A reopen at t = 5 s delivers nothing before
// t = 10 s and delivers it at t = 11 s, with no enqueue in between; a reopen at t = 20 s
// delivers it at once. Its due time is stored, not a timer of the dead process.
#[test]
fn c12_a_delayed_job_keeps_its_due_time_across_a_crash() {
    for reopen_at_s in [5u64, 20] {
        let f = Fixture::new();
        let mut child = ChildProc::spawn("recovery::child_entry_delay", "enqueue_delayed", &f.path);
        let said = child.until_ready();
        child.kill();
        let a: u64 = said[0].parse().unwrap();
        let clock = leaseq::ManualClock::new(common::T0_MS + reopen_at_s * 1_000);
        let q = Queue::builder().clock(clock.clone()).open(&f.path).unwrap();
        assert_consistent(&q);
        let info = q.job(leaseq::JobId(a)).unwrap().unwrap();
        assert_eq!(info.state, JobState::Scheduled, "reopen at {reopen_at_s} s");
        assert_eq!(info.attempts, 0);
        if reopen_at_s < 10 {
            assert!(q.dequeue().unwrap().is_none(), "due at 10 s, not before");
            clock.set_ms(common::T0_MS + 9_999);
            assert!(q.dequeue().unwrap().is_none(), "due at 10 s, not before");
            clock.set_ms(common::T0_MS + 11_000);
        }
        let l = q.dequeue().unwrap().expect("due");
        assert_eq!((l.id().0, l.attempt()), (a, 1));
        l.ack().unwrap();
        assert!(q.is_empty().unwrap());
    }
}

/// The child side of `c10_a_crash_inside_the_repair_loses_nothing`: `fill` enqueues 5,000 jobs
/// and leases 10, then waits to be killed; `repair` opens the crashed file and is killed from
/// inside the repair (at its first progress report).
#[test]
fn child_entry_repair() {
    let Some((scenario, path)) = child_scenario() else {
        return; // Only meaningful when re-executed by a parent test.
    };
    match scenario.as_str() {
        "fill" => {
            let q = Queue::open(&path).unwrap();
            let payload = [7u8; 200];
            for _ in 0..5 {
                let batch = (0..1_000).map(|_| (&payload[..], EnqueueOptions::default()));
                q.enqueue_batch(batch).unwrap();
            }
            let leased = q.dequeue_batch(10).unwrap();
            assert_eq!(leased.len(), 10);
            ready_to_die();
        }
        "repair" => {
            let _ = Queue::builder().on_repair(|_| ready_to_die()).open(&path);
            unreachable!("the open of a crashed file repairs it");
        }
        other => panic!("unknown scenario {other}"),
    }
}

// C10: a crashed file's reopen repairs it and says so (the `on_repair` signal and
// `Recovery::repaired`); a process killed inside that repair loses nothing: the next reopen
// repairs again and finds every job, the 10 leased ones returned. (The reopen's time at scale
// is measured by `examples/scale.rs`, docs/performance.md.)
#[test]
fn c10_a_crash_inside_the_repair_loses_nothing() {
    let f = Fixture::new();
    let mut child = ChildProc::spawn("recovery::child_entry_repair", "fill", &f.path);
    child.until_ready();
    child.kill();
    let mut child = ChildProc::spawn("recovery::child_entry_repair", "repair", &f.path);
    child.until_ready();
    child.kill();
    let reports = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = reports.clone();
    let q = Queue::builder()
        .on_repair(move |_| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .open(&f.path)
        .unwrap();
    assert!(q.recovery().repaired, "{:?}", q.recovery());
    assert!(reports.load(std::sync::atomic::Ordering::SeqCst) > 0);
    assert_eq!(q.recovery().leases_returned, 10);
    assert_consistent(&q);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.ready, s.leased), (5_000, 5_000, 0));
    let mut n = 0;
    loop {
        let batch = q.dequeue_batch(1_000).unwrap();
        if batch.is_empty() {
            break;
        }
        n += batch.len();
        assert!(q.ack_batch(&batch).unwrap().iter().all(|r| r.is_ok()));
    }
    assert_eq!(n, 5_000);
}
