//! The pages, rendered on the server as plain HTML (every text from the file escaped).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use super::http::{App, status_of};
use super::invalid;
use super::view::queue_of;
use crate::control::DEFAULT_QUEUE;
use crate::control::server::Asked;
use crate::{
    Error, JobCursor, JobId, JobInfo, JobState, MinuteCounts, Progress, Reader, Result, Stats,
    Timing,
};

/// Jobs per page of a list.
pub(super) const PAGE_JOBS: usize = 50;
/// Jobs a search by key reads at most per page asked (it offers to read on from there).
pub(super) const SEARCH_SCAN_MAX: usize = 10_000;
/// Bytes of a payload shown at most on a job's page (the download has it whole).
pub(super) const PREVIEW_BYTES: usize = 64 * 1024;
/// Minutes of the rates chart: the 24 hours the file keeps (`METRICS_MINUTES_KEPT`).
const CHART_MINUTES: u64 = 24 * 60;
/// Minutes per point of the 24-hour chart.
const CHART_BUCKET_MINUTES: u64 = 10;
/// Ready jobs in line looked at for the longest wait (as `leaseq watch`).
const OLDEST_READY_SCAN: usize = 1000;
/// Dead letters an overview names per queue, the most recent first.
const LATEST_DEAD: usize = 5;
/// Bytes of a search text kept.
const SEARCH_BYTES_MAX: usize = 256;

/// A rendered page.
pub(super) struct Page {
    pub(super) html: String,
}

/// HTML-escapes `text`.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// At most `max` characters of `text`, with `…` when cut.
pub(super) fn short(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// Bytes read off the file as text for people: UTF-8 (invalid sequences replaced).
fn bytes_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Unix ms as `2026-12-03 08:15:02 UTC`.
fn utc(ms: u64) -> String {
    match chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)) {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        None => format!("{ms} ms"),
    }
}

/// A span of ms for people: `850ms`, `12s`, `4m 10s`, `3h 5m`, `2d 4h`.
fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        _ if ms < 1000 => format!("{ms}ms"),
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A time with how far it is from now: `<time title="…">3m 2s ago</time>`.
fn when(ms: u64, now: u64) -> String {
    let rel = if ms <= now {
        format!("{} ago", span(now - ms))
    } else {
        format!("in {}", span(ms - now))
    };
    format!("<time title=\"{}\">{}</time>", utc(ms), rel)
}

/// The display name of a queue (`None`: the default queue).
fn queue_label(q: Option<&str>) -> String {
    match q {
        // As the tool names it: a queue may be named "default".
        None => "(default)".into(),
        Some(name) => esc(&short(name, 80)),
    }
}

/// A link's query string: the queue first, then `extra`.
fn link(path: &str, q: Option<&str>, extra: &[(&str, &str)]) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    if let Some(q) = q {
        out.append_pair("q", q);
    }
    for (k, v) in extra {
        out.append_pair(k, v);
    }
    let query = out.finish();
    if query.is_empty() {
        path.to_string()
    } else {
        esc(&format!("{path}?{query}"))
    }
}

/// A job id from the request's `id`.
pub(super) fn job_id(asked: &Asked) -> Result<JobId> {
    asked
        .param("id")
        .and_then(|id| id.parse().ok())
        .map(JobId)
        .ok_or_else(|| invalid("id", "a job id (a decimal number)"))
}

/// The whole page around `body`.
fn layout(app: &App, asked: Option<&Asked>, title: &str, live: bool, body: &str) -> String {
    let file = app
        .target
        .path()
        .map(|p| esc(&p.display().to_string()))
        .unwrap_or_else(|| "(a file without a path)".into());
    // A notice is shown after the dashboard's own redirect (a same-origin navigation), not
    // when another page of the same host links here with a text of its choosing.
    let notice = asked
        .filter(|a| {
            a.header("sec-fetch-site")
                .is_none_or(|s| s == "same-origin")
        })
        .and_then(|a| a.param("notice"))
        .map(|n| {
            format!(
                "<p class=\"notice\" role=\"status\">{}</p>",
                esc(&short(n, 200))
            )
        })
        .unwrap_or_default();
    let mode = if app.read_only {
        "<span class=\"badge\">read-only</span>"
    } else {
        ""
    };
    let live_attr = if live { " data-live" } else { "" };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · leaseq</title>\
         <link rel=\"stylesheet\" href=\"/static/dashboard.css\">\
         <script src=\"/static/dashboard.js\" defer></script></head><body>\
         <header><a class=\"home\" href=\"/\">leaseq</a> <span class=\"file\">{file}</span> \
         {mode}</header>{notice}<p id=\"stale\" class=\"warn\" hidden></p>\
         <main id=\"main\"{live_attr}>{body}</main></body></html>",
        title = esc(title),
    )
}

/// A form posting one action, with the form token. Empty in read-only mode.
fn button(
    app: &App,
    q: Option<&str>,
    op: &str,
    id: Option<JobId>,
    back: &str,
    label: &str,
) -> String {
    if app.read_only {
        return String::new();
    }
    let confirm = match op {
        "remove" | "cancel" | "retry_dead" | "remove_dead" => format!(
            " data-confirm=\"{}\"",
            esc(&format!(
                "{label}{}?",
                id.map(|i| format!(" job {i}")).unwrap_or_default()
            ))
        ),
        _ => String::new(),
    };
    let mut fields = format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"op\" value=\"{op}\">\
         <input type=\"hidden\" name=\"back\" value=\"{}\">",
        app.csrf,
        esc(back)
    );
    if let Some(q) = q {
        let _ = write!(
            fields,
            "<input type=\"hidden\" name=\"q\" value=\"{}\">",
            esc(q)
        );
    }
    if let Some(id) = id {
        let _ = write!(fields, "<input type=\"hidden\" name=\"id\" value=\"{id}\">");
    }
    format!(
        "<form class=\"action\" method=\"post\" action=\"/action\"{confirm}>{fields}\
         <button type=\"submit\" data-op=\"{op}\">{}</button></form>",
        esc(label)
    )
}

/// The queues of the file: the default one, then the named ones by name.
fn queues(view: &Reader) -> Result<Vec<Option<String>>> {
    let mut all = vec![None];
    all.extend(view.queue_names()?.into_iter().map(Some));
    Ok(all)
}

/// Each state with its count, in [`JobState::ALL`]'s order.
fn per_state(stats: &Stats) -> [(JobState, u64); 6] {
    let counts = [
        (JobState::Scheduled, stats.scheduled),
        (JobState::Ready, stats.ready),
        (JobState::Leased, stats.leased),
        (JobState::Dead, stats.dead),
        (JobState::Completed, stats.completed),
        (JobState::Cancelled, stats.cancelled),
    ];
    debug_assert!(counts.iter().map(|c| c.0).eq(JobState::ALL));
    counts
}

/// The snapshot warning, for a file read from a repaired copy.
fn snapshot_note(view: &Reader) -> &'static str {
    if view.is_live() {
        ""
    } else {
        "<p class=\"warn\">This file was left by a process that did not close it: shown from \
         a copy repaired in memory (the file unchanged); jobs that process had in flight show \
         as leased. Actions open the file and return them.</p>"
    }
}

