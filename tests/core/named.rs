//! Named queues in one file (issue 10): each has its own jobs, order, dedup keys, applied
//! markers, dead letters, stats and defaults; consumers never see another queue's jobs; a
//! blocked consumer wakes for its own queue only; names are validated; an unknown name on a
//! call that does not create is a typed error; leases of every queue are recovered at open.
//!
//! Adversarial tests of named queues (format 4) and payloads stored apart (format 3).

use crate::common;
use crate::common::{Fixture, assert_consistent, bump, drain_payloads, effects, new_id};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobId, JobState, Queue};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::time::Duration;

fn opts() -> EnqueueOptions {
    EnqueueOptions::default()
}

#[test]
fn consumers_of_one_queue_never_see_anothers_jobs() {
    let f = Fixture::new();
    let q = f.open();
    let emails = q.named("emails").unwrap();
    let images = q.named("images").unwrap();
    assert_eq!(emails.name(), Some("emails"));
    assert_eq!(q.name(), None);
    let mut ids = Vec::new();
    for i in 0..3u8 {
        ids.push(new_id(q.enqueue(&[b'd', i], opts()).unwrap()));
        ids.push(new_id(emails.enqueue(&[b'e', i], opts()).unwrap()));
        ids.push(new_id(images.enqueue(&[b'i', i], opts()).unwrap()));
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "ids are unique across the file");
    assert_eq!(emails.stats().unwrap().ready, 3);
    assert_eq!(images.len().unwrap(), 3);
    assert_eq!(q.len().unwrap(), 3);
    let e = drain_payloads(&emails);
    assert_eq!(
        e,
        vec![b"e\0".to_vec(), b"e\x01".to_vec(), b"e\x02".to_vec()]
    );
    assert!(emails.is_empty().unwrap());
    assert_eq!(
        images.len().unwrap(),
        3,
        "draining emails took nothing else"
    );
    assert_eq!(drain_payloads(&q).len(), 3);
    assert_eq!(drain_payloads(&images).len(), 3);
    // A job id of another queue is not found through this one.
    assert!(emails.job(ids[0]).unwrap().is_none());
    assert_consistent(&q);
}

#[test]
fn dedup_keys_markers_and_dead_letters_are_per_queue() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap().with_max_attempts(1).unwrap();
    let b = q.named("b").unwrap();
    let ea = a
        .enqueue(b"1", opts().dedup_key("k").idempotency_key("I"))
        .unwrap();
    let eb = b
        .enqueue(b"1", opts().dedup_key("k").idempotency_key("I"))
        .unwrap();
    assert!(matches!((ea, eb), (Enqueued::New(_), Enqueued::New(_))));
    assert!(matches!(
        a.enqueue(b"2", opts().dedup_key("k")).unwrap(),
        Enqueued::Duplicate(_)
    ));
    let la = a.dequeue().unwrap().unwrap();
    assert_eq!(la.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
    assert!(a.is_applied("I").unwrap());
    assert!(!b.is_applied("I").unwrap(), "markers are per queue");
    let lb = b.dequeue().unwrap().unwrap();
    assert_eq!(lb.ack_with(|tx| bump(tx, 2)).unwrap(), Applied::Now);
    // Defaults per handle: `a` allows one attempt, the default queue five.
    a.enqueue(b"dies", opts()).unwrap();
    q.enqueue(b"lives", opts()).unwrap();
    assert_eq!(
        a.dequeue().unwrap().unwrap().nack("no").unwrap(),
        JobState::Dead
    );
    assert_eq!(
        q.dequeue().unwrap().unwrap().nack("no").unwrap(),
        JobState::Ready
    );
    assert_eq!(a.stats().unwrap().dead, 1);
    assert_eq!(q.stats().unwrap().dead, 0);
    assert_eq!(b.stats().unwrap().dead, 0);
    assert_eq!(a.requeue_dead_all().unwrap(), 1);
    assert_consistent(&q);
}

#[test]
fn names_are_checked_and_unknown_names_are_never_created_by_reads() {
    let f = Fixture::new();
    let q = f.open();
    for bad in [
        "",
        "a b",
        "é",
        "x/y",
        &"n".repeat(leaseq::QUEUE_NAME_BYTES_MAX + 1),
    ] {
        assert!(
            matches!(q.named(bad), Err(Error::InvalidOption { .. })),
            "{bad:?}"
        );
    }
    q.named(&"n".repeat(leaseq::QUEUE_NAME_BYTES_MAX)).unwrap();
    assert!(matches!(
        q.existing("nope"),
        Err(Error::QueueNotFound { ref name }) if name == "nope"
    ));
    assert_eq!(
        q.queue_names().unwrap(),
        vec!["n".repeat(leaseq::QUEUE_NAME_BYTES_MAX)]
    );
    q.named("jobs.v2-high_prio").unwrap();
    assert_eq!(
        q.existing("jobs.v2-high_prio").unwrap().name(),
        Some("jobs.v2-high_prio")
    );
    assert_eq!(q.queue_names().unwrap().len(), 2);
}

