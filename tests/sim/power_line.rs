//! Files on one power line (`SimDisk::sibling`), as a queue's redb file and a journal beside
//! it: their mutating calls are counted together, power fails for all of them at one call, and
//! each file's crash image is drawn from its own seed and calls, as a file's alone.

use crate::simulator::{PINNED_IMAGES, fnv1a, pattern, pinned_workload};
use leaseq::sim::{SECTOR_SIZE, SimBackend, SimDisk};
use redb::{
    Builder, Database, ReadableDatabase, ReadableTable, StorageBackend, TableDefinition, TableError,
};
use std::collections::BTreeMap;
use std::io::{self, ErrorKind};
use std::ops::Bound;

const SECTOR: usize = SECTOR_SIZE as usize;

/// A mutating call of a scripted workload
#[derive(Debug, Clone, Copy)]
enum Call {
    Write { offset: usize, len: usize, tag: u8 },
    SetLen(usize),
    Sync,
}

impl Call {
    fn make(self, backend: &SimBackend) -> io::Result<()> {
        match self {
            Call::Write { offset, len, tag } => backend.write(offset as u64, &pattern(len, tag)),
            Call::SetLen(len) => backend.set_len(len as u64),
            Call::Sync => backend.sync_data(),
        }
    }

    /// What the call does to a live image when it succeeds
    fn apply(self, image: &mut Vec<u8>) {
        match self {
            Call::Write { offset, len, tag } => {
                image[offset..offset + len].copy_from_slice(&pattern(len, tag));
            }
            Call::SetLen(len) => image.resize(len, 0),
            Call::Sync => {}
        }
    }
}

/// The parts of `offset..offset + len` that fall in each sector, as (start, end) offsets
fn sector_pieces(offset: usize, len: usize) -> Vec<(usize, usize)> {
    let mut pieces = Vec::new();
    let mut start = offset;
    while start < offset + len {
        let end = ((start / SECTOR + 1) * SECTOR).min(offset + len);
        pieces.push((start, end));
        start = end;
    }
    pieces
}

fn assert_power_lost<T: std::fmt::Debug>(result: io::Result<T>, context: &str) {
    let err = result.expect_err(context);
    assert_eq!(err.kind(), ErrorKind::Other, "{context}: {err}");
}

// ---------------------------------------------------------------------------------------------
// Counting and failing together
// ---------------------------------------------------------------------------------------------

/// Ten calls on two files (0 and 1), interleaved
const SCRIPT: [(usize, Call); 10] = [
    (0, Call::SetLen(4 * SECTOR)),
    (1, Call::SetLen(4 * SECTOR)),
    (
        0,
        Call::Write {
            offset: 100,
            len: 900,
            tag: 1,
        },
    ),
    (
        1,
        Call::Write {
            offset: 0,
            len: 2000,
            tag: 2,
        },
    ),
    (1, Call::Sync),
    (
        0,
        Call::Write {
            offset: 1500,
            len: 400,
            tag: 3,
        },
    ),
    (0, Call::Sync),
    (
        1,
        Call::Write {
            offset: 700,
            len: 100,
            tag: 4,
        },
    ),
    (0, Call::SetLen(6 * SECTOR)),
    (1, Call::Sync),
];

