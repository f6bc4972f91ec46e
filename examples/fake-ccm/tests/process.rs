//! Starts the `fake-ccm` binary as a separate process against the in-process API server and
//! watches it initialise a node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};

mod support;

#[tokio::test]
async fn the_binary_initialises_a_node() {
    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .create(&PostParams::default(), &kubelet_node("worker-1").build())
        .await
        .unwrap();

    let config = std::env::temp_dir().join(format!("fake-ccm-test-{}.yaml", std::process::id()));
    std::fs::write(&config, "zone: test-zone\n").unwrap();
    let mut ccm = support::fake_ccm(&server, &config, 0).spawn().unwrap();

    let node = wait_for(&nodes, "worker-1", Duration::from_secs(60), |n: &Node| {
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == ccm_core::well_known::TAINT_UNINITIALIZED)
            });
        !tainted
    })
    .await
    .unwrap();
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some("fake://worker-1")
    );
    assert_eq!(
        node.metadata
            .labels
            .as_ref()
            .unwrap()
            .get(ccm_core::well_known::LABEL_TOPOLOGY_ZONE)
            .map(String::as_str),
        Some("test-zone")
    );

    // SIGTERM: a graceful shutdown exits 0.
    let status = support::stop(&mut ccm).await;
    assert!(status.success(), "fake-ccm exited with {status}");
    let _ = std::fs::remove_file(config);
}
