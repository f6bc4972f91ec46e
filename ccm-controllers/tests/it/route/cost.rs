//! What the controller costs: cloud calls per period, and API calls per Node.

use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use kube::api::{Patch, PatchParams};
use std::time::{Duration, Instant};

use super::{RouteTest, WAIT, cidr, name, test_config};

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
