//! Subscriptions, the part without I/O: what a client asks for
//! ([`SubscriptionSettings`], [`MonitorItem`]), what it hands to the
//! application ([`SubscriptionEvent`], [`Notification`]), and the sequence
//! number bookkeeping that decides what to acknowledge and what to Republish.
//! The publish loop that drives this lives in `net/`.

use std::time::Duration;

use uascale_types as t;
use uascale_types::{DataValue, DateTime, NodeId, QualifiedName, StatusCode, Variant};

/// What a subscription is created with (Part 4 §5.13.2). The server revises
/// these; the revised values are on the [`Subscription`](crate::Subscription).
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionSettings {
    /// How often notifications are sent. Default 1 s.
    pub publishing_interval: Duration,
    /// Publishing intervals without a Publish before the server deletes the
    /// subscription. Default 60 (at least 3 x the keep-alive count).
    pub lifetime_count: u32,
    /// Publishing intervals without a notification before a keep-alive is
    /// sent. Default 10.
    pub max_keep_alive_count: u32,
    /// Most notifications in one NotificationMessage; 0 = no limit.
    pub max_notifications_per_publish: u32,
    /// Relative priority among the session's subscriptions.
    pub priority: u8,
    /// Whether publishing starts enabled. Default true.
    pub publishing_enabled: bool,
}

impl Default for SubscriptionSettings {
    fn default() -> Self {
        SubscriptionSettings {
            publishing_interval: Duration::from_secs(1),
            lifetime_count: 60,
            max_keep_alive_count: 10,
            max_notifications_per_publish: 0,
            priority: 0,
            publishing_enabled: true,
        }
    }
}

impl SubscriptionSettings {
    /// Settings with this publishing interval and the defaults otherwise.
    pub fn with_interval(interval: Duration) -> Self {
        SubscriptionSettings {
            publishing_interval: interval,
            ..Default::default()
        }
    }

    /// The CreateSubscription request for these settings.
    pub fn request(&self, request_header: t::RequestHeader) -> t::CreateSubscriptionRequest {
        t::CreateSubscriptionRequest {
            request_header,
            requested_publishing_interval: self.publishing_interval.as_secs_f64() * 1000.0,
            requested_lifetime_count: self.lifetime_count.max(3 * self.max_keep_alive_count),
            requested_max_keep_alive_count: self.max_keep_alive_count,
            max_notifications_per_publish: self.max_notifications_per_publish,
            publishing_enabled: self.publishing_enabled,
            priority: self.priority,
        }
    }
}

/// What the server granted for a subscription.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Revised {
    /// The revised publishing interval.
    pub publishing_interval: Duration,
    /// The revised lifetime count.
    pub lifetime_count: u32,
    /// The revised keep-alive count.
    pub max_keep_alive_count: u32,
}

impl Revised {
    /// From a CreateSubscription response.
    pub fn from_response(r: &t::CreateSubscriptionResponse) -> Self {
        let ms = if r.revised_publishing_interval.is_finite() {
            r.revised_publishing_interval.max(0.0)
        } else {
            0.0
        };
        Revised {
            publishing_interval: Duration::from_secs_f64(ms.min(1e9) / 1000.0),
            lifetime_count: r.revised_lifetime_count,
            max_keep_alive_count: r.revised_max_keep_alive_count,
        }
    }

    /// The longest the server may stay silent: keep-alive count x interval.
    pub fn keep_alive_span(&self) -> Duration {
        self.publishing_interval
            .saturating_mul(self.max_keep_alive_count.max(1))
    }
}

/// One item to monitor: a node's attribute (data changes) or a node's
/// events. The client handle is assigned by the client.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorItem {
    /// The node and attribute.
    pub item: t::ReadValueId,
    /// Reporting, sampling or disabled. Default reporting.
    pub mode: t::MonitoringMode,
    /// Sampling interval in ms; -1 = the publishing interval (default),
    /// 0 = the fastest the server offers.
    pub sampling_interval: f64,
    /// Queue size on the server. Default 1 (10 for events... see
    /// [`MonitorItem::events`]).
    pub queue_size: u32,
    /// Whether the oldest value is dropped when the queue is full. Default
    /// true.
    pub discard_oldest: bool,
    /// A DataChangeFilter, EventFilter or AggregateFilter; null for none.
    pub filter: t::ExtensionObject,
}

