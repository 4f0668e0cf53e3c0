//! Where `stats`, `ls`, `show`, `queues`, `schedules` and `check` read: the file itself (`leaseq::Reader`), or,
//! when an app holds the file so that it cannot be read (no live reads), that app's control
//! channel (`leaseq::control::Client`), which answers in the same JSON shapes. Both are
//! turned into the same JSON values, and the commands print those.

use std::path::{Path, PathBuf};

use leaseq::control::Client;
use leaseq::json::JobView;
use leaseq::{JobCursor, JobId, JobState, Reader};
use serde_json::{Value, json};

use crate::fail::{CliResult, Fail};
use crate::files::{self, DEFAULT_QUEUE};

/// A file to read, or the channel of the app holding it.
pub enum Source {
    /// The file, read-only.
    Local(Reader),
    /// The app's control channel.
    Remote { client: Client, path: PathBuf },
}

impl Source {
    /// Opens `path` for reading ([`files::open_reader`]); when another process holds it,
    /// that app's control channel if it opened one that answers.
    pub fn open(path: &Path) -> CliResult<Source> {
        Source::open_verified(path, true)
    }

    /// [`Source::open`], verifying the file (redb's integrity check) only if `verify`:
    /// `watch` verifies at its first refresh only.
    pub fn open_verified(path: &Path, verify: bool) -> CliResult<Source> {
        let opened = if verify {
            files::open_reader(path)
        } else {
            files::open_reader_quietly(path, false)
        };
        match opened {
            Ok(reader) => Ok(Source::Local(reader)),
            Err(f) if f.held => {
                let client = Client::for_file(path).ok().flatten();
                match client {
                    Some(client) if client.get("").is_ok() => {
                        tracing::info!(
                            pid = client.pid(),
                            "reading through the app's control channel"
                        );
                        Ok(Source::Remote {
                            client,
                            path: path.to_path_buf(),
                        })
                    }
                    _ => Err(f),
                }
            }
            Err(f) => Err(f),
        }
    }

    fn path(&self) -> &Path {
        match self {
            Source::Local(r) => r.path(),
            Source::Remote { path, .. } => path,
        }
    }

    fn fail(&self, e: leaseq::Error) -> Fail {
        Fail::leaseq(self.path(), e)
    }

    fn get(&self, client: &Client, target: &str) -> CliResult<Value> {
        client.get(target).map_err(|e| self.fail(e))
    }

    /// The queues `--queue` selects, as the API names them: `None` for the default queue.
    /// Every queue without a name (the default one first, then the named ones by name).
    pub fn queues(&self, selector: Option<&str>) -> CliResult<Vec<Option<String>>> {
        if let Some(name) = selector {
            if name == DEFAULT_QUEUE {
                return Ok(vec![None]);
            }
            // Made sure of: a missing queue is exit 1 before anything is printed.
            match self {
                Source::Local(r) => {
                    files::existing(r, name)?;
                }
                Source::Remote { client, .. } => {
                    self.get(client, &format!("stats?queue={}", encode(name)))?;
                }
            }
            return Ok(vec![Some(name.to_string())]);
        }
        let names = self.queue_names()?;
        let mut out = vec![None];
        out.extend(names.into_iter().map(Some));
        Ok(out)
    }

