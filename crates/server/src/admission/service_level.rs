//! The load part of `Server.ServiceLevel` (docs/scalability.md §2), inside Part
//! 4's Healthy sub-range (Table 103): 255 with no session, falling
//! linearly to 200 at `max_session_count`, republished only when it moves
//! by 5 or more, or reaches 255 or 200 - so clients can read or subscribe
//! to it as a capacity signal without a change per session.
//!
//! Load never leaves the Healthy range: a busy node is still a healthy one
//! (admission refuses what it cannot take). The other sub-ranges are for
//! what load is not ([`crate::state::ServerState::service_level`]): 2-199
//! Degraded (a cluster node whose store is unreachable), 1 NoData, 0
//! Maintenance (shutting down).

/// The ServiceLevel ceiling of a cluster node that cannot reach its
/// store: in Part 4's Degraded range.
pub const DEGRADED_SERVICE_LEVEL: u8 = 100;

/// The ServiceLevel published, with its hysteresis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceLevel {
    published: u8,
}

impl Default for ServiceLevel {
    fn default() -> Self {
        ServiceLevel {
            published: Self::IDLE,
        }
    }
}

impl ServiceLevel {
    /// The smallest move republished (other than reaching an end).
    pub const STEP: u8 = 5;
    /// No session: the top of the Healthy range.
    pub const IDLE: u8 = 255;
    /// At `max_session_count`: the bottom of the Healthy range.
    pub const FULL: u8 = 200;
    /// Part 4 Table 103: Degraded is 2..=199.
    pub const DEGRADED_MAX: u8 = 199;
    /// Part 4 Table 103: the server has no data to serve.
    pub const NO_DATA: u8 = 1;
    /// Part 4 Table 103: the server is in maintenance (shutting down, or
    /// taken out by an administrator): new clients go elsewhere.
    pub const MAINTENANCE: u8 = 0;

    /// 255: no session yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value published now.
    pub fn published(&self) -> u8 {
        self.published
    }

    /// The level for `sessions` of `max` without hysteresis: 255 with no
    /// session, 200 at `max` and above, linear (rounded) between. With
    /// `max` 0 no session can be opened: 200.
    pub fn level(sessions: usize, max: usize) -> u8 {
        if sessions >= max {
            return Self::FULL;
        }
        let (s, m) = (sessions as u128, max as u128);
        let span = u128::from(Self::IDLE - Self::FULL);
        let drop = (span * s * 2 + m) / (2 * m); // rounded, < span
        Self::IDLE - drop as u8
    }

    /// Updates for `sessions` of `max`: the new value to publish when the
    /// level moved by [`Self::STEP`] or more from the published one, or
    /// reached 255 or 200; else `None` (the published value stands).
    pub fn update(&mut self, sessions: usize, max: usize) -> Option<u8> {
        let level = Self::level(sessions, max);
        if level == self.published {
            return None;
        }
        if level.abs_diff(self.published) >= Self::STEP
            || level == Self::IDLE
            || level == Self::FULL
        {
            self.published = level;
            return Some(level);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_stays_in_the_healthy_range() {
        assert_eq!(ServiceLevel::level(0, 1000), 255);
        assert_eq!(ServiceLevel::level(9, 1000), 255); // 254.5 rounds up
        assert_eq!(ServiceLevel::level(10, 1000), 254);
        assert_eq!(ServiceLevel::level(370, 1000), 235); // 37 %: healthy
        assert_eq!(ServiceLevel::level(500, 1000), 227); // 227.5 rounds down
        assert_eq!(ServiceLevel::level(999, 1000), 200); // 200.06
        assert_eq!(ServiceLevel::level(1000, 1000), 200);
        assert_eq!(ServiceLevel::level(5000, 1000), 200);
        assert_eq!(ServiceLevel::level(0, 0), 200);
        assert_eq!(ServiceLevel::level(usize::MAX - 1, usize::MAX), 200);
        // Monotonic, and never below Healthy.
        let levels: Vec<u8> = (0..=1000).map(|s| ServiceLevel::level(s, 1000)).collect();
        assert!(levels.windows(2).all(|w| w[1] <= w[0]));
        assert!(levels.iter().all(|l| *l >= 200));
    }

    #[test]
    fn it_is_republished_only_in_steps_of_five_or_at_the_ends() {
        let max = 20_000;
        let mut sl = ServiceLevel::new();
        let mut published = Vec::new();
        for s in 0..=max {
            if let Some(v) = sl.update(s, max) {
                published.push(v);
            }
        }
        // Down in steps of at least 5, ending at 200.
        assert_eq!(published.last(), Some(&200));
        assert!(published
            .windows(2)
            .all(|w| w[0] - w[1] >= 5 || w[1] == 200));
        assert_eq!(published.len(), 11, "{published:?}");
        // A session more or less around a published value does not flap.
        let mut sl = ServiceLevel::new();
        let at = 10_000; // level 227 or 228
        let v = sl.update(at, max).expect("a move of more than 5");
        assert!((227..=228).contains(&v), "{v}");
        for _ in 0..100 {
            assert_eq!(sl.update(at + 1, max), None);
            assert_eq!(sl.update(at - 1, max), None);
        }
        // The first session count with a level at or below `v`.
        let at_level = |v: u8| {
            (0..=max)
                .find(|s| ServiceLevel::level(*s, max) <= v)
                .unwrap()
        };
        // Back to no session: 255 at once, even from less than 5 away.
        let mut sl = ServiceLevel::new();
        assert_eq!(sl.update(at_level(252), max), None);
        assert_eq!(sl.published(), 255);
        assert_eq!(sl.update(at_level(250), max), Some(250));
        assert_eq!(sl.update(at_level(253), max), None);
        assert_eq!(sl.update(0, max), Some(255));
        // Reaching 200 is published even from less than 5 away.
        let mut sl = ServiceLevel::new();
        assert_eq!(sl.update(at_level(203), max), Some(203));
        assert_eq!(sl.update(at_level(201), max), None);
        assert_eq!(sl.update(max, max), Some(200));
        assert_eq!(sl.update(max + 10, max), None);
    }
}
