//! ExtensionObject (Part 6 §5.2.2.15): a structure carried with the NodeId of
//! its encoding.
//!
//! Bodies whose binary encoding id is a namespace-0 structure decode to the
//! typed value (through the generated registry, in `decode.rs`); unknown ids
//! are kept as opaque bytes and re-encoded unchanged.

pub(crate) mod decode;

use std::any::Any;
use std::fmt;

use crate::encoding::{write_length, BinaryDecode, BinaryEncode};
use crate::node_id::NodeId;
use crate::string::{ByteString, XmlElement};

/// A structured DataType with a binary encoding: every generated structure.
pub trait Structure:
    BinaryEncode + BinaryDecode + Clone + PartialEq + fmt::Debug + Send + Sync + 'static
{
    /// The BrowseName of the DataType, e.g. `ReadRequest`.
    const NAME: &'static str;
    /// The namespace-0 NodeId of the DataType.
    const DATA_TYPE_ID: u32;
    /// The namespace-0 NodeId of its `Default Binary` encoding.
    const BINARY_ENCODING_ID: u32;
}

/// A structure value behind a pointer, whatever its type.
pub trait DynStructure: Any + Send + Sync + fmt::Debug {
    /// The DataType's name.
    fn type_name(&self) -> &str;
    /// The NodeId of its binary encoding (what an ExtensionObject carries).
    fn binary_encoding_id(&self) -> NodeId;
    /// Appends the body (without the encoding id or a length).
    fn encode_body(&self, w: &mut Vec<u8>);
    /// A boxed copy.
    fn clone_box(&self) -> Box<dyn DynStructure>;
    /// Equality with a value of any type.
    fn dyn_eq(&self, other: &dyn DynStructure) -> bool;
    /// For downcasting.
    fn as_any(&self) -> &dyn Any;
    /// For downcasting by value.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Structure> DynStructure for T {
    fn type_name(&self) -> &str {
        T::NAME
    }
    fn binary_encoding_id(&self) -> NodeId {
        NodeId::ns0(T::BINARY_ENCODING_ID)
    }
    fn encode_body(&self, w: &mut Vec<u8>) {
        self.encode(w)
    }
    fn clone_box(&self) -> Box<dyn DynStructure> {
        Box::new(self.clone())
    }
    fn dyn_eq(&self, other: &dyn DynStructure) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl Clone for Box<dyn DynStructure> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

impl PartialEq for Box<dyn DynStructure> {
    fn eq(&self, other: &Self) -> bool {
        self.dyn_eq(other.as_ref())
    }
}

/// An ExtensionObject.
#[derive(Clone, PartialEq)]
pub enum ExtensionObject {
    /// No body (encoding byte 0x00); the type id is usually null.
    Empty(NodeId),
    /// A binary body of a type we do not know: kept as it came.
    Opaque {
        /// The encoding id.
        type_id: NodeId,
        /// The body bytes.
        body: ByteString,
    },
    /// An XML body (encoding byte 0x02).
    Xml {
        /// The encoding id.
        type_id: NodeId,
        /// The body.
        body: XmlElement,
    },
    /// A binary body decoded to its type.
    Decoded(Box<dyn DynStructure>),
}

impl Default for ExtensionObject {
    fn default() -> Self {
        ExtensionObject::Empty(NodeId::NULL)
    }
}

impl fmt::Debug for ExtensionObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtensionObject::Empty(id) if id.is_null() => f.write_str("ExtensionObject(null)"),
            ExtensionObject::Empty(id) => write!(f, "ExtensionObject({id}, no body)"),
            ExtensionObject::Opaque { type_id, body } => {
                write!(f, "ExtensionObject({type_id}, {body:?})")
            }
            ExtensionObject::Xml { type_id, body } => {
                write!(f, "ExtensionObject({type_id}, {body:?})")
            }
            ExtensionObject::Decoded(v) => fmt::Debug::fmt(v, f),
        }
    }
}

impl ExtensionObject {
    /// The null ExtensionObject (null type id, no body).
    pub const fn null() -> Self {
        ExtensionObject::Empty(NodeId::NULL)
    }

    /// Wraps a typed structure.
    pub fn new<T: DynStructure>(value: T) -> Self {
        ExtensionObject::Decoded(Box::new(value))
    }

    /// True for the null ExtensionObject.
    pub fn is_null(&self) -> bool {
        matches!(self, ExtensionObject::Empty(id) if id.is_null())
    }

    /// The encoding id carried on the wire.
    pub fn type_id(&self) -> NodeId {
        match self {
            ExtensionObject::Empty(id) => id.clone(),
            ExtensionObject::Opaque { type_id, .. } | ExtensionObject::Xml { type_id, .. } => {
                type_id.clone()
            }
            ExtensionObject::Decoded(v) => v.binary_encoding_id(),
        }
    }

    /// The decoded value if it is a `T`.
    pub fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        match self {
            ExtensionObject::Decoded(v) => v.as_any().downcast_ref(),
            _ => None,
        }
    }

    /// The decoded value if it is a `T`, else `self` back.
    pub fn downcast<T: 'static>(self) -> Result<T, Self> {
        match self {
            ExtensionObject::Decoded(v) if v.as_any().is::<T>() => match v.into_any().downcast() {
                Ok(t) => Ok(*t),
                // `is::<T>()` was checked just above.
                Err(_) => Err(ExtensionObject::null()),
            },
            other => Err(other),
        }
    }
}

impl BinaryEncode for ExtensionObject {
    fn encode(&self, w: &mut Vec<u8>) {
        match self {
            ExtensionObject::Empty(id) => {
                id.encode(w);
                w.push(0);
            }
            ExtensionObject::Opaque { type_id, body } => {
                type_id.encode(w);
                w.push(1);
                body.encode(w);
            }
            ExtensionObject::Xml { type_id, body } => {
                type_id.encode(w);
                w.push(2);
                body.encode(w);
            }
            ExtensionObject::Decoded(v) => {
                v.binary_encoding_id().encode(w);
                w.push(1);
                let at = w.len();
                w.extend_from_slice(&[0; 4]);
                v.encode_body(w);
                let len = w.len() - at - 4;
                let mut tmp = Vec::with_capacity(4);
                write_length(&mut tmp, Some(len));
                w[at..at + 4].copy_from_slice(&tmp);
            }
        }
    }
}

/// Encodes a service message: its binary encoding id, then the body.
pub fn encode_message(msg: &dyn DynStructure, w: &mut Vec<u8>) {
    msg.binary_encoding_id().encode(w);
    msg.encode_body(w);
}
