//! The demo namespace of `uascale serve` (`urn:uascale:demo`, index 2), in
//! the spirit of the PLC simulation servers clients are tested against:
//!
//! - `Demo.Static.Scalar.<Type>` and `Demo.Static.Array.<Type>`: one
//!   read/write variable of every built-in type;
//! - `Demo.Static.Matrix`: a 3 x 4 Int32 matrix (ValueRank 2);
//! - `Demo.Static.Temperature`: DisplayName and Description in en, de and
//!   fr, chosen by the session's localeIds;
//! - the writable variables let clients write DisplayName and Description
//!   (WriteMask);
//! - `Demo.Dynamic.{Counter,Random,Sine,Step}`: values the server changes
//!   every `rate`;
//! - `Demo.Methods.Add(a: Double, b: Double) -> Double`;
//! - `Demo.Load.Node<i>` for `i < nodes`: changing Doubles for load tests;
//! - `Demo.Slow.0` .. `Demo.Slow.9`: read/write Doubles served by an
//!   asynchronous node manager ([`SlowValues`]) that answers each Read and
//!   Write after `demo.slow_ms`, standing in for device I/O (what the
//!   request queue's isolation is watched on).
//!
//! NodeIds are strings: `ns=2;s=Demo.Static.Scalar.Double`.

use std::sync::Arc;

use uascale_types::{
    Argument, ByteString, DateTime, ExpandedNodeId, ExtensionObject, Guid, LocalizedText,
    NodeClass, NodeId, QualifiedName, StatusCode, UaString, Variant, VariantType, XmlElement,
};

use crate::address_space::{AddressSpace, Node};
use crate::node_manager::InMemoryNodeManager;

/// The demo namespace URI.
pub const DEMO_NAMESPACE: &str = "urn:uascale:demo";
/// Its index in the NamespaceArray.
pub const NS: u16 = 2;

const ORGANIZES: u32 = 35;
const HAS_COMPONENT: u32 = 47;
const HAS_PROPERTY: u32 = 46;
const HAS_TYPE_DEFINITION: u32 = 40;
const FOLDER_TYPE: u32 = 61;
const BASE_DATA_VARIABLE_TYPE: u32 = 63;
const PROPERTY_TYPE: u32 = 68;
/// WriteMask of the static demo variables: DisplayName and Description.
const WRITE_MASK_NAMES: u32 = (1 << 5) | (1 << 6);

fn id(path: &str) -> NodeId {
    NodeId::string(NS, path)
}

fn folder(path: &str, name: &str, parent: NodeId, parent_ref: u32) -> Node {
    Node::new(NodeClass::Object, id(path), QualifiedName::new(NS, name))
        .with_reference(parent_ref, false, parent)
        .with_reference(HAS_TYPE_DEFINITION, true, NodeId::ns0(FOLDER_TYPE))
}

fn variable(
    path: &str,
    name: &str,
    parent: &str,
    data_type: u32,
    value_rank: i32,
    writable: bool,
) -> Node {
    let mut n = Node::new(NodeClass::Variable, id(path), QualifiedName::new(NS, name))
        .with_reference(ORGANIZES, false, id(parent))
        .with_reference(
            HAS_TYPE_DEFINITION,
            true,
            NodeId::ns0(BASE_DATA_VARIABLE_TYPE),
        );
    n.data_type = NodeId::ns0(data_type);
    n.value_rank = value_rank;
    if value_rank == 1 {
        n.array_dimensions = Some(vec![0]);
    }
    n.access_level = if writable { 3 } else { 1 };
    if writable {
        n.write_mask = WRITE_MASK_NAMES;
    }
    n
}

