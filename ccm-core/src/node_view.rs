//! [`NodeView`]: a read-only, compact, shared view of a Kubernetes Node, as the framework caches
//! it and hands it to providers.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::Node;

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
/// - **Compact**: label and annotation keys and values are interned (`Arc<str>` shared by every
///   Node that has them), and only the fields a CCM reads are kept, so a cached Node costs about
///   a quarter of a k8s-openapi `Node` (see docs/performance.md).
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
/// or `NodeView::from(node)`:
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

/// Key/value pairs (labels, annotations), sorted by key; or (type, address) pairs in order.
type Pairs = Option<Box<[(Arc<str>, Arc<str>)]>>;

#[derive(PartialEq)]
struct Inner {
    name: Option<Arc<str>>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Pairs,
    annotations: Pairs,
    provider_id: Option<Box<str>>,
    pod_cidr: Option<Box<str>>,
    pod_cidrs: Option<Box<[Box<str>]>>,
    taints: Option<Box<[Taint]>>,
    unschedulable: Option<bool>,
    addresses: Pairs,
    conditions: Option<Box<[NodeViewCondition]>>,
    node_info: Option<KeptNodeInfo>,
    /// Which of `spec`, `status`, `status.nodeInfo` the Node had (`Some` with every field
    /// unset is not `None`).
    present: Present,
    /// Every other field the Node had (owner references, finalizers, `spec.configSource`,
    /// `status.phase`, images when not stripped, ...), as a `Node` holding only those; `None`
    /// (the usual case) when there are none.
    rest: Option<Box<Node>>,
}

#[derive(Clone, Copy, PartialEq, Default)]
struct Present {
    spec: bool,
    status: bool,
}

/// The `nodeInfo` strings a view keeps.
#[derive(PartialEq)]
struct KeptNodeInfo {
    architecture: Arc<str>,
    operating_system: Arc<str>,
    machine_id: Box<str>,
    system_uuid: Box<str>,
}

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
            message: unboxed(&self.message),
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

fn boxed(s: Option<String>) -> Option<Box<str>> {
    s.map(String::into_boxed_str)
}

fn unboxed(s: &Option<Box<str>>) -> Option<String> {
    s.as_deref().map(String::from)
}

/// Builds views sharing their strings: the interning function and the Node's name (a label
/// value, annotation value or address equal to the name shares its `Arc`).
struct Builder<'a> {
    intern: &'a mut dyn FnMut(&str) -> Arc<str>,
    name: Option<Arc<str>>,
}

impl Builder<'_> {
    fn shared(&mut self, s: &str) -> Arc<str> {
        match &self.name {
            Some(name) if **name == *s => name.clone(),
            _ => (self.intern)(s),
        }
    }

    /// `s` sharing the name's `Arc` when equal to it, else its own allocation (for strings
    /// unique to a Node: its addresses).
    fn named_or_own(&self, s: &str) -> Arc<str> {
        match &self.name {
            Some(name) if **name == *s => name.clone(),
            _ => Arc::from(s),
        }
    }

    fn pairs(&mut self, map: Option<BTreeMap<String, String>>) -> Pairs {
        map.map(|m| {
            m.iter()
                .map(|(k, v)| ((self.intern)(k), self.shared(v)))
                .collect()
        })
    }
}

/// No interning: every string its own allocation.
fn own(s: &str) -> Arc<str> {
    Arc::from(s)
}

impl NodeView {
    /// The view of `node`, which keeps every field `node` has (so [`to_node`](Self::to_node)
    /// gives back an equal `Node`). Copies the strings; for tests and vendors' unit tests.
    pub fn from_node(node: &Node) -> NodeView {
        NodeView::from_node_interned(node.clone(), &mut own)
    }

