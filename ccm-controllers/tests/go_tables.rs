//! Go-style table tests: one table per controller, each case the objects given, the cloud's
//! chosen answers per Node (`FakeCloud`'s `.node(..)`), the cloud calls expected with their
//! arguments (`FakeCloud::call_log`) and the API writes expected with their bodies (the
//! in-process API server's request log), as in k8s.io/cloud-provider's controller tests. Each
//! case runs the real controller through `ControllerHarness` on its own in-process API server;
//! the log is cleared once the case's objects are created, so every write left in it is the
//! controller's (the harness's controllers share the test's client and send no per-controller
//! user agent, so `RequestFilter::user_agent_suffix` cannot pick them out).
//!
//! The request log exists only on the in-process server, so these tests skip when
//! `CCM_TEST_KUBECONFIG` names a real cluster.
// Printing is the point here: the skip message, and what a case saw in a failing test's output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Duration;

use ccm_controllers::controllers::node_lifecycle::{self, NodeLifecycleConfig};
use ccm_controllers::controllers::route::{self, RouteConfig};
use ccm_core::well_known::{
    FINALIZER_LOAD_BALANCER_CLEANUP, LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS,
    LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_SHUTDOWN,
    TAINT_UNINITIALIZED,
};
use ccm_core::{CloudProvider, NodeAddress, Route};
use ccm_testing::apiserver::{ApiServer, RequestFilter};
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::{CallArgs, FakeCloud, NodeAnswer};
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::eventually;
use ccm_testing::{KUBECONFIG_ENV, TestCluster};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};

/// True (after saying why) when the tests run against a real cluster, which has no request log.
fn skip_on_real_cluster(test: &str) -> bool {
    if std::env::var_os(KUBECONFIG_ENV).is_some() {
        println!("{test}: skipped, the request log exists only on the in-process API server");
        return true;
    }
    false
}

/// One API write: `verb resource_path name` and the body sent.
#[derive(Debug, PartialEq)]
struct Write {
    what: String,
    body: Value,
}

fn write(what: &str, body: Value) -> Write {
    Write {
        what: what.into(),
        body,
    }
}

/// The writes made since the log was last cleared, Events left out (they are written
/// asynchronously), each body with the JSON strings `placeholders` name (values that differ per
/// run: UIDs, resourceVersions) replaced by their placeholders, so a table can state them.
fn writes(server: &ApiServer, placeholders: &[(&str, &str)]) -> Vec<Write> {
    server
        .requests_matching(&RequestFilter::new().writes())
        .into_iter()
        .filter(|w| w.resource != "events")
        .map(|w| {
            let mut body = serde_json::to_string(&w.body.clone().unwrap_or(Value::Null)).unwrap();
            for (value, placeholder) in placeholders {
                body = body.replace(&format!("\"{value}\""), &format!("\"{placeholder}\""));
            }
            Write {
                what: format!(
                    "{} {} {}",
                    w.verb,
                    w.resource_path(),
                    w.name.as_deref().unwrap_or("")
                ),
                body: without_times(serde_json::from_str(&body).unwrap()),
            }
        })
        .collect()
}

/// `body` with every condition timestamp replaced by `<time>`.
fn without_times(mut body: Value) -> Value {
    match &mut body {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                *value = if key == "lastHeartbeatTime" || key == "lastTransitionTime" {
                    json!("<time>")
                } else {
                    without_times(value.take())
                };
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                *item = without_times(item.take());
            }
        }
        _ => {}
    }
    body
}

/// Every call the cloud received, in order, as `(operation, arguments)` (`initialize` left out).
fn cloud_calls(cloud: &FakeCloud) -> Vec<(String, CallArgs)> {
    cloud
        .call_log()
        .into_iter()
        .filter(|c| c.operation != "initialize")
        .map(|c| (c.operation, c.args))
        .collect()
}

/// The cloud calls a case expects.
#[derive(Debug)]
enum Calls {
    /// Exactly these, in this order.
    Exactly(Vec<(String, CallArgs)>),
    /// This sequence, repeated (a failing call retried with backoff, or a periodic pass): made
    /// at least this many times, nothing else made; how often depends on how long the
    /// controller ran.
    Repeated(Vec<(String, CallArgs)>, usize),
}

