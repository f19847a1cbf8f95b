//! NodeId and ExpandedNodeId (Part 6 §5.2.2.9-10) with their text forms
//! (Part 6 §5.3.1.10-11): `i=85`, `ns=2;s=Demo`, `g=...`, `b=...`,
//! `svr=1;nsu=urn:x;s=Demo`.

use std::fmt;
use std::str::FromStr;

use crate::encoding::{BinaryDecode, BinaryEncode, DecodeError, DecodeErrorKind, Reader};
use crate::guid::Guid;
use crate::string::{ByteString, UaString};

/// The identifier part of a NodeId.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identifier {
    /// `i=` numeric
    Numeric(u32),
    /// `s=` string
    String(UaString),
    /// `g=` GUID
    Guid(Guid),
    /// `b=` opaque bytes (base64 in text)
    Opaque(ByteString),
}

/// A node's identity within a server: namespace index and identifier.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    /// Index into the server's NamespaceArray.
    pub namespace: u16,
    /// The identifier within that namespace.
    pub identifier: Identifier,
}

impl Default for NodeId {
    fn default() -> Self {
        NodeId::NULL
    }
}

impl NodeId {
    /// The null NodeId, `i=0`.
    pub const NULL: NodeId = NodeId::numeric(0, 0);

    /// A numeric NodeId.
    pub const fn numeric(namespace: u16, id: u32) -> Self {
        NodeId {
            namespace,
            identifier: Identifier::Numeric(id),
        }
    }

    /// A numeric NodeId in namespace 0.
    pub const fn ns0(id: u32) -> Self {
        NodeId::numeric(0, id)
    }

    /// A string NodeId.
    pub fn string(namespace: u16, s: impl Into<String>) -> Self {
        NodeId {
            namespace,
            identifier: Identifier::String(UaString::new(s)),
        }
    }

    /// A GUID NodeId.
    pub const fn guid(namespace: u16, g: Guid) -> Self {
        NodeId {
            namespace,
            identifier: Identifier::Guid(g),
        }
    }

    /// An opaque NodeId.
    pub fn opaque(namespace: u16, b: impl Into<Vec<u8>>) -> Self {
        NodeId {
            namespace,
            identifier: Identifier::Opaque(ByteString::new(b)),
        }
    }

    /// True for the null NodeId of every identifier type (Part 3 §8.2.4:
    /// namespace 0 and a zero / empty / null identifier).
    pub fn is_null(&self) -> bool {
        self.namespace == 0
            && match &self.identifier {
                Identifier::Numeric(n) => *n == 0,
                Identifier::String(s) => s.is_null_or_empty(),
                Identifier::Guid(g) => *g == Guid::NULL,
                Identifier::Opaque(b) => b.is_null_or_empty(),
            }
    }

    /// The numeric identifier when this is a namespace-0 numeric NodeId.
    pub fn as_ns0(&self) -> Option<u32> {
        match (self.namespace, &self.identifier) {
            (0, Identifier::Numeric(n)) => Some(*n),
            _ => None,
        }
    }

    fn encode_with_flags(&self, w: &mut Vec<u8>, flags: u8) {
        match &self.identifier {
            Identifier::Numeric(id) => {
                if self.namespace == 0 && *id <= 0xff {
                    w.extend_from_slice(&[flags, *id as u8]);
                } else if self.namespace <= 0xff && *id <= 0xffff {
                    w.extend_from_slice(&[flags | 1, self.namespace as u8]);
                    w.extend_from_slice(&(*id as u16).to_le_bytes());
                } else {
                    w.push(flags | 2);
                    self.namespace.encode(w);
                    id.encode(w);
                }
            }
            Identifier::String(s) => {
                w.push(flags | 3);
                self.namespace.encode(w);
                s.encode(w);
            }
            Identifier::Guid(g) => {
                w.push(flags | 4);
                self.namespace.encode(w);
                g.encode(w);
            }
            Identifier::Opaque(b) => {
                w.push(flags | 5);
                self.namespace.encode(w);
                b.encode(w);
            }
        }
    }

