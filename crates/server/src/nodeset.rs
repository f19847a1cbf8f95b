//! Companion NodeSet2 XML files loaded at run time (`uascale serve
//! --nodeset FILE`, repeatable): OPC UA DI, Machinery and the like.
//!
//! Each file's NamespaceUris are mapped onto the server's NamespaceArray -
//! to an existing entry when the URI is already there (namespace 0, an
//! earlier file's model), else appended - and every NodeId, BrowseName,
//! alias, reference and value is rewritten to the server's indexes. The
//! file's RequiredModels must be namespace 0 (of at least the required
//! version and publication date) or models loaded by earlier files.
//!
//! The nodes join the [`AddressSpace`] (references made two-way, so they are
//! browsable), each new namespace gets an [`InMemoryNodeManager`] holding its
//! variables' values (writable per AccessLevel), and DataTypes get their
//! DataTypeDefinition from the `<Definition>` element. Initial values are
//! converted from the XML encoding; structure values are encoded to binary
//! ExtensionObjects generically from the StructureDefinition (nested
//! structures, arrays, optional fields, unions), so clients decode them
//! with the type's definition; namespace-0 structures come out typed.
//!
//! Every problem - unreadable file, malformed XML, unknown alias or
//! namespace index, duplicate NodeId, dangling reference, missing model,
//! unconvertible value - is a [`NodeSetError`] naming the file, line and
//! column; loading never panics. A failed load leaves the address space
//! partly filled: the server refuses to start then.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use roxmltree::{Document, Node as X};
use uascale_types::{
    Array, ArrayValues, BinaryDecode, BinaryEncode, ByteString, DateTime, DecodeLimits,
    EnumDefinition, EnumField, ExpandedNodeId, ExtensionObject, Guid, LocalizedText, NodeClass,
    NodeId, QualifiedName, Reader, StatusCode, StructureDefinition, StructureField, StructureType,
    UaString, Variant, XmlElement,
};

use crate::address_space::{AddressSpace, Node, Reference, Translations};
use crate::node_manager::{InMemoryNodeManager, NodeManagers};

const NODESET_NS: &str = "http://opcfoundation.org/UA/2011/03/UANodeSet.xsd";

/// The namespace-0 model this server carries (`Opc.Ua.NodeSet2.Services.xml`).
pub const NS0_MODEL_URI: &str = "http://opcfoundation.org/UA/";
/// Its version.
pub const NS0_MODEL_VERSION: &str = "1.05.03";
/// Its publication date.
pub const NS0_PUBLICATION_DATE: &str = "2023-12-15T00:00:00Z";

const HAS_ENCODING: u32 = 38;
const HAS_SUBTYPE: u32 = 45;
const STRUCTURE: u32 = 22;
const ENUMERATION: u32 = 29;
/// Deepest nesting of structures in a value.
const MAX_DEPTH: usize = 32;

/// A NodeSet file that cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetError {
    /// The file, as given.
    pub file: String,
    /// 1-based line of the offending element (0: the file as a whole).
    pub line: u32,
    /// 1-based column.
    pub column: u32,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for NodeSetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for NodeSetError {}

impl NodeSetError {
    /// The status a caller reports: the configuration is unusable.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::BadConfigurationError
    }
}

/// A model a file defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedModel {
    /// ModelUri.
    pub uri: String,
    /// Version ("" when the file gives none).
    pub version: String,
    /// PublicationDate ("" when none).
    pub publication_date: String,
}

/// What one file added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedFile {
    /// The models it defined.
    pub models: Vec<LoadedModel>,
    /// Its NamespaceUris with the server index each was mapped to.
    pub namespaces: Vec<(String, u16)>,
    /// Nodes added.
    pub nodes: usize,
}

/// Loads NodeSet files, in order, into an address space.
pub struct Loader<'a> {
    space: &'a mut AddressSpace,
    /// The server's NamespaceArray as it grows.
    namespaces: Vec<String>,
    /// Indexes below this belong to the server (0, 1, the demo, user
    /// managers): files may not add nodes there.
    first_free: usize,
    managers: HashMap<u16, InMemoryNodeManager>,
    models: Vec<LoadedModel>,
}

impl std::fmt::Debug for Loader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("namespaces", &self.namespaces)
            .field("models", &self.models)
            .finish()
    }
}

/// Loads `paths` in order after the namespaces `managers` already serves,
/// registers a node manager for each new namespace, and returns what each
/// file added.
pub fn load_files(
    paths: &[std::path::PathBuf],
    space: &mut AddressSpace,
    managers: &mut NodeManagers,
    application_uri: &str,
) -> Result<Vec<LoadedFile>, NodeSetError> {
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let existing = managers
        .namespace_array(application_uri)
        .into_iter()
        .map(|u| u.as_str().unwrap_or("").to_owned())
        .collect();
    let mut loader = Loader::new(space, existing);
    let mut out = Vec::new();
    for p in paths {
        let loaded = loader.load_file(p)?;
        tracing::info!(
            file = %p.display(),
            nodes = loaded.nodes,
            models = ?loaded.models.iter().map(|m| m.uri.as_str()).collect::<Vec<_>>(),
            namespaces = ?loaded.namespaces,
            "nodeset loaded"
        );
        out.push(loaded);
    }
    loader.finish(managers);
    Ok(out)
}

struct Pending<'x> {
    node: Node,
    at: X<'x, 'x>,
    value: Option<X<'x, 'x>>,
    definition: Option<X<'x, 'x>>,
}

impl<'a> Loader<'a> {
    /// A loader over `space`, whose server has `namespace_array` so far.
    pub fn new(space: &'a mut AddressSpace, namespace_array: Vec<String>) -> Self {
        let first_free = namespace_array.len().max(2);
        Loader {
            space,
            namespaces: namespace_array,
            first_free,
            managers: HashMap::new(),
            models: Vec::new(),
        }
    }

    /// Reads and loads one file.
    pub fn load_file(&mut self, path: &Path) -> Result<LoadedFile, NodeSetError> {
        let name = path.display().to_string();
        let xml = std::fs::read_to_string(path).map_err(|e| NodeSetError {
            file: name.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        })?;
        self.load_str(&xml, &name)
    }

    /// Registers a node manager for every namespace the files added; the
    /// NamespaceArray then lists their URIs.
    pub fn finish(self, managers: &mut NodeManagers) {
        let mut all: Vec<(u16, InMemoryNodeManager)> = self.managers.into_iter().collect();
        all.sort_by_key(|(i, _)| *i);
        for (i, m) in all {
            managers.register(i, Arc::new(m));
        }
    }

