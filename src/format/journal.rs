//! The journal's bytes (docs/format.md, "The journal"): its header, its frames, the changes a
//! frame holds, and the table types a change may name (a code per key and value type,
//! never reused). What writes and reads the journal file is `crate::journal`; this module
//! turns values into bytes and bytes into values, with every length checked against the
//! bytes it came from (nothing read off disk sizes an allocation).
//!
//! A frame is one group commit's changes to leaseq's tables: each a `put` (table, key,
//! value), a `remove` (table, key) or a `create` (table), in the order the group made them.
//! Replaying a frame writes the same values again: a change sets a key's value (or its
//! absence), so replaying frames the file already holds changes nothing (as a redo log's
//! physical records, in the manner of SQLite's WAL frames holding whole pages).

use redb::{Key, TableDefinition, Value, WriteTransaction};
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};

/// The journal header's magic bytes (offset 0).
pub(crate) const HEADER_MAGIC: [u8; 8] = *b"LEASEQJL";
/// The journal format version this build writes and reads.
pub(crate) const JOURNAL_VERSION: u32 = 1;
/// The header's bytes: magic (8), version (4), reserved (12, zeros), checksum (8). Which
/// session a frame belongs to is in the frame: the header is written once, when the journal
/// is made.
pub(crate) const HEADER_BYTES: usize = 32;
/// Where the first frame starts: the header has a block of its own, so a frame's write never
/// shares a 4 KiB block with it.
pub(crate) const FRAMES_START: u64 = 4096;
/// A frame's magic number (`LQFR`).
const FRAME_MAGIC: u32 = 0x4c51_4652;
/// A frame's head: magic (4), body length (4), sequence number (8), session id (8).
pub(crate) const FRAME_HEAD_BYTES: usize = 24;
/// A frame's tail: the XXH3-64 of its head and body.
pub(crate) const FRAME_TAIL_BYTES: usize = 8;

const OP_DECLARE: u8 = 0;
const OP_PUT: u8 = 1;
const OP_REMOVE: u8 = 2;
const OP_CREATE: u8 = 3;
/// Longest table name a frame may declare (leaseq's are at most ~30 bytes).
const TABLE_NAME_MAX: usize = 64;
/// Most tables one frame may declare.
const FRAME_TABLES_MAX: usize = 1024;

/// The header bytes of a journal.
pub(crate) fn encode_header() -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[..8].copy_from_slice(&HEADER_MAGIC);
    out[8..12].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
    let sum = xxh3_64(&out[..24]);
    out[24..32].copy_from_slice(&sum.to_le_bytes());
    out
}

/// Whether `bytes` (a header's length, else `false`) are a header write of this version cut
/// short over zeros: each byte zero or the header's own (a write that failed after a part
/// of it reached the file). Such a journal was being made and holds no frame.
pub(crate) fn is_torn_header(bytes: &[u8]) -> bool {
    let Some(h) = bytes.get(..HEADER_BYTES) else {
        return false;
    };
    let full = encode_header();
    h.iter().zip(full).all(|(&b, e)| b == 0 || b == e) && h.iter().any(|&b| b != 0)
}

/// What a journal's first bytes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderFound {
    /// A journal of version [`JOURNAL_VERSION`].
    Journal,
    /// A leaseq journal of another version.
    OtherVersion(u32),
    /// No journal header: zeros, torn, or another kind of file.
    NotJournal,
}

