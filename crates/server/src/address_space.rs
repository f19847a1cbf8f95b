//! The address space: namespace 0, decoded at start from the compact table
//! `cargo xtask codegen` builds out of `Opc.Ua.NodeSet2.Services.xml`
//! (`generated/ns0.bin`, format in `xtask/src/nodeset.rs`).
//!
//! The table is decoded once per process and shared; references are made
//! two-way at load so that Browse can follow both directions.

use std::collections::HashSet;
use std::sync::RwLock;

use crate::fxhash::FxHashMap;

use uascale_types::{
    AttributeId, BinaryDecode, DecodeError, DecodeErrorKind, DecodeLimits, LocalizedText,
    NodeClass, NodeId, QualifiedName, Reader, UaString, Variant,
};

static NS0_TABLE: &[u8] = include_bytes!("generated/ns0.bin");

/// One reference of a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// The ReferenceType.
    pub reference_type: NodeId,
    /// Direction as seen from the node holding it.
    pub is_forward: bool,
    /// The other end.
    pub target: NodeId,
}

/// A node and its attributes.
#[derive(Debug, Clone)]
pub struct Node {
    /// NodeClass.
    pub node_class: NodeClass,
    /// NodeId.
    pub node_id: NodeId,
    /// BrowseName.
    pub browse_name: QualifiedName,
    /// DisplayName.
    pub display_name: LocalizedText,
    /// Description.
    pub description: LocalizedText,
    /// WriteMask.
    pub write_mask: u32,
    /// IsAbstract (types).
    pub is_abstract: bool,
    /// Symmetric (ReferenceTypes).
    pub symmetric: bool,
    /// Historizing (Variables).
    pub historizing: bool,
    /// Executable (Methods).
    pub executable: bool,
    /// ContainsNoLoops (Views).
    pub contains_no_loops: bool,
    /// EventNotifier (Objects, Views).
    pub event_notifier: u8,
    /// InverseName (ReferenceTypes).
    pub inverse_name: LocalizedText,
    /// Value (Variables, VariableTypes); Empty when none.
    pub value: Variant,
    /// DataType.
    pub data_type: NodeId,
    /// ValueRank.
    pub value_rank: i32,
    /// ArrayDimensions.
    pub array_dimensions: Option<Vec<u32>>,
    /// AccessLevel.
    pub access_level: u8,
    /// MinimumSamplingInterval in ms.
    pub minimum_sampling_interval: f64,
    /// References, both directions.
    pub references: Vec<Reference>,
    /// DataTypeDefinition (DataTypes): a StructureDefinition or
    /// EnumDefinition ExtensionObject; Empty when the type has none.
    pub data_type_definition: Variant,
    /// DisplayName and Description in several locales, when the node has
    /// more than one; `display_name` / `description` are the defaults.
    pub translations: Option<Box<Translations>>,
}

/// A node's DisplayName and Description in every locale it has.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translations {
    /// DisplayName, one per locale.
    pub display_name: Vec<LocalizedText>,
    /// Description, one per locale.
    pub description: Vec<LocalizedText>,
}

fn language(locale: &str) -> &str {
    locale.split(['-', '_']).next().unwrap_or(locale)
}

/// The text for the session's preferred locales (Part 4 §5.6.3 localeIds,
/// Part 3 §8.4): for each locale in the client's order, a translation with
/// exactly that locale, else one in the same language (`de` for `de-AT`,
/// `de-DE` for `de`); `None` when no translation fits, and the caller
/// returns the node's default.
pub fn select_locale<'a>(
    texts: &'a [LocalizedText],
    locales: &[UaString],
) -> Option<&'a LocalizedText> {
    for want in locales.iter().filter_map(|l| l.as_str()) {
        if want.is_empty() {
            continue;
        }
        let same = |t: &&LocalizedText| {
            t.locale
                .as_str()
                .is_some_and(|l| l.eq_ignore_ascii_case(want))
        };
        if let Some(t) = texts.iter().find(same) {
            return Some(t);
        }
        let lang = language(want);
        let close = |t: &&LocalizedText| {
            t.locale
                .as_str()
                .is_some_and(|l| language(l).eq_ignore_ascii_case(lang))
        };
        if let Some(t) = texts.iter().find(close) {
            return Some(t);
        }
    }
    None
}

