//! The route guard: a shadow's route controller that would create a Node's missing route and
//! delete a stale one sends neither call (FakeCloud records no `create_route` and no
//! `delete_route`, its routes stay as they are) and reports both as Route divergences, once
//! the pending grace (`--shadow-pending-grace`, routes are always pending first) has passed.

use std::collections::BTreeMap;

use ccm_controllers::InformerScope;
use ccm_core::Route;
use ccm_core::well_known::CONDITION_NETWORK_UNAVAILABLE;
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::Value;

use super::{
    ShadowRun, WAIT, assert_no_mutating_call, assert_nothing_persisted, log_mark, shadow_args_with,
};
use crate::support::node::RUN_LABEL;

/// The cluster CIDR of this test (no other test uses `10.131.0.0/16`).
const CLUSTER_CIDR: &str = "10.131.0.0/16";
/// The pod CIDR of the Node that keeps its route.
const KEPT_CIDR: &str = "10.131.1.0/24";
/// The pod CIDR of the Node whose route the cloud lost.
const LOST_CIDR: &str = "10.131.2.0/24";
/// The stale route's CIDR: inside the cluster CIDR, for a Node the cluster does not have.
const STALE_CIDR: &str = "10.131.9.0/24";

/// The routes of the cloud, by destination CIDR (the test's CIDRs only).
fn routes_by_cidr(cloud: &FakeCloud) -> BTreeMap<String, Route> {
    cloud
        .routes()
        .into_iter()
        .filter(|r| r.destination_cidr.starts_with("10.131."))
        .map(|r| (r.destination_cidr.clone(), r))
        .collect()
}

/// `NetworkUnavailable=False` with reason `RouteCreated`, as the route controller sets it.
fn route_created(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == CONDITION_NETWORK_UNAVAILABLE
                && c.status == "False"
                && c.reason.as_deref() == Some("RouteCreated")
        })
}

#[tokio::test]
async fn routes_to_add_and_to_delete_are_divergences_and_the_cloud_keeps_its_routes() {
    // The shadow's informers see the whole cluster (as in production): the cluster alone.
    let cluster = TestCluster::start_exclusive().await;
    let cloud = FakeCloud::default();
    let run = cluster.unique_name("shadow-routes");
    let kept = cluster.unique_name("shadow-kept");
    let lost = cluster.unique_name("shadow-lost");
    for (name, cidr) in [(&kept, KEPT_CIDR), (&lost, LOST_CIDR)] {
        cluster
            .create(
                &kubelet_node(name)
                    .without_uninitialized_taint()
                    .label(RUN_LABEL, &run)
                    .pod_cidrs(&[cidr])
                    .build(),
            )
            .await;
    }
    // The incumbent: the normal route controller creates both Nodes' routes and marks their
    // network available.
    let incumbent = ControllerHarness::builder(&cluster, cloud.provider())
        .scope(InformerScope {
            node_labels: Some(format!("{RUN_LABEL}={run}")),
            ..InformerScope::default()
        })
        .route()
        .flag(&format!("--cluster-cidr={CLUSTER_CIDR}"))
        .start()
        .await;
    let nodes: Api<Node> = Api::all(cluster.client());
    let reconciled = eventually(WAIT, || {
        let (cloud, nodes, kept, lost) = (&cloud, &nodes, &kept, &lost);
        async move {
            let routes = routes_by_cidr(cloud);
            let routed = routes
                .get(KEPT_CIDR)
                .is_some_and(|r| &r.target_node == kept)
                && routes
                    .get(LOST_CIDR)
                    .is_some_and(|r| &r.target_node == lost);
            let mut available = true;
            for n in [kept, lost] {
                available &= nodes.get(n).await.is_ok_and(|n| route_created(&n));
            }
            routed && available
        }
    })
    .await;
    assert!(
        reconciled,
        "the incumbent routed both Nodes: {:?}",
        cloud.routes()
    );
    incumbent.settled().await;
    incumbent.stop().await.unwrap();

    // The cloud moves on: the lost Node's route is gone, a stale route appears.
    let lost_route = routes_by_cidr(&cloud)
        .remove(LOST_CIDR)
        .expect("the lost Node's route");
    let provider = cloud.provider();
    provider
        .routes()
        .expect("FakeCloud has routes")
        .delete_route("kubernetes", &lost_route)
        .await
        .unwrap();
    cloud.insert_route(Route {
        name: "stale".into(),
        target_node: "gone-node".into(),
        destination_cidr: STALE_CIDR.into(),
        ..Route::default()
    });
    let before = routes_by_cidr(&cloud);
    assert_eq!(
        before.keys().map(String::as_str).collect::<Vec<_>>(),
        [KEPT_CIDR, STALE_CIDR]
    );
    cloud.reset_calls();
    let mark = log_mark(&cluster);

    let shadow = ShadowRun::start_with_args(
        &cloud,
        shadow_args_with(
            &cluster,
            "route",
            &[
                format!("--cluster-cidr={CLUSTER_CIDR}"),
                "--route-reconciliation-period=1s".to_owned(),
            ],
        ),
    );
    let own_routes = |report: &Value| -> Vec<Value> {
        report["divergences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| {
                d["kind"] == "Route"
                    && d["object"]
                        .as_str()
                        .is_some_and(|o| o.starts_with("10.131."))
            })
            .cloned()
            .collect()
    };
    let found = shadow
        .wait_for("the route to add and the route to delete", |report| {
            let own = own_routes(report);
            (own.len() >= 2).then_some(report.clone())
        })
        .await;
    let own = own_routes(&found);
    assert_eq!(own.len(), 2, "one route to add, one to delete: {found:#}");
    let by_object: BTreeMap<&str, &Value> = own
        .iter()
        .map(|d| (d["object"].as_str().unwrap_or_default(), d))
        .collect();
    // The lost Node's route: absent in the cloud, ours would create it.
    let add = by_object[LOST_CIDR];
    assert_eq!(add["controller"], "route-controller");
    assert_eq!(add["field"], "route");
    assert_eq!(add["incumbent"], Value::Null, "{add:#}");
    assert_eq!(add["ours"]["targetNode"], lost.as_str(), "{add:#}");
    assert_eq!(add["ours"]["destinationCIDR"], LOST_CIDR, "{add:#}");
    // The stale route: in the cloud, ours would delete it.
    let delete = by_object[STALE_CIDR];
    assert_eq!(delete["controller"], "route-controller");
    assert_eq!(delete["incumbent"]["targetNode"], "gone-node", "{delete:#}");
    assert_eq!(delete["incumbent"]["destinationCIDR"], STALE_CIDR);
    assert_eq!(delete["ours"], Value::Null, "{delete:#}");
    // The kept Node's route is not a divergence, nor is any of the test's Nodes.
    assert!(
        !found["divergences"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| d["object"] == KEPT_CIDR
                || d["object"] == kept.as_str()
                || d["object"] == lost.as_str()),
        "{found:#}"
    );
    let metrics = shadow.metrics().await;
    for op in ["create_route", "delete_route"] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!(
                "shadow_refused_cloud_calls_total{{operation=\"{op}\"}}"
            ))),
            "{op} refused: {metrics}"
        );
    }
    assert_eq!(shadow.stop().await, 0);

    // The guard sent nothing: FakeCloud saw the reads only, and its routes are unchanged.
    assert!(
        cloud.call_count("list_routes") >= 1,
        "the shadow read the routes"
    );
    assert_no_mutating_call(&cloud);
    assert_eq!(routes_by_cidr(&cloud), before);
    assert_nothing_persisted(&cluster, mark);
    cluster.cleanup().await;
}
