//! The write-ahead journal on the power-loss simulator: the queue file and its journal as
//! two files on one power line (`SimDisk::sibling`, `Builder::open_backends`), power cut on
//! both at once. What a
//! returned `Ok` promises holds through the journal; a journal that is damaged, of another
//! file or ahead of its file is never replayed into the wrong queue.

use leaseq::sim::SimDisk;
use leaseq::{EnqueueOptions, JobState, JournalFound, ManualClock, Queue};
use std::collections::BTreeSet;

/// The queue file and its journal.
struct Pair {
    file: SimDisk,
    journal: SimDisk,
}

impl Pair {
    fn new(seed: u64) -> Pair {
        let file = SimDisk::new(seed);
        let journal = file.sibling(seed ^ 0x5151);
        Pair { file, journal }
    }

    /// The crash images `file` and `journal` on fresh disks of one line.
    fn from_images(file: Vec<u8>, journal: Vec<u8>, seed: u64) -> Pair {
        let file = SimDisk::from_image(file, seed);
        let journal = file.sibling_from_image(journal, seed ^ 1);
        Pair { file, journal }
    }

    fn open(&self) -> leaseq::Result<Queue> {
        Queue::builder()
            .clock(ManualClock::new(1_000))
            .open_backends(self.file.backend(), self.journal.backend())
    }

    /// Power cut on the line now (both files).
    fn cut(&self) {
        if !self.file.is_crashed() {
            self.file.crash_now();
        }
    }

    /// What survives the cut, on fresh disks.
    fn reboot(&self, seed: u64) -> Pair {
        Pair::from_images(self.file.crash_image(), self.journal.crash_image(), seed)
    }
}

/// Every job of the queue by state.
fn ids(q: &Queue, state: JobState) -> BTreeSet<u64> {
    q.jobs(state, None, 10_000)
        .unwrap()
        .jobs
        .iter()
        .map(|j| j.id.0)
        .collect()
}

// Calls answered Ok through journal frames (no checkpoint since the open) survive a power
// cut on both files; the queue file's own durable image does not hold them (they were
// really journaled), and the replay reports its frames.
#[test]
fn answered_calls_survive_a_power_cut_through_the_journal() {
    for seed in 0..20u64 {
        let pair = Pair::new(seed);
        let q = pair.open().unwrap();
        let mut ready = BTreeSet::new();
        for i in 0..30u32 {
            ready.insert(
                q.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
                    .unwrap()
                    .id()
                    .0,
            );
        }
        let mut completed = BTreeSet::new();
        let mut leased = BTreeSet::new();
        for i in 0..10 {
            let l = q.dequeue().unwrap().unwrap();
            ready.remove(&l.id().0);
            if i % 2 == 0 {
                completed.insert(l.id().0);
                l.ack().unwrap();
            } else {
                leased.insert(l.id().0);
                std::mem::forget(l);
            }
        }
        let stats = q.commit_stats();
        assert!(stats.journal_frames >= 30, "{stats:?}");
        assert_eq!(stats.checkpoints, 0, "{stats:?}");
        pair.cut();
        drop(q);
        let after = pair.reboot(seed + 100);
        // The queue file alone: the queue as of its last checkpoint (the open), consistent.
        let alone = Queue::builder()
            .clock(ManualClock::new(2_000))
            .open_backend(SimDisk::from_image(pair.file.crash_image(), 7).backend())
            .unwrap();
        assert_eq!(alone.recovery().journal, JournalFound::Missing);
        assert_eq!(alone.stats().unwrap().total, 0);
        assert_eq!(alone.check().unwrap(), vec![]);
        drop(alone);
        // Both: every answered call is there; the leases come back at open.
        let q = after.open().unwrap();
        let r = q.recovery();
        assert!(
            matches!(r.journal, JournalFound::Replayed(n) if n >= 30),
            "{r:?}"
        );
        assert_eq!(r.leases_returned, leased.len() as u64, "{r:?}");
        let mut want_ready = ready.clone();
        want_ready.extend(&leased);
        assert_eq!(ids(&q, JobState::Ready), want_ready, "seed {seed}");
        for id in &completed {
            assert!(
                q.job(leaseq::JobId(*id)).unwrap().is_none(),
                "seed {seed}: {id}"
            );
        }
        assert_eq!(q.check().unwrap(), vec![]);
        // New ids never repeat an id handed out before the cut.
        let next = q.enqueue(b"new", EnqueueOptions::default()).unwrap().id().0;
        assert!(next > *ready.iter().chain(&completed).max().unwrap());
    }
}

