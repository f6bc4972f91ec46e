//! Pure planning for the service controller: which Services are handled, which changes matter,
//! which Nodes are load-balancer hosts, and what to do with a Service. No I/O here; the async
//! shell in `super::sync` fetches, calls the cloud and writes.
//!
//! Each function follows a rule of Go's `k8s.io/cloud-provider/controllers/service`; where
//! this crate deliberately differs, the function's doc says so.

use std::collections::BTreeMap;
use std::sync::Arc;

use ccm_core::well_known::{
    FINALIZER_LOAD_BALANCER_CLEANUP, LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS,
    TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER,
};
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Node, Service, ServicePort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

/// `spec.type` of the Services this controller handles.
pub const TYPE_LOAD_BALANCER: &str = "LoadBalancer";

/// How many node names an `UpdateLoadBalancerFailed` event lists (Go's `maxNodeNamesToLog`).
pub const MAX_NODE_NAMES_TO_LOG: usize = 20;

/// Whether this controller handles the Service: `spec.type == LoadBalancer` and no
/// `spec.loadBalancerClass` (any class, whatever its value, belongs to another controller).
pub fn wants_load_balancer(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some(TYPE_LOAD_BALANCER) && spec.load_balancer_class.is_none()
    })
}

/// Whether the Service carries the `service.kubernetes.io/load-balancer-cleanup` finalizer.
pub fn has_cleanup_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
}

/// Whether the Service is being deleted (`metadata.deletionTimestamp` set).
pub fn is_being_deleted(service: &Service) -> bool {
    service.metadata.deletion_timestamp.is_some()
}

/// Whether the Service's load balancer must be cleaned up: it carries the cleanup finalizer and
/// is being deleted or no longer wants a load balancer from this controller.
///
/// Go's `needsCleanup` checks deletion and `type != LoadBalancer` only. Here "no longer wants
/// one" also covers a Service that carries our finalizer but has a `spec.loadBalancerClass`
/// (the class is immutable on a LoadBalancer Service, so this happens only when a Service
/// changes type to LoadBalancer *with* a class after having been ours): the finalizer proves a
/// load balancer of ours may exist, and a class means it is not ours to keep, so it is deleted
/// rather than leaked. Go reaches the same delete branch for such a Service once it is queued.
pub fn needs_cleanup(service: &Service) -> bool {
    has_cleanup_finalizer(service) && (is_being_deleted(service) || !wants_load_balancer(service))
}

/// Why a Service update triggers a sync (Go's `needsUpdate`), with the Normal event Go emits
/// for some of the reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateTrigger {
    /// What changed (also the event reason when [`UpdateTrigger::event`] is set).
    pub reason: &'static str,
    /// The Normal event Go records on the Service for this change: `(reason, note)`.
    pub event: Option<(&'static str, String)>,
}

impl UpdateTrigger {
    fn silent(reason: &'static str) -> Self {
        UpdateTrigger {
            reason,
            event: None,
        }
    }

    fn with_event(reason: &'static str, note: String) -> Self {
        UpdateTrigger {
            reason,
            event: Some((reason, note)),
        }
    }
}

fn str_or_empty(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or_default()
}

fn slice_or_empty<T>(v: &Option<Vec<T>>) -> &[T] {
    v.as_deref().unwrap_or_default()
}

/// Go's `%v` of a `[]string`: `[a b c]`.
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

fn target_port(p: &ServicePort) -> IntOrString {
    p.target_port.clone().unwrap_or(IntOrString::Int(0))
}

/// Go's `portEqualForLB`: name, protocol, port, nodePort, targetPort and appProtocol.
fn port_equal_for_lb(x: &ServicePort, y: &ServicePort) -> bool {
    str_or_empty(&x.name) == str_or_empty(&y.name)
        && str_or_empty(&x.protocol) == str_or_empty(&y.protocol)
        && x.port == y.port
        && x.node_port.unwrap_or(0) == y.node_port.unwrap_or(0)
        && target_port(x) == target_port(y)
        && x.app_protocol == y.app_protocol
}

/// Go's `portsEqualForLB`: same length and equal position by position.
fn ports_equal_for_lb(old: &Service, new: &Service) -> bool {
    let x = old
        .spec
        .as_ref()
        .map(|s| slice_or_empty(&s.ports))
        .unwrap_or_default();
    let y = new
        .spec
        .as_ref()
        .map(|s| slice_or_empty(&s.ports))
        .unwrap_or_default();
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| port_equal_for_lb(a, b))
}

/// What in a Service update makes the controller sync it: Go's `needsUpdate` list, in Go's
/// order, with the event Go records for the first difference found. `None`: nothing relevant
/// changed (labels, `allocateLoadBalancerNodePorts`, `ipFamilyPolicy`, `internalTrafficPolicy`
/// and status changes are ignored, as are Services that want no load balancer before or after).
///
/// `nil` and empty lists/maps are treated as equal (Go's `reflect.DeepEqual` distinguishes
/// them, but the API server never round-trips an empty list differently from a missing one).
pub fn update_trigger(old: &Service, new: &Service) -> Option<UpdateTrigger> {
    let (old_wants, new_wants) = (wants_load_balancer(old), wants_load_balancer(new));
    if !old_wants && !new_wants {
        return None;
    }
    let default_spec = Default::default();
    let os = old.spec.as_ref().unwrap_or(&default_spec);
    let ns = new.spec.as_ref().unwrap_or(&default_spec);
    if old_wants != new_wants {
        return Some(UpdateTrigger::with_event(
            "Type",
            format!("{} -> {}", str_or_empty(&os.type_), str_or_empty(&ns.type_)),
        ));
    }
    let (old_ranges, new_ranges) = (
        slice_or_empty(&os.load_balancer_source_ranges),
        slice_or_empty(&ns.load_balancer_source_ranges),
    );
    if new_wants && old_ranges != new_ranges {
        return Some(UpdateTrigger::with_event(
            "LoadBalancerSourceRanges",
            format!("{} -> {}", go_list(old_ranges), go_list(new_ranges)),
        ));
    }
    if !ports_equal_for_lb(old, new) {
        return Some(UpdateTrigger::silent("Ports"));
    }
    if str_or_empty(&os.session_affinity) != str_or_empty(&ns.session_affinity) {
        return Some(UpdateTrigger::silent("SessionAffinity"));
    }
    if os.session_affinity_config != ns.session_affinity_config {
        return Some(UpdateTrigger::silent("SessionAffinityConfig"));
    }
    if str_or_empty(&os.load_balancer_ip) != str_or_empty(&ns.load_balancer_ip) {
        return Some(UpdateTrigger::with_event(
            "LoadbalancerIP",
            format!(
                "{} -> {}",
                str_or_empty(&os.load_balancer_ip),
                str_or_empty(&ns.load_balancer_ip)
            ),
        ));
    }
    let (old_ext, new_ext) = (
        slice_or_empty(&os.external_ips),
        slice_or_empty(&ns.external_ips),
    );
    if old_ext.len() != new_ext.len() {
        return Some(UpdateTrigger::with_event(
            "ExternalIP",
            format!("Count: {} -> {}", old_ext.len(), new_ext.len()),
        ));
    }
    if let Some((_, added)) = old_ext.iter().zip(new_ext).find(|(a, b)| a != b) {
        return Some(UpdateTrigger::with_event(
            "ExternalIP",
            format!("Added: {added}"),
        ));
    }
    let empty = BTreeMap::new();
    let old_ann = old.metadata.annotations.as_ref().unwrap_or(&empty);
    let new_ann = new.metadata.annotations.as_ref().unwrap_or(&empty);
    if old_ann != new_ann {
        return Some(UpdateTrigger::silent("Annotations"));
    }
    if str_or_empty(&old.metadata.uid) != str_or_empty(&new.metadata.uid) {
        return Some(UpdateTrigger::with_event(
            "UID",
            format!(
                "{} -> {}",
                str_or_empty(&old.metadata.uid),
                str_or_empty(&new.metadata.uid)
            ),
        ));
    }
    if str_or_empty(&os.external_traffic_policy) != str_or_empty(&ns.external_traffic_policy) {
        return Some(UpdateTrigger::with_event(
            "ExternalTrafficPolicy",
            format!(
                "{} -> {}",
                str_or_empty(&os.external_traffic_policy),
                str_or_empty(&ns.external_traffic_policy)
            ),
        ));
    }
    let (old_hc, new_hc) = (
        os.health_check_node_port.unwrap_or(0),
        ns.health_check_node_port.unwrap_or(0),
    );
    if old_hc != new_hc {
        return Some(UpdateTrigger::with_event(
            "HealthCheckNodePort",
            format!("{old_hc} -> {new_hc}"),
        ));
    }
    let (old_fam, new_fam) = (
        slice_or_empty(&os.ip_families).len(),
        slice_or_empty(&ns.ip_families).len(),
    );
    if old_fam != new_fam {
        return Some(UpdateTrigger::with_event(
            "IPFamilies",
            format!("Count: {old_fam} -> {new_fam}"),
        ));
    }
    None
}

