//! Opening corrupted queue files (the `open_corrupt` fuzz target and its regression tests): no
//! panic may cross leaseq's API; leaseq catches redb's panics at its boundary and returns
//! `Error::Corrupted`. Any `Err` is fine.
//!
//! A valid small queue file is built once (jobs in every state, applied markers, dedup keys,
//! an effect table), and once more with periodic jobs and flow control as well (schedules in
//! the default queue and in a named one, one removed, instances enqueued; some due when the
//! image opens, so the open fires them; jobs in ordered groups, some held behind their
//! group's head; a rate limit with a window in use on each queue). An input's first byte picks the base image (bit 0: closed cleanly, or the
//! process killed with leases held, so the open repairs and recovers; bit 7: the one with
//! schedules) and how it is opened (bit 1: on a `SimDisk`, or from a file through
//! `Queue::open`, which also runs the file checks); then every 4 bytes are one edit: a 24-bit
//! offset and a byte XORed in there (an even first byte keeps the edit in the first 16 KiB:
//! redb's header and first pages). A last lone byte truncates the image to that many 256ths.
//! Mode bit 2 picks the same queue written with the write-ahead journal instead, a (file,
//! journal) pair whose edits and truncation may go to the journal ([`corrupted_image`]).
//! The queue is then opened, checked, read (its schedules and rate limits too), drained and
//! written to (schedules created, changed and removed, grouped jobs, rate limits changed).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::time::Duration;

use leaseq::sim::SimDisk;
use leaseq::{EnqueueOptions, JobId, ManualClock, Missed, Overlap, Queue, Schedule};
use redb::ReadableTable;

use super::{EFFECTS, T0_MS};

/// The settings every base image is written and opened with.
pub fn builder(clock: &ManualClock) -> leaseq::Builder {
    Queue::builder()
        .retry(leaseq::RetryPolicy::immediate())
        .lease(Duration::from_secs(1))
        .max_attempts(3)
        .cache_bytes(1 << 20)
        .clock(clock.clone())
}

/// A queue file and the journal beside it (empty for a queue written without one).
pub type Pair = (Vec<u8>, Vec<u8>);

/// A small queue with jobs in every state: (closed cleanly, process killed with leases held).
pub fn base_images() -> &'static (Vec<u8>, Vec<u8>) {
    static IMAGES: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let (clean, killed) = build_images(false, false);
        (clean.0, killed.0)
    })
}

/// The queues of [`base_images`] (`schedules` false) and [`scheduled_images`] (true) written
/// with the write-ahead journal, each a (file, journal) pair: (closed cleanly, so the
/// journal's frames are all older than the file's last checkpoint; process killed with
/// leases held and frames after the last checkpoint, which the open replays).
pub fn journaled_images(schedules: bool) -> &'static (Pair, Pair) {
    static PLAIN: OnceLock<(Pair, Pair)> = OnceLock::new();
    static SCHEDULED: OnceLock<(Pair, Pair)> = OnceLock::new();
    let cell = if schedules { &SCHEDULED } else { &PLAIN };
    cell.get_or_init(|| build_images(schedules, true))
}

/// The journal's bytes in use: its header and frames (the rest is written zeros).
pub fn journal_used(journal: &[u8]) -> usize {
    journal.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

/// Where an edit of the journal of [`journaled_images`]`(schedules)` may land: its bytes in
/// use and 64 more, computed once per image (a scan of 4 MiB at every run was a third of
/// the fuzz target's time).
fn journal_span(schedules: bool, killed: bool) -> usize {
    static SPANS: [OnceLock<usize>; 4] = [const { OnceLock::new() }; 4];
    *SPANS[usize::from(schedules) * 2 + usize::from(killed)].get_or_init(|| {
        let (clean, killed_pair) = journaled_images(schedules);
        journal_used(if killed { &killed_pair.1 } else { &clean.1 }) + 64
    })
}

/// The same queue with periodic jobs as well: (closed cleanly, process killed with leases
/// held). Schedule "tick" (every second, `Overlap::Enqueue`) fires during the dequeues that
/// build the image and is due again when it opens, "nightly" is a cron schedule in Berlin
/// time (`Missed::Skip`), "gone" was removed, and the named queue "side" holds "side-tick",
/// due when the image opens (the open fires the schedules of every queue). A third of the
/// jobs are in one of two ordered groups, and both queues have a rate limit the building
/// dequeues used: a fixed window on the default queue, a sliding one (with its log) on "side".
pub fn scheduled_images() -> &'static (Vec<u8>, Vec<u8>) {
    static IMAGES: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let (clean, killed) = build_images(true, false);
        (clean.0, killed.0)
    })
}