/// `GET /`: every queue with its counts, its rates over the last hour and its controls.
pub(super) fn overview(app: &App, asked: &Asked) -> Result<Page> {
    let view = app.target.view(None)?;
    let now = now_ms();
    let mut body = String::from(snapshot_note(&view));
    for q in queues(&view)? {
        let q = q.as_deref();
        let v = queue_of(&view, q)?;
        let stats = v.stats()?;
        let minutes = v.metrics(chart_since(now))?;
        let paused = if stats.paused {
            "<span class=\"badge paused\">paused</span>"
        } else {
            ""
        };
        let _ = write!(
            body,
            "<section class=\"queue\" data-queue=\"{name}\"><h2>{label} {paused}</h2>",
            name = esc(q.unwrap_or("")),
            label = queue_label(q),
        );
        body.push_str("<table class=\"counts\"><tr>");
        for state in JobState::ALL {
            let _ = write!(body, "<th>{state}</th>");
        }
        body.push_str("</tr><tr>");
        for (state, n) in per_state(&stats) {
            let _ = write!(
                body,
                "<td><a data-count=\"{state}\" href=\"{}\">{n}</a></td>",
                link("/jobs", q, &[("state", state.as_str())])
            );
        }
        body.push_str("</tr></table>");
        body.push_str(&waiting(&v, &stats, now)?);
        body.push_str(&limit_line(&stats));
        body.push_str(&storage_line(&stats, now));
        body.push_str(&rates(&minutes, now));
        body.push_str(&run_times(&minutes, now));
        body.push_str(&chart(&minutes, now));
        let dead = v.latest_dead(LATEST_DEAD)?;
        if !dead.is_empty() {
            body.push_str("<p class=\"latest-dead\">Latest dead: ");
            for job in &dead {
                let _ = write!(
                    body,
                    "<a href=\"{}\" title=\"{}\">{}</a> ",
                    link("/job", q, &[("id", &job.id.to_string())]),
                    esc(&short(job.last_error.as_deref().unwrap_or(""), 200)),
                    job.id
                );
            }
            body.push_str("</p>");
        }
        body.push_str("<p class=\"controls\">");
        let back = link("/", None, &[]);
        body.push_str(&if stats.paused {
            button(app, q, "resume", None, &back, "Resume")
        } else {
            button(app, q, "pause", None, &back, "Pause")
        });
        let _ = write!(
            body,
            " <a href=\"{}\">schedules</a> · <a href=\"{}\">dead letters</a></p></section>",
            link("/schedules", Some(q.unwrap_or(DEFAULT_QUEUE)), &[]),
            link("/jobs", q, &[("state", "dead")])
        );
    }
    body.push_str(&workers(app)?);
    Ok(Page {
        html: layout(app, Some(asked), "Queues", true, &body),
    })
}

/// The workers view: each pool the app showed (or, for a file, the pools its app's control
/// channel shows), its threads busy and idle and its counts. Empty without pools.
fn workers(app: &App) -> Result<String> {
    let doc = crate::control::api::Access::workers(app)?;
    let now = now_ms();
    let Some(pools) = doc["pools"].as_array().filter(|p| !p.is_empty()) else {
        return Ok(String::new());
    };
    let mut out = String::from(
        "<section class=\"workers\"><h2>Workers</h2><table class=\"workers\"><thead><tr>\
         <th>pool</th><th>queue</th><th>state</th><th>busy</th><th>idle</th><th>jobs</th>\
         <th>acked</th><th>retried</th><th>dead</th><th>timed out</th><th>heartbeats</th>\
         <th>last heartbeat</th><th>lost</th><th>errors</th></tr></thead><tbody>",
    );
    let n = |v: &serde_json::Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
    for p in pools {
        let st = &p["stats"];
        let _ = write!(
            out,
            "<tr data-pool=\"{name}\" data-state=\"{state}\"><td>{name}</td><td>{queue}</td>\
             <td>{state}</td><td data-busy>{busy}</td><td>{idle}</td><td>{jobs}</td>\
             <td>{acked}</td><td>{retried}</td><td>{dead}</td><td>{timed_out}</td>\
             <td>{beats}</td><td data-last-heartbeat>{last}</td><td>{lost}</td>\
             <td>{errors}</td></tr>",
            name = esc(&short(p["name"].as_str().unwrap_or("?"), 80)),
            queue = queue_label(p["queue"].as_str()),
            state = esc(p["state"].as_str().unwrap_or("?")),
            busy = n(&p["busy"]),
            idle = n(&p["idle"]),
            jobs = n(&st["jobs"]),
            acked = n(&st["acked"]),
            retried = n(&st["retried"]),
            dead = n(&st["dead"]),
            timed_out = n(&st["timed_out"]),
            beats = n(&st["heartbeats"]),
            last = st["last_heartbeat_ms"]
                .as_u64()
                .map_or("-".to_string(), |ms| when(ms, now)),
            lost = n(&st["heartbeats_lost"]),
            errors = n(&st["errors"]),
        );
    }
    out.push_str("</tbody></table></section>");
    Ok(out)
}

/// The first minute the chart and the totals read (Unix ms): 24 hours of whole minutes
/// before the current, unfinished one.
fn chart_since(now: u64) -> u64 {
    (now / 60_000).saturating_sub(CHART_MINUTES) * 60_000
}

/// The longest wait among the first [`OLDEST_READY_SCAN`] ready jobs in line (Unix ms),
/// `None` with none ready.
fn oldest_ready_ms(v: &Reader, now: u64) -> Result<Option<u64>> {
    let page = v.jobs(JobState::Ready, None, OLDEST_READY_SCAN)?;
    Ok(page
        .jobs
        .iter()
        .map(|j| now.saturating_sub(j.run_at_ms))
        .max())
}

/// How long work waits: the longest wait of a ready job, and why nothing moves when the
/// queue is paused.
fn waiting(v: &Reader, stats: &Stats, now: u64) -> Result<String> {
    let mut out = String::from("<p class=\"waiting\">");
    match oldest_ready_ms(v, now)? {
        Some(ms) => {
            let _ = write!(
                out,
                "Oldest ready job waiting <b data-oldest-ready-ms=\"{ms}\">{}</b>",
                span(ms)
            );
            if stats.ready > OLDEST_READY_SCAN as u64 {
                let _ = write!(out, " (of the first {OLDEST_READY_SCAN} in line)");
            }
            if stats.paused {
                out.push_str(": nothing is delivered while the queue is paused");
            } else if let Some(until) = v.rate_limited_until(now)? {
                let _ = write!(
                    out,
                    ": <span data-rate-limited-until=\"{until}\">the rate limit's window is used \
                     up until {}</span>",
                    when(until, now)
                );
            }
            out.push('.');
        }
        None => out.push_str("No job waiting."),
    }
    out.push_str("</p>");
    Ok(out)
}

/// The file's storage-full state ([`Stats::storage_full_ms`]): since when enqueues are
/// refused for want of disk room. Empty while the file has room.
fn storage_line(stats: &Stats, now: u64) -> String {
    match stats.storage_full_ms {
        Some(since) => format!(
            "<p class=\"storage-full\" data-storage-full=\"{since}\"><strong>Storage full</strong> \
             since {}: the disk (or the file limit) is within the disk reserve; enqueues are \
             refused while the drain goes on, until the drain or a clean-up frees room.</p>",
            when(since, now)
        ),
        None => String::new(),
    }
}

