//! Dead letters and listing (issue 9): jobs per state with paging, payloads, when a job died,
//! `requeue_dead_all`, `purge(state)`, and what `len()` counts.
//!
//! Adversarial tests of the "run for years" work (issue 9): paging and dead-letter tools on
//! damaged data.

use crate::common::{Fixture, LEASE, T0_MS, assert_consistent, flip_record_byte, secs};
use leaseq::{EnqueueOptions, Enqueued, Error, JobId, JobInfo, JobState, Queue};
use redb::TableDefinition;
use std::collections::BTreeSet;
use std::time::Duration;

/// Every job in `state`, read page by page (`limit` per page).
fn all_pages(q: &Queue, state: JobState, limit: usize) -> Vec<JobInfo> {
    let mut out = Vec::new();
    let mut after = None;
    for _ in 0..1_000 {
        let page = q.jobs(state, after, limit).unwrap();
        assert!(page.jobs.len() <= limit);
        out.extend(page.jobs);
        match page.next {
            Some(c) => after = Some(c),
            None => return out,
        }
    }
    panic!("paging does not end");
}

/// A queue with jobs in every state: 7 ready (priorities mixed), 5 scheduled (due times
/// reversed), 4 leased, 6 dead (3 failed, 3 out of attempts). Returns the ids per state.
fn every_state(f: &Fixture, q: &Queue) -> [Vec<JobId>; 4] {
    let dead_fail: Vec<JobId> = (0..3)
        .map(|i| {
            q.enqueue(format!("dead {i}").as_bytes(), EnqueueOptions::default())
                .unwrap()
                .id()
        })
        .collect();
    for _ in 0..3 {
        q.dequeue().unwrap().unwrap().fail("broken input").unwrap();
    }
    f.clock.advance(secs(1));
    let dead_out: Vec<JobId> = (0..3)
        .map(|i| {
            q.enqueue(
                format!("exhausted {i}").as_bytes(),
                EnqueueOptions::default().max_attempts(1),
            )
            .unwrap()
            .id()
        })
        .collect();
    for _ in 0..3 {
        assert_eq!(
            q.dequeue().unwrap().unwrap().nack("gave up").unwrap(),
            JobState::Dead
        );
    }
    let leased: Vec<JobId> = (0..4)
        .map(|i| {
            q.enqueue(format!("leased {i}").as_bytes(), EnqueueOptions::default())
                .unwrap()
                .id()
        })
        .collect();
    let held = q.dequeue_batch(4).unwrap();
    assert_eq!(held.iter().map(|l| l.id()).collect::<Vec<_>>(), leased);
    drop(held); // the jobs stay leased until their deadline: dropping a lease writes nothing
    let scheduled: Vec<JobId> = (0..5)
        .map(|i| {
            q.enqueue(
                format!("later {i}").as_bytes(),
                EnqueueOptions::default().delay(secs(100 - i)),
            )
            .unwrap()
            .id()
        })
        .collect();
    let ready: Vec<JobId> = (0..7)
        .map(|i| {
            q.enqueue(
                format!("ready {i}").as_bytes(),
                EnqueueOptions::default().priority(if i % 3 == 0 { -1 } else { 0 }),
            )
            .unwrap()
            .id()
        })
        .collect();
    let mut dead = dead_fail;
    dead.extend(dead_out);
    [ready, scheduled, leased, dead]
}

#[test]
fn jobs_are_listed_per_state_in_order_and_paged() {
    let f = Fixture::new();
    let q = f.open();
    let [ready, scheduled, leased, dead] = every_state(&f, &q);
    for limit in [1, 2, 3, 100] {
        let ids =
            |state| -> Vec<JobId> { all_pages(&q, state, limit).iter().map(|j| j.id).collect() };
        // Ready: in dequeue order (priority -1 first, then the order they became ready).
        let mut want_ready: Vec<JobId> = ready.iter().step_by(3).copied().collect();
        want_ready.extend(
            ready
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 3 != 0)
                .map(|(_, &id)| id),
        );
        assert_eq!(ids(JobState::Ready), want_ready, "limit {limit}");
        // Scheduled: by due time (enqueued with decreasing delays).
        let mut want_sched = scheduled.clone();
        want_sched.reverse();
        assert_eq!(ids(JobState::Scheduled), want_sched, "limit {limit}");
        assert_eq!(ids(JobState::Leased), leased, "limit {limit}");
        assert_eq!(ids(JobState::Dead), dead, "limit {limit}");
    }
    // The dequeue order matches the listing.
    let first = q.jobs(JobState::Ready, None, 1).unwrap().jobs[0].id;
    assert_eq!(q.dequeue().unwrap().unwrap().id(), first);
}

