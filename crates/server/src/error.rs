//! `ServiceError`: why a request was not served, who is to blame, and when
//! the client may try again - and the one place that turns it into the
//! ServiceFault a client sees.
//!
//! A handler returns `Result<Response, ServiceError>`. The status alone
//! would lose what logging, metrics and the busy signal need: whether the
//! client sent something wrong, the server failed, or the server is
//! overloaded and says when to come back (docs/scalability.md §2: every busy
//! answer carries a `RetryAfterMs` hint).

use std::time::Duration;

use crate::shed::Shed;

use uascale_types::{
    AdditionalParametersType, DateTime, ExtensionObject, KeyValuePair, QualifiedName,
    ResponseHeader, ServiceFault, StatusCode, Variant,
};

/// The key of the retry-after hint in `ResponseHeader.additionalHeader`
/// (namespace 0; the value is an Int64 of milliseconds).
pub const RETRY_AFTER_KEY: &str = "RetryAfterMs";

/// The key of a retry ticket (namespace 0; a String): in a busy
/// ServiceFault's additionalHeader, beside the hint, and echoed by the
/// client in its next CreateSession's RequestHeader.additionalHeader
/// (docs/scalability.md, "Retry tickets").
pub const RETRY_TICKET_KEY: &str = "RetryTicket";

/// Who caused a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Blame {
    /// The request was malformed, unauthorised or named what does not
    /// exist: the client must change it.
    Client,
    /// The server failed (an internal error, an unavailable resource).
    Server,
    /// The server is at a limit right now: the same request may succeed
    /// later (a busy answer).
    Overload,
}

/// A failed request: a StatusCode with its cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceError {
    status: StatusCode,
    blame: Blame,
    /// The refusal behind a busy answer.
    shed: Option<Shed>,
}

impl ServiceError {
    /// A failure the client caused.
    pub const fn client(status: StatusCode) -> Self {
        ServiceError {
            status,
            blame: Blame::Client,
            shed: None,
        }
    }

    /// A failure of the server itself.
    pub const fn server(status: StatusCode) -> Self {
        ServiceError {
            status,
            blame: Blame::Server,
            shed: None,
        }
    }

    /// A busy answer: a stage shed the request (the status is the
    /// refusal's; the client may retry after its hint).
    pub const fn shed(shed: Shed) -> Self {
        ServiceError {
            status: shed.status(),
            blame: Blame::Overload,
            shed: Some(shed),
        }
    }

    /// The StatusCode of the ServiceFault.
    pub const fn status_code(&self) -> StatusCode {
        self.status
    }

    /// Who is to blame.
    pub const fn blame(&self) -> Blame {
        self.blame
    }

    /// When the client may try again (busy answers only).
    pub const fn retry_after(&self) -> Option<Duration> {
        match self.shed {
            Some(s) => Some(s.retry_after),
            None => None,
        }
    }

    /// The refusal behind a busy answer.
    pub const fn refusal(&self) -> Option<Shed> {
        self.shed
    }

    /// The ServiceFault answering `request_handle` at `now`: the status,
    /// and for a busy answer the `RetryAfterMs` hint in the
    /// additionalHeader (an `AdditionalParametersType` with the
    /// KeyValuePair `RetryAfterMs`, Int64 milliseconds rounded up, and for
    /// an admission refusal `RetryTicket`, a String).
    pub fn to_fault(&self, now: DateTime, request_handle: u32) -> ServiceFault {
        let mut fault = service_fault(now, request_handle, self.status);
        if let Some(after) = self.retry_after() {
            fault.response_header.additional_header = retry_after_header(after);
            if let Some(t) = self.shed.and_then(|s| s.ticket) {
                fault.response_header.additional_header =
                    ExtensionObject::new(AdditionalParametersType {
                        parameters: Some(vec![
                            KeyValuePair {
                                key: QualifiedName::new(0, RETRY_AFTER_KEY),
                                value: Variant::Int64(ceil_ms(after)),
                            },
                            KeyValuePair {
                                key: QualifiedName::new(0, RETRY_TICKET_KEY),
                                value: Variant::String(t.to_string().into()),
                            },
                        ]),
                    });
            }
        }
        fault
    }
}