/// The WriteMask bit of each attribute a client may write besides Value
/// (Part 3 §8.60), when the node's WriteMask allows it.
pub const WRITABLE_ATTRIBUTES: &[(AttributeId, u32)] = &[
    (AttributeId::Description, 1 << 5),
    (AttributeId::DisplayName, 1 << 6),
    (AttributeId::InverseName, 1 << 10),
    (AttributeId::MinimumSamplingInterval, 1 << 12),
];

/// The WriteMask bits this server honours; a node's WriteMask attribute
/// reads as its mask restricted to these.
pub const SUPPORTED_WRITE_MASK: u32 = (1 << 5) | (1 << 6) | (1 << 10) | (1 << 12);

/// The WriteMask bit for `attr`, when it is one a client may write.
pub fn write_mask_bit(attr: AttributeId) -> Option<u32> {
    WRITABLE_ATTRIBUTES
        .iter()
        .find(|(a, _)| *a == attr)
        .map(|(_, b)| *b)
}

impl Node {
    /// A node with the attribute defaults of the NodeSet schema.
    pub fn new(node_class: NodeClass, node_id: NodeId, browse_name: QualifiedName) -> Self {
        let display_name = LocalizedText::text(browse_name.name.as_str_or_empty());
        Node {
            node_class,
            node_id,
            browse_name,
            display_name,
            description: LocalizedText::default(),
            write_mask: 0,
            is_abstract: false,
            symmetric: false,
            historizing: false,
            executable: node_class == NodeClass::Method,
            contains_no_loops: false,
            event_notifier: 0,
            inverse_name: LocalizedText::default(),
            value: Variant::Empty,
            data_type: NodeId::ns0(24),
            value_rank: -1,
            array_dimensions: None,
            access_level: 1,
            minimum_sampling_interval: 0.0,
            references: Vec::new(),
            data_type_definition: Variant::Empty,
            translations: None,
        }
    }

    /// Adds a reference (builder style).
    pub fn with_reference(mut self, reference_type: u32, is_forward: bool, target: NodeId) -> Self {
        self.references.push(Reference {
            reference_type: NodeId::ns0(reference_type),
            is_forward,
            target,
        });
        self
    }
}

/// The nodes of a server.
#[derive(Debug, Default)]
pub struct AddressSpace {
    nodes: FxHashMap<NodeId, Node>,
    /// Attributes other than Value written by clients (per WriteMask),
    /// by node and attribute id.
    written: RwLock<FxHashMap<(NodeId, u32), Variant>>,
}

/// A copy of the nodes and the attributes written so far (a fuzz target
/// starts every run from one namespace 0 built once).
impl Clone for AddressSpace {
    fn clone(&self) -> Self {
        let written = self
            .written
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        AddressSpace {
            nodes: self.nodes.clone(),
            written: RwLock::new(written),
        }
    }
}

fn bad(what: &'static str) -> DecodeError {
    DecodeError::new(DecodeErrorKind::InvalidValue(what))
}

fn decode_node(r: &mut Reader<'_>) -> Result<Node, DecodeError> {
    let node_class = NodeClass(i32::from(u8::decode(r)?));
    let node_id = NodeId::decode(r)?;
    let browse_name = QualifiedName::decode(r)?;
    let display_name = LocalizedText::decode(r)?;
    let description = LocalizedText::decode(r)?;
    let write_mask = u32::decode(r)?;
    let flags = u8::decode(r)?;
    let event_notifier = u8::decode(r)?;
    let inverse_name = LocalizedText::decode(r)?;
    let value = Variant::decode(r)?;
    let data_type = NodeId::decode(r)?;
    let value_rank = i32::decode(r)?;
    let array_dimensions = Option::<Vec<u32>>::decode(r)?;
    let access_level = u8::decode(r)?;
    let minimum_sampling_interval = f64::decode(r)?;
    let n = u32::decode(r)?;
    let mut references = Vec::with_capacity(n.min(1024) as usize);
    for _ in 0..n {
        references.push(Reference {
            reference_type: NodeId::decode(r)?,
            is_forward: bool::decode(r)?,
            target: NodeId::decode(r)?,
        });
    }
    let data_type_definition = Variant::decode(r)?;
    Ok(Node {
        node_class,
        node_id,
        browse_name,
        display_name,
        description,
        write_mask,
        is_abstract: flags & 1 != 0,
        symmetric: flags & 2 != 0,
        historizing: flags & 4 != 0,
        executable: flags & 8 != 0,
        contains_no_loops: flags & 16 != 0,
        event_notifier,
        inverse_name,
        value,
        data_type,
        value_rank,
        array_dimensions,
        access_level,
        minimum_sampling_interval,
        references,
        data_type_definition,
        translations: None,
    })
}

