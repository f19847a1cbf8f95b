//! The publish state machine and monitored items on a simulated clock.

// One real instant is the origin of each test's simulated time.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use uascale_types::{
    DataChangeNotification, DataChangeTrigger, DataValue, DateTime, MonitoringMode, NodeId,
    PublishResponse, StatusChangeNotification, StatusCode, SubscriptionAcknowledgement,
    TimestampsToReturn, UaString, Variant,
};

use super::item::{Filter, ItemTarget, MonitoredItem, OVERFLOW_BITS};
use super::*;

struct Clock {
    t0: Instant,
    ms: u64,
}

impl Clock {
    fn new() -> Self {
        Clock {
            t0: Instant::now(),
            ms: 0,
        }
    }
    fn now(&self) -> Now {
        Now {
            instant: self.t0 + Duration::from_millis(self.ms),
            utc: DateTime::from_ticks(self.ms as i64 * 10_000),
        }
    }
}

type Set = SubscriptionSet<u32>;

fn requested(interval: f64, lifetime: u32, keep_alive: u32) -> Requested {
    Requested {
        publishing_interval: interval,
        lifetime_count: lifetime,
        max_keep_alive_count: keep_alive,
        max_notifications_per_publish: 0,
        priority: 0,
    }
}

fn sub(clock: &Clock, id: u32, interval: f64, lifetime: u32, keep_alive: u32) -> Subscription {
    let r = requested(interval, lifetime, keep_alive);
    let revised = SubscriptionLimits::default().revise(&r);
    Subscription::new(id, clock.now().instant, revised, &r, true)
}

fn item(
    s: &Subscription,
    handle: u32,
    queue: u32,
    discard_oldest: bool,
    filter: Filter,
) -> MonitoredItem {
    MonitoredItem::new(
        s.next_item_id(),
        handle,
        ItemTarget {
            node_id: NodeId::string(2, "x"),
            attribute_id: 13,
            index_range: UaString::null(),
        },
        MonitoringMode::Reporting,
        Duration::from_millis(100),
        false,
        queue,
        discard_oldest,
        TimestampsToReturn::Both,
        filter,
    )
}

fn dv(x: f64) -> DataValue {
    DataValue::value(x)
}

/// Advances the clock in 10 ms steps to `until_ms`, running timers.
fn run(
    set: &mut Set,
    clock: &mut Clock,
    until_ms: u64,
    out: &mut Vec<Reply<u32>>,
) -> Vec<Subscription> {
    let limits = SubscriptionLimits::default();
    let mut gone = Vec::new();
    while clock.ms < until_ms {
        clock.ms += 10;
        if set.poll_timeout().is_some_and(|d| d <= clock.now().instant) {
            gone.extend(set.handle_timeout(clock.now(), &mut |_| dv(0.0), &limits, out));
        }
    }
    gone
}

fn publish(set: &mut Set, clock: &Clock, tag: u32, acks: &[(u32, u32)], out: &mut Vec<Reply<u32>>) {
    let acks: Vec<_> = acks
        .iter()
        .map(|&(s, q)| SubscriptionAcknowledgement {
            subscription_id: s,
            sequence_number: q,
        })
        .collect();
    set.publish(
        clock.now(),
        1,
        tag,
        &acks,
        None,
        tag,
        &SubscriptionLimits::default(),
        out,
    );
}

fn response(r: &Reply<u32>) -> &PublishResponse {
    match &r.answer {
        Answer::Publish(p) => p,
        Answer::Fault { status, .. } => panic!("fault {status:?}"),
    }
}

fn values(p: &PublishResponse) -> Vec<DataValue> {
    p.notification_message
        .notification_data
        .iter()
        .flatten()
        .filter_map(|e| e.downcast_ref::<DataChangeNotification>())
        .flat_map(|d| d.monitored_items.iter().flatten().map(|m| m.value.clone()))
        .collect()
}

fn is_keep_alive(p: &PublishResponse) -> bool {
    p.notification_message
        .notification_data
        .as_ref()
        .is_none_or(Vec::is_empty)
}

#[test]
fn revision_stays_in_bounds() {
    let l = SubscriptionLimits::default();
    let r = l.revise(&requested(1.0, 1, 0));
    assert_eq!(r.publishing_interval, Duration::from_millis(50));
    assert_eq!(r.max_keep_alive_count, 1);
    assert_eq!(r.lifetime_count, 3, "lifetime at least 3 x keep-alive");
    let r = l.revise(&requested(f64::NAN, 10, 10));
    assert_eq!(r.publishing_interval, Duration::from_millis(50));
    assert_eq!(r.lifetime_count, 30);
    let r = l.revise(&requested(1e12, u32::MAX, u32::MAX));
    assert_eq!(r.publishing_interval, Duration::from_secs(3600));
    assert_eq!(r.lifetime_count, 100_000);
    assert!(r.max_keep_alive_count * 3 <= r.lifetime_count);
    let r = l.revise(&requested(250.0, 100, 5));
    assert_eq!(r.publishing_interval, Duration::from_millis(250));
}

#[test]
fn first_cycle_sends_keep_alive_then_every_keep_alive_count() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    set.insert(sub(&clock, 7, 100.0, 30, 3));
    let mut out = Vec::new();
    for tag in 1..=3 {
        publish(&mut set, &clock, tag, &[], &mut out);
    }
    assert!(out.is_empty(), "parked");
    run(&mut set, &mut clock, 100, &mut out);
    assert_eq!(out.len(), 1, "first cycle: keep-alive");
    let p = response(&out[0]);
    assert!(is_keep_alive(p));
    assert_eq!(p.subscription_id, 7);
    assert_eq!(
        p.notification_message.sequence_number, 1,
        "next seq, not consumed"
    );
    out.clear();
    run(&mut set, &mut clock, 390, &mut out);
    assert!(out.is_empty(), "nothing before 3 cycles: {}", out.len());
    run(&mut set, &mut clock, 400, &mut out);
    assert_eq!(out.len(), 1, "keep-alive after 3 more cycles");
    assert!(is_keep_alive(response(&out[0])));
    assert_eq!(out[0].to, 2);
}

#[test]
fn notifications_are_sent_at_the_interval_and_acknowledged() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    let it = item(&s, 42, 10, true, Filter::default());
    let id = s.add_item(it);
    set.insert(s);
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[], &mut out);
    publish(&mut set, &clock, 2, &[], &mut out);
    set.get_mut(1).unwrap().offer(id, dv(1.0));
    set.get_mut(1).unwrap().offer(id, dv(1.0)); // no change: filtered
    set.get_mut(1).unwrap().offer(id, dv(2.0));
    run(&mut set, &mut clock, 90, &mut out);
    assert!(out.is_empty(), "not before the interval");
    run(&mut set, &mut clock, 100, &mut out);
    let p = response(&out[0]);
    assert_eq!(values(p), vec![dv(1.0), dv(2.0)]);
    assert_eq!(p.notification_message.sequence_number, 1);
    assert_eq!(p.available_sequence_numbers, Some(vec![1]));
    assert!(!p.more_notifications);
    // The next Publish acknowledges 1, and a bad ack gets its code.
    out.clear();
    publish(&mut set, &clock, 3, &[(1, 1), (1, 99), (5, 1)], &mut out);
    set.get_mut(1).unwrap().offer(id, dv(3.0));
    run(&mut set, &mut clock, 200, &mut out);
    let p = response(&out[0]);
    assert_eq!(out[0].to, 2, "the oldest parked request answers first");
    assert_eq!(values(p), vec![dv(3.0)]);
    assert_eq!(
        p.available_sequence_numbers,
        Some(vec![2]),
        "1 was acknowledged"
    );
    assert_eq!(p.results, Some(vec![]), "request 2 carried no acks");
    // Request 3's ack results travel with its own response.
    out.clear();
    set.get_mut(1).unwrap().offer(id, dv(4.0));
    run(&mut set, &mut clock, 300, &mut out);
    let p = response(&out[0]);
    assert_eq!(out[0].to, 3);
    assert_eq!(
        p.results,
        Some(vec![
            StatusCode::Good,
            StatusCode::BadSequenceNumberUnknown,
            StatusCode::BadSubscriptionIdInvalid
        ])
    );
}