    /// Loads one document (`file` names it in errors).
    pub fn load_str(&mut self, xml: &str, file: &str) -> Result<LoadedFile, NodeSetError> {
        let doc = Document::parse(xml).map_err(|e| NodeSetError {
            file: file.to_owned(),
            line: e.pos().row,
            column: e.pos().col,
            message: format!("not well-formed XML: {e}"),
        })?;
        let root = doc.root_element();
        let mut f = FileCtx {
            file,
            doc: &doc,
            ns_map: vec![0],
            aliases: HashMap::new(),
        };
        if root.tag_name().name() != "UANodeSet" || root.tag_name().namespace() != Some(NODESET_NS)
        {
            return Err(f.err(
                root,
                "the root element is not a UANodeSet (NodeSet2 schema)",
            ));
        }
        let mut namespaces = Vec::new();
        if let Some(uris) = child(root, "NamespaceUris") {
            for u in elements(uris) {
                let uri = text(u);
                if uri.is_empty() {
                    return Err(f.err(u, "empty namespace URI"));
                }
                let index = match self.namespaces.iter().position(|x| x == uri) {
                    Some(i) => i,
                    None => {
                        self.namespaces.push(uri.to_owned());
                        self.namespaces.len() - 1
                    }
                };
                let index =
                    u16::try_from(index).map_err(|_| f.err(u, "more than 65,535 namespaces"))?;
                f.ns_map.push(index);
                namespaces.push((uri.to_owned(), index));
            }
        }
        let models = self.check_models(&f, root)?;
        if let Some(a) = child(root, "Aliases") {
            for al in elements(a) {
                let name = al
                    .attribute("Alias")
                    .ok_or_else(|| f.err(al, "Alias without its Alias attribute"))?;
                let id = f.parse_node_id(text(al), al)?;
                f.aliases.insert(name.to_owned(), id);
            }
        }
        // Every node first (values may use types defined further down).
        let mut pending: Vec<Pending<'_>> = Vec::new();
        let mut ids: HashMap<NodeId, usize> = HashMap::new();
        for n in elements(root) {
            let tag = n.tag_name().name();
            if matches!(
                tag,
                "NamespaceUris" | "ServerUris" | "Models" | "Aliases" | "Extensions"
            ) {
                continue;
            }
            let p = self.parse_node(&f, n)?;
            let ns = usize::from(p.node.node_id.namespace);
            if ns < self.first_free {
                return Err(f.err(
                    n,
                    format!(
                        "node {} is in namespace {} ({}), which belongs to the server",
                        p.node.node_id,
                        ns,
                        self.namespaces.get(ns).map_or("", String::as_str)
                    ),
                ));
            }
            if self.space.get(&p.node.node_id).is_some() || ids.contains_key(&p.node.node_id) {
                return Err(f.err(n, format!("duplicate NodeId {}", p.node.node_id)));
            }
            ids.insert(p.node.node_id.clone(), pending.len());
            pending.push(p);
        }
        // References must point somewhere, through a ReferenceType.
        for p in &pending {
            for r in &p.node.references {
                let class_of = |id: &NodeId| {
                    ids.get(id)
                        .and_then(|&i| pending.get(i))
                        .map(|q| q.node.node_class)
                        .or_else(|| self.space.get(id).map(|n| n.node_class))
                };
                if class_of(&r.reference_type) != Some(NodeClass::ReferenceType) {
                    return Err(f.err(
                        p.at,
                        format!(
                            "node {}: reference type {} is not a known ReferenceType",
                            p.node.node_id, r.reference_type
                        ),
                    ));
                }
                if class_of(&r.target).is_none() {
                    return Err(f.err(
                        p.at,
                        format!(
                            "node {}: reference to {}, which is neither in this file nor \
                             loaded (is a RequiredModel missing?)",
                            p.node.node_id, r.target
                        ),
                    ));
                }
            }
        }
        let count = pending.len();
        let mut later = Vec::new();
        let mut nodes = Vec::with_capacity(count);
        for p in pending {
            later.push((p.node.node_id.clone(), p.at, p.value, p.definition));
            nodes.push(p.node);
        }
        self.space.insert_all(nodes);
        // Definitions, then values (which are encoded through them).
        for (id, _, _, def) in &later {
            if let Some(d) = def {
                let v = definition(self.space, &f, id, *d)?;
                if let Some(n) = self.space.get_mut(id) {
                    n.data_type_definition = v;
                }
            }
        }
        for (id, at, value, _) in &later {
            let Some(node) = self.space.get(id) else {
                continue;
            };
            let v = match value {
                Some(v) => {
                    let conv = ValueCtx {
                        space: self.space,
                        f: &f,
                    };
                    conv.value(*v).map_err(|e| {
                        let mut err = f.err(*at, format!("node {id}: value: {}", e.message));
                        if let Some(p) = e.pos {
                            let pos = f.doc.text_pos_at(p);
                            (err.line, err.column) = (pos.row, pos.col);
                        }
                        err
                    })?
                }
                None => Variant::Empty,
            };
            let is_var = node.node_class == NodeClass::Variable;
            if let Some(n) = self.space.get_mut(id) {
                n.value = v.clone();
            }
            if is_var {
                let uri = self
                    .namespaces
                    .get(usize::from(id.namespace))
                    .cloned()
                    .unwrap_or_default();
                self.managers
                    .entry(id.namespace)
                    .or_insert_with(|| InMemoryNodeManager::new(uri))
                    .hold(id.clone(), v);
            }
        }
        // Namespaces without variables still get their index served.
        for (uri, i) in &namespaces {
            if usize::from(*i) >= self.first_free {
                self.managers
                    .entry(*i)
                    .or_insert_with(|| InMemoryNodeManager::new(uri.clone()));
            }
        }
        self.models.extend(models.iter().cloned());
        Ok(LoadedFile {
            models,
            namespaces,
            nodes: count,
        })
    }

    fn known_model(&self, uri: &str) -> Option<LoadedModel> {
        if uri == NS0_MODEL_URI {
            return Some(LoadedModel {
                uri: uri.to_owned(),
                version: NS0_MODEL_VERSION.to_owned(),
                publication_date: NS0_PUBLICATION_DATE.to_owned(),
            });
        }
        self.models.iter().find(|m| m.uri == uri).cloned()
    }

    fn check_models(
        &self,
        f: &FileCtx<'_>,
        root: X<'_, '_>,
    ) -> Result<Vec<LoadedModel>, NodeSetError> {
        let mut out = Vec::new();
        let Some(models) = child(root, "Models") else {
            return Ok(out);
        };
        for m in elements(models) {
            let uri = m
                .attribute("ModelUri")
                .ok_or_else(|| f.err(m, "Model without ModelUri"))?;
            if self.known_model(uri).is_some() {
                return Err(f.err(m, format!("model {uri} is already loaded")));
            }
            for req in elements(m).filter(|r| r.tag_name().name() == "RequiredModel") {
                let ruri = req
                    .attribute("ModelUri")
                    .ok_or_else(|| f.err(req, "RequiredModel without ModelUri"))?;
                let rver = req.attribute("Version").unwrap_or("");
                let rdate = req.attribute("PublicationDate").unwrap_or("");
                let Some(have) = self.known_model(ruri) else {
                    return Err(f.err(
                        req,
                        format!(
                            "model {uri} requires model {ruri} (version {}), which is not \
                             loaded: give its NodeSet first, with an earlier --nodeset",
                            if rver.is_empty() { "any" } else { rver }
                        ),
                    ));
                };
                if version_older(&have.version, rver) || date_older(&have.publication_date, rdate) {
                    return Err(f.err(
                        req,
                        format!(
                            "model {uri} requires {ruri} version {rver} of {rdate} or later; \
                             the loaded one is version {} of {}",
                            have.version, have.publication_date
                        ),
                    ));
                }
            }
            out.push(LoadedModel {
                uri: uri.to_owned(),
                version: m.attribute("Version").unwrap_or("").to_owned(),
                publication_date: m.attribute("PublicationDate").unwrap_or("").to_owned(),
            });
        }
        Ok(out)
    }

    fn parse_node<'x>(&self, f: &FileCtx<'_>, n: X<'x, 'x>) -> Result<Pending<'x>, NodeSetError> {
        let class = match n.tag_name().name() {
            "UAObject" => NodeClass::Object,
            "UAVariable" => NodeClass::Variable,
            "UAMethod" => NodeClass::Method,
            "UAObjectType" => NodeClass::ObjectType,
            "UAVariableType" => NodeClass::VariableType,
            "UAReferenceType" => NodeClass::ReferenceType,
            "UADataType" => NodeClass::DataType,
            "UAView" => NodeClass::View,
            other => return Err(f.err(n, format!("unexpected element <{other}>"))),
        };
        let id_text = n
            .attribute("NodeId")
            .ok_or_else(|| f.err(n, "node without a NodeId attribute"))?;
        let node_id = f.node_id(id_text, n)?;
        let browse = n
            .attribute("BrowseName")
            .ok_or_else(|| f.err(n, format!("node {id_text} without a BrowseName")))?;
        let mut node = Node::new(class, node_id, f.qualified(browse, n)?);
        let num = |attr: &str| -> Option<&str> { n.attribute(attr) };
        let flag = |attr: &str, default: bool| -> Result<bool, NodeSetError> {
            match num(attr) {
                None => Ok(default),
                Some("true") | Some("1") => Ok(true),
                Some("false") | Some("0") => Ok(false),
                Some(v) => Err(f.err(n, format!("{attr}={v:?} is not a boolean"))),
            }
        };
        macro_rules! number {
            ($attr:expr, $default:expr) => {
                match num($attr) {
                    None => $default,
                    Some(v) => v
                        .trim()
                        .parse()
                        .map_err(|_| f.err(n, format!("{}={v:?} is not a number", $attr)))?,
                }
            };
        }
        let names: Vec<LocalizedText> = elements(n)
            .filter(|c| c.tag_name().name() == "DisplayName")
            .map(localized)
            .collect();
        let descriptions: Vec<LocalizedText> = elements(n)
            .filter(|c| c.tag_name().name() == "Description")
            .map(localized)
            .collect();
        if let Some(d) = names.first() {
            node.display_name = d.clone();
        }
        if let Some(d) = descriptions.first() {
            node.description = d.clone();
        }
        if names.len() > 1 || descriptions.len() > 1 {
            node.translations = Some(Box::new(Translations {
                display_name: names,
                description: descriptions,
            }));
        }
        node.write_mask = number!("WriteMask", 0);
        node.is_abstract = flag("IsAbstract", false)?;
        node.symmetric = flag("Symmetric", false)?;
        node.historizing = flag("Historizing", false)?;
        node.executable = flag("Executable", true)?;
        node.contains_no_loops = flag("ContainsNoLoops", false)?;
        node.event_notifier = number!("EventNotifier", 0);
        if let Some(inv) = child(n, "InverseName") {
            node.inverse_name = localized(inv);
        }
        if matches!(class, NodeClass::Variable | NodeClass::VariableType) {
            node.data_type = f.node_id(num("DataType").unwrap_or("i=24"), n)?;
            node.value_rank = number!("ValueRank", -1);
            node.array_dimensions = match num("ArrayDimensions") {
                None | Some("") => None,
                Some(d) => Some(
                    d.split(',')
                        .map(|x| {
                            x.trim().parse().map_err(|_| {
                                f.err(n, format!("ArrayDimensions={d:?} is not a list of numbers"))
                            })
                        })
                        .collect::<Result<_, _>>()?,
                ),
            };
            node.access_level = number!("AccessLevel", 1);
            node.minimum_sampling_interval = number!("MinimumSamplingInterval", 0.0);
        }
        for r in child(n, "References").into_iter().flat_map(elements) {
            let ty = r
                .attribute("ReferenceType")
                .ok_or_else(|| f.err(r, "Reference without a ReferenceType"))?;
            node.references.push(Reference {
                reference_type: f.node_id(ty, r)?,
                is_forward: match r.attribute("IsForward") {
                    None | Some("true") | Some("1") => true,
                    Some("false") | Some("0") => false,
                    Some(v) => return Err(f.err(r, format!("IsForward={v:?} is not a boolean"))),
                },
                target: f.node_id(text(r), r)?,
            });
        }
        Ok(Pending {
            node,
            at: n,
            value: child(n, "Value"),
            definition: if class == NodeClass::DataType {
                child(n, "Definition")
            } else {
                None
            },
        })
    }
}

