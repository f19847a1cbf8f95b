//! Namespace 0 from `Opc.Ua.NodeSet2.Services.xml` (the superset of
//! `Opc.Ua.NodeSet2.xml` that also carries the service DataTypes), compiled
//! into a compact binary table that the server embeds with `include_bytes!`
//! and decodes at start: no XML at run time.
//!
//! Table format (every field in the OPC UA binary encoding):
//!
//! ```text
//! "UASNS0" u8:version(2)  u32:node count
//! per node:
//!   u8 node class (NodeClass value)  NodeId  QualifiedName browse name
//!   LocalizedText display name  LocalizedText description  u32 write mask
//!   u8 flags (1 IsAbstract, 2 Symmetric, 4 Historizing, 8 Executable, 16 ContainsNoLoops)
//!   u8 event notifier  LocalizedText inverse name
//!   Variant value  NodeId data type  i32 value rank  UInt32[] array dimensions
//!   u8 access level  f64 minimum sampling interval
//!   u32 reference count, per reference: NodeId type, Boolean forward, NodeId target
//!   Variant DataTypeDefinition (version 2; Empty unless a DataType with a
//!     <Definition>: a StructureDefinition or EnumDefinition ExtensionObject)
//! ```
//!
//! Values are converted from their XML encoding generically, walking the
//! structure's fields from Opc.Ua.Types.bsd, so every ExtensionObject value
//! (Argument, EnumValueType, EUInformation...) becomes its binary encoding.

use std::collections::HashMap;

use uascale_types::{
    Array, ArrayValues, BinaryEncode, ByteString, DateTime, ExtensionObject, Guid, LocalizedText,
    NodeId, QualifiedName, StatusCode, UaString, Variant,
};

use crate::bsd::{Dictionary, FieldType, StructKind};

const NODESET_NS: &str = "http://opcfoundation.org/UA/2011/03/UANodeSet.xsd";

type Node<'a, 'i> = roxmltree::Node<'a, 'i>;

struct Ctx<'d> {
    aliases: HashMap<String, NodeId>,
    dict: &'d Dictionary,
    /// XML encoding id → (struct name, binary encoding id)
    xml_encodings: HashMap<u32, (String, u32)>,
}

fn child<'a, 'i>(n: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

fn text<'a>(n: Node<'a, '_>) -> &'a str {
    n.text().map(str::trim).unwrap_or("")
}

impl Ctx<'_> {
    fn node_id(&self, s: &str, what: &str) -> Result<NodeId, String> {
        if let Some(n) = self.aliases.get(s) {
            return Ok(n.clone());
        }
        s.parse::<NodeId>()
            .map_err(|e| format!("{what}: {s:?}: {e}"))
    }
}

fn localized(n: Option<Node<'_, '_>>) -> LocalizedText {
    match n {
        None => LocalizedText::default(),
        Some(n) => LocalizedText {
            locale: n
                .attribute("Locale")
                .map_or(UaString::null(), UaString::from),
            text: UaString::from(text(n)),
        },
    }
}

fn qualified(s: &str) -> QualifiedName {
    match s.split_once(':') {
        Some((ns, name)) if ns.bytes().all(|b| b.is_ascii_digit()) && !ns.is_empty() => {
            QualifiedName::new(ns.parse().unwrap_or(0), name)
        }
        _ => QualifiedName::new(0, s),
    }
}

fn parse_num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{what}: {s:?} is not a number"))
}