#[test]
fn a_crash_counted_across_two_files_fails_the_call_it_counts_to() {
    let calls = SCRIPT.len();
    // `crash_at == calls` plans a crash the script never reaches
    for crash_at in 0..=calls {
        // The plan is made halfway to the crash point, through either file's handle
        for planner in 0..2 {
            let first = SimDisk::new(crash_at as u64);
            let files = [first.clone(), first.sibling(100 + crash_at as u64)];
            let backends = files.each_ref().map(SimDisk::backend);
            let planned_at = crash_at / 2;
            let (mut live, mut ops, mut syncs) = ([vec![], vec![]], [0, 0], [0, 0]);
            for (i, &(file, call)) in SCRIPT.iter().enumerate() {
                let context = format!("crash at {crash_at}, planned by {planner}, call {i}");
                if i == planned_at {
                    files[planner].crash_after((crash_at - planned_at) as u64);
                }
                assert_eq!(files[0].is_crashed(), i > crash_at, "{context}");
                let result = call.make(&backends[file]);
                if i < crash_at {
                    result.unwrap_or_else(|err| panic!("{context}: {err}"));
                    call.apply(&mut live[file]);
                    ops[file] += 1;
                    syncs[file] += u64::from(matches!(call, Call::Sync));
                } else {
                    assert_power_lost(result, &context);
                    // The failing call is counted on its file; none after it is
                    ops[file] += u64::from(i == crash_at);
                }
                assert_eq!(files[1].is_crashed(), i >= crash_at, "{context}");
            }
            let context = format!("crash at {crash_at}, planned by {planner}");
            for (f, file) in files.iter().enumerate() {
                assert_eq!(
                    file.live_image(),
                    live[f],
                    "{context}: file {f}'s live image"
                );
                assert_eq!(
                    file.file_mutating_ops(),
                    ops[f],
                    "{context}: file {f}'s calls"
                );
                assert_eq!(file.syncs(), syncs[f], "{context}: file {f}'s syncs");
                assert_eq!(
                    file.mutating_ops(),
                    (crash_at + 1).min(calls) as u64,
                    "{context}: the line's calls, asked of file {f}"
                );
            }
        }
    }
}

#[test]
fn after_a_crash_no_file_of_the_line_does_io() {
    for by_countdown in [true, false] {
        let first = SimDisk::from_image(pattern(2 * SECTOR, 1), 1);
        let second = first.sibling_from_image(pattern(2 * SECTOR, 2), 2);
        let third = second.sibling(3);
        let elsewhere = SimDisk::from_image(pattern(2 * SECTOR, 3), 4);
        let backends = [&first, &second, &third].map(SimDisk::backend);
        backends[0].write(0, &[9; 10]).unwrap();
        backends[1].write(0, &[8; 10]).unwrap();
        if by_countdown {
            // Planned through the third file, hitting the second's sync
            third.crash_after(1);
            backends[2].set_len(SECTOR_SIZE).unwrap();
            assert_power_lost(backends[1].sync_data(), "the planned call");
        } else {
            third.crash_now();
        }
        let line_ops = first.mutating_ops();
        assert_eq!(line_ops, if by_countdown { 4 } else { 2 });
        // A file added to a dead line is dead from the start
        let late = first.sibling_from_image(pattern(SECTOR, 5), 5);
        let files = [&first, &second, &third, &late];
        let before = files.map(|f| {
            (
                f.live_image(),
                f.durable_image(),
                f.crash_image(),
                f.file_mutating_ops(),
                f.syncs(),
            )
        });
        // Every backend of every file fails every I/O call: the ones made before the crash and
        // new ones
        for (f, file) in files.iter().enumerate() {
            assert!(file.is_crashed(), "file {f}");
            let handles = [backends.get(f).cloned(), Some(file.backend())];
            for backend in handles.iter().flatten() {
                let context = format!("by countdown {by_countdown}, file {f}");
                assert_power_lost(backend.len(), &context);
                assert_power_lost(backend.read(0, &mut [0; 4]), &context);
                assert_power_lost(backend.write(0, &[7; 4]), &context);
                assert_power_lost(backend.set_len(SECTOR_SIZE), &context);
                assert_power_lost(backend.sync_data(), &context);
                // Locks are the processes', not the disk's: they still work
                let range = (Bound::Included(0), Bound::Excluded(8));
                assert_eq!(backend.try_lock_range(range.0, range.1).ok(), Some(true));
                backend.unlock_range(range.0, range.1).unwrap();
            }
        }
        // A plan made after the crash does nothing, and no refused call changed anything
        second.crash_after(0);
        assert_eq!(
            first.mutating_ops(),
            line_ops,
            "calls after the crash counted"
        );
        for (f, file) in files.iter().enumerate() {
            let after = (
                file.live_image(),
                file.durable_image(),
                file.crash_image(),
                file.file_mutating_ops(),
                file.syncs(),
            );
            assert!(after == before[f], "file {f} changed after the crash");
        }
        // A file on another line has power
        assert!(!elsewhere.is_crashed());
        let backend = elsewhere.backend();
        backend.write(0, &[6; 10]).unwrap();
        backend.sync_data().unwrap();
        assert_eq!(elsewhere.mutating_ops(), 2);
    }
}

