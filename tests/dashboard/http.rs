//! The dashboard over HTTP, as a script or an attacker would reach it.
//!
//! Goal: every request without the access token is refused and reads nothing; every action
//! that is refused (no form token, another site's origin, a foreign `Host`, read-only mode, a
//! job in the wrong state or missing) writes nothing; the pages show what the queue's own
//! reads say, with every text from the file escaped.
//! Method: a real server on 127.0.0.1 port 0 over a real file, raw HTTP requests
//! (`client`), and the queue read back after each refusal.

use std::time::Duration;

use leaseq::dashboard::{self, Dashboard};
use leaseq::{EnqueueOptions, Error, JobCursor, JobId, JobState, Queue};

use crate::client::{self, csrf_of, get, post, send};

const TOKEN: &str = "dashboard-test-token-0123456789";

struct App {
    _dir: tempfile::TempDir,
    queue: Queue,
    server: dashboard::Server,
}

fn app_with(read_only: bool) -> App {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::open(dir.path().join("q.leaseq")).expect("open");
    let server = Dashboard::new(&queue)
        .read_only(read_only)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    App {
        _dir: dir,
        queue,
        server,
    }
}

fn app() -> App {
    app_with(false)
}

/// A dead job with `reason` as its error.
fn dead(queue: &Queue, payload: &[u8], reason: &str) -> JobId {
    let id = queue
        .enqueue(payload, EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let lease = queue.dequeue().expect("dequeue").expect("a job");
    assert_eq!(lease.id(), id);
    lease.fail(reason).expect("fail");
    id
}

fn state(queue: &Queue, id: JobId) -> Option<JobState> {
    queue.job(id).expect("job").map(|j| j.state)
}

#[test]
fn the_token_guards_every_page() {
    let app = app();
    let addr = app.server.local_addr();
    let id = dead(&app.queue, b"secret payload", "boom");
    let payload = format!("/payload?id={id}");
    let job = format!("/job?id={id}");
    for target in [
        "/",
        "/jobs?state=dead",
        &job,
        "/api/overview",
        &payload,
        "/schedules",
    ] {
        let none = send(addr, "GET", target, &[], "");
        assert_eq!(none.status, 401, "{target} without a token");
        assert!(
            !none.body.contains("secret"),
            "{target} leaked: {}",
            none.body
        );
        let wrong = send(
            addr,
            "GET",
            target,
            &[("Authorization", "Bearer dashboard-test-token-0123456788")],
            "",
        );
        assert_eq!(wrong.status, 401, "{target} with a wrong token");
        let cookie = send(
            addr,
            "GET",
            target,
            &[(
                "Cookie",
                "leaseq_dashboard_1=dashboard-test-token-0123456789",
            )],
            "",
        );
        assert_eq!(cookie.status, 401, "a cookie of another port's dashboard");
        assert_eq!(
            get(addr, TOKEN, target).status,
            200,
            "{target} with the token"
        );
    }
    // The printed URL: answered with the cookie and a redirect that drops the token.
    let url = app.server.url();
    let target = url.split_once(&addr.to_string()).expect("the address").1;
    assert!(target.starts_with("/?token="), "{url}");
    let first = send(
        addr,
        "GET",
        &format!("/jobs?state=dead&token={TOKEN}"),
        &[],
        "",
    );
    assert_eq!(first.status, 303);
    assert_eq!(first.header("location"), Some("/jobs?state=dead"));
    let cookie = first.header("set-cookie").expect("a cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().expect("name=value");
    assert_eq!(pair, format!("leaseq_dashboard_{}={TOKEN}", addr.port()));
    let page = send(addr, "GET", "/jobs?state=dead", &[("Cookie", pair)], "");
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains(&format!("data-job=\"{id}\"")),
        "{}",
        page.body
    );
    // An action without the token: 401 even with a well-formed form.
    let id_text = id.to_string();
    let form = client::form(&[("op", "retry"), ("id", &id_text)]);
    assert_eq!(send(addr, "POST", "/action", &[], &form).status, 401);
    assert_eq!(state(&app.queue, id), Some(JobState::Dead));
    let wrong_param = send(addr, "GET", "/?token=nope", &[], "");
    assert_eq!(wrong_param.status, 401);
    assert!(wrong_param.header("set-cookie").is_none());
}

#[test]
fn a_random_token_is_printed_once_in_the_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::open(dir.path().join("q.leaseq")).expect("open");
    let a = dashboard::serve(&queue, "127.0.0.1:0").expect("serve");
    let b = dashboard::serve(&queue, "127.0.0.1:0").expect("serve");
    for s in [&a, &b] {
        assert_eq!(s.token().len(), 32);
        assert!(s.token().chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            s.url(),
            format!("http://{}/?token={}", s.local_addr(), s.token())
        );
    }
    assert_ne!(a.token(), b.token());
    assert_eq!(get(a.local_addr(), b.token(), "/").status, 401);
    assert_eq!(get(a.local_addr(), a.token(), "/").status, 200);
}

#[test]
fn serve_refuses_bad_settings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::open(dir.path().join("q.leaseq")).expect("open");
    for addr in ["0.0.0.0:0", "192.0.2.1:0"] {
        match dashboard::serve(&queue, addr) {
            Err(Error::InvalidOption { field: "addr", .. }) => {}
            other => panic!("{addr}: {other:?}"),
        }
    }
    for token in ["short", "has space in it 0123456789", &"x".repeat(129)] {
        match Dashboard::new(&queue).token(token).serve("127.0.0.1:0") {
            Err(Error::InvalidOption { field: "token", .. }) => {}
            other => panic!("{token:?}: {other:?}"),
        }
    }
    // A port in use: Io.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    match dashboard::serve(&queue, taken.local_addr().expect("addr")) {
        Err(Error::Io(_)) => {}
        other => panic!("a port in use: {other:?}"),
    }
    // Allowed off loopback, it serves (on every interface).
    let open = Dashboard::new(&queue)
        .allow_remote(true)
        .serve("0.0.0.0:0")
        .expect("allowed");
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], open.local_addr().port()));
    assert_eq!(get(local, open.token(), "/").status, 200);
}

#[test]
fn a_foreign_host_is_refused() {
    let app = app();
    let addr = app.server.local_addr();
    let auth = format!("Bearer {TOKEN}");
    let rebound = send(
        addr,
        "GET",
        "/",
        &[("Host", "attacker.example:80"), ("Authorization", &auth)],
        "",
    );
    assert_eq!(rebound.status, 403);
    let localhost = format!("localhost:{}", addr.port());
    let ok = send(
        addr,
        "GET",
        "/",
        &[("Host", &localhost), ("Authorization", &auth)],
        "",
    );
    assert_eq!(ok.status, 200);
}

#[test]
fn actions_from_elsewhere_write_nothing() {
    let app = app();
    let addr = app.server.local_addr();
    let id = dead(&app.queue, b"x", "boom");
    let page = get(addr, TOKEN, "/jobs?state=dead");
    let csrf = csrf_of(&page.body);
    let id_text = id.to_string();
    let retry = |csrf: &str| {
        vec![
            ("csrf", csrf.to_string()),
            ("op", "retry".to_string()),
            ("id", id_text.clone()),
        ]
    };
    let send_retry = |csrf: &str, extra: &[(&str, &str)]| {
        let owned = retry(csrf);
        let refs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post(addr, TOKEN, &refs, extra)
    };
    // No form token, a wrong one, another site's origin, a cross-site fetch: 403.
    assert_eq!(send_retry("", &[]).status, 403);
    assert_eq!(send_retry("0000", &[]).status, 403);
    assert_eq!(
        send_retry(&csrf, &[("Origin", "http://attacker.example")]).status,
        403
    );
    assert_eq!(send_retry(&csrf, &[("Origin", "null")]).status, 403);
    assert_eq!(
        send_retry(&csrf, &[("Sec-Fetch-Site", "cross-site")]).status,
        403
    );
    // Without the access token: 401, even with the form token.
    let owned = retry(&csrf);
    let refs: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let anonymous = send(addr, "POST", "/action", &[], &client::form(&refs));
    assert_eq!(anonymous.status, 401);
    // A GET never acts.
    let get_action = get(
        addr,
        TOKEN,
        &format!("/action?csrf={csrf}&op=retry&id={id}"),
    );
    assert_eq!(get_action.status, 405);
    assert_eq!(
        state(&app.queue, id),
        Some(JobState::Dead),
        "nothing written"
    );
    // The dashboard's own form, from its own origin: done, and back with a notice.
    let own = format!("http://{addr}");
    let done = send_retry(
        &csrf,
        &[("Origin", &own), ("Sec-Fetch-Site", "same-origin")],
    );
    assert_eq!(done.status, 303, "{}", done.body);
    assert!(
        done.header("location")
            .expect("location")
            .starts_with("/?notice=")
    );
    assert_eq!(state(&app.queue, id), Some(JobState::Ready));
}

