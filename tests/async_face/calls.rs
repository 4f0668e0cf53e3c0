//! The async forms of every `Queue` call, by subject: each checked against what it did to
//! the queue (read back through the blocking handle where that is the other side), the
//! calls that commit shown to leave a one-thread runtime free while their commit waits, and
//! a list that fails when a `Queue` call has no async form.

use crate::common::{Fixture, assert_consistent, keyed, plain, secs};
use leaseq::redb::{ReadableTable, ReadableTableMetadata, TableDefinition};
use leaseq::{
    AsyncQueue, Encoding, EnqueueOptions, Error, Event, History, ImportJob, JobState, QueueLimit,
    RateLimit, RetryPolicy, Schedule,
};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A job leased and failed: dead, with `reason`.
async fn a_dead_job(q: &AsyncQueue, payload: &[u8]) -> leaseq::JobId {
    let id = q.enqueue(payload, plain()).await.unwrap().id();
    let lease = q.dequeue().await.unwrap().expect("the job just enqueued");
    assert_eq!(lease.id(), id);
    lease.fail("bad input").await.unwrap();
    id
}

#[test]
fn admin_calls_change_the_jobs_they_name() {
    let f = Fixture::new();
    let q = f.open().to_async();
    runtime().block_on(async {
        q.set_history(History::off().keep_jobs(100)).await.unwrap();

        // Dead letters: one requeued by id, the rest at once, then purged.
        let dead: Vec<_> = [b"d0", b"d1", b"d2"].iter().map(|p| p.as_slice()).collect();
        let mut ids = Vec::new();
        for p in dead {
            ids.push(a_dead_job(&q, p).await);
        }
        assert_eq!(q.stats().await.unwrap().dead, 3);
        q.requeue_dead(ids[0]).await.unwrap();
        assert_eq!(q.job(ids[0]).await.unwrap().unwrap().state, JobState::Ready);
        assert!(matches!(
            q.requeue_dead(ids[0]).await,
            Err(Error::InvalidState { .. })
        ));
        assert_eq!(q.requeue_dead_all().await.unwrap(), 2);
        let s = q.stats().await.unwrap();
        assert_eq!((s.dead, s.ready), (0, 3), "{s:?}");
        assert_eq!(q.purge(JobState::Ready).await.unwrap(), 3);
        assert!(matches!(
            q.purge(JobState::Leased).await,
            Err(Error::InvalidOption { .. })
        ));
        assert_eq!(q.stats().await.unwrap().ready, 0);

        // Cancel, and retry the cancelled job (kept by the history).
        let a = q.enqueue(b"a", plain()).await.unwrap().id();
        assert_eq!(
            q.cancel(a, "user deleted").await.unwrap().was(),
            Some(JobState::Ready)
        );
        let cancelled = q.job(a).await.unwrap().unwrap();
        assert_eq!(cancelled.state, JobState::Cancelled);
        assert_eq!(
            q.cancel(a, "again").await.unwrap(),
            leaseq::CancelOutcome::AlreadyEnded {
                state: JobState::Cancelled
            }
        );
        q.retry(a).await.unwrap();
        assert_eq!(q.job(a).await.unwrap().unwrap().state, JobState::Ready);
        q.remove(a).await.unwrap();
        assert_eq!(q.job(a).await.unwrap(), None);
        assert!(matches!(q.remove(a).await, Err(Error::JobNotFound { .. })));

        // A scheduled job: promoted, put off again, reprioritised, its payload replaced.
        let b = q
            .enqueue(b"b", plain().delay(secs(3600)))
            .await
            .unwrap()
            .id();
        assert_eq!(q.job(b).await.unwrap().unwrap().state, JobState::Scheduled);
        q.promote(b).await.unwrap();
        assert_eq!(q.job(b).await.unwrap().unwrap().state, JobState::Ready);
        q.reschedule(b, secs(60)).await.unwrap();
        let info = q.job(b).await.unwrap().unwrap();
        assert_eq!(
            (info.state, info.run_at_ms),
            (JobState::Scheduled, f.clock_now() + 60_000)
        );
        q.set_priority(b, -5).await.unwrap();
        assert_eq!(q.job(b).await.unwrap().unwrap().priority, -5);
        q.update_payload(b, b"b, edited").await.unwrap();
        assert_eq!(
            q.payload(b).await.unwrap().as_deref(),
            Some(&b"b, edited"[..])
        );

        // A dedup key let go by hand: the next enqueue with it makes a new job.
        let c = q
            .enqueue(b"c", plain().dedup_key("note-3"))
            .await
            .unwrap()
            .id();
        assert_eq!(q.release_dedup_key("note-3").await.unwrap(), Some(c));
        assert_eq!(q.release_dedup_key("note-3").await.unwrap(), None);
        let again = q.enqueue(b"c2", plain().dedup_key("note-3")).await.unwrap();
        assert!(matches!(again, leaseq::Enqueued::New(id) if id != c));

        // Prune: the completed jobs past the history's age go.
        q.set_history(History::off().keep_jobs(100).keep_for(secs(1)))
            .await
            .unwrap();
        while let Some(lease) = q.dequeue().await.unwrap() {
            lease.ack().await.unwrap();
        }
        q.promote(b).await.unwrap();
        q.dequeue().await.unwrap().expect("b").ack().await.unwrap();
        let done = q.stats().await.unwrap().completed;
        assert!(done >= 3, "{done}");
        f.clock.advance(secs(2));
        assert_eq!(q.prune().await.unwrap().history, done);
        assert_eq!(q.stats().await.unwrap().completed, 0);
    });
    assert_consistent(q.blocking());
}