/// One XML-encoded built-in value (Types.xsd element of that type).
fn builtin_scalar(ctx: &Ctx<'_>, ty: &str, n: Node<'_, '_>, what: &str) -> Result<Variant, String> {
    let t = text(n);
    Ok(match ty {
        "Boolean" => Variant::Boolean(t == "true" || t == "1"),
        "SByte" => Variant::SByte(parse_num(t, what)?),
        "Byte" => Variant::Byte(parse_num(t, what)?),
        "Int16" => Variant::Int16(parse_num(t, what)?),
        "UInt16" => Variant::UInt16(parse_num(t, what)?),
        "Int32" => Variant::Int32(parse_num(t, what)?),
        "UInt32" => Variant::UInt32(parse_num(t, what)?),
        "Int64" => Variant::Int64(parse_num(t, what)?),
        "UInt64" => Variant::UInt64(parse_num(t, what)?),
        "Float" => Variant::Float(parse_num(t, what)?),
        "Double" => Variant::Double(parse_num(t, what)?),
        "String" => Variant::String(UaString::from(n.text().unwrap_or(""))),
        "DateTime" => Variant::DateTime(
            DateTime::parse_rfc3339(t).ok_or_else(|| format!("{what}: bad DateTime {t:?}"))?,
        ),
        "Guid" => {
            let s = child(n, "String").map_or(t, text);
            Variant::Guid(s.parse::<Guid>().map_err(|e| format!("{what}: {e}"))?)
        }
        "ByteString" => {
            let b64: String = t.chars().filter(|c| !c.is_whitespace()).collect();
            Variant::ByteString(ByteString::new(
                uascale_types::base64::decode(&b64).ok_or_else(|| format!("{what}: bad base64"))?,
            ))
        }
        "LocalizedText" => Variant::from(LocalizedText {
            locale: child(n, "Locale").map_or(UaString::null(), |l| UaString::from(text(l))),
            text: child(n, "Text")
                .map_or(UaString::null(), |l| UaString::from(l.text().unwrap_or(""))),
        }),
        "QualifiedName" => Variant::from(QualifiedName {
            namespace_index: child(n, "NamespaceIndex")
                .map_or(Ok(0), |x| parse_num(text(x), what))?,
            name: child(n, "Name").map_or(UaString::null(), |x| UaString::from(text(x))),
        }),
        "NodeId" => Variant::from(ctx.node_id(child(n, "Identifier").map_or("i=0", text), what)?),
        "StatusCode" => Variant::StatusCode(StatusCode(
            child(n, "Code").map_or(Ok(0), |x| parse_num(text(x), what))?,
        )),
        "ExtensionObject" => Variant::from(extension_object(ctx, n, what)?),
        other => {
            return Err(format!(
                "{what}: XML value of type {other} is not supported"
            ))
        }
    })
}

fn array_of(values: Vec<Variant>, ty: &str, what: &str) -> Result<Variant, String> {
    macro_rules! collect {
        ($variant:ident, $pat:ident) => {
            ArrayValues::$variant(
                values
                    .into_iter()
                    .map(|v| match v {
                        Variant::$pat(x) => Ok(x),
                        other => Err(format!("{what}: mixed array element {other:?}")),
                    })
                    .collect::<Result<Vec<_>, String>>()?,
            )
        };
    }
    macro_rules! collect_boxed {
        ($variant:ident) => {
            ArrayValues::$variant(
                values
                    .into_iter()
                    .map(|v| match v {
                        Variant::$variant(x) => Ok(*x),
                        other => Err(format!("{what}: mixed array element {other:?}")),
                    })
                    .collect::<Result<Vec<_>, String>>()?,
            )
        };
    }
    let a = match ty {
        "Boolean" => collect!(Boolean, Boolean),
        "SByte" => collect!(SByte, SByte),
        "Byte" => collect!(Byte, Byte),
        "Int16" => collect!(Int16, Int16),
        "UInt16" => collect!(UInt16, UInt16),
        "Int32" => collect!(Int32, Int32),
        "UInt32" => collect!(UInt32, UInt32),
        "Int64" => collect!(Int64, Int64),
        "UInt64" => collect!(UInt64, UInt64),
        "Float" => collect!(Float, Float),
        "Double" => collect!(Double, Double),
        "String" => collect!(String, String),
        "DateTime" => collect!(DateTime, DateTime),
        "Guid" => collect!(Guid, Guid),
        "ByteString" => collect!(ByteString, ByteString),
        "StatusCode" => collect!(StatusCode, StatusCode),
        "LocalizedText" => collect_boxed!(LocalizedText),
        "QualifiedName" => collect_boxed!(QualifiedName),
        "NodeId" => collect_boxed!(NodeId),
        "ExtensionObject" => collect_boxed!(ExtensionObject),
        other => return Err(format!("{what}: XML array of {other} is not supported")),
    };
    Ok(Variant::from(Array::new(a)))
}