    /// The named queues of the file, by name.
    pub fn queue_names(&self) -> CliResult<Vec<String>> {
        match self {
            Source::Local(r) => r.queue_names().map_err(|e| self.fail(e)),
            Source::Remote { client, .. } => {
                let info = self.get(client, "")?;
                Ok(info["queues"]
                    .as_array()
                    .map(|q| {
                        q.iter()
                            .filter_map(|n| n.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default())
            }
        }
    }

    fn reader(&self, r: &Reader, queue: Option<&str>) -> CliResult<Reader> {
        match queue {
            None => Ok(r.default_queue()),
            Some(name) => r.existing(name).map_err(|e| self.fail(e)),
        }
    }

    /// Whether the file is read as it is now: a live reader, or the app's channel (else a
    /// copy of a file left by a crash, repaired in memory).
    pub fn is_live(&self) -> bool {
        match self {
            Source::Local(r) => r.is_live(),
            Source::Remote { .. } => true,
        }
    }

    /// One queue at a glance ([`leaseq::json::overview`]) at `now_ms`: its counts, longest
    /// wait, minutes from `since_ms`, and `dead` latest dead letters.
    pub fn overview(
        &self,
        queue: Option<&str>,
        now_ms: u64,
        since_ms: u64,
        dead: usize,
    ) -> CliResult<Value> {
        match self {
            Source::Local(r) => {
                let q = self.reader(r, queue)?;
                leaseq::json::overview(&q, now_ms, since_ms, dead).map_err(|e| self.fail(e))
            }
            Source::Remote { client, .. } => {
                let answer = self.get(
                    client,
                    &format!(
                        "overview?queue={}&since_ms={since_ms}&dead={dead}",
                        encode(queue.unwrap_or(DEFAULT_QUEUE))
                    ),
                )?;
                Ok(answer["queues"][0].clone())
            }
        }
    }

    /// One queue's schedules, by name, as `schedules --json` writes them.
    pub fn schedules(&self, queue: Option<&str>) -> CliResult<Vec<Value>> {
        match self {
            Source::Local(r) => {
                let q = self.reader(r, queue)?;
                let list = q.schedules().map_err(|e| self.fail(e))?;
                Ok(list
                    .iter()
                    .map(|s| json!(leaseq::json::ScheduleView::new(q.name(), s)))
                    .collect())
            }
            Source::Remote { client, .. } => {
                let answer = self.get(
                    client,
                    &format!("schedules?queue={}", encode(queue.unwrap_or(DEFAULT_QUEUE))),
                )?;
                Ok(answer["schedules"].as_array().cloned().unwrap_or_default())
            }
        }
    }

    /// The file's check, as `check --json` writes it: `{"ok":..,"violations":[..]}`. A
    /// damaged file's `Corrupted` is one violation.
    pub fn check(&self) -> CliResult<Value> {
        match self {
            Source::Local(r) => match r.check() {
                Ok(v) => Ok(leaseq::json::check(&v)),
                Err(e @ leaseq::Error::Corrupted { .. }) => {
                    Ok(leaseq::json::check(&[leaseq::Violation {
                        job_id: None,
                        detail: e.to_string(),
                    }]))
                }
                Err(e) => Err(self.fail(e)),
            },
            Source::Remote { client, .. } => self.get(client, "check"),
        }
    }

    /// One queue's counts, as `stats --json` writes them.
    pub fn stats(&self, queue: Option<&str>) -> CliResult<Value> {
        match self {
            Source::Local(r) => {
                let q = self.reader(r, queue)?;
                leaseq::json::stats(&q).map_err(|e| self.fail(e))
            }
            Source::Remote { client, .. } => {
                let answer = self.get(
                    client,
                    &format!("stats?queue={}", encode(queue.unwrap_or(DEFAULT_QUEUE))),
                )?;
                Ok(answer["queues"][0].clone())
            }
        }
    }

    /// A page of `limit` jobs of `queue` in `state` after `after` (a cursor's text), as
    /// `ls --json` writes them, and the cursor of the next page.
    pub fn jobs(
        &self,
        queue: Option<&str>,
        state: JobState,
        after: Option<&str>,
        limit: usize,
    ) -> CliResult<(Vec<Value>, Option<String>)> {
        match self {
            Source::Local(r) => {
                let q = self.reader(r, queue)?;
                let after = after
                    .map(JobCursor::parse)
                    .transpose()
                    .map_err(|e| self.fail(e))?;
                let page = q.jobs(state, after, limit).map_err(|e| self.fail(e))?;
                let jobs = page
                    .jobs
                    .iter()
                    .map(|info| to_value(JobView::new(q.name(), info, None)))
                    .collect();
                Ok((jobs, page.next.map(|c| c.to_text())))
            }
            Source::Remote { client, .. } => {
                // Pages of 100 through the channel: an answer stays far below the client's
                // bound whatever the jobs' errors and keys hold.
                let mut target = format!(
                    "jobs?state={state}&limit={}&queue={}",
                    limit.min(100),
                    encode(queue.unwrap_or(DEFAULT_QUEUE))
                );
                if let Some(a) = after {
                    target.push_str(&format!("&after={}", encode(a)));
                }
                let page = self.get(client, &target)?;
                let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
                Ok((jobs, page["next"].as_str().map(str::to_string)))
            }
        }
    }

    /// Job `id` in the queues `selector` covers, as `show --json` writes it (with its
    /// payload), and its payload's bytes; `None` when no such job.
    pub fn job(&self, selector: Option<&str>, id: u64) -> CliResult<Option<(Value, Vec<u8>)>> {
        match self {
            Source::Local(r) => {
                let Some((q, info)) = files::find_job(r, selector, id)? else {
                    return Ok(None);
                };
                let Some(payload) = q.payload(info.id).map_err(|e| self.fail(e))? else {
                    return Ok(None);
                };
                let view = to_value(JobView::new(q.name(), &info, Some(&payload)));
                Ok(Some((view, payload)))
            }
            Source::Remote { client, .. } => {
                let mut target = format!("jobs/{id}");
                if let Some(q) = selector {
                    target.push_str(&format!("?queue={}", encode(q)));
                }
                let mut view = match client.get(&target) {
                    Ok(view) => view,
                    Err(leaseq::Error::JobNotFound { .. }) => return Ok(None),
                    Err(e) => return Err(self.fail(e)),
                };
                let payload = match client.payload(JobId(id), selector) {
                    Ok(p) => p,
                    Err(leaseq::Error::JobNotFound { .. }) => return Ok(None),
                    Err(e) => return Err(self.fail(e)),
                };
                let (text, hex) = leaseq::json::text_or_hex(Some(&payload));
                if let Some(t) = text {
                    view["payload_utf8"] = json!(t);
                }
                if let Some(h) = hex {
                    view["payload_hex"] = json!(h);
                }
                Ok(Some((view, payload)))
            }
        }
    }
}

fn to_value(view: JobView) -> Value {
    serde_json::to_value(view).unwrap_or(Value::Null)
}

/// A query parameter's value, percent-encoded.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
