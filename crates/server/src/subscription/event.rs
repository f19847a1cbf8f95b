//! Events (Part 4 §5.12.1.4 and §7.7): the fields of a raised event, the
//! EventFilter an event item was created with - checked once into a form
//! that is cheap to run - and its evaluation: the where clause decides
//! whether an item gets the event, the select clauses which fields.

use uascale_types::{
    ByteString, ContentFilterElementResult, ContentFilterResult, DateTime, ElementOperand,
    EventFilter, EventFilterResult, FilterOperator, LiteralOperand, LocalizedText, NodeId,
    QualifiedName, SimpleAttributeOperand, StatusCode, UaString, Variant,
};

/// BaseEventType (i=2041).
pub const BASE_EVENT_TYPE: u32 = 2041;
/// EventQueueOverflowEventType (i=3035): what an event item's full queue
/// reports in place of the events it discarded.
pub const EVENT_QUEUE_OVERFLOW_EVENT_TYPE: u32 = 3035;
/// Most elements a where clause may have (keeps evaluation bounded).
pub const MAX_FILTER_ELEMENTS: usize = 64;
/// Most select clauses.
pub const MAX_SELECT_CLAUSES: usize = 64;

/// A new EventId, unique across processes and nodes: 8 random bytes drawn
/// once per process, then a counter (16 bytes). The nodes of a cluster
/// and the processes of one node after a restart never hand out the same
/// id, so a client that keeps the EventIds it saw (to tell an event it had
/// from a new one after a failover, or to name one in a method) is never
/// misled.
pub fn new_event_id() -> ByteString {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: std::sync::OnceLock<[u8; 8]> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let mut b = [0u8; 8];
        if getrandom::getrandom(&mut b).is_err() {
            // No randomness: the process's start in nanoseconds instead.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            b = (t as u64).to_be_bytes();
        }
        b
    });
    let mut id = Vec::with_capacity(16);
    id.extend_from_slice(prefix);
    id.extend_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    ByteString::new(id)
}

/// A raised event: its type and its fields by browse name.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The event type (a subtype of BaseEventType).
    pub event_type: NodeId,
    /// Field values by browse name (EventId, EventType, SourceNode, ...).
    pub fields: Vec<(QualifiedName, Variant)>,
}