#[test]
fn settings_pause_limit_and_keep_history() {
    let f = Fixture::new();
    let q = f.open().to_async();
    runtime().block_on(async {
        // Pause and resume.
        assert!(!q.is_paused());
        assert!(q.pause().await.unwrap());
        assert!(q.is_paused() && q.blocking().is_paused());
        assert!(q.stats().await.unwrap().paused);
        assert!(!q.pause().await.unwrap(), "already paused");
        let id = q.enqueue(b"x", plain()).await.unwrap().id();
        assert!(
            q.dequeue().await.unwrap().is_none(),
            "a paused queue delivers nothing"
        );
        assert!(q.resume().await.unwrap());
        assert!(!q.resume().await.unwrap());
        assert!(!q.is_paused());
        let lease = q.dequeue().await.unwrap().expect("delivered once resumed");
        assert_eq!(lease.id(), id);
        lease.ack().await.unwrap();

        // The rate limit.
        let per_minute = RateLimit::new(2, secs(60));
        assert!(q.set_rate_limit(Some(per_minute)).await.unwrap());
        assert!(!q.set_rate_limit(Some(per_minute)).await.unwrap());
        assert_eq!(q.rate_limit().await.unwrap(), Some(per_minute));
        for _ in 0..3 {
            q.enqueue(b"r", plain()).await.unwrap();
        }
        let got = q.dequeue_batch(10).await.unwrap();
        assert_eq!(got.len(), 2, "the window allows two");
        assert!(q.set_rate_limit(None).await.unwrap());
        assert_eq!(q.rate_limit().await.unwrap(), None);
        crate::common::all_ok(q.ack_batch(&got).await.unwrap());

        // The size limit.
        let one = QueueLimit::jobs(1);
        assert!(q.set_limit(Some(one)).await.unwrap());
        assert_eq!(q.limit().await.unwrap(), Some(one));
        assert!(matches!(
            q.enqueue(b"no room", plain()).await,
            Err(Error::QueueFull { .. })
        ));
        assert!(q.set_limit(None).await.unwrap());
        assert_eq!(q.limit().await.unwrap(), None);
        q.enqueue(b"room", plain()).await.unwrap();

        // The history.
        let kept = History::off().keep_jobs(5);
        assert_eq!(q.history().await.unwrap(), History::off());
        assert!(q.set_history(kept).await.unwrap());
        assert!(!q.set_history(kept).await.unwrap());
        assert_eq!(q.history().await.unwrap(), kept);

        // Events: a subscription made without I/O, fed by the commits of async calls.
        assert!(matches!(
            q.events_with_capacity(0),
            Err(Error::InvalidOption { .. })
        ));
        let events = q.events().unwrap();
        let small = q.events_with_capacity(1).unwrap();
        let id = q.enqueue(b"e", plain()).await.unwrap().id();
        q.pause().await.unwrap();
        assert_eq!(events.try_recv(), Some(Event::Enqueued { id }));
        assert_eq!(events.try_recv(), Some(Event::Paused));
        assert_eq!(small.try_recv(), Some(Event::Enqueued { id }));
        assert_eq!(small.try_recv(), None);
        assert_eq!(small.missed(), 1, "a capacity of one kept the first");
    });
    assert_consistent(q.blocking());
}

