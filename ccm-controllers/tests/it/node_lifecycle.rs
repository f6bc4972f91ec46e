//! Controller tests of the cloud-node-lifecycle controller: the real controller against the
//! in-process API server (real HTTP, real watches) with FakeCloud, or against the real cluster
//! named by `CCM_TEST_KUBECONFIG`.
//!
//! On a real cluster the controller must never look at anybody else's Nodes (it deletes
//! Nodes!), so there the shared informer is restricted to this test's Nodes with a label
//! selector; on the in-process server the test owns the whole server and uses
//! `ControllerContext::standalone` as is.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_controllers::ControllerError;
use ccm_controllers::controllers::node_lifecycle::NodeLifecycleConfig;
use ccm_core::well_known::TAINT_SHUTDOWN;
use ccm_core::{
    CloudProvider, CloudResult, InstanceMetadata, InstancesV2, Node, NodeView, async_trait,
};
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::{Capabilities, FakeCloud, Fault};
use ccm_testing::wait::{eventually, wait_for, wait_for_deletion};

use crate::support::node::{RUN_LABEL, TIMEOUT, Test, has_taint};
use crate::support::service::metric_value;

fn has_shutdown_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == TAINT_SHUTDOWN && t.effect == "NoSchedule")
        })
}

fn fast(grace: Duration) -> NodeLifecycleConfig {
    {
        let mut config = NodeLifecycleConfig::default();
        config.monitor_period = Duration::from_millis(200);
        config.deletion_grace_period = grace;
        config
    }
}

async fn calls_reach(fake: &FakeCloud, op: &str, n: usize) {
    assert!(
        eventually(TIMEOUT, || async { fake.call_count(op) >= n }).await,
        "{op} was called {} times, expected at least {n}",
        fake.call_count(op)
    );
}

/// A provider wrapping FakeCloud that counts how many `instance_exists` calls run at once.
struct Probe {
    fake: FakeCloud,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

#[async_trait]
impl CloudProvider for Probe {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for Probe {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let r = self
            .fake
            .instances_v2()
            .unwrap()
            .instance_exists(node)
            .await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        r
    }
    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        self.fake
            .instances_v2()
            .unwrap()
            .instance_shutdown(node)
            .await
    }
    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        self.fake
            .instances_v2()
            .unwrap()
            .instance_metadata(node)
            .await
    }
}

// ---------------------------------------------------------------------------------------------
// Deletion