    /// The view of `node`, taking its fields. Every string many Nodes share (label and
    /// annotation keys and values, address types, condition types, statuses and
    /// reasons, the `nodeInfo` architecture and operating system) is obtained from `intern`: a
    /// cache of many Nodes passes a function that returns one shared `Arc<str>` per distinct
    /// string. Values equal to the Node's name (the hostname label, the `Hostname` address)
    /// share the name's `Arc` without asking `intern`.
    ///
    /// The framework's Node informer builds its views with this; a vendor rarely needs it.
    pub fn from_node_interned(
        mut node: Node,
        intern: &mut dyn FnMut(&str) -> Arc<str>,
    ) -> NodeView {
        let meta = &mut node.metadata;
        let mut b = Builder {
            intern,
            name: meta.name.take().map(Arc::from),
        };
        let labels = b.pairs(meta.labels.take());
        let annotations = b.pairs(meta.annotations.take());
        let uid = boxed(meta.uid.take());
        let resource_version = boxed(meta.resource_version.take());
        let creation_timestamp = meta.creation_timestamp.take();
        let deletion_timestamp = meta.deletion_timestamp.take();

        let present = Present {
            spec: node.spec.is_some(),
            status: node.status.is_some(),
        };
        let mut spec = node.spec.take().unwrap_or_default();
        let provider_id = boxed(spec.provider_id.take());
        let pod_cidr = boxed(spec.pod_cidr.take());
        let pod_cidrs = spec
            .pod_cidrs
            .take()
            .map(|c| c.into_iter().map(String::into_boxed_str).collect());
        let taints = spec.taints.take().map(Vec::into_boxed_slice);
        let unschedulable = spec.unschedulable.take();
        if spec != NodeSpec::default() {
            node.spec = Some(spec);
        }

        let mut status = node.status.take().unwrap_or_default();
        let addresses = status.addresses.take().map(|addresses| {
            addresses
                .into_iter()
                .map(|a| ((b.intern)(&a.type_), b.named_or_own(&a.address)))
                .collect()
        });
        let conditions = status.conditions.take().map(|conditions| {
            conditions
                .into_iter()
                .map(|c| NodeViewCondition {
                    type_: (b.intern)(&c.type_),
                    status: (b.intern)(&c.status),
                    reason: c.reason.as_deref().map(|r| (b.intern)(r)),
                    message: boxed(c.message),
                    last_heartbeat_time: c.last_heartbeat_time,
                    last_transition_time: c.last_transition_time,
                })
                .collect()
        });
        let node_info = status.node_info.take().map(|mut info| {
            let kept = KeptNodeInfo {
                architecture: (b.intern)(&std::mem::take(&mut info.architecture)),
                operating_system: (b.intern)(&std::mem::take(&mut info.operating_system)),
                machine_id: std::mem::take(&mut info.machine_id).into_boxed_str(),
                system_uuid: std::mem::take(&mut info.system_uuid).into_boxed_str(),
            };
            if info != NodeSystemInfo::default() {
                status.node_info = Some(info);
            }
            kept
        });
        if status != NodeStatus::default() {
            node.status = Some(status);
        }
        let rest = (node != Node::default()).then(|| Box::new(node));

        NodeView(Arc::new(Inner {
            name: b.name,
            uid,
            resource_version,
            creation_timestamp,
            deletion_timestamp,
            labels,
            annotations,
            provider_id,
            pod_cidr,
            pod_cidrs,
            taints,
            unschedulable,
            addresses,
            conditions,
            node_info,
            present,
            rest,
        }))
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
        let map = |pairs: &Pairs| {
            pairs.as_ref().map(|p| {
                p.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        let meta = &mut node.metadata;
        meta.name = i.name.as_deref().map(String::from);
        meta.uid = unboxed(&i.uid);
        meta.resource_version = unboxed(&i.resource_version);
        meta.creation_timestamp = i.creation_timestamp.clone();
        meta.deletion_timestamp = i.deletion_timestamp.clone();
        meta.labels = map(&i.labels);
        meta.annotations = map(&i.annotations);
        if i.present.spec {
            let spec = node.spec.get_or_insert_with(NodeSpec::default);
            spec.provider_id = unboxed(&i.provider_id);
            spec.pod_cidr = unboxed(&i.pod_cidr);
            spec.pod_cidrs = i
                .pod_cidrs
                .as_ref()
                .map(|c| c.iter().map(|c| String::from(&**c)).collect());
            spec.taints = i.taints.as_ref().map(|t| t.to_vec());
            spec.unschedulable = i.unschedulable;
        }
        if i.present.status {
            let status = node.status.get_or_insert_with(NodeStatus::default);
            status.addresses = i.addresses.as_ref().map(|addresses| {
                addresses
                    .iter()
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
            if let Some(kept) = &i.node_info {
                let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
                info.architecture = kept.architecture.to_string();
                info.operating_system = kept.operating_system.to_string();
                info.machine_id = kept.machine_id.to_string();
                info.system_uuid = kept.system_uuid.to_string();
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
        self.0.uid.as_deref()
    }

    /// `metadata.resourceVersion`, when set.
    pub fn resource_version(&self) -> Option<&str> {
        self.0.resource_version.as_deref()
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
        find(&self.0.labels, key)
    }

    /// Every label as `(key, value)`, sorted by key.
    pub fn labels(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        iter(&self.0.labels)
    }

    /// Whether the Node has an annotation map at all (`metadata.annotations` set).
    pub fn has_annotations(&self) -> bool {
        self.0.annotations.is_some()
    }

    /// The value of the annotation `key`, if the Node has it.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        find(&self.0.annotations, key)
    }

    /// Every annotation as `(key, value)`, sorted by key.
    pub fn annotations(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        iter(&self.0.annotations)
    }

    /// `spec.providerID` (empty when unset, as Go's `node.Spec.ProviderID`).
    pub fn provider_id(&self) -> &str {
        self.0.provider_id.as_deref().unwrap_or_default()
    }

    /// Whether `spec.providerID` is set (possibly to the empty string).
    pub fn has_provider_id(&self) -> bool {
        self.0.provider_id.is_some()
    }

    /// `spec.podCIDR`, when set.
    pub fn pod_cidr(&self) -> Option<&str> {
        self.0.pod_cidr.as_deref()
    }

    /// `spec.podCIDRs` (empty when unset).
    pub fn pod_cidrs(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.0
            .pod_cidrs
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|c| &**c)
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
        iter(&self.0.addresses)
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
        self.0
            .node_info
            .as_ref()
            .map(|i| &*i.system_uuid)
            .unwrap_or_default()
    }

    /// `status.nodeInfo.machineID` (empty when unset).
    pub fn machine_id(&self) -> &str {
        self.0
            .node_info
            .as_ref()
            .map(|i| &*i.machine_id)
            .unwrap_or_default()
    }

    /// `status.nodeInfo.architecture` (empty when unset).
    pub fn architecture(&self) -> &str {
        self.0
            .node_info
            .as_ref()
            .map(|i| &*i.architecture)
            .unwrap_or_default()
    }

    /// `status.nodeInfo.operatingSystem` (empty when unset).
    pub fn operating_system(&self) -> &str {
        self.0
            .node_info
            .as_ref()
            .map(|i| &*i.operating_system)
            .unwrap_or_default()
    }

    /// Whether two views are the same shared value (not just equal): a cheap check that a
    /// cached Node did not change.
    pub fn ptr_eq(&self, other: &NodeView) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

fn iter(pairs: &Pairs) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
    pairs
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| (&**k, &**v))
}

fn find<'a>(pairs: &'a Pairs, key: &str) -> Option<&'a str> {
    let pairs = pairs.as_deref()?;
    pairs
        .binary_search_by(|(k, _)| (**k).cmp(key))
        .ok()
        .map(|i| &*pairs[i].1)
}

impl From<&Node> for NodeView {
    fn from(node: &Node) -> Self {
        NodeView::from_node(node)
    }
}

impl From<Node> for NodeView {
    fn from(node: Node) -> Self {
        NodeView::from_node_interned(node, &mut own)
    }
}

impl From<&NodeView> for Node {
    /// [`NodeView::to_node`]: allocates a full copy.
    fn from(view: &NodeView) -> Self {
        view.to_node()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ObjectMeta;
    use k8s_openapi::api::core::v1::{NodeConfigSource, NodeSwapStatus};
    use std::collections::HashSet;

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default())
    }

    /// A kubelet-registered, initialised Node with some of every part.
    fn full_node() -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("worker-1".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("42".into()),
                creation_timestamp: Some(time(1)),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".into(), "worker-1".into()),
                    ("topology.kubernetes.io/zone".into(), "zone-a".into()),
                    ("a".into(), String::new()),
                ])),
                annotations: Some(BTreeMap::from([(
                    "node.alpha.kubernetes.io/ttl".into(),
                    "0".into(),
                )])),
                finalizers: Some(vec!["example.com/keep".into()]),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some("acme://i-1".into()),
                pod_cidr: Some("10.244.1.0/24".into()),
                pod_cidrs: Some(vec!["10.244.1.0/24".into(), "fd00::/64".into()]),
                taints: Some(vec![Taint {
                    key: "node.cloudprovider.kubernetes.io/uninitialized".into(),
                    value: Some("true".into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                }]),
                unschedulable: Some(true),
                config_source: Some(NodeConfigSource::default()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: "10.0.0.1".into(),
                    },
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: "worker-1".into(),
                    },
                ]),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: Some("KubeletReady".into()),
                    message: None,
                    last_heartbeat_time: Some(time(3)),
                    last_transition_time: Some(time(2)),
                }]),
                node_info: Some(NodeSystemInfo {
                    architecture: "amd64".into(),
                    operating_system: "linux".into(),
                    machine_id: "m-1".into(),
                    system_uuid: "SYS-UUID".into(),
                    swap: Some(NodeSwapStatus::default()),
                    ..Default::default()
                }),
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn accessors_read_the_node() {
        let view = NodeView::from_node(&full_node());
        assert_eq!(view.name(), "worker-1");
        assert_eq!(view.uid(), Some("uid-1"));
        assert_eq!(view.resource_version(), Some("42"));
        assert_eq!(view.creation_timestamp(), Some(&time(1)));
        assert_eq!(view.deletion_timestamp(), None);
        assert_eq!(view.finalizers(), ["example.com/keep".to_string()]);
        assert_eq!(view.label("topology.kubernetes.io/zone"), Some("zone-a"));
        assert_eq!(view.label("a"), Some(""));
        assert_eq!(view.label("missing"), None);
        assert_eq!(
            view.labels().map(|(k, _)| k).collect::<Vec<_>>(),
            ["a", "kubernetes.io/hostname", "topology.kubernetes.io/zone"]
        );
        assert_eq!(view.annotation("node.alpha.kubernetes.io/ttl"), Some("0"));
        assert_eq!(view.provider_id(), "acme://i-1");
        assert_eq!(view.pod_cidr(), Some("10.244.1.0/24"));
        assert_eq!(
            view.pod_cidrs().collect::<Vec<_>>(),
            ["10.244.1.0/24", "fd00::/64"]
        );
        assert!(view.has_taint("node.cloudprovider.kubernetes.io/uninitialized"));
        assert!(view.unschedulable());
        assert_eq!(view.address("InternalIP"), Some("10.0.0.1"));
        assert_eq!(view.address("ExternalIP"), None);
        assert_eq!(view.addresses().len(), 2);
        let ready = view.condition("Ready").unwrap();
        assert_eq!(
            (ready.status(), ready.reason()),
            ("True", Some("KubeletReady"))
        );
        assert_eq!(ready.last_heartbeat_time(), Some(&time(3)));
        assert!(view.is_ready());
        assert_eq!(view.system_uuid(), "SYS-UUID");
        assert_eq!(view.machine_id(), "m-1");
        assert_eq!(view.architecture(), "amd64");
        assert_eq!(view.operating_system(), "linux");
    }

    #[test]
    fn to_node_gives_back_the_node_field_for_field() {
        for node in [
            full_node(),
            Node::default(),
            Node {
                spec: Some(NodeSpec::default()),
                status: Some(NodeStatus {
                    node_info: Some(NodeSystemInfo::default()),
                    ..Default::default()
                }),
                metadata: ObjectMeta {
                    labels: Some(BTreeMap::new()),
                    ..Default::default()
                },
            },
        ] {
            assert_eq!(NodeView::from_node(&node).to_node(), node);
            assert_eq!(Node::from(&NodeView::from(node.clone())), node);
        }
    }

    #[test]
    fn a_default_like_node_has_no_rest() {
        let mut node = full_node();
        node.metadata.finalizers = None;
        node.spec.as_mut().unwrap().config_source = None;
        let status = node.status.as_mut().unwrap();
        status.phase = None;
        status.node_info.as_mut().unwrap().swap = None;
        assert!(NodeView::from_node(&node).0.rest.is_none());
        assert!(NodeView::from_node(&full_node()).0.rest.is_some());
    }

    #[test]
    fn interned_strings_are_shared_between_views_and_with_the_name() {
        let mut table: HashSet<Arc<str>> = HashSet::new();
        let mut intern = |s: &str| -> Arc<str> {
            if let Some(shared) = table.get(s) {
                return shared.clone();
            }
            let shared: Arc<str> = Arc::from(s);
            table.insert(shared.clone());
            shared
        };
        let a = NodeView::from_node_interned(full_node(), &mut intern);
        let mut other = full_node();
        other.metadata.name = Some("worker-2".into());
        let b = NodeView::from_node_interned(other, &mut intern);
        let zone = |v: &NodeView| v.0.labels.as_ref().unwrap()[2].1.clone();
        assert!(Arc::ptr_eq(&zone(&a), &zone(&b)));
        // The hostname label value and the Hostname address share the name's Arc.
        let name = a.name_arc().unwrap().clone();
        assert!(Arc::ptr_eq(&a.0.labels.as_ref().unwrap()[1].1, &name));
        assert!(Arc::ptr_eq(&a.0.addresses.as_ref().unwrap()[1].1, &name));
        assert_eq!(a.to_node(), full_node());
        assert!(a.ptr_eq(&a.clone()));
        assert!(!a.ptr_eq(&NodeView::from_node(&full_node())));
        assert_eq!(a, NodeView::from_node(&full_node()));
    }
}
