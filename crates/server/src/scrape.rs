//! The Prometheus exposition of a server: a `prometheus-client`
//! [`Collector`] that turns the counters of [`crate::metrics`] and the
//! live counts of the state (sessions, subscriptions, monitored items) into
//! labelled families at scrape time, encoded as OpenMetrics text or the
//! Prometheus text format. `docs/metrics.md` lists every family.
//!
//! Nothing is registered or allocated per event: the families exist only
//! while a scrape encodes them. Series of labelled counters that are still
//! 0 are left out (a Prometheus query treats a missing series as no
//! events); unlabelled families are always there.

use std::fmt::Error;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::{HistogramSnapshot, Reason, Service, Stage, StatusClass, NOTIFICATION_TYPES};
use crate::state::ServerState;

/// The `Content-Type` of [`Format::OpenMetrics`].
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of [`Format::Prometheus`].
pub const PROMETHEUS_CONTENT_TYPE: &str =
    prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A text exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (ends with `# EOF`).
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (what `curl` gets).
    Prometheus,
}

impl Format {
    /// The format a scraper asks for in its `Accept` header: OpenMetrics
    /// when it names it, else the Prometheus text format.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Prometheus => PROMETHEUS_CONTENT_TYPE,
        }
    }
}

/// Every metric family of `state`, in `format`.
pub fn render(state: &Arc<ServerState>, format: Format) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ServerCollector {
        state: Arc::clone(state),
    }));
    let mut out = String::with_capacity(8 * 1024);
    let encoded = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        }
    };
    if let Err(e) = encoded {
        // Writing to a String cannot fail; say so rather than panic.
        out.push_str(&format!("# encoding failed: {e}\n"));
    }
    out
}

/// The collector of one server's families.
#[derive(Debug)]
pub struct ServerCollector {
    /// The server whose counters are encoded.
    pub state: Arc<ServerState>,
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), Error> {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> Result<(), Error> {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter family: one series per label set, the zero ones left out
/// unless `keep_zero`.
fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Vec<(&str, &str)>, u64)],
    keep_zero: bool,
) -> Result<(), Error> {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        if *v > 0 || keep_zero {
            ConstCounter::new(*v).encode(family.encode_family(&labels.as_slice())?)?;
        }
    }
    Ok(())
}

fn histogram(
    family: &mut prometheus_client::encoding::MetricEncoder,
    h: &HistogramSnapshot,
) -> Result<(), Error> {
    family.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
}

