//! The dashboard in a real browser: headless Chromium driven through its DevTools protocol.
//!
//! Goal: the pages work as a user clicks through them, with the browser's own rules on
//! (the cookie, the content security policy, the cross-site headers it sends): the printed
//! URL logs in; a count changes on screen as jobs flow, without a reload; a dead job's retry
//! button moves it back to ready; the pause button pauses the queue.
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
                assert!(reply["error"].is_null(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// Evaluates `script` in the page; its value (promises awaited).
    fn eval(&mut self, script: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": script, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            result["exceptionDetails"].is_null(),
            "{script}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    /// Waits until `script` is truthy in the page; returns its value.
    fn wait_for(&mut self, script: &str, what: &str) -> Value {
        let started = Instant::now();
        loop {
            let value = self.eval(&format!(
                "(() => {{ try {{ return {script}; }} catch (_) {{ return null; }} }})()"
            ));
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(_) | Value::Array(_) | Value::Object(_) => true,
            };
            if truthy {
                return value;
            }
            let page = self.eval("document.body ? document.body.innerText.slice(0, 2000) : ''");
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

    /// Clicks the first element `selector` finds (confirmation dialogs answered yes).
    fn click(&mut self, selector: &str) {
        let found = self.eval(&format!(
            "(() => {{ window.confirm = () => true; const el = document.querySelector({sel}); \
             if (!el) return false; el.click(); return true; }})()",
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
