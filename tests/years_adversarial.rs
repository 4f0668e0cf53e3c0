//! Adversarial tests of the "run for years" work (issue 9): the retry policy through the API,
//! applied-marker retention on every path that creates or deletes jobs (also from threads
//! sharing group commits), paging, dead-letter tools on damaged data, compaction after
//! failures, and the upgrade of a format-1 file with damaged rows.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Fixture, T0_MS, all_ok, assert_consistent, bump, flip_record_byte};
use leaseq::{
    Applied, EnqueueOptions, Enqueued, Error, JobId, JobInfo, JobState, Queue, RetryPolicy,
};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// leaseq's own tables, written behind its back to plant damage or an older format.
const DEAD: TableDefinition<u64, ()> = TableDefinition::new("leaseq_dead");
const APPLIED: TableDefinition<&[u8], u64> = TableDefinition::new("leaseq_applied");
const APPLIED_BY_TIME: TableDefinition<(u64, &[u8]), ()> =
    TableDefinition::new("leaseq_applied_by_time");
const IDEM_JOBS: TableDefinition<(&[u8], u64), ()> = TableDefinition::new("leaseq_idem_jobs");
const META: TableDefinition<&str, u64> = TableDefinition::new("leaseq_meta");

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn keyed(k: &str) -> EnqueueOptions {
    EnqueueOptions::default().idempotency_key(k)
}