/// Reads a journal header (`bytes` at least [`HEADER_BYTES`] long, else `NotJournal`).
pub(crate) fn decode_header(bytes: &[u8]) -> HeaderFound {
    let Some(h) = bytes.get(..HEADER_BYTES) else {
        return HeaderFound::NotJournal;
    };
    if h[..8] != HEADER_MAGIC
        || u64::from_le_bytes(h[24..32].try_into().expect("8")) != xxh3_64(&h[..24])
    {
        return HeaderFound::NotJournal;
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4"));
    if version != JOURNAL_VERSION {
        return HeaderFound::OtherVersion(version);
    }
    HeaderFound::Journal
}

/// The changes of one group, encoded as they are made: the body of the frame its seal writes.
#[derive(Default)]
pub(crate) struct FrameBody {
    body: Vec<u8>,
    /// The tables declared so far: where each name is in the body (start, length); a
    /// table's index is its place here.
    tables: Vec<(usize, usize)>,
    changes: u32,
}

impl FrameBody {
    /// Whether no change was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.changes == 0
    }

    /// The index of table `name` (of type code `code`), declared on its first use.
    fn table(&mut self, name: &str, code: u8) -> u16 {
        let body = &self.body;
        if let Some(i) = self
            .tables
            .iter()
            .position(|&(at, n)| &body[at..at + n] == name.as_bytes())
        {
            return i as u16;
        }
        debug_assert!(name.len() <= TABLE_NAME_MAX && self.tables.len() < FRAME_TABLES_MAX);
        self.body.push(OP_DECLARE);
        self.body.push(code);
        self.body.push(name.len() as u8);
        self.tables.push((self.body.len(), name.len()));
        self.body.extend_from_slice(name.as_bytes());
        (self.tables.len() - 1) as u16
    }

    fn bytes(&mut self, b: &[u8]) {
        self.body.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.body.extend_from_slice(b);
    }

    /// Records `key` → `value` in table `name`.
    pub(crate) fn put(&mut self, name: &str, code: u8, key: &[u8], value: &[u8]) {
        let t = self.table(name, code);
        self.body.push(OP_PUT);
        self.body.extend_from_slice(&t.to_le_bytes());
        self.bytes(key);
        self.bytes(value);
        self.changes += 1;
    }

    /// Records the removal of `key` from table `name`.
    pub(crate) fn remove(&mut self, name: &str, code: u8, key: &[u8]) {
        let t = self.table(name, code);
        self.body.push(OP_REMOVE);
        self.body.extend_from_slice(&t.to_le_bytes());
        self.bytes(key);
        self.changes += 1;
    }

    /// Records that table `name` exists (created if it did not).
    pub(crate) fn create(&mut self, name: &str, code: u8) {
        let t = self.table(name, code);
        self.body.push(OP_CREATE);
        self.body.extend_from_slice(&t.to_le_bytes());
        self.changes += 1;
    }

    /// The whole frame: sequence number `seq` of journal session `session`, written into
    /// `out` (cleared first).
    pub(crate) fn encode_frame(&self, seq: u64, session: u64, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(FRAME_HEAD_BYTES + self.body.len() + FRAME_TAIL_BYTES);
        out.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
        out.extend_from_slice(&(self.body.len() as u32).to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&session.to_le_bytes());
        out.extend_from_slice(&self.body);
        let sum = xxh3_64(out);
        out.extend_from_slice(&sum.to_le_bytes());
    }
}

/// A frame found at an offset of the journal: its sequence number, its body, and its whole
/// length in bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    pub seq: u64,
    pub body: &'a [u8],
    pub len: usize,
}

/// The frame at the start of `bytes` if there is a whole one, checksum verified, of the
/// journal session `session`; `None` for anything else (zeros, a torn or foreign frame, the
/// end of the bytes). Replay stops there.
pub(crate) fn decode_frame(bytes: &[u8], session: u64) -> Option<Frame<'_>> {
    let head = bytes.get(..FRAME_HEAD_BYTES)?;
    let word = |r: std::ops::Range<usize>| -> u64 {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&head[r]);
        u64::from_le_bytes(b)
    };
    if word(0..4) != u64::from(FRAME_MAGIC) || word(16..24) != session {
        return None;
    }
    let body_len = usize::try_from(word(4..8)).ok()?;
    let len = FRAME_HEAD_BYTES
        .checked_add(body_len)?
        .checked_add(FRAME_TAIL_BYTES)?;
    let whole = bytes.get(..len)?;
    let (covered, tail) = whole.split_at(len - FRAME_TAIL_BYTES);
    if u64::from_le_bytes(tail.try_into().ok()?) != xxh3_64(covered) {
        return None;
    }
    Some(Frame {
        seq: word(8..16),
        body: &covered[FRAME_HEAD_BYTES..],
        len,
    })
}

