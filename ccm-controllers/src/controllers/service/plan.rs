//! Pure planning for the service controller: which Services are handled, which changes matter,
//! which Nodes are load-balancer hosts, and what to do with a Service. No I/O here; the async
//! shell in `super::sync` fetches, calls the cloud and writes.
//!
//! Each function follows a rule of Go's `k8s.io/cloud-provider/controllers/service`; where
//! this crate deliberately differs, the function's doc says so.

use std::collections::BTreeMap;

use ccm_core::NodeView;
use ccm_core::well_known::{
    FINALIZER_LOAD_BALANCER_CLEANUP, LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS,
    TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::classes::{ServedClasses, class_of};

/// `spec.type` of the Services this controller handles.
pub(crate) const TYPE_LOAD_BALANCER: &str = "LoadBalancer";

/// How many node names an `UpdateLoadBalancerFailed` event lists (Go's `maxNodeNamesToLog`).
pub(crate) const MAX_NODE_NAMES_TO_LOG: usize = 20;

/// Whether the Service is `type: LoadBalancer`.
pub(crate) fn is_load_balancer(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .is_some_and(|spec| spec.type_.as_deref() == Some(TYPE_LOAD_BALANCER))
}

/// Whether this controller serves the Service: `spec.type == LoadBalancer` and a
/// `spec.loadBalancerClass` it serves (Go: no class; here the provider's declared classes,
/// narrowed or renamed by `--load-balancer-classes`, see [`ServedClasses`]).
pub(crate) fn wants_load_balancer(service: &Service, classes: &ServedClasses) -> bool {
    is_load_balancer(service) && classes.serves_class(class_of(service))
}

/// Whether the Service is a LoadBalancer of a class another controller serves: never touched,
/// whatever finalizer it carries (see [`decide`]).
pub(crate) fn is_foreign_load_balancer(service: &Service, classes: &ServedClasses) -> bool {
    is_load_balancer(service) && !classes.serves_class(class_of(service))
}

/// Whether the Service carries the `service.kubernetes.io/load-balancer-cleanup` finalizer.
pub(crate) fn has_cleanup_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
}

/// Whether the Service is being deleted (`metadata.deletionTimestamp` set).
pub(crate) fn is_being_deleted(service: &Service) -> bool {
    service.metadata.deletion_timestamp.is_some()
}

/// Whether the Service's load balancer must be cleaned up (Go's `needsCleanup`): it carries
/// the cleanup finalizer and is no longer a LoadBalancer, or is one of a class this
/// controller serves and is being deleted.
///
/// A LoadBalancer of a class another controller serves is never cleaned up here, even being
/// deleted with the finalizer: every instance of this framework (one per class, say) puts the
/// same finalizer on the Services it serves, so the finalizer does not say whose it is; the
/// class does (`spec.loadBalancerClass` cannot change while the Service stays a
/// LoadBalancer). Go cleans up any Service with the finalizer that is being deleted, which is
/// the same thing while no one else uses its finalizer: it serves Services without a class
/// only. A type change away from LoadBalancer clears the class (the API server drops it), so
/// there nothing says whose it was and, as in Go, every instance deletes what its cloud has
/// for the Service (it wants none now) and removes the finalizer.
pub(crate) fn needs_cleanup(service: &Service, classes: &ServedClasses) -> bool {
    has_cleanup_finalizer(service)
        && (!is_load_balancer(service)
            || (is_being_deleted(service) && wants_load_balancer(service, classes)))
}

