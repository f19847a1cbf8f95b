//! The server's timers without a clock: each says when it wants to wake
//! and what it does then, on a `now` passed in ([`Timer`]). The shell
//! runs one task per timer that sleeps until the time asked for, or until
//! the timer's waker moves it earlier, and calls [`Timer::fire`].
//!
//! - [`Subscriptions`]: every subscription's due work (publishing cycles,
//!   samples, Publish timeouts), on the registry's timer grid;
//! - [`Reaper`]: sessions past their timeout or activation deadline;
//! - [`DemoTicker`]: the demo namespace's changing values;
//! - [`PlannedShutdown`]: the planned shutdown coming due.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::context::ServiceContext;
use crate::services::monitored_item;
use crate::state::ServerState;
use crate::subscription::Now;

/// What the shell calls to wake a timer's task early (its deadline moved).
pub type Wake = Box<dyn Fn() + Send + Sync>;

/// What a timer's [`Timer::fire`] asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// Sleep until [`Timer::next_wake`] (or the waker).
    Sleep,
    /// Work was left over: fire again, on a fresh `now`, once the runtime
    /// has run what waits for it.
    Again,
    /// The timer is done: its task ends.
    Done,
}

/// A timer the shell drives.
pub trait Timer: Send {
    /// Hands the timer the function that wakes its task before the time
    /// it asked for (called once, before the first [`Timer::next_wake`]).
    /// A timer whose deadlines only move later ignores it.
    fn set_waker(&mut self, _wake: Wake) {}

    /// When the task wakes next (`None`: only when woken).
    fn next_wake(&mut self, now: Instant) -> Option<Instant>;

    /// Runs what is due at `now`.
    fn fire(&mut self, now: Now) -> Fired;
}

/// Every subscription's due work. It wakes at the earliest deadline in
/// the registry's heap rounded up to the timer grid (`[subscriptions]
/// timer_resolution_ms`, through the timer's start), or earlier when a
/// new earliest deadline is scheduled; its cost follows what is due, not
/// the number of sessions.
pub struct Subscriptions {
    state: Arc<ServerState>,
    origin: Instant,
}

impl Subscriptions {
    /// The timer of `state`'s subscriptions, its grid through `origin`.
    pub fn new(state: Arc<ServerState>, origin: Instant) -> Self {
        Subscriptions { state, origin }
    }
}

impl Timer for Subscriptions {
    fn set_waker(&mut self, wake: Wake) {
        self.state.subscriptions.set_waker(wake);
    }

    fn next_wake(&mut self, _now: Instant) -> Option<Instant> {
        self.state.subscriptions.next_wake(self.origin)
    }

    fn fire(&mut self, now: Now) -> Fired {
        if run_due_subscriptions(&self.state, now) {
            Fired::Again
        } else {
            Fired::Sleep
        }
    }
}

/// Runs every subscription deadline due at `now`; sampling runs on no
/// channel. True when a session's sampling pass was cut short: run again,
/// on a fresh `now`, once the runtime has run what waits for it.
pub fn run_due_subscriptions(state: &Arc<ServerState>, now: Now) -> bool {
    let ctx = ServiceContext::internal(Arc::clone(state), now);
    state
        .subscriptions
        .run_due(now, &mut |t| monitored_item::sample(&ctx, t))
}

/// The longest the reaper sleeps, so that sessions created meanwhile are
/// seen.
const REAP_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

/// Closes sessions past their timeout or activation deadline: it wakes at
/// the earliest deadline (at most [`REAP_AT_LEAST_EVERY`] apart) and logs
/// what each pass closed in one line.
pub struct Reaper {
    state: Arc<ServerState>,
}

impl Reaper {
    /// The reaper of `state`'s sessions.
    pub fn new(state: Arc<ServerState>) -> Self {
        Reaper { state }
    }
}

impl Timer for Reaper {
    fn next_wake(&mut self, now: Instant) -> Option<Instant> {
        let most = now + REAP_AT_LEAST_EVERY;
        Some(
            self.state
                .sessions
                .next_deadline()
                .map_or(most, |d| d.min(most)),
        )
    }

    fn fire(&mut self, now: Now) -> Fired {
        let (orphans, timed_out) = self.state.expire_sessions(now.instant);
        if orphans + timed_out > 0 {
            tracing::info!(
                timed_out,
                orphans,
                "sessions closed: timed out, or not activated by the activation deadline"
            );
        }
        Fired::Sleep
    }
}

/// Changes the demo's dynamic values every `demo.rate_ms`. A tick that
/// comes late is not made up for: the next follows on the same grid. In a
/// cluster one node runs the changing values; the others follow them
/// through the store (one writer per value).
pub struct DemoTicker {
    state: Arc<ServerState>,
    rate: Duration,
    next: Instant,
    n: u64,
    seed: u64,
}

