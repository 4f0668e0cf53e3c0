//! Opening a queue file for a command, choosing its queues, and progress bars on a terminal.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use leaseq::{Builder, JobId, JobInfo, Queue, Reader};

use crate::fail::{CliResult, Fail};

/// How `--queue '(default)'` names the default (unnamed) queue; no named queue can be called
/// this (names are ASCII letters, digits, `_`, `-` and `.`).
pub const DEFAULT_QUEUE: &str = "(default)";

/// Whether a command may create a missing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Read commands and commands that act on existing jobs: "no such file".
    Refuse,
    /// enqueue and import.
    Create,
}

/// A builder with the tool's settings: payloads up to the library's cap, so any job a file
/// can hold can be enqueued and imported.
pub fn builder() -> Builder {
    Queue::builder().payload_bytes_max(leaseq::PAYLOAD_BYTES_MAX_CAP)
}

/// Makes sure a file is at `path`: "no such file" otherwise (never created).
pub fn must_exist(path: &Path) -> CliResult {
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Fail::error(format!("{}: no such file", path.display())))
        }
        Err(e) => Err(Fail::io(&path.display().to_string(), e)),
    }
}

/// Opens `path` for the read commands: read-only, beside the app that has it open (with
/// `Builder::live_reads`) or with nobody; never writes the file, never returns a lease. A
/// file that needs a repair or an upgrade is read from a copy made right in memory, said on
/// stderr. The verification of a file nobody has open shows a progress bar on a terminal.
pub fn open_reader(path: &Path) -> CliResult<Reader> {
    must_exist(path)?;
    let bar = fraction_bar("verifying");
    let on_repair = bar.clone();
    let builder = Queue::builder().on_repair(move |fraction| {
        on_repair.set_position((fraction.clamp(0.0, 1.0) * 1000.0) as u64);
    });
    tracing::info!(path = %path.display(), "opening read-only");
    let opened = builder.open_reader(path);
    bar.finish_and_clear();
    let reader = opened.map_err(|e| Fail::leaseq(path, e))?;
    tracing::info!(live = reader.is_live(), "opened read-only");
    if !reader.is_live() {
        eprintln!(
            "leaseq: note: {} was left by a process that did not close it (or by an older \
             leaseq): read from a copy repaired in memory, the file unchanged; jobs that \
             process had in flight show as leased",
            path.display()
        );
    }
    Ok(reader)
}

/// [`open_reader`] without a progress bar or the note on stderr (for `watch`, which opens
/// one per refresh), verifying the file (when nobody writes it) only if `verify`: a file
/// verified at the first refresh is not read again whole at every later one, and no later
/// refresh takes the writer locks the verification takes (an app starting then would be
/// refused).
pub fn open_reader_quietly(path: &Path, verify: bool) -> CliResult<Reader> {
    must_exist(path)?;
    Queue::builder()
        .check_integrity(verify)
        .open_reader(path)
        .map_err(|e| Fail::leaseq(path, e))
}