/// Go's `needsUpdate(old, new)`: whether a Service update must be synced. See
/// [`update_trigger`] for the list.
pub fn needs_update(old: &Service, new: &Service) -> bool {
    update_trigger(old, new).is_some()
}

/// Whether a Service add (or a Service seen on start-up) is queued: it wants a load balancer
/// or needs cleanup (Go's add handler; this is what makes every LoadBalancer Service be
/// re-ensured on every start, and a Service deleted while the controller was down be cleaned
/// up).
pub fn should_enqueue_add(service: &Service) -> bool {
    wants_load_balancer(service) || needs_cleanup(service)
}

/// Whether a Service update is queued: [`needs_update`] or [`needs_cleanup`] of the new
/// object (Go's update handler).
pub fn should_enqueue_update(old: &Service, new: &Service) -> bool {
    needs_update(old, new) || needs_cleanup(new)
}

/// What to do with a Service found in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Add the finalizer, then create or update the load balancer and write its status.
    Ensure,
    /// Delete the load balancer (if the cloud has one), then remove the finalizer.
    Delete,
    /// Nothing of this controller's can exist for the Service; do nothing.
    Skip,
}

/// What to do with `service`. `previously_handled` says the controller has handled this
/// Service (same UID) as a load balancer since it started and not yet cleaned up after it.
///
/// - wants a load balancer and is not being deleted → [`Decision::Ensure`];
/// - otherwise (being deleted, type changed, class set), if the finalizer is present or the
///   controller handled it → [`Decision::Delete`] (Go's delete branch);
/// - otherwise → [`Decision::Skip`]: the finalizer is always added before anything is created
///   in the cloud, so without it and without a record of handling the Service there is no load
///   balancer of ours. (Go would try to *ensure* a Service being deleted that lacks the
///   finalizer, which the API server refuses, since no finalizer may be added to an object
///   being deleted; and it would call the cloud for every Service whose type flipped away
///   from LoadBalancer before it ever got one.)
pub fn decide(service: &Service, previously_handled: bool) -> Decision {
    if wants_load_balancer(service) && !is_being_deleted(service) {
        Decision::Ensure
    } else if has_cleanup_finalizer(service) || previously_handled {
        Decision::Delete
    } else {
        Decision::Skip
    }
}

/// Go's `strconv.ParseBool` returning `false`: the values of
/// `node.kubernetes.io/exclude-from-external-load-balancers` that do **not** exclude a Node.
fn parses_as_go_false(value: &str) -> bool {
    matches!(value, "0" | "f" | "F" | "false" | "FALSE" | "False")
}

/// §4.5 predicate 1: the Node is not being deleted.
pub fn node_not_deleted(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
}

/// §4.5 predicate 2: the Node is not excluded by the label
/// `node.kubernetes.io/exclude-from-external-load-balancers`: the label is absent, or its value
/// parses as Go boolean false (`false`, `0`, `f`, `F`, `FALSE`, `False`). Any other value,
/// including `true`, the empty string and garbage, excludes the Node.
pub fn node_included(node: &Node) -> bool {
    match node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS))
    {
        None => true,
        Some(value) => parses_as_go_false(value),
    }
}

/// §4.5 predicate 3: the Node has no taint with key `ToBeDeletedByClusterAutoscaler`.
pub fn node_not_tainted_for_deletion(node: &Node) -> bool {
    !node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER)
        })
}

/// Whether the Node is a load-balancer host: all three §4.5 predicates (Go's stable node set).
/// Readiness, schedulability and `externalTrafficPolicy` are deliberately not considered.
pub fn is_eligible_host(node: &Node) -> bool {
    node_not_deleted(node) && node_included(node) && node_not_tainted_for_deletion(node)
}

/// The eligible hosts among `nodes`, sorted by name (so the provider sees a stable order).
pub fn eligible_hosts(nodes: &[Arc<Node>]) -> Vec<Arc<Node>> {
    let mut hosts: Vec<Arc<Node>> = nodes
        .iter()
        .filter(|n| is_eligible_host(n))
        .cloned()
        .collect();
    hosts.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    hosts
}

/// Whether a Node update changes any load balancer's host list, so a node sync is needed.
///
/// Go triggers only when the exclusion-label predicate flipped or `spec.providerID` changed
/// (deletion or the autoscaler taint are then picked up only by a later sync). Here any flip
/// of the full eligibility ([`is_eligible_host`]) triggers too, so a Node tainted by the
/// cluster-autoscaler leaves the load balancers before it is drained. Ready/label/taint changes
/// that do not change eligibility never trigger.
pub fn node_update_needs_sync(old: &Node, new: &Node) -> bool {
    node_included(old) != node_included(new)
        || is_eligible_host(old) != is_eligible_host(new)
        || provider_id(old) != provider_id(new)
}

fn provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

/// What the controller remembers of a host it passed to the cloud: the Node fields whose
/// change requires an update (Go's `protoNode`: name and provider ID).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostKey {
    /// The Node's name.
    pub name: String,
    /// The Node's `spec.providerID` (empty when unset).
    pub provider_id: String,
}

impl HostKey {
    /// The key of a Node.
    pub fn of(node: &Node) -> Self {
        HostKey {
            name: node.metadata.name.clone().unwrap_or_default(),
            provider_id: provider_id(node).to_owned(),
        }
    }
}