impl MonitorItem {
    /// The Value attribute of `node`.
    pub fn value(node: NodeId) -> Self {
        MonitorItem {
            item: t::ReadValueId {
                node_id: node,
                attribute_id: t::AttributeId::Value as u32,
                ..Default::default()
            },
            mode: t::MonitoringMode::Reporting,
            sampling_interval: -1.0,
            queue_size: 1,
            discard_oldest: true,
            filter: t::ExtensionObject::null(),
        }
    }

    /// The events of `node` (its EventNotifier attribute) with `filter`
    /// (see [`event_filter`]).
    pub fn events(node: NodeId, filter: t::EventFilter) -> Self {
        MonitorItem {
            item: t::ReadValueId {
                node_id: node,
                attribute_id: t::AttributeId::EventNotifier as u32,
                ..Default::default()
            },
            mode: t::MonitoringMode::Reporting,
            sampling_interval: 0.0,
            queue_size: 100,
            discard_oldest: true,
            filter: t::ExtensionObject::new(filter),
        }
    }

    /// With this sampling interval (ms).
    pub fn sampling(mut self, ms: f64) -> Self {
        self.sampling_interval = ms;
        self
    }

    /// With this queue size and discard policy.
    pub fn queue(mut self, size: u32, discard_oldest: bool) -> Self {
        self.queue_size = size;
        self.discard_oldest = discard_oldest;
        self
    }

    /// With this filter.
    pub fn filter(mut self, filter: t::ExtensionObject) -> Self {
        self.filter = filter;
        self
    }

    /// The CreateMonitoredItems entry for `client_handle`.
    pub fn request(&self, client_handle: u32) -> t::MonitoredItemCreateRequest {
        t::MonitoredItemCreateRequest {
            item_to_monitor: self.item.clone(),
            monitoring_mode: self.mode,
            requested_parameters: t::MonitoringParameters {
                client_handle,
                sampling_interval: self.sampling_interval,
                filter: self.filter.clone(),
                queue_size: self.queue_size,
                discard_oldest: self.discard_oldest,
            },
        }
    }
}

/// An EventFilter selecting these BaseEventType fields by browse name
/// (`EventId`, `EventType`, `SourceName`, `Time`, `Message`, `Severity`,
/// ...; a path like `EnabledState/Id` names a sub-property), with `where`
/// as its where clause (an empty ContentFilter for all events).
pub fn event_filter(fields: &[&str], where_clause: t::ContentFilter) -> t::EventFilter {
    let select = fields
        .iter()
        .map(|f| t::SimpleAttributeOperand {
            type_definition_id: NodeId::ns0(2041), // BaseEventType
            browse_path: Some(f.split('/').map(|p| QualifiedName::new(0, p)).collect()),
            attribute_id: t::AttributeId::Value as u32,
            index_range: t::UaString::null(),
        })
        .collect();
    t::EventFilter {
        select_clauses: Some(select),
        where_clause,
    }
}

/// One notification of a NotificationMessage.
#[derive(Debug, Clone, PartialEq)]
pub enum Notification {
    /// A monitored item's new value.
    DataChange {
        /// The item's client handle.
        client_handle: u32,
        /// The value.
        value: DataValue,
    },
    /// An event, its fields in the order of the select clauses.
    Event {
        /// The item's client handle.
        client_handle: u32,
        /// The selected fields.
        fields: Vec<Variant>,
    },
    /// The subscription's status changed (BadTimeout: the server deleted it
    /// after its lifetime; GoodSubscriptionTransferred: another session
    /// took it over).
    StatusChange(StatusCode),
}

/// How a subscription came back after its connection was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    /// The same session was activated on a new channel; nothing was lost
    /// that the server still had (gaps are Republished).
    Reactivated,
    /// A new session took the subscription over (TransferSubscriptions).
    Transferred,
    /// The subscription and its items were created anew: values that
    /// changed while disconnected arrive as initial values, events are lost.
    Recreated,
}