/// (closed cleanly, killed) images of the queue described at [`scheduled_images`] (with
/// `schedules`) or [`base_images`], written with the journal if `journal`.
fn build_images(schedules: bool, journal: bool) -> (Pair, Pair) {
    let clock = ManualClock::new(T0_MS);
    let disk = SimDisk::new(7);
    let jdisk = disk.sibling(8);
    let q = if journal {
        builder(&clock)
            .open_backends(disk.backend(), jdisk.backend())
            .unwrap()
    } else {
        builder(&clock).open_backend(disk.backend()).unwrap()
    };
    // A completed history, so the images hold completed and cancelled rows too.
    q.set_history(leaseq::History::off().keep_jobs(8)).unwrap();
    if schedules {
        q.create_schedule(
            "tick",
            &Schedule::every(Duration::from_secs(1))
                .payload(b"tick".to_vec())
                .overlap(Overlap::Enqueue),
        )
        .unwrap();
        q.create_schedule(
            "nightly",
            &Schedule::cron("0 3 * * *", "Europe/Berlin")
                .payload(vec![9; 300])
                .options(EnqueueOptions::default().priority(-1).max_attempts(2))
                .missed(Missed::Skip),
        )
        .unwrap();
        q.create_schedule("gone", &Schedule::every(Duration::from_secs(5)))
            .unwrap();
        q.set_rate_limit(Some(leaseq::RateLimit::new(40, Duration::from_secs(60))))
            .unwrap();
        let side = q.named("side").unwrap();
        side.set_rate_limit(Some(leaseq::RateLimit::sliding(
            1,
            Duration::from_secs(3600),
        )))
        .unwrap();
        side.create_schedule(
            "side-tick",
            &Schedule::every(Duration::from_secs(2))
                .starting_at_ms(T0_MS + 500)
                .payload(b"side".to_vec()),
        )
        .unwrap();
    }
    for i in 0..24u32 {
        let mut o = EnqueueOptions::default().priority((i % 3) as i32 - 1);
        if i % 2 == 0 {
            o = o.idempotency_key(format!("k{}", i % 5));
        }
        if i % 4 == 1 {
            o = o.dedup_key(format!("d{i}"));
        }
        if i % 5 == 4 {
            o = o.delay(Duration::from_secs(60));
        }
        if i % 7 == 3 {
            o = o.max_attempts(1);
        }
        if i % 6 == 5 {
            // The record's execution timeout field, for the edits to land in.
            o = o.timeout(Duration::from_millis(250 * u64::from(i)));
        }
        if schedules && i % 3 == 0 {
            o = o.group(format!("g{}", i % 2));
        }
        let payload = vec![i as u8; 16 + (i as usize * 97) % 3000];
        q.enqueue(&payload, o).unwrap();
    }
    if schedules {
        // "tick" is due: the first dequeue below enqueues its instance.
        clock.advance(Duration::from_millis(1_000));
        q.remove_schedule("gone").unwrap();
    }
    let mut held = Vec::new();
    for i in 0..12 {
        let Some(l) = q.dequeue().unwrap() else { break };
        match i % 4 {
            0 => {
                l.ack_with(|tx| {
                    let mut t = tx.open_table(EFFECTS)?;
                    t.insert(format!("e{i}").as_str(), 1)?;
                    Ok(())
                })
                .unwrap();
            }
            1 => {
                l.nack_after("later", Duration::from_secs(5)).unwrap();
            }
            2 => l.fail("dead on purpose").unwrap(),
            _ => held.push(l),
        }
    }
    // A cancelled lease (its row fenced), a cancelled waiting job, a snooze with a reason.
    if let Some(l) = held.pop() {
        q.cancel(l.id(), "cancelled while leased").unwrap();
    }
    q.cancel(JobId(24), "cancelled while waiting").unwrap();
    if let Some(l) = q.dequeue().unwrap() {
        l.snooze_because(Duration::from_secs(30), "waiting for network")
            .unwrap();
    }
    if schedules {
        // Due again (the last instance ran or waits: Overlap::Enqueue either way).
        clock.advance(Duration::from_millis(1_000));
        let _ = q.dequeue_batch(2).unwrap();
        q.upsert_schedule(
            "tick",
            &Schedule::every(Duration::from_secs(1))
                .payload(b"tick v2".to_vec())
                .overlap(Overlap::Enqueue),
        )
        .unwrap();
        assert!(q.schedule("tick").unwrap().unwrap().fired >= 1);
        let side = q.named("side").unwrap();
        for g in ["a", "a", "b"] {
            side.enqueue(b"side job", EnqueueOptions::default().group(g))
                .unwrap();
        }
        // Its window's one delivery used: the rest waits for the window's end.
        assert!(side.dequeue().unwrap().is_some());
        assert!(side.dequeue().unwrap().is_none());
    }
    let image = |d: &SimDisk| if journal { d.live_image() } else { Vec::new() };
    let killed = (disk.live_image(), image(&jdisk));
    drop(held);
    drop(q);
    ((disk.live_image(), image(&jdisk)), killed)
}