#[test]
fn named_queues_and_their_leases_survive_a_reopen() {
    let f = Fixture::new();
    {
        let q = f.open();
        let w = q.named("work").unwrap();
        w.enqueue(b"held", opts()).unwrap();
        w.enqueue(b"waiting", opts()).unwrap();
        q.enqueue(b"default held", opts()).unwrap();
        let l1 = w.dequeue().unwrap().unwrap();
        let l2 = q.dequeue().unwrap().unwrap();
        // The process goes away with both leases held.
        drop((l1, l2, w, q));
    }
    let q = f.open();
    assert_eq!(q.recovery().leases_returned, 2, "{:?}", q.recovery());
    assert_eq!(q.queue_names().unwrap(), vec!["work".to_string()]);
    let w = q.existing("work").unwrap();
    assert_eq!(w.stats().unwrap().ready, 2);
    // A returned lease keeps the place its job had: "held" first, as it was enqueued first.
    let got: Vec<(Vec<u8>, u32)> = w
        .dequeue_batch(10)
        .unwrap()
        .iter()
        .map(|l| (l.payload().to_vec(), l.attempt()))
        .collect();
    assert_eq!(got, vec![(b"held".to_vec(), 2), (b"waiting".to_vec(), 1)]);
    assert_consistent(&q);
}

#[test]
fn a_batch_of_leases_from_another_queue_is_refused() {
    let f = Fixture::new();
    let q = f.open();
    let other = q.named("other").unwrap();
    other.enqueue(b"x", opts()).unwrap();
    let l = other.dequeue().unwrap().unwrap();
    let r = q.ack_batch(std::slice::from_ref(&l));
    assert!(matches!(r, Err(Error::InvalidOption { .. })), "{r:?}");
    assert_eq!(other.ack_batch(&[l]).unwrap().len(), 1);
}

#[test]
fn a_blocked_consumer_wakes_for_its_own_queue_only() {
    let f = Fixture::new();
    let q = f.open();
    let mine = q.named("mine").unwrap();
    let theirs = q.named("theirs").unwrap();
    let consumer = {
        let mine = mine.clone();
        std::thread::spawn(move || mine.dequeue_timeout(Duration::from_secs(60)).unwrap())
    };
    std::thread::sleep(Duration::from_millis(100));
    theirs.enqueue(b"not for you", opts()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!consumer.is_finished(), "woke for another queue's job");
    mine.enqueue(b"yours", opts()).unwrap();
    let got = consumer.join().unwrap().expect("a job");
    assert_eq!(got.payload(), b"yours");
    assert_eq!(theirs.len().unwrap(), 1);
}

#[test]
fn follow_ups_go_to_the_leases_queue_and_check_covers_every_queue() {
    let f = Fixture::new();
    let q = f.open();
    let step1 = q.named("step1").unwrap();
    step1.enqueue(b"a", opts()).unwrap();
    let l = step1.dequeue().unwrap().unwrap();
    l.ack_with(|tx| {
        tx.enqueue(b"a, again", opts())?;
        Ok(())
    })
    .unwrap();
    assert_eq!(step1.len().unwrap(), 1);
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
    // Damage step1's ready index through the database: `check` on the default handle names
    // the queue.
    {
        let tx = q.database().begin_write().unwrap();
        let def: redb::TableDefinition<(u32, u64, u64), ()> =
            redb::TableDefinition::new("leaseq_q1_ready");
        tx.open_table(def).unwrap().retain(|_, _| false).unwrap();
        tx.commit().unwrap();
    }
    let v = q.check().unwrap();
    assert!(
        v.iter().any(|v| v.detail.starts_with("queue \"step1\":")),
        "{v:?}"
    );
}

#[test]
fn a_file_holds_at_most_queues_max_named_queues() {
    let f = Fixture::new();
    let q = f.open_non_durable();
    for i in 0..leaseq::QUEUES_MAX {
        q.named(&format!("q{i}")).unwrap();
    }
    assert!(matches!(
        q.named("one-too-many"),
        Err(Error::InvalidOption { .. })
    ));
    // An existing one is still found.
    q.named("q7").unwrap();
    assert_eq!(q.queue_names().unwrap().len(), leaseq::QUEUES_MAX as usize);
}

/// Power lost at every write and sync of a queue's creation and first enqueue: after the
/// reboot the queue exists whole (its tables readable, `check` clean) or not at all, and can
/// be made and used.
#[cfg(feature = "sim")]
#[test]
fn a_power_loss_while_a_queue_is_made_leaves_it_whole_or_absent() {
    use leaseq::sim::SimDisk;
    use leaseq::{ManualClock, Queue};
    let open = |disk: &SimDisk| {
        Queue::builder()
            .clock(ManualClock::new(common::T0_MS))
            .open_backend(disk.backend())
            .unwrap()
    };
    let base = SimDisk::new(3);
    drop(open(&base));
    let image = base.live_image();
    let mut k = 0;
    loop {
        let disk = SimDisk::from_image(image.clone(), 10 + k);
        let q = open(&disk);
        disk.crash_after(k);
        let made = q
            .named("x")
            .and_then(|x| x.enqueue(b"first", opts()).map(|_| x));
        let crashed = disk.is_crashed();
        drop((made, q));
        let q = open(&SimDisk::from_image(disk.crash_image(), 20 + k));
        assert_consistent(&q);
        let names = q.queue_names().unwrap();
        match q.existing("x") {
            Ok(x) => assert!(x.len().unwrap() <= 1, "crash point {k}"),
            Err(Error::QueueNotFound { .. }) => assert!(names.is_empty(), "{names:?}"),
            Err(e) => panic!("crash point {k}: {e}"),
        }
        let x = q.named("x").unwrap();
        x.enqueue(b"after", opts()).unwrap();
        assert!(x.dequeue().unwrap().is_some());
        if !crashed {
            assert!(k > 2, "only {k} crash points");
            return;
        }
        k += 1;
    }
}