/// What a subscription's stream yields.
#[derive(Debug, Clone, PartialEq)]
pub enum SubscriptionEvent {
    /// A NotificationMessage.
    Notifications {
        /// Its sequence number.
        sequence_number: u32,
        /// When the server sent it.
        publish_time: DateTime,
        /// Its notifications.
        notifications: Vec<Notification>,
        /// Whether it came from a Republish (it was missed first).
        republished: bool,
    },
    /// A keep-alive: the subscription is alive, nothing changed.
    KeepAlive {
        /// The sequence number the next notification will have.
        next_sequence_number: u32,
        /// When the server sent it.
        publish_time: DateTime,
    },
    /// Messages that were missed and that the server no longer has.
    Lost {
        /// The first missing sequence number.
        first: u32,
        /// How many.
        count: u32,
    },
    /// The connection was lost and the subscription is back.
    Restored(Restore),
    /// The subscription is gone (deleted by the server or on close); the
    /// stream ends after this.
    Ended(StatusCode),
}

/// The notifications of a NotificationMessage, in order; undecodable
/// notification data (another type than the three of Part 4) is skipped.
pub fn notifications(message: t::NotificationMessage) -> Vec<Notification> {
    let mut out = Vec::new();
    for data in message.notification_data.unwrap_or_default() {
        let data = match data.downcast::<t::DataChangeNotification>() {
            Ok(dc) => {
                out.extend(dc.monitored_items.unwrap_or_default().into_iter().map(|m| {
                    Notification::DataChange {
                        client_handle: m.client_handle,
                        value: m.value,
                    }
                }));
                continue;
            }
            Err(other) => other,
        };
        let data = match data.downcast::<t::EventNotificationList>() {
            Ok(ev) => {
                out.extend(ev.events.unwrap_or_default().into_iter().map(|e| {
                    Notification::Event {
                        client_handle: e.client_handle,
                        fields: e.event_fields.unwrap_or_default(),
                    }
                }));
                continue;
            }
            Err(other) => other,
        };
        if let Ok(sc) = data.downcast::<t::StatusChangeNotification>() {
            out.push(Notification::StatusChange(sc.status));
        }
    }
    out
}

/// The sequence number after `n` (they wrap from u32::MAX to 1; 0 is never
/// used).
pub fn next_sequence_number(n: u32) -> u32 {
    if n == u32::MAX {
        1
    } else {
        n + 1
    }
}

/// At most this many missed messages are asked for by Republish at once;
/// beyond, they are reported [`SubscriptionEvent::Lost`].
pub const MAX_REPUBLISH: u32 = 64;

/// What to do with an arriving message's sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// The next one: deliver it.
    InOrder,
    /// Messages are missing before it: Republish `republish` (oldest first),
    /// report `lost` as lost, then deliver it.
    Gap {
        /// Sequence numbers to ask for again.
        republish: Vec<u32>,
        /// Missing ones beyond [`MAX_REPUBLISH`]: (first, count).
        lost: Option<(u32, u32)>,
    },
    /// Already seen (a duplicate after a reconnect): acknowledge, do not
    /// deliver.
    Duplicate,
}

/// One subscription's sequence-number state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SequenceTracker {
    last: Option<u32>,
}

impl SequenceTracker {
    /// The last sequence number delivered.
    pub fn last(&self) -> Option<u32> {
        self.last
    }

    /// Forgets everything (a re-created subscription starts anew).
    pub fn reset(&mut self) {
        self.last = None;
    }

    /// Whether `seq` is at or before the last delivered one (within half
    /// the number space, so wrapping is handled).
    pub fn seen(&self, seq: u32) -> bool {
        match self.last {
            None => false,
            Some(last) => last.wrapping_sub(seq) < (1 << 31),
        }
    }

    /// A NotificationMessage `seq` arrived.
    pub fn arrive(&mut self, seq: u32) -> Arrival {
        let Some(last) = self.last else {
            self.last = Some(seq);
            return Arrival::InOrder;
        };
        if self.seen(seq) {
            return Arrival::Duplicate;
        }
        self.last = Some(seq);
        let expected = next_sequence_number(last);
        if seq == expected {
            return Arrival::InOrder;
        }
        Self::gap(expected, seq)
    }

    /// A keep-alive announcing `next` as the next sequence number arrived:
    /// messages before it that never came are missing.
    pub fn keep_alive(&mut self, next: u32) -> Option<Arrival> {
        let last = self.last?;
        let expected = next_sequence_number(last);
        if next == expected || self.seen(next) {
            return None;
        }
        // Everything before `next` is accounted for once handled.
        let before = if next == 1 { u32::MAX } else { next - 1 };
        self.last = Some(before);
        Some(Self::gap(expected, next))
    }

