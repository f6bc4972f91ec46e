//! Unit tests of the service planner: the rules of the reference, one test per rule.

use super::*;
use k8s_openapi::api::core::v1::Node;

// The Node predicates read the cached view; the tests build k8s-openapi Nodes, as the API
// server sends them, and ask through these (each the view of the Node, as the cache holds it).
fn view(node: &Node) -> NodeView {
    NodeView::from_node(node)
}

fn is_eligible_host(node: &Node) -> bool {
    super::is_eligible_host(&view(node))
}

fn node_included(node: &Node) -> bool {
    super::node_included(&view(node))
}

fn node_not_deleted(node: &Node) -> bool {
    super::node_not_deleted(&view(node))
}

fn node_not_tainted_for_deletion(node: &Node) -> bool {
    super::node_not_tainted_for_deletion(&view(node))
}

fn node_update_needs_sync(old: &Node, new: &Node) -> bool {
    super::node_update_needs_sync(&view(old), &view(new))
}

fn host_change(old: Option<&Node>, new: Option<&Node>) -> Option<HostChange> {
    super::host_change(old.map(view).as_ref(), new.map(view).as_ref())
}

/// Go's `needsUpdate(old, new)`: whether a Service update must be synced ([`update_trigger`]
/// lists why; the event loop applies it inline, with the trigger's Event).
fn needs_update(old: &Service, new: &Service, classes: &ServedClasses) -> bool {
    update_trigger(old, new, classes).is_some()
}

/// Whether a Service update is queued: [`needs_update`] or [`needs_cleanup`] of the new object
/// (Go's update handler, as the event loop in `sync.rs` applies it).
fn should_enqueue_update(old: &Service, new: &Service, classes: &ServedClasses) -> bool {
    needs_update(old, new, classes) || needs_cleanup(new, classes)
}

/// Go's served classes: Services without a class only.
fn go() -> ServedClasses {
    ServedClasses::default()
}
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
    assert!(wants_load_balancer(&lb(), &go()));
    for t in ["ClusterIP", "NodePort", "ExternalName", "loadbalancer", ""] {
        assert!(!wants_load_balancer(&svc(t), &go()), "{t}");
    }
    let mut classed = lb();
    spec(&mut classed).load_balancer_class = Some("example.com/other".into());
    assert!(!wants_load_balancer(&classed, &go()));
    // Even an empty class means "not mine".
    spec(&mut classed).load_balancer_class = Some(String::new());
    assert!(!wants_load_balancer(&classed, &go()));
    let mut no_spec = lb();
    no_spec.spec = None;
    assert!(!wants_load_balancer(&no_spec, &go()));
}

#[test]
fn needs_cleanup_requires_finalizer_and_deletion_or_not_wanting() {
    assert!(!needs_cleanup(&lb(), &go()));
    assert!(!needs_cleanup(&with_finalizer(lb()), &go()));
    assert!(needs_cleanup(&deleting(with_finalizer(lb())), &go()));
    assert!(needs_cleanup(&with_finalizer(svc("ClusterIP")), &go()));
    assert!(!needs_cleanup(&svc("ClusterIP"), &go()));
    assert!(!needs_cleanup(&deleting(lb()), &go()));
    // A LoadBalancer of another class is that class's controller's, finalizer or not (see
    // tests/classes.rs).
    let mut classed = with_finalizer(lb());
    spec(&mut classed).load_balancer_class = Some("x".into());
    assert!(!needs_cleanup(&classed, &go()));
    // Other finalizers do not count.
    let mut other = deleting(lb());
    other.metadata.finalizers = Some(vec!["example.com/other".into()]);
    assert!(!needs_cleanup(&other, &go()));
}

#[test]
fn add_and_update_handlers_enqueue_per_go() {
    assert!(should_enqueue_add(&lb(), &go()));
    assert!(!should_enqueue_add(&svc("ClusterIP"), &go()));
    assert!(should_enqueue_add(&with_finalizer(svc("ClusterIP")), &go()));
    assert!(should_enqueue_add(&deleting(with_finalizer(lb())), &go()));
    // A status-only or label-only update is ignored...
    let mut new = lb();
    new.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
    new.metadata.resource_version = Some("8".into());
    assert!(!should_enqueue_update(&lb(), &new, &go()));
    // ... unless the Service needs cleanup (finalizer + deletion).
    let old = with_finalizer(lb());
    assert!(should_enqueue_update(&old, &deleting(old.clone()), &go()));
    // Two non-LB Services never trigger, even if they differ.
    let mut np = svc("NodePort");
    np.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
    assert!(!should_enqueue_update(&svc("ClusterIP"), &np, &go()));
}

