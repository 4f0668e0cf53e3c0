//! `leaseq watch`: a live view of a queue file, refreshed every interval: per queue, counts
//! per state, enqueue, completion and retry rates (from the file's per-minute metrics), the
//! age of the oldest ready job, and the latest dead letters. In place on a terminal; plain or
//! JSON lines when piped. Each refresh opens a `Reader` and drops it, so the file is held for
//! a moment only and an app may open it between refreshes; only the first verifies the file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::args::WatchArgs;
use crate::duration::format_ms;
use crate::fail::{CliResult, Fail, one_line};
use crate::files;
use crate::output::{Out, short, utc};
use crate::source::Source;

const MINUTE_MS: u64 = 60_000;
/// The latest dead letters read per queue and refresh (the newest first; piped, each one not
/// said before is said), and how many the screen shows.
const DEAD_LOOKED_AT: usize = 1000;
const DEAD_SHOWN: usize = 5;

/// One queue at one refresh.
#[derive(Serialize, Clone)]
struct QueueView {
    at_ms: u64,
    queue: Option<String>,
    ready: u64,
    scheduled: u64,
    leased: u64,
    dead: u64,
    completed: u64,
    cancelled: u64,
    paused: bool,
    /// Whether the file was read live (else from a copy of a file no process has open,
    /// repaired in memory: it does not change until an app opens it).
    live: bool,
    /// Per second since the previous refresh (null at the first).
    enqueued_per_s: Option<f64>,
    completed_per_s: Option<f64>,
    retried_per_s: Option<f64>,
    /// How long the longest-waiting of the first 1,000 ready jobs in line has been ready, in
    /// ms.
    oldest_ready_ms: Option<u64>,
}

/// A dead letter shown.
#[derive(Serialize, Clone)]
struct DeadView {
    queue: Option<String>,
    id: u64,
    died_ms: u64,
    last_error: Option<String>,
}

