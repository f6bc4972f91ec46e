//! Node-IPAM controller tests: the real range allocator against the in-process API server.
//!
//! Skipped against a real cluster (`CCM_TEST_KUBECONFIG`): there, kube-controller-manager's own
//! node IPAM usually owns `spec.podCIDRs` (kind and kubeadm run it), and two allocators on one
//! cluster is exactly the configuration the docs warn against.

use std::collections::HashSet;
use std::time::Duration;

use ccm_controllers::controllers::node_ipam::{self, NodeIpamConfig};
use ccm_controllers::{ControllerContext, ControllerError, InformerScope};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use tokio::task::{JoinHandle, JoinSet};

const WAIT: Duration = Duration::from_secs(60);
const LABEL: &str = "node-ipam-test.ccm-rs.io/run";

struct Running {
    ctx: ControllerContext,
    _tasks: JoinSet<()>,
    controller: JoinHandle<Result<(), ControllerError>>,
}

impl Running {
    async fn stop(self) {
        self.ctx.shutdown.cancel();
        self.controller.await.unwrap().unwrap();
    }
}

fn config(clusters: &[&str], masks: &[u8], services: &[&str]) -> NodeIpamConfig {
    {
        let mut config = NodeIpamConfig::default();
        config.cluster_cidrs = clusters.iter().map(|c| c.parse().unwrap()).collect();
        config.node_mask_sizes = masks.to_vec();
        config.service_cidrs = services.iter().map(|c| c.parse().unwrap()).collect();
        config
    }
}

struct Harness {
    cluster: TestCluster,
    run_id: String,
}

impl Harness {
    async fn new() -> Option<Harness> {
        let cluster = TestCluster::start().await;
        if cluster.is_real() {
            // Skipped on a real cluster: its own node IPAM owns spec.podCIDRs.
            return None;
        }
        let run_id = cluster.unique_name("run");
        Some(Harness { cluster, run_id })
    }

    fn start(&self, config: NodeIpamConfig) -> Running {
        let scope = InformerScope {
            node_labels: Some(format!("{LABEL}={}", self.run_id)),
            ..InformerScope::default()
        };
        let (ctx, tasks) = ControllerContext::standalone_scoped(
            self.cluster.client(),
            FakeCloud::default().provider(),
            "kubernetes",
            &scope,
        );
        let controller = tokio::spawn(node_ipam::run_range_allocator(ctx.clone(), config));
        Running {
            ctx,
            _tasks: tasks,
            controller,
        }
    }

    fn node(&self, name: &str, pod_cidrs: &[&str]) -> Node {
        let mut b = kubelet_node(name).label(LABEL, &self.run_id);
        if !pod_cidrs.is_empty() {
            b = b.pod_cidrs(pod_cidrs);
        }
        b.build()
    }

    async fn create(&self, prefix: &str, pod_cidrs: &[&str]) -> String {
        let name = self.cluster.unique_name(prefix);
        self.cluster.create(&self.node(&name, pod_cidrs)).await;
        name
    }

    /// Creates `n` Nodes at once (50 requests in flight); returns their names.
    async fn create_many(&self, prefix: &str, n: usize) -> Vec<String> {
        let api: Api<Node> = Api::all(self.cluster.client());
        let names: Vec<String> = (0..n).map(|_| self.cluster.unique_name(prefix)).collect();
        futures::stream::iter(names.clone())
            .for_each_concurrent(50, |name| {
                let api = api.clone();
                let node = self.node(&name, &[]);
                async move {
                    api.create(&Default::default(), &node).await.unwrap();
                }
            })
            .await;
        names
    }

    async fn nodes(&self) -> Vec<Node> {
        let api: Api<Node> = Api::all(self.cluster.client());
        api.list(&ListParams::default().labels(&format!("{LABEL}={}", self.run_id)))
            .await
            .unwrap()
            .items
    }

