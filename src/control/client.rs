//! The other side of a control channel: a blocking client that finds the channel through the
//! control file beside a queue file and sends it actions and reads.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::action::Action;
use super::api::ROOT;
use super::file;
use crate::{Error, JobId, JobState, Result};

/// Time to connect to a channel.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a request may take, its answer included (a purge of many jobs commits in batches).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes of an answer read at most: a page of 1000 jobs with long errors is under it, and
/// so is the largest payload (`PAYLOAD_BYTES_MAX_CAP`).
const ANSWER_BYTES_MAX: usize = crate::PAYLOAD_BYTES_MAX_CAP + (1 << 20);

/// A client of a running app's control channel, found through the control file beside the
/// queue file ([`Client::for_file`]). Each call is one HTTP request on a connection of its
/// own, made on the calling thread (blocking it; from async code, call it on a blocking
/// thread). The app carries the action out with its own handle, in its own commit.
pub struct Client {
    file: PathBuf,
    addr: SocketAddr,
    token: String,
    pid: u32,
    timeout: Duration,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// The client of the channel of the queue file at `path`; `None` when no control file
    /// is beside it (no app with a channel has the file open). Connects to nothing yet: an
    /// app that stopped without removing its control file (killed) is found at the first
    /// call.
    ///
    /// # Errors
    /// `Io` if the control file cannot be read (`PermissionDenied`: this user may not act
    /// on the app, which admits the users who may write the queue file) or is not a control
    /// file of this API version (`InvalidData`), or no runtime can be made.
    pub fn for_file(path: impl AsRef<Path>) -> Result<Option<Client>> {
        let path = path.as_ref();
        let Some(found) = file::read(path)? else {
            return Ok(None);
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Some(Client {
            file: path.to_path_buf(),
            addr: found.addr,
            token: found.token,
            pid: found.pid,
            timeout: REQUEST_TIMEOUT,
            runtime,
        }))
    }

    /// The longest a request may take, its answer included (default 300 s: a purge of many
    /// jobs commits in batches); connecting takes at most 5 s or this, the shorter.
    pub fn timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The address the channel listens at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The id of the app's process, as its control file says.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Has the app carry `action` out, in its own commit, and returns the action's answer
    /// (its shape is in the variant's docs).
    ///
    /// # Errors
    /// The action's errors as the app met them: `JobNotFound`, `QueueNotFound`,
    /// `ScheduleNotFound`, `ScheduleExists`, `InvalidState`, `KeyHeld`, `Closed` (the app is
    /// shutting down) and `Busy` as themselves, any other as [`Error::Remote`] with its kind
    /// and message. [`Client::get`]'s errors of the connection.
    pub fn act(&self, action: &Action) -> Result<Value> {
        let (path, body) = action.to_request();
        self.request("POST", &format!("{ROOT}/{path}"), body)
    }

    /// A read of the API: `GET` of `path` under `/api/v1` (`""` for the file and its queues,
    /// `"stats"`, `"stats?queue=mail"`, `"jobs?state=dead"`, `"jobs/1025"`), its JSON answer
    /// (the module's table gives each route's shape).
    ///
    /// # Errors
    /// - `Io` (`ConnectionRefused`) when no app answers at the control file's address (an
    ///   app that was killed leaves its control file behind), `TimedOut` when it does not
    ///   answer in time;
    /// - [`Error::Remote`] with status 401 if the app does not take the control file's token
    ///   (another app listens there now);
    /// - the read's errors as for [`Client::act`].
    pub fn get(&self, path: &str) -> Result<Value> {
        let path = path.trim_start_matches('/');
        let target = if path.is_empty() {
            ROOT.to_string()
        } else {
            format!("{ROOT}/{path}")
        };
        self.request("GET", &target, Vec::new())
    }

    /// The payload of job `id` (found in the queue `queue` names, `"(default)"` for the
    /// default queue, or in any queue with `None`), as its bytes: `GET
    /// /api/v1/jobs/ID/payload`.
    ///
    /// # Errors
    /// `JobNotFound`, `QueueNotFound`; [`Client::get`]'s errors of the connection.
    pub fn payload(&self, id: JobId, queue: Option<&str>) -> Result<Vec<u8>> {
        let mut target = format!("{ROOT}/jobs/{id}/payload");
        if let Some(q) = queue {
            target.push_str("?queue=");
            target.extend(form_urlencoded::byte_serialize(q.as_bytes()));
        }
        let (status, body) = self.exchange("GET", &target, Vec::new())?;
        if status == 200 {
            return Ok(body);
        }
        Err(self.answer_error(status, &body))
    }

