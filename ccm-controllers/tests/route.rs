//! Route controller tests: the real controller against TestCluster (the in-process API server,
//! or the real cluster named by `CCM_TEST_KUBECONFIG`) and FakeCloud.
//!
//! Every test labels its Nodes with a value unique to the test and runs the controller with a
//! Node informer restricted to that label, so on a real cluster the controller never sees (and
//! never writes the `NetworkUnavailable` condition of) Nodes it did not create. Each test also
//! uses its own cluster CIDR.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_controllers::Backoff;
use ccm_controllers::ControllerError;
use ccm_controllers::InformerScope;
use ccm_controllers::controllers::route::{self, RouteConfig};
use ccm_core::{CloudProvider, Route};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::{FakeCloud, FakeCloudConfig, Fault};
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::{eventually, wait_for};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};

const WAIT: Duration = Duration::from_secs(20);
const LABEL: &str = "route-test.ccm-rs.io/run";

/// A route controller running in the controller harness, and what a test needs around it.
struct RouteTest {
    cluster: TestCluster,
    fake: FakeCloud,
    controllers: ControllerHarness,
    /// The value of [`LABEL`] on this test's Nodes.
    run_id: String,
}

/// A /16 unique enough per test: tests pick distinct second octets.
fn cidr(octet: u8) -> String {
    format!("10.{octet}.0.0/16")
}

/// The retry backoff of both route queues in these tests.
const TEST_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(100),
    max: Duration::from_millis(500),
};

fn test_config(cluster_cidrs: &str) -> RouteConfig {
    RouteConfig {
        cluster_cidrs: route::parse_cluster_cidrs(cluster_cidrs).unwrap(),
        // Long: tests show the watch path works without the periodic reconcile, unless they
        // set a shorter period themselves.
        reconciliation_period: Duration::from_secs(3600),
        debounce: Duration::from_millis(100),
        create_retry_backoff: TEST_BACKOFF,
        reconcile_retry_backoff: TEST_BACKOFF,
        ..RouteConfig::default()
    }
}

impl RouteTest {
    /// Starts the route controller with `config`; its Node informer sees only this test's
    /// Nodes (labelled with `run_id`).
    async fn start(fake: FakeCloud, config: RouteConfig) -> RouteTest {
        let cluster = TestCluster::start().await;
        let run_id = cluster.unique_name("run");
        let scope = InformerScope {
            node_labels: Some(format!("{LABEL}={run_id}")),
            ..InformerScope::default()
        };
        let controllers = ControllerHarness::builder(&cluster, fake.provider())
            .controller(route::NAME, move |ctx, _| route::run(ctx, config.clone()))
            .scope(scope)
            // The backoff of `test_config` (both queues).
            .retry_backoff(TEST_BACKOFF)
            .start()
            .await;
        RouteTest {
            cluster,
            fake,
            controllers,
            run_id,
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    /// Creates a Node labelled for this test with these pod CIDRs; returns its name.
    async fn node(&self, prefix: &str, pod_cidrs: &[&str]) -> Node {
        let name = self.cluster.unique_name(prefix);
        let mut b = kubelet_node(&name).label(LABEL, &self.run_id);
        if !pod_cidrs.is_empty() {
            b = b.pod_cidrs(pod_cidrs);
        }
        self.cluster.create(&b.build()).await
    }

    fn routes_of(&self, node: &str) -> Vec<Route> {
        let mut r: Vec<Route> = self
            .fake
            .routes()
            .into_iter()
            .filter(|r| r.target_node == node)
            .collect();
        r.sort_by(|a, b| a.destination_cidr.cmp(&b.destination_cidr));
        r
    }

    async fn wait_routes(&self, node: &str, cidrs: &[&str]) {
        let ok = eventually(WAIT, || async {
            let got: Vec<String> = self
                .routes_of(node)
                .into_iter()
                .map(|r| r.destination_cidr)
                .collect();
            got == cidrs
        })
        .await;
        assert!(
            ok,
            "routes of {node}: want {cidrs:?}, have {:?}",
            self.fake.routes()
        );
    }

    async fn wait_condition(&self, node: &str, status: &str, reason: &str) -> Node {
        wait_for(&self.nodes(), node, WAIT, |n: &Node| {
            network_unavailable(n)
                .is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason))
        })
        .await
        .unwrap()
    }

