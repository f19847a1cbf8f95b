//! `uascale subscribe`: data changes of nodes and events of a notifier,
//! printed as they arrive (text, or one JSON object per line), until
//! Ctrl-C, `--count` notifications or `--duration-s`.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value as Json};
use uascale_client::{
    event_filter, Client, MonitorItem, Notification, Restore, SubscriptionEvent,
    SubscriptionSettings,
};
use uascale_types as t;
use uascale_types::{DateTime, NodeId, StatusCode, Variant};

use crate::client_common::{node, Common, Failure};
use crate::values;

/// The event fields selected unless `--fields` says otherwise.
const DEFAULT_FIELDS: &str = "Time,SourceName,Severity,Message";

/// The flags of `subscribe` that take a value.
pub const FLAGS: &[&str] = &[
    "--events",
    "--fields",
    "--min-severity",
    "--interval-ms",
    "--sampling-ms",
    "--count",
    "--duration-s",
];

/// What one client handle stands for.
enum Watched {
    Value(NodeId),
    Events(NodeId, Vec<String>),
}

fn number<T: std::str::FromStr>(c: &Common, flag: &str) -> Result<Option<T>, Failure> {
    c.flag(flag)
        .map(|v| {
            v.parse()
                .map_err(|_| Failure::Usage(format!("{flag} {v:?} is not a valid number")))
        })
        .transpose()
}

/// The where clause `Severity >= min`.
fn min_severity(min: u16) -> t::ContentFilter {
    t::ContentFilter {
        elements: Some(vec![t::ContentFilterElement {
            filter_operator: t::FilterOperator::GreaterThanOrEqual,
            filter_operands: Some(vec![
                t::ExtensionObject::new(t::SimpleAttributeOperand {
                    type_definition_id: NodeId::ns0(2041),
                    browse_path: Some(vec![t::QualifiedName::new(0, "Severity")]),
                    attribute_id: t::AttributeId::Value as u32,
                    index_range: t::UaString::null(),
                }),
                t::ExtensionObject::new(t::LiteralOperand {
                    value: Variant::UInt16(min),
                }),
            ]),
        }]),
    }
}