/// True when dotted version `have` is below `want` (numeric parts compared
/// as numbers; versions that are not dotted numbers are not compared).
fn version_older(have: &str, want: &str) -> bool {
    let parse =
        |v: &str| -> Option<Vec<u64>> { v.split('.').map(|p| p.trim().parse().ok()).collect() };
    match (parse(have), parse(want)) {
        (Some(h), Some(w)) if !want.is_empty() => h < w,
        _ => false,
    }
}

fn date_older(have: &str, want: &str) -> bool {
    match (DateTime::parse_rfc3339(have), DateTime::parse_rfc3339(want)) {
        (Some(h), Some(w)) => h < w,
        _ => false,
    }
}

struct FileCtx<'d> {
    file: &'d str,
    doc: &'d Document<'d>,
    /// File namespace index -> server index.
    ns_map: Vec<u16>,
    aliases: HashMap<String, NodeId>,
}

impl FileCtx<'_> {
    fn err(&self, at: X<'_, '_>, message: impl Into<String>) -> NodeSetError {
        let pos = self.doc.text_pos_at(at.range().start);
        NodeSetError {
            file: self.file.to_owned(),
            line: pos.row,
            column: pos.col,
            message: message.into(),
        }
    }

    fn remap(&self, ns: u16, at: X<'_, '_>) -> Result<u16, NodeSetError> {
        self.ns_map.get(usize::from(ns)).copied().ok_or_else(|| {
            self.err(
                at,
                format!("namespace index {ns} is not in the file's NamespaceUris"),
            )
        })
    }

    /// A NodeId in the file's text form (no aliases), remapped.
    fn parse_node_id(&self, s: &str, at: X<'_, '_>) -> Result<NodeId, NodeSetError> {
        let mut id: NodeId = s
            .trim()
            .parse()
            .map_err(|e| self.err(at, format!("{s:?} is not a NodeId: {e}")))?;
        id.namespace = self.remap(id.namespace, at)?;
        Ok(id)
    }

    /// An alias or a NodeId, remapped.
    fn node_id(&self, s: &str, at: X<'_, '_>) -> Result<NodeId, NodeSetError> {
        match self.aliases.get(s.trim()) {
            Some(id) => Ok(id.clone()),
            None => self.parse_node_id(s, at),
        }
    }

    /// `"2:Name"` or `"Name"`, remapped.
    fn qualified(&self, s: &str, at: X<'_, '_>) -> Result<QualifiedName, NodeSetError> {
        match s.split_once(':') {
            Some((ns, name)) if !ns.is_empty() && ns.bytes().all(|b| b.is_ascii_digit()) => {
                let ns: u16 = ns
                    .parse()
                    .map_err(|_| self.err(at, format!("{s:?}: namespace index too large")))?;
                Ok(QualifiedName::new(self.remap(ns, at)?, name))
            }
            _ => Ok(QualifiedName::new(0, s)),
        }
    }
}

fn elements<'a, 'i>(n: X<'a, 'i>) -> impl Iterator<Item = X<'a, 'i>> {
    n.children().filter(|c| c.is_element())
}

fn child<'a, 'i>(n: X<'a, 'i>, name: &str) -> Option<X<'a, 'i>> {
    elements(n).find(|c| c.tag_name().name() == name)
}

fn text<'a>(n: X<'a, '_>) -> &'a str {
    n.text().map(str::trim).unwrap_or("")
}

fn localized(n: X<'_, '_>) -> LocalizedText {
    LocalizedText {
        locale: n
            .attribute("Locale")
            .map_or(UaString::null(), UaString::from),
        text: UaString::from(text(n)),
    }
}

/// The "Default Binary" encoding node of DataType `id`.
fn binary_encoding(space: &AddressSpace, id: &NodeId) -> Option<NodeId> {
    space.get(id)?.references.iter().find_map(|r| {
        (r.is_forward && r.reference_type == NodeId::ns0(HAS_ENCODING))
            .then_some(&r.target)
            .filter(|t| {
                space
                    .get(t)
                    .is_some_and(|e| e.browse_name == QualifiedName::new(0, "Default Binary"))
            })
            .cloned()
    })
}

fn supertype(space: &AddressSpace, id: &NodeId) -> Option<NodeId> {
    space.get(id)?.references.iter().find_map(|r| {
        (!r.is_forward && r.reference_type == NodeId::ns0(HAS_SUBTYPE)).then(|| r.target.clone())
    })
}

/// The DataTypeDefinition of DataType `id` from its `<Definition>`.
fn definition(
    space: &AddressSpace,
    f: &FileCtx<'_>,
    id: &NodeId,
    d: X<'_, '_>,
) -> Result<Variant, NodeSetError> {
    let fields: Vec<X<'_, '_>> = elements(d)
        .filter(|c| c.tag_name().name() == "Field")
        .collect();
    let name_of = |fx: X<'_, '_>| -> Result<String, NodeSetError> {
        fx.attribute("Name")
            .map(str::to_owned)
            .ok_or_else(|| f.err(fx, "Field without a Name"))
    };
    if space.is_subtype_of(id, &NodeId::ns0(ENUMERATION))
        || d.attribute("IsOptionSet") == Some("true")
    {
        let mut out = Vec::with_capacity(fields.len());
        for fx in &fields {
            let name = name_of(*fx)?;
            let value = match fx.attribute("Value") {
                None => 0,
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| f.err(*fx, format!("Value={v:?} is not a number")))?,
            };
            out.push(EnumField {
                value,
                display_name: child(*fx, "DisplayName")
                    .map_or_else(|| LocalizedText::text(&name), localized),
                description: child(*fx, "Description")
                    .map_or_else(LocalizedText::default, localized),
                name: UaString::from(name),
            });
        }
        return Ok(Variant::from(ExtensionObject::new(EnumDefinition {
            fields: Some(out),
        })));
    }
    if !space.is_subtype_of(id, &NodeId::ns0(STRUCTURE)) {
        return Err(f.err(
            d,
            format!("DataType {id} has a Definition but is neither a Structure nor an Enumeration"),
        ));
    }
    let flag = |fx: X<'_, '_>, a: &str| fx.attribute(a) == Some("true");
    let union = d.attribute("IsUnion") == Some("true");
    let subtyped = fields.iter().any(|x| flag(*x, "AllowSubTypes"));
    let optional = fields.iter().any(|x| flag(*x, "IsOptional"));
    let structure_type = match (union, subtyped, optional) {
        (true, true, _) => StructureType::UnionWithSubtypedValues,
        (true, false, _) => StructureType::Union,
        (false, true, _) => StructureType::StructureWithSubtypedValues,
        (false, false, true) => StructureType::StructureWithOptionalFields,
        (false, false, false) => StructureType::Structure,
    };
    let mut out = Vec::with_capacity(fields.len());
    for fx in &fields {
        let name = name_of(*fx)?;
        let data_type = f.node_id(fx.attribute("DataType").unwrap_or("i=24"), *fx)?;
        if space.get(&data_type).map(|n| n.node_class) != Some(NodeClass::DataType) {
            return Err(f.err(
                *fx,
                format!("field {name}: DataType {data_type} is not a known DataType"),
            ));
        }
        let number = |a: &str| -> Result<Option<i64>, NodeSetError> {
            fx.attribute(a)
                .map(|v| {
                    v.trim()
                        .parse()
                        .map_err(|_| f.err(*fx, format!("field {name}: {a}={v:?} is not a number")))
                })
                .transpose()
        };
        out.push(StructureField {
            name: UaString::from(name.as_str()),
            description: child(*fx, "Description").map_or_else(LocalizedText::default, localized),
            data_type,
            value_rank: number("ValueRank")?.map_or(-1, |v| v as i32),
            array_dimensions: match fx.attribute("ArrayDimensions") {
                None | Some("") => None,
                Some(a) => Some(
                    a.split(',')
                        .map(|x| {
                            x.trim().parse().map_err(|_| {
                                f.err(*fx, format!("field {name}: ArrayDimensions={a:?}"))
                            })
                        })
                        .collect::<Result<_, _>>()?,
                ),
            },
            max_string_length: number("MaxStringLength")?.map_or(0, |v| v as u32),
            is_optional: flag(*fx, "IsOptional"),
        });
    }
    Ok(Variant::from(ExtensionObject::new(StructureDefinition {
        default_encoding_id: binary_encoding(space, id).unwrap_or(NodeId::NULL),
        base_data_type: supertype(space, id).unwrap_or(NodeId::NULL),
        structure_type,
        fields: Some(out),
    })))
}