// ---------------------------------------------------------------------------------------------
// What each file's crash image keeps
// ---------------------------------------------------------------------------------------------

/// A journal's appends: records at the tail of a file preallocated, zeroed and synced, so every
/// write lands in room that is durable. Nothing moves the file's end: each sector a record
/// touches holds its bytes or the zeros before them, and a synced record sharing a sector with
/// an unsynced one stays whole.
#[test]
fn appends_into_preallocated_room_keep_or_lose_whole_sectors_and_never_move_the_end() {
    const ROOM: usize = 16 * SECTOR;
    let mut outcomes = BTreeMap::<&str, u32>::new();
    for seed in 0..400 {
        let mut rng = fastrand::Rng::with_seed(seed);
        // Preallocated by a synced set_len, or zeroed room read back after a reboot
        let disk = if seed.is_multiple_of(2) {
            let disk = SimDisk::new(seed);
            let backend = disk.backend();
            backend.set_len(ROOM as u64).unwrap();
            backend.sync_data().unwrap();
            disk
        } else {
            SimDisk::from_image(vec![0; ROOM], seed)
        };
        let log = disk.backend();
        let (mut tail, mut synced_end) = (0, 0);
        // The records written since the last sync, as (offset, bytes)
        let mut unsynced = Vec::new();
        for tag in 1..=10 {
            let record = pattern(rng.usize(600..1500), tag);
            if tail + record.len() > ROOM {
                break;
            }
            log.write(tail as u64, &record).unwrap();
            unsynced.push((tail, record.clone()));
            tail += record.len();
            if rng.u8(0..3) == 0 {
                log.sync_data().unwrap();
                (synced_end, unsynced) = (tail, Vec::new());
            }
        }
        disk.crash_now();
        let (image, live) = (disk.crash_image(), disk.live_image());
        assert_eq!(image.len(), ROOM, "seed {seed}: the file's end moved");
        assert!(image[..synced_end] == live[..synced_end], "seed {seed}");
        assert!(image[tail..].iter().all(|&b| b == 0), "seed {seed}");
        for (offset, record) in &unsynced {
            let (mut kept, mut lost) = (0, 0);
            for (start, end) in sector_pieces(*offset, record.len()) {
                let got = &image[start..end];
                if got == &record[start - offset..end - offset] {
                    kept += 1;
                } else {
                    assert!(
                        got.iter().all(|&b| b == 0),
                        "seed {seed}: the record at {offset} split at sector piece {start}"
                    );
                    lost += 1;
                }
            }
            let outcome = match (kept, lost) {
                (_, 0) => "kept",
                (0, _) => "dropped",
                _ => "torn",
            };
            *outcomes.entry(outcome).or_default() += 1;
        }
    }
    for outcome in ["kept", "dropped", "torn"] {
        let count = outcomes.get(outcome).copied().unwrap_or(0);
        assert!(
            count > 100,
            "unsynced records {outcome} {count} times: {outcomes:?}"
        );
    }
}

/// The data file (0) starts as a pattern and takes writes to slots, each once; the journal (1)
/// starts zeroed and takes appends at its tail. No two writes of a file overlap, so every byte
/// of a crash image is told apart.
const DATA_ROOM: usize = 12 * SECTOR;
const SLOT: usize = 700;
const JOURNAL_ROOM: usize = 16 * SECTOR;

fn initial_images() -> [Vec<u8>; 2] {
    [pattern(DATA_ROOM, 0xAA), vec![0; JOURNAL_ROOM]]
}

