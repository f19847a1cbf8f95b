//! The node-manager interface: user code serves the values and methods of a
//! namespace. The nodes themselves (their attributes and references) live in
//! the [`AddressSpace`](crate::address_space::AddressSpace), so Browse and
//! the attribute checks work the same for every namespace; a manager owns
//! what changes - variable values - and what runs - methods.
//!
//! Two kinds of manager:
//! - [`NodeManager`]: synchronous handlers, run inline on the connection's
//!   task - for values held in memory; they must not block.
//! - [`AsyncNodeManager`]: handlers return futures - for values behind a
//!   device, a fieldbus or a database. A Read, Write or Call touching such a
//!   namespace is answered later: the request releases the connection while
//!   the futures run, and `Cancel` can abort it.

use crate::fxhash::FxHashMap;
use std::sync::{Arc, Mutex, OnceLock};

use uascale_types::{NodeId, StatusCode, UaString, Variant};

use crate::reply::BoxFuture;

/// A method implementation: input arguments (already checked against the
/// method's InputArguments) to output arguments.
pub type MethodHandler = Box<dyn Fn(&[Variant]) -> Result<Vec<Variant>, StatusCode> + Send + Sync>;

/// Told of every value change a manager pushes (the server's monitored
/// items): the node and its new value.
pub type ValueObserver = Arc<dyn Fn(&NodeId, &Variant) + Send + Sync>;

/// Serves the values and methods of one namespace.
pub trait NodeManager: Send + Sync {
    /// The namespace URI (its index is where the manager is registered).
    fn namespace_uri(&self) -> &str;

    /// The current value of a variable; `None` when this manager does not
    /// hold it (the node's static value from the address space is used).
    fn read_value(&self, node: &NodeId) -> Option<Result<Variant, StatusCode>>;

    /// Stores a value that passed the server's access-level and type checks.
    /// `BadNotWritable` when this manager does not hold the node.
    fn write_value(&self, node: &NodeId, value: Variant) -> Result<(), StatusCode>;

    /// Runs a method; `None` when this manager has no handler for it.
    fn call(
        &self,
        object: &NodeId,
        method: &NodeId,
        inputs: &[Variant],
    ) -> Option<Result<Vec<Variant>, StatusCode>>;

    /// True when every change of `node`'s value is reported to the
    /// observer (then monitored items of it need no sampling timer).
    fn pushes_changes(&self, node: &NodeId) -> bool {
        let _ = node;
        false
    }

    /// Installs the observer of value changes; managers that do not push
    /// changes ignore it.
    fn set_observer(&self, observer: ValueObserver) {
        let _ = observer;
    }
}

/// Serves the values and methods of one namespace asynchronously.
///
/// The server has already checked the node (it exists, is a readable /
/// writable variable, the value's type fits, the method's arguments match)
/// before it calls here. The futures must be `'static`: clone what they need.
pub trait AsyncNodeManager: Send + Sync {
    /// The namespace URI.
    fn namespace_uri(&self) -> &str;

    /// The current value of a variable of this namespace.
    fn read_value(&self, node: &NodeId) -> BoxFuture<Result<Variant, StatusCode>>;

    /// Stores a value.
    fn write_value(&self, node: &NodeId, value: Variant) -> BoxFuture<Result<(), StatusCode>>;

    /// Runs a method (`BadNotImplemented` when there is no handler).
    fn call(
        &self,
        object: &NodeId,
        method: &NodeId,
        inputs: Vec<Variant>,
    ) -> BoxFuture<Result<Vec<Variant>, StatusCode>>;
}

#[derive(Clone)]
enum Managed {
    Sync(Arc<dyn NodeManager>),
    Async(Arc<dyn AsyncNodeManager>),
    /// A synchronous namespace with a subtree served asynchronously: the
    /// nodes whose string identifier starts with `prefix`.
    Split {
        sync: Arc<dyn NodeManager>,
        prefix: Arc<str>,
        slow: Arc<dyn AsyncNodeManager>,
    },
}

