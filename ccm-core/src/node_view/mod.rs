//! [`NodeView`]: a read-only, compact, shared view of a Kubernetes Node, as the framework caches
//! it and hands it to providers.

mod build;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::Node;

pub use build::NodeViewInterner;

/// A read-only view of one Kubernetes Node: the fields a cloud provider and the framework's
/// controllers read, held compactly and shared.
///
/// This is what the framework caches for every Node (its shared Node informer holds
/// `NodeView`s, not k8s-openapi `Node`s) and what it hands to providers: the hosts of
/// [`LoadBalancer`](crate::LoadBalancer) and [`LoadBalancerHostsBatch`](crate::LoadBalancerHostsBatch),
/// the Nodes of [`InstancesBatch`](crate::InstancesBatch) and the Node of every
/// [`InstancesV2`](crate::InstancesV2) call. It replaces Go's `*v1.Node` in those calls.
///
/// - **Cheap to clone and share**: an `Arc` inside; `clone()` is one atomic increment and a
///   host list of 100,000 views is 100,000 pointers. Keep a clone if you need a Node after the
///   call returns.
/// - **Compact**: a Node's label and annotation sets are interned (one shared copy for every
///   Node with the same ones, a value equal to the Node's name standing for it, so the
///   hostname label does not make each set unique), as are address types, condition types and
///   the `nodeInfo` architecture and OS; the strings only this Node has (uid, providerID,
///   addresses, ...) sit one after the other in one allocation. Only the fields a CCM reads are
///   kept, so a cached Node costs about a sixth of a k8s-openapi `Node`: some 800 bytes in five
///   allocations for a kubelet-registered Node with a dozen labels (see docs/performance.md).
/// - **Typed accessors** instead of `Option`s of `Option`s: [`name`](NodeView::name),
///   [`provider_id`](NodeView::provider_id), [`label`](NodeView::label),
///   [`addresses`](NodeView::addresses), [`taints`](NodeView::taints),
///   [`condition`](NodeView::condition), [`system_uuid`](NodeView::system_uuid), ...
/// - **What it holds** is what the framework caches of a Node: all of `metadata` but
///   `managedFields`, all of `spec`, and of `status` the addresses, the `Ready` and
///   `NetworkUnavailable` conditions (without their messages) and the `nodeInfo` fields
///   `machineID`, `systemUUID`, `architecture` and `operatingSystem`. Images, capacity,
///   allocatable, volumes and the other `nodeInfo` strings are dropped by the framework before
///   it builds the view (a view built with [`NodeView::from_node`] keeps whatever its `Node`
///   had).
/// - **A full `Node` on request**: [`NodeView::to_node`] rebuilds the k8s-openapi `Node` the
///   view was made from, field for field. It allocates (see its cost there), so call it only
///   where you need a `Node` (to hand one to code written for k8s-openapi), not per host of a
///   large host list.
///
/// Build one from a `Node` (in tests, or in a vendor's unit tests) with [`NodeView::from_node`]
/// or `NodeView::from(node)`; views of many Nodes share their strings when built by one
/// [`NodeViewInterner`]:
///
/// ```
/// use std::collections::BTreeMap;
///
/// use ccm_core::{Node, NodeView, ObjectMeta};
/// use ccm_core::k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
///
/// let node = Node {
///     metadata: ObjectMeta {
///         name: Some("worker-1".into()),
///         labels: Some(BTreeMap::from([("topology.kubernetes.io/zone".into(), "a".into())])),
///         ..Default::default()
///     },
///     spec: Some(NodeSpec { provider_id: Some("acme://i-1".into()), ..Default::default() }),
///     status: Some(NodeStatus {
///         addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: "10.0.0.1".into() }]),
///         ..Default::default()
///     }),
/// };
/// let view = NodeView::from_node(&node);
/// assert_eq!(view.name(), "worker-1");
/// assert_eq!(view.provider_id(), "acme://i-1");
/// assert_eq!(view.label("topology.kubernetes.io/zone"), Some("a"));
/// assert_eq!(view.address("InternalIP"), Some("10.0.0.1"));
/// // The full Node again, equal to the one it was made from.
/// assert_eq!(view.to_node(), node);
/// ```
#[derive(Clone, PartialEq)]
pub struct NodeView(Arc<Inner>);

