//! Controller tests of the cloud-node controller: the real controller against the in-process
//! API server (real HTTP, real watches) with FakeCloud, or against the real cluster named by
//! `CCM_TEST_KUBECONFIG`.
//!
//! On a real cluster the controller must not touch anybody else's Nodes, so there the shared
//! informer is restricted to this test's Nodes with a label selector (every Node a test creates
//! carries `ccm-test.example.com/run=<unique>`); on the in-process server the test owns the
//! whole server and uses `ControllerContext::standalone` as is. Steps that need the in-process
//! server's request log or fault injection are skipped on a real cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_controllers::ControllerError;
use ccm_controllers::controllers::cloud_node::{self, CloudNodeConfig};
use ccm_core::well_known::{
    ANNOTATION_PROVIDED_NODE_IP, LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE,
    LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE,
    TAINT_UNINITIALIZED,
};
use ccm_core::{
    CloudProvider, CloudResult, InstanceMetadata, Instances, InstancesV2, Node, NodeAddress, Zones,
    async_trait,
};
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{NodeBuilder, kubelet_node};
use ccm_testing::fake_cloud::{Capabilities, FakeCloud, Fault};
use ccm_testing::wait::{eventually, wait_for};
use kube::api::{Patch, PatchParams};
use serde_json::json;

mod node_common;
use ccm_testing::harness::ControllerHarness;
use node_common::{RUN_LABEL, TIMEOUT, Test};

// ---------------------------------------------------------------------------------------------
// Harness (the shared part is in `node_common`)

impl Test {
    /// A kubelet-registered node carrying this test's selector label.
    fn node(&self, name: &str) -> NodeBuilder {
        kubelet_node(name).label(RUN_LABEL, &self.run)
    }

    async fn run_controller(
        &self,
        cloud: Arc<dyn CloudProvider>,
        config: CloudNodeConfig,
    ) -> ControllerHarness {
        self.start_controller(cloud, cloud_node::NAME, move |ctx| {
            cloud_node::run(ctx, config.clone())
        })
        .await
    }

    /// The error the controller stops with at once, under `config` and `cloud`.
    async fn refused(
        &self,
        cloud: Arc<dyn CloudProvider>,
        config: CloudNodeConfig,
    ) -> ControllerError {
        self.run_controller(cloud, config)
            .await
            .stop()
            .await
            .unwrap_err()
    }

    async fn wait_event(&self, node: &str, reason: &str) -> (String, String, String) {
        let found = eventually(TIMEOUT, || async {
            self.events(node).await.iter().any(|e| e.1 == reason)
        })
        .await;
        let events = self.events(node).await;
        assert!(found, "no {reason} event for {node}; events: {events:?}");
        events.into_iter().find(|e| e.1 == reason).unwrap()
    }

    async fn wait_initialized(&self, name: &str) -> Node {
        wait_for(&self.nodes, name, TIMEOUT, |n: &Node| {
            !has_taint(n, TAINT_UNINITIALIZED)
        })
        .await
        .unwrap()
    }
}

fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|(k, _)| k == key)
}

fn taints(node: &Node) -> Vec<(String, String)> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref())
}

fn addresses(node: &Node) -> Vec<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect()
}

fn addr(type_: &str, address: &str) -> (String, String) {
    (type_.to_owned(), address.to_owned())
}

/// The addresses FakeCloud reports for a node name.
async fn fake_addresses(fake: &FakeCloud, name: &str) -> Vec<(String, String)> {
    let node = kubelet_node(name).build();
    let meta = fake
        .instances_v2()
        .unwrap()
        .instance_metadata(&node)
        .await
        .unwrap();
    fake.reset_calls();
    meta.node_addresses
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect()
}

fn fake_internal_ip(addrs: &[(String, String)]) -> String {
    addrs
        .iter()
        .find(|(t, _)| t == "InternalIP")
        .map(|(_, a)| a.clone())
        .unwrap()
}