/// A queue's size limit ([`Queue::set_limit`](crate::Queue::set_limit)): what it holds of
/// each bound, what a full queue does, and the jobs dropped so far; marked full when an
/// enqueue of one more job would not fit. Empty without a limit and with nothing dropped.
fn limit_line(stats: &Stats) -> String {
    let pending = stats.pending();
    let Some(limit) = stats.limit else {
        return if stats.dropped > 0 {
            format!(
                "<p class=\"limit\">No size limit; <span data-dropped=\"{0}\">{0}</span> jobs \
                 were dropped under an earlier one.</p>",
                stats.dropped
            )
        } else {
            String::new()
        };
    };
    let bytes = stats.payload_bytes.unwrap_or(0);
    let mut bounds = Vec::new();
    if let Some(m) = limit.max_jobs {
        bounds.push(format!("{pending} of {m} jobs"));
    }
    if let Some(m) = limit.max_bytes {
        bounds.push(format!("{bytes} of {m} payload bytes"));
    }
    let full =
        limit.max_jobs.is_some_and(|m| pending >= m) || limit.max_bytes.is_some_and(|m| bytes >= m);
    let when_full = match limit.when_full {
        crate::WhenFull::Refuse => "enqueues are refused".to_string(),
        crate::WhenFull::Block { wait_ms } => {
            format!("producers wait up to {}, then are refused", span(wait_ms))
        }
        crate::WhenFull::DropOldest => "the oldest waiting jobs are dropped".to_string(),
    };
    format!(
        "<p class=\"limit\" data-limit-full=\"{full}\">{badge}Size limit: {bounds}; when full, \
         {when_full}. Dropped so far: <span data-dropped=\"{dropped}\">{dropped}</span>.</p>",
        badge = if full {
            "<span class=\"badge paused\">full</span> "
        } else {
            ""
        },
        bounds = bounds.join(", "),
        dropped = stats.dropped,
    )
}

/// How many whole minutes with runs the overview lists.
const RUN_MINUTES_SHOWN: usize = 5;

/// How long jobs run: the last whole minutes in which consumers ended deliveries, each with
/// its runs and their median and 95th percentile (upper bounds, `MinuteCounts::run_ms_p50`).
/// Empty when nothing ran in the last 24 hours.
fn run_times(minutes: &[MinuteCounts], now: u64) -> String {
    let current = now / 60_000 * 60_000;
    let ran: Vec<&MinuteCounts> = minutes
        .iter()
        .filter(|m| m.runs > 0 && m.minute_ms < current)
        .collect();
    if ran.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<table class=\"run-times\" title=\"time from dequeue to ack, nack, fail or snooze; \
         each percentile is an upper bound, at most a quarter above\"><thead><tr>\
         <th>run time, minute</th><th>runs</th><th>p50</th><th>p95</th></tr></thead><tbody>",
    );
    let ms = |v: Option<u64>| v.map_or("-".to_string(), span);
    for m in ran.iter().rev().take(RUN_MINUTES_SHOWN) {
        let _ = write!(
            out,
            "<tr data-run-minute=\"{minute}\"><td>{when}</td><td>{runs}</td>\
             <td data-run-p50=\"{p50v}\">≤ {p50}</td><td data-run-p95=\"{p95v}\">≤ {p95}</td></tr>",
            minute = m.minute_ms,
            when = when(m.minute_ms, now),
            runs = m.runs,
            p50v = m.run_ms_p50.unwrap_or(0),
            p95v = m.run_ms_p95.unwrap_or(0),
            p50 = ms(m.run_ms_p50),
            p95 = ms(m.run_ms_p95),
        );
    }
    out.push_str("</tbody></table>");
    out
}

/// The last hour's and the last 24 hours' totals, and the rates per second over the current
/// minute and the one before it (a window of 60 to 120 s that slides with the clock).
fn rates(minutes: &[MinuteCounts], now: u64) -> String {
    let current = now / 60_000 * 60_000;
    let total = |since: u64| {
        let mut t = MinuteCounts::default();
        for m in minutes.iter().filter(|m| m.minute_ms >= since) {
            t.enqueued += m.enqueued;
            t.completed += m.completed;
            t.retried += m.retried;
            t.dead += m.dead;
            t.cancelled += m.cancelled;
        }
        t
    };
    let hour = total(current.saturating_sub(60 * 60_000));
    let day = total(0);
    let window_s = (60_000 + (now - current)) as f64 / 1000.0;
    let per_s = |f: fn(&MinuteCounts) -> u64| {
        let n: u64 = minutes
            .iter()
            .filter(|m| m.minute_ms + 60_000 >= current)
            .map(f)
            .sum();
        format!("{:.1}", n as f64 / window_s)
    };
    format!(
        "<p class=\"rates\">Now: <b data-rate=\"enqueued\">{}</b>/s enqueued, \
         <b data-rate=\"completed\">{}</b>/s completed. Last hour: {} enqueued, {} completed, \
         {} retried, {} dead, {} cancelled. Last 24 hours: {} enqueued, {} completed, {} \
         retried, {} dead, {} cancelled.</p>",
        per_s(|m| m.enqueued),
        per_s(|m| m.completed),
        hour.enqueued,
        hour.completed,
        hour.retried,
        hour.dead,
        hour.cancelled,
        day.enqueued,
        day.completed,
        day.retried,
        day.dead,
        day.cancelled,
    )
}

/// Jobs enqueued, completed and dead over the last 24 hours, per 10 minutes, as an SVG line
/// chart. The current minute is left out (its counts are still growing: a line would drop
/// at "now" for no reason), so every point is whole.
fn chart(minutes: &[MinuteCounts], now: u64) -> String {
    const W: u64 = 600;
    const H: u64 = 90;
    const POINTS: usize = (CHART_MINUTES / CHART_BUCKET_MINUTES) as usize;
    let end = now / 60_000;
    let first = end.saturating_sub(CHART_MINUTES);
    let mut series = [[0u64; POINTS]; 3];
    for m in minutes {
        let minute = m.minute_ms / 60_000;
        if minute < first || minute >= end {
            continue;
        }
        let i = ((minute - first) / CHART_BUCKET_MINUTES) as usize;
        series[0][i] += m.enqueued;
        series[1][i] += m.completed;
        series[2][i] += m.dead;
    }
    let top = series.iter().flatten().copied().max().unwrap_or(0).max(1);
    let mut svg = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {W} {}\" role=\"img\" \
         aria-label=\"jobs per 10 minutes over the last 24 hours\">",
        H + 14
    );
    for (line, class) in series.iter().zip(["enqueued", "completed", "dead"]) {
        let points: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let x = i as u64 * W / (POINTS as u64 - 1);
                let y = H - n * H / top;
                format!("{x},{y}")
            })
            .collect();
        let _ = write!(
            svg,
            "<polyline class=\"{class}\" fill=\"none\" data-points=\"{POINTS}\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    let _ = write!(
        svg,
        "<text x=\"0\" y=\"{y}\">24 h ago</text><text x=\"{W}\" y=\"{y}\" \
         text-anchor=\"end\">last whole minute · peak {top} per 10 min</text></svg>\
         <p class=\"legend\"><span class=\"enqueued\">enqueued</span> \
         <span class=\"completed\">completed</span> <span class=\"dead\">dead</span> \
         per 10 minutes</p>",
        y = H + 12
    );
    svg
}

