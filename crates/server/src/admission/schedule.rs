//! A stage's capacity and the slots promised to refused clients: the hint
//! of a refusal is the time until the client's own slot, from the stage's
//! measured service rate and the work admitted or promised ahead of it
//! (docs/scalability.md, "The retry-after hint").
//!
//! ```text
//! rate        = max(completions per second (EWMA, hint.rs),
//!                   in flight / mean time in flight (Little's law, EWMA
//!                   over the last ~32 completions))
//! wait(ahead) = max(0, ahead + 1 - capacity) / rate     ahead = in flight + waiting
//! slot        = max(now + wait(ahead), next_free)
//! next_free   = slot + returns / rate
//! hint        = slot - now, at least HINT_MIN and at most HINT_MAX
//! ```
//!
//! `returns` is the share of promised slots that are used: an EWMA over
//! tickets, 1 for each ticket honoured, 0 for each that expired unused.
//! A client that never comes back (or retries at once, without its
//! ticket) books `returns` of a slot, not a whole one, so refused attempts
//! do not inflate the backlog: with a storm of clients retrying at once,
//! `returns` falls and each refusal books almost nothing, while clients
//! that come back at their slot keep it near 1. Slots promised in the
//! past are not carried: `next_free` is never before `now`.
//!
//! Plain data on a passed-in clock.

use std::time::{Duration, Instant};

use super::hint::{CompletionRate, HINT_MAX, HINT_MIN};

/// Until a stage has measured anything, one place's service time is
/// assumed to be this (a secured handshake takes 1 to 3 ms of a core).
pub const ASSUMED_SERVICE_TIME: Duration = Duration::from_millis(10);

/// The weight of the newest completion in the mean time in flight.
const TIME_WEIGHT: f64 = 1.0 / 32.0;

/// The weight of each ticket's outcome in the return estimate.
const RETURN_WEIGHT: f64 = 1.0 / 64.0;

/// The least return estimate: a slot is always worth something.
const RETURN_FLOOR: f64 = 0.02;

/// A stage's service rate and its promised slots.
#[derive(Debug, Clone)]
pub struct SlotSchedule {
    completions: CompletionRate,
    /// Mean time in flight, seconds (`None` before the first completion).
    time_in_flight: Option<f64>,
    next_free: Option<Instant>,
    returns: f64,
    /// The latest instant the stage was full (its last place taken, a
    /// wait, a promise): a stage not full for [`QUIET_AFTER`] was not
    /// saturated, and what it measured then was its demand, not its
    /// capacity.
    last_full: Option<Instant>,
}

/// A stage that was not full for this long starts its completion rate
/// afresh at its next refusal (see [`SlotSchedule::promise`]).
pub const QUIET_AFTER: Duration = Duration::from_secs(2);

impl Default for SlotSchedule {
    fn default() -> Self {
        SlotSchedule {
            completions: CompletionRate::default(),
            time_in_flight: None,
            next_free: None,
            returns: 1.0,
            last_full: None,
        }
    }
}

impl SlotSchedule {
    /// The stage is full at `now`: its last place was taken, or a request
    /// waits or is refused. The first time after a quiet spell (not full
    /// for [`QUIET_AFTER`]), the completions counted while the stage had
    /// room - how much work came, not how fast the stage serves: a few
    /// sessions a second before a storm of thousands - are dropped, and
    /// the measurement starts again; until it has a completion the rate is
    /// Little's law, else the assumed one.
    pub fn note_full(&mut self, now: Instant) {
        if self
            .last_full
            .is_none_or(|t| now.saturating_duration_since(t) > QUIET_AFTER)
        {
            self.completions = CompletionRate::default();
        }
        self.last_full = Some(now);
    }

    /// A work item that entered at `since` completed at `now`.
    pub fn completed(&mut self, since: Instant, now: Instant) {
        self.completions.record(now);
        let took = now.saturating_duration_since(since).as_secs_f64();
        self.time_in_flight = Some(match self.time_in_flight {
            Some(m) => m + TIME_WEIGHT * (took - m),
            None => took,
        });
    }

