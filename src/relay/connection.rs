//! How a relay reaches its servers: TLS and credentials ([`Connection`]), and the server list.

use super::RelayError;
use async_nats::rustls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most bytes a PEM or `.creds` file given to a [`Connection`] may hold (1 MiB): a CA
/// bundle of the system's size fits; a wrong path to a large file is refused, not read whole.
pub const CONNECTION_FILE_BYTES_MAX: u64 = 1 << 20;

/// How a relay connects to its NATS servers: TLS and credentials, as the official NATS
/// clients' connection options (`nats.go`'s `RootCAs`, `ClientCert`, `UserInfo`, `Token`,
/// `Nkey`, `UserCredentials`). Give it to [`OutboundBuilder::connection`](super::OutboundBuilder::connection) or
/// [`InboundBuilder::connection`](super::InboundBuilder::connection); one value can serve both relays of an app.
///
/// ```no_run
/// use leaseq::relay::{Connection, Outbound};
/// use leaseq::Queue;
///
/// let file = Queue::open("edge.leaseq")?;
/// let events = file.named("events")?;
/// let nats = Connection::new()
///     .root_certificates_file("/etc/fleet/ca.pem")            // the fleet's CA
///     .client_certificate_files("/etc/fleet/edge-7.pem", "/etc/fleet/edge-7.key")
///     .credentials_file("/etc/fleet/edge-7.creds");           // JWT + NKey seed
/// let out = Outbound::builder(&events, "tls://nats-1.fleet:4222,tls://nats-2.fleet:4222",
///                             "EVENTS", "events.edge-7")
///     .connection(nats)
///     .start()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// **TLS** is used when a URL says `tls://`, when [`Connection::tls_required`] is set, or when
/// the server requires it. The server's certificate must chain to one of the roots given
/// ([`Connection::root_certificates_file`], [`Connection::root_certificates_pem`]), or to the
/// platform's roots when none is given (loaded once per process, as Go's system pool), and
/// name the host the URL names (an IP address in a URL must be among the certificate's IP
/// addresses). A refused certificate (unknown CA, expired, another name) is
/// [`RelayError::Tls`]; wrong or missing credentials are [`RelayError::Auth`]. Both are kept
/// as the relay's last error while it tries again with its backoff (up to
/// [`OutboundBuilder::max_backoff`](super::OutboundBuilder::max_backoff), reconnects
/// included); the jobs stay in the file.
///
/// **Credentials** are one of user and password, token, NKey seed or `.creds`; the last one
/// set wins. With none set here, a URL's user information is used as the official clients
/// use it (`nats://user:password@host`, `nats://token@host`, percent-encoded); credentials
/// both here and in the URL are refused by `start` ([`RelayError::InvalidOption`]).
///
/// **Secrets** (password, token, NKey seed, a `.creds` file's seed, a private key) stay in
/// memory: they are never written to the queue file, and neither this type's `Debug`, the
/// relay's errors nor its `tracing` events show them (a password in a URL, as
/// `nats://user:pass@host`, is shown as `nats://***@host`).
///
/// **Files** are read at `start`, which refuses a bad one. A `.creds` file is then read again
/// at every connection, reconnects included, as nats.go's `UserCredentials` reads it: a file
/// renewed before its JWT expires is taken at the reconnect the expiry forces. Certificate
/// files are read at the relay's first connections (after a start, or while it has never
/// reached a server), as the official clients load them once: a renewed certificate is taken
/// by restarting the relay.
#[derive(Clone, Default)]
pub struct Connection {
    tls_required: bool,
    roots: Vec<Source>,
    client: Option<(Source, Source)>,
    auth: Option<Auth>,
}

/// A PEM document or a `.creds` file: on disk, or given as bytes.
#[derive(Clone)]
enum Source {
    File(PathBuf),
    Bytes(Arc<[u8]>),
}

