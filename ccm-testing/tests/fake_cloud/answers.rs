//! FakeCloud: per-Node answers, one ingress IP per load balancer, call records with their
//! arguments, the quota, the batch capability and the state file.

use std::path::PathBuf;
use std::time::Duration;

use ccm_core::k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
use ccm_core::{
    CloudError, CloudProvider, InstanceAnswer, NodeAddress, NodeView, ObjectMeta, Route, Service,
};
use ccm_testing::fake_cloud::{
    CallArgs, FakeCloud, FakeCloudConfig, FakeCloudConfigError, FakeCloudState, NodeAnswer,
};

use crate::support::{host, node, node_with_provider_id};

fn service(name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn address(type_: &str, address: &str) -> NodeAddress {
    NodeAddress {
        type_: type_.into(),
        address: address.into(),
    }
}

fn route(node_name: &str, cidr: &str) -> Route {
    Route {
        target_node: node_name.into(),
        destination_cidr: cidr.into(),
        ..Default::default()
    }
}

fn ingress_ip(status: &ccm_core::LoadBalancerStatus) -> String {
    status.ingress.as_ref().unwrap()[0].ip.clone().unwrap()
}

/// A path in the temp dir, unique per test run, in its own directory.
fn temp_state_file(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fake-cloud-{test}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("state.json")
}

// ---------------------------------------------------------------- per-Node answers

#[tokio::test]
async fn per_node_answers_replace_the_defaults_for_that_node_only() {
    let cloud = FakeCloud::builder()
        .missing_node("gone-.*")
        .node(
            "n1",
            NodeAnswer {
                provider_id: Some("fake://vm-17".into()),
                addresses: Some(vec![address("InternalIP", "192.168.5.5")]),
                instance_type: Some("big".into()),
                zone: Some("zone-x".into()),
                region: Some("region-x".into()),
                ..Default::default()
            },
        )
        // An explicit answer wins over the patterns.
        .node(
            "gone-but-here",
            NodeAnswer {
                exists: Some(true),
                ..Default::default()
            },
        )
        .build();
    let v2 = cloud.instances_v2().unwrap();
    let meta = v2.instance_metadata(&node("n1")).await.unwrap();
    assert_eq!(meta.provider_id, "fake://vm-17");
    assert_eq!(meta.node_addresses, [address("InternalIP", "192.168.5.5")]);
    assert_eq!(
        (
            meta.instance_type.as_str(),
            meta.zone.as_str(),
            meta.region.as_str()
        ),
        ("big", "zone-x", "region-x")
    );
    // Found by its provider ID too, whatever the Node's name.
    let by_pid = v2
        .instance_metadata(&node_with_provider_id("renamed", "fake://vm-17"))
        .await
        .unwrap();
    assert_eq!(by_pid, meta);
    // Other nodes keep the defaults.
    let other = v2.instance_metadata(&node("n2")).await.unwrap();
    assert_eq!(
        (other.provider_id.as_str(), other.zone.as_str()),
        ("fake://n2", "zone-a")
    );
    assert!(v2.instance_exists(&node("gone-but-here")).await.unwrap());
    assert!(!v2.instance_exists(&node("gone-1")).await.unwrap());
}

#[tokio::test]
async fn per_node_existence_shutdown_and_errors_from_the_config_and_at_runtime() {
    let yaml = br#"
capabilities: {instances: true}
nodes:
  dead: {exists: false}
  sleeping: {shutdown: true, provider_id: "fake://i-sleep"}
  broken: {error: "describe failed"}
"#;
    let cloud =
        FakeCloud::try_new(ccm_core::parse_cloud_config::<FakeCloudConfig>(yaml).unwrap()).unwrap();
    let v2 = cloud.instances_v2().unwrap();
    assert!(!v2.instance_exists(&node("dead")).await.unwrap());
    assert!(
        v2.instance_metadata(&node("dead"))
            .await
            .unwrap_err()
            .is_instance_not_found()
    );
    assert!(v2.instance_exists(&node("sleeping")).await.unwrap());
    assert!(v2.instance_shutdown(&node("sleeping")).await.unwrap());
    for err in [
        v2.instance_exists(&node("broken")).await.unwrap_err(),
        v2.instance_shutdown(&node("broken")).await.unwrap_err(),
        v2.instance_metadata(&node("broken")).await.unwrap_err(),
    ] {
        assert!(matches!(err, CloudError::Other(_)), "{err}");
        assert!(err.to_string().contains("describe failed"), "{err}");
    }
    // The legacy lookups use the same answers.
    let v1 = cloud.instances().unwrap();
    assert_eq!(v1.instance_id("sleeping").await.unwrap(), "i-sleep");
    assert!(
        v1.instance_shutdown_by_provider_id("fake://i-sleep")
            .await
            .unwrap()
    );
    assert!(
        !v1.instance_exists_by_provider_id("fake://dead")
            .await
            .unwrap()
    );

    // At runtime: a Node's instance disappears, then comes back with the defaults.
    cloud.set_node(
        "n1",
        NodeAnswer {
            exists: Some(false),
            ..Default::default()
        },
    );
    assert!(!v2.instance_exists(&node("n1")).await.unwrap());
    cloud.remove_node("n1");
    assert!(v2.instance_exists(&node("n1")).await.unwrap());
}

// ---------------------------------------------------------------- ingress IPs

#[tokio::test]
async fn each_load_balancer_gets_its_own_ip_kept_while_it_exists_and_freed_on_delete() {
    let cloud = FakeCloud::default();
    let lb = cloud.load_balancer().unwrap();
    let mut ips = Vec::new();
    for name in ["a", "b", "c"] {
        let status = lb
            .ensure_load_balancer("k", &service(name), &[host("n1")])
            .await
            .unwrap();
        ips.push(ingress_ip(&status));
    }
    assert_eq!(ips, ["198.18.0.1", "198.18.0.2", "198.18.0.3"]);
    // Stable: ensure again, get, and the listing agree.
    let again = lb
        .ensure_load_balancer("k", &service("b"), &[])
        .await
        .unwrap();
    assert_eq!(ingress_ip(&again), "198.18.0.2");
    let got = lb
        .get_load_balancer("k", &service("b"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ingress_ip(&got), "198.18.0.2");
    assert_eq!(
        cloud.load_balancers()["ns/b"].ingress_ip.as_deref(),
        Some("198.18.0.2")
    );
    // Deleting frees the address for the next new load balancer.
    lb.ensure_load_balancer_deleted("k", &service("b"))
        .await
        .unwrap();
    let d = lb
        .ensure_load_balancer("k", &service("d"), &[])
        .await
        .unwrap();
    assert_eq!(ingress_ip(&d), "198.18.0.2");
}

/// The default range (`198.18.0.0/15`) holds far more than the 254 load balancers of the old
/// `203.0.113.0/24`: the 255th and the 1,000th get an address of their own.
#[tokio::test]
async fn the_default_range_holds_more_than_a_thousand_load_balancers() {
    let cloud = FakeCloud::default();
    let lb = cloud.load_balancer().unwrap();
    let mut ips = std::collections::BTreeSet::new();
    for i in 0..1000 {
        let status = lb
            .ensure_load_balancer("k", &service(&format!("s{i}")), &[])
            .await
            .unwrap();
        ips.insert(ingress_ip(&status));
    }
    assert_eq!(ips.len(), 1000, "every load balancer has its own address");
    assert!(ips.contains("198.18.0.255"), "the 255th is 198.18.0.255");
    assert!(ips.contains("198.18.3.232"), "the 1,000th is 198.18.3.232");
}

#[tokio::test]
async fn a_configured_range_is_used_and_its_exhaustion_is_an_error() {
    let cloud = FakeCloud::try_new(
        ccm_core::parse_cloud_config::<FakeCloudConfig>(b"lb_ip_range: 198.51.100.8/30\n").unwrap(),
    )
    .unwrap();
    let lb = cloud.load_balancer().unwrap();
    let first = lb.ensure_load_balancer("k", &service("a"), &[]).await;
    let second = lb.ensure_load_balancer("k", &service("b"), &[]).await;
    assert_eq!(ingress_ip(&first.unwrap()), "198.51.100.9");
    assert_eq!(ingress_ip(&second.unwrap()), "198.51.100.10");
    let err = lb
        .ensure_load_balancer("k", &service("c"), &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("198.51.100.8/30"), "{err}");
    // The error names the setting to change, in the config file and in a test's builder.
    assert!(
        err.to_string().contains("set a larger lb_ip_range")
            && err.to_string().contains("FakeCloudBuilder::lb_ip_range"),
        "{err}"
    );
    assert!(!cloud.load_balancers().contains_key("ns/c"));

    // `lb_ip` gives every load balancer the same address.
    let fixed = FakeCloud::builder().lb_ip("192.0.2.7").build();
    let lb = fixed.load_balancer().unwrap();
    for name in ["a", "b"] {
        let status = lb.ensure_load_balancer("k", &service(name), &[]).await;
        assert_eq!(ingress_ip(&status.unwrap()), "192.0.2.7");
    }
}

// ---------------------------------------------------------------- call records

#[tokio::test]
async fn call_records_carry_the_arguments() {
    let cloud = FakeCloud::builder().instances_batch(true).build();
    let v2 = cloud.instances_v2().unwrap();
    v2.instance_metadata(&node_with_provider_id("n1", "fake://n1"))
        .await
        .unwrap();
    let lb = cloud.load_balancer().unwrap();
    lb.ensure_load_balancer("k", &service("web"), &[host("n2"), host("n1"), host("n2")])
        .await
        .unwrap();
    lb.get_load_balancer("k", &service("web")).await.unwrap();
    let routes = CloudProvider::routes(&cloud).unwrap();
    routes
        .create_route("k", "uid-1", &route("n1", "10.244.1.0/24"))
        .await
        .unwrap();
    cloud
        .instances_batch()
        .unwrap()
        .describe_instances(&[host("n3"), host("n1")])
        .await
        .unwrap();

    let meta = &cloud.calls_of("instance_metadata")[0];
    assert_eq!(
        meta.args,
        CallArgs::Node {
            name: "n1".into(),
            provider_id: Some("fake://n1".into())
        }
    );
    assert_eq!(meta.node_names(), ["n1"]);
    let ensure = &cloud.calls_of("ensure_load_balancer")[0];
    assert_eq!(ensure.hosts().unwrap(), ["n1", "n2"]);
    assert!(matches!(
        &ensure.args,
        CallArgs::LoadBalancer { cluster_name, service, .. }
            if cluster_name == "k" && service == "ns/web"
    ));
    assert_eq!(cloud.calls_of("get_load_balancer")[0].hosts(), None);
    let create = &cloud.calls_of("create_route")[0];
    let CallArgs::Route {
        cluster_name,
        name_hint,
        route: created,
    } = &create.args
    else {
        panic!("{create:?}");
    };
    assert_eq!(
        (cluster_name.as_str(), name_hint.as_deref()),
        ("k", Some("uid-1"))
    );
    assert_eq!(created.destination_cidr, "10.244.1.0/24");
    let batch = &cloud.calls_of("describe_instances")[0];
    assert_eq!(batch.node_names(), ["n3", "n1"]);
    assert_eq!(batch.subject, "2 nodes");
    assert!(cloud.call_log().iter().all(|c| !c.rejected));
}

// ---------------------------------------------------------------- quota

#[tokio::test(start_paused = true)]
async fn the_overall_quota_rejects_with_the_time_until_a_token_frees() {
    let cloud = FakeCloud::builder().quota(2.0, 2).build();
    let v2 = cloud.instances_v2().unwrap();
    v2.instance_exists(&node("a")).await.unwrap();
    v2.instance_metadata(&node("a")).await.unwrap();
    let err = v2.instance_shutdown(&node("a")).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_millis(500)));
    assert!(err.to_string().contains("quota"), "{err}");
    assert_eq!(cloud.rejected_count("instance_shutdown"), 1);
    assert_eq!(cloud.call_count("instance_shutdown"), 1);
    let log = cloud.call_log();
    assert!(log[2].rejected && !log[1].rejected);
    // A rejected call took no token: half a second later one call goes through.
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(!v2.instance_shutdown(&node("a")).await.unwrap());
    assert!(v2.instance_shutdown(&node("a")).await.is_err());
    assert_eq!(
        cloud.rejected_counts().into_iter().collect::<Vec<_>>(),
        [("instance_shutdown".to_owned(), 2)]
    );
    // A rejected mutation changes nothing.
    let lb = cloud.load_balancer().unwrap();
    assert!(
        lb.ensure_load_balancer("k", &service("web"), &[])
            .await
            .unwrap_err()
            .retry_after()
            .is_some()
    );
    assert!(cloud.load_balancers().is_empty());
    cloud.reset_calls();
    assert!(cloud.rejected_counts().is_empty());
}