    /// A completion without a duration (a session activated: its start is
    /// not known here).
    pub fn completed_now(&mut self, now: Instant) {
        self.completions.record(now);
    }

    /// The service rate at `now` with `in_flight` items in flight and
    /// `capacity` places, completions a second: the larger of the measured
    /// completion rate and `in_flight` over the mean time in flight; before
    /// any measurement, `capacity` places each [`ASSUMED_SERVICE_TIME`].
    pub fn rate(&self, now: Instant, in_flight: usize, capacity: usize) -> f64 {
        let measured = self.completions.per_second(now);
        let little = self
            .time_in_flight
            .filter(|t| *t > 0.0)
            .map(|t| in_flight.max(1) as f64 / t);
        match (measured, little) {
            (None, None) => capacity.max(1) as f64 / ASSUMED_SERVICE_TIME.as_secs_f64(),
            (a, b) => a.unwrap_or(0.0).max(b.unwrap_or(0.0)).max(1e-3),
        }
    }

    /// Completions per second at `now`, when measured (the EWMA alone).
    pub fn measured_completions(&self, now: Instant) -> Option<f64> {
        self.completions.per_second(now)
    }

    /// How long a newcomer behind `ahead` requests (in flight and waiting)
    /// waits for one of `capacity` places at `rate`.
    pub fn wait(ahead: usize, capacity: usize, rate: f64) -> Duration {
        let queue = (ahead + 1).saturating_sub(capacity) as f64;
        Duration::from_secs_f64((queue / rate).min(HINT_MAX.as_secs_f64()))
    }

    /// Promises a slot to a client refused at `now` behind `ahead`
    /// requests, and books it: returns the slot, at least [`HINT_MIN`] and
    /// at most [`HINT_MAX`] from `now`.
    pub fn promise(
        &mut self,
        now: Instant,
        ahead: usize,
        in_flight: usize,
        capacity: usize,
    ) -> Instant {
        self.note_full(now);
        let rate = self.rate(now, in_flight, capacity);
        let earliest = now + Self::wait(ahead, capacity, rate).max(HINT_MIN);
        let slot = self
            .next_free
            .map_or(earliest, |f| f.max(earliest))
            .min(now + HINT_MAX);
        self.next_free = Some(slot + Duration::from_secs_f64(self.returns / rate));
        slot
    }

    /// The slot a refusal would be promised at `now`, without booking it.
    pub fn next_slot(
        &self,
        now: Instant,
        ahead: usize,
        in_flight: usize,
        capacity: usize,
    ) -> Instant {
        let rate = self.rate(now, in_flight, capacity);
        let earliest = now + Self::wait(ahead, capacity, rate).max(HINT_MIN);
        self.next_free
            .map_or(earliest, |f| f.max(earliest))
            .min(now + HINT_MAX)
    }

    /// A promised slot was used (a ticket honoured).
    pub fn returned(&mut self) {
        self.returns += RETURN_WEIGHT * (1.0 - self.returns);
    }

    /// `n` promised slots went unused (tickets expired).
    pub fn unused(&mut self, n: u64) {
        for _ in 0..n.min(1024) {
            self.returns += RETURN_WEIGHT * (RETURN_FLOOR - self.returns);
        }
    }

