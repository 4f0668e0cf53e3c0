//! The control channel (`leaseq::control`): a running app acted on from outside through its
//! JSON API, by the library's `Client` and by raw HTTP as an attacker would; the control
//! file's rights; refusals that write nothing; a channel that never holds up a shutdown.

use std::path::Path;
use std::time::Duration;

use leaseq::control::{self, Action, Client, Enqueue};
use leaseq::{EnqueueOptions, Error, History, JobId, JobState, Queue, Schedule};
use serde_json::{Value, json};

use crate::client::send;

/// A dead job in `queue` (one attempt, failed).
fn dead(queue: &Queue, payload: &[u8]) -> JobId {
    let id = queue
        .enqueue(payload, EnqueueOptions::default().max_attempts(1))
        .expect("enqueue")
        .id();
    let lease = loop {
        let lease = queue.dequeue().expect("dequeue").expect("a job");
        if lease.id() == id {
            break lease;
        }
        lease.nack("not this one").expect("nack");
    };
    lease.fail("boom").expect("fail");
    id
}

fn state(queue: &Queue, id: JobId) -> Option<JobState> {
    let file = queue.default_queue();
    let mut queues = vec![file.clone()];
    for name in file.queue_names().expect("names") {
        queues.push(file.existing(&name).expect("queue"));
    }
    queues
        .iter()
        .find_map(|q| q.job(id).expect("job").map(|j| j.state))
}

/// Everything a refused request must leave as it was: every job of every queue with its
/// state, attempts and payload, the pause flags, the schedules.
fn snapshot(queue: &Queue) -> Value {
    let file = queue.default_queue();
    let mut queues = vec![file.clone()];
    for name in file.queue_names().expect("names") {
        queues.push(file.existing(&name).expect("queue"));
    }
    let mut out = Vec::new();
    for q in &queues {
        let mut jobs = Vec::new();
        for s in JobState::ALL {
            let page = q.jobs(s, None, 1000).expect("jobs");
            for j in page.jobs {
                jobs.push(json!([
                    j.id.0,
                    j.state.as_str(),
                    j.attempts,
                    q.payload(j.id).expect("payload")
                ]));
            }
        }
        let schedules: Vec<String> = q
            .schedules()
            .expect("schedules")
            .into_iter()
            .map(|s| s.name)
            .collect();
        let limit = format!("{:?}", q.limit().expect("limit"));
        out.push(json!({ "queue": q.name(), "paused": q.is_paused(), "jobs": jobs, "schedules": schedules, "limit": limit }));
    }
    Value::Array(out)
}

fn open_app(path: &Path) -> Queue {
    Queue::open(path).expect("open")
}

