//! Parallel initialisation, refused configurations, metrics, and a Node deleted and re-created
//! under the same name while its cloud call is in flight.

use crate::support::node::{TIMEOUT, Test, has_taint, label, provider_id, quiet_cloud_node_config};
use ccm_controllers::ControllerError;
use ccm_controllers::controllers::cloud_node::{self, CloudNodeConfig};
use ccm_core::Node;
use ccm_core::well_known::{LABEL_INSTANCE_TYPE, TAINT_UNINITIALIZED};
use ccm_testing::fake_cloud::{Capabilities, FakeCloud};
use ccm_testing::wait::wait_for;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Probe;
use crate::support::requests::{spec_patch_statuses, status_patch_statuses};

#[tokio::test]
async fn nodes_are_initialized_in_parallel() {
    let t = Test::start().await;
    let probe = Probe::new(
        FakeCloud::builder()
            .operation_latency("instance_metadata", Duration::from_millis(300))
            .build(),
        |_| {},
    );
    let names: Vec<String> = (0..8).map(|i| t.name(&format!("par{i}"))).collect();
    for n in &names {
        t.create(&t.registered_node(n).build()).await;
    }
    let running = t
        .run_cloud_node(probe.clone(), {
            let mut config = quiet_cloud_node_config();
            config.workers = 4;
            config
        })
        .await;
    for n in &names {
        t.wait_initialized(n).await;
    }
    let max = probe.max_in_flight.load(Ordering::SeqCst);
    assert!(max > 1 && max <= 4, "max concurrent cloud calls: {max}");
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn zero_workers_and_missing_capabilities_are_refused() {
    let t = Test::start().await;
    let err = t
        .cloud_node_refusal(FakeCloud::default().provider(), {
            let mut config = CloudNodeConfig::default();
            config.workers = 0;
            config
        })
        .await;
    assert!(matches!(err, ControllerError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("--concurrent-node-syncs"), "{err}");
    let err = t
        .cloud_node_refusal(FakeCloud::default().provider(), {
            let mut config = CloudNodeConfig::default();
            config.status_update_frequency = Duration::ZERO;
            config
        })
        .await;
    assert!(
        err.to_string().contains("--node-status-update-frequency"),
        "{err}"
    );

    let no_instances = FakeCloud::builder()
        .capabilities(Capabilities {
            instances_v2: false,
            instances: false,
            ..Capabilities::default()
        })
        .build();
    let err = t
        .cloud_node_refusal(no_instances.provider(), CloudNodeConfig::default())
        .await;
    assert!(
        matches!(
            err,
            ControllerError::MissingCapability {
                controller: "cloud-node-controller",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        CloudNodeConfig::default().workers,
        cloud_node::DEFAULT_WORKERS
    );
    assert_eq!(
        CloudNodeConfig::default().status_update_frequency,
        Duration::from_secs(300)
    );
    assert_eq!(CloudNodeConfig::default().status_update_workers, 0);
}

#[tokio::test]
async fn metrics_use_gos_names() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("metrics");
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;
    t.wait_event(&name, "Synced").await;
    let text = running.metrics();
    for needle in [
        "node_controller_cloud_provider_taint_removal_delay_seconds_count 1",
        "node_controller_initial_node_sync_delay_seconds_count 1",
        "node_controller_reconciles_total{kind=\"initialize\",result=\"success\"} 1",
        "node_controller_reconcile_duration_seconds_count{kind=\"initialize\"} 1",
        "workqueue_depth{name=\"Nodes\"}",
        "workqueue_adds_total{name=\"Nodes\"}",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// A Node deleted and re-created under the same name while its cloud call is in flight

const GENERATION_LABEL: &str = "example.com/generation";

#[tokio::test]
async fn a_node_recreated_during_its_cloud_call_is_initialized_from_its_own_answer() {
    let t = Test::start().await;
    let name = t.name("recreated");
    let old = t
        .create(
            &t.registered_node(&name)
                .label(GENERATION_LABEL, "old")
                .build(),
        )
        .await;
    let old_uid = old.metadata.uid.clone().unwrap();
    let fake = FakeCloud::default();
    // Holds the old Node's cloud call; answers an instance type naming the asked Node's
    // generation label, so the test can tell whose answer a Node was initialised from.
    let probe = Probe::holding(fake.clone(), &old_uid, |node, meta| {
        meta.instance_type = format!(
            "type-{}",
            node.label(GENERATION_LABEL).unwrap_or("unlabelled")
        );
    });
    let running = t
        .run_cloud_node(probe.clone(), quiet_cloud_node_config())
        .await;

    // The controller is waiting for the old Node's cloud answer...
    tokio::time::timeout(TIMEOUT, probe.hold().entered.notified())
        .await
        .expect("the controller never asked the cloud about the old node");
    // ...while the Node is deleted and re-created under the same name, with other labels.
    t.nodes.delete(&name, &Default::default()).await.unwrap();
    ccm_testing::wait::wait_for_deletion(&t.nodes, &name, TIMEOUT)
        .await
        .unwrap();
    let new = t
        .create(
            &t.registered_node(&name)
                .label(GENERATION_LABEL, "new")
                .build(),
        )
        .await;
    let new_uid = new.metadata.uid.clone().unwrap();
    assert_ne!(new_uid, old_uid);
    if let Some(server) = t.cluster.api_server() {
        server.clear_requests();
    }
    probe.hold().release.notify_one();

    let node = wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        !has_taint(n, TAINT_UNINITIALIZED)
    })
    .await
    .unwrap();
    assert_eq!(node.metadata.uid.as_deref(), Some(new_uid.as_str()));
    // Initialised from its own cloud answer, never from the old Node's.
    assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some("type-new"));
    assert_eq!(label(&node, GENERATION_LABEL), Some("new"));
    assert_eq!(provider_id(&node), Some(format!("fake://{name}").as_str()));
    // The old Node's (perhaps twice: a stale cached copy may be synced again) and the new one's.
    assert!(fake.call_count("instance_metadata") >= 2);
    if let Some(server) = t.cluster.api_server() {
        // The first write planned for the old Node (its addresses) is refused by the UID
        // precondition, and nothing else planned for it is written; the one spec write that
        // lands is the new Node's own.
        let status_patches = status_patch_statuses(server, &name);
        assert_eq!(status_patches.first(), Some(&409), "{status_patches:?}");
        let spec_patches = spec_patch_statuses(server, &name, None);
        assert_eq!(spec_patches, vec![200], "{spec_patches:?}");
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}