/// The job's keys, as text.
fn keys(job: &JobInfo) -> String {
    let mut out = Vec::new();
    if let Some(k) = &job.idempotency_key {
        out.push(format!("idempotency: {}", short(&bytes_text(k), 60)));
    }
    if let Some(k) = &job.dedup_key {
        out.push(format!("dedup: {}", short(&bytes_text(k), 60)));
    }
    if let Some(g) = &job.group {
        out.push(format!("group: {}", short(&bytes_text(g), 60)));
    }
    esc(&out.join(" · "))
}

/// Whether a search text matches the job: its id, or a part of a key or group.
fn matches(job: &JobInfo, text: &str) -> bool {
    if text.parse::<u64>().is_ok_and(|id| id == job.id.0) {
        return true;
    }
    let needle = text.as_bytes();
    [&job.idempotency_key, &job.dedup_key, &job.group]
        .into_iter()
        .flatten()
        .any(|k| k.windows(needle.len()).any(|w| w == needle))
}

/// The form the list's checkboxes belong to (`form="bulk"`): the bulk actions a state
/// allows, each a button posting the selected ids. Empty in read-only mode.
fn bulk_form(app: &App, q: Option<&str>, state: JobState, back: &str) -> String {
    if app.read_only {
        return String::new();
    }
    let ops: &[(&str, &str)] = match state {
        JobState::Scheduled | JobState::Ready => &[
            ("bulk_cancel", "Cancel selected"),
            ("bulk_remove", "Remove selected"),
        ],
        JobState::Leased => &[("bulk_cancel", "Cancel selected")],
        JobState::Dead | JobState::Completed | JobState::Cancelled => &[
            ("bulk_retry", "Retry selected"),
            ("bulk_remove", "Remove selected"),
        ],
    };
    let mut out = format!(
        "<form id=\"bulk\" class=\"bulk\" method=\"post\" action=\"/action\" \
         data-confirm=\"Apply to the selected jobs?\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"back\" value=\"{}\">",
        app.csrf,
        esc(back)
    );
    if let Some(q) = q {
        let _ = write!(
            out,
            "<input type=\"hidden\" name=\"q\" value=\"{}\">",
            esc(q)
        );
    }
    for (op, label) in ops {
        let _ = write!(
            out,
            "<button type=\"submit\" name=\"op\" value=\"{op}\" data-op=\"{op}\">{label}</button> "
        );
    }
    out.push_str("</form>");
    out
}

