//! The row of `leaseq_queue_limits` (since format 13): a queue's size limit and the payload
//! bytes of the jobs it counts, as `(max_jobs, max_bytes, when_full, counted_bytes)`.
//!
//! - `max_jobs`, `max_bytes`: the bound, 0 for none of that kind (a limit has at least one).
//! - `when_full`: the low 8 bits say what a full queue does (0 refuse, 1 block, 2 drop the
//!   oldest); for block, the bits above are the longest wait in ms (1 to one hour).
//! - `counted_bytes`: the payload bytes of the queue's scheduled, ready and leased jobs,
//!   kept by every commit that moves a job in or out of those states while the row exists
//!   (computed from the jobs when the row is made).

use crate::error::{Error, Result};
use crate::queue_limit::{QueueLimit, WhenFull};

/// The stored row: (max_jobs, max_bytes, when_full, counted_bytes).
pub(crate) type LimitRow = (u64, u64, u64, u64);

/// The longest wait of [`WhenFull::Block`], in ms (one hour).
pub(crate) const BLOCK_WAIT_MAX_MS: u64 = 3_600_000;

const REFUSE: u64 = 0;
const BLOCK: u64 = 1;
const DROP_OLDEST: u64 = 2;

/// The row of `limit` with `counted_bytes`. The limit was validated.
pub(crate) fn encode(limit: &QueueLimit, counted_bytes: u64) -> LimitRow {
    debug_assert!(limit.max_jobs.is_some() || limit.max_bytes.is_some());
    let when_full = match limit.when_full {
        WhenFull::Refuse => REFUSE,
        WhenFull::Block { wait_ms } => {
            debug_assert!((1..=BLOCK_WAIT_MAX_MS).contains(&wait_ms));
            BLOCK | (wait_ms << 8)
        }
        WhenFull::DropOldest => DROP_OLDEST,
    };
    (
        limit.max_jobs.unwrap_or(0),
        limit.max_bytes.unwrap_or(0),
        when_full,
        counted_bytes,
    )
}

/// The limit a row holds, checked: `Corrupted` for a row no build writes (no bound, an
/// unknown choice, a wait out of range).
pub(crate) fn decode(queue_number: u32, row: LimitRow) -> Result<QueueLimit> {
    let (max_jobs, max_bytes, when_full, _) = row;
    let bad = |what: &str| {
        Error::corrupted(format!(
            "leaseq_queue_limits row of queue {queue_number}: {what}"
        ))
    };
    if max_jobs == 0 && max_bytes == 0 {
        return Err(bad("no bound"));
    }
    let when_full = match (when_full & 0xff, when_full >> 8) {
        (REFUSE, 0) => WhenFull::Refuse,
        (DROP_OLDEST, 0) => WhenFull::DropOldest,
        (BLOCK, wait_ms) if (1..=BLOCK_WAIT_MAX_MS).contains(&wait_ms) => {
            WhenFull::Block { wait_ms }
        }
        _ => return Err(bad(&format!("when_full {when_full:#x}"))),
    };
    Ok(QueueLimit {
        max_jobs: (max_jobs != 0).then_some(max_jobs),
        max_bytes: (max_bytes != 0).then_some(max_bytes),
        when_full,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_bad_rows_are_corrupted() {
        for limit in [
            QueueLimit::jobs(5),
            QueueLimit::bytes(1 << 40).when_full(WhenFull::DropOldest),
            QueueLimit::jobs(1)
                .and_bytes(9)
                .when_full(WhenFull::Block { wait_ms: 1 }),
            QueueLimit::jobs(u64::MAX).when_full(WhenFull::Block {
                wait_ms: BLOCK_WAIT_MAX_MS,
            }),
        ] {
            let row = encode(&limit, 77);
            assert_eq!(row.3, 77);
            assert_eq!(decode(1, row).unwrap(), limit);
        }
        for row in [
            (0, 0, 0, 0),
            (1, 0, 3, 0),
            (1, 0, 1, 0),
            (1, 0, 1 | ((BLOCK_WAIT_MAX_MS + 1) << 8), 0),
            (1, 0, 2 | (5 << 8), 0),
        ] {
            assert!(
                matches!(decode(2, row), Err(Error::Corrupted { .. })),
                "{row:?}"
            );
        }
    }
}