#[derive(Clone)]
enum Auth {
    UserPassword { user: String, password: Arc<str> },
    Token(Arc<str>),
    NKeySeed(Arc<str>),
    Credentials(Source),
}

impl Connection {
    /// No TLS unless a URL or the server asks for it, the platform's roots, no credentials.
    pub fn new() -> Connection {
        Connection::default()
    }

    /// Refuses to connect without TLS (as `nats.go`'s `Secure()`), whatever the URL says and
    /// even if the server does not ask for it: a server that does not offer TLS is refused
    /// with [`RelayError::Tls`].
    pub fn tls_required(mut self, required: bool) -> Connection {
        self.tls_required = required;
        self
    }

    /// Trusts the CA certificates of a PEM file (one or more `CERTIFICATE` blocks) instead
    /// of the platform's roots; may be called again to add more. Read as the type's docs say
    /// (at most [`CONNECTION_FILE_BYTES_MAX`] bytes); a missing or unreadable file is
    /// refused by the relay's `start` ([`RelayError::InvalidOption`]).
    pub fn root_certificates_file(mut self, path: impl AsRef<Path>) -> Connection {
        self.roots.push(Source::File(path.as_ref().to_path_buf()));
        self
    }

    /// [`Connection::root_certificates_file`] from PEM bytes held by the app.
    pub fn root_certificates_pem(mut self, pem: impl AsRef<[u8]>) -> Connection {
        self.roots.push(Source::Bytes(pem.as_ref().into()));
        self
    }