fn retained(f: &Fixture, retention: Duration) -> Queue {
    f.builder()
        .applied_retention(Some(retention))
        .open(&f.path)
        .unwrap()
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

trait ClockNow {
    fn clock_now(&self) -> u64;
}

impl ClockNow for Fixture {
    fn clock_now(&self) -> u64 {
        use leaseq::Clock;
        self.clock.now_ms()
    }
}

// ---------------------------------------------------------------------------------------
// Applied-marker retention
// ---------------------------------------------------------------------------------------

/// `Builder::applied_retention` says "whole milliseconds, from 1 ms to DELAY_MAX, checked at
/// open". A retention below 1 ms (500 µs) is accepted and becomes 0 ms: the marker an
/// `ack_with` writes is pruned by the same `ack_with` (its own prune runs after it), so the
/// effect is applied again by the very next duplicate, with no time passing at all.
#[test]

fn sub_millisecond_retention_is_refused_or_keeps_markers() {
    let f = Fixture::new();
    match f
        .builder()
        .applied_retention(Some(Duration::from_micros(500)))
        .open(&f.path)
    {
        Err(Error::InvalidOption {
            field: "applied_retention",
            ..
        }) => {}
        Err(e) => panic!("{e}"),
        Ok(q) => {
            q.enqueue(b"A", keyed("K")).unwrap();
            let a = q.dequeue().unwrap().unwrap();
            assert_eq!(a.ack_with(|tx| bump(tx, 1)).unwrap(), Applied::Now);
            assert!(q.is_applied("K").unwrap(), "marker gone in its own commit");
            // The producer retries at the same instant.
            q.enqueue(b"A2", keyed("K")).unwrap();
            let a2 = q.dequeue().unwrap().unwrap();
            assert_eq!(
                a2.ack_with(|tx| bump(tx, 1)).unwrap(),
                Applied::AlreadyApplied,
                "the duplicate, at the same instant, ran the effect again"
            );
        }
    }
}

/// Every path that creates or deletes jobs keeps `leaseq_idem_jobs` right, so a marker is
/// never pruned while a live job carries its key: `enqueue_batch` with duplicate dedup keys
/// (the dropped duplicate carries nothing), `remove`, `purge` of each state, `requeue_dead_all`,
/// a batch ack of jobs sharing a key, a reopen that returns a lease, and a quarantine.
#[test]
fn markers_follow_their_carriers_through_every_path() {
    let f = Fixture::new();
    let q = retained(&f, ms(10));
    let apply = |k: &str| {
        q.enqueue(b"first", keyed(k)).unwrap();
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.ack_with(|tx| bump(tx, 0)).unwrap(), Applied::Now, "{k}");
    };
    for k in ["B", "R", "P", "S", "D", "Q", "L", "X"] {
        apply(k);
    }
    // B: a batch whose second record is a dedup duplicate carrying another key.
    let out = q
        .enqueue_batch([
            (&b"b1"[..], keyed("B").dedup_key("d")),
            (&b"b2"[..], keyed("X").dedup_key("d")),
        ])
        .unwrap();
    let b1 = out[0].id();
    assert_eq!(out[1], Enqueued::Duplicate(b1));
    // R: ready, removed later; P: ready, purged later; S: scheduled; D: dead, requeued;
    // Q: quarantined; L: leased when the process "crashes".
    let r = q.enqueue(b"r", keyed("R")).unwrap().id();
    let p = q.enqueue(b"p", keyed("P")).unwrap().id();
    let s = q.enqueue(b"s", keyed("S").delay(secs(3600))).unwrap().id();
    let d = q.enqueue(b"d", keyed("D").max_attempts(1)).unwrap().id();
    let qq = q.enqueue(b"q", keyed("Q")).unwrap().id();
    let l = q.enqueue(b"l", keyed("L")).unwrap().id();
    // Take them all, give back all but L and D (D dies at its one attempt).
    let taken = q.dequeue_batch(7).unwrap();
    assert_eq!(taken.len(), 6, "all but the scheduled one");
    for lease in &taken {
        if lease.id() == d {
            lease.nack("die").unwrap();
        } else if lease.id() != l {
            lease.nack("back").unwrap();
        }
    }
    drop(taken);
    flip_record_byte(&q, qq, 3, 0x5A);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 1, "only X is uncarried");
    assert!(!q.is_applied("X").unwrap());
    drop(q);
    // Reopen: L's lease comes back; Q's damaged row gets quarantined by a dequeue.
    let q = retained(&f, ms(10));
    assert_eq!(q.recovery().leases_returned, 1);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 0, "every key still carried");
    assert_eq!(q.requeue_dead_all().unwrap(), 1);
    let all: Vec<_> = std::iter::from_fn(|| q.dequeue().unwrap()).collect();
    assert_eq!(q.stats().unwrap().quarantined, 1);
    let ids: BTreeSet<JobId> = all.iter().map(|l| l.id()).collect();
    assert!(ids.contains(&d) && ids.contains(&l) && !ids.contains(&qq));
    for lease in &all {
        lease.nack_after("back", Duration::ZERO).unwrap();
    }
    drop(all);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 0, "still carried after requeue");
    for k in ["B", "R", "P", "S", "D", "Q", "L"] {
        assert!(q.is_applied(k).unwrap(), "{k}");
    }
    // Now end each carrier; the marker goes only once its last carrier is gone.
    q.remove(r).unwrap();
    assert_eq!(q.purge(JobState::Scheduled).unwrap(), 1);
    let _ = s;
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 2, "R and S");
    q.remove(qq).unwrap();
    assert_eq!(q.purge(JobState::Ready).unwrap(), 3, "B, P, L");
    assert_eq!(
        q.job(d).unwrap().unwrap().state,
        JobState::Dead,
        "its one attempt"
    );
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 4, "B, P, L, Q");
    assert!(q.is_applied("D").unwrap(), "carried by dead D");
    assert_eq!(q.purge(JobState::Dead).unwrap(), 1);
    let _ = (p, b1);
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 1);
    assert_eq!(q.stats().unwrap().applied, 0);
    assert_consistent(&q);
}

/// A batch ack of two leases sharing a key, the first closure failing: the second applies
/// the effect (marker written), the first job is given back and, delivered again, finds the
/// marker. A replay after a failing closure never leaves a marker without its time index.
#[test]
fn failing_closure_in_a_batch_sharing_a_key() {
    let f = Fixture::new();
    let q = retained(&f, ms(5));
    q.enqueue(b"a", keyed("K")).unwrap();
    q.enqueue(b"b", keyed("K")).unwrap();
    for i in 0..20 {
        q.enqueue(b"old", keyed(&format!("old{i}"))).unwrap();
    }
    let olds = q.dequeue_batch(22).unwrap();
    let (ab, olds) = olds.split_at(2);
    all_ok(q.ack_with_batch(olds, |_, _| Ok(())).unwrap());
    f.clock.advance(ms(6));
    let out = q
        .ack_with_batch(ab, |tx, l| {
            if l.payload() == b"a" {
                Err("a fails".into())
            } else {
                bump(tx, 1)
            }
        })
        .unwrap();
    assert!(matches!(out[0], Err(Error::Effect(_))), "{out:?}");
    assert_eq!(out[1].as_ref().unwrap(), &Applied::Now);
    assert_eq!(
        q.stats().unwrap().applied,
        1 + 20 - 2,
        "one new marker, two pruned"
    );
    assert_consistent(&q);
    let again = q.dequeue().unwrap().unwrap();
    assert_eq!(again.payload(), b"a");
    assert_eq!(
        again.ack_with(|tx| bump(tx, 1)).unwrap(),
        Applied::AlreadyApplied
    );
    assert_eq!(common::effects(&q).get(&1), Some(&1));
    assert_consistent(&q);
}

