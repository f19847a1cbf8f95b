//! The reconnect and retry policy of docs/scalability.md §7: exponential backoff
//! from 1 s to 30 s with ±10 % jitter, multiplied by 4 after a busy signal
//! or a timeout, never shorter than the server's retry-after hint. A busy
//! signal that carries a hint is retried at the hint: the server computed
//! it as the client's slot, and coming later would leave its place idle.

use std::time::Duration;

use uascale_types::StatusCode;

/// The codes after which the next wait is four times longer: the server
/// said it is overloaded, or did not answer in time.
pub fn is_busy_signal(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BadServerTooBusy
            | StatusCode::BadTcpServerTooBusy
            | StatusCode::BadTooManySessions
            | StatusCode::BadTooManyOperations
            | StatusCode::BadTooManyPublishRequests
            | StatusCode::BadTimeout
    )
}

/// The codes worth another attempt: busy signals, timeouts, and a
/// connection or channel that went away (the server restarting, a cut
/// network). Everything else - a certificate not trusted, a user refused,
/// a policy not offered, a malformed request - fails the same way again,
/// so a retry only adds load (docs/scalability.md §7: only transient statuses
/// are retried).
pub fn is_transient(status: StatusCode) -> bool {
    is_busy_signal(status)
        || matches!(
            status,
            StatusCode::BadCommunicationError
                | StatusCode::BadConnectionClosed
                | StatusCode::BadConnectionRejected
                | StatusCode::BadSecureChannelClosed
                | StatusCode::BadServerHalted
                | StatusCode::BadShutdown
                | StatusCode::BadRequestTimeout
                | StatusCode::BadResourceUnavailable
                | StatusCode::BadTcpInternalError
                | StatusCode::BadServerNotConnected
                | StatusCode::BadSessionClosed
        )
}

/// One client's (or one connect loop's) backoff state.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// First wait. Default 1 s.
    pub initial: Duration,
    /// Longest wait. Default 30 s.
    pub max: Duration,
    /// Jitter as a fraction of the wait. Default 0.1 (±10 %).
    pub jitter: f64,
    attempt: u32,
    rng: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(0x9e37_79b9_7f4a_7c15)
    }
}