// A power cut inside a call, at every write or sync of either file in turn, during a run
// of enqueues, dequeues, acks and ack_with (a checkpoint): every call answered Ok survives,
// every effect is there once and with its ack, and the queue checks clean.
#[test]
fn a_power_cut_at_every_write_of_either_file_keeps_every_answered_call() {
    let mut cuts = 0;
    for at in 0..160u64 {
        let pair = Pair::new(at);
        let q = pair.open().unwrap();
        // Even: the queue file fails at its (at/2)th mutating call from here; odd: the
        // journal. The other loses power at the same moment.
        let target = if at % 2 == 0 {
            &pair.file
        } else {
            &pair.journal
        };
        target.crash_after(at / 2);
        let mut enqueued = BTreeSet::new();
        let mut acked = BTreeSet::new();
        let mut effects = BTreeSet::new();
        let mut crashed = false;
        let mut in_doubt = None;
        for step in 1..=60u32 {
            let r: leaseq::Result<()> = (|| {
                match step % 4 {
                    0 | 1 => {
                        enqueued.insert(
                            q.enqueue(&step.to_le_bytes(), EnqueueOptions::default())?
                                .id()
                                .0,
                        );
                    }
                    2 => {
                        if let Some(l) = q.dequeue()? {
                            let id = l.id().0;
                            in_doubt = Some(id);
                            l.ack()?;
                            in_doubt = None;
                            acked.insert(id);
                        }
                    }
                    _ => {
                        if let Some(l) = q.dequeue()? {
                            let id = l.id().0;
                            in_doubt = Some(id);
                            l.ack_with(|tx| crate::common::bump(tx, id))?;
                            in_doubt = None;
                            effects.insert(id);
                        }
                    }
                }
                Ok(())
            })();
            if r.is_err() || target.is_crashed() {
                crashed = true;
                break;
            }
        }
        if !crashed {
            continue;
        }
        cuts += 1;
        pair.cut();
        drop(q);
        let after = pair.reboot(at + 1000);
        let q = after
            .open()
            .unwrap_or_else(|e| panic!("cut at {at}: {e:?}"));
        assert_eq!(q.check().unwrap(), vec![], "cut at {at}");
        // Gone: acked (no history is kept by default).
        let gone = |id: u64| q.job(leaseq::JobId(id)).unwrap().is_none();
        let stored = crate::common::effects(&q);
        for id in &enqueued {
            if !acked.contains(id) && !effects.contains(id) && gone(*id) {
                // Only the call the cut interrupted may have acked a job unanswered.
                assert!(
                    in_doubt == Some(*id),
                    "cut at {at}: job {id} enqueued Ok and lost"
                );
            }
        }
        for id in acked.iter().chain(&effects) {
            assert!(gone(*id), "cut at {at}: job {id} acked Ok and still there");
        }
        for id in &effects {
            assert_eq!(stored.get(id), Some(&1), "cut at {at}: job {id}'s effect");
        }
        for (id, n) in &stored {
            assert_eq!(*n, 1, "cut at {at}: job {id}'s effect applied {n} times");
            assert!(gone(*id), "cut at {at}: job {id}'s effect without its ack");
        }
    }
    assert!(cuts >= 150, "only {cuts} cuts landed inside the run");
}

