//! Nodes kept true to the cloud, beyond Go and each off by default: labels brought in step at
//! the status refresh (`--reconcile-cloud-labels`), the `CloudProviderInstanceNotFound`
//! condition and the mark-only deletion mode, and the out-of-service taint on a Node shut
//! down for longer than a delay. The real controllers against the in-process API server, or
//! the cluster named by `CCM_TEST_KUBECONFIG` (the informers restricted to this test's
//! Nodes).

use std::time::Duration;

use ccm_controllers::controllers::cloud_node::CloudNodeConfig;
use ccm_controllers::controllers::node_lifecycle::{GoneNodeAction, NodeLifecycleConfig};
use ccm_core::Node;
use ccm_core::well_known::{
    CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND, LABEL_FAILURE_DOMAIN_BETA_ZONE,
    LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_TOPOLOGY_ZONE, TAINT_OUT_OF_SERVICE,
    TAINT_SHUTDOWN,
};
use ccm_testing::fake_cloud::{FakeCloud, Fault, NodeAnswer};
use ccm_testing::wait::{eventually, wait_for};

use crate::support::node::{TIMEOUT, Test, label, taints};
use crate::support::service::metric_value;

async fn calls_reach(fake: &FakeCloud, op: &str, n: usize) {
    assert!(
        eventually(TIMEOUT, || async { fake.call_count(op) >= n }).await,
        "{op} was called {} times, expected at least {n}",
        fake.call_count(op)
    );
}

// ---------------------------------------------------------------------------------------------
// Labels kept in step

fn refreshing(reconcile: bool) -> CloudNodeConfig {
    let mut config = CloudNodeConfig::default();
    config.status_update_frequency = Duration::from_millis(300);
    config.reconcile_cloud_labels = reconcile;
    config
}

/// An initialised Node labelled as the cloud described it at initialisation.
fn labelled(t: &Test, name: &str, zone: &str, instance_type: &str) -> Node {
    t.initialized_node(name)
        .label(LABEL_TOPOLOGY_ZONE, zone)
        .label(LABEL_FAILURE_DOMAIN_BETA_ZONE, zone)
        .label(LABEL_INSTANCE_TYPE, instance_type)
        .label(LABEL_INSTANCE_TYPE_BETA, instance_type)
        .build()
}

fn moved(zone: &str, instance_type: &str) -> NodeAnswer {
    NodeAnswer {
        zone: Some(zone.into()),
        instance_type: Some(instance_type.into()),
        additional_labels: Some([("acme.example.com/rack".to_owned(), "r9".to_owned())].into()),
        ..NodeAnswer::default()
    }
}

async fn labels_follow_a_resize(batch: bool) {
    let t = Test::start().await;
    let name = t.name("resized");
    let fake = FakeCloud::builder().instances_batch(batch).build();
    fake.set_node(&name, moved("zone-b", "large"));
    t.create(&labelled(&t, &name, "zone-a", "small")).await;
    let running = t.run_cloud_node(fake.provider(), refreshing(true)).await;

    let node = wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        label(n, LABEL_TOPOLOGY_ZONE) == Some("zone-b")
            && label(n, LABEL_INSTANCE_TYPE_BETA) == Some("large")
    })
    .await
    .unwrap();
    assert_eq!(label(&node, LABEL_FAILURE_DOMAIN_BETA_ZONE), Some("zone-b"));
    assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some("large"));
    assert_eq!(label(&node, "acme.example.com/rack"), Some("r9"));
    let text = running.metrics();
    assert_eq!(
        metric_value(
            &text,
            "node_controller_cloud_label_updates_total{label=\"topology.kubernetes.io/zone\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric_value(
            &text,
            "node_controller_cloud_label_updates_total{label=\"additional\"}"
        ),
        1.0,
        "{text}"
    );
    // No extra cloud call: the refresh's own lookup carried the labels.
    let op = if batch {
        "instance_metadata"
    } else {
        "describe_instances"
    };
    assert_eq!(fake.call_count(op), 0, "{op} called");
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn labels_follow_the_cloud_at_the_refresh() {
    labels_follow_a_resize(false).await;
}

#[tokio::test]
async fn labels_follow_the_cloud_at_a_batched_refresh() {
    labels_follow_a_resize(true).await;
}

