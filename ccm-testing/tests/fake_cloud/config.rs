//! Capabilities, cluster names, the config file (YAML and JSON, with its errors) and the
//! registry factory.

use std::time::Duration;

use ccm_core::CloudProvider;
use ccm_testing::fake_cloud::{
    Capabilities, FakeCloud, FakeCloudConfig, FakeCloudConfigError, Fault,
};

use crate::support::{UID, addr, node, service};

#[test]
fn capability_defaults_and_switches() {
    let cloud = FakeCloud::default();
    assert!(cloud.instances_v2().is_some());
    assert!(cloud.instances().is_none(), "v1 off by default");
    assert!(cloud.zones().is_none(), "zones off by default");
    assert!(cloud.load_balancer().is_some());
    assert!(CloudProvider::routes(&cloud).is_some());
    assert!(cloud.clusters().is_some());
    assert!(
        cloud.load_balancer_hosts_batch().is_none(),
        "batch off by default"
    );

    let cloud = FakeCloud::builder()
        .instances_v2(false)
        .legacy_instances(true)
        .load_balancer(false)
        .routes(false)
        .cluster_listing(false)
        .build();
    assert!(cloud.instances_v2().is_none());
    assert!(cloud.instances().is_some());
    assert!(cloud.zones().is_some());
    assert!(cloud.load_balancer().is_none());
    assert!(CloudProvider::routes(&cloud).is_none());
    assert!(cloud.clusters().is_none());

    let cloud = FakeCloud::builder()
        .capabilities(Capabilities {
            instances_v2: false,
            instances: true,
            zones: false,
            load_balancer: true,
            routes: false,
            clusters: false,
            instances_batch: false,
            load_balancer_hosts_batch: true,
        })
        .build();
    assert!(cloud.instances().is_some() && cloud.zones().is_none());
    assert!(cloud.provider().load_balancer().is_some());
    assert!(cloud.provider().load_balancer_hosts_batch().is_some());
    // The batch needs the load-balancer capability.
    let cloud = FakeCloud::builder()
        .load_balancer(false)
        .load_balancer_hosts_batch(true)
        .build();
    assert!(cloud.provider().load_balancer_hosts_batch().is_none());
}

#[tokio::test]
async fn clusters_lists_configured_names() {
    let cloud = FakeCloud::default();
    let clusters = cloud.clusters().unwrap();
    assert_eq!(clusters.list_clusters().await.unwrap(), ["kubernetes"]);
    let cloud = FakeCloud::builder().clusters(&["prod", "dev"]).build();
    let clusters = cloud.clusters().unwrap();
    assert_eq!(clusters.list_clusters().await.unwrap(), ["prod", "dev"]);
    assert_eq!(
        clusters.master("prod").await.unwrap(),
        "https://prod.fake.invalid:6443"
    );
    assert!(clusters.master("other").await.is_err());
}