impl Collector for ServerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        let state = &self.state;
        let m = &state.metrics;

        // Connections and channels.
        let mut connections = vec![(
            vec![("outcome", "accepted"), ("stage", "accept"), ("reason", "")],
            m.connections_accepted(),
        )];
        for stage in Stage::ALL.into_iter().filter(|s| s.is_transport()) {
            for reason in Reason::ALL {
                connections.push((
                    vec![
                        ("outcome", "shed"),
                        ("stage", stage.name()),
                        ("reason", reason.name()),
                    ],
                    m.shed_count(stage, reason),
                ));
            }
        }
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_connections",
                "TCP connections accepted by the listener, and connections shed by an admission stage, by reason",
                None,
                MetricType::Counter,
            )?;
            for (i, (labels, v)) in connections.iter().enumerate() {
                // The accepted series is always there.
                if i == 0 || *v > 0 {
                    ConstCounter::new(*v).encode(family.encode_family(&labels.as_slice())?)?;
                }
            }
        }
        gauge(
            &mut enc,
            "opcua_server_connections_open",
            "Connections being served now",
            m.connections_open(),
        )?;
        counter(
            &mut enc,
            "opcua_server_accept_pauses",
            "Times the listener paused accepting because file descriptors ran out",
            m.accept_pauses(),
        )?;
        gauge(
            &mut enc,
            "opcua_server_channels_open",
            "Secure channels open now",
            m.channels_open(),
        )?;
        gauge(
            &mut enc,
            "opcua_server_handshakes_in_flight",
            "OpenSecureChannel handshakes in flight now",
            m.handshakes(),
        )?;

        // Every refusal, by stage and reason (one series per pair seen).
        {
            let mut shed = Vec::new();
            for stage in Stage::ALL {
                for reason in Reason::ALL {
                    shed.push((
                        vec![("stage", stage.name()), ("reason", reason.name())],
                        m.shed_count(stage, reason),
                    ));
                }
            }
            counters(
                &mut enc,
                "opcua_server_shed",
                "Work refused by a stage (each a busy answer with a retry-after hint), by stage and reason",
                &shed,
                false,
            )?;
        }

        // Busy answers and their hints.
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_busy_answers",
                "Busy answers sent (ERR BadTcpServerTooBusy or a ServiceFault with a retry-after), by stage",
                None,
                MetricType::Counter,
            )?;
            for stage in Stage::ALL {
                let n = m.busy_answers(stage).count;
                if n > 0 {
                    ConstCounter::new(n)
                        .encode(family.encode_family(&[("stage", stage.name())])?)?;
                }
            }
        }
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_busy_retry_after",
                "The retry-after hints of the busy answers, by stage",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for stage in Stage::ALL {
                let h = m.busy_answers(stage);
                if h.count > 0 {
                    histogram(&mut family.encode_family(&[("stage", stage.name())])?, &h)?;
                }
            }
        }

        // Waiting rooms, returns at the hint and retry tickets, by stage.
        let stages = [
            ("handshake", crate::admission::Stage::Handshake),
            ("establishment", crate::admission::Stage::Establishment),
        ]
        .map(|(name, stage)| (name, state.admission.stage_counts(stage)));
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_admission_tickets",
                "Retry tickets by stage and outcome: issued with a refusal; honoured (back within their window); expired unused; replayed; forged (not this process's, this stage's or this address's); early (back well before their slot, sent away with a longer hint)",
                None,
                MetricType::Counter,
            )?;
            for (name, c) in &stages {
                let t = c.tickets;
                for (outcome, v) in [
                    ("issued", t.issued),
                    ("honoured", t.honoured),
                    ("expired", t.expired),
                    ("replayed", t.replayed),
                    ("forged", t.forged),
                    ("early", t.early),
                ] {
                    ConstCounter::new(v)
                        .encode(family.encode_family(&[("stage", *name), ("outcome", outcome)])?)?;
                }
            }
        }
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_admission_waits",
                "Requests that waited in a stage's waiting room, and waits given up at their limit, by stage",
                None,
                MetricType::Counter,
            )?;
            for (name, c) in &stages {
                for (outcome, v) in [("waited", c.waited), ("timed_out", c.wait_timeouts)] {
                    ConstCounter::new(v)
                        .encode(family.encode_family(&[("stage", *name), ("outcome", outcome)])?)?;
                }
            }
        }
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_admission_returns",
                "Clients back at their hint with their ticket (outcome at_hint), and of those the ones admitted at once or to the waiting room (outcome admitted): admitted / at_hint is the hints' accuracy",
                None,
                MetricType::Counter,
            )?;
            for (name, c) in &stages {
                for (outcome, v) in [
                    ("at_hint", c.returns_at_hint),
                    ("admitted", c.returns_admitted),
                ] {
                    ConstCounter::new(v)
                        .encode(family.encode_family(&[("stage", *name), ("outcome", outcome)])?)?;
                }
            }
        }

        // The request queue and isolation (docs/scalability.md §3).
        {
            let q = &state.scheduler;
            let mut rejections = Vec::new();
            for stage in Stage::QUEUE {
                for reason in Reason::ALL {
                    rejections.push((
                        vec![("stage", stage.name()), ("reason", reason.name())],
                        m.shed_count(stage, reason),
                    ));
                }
            }
            counters(
                &mut enc,
                "opcua_server_isolation_rejections",
                "Requests refused by the request queue (BadServerTooBusy with a hint), by stage (queue, bootstrap, reconnect, control, parked) and reason (full, owner_limit, retained_bytes, reserved)",
                &rejections,
                false,
            )?;
            {
                let mut family = enc.encode_descriptor(
                    "opcua_server_isolation_usage",
                    "Places taken now in each stage of the request queue (queue, bootstrap, reconnect, control: requests waiting for a worker; parked: held Publishes)",
                    None,
                    MetricType::Gauge,
                )?;
                for stage in Stage::QUEUE {
                    let v = i64::try_from(q.usage(stage)).unwrap_or(i64::MAX);
                    ConstGauge::new(v).encode(family.encode_family(&[("stage", stage.name())])?)?;
                }
            }
            {
                let mut family = enc.encode_descriptor(
                    "opcua_server_isolation_capacity",
                    "The size of each stage of the request queue",
                    None,
                    MetricType::Gauge,
                )?;
                for stage in Stage::QUEUE {
                    let v = i64::try_from(q.capacity(stage)).unwrap_or(i64::MAX);
                    ConstGauge::new(v).encode(family.encode_family(&[("stage", stage.name())])?)?;
                }
            }
            let g = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
            gauge(
                &mut enc,
                "opcua_server_request_workers_busy",
                "Request workers busy now: running a queued request, or waiting for an answer (an asynchronous node manager; a held Publish in the legacy mode)",
                g(q.busy()),
            )?;
            gauge(
                &mut enc,
                "opcua_server_request_workers_started",
                "Request workers started (min_request_thread_count, grown up to max_request_thread_count)",
                g(q.workers()),
            )?;
            gauge(
                &mut enc,
                "opcua_server_request_queue_bytes",
                "Bytes of the requests waiting for a worker (bounded by max_retained_request_bytes)",
                g(q.retained_bytes()),
            )?;
            counter(
                &mut enc,
                "opcua_server_requests_queued",
                "Requests that waited in the request queue before a worker ran them",
                q.queued_total(),
            )?;
        }

        // The cluster (docs/cluster.md), only on a cluster node.
        if let Some(c) = state.cluster() {
            use std::sync::atomic::Ordering::Relaxed;
            let cm = &c.metrics;
            counters(
                &mut enc,
                "opcua_cluster_takeovers",
                "Sessions of other nodes taken over by a client's ActivateSession (ok), and claims refused (failed)",
                &[
                    (vec![("result", "ok")], cm.takeovers.load(Relaxed)),
                    (vec![("result", "failed")], cm.takeovers_failed.load(Relaxed)),
                ],
                true,
            )?;
            counter(
                &mut enc,
                "opcua_cluster_sessions_lost",
                "Sessions of this node that another node took over (released here)",
                cm.sessions_lost.load(Relaxed),
            )?;
            counter(
                &mut enc,
                "opcua_cluster_sessions_adopted",
                "Sessions of dead nodes adopted (their timeouts run here)",
                cm.sessions_adopted.load(Relaxed),
            )?;
            counter(
                &mut enc,
                "opcua_cluster_sessions_reclaimed",
                "Sessions of this node that a survivor adopted while this node still served them, taken back",
                cm.sessions_reclaimed.load(Relaxed),
            )?;
            counter(
                &mut enc,
                "opcua_cluster_store_errors",
                "Failed operations on the cluster store",
                cm.store_errors.load(Relaxed),
            )?;
            counter(
                &mut enc,
                "opcua_cluster_records_written",
                "Session records written to the cluster store",
                cm.records_written.load(Relaxed),
            )?;
            gauge(
                &mut enc,
                "opcua_cluster_mirror_lag_microseconds",
                "Age of the oldest queued session change when the last batch was written",
                i64::try_from(cm.mirror_lag_us.load(Relaxed)).unwrap_or(i64::MAX),
            )?;
            gauge(
                &mut enc,
                "opcua_cluster_pending_writes",
                "Session changes waiting for the cluster store",
                i64::try_from(c.pending_writes()).unwrap_or(i64::MAX),
            )?;
            gauge(
                &mut enc,
                "opcua_cluster_degraded",
                "1 while the cluster store cannot be written (the node serves its own sessions)",
                i64::from(c.degraded()),
            )?;
        }

        // Sessions.
        let s = m.sessions.snapshot();
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_sessions",
                "Sessions now: establishing (created, not yet activated) and active",
                None,
                MetricType::Gauge,
            )?;
            for (st, v) in [("establishing", s.establishing), ("active", s.active)] {
                ConstGauge::new(v).encode(family.encode_family(&[("state", st)])?)?;
            }
        }
        counters(
            &mut enc,
            "opcua_server_session_transitions",
            "Session transitions: created, activated (first time), moved (to another channel), closed (CloseSession), timed_out, orphaned (never activated, reaped at the activation deadline), aborted",
            &[
                (vec![("transition", "created")], s.created),
                (vec![("transition", "activated")], s.activated),
                (vec![("transition", "moved")], s.moved),
                (vec![("transition", "closed")], s.closed),
                (vec![("transition", "timed_out")], s.timed_out),
                (vec![("transition", "orphaned")], s.orphaned),
                (vec![("transition", "aborted")], s.aborted),
                (vec![("transition", "restored")], s.restored),
            ],
            true,
        )?;
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_session_establishment",
                "Time from CreateSession to the first successful ActivateSession",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            histogram(&mut family, &m.establishment())?;
        }
        let (failures, lockouts, locked_out) = m.auth_counts();
        counter(
            &mut enc,
            "opcua_server_auth_failures",
            "Failed authentications (user token, user or application signature)",
            failures,
        )?;
        counter(
            &mut enc,
            "opcua_server_auth_lockouts",
            "Clients locked out after max_failed_authentication_attempts failures",
            lockouts,
        )?;
        counter(
            &mut enc,
            "opcua_server_auth_locked_out_refusals",
            "ActivateSession requests refused because their client was locked out",
            locked_out,
        )?;

        // Requests.
        let mut requests = Vec::new();
        for service in Service::ALL {
            let count = |c| m.requests.count(*service, c);
            for (class, v) in [
                (StatusClass::Good, count(StatusClass::Good)),
                (StatusClass::Uncertain, count(StatusClass::Uncertain)),
                (
                    StatusClass::Bad,
                    count(StatusClass::Bad) + count(StatusClass::BadSecurity),
                ),
            ] {
                requests.push((
                    vec![("service", service.name()), ("status", class.label())],
                    v,
                ));
            }
        }
        counters(
            &mut enc,
            "opcua_server_requests",
            "Requests answered, by service and service result (good, uncertain, bad)",
            &requests,
            false,
        )?;
        let errors: Vec<(String, u64)> = m
            .requests
            .errors()
            .into_iter()
            .map(|(code, n)| {
                let name = code
                    .name()
                    .map_or_else(|| format!("0x{:08X}", code.bits()), str::to_owned);
                (name, n)
            })
            .collect();
        {
            let mut family = enc.encode_descriptor(
                "opcua_server_request_errors",
                "Requests answered with a Bad service result, by status code",
                None,
                MetricType::Counter,
            )?;
            for (name, n) in &errors {
                ConstCounter::new(*n)
                    .encode(family.encode_family(&[("status", name.as_str())])?)?;
            }
        }

        // Subscriptions.
        let (notifying, keep_alive) = m.publish_responses();
        counters(
            &mut enc,
            "opcua_server_publish_responses",
            "Publish responses sent: with notifications, or keep-alives",
            &[
                (vec![("kind", "notification")], notifying),
                (vec![("kind", "keep_alive")], keep_alive),
            ],
            true,
        )?;
        let notifications = m.notifications();
        counters(
            &mut enc,
            "opcua_server_notifications",
            "Notifications sent in Publish responses: data changes (one per monitored item value), events, status changes",
            &NOTIFICATION_TYPES
                .iter()
                .zip(notifications)
                .map(|(t, n)| (vec![("type", *t)], n))
                .collect::<Vec<_>>(),
            true,
        )?;
        gauge(
            &mut enc,
            "opcua_server_subscriptions",
            "Subscriptions now (with those waiting for a transfer)",
            i64::try_from(state.subscriptions.subscription_count()).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut enc,
            "opcua_server_monitored_items",
            "Monitored items now",
            i64::try_from(state.subscriptions.monitored_item_count()).unwrap_or(i64::MAX),
        )?;
        kept_state(&mut enc, state.subscriptions.budget())?;
        Ok(())
    }
}