#[test]
fn read_only_shows_no_buttons_and_refuses_actions() {
    let app = app_with(true);
    let addr = app.server.local_addr();
    let id = dead(&app.queue, b"x", "boom");
    let page = get(addr, TOKEN, "/jobs?state=dead");
    assert_eq!(page.status, 200);
    assert!(page.body.contains(&format!("data-job=\"{id}\"")));
    assert!(
        !page.body.contains("<form class=\"action\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("read-only"));
    for op in ["retry", "remove", "pause", "retry_dead"] {
        let id_text = id.to_string();
        let answer = post(addr, TOKEN, &[("op", op), ("id", &id_text)], &[]);
        assert_eq!(answer.status, 403, "{op}");
        assert!(answer.body.contains("read-only"), "{op}: {}", answer.body);
    }
    assert_eq!(state(&app.queue, id), Some(JobState::Dead));
    assert!(!app.queue.is_paused());
}

#[test]
fn wrong_state_and_missing_jobs_get_their_status_and_write_nothing() {
    let app = app();
    let addr = app.server.local_addr();
    let ready = app
        .queue
        .enqueue(b"r", EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let csrf = csrf_of(&get(addr, TOKEN, "/").body);
    let act =
        |op: &str, id: &str| post(addr, TOKEN, &[("csrf", &csrf), ("op", op), ("id", id)], &[]);
    let before = app.queue.stats().expect("stats");
    let ready_text = ready.to_string();
    let retry_ready = act("retry", &ready_text);
    assert_eq!(retry_ready.status, 409, "{}", retry_ready.body);
    assert!(retry_ready.body.contains("Nothing was changed"));
    assert_eq!(act("promote", &ready_text).status, 409);
    assert_eq!(act("retry", "999999").status, 404);
    assert_eq!(act("remove", "999999").status, 404);
    assert_eq!(act("retry", "not-a-number").status, 400);
    assert_eq!(act("explode", &ready_text).status, 400);
    // A leased job cannot be removed (end it through its lease, or cancel it).
    let lease = app.queue.dequeue().expect("dequeue").expect("a job");
    assert_eq!(act("remove", &ready_text).status, 409);
    assert_eq!(state(&app.queue, ready), Some(JobState::Leased));
    assert_eq!(app.queue.stats().expect("stats").total, before.total);
    // Cancel fences the lease.
    assert_eq!(act("cancel", &ready_text).status, 303);
    assert!(matches!(lease.ack(), Err(Error::Cancelled { .. })));
    // Pages: a job that does not exist, a bad id, an unknown page or state.
    assert_eq!(get(addr, TOKEN, "/job?id=999999").status, 404);
    assert_eq!(get(addr, TOKEN, "/job?id=abc").status, 400);
    assert_eq!(get(addr, TOKEN, "/payload?id=999999").status, 404);
    assert_eq!(get(addr, TOKEN, "/nowhere").status, 404);
    assert_eq!(get(addr, TOKEN, "/jobs?state=sleeping").status, 400);
    assert_eq!(get(addr, TOKEN, "/jobs?q=nope").status, 404);
    assert_eq!(
        get(addr, TOKEN, "/jobs?state=ready&after=garbage").status,
        400
    );
    assert_eq!(
        get(addr, TOKEN, "/jobs?state=ready&after=dead.1.2.3").status,
        400
    );
}

#[test]
fn pause_resume_retry_all_and_remove_act_on_the_queue() {
    let app = app();
    let addr = app.server.local_addr();
    let named = app.queue.named("emails").expect("named");
    let a = dead(&named, b"a", "smtp down");
    let b = dead(&named, b"b", "smtp down");
    let csrf = csrf_of(&get(addr, TOKEN, "/").body);
    let act = |pairs: &[(&str, &str)]| {
        let mut all = vec![("csrf", csrf.as_str())];
        all.extend_from_slice(pairs);
        post(addr, TOKEN, &all, &[])
    };
    assert_eq!(act(&[("op", "pause"), ("q", "emails")]).status, 303);
    assert!(named.stats().expect("stats").paused);
    assert!(
        !app.queue.stats().expect("stats").paused,
        "only the named queue"
    );
    let overview = get(addr, TOKEN, "/");
    assert!(
        overview.body.contains("data-op=\"resume\""),
        "{}",
        overview.body
    );
    assert_eq!(act(&[("op", "resume"), ("q", "emails")]).status, 303);
    assert!(!named.stats().expect("stats").paused);
    let b_text = b.to_string();
    assert_eq!(
        act(&[("op", "remove"), ("q", "emails"), ("id", &b_text)]).status,
        303
    );
    assert_eq!(state(&named, b), None);
    let done = act(&[
        ("op", "retry_dead"),
        ("q", "emails"),
        ("back", "/jobs?q=emails&state=dead"),
    ]);
    assert_eq!(done.status, 303);
    let location = done.header("location").expect("location");
    assert!(
        location.starts_with("/jobs?q=emails&state=dead&notice=1+dead"),
        "{location}"
    );
    assert_eq!(state(&named, a), Some(JobState::Ready));
    // The job is in the named queue: asked in the default one, it is not found.
    let a_text = a.to_string();
    assert_eq!(act(&[("op", "retry"), ("id", &a_text)]).status, 404);
    // A `back` off the dashboard is not followed.
    let away = act(&[("op", "pause"), ("back", "//attacker.example/")]);
    assert_eq!(
        away.header("location").map(|l| l.starts_with("/?")),
        Some(true)
    );
}

#[test]
fn pages_show_the_queue_and_escape_what_the_file_holds() {
    let app = app();
    let addr = app.server.local_addr();
    let evil = "<script>alert(1)</script>";
    let failed = dead(&app.queue, evil.as_bytes(), evil);
    let json = app
        .queue
        .enqueue(
            br#"{"to":"a@example.com","n":[1,2]}"#,
            EnqueueOptions::default().idempotency_key(evil),
        )
        .expect("enqueue")
        .id();
    let binary = app
        .queue
        .enqueue(&[0u8, 159, 146, 150, b'<'], EnqueueOptions::default())
        .expect("enqueue")
        .id();
    for target in [
        "/".to_string(),
        "/jobs?state=ready".into(),
        "/jobs?state=dead".into(),
        format!("/job?id={json}"),
        format!("/job?id={failed}&view=text"),
        format!("/jobs?state=ready&key={evil}"),
    ] {
        let target = target.replace('<', "%3C").replace('>', "%3E");
        let page = get(addr, TOKEN, &target);
        assert_eq!(page.status, 200, "{target}");
        assert!(
            !page.body.contains("<script>alert"),
            "{target} unescaped: {}",
            page.body
        );
    }
    let detail = get(addr, TOKEN, &format!("/job?id={json}")).body;
    assert!(
        detail.contains("data-view=\"json\""),
        "JSON chosen for a JSON payload"
    );
    assert!(
        detail.contains("&quot;to&quot;: &quot;a@example.com&quot;"),
        "{detail}"
    );
    assert!(detail.contains("&lt;script&gt;"), "the key shown, escaped");
    let hex = get(addr, TOKEN, &format!("/job?id={binary}")).body;
    assert!(hex.contains("data-view=\"hex\""), "hex chosen for bytes");
    assert!(hex.contains("00 9f 92 96 3c"), "{hex}");
    let dead_page = get(addr, TOKEN, &format!("/job?id={failed}")).body;
    assert!(dead_page.contains("data-state>dead<"), "{dead_page}");
    assert!(
        dead_page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the error, escaped"
    );
    // The download is the payload, byte for byte, and not rendered.
    let raw = get(addr, TOKEN, &format!("/payload?id={json}"));
    assert_eq!(raw.status, 200);
    assert_eq!(raw.header("content-type"), Some("application/octet-stream"));
    assert_eq!(raw.body, r#"{"to":"a@example.com","n":[1,2]}"#);
    // Headers that keep the pages from being framed or loading anything else.
    let csp = raw.header("content-security-policy").expect("csp");
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    // The counts on the overview and in JSON are the queue's.
    let stats = app.queue.stats().expect("stats");
    let overview = get(addr, TOKEN, "/api/overview");
    let doc: serde_json::Value = serde_json::from_str(&overview.body).expect("json");
    let default = &doc["queues"][0];
    assert_eq!(default["queue"], serde_json::Value::Null);
    assert_eq!(default["ready"], stats.ready);
    assert_eq!(default["dead"], stats.dead);
    let enqueued: u64 = default["metrics"]
        .as_array()
        .expect("minutes")
        .iter()
        .map(|m| m["enqueued"].as_u64().expect("a count"))
        .sum();
    assert_eq!(enqueued, 3, "the metrics not yet written are shown too");
}

#[test]
fn paging_and_search_by_key_reach_every_job() {
    let app = app();
    let addr = app.server.local_addr();
    let mut ids = Vec::new();
    for i in 0..130u32 {
        let key = format!("order-{i:03}");
        let opts = EnqueueOptions::default().dedup_key(&key);
        ids.push(app.queue.enqueue(b"p", opts).expect("enqueue").id());
    }
    // Paging: 50 a page, the cursor in the next link, every job once.
    let mut seen = Vec::new();
    let mut target = "/jobs?state=ready".to_string();
    loop {
        let page = get(addr, TOKEN, &target).body;
        seen.extend(job_rows(&page));
        match next_link(&page) {
            Some(next) => target = next,
            None => break,
        }
    }
    assert_eq!(seen, ids);
    // Search: a part of a key, across pages of the scan.
    let found = job_rows(&get(addr, TOKEN, "/jobs?state=ready&key=order-12").body);
    assert_eq!(found, ids[120..130].to_vec());
    // A number finds the job of that id, and the jobs whose keys hold its digits.
    let by_id = job_rows(&get(addr, TOKEN, &format!("/jobs?state=ready&key={}", ids[7])).body);
    assert!(by_id.contains(&ids[7]), "{by_id:?}");
    let digits = ids[7].to_string();
    let expected: Vec<JobId> = (0..130)
        .filter(|&i| ids[i] == ids[7] || format!("order-{i:03}").contains(&digits))
        .map(|i| ids[i])
        .collect();
    assert_eq!(by_id, expected);
    let nothing = get(addr, TOKEN, "/jobs?state=dead&key=order").body;
    assert!(job_rows(&nothing).is_empty());
    assert!(nothing.contains("0 found"));
    // More matches than a page: the rest is reached through "search on".
    let first = get(addr, TOKEN, "/jobs?state=ready&key=order-").body;
    let mut all = job_rows(&first);
    assert_eq!(all.len(), 50);
    let mut next = next_link(&first);
    while let Some(target) = next {
        let page = get(addr, TOKEN, &target).body;
        all.extend(job_rows(&page));
        next = next_link(&page);
    }
    assert_eq!(all, ids);
}

/// Posts action `op` on job `id` with the page's form token and the access token.
fn act(addr: std::net::SocketAddr, csrf: &str, op: &str, id: &str) -> client::Answer {
    post(addr, TOKEN, &[("csrf", csrf), ("op", op), ("id", id)], &[])
}

/// The ids of a jobs page's rows, in order.
fn job_rows(page: &str) -> Vec<JobId> {
    page.split("<tr data-job=\"")
        .skip(1)
        .map(|rest| {
            let id = rest.split('"').next().expect("id");
            JobId(
                id.parse()
                    .unwrap_or_else(|e| panic!("{e}: {id:?} in {page}")),
            )
        })
        .collect()
}

/// The `next` link of a page, unescaped.
fn next_link(page: &str) -> Option<String> {
    let at = page.find("rel=\"next\" href=\"")? + "rel=\"next\" href=\"".len();
    Some(page[at..].split('"').next()?.replace("&amp;", "&"))
}

#[test]
fn job_cursors_survive_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::open(dir.path().join("q.leaseq")).expect("open");
    for i in 0..5u8 {
        queue
            .enqueue(&[i], EnqueueOptions::default())
            .expect("enqueue");
    }
    let page = queue.jobs(JobState::Ready, None, 2).expect("page");
    let cursor = page.next.expect("a next page");
    let text = cursor.to_text();
    assert!(text.starts_with("ready."), "{text}");
    assert_eq!(JobCursor::parse(&text).expect("parse"), cursor);
    assert_eq!(cursor.state(), JobState::Ready);
    let rest = queue
        .jobs(
            JobState::Ready,
            Some(JobCursor::parse(&text).expect("parse")),
            10,
        )
        .expect("page");
    assert_eq!(rest.jobs.len(), 3);
    for bad in [
        "",
        "ready",
        "ready.1.2",
        "ready.1.2.3.4",
        "sleeping.1.2.3",
        "ready.-1.2.3",
        "ready.a.b.c",
    ] {
        assert!(
            matches!(JobCursor::parse(bad), Err(Error::InvalidOption { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn a_file_dashboard_reads_beside_a_live_app_and_acts_when_nobody_holds_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.leaseq");
    let app = Queue::builder().live_reads(true).open(&path).expect("open");
    let id = dead(&app, b"x", "boom");
    app.flush().expect("flush");
    let server = Dashboard::for_file(&path)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve beside a live app");
    let addr = server.local_addr();
    let page = get(addr, TOKEN, "/jobs?state=dead");
    assert!(
        page.body.contains(&format!("data-job=\"{id}\"")),
        "{}",
        page.body
    );
    // A job enqueued by the app shows at the next page.
    app.enqueue(b"new", EnqueueOptions::default())
        .expect("enqueue");
    let doc: serde_json::Value =
        serde_json::from_str(&get(addr, TOKEN, "/api/overview").body).expect("json");
    assert_eq!(doc["live"], true);
    assert_eq!(doc["queues"][0]["ready"], 1);
    // An action while the app holds the file: 409, nothing written, and the page says
    // what works.
    let csrf = csrf_of(&page.body);
    let id_text = id.to_string();
    let refused = act(addr, &csrf, "retry", &id_text);
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(
        refused.body.contains("leaseq::control::serve"),
        "{}",
        refused.body
    );
    assert_eq!(state(&app, id), Some(JobState::Dead));
    // The app opens its control channel: the same action goes through the app.
    let channel = leaseq::control::serve(&app).expect("control channel");
    let done = act(addr, &csrf, "retry", &id_text);
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(state(&app, id), Some(JobState::Ready));
    let paused = act(addr, &csrf, "pause", "");
    assert_eq!(paused.status, 303, "{}", paused.body);
    assert!(app.is_paused());
    // A wrong state through the channel is the same 409, nothing written.
    let again = act(addr, &csrf, "retry", &id_text);
    assert_eq!(again.status, 409, "{}", again.body);
    assert_eq!(state(&app, id), Some(JobState::Ready));
    drop(channel);
    app.resume().expect("resume");
    app.purge(JobState::Ready).expect("purge");
    let id = dead(&app, b"y", "boom");
    let id_text = id.to_string();
    // The app stops: the action opens the file for itself and is done.
    drop(app);
    let done = act(addr, &csrf, "retry", &id_text);
    assert_eq!(done.status, 303, "{}", done.body);
    // Between requests the dashboard holds nothing: the app opens again at once.
    let again = Queue::open(&path).expect("reopen while the dashboard serves");
    assert_eq!(state(&again, id), Some(JobState::Ready));
    drop(again);
    server.stop();
}

#[test]
fn a_file_dashboard_refuses_what_it_cannot_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, b"not a queue at all, just some text long enough").expect("write");
    match Dashboard::for_file(&foreign).serve("127.0.0.1:0") {
        Err(Error::NotLeaseq { .. }) => {}
        other => panic!("a foreign file: {other:?}"),
    }
    assert_eq!(
        std::fs::read(&foreign).expect("read"),
        b"not a queue at all, just some text long enough"
    );
    let path = dir.path().join("q.leaseq");
    let app = Queue::open(&path).expect("open");
    match Dashboard::for_file(&path).serve("127.0.0.1:0") {
        Err(Error::HeldExclusively { .. }) => {}
        other => panic!("held exclusively: {other:?}"),
    }
    drop(app);
    match Dashboard::for_file(dir.path().join("missing.leaseq")).serve("127.0.0.1:0") {
        Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => panic!("a missing file: {other:?}"),
    }
    assert!(!dir.path().join("missing.leaseq").exists());
}

#[test]
fn stopping_closes_the_port() {
    let app = app();
    let addr = app.server.local_addr();
    assert_eq!(get(addr, TOKEN, "/").status, 200);
    app.server.stop();
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still listening"
    );
}

#[test]
fn a_shutdown_is_not_held_up_by_the_dashboard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.leaseq");
    let queue = Queue::open(&path).expect("open");
    queue
        .enqueue(b"x", EnqueueOptions::default())
        .expect("enqueue");
    let server = Dashboard::new(&queue)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    let addr = server.local_addr();
    assert_eq!(get(addr, TOKEN, "/").status, 200);
    // Clients keep connecting, and leave, meanwhile.
    let churn_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let stop = churn_stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(std::net::TcpStream::connect(addr));
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // The dashboard keeps a handle; the shutdown waits for it to let go, which it does.
    let report = queue.shutdown(Duration::from_secs(10));
    churn_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().expect("churn");
    assert!(report.released, "{report:?}");
    let closed = get(addr, TOKEN, "/");
    assert_eq!(closed.status, 503, "{}", closed.body);
    let reopened = Queue::open(&path).expect("reopen");
    assert_eq!(reopened.stats().expect("stats").ready, 1);
    assert!(!reopened.recovery().repaired);
}

#[test]
fn a_named_handle_serves_the_whole_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::open(dir.path().join("q.leaseq")).expect("open");
    let mail = queue.named("mail").expect("named");
    queue
        .enqueue(b"d", EnqueueOptions::default())
        .expect("enqueue");
    for _ in 0..3 {
        mail.enqueue(b"m", EnqueueOptions::default())
            .expect("enqueue");
    }
    let server = Dashboard::new(&mail)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    let doc: serde_json::Value =
        serde_json::from_str(&get(server.local_addr(), TOKEN, "/api/overview").body).expect("json");
    assert_eq!(doc["queues"][0]["queue"], serde_json::Value::Null);
    assert_eq!(
        doc["queues"][0]["ready"], 1,
        "the default queue's own count"
    );
    assert_eq!(doc["queues"][1]["queue"], "mail");
    assert_eq!(doc["queues"][1]["ready"], 3);
    assert_eq!(queue.default_queue().stats().expect("stats").ready, 1);
    assert_eq!(mail.default_queue().name(), None);
}

#[test]
fn redirects_stay_on_the_dashboard_and_carry_no_injected_header() {
    let app = app();
    let addr = app.server.local_addr();
    let csrf = csrf_of(&get(addr, TOKEN, "/").body);
    for back in [
        "/x\r\nSet-Cookie: injected=1",
        "//attacker.example/",
        "/\t/attacker.example/",
        "/\\attacker.example",
        "https://attacker.example/",
        "/jobs?state=dead&x=\r\nSet-Cookie:%20injected=1",
        "/jobs?state=d\u{e9}ad",
    ] {
        let answer = post(
            addr,
            TOKEN,
            &[("csrf", &csrf), ("op", "pause"), ("back", back)],
            &[],
        );
        assert_eq!(answer.status, 303, "{back:?}: {}", answer.body);
        let location = answer.header("location").expect("a location");
        assert!(
            ["/?", "/jobs?", "/job?", "/schedules?"]
                .iter()
                .any(|p| location.starts_with(p)),
            "{back:?} sent the browser to {location:?}"
        );
        assert!(
            !answer
                .headers
                .iter()
                .any(|(k, v)| k == "set-cookie" || v.contains("injected")),
            "{back:?}: {:?}",
            answer.headers
        );
    }
    // The token's redirect keeps to the dashboard too.
    let away = send(
        addr,
        "GET",
        &format!("//attacker.example/?token={TOKEN}"),
        &[],
        "",
    );
    assert_eq!(away.status, 303);
    assert_eq!(away.header("location"), Some("/"));
}

#[test]
fn bodies_beyond_the_bound_are_refused_and_slow_clients_hold_nothing() {
    use std::io::Write;
    let app = app();
    let addr = app.server.local_addr();
    let auth = format!("Bearer {TOKEN}");
    // A declared length far beyond the bound: refused at once, nothing read or allocated.
    let mut huge = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        huge,
        "POST /action HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\n\
         Content-Length: 1000000000000000000\r\n\r\n"
    )
    .expect("write");
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut huge, &mut answer).expect("read");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let big_form = "x=".to_string() + &"a".repeat(20 * 1024);
    let big = send(
        addr,
        "POST",
        "/action",
        &[("Authorization", &auth)],
        &big_form,
    );
    assert_eq!(big.status, 413);
    // Clients that declare a body and send none, more of them than answering threads.
    let stalled: Vec<std::net::TcpStream> = (0..8)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            write!(
                s,
                "POST /action HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\n\
                 Content-Length: 2000\r\n\r\n"
            )
            .expect("write");
            s
        })
        .collect();
    // And one that never ends its head.
    let mut endless = std::net::TcpStream::connect(addr).expect("connect");
    write!(endless, "GET / HTTP/1.1\r\nX-Long: ").expect("write");
    let _ = endless.write_all(&[b'a'; 64 * 1024]);
    // Everyone else is still answered.
    assert_eq!(get(addr, TOKEN, "/").status, 200);
    let head = send(addr, "HEAD", "/", &[("Authorization", &auth)], "");
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "a HEAD answer has no body");
    // And a stop does not wait for them (a hang fails the test by its harness's timeout).
    app.server.stop();
    drop(stalled);
}

