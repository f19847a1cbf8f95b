//! Subscriptions on the wire: [`Client::subscribe`], the [`Subscription`]
//! handle with its stream of [`SubscriptionEvent`]s, and the one publish
//! loop per client that keeps Publish requests outstanding, acknowledges
//! what arrived, Republishes what was missed and routes each
//! NotificationMessage to its subscription's stream.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use uascale_types as t;
use uascale_types::StatusCode;

use crate::error::ClientError;
use crate::subscription::{
    notifications, Arrival, MonitorItem, Notification, Restore, Revised, SequenceTracker,
    SubscriptionEvent, SubscriptionSettings,
};

use super::{Client, Link, LinkState, Shared};

/// One subscription as the client keeps it: enough to route its messages
/// and to create it again.
#[derive(Debug)]
pub(crate) struct Entry {
    server_id: u32,
    settings: SubscriptionSettings,
    revised: Revised,
    /// Client handle -> (what was asked, the server's item id).
    items: BTreeMap<u32, (MonitorItem, u32)>,
    events: mpsc::UnboundedSender<SubscriptionEvent>,
    tracker: SequenceTracker,
    /// After a reconnect: acknowledge the server's available sequence
    /// numbers we had already received (their acknowledgements may have
    /// been lost with the connection).
    resync: bool,
}

/// The client's subscriptions.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next_key: u64,
    next_client_handle: u32,
    entries: HashMap<u64, Entry>,
    publishing: bool,
    /// Acknowledgements the next Publish carries besides those of the
    /// messages since the last one: after the session was activated on a
    /// new channel, the last sequence number received of each subscription
    /// (the Publish that acknowledged it may have died with the old
    /// connection, and a cluster node that took the session over learns
    /// from it which messages the old node sent - docs/cluster.md).
    reacks: Vec<t::SubscriptionAcknowledgement>,
}

impl Registry {
    fn by_server_id(&mut self, id: u32) -> Option<&mut Entry> {
        self.entries.values_mut().find(|e| e.server_id == id)
    }
}

/// A subscription: its server id, what the server granted, its monitored
/// items, and the stream of what it delivers ([`Subscription::recv`]).
/// Dropping it deletes it on the server. Events wait in an unbounded queue
/// until received: the publish loop never blocks on a slow reader, and a
/// reader that falls behind holds the backlog in memory.
#[derive(Debug)]
pub struct Subscription {
    shared: Arc<Shared>,
    key: u64,
    events: mpsc::UnboundedReceiver<SubscriptionEvent>,
    deleted: bool,
}

/// A monitored item as created.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitoredItem {
    /// The client handle its notifications carry.
    pub client_handle: u32,
    /// The server's answer (status, item id, revised sampling and queue).
    pub result: t::MonitoredItemCreateResult,
}

impl Client {
    /// Creates a subscription; its notifications arrive on the returned
    /// handle once items are added with [`Subscription::monitor`]. The
    /// client keeps Publish requests outstanding while it has
    /// subscriptions.
    pub async fn subscribe(
        &self,
        settings: SubscriptionSettings,
    ) -> Result<Subscription, ClientError> {
        let created: t::CreateSubscriptionResponse = self
            .request(&settings.request(self.request_header()))
            .await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let key = {
            let mut reg = self
                .shared
                .subscriptions
                .lock()
                .map_err(|_| ClientError::Closed)?;
            reg.next_key += 1;
            let key = reg.next_key;
            reg.entries.insert(
                key,
                Entry {
                    server_id: created.subscription_id,
                    revised: Revised::from_response(&created),
                    settings,
                    items: BTreeMap::new(),
                    events: tx,
                    tracker: SequenceTracker::default(),
                    resync: false,
                },
            );
            key
        };
        start_publishing(&self.shared);
        Ok(Subscription {
            shared: Arc::clone(&self.shared),
            key,
            events: rx,
            deleted: false,
        })
    }
}

impl Subscription {
    fn with<R>(&self, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let mut reg = self.shared.subscriptions.lock().ok()?;
        reg.entries.get_mut(&self.key).map(f)
    }

