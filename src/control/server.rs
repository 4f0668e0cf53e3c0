//! The HTTP side of the control channel and the dashboard: hyper's HTTP/1.1 connections on a
//! small tokio runtime of the server's own, with a bound on everything a client controls
//! (connections, header bytes and time, body bytes and time, a connection's life), each
//! request answered on a blocking thread by a [`Handler`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, oneshot};

/// Connections open at once; one more is closed at once. A connection refused its access
/// token is closed after the answer, so it holds no place.
pub(crate) const CONNECTIONS_MAX: usize = 128;
/// Requests answered at once (each on a blocking thread: a page reads the file, an action
/// commits); more wait for a turn.
pub(crate) const ANSWERING_MAX: usize = 4;
/// Bytes of a request's head (request line and headers) read at most (hyper's smallest
/// buffer bound).
const HEAD_BYTES_MAX: usize = 8 * 1024;
/// Time a client has to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a request's body read at most (an action's form is a few hundred bytes), unless
/// the handler allows more for that request ([`Handler::body_bytes_max`]).
pub(crate) const BODY_BYTES_MAX: usize = 16 * 1024;
/// Time a client has to send a request's body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection stays open (a client that stops reading an answer, or keeps a
/// connection idle, is cut off then).
const CONNECTION_MAX_TIME: Duration = Duration::from_secs(300);
/// How often the server calls [`Handler::idle`] (a look at whether the app closed its queue).
const IDLE_LOOK: Duration = Duration::from_millis(100);
/// How long a stop waits for answers in progress before it lets go of them.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What answers the requests a server reads.
pub(crate) trait Handler: Send + Sync + 'static {
    /// The name in logs and in the server thread's name (`dashboard`, `control`).
    fn name(&self) -> &'static str;

    /// The answer to one request, read whole (on a blocking thread).
    fn answer(&self, asked: &Asked) -> Reply;

    /// Called every 100 ms while the server runs (and at every request, by the handler).
    fn idle(&self) {}

    /// The answer to a request the server itself refuses (`kind`: `bad_request`,
    /// `too_large`, `timeout`, `stopping`, `failed`), before or around the handler: plain
    /// text unless the handler answers in another form.
    fn refusal(&self, status: u16, _kind: &'static str, message: &str) -> Reply {
        Reply::text(status, format!("{status}: {message}"))
    }

    /// Bytes of body this request may send, decided from its head alone (method, path,
    /// headers with lower-case names): [`BODY_BYTES_MAX`] unless the handler allows more, as
    /// for an authenticated enqueue carrying a payload.
    fn body_bytes_max(
        &self,
        _method: &str,
        _path: &str,
        _headers: &HashMap<String, String>,
    ) -> usize {
        BODY_BYTES_MAX
    }
}

/// A request read whole: method, path, query, headers (lower-case names) and body.
pub(crate) struct Asked {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: HashMap<String, String>,
    /// A query parameter given more than once (`query` holds its last value), if any.
    pub(crate) repeated: Option<String>,
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: Vec<u8>,
}

impl Asked {
    #[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// A query parameter; `None` when absent or empty.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.query
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// An answer before it is sent.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) body: Vec<u8>,
    pub(crate) headers: Vec<(&'static str, String)>,
}

impl Reply {
    #[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
    pub(crate) fn html(status: u16, body: String) -> Reply {
        Reply::with(status, "text/html; charset=utf-8", body.into_bytes())
    }

    pub(crate) fn text(status: u16, body: impl Into<String>) -> Reply {
        Reply::with(
            status,
            "text/plain; charset=utf-8",
            body.into().into_bytes(),
        )
    }

    pub(crate) fn json(status: u16, value: &serde_json::Value) -> Reply {
        let mut body = value.to_string().into_bytes();
        body.push(b'\n');
        Reply::with(status, "application/json", body)
    }

    pub(crate) fn with(status: u16, content_type: &'static str, body: Vec<u8>) -> Reply {
        Reply {
            status,
            content_type,
            body,
            headers: Vec::new(),
        }
    }