/// Threads share group commits: producers enqueue keyed jobs (keys reused across threads),
/// consumers `ack_with` them (some closures failing, so groups abort and replay), a pruner
/// prunes and the clock moves, retention 3 ms. Afterwards the markers, their time index and
/// the carrier index agree (`check`), and once the horizon passes every marker goes.
#[test]
fn concurrent_ack_with_and_prune_keep_the_time_index_right() {
    let f = Fixture::new();
    let q = f
        .builder()
        .applied_retention(Some(ms(3)))
        .max_attempts(100)
        .durability(leaseq::Durability::None)
        .open(&f.path)
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let q = q.clone();
            s.spawn(move || {
                for i in 0..300u64 {
                    let k = format!("k{}", (i * 7 + t) % 40);
                    q.enqueue(b"x", keyed(&k)).unwrap();
                }
            });
        }
        for t in 0..3u64 {
            let q = q.clone();
            let stop = stop.clone();
            s.spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || !q.is_empty().unwrap() {
                    match q.dequeue().unwrap() {
                        Some(l) => {
                            n += 1;
                            let fail = (n + t).is_multiple_of(5);
                            let _ = l.ack_with(|tx| {
                                if fail {
                                    Err("flaky".into())
                                } else {
                                    bump(tx, l.id().0)
                                }
                            });
                        }
                        None => std::thread::yield_now(),
                    }
                }
            });
        }
        {
            let q = q.clone();
            let clock = f.clock.clone();
            let stop = stop.clone();
            s.spawn(move || {
                for _ in 0..200 {
                    clock.advance(ms(1));
                    q.prune().unwrap();
                    std::thread::sleep(ms(1));
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    assert!(q.is_empty().unwrap());
    assert_consistent(&q);
    f.clock.advance(ms(4));
    q.prune().unwrap();
    assert_eq!(q.stats().unwrap().applied, 0);
    assert_consistent(&q);
}

/// `Queue::prune` is bounded per commit and finishes: 25,000 expired markers of which 12,000
/// are carried by live jobs (their retention restarts); one prune removes the 13,000 others.
#[test]
fn prune_finishes_with_many_carried_markers() {
    let f = Fixture::new();
    let q = f
        .builder()
        .applied_retention(Some(ms(10)))
        .durability(leaseq::Durability::None)
        .open(&f.path)
        .unwrap();
    for chunk in 0..5 {
        q.enqueue_batch((0..5_000).map(|i| (&b"x"[..], keyed(&format!("k{chunk}-{i}")))))
            .unwrap();
        let batch = q.dequeue_batch(5_000).unwrap();
        all_ok(q.ack_with_batch(&batch, |_, _| Ok(())).unwrap());
    }
    // Carriers of the keys of chunks 0, 1 and the first 2,000 of chunk 2.
    for chunk in 0..3 {
        let n = if chunk == 2 { 2_000 } else { 5_000 };
        q.enqueue_batch((0..n).map(|i| (&b"y"[..], keyed(&format!("k{chunk}-{i}")))))
            .unwrap();
    }
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 13_000);
    assert_eq!(q.stats().unwrap().applied, 12_000);
    assert_eq!(q.prune().unwrap().applied, 0);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Listing, payloads, dead-letter tools
// ---------------------------------------------------------------------------------------

/// In a stable queue every page size, including ones that divide the count exactly, lists
/// every job of a state once, in the state's order. At an exact boundary the last full page
/// still has a `next`, and the page after it is empty with `next: None` (`JobPage::next`'s
/// doc says `None` "if this page reached the end": it is only `None` on a short page).
#[test]
fn paging_never_skips_or_repeats_at_any_page_size() {
    let f = Fixture::new();
    let q = f.open();
    // 12 ready of mixed priorities, 12 scheduled with equal and distinct due times, 12 dead,
    // 12 leased with equal deadlines.
    for i in 0..12i32 {
        q.enqueue(b"r", EnqueueOptions::default().priority(i % 3 - 1))
            .unwrap();
    }
    let leased = q.dequeue_batch(12).unwrap();
    for i in 0..12u64 {
        q.enqueue(b"d", EnqueueOptions::default()).unwrap();
        q.enqueue(b"s", EnqueueOptions::default().delay(secs(60 + i % 2)))
            .unwrap();
    }
    let dying = q.dequeue_batch(12).unwrap();
    for l in &dying {
        l.fail("dead").unwrap();
    }
    drop(dying);
    for i in 0..12i32 {
        q.enqueue(b"r", EnqueueOptions::default().priority(1 - i % 3))
            .unwrap();
    }
    let want_ready: Vec<JobId> = {
        let (jobs, _) = all_pages(&q, JobState::Ready, 1_000);
        jobs.iter().map(|j| j.id).collect()
    };
    for state in [
        JobState::Ready,
        JobState::Scheduled,
        JobState::Leased,
        JobState::Dead,
    ] {
        let (whole, sizes) = all_pages(&q, state, 1_000);
        assert_eq!(whole.len(), 12, "{state:?}");
        assert_eq!(sizes, [12]);
        for limit in 1..=13 {
            let (paged, sizes) = all_pages(&q, state, limit);
            assert_eq!(paged, whole, "{state:?} limit {limit}");
            if 12 % limit == 0 {
                assert_eq!(sizes.last(), Some(&0), "{state:?} limit {limit}: {sizes:?}");
            }
        }
    }
    // Ready is listed in dequeue order.
    drop(leased);
    let got: Vec<JobId> = q
        .dequeue_batch(12)
        .unwrap()
        .iter()
        .map(|l| l.id())
        .collect();
    assert_eq!(got, want_ready);
}

/// `Queue::payload`'s doc: "`Corrupted` if its row is damaged or quarantined". For a
/// quarantined job it answers `Ok(None)` ("no job has this id"), unlike `Queue::job`, which
/// answers `Corrupted` for the same id.
#[test]

fn payload_of_a_quarantined_job_is_corrupted() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"precious", EnqueueOptions::default())
        .unwrap()
        .id();
    flip_record_byte(&q, id, 5, 0x5A);
    assert!(matches!(q.payload(id), Err(Error::Corrupted { .. })));
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().quarantined, 1);
    assert!(matches!(q.job(id), Err(Error::Corrupted { .. })));
    let r = q.payload(id);
    assert!(matches!(r, Err(Error::Corrupted { .. })), "{r:?}");
}