impl From<StatusCode> for ServiceError {
    /// A bare status: blamed on the server for the codes that mean a
    /// server fault or a limit, on the client otherwise.
    fn from(status: StatusCode) -> Self {
        let blame = if [
            StatusCode::BadInternalError,
            StatusCode::BadOutOfMemory,
            StatusCode::BadResourceUnavailable,
            StatusCode::BadCommunicationError,
            StatusCode::BadServerHalted,
            StatusCode::BadShutdown,
        ]
        .contains(&status)
        {
            Blame::Server
        } else if [
            StatusCode::BadServerTooBusy,
            StatusCode::BadTooManySessions,
            StatusCode::BadTooManyPublishRequests,
            StatusCode::BadTcpServerTooBusy,
        ]
        .contains(&status)
        {
            Blame::Overload
        } else {
            Blame::Client
        };
        ServiceError {
            status,
            blame,
            shed: None,
        }
    }
}

/// A ServiceError equals the StatusCode it answers with (handy in tests
/// and matches; blame and hint are not compared).
impl PartialEq<StatusCode> for ServiceError {
    fn eq(&self, other: &StatusCode) -> bool {
        self.status == *other
    }
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({:?})", self.status, self.blame)?;
        if let Some(shed) = self.shed {
            write!(
                f,
                ", shed at {} ({}), retry after {} ms",
                shed.stage.name(),
                shed.reason.name(),
                ceil_ms(shed.retry_after)
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ServiceError {}

/// A ServiceFault answering `request_handle` with `status` and no hint.
pub fn service_fault(now: DateTime, request_handle: u32, status: StatusCode) -> ServiceFault {
    ServiceFault {
        response_header: ResponseHeader {
            timestamp: now,
            request_handle,
            service_result: status,
            ..Default::default()
        },
    }
}

fn ceil_ms(d: Duration) -> i64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The additionalHeader carrying a retry-after hint.
pub fn retry_after_header(after: Duration) -> ExtensionObject {
    ExtensionObject::new(AdditionalParametersType {
        parameters: Some(vec![KeyValuePair {
            key: QualifiedName::new(0, RETRY_AFTER_KEY),
            value: Variant::Int64(ceil_ms(after)),
        }]),
    })
}

/// The retry ticket a client echoed in a request header's
/// additionalHeader, when it has one.
pub fn retry_ticket_of(header: &uascale_types::RequestHeader) -> Option<String> {
    let params = header
        .additional_header
        .downcast_ref::<AdditionalParametersType>()?;
    params.parameters.as_ref()?.iter().find_map(|p| {
        if p.key.namespace_index != 0 || p.key.name.as_str_or_empty() != RETRY_TICKET_KEY {
            return None;
        }
        match &p.value {
            Variant::String(s) => s.as_str().map(str::to_owned),
            _ => None,
        }
    })
}

/// The retry-after hint of a response header, when it has one.
pub fn retry_after_of(header: &ResponseHeader) -> Option<Duration> {
    let params = header
        .additional_header
        .downcast_ref::<AdditionalParametersType>()?;
    params.parameters.as_ref()?.iter().find_map(|p| {
        if p.key.namespace_index != 0 || p.key.name.as_str_or_empty() != RETRY_AFTER_KEY {
            return None;
        }
        match p.value {
            Variant::Int64(ms) if ms >= 0 => Some(Duration::from_millis(ms as u64)),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_types::{decode_message, encode_message, DecodeLimits, Reader};

    #[test]
    fn a_busy_fault_carries_the_hint_rounded_up_and_survives_the_wire() {
        let e = ServiceError::shed(Shed::new(
            crate::shed::Stage::Queue,
            crate::shed::Reason::Full,
            Duration::from_micros(1_500),
        ));
        assert_eq!(e.blame(), Blame::Overload);
        let fault = e.to_fault(DateTime::from_ticks(7), 42);
        let mut bytes = Vec::new();
        encode_message(&fault, &mut bytes);
        let limits = DecodeLimits::default();
        let back =
            decode_message(&mut Reader::new(&bytes, &limits).expect("reader")).expect("decodes");
        let back = back
            .as_any()
            .downcast_ref::<ServiceFault>()
            .expect("a ServiceFault");
        let h = &back.response_header;
        assert_eq!(h.service_result, StatusCode::BadServerTooBusy);
        assert_eq!(h.request_handle, 42);
        assert_eq!(retry_after_of(h), Some(Duration::from_millis(2)));
    }

    #[test]
    fn other_faults_have_no_header_and_a_blame() {
        let e = ServiceError::from(StatusCode::BadNodeIdUnknown);
        assert_eq!(e.blame(), Blame::Client);
        let f = e.to_fault(DateTime::from_ticks(1), 1);
        assert!(f.response_header.additional_header.is_null());
        assert_eq!(retry_after_of(&f.response_header), None);
        assert_eq!(
            ServiceError::from(StatusCode::BadInternalError).blame(),
            Blame::Server
        );
        assert_eq!(
            ServiceError::from(StatusCode::BadTooManySessions).blame(),
            Blame::Overload
        );
    }
}
