//! Event items: the EventFilter an event item was created with, checked
//! and kept in the form events are matched against.

use uascale_types::{ContentFilter, SimpleAttributeOperand};

/// An EventFilter accepted for an item.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledEventFilter {
    /// The fields each notification carries, in order.
    pub select: Vec<SimpleAttributeOperand>,
    /// The where clause (empty: every event).
    pub where_clause: ContentFilter,
}