    /// Presents a client certificate (mutual TLS): a PEM file with the certificate chain
    /// (leaf first) and one with its private key (PKCS#8, PKCS#1 or SEC1). Read as
    /// [`Connection::root_certificates_file`].
    pub fn client_certificate_files(
        mut self,
        certificate: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Connection {
        self.client = Some((
            Source::File(certificate.as_ref().to_path_buf()),
            Source::File(key.as_ref().to_path_buf()),
        ));
        self
    }

    /// [`Connection::client_certificate_files`] from PEM bytes held by the app.
    pub fn client_certificate_pem(
        mut self,
        certificate: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
    ) -> Connection {
        self.client = Some((
            Source::Bytes(certificate.as_ref().into()),
            Source::Bytes(key.as_ref().into()),
        ));
        self
    }

    /// Authenticates with a user name and password (a server's `authorization { users }`).
    /// Replaces any credentials set before.
    pub fn user_password(mut self, user: &str, password: &str) -> Connection {
        self.auth = Some(Auth::UserPassword {
            user: user.to_string(),
            password: password.into(),
        });
        self
    }

    /// Authenticates with a token (a server's `authorization { token }`). Replaces any
    /// credentials set before.
    pub fn token(mut self, token: &str) -> Connection {
        self.auth = Some(Auth::Token(token.into()));
        self
    }

    /// Authenticates with an NKey: the user's seed (`SU…`), which signs the server's nonce;
    /// only its public key is sent. Replaces any credentials set before. A seed that does not
    /// decode is refused by `start` ([`RelayError::InvalidOption`], without the seed).
    pub fn nkey_seed(mut self, seed: &str) -> Connection {
        self.auth = Some(Auth::NKeySeed(seed.into()));
        self
    }

    /// Authenticates with a `.creds` file (a user JWT and its NKey seed, as `nsc` writes them
    /// for NATS accounts), read at every connection (the type's docs). A missing, oversized
    /// or malformed file is refused by `start` ([`RelayError::InvalidOption`]); one that turns
    /// bad later is [`RelayError::Auth`] at that connection. Replaces any credentials set
    /// before.
    pub fn credentials_file(mut self, path: impl AsRef<Path>) -> Connection {
        self.auth = Some(Auth::Credentials(Source::File(path.as_ref().to_path_buf())));
        self
    }

    /// [`Connection::credentials_file`] from the file's text held by the app.
    pub fn credentials(mut self, creds: &str) -> Connection {
        self.auth = Some(Auth::Credentials(Source::Bytes(creds.as_bytes().into())));
        self
    }

    /// Checks that every file can be read and every document parses, so that `start` refuses
    /// a bad setting at once. Errors name the file, never a secret.
    pub(super) fn validate(&self, servers: &Servers) -> Result<(), RelayError> {
        self.options(servers, true)
            .map(drop)
            .map_err(RelayError::InvalidOption)
    }

    /// The client's options with this connection's TLS and credentials; the reason (naming a
    /// file, never a secret) when a file cannot be read or a document does not parse.
    ///
    /// `servers` are the parsed URLs: their credentials (user information) are used when this
    /// connection sets none; set in both places, they are refused. `at_start`: `start`'s
    /// check, which also reads a `.creds` file (later, its callback reads it, and a bad one
    /// is then refused as credentials are).
    pub(super) fn options(
        &self,
        servers: &Servers,
        at_start: bool,
    ) -> Result<async_nats::ConnectOptions, String> {
        let mut base = match &self.auth {
            // Read again at every connection, reconnects included, as nats.go's
            // UserCredentials: a renewed file (a new JWT before the old one expires) is taken
            // without a restart. Read off the runtime's thread: a hung mount then waits no
            // longer than the connection timeout, which bounds the callback.
            Some(Auth::Credentials(src @ Source::File(_))) => {
                if at_start {
                    creds_of(src)?;
                }
                let src = src.clone();
                async_nats::ConnectOptions::with_auth_callback(move |nonce| {
                    let src = src.clone();
                    async move {
                        let read = tokio::task::spawn_blocking(move || creds_of(&src));
                        let (jwt, key) = read
                            .await
                            .map_err(|_| async_nats::AuthError::new("reading the .creds file"))?
                            .map_err(async_nats::AuthError::new)?;
                        let mut auth = async_nats::Auth::new();
                        auth.signature = Some(key.sign(&nonce).map_err(|_| {
                            async_nats::AuthError::new("the .creds seed cannot sign")
                        })?);
                        auth.jwt = Some(jwt);
                        Ok(auth)
                    }
                })
            }
            _ => async_nats::ConnectOptions::new(),
        };
        let tls_url = servers.addrs.iter().any(|s| s.tls_required());
        if self.tls_required {
            base = base.require_tls(true);
        }
        // Always built here, with rustls's ring provider named: a server that asks for TLS
        // when nothing here did would otherwise make the client use the process default,
        // which another crate may have made ambiguous (a panic in rustls).
        let wanted =
            self.tls_required || tls_url || !self.roots.is_empty() || self.client.is_some();
        base = base.tls_client_config(self.tls_config(wanted)?);
        let auth = match (&self.auth, &servers.auth) {
            (Some(_), Some(_)) => {
                return Err("credentials given both in the URL and by the Connection: \
                            give them once"
                    .into());
            }
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return Ok(base),
        };
        Ok(match auth {
            Auth::UserPassword { user, password } => {
                base.user_and_password(user.clone(), password.to_string())
            }
            Auth::Token(t) => base.token(t.to_string()),
            Auth::NKeySeed(seed) => {
                if nkeys::KeyPair::from_seed(seed).is_err() {
                    return Err("the NKey seed does not decode (a user seed starts with SU)".into());
                }
                base.nkey(seed.to_string())
            }
            // Set up above, with the callback.
            Auth::Credentials(Source::File(_)) => base,
            Auth::Credentials(src) => {
                let (jwt, key) = creds_of(src)?;
                let key = Arc::new(key);
                base.jwt(jwt, move |nonce| {
                    let key = Arc::clone(&key);
                    async move {
                        key.sign(&nonce)
                            .map_err(|_| async_nats::AuthError::new("the .creds seed cannot sign"))
                    }
                })
            }
        })
    }

    /// The TLS client configuration: the given roots (or the platform's), and the client
    /// certificate if any.
    /// `wanted`: TLS is known to be used (else no warning for a platform without roots).
    fn tls_config(&self, wanted: bool) -> Result<rustls::ClientConfig, String> {
        let mut roots = rustls::RootCertStore::empty();
        if self.roots.is_empty() {
            let (platform, errors) = platform_roots();
            roots = platform.clone();
            if roots.is_empty() && wanted {
                // No server can be trusted then: each is refused as `Tls` (UnknownIssuer).
                tracing::warn!(
                    target: "leaseq::relay",
                    errors,
                    "the platform's root certificates could not be loaded: \
                     give the CA with root_certificates_file"
                );
            }
        }
        for src in &self.roots {
            let certs = certificates(src, "root certificates")?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", src.name("root certificates")))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        match &self.client {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = certificates(cert, "client certificate")?;
                let bytes = key.read("client key")?;
                let key_der = PrivateKeyDer::from_pem_slice(&bytes)
                    .map_err(|_| format!("{}: no private key in PEM", key.name("client key")))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("client certificate and key: {e}"))
            }
        }
    }
}

