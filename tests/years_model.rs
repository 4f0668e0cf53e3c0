//! A property test of the long-run rules (issue 9): random sequences of enqueues (delay,
//! priority, dedup key with and without a window, idempotency key), dequeues, acks,
//! `ack_with`, nacks, lease expiry, `prune`, `compact`, clock steps and reopens, run against a
//! simple model. After every step `check()` is empty and the stats, the applied markers and
//! the held dedup keys are the model's; every dequeue hands out the model's choice.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Fixture, T0_MS};

// Proptest keeps failing inputs in `tests/years_model.proptest-regressions` when one fails.
use leaseq::{Applied, EnqueueOptions, Enqueued, JobId, Lease, Queue, RetryPolicy, Stats};
use proptest::prelude::*;

const LEASE_MS: u64 = 1_000;
const MAX_ATTEMPTS: u32 = 3;
const RETENTION_MS: u64 = 5_000;
/// Markers and dedup windows pruned per new marker / new keyed job (`store::PRUNE_PER_ACK_MAX`).
const PRUNE_PER_WRITE: usize = 2;
const KEYS: u8 = 6;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        priority: i32,
        delay_ms: u64,
        dedup: Option<(u8, Option<u64>)>,
        idem: Option<u8>,
    },
    Dequeue,
    Ack(usize),
    AckWith(usize),
    Nack(usize),
    Clock(u64),
    Prune,
    Compact,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            0..3i32,
            prop_oneof![Just(0u64), Just(0), Just(500), Just(2_000)],
            prop::option::of((0..KEYS, prop::option::of(prop_oneof![Just(1_000u64), Just(3_000)]))),
            prop::option::of(0..KEYS),
        )
            .prop_map(|(priority, delay_ms, dedup, idem)| Op::Enqueue {
                priority,
                delay_ms,
                dedup,
                idem
            }),
        4 => Just(Op::Dequeue),
        2 => any::<usize>().prop_map(Op::Ack),
        3 => any::<usize>().prop_map(Op::AckWith),
        1 => any::<usize>().prop_map(Op::Nack),
        2 => prop_oneof![Just(1u64), Just(300), Just(1_001), Just(6_000)].prop_map(Op::Clock),
        1 => Just(Op::Prune),
        1 => Just(Op::Compact),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum St {
    Ready(u64),
    Scheduled(u64),
    Leased(u64),
    Dead,
}

#[derive(Debug, Clone)]
struct MJob {
    priority: i32,
    state: St,
    attempts: u32,
    idem: Option<String>,
    dedup: Option<String>,
    windowed: bool,
}

/// What the public contract says the queue holds.
#[derive(Debug, Default)]
struct Model {
    now: u64,
    seq: u64,
    jobs: BTreeMap<u64, MJob>,
    /// Dedup key -> (holder, window end).
    dedup: BTreeMap<String, (u64, Option<u64>)>,
    /// Idempotency key -> kept since.
    applied: BTreeMap<String, u64>,
}

impl Model {
    fn make_ready(&mut self, id: u64) {
        self.seq += 1;
        self.jobs.get_mut(&id).unwrap().state = St::Ready(self.seq);
    }

    /// Who holds `k` now; a window that ended releases it here (as the lookup does).
    fn holder(&mut self, k: &str) -> Option<u64> {
        let &(h, end) = self.dedup.get(k)?;
        if end.is_some_and(|e| e <= self.now) {
            self.dedup.remove(k);
            return None;
        }
        Some(h)
    }

    /// The earliest ended windows, at most `max`, released.
    fn prune_windows(&mut self, max: usize) -> usize {
        let mut ended: Vec<(u64, String)> = self
            .dedup
            .iter()
            .filter_map(|(k, &(_, e))| e.filter(|&e| e <= self.now).map(|e| (e, k.clone())))
            .collect();
        ended.sort();
        ended.truncate(max);
        for (_, k) in &ended {
            self.dedup.remove(k);
        }
        ended.len()
    }

    /// Markers past the retention, oldest first, at most `max`: carried ones restart.
    fn prune_markers(&mut self, max: usize) -> usize {
        let Some(cutoff) = self.now.checked_sub(RETENTION_MS) else {
            return 0;
        };
        let mut old: Vec<(u64, String)> = self
            .applied
            .iter()
            .filter(|&(_, &t)| t <= cutoff)
            .map(|(k, &t)| (t, k.clone()))
            .collect();
        old.sort();
        old.truncate(max);
        let mut removed = 0;
        for (_, k) in old {
            let carried = self.jobs.values().any(|j| j.idem.as_deref() == Some(&k));
            if carried {
                self.applied.insert(k, self.now);
            } else {
                self.applied.remove(&k);
                removed += 1;
            }
        }
        removed
    }

