//! The route controller as the runtime starts it from Go-style flags (`--cluster-cidr`,
//! `--route-reconciliation-period`, `--configure-cloud-routes`), against the in-process API
//! server and a FakeCloud registered as a provider.
//!
//! Runs only against the in-process API server: the runtime's controller sees every Node of
//! the cluster, and on a real cluster it would write conditions on Nodes the test does not own.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ccm_controllers::Builder;
use ccm_core::{BoxError, CloudProvider};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::{eventually, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

static FAKE: LazyLock<FakeCloud> = LazyLock::new(FakeCloud::default);

fn build(_config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    Ok(FAKE.provider())
}

ccm_core::register_cloud_provider!("route-runtime-test", build);

const WAIT: Duration = Duration::from_secs(20);

fn args(server: &str, extra: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = [
        "cloud-controller-manager",
        "--cloud-provider=route-runtime-test",
        "--secure-port=0",
        "--leader-elect=false",
        "--controllers=route",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    all.push(format!("--master={server}"));
    all.extend(extra.iter().map(|s| (*s).to_owned()));
    all
}

#[tokio::test]
async fn flags_start_the_route_controller_and_a_missing_cidr_stops_startup() {
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return;
    };
    let url = server.url();

    // No --cluster-cidr: the process exits non-zero before any controller runs.
    let code = tokio::time::timeout(
        WAIT,
        Builder::new()
            .args(args(&url, &[]))
            .shutdown_signal(std::future::pending())
            .run_async(),
    )
    .await
    .expect("startup fails at once");
    assert_ne!(code, 0);
    assert_eq!(FAKE.call_count("list_routes"), 0);

    // --configure-cloud-routes=false: no --cluster-cidr needed, no route calls.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let off = tokio::spawn(
        Builder::new()
            .args(args(&url, &["--configure-cloud-routes=false"]))
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_tx.send(()).unwrap();
    assert_eq!(tokio::time::timeout(WAIT, off).await.unwrap().unwrap(), 0);
    assert_eq!(FAKE.call_count("list_routes"), 0);

    // With a CIDR and an hour-long period: a Node joining gets its route from the watch.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(
        Builder::new()
            .args(args(
                &url,
                &[
                    "--cluster-cidr=10.121.0.0/16,fd00:121::/56",
                    "--route-reconciliation-period=1h0m0s",
                ],
            ))
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    assert!(eventually(WAIT, || async { FAKE.call_count("list_routes") >= 1 }).await);
    let name = cluster.unique_name("rt");
    cluster
        .create(
            &kubelet_node(&name)
                .pod_cidrs(&["10.121.3.0/24", "fd00:121:0:3::/64"])
                .build(),
        )
        .await;
    let routed = eventually(WAIT, || async {
        FAKE.routes()
            .iter()
            .filter(|r| r.target_node == name)
            .count()
            == 2
    })
    .await;
    assert!(routed, "{:?}", FAKE.routes());
    let nodes: Api<Node> = Api::all(cluster.client());
    wait_for(&nodes, &name, WAIT, |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "NetworkUnavailable"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("RouteCreated")
                })
            })
    })
    .await
    .unwrap();
    stop_tx.send(()).unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, running).await.unwrap().unwrap(),
        0
    );
    cluster.cleanup().await;
}