    /// Decodes the body after an encoding byte whose low 6 bits are `kind`.
    fn decode_kind(r: &mut Reader<'_>, byte: u8) -> Result<Self, DecodeError> {
        Ok(match byte & 0x3f {
            0 => NodeId::numeric(0, u32::from(r.read_u8()?)),
            1 => {
                let ns = r.read_u8()?;
                NodeId::numeric(u16::from(ns), u32::from(u16::decode(r)?))
            }
            2 => {
                let ns = u16::decode(r)?;
                NodeId::numeric(ns, u32::decode(r)?)
            }
            3 => NodeId {
                namespace: u16::decode(r)?,
                identifier: Identifier::String(UaString::decode(r)?),
            },
            4 => NodeId {
                namespace: u16::decode(r)?,
                identifier: Identifier::Guid(Guid::decode(r)?),
            },
            5 => NodeId {
                namespace: u16::decode(r)?,
                identifier: Identifier::Opaque(ByteString::decode(r)?),
            },
            _ => {
                return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                    what: "NodeId encoding byte",
                    value: byte,
                }))
            }
        })
    }
}

impl From<u32> for NodeId {
    /// A namespace-0 numeric NodeId.
    fn from(id: u32) -> Self {
        NodeId::ns0(id)
    }
}

impl BinaryEncode for NodeId {
    #[inline]
    fn encode(&self, w: &mut Vec<u8>) {
        self.encode_with_flags(w, 0);
    }
}

impl BinaryDecode for NodeId {
    #[inline]
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let byte = r.read_u8()?;
        if byte & 0xc0 != 0 {
            return Err(DecodeError::new(DecodeErrorKind::InvalidEncodingByte {
                what: "NodeId encoding byte",
                value: byte,
            }));
        }
        NodeId::decode_kind(r, byte)
    }
}

/// A NodeId that may name its namespace by URI and live on another server.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpandedNodeId {
    /// The NodeId; its namespace index is meaningless when
    /// `namespace_uri` is set.
    pub node_id: NodeId,
    /// The namespace URI, null when the index applies.
    pub namespace_uri: UaString,
    /// Index into the ServerArray; 0 is the local server.
    pub server_index: u32,
}

impl ExpandedNodeId {
    /// A local ExpandedNodeId (no URI, server 0).
    pub const fn local(node_id: NodeId) -> Self {
        ExpandedNodeId {
            node_id,
            namespace_uri: UaString::null(),
            server_index: 0,
        }
    }

    /// True when this names a node of the local server by namespace index.
    pub fn is_local(&self) -> bool {
        self.namespace_uri.is_null() && self.server_index == 0
    }

    /// True for a null NodeId without URI or server index.
    pub fn is_null(&self) -> bool {
        self.is_local() && self.node_id.is_null()
    }
}

impl From<NodeId> for ExpandedNodeId {
    fn from(n: NodeId) -> Self {
        ExpandedNodeId::local(n)
    }
}

impl BinaryEncode for ExpandedNodeId {
    fn encode(&self, w: &mut Vec<u8>) {
        let mut flags = 0;
        if !self.namespace_uri.is_null() {
            flags |= 0x80;
        }
        if self.server_index != 0 {
            flags |= 0x40;
        }
        self.node_id.encode_with_flags(w, flags);
        if flags & 0x80 != 0 {
            self.namespace_uri.encode(w);
        }
        if flags & 0x40 != 0 {
            self.server_index.encode(w);
        }
    }
}

impl BinaryDecode for ExpandedNodeId {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let byte = r.read_u8()?;
        let node_id = NodeId::decode_kind(r, byte)?;
        let namespace_uri = if byte & 0x80 != 0 {
            UaString::decode(r).map_err(|e| e.in_field("namespace_uri"))?
        } else {
            UaString::null()
        };
        let server_index = if byte & 0x40 != 0 {
            u32::decode(r).map_err(|e| e.in_field("server_index"))?
        } else {
            0
        };
        Ok(ExpandedNodeId {
            node_id,
            namespace_uri,
            server_index,
        })
    }
}