/// Opens `path` with `builder`, after making sure a file is there when `missing` says so.
/// The integrity check (redb's, at every open of an existing file) shows a progress bar on a
/// terminal.
pub fn open_with(path: &Path, missing: Missing, builder: Builder) -> CliResult<Queue> {
    if missing == Missing::Refuse {
        must_exist(path)?;
    }
    let bar = fraction_bar("verifying");
    let on_repair = bar.clone();
    let builder = builder.on_repair(move |fraction| {
        on_repair.set_position((fraction.clamp(0.0, 1.0) * 1000.0) as u64);
    });
    tracing::info!(path = %path.display(), "opening");
    let opened = builder.open(path);
    bar.finish_and_clear();
    let queue = opened.map_err(|e| Fail::leaseq(path, e))?;
    let r = queue.recovery();
    tracing::info!(
        created = r.created,
        repaired = r.repaired,
        leases_returned = r.leases_returned,
        leases_dead_lettered = r.leases_dead_lettered,
        quarantined = r.quarantined,
        upgraded_from = ?r.upgraded_from,
        "opened"
    );
    // The open changed the file: said even without -v.
    if r.leases_returned > 0 || r.leases_dead_lettered > 0 || r.quarantined > 0 {
        eprintln!(
            "leaseq: note: opening {} returned {} lease(s) left by a closed or dead process \
             ({} dead-lettered: no attempts left); {} damaged row(s) quarantined",
            path.display(),
            r.leases_returned,
            r.leases_dead_lettered,
            r.quarantined
        );
    }
    if r.schedules_fired > 0 {
        eprintln!(
            "leaseq: note: opening {} enqueued a job for each of {} schedule(s) due while the file was closed",
            path.display(),
            r.schedules_fired
        );
    }
    if let Some(from) = r.upgraded_from {
        eprintln!(
            "leaseq: note: {} was upgraded from format {from} to {} (older leaseq versions cannot open it now)",
            path.display(),
            leaseq::FORMAT_VERSION
        );
    }
    Ok(queue)
}

/// An empty queue in memory with the tool's settings: a call made there first is refused
/// exactly as the library would refuse it on the file, before the file is opened.
pub fn in_memory() -> leaseq::Result<Queue> {
    builder().open_backend(leaseq::redb::backends::InMemoryBackend::new())
}

/// Opens `path` with the tool's settings.
pub fn open(path: &Path, missing: Missing) -> CliResult<Queue> {
    open_with(path, missing, builder())
}

/// The display name of a queue named `name` (`None`: the default queue).
pub fn queue_label(name: Option<&str>) -> &str {
    name.unwrap_or(DEFAULT_QUEUE)
}

/// The reader of the queue `--queue NAME` names, if it exists (never made); the default
/// queue for `(default)`.
pub fn existing(reader: &Reader, name: &str) -> CliResult<Reader> {
    if name == DEFAULT_QUEUE {
        return Ok(reader.default_queue());
    }
    reader
        .existing(name)
        .map_err(|e| Fail::leaseq(reader.path(), e))
}

/// The queues a command covers: the one `--queue` names, or every queue of the file (the
/// default one first, then the named ones by name).
pub fn selected(reader: &Reader, name: Option<&str>) -> CliResult<Vec<Reader>> {
    if let Some(name) = name {
        return Ok(vec![existing(reader, name)?]);
    }
    let path = reader.path();
    let names = reader.queue_names().map_err(|e| Fail::leaseq(path, e))?;
    let mut out = Vec::with_capacity(names.len() + 1);
    out.push(reader.default_queue());
    for name in names {
        out.push(reader.existing(&name).map_err(|e| Fail::leaseq(path, e))?);
    }
    Ok(out)
}

/// The path a queue was opened from (for messages).
pub fn path_of(queue: &Queue) -> &Path {
    queue.path().unwrap_or(Path::new("?"))
}

/// Finds job `id` in the queues `--queue` selects (ids are unique in a file).
pub fn find_job(
    reader: &Reader,
    name: Option<&str>,
    id: u64,
) -> CliResult<Option<(Reader, JobInfo)>> {
    let path = reader.path();
    for q in selected(reader, name)? {
        if let Some(info) = q.job(JobId(id)).map_err(|e| Fail::leaseq(path, e))? {
            return Ok(Some((q, info)));
        }
    }
    Ok(None)
}

/// A bar of a fraction (positions 0 to 1000) on stderr when stderr is a terminal.
fn fraction_bar(message: &'static str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{msg:>10} [{bar:40}] {percent:>3}% {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(message);
    bar
}

/// A progress bar on stderr when stderr is a terminal, hidden otherwise. `len` of `None` is a
/// spinner.
pub fn bar(len: Option<u64>, message: &'static str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    match len {
        Some(len) => {
            let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{msg:>10} [{bar:40}] {percent:>3}% {pos}/{len} {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(message);
            bar
        }
        None => {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.set_message(message);
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        }
    }
}
