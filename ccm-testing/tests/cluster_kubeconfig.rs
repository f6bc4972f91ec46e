//! TestCluster through a kubeconfig (the `CCM_TEST_KUBECONFIG` path), pointed at an in-process
//! API server standing in for a real cluster: the client comes from the kubeconfig, and what a
//! test leaves behind is deleted when the TestCluster drops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_testing::TestCluster;
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::wait::wait_for_deletion;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::Api;

fn write_kubeconfig(server: &ApiServer) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "ccm-testing-kubeconfig-{}-{}.yaml",
        std::process::id(),
        server.url().rsplit(':').next().unwrap()
    ));
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: nobody\ncurrent-context: local\nusers:\n- name: nobody\n  user: {{}}\n",
        server.url()
    );
    std::fs::write(&path, yaml).unwrap();
    path
}

// Multi-threaded: the drop-cleanup blocks its thread while it talks to the server, which here
// runs in this test's runtime (a real cluster does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_cluster_is_real_and_cleans_up_on_drop() {
    let server = ApiServer::start().await;
    let path = write_kubeconfig(&server);
    let node_name;
    let svc_name;
    let ns;
    {
        let cluster = TestCluster::from_kubeconfig(path.to_str().unwrap()).await;
        assert!(cluster.is_real());
        assert!(cluster.api_server().is_none());
        node_name = cluster.unique_name("node");
        cluster.create(&kubelet_node(&node_name).build()).await;
        ns = cluster.namespace().await;
        svc_name = cluster.unique_name("svc");
        cluster
            .create(
                &load_balancer_service(&ns, &svc_name)
                    .finalizer("example.com/hold")
                    .build(),
            )
            .await;
        // Requests went through the kubeconfig's server.
        assert!(
            server
                .requests()
                .iter()
                .any(|r| r.verb == "create" && r.resource == "nodes")
        );
        // No cleanup() call: dropping the cluster must clean up.
    }
    let nodes: Api<Node> = Api::all(server.client());
    let svcs: Api<Service> = Api::namespaced(server.client(), &ns);
    let nss: Api<Namespace> = Api::all(server.client());
    let t = Duration::from_secs(20);
    wait_for_deletion(&nodes, &node_name, t).await.unwrap();
    wait_for_deletion(&svcs, &svc_name, t).await.unwrap();
    wait_for_deletion(&nss, &ns, t).await.unwrap();
    std::fs::remove_file(path).unwrap();
}

#[tokio::test]
#[should_panic(expected = "kubeconfig /nonexistent/kubeconfig")]
async fn a_missing_kubeconfig_fails_loudly() {
    TestCluster::from_kubeconfig("/nonexistent/kubeconfig").await;
}