/// The actions a job in its state allows, as buttons.
fn actions(app: &App, q: Option<&str>, job: &JobInfo, back: &str) -> String {
    let id = Some(job.id);
    let ops: &[(&str, &str)] = match job.state {
        JobState::Scheduled => &[
            ("promote", "Run now"),
            ("cancel", "Cancel"),
            ("remove", "Remove"),
        ],
        JobState::Ready => &[("cancel", "Cancel"), ("remove", "Remove")],
        JobState::Leased => &[("cancel", "Cancel")],
        JobState::Dead | JobState::Completed | JobState::Cancelled => {
            &[("retry", "Retry"), ("remove", "Remove")]
        }
    };
    // Removed from its own page, a job goes back to its list: its page is gone.
    let list = link("/jobs", q, &[("state", job.state.as_str())]).replace("&amp;", "&");
    ops.iter()
        .map(|(op, label)| {
            let back = if *op == "remove" && back.starts_with("/job?") {
                &list
            } else {
                back
            };
            button(app, q, op, id, back, label)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A job's progress as a bar and a message ([`Progress::read`]); the bytes as text or hex
/// when they hold neither. Empty without progress.
fn progress_html(job: &JobInfo) -> String {
    let Some(bytes) = job.progress.as_deref() else {
        return String::new();
    };
    let p = Progress::read(bytes);
    let mut out = String::from("<span class=\"progress\"");
    if let Some(pct) = p.percent {
        let _ = write!(
            out,
            " data-progress-percent=\"{pct}\"><progress value=\"{pct}\" max=\"100\">\
             </progress> {pct} %"
        );
    } else {
        out.push('>');
    }
    match (&p.message, p.percent) {
        (Some(m), _) => {
            let _ = write!(out, " {}", esc(&short(m, 120)));
        }
        (None, None) => {
            let _ = write!(out, " 0x{}", short(&hex(bytes), 64));
        }
        (None, Some(_)) => {}
    }
    out.push_str("</span>");
    out
}

/// What holds a queue's ready jobs back as a whole: its pause, or its rate limit's window
/// used up (until when, Unix ms).
#[derive(Clone, Copy)]
struct HeldBack {
    paused: bool,
    rate_limited_until: Option<u64>,
}

impl HeldBack {
    fn of(v: &Reader, paused: bool, now: u64) -> Result<HeldBack> {
        Ok(HeldBack {
            paused,
            rate_limited_until: v.rate_limited_until(now)?,
        })
    }
}

/// Why a ready job does not move, when something says: held behind its group's head (a
/// link to it), its queue paused, or its queue's rate limit. Empty otherwise.
fn why_waiting(
    v: &Reader,
    q: Option<&str>,
    job: &JobInfo,
    held: HeldBack,
    now: u64,
) -> Result<String> {
    if job.state != JobState::Ready {
        return Ok(String::new());
    }
    if job.group.is_some()
        && let Some(head) = v.held_behind(job.id)?
    {
        return Ok(format!(
            " <span class=\"badge held\" data-held-behind=\"{head}\" title=\"one job of an \
             ordered group runs at a time, in enqueue order\">held behind <a href=\"{}\">job \
             {head}</a></span>",
            link("/job", q, &[("id", &head.to_string())])
        ));
    }
    if held.paused {
        return Ok(
            " <span class=\"badge paused\" data-waiting=\"paused\" title=\"a paused \
                   queue delivers nothing until resumed\">queue paused</span>"
                .into(),
        );
    }
    if let Some(until) = held.rate_limited_until {
        return Ok(format!(
            " <span class=\"badge limited\" data-waiting=\"rate-limited\" title=\"the \
             queue's rate limit allows no more deliveries in this window\">rate limited until \
             {}</span>",
            when(until, now)
        ));
    }
    Ok(String::new())
}

/// The time a list shows for a job, by state. A leased job shows how long it has run. It is
/// marked stalled when its deadline passed (its worker stopped extending the lease: no
/// heartbeat; the job is delivered again at the next dequeue), or when it has run longer
/// than `stalled_after_ms` (`Dashboard::stalled_after`: heartbeats keep a hung job's lease
/// alive).
fn job_time(job: &JobInfo, now: u64, stalled_after_ms: Option<u64>) -> String {
    match job.state {
        JobState::Leased => {
            let running = job.leased_ms.map_or(String::new(), |started| {
                format!(
                    "<span data-running-ms=\"{ran}\">running {}</span> · ",
                    span(now.saturating_sub(started)),
                    ran = now.saturating_sub(started),
                )
            });
            let long = job
                .leased_ms
                .zip(stalled_after_ms)
                .and_then(|(started, limit)| {
                    let ran = now.saturating_sub(started);
                    (ran > limit).then_some(ran)
                });
            match job.lease_deadline_ms {
                Some(deadline) if deadline <= now => format!(
                    "<span class=\"badge stalled\" data-stalled=\"lapsed\" title=\"the lease \
                     ended without an ack or an extend: its worker is gone or hung; the job \
                     is delivered again\">stalled</span> {running}lease ended {}",
                    when(deadline, now)
                ),
                Some(deadline) if long.is_some() => format!(
                    "<span class=\"badge stalled\" data-stalled=\"long\" title=\"it has run \
                     longer than the {} this dashboard was told to allow: its heartbeats \
                     keep the lease alive, but the work may hang\">stalled</span> \
                     {running}lease ends {}",
                    span(stalled_after_ms.unwrap_or(0)),
                    when(deadline, now)
                ),
                Some(deadline) => format!("{running}lease ends {}", when(deadline, now)),
                None => running,
            }
        }
        JobState::Scheduled => format!("due {}", when(job.run_at_ms, now)),
        JobState::Ready => format!("ready {}", when(job.run_at_ms, now)),
        JobState::Dead => format!("died {}", when(job.died_ms.unwrap_or(job.run_at_ms), now)),
        JobState::Completed | JobState::Cancelled => {
            format!("ended {}", when(job.ended_ms.unwrap_or(job.run_at_ms), now))
        }
    }
}

/// `GET /jobs?q=&state=&after=&key=`: a page of a state's jobs, or a search in them.
pub(super) fn jobs(app: &App, asked: &Asked) -> Result<Page> {
    let q = asked.param("q");
    let state = match asked.param("state") {
        None => JobState::Ready,
        Some(name) => JobState::from_name(name).ok_or_else(|| {
            invalid(
                "state",
                "one of scheduled, ready, leased, dead, completed, cancelled",
            )
        })?,
    };
    let after = asked.param("after").map(JobCursor::parse).transpose()?;
    if after.is_some_and(|c| c.state() != state) {
        return Err(invalid("after", "a cursor of another state"));
    }
    let before = asked.param("before").map(JobCursor::parse).transpose()?;
    if before.is_some_and(|c| c.state() != state) {
        return Err(invalid("before", "a cursor of another state"));
    }
    // Ended and dead jobs newest first (dead ones by id: the last enqueued first; ended ones
    // by when they ended), paged both ways; the other states in their own order (delivery,
    // due time, deadline).
    let newest_first = matches!(
        state,
        JobState::Dead | JobState::Completed | JobState::Cancelled
    );
    let search = asked.param("key").map(|k| {
        // Cut at a character boundary, with no mark: the text is searched for as cut.
        let mut end = k.len().min(SEARCH_BYTES_MAX);
        while !k.is_char_boundary(end) {
            end -= 1;
        }
        k[..end].to_string()
    });
    let view = app.target.view(q)?;
    let stats = view.stats()?;
    let now = now_ms();
    let mut body = String::from(snapshot_note(&view));
    let _ = write!(
        body,
        "<h1>{} <small>queue</small></h1><nav class=\"tabs\">",
        queue_label(q)
    );
    for (s, n) in per_state(&stats) {
        let class = if s == state { " class=\"current\"" } else { "" };
        let _ = write!(
            body,
            "<a{class} href=\"{}\">{s} <span data-count=\"{s}\">{n}</span></a> ",
            link("/jobs", q, &[("state", s.as_str())])
        );
    }
    body.push_str("</nav>");
    // The search form: GET, so a search is a link too.
    let _ = write!(
        body,
        "<form class=\"search\" method=\"get\" action=\"/jobs\">{}\
         <input type=\"hidden\" name=\"state\" value=\"{state}\">\
         <input type=\"search\" name=\"key\" placeholder=\"id, or part of a key or group\" \
         value=\"{}\"> <button type=\"submit\">Search</button> \
         <button type=\"submit\" formaction=\"/search\" data-search=\"all\">Search every \
         state</button></form>",
        q.map(|q| format!("<input type=\"hidden\" name=\"q\" value=\"{}\">", esc(q)))
            .unwrap_or_default(),
        esc(search.as_deref().unwrap_or(""))
    );
    // Where the "older" and "newer" links of a newest-first list lead.
    let mut older: Option<JobCursor> = None;
    let mut newer: Option<JobCursor> = None;
    let (found, next, scanned) = match &search {
        None if newest_first => match after {
            // Newer than a page: read forward from its first job, shown newest first.
            Some(_) => {
                let page = view.jobs(state, after, PAGE_JOBS)?;
                older = page.first;
                // A full page may end at the newest job: a link to an empty page is none.
                newer = match page.next {
                    Some(n) if !view.jobs(state, Some(n), 1)?.jobs.is_empty() => Some(n),
                    _ => None,
                };
                let mut jobs = page.jobs;
                jobs.reverse();
                let n = jobs.len();
                (jobs, None, n)
            }
            None => {
                let page = view.jobs_before(state, before, PAGE_JOBS)?;
                older = match page.next {
                    Some(n) if !view.jobs_before(state, Some(n), 1)?.jobs.is_empty() => Some(n),
                    _ => None,
                };
                if before.is_some() {
                    newer = page.first;
                }
                let n = page.jobs.len();
                (page.jobs, None, n)
            }
        },
        None => {
            let page = view.jobs(state, after, PAGE_JOBS)?;
            let n = page.jobs.len();
            (page.jobs, page.next, n)
        }
        Some(text) => search_jobs(&view, state, after, text)?,
    };
    let mut back_pairs: Vec<(&str, &str)> = vec![("state", state.as_str())];
    let after_text = after.map(|c| c.to_text());
    if let Some(a) = &after_text {
        back_pairs.push(("after", a));
    }
    let before_text = before.map(|c| c.to_text());
    if let Some(b) = &before_text {
        back_pairs.push(("before", b));
    }
    if let Some(s) = &search {
        back_pairs.push(("key", s));
    }
    let back = {
        let raw = link("/jobs", q, &back_pairs);
        // `link` escapes for HTML; `button` escapes again.
        raw.replace("&amp;", "&")
    };
    if state == JobState::Dead && stats.dead > 0 && search.is_none() {
        let _ = write!(
            body,
            "<p class=\"controls\">{} {}</p>",
            button(app, q, "retry_dead", None, &back, "Retry all dead"),
            button(app, q, "remove_dead", None, &back, "Remove all dead")
        );
    }
    if let Some(text) = &search {
        let _ = write!(
            body,
            "<p class=\"searched\">{} found for “{}” among {scanned} {state} jobs read.</p>",
            found.len(),
            esc(text)
        );
    }
    if found.is_empty() {
        let _ = write!(body, "<p class=\"empty\">No {state} jobs here.</p>");
    } else {
        body.push_str(&bulk_form(app, q, state, &back));
        body.push_str(
            "<table class=\"jobs\"><thead><tr><th></th><th>id</th><th>when</th><th>attempts</th>\
             <th>priority</th><th>keys</th><th>progress, last error</th><th></th></tr></thead>\
             <tbody>",
        );
        let held = HeldBack::of(&view, stats.paused, now)?;
        for job in &found {
            let why = why_waiting(&view, q, job, held, now)?;
            let select = if app.read_only {
                String::new()
            } else {
                format!(
                    "<input type=\"checkbox\" name=\"id\" value=\"{id}\" form=\"bulk\" \
                     aria-label=\"select job {id}\">",
                    id = job.id
                )
            };
            let _ = write!(
                body,
                "<tr data-job=\"{id}\"><td>{select}</td><td><a href=\"{href}\">{id}</a></td>\
                 <td>{time}{why}</td>\
                 <td>{attempts}/{max}</td><td>{priority}</td><td>{keys}</td>\
                 <td class=\"error\">{progress}{error}</td><td>{actions}</td></tr>",
                id = job.id,
                href = link("/job", q, &[("id", &job.id.to_string())]),
                time = job_time(job, now, app.stalled_after_ms),
                attempts = job.attempts,
                max = job.max_attempts,
                priority = job.priority,
                keys = keys(job),
                progress = progress_html(job),
                error = esc(&short(job.last_error.as_deref().unwrap_or(""), 120)),
                actions = actions(app, q, job, &back),
            );
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("<p class=\"paging\">");
    if newest_first && search.is_none() {
        if after.is_some() || before.is_some() {
            let _ = write!(
                body,
                "<a href=\"{}\">« newest</a> ",
                link("/jobs", q, &[("state", state.as_str())])
            );
        }
        if let Some(c) = newer {
            let text = c.to_text();
            let _ = write!(
                body,
                "<a rel=\"prev\" href=\"{}\">‹ newer</a> ",
                link("/jobs", q, &[("state", state.as_str()), ("after", &text)])
            );
        }
        if let Some(c) = older {
            let text = c.to_text();
            let _ = write!(
                body,
                "<a rel=\"next\" href=\"{}\">older ›</a>",
                link("/jobs", q, &[("state", state.as_str()), ("before", &text)])
            );
        }
    }
    if after.is_some() && !(newest_first && search.is_none()) {
        let mut first: Vec<(&str, &str)> = vec![("state", state.as_str())];
        if let Some(s) = &search {
            first.push(("key", s));
        }
        let _ = write!(
            body,
            "<a href=\"{}\">« first page</a> ",
            link("/jobs", q, &first)
        );
    }
    if let Some(next) = next {
        let next_text = next.to_text();
        let mut pairs: Vec<(&str, &str)> = vec![("state", state.as_str()), ("after", &next_text)];
        if let Some(s) = &search {
            pairs.push(("key", s));
        }
        let label = if search.is_some() {
            "search on »"
        } else {
            "next page »"
        };
        let _ = write!(
            body,
            "<a rel=\"next\" href=\"{}\">{label}</a>",
            link("/jobs", q, &pairs)
        );
    }
    body.push_str("</p>");
    let title = format!("{state} jobs");
    Ok(Page {
        html: layout(
            app,
            Some(asked),
            &title,
            after.is_none() && before.is_none() && search.is_none(),
            &body,
        ),
    })
}

/// Reads `state`'s jobs from `after` until [`PAGE_JOBS`] match `text` or
/// [`SEARCH_SCAN_MAX`] were read. Returns the matches, where to read on, and how many were
/// read.
fn search_jobs(
    view: &Reader,
    state: JobState,
    mut after: Option<JobCursor>,
    text: &str,
) -> Result<(Vec<JobInfo>, Option<JobCursor>, usize)> {
    let mut found = Vec::new();
    let mut scanned = 0;
    loop {
        let page = view.jobs(state, after, 500)?;
        for (i, job) in page.jobs.iter().enumerate() {
            scanned += 1;
            if matches(job, text) {
                found.push(job.clone());
                if found.len() == PAGE_JOBS {
                    // Go on after this job: a page whose last job this is ends here.
                    let rest = page.jobs.len() - i - 1;
                    if rest == 0 {
                        return Ok((found, page.next, scanned));
                    }
                    let cut = view.jobs(state, after, i + 1)?;
                    return Ok((found, cut.next, scanned));
                }
            }
        }
        after = page.next;
        if after.is_none() || scanned >= SEARCH_SCAN_MAX {
            return Ok((found, after, scanned));
        }
    }
}

/// `GET /search?q=&key=`: a search by id or part of a key or group in every state of a
/// queue, each state read as its tab's search reads it (at most [`SEARCH_SCAN_MAX`] jobs
/// and [`PAGE_JOBS`] matches a state, with a link to read on in that state's tab).
pub(super) fn search(app: &App, asked: &Asked) -> Result<Page> {
    let q = asked.param("q");
    let view = app.target.view(q)?;
    let now = now_ms();
    let text = asked.param("key").map(|k| {
        let mut end = k.len().min(SEARCH_BYTES_MAX);
        while !k.is_char_boundary(end) {
            end -= 1;
        }
        k[..end].to_string()
    });
    let mut body = String::from(snapshot_note(&view));
    let _ = write!(
        body,
        "<h1>{} <small>search in every state</small></h1>\
         <form class=\"search\" method=\"get\" action=\"/search\">{}\
         <input type=\"search\" name=\"key\" placeholder=\"id, or part of a key or group\" \
         value=\"{}\"> <button type=\"submit\">Search</button></form>",
        queue_label(q),
        q.map(|q| format!("<input type=\"hidden\" name=\"q\" value=\"{}\">", esc(q)))
            .unwrap_or_default(),
        esc(text.as_deref().unwrap_or(""))
    );
    let Some(text) = text else {
        return Ok(Page {
            html: layout(app, Some(asked), "Search", false, &body),
        });
    };
    let mut total = 0;
    body.push_str(
        "<table class=\"jobs\"><thead><tr><th>id</th><th>state</th><th>when</th>\
         <th>attempts</th><th>keys</th><th>progress, last error</th></tr></thead><tbody>",
    );
    let mut more = Vec::new();
    for state in JobState::ALL {
        let (found, next, scanned) = search_jobs(&view, state, None, &text)?;
        total += found.len();
        for job in &found {
            let _ = write!(
                body,
                "<tr data-job=\"{id}\" data-state=\"{state}\"><td><a href=\"{href}\">{id}</a></td>\
                 <td><span class=\"badge state-{state}\">{state}</span></td><td>{time}</td>\
                 <td>{attempts}/{max}</td><td>{keys}</td><td class=\"error\">{progress}{error}</td>\
                 </tr>",
                id = job.id,
                href = link("/job", q, &[("id", &job.id.to_string())]),
                time = job_time(job, now, app.stalled_after_ms),
                attempts = job.attempts,
                max = job.max_attempts,
                keys = keys(job),
                progress = progress_html(job),
                error = esc(&short(job.last_error.as_deref().unwrap_or(""), 120)),
            );
        }
        if let Some(next) = next {
            let next = next.to_text();
            more.push(format!(
                "<a href=\"{}\">{state}: read on after {scanned} jobs</a>",
                link(
                    "/jobs",
                    q,
                    &[("state", state.as_str()), ("key", &text), ("after", &next)]
                )
            ));
        }
    }
    body.push_str("</tbody></table>");
    let _ = write!(
        body,
        "<p class=\"searched\">{total} found for “{}” in every state.</p>",
        esc(&text)
    );
    if !more.is_empty() {
        let _ = write!(body, "<p class=\"paging\">{}</p>", more.join(" · "));
    }
    Ok(Page {
        html: layout(app, Some(asked), "Search", false, &body),
    })
}

/// `GET /job?q=&id=&view=`: one job, its errors and its payload.
pub(super) fn job(app: &App, asked: &Asked) -> Result<Page> {
    let q = asked.param("q");
    let id = job_id(asked)?;
    let v = app.target.view(q)?;
    let job = v.job(id)?.ok_or(Error::JobNotFound { job_id: id })?;
    let payload = v.payload(id)?.unwrap_or_default();
    let now = now_ms();
    let mut body = String::from(snapshot_note(&v));
    let back = link("/job", q, &[("id", &id.to_string())]).replace("&amp;", "&");
    let _ = write!(
        body,
        "<h1>Job {id} <span class=\"badge state-{state}\" data-state>{state}</span></h1>\
         <p class=\"crumbs\">queue <a href=\"{jobs}\">{label}</a></p><p class=\"controls\">{actions}</p>",
        state = job.state,
        jobs = link("/jobs", q, &[("state", job.state.as_str())]),
        label = queue_label(q),
        actions = actions(app, q, &job, &back),
    );
    let mut rows: Vec<(&str, String)> = vec![
        ("state", job.state.to_string()),
        (
            "when",
            format!(
                "{}{}",
                job_time(&job, now, app.stalled_after_ms),
                why_waiting(&v, q, &job, HeldBack::of(&v, v.stats()?.paused, now)?, now)?
            ),
        ),
        ("enqueued", when(job.created_ms, now)),
        (
            "attempts",
            format!("{} of {}", job.attempts, job.max_attempts),
        ),
        ("priority", job.priority.to_string()),
    ];
    if let Some(t) = job.lease_token {
        rows.push(("fencing token", t.to_string()));
    }
    if job.snoozes > 0 {
        rows.push(("snoozes", job.snoozes.to_string()));
    }
    let text_rows = [
        ("idempotency key", job.idempotency_key.as_deref()),
        ("dedup key", job.dedup_key.as_deref()),
        ("group", job.group.as_deref()),
        ("result", job.result.as_deref()),
    ];
    for (name, value) in text_rows {
        if let Some(v) = value {
            rows.push((name, esc(&short(&bytes_text(v), 2000))));
        }
    }
    if job.progress.is_some() {
        let at = job
            .progress_ms
            .map(|ms| format!(" <small>({})</small>", when(ms, now_ms())))
            .unwrap_or_default();
        rows.push(("progress", format!("{}{at}", progress_html(&job))));
    }
    for (name, value) in [
        ("status", job.status.as_deref()),
        ("cancel reason", job.cancel_reason.as_deref()),
    ] {
        if let Some(v) = value {
            rows.push((name, esc(&short(v, 2000))));
        }
    }
    body.push_str("<table class=\"fields\">");
    for (name, value) in rows {
        let _ = write!(body, "<tr><th>{name}</th><td>{value}</td></tr>");
    }
    body.push_str("</table>");
    if !job.errors.is_empty() {
        body.push_str(
            "<h2>Errors</h2><table class=\"errors\"><thead><tr><th>attempt</th><th>when</th>\
             <th>message</th></tr></thead><tbody>",
        );
        for e in &job.errors {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td class=\"error\">{}</td></tr>",
                e.attempt,
                e.at_ms.map(|t| when(t, now)).unwrap_or_default(),
                esc(&short(&e.message, 4096))
            );
        }
        body.push_str("</tbody></table>");
    }
    body.push_str(&payload_section(asked, q, id, &payload));
    Ok(Page {
        // A large payload is not read again every 2 s.
        html: layout(
            app,
            Some(asked),
            &format!("Job {id}"),
            job.payload_bytes <= PREVIEW_BYTES,
            &body,
        ),
    })
}

/// The payload's preview as text, JSON (pretty) or hex, with the download link.
fn payload_section(asked: &Asked, q: Option<&str>, id: JobId, payload: &[u8]) -> String {
    let cut = &payload[..payload.len().min(PREVIEW_BYTES)];
    // Only a payload within the preview is parsed or formatted as JSON: time and memory per
    // page stay bounded whatever the payload's size.
    let whole = payload.len() <= PREVIEW_BYTES;
    let json = || serde_json::from_slice::<serde_json::Value>(payload).ok();
    // Text when the shown bytes are UTF-8, a sequence cut at the end of the preview aside.
    let utf8 = match std::str::from_utf8(cut) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && !whole,
    };
    let (chosen, parsed) = match asked.param("view") {
        Some("json") => ("json", if whole { json() } else { None }),
        Some(v @ ("text" | "hex")) => (v, None),
        _ => match if whole { json() } else { None } {
            Some(value) => ("json", Some(value)),
            None if utf8 => ("text", None),
            None => ("hex", None),
        },
    };
    let shown = match chosen {
        "json" => match &parsed {
            Some(value) => serde_json::to_string_pretty(value)
                .map(|p| esc(&p))
                .unwrap_or_default(),
            None if !whole => format!(
                "(not formatted: JSON is formatted up to {PREVIEW_BYTES} bytes; the text and \
                 hex views show the first {PREVIEW_BYTES})"
            ),
            None => "(not JSON)".into(),
        },
        "text" => esc(&bytes_text(cut)),
        _ => hex(cut),
    };
    let id_text = id.to_string();
    let mut out = format!(
        "<h2>Payload <small>{} bytes</small></h2><nav class=\"tabs\">",
        payload.len()
    );
    for v in ["text", "json", "hex"] {
        let class = if v == chosen {
            " class=\"current\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<a{class} href=\"{}\">{v}</a> ",
            link("/job", q, &[("id", &id_text), ("view", v)])
        );
    }
    let _ = write!(
        out,
        "<a href=\"{}\">download</a></nav>",
        link("/payload", q, &[("id", &id_text)])
    );
    if payload.len() > PREVIEW_BYTES {
        let _ = write!(
            out,
            "<p class=\"warn\">The first {PREVIEW_BYTES} bytes are shown; the download has all.</p>"
        );
    }
    let _ = write!(
        out,
        "<pre class=\"payload\" data-view=\"{chosen}\">{shown}</pre>"
    );
    out
}

/// A hex dump: offset, 16 bytes, and their printable ASCII.
fn hex(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, row) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", i * 16);
        for b in row {
            let _ = write!(out, "{b:02x} ");
        }
        for _ in row.len()..16 {
            out.push_str("   ");
        }
        out.push(' ');
        let ascii: String = row
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&esc(&ascii));
        out.push('\n');
    }
    out
}