/// A pipeline across queues: the effect, the ack and the next step in another queue commit
/// together; a failing step leaves no next step; a handle of another file is refused.
#[test]
fn a_follow_up_can_go_to_another_queue_of_the_file() {
    let f = Fixture::new();
    let q = f.open();
    let resize = q.named("resize").unwrap();
    let upload = q.named("upload").unwrap().with_max_attempts(9).unwrap();
    resize.enqueue(b"a.jpg", opts()).unwrap();
    resize.enqueue(b"b.jpg", opts()).unwrap();
    let l = resize.dequeue().unwrap().unwrap();
    l.ack_with(|tx| {
        bump(tx, 1)?;
        tx.enqueue_to(&upload, b"a.jpg resized", opts())?;
        Ok(())
    })
    .unwrap();
    let l = resize.dequeue().unwrap().unwrap();
    let r = l.ack_with(|tx| {
        tx.enqueue_to(&upload, b"b.jpg resized", opts())?;
        Err("resize failed".into())
    });
    assert!(matches!(r, Err(Error::Effect(_))), "{r:?}");
    let next = upload.dequeue().unwrap().unwrap();
    assert_eq!(next.payload(), b"a.jpg resized");
    assert_eq!(
        upload.job(next.id()).unwrap().unwrap().max_attempts,
        9,
        "the target queue's defaults"
    );
    assert!(upload.dequeue().unwrap().is_none());
    next.ack().unwrap();
    assert_eq!(resize.len().unwrap(), 1, "b.jpg given back");
    // `write` too, and a handle of another file is refused.
    q.write(|tx| Ok(tx.enqueue_to(&upload, b"from write", opts())?))
        .unwrap();
    assert_eq!(upload.len().unwrap(), 1);
    let g = Fixture::new();
    let elsewhere = g.open();
    let r = q.write(|tx| Ok(tx.enqueue_to(&elsewhere, b"x", opts())?));
    // The refusal itself, as outside `write` (issue 23), not `Effect` around it.
    assert!(
        matches!(r, Err(Error::InvalidOption { field: "queue", .. })),
        "{r:?}"
    );
    assert_consistent(&q);
}

/// `check` covers the registry both ways: a queue's tables without a registry entry are
/// reported.
#[test]
fn check_reports_the_tables_of_an_unregistered_queue() {
    let f = Fixture::new();
    let q = f.open();
    q.named("kept").unwrap();
    assert_consistent(&q);
    {
        let tx = q.database().begin_write().unwrap();
        let def: redb::TableDefinition<&str, u32> = redb::TableDefinition::new("leaseq_queues");
        tx.open_table(def).unwrap().remove("kept").unwrap();
        tx.commit().unwrap();
    }
    let v = q.check().unwrap();
    assert!(
        v.iter()
            .any(|v| v.detail.contains("leaseq_q1_jobs") && v.detail.contains("not registered")),
        "{v:?}"
    );
}

fn payloads_def(name: &str) -> TableDefinition<'_, u64, &'static [u8]> {
    TableDefinition::new(name)
}

fn big(tag: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| tag ^ (i as u8)).collect()
}

fn payload_row(q: &Queue, table: &str, id: JobId) -> Option<Vec<u8>> {
    let rtx = q.database().begin_read().unwrap();
    let t = rtx.open_table(payloads_def(table)).unwrap();
    t.get(id.0).unwrap().map(|v| v.value().to_vec())
}

fn payload_rows(q: &Queue, table: &str) -> u64 {
    let rtx = q.database().begin_read().unwrap();
    rtx.open_table(payloads_def(table)).unwrap().len().unwrap()
}

enum Damage {
    Flip,
    Delete,
    Truncate,
}

fn damage(q: &Queue, table: &str, id: JobId, how: &Damage) {
    let tx = q.database().begin_write().unwrap();
    {
        let mut t = tx.open_table(payloads_def(table)).unwrap();
        let cur = t.get(id.0).unwrap().map(|v| v.value().to_vec());
        let cur = cur.expect("payload row exists before damage");
        match how {
            Damage::Flip => {
                let mut b = cur.clone();
                let at = b.len() / 2;
                b[at] ^= 0x40;
                t.insert(id.0, b.as_slice()).unwrap();
            }
            Damage::Delete => {
                t.remove(id.0).unwrap();
            }
            Damage::Truncate => {
                t.insert(id.0, &cur[..cur.len() - 1]).unwrap();
            }
        }
    }
    tx.commit().unwrap();
}

fn is_corrupted<T: std::fmt::Debug>(r: &leaseq::Result<T>) -> bool {
    matches!(r, Err(Error::Corrupted { .. }))
}

