#![allow(clippy::unwrap_used, clippy::expect_used)]
//! FakeCloud: one test (at least) per configuration field and per fault mode.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec};
use ccm_core::{CloudError, CloudProvider, Node, NodeAddress, ObjectMeta, Route, Service};
use ccm_testing::fake_cloud::{
    Capabilities, FakeCloud, FakeCloudConfig, FakeCloudConfigError, Fault, OPERATIONS,
};

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn node_with_provider_id(name: &str, provider_id: &str) -> Node {
    Node {
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.into()),
            ..Default::default()
        }),
        ..node(name)
    }
}

/// A load-balancer host, as the framework passes it (shared from its Node cache).
fn host(name: &str) -> Arc<Node> {
    Arc::new(node(name))
}

fn service(namespace: &str, name: &str, uid: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![
                ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    ..Default::default()
                },
                ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn addr(cloud_addresses: &[NodeAddress], type_: &str) -> Option<String> {
    cloud_addresses
        .iter()
        .find(|a| a.type_ == type_)
        .map(|a| a.address.clone())
}

const UID: &str = "2f3c6a1e-9b7d-4c1a-8e5f-0123456789ab";

// ---------------------------------------------------------------- node metadata

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

// ---------------------------------------------------------------- missing / shutdown

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

// ---------------------------------------------------------------- latency

#[tokio::test(start_paused = true)]
async fn latency_applies_to_every_call_and_can_be_overridden_per_operation() {
    let cloud = FakeCloud::builder()
        .latency(Duration::from_millis(100))
        .operation_latency("ensure_load_balancer", Duration::from_secs(5))
        .build();
    let v2 = cloud.instances_v2().unwrap();
    // Virtual time: the call cannot finish before its latency has elapsed.
    let n = node("n");
    let early = tokio::time::timeout(Duration::from_millis(99), v2.instance_exists(&n)).await;
    assert!(early.is_err(), "finished before latency_ms");
    let start = tokio::time::Instant::now();
    assert!(v2.instance_exists(&n).await.unwrap());
    assert_eq!(start.elapsed(), Duration::from_millis(100));

    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    let start = tokio::time::Instant::now();
    lb.ensure_load_balancer("c", &svc, &[]).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));

    cloud.set_latency(Duration::ZERO);
    let start = tokio::time::Instant::now();
    v2.instance_exists(&n).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_during_its_latency_changes_nothing() {
    let cloud = FakeCloud::builder().latency(Duration::from_secs(1)).build();
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    let cancelled = tokio::time::timeout(
        Duration::from_millis(10),
        lb.ensure_load_balancer("c", &svc, &[]),
    )
    .await;
    assert!(cancelled.is_err());
    assert_eq!(cloud.call_count("ensure_load_balancer"), 1, "counted");
    assert!(cloud.load_balancers().is_empty(), "but created nothing");
    // A FailNext fault is not consumed by a cancelled call either.
    cloud.inject("ensure_load_balancer", Fault::FailNext(1));
    let _ = tokio::time::timeout(
        Duration::from_millis(10),
        lb.ensure_load_balancer("c", &svc, &[]),
    )
    .await;
    assert!(lb.ensure_load_balancer("c", &svc, &[]).await.is_err());
    assert!(lb.ensure_load_balancer("c", &svc, &[]).await.is_ok());
}

// ---------------------------------------------------------------- load balancers

