//! The retry-after hint of a busy answer: how long the work ahead of the
//! refused client takes at the rate the stage is finishing work, clamped,
//! with jitter so that the retries of a storm spread out
//! (docs/scalability.md, "The retry-after hint").
//!
//! ```text
//! rate(now)   = S(now) / (tau * (1 - exp(-(now - t0) / tau)))     completions/s
//!   S         = sum over completions i after t0 of exp(-(now - t_i) / tau)
//!   tau       = RATE_TIME_CONSTANT (5 s), t0 = the measurement's first completion
//! base        = clamp(backlog / rate, HINT_MIN, HINT_MAX)
//!               (HINT_FALLBACK when no rate is measured)
//! retry_after = base * f,  f uniform in [1 - JITTER, 1 + JITTER]  (xorshift64*)
//! ```
//!
//! `S` is an exponentially weighted count of completions; divided by `tau`
//! it is the rate once the measurement is older than a few `tau`, and the
//! factor `1 - exp(-(now - t0)/tau)` corrects its start (for a young
//! measurement the formula is completions / elapsed time). A measurement
//! whose last completion is more than [`STALE_AFTER`] old is forgotten: the
//! next completion starts a new one, and until then there is no rate.

use std::time::{Duration, Instant};

/// The shortest hint before jitter: retrying sooner would only meet the
/// same full stage.
pub const HINT_MIN: Duration = Duration::from_millis(100);

/// The longest hint before jitter: beyond it a client might as well give up,
/// and a hint too long keeps capacity idle after the storm.
pub const HINT_MAX: Duration = Duration::from_secs(30);

/// The hint before jitter while a stage has measured no rate yet.
pub const HINT_FALLBACK: Duration = Duration::from_secs(1);

/// The time constant of the completion-rate average.
pub const RATE_TIME_CONSTANT: Duration = Duration::from_secs(5);

/// A measurement with no completion for this long (4 time constants: its
/// weight has fallen below 2 %) is forgotten.
pub const STALE_AFTER: Duration = Duration::from_secs(20);

/// The jitter's half-width: hints are multiplied by a factor uniform in
/// `[1 - JITTER, 1 + JITTER]`, so a hint ends in 80 ms ..= 36 s.
pub const JITTER: f64 = 0.2;

/// A count whose every unit fades as `exp(-age / tau)`: with events at a
/// steady rate r it settles at r x tau.
#[derive(Debug, Clone)]
pub struct DecayingCount {
    tau_s: f64,
    value: f64,
    at: Option<Instant>,
}

impl DecayingCount {
    /// Zero, fading with time constant `tau` (at least 1 ms).
    pub fn new(tau: Duration) -> Self {
        DecayingCount {
            tau_s: tau.as_secs_f64().max(0.001),
            value: 0.0,
            at: None,
        }
    }

    /// The count at `now` (instants before the last change count as then).
    pub fn value(&self, now: Instant) -> f64 {
        match self.at {
            Some(at) => {
                let age = now.saturating_duration_since(at).as_secs_f64();
                self.value * (-age / self.tau_s).exp()
            }
            None => 0.0,
        }
    }

    /// Adds `amount` at `now`.
    pub fn add(&mut self, now: Instant, amount: f64) {
        let at = match self.at {
            Some(at) if at > now => at,
            _ => now,
        };
        self.value = self.value(at) + amount;
        self.at = Some(at);
    }
}

/// A stage's measured completion rate (see the module's formula).
#[derive(Debug, Clone)]
pub struct CompletionRate {
    sum: DecayingCount,
    tau_s: f64,
    /// The measurement's first completion.
    start: Option<Instant>,
    /// Its latest.
    last: Option<Instant>,
}

impl Default for CompletionRate {
    fn default() -> Self {
        CompletionRate::new(RATE_TIME_CONSTANT)
    }
}

impl CompletionRate {
    /// No measurement yet; `tau` is the time constant.
    pub fn new(tau: Duration) -> Self {
        CompletionRate {
            sum: DecayingCount::new(tau),
            tau_s: tau.as_secs_f64().max(0.001),
            start: None,
            last: None,
        }
    }