    fn enqueue(&mut self, id_next: u64, op: &Op) -> Option<Enqueued> {
        let Op::Enqueue {
            priority,
            delay_ms,
            dedup,
            idem,
        } = op
        else {
            unreachable!()
        };
        if let Some((k, _)) = dedup {
            let k = format!("d{k}");
            if let Some(h) = self.holder(&k) {
                let windowed = self.dedup[&k].1.is_some();
                let dead = !windowed && self.jobs.get(&h).is_some_and(|j| j.state == St::Dead);
                return Some(if dead {
                    Enqueued::DuplicateDead(JobId(h))
                } else {
                    Enqueued::Duplicate(JobId(h))
                });
            }
            self.prune_windows(PRUNE_PER_WRITE);
            let end = dedup.unwrap().1.map(|w| self.now + w);
            self.dedup.insert(k, (id_next, end));
        }
        self.jobs.insert(
            id_next,
            MJob {
                priority: *priority,
                state: St::Scheduled(self.now + delay_ms),
                attempts: 0,
                idem: idem.map(|k| format!("i{k}")),
                dedup: dedup.map(|(k, _)| format!("d{k}")),
                windowed: dedup.is_some_and(|(_, w)| w.is_some()),
            },
        );
        if *delay_ms == 0 {
            self.make_ready(id_next);
        }
        None
    }

    /// Ends a delivery without an ack: ready at once (the retry policy is immediate) or dead.
    fn end_attempt(&mut self, id: u64) {
        if self.jobs[&id].attempts >= MAX_ATTEMPTS {
            self.jobs.get_mut(&id).unwrap().state = St::Dead;
        } else {
            self.make_ready(id);
        }
    }

    fn delete(&mut self, id: u64) {
        let j = self.jobs.remove(&id).unwrap();
        if let Some(k) = &j.dedup
            && self.holder(k) == Some(id)
            && !j.windowed
        {
            self.dedup.remove(k);
        }
    }

    /// Sweeps, then leases the first ready job.
    fn dequeue(&mut self) -> Option<(u64, u32)> {
        let now = self.now;
        let mut due: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                St::Scheduled(t) if t <= now => Some((t, id)),
                _ => None,
            })
            .collect();
        due.sort();
        for (_, id) in due {
            self.make_ready(id);
        }
        let mut expired: Vec<(u64, u64)> = self
            .jobs
            .iter()
            .filter_map(|(&id, j)| match j.state {
                St::Leased(d) if d <= now => Some((d, id)),
                _ => None,
            })
            .collect();
        expired.sort();
        for (_, id) in expired {
            self.end_attempt(id);
        }
        let (&id, _) = self
            .jobs
            .iter()
            .filter_map(|(id, j)| match j.state {
                St::Ready(s) => Some((id, (j.priority, s))),
                _ => None,
            })
            .min_by_key(|(_, k)| *k)?;
        let j = self.jobs.get_mut(&id).unwrap();
        j.attempts += 1;
        j.state = St::Leased(now + LEASE_MS);
        Some((id, j.attempts))
    }

    fn leased(&self, id: u64) -> bool {
        matches!(
            self.jobs.get(&id),
            Some(MJob {
                state: St::Leased(_),
                ..
            })
        )
    }

    fn stats(&self) -> (u64, u64, u64, u64, u64, u64, u64) {
        let mut s = (self.jobs.len() as u64, 0, 0, 0, 0, 0, 0);
        for j in self.jobs.values() {
            match j.state {
                St::Scheduled(_) => s.1 += 1,
                St::Ready(_) => s.2 += 1,
                St::Leased(_) => s.3 += 1,
                St::Dead => s.4 += 1,
            }
        }
        s.5 = self.applied.len() as u64;
        s.6 = self.dedup.len() as u64;
        s
    }
}

fn got_stats(s: Stats) -> (u64, u64, u64, u64, u64, u64, u64) {
    (
        s.total,
        s.scheduled,
        s.ready,
        s.leased,
        s.dead,
        s.applied,
        s.dedup_keys,
    )
}