/// Why a NodeId or ExpandedNodeId text did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeIdParseError {
    /// The text was empty.
    Empty,
    /// `ns=` was not followed by a number 0..=65535 and `;`.
    InvalidNamespaceIndex(String),
    /// `svr=` was not followed by a number and `;`.
    InvalidServerIndex(String),
    /// The identifier did not start with `i=`, `s=`, `g=` or `b=`.
    InvalidIdentifierType(String),
    /// `i=` was not followed by a number 0..=4294967295.
    InvalidNumeric(String),
    /// `g=` was not followed by a GUID.
    InvalidGuid(String),
    /// `b=` was not followed by base64.
    InvalidBase64(String),
    /// `nsu=` or `svr=` in a plain NodeId (only ExpandedNodeIds carry them).
    ExpandedPartInNodeId,
}

impl fmt::Display for NodeIdParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeIdParseError::Empty => {
                f.write_str("empty NodeId; expected e.g. i=85 or ns=2;s=Demo")
            }
            NodeIdParseError::InvalidNamespaceIndex(s) => {
                write!(f, "invalid namespace index {s:?}: expected ns=<0..65535>;")
            }
            NodeIdParseError::InvalidServerIndex(s) => {
                write!(f, "invalid server index {s:?}: expected svr=<number>;")
            }
            NodeIdParseError::InvalidIdentifierType(s) => write!(
                f,
                "invalid identifier {s:?}: expected i=<number>, s=<text>, g=<guid> or b=<base64>"
            ),
            NodeIdParseError::InvalidNumeric(s) => {
                write!(
                    f,
                    "invalid numeric identifier {s:?}: expected i=<0..4294967295>"
                )
            }
            NodeIdParseError::InvalidGuid(s) => write!(
                f,
                "invalid GUID identifier {s:?}: expected g=XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX"
            ),
            NodeIdParseError::InvalidBase64(s) => {
                write!(f, "invalid opaque identifier {s:?}: expected b=<base64>")
            }
            NodeIdParseError::ExpandedPartInNodeId => {
                f.write_str("nsu= and svr= belong to an ExpandedNodeId; a NodeId takes ns=<index>")
            }
        }
    }
}

impl std::error::Error for NodeIdParseError {}

fn parse_identifier(s: &str) -> Result<Identifier, NodeIdParseError> {
    let (kind, value) = match s.split_once('=') {
        Some((k, v)) if k.len() == 1 => (k, v),
        _ => return Err(NodeIdParseError::InvalidIdentifierType(s.to_owned())),
    };
    match kind {
        "i" => value
            .parse::<u32>()
            .ok()
            .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
            .map(Identifier::Numeric)
            .ok_or_else(|| NodeIdParseError::InvalidNumeric(value.to_owned())),
        "s" => Ok(Identifier::String(UaString::new(value))),
        "g" => value
            .parse::<Guid>()
            .map(Identifier::Guid)
            .map_err(|_| NodeIdParseError::InvalidGuid(value.to_owned())),
        "b" => crate::base64::decode(value)
            .map(|b| Identifier::Opaque(ByteString::new(b)))
            .ok_or_else(|| NodeIdParseError::InvalidBase64(value.to_owned())),
        _ => Err(NodeIdParseError::InvalidIdentifierType(s.to_owned())),
    }
}

/// Splits `prefix=value;rest` when `s` starts with `prefix=`.
fn take_prefixed<'a>(s: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let rest = s.strip_prefix(prefix)?.strip_prefix('=')?;
    Some(rest.split_once(';').unwrap_or((rest, "")))
}

fn parse_ns(s: &str) -> Result<(u16, &str), NodeIdParseError> {
    match take_prefixed(s, "ns") {
        Some((idx, rest)) => {
            let ns = idx
                .parse::<u16>()
                .ok()
                .filter(|_| idx.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| NodeIdParseError::InvalidNamespaceIndex(idx.to_owned()))?;
            Ok((ns, rest))
        }
        None => Ok((0, s)),
    }
}