    /// Waits until the controller's own Node informer shows the condition: unlike
    /// [`RouteTest::wait_condition`] the test sends no request, so the API server's request log
    /// for the Node holds only the controller's.
    async fn wait_condition_cached(&self, node: &str, status: &str, reason: &str) {
        let set = eventually(WAIT, || async {
            self.controllers
                .context()
                .nodes
                .get(node)
                .and_then(|n| network_unavailable(&n))
                .is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason))
        })
        .await;
        assert!(
            set,
            "NetworkUnavailable={status} ({reason}) never reached the informer"
        );
    }

    /// Waits until the controller made no cloud call for a while (a reconcile queued behind
    /// the one a test waited for may still run). A wait, not an assertion.
    async fn settle(&self) {
        let mut last = self.fake.call_counts();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.fake.call_counts();
            if now == last {
                return;
            }
            last = now;
        }
    }

    async fn stop(self) {
        self.controllers.stop().await.unwrap();
        self.cluster.cleanup().await;
    }
}

fn network_unavailable(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .cloned()
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap()
}

async fn failed_create_events(client: Client, node: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client, "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                && e.reason.as_deref() == Some("FailedToCreateRoute")
        })
        .collect()
}

#[tokio::test]
async fn new_node_gets_its_route_and_route_created_condition() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(101))).await;
    let node = h.node("single", &["10.101.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.101.1.0/24"]).await;

    let route = &h.routes_of(&n)[0];
    let addresses = node.status.as_ref().unwrap().addresses.clone().unwrap();
    assert_eq!(route.target_node_addresses, addresses);
    // FakeCloud names a route `<cluster>-<name hint>`: the hint is the Node's UID.
    assert_eq!(
        route.name,
        format!("kubernetes-{}", node.metadata.uid.as_deref().unwrap())
    );

    let updated = h.wait_condition(&n, "False", "RouteCreated").await;
    let c = network_unavailable(&updated).unwrap();
    assert_eq!(
        c.message.as_deref(),
        Some("RouteController created a route")
    );
    assert!(c.last_transition_time.is_some());
    assert!(c.last_heartbeat_time.is_some());
    // The kubelet's Ready condition is untouched.
    let conditions = updated.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{conditions:?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn dual_stack_node_gets_one_route_per_family() {
    let h = RouteTest::start(
        FakeCloud::default(),
        test_config(&format!("{},fd00:102::/56", cidr(102))),
    )
    .await;
    let node = h
        .node("dual", &["10.102.1.0/24", "fd00:102:0:1::/64"])
        .await;
    let n = name(&node);
    h.wait_routes(&n, &["10.102.1.0/24", "fd00:102:0:1::/64"])
        .await;
    h.wait_condition(&n, "False", "RouteCreated").await;
    assert_eq!(h.fake.call_count("create_route"), 2);
    h.stop().await;
}

#[tokio::test]
async fn node_joining_gets_its_route_without_waiting_for_the_periodic_reconcile() {
    // The period is an hour: only the watch can produce the route within the wait.
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(103))).await;
    // Let the initial reconcile (empty) happen first, so the Node arrives afterwards.
    assert!(eventually(WAIT, || async { h.fake.call_count("list_routes") >= 1 }).await);
    let node = h.node("joiner", &["10.103.7.0/24"]).await;
    h.wait_routes(&name(&node), &["10.103.7.0/24"]).await;
    h.wait_condition(&name(&node), "False", "RouteCreated")
        .await;
    h.stop().await;
}