#[tokio::test]
async fn config_file_drives_every_field() {
    let yaml = br#"
latency_ms: 0
operation_latency_ms: {instance_exists: 0}
zone: z9
region: r9
instance_type: big
external_ip: true
additional_labels: {example.com/team: a}
missing_nodes: ["gone-.*"]
shutdown_nodes: ["off-.*"]
lb_ip: 192.0.2.44
track_node_addresses: true
clusters: [one]
capabilities: {instances: true, zones: true, routes: false}
faults:
  instance_id: [instance_not_found]
  get_zone: [not_implemented]
  ensure_load_balancer: [{fail_next: 1}]
  update_load_balancer: [{retry: {after_ms: 250, count: 1}}]
  list_clusters: [{fail_with_probability: {p: 1.0, seed: 3}}]
"#;
    let provider = FakeCloud::from_cloud_config(Some(yaml)).unwrap();
    assert_eq!(provider.provider_name(), "fake");
    assert!(provider.routes().is_none());
    let v2 = provider.instances_v2().unwrap();
    let meta = v2.instance_metadata(&node("n")).await.unwrap();
    assert_eq!(
        (
            meta.zone.as_str(),
            meta.region.as_str(),
            meta.instance_type.as_str()
        ),
        ("z9", "r9", "big")
    );
    assert_eq!(meta.additional_labels["example.com/team"], "a");
    assert!(addr(&meta.node_addresses, "ExternalIP").is_some());
    assert!(!v2.instance_exists(&node("gone-1")).await.unwrap());
    assert!(v2.instance_shutdown(&node("off-1")).await.unwrap());
    let v1 = provider.instances().unwrap();
    assert!(
        v1.instance_id("n")
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
    assert!(
        provider
            .zones()
            .unwrap()
            .get_zone()
            .await
            .unwrap_err()
            .is_not_implemented()
    );
    let lb = provider.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    assert!(lb.ensure_load_balancer("c", &svc, &[]).await.is_err());
    let status = lb.ensure_load_balancer("c", &svc, &[]).await.unwrap();
    assert_eq!(status.ingress.unwrap()[0].ip.as_deref(), Some("192.0.2.44"));
    assert_eq!(
        lb.update_load_balancer("c", &svc, &[])
            .await
            .unwrap_err()
            .retry_after(),
        Some(Duration::from_millis(250))
    );
    assert!(provider.clusters().unwrap().list_clusters().await.is_err());
}

#[test]
fn config_accepts_json_and_defaults_without_a_file() {
    let json = br#"{"zone": "j1", "faults": {"instance_metadata": [{"fail_next": 3}]}, "lb_hostname": "h"}"#;
    let config: FakeCloudConfig = ccm_core::parse_cloud_config(json).unwrap();
    assert_eq!(config.zone, "j1");
    assert_eq!(config.faults["instance_metadata"], [Fault::FailNext(3)]);
    assert_eq!(config.lb_hostname.as_deref(), Some("h"));
    assert_eq!(
        config.region, "region-1",
        "unset fields keep their defaults"
    );

    let provider = FakeCloud::from_cloud_config(None).unwrap();
    assert!(provider.instances_v2().is_some());
    assert!(provider.instances().is_none());

    // Round trip through serde, so the example can print its effective config.
    let yaml = serde_norway::to_string(&config).unwrap();
    let back: FakeCloudConfig = ccm_core::parse_cloud_config(yaml.as_bytes()).unwrap();
    assert_eq!(back, config);
}

#[test]
fn bad_configs_are_rejected_with_a_message_naming_the_problem() {
    let err = |yaml: &str| {
        FakeCloud::from_cloud_config(Some(yaml.as_bytes()))
            .err()
            .expect("config must be rejected")
            .to_string()
    };
    let e = err("zone: a\nlatency: 3\n");
    assert!(
        e.contains("line 2") && e.contains("unknown field `latency`"),
        "{e}"
    );
    let e = err("missing_nodes: ['node-[']\n");
    assert!(e.contains("missing_nodes") && e.contains("node-["), "{e}");
    let e = err("faults: {ensure_loadbalancer: [not_implemented]}\n");
    assert!(
        e.contains("ensure_loadbalancer") && e.contains("unknown operation"),
        "{e}"
    );
    let e = err("operation_latency_ms: {nope: 1}\n");
    assert!(e.contains("nope"), "{e}");
    let e = err("lb_ip: not-an-ip\n");
    assert!(e.contains("lb_ip") && e.contains("not-an-ip"), "{e}");
    let e = err("faults: {instance_exists: [{fail_with_probability: {p: 1.5, seed: 1}}]}\n");
    assert!(e.contains("1.5"), "{e}");
    let e = err("faults: {instance_exists: [{retry: {after: 3, count: 1}}]}\n");
    assert!(e.contains("after"), "{e}");
    let e = err("capabilities: {instances_v3: true}\n");
    assert!(e.contains("instances_v3"), "{e}");

    assert!(matches!(
        FakeCloud::builder().missing_node("(").try_build(),
        Err(FakeCloudConfigError::InvalidPattern { .. })
    ));
    // The infallible constructor ignores the bad pattern instead of failing.
    let cloud = FakeCloud::builder()
        .missing_node("(")
        .missing_node("x")
        .build();
    assert_eq!(cloud.config().missing_nodes, ["(", "x"]);
}

#[tokio::test]
async fn registry_factory_builds_a_working_provider() {
    ccm_core::register_cloud_provider!("fake-cloud-test", FakeCloud::from_cloud_config);
    let provider = ccm_core::build_provider("fake-cloud-test", Some(b"zone: reg-z\n")).unwrap();
    let meta = provider
        .instances_v2()
        .unwrap()
        .instance_metadata(&node("n"))
        .await
        .unwrap();
    assert_eq!(meta.zone, "reg-z");
}