/// `GET /schedules`: the schedules of every queue (`?q=NAME` one queue; `?q=(default)` the
/// default one), each with a button that removes it.
pub(super) fn schedules(app: &App, asked: &Asked) -> Result<Page> {
    let chosen = asked.param("q");
    let file = app.target.view(None)?;
    let now = now_ms();
    let names: Vec<Option<String>> = match chosen {
        None => queues(&file)?,
        Some(DEFAULT_QUEUE) => vec![None],
        Some(name) => vec![Some(name.to_string())],
    };
    let title = match chosen {
        None => "every queue".to_string(),
        Some(DEFAULT_QUEUE) => queue_label(None),
        Some(name) => queue_label(Some(name)),
    };
    let mut body = format!(
        "{}<h1>{title} <small>schedules</small></h1>",
        snapshot_note(&file)
    );
    let mut any = false;
    for name in &names {
        let q = name.as_deref();
        let v = queue_of(&file, q)?;
        let list = v.schedules()?;
        if list.is_empty() {
            continue;
        }
        any = true;
        let _ = write!(
            body,
            "<section class=\"schedules\" data-queue=\"{}\"><h2>{}</h2>\
             <table class=\"schedules\"><thead><tr><th>name</th><th>timing</th><th>next due</th>\
             <th>last job</th><th>fired</th><th>skipped</th><th>overlap</th><th>missed</th>\
             <th></th></tr></thead><tbody>",
            esc(q.unwrap_or("")),
            queue_label(q)
        );
        let back = match chosen {
            None => "/schedules".to_string(),
            Some(c) => format!(
                "/schedules?q={}",
                form_urlencoded::byte_serialize(c.as_bytes()).collect::<String>()
            ),
        };
        for s in &list {
            let timing = match &s.timing {
                Timing::Interval { every_ms, .. } => format!("every {}", span(*every_ms)),
                Timing::Cron {
                    expression,
                    time_zone,
                } => format!(
                    "cron {} ({})",
                    short(expression, 200),
                    short(time_zone, 100)
                ),
            };
            let last = match s.last_job {
                Some((id, _)) => format!(
                    "<a href=\"{}\">{id}</a>",
                    link("/job", q, &[("id", &id.to_string())])
                ),
                None => String::new(),
            };
            let next = match (s.paused_ms, s.next_due_ms) {
                (Some(at), _) => format!(
                    "<span class=\"badge paused\" data-schedule-paused=\"{at}\">paused</span> \
                     {}",
                    when(at, now)
                ),
                (None, Some(t)) => when(t, now),
                (None, None) => "never".into(),
            };
            let buttons = [
                ("trigger_schedule", "Run now", None),
                if s.paused_ms.is_some() {
                    ("resume_schedule", "Resume", None)
                } else {
                    (
                        "pause_schedule",
                        "Pause",
                        Some("It fires nothing until resumed."),
                    )
                },
                (
                    "remove_schedule",
                    "Remove",
                    Some("The jobs it enqueued stay."),
                ),
            ]
            .iter()
            .map(|&(op, label, confirm)| {
                schedule_button(app, q, &s.name, &back, op, label, confirm)
            })
            .collect::<String>();
            let _ = write!(
                body,
                "<tr data-schedule=\"{name}\"><td>{name}</td><td>{}</td><td>{next}</td><td>{last}</td>\
                 <td>{}</td><td>{}</td><td>{:?}</td><td>{:?}</td><td>{buttons}</td></tr>",
                esc(&timing),
                s.fired,
                s.skipped,
                s.overlap,
                s.missed,
                name = esc(&short(&s.name, 200)),
            );
        }
        body.push_str("</tbody></table></section>");
    }
    if !any {
        let _ = write!(body, "<p class=\"empty\">No schedules in {title}.</p>");
    }
    if chosen.is_some() {
        let _ = write!(
            body,
            "<p><a href=\"/schedules\">the schedules of every queue</a></p>"
        );
    }
    Ok(Page {
        html: layout(app, Some(asked), "Schedules", true, &body),
    })
}