impl FromStr for NodeId {
    type Err = NodeIdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(NodeIdParseError::Empty);
        }
        if s.starts_with("nsu=") || s.starts_with("svr=") {
            return Err(NodeIdParseError::ExpandedPartInNodeId);
        }
        let (namespace, rest) = parse_ns(s)?;
        Ok(NodeId {
            namespace,
            identifier: parse_identifier(rest)?,
        })
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identifier::Numeric(n) => write!(f, "i={n}"),
            Identifier::String(s) => write!(f, "s={s}"),
            Identifier::Guid(g) => write!(f, "g={g}"),
            Identifier::Opaque(b) => {
                write!(f, "b={}", crate::base64::encode(b.as_bytes_or_empty()))
            }
        }
    }
}

impl fmt::Debug for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace != 0 {
            write!(f, "ns={};", self.namespace)?;
        }
        write!(f, "{}", self.identifier)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({self})")
    }
}

/// Escapes `%` and `;` in a namespace URI (Part 6 §5.3.1.11).
fn escape_uri(uri: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for c in uri.chars() {
        match c {
            '%' => f.write_str("%25")?,
            ';' => f.write_str("%3B")?,
            c => fmt::Write::write_char(f, c)?,
        }
    }
    Ok(())
}

fn unescape_uri(s: &str) -> String {
    s.replace("%3B", ";")
        .replace("%3b", ";")
        .replace("%25", "%")
}

impl FromStr for ExpandedNodeId {
    type Err = NodeIdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut s = s.trim();
        if s.is_empty() {
            return Err(NodeIdParseError::Empty);
        }
        let mut server_index = 0;
        if let Some((idx, rest)) = take_prefixed(s, "svr") {
            server_index = idx
                .parse::<u32>()
                .ok()
                .filter(|_| idx.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| NodeIdParseError::InvalidServerIndex(idx.to_owned()))?;
            s = rest;
        }
        let (namespace_uri, namespace, rest) = if let Some((uri, rest)) = take_prefixed(s, "nsu") {
            (UaString::new(unescape_uri(uri)), 0, rest)
        } else {
            let (ns, rest) = parse_ns(s)?;
            (UaString::null(), ns, rest)
        };
        Ok(ExpandedNodeId {
            node_id: NodeId {
                namespace,
                identifier: parse_identifier(rest)?,
            },
            namespace_uri,
            server_index,
        })
    }
}

impl fmt::Display for ExpandedNodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.server_index != 0 {
            write!(f, "svr={};", self.server_index)?;
        }
        match self.namespace_uri.as_str() {
            Some(uri) => {
                f.write_str("nsu=")?;
                escape_uri(uri, f)?;
                write!(f, ";{}", self.node_id.identifier)
            }
            None => write!(f, "{}", self.node_id),
        }
    }
}