fn open(f: &Fixture) -> Queue {
    f.builder()
        .lease(Duration::from_millis(LEASE_MS))
        .max_attempts(MAX_ATTEMPTS)
        .retry(RetryPolicy::immediate())
        .applied_retention(Some(Duration::from_millis(RETENTION_MS)))
        .open(&f.path)
        .unwrap()
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let f = Fixture::new();
    let mut q = open(&f);
    let mut m = Model {
        now: T0_MS,
        ..Model::default()
    };
    let mut held: Vec<Lease> = Vec::new();
    let mut next_id = 1u64;
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step} {op:?}");
        match op {
            Op::Enqueue {
                priority,
                delay_ms,
                dedup,
                idem,
            } => {
                let mut o = EnqueueOptions::default().priority(*priority);
                if *delay_ms > 0 {
                    o = o.delay(Duration::from_millis(*delay_ms));
                }
                if let Some((k, w)) = dedup {
                    o = o.dedup_key(format!("d{k}"));
                    if let Some(w) = w {
                        o = o.dedup_window(Duration::from_millis(*w));
                    }
                }
                if let Some(k) = idem {
                    o = o.idempotency_key(format!("i{k}"));
                }
                let got = q.enqueue(b"x", o).unwrap();
                match (m.enqueue(next_id, op), got) {
                    (None, Enqueued::New(JobId(id))) => {
                        prop_assert!(id >= next_id, "{at}: id {id}");
                        if id != next_id {
                            // Ids skip after a reopen (a block was reserved): rename.
                            let j = m.jobs.remove(&next_id).unwrap();
                            m.jobs.insert(id, j);
                            for v in m.dedup.values_mut() {
                                if v.0 == next_id {
                                    v.0 = id;
                                }
                            }
                        }
                        next_id = id + 1;
                    }
                    (Some(want), got) => prop_assert_eq!(want, got, "{}", at),
                    (want, got) => prop_assert!(false, "{at}: want {want:?}, got {got:?}"),
                }
            }
            Op::Dequeue => {
                let want = m.dequeue();
                let got = q.dequeue().unwrap();
                prop_assert_eq!(
                    want,
                    got.as_ref().map(|l| (l.id().0, l.attempt())),
                    "{}",
                    at
                );
                held.extend(got);
            }
            Op::Ack(i) | Op::AckWith(i) | Op::Nack(i) => {
                if held.is_empty() {
                    continue;
                }
                let l = held.swap_remove(i % held.len());
                let id = l.id().0;
                // Held leases can be stale (expired and reclaimed, or recovered by a reopen).
                let current = m.leased(id) && {
                    let info = q.job(l.id()).unwrap();
                    info.and_then(|i| i.lease_token) == Some(l.token())
                };
                match op {
                    Op::Ack(_) => {
                        let r = l.ack();
                        prop_assert_eq!(r.is_ok(), current, "{}: {:?}", at, r);
                        if current {
                            m.delete(id);
                        }
                    }
                    Op::AckWith(_) => {
                        let r = l.ack_with(|_| Ok(()));
                        prop_assert_eq!(r.is_ok(), current, "{}: {:?}", at, r);
                        if current {
                            let idem = m.jobs[&id].idem.clone();
                            let want = match &idem {
                                Some(k) if m.applied.contains_key(k) => Applied::AlreadyApplied,
                                Some(k) => {
                                    m.applied.insert(k.clone(), m.now);
                                    Applied::Now
                                }
                                None => Applied::Now,
                            };
                            prop_assert_eq!(r.unwrap(), want, "{}", at);
                            m.delete(id);
                            if want == Applied::Now && idem.is_some() {
                                m.prune_markers(PRUNE_PER_WRITE);
                            }
                        }
                    }
                    _ => {
                        let r = l.nack("again");
                        prop_assert_eq!(r.is_ok(), current, "{}: {:?}", at, r);
                        if current {
                            m.end_attempt(id);
                        }
                    }
                }
            }
            Op::Clock(ms) => {
                f.clock.advance(Duration::from_millis(*ms));
                m.now += ms;
            }
            Op::Prune => {
                let p = q.prune().unwrap();
                let markers = m.prune_markers(usize::MAX);
                let windows = m.prune_windows(usize::MAX);
                prop_assert_eq!(
                    (p.applied, p.dedup_windows),
                    (markers as u64, windows as u64),
                    "{}",
                    at
                );
            }
            Op::Compact => {
                held.clear(); // every lease holds the queue: compact needs it alone
                q.compact().unwrap();
            }
            Op::Reopen => {
                held.clear();
                drop(q);
                q = open(&f);
                let mut leased: Vec<(u64, u64)> = m
                    .jobs
                    .iter()
                    .filter_map(|(&id, j)| match j.state {
                        St::Leased(d) => Some((d, id)),
                        _ => None,
                    })
                    .collect();
                leased.sort();
                for (_, id) in leased {
                    m.end_attempt(id);
                }
            }
        }
        prop_assert!(
            q.check().unwrap().is_empty(),
            "{at}: {:?}",
            q.check().unwrap()
        );
        prop_assert_eq!(got_stats(q.stats().unwrap()), m.stats(), "{}", at);
        for k in 0..KEYS {
            let k = format!("i{k}");
            prop_assert_eq!(
                q.is_applied(&k).unwrap(),
                m.applied.contains_key(&k),
                "{}: marker {}",
                at,
                k
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn long_run_rules_hold_against_the_model(ops in prop::collection::vec(op(), 1..100)) {
        run(&ops)?;
    }
}