impl Backoff {
    /// The §7 policy; `seed` makes the jitter reproducible (give every
    /// client a different one so that they spread out).
    pub fn new(seed: u64) -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            jitter: 0.1,
            attempt: 0,
            rng: seed | 1,
        }
    }

    /// The same policy (initial, max, jitter) with a fresh count and its
    /// own jitter `seed`.
    pub fn reseeded(&self, seed: u64) -> Self {
        Backoff {
            attempt: 0,
            rng: seed | 1,
            ..self.clone()
        }
    }

    /// Failures since the last success.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Forgets the failures (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// How long to wait after a failure with `status` (and the server's
    /// `retry_after_ms` hint, if any): the hint itself after a busy signal
    /// with one (at most `max`; the attempt still counts), else the
    /// backoff, never shorter than a hint.
    pub fn next_delay(&mut self, status: StatusCode, retry_after_ms: Option<u64>) -> Duration {
        if let (true, Some(ms)) = (is_busy_signal(status), retry_after_ms) {
            self.attempt = self.attempt.saturating_add(1);
            return Duration::from_millis(ms).min(self.max);
        }
        let exp = 2f64.powi(self.attempt.min(16) as i32);
        self.attempt = self.attempt.saturating_add(1);
        let mut secs = self.initial.as_secs_f64() * exp;
        if is_busy_signal(status) {
            secs *= 4.0;
        }
        secs = secs.min(self.max.as_secs_f64());
        let jittered = secs * (1.0 + self.jitter * (2.0 * self.unit() - 1.0));
        let hint = Duration::from_millis(retry_after_ms.unwrap_or(0));
        Duration::from_secs_f64(jittered.max(0.0)).max(hint)
    }

    /// A wait drawn uniformly from [0, `max`): for a reconnect that need
    /// not back off (the server closed the channel because it shuts down,
    /// and another server takes the session at once), spread so that its
    /// clients do not all come back in the same instant. The failure count
    /// does not move.
    pub fn prompt_delay(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.unit())
    }

    /// A uniform number in [0, 1) (xorshift64*).
    fn unit(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    #[test]
    fn doubles_from_one_second_up_to_thirty_with_jitter() {
        let mut b = Backoff::new(42);
        let waits: Vec<f64> = (0..8)
            .map(|_| secs(b.next_delay(StatusCode::BadCommunicationError, None)))
            .collect();
        for (i, w) in waits.iter().enumerate() {
            let base = (2f64.powi(i as i32)).min(30.0);
            assert!(
                (base * 0.9..=base * 1.1).contains(w),
                "attempt {i}: {w} s not within 10 % of {base} s"
            );
        }
        b.reset();
        assert!(secs(b.next_delay(StatusCode::BadCommunicationError, None)) <= 1.1);
    }

    #[test]
    fn only_transient_statuses_are_worth_a_retry() {
        for s in [
            StatusCode::BadServerTooBusy,
            StatusCode::BadTcpServerTooBusy,
            StatusCode::BadTooManySessions,
            StatusCode::BadTimeout,
            StatusCode::BadCommunicationError,
            StatusCode::BadSecureChannelClosed,
        ] {
            assert!(is_transient(s), "{s:?}");
        }
        for s in [
            StatusCode::BadCertificateUntrusted,
            StatusCode::BadUserAccessDenied,
            StatusCode::BadIdentityTokenRejected,
            StatusCode::BadSecurityPolicyRejected,
            StatusCode::BadTcpEndpointUrlInvalid,
            StatusCode::BadNonceInvalid,
        ] {
            assert!(!is_transient(s), "{s:?}");
        }
    }

    #[test]
    fn busy_signals_wait_four_times_longer() {
        for status in [
            StatusCode::BadServerTooBusy,
            StatusCode::BadTcpServerTooBusy,
            StatusCode::BadTooManySessions,
            StatusCode::BadTimeout,
        ] {
            let mut b = Backoff::new(7);
            let w = secs(b.next_delay(status, None));
            assert!((3.6..=4.4).contains(&w), "{status}: {w}");
            // Still capped.
            for _ in 0..10 {
                assert!(secs(b.next_delay(status, None)) <= 33.0);
            }
        }
    }

    #[test]
    fn a_busy_hint_is_honoured_and_other_hints_are_a_lower_bound() {
        let mut b = Backoff::new(9);
        // A busy answer's hint is the wait, short or long (up to `max`).
        let w = b.next_delay(StatusCode::BadTcpServerTooBusy, Some(250));
        assert_eq!(w, Duration::from_millis(250));
        let w = b.next_delay(StatusCode::BadServerTooBusy, Some(12_000));
        assert_eq!(w, Duration::from_secs(12));
        let w = b.next_delay(StatusCode::BadTcpServerTooBusy, Some(45_000));
        assert_eq!(w, Duration::from_secs(30));
        assert_eq!(b.attempts(), 3);
        // A small hint does not shorten the policy's wait after anything
        // else.
        let w = b.next_delay(StatusCode::BadCommunicationError, Some(10));
        assert!(secs(w) >= 1.8);
    }

    #[test]
    fn different_seeds_spread_out() {
        let a = Backoff::new(1).next_delay(StatusCode::BadTimeout, None);
        let b = Backoff::new(2).next_delay(StatusCode::BadTimeout, None);
        assert_ne!(a, b);
    }

    #[test]
    fn a_prompt_delay_stays_under_its_bound_and_spreads() {
        let mut b = Backoff::new(7);
        let waits: Vec<Duration> = (0..100)
            .map(|_| b.prompt_delay(Duration::from_millis(200)))
            .collect();
        assert!(waits.iter().all(|w| *w < Duration::from_millis(200)));
        assert!(waits.iter().any(|w| *w < Duration::from_millis(50)));
        assert!(waits.iter().any(|w| *w > Duration::from_millis(150)));
        assert_eq!(b.attempts(), 0);
    }
}