#[test]
fn schedules_are_made_changed_fired_and_removed() {
    let f = Fixture::new();
    let q = f.open().to_async();
    runtime().block_on(async {
        let every_minute = Schedule::every(secs(60)).payload(b"tick".to_vec());
        let info = q.create_schedule("tick", &every_minute).await.unwrap();
        assert_eq!(info.next_due_ms, Some(f.clock_now() + 60_000));
        assert!(matches!(
            q.create_schedule("tick", &every_minute).await,
            Err(Error::ScheduleExists { .. })
        ));
        let hourly = Schedule::every(secs(3600)).payload(b"tick".to_vec());
        let info = q.update_schedule("tick", &hourly).await.unwrap();
        assert_eq!(info.next_due_ms, Some(f.clock_now() + 3_600_000));
        assert!(matches!(
            q.update_schedule("nope", &hourly).await,
            Err(Error::ScheduleNotFound { .. })
        ));
        q.upsert_schedule("tock", &every_minute).await.unwrap();
        let names: Vec<String> = q
            .schedules()
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["tick", "tock"]);

        assert!(q.pause_schedule("tick").await.unwrap());
        assert!(!q.pause_schedule("tick").await.unwrap());
        let paused = q.schedule("tick").await.unwrap().expect("tick");
        assert!(paused.paused_ms.is_some() && paused.next_due_ms.is_none());
        assert!(q.resume_schedule("tick").await.unwrap());
        assert!(!q.resume_schedule("tick").await.unwrap());
        assert!(
            q.schedule("tick")
                .await
                .unwrap()
                .unwrap()
                .next_due_ms
                .is_some()
        );

        let fired = q.trigger_schedule("tick").await.unwrap();
        let job = q.job(fired).await.unwrap().expect("the instance");
        assert_eq!(job.state, JobState::Ready);
        assert_eq!(
            q.payload(fired).await.unwrap().as_deref(),
            Some(&b"tick"[..])
        );
        assert_eq!(
            q.schedule("tick").await.unwrap().unwrap().last_job,
            Some((fired, f.clock_now()))
        );
        assert!(matches!(
            q.trigger_schedule("nope").await,
            Err(Error::ScheduleNotFound { .. })
        ));

        assert!(q.remove_schedule("tock").await.unwrap());
        assert!(!q.remove_schedule("tock").await.unwrap());
        assert_eq!(q.schedule("tock").await.unwrap(), None);
    });
    assert_consistent(q.blocking());
}