#[tokio::test]
async fn routes_of_removed_nodes_are_deleted() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(104))).await;
    let keep = h.node("keep", &["10.104.1.0/24"]).await;
    let gone = h.node("gone", &["10.104.2.0/24"]).await;
    h.wait_routes(&name(&keep), &["10.104.1.0/24"]).await;
    h.wait_routes(&name(&gone), &["10.104.2.0/24"]).await;

    h.nodes()
        .delete(&name(&gone), &Default::default())
        .await
        .unwrap();
    h.wait_routes(&name(&gone), &[]).await;
    assert_eq!(h.routes_of(&name(&keep)).len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn stale_and_blackhole_routes_are_removed_and_outside_routes_left_alone() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(105))).await;
    let node = h.node("bh", &["10.105.1.0/24"]).await;
    let n = name(&node);
    let seeded = |name: &str, target: &str, cidr: &str, blackhole: bool| Route {
        name: name.into(),
        target_node: target.into(),
        destination_cidr: cidr.into(),
        blackhole,
        ..Route::default()
    };
    // Seeded while the controller runs: the periodic reconcile is an hour away, so trigger a
    // reconcile with a relevant Node change (another Node joining) afterwards.
    fake.insert_route(seeded("stale", "no-such-node", "10.105.9.0/24", false));
    fake.insert_route(seeded("untargeted", "", "10.105.10.0/24", false));
    fake.insert_route(seeded("outside", "no-such-node", "172.31.5.0/24", false));
    fake.insert_route(seeded("outside-bh", "", "172.31.6.0/24", true));
    h.wait_routes(&n, &["10.105.1.0/24"]).await;
    // Turn the node's route into a blackhole (its instance was replaced).
    let mut bh = h.routes_of(&n).remove(0);
    h.fake.reset_calls();
    bh.blackhole = true;
    // Replace the route: FakeCloud keeps what insert_route gives it.
    h.fake.insert_route(bh.clone());
    let _trigger = h.node("trigger", &["10.105.2.0/24"]).await;

    let ok = eventually(WAIT, || async {
        let routes = fake.routes();
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        !names.contains(&"stale")
            && !names.contains(&"untargeted")
            && names.contains(&"outside")
            && names.contains(&"outside-bh")
            && routes.iter().any(|r| {
                r.target_node == n && !r.blackhole && r.destination_cidr == "10.105.1.0/24"
            })
            && !routes.iter().any(|r| r.target_node == n && r.blackhole)
    })
    .await;
    assert!(ok, "routes: {:?}", fake.routes());
    h.wait_condition(&n, "False", "RouteCreated").await;
    h.stop().await;
}

#[tokio::test]
async fn node_with_routes_but_no_pod_cidrs_gets_no_route_created_and_loses_them() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(106))).await;
    // Node "plain" has neither pod CIDRs nor routes: it gets no condition.
    let plain = h.node("plain", &[]).await;
    let orphan = h.node("orphan", &[]).await;
    fake.insert_route(Route {
        name: "old".into(),
        target_node: name(&orphan),
        destination_cidr: "10.106.3.0/24".into(),
        ..Route::default()
    });
    // A relevant change makes the controller look again.
    let other = h.node("other", &["10.106.4.0/24"]).await;
    h.wait_routes(&name(&other), &["10.106.4.0/24"]).await;
    let n = h
        .wait_condition(&name(&orphan), "True", "NoRouteCreated")
        .await;
    assert_eq!(
        network_unavailable(&n).unwrap().message.as_deref(),
        Some("RouteController failed to create a route")
    );
    h.wait_routes(&name(&orphan), &[]).await;
    let plain = h.nodes().get(&name(&plain)).await.unwrap();
    assert!(network_unavailable(&plain).is_none());
    h.stop().await;
}