/// A sample value of every built-in type a demo variable holds.
fn sample(t: VariantType) -> Variant {
    use VariantType as T;
    match t {
        T::Boolean => Variant::Boolean(true),
        T::SByte => Variant::SByte(-8),
        T::Byte => Variant::Byte(8),
        T::Int16 => Variant::Int16(-16),
        T::UInt16 => Variant::UInt16(16),
        T::Int32 => Variant::Int32(-32),
        T::UInt32 => Variant::UInt32(32),
        T::Int64 => Variant::Int64(-64),
        T::UInt64 => Variant::UInt64(64),
        T::Float => Variant::Float(1.5),
        T::Double => Variant::Double(2.5),
        T::String => Variant::from("uascale"),
        T::DateTime => Variant::DateTime(DateTime::from_ticks(133_590_384_000_000_000)),
        T::Guid => Variant::Guid(Guid::from_fields(
            0x72962b91,
            0xfa75,
            0x4ae6,
            [0x8d, 0x28, 0xb4, 0x04, 0xdc, 0x7d, 0xaf, 0x63],
        )),
        T::ByteString => Variant::ByteString(ByteString::new(vec![1, 2, 3])),
        T::XmlElement => Variant::XmlElement(XmlElement(UaString::from("<a/>"))),
        T::NodeId => Variant::from(NodeId::string(NS, "Demo")),
        T::ExpandedNodeId => Variant::from(ExpandedNodeId::local(NodeId::ns0(85))),
        T::StatusCode => Variant::StatusCode(StatusCode::Good),
        T::QualifiedName => Variant::from(QualifiedName::new(NS, "Demo")),
        T::LocalizedText => Variant::from(LocalizedText::new("en", "Demo")),
        _ => Variant::Empty,
    }
}

fn array_of(v: Variant) -> Variant {
    use uascale_types::ArrayValues as A;
    macro_rules! three {
        ($($name:ident),*) => {
            match v {
                $(Variant::$name(x) => A::$name(vec![x.clone(), x.clone(), x]),)*
                Variant::NodeId(x) => A::NodeId(vec![(*x).clone(), (*x).clone(), *x]),
                Variant::ExpandedNodeId(x) => A::ExpandedNodeId(vec![(*x).clone(), (*x).clone(), *x]),
                Variant::QualifiedName(x) => A::QualifiedName(vec![(*x).clone(), (*x).clone(), *x]),
                Variant::LocalizedText(x) => A::LocalizedText(vec![(*x).clone(), (*x).clone(), *x]),
                _ => return Variant::Empty,
            }
        };
    }
    let a = three!(
        Boolean, SByte, Byte, Int16, UInt16, Int32, UInt32, Int64, UInt64, Float, Double, String,
        DateTime, Guid, ByteString, XmlElement, StatusCode
    );
    Variant::from(uascale_types::Array::new(a))
}

const SCALAR_TYPES: &[VariantType] = &[
    VariantType::Boolean,
    VariantType::SByte,
    VariantType::Byte,
    VariantType::Int16,
    VariantType::UInt16,
    VariantType::Int32,
    VariantType::UInt32,
    VariantType::Int64,
    VariantType::UInt64,
    VariantType::Float,
    VariantType::Double,
    VariantType::String,
    VariantType::DateTime,
    VariantType::Guid,
    VariantType::ByteString,
    VariantType::XmlElement,
    VariantType::NodeId,
    VariantType::ExpandedNodeId,
    VariantType::StatusCode,
    VariantType::QualifiedName,
    VariantType::LocalizedText,
];

/// The NodeId of the Add method and its object.
pub fn add_method() -> (NodeId, NodeId) {
    (id("Demo.Methods"), id("Demo.Methods.Add"))
}

fn argument(name: &str, data_type: u32) -> ExtensionObject {
    ExtensionObject::new(Argument {
        name: UaString::from(name),
        data_type: NodeId::ns0(data_type),
        value_rank: -1,
        array_dimensions: Some(vec![]),
        description: LocalizedText::default(),
    })
}

fn property(path: &str, name: &str, parent: NodeId, value: Variant) -> Node {
    let mut n = Node::new(NodeClass::Variable, id(path), QualifiedName::new(0, name))
        .with_reference(HAS_PROPERTY, false, parent)
        .with_reference(HAS_TYPE_DEFINITION, true, NodeId::ns0(PROPERTY_TYPE));
    n.data_type = NodeId::ns0(296);
    n.value_rank = 1;
    n.array_dimensions = Some(vec![0]);
    n.value = value;
    n
}

/// The dynamic nodes a ticker updates.
#[derive(Debug, Clone)]
pub struct Dynamic {
    /// Counter, Random, Sine, Step, then the load nodes.
    pub nodes: Vec<NodeId>,
}

