//! The dashboard in a real browser: headless Chromium driven through its DevTools protocol.
//!
//! Goal: the pages work as a user clicks through them, with the browser's own rules on
//! (the cookie, the content security policy, the cross-site headers it sends): the printed
//! URL logs in; a count changes on screen as jobs flow, without a reload; a dead job's retry
//! button moves it back to ready; the pause button pauses the queue; a hung job shows as
//! stalled, a running one's progress as a bar, a held job the head it waits for; jobs
//! selected stay selected across the refresh and are retried together.
//! Method: Chromium from the distribution (`LEASEQ_CHROMIUM`, else `chromium`,
//! `chromium-browser` or `google-chrome` on the PATH) with a fresh profile; each step waits
//! for what the page shows (up to 30 s each), and the queue is read back through the
//! library. Without a Chromium the test says so and passes, unless `LEASEQ_REQUIRE_BROWSER`
//! is set (`.ci/run` installs Chromium and sets it), where it fails.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leaseq::{EnqueueOptions, JobState, Queue};
use serde_json::{Value, json};
use tungstenite::{Message, WebSocket, stream::MaybeTlsStream};

/// How long one step may take before the test fails (a loaded 2-core CI machine).
const STEP: Duration = Duration::from_secs(30);

/// A child process killed when dropped, a panic's unwinding included.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Browser {
    _child: KillOnDrop,
    _profile: tempfile::TempDir,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// The tab's session (flat mode): commands to the page carry it.
    session: Option<String>,
}

fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LEASEQ_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