impl Event {
    /// An event with the BaseEventType fields.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        event_id: ByteString,
        event_type: NodeId,
        source_node: NodeId,
        source_name: &str,
        time: DateTime,
        message: &str,
        severity: u16,
    ) -> Self {
        let f = |n: &str, v: Variant| (QualifiedName::new(0, n), v);
        Event {
            fields: vec![
                f("EventId", Variant::ByteString(event_id)),
                f("EventType", Variant::from(event_type.clone())),
                f("SourceNode", Variant::from(source_node)),
                f("SourceName", Variant::String(UaString::from(source_name))),
                f("Time", Variant::DateTime(time)),
                f("ReceiveTime", Variant::DateTime(time)),
                f("Message", Variant::from(LocalizedText::new("", message))),
                f("Severity", Variant::UInt16(severity)),
            ],
            event_type,
        }
    }

    /// Adds (or replaces) a field.
    pub fn with_field(mut self, name: QualifiedName, value: Variant) -> Self {
        match self.fields.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((name, value)),
        }
        self
    }

    fn field(&self, path: &[QualifiedName]) -> Option<&Variant> {
        match path {
            [name] => self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Operand {
    Literal(Variant),
    Element(usize),
    Field(SimpleAttributeOperand),
}

#[derive(Debug, Clone, PartialEq)]
struct Element {
    op: FilterOperator,
    operands: Vec<Operand>,
}

/// An EventFilter accepted for an item.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledEventFilter {
    /// The fields each notification carries, in order.
    pub select: Vec<SimpleAttributeOperand>,
    elements: Vec<Element>,
    /// The filter as the client sent it: what a cluster mirror keeps, to
    /// compile again on the node that takes the item over.
    pub source: EventFilter,
}

/// How many operands an operator takes (min, max).
fn arity(op: FilterOperator) -> Option<(usize, usize)> {
    Some(match op {
        FilterOperator::IsNull | FilterOperator::Not | FilterOperator::OfType => (1, 1),
        FilterOperator::Equals
        | FilterOperator::GreaterThan
        | FilterOperator::LessThan
        | FilterOperator::GreaterThanOrEqual
        | FilterOperator::LessThanOrEqual
        | FilterOperator::Like
        | FilterOperator::And
        | FilterOperator::Or => (2, 2),
        FilterOperator::Between => (3, 3),
        FilterOperator::InList => (2, usize::MAX),
        _ => return None,
    })
}

/// Checks an EventFilter; `Err` carries the item's status and the filter
/// result that says which part was wrong.
pub fn compile(
    f: &EventFilter,
    is_event_type: &dyn Fn(&NodeId) -> bool,
) -> Result<(CompiledEventFilter, EventFilterResult), (StatusCode, EventFilterResult)> {
    let select = f.select_clauses.clone().unwrap_or_default();
    let mut bad = false;
    let select_results: Vec<StatusCode> = select
        .iter()
        .map(|s| {
            let st = if !s.type_definition_id.is_null() && !is_event_type(&s.type_definition_id) {
                StatusCode::BadTypeDefinitionInvalid
            } else if s.attribute_id != 13 && s.attribute_id != 1 {
                StatusCode::BadAttributeIdInvalid
            } else if s.attribute_id == 13 && s.browse_path.as_deref().is_none_or(<[_]>::is_empty) {
                StatusCode::BadBrowseNameInvalid
            } else {
                StatusCode::Good
            };
            bad |= st.is_bad();
            st
        })
        .collect();
    let raw = f.where_clause.elements.as_deref().unwrap_or(&[]);
    let mut elements = Vec::with_capacity(raw.len());
    let mut element_results = Vec::with_capacity(raw.len());
    for (i, e) in raw.iter().enumerate() {
        let mut status = StatusCode::Good;
        let mut operand_codes = Vec::new();
        let mut operands = Vec::new();
        let ops = e.filter_operands.as_deref().unwrap_or(&[]);
        match arity(e.filter_operator) {
            None => status = StatusCode::BadFilterOperatorUnsupported,
            Some((lo, hi)) if ops.len() < lo || ops.len() > hi => {
                status = StatusCode::BadFilterOperandCountMismatch
            }
            Some(_) => {}
        }
        for o in ops {
            let (code, operand) = if let Some(l) = o.downcast_ref::<LiteralOperand>() {
                (StatusCode::Good, Some(Operand::Literal(l.value.clone())))
            } else if let Some(el) = o.downcast_ref::<ElementOperand>() {
                let idx = el.index as usize;
                // Only later elements: no cycles, bounded recursion.
                if idx > i && idx < raw.len() {
                    (StatusCode::Good, Some(Operand::Element(idx)))
                } else {
                    (StatusCode::BadFilterElementInvalid, None)
                }
            } else if let Some(s) = o.downcast_ref::<SimpleAttributeOperand>() {
                (StatusCode::Good, Some(Operand::Field(s.clone())))
            } else {
                (StatusCode::BadFilterOperandInvalid, None)
            };
            if code.is_bad() && status.is_good() {
                status = StatusCode::BadFilterOperandInvalid;
            }
            operand_codes.push(code);
            if let Some(op) = operand {
                operands.push(op);
            }
        }
        if e.filter_operator == FilterOperator::OfType
            && !matches!(operands.first(), Some(Operand::Literal(Variant::NodeId(n))) if is_event_type(n))
            && status.is_good()
        {
            status = StatusCode::BadFilterOperandInvalid;
        }
        bad |= status.is_bad();
        element_results.push(ContentFilterElementResult {
            status_code: status,
            operand_status_codes: Some(if status.is_good() {
                vec![]
            } else {
                operand_codes
            }),
            operand_diagnostic_infos: Some(vec![]),
        });
        elements.push(Element {
            op: e.filter_operator,
            operands,
        });
    }
    let too_big = select.len() > MAX_SELECT_CLAUSES || raw.len() > MAX_FILTER_ELEMENTS;
    let result = EventFilterResult {
        select_clause_results: Some(if bad { select_results } else { vec![] }),
        select_clause_diagnostic_infos: Some(vec![]),
        where_clause_result: ContentFilterResult {
            element_results: Some(if bad { element_results } else { vec![] }),
            element_diagnostic_infos: Some(vec![]),
        },
    };
    if select.is_empty() || too_big {
        return Err((StatusCode::BadEventFilterInvalid, result));
    }
    if bad {
        return Err((StatusCode::BadEventFilterInvalid, result));
    }
    Ok((
        CompiledEventFilter {
            select,
            elements,
            source: f.clone(),
        },
        result,
    ))
}

impl CompiledEventFilter {
    /// The selected fields of `event`, without the where clause (the
    /// server's own EventQueueOverflow events are reported whatever the
    /// where clause says). A select clause naming a type applies only to
    /// that type and BaseEventType.
    pub fn select(&self, event: &Event) -> Vec<Variant> {
        self.select
            .iter()
            .map(|s| field(s, event, &|a, b| a == b))
            .collect()
    }

    /// The selected fields when `event` passes the where clause, else
    /// `None`. `is_subtype(a, b)`: type `a` is `b` or derives from it.
    pub fn apply(
        &self,
        event: &Event,
        is_subtype: &dyn Fn(&NodeId, &NodeId) -> bool,
    ) -> Option<Vec<Variant>> {
        if !self.elements.is_empty() && eval(self, 0, event, is_subtype) != Variant::Boolean(true) {
            return None;
        }
        Some(
            self.select
                .iter()
                .map(|s| field(s, event, is_subtype))
                .collect(),
        )
    }
}

fn field(
    s: &SimpleAttributeOperand,
    event: &Event,
    is_subtype: &dyn Fn(&NodeId, &NodeId) -> bool,
) -> Variant {
    if !s.type_definition_id.is_null()
        && s.type_definition_id != NodeId::ns0(BASE_EVENT_TYPE)
        && !is_subtype(&event.event_type, &s.type_definition_id)
    {
        return Variant::Empty;
    }
    if s.attribute_id != 13 {
        // NodeId of a condition: plain events have none.
        return Variant::Empty;
    }
    event
        .field(s.browse_path.as_deref().unwrap_or(&[]))
        .cloned()
        .unwrap_or(Variant::Empty)
}

fn operand(
    f: &CompiledEventFilter,
    o: &Operand,
    event: &Event,
    is_subtype: &dyn Fn(&NodeId, &NodeId) -> bool,
) -> Variant {
    match o {
        Operand::Literal(v) => v.clone(),
        Operand::Element(i) => eval(f, *i, event, is_subtype),
        Operand::Field(s) => field(s, event, is_subtype),
    }
}

fn eval(
    f: &CompiledEventFilter,
    i: usize,
    event: &Event,
    is_subtype: &dyn Fn(&NodeId, &NodeId) -> bool,
) -> Variant {
    let Some(e) = f.elements.get(i) else {
        return Variant::Empty;
    };
    let arg = |k: usize| {
        e.operands
            .get(k)
            .map_or(Variant::Empty, |o| operand(f, o, event, is_subtype))
    };
    let b = Variant::Boolean;
    match e.op {
        FilterOperator::Equals => b(equals(&arg(0), &arg(1))),
        FilterOperator::IsNull => b(arg(0) == Variant::Empty),
        FilterOperator::GreaterThan => cmp(&arg(0), &arg(1), |o| o.is_gt()),
        FilterOperator::LessThan => cmp(&arg(0), &arg(1), |o| o.is_lt()),
        FilterOperator::GreaterThanOrEqual => cmp(&arg(0), &arg(1), |o| o.is_ge()),
        FilterOperator::LessThanOrEqual => cmp(&arg(0), &arg(1), |o| o.is_le()),
        FilterOperator::Like => match (text(&arg(0)), text(&arg(1))) {
            (Some(s), Some(p)) => b(like(
                &s.chars().collect::<Vec<_>>(),
                &p.chars().collect::<Vec<_>>(),
            )),
            _ => b(false),
        },
        FilterOperator::Not => match arg(0) {
            Variant::Boolean(x) => b(!x),
            _ => Variant::Empty,
        },
        FilterOperator::Between => {
            let v = arg(0);
            match (order(&v, &arg(1)), order(&v, &arg(2))) {
                (Some(lo), Some(hi)) => b(lo.is_ge() && hi.is_le()),
                _ => b(false),
            }
        }
        FilterOperator::InList => {
            let v = arg(0);
            b((1..e.operands.len()).any(|k| equals(&v, &arg(k))))
        }
        FilterOperator::And => match (arg(0), arg(1)) {
            (Variant::Boolean(false), _) | (_, Variant::Boolean(false)) => b(false),
            (Variant::Boolean(true), Variant::Boolean(true)) => b(true),
            _ => Variant::Empty,
        },
        FilterOperator::Or => match (arg(0), arg(1)) {
            (Variant::Boolean(true), _) | (_, Variant::Boolean(true)) => b(true),
            (Variant::Boolean(false), Variant::Boolean(false)) => b(false),
            _ => Variant::Empty,
        },
        FilterOperator::OfType => match arg(0) {
            Variant::NodeId(t) => b(is_subtype(&event.event_type, &t)),
            _ => b(false),
        },
        _ => Variant::Empty,
    }
}

fn text(v: &Variant) -> Option<String> {
    match v {
        Variant::String(s) => Some(s.as_str_or_empty().to_owned()),
        Variant::LocalizedText(t) => Some(t.text.as_str_or_empty().to_owned()),
        Variant::QualifiedName(q) => Some(q.name.as_str_or_empty().to_owned()),
        _ => None,
    }
}

fn order(a: &Variant, b: &Variant) -> Option<std::cmp::Ordering> {
    if let (Some(x), Some(y)) = (number(a), number(b)) {
        return x.partial_cmp(&y);
    }
    match (a, b) {
        (Variant::DateTime(x), Variant::DateTime(y)) => Some(x.ticks().cmp(&y.ticks())),
        _ => match (text(a), text(b)) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => None,
        },
    }
}