/// One change of a frame, as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    Put {
        table: &'a str,
        code: u8,
        key: &'a [u8],
        value: &'a [u8],
    },
    Remove {
        table: &'a str,
        code: u8,
        key: &'a [u8],
    },
    Create {
        table: &'a str,
        code: u8,
    },
}

/// The changes of a frame's body, in order; `Corrupted` at the first one that does not
/// decode (a checksummed frame that does not decode was not written by leaseq).
pub(crate) fn changes(body: &[u8]) -> Result<Vec<Change<'_>>> {
    let bad = |what: &str| Error::corrupted(format!("journal frame: {what}"));
    let mut tables: Vec<(&str, u8)> = Vec::new();
    let mut out = Vec::new();
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<&[u8]> {
        let end = at.checked_add(n).ok_or_else(|| bad("length overflows"))?;
        let s = body
            .get(*at..end)
            .ok_or_else(|| bad("ends inside a change"))?;
        *at = end;
        Ok(s)
    };
    let len32 = |at: &mut usize| -> Result<usize> {
        let b = take(at, 4)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4")) as usize)
    };
    while at < body.len() {
        let op = take(&mut at, 1)?[0];
        if op == OP_DECLARE {
            let code = take(&mut at, 1)?[0];
            let n = take(&mut at, 1)?[0] as usize;
            let name = std::str::from_utf8(take(&mut at, n)?).map_err(|_| bad("table name"))?;
            if !name.starts_with("leaseq_") || n > TABLE_NAME_MAX {
                return Err(bad(&format!("table {name:?} is not leaseq's")));
            }
            if !known_code(code) {
                return Err(bad(&format!("unknown table type {code}")));
            }
            if tables.len() >= FRAME_TABLES_MAX || tables.iter().any(|(t, _)| *t == name) {
                return Err(bad("table declared twice or too many tables"));
            }
            tables.push((name, code));
            continue;
        }
        let t = take(&mut at, 2)?;
        let (table, code) = *tables
            .get(u16::from_le_bytes(t.try_into().expect("2")) as usize)
            .ok_or_else(|| bad("undeclared table"))?;
        out.push(match op {
            OP_PUT => {
                let k = len32(&mut at)?;
                let key = take(&mut at, k)?;
                let v = len32(&mut at)?;
                let value = take(&mut at, v)?;
                Change::Put {
                    table,
                    code,
                    key,
                    value,
                }
            }
            OP_REMOVE => {
                let k = len32(&mut at)?;
                let key = take(&mut at, k)?;
                Change::Remove { table, code, key }
            }
            OP_CREATE => Change::Create { table, code },
            other => return Err(bad(&format!("unknown change {other}"))),
        });
    }
    Ok(out)
}

/// Applies `change` to `tx` with the key and value types its code names.
///
/// # Errors
/// `Corrupted` if its bytes are not a value of those types (a key or value of the wrong
/// width, an unknown code), or if redb refuses the table's types; storage errors.
pub(crate) fn apply(tx: &WriteTransaction, change: Change<'_>) -> Result<()> {
    let code = match change {
        Change::Put { code, .. } | Change::Remove { code, .. } | Change::Create { code, .. } => {
            code
        }
    };
    dispatch(code, tx, change)
}