/// Every per-id call through another queue's handle: not found, nothing changed.
#[test]
fn every_call_by_id_is_confined_to_its_queue() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap().with_max_attempts(1).unwrap();
    let b = q.named("b").unwrap();
    let dead = new_id(
        a.enqueue(&big(1, 3000), opts().idempotency_key("K"))
            .unwrap(),
    );
    a.dequeue().unwrap().unwrap().nack("x").unwrap();
    let ready = new_id(a.enqueue(&big(2, 3000), opts().dedup_key("D")).unwrap());
    assert_eq!(a.job(dead).unwrap().unwrap().state, JobState::Dead);
    for other in [&b, &q] {
        assert!(other.job(dead).unwrap().is_none());
        assert!(other.job(ready).unwrap().is_none());
        assert!(other.payload(dead).unwrap().is_none());
        assert!(other.payload(ready).unwrap().is_none());
        assert!(matches!(
            other.remove(ready),
            Err(Error::JobNotFound { .. })
        ));
        assert!(matches!(
            other.requeue_dead(dead),
            Err(Error::JobNotFound { .. })
        ));
        assert_eq!(other.purge(JobState::Dead).unwrap(), 0);
        assert_eq!(other.purge(JobState::Ready).unwrap(), 0);
        assert_eq!(other.requeue_dead_all().unwrap(), 0);
        assert!(
            other
                .jobs(JobState::Dead, None, 10)
                .unwrap()
                .jobs
                .is_empty()
        );
        assert!(
            other
                .jobs(JobState::Ready, None, 10)
                .unwrap()
                .jobs
                .is_empty()
        );
        assert!(other.quarantined(None, 10).unwrap().is_empty());
        assert!(other.dequeue().unwrap().is_none());
        other.prune().unwrap();
    }
    assert_eq!(a.stats().unwrap().dead, 1);
    assert_eq!(a.stats().unwrap().ready, 1);
    assert_eq!(a.payload(ready).unwrap().unwrap(), big(2, 3000));
    assert_eq!(a.payload(dead).unwrap().unwrap(), big(1, 3000));
    assert_eq!(a.jobs(JobState::Dead, None, 10).unwrap().jobs.len(), 1);
    // The same dedup key is free elsewhere.
    assert!(matches!(
        b.enqueue(b"x", opts().dedup_key("D")).unwrap(),
        Enqueued::New(_)
    ));
    assert!(matches!(
        q.enqueue(b"x", opts().dedup_key("D")).unwrap(),
        Enqueued::New(_)
    ));
    assert!(matches!(
        a.enqueue(b"x", opts().dedup_key("D")).unwrap(),
        Enqueued::Duplicate(id) if id == ready
    ));
    a.remove(dead).unwrap();
    assert!(payload_row(&q, "leaseq_q1_payloads", dead).is_none());
    assert_consistent(&q);
}

/// `ack_with` of a job holding dedup key "k": a follow-up with "k" in the same queue (also
/// through another handle of it) takes the key; in another queue where "k" is held it is a
/// duplicate of that holder; where it is free it is new.
#[test]
fn acked_key_release_is_per_queue() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap();
    let a2 = q.existing("a").unwrap().with_max_attempts(7).unwrap();
    let b = q.named("b").unwrap();
    let c = q.named("c").unwrap();
    let parent = new_id(a.enqueue(b"p", opts().dedup_key("k")).unwrap());
    let holder_b = new_id(b.enqueue(b"hb", opts().dedup_key("k")).unwrap());
    let l = a.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), parent);
    let mut got = Vec::new();
    l.ack_with(|tx| {
        got.push(tx.enqueue_to(&b, &big(3, 2000), opts().dedup_key("k"))?);
        got.push(tx.enqueue_to(&c, &big(4, 2000), opts().dedup_key("k"))?);
        got.push(tx.enqueue_to(&a2, &big(5, 2000), opts().dedup_key("k"))?);
        got.push(tx.enqueue(b"again", opts().dedup_key("k"))?);
        Ok(())
    })
    .unwrap();
    assert!(
        matches!(got[0], Enqueued::Duplicate(id) if id == holder_b),
        "{got:?}"
    );
    assert!(matches!(got[1], Enqueued::New(_)), "{got:?}");
    let child = match got[2] {
        Enqueued::New(id) => id,
        ref o => panic!("{o:?} / {got:?}"),
    };
    assert!(
        matches!(got[3], Enqueued::Duplicate(id) if id == child),
        "{got:?}"
    );
    assert_eq!(a.job(child).unwrap().unwrap().max_attempts, 7);
    assert_eq!(b.len().unwrap(), 1);
    assert_eq!(
        c.payload(match got[1] {
            Enqueued::New(id) => id,
            _ => unreachable!(),
        })
        .unwrap()
        .unwrap(),
        big(4, 2000)
    );
    assert_eq!(drain_payloads(&a), vec![big(5, 2000)]);
    assert_consistent(&q);
}

/// A lease of queue A given to queue B's batch calls is refused and stays current.
#[test]
fn leases_of_one_queue_are_refused_by_anothers_batch_calls() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap();
    let b = q.named("b").unwrap();
    a.enqueue(b"x", opts()).unwrap();
    q.enqueue(b"y", opts()).unwrap();
    let la = a.dequeue().unwrap().unwrap();
    let ld = q.dequeue().unwrap().unwrap();
    for h in [&b, &q] {
        let r = h.ack_batch(std::slice::from_ref(&la));
        assert!(matches!(r, Err(Error::InvalidOption { .. })), "{r:?}");
        let r = h.ack_with_batch(std::slice::from_ref(&la), |tx, _| bump(tx, 9));
        assert!(matches!(r, Err(Error::InvalidOption { .. })), "{r:?}");
    }
    let mixed = vec![la, ld];
    let r = a.ack_batch(&mixed);
    assert!(
        matches!(r, Err(Error::InvalidOption { .. })),
        "mixed batch: {r:?}"
    );
    let mut mixed = mixed;
    let ld = mixed.pop().unwrap();
    let la = mixed.pop().unwrap();
    // A handle of the same queue with other defaults accepts it.
    let a2 = q
        .existing("a")
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap();
    assert!(a2.ack_with_batch(&[la], |tx, _| bump(tx, 1)).unwrap()[0].is_ok());
    assert!(!effects(&q).contains_key(&9));
    ld.ack().unwrap();
    assert_consistent(&q);
}

