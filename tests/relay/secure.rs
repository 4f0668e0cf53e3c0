//! The relay over a network it does not trust: TLS (the fleet's CA, mutual TLS, and every
//! refusal: an unknown CA, another host's name, an expired certificate, no TLS where it is
//! required), credentials (user and password, token, NKey, each right and wrong), and a list
//! of servers. Each against a real `nats-server` on 127.0.0.1 with certificates made here by
//! rcgen for the test only (a throwaway CA; no key is checked in).
//!
//! Every refusal is checked to be typed, kept as the relay's last error, retried without a
//! busy loop, and to leave every job in the file.

use crate::nats::{Js, NatsServer};
use crate::shared;
use leaseq::relay::{Connection, Outbound, RelayError};
use leaseq::{EnqueueOptions, JobState, Queue};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use std::path::{Path, PathBuf};
use std::time::Duration;

const READY: Duration = Duration::from_secs(20);

/// A throwaway CA that signs the test's server and client certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
struct Issued {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("leaseq test CA {name}"));
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `names` (DNS names, or IP addresses), valid now unless `expired`.
    fn issue(&self, names: &[&str], expired: bool) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        for n in names {
            params.subject_alt_names.push(match n.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().unwrap()),
            });
        }
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A nats-server with TLS: `server`'s certificate; with `client_ca`, clients must present a
/// certificate signed by it (mutual TLS).
fn tls_server(server: &Issued, client_ca: Option<&Ca>) -> (tempfile::TempDir, NatsServer) {
    let certs = tempfile::tempdir().unwrap();
    let cert = write(certs.path(), "server.pem", &server.cert);
    let key = write(certs.path(), "server.key", &server.key);
    let verify = match client_ca {
        Some(ca) => format!(
            "ca_file: {:?}\n  verify: true",
            write(certs.path(), "clients-ca.pem", &ca.pem())
        ),
        None => String::new(),
    };
    let conf = format!("tls {{\n  cert_file: {cert:?}\n  key_file: {key:?}\n  {verify}\n}}");
    (certs, NatsServer::start_with(&conf))
}

/// The test's own JetStream client over TLS to `server`, trusting `ca`.
fn tls_js(server: &NatsServer, ca: &Ca, client: Option<&Issued>) -> Js {
    let dir = tempfile::tempdir().unwrap();
    let mut o = async_nats::ConnectOptions::new().add_root_certificates(write(
        dir.path(),
        "ca.pem",
        &ca.pem(),
    ));
    if let Some(c) = client {
        o = o.add_client_certificate(
            write(dir.path(), "c.pem", &c.cert),
            write(dir.path(), "c.key", &c.key),
        );
    }
    let js = Js::connect_with(&format!("tls://127.0.0.1:{}", server.port), o);
    drop(dir);
    js
}

fn queue_with_jobs(n: u32) -> (tempfile::TempDir, Queue) {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("edge.leaseq")).unwrap();
    for i in 0..n {
        q.enqueue(
            format!("job {i}").as_bytes(),
            EnqueueOptions::default().idempotency_key(format!("edge/{i}")),
        )
        .unwrap();
    }
    (dir, q)
}

/// Starts an outbound relay of `q` with `connection` to `url`, which must be refused: the
/// error it keeps, after which every job is still ready, none charged an attempt.
fn refused(q: &Queue, url: &str, connection: Connection) -> RelayError {
    let relay = Outbound::builder(q, url, "EVENTS", "events.edge")
        .connection(connection)
        .connect_timeout(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(400))
        .start()
        .unwrap();
    let err = relay.wait_ready(Duration::from_secs(3)).unwrap_err();
    let stats = relay.shutdown();
    assert!(!stats.ready, "{stats:?}");
    // A shutdown during a connection attempt keeps the refusal, not "stopped".
    let last = stats.last_error.as_ref().expect("the last error");
    assert_eq!(
        std::mem::discriminant(last),
        std::mem::discriminant(&err),
        "{last:?} after {err:?}"
    );
    assert_eq!(stats.moved, 0, "{stats:?}");
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.leased, s.dead), (s.total, 0, 0), "{s:?}");
    let jobs = q.jobs(JobState::Ready, None, 1000).unwrap().jobs;
    assert!(
        jobs.iter().all(|j| j.attempts == 0),
        "no attempt is charged"
    );
    err
}