async fn set_addresses(h: &RouteTest, node: &str, addresses: Vec<NodeAddress>) {
    let patch = serde_json::json!({ "status": { "addresses": addresses } });
    h.nodes()
        .patch_status(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn address_change_recreates_the_route_when_the_provider_tracks_addresses() {
    let fake = FakeCloud::new(FakeCloudConfig {
        track_node_addresses: true,
        ..FakeCloudConfig::default()
    });
    let h = RouteTest::start(fake.clone(), test_config(&cidr(107))).await;
    let node = h.node("moving", &["10.107.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.107.1.0/24"]).await;
    h.settle().await;
    fake.reset_calls();

    let new_addresses = vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: "192.0.2.77".into(),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: n.clone(),
        },
    ];
    set_addresses(&h, &n, new_addresses.clone()).await;
    let ok = eventually(WAIT, || async {
        h.routes_of(&n)
            .first()
            .is_some_and(|r| r.target_node_addresses == new_addresses)
    })
    .await;
    assert!(ok, "routes: {:?}", fake.routes());
    assert_eq!(h.routes_of(&n).len(), 1);
    assert!(fake.call_count("delete_route") >= 1);
    assert!(fake.call_count("create_route") >= 1);
    h.wait_condition(&n, "False", "RouteCreated").await;
    h.stop().await;
}

#[tokio::test]
async fn address_change_is_ignored_when_the_provider_does_not_track_addresses() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(108))).await;
    let node = h.node("still", &["10.108.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.108.1.0/24"]).await;
    h.wait_condition(&n, "False", "RouteCreated").await;
    h.settle().await;
    fake.reset_calls();
    set_addresses(
        &h,
        &n,
        vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "192.0.2.78".into(),
        }],
    )
    .await;
    // The change triggers a reconcile (one list), which changes nothing.
    assert!(eventually(WAIT, || async { fake.call_count("list_routes") >= 1 }).await);
    // Let the reconcile finish its work, if any.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.call_count("delete_route"), 0);
    assert_eq!(fake.call_count("create_route"), 0);
    h.stop().await;
}

#[tokio::test]
async fn failed_create_emits_an_event_sets_no_route_created_and_is_retried_until_it_succeeds() {
    let fake = FakeCloud::default();
    fake.inject("create_route", Fault::FailNext(1_000));
    let h = RouteTest::start(fake.clone(), test_config(&cidr(109))).await;
    let node = h.node("flaky", &["10.109.1.0/24"]).await;
    let n = name(&node);

    let n2 = h.wait_condition(&n, "True", "NoRouteCreated").await;
    assert_eq!(
        network_unavailable(&n2).unwrap().message.as_deref(),
        Some("RouteController failed to create a route")
    );
    let client = h.cluster.client();
    assert!(
        eventually(WAIT, || async {
            !failed_create_events(client.clone(), &n).await.is_empty()
        })
        .await
    );
    let events = failed_create_events(client.clone(), &n).await;
    let e = &events[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    let note = e.note.clone().unwrap_or_default();
    let uid = node.metadata.uid.clone().unwrap();
    assert!(
        note.starts_with(&format!(
            "Could not create route {uid} 10.109.1.0/24 for node {n} after "
        )),
        "{note}"
    );
    // Retried per route with backoff, without the (hour-long) periodic reconcile: each
    // reconcile (one list_routes each: the initial one and the Node's arrival) tries the
    // create once, so creates beyond the lists are per-route retries.
    assert!(
        eventually(WAIT, || async {
            fake.call_count("create_route") >= fake.call_count("list_routes") + 2
        })
        .await,
        "{:?}",
        fake.call_counts()
    );
    assert!(
        fake.call_count("list_routes") <= 2,
        "{:?}",
        fake.call_counts()
    );
    assert!(h.routes_of(&n).is_empty());

    // The cloud recovers: the next retry creates the route and the condition flips.
    fake.clear_faults();
    h.wait_routes(&n, &["10.109.1.0/24"]).await;
    let n3 = h.wait_condition(&n, "False", "RouteCreated").await;
    let before = network_unavailable(&n2).unwrap().last_transition_time;
    let after = network_unavailable(&n3).unwrap().last_transition_time;
    assert!(after >= before);
    h.stop().await;
}

#[tokio::test]
async fn a_failed_create_does_not_fail_the_rest_of_the_reconcile() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(110))).await;
    assert!(eventually(WAIT, || async { fake.call_count("list_routes") >= 1 }).await);
    // One of the next two creates fails.
    fake.inject("create_route", Fault::FailNext(1));
    let a = h.node("a", &["10.110.1.0/24"]).await;
    let b = h.node("b", &["10.110.2.0/24"]).await;
    h.wait_routes(&name(&a), &["10.110.1.0/24"]).await;
    h.wait_routes(&name(&b), &["10.110.2.0/24"]).await;
    h.wait_condition(&name(&a), "False", "RouteCreated").await;
    h.wait_condition(&name(&b), "False", "RouteCreated").await;
    h.stop().await;
}