#[test]
fn late_subscription_answers_the_next_publish_at_once() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    let id = s.add_item(item(&s, 1, 10, true, Filter::default()));
    set.insert(s);
    set.get_mut(1).unwrap().offer(id, dv(5.0));
    let mut out = Vec::new();
    run(&mut set, &mut clock, 250, &mut out);
    assert_eq!(set.get(1).unwrap().state, State::Late);
    publish(&mut set, &clock, 9, &[], &mut out);
    assert_eq!(out.len(), 1, "answered without waiting for the timer");
    assert_eq!(values(response(&out[0])), vec![dv(5.0)]);
    assert_eq!(set.get(1).unwrap().state, State::Normal);
}

#[test]
fn lifetime_expiry_sends_bad_timeout_status_change() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    set.insert(sub(&clock, 4, 100.0, 3, 1));
    let mut out = Vec::new();
    run(&mut set, &mut clock, 200, &mut out);
    assert!(set.get(4).is_some(), "alive after 2 cycles");
    // A Publish resets the lifetime counter (and is answered: the
    // subscription was late with its first keep-alive).
    publish(&mut set, &clock, 1, &[], &mut out);
    assert_eq!(out.len(), 1);
    out.clear();
    let gone = run(&mut set, &mut clock, 490, &mut out);
    assert!(
        gone.is_empty(),
        "alive until 3 cycles after the Publish at 200"
    );
    let gone = run(&mut set, &mut clock, 500, &mut out);
    assert_eq!(gone.len(), 1);
    assert!(set.get(4).is_none());
    // The StatusChange waits for the next Publish.
    publish(&mut set, &clock, 2, &[], &mut out);
    let p = response(&out[0]);
    assert_eq!(p.subscription_id, 4);
    let sc = p.notification_message.notification_data.as_ref().unwrap()[0]
        .downcast_ref::<StatusChangeNotification>()
        .unwrap();
    assert_eq!(sc.status, StatusCode::BadTimeout);
    // Then the session has nothing: BadNoSubscription.
    out.clear();
    publish(&mut set, &clock, 3, &[], &mut out);
    assert_eq!(
        out[0].answer,
        Answer::Fault {
            request_handle: 3,
            status: StatusCode::BadNoSubscription
        }
    );
}

/// Found by fuzzing (`dispatch_request` running the engine): two
/// subscriptions whose lifetimes run out in the same timer run, the later
/// one with the higher priority. The timers run by priority, so the
/// expired indices came out in descending order, and removing them "from
/// the back" removed index 0 first and then panicked on index 1 (in the
/// server: the subscription timer task died and no subscription published
/// again).
#[test]
fn subscriptions_of_different_priorities_expire_together() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    set.insert(sub(&clock, 1, 100.0, 3, 1));
    let mut high = requested(100.0, 3, 1);
    high.priority = 200;
    let revised = SubscriptionLimits::default().revise(&high);
    set.insert(Subscription::new(
        2,
        clock.now().instant,
        revised,
        &high,
        true,
    ));
    set.insert(sub(&clock, 3, 100.0, 300, 1));
    let mut out = Vec::new();
    // No Publish at all: both short-lived ones expire in the same run.
    let gone = run(&mut set, &mut clock, 1_000, &mut out);
    let mut ids: Vec<u32> = gone.iter().map(|s| s.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2]);
    assert!(set.get(1).is_none() && set.get(2).is_none());
    assert!(set.get(3).is_some(), "the long-lived one stays");
}

#[test]
fn too_many_publish_requests_and_timeouts() {
    let clock = Clock::new();
    let mut set = Set::default();
    set.insert(sub(&clock, 1, 10_000.0, 300, 100));
    let limits = SubscriptionLimits {
        max_publish_request_count: 2,
        ..Default::default()
    };
    let mut out = Vec::new();
    let t = clock.now().instant;
    set.publish(
        clock.now(),
        1,
        1,
        &[],
        Some(t + Duration::from_millis(500)),
        1,
        &limits,
        &mut out,
    );
    set.publish(clock.now(), 1, 2, &[], None, 2, &limits, &mut out);
    set.publish(clock.now(), 1, 3, &[], None, 3, &limits, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].to, 1, "the oldest is pushed out");
    assert_eq!(
        out[0].answer,
        Answer::Fault {
            request_handle: 1,
            status: StatusCode::BadTooManyPublishRequests
        }
    );
    out.clear();
    set.publish(
        clock.now(),
        1,
        4,
        &[],
        Some(t + Duration::from_millis(300)),
        4,
        &limits,
        &mut out,
    );
    assert_eq!(out.len(), 1, "2 pushed out");
    out.clear();
    assert_eq!(set.poll_timeout(), Some(t + Duration::from_millis(300)));
    let later = Now {
        instant: t + Duration::from_millis(300),
        utc: DateTime::from_ticks(1),
    };
    set.handle_timeout(later, &mut |_| dv(0.0), &limits, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].answer,
        Answer::Fault {
            request_handle: 4,
            status: StatusCode::BadTimeout
        }
    );
    assert_eq!(set.parked(), 1, "3 still waits");
    // The session moved to another channel: 3 can never be answered and
    // is dropped; the new one waits in its place.
    set.publish(clock.now(), 2, 5, &[], None, 5, &limits, &mut out);
    assert_eq!(out.len(), 1, "nothing answered");
    assert_eq!(set.parked(), 1);
}

#[test]
fn retransmission_queue_and_republish() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    let id = s.add_item(item(&s, 1, 10, true, Filter::default()));
    set.insert(s);
    let mut out = Vec::new();
    for n in 0..25u32 {
        publish(&mut set, &clock, n, &[], &mut out);
        set.get_mut(1).unwrap().offer(id, dv(f64::from(n)));
        run(&mut set, &mut clock, u64::from(n + 1) * 100, &mut out);
    }
    assert_eq!(out.len(), 25);
    let last = response(&out[24]);
    assert_eq!(last.notification_message.sequence_number, 25);
    // Unacknowledged: the newest 20 (max_retransmission_queue) are kept.
    assert_eq!(
        last.available_sequence_numbers,
        Some((6..=25).collect::<Vec<u32>>())
    );
    let m = set.republish(1, 10).unwrap();
    assert_eq!(m.sequence_number, 10);
    assert_eq!(
        values(&PublishResponse {
            notification_message: m,
            ..Default::default()
        }),
        vec![dv(9.0)]
    );
    assert_eq!(set.republish(1, 3), Err(StatusCode::BadMessageNotAvailable));
    assert_eq!(
        set.republish(2, 10),
        Err(StatusCode::BadSubscriptionIdInvalid)
    );
}

#[test]
fn more_notifications_splits_messages() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let r = Requested {
        max_notifications_per_publish: 2,
        ..requested(100.0, 30, 10)
    };
    let mut s = Subscription::new(
        1,
        clock.now().instant,
        SubscriptionLimits::default().revise(&r),
        &r,
        true,
    );
    let id = s.add_item(item(&s, 1, 10, true, Filter::default()));
    for x in 0..5 {
        s.offer(id, dv(f64::from(x)));
    }
    set.insert(s);
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[], &mut out);
    publish(&mut set, &clock, 2, &[], &mut out);
    run(&mut set, &mut clock, 100, &mut out);
    assert_eq!(out.len(), 2, "both parked requests used at once");
    assert!(response(&out[0]).more_notifications);
    assert_eq!(values(response(&out[0])).len(), 2);
    assert!(response(&out[1]).more_notifications);
    // The rest goes with the next Publish, immediately.
    publish(&mut set, &clock, 3, &[], &mut out);
    assert_eq!(out.len(), 3);
    assert!(!response(&out[2]).more_notifications);
    assert_eq!(values(response(&out[2])), vec![dv(4.0)]);
}