/// Every read's async form answers what its blocking form does, on a queue with ready,
/// dead, applied and quarantined state to show.
#[test]
fn reads_answer_as_the_blocking_reads() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let b = q.blocking().clone();
    runtime().block_on(async {
        assert!(q.is_empty().await.unwrap());
        a_dead_job(&q, b"dead 1").await;
        a_dead_job(&q, b"dead 2").await;
        let ids: Vec<_> = crate::common::enqueue_n(&b, 4, plain());
        let keyed_id = q.enqueue(b"k", keyed("effect-1")).await.unwrap().id();
        // The keyed job is behind the four: take them all, apply the keyed one's effect.
        let leases = q.dequeue_batch(10).await.unwrap();
        let (keyed_lease, rest): (Vec<_>, Vec<_>) =
            leases.into_iter().partition(|l| l.id() == keyed_id);
        keyed_lease[0].ack_with(|_| Ok(())).await.unwrap();
        for l in &rest {
            l.nack_after("again", Duration::ZERO).await.unwrap();
        }

        assert_eq!(q.stats().await.unwrap(), b.stats().unwrap());
        assert_eq!(q.len().await.unwrap(), 4);
        assert!(!q.is_empty().await.unwrap());
        assert_eq!(q.job(ids[1]).await.unwrap(), b.job(ids[1]).unwrap());
        assert_eq!(q.job(leaseq::JobId(999_999)).await.unwrap(), None);
        let page = q.jobs(JobState::Ready, None, 2).await.unwrap();
        assert_eq!(page, b.jobs(JobState::Ready, None, 2).unwrap());
        assert_eq!(page.jobs.len(), 2);
        let rest_page = q.jobs(JobState::Ready, page.next, 10).await.unwrap();
        assert_eq!(rest_page.jobs.len(), 2);
        assert_eq!(
            q.jobs_before(JobState::Dead, None, 10).await.unwrap(),
            b.jobs_before(JobState::Dead, None, 10).unwrap()
        );
        let dead = q.latest_dead(10).await.unwrap();
        assert_eq!(dead.len(), 2);
        assert_eq!(dead, b.latest_dead(10).unwrap());
        assert!(matches!(
            q.latest_dead(0).await,
            Err(Error::InvalidOption { .. })
        ));
        assert_eq!(
            q.payload(ids[0]).await.unwrap().as_deref(),
            Some(&b"job 0"[..])
        );
        assert!(q.is_applied("effect-1").await.unwrap());
        assert!(!q.is_applied("effect-2").await.unwrap());
        let file_id = q.file_id().await.unwrap();
        assert_ne!(file_id, 0);
        assert_eq!(file_id, b.file_id().unwrap());
        let minutes = q.metrics(0).await.unwrap();
        assert!(!minutes.is_empty(), "this minute's counts");
        assert_eq!(minutes, b.metrics(0).unwrap());

        q.named("reports").await.unwrap();
        assert_eq!(q.queue_names().await.unwrap(), ["reports"]);
        assert!(q.check().await.unwrap().is_empty());

        // A damaged row: quarantined by the next dequeue that meets it.
        let garbage = b"\x01not a leaseq record".to_vec();
        crate::common::overwrite_record(&b, ids[0], &garbage);
        while let Some(l) = q.dequeue().await.unwrap() {
            l.ack().await.unwrap();
        }
        let found = q.quarantined(None, 10).await.unwrap();
        assert_eq!(found, b.quarantined(None, 10).unwrap());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].job_id, ids[0]);
        assert_eq!(q.quarantined_record(ids[0]).await.unwrap(), Some(garbage));
        assert_eq!(q.quarantined_record(ids[1]).await.unwrap(), None);
        let violations = q.check().await.unwrap();
        assert_eq!(violations.len(), 1, "{violations:?}");
        q.remove(ids[0]).await.unwrap();
        assert!(q.check().await.unwrap().is_empty());
    });
}

const NOTES: TableDefinition<&str, &str> = TableDefinition::new("notes");

/// `read` runs the closure over a read transaction on a helper: it sees the latest commit,
/// answers while every commit of the file is held (a read never waits for writers), and
/// reports the closure's error or panic as `Effect`.
#[test]
fn read_runs_a_closure_over_the_apps_own_tables() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let rt = runtime();
    rt.block_on(async {
        let missing = q
            .read(|rtx| Ok(rtx.open_table(NOTES)?.len()?))
            .await;
        assert!(matches!(missing, Err(Error::Effect(_))), "{missing:?}");
        q.write(|tx| {
            tx.open_table(NOTES)?.insert("note-1", "buy milk")?;
            tx.enqueue(b"sync note-1", EnqueueOptions::default())?;
            Ok(())
        })
        .await
        .unwrap();
        let text = q
            .read(|rtx| {
                let notes = rtx.open_table(NOTES)?;
                Ok(notes.get("note-1")?.map(|v| v.value().to_string()))
            })
            .await
            .unwrap();
        assert_eq!(text.as_deref(), Some("buy milk"));

        let failed = q.read(|_| Err::<(), _>("not today".into())).await;
        assert!(
            matches!(&failed, Err(Error::Effect(e)) if e.to_string() == "not today"),
            "{failed:?}"
        );
        let panicked = q.read(|_| -> Result<(), leaseq::BoxError> { panic!("oops") }).await;
        assert!(
            matches!(&panicked, Err(Error::Effect(e)) if e.to_string().contains("closure panicked: oops")),
            "{panicked:?}"
        );
    });
    // While a write holds the file's commits, a read still answers (the held write's note
    // is not seen: it has not committed).
    let held = crate::support::hold_commits(q.blocking());
    let rows = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(10),
                q.read(|rtx| Ok(rtx.open_table(NOTES)?.len()?)),
            )
            .await
        })
        .expect("the read did not wait for the held commit")
        .unwrap();
    assert_eq!(rows, 1);
    drop(held);
    assert_consistent(q.blocking());
}