#[test]
fn a_client_acts_through_the_running_app_and_gets_its_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.leaseq");
    let app = open_app(&path);
    let mail = app.named("mail").expect("named");
    // Ended jobs are kept, so a cancelled one can be retried.
    mail.set_history(History::off().keep_jobs(100))
        .expect("history");
    let channel = control::serve(&app).expect("serve");
    assert_eq!(channel.control_file(), control::control_file_path(&path));
    // The file is the app's alone: nobody else can open it, so everything below went
    // through the app.
    assert!(matches!(Queue::open(&path), Err(Error::AlreadyOpen { .. })));
    let client = Client::for_file(&path).expect("read").expect("a channel");
    assert_eq!(client.pid(), std::process::id());

    let ready = mail
        .enqueue(b"r", EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let answer = client
        .act(&Action::Cancel {
            id: ready,
            queue: None,
            reason: "from outside".into(),
        })
        .expect("cancel");
    assert_eq!(
        answer,
        json!({ "id": ready.0, "queue": "mail", "was": "ready" })
    );
    assert_eq!(state(&app, ready), Some(JobState::Cancelled));
    assert_eq!(
        mail.job(ready)
            .expect("job")
            .expect("kept")
            .cancel_reason
            .as_deref(),
        Some("from outside")
    );
    // retry of the cancelled job, then a second retry is the app's own refusal.
    let answer = client
        .act(&Action::Retry {
            id: ready,
            queue: Some("mail".into()),
        })
        .expect("retry");
    assert_eq!(answer, json!({ "id": ready.0, "queue": "mail" }));
    assert_eq!(state(&app, ready), Some(JobState::Ready));
    match client.act(&Action::Retry {
        id: ready,
        queue: None,
    }) {
        Err(Error::InvalidState {
            job_id,
            actual: JobState::Ready,
            ..
        }) if job_id == ready => {}
        other => panic!("a retry of a ready job: {other:?}"),
    }
    // The job is in "mail", not in the default queue.
    match client.act(&Action::Retry {
        id: ready,
        queue: Some(control::DEFAULT_QUEUE.into()),
    }) {
        Err(Error::JobNotFound { job_id }) if job_id == ready => {}
        other => panic!("a job looked for in the wrong queue: {other:?}"),
    }
    match client.act(&Action::Pause {
        queue: Some("nope".into()),
    }) {
        Err(Error::QueueNotFound { name }) if name == "nope" => {}
        other => panic!("an unknown queue: {other:?}"),
    }
    // Pause and resume, every queue.
    let answer = client.act(&Action::Pause { queue: None }).expect("pause");
    assert_eq!(
        answer,
        json!({ "queues": [
            { "queue": null, "changed": true },
            { "queue": "mail", "changed": true },
        ] })
    );
    assert!(app.is_paused() && mail.is_paused());
    client.act(&Action::Resume { queue: None }).expect("resume");
    assert!(!app.is_paused() && !mail.is_paused());
    // A dead job requeued; all dead requeued; a purge.
    let d1 = dead(&app, b"d1");
    let d2 = dead(&mail, b"d2");
    client
        .act(&Action::RequeueDead {
            id: d1,
            queue: None,
        })
        .expect("requeue");
    assert_eq!(state(&app, d1), Some(JobState::Ready));
    let answer = client
        .act(&Action::RequeueDeadAll {
            queue: Some("mail".into()),
        })
        .expect("requeue all");
    assert_eq!(
        answer,
        json!({ "queues": [{ "queue": "mail", "count": 1 }] })
    );
    assert_eq!(state(&app, d2), Some(JobState::Ready));
    match client.act(&Action::Purge {
        queue: None,
        state: JobState::Leased,
    }) {
        Err(Error::Remote {
            status: 400, kind, ..
        }) if kind == "invalid_option" => {}
        other => panic!("a purge of leased jobs: {other:?}"),
    }
    let answer = client
        .act(&Action::Purge {
            queue: Some(control::DEFAULT_QUEUE.into()),
            state: JobState::Ready,
        })
        .expect("purge");
    assert_eq!(answer, json!({ "queues": [{ "queue": null, "count": 1 }] }));
    assert_eq!(state(&app, d1), None);
    // An enqueue with options, a duplicate by its dedup key.
    let job = Enqueue {
        queue: Some("new-queue".into()),
        payload: b"hello".to_vec(),
        delay_ms: Some(60_000),
        dedup_key: Some("k".into()),
        priority: Some(-3),
        ..Enqueue::default()
    };
    let answer = client.act(&Action::Enqueue(job.clone())).expect("enqueue");
    assert_eq!(answer["outcome"], "new");
    let id = JobId(answer["id"].as_u64().expect("id"));
    let made = app.existing("new-queue").expect("made by the enqueue");
    let info = made.job(id).expect("job").expect("there");
    assert_eq!((info.state, info.priority), (JobState::Scheduled, -3));
    assert_eq!(
        made.payload(id).expect("payload").as_deref(),
        Some(&b"hello"[..])
    );
    let again = client.act(&Action::Enqueue(job)).expect("duplicate");
    assert_eq!(again, json!({ "outcome": "duplicate", "id": id.0 }));
    client
        .act(&Action::Promote { id, queue: None })
        .expect("promote");
    assert_eq!(state(&app, id), Some(JobState::Ready));
    client
        .act(&Action::Remove { id, queue: None })
        .expect("remove");
    assert_eq!(state(&app, id), None);
    // Schedules: removed once, then not found.
    mail.create_schedule("sync", &Schedule::every(Duration::from_secs(60)))
        .expect("schedule");
    let remove = Action::RemoveSchedule {
        queue: Some("mail".into()),
        name: "sync".into(),
    };
    let named = || (Some("mail".to_string()), "sync".to_string());
    let (queue, name) = named();
    assert_eq!(
        client
            .act(&Action::PauseSchedule { queue, name })
            .expect("pause schedule"),
        json!({ "queue": "mail", "name": "sync", "changed": true })
    );
    let (queue, name) = named();
    let triggered = client
        .act(&Action::TriggerSchedule { queue, name })
        .expect("trigger schedule");
    let sync = mail.schedule("sync").expect("read").expect("sync");
    let (job, _) = sync.last_job.expect("the instance");
    assert_eq!(
        triggered,
        json!({ "queue": "mail", "name": "sync", "id": job.0 })
    );
    assert!(sync.paused_ms.is_some());
    let (queue, name) = named();
    assert_eq!(
        client
            .act(&Action::ResumeSchedule { queue, name })
            .expect("resume schedule"),
        json!({ "queue": "mail", "name": "sync", "changed": true })
    );
    assert!(
        mail.schedule("sync")
            .expect("read")
            .expect("sync")
            .paused_ms
            .is_none()
    );
    assert_eq!(
        client.act(&remove).expect("remove schedule"),
        json!({ "queue": "mail", "name": "sync" })
    );
    match client.act(&Action::TriggerSchedule {
        queue: Some("mail".into()),
        name: "sync".into(),
    }) {
        Err(Error::ScheduleNotFound { name }) if name == "sync" => {}
        other => panic!("a removed schedule triggered: {other:?}"),
    }
    mail.remove(job).expect("remove the instance");
    assert!(mail.schedules().expect("schedules").is_empty());
    match client.act(&remove) {
        Err(Error::ScheduleNotFound { name }) if name == "sync" => {}
        other => panic!("a schedule removed twice: {other:?}"),
    }
    // Prune answers per queue.
    let pruned = client.act(&Action::Prune).expect("prune");
    assert_eq!(pruned["queues"].as_array().expect("queues").len(), 3);
    // Reads: the file and its counts, as `leaseq stats --json` writes them.
    let info = client.get("").expect("the file");
    assert_eq!(info["api"], control::API_VERSION);
    assert_eq!(info["queues"], json!([null, "mail", "new-queue"]));
    let stats = client.get("stats?queue=mail").expect("stats");
    let s = mail.stats().expect("stats");
    assert_eq!(stats["queues"][0]["queue"], "mail");
    assert_eq!(stats["queues"][0]["ready"], s.ready);
    assert_eq!(stats["queues"][0]["cancelled"], s.cancelled);
    assert_eq!(stats["queues"][0]["total"], s.total);
    drop(channel);
    assert!(
        !control::control_file_path(&path).exists(),
        "removed at the end"
    );
    assert!(Client::for_file(&path).expect("read").is_none());
}