/// Runs the subscription until it is told to stop.
pub async fn subscribe(client: &Client, c: &Common) -> Result<(), Failure> {
    let nodes = c.nodes()?;
    let events = c
        .flag("--events")
        .map(node)
        .transpose()
        .map_err(Failure::Usage)?;
    if nodes.is_empty() && events.is_none() {
        return Err(Failure::Usage(
            "nothing to subscribe to: give NODEs and/or --events NOTIFIER (e.g. i=2253)".into(),
        ));
    }
    let interval = number::<u64>(c, "--interval-ms")?.unwrap_or(500);
    let sampling = number::<f64>(c, "--sampling-ms")?.unwrap_or(-1.0);
    let count = number::<u64>(c, "--count")?;
    let duration = number::<f64>(c, "--duration-s")?;
    if let Some(d) = duration {
        if !(d.is_finite() && d > 0.0) {
            return Err(Failure::Usage(
                "--duration-s must be a positive number".into(),
            ));
        }
    }
    let fields: Vec<String> = c
        .flag("--fields")
        .unwrap_or(DEFAULT_FIELDS)
        .split(',')
        .map(|f| f.trim().to_owned())
        .filter(|f| !f.is_empty())
        .collect();
    if fields.is_empty() {
        return Err(Failure::Usage("--fields names no field".into()));
    }
    let where_clause = match number::<u16>(c, "--min-severity")? {
        Some(min) => min_severity(min),
        None => t::ContentFilter::default(),
    };

    let mut sub = client
        .subscribe(SubscriptionSettings::with_interval(Duration::from_millis(
            interval.max(1),
        )))
        .await?;
    let mut items: Vec<MonitorItem> = nodes
        .iter()
        .map(|n| {
            MonitorItem::value(n.clone())
                .sampling(sampling)
                .queue(10, true)
        })
        .collect();
    let mut watched: Vec<Watched> = nodes.iter().cloned().map(Watched::Value).collect();
    if let Some(notifier) = &events {
        let names: Vec<&str> = fields.iter().map(String::as_str).collect();
        items.push(MonitorItem::events(
            notifier.clone(),
            event_filter(&names, where_clause),
        ));
        watched.push(Watched::Events(notifier.clone(), fields.clone()));
    }
    let created = sub.monitor(items).await?;
    let mut by_handle = HashMap::new();
    let mut refused = 0;
    for (item, what) in created.iter().zip(watched) {
        let status = item.result.status_code;
        if status.is_bad() {
            refused += 1;
            let name = match &what {
                Watched::Value(n) => n.to_string(),
                Watched::Events(n, _) => format!("events of {n}"),
            };
            eprintln!("uascale subscribe: {name}: {status}");
        } else {
            by_handle.insert(item.client_handle, what);
        }
    }
    if by_handle.is_empty() {
        return Err(Failure::Bad(format!(
            "the server refused all {refused} monitored items"
        )));
    }
    if !c.json {
        eprintln!(
            "subscribed (subscription {}, publishing every {} ms); Ctrl-C ends",
            sub.id(),
            sub.revised()
                .map_or(interval as u128, |r| r.publishing_interval.as_millis())
        );
    }

    let deadline = duration.map(|d| tokio::time::Instant::now() + Duration::from_secs_f64(d));
    let until = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    let mut printed = 0u64;
    loop {
        let event = tokio::select! {
            e = sub.recv() => e,
            _ = tokio::signal::ctrl_c() => break,
            () = &mut until => break,
        };
        let Some(event) = event else {
            return Err(Failure::Client("the subscription ended".into()));
        };
        match event {
            SubscriptionEvent::Notifications {
                notifications,
                publish_time,
                ..
            } => {
                for n in notifications {
                    if print_one(c.json, &by_handle, n, publish_time) {
                        printed += 1;
                    }
                    if count.is_some_and(|max| printed >= max) {
                        let _ = sub.delete().await;
                        return Ok(());
                    }
                }
            }
            SubscriptionEvent::KeepAlive { .. } => {}
            SubscriptionEvent::Lost { first, count } => {
                eprintln!("uascale subscribe: {count} notification message(s) from {first} lost");
            }
            SubscriptionEvent::Restored(how) => eprintln!(
                "uascale subscribe: connection lost and back; {}",
                match how {
                    Restore::Reactivated => "same session",
                    Restore::Transferred => "new session, subscription transferred",
                    Restore::Recreated => "subscription created again (events in between lost)",
                }
            ),
            SubscriptionEvent::Ended(status) => {
                return Err(Failure::Client(format!("the subscription ended: {status}")));
            }
        }
    }
    let _ = sub.delete().await;
    Ok(())
}

/// Prints one notification; false when it was not one of ours.
fn print_one(
    as_json: bool,
    by_handle: &HashMap<u32, Watched>,
    n: Notification,
    publish_time: DateTime,
) -> bool {
    match n {
        Notification::DataChange {
            client_handle,
            value,
        } => {
            let Some(Watched::Value(node)) = by_handle.get(&client_handle) else {
                return false;
            };
            if as_json {
                crate::client_common::print_json_line(&values::data_value_json(node, &value));
            } else {
                let when = value
                    .source_timestamp
                    .or(value.server_timestamp)
                    .unwrap_or(publish_time);
                let status = value.status.unwrap_or(StatusCode::Good);
                match &value.value {
                    Some(v) if !status.is_bad() => {
                        crate::client_common::out_line(&format!(
                            "{when} {node} = {}",
                            values::text(v)
                        ));
                    }
                    _ => crate::client_common::out_line(&format!("{when} {node}: {status}")),
                }
            }
            true
        }
        Notification::Event {
            client_handle,
            fields,
        } => {
            let Some(Watched::Events(notifier, names)) = by_handle.get(&client_handle) else {
                return false;
            };
            if as_json {
                let mut obj = serde_json::Map::new();
                for (name, v) in names.iter().zip(&fields) {
                    obj.insert(name.clone(), values::json(v));
                }
                crate::client_common::print_json_line(&json!({
                    "event": notifier.to_string(),
                    "fields": Json::Object(obj),
                }));
            } else {
                let parts: Vec<String> = names
                    .iter()
                    .zip(&fields)
                    .map(|(name, v)| format!("{name}={}", values::text(v)))
                    .collect();
                crate::client_common::out_line(&format!(
                    "{publish_time} event {notifier} {}",
                    parts.join(" ")
                ));
            }
            true
        }
        Notification::StatusChange(status) => {
            eprintln!("uascale subscribe: subscription status {status}");
            false
        }
    }
}
