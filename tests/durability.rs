//! Durability on the power-loss simulator (`--features sim`): what a returned `Ok` promises
//! when the power fails, with concurrent callers sharing group commits, and with
//! `Durability::None` plus `flush`.

use std::collections::BTreeSet;
use std::sync::Mutex;

use leaseq::sim::SimDisk;
use leaseq::{Durability, EnqueueOptions, ManualClock, Queue};

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
