//! leaseq reports through `tracing` only: recovery and upgrades at open, dead-lettering (never
//! for a snooze), pruning, and a refused open reach an installed subscriber; with none
//! installed nothing is printed (the `tracing` default).
//!
//! With the `nats` feature: no secret a relay is given (password, token, NKey seed, a password
//! in a URL) appears in any event, leaseq's or the NATS client's, at every level.
//!
//! A test binary of its own: `tracing` caches per call site, for the whole process, whether
//! anyone listens, and tests of other subjects hitting leaseq's call sites beside these with
//! no subscriber race that cache (in the `core` binary the DEBUG event of an open went
//! missing from a capture).

mod common;
#[cfg(feature = "nats")]
#[path = "common/nats.rs"]
mod nats;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixture, LEASE, assert_consistent};
use leaseq::EnqueueOptions;

/// Everything the subscriber wrote, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .finish();
    let value = tracing::subscriber::with_default(subscriber, || {
        // `tracing` caches per call site, for the whole process, whether anyone listens: a
        // call site first hit by another test's thread with no subscriber may be cached as
        // "never". Recompute with this subscriber in place.
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    (value, out.text())
}

#[test]
fn recovery_at_open_is_reported_with_its_counts() {
    let f = Fixture::new();
    {
        let q = f.open();
        q.enqueue(b"a", EnqueueOptions::default()).unwrap();
        q.enqueue(b"b", EnqueueOptions::default().max_attempts(1))
            .unwrap();
        let _held = q.dequeue_batch(2).unwrap(); // dropped with the file: left leased
    }
    let (q, log) = capture(|| f.open());
    assert_eq!(q.recovery().leases_returned, 1);
    assert!(log.contains("leaseq: opened after recovery"), "{log}");
    assert!(log.contains("leases_returned=1"), "{log}");
    assert!(log.contains("leases_dead_lettered=1"), "{log}");
    assert!(log.contains("leaseq.open"), "the open span: {log}");
}

#[test]
fn dead_lettering_pruning_and_commits_are_reported() {
    let f = Fixture::new();
    let q = f.open();
    let ((), log) = capture(|| {
        q.enqueue(b"x", EnqueueOptions::default().max_attempts(1))
            .unwrap();
        q.dequeue().unwrap().unwrap().nack("boom").unwrap();
        q.enqueue(b"y", EnqueueOptions::default()).unwrap();
        q.dequeue().unwrap().unwrap().fail("bad input").unwrap();
        q.prune().unwrap();
    });
    assert!(
        log.contains("dead-lettered (no attempts left)") && log.contains("reason=boom"),
        "{log}"
    );
    assert!(log.contains("dead-lettered by fail"), "{log}");
    assert!(log.contains("leaseq: pruned"), "{log}");
    assert!(log.contains("leaseq.commit"), "the commit span: {log}");
}

#[test]
fn a_refused_open_is_reported() {
    let f = Fixture::new();
    std::fs::write(&f.path, vec![0x5a; 8192]).unwrap();
    let (r, log) = capture(|| f.builder().open(&f.path));
    assert!(r.is_err());
    assert!(log.contains("leaseq: open refused"), "{log}");
}

#[test]
fn a_quiet_run_reports_nothing_above_debug() {
    let f = Fixture::new();
    let (_, log) = capture(|| {
        let q = f.open();
        q.enqueue(b"x", EnqueueOptions::default()).unwrap();
        q.dequeue_timeout(Duration::from_millis(1))
            .unwrap()
            .unwrap()
            .ack()
            .unwrap();
    });
    // Spans close at INFO (the open) and DEBUG (commits); no event above DEBUG.
    let events_above_debug = log
        .lines()
        .filter(|l| !l.contains("close time.busy"))
        .filter(|l| l.contains(" INFO ") || l.contains(" WARN ") || l.contains(" ERROR "))
        .count();
    assert_eq!(events_above_debug, 0, "{log}");
    assert!(log.contains("leaseq: opened"), "the open at DEBUG: {log}");
}

const FIXTURE4: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format4-crashed.leaseq"
);