    #[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
    pub(crate) fn redirect(to: String) -> Reply {
        let mut reply = Reply::text(303, format!("see {to}"));
        reply.headers.push(("Location", to));
        reply
    }
}

/// The running server: its thread, and the way to stop it.
pub(crate) struct Running {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Starts serving `listener` on a thread of its own.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        app: Arc<dyn Handler>,
    ) -> std::io::Result<Running> {
        listener.set_nonblocking(true)?;
        let thread_name = format!("leaseq-{}", app.name());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(thread_name.clone())
            .max_blocking_threads(ANSWERING_MAX)
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                runtime.block_on(accept(listener, app, stopped));
                // Answers still running (a client that stopped reading) are let go of.
                runtime.shutdown_timeout(STOP_GRACE);
            })?;
        Ok(Running {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops accepting, ends the connections, and waits (at most about [`STOP_GRACE`] for
    /// answers in progress).
    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(
    listener: std::net::TcpListener,
    app: Arc<dyn Handler>,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, server = app.name(), "leaseq: cannot listen");
            return;
        }
    };
    let connections = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let answering = Arc::new(Semaphore::new(ANSWERING_MAX));
    // One ticker for the whole loop (a sleep made anew at each turn would never end while
    // connections come faster than it).
    let mut look = tokio::time::interval(IDLE_LOOK);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = look.tick() => app.idle(),
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: a pause, not an end.
                        tracing::debug!(error = %e, server = app.name(), "leaseq: accept failed");
                        tokio::time::sleep(IDLE_LOOK).await;
                        continue;
                    }
                };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::debug!(server = app.name(), "leaseq: connection refused: too many open");
                    continue;
                };
                let (app, answering) = (app.clone(), answering.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        answer(app.clone(), answering.clone(), request)
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEAD_TIMEOUT)
                        .max_buf_size(HEAD_BYTES_MAX)
                        .serve_connection(TokioIo::new(stream), service);
                    let _ = tokio::time::timeout(CONNECTION_MAX_TIME, connection).await;
                    drop(permit);
                });
            }
        }
    }
}

/// Reads one request whole (within its bounds), answers it on a blocking thread.
async fn answer(
    app: Arc<dyn Handler>,
    answering: Arc<Semaphore>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let (path, query) = match parts.uri.path_and_query() {
        Some(pq) => (pq.path().to_string(), pq.query().unwrap_or("").to_string()),
        None => ("/".to_string(), String::new()),
    };
    let headers: HashMap<String, String> = parts
        .headers
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .collect();
    let body_max = app.body_bytes_max(parts.method.as_str(), &path, &headers);
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > body_max as u64) {
        return Ok(response(too_large(&*app, body_max)));
    }
    let body =
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, body_max).collect()).await {
            Ok(Ok(collected)) => collected.to_bytes().to_vec(),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return Ok(response(too_large(&*app, body_max)));
            }
            Ok(Err(_)) => {
                return Ok(response(app.refusal(
                    400,
                    "bad_request",
                    "the body could not be read",
                )));
            }
            Err(_) => {
                return Ok(response(app.refusal(
                    408,
                    "timeout",
                    "the body came too slowly",
                )));
            }
        };
    let mut repeated = None;
    let mut params = HashMap::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()).into_owned() {
        if params.contains_key(&k) && repeated.is_none() {
            repeated = Some(k.clone());
        }
        params.insert(k, v);
    }
    let asked = Asked {
        method: parts.method.as_str().to_string(),
        path,
        query: params,
        repeated,
        headers,
        body,
    };
    let head = parts.method == hyper::Method::HEAD;
    let Ok(_turn) = answering.acquire_owned().await else {
        return Ok(response(app.refusal(
            503,
            "stopping",
            "the server is stopping",
        )));
    };
    let name = app.name();
    let answering = Arc::clone(&app);
    let reply = match tokio::task::spawn_blocking(move || answering.answer(&asked)).await {
        Ok(reply) => reply,
        Err(e) => {
            tracing::warn!(error = %e, server = name, "leaseq: an answer failed");
            app.refusal(
                500,
                "failed",
                "the server failed to answer (see the app's log)",
            )
        }
    };
    let refused = matches!(reply.status, 400 | 401 | 403 | 405 | 408 | 413);
    let mut response = response(reply);
    if refused {
        // Refused requests do not keep their connection (nor its place among the bound).
        response
            .headers_mut()
            .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    }
    if head {
        *response.body_mut() = Full::new(Bytes::new());
    }
    Ok(response)
}

fn too_large(app: &dyn Handler, max: usize) -> Reply {
    let mut reply = app.refusal(
        413,
        "too_large",
        &format!("this request's body is at most {max} bytes"),
    );
    reply.headers.push(("Connection", "close".into()));
    reply
}

/// The reply as hyper's response, with the headers every answer carries. A header value
/// HTTP cannot carry is a 500, never a panic.
fn response(reply: Reply) -> Response<Full<Bytes>> {
    let fixed = [
        ("Content-Type", reply.content_type),
        ("Cache-Control", "no-store"),
        ("X-Content-Type-Options", "nosniff"),
        // Not `no-referrer`: with it, browsers send `Origin: null` on the forms, which the
        // cross-site check refuses. No URL carries the token once the cookie is set.
        ("Referrer-Policy", "same-origin"),
        ("X-Frame-Options", "DENY"),
        (
            "Content-Security-Policy",
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
    ];
    let mut headers = Vec::new();
    for (name, value) in fixed
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .chain(reply.headers)
    {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            (Ok(name), Ok(value)) => headers.push((name, value)),
            _ => {
                tracing::warn!(header = name, "leaseq: a header HTTP cannot carry");
                return response(Reply::text(500, "500: an answer HTTP cannot carry"));
            }
        }
    }
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in headers {
        response.headers_mut().append(name, value);
    }
    response
}
