//! A token bucket on a passed-in clock: `rate_per_s` tokens a second up to
//! `burst`, one token per admitted connection.

use std::time::{Duration, Instant};

/// A token bucket. It starts full; tokens come back continuously at
/// `rate_per_s` a second, never more than `burst` at once. Plain data: the
/// caller passes the instant of every call, and instants that go backwards
/// count as no time passed.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_s: u32,
    burst: u32,
    /// Tokens at `at` (fractional between refills).
    tokens: f64,
    /// When `tokens` was last brought up to date; `None` before the first
    /// call (the bucket is full).
    at: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket refilling `rate_per_s` tokens a second up to `burst`.
    /// A rate of 0 never refills; a burst of 0 never admits.
    pub fn new(rate_per_s: u32, burst: u32) -> Self {
        TokenBucket {
            rate_per_s,
            burst,
            tokens: f64::from(burst),
            at: None,
        }
    }

    /// The refill rate, tokens a second.
    pub fn rate_per_s(&self) -> u32 {
        self.rate_per_s
    }

    /// The bucket's size.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Tokens in the bucket at `now`, refilled up to then.
    pub fn tokens(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn refill(&mut self, now: Instant) {
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.tokens =
                (self.tokens + elapsed * f64::from(self.rate_per_s)).min(f64::from(self.burst));
        }
        // Never move the reference back: a late instant adds nothing.
        if self.at.is_none_or(|at| now > at) {
            self.at = Some(now);
        }
    }

    /// Takes one token at `now`; without one, the time until there will be
    /// one (`Duration::MAX` when the rate is 0).
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(self.wait(now))
    }

    /// The time from `now` until a token is there (zero when one is;
    /// `Duration::MAX` when none will come).
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else if self.rate_per_s == 0 || self.burst == 0 {
            Duration::MAX
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / f64::from(self.rate_per_s))
        }
    }

    /// Gives back a token taken at the same moment (a later stage refused
    /// the connection), up to `burst`.
    pub fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(f64::from(self.burst));
    }

    /// Whether the bucket is full at `now`: it has not been used for as long
    /// as a refill takes, so forgetting it changes nothing.
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.tokens(now) >= f64::from(self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_passes_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 5);
        for _ in 0..5 {
            b.try_take(t0).unwrap();
        }
        // Empty: the next token is 100 ms away.
        let wait = b.try_take(t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(99) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        // 50 ms later, half a token: 50 ms to go.
        let wait = b.try_take(t0 + Duration::from_millis(50)).unwrap_err();
        assert!(
            wait > Duration::from_millis(49) && wait <= Duration::from_millis(51),
            "{wait:?}"
        );
        b.try_take(t0 + Duration::from_millis(100)).unwrap();
        b.try_take(t0 + Duration::from_millis(100)).unwrap_err();
        // Over one second 10 more, never more than the burst.
        let t1 = t0 + Duration::from_secs(10);
        assert!(b.is_full(t1));
        let taken = (0..100).filter(|_| b.try_take(t1).is_ok()).count();
        assert_eq!(taken, 5);
        let mut admitted = 0;
        for ms in 1..=1000u64 {
            if b.try_take(t1 + Duration::from_millis(ms)).is_ok() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10);
    }

    #[test]
    fn instants_going_back_add_nothing_and_give_back_is_capped() {
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut b = TokenBucket::new(1, 1);
        b.try_take(t0).unwrap();
        b.try_take(t0 - Duration::from_secs(1)).unwrap_err();
        b.try_take(t0 + Duration::from_millis(500)).unwrap_err();
        b.give_back();
        b.give_back();
        assert!(b.is_full(t0 + Duration::from_millis(500)));
        b.try_take(t0 + Duration::from_millis(500)).unwrap();
        b.try_take(t0 + Duration::from_millis(500)).unwrap_err();
    }

    #[test]
    fn a_zero_rate_never_refills() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0, 1);
        b.try_take(t0).unwrap();
        assert_eq!(
            b.try_take(t0 + Duration::from_secs(3600)),
            Err(Duration::MAX)
        );
    }
}
