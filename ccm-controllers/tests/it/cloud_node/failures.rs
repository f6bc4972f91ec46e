//! Concurrency safety and failures: concurrent writes, cloud errors and `Retry`, failed writes,
//! and the order of the writes.

use crate::support::node::{
    TIMEOUT, Test, addresses, has_taint, label, provider_id, quiet_cloud_node_config, taints,
};
use ccm_core::well_known::{LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED};
use ccm_core::{Node, NodeAddress};
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::eventually;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

use super::{Probe, fake_addresses};
use crate::support::requests::spec_patch_statuses;

#[tokio::test]
async fn taint_removal_preserves_a_concurrently_added_taint_and_label() {
    let t = Test::start().await;
    // The cloud answers slowly, so the test can change the node while the controller waits.
    let fake = FakeCloud::builder()
        .operation_latency("instance_metadata", Duration::from_millis(1500))
        .build();
    let name = t.name("race");
    // Addresses already right: the spec patch is planned from the cached copy, read before
    // the concurrent change (an address write would return a fresh copy to plan from).
    let cloud_addresses = fake_addresses(&fake, &name)
        .await
        .into_iter()
        .map(|(type_, address)| NodeAddress { type_, address })
        .collect();
    t.create(&t.registered_node(&name).addresses(cloud_addresses).build())
        .await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("instance_metadata") >= 1
        })
        .await
    );
    // kubelet (or a user) adds a taint and a label meanwhile.
    let current = t.nodes.get(&name).await.unwrap();
    let mut new_taints = current.spec.clone().unwrap().taints.unwrap();
    new_taints.push(k8s_openapi::api::core::v1::Taint {
        key: "example.com/late".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    t.nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"example.com/late": "yes"}},
                "spec": {"taints": new_taints},
            })),
        )
        .await
        .unwrap();

    let node = t.wait_initialized(&name).await;
    assert!(has_taint(&node, "example.com/late"), "{:?}", taints(&node));
    assert_eq!(label(&node, "example.com/late"), Some("yes"));
    assert_eq!(label(&node, LABEL_TOPOLOGY_ZONE), Some("zone-a"));
    // One cloud call: the conflict was resolved from a fresh read, not a new cloud call.
    assert_eq!(fake.call_count("instance_metadata"), 1);
    if let Some(server) = t.cluster.api_server() {
        let spec_patches = spec_patch_statuses(server, &name, Some("application/json-patch+json"));
        assert_eq!(
            spec_patches,
            vec![422, 200],
            "a write planned from the old taints is refused, then redone"
        );
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn metadata_failure_is_reported_and_retried_until_it_works() {
    let log = ccm_testing::logging::record("warn");
    let t = Test::start().await;
    let fake = FakeCloud::default();
    fake.inject("instance_metadata", Fault::FailNext(3));
    let name = t.name("flaky");
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let node = t.wait_initialized(&name).await;
    assert_eq!(provider_id(&node), Some(format!("fake://{name}").as_str()));
    assert_eq!(fake.call_count("instance_metadata"), 4);
    t.wait_event(&name, "Synced").await;
    let events = t.events(&name).await;
    let warning = events
        .iter()
        .find(|e| e.1 == "SyncFailed")
        .unwrap_or_else(|| panic!("no SyncFailed event: {events:?}"));
    assert_eq!(warning.0, "Warning");
    assert!(
        warning.2.contains("Failed to get instance metadata"),
        "{}",
        warning.2
    );
    assert!(warning.2.contains("injected failure"), "{}", warning.2);
    // The Warning is in the log too, with the Node and the error; the three failures make
    // one line within the rate-limit interval (issue 28).
    crate::support::assert_warning_logged(&log, "SyncFailed", &name, &warning.2);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn retry_error_requeues_after_the_providers_delay_without_a_warning() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    fake.inject(
        "instance_metadata",
        Fault::Retry {
            after: Duration::from_secs(3),
            count: 1,
        },
    );
    let name = t.name("retry");
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("instance_metadata") >= 1
        })
        .await
    );
    // Exponential backoff would have retried within milliseconds; Retry waits its 3 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fake.call_count("instance_metadata"), 1);
    t.wait_initialized(&name).await;
    assert_eq!(fake.call_count("instance_metadata"), 2);
    t.wait_event(&name, "Synced").await;
    assert!(
        !t.events(&name).await.iter().any(|e| e.1 == "SyncFailed"),
        "no Warning for a Retry"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn failed_address_write_keeps_the_node_tainted_until_retried() {
    let t = Test::start().await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection in the API server
    };
    let fake = FakeCloud::default();
    let name = t.name("statusfail");
    let expected = fake_addresses(&fake, &name).await;
    t.create(&t.registered_node(&name).build()).await;
    server.fail_next("patch", "nodes/status", 1, 500, None);
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let (_, _, note) = t.wait_event(&name, "SyncFailed").await;
    assert!(note.contains("addresses"), "{note}");
    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert!(!has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(addresses(&node), expected);
    // The retry initialises the node again, as any failed initialisation; the taint came off
    // once, after the addresses were written.
    assert_eq!(fake.call_count("instance_metadata"), 2);
    assert_eq!(spec_patch_statuses(server, &name, None), vec![200]);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// Every version of the Node as a watch on it sees them, from its creation until `done`.
fn watch_versions(
    t: &Test,
    name: &str,
) -> (
    tokio::task::JoinHandle<Vec<Node>>,
    tokio::sync::oneshot::Sender<()>,
) {
    use futures::StreamExt;
    let nodes = t.nodes.clone();
    let selector = format!("metadata.name={name}");
    let (done, mut stop) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let params = kube::api::WatchParams::default().fields(&selector);
        let mut stream = nodes.watch(&params, "0").await.unwrap().boxed();
        let mut seen = Vec::new();
        loop {
            tokio::select! {
                _ = &mut stop => return seen,
                event = stream.next() => match event {
                    Some(Ok(kube::api::WatchEvent::Added(n) | kube::api::WatchEvent::Modified(n))) => {
                        seen.push(n)
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => panic!("watch failed: {e}"),
                    None => return seen,
                },
            }
        }
    });
    (task, done)
}

#[tokio::test]
async fn addresses_are_written_before_the_taint_comes_off() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("order");
    let expected = fake_addresses(&fake, &name).await;
    let created = t.create(&t.registered_node(&name).build()).await;
    assert_ne!(
        addresses(&created),
        expected,
        "the test needs an address change"
    );
    let (watch, done) = watch_versions(&t, &name);
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    t.wait_event(&name, "Synced").await;
    let _ = done.send(());
    let versions = watch.await.unwrap();
    running.stop().await.unwrap();
    let first_untainted = versions
        .iter()
        .find(|n| !has_taint(n, TAINT_UNINITIALIZED))
        .expect("the watch saw the node untainted");
    assert_eq!(
        addresses(first_untainted),
        expected,
        "the node was schedulable before its cloud addresses were written"
    );
    let with_addresses = versions
        .iter()
        .position(|n| addresses(n) == expected)
        .unwrap();
    assert!(has_taint(&versions[with_addresses], TAINT_UNINITIALIZED));
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_kubelet_status_write_during_initialization_costs_no_round_trip() {
    let t = Test::start().await;
    let name = t.name("kubeletrace");
    let created = t.create(&t.registered_node(&name).build()).await;
    let fake = FakeCloud::default();
    let probe = Probe::holding(
        fake.clone(),
        created.metadata.uid.as_deref().unwrap(),
        |_, _| {},
    );
    if let Some(server) = t.cluster.api_server() {
        server.clear_requests();
    }
    let running = t
        .run_cloud_node(probe.clone(), quiet_cloud_node_config())
        .await;

    // The controller has read the node and waits for the cloud...
    tokio::time::timeout(TIMEOUT, probe.hold().entered.notified())
        .await
        .expect("the controller never asked the cloud about the node");
    // ...while kubelet writes the node's status (a heartbeat and its capacity), touching
    // nothing the controller's plan depends on.
    let heartbeat =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    t.nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "lastHeartbeatTime": heartbeat}],
            }})),
        )
        .await
        .unwrap();
    probe.hold().release.notify_one();

    t.wait_initialized(&name).await;
    t.wait_event(&name, "Synced").await;
    assert_eq!(fake.call_count("instance_metadata"), 1);
    if let Some(server) = t.cluster.api_server() {
        assert_eq!(
            spec_patch_statuses(server, &name, None),
            vec![200],
            "the spec patch does not fail on kubelet's status write (no conflict, no re-read)"
        );
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// A Node the cloud never answers for stays tainted: the gauges read from the Node store at
/// each scrape count it and show its age (what the alert "Nodes uninitialised for too long"
/// reads); another cloud's tainted Node (its provider ID names another provider) is not
/// counted; once the cloud answers ours is initialised and no longer counted. The controller's
/// informer sees only this test's Nodes, so the counts are exact on a shared cluster too.
#[tokio::test]
async fn uninitialised_nodes_are_counted_with_the_oldest_ones_age() {
    use crate::support::service::metric_value;
    let t = Test::start().await;
    let fake = FakeCloud::default();
    fake.inject(
        "instance_metadata",
        Fault::FailWithProbability { p: 1.0, seed: 1 },
    );
    // Another cloud's Node, older than ours, waiting for its own cloud-controller-manager.
    let foreign = t.name("other-cloud");
    t.create(
        &t.registered_node(&foreign)
            .provider_id(&format!("other://{foreign}"))
            .build(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let name = t.name("stuck");
    let created = t.create(&t.registered_node(&name).build()).await;
    let created_at = created.metadata.creation_timestamp.clone().unwrap().0;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;
    let count = |text: &str| metric_value(text, "node_controller_uninitialized_nodes");
    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("instance_metadata") >= 2 && count(&running.metrics()) == 1.0
        })
        .await,
        "{}",
        running.metrics()
    );
    // Ours is over 2 s old (a gauge stuck at 0 would fail below).
    while jiff::Timestamp::now()
        .duration_since(created_at)
        .as_secs_f64()
        < 2.0
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = jiff::Timestamp::now()
        .duration_since(created_at)
        .as_secs_f64();
    let text = running.metrics();
    let after = jiff::Timestamp::now()
        .duration_since(created_at)
        .as_secs_f64();
    assert_eq!(count(&text), 1.0, "{text}");
    // The oldest is ours, not the older foreign one (the API's timestamps have whole seconds).
    let oldest = metric_value(
        &text,
        "node_controller_oldest_uninitialized_node_age_seconds",
    );
    assert!(
        oldest >= before - 0.5 && oldest <= after + 0.5,
        "oldest {oldest} s, ours {before}..{after} s"
    );
    assert!(
        running
            .metrics()
            .contains("node_controller_foreign_nodes{reason=\"provider_id\"} 1"),
        "{}",
        running.metrics()
    );

    fake.clear_faults();
    t.wait_initialized(&name).await;
    assert!(
        eventually(TIMEOUT, || async { count(&running.metrics()) == 0.0 }).await,
        "{}",
        running.metrics()
    );
    assert_eq!(
        metric_value(
            &running.metrics(),
            "node_controller_oldest_uninitialized_node_age_seconds"
        ),
        0.0
    );
    let still = t.nodes.get(&foreign).await.unwrap();
    assert!(
        has_taint(&still, TAINT_UNINITIALIZED),
        "the foreign Node is left alone"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}