impl AddressSpace {
    /// Decodes a table in the `xtask/src/nodeset.rs` format.
    pub fn from_table(table: &[u8]) -> Result<Self, DecodeError> {
        let limits = DecodeLimits {
            max_message_size: table.len(),
            ..DecodeLimits::default()
        };
        let mut r = Reader::new(table, &limits)?;
        if r.take(7)? != b"UASNS0\x02" {
            return Err(bad("not a uascale namespace table (version 2)"));
        }
        let count = u32::decode(&mut r)?;
        let mut nodes = FxHashMap::with_capacity_and_hasher(count as usize, Default::default());
        for _ in 0..count {
            let n = decode_node(&mut r)?;
            nodes.insert(n.node_id.clone(), n);
        }
        r.finish()?;
        let mut space = AddressSpace {
            nodes,
            written: RwLock::default(),
        };
        space.add_inverse_references();
        Ok(space)
    }

    /// Namespace 0 as built into this binary (about 5,600 nodes).
    pub fn ns0() -> Result<Self, DecodeError> {
        AddressSpace::from_table(NS0_TABLE)
    }

    fn add_inverse_references(&mut self) {
        let mut missing: Vec<(NodeId, Reference)> = Vec::new();
        let existing: HashSet<(NodeId, Reference)> = self
            .nodes
            .values()
            .flat_map(|n| n.references.iter().map(|r| (n.node_id.clone(), r.clone())))
            .collect();
        for (src, r) in &existing {
            let inverse = Reference {
                reference_type: r.reference_type.clone(),
                is_forward: !r.is_forward,
                target: src.clone(),
            };
            if self.nodes.contains_key(&r.target)
                && !existing.contains(&(r.target.clone(), inverse.clone()))
            {
                missing.push((r.target.clone(), inverse));
            }
        }
        for (node, r) in missing {
            if let Some(n) = self.nodes.get_mut(&node) {
                if !n.references.contains(&r) {
                    n.references.push(r);
                }
            }
        }
    }

    /// Adds a node with its references, and the inverse of each reference
    /// on the nodes they point to (which must exist already or be added
    /// later with their own references).
    pub fn insert(&mut self, node: Node) {
        for r in &node.references {
            if let Some(t) = self.nodes.get_mut(&r.target) {
                let inverse = Reference {
                    reference_type: r.reference_type.clone(),
                    is_forward: !r.is_forward,
                    target: node.node_id.clone(),
                };
                if !t.references.contains(&inverse) {
                    t.references.push(inverse);
                }
            }
        }
        self.nodes.insert(node.node_id.clone(), node);
    }

    /// Adds nodes that may refer to each other, and makes every reference
    /// two-way (a reference the file gives in both directions is kept once).
    pub fn insert_all(&mut self, nodes: Vec<Node>) {
        let mut inverses = Vec::new();
        for n in &nodes {
            for r in &n.references {
                inverses.push((
                    r.target.clone(),
                    Reference {
                        reference_type: r.reference_type.clone(),
                        is_forward: !r.is_forward,
                        target: n.node_id.clone(),
                    },
                ));
            }
        }
        for n in nodes {
            self.nodes.insert(n.node_id.clone(), n);
        }
        // Grouped by target, so a folder of many new children is checked
        // against a set of its references, not a list.
        let mut by_target: FxHashMap<NodeId, Vec<Reference>> = FxHashMap::default();
        for (target, r) in inverses {
            by_target.entry(target).or_default().push(r);
        }
        for (target, refs) in by_target {
            if let Some(t) = self.nodes.get_mut(&target) {
                let mut have: HashSet<Reference> = t.references.iter().cloned().collect();
                for r in refs {
                    if have.insert(r.clone()) {
                        t.references.push(r);
                    }
                }
            }
        }
    }

