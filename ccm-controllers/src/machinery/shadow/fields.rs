//! The fields the shadow compares, as a flat map from a field name to its JSON value, and the
//! rule of when an object is still being reconciled by the incumbent ("pending"). Pure: no I/O.
//!
//! Only what the built-in controllers write is compared, so a difference the cache cannot see
//! (the cached Nodes are stripped) is never reported: a Node's labels (one field per key),
//! `spec.providerID`, `spec.taints`, `spec.podCIDRs`, `status.addresses` and the
//! `NetworkUnavailable` condition (status and reason); a Service's finalizers,
//! `status.loadBalancer` and `LoadBalancerProvisioned` condition (status and reason; written
//! only with `--load-balancer-status-conditions`).
//!
//! A deprecated beta label that differs exactly as its GA label does (Go's initialisation
//! writes both from one answer) is folded into the GA label's difference ([`fold_aliases`]):
//! a changed zone is one difference, not two.

use std::collections::BTreeMap;

use ccm_core::well_known::{
    CONDITION_NETWORK_UNAVAILABLE, CONDITION_READY, FINALIZER_LOAD_BALANCER_CLEANUP,
    LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_INSTANCE_TYPE,
    LABEL_INSTANCE_TYPE_BETA, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};

/// The Service condition type the service controller writes with
/// `--load-balancer-status-conditions`: whether the Service's load balancer is provisioned
/// (here, not in the controller, so that the shadow can compare it).
pub(crate) const CONDITION_LOAD_BALANCER_PROVISIONED: &str = "LoadBalancerProvisioned";

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
    if let Some(c) = service
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == CONDITION_LOAD_BALANCER_PROVISIONED)
    {
        out.insert(
            format!("status.conditions[{CONDITION_LOAD_BALANCER_PROVISIONED}]"),
            json!({"status": c.status, "reason": c.reason}),
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

/// The deprecated beta labels the node controllers write beside their GA label, as
/// `(beta, GA)`.
const BETA_ALIASES: [(&str, &str); 3] = [
    (LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_TOPOLOGY_ZONE),
    (LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_TOPOLOGY_REGION),
    (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
];

/// The compared field of the label `key`.
fn label_field(key: &str) -> String {
    format!("metadata.labels[{key}]")
}

/// One differing field, with the alias fields folded into it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldDiff {
    /// The field (for a folded label, the GA label's).
    pub field: String,
    /// Its value on the object now; `Value::Null` when absent.
    pub incumbent: Value,
    /// Its value after the write; `Value::Null` when removed.
    pub ours: Value,
    /// The alias fields that differ exactly as `field` does, folded into it.
    pub also: Vec<String>,
}

/// Folds each deprecated beta label that differs with the same values as its GA label into
/// the GA label's difference (its `also`). A beta label that differs otherwise (the incumbent
/// never set it, or set it to another value than the GA label) stays its own difference.
/// Order is kept.
pub(crate) fn fold_aliases(diffs: Vec<(String, Value, Value)>) -> Vec<FieldDiff> {
    let mut out: Vec<FieldDiff> = diffs
        .into_iter()
        .map(|(field, incumbent, ours)| FieldDiff {
            field,
            incumbent,
            ours,
            also: Vec::new(),
        })
        .collect();
    for (beta, ga) in BETA_ALIASES {
        let (beta, ga) = (label_field(beta), label_field(ga));
        let Some(b) = out.iter().position(|d| d.field == beta) else {
            continue;
        };
        let Some(g) = out.iter().position(|d| d.field == ga) else {
            continue;
        };
        if out[b].incumbent != out[g].incumbent || out[b].ours != out[g].ours {
            continue;
        }
        let folded = out.remove(b);
        let g = if b < g { g - 1 } else { g };
        out[g].also.push(folded.field);
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

    /// `(field, incumbent, ours)` of the label `key`.
    fn label(key: &str, incumbent: Value, ours: Value) -> (String, Value, Value) {
        (label_field(key), incumbent, ours)
    }

    #[test]
    fn a_changed_zone_is_one_difference_naming_the_ga_label_and_its_beta_alias() {
        let before = node_fields(&node(
            &[
                (LABEL_TOPOLOGY_ZONE, "a"),
                (LABEL_FAILURE_DOMAIN_BETA_ZONE, "a"),
                (LABEL_TOPOLOGY_REGION, "r"),
                (LABEL_FAILURE_DOMAIN_BETA_REGION, "r"),
            ],
            None,
        ));
        let after = node_fields(&node(
            &[
                (LABEL_TOPOLOGY_ZONE, "b"),
                (LABEL_FAILURE_DOMAIN_BETA_ZONE, "b"),
                (LABEL_TOPOLOGY_REGION, "r"),
                (LABEL_FAILURE_DOMAIN_BETA_REGION, "r"),
            ],
            None,
        ));
        assert_eq!(
            fold_aliases(diff(&before, &after)),
            vec![FieldDiff {
                field: label_field(LABEL_TOPOLOGY_ZONE),
                incumbent: json!("a"),
                ours: json!("b"),
                also: vec![label_field(LABEL_FAILURE_DOMAIN_BETA_ZONE)],
            }]
        );
    }

    #[test]
    fn each_ga_label_takes_its_own_alias_whatever_the_order() {
        let folded = fold_aliases(vec![
            label(LABEL_INSTANCE_TYPE_BETA, json!("m1"), json!("m2")),
            label(LABEL_TOPOLOGY_REGION, json!("r1"), json!("r2")),
            label(LABEL_FAILURE_DOMAIN_BETA_REGION, json!("r1"), json!("r2")),
            label(LABEL_INSTANCE_TYPE, json!("m1"), json!("m2")),
        ]);
        let got: Vec<(&str, Vec<&str>)> = folded
            .iter()
            .map(|d| {
                (
                    d.field.as_str(),
                    d.also.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "metadata.labels[topology.kubernetes.io/region]",
                    vec!["metadata.labels[failure-domain.beta.kubernetes.io/region]"]
                ),
                (
                    "metadata.labels[node.kubernetes.io/instance-type]",
                    vec!["metadata.labels[beta.kubernetes.io/instance-type]"]
                ),
            ]
        );
    }

    #[test]
    fn a_beta_label_that_differs_on_its_own_stays_its_own_difference() {
        // The incumbent never set the beta label: it differs from null, the GA label from "a".
        let unset = vec![
            label(LABEL_TOPOLOGY_ZONE, json!("a"), json!("b")),
            label(LABEL_FAILURE_DOMAIN_BETA_ZONE, Value::Null, json!("b")),
        ];
        let folded = fold_aliases(unset.clone());
        assert_eq!(folded.len(), 2, "{folded:?}");
        assert!(folded.iter().all(|d| d.also.is_empty()));
        assert_eq!(
            folded
                .iter()
                .map(|d| (d.field.clone(), d.incumbent.clone(), d.ours.clone()))
                .collect::<Vec<_>>(),
            unset
        );
        // Only the beta label differs (the GA label already agrees): nothing to fold into.
        let alone = fold_aliases(vec![label(
            LABEL_FAILURE_DOMAIN_BETA_ZONE,
            json!("a"),
            json!("b"),
        )]);
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].field, label_field(LABEL_FAILURE_DOMAIN_BETA_ZONE));
        assert!(alone[0].also.is_empty());
        // The GA and beta labels differ to different values: two differences.
        let apart = fold_aliases(vec![
            label(LABEL_TOPOLOGY_ZONE, json!("a"), json!("b")),
            label(LABEL_FAILURE_DOMAIN_BETA_ZONE, json!("a"), json!("c")),
        ]);
        assert_eq!(apart.len(), 2, "{apart:?}");
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

    #[test]
    fn service_load_balancer_condition_is_compared() {
        let service: Service = serde_json::from_value(json!({
            "status": {"conditions": [
                {"type": "LoadBalancerProvisioned", "status": "False", "reason": "SyncLoadBalancerFailed", "message": "quota", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "example.com/Other", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]}
        }))
        .unwrap();
        let fields = service_fields(&service);
        assert_eq!(
            fields.get("status.conditions[LoadBalancerProvisioned]"),
            Some(&json!({"status": "False", "reason": "SyncLoadBalancerFailed"}))
        );
        assert_eq!(fields.len(), 1, "{fields:?}");
    }
}