/// `requeue_dead_all` and `purge(Dead)` over damaged data: a dead-letter entry naming no
/// job, a damaged dead row, good dead jobs. Only the good ones are counted; the stray entry
/// is dropped, the damaged row quarantined; nothing stops the pass and `check` is clean once
/// the quarantined row is removed.
#[test]
fn dead_letter_tools_on_damaged_data() {
    for purge in [false, true] {
        let f = Fixture::new();
        let q = f.open();
        for i in 0..5 {
            q.enqueue(b"x", EnqueueOptions::default().dedup_key(format!("d{i}")))
                .unwrap();
            let l = q.dequeue().unwrap().unwrap();
            l.fail("dead").unwrap();
        }
        let (dead, _) = all_pages(&q, JobState::Dead, 10);
        assert_eq!(dead.len(), 5);
        let ids: Vec<JobId> = dead.iter().map(|j| j.id).collect();
        flip_record_byte(&q, ids[2], 4, 0x5A);
        {
            let tx = q.database().begin_write().unwrap();
            tx.open_table(DEAD).unwrap().insert(999_999, ()).unwrap();
            tx.commit().unwrap();
        }
        let n = if purge {
            q.purge(JobState::Dead).unwrap()
        } else {
            q.requeue_dead_all().unwrap()
        };
        assert_eq!(n, 4, "purge {purge}");
        let s = q.stats().unwrap();
        assert_eq!((s.dead, s.quarantined), (0, 1), "purge {purge}: {s:?}");
        assert_eq!(s.ready, if purge { 0 } else { 4 });
        q.remove(ids[2]).unwrap();
        assert_consistent(&q);
        // Purged jobs freed their dedup keys; requeued ones still hold theirs.
        let again = q.enqueue(b"y", EnqueueOptions::default().dedup_key("d0"));
        assert_eq!(matches!(again.unwrap(), Enqueued::New(_)), purge);
    }
}