/// A random interleaving of writes and syncs on the data file and the journal
fn random_script(rng: &mut fastrand::Rng) -> Vec<(usize, Call)> {
    let mut slots: Vec<usize> = (0..DATA_ROOM / SLOT).collect();
    rng.shuffle(&mut slots);
    let mut tail = 0;
    let mut script = Vec::new();
    for tag in 1..=rng.u8(4..24) {
        let call = match rng.u8(0..4) {
            0 => slots.pop().map(|slot| {
                let len = rng.usize(1..=SLOT);
                (
                    0,
                    Call::Write {
                        offset: slot * SLOT,
                        len,
                        tag,
                    },
                )
            }),
            1 => {
                let len = rng.usize(1..1200);
                (tail + len <= JOURNAL_ROOM).then(|| {
                    tail += len;
                    (
                        1,
                        Call::Write {
                            offset: tail - len,
                            len,
                            tag,
                        },
                    )
                })
            }
            file => Some((usize::from(file - 2), Call::Sync)),
        };
        script.extend(call);
    }
    script
}

/// Runs `script` on a fresh line of the two files with crash images drawn from `seeds`, power
/// failing at the line's call `crash_at` (planned through file `planner`); returns the files
/// and, per call, whether it succeeded
fn run_script(
    script: &[(usize, Call)],
    seeds: [u64; 2],
    crash_at: usize,
    planner: usize,
) -> ([SimDisk; 2], Vec<bool>) {
    let [data, journal] = initial_images();
    let first = SimDisk::from_image(data, seeds[0]);
    let files = [first.clone(), first.sibling_from_image(journal, seeds[1])];
    files[planner].crash_after(crash_at as u64);
    let backends = files.each_ref().map(SimDisk::backend);
    let succeeded = script
        .iter()
        .map(|&(file, call)| call.make(&backends[file]).is_ok())
        .collect();
    (files, succeeded)
}

#[test]
fn each_files_crash_image_keeps_its_synced_writes_and_draws_its_unsynced_ones() {
    // Per file: unsynced writes kept, dropped, torn; and the data file's unsynced writes that
    // a later journal sync did not save
    let mut outcomes = [BTreeMap::<&str, u32>::new(), BTreeMap::new()];
    let mut lost_despite_journal_sync = 0;
    for seed in 0..500 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let script = random_script(&mut rng);
        let crash_at = rng.usize(0..=script.len());
        let (files, succeeded) = run_script(
            &script,
            [rng.u64(..), rng.u64(..)],
            crash_at,
            rng.usize(0..2),
        );
        for (i, &ok) in succeeded.iter().enumerate() {
            assert_eq!(
                ok,
                i < crash_at,
                "seed {seed}: call {i}, crash at {crash_at}"
            );
        }
        for file in &files {
            file.crash_now();
        }
        for (f, initial) in initial_images().into_iter().enumerate() {
            let calls: Vec<(usize, Call)> = script[..crash_at.min(script.len())]
                .iter()
                .enumerate()
                .filter(|(_, (file, _))| *file == f)
                .map(|(i, &(_, call))| (i, call))
                .collect();
            let last_sync = calls
                .iter()
                .rposition(|(_, call)| matches!(call, Call::Sync))
                .map_or(0, |p| p + 1);
            // The floor: the file as of its last sync. Synced writes are in it.
            let mut floor = initial;
            for (_, call) in &calls[..last_sync] {
                call.apply(&mut floor);
            }
            // Each sector piece of each unsynced write holds the write's bytes or the floor's
            let image = files[f].crash_image();
            let mut allowed = floor.clone();
            for &(i, call) in &calls[last_sync..] {
                let Call::Write { offset, len, tag } = call else {
                    unreachable!("only syncs end a file's calls: {call:?}");
                };
                let data = pattern(len, tag);
                let (mut kept, mut lost) = (0, 0);
                for (start, end) in sector_pieces(offset, len) {
                    let new = &data[start - offset..end - offset];
                    if image[start..end] == *new && floor[start..end] != *new {
                        allowed[start..end].copy_from_slice(new);
                        kept += 1;
                    } else {
                        lost += 1;
                    }
                }
                let outcome = match (kept, lost) {
                    (_, 0) => "kept",
                    (0, _) => "dropped",
                    _ => "torn",
                };
                *outcomes[f].entry(outcome).or_default() += 1;
                let journal_synced_after = script[i..crash_at.min(script.len())]
                    .iter()
                    .any(|&(file, call)| file == 1 && matches!(call, Call::Sync));
                if f == 0 && lost > 0 && journal_synced_after {
                    lost_despite_journal_sync += 1;
                }
            }
            assert!(
                image == allowed,
                "seed {seed}, crash at {crash_at}: file {f}'s crash image holds bytes the \
                 model does not allow (synced data lost, a sector split, or a failed write)"
            );
        }
    }
    for (f, outcomes) in outcomes.iter().enumerate() {
        for outcome in ["kept", "dropped", "torn"] {
            let count = outcomes.get(outcome).copied().unwrap_or(0);
            assert!(
                count > 20,
                "file {f}'s unsynced writes {outcome} {count} times"
            );
        }
    }
    assert!(
        lost_despite_journal_sync > 10,
        "a journal sync saved the data file's writes ({lost_despite_journal_sync} lost)"
    );
}