/// Adds the demo namespace to `space`; returns its node manager (values
/// and the Add method) and the dynamic nodes.
pub fn build(space: &mut AddressSpace, load_nodes: usize) -> (Arc<InMemoryNodeManager>, Dynamic) {
    let mut values = InMemoryNodeManager::new(DEMO_NAMESPACE);
    let mut demo = folder("Demo", "Demo", NodeId::ns0(85), ORGANIZES);
    // SubscribeToEvents: the demo events (see [`event`]) come from here.
    demo.event_notifier = 1;
    space.insert(demo);
    space.insert(folder("Demo.Static", "Static", id("Demo"), ORGANIZES));
    space.insert(folder(
        "Demo.Static.Scalar",
        "Scalar",
        id("Demo.Static"),
        ORGANIZES,
    ));
    space.insert(folder(
        "Demo.Static.Array",
        "Array",
        id("Demo.Static"),
        ORGANIZES,
    ));
    for &t in SCALAR_TYPES {
        let name = format!("{t:?}");
        let path = format!("Demo.Static.Scalar.{name}");
        space.insert(variable(
            &path,
            &name,
            "Demo.Static.Scalar",
            u32::from(t.id()),
            -1,
            true,
        ));
        values.hold(id(&path), sample(t));
        let path = format!("Demo.Static.Array.{name}");
        space.insert(variable(
            &path,
            &name,
            "Demo.Static.Array",
            u32::from(t.id()),
            1,
            true,
        ));
        values.hold(id(&path), array_of(sample(t)));
    }
    // A variable with its DisplayName and Description in three locales
    // (picked by the session's localeIds) that clients may rename.
    let mut temp = variable(
        "Demo.Static.Temperature",
        "Temperature",
        "Demo.Static",
        11,
        -1,
        true,
    );
    let names = [
        ("en", "Temperature", "Temperature of the demo tank"),
        ("de", "Temperatur", "Temperatur des Demo-Tanks"),
        (
            "fr",
            "Température",
            "Température du réservoir de démonstration",
        ),
    ];
    temp.translations = Some(Box::new(crate::address_space::Translations {
        display_name: names
            .iter()
            .map(|(l, n, _)| LocalizedText::new(*l, *n))
            .collect(),
        description: names
            .iter()
            .map(|(l, _, d)| LocalizedText::new(*l, *d))
            .collect(),
    }));
    temp.display_name = LocalizedText::new("en", "Temperature");
    temp.description = LocalizedText::new("en", names[0].2);
    temp.write_mask = WRITE_MASK_NAMES;
    space.insert(temp);
    values.hold(id("Demo.Static.Temperature"), Variant::Double(21.5));
    // A 3 x 4 Int32 matrix (ValueRank 2) for multi-dimensional index ranges.
    let mut matrix = variable("Demo.Static.Matrix", "Matrix", "Demo.Static", 6, 2, true);
    matrix.array_dimensions = Some(vec![3, 4]);
    space.insert(matrix);
    values.hold(id("Demo.Static.Matrix"), matrix_value());
    space.insert(folder("Demo.Dynamic", "Dynamic", id("Demo"), ORGANIZES));
    let mut dynamic = Vec::new();
    for (name, dt, v) in [
        ("Counter", 7u32, Variant::UInt32(0)),
        ("Random", 11, Variant::Double(0.0)),
        ("Sine", 11, Variant::Double(0.0)),
        ("Step", 6, Variant::Int32(0)),
    ] {
        let path = format!("Demo.Dynamic.{name}");
        space.insert(variable(&path, name, "Demo.Dynamic", dt, -1, false));
        values.hold(id(&path), v);
        dynamic.push(id(&path));
    }
    space.insert(folder("Demo.Methods", "Methods", id("Demo"), ORGANIZES));
    let (object, method) = add_method();
    space.insert(
        Node::new(
            NodeClass::Method,
            method.clone(),
            QualifiedName::new(NS, "Add"),
        )
        .with_reference(HAS_COMPONENT, false, object),
    );
    space.insert(property(
        "Demo.Methods.Add.InputArguments",
        "InputArguments",
        method.clone(),
        Variant::from(vec![argument("a", 11), argument("b", 11)]),
    ));
    space.insert(property(
        "Demo.Methods.Add.OutputArguments",
        "OutputArguments",
        method,
        Variant::from(vec![argument("sum", 11)]),
    ));
    if load_nodes > 0 {
        space.insert(folder("Demo.Load", "Load", id("Demo"), ORGANIZES));
        for i in 0..load_nodes {
            let path = format!("Demo.Load.Node{i}");
            space.insert(variable(
                &path,
                &format!("Node{i}"),
                "Demo.Load",
                11,
                -1,
                false,
            ));
            values.hold(id(&path), Variant::Double(0.0));
            dynamic.push(id(&path));
        }
    }
    values.method(add_method().1, Box::new(call_add));
    (Arc::new(values), Dynamic { nodes: dynamic })
}