impl Managed {
    fn namespace_uri(&self) -> &str {
        match self {
            Managed::Sync(m) | Managed::Split { sync: m, .. } => m.namespace_uri(),
            Managed::Async(m) => m.namespace_uri(),
        }
    }

    /// The manager that serves `node` (of this manager's namespace).
    fn route(&self, node: &NodeId) -> Route<'_> {
        match self {
            Managed::Sync(m) => Route::Sync(m),
            Managed::Async(m) => Route::Async(m),
            Managed::Split { sync, prefix, slow } => match &node.identifier {
                uascale_types::Identifier::String(s)
                    if s.as_str().is_some_and(|s| s.starts_with(&**prefix)) =>
                {
                    Route::Async(slow)
                }
                _ => Route::Sync(sync),
            },
        }
    }
}

/// Which kind of manager serves a node.
enum Route<'a> {
    Sync(&'a Arc<dyn NodeManager>),
    Async(&'a Arc<dyn AsyncNodeManager>),
}

/// The managers of a server, by namespace index.
#[derive(Default)]
pub struct NodeManagers {
    by_index: Vec<Option<Managed>>,
    any_async: bool,
}

impl std::fmt::Debug for NodeManagers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.by_index
                    .iter()
                    .map(|m| m.as_ref().map(|m| m.namespace_uri().to_owned())),
            )
            .finish()
    }
}

impl NodeManagers {
    /// Registers `manager` for namespace `index` (2 and up: 0 is the OPC UA
    /// namespace, 1 the server's own), replacing any earlier one.
    pub fn register(&mut self, index: u16, manager: Arc<dyn NodeManager>) {
        self.put(index, Managed::Sync(manager));
    }

    /// Registers an asynchronous `manager` for namespace `index`.
    pub fn register_async(&mut self, index: u16, manager: Arc<dyn AsyncNodeManager>) {
        self.put(index, Managed::Async(manager));
        self.any_async = true;
    }

    /// Lets the asynchronous `manager` serve the nodes of namespace `index`
    /// whose string identifier starts with `prefix`; the namespace's
    /// synchronous manager (registered before) keeps the rest. Without one,
    /// `manager` serves the whole namespace.
    pub fn register_async_prefix(
        &mut self,
        index: u16,
        prefix: &str,
        manager: Arc<dyn AsyncNodeManager>,
    ) {
        let split = match self.get(index) {
            Some(Managed::Sync(sync) | Managed::Split { sync, .. }) => Managed::Split {
                sync: Arc::clone(sync),
                prefix: Arc::from(prefix),
                slow: manager,
            },
            _ => Managed::Async(manager),
        };
        self.put(index, split);
        self.any_async = true;
    }

    fn put(&mut self, index: u16, m: Managed) {
        let i = usize::from(index);
        if self.by_index.len() <= i {
            self.by_index.resize_with(i + 1, || None);
        }
        self.by_index[i] = Some(m);
    }

    fn get(&self, ns: u16) -> Option<&Managed> {
        self.by_index.get(usize::from(ns)).and_then(Option::as_ref)
    }