fn equals(a: &Variant, b: &Variant) -> bool {
    if let (Some(x), Some(y)) = (number(a), number(b)) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (text(a), text(b)) {
        return x == y;
    }
    a == b
}

fn cmp(a: &Variant, b: &Variant, f: impl Fn(std::cmp::Ordering) -> bool) -> Variant {
    Variant::Boolean(order(a, b).is_some_and(f))
}

#[derive(Debug)]
enum Tok {
    Any,
    One,
    Char(char),
    Set(bool, Vec<(char, char)>),
}

fn tokens(p: &[char]) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut k = 0;
    while let Some(&c) = p.get(k) {
        k += 1;
        match c {
            '%' => out.push(Tok::Any),
            '_' => out.push(Tok::One),
            '\\' => {
                if let Some(&e) = p.get(k) {
                    out.push(Tok::Char(e));
                    k += 1;
                }
            }
            '[' => match p[k..].iter().position(|&c| c == ']') {
                None => out.push(Tok::Char('[')),
                Some(end) => {
                    let mut set = &p[k..k + end];
                    k += end + 1;
                    let neg = set.first() == Some(&'^');
                    if neg {
                        set = &set[1..];
                    }
                    let mut ranges = Vec::new();
                    let mut m = 0;
                    while m < set.len() {
                        if m + 2 < set.len() && set[m + 1] == '-' {
                            ranges.push((set[m], set[m + 2]));
                            m += 3;
                        } else {
                            ranges.push((set[m], set[m]));
                            m += 1;
                        }
                    }
                    out.push(Tok::Set(neg, ranges));
                }
            },
            c => out.push(Tok::Char(c)),
        }
    }
    out
}