/// The platform's root certificates and how many failed to load, loaded once per process
/// (as Go's `x509.SystemCertPool`, which nats.go uses): every relay's every connection
/// attempt needs them, and parsing the system's bundle costs milliseconds.
fn platform_roots() -> &'static (rustls::RootCertStore, usize) {
    static ROOTS: std::sync::OnceLock<(rustls::RootCertStore, usize)> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let native = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(native.certs);
        (roots, native.errors.len())
    })
}

/// The user JWT and NKey of a `.creds` document (as `nsc` writes it: the JWT, then the seed,
/// each on the line after a `-----BEGIN …-----` line); the reason names the document, never
/// the seed.
fn creds_of(src: &Source) -> Result<(String, nkeys::KeyPair), String> {
    let bytes = src.read("credentials")?;
    let name = || src.name("credentials");
    let text = std::str::from_utf8(&bytes).map_err(|_| format!("{}: not UTF-8 text", name()))?;
    let mut blocks = Vec::with_capacity(2);
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line.starts_with("---") && line.ends_with("---") && line.contains("BEGIN") {
            blocks.push(lines.find(|l| !l.is_empty()).unwrap_or(""));
            if blocks.len() == 2 {
                break;
            }
        }
    }
    let [jwt, seed] = blocks[..] else {
        return Err(format!("{}: no user JWT and NKey seed", name()));
    };
    if jwt.split('.').count() != 3 {
        return Err(format!("{}: the user JWT is not a JWT", name()));
    }
    let key = nkeys::KeyPair::from_seed(seed)
        .map_err(|_| format!("{}: the NKey seed does not decode", name()))?;
    Ok((jwt.to_string(), key))
}

/// The certificates of a PEM document, at least one.
fn certificates(src: &Source, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = src.read(what)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", src.name(what)))?;
    if certs.is_empty() {
        return Err(format!("{}: no CERTIFICATE in PEM", src.name(what)));
    }
    Ok(certs)
}

impl Source {
    /// Says which document: the file's path, or that the app gave the bytes.
    fn name(&self, what: &str) -> String {
        match self {
            Source::File(p) => format!("{what} file {}", p.display()),
            Source::Bytes(_) => format!("{what} given as bytes"),
        }
    }

    /// The document's bytes (a file of at most [`CONNECTION_FILE_BYTES_MAX`]).
    fn read(&self, what: &str) -> Result<Vec<u8>, String> {
        match self {
            Source::Bytes(b) => Ok(b.to_vec()),
            Source::File(p) => {
                use std::io::Read;
                let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", self.name(what)))?;
                let mut bytes = Vec::new();
                f.take(CONNECTION_FILE_BYTES_MAX + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| format!("{}: {e}", self.name(what)))?;
                if bytes.len() as u64 > CONNECTION_FILE_BYTES_MAX {
                    return Err(format!(
                        "{}: larger than {CONNECTION_FILE_BYTES_MAX} bytes",
                        self.name(what)
                    ));
                }
                Ok(bytes)
            }
        }
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Bytes(b) => write!(f, "<{} bytes>", b.len()),
        }
    }
}