    fn route(&self, node: &NodeId) -> Option<Route<'_>> {
        self.get(node.namespace).map(|m| m.route(node))
    }

    /// True when `node` is served by an [`AsyncNodeManager`] (cheap: false
    /// at once when no async manager is registered).
    pub fn is_async(&self, node: &NodeId) -> bool {
        self.any_async && matches!(self.route(node), Some(Route::Async(_)))
    }

    /// The value of `node` from its manager, if it holds one. An
    /// asynchronously served node answers `BadWouldBlock` here: use
    /// [`NodeManagers::read_value_async`].
    pub fn read_value(&self, node: &NodeId) -> Option<Result<Variant, StatusCode>> {
        match self.route(node)? {
            Route::Sync(m) => m.read_value(node),
            Route::Async(_) => Some(Err(StatusCode::BadWouldBlock)),
        }
    }

    /// Writes through the node's manager (`BadWouldBlock` for an
    /// asynchronous one).
    pub fn write_value(&self, node: &NodeId, value: Variant) -> Result<(), StatusCode> {
        match self.route(node) {
            Some(Route::Sync(m)) => m.write_value(node, value),
            Some(Route::Async(_)) => Err(StatusCode::BadWouldBlock),
            None => Err(StatusCode::BadNotWritable),
        }
    }

    /// Calls through the method's manager (`BadWouldBlock` for an
    /// asynchronous one).
    pub fn call(
        &self,
        object: &NodeId,
        method: &NodeId,
        inputs: &[Variant],
    ) -> Option<Result<Vec<Variant>, StatusCode>> {
        match self.route(method)? {
            Route::Sync(m) => m.call(object, method, inputs),
            Route::Async(_) => Some(Err(StatusCode::BadWouldBlock)),
        }
    }

    /// The asynchronous manager that serves `node`, if one does.
    pub fn async_manager(&self, node: &NodeId) -> Option<Arc<dyn AsyncNodeManager>> {
        match self.route(node)? {
            Route::Async(m) => Some(Arc::clone(m)),
            Route::Sync(_) => None,
        }
    }

    /// The asynchronous read of `node`; `None` when it is not served
    /// asynchronously.
    pub fn read_value_async(
        &self,
        node: &NodeId,
    ) -> Option<BoxFuture<Result<Variant, StatusCode>>> {
        match self.route(node)? {
            Route::Async(m) => Some(m.read_value(node)),
            Route::Sync(_) => None,
        }
    }

    /// The asynchronous write of `node`; `None` when it is not served
    /// asynchronously.
    pub fn write_value_async(
        &self,
        node: &NodeId,
        value: Variant,
    ) -> Option<BoxFuture<Result<(), StatusCode>>> {
        match self.route(node)? {
            Route::Async(m) => Some(m.write_value(node, value)),
            Route::Sync(_) => None,
        }
    }

    /// The asynchronous call of `method`; `None` when it is not served
    /// asynchronously.
    pub fn call_async(
        &self,
        object: &NodeId,
        method: &NodeId,
        inputs: Vec<Variant>,
    ) -> Option<BoxFuture<Result<Vec<Variant>, StatusCode>>> {
        match self.route(method)? {
            Route::Async(m) => Some(m.call(object, method, inputs)),
            Route::Sync(_) => None,
        }
    }

    /// True when the node's manager pushes its value changes.
    pub fn pushes_changes(&self, node: &NodeId) -> bool {
        matches!(self.route(node), Some(Route::Sync(m)) if m.pushes_changes(node))
    }

    /// Installs `observer` in every manager.
    pub fn set_observer(&self, observer: &ValueObserver) {
        for m in self.by_index.iter().flatten() {
            if let Managed::Sync(m) | Managed::Split { sync: m, .. } = m {
                m.set_observer(Arc::clone(observer));
            }
        }
    }

    /// The NamespaceArray: the OPC UA namespace, the server's, then each
    /// registered manager's URI at its index (empty where none is).
    pub fn namespace_array(&self, application_uri: &str) -> Vec<UaString> {
        let mut v = vec![
            UaString::from("http://opcfoundation.org/UA/"),
            UaString::from(application_uri),
        ];
        for m in self.by_index.iter().skip(2) {
            v.push(UaString::from(m.as_ref().map_or("", |m| m.namespace_uri())));
        }
        v
    }
}

/// Values and methods held in memory: the manager behind the demo
/// namespace, and a ready-made one for user code.
pub struct InMemoryNodeManager {
    uri: String,
    values: FxHashMap<NodeId, Mutex<Variant>>,
    methods: FxHashMap<NodeId, MethodHandler>,
    observer: OnceLock<ValueObserver>,
}

impl std::fmt::Debug for InMemoryNodeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "InMemoryNodeManager({}, {} values, {} methods)",
            self.uri,
            self.values.len(),
            self.methods.len()
        )
    }
}

impl InMemoryNodeManager {
    /// An empty manager for namespace `uri`.
    pub fn new(uri: impl Into<String>) -> Self {
        InMemoryNodeManager {
            uri: uri.into(),
            values: FxHashMap::default(),
            methods: FxHashMap::default(),
            observer: OnceLock::new(),
        }
    }

