//! The one task that runs every subscription's timers: it sleeps until the
//! earliest deadline in the registry's heap (or until a new, earlier one is
//! scheduled) and runs what is due - publishing cycles, samples, Publish
//! timeouts. Its cost follows what is due, not the number of sessions.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use uascale_types::DateTime;

use super::Shared;
use crate::services::{monitored_item, ServiceContext};
use crate::subscription::Now;

pub(super) async fn run_subscriptions(shared: Arc<Shared>) {
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = Arc::clone(&wake);
    shared
        .subscriptions
        .set_waker(Box::new(move || w.notify_one()));
    loop {
        match shared.subscriptions.next_deadline() {
            Some(t) => {
                tokio::select! {
                    () = tokio::time::sleep_until(t.into()) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
        let now = Now {
            instant: Instant::now(),
            utc: DateTime::from_system_time(SystemTime::now()),
        };
        let ctx = ServiceContext {
            config: &shared.config,
            sessions: &shared.sessions,
            channel_id: 0,
            now: now.utc,
            instant: now.instant,
            address_space: &shared.address_space,
            start_time: shared.start_time,
            managers: &shared.managers,
            request_id: 0,
            sink: None,
            canceller: None,
            security: &shared.security,
            // Sampling runs on no channel.
            channel: crate::services::no_security().1,
            subscriptions: &shared.subscriptions,
        };
        shared
            .subscriptions
            .run_due(now, &mut |t| monitored_item::sample(&ctx, t));
    }
}

/// Raises the demo event of tick `n` to the event items watching the Demo
/// folder or the Server object.
pub(super) fn raise_demo_event(shared: &Shared, n: u64) {
    let (event, notifiers) = crate::demo::event(n, DateTime::from_system_time(SystemTime::now()));
    let space = &shared.address_space;
    let is_subtype =
        |a: &uascale_types::NodeId, b: &uascale_types::NodeId| space.is_subtype_of(a, b);
    shared
        .subscriptions
        .raise_event(Instant::now(), &notifiers, &|item| match &item.filter {
            crate::subscription::item::Filter::Event(f) => f.apply(&event, &is_subtype),
            crate::subscription::item::Filter::DataChange { .. } => None,
        });
}