/// Leases held in many named queues (large payloads) all come back at reopen, intact.
#[test]
fn leases_of_many_queues_with_large_payloads_return_at_reopen() {
    let f = Fixture::new();
    let n = 12;
    {
        let q = f.open();
        let mut held = Vec::new();
        for i in 0..n {
            let h = q.named(&format!("q.{i}")).unwrap();
            for j in 0..3u8 {
                h.enqueue(&big(i as u8 ^ j, 1025 + 1000 * j as usize), opts())
                    .unwrap();
            }
            held.push(h.dequeue().unwrap().unwrap());
            held.push(h.dequeue().unwrap().unwrap());
        }
        q.enqueue(&big(99, 5000), opts()).unwrap();
        held.push(q.dequeue().unwrap().unwrap());
        drop(held);
    }
    let q = f.open();
    assert_eq!(
        q.recovery().leases_returned,
        2 * n as u64 + 1,
        "{:?}",
        q.recovery()
    );
    assert_eq!(q.queue_names().unwrap().len(), n);
    assert_consistent(&q);
    for i in 0..n {
        let h = q.existing(&format!("q.{i}")).unwrap();
        let mut got = drain_payloads(&h);
        got.sort();
        let mut want: Vec<Vec<u8>> = (0..3u8)
            .map(|j| big(i as u8 ^ j, 1025 + 1000 * j as usize))
            .collect();
        want.sort();
        assert_eq!(got, want, "queue {i}");
    }
    assert_eq!(drain_payloads(&q), vec![big(99, 5000)]);
    assert_consistent(&q);
}

/// A payload row damaged three ways, in the default and in a named queue: check reports it,
/// a dequeue quarantines the job and delivers the rest, reads are `Corrupted`, `remove`
/// clears it all (its payload row too), check is clean again.
#[test]
fn a_damaged_payload_row_quarantines_its_job_only() {
    for (named, how) in [
        (false, Damage::Flip),
        (false, Damage::Delete),
        (false, Damage::Truncate),
        (true, Damage::Flip),
        (true, Damage::Delete),
        (true, Damage::Truncate),
    ] {
        let f = Fixture::new();
        let q = f.open();
        let (h, table) = if named {
            (q.named("n").unwrap(), "leaseq_q1_payloads")
        } else {
            (q.clone(), "leaseq_payloads")
        };
        let ids: Vec<JobId> = (0..3u8)
            .map(|i| {
                new_id(
                    h.enqueue(&big(i, 2048), opts().dedup_key([i]).idempotency_key([i]))
                        .unwrap(),
                )
            })
            .collect();
        damage(&q, table, ids[1], &how);
        let v = q.check().unwrap();
        assert!(v.iter().any(|v| v.job_id == Some(ids[1])), "check: {v:?}");
        assert!(
            is_corrupted(&h.payload(ids[1])),
            "payload read of damaged row"
        );
        // jobs() and job() still work before the dequeue.
        assert_eq!(h.jobs(JobState::Ready, None, 10).unwrap().jobs.len(), 3);
        let batch = h.dequeue_batch(10).unwrap();
        let got: Vec<_> = batch.iter().map(|l| l.payload().to_vec()).collect();
        assert_eq!(got, vec![big(0, 2048), big(2, 2048)]);
        let qd = h.quarantined(None, 10).unwrap();
        assert_eq!(qd.len(), 1);
        assert_eq!(qd[0].job_id, ids[1]);
        assert_eq!(h.stats().unwrap().quarantined, 1);
        assert!(is_corrupted(&h.job(ids[1])), "job() of quarantined");
        assert!(is_corrupted(&h.payload(ids[1])), "payload() of quarantined");
        assert!(h.dequeue().unwrap().is_none());
        // Its dedup key stays held by it until removed.
        assert!(matches!(
            h.enqueue(b"dup", opts().dedup_key([1u8])).unwrap(),
            Enqueued::Duplicate(id) if id == ids[1]
        ));
        for l in &batch {
            l.ack().unwrap();
        }
        // Removing through another queue's handle does nothing.
        let other = if named {
            q.clone()
        } else {
            q.named("other").unwrap()
        };
        assert!(matches!(
            other.remove(ids[1]),
            Err(Error::JobNotFound { .. })
        ));
        h.remove(ids[1]).unwrap();
        assert!(payload_row(&q, table, ids[1]).is_none());
        assert_eq!(payload_rows(&q, table), 0);
        assert!(h.quarantined(None, 10).unwrap().is_empty());
        assert!(matches!(
            h.enqueue(b"now new", opts().dedup_key([1u8])).unwrap(),
            Enqueued::New(_)
        ));
        assert_consistent(&q);
        // And the file reopens cleanly.
        drop((h, other, q));
        let q = f.open();
        assert_consistent(&q);
    }
}