/// A string of a view: one shared with other views (interned, or the Node's name), or one of
/// the view's own, `len` bytes of its `text` from `start`.
#[derive(Clone, PartialEq)]
enum Str {
    Shared(Arc<str>),
    Own { start: u32, len: u32 },
}

impl Str {
    /// The empty string (no allocation, no text).
    const EMPTY: Str = Str::Own { start: 0, len: 0 };
    /// An optional field that is unset. No own string starts at `u32::MAX`: a view's own text
    /// stays shorter than that (longer strings are [`Str::Shared`], see `build.rs`).
    const UNSET: Str = Str::Own {
        start: u32::MAX,
        len: 0,
    };
}

/// Label or annotation pairs sorted by key, shared by every view that has the same ones.
type Pairs = Arc<[Pair]>;

/// One label or annotation.
#[derive(PartialEq)]
struct Pair {
    key: Arc<str>,
    value: Value,
}

/// A label or annotation value: a shared string, or the Node's name (the hostname label), so
/// that Nodes differing only by name share their set.
#[derive(PartialEq)]
enum Value {
    Shared(Arc<str>),
    Name,
}

/// In declaration order (`repr(C)`): the fields a pass over every cached Node reads (the
/// node-lifecycle monitor reads name, provider ID, taints and the `Ready` condition of 100,000
/// Nodes every 5 s) come first, so that they share one or two cache lines.
#[derive(PartialEq)]
#[repr(C)]
struct Inner {
    name: Option<Arc<str>>,
    /// The strings of this Node no other Node has (uid, resourceVersion, providerID, pod
    /// CIDRs, addresses other than the name, machine ID, system UUID), one after the other in
    /// one allocation; the [`Str::Own`]s point into it.
    text: Box<str>,
    provider_id: Str,
    taints: Option<Box<[Taint]>>,
    conditions: Option<Box<[NodeViewCondition]>>,
    labels: Option<Pairs>,
    /// `status.addresses` as (type, address) pairs, then `spec.podCIDRs`.
    lists: Box<[Str]>,
    /// How many of `lists` are addresses (twice the number of addresses).
    address_strs: usize,
    uid: Str,
    resource_version: Str,
    pod_cidr: Str,
    annotations: Option<Pairs>,
    /// `status.nodeInfo`: architecture, operatingSystem, machineID, systemUUID.
    node_info: [Str; 4],
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    /// Every other field the Node had (owner references, finalizers, `spec.configSource`,
    /// `status.phase`, images when not stripped, ...), as a `Node` holding only those; `None`
    /// (the usual case) when there are none.
    rest: Option<Box<Node>>,
    unschedulable: Option<bool>,
    /// Which optional parts the Node had (`Some` with every field unset is not `None`).
    present: Present,
}

#[derive(Clone, Copy, PartialEq, Default)]
struct Present {
    spec: bool,
    status: bool,
    node_info: bool,
    addresses: bool,
    pod_cidrs: bool,
}

/// The positions of the `nodeInfo` strings in [`Inner::node_info`].
const ARCHITECTURE: usize = 0;
const OPERATING_SYSTEM: usize = 1;
const MACHINE_ID: usize = 2;
const SYSTEM_UUID: usize = 3;

/// One condition of a [`NodeView`] (`status.conditions[]`): its type, status, reason, message
/// and times, read through methods.
#[derive(Clone, PartialEq)]
pub struct NodeViewCondition {
    type_: Arc<str>,
    status: Arc<str>,
    reason: Option<Arc<str>>,
    message: Option<Box<str>>,
    last_heartbeat_time: Option<Time>,
    last_transition_time: Option<Time>,
}