impl Calls {
    fn check(&self, case: &str, calls: &[(String, CallArgs)]) {
        match self {
            Calls::Exactly(expected) => assert_eq!(calls, expected, "case {case}: cloud calls"),
            Calls::Repeated(expected, at_least) => assert!(
                calls.len() >= expected.len() * at_least
                    && calls.len().is_multiple_of(expected.len())
                    && calls
                        .chunks(expected.len())
                        .all(|c| c == expected.as_slice()),
                "case {case}: expected {expected:?} repeated; got {calls:?}"
            ),
        }
    }
}

fn call(op: &str, args: CallArgs) -> (String, CallArgs) {
    (op.into(), args)
}

/// The arguments of an `InstancesV2` call for Node `name`.
fn node_args(name: &str, provider_id: Option<&str>) -> CallArgs {
    CallArgs::Node {
        name: name.into(),
        provider_id: provider_id.map(Into::into),
    }
}

/// Prints what a case saw, for the captured output of a failing case.
fn dump(case: &str, calls: &[(String, CallArgs)], writes: &[Write]) {
    println!("case {case}: cloud calls {calls:?}");
    for w in writes {
        println!("case {case}: {} {}", w.what, w.body);
    }
}

/// How long a case waits for a periodic controller's writes.
const SHORT: Duration = Duration::from_secs(20);