/// The keys of `nodes`, in order.
pub fn host_keys<N: AsRef<Node>>(nodes: &[N]) -> Vec<HostKey> {
    nodes.iter().map(|n| HostKey::of(n.as_ref())).collect()
}

/// Go's `nodesSufficientlyEqual`: same number of hosts and the same name → providerID mapping
/// (order does not matter).
pub fn nodes_sufficiently_equal(old: &[HostKey], new: &[HostKey]) -> bool {
    if old.len() != new.len() {
        return false;
    }
    let distill = |keys: &[HostKey]| -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| (k.name.clone(), k.provider_id.clone()))
            .collect()
    };
    distill(old) == distill(new)
}

/// The IP mode kube-apiserver stores for an ingress: `VIP` when an IP is set and no mode is given
/// (its defaulting since `LoadBalancerIPMode`), else as given. Without this, a provider that
/// answers no mode would see the stored `VIP` as a change and rewrite the status on every sync
/// (Go's `ingressEqual` does; we deliberately do not).
fn effective_ip_mode(ingress: &LoadBalancerIngress) -> Option<&str> {
    match (&ingress.ip_mode, str_or_empty(&ingress.ip)) {
        (Some(mode), _) => Some(mode.as_str()),
        (None, "") => None,
        (None, _) => Some("VIP"),
    }
}

fn ingress_equal(a: &LoadBalancerIngress, b: &LoadBalancerIngress) -> bool {
    str_or_empty(&a.ip) == str_or_empty(&b.ip)
        && str_or_empty(&a.hostname) == str_or_empty(&b.hostname)
        && effective_ip_mode(a) == effective_ip_mode(b)
        && slice_or_empty(&a.ports) == slice_or_empty(&b.ports)
}

/// Go's `LoadBalancerStatusEqual`: compares `ingress` only, element by element (IP, hostname,
/// IP mode, port statuses). A missing status equals an empty one.
pub fn load_balancer_status_equal(
    old: Option<&LoadBalancerStatus>,
    new: Option<&LoadBalancerStatus>,
) -> bool {
    let x = old.map(|s| slice_or_empty(&s.ingress)).unwrap_or_default();
    let y = new.map(|s| slice_or_empty(&s.ingress)).unwrap_or_default();
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| ingress_equal(a, b))
}

/// The merge patch of the `status` subresource that sets `status.loadBalancer.ingress` to that
/// of `new`, or `None` when the Service's current status already equals it (ingress only).
/// Only the controller's own field is in the patch, so it cannot clobber other writers.
pub fn status_patch(service: &Service, new: &LoadBalancerStatus) -> Option<Value> {
    let current = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref());
    if load_balancer_status_equal(current, Some(new)) {
        return None;
    }
    let ingress = match new.ingress.as_deref() {
        Some(list) if !list.is_empty() => serde_json::to_value(list).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    Some(json!({ "status": { "loadBalancer": { "ingress": ingress } } }))
}

fn test_op(path: &str, value: Value) -> Value {
    json!({ "op": "test", "path": path, "value": value })
}

/// `value` as a JSON-patch `test` value: an absent or empty string is tested as `null` (absent:
/// kube-apiserver omits empty strings).
fn str_test_value(value: Option<&str>) -> Value {
    value
        .filter(|v| !v.is_empty())
        .map_or(Value::Null, |v| json!(v))
}

/// The `test`s of what [`decide`] read, as far as a finalizer write depends on it: the UID (the
/// same Service, not one re-created under its name) and, unless the Service is being deleted
/// (which cannot be undone, so nothing else can change the decision), `spec.type` and
/// `spec.loadBalancerClass` as read. An `Ensure` also tests that `deletionTimestamp` is still
/// absent.
fn decision_tests(service: &Service) -> Vec<Value> {
    let mut tests = Vec::new();
    if let Some(uid) = &service.metadata.uid {
        tests.push(test_op("/metadata/uid", json!(uid)));
    }
    if is_being_deleted(service) {
        return tests;
    }
    tests.push(test_op("/metadata/deletionTimestamp", Value::Null));
    let spec = service.spec.as_ref();
    tests.push(test_op(
        "/spec/type",
        str_test_value(spec.and_then(|s| s.type_.as_deref())),
    ));
    tests.push(test_op(
        "/spec/loadBalancerClass",
        str_test_value(spec.and_then(|s| s.load_balancer_class.as_deref())),
    ));
    tests
}

/// The JSON patch that adds the cleanup finalizer, or `None` when it is already present.
///
/// Its `test`s guard exactly what the decision to add it was made on (UID, type, class,
/// deletion) and the finalizer list it extends (the whole list, or its absence,
/// tested as `null`): if another writer changed one of those, the API server rejects the patch
/// (422) and the caller decides again on a fresh read; it never clobbers another finalizer.
/// A write to anything else (labels, annotations, the status, the rest of the spec) fails no
/// test, so it costs no round trip. Not a `test` of `metadata.resourceVersion`, which every
/// such write bumps. (Go writes the finalizer with an unguarded strategic-merge patch.)
pub fn add_finalizer_patch(service: &Service) -> Option<Value> {
    if has_cleanup_finalizer(service) {
        return None;
    }
    let mut ops = decision_tests(service);
    match &service.metadata.finalizers {
        Some(list) if !list.is_empty() => {
            ops.push(test_op("/metadata/finalizers", json!(list)));
            ops.push(json!({
                "op": "add",
                "path": "/metadata/finalizers/-",
                "value": FINALIZER_LOAD_BALANCER_CLEANUP,
            }));
        }
        _ => {
            ops.push(test_op("/metadata/finalizers", Value::Null));
            ops.push(json!({
                "op": "add",
                "path": "/metadata/finalizers",
                "value": [FINALIZER_LOAD_BALANCER_CLEANUP],
            }));
        }
    }
    Some(Value::Array(ops))
}

/// The JSON patch that removes the cleanup finalizer (every occurrence), or `None` when it is
/// absent. Its `test`s guard what the decision to remove it was made on (UID; type and class
/// unless being deleted) and each removed entry at its position, so another writer's finalizer is never removed and
/// a write to anything else costs no round trip (see [`add_finalizer_patch`]).
pub fn remove_finalizer_patch(service: &Service) -> Option<Value> {
    let list = service.metadata.finalizers.as_deref().unwrap_or_default();
    let positions: Vec<usize> = list
        .iter()
        .enumerate()
        .filter(|(_, f)| *f == FINALIZER_LOAD_BALANCER_CLEANUP)
        .map(|(i, _)| i)
        .collect();
    if positions.is_empty() {
        return None;
    }
    let mut ops = decision_tests(service);
    // Remove from the back so earlier indices stay valid.
    for i in positions.into_iter().rev() {
        let path = format!("/metadata/finalizers/{i}");
        ops.push(test_op(&path, json!(FINALIZER_LOAD_BALANCER_CLEANUP)));
        ops.push(json!({ "op": "remove", "path": path }));
    }
    Some(Value::Array(ops))
}