/// A payload row removed while the job is leased: ack, nack then dequeue, and reopen all
/// go on without a panic; the job is quarantined at its next delivery.
#[test]
fn a_payload_row_lost_under_a_lease() {
    let f = Fixture::new();
    {
        let q = f.open();
        let h = q.named("n").unwrap();
        let a = new_id(h.enqueue(&big(1, 4000), opts()).unwrap());
        let b = new_id(h.enqueue(&big(2, 4000), opts()).unwrap());
        let c = new_id(h.enqueue(&big(3, 4000), opts()).unwrap());
        let la = h.dequeue().unwrap().unwrap();
        let lb = h.dequeue().unwrap().unwrap();
        let lc = h.dequeue().unwrap().unwrap();
        for id in [a, b, c] {
            damage(&q, "leaseq_q1_payloads", id, &Damage::Delete);
        }
        la.ack().unwrap();
        assert_eq!(lb.nack("again").unwrap(), JobState::Ready);
        lc.extend(Duration::from_secs(10)).unwrap();
        assert!(
            h.dequeue().unwrap().is_none(),
            "b quarantined on its redelivery"
        );
        assert_eq!(h.quarantined(None, 10).unwrap().len(), 1);
        drop(lc);
        let _ = c;
    }
    let q = f.open();
    assert_eq!(q.recovery().leases_returned, 1);
    let h = q.existing("n").unwrap();
    assert!(h.dequeue().unwrap().is_none(), "c quarantined");
    let qd = h.quarantined(None, 10).unwrap();
    assert_eq!(qd.len(), 2, "{qd:?}");
    for x in qd {
        h.remove(x.job_id).unwrap();
    }
    assert_consistent(&q);
}

/// The inline limit: 1024 bytes stay in the record, 1025 go apart; both round-trip in a
/// named queue, through `payload`, a lease and `ack_with` follow-ups.
#[test]
fn payloads_at_the_inline_limit() {
    let f = Fixture::new();
    let q = f.open();
    let h = q.named("edge").unwrap();
    let i1024 = new_id(h.enqueue(&big(7, 1024), opts()).unwrap());
    let i1025 = new_id(h.enqueue(&big(8, 1025), opts()).unwrap());
    let i0 = new_id(h.enqueue(b"", opts()).unwrap());
    assert!(payload_row(&q, "leaseq_q1_payloads", i1024).is_none());
    assert_eq!(
        payload_row(&q, "leaseq_q1_payloads", i1025).unwrap(),
        big(8, 1025)
    );
    assert_eq!(h.job(i1025).unwrap().unwrap().payload_bytes, 1025);
    assert_eq!(h.job(i1024).unwrap().unwrap().payload_bytes, 1024);
    assert_eq!(h.payload(i0).unwrap().unwrap(), b"");
    let l = h.dequeue().unwrap().unwrap();
    assert_eq!(l.payload(), big(7, 1024).as_slice());
    l.ack_with(|tx| {
        tx.enqueue_to(&q, &big(9, 1025), opts())?;
        tx.enqueue(&big(10, 1025), opts())?;
        Ok(())
    })
    .unwrap();
    assert_eq!(payload_rows(&q, "leaseq_payloads"), 1);
    assert_eq!(drain_payloads(&q), vec![big(9, 1025)]);
    assert_eq!(
        drain_payloads(&h),
        vec![big(8, 1025), b"".to_vec(), big(10, 1025)]
    );
    assert_eq!(payload_rows(&q, "leaseq_q1_payloads"), 0);
    assert_eq!(payload_rows(&q, "leaseq_payloads"), 0);
    assert_consistent(&q);
}

/// The batch byte budget in a named queue, with a damaged payload among the jobs.
#[test]
fn dequeue_batch_byte_budget_in_a_named_queue() {
    let f = Fixture::new();
    let q = f.builder().dequeue_batch_bytes(5000).open(&f.path).unwrap();
    let h = q.named("big").unwrap();
    let ids: Vec<JobId> = (0..6u8)
        .map(|i| new_id(h.enqueue(&big(i, 2000), opts()).unwrap()))
        .collect();
    let first = h.dequeue_batch(100).unwrap();
    assert_eq!(first.len(), 2);
    damage(&q, "leaseq_q1_payloads", ids[2], &Damage::Flip);
    let second = h.dequeue_batch(100).unwrap();
    // The damaged one is quarantined; the batch holds what the budget allows of the rest.
    assert!(!second.is_empty());
    let mut seen: Vec<JobId> = first.iter().chain(&second).map(|l| l.id()).collect();
    while let Ok(b) = h.dequeue_batch(100) {
        if b.is_empty() {
            break;
        }
        assert!(b.iter().map(|l| l.payload().len()).sum::<usize>() <= 5000 || b.len() == 1);
        seen.extend(b.iter().map(|l| l.id()));
    }
    seen.sort();
    assert_eq!(seen, vec![ids[0], ids[1], ids[3], ids[4], ids[5]]);
    assert_eq!(h.stats().unwrap().quarantined, 1);
    assert_eq!(
        q.stats().unwrap().quarantined,
        0,
        "the default queue's count is its own"
    );
}

