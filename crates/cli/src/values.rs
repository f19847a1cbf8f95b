//! Values as text and JSON for the client commands, and typed values from
//! text for `write` and `call`.

use serde_json::{json, Value as Json};
use uascale_types::{
    ArrayValues, ByteString, DataValue, DateTime, LocalizedText, NodeId, QualifiedName, StatusCode,
    UaString, Variant, VariantType,
};

/// One line of text for a value.
pub fn text(v: &Variant) -> String {
    match v {
        Variant::Empty => "(empty)".into(),
        Variant::Boolean(b) => b.to_string(),
        Variant::SByte(x) => x.to_string(),
        Variant::Byte(x) => x.to_string(),
        Variant::Int16(x) => x.to_string(),
        Variant::UInt16(x) => x.to_string(),
        Variant::Int32(x) => x.to_string(),
        Variant::UInt32(x) => x.to_string(),
        Variant::Int64(x) => x.to_string(),
        Variant::UInt64(x) => x.to_string(),
        Variant::Float(x) => x.to_string(),
        Variant::Double(x) => x.to_string(),
        Variant::String(s) => s.as_str().map_or("(null)".into(), |s| format!("{s:?}")),
        Variant::DateTime(t) => t.to_string(),
        Variant::Guid(g) => g.to_string(),
        Variant::ByteString(b) => b.as_bytes().map_or("(null)".into(), hex),
        Variant::NodeId(n) => n.to_string(),
        Variant::ExpandedNodeId(n) => n.to_string(),
        Variant::StatusCode(s) => s.to_string(),
        Variant::QualifiedName(q) => q.to_string(),
        Variant::LocalizedText(t) => t.to_string(),
        Variant::Array(a) => {
            let items: Vec<String> = (0..a.values().len())
                .filter_map(|i| a.values().get(i))
                .map(|e| text(&e))
                .collect();
            format!("[{}]", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A value as JSON: numbers, strings and booleans as themselves, arrays as
/// arrays, the rest as their text form.
pub fn json(v: &Variant) -> Json {
    match v {
        Variant::Empty => Json::Null,
        Variant::Boolean(b) => json!(b),
        Variant::SByte(x) => json!(x),
        Variant::Byte(x) => json!(x),
        Variant::Int16(x) => json!(x),
        Variant::UInt16(x) => json!(x),
        Variant::Int32(x) => json!(x),
        Variant::UInt32(x) => json!(x),
        Variant::Int64(x) => json!(x),
        Variant::UInt64(x) => json!(x),
        Variant::Float(x) => json!(x),
        Variant::Double(x) => json!(x),
        Variant::String(s) => s.as_str().map_or(Json::Null, |s| json!(s)),
        Variant::Array(a) => Json::Array(
            (0..a.values().len())
                .filter_map(|i| a.values().get(i))
                .map(|e| json(&e))
                .collect(),
        ),
        other => json!(text(other)),
    }
}

/// A DataValue as JSON.
pub fn data_value_json(node: &NodeId, dv: &DataValue) -> Json {
    json!({
        "node": node.to_string(),
        "value": dv.value.as_ref().map_or(Json::Null, json),
        "type": dv.value.as_ref().and_then(Variant::type_id).map(|t| format!("{t:?}")),
        "status": dv.status.unwrap_or(StatusCode::Good).to_string(),
        "source_timestamp": dv.source_timestamp.map(|t| t.to_string()),
        "server_timestamp": dv.server_timestamp.map(|t| t.to_string()),
    })
}

/// The built-in type that values of namespace-0 DataType `id` are encoded
/// as (the type itself for 1..=25, the base for the common subtypes).
pub fn builtin_of(data_type: &NodeId) -> Option<VariantType> {
    if data_type.namespace != 0 {
        return None;
    }
    let uascale_types::Identifier::Numeric(id) = data_type.identifier else {
        return None;
    };
    let base = match id {
        1..=25 => id,
        // Duration, Number-like: Double
        290 => 11,
        // UtcTime
        294 => 13,
        // LocaleId, NumericRange, NormalizedString, DecimalString, ...
        295 | 291 | 12877..=12881 => 12,
        // IntegerId, Counter, Index
        288 | 289 | 17588 => 7,
        // Enumerations and their subtypes are Int32 on the wire.
        29 => 6,
        // Image types: ByteString
        30..=31 | 2000..=2003 => 15,
        _ => return None,
    };
    VariantType::from_id(base as u8)
}

/// Names accepted by `--type`.
pub fn type_by_name(name: &str) -> Option<VariantType> {
    use VariantType::*;
    Some(match name.to_ascii_lowercase().as_str() {
        "boolean" | "bool" => Boolean,
        "sbyte" => SByte,
        "byte" => Byte,
        "int16" => Int16,
        "uint16" => UInt16,
        "int32" => Int32,
        "uint32" => UInt32,
        "int64" => Int64,
        "uint64" => UInt64,
        "float" => Float,
        "double" => Double,
        "string" => String,
        "datetime" => DateTime,
        "bytestring" => ByteString,
        "nodeid" => NodeId,
        "qualifiedname" => QualifiedName,
        "localizedtext" => LocalizedText,
        _ => return None,
    })
}

/// Parses `text` as a value of type `t`; `[a, b, c]` makes an array.
pub fn parse(t: VariantType, text: &str) -> Result<Variant, String> {
    let trimmed = text.trim();
    if let Some(inner) = trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        let items: Vec<&str> = if inner.trim().is_empty() {
            vec![]
        } else {
            inner.split(',').collect()
        };
        let mut values = ArrayValues::empty(t);
        let parsed: Result<Vec<Variant>, String> =
            items.iter().map(|i| parse_scalar(t, i.trim())).collect();
        let parsed = parsed?;
        for (i, v) in parsed.iter().enumerate() {
            values = push(values, v.clone())
                .ok_or_else(|| format!("element {i}: cannot be a {t:?} array element"))?;
        }
        return Ok(Variant::Array(Box::new(uascale_types::Array::new(values))));
    }
    parse_scalar(t, trimmed)
}

fn push(values: ArrayValues, v: Variant) -> Option<ArrayValues> {
    macro_rules! arm {
        ($($name:ident),*) => {
            match (values, v) {
                $((ArrayValues::$name(mut a), Variant::$name(x)) => { a.push(x); Some(ArrayValues::$name(a)) })*
                (ArrayValues::NodeId(mut a), Variant::NodeId(x)) => { a.push(*x); Some(ArrayValues::NodeId(a)) }
                (ArrayValues::QualifiedName(mut a), Variant::QualifiedName(x)) => { a.push(*x); Some(ArrayValues::QualifiedName(a)) }
                (ArrayValues::LocalizedText(mut a), Variant::LocalizedText(x)) => { a.push(*x); Some(ArrayValues::LocalizedText(a)) }
                _ => None,
            }
        };
    }
    arm!(
        Boolean, SByte, Byte, Int16, UInt16, Int32, UInt32, Int64, UInt64, Float, Double, String,
        DateTime, ByteString
    )
}

fn parse_scalar(t: VariantType, s: &str) -> Result<Variant, String> {
    let bad = |what: &str| format!("{s:?} is not {what}");
    macro_rules! num {
        ($ty:ty, $name:ident, $what:expr) => {
            s.parse::<$ty>().map(Variant::$name).map_err(|_| bad($what))
        };
    }
    match t {
        VariantType::Boolean => match s.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(Variant::Boolean(true)),
            "false" | "0" => Ok(Variant::Boolean(false)),
            _ => Err(bad("a Boolean (true/false)")),
        },
        VariantType::SByte => num!(i8, SByte, "an SByte (-128..127)"),
        VariantType::Byte => num!(u8, Byte, "a Byte (0..255)"),
        VariantType::Int16 => num!(i16, Int16, "an Int16"),
        VariantType::UInt16 => num!(u16, UInt16, "a UInt16"),
        VariantType::Int32 => num!(i32, Int32, "an Int32"),
        VariantType::UInt32 => num!(u32, UInt32, "a UInt32"),
        VariantType::Int64 => num!(i64, Int64, "an Int64"),
        VariantType::UInt64 => num!(u64, UInt64, "a UInt64"),
        VariantType::Float => num!(f32, Float, "a Float"),
        VariantType::Double => num!(f64, Double, "a Double"),
        VariantType::String => Ok(Variant::String(UaString::from(
            s.strip_prefix('"')
                .and_then(|r| r.strip_suffix('"'))
                .unwrap_or(s),
        ))),
        VariantType::DateTime => s
            .parse::<DateTime>()
            .map(Variant::DateTime)
            .map_err(|e| format!("{s:?}: {e}")),
        VariantType::ByteString => {
            let digits: Vec<u8> = s.bytes().collect();
            if digits.len() % 2 != 0 {
                return Err(bad("hex (an even number of digits)"));
            }
            digits
                .chunks(2)
                .map(|p| {
                    std::str::from_utf8(p)
                        .ok()
                        .and_then(|p| u8::from_str_radix(p, 16).ok())
                })
                .collect::<Option<Vec<u8>>>()
                .map(|b| Variant::ByteString(ByteString::new(b)))
                .ok_or_else(|| bad("hex"))
        }
        VariantType::NodeId => s
            .parse::<NodeId>()
            .map(Variant::from)
            .map_err(|e| format!("{s:?}: {e}")),
        VariantType::QualifiedName => Ok(Variant::from(match s.split_once(':') {
            Some((ns, name)) if ns.parse::<u16>().is_ok() => {
                QualifiedName::new(ns.parse().unwrap_or(0), name)
            }
            _ => QualifiedName::new(0, s),
        })),
        VariantType::LocalizedText => Ok(Variant::from(LocalizedText::new("", s))),
        other => Err(format!("values of type {other:?} cannot be given as text")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scalars_and_arrays_of_every_common_type() {
        assert_eq!(
            parse(VariantType::Double, "2.5").unwrap(),
            Variant::Double(2.5)
        );
        assert_eq!(
            parse(VariantType::Boolean, "TRUE").unwrap(),
            Variant::Boolean(true)
        );
        assert_eq!(parse(VariantType::Byte, "255").unwrap(), Variant::Byte(255));
        assert!(parse(VariantType::Byte, "256")
            .unwrap_err()
            .contains("Byte"));
        assert_eq!(
            parse(VariantType::Int32, "[1, 2,3]").unwrap(),
            Variant::from(vec![1i32, 2, 3])
        );
        assert_eq!(
            parse(VariantType::String, "\"a b\"").unwrap(),
            Variant::from("a b")
        );
        assert_eq!(
            parse(VariantType::ByteString, "00ff").unwrap(),
            Variant::ByteString(ByteString::new(vec![0, 255]))
        );
        assert!(parse(VariantType::DateTime, "2024-05-01T00:00:00Z").is_ok());
        assert!(parse(VariantType::NodeId, "ns=2;s=X").is_ok());
        assert!(parse(VariantType::Int16, "[1, x]")
            .unwrap_err()
            .contains("\"x\""));
        assert_eq!(
            parse(VariantType::Double, "[]").unwrap(),
            Variant::Array(Box::new(uascale_types::Array::new(ArrayValues::Double(
                vec![]
            ))))
        );
    }

    #[test]
    fn text_and_json_forms() {
        let v = Variant::from(vec![1.5f64, 2.0]);
        assert_eq!(text(&v), "[1.5, 2]");
        assert_eq!(json(&v), json!([1.5, 2.0]));
        assert_eq!(text(&Variant::from("x")), "\"x\"");
        assert_eq!(builtin_of(&NodeId::ns0(290)), Some(VariantType::Double));
        assert_eq!(builtin_of(&NodeId::ns0(11)), Some(VariantType::Double));
        assert_eq!(builtin_of(&NodeId::string(2, "T")), None);
    }
}