// ---------------------------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------------------------

#[test]
fn each_files_crash_image_is_a_function_of_its_seed_and_its_own_calls() {
    // Of the runs that leave the journal unsynced writes, those whose image the journal's seed
    // changed
    let (mut unsynced_runs, mut reseed_changed_it) = (0, 0);
    for seed in 0..100 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let script = random_script(&mut rng);
        let crash_at = rng.usize(0..=script.len());
        let seeds = [rng.u64(..), rng.u64(..)];
        let images = |files: &[SimDisk; 2]| files.each_ref().map(SimDisk::crash_image);

        let (files, _) = run_script(&script, seeds, crash_at, 0);
        let first = images(&files);
        assert_eq!(images(&files), first, "seed {seed}: asking again");
        let (again, _) = run_script(&script, seeds, crash_at, 1);
        assert_eq!(
            images(&again),
            first,
            "seed {seed}: the same seeds and calls"
        );

        // Another seed for the journal changes the journal's images only
        let (reseeded, _) = run_script(&script, [seeds[0], seeds[1] ^ 1], crash_at, 0);
        let reseeded = images(&reseeded);
        assert_eq!(
            reseeded[0], first[0],
            "seed {seed}: the journal's seed moved the data's"
        );
        if files[1].live_image() != files[1].durable_image() {
            unsynced_runs += 1;
            reseed_changed_it += u32::from(reseeded[1] != first[1]);
        }

        // The data file's calls alone, on a line of its own, give the same image
        let [data, _] = initial_images();
        let alone = SimDisk::from_image(data, seeds[0]);
        let backend = alone.backend();
        for &(file, call) in &script[..crash_at.min(script.len())] {
            if file == 0 {
                call.make(&backend).unwrap();
            }
        }
        assert_eq!(
            alone.crash_image(),
            first[0],
            "seed {seed}: the sibling moved it"
        );
    }
    assert!(
        unsynced_runs > 20 && reseed_changed_it * 2 > unsynced_runs,
        "seeds barely matter: {reseed_changed_it} of {unsynced_runs}"
    );
}