/// Shows the settings, never a secret: the user name and the files' paths, not the password,
/// token, seed or the bytes of a key.
impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            None => "none".to_string(),
            Some(Auth::UserPassword { user, .. }) => format!("user {user:?}, password <redacted>"),
            Some(Auth::Token(_)) => "token <redacted>".into(),
            Some(Auth::NKeySeed(_)) => "nkey seed <redacted>".into(),
            Some(Auth::Credentials(src)) => format!("credentials {src:?}"),
        };
        f.debug_struct("Connection")
            .field("tls_required", &self.tls_required)
            .field("roots", &self.roots)
            .field("client_certificate", &self.client.as_ref().map(|(c, _)| c))
            .field("auth", &format_args!("{auth}"))
            .finish()
    }
}

/// The error of a reconnect the client's own loop saw refused, if `event` says so: for its
/// credentials (the server's `-ERR 'Authorization Violation'`, or a client error naming the
/// connect error's kind, as async-nats reports a failed reconnect), or for TLS (its `Tls`
/// kind; a certificate refused then arrives as an I/O error and is not told apart).
pub(super) fn refused_reconnect(event: &async_nats::Event, url: &str) -> Option<RelayError> {
    use async_nats::{ClientError, ConnectErrorKind, Event, ServerError};
    let url = url.to_string();
    match event {
        Event::ServerError(ServerError::AuthorizationViolation) => Some(RelayError::Auth {
            url,
            reason: "authorization violation while reconnecting".into(),
        }),
        Event::ClientError(ClientError::Other(kind))
            if *kind == ConnectErrorKind::AuthorizationViolation.to_string()
                || *kind == ConnectErrorKind::Authentication.to_string() =>
        {
            Some(RelayError::Auth {
                url,
                reason: format!("{kind} while reconnecting"),
            })
        }
        Event::ClientError(ClientError::Other(kind))
            if *kind == ConnectErrorKind::Tls.to_string() =>
        {
            Some(RelayError::Tls {
                url,
                reason: format!("{kind} while reconnecting"),
            })
        }
        _ => None,
    }
}

/// Whether `e` or an error under it is rustls's (a certificate refused, a handshake failed).
pub(super) fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<rustls::Error>() {
            return true;
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && inner.is::<rustls::Error>()
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The servers of a relay's URL, and the credentials its user information carries (no
/// `Debug`: it holds them).
pub(super) struct Servers {
    /// Each URL without its user information (so that no secret reaches the client's logs).
    pub(super) addrs: Vec<async_nats::ServerAddr>,
    /// `user:password@` or `token@`, as the official clients read a URL.
    auth: Option<Auth>,
}

/// The server URLs of a comma-separated list (as the official clients take them), each
/// trimmed; the reason when one does not parse, the list is empty, or two URLs carry
/// different user information (the client logs in to every server the same way).
pub(super) fn server_addrs(urls: &str) -> Result<Servers, String> {
    let parts: Vec<&str> = urls.split(',').map(str::trim).collect();
    if parts.iter().all(|p| p.is_empty()) {
        return Err("empty: give the server's address, as nats://host:4222".into());
    }
    let mut addrs = Vec::with_capacity(parts.len());
    if let Some(p) = parts
        .iter()
        .find(|p| !p.contains("://") && p.contains("//"))
    {
        return Err(format!(
            "{}: a scheme is written nats:// or tls:// (as in nats://host:4222)",
            redact_url(p)
        ));
    }
    let schemes = parts.iter().filter(|p| p.contains("://")).count();
    if schemes != 0 && schemes != parts.len() {
        // Most likely a password holding an unencoded comma, split into two URLs.
        return Err(format!(
            "{}: some URLs have a scheme and some not; give each its scheme \
             (a comma in a password is written %2C)",
            redact_url(urls)
        ));
    }
    let mut userinfo: Option<&str> = None;
    for p in parts {
        if p.is_empty() {
            return Err("an empty URL in the list".to_string());
        }
        let (scheme, info, host) = split_userinfo(p);
        if let Some(info) = info {
            if userinfo.is_some_and(|seen| seen != info) {
                return Err(format!(
                    "{}: the URLs carry different user information; give one login",
                    redact_url(urls)
                ));
            }
            userinfo = Some(info);
        }
        // Errors show the whole list redacted: a part alone may be a piece of a password
        // holding an unencoded comma.
        let addr = format!("{scheme}{host}")
            .parse::<async_nats::ServerAddr>()
            .map_err(|e| format!("{}: {e}", redact_url(urls)))?;
        addrs.push(addr);
    }
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8()
            .map(|t| t.into_owned())
            .map_err(|_| format!("{}: user information not UTF-8", redact_url(urls)))
    };
    let auth = match userinfo {
        None => None,
        Some(info) => Some(match info.split_once(':') {
            Some((user, password)) => Auth::UserPassword {
                user: decode(user)?,
                password: decode(password)?.into(),
            },
            None => Auth::Token(decode(info)?.into()),
        }),
    };
    Ok(Servers { addrs, auth })
}