/// A value conversion failure, at an element (its byte offset) when known.
struct ValueError {
    pos: Option<usize>,
    message: String,
}

type VResult<T> = Result<T, ValueError>;

fn verr<T>(at: X<'_, '_>, message: impl Into<String>) -> VResult<T> {
    verr_opt(Some(at), message)
}

fn verr_opt<T>(at: Option<X<'_, '_>>, message: impl Into<String>) -> VResult<T> {
    Err(ValueError {
        pos: at.map(|a| a.range().start),
        message: message.into(),
    })
}

struct ValueCtx<'s> {
    space: &'s AddressSpace,
    f: &'s FileCtx<'s>,
}

const BUILTIN_NAMES: [&str; 25] = [
    "Boolean",
    "SByte",
    "Byte",
    "Int16",
    "UInt16",
    "Int32",
    "UInt32",
    "Int64",
    "UInt64",
    "Float",
    "Double",
    "String",
    "DateTime",
    "Guid",
    "ByteString",
    "XmlElement",
    "NodeId",
    "ExpandedNodeId",
    "StatusCode",
    "QualifiedName",
    "LocalizedText",
    "ExtensionObject",
    "DataValue",
    "Variant",
    "DiagnosticInfo",
];

/// How a field of some DataType is encoded.
enum Kind {
    /// Built-in type 1..=25.
    Builtin(u32),
    /// An Enumeration: Int32.
    Enum,
    /// A concrete structure with a definition.
    Structure(NodeId),
}

fn num<T: std::str::FromStr>(n: X<'_, '_>, what: &str) -> VResult<T> {
    let t = text(n);
    t.parse()
        .or_else(|_| verr(n, format!("{t:?} is not a valid {what}")))
}

/// How DataType `dt` is encoded; `None` when it is not known.
fn kind_of(space: &AddressSpace, dt: &NodeId) -> Option<Kind> {
    if let Some(n) = dt.as_ns0().filter(|n| (1..=25).contains(n)) {
        return Some(Kind::Builtin(n));
    }
    if space.is_subtype_of(dt, &NodeId::ns0(ENUMERATION)) {
        return Some(Kind::Enum);
    }
    if space.is_subtype_of(dt, &NodeId::ns0(STRUCTURE)) {
        return Some(Kind::Structure(dt.clone()));
    }
    space.builtin_base(dt).map(Kind::Builtin)
}

fn structure_definition<'s>(
    space: &'s AddressSpace,
    dt: &NodeId,
) -> Option<&'s StructureDefinition> {
    match &space.get(dt)?.data_type_definition {
        Variant::ExtensionObject(e) => e.downcast_ref::<StructureDefinition>(),
        _ => None,
    }
}

/// True when `body` is exactly one binary encoding of structure `dt`,
/// walked field by field through its StructureDefinition (nested
/// structures, arrays, optional fields, unions) under `limits`. Written
/// ExtensionObjects of companion types are checked with it, so what a
/// client reads back always decodes.
pub fn structure_body_is_valid(
    space: &AddressSpace,
    dt: &NodeId,
    body: &[u8],
    limits: &DecodeLimits,
) -> bool {
    let limits = DecodeLimits {
        max_message_size: body.len().max(1),
        ..limits.clone()
    };
    let Ok(mut r) = Reader::new(body, &limits) else {
        return false;
    };
    skip_structure(space, dt, &mut r, 0).is_some() && r.remaining() == 0
}

fn skip_structure(
    space: &AddressSpace,
    dt: &NodeId,
    r: &mut Reader<'_>,
    depth: usize,
) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let def = structure_definition(space, dt)?;
    let fields = def.fields.as_deref().unwrap_or(&[]);
    match def.structure_type {
        // Which fields carry a subtype is not in the definition's fields.
        StructureType::StructureWithSubtypedValues | StructureType::UnionWithSubtypedValues => None,
        StructureType::Union => {
            let switch = u32::decode(r).ok()?;
            if switch == 0 {
                return Some(());
            }
            let f = fields.get(usize::try_from(switch - 1).ok()?)?;
            skip_field(space, f, r, depth)
        }
        StructureType::StructureWithOptionalFields => {
            let mask = u32::decode(r).ok()?;
            let mut bit = 0u32;
            for f in fields {
                if f.is_optional {
                    let present = bit < 32 && mask & (1 << bit) != 0;
                    bit += 1;
                    if !present {
                        continue;
                    }
                }
                skip_field(space, f, r, depth)?;
            }
            Some(())
        }
        _ => fields
            .iter()
            .try_for_each(|f| skip_field(space, f, r, depth)),
    }
}

fn skip_field(
    space: &AddressSpace,
    f: &StructureField,
    r: &mut Reader<'_>,
    depth: usize,
) -> Option<()> {
    let kind = kind_of(space, &f.data_type)?;
    if f.value_rank >= 0 {
        let n = i32::decode(r).ok()?;
        if n < 0 {
            return Some(());
        }
        // Every element takes at least one byte.
        if usize::try_from(n).ok()? > r.remaining() {
            return None;
        }
        for _ in 0..n {
            skip_scalar(space, &kind, r, depth)?;
        }
        return Some(());
    }
    skip_scalar(space, &kind, r, depth)
}

fn skip_scalar(space: &AddressSpace, kind: &Kind, r: &mut Reader<'_>, depth: usize) -> Option<()> {
    fn take<T: BinaryDecode>(r: &mut Reader<'_>) -> Option<()> {
        T::decode(r).ok().map(drop)
    }
    match kind {
        Kind::Enum => take::<i32>(r),
        Kind::Structure(dt) => skip_structure(space, dt, r, depth + 1),
        Kind::Builtin(id) => match id {
            1 => take::<bool>(r),
            2 => take::<i8>(r),
            3 => take::<u8>(r),
            4 => take::<i16>(r),
            5 => take::<u16>(r),
            6 => take::<i32>(r),
            7 => take::<u32>(r),
            8 => take::<i64>(r),
            9 => take::<u64>(r),
            10 => take::<f32>(r),
            11 => take::<f64>(r),
            12 => take::<UaString>(r),
            13 => take::<DateTime>(r),
            14 => take::<Guid>(r),
            15 => take::<ByteString>(r),
            16 => take::<XmlElement>(r),
            17 => take::<NodeId>(r),
            18 => take::<ExpandedNodeId>(r),
            19 => take::<StatusCode>(r),
            20 => take::<QualifiedName>(r),
            21 => take::<LocalizedText>(r),
            22 => take::<ExtensionObject>(r),
            23 => take::<uascale_types::DataValue>(r),
            24 => take::<Variant>(r),
            25 => take::<uascale_types::DiagnosticInfo>(r),
            _ => None,
        },
    }
}