    /// Waits until every Node of this test in `names` has pod CIDRs; returns name → CIDRs.
    async fn wait_cidrs(&self, names: &[String]) -> Vec<(String, Vec<String>)> {
        let wanted: HashSet<&String> = names.iter().collect();
        let seen = std::sync::Mutex::new(Vec::new());
        let done = eventually(WAIT, || async {
            let out: Vec<(String, Vec<String>)> = self
                .nodes()
                .await
                .into_iter()
                .filter(|n| wanted.contains(n.metadata.name.as_ref().unwrap()))
                .map(|n| {
                    let spec = n.spec.unwrap_or_default();
                    (n.metadata.name.unwrap(), spec.pod_cidrs.unwrap_or_default())
                })
                .collect();
            let ok = out.len() == names.len() && out.iter().all(|(_, c)| !c.is_empty());
            *seen.lock().unwrap() = out;
            ok
        })
        .await;
        let out = seen.into_inner().unwrap();
        assert!(
            done,
            "{} of {} nodes got pod CIDRs",
            out.iter().filter(|(_, c)| !c.is_empty()).count(),
            names.len()
        );
        out
    }

    async fn events(&self, node: &str, reason: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.cluster.client(), "default");
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }
}

fn assert_distinct_in(cidrs: &[(String, Vec<String>)], family: usize, range: &str) {
    let range: IpNet = range.parse().unwrap();
    let mut seen = HashSet::new();
    for (node, c) in cidrs {
        let cidr: IpNet = c[family].parse().unwrap();
        assert!(range.contains(&cidr), "{node}: {cidr} not in {range}");
        assert!(seen.insert(cidr), "{cidr} given twice (again to {node})");
    }
}