#[test]
fn a_publishing_cycle_visits_only_the_items_that_changed() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    let ids: Vec<u32> = (0..1_000)
        .map(|h| {
            let it = item(&s, h, 1, true, Filter::default());
            s.add_item(it)
        })
        .collect();
    for &id in &ids {
        s.offer(id, dv(1.0));
    }
    assert_eq!(s.ready_count(), 1_000);
    set.insert(s);
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[], &mut out);
    run(&mut set, &mut clock, 100, &mut out);
    assert_eq!(values(response(&out[0])).len(), 1_000);
    assert_eq!(set.get(1).unwrap().ready_count(), 0, "all sent");

    // Three of the thousand change: the next cycle visits three.
    let s = set.get_mut(1).unwrap();
    for &id in &[ids[7], ids[500], ids[999]] {
        s.offer(id, dv(2.0));
    }
    // Offering the same value again is no change, but the item is listed
    // once however often it is touched.
    s.offer(ids[7], dv(2.0));
    assert_eq!(s.ready_count(), 3);
    publish(&mut set, &clock, 2, &[(1, 1)], &mut out);
    run(&mut set, &mut clock, 200, &mut out);
    let last = response(out.last().unwrap());
    let handles: Vec<u32> = last
        .notification_message
        .notification_data
        .iter()
        .flatten()
        .filter_map(|e| e.downcast_ref::<DataChangeNotification>())
        .flat_map(|d| d.monitored_items.iter().flatten().map(|n| n.client_handle))
        .collect();
    assert_eq!(handles, vec![7, 500, 999]);
    assert_eq!(set.get(1).unwrap().ready_count(), 0);
}

#[test]
fn queue_overflow_sets_the_overflow_bit() {
    let clock = Clock::new();
    let s = sub(&clock, 1, 100.0, 30, 10);
    let mut oldest = item(&s, 1, 3, true, Filter::default());
    let mut newest = item(&s, 2, 3, false, Filter::default());
    let mut single = item(&s, 3, 1, true, Filter::default());
    for x in 0..5 {
        oldest.offer(dv(f64::from(x)));
        newest.offer(dv(f64::from(x)));
        single.offer(dv(f64::from(x)));
    }
    let v = |i: &mut MonitoredItem| -> Vec<(f64, u32)> {
        i.drain(0)
            .map(|q| match q {
                item::Queued::Value(d) => match d.value {
                    Some(Variant::Double(x)) => (x, d.status_or_good().0),
                    _ => panic!(),
                },
                _ => panic!(),
            })
            .collect()
    };
    assert_eq!(
        v(&mut oldest),
        vec![(2.0, OVERFLOW_BITS), (3.0, 0), (4.0, 0)]
    );
    assert_eq!(
        v(&mut newest),
        vec![(0.0, 0), (1.0, 0), (4.0, OVERFLOW_BITS)]
    );
    assert_eq!(
        v(&mut single),
        vec![(4.0, 0)],
        "queue of one: no overflow bit"
    );
}

#[test]
fn deadband_and_trigger_filters() {
    let clock = Clock::new();
    let s = sub(&clock, 1, 100.0, 30, 10);
    let mut abs = item(
        &s,
        1,
        100,
        true,
        Filter::DataChange {
            trigger: DataChangeTrigger::StatusValue,
            deadband: 1.0,
        },
    );
    for x in [10.0, 10.5, 11.0, 11.1, 9.0, 9.9] {
        abs.offer(dv(x));
    }
    assert_eq!(abs.queued(), 3, "10, 11.1 (>1 from 10), 9 (>1 from 11.1)");
    let mut status_only = item(
        &s,
        2,
        100,
        true,
        Filter::DataChange {
            trigger: DataChangeTrigger::Status,
            deadband: 0.0,
        },
    );
    status_only.offer(dv(1.0));
    status_only.offer(dv(2.0));
    status_only.offer(DataValue {
        status: Some(StatusCode::BadOutOfService),
        ..dv(2.0)
    });
    assert_eq!(status_only.queued(), 2);
    let mut with_ts = item(
        &s,
        3,
        100,
        true,
        Filter::DataChange {
            trigger: DataChangeTrigger::StatusValueTimestamp,
            deadband: 0.0,
        },
    );
    let stamped = |t| DataValue {
        source_timestamp: Some(DateTime::from_ticks(t)),
        ..dv(1.0)
    };
    with_ts.offer(stamped(1));
    with_ts.offer(stamped(1));
    with_ts.offer(stamped(2));
    assert_eq!(with_ts.queued(), 2);
    // Array deadband: any element beyond it.
    assert!(item::changed(
        &DataValue::value(vec![1.0f64, 2.0]),
        &DataValue::value(vec![1.0f64, 3.5]),
        DataChangeTrigger::StatusValue,
        1.0
    ));
    assert!(!item::changed(
        &DataValue::value(vec![1.0f64, 2.0]),
        &DataValue::value(vec![1.5f64, 2.5]),
        DataChangeTrigger::StatusValue,
        1.0
    ));
}

#[test]
fn triggering_reports_sampling_items() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    let trig = s.add_item(item(&s, 1, 10, true, Filter::default()));
    let mut linked = item(&s, 2, 10, true, Filter::default());
    linked.mode = MonitoringMode::Sampling;
    let linked = s.add_item(linked);
    s.item_mut(trig).unwrap().links.push(linked);
    s.offer(linked, dv(7.0));
    set.insert(s);
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[], &mut out);
    run(&mut set, &mut clock, 100, &mut out);
    assert!(
        is_keep_alive(response(&out[0])),
        "sampling item alone is not reported"
    );
    set.get_mut(1).unwrap().offer(trig, dv(1.0));
    publish(&mut set, &clock, 2, &[], &mut out);
    run(&mut set, &mut clock, 200, &mut out);
    let p = response(&out[1]);
    let handles: Vec<u32> = p
        .notification_message
        .notification_data
        .iter()
        .flatten()
        .filter_map(|e| e.downcast_ref::<DataChangeNotification>())
        .flat_map(|d| d.monitored_items.iter().flatten().map(|m| m.client_handle))
        .collect();
    assert_eq!(handles, vec![1, 2], "the trigger and its linked item");
    // Removing the linked item removes the link.
    set.get_mut(1).unwrap().remove_item(linked);
    assert!(set.get(1).unwrap().item(trig).unwrap().links.is_empty());
}

#[test]
fn sampled_items_run_on_their_timer_and_disabled_items_are_silent() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    let mut it = item(&s, 1, 100, true, Filter::default());
    it.sampled = true;
    it.sampling_interval = Duration::from_millis(50);
    it.start(clock.now().instant);
    let id = s.add_item(it);
    set.insert(s);
    let limits = SubscriptionLimits::default();
    let mut out = Vec::new();
    let mut n = 0.0;
    let mut sampler = |_: &ItemTarget| {
        n += 1.0;
        dv(n)
    };
    for step in 0..=10u64 {
        clock.ms = step * 10;
        if set.poll_timeout().is_some_and(|d| d <= clock.now().instant) {
            set.handle_timeout(clock.now(), &mut sampler, &limits, &mut out);
        }
    }
    // Samples at 0, 50, 100 ms.
    assert_eq!(set.get(1).unwrap().item(id).unwrap().queued(), 3);
    set.get_mut(1)
        .unwrap()
        .item_mut(id)
        .unwrap()
        .set_mode(MonitoringMode::Disabled, clock.now().instant);
    set.get_mut(1).unwrap().items_changed();
    assert_eq!(set.get(1).unwrap().item(id).unwrap().queued(), 0);
    assert_eq!(
        set.poll_timeout(),
        Some(set.get(1).unwrap().next_publish),
        "no sampling timer"
    );
}