#[tokio::test]
async fn retry_from_the_provider_is_honoured_without_a_failure_event() {
    let fake = FakeCloud::default();
    fake.inject(
        "create_route",
        Fault::Retry {
            after: Duration::from_millis(300),
            count: 1,
        },
    );
    let h = RouteTest::start(fake.clone(), test_config(&cidr(111))).await;
    let node = h.node("patient", &["10.111.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.111.1.0/24"]).await;
    h.wait_condition(&n, "False", "RouteCreated").await;
    assert!(
        failed_create_events(h.cluster.client(), &n)
            .await
            .is_empty()
    );
    h.stop().await;
}

#[tokio::test]
async fn steady_state_costs_one_list_routes_per_period_and_ignores_unrelated_node_changes() {
    let fake = FakeCloud::default();
    let mut config = test_config(&cidr(112));
    config.reconciliation_period = Duration::from_millis(400);
    let h = RouteTest::start(fake.clone(), config).await;
    let node = h.node("steady", &["10.112.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.112.1.0/24"]).await;
    h.wait_condition(&n, "False", "RouteCreated").await;

    fake.reset_calls();
    let started = Instant::now();
    // Unrelated Node changes (labels) must not cause reconciles.
    for i in 0..5 {
        let patch = serde_json::json!({ "metadata": { "labels": { "steady": i.to_string() } } });
        h.nodes()
            .patch(&n, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
    // Count over a few periods (a wait, not a timing assertion)...
    assert!(eventually(WAIT, || async { fake.call_count("list_routes") >= 3 }).await);
    let lists = fake.call_count("list_routes");
    let elapsed = started.elapsed();
    // ...and check there were no more lists than periods: one per period, plus the tick that
    // may have been due when counting started, plus a reconcile the Node's creation may still
    // have had queued. (An upper bound only: a loaded machine may run fewer.)
    let max = (elapsed.as_millis() / 400) as usize + 2;
    assert!(
        lists <= max,
        "{lists} list_routes in {elapsed:?}, at most {max} expected"
    );
    let others: Vec<(String, usize)> = fake
        .call_counts()
        .into_iter()
        .filter(|(op, n)| op != "list_routes" && *n > 0)
        .collect();
    assert!(
        others.is_empty(),
        "only list_routes in steady state: {others:?}"
    );

    let metrics = h.controllers.metrics();
    assert!(
        metrics.contains("route_controller_route_sync_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("route_controller_route_sync_duration_seconds_bucket"),
        "{metrics}"
    );
    h.stop().await;
}

#[tokio::test]
async fn with_an_hour_period_an_idle_cluster_costs_no_cloud_calls() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(113))).await;
    let node = h.node("idle", &["10.113.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.113.1.0/24"]).await;
    h.wait_condition(&n, "False", "RouteCreated").await;
    h.settle().await;
    fake.reset_calls();
    for i in 0..5 {
        let patch = serde_json::json!({ "metadata": { "labels": { "idle": i.to_string() } } });
        h.nodes()
            .patch(&n, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        fake.call_counts().values().sum::<usize>(),
        0,
        "{:?}",
        fake.call_counts()
    );
    h.stop().await;
}

#[tokio::test]
async fn startup_fails_without_a_cluster_cidr_naming_both_flags() {
    let cluster = TestCluster::start().await;
    let fake = FakeCloud::default();
    let err = ControllerHarness::builder(&cluster, fake.provider())
        .controller(route::NAME, |ctx, _| {
            route::run(ctx, RouteConfig::default())
        })
        .start()
        .await
        .stop()
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ControllerError::Config { .. }), "{err:?}");
    assert!(msg.contains("--cluster-cidr"), "{msg}");
    assert!(msg.contains("--configure-cloud-routes=false"), "{msg}");
    // No cloud call but the provider's `initialize`, which the runtime makes before any
    // controller starts.
    let calls: usize = fake
        .call_counts()
        .iter()
        .filter(|(op, _)| op.as_str() != "initialize")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(calls, 0, "{:?}", fake.call_counts());

    // An invalid value (two IPv4 CIDRs) is refused too, by the parser the runtime uses.
    let e = route::parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16").unwrap_err();
    assert!(e.contains("one IPv4 and one IPv6"), "{e}");
    cluster.cleanup().await;
}