#[test]
fn handles_name_queues_and_carry_settings() {
    let f = Fixture::new();
    let q = f.open().to_async();
    runtime().block_on(async {
        assert_eq!(q.name(), None);
        assert!(matches!(
            q.existing("mail").await,
            Err(Error::QueueNotFound { .. })
        ));
        let mail = q.named("mail").await.unwrap();
        assert_eq!(mail.name(), Some("mail"));
        assert!(matches!(
            q.named("bad name!").await,
            Err(Error::InvalidOption { .. })
        ));
        mail.enqueue(b"to ann", plain()).await.unwrap();
        let found = q.existing("mail").await.unwrap();
        assert_eq!(found.stats().await.unwrap().ready, 1);
        assert_eq!(
            q.stats().await.unwrap().ready,
            0,
            "the default queue is apart"
        );
        let back = mail.default_queue();
        assert_eq!(back.name(), None);
        back.enqueue(b"default", plain()).await.unwrap();
        assert_eq!(q.stats().await.unwrap().ready, 1);
        assert_eq!(mail.stats().await.unwrap().ready, 1);

        // Settings of a handle: what the jobs it enqueues and the leases it takes carry.
        let short = mail.with_lease(secs(5)).unwrap();
        assert!(matches!(
            mail.with_lease(Duration::ZERO),
            Err(Error::InvalidOption { .. })
        ));
        let lease = short.dequeue().await.unwrap().expect("to ann");
        assert_eq!(lease.deadline_ms(), f.clock_now() + 5_000);
        lease.ack().await.unwrap();
        let three = mail.with_max_attempts(3).unwrap();
        assert!(matches!(
            mail.with_max_attempts(0),
            Err(Error::InvalidOption { .. })
        ));
        let id = three.enqueue(b"thrice", plain()).await.unwrap().id();
        assert_eq!(mail.job(id).await.unwrap().unwrap().max_attempts, 3);
        let json = mail.with_encoding(Encoding::Json);
        let id = json
            .enqueue_value(&"typed".to_string(), plain())
            .await
            .unwrap()
            .id();
        assert_eq!(
            mail.job(id).await.unwrap().unwrap().encoding,
            Some(Encoding::Json)
        );
        assert_eq!(
            mail.payload(id).await.unwrap().as_deref(),
            Some(&b"\"typed\""[..])
        );
        let later = mail
            .with_retry(RetryPolicy::fixed(secs(30)))
            .unwrap()
            .with_max_attempts(5)
            .unwrap();
        mail.purge(JobState::Ready).await.unwrap();
        later.enqueue(b"retried later", plain()).await.unwrap();
        let lease = later.dequeue().await.unwrap().expect("retried later");
        assert_eq!(lease.nack("busy").await.unwrap(), JobState::Scheduled);
        assert_eq!(
            mail.job(lease.id()).await.unwrap().unwrap().run_at_ms,
            f.clock_now() + 30_000
        );
    });
    assert_consistent(q.blocking());
}