    /// The share of promised slots used, as estimated.
    pub fn returns(&self) -> f64 {
        self.returns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A stage serving 500 a second at 4 in flight: each takes 8 ms.
    fn busy_stage(t0: Instant) -> (SlotSchedule, Instant) {
        let mut s = SlotSchedule::default();
        let mut t = t0;
        for _ in 0..2000 {
            t += ms(2);
            s.completed(t - ms(8), t);
        }
        (s, t)
    }

    #[test]
    fn the_rate_is_measured_from_completions_and_times_in_flight() {
        let t0 = Instant::now();
        let fresh = SlotSchedule::default();
        // Nothing measured: 4 places of 10 ms.
        assert!((fresh.rate(t0, 0, 4) - 400.0).abs() < 1e-9);
        let (s, t) = busy_stage(t0);
        let r = s.rate(t, 4, 4);
        assert!((r - 500.0).abs() < 10.0, "{r}");
        // Little's law at 4 in flight: 4 / 8 ms.
        assert!((4.0 / 0.008 - 500.0_f64).abs() < 1e-9);
    }

    #[test]
    fn the_hint_is_the_time_until_the_clients_own_slot() {
        let t0 = Instant::now();
        let (mut s, t) = busy_stage(t0);
        // 4 in flight and 96 waiting at 500 a second: the 101st place is
        // 97 completions away, 194 ms.
        let first = s.promise(t, 100, 4, 4) - t;
        assert!(first >= ms(190) && first <= ms(198), "{first:?}");
        // Each later refusal (no one returning yet, returns = 1) is one
        // more slot, 2 ms, later: the 100th refusal is 200 ms behind.
        let mut last = first;
        for _ in 0..100 {
            last = s.promise(t, 100, 4, 4) - t;
        }
        assert!(
            last >= first + ms(195) && last <= first + ms(205),
            "{last:?}"
        );
        // Promises in the past are not carried.
        let later = t + Duration::from_secs(10);
        let h = s.promise(later, 0, 0, 4) - later;
        assert_eq!(h, HINT_MIN);
    }

    /// A stage that served two sessions a second for a minute (its demand,
    /// not its capacity) and then meets a storm: the first refusal's hint
    /// does not come from those two a second.
    #[test]
    fn a_quiet_spell_does_not_set_the_storms_hints() {
        let t0 = Instant::now();
        let mut s = SlotSchedule::default();
        let mut t = t0;
        for _ in 0..120 {
            t += ms(500);
            s.completed_now(t);
        }
        // Behind 200 requests at 128 places: 73 ahead of this one.
        let from_quiet = SlotSchedule::wait(200, 128, s.rate(t, 128, 128));
        assert!(from_quiet > Duration::from_secs(10), "{from_quiet:?}");
        let hint = s.promise(t, 200, 128, 128) - t;
        assert!(hint < Duration::from_secs(1), "{hint:?}");
        // Once the storm's own completions are measured they set the rate.
        for i in 0..400u64 {
            s.completed_now(t + ms(i));
        }
        let t = t + ms(400);
        let r = s.rate(t, 128, 128);
        assert!((700.0..1300.0).contains(&r), "{r}");
    }

    #[test]
    fn refusals_that_never_come_back_do_not_inflate_the_hints() {
        let t0 = Instant::now();
        let (mut s, t) = busy_stage(t0);
        // A storm of clients that retry at once: every ticket expires.
        s.unused(1000);
        assert!(s.returns() < 0.05, "{}", s.returns());
        // 10,000 refusals in the same instant book about 10,000 x 2 % of
        // a slot: 0.4 s, not the 20 s of a slot each.
        let mut last = Duration::ZERO;
        for _ in 0..10_000 {
            last = s.promise(t, 8, 4, 4) - t;
        }
        assert!(last <= ms(800), "{last:?}");
        // Clients that do return bring the estimate back up.
        for _ in 0..500 {
            s.returned();
        }
        assert!(s.returns() > 0.99, "{}", s.returns());
    }

    #[test]
    fn a_client_back_at_its_hint_finds_a_place() {
        // 1,000 clients arrive at once at a stage of 4 places serving 500
        // a second; each refused client comes back at its slot. At every
        // moment the clients present are served in slot order at the
        // stage's rate: no client back at its slot finds more than the
        // stage's places taken ahead of it.
        let t0 = Instant::now();
        let (mut s, t) = busy_stage(t0);
        let mut slots: Vec<Instant> = (0..1000).map(|_| s.promise(t, 4, 4, 4)).collect();
        slots.sort();
        // Served one every 2 ms from `t` on: the i-th place frees at
        // t + (i + 1) x 2 ms; its client's slot is never before it by more
        // than HINT_MIN (the shortest hint).
        for (i, slot) in slots.iter().enumerate() {
            let frees = t + ms(2 * (i as u64 + 1));
            assert!(*slot + ms(1) >= frees, "{i}");
            // and not much after it either: no place idles long.
            assert!(
                *slot <= frees + HINT_MIN + ms(10),
                "{i} {:?}",
                *slot - frees
            );
        }
    }
}