#[tokio::test]
async fn startup_fails_when_the_provider_has_no_routes() {
    struct NoRoutes;
    impl CloudProvider for NoRoutes {
        fn provider_name(&self) -> &str {
            "no-routes"
        }
    }
    let cluster = TestCluster::start().await;
    let err = ControllerHarness::builder(&cluster, Arc::new(NoRoutes))
        .controller(route::NAME, |ctx, _| {
            route::run(ctx, test_config("10.114.0.0/16"))
        })
        .start()
        .await
        .stop()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ControllerError::MissingCapability {
                capability: "routes",
                ..
            }
        ),
        "{err:?}"
    );
    cluster.cleanup().await;
}

/// A kubelet Node labelled for this test, with pod CIDRs and a pre-set `NetworkUnavailable`
/// condition (as a CNI or an earlier controller left it), both dated `T0`.
async fn node_with_condition(
    h: &RouteTest,
    prefix: &str,
    cidr: &str,
    status: &str,
    reason: &str,
) -> Node {
    let name = h.cluster.unique_name(prefix);
    let mut node = kubelet_node(&name)
        .label(LABEL, &h.run_id)
        .pod_cidrs(&[cidr])
        .build();
    node.status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some("set before the test".into()),
            last_transition_time: Some(t0()),
            last_heartbeat_time: Some(t0()),
        });
    let created = h.cluster.create(&node).await;
    let c = network_unavailable(&created).expect("the API server keeps a Node's status on create");
    assert_eq!(c.reason.as_deref(), Some(reason));
    created
}

fn t0() -> Time {
    Time("2020-01-01T00:00:00Z".parse().unwrap())
}

#[tokio::test]
async fn another_reason_is_overwritten_keeping_the_transition_time_when_the_status_holds() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(115))).await;
    let node = node_with_condition(&h, "cni", "10.115.1.0/24", "False", "CalicoIsUp").await;
    let n = name(&node);
    let updated = h.wait_condition(&n, "False", "RouteCreated").await;
    let c = network_unavailable(&updated).unwrap();
    assert_eq!(
        c.message.as_deref(),
        Some("RouteController created a route")
    );
    assert_eq!(c.last_transition_time, Some(t0()), "status did not change");
    assert!(c.last_heartbeat_time > Some(t0()));
    h.stop().await;
}

#[tokio::test]
async fn a_status_change_moves_the_transition_time() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(116))).await;
    let node = node_with_condition(&h, "flip", "10.116.1.0/24", "True", "NoRouteCreated").await;
    let n = name(&node);
    let updated = h.wait_condition(&n, "False", "RouteCreated").await;
    let c = network_unavailable(&updated).unwrap();
    assert!(c.last_transition_time > Some(t0()));
    assert!(c.last_heartbeat_time > Some(t0()));
    h.stop().await;
}

#[tokio::test]
async fn an_unchanged_condition_is_not_rewritten() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(117))).await;
    let node = node_with_condition(&h, "same", "10.117.1.0/24", "False", "RouteCreated").await;
    let n = name(&node);
    h.wait_routes(&n, &["10.117.1.0/24"]).await;
    h.settle().await;
    let now = h.nodes().get(&n).await.unwrap();
    let c = network_unavailable(&now).unwrap();
    assert_eq!(c.last_heartbeat_time, Some(t0()), "{c:?}");
    assert_eq!(c.message.as_deref(), Some("set before the test"));
    if let Some(server) = h.cluster.api_server() {
        let status_patches = server
            .requests()
            .into_iter()
            .filter(|r| r.verb == "patch" && r.name.as_deref() == Some(n.as_str()))
            .count();
        assert_eq!(status_patches, 0);
    }
    h.stop().await;
}