/// Opening, importing, validating, closing and compacting through the async face.
#[test]
fn the_files_life_open_import_close_and_compact() {
    let f = Fixture::new();
    let rt = runtime();
    let q = rt
        .block_on(AsyncQueue::open_with(&f.builder(), &f.path))
        .unwrap();
    assert!(!q.recovery().repaired);
    assert_eq!(q.path(), Some(f.path.as_path()));
    assert!(matches!(
        rt.block_on(AsyncQueue::open(&f.path)),
        Err(Error::AlreadyOpen { .. })
    ));
    rt.block_on(async {
        let before = q.commit_stats();
        let imported = q
            .import_batch(&[
                ImportJob::new(b"was dead".to_vec())
                    .state(JobState::Dead)
                    .attempts(3)
                    .last_error(Some("smtp down".into())),
                ImportJob::new(b"was ready".to_vec()),
            ])
            .await
            .unwrap();
        assert_eq!(imported.len(), 2);
        assert!(q.commit_stats() != before, "the import committed");
        let s = q.stats().await.unwrap();
        assert_eq!((s.dead, s.ready), (1, 1), "{s:?}");
        assert_eq!(
            q.latest_dead(1).await.unwrap()[0].last_error.as_deref(),
            Some("smtp down")
        );
        assert!(matches!(
            q.import_batch(&[]).await,
            Err(Error::InvalidOption { .. })
        ));

        let too_big = vec![0u8; 64 * 1024 * 1024];
        assert!(matches!(
            q.validate_enqueue(&too_big, &plain()),
            Err(Error::PayloadTooLarge { .. })
        ));
        q.validate_enqueue(b"fine", &plain()).unwrap();
        assert_eq!(
            q.stats().await.unwrap().ready,
            1,
            "validation wrote nothing"
        );

        // Compaction needs the queue to itself: refused with a clone alive, the handle back.
        let clone = q.clone();
        let (q, refused) = q.compact().await;
        assert!(matches!(refused, Err(Error::Busy { .. })), "{refused:?}");
        drop(clone);
        let (q, compacted) = q.compact().await;
        compacted.unwrap();
        assert_eq!(
            q.stats().await.unwrap().ready,
            1,
            "the handle given back works"
        );

        assert!(!q.is_closed());
        q.close();
        assert!(q.is_closed() && q.blocking().is_closed());
        assert!(matches!(
            q.enqueue(b"late", plain()).await,
            Err(Error::Closed)
        ));
        assert!(matches!(q.dequeue().await, Err(Error::Closed)));
        assert!(matches!(
            q.validate_enqueue(b"late", &plain()),
            Err(Error::Closed)
        ));
        assert!(q.shutdown(secs(10)).await.released);
    });
    let again = f.open();
    assert_eq!(again.stats().unwrap().total, 2);
}

