//! `max_channel_count`: what to do with a new secure channel when the
//! channels are at the limit. The network layer keeps the registry of
//! channels; this is only the decision.

/// What to do with a new channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelDecision {
    /// Open it.
    Admit,
    /// Close the oldest channel that has no session, then open it.
    EvictOldestSessionless,
    /// Refuse it: ERR `BadTcpServerTooBusy` with the hint of
    /// [`crate::admission::Admission::channel_refusal`], and close.
    Refuse,
}

/// The `max_channel_count` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelCount {
    max: usize,
}

impl ChannelCount {
    /// At most `max` open channels.
    pub fn new(max: usize) -> Self {
        ChannelCount { max }
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A new channel arrives while `open` channels are open, and
    /// `has_sessionless` says whether one of them has no session: below the
    /// limit it is admitted; at it, the oldest session-less channel makes
    /// room (a client that is establishing a session, or only discovering,
    /// loses its channel rather than one that serves a session); with none,
    /// it is refused.
    pub fn decide(&self, open: usize, has_sessionless: bool) -> ChannelDecision {
        if open < self.max {
            ChannelDecision::Admit
        } else if has_sessionless {
            ChannelDecision::EvictOldestSessionless
        } else {
            ChannelDecision::Refuse
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_below_the_limit_then_evict_then_refuse() {
        let c = ChannelCount::new(3);
        assert_eq!(c.decide(0, false), ChannelDecision::Admit);
        assert_eq!(c.decide(2, true), ChannelDecision::Admit);
        assert_eq!(c.decide(3, true), ChannelDecision::EvictOldestSessionless);
        assert_eq!(c.decide(3, false), ChannelDecision::Refuse);
        // Over the limit (it was lowered) the same.
        assert_eq!(c.decide(9, true), ChannelDecision::EvictOldestSessionless);
        assert_eq!(c.decide(9, false), ChannelDecision::Refuse);
    }
}
