//! Reads an OPC Binary type dictionary (`*.bsd`, Part 3 Annex / Part 6 §5.2)
//! into a small model: structures (plain, with optional fields, unions) and
//! enumerations (plain and option sets).

use std::collections::{HashMap, HashSet};

const BSD_NS: &str = "http://opcfoundation.org/BinarySchema/";

/// Built-in types the types crate writes by hand; their bsd descriptions
/// are skipped.
pub const HAND_WRITTEN: &[&str] = &[
    "XmlElement",
    "NodeIdType",
    "TwoByteNodeId",
    "FourByteNodeId",
    "NumericNodeId",
    "StringNodeId",
    "GuidNodeId",
    "ByteStringNodeId",
    "NodeId",
    "ExpandedNodeId",
    "StatusCode",
    "DiagnosticInfo",
    "QualifiedName",
    "LocalizedText",
    "DataValue",
    "ExtensionObject",
    "Variant",
];

/// The wire type of a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldType {
    /// A built-in type; the string is the Rust type in `uascale_types`.
    Builtin(&'static str),
    /// A generated structure or enumeration of the same dictionary.
    Named(String),
}

/// One field of a structure or one arm of a union.
#[derive(Debug, Clone)]
pub struct Field {
    /// The bsd name (PascalCase).
    pub name: String,
    /// Wire type of one element.
    pub ty: FieldType,
    /// True when encoded as an Int32-length-prefixed array.
    pub array: bool,
    /// For optional fields: the bit of the encoding mask that says present.
    pub optional_bit: Option<u32>,
    /// For union arms: the switch value.
    pub switch_value: Option<u32>,
}

/// The shape of a structure's encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StructKind {
    /// Fields one after another.
    Plain,
    /// A UInt32 encoding mask first; fields with a bit are optional.
    Optional,
    /// A UInt32 switch first, then the one selected arm (0 = none).
    Union,
}

/// A structured type.
#[derive(Debug, Clone)]
pub struct StructType {
    /// Type name.
    pub name: String,
    /// Documentation text, if any.
    pub doc: Option<String>,
    /// Base type name without prefix (ExtensionObject for roots).
    pub base: Option<String>,
    /// How it is encoded.
    pub kind: StructKind,
    /// Fields (or union arms) in wire order.
    pub fields: Vec<Field>,
}

/// An enumerated type.
#[derive(Debug, Clone)]
pub struct EnumType {
    /// Type name.
    pub name: String,
    /// Documentation text, if any.
    pub doc: Option<String>,
    /// Wire width.
    pub bits: u32,
    /// True for option sets (bit masks), encoded unsigned.
    pub option_set: bool,
    /// Named values.
    pub values: Vec<(String, i64)>,
}

/// A parsed dictionary.
#[derive(Debug, Default)]
pub struct Dictionary {
    /// Structured types in file order.
    pub structs: Vec<StructType>,
    /// Enumerated types in file order.
    pub enums: Vec<EnumType>,
}

fn strip_prefix(t: &str) -> &str {
    t.split_once(':').map_or(t, |(_, n)| n)
}

fn builtin(name: &str) -> Option<&'static str> {
    Some(match name {
        "Boolean" => "bool",
        "SByte" => "i8",
        "Byte" => "u8",
        "Int16" => "i16",
        "UInt16" => "u16",
        "Int32" => "i32",
        "UInt32" => "u32",
        "Int64" => "i64",
        "UInt64" => "u64",
        "Float" => "f32",
        "Double" => "f64",
        "String" | "CharArray" => "UaString",
        "DateTime" => "DateTime",
        "Guid" => "Guid",
        "ByteString" => "ByteString",
        "XmlElement" => "XmlElement",
        "NodeId" => "NodeId",
        "ExpandedNodeId" => "ExpandedNodeId",
        "StatusCode" => "StatusCode",
        "DiagnosticInfo" => "DiagnosticInfo",
        "QualifiedName" => "QualifiedName",
        "LocalizedText" => "LocalizedText",
        "ExtensionObject" => "ExtensionObject",
        "DataValue" => "DataValue",
        "Variant" => "Variant",
        _ => return None,
    })
}