#[test]
fn batch_acks_end_every_lease_they_are_given() {
    const DONE: TableDefinition<u64, u64> = TableDefinition::new("done");
    let f = Fixture::new();
    let q = f.open().to_async();
    runtime().block_on(async {
        for i in 0..6 {
            q.enqueue(format!("job {i}").as_bytes(), keyed(&format!("k{i}")))
                .await
                .unwrap();
        }
        let first = q.dequeue_batch(2).await.unwrap();
        crate::common::all_ok(q.ack_batch(&first).await.unwrap());
        let again = q.ack_batch(&first).await.unwrap();
        assert!(
            again
                .iter()
                .all(|r| matches!(r, Err(Error::LeaseLost { .. }))),
            "{again:?}"
        );
        assert!(matches!(
            q.ack_batch(&[]).await,
            Err(Error::InvalidOption { .. })
        ));

        let second = q.dequeue_batch(2).await.unwrap();
        let applied = q
            .ack_with_batch(&second, |tx, lease| {
                tx.open_table(DONE)?.insert(lease.id().0, 1)?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            crate::common::all_ok(applied),
            [leaseq::Applied::Now, leaseq::Applied::Now]
        );

        let third = q.dequeue_batch(2).await.unwrap();
        let ids: Vec<u64> = third.iter().map(|l| l.id().0).collect();
        let applied = q
            .ack_with_all(&third, |tx, leases| {
                let mut done = tx.open_table(DONE)?;
                for lease in leases {
                    done.insert(lease.id().0, 2)?;
                }
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(crate::common::all_ok(applied).len(), 2);

        let rows = q
            .read(move |rtx| {
                let done = rtx.open_table(DONE)?;
                let mut rows = Vec::new();
                for row in done.iter()? {
                    let (k, v) = row?;
                    rows.push((k.value(), v.value()));
                }
                Ok(rows)
            })
            .await
            .unwrap();
        let twos: Vec<u64> = rows.iter().filter(|r| r.1 == 2).map(|r| r.0).collect();
        assert_eq!((rows.len(), twos), (4, ids));
        for k in 2..6 {
            assert!(q.is_applied(format!("k{k}")).await.unwrap(), "k{k}");
        }
        let s = q.stats().await.unwrap();
        assert_eq!((s.ready, s.leased), (0, 0), "{s:?}");
    });
    assert_consistent(q.blocking());
}

/// The promise: a call whose commit waits (here every commit of the file is held by a
/// write on another thread) leaves the runtime's one thread to the other tasks. A ticker
/// task on the same current-thread runtime keeps ticking while the calls wait, and a read
/// answers meanwhile; once the commits are let go every call completes with its effect.
/// Were a call to wait on the runtime thread, the ticker would not tick (a watchdog lets
/// the commits go after 20 s so that such a build fails rather than hangs).
#[test]
fn calls_waiting_for_a_commit_leave_the_runtime_thread_free() {
    let f = Fixture::new();
    let q = f.open().to_async();
    let id = q.blocking().enqueue(b"x", plain()).unwrap().id();
    let held = Arc::new(std::sync::Mutex::new(Some(crate::support::hold_commits(
        q.blocking(),
    ))));
    let watchdog = {
        let held = Arc::clone(&held);
        std::thread::spawn(move || {
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_secs(20) && held.lock().unwrap().is_some() {
                std::thread::sleep(Duration::from_millis(10));
            }
            held.lock().unwrap().take();
        })
    };
    let ticks = Arc::new(AtomicU64::new(0));
    runtime().block_on(async {
        let ticker = {
            let ticks = Arc::clone(&ticks);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let calls = {
            let q = q.clone();
            tokio::spawn(async move {
                let nightly = Schedule::every(secs(86_400));
                tokio::join!(
                    q.pause(),
                    q.cancel(id, "no longer wanted"),
                    q.set_rate_limit(Some(RateLimit::new(5, secs(1)))),
                    q.create_schedule("nightly", &nightly),
                    q.named("mail"),
                )
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (waiting, ticked) = (!calls.is_finished(), ticks.load(Ordering::SeqCst));
        let stats = tokio::time::timeout(Duration::from_secs(10), q.stats()).await;
        held.lock().unwrap().take();
        assert!(
            waiting,
            "the calls' commits were held: they could not have answered"
        );
        assert!(
            ticked >= 5,
            "the ticker ran {ticked} times in 200 ms while the calls waited"
        );
        let stats = stats.expect("a read does not wait for commits").unwrap();
        assert_eq!(stats.ready, 1, "nothing of the held calls is seen yet");
        let (paused, cancelled, limited, scheduled, mail) = calls.await.unwrap();
        assert!(paused.unwrap());
        assert_eq!(cancelled.unwrap().was(), Some(JobState::Ready));
        assert!(limited.unwrap());
        assert_eq!(scheduled.unwrap().name, "nightly");
        assert_eq!(mail.unwrap().name(), Some("mail"));
        ticker.abort();
    });
    watchdog.join().unwrap();
    let s = q.blocking().stats().unwrap();
    assert!(s.paused);
    assert_eq!(s.ready, 0);
    assert!(q.blocking().rate_limit().unwrap().is_some());
    assert!(q.blocking().schedule("nightly").unwrap().is_some());
    assert_consistent(q.blocking());
}

/// A call's future dropped while its commit waits: the call still completes on its helper,
/// as documented (only a dequeue's lease is given back).
#[test]
fn a_dropped_call_still_completes_on_its_helper() {
    use crate::support::{counting_waker, hold_commits, poll_once};
    let f = Fixture::new();
    let q = f.open().to_async();
    let id = q.blocking().enqueue(b"x", plain()).unwrap().id();
    let (_c, waker) = counting_waker();
    let held = hold_commits(q.blocking());
    let mut pause = Box::pin(q.pause());
    let mut cancel = Box::pin(q.cancel(id, "dropped"));
    assert!(poll_once(pause.as_mut(), &waker).is_none());
    assert!(poll_once(cancel.as_mut(), &waker).is_none());
    drop((pause, cancel));
    assert!(!q.is_paused(), "not before its commit");
    drop(held);
    assert!(crate::common::eventually(|| q.is_paused()));
    assert!(crate::common::eventually(|| q
        .blocking()
        .job(id)
        .unwrap()
        .is_none()));
    assert_consistent(q.blocking());
}

/// From inside a `write` closure (a `block_on` there) the new calls are refused at once,
/// reads and `read` too: a helper would wait for the transaction this thread holds. The
/// handle a refused `compact` took comes back.
#[test]
fn calls_from_inside_a_transaction_are_reentrant() {
    let f = Fixture::new();
    let q = f.open();
    let id = q.enqueue(b"x", plain()).unwrap().id();
    let aq = q.to_async();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let (q, aq) = (q.clone(), aq.clone());
        std::thread::spawn(move || {
            let inner = q.write(move |_| {
                let rt = runtime();
                let (back, compacted) = rt.block_on(aq.clone().compact());
                Ok(rt.block_on(async {
                    [
                        aq.cancel(id, "inside").await.map(drop),
                        aq.pause().await.map(drop),
                        aq.stats().await.map(drop),
                        aq.read(|_| Ok(())).await,
                        compacted.map(drop),
                        back.job(id).await.map(drop),
                    ]
                }))
            });
            tx.send(inner).unwrap();
        })
    };
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("answered, not deadlocked")
        .unwrap();
    worker.join().unwrap();
    assert!(
        got.iter().all(|r| matches!(r, Err(Error::Reentrant))),
        "{got:?}"
    );
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.paused), (1, false), "nothing of them ran");
}

/// The names of the `pub fn`s of the `impl <ty>` blocks in the files under `dir`.
fn pub_fns_of(dir: &str, ty: &str) -> BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let mut inside = false;
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            if !line.starts_with(' ') && !line.starts_with('}') && !line.is_empty() {
                inside = line.starts_with(&format!("impl {ty} {{"));
            }
            let Some(rest) = line
                .strip_prefix("    pub fn ")
                .or_else(|| line.strip_prefix("    pub async fn "))
            else {
                continue;
            };
            if inside {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

/// Every `pub fn` of `Queue` (src/queue/*.rs) has its async form on `AsyncQueue` under the
/// same name, but the few left out on purpose, each for its reason.
#[test]
fn every_queue_call_has_an_async_form() {
    const LEFT_OUT: &[(&str, &str)] = &[
        (
            "builder",
            "a Builder, not a call on a queue: AsyncQueue::open_with takes one",
        ),
        (
            "database",
            "redb's Database, whose calls block: AsyncQueue::read and write",
        ),
        (
            "reader",
            "a Reader, whose calls block: each has its async form here",
        ),
    ];
    let queue = pub_fns_of("src/queue", "Queue");
    let async_queue = pub_fns_of("src/async_face", "AsyncQueue");
    // The parse found the calls it must (so an empty list cannot pass).
    for known in [
        "enqueue",
        "cancel",
        "pause",
        "stats",
        "create_schedule",
        "compact",
    ] {
        assert!(
            queue.contains(known),
            "{known} not found in src/queue: {queue:?}"
        );
    }
    assert!(async_queue.contains("enqueue") && async_queue.contains("read"));
    let missing: Vec<&String> = queue
        .iter()
        .filter(|n| !async_queue.contains(*n) && !LEFT_OUT.iter().any(|(l, _)| l == n))
        .collect();
    assert!(
        missing.is_empty(),
        "Queue calls without an async form: {missing:?}"
    );
    for (name, why) in LEFT_OUT {
        assert!(
            queue.contains(*name),
            "{name} is no Queue call any more ({why})"
        );
        assert!(!async_queue.contains(*name), "{name} has an async form now");
    }
}
