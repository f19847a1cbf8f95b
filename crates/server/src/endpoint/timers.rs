//! What the shell's timer tasks run when they wake: the subscriptions'
//! due work (publishing cycles, samples, Publish timeouts), on a `now`
//! passed in. The shell decides only when to wake.

use std::sync::Arc;

use crate::context::ServiceContext;
use crate::services::monitored_item;
use crate::state::ServerState;
use crate::subscription::Now;

/// Runs every subscription deadline due at `now`; sampling runs on no
/// channel.
pub fn run_due_subscriptions(state: &Arc<ServerState>, now: Now) {
    let ctx = ServiceContext::internal(Arc::clone(state), now);
    state
        .subscriptions
        .run_due(now, &mut |t| monitored_item::sample(&ctx, t));
}