/// Why a Service update triggers a sync (Go's `needsUpdate`), with the Normal event Go emits
/// for some of the reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UpdateTrigger {
    /// What changed (also the event reason when [`UpdateTrigger::event`] is set).
    pub(crate) reason: &'static str,
    /// The Normal event Go records on the Service for this change: `(reason, note)`.
    pub(crate) event: Option<(&'static str, String)>,
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
pub(crate) fn update_trigger(
    old: &Service,
    new: &Service,
    classes: &ServedClasses,
) -> Option<UpdateTrigger> {
    let (old_wants, new_wants) = (
        wants_load_balancer(old, classes),
        wants_load_balancer(new, classes),
    );
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

/// Whether a Service add (or a Service seen on start-up) is queued: it wants a load balancer
/// or needs cleanup (Go's add handler; this is what makes every LoadBalancer Service be
/// re-ensured on every start, and a Service deleted while the controller was down be cleaned
/// up).
pub(crate) fn should_enqueue_add(service: &Service, classes: &ServedClasses) -> bool {
    wants_load_balancer(service, classes) || needs_cleanup(service, classes)
}

/// What to do with a Service found in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
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
/// - wants a load balancer (a class this controller serves) and is not being deleted →
///   [`Decision::Ensure`];
/// - a LoadBalancer of a class another controller serves → [`Decision::Skip`], whatever
///   finalizer it carries (see [`needs_cleanup`]), unless this controller handled it (then
///   it went through another type since, and the load balancer this controller made is
///   deleted: Go's "wants flipped" path);
/// - otherwise (being deleted, type changed), if the finalizer is present or the
///   controller handled it → [`Decision::Delete`] (Go's delete branch);
/// - otherwise → [`Decision::Skip`]: the finalizer is always added before anything is created
///   in the cloud, so without it and without a record of handling the Service there is no load
///   balancer of ours. (Go would try to *ensure* a Service being deleted that lacks the
///   finalizer, which the API server refuses, since no finalizer may be added to an object
///   being deleted; and it would call the cloud for every Service whose type flipped away
///   from LoadBalancer before it ever got one.)
pub(crate) fn decide(
    service: &Service,
    previously_handled: bool,
    classes: &ServedClasses,
) -> Decision {
    if wants_load_balancer(service, classes) && !is_being_deleted(service) {
        Decision::Ensure
    } else if is_foreign_load_balancer(service, classes) {
        if previously_handled {
            Decision::Delete
        } else {
            Decision::Skip
        }
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
pub(crate) fn node_not_deleted(node: &NodeView) -> bool {
    node.deletion_timestamp().is_none()
}

/// §4.5 predicate 2: the Node is not excluded by the label
/// `node.kubernetes.io/exclude-from-external-load-balancers`: the label is absent, or its value
/// parses as Go boolean false (`false`, `0`, `f`, `F`, `FALSE`, `False`). Any other value,
/// including `true`, the empty string and garbage, excludes the Node.
pub(crate) fn node_included(node: &NodeView) -> bool {
    match node.label(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS) {
        None => true,
        Some(value) => parses_as_go_false(value),
    }
}

/// §4.5 predicate 3: the Node has no taint with key `ToBeDeletedByClusterAutoscaler`.
pub(crate) fn node_not_tainted_for_deletion(node: &NodeView) -> bool {
    !node.has_taint(TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER)
}

/// Whether the Node is a load-balancer host: all three §4.5 predicates (Go's stable node set).
/// Readiness, schedulability and `externalTrafficPolicy` are deliberately not considered.
pub(crate) fn is_eligible_host(node: &NodeView) -> bool {
    node_not_deleted(node) && node_included(node) && node_not_tainted_for_deletion(node)
}

/// The eligible hosts among `nodes`, sorted by name (so the provider sees a stable order).
pub(crate) fn eligible_hosts(nodes: &[NodeView]) -> Vec<NodeView> {
    let mut hosts: Vec<NodeView> = nodes
        .iter()
        .filter(|n| is_eligible_host(n))
        .cloned()
        .collect();
    hosts.sort_by(|a, b| a.name_arc().cmp(&b.name_arc()));
    hosts
}

/// Whether a Node update changes any load balancer's host list, so a node sync is needed.
///
/// Go triggers only when the exclusion-label predicate flipped or `spec.providerID` changed
/// (deletion or the autoscaler taint are then picked up only by a later sync). Here any flip
/// of the full eligibility ([`is_eligible_host`]) triggers too, so a Node tainted by the
/// cluster-autoscaler leaves the load balancers before it is drained. Ready/label/taint changes
/// that do not change eligibility never trigger.
pub(crate) fn node_update_needs_sync(old: &NodeView, new: &NodeView) -> bool {
    node_included(old) != node_included(new)
        || is_eligible_host(old) != is_eligible_host(new)
        || provider_id(old) != provider_id(new)
}

fn provider_id(node: &NodeView) -> &str {
    node.provider_id()
}

/// What the controller remembers of a host it passed to the cloud: the Node fields whose
/// change requires an update (Go's `protoNode`: name and provider ID).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct HostKey {
    /// The Node's name.
    pub(crate) name: String,
    /// The Node's `spec.providerID` (empty when unset).
    pub(crate) provider_id: String,
}

impl HostKey {
    /// The key of a Node.
    pub(crate) fn of(node: &NodeView) -> Self {
        HostKey {
            name: node.name().to_owned(),
            provider_id: provider_id(node).to_owned(),
        }
    }
}

/// The keys of `nodes`, in order.
pub(crate) fn host_keys(nodes: &[NodeView]) -> Vec<HostKey> {
    nodes.iter().map(HostKey::of).collect()
}

/// Go's `nodesSufficientlyEqual`: same number of hosts and the same name → providerID mapping
/// (order does not matter).
pub(crate) fn nodes_sufficiently_equal(old: &[HostKey], new: &[HostKey]) -> bool {
    if old.len() != new.len() {
        return false;
    }
    // Host lists are built sorted by name ([`eligible_hosts`]): then compare in place, with
    // no copy of 100,000 names.
    let sorted = |keys: &[HostKey]| keys.windows(2).all(|w| w[0].name < w[1].name);
    if sorted(old) && sorted(new) {
        return old == new;
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
pub(crate) fn load_balancer_status_equal(
    old: Option<&LoadBalancerStatus>,
    new: Option<&LoadBalancerStatus>,
) -> bool {
    let x = old.map(|s| slice_or_empty(&s.ingress)).unwrap_or_default();
    let y = new.map(|s| slice_or_empty(&s.ingress)).unwrap_or_default();
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| ingress_equal(a, b))
}

/// The strategic-merge patch of the `status` subresource that sets `status.loadBalancer.ingress`
/// to that of `new` and the load balancer's condition to `state` ([`condition_entry`]), one
/// write for both, or `None` when the Service already says both. Only the controller's own
/// fields are in the patch (ingress is atomic, conditions merge by `type`).
pub(crate) fn status_patch(
    service: &Service,
    new: &LoadBalancerStatus,
    state: &LoadBalancerState,
    now: &Time,
) -> Option<Value> {
    let current = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref());
    let mut status = serde_json::Map::new();
    if !load_balancer_status_equal(current, Some(new)) {
        let ingress = match new.ingress.as_deref() {
            Some(list) if !list.is_empty() => serde_json::to_value(list).unwrap_or(Value::Null),
            _ => Value::Null,
        };
        status.insert("loadBalancer".into(), json!({ "ingress": ingress }));
    }
    if let Some(entry) = condition_entry(service, state, now) {
        status.insert("conditions".into(), json!([entry]));
    }
    (!status.is_empty()).then(|| json!({ "status": status }))
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
pub(crate) fn add_finalizer_patch(service: &Service) -> Option<Value> {
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
pub(crate) fn remove_finalizer_patch(service: &Service) -> Option<Value> {
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
pub(crate) fn update_failed_note(hosts: &[HostKey], error: &str) -> String {
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
pub(crate) enum HostChange {
    /// A host may join (a Node added, become eligible, or given its first providerID):
    /// batched over a widening window.
    Addition,
    /// A host may leave or change identity (a Node deleted, excluded, tainted for deletion,
    /// no longer eligible, its providerID changed from one value to another or removed; or the
    /// subscriber missed changes): synced
    /// within the base window, as every change was before.
    Removal,
}

/// How a Node change affects the host sets; `None` when it cannot (see
/// [`node_update_needs_sync`]). `old` is `None` for an added Node, `new` `None` for a deleted
/// one.
pub(crate) fn host_change(old: Option<&NodeView>, new: Option<&NodeView>) -> Option<HostChange> {
    match (old, new) {
        (None, Some(_)) => Some(HostChange::Addition),
        (Some(_), None) | (None, None) => Some(HostChange::Removal),
        (Some(old), Some(new)) => {
            if !node_update_needs_sync(old, new) {
                None
            } else if is_eligible_host(new)
                && (!is_eligible_host(old) || provider_id(old).is_empty())
            {
                // Not a host before, or a host without an identity that now gets its first
                // providerID (cloud-node initialising a Node that just registered): nothing
                // leaves any load balancer, so it waits for the addition window. Classed as a
                // removal, every joining Node started its own pass within the base window.
                Some(HostChange::Addition)
            } else {
                Some(HostChange::Removal)
            }
        }
    }
}

/// A node-sync pass waits at most this many base windows after the first removal of a burst.
pub(crate) const MAX_WINDOW_FACTOR: u32 = 5;

/// The most `update_load_balancer_hosts` calls a pass over every load balancer may cost for
/// the addition window to stay at the base window: widening trades each joining Node's wait
/// for fewer calls, which is worth it when a pass costs one call per load balancer, not when
/// the provider's batch carries every load balancer in a few calls (10,000 load balancers in
/// 2 calls of 5,000: issue 25).
pub(crate) const CHEAP_BATCHED_PASS_CALLS: usize = 3;

/// The calls one node-sync pass over `load_balancers` costs through a hosts batch of
/// `max_batch_size` (`0` counts as `1`, as the framework treats it).
pub(crate) fn batched_pass_calls(load_balancers: usize, max_batch_size: usize) -> usize {
    load_balancers.div_ceil(max_batch_size.max(1))
}

mod backends;
mod condition;
mod ip_mode;
mod node_sync_timer;
pub(crate) use backends::*;
pub(crate) use condition::*;
pub(crate) use ip_mode::*;
pub(crate) use node_sync_timer::*;

#[cfg(test)]
mod tests;