/// A `<Value>` element's content.
fn value(ctx: &Ctx<'_>, v: Node<'_, '_>, what: &str) -> Result<Variant, String> {
    let Some(e) = v.children().find(|c| c.is_element()) else {
        return Ok(Variant::Empty);
    };
    let name = e.tag_name().name();
    match name.strip_prefix("ListOf") {
        Some(ty) => {
            let items = e
                .children()
                .filter(|c| c.is_element())
                .map(|c| builtin_scalar(ctx, ty, c, what))
                .collect::<Result<Vec<_>, _>>()?;
            array_of(items, ty, what)
        }
        None => builtin_scalar(ctx, name, e, what),
    }
}

fn extension_object(ctx: &Ctx<'_>, n: Node<'_, '_>, what: &str) -> Result<ExtensionObject, String> {
    let type_id = child(n, "TypeId")
        .and_then(|t| child(t, "Identifier"))
        .map(text)
        .ok_or_else(|| format!("{what}: ExtensionObject without TypeId"))?;
    let id = ctx
        .node_id(type_id, what)?
        .as_ns0()
        .ok_or_else(|| format!("{what}: ExtensionObject TypeId {type_id} outside namespace 0"))?;
    let Some(body) = child(n, "Body").and_then(|b| b.children().find(|c| c.is_element())) else {
        return Ok(ExtensionObject::null());
    };
    let (name, binary_id) = ctx
        .xml_encodings
        .get(&id)
        .ok_or_else(|| format!("{what}: no structure has XML encoding i={id}"))?;
    let mut bytes = Vec::new();
    structure(ctx, name, Some(body), &mut bytes, what)?;
    Ok(ExtensionObject::Opaque {
        type_id: NodeId::ns0(*binary_id),
        body: ByteString::new(bytes),
    })
}

/// Binary-encodes structure `name` from its XML element (`None`: every
/// field at its default).
fn structure(
    ctx: &Ctx<'_>,
    name: &str,
    xml: Option<Node<'_, '_>>,
    out: &mut Vec<u8>,
    what: &str,
) -> Result<(), String> {
    let s = ctx
        .dict
        .structs
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| format!("{what}: unknown structure {name}"))?;
    if s.kind != StructKind::Plain {
        return Err(format!(
            "{what}: XML values of {name} ({:?}) are not supported",
            s.kind
        ));
    }
    for f in &s.fields {
        let fx = xml.and_then(|x| child(x, &f.name));
        let what = format!("{what}: {name}.{}", f.name);
        if f.array {
            match fx {
                None => (-1i32).encode(out),
                Some(list) => {
                    let items: Vec<Node<'_, '_>> =
                        list.children().filter(|c| c.is_element()).collect();
                    i32::try_from(items.len()).unwrap_or(i32::MAX).encode(out);
                    for item in items {
                        field(ctx, &f.ty, Some(item), out, &what)?;
                    }
                }
            }
        } else {
            field(ctx, &f.ty, fx, out, &what)?;
        }
    }
    Ok(())
}

fn field(
    ctx: &Ctx<'_>,
    ty: &FieldType,
    xml: Option<Node<'_, '_>>,
    out: &mut Vec<u8>,
    what: &str,
) -> Result<(), String> {
    match ty {
        FieldType::Named(n) => {
            if let Some(e) = ctx.dict.enums.iter().find(|e| e.name == *n) {
                // XML enums read `Name_5`; the number is what goes on the wire.
                let v: i64 = match xml.map(text) {
                    None | Some("") => 0,
                    Some(t) => parse_num(t.rsplit('_').next().unwrap_or(t), what)?,
                };
                match (e.option_set, e.bits) {
                    (true, 16) => (v as u16).encode(out),
                    (true, 8) => (v as u8).encode(out),
                    (true, 64) => (v as u64).encode(out),
                    (true, _) => (v as u32).encode(out),
                    (false, _) => (v as i32).encode(out),
                }
                return Ok(());
            }
            structure(ctx, n, xml, out, what)
        }
        FieldType::Builtin(rust) => {
            let uaname = match *rust {
                "bool" => "Boolean",
                "i8" => "SByte",
                "u8" => "Byte",
                "i16" => "Int16",
                "u16" => "UInt16",
                "i32" => "Int32",
                "u32" => "UInt32",
                "i64" => "Int64",
                "u64" => "UInt64",
                "f32" => "Float",
                "f64" => "Double",
                "UaString" => "String",
                other => other,
            };
            let v = match xml {
                Some(x) => builtin_scalar(ctx, uaname, x, what)?,
                None => default_of(uaname, what)?,
            };
            encode_plain(&v, out, what)
        }
    }
}

