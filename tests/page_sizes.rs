//! Issue 14, the out-of-memory finding: a damaged page number must never make an open allocate
//! a page size read from the damaged bytes. redb reads a page of `4096 << order` bytes, the
//! order taken from the page number (up to 20: 4 GiB), and allocates the buffer before the read
//! can fail; a plain open follows the table roots it finds without checking them. With the
//! integrity check on (the default), leaseq's look at the file is a verified open of a scratch
//! copy, which checks every page against its parent's checksum before following a pointer in
//! it, so the damage is `Corrupted` and never a large allocation.
//!
//! This test binary counts the bytes allocated (`stats_alloc` as its global allocator), so the
//! assertion is on memory asked for, not on the machine's patience.

use std::time::Duration;

use leaseq::{EnqueueOptions, Error, ManualClock, Queue};
use redb::TableDefinition;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const EFFECTS: TableDefinition<u64, u64> = TableDefinition::new("page_sizes_effects");
/// No open and use of a file this small may allocate more than this in all (redb reads pages of at most a few KiB here).
const ALLOCATION_LIMIT: usize = 256 << 20;
/// Byte 7 of a little-endian redb page number holds its order in its top 5 bits; XOR with this
/// turns order 0 into order 20 (a 4 GiB page).
const ORDER_20: u8 = 0b1010_0000;

fn builder(check: bool) -> leaseq::Builder {
    Queue::builder()
        .clock(ManualClock::new(1_700_000_000_000))
        .lease(Duration::from_secs(5))
        .check_integrity(check)
}

/// A small, cleanly closed queue file with jobs, a lease held at close, and an effect table.
fn clean_file(dir: &std::path::Path) -> Vec<u8> {
    let path = dir.join("base.leaseq");
    let q = builder(true).open(&path).unwrap();
    for i in 0..40u32 {
        q.enqueue(
            &vec![i as u8; 100 + i as usize * 40],
            EnqueueOptions::default(),
        )
        .unwrap();
    }
    for i in 0..10 {
        let l = q.dequeue().unwrap().unwrap();
        l.ack_with(|tx| {
            tx.open_table(EFFECTS)?.insert(i, i)?;
            Ok(())
        })
        .unwrap();
    }
    drop(q);
    std::fs::read(&path).unwrap()
}

/// Offsets of the pages holding leaseq's table names: the table tree's leaves, where each
/// table's definition (and its root page number) is stored.
fn table_tree_pages(image: &[u8]) -> Vec<usize> {
    let needle = b"leaseq_jobs";
    let mut pages: Vec<usize> = image
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| w == needle)
        .map(|(i, _)| i / 4096 * 4096)
        .collect();
    pages.dedup();
    pages
}

/// Turns every byte of those pages that could be the order byte of an order-0 page number
/// into order 20, opens each image with `Queue::open` and uses it (with `stop_at_first_huge`,
/// only until one allocated more than the limit). Returns (images opened,
/// images whose open or use allocated more than the limit, outcomes by kind).
fn sweep(
    check: bool,
    stop_at_first_huge: bool,
) -> (
    usize,
    usize,
    std::collections::BTreeMap<&'static str, usize>,
) {
    // The allocation counts are process-wide: one sweep at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let clean = clean_file(dir.path());
    let pages = table_tree_pages(&clean);
    assert!(!pages.is_empty(), "no table tree page found");
    let mut opened = 0;
    let mut huge = 0;
    let mut kinds = std::collections::BTreeMap::new();
    for page in pages {
        for off in page..(page + 4096).min(clean.len()) {
            if clean[off] != 0 {
                continue;
            }
            let mut image = clean.clone();
            image[off] ^= ORDER_20;
            let path = dir.path().join(format!("flip-{off}.leaseq"));
            std::fs::write(&path, &image).unwrap();
            let before = GLOBAL.stats();
            let outcome = std::panic::catch_unwind(|| {
                let q = builder(check).open(&path)?;
                q.check()?;
                q.stats()?;
                while let Some(l) = q.dequeue()? {
                    l.ack()?;
                }
                Ok::<_, Error>(())
            });
            let kind = match outcome {
                Ok(Ok(())) => "ok",
                Ok(Err(e)) => error_kind(&e),
                Err(_) => "PANIC",
            };
            *kinds.entry(kind).or_insert(0) += 1;
            // Counters wrap on 32-bit targets (the whole binary allocates more than 4 GiB):
            // the difference is right modulo 2^32, and one open here allocates far less.
            let allocated = GLOBAL
                .stats()
                .bytes_allocated
                .wrapping_sub(before.bytes_allocated);
            if allocated > ALLOCATION_LIMIT {
                huge += 1;
            }
            opened += 1;
            std::fs::remove_file(&path).unwrap();
            if huge > 0 && stop_at_first_huge {
                return (opened, huge, kinds);
            }
        }
    }
    (opened, huge, kinds)
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Corrupted { .. } => "Corrupted",
        Error::NotLeaseq { .. } => "NotLeaseq",
        Error::Storage(_) => "Storage",
        Error::Io(_) => "Io",
        _ => "other",
    }
}

/// A sweep's result: enough images opened, none allocated a huge page, none panicked.
fn assert_never_huge(
    (opened, huge, kinds): (
        usize,
        usize,
        std::collections::BTreeMap<&'static str, usize>,
    ),
) {
    assert!(opened > 50, "the sweep opened only {opened} images");
    assert_eq!(
        huge, 0,
        "{huge} of {opened} opens allocated > 256 MiB: {kinds:?}"
    );
    assert!(!kinds.contains_key("PANIC"), "{kinds:?}");
}

#[test]
fn a_damaged_page_order_never_makes_an_open_allocate_its_size() {
    assert_never_huge(sweep(true, false));
}

/// The sweep reaches the kind of damage: with the check off, leaseq trusts the file and some
/// images make redb allocate a page of up to 4 GiB (the documented cost of turning it off).
/// On a 32-bit target the check cannot be turned off (such an allocation would abort the
/// process there): the same sweep allocates nothing huge and every image is an answer.
#[test]
fn without_the_check_the_same_sweep_reaches_huge_allocations() {
    if cfg!(target_pointer_width = "32") {
        assert_never_huge(sweep(false, false));
        return;
    }
    let (opened, huge, kinds) = sweep(false, true);
    assert!(
        huge > 0,
        "no open of {opened} allocated > 256 MiB: {kinds:?}"
    );
}
