//! Decoding an ExtensionObject body, or a service message, to its type by
//! the encoding id it carries, through the generated registry. Apart from
//! the type (`extension_object/mod.rs`), which the generated structures
//! name: this reads the registry of those structures.

use crate::encoding::{BinaryDecode, DecodeError, DecodeErrorKind, Limit, Reader};
use crate::extension_object::{DynStructure, ExtensionObject};
use crate::generated::registry;
use crate::node_id::NodeId;
use crate::string::{ByteString, XmlElement};

impl BinaryDecode for ExtensionObject {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let type_id = NodeId::decode(r).map_err(|e| e.in_field("type_id"))?;
        let mask = r.read_u8()?;
        match mask {
            0 => Ok(ExtensionObject::Empty(type_id)),
            1 => {
                let Some(len) = r.read_length(Limit::ByteStringLength)? else {
                    // A null body: keep it as sent.
                    return Ok(ExtensionObject::Opaque {
                        type_id,
                        body: ByteString::null(),
                    });
                };
                let mut sub = r.sub(len)?;
                if let Some(id) = type_id.as_ns0() {
                    sub.enter()?;
                    if let Some(v) = registry::decode_body(id, &mut sub) {
                        let v = v?;
                        sub.finish().map_err(|e| {
                            e.in_type(registry::name_of_encoding(id).unwrap_or("Structure"))
                        })?;
                        return Ok(ExtensionObject::Decoded(v));
                    }
                }
                Ok(ExtensionObject::Opaque {
                    type_id,
                    body: ByteString::new(sub_bytes(sub)),
                })
            }
            2 => Ok(ExtensionObject::Xml {
                type_id,
                body: XmlElement::decode(r).map_err(|e| e.in_field("body"))?,
            }),
            m => Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                what: "ExtensionObject encoding byte",
                value: m,
            })),
        }
    }
}

/// Every byte of a sub-reader that nothing has read yet.
fn sub_bytes(mut sub: Reader<'_>) -> Vec<u8> {
    let n = sub.remaining();
    sub.take(n).map(<[u8]>::to_vec).unwrap_or_default()
}

/// Decodes a service message: the NodeId of its binary encoding followed by
/// the body (Part 6 §7.1.2.4: the message body of a MSG chunk sequence).
pub fn decode_message(r: &mut Reader<'_>) -> Result<Box<dyn DynStructure>, DecodeError> {
    let id = NodeId::decode(r).map_err(|e| e.in_field("type_id"))?;
    let Some(n) = id.as_ns0() else {
        return Err(DecodeError::new(DecodeErrorKind::UnknownEncodingId(
            id.to_string(),
        )));
    };
    match registry::decode_body(n, r) {
        Some(v) => v,
        None => Err(DecodeError::new(DecodeErrorKind::UnknownEncodingId(
            id.to_string(),
        ))),
    }
}