/// `with_lease` on a named handle: its own deadline, name kept, the default handle unchanged.
#[test]
fn with_lease_on_a_named_handle() {
    let f = Fixture::new();
    let q = f.open();
    let h = q
        .named("short")
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap();
    assert_eq!(h.name(), Some("short"));
    assert!(matches!(
        h.with_lease(Duration::ZERO),
        Err(Error::InvalidOption { .. })
    ));
    assert!(matches!(
        h.with_lease(leaseq::LEASE_MAX + Duration::from_millis(1)),
        Err(Error::InvalidOption { .. })
    ));
    h.enqueue(b"a", opts()).unwrap();
    q.enqueue(b"b", opts()).unwrap();
    let now = common::T0_MS;
    let l = h.dequeue().unwrap().unwrap();
    assert_eq!(l.deadline_ms(), now + 5_000);
    let l2 = q.dequeue().unwrap().unwrap();
    assert_eq!(l2.deadline_ms(), now + common::LEASE.as_millis() as u64);
    // A plain handle of the same queue sees the expired lease once the clock passes 5 s.
    f.clock.advance(Duration::from_secs(6));
    let again = q
        .existing("short")
        .unwrap()
        .dequeue()
        .unwrap()
        .expect("expired lease redelivered");
    assert_eq!(again.attempt(), 2);
    assert!(matches!(l.ack(), Err(Error::LeaseLost { .. })));
    again.ack().unwrap();
    l2.ack().unwrap();
    assert_consistent(&q);
}

/// Names at the edges of the allowed set; case matters; names that look like table names.
#[test]
fn queue_names_at_the_edges() {
    let f = Fixture::new();
    let q = f.open();
    let good = [
        ".",
        "..",
        "-",
        "_",
        "A",
        "a",
        "leaseq_q1_jobs",
        "0",
        "a.b-c_D",
    ];
    for n in good {
        let h = q.named(n).unwrap();
        h.enqueue(n.as_bytes(), opts()).unwrap();
    }
    for bad in ["a\0", "a\n", " a", "a ", "ä", "a/b", "a:b", "\u{200b}"] {
        assert!(
            matches!(q.named(bad), Err(Error::InvalidOption { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(q.existing(bad), Err(Error::InvalidOption { .. })),
            "{bad:?}"
        );
    }
    let mut want: Vec<String> = good.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(q.queue_names().unwrap(), want);
    for n in good {
        let h = q.existing(n).unwrap();
        assert_eq!(drain_payloads(&h), vec![n.as_bytes().to_vec()], "{n}");
    }
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
}

/// Many queues, reopened: every one there with its jobs.
#[test]
fn many_queues_survive_reopen() {
    let f = Fixture::new();
    let n = 200;
    {
        let q = f.open_non_durable();
        for i in 0..n {
            let h = q.named(&format!("w{i:04}")).unwrap();
            h.enqueue(format!("{i}").as_bytes(), opts().dedup_key("same"))
                .unwrap();
        }
        q.flush().unwrap();
    }
    let q = f.open();
    assert_eq!(q.queue_names().unwrap().len(), n);
    assert_consistent(&q);
    for i in (0..n).rev() {
        let h = q.existing(&format!("w{i:04}")).unwrap();
        assert_eq!(drain_payloads(&h), vec![format!("{i}").into_bytes()]);
    }
}

/// A blocked consumer of queue B wakes for a job another queue's `ack_with` hands to B.
#[test]
fn enqueue_to_wakes_the_target_queues_consumer() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap();
    let b = q.named("b").unwrap();
    a.enqueue(b"x", opts()).unwrap();
    let consumer = {
        let b = b.clone();
        std::thread::spawn(move || b.dequeue_timeout(Duration::from_secs(30)).unwrap())
    };
    std::thread::sleep(Duration::from_millis(100));
    let started = std::time::Instant::now();
    let l = a.dequeue().unwrap().unwrap();
    l.ack_with(|tx| {
        tx.enqueue_to(&b, &big(1, 3000), opts())?;
        Ok(())
    })
    .unwrap();
    let got = consumer.join().unwrap().expect("a job");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(got.payload(), big(1, 3000).as_slice());
    got.ack().unwrap();
    assert_consistent(&q);
}

/// Idempotency keys equal across queues: each queue applies once.
#[test]
fn idempotency_keys_equal_across_queues() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap();
    let b = q.named("b").unwrap();
    for h in [&a, &b, &q] {
        h.enqueue(b"1", opts().idempotency_key("I")).unwrap();
        h.enqueue(b"2", opts().idempotency_key("I")).unwrap();
    }
    let mut outcomes = Vec::new();
    for (k, h) in [&a, &b, &q].into_iter().enumerate() {
        while let Some(l) = h.dequeue().unwrap() {
            outcomes.push((k, l.ack_with(|tx| bump(tx, k as u64)).unwrap()));
        }
    }
    assert_eq!(
        outcomes,
        vec![
            (0, Applied::Now),
            (0, Applied::AlreadyApplied),
            (1, Applied::Now),
            (1, Applied::AlreadyApplied),
            (2, Applied::Now),
            (2, Applied::AlreadyApplied),
        ]
    );
    let e = effects(&q);
    assert_eq!((e[&0], e[&1], e[&2]), (1, 1, 1));
    assert!(a.is_applied("I").unwrap() && b.is_applied("I").unwrap() && q.is_applied("I").unwrap());
    assert!(!q.named("c").unwrap().is_applied("I").unwrap());
    assert_consistent(&q);
}

/// `check` finds a payload row of no job even when, by count, another job's row is missing.
#[test]
fn check_reports_an_orphan_payload_row_beside_a_missing_one() {
    let f = Fixture::new();
    let q = f.open();
    let h = q.named("n").unwrap();
    let a = new_id(h.enqueue(&big(1, 2000), opts()).unwrap());
    let small = new_id(h.enqueue(b"small", opts()).unwrap());
    damage(&q, "leaseq_q1_payloads", a, &Damage::Delete);
    {
        // A stray row under the id of an inline job.
        let tx = q.database().begin_write().unwrap();
        tx.open_table(payloads_def("leaseq_q1_payloads"))
            .unwrap()
            .insert(small.0, &b"stray"[..])
            .unwrap();
        tx.commit().unwrap();
    }
    let v = q.check().unwrap();
    assert!(
        v.iter().any(|v| v.job_id == Some(a)),
        "missing row reported: {v:?}"
    );
    assert!(
        v.iter()
            .any(|v| v.job_id == Some(small) && v.detail.contains("payload row of no job")),
        "orphan row not reported: {v:#?}"
    );
}

/// `check` finds a payload row in the default queue's table that belongs to a named queue's
/// job (ids are unique in the file, so it is a row of no job of that queue).
#[test]
fn check_reports_a_payload_row_in_the_wrong_queues_table() {
    let f = Fixture::new();
    let q = f.open();
    let h = q.named("n").unwrap();
    let a = new_id(h.enqueue(&big(1, 2000), opts()).unwrap());
    {
        let tx = q.database().begin_write().unwrap();
        tx.open_table(payloads_def("leaseq_payloads"))
            .unwrap()
            .insert(a.0, big(1, 2000).as_slice())
            .unwrap();
        tx.commit().unwrap();
    }
    let v = q.check().unwrap();
    assert!(
        v.iter()
            .any(|v| v.job_id == Some(a) && v.detail.contains("payload row of no job")),
        "{v:#?}"
    );
}

/// Two registry names mapped to one queue number (a hostile disk): check says so.
#[test]
fn check_reports_two_names_for_one_queue_number() {
    let f = Fixture::new();
    let q = f.open();
    q.named("a").unwrap().enqueue(b"x", opts()).unwrap();
    {
        let tx = q.database().begin_write().unwrap();
        let def: TableDefinition<&str, u32> = TableDefinition::new("leaseq_queues");
        tx.open_table(def).unwrap().insert("b", 1).unwrap();
        tx.commit().unwrap();
    }
    // The registry is damaged: check, lookups and the next open say so (`Corrupted`), and
    // "b" never opens queue "a"'s tables.
    match q.check() {
        Ok(v) => assert!(
            !v.is_empty(),
            "two names share queue number 1, check is clean"
        ),
        Err(e) => assert!(matches!(e, Error::Corrupted { .. }), "{e:?}"),
    }
    assert!(
        matches!(q.existing("b"), Err(Error::Corrupted { .. })),
        "existing(\"b\") must not open queue a"
    );
    drop(q);
    assert!(matches!(
        f.builder().open(&f.path),
        Err(Error::Corrupted { .. })
    ));
}

/// A registry entry with a number out of range, or one whose tables do not exist: checking
/// and reopening are `Corrupted` (no panic, no storage error standing for damage).
#[test]
fn a_damaged_registry_never_panics() {
    for qid in [0u32, leaseq::QUEUES_MAX + 1, u32::MAX, 77] {
        let f = Fixture::new();
        {
            let q = f.open();
            q.named("real")
                .unwrap()
                .enqueue(&big(1, 2000), opts())
                .unwrap();
            let tx = q.database().begin_write().unwrap();
            let def: TableDefinition<&str, u32> = TableDefinition::new("leaseq_queues");
            tx.open_table(def).unwrap().insert("ghost", qid).unwrap();
            tx.commit().unwrap();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = q.queue_names();
                assert!(
                    matches!(q.check(), Err(Error::Corrupted { .. })),
                    "in-process check with number {qid}: {:?}",
                    q.check()
                );
                if let Ok(g) = q.existing("ghost") {
                    let _ = g.stats();
                    let _ = g.dequeue();
                    let _ = g.enqueue(b"x", opts());
                }
                let _ = q.named("another");
            }));
            assert!(r.is_ok(), "panic with registry number {qid}");
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f.builder().open(&f.path).map(|q| q.check())
        }));
        match r {
            Err(_) => panic!("open panicked with registry number {qid}"),
            Ok(Err(Error::Corrupted { .. })) => {}
            Ok(other) => panic!("registry number {qid}: the open gave {other:?}, not Corrupted"),
        }
    }
}