    /// The built-in type (1..=25) a DataType is, or derives from (Int32
    /// for enumerations); `None` for types outside the hierarchy.
    pub fn builtin_base(&self, data_type: &NodeId) -> Option<u32> {
        let mut cur = data_type.clone();
        for _ in 0..64 {
            if let Some(n) = cur.as_ns0().filter(|n| (1..=25).contains(n)) {
                return Some(n);
            }
            // Enumerations travel as Int32.
            if cur == NodeId::ns0(29) {
                return Some(6);
            }
            let node = self.get(&cur)?;
            let parent = node
                .references
                .iter()
                .find(|r| !r.is_forward && r.reference_type == NodeId::ns0(45))?;
            cur = parent.target.clone();
        }
        None
    }

    /// The node with this id.
    pub fn get(&self, id: &NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }

    /// The node with this id, to change while the space is being built.
    pub fn get_mut(&mut self, id: &NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(id)
    }

    /// The value a client wrote into attribute `attr` of `node`, if any.
    pub fn written(&self, node: &NodeId, attr: AttributeId) -> Option<Variant> {
        let map = match self.written.read() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.get(&(node.clone(), attr as u32)).cloned()
    }

    /// Records a client's write of attribute `attr` (checked by the caller
    /// against the node's WriteMask and the attribute's type).
    pub fn set_written(&self, node: &NodeId, attr: AttributeId, value: Variant) {
        let mut map = match self.written.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.insert((node.clone(), attr as u32), value);
    }