    fn request(&self, method: &str, target: &str, body: Vec<u8>) -> Result<Value> {
        let (status, body) = self.exchange(method, target, body)?;
        if status != 200 {
            return Err(self.answer_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(|_| self.not_json(status))
    }

    /// The error an answer other than 200 stands for. A refusal of the HTTP layer that is
    /// not JSON (`431`: a request head too large) is `Remote` with its status.
    fn answer_error(&self, status: u16, body: &[u8]) -> Error {
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => error_of(status, &value),
            Err(_) if matches!(status, 400 | 408 | 413 | 431 | 500 | 503) => Error::Remote {
                status,
                kind: format!("http_{status}"),
                message: format!(
                    "the control channel refused the request ({status}: {})",
                    String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
                ),
            },
            Err(_) => self.not_json(status),
        }
    }

    fn not_json(&self, status: u16) -> Error {
        Error::Remote {
            status,
            kind: "not_json".into(),
            message: format!(
                "the control channel at {} answered {status} with something that is not \
                 JSON: another program listens there",
                self.addr
            ),
        }
    }

    /// One request and its answer's status and body.
    fn exchange(&self, method: &str, target: &str, body: Vec<u8>) -> Result<(u16, Vec<u8>)> {
        let unreachable = |e: &dyn std::fmt::Display, kind: std::io::ErrorKind| {
            Error::Io(std::io::Error::new(
                kind,
                format!(
                    "no app answers at the control channel of {} ({}, process {}): {e}. The \
                     app stopped without removing {} (it was killed), or is starting",
                    self.file.display(),
                    self.addr,
                    self.pid,
                    file::path_of(&self.file).display()
                ),
            ))
        };
        let sent = self.runtime.block_on(async {
            let stream = match tokio::time::timeout(
                CONNECT_TIMEOUT.min(self.timeout),
                tokio::net::TcpStream::connect(self.addr),
            )
            .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return Err(unreachable(&e, e.kind())),
                Err(_) => {
                    return Err(unreachable(
                        &"connecting timed out",
                        std::io::ErrorKind::TimedOut,
                    ));
                }
            };
            let exchange = async {
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(connection);
                let request = Request::builder()
                    .method(method)
                    .uri(target)
                    .header(hyper::header::HOST, self.addr.to_string())
                    .header(
                        hyper::header::AUTHORIZATION,
                        format!("Bearer {}", self.token),
                    )
                    .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
                    .body(Full::new(Bytes::from(body)))
                    .map_err(std::io::Error::other)?;
                let answer = sender.send_request(request).await?;
                let status = answer.status().as_u16();
                let body = Limited::new(answer.into_body(), ANSWER_BYTES_MAX)
                    .collect()
                    .await
                    .map_err(std::io::Error::other)?
                    .to_bytes();
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
            };
            match tokio::time::timeout(self.timeout, exchange).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(e)) => Err(unreachable(&e, std::io::ErrorKind::ConnectionAborted)),
                Err(_) => Err(unreachable(
                    &"no answer in time",
                    std::io::ErrorKind::TimedOut,
                )),
            }
        });
        let (status, body) = sent?;
        Ok((status, body.to_vec()))
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("file", &self.file)
            .field("addr", &self.addr)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// The `expected` texts of [`Error::InvalidState`] (the states a call needs), so an answer's
/// text maps back to the variant.
const EXPECTED: &[&str] = &[
    "Dead",
    "Scheduled, Dead, Completed or Cancelled",
    // `Queue::retry`'s before it took scheduled jobs: an app built before.
    "Dead, Completed or Cancelled",
    "Scheduled, Ready or Dead",
    "Scheduled, Ready, Leased or Dead",
    "Ready or Scheduled",
    "Scheduled",
    "Ready, Scheduled or Dead",
];

/// The [`Error`] an API error answer stands for.
fn error_of(status: u16, value: &Value) -> Error {
    let e = &value["error"];
    let kind = e["kind"].as_str().unwrap_or("failed");
    let message = e["message"].as_str().unwrap_or("").to_string();
    let text = |k: &str| e[k].as_str().map(str::to_string);
    let id = |k: &str| e[k].as_u64().map(JobId);
    let typed = match kind {
        "job_not_found" => id("job_id").map(|job_id| Error::JobNotFound { job_id }),
        "queue_not_found" => text("name").map(|name| Error::QueueNotFound { name }),
        "schedule_not_found" => text("name").map(|name| Error::ScheduleNotFound { name }),
        "schedule_exists" => text("name").map(|name| Error::ScheduleExists { name }),
        "key_held" => id("job_id")
            .zip(id("holder"))
            .map(|(job_id, holder)| Error::KeyHeld { job_id, holder }),
        "invalid_state" => {
            let expected = e["expected"]
                .as_str()
                .and_then(|x| EXPECTED.iter().find(|known| **known == x).copied());
            let actual = e["actual"].as_str().and_then(JobState::from_name);
            match (id("job_id"), actual, expected) {
                (Some(job_id), Some(actual), Some(expected)) => Some(Error::InvalidState {
                    job_id,
                    actual,
                    expected,
                }),
                _ => None,
            }
        }
        "closed" => Some(Error::Closed),
        "busy" => text("detail").map(|detail| Error::Busy { detail }),
        _ => None,
    };
    typed.unwrap_or(Error::Remote {
        status,
        kind: kind.to_string(),
        message,
    })
}