/// The same action applied in the process and through a channel answers the same and leaves
/// the same queue: one code path.
#[test]
fn an_action_answers_the_same_in_process_and_through_the_channel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let build = |name: &str| {
        let q = open_app(&dir.path().join(name));
        let mail = q.named("mail").expect("named");
        for i in 0..3u8 {
            mail.enqueue(&[i], EnqueueOptions::default())
                .expect("enqueue");
        }
        dead(&q, b"x");
        q
    };
    let local = build("local.leaseq");
    let remote = build("remote.leaseq");
    let channel = control::serve(&remote).expect("serve");
    let client = Client::for_file(dir.path().join("remote.leaseq"))
        .expect("read")
        .expect("a channel");
    let actions = [
        Action::Cancel {
            id: JobId(2),
            queue: None,
            reason: "r".into(),
        },
        Action::Pause { queue: None },
        Action::RequeueDeadAll { queue: None },
        Action::Purge {
            queue: Some("mail".into()),
            state: JobState::Ready,
        },
        Action::Resume {
            queue: Some("mail".into()),
        },
        Action::Enqueue(Enqueue {
            payload: b"p".to_vec(),
            ..Enqueue::default()
        }),
    ];
    for action in &actions {
        let here = action.apply(&local).expect("in process");
        let there = client.act(action).expect("through the channel");
        assert_eq!(here, there, "{action:?}");
    }
    assert_eq!(snapshot(&local), snapshot(&remote));
    drop(channel);
}

