//! Crate-wide tests: every generated type round-trips, the 1.04 optional /
//! union encodings work, and malformed input of every type gives an error,
//! never a panic.

use crate::generated::registry::STRUCTURES;
use crate::generated::samples::sample_by_encoding_id;
use crate::sample::{Gen, Sample};
use crate::*;

const SEEDS: u64 = 24;

#[test]
fn every_generated_structure_round_trips() {
    let limits = DecodeLimits::default();
    assert!(
        STRUCTURES.len() > 300,
        "only {} structures",
        STRUCTURES.len()
    );
    for &(name, _, enc) in STRUCTURES {
        for seed in 0..SEEDS {
            let mut g = Gen::new(seed ^ u64::from(enc) << 20);
            let value = sample_by_encoding_id(enc, &mut g).unwrap();
            assert_eq!(value.type_name(), name);
            // As an ExtensionObject: decoded to the typed value again.
            let eo = ExtensionObject::Decoded(value.clone());
            let bytes = eo.to_bytes();
            let back = ExtensionObject::from_bytes(&bytes, &limits)
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {e}"));
            assert!(
                matches!(back, ExtensionObject::Decoded(_)),
                "{name}: not decoded"
            );
            assert_eq!(back, eo, "{name} seed {seed}");
            assert_eq!(
                back.to_bytes(),
                bytes,
                "{name} seed {seed}: re-encoding differs"
            );
            // As a service message.
            let mut msg = Vec::new();
            encode_message(value.as_ref(), &mut msg);
            let mut r = Reader::new(&msg, &limits).unwrap();
            let m = decode_message(&mut r).unwrap();
            r.finish().unwrap();
            assert!(
                m.dyn_eq(value.as_ref()),
                "{name} seed {seed}: message differs"
            );
        }
    }
}

#[test]
fn builtins_round_trip() {
    fn check<T: Sample + BinaryEncode + BinaryDecode + PartialEq + std::fmt::Debug>(what: &str) {
        let limits = DecodeLimits::default();
        for seed in 0..500 {
            let v = T::sample(&mut Gen::new(seed));
            let b = v.to_bytes();
            let back = T::from_bytes(&b, &limits).unwrap_or_else(|e| panic!("{what} {seed}: {e}"));
            assert_eq!(back, v, "{what} seed {seed}");
            assert_eq!(back.to_bytes(), b);
        }
    }
    check::<NodeId>("NodeId");
    check::<ExpandedNodeId>("ExpandedNodeId");
    check::<Variant>("Variant");
    check::<DataValue>("DataValue");
    check::<DiagnosticInfo>("DiagnosticInfo");
    check::<LocalizedText>("LocalizedText");
    check::<QualifiedName>("QualifiedName");
    check::<ExtensionObject>("ExtensionObject");
    check::<DateTime>("DateTime");
    check::<Guid>("Guid");
    check::<UaString>("String");
    check::<ByteString>("ByteString");
}

#[test]
fn unknown_extension_objects_are_kept_opaque() {
    let limits = DecodeLimits::default();
    // A namespace-0 id that is not an encoding, and a namespace-2 id.
    for type_id in [NodeId::ns0(85), NodeId::numeric(2, 631)] {
        let eo = ExtensionObject::Opaque {
            type_id: type_id.clone(),
            body: ByteString::new(vec![9, 8, 7]),
        };
        let b = eo.to_bytes();
        let back = ExtensionObject::from_bytes(&b, &limits).unwrap();
        assert_eq!(back, eo);
        assert_eq!(back.to_bytes(), b);
        assert_eq!(back.type_id(), type_id);
    }
}

#[test]
fn typed_extension_object_access() {
    let limits = DecodeLimits::default();
    let eo = ExtensionObject::new(ReadValueId {
        node_id: NodeId::ns0(2258),
        attribute_id: 13,
        ..Default::default()
    });
    let back = ExtensionObject::from_bytes(&eo.to_bytes(), &limits).unwrap();
    assert_eq!(back.downcast_ref::<ReadValueId>().unwrap().attribute_id, 13);
    assert!(back.downcast_ref::<ReadRequest>().is_none());
    assert_eq!(back.type_id(), NodeId::ns0(ReadValueId::BINARY_ENCODING_ID));
    let v: ReadValueId = back.downcast().unwrap();
    assert_eq!(v.node_id, NodeId::ns0(2258));
}

#[test]
fn known_extension_object_with_a_bad_body_is_an_error_with_a_path() {
    let limits = DecodeLimits::default();
    // ReadValueId body cut short after the NodeId.
    let mut b = Vec::new();
    NodeId::ns0(ReadValueId::BINARY_ENCODING_ID).encode(&mut b);
    b.push(1);
    b.extend_from_slice(&3i32.to_le_bytes());
    b.extend_from_slice(&[0x00, 0x55, 0x0d]);
    let e = ExtensionObject::from_bytes(&b, &limits).unwrap_err();
    assert_eq!(e.path(), "ReadValueId.attribute_id");
    // A body with bytes left over.
    let mut body = ReadValueId::default().to_bytes();
    body.push(0);
    let mut b = Vec::new();
    NodeId::ns0(ReadValueId::BINARY_ENCODING_ID).encode(&mut b);
    b.push(1);
    ByteString::new(body).encode(&mut b);
    let e = ExtensionObject::from_bytes(&b, &limits).unwrap_err();
    assert_eq!(e.kind(), &DecodeErrorKind::TrailingBytes(1));
}

#[test]
fn unknown_message_type_is_an_error() {
    let limits = DecodeLimits::default();
    let b = NodeId::ns0(85).to_bytes();
    let e = decode_message(&mut Reader::new(&b, &limits).unwrap()).unwrap_err();
    assert!(matches!(e.kind(), DecodeErrorKind::UnknownEncodingId(_)));
}

