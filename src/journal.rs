//! The write-ahead journal beside a queue file (the guide's durability chapter; its bytes
//! are `format::journal`).
//!
//! With the journal on, a group's changes to leaseq's tables are one checksummed frame,
//! written at the journal's tail and made durable by one `fdatasync` before any member of
//! the group is answered; redb commits the same changes without its own fsync
//! (`Durability::None`). A *checkpoint* is a durable redb commit that records the last frame
//! it holds (`journal_seq` in `leaseq_meta`); after one, frames start again at the front.
//! A group is a checkpoint instead of a frame when it carries a caller's own writes (they
//! cannot be replayed), when its frame would not fit, after `JOURNAL_FRAMES_MAX` frames or
//! `CHECKPOINT_INTERVAL`, and at flush, close and shutdown.
//!
//! At open, the frames after the file's `journal_seq` are replayed (in one transaction with
//! a durable commit) before anything else reads the file; replay stops at the first frame
//! that is torn, of another session, or not the next sequence number. Each writable open
//! draws a new session id: frames of an earlier session are never replayed twice, nor into
//! a copy of the file that went its own way.

use std::path::{Path, PathBuf};
use std::time::Instant;

use redb::{ReadableDatabase, ReadableTable, StorageBackend, WriteTransaction};

use crate::error::{Error, Result};
use crate::format::journal::{
    self as bytes, FRAMES_START, FrameBody, HEADER_BYTES, HeaderFound, decode_frame, decode_header,
};
use crate::format::schema::{META, META_JOURNAL_ID, META_JOURNAL_OPEN, META_JOURNAL_SEQ};
use crate::limits::{CHECKPOINT_INTERVAL, JOURNAL_BYTES, JOURNAL_FRAMES_MAX};

/// What the open found of the journal, in [`Recovery::journal`](crate::Recovery::journal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalFound {
    /// Nothing to replay: the journal is off, the file was closed cleanly, or nothing was
    /// journaled since its last checkpoint.
    #[default]
    Nothing,
    /// This many frames (group commits) were replayed into the file.
    Replayed(u64),
    /// The file was left open with its journal on, and the journal beside it is missing:
    /// what was journaled after the file's last checkpoint is not in the queue. A copy of
    /// the queue file alone is such a file (an older, consistent queue).
    Missing,
    /// The journal's frames are of a later checkpoint than the file holds (the file is an
    /// older copy put back beside a newer journal): not replayed, the file opened as it is.
    Ahead,
}

/// The journal's path beside the queue file `path`: `<name>-journal`, as SQLite's
/// `<name>-wal`.
pub(crate) fn path_beside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-journal");
    PathBuf::from(name)
}

/// Opens (creating it if missing) the journal file at `path` for reading and writing.
pub(crate) fn open_file(path: &Path) -> Result<Box<dyn StorageBackend>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let backend = redb::backends::FileBackend::new(file).map_err(redb::Error::from)?;
    Ok(Box::new(backend))
}

