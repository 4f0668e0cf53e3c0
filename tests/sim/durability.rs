//! Durability on the power-loss simulator (`--features sim`): what a returned `Ok` promises
//! when the power fails, with concurrent callers sharing group commits, and with
//! `Durability::None` plus `flush`.

use leaseq::sim::SimDisk;
use leaseq::{Durability, EnqueueOptions, ManualClock, Queue};
use std::collections::BTreeSet;
use std::sync::Mutex;

fn open(disk: &SimDisk, durability: Durability) -> leaseq::Result<Queue> {
    Queue::builder()
        .clock(ManualClock::new(1_000))
        .durability(durability)
        .open_backend(disk.backend())
}

fn reopen(disk: &SimDisk, seed: u64) -> (SimDisk, Queue) {
    let after = SimDisk::from_image(disk.crash_image(), seed);
    let q = open(&after, Durability::Immediate).expect("reopen after power loss");
    (after, q)
}

/// All job ids in the queue (drained).
fn drain_ids(q: &Queue) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    while let Some(l) = q.dequeue().unwrap() {
        assert!(ids.insert(l.id().0), "job {} delivered twice", l.id());
        l.ack().unwrap();
    }
    ids
}

// Four threads enqueue concurrently (their calls share group commits) until the power fails
// at a seeded random write or sync. Every enqueue that returned Ok must survive; a group
// whose commit did not finish must vanish whole: ids are handed out in commit order, so the
// surviving ids must be exactly 1..=n with no gap.
#[test]
fn sealed_groups_survive_power_loss_and_unsealed_ones_vanish_whole() {
    let (mut commits, mut operations) = (0, 0);
    for seed in 0..40u64 {
        let disk = SimDisk::new(seed);
        let q = open(&disk, Durability::Immediate).unwrap();
        let base = disk.mutating_ops();
        disk.crash_after(fastrand::Rng::with_seed(seed).u64(5..400));
        let acked = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let (q, acked) = (&q, &acked);
                s.spawn(move || {
                    for i in 0..200u32 {
                        match q.enqueue(&[t, i as u8], EnqueueOptions::default()) {
                            Ok(e) => acked.lock().unwrap().push(e.id().0),
                            Err(_) => return, // the power failed
                        }
                    }
                });
            }
        });
        assert!(
            disk.is_crashed(),
            "seed {seed}: the crash point was never reached"
        );
        assert!(disk.mutating_ops() > base);
        let stats = q.commit_stats();
        (commits, operations) = (commits + stats.commits, operations + stats.operations);
        drop(q);
        let (_disk, q) = reopen(&disk, seed);
        assert!(
            q.check().unwrap().is_empty(),
            "seed {seed}: {:?}",
            q.check()
        );
        let present = drain_ids(&q);
        for id in acked.lock().unwrap().iter() {
            assert!(
                present.contains(id),
                "seed {seed}: acknowledged job {id} lost"
            );
        }
        let n = present.len() as u64;
        assert_eq!(
            present,
            (1..=n).collect::<BTreeSet<_>>(),
            "seed {seed}: a partial group survived"
        );
    }
    // The point of the test: calls really shared commits.
    assert!(
        operations > commits,
        "{operations} operations in {commits} commits"
    );
}

// Durability::None returns before the fsync; `flush` makes everything so far durable.
#[test]
fn flush_makes_non_durable_enqueues_survive_power_loss() {
    for seed in 0..20u64 {
        let disk = SimDisk::new(seed);
        let q = open(&disk, Durability::None).unwrap();
        let ids: Vec<u64> = (0..30u8)
            .map(|i| q.enqueue(&[i], EnqueueOptions::default()).unwrap().id().0)
            .collect();
        q.flush().unwrap();
        disk.crash_now();
        drop(q);
        let (_disk, q) = reopen(&disk, seed);
        assert_eq!(
            drain_ids(&q),
            ids.into_iter().collect::<BTreeSet<_>>(),
            "seed {seed}"
        );
    }
}

// Durability::None still makes every 256th commit durable, even when groups that wrote
// nothing (refused calls) are mixed in.
#[test]
fn non_durable_mode_makes_every_256th_commit_durable() {
    let disk = SimDisk::new(7);
    let q = open(&disk, Durability::None).unwrap();
    let mut ids = Vec::new();
    for i in 0..600u32 {
        ids.push(
            q.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
                .unwrap()
                .id()
                .0,
        );
        if i % 3 == 2 {
            // A refused call: its group writes nothing and is not committed. Every fourth
            // group is one of these, so a rule that counted them would land the periodic
            // durable commit (group 255, 511, ...) on them every time.
            assert!(q.requeue_dead(leaseq::JobId(u64::MAX)).is_err());
        }
    }
    disk.crash_now();
    drop(q);
    let (_disk, q) = reopen(&disk, 7);
    let present = drain_ids(&q);
    assert!(
        present.len() >= 512,
        "only {} of 600 survived",
        present.len()
    );
    assert!(present.iter().all(|id| ids.contains(id)));
}