/// A snooze is never reported as a dead-lettering (it never is one), however often a job
/// with one attempt is snoozed; the expiry that does use its attempt is; the upgrade of a
/// format-4 file is reported with the version it came from.
#[test]
fn snoozes_are_not_dead_letterings_and_the_upgrade_is_reported() {
    let f = Fixture::new();
    let q = f.open();
    let id = q
        .enqueue(b"one try", EnqueueOptions::default().max_attempts(1))
        .unwrap()
        .id();
    let ((), log) = capture(|| {
        for _ in 0..5 {
            q.dequeue()
                .unwrap()
                .unwrap()
                .snooze(Duration::ZERO)
                .unwrap();
        }
    });
    assert!(!log.contains("dead-lettered"), "{log}");
    assert_eq!(q.job(id).unwrap().unwrap().snoozes, 5);
    let ((), log) = capture(|| {
        let l = q.dequeue().unwrap().unwrap();
        f.clock.advance(LEASE + Duration::from_secs(1));
        drop(l);
        assert!(q.dequeue().unwrap().is_none());
    });
    assert!(
        log.contains("dead-lettered (no attempts left)") && log.contains("lease expired"),
        "{log}"
    );
    let j = q.job(id).unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.snoozes),
        (leaseq::JobState::Dead, 1, 5)
    );
    drop(q);

    let g = Fixture::new();
    std::fs::copy(FIXTURE4, &g.path).unwrap();
    let (q, log) = capture(|| g.open());
    assert_eq!(q.recovery().upgraded_from, Some(4));
    assert!(log.contains("upgraded_from=4"), "{log}");
    assert!(log.contains("leases_returned=1"), "{log}");
    assert_consistent(&q);
}

/// The relay's secrets in no event, at TRACE and from every crate (async-nats traces its
/// connections too), nor in the queue file: logins right and wrong, with a password, a token, an NKey seed and a
/// password in the URL. The relay runs on threads of its own, so this subscriber is the
/// process's global one (the other tests' thread-local captures take precedence over it).
#[cfg(feature = "nats")]
#[test]
fn no_secret_of_a_relay_reaches_a_tracing_event() {
    use leaseq::relay::{Connection, Outbound, RelayError};
    use nats::{Js, NatsServer};

    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    tracing::callsite::rebuild_interest_cache();

    let seed = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let users = NatsServer::start_with(&format!(
        "authorization {{ users: [ {{user: edge, password: \"Pa55-secret-1\"}}, {{nkey: {}}} ] }}",
        seed.public_key()
    ));
    let token = NatsServer::start_with("authorization { token: \"T0ken-secret-2\" }");
    let seed = seed.seed().unwrap();
    Js::connect_with(
        &users.url(),
        async_nats::ConnectOptions::with_user_and_password("edge".into(), "Pa55-secret-1".into()),
    )
    .create_stream("EVENTS", &["events.>"], None);
    Js::connect_with(
        &token.url(),
        async_nats::ConnectOptions::with_token("T0ken-secret-2".into()),
    )
    .create_stream("EVENTS", &["events.>"], None);
    let secrets = [
        "Pa55-secret-1",
        "Wr0ng-secret-3",
        "T0ken-secret-2",
        "T0ken-guess-4",
        seed.as_str(),
        stranger.as_str(),
    ];
    let in_url = |server: &NatsServer, password: &str| {
        format!("nats://edge:{password}@127.0.0.1:{}", server.port)
    };
    let cases = [
        (
            users.url(),
            Connection::new().user_password("edge", "Pa55-secret-1"),
            true,
        ),
        (
            users.url(),
            Connection::new().user_password("edge", "Wr0ng-secret-3"),
            false,
        ),
        (in_url(&users, "Pa55-secret-1"), Connection::new(), true),
        (in_url(&users, "Wr0ng-secret-3"), Connection::new(), false),
        (users.url(), Connection::new().nkey_seed(&seed), true),
        (users.url(), Connection::new().nkey_seed(&stranger), false),
        (token.url(), Connection::new().token("T0ken-secret-2"), true),
        (token.url(), Connection::new().token("T0ken-guess-4"), false),
    ];
    let f = Fixture::new();
    let q = f.open();
    for (url, connection, right) in cases {
        q.enqueue(b"event", EnqueueOptions::default()).unwrap();
        let relay = Outbound::builder(&q, &url, "EVENTS", "events.edge")
            .connection(connection)
            .connect_timeout(Duration::from_secs(2))
            .max_backoff(Duration::from_millis(200))
            .start()
            .unwrap();
        let ready = relay.wait_ready(Duration::from_secs(if right { 20 } else { 2 }));
        if right {
            ready.unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while q.len().unwrap() > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(q.len().unwrap(), 0, "{url}");
        } else {
            let e = ready.unwrap_err();
            assert!(matches!(e, RelayError::Auth { .. }), "{e:?}");
        }
        relay.shutdown();
    }
    let log = out.text();
    // The capture saw the relay's and the client's events: refusals and connections.
    assert!(log.contains("leaseq::relay"), "{log}");
    assert!(log.contains("authorization violation"), "{log}");
    assert!(log.contains("async_nats"), "{log}");
    for secret in secrets {
        assert!(!log.contains(secret), "{secret} in the events:\n{log}");
    }
    // Nor in the queue file the relays worked on.
    q.flush().unwrap();
    let bytes = std::fs::read(&f.path).unwrap();
    assert!(bytes.len() > 4096, "the file was read");
    for secret in secrets {
        let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!found, "{secret} in the queue file");
    }
}