/// Applies one change with types `K`, `V`.
fn apply_typed<K: Key + 'static, V: Value + 'static>(
    tx: &WriteTransaction,
    change: Change<'_>,
) -> Result<()> {
    let width = |fixed: Option<usize>, bytes: &[u8], what: &str| -> Result<()> {
        match fixed {
            Some(w) if w != bytes.len() => Err(Error::corrupted(format!(
                "journal frame: a {what} of {} bytes for a type of {w}",
                bytes.len()
            ))),
            _ => Ok(()),
        }
    };
    let open = |name: &str| -> Result<redb::Table<'_, K, V>> {
        tx.open_table(TableDefinition::<K, V>::new(name))
            .map_err(|e| match e {
                redb::TableError::TableTypeMismatch { .. }
                | redb::TableError::TypeDefinitionChanged { .. }
                | redb::TableError::TableIsMultimap(_) => {
                    Error::corrupted(format!("journal frame: table {name}: {e}"))
                }
                other => other.into(),
            })
    };
    match change {
        Change::Put {
            table, key, value, ..
        } => {
            width(K::fixed_width(), key, "key")?;
            width(V::fixed_width(), value, "value")?;
            open(table)?.insert(K::from_bytes(key), V::from_bytes(value))?;
        }
        Change::Remove { table, key, .. } => {
            width(K::fixed_width(), key, "key")?;
            open(table)?.remove(K::from_bytes(key))?;
        }
        Change::Create { table, .. } => {
            open(table)?;
        }
    }
    Ok(())
}

/// The table types a change may name: code → (key type, value type). Codes are part of the
/// format: never reused or renumbered, only added.
macro_rules! table_types {
    ($($code:literal => ($k:ty, $v:ty),)*) => {
        /// The code of key type `K` and value type `V`, if a frame may name them.
        pub(crate) fn type_code<K: 'static, V: 'static>() -> Option<u8> {
            use std::any::TypeId;
            let pair = (TypeId::of::<K>(), TypeId::of::<V>());
            $(if pair == (TypeId::of::<$k>(), TypeId::of::<$v>()) {
                return Some($code);
            })*
            None
        }

        fn known_code(code: u8) -> bool {
            [$($code),*].contains(&code)
        }

        fn dispatch(code: u8, tx: &WriteTransaction, change: Change<'_>) -> Result<()> {
            match code {
                $($code => apply_typed::<$k, $v>(tx, change),)*
                other => Err(Error::corrupted(format!("journal frame: unknown table type {other}"))),
            }
        }
    };
}