/// Runs `f`; a panic out of it came through leaseq's API.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("PANIC THROUGH LEASEQ'S API in {what}: {msg}")
    })
}

fn exercise(q: &Queue, clock: &ManualClock) -> Result<(), String> {
    let _ = no_panic("check", || q.check())?;
    let _ = no_panic("stats", || q.stats())?;
    let _ = no_panic("recovery", || q.recovery())?;
    for id in 1..40 {
        let _ = no_panic("job", || q.job(JobId(id)))?;
    }
    for k in 0..5 {
        let _ = no_panic("is_applied", || q.is_applied(format!("k{k}")))?;
    }
    exercise_schedules(q)?;
    exercise_flow(q)?;
    clock.advance(Duration::from_secs(120));
    for i in 0..24u32 {
        let lease = match no_panic("dequeue", || q.dequeue())? {
            Ok(Some(l)) => l,
            _ => break,
        };
        let _ = match i % 5 {
            0 => no_panic("ack", || lease.ack())?,
            1 => no_panic("nack", || lease.nack("again").map(drop))?,
            2 => no_panic("fail", || lease.fail("no"))?,
            _ => no_panic("ack_with", || {
                lease
                    .ack_with(|tx| {
                        let mut t = tx.open_table(EFFECTS)?;
                        let key = format!("x{i}");
                        let n = t.get(key.as_str())?.map_or(0, |v| v.value());
                        t.insert(key.as_str(), n + 1)?;
                        Ok(())
                    })
                    .map(drop)
            })?,
        };
    }
    let _ = no_panic("enqueue", || {
        q.enqueue(b"after", EnqueueOptions::default().dedup_key("d1"))
    })?;
    let _ = no_panic("dequeue_batch", || q.dequeue_batch(4).map(drop))?;
    let _ = no_panic("requeue_dead", || q.requeue_dead(JobId(3)))?;
    // The controls, on every id the base images use.
    for id in 1..30 {
        let id = JobId(id);
        let _ = match id.0 % 7 {
            0 => no_panic("cancel", || q.cancel(id, "fuzz").map(drop))?,
            1 => no_panic("retry", || q.retry(id))?,
            2 => no_panic("promote", || q.promote(id))?,
            3 => no_panic("reschedule", || q.reschedule(id, Duration::from_secs(1)))?,
            4 => no_panic("set_priority", || q.set_priority(id, -2))?,
            5 => no_panic("update_payload", || q.update_payload(id, &[7; 1500]))?,
            _ => no_panic("remove", || q.remove(id))?,
        };
    }
    // The same controls inside the app's own commit (`Tx`), with a row of the app's.
    for id in (1..30).step_by(4) {
        let id = JobId(id);
        let _ = no_panic("write Tx::cancel, retry, remove", || {
            q.write(|tx| {
                tx.open_table(super::EFFECTS)?.insert("tx", 1)?;
                let _ = tx.cancel(id, "fuzz");
                let _ = tx.retry(JobId(id.0 + 1));
                let _ = tx.remove(JobId(id.0 + 2));
                Ok(())
            })
        })?;
    }
    let _ = no_panic("history", || q.history())?;
    let _ = no_panic("set_history", || {
        q.set_history(leaseq::History::off().keep_jobs(2))
    })?;
    let _ = no_panic("release_dedup_key", || q.release_dedup_key("d1"))?;
    for state in [leaseq::JobState::Completed, leaseq::JobState::Cancelled] {
        let _ = no_panic("jobs", || q.jobs(state, None, 50))?;
    }
    let _ = no_panic("prune", || q.prune())?;
    let _ = no_panic("remove_schedule", || q.remove_schedule("tick"))?;
    let _ = no_panic("schedules", || q.schedules())?;
    let _ = no_panic("check", || q.check())?;
    Ok(())
}