/// The Like operator's pattern (Part 4 Table 125): `%` any run, `_` one
/// character, `[abc]` / `[^abc]` / `[a-c]` one of a set, `\\` escapes.
/// Dynamic programming, O(text x pattern): no pattern can make it blow up.
fn like(s: &[char], p: &[char]) -> bool {
    let toks = tokens(p);
    // row[j]: the first i characters of s match the first j tokens.
    let mut row = vec![false; toks.len() + 1];
    row[0] = true;
    for (j, t) in toks.iter().enumerate() {
        row[j + 1] = row[j] && matches!(t, Tok::Any);
    }
    for &c in s {
        let mut next = vec![false; toks.len() + 1];
        for (j, t) in toks.iter().enumerate() {
            next[j + 1] = match t {
                Tok::Any => next[j] || row[j + 1],
                Tok::One => row[j],
                Tok::Char(x) => row[j] && *x == c,
                Tok::Set(neg, ranges) => {
                    row[j] && (ranges.iter().any(|&(a, b)| a <= c && c <= b) != *neg)
                }
            };
        }
        row = next;
    }
    row[toks.len()]
}

/// A scalar numeric Variant as f64.
pub fn number(v: &Variant) -> Option<f64> {
    Some(match v {
        Variant::SByte(x) => f64::from(*x),
        Variant::Byte(x) => f64::from(*x),
        Variant::Int16(x) => f64::from(*x),
        Variant::UInt16(x) => f64::from(*x),
        Variant::Int32(x) => f64::from(*x),
        Variant::UInt32(x) => f64::from(*x),
        Variant::Int64(x) => *x as f64,
        Variant::UInt64(x) => *x as f64,
        Variant::Float(x) => f64::from(*x),
        Variant::Double(x) => *x,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    /// EventIds: 16 bytes, the process's random prefix then a counter, so
    /// no two are the same within a process and two processes (nodes of a
    /// cluster, a node and its restart) differ in the prefix.
    #[test]
    fn event_ids_are_unique() {
        let ids: Vec<_> = (0..1000).map(|_| super::new_event_id()).collect();
        let set: std::collections::HashSet<_> = ids.iter().cloned().collect();
        assert_eq!(set.len(), ids.len());
        let bytes = |b: &ByteString| b.as_bytes().unwrap_or_default().to_vec();
        assert!(ids.iter().all(|i| bytes(i).len() == 16));
        assert_eq!(
            bytes(&ids[0])[..8],
            bytes(&ids[999])[..8],
            "one prefix per process"
        );
    }

    use super::*;
    use uascale_types::{ContentFilter, ContentFilterElement, ExtensionObject};

    fn sel(name: &str) -> SimpleAttributeOperand {
        SimpleAttributeOperand {
            type_definition_id: NodeId::ns0(BASE_EVENT_TYPE),
            browse_path: Some(vec![QualifiedName::new(0, name)]),
            attribute_id: 13,
            index_range: UaString::null(),
        }
    }

    fn el(op: FilterOperator, ops: Vec<ExtensionObject>) -> ContentFilterElement {
        ContentFilterElement {
            filter_operator: op,
            filter_operands: Some(ops),
        }
    }

    fn lit(v: impl Into<Variant>) -> ExtensionObject {
        ExtensionObject::new(LiteralOperand { value: v.into() })
    }

    fn field_op(name: &str) -> ExtensionObject {
        ExtensionObject::new(sel(name))
    }

    fn elem(i: u32) -> ExtensionObject {
        ExtensionObject::new(ElementOperand { index: i })
    }

    fn event(severity: u16, msg: &str, ty: u32) -> Event {
        Event::new(
            ByteString::new(vec![1]),
            NodeId::ns0(ty),
            NodeId::ns0(2253),
            "Server",
            DateTime::from_ticks(5),
            msg,
            severity,
        )
    }

    /// 2041 BaseEventType <- 2130 SystemEventType <- 2131 DeviceFailureEventType.
    fn subtype(a: &NodeId, b: &NodeId) -> bool {
        let chain = [2131u32, 2130, 2041];
        let (Some(x), Some(y)) = (a.as_ns0(), b.as_ns0()) else {
            return false;
        };
        let i = chain.iter().position(|&c| c == x);
        let j = chain.iter().position(|&c| c == y);
        matches!((i, j), (Some(i), Some(j)) if i <= j)
    }

    fn filter(elements: Vec<ContentFilterElement>) -> CompiledEventFilter {
        compile(
            &EventFilter {
                select_clauses: Some(vec![sel("Severity"), sel("Message"), sel("Nope")]),
                where_clause: ContentFilter {
                    elements: Some(elements),
                },
            },
            &|n| subtype(n, &NodeId::ns0(BASE_EVENT_TYPE)),
        )
        .unwrap()
        .0
    }

    #[test]
    fn select_clauses_pick_fields_and_null_for_unknown() {
        let f = filter(vec![]);
        let got = f.apply(&event(500, "hi", 2041), &subtype).unwrap();
        assert_eq!(
            got,
            vec![
                Variant::UInt16(500),
                Variant::from(LocalizedText::new("", "hi")),
                Variant::Empty
            ]
        );
    }

    #[test]
    fn where_clause_operators() {
        let e = event(600, "Pump 7 overheated", 2131);
        let cases: Vec<(Vec<ContentFilterElement>, bool)> = vec![
            (
                vec![el(
                    FilterOperator::GreaterThan,
                    vec![field_op("Severity"), lit(500i32)],
                )],
                true,
            ),
            (
                vec![el(
                    FilterOperator::LessThan,
                    vec![field_op("Severity"), lit(500u16)],
                )],
                false,
            ),
            (
                vec![el(
                    FilterOperator::Equals,
                    vec![field_op("Severity"), lit(600.0f64)],
                )],
                true,
            ),
            (
                vec![el(
                    FilterOperator::Like,
                    vec![field_op("Message"), lit("Pump _ over%")],
                )],
                true,
            ),
            (
                vec![el(
                    FilterOperator::Like,
                    vec![field_op("Message"), lit("Pump [0-5]%")],
                )],
                false,
            ),
            (
                vec![el(
                    FilterOperator::InList,
                    vec![field_op("Severity"), lit(1u16), lit(600u16)],
                )],
                true,
            ),
            (
                vec![el(FilterOperator::OfType, vec![lit(NodeId::ns0(2130))])],
                true,
            ),
            (
                vec![
                    el(FilterOperator::And, vec![elem(1), elem(2)]),
                    el(FilterOperator::OfType, vec![lit(NodeId::ns0(2130))]),
                    el(FilterOperator::Not, vec![elem(3)]),
                    el(
                        FilterOperator::LessThan,
                        vec![field_op("Severity"), lit(100i32)],
                    ),
                ],
                true,
            ),
            (
                vec![
                    el(FilterOperator::Or, vec![elem(1), elem(2)]),
                    el(
                        FilterOperator::Equals,
                        vec![field_op("SourceName"), lit("Other")],
                    ),
                    el(FilterOperator::IsNull, vec![field_op("Severity")]),
                ],
                false,
            ),
        ];
        for (i, (elements, expect)) in cases.into_iter().enumerate() {
            let f = filter(elements);
            assert_eq!(f.apply(&e, &subtype).is_some(), expect, "case {i}");
        }
        // OfType with a type the event is not.
        let f = filter(vec![el(
            FilterOperator::OfType,
            vec![lit(NodeId::ns0(2131))],
        )]);
        assert!(f.apply(&event(1, "", 2130), &subtype).is_none());
    }

    #[test]
    fn bad_filters_are_rejected_with_results() {
        let is_type = |n: &NodeId| subtype(n, &NodeId::ns0(BASE_EVENT_TYPE));
        let bad = |elements: Vec<ContentFilterElement>| {
            compile(
                &EventFilter {
                    select_clauses: Some(vec![sel("Severity")]),
                    where_clause: ContentFilter {
                        elements: Some(elements),
                    },
                },
                &is_type,
            )
            .unwrap_err()
        };
        let (st, r) = bad(vec![el(FilterOperator::Equals, vec![lit(1i32)])]);
        assert_eq!(st, StatusCode::BadEventFilterInvalid);
        assert_eq!(
            r.where_clause_result.element_results.unwrap()[0].status_code,
            StatusCode::BadFilterOperandCountMismatch
        );
        let (_, r) = bad(vec![el(FilterOperator::Not, vec![elem(0)])]);
        assert_eq!(
            r.where_clause_result.element_results.unwrap()[0].status_code,
            StatusCode::BadFilterOperandInvalid,
            "an element may not refer to itself"
        );
        let (_, r) = bad(vec![el(FilterOperator(99), vec![])]);
        assert_eq!(
            r.where_clause_result.element_results.unwrap()[0].status_code,
            StatusCode::BadFilterOperatorUnsupported
        );
        let no_select = compile(&EventFilter::default(), &is_type).unwrap_err();
        assert_eq!(no_select.0, StatusCode::BadEventFilterInvalid);
        assert!(
            !like(&['a'], &['[']),
            "unterminated set is literal and does not panic"
        );
        let long: Vec<char> = "a".repeat(2000).chars().collect();
        let pat: Vec<char> = "%a".repeat(500).chars().chain("b".chars()).collect();
        assert!(!like(&long, &pat), "no exponential blow-up");
        let t = |s: &str, p: &str| {
            like(
                &s.chars().collect::<Vec<_>>(),
                &p.chars().collect::<Vec<_>>(),
            )
        };
        assert!(t("50%", "50\\%"));
        assert!(t("abc", "[^x-z]b_"));
        assert!(t("", "%"));
        assert!(!t("ab", "a"));
    }
}
