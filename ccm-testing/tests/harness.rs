//! Tests of the controller harness itself: start order, `settled()`, `stop()`.
//!
//! They run against the in-process API server, or against the real cluster of
//! `CCM_TEST_KUBECONFIG` (the informers then see only the test's own Nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_controllers::controllers::cloud_node::{self, CloudNodeConfig};
use ccm_controllers::{ControllerError, InformerScope};
use ccm_core::well_known::TAINT_UNINITIALIZED;
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::{wait_for_deletion, wait_for_node_addresses};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

const RUN_LABEL: &str = "ccm-test.example.com/run";
const TIMEOUT: Duration = Duration::from_secs(20);

/// A test's cluster and the scope that selects only its Nodes.
async fn setup() -> (TestCluster, String, InformerScope) {
    let cluster = TestCluster::start().await;
    let run = cluster.unique_name("run");
    let scope = InformerScope {
        node_labels: Some(format!("{RUN_LABEL}={run}")),
        ..InformerScope::default()
    };
    (cluster, run, scope)
}

fn initialized(node: &Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED));
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_ref());
    !tainted && provider_id.is_some()
}

#[tokio::test]
async fn settled_waits_for_slow_cloud_calls_and_the_writes_after_them() {
    let (cluster, run, scope) = setup().await;
    let fake = FakeCloud::builder()
        .operation_latency("instance_metadata", Duration::from_millis(400))
        .build();
    let mut names = Vec::new();
    for i in 0..3 {
        let name = cluster.unique_name(&format!("slow{i}"));
        cluster
            .create(&kubelet_node(&name).label(RUN_LABEL, &run).build())
            .await;
        names.push(name);
    }
    let harness = ControllerHarness::builder(&cluster, fake.provider())
        .cloud_node()
        .scope(scope)
        .start()
        .await;
    harness.settled().await;
    // No waiting from here on: settled() returned only after the slow calls and the patches.
    let nodes: Api<Node> = Api::all(cluster.client());
    for name in &names {
        let node = nodes.get(name).await.unwrap();
        assert!(
            initialized(&node),
            "{name} not initialised after settled(): {node:?}"
        );
    }
    assert!(fake.call_count("instance_metadata") >= 3);

    // A Node created later: settled() first waits until the informers have it.
    let late = cluster.unique_name("late");
    cluster
        .create(&kubelet_node(&late).label(RUN_LABEL, &run).build())
        .await;
    harness.settled().await;
    let node = nodes.get(&late).await.unwrap();
    assert!(
        initialized(&node),
        "{late} not initialised after settled(): {node:?}"
    );
    harness.stop().await.unwrap();

    // The cloud's addresses, set at initialisation (FakeCloud has no external IP by default).
    let addresses = wait_for_node_addresses(&nodes, &late, &["InternalIP", "Hostname"], TIMEOUT)
        .await
        .unwrap();
    assert_eq!(addresses.len(), 2, "{addresses:?}");
    let missing =
        wait_for_node_addresses(&nodes, &late, &["ExternalIP"], Duration::from_millis(200))
            .await
            .unwrap_err();
    assert!(
        missing.to_string().contains("InternalIP"),
        "shows the last Node: {missing}"
    );
    cluster.cleanup().await;
}