/// The flow-control calls: rate limits read and changed, ready jobs listed (held ones among
/// them), grouped enqueues, and a dequeue of "side" under its limit.
fn exercise_flow(q: &Queue) -> Result<(), String> {
    let _ = no_panic("rate_limit", || q.rate_limit())?;
    let _ = no_panic("jobs ready", || q.jobs(leaseq::JobState::Ready, None, 50))?;
    let _ = no_panic("grouped enqueue", || {
        q.enqueue(b"grouped", EnqueueOptions::default().group("g0"))
    })?;
    let _ = no_panic("set_rate_limit", || {
        q.set_rate_limit(Some(leaseq::RateLimit::sliding(3, Duration::from_secs(1))))
    })?;
    let _ = no_panic("dequeue under a sliding limit", || {
        q.dequeue_batch(5).map(drop)
    })?;
    let _ = no_panic("rate_limited_until", || {
        q.reader().rate_limited_until(T0_MS + 100)
    })?;
    if let Ok(side) = no_panic("named", || q.named("side"))? {
        let _ = no_panic("side rate_limit", || side.rate_limit())?;
        let _ = no_panic("side dequeue", || side.dequeue().map(drop))?;
        let _ = no_panic("side set_rate_limit", || side.set_rate_limit(None))?;
        let _ = no_panic("side dequeue_batch", || side.dequeue_batch(3).map(drop))?;
    }
    Ok(())
}

/// The schedule calls: reads of every schedule (of the default queue and of "side"), then a
/// create, an update, an upsert and a remove, and a dequeue of "side" (which fires its due
/// schedule).
fn exercise_schedules(q: &Queue) -> Result<(), String> {
    let _ = no_panic("schedules", || q.schedules())?;
    for name in ["tick", "nightly", "gone", "new", "side-tick"] {
        let _ = no_panic("schedule", || q.schedule(name))?;
    }
    let _ = no_panic("upsert_schedule", || {
        q.upsert_schedule(
            "tick",
            &Schedule::every(Duration::from_secs(2)).payload(b"tock".to_vec()),
        )
    })?;
    let _ = no_panic("create_schedule", || {
        q.create_schedule("new", &Schedule::cron("*/5 * * * * *", "UTC"))
    })?;
    let _ = no_panic("update_schedule", || {
        q.update_schedule(
            "nightly",
            &Schedule::cron("0 4 * * *", "Europe/Berlin").missed(Missed::Skip),
        )
    })?;
    let _ = no_panic("remove_schedule", || q.remove_schedule("gone"))?;
    if let Ok(side) = no_panic("existing", || q.existing("side"))? {
        let _ = no_panic("side schedules", || side.schedules())?;
        let _ = no_panic("side upsert_schedule", || {
            side.upsert_schedule(
                "side-tick",
                &Schedule::every(Duration::from_secs(3)).payload(b"side v2".to_vec()),
            )
        })?;
        if let Ok(Some(l)) = no_panic("side dequeue", || side.dequeue())? {
            let _ = no_panic("side ack", || l.ack())?;
        }
    }
    Ok(())
}