/// A sampling tick visits the sampled items only: beside a thousand pushed
/// items, three sampled ones (two intervals) are sampled at their own
/// times, the subscription lists three to visit, and removing or
/// disabling one takes it off the list.
#[test]
fn a_sampling_tick_visits_only_the_sampled_items() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    for h in 0..1_000 {
        let it = item(&s, h, 1, true, Filter::default());
        s.add_item(it);
    }
    assert_eq!(s.sampling_count(), 0);
    let mut sampled = Vec::new();
    for (h, ms) in [(2_000, 50), (2_001, 50), (2_002, 20)] {
        let mut it = item(&s, h, 100, true, Filter::default());
        it.sampled = true;
        it.sampling_interval = Duration::from_millis(ms);
        it.start(clock.now().instant);
        sampled.push(s.add_item(it));
    }
    assert_eq!(s.sampling_count(), 3);
    set.insert(s);
    let limits = SubscriptionLimits::default();
    let mut out = Vec::new();
    let mut calls = 0;
    let mut sampler = |_: &ItemTarget| {
        calls += 1;
        dv(f64::from(calls))
    };
    for step in 0..=10u64 {
        clock.ms = step * 10;
        if set.poll_timeout().is_some_and(|d| d <= clock.now().instant) {
            set.handle_timeout(clock.now(), &mut sampler, &limits, &mut out);
        }
    }
    // 0, 50 and 100 ms twice; every 20 ms from 0 to 100 once.
    assert_eq!(calls, 3 + 3 + 6);
    let s = set.get_mut(1).unwrap();
    let queued: Vec<usize> = sampled
        .iter()
        .map(|id| s.item(*id).unwrap().queued())
        .collect();
    assert_eq!(queued, vec![3, 3, 6]);
    s.remove_item(sampled[0]);
    assert_eq!(s.sampling_count(), 2);
    s.item_mut(sampled[2])
        .unwrap()
        .set_mode(MonitoringMode::Disabled, clock.now().instant);
    s.items_changed();
    assert_eq!(s.sampling_count(), 1);
    // The one left is due 50 ms after its last sample, at 100 ms.
    assert_eq!(
        set.poll_timeout(),
        Some(clock.now().instant + Duration::from_millis(50))
    );
}

#[test]
fn status_change_goes_out_with_a_parked_publish() {
    let clock = Clock::new();
    let mut set = Set::default();
    set.insert(sub(&clock, 1, 100.0, 30, 10));
    set.insert(sub(&clock, 2, 100.0, 30, 10));
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[], &mut out);
    let moved = set.remove(2).unwrap();
    set.status_change(
        clock.now(),
        2,
        next_sequence_number(&moved),
        GOOD_SUBSCRIPTION_TRANSFERRED,
        &mut out,
    );
    let p = response(&out[0]);
    assert_eq!(p.subscription_id, 2);
    let sc = p.notification_message.notification_data.as_ref().unwrap()[0]
        .downcast_ref::<StatusChangeNotification>()
        .unwrap();
    assert_eq!(sc.status, GOOD_SUBSCRIPTION_TRANSFERRED);
}

#[test]
fn a_queue_of_one_keeps_its_value_once_across_resizes() {
    let clock = Clock::new();
    let s = sub(&clock, 1, 100.0, 30, 10);
    let mut it = item(&s, 1, 1, true, Filter::default());
    it.timestamps = TimestampsToReturn::Source;
    let stamped = |x: f64| DataValue {
        server_timestamp: Some(DateTime::from_ticks(7)),
        source_timestamp: Some(DateTime::from_ticks(5)),
        ..dv(x)
    };
    let values = |i: &mut MonitoredItem| -> Vec<DataValue> {
        i.drain(0)
            .map(|q| match q {
                item::Queued::Value(d) => d,
                _ => panic!("an event from a data-change item"),
            })
            .collect()
    };
    it.offer(stamped(1.0));
    it.offer(stamped(2.0));
    assert_eq!(it.queued(), 1);
    assert!(it.reportable());
    let out = values(&mut it);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].value, Some(Variant::Double(2.0)));
    assert_eq!(out[0].server_timestamp, None, "timestamps stripped");
    assert_eq!(out[0].source_timestamp, Some(DateTime::from_ticks(5)));
    assert_eq!(it.queued(), 0);
    assert!(values(&mut it).is_empty(), "sent once");
    // The same value again is no change; the item still compares with it.
    it.offer(stamped(2.0));
    assert_eq!(it.queued(), 0);

    // Growing keeps the waiting value, then queues behind it.
    it.offer(stamped(3.0));
    it.resize_queue(3, true);
    it.offer(stamped(4.0));
    let got: Vec<_> = values(&mut it).into_iter().map(|d| d.value).collect();
    assert_eq!(
        got,
        vec![Some(Variant::Double(3.0)), Some(Variant::Double(4.0))]
    );
    // Shrinking to one keeps the newest.
    for x in 5..8 {
        it.offer(stamped(f64::from(x)));
    }
    it.resize_queue(1, false);
    assert_eq!(it.queued(), 1);
    let out = values(&mut it);
    assert_eq!(out[0].value, Some(Variant::Double(7.0)));
    // Resent on request (TransferSubscriptions with initial values).
    it.requeue_last();
    assert_eq!(values(&mut it)[0].value, Some(Variant::Double(7.0)));
    // Disabling drops it.
    it.offer(stamped(8.0));
    it.set_mode(MonitoringMode::Disabled, clock.now().instant);
    assert_eq!(it.queued(), 0);
}

#[test]
fn per_item_state_stays_small() {
    // Memory per session is a headline number: these are multiplied by
    // the session count (the scale test prints the measured total).
    assert!(std::mem::size_of::<Subscription>() <= 184);
    assert!(std::mem::size_of::<MonitoredItem>() <= 208);
    assert!(std::mem::size_of::<SubscriptionSet<crate::reply::Responder>>() <= 192);
}

#[test]
fn idle_cycles_are_skipped_until_keep_alive_or_data() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 300, 10);
    let id = s.add_item(item(&s, 1, 10, true, Filter::default()));
    set.insert(s);
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[], &mut out);
    publish(&mut set, &clock, 2, &[], &mut out);
    run(&mut set, &mut clock, 200, &mut out);
    assert_eq!(out.len(), 1, "the first keep-alive");
    // Idle: the timer next has work at the 10th cycle (the keep-alive),
    // not at every cycle in between.
    let t0 = clock.t0;
    assert_eq!(set.poll_timeout(), Some(t0 + Duration::from_millis(1100)));
    // Data at 450 ms brings the next cycle (500) back.
    clock.ms = 450;
    set.get_mut(1)
        .unwrap()
        .offer_at(clock.now().instant, id, dv(3.0));
    assert_eq!(set.poll_timeout(), Some(t0 + Duration::from_millis(500)));
    run(&mut set, &mut clock, 500, &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(values(response(&out[1])), vec![dv(3.0)]);
    assert_eq!(out[1].to, 2);
    // Nothing else until the keep-alive 10 cycles later, and no timer work
    // in between.
    publish(&mut set, &clock, 3, &[], &mut out);
    assert_eq!(set.poll_timeout(), Some(t0 + Duration::from_millis(1500)));
    run(&mut set, &mut clock, 1490, &mut out);
    assert_eq!(out.len(), 2);
    run(&mut set, &mut clock, 1500, &mut out);
    assert_eq!(out.len(), 3);
    assert!(is_keep_alive(response(&out[2])));
}

#[test]
fn aligned_samples_fall_on_the_publishing_times() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let next_publish = t0 + ms(100);
    // The grid is 100, 200, 300 ... ms: the first point after now.
    assert_eq!(
        item::aligned_sample(t0, ms(100), next_publish),
        t0 + ms(100)
    );
    assert_eq!(
        item::aligned_sample(t0 + ms(100), ms(100), next_publish),
        t0 + ms(200)
    );
    assert_eq!(
        item::aligned_sample(t0 + ms(101), ms(100), next_publish),
        t0 + ms(200)
    );
    assert_eq!(
        item::aligned_sample(t0 + ms(420), ms(100), next_publish),
        t0 + ms(500)
    );
    // Faster sampling: 10 ms apart, one of them at each publishing time.
    assert_eq!(
        item::aligned_sample(t0 + ms(1), ms(10), next_publish),
        t0 + ms(10)
    );
    // Slower sampling than publishing still lands on its own grid, through
    // a publishing time.
    assert_eq!(
        item::aligned_sample(t0, ms(1000), next_publish),
        t0 + ms(100)
    );
    assert_eq!(
        item::aligned_sample(t0 + ms(100), ms(1000), next_publish),
        t0 + ms(1100)
    );
}