/// The note of Go's `UpdateLoadBalancerFailed` event: the first
/// [`MAX_NODE_NAMES_TO_LOG`] host names, the host count and the error.
pub fn update_failed_note(hosts: &[HostKey], error: &str) -> String {
    let names: Vec<String> = hosts
        .iter()
        .take(MAX_NODE_NAMES_TO_LOG)
        .map(|h| h.name.clone())
        .collect();
    format!(
        "Error updating load balancer with new hosts {} [node names limited, total number of nodes: {}], error: {}",
        go_list(&names),
        hosts.len(),
        error
    )
}

/// What a Node change does to the load balancers' host sets, for the node-sync timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostChange {
    /// A host may join (a Node added, or become eligible): batched over a widening window.
    Addition,
    /// A host may leave or change identity (a Node deleted, excluded, tainted for deletion,
    /// no longer eligible, its providerID changed; or the subscriber missed changes): synced
    /// within the base window, as every change was before.
    Removal,
}

/// How a Node change affects the host sets; `None` when it cannot (see
/// [`node_update_needs_sync`]). `old` is `None` for an added Node, `new` `None` for a deleted
/// one.
pub fn host_change(old: Option<&Node>, new: Option<&Node>) -> Option<HostChange> {
    match (old, new) {
        (None, Some(_)) => Some(HostChange::Addition),
        (Some(_), None) | (None, None) => Some(HostChange::Removal),
        (Some(old), Some(new)) => {
            if !node_update_needs_sync(old, new) {
                None
            } else if provider_id(old) == provider_id(new)
                && !is_eligible_host(old)
                && is_eligible_host(new)
            {
                Some(HostChange::Addition)
            } else {
                Some(HostChange::Removal)
            }
        }
    }
}

/// A node-sync pass waits at most this many base windows after the first removal of a burst.
pub const MAX_WINDOW_FACTOR: u32 = 5;

/// When the next node-sync pass runs (pure: driven with the current time).
///
/// - **Removals** keep the base window (`--node-sync-window`): the pass runs once no change
///   arrived for one window, at the latest [`MAX_WINDOW_FACTOR`] windows after the first.
/// - **Additions** wait for the *addition window*, counted from the first addition since the
///   last pass and not extended by later ones. It starts at the base window and doubles, up to
///   `--node-sync-max-window`, each time an addition arrives within `--node-sync-max-window` of
///   the previous pass that carried additions (Nodes keep joining); an addition after a longer
///   pause starts again from the base. So a steady trickle of joins costs each load balancer
///   one update per (widened) window instead of one per Node, while a removal still goes out
///   within the base window.
///
/// "Keeps joining" is judged over the largest window, not the current one: judged over the
/// current window, a Node joining every 2 s against the 1 s base never widened it (each join
/// came 1 s after the pass of the previous one, never within it), and each joining Node cost
/// every load balancer an update of its own, as in Go (issue 19).
#[derive(Clone, Debug)]
pub struct NodeSyncTimer<I> {
    base: std::time::Duration,
    max: std::time::Duration,
    addition_window: std::time::Duration,
    /// The last pass that carried additions.
    last_addition_pass: Option<I>,
    first_addition: Option<I>,
    first_removal: Option<I>,
    last_removal: Option<I>,
}

impl<I> NodeSyncTimer<I>
where
    I: Copy + Ord + std::ops::Add<std::time::Duration, Output = I>,
{
    /// A timer with the base window `base` and the largest addition window `max` (raised to
    /// `base` when smaller).
    pub fn new(base: std::time::Duration, max: std::time::Duration) -> Self {
        NodeSyncTimer {
            base,
            max: max.max(base),
            addition_window: base,
            last_addition_pass: None,
            first_addition: None,
            first_removal: None,
            last_removal: None,
        }
    }

    /// The current addition window.
    pub fn addition_window(&self) -> std::time::Duration {
        self.addition_window
    }

    /// Records a change arriving at `now`.
    pub fn change(&mut self, change: HostChange, now: I) {
        match change {
            HostChange::Addition => {
                if self.first_addition.is_none() {
                    let keeps_joining = self
                        .last_addition_pass
                        .is_some_and(|last| now < last + self.max);
                    self.addition_window = if keeps_joining {
                        self.addition_window.saturating_mul(2).min(self.max)
                    } else {
                        self.base
                    };
                    self.first_addition = Some(now);
                }
            }
            HostChange::Removal => {
                self.first_removal.get_or_insert(now);
                self.last_removal = Some(now);
            }
        }
    }

    /// When the next pass is due; `None` while nothing is pending.
    pub fn due(&self) -> Option<I> {
        let removal = match (self.first_removal, self.last_removal) {
            (Some(first), Some(last)) => {
                Some((last + self.base).min(first + self.base.saturating_mul(MAX_WINDOW_FACTOR)))
            }
            _ => None,
        };
        let addition = self
            .first_addition
            .map(|first| first + self.addition_window);
        match (removal, addition) {
            (Some(r), Some(a)) => Some(r.min(a)),
            (r, a) => r.or(a),
        }
    }

    /// A pass started at `now`: it covers every change recorded so far.
    pub fn passed(&mut self, now: I) {
        if self.first_addition.is_some() {
            self.last_addition_pass = Some(now);
        }
        self.first_addition = None;
        self.first_removal = None;
        self.last_removal = None;
    }
}

