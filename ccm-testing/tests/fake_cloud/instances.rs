//! Instances: the default and configured metadata, addresses, lookups by provider ID, and
//! missing and shut-down nodes.

use std::collections::BTreeMap;

use ccm_core::CloudProvider;
use ccm_testing::fake_cloud::FakeCloud;

use crate::support::{addr, node, node_with_provider_id};

#[tokio::test]
async fn default_metadata_matches_the_documented_values() {
    let cloud = FakeCloud::default();
    assert_eq!(cloud.provider_name(), "fake");
    let meta = cloud
        .instances_v2()
        .unwrap()
        .instance_metadata(&node("worker-1"))
        .await
        .unwrap();
    assert_eq!(meta.provider_id, "fake://worker-1");
    assert_eq!(meta.zone, "zone-a");
    assert_eq!(meta.region, "region-1");
    assert_eq!(meta.instance_type, "fake-small");
    assert!(meta.additional_labels.is_empty());
    let types: Vec<_> = meta
        .node_addresses
        .iter()
        .map(|a| a.type_.as_str())
        .collect();
    assert_eq!(
        types,
        ["InternalIP", "Hostname"],
        "no ExternalIP by default"
    );
    assert_eq!(
        addr(&meta.node_addresses, "Hostname").as_deref(),
        Some("worker-1")
    );
    let ip: std::net::Ipv4Addr = addr(&meta.node_addresses, "InternalIP")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(ip.octets()[0], 10);
}

#[tokio::test]
async fn internal_ip_is_stable_distinct_and_never_network_or_broadcast() {
    let a = FakeCloud::default();
    let b = FakeCloud::default();
    let mut seen = BTreeMap::new();
    for i in 0..300 {
        let name = format!("node-{i}");
        let m1 = a
            .instances_v2()
            .unwrap()
            .instance_metadata(&node(&name))
            .await
            .unwrap();
        let m2 = b
            .instances_v2()
            .unwrap()
            .instance_metadata(&node(&name))
            .await
            .unwrap();
        assert_eq!(m1, m2, "same name, same metadata across instances");
        let ip: std::net::Ipv4Addr = addr(&m1.node_addresses, "InternalIP")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(ip.octets()[0], 10);
        assert!(!matches!(ip.octets()[3], 0 | 255), "{ip}");
        seen.insert(ip, name);
    }
    assert!(
        seen.len() >= 295,
        "hash spreads names: {} distinct",
        seen.len()
    );
    // Pinned: the derivation must not change between releases (FNV-1a of the name).
    let meta = a
        .instances_v2()
        .unwrap()
        .instance_metadata(&node("worker-1"))
        .await
        .unwrap();
    assert_eq!(
        addr(&meta.node_addresses, "InternalIP").unwrap(),
        PINNED_WORKER_1_IP
    );
}

const PINNED_WORKER_1_IP: &str = "10.235.39.212";

#[tokio::test]
async fn zone_region_instance_type_labels_and_external_ip_are_configurable() {
    let cloud = FakeCloud::builder()
        .zone("eu-1a")
        .region("eu-1")
        .instance_type("fake-large")
        .additional_label("example.com/pool", "blue")
        .external_ip(true)
        .legacy_instances(true)
        .build();
    let meta = cloud
        .instances_v2()
        .unwrap()
        .instance_metadata(&node("n1"))
        .await
        .unwrap();
    assert_eq!(meta.zone, "eu-1a");
    assert_eq!(meta.region, "eu-1");
    assert_eq!(meta.instance_type, "fake-large");
    assert_eq!(
        meta.additional_labels,
        BTreeMap::from([("example.com/pool".to_owned(), "blue".to_owned())])
    );
    let types: Vec<_> = meta
        .node_addresses
        .iter()
        .map(|a| a.type_.as_str())
        .collect();
    assert_eq!(types, ["InternalIP", "ExternalIP", "Hostname"]);
    let ext: std::net::Ipv4Addr = addr(&meta.node_addresses, "ExternalIP")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(ext.octets()[0], 198);
    assert!(matches!(ext.octets()[1], 18 | 19), "{ext}");

    // The legacy path answers the same values.
    let v1 = cloud.instances().unwrap();
    assert_eq!(v1.instance_type("n1").await.unwrap(), "fake-large");
    assert_eq!(
        v1.instance_type_by_provider_id("fake://n1").await.unwrap(),
        "fake-large"
    );
    assert_eq!(v1.node_addresses("n1").await.unwrap(), meta.node_addresses);
    assert_eq!(
        v1.node_addresses_by_provider_id("fake://n1").await.unwrap(),
        meta.node_addresses
    );
    assert_eq!(v1.instance_id("n1").await.unwrap(), "n1");
    let zones = cloud.zones().unwrap();
    let zone = zones.get_zone_by_node_name("n1").await.unwrap();
    assert_eq!(
        (zone.failure_domain.as_str(), zone.region.as_str()),
        ("eu-1a", "eu-1")
    );
    assert_eq!(
        zones.get_zone_by_provider_id("fake://n1").await.unwrap(),
        zone
    );
    assert_eq!(zones.get_zone().await.unwrap(), zone);
}

