//! Scale scenarios of the aws provider over HTTP against a real moto server: the framework's
//! controllers (ccm-testing's harness, in-process API server) with the provider, batch
//! capabilities on and off, printing the provider calls the framework made (what its
//! cloud-call budget counts), the HTTP requests the SDK sent and, for the node scenarios, the
//! Nodes of each `describe_instances` call.
//!
//! ```text
//! cargo bench --manifest-path examples/aws-ccm/Cargo.toml --bench moto -- \
//!     [--scenario node-burst|node-backlog|lb-burst|all] [--nodes 1000] [--services 100] [--batch on|off|both]
//!     [--latency-ms 0]
//! ```
//!
//! - node-burst: `--nodes` instances run, then as many Nodes register at once (named by their
//!   private DNS names, as kubelet names them, without provider IDs); measured until every one
//!   is initialised.
//! - node-backlog: the same Nodes registered before the controllers start (a CCM that was down,
//!   a new cluster), measured from the start until every one is initialised.
//! - lb-burst: 10 initialised Nodes, then `--services` LoadBalancer Services at once; measured
//!   until every one has its ingress, then one Node joins (until every load balancer has it as a
//!   target), then every Service is deleted (until moto lists nothing with the cluster tag).
//!
//! `--latency-ms N` adds N ms before each `describe_instances` of the node scenarios (a
//! cloud farther away than moto on loopback; the single calls of `--batch off` are not
//! delayed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_core::well_known::TAINT_UNINITIALIZED;
use ccm_core::{
    CloudProvider, CloudResult, InstanceAnswers, InstancesBatch, InstancesV2, async_trait,
};
use ccm_testing::TestCluster;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::eventually;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, ListParams};
use support::world::{World, provider_id};

const WAIT: Duration = Duration::from_secs(1800);

struct Opts {
    scenario: String,
    nodes: usize,
    services: usize,
    batch: Vec<bool>,
    latency: Duration,
}

