//! Named queues in one file (issue 10): each has its own jobs, order, dedup keys, applied
//! markers, dead letters, stats and defaults; consumers never see another queue's jobs; a
//! blocked consumer wakes for its own queue only; names are validated; an unknown name on a
//! call that does not create is a typed error; leases of every queue are recovered at open.

mod common;

use std::time::Duration;

use common::{Fixture, assert_consistent, bump, drain_payloads, new_id};
use leaseq::{Applied, EnqueueOptions, Enqueued, Error, JobState};

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
    // A returned lease goes to the back of its priority: "waiting" first.
    let got: Vec<(Vec<u8>, u32)> = w
        .dequeue_batch(10)
        .unwrap()
        .iter()
        .map(|l| (l.payload().to_vec(), l.attempt()))
        .collect();
    assert_eq!(got, vec![(b"waiting".to_vec(), 1), (b"held".to_vec(), 2)]);
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
    let q = f
        .builder()
        .durability(leaseq::Durability::None)
        .open(&f.path)
        .unwrap();
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
    match r {
        Err(Error::Effect(e)) => assert!(
            matches!(e.downcast_ref::<Error>(), Some(Error::InvalidOption { .. })),
            "{e:?}"
        ),
        other => panic!("{other:?}"),
    }
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
