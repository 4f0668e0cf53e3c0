//! The HTTP side: hyper's HTTP/1.1 connections on a small tokio runtime of the dashboard's
//! own, with a bound on everything a client controls (connections, header bytes and time,
//! body bytes and time, a connection's life), each request answered on a blocking thread.

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

use super::http::{App, Asked, Reply};

/// Connections open at once; one more is closed at once. A connection refused its access
/// token is closed after the answer, so it holds no place.
pub(super) const CONNECTIONS_MAX: usize = 128;
/// Requests answered at once (each on a blocking thread: a page reads the file, an action
/// commits); more wait for a turn.
pub(super) const ANSWERING_MAX: usize = 4;
/// Bytes of a request's head (request line and headers) read at most (hyper's smallest
/// buffer bound).
const HEAD_BYTES_MAX: usize = 8 * 1024;
/// Time a client has to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a request's body read at most (an action's form is a few hundred bytes).
pub(super) const BODY_BYTES_MAX: usize = 16 * 1024;
/// Time a client has to send a request's body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection stays open (a client that stops reading an answer, or keeps a
/// connection idle, is cut off then).
const CONNECTION_MAX_TIME: Duration = Duration::from_secs(300);
/// How often the server looks at whether the app closed its queue.
const IDLE_LOOK: Duration = Duration::from_millis(100);
/// How long a stop waits for answers in progress before it lets go of them.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// The running server: its thread, and the way to stop it.
pub(super) struct Running {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Starts serving `listener` on a thread of its own.
    pub(super) fn start(
        listener: std::net::TcpListener,
        app: Arc<App>,
    ) -> std::io::Result<Running> {
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("leaseq-dashboard")
            .max_blocking_threads(ANSWERING_MAX)
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("leaseq-dashboard".into())
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
    pub(super) fn stop(&mut self) {
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
    app: Arc<App>,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "leaseq: the dashboard cannot listen");
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
            _ = look.tick() => app.target.release_if_closed(),
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: a pause, not an end.
                        tracing::debug!(error = %e, "leaseq: dashboard accept failed");
                        tokio::time::sleep(IDLE_LOOK).await;
                        continue;
                    }
                };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::debug!("leaseq: dashboard connection refused: too many open");
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
    app: Arc<App>,
    answering: Arc<Semaphore>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_BYTES_MAX as u64) {
        return Ok(response(too_large()));
    }
    let body = match tokio::time::timeout(
        BODY_TIMEOUT,
        Limited::new(body, BODY_BYTES_MAX).collect(),
    )
    .await
    {
        Ok(Ok(collected)) => collected.to_bytes().to_vec(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Ok(response(too_large()));
        }
        Ok(Err(_)) => {
            return Ok(response(Reply::text(
                400,
                "400: the body could not be read",
            )));
        }
        Err(_) => return Ok(response(Reply::text(408, "408: the body came too slowly"))),
    };
    let (path, query) = match parts.uri.path_and_query() {
        Some(pq) => (pq.path().to_string(), pq.query().unwrap_or("").to_string()),
        None => ("/".to_string(), String::new()),
    };
    let asked = Asked {
        method: parts.method.as_str().to_string(),
        path,
        query: form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect(),
        headers: parts
            .headers
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
            })
            .collect(),
        body,
    };
    let head = parts.method == hyper::Method::HEAD;
    let Ok(_turn) = answering.acquire_owned().await else {
        return Ok(response(Reply::text(503, "503: the dashboard is stopping")));
    };
    let reply = match tokio::task::spawn_blocking(move || app.answer(&asked)).await {
        Ok(reply) => reply,
        Err(e) => {
            tracing::warn!(error = %e, "leaseq: a dashboard answer failed");
            Reply::text(
                500,
                "500: the dashboard failed to answer (see the app's log)",
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

fn too_large() -> Reply {
    let mut reply = Reply::text(
        413,
        format!("413: a body is at most {BODY_BYTES_MAX} bytes"),
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
                tracing::warn!(
                    header = name,
                    "leaseq: a dashboard header HTTP cannot carry"
                );
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