    /// A node's DisplayName or Description (`attr`) as a client sees it:
    /// what a client wrote, else the translation for `locales`
    /// ([`select_locale`]), else the default.
    pub fn localized(&self, node: &Node, attr: AttributeId, locales: &[UaString]) -> LocalizedText {
        if write_mask_bit(attr).is_some_and(|b| node.write_mask & b != 0) {
            if let Some(Variant::LocalizedText(t)) = self.written(&node.node_id, attr) {
                return *t;
            }
        }
        let (default, all) = match attr {
            AttributeId::Description => (
                &node.description,
                node.translations.as_ref().map(|t| t.description.as_slice()),
            ),
            _ => (
                &node.display_name,
                node.translations
                    .as_ref()
                    .map(|t| t.display_name.as_slice()),
            ),
        };
        all.and_then(|all| select_locale(all, locales))
            .unwrap_or(default)
            .clone()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// True when `ty` is `base` or one of its subtypes (HasSubtype, i=45).
    pub fn is_subtype_of(&self, ty: &NodeId, base: &NodeId) -> bool {
        let mut cur = ty.clone();
        // The type hierarchy is a tree; the bound only guards a bad nodeset.
        for _ in 0..64 {
            if &cur == base {
                return true;
            }
            let Some(n) = self.get(&cur) else {
                return false;
            };
            match n
                .references
                .iter()
                .find(|r| !r.is_forward && r.reference_type == NodeId::ns0(45))
            {
                Some(r) => cur = r.target.clone(),
                None => return false,
            }
        }
        false
    }
}

/// Makes `Server.ServerRedundancy` a TransparentRedundancyType (i=2036,
/// Part 5 §6.3.9) with its two mandatory properties, CurrentServerId and
/// RedundantServerArray (their values are live: `server_object::live_value`). For a
/// cluster node, before the address space is shared; an address space
/// without the Server object is left alone.
pub fn make_transparent(space: &mut AddressSpace) {
    use uascale_types::QualifiedName;
    const HAS_TYPE_DEFINITION: u32 = 40;
    const HAS_PROPERTY: u32 = 46;
    const PROPERTY_TYPE: u32 = 68;
    const STRING: u32 = 12;
    const REDUNDANT_SERVER_DATA_TYPE: u32 = 853;
    let redundancy = NodeId::ns0(uascale_types::ids::object::Server_ServerRedundancy);
    let Some(node) = space.get_mut(&redundancy) else {
        return;
    };
    let transparent = NodeId::ns0(uascale_types::ids::object_type::TransparentRedundancyType);
    for r in &mut node.references {
        if r.is_forward && r.reference_type == NodeId::ns0(HAS_TYPE_DEFINITION) {
            r.target = transparent.clone();
        }
    }
    let property = |id: u32, name: &str, data_type: u32, value_rank: i32| {
        let mut n = Node::new(
            uascale_types::NodeClass::Variable,
            NodeId::ns0(id),
            QualifiedName::new(0, name),
        )
        .with_reference(HAS_PROPERTY, false, redundancy.clone())
        .with_reference(HAS_TYPE_DEFINITION, true, NodeId::ns0(PROPERTY_TYPE));
        n.data_type = NodeId::ns0(data_type);
        n.value_rank = value_rank;
        if value_rank == 1 {
            n.array_dimensions = Some(vec![0]);
        }
        n
    };
    space.insert(property(
        uascale_types::ids::variable::Server_ServerRedundancy_CurrentServerId,
        "CurrentServerId",
        STRING,
        -1,
    ));
    space.insert(property(
        uascale_types::ids::variable::Server_ServerRedundancy_RedundantServerArray,
        "RedundantServerArray",
        REDUNDANT_SERVER_DATA_TYPE,
        1,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_types::ids;

    fn ns0() -> &'static AddressSpace {
        static NS0: std::sync::OnceLock<AddressSpace> = std::sync::OnceLock::new();
        NS0.get_or_init(|| AddressSpace::ns0().unwrap())
    }

    #[test]
    fn namespace_zero_loads() {
        let s = ns0();
        assert!(s.len() > 5000, "{} nodes", s.len());
        let server = s.get(&NodeId::ns0(ids::object::Server)).unwrap();
        assert_eq!(server.node_class, NodeClass::Object);
        assert_eq!(server.browse_name, QualifiedName::new(0, "Server"));
        // Organizes from the Objects folder, made two-way.
        let objects = s.get(&NodeId::ns0(ids::object::ObjectsFolder)).unwrap();
        assert!(objects
            .references
            .iter()
            .any(|r| r.is_forward && r.target == server.node_id));
        assert!(server
            .references
            .iter()
            .any(|r| !r.is_forward && r.target == objects.node_id));
        let ns = s
            .get(&NodeId::ns0(ids::variable::Server_NamespaceArray))
            .unwrap();
        assert_eq!(ns.value_rank, 1);
        assert_eq!(ns.data_type, NodeId::ns0(12));
    }

    #[test]
    fn xml_values_became_typed_extension_objects() {
        let s = ns0();
        // Server.GetMonitoredItems InputArguments: one Argument "SubscriptionId".
        let input = s
            .get(&NodeId::ns0(
                ids::variable::Server_GetMonitoredItems_InputArguments,
            ))
            .unwrap();
        let Variant::Array(a) = &input.value else {
            panic!("{:?}", input.value)
        };
        let uascale_types::ArrayValues::ExtensionObject(items) = a.values() else {
            panic!()
        };
        let arg = items[0].downcast_ref::<uascale_types::Argument>().unwrap();
        assert_eq!(arg.name, "SubscriptionId");
        assert_eq!(arg.data_type, NodeId::ns0(7));
        assert_eq!(arg.value_rank, -1);
    }

    #[test]
    fn locale_selection() {
        let texts = [
            LocalizedText::new("en-US", "Temperature"),
            LocalizedText::new("de-DE", "Temperatur"),
            LocalizedText::new("fr", "Température"),
        ];
        let pick = |ls: &[&str]| {
            let ls: Vec<UaString> = ls.iter().map(|l| UaString::from(*l)).collect();
            select_locale(&texts, &ls).map(|t| t.text.as_str().unwrap_or("").to_owned())
        };
        assert_eq!(pick(&["de-DE"]).as_deref(), Some("Temperatur"));
        assert_eq!(pick(&["DE-de"]).as_deref(), Some("Temperatur"));
        // Same language, other country; either way round.
        assert_eq!(pick(&["de-AT"]).as_deref(), Some("Temperatur"));
        assert_eq!(pick(&["fr-CA"]).as_deref(), Some("Température"));
        assert_eq!(pick(&["en"]).as_deref(), Some("Temperature"));
        // The client's order wins; unknown locales are skipped.
        assert_eq!(pick(&["ja", "fr", "de"]).as_deref(), Some("Température"));
        assert_eq!(pick(&["ja"]), None);
        assert_eq!(pick(&[]), None);
    }

    #[test]
    fn subtypes() {
        let s = ns0();
        // HasComponent (47) is Aggregates (44) is HierarchicalReferences (33).
        assert!(s.is_subtype_of(&NodeId::ns0(47), &NodeId::ns0(33)));
        assert!(!s.is_subtype_of(&NodeId::ns0(40), &NodeId::ns0(33)));
    }

    #[test]
    fn bad_tables_are_errors() {
        assert!(AddressSpace::from_table(b"nope").is_err());
        let mut t = NS0_TABLE.to_vec();
        t.truncate(t.len() / 2);
        assert!(AddressSpace::from_table(&t).is_err());
    }
}