    /// Holds a value for `node` (before the manager is shared: the set of
    /// nodes is fixed then, and only their values change).
    pub fn hold(&mut self, node: NodeId, value: Variant) {
        self.values.insert(node, Mutex::new(value));
    }

    /// Registers a method handler.
    pub fn method(&mut self, method: NodeId, handler: MethodHandler) {
        self.methods.insert(method, handler);
    }

    /// Sets a held value from server-side code (a simulation, a driver);
    /// false when `node` is not held. Monitored items of the node are told
    /// at once (no sampling).
    pub fn set(&self, node: &NodeId, value: Variant) -> bool {
        let Some(m) = self.values.get(node) else {
            return false;
        };
        let observer = self.observer.get();
        let copy = observer.map(|_| value.clone());
        match m.lock() {
            Ok(mut g) => *g = value,
            Err(p) => *p.into_inner() = value,
        }
        if let (Some(o), Some(v)) = (observer, copy) {
            o(node, &v);
        }
        true
    }

    /// A held value.
    pub fn get(&self, node: &NodeId) -> Option<Variant> {
        let m = self.values.get(node)?;
        Some(match m.lock() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        })
    }
}

impl NodeManager for InMemoryNodeManager {
    fn namespace_uri(&self) -> &str {
        &self.uri
    }

    fn read_value(&self, node: &NodeId) -> Option<Result<Variant, StatusCode>> {
        self.get(node).map(Ok)
    }

    fn write_value(&self, node: &NodeId, value: Variant) -> Result<(), StatusCode> {
        if self.set(node, value) {
            Ok(())
        } else {
            Err(StatusCode::BadNotWritable)
        }
    }

    fn call(
        &self,
        _object: &NodeId,
        method: &NodeId,
        inputs: &[Variant],
    ) -> Option<Result<Vec<Variant>, StatusCode>> {
        self.methods.get(method).map(|h| h(inputs))
    }

    fn pushes_changes(&self, node: &NodeId) -> bool {
        self.observer.get().is_some() && self.values.contains_key(node)
    }