    /// The subscription's server id and the server's ids of the items of
    /// `client_handles` (0 for an unknown handle, which the server refuses).
    fn item_ids(&self, client_handles: &[u32]) -> Result<(u32, Vec<u32>), ClientError> {
        self.with(|e| {
            let ids: Vec<u32> = client_handles
                .iter()
                .map(|h| e.items.get(h).map_or(0, |(_, id)| *id))
                .collect();
            (e.server_id, ids)
        })
        .ok_or(ClientError::Closed)
    }

    /// The server's id for it now (it changes when the subscription had to
    /// be created again after a reconnect); 0 once it is gone.
    pub fn id(&self) -> u32 {
        self.with(|e| e.server_id).unwrap_or(0)
    }

    /// What the server granted; `None` once it is gone.
    pub fn revised(&self) -> Option<Revised> {
        self.with(|e| e.revised)
    }

    /// Adds monitored items; each gets a client handle (returned with the
    /// server's result). Items the server refused are not kept.
    pub async fn monitor(
        &self,
        items: Vec<MonitorItem>,
    ) -> Result<Vec<MonitoredItem>, ClientError> {
        let (id, handles) = {
            let mut reg = self
                .shared
                .subscriptions
                .lock()
                .map_err(|_| ClientError::Closed)?;
            let first = reg.next_client_handle;
            reg.next_client_handle = first.wrapping_add(items.len() as u32);
            let id = reg
                .entries
                .get(&self.key)
                .map(|e| e.server_id)
                .ok_or(ClientError::Closed)?;
            let handles: Vec<u32> = (0..items.len() as u32)
                .map(|i| first.wrapping_add(i).wrapping_add(1))
                .collect();
            (id, handles)
        };
        let resp: t::CreateMonitoredItemsResponse = self
            .shared
            .request(
                &t::CreateMonitoredItemsRequest {
                    request_header: self.shared.request_header(),
                    subscription_id: id,
                    timestamps_to_return: t::TimestampsToReturn::Both,
                    items_to_create: Some(
                        items
                            .iter()
                            .zip(&handles)
                            .map(|(item, h)| item.request(*h))
                            .collect(),
                    ),
                },
                None,
                self.shared.options.request_timeout,
            )
            .await?;
        let results = resp.results.unwrap_or_default();
        if results.len() != items.len() {
            return Err(ClientError::Decode(format!(
                "CreateMonitoredItems answered {} results for {} items",
                results.len(),
                items.len()
            )));
        }
        self.with(|e| {
            for ((item, handle), result) in items.iter().zip(&handles).zip(&results) {
                if result.status_code.is_good() {
                    e.items
                        .insert(*handle, (item.clone(), result.monitored_item_id));
                }
            }
        });
        Ok(handles
            .into_iter()
            .zip(results)
            .map(|(client_handle, result)| MonitoredItem {
                client_handle,
                result,
            })
            .collect())
    }

    /// Deletes monitored items by client handle; the status of each.
    pub async fn unmonitor(&self, client_handles: &[u32]) -> Result<Vec<StatusCode>, ClientError> {
        let (id, ids) = self.item_ids(client_handles)?;
        let resp: t::DeleteMonitoredItemsResponse = self
            .shared
            .request(
                &t::DeleteMonitoredItemsRequest {
                    request_header: self.shared.request_header(),
                    subscription_id: id,
                    monitored_item_ids: Some(ids),
                },
                None,
                self.shared.options.request_timeout,
            )
            .await?;
        self.with(|e| {
            for h in client_handles {
                e.items.remove(h);
            }
        });
        Ok(resp.results.unwrap_or_default())
    }