impl Browser {
    /// Starts Chromium headless with a fresh profile and attaches to its first tab; `None`
    /// when there is no Chromium and none is required.
    fn launch() -> Option<Browser> {
        let Some(binary) = chromium() else {
            assert!(
                std::env::var_os("LEASEQ_REQUIRE_BROWSER").is_none(),
                "LEASEQ_REQUIRE_BROWSER is set but no Chromium was found"
            );
            eprintln!("browser test skipped: no chromium on the PATH (set LEASEQ_CHROMIUM)");
            return None;
        };
        let profile = tempfile::tempdir().expect("profile dir");
        let child = KillOnDrop(
            Command::new(&binary)
                .args([
                    "--headless=new",
                    // Tests may run as root (containers), where Chromium's sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--remote-debugging-port=0",
                ])
                .arg(format!("--user-data-dir={}", profile.path().display()))
                .arg("about:blank")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display())),
        );
        // Chromium writes the port it picked, and its socket's path, into the profile.
        let port_file = profile.path().join("DevToolsActivePort");
        let started = Instant::now();
        let (port, path) = loop {
            let text = std::fs::read_to_string(&port_file).unwrap_or_default();
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next())
                && let Ok(port) = port.trim().parse::<u16>()
            {
                break (port, path.trim().to_string());
            }
            assert!(started.elapsed() < STEP, "Chromium did not start");
            std::thread::sleep(Duration::from_millis(100));
        };
        let url = format!("ws://127.0.0.1:{port}{path}");
        let (socket, _) = tungstenite::connect(url.as_str()).expect("the DevTools socket");
        let mut browser = Browser {
            _child: child,
            _profile: profile,
            socket,
            next_id: 1,
            session: None,
        };
        let target = browser.call("Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        let session = attached["sessionId"].as_str().expect("a session id");
        browser.session = Some(session.to_string());
        Some(browser)
    }

    /// One DevTools command; its result (events met meanwhile are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params) {
            Ok(result) => result,
            Err(reply) => panic!("{method}: {reply}"),
        }
    }

    /// One DevTools command; its result, or the whole reply when it is an error.
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let message = message.to_string();
        self.socket
            .send(Message::text(message))
            .expect("send a command");
        loop {
            let message = self.socket.read().expect("read the socket");
            let Message::Text(text) = message else {
                continue;
            };
            let reply: Value = serde_json::from_str(text.as_str()).expect("a JSON message");
            if reply["id"] == id {
                if !reply["error"].is_null() {
                    return Err(reply);
                }
                return Ok(reply["result"].clone());
            }
        }
    }

    /// Evaluates `script` in the page; its value (promises awaited).
    fn eval(&mut self, script: &str) -> Value {
        match self.try_eval(script) {
            Some(value) => value,
            None => panic!("{script}: the page navigated while it ran"),
        }
    }

    /// As [`Browser::eval`], but `None` when the page navigated away while the script ran
    /// (a click on a link, a form's submit or a refresh racing the evaluation).
    fn try_eval(&mut self, script: &str) -> Option<Value> {
        let result = match self.try_call(
            "Runtime.evaluate",
            json!({"expression": script, "returnByValue": true, "awaitPromise": true}),
        ) {
            Ok(result) => result,
            Err(reply) => {
                let message = reply["error"]["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains("navigated or closed")
                        || message.contains("Cannot find context"),
                    "Runtime.evaluate: {reply}"
                );
                return None;
            }
        };
        assert!(
            result["exceptionDetails"].is_null(),
            "{script}: {}",
            result["exceptionDetails"]
        );
        Some(result["result"]["value"].clone())
    }

    /// Waits until `script` is truthy in the page; returns its value.
    fn wait_for(&mut self, script: &str, what: &str) -> Value {
        let started = Instant::now();
        loop {
            let value = self
                .try_eval(&format!(
                    "(() => {{ try {{ return {script}; }} catch (_) {{ return null; }} }})()"
                ))
                .unwrap_or(Value::Null);
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(_) | Value::Array(_) | Value::Object(_) => true,
            };
            if truthy {
                return value;
            }
            let page = self
                .try_eval("document.body ? document.body.innerText.slice(0, 2000) : ''")
                .unwrap_or_default();
            assert!(
                started.elapsed() < STEP,
                "waited for {what}; the page shows: {page}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Clicks the first element `selector` finds (confirmation dialogs answered yes). The
    /// click runs after the script has answered, so a navigation it starts cannot race it.
    fn click(&mut self, selector: &str) {
        let found = self.eval(&format!(
            "(() => {{ window.confirm = () => true; const el = document.querySelector({sel}); \
             if (!el) return false; setTimeout(() => el.click(), 0); return true; }})()",
            sel = json!(selector)
        ));
        assert_eq!(found, Value::Bool(true), "nothing to click at {selector}");
    }

    /// The text of the first element `selector` finds, once there is one.
    fn text(&mut self, selector: &str) -> String {
        let script = format!(
            "document.querySelector({sel}) && document.querySelector({sel}).textContent.trim()",
            sel = json!(selector)
        );
        match self.wait_for(&script, selector) {
            Value::String(s) => s,
            other => panic!("{selector}: {other}"),
        }
    }
}

#[test]
fn a_user_clicks_through_the_dashboard() {
    let Some(mut browser) = Browser::launch() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::open(dir.path().join("q.leaseq")).expect("open");
    let dead = queue
        .enqueue(br#"{"user":42}"#, EnqueueOptions::default())
        .expect("enqueue")
        .id();
    let lease = queue.dequeue().expect("dequeue").expect("a job");
    lease.fail("payment gateway said no").expect("fail");
    for i in 0..2u8 {
        queue
            .enqueue(&[b'0' + i], EnqueueOptions::default())
            .expect("enqueue");
    }
    let server = leaseq::dashboard::serve(&queue, "127.0.0.1:0").expect("serve");

    // The printed URL logs in, and lands on the overview without the token.
    browser.goto(&server.url());
    browser.wait_for(
        "location.search === '' && document.querySelector('a[data-count=\"ready\"]')",
        "the overview",
    );
    assert_eq!(browser.text("a[data-count=\"ready\"]"), "2");
    assert_eq!(browser.text("a[data-count=\"dead\"]"), "1");

    // Jobs flow: the count on screen follows without a reload.
    let marker = browser.eval("window.leaseqMarker = 1; window.leaseqMarker");
    assert_eq!(marker, json!(1));
    for i in 0..3u8 {
        queue
            .enqueue(&[b'a' + i], EnqueueOptions::default())
            .expect("enqueue");
    }
    browser.wait_for(
        "document.querySelector('a[data-count=\"ready\"]').textContent.trim() === '5'",
        "the ready count to reach 5",
    );
    let lease = queue.dequeue().expect("dequeue").expect("a job");
    lease.ack().expect("ack");
    browser.wait_for(
        "document.querySelector('a[data-count=\"ready\"]').textContent.trim() === '4'",
        "the ready count to drop to 4",
    );
    assert_eq!(
        browser.eval("window.leaseqMarker"),
        json!(1),
        "the page was refreshed in place, not reloaded"
    );

    // The dead letters: the count links to them; Retry moves the job back to ready.
    browser.click("a[data-count=\"dead\"]");
    let row = format!("tr[data-job=\"{dead}\"]");
    browser.wait_for(
        &format!("location.pathname === '/jobs' && document.querySelector('{row}')"),
        "the dead job's row",
    );
    let error = browser.text(&format!("{row} td.error"));
    assert_eq!(error, "payment gateway said no");
    browser.click(&format!("{row} button[data-op=\"retry\"]"));
    let notice = browser.text("p.notice");
    assert!(notice.contains("runs again"), "{notice}");
    assert_eq!(
        queue.job(dead).expect("job").expect("kept").state,
        JobState::Ready
    );
    browser.wait_for(
        &format!("!document.querySelector('{row}')"),
        "the row to leave the dead list",
    );

    // The job's page: its payload as JSON, its error history.
    browser.goto(&format!("http://{}/job?id={dead}", server.local_addr()));
    let payload = browser.text("pre.payload");
    assert_eq!(payload, "{\n  \"user\": 42\n}");
    let history = browser.text("table.errors td.error");
    assert_eq!(history, "payment gateway said no");

    // Pause from the overview.
    browser.goto(&format!("http://{}/", server.local_addr()));
    browser.wait_for(
        "document.querySelector('button[data-op=\"pause\"]')",
        "the pause button",
    );
    browser.click("button[data-op=\"pause\"]");
    browser.wait_for(
        "document.querySelector('button[data-op=\"resume\"]')",
        "the resume button",
    );
    assert!(queue.stats().expect("stats").paused);
    assert!(
        queue.dequeue().expect("dequeue").is_none(),
        "a paused queue delivers nothing"
    );

    // The dashboard stops: the open page says it is no longer refreshed.
    browser.wait_for(
        "document.getElementById('stale').hidden",
        "no stale note while the dashboard answers",
    );
    drop(server);
    let note = browser.wait_for(
        "!document.getElementById('stale').hidden && document.getElementById('stale').textContent",
        "the stale note",
    );
    assert!(
        note.as_str().is_some_and(|n| n.contains("does not answer")),
        "{note}"
    );
}

/// What is stuck, as a user sees it: a leased job whose heartbeats stopped marked stalled, a
/// running job's progress as a bar and a message, a ready job held behind its group's head
/// (a link to it); then two dead jobs selected, kept selected across the in-place refresh,
/// and retried together.
#[test]
fn a_user_sees_what_is_stuck_and_retries_in_bulk() {
    let Some(mut browser) = Browser::launch() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let clock = leaseq::ManualClock::new(now);
    let queue = Queue::builder()
        .clock(clock.clone())
        .lease(Duration::from_secs(300))
        .open(dir.path().join("q.leaseq"))
        .expect("open");
    // A job at 30 %, saying what it does.
    queue
        .enqueue(b"upload", EnqueueOptions::default())
        .expect("enqueue");
    let upload = queue.dequeue().expect("dequeue").expect("upload");
    upload
        .set_progress_percent(30, Some("uploading 3 of 10"))
        .expect("progress");
    // An ordered group: its head running, the next member held.
    let group = || EnqueueOptions::default().group("site-9");
    let head = queue.enqueue(b"v1", group()).expect("enqueue").id();
    let held = queue.enqueue(b"v2", group()).expect("enqueue").id();
    let head_lease = queue.dequeue().expect("dequeue").expect("head");
    assert_eq!(head_lease.id(), head);
    // Three dead jobs.
    let mut dead = Vec::new();
    for reason in ["timeout", "refused", "gone"] {
        let id = queue
            .enqueue(reason.as_bytes(), EnqueueOptions::default().max_attempts(1))
            .expect("enqueue")
            .id();
        let lease = queue.dequeue().expect("dequeue").expect("a job");
        assert_eq!(lease.id(), id);
        lease.fail(reason).expect("fail");
        dead.push(id);
    }
    // Last (a dequeue returns an expired lease): a job leased 400 s ago whose lease (300 s)
    // was never extended: its worker hung.
    queue
        .enqueue(b"hung", EnqueueOptions::default())
        .expect("enqueue");
    clock.set_ms(now - 400_000);
    let hung = queue.dequeue().expect("dequeue").expect("hung");
    clock.set_ms(now);
    let server = leaseq::dashboard::serve(&queue, "127.0.0.1:0").expect("serve");
    let base = format!("http://{}", server.local_addr());
    browser.goto(&server.url());
    browser.wait_for("location.search === ''", "the login");

    // The leased list: the hung job stalled, the upload's progress as a bar.
    browser.goto(&format!("{base}/jobs?state=leased"));
    let hung_row = format!("tr[data-job=\"{}\"]", hung.id());
    browser.wait_for(
        &format!("document.querySelector('{hung_row} [data-stalled]')"),
        "the hung job marked stalled",
    );
    let upload_row = format!("tr[data-job=\"{}\"]", upload.id());
    let bar = browser.wait_for(
        &format!("document.querySelector('{upload_row} progress').value"),
        "the upload's progress bar",
    );
    assert_eq!(bar, json!(30));
    let cell = browser.text(&format!("{upload_row} td.error"));
    assert!(cell.contains("30 % uploading 3 of 10"), "{cell}");
    assert_eq!(
        browser.eval(&format!(
            "!!document.querySelector('{upload_row} [data-stalled]')"
        )),
        json!(false),
        "a job whose lease runs is not stalled"
    );

    // The ready list: the held job says what it waits for; its link opens the head.
    browser.goto(&format!("{base}/jobs?state=ready"));
    let held_link = format!("tr[data-job=\"{held}\"] [data-held-behind] a");
    browser.wait_for(
        &format!("document.querySelector('{held_link}')"),
        "the held job's reason",
    );
    browser.click(&held_link);
    browser.wait_for(
        &format!("location.pathname === '/job' && location.search.includes('id={head}')"),
        "the head's page",
    );

    // The dead list: two jobs selected stay selected while the page refreshes in place.
    browser.goto(&format!("{base}/jobs?state=dead"));
    let boxes = |id: leaseq::JobId| format!("tr[data-job=\"{id}\"] input[form=bulk]");
    browser.wait_for(
        &format!("document.querySelector('{}')", boxes(dead[0])),
        "the checkboxes",
    );
    browser.click(&boxes(dead[0]));
    browser.click(&boxes(dead[2]));
    browser.eval("document.activeElement && document.activeElement.blur()");
    // A fourth job dies: its row appears by the in-place refresh.
    let id = queue
        .enqueue(b"late", EnqueueOptions::default().max_attempts(1))
        .expect("enqueue")
        .id();
    queue
        .dequeue()
        .expect("dequeue")
        .expect("late")
        .fail("late")
        .expect("fail");
    browser.wait_for(
        &format!("document.querySelector('tr[data-job=\"{id}\"]')"),
        "the new dead row, refreshed in place",
    );
    assert_eq!(
        browser.eval(&format!(
            "[document.querySelector('{}').checked, document.querySelector('{}').checked, \
             document.querySelector('{}').checked]",
            boxes(dead[0]),
            boxes(dead[1]),
            boxes(dead[2])
        )),
        json!([true, false, true]),
        "the selection survived the refresh"
    );
    browser.click("button[value=\"bulk_retry\"]");
    let notice = browser.wait_for(
        "document.querySelector('p.notice') && document.querySelector('p.notice').textContent",
        "the bulk notice",
    );
    assert!(
        notice
            .as_str()
            .is_some_and(|n| n.contains("2 jobs run again")),
        "{notice}"
    );
    let state = |id| queue.job(id).expect("job").expect("there").state;
    assert_eq!(
        [state(dead[0]), state(dead[1]), state(dead[2])],
        [JobState::Ready, JobState::Dead, JobState::Ready]
    );
    drop((hung, upload, head_lease));
}