    fn stale(&self, now: Instant) -> bool {
        self.last.is_none_or(|last| {
            now.saturating_duration_since(last)
                > STALE_AFTER.mul_f64(self.tau_s / RATE_TIME_CONSTANT.as_secs_f64())
        })
    }

    /// A completion at `now`.
    pub fn record(&mut self, now: Instant) {
        if self.stale(now) {
            // The first completion of a measurement marks its start.
            self.sum = DecayingCount::new(Duration::from_secs_f64(self.tau_s));
            self.start = Some(now);
        } else {
            self.sum.add(now, 1.0);
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }

    /// Completions per second at `now`, or `None` when there is no
    /// measurement (fewer than two completions, or a stale one).
    pub fn per_second(&self, now: Instant) -> Option<f64> {
        let start = self.start?;
        if self.stale(now) {
            return None;
        }
        let span = now.saturating_duration_since(start).as_secs_f64();
        let s = self.sum.value(now);
        if s <= 0.0 || span <= 0.0 {
            return None;
        }
        Some(s / (self.tau_s * -(-span / self.tau_s).exp_m1()))
    }
}

/// A small seeded xorshift64* generator for the jitter factor:
/// deterministic for a seed, so tests are.
#[derive(Debug, Clone)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// A generator from `seed` (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        Jitter {
            state: if seed == 0 {
                0x9E37_79B9_7F4A_7C15
            } else {
                seed
            },
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next factor, uniform in `[1 - JITTER, 1 + JITTER)`.
    pub fn factor(&mut self) -> f64 {
        // The top 53 bits: a uniform f64 in [0, 1).
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        1.0 - JITTER + 2.0 * JITTER * unit
    }
}

/// The hint before jitter: `backlog / rate` clamped to
/// [`HINT_MIN`]..=[`HINT_MAX`], or [`HINT_FALLBACK`] without a rate.
pub fn base_retry_after(backlog: f64, rate_per_s: Option<f64>) -> Duration {
    let raw = match rate_per_s {
        Some(r) if r > 0.0 && r.is_finite() => {
            let s = (backlog.max(0.0) / r).min(HINT_MAX.as_secs_f64());
            Duration::from_secs_f64(s)
        }
        _ => HINT_FALLBACK,
    };
    raw.clamp(HINT_MIN, HINT_MAX)
}

/// The hint: [`base_retry_after`] times a jitter factor.
pub fn retry_after(backlog: f64, rate_per_s: Option<f64>, jitter: &mut Jitter) -> Duration {
    jittered(base_retry_after(backlog, rate_per_s), jitter)
}

