//! The load-based `Server.ServiceLevel` (docs/scalability.md §2): 255 while
//! sessions are at most 20 % of `max_session_count`, then falling linearly
//! to 1 at 100 %, republished only when it moves by 5 or more, or reaches
//! 255 or 1 - so clients can read or subscribe to it as a capacity signal
//! without a change per session.

/// The ServiceLevel published, with its hysteresis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceLevel {
    published: u8,
}

impl Default for ServiceLevel {
    fn default() -> Self {
        ServiceLevel { published: 255 }
    }
}

impl ServiceLevel {
    /// The smallest move republished (other than reaching 255 or 1).
    pub const STEP: u8 = 5;

    /// 255: no session yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value published now.
    pub fn published(&self) -> u8 {
        self.published
    }

    /// The level for `sessions` of `max` without hysteresis: 255 up to
    /// 20 % of `max`, 1 at `max` and above, linear (rounded) between.
    /// With `max` 0 no session can be opened: 1.
    pub fn level(sessions: usize, max: usize) -> u8 {
        if max == 0 {
            return 1;
        }
        let (s, m) = (sessions as u128, max as u128);
        if s * 5 <= m {
            return 255;
        }
        if s >= m {
            return 1;
        }
        // 255 - 254 * (s/m - 1/5) / (4/5) = 255 - 254 * (5s - m) / (4m)
        let drop = (254 * (5 * s - m) + 2 * m) / (4 * m); // rounded
        (255 - drop) as u8
    }

    /// Updates for `sessions` of `max`: the new value to publish when the
    /// level moved by [`Self::STEP`] or more from the published one, or
    /// reached 255 or 1; else `None` (the published value stands).
    pub fn update(&mut self, sessions: usize, max: usize) -> Option<u8> {
        let level = Self::level(sessions, max);
        if level == self.published {
            return None;
        }
        if level.abs_diff(self.published) >= Self::STEP || level == 255 || level == 1 {
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
    fn the_level_is_flat_then_linear() {
        assert_eq!(ServiceLevel::level(0, 1000), 255);
        assert_eq!(ServiceLevel::level(200, 1000), 255);
        assert_eq!(ServiceLevel::level(201, 1000), 255); // 254.68 rounds up
        assert_eq!(ServiceLevel::level(203, 1000), 254);
        assert_eq!(ServiceLevel::level(600, 1000), 128);
        assert_eq!(ServiceLevel::level(999, 1000), 1); // 1.32
        assert_eq!(ServiceLevel::level(1000, 1000), 1);
        assert_eq!(ServiceLevel::level(5000, 1000), 1);
        assert_eq!(ServiceLevel::level(0, 0), 1);
        // Monotonic.
        let levels: Vec<u8> = (0..=1000).map(|s| ServiceLevel::level(s, 1000)).collect();
        assert!(levels.windows(2).all(|w| w[1] <= w[0]));
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
        // Down in steps of at least 5, ending at 1.
        assert_eq!(published.last(), Some(&1));
        assert!(published.windows(2).all(|w| w[0] - w[1] >= 5 || w[1] == 1));
        assert!(
            published.len() >= 45 && published.len() <= 51,
            "{}",
            published.len()
        );
        // A session more or less around a published value does not flap.
        let mut sl = ServiceLevel::new();
        let at = 12_000; // level 128
        assert_eq!(sl.update(at, max), Some(128));
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
        // Back below 20 %: 255 at once, even from less than 5 away.
        let mut sl = ServiceLevel::new();
        assert_eq!(sl.update(at_level(252), max), None);
        assert_eq!(sl.published(), 255);
        assert_eq!(sl.update(at_level(250), max), Some(250));
        assert_eq!(sl.update(at_level(253), max), None);
        assert_eq!(sl.update(max / 5, max), Some(255));
        // Reaching 1 is published even from less than 5 away.
        let mut sl = ServiceLevel::new();
        assert_eq!(sl.update(at_level(4), max), Some(4));
        assert_eq!(sl.update(at_level(2), max), None);
        assert_eq!(sl.update(max, max), Some(1));
        assert_eq!(sl.update(max + 10, max), None);
    }
}