#[tokio::test]
async fn instance_is_found_by_provider_id_first() {
    let cloud = FakeCloud::builder().missing_node("gone").build();
    let v2 = cloud.instances_v2().unwrap();
    // The providerID names the instance, whatever the Node is called.
    let meta = v2
        .instance_metadata(&node_with_provider_id("renamed", "fake://original"))
        .await
        .unwrap();
    assert_eq!(meta.provider_id, "fake://original");
    assert_eq!(
        addr(&meta.node_addresses, "Hostname").as_deref(),
        Some("original")
    );
    assert!(
        !v2.instance_exists(&node_with_provider_id("alive", "fake://gone"))
            .await
            .unwrap()
    );
    // A provider ID of another provider is an error, never "gone".
    let err = v2
        .instance_exists(&node_with_provider_id("x", "acme://x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("acme"), "{err}");
}

#[tokio::test]
async fn missing_nodes_are_gone_not_errors_and_lookups_say_instance_not_found() {
    let cloud = FakeCloud::builder()
        .missing_node("gone-.*")
        .legacy_instances(true)
        .build();
    let v2 = cloud.instances_v2().unwrap();
    assert!(!v2.instance_exists(&node("gone-1")).await.unwrap());
    assert!(!v2.instance_shutdown(&node("gone-1")).await.unwrap());
    assert!(
        v2.instance_metadata(&node("gone-1"))
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
    // The pattern must match the whole name.
    assert!(v2.instance_exists(&node("not-gone-1")).await.unwrap());

    let v1 = cloud.instances().unwrap();
    assert!(
        !v1.instance_exists_by_provider_id("fake://gone-1")
            .await
            .unwrap()
    );
    assert!(
        !v1.instance_shutdown_by_provider_id("fake://gone-1")
            .await
            .unwrap()
    );
    assert!(
        v1.instance_id("gone-1")
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
    assert!(
        v1.node_addresses("gone-1")
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
    assert!(
        v1.node_addresses_by_provider_id("fake://gone-1")
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
    assert!(
        v1.instance_type("gone-1")
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
    let zones = cloud.zones().unwrap();
    assert!(
        zones
            .get_zone_by_node_name("gone-1")
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
}

#[tokio::test]
async fn shutdown_nodes_exist_and_are_shut_down() {
    let cloud = FakeCloud::builder()
        .shutdown_node("stopped-[0-9]+")
        .legacy_instances(true)
        .build();
    let v2 = cloud.instances_v2().unwrap();
    assert!(v2.instance_exists(&node("stopped-1")).await.unwrap());
    assert!(v2.instance_shutdown(&node("stopped-1")).await.unwrap());
    assert!(v2.instance_metadata(&node("stopped-1")).await.is_ok());
    assert!(!v2.instance_shutdown(&node("running-1")).await.unwrap());
    let v1 = cloud.instances().unwrap();
    assert!(
        v1.instance_exists_by_provider_id("fake://stopped-1")
            .await
            .unwrap()
    );
    assert!(
        v1.instance_shutdown_by_provider_id("fake://stopped-1")
            .await
            .unwrap()
    );
    assert_eq!(v1.instance_id("stopped-1").await.unwrap(), "stopped-1");
}

#[tokio::test]
async fn missing_and_shutdown_patterns_can_change_at_runtime() {
    let cloud = FakeCloud::default();
    let clone = cloud.clone();
    let v2 = cloud.instances_v2().unwrap();
    assert!(v2.instance_exists(&node("a")).await.unwrap());
    clone.set_missing_nodes(&["a", "b"]);
    assert!(!v2.instance_exists(&node("a")).await.unwrap());
    assert!(!v2.instance_exists(&node("b")).await.unwrap());
    clone.set_shutdown_nodes(&["c.*"]);
    assert!(v2.instance_shutdown(&node("c1")).await.unwrap());
    // Missing wins over shut down.
    clone.set_shutdown_nodes(&["a"]);
    assert!(!v2.instance_shutdown(&node("a")).await.unwrap());
    clone.set_missing_nodes(&[]);
    assert!(v2.instance_exists(&node("a")).await.unwrap());
    assert!(v2.instance_shutdown(&node("a")).await.unwrap());
}