    /// ModifySubscription: new settings (the publishing-enabled flag is
    /// [`Subscription::set_publishing`]'s); what the server granted.
    pub async fn modify(&self, settings: SubscriptionSettings) -> Result<Revised, ClientError> {
        let id = self.with(|e| e.server_id).ok_or(ClientError::Closed)?;
        let create = settings.request(self.shared.request_header());
        let resp: t::ModifySubscriptionResponse = self
            .shared
            .request(
                &t::ModifySubscriptionRequest {
                    request_header: create.request_header,
                    subscription_id: id,
                    requested_publishing_interval: create.requested_publishing_interval,
                    requested_lifetime_count: create.requested_lifetime_count,
                    requested_max_keep_alive_count: create.requested_max_keep_alive_count,
                    max_notifications_per_publish: create.max_notifications_per_publish,
                    priority: create.priority,
                },
                None,
                self.shared.options.request_timeout,
            )
            .await?;
        let revised = Revised::from_response(&t::CreateSubscriptionResponse {
            revised_publishing_interval: resp.revised_publishing_interval,
            revised_lifetime_count: resp.revised_lifetime_count,
            revised_max_keep_alive_count: resp.revised_max_keep_alive_count,
            ..Default::default()
        });
        self.with(|e| {
            let enabled = e.settings.publishing_enabled;
            e.settings = SubscriptionSettings {
                publishing_enabled: enabled,
                ..settings
            };
            e.revised = revised;
        });
        Ok(revised)
    }

    /// SetPublishingMode: pauses (false) or resumes (true) notifications;
    /// keep-alives go on.
    pub async fn set_publishing(&self, enabled: bool) -> Result<(), ClientError> {
        let id = self.with(|e| e.server_id).ok_or(ClientError::Closed)?;
        let resp: t::SetPublishingModeResponse = self
            .shared
            .request(
                &t::SetPublishingModeRequest {
                    request_header: self.shared.request_header(),
                    publishing_enabled: enabled,
                    subscription_ids: Some(vec![id]),
                },
                None,
                self.shared.options.request_timeout,
            )
            .await?;
        first_status(resp.results)?;
        self.with(|e| e.settings.publishing_enabled = enabled);
        Ok(())
    }

    /// SetMonitoringMode of items by client handle (kept for a re-creation
    /// after a reconnect); the status of each.
    pub async fn set_monitoring_mode(
        &self,
        client_handles: &[u32],
        mode: t::MonitoringMode,
    ) -> Result<Vec<StatusCode>, ClientError> {
        let (id, ids) = self.item_ids(client_handles)?;
        let resp: t::SetMonitoringModeResponse = self
            .shared
            .request(
                &t::SetMonitoringModeRequest {
                    request_header: self.shared.request_header(),
                    subscription_id: id,
                    monitoring_mode: mode,
                    monitored_item_ids: Some(ids),
                },
                None,
                self.shared.options.request_timeout,
            )
            .await?;
        let results = resp.results.unwrap_or_default();
        self.with(|e| {
            for (h, r) in client_handles.iter().zip(&results) {
                if r.is_good() {
                    if let Some((item, _)) = e.items.get_mut(h) {
                        item.mode = mode;
                    }
                }
            }
        });
        Ok(results)
    }

    /// The next event; `None` once the subscription is gone and everything
    /// was received.
    pub async fn recv(&mut self) -> Option<SubscriptionEvent> {
        self.events.recv().await
    }

    /// The next event if one is there.
    pub fn try_recv(&mut self) -> Option<SubscriptionEvent> {
        self.events.try_recv().ok()
    }

    /// Deletes it on the server (the stream ends).
    pub async fn delete(mut self) -> Result<(), ClientError> {
        self.deleted = true;
        let entry = self
            .shared
            .subscriptions
            .lock()
            .ok()
            .and_then(|mut r| r.entries.remove(&self.key));
        let Some(entry) = entry else {
            return Ok(());
        };
        delete_on_server(&self.shared, entry.server_id).await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let entry = self
            .shared
            .subscriptions
            .lock()
            .ok()
            .and_then(|mut r| r.entries.remove(&self.key));
        let (Some(entry), Ok(rt)) = (entry, tokio::runtime::Handle::try_current()) else {
            return;
        };
        if self.shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        rt.spawn(async move {
            let _ = delete_on_server(&shared, entry.server_id).await;
        });
    }
}

async fn delete_on_server(shared: &Shared, id: u32) -> Result<(), ClientError> {
    let resp: t::DeleteSubscriptionsResponse = shared
        .request(
            &t::DeleteSubscriptionsRequest {
                request_header: shared.request_header(),
                subscription_ids: Some(vec![id]),
            },
            None,
            shared.options.request_timeout,
        )
        .await?;
    first_status(resp.results)
}