/// The base image an input picks, with its edits applied, and the mode byte. With mode bit 2
/// the image is a (file, journal) pair of [`journaled_images`]; then an edit whose offset's
/// top bit (bit 23) is set goes to the journal, at its offset modulo the journal's bytes in
/// use plus 64 (so it lands in the header, a frame or just past the last one), and the
/// truncation (mode bit 3) cuts the journal to that many 256ths of those bytes (a torn tail).
/// Without bit 2 the journal is empty.
pub fn corrupted_image(data: &[u8]) -> Option<(u8, Vec<u8>, Vec<u8>)> {
    let (&mode, edits) = data.split_first()?;
    let ((mut image, mut journal), journaled) = if mode & 4 != 0 {
        let (clean, killed) = journaled_images(mode & 0x80 != 0);
        let pair = if mode & 1 == 0 { clean } else { killed };
        (pair.clone(), true)
    } else {
        let (clean, killed) = if mode & 0x80 == 0 {
            base_images()
        } else {
            scheduled_images()
        };
        let image = if mode & 1 == 0 { clean } else { killed };
        ((image.clone(), Vec::new()), false)
    };
    let journal_span = if journaled {
        journal_span(mode & 0x80 != 0, mode & 1 != 0)
    } else {
        0
    };
    for e in edits.chunks(4) {
        match *e {
            [a, b, c, x] => {
                let raw = u32::from_le_bytes([a, b, c, 0]) as usize;
                let x = if x == 0 { 0xFF } else { x };
                if journaled && c & 0x80 != 0 {
                    let i = (raw & 0x7F_FFFF) % journal_span.min(journal.len()).max(1);
                    if let Some(byte) = journal.get_mut(i) {
                        *byte ^= x;
                    }
                } else if !image.is_empty() {
                    let off = if a & 1 == 0 { raw % 16384 } else { raw };
                    let i = off % image.len();
                    image[i] ^= x;
                }
            }
            [a] if journaled && mode & 8 != 0 => {
                journal.truncate(journal_span * usize::from(a) / 256);
            }
            [a] => {
                let keep = image.len() * usize::from(a) / 256;
                image.truncate(keep);
            }
            _ => {}
        }
    }
    Some((mode, image, journal))
}

/// Opens and uses the corrupted image `data` describes. `Err` names a panic that came through
/// leaseq's API.
pub fn open_corrupt(data: &[u8]) -> Result<(), String> {
    match corrupted_image(data) {
        Some((mode, image, journal)) if mode & 4 != 0 => open_pair(mode, image, journal),
        Some((mode, image, _)) => open_image(mode, image),
        None => Ok(()),
    }
}

/// Flips bytes of the page of the cleanly closed base image that holds `leaseq_meta`'s
/// `format_version` row (its header and first entry offsets: the first `span` bytes) with each
/// of `xors`, opening every result on a `SimDisk`. `Err` names the first panic that came
/// through leaseq's API.
pub fn meta_page_sweep(span: usize, xors: &[u8]) -> Result<usize, String> {
    const PAGE: usize = 4096;
    let clean = &base_images().0;
    let needle = b"format_version";
    let at = clean
        .windows(needle.len())
        .position(|w| w == needle)
        .ok_or("no format_version row in the base image")?;
    let page = at / PAGE * PAGE;
    let mut opened = 0;
    for off in page..(page + span).min(clean.len()) {
        for &x in xors {
            let mut image = clean.clone();
            image[off] ^= x;
            open_image(0, image).map_err(|e| format!("byte {off} ^ {x:#04x}: {e}"))?;
            opened += 1;
        }
    }
    Ok(opened)
}

/// redb's page size in the base images.
pub const PAGE: usize = 4096;

/// The pages the clean close of the base image wrote (those that differ between the image
/// killed before the close and the cleanly closed one, redb's header page excluded): the
/// allocator state redb saves at close and the system-table pages that lead to it, what a
/// later open trusts without the integrity check.
pub fn close_written_pages() -> Vec<usize> {
    let (clean, killed) = base_images();
    (1..clean.len().div_ceil(PAGE))
        .filter(|&p| {
            let page = |img: &[u8]| {
                img.get(p * PAGE..((p + 1) * PAGE).min(img.len()))
                    .map(<[u8]>::to_vec)
            };
            page(clean) != page(killed)
        })
        .collect()
}

