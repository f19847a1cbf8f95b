//! What the shell's timer tasks run when they wake: the subscriptions'
//! due work (publishing cycles, samples, Publish timeouts), on a `now`
//! passed in. The shell decides only when to wake.

use std::sync::Arc;

use crate::context::ServiceContext;
use crate::services::monitored_item;
use crate::state::ServerState;
use crate::subscription::Now;

/// Runs every subscription deadline due at `now`; sampling runs on no
/// channel. True when a session's sampling pass was cut short: run again,
/// on a fresh `now`, once the runtime has run what waits for it.
pub fn run_due_subscriptions(state: &Arc<ServerState>, now: Now) -> bool {
    let ctx = ServiceContext::internal(Arc::clone(state), now);
    state
        .subscriptions
        .run_due(now, &mut |t| monitored_item::sample(&ctx, t))
}