/// The pinned images of one file (`simulator::PINNED_IMAGES`) stay as they are when the file
/// shares its line, as its first file or a sibling, with a busy file making calls between its
/// own.
#[test]
fn a_files_pinned_crash_images_hold_beside_a_busy_sibling() {
    for (seed, &pinned) in PINNED_IMAGES.iter().enumerate() {
        let seed = seed as u64;
        for sibling_first in [false, true] {
            let (file, busy) = if sibling_first {
                let busy = SimDisk::new(seed + 1000);
                (busy.sibling(seed), busy)
            } else {
                let file = SimDisk::new(seed);
                let busy = file.sibling(seed + 1000);
                (file, busy)
            };
            let busy_backend = busy.backend();
            busy_backend.set_len(4 * SECTOR_SIZE).unwrap();
            let mut tag = 0;
            pinned_workload(&file.backend(), || {
                tag += 1;
                busy_backend
                    .write(u64::from(tag) * 100, &pattern(300, tag))
                    .unwrap();
                if tag.is_multiple_of(3) {
                    busy_backend.sync_data().unwrap();
                }
            });
            assert_eq!(file.file_mutating_ops(), 9);
            assert_eq!(file.mutating_ops(), 9 + 1 + 9 + 3);
            let image = file.crash_image();
            assert_eq!(
                (image.len(), fnv1a(&image)),
                pinned,
                "seed {seed}, sibling first {sibling_first}"
            );
        }
    }
}

#[test]
fn a_rebooted_line_starts_from_each_files_crash_image() {
    let mut rng = fastrand::Rng::with_seed(5);
    let script = random_script(&mut rng);
    let (files, _) = run_script(&script, [1, 2], script.len() / 2, 1);
    assert!(files[0].is_crashed());
    let images = files.each_ref().map(SimDisk::crash_image);

    let data = SimDisk::from_image(images[0].clone(), 3);
    let journal = data.sibling_from_image(images[1].clone(), 4);
    for (f, file) in [&data, &journal].into_iter().enumerate() {
        assert!(!file.is_crashed());
        assert_eq!(file.live_image(), images[f], "file {f}");
        assert_eq!(file.durable_image(), images[f], "file {f}");
        assert_eq!(file.crash_image(), images[f], "file {f}: nothing unsynced");
        assert_eq!((file.mutating_ops(), file.syncs()), (0, 0), "file {f}");
    }
    // One line again: a crash planned through the journal fails the data file's call
    journal.crash_after(1);
    journal.backend().write(0, &[1; 8]).unwrap();
    assert_power_lost(data.backend().sync_data(), "the data file's call");
    assert_power_lost(journal.backend().len(), "the journal after the crash");
}

// ---------------------------------------------------------------------------------------------
// redb and a journal on one line
// ---------------------------------------------------------------------------------------------

const ROWS: TableDefinition<u64, u64> = TableDefinition::new("rows");

/// The journal's record of round `i`: names the round, so a record moved or torn is caught
const RECORD: usize = 300;
const ROUNDS: usize = 6;

fn record(round: usize) -> Vec<u8> {
    pattern(RECORD, round as u8 + 1)
}

#[derive(Debug, Default)]
struct Rounds {
    /// Rounds `0..journaled` had their record's `sync_data` return Ok
    journaled: usize,
    /// Rounds `0..committed` had their commit return Ok
    committed: usize,
}

fn commit_row(db: &Database, round: usize) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(ROWS)?.insert(round as u64, round as u64)?;
    txn.commit()?;
    Ok(())
}

/// Write-ahead: each round appends its record to the journal and syncs it, then commits its row
/// to the database. Once a call on either file fails, the other file's next call must fail too.
fn journal_then_commit(db_file: &SimDisk, journal: &SimDisk) -> Rounds {
    let mut rounds = Rounds::default();
    let log = journal.backend();
    let db = match Builder::new().create_with_backend(db_file.backend()) {
        Ok(db) => db,
        Err(err) => {
            assert!(db_file.is_crashed(), "create failed without a crash: {err}");
            assert_power_lost(log.write(0, &record(0)), "the journal after the database");
            return rounds;
        }
    };
    for round in 0..ROUNDS {
        let appended = log
            .write((round * RECORD) as u64, &record(round))
            .and_then(|()| log.sync_data());
        if appended.is_err() {
            assert!(
                db_file.is_crashed(),
                "round {round}: the journal failed alone"
            );
            assert!(
                commit_row(&db, round).is_err(),
                "round {round}: a commit after the journal lost power"
            );
            break;
        }
        rounds.journaled = round + 1;
        if let Err(err) = commit_row(&db, round) {
            assert!(
                journal.is_crashed(),
                "round {round}: the commit failed alone: {err}"
            );
            assert_power_lost(log.len(), "the journal after the database");
            break;
        }
        rounds.committed = round + 1;
    }
    drop(db);
    rounds
}