// The journal of another queue file (its own session) is never replayed into this one,
// and a journal whose frames are past the file's checkpoint (the file an older copy) is
// not replayed either: both open as the file holds them.
#[test]
fn a_journal_of_another_file_or_ahead_of_it_is_never_replayed() {
    let a = Pair::new(1);
    let qa = a.open().unwrap();
    for i in 0..5u8 {
        qa.enqueue(&[i], EnqueueOptions::default()).unwrap();
    }
    a.cut();
    drop(qa);
    let b = Pair::new(2);
    let qb = b.open().unwrap();
    qb.enqueue(b"b", EnqueueOptions::default()).unwrap();
    qb.flush().unwrap();
    b.cut();
    drop(qb);
    // b's file with a's journal.
    let mixed = Pair::from_images(b.file.crash_image(), a.journal.crash_image(), 3);
    let q = mixed.open().unwrap();
    assert_eq!(q.recovery().journal, JournalFound::Nothing);
    assert_eq!(q.stats().unwrap().total, 1);
    assert_eq!(q.check().unwrap(), vec![]);
    drop(q);

    // An older copy of a file beside its newer journal: the file at a checkpoint, then
    // frames, a checkpoint and frames again.
    let c = Pair::new(5);
    let q = c.open().unwrap();
    q.enqueue(b"1", EnqueueOptions::default()).unwrap();
    q.flush().unwrap();
    let old_file = c.file.durable_image();
    q.enqueue(b"2", EnqueueOptions::default()).unwrap();
    q.flush().unwrap();
    q.enqueue(b"3", EnqueueOptions::default()).unwrap();
    c.cut();
    drop(q);
    let copy = Pair::from_images(old_file, c.journal.crash_image(), 6);
    let q = copy.open().unwrap();
    assert_eq!(q.recovery().journal, JournalFound::Ahead);
    assert_eq!(q.stats().unwrap().total, 1, "the copy as it was");
    assert_eq!(q.check().unwrap(), vec![]);
}

// Damage anywhere in the journal's frames: the open replays the whole frames before the
// damage (a prefix of what was answered) or refuses with a typed error, never panics, and
// the queue checks clean.
#[test]
fn a_damaged_journal_is_a_clean_replay_or_a_typed_error() {
    let pair = Pair::new(9);
    let q = pair.open().unwrap();
    let mut enqueued = Vec::new();
    for i in 0..20u32 {
        enqueued.push(
            q.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
                .unwrap()
                .id()
                .0,
        );
    }
    pair.cut();
    drop(q);
    let file = pair.file.crash_image();
    let journal = pair.journal.crash_image();
    let used = crate::sim_model::corrupt::journal_used(&journal);
    assert!(used > 4096, "no frame written");
    let mut rng = fastrand::Rng::with_seed(11);
    let mut replayed_some = 0;
    for round in 0..60 {
        let mut bad = journal.clone();
        let at = if round < 8 {
            4096 + round * 37
        } else {
            rng.usize(4096..used)
        };
        bad[at] ^= 1 << rng.u8(0..8);
        let damaged = Pair::from_images(file.clone(), bad, round as u64);
        match damaged.open() {
            Ok(q) => {
                assert_eq!(q.check().unwrap(), vec![], "damage at {at}");
                let have = ids(&q, JobState::Ready);
                // A prefix of the enqueues: the frames before the damage.
                let n = have.len();
                assert_eq!(
                    have,
                    enqueued[..n].iter().copied().collect::<BTreeSet<_>>(),
                    "damage at {at}"
                );
                replayed_some += usize::from(n > 0);
            }
            Err(e) => assert!(
                matches!(e, leaseq::Error::Corrupted { .. }),
                "damage at {at}: {e:?}"
            ),
        }
    }
    assert!(replayed_some > 10, "{replayed_some}");
}