#[tokio::test]
async fn gone_instance_is_deleted_after_two_answers_a_grace_period_apart() {
    let t = Test::start().await;
    let name = t.name("gone");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), fast(Duration::from_secs(1)))
        .await;

    wait_for_deletion(&t.nodes, &name, TIMEOUT).await.unwrap();
    // At least two "gone" answers: the first is only recorded.
    assert!(fake.call_count("instance_exists") >= 2);
    assert_eq!(fake.call_count("instance_shutdown"), 0);
    let events = t.events_including(&name, "DeletingNode").await;
    assert!(
        events.contains(&(
            "Normal".into(),
            "DeletingNode".into(),
            format!("Deleting node {name} because it does not exist in the cloud provider")
        )),
        "{events:?}"
    );
    let text = running.metrics();
    assert!(
        text.contains("node_lifecycle_controller_checks_total{outcome=\"gone_first\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("node_lifecycle_controller_checks_total{outcome=\"deleted\"} 1"),
        "{text}"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn one_gone_answer_never_deletes() {
    let t = Test::start().await;
    let name = t.name("once");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), fast(Duration::from_secs(3600)))
        .await;

    // Many checks, every one "gone", but never two a grace period apart.
    calls_reach(&fake, "instance_exists", 5).await;
    assert!(
        t.nodes.get(&name).await.is_ok(),
        "deleted on an unconfirmed answer"
    );
    assert!(!t.events(&name).await.iter().any(|e| e.1 == "DeletingNode"));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn zero_grace_period_deletes_on_the_first_answer_like_go() {
    let t = Test::start().await;
    let name = t.name("go");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), {
            let mut config = NodeLifecycleConfig::default();
            config.monitor_period = Duration::from_secs(3600);
            config.deletion_grace_period = Duration::ZERO;
            config
        })
        .await;
    // One pass only (the next is an hour away): one answer deletes.
    wait_for_deletion(&t.nodes, &name, TIMEOUT).await.unwrap();
    assert_eq!(fake.call_count("instance_exists"), 1);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn errors_never_delete_not_even_instance_not_found() {
    let t = Test::start().await;
    let name = t.name("err");
    let fake = FakeCloud::builder().missing_node(&name).build();
    fake.inject("instance_exists", Fault::InstanceNotFound);
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    // Even with Go's delete-on-first-answer.
    let running = t.run_lifecycle(fake.provider(), fast(Duration::ZERO)).await;

    calls_reach(&fake, "instance_exists", 5).await;
    assert!(t.nodes.get(&name).await.is_ok(), "deleted on an error");
    assert_eq!(fake.call_count("instance_shutdown"), 0);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn errors_do_not_confirm_a_first_gone_answer() {
    let t = Test::start().await;
    let name = t.name("gap");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), fast(Duration::from_secs(1)))
        .await;

    // First "gone" answer, then only errors for well over the grace period.
    calls_reach(&fake, "instance_exists", 1).await;
    fake.inject("instance_exists", Fault::FailNext(usize::MAX));
    let after_first = fake.call_count("instance_exists");
    calls_reach(&fake, "instance_exists", after_first + 10).await;
    assert!(
        t.nodes.get(&name).await.is_ok(),
        "an error confirmed the deletion"
    );

    // The next "gone" answer, more than the grace period after the first, confirms it.
    fake.clear_faults();
    wait_for_deletion(&t.nodes, &name, TIMEOUT).await.unwrap();
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn instance_that_comes_back_resets_the_first_gone_answer() {
    let t = Test::start().await;
    let name = t.name("back");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), fast(Duration::from_secs(2)))
        .await;

    calls_reach(&fake, "instance_exists", 1).await;
    // The instance exists again, for longer than the grace period: the earlier "gone" is
    // forgotten (12 checks at 200 ms).
    fake.set_missing_nodes(&[]);
    calls_reach(&fake, "instance_shutdown", 12).await;
    fake.set_missing_nodes(&[&name]);
    let gone_again = fake.call_count("instance_exists");
    // Without the reset, the next "gone" would delete at once (the first is over 2 s old);
    // with it, a full grace period must pass again.
    calls_reach(&fake, "instance_exists", gone_again + 2).await;
    assert!(t.nodes.get(&name).await.is_ok());
    wait_for_deletion(&t.nodes, &name, TIMEOUT).await.unwrap();
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// A Node that is Ready again between two "gone" answers starts its grace period over: the
/// monitor's sweep over settled (Ready) Nodes forgets the first answer, and counts each of them
/// as `ready`.
#[tokio::test]
async fn a_node_ready_again_forgets_its_first_gone_answer() {
    let t = Test::start().await;
    let name = t.name("flap");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), fast(Duration::from_secs(3)))
        .await;
    calls_reach(&fake, "instance_exists", 1).await;

    // Ready for longer than the grace period (the informer sees only this test's Nodes, so
    // every `ready` count is this Node's: 20 passes at 200 ms).
    t.set_ready(&name, true).await;
    let ready = r#"node_lifecycle_controller_checks_total{outcome="ready"}"#;
    let counted = eventually(TIMEOUT, || {
        let passes = metric_value(&running.metrics(), ready);
        async move { passes >= 20.0 }
    })
    .await;
    assert!(
        counted,
        "the Ready Node was not counted `ready` in 20 passes"
    );
    let asked_while_ready = fake.call_count("instance_exists");

    // NotReady again and still gone: without the reset the next answer would delete at once
    // (the first is over 3 s old); with it, a full grace period must pass again.
    t.set_ready(&name, false).await;
    calls_reach(&fake, "instance_exists", asked_while_ready + 2).await;
    assert!(
        t.nodes.get(&name).await.is_ok(),
        "deleted without a new grace period"
    );
    wait_for_deletion(&t.nodes, &name, TIMEOUT).await.unwrap();
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn ready_nodes_are_never_checked_against_the_cloud() {
    let t = Test::start().await;
    let name = t.name("ready");
    let fake = FakeCloud::builder().missing_node(&name).build();
    let other = t.name("notready");
    t.create(&t.initialized_node(&name).build()).await;
    t.create(&t.initialized_node(&other).not_ready().build())
        .await;
    let running = t.run_lifecycle(fake.provider(), fast(Duration::ZERO)).await;

    // The NotReady node has been checked several times meanwhile.
    calls_reach(&fake, "instance_exists", 3).await;
    assert!(t.nodes.get(&name).await.is_ok());
    assert!(
        fake.call_log().iter().all(|c| c.subject != name),
        "a Ready node cost a cloud call"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn legacy_provider_node_without_provider_id_is_deleted_when_not_found() {
    let t = Test::start().await;
    let name = t.name("v1gone");
    let fake = FakeCloud::builder()
        .instances_v2(false)
        .legacy_instances(true)
        .missing_node(&name)
        .build();
    let mut node = kubelet_node(&name)
        .without_uninitialized_taint()
        .label(RUN_LABEL, &t.run)
        .not_ready()
        .build();
    node.spec.as_mut().unwrap().provider_id = None;
    t.create(&node).await;
    let running = t
        .run_lifecycle(fake.provider(), fast(Duration::from_millis(500)))
        .await;

    // instance_id answers InstanceNotFound: "gone" (Go's rule for the provider-ID lookup).
    wait_for_deletion(&t.nodes, &name, TIMEOUT).await.unwrap();
    assert!(fake.call_count("instance_id") >= 2);
    assert_eq!(fake.call_count("instance_exists_by_provider_id"), 0);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn failed_delete_emits_deleting_node_failed_and_is_retried() {
    let t = Test::start().await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection in the API server
    };
    let name = t.name("delfail");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    server.fail_next("delete", "nodes", 1, 500, None);
    let running = t.run_lifecycle(fake.provider(), fast(Duration::ZERO)).await;

    wait_for_deletion(&t.nodes, &name, TIMEOUT).await.unwrap();
    let events = t.events_including(&name, "DeletingNodeFailed").await;
    let failed = events
        .iter()
        .find(|e| e.1 == "DeletingNodeFailed")
        .unwrap_or_else(|| panic!("no DeletingNodeFailed: {events:?}"));
    assert_eq!(failed.0, "Warning");
    assert!(failed.2.contains(&name), "{}", failed.2);
    // The delete carried a UID precondition.
    let deletes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.verb == "delete" && r.name.as_deref() == Some(name.as_str()))
        .map(|r| r.status)
        .collect();
    assert_eq!(deletes, vec![500, 200]);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// Shutdown taint

#[tokio::test]
async fn shutdown_taint_is_added_and_removed_when_ready_again() {
    let t = Test::start().await;
    let name = t.name("stopped");
    let fake = FakeCloud::builder().shutdown_node(&name).build();
    t.create(
        &t.initialized_node(&name)
            .not_ready()
            .taint("example.com/keep", "", "NoSchedule")
            .build(),
    )
    .await;
    let running = t.run_lifecycle(fake.provider(), fast(Duration::ZERO)).await;

    let node = wait_for(&t.nodes, &name, TIMEOUT, has_shutdown_taint)
        .await
        .unwrap();
    assert!(has_taint(&node, "example.com/keep"));
    // A shut-down instance exists: never deleted.
    calls_reach(&fake, "instance_shutdown", 3).await;
    assert!(t.nodes.get(&name).await.is_ok());

    // kubelet is back: Ready again, taint removed, other taint kept, no more cloud calls.
    t.set_ready(&name, true).await;
    let node = wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| !has_shutdown_taint(n))
        .await
        .unwrap();
    assert!(has_taint(&node, "example.com/keep"));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn running_instance_gets_no_shutdown_taint() {
    let t = Test::start().await;
    let name = t.name("running");
    let fake = FakeCloud::default();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t.run_lifecycle(fake.provider(), fast(Duration::ZERO)).await;
    calls_reach(&fake, "instance_shutdown", 3).await;
    let node = t.nodes.get(&name).await.unwrap();
    assert!(!has_shutdown_taint(&node));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn shutdown_not_implemented_means_not_shut_down() {
    let t = Test::start().await;
    let name = t.name("noimpl");
    let fake = FakeCloud::builder().shutdown_node(&name).build();
    fake.inject("instance_shutdown", Fault::NotImplemented);
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t.run_lifecycle(fake.provider(), fast(Duration::ZERO)).await;
    calls_reach(&fake, "instance_shutdown", 3).await;
    let node = t.nodes.get(&name).await.unwrap();
    assert!(!has_shutdown_taint(&node));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// Concurrency and configuration

#[tokio::test]
async fn checks_run_in_parallel_with_a_bound() {
    let t = Test::start().await;
    let probe = Arc::new(Probe {
        fake: FakeCloud::builder()
            .operation_latency("instance_exists", Duration::from_millis(300))
            .build(),
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(0),
    });
    for i in 0..6 {
        let name = t.name(&format!("par{i}"));
        t.create(&t.initialized_node(&name).not_ready().build())
            .await;
    }
    let running = t
        .run_lifecycle(probe.clone(), {
            let mut config = fast(Duration::ZERO);
            config.workers = 3;
            config
        })
        .await;
    calls_reach(&probe.fake, "instance_exists", 12).await;
    let max = probe.max_in_flight.load(Ordering::SeqCst);
    assert_eq!(max, 3, "max concurrent exists checks");
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn invalid_configuration_is_refused() {
    let t = Test::start().await;
    let err = t
        .lifecycle_refusal(FakeCloud::default().provider(), {
            let mut config = NodeLifecycleConfig::default();
            config.workers = 0;
            config
        })
        .await;
    assert!(matches!(err, ControllerError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("workers"), "{err}");
    let err = t
        .lifecycle_refusal(FakeCloud::default().provider(), {
            let mut config = NodeLifecycleConfig::default();
            config.monitor_period = Duration::ZERO;
            config
        })
        .await;
    assert!(err.to_string().contains("--node-monitor-period"), "{err}");

    let none = FakeCloud::builder()
        .capabilities(Capabilities {
            instances_v2: false,
            instances: false,
            ..Capabilities::default()
        })
        .build();
    let err = t
        .lifecycle_refusal(none.provider(), NodeLifecycleConfig::default())
        .await;
    assert!(
        matches!(
            err,
            ControllerError::MissingCapability {
                controller: "cloud-node-lifecycle-controller",
                ..
            }
        ),
        "{err:?}"
    );
    let d = NodeLifecycleConfig::default();
    assert_eq!(d.monitor_period, Duration::from_secs(5));
    assert_eq!(d.deletion_grace_period, Duration::from_secs(30));
}
