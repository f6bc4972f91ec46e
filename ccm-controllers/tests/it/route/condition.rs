//! The `NetworkUnavailable` condition: written as Go writes it (transition time kept while the
//! status holds), not rewritten unchanged, retried on a conflict.

use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{LABEL, RouteTest, cidr, name, network_unavailable, test_config};

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
