//! Unit tests of the route planner: the rules of the reference, one test per rule.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn addr(type_: &str, address: &str) -> NodeAddress {
    NodeAddress {
        type_: type_.into(),
        address: address.into(),
    }
}

fn node(name: &str, cidrs: &[&str]) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        uid: format!("uid-{name}"),
        pod_cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
        addresses: vec![addr("InternalIP", "192.168.0.1"), addr("Hostname", name)],
        network_unavailable: None,
        managed: true,
    }
}

fn route(node: &str, cidr: &str) -> Route {
    Route {
        name: format!("r-{node}-{cidr}"),
        target_node: node.into(),
        destination_cidr: cidr.into(),
        ..Route::default()
    }
}

fn v4() -> Vec<IpNet> {
    vec!["10.244.0.0/16".parse().unwrap()]
}

fn dual() -> Vec<IpNet> {
    vec![
        "10.244.0.0/16".parse().unwrap(),
        "fd00:10:244::/56".parse().unwrap(),
    ]
}

fn create_cidrs(p: &RoutePlan) -> Vec<(String, String)> {
    p.creates
        .iter()
        .map(|c| {
            (
                c.route.target_node.clone(),
                c.route.destination_cidr.clone(),
            )
        })
        .collect()
}

fn delete_names(p: &RoutePlan) -> Vec<String> {
    p.deletes.iter().map(|r| r.name.clone()).collect()
}

#[test]
fn parse_single_and_dual_stack() {
    assert_eq!(
        parse_cluster_cidrs("10.244.0.0/16").unwrap(),
        vec!["10.244.0.0/16".parse::<IpNet>().unwrap()]
    );
    assert_eq!(
        parse_cluster_cidrs(" 10.244.0.0/16 , fd00:10:244::/56 ").unwrap(),
        dual()
    );
    assert_eq!(
        parse_cluster_cidrs("fd00:10:244::/56,10.244.0.0/16")
            .unwrap()
            .len(),
        2
    );
    // Host bits are dropped, as Go's ParseCIDR does.
    assert_eq!(
        parse_cluster_cidrs("10.244.1.7/16").unwrap(),
        vec!["10.244.0.0/16".parse::<IpNet>().unwrap()]
    );
}

#[test]
fn parse_errors_name_the_problem() {
    assert_eq!(
        parse_cluster_cidrs("").unwrap_err(),
        "no cluster CIDR given"
    );
    assert_eq!(
        parse_cluster_cidrs("  ").unwrap_err(),
        "no cluster CIDR given"
    );
    let e = parse_cluster_cidrs("10.244.0.0").unwrap_err();
    assert!(e.contains("invalid CIDR \"10.244.0.0\""), "{e}");
    let e = parse_cluster_cidrs("10.244.0.0/16,").unwrap_err();
    assert!(e.contains("empty CIDR"), "{e}");
    let e = parse_cluster_cidrs("10.244.0.0/16,10.245.0.0/16").unwrap_err();
    assert!(e.contains("one IPv4 and one IPv6"), "{e}");
    let e = parse_cluster_cidrs("fd00::/48,fd01::/48").unwrap_err();
    assert!(e.contains("dual-stack pair"), "{e}");
    let e = parse_cluster_cidrs("10.0.0.0/8,fd00::/48,10.1.0.0/16").unwrap_err();
    assert!(e.contains("3 cluster CIDRs given; at most 2"), "{e}");
    assert!(validate_cluster_cidrs(&[]).is_err());
}