    fn set_observer(&self, observer: ValueObserver) {
        let _ = self.observer.set(observer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_namespace() {
        let mut m = InMemoryNodeManager::new("urn:test");
        let n = NodeId::string(3, "x");
        m.hold(n.clone(), Variant::Int32(1));
        m.method(
            NodeId::string(3, "m"),
            Box::new(|i: &[Variant]| Ok(i.to_vec())),
        );
        let mut all = NodeManagers::default();
        all.register(3, Arc::new(m));
        assert_eq!(all.read_value(&n), Some(Ok(Variant::Int32(1))));
        all.write_value(&n, Variant::Int32(2)).unwrap();
        assert_eq!(all.read_value(&n), Some(Ok(Variant::Int32(2))));
        assert_eq!(all.read_value(&NodeId::string(4, "x")), None);
        assert_eq!(
            all.write_value(&NodeId::string(3, "y"), Variant::Int32(0)),
            Err(StatusCode::BadNotWritable)
        );
        let out = all.call(&NodeId::NULL, &NodeId::string(3, "m"), &[Variant::Byte(7)]);
        assert_eq!(out, Some(Ok(vec![Variant::Byte(7)])));
        assert_eq!(
            all.namespace_array("urn:server"),
            vec![
                UaString::from("http://opcfoundation.org/UA/"),
                UaString::from("urn:server"),
                UaString::from(""),
                UaString::from("urn:test")
            ]
        );
    }
}

/// A user namespace served through the same Read / Write / Call paths as the
/// built-in ones.
#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod service_tests {
    use super::*;
    use crate::address_space::{AddressSpace, Node};
    use crate::context::ServiceContext;
    use crate::services::{attribute, method};
    use uascale_types::{
        Argument, AttributeId, CallMethodRequest, CallRequest, DataValue, ExtensionObject,
        LocalizedText, NodeClass, QualifiedName, ReadRequest, ReadValueId, WriteRequest,
        WriteValue,
    };

    fn setup() -> (AddressSpace, NodeManagers) {
        let mut space = AddressSpace::default();
        let mut var = Node::new(
            NodeClass::Variable,
            NodeId::string(3, "Temp"),
            QualifiedName::new(3, "Temp"),
        );
        var.data_type = NodeId::ns0(11);
        var.access_level = 3;
        space.insert(var);
        let obj = Node::new(
            NodeClass::Object,
            NodeId::string(3, "Obj"),
            QualifiedName::new(3, "Obj"),
        );
        space.insert(obj);
        let m = Node::new(
            NodeClass::Method,
            NodeId::string(3, "Twice"),
            QualifiedName::new(3, "Twice"),
        )
        .with_reference(47, false, NodeId::string(3, "Obj"));
        space.insert(m);
        let mut args = Node::new(
            NodeClass::Variable,
            NodeId::string(3, "Twice.In"),
            QualifiedName::new(0, "InputArguments"),
        )
        .with_reference(46, false, NodeId::string(3, "Twice"));
        args.value = Variant::from(vec![ExtensionObject::new(Argument {
            name: UaString::from("x"),
            data_type: NodeId::ns0(11),
            value_rank: -1,
            array_dimensions: None,
            description: LocalizedText::default(),
        })]);
        space.insert(args);
        let mut mgr = InMemoryNodeManager::new("urn:user");
        mgr.hold(NodeId::string(3, "Temp"), Variant::Double(20.0));
        mgr.method(
            NodeId::string(3, "Twice"),
            Box::new(|i: &[Variant]| match i {
                [Variant::Double(x)] => Ok(vec![Variant::Double(x * 2.0)]),
                _ => Err(StatusCode::BadInvalidArgument),
            }),
        );
        let mut managers = NodeManagers::default();
        managers.register(3, Arc::new(mgr));
        (space, managers)
    }

    #[test]
    fn read_write_call_through_a_user_manager() {
        let (space, managers) = setup();
        let ctx = ServiceContext::for_tests(
            crate::state::ServerState::from_parts(
                crate::ServerConfig::default(),
                space,
                managers,
                crate::security::SecurityState::none_only(),
            ),
            std::time::Instant::now(),
        );
        let read = || {
            let r = attribute::read(
                &ctx,
                &ReadRequest {
                    nodes_to_read: Some(vec![ReadValueId {
                        node_id: NodeId::string(3, "Temp"),
                        attribute_id: AttributeId::Value as u32,
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            )
            .unwrap();
            r.results.unwrap()[0].value.clone()
        };
        assert_eq!(read(), Some(Variant::Double(20.0)));
        let w = attribute::write(
            &ctx,
            &WriteRequest {
                nodes_to_write: Some(vec![
                    WriteValue {
                        node_id: NodeId::string(3, "Temp"),
                        attribute_id: AttributeId::Value as u32,
                        value: DataValue::value(21.5),
                        ..Default::default()
                    },
                    WriteValue {
                        node_id: NodeId::string(3, "Temp"),
                        attribute_id: AttributeId::Value as u32,
                        value: DataValue::value("warm"),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            w.results,
            Some(vec![StatusCode::Good, StatusCode::BadTypeMismatch])
        );
        assert_eq!(read(), Some(Variant::Double(21.5)));
        let c = method::call(
            &ctx,
            &CallRequest {
                methods_to_call: Some(vec![CallMethodRequest {
                    object_id: NodeId::string(3, "Obj"),
                    method_id: NodeId::string(3, "Twice"),
                    input_arguments: Some(vec![Variant::Double(4.0)]),
                }]),
                ..Default::default()
            },
        )
        .unwrap();
        let r = &c.results.unwrap()[0];
        assert_eq!(r.status_code, StatusCode::Good);
        assert_eq!(r.output_arguments, Some(vec![Variant::Double(8.0)]));
        let ns = ctx.state.managers.namespace_array("urn:s");
        assert_eq!(ns[3], "urn:user");
    }
}