#[test]
fn a_late_sample_keeps_its_grid() {
    let clock = Clock::new();
    let s = sub(&clock, 1, 100.0, 300, 10);
    let mut it = item(&s, 1, 1, true, Filter::default());
    it.sampled = true;
    it.sampling_interval = Duration::from_millis(100);
    it.schedule_sampling(clock.t0, s.next_publish);
    let ms = Duration::from_millis;
    assert_eq!(it.next_sample, Some(clock.t0 + ms(100)));
    // On time, or late by less than an interval: an interval on.
    it.sampled_at(clock.t0 + ms(130), None);
    assert_eq!(it.next_sample, Some(clock.t0 + ms(200)));
    // Late by more than two intervals: the next grid point after now, not
    // an interval after now.
    it.sampled_at(clock.t0 + ms(437), None);
    assert_eq!(it.next_sample, Some(clock.t0 + ms(500)));
    // Exactly on a later grid point: the one after it.
    it.sampled_at(clock.t0 + ms(700), None);
    assert_eq!(it.next_sample, Some(clock.t0 + ms(800)));
}

/// A set with one subscription publishing every 100 ms, created at 0 ms,
/// and one item sampled every 100 ms (queue of one), created at 1 ms; the
/// clock is left at 1 ms.
fn sampled_at_100ms(clock: &mut Clock) -> Set {
    let mut set = Set::default();
    let mut s = sub(clock, 1, 100.0, 300, 10);
    clock.ms = 1;
    let mut it = item(&s, 1, 1, true, Filter::default());
    it.sampled = true;
    it.sampling_interval = Duration::from_millis(100);
    it.schedule_sampling(clock.now().instant, s.next_publish);
    s.add_item(it);
    set.insert(s);
    set
}

#[test]
fn a_sample_and_its_publishing_cycle_share_one_timer_pass() {
    // Equal intervals: the set's timer wakes once per cycle, not twice, and
    // the value sampled in that pass is in that pass's message.
    let mut clock = Clock::new();
    let mut set = sampled_at_100ms(&mut clock);
    let limits = SubscriptionLimits::default();
    let mut out = Vec::new();
    let mut n = 0.0;
    let mut wakes = 0;
    for tag in 0..5u32 {
        publish(&mut set, &clock, tag, &[], &mut out);
    }
    while clock.ms < 1000 {
        let Some(due) = set.poll_timeout() else { break };
        let due_ms = due.duration_since(clock.t0).as_millis() as u64;
        assert_eq!(due_ms % 100, 0, "every wake-up on a publishing time");
        // The timer wakes a little late, as a real one does.
        clock.ms = due_ms + 1;
        wakes += 1;
        let before = out.len();
        let mut sampler = |_: &ItemTarget| {
            n += 1.0;
            dv(n)
        };
        set.handle_timeout(clock.now(), &mut sampler, &limits, &mut out);
        assert_eq!(out.len(), before + 1, "one message at {due_ms} ms");
        let sent: Vec<f64> = values(response(&out[before]))
            .into_iter()
            .filter_map(|v| match v.value {
                Some(Variant::Double(x)) => Some(x),
                _ => None,
            })
            .collect();
        assert_eq!(
            sent,
            vec![n],
            "the sample of this pass, in this pass's message"
        );
        let tag = u32::try_from(out.len() + 4).unwrap();
        publish(&mut set, &clock, tag, &[], &mut out);
    }
    assert_eq!(wakes, 10, "one wake-up per 100 ms cycle");
}

#[test]
fn a_new_publishing_interval_moves_the_sampling_grid() {
    let clock = Clock::new();
    let mut s = sub(&clock, 1, 100.0, 300, 10);
    let mut it = item(&s, 1, 1, true, Filter::default());
    it.sampled = true;
    it.sampling_interval = Duration::from_millis(100);
    it.schedule_sampling(clock.t0, s.next_publish);
    let id = s.add_item(it);
    let ms = Duration::from_millis;
    let now = clock.t0 + ms(30);
    let revised = Revised {
        publishing_interval: ms(250),
        lifetime_count: 300,
        max_keep_alive_count: 10,
    };
    s.modify(now, revised, &requested(250.0, 300, 10));
    assert_eq!(s.next_publish, now + ms(250));
    // The grid through the new publishing times: ..., 180, 280 ms.
    assert_eq!(s.item(id).and_then(|i| i.next_sample), Some(now + ms(50)));
    assert_eq!(s.poll_timeout(), now + ms(50));
}

#[test]
fn equal_sampling_and_publishing_intervals_deliver_every_sample() {
    // The item is created 1 ms after its subscription and the timer wakes
    // up 0-3 ms late: without aligned sampling, samples and publishing
    // cycles trade places and a queue of one drops every other sample.
    let mut clock = Clock::new();
    let mut set = sampled_at_100ms(&mut clock);
    let limits = SubscriptionLimits::default();
    let mut out = Vec::new();
    let mut n = 0.0;
    let mut samples = 0;
    let mut jitter = 7u64;
    let mut tag = 0;
    publish(&mut set, &clock, tag, &[], &mut out);
    while clock.ms < 3000 {
        let Some(due) = set.poll_timeout() else { break };
        let due_ms = due.duration_since(clock.t0).as_millis() as u64;
        jitter = (jitter * 1103515245 + 12345) % 2147483648;
        clock.ms = clock.ms.max(due_ms) + jitter % 4;
        let mut sampler = |_: &ItemTarget| {
            n += 1.0;
            samples += 1;
            dv(n)
        };
        set.handle_timeout(clock.now(), &mut sampler, &limits, &mut out);
        // Always one Publish waiting.
        while out.len() > tag as usize {
            tag += 1;
            publish(&mut set, &clock, tag, &[], &mut out);
        }
    }
    let delivered: Vec<f64> = out
        .iter()
        .flat_map(|r| values(response(r)))
        .filter_map(|v| match v.value {
            Some(Variant::Double(x)) => Some(x),
            _ => None,
        })
        .collect();
    assert!(samples >= 28, "{samples} samples in 3 s");
    assert_eq!(
        delivered,
        (1..=delivered.len()).map(|i| i as f64).collect::<Vec<_>>(),
        "every sample, in order"
    );
    assert!(
        delivered.len() + 1 >= samples,
        "{} of {samples}",
        delivered.len()
    );
}

/// A subscription as a cluster node restores it: next sequence number
/// `next`, one item with a value queued.
fn restored(clock: &Clock, next: u32) -> Subscription {
    let mut original = sub(clock, 1, 100.0, 30, 10);
    let id = original.add_item(item(&original, 1, 10, true, Filter::default()));
    let mut image = original.image();
    image.next_seq = next;
    let mut s = Subscription::from_image(&image, clock.now().instant);
    assert!(s.offer(id, dv(1.0)));
    s
}

/// The last-message window of a takeover (docs/cluster.md): the old node
/// sent messages 5 and 6 after its last mirrored state (next 5); the
/// client acknowledges them in its first Publish on the new node, which
/// answers Good and numbers its first message 7, not 5 again.
#[test]
fn a_restored_subscription_moves_past_what_the_client_acknowledges() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    set.insert(restored(&clock, 5));
    let mut out = Vec::new();
    // Out of order, and one beyond the window, one of another subscription.
    publish(
        &mut set,
        &clock,
        1,
        &[(1, 6), (1, 5), (1, 5 + RESTORED_ACK_WINDOW), (2, 6)],
        &mut out,
    );
    run(&mut set, &mut clock, 100, &mut out);
    let p = response(&out[0]);
    assert_eq!(p.notification_message.sequence_number, 7);
    assert_eq!(values(p), vec![dv(1.0)]);
    assert_eq!(
        p.results,
        Some(vec![
            StatusCode::Good,
            StatusCode::Good,
            StatusCode::BadSequenceNumberUnknown,
            StatusCode::BadSubscriptionIdInvalid
        ])
    );
    assert_eq!(p.available_sequence_numbers, Some(vec![7]));
    // Once it sent its own message the window is closed: an ack past it is
    // unknown again, and the numbers go on from 8.
    out.clear();
    publish(&mut set, &clock, 2, &[(1, 7), (1, 9)], &mut out);
    set.get_mut(1).unwrap().offer(1, dv(2.0));
    run(&mut set, &mut clock, 200, &mut out);
    let p = response(&out[0]);
    assert_eq!(p.notification_message.sequence_number, 8);
    assert_eq!(
        p.results,
        Some(vec![StatusCode::Good, StatusCode::BadSequenceNumberUnknown])
    );
}