    fn gap(from: u32, until: u32) -> Arrival {
        let missing = until.wrapping_sub(from) - u32::from(until < from);
        let mut republish = Vec::new();
        let mut n = from;
        while n != until && (republish.len() as u32) < MAX_REPUBLISH {
            republish.push(n);
            n = next_sequence_number(n);
        }
        let lost = (missing > MAX_REPUBLISH).then(|| (n, missing - MAX_REPUBLISH));
        Arrival::Gap { republish, lost }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gaps_and_duplicates() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.arrive(5), Arrival::InOrder);
        assert_eq!(t.arrive(6), Arrival::InOrder);
        assert_eq!(
            t.arrive(9),
            Arrival::Gap {
                republish: vec![7, 8],
                lost: None
            }
        );
        assert_eq!(t.arrive(8), Arrival::Duplicate);
        assert_eq!(t.arrive(9), Arrival::Duplicate);
        assert_eq!(t.arrive(10), Arrival::InOrder);
        assert!(t.seen(3) && t.seen(10) && !t.seen(11));
    }

    #[test]
    fn wrapping_sequence_numbers() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.arrive(u32::MAX - 1), Arrival::InOrder);
        assert_eq!(t.arrive(u32::MAX), Arrival::InOrder);
        assert_eq!(t.arrive(1), Arrival::InOrder);
        assert_eq!(
            t.arrive(3),
            Arrival::Gap {
                republish: vec![2],
                lost: None
            }
        );
        let mut t = SequenceTracker::default();
        t.arrive(u32::MAX - 1);
        assert_eq!(
            t.arrive(2),
            Arrival::Gap {
                republish: vec![u32::MAX, 1],
                lost: None
            }
        );
    }

    #[test]
    fn long_gaps_are_partly_lost() {
        let mut t = SequenceTracker::default();
        t.arrive(1);
        let Arrival::Gap { republish, lost } = t.arrive(1002) else {
            panic!("a gap");
        };
        assert_eq!(republish.len() as u32, MAX_REPUBLISH);
        assert_eq!(republish[0], 2);
        assert_eq!(lost, Some((2 + MAX_REPUBLISH, 1000 - MAX_REPUBLISH)));
    }

    #[test]
    fn keep_alive_reveals_missing_messages() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.keep_alive(4), None, "nothing delivered yet");
        t.arrive(3);
        assert_eq!(t.keep_alive(4), None);
        assert_eq!(
            t.keep_alive(6),
            Some(Arrival::Gap {
                republish: vec![4, 5],
                lost: None
            })
        );
        assert_eq!(t.last(), Some(5));
        assert_eq!(t.arrive(6), Arrival::InOrder);
    }

    #[test]
    fn notification_data_is_decoded_in_order() {
        let message = t::NotificationMessage {
            sequence_number: 1,
            publish_time: DateTime::MIN,
            notification_data: Some(vec![
                t::ExtensionObject::new(t::DataChangeNotification {
                    monitored_items: Some(vec![t::MonitoredItemNotification {
                        client_handle: 7,
                        value: DataValue::value(Variant::Int32(3)),
                    }]),
                    diagnostic_infos: None,
                }),
                t::ExtensionObject::new(t::EventNotificationList {
                    events: Some(vec![t::EventFieldList {
                        client_handle: 8,
                        event_fields: Some(vec![Variant::UInt16(500)]),
                    }]),
                }),
                t::ExtensionObject::new(t::StatusChangeNotification {
                    status: StatusCode::BadTimeout,
                    diagnostic_info: Default::default(),
                }),
            ]),
        };
        assert_eq!(
            notifications(message),
            vec![
                Notification::DataChange {
                    client_handle: 7,
                    value: DataValue::value(Variant::Int32(3))
                },
                Notification::Event {
                    client_handle: 8,
                    fields: vec![Variant::UInt16(500)]
                },
                Notification::StatusChange(StatusCode::BadTimeout),
            ]
        );
    }

    #[test]
    fn settings_keep_lifetime_above_three_keep_alives() {
        let s = SubscriptionSettings {
            lifetime_count: 5,
            max_keep_alive_count: 10,
            ..Default::default()
        };
        let r = s.request(Default::default());
        assert_eq!(r.requested_lifetime_count, 30);
        assert_eq!(r.requested_publishing_interval, 1000.0);
    }
}