/// Dead jobs do not count in `len`; a drain loop ends; `purge(Leased)` is refused.
#[test]
fn drain_until_empty_ends_with_dead_jobs() {
    let f = Fixture::new();
    let q = f.builder().max_attempts(2).open(&f.path).unwrap();
    for i in 0..10u32 {
        q.enqueue(format!("{i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    let mut rounds = 0;
    while !q.is_empty().unwrap() {
        rounds += 1;
        assert!(rounds < 100);
        if let Some(l) = q.dequeue().unwrap() {
            if l.payload()[0] % 2 == 0 {
                l.nack("always fails").unwrap();
            } else {
                l.ack().unwrap();
            }
        }
    }
    assert_eq!(q.len().unwrap(), 0);
    assert_eq!(q.stats().unwrap().dead, 5);
    assert!(matches!(
        q.purge(JobState::Leased),
        Err(Error::InvalidOption { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// The upgrade from format 1, with damaged rows
// ---------------------------------------------------------------------------------------

/// Turns a closed format-2 file into what format 1 looked like: version 1, no time index, no
/// carrier index, and a marker under a job's own id (tag 0).
fn downgrade_to_format_1(f: &Fixture, own_id: u64) {
    let db = redb::Database::open(&f.path).unwrap();
    let tx = db.begin_write().unwrap();
    tx.open_table(META)
        .unwrap()
        .insert("format_version", 1)
        .unwrap();
    assert!(tx.delete_table(APPLIED_BY_TIME).unwrap());
    assert!(tx.delete_table(IDEM_JOBS).unwrap());
    let mut own = vec![0u8];
    own.extend_from_slice(&own_id.to_be_bytes());
    tx.open_table(APPLIED)
        .unwrap()
        .insert(own.as_slice(), T0_MS)
        .unwrap();
    tx.commit().unwrap();
}

/// A format-1 file holding a damaged job row (carrying a key), a damaged leased row, a good
/// carried key, an uncarried key and a job's own-id marker: the open upgrades it (the damaged
/// rows are skipped, the leased one quarantined by recovery), the uncarried marker and the
/// own-id one go, the carried one stays, and once the damaged rows are removed `check` is
/// clean.
#[test]
fn upgrade_of_a_format_1_file_with_damaged_rows() {
    let f = Fixture::new();
    let (j_good, j_bad, j_leased, acked) = {
        let q = f.open();
        for k in ["K1", "K2", "K3"] {
            q.enqueue(b"first", keyed(k)).unwrap();
            let l = q.dequeue().unwrap().unwrap();
            assert_eq!(l.ack_with(|tx| bump(tx, 0)).unwrap(), Applied::Now);
        }
        let acked = q.enqueue(b"own", EnqueueOptions::default()).unwrap().id();
        q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
        let j_good = q.enqueue(b"K2 again", keyed("K2")).unwrap().id();
        let j_bad = q.enqueue(b"K3 again", keyed("K3")).unwrap().id();
        let j_leased = q.enqueue(b"held", keyed("K4")).unwrap().id();
        let held = q.dequeue_batch(3).unwrap();
        assert_eq!(held.len(), 3);
        flip_record_byte(&q, j_bad, 7, 0x5A);
        flip_record_byte(&q, j_leased, 7, 0x5A);
        drop(held); // still leased in the file: the next open recovers it
        drop(q);
        (j_good, j_bad, j_leased, acked)
    };
    downgrade_to_format_1(&f, acked.0);
    let q = retained(&f, ms(10));
    let r = q.recovery();
    assert_eq!(r.upgraded_from, Some(1), "{r:?}");
    assert_eq!((r.leases_returned, r.quarantined), (1, 2), "{r:?}");
    assert_eq!(q.stats().unwrap().applied, 3, "the own-id marker is gone");
    f.clock.advance(ms(11));
    assert_eq!(q.prune().unwrap().applied, 2, "K1 and K3");
    assert!(!q.is_applied("K1").unwrap());
    assert!(q.is_applied("K2").unwrap(), "carried by a good live job");
    // K3 is carried only by a damaged row the upgrade skipped: its marker went (a job
    // quarantined under format 2 keeps its carrier entry, so its marker would stay).
    assert!(!q.is_applied("K3").unwrap());
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), j_good);
    assert_eq!(l.ack_with(|_| Ok(())).unwrap(), Applied::AlreadyApplied);
    drop(l);
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().quarantined, 2);
    q.remove(j_bad).unwrap();
    q.remove(j_leased).unwrap();
    assert_consistent(&q);
    drop(q);
    let q = f.open();
    assert_eq!(q.recovery().upgraded_from, None);
    assert_consistent(&q);
}

// ---------------------------------------------------------------------------------------
// Compaction
// ---------------------------------------------------------------------------------------

/// `compact` refuses (`Busy`, never waits) while a read or a write transaction of the
/// caller's is open on `database()`, and runs once they are gone; twice in a row is fine.
#[test]
fn compact_refuses_open_transactions_without_waiting() {
    let f = Fixture::new();
    let mut q = f.open();
    q.enqueue_batch((0..2_000).map(|_| (&[7u8; 512][..], EnqueueOptions::default())))
        .unwrap();
    let all = q.dequeue_batch(2_000).unwrap();
    all_ok(q.ack_batch(&all).unwrap());
    drop(all);
    let rtx = q.database().begin_read().unwrap();
    assert!(matches!(q.compact(), Err(Error::Busy { .. })));
    drop(rtx);
    let wtx = q.database().begin_write().unwrap();
    assert!(matches!(q.compact(), Err(Error::Busy { .. })));
    wtx.abort().unwrap();
    let before = std::fs::metadata(&f.path).unwrap().len();
    q.compact().unwrap();
    let after = std::fs::metadata(&f.path).unwrap().len();
    assert!(after < before, "{after} < {before}");
    let second = q.compact().unwrap();
    assert_eq!(std::fs::metadata(&f.path).unwrap().len(), after, "{second}");
    q.enqueue(b"after", EnqueueOptions::default()).unwrap();
    assert_consistent(&q);
}

#[cfg(feature = "sim")]
mod sim {
    use super::*;
    use leaseq::ManualClock;
    use leaseq::sim::SimDisk;

    fn open(disk: &SimDisk) -> Queue {
        Queue::builder()
            .clock(ManualClock::new(T0_MS))
            .retry(RetryPolicy::immediate())
            .open_backend(disk.backend())
            .unwrap()
    }

    fn image_with_jobs() -> Vec<u8> {
        let disk = SimDisk::new(1);
        let q = open(&disk);
        q.enqueue_batch((0..3_000).map(|i| {
            (
                &[1u8; 256][..],
                EnqueueOptions::default().idempotency_key(format!("k{i}")),
            )
        }))
        .unwrap();
        let batch = q.dequeue_batch(2_900).unwrap();
        all_ok(q.ack_with_batch(&batch, |_, _| Ok(())).unwrap());
        drop(batch);
        drop(q);
        disk.live_image()
    }

    /// A handle whose commit failed (power lost) refuses `compact` with `CommitFailed`, and
    /// the reopened file is whole.
    #[test]
    fn compact_on_a_poisoned_handle_is_commit_failed() {
        let image = image_with_jobs();
        let disk = SimDisk::from_image(image, 2);
        let mut q = open(&disk);
        disk.crash_after(0);
        assert!(q.enqueue(b"x", EnqueueOptions::default()).is_err());
        let r = q.compact();
        assert!(matches!(r, Err(Error::CommitFailed { .. })), "{r:?}");
        drop(q);
        let q = open(&SimDisk::from_image(disk.crash_image(), 3));
        assert_eq!(q.stats().unwrap().ready, 100);
        assert_consistent(&q);
    }

    /// After a compaction that failed (power lost at its k-th write or sync): a second
    /// `compact` is `CommitFailed`, every write is `CommitFailed`, reads answer or fail typed
    /// without panicking, and the file reopened after the crash holds every job.
    #[test]
    fn after_a_failed_compact() {
        let image = image_with_jobs();
        let ops = {
            let disk = SimDisk::from_image(image.clone(), 4);
            let mut q = open(&disk);
            let at = disk.mutating_ops();
            assert!(q.compact().unwrap());
            disk.mutating_ops() - at
        };
        assert!(ops > 2, "{ops}");
        for k in [0, ops / 2, ops - 1] {
            let disk = SimDisk::from_image(image.clone(), 4);
            let mut q = open(&disk);
            let before = q.stats().unwrap();
            disk.crash_after(k);
            assert!(q.compact().is_err(), "crash at {k} of {ops}");
            let r = q.compact();
            assert!(matches!(r, Err(Error::CommitFailed { .. })), "{r:?}");
            assert!(matches!(
                q.enqueue(b"x", EnqueueOptions::default()),
                Err(Error::CommitFailed { .. })
            ));
            assert!(matches!(q.dequeue(), Err(Error::CommitFailed { .. })));
            assert!(matches!(q.prune(), Err(Error::CommitFailed { .. })));
            if let Ok(s) = q.stats() {
                assert_eq!(s, before, "crash at {k}");
            }
            let _ = q.jobs(JobState::Ready, None, 10);
            let _ = q.check();
            drop(q);
            let q = open(&SimDisk::from_image(disk.crash_image(), 5));
            assert_eq!(q.stats().unwrap(), before, "crash at {k}");
            assert_consistent(&q);
        }
    }
}

/// `check` sees damage to the new tables: a time-index entry without its marker, a marker
/// missing from the time index, a carrier entry naming a job that does not carry the key, a
/// live keyed job missing from the carrier index.
#[test]
fn check_reports_damage_to_the_retention_tables() {
    let f = Fixture::new();
    let q = f.open();
    q.enqueue(b"a", keyed("A")).unwrap();
    q.dequeue().unwrap().unwrap().ack_with(|_| Ok(())).unwrap();
    let live = q.enqueue(b"b", keyed("B")).unwrap().id();
    let other = q.enqueue(b"c", EnqueueOptions::default()).unwrap().id();
    assert_consistent(&q);
    let plant = |what: &dyn Fn(&redb::WriteTransaction)| {
        let tx = q.database().begin_write().unwrap();
        what(&tx);
        tx.commit().unwrap();
        let v = q.check().unwrap();
        assert!(!v.is_empty(), "damage not reported");
        v
    };
    // A time-index entry without a marker.
    plant(&|tx| {
        tx.open_table(APPLIED_BY_TIME)
            .unwrap()
            .insert((5, &b"\x01Z"[..]), ())
            .unwrap();
    });
    plant(&|tx| {
        tx.open_table(APPLIED_BY_TIME)
            .unwrap()
            .remove((5, &b"\x01Z"[..]))
            .unwrap();
        let mut b = tx.open_table(APPLIED_BY_TIME).unwrap();
        let first = b
            .first()
            .unwrap()
            .map(|(k, _)| (k.value().0, k.value().1.to_vec()));
        let (at, k) = first.unwrap();
        b.remove((at, k.as_slice())).unwrap();
    });
    // Repair: the marker's time entry back.
    {
        let tx = q.database().begin_write().unwrap();
        let at = tx
            .open_table(APPLIED)
            .unwrap()
            .get(&b"\x01A"[..])
            .unwrap()
            .unwrap()
            .value();
        tx.open_table(APPLIED_BY_TIME)
            .unwrap()
            .insert((at, &b"\x01A"[..]), ())
            .unwrap();
        tx.commit().unwrap();
    }
    assert_consistent(&q);
    let v = plant(&|tx| {
        let mut idem = tx.open_table(IDEM_JOBS).unwrap();
        idem.remove((&b"\x01B"[..], live.0)).unwrap();
        idem.insert((&b"\x01B"[..], other.0), ()).unwrap();
    });
    assert!(v.iter().any(|x| x.job_id == Some(live)), "{v:?}");
    assert!(v.iter().any(|x| x.job_id == Some(other)), "{v:?}");
}
