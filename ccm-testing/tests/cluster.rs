//! TestCluster, builders and waiters. These touch only the API, so they also pass against a
//! real cluster (`CCM_TEST_KUBECONFIG=/path/to/kubeconfig cargo test -p ccm-testing --test cluster`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_core::well_known::{FINALIZER_LOAD_BALANCER_CLEANUP, TAINT_UNINITIALIZED};
use ccm_testing::TestCluster;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::wait::{eventually, wait_for, wait_for_deletion};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn unique_names_are_dns_labels() {
    let c = TestCluster::start().await;
    let mut seen = BTreeSet::new();
    for prefix in ["node", "My_Service", "", "9lives", &"x".repeat(80)] {
        for _ in 0..3 {
            let n = c.unique_name(prefix);
            assert!(n.len() <= 63, "{n}");
            assert!(
                n.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-'),
                "{n}"
            );
            assert!(n.starts_with(|ch: char| ch.is_ascii_lowercase()), "{n}");
            assert!(!n.ends_with('-'), "{n}");
            assert!(seen.insert(n.clone()), "duplicate {n}");
        }
    }
    assert!(c.unique_name("node").starts_with("node-"));
}

#[tokio::test]
async fn create_wait_and_cleanup() {
    let c = TestCluster::start().await;
    assert_eq!(c.is_real(), c.api_server().is_none());
    let name = c.unique_name("node");
    let node = c
        .create(&kubelet_node(&name).provided_node_ip("10.1.2.3").build())
        .await;
    assert_eq!(node.name_any(), name);
    // The server kept what kubelet registers: taint, conditions, addresses.
    let taints = node.spec.as_ref().unwrap().taints.as_ref().unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t.key == TAINT_UNINITIALIZED && t.effect == "NoSchedule")
    );
    let nodes: Api<Node> = Api::all(c.client());
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"step": "two"}}})),
        )
        .await
        .unwrap();
    let got = wait_for(&nodes, &name, T, |n: &Node| {
        n.labels().get("step").map(String::as_str) == Some("two")
    })
    .await
    .unwrap();
    assert_eq!(got.uid(), node.uid());

    let ns = c.namespace().await;
    let svc_name = c.unique_name("svc");
    let svc = c
        .create(
            &load_balancer_service(&ns, &svc_name)
                .finalizer(FINALIZER_LOAD_BALANCER_CLEANUP)
                .build(),
        )
        .await;
    assert_eq!(svc.namespace().as_deref(), Some(ns.as_str()));
    assert_eq!(
        svc.spec.as_ref().unwrap().type_.as_deref(),
        Some("LoadBalancer")
    );

    c.cleanup().await;
    // Finalizers were removed first, so everything goes.
    let svcs: Api<Service> = Api::namespaced(c.client(), &ns);
    wait_for_deletion(&svcs, &svc_name, T).await.unwrap();
    wait_for_deletion(&nodes, &name, T).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(c.client());
    // A real cluster's namespace controller may take a while.
    wait_for_deletion(&namespaces, &ns, Duration::from_secs(120))
        .await
        .unwrap();
}

#[tokio::test]
async fn wait_failures_show_the_last_object() {
    let c = TestCluster::start().await;
    let name = c.unique_name("waiting");
    c.create(
        &kubelet_node(&name)
            .label("marker", "visible-in-error")
            .build(),
    )
    .await;
    let nodes: Api<Node> = Api::all(c.client());
    let err = wait_for(&nodes, &name, Duration::from_millis(300), |_| false)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&name), "{msg}");
    assert!(msg.contains("marker: visible-in-error"), "{msg}");
    assert!(msg.starts_with("timed out after"), "{msg}");

    let err = wait_for(
        &nodes,
        &c.unique_name("absent"),
        Duration::from_millis(200),
        |_| true,
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("last seen: nothing") && msg.contains("not found"),
        "{msg}"
    );

    let err = wait_for_deletion(&nodes, &name, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("to be deleted"), "{err}");

    assert!(!eventually(Duration::from_millis(100), || async { false }).await);
    c.cleanup().await;
    wait_for_deletion(&nodes, &name, T).await.unwrap();
}

#[tokio::test]
async fn in_process_hooks_are_reachable() {
    let c = TestCluster::start().await;
    let Some(server) = c.api_server() else {
        // Fault injection exists only in-process.
        return;
    };
    let name = c.unique_name("node");
    c.create(&kubelet_node(&name).build()).await;
    server.fail_next("get", "nodes", 1, 503, None);
    let nodes: Api<Node> = Api::all(c.client());
    // 503 is retried by kube's client.
    nodes.get(&name).await.unwrap();
    let statuses: Vec<u16> = server
        .requests()
        .iter()
        .filter(|r| r.verb == "get" && r.name.as_deref() == Some(name.as_str()))
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, vec![503, 200]);
    c.cleanup().await;
}