#[tokio::test]
async fn nodes_get_distinct_cidrs_existing_ones_are_kept_and_deletes_release() {
    let Some(h) = Harness::new().await else {
        return;
    };
    // A Node that already has a CIDR before the controller starts, and the Service range
    // inside the cluster CIDR: neither may be given out.
    let existing = h.create("existing", &["10.31.0.0/24"]).await;
    let running = h.start(config(&["10.31.0.0/22"], &[24], &["10.31.3.0/24"]));
    let a = h.create("a", &[]).await;
    let b = h.create("b", &[]).await;
    let got = h
        .wait_cidrs(&[existing.clone(), a.clone(), b.clone()])
        .await;
    assert_distinct_in(&got, 0, "10.31.0.0/22");
    let of = |n: &str| got.iter().find(|(x, _)| x == n).unwrap().1.clone();
    assert_eq!(of(&existing), vec!["10.31.0.0/24"]);
    let mut new: Vec<String> = [of(&a)[0].clone(), of(&b)[0].clone()].to_vec();
    new.sort();
    assert_eq!(new, vec!["10.31.1.0/24", "10.31.2.0/24"]);
    // podCIDR mirrors the first entry, as Go writes it.
    let node: Node = Api::all(h.cluster.client()).get(&a).await.unwrap();
    assert_eq!(node.spec.unwrap().pod_cidr, Some(of(&a)[0].clone()));

    // The range is full now; deleting a Node gives its CIDR to the next one.
    let api: Api<Node> = Api::all(h.cluster.client());
    api.delete(&a, &DeleteParams::default()).await.unwrap();
    let c = h.create("c", &[]).await;
    let got = h.wait_cidrs(std::slice::from_ref(&c)).await;
    assert_eq!(got[0].1, of(&a));

    let metrics = running.ctx.metrics.encode().unwrap();
    assert!(
        metrics
            .contains("node_ipam_controller_cidrset_usage_cidrs{clusterCIDR=\"10.31.0.0/22\"} 1.0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("node_ipam_controller_cirdset_max_cidrs{clusterCIDR=\"10.31.0.0/22\"} 4"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "node_ipam_controller_cidrset_cidrs_releases_total{clusterCIDR=\"10.31.0.0/22\"} 1"
        ),
        "{metrics}"
    );
    running.stop().await;
}

#[tokio::test]
async fn dual_stack_nodes_get_one_cidr_per_family() {
    let Some(h) = Harness::new().await else {
        return;
    };
    let running = h.start(config(&["10.32.0.0/16", "fd00:32::/56"], &[24, 64], &[]));
    let names = vec![h.create("ds", &[]).await, h.create("ds", &[]).await];
    let got = h.wait_cidrs(&names).await;
    for (node, c) in &got {
        assert_eq!(c.len(), 2, "{node}: {c:?}");
    }
    assert_distinct_in(&got, 0, "10.32.0.0/16");
    assert_distinct_in(&got, 1, "fd00:32::/56");
    running.stop().await;
}

#[tokio::test]
async fn exhausted_range_gives_cidr_not_available_event() {
    let Some(h) = Harness::new().await else {
        return;
    };
    let running = h.start(config(&["10.33.0.0/23"], &[24], &[]));
    let first = vec![h.create("x", &[]).await, h.create("x", &[]).await];
    h.wait_cidrs(&first).await;
    let late = h.create("late", &[]).await;
    let got_event = eventually(WAIT, || async {
        !h.events(&late, node_ipam::REASON_CIDR_NOT_AVAILABLE)
            .await
            .is_empty()
    })
    .await;
    assert!(got_event, "no CIDRNotAvailable event for {late}");
    let event = h
        .events(&late, node_ipam::REASON_CIDR_NOT_AVAILABLE)
        .await
        .remove(0);
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(
        event.note.as_deref(),
        Some(format!("Node {late} status is now: CIDRNotAvailable").as_str())
    );
    let node: Node = Api::all(h.cluster.client()).get(&late).await.unwrap();
    assert!(node.spec.unwrap().pod_cidrs.is_none());

    // A CIDR freed later goes to the waiting Node (its retry picks it up).
    let api: Api<Node> = Api::all(h.cluster.client());
    api.delete(&first[0], &DeleteParams::default())
        .await
        .unwrap();
    h.wait_cidrs(&[late]).await;
    running.stop().await;
}

/// 1,000 Nodes at once, then a second controller instance (a restart or a new leader) that
/// must not give any of their CIDRs again. 10.244.0.0/14 holds 1,024 /24s (a /16 only 256).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_nodes_at_once_and_a_restart_never_repeat_a_cidr() {
    let Some(h) = Harness::new().await else {
        return;
    };
    let cfg = config(&["10.244.0.0/14"], &[24], &[]);
    let first = h.start(cfg.clone());
    let names = h.create_many("burst", 1000).await;
    let got = h.wait_cidrs(&names).await;
    assert_distinct_in(&got, 0, "10.244.0.0/14");
    first.stop().await;

    // Second instance: rebuilt from the Nodes; 24 blocks are left.
    let second = h.start(cfg);
    let more = h.create_many("after", 24).await;
    let mut all = got;
    all.extend(h.wait_cidrs(&more).await);
    assert_eq!(all.len(), 1024);
    assert_distinct_in(&all, 0, "10.244.0.0/14");
    let over = h.create("over", &[]).await;
    let event = eventually(WAIT, || async {
        !h.events(&over, node_ipam::REASON_CIDR_NOT_AVAILABLE)
            .await
            .is_empty()
    })
    .await;
    assert!(event, "the 1,025th node must get CIDRNotAvailable");
    second.stop().await;
}

#[test]
fn config_validation_uses_gos_messages() {
    let err = |c: NodeIpamConfig| c.validate().unwrap_err().to_string();
    assert!(err(config(&[], &[], &[])).contains("Must specify --cluster-cidr"));
    assert!(
        err(config(&["10.0.0.0/16"], &[8], &[]))
            .contains("must be less than or equal to the node CIDR mask size")
    );
    assert!(
        err(config(&["10.0.0.0/16", "10.1.0.0/16"], &[24, 24], &[]))
            .contains("not configured as dual stack")
    );
    assert!(err(config(&["fd00::/40"], &[64], &[])).contains("the node CIDR size is too big"));
    assert!(
        err(config(
            &["10.0.0.0/16"],
            &[24],
            &["10.96.0.0/12", "10.0.0.0/24"]
        ))
        .contains("not dualstack")
    );
    assert!(
        config(&["10.0.0.0/16", "fd00::/48"], &[24, 64], &[])
            .validate()
            .is_ok()
    );
}