/// The statuses the server answered to PATCHes of Node `name` itself (not a subresource), in
/// order; only those of `content_type` when given.
fn spec_patch_statuses(server: &ApiServer, name: &str, content_type: Option<&str>) -> Vec<u16> {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.name.as_deref() == Some(name)
                && r.verb == "patch"
                && r.subresource.is_none()
                && content_type.is_none_or(|c| r.content_type.as_deref() == Some(c))
        })
        .map(|r| r.status)
        .collect()
}

/// A config whose periodic refresh stays out of the way.
fn quiet_config() -> CloudNodeConfig {
    CloudNodeConfig {
        status_update_frequency: Duration::from_secs(3600),
        ..CloudNodeConfig::default()
    }
}

/// What a [`Probe`] does to FakeCloud's `instance_metadata` answer for a Node.
type Tweak = Box<dyn Fn(&Node, &mut InstanceMetadata) + Send + Sync>;

/// A provider wrapping FakeCloud whose `InstancesV2` answers can be edited, which counts how
/// many `instance_metadata` calls run at once, and which can hold a Node's first call.
struct Probe {
    fake: FakeCloud,
    tweak: Tweak,
    hold: Option<Hold>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// Holds the first `instance_metadata` call for one Node (by UID) until released.
struct Hold {
    uid: String,
    taken: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Probe {
    fn new(fake: FakeCloud, tweak: fn(&mut InstanceMetadata)) -> Arc<Probe> {
        Probe::build(fake, Box::new(move |_, m| tweak(m)), None)
    }

    /// Holds the first call for the Node with `uid`; `tweak` sees the Node asked about.
    fn holding(
        fake: FakeCloud,
        uid: &str,
        tweak: impl Fn(&Node, &mut InstanceMetadata) + Send + Sync + 'static,
    ) -> Arc<Probe> {
        let hold = Hold {
            uid: uid.to_string(),
            taken: std::sync::atomic::AtomicBool::new(false),
            entered: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        };
        Probe::build(fake, Box::new(tweak), Some(hold))
    }

    fn build(fake: FakeCloud, tweak: Tweak, hold: Option<Hold>) -> Arc<Probe> {
        Arc::new(Probe {
            fake,
            tweak,
            hold,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        })
    }

    fn hold(&self) -> &Hold {
        self.hold
            .as_ref()
            .expect("a probe made with Probe::holding")
    }
}

#[async_trait]
impl CloudProvider for Probe {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn instances(&self) -> Option<&dyn Instances> {
        None
    }
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }
}

#[async_trait]
impl InstancesV2 for Probe {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.fake
            .instances_v2()
            .unwrap()
            .instance_exists(node)
            .await
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.fake
            .instances_v2()
            .unwrap()
            .instance_shutdown(node)
            .await
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<InstanceMetadata> {
        if let Some(hold) = &self.hold
            && node.metadata.uid.as_deref() == Some(hold.uid.as_str())
            && !hold.taken.swap(true, Ordering::SeqCst)
        {
            hold.entered.notify_one();
            hold.release.notified().await;
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let result = self
            .fake
            .instances_v2()
            .unwrap()
            .instance_metadata(node)
            .await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut meta = result?;
        (self.tweak)(node, &mut meta);
        Ok(meta)
    }
}

// ---------------------------------------------------------------------------------------------
// Initialisation

#[tokio::test]
async fn initializes_a_tainted_node_with_instances_v2() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("v2");
    let expected_addresses = fake_addresses(&fake, &name).await;
    t.create(
        &t.node(&name)
            .taint("example.com/dedicated", "db", "NoExecute")
            .build(),
    )
    .await;
    if let Some(server) = t.cluster.api_server() {
        server.clear_requests();
    }
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    t.create(&t.node(&bare).build()).await;
    t.create(
        &t.node(&preset)
            .provider_id(&format!("fake://{preset}"))
            .build(),
    )
    .await;
    let running = t.run_controller(probe.clone(), quiet_config()).await;

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
        &t.node(&name)
            .label("example.com/pool", "green")
            .label(LABEL_TOPOLOGY_ZONE, "stale-zone")
            .build(),
    )
    .await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
        &t.node(&name)
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
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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

// ---------------------------------------------------------------------------------------------
// Addresses

#[tokio::test]
async fn kubelet_hostname_is_kept_when_the_cloud_reports_none() {
    let t = Test::start().await;
    let probe = Probe::new(FakeCloud::default(), |m| {
        m.node_addresses.retain(|a| a.type_ != "Hostname");
    });
    let name = t.name("hostname");
    let fake_addrs = fake_addresses(&probe.fake, &name).await;
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(probe.clone(), quiet_config()).await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    let mut expected: Vec<_> = fake_addrs
        .into_iter()
        .filter(|(ty, _)| ty != "Hostname")
        .collect();
    expected.push(addr("Hostname", &name));
    assert_eq!(addresses(&node), expected);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn zero_cloud_addresses_leave_the_nodes_addresses_alone() {
    let t = Test::start().await;
    let probe = Probe::new(FakeCloud::default(), |m| m.node_addresses.clear());
    let name = t.name("noaddr");
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(probe.clone(), quiet_config()).await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert!(!has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(addresses(&node), vec![addr("Hostname", &name)]);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn provided_node_ip_single_stack_goes_first_and_drops_other_internal_ips() {
    let t = Test::start().await;
    // The cloud reports a second InternalIP before the node's own.
    let probe = Probe::new(FakeCloud::default(), |m| {
        m.node_addresses.insert(
            0,
            NodeAddress {
                type_: "InternalIP".into(),
                address: "192.0.2.200".into(),
            },
        );
    });
    let name = t.name("nodeip");
    let ip = fake_internal_ip(&fake_addresses(&probe.fake, &name).await);
    t.create(
        &t.node(&name)
            .provided_node_ip(&ip)
            .addresses(vec![NodeAddress {
                type_: "Hostname".into(),
                address: name.clone(),
            }])
            .build(),
    )
    .await;
    let running = t.run_controller(probe.clone(), quiet_config()).await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert_eq!(
        addresses(&node),
        vec![addr("InternalIP", &ip), addr("Hostname", &name)]
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn provided_node_ip_dual_stack_in_requested_order() {
    let t = Test::start().await;
    let probe = Probe::new(FakeCloud::default(), |m| {
        m.node_addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: "fd00::10".into(),
        });
        m.node_addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: "fd00::11".into(),
        });
        m.node_addresses.push(NodeAddress {
            type_: "ExternalIP".into(),
            address: "198.51.100.7".into(),
        });
    });
    let name = t.name("dualstack");
    let v4 = fake_internal_ip(&fake_addresses(&probe.fake, &name).await);
    let mut node = t.node(&name).build();
    node.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_PROVIDED_NODE_IP.into(), format!("fd00::11,{v4}"));
    t.create(&node).await;
    let running = t.run_controller(probe.clone(), quiet_config()).await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert_eq!(
        addresses(&node),
        vec![
            addr("InternalIP", "fd00::11"),
            addr("InternalIP", &v4),
            addr("Hostname", &name),
            addr("ExternalIP", "198.51.100.7"),
        ]
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn unknown_provided_node_ip_keeps_the_node_tainted_until_fixed() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("badip");
    let ip = fake_internal_ip(&fake_addresses(&fake, &name).await);
    let mut node = t.node(&name).build();
    node.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_PROVIDED_NODE_IP.into(), format!("{ip},fd00::99"));
    t.create(&node).await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

    let (type_, _, note) = t.wait_event(&name, "SyncFailed").await;
    assert_eq!(type_, "Warning");
    assert!(note.contains("node IP"), "{note}");
    assert!(note.contains("fd00::99"), "{note}");
    let node = t.nodes.get(&name).await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(
        provider_id(&node),
        None,
        "nothing written for an invalid node IP"
    );

    // kubelet restarted with a valid --node-ip: the node is initialised.
    t.nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_PROVIDED_NODE_IP: ip}}})),
        )
        .await
        .unwrap();
    let node = t.wait_initialized(&name).await;
    assert_eq!(provider_id(&node), Some(format!("fake://{name}").as_str()));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn periodic_refresh_updates_addresses_of_initialized_nodes() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("refresh");
    let expected = fake_addresses(&fake, &name).await;
    t.create(
        &t.node(&name)
            .without_uninitialized_taint()
            .provider_id(&format!("fake://{name}"))
            .addresses(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: "192.0.2.1".into(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.clone(),
                },
            ])
            .build(),
    )
    .await;
    let running = t
        .run_controller(
            fake.provider(),
            CloudNodeConfig {
                status_update_frequency: Duration::from_millis(500),
                status_update_workers: 2,
                ..CloudNodeConfig::default()
            },
        )
        .await;
    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        addresses(n) == expected
    })
    .await
    .unwrap();
    // The cloud changes nothing: later refreshes write nothing.
    let calls = fake.call_count("instance_metadata");
    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("instance_metadata") >= calls + 2
        })
        .await
    );
    if let Some(server) = t.cluster.api_server() {
        let status_writes = server
            .requests()
            .iter()
            .filter(|r| r.name.as_deref() == Some(name.as_str()) && r.verb == "patch")
            .count();
        assert_eq!(status_writes, 1);
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// Concurrency safety and failures

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
    t.create(&t.node(&name).addresses(cloud_addresses).build())
        .await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    let t = Test::start().await;
    let fake = FakeCloud::default();
    fake.inject("instance_metadata", Fault::FailNext(3));
    let name = t.name("flaky");
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    t.create(&t.node(&name).build()).await;
    server.fail_next("patch", "nodes/status", 1, 500, None);
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    let created = t.create(&t.node(&name).build()).await;
    assert_ne!(
        addresses(&created),
        expected,
        "the test needs an address change"
    );
    let (watch, done) = watch_versions(&t, &name);
    let running = t.run_controller(fake.provider(), quiet_config()).await;

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
    let created = t.create(&t.node(&name).build()).await;
    let fake = FakeCloud::default();
    let probe = Probe::holding(
        fake.clone(),
        created.metadata.uid.as_deref().unwrap(),
        |_, _| {},
    );
    if let Some(server) = t.cluster.api_server() {
        server.clear_requests();
    }
    let running = t.run_controller(probe.clone(), quiet_config()).await;

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

// ---------------------------------------------------------------------------------------------
// Concurrency, configuration, metrics

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
        t.create(&t.node(n).build()).await;
    }
    let running = t
        .run_controller(
            probe.clone(),
            CloudNodeConfig {
                workers: 4,
                ..quiet_config()
            },
        )
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
        .refused(
            FakeCloud::default().provider(),
            CloudNodeConfig {
                workers: 0,
                ..CloudNodeConfig::default()
            },
        )
        .await;
    assert!(matches!(err, ControllerError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("--concurrent-node-syncs"), "{err}");
    let err = t
        .refused(
            FakeCloud::default().provider(),
            CloudNodeConfig {
                status_update_frequency: Duration::ZERO,
                ..CloudNodeConfig::default()
            },
        )
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
        .refused(no_instances.provider(), CloudNodeConfig::default())
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
    t.create(&t.node(&name).build()).await;
    let running = t.run_controller(fake.provider(), quiet_config()).await;
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
        .create(&t.node(&name).label(GENERATION_LABEL, "old").build())
        .await;
    let old_uid = old.metadata.uid.clone().unwrap();
    let fake = FakeCloud::default();
    // Holds the old Node's cloud call; answers an instance type naming the asked Node's
    // generation label, so the test can tell whose answer a Node was initialised from.
    let probe = Probe::holding(fake.clone(), &old_uid, |node, meta| {
        meta.instance_type = format!(
            "type-{}",
            label(node, GENERATION_LABEL).unwrap_or("unlabelled")
        );
    });
    let running = t.run_controller(probe.clone(), quiet_config()).await;

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
        .create(&t.node(&name).label(GENERATION_LABEL, "new").build())
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
        let status_patches: Vec<u16> = server
            .requests()
            .iter()
            .filter(|r| {
                r.name.as_deref() == Some(name.as_str())
                    && r.verb == "patch"
                    && r.subresource.as_deref() == Some("status")
            })
            .map(|r| r.status)
            .collect();
        assert_eq!(status_patches.first(), Some(&409), "{status_patches:?}");
        let spec_patches = spec_patch_statuses(server, &name, None);
        assert_eq!(spec_patches, vec![200], "{spec_patches:?}");
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}