#[tokio::test]
async fn labels_stay_as_initialised_without_the_flag_like_go() {
    let t = Test::start().await;
    let name = t.name("stale");
    let fake = FakeCloud::default();
    fake.set_node(&name, moved("zone-b", "large"));
    t.create(&labelled(&t, &name, "zone-a", "small")).await;
    let running = t.run_cloud_node(fake.provider(), refreshing(false)).await;

    calls_reach(&fake, "instance_metadata", 4).await;
    let node = t.nodes.get(&name).await.unwrap();
    assert_eq!(label(&node, LABEL_TOPOLOGY_ZONE), Some("zone-a"));
    assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some("small"));
    assert_eq!(label(&node, "acme.example.com/rack"), None);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn labels_in_step_cost_no_write() {
    let t = Test::start().await;
    let name = t.name("steady");
    let fake = FakeCloud::default();
    fake.set_node(&name, moved("zone-b", "large"));
    t.create(&labelled(&t, &name, "zone-b", "large")).await;
    let running = t.run_cloud_node(fake.provider(), refreshing(true)).await;

    // The first pass writes the cloud's addresses and the missing additional label; after
    // that the Node is in step and passes write nothing.
    let settled = wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        label(n, "acme.example.com/rack") == Some("r9")
            && n.status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .is_some_and(|a| !a.is_empty())
    })
    .await
    .unwrap();
    let calls = fake.call_count("instance_metadata");
    calls_reach(&fake, "instance_metadata", calls + 4).await;
    let later = t.nodes.get(&name).await.unwrap();
    assert_eq!(
        later.metadata.resource_version, settled.metadata.resource_version,
        "a refresh wrote to a Node already in step"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// The instance-not-found condition and the mark-only mode

fn lifecycle(grace: Duration) -> NodeLifecycleConfig {
    let mut config = NodeLifecycleConfig::default();
    config.monitor_period = Duration::from_millis(200);
    config.deletion_grace_period = grace;
    config
}

fn condition(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn a_gone_instance_shows_as_a_condition_until_it_is_found_again() {
    let t = Test::start().await;
    let name = t.name("missing");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let mut config = lifecycle(Duration::from_secs(3600));
    config.instance_not_found_condition = true;
    let running = t.run_lifecycle(fake.provider(), config).await;

    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        condition(n) == Some(("True".into(), "InstanceNotFound".into()))
    })
    .await
    .unwrap();
    fake.set_missing_nodes(&[]);
    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        condition(n) == Some(("False".into(), "InstanceFound".into()))
    })
    .await
    .unwrap();
    let text = running.metrics();
    assert!(
        text.contains(
            "node_lifecycle_controller_checks_total{outcome=\"instance_not_found_condition_set\"} 1"
        ),
        "{text}"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn without_the_flag_no_condition_like_go() {
    let t = Test::start().await;
    let name = t.name("nocond");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), lifecycle(Duration::from_secs(3600)))
        .await;
    calls_reach(&fake, "instance_exists", 4).await;
    assert_eq!(condition(&t.nodes.get(&name).await.unwrap()), None);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn mark_mode_never_deletes_and_marks() {
    let t = Test::start().await;
    let name = t.name("marked");
    let fake = FakeCloud::builder().missing_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let mut config = lifecycle(Duration::from_millis(300));
    config.gone_nodes = GoneNodeAction::Mark;
    let running = t.run_lifecycle(fake.provider(), config).await;

    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        condition(n).is_some_and(|c| c.0 == "True")
    })
    .await
    .unwrap();
    // Well past the grace period: confirmed gone, still there.
    assert!(
        eventually(TIMEOUT, || async {
            metric_value(
                &running.metrics(),
                "node_lifecycle_controller_checks_total{outcome=\"gone_marked\"}",
            ) >= 3.0
        })
        .await
    );
    assert!(t.nodes.get(&name).await.is_ok(), "deleted in mark mode");
    assert!(!t.events(&name).await.iter().any(|e| e.1 == "DeletingNode"));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn no_condition_on_nodes_not_provably_ours() {
    let t = Test::start().await;
    // Another cloud's Node (scheme), and an uninitialised Node without a provider ID.
    let foreign = t.name("foreign");
    let unproven = t.name("unproven");
    let fake = FakeCloud::builder().missing_node(".*").build();
    t.create(
        &t.initialized_node(&foreign)
            .provider_id(&format!("othercloud://{foreign}"))
            .not_ready()
            .build(),
    )
    .await;
    t.create(&t.registered_node(&unproven).not_ready().build())
        .await;
    // A Node of ours beside them, so that a pass is seen to have run.
    let ours = t.name("ours");
    t.create(&t.initialized_node(&ours).not_ready().build())
        .await;
    let mut config = lifecycle(Duration::from_millis(300));
    config.gone_nodes = GoneNodeAction::Mark;
    let running = t.run_lifecycle(fake.provider(), config).await;

    wait_for(&t.nodes, &ours, TIMEOUT, |n: &Node| {
        condition(n).is_some_and(|c| c.0 == "True")
    })
    .await
    .unwrap();
    let calls = fake.call_count("instance_exists");
    calls_reach(&fake, "instance_exists", calls + 3).await;
    for name in [&foreign, &unproven] {
        let node = t.nodes.get(name).await.unwrap();
        assert_eq!(condition(&node), None, "{name} was marked");
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// The out-of-service taint

fn has_out_of_service(node: &Node) -> bool {
    taints(node)
        .iter()
        .any(|(k, e)| k == TAINT_OUT_OF_SERVICE && e == "NoExecute")
}

fn with_out_of_service(delay: Duration) -> NodeLifecycleConfig {
    let mut config = lifecycle(Duration::from_secs(30));
    config.out_of_service_after = Some(delay);
    config
}

#[tokio::test]
async fn a_shut_down_node_gets_out_of_service_after_the_delay_until_it_runs_again() {
    let t = Test::start().await;
    let name = t.name("stopped");
    let fake = FakeCloud::builder().shutdown_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(fake.provider(), with_out_of_service(Duration::from_secs(1)))
        .await;

    let tainted = wait_for(&t.nodes, &name, TIMEOUT, has_out_of_service)
        .await
        .unwrap();
    let node_taints = taints(&tainted);
    assert!(
        node_taints.contains(&(TAINT_SHUTDOWN.into(), "NoSchedule".into())),
        "{node_taints:?}"
    );
    let value = tainted
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|t| t.iter().find(|t| t.key == TAINT_OUT_OF_SERVICE))
        .and_then(|t| t.value.clone());
    assert_eq!(value.as_deref(), Some("nodeshutdown"));

    // The instance runs again (the Node still NotReady): the taint comes off.
    fake.set_shutdown_nodes(&[]);
    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| !has_out_of_service(n))
        .await
        .unwrap();
    let text = running.metrics();
    assert!(
        text.contains(
            "node_lifecycle_controller_checks_total{outcome=\"out_of_service_taint_added\"} 1"
        ),
        "{text}"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn out_of_service_comes_off_a_ready_node() {
    let t = Test::start().await;
    let name = t.name("back");
    let fake = FakeCloud::builder().shutdown_node(&name).build();
    t.create(&t.initialized_node(&name).not_ready().build())
        .await;
    let running = t
        .run_lifecycle(
            fake.provider(),
            with_out_of_service(Duration::from_millis(500)),
        )
        .await;
    wait_for(&t.nodes, &name, TIMEOUT, has_out_of_service)
        .await
        .unwrap();
    t.set_ready(&name, true).await;
    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        !has_out_of_service(n) && taints(n).iter().all(|(k, _)| k != TAINT_SHUTDOWN)
    })
    .await
    .unwrap();
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn no_out_of_service_before_the_delay_on_errors_or_without_the_flag() {
    let t = Test::start().await;
    let early = t.name("early");
    let failing = t.name("failing");
    let off = t.name("off");
    let fake = FakeCloud::builder().shutdown_node(".*").build();
    fake.set_node(
        &failing,
        NodeAnswer {
            error: Some("cloud unavailable".into()),
            ..NodeAnswer::default()
        },
    );
    for name in [&early, &failing, &off] {
        t.create(&t.initialized_node(name).not_ready().build())
            .await;
    }
    // One controller with an hour's delay (`early`, `failing`), one without the flag (`off`):
    // both see every Node, so the Go-behaviour one checks that nothing adds the taint.
    let running = t
        .run_lifecycle(
            fake.provider(),
            with_out_of_service(Duration::from_secs(3600)),
        )
        .await;
    calls_reach(&fake, "instance_shutdown", 6).await;
    running.stop().await.unwrap();
    let go = t
        .run_lifecycle(fake.provider(), lifecycle(Duration::from_secs(30)))
        .await;
    let calls = fake.call_count("instance_shutdown");
    calls_reach(&fake, "instance_shutdown", calls + 6).await;
    for name in [&early, &failing, &off] {
        let node = t.nodes.get(name).await.unwrap();
        assert!(!has_out_of_service(&node), "{name}: {:?}", taints(&node));
    }
    go.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn not_implemented_shutdown_never_removes_an_operators_out_of_service_taint() {
    let t = Test::start().await;
    let name = t.name("byhand");
    let fake = FakeCloud::default();
    fake.inject("instance_shutdown", Fault::NotImplemented);
    // The operator's own non-graceful shutdown, applied by hand as Kubernetes documents it.
    t.create(
        &t.initialized_node(&name)
            .not_ready()
            .taint(TAINT_OUT_OF_SERVICE, "nodeshutdown", "NoExecute")
            .build(),
    )
    .await;
    let running = t
        .run_lifecycle(fake.provider(), with_out_of_service(Duration::from_secs(1)))
        .await;
    calls_reach(&fake, "instance_shutdown", 6).await;
    let node = t.nodes.get(&name).await.unwrap();
    assert!(has_out_of_service(&node), "{:?}", taints(&node));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}