/// What the previous refresh read of one queue's metrics: the minute it was in and the counts
/// of that minute so far (enqueued, completed, retried).
#[derive(Clone, Copy)]
struct Mark {
    minute: u64,
    counts: [u64; 3],
    at: Instant,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `leaseq watch`.
pub fn watch(a: &WatchArgs) -> CliResult {
    if a.interval < Duration::from_millis(100) {
        return Err(Fail::error("--interval: at least 100ms"));
    }
    if a.count == Some(0) {
        return Err(Fail::error("--count: at least 1"));
    }
    let terminal = std::io::stdout().is_terminal() && !a.json;
    let bar = if terminal {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
        bar.set_style(
            ProgressStyle::with_template("{msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(bar)
    } else {
        None
    };
    let mut out = Out::new();
    let mut marks: BTreeMap<Option<String>, Mark> = BTreeMap::new();
    // Dead letters said (piped), by queue, id and time of death (a job may die again).
    let mut dead_said: BTreeSet<(Option<String>, u64, u64)> = BTreeSet::new();
    // A snapshot's file as it was (length, modification time) and what it showed: read again
    // only once the file changed, so a repair is not redone (holding the file) every refresh.
    let mut frozen: Option<(Frozen, Vec<QueueView>, Vec<DeadView>)> = None;
    let mut refresh = 0u64;
    let mut last_problem: Option<String> = None;
    loop {
        let started = Instant::now();
        let read = match &frozen {
            Some((was, views, dead)) if Frozen::of(&a.file).as_ref() == Some(was) => {
                let now = now_ms();
                let views = views
                    .iter()
                    .map(|v| QueueView {
                        at_ms: now,
                        enqueued_per_s: Some(0.0),
                        completed_per_s: Some(0.0),
                        retried_per_s: Some(0.0),
                        oldest_ready_ms: v.oldest_ready_ms.map(|ms| ms + (now - v.at_ms)),
                        ..v.clone()
                    })
                    .collect();
                Ok((views, dead.clone()))
            }
            _ => {
                let stat = Frozen::of(&a.file);
                let read = read_once(a, &mut marks, refresh == 0);
                frozen = match (&read, stat) {
                    (Ok((views, dead)), Some(stat)) if views.iter().any(|v| !v.live) => {
                        Some((stat, views.clone(), dead.clone()))
                    }
                    _ => None,
                };
                read
            }
        };
        match read {
            Ok((views, dead)) => {
                last_problem = None;
                if let Some(bar) = &bar {
                    bar.set_message(screen(a, &views, &dead));
                } else if a.json {
                    for v in &views {
                        out.json(v)?;
                    }
                    for d in dead
                        .iter()
                        .filter(|d| dead_said.insert((d.queue.clone(), d.id, d.died_ms)))
                    {
                        out.json(&DeadLine {
                            dead_letter: d.clone(),
                        })?;
                    }
                } else {
                    for v in &views {
                        out.line(plain_line(v))?;
                    }
                    for d in dead
                        .iter()
                        .filter(|d| dead_said.insert((d.queue.clone(), d.id, d.died_ms)))
                    {
                        out.line(dead_line(d))?;
                    }
                }
                // Bounded: only the dead letters still among the latest read are kept (one
                // that fell out of them never comes back).
                let latest: BTreeSet<(Option<String>, u64, u64)> = dead
                    .iter()
                    .map(|d| (d.queue.clone(), d.id, d.died_ms))
                    .collect();
                dead_said.retain(|k| latest.contains(k));
                out.flush()?;
            }
            // The first refresh says what is wrong and stops; later ones (the app restarted,
            // a snapshot's moment) say it and keep watching.
            Err(f) if refresh == 0 => return Err(f),
            Err(f) => {
                if last_problem.as_deref() != Some(f.message.as_str()) {
                    match &bar {
                        Some(bar) => bar.set_message(format!("leaseq watch: {}", f.message)),
                        None => eprintln!("leaseq: {}", one_line(&f.message)),
                    }
                    last_problem = Some(f.message.clone());
                }
            }
        }
        refresh += 1;
        if a.count.is_some_and(|n| refresh >= n) {
            if let Some(bar) = &bar {
                bar.abandon();
            }
            return Ok(());
        }
        std::thread::sleep(a.interval.saturating_sub(started.elapsed()));
    }
}

/// A file's length and modification time.
#[derive(PartialEq, Eq)]
struct Frozen(u64, Option<SystemTime>);

impl Frozen {
    fn of(path: &std::path::Path) -> Option<Frozen> {
        let m = std::fs::metadata(path).ok()?;
        Some(Frozen(m.len(), m.modified().ok()))
    }
}

#[derive(Serialize)]
struct DeadLine {
    dead_letter: DeadView,
}

/// One refresh: the file opened read-only (or the channel of the app holding it), read
/// and let go of.
fn read_once(
    a: &WatchArgs,
    marks: &mut BTreeMap<Option<String>, Mark>,
    first: bool,
) -> CliResult<(Vec<QueueView>, Vec<DeadView>)> {
    let source = Source::open_verified(&a.file, first)?;
    let live = source.is_live();
    let now = now_ms();
    let minute = now / MINUTE_MS;
    let mut views = Vec::new();
    let mut dead = Vec::new();
    for name in source.queues(a.queue.queue.as_deref())? {
        let mark = marks.get(&name).copied();
        let since_minute = mark.map_or(minute, |m| m.minute.min(minute));
        let o = source.overview(
            name.as_deref(),
            now,
            since_minute * MINUTE_MS,
            DEAD_LOOKED_AT,
        )?;
        let (rates, mark) = rates(&o["minutes"], mark, minute);
        marks.insert(name.clone(), mark);
        dead.extend(
            o["latest_dead"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|j| DeadView {
                    queue: name.clone(),
                    id: j["id"].as_u64().unwrap_or(0),
                    died_ms: j["died_ms"].as_u64().unwrap_or(0),
                    last_error: j["last_error"].as_str().map(str::to_string),
                }),
        );
        let s = &o["stats"];
        let n = |field: &str| s[field].as_u64().unwrap_or(0);
        views.push(QueueView {
            at_ms: now,
            queue: name,
            ready: n("ready"),
            scheduled: n("scheduled"),
            leased: n("leased"),
            dead: n("dead"),
            completed: n("completed"),
            cancelled: n("cancelled"),
            paused: s["paused"] == true,
            live,
            enqueued_per_s: rates.map(|r| r[0]),
            completed_per_s: rates.map(|r| r[1]),
            retried_per_s: rates.map(|r| r[2]),
            oldest_ready_ms: o["oldest_ready_ms"].as_u64(),
        });
    }
    // Oldest first, as they died.
    dead.sort_by_key(|d| (d.died_ms, d.id));
    Ok((views, dead))
}

/// The rates since the previous refresh's mark (none at the first), from the `minutes` read
/// from the mark's minute on, and this refresh's mark (in `minute`). The counts of the mark's
/// minute and every later one, less what the mark had counted of its minute, are what
/// happened in between.
fn rates(minutes: &serde_json::Value, mark: Option<Mark>, minute: u64) -> (Option<[f64; 3]>, Mark) {
    let mut total = [0u64; 3];
    let mut this_minute = [0u64; 3];
    for r in minutes.as_array().into_iter().flatten() {
        let c = ["enqueued", "completed", "retried"].map(|k| r[k].as_u64().unwrap_or(0));
        for i in 0..3 {
            total[i] += c[i];
        }
        if r["minute_ms"].as_u64().unwrap_or(0) / MINUTE_MS == minute {
            this_minute = c;
        }
    }
    let at = Instant::now();
    let rates = mark.map(|m| {
        let secs = at.duration_since(m.at).as_secs_f64().max(1e-3);
        let mut r = [0.0; 3];
        for i in 0..3 {
            r[i] = total[i].saturating_sub(m.counts[i]) as f64 / secs;
        }
        r
    });
    (
        rates,
        Mark {
            minute,
            counts: this_minute,
            at,
        },
    )
}

fn rate_text(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r >= 100.0 => format!("{r:.0}"),
        Some(r) => format!("{r:.1}"),
    }
}

/// An age for people: `850ms`, `4.2s`, `3m05s`, `2h10m`, `3d04h`.
fn age_text(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{:02}h", s / 86_400, s / 3600 % 24),
    }
}

/// The in-place screen.
fn screen(a: &WatchArgs, views: &[QueueView], dead: &[DeadView]) -> String {
    let mut s = format!(
        "leaseq watch {}  every {}  {}\n\n",
        a.file.display(),
        format_ms(a.interval.as_millis() as u64),
        utc(now_ms())
    );
    let header = [
        "QUEUE",
        "READY",
        "SCHEDULED",
        "LEASED",
        "DEAD",
        "COMPLETED",
        "CANCELLED",
        "PAUSED",
        "ENQ/S",
        "DONE/S",
        "RETRY/S",
        "OLDEST_READY",
    ];
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.queue
                    .clone()
                    .unwrap_or_else(|| files::DEFAULT_QUEUE.into()),
                v.ready.to_string(),
                v.scheduled.to_string(),
                v.leased.to_string(),
                v.dead.to_string(),
                v.completed.to_string(),
                v.cancelled.to_string(),
                if v.paused { "yes" } else { "no" }.into(),
                rate_text(v.enqueued_per_s),
                rate_text(v.completed_per_s),
                rate_text(v.retried_per_s),
                age_text(v.oldest_ready_ms),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    s.push_str(&line(header.iter().map(|h| h.to_string()).collect()));
    for r in rows {
        s.push('\n');
        s.push_str(&line(r));
    }
    if views.iter().any(|v| !v.live) {
        s.push_str(
            "\n\nnot live: a copy of a file no process has open (left by a crash, or older), \
             repaired in memory; read again once the file changes",
        );
    }
    s.push_str("\n\nlatest dead letters:");
    if dead.is_empty() {
        s.push_str(" none");
    }
    for d in &dead[dead.len().saturating_sub(DEAD_SHOWN)..] {
        s.push('\n');
        s.push_str(&dead_line(d));
    }
    s
}

/// A queue's line when piped.
fn plain_line(v: &QueueView) -> String {
    format!(
        "{} queue={} ready={} scheduled={} leased={} dead={} completed={} cancelled={} paused={} enq/s={} done/s={} retry/s={} oldest_ready={}{}",
        utc(v.at_ms),
        v.queue.as_deref().unwrap_or(files::DEFAULT_QUEUE),
        v.ready,
        v.scheduled,
        v.leased,
        v.dead,
        v.completed,
        v.cancelled,
        if v.paused { "yes" } else { "no" },
        rate_text(v.enqueued_per_s),
        rate_text(v.completed_per_s),
        rate_text(v.retried_per_s),
        age_text(v.oldest_ready_ms),
        if v.live { "" } else { " not_live" },
    )
}

fn dead_line(d: &DeadView) -> String {
    format!(
        "dead {} queue={} died={} error={}",
        d.id,
        d.queue.as_deref().unwrap_or(files::DEFAULT_QUEUE),
        utc(d.died_ms),
        short(&one_line(d.last_error.as_deref().unwrap_or("-")), 120)
    )
}