/// Every prefix of every sample message fails cleanly (or, rarely, decodes
/// a shorter valid value), and random corruption never panics.
#[test]
fn truncated_and_corrupted_messages_never_panic() {
    let limits = DecodeLimits::default();
    for &(_, _, enc) in STRUCTURES {
        let mut g = Gen::new(u64::from(enc));
        let value = sample_by_encoding_id(enc, &mut g).unwrap();
        let mut msg = Vec::new();
        encode_message(value.as_ref(), &mut msg);
        for cut in 0..msg.len() {
            let mut r = Reader::new(&msg[..cut], &limits).unwrap();
            // A strict prefix cannot be the whole value.
            if let Ok(m) = decode_message(&mut r) {
                assert!(!m.dyn_eq(value.as_ref()) || r.remaining() > 0 || cut == msg.len());
            }
        }
        for i in 0..64u64 {
            let mut bad = msg.clone();
            let k = (g.next_u64() as usize) % bad.len().max(1);
            if let Some(b) = bad.get_mut(k) {
                *b ^= 1 << (i % 8);
            }
            let _ = decode_message(&mut Reader::new(&bad, &limits).unwrap());
        }
    }
}

#[test]
fn size_limits_apply_inside_structures() {
    let limits = DecodeLimits {
        max_array_length: 10,
        ..DecodeLimits::default()
    };
    let req = ReadRequest {
        nodes_to_read: Some(vec![ReadValueId::default(); 11]),
        ..Default::default()
    };
    let mut msg = Vec::new();
    encode_message(&req, &mut msg);
    let e = decode_message(&mut Reader::new(&msg, &limits).unwrap()).unwrap_err();
    assert_eq!(e.status_code(), StatusCode::BadEncodingLimitsExceeded);
    assert_eq!(e.path(), "ReadRequest.nodes_to_read");
}

mod structure_kinds {
    use super::*;
    use crate::generated::fixture_types::*;

    #[test]
    fn optional_fields_use_the_encoding_mask() {
        let limits = DecodeLimits::default();
        let v = FixtureOptional {
            id: 7,
            note: None,
            values: Some(vec![1.5]),
            mode: FixtureMode::On,
        };
        let b = v.to_bytes();
        #[rustfmt::skip]
        let expected = [
            0x02, 0, 0, 0,        // mask: Values present, Note absent
            7, 0, 0, 0,           // Id
            1, 0, 0, 0,           // NoOfValues
            0, 0, 0, 0, 0, 0, 0xf8, 0x3f, // 1.5
            2, 0, 0, 0,           // Mode = On
        ];
        assert_eq!(b, expected);
        assert_eq!(FixtureOptional::from_bytes(&b, &limits).unwrap(), v);
        // A mask bit for a field the type does not have.
        let mut bad = b.clone();
        bad[0] = 0x04;
        let e = FixtureOptional::from_bytes(&bad, &limits).unwrap_err();
        assert_eq!(e.path(), "encoding_mask");
    }

    #[test]
    fn unions_use_the_switch_field() {
        let limits = DecodeLimits::default();
        assert_eq!(FixtureUnion::Null.to_bytes(), [0, 0, 0, 0]);
        let t = FixtureUnion::Text(UaString::from("a"));
        assert_eq!(t.to_bytes(), [2, 0, 0, 0, 1, 0, 0, 0, b'a']);
        assert_eq!(FixtureUnion::from_bytes(&t.to_bytes(), &limits).unwrap(), t);
        let e = FixtureUnion::from_bytes(&[9, 0, 0, 0], &limits).unwrap_err();
        assert_eq!(e.path(), "switch_field");
        let flags = FixtureFlags::Red | FixtureFlags::Green;
        assert!(flags.contains(FixtureFlags::Green));
        assert_eq!(flags.to_bytes(), [3, 0], "16-bit option set");
    }

    #[test]
    fn fixture_samples_round_trip() {
        let limits = DecodeLimits::default();
        for seed in 0..300 {
            let v = FixtureHolder::sample(&mut Gen::new(seed));
            let b = v.to_bytes();
            assert_eq!(FixtureHolder::from_bytes(&b, &limits).unwrap(), v);
        }
    }
}

#[test]
fn enumerations_keep_unknown_values() {
    let limits = DecodeLimits::default();
    let nc = NodeClass::from_bytes(&128i32.to_le_bytes(), &limits).unwrap();
    assert_eq!(nc, NodeClass::View);
    assert_eq!(format!("{nc:?}"), "View");
    let odd = NodeClass::from_bytes(&3i32.to_le_bytes(), &limits).unwrap();
    assert_eq!(format!("{odd:?}"), "NodeClass(3)");
    assert_eq!(odd.to_bytes(), 3i32.to_le_bytes());
}

#[test]
fn ids_and_attributes() {
    assert_eq!(ids::object::Server, 2253);
    assert_eq!(ids::variable::Server_ServerStatus_CurrentTime, 2258);
    assert_eq!(ids::data_type::ReadRequest, 629);
    assert_eq!(ids::reference_type::HierarchicalReferences, 33);
    assert_eq!(ids::method::Server_GetMonitoredItems, 11492);
    assert_eq!(AttributeId::from_u32(13), Some(AttributeId::Value));
    assert_eq!(AttributeId::from_u32(28), None);
    assert_eq!(AttributeId::AccessLevelEx.name(), "AccessLevelEx");
    assert_eq!(
        crate::generated::registry::name_of_encoding(631),
        Some("ReadRequest")
    );
}
