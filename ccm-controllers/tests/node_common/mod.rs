//! What the cloud-node and node-lifecycle controller tests share: the test's cluster, its
//! unique run label, and the controller harness of `ccm-testing` scoped to that label.
//!
//! On a real cluster (`CCM_TEST_KUBECONFIG`) the controller must not touch anybody else's
//! Nodes: every Node a test creates carries `ccm-test.example.com/run=<unique>`, and the
//! controller's informers are restricted to that label (on the in-process server too, so both
//! run the same way).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ccm_controllers::{Backoff, ControllerContext, ControllerError, InformerScope};
use ccm_core::{CloudProvider, Node};
use ccm_testing::TestCluster;
use ccm_testing::harness::{ControllerHarness, HarnessBuilder};
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
        let found = ccm_testing::wait::eventually(TIMEOUT, || async {
            self.events(node).await.iter().any(|e| e.1 == reason)
        })
        .await;
        let events = self.events(node).await;
        assert!(found, "no {reason} event for {node}; events: {events:?}");
        events
    }
}