fn default_of(ty: &str, what: &str) -> Result<Variant, String> {
    Ok(match ty {
        "Boolean" => Variant::Boolean(false),
        "SByte" => Variant::SByte(0),
        "Byte" => Variant::Byte(0),
        "Int16" => Variant::Int16(0),
        "UInt16" => Variant::UInt16(0),
        "Int32" => Variant::Int32(0),
        "UInt32" => Variant::UInt32(0),
        "Int64" => Variant::Int64(0),
        "UInt64" => Variant::UInt64(0),
        "Float" => Variant::Float(0.0),
        "Double" => Variant::Double(0.0),
        "String" => Variant::String(UaString::null()),
        "DateTime" => Variant::DateTime(DateTime::MIN),
        "Guid" => Variant::Guid(Guid::NULL),
        "ByteString" => Variant::ByteString(ByteString::null()),
        "LocalizedText" => Variant::from(LocalizedText::default()),
        "QualifiedName" => Variant::from(QualifiedName::default()),
        "NodeId" => Variant::from(NodeId::NULL),
        "StatusCode" => Variant::StatusCode(StatusCode::Good),
        "ExtensionObject" => Variant::from(ExtensionObject::null()),
        other => return Err(format!("{what}: no default for {other}")),
    })
}

/// The value's own encoding, without the Variant's type byte.
fn encode_plain(v: &Variant, out: &mut Vec<u8>, what: &str) -> Result<(), String> {
    let mut tmp = Vec::new();
    v.encode(&mut tmp);
    match tmp.split_first() {
        Some((_, rest)) if !v.is_array() && !v.is_empty() => {
            out.extend_from_slice(rest);
            Ok(())
        }
        _ => Err(format!("{what}: cannot encode {v:?} as a field")),
    }
}

const NODE_CLASSES: &[(&str, u8)] = &[
    ("UAObject", 1),
    ("UAVariable", 2),
    ("UAMethod", 4),
    ("UAObjectType", 8),
    ("UAVariableType", 16),
    ("UAReferenceType", 32),
    ("UADataType", 64),
    ("UAView", 128),
];