impl NodeViewCondition {
    /// The condition's type (`Ready`, `NetworkUnavailable`, ...).
    pub fn type_(&self) -> &str {
        &self.type_
    }

    /// Its status: `True`, `False` or `Unknown`.
    pub fn status(&self) -> &str {
        &self.status
    }

    /// Its reason (a CamelCase word), when set.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Its message, when set (the framework's cache drops condition messages).
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// When the condition was last probed.
    pub fn last_heartbeat_time(&self) -> Option<&Time> {
        self.last_heartbeat_time.as_ref()
    }

    /// When the condition last changed status.
    pub fn last_transition_time(&self) -> Option<&Time> {
        self.last_transition_time.as_ref()
    }

    fn to_condition(&self) -> NodeCondition {
        NodeCondition {
            type_: self.type_.to_string(),
            status: self.status.to_string(),
            reason: self.reason.as_deref().map(String::from),
            message: self.message.as_deref().map(String::from),
            last_heartbeat_time: self.last_heartbeat_time.clone(),
            last_transition_time: self.last_transition_time.clone(),
        }
    }
}

impl fmt::Debug for NodeViewCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_condition(), f)
    }
}

impl fmt::Debug for NodeView {
    /// Prints the `Node` the view stands for.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("NodeView").field(&self.to_node()).finish()
    }
}

impl NodeView {
    /// The view of `node`, which keeps every field `node` has (so [`to_node`](Self::to_node)
    /// gives back an equal `Node`). Copies the strings, shares them with no other view; for
    /// tests and vendors' unit tests. A cache of many Nodes builds its views with one
    /// [`NodeViewInterner`] instead.
    pub fn from_node(node: &Node) -> NodeView {
        NodeViewInterner::default().view(node.clone())
    }