fn doc_of(node: roxmltree::Node<'_, '_>) -> Option<String> {
    node.children()
        .find(|c| c.is_element() && c.tag_name().name() == "Documentation")
        .and_then(|c| c.text())
        .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|t| !t.is_empty())
}

fn attr_u32(node: roxmltree::Node<'_, '_>, name: &str, ctx: &str) -> Result<Option<u32>, String> {
    match node.attribute(name) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{ctx}: attribute {name}={v:?} is not a number")),
    }
}

/// Parses a bsd document.
pub fn parse(text: &str, file: &str) -> Result<Dictionary, String> {
    let doc = roxmltree::Document::parse(text).map_err(|e| format!("{file}: {e}"))?;
    let mut dict = Dictionary::default();
    for node in doc.root_element().children().filter(|n| n.is_element()) {
        if node.tag_name().namespace() != Some(BSD_NS) {
            continue;
        }
        let Some(name) = node.attribute("Name") else {
            continue;
        };
        if HAND_WRITTEN.contains(&name) {
            continue;
        }
        match node.tag_name().name() {
            "StructuredType" => dict.structs.push(parse_struct(node, name, file)?),
            "EnumeratedType" => dict.enums.push(parse_enum(node, name, file)?),
            _ => {}
        }
    }
    Ok(dict)
}

fn parse_enum(node: roxmltree::Node<'_, '_>, name: &str, file: &str) -> Result<EnumType, String> {
    let ctx = format!("{file}: EnumeratedType {name}");
    let bits = attr_u32(node, "LengthInBits", &ctx)?.unwrap_or(32);
    if !matches!(bits, 8 | 16 | 32 | 64) {
        return Err(format!("{ctx}: LengthInBits={bits} is not 8, 16, 32 or 64"));
    }
    let option_set = node.attribute("IsOptionSet") == Some("true");
    let mut values = Vec::new();
    for v in node
        .children()
        .filter(|c| c.is_element() && c.tag_name().name() == "EnumeratedValue")
    {
        let vname = v
            .attribute("Name")
            .ok_or_else(|| format!("{ctx}: EnumeratedValue without Name"))?;
        let value: i64 = v
            .attribute("Value")
            .ok_or_else(|| format!("{ctx}: {vname} has no Value"))?
            .parse()
            .map_err(|_| format!("{ctx}: {vname} has a Value that is not a number"))?;
        values.push((vname.to_owned(), value));
    }
    Ok(EnumType {
        name: name.to_owned(),
        doc: doc_of(node),
        bits,
        option_set,
        values,
    })
}

