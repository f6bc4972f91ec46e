//! Which Nodes are ours (docs/controllers.md, "Which Nodes are ours"): a Node of another cloud
//! (another provider-ID scheme, or outside `--managed-node-selector`) is never touched and
//! costs no cloud call, and an uninitialised Node without a provider ID that our cloud does not
//! know is never deleted. The real controllers against the in-process API server (or the
//! cluster of `CCM_TEST_KUBECONFIG`, restricted to the test's Nodes by its run label).

use std::time::Duration;

use ccm_controllers::controllers::service;
use ccm_core::well_known::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED};
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::{eventually, wait_for_deletion};

use crate::support::node::{RUN_LABEL, TIMEOUT, Test, has_taint};

/// Lifecycle passes the tests wait for: with the harness's 100 ms monitor period, a second and
/// a half of NotReady Nodes checked again and again.
const PASSES: u64 = 15;

/// The node-lifecycle controller's passes so far.
fn passes(harness: &ControllerHarness) -> u64 {
    harness
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix("node_lifecycle_controller_monitor_duration_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

async fn wait_passes(harness: &ControllerHarness, n: u64) {
    let start = passes(harness);
    assert!(
        eventually(TIMEOUT, || async { passes(harness) >= start + n }).await,
        "the lifecycle controller ran {} passes, expected {n}",
        passes(harness) - start
    );
}

/// The cloud calls made about the Node `name`.
fn calls_about(fake: &FakeCloud, name: &str) -> Vec<String> {
    fake.call_log()
        .into_iter()
        .filter(|c| c.subject == name || c.node_names().contains(&name))
        .map(|c| c.operation)
        .collect()
}

/// Issue 35, first case: a NotReady Node with the uninitialised taint and no provider ID that
/// our cloud does not know (another cloud's Node whose own CCM has not got to it yet) was
/// deleted within seconds, with the cloud-node controller warning at every retry until then.
/// Now it is kept, told about once; while a Node with evidence that it was ours (our provider
/// ID, or initialised) whose instance is gone is still deleted, as Go does.
#[tokio::test]
async fn an_uninitialised_node_our_cloud_does_not_know_is_never_deleted() {
    let t = Test::start().await;
    let log = ccm_testing::logging::record("ccm_controllers=debug,info");
    let stranger = t.name("stranger");
    let ours_registered = t.name("ours-registered");
    let ours_initialised = t.name("ours-initialised");
    let fake = FakeCloud::builder()
        .missing_node(&format!("{stranger}|{ours_registered}|{ours_initialised}"))
        .build();
    t.create(&t.registered_node(&stranger).not_ready().build())
        .await;
    let harness = t
        .harness(fake.provider())
        .cloud_node()
        .node_lifecycle()
        .start()
        .await;
    wait_passes(&harness, PASSES).await;

    let node = t.nodes.get(&stranger).await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED), "left uninitialised");
    assert!(!has_taint(&node, TAINT_SHUTDOWN));
    // Not even asked: it could not be deleted, and the uninitialized taint keeps pods off it.
    assert_eq!(fake.calls_of("instance_exists").len(), 0);
    // The cloud-node controller says it once; its retries (with backoff) are quiet.
    let about: Vec<String> = log
        .lines_containing(&stranger)
        .into_iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" INFO "))
        .collect();
    assert_eq!(about.len(), 1, "{about:#?}");
    assert!(
        about[0].contains(" WARN ") && about[0].contains("does not know the instance"),
        "{about:#?}"
    );
    assert!(fake.calls_of("instance_metadata").len() > 1, "retried");

    // With evidence that it was ours, Go's rule: deleted once the instance is gone.
    t.create(
        &t.registered_node(&ours_registered)
            .provider_id(&format!("fake://{ours_registered}"))
            .not_ready()
            .build(),
    )
    .await;
    t.create(&t.initialized_node(&ours_initialised).not_ready().build())
        .await;
    wait_for_deletion(&t.nodes, &ours_registered, TIMEOUT)
        .await
        .unwrap();
    wait_for_deletion(&t.nodes, &ours_initialised, TIMEOUT)
        .await
        .unwrap();
    assert!(t.nodes.get_opt(&stranger).await.unwrap().is_some());
    let metrics = harness.metrics();
    assert!(
        metrics
            .contains("node_lifecycle_controller_checks_total{outcome=\"no_deletion_evidence\"}"),
        "{metrics}"
    );
    harness.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// Issue 35, second case: a NotReady Node with provider ID `proxmox://cluster-1/101` was kept