#[tokio::test(start_paused = true)]
async fn per_operation_quota_from_the_config_and_one_token_per_batch() {
    let yaml = br#"
capabilities: {instances_batch: true}
quota:
  overall: {per_second: 100, burst: 100}
  operations:
    describe_instances: {per_second: 1, burst: 1}
"#;
    let cloud =
        FakeCloud::try_new(ccm_core::parse_cloud_config::<FakeCloudConfig>(yaml).unwrap()).unwrap();
    let batch = cloud.instances_batch().unwrap();
    let nodes: Vec<NodeView> = (0..100).map(|i| host(&format!("n{i}"))).collect();
    // One call for 100 Nodes costs one token.
    assert_eq!(batch.describe_instances(&nodes).await.unwrap().len(), 100);
    let err = batch.describe_instances(&nodes[..1]).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    // Other operations still have the overall quota.
    let v2 = cloud.instances_v2().unwrap();
    for _ in 0..50 {
        v2.instance_exists(&node("n1")).await.unwrap();
    }
    assert_eq!(cloud.rejected_count("describe_instances"), 1);
    assert_eq!(cloud.rejected_count("instance_exists"), 0);
}

// ---------------------------------------------------------------- batch

#[tokio::test]
async fn batch_answers_agree_with_the_single_calls() {
    let cloud = FakeCloud::builder()
        .instances_batch(true)
        .missing_node("gone-.*")
        .shutdown_node("off-.*")
        .node(
            "broken",
            NodeAnswer {
                error: Some("no answer".into()),
                ..Default::default()
            },
        )
        .build();
    let names = ["n1", "off-1", "gone-1", "broken"];
    let nodes: Vec<NodeView> = names.iter().map(|n| host(n)).collect();
    let answers = cloud
        .instances_batch()
        .unwrap()
        .describe_instances(&nodes)
        .await
        .unwrap();
    assert_eq!(answers.len(), 4);
    let v2 = cloud.instances_v2().unwrap();
    assert!(matches!(answers["n1"], InstanceAnswer::Found(_)));
    assert!(matches!(answers["off-1"], InstanceAnswer::Shutdown(_)));
    assert!(matches!(answers["gone-1"], InstanceAnswer::NotFound));
    assert!(matches!(answers["broken"], InstanceAnswer::Error(_)));
    for name in ["n1", "off-1"] {
        let single = v2.instance_metadata(&node(name)).await.unwrap();
        assert_eq!(answers[name].metadata(), Some(&single), "{name}");
        assert_eq!(
            answers[name].is_shutdown(),
            Some(v2.instance_shutdown(&node(name)).await.unwrap())
        );
    }
    assert_eq!(
        answers["gone-1"].exists(),
        Some(v2.instance_exists(&node("gone-1")).await.unwrap())
    );
    // One call, counted once.
    assert_eq!(cloud.call_count("describe_instances"), 1);
}

