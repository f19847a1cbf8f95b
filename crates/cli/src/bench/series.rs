//! Samples of a run (one per `--interval-s`, 1 s by default), for the
//! JSON and the report's plots.

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{count_status, merge_counts, StatusCounts};
use std::time::SystemTime;

use uascale_types::{DateTime, StatusCode};

/// Latencies in microseconds, 1 us to 60 s at 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant, valid bounds")
}

/// Lateness in microseconds, 1 us to 1 h.
pub fn lateness_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant, valid bounds")
}

/// Microseconds from `then` to now (0 for a null or future time): how late
/// a value arrives after its source timestamp.
pub fn lateness_us(then: DateTime) -> u64 {
    let now = DateTime::from_system_time(SystemTime::now());
    if then.ticks() <= 0 {
        return 0;
    }
    // DateTime ticks are 100 ns.
    u64::try_from(now.ticks().saturating_sub(then.ticks()) / 10).unwrap_or(0)
}

/// What completed since the last sample (one per connection, taken by the
/// sampler once an interval).
pub struct Interval {
    pub reads: u64,
    pub values: u64,
    pub errors: StatusCounts,
    pub latency_us: Histogram<u64>,
}

impl Interval {
    pub fn new() -> Self {
        Interval {
            reads: 0,
            values: 0,
            errors: StatusCounts::new(),
            latency_us: latency_histogram(),
        }
    }

    /// A successful Read of `values` values after `latency_us`.
    pub fn read(&mut self, values: usize, latency_us: u64) {
        self.reads += 1;
        self.values += values as u64;
        self.latency_us.saturating_record(latency_us.max(1));
    }

    pub fn error(&mut self, status: StatusCode) {
        count_status(&mut self.errors, status, 1);
    }

    /// Moves everything of `other` into this one (leaving it empty).
    pub fn absorb(&mut self, other: &mut Interval) {
        self.reads += std::mem::take(&mut other.reads);
        self.values += std::mem::take(&mut other.values);
        merge_counts(&mut self.errors, &other.errors);
        other.errors.clear();
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        other.latency_us.reset();
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// One interval (or the rest of a phase) of `bench read`.
#[derive(Debug, Clone, Serialize)]
pub struct ReadPoint {
    /// End of the interval, seconds since the load started.
    pub t_s: f64,
    /// `warm-up` or `measure`.
    pub phase: &'static str,
    /// Length of the interval in seconds.
    pub interval_s: f64,
    pub reads: u64,
    pub reads_per_s: f64,
    pub values_per_s: f64,
    /// Of the Reads that completed in the interval; null without any.
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    pub latency_max_ms: Option<f64>,
    /// Failed Reads and Bad values in the interval.
    pub errors: u64,
    /// The server's CPU time over the interval / its length (with its PID).
    pub server_cores_busy: Option<f64>,
}

impl ReadPoint {
    pub fn new(
        t_s: f64,
        phase: &'static str,
        interval_s: f64,
        iv: &Interval,
        server_cores_busy: Option<f64>,
    ) -> Self {
        let secs = interval_s.max(1e-9);
        let h = &iv.latency_us;
        let any = !h.is_empty();
        ReadPoint {
            t_s,
            phase,
            interval_s,
            reads: iv.reads,
            reads_per_s: iv.reads as f64 / secs,
            values_per_s: iv.values as f64 / secs,
            latency_p50_ms: any.then(|| ms(h.value_at_quantile(0.5))),
            latency_p99_ms: any.then(|| ms(h.value_at_quantile(0.99))),
            latency_max_ms: any.then(|| ms(h.max())),
            errors: iv.errors.values().sum(),
            server_cores_busy,
        }
    }
}

/// One interval (or the rest of a phase) of `bench sessions`; counts are
/// totals since the start.
#[derive(Debug, Clone, Serialize)]
pub struct SessionPoint {
    /// Seconds since the start.
    pub t_s: f64,
    /// `establish`, `hold` or `close`.
    pub phase: &'static str,
    pub established: u64,
    /// Established in this interval, per second.
    pub established_per_s: f64,
    /// The interval's length.
    pub interval_s: f64,
    /// Data changes the sessions received in this interval, per second.
    pub data_changes_per_s: f64,
    pub failures: u64,
    pub busy_answers: u64,
    pub retries: u64,
    /// The server's CPU time over the interval / its length (with its PID).
    pub server_cores_busy: Option<f64>,
    /// The server's resident memory at the end of the interval.
    pub server_rss_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absorb_moves_counts_and_latencies() {
        let mut a = Interval::new();
        let mut b = Interval::new();
        b.read(3, 1500);
        b.read(3, 0);
        b.error(StatusCode::BadTimeout);
        a.absorb(&mut b);
        assert_eq!((a.reads, a.values, a.latency_us.len()), (2, 6, 2));
        assert_eq!(a.errors.get(&StatusCode::BadTimeout), Some(&1));
        assert_eq!((b.reads, b.values, b.latency_us.len()), (0, 0, 0));
        assert!(b.errors.is_empty());
        let p = ReadPoint::new(1.0, "measure", 0.5, &a, None);
        assert_eq!(p.reads_per_s, 4.0);
        assert_eq!(p.values_per_s, 12.0);
        assert_eq!(p.errors, 1);
        assert!(p.latency_p99_ms.unwrap() >= 1.49);
        let empty = ReadPoint::new(1.0, "measure", 1.0, &Interval::new(), None);
        assert_eq!(empty.latency_p50_ms, None);
    }
}