/// How many `Demo.Slow.<i>` variables there are.
pub const SLOW_COUNT: usize = 10;

/// The string prefix of the slow variables' NodeIds.
const SLOW_PREFIX: &str = "Demo.Slow.";

/// The asynchronous node manager behind `Demo.Slow.0` ..
/// `Demo.Slow.9`: Doubles that answer each Read and Write after a fixed
/// delay (the `demo.slow_ms` of the configuration), as a device behind a
/// fieldbus would. Its delays run on a timer thread of its own
/// ([`crate::delay::Delay`]), so any executor can poll them.
#[derive(Debug)]
pub struct SlowValues {
    delay: std::time::Duration,
    values: std::sync::Mutex<[f64; SLOW_COUNT]>,
}

impl SlowValues {
    /// Ten values of 0.0, answered after `delay` each.
    pub fn new(delay: std::time::Duration) -> Self {
        SlowValues {
            delay,
            values: std::sync::Mutex::new([0.0; SLOW_COUNT]),
        }
    }

    /// The index of `node` among the slow variables.
    fn index(node: &NodeId) -> Result<usize, StatusCode> {
        match &node.identifier {
            uascale_types::Identifier::String(s) if node.namespace == NS => s
                .as_str()
                .and_then(|s| s.strip_prefix(SLOW_PREFIX))
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|&i| i < SLOW_COUNT)
                .ok_or(StatusCode::BadNodeIdUnknown),
            _ => Err(StatusCode::BadNodeIdUnknown),
        }
    }

    fn wait(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        crate::delay::Delay::after(self.delay)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [f64; SLOW_COUNT]> {
        // A plain array: nothing is left half-written by a panic.
        self.values.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl crate::node_manager::AsyncNodeManager for Arc<SlowValues> {
    fn namespace_uri(&self) -> &str {
        DEMO_NAMESPACE
    }

    fn read_value(&self, node: &NodeId) -> crate::reply::BoxFuture<Result<Variant, StatusCode>> {
        let me = Arc::clone(self);
        let index = SlowValues::index(node);
        let wait = self.wait();
        Box::pin(async move {
            let i = index?;
            wait.await;
            Ok(Variant::Double(me.lock()[i]))
        })
    }

    fn write_value(
        &self,
        node: &NodeId,
        value: Variant,
    ) -> crate::reply::BoxFuture<Result<(), StatusCode>> {
        let me = Arc::clone(self);
        let index = SlowValues::index(node);
        let wait = self.wait();
        Box::pin(async move {
            let i = index?;
            let Variant::Double(v) = value else {
                return Err(StatusCode::BadTypeMismatch);
            };
            wait.await;
            me.lock()[i] = v;
            Ok(())
        })
    }

    fn call(
        &self,
        _object: &NodeId,
        _method: &NodeId,
        _inputs: Vec<Variant>,
    ) -> crate::reply::BoxFuture<Result<Vec<Variant>, StatusCode>> {
        Box::pin(async { Err(StatusCode::BadMethodInvalid) })
    }
}

/// Adds the `Demo.Slow` folder and its variables, served by a
/// [`SlowValues`] that answers after `delay`.
fn install_slow(
    space: &mut AddressSpace,
    managers: &mut crate::node_manager::NodeManagers,
    delay: std::time::Duration,
) {
    space.insert(folder("Demo.Slow", "Slow", id("Demo"), ORGANIZES));
    for i in 0..SLOW_COUNT {
        let path = format!("{SLOW_PREFIX}{i}");
        space.insert(variable(&path, &i.to_string(), "Demo.Slow", 11, -1, true));
    }
    managers.register_async_prefix(NS, SLOW_PREFIX, Arc::new(Arc::new(SlowValues::new(delay))));
}

/// The initial value of `Demo.Static.Matrix`: 3 x 4 Int32, 0..=11 row by row.
pub fn matrix_value() -> Variant {
    let values = uascale_types::ArrayValues::Int32((0..12).collect());
    match uascale_types::Array::with_dimensions(values, vec![3, 4]) {
        Ok(a) => Variant::from(a),
        Err(_) => Variant::Empty,
    }
}

/// The values of the dynamic nodes at tick `n` (`seed` varies Random).
pub fn tick(values: &InMemoryNodeManager, dynamic: &Dynamic, n: u64, seed: &mut u64) {
    for (i, node) in dynamic.nodes.iter().enumerate() {
        let v = match i {
            0 => Variant::UInt32(n as u32),
            1 => {
                // xorshift: deterministic, good enough for a demo signal.
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                Variant::Double((*seed % 1_000_000) as f64 / 10_000.0)
            }
            2 => Variant::Double((n as f64 * std::f64::consts::PI / 30.0).sin()),
            3 => Variant::Int32((n % 10) as i32),
            _ => Variant::Double(n as f64 + i as f64 / 1000.0),
        };
        values.set(node, v);
    }
}

/// The demo event of tick `n` (a BaseEventType event from the Demo
/// folder, Severity cycling 100..=1000, Message `Demo event <n>`), and the
/// notifiers it is reported through: the Demo folder and the Server object.
pub fn event(n: u64, utc: DateTime) -> (crate::subscription::event::Event, [NodeId; 2]) {
    let e = crate::subscription::event::Event::new(
        crate::subscription::event::new_event_id(),
        NodeId::ns0(crate::subscription::event::BASE_EVENT_TYPE),
        id("Demo"),
        "Demo",
        utc,
        &format!("Demo event {n}"),
        ((n % 10 + 1) * 100) as u16,
    );
    (e, [id("Demo"), NodeId::ns0(2253)])
}

/// The Add method: `a + b`, both Doubles (types were checked by Call).
pub fn call_add(inputs: &[Variant]) -> Result<Vec<Variant>, StatusCode> {
    match inputs {
        [Variant::Double(a), Variant::Double(b)] => Ok(vec![Variant::Double(a + b)]),
        _ => Err(StatusCode::BadInvalidArgument),
    }
}

/// The demo namespace once installed: its node manager and the nodes it
/// changes every `rate`. Installed by [`ServerState`](crate::state::ServerState)
/// like any other node manager; a tick changes the values and raises the
/// demo event.
#[derive(Debug, Clone)]
pub struct Demo {
    /// The demo's node manager (namespace [`NS`]).
    pub manager: Arc<InMemoryNodeManager>,
    /// The nodes that change.
    pub dynamic: Dynamic,
    /// How often they change.
    pub rate: std::time::Duration,
}

impl Demo {
    /// Adds the demo namespace to `space` and registers its node manager
    /// in `managers` under index [`NS`].
    pub fn install(
        space: &mut AddressSpace,
        managers: &mut crate::node_manager::NodeManagers,
        config: &crate::config::DemoSection,
    ) -> Demo {
        let (manager, dynamic) = build(space, config.nodes);
        let rate = config.rate;
        managers.register(
            NS,
            Arc::clone(&manager) as Arc<dyn crate::node_manager::NodeManager>,
        );
        install_slow(space, managers, config.slow);
        Demo {
            manager,
            dynamic,
            rate,
        }
    }

    /// Tick `n`: new values for the dynamic nodes (monitored items hear of
    /// them through the node manager's observer), then the demo event,
    /// offered to the event items watching the Demo folder or the Server
    /// object.
    pub fn tick(
        &self,
        n: u64,
        seed: &mut u64,
        space: &AddressSpace,
        subscriptions: &crate::reply::SubscriptionRegistry,
        now: crate::subscription::Now,
    ) {
        tick(&self.manager, &self.dynamic, n, seed);
        let (event, notifiers) = event(n, now.utc);
        let is_subtype = |a: &NodeId, b: &NodeId| space.is_subtype_of(a, b);
        subscriptions.raise_event(now.instant, &notifiers, &|item| match &item.filter {
            crate::subscription::item::Filter::Event(f) => f.apply(&event, &is_subtype),
            crate::subscription::item::Filter::DataChange { .. } => None,
        });
    }
}