/// The first status of a per-subscription result list, as an error when
/// Bad.
fn first_status(results: Option<Vec<StatusCode>>) -> Result<(), ClientError> {
    match results.unwrap_or_default().first() {
        Some(s) if s.is_bad() => Err(ClientError::Service {
            status: *s,
            retry_after_ms: None,
            retry_ticket: None,
        }),
        Some(_) => Ok(()),
        None => Err(ClientError::Decode("a result list without results".into())),
    }
}

/// Every subscription ends (the client is closed).
pub(crate) fn end_all(shared: &Shared, status: StatusCode) {
    if let Ok(mut reg) = shared.subscriptions.lock() {
        for (_, e) in reg.entries.drain() {
            let _ = e.events.send(SubscriptionEvent::Ended(status));
        }
    }
}

/// The same session is active on a new channel: each subscription's last
/// received sequence number is acknowledged again in the first Publish on
/// it (call this before the channel is installed, so that no Publish goes
/// out without them).
pub(crate) fn restored(shared: &Shared, how: Restore) {
    if let Ok(mut reg) = shared.subscriptions.lock() {
        reg.reactivated(how);
    }
}

impl Registry {
    /// The session is active on a new channel: each subscription resyncs
    /// its acknowledgements with the next answer, its last received
    /// sequence number is queued for the next Publish, and its stream
    /// hears how it came back.
    fn reactivated(&mut self, how: Restore) {
        let Registry {
            entries, reacks, ..
        } = self;
        for e in entries.values_mut() {
            e.resync = true;
            if let Some(last) = e.tracker.last() {
                let ack = t::SubscriptionAcknowledgement {
                    subscription_id: e.server_id,
                    sequence_number: last,
                };
                if !reacks.contains(&ack) {
                    reacks.push(ack);
                }
            }
            let _ = e.events.send(SubscriptionEvent::Restored(how));
        }
    }
}

