//! The fields the shadow compares, as a flat map from a field name to its JSON value, and the
//! rule of when an object is still being reconciled by the incumbent ("pending"). Pure: no I/O.
//!
//! Only what the built-in controllers write is compared, so a difference the cache cannot see
//! (the cached Nodes are stripped) is never reported: a Node's labels (one field per key),
//! `spec.providerID`, `spec.taints`, `spec.podCIDRs`, `status.addresses` and the
//! `NetworkUnavailable` condition (status and reason); a Service's finalizers and
//! `status.loadBalancer`.

use std::collections::BTreeMap;

use ccm_core::well_known::{
    CONDITION_NETWORK_UNAVAILABLE, CONDITION_READY, FINALIZER_LOAD_BALANCER_CLEANUP,
    TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};

/// The field of a "would delete Node" divergence.
pub(crate) const FIELD_NODE_DELETED: &str = "(node deleted)";

/// The compared fields of `node`.
pub(crate) fn node_fields(node: &Node) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (k, v) in node.metadata.labels.iter().flatten() {
        out.insert(format!("metadata.labels[{k}]"), json!(v));
    }
    let spec = node.spec.as_ref();
    if let Some(id) = spec.and_then(|s| s.provider_id.as_ref()) {
        out.insert("spec.providerID".to_owned(), json!(id));
    }
    let mut taints: Vec<Value> = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect}))
        .collect();
    taints.sort_by_key(Value::to_string);
    if !taints.is_empty() {
        out.insert("spec.taints".to_owned(), Value::Array(taints));
    }
    if let Some(cidrs) = spec
        .and_then(|s| s.pod_cidrs.as_ref())
        .filter(|c| !c.is_empty())
    {
        out.insert("spec.podCIDRs".to_owned(), json!(cidrs));
    }
    let status = node.status.as_ref();
    if let Some(addresses) = status
        .and_then(|s| s.addresses.as_ref())
        .filter(|a| !a.is_empty())
    {
        let list: Vec<Value> = addresses
            .iter()
            .map(|a| json!({"type": a.type_, "address": a.address}))
            .collect();
        out.insert("status.addresses".to_owned(), Value::Array(list));
    }
    if let Some(c) = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == CONDITION_NETWORK_UNAVAILABLE)
    {
        out.insert(
            format!("status.conditions[{CONDITION_NETWORK_UNAVAILABLE}]"),
            json!({"status": c.status, "reason": c.reason}),
        );
    }
    out
}

/// The compared fields of `service`.
pub(crate) fn service_fields(service: &Service) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut finalizers: Vec<&String> = service.metadata.finalizers.iter().flatten().collect();
    finalizers.sort();
    if !finalizers.is_empty() {
        out.insert("metadata.finalizers".to_owned(), json!(finalizers));
    }
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .filter(|i| !i.is_empty());
    if let Some(ingress) = ingress {
        out.insert(
            "status.loadBalancer.ingress".to_owned(),
            serde_json::to_value(ingress).unwrap_or(Value::Null),
        );
    }
    out
}

/// The fields whose values differ between `before` and `after`: `(field, before, after)`,
/// `Value::Null` for a field one side lacks.
pub(crate) fn diff(
    before: &BTreeMap<String, Value>,
    after: &BTreeMap<String, Value>,
) -> Vec<(String, Value, Value)> {
    let mut out = Vec::new();
    for (field, b) in before {
        match after.get(field) {
            Some(a) if a == b => {}
            a => out.push((field.clone(), b.clone(), a.cloned().unwrap_or(Value::Null))),
        }
    }
    for (field, a) in after {
        if !before.contains_key(field) {
            out.push((field.clone(), Value::Null, a.clone()));
        }
    }
    out
}

/// A Node the incumbent has not settled yet: still tainted uninitialized, or being deleted.
pub(crate) fn node_pending(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some()
        || node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|t| t.key == TAINT_UNINITIALIZED)
}

/// Whether `node` reports `Ready=True`.
pub(crate) fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == CONDITION_READY && c.status == "True")
}

/// A Service the incumbent has not settled yet: being deleted, or a `LoadBalancer` Service
/// without the cleanup finalizer.
pub(crate) fn service_pending(service: &Service) -> bool {
    if service.metadata.deletion_timestamp.is_some() {
        return true;
    }
    let is_lb = service
        .spec
        .as_ref()
        .is_some_and(|s| s.type_.as_deref() == Some("LoadBalancer"));
    let has_finalizer = service
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP);
    is_lb && !has_finalizer
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};

    fn node(labels: &[(&str, &str)], taint: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        n.spec = Some(NodeSpec {
            taints: taint.map(|k| {
                vec![Taint {
                    key: k.to_owned(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]
            }),
            ..NodeSpec::default()
        });
        n
    }

    #[test]
    fn a_changed_label_is_one_field_with_both_values() {
        let before = node_fields(&node(&[("zone", "a"), ("keep", "x")], None));
        let after = node_fields(&node(&[("zone", "b"), ("keep", "x")], None));
        assert_eq!(
            diff(&before, &after),
            vec![("metadata.labels[zone]".to_owned(), json!("a"), json!("b"))]
        );
        assert!(diff(&before, &before).is_empty());
    }

    #[test]
    fn an_added_or_removed_field_has_null_on_the_other_side() {
        let before = node_fields(&node(&[], Some(TAINT_UNINITIALIZED)));
        let after = node_fields(&node(&[("zone", "b")], None));
        let d = diff(&before, &after);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d.contains(&("metadata.labels[zone]".to_owned(), Value::Null, json!("b"))));
        assert!(d.iter().any(|(f, _, a)| f == "spec.taints" && a.is_null()));
    }

    #[test]
    fn pending_objects_are_uninitialised_nodes_and_lb_services_without_finalizer() {
        assert!(node_pending(&node(&[], Some(TAINT_UNINITIALIZED))));
        assert!(!node_pending(&node(&[], Some("other"))));
        let mut svc = Service {
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ..Default::default()
            }),
            ..Service::default()
        };
        assert!(service_pending(&svc));
        svc.metadata.finalizers = Some(vec![FINALIZER_LOAD_BALANCER_CLEANUP.to_owned()]);
        assert!(!service_pending(&svc));
    }
}