impl ValueCtx<'_> {
    fn kind(&self, dt: &NodeId, at: Option<X<'_, '_>>) -> VResult<Kind> {
        match kind_of(self.space, dt) {
            Some(k) => Ok(k),
            None => verr_opt(at, format!("DataType {dt} is not known")),
        }
    }

    /// A `<Value>` element's content.
    fn value(&self, v: X<'_, '_>) -> VResult<Variant> {
        let Some(e) = elements(v).next() else {
            return Ok(Variant::Empty);
        };
        let name = e.tag_name().name();
        match name.strip_prefix("ListOf") {
            Some(ty) => {
                let id = builtin_id(ty).map_or_else(
                    || verr(e, format!("<{name}> is not a list of a built-in type")),
                    Ok,
                )?;
                let items = elements(e)
                    .map(|c| self.builtin(id, c))
                    .collect::<VResult<Vec<_>>>()?;
                array_of(id, items).map_or_else(
                    || verr(e, format!("<{name}>: an element of another type")),
                    Ok,
                )
            }
            None if name == "Matrix" => verr(e, "Matrix values are not supported"),
            None => {
                let id = builtin_id(name)
                    .map_or_else(|| verr(e, format!("<{name}> is not a built-in type")), Ok)?;
                self.builtin(id, e)
            }
        }
    }

    /// One built-in value in its XML encoding.
    fn builtin(&self, ty: u32, n: X<'_, '_>) -> VResult<Variant> {
        let t = text(n);
        let f = self.f;
        let remap = |id: &mut NodeId| -> VResult<()> {
            id.namespace = f.remap(id.namespace, n).map_err(|e| ValueError {
                pos: Some(n.range().start),
                message: e.message,
            })?;
            Ok(())
        };
        Ok(match ty {
            1 => Variant::Boolean(match t {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return verr(n, format!("{t:?} is not a Boolean")),
            }),
            2 => Variant::SByte(num(n, "SByte")?),
            3 => Variant::Byte(num(n, "Byte")?),
            4 => Variant::Int16(num(n, "Int16")?),
            5 => Variant::UInt16(num(n, "UInt16")?),
            6 => Variant::Int32(num(n, "Int32")?),
            7 => Variant::UInt32(num(n, "UInt32")?),
            8 => Variant::Int64(num(n, "Int64")?),
            9 => Variant::UInt64(num(n, "UInt64")?),
            10 => Variant::Float(num(n, "Float")?),
            11 => Variant::Double(num(n, "Double")?),
            12 => Variant::String(UaString::from(n.text().unwrap_or(""))),
            13 => Variant::DateTime(
                DateTime::parse_rfc3339(t)
                    .map_or_else(|| verr(n, format!("{t:?} is not a DateTime")), Ok)?,
            ),
            14 => {
                let s = child(n, "String").map_or(t, text);
                Variant::Guid(
                    s.parse::<Guid>()
                        .or_else(|_| verr(n, format!("{s:?} is not a Guid")))?,
                )
            }
            15 => {
                let b64: String = t.chars().filter(|c| !c.is_whitespace()).collect();
                Variant::ByteString(ByteString::new(
                    uascale_types::base64::decode(&b64)
                        .map_or_else(|| verr(n, "not base64"), Ok)?,
                ))
            }
            16 => Variant::XmlElement(XmlElement(UaString::from(
                elements(n)
                    .next()
                    .map_or("", |e| &f.doc.input_text()[e.range()]),
            ))),
            17 | 18 => {
                let s = child(n, "Identifier").map_or(t, text);
                let mut id: NodeId = s
                    .parse()
                    .or_else(|_| verr(n, format!("{s:?} is not a NodeId")))?;
                remap(&mut id)?;
                if ty == 18 {
                    Variant::from(ExpandedNodeId::local(id))
                } else {
                    Variant::from(id)
                }
            }
            19 => Variant::StatusCode(StatusCode(
                child(n, "Code").map_or(Ok(0), |c| num(c, "StatusCode"))?,
            )),
            20 => {
                let ns: u16 = child(n, "NamespaceIndex").map_or(Ok(0), |c| num(c, "UInt16"))?;
                let ns = f.remap(ns, n).map_err(|e| ValueError {
                    pos: Some(n.range().start),
                    message: e.message,
                })?;
                Variant::from(QualifiedName::new(ns, child(n, "Name").map_or("", text)))
            }
            21 => Variant::from(LocalizedText {
                locale: child(n, "Locale").map_or(UaString::null(), |l| UaString::from(text(l))),
                text: child(n, "Text")
                    .map_or(UaString::null(), |l| UaString::from(l.text().unwrap_or(""))),
            }),
            22 => Variant::from(self.extension_object(n, 0)?),
            24 => match child(n, "Value") {
                Some(v) => self.value(v)?,
                None => Variant::Empty,
            },
            other => {
                return verr(
                    n,
                    format!(
                        "values of {} are not supported",
                        BUILTIN_NAMES
                            .get((other as usize).wrapping_sub(1))
                            .copied()
                            .unwrap_or("this type")
                    ),
                )
            }
        })
    }

    /// An `<ExtensionObject>`: TypeId (an encoding or the DataType) and
    /// Body, encoded to binary through the type's StructureDefinition.
    fn extension_object(&self, n: X<'_, '_>, depth: usize) -> VResult<ExtensionObject> {
        let Some(tid) = child(n, "TypeId").and_then(|t| child(t, "Identifier")) else {
            return verr(n, "ExtensionObject without TypeId/Identifier");
        };
        let mut type_id: NodeId = text(tid)
            .parse()
            .or_else(|_| verr(tid, format!("{:?} is not a NodeId", text(tid))))?;
        type_id.namespace = self
            .f
            .remap(type_id.namespace, tid)
            .map_err(|e| ValueError {
                pos: Some(tid.range().start),
                message: e.message,
            })?;
        let Some(body) = child(n, "Body").and_then(|b| elements(b).next()) else {
            return Ok(ExtensionObject::null());
        };
        // The TypeId names an encoding node (or, loosely, the DataType).
        let dt = match self.space.get(&type_id).map(|x| x.node_class) {
            Some(NodeClass::DataType) => type_id.clone(),
            Some(_) => self
                .space
                .get(&type_id)
                .and_then(|e| {
                    e.references
                        .iter()
                        .find(|r| !r.is_forward && r.reference_type == NodeId::ns0(HAS_ENCODING))
                })
                .map(|r| r.target.clone())
                .map_or_else(
                    || verr(tid, format!("{type_id} is not the encoding of a DataType")),
                    Ok,
                )?,
            None => return verr(tid, format!("TypeId {type_id} is not a known node")),
        };
        let encoding = binary_encoding(self.space, &dt).map_or_else(
            || verr(tid, format!("DataType {dt} has no Default Binary encoding")),
            Ok,
        )?;
        let mut bytes = Vec::new();
        encoding.encode(&mut bytes);
        bytes.push(1);
        let len_at = bytes.len();
        bytes.extend_from_slice(&[0; 4]);
        self.structure(&dt, Some(body), &mut bytes, depth + 1)?;
        let len = i32::try_from(bytes.len() - len_at - 4).unwrap_or(i32::MAX);
        bytes[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
        // Decoding makes namespace-0 structures typed; others stay opaque.
        let limits = DecodeLimits {
            max_message_size: bytes.len().max(1),
            ..DecodeLimits::default()
        };
        Reader::new(&bytes, &limits)
            .and_then(|mut r| ExtensionObject::decode(&mut r))
            .or_else(|e| verr(body, format!("encoded {dt} does not decode: {e}")))
    }

    /// Binary-encodes structure `dt` from its XML element (`None`: every
    /// field at its default).
    fn structure(
        &self,
        dt: &NodeId,
        xml: Option<X<'_, '_>>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> VResult<()> {
        if depth > MAX_DEPTH {
            return verr_opt(xml, "structures nested too deep");
        }
        let Some(def) = structure_definition(self.space, dt) else {
            return verr_opt(xml, format!("DataType {dt} has no StructureDefinition"));
        };
        let fields = def.fields.as_deref().unwrap_or(&[]);
        let field_xml = |name: &str| xml.and_then(|x| child(x, name));
        match def.structure_type {
            StructureType::StructureWithSubtypedValues | StructureType::UnionWithSubtypedValues => {
                return verr_opt(
                    xml,
                    format!("values of {dt} (fields that allow subtypes) are not supported"),
                );
            }
            StructureType::Union => {
                let chosen = fields
                    .iter()
                    .enumerate()
                    .find_map(|(i, fd)| field_xml(fd.name.as_str_or_empty()).map(|x| (i, fd, x)));
                match chosen {
                    None => 0u32.encode(out),
                    Some((i, fd, x)) => {
                        (i as u32 + 1).encode(out);
                        self.field(fd, Some(x), out, depth)?;
                    }
                }
            }
            StructureType::StructureWithOptionalFields => {
                let mut mask = 0u32;
                for (bit, fd) in fields.iter().filter(|fd| fd.is_optional).enumerate() {
                    if bit >= 32 {
                        return verr_opt(xml, format!("{dt} has more than 32 optional fields"));
                    }
                    if field_xml(fd.name.as_str_or_empty()).is_some() {
                        mask |= 1 << bit;
                    }
                }
                mask.encode(out);
                for fd in fields {
                    let x = field_xml(fd.name.as_str_or_empty());
                    if fd.is_optional && x.is_none() {
                        continue;
                    }
                    self.field(fd, x, out, depth)?;
                }
            }
            _ => {
                for fd in fields {
                    self.field(fd, field_xml(fd.name.as_str_or_empty()), out, depth)?;
                }
            }
        }
        Ok(())
    }

    fn field(
        &self,
        fd: &StructureField,
        xml: Option<X<'_, '_>>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> VResult<()> {
        let kind = self.kind(&fd.data_type, xml)?;
        if fd.value_rank >= 1 || fd.value_rank == 0 {
            match xml {
                None => (-1i32).encode(out),
                Some(list) => {
                    let items: Vec<X<'_, '_>> = elements(list).collect();
                    i32::try_from(items.len()).unwrap_or(i32::MAX).encode(out);
                    for item in items {
                        self.scalar(&kind, Some(item), out, depth)?;
                    }
                }
            }
            return Ok(());
        }
        self.scalar(&kind, xml, out, depth)
    }

    fn scalar(
        &self,
        kind: &Kind,
        xml: Option<X<'_, '_>>,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> VResult<()> {
        match kind {
            Kind::Enum => {
                let v: i32 = match xml.map(text) {
                    None | Some("") => 0,
                    // `Running_1` or `1`.
                    Some(t) => match t.rsplit('_').next().unwrap_or(t).parse() {
                        Ok(v) => v,
                        Err(_) => {
                            return verr_opt(xml, format!("{t:?} is not an enumeration value"))
                        }
                    },
                };
                v.encode(out);
            }
            Kind::Structure(dt) => self.structure(dt, xml, out, depth + 1)?,
            Kind::Builtin(22) => match xml {
                None => ExtensionObject::null().encode(out),
                Some(x) => self.extension_object(x, depth)?.encode(out),
            },
            Kind::Builtin(24) => match xml {
                None => Variant::Empty.encode(out),
                Some(x) => match elements(x).next() {
                    // A field of an abstract type holds a Variant.
                    Some(v) if v.tag_name().name() == "Value" => self.value(v)?.encode(out),
                    _ => self.value(x)?.encode(out),
                },
            },
            Kind::Builtin(id) => {
                let v = match xml {
                    Some(x) => self.builtin(*id, x)?,
                    None => default_of(*id),
                };
                let mut tmp = Vec::new();
                v.encode(&mut tmp);
                match tmp.split_first() {
                    Some((_, rest)) if !v.is_empty() => out.extend_from_slice(rest),
                    _ => return verr_opt(xml, "a field of this type cannot be encoded"),
                }
            }
        }
        Ok(())
    }
}

fn builtin_id(name: &str) -> Option<u32> {
    BUILTIN_NAMES
        .iter()
        .position(|n| *n == name)
        .map(|i| i as u32 + 1)
}

/// The value of a field missing from the XML.
fn default_of(ty: u32) -> Variant {
    match ty {
        1 => Variant::Boolean(false),
        2 => Variant::SByte(0),
        3 => Variant::Byte(0),
        4 => Variant::Int16(0),
        5 => Variant::UInt16(0),
        6 => Variant::Int32(0),
        7 => Variant::UInt32(0),
        8 => Variant::Int64(0),
        9 => Variant::UInt64(0),
        10 => Variant::Float(0.0),
        11 => Variant::Double(0.0),
        12 => Variant::String(UaString::null()),
        13 => Variant::DateTime(DateTime::MIN),
        14 => Variant::Guid(Guid::NULL),
        15 => Variant::ByteString(ByteString::null()),
        16 => Variant::XmlElement(XmlElement(UaString::null())),
        17 => Variant::from(NodeId::NULL),
        18 => Variant::from(ExpandedNodeId::local(NodeId::NULL)),
        19 => Variant::StatusCode(StatusCode::Good),
        20 => Variant::from(QualifiedName::default()),
        21 => Variant::from(LocalizedText::default()),
        _ => Variant::from(ExtensionObject::null()),
    }
}

/// A one-dimensional array of built-in type `ty` from scalars of it;
/// `None` when one is of another type.
fn array_of(ty: u32, items: Vec<Variant>) -> Option<Variant> {
    macro_rules! collect {
        ($name:ident) => {
            ArrayValues::$name(
                items
                    .into_iter()
                    .map(|v| match v {
                        Variant::$name(x) => Some(x),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?,
            )
        };
    }
    macro_rules! collect_boxed {
        ($name:ident) => {
            ArrayValues::$name(
                items
                    .into_iter()
                    .map(|v| match v {
                        Variant::$name(x) => Some(*x),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?,
            )
        };
    }
    let a = match ty {
        1 => collect!(Boolean),
        2 => collect!(SByte),
        3 => collect!(Byte),
        4 => collect!(Int16),
        5 => collect!(UInt16),
        6 => collect!(Int32),
        7 => collect!(UInt32),
        8 => collect!(Int64),
        9 => collect!(UInt64),
        10 => collect!(Float),
        11 => collect!(Double),
        12 => collect!(String),
        13 => collect!(DateTime),
        14 => collect!(Guid),
        15 => collect!(ByteString),
        16 => collect!(XmlElement),
        17 => collect_boxed!(NodeId),
        18 => collect_boxed!(ExpandedNodeId),
        19 => collect!(StatusCode),
        20 => collect_boxed!(QualifiedName),
        21 => collect_boxed!(LocalizedText),
        22 => collect_boxed!(ExtensionObject),
        24 => ArrayValues::Variant(items),
        _ => return None,
    };
    Some(Variant::from(Array::new(a)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address_space::AddressSpace;

    const DEVICES: &str = include_str!("../../../tests/nodesets/devices.NodeSet2.xml");
    const MACHINES: &str = include_str!("../../../tests/nodesets/machines.NodeSet2.xml");
    const DEVICES_URI: &str = "http://uascale.example/Devices/";
    const MACHINES_URI: &str = "http://uascale.example/Machines/";

    /// Namespace 0 and the demo (index 2), as `uascale serve` has them.
    pub(crate) fn base() -> (AddressSpace, NodeManagers) {
        let mut space = AddressSpace::ns0().unwrap();
        let (demo, _) = crate::demo::build(&mut space, 0);
        let mut managers = NodeManagers::default();
        managers.register(crate::demo::NS, demo);
        (space, managers)
    }

    fn load(
        space: &mut AddressSpace,
        managers: &mut NodeManagers,
        files: &[(&str, &str)],
    ) -> Result<Vec<LoadedFile>, NodeSetError> {
        let existing = managers
            .namespace_array("urn:s")
            .into_iter()
            .map(|u| u.as_str().unwrap_or("").to_owned())
            .collect();
        let mut l = Loader::new(space, existing);
        let mut out = Vec::new();
        for (name, xml) in files {
            out.push(l.load_str(xml, name)?);
        }
        l.finish(managers);
        Ok(out)
    }

    /// Both fixtures loaded; Devices lands at 3, Machines at 4.
    pub(crate) fn loaded() -> (AddressSpace, NodeManagers) {
        let (mut space, mut managers) = base();
        load(
            &mut space,
            &mut managers,
            &[("devices.xml", DEVICES), ("machines.xml", MACHINES)],
        )
        .unwrap();
        (space, managers)
    }

    fn m(i: u32) -> NodeId {
        NodeId::numeric(4, i)
    }
    fn d(i: u32) -> NodeId {
        NodeId::numeric(3, i)
    }

    fn opaque(v: &Variant) -> (NodeId, Vec<u8>) {
        match v {
            Variant::ExtensionObject(eo) => match &**eo {
                ExtensionObject::Opaque { type_id, body } => {
                    (type_id.clone(), body.as_bytes().unwrap().to_vec())
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn namespaces_are_remapped_and_nodes_linked() {
        let (space, managers) = loaded();
        let ns = managers.namespace_array("urn:s");
        assert_eq!(ns[3], DEVICES_URI);
        assert_eq!(ns[4], MACHINES_URI);
        assert_eq!(ns.len(), 5);
        // Machines' own ns=2 (Devices) became 3; its ns=1 became 4.
        let serial = space.get(&m(7002)).unwrap();
        assert_eq!(serial.browse_name, QualifiedName::new(3, "SerialNumber"));
        let machine = space.get(&m(7001)).unwrap();
        assert_eq!(machine.browse_name, QualifiedName::new(4, "Machine1"));
        // Objects -> Machine1 made two-way; given-both-ways references kept once.
        let objects = space.get(&NodeId::ns0(85)).unwrap();
        assert!(objects
            .references
            .iter()
            .any(|r| r.is_forward && r.target == m(7001) && r.reference_type == NodeId::ns0(35)));
        let to_config = machine
            .references
            .iter()
            .filter(|r| r.target == m(7003))
            .count();
        assert_eq!(to_config, 1);
        assert!(space
            .get(&m(7003))
            .unwrap()
            .references
            .iter()
            .any(|r| !r.is_forward && r.target == m(7001)));
        // HasSubtype chains across the two files.
        assert!(space.is_subtype_of(&m(1001), &d(1001)));
        assert!(space.is_subtype_of(&m(1001), &NodeId::ns0(58)));
        assert!(space.is_subtype_of(&m(3002), &m(3001)));
        // Translations.
        let t = machine.translations.as_ref().unwrap();
        assert_eq!(t.display_name[1], LocalizedText::new("de", "Maschine 1"));
        assert_eq!(machine.write_mask, 96);
        // Values are held (and so writable) by the namespace's manager.
        assert_eq!(
            managers.read_value(&m(7005)),
            Some(Ok(Variant::Double(42.5)))
        );
        assert_eq!(managers.read_value(&m(7004)), Some(Ok(Variant::Int32(1))));
        assert_eq!(
            managers.read_value(&m(7007)),
            Some(Ok(Variant::from(vec![1.5f64, 2.5, 3.5])))
        );
        // Enumerations read and write as Int32.
        assert_eq!(space.builtin_base(&d(3001)), Some(6));
    }

    #[test]
    fn definitions_come_from_the_xml() {
        let (space, _) = loaded();
        let Variant::ExtensionObject(eo) = &space.get(&m(3001)).unwrap().data_type_definition
        else {
            panic!()
        };
        let def = eo.downcast_ref::<StructureDefinition>().unwrap();
        assert_eq!(
            def.structure_type,
            StructureType::StructureWithOptionalFields
        );
        assert_eq!(def.default_encoding_id, m(5001));
        assert_eq!(def.base_data_type, NodeId::ns0(22));
        let f = def.fields.as_deref().unwrap();
        assert_eq!(f.len(), 6);
        assert_eq!(f[2].data_type, d(3010));
        assert_eq!((f[3].value_rank, f[5].is_optional), (1, true));
        let Variant::ExtensionObject(eo) = &space.get(&m(3003)).unwrap().data_type_definition
        else {
            panic!()
        };
        let def = eo.downcast_ref::<StructureDefinition>().unwrap();
        assert_eq!(def.structure_type, StructureType::Union);
        let Variant::ExtensionObject(eo) = &space.get(&d(3001)).unwrap().data_type_definition
        else {
            panic!()
        };
        let e = eo.downcast_ref::<EnumDefinition>().unwrap();
        let names: Vec<_> = e
            .fields
            .as_deref()
            .unwrap()
            .iter()
            .map(|f| (f.name.as_str_or_empty().to_owned(), f.value))
            .collect();
        assert_eq!(
            names,
            vec![
                ("Off".into(), 0),
                ("Running".into(), 1),
                ("Fault".into(), 2)
            ]
        );
    }

    #[test]
    fn structure_values_are_binary_encoded_from_the_definition() {
        let (space, managers) = loaded();
        let config = managers.read_value(&m(7003)).unwrap().unwrap();
        let (type_id, body) = opaque(&config);
        assert_eq!(type_id, m(5001));
        let mut want = Vec::new();
        1u32.encode(&mut want); // Comment present
        UaString::from("Press 1").encode(&mut want);
        12.5f64.encode(&mut want);
        for x in [1.0f64, -2.5, 3.0] {
            x.encode(&mut want);
        }
        Some(vec![10.0f64, 20.0, 30.5]).encode(&mut want);
        1i32.encode(&mut want);
        UaString::from("calibrated 2026-11").encode(&mut want);
        assert_eq!(body, want);
        // The encoder and the write-side check agree.
        let limits = DecodeLimits::default();
        assert!(structure_body_is_valid(&space, &m(3001), &body, &limits));
        assert!(!structure_body_is_valid(&space, &m(3002), &body, &limits));
        assert!(!structure_body_is_valid(
            &space,
            &m(3001),
            &body[..body.len() - 2],
            &limits
        ));
        // A missing field gets its default.
        let (type_id, body) = opaque(&space.get(&m(7006)).unwrap().value);
        assert_eq!(type_id, d(5010));
        let mut want = Vec::new();
        for x in [0.5f64, 0.25, 0.0] {
            x.encode(&mut want);
        }
        assert_eq!(body, want);
        // A union: switch field, then the chosen field.
        let (_, body) = opaque(&space.get(&m(7008)).unwrap().value);
        let mut want = Vec::new();
        2u32.encode(&mut want);
        UaString::from("sensor offline").encode(&mut want);
        assert_eq!(body, want);
        // Array of LocalizedText (EnumStrings).
        let Variant::Array(a) = &space.get(&d(3002)).unwrap().value else {
            panic!()
        };
        assert_eq!(a.values().len(), 3);
    }

    #[test]
    fn namespace_zero_structures_come_out_typed() {
        let (mut space, mut managers) = base();
        let xml = r#"<UANodeSet xmlns="http://opcfoundation.org/UA/2011/03/UANodeSet.xsd"
              xmlns:uax="http://opcfoundation.org/UA/2008/02/Types.xsd">
          <NamespaceUris><Uri>urn:t</Uri></NamespaceUris>
          <UAVariable NodeId="ns=1;i=1" BrowseName="1:Range" DataType="i=884">
            <DisplayName>Range</DisplayName>
            <References><Reference ReferenceType="i=47" IsForward="false">i=85</Reference></References>
            <Value><uax:ExtensionObject><uax:TypeId><uax:Identifier>i=885</uax:Identifier></uax:TypeId>
              <uax:Body><uax:Range><uax:Low>-5</uax:Low><uax:High>5</uax:High></uax:Range></uax:Body>
            </uax:ExtensionObject></Value>
          </UAVariable>
        </UANodeSet>"#;
        load(&mut space, &mut managers, &[("t.xml", xml)]).unwrap();
        let Variant::ExtensionObject(eo) = &space.get(&NodeId::numeric(3, 1)).unwrap().value else {
            panic!()
        };
        let r = eo.downcast_ref::<uascale_types::Range>().unwrap();
        assert_eq!((r.low, r.high), (-5.0, 5.0));
    }

    #[test]
    // The test's time origin.
    #[allow(clippy::disallowed_methods)]
    fn companion_types_in_read_and_write() {
        use crate::context::ServiceContext;
        use crate::services::attribute;
        use uascale_types::{
            AttributeId, DataValue, ReadRequest, ReadValueId, WriteRequest, WriteValue,
        };
        let (space, managers) = loaded();
        let ctx = ServiceContext::for_tests(
            crate::state::ServerState::from_parts(
                crate::ServerConfig::default(),
                space,
                managers,
                crate::security::SecurityState::none_only(),
            ),
            std::time::Instant::now(),
        );
        let write = |node: NodeId, v: Variant| {
            attribute::write(
                &ctx,
                &WriteRequest {
                    nodes_to_write: Some(vec![WriteValue {
                        node_id: node,
                        attribute_id: AttributeId::Value as u32,
                        value: DataValue::value(v),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            )
            .unwrap()
            .results
            .unwrap()[0]
        };
        let read = |node: NodeId, attr: AttributeId| {
            attribute::read(
                &ctx,
                &ReadRequest {
                    nodes_to_read: Some(vec![ReadValueId {
                        node_id: node,
                        attribute_id: attr as u32,
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            )
            .unwrap()
            .results
            .unwrap()
            .remove(0)
        };
        let eo = |type_id: NodeId, body: Vec<u8>| {
            Variant::from(ExtensionObject::Opaque {
                type_id,
                body: ByteString::new(body),
            })
        };
        // A MachineConfig without the optional Comment: mask, Name,
        // Speed, Position (3 Doubles), Setpoints (null), State.
        let mut config = Vec::new();
        0u32.encode(&mut config);
        UaString::from("P").encode(&mut config);
        config.extend_from_slice(&[0; 8 * 4]);
        (-1i32).encode(&mut config);
        2i32.encode(&mut config);
        assert_eq!(
            write(m(7003), eo(m(5001), config.clone())),
            StatusCode::Good
        );
        // A subtype's encoding is accepted for a MachineConfig variable.
        let mut extended = config.clone();
        UaString::from("ada").encode(&mut extended);
        let ext = eo(m(5003), extended);
        assert_eq!(write(m(7003), ext.clone()), StatusCode::Good);
        assert_eq!(read(m(7003), AttributeId::Value).value, Some(ext));
        // Another structure, an unknown encoding, no structure, or a body
        // that is not a MachineConfig is not.
        let mut long = config.clone();
        long.push(0);
        let mut with_comment = config.clone();
        with_comment[0] = 1; // says Comment is there; it is not
        for bad in [
            eo(d(5010), vec![0; 24]),
            eo(NodeId::numeric(4, 99_999), vec![]),
            Variant::Int32(1),
            eo(m(5001), vec![1]),
            eo(m(5001), config[..config.len() - 1].to_vec()),
            eo(m(5001), long),
            eo(m(5001), with_comment),
            eo(m(5003), config.clone()),
        ] {
            assert_eq!(write(m(7003), bad), StatusCode::BadTypeMismatch);
        }
        // Enumerations are Int32.
        assert_eq!(write(m(7004), Variant::Int32(2)), StatusCode::Good);
        assert_eq!(
            write(m(7004), Variant::Double(2.0)),
            StatusCode::BadTypeMismatch
        );
        // AccessLevel from the file: Position is read-only.
        assert_eq!(
            write(m(7006), eo(d(5010), vec![0; 24])),
            StatusCode::BadNotWritable
        );
        // Attributes of loaded nodes.
        assert_eq!(
            read(m(7001), AttributeId::BrowseName).value,
            Some(Variant::from(QualifiedName::new(4, "Machine1")))
        );
        assert!(matches!(
            read(m(3001), AttributeId::DataTypeDefinition).value,
            Some(Variant::ExtensionObject(_))
        ));
        assert_eq!(
            read(m(7001), AttributeId::DisplayName).value,
            Some(Variant::from(LocalizedText::new("en", "Machine 1")))
        );
    }

    fn line_of(xml: &str, what: &str) -> u32 {
        let at = xml.find(what).unwrap();
        xml[..at].matches('\n').count() as u32 + 1
    }

    #[test]
    fn bad_files_are_errors_naming_file_line_and_problem() {
        let cases: Vec<(String, &str, Option<&str>)> = vec![
            (
                MACHINES.replace("</UANodeSet>", ""),
                "not well-formed XML",
                None,
            ),
            (
                MACHINES.replace(
                    r#"DataType="DeviceState" AccessLevel="3""#,
                    r#"DataType="NoSuchAlias" AccessLevel="3""#,
                ),
                "\"NoSuchAlias\" is not a NodeId",
                Some("NoSuchAlias"),
            ),
            (
                MACHINES.replace(
                    "<uax:Double>42.5</uax:Double>",
                    "<uax:Double>warm</uax:Double>",
                ),
                "\"warm\" is not a valid Double",
                Some("<uax:Double>warm"),
            ),
            (
                MACHINES.replace("<Speed>12.5</Speed>", "<Speed>fast</Speed>"),
                "\"fast\" is not a valid Double",
                Some("<Speed>fast"),
            ),
            (
                MACHINES.replace(
                    r#"IsForward="false">ns=1;i=7001</Reference>
    </References>
    <Value>
      <uax:String>"#,
                    r#"IsForward="false">ns=1;i=7999</Reference>
    </References>
    <Value>
      <uax:String>"#,
                ),
                "reference to ns=4;i=7999, which is neither in this file nor loaded",
                Some(r#"<UAVariable NodeId="ns=1;i=7002""#),
            ),
            (
                MACHINES.replace(r#"NodeId="ns=1;i=7008""#, r#"NodeId="ns=1;i=7007""#),
                "duplicate NodeId ns=4;i=7007",
                Some(r#"<UAVariable NodeId="ns=1;i=7007" BrowseName="1:LastResult""#),
            ),
            (
                MACHINES.replace(r#"NodeId="ns=1;i=7008""#, r#"NodeId="ns=3;i=7008""#),
                "namespace index 3 is not in the file's NamespaceUris",
                Some(r#"NodeId="ns=3;i=7008""#),
            ),
            (
                MACHINES.replace(r#"NodeId="ns=1;i=7008""#, r#"NodeId="i=7008""#),
                "belongs to the server",
                Some(r#"NodeId="i=7008""#),
            ),
            (
                MACHINES.replace(r#"Version="1.05.02""#, r#"Version="1.06""#),
                "requires http://opcfoundation.org/UA/ version 1.06",
                Some(r#"Version="1.06""#),
            ),
            (
                MACHINES.replace(
                    "<uax:Identifier>ns=1;i=5004</uax:Identifier>",
                    "<uax:Identifier>ns=1;i=7001</uax:Identifier>",
                ),
                "ns=4;i=7001 is not the encoding of a DataType",
                Some("<uax:Identifier>ns=1;i=7001"),
            ),
            (
                MACHINES
                    .replace("<UAObjectType", "<UAThing")
                    .replace("</UAObjectType>", "</UAThing>"),
                "unexpected element <UAThing>",
                Some("<UAThing"),
            ),
        ];
        for (xml, message, at) in cases {
            let (mut space, mut managers) = base();
            let err = load(
                &mut space,
                &mut managers,
                &[("devices.xml", DEVICES), ("machines.xml", &xml)],
            )
            .unwrap_err();
            assert_eq!(err.file, "machines.xml");
            assert!(err.message.contains(message), "{err} / want {message}");
            if let Some(at) = at {
                assert_eq!(err.line, line_of(&xml, at), "{err}");
            }
            assert!(err.to_string().starts_with("machines.xml:"), "{err}");
        }
        // The required model missing, or loaded twice.
        let (mut space, mut managers) = base();
        let err = load(&mut space, &mut managers, &[("machines.xml", MACHINES)]).unwrap_err();
        assert!(err
            .message
            .contains("requires model http://uascale.example/Devices/"));
        assert_eq!(
            err.line,
            line_of(
                MACHINES,
                r#"<RequiredModel ModelUri="http://uascale.example/Devices/""#
            )
        );
        let (mut space, mut managers) = base();
        let err = load(
            &mut space,
            &mut managers,
            &[("devices.xml", DEVICES), ("again.xml", DEVICES)],
        )
        .unwrap_err();
        assert!(err.message.contains("is already loaded"), "{err}");
        // Not a NodeSet; not a file.
        let (mut space, mut managers) = base();
        let err = load(&mut space, &mut managers, &[("x.xml", "<a/>")]).unwrap_err();
        assert!(err.message.contains("not a UANodeSet"), "{err}");
        let err = load_files(
            &["/nonexistent/x.xml".into()],
            &mut space,
            &mut managers,
            "urn:s",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/nonexistent/x.xml: cannot read"),
            "{err}"
        );
    }

    /// Truncated files, and files with one element or attribute value
    /// blanked, are errors (or smaller loads), never panics.
    #[test]
    fn damaged_files_never_panic() {
        let (mut space, mut managers) = base();
        load(&mut space, &mut managers, &[("devices.xml", DEVICES)]).unwrap();
        let existing: Vec<String> = managers
            .namespace_array("urn:s")
            .into_iter()
            .map(|u| u.as_str().unwrap_or("").to_owned())
            .collect();
        let mut damaged: Vec<String> = (0..MACHINES.len())
            .step_by(211)
            .filter_map(|cut| MACHINES.get(..cut).map(str::to_owned))
            .collect();
        // Blank every quoted attribute value and every text node, one at a time.
        let quotes: Vec<usize> = MACHINES.match_indices('"').map(|(i, _)| i).collect();
        for pair in quotes.chunks(2).skip(6) {
            if let [a, b] = pair {
                damaged.push(format!("{}{}", &MACHINES[..=*a], &MACHINES[*b..]));
            }
        }
        for (i, _) in MACHINES.match_indices('>').step_by(3) {
            if let Some(end) = MACHINES[i..].find('<') {
                damaged.push(format!("{}>x{}", &MACHINES[..i], &MACHINES[i + end..]));
            }
        }
        for xml in &damaged {
            // Each attempt on its own space: a partial load must not leak
            // into the next one.
            let mut own = AddressSpace::default();
            let _ = Loader::new(&mut own, existing.clone()).load_str(xml, "m.xml");
            let _ = Loader::new(&mut space, existing.clone()).load_str(xml, "m.xml");
        }
    }
}