#[tokio::test]
async fn batch_is_off_by_default_and_limited_to_max_batch_size() {
    assert!(FakeCloud::default().instances_batch().is_none());
    let config: FakeCloudConfig =
        ccm_core::parse_cloud_config(b"capabilities: {instances_batch: true}\nmax_batch_size: 2\n")
            .unwrap();
    let cloud = FakeCloud::try_new(config).unwrap();
    let batch = cloud.instances_batch().unwrap();
    assert_eq!(batch.max_batch_size(), 2);
    let err = batch
        .describe_instances(&[host("a"), host("b"), host("c")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_batch_size 2"), "{err}");
    assert!(
        FakeCloud::try_new({
            let mut config = FakeCloudConfig::default();
            config.max_batch_size = 0;
            config
        })
        .is_err()
    );
}

// ---------------------------------------------------------------- state file

#[tokio::test]
async fn a_second_cloud_on_the_same_state_file_sees_the_load_balancers_and_routes() {
    let path = temp_state_file("share");
    let first = FakeCloud::builder().state_file(&path).build();
    let lb = first.load_balancer().unwrap();
    let web = lb
        .ensure_load_balancer("k", &service("web"), &[host("n1"), host("n2")])
        .await
        .unwrap();
    lb.ensure_load_balancer("k", &service("db"), &[host("n1")])
        .await
        .unwrap();
    let routes = CloudProvider::routes(&first).unwrap();
    routes
        .create_route("k", "uid-1", &route("n1", "10.244.1.0/24"))
        .await
        .unwrap();
    drop(first);

    // From outside: the file is JSON, and the helper reads it.
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        json["load_balancers"]["ns/web"]["hosts"],
        serde_json::json!(["n1", "n2"])
    );
    let saved = FakeCloudState::load(&path).unwrap();
    assert_eq!(
        saved.load_balancers.keys().collect::<Vec<_>>(),
        ["ns/db", "ns/web"]
    );
    assert_eq!(saved.routes.len(), 1);
    assert_eq!(saved.routes[0].destination_cidr, "10.244.1.0/24");
    assert_eq!(saved.routes[0].cluster_name.as_deref(), Some("k"));
    // Written by rename: no temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["state.json"]);

    // A new process (here: a new FakeCloud) starts from the file.
    let second = FakeCloud::try_new({
        let mut config = FakeCloudConfig::default();
        config.state_file = Some(path.clone());
        config
    })
    .unwrap();
    assert_eq!(second.state(), saved);
    let lb = second.load_balancer().unwrap();
    let got = lb
        .get_load_balancer("k", &service("web"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, web, "same ingress IP after the restart");
    // The next new load balancer does not take an address in use.
    let new = lb
        .ensure_load_balancer("k", &service("new"), &[])
        .await
        .unwrap();
    assert_eq!(ingress_ip(&new), "198.18.0.3");
    let listed = CloudProvider::routes(&second)
        .unwrap()
        .list_routes("k")
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    lb.ensure_load_balancer_deleted("k", &service("web"))
        .await
        .unwrap();
    let after = FakeCloudState::load(&path).unwrap();
    assert_eq!(
        after.load_balancers.keys().collect::<Vec<_>>(),
        ["ns/db", "ns/new"]
    );
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[tokio::test]
async fn an_unreadable_state_file_is_an_error_and_never_overwritten() {
    let path = temp_state_file("corrupt");
    std::fs::write(&path, b"{not json").unwrap();
    let config = {
        let mut config = FakeCloudConfig::default();
        config.state_file = Some(path.clone());
        config
    };
    let err = FakeCloud::try_new(config.clone()).unwrap_err();
    assert!(matches!(err, FakeCloudConfigError::StateFile(_)));
    assert!(err.to_string().contains("state.json"), "{err}");
    // `new` never fails: it runs in memory and leaves the file alone.
    let cloud = FakeCloud::new(config);
    cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer("k", &service("web"), &[])
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"{not json");
    // A file that does not exist yet is an empty cloud.
    assert_eq!(
        FakeCloudState::load(path.with_file_name("absent.json")).unwrap(),
        FakeCloudState::default()
    );
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

// ---------------------------------------------------------------- validation

#[test]
fn bad_new_fields_are_rejected_with_a_message_naming_the_problem() {
    let err = |yaml: &str| {
        let config: FakeCloudConfig = ccm_core::parse_cloud_config(yaml.as_bytes()).unwrap();
        config.validate().unwrap_err().to_string()
    };
    let e = err("lb_ip_range: 203.0.113.0\n");
    assert!(
        e.contains("lb_ip_range") && e.contains("203.0.113.0"),
        "{e}"
    );
    let e = err("quota: {overall: {per_second: 0, burst: 5}}\n");
    assert!(
        e.contains("quota overall") && e.contains("per_second = 0"),
        "{e}"
    );
    let e = err("quota: {operations: {describe_instance: {per_second: 1, burst: 1}}}\n");
    assert!(e.contains("describe_instance"), "{e}");
    let e = err("nodes: {a: {provider_id: vm-1}}\n");
    assert!(e.contains("nodes.a.provider_id"), "{e}");
    let e = err("nodes: {a: {provider_id: 'fake://x'}, b: {provider_id: 'fake://x'}}\n");
    assert!(e.contains("has it too"), "{e}");
    assert!(ccm_core::parse_cloud_config::<FakeCloudConfig>(b"nodes: {a: {zones: x}}\n").is_err());
}