/// Compiles a NodeSet2 document into the table format above.
pub fn compile(
    xml: &str,
    file: &str,
    dict: &Dictionary,
    node_ids: &[(String, u32, String)],
) -> Result<Vec<u8>, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("{file}: {e}"))?;
    let root = doc.root_element();
    let mut aliases = HashMap::new();
    if let Some(a) = root.children().find(|c| c.tag_name().name() == "Aliases") {
        for al in a.children().filter(|c| c.is_element()) {
            let name = al.attribute("Alias").unwrap_or("");
            let id = text(al)
                .parse::<NodeId>()
                .map_err(|e| format!("{file}: alias {name}: {e}"))?;
            aliases.insert(name.to_owned(), id);
        }
    }
    let by_name: HashMap<&str, u32> = node_ids
        .iter()
        .map(|(n, id, _)| (n.as_str(), *id))
        .collect();
    let mut xml_encodings = HashMap::new();
    for s in &dict.structs {
        if let (Some(x), Some(b)) = (
            by_name.get(format!("{}_Encoding_DefaultXml", s.name).as_str()),
            by_name.get(format!("{}_Encoding_DefaultBinary", s.name).as_str()),
        ) {
            xml_encodings.insert(*x, (s.name.clone(), *b));
        }
    }
    let ctx = Ctx {
        aliases,
        dict,
        xml_encodings,
    };
    let types = TypeInfo::collect(&ctx, root)?;
    let mut out = Vec::with_capacity(1 << 20);
    out.extend_from_slice(b"UASNS0\x02");
    let count_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut count = 0u32;
    for n in root
        .children()
        .filter(|c| c.is_element() && c.tag_name().namespace() == Some(NODESET_NS))
    {
        let Some(&(_, class)) = NODE_CLASSES.iter().find(|(t, _)| *t == n.tag_name().name()) else {
            continue;
        };
        let id_text = n.attribute("NodeId").unwrap_or("");
        let what = format!("{file}: node {id_text}");
        let node_id = ctx.node_id(id_text, &what)?;
        let attr = |name: &str| n.attribute(name);
        let flag = |name: &str, default: bool| attr(name).map_or(default, |v| v == "true");
        class.encode(&mut out);
        node_id.encode(&mut out);
        qualified(attr("BrowseName").unwrap_or("")).encode(&mut out);
        localized(child(n, "DisplayName")).encode(&mut out);
        localized(child(n, "Description")).encode(&mut out);
        attr("WriteMask")
            .map_or(Ok(0u32), |v| parse_num(v, &what))?
            .encode(&mut out);
        let flags = u8::from(flag("IsAbstract", false))
            | u8::from(flag("Symmetric", false)) << 1
            | u8::from(flag("Historizing", false)) << 2
            | u8::from(flag("Executable", true)) << 3
            | u8::from(flag("ContainsNoLoops", false)) << 4;
        flags.encode(&mut out);
        attr("EventNotifier")
            .map_or(Ok(0u8), |v| parse_num(v, &what))?
            .encode(&mut out);
        localized(child(n, "InverseName")).encode(&mut out);
        match child(n, "Value") {
            Some(v) => value(&ctx, v, &what)?,
            None => Variant::Empty,
        }
        .encode(&mut out);
        ctx.node_id(attr("DataType").unwrap_or("i=24"), &what)?
            .encode(&mut out);
        attr("ValueRank")
            .map_or(Ok(-1i32), |v| parse_num(v, &what))?
            .encode(&mut out);
        let dims: Option<Vec<u32>> = match attr("ArrayDimensions") {
            None | Some("") => None,
            Some(d) => Some(
                d.split(',')
                    .map(|x| parse_num(x, &what))
                    .collect::<Result<_, _>>()?,
            ),
        };
        dims.encode(&mut out);
        attr("AccessLevel")
            .map_or(Ok(1u8), |v| parse_num(v, &what))?
            .encode(&mut out);
        attr("MinimumSamplingInterval")
            .map_or(Ok(0f64), |v| parse_num(v, &what))?
            .encode(&mut out);
        let refs: Vec<Node<'_, '_>> = child(n, "References")
            .map(|r| r.children().filter(|c| c.is_element()).collect())
            .unwrap_or_default();
        u32::try_from(refs.len())
            .unwrap_or(u32::MAX)
            .encode(&mut out);
        for r in refs {
            ctx.node_id(r.attribute("ReferenceType").unwrap_or(""), &what)?
                .encode(&mut out);
            (r.attribute("IsForward") != Some("false")).encode(&mut out);
            ctx.node_id(text(r), &what)?.encode(&mut out);
        }
        match child(n, "Definition") {
            Some(d) if class == 64 => types.definition(&ctx, &node_id, d, &what)?,
            _ => Variant::Empty,
        }
        .encode(&mut out);
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
    Ok(out)
}

/// What DataTypeDefinitions need from the rest of the file: each DataType's
/// supertype and its "Default Binary" encoding node.
struct TypeInfo {
    parent: HashMap<NodeId, NodeId>,
    binary_encoding: HashMap<NodeId, NodeId>,
}

const ENUMERATION: u32 = 29;

impl TypeInfo {
    fn collect(ctx: &Ctx<'_>, root: Node<'_, '_>) -> Result<Self, String> {
        let mut default_binary = std::collections::HashSet::new();
        let mut parent = HashMap::new();
        // (data type, encoding), from either end of the HasEncoding reference.
        let mut encodings: Vec<(NodeId, NodeId)> = Vec::new();
        for n in root.children().filter(|c| c.is_element()) {
            let id_text = n.attribute("NodeId").unwrap_or("");
            let what = format!("node {id_text}");
            let tag = n.tag_name().name();
            if tag != "UAObject" && tag != "UADataType" {
                continue;
            }
            let id = ctx.node_id(id_text, &what)?;
            if tag == "UAObject" && n.attribute("BrowseName") == Some("Default Binary") {
                default_binary.insert(id.clone());
            }
            for r in child(n, "References")
                .map(|r| r.children().filter(|c| c.is_element()).collect::<Vec<_>>())
                .unwrap_or_default()
            {
                let ty = ctx.node_id(r.attribute("ReferenceType").unwrap_or(""), &what)?;
                let forward = r.attribute("IsForward") != Some("false");
                let target = ctx.node_id(text(r), &what)?;
                match (tag, ty.as_ns0(), forward) {
                    ("UADataType", Some(45), false) => {
                        parent.insert(id.clone(), target);
                    }
                    ("UADataType", Some(38), true) => encodings.push((id.clone(), target)),
                    ("UAObject", Some(38), false) => encodings.push((target, id.clone())),
                    _ => {}
                }
            }
        }
        let binary_encoding = encodings
            .into_iter()
            .filter(|(_, e)| default_binary.contains(e))
            .collect();
        Ok(TypeInfo {
            parent,
            binary_encoding,
        })
    }