/// The journal file at `path` if it exists, opened for reading (a reader's replay).
pub(crate) fn open_existing(path: &Path) -> Result<Option<Box<dyn StorageBackend>>> {
    match std::fs::File::open(path) {
        Ok(file) => {
            let backend = redb::backends::FileBackend::new(file).map_err(redb::Error::from)?;
            Ok(Some(Box::new(backend)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The file's journal state as its `leaseq_meta` records it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MetaState {
    /// The session whose frames the file may need (0: none ever).
    pub id: u64,
    /// The last frame the file holds.
    pub seq: u64,
    /// Whether a session was journaling and did not close cleanly.
    pub open: bool,
}

impl MetaState {
    pub(crate) fn read(meta: &impl ReadableTable<&'static str, u64>) -> Result<MetaState> {
        let get = |k: &str| -> Result<u64> { Ok(meta.get(k)?.map_or(0, |v| v.value())) };
        Ok(MetaState {
            id: get(META_JOURNAL_ID)?,
            seq: get(META_JOURNAL_SEQ)?,
            open: get(META_JOURNAL_OPEN)? == 1,
        })
    }

    /// Writes this state into `tx`'s `leaseq_meta` (a checkpoint's record: never journaled).
    pub(crate) fn write(&self, tx: &WriteTransaction) -> Result<()> {
        let mut meta = tx.open_table(META)?;
        meta.insert(META_JOURNAL_ID, self.id)?;
        meta.insert(META_JOURNAL_SEQ, self.seq)?;
        meta.insert(META_JOURNAL_OPEN, u64::from(self.open))?;
        Ok(())
    }
}

/// The frames a journal holds for a file, read at open.
pub(crate) struct Scan {
    /// The journal's bytes from [`FRAMES_START`] (at most `JOURNAL_BYTES`).
    bytes: Vec<u8>,
    /// (sequence number, start, end) of each frame to replay, in order.
    frames: Vec<(u64, usize, usize)>,
    pub found: JournalFound,
}

impl Scan {
    /// Nothing to replay.
    pub(crate) fn nothing(found: JournalFound) -> Scan {
        Scan {
            bytes: Vec::new(),
            frames: Vec::new(),
            found,
        }
    }

    /// The last sequence number replay brings the file to (`state.seq` if none).
    pub(crate) fn last_seq(&self, state: MetaState) -> u64 {
        self.frames.last().map_or(state.seq, |f| f.0)
    }

    /// Applies every frame to replay to `tx`, in order.
    ///
    /// # Errors
    /// `Corrupted` if a checksummed frame does not decode or names a table's types wrongly;
    /// storage errors.
    pub(crate) fn apply(&self, tx: &WriteTransaction) -> Result<()> {
        for &(seq, start, end) in &self.frames {
            let body = &self.bytes[start..end];
            for change in bytes::changes(body)? {
                bytes::apply(tx, change).map_err(|e| match e {
                    Error::Corrupted { detail } => {
                        Error::corrupted(format!("journal frame {seq}: {detail}"))
                    }
                    other => other,
                })?;
            }
        }
        Ok(())
    }
}

/// Reads the journal `file` for a file whose meta state is `state`: the frames of session
/// `state.id` after `state.seq`, contiguous from the front, stopping at the first that is
/// not whole, not of the session, or not the next number.
///
/// # Errors
/// `NotLeaseq` when the file holds something other than a leaseq journal (not zeros, nor
/// a header of ours cut short while the file records no session);
/// `UnsupportedVersion` for a journal of a newer version the file may need; `Io`.
pub(crate) fn scan(
    file: Option<&dyn StorageBackend>,
    state: MetaState,
    path: &Path,
) -> Result<Scan> {
    let Some(file) = file else {
        return Ok(Scan::nothing(if state.open {
            JournalFound::Missing
        } else {
            JournalFound::Nothing
        }));
    };
    let len = file.len()?;
    let mut head = [0u8; HEADER_BYTES];
    let head_len = len.min(HEADER_BYTES as u64) as usize;
    file.read(0, &mut head[..head_len])?;
    match decode_header(&head[..head_len]) {
        HeaderFound::Journal => {}
        HeaderFound::OtherVersion(v) if state.open => {
            return Err(Error::UnsupportedVersion {
                found: u64::from(v),
                supported: u64::from(bytes::JOURNAL_VERSION),
            });
        }
        HeaderFound::OtherVersion(_) => return Ok(Scan::nothing(JournalFound::Nothing)),
        HeaderFound::NotJournal
            if head[..head_len].iter().all(|&b| b == 0)
                || (!state.open && bytes::is_torn_header(&head[..head_len])) =>
        {
            // Made but never written, or its header cut short (a crash or a failed write
            // while it was being made, before the file recorded its session): no frame.
            return Ok(Scan::nothing(if state.open {
                JournalFound::Missing
            } else {
                JournalFound::Nothing
            }));
        }
        HeaderFound::NotJournal => {
            return Err(Error::NotLeaseq {
                path: path.to_path_buf(),
                detail: "the file where its journal goes is not a leaseq journal".into(),
            });
        }
    }
    if !state.open || state.id == 0 || len <= FRAMES_START {
        return Ok(Scan::nothing(JournalFound::Nothing));
    }
    let end = len.min(FRAMES_START + JOURNAL_BYTES);
    let mut buf = vec![0u8; (end - FRAMES_START) as usize];
    file.read(FRAMES_START, &mut buf)?;
    let mut frames = Vec::new();
    let (mut at, mut prev) = (0usize, None::<u64>);
    while let Some(f) = decode_frame(&buf[at..], state.id) {
        if prev.is_some_and(|p| p.checked_add(1) != Some(f.seq)) {
            break;
        }
        if prev.is_none() && f.seq > state.seq.saturating_add(1) {
            // The first frame is after a checkpoint this file does not hold.
            return Ok(Scan::nothing(JournalFound::Ahead));
        }
        let body_start = at + bytes::FRAME_HEAD_BYTES;
        if f.seq > state.seq {
            frames.push((f.seq, body_start, body_start + f.body.len()));
        }
        prev = Some(f.seq);
        at += f.len;
    }
    let found = if frames.is_empty() {
        JournalFound::Nothing
    } else {
        JournalFound::Replayed(frames.len() as u64)
    };
    Ok(Scan {
        bytes: buf,
        frames,
        found,
    })
}

/// Replays into `db` the frames `file` holds after the file's last checkpoint, and with
/// `session` (the journal on) starts that session on `file`: all recorded in one durable
/// commit (the file's new checkpoint) before the open goes on. Off, and with nothing to
/// replay or record, nothing is written.
///
/// # Errors
/// As [`scan`]; `Corrupted` from a frame that does not apply; storage errors.
pub(crate) fn start_session(
    db: &redb::Database,
    file: Option<Box<dyn StorageBackend>>,
    session: Option<u64>,
    path: &Path,
) -> Result<(JournalFound, Option<Journal>)> {
    let state = {
        let rtx = db.begin_read()?;
        MetaState::read(&rtx.open_table(META)?)?
    };
    if !state.open && session.is_none() {
        // Nothing to replay, nothing to write: the journal's file is not looked at.
        return Ok((JournalFound::Nothing, None));
    }
    let scan = scan(file.as_deref(), state, path)?;
    let last = scan.last_seq(state);
    if !scan.frames.is_empty() || state.open {
        // The frames applied and durable in the file itself first: from here the journal
        // holds nothing the file needs.
        let tx = db.begin_write()?;
        scan.apply(&tx)?;
        MetaState {
            seq: last,
            open: false,
            ..state
        }
        .write(&tx)?;
        tx.commit()?;
    }
    let journal = match (session, file) {
        (Some(id), Some(file)) => match Journal::prepare(&*file) {
            Ok(()) => Some(Journal::new(file, id, last)),
            // No room for the journal: the queue works without it (every commit durable in
            // redb, as with the journal off) rather than not at all, and the room the
            // journal took is given back.
            Err(Error::Io(e)) if is_disk_full(&e) => {
                tracing::warn!(error = %e, "leaseq: no room for the journal, opened without it");
                let _ = file.set_len(0);
                None
            }
            Err(e) => return Err(e),
        },
        _ => None,
    };
    if let Some(j) = &journal {
        // The session recorded: its frames are the file's from now on.
        let tx = db.begin_write()?;
        j.state(true).write(&tx)?;
        tx.commit()?;
    }
    if let JournalFound::Replayed(n) = scan.found {
        tracing::info!(frames = n, last_seq = last, "leaseq: journal replayed");
    }
    if matches!(scan.found, JournalFound::Missing | JournalFound::Ahead) {
        tracing::warn!(found = ?scan.found, "leaseq: journal not replayed");
    }
    Ok((scan.found, journal))
}

/// Whether `e` says the disk or the user's quota is full.
fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// The journal of an open file: where the next frame goes and what it is numbered.
pub(crate) struct Journal {
    file: Box<dyn StorageBackend>,
    /// This session's id (in every frame).
    id: u64,
    /// Where the next frame is written.
    tail: u64,
    /// The last frame written (or, after a checkpoint, the last the file holds).
    last_seq: u64,
    /// Frames since the last checkpoint.
    frames: u64,
    checkpointed_at: Instant,
    /// The frame being written (kept to reuse its allocation).
    buf: Vec<u8>,
}

impl Journal {
    /// Makes `file` ready for a session: the header written if it is not a journal's yet,
    /// the file made `JOURNAL_BYTES` of written zeros past the header if it is shorter (so a
    /// frame's `fdatasync` needs no metadata), all of it durable.
    ///
    /// # Errors
    /// `Io` from the file (a full disk: `StorageFull`).
    pub(crate) fn prepare(file: &dyn StorageBackend) -> Result<()> {
        let len = file.len()?;
        let full = FRAMES_START + JOURNAL_BYTES;
        let mut head = [0u8; HEADER_BYTES];
        let head_len = len.min(HEADER_BYTES as u64) as usize;
        file.read(0, &mut head[..head_len])?;
        let mut wrote = false;
        if len < full {
            // A backend writes only within its length (redb's contract).
            file.set_len(full)?;
        }
        if !matches!(decode_header(&head[..head_len]), HeaderFound::Journal) {
            file.write(0, &bytes::encode_header())?;
            wrote = true;
        }
        if len < full {
            // Written zeros, not a hole: a write into a hole allocates blocks, which the
            // frame's `fdatasync` would then have to make durable too. A page at a time: a
            // large write makes large page-cache folios (2 MiB on Linux 6.x ext4), and a
            // frame written into one dirties, and is counted as writing, the whole folio.
            let zeros = vec![0u8; 4096];
            let mut at = len.max(HEADER_BYTES as u64);
            while at < full {
                let n = (full - at).min(zeros.len() as u64) as usize;
                file.write(at, &zeros[..n])?;
                at += n as u64;
            }
            wrote = true;
        }
        if wrote {
            file.sync_data()?;
        }
        Ok(())
    }

    /// Session `id` on a prepared `file`, its frames numbered from `last_seq + 1`.
    pub(crate) fn new(file: Box<dyn StorageBackend>, id: u64, last_seq: u64) -> Journal {
        Journal {
            file,
            id,
            tail: FRAMES_START,
            last_seq,
            frames: 0,
            checkpointed_at: Instant::now(),
            buf: Vec::new(),
        }
    }

    /// Whether the next group must be a checkpoint, before its frame is made: too many
    /// frames or too long since the last checkpoint.
    pub(crate) fn checkpoint_due(&self, now: Instant) -> bool {
        self.frames >= JOURNAL_FRAMES_MAX
            || now.saturating_duration_since(self.checkpointed_at) >= CHECKPOINT_INTERVAL
    }

    /// Writes `body` as the next frame at the tail and makes it durable (`fdatasync`).
    /// `Ok(false)` (nothing written) when the frame does not fit before the journal's end:
    /// the group must be a checkpoint.
    ///
    /// # Errors
    /// `Io` if the write or the sync fails: the frame's outcome is unknown.
    pub(crate) fn append(&mut self, body: &FrameBody) -> std::io::Result<bool> {
        let seq = self.last_seq + 1;
        body.encode_frame(seq, self.id, &mut self.buf);
        let end = self.tail + self.buf.len() as u64;
        if end > FRAMES_START + JOURNAL_BYTES {
            return Ok(false);
        }
        self.file.write(self.tail, &self.buf)?;
        self.file.sync_data()?;
        self.tail = end;
        self.last_seq = seq;
        self.frames += 1;
        Ok(true)
    }

    /// The meta state a checkpoint records now (`open`: the session goes on).
    pub(crate) fn state(&self, open: bool) -> MetaState {
        MetaState {
            id: self.id,
            seq: self.last_seq,
            open,
        }
    }

    /// A checkpoint recording [`Journal::state`] committed: frames start again at the front.
    pub(crate) fn checkpointed(&mut self) {
        self.tail = FRAMES_START;
        self.frames = 0;
        self.checkpointed_at = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    //! When a checkpoint is due: by count of frames, by time since the last one, and when
    //! the next frame does not fit.
    use super::*;
    use crate::format::journal::FrameBody;
    use redb::backends::InMemoryBackend;
    use std::time::Duration;

    fn journal() -> Journal {
        let file = InMemoryBackend::new();
        Journal::prepare(&file).unwrap();
        Journal::new(Box::new(file), 7, 0)
    }

    fn body(value_bytes: usize) -> FrameBody {
        let mut b = FrameBody::default();
        b.put("leaseq_meta", 1, b"k", &vec![3; value_bytes]);
        b
    }

    #[test]
    fn a_checkpoint_is_due_after_the_interval_and_not_before() {
        let mut j = journal();
        let at = j.checkpointed_at;
        assert!(j.append(&body(10)).unwrap());
        assert!(!j.checkpoint_due(at));
        assert!(!j.checkpoint_due(at + CHECKPOINT_INTERVAL - Duration::from_millis(1)));
        assert!(j.checkpoint_due(at + CHECKPOINT_INTERVAL));
        // A clock read before the last checkpoint (another thread's) is not "due".
        j.checkpointed();
        assert!(!j.checkpoint_due(at));
        assert!(j.checkpoint_due(j.checkpointed_at + CHECKPOINT_INTERVAL));
    }

    #[test]
    fn a_checkpoint_is_due_after_the_most_frames_and_restarts_the_count() {
        let mut j = journal();
        let at = j.checkpointed_at;
        for i in 0..JOURNAL_FRAMES_MAX {
            assert!(!j.checkpoint_due(at), "after {i} frames");
            assert!(j.append(&body(1)).unwrap());
        }
        assert!(j.checkpoint_due(at));
        assert_eq!(j.state(true).seq, JOURNAL_FRAMES_MAX);
        j.checkpointed();
        assert!(!j.checkpoint_due(j.checkpointed_at));
        // Numbering goes on after a checkpoint; the frames start again at the front.
        assert!(j.append(&body(1)).unwrap());
        assert_eq!(j.state(true).seq, JOURNAL_FRAMES_MAX + 1);
        assert_eq!(j.tail, FRAMES_START + (j.buf.len() as u64));
    }

    #[test]
    fn a_frame_that_does_not_fit_is_refused_and_writes_nothing() {
        let mut j = journal();
        let big = body(JOURNAL_BYTES as usize / 2);
        assert!(j.append(&big).unwrap());
        let (tail, seq) = (j.tail, j.last_seq);
        assert!(!j.append(&big).unwrap());
        assert_eq!((j.tail, j.last_seq, j.frames), (tail, seq, 1));
        j.checkpointed();
        assert!(j.append(&big).unwrap(), "fits again after a checkpoint");
    }

    #[test]
    fn a_header_cut_short_while_being_made_is_no_journal_and_another_file_is_refused() {
        let state = MetaState::default();
        let path = Path::new("q-journal");
        let full = bytes::encode_header();
        for cut in 1..HEADER_BYTES {
            let file = InMemoryBackend::new();
            file.set_len(FRAMES_START + JOURNAL_BYTES).unwrap();
            file.write(0, &full[..cut]).unwrap();
            let found = scan(Some(&file), state, path).map(|s| s.found);
            assert!(
                matches!(found, Ok(JournalFound::Nothing)),
                "cut at {cut}: {:?}",
                found.map_err(|e| e.to_string())
            );
            // Once the file records a session, a torn header is not taken for granted.
            let open = MetaState {
                id: 9,
                seq: 0,
                open: true,
            };
            assert!(
                scan(Some(&file), open, path).is_err(),
                "cut at {cut}, session open"
            );
        }
        let other = InMemoryBackend::new();
        other.set_len(4096).unwrap();
        other
            .write(0, b"not a journal at all, a user's file")
            .unwrap();
        assert!(matches!(
            scan(Some(&other), state, path),
            Err(Error::NotLeaseq { .. })
        ));
    }
}