/// `base` (already clamped) times a jitter factor.
pub fn jittered(base: Duration, jitter: &mut Jitter) -> Duration {
    base.mul_f64(jitter.factor())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_steady_rate_is_measured_from_the_start_and_later() {
        let t0 = Instant::now();
        let mut r = CompletionRate::default();
        assert_eq!(r.per_second(t0), None);
        r.record(t0);
        // One completion is a start, not a rate.
        assert_eq!(r.per_second(t0 + ms(10)), None);
        // 50 a second (every 20 ms): within a second already close.
        let mut t = t0;
        for _ in 0..50 {
            t += ms(20);
            r.record(t);
        }
        let early = r.per_second(t).unwrap();
        assert!((early - 50.0).abs() < 2.5, "{early}");
        // And after a minute, when the average is fully formed.
        for _ in 0..3000 {
            t += ms(20);
            r.record(t);
        }
        let later = r.per_second(t).unwrap();
        assert!((later - 50.0).abs() < 1.0, "{later}");
    }

    #[test]
    fn the_rate_follows_a_change_and_falls_when_completions_stop() {
        let t0 = Instant::now();
        let mut r = CompletionRate::default();
        let mut t = t0;
        r.record(t);
        for _ in 0..1000 {
            t += ms(100); // 10 a second for 100 s
            r.record(t);
        }
        assert!((r.per_second(t).unwrap() - 10.0).abs() < 0.5);
        for _ in 0..2000 {
            t += ms(10); // then 100 a second for 20 s (4 time constants)
            r.record(t);
        }
        let now = r.per_second(t).unwrap();
        assert!((now - 100.0).abs() < 5.0, "{now}");
        // No completion for one time constant: e^-1 of it.
        let quiet = r.per_second(t + Duration::from_secs(5)).unwrap();
        assert!((quiet - 100.0 / std::f64::consts::E).abs() < 3.0, "{quiet}");
        // Stale after 20 s: no rate until a new measurement.
        assert_eq!(r.per_second(t + Duration::from_secs(21)), None);
        let t2 = t + Duration::from_secs(60);
        r.record(t2);
        assert_eq!(r.per_second(t2), None);
        r.record(t2 + ms(500));
        r.record(t2 + ms(1000));
        let fresh = r.per_second(t2 + ms(1000)).unwrap();
        assert!((fresh - 2.0).abs() < 0.2, "{fresh}");
    }

    #[test]
    fn the_base_hint_is_backlog_over_rate_clamped() {
        assert_eq!(base_retry_after(10.0, Some(20.0)), ms(500));
        assert_eq!(base_retry_after(1.0, Some(1000.0)), HINT_MIN);
        assert_eq!(base_retry_after(1e9, Some(1.0)), HINT_MAX);
        assert_eq!(base_retry_after(5.0, Some(0.0)), HINT_FALLBACK);
        assert_eq!(base_retry_after(5.0, None), HINT_FALLBACK);
        assert_eq!(base_retry_after(5.0, Some(f64::NAN)), HINT_FALLBACK);
        assert_eq!(base_retry_after(0.0, Some(3.0)), HINT_MIN);
    }

    #[test]
    fn jitter_stays_in_bounds_and_spreads() {
        let mut j = Jitter::new(42);
        let base = Duration::from_secs(10);
        let hints: Vec<Duration> = (0..10_000).map(|_| jittered(base, &mut j)).collect();
        let lo = base.mul_f64(1.0 - JITTER);
        let hi = base.mul_f64(1.0 + JITTER);
        assert!(hints.iter().all(|h| *h >= lo && *h <= hi));
        // Spread: every tenth of the range gets close to a tenth of them.
        let mut deciles = [0u32; 10];
        for h in &hints {
            let x = (h.as_secs_f64() - lo.as_secs_f64()) / (hi - lo).as_secs_f64();
            deciles[((x * 10.0) as usize).min(9)] += 1;
        }
        assert!(
            deciles.iter().all(|n| (800..1200).contains(n)),
            "{deciles:?}"
        );
        // Deterministic for a seed, different between seeds.
        let again: Vec<Duration> = {
            let mut j = Jitter::new(42);
            (0..5).map(|_| jittered(base, &mut j)).collect()
        };
        assert_eq!(again, hints[..5]);
        let mut other = Jitter::new(43);
        assert_ne!(jittered(base, &mut other), hints[0]);
        // The extremes of the whole formula.
        let mut j = Jitter::new(7);
        for _ in 0..1000 {
            let h = retry_after(1e9, Some(1.0), &mut j);
            assert!(h >= HINT_MAX.mul_f64(0.8) && h <= HINT_MAX.mul_f64(1.2));
            let h = retry_after(0.0, Some(1.0), &mut j);
            assert!(h >= HINT_MIN.mul_f64(0.8) && h <= HINT_MIN.mul_f64(1.2));
        }
    }

    #[test]
    fn a_decaying_count_fades() {
        let t0 = Instant::now();
        let mut c = DecayingCount::new(Duration::from_secs(1));
        c.add(t0, 10.0);
        assert!((c.value(t0 + Duration::from_secs(1)) - 10.0 / std::f64::consts::E).abs() < 1e-9);
        // A late instant adds at the latest time seen.
        c.add(t0 - Duration::from_secs(1), 1.0);
        assert!((c.value(t0) - 11.0).abs() < 1e-9);
    }
}
