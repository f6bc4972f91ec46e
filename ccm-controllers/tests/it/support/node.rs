//! What the node controller tests share (cloud-node, node-lifecycle, batched instance lookups,
//! start-up, Events): the test's cluster, its unique run label, the controller harness of
//! `ccm-testing` scoped to that label, the two node controllers started in it, and readers of
//! a Node's taints, labels and addresses.
//!
//! On a real cluster (`CCM_TEST_KUBECONFIG`) the controller must not touch anybody else's
//! Nodes: every Node a test creates carries `ccm-test.example.com/run=<unique>`, and the
//! controller's informers are restricted to that label (on the in-process server too, so both
//! run the same way).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ccm_controllers::controllers::cloud_node::{self, CloudNodeConfig};
use ccm_controllers::controllers::node_lifecycle::{self, NodeLifecycleConfig};
use ccm_controllers::{Backoff, ControllerContext, ControllerError, InformerScope};
use ccm_core::well_known::TAINT_UNINITIALIZED;
use ccm_core::{CloudProvider, Node};
use ccm_testing::TestCluster;
use ccm_testing::builders::{NodeBuilder, kubelet_node};
use ccm_testing::harness::{ControllerHarness, HarnessBuilder};
use ccm_testing::wait::{eventually, wait_for};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};

/// How long a test waits for the controller.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);
/// The label that marks a test's own Nodes.
pub(crate) const RUN_LABEL: &str = "ccm-test.example.com/run";

/// One test: a cluster, the test's unique run label value, and the Node API.
pub(crate) struct Test {
    pub cluster: TestCluster,
    pub run: String,
    pub nodes: Api<Node>,
}

impl Test {
    pub(crate) async fn start() -> Test {
        let cluster = TestCluster::start().await;
        let run = cluster.unique_name("run");
        let nodes = Api::all(cluster.client());
        Test {
            cluster,
            run,
            nodes,
        }
    }

    pub(crate) fn name(&self, prefix: &str) -> String {
        self.cluster.unique_name(prefix)
    }

    pub(crate) async fn create(&self, node: &Node) -> Node {
        self.cluster.create(node).await
    }

    /// A Node as kubelet registers it (with the uninitialized taint), carrying this test's
    /// run label.
    pub(crate) fn registered_node(&self, name: &str) -> NodeBuilder {
        kubelet_node(name).label(RUN_LABEL, &self.run)
    }

    /// A Node a cloud-node controller has initialised (no uninitialized taint, provider ID
    /// `fake://<name>`), carrying this test's run label.
    pub(crate) fn initialized_node(&self, name: &str) -> NodeBuilder {
        kubelet_node(name)
            .without_uninitialized_taint()
            .provider_id(&format!("fake://{name}"))
            .label(RUN_LABEL, &self.run)
    }

    /// The controller harness on this test's cluster, its informers restricted to this
    /// test's Nodes.
    pub(crate) fn harness(&self, cloud: Arc<dyn CloudProvider>) -> HarnessBuilder {
        let selector = format!("{RUN_LABEL}={}", self.run);
        ControllerHarness::builder(&self.cluster, cloud)
            .scope(InformerScope {
                node_labels: Some(selector.clone()),
                service_labels: Some(selector),
                ..InformerScope::default()
            })
            // The cloud-node controller's own backoff (Go's), which these tests were written
            // against.
            .retry_backoff(Backoff::CONTROLLER)
    }