#[test]
fn dead_jobs_say_why_and_when_they_died_and_their_payload_is_readable() {
    let f = Fixture::new();
    let q = f.open();
    let [_, _, _, dead] = every_state(&f, &q);
    let listed = all_pages(&q, JobState::Dead, 10);
    assert_eq!(listed.len(), 6);
    for (i, j) in listed.iter().enumerate() {
        assert_eq!(j.state, JobState::Dead);
        assert_eq!(j.attempts, 1);
        let (why, when) = if i < 3 {
            ("broken input", T0_MS)
        } else {
            ("gave up", T0_MS + 1_000)
        };
        assert_eq!(j.last_error.as_deref(), Some(why));
        assert_eq!(j.died_ms, Some(when));
        assert_eq!(j.run_at_ms, when);
    }
    assert_eq!(q.payload(dead[4]).unwrap().unwrap(), b"exhausted 1");
    assert_eq!(q.payload(JobId(999_999)).unwrap(), None);
    // An expired lease with no attempts left dies when a dequeue finds it, at that time.
    let id = q
        .enqueue(b"x", EnqueueOptions::default().max_attempts(1).priority(-9))
        .unwrap()
        .id();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.id(), id);
    f.clock.advance(LEASE + secs(5));
    let _ = q.dequeue().unwrap();
    let info = q.job(id).unwrap().unwrap();
    assert_eq!(
        (info.state, info.died_ms, info.last_error.as_deref()),
        (JobState::Dead, Some(f_now(&f)), Some("lease expired"))
    );
    assert_eq!(q.job(dead[0]).unwrap().unwrap().died_ms, Some(T0_MS));
    let ready = q.jobs(JobState::Ready, None, 100).unwrap();
    assert!(ready.jobs.iter().all(|j| j.died_ms.is_none()));
}

fn f_now(f: &Fixture) -> u64 {
    use leaseq::Clock;
    f.clock.now_ms()
}

#[test]
fn bad_paging_arguments_are_refused() {
    let f = Fixture::new();
    let q = f.open();
    every_state(&f, &q);
    for limit in [0, leaseq::BATCH_MAX + 1] {
        assert!(matches!(
            q.jobs(JobState::Ready, None, limit),
            Err(Error::InvalidOption { field: "limit", .. })
        ));
    }
    let cursor = q.jobs(JobState::Dead, None, 1).unwrap().next.unwrap();
    assert!(matches!(
        q.jobs(JobState::Ready, Some(cursor), 5),
        Err(Error::InvalidOption { field: "after", .. })
    ));
}

#[test]
fn len_counts_the_work_left_not_dead_jobs() {
    let f = Fixture::new();
    let q = f.open();
    every_state(&f, &q);
    let s = q.stats().unwrap();
    assert_eq!(
        (s.ready, s.scheduled, s.leased, s.dead, s.total),
        (7, 5, 4, 6, 22)
    );
    assert_eq!(q.len().unwrap(), 16);
    assert_eq!(s.pending(), 16);
    // Drain everything that can run: the queue is empty although dead jobs remain.
    f.clock.advance(secs(200));
    while let Some(l) = q.dequeue().unwrap() {
        l.ack().unwrap();
    }
    assert!(q.is_empty().unwrap());
    assert_eq!(q.stats().unwrap().dead, 6);
}

#[test]
fn requeue_dead_all_moves_each_dead_job_once() {
    let f = Fixture::new();
    let q = f.open();
    let [ready, _, _, dead] = every_state(&f, &q);
    assert_eq!(q.requeue_dead_all().unwrap(), 6);
    assert_eq!(q.requeue_dead_all().unwrap(), 0, "nothing left to requeue");
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.ready, s.total), (0, 13, 22));
    let listed = all_pages(&q, JobState::Ready, 4);
    let ids: Vec<JobId> = listed.iter().map(|j| j.id).collect();
    assert_eq!(ids.len(), 13);
    assert_eq!(
        ids.iter().copied().collect::<BTreeSet<_>>().len(),
        13,
        "no job twice"
    );
    assert_eq!(
        &ids[ids.len() - 6..],
        &dead[..],
        "requeued behind the ready ones, in id order"
    );
    for j in listed.iter().filter(|j| dead.contains(&j.id)) {
        assert_eq!((j.attempts, j.died_ms), (0, None));
    }
    assert!(ready.iter().all(|id| ids.contains(id)));
    assert_consistent(&q);
}