/// Flips bytes of the pages the clean close wrote ([`close_written_pages`]) in the cleanly
/// closed base image: each of the first `head` bytes of a page with every mask of `masks`,
/// then every `stride`-th byte with one mask (taken in turn); opens each result as `mode` says
/// (bit 1: on a `SimDisk` with `open_backend`, or from a file with `Queue::open`) and uses it.
/// Returns the number of images opened; `Err` names the first panic that came through
/// leaseq's API. (An abort kills the process: run this in a child process.)
pub fn close_written_sweep(
    mode: u8,
    head: usize,
    stride: usize,
    masks: &[u8],
) -> Result<usize, String> {
    let clean = &base_images().0;
    let pages = close_written_pages();
    if pages.is_empty() || masks.is_empty() {
        return Err("the sweep would test nothing".into());
    }
    let mut flips = Vec::new();
    for &p in &pages {
        let start = p * PAGE;
        let end = ((p + 1) * PAGE).min(clean.len());
        for off in start..(start + head).min(end) {
            flips.extend(masks.iter().map(|&x| (off, x)));
        }
        for (k, off) in (start + head..end).step_by(stride.max(1)).enumerate() {
            flips.push((off, masks[k % masks.len()]));
        }
    }
    for &(off, x) in &flips {
        let mut image = clean.clone();
        image[off] ^= x;
        open_image(mode & 2, image)
            .map_err(|e| format!("page {}, byte {off} ^ {x:#04x}: {e}", off / PAGE))?;
    }
    Ok(flips.len())
}

/// Opens the queue file `image` with its journal `journal` (on a `SimDisk` and a sibling on
/// its power line if bit 1 of `mode` is clear, else from a file and the journal file beside
/// it, first with a `Reader`, which replays the journal into its copy), then checks, reads,
/// drains and writes to it as [`open_image`].
pub fn open_pair(mode: u8, image: Vec<u8>, journal: Vec<u8>) -> Result<(), String> {
    let clock = ManualClock::new(T0_MS + 10_000);
    if mode & 2 == 0 {
        let disk = SimDisk::from_image(image, u64::from(mode));
        let jdisk = disk.sibling_from_image(journal, u64::from(mode) ^ 0x4a4f);
        let opened = no_panic("open_backends", || {
            builder(&clock).open_backends(disk.backend(), jdisk.backend())
        })?;
        if let Ok(q) = opened {
            exercise(&q, &clock)?;
            no_panic("drop", || drop(q))?;
        }
        return Ok(());
    }
    let dir = tmp_dir()?;
    let path = dir.path().join("q.leaseq");
    std::fs::write(&path, &image).map_err(|e| format!("write: {e}"))?;
    std::fs::write(dir.path().join("q.leaseq-journal"), &journal)
        .map_err(|e| format!("write journal: {e}"))?;
    if let Ok(r) = no_panic("Reader::open", || leaseq::Reader::open(&path))? {
        let _ = no_panic("reader stats", || r.stats())?;
        let _ = no_panic("reader jobs", || r.jobs(leaseq::JobState::Ready, None, 50))?;
        let _ = no_panic("reader schedules", || r.schedules())?;
        for id in 1..40 {
            let _ = no_panic("reader job", || r.job(JobId(id)))?;
        }
        no_panic("reader drop", || drop(r))?;
    }
    let opened = no_panic("open", || builder(&clock).open(&path))?;
    if let Ok(q) = opened {
        exercise(&q, &clock)?;
        no_panic("drop", || drop(q))?;
    }
    Ok(())
}

/// A directory for a run's files: on tmpfs when there is one (every commit fsyncs).
fn tmp_dir() -> Result<tempfile::TempDir, String> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .map_err(|e| format!("tempdir: {e}"))
}

/// Opens `image` (on a `SimDisk` if bit 1 of `mode` is clear, else from a file), then checks,
/// reads, drains and writes to it.
pub fn open_image(mode: u8, image: Vec<u8>) -> Result<(), String> {
    let clock = ManualClock::new(T0_MS + 10_000);
    if mode & 2 == 0 {
        let disk = SimDisk::from_image(image, u64::from(mode));
        let opened = no_panic("open_backend", || {
            builder(&clock).open_backend(disk.backend())
        })?;
        if let Ok(q) = opened {
            exercise(&q, &clock)?;
            no_panic("drop", || drop(q))?;
        }
    } else {
        let dir = tmp_dir()?;
        let path = dir.path().join("q.leaseq");
        std::fs::write(&path, &image).map_err(|e| format!("write: {e}"))?;
        let opened = no_panic("open", || builder(&clock).open(&path))?;
        if let Ok(q) = opened {
            exercise(&q, &clock)?;
            no_panic("drop", || drop(q))?;
        }
    }
    Ok(())
}
