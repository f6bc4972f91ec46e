//! The route controller's table.

use ccm_controllers::controllers::route::{self, RouteConfig};
use ccm_core::{NodeAddress, Route};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::{CallArgs, FakeCloud};
use ccm_testing::harness::ControllerHarness;
use serde_json::json;
use std::time::Duration;

use super::{Calls, Write, call, cloud_calls, dump, skip_on_real_cluster, write, writes};

struct RouteCase {
    name: &'static str,
    /// The Nodes given: name and pod CIDRs (initialised, Ready).
    nodes: Vec<(&'static str, Vec<&'static str>)>,
    /// Routes the cloud holds before the controller starts.
    existing: Vec<Route>,
    /// The cloud calls expected.
    calls: Calls,
    /// The API writes expected, in order.
    writes: Vec<Write>,
}

#[tokio::test]
async fn route_table() {
    if skip_on_real_cluster("route_table") {
        return;
    }
    let cases = vec![
        RouteCase {
            name: "a route per pod CIDR, to the Node",
            nodes: vec![("n1", vec!["10.244.1.0/24"])],
            existing: vec![],
            // Go: the name hint is the Node's UID, the target its name and addresses.
            calls: Calls::Exactly(vec![
                call("list_routes", CallArgs::Cluster("kubernetes".into())),
                call(
                    "create_route",
                    CallArgs::Route {
                        cluster_name: "kubernetes".into(),
                        name_hint: Some("<uid>".into()),
                        route: Route {
                            target_node: "n1".into(),
                            target_node_addresses: vec![NodeAddress {
                                type_: "Hostname".into(),
                                address: "n1".into(),
                            }],
                            destination_cidr: "10.244.1.0/24".into(),
                            ..Default::default()
                        },
                    },
                ),
            ]),
            // Go's NetworkUnavailable=False, RouteCreated.
            writes: vec![write(
                "patch nodes/status n1",
                json!({"status": {"conditions": [{
                    "lastHeartbeatTime": "<time>",
                    "lastTransitionTime": "<time>",
                    "message": "RouteController created a route",
                    "reason": "RouteCreated",
                    "status": "False",
                    "type": "NetworkUnavailable",
                }]}}),
            )],
        },
        RouteCase {
            name: "a Node without pod CIDR gets no route",
            nodes: vec![("n1", vec![])],
            existing: vec![],
            calls: Calls::Exactly(vec![call(
                "list_routes",
                CallArgs::Cluster("kubernetes".into()),
            )]),
            writes: vec![],
        },
        RouteCase {
            name: "a stale route inside the cluster CIDR is deleted, one outside it kept",
            nodes: vec![],
            existing: vec![
                Route {
                    name: "stale".into(),
                    target_node: "gone".into(),
                    destination_cidr: "10.244.9.0/24".into(),
                    ..Default::default()
                },
                Route {
                    name: "foreign".into(),
                    target_node: "elsewhere".into(),
                    destination_cidr: "192.168.0.0/24".into(),
                    ..Default::default()
                },
            ],
            calls: Calls::Exactly(vec![
                call("list_routes", CallArgs::Cluster("kubernetes".into())),
                call(
                    "delete_route",
                    CallArgs::Route {
                        cluster_name: "kubernetes".into(),
                        name_hint: None,
                        route: Route {
                            name: "stale".into(),
                            target_node: "gone".into(),
                            destination_cidr: "10.244.9.0/24".into(),
                            ..Default::default()
                        },
                    },
                ),
            ]),
            writes: vec![],
        },
    ];
    let config = {
        let mut config = RouteConfig::default();
        config.cluster_cidrs = route::parse_cluster_cidrs("10.244.0.0/16").unwrap();
        config.reconciliation_period = Duration::from_secs(3600);
        config.debounce = Duration::from_millis(10);
        config
    };
    for case in cases {
        let cluster = TestCluster::start().await;
        let server = cluster.api_server().unwrap();
        let cloud = FakeCloud::default();
        for route in &case.existing {
            cloud.insert_route(route.clone());
        }
        let mut uids = Vec::new();
        for (name, cidrs) in &case.nodes {
            let node = kubelet_node(name)
                .without_uninitialized_taint()
                .provider_id(&format!("fake://{name}"))
                .pod_cidrs(cidrs)
                .build();
            uids.push(cluster.create(&node).await.metadata.uid.unwrap());
        }
        server.clear_requests();
        let run_config = config.clone();
        let harness = ControllerHarness::builder(&cluster, cloud.provider())
            .controller("route", move |ctx, _| route::run(ctx, run_config.clone()))
            .start()
            .await;
        harness.settled().await;
        harness.stop().await.unwrap();
        let placeholders: Vec<(&str, &str)> = uids.iter().map(|u| (u.as_str(), "<uid>")).collect();
        let mut calls = cloud_calls(&cloud);
        // The name hint is the Node's UID, as in Go.
        for (_, args) in &mut calls {
            if let CallArgs::Route {
                name_hint: Some(hint),
                ..
            } = args
                && uids.contains(hint)
            {
                *hint = "<uid>".into();
            }
        }
        let writes = writes(server, &placeholders);
        dump(case.name, &calls, &writes);
        case.calls.check(case.name, &calls);
        assert_eq!(writes, case.writes, "case {}: API writes", case.name);
        cluster.cleanup().await;
    }
}
