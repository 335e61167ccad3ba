//! Fixed-bucket duration histograms: the per-minute rows of the dashboard keep one each, and the
//! percentiles of a window (an hour, a day) come from merging the minutes' buckets, so no single
//! duration is kept.
//!
//! The buckets are log-spaced: bucket `i` (for `i < BUCKETS - 1`) holds durations up to
//! `BUCKET_BOUNDS_MS[i]` milliseconds (and above the previous bound); the last holds everything
//! longer. A percentile is the upper bound of the bucket it falls in, so it is exact to within
//! one bucket (each bound is about 1.6 times the previous one).

use serde::{Deserialize, Serialize};

/// The upper bounds, in milliseconds, of every bucket but the last (which is unbounded).
pub const BUCKET_BOUNDS_MS: [u64; 31] = [
    1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 130, 200, 300, 500, 800, 1_300, 2_000, 3_000, 5_000, 8_000,
    13_000, 20_000, 30_000, 50_000, 80_000, 130_000, 200_000, 300_000, 600_000, 1_800_000,
    3_600_000,
];

/// How many buckets a histogram has.
pub const BUCKETS: usize = BUCKET_BOUNDS_MS.len() + 1;

/// Counts of durations per bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Histogram(Vec<u64>);

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram(vec![0; BUCKETS])
    }
}

impl Histogram {
    /// Counts one duration.
    pub fn record(&mut self, millis: u64) {
        let bucket = BUCKET_BOUNDS_MS.partition_point(|bound| *bound < millis);
        self.0[bucket] += 1;
    }

    /// Adds another histogram's counts (a histogram of fewer buckets, as stored by an older
    /// version, adds to the first ones).
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine += theirs;
        }
    }

    /// How many durations were counted.
    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The upper bound of the bucket holding the `quantile` (0.0 to 1.0) of the durations, in
    /// milliseconds; `None` when none were counted. In the last bucket it is the last bound.
    pub fn percentile(&self, quantile: f64) -> Option<u64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        // The rank of the duration asked for, 1-based: the p50 of 4 durations is the 2nd.
        let rank = ((quantile.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, counted) in self.0.iter().enumerate() {
            seen += counted;
            if seen >= rank {
                let last = BUCKET_BOUNDS_MS[BUCKET_BOUNDS_MS.len() - 1];
                return Some(BUCKET_BOUNDS_MS.get(bucket).copied().unwrap_or(last));
            }
        }
        None
    }

    /// The counts per bucket.
    pub fn buckets(&self) -> &[u64] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_falls_in_the_first_bucket_whose_bound_holds_it() {
        let mut histogram = Histogram::default();
        for millis in [0, 1, 2, 4, 5, 6, 10_000_000] {
            histogram.record(millis);
        }
        let buckets = histogram.buckets();
        assert_eq!(buckets[0], 2, "0 and 1 ms");
        assert_eq!(buckets[1], 1, "2 ms");
        assert_eq!(buckets[3], 2, "4 and 5 ms");
        assert_eq!(buckets[4], 1, "6 ms");
        assert_eq!(buckets[BUCKETS - 1], 1, "past the last bound");
        assert_eq!(histogram.count(), 7);
    }

    #[test]
    fn percentiles_of_merged_minutes_are_those_of_all_their_durations() {
        let mut first = Histogram::default();
        let mut second = Histogram::default();
        for _ in 0..90 {
            first.record(40);
        }
        for _ in 0..10 {
            second.record(2_500);
        }
        assert_eq!(second.percentile(0.5), Some(3_000));
        first.merge(&second);
        assert_eq!(first.percentile(0.5), Some(50));
        assert_eq!(first.percentile(0.9), Some(50));
        assert_eq!(first.percentile(0.95), Some(3_000));
        assert_eq!(Histogram::default().percentile(0.5), None);
    }

    #[test]
    fn a_shorter_stored_histogram_merges_into_the_first_buckets() {
        let mut histogram = Histogram::default();
        histogram.merge(&Histogram(vec![1, 2]));
        assert_eq!(&histogram.buckets()[..3], &[1, 2, 0]);
        assert_eq!(histogram.buckets().len(), BUCKETS);
    }
}