    /// The full k8s-openapi `Node` this view stands for, equal field for field to the `Node` it
    /// was built from (for the framework's cache: the Node as the API server sent it, less what
    /// the cache strips; see the type's documentation).
    ///
    /// **Cost**: it allocates a new `Node` with every string copied: about 5.5 KB in some 50
    /// allocations and 5 µs for a kubelet-registered Node with a dozen labels (measured by the
    /// `node_memory` bench of `ccm-controllers`). Fine for one Node or a batch of a few hundred;
    /// for a host list of 100,000 it is half a gigabyte and half a second per call: read the
    /// view's accessors there instead.
    pub fn to_node(&self) -> Node {
        let i = &*self.0;
        let mut node = i.rest.as_deref().cloned().unwrap_or_default();
        let map = |pairs: &Option<Pairs>| {
            pairs.as_ref().map(|p| {
                self.pairs(p)
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        let string = |s: &Str| self.get(s).map(String::from);
        let meta = &mut node.metadata;
        meta.name = i.name.as_deref().map(String::from);
        meta.uid = string(&i.uid);
        meta.resource_version = string(&i.resource_version);
        meta.creation_timestamp = i.creation_timestamp.clone();
        meta.deletion_timestamp = i.deletion_timestamp.clone();
        meta.labels = map(&i.labels);
        meta.annotations = map(&i.annotations);
        if i.present.spec {
            let spec = node.spec.get_or_insert_with(NodeSpec::default);
            spec.provider_id = string(&i.provider_id);
            spec.pod_cidr = string(&i.pod_cidr);
            spec.pod_cidrs = i
                .present
                .pod_cidrs
                .then(|| self.pod_cidrs().map(String::from).collect());
            spec.taints = i.taints.as_ref().map(|t| t.to_vec());
            spec.unschedulable = i.unschedulable;
        }
        if i.present.status {
            let status = node.status.get_or_insert_with(NodeStatus::default);
            status.addresses = i.present.addresses.then(|| {
                self.addresses()
                    .map(|(type_, address)| NodeAddress {
                        type_: type_.to_string(),
                        address: address.to_string(),
                    })
                    .collect()
            });
            status.conditions = i
                .conditions
                .as_ref()
                .map(|c| c.iter().map(NodeViewCondition::to_condition).collect());
            if i.present.node_info {
                let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
                info.architecture = self.architecture().to_string();
                info.operating_system = self.operating_system().to_string();
                info.machine_id = self.machine_id().to_string();
                info.system_uuid = self.system_uuid().to_string();
            }
        }
        node
    }

    /// `metadata.name` (empty when unset, which the API server never allows).
    pub fn name(&self) -> &str {
        self.0.name.as_deref().unwrap_or_default()
    }

    /// `metadata.name` as the shared string the view holds (no copy).
    pub fn name_arc(&self) -> Option<&Arc<str>> {
        self.0.name.as_ref()
    }

    /// `metadata.uid`, when set.
    pub fn uid(&self) -> Option<&str> {
        self.get(&self.0.uid)
    }

    /// `metadata.resourceVersion`, when set.
    pub fn resource_version(&self) -> Option<&str> {
        self.get(&self.0.resource_version)
    }

    /// `metadata.creationTimestamp`, when set.
    pub fn creation_timestamp(&self) -> Option<&Time> {
        self.0.creation_timestamp.as_ref()
    }

    /// `metadata.deletionTimestamp`: set when the Node is being deleted.
    pub fn deletion_timestamp(&self) -> Option<&Time> {
        self.0.deletion_timestamp.as_ref()
    }

    /// `metadata.finalizers` (empty when none).
    pub fn finalizers(&self) -> &[String] {
        self.0
            .rest
            .as_ref()
            .and_then(|n| n.metadata.finalizers.as_deref())
            .unwrap_or_default()
    }

    /// Whether the Node has a label map at all (`metadata.labels` set, possibly empty).
    pub fn has_labels(&self) -> bool {
        self.0.labels.is_some()
    }

    /// The value of the label `key`, if the Node has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.find(self.0.labels.as_deref(), key)
    }

    /// Every label as `(key, value)`, sorted by key.
    pub fn labels(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.pairs(self.0.labels.as_deref().unwrap_or_default())
    }

    /// Whether the Node has an annotation map at all (`metadata.annotations` set).
    pub fn has_annotations(&self) -> bool {
        self.0.annotations.is_some()
    }

    /// The value of the annotation `key`, if the Node has it.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.find(self.0.annotations.as_deref(), key)
    }

    /// Every annotation as `(key, value)`, sorted by key.
    pub fn annotations(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.pairs(self.0.annotations.as_deref().unwrap_or_default())
    }

    /// `spec.providerID` (empty when unset, as Go's `node.Spec.ProviderID`).
    pub fn provider_id(&self) -> &str {
        self.get(&self.0.provider_id).unwrap_or_default()
    }

    /// Whether `spec.providerID` is set (possibly to the empty string).
    pub fn has_provider_id(&self) -> bool {
        self.get(&self.0.provider_id).is_some()
    }

    /// `spec.podCIDR`, when set.
    pub fn pod_cidr(&self) -> Option<&str> {
        self.get(&self.0.pod_cidr)
    }

    /// `spec.podCIDRs` (empty when unset).
    pub fn pod_cidrs(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let lists = &self.0.lists;
        lists
            .get(self.0.address_strs..)
            .unwrap_or_default()
            .iter()
            .map(|s| self.text(s))
    }

    /// `spec.taints` (empty when none).
    pub fn taints(&self) -> &[Taint] {
        self.0.taints.as_deref().unwrap_or_default()
    }

    /// Whether the Node has a taint with this key (any effect).
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints().iter().any(|t| t.key == key)
    }

    /// `spec.unschedulable` (false when unset): the Node is cordoned.
    pub fn unschedulable(&self) -> bool {
        self.0.unschedulable.unwrap_or(false)
    }

