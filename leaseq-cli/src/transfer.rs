//! `leaseq export` and `leaseq import`: jobs as JSON lines (schema in docs/cli.md).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::Path;

use leaseq::{Enqueued, ImportJob, JobState, Queue};

use crate::args::{ExportArgs, ImportArgs};
use crate::fail::{CliResult, Fail, one_line};
use crate::files::{self, DEFAULT_QUEUE, Missing, path_of};
use crate::output::Out;
use leaseq::json::JobLine;

/// Jobs read per `Queue::jobs` call.
const PAGE_JOBS: usize = 1000;

/// The order states are exported in: ready first, in the order they would be dequeued, then
/// leased ones (written as ready, behind them), scheduled, dead.
const EXPORT_STATES: [JobState; 4] = [
    JobState::Ready,
    JobState::Leased,
    JobState::Scheduled,
    JobState::Dead,
];

/// `leaseq export`: every job of the selected queues, one JSON object per line.
pub fn export(a: &ExportArgs) -> CliResult {
    let queue = files::open_reader(&a.file)?;
    let path = queue.path();
    let queues = files::selected(&queue, a.queue.queue.as_deref())?;
    let mut total = 0;
    for q in &queues {
        total += q.stats().map_err(|e| Fail::leaseq(path, e))?.total;
    }
    let bar = files::bar(Some(total), "exporting");
    let mut out = Out::new();
    let mut written = 0u64;
    for q in &queues {
        for state in EXPORT_STATES {
            let mut after = None;
            loop {
                let page = q
                    .jobs(state, after, PAGE_JOBS)
                    .map_err(|e| Fail::leaseq(path, e))?;
                for info in &page.jobs {
                    // A job gone between the page and this read is not exported.
                    let Some(payload) = q.payload(info.id).map_err(|e| Fail::leaseq(path, e))?
                    else {
                        continue;
                    };
                    out.json(&JobLine::from_info(q.name(), info, Some(&payload)))?;
                    written += 1;
                    bar.inc(1);
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
    }
    out.flush()?;
    bar.finish_and_clear();
    tracing::info!(jobs = written, "exported");
    Ok(())
}

/// The longest line `import` reads: a payload of [`leaseq::PAYLOAD_BYTES_MAX_CAP`] bytes as
/// hex (twice its size; `export` writes a payload as text only when escaping it costs no
/// more) plus 1 MiB for the other fields.
pub const LINE_BYTES_MAX: usize = 2 * leaseq::PAYLOAD_BYTES_MAX_CAP + (1 << 20);
/// Payload bytes one batch of `import` holds at most (a single larger job is a batch alone).
pub const BATCH_PAYLOAD_BYTES_MAX: usize = 64 << 20;

/// Where the lines come from: stdin itself when it is a regular file (read twice), or a copy
/// of it spooled to a temporary file while the first pass reads it.
enum Source {
    /// Stdin is a file: rewound to where it started for the second pass.
    File { file: File, start: u64 },
    /// Stdin is a pipe or terminal: copied here by the first pass.
    Spooled { spool: BufWriter<File> },
}

/// Stdin as a file and where it stands, when it is a regular file (read twice, no spool).
fn stdin_as_file() -> Option<(File, u64)> {
    let mut file = stdin_handle()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let start = file.stream_position().ok()?;
    Some((file, start))
}

/// A second handle on stdin, as a `File`.
#[cfg(unix)]
fn stdin_handle() -> Option<File> {
    use std::os::fd::AsFd;
    Some(File::from(
        std::io::stdin().as_fd().try_clone_to_owned().ok()?,
    ))
}

/// A second handle on stdin, as a `File`.
#[cfg(windows)]
fn stdin_handle() -> Option<File> {
    use std::os::windows::io::AsHandle;
    Some(File::from(
        std::io::stdin().as_handle().try_clone_to_owned().ok()?,
    ))
}

/// Elsewhere stdin is always spooled.
#[cfg(not(any(unix, windows)))]
fn stdin_handle() -> Option<File> {
    None
}

/// Reads the next line of `r` into `buf` (without its `\n`): `Ok(false)` at the end. A line
/// longer than [`LINE_BYTES_MAX`] is an error, read no further than that.
fn next_line(r: &mut impl BufRead, buf: &mut Vec<u8>, line_no: u64) -> Result<bool, String> {
    buf.clear();
    loop {
        let chunk = r.fill_buf().map_err(|e| format!("stdin: {e}"))?;
        if chunk.is_empty() {
            return Ok(!buf.is_empty());
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if buf.len() + take > LINE_BYTES_MAX {
            return Err(format!(
                "line {line_no}: longer than {LINE_BYTES_MAX} bytes (a payload of at most {} bytes as hex)",
                leaseq::PAYLOAD_BYTES_MAX_CAP
            ));
        }
        buf.extend_from_slice(&chunk[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(true);
        }
    }
}

/// One parsed line: its number, target queue (`None`: the default queue) and job.
struct Parsed {
    line_no: u64,
    queue: Option<String>,
    job: ImportJob,
    payload_bytes: usize,
}

/// Parses line `line_no`; `queue_override` (from `--queue`) replaces the line's queue.
fn parse_line(
    text: &[u8],
    line_no: u64,
    queue_override: Option<&Option<String>>,
) -> Result<Option<Parsed>, String> {
    let text = std::str::from_utf8(text).map_err(|e| format!("line {line_no}: not UTF-8: {e}"))?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let line: JobLine = serde_json::from_str(text).map_err(|e| {
        // serde_json counts lines within the text it was given: one line, so say the column.
        let message = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = message.strip_suffix(&suffix).unwrap_or(&message);
        format!("line {line_no}, column {}: {message}", e.column())
    })?;
    let queue = match queue_override {
        Some(q) => q.clone(),
        None => line.queue.clone(),
    };
    let (job, payload_bytes) = line
        .to_import()
        .map_err(|e| format!("line {line_no}: {e}"))?;
    Ok(Some(Parsed {
        line_no,
        queue,
        job,
        payload_bytes,
    }))
}

/// A batch of parsed lines, bounded by [`leaseq::BATCH_MAX`] jobs and
/// [`BATCH_PAYLOAD_BYTES_MAX`] payload bytes.
#[derive(Default)]
struct Batch {
    jobs: Vec<Parsed>,
    payload_bytes: usize,
}

impl Batch {
    fn is_full_for(&self, next_bytes: usize) -> bool {
        !self.jobs.is_empty()
            && (self.jobs.len() >= leaseq::BATCH_MAX
                || self.payload_bytes + next_bytes > BATCH_PAYLOAD_BYTES_MAX)
    }

    fn push(&mut self, p: Parsed) {
        self.payload_bytes += p.payload_bytes;
        self.jobs.push(p);
    }

    /// The jobs per target queue, each queue's in line order (queues are independent, so
    /// only the order within one matters).
    fn groups(&self) -> Vec<(Option<&str>, Vec<&Parsed>)> {
        let mut order: Vec<Option<&str>> = Vec::new();
        let mut by_queue: HashMap<Option<&str>, Vec<&Parsed>> = HashMap::new();
        for p in &self.jobs {
            let key = p.queue.as_deref();
            by_queue
                .entry(key)
                .or_insert_with(|| {
                    order.push(key);
                    Vec::new()
                })
                .push(p);
        }
        order
            .into_iter()
            .map(|k| (k, by_queue.remove(&k).unwrap_or_default()))
            .collect()
    }
}

/// The handle of queue `name` (`None` or `(default)`: the default queue), made if missing.
fn handle<'c>(
    cache: &'c mut HashMap<Option<String>, Queue>,
    root: &Queue,
    name: Option<&str>,
) -> leaseq::Result<&'c Queue> {
    let key = name.map(str::to_string);
    if !cache.contains_key(&key) {
        let q = match name {
            None | Some(DEFAULT_QUEUE) => root.clone(),
            Some(n) => root.named(n)?,
        };
        cache.insert(key.clone(), q);
    }
    Ok(&cache[&key])
}

/// What an import did so far.
#[derive(Default)]
struct Counts {
    /// Jobs added.
    imported: u64,
    /// Jobs not added because their dedup key was held.
    duplicates: u64,
}

/// Imports `batch` into the queues of `root`, one `import_batch` (one commit) per queue,
/// adding what each commit did to `counts` as it commits.
fn import_into(
    root: &Queue,
    cache: &mut HashMap<Option<String>, Queue>,
    batch: &Batch,
    counts: &mut Counts,
) -> leaseq::Result<()> {
    for (name, jobs) in batch.groups() {
        let q = handle(cache, root, name)?;
        let jobs: Vec<ImportJob> = jobs.iter().map(|p| p.job.clone()).collect();
        for outcome in q.import_batch(&jobs)? {
            match outcome {
                Enqueued::New(_) => counts.imported += 1,
                Enqueued::Duplicate(_) | Enqueued::DuplicateDead(_) | Enqueued::Replaced(_) => {
                    counts.duplicates += 1
                }
            }
        }
    }
    Ok(())
}

/// Imports `batch` into an empty queue in memory: what the library refuses there it would
/// refuse on the file. A refused batch is tried again job by job to name the first bad line.
fn rehearse(batch: &Batch) -> CliResult {
    let mut counts = Counts::default();
    let whole = files::in_memory()
        .and_then(|root| import_into(&root, &mut HashMap::new(), batch, &mut counts));
    let Err(batch_error) = whole else {
        return Ok(());
    };
    let refused = |what: String, e: &leaseq::Error| {
        Fail::error(format!(
            "{what}: {}; nothing imported",
            one_line(&e.to_string())
        ))
    };
    let root = files::in_memory().map_err(|e| refused("a queue in memory".into(), &e))?;
    let mut cache = HashMap::new();
    for p in &batch.jobs {
        let one = Batch {
            jobs: vec![Parsed {
                line_no: p.line_no,
                queue: p.queue.clone(),
                job: p.job.clone(),
                payload_bytes: p.payload_bytes,
            }],
            payload_bytes: p.payload_bytes,
        };
        if let Err(e) = import_into(&root, &mut cache, &one, &mut counts) {
            return Err(refused(format!("line {}", p.line_no), &e));
        }
    }
    let first = batch.jobs.first().map_or(0, |p| p.line_no);
    let last = batch.jobs.last().map_or(0, |p| p.line_no);
    Err(refused(format!("lines {first} to {last}"), &batch_error))
}

/// Reads every line of `r`, in batches, calling `each` on every full batch and the last.
/// A line that does not parse or is too long becomes `bad_line(message)`.
fn batches(
    r: &mut impl BufRead,
    queue_override: Option<&Option<String>>,
    mut copy: Option<&mut BufWriter<File>>,
    bad_line: fn(String) -> Fail,
    mut each: impl FnMut(&Batch) -> CliResult,
) -> CliResult {
    let mut buf = Vec::new();
    let mut batch = Batch::default();
    let mut line_no = 0u64;
    loop {
        line_no += 1;
        if !next_line(r, &mut buf, line_no).map_err(bad_line)? {
            break;
        }
        if let Some(w) = copy.as_deref_mut() {
            w.write_all(&buf)
                .and_then(|()| w.write_all(b"\n"))
                .map_err(|e| Fail::io("spooling stdin to a temporary file", e))?;
        }
        let Some(parsed) = parse_line(&buf, line_no, queue_override).map_err(bad_line)? else {
            continue;
        };
        if batch.is_full_for(parsed.payload_bytes) {
            each(&batch)?;
            batch = Batch::default();
        }
        batch.push(parsed);
    }
    if !batch.jobs.is_empty() {
        each(&batch)?;
    }
    Ok(())
}

fn nothing_imported(message: String) -> Fail {
    Fail::error(format!("{message}; nothing imported"))
}

fn changed_input(message: String) -> Fail {
    Fail::error(format!(
        "{message} (the input changed after it was checked; jobs before it may be imported)"
    ))
}

/// `leaseq import`: reads stdin twice. The first pass parses every line and imports each
/// batch into an empty queue in memory, so a bad line is reported (with its number) before
/// the file is opened; the second imports for real, one commit per batch and queue. The file
/// is opened (or created) only after the whole input passed.
pub fn import(a: &ImportArgs) -> CliResult {
    let queue_override: Option<Option<String>> = a.queue.as_ref().map(|q| match q.as_str() {
        DEFAULT_QUEUE => None,
        name => Some(name.to_string()),
    });
    let queue_override = queue_override.as_ref();
    if std::io::stdin().is_terminal() {
        return Err(Fail::error(
            "no input: give the JSON lines on stdin (leaseq import FILE < jobs.jsonl)",
        ));
    }
    let mut source = match stdin_as_file() {
        Some((file, start)) => Source::File { file, start },
        None => {
            let dir = a
                .file
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let spool = tempfile::tempfile_in(dir)
                .or_else(|_| tempfile::tempfile())
                .map_err(|e| Fail::io("a temporary file to spool stdin", e))?;
            Source::Spooled {
                spool: BufWriter::new(spool),
            }
        }
    };

    // Pass 1: parse and rehearse everything; nothing is opened yet.
    let checking = files::bar(None, "checking");
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut jobs_total = 0u64;
    let pass1 = {
        let mut rehearse_each = |batch: &Batch| -> CliResult {
            for p in &batch.jobs {
                if let Some(n) = &p.queue
                    && n != DEFAULT_QUEUE
                    && names.len() <= leaseq::QUEUES_MAX as usize
                {
                    names.insert(n.clone());
                }
            }
            if names.len() > leaseq::QUEUES_MAX as usize {
                return Err(nothing_imported(format!(
                    "more than {} named queues in the input",
                    leaseq::QUEUES_MAX
                )));
            }
            rehearse(batch)?;
            jobs_total += batch.jobs.len() as u64;
            checking.set_position(jobs_total);
            Ok(())
        };
        match &mut source {
            Source::File { file, .. } => batches(
                &mut BufReader::new(&*file),
                queue_override,
                None,
                nothing_imported,
                &mut rehearse_each,
            ),
            Source::Spooled { spool } => batches(
                &mut std::io::stdin().lock(),
                queue_override,
                Some(spool),
                nothing_imported,
                &mut rehearse_each,
            ),
        }
    };
    checking.finish_and_clear();
    pass1?;

    // Pass 2: the file, from the start of the input again.
    let mut input: Box<dyn Read> = match source {
        Source::File { mut file, start } => {
            file.seek(SeekFrom::Start(start))
                .map_err(|e| Fail::io("rewinding stdin", e))?;
            Box::new(file)
        }
        Source::Spooled { spool } => {
            let mut file = spool
                .into_inner()
                .map_err(|e| Fail::io("the spooled input", e.into_error()))?;
            file.seek(SeekFrom::Start(0))
                .map_err(|e| Fail::io("the spooled input", e))?;
            Box::new(file)
        }
    };
    let root = files::open(&a.file, Missing::Create)
        .map_err(|f| crate::write::needs_the_file(f, "import", &a.file))?;
    let path = path_of(&root).to_path_buf();
    let existing: BTreeSet<String> = root
        .queue_names()
        .map_err(|e| Fail::leaseq(&path, e))?
        .into_iter()
        .collect();
    let made = names.difference(&existing).count();
    if existing.len() + made > leaseq::QUEUES_MAX as usize {
        return Err(Fail::error(format!(
            "{}: the input would make {made} queues, and the file has {} of at most {}; nothing imported",
            path.display(),
            existing.len(),
            leaseq::QUEUES_MAX
        )));
    }
    let bar = files::bar(Some(jobs_total), "importing");
    let mut cache = HashMap::new();
    let mut done = Counts::default();
    let pass2 = batches(
        &mut BufReader::new(&mut input),
        queue_override,
        None,
        changed_input,
        |batch| {
            import_into(&root, &mut cache, batch, &mut done).map_err(|e| {
                Fail::error(format!(
                    "{}; {} of the {jobs_total} jobs were committed before it (a commit per \
                     batch of up to {} jobs and queue), the others not",
                    Fail::leaseq(&path, e).message,
                    done.imported + done.duplicates,
                    leaseq::BATCH_MAX
                ))
            })?;
            bar.inc(batch.jobs.len() as u64);
            Ok(())
        },
    );
    bar.finish_and_clear();
    pass2?;
    let mut out = Out::new();
    out.line(format!(
        "imported {} jobs, duplicates {} (dedup key held), into {}",
        done.imported,
        done.duplicates,
        path.display()
    ))?;
    out.flush()
}