fn internal_ip(ip: &str) -> NodeAddress {
    NodeAddress {
        type_: "InternalIP".into(),
        address: ip.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// cloud-node

struct CloudNodeCase {
    name: &'static str,
    /// The cloud's answer for Node `n1` (kubelet-registered, carrying the uninitialized taint).
    answer: NodeAnswer,
    /// The cloud calls expected.
    calls: Calls,
    /// The API writes expected, in order.
    writes: Vec<Write>,
}

#[tokio::test]
async fn cloud_node_table() {
    if skip_on_real_cluster("cloud_node_table") {
        return;
    }
    let uninitialized =
        json!({"effect": "NoSchedule", "key": TAINT_UNINITIALIZED, "value": "true"});
    let not_ready = json!({"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready"});
    let cases = vec![
        CloudNodeCase {
            name: "provider ID, topology labels and addresses from the cloud",
            answer: NodeAnswer {
                provider_id: Some("fake://i-0001".into()),
                addresses: Some(vec![internal_ip("10.0.0.1")]),
                instance_type: Some("m5.large".into()),
                zone: Some("eu-1b".into()),
                region: Some("eu-1".into()),
                ..Default::default()
            },
            calls: Calls::Exactly(vec![call("instance_metadata", node_args("n1", None))]),
            writes: vec![
                // The cloud's addresses, the kubelet's Hostname kept.
                write(
                    "patch nodes/status n1",
                    json!({"metadata": {"uid": "<uid>"}, "status": {"addresses": [
                        {"address": "10.0.0.1", "type": "InternalIP"},
                        {"address": "n1", "type": "Hostname"},
                    ]}}),
                ),
                // Labels (GA and beta), provider ID and the taint removed in one patch,
                // guarded by `test` ops on what it read.
                write(
                    "patch nodes n1",
                    json!([
                        {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                        {"op": "test", "path": "/metadata/labels/beta.kubernetes.io~1instance-type", "value": null},
                        {"op": "test", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1region", "value": null},
                        {"op": "test", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1zone", "value": null},
                        {"op": "test", "path": "/metadata/labels/node.kubernetes.io~1instance-type", "value": null},
                        {"op": "test", "path": "/metadata/labels/topology.kubernetes.io~1region", "value": null},
                        {"op": "test", "path": "/metadata/labels/topology.kubernetes.io~1zone", "value": null},
                        {"op": "test", "path": "/spec/providerID", "value": null},
                        {"op": "test", "path": "/spec/taints", "value": [uninitialized, not_ready]},
                        {"op": "add", "path": "/metadata/labels/beta.kubernetes.io~1instance-type", "value": "m5.large"},
                        {"op": "add", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1region", "value": "eu-1"},
                        {"op": "add", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1zone", "value": "eu-1b"},
                        {"op": "add", "path": format!("/metadata/labels/{}", LABEL_INSTANCE_TYPE.replace('/', "~1")), "value": "m5.large"},
                        {"op": "add", "path": format!("/metadata/labels/{}", LABEL_TOPOLOGY_REGION.replace('/', "~1")), "value": "eu-1"},
                        {"op": "add", "path": format!("/metadata/labels/{}", LABEL_TOPOLOGY_ZONE.replace('/', "~1")), "value": "eu-1b"},
                        {"op": "add", "path": "/spec/providerID", "value": "fake://i-0001"},
                        {"op": "add", "path": "/spec/taints", "value": [not_ready]},
                    ]),
                ),
            ],
        },
        CloudNodeCase {
            name: "gone from the cloud: not initialised, taint kept",
            answer: NodeAnswer {
                exists: Some(false),
                ..Default::default()
            },
            // Go: the metadata lookup fails, the Node is requeued; nothing is written.
            calls: Calls::Repeated(vec![call("instance_metadata", node_args("n1", None))], 1),
            writes: vec![],
        },
        CloudNodeCase {
            name: "cloud lookup fails: not initialised, taint kept",
            answer: NodeAnswer {
                error: Some("instance API down".into()),
                ..Default::default()
            },
            // Go: the metadata lookup fails, the Node is requeued; nothing is written.
            calls: Calls::Repeated(vec![call("instance_metadata", node_args("n1", None))], 1),
            writes: vec![],
        },
    ];
    for case in cases {
        let cluster = TestCluster::start().await;
        let server = cluster.api_server().unwrap();
        let cloud = FakeCloud::builder().node("n1", case.answer.clone()).build();
        let uid = cluster
            .create(&kubelet_node("n1").build())
            .await
            .metadata
            .uid
            .unwrap();
        server.clear_requests();
        let harness = ControllerHarness::builder(&cluster, cloud.provider())
            .cloud_node()
            .start()
            .await;
        harness.settled().await;
        let (calls, writes) = (cloud_calls(&cloud), writes(server, &[(&uid, "<uid>")]));
        dump(case.name, &calls, &writes);
        case.calls.check(case.name, &calls);
        assert_eq!(writes, case.writes, "case {}: API writes", case.name);
        harness.stop().await.unwrap();
        cluster.cleanup().await;
    }
}

// ---------------------------------------------------------------------------------------------
// cloud-node-lifecycle

struct LifecycleCase {
    name: &'static str,
    /// The cloud's answer for Node `n1`: initialised (provider ID `fake://n1`) and NotReady.
    /// Node `n2` is Ready and gone from the cloud in every case: Go looks only at NotReady
    /// Nodes, so it is never asked about and never deleted.
    answer: NodeAnswer,
    /// The cloud calls expected (one monitor pass, repeated).
    calls: Calls,
    /// The API writes expected, in order.
    writes: Vec<Write>,
}

#[tokio::test]
async fn node_lifecycle_table() {
    if skip_on_real_cluster("node_lifecycle_table") {
        return;
    }
    let n1 = node_args("n1", Some("fake://n1"));
    let not_ready = json!({"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready"});
    let cases = vec![
        LifecycleCase {
            name: "exists and runs: nothing to do",
            answer: NodeAnswer::default(),
            calls: Calls::Repeated(
                vec![
                    call("instance_exists", n1.clone()),
                    call("instance_shutdown", n1.clone()),
                ],
                1,
            ),
            writes: vec![],
        },
        LifecycleCase {
            name: "shut down: the shutdown taint is added",
            answer: NodeAnswer {
                shutdown: Some(true),
                ..Default::default()
            },
            calls: Calls::Repeated(
                vec![
                    call("instance_exists", n1.clone()),
                    call("instance_shutdown", n1.clone()),
                ],
                1,
            ),
            // Go's ShutdownTaint, added once, the not-ready taint (admission's) kept.
            writes: vec![write(
                "patch nodes n1",
                json!([
                    {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                    {"op": "test", "path": "/spec/taints", "value": [not_ready]},
                    {"op": "add", "path": "/spec/taints", "value": [
                        not_ready,
                        {"effect": "NoSchedule", "key": TAINT_SHUTDOWN},
                    ]},
                ]),
            )],
        },
        LifecycleCase {
            name: "gone from the cloud: deleted once the grace period passed",
            answer: NodeAnswer {
                exists: Some(false),
                ..Default::default()
            },
            // Deleted only after two "gone" answers a grace period apart (Go deletes on the
            // first; DESIGN.md's deliberate difference), with a UID precondition.
            calls: Calls::Repeated(vec![call("instance_exists", n1.clone())], 2),
            writes: vec![write(
                "delete nodes n1",
                json!({"preconditions": {"uid": "<uid>"}}),
            )],
        },
    ];
    let config = NodeLifecycleConfig {
        monitor_period: Duration::from_millis(50),
        deletion_grace_period: Duration::from_millis(200),
        ..NodeLifecycleConfig::default()
    };
    for case in cases {
        let cluster = TestCluster::start().await;
        let server = cluster.api_server().unwrap();
        let cloud = FakeCloud::builder()
            .node("n1", case.answer.clone())
            .node(
                "n2",
                NodeAnswer {
                    exists: Some(false),
                    ..Default::default()
                },
            )
            .build();
        let initialised = |name: &str| {
            kubelet_node(name)
                .without_uninitialized_taint()
                .provider_id(&format!("fake://{name}"))
        };
        let uid = cluster
            .create(&initialised("n1").not_ready().build())
            .await
            .metadata
            .uid
            .unwrap();
        cluster.create(&initialised("n2").build()).await;
        server.clear_requests();
        let run_config = config.clone();
        let harness = ControllerHarness::builder(&cluster, cloud.provider())
            .controller("cloud-node-lifecycle", move |ctx, _| {
                node_lifecycle::run(ctx, run_config.clone())
            })
            .start()
            .await;
        // Periodic passes: run until the expected writes were made and a few passes went by
        // (or, once n1 is deleted, the passes stop asking about it).
        let expected_writes = case.writes.len();
        eventually(SHORT, || async {
            writes(server, &[]).len() >= expected_writes
                && (cloud.call_log().len() >= 8 || expected_writes > 0)
        })
        .await;
        harness.settled().await;
        harness.stop().await.unwrap();
        let (calls, writes) = (cloud_calls(&cloud), writes(server, &[(&uid, "<uid>")]));
        dump(case.name, &calls, &writes);
        case.calls.check(case.name, &calls);
        assert_eq!(writes, case.writes, "case {}: API writes", case.name);
        cluster.cleanup().await;
    }
}

// ---------------------------------------------------------------------------------------------
// service

struct ServiceCase {
    name: &'static str,
    /// The Service `default/web` given.
    service: Service,
    /// Whether the Service is deleted before the controller starts.
    deleted: bool,
    /// The cloud calls expected, in order.
    calls: Calls,
    /// The API writes expected, in order.
    writes: Vec<Write>,
}

#[tokio::test]
async fn service_table() {
    if skip_on_real_cluster("service_table") {
        return;
    }
    let lb_args = |hosts: &[&str]| CallArgs::LoadBalancer {
        cluster_name: "kubernetes".into(),
        service: "default/web".into(),
        hosts: Some(hosts.iter().map(|h| h.to_string()).collect()),
    };
    // The arguments of the load-balancer calls without hosts.
    let lb_call = || CallArgs::LoadBalancer {
        cluster_name: "kubernetes".into(),
        service: "default/web".into(),
        hosts: None,
    };
    let cases = vec![
        ServiceCase {
            name: "load balancer ensured with every Node but the excluded one",
            service: load_balancer_service("default", "web").build(),
            deleted: false,
            calls: Calls::Exactly(vec![call("ensure_load_balancer", lb_args(&["n1", "n2"]))]),
            // As Go's PatchService: the cleanup finalizer first, then the status, both through
            // the status subresource; the first IP of FakeCloud's range.
            writes: vec![
                write(
                    "patch services/status web",
                    // Guarded by what the decision read, never the resourceVersion.
                    json!([
                        {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                        {"op": "test", "path": "/metadata/deletionTimestamp", "value": null},
                        {"op": "test", "path": "/spec/type", "value": "LoadBalancer"},
                        {"op": "test", "path": "/spec/loadBalancerClass", "value": null},
                        {"op": "test", "path": "/metadata/finalizers", "value": null},
                        {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER_LOAD_BALANCER_CLEANUP]},
                    ]),
                ),
                write(
                    "patch services/status web",
                    json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]}}}),
                ),
            ],
        },
        ServiceCase {
            name: "deleted Service whose load balancer exists: load balancer deleted, finalizer removed",
            service: load_balancer_service("default", "web")
                .finalizer(FINALIZER_LOAD_BALANCER_CLEANUP)
                .build(),
            deleted: true,
            // Go: GetLoadBalancer, and EnsureLoadBalancerDeleted only when it exists.
            calls: Calls::Exactly(vec![
                call("get_load_balancer", lb_call()),
                call("ensure_load_balancer_deleted", lb_call()),
            ]),
            writes: vec![write(
                "patch services/status web",
                json!([
                    {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                    {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER_LOAD_BALANCER_CLEANUP},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                ]),
            )],
        },
        ServiceCase {
            name: "ClusterIP Service: no load balancer",
            service: load_balancer_service("default", "web")
                .type_("ClusterIP")
                .build(),
            deleted: false,
            calls: Calls::Exactly(vec![]),
            writes: vec![],
        },
        ServiceCase {
            name: "another load-balancer class: left to its controller",
            service: load_balancer_service("default", "web")
                .load_balancer_class("example.com/other")
                .build(),
            deleted: false,
            calls: Calls::Exactly(vec![]),
            writes: vec![],
        },
    ];
    for case in cases {
        let cluster = TestCluster::start().await;
        let server = cluster.api_server().unwrap();
        let cloud = FakeCloud::default();
        let initialised = |name: &str| {
            kubelet_node(name)
                .without_uninitialized_taint()
                .provider_id(&format!("fake://{name}"))
        };
        cluster.create(&initialised("n1").build()).await;
        cluster.create(&initialised("n2").build()).await;
        cluster
            .create(
                &initialised("n3")
                    .label(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, "")
                    .build(),
            )
            .await;
        let created = cluster.create(&case.service).await;
        let uid = created.metadata.uid.clone().unwrap();
        if case.deleted {
            // The load balancer made before the Service was deleted.
            let lb = cloud.load_balancer().unwrap();
            lb.ensure_load_balancer("kubernetes", &created, &[])
                .await
                .unwrap();
            cloud.reset_calls();
            let services: Api<Service> = Api::namespaced(cluster.client(), "default");
            services
                .delete("web", &DeleteParams::default())
                .await
                .unwrap();
        }
        server.clear_requests();
        let harness = ControllerHarness::builder(&cluster, cloud.provider())
            .service()
            .start()
            .await;
        harness.settled().await;
        harness.stop().await.unwrap();
        let (calls, writes) = (cloud_calls(&cloud), writes(server, &[(&uid, "<uid>")]));
        dump(case.name, &calls, &writes);
        case.calls.check(case.name, &calls);
        assert_eq!(writes, case.writes, "case {}: API writes", case.name);
        cluster.cleanup().await;
    }
}

// ---------------------------------------------------------------------------------------------
// route

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
    let config = RouteConfig {
        cluster_cidrs: route::parse_cluster_cidrs("10.244.0.0/16").unwrap(),
        // Only the start-up reconcile and the ones Node changes trigger.
        reconciliation_period: Duration::from_secs(3600),
        debounce: Duration::from_millis(10),
        ..RouteConfig::default()
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
