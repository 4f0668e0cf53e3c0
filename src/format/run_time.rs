//! The buckets of `leaseq_run_times`: how a run time (ms) is kept, and read back as a
//! percentile. One bucket per millisecond below 8 ms, then four per doubling (each at most a
//! quarter wider than where it starts), as HdrHistogram and Prometheus' native histograms
//! keep latencies: a minute of any number of runs is at most [`BUCKETS`] counts.

/// How many buckets there are: 0 to 7 ms one each, then four per doubling up to 2^32 ms
/// (about 50 days); longer runs count in the last.
pub(crate) const BUCKETS: u8 = 8 + 4 * 29;
const _: () = assert!(BUCKETS as usize + crate::metrics::RUN_KIND_BASE as usize <= 256);

/// The bucket of a run of `ms`: itself below 8; else the doubling `k` (2^k ≤ ms < 2^(k+1))
/// split in four by the two bits after the leading one.
pub(crate) fn bucket(ms: u64) -> u8 {
    if ms < 8 {
        return ms as u8;
    }
    let k = 63 - ms.leading_zeros();
    let quarter = ((ms >> (k - 2)) & 3) as u32;
    let b = 8 + 4 * (k - 3) + quarter;
    b.min(u32::from(BUCKETS) - 1) as u8
}

/// The longest run (ms) bucket `b` holds (the last bucket, up to 2^32 − 1 ms, also holds
/// every longer run).
pub(crate) fn bucket_max_ms(b: u8) -> u64 {
    debug_assert!(b < BUCKETS);
    if b < 8 {
        return u64::from(b);
    }
    let k = 3 + u32::from(b - 8) / 4;
    let quarter = u64::from(b - 8) % 4;
    ((5 + quarter) << (k - 2)) - 1
}

/// The `percent` percentile of the runs counted in `buckets` (bucket, count; any order), as
/// the longest run its bucket holds; `None` for no runs.
pub(crate) fn percentile(buckets: &[(u8, u64)], percent: u64) -> Option<u64> {
    debug_assert!(percent <= 100);
    let total: u64 = buckets.iter().map(|&(_, n)| n).fold(0, u64::saturating_add);
    if total == 0 {
        return None;
    }
    // The rank of the run asked for, from 1: the first bucket with that many at or below.
    let rank = (u128::from(total) * u128::from(percent))
        .div_ceil(100)
        .max(1);
    let mut sorted: Vec<(u8, u64)> = buckets.to_vec();
    sorted.sort_unstable();
    let mut seen: u128 = 0;
    let (b, _) = sorted.iter().find(|&&(_, n)| {
        seen += u128::from(n);
        seen >= rank
    })?;
    Some(bucket_max_ms(*b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_falls_in_a_bucket_that_holds_it_and_is_at_most_a_quarter_wide() {
        let mut last = 0;
        let mut samples: Vec<u64> = (0..5_000).collect();
        for shift in 12..40 {
            for extra in [0u64, 1, 3, 7, 1000] {
                samples.push((1u64 << shift) + extra);
                samples.push((1u64 << shift) - 1);
                samples.push((5u64 << shift) / 4);
            }
        }
        samples.push(u64::MAX);
        samples.sort_unstable();
        for ms in samples {
            let b = bucket(ms);
            assert!(b < BUCKETS, "{ms}");
            assert!(b >= last, "buckets grow with the run: {ms}");
            last = b;
            let max = bucket_max_ms(b);
            if b < BUCKETS - 1 {
                assert!(ms <= max, "{ms} in bucket {b} of max {max}");
                // The bucket's first run is above the one before's max.
                let min = if b == 0 { 0 } else { bucket_max_ms(b - 1) + 1 };
                assert!(ms >= min, "{ms} in bucket {b} from {min}");
                assert!(max - min <= min / 4, "bucket {b}: {min}..={max}");
            }
        }
        assert_eq!(bucket(7), 7);
        assert_eq!(bucket_max_ms(bucket(1000)), 1023);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_max_ms(BUCKETS - 1), (1u64 << 32) - 1);
    }

    #[test]
    fn percentiles_count_ranks_from_the_shortest_run() {
        assert_eq!(percentile(&[], 50), None);
        // 90 runs of 2 ms and 10 of about 1 s: the median is 2, the 95th about a second.
        let runs = [(bucket(1000), 10), (bucket(2), 90)];
        assert_eq!(percentile(&runs, 50), Some(2));
        assert_eq!(percentile(&runs, 90), Some(2));
        assert_eq!(percentile(&runs, 95), Some(1023));
        assert_eq!(percentile(&[(3, 1)], 95), Some(3));
        assert_eq!(percentile(&[(3, 1)], 0), Some(3));
    }
}