/// A form acting on schedule `name` of queue `q` with `op` (`trigger_schedule`,
/// `pause_schedule`, `resume_schedule`, `remove_schedule`), asking `confirm` first when
/// given. Empty in read-only mode.
fn schedule_button(
    app: &App,
    q: Option<&str>,
    name: &str,
    back: &str,
    op: &str,
    label: &str,
    confirm: Option<&str>,
) -> String {
    if app.read_only {
        return String::new();
    }
    let confirm = confirm.map_or(String::new(), |c| {
        format!(" data-confirm=\"{label} schedule {}? {c}\"", esc(name))
    });
    format!(
        "<form class=\"action\" method=\"post\" action=\"/action\"{confirm}>\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"op\" value=\"{op}\">\
         <input type=\"hidden\" name=\"back\" value=\"{back}\">\
         <input type=\"hidden\" name=\"q\" value=\"{q}\">\
         <input type=\"hidden\" name=\"name\" value=\"{name}\">\
         <button type=\"submit\" data-op=\"{op}\">{label}</button></form>",
        csrf = app.csrf,
        back = esc(back),
        q = esc(q.unwrap_or("")),
        name = esc(name),
    )
}

/// `GET /api/overview`: every queue's counts, the longest wait of a ready job, and the last
/// 24 hours' metrics, as JSON.
pub(super) fn overview_json(app: &App) -> Result<String> {
    let view = app.target.view(None)?;
    let now = now_ms();
    let since = chart_since(now);
    let mut out = Vec::new();
    for q in queues(&view)? {
        let v = queue_of(&view, q.as_deref())?;
        let s = v.stats()?;
        let oldest_ready_ms = oldest_ready_ms(&v, now)?;
        let minutes: Vec<_> = v.metrics(since)?.iter().map(crate::json::minute).collect();
        out.push(serde_json::json!({
            "queue": q, "paused": s.paused, "scheduled": s.scheduled, "ready": s.ready,
            "leased": s.leased, "dead": s.dead, "completed": s.completed,
            "cancelled": s.cancelled, "oldest_ready_ms": oldest_ready_ms, "metrics": minutes,
        }));
    }
    let doc = serde_json::json!({
        "file": app.target.path().map(|p| p.display().to_string()),
        "live": view.is_live(),
        "read_only": app.read_only,
        "queues": out,
    });
    Ok(doc.to_string())
}