// A power loss inside the first open of an empty backend: the reopen gives a working empty
// queue, except when redb had not yet written its header (documented on `open_backend`).
#[test]
fn power_loss_during_first_open_of_a_backend_leaves_a_usable_queue() {
    let (mut usable, mut headerless) = (0, 0);
    for seed in 0..10u64 {
        for crash_at in 0..30u64 {
            let disk = SimDisk::new(seed);
            disk.crash_after(crash_at);
            let first = open(&disk, Durability::Immediate);
            if first.is_ok() && !disk.is_crashed() {
                continue; // the open finished before the crash point
            }
            drop(first);
            let after = SimDisk::from_image(disk.crash_image(), seed);
            match open(&after, Durability::Immediate) {
                Ok(q) => {
                    assert!(q.check().unwrap().is_empty());
                    q.enqueue(b"works", EnqueueOptions::default()).unwrap();
                    usable += 1;
                }
                Err(e) if e.to_string().contains("magic number") => headerless += 1,
                Err(e) => panic!("seed {seed}, crash at {crash_at}: {e:?}"),
            }
        }
    }
    assert!(
        usable > 0,
        "no crash point left a usable queue ({headerless} headerless)"
    );
}

// C17: an enqueue with a dedup key whose commit fails (power lost at each write and sync it
// makes) is an error; the handle refuses later writes; after the reopen the key either holds
// A (its commit was durable after all: in doubt, as documented) or is free: the next enqueue
// with the key is a new job, or a `Duplicate` naming a job that `job` finds. Never a key
// naming a job that is not there.
#[test]
fn c17_a_failed_enqueue_never_leaves_a_key_naming_a_missing_job() {
    let (mut new, mut duplicate, mut points) = (0, 0, 0);
    for seed in 0..4u64 {
        for i in 0..40u64 {
            let disk = SimDisk::new(seed);
            let q = open(&disk, Durability::Immediate).unwrap();
            disk.crash_after(i);
            let k = EnqueueOptions::default().dedup_key("k");
            let first = q.enqueue(b"A", k.clone());
            if first.is_ok() && !disk.is_crashed() {
                break; // past the enqueue's last write
            }
            points += 1;
            assert!(
                first.is_err(),
                "seed {seed} point {i}: Ok from a lost commit"
            );
            assert!(
                q.enqueue(b"B", k.clone()).is_err(),
                "the handle must refuse"
            );
            drop(q);
            let (_after, q) = reopen(&disk, seed);
            assert!(q.check().unwrap().is_empty(), "seed {seed} point {i}");
            match q.enqueue(b"B", k).unwrap() {
                leaseq::Enqueued::New(b) => {
                    new += 1;
                    assert_eq!(q.job(b).unwrap().unwrap().payload_bytes, 1);
                }
                leaseq::Enqueued::Duplicate(a) => {
                    duplicate += 1;
                    let info = q
                        .job(a)
                        .unwrap()
                        .expect("the key names a job that is there");
                    assert_eq!(q.len().unwrap(), 1, "{info:?}");
                }
                other => panic!("seed {seed} point {i}: {other:?}"),
            }
            assert!(q.check().unwrap().is_empty(), "seed {seed} point {i}");
        }
    }
    eprintln!(
        "c17: {points} crash points: key free after {new}, held by its job after {duplicate}"
    );
    assert!(points > 10, "only {points} crash points inside the enqueue");
    assert!(
        new > 0,
        "no crash point lost the enqueue ({duplicate} kept it)"
    );
}

// C11: a job A delayed 60 s beside a ready job B; at t = 30 s the dequeue that leases B meets
// a storage error (the disk fails at its commit); after the reopen, with no enqueue in
// between, B is delivered and a dequeue at t = 61 s delivers A: due times are read on every
// dequeue, not kept by a timer that the error could stop.
#[test]
fn c11_a_storage_error_on_a_dequeue_does_not_lose_a_due_time() {
    let disk = SimDisk::new(3);
    let clock = ManualClock::new(1_000);
    let q = Queue::builder()
        .clock(clock.clone())
        .open_backend(disk.backend())
        .unwrap();
    let a = q
        .enqueue(
            b"A",
            EnqueueOptions::default().delay(std::time::Duration::from_secs(60)),
        )
        .unwrap()
        .id();
    let b = q.enqueue(b"B", EnqueueOptions::default()).unwrap().id();
    clock.set_ms(31_000);
    disk.crash_after(0);
    assert!(q.dequeue().is_err(), "the dequeue meets the failed disk");
    drop(q);
    let after = SimDisk::from_image(disk.crash_image(), 3);
    let clock = ManualClock::new(31_000);
    let q = Queue::builder()
        .clock(clock.clone())
        .open_backend(after.backend())
        .unwrap();
    let l = q.dequeue().unwrap().expect("B, never leased durably");
    assert_eq!(l.id(), b);
    l.ack().unwrap();
    assert!(q.dequeue().unwrap().is_none(), "not due before 61 s");
    clock.set_ms(61_000);
    let l = q.dequeue().unwrap().expect("due at 61 s");
    assert_eq!((l.id(), l.attempt()), (a, 1));
    l.ack().unwrap();
    assert!(q.check().unwrap().is_empty());
}