#[test]
fn node_info_reads_pod_cidrs_with_fallback_and_condition() {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;
    let mut n = Node {
        metadata: ObjectMeta {
            name: Some("a".into()),
            uid: Some("u1".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some("10.244.1.0/24".into()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![addr("InternalIP", "10.0.0.1")]),
            conditions: Some(vec![
                NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                },
                NodeCondition {
                    type_: NETWORK_UNAVAILABLE.into(),
                    status: "False".into(),
                    reason: Some("CalicoIsUp".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
    };
    let info = NodeInfo::from_node(&n);
    assert_eq!(info.name, "a");
    assert_eq!(info.uid, "u1");
    assert_eq!(info.pod_cidrs, ["10.244.1.0/24"]);
    assert_eq!(info.addresses, [addr("InternalIP", "10.0.0.1")]);
    assert_eq!(
        info.network_unavailable,
        Some(CurrentCondition {
            status: "False".into(),
            reason: "CalicoIsUp".into()
        })
    );
    // spec.podCIDRs wins over spec.podCIDR.
    n.spec.as_mut().unwrap().pod_cidrs =
        Some(vec!["10.244.1.0/24".into(), "fd00:10:244:1::/64".into()]);
    assert_eq!(
        NodeInfo::from_node(&n).pod_cidrs,
        ["10.244.1.0/24", "fd00:10:244:1::/64"]
    );
    let empty = NodeInfo::from_node(&Node::default());
    assert!(empty.pod_cidrs.is_empty());
    assert!(empty.network_unavailable.is_none());
}

#[test]
fn new_node_gets_a_route_named_after_its_uid() {
    let n = node("a", &["10.244.1.0/24"]);
    let p = plan(std::slice::from_ref(&n), &[], &v4());
    assert!(p.deletes.is_empty());
    assert_eq!(
        p.creates,
        [RouteCreate {
            name_hint: "uid-a".into(),
            route: Route {
                name: String::new(),
                target_node: "a".into(),
                enable_node_addresses: false,
                target_node_addresses: n.addresses.clone(),
                destination_cidr: "10.244.1.0/24".into(),
                blackhole: false,
            },
        }]
    );
    assert_eq!(p.nodes["a"].cidrs["10.244.1.0/24"], RouteAction::Add);
    assert!(!p.deletes_before_creates);
}

#[test]
fn dual_stack_node_gets_one_route_per_family() {
    let p = plan(
        &[node("a", &["10.244.1.0/24", "fd00:10:244:1::/64"])],
        &[],
        &dual(),
    );
    assert_eq!(
        create_cidrs(&p),
        [
            ("a".into(), "10.244.1.0/24".into()),
            ("a".into(), "fd00:10:244:1::/64".into())
        ]
    );
    // One family already routed: only the other is created.
    let p = plan(
        &[node("a", &["10.244.1.0/24", "fd00:10:244:1::/64"])],
        &[route("a", "10.244.1.0/24")],
        &dual(),
    );
    assert_eq!(
        create_cidrs(&p),
        [("a".into(), "fd00:10:244:1::/64".into())]
    );
    assert!(p.deletes.is_empty());
}

#[test]
fn existing_route_is_kept() {
    let p = plan(
        &[node("a", &["10.244.1.0/24"])],
        &[route("a", "10.244.1.0/24")],
        &v4(),
    );
    assert!(p.creates.is_empty());
    assert!(p.deletes.is_empty());
    assert_eq!(p.nodes["a"].cidrs["10.244.1.0/24"], RouteAction::Keep);
}

#[test]
fn cidr_spelling_does_not_matter() {
    let p = plan(
        &[node("a", &["fd00:10:244:1:0::/64"])],
        &[route("a", "fd00:10:244:1::/64")],
        &dual(),
    );
    assert!(p.creates.is_empty());
    assert!(p.deletes.is_empty());
}

#[test]
fn routes_of_removed_nodes_and_stale_cidrs_are_deleted() {
    let p = plan(
        &[node("a", &["10.244.2.0/24"])],
        &[
            route("gone", "10.244.9.0/24"),
            // Node a's CIDR changed from .1 to .2.
            route("a", "10.244.1.0/24"),
        ],
        &v4(),
    );
    assert_eq!(
        delete_names(&p),
        ["r-gone-10.244.9.0/24", "r-a-10.244.1.0/24"]
    );
    assert_eq!(create_cidrs(&p), [("a".into(), "10.244.2.0/24".into())]);
    // A removed node gets no condition (it has no Node to carry one).
    assert!(!p.nodes.contains_key("gone"));
}

#[test]
fn blackhole_routes_inside_the_cluster_cidr_are_deleted_even_when_matching() {
    let mut bh = route("a", "10.244.1.0/24");
    bh.blackhole = true;
    let mut outside_bh = route("x", "192.168.5.0/24");
    outside_bh.blackhole = true;
    let p = plan(&[node("a", &["10.244.1.0/24"])], &[bh, outside_bh], &v4());
    assert_eq!(delete_names(&p), ["r-a-10.244.1.0/24"]);
    // Better than Go (which counts the blackhole as the node's route and creates nothing
    // until the next reconcile): the blackhole is replaced in this pass, deletes first.
    assert_eq!(create_cidrs(&p), [("a".into(), "10.244.1.0/24".into())]);
    assert_eq!(p.nodes["a"].cidrs["10.244.1.0/24"], RouteAction::Add);
    assert!(p.deletes_before_creates);
    // A blackhole next to a healthy route for the same CIDR: the healthy one is kept.
    let mut bh = route("a", "10.244.1.0/24");
    bh.blackhole = true;
    bh.name = "bh".into();
    let p = plan(
        &[node("a", &["10.244.1.0/24"])],
        &[bh, route("a", "10.244.1.0/24")],
        &v4(),
    );
    assert_eq!(delete_names(&p), ["bh"]);
    assert!(p.creates.is_empty());
}

#[test]
fn routes_outside_the_cluster_cidrs_are_left_alone() {
    let p = plan(
        &[node("a", &["10.244.1.0/24"])],
        &[
            route("a", "10.244.1.0/24"),
            route("other", "172.16.0.0/24"),
            route("", "172.16.1.0/24"),
            route("gone", "fd99::/64"),
            route("weird", "not-a-cidr"),
            route("", "garbage/99"),
        ],
        &dual(),
    );
    assert!(p.deletes.is_empty(), "{:?}", p.deletes);
}

#[test]
fn responsibility_is_first_or_last_address_inside_a_cluster_cidr() {
    let cc = v4();
    let r = |c: &str| route("n", c);
    assert!(is_responsible(&cc, &r("10.244.1.0/24")));
    // A supernet of the cluster CIDR: first address inside.
    assert!(is_responsible(&cc, &r("10.244.0.0/15")));
    // A supernet ending where the cluster CIDR ends: last address inside.
    let upper: Vec<IpNet> = vec!["10.245.0.0/16".parse().unwrap()];
    assert!(is_responsible(&upper, &r("10.244.0.0/15")));
    assert!(is_responsible(&cc, &r("10.244.255.0/24")));
    // Host bits set in the route: its network counts.
    assert!(is_responsible(&cc, &r("10.244.1.5/24")));
    assert!(!is_responsible(&cc, &r("10.245.0.0/24")));
    assert!(!is_responsible(&cc, &r("fd00::/64")));
    assert!(!is_responsible(&cc, &r("")));
    assert!(!is_responsible(&cc, &r("10.244.1.0")));
    assert!(is_responsible(&dual(), &r("fd00:10:244:ff::/64")));
    // A supernet containing the cluster CIDR in its middle: neither end inside (as Go).
    assert!(!is_responsible(&cc, &r("10.0.0.0/8")));
}

#[test]
fn routes_with_empty_target_node_are_never_matched_and_deleted_inside_the_cidr() {
    let p = plan(
        &[node("a", &["10.244.1.0/24"])],
        &[route("", "10.244.1.0/24")],
        &v4(),
    );
    assert_eq!(delete_names(&p), ["r--10.244.1.0/24"]);
    assert_eq!(create_cidrs(&p), [("a".into(), "10.244.1.0/24".into())]);
    // A node whose name is empty is never matched to routes with an empty target either.
    let p = plan(&[node("", &[])], &[route("", "10.244.1.0/24")], &v4());
    assert!(p.nodes.is_empty());
    assert_eq!(p.deletes.len(), 1);
}

#[test]
fn node_without_pod_cidrs_and_without_routes_gets_nothing() {
    let p = plan(&[node("a", &[])], &[], &v4());
    assert_eq!(p, RoutePlan::default());
    assert!(condition_updates(&p, &HashSet::new()).is_empty());
}

#[test]
fn node_with_old_routes_but_no_pod_cidrs_gets_no_route_created_and_loses_the_route() {
    let p = plan(&[node("a", &[])], &[route("a", "10.244.1.0/24")], &v4());
    assert_eq!(delete_names(&p), ["r-a-10.244.1.0/24"]);
    assert!(p.nodes["a"].cidrs.is_empty());
    assert_eq!(
        condition_updates(&p, &HashSet::new()),
        [("a".to_owned(), DesiredCondition::NO_ROUTE_CREATED)]
    );
    // Even when its only route lies outside the cluster CIDR (kept, but the node has an
    // entry), as in Go.
    let p = plan(&[node("a", &[])], &[route("a", "172.16.0.0/24")], &v4());
    assert!(p.deletes.is_empty());
    assert_eq!(
        condition_updates(&p, &HashSet::new()),
        [("a".to_owned(), DesiredCondition::NO_ROUTE_CREATED)]
    );
}

#[test]
fn address_changes_are_ignored_when_the_provider_does_not_track_them() {
    let mut r = route("a", "10.244.1.0/24");
    r.target_node_addresses = vec![addr("InternalIP", "10.9.9.9")];
    let p = plan(&[node("a", &["10.244.1.0/24"])], &[r], &v4());
    assert!(p.creates.is_empty());
    assert!(p.deletes.is_empty());
}

#[test]
fn address_change_is_an_update_when_the_provider_tracks_addresses() {
    let n = node("a", &["10.244.1.0/24"]);
    let mut r = route("a", "10.244.1.0/24");
    r.enable_node_addresses = true;
    r.target_node_addresses = vec![addr("InternalIP", "10.9.9.9")];
    let p = plan(std::slice::from_ref(&n), std::slice::from_ref(&r), &v4());
    assert_eq!(p.nodes["a"].cidrs["10.244.1.0/24"], RouteAction::Update);
    assert_eq!(delete_names(&p), ["r-a-10.244.1.0/24"]);
    assert_eq!(p.creates.len(), 1);
    assert_eq!(p.creates[0].route.target_node_addresses, n.addresses);
    assert!(p.deletes_before_creates);

    // Same addresses in another order: a set, so kept.
    let mut r = route("a", "10.244.1.0/24");
    r.enable_node_addresses = true;
    r.target_node_addresses = n.addresses.iter().rev().cloned().collect();
    let p = plan(std::slice::from_ref(&n), &[r], &v4());
    assert!(p.creates.is_empty() && p.deletes.is_empty());
    assert!(p.deletes_before_creates);

    // One address more: an update.
    let mut r = route("a", "10.244.1.0/24");
    r.enable_node_addresses = true;
    r.target_node_addresses = n.addresses.clone();
    r.target_node_addresses
        .push(addr("ExternalIP", "203.0.113.1"));
    let p = plan(std::slice::from_ref(&n), &[r], &v4());
    assert_eq!(p.nodes["a"].cidrs["10.244.1.0/24"], RouteAction::Update);
}

#[test]
fn address_change_updates_every_family_of_a_dual_stack_node() {
    let n = node("a", &["10.244.1.0/24", "fd00:10:244:1::/64"]);
    let stale = |cidr: &str| {
        let mut r = route("a", cidr);
        r.enable_node_addresses = true;
        r.target_node_addresses = vec![addr("InternalIP", "10.9.9.9")];
        r
    };
    let p = plan(
        std::slice::from_ref(&n),
        &[stale("10.244.1.0/24"), stale("fd00:10:244:1::/64")],
        &dual(),
    );
    assert_eq!(p.deletes.len(), 2);
    assert_eq!(p.creates.len(), 2);
    assert!(p.deletes_before_creates);
    assert!(
        p.nodes["a"]
            .cidrs
            .values()
            .all(|a| *a == RouteAction::Update)
    );
}

#[test]
fn unparsable_pod_cidr_is_still_attempted_and_matched_by_text() {
    // Go creates a route for whatever the Node says; the provider rejects it, the create
    // fails, and the Node is NoRouteCreated.
    let p = plan(&[node("a", &["not-a-cidr"])], &[], &v4());
    assert_eq!(create_cidrs(&p), [("a".into(), "not-a-cidr".into())]);
    let failed: HashSet<RouteKey> = [RouteKey::new("a", "not-a-cidr")].into();
    assert_eq!(
        condition_updates(&p, &failed),
        [("a".to_owned(), DesiredCondition::NO_ROUTE_CREATED)]
    );
    // A listed route with the same text counts as the Node's route (never deleted: it
    // is not inside any cluster CIDR).
    let p = plan(
        &[node("a", &["not-a-cidr"])],
        &[route("a", "not-a-cidr")],
        &v4(),
    );
    assert!(p.creates.is_empty() && p.deletes.is_empty());
}

#[test]
fn ipv6_only_cluster() {
    let cc: Vec<IpNet> = vec!["fd00:10:244::/56".parse().unwrap()];
    let p = plan(
        &[node("a", &["fd00:10:244:1::/64"])],
        &[
            route("gone", "fd00:10:244:2::/64"),
            route("x", "10.244.1.0/24"),
        ],
        &cc,
    );
    assert_eq!(
        create_cidrs(&p),
        [("a".into(), "fd00:10:244:1::/64".into())]
    );
    assert_eq!(delete_names(&p), ["r-gone-fd00:10:244:2::/64"]);
}

#[test]
fn deletes_before_creates_follows_the_first_listed_route_only() {
    let nodes = [node("a", &["10.244.1.0/24"]), node("b", &["10.244.2.0/24"])];
    let mut tracked = route("b", "10.244.2.0/24");
    tracked.enable_node_addresses = true;
    tracked.target_node_addresses = nodes[1].addresses.clone();
    let untracked = route("a", "10.244.1.0/24");
    let p = plan(&nodes, &[untracked.clone(), tracked.clone()], &v4());
    assert!(!p.deletes_before_creates);
    let p = plan(&nodes, &[tracked, untracked], &v4());
    assert!(p.deletes_before_creates);
    assert!(!plan(&nodes, &[], &v4()).deletes_before_creates);
}

#[test]
fn duplicate_pod_cidrs_and_duplicate_nodes_are_planned_once() {
    let p = plan(
        &[
            node("a", &["10.244.1.0/24", "10.244.1.0/24"]),
            node("a", &["10.244.1.0/24"]),
        ],
        &[],
        &v4(),
    );
    assert_eq!(p.creates.len(), 1);
}

#[test]
fn pod_cidr_outside_the_cluster_cidr_is_still_routed() {
    // Go creates a route for every pod CIDR; responsibility only limits deletes.
    let p = plan(&[node("a", &["172.16.1.0/24"])], &[], &v4());
    assert_eq!(create_cidrs(&p), [("a".into(), "172.16.1.0/24".into())]);
}

#[test]
fn conditions_follow_create_results() {
    let mut a = node("a", &["10.244.1.0/24", "fd00:10:244:1::/64"]);
    a.network_unavailable = None;
    let b = node("b", &["10.244.2.0/24"]);
    let p = plan(&[a, b], &[route("b", "10.244.2.0/24")], &dual());
    // All creates succeeded.
    assert_eq!(
        condition_updates(&p, &HashSet::new()),
        [
            ("a".to_owned(), DesiredCondition::ROUTE_CREATED),
            ("b".to_owned(), DesiredCondition::ROUTE_CREATED)
        ]
    );
    // One family failed: the node is NoRouteCreated.
    let failed: HashSet<RouteKey> = [RouteKey::new("a", "fd00:10:244:1::/64")].into();
    assert_eq!(
        condition_updates(&p, &failed),
        [
            ("a".to_owned(), DesiredCondition::NO_ROUTE_CREATED),
            ("b".to_owned(), DesiredCondition::ROUTE_CREATED)
        ]
    );
}

#[test]
fn condition_is_skipped_only_when_status_and_reason_are_unchanged() {
    let mut a = node("a", &["10.244.1.0/24"]);
    let routes = [route("a", "10.244.1.0/24")];
    a.network_unavailable = Some(CurrentCondition {
        status: "False".into(),
        reason: REASON_ROUTE_CREATED.into(),
    });
    let p = plan(std::slice::from_ref(&a), &routes, &v4());
    assert!(condition_updates(&p, &HashSet::new()).is_empty());

    // A CNI set False with its own reason: overwritten (Go since 2026-01).
    a.network_unavailable = Some(CurrentCondition {
        status: "False".into(),
        reason: "CalicoIsUp".into(),
    });
    let p = plan(std::slice::from_ref(&a), &routes, &v4());
    assert_eq!(
        condition_updates(&p, &HashSet::new()),
        [("a".to_owned(), DesiredCondition::ROUTE_CREATED)]
    );

    // Status flips.
    a.network_unavailable = Some(CurrentCondition {
        status: "True".into(),
        reason: REASON_NO_ROUTE_CREATED.into(),
    });
    let p = plan(std::slice::from_ref(&a), &routes, &v4());
    assert_eq!(
        condition_updates(&p, &HashSet::new()),
        [("a".to_owned(), DesiredCondition::ROUTE_CREATED)]
    );

    // Already True/NoRouteCreated and the create fails again: skipped.
    let p = plan(std::slice::from_ref(&a), &[], &v4());
    let failed: HashSet<RouteKey> = [RouteKey::new("a", "10.244.1.0/24")].into();
    assert!(condition_updates(&p, &failed).is_empty());
}

fn node_with_condition(status: Option<(&str, &str)>) -> Node {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    let mut conditions = vec![NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        ..NodeCondition::default()
    }];
    if let Some((status, reason)) = status {
        conditions.push(NodeCondition {
            type_: NETWORK_UNAVAILABLE.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some("before".into()),
            last_transition_time: Some(t0()),
            last_heartbeat_time: Some(t0()),
        });
    }
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some("n1".into()),
            resource_version: Some("42".into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(conditions),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

fn t0() -> Time {
    Time("2020-01-01T00:00:00Z".parse().unwrap())
}

fn t1() -> Time {
    Time("2026-01-01T00:00:00Z".parse().unwrap())
}

fn strategic(patch: Option<serde_json::Value>) -> serde_json::Value {
    let patch = patch.expect("a patch");
    assert!(patch.is_object(), "not a strategic-merge patch: {patch}");
    patch
}

#[test]
fn a_new_condition_is_patched_by_type_at_now_without_a_precondition() {
    let patch = strategic(condition_patch(
        &node_with_condition(None),
        &DesiredCondition::ROUTE_CREATED,
        &t1(),
    ));
    assert_eq!(
        patch,
        serde_json::json!({"status": {"conditions": [{
            "type": "NetworkUnavailable",
            "status": "False",
            "reason": "RouteCreated",
            "message": "RouteController created a route",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        }]}})
    );
}

#[test]
fn a_status_change_moves_the_transition_time_and_needs_no_precondition() {
    let node = node_with_condition(Some(("True", "NoRouteCreated")));
    let patch = strategic(condition_patch(
        &node,
        &DesiredCondition::ROUTE_CREATED,
        &t1(),
    ));
    let c = &patch["status"]["conditions"][0];
    assert_eq!(c["status"], "False");
    assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
    assert!(patch.get("metadata").is_none(), "{patch}");
}

#[test]
fn another_reason_keeps_the_cached_transition_time_under_a_test_of_the_condition_read() {
    let mut node = node_with_condition(Some(("False", "CalicoIsUp")));
    node.metadata.uid = Some("uid-1".into());
    let patch = condition_patch(&node, &DesiredCondition::ROUTE_CREATED, &t1()).unwrap();
    assert_eq!(
        patch,
        serde_json::json!([
            {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
            {"op": "test", "path": "/status/conditions/1/type", "value": "NetworkUnavailable"},
            {"op": "test", "path": "/status/conditions/1/status", "value": "False"},
            {"op": "test", "path": "/status/conditions/1/lastTransitionTime", "value": "2020-01-01T00:00:00Z"},
            {"op": "replace", "path": "/status/conditions/1", "value": {
                "type": "NetworkUnavailable",
                "status": "False",
                "reason": "RouteCreated",
                "message": "RouteController created a route",
                "lastTransitionTime": "2020-01-01T00:00:00Z",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            }},
        ])
    );
    let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
    // A newer resourceVersion and another condition's heartbeat: still applies.
    let mut heartbeat = node.clone();
    heartbeat.metadata.resource_version = Some("43".into());
    heartbeat
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .last_heartbeat_time = Some(t1());
    let mut doc = serde_json::to_value(&heartbeat).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    assert_eq!(doc["status"]["conditions"][1]["reason"], "RouteCreated");
    assert_eq!(
        doc["status"]["conditions"][0]["lastHeartbeatTime"],
        "2026-01-01T00:00:00Z"
    );
    // The condition flipped and back (another transition time), or moved: fails.
    let mut flipped = node.clone();
    flipped
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[1]
        .last_transition_time = Some(t1());
    let mut moved = node.clone();
    moved
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()
        .remove(0);
    for changed in [flipped, moved] {
        let mut doc = serde_json::to_value(&changed).unwrap();
        assert!(json_patch::patch(&mut doc, &patch).is_err());
    }
}

#[test]
fn the_same_status_and_reason_is_not_patched() {
    let node = node_with_condition(Some(("False", "RouteCreated")));
    assert_eq!(
        condition_patch(&node, &DesiredCondition::ROUTE_CREATED, &t1()),
        None
    );
    let node = node_with_condition(Some(("True", "NoRouteCreated")));
    assert_eq!(
        condition_patch(&node, &DesiredCondition::NO_ROUTE_CREATED, &t1()),
        None
    );
}

#[test]
fn desired_condition_texts_match_go() {
    assert_eq!(desired_condition([]), DesiredCondition::NO_ROUTE_CREATED);
    assert_eq!(
        desired_condition([true, true]),
        DesiredCondition::ROUTE_CREATED
    );
    assert_eq!(
        desired_condition([true, false]),
        DesiredCondition::NO_ROUTE_CREATED
    );
    let c = DesiredCondition::ROUTE_CREATED;
    assert_eq!(
        (c.status, c.reason, c.message),
        ("False", "RouteCreated", "RouteController created a route")
    );
    let c = DesiredCondition::NO_ROUTE_CREATED;
    assert_eq!(
        (c.status, c.reason, c.message),
        (
            "True",
            "NoRouteCreated",
            "RouteController failed to create a route"
        )
    );
}

#[test]
fn many_nodes_plan_in_order() {
    let nodes: Vec<NodeInfo> = (0..300)
        .map(|i| node(&format!("n{i}"), &[&format!("10.244.{}.0/24", i % 256)]))
        .collect();
    let p = plan(&nodes, &[], &v4());
    assert_eq!(p.creates.len(), 300);
    assert_eq!(p.nodes.len(), 300);
}

#[test]
fn a_foreign_node_is_neither_routed_nor_unrouted() {
    // `other` is another cloud's Node: no route for its CIDR, no condition, and the route a
    // previous version created for it (and its blackhole) are left alone; `ours` as usual.
    let mut other = node("other", &["10.244.2.0/24"]);
    other.managed = false;
    let mut stale = route("other", "10.244.9.0/24");
    stale.blackhole = true;
    let routes = [route("other", "10.244.1.0/24"), stale];
    let p = plan(&[node("ours", &["10.244.0.0/24"]), other], &routes, &v4());
    assert_eq!(
        create_cidrs(&p),
        vec![("ours".to_owned(), "10.244.0.0/24".to_owned())]
    );
    assert!(p.deletes.is_empty(), "{:?}", delete_names(&p));
    assert!(!p.nodes.contains_key("other"));
}