#[test]
fn removing_a_job_from_its_page_goes_back_to_its_list() {
    let app = app();
    let addr = app.server.local_addr();
    let id = dead(&app.queue, b"x", "boom");
    let page = get(addr, TOKEN, &format!("/job?id={id}")).body;
    let csrf = csrf_of(&page);
    // The page's own remove form names where to go back to.
    let remove_form = page
        .split("<form")
        .find(|f| f.contains("value=\"remove\""))
        .expect("a remove form");
    let marker = "name=\"back\" value=\"";
    let back_at = remove_form.find(marker).expect("back") + marker.len();
    let back = remove_form[back_at..]
        .split('"')
        .next()
        .expect("value")
        .replace("&amp;", "&");
    let id_text = id.to_string();
    let done = post(
        addr,
        TOKEN,
        &[
            ("csrf", &csrf),
            ("op", "remove"),
            ("id", &id_text),
            ("back", &back),
        ],
        &[],
    );
    assert_eq!(done.status, 303);
    let location = done.header("location").expect("location");
    assert!(
        location.starts_with("/jobs?state=dead&notice="),
        "{location}"
    );
    assert_eq!(state(&app.queue, id), None);
}

#[test]
fn a_file_dashboards_actions_take_turns_with_its_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.leaseq");
    let ids: Vec<JobId> = {
        let queue = Queue::open(&path).expect("open");
        (0..20).map(|i| dead(&queue, &[i], "boom")).collect()
    };
    let server = Dashboard::for_file(&path)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    let addr = server.local_addr();
    let csrf = csrf_of(&get(addr, TOKEN, "/").body);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut pages = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let page = get(addr, TOKEN, "/");
                    assert_eq!(page.status, 200, "{}", page.body);
                    pages += 1;
                }
                pages
            })
        })
        .collect();
    for id in &ids {
        let id_text = id.to_string();
        let done = act(addr, &csrf, "retry", &id_text);
        assert_eq!(done.status, 303, "{}", done.body);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().expect("reader") > 0);
    }
    drop(server);
    let queue = Queue::open(&path).expect("reopen");
    for id in ids {
        assert_eq!(state(&queue, id), Some(JobState::Ready));
    }
}