#[test]
fn purge_deletes_a_state_and_frees_its_dedup_keys_but_never_leases() {
    let f = Fixture::new();
    let q = f.open();
    let d = q
        .enqueue(b"d", EnqueueOptions::default().dedup_key("dk"))
        .unwrap()
        .id();
    q.dequeue().unwrap().unwrap().fail("no").unwrap();
    let [_, scheduled, leased, dead] = every_state(&f, &q);
    let before = std::fs::read(&f.path).unwrap();
    assert!(matches!(
        q.purge(JobState::Leased),
        Err(Error::InvalidOption { field: "state", .. })
    ));
    assert_eq!(
        std::fs::read(&f.path).unwrap(),
        before,
        "a refused purge wrote nothing"
    );
    assert_eq!(q.purge(JobState::Dead).unwrap(), dead.len() as u64 + 1);
    assert_eq!(q.job(d).unwrap(), None);
    assert!(matches!(
        q.enqueue(b"again", EnqueueOptions::default().dedup_key("dk"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_eq!(
        q.purge(JobState::Scheduled).unwrap(),
        scheduled.len() as u64
    );
    assert_eq!(q.purge(JobState::Ready).unwrap(), 8);
    assert_eq!(q.purge(JobState::Ready).unwrap(), 0);
    let s = q.stats().unwrap();
    assert_eq!((s.total, s.leased), (4, 4));
    assert_eq!(
        all_pages(&q, JobState::Leased, 2)
            .iter()
            .map(|j| j.id)
            .collect::<Vec<_>>(),
        leased
    );
    assert_consistent(&q);
}

/// More dead jobs than one commit takes: `requeue_dead_all` and `purge` go on, a batch per
/// commit, until none is left. (More than the default `dead_jobs_max` too: kept here.)
#[test]
fn more_than_a_batch_of_dead_jobs() {
    let f = Fixture::new();
    let q = f
        .builder()
        .max_attempts(1)
        .dead_jobs_max(None)
        .open(&f.path)
        .unwrap();
    let n = leaseq::BATCH_MAX + 7;
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| format!("{i}").into_bytes()).collect();
    for chunk in payloads.chunks(leaseq::BATCH_MAX) {
        q.enqueue_batch(
            chunk
                .iter()
                .map(|p| (p.as_slice(), EnqueueOptions::default())),
        )
        .unwrap();
    }
    let mut died = 0;
    loop {
        let batch = q.dequeue_batch(leaseq::BATCH_MAX).unwrap();
        if batch.is_empty() {
            break;
        }
        for l in &batch {
            l.nack_after("dead", Duration::ZERO).unwrap();
            died += 1;
        }
    }
    assert_eq!(died, n);
    let before = q.commit_stats().commits;
    assert_eq!(q.requeue_dead_all().unwrap(), n as u64);
    assert_eq!(
        q.commit_stats().commits - before,
        2,
        "two commits for two batches"
    );
    assert_eq!(q.stats().unwrap().ready, n as u64);
    assert_eq!(q.purge(JobState::Ready).unwrap(), n as u64);
    assert_eq!(q.stats().unwrap().total, 0);
    assert_consistent(&q);
}

/// Dead-job retention (off by default): dead jobs older than it go a few per dequeue that
/// writes and all with `prune`, their dedup keys released; younger ones and every other state stay.
#[test]
fn dead_retention_deletes_old_dead_jobs_only() {
    let f = Fixture::new();
    let q = f
        .builder()
        .dead_retention(Some(secs(3600)))
        .open(&f.path)
        .unwrap();
    let old: Vec<JobId> = (0..5)
        .map(|i| {
            q.enqueue(b"old", EnqueueOptions::default().dedup_key(format!("d{i}")))
                .unwrap()
                .id()
        })
        .collect();
    for _ in 0..5 {
        q.dequeue().unwrap().unwrap().fail("old failure").unwrap();
    }
    f.clock.advance(secs(1800));
    let young = q.enqueue(b"young", EnqueueOptions::default()).unwrap().id();
    q.dequeue().unwrap().unwrap().fail("young failure").unwrap();
    let waiting = q
        .enqueue(b"later", EnqueueOptions::default().delay(secs(7200)))
        .unwrap()
        .id();
    f.clock.advance(secs(1801));
    // A dequeue takes two of the old dead jobs with it (one that finds nothing to do writes
    // nothing, so it prunes nothing).
    assert!(q.dequeue().unwrap().is_none());
    assert_eq!(q.stats().unwrap().dead, 6);
    q.enqueue(b"next", EnqueueOptions::default()).unwrap();
    q.dequeue().unwrap().unwrap().ack().unwrap();
    assert_eq!(q.stats().unwrap().dead, 4);
    assert_eq!(q.prune().unwrap().dead, 3);
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.scheduled), (1, 1));
    assert!(old.iter().all(|&id| q.job(id).unwrap().is_none()));
    assert_eq!(q.job(young).unwrap().unwrap().state, JobState::Dead);
    assert_eq!(q.job(waiting).unwrap().unwrap().state, JobState::Scheduled);
    assert!(matches!(
        q.enqueue(b"again", EnqueueOptions::default().dedup_key("d0"))
            .unwrap(),
        Enqueued::New(_)
    ));
    assert_consistent(&q);
    // Without a retention, dead jobs stay.
    drop(q);
    let q = f.open();
    f.clock.advance(secs(10 * 3600));
    assert_eq!(q.prune().unwrap().dead, 0);
    assert_eq!(q.stats().unwrap().dead, 1);
}

/// leaseq's own tables, written behind its back to plant damage or an older format.
const DEAD: TableDefinition<u64, ()> = TableDefinition::new("leaseq_dead");

/// Every job in `state`, page by page; panics on a repeated id.
fn pages_and_sizes(q: &Queue, state: JobState, limit: usize) -> (Vec<JobInfo>, Vec<usize>) {
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
        let (jobs, _) = pages_and_sizes(&q, JobState::Ready, 1_000);
        jobs.iter().map(|j| j.id).collect()
    };
    for state in [
        JobState::Ready,
        JobState::Scheduled,
        JobState::Leased,
        JobState::Dead,
    ] {
        let (whole, sizes) = pages_and_sizes(&q, state, 1_000);
        assert_eq!(whole.len(), 12, "{state:?}");
        assert_eq!(sizes, [12]);
        for limit in 1..=13 {
            let (paged, sizes) = pages_and_sizes(&q, state, limit);
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
        let (dead, _) = pages_and_sizes(&q, JobState::Dead, 10);
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

/// `jobs_before` lists a state backward (newest first) and pages both ways: backward pages
/// joined are the forward order reversed, each page's `first` leads forward again to exactly
/// the jobs after it, and ready is refused.
#[test]
fn jobs_before_pages_backward_and_first_leads_forward_again() {
    let f = Fixture::new();
    let q = f.builder().max_attempts(1).open(&f.path).unwrap();
    q.set_history(leaseq::History::off().keep_jobs(1000))
        .unwrap();
    for i in 0..23u32 {
        q.enqueue(&i.to_le_bytes(), EnqueueOptions::default())
            .unwrap();
        let lease = q.dequeue().unwrap().unwrap();
        if i % 2 == 0 {
            lease.fail("no").unwrap();
        } else {
            lease.ack().unwrap();
        }
    }
    for i in 0..9u64 {
        q.enqueue(b"later", EnqueueOptions::default().delay(secs(60 + i)))
            .unwrap();
    }
    for state in [JobState::Dead, JobState::Completed, JobState::Scheduled] {
        let forward: Vec<JobId> = all_pages(&q, state, 1000).iter().map(|j| j.id).collect();
        assert!(forward.len() >= 9, "{state}: {forward:?}");
        for limit in [1, 4, 5, 100] {
            // Backward, page by page.
            let mut back = Vec::new();
            let mut before = None;
            let mut firsts = Vec::new();
            loop {
                let page = q.jobs_before(state, before, limit).unwrap();
                assert!(page.jobs.len() <= limit);
                if let Some(first) = page.first {
                    firsts.push((first, back.len()));
                }
                back.extend(page.jobs.iter().map(|j| j.id));
                match page.next {
                    Some(n) => before = Some(n),
                    None => break,
                }
            }
            let mut reversed = forward.clone();
            reversed.reverse();
            assert_eq!(back, reversed, "{state} limit {limit}");
            // From each backward page's first job, forward reads what comes after it.
            for (first, seen_before) in firsts {
                let after = q.jobs(state, Some(first), 1000).unwrap();
                let expected: Vec<JobId> = reversed[..seen_before].iter().rev().copied().collect();
                assert_eq!(
                    after.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
                    expected,
                    "{state} limit {limit}"
                );
            }
        }
    }
    // An empty state: no page, no cursor.
    let empty = q.jobs_before(JobState::Leased, None, 10).unwrap();
    assert!(empty.jobs.is_empty() && empty.next.is_none() && empty.first.is_none());
    assert!(matches!(
        q.jobs_before(JobState::Ready, None, 10),
        Err(Error::InvalidOption { field: "state", .. })
    ));
    let dead_cursor = q.jobs(JobState::Dead, None, 1).unwrap().next.unwrap();
    assert!(matches!(
        q.jobs_before(JobState::Completed, Some(dead_cursor), 10),
        Err(Error::InvalidOption {
            field: "before",
            ..
        })
    ));
    assert!(matches!(
        q.jobs_before(JobState::Dead, None, 0),
        Err(Error::InvalidOption { .. })
    ));
}