    /// Starts one controller (`run(ctx)`, under the name `name`) in the harness.
    pub(crate) async fn start_controller<F, Fut>(
        &self,
        cloud: Arc<dyn CloudProvider>,
        name: &str,
        run: F,
    ) -> ControllerHarness
    where
        F: Fn(ControllerContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ControllerError>> + Send + 'static,
    {
        self.harness(cloud)
            .controller(name, move |ctx, _| run(ctx))
            .start()
            .await
    }

    /// Starts the cloud-node controller with `config` in the harness.
    pub(crate) async fn run_cloud_node(
        &self,
        cloud: Arc<dyn CloudProvider>,
        config: CloudNodeConfig,
    ) -> ControllerHarness {
        self.start_controller(cloud, cloud_node::NAME, move |ctx| {
            cloud_node::run(ctx, config.clone())
        })
        .await
    }

    /// Starts the node-lifecycle controller with `config` in the harness.
    pub(crate) async fn run_lifecycle(
        &self,
        cloud: Arc<dyn CloudProvider>,
        config: NodeLifecycleConfig,
    ) -> ControllerHarness {
        self.start_controller(cloud, node_lifecycle::NAME, move |ctx| {
            node_lifecycle::run(ctx, config.clone())
        })
        .await
    }

    /// The error the cloud-node controller stops with at once, under `config` and `cloud`.
    pub(crate) async fn cloud_node_refusal(
        &self,
        cloud: Arc<dyn CloudProvider>,
        config: CloudNodeConfig,
    ) -> ControllerError {
        self.run_cloud_node(cloud, config)
            .await
            .stop()
            .await
            .unwrap_err()
    }

    /// The error the node-lifecycle controller stops with at once, under `config` and `cloud`.
    pub(crate) async fn lifecycle_refusal(
        &self,
        cloud: Arc<dyn CloudProvider>,
        config: NodeLifecycleConfig,
    ) -> ControllerError {
        self.run_lifecycle(cloud, config)
            .await
            .stop()
            .await
            .unwrap_err()
    }

    /// Waits until Node `name` has lost the uninitialized taint; returns it.
    pub(crate) async fn wait_initialized(&self, name: &str) -> Node {
        wait_for(&self.nodes, name, TIMEOUT, |n: &Node| {
            !has_taint(n, TAINT_UNINITIALIZED)
        })
        .await
        .unwrap()
    }

    /// Sets the Ready condition of Node `name`.
    pub(crate) async fn set_ready(&self, name: &str, ready: bool) {
        ccm_testing::harness::set_node_ready(&self.cluster.client(), name, ready).await;
    }

    /// Events recorded about a node, as (type, reason, note).
    pub(crate) async fn events(&self, node: &str) -> Vec<(String, String, String)> {
        let api: Api<Event> = Api::namespaced(self.cluster.client(), "default");
        let list = api.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| {
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .is_some_and(|n| n == node)
            })
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }
}

impl Test {
    /// The node's events once one with `reason` has been written. Events are written by a
    /// background task, in the order they were recorded, so the ones recorded before it are
    /// there too.
    pub(crate) async fn events_including(
        &self,
        node: &str,
        reason: &str,
    ) -> Vec<(String, String, String)> {
        let found = eventually(TIMEOUT, || async {
            self.events(node).await.iter().any(|e| e.1 == reason)
        })
        .await;
        let events = self.events(node).await;
        assert!(found, "no {reason} event for {node}; events: {events:?}");
        events
    }

    /// The first Event with `reason` about the node, once it has been written.
    pub(crate) async fn wait_event(&self, node: &str, reason: &str) -> (String, String, String) {
        let events = self.events_including(node, reason).await;
        events.into_iter().find(|e| e.1 == reason).unwrap()
    }
}

/// A cloud-node configuration whose periodic refresh stays out of the way.
pub(crate) fn quiet_cloud_node_config() -> CloudNodeConfig {
    {
        let mut config = CloudNodeConfig::default();
        config.status_update_frequency = Duration::from_secs(3600);
        config
    }
}

/// Whether the node carries a taint with `key`.
pub(crate) fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|(k, _)| k == key)
}

/// The node's taints, as (key, effect).
pub(crate) fn taints(node: &Node) -> Vec<(String, String)> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

/// The value of the node's label `key`.
pub(crate) fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// The node's `spec.providerID`.
pub(crate) fn provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref())
}

/// The node's addresses, as (type, address).
pub(crate) fn addresses(node: &Node) -> Vec<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect()
}