/// What sessions make the server keep (`[quotas]`): bytes by stage, the
/// budget, the sessions keeping anything, and the refusals and drops by
/// quota. Labels are the stage and the quota, never the session.
fn kept_state(enc: &mut DescriptorEncoder, b: &crate::quota::Budget) -> Result<(), Error> {
    use crate::quota::{Quota, Stage as KeptStage};
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    {
        let mut family = enc.encode_descriptor(
            "opcua_server_kept_bytes",
            "Estimated bytes kept for clients, by stage: notifications queued for Publish beyond each item's latest value, NotificationMessages kept for Republish",
            None,
            MetricType::Gauge,
        )?;
        for stage in KeptStage::ALL {
            ConstGauge::new(as_i64(b.kept(stage)))
                .encode(family.encode_family(&[("stage", stage.label())])?)?;
        }
    }
    gauge(
        enc,
        "opcua_server_kept_budget_bytes",
        "The memory budget of kept state (quotas.memory_budget_bytes; 0: none)",
        as_i64(b.limit()),
    )?;
    gauge(
        enc,
        "opcua_server_kept_sessions",
        "Sessions keeping queued notifications or messages now (the fair share is the budget over these)",
        i64::try_from(b.active_sessions()).unwrap_or(i64::MAX),
    )?;
    counters(
        enc,
        "opcua_server_quota_exceeded",
        "Refusals (subscriptions, monitored items, continuation points) and drops (queued values, retained messages) by the quota that caused them",
        &Quota::ALL
            .iter()
            .map(|q| (vec![("quota", q.label())], b.over_count(*q)))
            .collect::<Vec<_>>(),
        true,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uascale_types::StatusCode;

    use super::*;
    use crate::shed::Shed;

    fn state() -> Arc<ServerState> {
        crate::state::ServerState::empty(crate::ServerConfig::default())
    }

    /// The value of the sample `series`, written `name{a="x",b="y"}` (the
    /// labels in any order in `text`).
    fn value(text: &str, series: &str) -> Option<String> {
        let labels = |s: &str| -> Vec<String> {
            let mut v: Vec<String> = s
                .trim_start_matches('{')
                .trim_end_matches('}')
                .split("\",")
                .filter(|l| !l.is_empty())
                .map(|l| l.trim_end_matches('"').to_owned())
                .collect();
            v.sort();
            v
        };
        let (name, want) = match series.find('{') {
            Some(i) => (&series[..i], labels(&series[i..])),
            None => (series, Vec::new()),
        };
        text.lines().find_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let rest = head.strip_prefix(name)?;
            (rest.is_empty() || rest.starts_with('{'))
                .then(|| labels(rest) == want)?
                .then(|| value.to_owned())
        })
    }

    #[test]
    fn the_families_carry_what_was_counted() {
        let state = state();
        let m = &state.metrics;
        m.connection_accepted();
        m.connection_accepted();
        m.connection_closed();
        m.shed(&Shed::new(
            Stage::Accept,
            Reason::AddressRate,
            Duration::from_millis(20),
        ));
        m.channel_opened();
        m.handshakes_in_flight(3);
        m.handshakes_in_flight(-1);
        m.shed(&Shed::new(
            Stage::Handshake,
            Reason::HandshakeLimit,
            Duration::from_millis(400),
        ));
        m.session_established(Duration::from_millis(3));
        m.auth_failure(false);
        m.auth_failure(true);
        m.auth_refused_locked_out();
        m.publish_sent(2, 0, 0);
        m.publish_sent(0, 0, 0);
        m.requests.good(Service::Read);
        m.requests.good(Service::Read);
        m.requests
            .record(Service::Read, StatusCode::BadSessionIdInvalid);
        m.requests
            .record(Service::ActivateSession, StatusCode::BadUserAccessDenied);
        m.sessions.record(&crate::session::SessionEvent::Created {
            session_id: uascale_types::NodeId::ns0(1),
            channel_id: 1,
        });
        let _parked = state.scheduler.park().unwrap();
        let _busy = state.scheduler.try_slot().unwrap();

        for format in [Format::Prometheus, Format::OpenMetrics] {
            let text = render(&state, format);
            let v = |s: &str| value(&text, s).unwrap_or_else(|| panic!("{s} in\n{text}"));
            assert_eq!(
                v(r#"opcua_server_connections_total{outcome="accepted",stage="accept",reason=""}"#),
                "2"
            );
            assert_eq!(
                v(
                    r#"opcua_server_connections_total{outcome="shed",stage="accept",reason="address_rate"}"#
                ),
                "1"
            );
            assert_eq!(v("opcua_server_connections_open"), "1");
            assert_eq!(v("opcua_server_channels_open"), "1");
            assert_eq!(v("opcua_server_handshakes_in_flight"), "2");
            assert_eq!(
                v(r#"opcua_server_busy_answers_total{stage="handshake"}"#),
                "1"
            );
            assert_eq!(
                v(r#"opcua_server_busy_retry_after_seconds_bucket{stage="handshake",le="0.25"}"#),
                "0"
            );
            assert_eq!(
                v(r#"opcua_server_busy_retry_after_seconds_bucket{stage="handshake",le="0.5"}"#),
                "1"
            );
            assert_eq!(
                v(r#"opcua_server_session_establishment_seconds_bucket{le="0.005"}"#),
                "1"
            );
            assert_eq!(v("opcua_server_session_establishment_seconds_count"), "1");
            assert_eq!(v(r#"opcua_server_sessions{state="establishing"}"#), "1");
            assert_eq!(v(r#"opcua_server_sessions{state="active"}"#), "0");
            assert_eq!(
                v(r#"opcua_server_session_transitions_total{transition="created"}"#),
                "1"
            );
            assert_eq!(v("opcua_server_auth_failures_total"), "2");
            assert_eq!(v("opcua_server_auth_lockouts_total"), "1");
            assert_eq!(v("opcua_server_auth_locked_out_refusals_total"), "1");
            assert_eq!(
                v(r#"opcua_server_requests_total{service="Read",status="good"}"#),
                "2"
            );
            assert_eq!(
                v(r#"opcua_server_requests_total{service="Read",status="bad"}"#),
                "1"
            );
            assert_eq!(
                v(r#"opcua_server_requests_total{service="ActivateSession",status="bad"}"#),
                "1"
            );
            assert!(
                value(
                    &text,
                    r#"opcua_server_requests_total{service="Write",status="good"}"#
                )
                .is_none(),
                "zero series are left out"
            );
            assert_eq!(
                v(r#"opcua_server_request_errors_total{status="BadUserAccessDenied"}"#),
                "1"
            );
            assert_eq!(
                v(r#"opcua_server_publish_responses_total{kind="keep_alive"}"#),
                "1"
            );
            assert_eq!(
                v(r#"opcua_server_notifications_total{type="data_change"}"#),
                "2"
            );
            assert_eq!(v("opcua_server_subscriptions"), "0");
            assert_eq!(v(r#"opcua_server_isolation_usage{stage="parked"}"#), "1");
            assert_eq!(v(r#"opcua_server_isolation_usage{stage="queue"}"#), "0");
            assert_eq!(
                v(r#"opcua_server_isolation_capacity{stage="queue"}"#),
                "200"
            );
            assert_eq!(
                v(r#"opcua_server_isolation_capacity{stage="control"}"#),
                "1"
            );
            assert_eq!(v("opcua_server_request_workers_busy"), "1");
            assert_eq!(v("opcua_server_request_workers_started"), "10");
            assert_eq!(
                text.trim_end().ends_with("# EOF"),
                format == Format::OpenMetrics
            );
        }
    }

    /// Every stage and reason of the one shed type reaches the exposition
    /// under its documented label values, and docs/metrics.md names every
    /// one of them.
    #[test]
    fn every_shed_label_is_emitted_and_documented() {
        use crate::shed::{Reason, Shed, Stage};
        let state = state();
        for stage in Stage::ALL {
            for reason in Reason::ALL {
                state.metrics.shed(&Shed::new(
                    stage,
                    reason,
                    std::time::Duration::from_millis(100),
                ));
            }
        }
        let text = render(&state, Format::Prometheus);
        let doc = include_str!("../../../docs/metrics.md");
        for stage in Stage::ALL {
            for reason in Reason::ALL {
                let series = format!(
                    "opcua_server_shed_total{{stage=\"{}\",reason=\"{}\"}} 1",
                    stage.name(),
                    reason.name()
                );
                assert!(text.contains(&series), "{series} missing");
            }
            assert!(
                doc.contains(&format!("`{}`", stage.name())),
                "stage {stage:?} undocumented"
            );
        }
        for reason in Reason::ALL {
            assert!(
                doc.contains(&format!("`{}`", reason.name())),
                "reason {reason:?} undocumented"
            );
        }
    }

    #[test]
    fn the_format_follows_the_accept_header() {
        assert_eq!(Format::from_accept(None), Format::Prometheus);
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert!(Format::Prometheus.content_type().starts_with("text/plain"));
    }
}
