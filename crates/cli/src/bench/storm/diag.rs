//! The server's own count of sessions, read through a separate client
//! before and after the storm: the ServerDiagnosticsSummary counters of
//! Part 5. A server may not offer them (a Bad status: reported as
//! unsupported) or may not keep one (it reads 0: reported as such).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use uascale_client::Client;
use uascale_types::{ids::variable as v, NodeId, StatusCode, Variant};

/// The counters read, by browse name, with their NodeIds (namespace 0).
pub const COUNTERS: [(&str, u32); 5] = [
    (
        "CurrentSessionCount",
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSessionCount,
    ),
    (
        "CumulatedSessionCount",
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSessionCount,
    ),
    (
        "RejectedSessionCount",
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedSessionCount,
    ),
    (
        "SessionTimeoutCount",
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionTimeoutCount,
    ),
    (
        "SessionAbortCount",
        v::Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionAbortCount,
    ),
];

/// One counter as read.
#[derive(Debug, Clone, Serialize)]
pub struct Reading {
    /// The value; `None` when it was not Good or not a number.
    pub value: Option<u64>,
    /// The StatusCode of the value (`Good`, `BadNodeIdUnknown`, ...).
    pub status: String,
}

/// The counters by browse name.
pub type Snapshot = BTreeMap<&'static str, Reading>;

fn number(v: &Variant) -> Option<u64> {
    match v {
        Variant::UInt32(n) => Some(u64::from(*n)),
        Variant::UInt64(n) => Some(*n),
        Variant::Int32(n) => u64::try_from(*n).ok(),
        Variant::Int64(n) => u64::try_from(*n).ok(),
        Variant::UInt16(n) => Some(u64::from(*n)),
        _ => None,
    }
}

/// Reads the counters, trying up to three times a second apart (the
/// server may still be busy).
pub async fn read(client: &Client) -> Result<Snapshot, String> {
    let nodes: Vec<NodeId> = COUNTERS.iter().map(|(_, id)| NodeId::ns0(*id)).collect();
    let mut last = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        match client.read_values(&nodes).await {
            Ok(values) => {
                return Ok(COUNTERS
                    .iter()
                    .zip(values)
                    .map(|((name, _), dv)| {
                        let code = dv.status.unwrap_or(StatusCode::Good);
                        let good = code.is_good();
                        let value = dv.value.as_ref().and_then(number).filter(|_| good);
                        let empty = matches!(dv.value, None | Some(Variant::Empty));
                        let status = if good && empty {
                            "Good, but no value".to_owned()
                        } else if good && value.is_none() {
                            "Good, but not a number".to_owned()
                        } else {
                            code.to_string()
                        };
                        (*name, Reading { value, status })
                    })
                    .collect());
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!(
        "the server's diagnostics could not be read: {last}"
    ))
}

/// [`read`] through `client`, or the reason there is none.
pub async fn read_from(client: &Result<Client, String>) -> Result<Snapshot, String> {
    match client {
        Ok(c) => read(c).await,
        Err(e) => Err(e.clone()),
    }
}

/// `after - before` of counter `name`, when both were read.
pub fn delta(before: Option<&Snapshot>, after: Option<&Snapshot>, name: &str) -> Option<i64> {
    let b = before?.get(name)?.value?;
    let a = after?.get(name)?.value?;
    Some(a as i64 - b as i64)
}

/// What the readings say about the counters themselves: which are
/// unsupported and which read 0 both times (perhaps not kept).
pub fn notes(before: Option<&Snapshot>, after: Option<&Snapshot>) -> Vec<String> {
    let mut notes = Vec::new();
    for (name, _) in COUNTERS {
        let b = before.and_then(|s| s.get(name));
        let a = after.and_then(|s| s.get(name));
        match (b, a) {
            (Some(b), Some(a)) if b.value.is_none() || a.value.is_none() => {
                let status = if b.value.is_none() {
                    &b.status
                } else {
                    &a.status
                };
                notes.push(format!("{name} unsupported ({status})"));
            }
            (Some(b), Some(a)) if b.value == Some(0) && a.value == Some(0) => notes.push(format!(
                "{name} read 0 before and after (the server may not keep it)"
            )),
            (None, _) | (_, None) => notes.push(format!("{name} not read")),
            _ => {}
        }
    }
    notes
}

/// The readings as JSON (`null` for one not taken).
pub fn to_json(s: Option<&Snapshot>) -> serde_json::Value {
    match s {
        Some(s) => json!(s),
        None => serde_json::Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(values: &[Option<u64>]) -> Snapshot {
        COUNTERS
            .iter()
            .zip(values)
            .map(|((name, _), v)| {
                (
                    *name,
                    Reading {
                        value: *v,
                        status: if v.is_some() {
                            "Good".into()
                        } else {
                            "BadNodeIdUnknown".into()
                        },
                    },
                )
            })
            .collect()
    }

    #[test]
    fn deltas_and_notes() {
        let before = snap(&[Some(3), Some(10), Some(0), Some(1), Some(0)]);
        let after = snap(&[Some(5), Some(60), Some(4), Some(7), Some(0)]);
        assert_eq!(
            delta(Some(&before), Some(&after), "CurrentSessionCount"),
            Some(2)
        );
        assert_eq!(
            delta(Some(&before), Some(&after), "SessionTimeoutCount"),
            Some(6)
        );
        assert_eq!(delta(None, Some(&after), "SessionTimeoutCount"), None);
        let n = notes(Some(&before), Some(&after));
        assert_eq!(
            n,
            vec!["SessionAbortCount read 0 before and after (the server may not keep it)"]
        );
        let missing = snap(&[Some(3), None, Some(0), Some(1), Some(0)]);
        let n = notes(Some(&missing), Some(&after));
        assert!(n.contains(&"CumulatedSessionCount unsupported (BadNodeIdUnknown)".to_owned()));
        assert_eq!(notes(None, None).len(), COUNTERS.len());
    }
}
