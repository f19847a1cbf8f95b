//! Sample ExtensionObjects, whose decoded bodies are samples of the
//! generated structures. Apart from `Gen` and the built-in types'
//! samples, which the generated samples use: this uses those.

use crate::generated::samples;
use crate::sample::{Gen, Sample};
use crate::{ByteString, ExtensionObject, NodeId, XmlElement};

impl Sample for ExtensionObject {
    fn sample(g: &mut Gen) -> Self {
        if !g.can_nest() {
            return ExtensionObject::null();
        }
        match g.below(8) {
            0 => ExtensionObject::null(),
            1 => ExtensionObject::Opaque {
                // Namespace 1: never decoded by the namespace-0 registry.
                type_id: NodeId::numeric(1, 5001),
                body: ByteString::new(vec![1, 2, 3]),
            },
            2 => ExtensionObject::Xml {
                type_id: NodeId::numeric(1, 5002),
                body: XmlElement::sample(g),
            },
            _ => ExtensionObject::Decoded(g.nested(samples::random_structure)),
        }
    }
}