/// A URL's scheme (with `://`, or empty), user information and the rest. The user information
/// ends at the URL's last `@`: a NATS URL has no path, so an `@` after a `/`, `?` or `#` (which
/// a password should have percent-encoded) still ends it. Empty user information is none.
fn split_userinfo(url: &str) -> (&str, Option<&str>, &str) {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    match rest.rfind('@') {
        Some(at) => (
            scheme,
            Some(&rest[..at]).filter(|i| !i.is_empty()),
            &rest[at + 1..],
        ),
        None => (scheme, None, rest),
    }
}

/// `urls` with any user information (`user:password@`, `token@`) replaced by `***`, for
/// errors and logs. A comma-separated piece without a scheme is taken with the piece before
/// it (it may be the rest of a password holding an unencoded comma): hiding a server's
/// address too is the price of never showing part of a secret.
pub(super) fn redact_url(urls: &str) -> String {
    let mut groups: Vec<String> = Vec::new();
    for part in urls.split(',') {
        match groups.last_mut() {
            Some(group) if !part.contains("://") => {
                group.push(',');
                group.push_str(part);
            }
            _ => groups.push(part.to_string()),
        }
    }
    groups
        .iter()
        .map(|g| match split_userinfo(g) {
            (scheme, _, host) if g.contains('@') => format!("{scheme}***@{host}"),
            _ => g.clone(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_user_information_and_lists_parse() {
        assert_eq!(
            redact_url("nats://alice:s3cret@a:4222, tls://tok@b:4222,nats://c:4222"),
            "nats://***@a:4222, tls://***@b:4222,nats://c:4222"
        );
        assert_eq!(redact_url("a:4222"), "a:4222");
        assert_eq!(redact_url("nats://a:4222, b:4222"), "nats://a:4222, b:4222");
        // The secret may look like a scheme, hold unencoded `/ ? # , @`, or be empty.
        for (url, shown) in [
            ("nats://nats@h:4222", "nats://***@h:4222"),
            ("tls://t@h", "tls://***@h"),
            ("nats://@h", "nats://***@h"),
            ("nats://Q9/Z7@h", "nats://***@h"),
            ("nats://u:Q9?Z7#X5@h:1", "nats://***@h:1"),
            ("nats://u:Q9@Z7@h", "nats://***@h"),
            ("nats://u:Q9,Z7@h", "nats://***@h"),
            ("nats://u:Q9,Z7,X5@h,nats://b:2", "nats://***@h,nats://b:2"),
            ("u:Q9@h:4222", "***@h:4222"),
            ("nats://u:Q9@[::1]:4222", "nats://***@[::1]:4222"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
            if let Err(e) = server_addrs(url).map(drop) {
                for secret in ["nats@", "t@", "Q9", "Z7", "X5"] {
                    assert!(!e.contains(secret), "{url}: {e}");
                }
            }
        }
        let servers = server_addrs("nats://a:1, tls://b:2").unwrap();
        assert_eq!(servers.addrs.len(), 2);
        assert!(servers.auth.is_none());
        assert!(server_addrs(" , ").is_err());
        assert!(server_addrs("nats://a:1,,nats://b:2").is_err());
        let e = server_addrs("nats://u:s3cret@a:99999").err().unwrap();
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn credentials_in_urls_are_taken_out_of_them_and_decoded() {
        let s = server_addrs("nats://al%40ce:s3c%3Aret@a:1,nats://b:2").unwrap();
        assert!(
            matches!(&s.auth, Some(Auth::UserPassword { user, password })
                if user == "al@ce" && &**password == "s3c:ret"),
            "{:?}",
            s.auth.is_some()
        );
        for addr in &s.addrs {
            assert!(!addr.has_user_pass(), "{addr:?}");
            assert!(!format!("{addr:?}").contains("s3c"), "{addr:?}");
        }
        let s = server_addrs("tls://t0k@a:1, tls://t0k@b:2").unwrap();
        assert!(matches!(&s.auth, Some(Auth::Token(t)) if &**t == "t0k"));
        let s = server_addrs("nats://tok/en@a:1").unwrap();
        assert!(matches!(&s.auth, Some(Auth::Token(t)) if &**t == "tok/en"));
        assert!(!format!("{:?}", s.addrs).contains("tok"));
        assert!(server_addrs("nats://@a:1").unwrap().auth.is_none());
        let e = server_addrs("tls//u:Q9@a:1").err().unwrap();
        assert!(e.contains("nats:// or tls://") && !e.contains("Q9"), "{e}");
        let e = server_addrs("nats://u:1234,ss@a:1").err().unwrap();
        assert!(e.contains("%2C") && !e.contains("1234"), "{e}");
        let e = server_addrs("nats://u:pw-1@a:1,nats://u:pw-2@b:2")
            .err()
            .unwrap();
        assert!(
            e.contains("different user information") && !e.contains("pw-"),
            "{e}"
        );
        // Given twice: in the URL and by the Connection.
        let e = Connection::new()
            .token("t0k")
            .validate(&server_addrs("nats://u:p@a:1").unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("both in the URL"), "{e}");
    }

    fn none() -> Servers {
        server_addrs("nats://a:1").unwrap()
    }

    #[test]
    fn debug_shows_no_secret() {
        for c in [
            Connection::new().user_password("alice", "s3cret"),
            Connection::new().token("s3cret"),
            Connection::new().nkey_seed("s3cret"),
            Connection::new().credentials("s3cret"),
            Connection::new().client_certificate_pem("cert", "s3cret"),
        ] {
            let text = format!("{c:?}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    #[test]
    fn bad_documents_are_refused_naming_the_file_not_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = Connection::new()
            .root_certificates_file(&missing)
            .validate(&none())
            .unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
        let e = Connection::new()
            .root_certificates_pem("not a pem")
            .validate(&none())
            .unwrap_err();
        assert!(e.to_string().contains("no CERTIFICATE"), "{e}");
        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'a'; CONNECTION_FILE_BYTES_MAX as usize + 1]).unwrap();
        let e = Connection::new()
            .root_certificates_file(&big)
            .validate(&none())
            .unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        let e = Connection::new()
            .nkey_seed("SUs3cret")
            .validate(&none())
            .unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = Connection::new()
            .credentials("s3cret, not a creds file")
            .validate(&none())
            .unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
