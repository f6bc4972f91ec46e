//! Route controller tests: the real controller against TestCluster (the in-process API server,
//! or the real cluster named by `CCM_TEST_KUBECONFIG`) and FakeCloud.
//!
//! Every test labels its Nodes with a value unique to the test and runs the controller with a
//! Node informer restricted to that label, so on a real cluster the controller never sees (and
//! never writes the `NetworkUnavailable` condition of) Nodes it did not create. Each test also
//! uses its own cluster CIDR.

use std::time::Duration;

use ccm_controllers::Backoff;
use ccm_controllers::InformerScope;
use ccm_controllers::controllers::route::{self, RouteConfig};
use ccm_core::Route;
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::{eventually, wait_for};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};

mod condition;
mod cost;
mod failures;
mod routes;
mod startup;

const WAIT: Duration = Duration::from_secs(20);
const LABEL: &str = "route-test.ccm-rs.io/run";

/// A route controller running in the controller harness, and what a test needs around it.
struct RouteTest {
    cluster: TestCluster,
    fake: FakeCloud,
    controllers: ControllerHarness,
    /// The value of [`LABEL`] on this test's Nodes.
    run_id: String,
}

/// A /16 unique enough per test: tests pick distinct second octets.
fn cidr(octet: u8) -> String {
    format!("10.{octet}.0.0/16")
}

/// The retry backoff of both route queues in these tests.
const TEST_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(100),
    max: Duration::from_millis(500),
};

fn test_config(cluster_cidrs: &str) -> RouteConfig {
    {
        let mut config = RouteConfig::default();
        config.cluster_cidrs = route::parse_cluster_cidrs(cluster_cidrs).unwrap();
        config.reconciliation_period = Duration::from_secs(3600);
        config.debounce = Duration::from_millis(100);
        config.create_retry_backoff = TEST_BACKOFF;
        config.reconcile_retry_backoff = TEST_BACKOFF;
        config
    }
}

impl RouteTest {
    /// Starts the route controller with `config`; its Node informer sees only this test's
    /// Nodes (labelled with `run_id`).
    async fn start(fake: FakeCloud, config: RouteConfig) -> RouteTest {
        let cluster = TestCluster::start().await;
        let run_id = cluster.unique_name("run");
        let scope = InformerScope {
            node_labels: Some(format!("{LABEL}={run_id}")),
            ..InformerScope::default()
        };
        let controllers = ControllerHarness::builder(&cluster, fake.provider())
            .controller(route::NAME, move |ctx, _| route::run(ctx, config.clone()))
            .scope(scope)
            // The backoff of `test_config` (both queues).
            .retry_backoff(TEST_BACKOFF)
            .start()
            .await;
        RouteTest {
            cluster,
            fake,
            controllers,
            run_id,
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    /// Creates a Node labelled for this test with these pod CIDRs; returns its name.
    async fn node(&self, prefix: &str, pod_cidrs: &[&str]) -> Node {
        let name = self.cluster.unique_name(prefix);
        let mut b = kubelet_node(&name).label(LABEL, &self.run_id);
        if !pod_cidrs.is_empty() {
            b = b.pod_cidrs(pod_cidrs);
        }
        self.cluster.create(&b.build()).await
    }

    fn routes_of(&self, node: &str) -> Vec<Route> {
        let mut r: Vec<Route> = self
            .fake
            .routes()
            .into_iter()
            .filter(|r| r.target_node == node)
            .collect();
        r.sort_by(|a, b| a.destination_cidr.cmp(&b.destination_cidr));
        r
    }

    async fn wait_routes(&self, node: &str, cidrs: &[&str]) {
        let ok = eventually(WAIT, || async {
            let got: Vec<String> = self
                .routes_of(node)
                .into_iter()
                .map(|r| r.destination_cidr)
                .collect();
            got == cidrs
        })
        .await;
        assert!(
            ok,
            "routes of {node}: want {cidrs:?}, have {:?}",
            self.fake.routes()
        );
    }

    async fn wait_condition(&self, node: &str, status: &str, reason: &str) -> Node {
        wait_for(&self.nodes(), node, WAIT, |n: &Node| {
            network_unavailable(n)
                .is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason))
        })
        .await
        .unwrap()
    }

    /// Waits until the controller's own Node informer shows the condition: unlike
    /// [`RouteTest::wait_condition`] the test sends no request, so the API server's request log
    /// for the Node holds only the controller's.
    async fn wait_condition_cached(&self, node: &str, status: &str, reason: &str) {
        let set = eventually(WAIT, || async {
            self.controllers
                .context()
                .nodes
                .get(node)
                .and_then(|n| network_unavailable(&n.to_node()))
                .is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason))
        })
        .await;
        assert!(
            set,
            "NetworkUnavailable={status} ({reason}) never reached the informer"
        );
    }

    /// Waits until the controller made no cloud call for a while (a reconcile queued behind
    /// the one a test waited for may still run). A wait, not an assertion.
    async fn settle(&self) {
        let mut last = self.fake.call_counts();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.fake.call_counts();
            if now == last {
                return;
            }
            last = now;
        }
    }

    async fn stop(self) {
        self.controllers.stop().await.unwrap();
        self.cluster.cleanup().await;
    }
}

fn network_unavailable(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .cloned()
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap()
}

async fn failed_create_events(client: Client, node: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client, "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                && e.reason.as_deref() == Some("FailedToCreateRoute")
        })
        .collect()
}