/// Without acknowledgements past it a restored subscription goes on from
/// its restored number; the window wraps with the sequence numbers; and a
/// subscription made on this node never accepts an ack past its numbers.
#[test]
fn the_restored_ack_window_is_bounded_and_only_for_restored_subscriptions() {
    let mut clock = Clock::new();
    let mut set = Set::default();
    set.insert(restored(&clock, 5));
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[(1, 4)], &mut out);
    run(&mut set, &mut clock, 100, &mut out);
    let p = response(&out[0]);
    assert_eq!(p.notification_message.sequence_number, 5);
    assert_eq!(p.results, Some(vec![StatusCode::BadSequenceNumberUnknown]));

    // Restored near the end of the number space: u32::MAX then 1.
    let mut clock = Clock::new();
    let mut set = Set::default();
    set.insert(restored(&clock, u32::MAX - 1));
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[(1, u32::MAX), (1, 0)], &mut out);
    run(&mut set, &mut clock, 100, &mut out);
    let p = response(&out[0]);
    assert_eq!(p.notification_message.sequence_number, 1);
    assert_eq!(
        p.results,
        Some(vec![StatusCode::Good, StatusCode::BadSequenceNumberUnknown])
    );

    // Made here: an ack of a number it has not sent is unknown.
    let mut clock = Clock::new();
    let mut set = Set::default();
    let mut s = sub(&clock, 1, 100.0, 30, 10);
    let id = s.add_item(item(&s, 1, 10, true, Filter::default()));
    s.offer(id, dv(1.0));
    set.insert(s);
    let mut out = Vec::new();
    publish(&mut set, &clock, 1, &[(1, 1), (1, 3)], &mut out);
    run(&mut set, &mut clock, 100, &mut out);
    let p = response(&out[0]);
    assert_eq!(p.notification_message.sequence_number, 1);
    assert_eq!(
        p.results,
        Some(vec![
            StatusCode::BadSequenceNumberUnknown,
            StatusCode::BadSequenceNumberUnknown
        ])
    );
}

/// A set of one subscription with one item of queue `queue` under
/// `budget`, session number `n`; returns it and the item's id.
/// The empty set of session `n`, counting against `budget`.
fn session_set(budget: &std::sync::Arc<crate::quota::Budget>, n: u32) -> Set {
    Set::with_account(std::sync::Arc::new(crate::quota::Account::new(
        std::sync::Arc::clone(budget),
        NodeId::numeric(1, n),
    )))
}

fn quota_set(
    clock: &Clock,
    budget: &std::sync::Arc<crate::quota::Budget>,
    n: u32,
    queue: u32,
) -> (Set, u32) {
    let mut set = session_set(budget, n);
    let mut s = sub(clock, n, 100.0, 300, 10);
    let id = s.add_item(item(&s, 1, queue, true, Filter::default()));
    set.insert(s);
    (set, id)
}

fn queued_values(set: &mut Set, n: u32, id: u32) -> Vec<DataValue> {
    let it = set
        .get_mut(n)
        .and_then(|s| s.item_mut(id))
        .expect("the item");
    it.drain(0)
        .filter_map(|q| match q {
            item::Queued::Value(v) => Some(v),
            item::Queued::Event(_) | item::Queued::Overflow(_) => None,
        })
        .collect()
}

#[test]
fn over_its_queued_bytes_quota_a_session_loses_its_oldest_values_marked() {
    use crate::quota::{Budget, Quota, Quotas, Stage};
    let clock = Clock::new();
    let one = item::Queued::Value(dv(0.0));
    let each = crate::quota::KeptSize::kept_size(&one);
    let budget = std::sync::Arc::new(Budget::new(
        Quotas {
            max_queued_notification_bytes_per_session: 10 * each,
            ..Quotas::default()
        },
        0,
    ));
    let (mut set, id) = quota_set(&clock, &budget, 1, 1000);
    for x in 0..10 {
        assert!(set.get_mut(1).unwrap().offer(id, dv(f64::from(x))));
    }
    let account = std::sync::Arc::clone(set.account());
    assert_eq!(account.bytes(Stage::Queued), 10 * each, "at the quota");
    assert_eq!(budget.over_count(Quota::QueuedBytesPerSession), 0);
    for x in 10..20 {
        set.get_mut(1).unwrap().offer(id, dv(f64::from(x)));
    }
    assert!(
        account.bytes(Stage::Queued) <= 11 * each,
        "over it by one value at most"
    );
    assert!(budget.over_count(Quota::QueuedBytesPerSession) > 0);
    let values = queued_values(&mut set, 1, id);
    // The newest are kept, the oldest went, and the first kept says so.
    assert_eq!(
        values.last().and_then(|v| v.value.clone()),
        Some(Variant::Double(19.0))
    );
    assert_eq!(
        values[0].status_or_good().0 & OVERFLOW_BITS,
        OVERFLOW_BITS,
        "{values:?}"
    );
    assert!(values[1..]
        .iter()
        .all(|v| v.status_or_good().0 & OVERFLOW_BITS == 0));
    assert_eq!(account.bytes(Stage::Queued), 0, "drained: nothing kept");
}

#[test]
fn near_the_budget_the_session_over_its_share_loses_values_and_the_other_keeps_them() {
    use crate::quota::{Budget, Quota, Quotas, Stage, SYNC_STEP};
    let clock = Clock::new();
    let each = crate::quota::KeptSize::kept_size(&item::Queued::Value(dv(0.0)));
    // Ten steps: less than the rogue's queue of 1000 values holds.
    let budget = std::sync::Arc::new(Budget::new(Quotas::default(), 10 * SYNC_STEP));
    assert!(1000 * each > 10 * SYNC_STEP);
    let (mut rogue, rid) = quota_set(&clock, &budget, 1, 1000);
    let (mut victim, vid) = quota_set(&clock, &budget, 2, 1000);
    // The victim queues a little, the rogue all it can.
    for x in 0..20 {
        victim.get_mut(2).unwrap().offer(vid, dv(f64::from(x)));
    }
    let steps = 1000u64;
    for x in 0..steps {
        rogue.get_mut(1).unwrap().offer(rid, dv(x as f64));
    }
    let kept = rogue.account().bytes(Stage::Queued);
    assert!(
        kept < 10 * SYNC_STEP,
        "the rogue stays under the budget: {kept}"
    );
    assert!(budget.over_count(Quota::BudgetShare) > 0);
    // The victim, under its share, keeps every value and queues more.
    for x in 20..40 {
        victim.get_mut(2).unwrap().offer(vid, dv(f64::from(x)));
    }
    let v = queued_values(&mut victim, 2, vid);
    assert_eq!(v.len(), 40);
    assert!(v.iter().all(|v| v.status_or_good().0 & OVERFLOW_BITS == 0));
    // The rogue kept its newest values, the first marked.
    let r = queued_values(&mut rogue, 1, rid);
    assert_eq!(
        r.last().and_then(|v| v.value.clone()),
        Some(Variant::Double((steps - 1) as f64))
    );
    assert_eq!(r[0].status_or_good().0 & OVERFLOW_BITS, OVERFLOW_BITS);
}