    fn is_enum(&self, id: &NodeId) -> bool {
        let mut cur = id;
        for _ in 0..64 {
            if *cur == NodeId::ns0(ENUMERATION) {
                return true;
            }
            match self.parent.get(cur) {
                Some(p) => cur = p,
                None => return false,
            }
        }
        false
    }

    /// The DataTypeDefinition attribute of DataType `id` from its
    /// `<Definition>` element (Part 6 §F.12).
    fn definition(
        &self,
        ctx: &Ctx<'_>,
        id: &NodeId,
        d: Node<'_, '_>,
        what: &str,
    ) -> Result<Variant, String> {
        let fields: Vec<Node<'_, '_>> = d
            .children()
            .filter(|c| c.is_element() && c.tag_name().name() == "Field")
            .collect();
        if self.is_enum(id) || d.attribute("IsOptionSet") == Some("true") {
            let fields = fields
                .iter()
                .map(|f| {
                    let name = f.attribute("Name").unwrap_or("");
                    Ok(uascale_types::EnumField {
                        value: f.attribute("Value").map_or(Ok(0), |v| parse_num(v, what))?,
                        display_name: match child(*f, "DisplayName") {
                            Some(dn) => localized(Some(dn)),
                            None => LocalizedText::text(name),
                        },
                        description: localized(child(*f, "Description")),
                        name: UaString::from(name),
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            return Ok(Variant::from(ExtensionObject::new(
                uascale_types::EnumDefinition {
                    fields: Some(fields),
                },
            )));
        }
        let union = d.attribute("IsUnion") == Some("true");
        let optional = fields
            .iter()
            .any(|f| f.attribute("IsOptional") == Some("true"));
        let subtyped = fields
            .iter()
            .any(|f| f.attribute("AllowSubTypes") == Some("true"));
        let structure_type = match (union, subtyped, optional) {
            (true, true, _) => uascale_types::StructureType::UnionWithSubtypedValues,
            (true, false, _) => uascale_types::StructureType::Union,
            (false, true, _) => uascale_types::StructureType::StructureWithSubtypedValues,
            (false, false, true) => uascale_types::StructureType::StructureWithOptionalFields,
            (false, false, false) => uascale_types::StructureType::Structure,
        };
        let fields = fields
            .iter()
            .map(|f| {
                let what = format!("{what}: field {}", f.attribute("Name").unwrap_or(""));
                Ok(uascale_types::StructureField {
                    name: UaString::from(f.attribute("Name").unwrap_or("")),
                    description: localized(child(*f, "Description")),
                    data_type: ctx.node_id(f.attribute("DataType").unwrap_or("i=24"), &what)?,
                    value_rank: f
                        .attribute("ValueRank")
                        .map_or(Ok(-1), |v| parse_num(v, &what))?,
                    array_dimensions: match f.attribute("ArrayDimensions") {
                        None | Some("") => None,
                        Some(a) => Some(
                            a.split(',')
                                .map(|x| parse_num(x, &what))
                                .collect::<Result<_, _>>()?,
                        ),
                    },
                    max_string_length: f
                        .attribute("MaxStringLength")
                        .map_or(Ok(0), |v| parse_num(v, &what))?,
                    is_optional: f.attribute("IsOptional") == Some("true"),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Variant::from(ExtensionObject::new(
            uascale_types::StructureDefinition {
                default_encoding_id: self
                    .binary_encoding
                    .get(id)
                    .cloned()
                    .unwrap_or(NodeId::NULL),
                base_data_type: self.parent.get(id).cloned().unwrap_or(NodeId::NULL),
                structure_type,
                fields: Some(fields),
            },
        )))
    }
}