/// Raw HTTP as another local user would send it: no token or a wrong one is 401 and writes
/// nothing; bad input is a typed JSON error and writes nothing; bodies are bounded before
/// the token is known.
#[test]
fn refused_requests_write_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.leaseq");
    let app = open_app(&path);
    let mail = app.named("mail").expect("named");
    let id = mail
        .enqueue(b"keep", EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let channel = control::serve(&app).expect("serve");
    let addr = channel.local_addr();
    let good = format!("Bearer {}", channel.token());
    let before = snapshot(&app);
    let routes = [
        format!("/api/v1/jobs/{id}/cancel"),
        format!("/api/v1/jobs/{id}/remove"),
        "/api/v1/purge?state=ready".to_string(),
        "/api/v1/pause".to_string(),
        "/api/v1/enqueue?queue=mail".to_string(),
        "/api/v1/prune".to_string(),
    ];
    for route in &routes {
        for auth in [
            None,
            Some("Bearer wrong-token-0123456789abcdef".to_string()),
            Some(format!("Basic {}", channel.token())),
            Some(format!("Bearer {}x", channel.token())),
        ] {
            let headers: Vec<(&str, &str)> =
                auth.iter().map(|a| ("Authorization", a.as_str())).collect();
            let answer = send(addr, "POST", route, &headers, "payload");
            assert_eq!(answer.status, 401, "{route} {auth:?}: {}", answer.body);
            let body: Value = serde_json::from_str(&answer.body).expect("json");
            assert_eq!(body["error"]["kind"], "unauthorized");
        }
        // Reads too.
        assert_eq!(send(addr, "GET", "/api/v1/stats", &[], "").status, 401);
    }
    assert_eq!(
        snapshot(&app),
        before,
        "nothing written by a refused request"
    );
    let auth = [("Authorization", good.as_str())];
    for (method, route, status, kind) in [
        ("POST", "/api/v1/jobs/abc/cancel", 400, "invalid_option"),
        ("POST", "/api/v1/jobs/99999/cancel", 404, "job_not_found"),
        ("POST", "/api/v1/purge?state=leased", 400, "invalid_option"),
        (
            "POST",
            "/api/v1/purge?state=everything",
            400,
            "invalid_option",
        ),
        ("POST", "/api/v1/pause?queue=nope", 404, "queue_not_found"),
        (
            "POST",
            "/api/v1/enqueue?priority=high",
            400,
            "invalid_option",
        ),
        ("POST", "/api/v1/enqueue?lease_ms=0", 400, "invalid_option"),
        ("POST", "/api/v1/schedule-remove", 400, "invalid_option"),
        // A parameter the route does not take (a typo) is refused, not ignored.
        (
            "POST",
            "/api/v1/enqueue?queue=mail&delay=5000",
            400,
            "invalid_option",
        ),
        ("GET", "/api/v1/stats?queues=mail", 400, "invalid_option"),
        (
            "POST",
            "/api/v1/prune?dead_retention=1",
            400,
            "invalid_option",
        ),
        (
            "POST",
            &format!("/api/v1/jobs/{id}/retry?force=1"),
            400,
            "invalid_option",
        ),
        // Size limits: no bound, a bound of 0, a wait without block, block without a wait,
        // an unknown choice, a queue that does not exist.
        ("POST", "/api/v1/limit", 400, "invalid_option"),
        ("POST", "/api/v1/limit?max_jobs=0", 400, "invalid_option"),
        (
            "POST",
            "/api/v1/limit?max_jobs=5&wait_ms=100",
            400,
            "invalid_option",
        ),
        (
            "POST",
            "/api/v1/limit?max_jobs=5&when_full=block",
            400,
            "invalid_option",
        ),
        (
            "POST",
            "/api/v1/limit?max_jobs=5&when_full=drop_newest",
            400,
            "invalid_option",
        ),
        (
            "POST",
            "/api/v1/limit?queue=nope&max_jobs=5",
            404,
            "queue_not_found",
        ),
        ("POST", "/api/v1/explode", 404, "no_route"),
        ("GET", "/api/v1/pause", 405, "method_not_allowed"),
        ("GET", "/api/v1/jobs/3/cancel", 405, "method_not_allowed"),
        ("POST", "/api/v1/stats", 405, "method_not_allowed"),
        ("POST", "/api/v1/jobs/3", 405, "method_not_allowed"),
        ("PUT", "/api/v1/pause", 405, "method_not_allowed"),
        ("GET", "/", 404, "no_route"),
    ] {
        let answer = send(addr, method, route, &auth, "");
        assert_eq!(answer.status, status, "{method} {route}: {}", answer.body);
        let body: Value = serde_json::from_str(&answer.body).expect("json");
        assert_eq!(body["error"]["kind"], kind, "{method} {route}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    assert_eq!(snapshot(&app), before, "nothing written by a bad request");
    // A refused enqueue to a queue that does not exist makes no queue; a parameter given
    // twice is refused, whichever value would have won.
    for route in [
        "/api/v1/enqueue?queue=fresh&max_attempts=0",
        "/api/v1/enqueue?queue=fresh&lease_ms=99999999999",
        "/api/v1/enqueue?queue=fresh&delay_ms=60000&delay_ms=0",
        "/api/v1/enqueue?queue=mail&queue=fresh",
    ] {
        let answer = send(addr, "POST", route, &auth, "x");
        assert_eq!(answer.status, 400, "{route}: {}", answer.body);
        let body: Value = serde_json::from_str(&answer.body).expect("json");
        assert_eq!(body["error"]["kind"], "invalid_option", "{route}");
    }
    assert!(
        !app.queue_names()
            .expect("names")
            .contains(&"fresh".to_string()),
        "a refused enqueue made a queue"
    );
    assert_eq!(
        snapshot(&app),
        before,
        "nothing written by a refused enqueue"
    );
    let typo = send(addr, "POST", "/api/v1/enqueue?delay=5000", &auth, "x");
    let typo: Value = serde_json::from_str(&typo.body).expect("json");
    let message = typo["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"delay\"") && message.contains("delay_ms"),
        "the refusal names the parameter and what the route takes: {typo}"
    );
    // The job's own refusal: a leased job cannot be removed.
    let lease = mail.dequeue().expect("dequeue").expect("the job");
    let leased = snapshot(&app);
    let answer = send(
        addr,
        "POST",
        &format!("/api/v1/jobs/{id}/remove"),
        &auth,
        "",
    );
    assert_eq!(answer.status, 409, "{}", answer.body);
    let body: Value = serde_json::from_str(&answer.body).expect("json");
    assert_eq!(
        (
            &body["error"]["kind"],
            &body["error"]["job_id"],
            &body["error"]["actual"]
        ),
        (&json!("invalid_state"), &json!(id.0), &json!("leased"))
    );
    // What would have worked, as state names a script can compare.
    assert_eq!(
        body["error"]["expected_states"],
        json!(["scheduled", "ready", "dead"]),
        "{body}"
    );
    assert_eq!(snapshot(&app), leased);
    lease.ack().expect("the app's lease is untouched");
    // A body beyond 16 KiB without the token is refused before it is read; with the token,
    // an enqueue carries it.
    let big = "x".repeat(100_000);
    let answer = send(addr, "POST", "/api/v1/enqueue", &[], &big);
    assert_eq!(answer.status, 413, "{}", answer.body);
    let answer = send(addr, "POST", "/api/v1/pause", &auth, &big);
    assert_eq!(answer.status, 413, "only an enqueue carries a payload");
    assert!(!app.is_paused());
    let answer = send(addr, "POST", "/api/v1/enqueue?queue=mail", &auth, &big);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body: Value = serde_json::from_str(&answer.body).expect("json");
    let big_id = JobId(body["id"].as_u64().expect("id"));
    assert_eq!(
        mail.payload(big_id).expect("payload").map(|p| p.len()),
        Some(100_000)
    );
    drop(channel);
}

/// The control file: readable by the users who may write the queue file (Unix), replaced
/// over one a killed app left, removed at the end; a client finds nobody at a stale one.
#[test]
fn the_control_file_admits_the_queue_files_writers_and_outlives_no_app() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.leaseq");
    let app = open_app(&path);
    let control_file = control::control_file_path(&path);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let channel = control::serve(&app).expect("serve");
        assert_eq!(
            mode(&control_file),
            0o600,
            "others may read the queue, not write it"
        );
        drop(channel);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).expect("chmod");
        let channel = control::serve(&app).expect("serve");
        assert_eq!(
            mode(&control_file),
            0o640,
            "the group may write the queue: it may act"
        );
        drop(channel);
    }
    // An app killed with its channel open leaves the file behind: a client finds nobody.
    let channel = control::serve(&app).expect("serve");
    let text = std::fs::read(&control_file).expect("read");
    drop(channel);
    assert!(!control_file.exists());
    std::fs::write(&control_file, &text).expect("a stale control file");
    let client = Client::for_file(&path).expect("read").expect("found");
    match client.act(&Action::Pause { queue: None }) {
        Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            assert!(e.to_string().contains("no app answers"), "{e}");
        }
        other => panic!("a stale control file: {other:?}"),
    }
    assert!(!app.is_paused());
    // The next channel replaces it, and its own stop removes it.
    let channel = control::serve(&app).expect("serve over a stale file");
    assert_ne!(std::fs::read(&control_file).expect("read"), text);
    let client = Client::for_file(&path).expect("read").expect("found");
    client.act(&Action::Pause { queue: None }).expect("pause");
    assert!(app.is_paused());
    channel.stop();
    assert!(!control_file.exists());
    // A control file that is not one is refused with what it is.
    std::fs::write(&control_file, b"{\"leaseq_control\":99}").expect("write");
    match Client::for_file(&path) {
        Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {}
        other => panic!("a foreign control file: {other:?}"),
    }
    std::fs::write(&control_file, vec![b' '; 10_000]).expect("write");
    assert!(
        Client::for_file(&path).is_err(),
        "an oversized control file"
    );
    std::fs::remove_file(&control_file).expect("rm");
    // Settings refused.
    assert!(matches!(
        control::Control::new(&app).token("short").serve(),
        Err(Error::InvalidOption { field: "token", .. })
    ));
    let memory = Queue::builder()
        .open_backend(leaseq::redb::backends::InMemoryBackend::new())
        .expect("in memory");
    assert!(matches!(
        control::serve(&memory),
        Err(Error::InvalidOption { field: "queue", .. })
    ));
    // A token the app chooses is admitted across restarts, beside the channel's own,
    // which is new at every start and is the one the control file holds.
    let token = "a-token-the-app-keeps-0123";
    let mut own_tokens = Vec::new();
    for _ in 0..2 {
        let channel = control::Control::new(&app)
            .token(token)
            .serve()
            .expect("serve");
        assert_ne!(channel.token(), token);
        let text = std::fs::read_to_string(&control_file).expect("read");
        assert!(
            text.contains(channel.token()) && !text.contains(token),
            "{text}"
        );
        for t in [token, channel.token()] {
            let auth = format!("Bearer {t}");
            let answer = send(
                channel.local_addr(),
                "GET",
                "/api/v1",
                &[("Authorization", &auth)],
                "",
            );
            assert_eq!(answer.status, 200, "{}", answer.body);
        }
        own_tokens.push(channel.token().to_string());
        drop(channel);
    }
    assert_ne!(own_tokens[0], own_tokens[1]);
    // An older channel dropped after a newer one started leaves the newer one's file.
    let older = control::serve(&app).expect("serve");
    let newer = control::serve(&app).expect("serve");
    drop(older);
    let client = Client::for_file(&path)
        .expect("read")
        .expect("the newer file is there");
    assert_eq!(client.addr(), newer.local_addr());
    drop(newer);
    assert!(!control_file.exists());
}