    /// `status.addresses` as `(type, address)` pairs, in the Node's order (`InternalIP`,
    /// `ExternalIP`, `Hostname`, `InternalDNS`, `ExternalDNS`).
    pub fn addresses(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        let lists = &self.0.lists;
        lists
            .get(..self.0.address_strs)
            .unwrap_or_default()
            .chunks_exact(2)
            .map(|pair| (self.text(&pair[0]), self.text(&pair[1])))
    }

    /// The first address of this type (`InternalIP`, ...), if any.
    pub fn address(&self, type_: &str) -> Option<&str> {
        self.addresses().find(|(t, _)| *t == type_).map(|(_, a)| a)
    }

    /// `status.conditions` that the view holds (the framework's cache keeps `Ready` and
    /// `NetworkUnavailable`).
    pub fn conditions(&self) -> &[NodeViewCondition] {
        self.0.conditions.as_deref().unwrap_or_default()
    }

    /// The condition of this type (`Ready`, `NetworkUnavailable`), if the Node has it.
    pub fn condition(&self, type_: &str) -> Option<&NodeViewCondition> {
        self.conditions().iter().find(|c| c.type_() == type_)
    }

    /// Whether the `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.condition(crate::well_known::CONDITION_READY)
            .is_some_and(|c| c.status() == "True")
    }

    /// `status.nodeInfo.systemUUID` (empty when unset).
    pub fn system_uuid(&self) -> &str {
        self.text(&self.0.node_info[SYSTEM_UUID])
    }

    /// `status.nodeInfo.machineID` (empty when unset).
    pub fn machine_id(&self) -> &str {
        self.text(&self.0.node_info[MACHINE_ID])
    }

    /// `status.nodeInfo.architecture` (empty when unset).
    pub fn architecture(&self) -> &str {
        self.text(&self.0.node_info[ARCHITECTURE])
    }

    /// `status.nodeInfo.operatingSystem` (empty when unset).
    pub fn operating_system(&self) -> &str {
        self.text(&self.0.node_info[OPERATING_SYSTEM])
    }

    /// Whether two views are the same shared value (not just equal): a cheap check that a
    /// cached Node did not change.
    pub fn ptr_eq(&self, other: &NodeView) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The string `s` stands for; `None` for [`Str::UNSET`].
    fn get<'a>(&'a self, s: &'a Str) -> Option<&'a str> {
        match s {
            Str::Shared(shared) => Some(shared),
            Str::Own { start, len } => {
                let start = usize::try_from(*start).ok()?;
                let end = start.checked_add(usize::try_from(*len).ok()?)?;
                // `UNSET` starts past the end of every text.
                self.0.text.get(start..end)
            }
        }
    }

    /// The string `s` stands for, empty when unset.
    fn text<'a>(&'a self, s: &'a Str) -> &'a str {
        self.get(s).unwrap_or_default()
    }

    /// A label or annotation value.
    fn value<'a>(&'a self, value: &'a Value) -> &'a str {
        match value {
            Value::Shared(shared) => shared,
            Value::Name => self.name(),
        }
    }

    fn pairs<'a>(
        &'a self,
        pairs: &'a [Pair],
    ) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + 'a {
        pairs.iter().map(|p| (&*p.key, self.value(&p.value)))
    }

    fn find<'a>(&'a self, pairs: Option<&'a [Pair]>, key: &str) -> Option<&'a str> {
        let pairs = pairs?;
        let i = pairs.binary_search_by(|p| (*p.key).cmp(key)).ok()?;
        pairs.get(i).map(|p| self.value(&p.value))
    }
}

impl From<&Node> for NodeView {
    fn from(node: &Node) -> Self {
        NodeView::from_node(node)
    }
}

impl From<Node> for NodeView {
    fn from(node: Node) -> Self {
        NodeViewInterner::default().view(node)
    }
}

impl From<&NodeView> for Node {
    /// [`NodeView::to_node`]: allocates a full copy.
    fn from(view: &NodeView) -> Self {
        view.to_node()
    }
}