#[tokio::test]
async fn settled_times_out_while_a_cloud_call_hangs() {
    let (cluster, run, scope) = setup().await;
    let fake = FakeCloud::builder()
        .operation_latency("instance_metadata", Duration::from_secs(3600))
        .build();
    let name = cluster.unique_name("hang");
    cluster
        .create(&kubelet_node(&name).label(RUN_LABEL, &run).build())
        .await;
    let harness = ControllerHarness::builder(&cluster, fake.provider())
        .cloud_node()
        .scope(scope)
        .start()
        .await;
    let busy = harness
        .settled_within(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(busy.contains("cloud_calls: 1"), "{busy}");
    harness.crash().await;
    cluster.cleanup().await;
}

#[tokio::test]
async fn stop_ends_every_task_and_drops_the_provider() {
    let (cluster, run, scope) = setup().await;
    let fake = FakeCloud::default();
    let provider = fake.provider();
    let name = cluster.unique_name("stop");
    cluster
        .create(&kubelet_node(&name).label(RUN_LABEL, &run).build())
        .await;
    let harness = ControllerHarness::builder(&cluster, provider.clone())
        .cloud_node()
        .node_lifecycle()
        .service()
        .route()
        .scope(scope)
        .start()
        .await;
    harness.settled().await;
    assert!(Arc::strong_count(&provider) > 1);
    harness.stop().await.unwrap();
    // Every task that held the context (and with it the provider) has ended.
    assert_eq!(
        Arc::strong_count(&provider),
        1,
        "a task still holds the provider"
    );
    cluster.cleanup().await;
}

#[tokio::test]
async fn controllers_start_after_the_informers_synced_in_the_runtimes_order() {
    let (cluster, run, scope) = setup().await;
    let name = cluster.unique_name("synced");
    cluster
        .create(&kubelet_node(&name).label(RUN_LABEL, &run).build())
        .await;
    let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let record = |label: &'static str| {
        let seen = seen.clone();
        move |ctx: ccm_controllers::ControllerContext, _| {
            // No wait_for_sync here: the harness has waited already.
            seen.lock()
                .unwrap()
                .push((label.to_owned(), ctx.nodes.list().len()));
            async move {
                ctx.shutdown.cancelled().await;
                Ok::<(), ControllerError>(())
            }
        }
    };
    let harness = ControllerHarness::builder(&cluster, FakeCloud::default().provider())
        .controller("first-own", record("first-own"))
        // Replaces the built-in service controller: starts after the built-in ones.
        .controller("service-lb-controller", record("service-lb-controller"))
        .controller("last-own", record("last-own"))
        .cloud_node()
        .scope(scope)
        .start()
        .await;
    assert_eq!(
        harness.controllers(),
        [
            "cloud-node-controller",
            "first-own",
            "service-lb-controller",
            "last-own"
        ]
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            ("first-own".to_owned(), 1),
            ("service-lb-controller".to_owned(), 1),
            ("last-own".to_owned(), 1)
        ]
    );
    harness.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn stop_returns_the_error_of_a_controller_that_ended_early() {
    let (cluster, _run, scope) = setup().await;
    let harness = ControllerHarness::builder(&cluster, FakeCloud::default().provider())
        .controller(cloud_node::NAME, |ctx, _| {
            cloud_node::run(ctx, {
                let mut config = CloudNodeConfig::default();
                config.workers = 0;
                config
            })
        })
        .scope(scope)
        .start()
        .await;
    let err = harness.stop().await.unwrap_err();
    assert!(matches!(err, ControllerError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("--concurrent-node-syncs"), "{err}");
    cluster.cleanup().await;
}

#[tokio::test]
async fn set_node_ready_false_lets_the_lifecycle_controller_delete_a_gone_node() {
    let (cluster, run, scope) = setup().await;
    let name = cluster.unique_name("gone");
    let fake = FakeCloud::builder()
        .missing_node(&format!("^{name}$"))
        .build();
    cluster
        .create(
            &kubelet_node(&name)
                .without_uninitialized_taint()
                .provider_id(&format!("fake://{name}"))
                .label(RUN_LABEL, &run)
                .build(),
        )
        .await;
    let harness = ControllerHarness::builder(&cluster, fake.provider())
        .node_lifecycle()
        .scope(scope)
        .start()
        .await;
    harness.settled().await;
    let nodes: Api<Node> = Api::all(cluster.client());
    // Ready Nodes are never checked.
    assert!(nodes.get(&name).await.is_ok());
    assert_eq!(fake.call_count("instance_exists"), 0);
    harness.set_node_ready(&name, false).await;
    wait_for_deletion(&nodes, &name, TIMEOUT).await.unwrap();
    harness.stop().await.unwrap();
    cluster.cleanup().await;
}