fn parse_struct(
    node: roxmltree::Node<'_, '_>,
    name: &str,
    file: &str,
) -> Result<StructType, String> {
    let ctx = format!("{file}: StructuredType {name}");
    let raw: Vec<roxmltree::Node<'_, '_>> = node
        .children()
        .filter(|c| c.is_element() && c.tag_name().name() == "Field")
        .collect();
    // Fields that only carry the length of a later array.
    let length_fields: HashSet<&str> = raw
        .iter()
        .filter_map(|f| f.attribute("LengthField"))
        .collect();
    // Named bits of the encoding mask, and their positions.
    let mut bit_pos: HashMap<String, u32> = HashMap::new();
    let mut next_bit = 0u32;
    let mut has_bits = false;
    let mut has_switch_field = false;
    let mut fields = Vec::new();
    for f in &raw {
        let fname = f
            .attribute("Name")
            .ok_or_else(|| format!("{ctx}: a Field has no Name"))?;
        let tname = strip_prefix(
            f.attribute("TypeName")
                .ok_or_else(|| format!("{ctx}: field {fname} has no TypeName"))?,
        );
        if tname == "Bit" {
            has_bits = true;
            let len = attr_u32(*f, "Length", &ctx)?.unwrap_or(1);
            if len == 1 && !fname.starts_with("Reserved") {
                bit_pos.insert(fname.to_owned(), next_bit);
            }
            next_bit += len;
            continue;
        }
        if length_fields.contains(fname) {
            continue;
        }
        if fname == "SwitchField" && f.attribute("SwitchField").is_none() {
            has_switch_field = true;
            if tname != "UInt32" {
                return Err(format!(
                    "{ctx}: union SwitchField must be UInt32, found {tname}"
                ));
            }
            continue;
        }
        let ty = match builtin(tname) {
            Some(b) => FieldType::Builtin(b),
            None => FieldType::Named(tname.to_owned()),
        };
        let mut field = Field {
            name: fname.to_owned(),
            ty,
            array: f.attribute("LengthField").is_some(),
            optional_bit: None,
            switch_value: None,
        };
        if let Some(sw) = f.attribute("SwitchField") {
            if let Some(v) = attr_u32(*f, "SwitchValue", &ctx)? {
                if sw != "SwitchField" {
                    return Err(format!(
                        "{ctx}: field {fname} switches on {sw}; only unions (SwitchField) are supported"
                    ));
                }
                field.switch_value = Some(v);
            } else {
                let bit = bit_pos.get(sw).ok_or_else(|| {
                    format!("{ctx}: field {fname} names SwitchField {sw}, which is not a bit")
                })?;
                field.optional_bit = Some(*bit);
            }
        }
        fields.push(field);
    }
    let kind = if has_switch_field {
        if fields.iter().any(|f| f.switch_value.is_none()) {
            return Err(format!("{ctx}: union with a field that has no SwitchValue"));
        }
        StructKind::Union
    } else if has_bits {
        if next_bit > 32 {
            return Err(format!(
                "{ctx}: encoding mask of {next_bit} bits (at most 32)"
            ));
        }
        StructKind::Optional
    } else {
        StructKind::Plain
    };
    Ok(StructType {
        name: name.to_owned(),
        doc: doc_of(node),
        base: node
            .attribute("BaseType")
            .map(|b| strip_prefix(b).to_owned()),
        kind,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_and_union_shapes() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/structure_kinds.bsd"
        ))
        .unwrap();
        let d = parse(&text, "fixture").unwrap();
        let opt = d
            .structs
            .iter()
            .find(|s| s.name == "FixtureOptional")
            .unwrap();
        assert_eq!(opt.kind, StructKind::Optional);
        let bits: Vec<_> = opt.fields.iter().map(|f| f.optional_bit).collect();
        assert_eq!(bits, [None, Some(0), Some(1), None]);
        assert!(opt.fields[2].array);
        let u = d.structs.iter().find(|s| s.name == "FixtureUnion").unwrap();
        assert_eq!(u.kind, StructKind::Union);
        assert_eq!(
            u.fields.iter().map(|f| f.switch_value).collect::<Vec<_>>(),
            [Some(1), Some(2), Some(3)]
        );
        let e = d.enums.iter().find(|e| e.name == "FixtureFlags").unwrap();
        assert!(e.option_set);
        assert_eq!(e.bits, 16);
    }

    #[test]
    fn bad_schema_errors_name_the_type() {
        let text = r#"<opc:TypeDictionary xmlns:opc="http://opcfoundation.org/BinarySchema/">
            <opc:StructuredType Name="Broken"><opc:Field Name="X" TypeName="opc:Int32" SwitchField="Nope"/></opc:StructuredType>
            </opc:TypeDictionary>"#;
        let e = parse(text, "t.bsd").unwrap_err();
        assert!(
            e.contains("StructuredType Broken") && e.contains("Nope"),
            "{e}"
        );
    }
}
