//! Initialisation of a tainted Node from `InstancesV2` or the legacy `Instances`/`Zones`, and
//! its labels.

use crate::support::node::{
    TIMEOUT, Test, addresses, has_taint, label, provider_id, quiet_cloud_node_config, taints,
};
use ccm_core::Node;
use ccm_core::well_known::{
    LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_INSTANCE_TYPE,
    LABEL_INSTANCE_TYPE_BETA, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use ccm_testing::fake_cloud::{Capabilities, FakeCloud, Fault};
use ccm_testing::wait::wait_for;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{Probe, fake_addresses};

#[tokio::test]
async fn initializes_a_tainted_node_with_instances_v2() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("v2");
    let expected_addresses = fake_addresses(&fake, &name).await;
    t.create(
        &t.registered_node(&name)
            .taint("example.com/dedicated", "db", "NoExecute")
            .build(),
    )
    .await;
    if let Some(server) = t.cluster.api_server() {
        server.clear_requests();
    }
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let node = t.wait_initialized(&name).await;
    assert_eq!(provider_id(&node), Some(format!("fake://{name}").as_str()));
    for (k, v) in [
        (LABEL_INSTANCE_TYPE, "fake-small"),
        (LABEL_INSTANCE_TYPE_BETA, "fake-small"),
        (LABEL_TOPOLOGY_ZONE, "zone-a"),
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, "zone-a"),
        (LABEL_TOPOLOGY_REGION, "region-1"),
        (LABEL_FAILURE_DOMAIN_BETA_REGION, "region-1"),
    ] {
        assert_eq!(label(&node, k), Some(v), "label {k}");
    }
    // kubelet's own labels and the other taint are untouched (besides the not-ready taint
    // kube-apiserver's TaintNodesByCondition admission adds to every new Node).
    assert_eq!(label(&node, "kubernetes.io/hostname"), Some(name.as_str()));
    let own_taints: Vec<_> = taints(&node)
        .into_iter()
        .filter(|(k, _)| k != "node.kubernetes.io/not-ready")
        .collect();
    assert_eq!(
        own_taints,
        vec![("example.com/dedicated".to_owned(), "NoExecute".to_owned())]
    );
    let synced = t.wait_event(&name, "Synced").await;
    assert_eq!(synced.0, "Normal");
    assert_eq!(synced.2, "Node synced successfully");
    let node = t.nodes.get(&name).await.unwrap();
    assert_eq!(addresses(&node), expected_addresses);
    assert_eq!(fake.call_count("instance_metadata"), 1);

    // The write budget: one patch of its status (the addresses, first), one of the node (and
    // the Synced event).
    if let Some(server) = t.cluster.api_server() {
        let writes: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| {
                r.resource == "nodes"
                    && r.name.as_deref() == Some(name.as_str())
                    && !matches!(r.verb.as_str(), "get" | "list" | "watch")
            })
            .map(|r| (r.verb, r.subresource, r.content_type, r.status))
            .collect();
        assert_eq!(
            writes,
            vec![
                (
                    "patch".to_owned(),
                    Some("status".to_owned()),
                    Some("application/merge-patch+json".to_owned()),
                    200
                ),
                (
                    "patch".to_owned(),
                    None,
                    Some("application/json-patch+json".to_owned()),
                    200
                ),
            ]
        );
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn initializes_with_legacy_instances_and_zones() {
    let t = Test::start().await;
    let fake = FakeCloud::builder()
        .instances_v2(false)
        .legacy_instances(true)
        .build();
    let name = t.name("v1");
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let node = t.wait_initialized(&name).await;
    assert_eq!(provider_id(&node), Some(format!("fake://{name}").as_str()));
    assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some("fake-small"));
    assert_eq!(label(&node, LABEL_TOPOLOGY_ZONE), Some("zone-a"));
    assert_eq!(
        label(&node, LABEL_FAILURE_DOMAIN_BETA_REGION),
        Some("region-1")
    );
    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert!(
        addresses(&node).iter().any(|(ty, _)| ty == "InternalIP"),
        "{:?}",
        addresses(&node)
    );
    // Go's legacy path: instance ID, then the by-provider-ID lookups (which succeed here).
    assert_eq!(fake.call_count("instance_metadata"), 0);
    assert_eq!(fake.call_count("instance_id"), 1);
    assert_eq!(fake.call_count("instance_type_by_provider_id"), 1);
    assert_eq!(fake.call_count("node_addresses_by_provider_id"), 1);
    assert_eq!(fake.call_count("get_zone_by_provider_id"), 1);
    assert_eq!(fake.call_count("instance_type"), 0);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn legacy_fallbacks_by_name_and_no_zones() {
    let t = Test::start().await;
    let fake = FakeCloud::builder()
        .capabilities(Capabilities {
            instances_v2: false,
            instances: true,
            zones: false,
            ..Capabilities::default()
        })
        .build();
    // The by-provider-ID lookups fail: the by-name ones are used instead.
    fake.inject("instance_type_by_provider_id", Fault::NotImplemented);
    fake.inject("node_addresses_by_provider_id", Fault::FailNext(1));
    let name = t.name("v1-byname");
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let node = t.wait_initialized(&name).await;
    assert_eq!(provider_id(&node), Some(format!("fake://{name}").as_str()));
    assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some("fake-small"));
    assert_eq!(
        label(&node, LABEL_TOPOLOGY_ZONE),
        None,
        "no Zones, no zone label"
    );
    assert_eq!(label(&node, LABEL_TOPOLOGY_REGION), None);
    assert_eq!(fake.call_count("instance_type"), 1);
    assert_eq!(fake.call_count("node_addresses"), 1);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn legacy_instance_id_not_implemented_initializes_without_provider_id() {
    let t = Test::start().await;
    let fake = FakeCloud::builder()
        .instances_v2(false)
        .legacy_instances(true)
        .build();
    fake.inject("instance_id", Fault::NotImplemented);
    let name = t.name("v1-noid");
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let node = t.wait_initialized(&name).await;
    assert_eq!(provider_id(&node), None);
    assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some("fake-small"));
    // Without a providerID the by-name lookups are used directly.
    assert_eq!(fake.call_count("instance_type_by_provider_id"), 0);
    assert_eq!(fake.call_count("instance_type"), 1);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn empty_provider_id_keeps_the_node_tainted() {
    let t = Test::start().await;
    let probe = Probe::new(FakeCloud::default(), |m| m.provider_id.clear());
    let bare = t.name("noid");
    let preset = t.name("preset");
    t.create(&t.registered_node(&bare).build()).await;
    t.create(
        &t.registered_node(&preset)
            .provider_id(&format!("fake://{preset}"))
            .build(),
    )
    .await;
    let running = t
        .run_cloud_node(probe.clone(), quiet_cloud_node_config())
        .await;

    // The node that already has a providerID is initialised with it.
    let node = t.wait_initialized(&preset).await;
    assert_eq!(
        provider_id(&node),
        Some(format!("fake://{preset}").as_str())
    );
    // The other stays tainted, with a Warning naming the step.
    let (type_, _, note) = t.wait_event(&bare, "SyncFailed").await;
    assert_eq!(type_, "Warning");
    assert!(note.contains("providerID"), "{note}");
    assert!(
        note.contains("cloud provider does not set node provider ID"),
        "{note}"
    );
    let node = t.nodes.get(&bare).await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(provider_id(&node), None);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// Labels

#[tokio::test]
async fn additional_labels_are_filtered_and_never_overwrite() {
    let t = Test::start().await;
    let fake = FakeCloud::builder()
        .additional_label("example.com/pool", "blue")
        .additional_label("example.com/rack", "r1")
        .additional_label("node.kubernetes.io/sneaky", "x")
        .additional_label("k8s.io/sneaky", "x")
        .build();
    let name = t.name("labels");
    t.create(
        &t.registered_node(&name)
            .label("example.com/pool", "green")
            .label(LABEL_TOPOLOGY_ZONE, "stale-zone")
            .build(),
    )
    .await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let node = t.wait_initialized(&name).await;
    assert_eq!(
        label(&node, "example.com/pool"),
        Some("green"),
        "never overwritten"
    );
    assert_eq!(label(&node, "example.com/rack"), Some("r1"));
    assert_eq!(label(&node, "node.kubernetes.io/sneaky"), None);
    assert_eq!(label(&node, "k8s.io/sneaky"), None);
    // The well-known labels are set from the cloud, as Go does.
    assert_eq!(label(&node, LABEL_TOPOLOGY_ZONE), Some("zone-a"));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn label_reconcile_of_initialized_nodes_needs_no_cloud() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    // Every cloud call fails: the label reconcile must not need one.
    fake.inject("instance_metadata", Fault::NotImplemented);
    let name = t.name("reconcile");
    t.create(
        &t.registered_node(&name)
            .without_uninitialized_taint()
            .provider_id(&format!("fake://{name}"))
            .label(LABEL_FAILURE_DOMAIN_BETA_ZONE, "z1")
            .label(LABEL_FAILURE_DOMAIN_BETA_REGION, "r1")
            .label(LABEL_TOPOLOGY_REGION, "old-region")
            .label(LABEL_INSTANCE_TYPE_BETA, "big")
            .label(LABEL_INSTANCE_TYPE, "big")
            .build(),
    )
    .await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let node = wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        label(n, LABEL_TOPOLOGY_ZONE) == Some("z1") && label(n, LABEL_TOPOLOGY_REGION) == Some("r1")
    })
    .await
    .unwrap();
    assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some("big"));
    assert_eq!(label(&node, LABEL_FAILURE_DOMAIN_BETA_ZONE), Some("z1"));

    // A later change of the beta label is followed again.
    t.nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL_FAILURE_DOMAIN_BETA_ZONE: "z2"}}})),
        )
        .await
        .unwrap();
    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        label(n, LABEL_TOPOLOGY_ZONE) == Some("z2")
    })
    .await
    .unwrap();
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}
