//! The harness shared by the cloud-node and node-lifecycle controller tests.
//!
//! On a real cluster (`CCM_TEST_KUBECONFIG`) the controller must not touch anybody else's
//! Nodes: every Node a test creates carries `ccm-test.example.com/run=<unique>`, and the
//! controller's informers are restricted to that label. On the in-process server the test owns
//! the whole server and uses `ControllerContext::standalone` as is.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ccm_controllers::{ControllerContext, ControllerError, InformerScope};
use ccm_core::{CloudProvider, Node};
use ccm_testing::TestCluster;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use tokio::task::{JoinHandle, JoinSet};

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

    /// The controller's context: standalone on the in-process server, restricted to this
    /// test's nodes on a real cluster.
    pub(crate) fn context(
        &self,
        cloud: Arc<dyn CloudProvider>,
    ) -> (ControllerContext, JoinSet<()>) {
        if !self.cluster.is_real() {
            return ControllerContext::standalone(self.cluster.client(), cloud, "kubernetes");
        }
        let selector = format!("{RUN_LABEL}={}", self.run);
        let scope = InformerScope {
            node_labels: Some(selector.clone()),
            service_labels: Some(selector),
            ..InformerScope::default()
        };
        ControllerContext::standalone_scoped(self.cluster.client(), cloud, "kubernetes", &scope)
    }

    /// Starts a controller (`run(ctx)`) in the test's context.
    pub(crate) fn spawn<F, Fut>(&self, cloud: Arc<dyn CloudProvider>, run: F) -> Running
    where
        F: FnOnce(ControllerContext) -> Fut,
        Fut: Future<Output = Result<(), ControllerError>> + Send + 'static,
    {
        let (ctx, tasks) = self.context(cloud);
        let handle = tokio::spawn(run(ctx.clone()));
        Running { ctx, tasks, handle }
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

/// A running controller and its informers.
pub(crate) struct Running {
    pub ctx: ControllerContext,
    pub tasks: JoinSet<()>,
    pub handle: JoinHandle<Result<(), ControllerError>>,
}

impl Running {
    /// Graceful stop: the controller must return `Ok`.
    pub(crate) async fn stop(mut self) {
        self.ctx.shutdown.cancel();
        self.handle.await.unwrap().unwrap();
        self.tasks.shutdown().await;
    }
}