/// The rich queue of the `open_corrupt` fuzz target written through the journal and killed
/// (jobs in every state, schedules in two queues, ordered groups, rate limits, history,
/// effects): its open replays frames, and what it opens is the same queue as the one written
/// without the journal, job by job. So every kind of change the committer records (each
/// table's puts, removes and creates) replays to what redb itself committed.
#[test]
fn the_killed_fuzz_queue_replays_to_the_queue_written_without_the_journal() {
    use crate::sim_model::{T0_MS, corrupt};
    let clock = || ManualClock::new(T0_MS + 10_000);
    for schedules in [false, true] {
        let (_, (file, journal)) = corrupt::journaled_images(schedules);
        let plain = if schedules {
            &corrupt::scheduled_images().1
        } else {
            &corrupt::base_images().1
        };
        let pair = Pair::from_images(file.clone(), journal.clone(), 3);
        let q = corrupt::builder(&clock())
            .open_backends(pair.file.backend(), pair.journal.backend())
            .unwrap();
        let JournalFound::Replayed(n) = q.recovery().journal else {
            panic!("nothing replayed: {:?}", q.recovery());
        };
        assert!(n >= 3, "{n} frames");
        let disk = SimDisk::from_image(plain.clone(), 3);
        let p = corrupt::builder(&clock())
            .open_backend(disk.backend())
            .unwrap();
        assert_eq!(q.recovery().leases_returned, p.recovery().leases_returned);
        assert_eq!(q.check().unwrap(), vec![]);
        let mut seen = 0;
        for id in 1..80 {
            let (a, b) = (
                q.job(leaseq::JobId(id)).unwrap(),
                p.job(leaseq::JobId(id)).unwrap(),
            );
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "job {id}");
            seen += usize::from(a.is_some());
        }
        assert!(seen > 20, "{seen} jobs");
        assert_eq!(
            format!("{:?}", q.schedules()),
            format!("{:?}", p.schedules())
        );
        assert_eq!(
            format!("{:?}", q.rate_limit()),
            format!("{:?}", p.rate_limit())
        );
        assert_eq!(q.queue_names().unwrap(), p.queue_names().unwrap());
        for k in 0..5 {
            assert_eq!(
                q.is_applied(format!("k{k}")).unwrap(),
                p.is_applied(format!("k{k}")).unwrap()
            );
        }
    }
}

/// A byte of the killed fuzz queue's journal XORed, for every byte of every frame's head and
/// checksum, a stride through the bodies, the journal header and the bytes just past the
/// last frame: the open replays exactly the frames before the damaged one (all of them when
/// the damage is past them), or refuses a damaged journal header (`NotLeaseq`, the journal
/// left as it is); the queue checks clean.
#[test]
fn damage_in_a_frame_replays_exactly_the_frames_before_it() {
    use crate::sim_model::{T0_MS, corrupt};
    let (_, (file, journal)) = corrupt::journaled_images(true);
    let open = |journal: Vec<u8>| {
        let pair = Pair::from_images(file.clone(), journal, 5);
        corrupt::builder(&ManualClock::new(T0_MS + 10_000))
            .open_backends(pair.file.backend(), pair.journal.backend())
    };
    let JournalFound::Replayed(n) = open(journal.clone()).unwrap().recovery().journal else {
        panic!("the killed image replays nothing");
    };
    // The frames after the last checkpoint start at byte 4096, one after the other.
    let mut frames = Vec::new();
    let mut at = 4096;
    for _ in 0..n {
        let word = |o: usize| u32::from_le_bytes(journal[o..o + 4].try_into().unwrap());
        assert_eq!(word(at), 0x4c51_4652, "frame {} at {at}", frames.len());
        let len = 24 + word(at + 4) as usize + 8;
        frames.push(at..at + len);
        at += len;
    }
    let end = at;
    let mut flips: Vec<usize> = (0..32).chain(end..end + 64).collect();
    for f in &frames {
        flips.extend(f.start..f.start + 24);
        flips.extend((f.start + 24..f.end - 8).step_by(61));
        flips.extend(f.end - 8..f.end);
    }
    let masks = [0x01u8, 0x80, 0xFF, 0x2E];
    for (k, &at) in flips.iter().enumerate() {
        let mut bad = journal.clone();
        bad[at] ^= masks[k % masks.len()];
        let outcome = open(bad);
        if at < 32 {
            assert!(
                matches!(outcome, Err(leaseq::Error::NotLeaseq { .. })),
                "header byte {at}: {:?}",
                outcome.map(|q| q.recovery())
            );
            continue;
        }
        let q = outcome.unwrap_or_else(|e| panic!("byte {at}: {e:?}"));
        let before = frames
            .iter()
            .position(|f| f.contains(&at))
            .unwrap_or(frames.len());
        let want = if before == 0 {
            JournalFound::Nothing
        } else {
            JournalFound::Replayed(before as u64)
        };
        assert_eq!(q.recovery().journal, want, "byte {at}");
        assert_eq!(q.check().unwrap(), vec![], "byte {at}");
    }
    assert!(flips.len() > 300, "{} flips", flips.len());
}