#[test]
fn a_notice_comes_only_from_the_dashboards_own_redirect() {
    let app = app();
    let addr = app.server.local_addr();
    let auth = format!("Bearer {TOKEN}");
    let target = "/?notice=Session+expired%3A+log+in+at+attacker.example";
    let own = send(
        addr,
        "GET",
        target,
        &[("Authorization", &auth), ("Sec-Fetch-Site", "same-origin")],
        "",
    );
    assert!(own.body.contains("class=\"notice\""), "{}", own.body);
    for site in ["same-site", "cross-site"] {
        let linked = send(
            addr,
            "GET",
            target,
            &[("Authorization", &auth), ("Sec-Fetch-Site", site)],
            "",
        );
        assert_eq!(linked.status, 200);
        assert!(
            !linked.body.contains("attacker.example"),
            "{site}: {}",
            linked.body
        );
    }
    // The scheme's name in any case; the default queue named as the tool names it, apart
    // from a queue named "default".
    app.queue.named("default").expect("named");
    let lower = format!("bearer {TOKEN}");
    let page = send(addr, "GET", "/", &[("Authorization", &lower)], "");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<h2>(default)"), "{}", page.body);
    assert!(page.body.contains("<h2>default"), "{}", page.body);
}

#[test]
fn a_file_left_by_a_crash_is_shown_to_pages_asked_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q.leaseq");
    let copy = dir.path().join("copy.leaseq");
    let app = Queue::open(&path).expect("open");
    app.enqueue(b"a", EnqueueOptions::default())
        .expect("enqueue");
    app.enqueue(b"b", EnqueueOptions::default())
        .expect("enqueue");
    let _lease = app.dequeue().expect("dequeue").expect("a job");
    // A copy of a file being written (the queue file, then its journal): it needs a repair,
    // read from a copy fixed in memory with the journal replayed.
    std::fs::copy(&path, &copy).expect("copy");
    std::fs::copy(
        dir.path().join("q.leaseq-journal"),
        dir.path().join("copy.leaseq-journal"),
    )
    .expect("copy the journal");
    drop(_lease);
    drop(app);
    let before = std::fs::read(&copy).expect("read");
    let server = Dashboard::for_file(&copy)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    let addr = server.local_addr();
    let pages: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                (0..10)
                    .map(|_| get(addr, TOKEN, "/api/overview"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for page in pages.into_iter().flat_map(|t| t.join().expect("pages")) {
        assert_eq!(page.status, 200, "{}", page.body);
        let doc: serde_json::Value = serde_json::from_str(&page.body).expect("json");
        assert_eq!(doc["live"], false, "a repaired copy");
        assert_eq!(
            doc["queues"][0]["leased"], 1,
            "the lease in flight shows as leased"
        );
    }
    drop(server);
    assert_eq!(
        std::fs::read(&copy).expect("read"),
        before,
        "pages write nothing"
    );
}

#[test]
fn a_request_head_beyond_the_bound_is_refused() {
    let app = app();
    let addr = app.server.local_addr();
    let auth = format!("Bearer {TOKEN}");
    let long = "a".repeat(9 * 1024);
    let answer = send(
        addr,
        "GET",
        "/",
        &[("Authorization", &auth), ("X-Long", &long)],
        "",
    );
    assert_eq!(answer.status, 431, "{}", answer.body);
    assert_eq!(
        get(addr, TOKEN, "/").status,
        200,
        "the dashboard still answers"
    );
}

/// The overview charts the 24 hours the file keeps, per 10 minutes, without the unfinished
/// minute, and says how long the oldest ready job has waited.
#[test]
fn the_overview_charts_a_day_of_whole_minutes_and_the_longest_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    // Three jobs enqueued 5 hours ago (by the queue's clock), five in this minute.
    let clock = leaseq::ManualClock::new(now - 5 * 3_600_000);
    let queue = Queue::builder()
        .clock(clock.clone())
        .open(dir.path().join("q.leaseq"))
        .expect("open");
    for _ in 0..3 {
        queue
            .enqueue(b"old", EnqueueOptions::default())
            .expect("enqueue");
    }
    clock.set_ms(now);
    for _ in 0..5 {
        queue
            .enqueue(b"new", EnqueueOptions::default())
            .expect("enqueue");
    }
    queue.flush().expect("flush");
    let server = Dashboard::new(&queue)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    let page = get(server.local_addr(), TOKEN, "/").body;
    let enqueued = page
        .split("<polyline class=\"enqueued\"")
        .nth(1)
        .and_then(|rest| rest.split(" points=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .expect("the enqueued line");
    let ys: Vec<u64> = enqueued
        .split(' ')
        .map(|p| p.split(',').nth(1).expect("y").parse().expect("a number"))
        .collect();
    assert_eq!(ys.len(), 144, "24 hours of 10-minute points");
    // One point holds the 3 jobs of 5 hours ago at the top (peak 3); the 5 of this minute
    // are not drawn (the minute is not over), so every other point is at the bottom.
    let raised: Vec<usize> = (0..ys.len()).filter(|&i| ys[i] < 90).collect();
    assert_eq!(raised.len(), 1, "{ys:?}");
    assert_eq!(ys[raised[0]], 0, "the only point is the peak");
    assert!(
        (113..=115).contains(&raised[0]),
        "5 hours ago is point 114: {raised:?}"
    );
    assert!(page.contains("peak 3 per 10 min"), "{page}");
    assert!(page.contains("Last 24 hours: 8 enqueued"), "{page}");
    // The oldest ready job has waited 5 hours.
    let at = page.find("data-oldest-ready-ms=\"").expect("the wait") + 22;
    let waited: u64 = page[at..]
        .split('"')
        .next()
        .expect("ms")
        .parse()
        .expect("ms");
    assert!(
        (5 * 3_600_000..5 * 3_600_000 + 60_000).contains(&waited),
        "{waited}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&get(server.local_addr(), TOKEN, "/api/overview").body).expect("json");
    assert!(doc["queues"][0]["oldest_ready_ms"].as_u64().expect("ms") >= 5 * 3_600_000);
    server.stop();
}

/// Progress shows as a percentage with its message, in the list and on the job's page, and
/// a leased job whose deadline passed (its heartbeats stopped) is marked stalled.
#[test]
fn progress_reads_as_a_percentage_and_a_lapsed_lease_as_stalled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = leaseq::ManualClock::new(1_000_000);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    clock.set_ms(now);
    let queue = Queue::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .open(dir.path().join("q.leaseq"))
        .expect("open");
    for payload in [&b"a"[..], b"b", b"c"] {
        queue
            .enqueue(payload, EnqueueOptions::default())
            .expect("enqueue");
    }
    let a = queue.dequeue().expect("dequeue").expect("a");
    a.set_progress_percent(30, Some("uploading 3 of 10"))
        .expect("progress");
    let b = queue.dequeue().expect("dequeue").expect("b");
    b.set_progress(&[90]).expect("one byte");
    // c was leased 31 s ago by the queue's clock: its lease ended without a heartbeat.
    clock.set_ms(now - 31_000);
    let c = queue.dequeue().expect("dequeue").expect("c");
    clock.set_ms(now);
    let server = Dashboard::new(&queue)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    let addr = server.local_addr();
    let list = get(addr, TOKEN, "/jobs?state=leased").body;
    let row = |id: JobId| {
        list.split(&format!("<tr data-job=\"{id}\""))
            .nth(1)
            .and_then(|r| r.split("</tr>").next())
            .unwrap_or_else(|| panic!("row {id} in {list}"))
            .to_string()
    };
    let ra = row(a.id());
    assert!(ra.contains("data-progress-percent=\"30\""), "{ra}");
    assert!(ra.contains("30 % uploading 3 of 10"), "{ra}");
    assert!(!ra.contains("stalled"), "{ra}");
    let rb = row(b.id());
    assert!(
        rb.contains("data-progress-percent=\"90\"") && rb.contains("90 %"),
        "{rb}"
    );
    assert!(!rb.contains('Z'), "90 % is not the character Z: {rb}");
    let rc = row(c.id());
    assert!(rc.contains("data-stalled=\"lapsed\""), "{rc}");
    let page = get(addr, TOKEN, &format!("/job?id={}", a.id())).body;
    assert!(page.contains("30 % uploading 3 of 10"), "{page}");
    // Refused: above 100 %, nothing recorded.
    assert!(matches!(
        b.set_progress_percent(101, None),
        Err(Error::InvalidOption { .. })
    ));
    assert_eq!(
        queue
            .job(b.id())
            .expect("job")
            .expect("b")
            .progress
            .as_deref(),
        Some(&[90u8][..])
    );
    drop((a, b, c));
    server.stop();
}

/// A bulk action acts on each selected job in its own commit and says which were refused;
/// "remove all dead" empties the dead letters; without the form token nothing is written.
#[test]
fn bulk_actions_act_on_each_selected_job_and_remove_all_dead_empties_the_list() {
    let a = app();
    let addr = a.server.local_addr();
    let d1 = dead(&a.queue, b"1", "boom");
    let d2 = dead(&a.queue, b"2", "boom");
    let ready = a
        .queue
        .enqueue(b"r", EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let page = get(addr, TOKEN, "/jobs?state=dead").body;
    assert!(page.contains("form=\"bulk\""), "checkboxes: {page}");
    assert!(page.contains("value=\"bulk_retry\""), "{page}");
    assert!(page.contains("data-op=\"remove_dead\""), "{page}");
    let csrf = csrf_of(&page);
    let (s1, s2, s3) = (d1.to_string(), d2.to_string(), ready.to_string());
    // Without the form token: refused, nothing written.
    let refused = post(
        addr,
        TOKEN,
        &[("op", "bulk_retry"), ("id", &s1), ("id", &s2)],
        &[],
    );
    assert_eq!(refused.status, 403);
    assert_eq!(state(&a.queue, d1), Some(JobState::Dead));
    // The two dead jobs run again; the ready one is refused and said so.
    let done = post(
        addr,
        TOKEN,
        &[
            ("csrf", &csrf),
            ("op", "bulk_retry"),
            ("back", "/jobs?state=dead"),
            ("id", &s1),
            ("id", &s2),
            ("id", &s3),
        ],
        &[],
    );
    assert_eq!(done.status, 303, "{}", done.body);
    let to = done.header("location").expect("location");
    let notice: String = form_urlencoded::parse(to.split_once('?').expect("query").1.as_bytes())
        .find(|(k, _)| k == "notice")
        .map(|(_, v)| v.into_owned())
        .expect("a notice");
    assert!(
        notice.starts_with("2 jobs run again; 1 refused: job"),
        "{notice}"
    );
    assert_eq!(state(&a.queue, d1), Some(JobState::Ready));
    assert_eq!(state(&a.queue, d2), Some(JobState::Ready));
    // Bulk remove of the three ready jobs.
    let done = post(
        addr,
        TOKEN,
        &[
            ("csrf", &csrf),
            ("op", "bulk_remove"),
            ("id", &s1),
            ("id", &s2),
            ("id", &s3),
        ],
        &[],
    );
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(a.queue.stats().expect("stats").total, 0);
    // Nothing selected, or a bad id: 400, nothing written.
    let none = post(addr, TOKEN, &[("csrf", &csrf), ("op", "bulk_remove")], &[]);
    assert_eq!(none.status, 400, "{}", none.body);
    let d3 = dead(&a.queue, b"3", "boom");
    let bad = post(
        addr,
        TOKEN,
        &[
            ("csrf", &csrf),
            ("op", "bulk_retry"),
            ("id", &d3.to_string()),
            ("id", "x"),
        ],
        &[],
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(
        state(&a.queue, d3),
        Some(JobState::Dead),
        "a bad id acts on none"
    );
    // Remove all dead.
    dead(&a.queue, b"4", "boom");
    let done = post(addr, TOKEN, &[("csrf", &csrf), ("op", "remove_dead")], &[]);
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(a.queue.stats().expect("stats").dead, 0);
}

/// A ready job that does not move says why: held behind its group's head (linked), or its
/// queue paused.
#[test]
fn a_waiting_ready_job_says_why() {
    let a = app();
    let addr = a.server.local_addr();
    let opts = || EnqueueOptions::default().group("doc-7");
    let head = a.queue.enqueue(b"v1", opts()).expect("enqueue").id();
    let held = a.queue.enqueue(b"v2", opts()).expect("enqueue").id();
    let free = a
        .queue
        .enqueue(b"free", EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let lease = a.queue.dequeue().expect("dequeue").expect("the head");
    assert_eq!(lease.id(), head);
    let list = get(addr, TOKEN, "/jobs?state=ready").body;
    let row = |id: JobId| {
        list.split(&format!("<tr data-job=\"{id}\""))
            .nth(1)
            .and_then(|r| r.split("</tr>").next())
            .unwrap_or_else(|| panic!("row {id}"))
            .to_string()
    };
    assert!(
        row(held).contains(&format!("data-held-behind=\"{head}\"")),
        "{}",
        row(held)
    );
    assert!(!row(free).contains("data-held-behind"), "{}", row(free));
    assert!(!row(free).contains("data-waiting"), "{}", row(free));
    let page = get(addr, TOKEN, &format!("/job?id={held}")).body;
    assert!(
        page.contains(&format!(
            "held behind <a href=\"/job?id={head}\">job {head}</a>"
        )),
        "{page}"
    );
    a.queue.pause().expect("pause");
    let list = get(addr, TOKEN, "/jobs?state=ready").body;
    let free_row = list
        .split(&format!("<tr data-job=\"{free}\""))
        .nth(1)
        .expect("row");
    assert!(
        free_row
            .split("</tr>")
            .next()
            .expect("row")
            .contains("data-waiting=\"paused\""),
        "{free_row}"
    );
    lease.ack().expect("ack");
    // Resumed, with a rate limit of one delivery an hour, used up: the rest wait for the
    // window's end, which the job's row and the overview say.
    a.queue.resume().expect("resume");
    a.queue
        .set_rate_limit(Some(leaseq::RateLimit::new(1, Duration::from_secs(3600))))
        .expect("limit");
    let next = a.queue.dequeue().expect("dequeue").expect("one more");
    assert!(a.queue.dequeue().expect("dequeue").is_none(), "limited");
    let waiting = a
        .queue
        .enqueue(b"late", EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let until = a
        .queue
        .reader()
        .rate_limited_until(leaseq::Clock::now_ms(&leaseq::SystemClock))
        .expect("read")
        .expect("the window is used up");
    let list = get(addr, TOKEN, "/jobs?state=ready").body;
    let late_row = list
        .split(&format!("<tr data-job=\"{waiting}\""))
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .expect("row");
    assert!(
        late_row.contains("data-waiting=\"rate-limited\"")
            && late_row.contains("rate limited until"),
        "{late_row}"
    );
    let overview = get(addr, TOKEN, "/").body;
    assert!(
        overview.contains(&format!("data-rate-limited-until=\"{until}\"")),
        "{overview}"
    );
    a.queue.set_rate_limit(None).expect("no limit");
    assert_eq!(
        a.queue
            .reader()
            .rate_limited_until(until - 1)
            .expect("read"),
        None,
        "no limit, nothing held back"
    );
    next.ack().expect("ack");
}

/// The schedules page lists every queue's schedules (one queue with `q`), each with a
/// Remove button that removes it and leaves its jobs.
#[test]
fn the_schedules_page_shows_every_queue_and_removes_one() {
    let a = app();
    let addr = a.server.local_addr();
    let mail = a.queue.named("mail").expect("named");
    let sync = a.queue.named("sync").expect("named");
    mail.create_schedule(
        "digest",
        &leaseq::Schedule::every(Duration::from_secs(3600)),
    )
    .expect("schedule");
    sync.create_schedule("pull", &leaseq::Schedule::every(Duration::from_secs(60)))
        .expect("schedule");
    let all = get(addr, TOKEN, "/schedules").body;
    assert!(all.contains("data-schedule=\"digest\""), "{all}");
    assert!(all.contains("data-schedule=\"pull\""), "{all}");
    assert!(all.contains("data-queue=\"mail\"") && all.contains("data-queue=\"sync\""));
    let default_only = get(addr, TOKEN, "/schedules?q=(default)").body;
    assert!(
        default_only.contains("No schedules in (default)"),
        "{default_only}"
    );
    let mail_only = get(addr, TOKEN, "/schedules?q=mail").body;
    assert!(mail_only.contains("data-schedule=\"digest\"") && !mail_only.contains("\"pull\""));
    // The overview links the default queue to its own schedules.
    let overview = get(addr, TOKEN, "/").body;
    assert!(
        overview.contains("/schedules?q=%28default%29"),
        "{overview}"
    );
    let csrf = csrf_of(&all);
    // Each schedule has Run now, Pause and Remove.
    for op in ["trigger_schedule", "pause_schedule", "remove_schedule"] {
        assert!(all.contains(&format!("data-op=\"{op}\"")), "{op}: {all}");
    }
    let act = |op: &str, q: &str, name: &str| {
        post(
            addr,
            TOKEN,
            &[
                ("csrf", &csrf),
                ("op", op),
                ("q", q),
                ("name", name),
                ("back", "/schedules"),
            ],
            &[],
        )
    };
    // Each action's notice says what it did (decoded from the redirect's query).
    let notice = |answer: &client::Answer| {
        let location = answer.header("location").expect("a location").to_string();
        let raw = location
            .split(['?', '&'])
            .find_map(|pair| pair.strip_prefix("notice="))
            .unwrap_or_else(|| panic!("a notice in {location}"));
        // Form-urlencoded: `+` for a space, `%XX` for a byte.
        let mut bytes = Vec::new();
        let mut rest = raw.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            match b {
                b'+' => bytes.push(b' '),
                b'%' if tail.len() >= 2 => {
                    let hex = std::str::from_utf8(&tail[..2]).expect("hex");
                    bytes.push(u8::from_str_radix(hex, 16).expect("a byte"));
                    rest = &tail[2..];
                    continue;
                }
                b => bytes.push(b),
            }
            rest = tail;
        }
        String::from_utf8(bytes).expect("UTF-8")
    };
    // Pause: shown paused with Resume in place of Pause; Resume: due again.
    let paused = act("pause_schedule", "mail", "digest");
    assert_eq!(paused.status, 303);
    assert_eq!(notice(&paused), "schedule \"digest\" paused");
    assert_eq!(
        notice(&act("pause_schedule", "mail", "digest")),
        "schedule \"digest\" was already paused"
    );
    let digest = mail.schedule("digest").expect("read").expect("digest");
    assert_eq!(digest.next_due_ms, None);
    let page = get(addr, TOKEN, "/schedules?q=mail").body;
    let at = digest.paused_ms.expect("paused");
    assert!(
        page.contains(&format!("data-schedule-paused=\"{at}\"")),
        "{page}"
    );
    assert!(
        page.contains("data-op=\"resume_schedule\"")
            && !page.contains("data-op=\"pause_schedule\"")
    );
    // Run now: one instance, ready, though paused.
    let ran = act("trigger_schedule", "mail", "digest");
    assert_eq!(ran.status, 303, "{}", ran.body);
    let digest = mail.schedule("digest").expect("read").expect("digest");
    let (job, _) = digest.last_job.expect("an instance");
    assert_eq!(
        notice(&ran),
        format!("schedule \"digest\" enqueued job {job}")
    );
    assert_eq!((digest.fired, mail.stats().expect("stats").ready), (1, 1));
    assert!(digest.paused_ms.is_some());
    assert_eq!(
        mail.job(job).expect("read").expect("the job").state,
        JobState::Ready
    );
    let resumed = act("resume_schedule", "mail", "digest");
    assert_eq!(resumed.status, 303);
    assert_eq!(notice(&resumed), "schedule \"digest\" resumed");
    assert!(
        mail.schedule("digest")
            .expect("read")
            .expect("digest")
            .next_due_ms
            .is_some()
    );
    let done = act("remove_schedule", "sync", "pull");
    assert_eq!(done.status, 303, "{}", done.body);
    assert!(sync.schedules().expect("schedules").is_empty());
    assert_eq!(mail.schedules().expect("schedules").len(), 1);
    // Again: the schedule is gone, 404, nothing written.
    let again = post(
        addr,
        TOKEN,
        &[
            ("csrf", &csrf),
            ("op", "remove_schedule"),
            ("q", "sync"),
            ("name", "pull"),
        ],
        &[],
    );
    assert_eq!(again.status, 404, "{}", again.body);
    assert_eq!(mail.schedules().expect("schedules").len(), 1);
}

/// Dead, completed and cancelled lists are newest first (the latest failures on the first
/// page) and page both ways: "older" to the end reaches every job once, "newer" back from
/// there shows the same pages again.
#[test]
fn dead_lists_are_newest_first_and_page_both_ways() {
    let app = app();
    let addr = app.server.local_addr();
    let mut ids = Vec::new();
    for i in 0..120u32 {
        ids.push(dead(&app.queue, &i.to_le_bytes(), "boom"));
    }
    let newest: Vec<JobId> = ids.iter().rev().copied().collect();
    let prev_link = |page: &str| -> Option<String> {
        let at = page.find("rel=\"prev\" href=\"")? + "rel=\"prev\" href=\"".len();
        Some(page[at..].split('"').next()?.replace("&amp;", "&"))
    };
    let mut pages = Vec::new();
    let mut target = "/jobs?state=dead".to_string();
    loop {
        let page = get(addr, TOKEN, &target).body;
        assert_eq!(
            prev_link(&page).is_some(),
            !pages.is_empty(),
            "a newer link on every page but the first"
        );
        pages.push(job_rows(&page));
        match next_link(&page) {
            Some(next) => target = next,
            None => break,
        }
    }
    assert_eq!(pages.concat(), newest, "older pages reach every job once");
    assert_eq!(pages[0].len(), 50);
    // Back from the oldest page: the same pages, newest first on each.
    let mut back = Vec::new();
    let mut page = get(addr, TOKEN, &target).body;
    while let Some(prev) = prev_link(&page) {
        page = get(addr, TOKEN, &prev).body;
        back.push(job_rows(&page));
    }
    back.reverse();
    assert_eq!(
        back.concat(),
        newest[..newest.len() - pages.last().expect("a page").len()]
    );
    assert_eq!(back[0], pages[0], "newer leads back to the first page");
}

/// A search in every state finds matches whichever state they are in, says each one's
/// state, and offers to read on in a state with more than a page of matches.
#[test]
fn a_search_in_every_state_finds_jobs_wherever_they_are() {
    let app = app();
    let addr = app.server.local_addr();
    app.queue
        .set_history(leaseq::History::off().keep_jobs(100))
        .expect("history");
    let key = |i: u32| format!("order-{i:03}");
    let d = {
        let id = app
            .queue
            .enqueue(b"d", EnqueueOptions::default().idempotency_key(key(1)))
            .expect("enqueue")
            .id();
        let lease = app.queue.dequeue().expect("dequeue").expect("a job");
        assert_eq!(lease.id(), id);
        lease.fail("boom").expect("fail");
        id
    };
    let c = {
        let id = app
            .queue
            .enqueue(b"c", EnqueueOptions::default().idempotency_key(key(2)))
            .expect("enqueue")
            .id();
        let lease = app.queue.dequeue().expect("dequeue").expect("a job");
        lease.ack().expect("ack");
        id
    };
    let s = app
        .queue
        .enqueue(
            b"s",
            EnqueueOptions::default()
                .dedup_key(key(3))
                .delay(Duration::from_secs(60)),
        )
        .expect("enqueue")
        .id();
    let mut ready = Vec::new();
    for i in 10..70 {
        ready.push(
            app.queue
                .enqueue(b"r", EnqueueOptions::default().dedup_key(key(i)))
                .expect("enqueue")
                .id(),
        );
    }
    let page = get(addr, TOKEN, "/search?key=order-0").body;
    let state_of = |id: JobId| {
        page.split(&format!("<tr data-job=\"{id}\" data-state=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .map(str::to_string)
    };
    assert_eq!(state_of(d).as_deref(), Some("dead"), "{page}");
    assert_eq!(state_of(c).as_deref(), Some("completed"));
    assert_eq!(state_of(s).as_deref(), Some("scheduled"));
    // order-010 to order-069: 60 ready ones hold "order-0"; a page of 50, and a link on.
    let rows = job_rows(&page);
    assert_eq!(rows.len(), 3 + 50, "{rows:?}");
    assert!(page.contains("ready: read on after"), "{page}");
    // By id: the one job, in its state.
    let by_id = job_rows(&get(addr, TOKEN, &format!("/search?key={c}")).body);
    assert!(by_id.contains(&c), "{by_id:?}");
    // Nothing found is said.
    let none = get(addr, TOKEN, "/search?key=nothing-like-it").body;
    assert!(none.contains("0 found"), "{none}");
    // The jobs page offers the search in every state.
    assert!(
        get(addr, TOKEN, "/jobs?state=ready")
            .body
            .contains("formaction=\"/search\"")
    );
}

/// A leased job shows how long it has run; one running past the threshold the app chose is
/// marked stalled though its heartbeats keep its lease alive (and only then); a zero
/// threshold is refused. The overview lists the run times of the last whole minutes, as the
/// JSON overview does.
#[test]
fn a_job_running_past_the_threshold_is_stalled_and_run_times_show_per_minute() {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let clock = leaseq::ManualClock::new(now);
    let queue = Queue::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(30))
        .open(dir.path().join("q.leaseq"))
        .expect("open");
    // Two minutes ago: a delivery that ran 250 ms, and one that ran 2 s.
    let minute = (now / 60_000 - 2) * 60_000;
    for ran in [250, 2_000] {
        clock.set_ms(minute + 1_000);
        queue
            .enqueue(b"quick", EnqueueOptions::default())
            .expect("enqueue");
        let lease = queue.dequeue().expect("dequeue").expect("quick");
        clock.set_ms(minute + 1_000 + ran);
        lease.ack().expect("ack");
    }
    // Leased 10 minutes ago, its lease (an hour) kept alive by heartbeats: it runs on.
    queue
        .enqueue(
            b"hung",
            EnqueueOptions::default().lease(Duration::from_secs(3600)),
        )
        .expect("enqueue");
    queue
        .enqueue(b"fresh", EnqueueOptions::default())
        .expect("enqueue");
    clock.set_ms(now - 600_000);
    let hung = queue.dequeue().expect("dequeue").expect("hung");
    clock.set_ms(now - 5_000);
    let fresh = queue.dequeue().expect("dequeue").expect("fresh");
    clock.set_ms(now);
    hung.extend(Duration::from_secs(30)).expect("a heartbeat");
    assert!(matches!(
        Dashboard::new(&queue)
            .stalled_after(Duration::ZERO)
            .serve("127.0.0.1:0"),
        Err(Error::InvalidOption {
            field: "stalled_after",
            ..
        })
    ));
    let watchful = Dashboard::new(&queue)
        .token(TOKEN)
        .stalled_after(Duration::from_secs(60))
        .serve("127.0.0.1:0")
        .expect("serve");
    let plain = Dashboard::new(&queue)
        .token(TOKEN)
        .serve("127.0.0.1:0")
        .expect("serve");
    let row = |list: &str, id: JobId| {
        list.split(&format!("<tr data-job=\"{id}\""))
            .nth(1)
            .and_then(|r| r.split("</tr>").next())
            .unwrap_or_else(|| panic!("row {id} in {list}"))
            .to_string()
    };
    let list = get(watchful.local_addr(), TOKEN, "/jobs?state=leased").body;
    let h = row(&list, hung.id());
    assert!(h.contains("data-stalled=\"long\""), "{h}");
    assert!(h.contains("running 10m"), "{h}");
    assert!(h.contains("lease ends"), "{h}");
    let f = row(&list, fresh.id());
    assert!(!f.contains("stalled"), "{f}");
    let ran: u64 = f
        .split("data-running-ms=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("running for: {f}"));
    assert!((5_000..60_000).contains(&ran), "{ran} ms: {f}");
    let page = get(
        watchful.local_addr(),
        TOKEN,
        &format!("/job?id={}", hung.id()),
    )
    .body;
    assert!(page.contains("data-stalled=\"long\""), "{page}");
    // Without a threshold only a lapsed lease is stalled.
    let list = get(plain.local_addr(), TOKEN, "/jobs?state=leased").body;
    assert!(!row(&list, hung.id()).contains("stalled"), "{list}");

    // The overview: the minute's two runs, the median of at most 250 ms and a quarter, the
    // 95th of 2 s.
    let overview = get(plain.local_addr(), TOKEN, "/").body;
    let runs = overview
        .split(&format!("<tr data-run-minute=\"{minute}\">"))
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("the minute's run times: {overview}"));
    let cell = |name: &str| -> u64 {
        runs.split(&format!("data-run-{name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: {runs}"))
    };
    assert!(runs.contains("<td>2</td>"), "{runs}");
    assert!((250..=312).contains(&cell("p50")), "{runs}");
    assert!((2_000..=2_500).contains(&cell("p95")), "{runs}");
    let json: serde_json::Value =
        serde_json::from_str(&get(plain.local_addr(), TOKEN, "/api/overview").body).expect("JSON");
    let m = json["queues"][0]["metrics"]
        .as_array()
        .expect("minutes")
        .iter()
        .find(|m| m["minute_ms"] == minute)
        .cloned()
        .unwrap_or_else(|| panic!("the minute in {json}"));
    assert_eq!(m["runs"], 2);
    assert_eq!(m["run_ms_p95"].as_u64(), Some(cell("p95")));
    drop((hung, fresh));
    watchful.stop();
    plain.stop();
}

/// The overview shows a queue's size limit: how full each bound is, what a full queue does,
/// the jobs dropped, and a "full" badge at the limit; nothing for a queue without one.
#[test]
fn the_overview_shows_a_size_limit_and_the_jobs_dropped() {
    let app = app();
    let telemetry = app.queue.named("telemetry").expect("named");
    telemetry
        .set_limit(Some(
            leaseq::QueueLimit::jobs(2)
                .and_bytes(100)
                .when_full(leaseq::WhenFull::DropOldest),
        ))
        .expect("limit");
    for reading in [&b"r1"[..], b"r2", b"r3"] {
        telemetry
            .enqueue(reading, Default::default())
            .expect("enqueue");
    }
    app.queue
        .enqueue(b"plain", Default::default())
        .expect("enqueue");
    let page = get(app.server.local_addr(), TOKEN, "/").body;
    let section = page
        .split("data-queue=\"telemetry\"")
        .nth(1)
        .expect("the telemetry queue");
    assert!(
        section.contains(
            "<span class=\"badge paused\">full</span> Size limit: 2 of 2 jobs, 4 of 100 payload \
             bytes; when full, the oldest waiting jobs are dropped. Dropped so far: <span \
             data-dropped=\"1\">1</span>."
        ),
        "{section}"
    );
    let default = page
        .split("data-queue=\"\"")
        .nth(1)
        .and_then(|s| s.split("data-queue=").next())
        .expect("the default queue");
    assert!(!default.contains("Size limit"), "{default}");
    let doc: serde_json::Value = serde_json::from_str(
        &get(
            app.server.local_addr(),
            TOKEN,
            "/api/v1/stats?queue=telemetry",
        )
        .body,
    )
    .expect("json");
    let stats = &doc["queues"][0];
    assert_eq!(stats["dropped"], 1, "{doc}");
    assert_eq!(stats["limit"]["max_jobs"], 2, "{doc}");
}