#[test]
fn over_its_retransmission_quota_a_session_keeps_its_newest_messages() {
    use crate::quota::{Budget, Quota, Quotas, Stage};
    let mut clock = Clock::new();
    let budget = std::sync::Arc::new(Budget::new(
        Quotas {
            max_retransmission_bytes_per_session: 1500,
            ..Quotas::default()
        },
        0,
    ));
    let (mut set, id) = quota_set(&clock, &budget, 1, 1);
    let mut out = Vec::new();
    // Publishes never acknowledged: each message is retained.
    for k in 0..10u32 {
        set.get_mut(1).unwrap().offer(id, dv(f64::from(k)));
        publish(&mut set, &clock, k, &[], &mut out);
        run(&mut set, &mut clock, u64::from(k + 1) * 100, &mut out);
    }
    let kept = set.account().bytes(Stage::Retransmission);
    let seqs = set.get(1).unwrap().available_sequence_numbers();
    assert!(seqs.len() < 10, "{seqs:?}");
    assert!(budget.over_count(Quota::RetransmissionBytesPerSession) > 0);
    assert!(kept <= 1500 + 1000, "{kept}");
    // The newest is kept; a Republish of a dropped one is refused.
    let newest = *seqs.last().unwrap();
    assert!(set.republish(1, newest).is_ok());
    assert_eq!(set.republish(1, 1), Err(StatusCode::BadMessageNotAvailable));
}

#[test]
fn a_transferred_subscription_takes_its_items_and_bytes_to_the_new_session() {
    use crate::quota::{Budget, Quotas, Stage};
    let clock = Clock::new();
    let budget = std::sync::Arc::new(Budget::new(Quotas::default(), 0));
    let (mut from, id) = quota_set(&clock, &budget, 1, 100);
    for x in 0..5 {
        from.get_mut(1).unwrap().offer(id, dv(f64::from(x)));
    }
    let a = std::sync::Arc::clone(from.account());
    assert_eq!(a.items(), 1);
    let queued = a.bytes(Stage::Queued);
    assert!(queued > 0);
    let (mut to, _) = quota_set(&clock, &budget, 2, 1);
    let b = std::sync::Arc::clone(to.account());
    let moved = from.remove(1).unwrap();
    to.insert(moved);
    assert_eq!((a.items(), a.bytes(Stage::Queued)), (0, 0));
    assert_eq!((b.items(), b.bytes(Stage::Queued)), (2, queued));
}

/// A set of session `n` under `budget` with one subscription (publishing
/// every 100 ms) of `items` items sampled every `sampling_ms`, queues of
/// ten.
fn sampled_set(
    clock: &Clock,
    budget: &std::sync::Arc<crate::quota::Budget>,
    n: u32,
    items: u32,
    sampling_ms: u64,
) -> Set {
    let mut set = session_set(budget, n);
    let mut s = sub(clock, n, 100.0, 300, 10);
    for h in 0..items {
        let mut it = item(&s, h, 10, true, Filter::default());
        it.sampled = true;
        it.sampling_interval = Duration::from_millis(sampling_ms);
        it.schedule_sampling(clock.now().instant, s.next_publish);
        s.add_item(it);
    }
    set.insert(s);
    set
}

/// Runs `set`'s timer for `ms` of simulated time in 1 ms steps, each
/// pass cut short run again at once as the registry does; returns the
/// samples taken.
/// No byte budget, the default quotas but `max_values_per_second_per_session`
/// = `rate`.
fn values_budget(rate: u64) -> std::sync::Arc<crate::quota::Budget> {
    std::sync::Arc::new(crate::quota::Budget::new(
        crate::quota::Quotas {
            max_values_per_second_per_session: rate,
            ..crate::quota::Quotas::default()
        },
        0,
    ))
}

fn count_samples(set: &mut Set, clock: &mut Clock, ms: u64) -> u64 {
    let limits = SubscriptionLimits::default();
    let mut out = Vec::new();
    let mut n = 0u64;
    let end = clock.ms + ms;
    while clock.ms < end {
        clock.ms += 1;
        while set.poll_timeout().is_some_and(|d| d <= clock.now().instant) {
            set.handle_timeout(
                clock.now(),
                &mut |_| {
                    n += 1;
                    dv(n as f64)
                },
                &limits,
                &mut out,
            );
        }
    }
    n
}

#[test]
fn a_session_asking_for_more_samples_than_its_quota_is_sampled_slower() {
    // 3,000 items at 10 ms ask for 300,000 samples a second: 20 times the
    // quota. Each is sampled every 200 ms instead (a whole number of
    // publishing intervals), 15,000 samples a second in all. (More items
    // than one pass takes: most are sampled after their publishing time.)
    let quota = values_budget(15_000);
    let mut clock = Clock::new();
    let mut rogue = sampled_set(&clock, &quota, 1, 3_000, 10);
    assert!((rogue.sampling_stretch() - 20.0).abs() < 1e-9);
    let warm = count_samples(&mut rogue, &mut clock, 1_000);
    assert!(warm >= 10_000, "{warm}");
    let taken = count_samples(&mut rogue, &mut clock, 2_000);
    assert!(
        (29_000..=31_000).contains(&taken),
        "rogue took {taken} in 2 s"
    );
    // A session within its quota (10 items at 100 ms, 100 a second) is
    // sampled as asked under the same quota.
    let mut clock = Clock::new();
    let mut victim = sampled_set(&clock, &quota, 2, 10, 100);
    assert!((victim.sampling_stretch() - 1.0).abs() < 1e-9);
    let v = count_samples(&mut victim, &mut clock, 2_000);
    assert!((190..=210).contains(&v), "victim took {v} in 2 s");
    // Without the quota the rogue's items are sampled as asked.
    let mut clock = Clock::new();
    let mut unlimited = sampled_set(&clock, &values_budget(0), 3, 3_000, 10);
    let all = count_samples(&mut unlimited, &mut clock, 2_000);
    assert!(
        (597_000..=600_000).contains(&all),
        "unlimited took {all} in 2 s"
    );
}

#[test]
fn a_long_sampling_pass_is_cut_and_goes_on_where_it_stopped() {
    let mut clock = Clock::new();
    let budget = values_budget(0);
    let items = 3 * (WORK_PER_PASS / SAMPLE_COST) as u32 - 100;
    let mut set = sampled_set(&clock, &budget, 1, items, 100);
    let limits = SubscriptionLimits::default();
    let mut out = Vec::new();
    clock.ms = 100;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut n = 0u32;
        set.handle_timeout(
            clock.now(),
            &mut |_| {
                n += 1;
                dv(0.0)
            },
            &limits,
            &mut out,
        );
        seen.push(n);
    }
    let per_pass = (WORK_PER_PASS / SAMPLE_COST) as u32;
    // Two full passes, the rest in the third; each item once.
    assert_eq!(seen, vec![per_pass, per_pass, items - 2 * per_pass]);
    // Nothing is due until the next grid point.
    assert!(set.poll_timeout().is_some_and(|d| d > clock.now().instant));
}

#[test]
fn over_the_values_quota_pushed_values_are_dropped_marked_where_queues_are_kept() {
    use crate::quota::Quota;
    let clock = Clock::new();
    let budget = values_budget(100);
    let (mut set, id) = quota_set(&clock, &budget, 1, 1000);
    let now = clock.now().instant;
    // A second's worth is taken, then nothing until time passes.
    let taken = (0..150).filter(|_| set.take_value(now)).count();
    assert_eq!(taken, 100);
    assert_eq!(budget.over_count(Quota::ValuesPerSecondPerSession), 50);
    assert!(set.take_value(now + Duration::from_millis(20)));
    // A dropped value marks the next one queued, the first after the gap.
    let s = set.get_mut(1).unwrap();
    s.offer(id, dv(1.0));
    s.missed_value(id);
    s.offer(id, dv(2.0));
    s.offer(id, dv(3.0));
    let v = queued_values(&mut set, 1, id);
    assert_eq!(v.len(), 3);
    let marked: Vec<bool> = v
        .iter()
        .map(|v| v.status_or_good().0 & OVERFLOW_BITS == OVERFLOW_BITS)
        .collect();
    assert_eq!(marked, [false, true, false]);
}