/// The page of an error: its status and leaseq's message.
pub(super) fn error_page(app: &App, status: u16, e: &Error) -> String {
    let what = match status {
        404 => "Not found",
        409 => "Not possible now",
        400 => "Bad request",
        503 => "Unavailable",
        _ => "Error",
    };
    // A refusal writes nothing; after a storage error (a failed commit) the outcome is not
    // known from here.
    let outcome = if status < 500 {
        "Nothing was changed."
    } else {
        "Look at the queue again: after a storage error a change may or may not have landed."
    };
    // What works instead, where something does.
    let hint = match e {
        Error::AlreadyOpen { .. } => {
            "<p class=\"hint\">Another process has the file open: an app (one writer at a \
             time), or a reader such as <code>leaseq watch</code>. To act while the app runs, \
             have it open its control channel (<code>leaseq::control::serve</code>): this \
             dashboard's actions then go through the app. Or stop the app first.</p>"
        }
        Error::HeldExclusively { .. } => {
            "<p class=\"hint\">The app holds the file exclusively. To read it while the app \
             runs, open it there with <code>Builder::live_reads(true)</code>; to act on it, \
             have the app open its control channel (<code>leaseq::control::serve</code>). Or \
             stop the app first.</p>"
        }
        Error::Closed => "<p class=\"hint\">The app is shutting down; try again once it runs.</p>",
        _ => "",
    };
    let body = format!(
        "<h1>{status}: {what}</h1><p class=\"error\" data-status=\"{status}\">{}</p>{hint}\
         <p>{outcome} <a href=\"/\">Back to the queues</a></p>",
        esc(&short(&e.to_string(), 4000))
    );
    debug_assert_eq!(status, status_of(e));
    layout(app, None, what, false, &body)
}