/// Relays `q`'s jobs with `connection` to `url` and checks each reached the stream once.
fn relays_all(q: &Queue, url: &str, connection: Connection, js: &Js) {
    let n = q.stats().unwrap().total;
    let before = js.count("EVENTS");
    let relay = Outbound::builder(q, url, "EVENTS", "events.edge")
        .connection(connection)
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    let limit = std::time::Instant::now() + Duration::from_secs(30);
    while q.stats().unwrap().total > 0 && std::time::Instant::now() < limit {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = relay.shutdown();
    assert_eq!(stats.moved, n, "{stats:?}");
    assert_eq!(js.count("EVENTS"), before + n);
}

#[test]
fn tls_to_the_fleets_ca_relays_and_each_bad_certificate_is_a_typed_refusal() {
    let _g = shared();
    let ca = Ca::new("fleet");
    let good = ca.issue(&["localhost", "127.0.0.1"], false);
    let (_certs, server) = tls_server(&good, None);
    let js = tls_js(&server, &ca, None);
    js.create_stream("EVENTS", &["events.>"], None);
    let tls_url = format!("tls://127.0.0.1:{}", server.port);
    let (_dir, q) = queue_with_jobs(40);

    // The platform's roots (the default) do not know the fleet's CA; nor does another CA.
    let e = refused(&q, &tls_url, Connection::new());
    assert!(matches!(e, RelayError::Tls { .. }), "{e:?}");
    let other = Ca::new("other");
    let e = refused(
        &q,
        &tls_url,
        Connection::new().root_certificates_pem(other.pem()),
    );
    assert!(matches!(e, RelayError::Tls { .. }), "{e:?}");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");

    // The fleet's CA as a file, a nats:// URL (the server asks for TLS): every job goes once.
    let dir = tempfile::tempdir().unwrap();
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    relays_all(
        &q,
        &server.url(),
        Connection::new().root_certificates_file(&ca_file),
        &js,
    );

    // A certificate for another host, and an expired one, each on a server of its own.
    let (_dir, q) = queue_with_jobs(5);
    for (cert, what) in [
        (ca.issue(&["nats.example"], false), "not valid for name"),
        (ca.issue(&["localhost", "127.0.0.1"], true), "expired"),
    ] {
        let (_certs, bad) = tls_server(&cert, None);
        let e = refused(
            &q,
            &format!("tls://127.0.0.1:{}", bad.port),
            Connection::new().root_certificates_pem(ca.pem()),
        );
        assert!(matches!(e, RelayError::Tls { .. }), "{what}: {e:?}");
        assert!(e.to_string().to_lowercase().contains(what), "{what}: {e}");
    }

    // TLS required, from a server without it.
    let plain = NatsServer::start();
    let e = refused(&q, &plain.url(), Connection::new().tls_required(true));
    assert!(matches!(e, RelayError::Tls { .. }), "{e:?}");
}

#[test]
fn mutual_tls_takes_the_client_certificate_from_files_or_bytes() {
    let _g = shared();
    let ca = Ca::new("fleet");
    let clients = Ca::new("devices");
    let (_certs, server) = tls_server(&ca.issue(&["127.0.0.1"], false), Some(&clients));
    let device = clients.issue(&["edge-7"], false);
    let js = tls_js(&server, &ca, Some(&device));
    js.create_stream("EVENTS", &["events.>"], None);
    let url = format!("tls://127.0.0.1:{}", server.port);
    let (_dir, q) = queue_with_jobs(20);

    // Without a client certificate, or with one the server's CA did not sign: refused, the
    // jobs stay.
    let trusting = Connection::new().root_certificates_pem(ca.pem());
    let e = refused(&q, &url, trusting.clone());
    assert!(
        matches!(e, RelayError::Tls { .. } | RelayError::Unreachable { .. }),
        "{e:?}"
    );
    let stranger = ca.issue(&["edge-7"], false);
    let e = refused(
        &q,
        &url,
        trusting
            .clone()
            .client_certificate_pem(&stranger.cert, &stranger.key),
    );
    assert!(
        matches!(e, RelayError::Tls { .. } | RelayError::Unreachable { .. }),
        "{e:?}"
    );

    // The device's certificate as bytes, then (more jobs) as files.
    relays_all(
        &q,
        &url,
        trusting
            .clone()
            .client_certificate_pem(&device.cert, &device.key),
        &js,
    );
    for i in 0..10u32 {
        q.enqueue(format!("more {i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let files = trusting.client_certificate_files(
        write(dir.path(), "edge-7.pem", &device.cert),
        write(dir.path(), "edge-7.key", &device.key),
    );
    relays_all(&q, &url, files, &js);
    assert_eq!(js.count("EVENTS"), 30);
}

/// How many refused logins the server logged.
fn violations(server: &NatsServer) -> usize {
    let log = std::fs::read_to_string(server.log())
        .unwrap_or_default()
        .to_lowercase();
    log.matches("authentication error").count() + log.matches("authorization violation").count()
}

#[test]
fn user_password_token_and_nkey_authenticate_and_wrong_ones_are_auth_errors() {
    let _g = shared();
    let nkey = nkeys::KeyPair::new_user();
    let seed = nkey.seed().unwrap();
    let stranger_seed = nkeys::KeyPair::new_user().seed().unwrap();
    let users = NatsServer::start_with(&format!(
        "authorization {{ users: [ {{user: edge, password: \"pa55-word\"}}, {{nkey: {}}} ] }}",
        nkey.public_key()
    ));
    let token = NatsServer::start_with("authorization { token: \"t0ken-of-the-fleet\" }");
    let cases: Vec<(&NatsServer, Connection, Connection, &str)> = vec![
        (
            &users,
            Connection::new().user_password("edge", "pa55-word"),
            Connection::new().user_password("edge", "wrong-pa55"),
            "wrong-pa55",
        ),
        (
            &users,
            Connection::new().nkey_seed(&seed),
            Connection::new().nkey_seed(&stranger_seed),
            &stranger_seed,
        ),
        (
            &token,
            Connection::new().token("t0ken-of-the-fleet"),
            Connection::new().token("t0ken-guessed"),
            "t0ken-guessed",
        ),
    ];
    for (server, right, wrong, secret) in cases {
        let (_dir, q) = queue_with_jobs(10);
        // Wrong: typed, kept, retried with the backoff (a handful of tries in 3 s, not a
        // loop), the secret in no error text.
        let before = violations(server);
        let e = refused(&q, &server.url(), wrong.clone());
        assert!(matches!(e, RelayError::Auth { .. }), "{e:?}");
        assert!(!e.to_string().contains(secret), "{e}");
        assert!(!format!("{e:?} {wrong:?}").contains(secret));
        let tries = violations(server) - before;
        assert!((1..=12).contains(&tries), "{tries} refused logins in 3 s");
        // No credentials at all: the same.
        let e = refused(&q, &server.url(), Connection::new());
        assert!(matches!(e, RelayError::Auth { .. }), "{e:?}");
        // Right: every job goes.
        let js = Js::connect_with(&server.url(), options_of(server, &users, &seed));
        let _ = js.block_on(js.js.delete_stream("EVENTS"));
        js.create_stream("EVENTS", &["events.>"], None);
        relays_all(&q, &server.url(), right, &js);
    }
}

/// The test client's own login to `server`: the NKey user on `users`, the token elsewhere.
fn options_of(server: &NatsServer, users: &NatsServer, seed: &str) -> async_nats::ConnectOptions {
    if server.port == users.port {
        async_nats::ConnectOptions::with_nkey(seed.to_string())
    } else {
        async_nats::ConnectOptions::with_token("t0ken-of-the-fleet".into())
    }
}

#[test]
fn a_list_of_servers_reaches_the_one_that_answers_and_a_password_in_a_url_is_used_not_shown() {
    let _g = shared();
    let server = NatsServer::start_with(
        "authorization { users: [ {user: edge, password: \"pa55-word\"} ] }",
    );
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let js = Js::connect_with(
        &server.url(),
        async_nats::ConnectOptions::with_user_and_password("edge".into(), "pa55-word".into()),
    );
    js.create_stream("EVENTS", &["events.>"], None);
    let (_dir, q) = queue_with_jobs(25);
    // A wrong password in the URL: refused as Auth, the password shown as ***.
    let url = format!(
        "nats://edge:wr0ng@127.0.0.1:{dead_port}, nats://edge:wr0ng@127.0.0.1:{}",
        server.port
    );
    let e = refused(&q, &url, Connection::new());
    assert!(matches!(e, RelayError::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("wr0ng"), "{e}");
    assert!(e.to_string().contains("***@127.0.0.1"), "{e}");
    // The first server down, the second up: every job goes, with the credentials given by
    // the Connection, then (more jobs) by the URL, as the official clients read it.
    let url = format!(
        "nats://127.0.0.1:{dead_port},nats://127.0.0.1:{}",
        server.port
    );
    relays_all(
        &q,
        &url,
        Connection::new().user_password("edge", "pa55-word"),
        &js,
    );
    for i in 0..5u32 {
        q.enqueue(format!("more {i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    let url = format!(
        "nats://127.0.0.1:{dead_port},nats://edge:pa55-word@127.0.0.1:{}",
        server.port
    );
    relays_all(&q, &url, Connection::new(), &js);
    assert_eq!(js.count("EVENTS"), 30);
    // Given twice (the URL and the Connection), or two logins in one list: refused at start.
    for (url, connection) in [
        (
            url.as_str(),
            Connection::new().user_password("edge", "pa55-word"),
        ),
        (
            "nats://a:pw-1@127.0.0.1:1,nats://b:pw-2@127.0.0.1:2",
            Connection::new(),
        ),
    ] {
        let e = Outbound::builder(&q, url, "EVENTS", "events.edge")
            .connection(connection)
            .start()
            .err()
            .unwrap();
        assert!(
            matches!(e, RelayError::InvalidOption(_) | RelayError::BadUrl { .. }),
            "{e:?}"
        );
        assert!(
            !e.to_string().contains("pa55") && !e.to_string().contains("pw-"),
            "{e}"
        );
    }
    // A bad list is refused at start.
    let e = Outbound::builder(&q, "nats://127.0.0.1:1,,", "EVENTS", "events.edge")
        .start()
        .err()
        .unwrap();
    assert!(matches!(e, RelayError::BadUrl { .. }), "{e:?}");
}

/// A NATS operator made for the test (as `nsc` would): it signs an account, whose key signs
/// its users' JWTs. The server trusts the operator and preloads the account (a memory
/// resolver), as a fleet's decentralised-auth servers do.
struct Operator {
    key: nkeys::KeyPair,
    account: nkeys::KeyPair,
    system: nkeys::KeyPair,
}

impl Operator {
    fn new() -> Operator {
        Operator {
            key: nkeys::KeyPair::new_operator(),
            account: nkeys::KeyPair::new_account(),
            system: nkeys::KeyPair::new_account(),
        }
    }

    /// The server's configuration lines: the operator's JWT, and the account's and the system
    /// account's (which JetStream needs), preloaded.
    fn server_conf(&self) -> String {
        let limits = serde_json::json!({
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
        });
        let operator = jwt(
            &self.key,
            &self.key.public_key(),
            serde_json::json!({"type": "operator", "version": 2}),
        );
        let account = jwt(
            &self.key,
            &self.account.public_key(),
            serde_json::json!({
                "limits": limits,
                "default_permissions": {"pub": {}, "sub": {}},
                "type": "account", "version": 2,
            }),
        );
        let system = jwt(
            &self.key,
            &self.system.public_key(),
            serde_json::json!({"type": "account", "version": 2}),
        );
        format!(
            "operator: {operator}\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {account_key}: {account}\n  {sys}: {system}\n}}",
            sys = self.system.public_key(),
            account_key = self.account.public_key(),
        )
    }

    /// A `.creds` document for a new user of the account, its JWT signed by `signer` (the
    /// account's key for a real user), expiring at `expires` (Unix seconds) if given.
    fn creds(&self, signer: &nkeys::KeyPair, expires: Option<i64>) -> (String, String) {
        let user = nkeys::KeyPair::new_user();
        let mut claims = serde_json::json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user", "version": 2,
        });
        if signer.public_key() != self.account.public_key() {
            // A stranger's user still names the fleet's account as its issuer account.
            claims["issuer_account"] = self.account.public_key().into();
        }
        let token = jwt_expiring(signer, &user.public_key(), claims, expires);
        let seed = user.seed().unwrap();
        let text = format!(
            "-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
             *************************************************************\n"
        );
        (text, seed)
    }
}

fn jwt(signer: &nkeys::KeyPair, subject: &str, nats: serde_json::Value) -> String {
    jwt_expiring(signer, subject, nats, None)
}

/// A NATS JWT (v2): `{"typ":"JWT","alg":"ed25519-nkey"}`, the claims, the issuer's ed25519
/// signature over the first two parts; each part base64url without padding.
fn jwt_expiring(
    signer: &nkeys::KeyPair,
    subject: &str,
    nats: serde_json::Value,
    expires: Option<i64>,
) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = unix_now();
    let mut claims = serde_json::json!({
        "jti": format!("{:032X}", fastrand::u128(..)),
        "iat": now - 60,
        "iss": signer.public_key(),
        "name": "leaseq-test",
        "sub": subject,
        "nats": nats,
    });
    if let Some(exp) = expires {
        claims["exp"] = exp.into();
    }
    let head = b64.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = b64.encode(claims.to_string());
    let signature = signer.sign(format!("{head}.{body}").as_bytes()).unwrap();
    format!("{head}.{body}.{}", b64.encode(signature))
}

#[test]
fn a_creds_file_of_the_fleets_account_authenticates_and_a_strangers_or_expired_one_is_auth() {
    let _g = shared();
    let operator = Operator::new();
    let server = NatsServer::start_with(&operator.server_conf());
    let dir = tempfile::tempdir().unwrap();
    let (device, _) = operator.creds(&operator.account, None);
    let js = Js::connect_with(
        &server.url(),
        async_nats::ConnectOptions::with_credentials(&device).unwrap(),
    );
    js.create_stream("EVENTS", &["events.>"], None);
    let (_qdir, q) = queue_with_jobs(30);

    // Refused, typed, the seed in no error: a user the account never signed (a stranger's
    // key), a user whose JWT expired, and a file that is not a .creds document.
    let stranger = nkeys::KeyPair::new_account();
    let past = unix_now() - 30;
    for (what, (text, seed)) in [
        ("a stranger's user", operator.creds(&stranger, None)),
        (
            "an expired user",
            operator.creds(&operator.account, Some(past)),
        ),
    ] {
        let before = violations(&server);
        let file = write(dir.path(), "wrong.creds", &text);
        let e = refused(&q, &server.url(), Connection::new().credentials_file(&file));
        assert!(matches!(e, RelayError::Auth { .. }), "{what}: {e:?}");
        assert!(!format!("{e} {e:?}").contains(&seed), "{what}: {e}");
        let tries = violations(&server) - before;
        assert!(
            (1..=12).contains(&tries),
            "{what}: {tries} refused logins in 3 s"
        );
    }
    let garbage = write(dir.path(), "garbage.creds", "not a creds file");
    let e = Outbound::builder(&q, &server.url(), "EVENTS", "events.edge")
        .connection(Connection::new().credentials_file(&garbage))
        .start()
        .err()
        .unwrap();
    assert!(matches!(e, RelayError::InvalidOption(_)), "{e:?}");

    // The device's own .creds file, then its text: every job goes once.
    let file = write(dir.path(), "edge-7.creds", &device);
    relays_all(
        &q,
        &server.url(),
        Connection::new().credentials_file(&file),
        &js,
    );
    for i in 0..10u32 {
        q.enqueue(format!("more {i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    relays_all(
        &q,
        &server.url(),
        Connection::new().credentials(&device),
        &js,
    );
    assert_eq!(js.count("EVENTS"), 40);
}

#[test]
fn credentials_withdrawn_while_connected_are_an_auth_error_and_the_jobs_wait() {
    let _g = shared();
    let users = |password: &str| {
        format!("authorization {{ users: [ {{user: edge, password: \"{password}\"}} ] }}")
    };
    let mut server = NatsServer::start_with(&users("pa55-word"));
    let login =
        || async_nats::ConnectOptions::with_user_and_password("edge".into(), "pa55-word".into());
    let js = Js::connect_with(&server.url(), login());
    js.create_stream("EVENTS", &["events.>"], None);
    drop(js);
    let (_dir, q) = queue_with_jobs(10);
    let relay = running(
        &q,
        &server.url(),
        Connection::new().user_password("edge", "pa55-word"),
    );
    let wait = |what: &str, f: &dyn Fn() -> bool| wait_relay(&relay, what, f);
    wait("the first jobs out", &|| q.stats().unwrap().total == 0);

    // The fleet rotates the device's password; the server restarts with the new one. The
    // relay's reconnects are refused: Auth, as its last error; new jobs wait in the file.
    server.set_extra(&users("rotated-pa55"));
    server.restart();
    for i in 0..10u32 {
        q.enqueue(format!("later {i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    wait("an Auth error", &|| {
        matches!(relay.stats().last_error, Some(RelayError::Auth { .. }))
    });
    let e = relay.stats().last_error.unwrap();
    assert!(!format!("{e} {e:?}").contains("pa55"), "{e}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(q.stats().unwrap().total, 10, "{:?}", relay.stats());
    let before = violations(&server);
    std::thread::sleep(Duration::from_secs(3));
    let tries = violations(&server) - before;
    assert!(tries <= 12, "{tries} refused logins in 3 s");

    // The old password is accepted again: the relay goes on by itself.
    server.set_extra(&users("pa55-word"));
    server.restart();
    wait("the later jobs out", &|| q.stats().unwrap().total == 0);
    let stats = relay.shutdown();
    assert_eq!(stats.moved, 20, "{stats:?}");
    let js = Js::connect_with(&server.url(), login());
    assert_eq!(js.count("EVENTS"), 20);
}

#[test]
fn a_renewed_creds_file_is_read_at_the_reconnect_its_expiry_forces() {
    let _g = shared();
    let operator = Operator::new();
    // `debug` logs why a client's connection closed.
    let server = NatsServer::start_with(&format!("{}\ndebug: true", operator.server_conf()));
    let (admin, _) = operator.creds(&operator.account, None);
    let js = Js::connect_with(
        &server.url(),
        async_nats::ConnectOptions::with_credentials(&admin).unwrap(),
    );
    js.create_stream("EVENTS", &["events.>"], None);
    let (_qdir, q) = queue_with_jobs(10);
    let now = unix_now();
    // The device's file holds a JWT that expires in 4 s; the relay starts with it.
    let dir = tempfile::tempdir().unwrap();
    let (short, _) = operator.creds(&operator.account, Some(now + 4));
    let file = write(dir.path(), "edge-7.creds", &short);
    let relay = running(&q, &server.url(), Connection::new().credentials_file(&file));
    let wait = |what: &str, f: &dyn Fn() -> bool| wait_relay(&relay, what, f);
    wait("the first jobs out", &|| q.stats().unwrap().total == 0);
    // The fleet renews the file before the JWT expires (as a credentials agent does).
    let (renewed, _) = operator.creds(&operator.account, None);
    write(dir.path(), "edge-7.creds", &renewed);
    // The server drops the connection at the expiry; the relay reconnects with the file's
    // new JWT and goes on.
    wait("the server to drop the expired login", &|| {
        let log = std::fs::read_to_string(server.log()).unwrap_or_default();
        log.contains("Authentication Expired")
    });
    for i in 0..10u32 {
        q.enqueue(format!("later {i}").as_bytes(), EnqueueOptions::default())
            .unwrap();
    }
    wait("the later jobs out", &|| q.stats().unwrap().total == 0);
    let stats = relay.shutdown();
    assert_eq!(stats.moved, 20, "{stats:?}");
    assert_eq!(js.count("EVENTS"), 20);
}

/// An outbound relay of `q` to `url` with `connection`, ready (max backoff 400 ms).
fn running(q: &Queue, url: &str, connection: Connection) -> Outbound {
    let relay = Outbound::builder(q, url, "EVENTS", "events.edge")
        .connection(connection)
        .max_backoff(Duration::from_millis(400))
        .start()
        .unwrap();
    relay.wait_ready(READY).unwrap();
    relay
}

/// Waits up to 30 s for `f`, else panics naming `what` with the relay's stats.
fn wait_relay(relay: &Outbound, what: &str, f: &dyn Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {:?}",
            relay.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Seconds since the Unix epoch, as JWTs count time.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