#[tokio::test]
async fn load_balancer_lifecycle_remembers_hosts_and_ports() {
    let cloud = FakeCloud::default();
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    assert_eq!(lb.get_load_balancer("c1", &svc).await.unwrap(), None);

    let hosts = [host("n2"), host("n1"), host("n2")];
    let status = lb.ensure_load_balancer("c1", &svc, &hosts).await.unwrap();
    let ingress = status.ingress.clone().unwrap();
    assert_eq!(ingress.len(), 1);
    // The first load balancer gets the lowest address of the default range.
    assert_eq!(ingress[0].ip.as_deref(), Some("203.0.113.1"));
    assert_eq!(ingress[0].hostname, None);

    let state = cloud.load_balancers();
    let web = &state["ns/web"];
    assert_eq!(web.name, "a2f3c6a1e9b7d4c1a8e5f0123456789a");
    assert_eq!(web.hosts, ["n1", "n2"]);
    assert_eq!(web.ports, [80, 443]);
    assert_eq!(web.cluster_name, "c1");

    assert_eq!(
        lb.get_load_balancer("c1", &svc).await.unwrap(),
        Some(status.clone())
    );
    // Another cluster never sees it, nor deletes it.
    assert_eq!(lb.get_load_balancer("c2", &svc).await.unwrap(), None);
    lb.ensure_load_balancer_deleted("c2", &svc).await.unwrap();
    assert!(lb.get_load_balancer("c1", &svc).await.unwrap().is_some());

    lb.update_load_balancer("c1", &svc, &[host("n3")])
        .await
        .unwrap();
    assert_eq!(cloud.load_balancers()["ns/web"].hosts, ["n3"]);

    // Idempotent ensure.
    assert_eq!(
        lb.ensure_load_balancer("c1", &svc, &hosts).await.unwrap(),
        status
    );
    assert_eq!(cloud.load_balancers().len(), 1);

    lb.ensure_load_balancer_deleted("c1", &svc).await.unwrap();
    assert_eq!(lb.get_load_balancer("c1", &svc).await.unwrap(), None);
    assert!(cloud.load_balancers().is_empty());
    // Deleting what does not exist succeeds; updating it fails.
    lb.ensure_load_balancer_deleted("c1", &svc).await.unwrap();
    let err = lb
        .update_load_balancer("c1", &svc, &[host("n1")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ns/web"), "{err}");
}

#[tokio::test]
async fn lb_ip_and_lb_hostname_set_the_ingress() {
    let svc = service("ns", "web", UID);
    let cloud = FakeCloud::builder().lb_ip("198.51.100.7").build();
    let status = cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer("c", &svc, &[])
        .await
        .unwrap();
    assert_eq!(
        status.ingress.unwrap()[0].ip.as_deref(),
        Some("198.51.100.7")
    );

    let cloud = FakeCloud::builder().lb_hostname("lb.example.com").build();
    let lb = cloud.load_balancer().unwrap();
    let status = lb.ensure_load_balancer("c", &svc, &[]).await.unwrap();
    let ingress = status.ingress.unwrap();
    assert_eq!(ingress[0].hostname.as_deref(), Some("lb.example.com"));
    assert_eq!(ingress[0].ip, None);
    let got = lb.get_load_balancer("c", &svc).await.unwrap().unwrap();
    assert_eq!(
        got.ingress.unwrap()[0].hostname.as_deref(),
        Some("lb.example.com")
    );
}

// ---------------------------------------------------------------- routes

fn route(node_name: &str, cidr: &str) -> Route {
    Route {
        target_node: node_name.into(),
        destination_cidr: cidr.into(),
        target_node_addresses: vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "10.1.2.3".into(),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn route_table_create_list_delete_and_idempotence() {
    let cloud = FakeCloud::default();
    let routes = CloudProvider::routes(&cloud).unwrap();
    let r = route("n1", "10.244.1.0/24");
    routes.create_route("c1", "uid-1", &r).await.unwrap();
    // Creating it again succeeds and does not duplicate it.
    routes.create_route("c1", "uid-1", &r).await.unwrap();
    let listed = routes.list_routes("c1").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "c1-uid-1");
    assert_eq!(listed[0].target_node, "n1");
    assert_eq!(listed[0].destination_cidr, "10.244.1.0/24");
    assert_eq!(listed[0].target_node_addresses, r.target_node_addresses);
    assert!(!listed[0].enable_node_addresses, "not tracked by default");
    // Another cluster does not see it.
    assert!(routes.list_routes("c2").await.unwrap().is_empty());

    routes.delete_route("c1", &listed[0]).await.unwrap();
    assert!(routes.list_routes("c1").await.unwrap().is_empty());
    // Deleting a missing route succeeds.
    routes.delete_route("c1", &listed[0]).await.unwrap();
    assert!(FakeCloud::routes(&cloud).is_empty());
}

#[tokio::test]
async fn seeded_routes_are_listed_for_every_cluster_and_deletable() {
    let cloud = FakeCloud::default();
    cloud.insert_route(Route {
        destination_cidr: "10.244.9.0/24".into(),
        target_node: "old".into(),
        blackhole: true,
        ..Default::default()
    });
    let routes = CloudProvider::routes(&cloud).unwrap();
    let listed = routes.list_routes("any").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "seed-10.244.9.0/24");
    assert!(listed[0].blackhole);
    routes.delete_route("any", &listed[0]).await.unwrap();
    assert!(cloud.routes().is_empty());
}

#[tokio::test]
async fn track_node_addresses_sets_enable_node_addresses_on_list() {
    let cloud = FakeCloud::builder().track_node_addresses(true).build();
    let routes = CloudProvider::routes(&cloud).unwrap();
    routes
        .create_route("c", "uid", &route("n1", "10.244.0.0/24"))
        .await
        .unwrap();
    let listed = routes.list_routes("c").await.unwrap();
    assert!(listed[0].enable_node_addresses);
}

// ---------------------------------------------------------------- capabilities & clusters

#[test]
fn capability_defaults_and_switches() {
    let cloud = FakeCloud::default();
    assert!(cloud.instances_v2().is_some());
    assert!(cloud.instances().is_none(), "v1 off by default");
    assert!(cloud.zones().is_none(), "zones off by default");
    assert!(cloud.load_balancer().is_some());
    assert!(CloudProvider::routes(&cloud).is_some());
    assert!(cloud.clusters().is_some());

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
        })
        .build();
    assert!(cloud.instances().is_some() && cloud.zones().is_none());
    assert!(cloud.provider().load_balancer().is_some());
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

// ---------------------------------------------------------------- faults

#[tokio::test]
async fn fail_next_fails_exactly_n_calls_and_changes_nothing() {
    let cloud = FakeCloud::default();
    cloud.inject("ensure_load_balancer", Fault::FailNext(2));
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    for _ in 0..2 {
        let err = lb.ensure_load_balancer("c", &svc, &[]).await.unwrap_err();
        assert!(matches!(err, CloudError::Other(_)));
        assert_eq!(
            err.to_string(),
            "fake cloud: injected failure of ensure_load_balancer"
        );
        assert!(cloud.load_balancers().is_empty());
    }
    lb.ensure_load_balancer("c", &svc, &[]).await.unwrap();
    assert_eq!(cloud.call_count("ensure_load_balancer"), 3);
    // Other operations are not affected.
    assert!(lb.get_load_balancer("c", &svc).await.unwrap().is_some());
}

async fn probability_pattern(seed: u64, p: f64) -> Vec<bool> {
    let cloud = FakeCloud::default();
    cloud.inject("instance_exists", Fault::FailWithProbability { p, seed });
    let v2 = cloud.instances_v2().unwrap();
    let mut out = Vec::new();
    for _ in 0..200 {
        out.push(v2.instance_exists(&node("n")).await.is_err());
    }
    out
}

#[tokio::test]
async fn fail_with_probability_is_seeded_and_reproducible() {
    let a = probability_pattern(7, 0.3).await;
    let b = probability_pattern(7, 0.3).await;
    assert_eq!(a, b, "same seed, same failures");
    let c = probability_pattern(8, 0.3).await;
    assert_ne!(a, c, "another seed, other failures");
    let failures = a.iter().filter(|f| **f).count();
    assert!(
        (30..=90).contains(&failures),
        "p=0.3 of 200 calls: {failures}"
    );
    assert!(probability_pattern(1, 0.0).await.iter().all(|f| !f));
    assert!(probability_pattern(1, 1.0).await.iter().all(|f| *f));
    // Out-of-range probabilities given to inject() are clamped, never a panic.
    assert!(probability_pattern(1, f64::NAN).await.iter().all(|f| !f));
    assert!(probability_pattern(1, 7.0).await.iter().all(|f| *f));
}

#[tokio::test]
async fn retry_answers_retry_after_for_count_calls() {
    let cloud = FakeCloud::default();
    cloud.inject(
        "ensure_load_balancer",
        Fault::Retry {
            after: Duration::from_millis(1500),
            count: 2,
        },
    );
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    for _ in 0..2 {
        let err = lb.ensure_load_balancer("c", &svc, &[]).await.unwrap_err();
        assert_eq!(err.retry_after(), Some(Duration::from_millis(1500)));
    }
    assert!(lb.ensure_load_balancer("c", &svc, &[]).await.is_ok());
}

#[tokio::test]
async fn not_implemented_and_instance_not_found_persist_until_cleared() {
    let cloud = FakeCloud::builder().legacy_instances(true).build();
    cloud.inject("instance_shutdown", Fault::NotImplemented);
    cloud.inject("instance_id", Fault::InstanceNotFound);
    let v2 = cloud.instances_v2().unwrap();
    let v1 = cloud.instances().unwrap();
    for _ in 0..3 {
        assert!(
            v2.instance_shutdown(&node("n"))
                .await
                .unwrap_err()
                .is_not_implemented()
        );
        assert!(
            v1.instance_id("n")
                .await
                .unwrap_err()
                .is_instance_not_found()
        );
    }
    cloud.clear_faults();
    assert!(!v2.instance_shutdown(&node("n")).await.unwrap());
    assert_eq!(v1.instance_id("n").await.unwrap(), "n");
}

#[tokio::test]
async fn faults_are_consulted_in_the_order_armed() {
    let cloud = FakeCloud::default();
    cloud.inject("instance_metadata", Fault::FailNext(1));
    cloud.inject(
        "instance_metadata",
        Fault::Retry {
            after: Duration::from_secs(3),
            count: 1,
        },
    );
    let v2 = cloud.instances_v2().unwrap();
    let first = v2.instance_metadata(&node("n")).await.unwrap_err();
    assert!(first.retry_after().is_none());
    let second = v2.instance_metadata(&node("n")).await.unwrap_err();
    assert_eq!(second.retry_after(), Some(Duration::from_secs(3)));
    assert!(v2.instance_metadata(&node("n")).await.is_ok());
}

// ---------------------------------------------------------------- inspection & concurrency

#[tokio::test]
async fn call_counts_and_log_use_snake_case_method_names() {
    let cloud = FakeCloud::builder().legacy_instances(true).build();
    let provider = cloud.provider();
    let svc = service("ns", "web", UID);
    provider
        .instances_v2()
        .unwrap()
        .instance_metadata(&node("n1"))
        .await
        .unwrap();
    provider
        .instances()
        .unwrap()
        .instance_exists_by_provider_id("fake://n1")
        .await
        .unwrap();
    let lb = provider.load_balancer().unwrap();
    lb.ensure_load_balancer("c", &svc, &[host("n1")])
        .await
        .unwrap();
    lb.update_load_balancer("c", &svc, &[]).await.unwrap();
    provider
        .routes()
        .unwrap()
        .create_route("c", "u", &route("n1", "10.244.0.0/24"))
        .await
        .unwrap();

    assert_eq!(cloud.call_count("instance_metadata"), 1);
    assert_eq!(cloud.call_count("update_load_balancer"), 1);
    assert_eq!(cloud.call_count("get_load_balancer"), 0);
    let counts = cloud.call_counts();
    assert_eq!(
        counts.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "create_route",
            "ensure_load_balancer",
            "instance_exists_by_provider_id",
            "instance_metadata",
            "update_load_balancer"
        ]
    );
    for op in counts.keys() {
        assert!(OPERATIONS.contains(&op.as_str()), "{op}");
    }
    let log: Vec<(String, String)> = cloud
        .call_log()
        .into_iter()
        .map(|c| (c.operation, c.subject))
        .collect();
    let expected = [
        ("instance_metadata", "n1"),
        ("instance_exists_by_provider_id", "fake://n1"),
        ("ensure_load_balancer", "ns/web"),
        ("update_load_balancer", "ns/web"),
        ("create_route", "10.244.0.0/24"),
    ];
    assert_eq!(
        log,
        expected
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect::<Vec<_>>()
    );
    cloud.reset_calls();
    assert!(cloud.call_log().is_empty());
    assert_eq!(cloud.call_count("instance_metadata"), 0);
    // State survives a reset of the calls.
    assert_eq!(cloud.load_balancers().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_from_many_tasks_are_all_recorded_and_consistent() {
    let cloud = FakeCloud::builder()
        .latency(Duration::from_millis(1))
        .build();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let cloud = cloud.clone();
        tasks.push(tokio::spawn(async move {
            let lb = cloud.load_balancer().unwrap();
            let svc = service("ns", &format!("svc-{}", i % 8), &format!("uid-{}", i % 8));
            lb.ensure_load_balancer("c", &svc, &[host(&format!("n{i}"))])
                .await
                .unwrap();
            let meta = cloud
                .instances_v2()
                .unwrap()
                .instance_metadata(&node("shared"))
                .await
                .unwrap();
            meta.node_addresses
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(cloud.call_count("ensure_load_balancer"), 64);
    assert_eq!(cloud.call_count("instance_metadata"), 64);
    assert_eq!(cloud.call_log().len(), 128);
    assert_eq!(cloud.load_balancers().len(), 8);
}

// ---------------------------------------------------------------- config file

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

#[tokio::test]
async fn initialize_is_counted_and_can_be_faulted() {
    let cloud = FakeCloud::default();
    let ctx =
        || ccm_core::InitContext::new(None::<()>, ccm_core::CancellationToken::new(), "kubernetes");
    cloud.initialize(ctx()).await.unwrap();
    cloud.inject("initialize", Fault::FailNext(1));
    assert!(cloud.initialize(ctx()).await.is_err());
    assert_eq!(cloud.call_count("initialize"), 2);
    // An unknown operation name never fires (and is logged).
    cloud.inject("instance_metadatas", Fault::NotImplemented);
    assert!(
        cloud
            .instances_v2()
            .unwrap()
            .instance_metadata(&node("n"))
            .await
            .is_ok()
    );
}