impl fmt::Debug for ExpandedNodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExpandedNodeId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DecodeLimits;

    fn rt<T: BinaryEncode + BinaryDecode + PartialEq + fmt::Debug>(v: &T, bytes: &[u8]) {
        assert_eq!(v.to_bytes(), bytes, "{v:?}");
        assert_eq!(&T::from_bytes(bytes, &DecodeLimits::default()).unwrap(), v);
    }

    #[test]
    fn every_binary_form() {
        rt(&NodeId::ns0(72), &[0x00, 0x48]);
        rt(&NodeId::numeric(5, 1025), &[0x01, 0x05, 0x01, 0x04]);
        rt(
            &NodeId::numeric(0, 70_000),
            &[0x02, 0, 0, 0x70, 0x11, 0x01, 0x00],
        );
        rt(&NodeId::numeric(300, 1), &[0x02, 0x2c, 0x01, 1, 0, 0, 0]);
        rt(
            &NodeId::string(1, "Hot水"),
            &[
                0x03, 0x01, 0x00, 0x06, 0, 0, 0, b'H', b'o', b't', 0xe6, 0xb0, 0xb4,
            ],
        );
        let g: Guid = "09087E75-8E5E-499B-954F-F2A9603DB28A".parse().unwrap();
        rt(
            &NodeId::guid(1, g),
            &[
                0x04, 0x01, 0x00, 0x75, 0x7e, 0x08, 0x09, 0x5e, 0x8e, 0x9b, 0x49, 0x95, 0x4f, 0xf2,
                0xa9, 0x60, 0x3d, 0xb2, 0x8a,
            ],
        );
        rt(
            &NodeId::opaque(2, vec![1, 2]),
            &[0x05, 0x02, 0x00, 2, 0, 0, 0, 1, 2],
        );
    }

    #[test]
    fn expanded_flags() {
        let e = ExpandedNodeId {
            node_id: NodeId::ns0(1),
            namespace_uri: UaString::new("u"),
            server_index: 2,
        };
        rt(&e, &[0xc0, 0x01, 1, 0, 0, 0, b'u', 2, 0, 0, 0]);
        rt(&ExpandedNodeId::local(NodeId::ns0(85)), &[0x00, 85]);
        // Flags are not allowed in a plain NodeId.
        let err = NodeId::from_bytes(&[0x80, 1], &DecodeLimits::default()).unwrap_err();
        assert!(matches!(
            err.kind(),
            DecodeErrorKind::InvalidEncodingByte { value: 0x80, .. }
        ));
        let err = NodeId::from_bytes(&[0x06, 1], &DecodeLimits::default()).unwrap_err();
        assert!(matches!(
            err.kind(),
            DecodeErrorKind::InvalidEncodingByte { value: 0x06, .. }
        ));
    }

    #[test]
    fn text_forms() {
        let cases = [
            "i=85",
            "ns=2;s=Demo.Static.Scalar.Double",
            "ns=1;g=09087E75-8E5E-499B-954F-F2A9603DB28A",
            "ns=3;b=AQID",
            "s=with;semicolon",
            "s=",
        ];
        for c in cases {
            let n: NodeId = c.parse().unwrap();
            assert_eq!(n.to_string(), c);
        }
        assert_eq!(
            "ns=2;s=Demo".parse::<NodeId>().unwrap(),
            NodeId::string(2, "Demo")
        );
        assert_eq!(
            "ns=1;g=09087e75-8e5e-499b-954f-f2a9603db28a"
                .parse::<NodeId>()
                .unwrap()
                .to_string(),
            "ns=1;g=09087E75-8E5E-499B-954F-F2A9603DB28A"
        );
        let e: ExpandedNodeId = "svr=1;nsu=urn:x%3By;s=Demo".parse().unwrap();
        assert_eq!(e.namespace_uri, "urn:x;y");
        assert_eq!(e.server_index, 1);
        assert_eq!(e.to_string(), "svr=1;nsu=urn:x%3By;s=Demo");
        assert_eq!(
            "ns=4;i=5".parse::<ExpandedNodeId>().unwrap().node_id,
            NodeId::numeric(4, 5)
        );
    }

    #[test]
    fn text_errors_say_what_is_wrong() {
        use NodeIdParseError::*;
        let cases: [(&str, NodeIdParseError); 9] = [
            ("", Empty),
            ("ns=x;i=1", InvalidNamespaceIndex("x".into())),
            ("ns=70000;i=1", InvalidNamespaceIndex("70000".into())),
            ("ns=2;q=1", InvalidIdentifierType("q=1".into())),
            ("85", InvalidIdentifierType("85".into())),
            ("i=-1", InvalidNumeric("-1".into())),
            ("g=1234", InvalidGuid("1234".into())),
            ("b=!!", InvalidBase64("!!".into())),
            ("nsu=urn:x;i=1", ExpandedPartInNodeId),
        ];
        for (text, err) in cases {
            assert_eq!(text.parse::<NodeId>(), Err(err), "{text}");
        }
        assert_eq!(
            "svr=x;i=1".parse::<ExpandedNodeId>(),
            Err(InvalidServerIndex("x".into()))
        );
        assert!(InvalidNumeric("-1".into())
            .to_string()
            .contains("i=<0..4294967295>"));
    }

    #[test]
    fn null_node_ids() {
        assert!(NodeId::NULL.is_null());
        assert!(NodeId::string(0, "").is_null());
        assert!(!NodeId::string(1, "").is_null());
        assert!(!NodeId::ns0(1).is_null());
    }
}