/// The two files of a fresh line, the database's first on even seeds, the journal's otherwise
fn db_and_journal(seed: u64) -> (SimDisk, SimDisk) {
    let zeroed = vec![0; ROUNDS * RECORD];
    if seed.is_multiple_of(2) {
        let db_file = SimDisk::new(seed);
        let journal = db_file.sibling_from_image(zeroed, seed + 1000);
        (db_file, journal)
    } else {
        let journal = SimDisk::from_image(zeroed, seed + 1000);
        (journal.sibling(seed), journal)
    }
}

/// Every row a crash leaves in the database has its record in the journal (synced before the
/// commit began), and every Ok is kept in each file, at every crash point of the line.
#[test]
fn redb_and_a_journal_on_one_line_keep_what_each_synced() {
    let (dry_db, dry_journal) = db_and_journal(0);
    let full = journal_then_commit(&dry_db, &dry_journal);
    assert_eq!((full.journaled, full.committed), (ROUNDS, ROUNDS));
    let total_ops = dry_db.mutating_ops();
    assert_eq!(dry_journal.file_mutating_ops(), 2 * ROUNDS as u64);
    assert_eq!(total_ops, dry_db.file_mutating_ops() + 2 * ROUNDS as u64);

    let mut rows_kept_beyond_ok = 0;
    for crash_at in 0..total_ops {
        for seed in 0..4 {
            let context = format!("crash at {crash_at} of {total_ops}, seed {seed}");
            let (db_file, journal) = db_and_journal(seed);
            db_file.crash_after(crash_at);
            let rounds = journal_then_commit(&db_file, &journal);
            assert!(journal.is_crashed(), "{context}: no crash");

            let log = journal.crash_image();
            assert_eq!(
                log.len(),
                ROUNDS * RECORD,
                "{context}: the journal's end moved"
            );
            let records_present = (0..ROUNDS)
                .take_while(|&r| log[r * RECORD..][..RECORD] == record(r))
                .count();
            assert!(
                records_present >= rounds.journaled,
                "{context}: {records_present} records kept of {rounds:?}"
            );

            let rebooted = SimDisk::from_image(db_file.crash_image(), seed + 7);
            let rows = match Builder::new().create_with_backend(rebooted.backend()) {
                Ok(db) => read_rows(&db).unwrap_or_else(|err| panic!("{context}: {err}")),
                Err(err) => {
                    // Power failed while redb was making the file
                    assert!(
                        err.to_string().contains("Not a redb database"),
                        "{context}: {err}"
                    );
                    Vec::new()
                }
            };
            let present = rows.len();
            assert!(
                rows.iter().copied().eq(0..present as u64),
                "{context}: rows {rows:?} are not a prefix"
            );
            assert!(
                present >= rounds.committed,
                "{context}: {present} rows of {rounds:?}"
            );
            assert!(
                present <= rounds.journaled && present <= records_present,
                "{context}: {present} rows, but {records_present} records ({rounds:?})"
            );
            rows_kept_beyond_ok += u32::from(present > rounds.committed);
        }
    }
    println!("rows kept whose commit failed: {rows_kept_beyond_ok}");
}

/// The row keys of the table, or none if it was never created
fn read_rows(db: &Database) -> Result<Vec<u64>, redb::Error> {
    let read = db.begin_read()?;
    let table = match read.open_table(ROWS) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(err) => return Err(err.into()),
    };
    let mut keys = Vec::new();
    for row in table.iter()? {
        let (key, value) = row?;
        assert_eq!(key.value(), value.value(), "a row's value is its key");
        keys.push(key.value());
    }
    Ok(keys)
}