/// `ack_with_batch` in a named queue, each lease sending a large follow-up to another
/// queue; one closure failing keeps its follow-up out.
#[test]
fn ack_with_batch_fans_out_to_another_queue() {
    let f = Fixture::new();
    let q = f.open();
    let a = q.named("a").unwrap();
    let b = q.named("b").unwrap();
    for i in 0..4u8 {
        a.enqueue(&[i], opts()).unwrap();
    }
    let leases = a.dequeue_batch(4).unwrap();
    let out = a
        .ack_with_batch(&leases, |tx, l| {
            let i = l.payload()[0];
            tx.enqueue_to(&b, &big(i, 1500), opts().dedup_key([i % 2]))?;
            if i == 2 {
                return Err("two fails".into());
            }
            Ok(())
        })
        .unwrap();
    assert!(
        out[0].is_ok() && out[1].is_ok() && out[3].is_ok(),
        "{out:?}"
    );
    assert!(matches!(out[2], Err(Error::Effect(_))), "{out:?}");
    // Keys 0 and 1 taken by leases 0 and 1; lease 3's key 1 is a duplicate.
    let got = drain_payloads(&b);
    assert_eq!(got, vec![big(0, 1500), big(1, 1500)]);
    assert_eq!(a.len().unwrap(), 1);
    assert_eq!(payload_rows(&q, "leaseq_q2_payloads"), 0);
    assert_consistent(&q);
}