// ---- needs_update ------------------------------------------------------------------

fn changed(f: impl FnOnce(&mut Service)) -> Option<UpdateTrigger> {
    let old = lb();
    let mut new = old.clone();
    f(&mut new);
    update_trigger(&old, &new, &go())
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
    assert!(needs_update(&svc("NodePort"), &lb(), &go()));
    // Gaining a class is a flip of wantsLoadBalancer too.
    assert_eq!(
        reason(|s| spec(s).load_balancer_class = Some("x".into())),
        Some("Type")
    );
}

#[test]
fn needs_update_on_source_ranges() {
    let t = changed(|s| {
        spec(s).load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into(), "1.2.3.4/32".into()])
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
    assert!(needs_update(&two, &swapped, &go()));
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
        update_trigger(&old, &new, &go()).unwrap().event,
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
    assert!(!needs_update(&old, &new, &go()));
}

// ---- decide ------------------------------------------------------------------------

#[test]
fn decide_covers_every_case() {
    assert_eq!(decide(&lb(), false, &go()), Decision::Ensure);
    assert_eq!(
        decide(&with_finalizer(lb()), false, &go()),
        Decision::Ensure
    );
    assert_eq!(decide(&with_finalizer(lb()), true, &go()), Decision::Ensure);
    assert_eq!(
        decide(&deleting(with_finalizer(lb())), false, &go()),
        Decision::Delete
    );
    assert_eq!(
        decide(&with_finalizer(svc("ClusterIP")), false, &go()),
        Decision::Delete
    );
    assert_eq!(decide(&svc("ClusterIP"), true, &go()), Decision::Delete);
    assert_eq!(decide(&deleting(lb()), true, &go()), Decision::Delete);
    assert_eq!(decide(&svc("ClusterIP"), false, &go()), Decision::Skip);
    assert_eq!(decide(&deleting(lb()), false, &go()), Decision::Skip);
    let mut classed = lb();
    spec(&mut classed).load_balancer_class = Some("x".into());
    assert_eq!(decide(&classed, false, &go()), Decision::Skip);
    assert_eq!(
        decide(&with_finalizer(classed.clone()), false, &go()),
        Decision::Skip
    );
    assert_eq!(decide(&classed, true, &go()), Decision::Delete);
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
    let nodes: Vec<NodeView> = vec![
        view(&node("c")),
        view(&labelled(node("b"), "true")),
        view(&node("a")),
    ];
    let hosts = eligible_hosts(&nodes);
    let names: Vec<_> = hosts.iter().map(NodeView::name).collect();
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
fn host_changes_are_additions_only_when_nothing_can_leave() {
    let named = node("a");
    let mut registered = named.clone();
    registered.spec.as_mut().unwrap().provider_id = None;
    // Added, or given its first providerID by cloud-node: an addition.
    assert_eq!(
        host_change(None, Some(&registered)),
        Some(HostChange::Addition)
    );
    assert_eq!(
        host_change(Some(&registered), Some(&named)),
        Some(HostChange::Addition)
    );
    // Excluded, then included again: an addition.
    let excluded = labelled(named.clone(), "true");
    assert_eq!(
        host_change(Some(&excluded), Some(&named)),
        Some(HostChange::Addition)
    );
    // Leaving, or changing its identity: a removal.
    assert_eq!(
        host_change(Some(&named), Some(&excluded)),
        Some(HostChange::Removal)
    );
    let mut moved = named.clone();
    moved.spec.as_mut().unwrap().provider_id = Some("fake://other".into());
    assert_eq!(
        host_change(Some(&named), Some(&moved)),
        Some(HostChange::Removal)
    );
    assert_eq!(
        host_change(Some(&named), Some(&registered)),
        Some(HostChange::Removal)
    );
    assert_eq!(host_change(Some(&named), None), Some(HostChange::Removal));
    // Nothing a load balancer sees: no change.
    assert_eq!(host_change(Some(&named), Some(&named)), None);
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

// ---- finalizer patches -------------------------------------------------------------

/// Applies `patch` to `service` as kube-apiserver does (Go's evanphx/json-patch: a `test`
/// for `null` passes when the key is missing but its parent exists).
fn apply(service: &Service, patch: &Value) -> Result<Service, String> {
    let mut doc = serde_json::to_value(service).unwrap();
    for op in patch.as_array().unwrap() {
        let path = op["path"].as_str().unwrap();
        if op["op"] == "test" && op["value"].is_null() {
            let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
            if doc.pointer(parent).is_none() || doc.pointer(path).is_some_and(|v| !v.is_null()) {
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

mod backends;
mod classes;
mod conditions;
mod ip_mode;
mod node_sync_timer;