#[tokio::test]
async fn a_conflicting_condition_write_is_retried_on_a_fresh_read() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(118))).await;
    let Some(server) = h.cluster.api_server() else {
        // Needs fault injection: the in-process API server only.
        h.stop().await;
        return;
    };
    server.fail_next("patch", "nodes/status", 1, 409, None);
    let node = h.node("conflict", &["10.118.1.0/24"]).await;
    let n = name(&node);
    h.wait_condition_cached(&n, "False", "RouteCreated").await;
    let patches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| {
            r.verb == "patch"
                && r.name.as_deref() == Some(n.as_str())
                && r.subresource.as_deref() == Some("status")
        })
        .collect();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(patches[0].status, 409);
    assert_eq!(patches[1].status, 200);
    assert_eq!(
        patches[1].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    // The first attempt was decided on the informer's copy; only the conflict made the
    // controller read the Node.
    let gets = server
        .requests()
        .into_iter()
        .filter(|r| {
            r.verb == "get" && r.resource == "nodes" && r.name.as_deref() == Some(n.as_str())
        })
        .count();
    assert_eq!(gets, 1);
    h.stop().await;
}

#[tokio::test]
async fn a_nodes_route_and_condition_cost_one_status_patch_and_no_read() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(121))).await;
    let Some(server) = h.cluster.api_server() else {
        // Needs the request log: the in-process API server only.
        h.stop().await;
        return;
    };
    let node = h.node("cheap", &["10.121.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.121.1.0/24"]).await;
    h.wait_condition_cached(&n, "False", "RouteCreated").await;
    h.settle().await;
    let requests: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.name.as_deref() == Some(n.as_str()))
        .collect();
    let count = |verb: &str, sub: Option<&str>| {
        requests
            .iter()
            .filter(|r| r.verb == verb && r.subresource.as_deref() == sub)
            .count()
    };
    assert_eq!(count("patch", Some("status")), 1, "{requests:#?}");
    assert_eq!(count("get", None), 0, "{requests:#?}");
    assert_eq!(
        requests.iter().filter(|r| r.verb != "create").count(),
        1,
        "nothing but the test's create and the status patch: {requests:#?}"
    );
    let patch = requests.iter().find(|r| r.verb == "patch").unwrap();
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(patch.status, 200);
    h.stop().await;
}

#[tokio::test]
async fn a_failed_or_retried_list_requeues_the_reconcile_without_waiting_for_the_period() {
    for fault in [
        Fault::FailNext(1),
        Fault::Retry {
            after: Duration::from_millis(300),
            count: 1,
        },
    ] {
        let fake = FakeCloud::default();
        let h = RouteTest::start(fake.clone(), test_config(&cidr(119))).await;
        assert!(eventually(WAIT, || async { fake.call_count("list_routes") >= 1 }).await);
        h.settle().await;
        fake.reset_calls();
        // The reconcile the Node's arrival triggers fails to list; only its requeue (the
        // period is an hour) can create the route.
        fake.inject("list_routes", fault.clone());
        let node = h.node("relist", &["10.119.1.0/24"]).await;
        h.wait_routes(&name(&node), &["10.119.1.0/24"]).await;
        assert!(
            fake.call_count("list_routes") >= 2,
            "{fault:?}: {:?}",
            fake.call_counts()
        );
        h.stop().await;
    }
}

#[tokio::test]
async fn a_failed_delete_is_retried_with_backoff() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(120))).await;
    let node = h.node("undeletable", &["10.120.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.120.1.0/24"]).await;
    h.settle().await;
    fake.inject("delete_route", Fault::FailNext(2));
    h.nodes().delete(&n, &Default::default()).await.unwrap();
    h.wait_routes(&n, &[]).await;
    assert_eq!(
        fake.call_count("delete_route"),
        3,
        "{:?}",
        fake.call_counts()
    );
    h.stop().await;
}