table_types! {
    1 => (&'static str, u64),
    2 => (&'static str, u32),
    3 => (u32, u64),
    4 => (u32, (u64, u64)),
    5 => ((u32, &'static str), &'static [u8]),
    6 => ((u32, u64, &'static str), ()),
    7 => ((u32, u64), u64),
    8 => (u32, (u64, u64, u64, u64)),
    9 => ((u32, u8, u64), u64),
    10 => (u64, &'static [u8]),
    11 => ((u32, u64, u64), ()),
    12 => ((u64, u64), ()),
    13 => (u64, ()),
    14 => (&'static [u8], u64),
    15 => ((u64, &'static [u8]), ()),
    16 => ((&'static [u8], u64), ()),
    17 => ((&'static [u8], u64), u64),
    18 => (u64, (u64, &'static str, &'static [u8])),
    19 => ((u32, u64, u8), u64),
    20 => ((u32, u64, u64), u64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::schema::{self, DEFAULT_SCHEMA, QueueSchema};

    fn code_of<K: Key + 'static, V: Value + 'static>(def: TableDefinition<K, V>) -> (String, u8) {
        let name = redb::TableHandle::name(&def).to_string();
        let code = type_code::<K, V>().unwrap_or_else(|| panic!("{name} has no type code"));
        (name, code)
    }

    /// Every table leaseq writes has a type code, so a group writing it can be journaled.
    #[test]
    fn every_leaseq_table_has_a_type_code() {
        let mut all = vec![
            code_of(schema::META),
            code_of(schema::QUEUES),
            code_of(schema::PAUSED),
            code_of(schema::HISTORY_LIMITS),
            code_of(schema::SCHEDULES),
            code_of(schema::SCHEDULE_DUE),
            code_of(schema::SCHEDULE_INSTANCES),
            code_of(schema::RATE_LIMITS),
            code_of(schema::METRICS),
            code_of(schema::RUN_TIMES),
            code_of(schema::QUEUE_LIMITS),
            code_of(schema::DROPPED),
            code_of(schema::GROUP_FENCES),
            code_of(schema::SLIDING_LIMITS),
            code_of(schema::RATE_LOG),
        ];
        for s in [&DEFAULT_SCHEMA, QueueSchema::named(3)] {
            all.extend([
                code_of(s.jobs()),
                code_of(s.ready()),
                code_of(s.scheduled()),
                code_of(s.leases()),
                code_of(s.dead()),
                code_of(s.dead_by_time()),
                code_of(s.dedup()),
                code_of(s.dedup_windows()),
                code_of(s.dedup_expiry()),
                code_of(s.applied()),
                code_of(s.applied_by_time()),
                code_of(s.idem_jobs()),
                code_of(s.payloads()),
                code_of(s.quarantine()),
                code_of(s.completed()),
                code_of(s.cancelled()),
                code_of(s.groups()),
                code_of(s.held()),
            ]);
        }
        assert_eq!(all.len(), 15 + 2 * 18);
        assert!(all.iter().all(|(_, c)| known_code(*c)));
        assert_eq!(type_code::<u64, u64>(), None, "a caller's type has no code");
    }

    #[test]
    fn a_frame_reads_back_as_written_and_any_flipped_bit_is_refused() {
        let mut body = FrameBody::default();
        body.create("leaseq_jobs", 10);
        body.put("leaseq_jobs", 10, &7u64.to_le_bytes(), b"row");
        body.remove("leaseq_ready", 11, &[1; 20]);
        body.put("leaseq_jobs", 10, &8u64.to_le_bytes(), b"");
        let mut frame = Vec::new();
        body.encode_frame(42, 0xfeed, &mut frame);
        let f = decode_frame(&frame, 0xfeed).expect("a whole frame");
        assert_eq!((f.seq, f.len), (42, frame.len()));
        let c = changes(f.body).unwrap();
        assert_eq!(
            c,
            vec![
                Change::Create {
                    table: "leaseq_jobs",
                    code: 10
                },
                Change::Put {
                    table: "leaseq_jobs",
                    code: 10,
                    key: &7u64.to_le_bytes(),
                    value: b"row"
                },
                Change::Remove {
                    table: "leaseq_ready",
                    code: 11,
                    key: &[1; 20]
                },
                Change::Put {
                    table: "leaseq_jobs",
                    code: 10,
                    key: &8u64.to_le_bytes(),
                    value: b""
                },
            ]
        );
        assert_eq!(decode_frame(&frame, 0xbeef), None, "another file's frame");
        assert_eq!(decode_frame(&frame[..frame.len() - 1], 0xfeed), None, "cut");
        for bit in 0..frame.len() * 8 {
            let mut bad = frame.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_frame(&bad, 0xfeed), None, "bit {bit} flipped");
        }
    }

    #[test]
    fn a_body_that_does_not_decode_is_corrupted_never_a_panic() {
        let mut body = FrameBody::default();
        body.put("leaseq_jobs", 10, &7u64.to_le_bytes(), b"row");
        let good = body.body.clone();
        // Only a cut between records (before anything, after the table's declaration)
        // decodes; every other cut is an error.
        let declared = 3 + "leaseq_jobs".len();
        for cut in 0..good.len() {
            let ok = changes(&good[..cut]).is_ok();
            assert_eq!(ok, cut == 0 || cut == declared, "cut at {cut}");
        }
        for (at, byte) in [(1, 99u8), (2, 200), (0, 9)] {
            let mut bad = good.clone();
            bad[at] = byte;
            assert!(changes(&bad).is_err(), "byte {at} set to {byte}");
        }
        // A foreign table name is refused, whatever its type code.
        let mut foreign = vec![OP_DECLARE, 10, 5];
        foreign.extend_from_slice(b"users");
        assert!(changes(&foreign).is_err());
    }

    #[test]
    fn the_header_names_its_version() {
        let h = encode_header();
        assert_eq!(decode_header(&h), HeaderFound::Journal);
        assert_eq!(decode_header(&[0; HEADER_BYTES]), HeaderFound::NotJournal);
        assert_eq!(decode_header(&h[..10]), HeaderFound::NotJournal);
        let mut other = h;
        other[8] = 2;
        let sum = xxh3_64(&other[..24]);
        other[24..32].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(decode_header(&other), HeaderFound::OtherVersion(2));
    }
}