/// The unsent values a drain hands over are put back through the item's
/// ordinary queue: on a session with a smaller queued-bytes quota the
/// oldest go and the first kept says so (Overflow), never silently.
#[test]
fn restored_unsent_values_are_bounded_by_the_sessions_queued_bytes_quota() {
    use crate::quota::{Budget, Quotas, Stage};
    let clock = Clock::new();
    let one = item::Queued::Value(dv(0.0));
    let each = crate::quota::KeptSize::kept_size(&one);
    let mut original = sub(&clock, 1, 100.0, 300, 10);
    let id = original.add_item(item(&original, 1, 100, true, Filter::default()));
    for x in 0..20 {
        assert!(original.offer(id, dv(f64::from(x))));
    }
    let image = original.image_of(true);
    assert_eq!(image.items[0].queued.len(), 20);
    let budget = std::sync::Arc::new(Budget::new(
        Quotas {
            max_queued_notification_bytes_per_session: 5 * each,
            ..Quotas::default()
        },
        0,
    ));
    let mut set = session_set(&budget, 1);
    set.insert(Subscription::from_image(&image, clock.now().instant));
    set.get_mut(1).unwrap().restore_unsent(&image);
    assert!(set.account().bytes(Stage::Queued) <= 6 * each);
    let values = queued_values(&mut set, 1, id);
    assert!(values.len() < 20 && values.len() >= 4, "{}", values.len());
    assert_eq!(
        values.last().and_then(|v| v.value.clone()),
        Some(Variant::Double(19.0)),
        "the newest are kept"
    );
    assert_eq!(values[0].status_or_good().0 & OVERFLOW_BITS, OVERFLOW_BITS);
    assert!(values[1..]
        .iter()
        .all(|v| v.status_or_good().0 & OVERFLOW_BITS == 0));
    let xs: Vec<_> = values.iter().filter_map(|v| v.value.clone()).collect();
    let first = 20 - xs.len() as u32;
    assert_eq!(
        xs,
        (first..20)
            .map(|x| Variant::Double(f64::from(x)))
            .collect::<Vec<_>>(),
        "in order, none twice"
    );
}

/// A queue of one hands over its waiting value; restored, it waits again
/// (once), and the same value offered again is no change.
#[test]
fn a_queue_of_one_hands_over_its_waiting_value() {
    let clock = Clock::new();
    let mut original = sub(&clock, 1, 100.0, 300, 10);
    let id = original.add_item(item(&original, 1, 1, true, Filter::default()));
    assert!(original.offer(id, dv(7.0)));
    let image = original.image_of(true);
    assert_eq!(image.items[0].queued, vec![dv(7.0)]);
    assert_eq!(image.items[0].last, Some(dv(7.0)));
    let mut set = Set::default();
    set.insert(Subscription::from_image(&image, clock.now().instant));
    let s = set.get_mut(1).unwrap();
    s.restore_unsent(&image);
    assert!(!s.offer(id, dv(7.0)), "unchanged");
    assert_eq!(queued_values(&mut set, 1, id), vec![dv(7.0)]);
    // Nothing waiting: an image hands over only the last value.
    let image = set.get(1).unwrap().image_of(true);
    assert!(image.items[0].queued.is_empty());
    assert_eq!(image.items[0].last, Some(dv(7.0)));
}

/// An event item whose select clauses are EventType and Message.
fn event_item(queue: u32, discard_oldest: bool) -> MonitoredItem {
    use uascale_types::{ContentFilter, EventFilter, QualifiedName, SimpleAttributeOperand};
    let sel = |n: &str| SimpleAttributeOperand {
        type_definition_id: NodeId::ns0(super::event::BASE_EVENT_TYPE),
        browse_path: Some(vec![QualifiedName::new(0, n)]),
        attribute_id: 13,
        index_range: UaString::null(),
    };
    let (f, _) = super::event::compile(
        &EventFilter {
            select_clauses: Some(vec![sel("EventType"), sel("Message")]),
            where_clause: ContentFilter { elements: None },
        },
        &|_| true,
    )
    .expect("a valid filter");
    MonitoredItem::new(
        1,
        1,
        ItemTarget {
            node_id: NodeId::ns0(2253),
            attribute_id: 12,
            index_range: UaString::null(),
        },
        MonitoringMode::Reporting,
        Duration::ZERO,
        false,
        queue,
        discard_oldest,
        TimestampsToReturn::Both,
        Filter::Event(Box::new(f)),
    )
}

/// What an event item's queue holds: each entry's EventType id (3035 for
/// the overflow event) or its Message text.
fn event_queue(item: &mut MonitoredItem) -> Vec<String> {
    item.drain(0)
        .map(|q| match q {
            item::Queued::Overflow(fields) => match &fields[0] {
                Variant::NodeId(t) if **t == NodeId::ns0(3035) => "overflow".to_owned(),
                other => format!("an overflow event of type {other:?}"),
            },
            item::Queued::Event(fields) => match (&fields[0], &fields[1]) {
                (_, Variant::LocalizedText(m)) => m.text.as_str_or_empty().to_owned(),
                other => format!("{other:?}"),
            },
            item::Queued::Value(v) => format!("a value {v:?}"),
        })
        .collect()
}

fn raise(item: &mut MonitoredItem, text: &str) {
    use uascale_types::LocalizedText;
    assert!(item.offer_event(vec![
        Variant::from(NodeId::ns0(2041)),
        Variant::from(LocalizedText::new("", text)),
    ]));
}

/// A full event queue reports EventQueueOverflowEventType (i=3035) in
/// place of what it discarded (Part 4 §5.12.1.5): first when it discards
/// the oldest, last when it discards the newest, one at a time - the
/// next overflow makes no second while the first is still queued; a
/// queue of one keeps its newest event and makes none.
#[test]
fn a_full_event_queue_reports_an_overflow_event() {
    let mut oldest = event_item(3, true);
    for e in ["e1", "e2", "e3", "e4", "e5", "e6"] {
        raise(&mut oldest, e);
    }
    assert_eq!(event_queue(&mut oldest), ["overflow", "e5", "e6"]);
    // Drained: the next overflow makes a new one.
    for e in ["e7", "e8", "e9", "e10"] {
        raise(&mut oldest, e);
    }
    assert_eq!(event_queue(&mut oldest), ["overflow", "e9", "e10"]);

    let mut newest = event_item(3, false);
    for e in ["e1", "e2", "e3", "e4", "e5"] {
        raise(&mut newest, e);
    }
    assert_eq!(event_queue(&mut newest), ["e1", "e2", "overflow"]);

    let mut one = event_item(1, true);
    for e in ["e1", "e2"] {
        raise(&mut one, e);
    }
    assert_eq!(event_queue(&mut one), ["e2"]);
}

/// Over its session's queued-bytes quota an event item loses its oldest
/// events, and an EventQueueOverflow event stands first in their place -
/// one, however many went.
#[test]
fn over_the_quota_an_event_queue_reports_an_overflow_event() {
    use crate::quota::{Account, Budget, KeptSize, Quotas};
    let probe = item::Queued::Event(vec![
        Variant::from(NodeId::ns0(2041)),
        Variant::from(uascale_types::LocalizedText::new("", "e10")),
    ]);
    let each = probe.kept_size();
    let budget = std::sync::Arc::new(Budget::new(
        Quotas {
            max_queued_notification_bytes_per_session: 5 * each,
            ..Quotas::default()
        },
        0,
    ));
    let account = std::sync::Arc::new(Account::new(budget, NodeId::ns0(1)));
    let mut it = event_item(100, true);
    raise(&mut it, "e0");
    it.bind_if_unbound(&account);
    for n in 1..20 {
        raise(&mut it, &format!("e{n}"));
    }
    let got = event_queue(&mut it);
    assert_eq!(got[0], "overflow", "{got:?}");
    assert_eq!(
        got.iter().filter(|e| *e == "overflow").count(),
        1,
        "{got:?}"
    );
    assert_eq!(got.last().map(String::as_str), Some("e19"), "{got:?}");
    assert!(got.len() <= 6, "about the quota's five: {got:?}");
}