impl DemoTicker {
    /// The ticker of `state`'s demo namespace, first ticking at `now`;
    /// `None` without the demo.
    pub fn new(state: Arc<ServerState>, now: Instant) -> Option<Self> {
        let rate = state.demo.as_ref()?.rate.max(Duration::from_millis(1));
        Some(DemoTicker {
            state,
            rate,
            next: now,
            n: 0,
            seed: 0x2545_f491_4f6c_dd1d,
        })
    }
}

impl Timer for DemoTicker {
    fn next_wake(&mut self, _now: Instant) -> Option<Instant> {
        Some(self.next)
    }

    fn fire(&mut self, now: Now) -> Fired {
        if now.instant < self.next {
            return Fired::Sleep;
        }
        // The next tick on the grid after `now` (missed ticks skipped).
        let late = now.instant.duration_since(self.next).as_nanos();
        let skip = late / self.rate.as_nanos().max(1);
        self.next += self.rate * (u32::try_from(skip).unwrap_or(u32::MAX).saturating_add(1));
        let follows = self.state.cluster().is_some_and(|c| !c.leads());
        if !follows {
            self.state.tick_demo(self.n, &mut self.seed);
        }
        self.n += 1;
        Fired::Sleep
    }
}

/// The planned shutdown ([`crate::shutdown`]) coming due - planned by a
/// signal or by `RequestServerStateChange`, and possibly moved or
/// cancelled while it counts down: done once it is due.
pub struct PlannedShutdown {
    state: Arc<ServerState>,
}

impl PlannedShutdown {
    /// The timer of `state`'s planned shutdown.
    pub fn new(state: Arc<ServerState>) -> Self {
        PlannedShutdown { state }
    }
}

impl Timer for PlannedShutdown {
    fn set_waker(&mut self, wake: Wake) {
        self.state.shutdown.set_waker(wake);
    }

    fn next_wake(&mut self, _now: Instant) -> Option<Instant> {
        self.state.shutdown.due()
    }

    fn fire(&mut self, now: Now) -> Fired {
        if self
            .state
            .shutdown
            .due()
            .is_some_and(|at| at <= now.instant)
        {
            tracing::info!("planned shutdown due: closing the channels");
            Fired::Done
        } else {
            Fired::Sleep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now_at(instant: Instant) -> Now {
        Now {
            instant,
            utc: uascale_types::DateTime::from_ticks(1),
        }
    }

    /// The demo ticks on its grid: a late wake-up ticks once and the next
    /// tick is the next grid point after it, not a burst of the missed
    /// ones; an early wake-up does not tick.
    #[test]
    fn the_demo_ticks_on_its_grid_and_skips_what_it_missed() {
        let mut config = crate::config::ServerConfig::default();
        config.demo.rate = Duration::from_millis(100);
        config.security = crate::config::SecurityConfig::none_only();
        let state = ServerState::new(config).expect("state");
        let t0 = Instant::now();
        let mut ticker = DemoTicker::new(state, t0).expect("demo");
        assert_eq!(ticker.next_wake(t0), Some(t0));
        assert_eq!(ticker.fire(now_at(t0)), Fired::Sleep);
        assert_eq!(
            (ticker.n, ticker.next),
            (1, t0 + Duration::from_millis(100))
        );
        // Early: nothing.
        ticker.fire(now_at(t0 + Duration::from_millis(50)));
        assert_eq!(ticker.n, 1);
        // 350 ms late: one tick, the next at 500 ms.
        ticker.fire(now_at(t0 + Duration::from_millis(450)));
        assert_eq!(
            (ticker.n, ticker.next),
            (2, t0 + Duration::from_millis(500))
        );
    }

    /// The planned shutdown's timer wakes when the plan says, is done
    /// only once it is due, and hears a new plan through its waker.
    #[test]
    fn the_planned_shutdown_is_done_when_due_and_wakes_on_a_new_plan() {
        let mut config = crate::config::ServerConfig::default();
        config.security = crate::config::SecurityConfig::none_only();
        let state = ServerState::new(config).expect("state");
        let mut timer = PlannedShutdown::new(Arc::clone(&state));
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let w = Arc::clone(&woken);
        timer.set_waker(Box::new(move || {
            w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        let t0 = Instant::now();
        assert_eq!(timer.next_wake(t0), None, "nothing planned");
        assert_eq!(timer.fire(now_at(t0)), Fired::Sleep);
        state
            .shutdown
            .plan(t0, Duration::from_secs(2), "a test's plan", None);
        assert!(woken.load(std::sync::atomic::Ordering::SeqCst) >= 1);
        let due = timer.next_wake(t0).expect("planned");
        assert_eq!(
            timer.fire(now_at(due - Duration::from_millis(1))),
            Fired::Sleep
        );
        assert_eq!(timer.fire(now_at(due)), Fired::Done);
    }
}