/// A new session takes the subscriptions over: TransferSubscriptions, and
/// those the server will not transfer are created again with their items.
pub(crate) async fn take_over(shared: &Arc<Shared>, link: &Link) -> Result<(), ClientError> {
    let ids: Vec<(u64, u32)> = match shared.subscriptions.lock() {
        Ok(reg) => reg.entries.iter().map(|(k, e)| (*k, e.server_id)).collect(),
        Err(_) => return Err(ClientError::Closed),
    };
    if ids.is_empty() {
        return Ok(());
    }
    let transferred: Result<t::TransferSubscriptionsResponse, _> = shared
        .request(
            &t::TransferSubscriptionsRequest {
                request_header: shared.request_header(),
                subscription_ids: Some(ids.iter().map(|(_, id)| *id).collect()),
                send_initial_values: true,
            },
            Some(link),
            shared.options.request_timeout,
        )
        .await;
    let results = match transferred {
        Ok(r) => r.results.unwrap_or_default(),
        // A server without TransferSubscriptions: create them all again.
        Err(ClientError::Service { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    for (i, (key, _)) in ids.iter().enumerate() {
        let moved = results.get(i).is_some_and(|r| r.status_code.is_good());
        if moved {
            if let Ok(mut reg) = shared.subscriptions.lock() {
                if let Some(e) = reg.entries.get_mut(key) {
                    e.resync = true;
                    let _ = e
                        .events
                        .send(SubscriptionEvent::Restored(Restore::Transferred));
                }
            }
            continue;
        }
        recreate(shared, Some(link), *key).await?;
    }
    Ok(())
}

/// Creates subscription `key` and its items again (the server lost it).
/// A refusal by the server ends that subscription; a lost connection is
/// an error (the caller tries again).
async fn recreate(shared: &Shared, via: Option<&Link>, key: u64) -> Result<(), ClientError> {
    let Some((settings, items)) = shared.subscriptions.lock().ok().and_then(|reg| {
        reg.entries.get(&key).map(|e| {
            let items: Vec<(u32, MonitorItem)> =
                e.items.iter().map(|(h, (m, _))| (*h, m.clone())).collect();
            (e.settings.clone(), items)
        })
    }) else {
        return Ok(());
    };
    let timeout = shared.options.request_timeout;
    let created: t::CreateSubscriptionResponse = match shared
        .request(&settings.request(shared.request_header()), via, timeout)
        .await
    {
        Ok(c) => c,
        Err(ClientError::Service { status, .. }) => {
            end_one(shared, key, status);
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut item_ids = Vec::new();
    if !items.is_empty() {
        let resp: t::CreateMonitoredItemsResponse = shared
            .request(
                &t::CreateMonitoredItemsRequest {
                    request_header: shared.request_header(),
                    subscription_id: created.subscription_id,
                    timestamps_to_return: t::TimestampsToReturn::Both,
                    items_to_create: Some(items.iter().map(|(h, m)| m.request(*h)).collect()),
                },
                via,
                timeout,
            )
            .await?;
        item_ids = resp.results.unwrap_or_default();
    }
    if let Ok(mut reg) = shared.subscriptions.lock() {
        if let Some(e) = reg.entries.get_mut(&key) {
            e.server_id = created.subscription_id;
            e.revised = Revised::from_response(&created);
            e.tracker.reset();
            e.resync = false;
            for ((h, _), r) in items.iter().zip(&item_ids) {
                if r.status_code.is_good() {
                    if let Some(slot) = e.items.get_mut(h) {
                        slot.1 = r.monitored_item_id;
                    }
                } else {
                    e.items.remove(h);
                }
            }
            let _ = e
                .events
                .send(SubscriptionEvent::Restored(Restore::Recreated));
        }
    }
    Ok(())
}

fn end_one(shared: &Shared, key: u64, status: StatusCode) {
    if let Ok(mut reg) = shared.subscriptions.lock() {
        if let Some(e) = reg.entries.remove(&key) {
            let _ = e.events.send(SubscriptionEvent::Ended(status));
        }
    }
}

/// Starts the publish loop unless it runs.
fn start_publishing(shared: &Arc<Shared>) {
    let start = match shared.subscriptions.lock() {
        Ok(mut reg) if !reg.publishing => {
            reg.publishing = true;
            true
        }
        _ => false,
    };
    if start {
        tokio::spawn(publish_loop(Arc::clone(shared)));
    }
}

/// Keeps Publish requests outstanding while the client has subscriptions.
async fn publish_loop(shared: Arc<Shared>) {
    // Each Publish with the session token it was sent with.
    let mut inflight: JoinSet<(t::NodeId, Result<t::PublishResponse, ClientError>)> =
        JoinSet::new();
    let mut acks: Vec<t::SubscriptionAcknowledgement> = Vec::new();
    let mut limit = usize::MAX;
    loop {
        // Stop (under the registry's lock, so that a new subscription
        // starts a new loop) when there is nothing to publish for.
        let (count, span) = match shared.subscriptions.lock() {
            Ok(mut reg) => {
                if reg.entries.is_empty() || shared.closing.load(Ordering::SeqCst) {
                    reg.publishing = false;
                    break;
                }
                for ack in reg.reacks.drain(..) {
                    if !acks.contains(&ack) {
                        acks.push(ack);
                    }
                }
                let span = reg
                    .entries
                    .values()
                    .map(|e| e.revised.keep_alive_span())
                    .max()
                    .unwrap_or_default();
                (reg.entries.len(), span)
            }
            Err(_) => break,
        };
        let target = shared
            .options
            .publish_requests
            .max(1)
            .min(count + 1)
            .min(limit);
        // A Publish may be held for a keep-alive span before it is answered.
        let timeout = span.saturating_mul(2) + shared.options.request_timeout;
        while inflight.len() < target {
            let mut header = shared.request_header();
            header.timeout_hint = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
            let request = t::PublishRequest {
                request_header: header,
                subscription_acknowledgements: Some(std::mem::take(&mut acks)),
            };
            let s = Arc::clone(&shared);
            let token = request.request_header.authentication_token.clone();
            inflight.spawn(async move { (token, s.request(&request, None, timeout).await) });
        }
        let Some(done) = inflight.join_next().await else {
            continue;
        };
        let Ok((token, result)) = done else {
            continue;
        };
        match result {
            Ok(resp) => deliver(&shared, resp, &mut acks).await,
            Err(e) => match e.status_code() {
                // The server holds fewer Publishes than we sent: send fewer.
                StatusCode::BadTooManyPublishRequests => {
                    limit = inflight.len().max(1);
                }
                // Its timeout hint passed: ask again.
                StatusCode::BadTimeout => {}
                // The server has none of our subscriptions (they expired
                // while we were away): create them again.
                StatusCode::BadNoSubscription => {
                    let keys: Vec<u64> = shared
                        .subscriptions
                        .lock()
                        .map(|r| r.entries.keys().copied().collect())
                        .unwrap_or_default();
                    for key in keys {
                        if recreate(&shared, None, key).await.is_err() {
                            break;
                        }
                    }
                }
                // The server no longer knows the session, while the
                // channel works (it timed out while we were silent, or
                // the server closed it): a new session takes the
                // subscriptions over - once, not for every Publish that
                // was still out with the old token.
                StatusCode::BadSessionIdInvalid
                | StatusCode::BadSessionClosed
                | StatusCode::BadSessionNotActivated
                    if shared.session_token().as_ref() == Some(&token) =>
                {
                    if shared.closing.load(Ordering::SeqCst) {
                        break;
                    }
                    if !shared.options.reconnect {
                        end_all(&shared, e.status_code());
                        break;
                    }
                    if let Err(e) = shared.session_lost().await {
                        tracing::debug!(error = %e, "no new session; waiting for the channel");
                        if !wait_usable(&shared).await {
                            break;
                        }
                    }
                }
                _ => {
                    // The channel or session is gone: wait for the
                    // reconnect (or the end).
                    if !wait_usable(&shared).await {
                        break;
                    }
                }
            },
        }
    }
    inflight.abort_all();
    if let Ok(mut reg) = shared.subscriptions.lock() {
        reg.publishing = false;
    }
}

/// After a failed Publish: waits until the client is connected again;
/// false when it is closed.
async fn wait_usable(shared: &Shared) -> bool {
    let mut states = shared.state.subscribe();
    let connected = states
        .wait_for(|s| matches!(s, LinkState::Connected | LinkState::Closed(_)))
        .await
        .map(|s| matches!(*s, LinkState::Connected))
        .unwrap_or(false);
    // Connected but the Publish failed (the session is being replaced):
    // do not spin.
    tokio::time::sleep(Duration::from_millis(50)).await;
    connected && !shared.closing.load(Ordering::SeqCst)
}

/// Routes one PublishResponse: Republishes what is missing before it,
/// hands it to its subscription's stream, and notes the acknowledgements.
async fn deliver(
    shared: &Shared,
    resp: t::PublishResponse,
    acks: &mut Vec<t::SubscriptionAcknowledgement>,
) {
    let sub_id = resp.subscription_id;
    let message = resp.notification_message;
    let seq = message.sequence_number;
    let keep_alive = message
        .notification_data
        .as_ref()
        .is_none_or(|d| d.is_empty());
    let ack = |n: u32| t::SubscriptionAcknowledgement {
        subscription_id: sub_id,
        sequence_number: n,
    };
    let arrival = {
        let Ok(mut reg) = shared.subscriptions.lock() else {
            return;
        };
        let Some(entry) = reg.by_server_id(sub_id) else {
            return;
        };
        if entry.resync {
            entry.resync = false;
            for n in resp.available_sequence_numbers.iter().flatten() {
                if entry.tracker.seen(*n) && !acks.contains(&ack(*n)) {
                    acks.push(ack(*n));
                }
            }
        }
        if keep_alive {
            entry.tracker.keep_alive(seq)
        } else {
            Some(entry.tracker.arrive(seq))
        }
    };
    let mut out = Vec::new();
    match arrival {
        Some(Arrival::Duplicate) => {
            acks.push(ack(seq));
            return;
        }
        Some(Arrival::Gap { republish, lost }) => {
            let mut missing: Option<(u32, u32)> = None;
            for n in republish {
                match republish_one(shared, sub_id, n).await {
                    Ok(m) => {
                        if let Some((first, count)) = missing.take() {
                            out.push(SubscriptionEvent::Lost { first, count });
                        }
                        acks.push(ack(n));
                        out.push(SubscriptionEvent::Notifications {
                            sequence_number: n,
                            publish_time: m.publish_time,
                            notifications: notifications(m),
                            republished: true,
                        });
                    }
                    Err(_) => {
                        missing = Some(match missing {
                            Some((first, count)) => (first, count + 1),
                            None => (n, 1),
                        });
                    }
                }
            }
            if let Some((first, count)) = missing {
                out.push(SubscriptionEvent::Lost { first, count });
            }
            if let Some((first, count)) = lost {
                out.push(SubscriptionEvent::Lost { first, count });
            }
        }
        Some(Arrival::InOrder) | None => {}
    }
    let mut ended = None;
    if keep_alive {
        out.push(SubscriptionEvent::KeepAlive {
            next_sequence_number: seq,
            publish_time: message.publish_time,
        });
    } else {
        acks.push(ack(seq));
        let publish_time = message.publish_time;
        let list = notifications(message);
        ended = list.iter().find_map(|n| match n {
            Notification::StatusChange(s)
                if s.is_bad() || *s == StatusCode::GoodSubscriptionTransferred =>
            {
                Some(*s)
            }
            _ => None,
        });
        out.push(SubscriptionEvent::Notifications {
            sequence_number: seq,
            publish_time,
            notifications: list,
            republished: false,
        });
    }
    if let Ok(mut reg) = shared.subscriptions.lock() {
        let key = reg
            .entries
            .iter()
            .find(|(_, e)| e.server_id == sub_id)
            .map(|(k, _)| *k);
        if let Some(key) = key {
            if let Some(e) = reg.entries.get(&key) {
                for ev in out {
                    let _ = e.events.send(ev);
                }
            }
            if let Some(status) = ended {
                if let Some(e) = reg.entries.remove(&key) {
                    let _ = e.events.send(SubscriptionEvent::Ended(status));
                }
            }
        }
    }
}

async fn republish_one(
    shared: &Shared,
    sub_id: u32,
    seq: u32,
) -> Result<t::NotificationMessage, ClientError> {
    let resp: t::RepublishResponse = shared
        .request(
            &t::RepublishRequest {
                request_header: shared.request_header(),
                subscription_id: sub_id,
                retransmit_sequence_number: seq,
            },
            None,
            shared.options.request_timeout,
        )
        .await?;
    Ok(resp.notification_message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(server_id: u32, events: mpsc::UnboundedSender<SubscriptionEvent>) -> Entry {
        Entry {
            server_id,
            settings: SubscriptionSettings::default(),
            revised: Revised::from_response(&t::CreateSubscriptionResponse::default()),
            items: BTreeMap::new(),
            events,
            tracker: SequenceTracker::default(),
            resync: false,
        }
    }

    /// After a reactivation the next Publish acknowledges the last message
    /// each subscription received (the one that acknowledged it may have
    /// died with the old connection): a cluster node that took the session
    /// over learns from it what the old node sent.
    #[test]
    fn a_reactivation_queues_the_last_received_sequence_numbers() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut reg = Registry::default();
        let mut seen = entry(7, tx.clone());
        for n in [1, 2, 3] {
            seen.tracker.arrive(n);
        }
        reg.entries.insert(1, seen);
        // Nothing received yet: nothing to acknowledge.
        reg.entries.insert(2, entry(8, tx));
        reg.reactivated(Restore::Reactivated);
        assert_eq!(
            reg.reacks,
            vec![t::SubscriptionAcknowledgement {
                subscription_id: 7,
                sequence_number: 3,
            }]
        );
        assert!(reg.entries.values().all(|e| e.resync));
        // Twice (a second reconnect before a Publish went out): once.
        reg.reactivated(Restore::Reactivated);
        assert_eq!(reg.reacks.len(), 1);
        let mut restores = 0;
        while let Ok(e) = rx.try_recv() {
            assert_eq!(e, SubscriptionEvent::Restored(Restore::Reactivated));
            restores += 1;
        }
        assert_eq!(restores, 4);
    }
}