/// A shutdown is not held up by an open channel: the channel lets go of its handle, answers
/// `closed` (503), and the file is released.
#[test]
fn a_shutdown_is_not_held_up_by_the_channel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.leaseq");
    let app = open_app(&path);
    let channel = control::serve(&app).expect("serve");
    let client = Client::for_file(&path).expect("read").expect("found");
    client.act(&Action::Pause { queue: None }).expect("pause");
    let report = app.shutdown(Duration::from_secs(5));
    assert!(report.released, "{report:?}");
    // The channel removes its control file once the app closed the queue (it looks every
    // 100 ms), so the tool opens the file itself from then on.
    let control_file = control::control_file_path(&path);
    let started = std::time::Instant::now();
    while control_file.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the control file outlived the queue"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    match client.act(&Action::Resume { queue: None }) {
        Err(Error::Closed) => {}
        other => panic!("after the shutdown: {other:?}"),
    }
    // The file is free: another process could open it now.
    let again = Queue::open(&path).expect("reopen");
    assert!(
        again.is_paused(),
        "the pause through the channel was committed"
    );
    drop(again);
    drop(channel);
}

/// The API's reads: a list pages through every job once with its cursors, a job as
/// `leaseq show --json` shows it, its payload's bytes; bad input a typed error.
#[test]
fn lists_page_through_every_job_and_a_job_reads_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.leaseq");
    let app = open_app(&path);
    let mail = app.named("mail").expect("named");
    let mut ids = Vec::new();
    for i in 0..250u32 {
        let payload = i.to_le_bytes();
        ids.push(
            mail.enqueue(&payload, EnqueueOptions::default().priority((i % 7) as i32))
                .expect("enqueue")
                .id(),
        );
    }
    let channel = control::serve(&app).expect("serve");
    let client = Client::for_file(&path).expect("read").expect("a channel");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut target = "jobs?state=ready&queue=mail&limit=64".to_string();
        if let Some(a) = &after {
            target.push_str(&format!("&after={a}"));
        }
        let page = client.get(&target).expect("page");
        pages += 1;
        assert_eq!(page["queue"], "mail");
        for job in page["jobs"].as_array().expect("jobs") {
            seen.push(JobId(job["id"].as_u64().expect("id")));
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 4);
    // The queue's own order, every job once.
    let mut expected = Vec::new();
    let mut cursor = None;
    loop {
        let page = mail.jobs(JobState::Ready, cursor, 100).expect("jobs");
        expected.extend(page.jobs.iter().map(|j| j.id));
        match page.next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(seen.len(), 250);
    // The default queue is another list.
    let empty = client.get("jobs?state=ready").expect("default queue");
    assert_eq!(
        empty,
        json!({ "queue": null, "jobs": [], "next": null, "first": null })
    );
    // Backward: newest first, the same jobs reversed (scheduled ones, by due time).
    for i in 0..5u64 {
        mail.enqueue(
            b"later",
            EnqueueOptions::default().delay(Duration::from_secs(60 + i)),
        )
        .expect("enqueue");
    }
    let forward = client.get("jobs?state=scheduled&queue=mail").expect("page");
    let backward = client
        .get("jobs?state=scheduled&queue=mail&order=desc&limit=3")
        .expect("page");
    let page_ids = |v: &Value| -> Vec<u64> {
        v["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|j| j["id"].as_u64().expect("id"))
            .collect()
    };
    let mut reversed = page_ids(&forward);
    reversed.reverse();
    assert_eq!(page_ids(&backward), reversed[..3].to_vec());
    let rest = client
        .get(&format!(
            "jobs?state=scheduled&queue=mail&before={}",
            backward["next"].as_str().expect("next")
        ))
        .expect("page");
    assert_eq!(page_ids(&rest), reversed[3..].to_vec());
    match client.get("jobs?state=ready&order=desc") {
        Err(Error::Remote { kind, .. }) if kind == "invalid_option" => {}
        other => panic!("ready backward: {other:?}"),
    }
    // One job, with and without its payload, found in any queue.
    let id = ids[17];
    let job = client.get(&format!("jobs/{id}?payload=1")).expect("job");
    let info = mail.job(id).expect("job").expect("there");
    let view = serde_json::to_value(leaseq::json::JobView::new(
        Some("mail"),
        &info,
        Some(&17u32.to_le_bytes()),
    ))
    .expect("json");
    assert_eq!(job, view);
    assert_eq!(job["payload_hex"], "11000000");
    let bare = client.get(&format!("jobs/{id}")).expect("job");
    assert!(bare.get("payload_hex").is_none() && bare.get("payload_utf8").is_none());
    let auth = format!("Bearer {}", channel.token());
    let raw = send(
        channel.local_addr(),
        "GET",
        &format!("/api/v1/jobs/{id}/payload"),
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(raw.status, 200);
    assert_eq!(raw.header("content-type"), Some("application/octet-stream"));
    assert_eq!(raw.body.as_bytes(), &17u32.to_le_bytes());
    // Bad input, typed.
    for (target, kind) in [
        ("jobs", "invalid_option"),
        ("jobs?state=nope", "invalid_option"),
        ("jobs?state=ready&limit=0", "invalid_option"),
        ("jobs?state=ready&limit=1001", "invalid_option"),
        ("jobs?state=ready&after=garbage", "invalid_option"),
        ("jobs?state=ready&queue=nope", "queue_not_found"),
        ("jobs/999999", "job_not_found"),
        ("jobs/x", "invalid_option"),
    ] {
        match client.get(target) {
            Err(Error::Remote { kind: k, .. }) if k == kind => {}
            Err(Error::JobNotFound { .. }) if kind == "job_not_found" => {}
            Err(Error::QueueNotFound { .. }) if kind == "queue_not_found" => {}
            other => panic!("{target}: {other:?}"),
        }
    }
    drop(channel);
}

/// The workers view: a pool given to the channel shows its threads busy and idle and its
/// counts through `GET /api/v1/workers`, in the app's dashboard and in a file's dashboard
/// beside the app; a pool shut down and dropped reads as gone.
#[test]
fn the_workers_view_shows_each_pools_threads_and_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.leaseq");
    let app = Queue::builder().live_reads(true).open(&path).expect("open");
    let (release, wait) = crossbeam_channel::bounded::<()>(0);
    let started_ms = leaseq::Clock::now_ms(&leaseq::SystemClock);
    let pool = leaseq::WorkerPool::builder(&app)
        .threads(3)
        .thread_name("mailer")
        .heartbeat_every(Duration::from_millis(20))
        .start(move |lease| {
            if lease.payload() == b"block" {
                let _ = wait.recv();
            }
            Ok(())
        })
        .expect("pool");
    app.enqueue(b"quick", EnqueueOptions::default())
        .expect("enqueue");
    app.enqueue(b"block", EnqueueOptions::default())
        .expect("enqueue");
    let monitor = pool.monitor();
    assert_eq!((monitor.name(), monitor.threads()), ("mailer", 3));
    let channel = control::Control::new(&app)
        .pool(monitor.clone())
        .serve()
        .expect("serve");
    let client = Client::for_file(&path).expect("read").expect("a channel");
    // One handler blocks: one busy, two idle, one job acked, its heartbeats landing.
    let mut seen = Value::Null;
    for _ in 0..400 {
        seen = client.get("workers").expect("workers");
        let p = &seen["pools"][0];
        if p["busy"] == 1 && p["stats"]["acked"] == 1 && p["stats"]["heartbeats"] != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let p = &seen["pools"][0];
    assert_eq!(
        (
            &p["name"],
            &p["queue"],
            &p["threads"],
            &p["busy"],
            &p["idle"],
            &p["state"]
        ),
        (
            &json!("mailer"),
            &Value::Null,
            &json!(3),
            &json!(1),
            &json!(2),
            &json!("running")
        ),
        "{seen}"
    );
    assert_eq!(p["stats"]["jobs"], 2);
    let last = p["stats"]["last_heartbeat_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("a last heartbeat: {seen}"));
    assert!(
        (started_ms..=leaseq::Clock::now_ms(&leaseq::SystemClock)).contains(&last),
        "{last} since {started_ms}"
    );
    // The app's dashboard, and a file's dashboard beside the app (through the channel).
    let own = leaseq::dashboard::Dashboard::new(&app)
        .pool(monitor.clone())
        .serve("127.0.0.1:0")
        .expect("serve");
    let file = leaseq::dashboard::Dashboard::for_file(&path)
        .serve("127.0.0.1:0")
        .expect("serve");
    for server in [&own, &file] {
        let auth = format!("Bearer {}", server.token());
        let page = send(
            server.local_addr(),
            "GET",
            "/",
            &[("Authorization", &auth)],
            "",
        )
        .body;
        let row = page
            .split("<tr data-pool=\"mailer\" data-state=\"running\">")
            .nth(1)
            .unwrap_or_else(|| panic!("the pool's row: {page}"));
        assert!(row.starts_with("<td>mailer</td><td>(default)</td><td>running</td><td data-busy>1</td><td>2</td><td>2</td><td>1</td>"), "{row}");
        let beat = row
            .split("<td data-last-heartbeat>")
            .nth(1)
            .unwrap_or_else(|| panic!("the last heartbeat: {row}"));
        assert!(beat.starts_with("<time "), "{row}");
    }
    drop((own, file));
    release.send(()).expect("release");
    let report = pool.shutdown(Duration::from_secs(5));
    assert_eq!(report.given_back, 0);
    assert!(monitor.stats().is_none(), "the pool is gone");
    let gone = client.get("workers").expect("workers");
    assert_eq!(gone["pools"][0]["state"], "gone");
    assert_eq!(gone["pools"][0]["stats"], Value::Null);
    drop(channel);
}

/// A cancel's reason of 4 KiB of text that is not ASCII travels whole (in the body, not the
/// head), and an enqueue's `Debug` (actions are logged) shows its payload's length only.
#[test]
fn long_reasons_travel_and_payloads_stay_out_of_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.leaseq");
    let app = open_app(&path);
    app.set_history(History::off().keep_jobs(10))
        .expect("history");
    let id = app
        .enqueue(b"x", EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let channel = control::serve(&app).expect("serve");
    let client = Client::for_file(&path).expect("read").expect("a channel");
    let reason: String = "é".repeat(2000);
    assert_eq!(reason.len(), 4000);
    client
        .act(&Action::Cancel {
            id,
            queue: None,
            reason: reason.clone(),
        })
        .expect("cancel");
    assert_eq!(
        app.job(id).expect("job").expect("kept").cancel_reason,
        Some(reason)
    );
    let secret = Enqueue {
        payload: b"card 4111-1111".to_vec(),
        ..Enqueue::default()
    };
    let shown = format!("{:?}", Action::Enqueue(secret));
    assert!(
        !shown.contains("4111") && shown.contains("payload_bytes: 14"),
        "{shown}"
    );
    drop(channel);
}