fn opts() -> Opts {
    let mut o = Opts {
        scenario: "all".into(),
        nodes: 1000,
        services: 100,
        batch: vec![true, false],
        latency: Duration::ZERO,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--scenario" => o.scenario = value,
            "--nodes" => o.nodes = value.parse().expect("--nodes N"),
            "--services" => o.services = value.parse().expect("--services N"),
            "--latency-ms" => {
                o.latency = Duration::from_millis(value.parse().expect("--latency-ms N"))
            }
            "--batch" => {
                o.batch = match value.as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    _ => vec![true, false],
                }
            }
            // `cargo bench` passes --bench; ignore what is not ours.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

fn calls_line(calls: &BTreeMap<&'static str, u64>) -> String {
    calls
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn diff(
    after: &BTreeMap<&'static str, u64>,
    before: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    after
        .iter()
        .map(|(k, v)| (*k, v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

async fn launch(world: &World, n: usize) -> Vec<aws_sdk_ec2::types::Instance> {
    let mut all = Vec::new();
    while all.len() < n {
        let batch = (n - all.len()).min(200) as i32;
        all.extend(world.launch(batch).await);
    }
    all
}

/// The provider with its `describe_instances` calls recorded: how many Nodes each asked about
/// (the framework's batching, seen from the provider).
struct BatchSizes {
    inner: Arc<aws_ccm::AwsCloud>,
    sizes: Mutex<Vec<usize>>,
    /// Added before each `describe_instances` (`--latency-ms`: a cloud farther away than a
    /// moto on loopback).
    latency: Duration,
}

impl CloudProvider for BatchSizes {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner.instances_v2()
    }
    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        self.inner
            .instances_batch()
            .map(|_| self as &dyn InstancesBatch)
    }
}

#[async_trait]
impl InstancesBatch for BatchSizes {
    fn max_batch_size(&self) -> usize {
        self.inner
            .instances_batch()
            .map_or(1, |b| b.max_batch_size())
    }
    async fn describe_instances(
        &self,
        nodes: &[ccm_core::NodeView],
    ) -> CloudResult<InstanceAnswers> {
        self.sizes.lock().unwrap().push(nodes.len());
        tokio::time::sleep(self.latency).await;
        self.inner.describe_instances(nodes).await
    }
}

/// `n calls: mean m, max x; in call order: [..]` of the recorded batch sizes.
fn sizes_line(sizes: &[usize]) -> String {
    if sizes.is_empty() {
        return "no describe_instances calls".into();
    }
    let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
    let max = sizes.iter().max().copied().unwrap_or(0);
    format!(
        "{} describe_instances calls: mean {mean:.1} Nodes, max {max}; in call order: {sizes:?}",
        sizes.len()
    )
}

async fn node_burst(n: usize, batch: bool, backlog: bool, latency: Duration) {
    let world = World::with_options("bench-nodes", batch, 1).await;
    let instances = launch(&world, n).await;
    let cluster = TestCluster::start().await;
    // A burst: the Nodes register concurrently, as kubelets of a new node group do; with
    // `backlog`, they are all there before the CCM starts (a CCM that was down, a new cluster).
    let register = || {
        futures::stream::iter(&instances).for_each_concurrent(100, |instance| {
            let cluster = &cluster;
            async move {
                cluster
                    .create(&kubelet_node(instance.private_dns_name().unwrap()).build())
                    .await;
            }
        })
    };
    if backlog {
        register().await;
    }
    let recorder = Arc::new(BatchSizes {
        inner: world.cloud.clone(),
        sizes: Mutex::default(),
        latency,
    });
    let cloud: Arc<dyn CloudProvider> = recorder.clone();
    let (calls0, requests0) = (world.cloud.cloud_calls(), world.cloud.requests());
    let start = Instant::now();
    let harness = ControllerHarness::builder(&cluster, cloud)
        .flag("--cluster-name=bench-nodes")
        .flag("--cloud-api-qps=1000")
        .flag("--concurrent-node-syncs=200")
        .cloud_node()
        .start()
        .await;
    if !backlog {
        register().await;
    }
    let nodes: Api<Node> = Api::all(cluster.client());
    let done = eventually(WAIT, || async {
        let list = nodes.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .filter(|n| {
                !n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED))
            })
            .count()
            == n
    })
    .await;
    assert!(done, "not every Node was initialised");
    let elapsed = start.elapsed();
    let calls = diff(&world.cloud.cloud_calls(), &calls0);
    let total: u64 = calls.values().sum();
    let requests = world.cloud.requests() - requests0;
    println!(
        "{} nodes={n} batch={}: {total} cloud calls = {:.4} per Node ({}), {requests} SDK requests = {:.4} per Node, {:.1} s",
        if backlog {
            "node-backlog"
        } else {
            "node-burst"
        },
        if batch { "on" } else { "off" },
        total as f64 / n as f64,
        calls_line(&calls),
        requests as f64 / n as f64,
        elapsed.as_secs_f64()
    );
    println!("  {}", sizes_line(&recorder.sizes.lock().unwrap()));
    harness.stop().await.unwrap();
}

async fn lb_burst(m: usize, batch: bool) {
    let world = World::with_options("bench-lbs", batch, 1).await;
    let instances = launch(&world, 11).await;
    let cluster = TestCluster::start().await;
    let node = |i: usize| {
        kubelet_node(instances[i].private_dns_name().unwrap())
            .without_uninitialized_taint()
            .provider_id(&provider_id(&instances[i]))
            .build()
    };
    for i in 0..10 {
        cluster.create(&node(i)).await;
    }
    let cloud: Arc<dyn CloudProvider> = world.cloud.clone();
    let harness = ControllerHarness::builder(&cluster, cloud)
        .flag("--cluster-name=bench-lbs")
        .flag("--cloud-api-qps=1000")
        .flag("--concurrent-service-syncs=10")
        .service()
        .start()
        .await;
    let services: Api<Service> = Api::namespaced(cluster.client(), "default");
    let has_ingress = |s: &Service| {
        s.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| !i.is_empty())
    };
    let mode = if batch { "on" } else { "off" };

    let (calls0, requests0) = (world.cloud.cloud_calls(), world.cloud.requests());
    let start = Instant::now();
    for i in 0..m {
        cluster
            .create(&load_balancer_service("default", &format!("svc-{i}")).build())
            .await;
    }
    let done = eventually(WAIT, || async {
        services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|s| has_ingress(s))
            .count()
            == m
    })
    .await;
    assert!(done, "not every Service got its load balancer");
    report(
        "lb-burst create",
        m,
        mode,
        &world,
        &calls0,
        requests0,
        start.elapsed(),
    );

    // One Node joins: every load balancer gets it as a target.
    let (calls0, requests0) = (world.cloud.cloud_calls(), world.cloud.requests());
    let start = Instant::now();
    cluster.create(&node(10)).await;
    let new_id = instances[10].instance_id().unwrap().to_owned();
    let listed = services.list(&ListParams::default()).await.unwrap().items;
    let done = eventually(WAIT, || async {
        for svc in &listed {
            let name = ccm_core::default_load_balancer_name(svc);
            let targets = world.targets_of(&name).await.unwrap_or_default();
            if !targets.iter().all(|(_, ids)| ids.contains(&new_id)) || targets.is_empty() {
                return false;
            }
        }
        true
    })
    .await;
    assert!(done, "not every load balancer got the new Node");
    harness.settled().await;
    report(
        "lb-burst node-join",
        m,
        mode,
        &world,
        &calls0,
        requests0,
        start.elapsed(),
    );

    let (calls0, requests0) = (world.cloud.cloud_calls(), world.cloud.requests());
    let start = Instant::now();
    for i in 0..m {
        services
            .delete(&format!("svc-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let done = eventually(WAIT, || async {
        services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    assert!(done, "not every Service was deleted");
    let leaked = world.tagged_elb_resources().await;
    assert!(
        leaked.is_empty(),
        "load balancer resources leaked: {leaked:?}"
    );
    report(
        "lb-burst delete",
        m,
        mode,
        &world,
        &calls0,
        requests0,
        start.elapsed(),
    );
    harness.stop().await.unwrap();
}

fn report(
    what: &str,
    m: usize,
    mode: &str,
    world: &World,
    calls0: &BTreeMap<&'static str, u64>,
    requests0: u64,
    elapsed: Duration,
) {
    let calls = diff(&world.cloud.cloud_calls(), calls0);
    let total: u64 = calls.values().sum();
    let requests = world.cloud.requests() - requests0;
    println!(
        "{what} services={m} batch={mode}: {total} cloud calls = {:.2} per Service ({}), {requests} SDK requests = {:.2} per Service, {:.1} s",
        total as f64 / m as f64,
        calls_line(&calls),
        requests as f64 / m as f64,
        elapsed.as_secs_f64()
    );
}

fn main() {
    let o = opts();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for &batch in &o.batch {
            if o.scenario == "node-burst" || o.scenario == "all" {
                node_burst(o.nodes, batch, false, o.latency).await;
            }
            if o.scenario == "node-backlog" || o.scenario == "all" {
                node_burst(o.nodes, batch, true, o.latency).await;
            }
            if o.scenario == "lb-burst" || o.scenario == "all" {
                lb_burst(o.services, batch).await;
            }
        }
    });
}