/// (the lookups failed), but both node controllers warned about it at every pass and kept
/// asking. Now no controller touches it and the cloud is never asked about it: no cloud call,
/// no warning, one INFO line when it is first seen, the gauge counts it.
#[tokio::test]
async fn a_node_of_another_provider_costs_no_cloud_call_and_no_warning() {
    let t = Test::start().await;
    let log = ccm_testing::logging::record("ccm_controllers=debug,info");
    let proxmox = t.name("proxmox");
    let ours = t.name("ours");
    let fake = FakeCloud::default();
    t.create(
        &t.initialized_node(&proxmox)
            .provider_id("proxmox://cluster-1/101")
            .not_ready()
            .build(),
    )
    .await;
    // Another cloud's Node its own CCM has not initialised yet, but kubelet knows its ID.
    let proxmox_new = t.name("proxmox-new");
    t.create(
        &t.registered_node(&proxmox_new)
            .provider_id("proxmox://cluster-1/102")
            .not_ready()
            .build(),
    )
    .await;
    t.create(&t.registered_node(&ours).not_ready().build())
        .await;
    let namespace = t.cluster.namespace().await;
    let lb_name = t.name("lb");
    t.cluster
        .create(
            &load_balancer_service(&namespace, &lb_name)
                .label(RUN_LABEL, &t.run)
                .build(),
        )
        .await;
    let harness = t
        .harness(fake.provider())
        .cloud_node()
        .node_lifecycle()
        .builtin(service::NAME)
        // The address refresh runs too, every 200 ms.
        .flag("--node-status-update-frequency=200ms")
        .start()
        .await;
    t.wait_initialized(&ours).await;
    wait_passes(&harness, PASSES).await;
    harness.settled().await;

    for foreign in [&proxmox, &proxmox_new] {
        assert_eq!(
            calls_about(&fake, foreign),
            Vec::<String>::new(),
            "{foreign}"
        );
        let node = t.nodes.get(foreign).await.unwrap();
        assert!(!has_taint(&node, TAINT_SHUTDOWN));
        let lines: Vec<String> = log
            .lines_containing(foreign)
            .into_iter()
            .filter(|l| l.contains(" WARN ") || l.contains(" INFO "))
            .collect();
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(lines[0].contains(" INFO ") && lines[0].contains("belongs to another cloud"));
    }
    assert!(has_taint(
        &t.nodes.get(&proxmox_new).await.unwrap(),
        TAINT_UNINITIALIZED
    ));
    // Our Node is a host of the load balancer; the foreign ones are not.
    let hosts = fake
        .calls_of("ensure_load_balancer")
        .last()
        .and_then(|c| c.hosts().map(<[String]>::to_vec))
        .unwrap_or_default();
    assert_eq!(hosts, vec![ours.clone()]);
    let metrics = harness.metrics();
    assert!(
        metrics.contains("node_controller_foreign_nodes{reason=\"provider_id\"} 2"),
        "{metrics}"
    );
    harness.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// `--managed-node-selector`: Nodes it does not select are foreign, whatever their provider ID;
/// becoming selected makes a Node ours (it is initialised), leaving makes it foreign again
/// (no longer a load-balancer host).
#[tokio::test]
async fn nodes_outside_the_managed_node_selector_are_left_alone() {
    let t = Test::start().await;
    let outside = t.name("outside");
    let inside = t.name("inside");
    let fake = FakeCloud::builder().missing_node(&outside).build();
    t.create(&t.registered_node(&inside).label("fleet", "a").build())
        .await;
    t.create(
        &t.initialized_node(&outside)
            .label("fleet", "b")
            .not_ready()
            .build(),
    )
    .await;
    let harness = t
        .harness(fake.provider())
        .cloud_node()
        .node_lifecycle()
        .flag("--managed-node-selector=fleet=a")
        .start()
        .await;
    t.wait_initialized(&inside).await;
    wait_passes(&harness, PASSES).await;
    assert!(
        t.nodes.get_opt(&outside).await.unwrap().is_some(),
        "not deleted"
    );
    assert_eq!(calls_about(&fake, &outside), Vec::<String>::new());
    assert!(
        harness
            .metrics()
            .contains("node_controller_foreign_nodes{reason=\"selector\"} 1")
    );

    // Selected now: ours, and its instance is gone: deleted as any of ours.
    let patch = serde_json::json!({"metadata": {"labels": {"fleet": "a"}}});
    t.nodes
        .patch(
            &outside,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    wait_for_deletion(&t.nodes, &outside, TIMEOUT)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            harness
                .metrics()
                .contains("node_controller_foreign_nodes{reason=\"selector\"} 0")
        })
        .await
    );
    harness.stop().await.unwrap();
    t.cluster.cleanup().await;
}