// The file is longer than the ~800 lines of ARCHITECTURE.md because of the unit tests below:
// the planner is pure, so its tests carry the rules of the reference, one test per rule.
#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        NodeSpec, PortStatus, ServiceSpec, ServiceStatus, SessionAffinityConfig, Taint,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn svc(type_: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    protocol: Some("TCP".into()),
                    node_port: Some(30080),
                    target_port: Some(IntOrString::Int(8080)),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn lb() -> Service {
        svc("LoadBalancer")
    }

    fn with_finalizer(mut s: Service) -> Service {
        s.metadata.finalizers = Some(vec![FINALIZER_LOAD_BALANCER_CLEANUP.into()]);
        s
    }

    fn deleting(mut s: Service) -> Service {
        s.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        s
    }

    fn spec(s: &mut Service) -> &mut ServiceSpec {
        s.spec.get_or_insert_with(Default::default)
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("fake://{name}")),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn labelled(mut n: Node, value: &str) -> Node {
        n.metadata.labels = Some(BTreeMap::from([(
            LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS.to_owned(),
            value.to_owned(),
        )]));
        n
    }

    fn tainted(mut n: Node, key: &str) -> Node {
        n.spec.get_or_insert_with(Default::default).taints = Some(vec![Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        n
    }

    fn key(name: &str, pid: &str) -> HostKey {
        HostKey {
            name: name.into(),
            provider_id: pid.into(),
        }
    }

    // ---- wants_load_balancer / needs_cleanup -------------------------------------------

    #[test]
    fn wants_load_balancer_only_for_type_lb_without_class() {
        assert!(wants_load_balancer(&lb()));
        for t in ["ClusterIP", "NodePort", "ExternalName", "loadbalancer", ""] {
            assert!(!wants_load_balancer(&svc(t)), "{t}");
        }
        let mut classed = lb();
        spec(&mut classed).load_balancer_class = Some("example.com/other".into());
        assert!(!wants_load_balancer(&classed));
        // Even an empty class means "not mine".
        spec(&mut classed).load_balancer_class = Some(String::new());
        assert!(!wants_load_balancer(&classed));
        let mut no_spec = lb();
        no_spec.spec = None;
        assert!(!wants_load_balancer(&no_spec));
    }

    #[test]
    fn needs_cleanup_requires_finalizer_and_deletion_or_not_wanting() {
        assert!(!needs_cleanup(&lb()));
        assert!(!needs_cleanup(&with_finalizer(lb())));
        assert!(needs_cleanup(&deleting(with_finalizer(lb()))));
        assert!(needs_cleanup(&with_finalizer(svc("ClusterIP"))));
        assert!(!needs_cleanup(&svc("ClusterIP")));
        assert!(!needs_cleanup(&deleting(lb())));
        let mut classed = with_finalizer(lb());
        spec(&mut classed).load_balancer_class = Some("x".into());
        assert!(needs_cleanup(&classed));
        // Other finalizers do not count.
        let mut other = deleting(lb());
        other.metadata.finalizers = Some(vec!["example.com/other".into()]);
        assert!(!needs_cleanup(&other));
    }

    #[test]
    fn add_and_update_handlers_enqueue_per_go() {
        assert!(should_enqueue_add(&lb()));
        assert!(!should_enqueue_add(&svc("ClusterIP")));
        assert!(should_enqueue_add(&with_finalizer(svc("ClusterIP"))));
        assert!(should_enqueue_add(&deleting(with_finalizer(lb()))));
        // A status-only or label-only update is ignored...
        let mut new = lb();
        new.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
        new.metadata.resource_version = Some("8".into());
        assert!(!should_enqueue_update(&lb(), &new));
        // ... unless the Service needs cleanup (finalizer + deletion).
        let old = with_finalizer(lb());
        assert!(should_enqueue_update(&old, &deleting(old.clone())));
        // Two non-LB Services never trigger, even if they differ.
        let mut np = svc("NodePort");
        np.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
        assert!(!should_enqueue_update(&svc("ClusterIP"), &np));
    }

    // ---- needs_update ------------------------------------------------------------------

    fn changed(f: impl FnOnce(&mut Service)) -> Option<UpdateTrigger> {
        let old = lb();
        let mut new = old.clone();
        f(&mut new);
        update_trigger(&old, &new)
    }

    fn reason(f: impl FnOnce(&mut Service)) -> Option<&'static str> {
        changed(f).map(|t| t.reason)
    }

    #[test]
    fn needs_update_on_type_flip_with_go_event() {
        let t = changed(|s| spec(s).type_ = Some("ClusterIP".into())).unwrap();
        assert_eq!(
            t.event,
            Some(("Type", "LoadBalancer -> ClusterIP".to_owned()))
        );
        assert!(needs_update(&svc("NodePort"), &lb()));
        // Gaining a class is a flip of wantsLoadBalancer too.
        assert_eq!(
            reason(|s| spec(s).load_balancer_class = Some("x".into())),
            Some("Type")
        );
    }

    #[test]
    fn needs_update_on_source_ranges() {
        let t = changed(|s| {
            spec(s).load_balancer_source_ranges =
                Some(vec!["10.0.0.0/8".into(), "1.2.3.4/32".into()])
        })
        .unwrap();
        assert_eq!(
            t.event,
            Some((
                "LoadBalancerSourceRanges",
                "[] -> [10.0.0.0/8 1.2.3.4/32]".to_owned()
            ))
        );
        // None and empty are the same.
        assert_eq!(
            reason(|s| spec(s).load_balancer_source_ranges = Some(vec![])),
            None
        );
    }

    #[test]
    fn needs_update_on_each_port_field() {
        fn port(s: &mut Service) -> &mut ServicePort {
            &mut spec(s).ports.as_mut().unwrap()[0]
        }
        assert_eq!(reason(|s| port(s).name = Some("web".into())), Some("Ports"));
        assert_eq!(
            reason(|s| port(s).protocol = Some("UDP".into())),
            Some("Ports")
        );
        assert_eq!(reason(|s| port(s).port = 81), Some("Ports"));
        assert_eq!(reason(|s| port(s).node_port = Some(30081)), Some("Ports"));
        assert_eq!(
            reason(|s| port(s).target_port = Some(IntOrString::String("http".into()))),
            Some("Ports")
        );
        assert_eq!(
            reason(|s| port(s).app_protocol = Some("https".into())),
            Some("Ports")
        );
        assert_eq!(
            reason(|s| spec(s).ports.as_mut().unwrap().push(ServicePort {
                port: 443,
                ..Default::default()
            })),
            Some("Ports")
        );
        // Reordering ports is a change (compared position by position).
        let mut two = lb();
        spec(&mut two).ports.as_mut().unwrap().push(ServicePort {
            name: Some("https".into()),
            port: 443,
            ..Default::default()
        });
        let mut swapped = two.clone();
        spec(&mut swapped).ports.as_mut().unwrap().reverse();
        assert!(needs_update(&two, &swapped));
        assert!(changed(|_| {}).is_none());
    }

    #[test]
    fn needs_update_on_affinity_ip_external_ips() {
        assert_eq!(
            reason(|s| spec(s).session_affinity = Some("ClientIP".into())),
            Some("SessionAffinity")
        );
        assert_eq!(
            reason(|s| spec(s).session_affinity_config = Some(SessionAffinityConfig::default())),
            Some("SessionAffinityConfig")
        );
        let t = changed(|s| spec(s).load_balancer_ip = Some("1.2.3.4".into())).unwrap();
        assert_eq!(t.event, Some(("LoadbalancerIP", " -> 1.2.3.4".to_owned())));
        let t = changed(|s| spec(s).external_ips = Some(vec!["5.6.7.8".into()])).unwrap();
        assert_eq!(t.event, Some(("ExternalIP", "Count: 0 -> 1".to_owned())));
        let mut old = lb();
        spec(&mut old).external_ips = Some(vec!["5.6.7.8".into()]);
        let mut new = old.clone();
        spec(&mut new).external_ips = Some(vec!["5.6.7.9".into()]);
        assert_eq!(
            update_trigger(&old, &new).unwrap().event,
            Some(("ExternalIP", "Added: 5.6.7.9".to_owned()))
        );
    }

    #[test]
    fn needs_update_on_annotations_uid_policy_healthcheck_families() {
        assert_eq!(
            reason(|s| s.metadata.annotations = Some(BTreeMap::from([("a".into(), "1".into())]))),
            Some("Annotations")
        );
        assert_eq!(
            reason(|s| s.metadata.annotations = Some(BTreeMap::new())),
            None
        );
        let t = changed(|s| s.metadata.uid = Some("uid-2".into())).unwrap();
        assert_eq!(t.event, Some(("UID", "uid-1 -> uid-2".to_owned())));
        let t = changed(|s| spec(s).external_traffic_policy = Some("Local".into())).unwrap();
        assert_eq!(
            t.event,
            Some(("ExternalTrafficPolicy", " -> Local".to_owned()))
        );
        let t = changed(|s| spec(s).health_check_node_port = Some(32000)).unwrap();
        assert_eq!(
            t.event,
            Some(("HealthCheckNodePort", "0 -> 32000".to_owned()))
        );
        let t = changed(|s| spec(s).ip_families = Some(vec!["IPv4".into()])).unwrap();
        assert_eq!(t.event, Some(("IPFamilies", "Count: 0 -> 1".to_owned())));
    }

    #[test]
    fn needs_update_ignores_unlisted_fields() {
        assert_eq!(
            reason(|s| {
                s.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
                s.metadata.resource_version = Some("99".into());
                s.metadata.finalizers = Some(vec![FINALIZER_LOAD_BALANCER_CLEANUP.into()]);
                let sp = spec(s);
                sp.allocate_load_balancer_node_ports = Some(false);
                sp.ip_family_policy = Some("PreferDualStack".into());
                sp.internal_traffic_policy = Some("Local".into());
                sp.selector = Some(BTreeMap::from([("app".into(), "x".into())]));
                sp.cluster_ip = Some("10.0.0.1".into());
                s.status = Some(ServiceStatus::default());
            }),
            None
        );
        // Swapping ip families without changing their number does not trigger (Go compares
        // the count only).
        let mut old = lb();
        spec(&mut old).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        let mut new = old.clone();
        spec(&mut new).ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        assert!(!needs_update(&old, &new));
    }

    // ---- decide ------------------------------------------------------------------------

    #[test]
    fn decide_covers_every_case() {
        assert_eq!(decide(&lb(), false), Decision::Ensure);
        assert_eq!(decide(&with_finalizer(lb()), false), Decision::Ensure);
        assert_eq!(decide(&with_finalizer(lb()), true), Decision::Ensure);
        assert_eq!(
            decide(&deleting(with_finalizer(lb())), false),
            Decision::Delete
        );
        assert_eq!(
            decide(&with_finalizer(svc("ClusterIP")), false),
            Decision::Delete
        );
        assert_eq!(decide(&svc("ClusterIP"), true), Decision::Delete);
        assert_eq!(decide(&deleting(lb()), true), Decision::Delete);
        assert_eq!(decide(&svc("ClusterIP"), false), Decision::Skip);
        assert_eq!(decide(&deleting(lb()), false), Decision::Skip);
        let mut classed = lb();
        spec(&mut classed).load_balancer_class = Some("x".into());
        assert_eq!(decide(&classed, false), Decision::Skip);
        assert_eq!(decide(&with_finalizer(classed), false), Decision::Delete);
    }

    // ---- node predicates ---------------------------------------------------------------

    #[test]
    fn exclusion_label_parses_go_booleans() {
        assert!(node_included(&node("a")));
        for v in ["false", "0", "f", "F", "FALSE", "False"] {
            assert!(node_included(&labelled(node("a"), v)), "{v:?} must include");
        }
        for v in [
            "true", "1", "t", "T", "TRUE", "True", "", "no", "yes", "fAlSe", " false",
        ] {
            assert!(
                !node_included(&labelled(node("a"), v)),
                "{v:?} must exclude"
            );
        }
    }

    #[test]
    fn eligibility_combines_the_three_predicates() {
        assert!(is_eligible_host(&node("a")));
        let mut gone = node("a");
        gone.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(!node_not_deleted(&gone));
        assert!(!is_eligible_host(&gone));
        assert!(!is_eligible_host(&labelled(node("a"), "true")));
        assert!(is_eligible_host(&labelled(node("a"), "false")));
        let ca = tainted(node("a"), TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER);
        assert!(!node_not_tainted_for_deletion(&ca));
        assert!(!is_eligible_host(&ca));
        // Other taints, NotReady, unschedulable: still a host.
        let mut other = tainted(node("a"), "node.kubernetes.io/not-ready");
        other.spec.as_mut().unwrap().unschedulable = Some(true);
        assert!(is_eligible_host(&other));
    }

    #[test]
    fn eligible_hosts_filters_and_sorts() {
        let nodes: Vec<Arc<Node>> = vec![
            Arc::new(node("c")),
            Arc::new(labelled(node("b"), "true")),
            Arc::new(node("a")),
        ];
        let hosts = eligible_hosts(&nodes);
        let names: Vec<_> = hosts
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(
            host_keys(&hosts),
            vec![key("a", "fake://a"), key("c", "fake://c")]
        );
    }

    #[test]
    fn node_updates_trigger_only_on_eligibility_or_provider_id() {
        let base = node("a");
        assert!(!node_update_needs_sync(&base, &base));
        // Ready / other labels / other taints: no sync.
        let mut relabelled = base.clone();
        relabelled.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
        assert!(!node_update_needs_sync(&base, &relabelled));
        assert!(!node_update_needs_sync(
            &base,
            &tainted(base.clone(), "other")
        ));
        // Label value change that keeps the result: no sync.
        assert!(!node_update_needs_sync(
            &labelled(base.clone(), "true"),
            &labelled(base.clone(), "1")
        ));
        assert!(node_update_needs_sync(
            &base,
            &labelled(base.clone(), "true")
        ));
        assert!(node_update_needs_sync(
            &labelled(base.clone(), "true"),
            &base
        ));
        assert!(node_update_needs_sync(
            &base,
            &tainted(base.clone(), TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER)
        ));
        let mut moved = base.clone();
        moved.spec.as_mut().unwrap().provider_id = Some("fake://other".into());
        assert!(node_update_needs_sync(&base, &moved));
        let mut deleted = base.clone();
        deleted.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(node_update_needs_sync(&base, &deleted));
    }

    #[test]
    fn nodes_sufficiently_equal_compares_names_and_provider_ids() {
        let a = vec![key("a", "p1"), key("b", "p2")];
        assert!(nodes_sufficiently_equal(&a, &a));
        assert!(nodes_sufficiently_equal(
            &a,
            &[key("b", "p2"), key("a", "p1")]
        ));
        assert!(!nodes_sufficiently_equal(&a, &[key("a", "p1")]));
        assert!(!nodes_sufficiently_equal(
            &a,
            &[key("a", "p1"), key("c", "p2")]
        ));
        assert!(!nodes_sufficiently_equal(
            &a,
            &[key("a", "p1"), key("b", "p3")]
        ));
        assert!(nodes_sufficiently_equal(&[], &[]));
        assert!(!nodes_sufficiently_equal(&[], &[key("a", "")]));
    }

    // ---- status ------------------------------------------------------------------------

    fn status(ips: &[&str]) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(
                ips.iter()
                    .map(|ip| LoadBalancerIngress {
                        ip: Some((*ip).into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn status_equality_compares_ingress_only() {
        assert!(load_balancer_status_equal(None, None));
        assert!(load_balancer_status_equal(
            None,
            Some(&LoadBalancerStatus::default())
        ));
        assert!(load_balancer_status_equal(Some(&status(&[])), None));
        assert!(load_balancer_status_equal(
            Some(&status(&["1.1.1.1"])),
            Some(&status(&["1.1.1.1"]))
        ));
        assert!(!load_balancer_status_equal(
            Some(&status(&["1.1.1.1"])),
            Some(&status(&["1.1.1.2"]))
        ));
        assert!(!load_balancer_status_equal(
            None,
            Some(&status(&["1.1.1.1"]))
        ));
        assert!(!load_balancer_status_equal(
            Some(&status(&["1.1.1.1", "2.2.2.2"])),
            Some(&status(&["2.2.2.2", "1.1.1.1"]))
        ));
        let mut with_mode = status(&["1.1.1.1"]);
        with_mode.ingress.as_mut().unwrap()[0].ip_mode = Some("Proxy".into());
        assert!(!load_balancer_status_equal(
            Some(&status(&["1.1.1.1"])),
            Some(&with_mode)
        ));
        // kube-apiserver defaults the mode of an IP ingress to VIP: no change.
        let mut defaulted = status(&["1.1.1.1"]);
        defaulted.ingress.as_mut().unwrap()[0].ip_mode = Some("VIP".into());
        assert!(load_balancer_status_equal(
            Some(&defaulted),
            Some(&status(&["1.1.1.1"]))
        ));
        let mut with_host = status(&["1.1.1.1"]);
        with_host.ingress.as_mut().unwrap()[0].hostname = Some("lb.example".into());
        assert!(!load_balancer_status_equal(
            Some(&status(&["1.1.1.1"])),
            Some(&with_host)
        ));
        let mut with_ports = status(&["1.1.1.1"]);
        with_ports.ingress.as_mut().unwrap()[0].ports = Some(vec![PortStatus {
            port: 80,
            protocol: "TCP".into(),
            error: None,
        }]);
        assert!(!load_balancer_status_equal(
            Some(&status(&["1.1.1.1"])),
            Some(&with_ports)
        ));
    }

    #[test]
    fn status_patch_only_when_ingress_changed() {
        let mut s = lb();
        assert_eq!(status_patch(&s, &LoadBalancerStatus::default()), None);
        let patch = status_patch(&s, &status(&["203.0.113.10"])).unwrap();
        assert_eq!(
            patch,
            json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}})
        );
        s.status = Some(ServiceStatus {
            load_balancer: Some(status(&["203.0.113.10"])),
            ..Default::default()
        });
        assert_eq!(status_patch(&s, &status(&["203.0.113.10"])), None);
        assert_eq!(
            status_patch(&s, &LoadBalancerStatus::default()).unwrap(),
            json!({"status": {"loadBalancer": {"ingress": null}}})
        );
    }

    // ---- finalizer patches -------------------------------------------------------------

    /// Applies `patch` to `service` as kube-apiserver does (Go's evanphx/json-patch: a `test`
    /// for `null` passes when the key is missing but its parent exists).
    fn apply(service: &Service, patch: &Value) -> Result<Service, String> {
        let mut doc = serde_json::to_value(service).unwrap();
        for op in patch.as_array().unwrap() {
            let path = op["path"].as_str().unwrap();
            if op["op"] == "test" && op["value"].is_null() {
                let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                if doc.pointer(parent).is_none() || doc.pointer(path).is_some_and(|v| !v.is_null())
                {
                    return Err(format!("test of {path} failed"));
                }
                continue;
            }
            let op: json_patch::Patch = serde_json::from_value(json!([op])).unwrap();
            json_patch::patch(&mut doc, &op).map_err(|e| e.to_string())?;
        }
        Ok(serde_json::from_value(doc).unwrap())
    }

    #[test]
    fn add_finalizer_patch_tests_what_the_decision_read() {
        let s = lb();
        assert_eq!(
            add_finalizer_patch(&s).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
                {"op": "test", "path": "/metadata/deletionTimestamp", "value": null},
                {"op": "test", "path": "/spec/type", "value": "LoadBalancer"},
                {"op": "test", "path": "/spec/loadBalancerClass", "value": null},
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER_LOAD_BALANCER_CLEANUP]},
            ])
        );
        let mut other = lb();
        other.metadata.finalizers = Some(vec!["example.com/x".into()]);
        let patch = add_finalizer_patch(&other).unwrap();
        assert_eq!(
            patch.as_array().unwrap()[4..],
            [
                json!({"op": "test", "path": "/metadata/finalizers", "value": ["example.com/x"]}),
                json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER_LOAD_BALANCER_CLEANUP}),
            ]
        );
        assert_eq!(add_finalizer_patch(&with_finalizer(lb())), None);
        assert_eq!(
            apply(&other, &patch).unwrap().metadata.finalizers.unwrap(),
            ["example.com/x", FINALIZER_LOAD_BALANCER_CLEANUP]
        );
        assert!(apply(&s, &add_finalizer_patch(&s).unwrap()).is_ok());

        // Writes to what the decision did not read apply: a label, an annotation, the status,
        // another spec field, a newer resourceVersion.
        let mut unrelated = other.clone();
        unrelated.metadata.resource_version = Some("8".into());
        unrelated.metadata.labels = Some([("team".to_owned(), "x".to_owned())].into());
        unrelated.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into());
        spec(&mut unrelated).session_affinity = Some("ClientIP".into());
        unrelated.status = Some(ServiceStatus {
            load_balancer: Some(status(&["203.0.113.10"])),
            ..Default::default()
        });
        let patched = apply(&unrelated, &patch).unwrap();
        assert_eq!(patched.metadata.labels, unrelated.metadata.labels);
        assert!(has_cleanup_finalizer(&patched));

        // Changes to what it read fail the patch: another finalizer list, a type or class
        // change, a deletion, another Service under the same name.
        let mut finalizers = other.clone();
        finalizers.metadata.finalizers = Some(vec!["example.com/x".into(), "example.com/y".into()]);
        let mut no_finalizers = other.clone();
        no_finalizers.metadata.finalizers = None;
        let mut cluster_ip = other.clone();
        spec(&mut cluster_ip).type_ = Some("ClusterIP".into());
        let mut classed = other.clone();
        spec(&mut classed).load_balancer_class = Some("example.com/lb".into());
        let mut recreated = other.clone();
        recreated.metadata.uid = Some("uid-2".into());
        for changed in [
            finalizers,
            no_finalizers,
            cluster_ip,
            classed,
            deleting(other.clone()),
            recreated,
        ] {
            assert!(apply(&changed, &patch).is_err(), "{:?}", changed.metadata);
        }
        // Without finalizers, one added concurrently fails the `null` test: never replaced.
        assert!(apply(&other, &add_finalizer_patch(&s).unwrap()).is_err());
    }

    #[test]
    fn remove_finalizer_patch_removes_only_ours() {
        assert_eq!(remove_finalizer_patch(&lb()), None);
        let mut s = svc("ClusterIP");
        s.metadata.finalizers = Some(vec![
            "a".into(),
            FINALIZER_LOAD_BALANCER_CLEANUP.into(),
            "b".into(),
            FINALIZER_LOAD_BALANCER_CLEANUP.into(),
        ]);
        let patch = remove_finalizer_patch(&s).unwrap();
        assert_eq!(
            apply(&s, &patch).unwrap().metadata.finalizers.unwrap(),
            ["a", "b"]
        );

        // A label, the status or another finalizer appended: still applies.
        let mut unrelated = s.clone();
        unrelated.metadata.resource_version = Some("8".into());
        unrelated.metadata.labels = Some([("team".to_owned(), "x".to_owned())].into());
        unrelated
            .metadata
            .finalizers
            .as_mut()
            .unwrap()
            .push("c".into());
        assert_eq!(
            apply(&unrelated, &patch)
                .unwrap()
                .metadata
                .finalizers
                .unwrap(),
            ["a", "b", "c"]
        );
        // Our entry moved (one before it removed), or the Service wants a load balancer again:
        // the patch fails rather than removing someone else's finalizer or ours too early.
        let mut moved = s.clone();
        moved.metadata.finalizers.as_mut().unwrap().remove(0);
        let mut wanted_again = s.clone();
        spec(&mut wanted_again).type_ = Some("LoadBalancer".into());
        assert!(apply(&moved, &patch).is_err());
        assert!(apply(&wanted_again, &patch).is_err());

        // Being deleted: the type no longer matters (the decision cannot change).
        let deleted = deleting(with_finalizer(lb()));
        let patch = remove_finalizer_patch(&deleted).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
                {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER_LOAD_BALANCER_CLEANUP},
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ])
        );
        let mut retyped = deleted.clone();
        spec(&mut retyped).type_ = Some("ClusterIP".into());
        assert!(apply(&retyped, &patch).is_ok());
    }

    #[test]
    fn update_failed_note_limits_names() {
        let hosts: Vec<HostKey> = (0..25).map(|i| key(&format!("n{i:02}"), "")).collect();
        let note = update_failed_note(&hosts, "boom");
        assert!(note.starts_with("Error updating load balancer with new hosts [n00 n01"));
        assert!(note.contains("n19]"));
        assert!(!note.contains("n20"));
        assert!(note.ends_with("[node names limited, total number of nodes: 25], error: boom"));
        assert_eq!(
            update_failed_note(&[key("a", "")], "x"),
            "Error updating load balancer with new hosts [a] [node names limited, total number of nodes: 1], error: x"
        );
    }

    mod node_sync_timer {
        use super::super::{HostChange, NodeSyncTimer};
        use std::time::Duration;

        fn ms(n: u64) -> Duration {
            Duration::from_millis(n)
        }

        /// Times are durations since an origin.
        fn timer() -> NodeSyncTimer<Duration> {
            NodeSyncTimer::new(ms(200), ms(1600))
        }

        #[test]
        fn joins_that_keep_coming_widen_the_window_up_to_the_max() {
            let mut t = timer();
            let mut now = ms(0);
            let mut passes = Vec::new();
            // A Node every 300 ms for 6 s.
            for _ in 0..20 {
                while let Some(due) = t.due().filter(|d| *d <= now) {
                    passes.push(due);
                    t.passed(due);
                }
                t.change(HostChange::Addition, now);
                now += ms(300);
            }
            while let Some(due) = t.due() {
                passes.push(due);
                t.passed(due);
            }
            // Windows 200, 400, 800, 1600, 1600, ... instead of one pass per Node.
            assert_eq!(t.addition_window(), ms(1600));
            assert!(passes.len() <= 7, "{passes:?}");
            let last_join = ms(300 * 19);
            assert!(*passes.last().unwrap() >= last_join);
            assert!(*passes.last().unwrap() <= last_join + ms(1600));
        }

        #[test]
        fn a_pause_resets_the_window() {
            let mut t = timer();
            t.change(HostChange::Addition, ms(0));
            t.passed(ms(200));
            t.change(HostChange::Addition, ms(300));
            assert_eq!(t.addition_window(), ms(400));
            t.passed(ms(700));
            // Nothing for longer than the largest window (1600 ms): back to the base.
            t.change(HostChange::Addition, ms(2301));
            assert_eq!(t.addition_window(), ms(200));
            assert_eq!(t.due(), Some(ms(2501)));
        }

        /// The passes a timer runs for additions at `joins` (in order), each pass at its due
        /// time.
        fn passes_for_joins(t: &mut NodeSyncTimer<Duration>, joins: &[Duration]) -> Vec<Duration> {
            let mut passes = Vec::new();
            for &now in joins {
                while let Some(due) = t.due().filter(|d| *d <= now) {
                    passes.push(due);
                    t.passed(due);
                }
                t.change(HostChange::Addition, now);
            }
            while let Some(due) = t.due() {
                passes.push(due);
                t.passed(due);
            }
            passes
        }

        /// Issue 19's own case: a Node every 2 s against the 1 s base window (and the 8 s
        /// default maximum). Each join comes 1 s after the pass of the one before, outside the
        /// current window but within the largest: the window widens 1, 2, 4, 8 s, so 9 joins
        /// over 16 s cost 5 passes, not 9.
        #[test]
        fn joins_slower_than_the_base_window_still_widen_it() {
            let mut t = NodeSyncTimer::new(ms(1000), ms(8000));
            let joins: Vec<Duration> = (0..9).map(|n| ms(n * 2000)).collect();
            let passes = passes_for_joins(&mut t, &joins);
            assert_eq!(t.addition_window(), ms(8000));
            // Windows of 1, 2, 4 and 8 s open at the joins at 0, 2, 4 and 8 s (a pass due at
            // the instant of a join runs first), and one more of 8 s at the 16 s join.
            assert_eq!(
                passes,
                vec![ms(1000), ms(4000), ms(8000), ms(16_000), ms(24_000)]
            );
            // The last Node waits at most the largest window.
            assert!(*passes.last().unwrap() <= ms(16_000) + ms(8000));
        }

        #[test]
        fn a_join_within_the_largest_window_of_the_last_pass_keeps_widening() {
            let mut t = timer();
            t.change(HostChange::Addition, ms(0));
            t.passed(ms(200));
            // 1599 ms after the pass: within the 1600 ms maximum.
            t.change(HostChange::Addition, ms(1799));
            assert_eq!(t.addition_window(), ms(400));
        }

        #[test]
        fn a_pass_for_removals_alone_does_not_count_as_joining() {
            let mut t = timer();
            t.change(HostChange::Removal, ms(0));
            t.passed(ms(200));
            t.change(HostChange::Addition, ms(300));
            assert_eq!(t.addition_window(), ms(200));
            assert_eq!(t.due(), Some(ms(500)));
        }

        #[test]
        fn a_removal_goes_out_within_the_base_window_during_a_wide_addition_window() {
            let mut t = timer();
            // Joins every 300 ms until the window is at its widest (passes at 200, 700, 1700,
            // 3400; the join at 3600 opens a 1600 ms window).
            for n in 0..13u64 {
                let now = ms(n * 300);
                while let Some(due) = t.due().filter(|d| *d <= now) {
                    t.passed(due);
                }
                t.change(HostChange::Addition, now);
            }
            assert_eq!(t.addition_window(), ms(1600));
            assert_eq!(t.due(), Some(ms(5200)));
            t.change(HostChange::Removal, ms(3700));
            assert_eq!(t.due(), Some(ms(3900)), "the removal's base window");
        }

        #[test]
        fn removals_alone_keep_the_quiet_window_and_its_deadline() {
            let mut t = timer();
            for n in 0..10u64 {
                t.change(HostChange::Removal, ms(n * 150));
            }
            // Quiet window would be 1350 + 200; the burst deadline is 0 + 5 × 200.
            assert_eq!(t.due(), Some(ms(1000)));
        }
    }
}
