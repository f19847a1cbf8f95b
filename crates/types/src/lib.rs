//! `uascale-types`: the OPC UA data model and its binary encoding.
//!
//! Owns: the built-in types of Part 6 §5.1 ([`NodeId`], [`Variant`],
//! [`DataValue`], [`ExtensionObject`]...), [`StatusCode`], the binary codec
//! ([`BinaryEncode`], [`BinaryDecode`], the bounded [`Reader`] with
//! [`DecodeLimits`]), and every namespace-0 structure, enumeration and NodeId,
//! generated from the OPC Foundation schema by `cargo xtask codegen` into
//! `src/generated/`.
//!
//! Must not: do IO, read clocks, spawn, or panic on any input. Decoding never
//! trusts a length before checking it against the limits and the bytes left.
//!
//! ```
//! use uascale_types::*;
//! let req = ReadRequest {
//!     nodes_to_read: Some(vec![ReadValueId {
//!         node_id: NodeId::ns0(ids::variable::Server_ServerStatus_CurrentTime),
//!         attribute_id: AttributeId::Value as u32,
//!         ..Default::default()
//!     }]),
//!     ..Default::default()
//! };
//! let mut buf = Vec::new();
//! encode_message(&req, &mut buf);
//! let limits = DecodeLimits::default();
//! let msg = decode_message(&mut Reader::new(&buf, &limits).unwrap()).unwrap();
//! let back = msg.as_any().downcast_ref::<ReadRequest>().unwrap();
//! assert_eq!(back, &req);
//! ```
#![forbid(unsafe_code)]

pub mod base64;
mod date_time;
mod diagnostic_info;
pub mod encoding;
mod extension_object;
pub mod generated;
mod guid;
mod node_id;
mod qualified_name;
#[cfg(any(test, feature = "sample"))]
pub mod sample;
mod status_code;
mod string;
mod variant;

pub use date_time::{DateTime, DateTimeParseError};
pub use diagnostic_info::DiagnosticInfo;
pub use encoding::{
    BinaryDecode, BinaryEncode, DecodeError, DecodeErrorKind, DecodeLimits, Limit, Reader,
};
pub use extension_object::decode::decode_message;
pub use extension_object::{encode_message, DynStructure, ExtensionObject, Structure};
pub use generated::attribute_ids::AttributeId;
pub use generated::ids;
pub use generated::types::*;
pub use guid::{Guid, GuidParseError};
pub use node_id::{ExpandedNodeId, Identifier, NodeId, NodeIdParseError};
pub use qualified_name::{LocalizedText, QualifiedName};
pub use status_code::{LimitBits, Severity, StatusCode};
pub use string::{ByteString, UaString, XmlElement};
pub use variant::{Array, ArrayValues, DataValue, DimensionMismatch, Variant, VariantType};
#[cfg(test)]
mod tests;
