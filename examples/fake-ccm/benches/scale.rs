//! Scale benchmark: the `fake-ccm` binary, run as its own process against an API server, driven
//! through one scenario; prints a table of figures (and, with `--json`, one JSON line).
//!
//! ```sh
//! cargo bench -p fake-ccm --bench scale -- node-burst --nodes 1000 --latency-ms 0
//! cargo bench -p fake-ccm --bench scale -- node-burst --nodes 5000 --latency-ms 50 --quota 20 --batch
//! cargo bench -p fake-ccm --bench scale -- lb-burst --nodes 50 --services 200 --latency-ms 50
//! cargo bench -p fake-ccm --bench scale -- node-churn --nodes 50 --services 200 --add 20 --interval 0.05
//! cargo bench -p fake-ccm --bench scale -- steady --nodes 5000 --services 1000 --settle 60
//! cargo bench -p fake-ccm --bench scale -- floor --nodes 1000
//! cargo bench -p fake-ccm --bench scale -- route-burst --nodes 1000
//! ```
//!
//! The API server is the in-process one from `ccm-testing` unless `$CCM_TEST_KUBECONFIG` names a
//! kubeconfig (then a real cluster: the CCM acts on every Node and LoadBalancer Service of that
//! cluster, so use a throw-away one). See `docs/performance.md` for what each figure means.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    missing_docs,
    unreachable_pub
)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_core::InstanceMetadata;
use ccm_core::well_known::{
    CONDITION_NETWORK_UNAVAILABLE, FINALIZER_LOAD_BALANCER_CLEANUP,
    LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_INSTANCE_TYPE,
    LABEL_INSTANCE_TYPE_BETA, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use ccm_testing::apiserver::{ApiServer, RequestRecord};
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::FakeCloud;
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ContainerImage, Event, Namespace, Node, NodeCondition, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Command line

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// N tainted nodes registered as fast as possible; time until each is initialised.
    NodeBurst,
    /// N initialised nodes, then M LoadBalancer Services at once; time until each has an ingress.
    LbBurst,
    /// lb-burst, then K nodes join one every S seconds; load-balancer updates.
    NodeChurn,
    /// N nodes and M Services settled, then S seconds idle: memory, CPU, calls.
    Steady,
    /// node-burst without a CCM: the harness does the one PATCH per node itself.
    Floor,
    /// N nodes with pod CIDRs; time until each has its route and NetworkUnavailable=False.
    RouteBurst,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::NodeBurst => "node-burst",
            Scenario::LbBurst => "lb-burst",
            Scenario::NodeChurn => "node-churn",
            Scenario::Steady => "steady",
            Scenario::Floor => "floor",
            Scenario::RouteBurst => "route-burst",
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "scale",
    about = "Scale benchmark of the fake-ccm binary (see docs/performance.md)"
)]
struct Cli {
    /// Scenario to run.
    #[arg(value_enum)]
    scenario: Scenario,
    /// Nodes (default: node-burst/floor/route-burst 1000, lb-burst/node-churn 50, steady 5000).
    #[arg(long)]
    nodes: Option<usize>,
    /// LoadBalancer Services (default: lb-burst/node-churn 200, steady 1000).
    #[arg(long)]
    services: Option<usize>,
    /// Latency of every FakeCloud call in ms (default: lb-burst 50, others 0).
    #[arg(long)]
    latency_ms: Option<u64>,
    /// node-churn: nodes that join after the Services are up (default 20).
    #[arg(long)]
    add: Option<usize>,
    /// node-churn: seconds between two joins (default 0.05).
    #[arg(long)]
    interval: Option<f64>,
    /// steady: idle window in seconds (default 60).
    #[arg(long)]
    settle: Option<f64>,
    /// FakeCloud's overall API quota in calls per second (burst: the same number); a call over
    /// it is answered `Retry` with the time until a token frees (a cloud's 429). Default: none.
    #[arg(long)]
    quota: Option<f64>,
    /// Switch FakeCloud's batch capability (`InstancesBatch`, `describe_instances`) on.
    #[arg(long)]
    batch: bool,
    /// Most Nodes per `describe_instances` call (FakeCloud's default: 100).
    #[arg(long)]
    max_batch_size: Option<usize>,
    /// Also print the figures as one JSON line on stdout.
    #[arg(long)]
    json: bool,
    /// Give up a phase after this many seconds.
    #[arg(long, default_value_t = 900.0)]
    timeout: f64,
    /// Objects the harness creates concurrently.
    #[arg(long, default_value_t = 64)]
    create_concurrency: usize,
    /// Extra flag passed to fake-ccm (repeatable), e.g. `--ccm-arg=--kube-api-qps=500`.
    #[arg(long = "ccm-arg", allow_hyphen_values = true)]
    ccm_args: Vec<String>,
    /// Run fake-ccm under this program (split at spaces), for profiling, e.g.
    /// `--ccm-wrapper="heaptrack -o /tmp/ccm"`. The memory and CPU figures are then those of
    /// the wrapper's process, not of fake-ccm alone.
    #[arg(long)]
    ccm_wrapper: Option<String>,
}

#[derive(Clone, Debug)]
struct Opts {
    scenario: Scenario,
    nodes: usize,
    services: usize,
    latency_ms: u64,
    add: usize,
    interval: f64,
    settle: f64,
    timeout: Duration,
    concurrency: usize,
    ccm_args: Vec<String>,
    ccm_wrapper: Option<String>,
    quota: Option<f64>,
    batch: bool,
    max_batch_size: Option<usize>,
}

impl Opts {
    fn from_cli(c: &Cli) -> Opts {
        let s = c.scenario;
        let nodes = c.nodes.unwrap_or(match s {
            Scenario::LbBurst | Scenario::NodeChurn => 50,
            Scenario::Steady => 5000,
            _ => 1000,
        });
        let services = c.services.unwrap_or(match s {
            Scenario::LbBurst | Scenario::NodeChurn => 200,
            Scenario::Steady => 1000,
            _ => 0,
        });
        Opts {
            scenario: s,
            nodes,
            services,
            latency_ms: c
                .latency_ms
                .unwrap_or(if s == Scenario::LbBurst { 50 } else { 0 }),
            add: c.add.unwrap_or(20),
            interval: c.interval.unwrap_or(0.05),
            settle: c.settle.unwrap_or(60.0),
            timeout: Duration::from_secs_f64(c.timeout),
            concurrency: c.create_concurrency.max(1),
            ccm_args: c.ccm_args.clone(),
            ccm_wrapper: c.ccm_wrapper.clone(),
            quota: c.quota,
            batch: c.batch,
            max_batch_size: c.max_batch_size,
        }
    }

    fn json(&self) -> Value {
        let mut o = json!({ "nodes": self.nodes, "latency_ms": self.latency_ms });
        let m = o.as_object_mut().unwrap();
        match self.scenario {
            Scenario::LbBurst => {
                m.insert("services".into(), json!(self.services));
            }
            Scenario::NodeChurn => {
                m.insert("services".into(), json!(self.services));
                m.insert("add".into(), json!(self.add));
                m.insert("interval_s".into(), json!(self.interval));
            }
            Scenario::Steady => {
                m.insert("services".into(), json!(self.services));
                m.insert("settle_s".into(), json!(self.settle));
            }
            Scenario::Floor => {
                m.remove("latency_ms");
            }
            _ => {}
        }
        if let Some(quota) = self.quota {
            m.insert("quota_per_s".into(), json!(quota));
        }
        if self.batch {
            m.insert("batch".into(), json!(true));
        }
        if let Some(max) = self.max_batch_size {
            m.insert("max_batch_size".into(), json!(max));
        }
        if !self.ccm_args.is_empty() {
            m.insert("ccm_args".into(), json!(self.ccm_args));
        }
        if let Some(wrapper) = &self.ccm_wrapper {
            m.insert("ccm_wrapper".into(), json!(wrapper));
        }
        o
    }
}

// ---------------------------------------------------------------------------------------------
// Environment: API server, names, progress

/// Where the scenario runs.
struct Env {
    client: kube::Client,
    /// How to reach the API server: the observer builds a client of its own from it.
    config: kube::Config,
    server: Option<ApiServer>,
    kubeconfig: Option<PathBuf>,
    /// Unique per run: label value, name prefix, namespace.
    run: String,
    started: Instant,
}

const RUN_LABEL: &str = "bench.ccm-rs.io/run";
const CCM_AGENT: &str = "cloud-controller-manager/";
const LB_IP: &str = "203.0.113.10";

impl Env {
    async fn start() -> Env {
        let run = format!(
            "bench-{}-{}",
            std::process::id(),
            jiff::Timestamp::now().as_second() % 100_000
        );
        match std::env::var_os("CCM_TEST_KUBECONFIG") {
            Some(path) => {
                let path = PathBuf::from(path);
                let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
                let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .unwrap();
                eprintln!("[bench] real cluster from {}", path.display());
                Env {
                    client: kube::Client::try_from(config.clone()).unwrap(),
                    config,
                    server: None,
                    kubeconfig: Some(path),
                    run,
                    started: Instant::now(),
                }
            }
            None => {
                let server = ApiServer::start().await;
                Env {
                    client: server.client(),
                    config: kube::Config::new(server.url().parse().unwrap()),
                    server: Some(server),
                    kubeconfig: None,
                    run,
                    started: Instant::now(),
                }
            }
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.run)
    }

    fn node_name(&self, i: usize) -> String {
        format!("{}-n{i:05}", self.run)
    }

    fn service_name(&self, i: usize) -> String {
        format!("lb-{i:05}")
    }

    fn selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.run)
    }

    async fn create_namespace(&self) {
        let ns: Api<Namespace> = Api::all(self.client.clone());
        let obj: Namespace = serde_json::from_value(json!({
            "metadata": { "name": self.run, "labels": { RUN_LABEL: self.run } }
        }))
        .unwrap();
        ns.create(&PostParams::default(), &obj).await.unwrap();
    }

    /// The CCM's requests recorded by the in-process server (None on a real cluster).
    fn ccm_requests(&self) -> Option<Vec<RequestRecord>> {
        self.server.as_ref().map(|s| {
            s.requests()
                .into_iter()
                .filter(|r| {
                    r.user_agent
                        .as_deref()
                        .is_some_and(|a| a.starts_with(CCM_AGENT))
                })
                .collect()
        })
    }

    fn clear_requests(&self) {
        if let Some(s) = &self.server {
            s.clear_requests();
        }
    }

    /// Deletes what this run created (only matters on a real cluster).
    async fn cleanup(&self) {
        if self.server.is_some() {
            return;
        }
        eprintln!("[bench] cleaning up nodes and namespace {}", self.run);
        let lp = ListParams::default().labels(&self.selector());
        let _ = self
            .nodes()
            .delete_collection(&DeleteParams::default(), &lp)
            .await;
        let svcs = self.services();
        if let Ok(list) = svcs.list(&lp).await {
            for s in list {
                let name = s.metadata.name.unwrap_or_default();
                let _ = svcs
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        let ns: Api<Namespace> = Api::all(self.client.clone());
        let _ = ns.delete(&self.run, &DeleteParams::default()).await;
    }
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Prints one status line to stderr every second until dropped.
struct Progress(tokio::task::JoinHandle<()>);

impl Progress {
    fn start(label: &str, line: impl Fn() -> String + Send + 'static) -> Progress {
        let label = label.to_string();
        let started = Instant::now();
        Progress(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                eprintln!(
                    "[{label}] {:>6.1}s  {}",
                    started.elapsed().as_secs_f64(),
                    line()
                );
            }
        }))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            panic!("[bench] gave up waiting for {what} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Objects as kubelets and users write them

/// 40 images as a node running a typical add-on set reports them.
const IMAGES: [(&str, &str, i64); 40] = [
    ("registry.k8s.io/kube-proxy", "v1.33.0", 31_212_118),
    ("registry.k8s.io/pause", "3.10", 320_368),
    ("registry.k8s.io/coredns/coredns", "v1.12.0", 20_938_480),
    ("registry.k8s.io/etcd", "3.5.21-0", 58_938_593),
    (
        "registry.k8s.io/metrics-server/metrics-server",
        "v0.7.2",
        19_494_617,
    ),
    (
        "registry.k8s.io/ingress-nginx/controller",
        "v1.12.1",
        105_347_180,
    ),
    (
        "registry.k8s.io/sig-storage/csi-node-driver-registrar",
        "v2.13.0",
        10_847_292,
    ),
    (
        "registry.k8s.io/sig-storage/livenessprobe",
        "v2.15.0",
        10_211_946,
    ),
    (
        "registry.k8s.io/sig-storage/csi-provisioner",
        "v5.2.0",
        30_417_321,
    ),
    (
        "registry.k8s.io/sig-storage/csi-attacher",
        "v4.8.1",
        28_114_623,
    ),
    (
        "registry.k8s.io/sig-storage/csi-resizer",
        "v1.13.2",
        28_703_114,
    ),
    (
        "registry.k8s.io/sig-storage/csi-snapshotter",
        "v8.2.1",
        29_001_870,
    ),
    (
        "registry.k8s.io/kube-state-metrics/kube-state-metrics",
        "v2.15.0",
        21_302_445,
    ),
    ("docker.io/calico/node", "v3.29.3", 146_508_271),
    ("docker.io/calico/cni", "v3.29.3", 96_512_664),
    ("docker.io/calico/kube-controllers", "v3.29.3", 34_814_021),
    ("docker.io/calico/typha", "v3.29.3", 31_405_930),
    ("quay.io/cilium/cilium", "v1.17.3", 223_604_412),
    ("quay.io/cilium/operator-generic", "v1.17.3", 32_201_117),
    ("quay.io/prometheus/node-exporter", "v1.9.1", 12_411_380),
    ("quay.io/prometheus/prometheus", "v3.3.0", 117_322_416),
    (
        "quay.io/prometheus-operator/prometheus-config-reloader",
        "v0.82.0",
        12_880_120,
    ),
    ("docker.io/grafana/grafana", "11.6.0", 181_320_051),
    ("docker.io/grafana/loki", "3.4.3", 38_120_004),
    ("docker.io/grafana/promtail", "3.4.3", 79_310_217),
    ("docker.io/fluent/fluent-bit", "4.0.1", 35_930_612),
    ("docker.io/library/nginx", "1.27.5", 72_195_292),
    ("docker.io/library/redis", "7.4.2", 45_321_877),
    ("docker.io/library/postgres", "17.4", 154_902_334),
    ("docker.io/library/busybox", "1.37.0", 2_156_541),
    ("docker.io/library/alpine", "3.21.3", 3_653_068),
    ("docker.io/bitnami/kubectl", "1.33.0", 87_001_215),
    (
        "quay.io/jetstack/cert-manager-controller",
        "v1.17.2",
        21_882_301,
    ),
    (
        "quay.io/jetstack/cert-manager-webhook",
        "v1.17.2",
        17_410_952,
    ),
    (
        "quay.io/jetstack/cert-manager-cainjector",
        "v1.17.2",
        16_551_320,
    ),
    (
        "ghcr.io/external-secrets/external-secrets",
        "v0.16.1",
        33_016_845,
    ),
    ("quay.io/argoproj/argocd", "v2.14.10", 176_112_049),
    ("docker.io/istio/proxyv2", "1.25.2", 91_833_271),
    ("docker.io/istio/pilot", "1.25.2", 75_402_118),
    ("docker.io/envoyproxy/envoy", "v1.34.0", 64_217_330),
];

/// A stable fake sha256 digest (64 hex digits) for an image.
fn digest(seed: &str) -> String {
    // FNV-1a, stretched to 256 bits: the digest only has to look like one and be stable.
    let mut out = String::with_capacity(64);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0u8..4 {
        for b in seed.bytes().chain([round]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

fn images() -> Vec<ContainerImage> {
    IMAGES
        .iter()
        .map(|(repo, tag, size)| ContainerImage {
            names: Some(vec![
                format!("{repo}@sha256:{}", digest(&format!("{repo}:{tag}"))),
                format!("{repo}:{tag}"),
            ]),
            size_bytes: Some(*size),
        })
        .collect()
}

/// How a node starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NodeKind {
    /// Registered by `kubelet --cloud-provider=external`: uninitialized taint.
    Tainted,
    /// Already initialised by an earlier CCM (provider ID, labels, cloud addresses).
    Initialised,
    /// Initialised, with a pod CIDR and `NetworkUnavailable=True` (no route yet).
    NeedsRoute(usize),
}

/// A Node as a kubelet writes it: capacity/allocatable, nodeInfo, the four kubelet conditions
/// plus `NetworkUnavailable`, 40 images.
fn node(env: &Env, i: usize, kind: NodeKind, meta: Option<&InstanceMetadata>) -> Node {
    let name = env.node_name(i);
    let mut b = kubelet_node(&name).label(RUN_LABEL, &env.run);
    if let NodeKind::NeedsRoute(j) = kind {
        let cidr = format!("10.{}.{}.0/24", (j / 256) % 256, j % 256);
        b = b.pod_cidrs(&[&cidr]);
    }
    if kind != NodeKind::Tainted {
        let m = meta.expect("metadata for an initialised node");
        b = b
            .without_uninitialized_taint()
            .provider_id(&m.provider_id)
            .label(LABEL_TOPOLOGY_ZONE, &m.zone)
            .label(LABEL_FAILURE_DOMAIN_BETA_ZONE, &m.zone)
            .label(LABEL_TOPOLOGY_REGION, &m.region)
            .label(LABEL_FAILURE_DOMAIN_BETA_REGION, &m.region)
            .label(LABEL_INSTANCE_TYPE, &m.instance_type)
            .label(LABEL_INSTANCE_TYPE_BETA, &m.instance_type)
            .addresses(m.node_addresses.clone());
        for (k, v) in &m.additional_labels {
            b = b.label(k, v);
        }
    }
    let mut n = b.build();
    let status = n.status.as_mut().unwrap();
    status.images = Some(images());
    let (st, reason, message) = match kind {
        NodeKind::NeedsRoute(_) => ("True", "NoRouteCreated", "Node created without a route"),
        _ => ("False", "RouteCreated", "RouteController created a route"),
    };
    let now = Time(jiff::Timestamp::now());
    status.conditions.as_mut().unwrap().push(NodeCondition {
        type_: CONDITION_NETWORK_UNAVAILABLE.to_string(),
        status: st.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now),
    });
    n
}

/// What FakeCloud (default config, as fake-ccm runs it) reports for a node.
async fn metadata(env: &Env, i: usize) -> InstanceMetadata {
    let cloud = FakeCloud::default();
    let n = kubelet_node(&env.node_name(i)).build();
    let v2 = ccm_core::CloudProvider::instances_v2(&cloud).unwrap();
    v2.instance_metadata(&n).await.unwrap()
}

fn is_initialised(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED));
    let zoned = n
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_TOPOLOGY_ZONE));
    let provider = spec
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|p| !p.is_empty());
    !tainted && zoned && provider
}

fn network_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == CONDITION_NETWORK_UNAVAILABLE && c.status == "False")
        })
}

fn has_ingress(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

// ---------------------------------------------------------------------------------------------
// Tracking: creation times (harness) and the times the watch first saw a state

#[derive(Default)]
struct Track {
    node_created: HashMap<String, Instant>,
    node_initialised: HashMap<String, Instant>,
    node_network: HashMap<String, Instant>,
    svc_created: HashMap<String, Instant>,
    svc_ingress: HashMap<String, Instant>,
}

type Shared = Arc<Mutex<Track>>;

fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Track> {
    t.lock().unwrap()
}

/// A task on a thread and runtime of its own, with a client (and so connections) of its own;
/// stopped and joined on drop.
///
/// The harness's observers and the floor's patcher run this way. On the harness's runtime they
/// shared two worker threads with the in-process API server and the 64 creating tasks, and fell
/// up to 2 s behind the cluster in node-burst: the CCM's own taint-removal counter showed 385 of
/// 435 created Nodes untainted while the harness's watch had seen 5. A figure is the cluster's,
/// not the harness's queueing.
struct OwnThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OwnThread {
    fn start<F, Fut>(name: &str, env: &Env, task: F) -> OwnThread
    where
        F: FnOnce(kube::Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = env.config.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let client = kube::Client::try_from(config).unwrap();
                    tokio::select! {
                        _ = task(client) => {}
                        _ = stopped => {}
                    }
                });
            })
            .unwrap();
        OwnThread {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Watches this run's Nodes and Services and records when each first reaches its states.
type Observer = OwnThread;

fn observe(env: &Env, track: &Shared) -> Observer {
    let run = env.run.clone();
    let cfg = watcher::Config::default().labels(&env.selector());
    let track = track.clone();
    OwnThread::start("bench-observer", env, move |client| async move {
        let nodes = watch_nodes(Api::all(client.clone()), cfg.clone(), track.clone());
        let services = watch_services(Api::namespaced(client, &run), cfg, track);
        futures::future::join(nodes, services).await;
    })
}

async fn watch_nodes(api: Api<Node>, cfg: watcher::Config, t: Shared) {
    let stream = watcher(api, cfg).default_backoff().applied_objects();
    futures::pin_mut!(stream);
    while let Ok(Some(n)) = stream.try_next().await {
        let now = Instant::now();
        let name = n.metadata.name.clone().unwrap_or_default();
        let mut g = lock(&t);
        if is_initialised(&n) {
            g.node_initialised.entry(name.clone()).or_insert(now);
        }
        if network_ready(&n) {
            g.node_network.entry(name).or_insert(now);
        }
    }
}

async fn watch_services(api: Api<Service>, cfg: watcher::Config, t: Shared) {
    let stream = watcher(api, cfg).default_backoff().applied_objects();
    futures::pin_mut!(stream);
    while let Ok(Some(s)) = stream.try_next().await {
        let now = Instant::now();
        if has_ingress(&s) {
            let name = s.metadata.name.clone().unwrap_or_default();
            lock(&t).svc_ingress.entry(name).or_insert(now);
        }
    }
}

/// Creates nodes `range` concurrently as kubelet registers them, recording each one's creation
/// time (when the API server answered the create).
///
/// Kubelet registers in two steps, concurrently with the CCM: it creates the Node (with the
/// status it has computed, addresses included), then right after sends its first status
/// update, a strategic-merge PATCH of `nodes/status` with what changed in its view (the
/// `Ready` heartbeat, capacity, allocatable; not the addresses, which it leaves alone once
/// set). That write bumps the Node's resourceVersion while the CCM initialises it, as on a real
/// cluster.
async fn create_nodes(
    env: &Env,
    track: &Shared,
    range: std::ops::Range<usize>,
    kind: impl Fn(usize) -> NodeKind,
    concurrency: usize,
) {
    let mut metas = HashMap::new();
    for i in range.clone() {
        if kind(i) != NodeKind::Tainted {
            metas.insert(i, metadata(env, i).await);
        }
    }
    let objs: Vec<Node> = range
        .map(|i| node(env, i, kind(i), metas.get(&i)))
        .collect();
    let api = env.nodes();
    futures::stream::iter(objs)
        .map(|n| {
            let api = api.clone();
            let track = track.clone();
            async move {
                let created = api.create(&PostParams::default(), &n).await.unwrap();
                let now = Instant::now();
                let name = created.metadata.name.unwrap_or_default();
                lock(&track).node_created.insert(name.clone(), now);
                api.patch_status(&name, &PatchParams::default(), &kubelet_status_patch())
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
}

/// Kubelet's first status update after it registered a Node.
fn kubelet_status_patch() -> Patch<Value> {
    let now = Time(jiff::Timestamp::now());
    let resources = json!({"cpu": "4", "memory": "16374504Ki", "pods": "110",
                           "ephemeral-storage": "101430960Ki"});
    Patch::Strategic(json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now,
        }],
    }}))
}

/// Creates Services `range` concurrently (`ready`: with the finalizer and the ingress the CCM
/// would have written, as after an earlier CCM run).
async fn create_services(
    env: &Env,
    track: &Shared,
    range: std::ops::Range<usize>,
    ready: bool,
    concurrency: usize,
) {
    let api = env.services();
    futures::stream::iter(range)
        .map(|i| {
            let api = api.clone();
            let track = track.clone();
            let mut b = load_balancer_service(&env.run, &env.service_name(i))
                .label(RUN_LABEL, &env.run);
            if ready {
                b = b.finalizer(FINALIZER_LOAD_BALANCER_CLEANUP);
            }
            let s = b.build();
            async move {
                let created = api.create(&PostParams::default(), &s).await.unwrap();
                let now = Instant::now();
                let name = created.metadata.name.unwrap_or_default();
                lock(&track).svc_created.insert(name.clone(), now);
                if ready {
                    api.patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({
                            "status": {"loadBalancer": {"ingress": [{"ip": LB_IP, "ipMode": "VIP"}]}}
                        })),
                    )
                    .await
                    .unwrap();
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
}

// ---------------------------------------------------------------------------------------------
// The CCM process

struct Ccm {
    child: tokio::process::Child,
    pid: u32,
    http: kube::Client,
    log: PathBuf,
    config: PathBuf,
    clk_tck: f64,
    /// Started under `--ccm-wrapper` in a process group of its own, which is signalled whole
    /// (the wrapper's children would outlive a signal to the wrapper alone).
    group: bool,
}

impl Ccm {
    /// SIGTERM to fake-ccm itself, also when it runs under a wrapper (which then finishes,
    /// e.g. writes its profile, and exits).
    fn terminate(&self) {
        let pid = self.pid.to_string();
        let _ = if self.group {
            std::process::Command::new("pkill")
                .args(["-TERM", "-g", &pid, "-x", "fake-ccm"])
                .status()
        } else {
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
        };
    }
}

impl Drop for Ccm {
    fn drop(&mut self) {
        // `kill_on_drop` reaches the wrapper only; its process group holds the rest.
        if self.group {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.pid)])
                .status();
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct ProcStats {
    rss_kb: u64,
    hwm_kb: u64,
    cpu_s: f64,
}

/// Prometheus text: (name, labels) -> value.
#[derive(Clone, Debug, Default)]
struct Metrics(Vec<(String, BTreeMap<String, String>, f64)>);

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            // Label values here never contain `",` (operation names, codes, methods, hosts).
            for pair in labels.split("\",") {
                if let Some((k, v)) = pair.split_once("=\"") {
                    map.insert(k.trim().to_string(), v.trim_end_matches('"').to_string());
                }
            }
            out.push((name.to_string(), map, value));
        }
        Metrics(out)
    }

    /// Sums `name` by the value of `label`.
    fn by(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (n, labels, v) in &self.0 {
            if n == name {
                let key = labels.get(label).cloned().unwrap_or_default();
                *out.entry(key).or_insert(0.0) += v;
            }
        }
        out
    }

    fn cloud_calls(&self) -> BTreeMap<String, f64> {
        self.by("cloud_provider_requests_total", "operation")
    }
}

fn diff(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn clk_tck() -> f64 {
    // `getconf CLK_TCK` instead of libc::sysconf: the workspace forbids unsafe code.
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

impl Ccm {
    async fn start(env: &Env, opts: &Opts, routes: bool) -> Ccm {
        let dir = std::env::temp_dir();
        let config = dir.join(format!("{}-fake-cloud.yaml", env.run));
        // One ingress IP for every load balancer: the Services created `ready` carry it.
        let mut cloud_config = format!("latency_ms: {}\nlb_ip: {LB_IP}\n", opts.latency_ms);
        if let Some(quota) = opts.quota {
            let burst = quota.ceil().max(1.0) as u32;
            cloud_config.push_str(&format!(
                "quota:\n  overall: {{per_second: {quota}, burst: {burst}}}\n"
            ));
        }
        if opts.batch {
            cloud_config.push_str("capabilities:\n  instances_batch: true\n");
        }
        if let Some(max) = opts.max_batch_size {
            cloud_config.push_str(&format!("max_batch_size: {max}\n"));
        }
        std::fs::write(&config, cloud_config).unwrap();
        let log = dir.join(format!("{}-fake-ccm.log", env.run));
        let port = free_port();
        let binary = env!("CARGO_BIN_EXE_fake-ccm");
        let mut cmd = match opts.ccm_wrapper.as_deref().map(str::split_whitespace) {
            Some(mut words) => {
                let mut cmd =
                    tokio::process::Command::new(words.next().expect("empty --ccm-wrapper"));
                cmd.args(words).arg(binary).process_group(0);
                cmd
            }
            None => tokio::process::Command::new(binary),
        };
        match (&env.server, &env.kubeconfig) {
            (Some(s), _) => cmd.arg(format!("--master={}", s.url())),
            (None, Some(k)) => cmd.arg(format!("--kubeconfig={}", k.display())),
            (None, None) => unreachable!(),
        };
        cmd.arg("--cloud-provider=fake")
            .arg(format!("--cloud-config={}", config.display()))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            // HTTPS with a self-signed certificate and delegated authorisation, as in Go;
            // the harness reads /metrics without credentials.
            .arg("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics");
        if routes {
            cmd.arg("--configure-cloud-routes=true")
                .arg("--cluster-cidr=10.0.0.0/8");
        } else {
            cmd.arg("--configure-cloud-routes=false");
        }
        cmd.args(&opts.ccm_args);
        let logfile = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(Stdio::from(logfile.try_clone().unwrap()))
            .stderr(Stdio::from(logfile))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        eprintln!(
            "[bench] fake-ccm pid {pid}, metrics on 127.0.0.1:{port}, log {}",
            log.display()
        );
        let url: http::Uri = format!("https://127.0.0.1:{port}").parse().unwrap();
        let mut http_config = kube::Config::new(url);
        http_config.accept_invalid_certs = true;
        let http = kube::Client::try_from(http_config).unwrap();
        let mut ccm = Ccm {
            child,
            pid,
            http,
            log,
            config,
            clk_tck: clk_tck(),
            group: opts.ccm_wrapper.is_some(),
        };
        ccm.wait_ready(Duration::from_secs(120)).await;
        ccm
    }

    async fn get(&self, path: &str) -> Result<String, kube::Error> {
        let req = http::Request::get(path).body(Vec::new()).unwrap();
        self.http.request_text(req).await
    }

    async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.get("/readyz").await.is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("[bench] fake-ccm exited with {status}:\n{log}");
            }
            if Instant::now() > deadline {
                panic!(
                    "[bench] fake-ccm not ready after {timeout:?}; log {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the CCM has sent no API request for 3 s (its own client metrics; at most
    /// 120 s), so that writes still queued behind the client rate limiter are counted.
    async fn quiet(&self) {
        let still = Duration::from_secs(3);
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last = -1.0;
        let mut since = Instant::now();
        while Instant::now() < deadline {
            let total: f64 = self
                .metrics()
                .await
                .by("rest_client_requests_total", "method")
                .values()
                .sum();
            if total != last {
                last = total;
                since = Instant::now();
            } else if since.elapsed() >= still {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        eprintln!("[bench] the CCM still sends requests after 120 s; measuring anyway");
    }

    async fn metrics(&self) -> Metrics {
        Metrics::parse(&self.get("/metrics").await.unwrap())
    }

    fn proc(&self) -> ProcStats {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap();
        // Fields after "(comm)": state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ProcStats {
            rss_kb: field("VmRSS:"),
            hwm_kb: field("VmHWM:"),
            cpu_s: ticks as f64 / self.clk_tck,
        }
    }

    /// SIGTERM, then up to 30 s for a graceful exit.
    async fn stop(mut self) {
        self.terminate();
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(s)) if s.success() => {}
            Ok(Ok(s)) => eprintln!(
                "[bench] fake-ccm exited with {s}; log {}",
                self.log.display()
            ),
            _ => {
                eprintln!("[bench] fake-ccm did not stop within 30 s; killing it");
                let _ = self.child.kill().await;
            }
        }
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Polls the CCM's cloud-call counters for `ops` and remembers when they last changed.
struct CallWatch {
    last_change: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CallWatch {
    fn start(ccm: &Ccm, ops: &'static [&'static str]) -> CallWatch {
        let last_change = Arc::new(Mutex::new(None));
        let lc = last_change.clone();
        let http = ccm.http.clone();
        let task = tokio::spawn(async move {
            let mut last = -1.0;
            loop {
                let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
                if let Ok(text) = http.request_text(req).await {
                    let now = Instant::now();
                    let calls = Metrics::parse(&text).cloud_calls();
                    let total: f64 = ops.iter().filter_map(|o| calls.get(*o)).sum();
                    if last >= 0.0 && total != last {
                        *lc.lock().unwrap() = Some(now);
                    }
                    last = total;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        CallWatch { last_change, task }
    }

    fn last_change(&self) -> Option<Instant> {
        *self.last_change.lock().unwrap()
    }
}

impl Drop for CallWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Figures

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

struct Row {
    figure: String,
    value: String,
    target: String,
    verdict: String,
}

struct Report {
    scenario: Scenario,
    opts: Value,
    rows: Vec<Row>,
    figures: serde_json::Map<String, Value>,
    targets: serde_json::Map<String, Value>,
    notes: Vec<String>,
}

impl Report {
    fn new(opts: &Opts) -> Report {
        Report {
            scenario: opts.scenario,
            opts: opts.json(),
            rows: Vec::new(),
            figures: serde_json::Map::new(),
            targets: serde_json::Map::new(),
            notes: Vec::new(),
        }
    }

    fn fig(&mut self, key: &str, label: &str, value: Value, shown: String) {
        self.figures.insert(key.to_string(), value);
        self.rows.push(Row {
            figure: label.to_string(),
            value: shown,
            target: String::new(),
            verdict: String::new(),
        });
    }

    fn secs(&mut self, key: &str, label: &str, d: Duration) {
        self.fig(
            key,
            label,
            json!(secs(d)),
            format!("{:.3} s", d.as_secs_f64()),
        );
    }

    /// A figure with a target; `applies` is false when the run's size differs from the size
    /// the target is stated for (then it is shown, not judged).
    #[allow(clippy::too_many_arguments)]
    fn target(
        &mut self,
        key: &str,
        label: &str,
        value: f64,
        shown: String,
        target: &str,
        ok: bool,
        miss: String,
        applies: bool,
    ) {
        self.figures.insert(key.to_string(), json!(value));
        let verdict = match (applies, ok) {
            (false, _) => "(size differs)".to_string(),
            (true, true) => "met".to_string(),
            (true, false) => format!("MISSED: {miss}"),
        };
        self.targets.insert(
            key.to_string(),
            json!({ "target": target, "met": ok, "applies": applies }),
        );
        self.rows.push(Row {
            figure: label.to_string(),
            value: shown,
            target: target.to_string(),
            verdict,
        });
    }

    fn counts(&mut self, key: &str, label: &str, counts: &BTreeMap<String, f64>, per: usize) {
        let per = per.max(1) as f64;
        let map: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(k, v)| (k.clone(), json!((v / per * 1000.0).round() / 1000.0)))
            .collect();
        self.figures.insert(key.to_string(), Value::Object(map));
        if counts.is_empty() {
            self.rows.push(Row {
                figure: label.to_string(),
                value: "none".to_string(),
                target: String::new(),
                verdict: String::new(),
            });
        }
        for (i, (k, v)) in counts.iter().enumerate() {
            self.rows.push(Row {
                figure: if i == 0 {
                    label.to_string()
                } else {
                    String::new()
                },
                value: format!("{:.3}  {k}", v / per),
                target: String::new(),
                verdict: String::new(),
            });
        }
    }

    fn latencies(&mut self, key: &str, label: &str, mut lat: Vec<Duration>) {
        lat.sort();
        for (p, name) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (1.0, "max")] {
            let d = percentile(&lat, p);
            self.secs(&format!("{key}_{name}_s"), &format!("{label} {name}"), d);
        }
    }

    fn proc(&mut self, p: ProcStats) {
        self.fig(
            "ccm_rss_mb",
            "CCM resident memory (VmRSS)",
            json!(p.rss_kb as f64 / 1024.0),
            format!("{:.1} MB", p.rss_kb as f64 / 1024.0),
        );
        self.fig(
            "ccm_peak_rss_mb",
            "CCM peak resident memory (VmHWM)",
            json!(p.hwm_kb as f64 / 1024.0),
            format!("{:.1} MB", p.hwm_kb as f64 / 1024.0),
        );
        self.fig(
            "ccm_cpu_s",
            "CCM CPU time since start",
            json!(p.cpu_s),
            format!("{:.2} s", p.cpu_s),
        );
    }

    fn print(&self, json_line: bool, machine: &Value) {
        let w0 = self.rows.iter().map(|r| r.figure.len()).max().unwrap_or(0);
        let w1 = self.rows.iter().map(|r| r.value.len()).max().unwrap_or(0);
        let w2 = self.rows.iter().map(|r| r.target.len()).max().unwrap_or(0);
        println!();
        println!("scale {} {}", self.scenario.name(), self.opts);
        println!(
            "machine: {} cores, {}, load {} -> {}",
            machine["cores"], machine["cpu"], machine["load_start"], machine["load_end"]
        );
        println!("{}", "-".repeat(w0 + w1 + w2 + 20));
        for r in &self.rows {
            println!(
                "{:<w0$}  {:<w1$}  {:<w2$}  {}",
                r.figure, r.value, r.target, r.verdict
            );
        }
        for n in &self.notes {
            println!("note: {n}");
        }
        if json_line {
            let line = json!({
                "scenario": self.scenario.name(),
                "options": self.opts,
                "machine": machine,
                "figures": self.figures,
                "targets": self.targets,
                "notes": self.notes,
            });
            println!("{line}");
        }
    }
}

/// API requests by "verb resource[/subresource]".
fn request_counts(reqs: &[RequestRecord]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for r in reqs {
        let res = match &r.subresource {
            Some(s) => format!("{}/{s}", r.resource),
            None => r.resource.clone(),
        };
        let key = if r.status >= 400 {
            format!("{} {res} ({})", r.verb, r.status)
        } else {
            format!("{} {res}", r.verb)
        };
        *out.entry(key).or_insert(0.0) += 1.0;
    }
    out
}

/// Requests that change or create something (everything but get/list/watch).
fn writes(reqs: &[RequestRecord]) -> usize {
    reqs.iter()
        .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
        .count()
}

/// API request figures: from the in-process request log, or from the CCM's own client metrics
/// on a real cluster.
fn api_figures(
    report: &mut Report,
    env: &Env,
    before: &Metrics,
    after: &Metrics,
    per: usize,
    unit: &str,
) -> Option<f64> {
    match env.ccm_requests() {
        Some(reqs) => {
            let total = reqs.len() as f64 / per.max(1) as f64;
            report.counts(
                &format!("api_requests_per_{unit}"),
                &format!("API requests per {unit}"),
                &request_counts(&reqs),
                per,
            );
            report.fig(
                &format!("api_writes_per_{unit}"),
                &format!("API writes per {unit}"),
                json!(writes(&reqs) as f64 / per.max(1) as f64),
                format!("{:.3}", writes(&reqs) as f64 / per.max(1) as f64),
            );
            Some(total)
        }
        None => {
            let m = diff(
                &after.by("rest_client_requests_total", "method"),
                &before.by("rest_client_requests_total", "method"),
            );
            let total: f64 = m.values().sum::<f64>() / per.max(1) as f64;
            report.counts(
                &format!("api_requests_per_{unit}"),
                &format!("API requests per {unit} (by method)"),
                &m,
                per,
            );
            Some(total)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Events: what the CCM recorded (its metrics) and when the last one landed (a watch)

/// When an Event about this run was last created or updated, as a watch on the API server saw
/// it (events.k8s.io/v1, all namespaces: Node Events land in `default`).
type LastEvent = Arc<Mutex<Option<Instant>>>;

fn watch_events(env: &Env) -> (OwnThread, LastEvent) {
    let last: LastEvent = Arc::default();
    let seen = last.clone();
    let run = env.run.clone();
    let thread = OwnThread::start("bench-events", env, move |client| async move {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client);
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(e)) = stream.try_next().await {
            let ours = e.metadata.namespace.as_deref() == Some(run.as_str())
                || e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .is_some_and(|n| n.starts_with(run.as_str()));
            if ours {
                *seen.lock().unwrap() = Some(Instant::now());
            }
        }
    });
    (thread, last)
}

/// Events recorded by the CCM between `before` and `after`
/// (`event_recorder_events_total{result}`), and when the last one landed relative to
/// `converged` (negative: before it).
fn event_figures(
    report: &mut Report,
    before: &Metrics,
    after: &Metrics,
    converged: Instant,
    last: &LastEvent,
) {
    let events = diff(
        &after.by("event_recorder_events_total", "result"),
        &before.by("event_recorder_events_total", "result"),
    );
    for result in ["written", "dropped", "failed", "filtered"] {
        let n = events.get(result).copied().unwrap_or(0.0);
        report.fig(
            &format!("events_{result}"),
            &format!("Events {result}"),
            json!(n),
            format!("{}", n as u64),
        );
    }
    let last = *last.lock().unwrap();
    let landed = last.map(|l| {
        if l >= converged {
            secs(l - converged)
        } else {
            -secs(converged - l)
        }
    });
    report.fig(
        "events_last_after_convergence_s",
        "last Event landed, after convergence",
        json!(landed),
        landed.map_or_else(|| "none".to_string(), |s| format!("{s:.3} s")),
    );
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// node-burst and floor.
async fn node_burst(env: &Env, opts: &Opts, floor: bool) -> Report {
    let mut report = Report::new(opts);
    let n = opts.nodes;
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    let (_event_watch, last_event) = watch_events(env);
    let ccm = if floor {
        None
    } else {
        Some(Ccm::start(env, opts, false).await)
    };
    let floor_task = floor.then(|| spawn_floor(env));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = match &ccm {
        Some(c) => c.metrics().await,
        None => Metrics::default(),
    };
    env.clear_requests();

    let t = track.clone();
    let progress = Progress::start(opts.scenario.name(), move || {
        let g = lock(&t);
        format!(
            "created {}/{n}, initialised {}/{n}",
            g.node_created.len(),
            g.node_initialised.len()
        )
    });
    let t0 = Instant::now();
    create_nodes(env, &track, 0..n, |_| NodeKind::Tainted, opts.concurrency).await;
    let created_all = Instant::now();
    wait_until("every node initialised", opts.timeout, || {
        lock(&track).node_initialised.len() >= n
    })
    .await;
    drop(progress);
    // Trailing writes (address patches, events) still waiting for a rate-limit token.
    match &ccm {
        Some(c) => c.quiet().await,
        None => tokio::time::sleep(Duration::from_secs(2)).await,
    }

    let (lat, last_created, last_init) = {
        let g = lock(&track);
        let lat: Vec<Duration> = g
            .node_created
            .iter()
            .map(|(k, c)| g.node_initialised[k].saturating_duration_since(*c))
            .collect();
        let last_created = g
            .node_created
            .values()
            .max()
            .copied()
            .unwrap_or(created_all);
        let last_init = g.node_initialised.values().max().copied().unwrap_or(t0);
        (lat, last_created, last_init)
    };
    let target_size = n >= 1000;
    let mut sorted = lat.clone();
    sorted.sort();
    let p99 = percentile(&sorted, 0.99);
    report.latencies("init_latency", "creation -> initialised", lat);
    if opts.latency_ms == 0 && !floor {
        report.target(
            "init_latency_p99_target_s",
            "p99 creation -> initialised (target)",
            secs(p99),
            format!("{:.3} s", p99.as_secs_f64()),
            "p99 <= 2 s at 1,000 nodes, 0 ms",
            p99 <= Duration::from_secs(2),
            format!(
                "{:.1} s over ({:.1}x)",
                p99.as_secs_f64() - 2.0,
                p99.as_secs_f64() / 2.0
            ),
            target_size,
        );
    }
    report.secs(
        "total_s",
        "first creation -> all initialised",
        last_init - t0,
    );
    report.secs(
        "creation_s",
        "first creation -> last creation",
        last_created - t0,
    );
    let after_last = last_init.saturating_duration_since(last_created);
    if opts.latency_ms == 100 {
        report.target(
            "after_last_creation_s",
            "last creation -> all initialised",
            secs(after_last),
            format!("{:.3} s", after_last.as_secs_f64()),
            "<= 15 s at 1,000 nodes, 100 ms",
            after_last <= Duration::from_secs(15),
            format!("{:.1} s over", after_last.as_secs_f64() - 15.0),
            target_size,
        );
    } else {
        report.secs(
            "after_last_creation_s",
            "last creation -> all initialised",
            after_last,
        );
    }

    if floor {
        let reqs: Vec<RequestRecord> = env
            .server
            .as_ref()
            .map(|s| {
                s.requests()
                    .into_iter()
                    .filter(|r| r.verb == "patch")
                    .collect()
            })
            .unwrap_or_default();
        report.fig(
            "floor_patches_per_node",
            "harness PATCHes per node",
            json!(reqs.len() as f64 / n as f64),
            format!("{:.3}", reqs.len() as f64 / n as f64),
        );
        drop(floor_task);
        report.notes.push(
            "floor: no CCM; the harness patches each node once (taint, labels, providerID) as \
             it sees it, from a thread of its own, 100 patches in flight"
                .into(),
        );
        return report;
    }

    let ccm = ccm.unwrap();
    let after = ccm.metrics().await;
    let api_total = api_figures(&mut report, env, &before, &after, n, "node").unwrap_or(0.0);
    report.target(
        "api_requests_per_node_total",
        "API requests per node (all)",
        api_total,
        format!("{api_total:.3}"),
        "<= 3 (two writes, one event)",
        api_total <= 3.0,
        format!("{:.2} over", api_total - 3.0),
        target_size && opts.latency_ms == 0,
    );
    // Converged: every node initialised.
    event_figures(&mut report, &before, &after, last_init, &last_event);
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.counts("cloud_calls_per_node", "cloud calls per node", &calls, n);
    let total_calls: f64 = calls.values().sum::<f64>() / n as f64;
    report.target(
        "cloud_calls_per_node_total",
        "cloud calls per node (all)",
        total_calls,
        format!("{total_calls:.3}"),
        "exactly 1",
        (total_calls - 1.0).abs() < 1e-9,
        format!("{total_calls:.3} instead of 1"),
        target_size && opts.latency_ms == 0 && !opts.batch && opts.quota.is_none(),
    );
    if opts.quota.is_some() || opts.batch {
        cloud_quota_figures(&mut report, opts, &before, &after, after_last);
    }
    report.proc(ccm.proc());
    ccm.stop().await;
    report
}

/// node-burst under FakeCloud's quota and/or with its batch capability: the cloud calls made,
/// how many the quota rejected (`Retry`, the cloud's 429), and issue 19's targets at 5,000 Nodes
/// under 20 calls/s.
fn cloud_quota_figures(
    report: &mut Report,
    opts: &Opts,
    before: &Metrics,
    after: &Metrics,
    after_last: Duration,
) {
    let results = diff(
        &after.by("cloud_provider_requests_total", "result"),
        &before.by("cloud_provider_requests_total", "result"),
    );
    let total: f64 = results.values().sum();
    let rejected = results.get("retry").copied().unwrap_or(0.0);
    report.fig(
        "cloud_calls_total",
        "cloud calls (all operations)",
        json!(total),
        format!("{total:.0}"),
    );
    report.fig(
        "cloud_calls_rejected",
        "cloud calls answered Retry (quota)",
        json!(rejected),
        format!("{rejected:.0}"),
    );
    let share = if total > 0.0 { rejected / total } else { 0.0 };
    let quota_5000 = opts.quota == Some(20.0) && opts.nodes >= 5000;
    report.target(
        "cloud_calls_rejected_share",
        "share of cloud calls rejected",
        share,
        format!("{:.1} %", share * 100.0),
        "<= 5 % (5,000 nodes, 20 calls/s)",
        share <= 0.05,
        format!("{:.1} % over", (share - 0.05) * 100.0),
        quota_5000,
    );
    if quota_5000 && opts.batch {
        report.target(
            "after_last_creation_batch_target_s",
            "last creation -> all initialised (target)",
            secs(after_last),
            format!("{:.3} s", after_last.as_secs_f64()),
            "<= 15 s (5,000 nodes, 20 calls/s, batch)",
            after_last <= Duration::from_secs(15),
            format!("{:.1} s over", after_last.as_secs_f64() - 15.0),
            true,
        );
    }
}

/// The physical floor: one PATCH per node, done by the harness as it sees tainted nodes (on a
/// thread of its own, as the CCM has a process of its own).
fn spawn_floor(env: &Env) -> OwnThread {
    let cfg = watcher::Config::default().labels(&env.selector());
    let sem = Arc::new(tokio::sync::Semaphore::new(100));
    let cloud = FakeCloud::default();
    OwnThread::start("bench-floor", env, move |client| async move {
        let api: Api<Node> = Api::all(client);
        let mut seen = HashSet::new();
        let stream = watcher(api.clone(), cfg)
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(n)) = stream.try_next().await {
            let name = n.metadata.name.clone().unwrap_or_default();
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED));
            if !tainted || !seen.insert(name.clone()) {
                continue;
            }
            let permit = sem.clone().acquire_owned().await.unwrap();
            let api = api.clone();
            let cloud = cloud.clone();
            tokio::spawn(async move {
                let v2 = ccm_core::CloudProvider::instances_v2(&cloud).unwrap();
                let m = v2.instance_metadata(&n).await.unwrap();
                let taints: Vec<_> = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|t| t.key != TAINT_UNINITIALIZED)
                    .collect();
                let patch = json!({
                    "metadata": {
                        "resourceVersion": n.metadata.resource_version,
                        "labels": {
                            LABEL_TOPOLOGY_ZONE: m.zone, LABEL_TOPOLOGY_REGION: m.region,
                            LABEL_INSTANCE_TYPE: m.instance_type,
                        }
                    },
                    "spec": { "providerID": m.provider_id, "taints": taints },
                });
                api.patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .unwrap();
                drop(permit);
            });
        }
    })
}

/// lb-burst; returns the running CCM, the tracker and its observer for node-churn.
async fn lb_burst(env: &Env, opts: &Opts, report: &mut Report) -> (Ccm, Shared, Observer) {
    let (n, m) = (opts.nodes, opts.services);
    let track: Shared = Arc::default();
    let observer = observe(env, &track);
    env.create_namespace().await;
    let ccm = Ccm::start(env, opts, false).await;
    {
        let t = track.clone();
        let _p = Progress::start("setup", move || {
            format!("nodes initialised {}/{n}", lock(&t).node_initialised.len())
        });
        create_nodes(env, &track, 0..n, |_| NodeKind::Tainted, opts.concurrency).await;
        wait_until("every node initialised", opts.timeout, || {
            lock(&track).node_initialised.len() >= n
        })
        .await;
        ccm.quiet().await;
    }
    let before = ccm.metrics().await;
    env.clear_requests();
    let t = track.clone();
    let progress = Progress::start("lb-burst", move || {
        let g = lock(&t);
        format!(
            "services created {}/{m}, with ingress {}/{m}",
            g.svc_created.len(),
            g.svc_ingress.len()
        )
    });
    let t0 = Instant::now();
    create_services(env, &track, 0..m, false, opts.concurrency).await;
    wait_until("every Service has an ingress", opts.timeout, || {
        lock(&track).svc_ingress.len() >= m
    })
    .await;
    drop(progress);
    ccm.quiet().await;
    let (lat, last_created, last_ingress) = {
        let g = lock(&track);
        let lat: Vec<Duration> = g
            .svc_created
            .iter()
            .map(|(k, c)| g.svc_ingress[k].saturating_duration_since(*c))
            .collect();
        (
            lat,
            g.svc_created.values().max().copied().unwrap_or(t0),
            g.svc_ingress.values().max().copied().unwrap_or(t0),
        )
    };
    let total = last_ingress - t0;
    let target_size = m >= 200 && opts.latency_ms >= 50;
    report.target(
        "all_ingress_s",
        "first creation -> every Service has an ingress",
        secs(total),
        format!("{:.3} s", total.as_secs_f64()),
        "<= 5 s at 200 Services, 50 ms",
        total <= Duration::from_secs(5),
        format!("{:.1} s over", total.as_secs_f64() - 5.0),
        target_size,
    );
    report.secs(
        "creation_s",
        "first creation -> last creation",
        last_created - t0,
    );
    let mut sorted = lat;
    sorted.sort();
    for (p, name) in [(0.5, "p50"), (0.99, "p99")] {
        report.secs(
            &format!("ingress_latency_{name}_s"),
            &format!("creation -> ingress {name}"),
            percentile(&sorted, p),
        );
    }
    let after = ccm.metrics().await;
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.counts(
        "cloud_calls_per_service",
        "cloud calls per Service",
        &calls,
        m,
    );
    let ensure = calls.get("ensure_load_balancer").copied().unwrap_or(0.0) / m as f64;
    report.target(
        "ensure_per_service",
        "ensure_load_balancer per Service",
        ensure,
        format!("{ensure:.3}"),
        "exactly 1",
        (ensure - 1.0).abs() < 1e-9,
        format!("{ensure:.3} instead of 1"),
        target_size,
    );
    api_figures(report, env, &before, &after, m, "service");
    (ccm, track, observer)
}

async fn node_churn(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let (n, m, k) = (opts.nodes, opts.services, opts.add);
    let (ccm, track, _observer) = lb_burst(env, opts, &mut report).await;
    // node-churn's own targets are about the joins; lb-burst's are shown as information.
    for r in &mut report.rows {
        if !r.target.is_empty() {
            r.target = format!("(lb-burst) {}", r.target);
        }
    }
    let renamed: serde_json::Map<String, Value> = std::mem::take(&mut report.figures)
        .into_iter()
        .map(|(key, v)| (format!("lb_burst_{key}"), v))
        .collect();
    report.figures = renamed;
    report.targets.clear();
    report.rows.push(Row {
        figure: "--- joins".into(),
        value: String::new(),
        target: String::new(),
        verdict: String::new(),
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = ccm.metrics().await;
    env.clear_requests();
    let events_before = lb_events(env).await;
    let watch = CallWatch::start(&ccm, &["update_load_balancer", "ensure_load_balancer"]);
    let t = track.clone();
    let progress = Progress::start("node-churn", move || {
        let g = lock(&t);
        format!(
            "joined {}/{k}, initialised {}/{k}",
            g.node_created.len().saturating_sub(n),
            g.node_initialised.len().saturating_sub(n)
        )
    });
    let t0 = Instant::now();
    for j in 0..k {
        let target = t0 + Duration::from_secs_f64(opts.interval * j as f64);
        tokio::time::sleep_until(target.into()).await;
        create_nodes(env, &track, n + j..n + j + 1, |_| NodeKind::Tainted, 1).await;
    }
    let last_join = Instant::now();
    wait_until("every joined node initialised", opts.timeout, || {
        lock(&track).node_initialised.len() >= n + k
    })
    .await;
    // Quiet period: no load-balancer call for 10 s after the last one.
    let quiet = Duration::from_secs(10);
    wait_until("load-balancer calls to stop", opts.timeout, || {
        let last = watch.last_change().unwrap_or(t0);
        last.elapsed() >= quiet && t0.elapsed() >= quiet
    })
    .await;
    drop(progress);
    let last_lb = watch.last_change();
    drop(watch);
    let after = ccm.metrics().await;
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.secs("joins_s", "first join -> last join", last_join - t0);
    let init_last = lock(&track)
        .node_initialised
        .values()
        .max()
        .copied()
        .unwrap_or(last_join);
    report.secs(
        "last_join_initialised_s",
        "last join -> all joined initialised",
        init_last.saturating_duration_since(last_join),
    );
    report.counts(
        "cloud_calls_per_lb",
        "cloud calls per load balancer",
        &calls,
        m,
    );
    let updates = calls.get("update_load_balancer").copied().unwrap_or(0.0);
    let per_lb = updates / m as f64;
    let target_size = n == 50 && m >= 200 && k >= 20;
    report.target(
        "update_per_lb",
        "update_load_balancer per load balancer (mean)",
        per_lb,
        format!("{per_lb:.3}"),
        "<= 2",
        per_lb <= 2.0,
        format!("{per_lb:.2} (+{:.2})", per_lb - 2.0),
        target_size,
    );
    if let (Some(before_ev), Some(after_ev)) = (events_before, lb_events(env).await) {
        let max = env_max_per_service(&before_ev, &after_ev, m);
        report.target(
            "update_per_lb_max",
            "UpdatedLoadBalancer events per Service (max)",
            max as f64,
            format!("{max}"),
            "<= 2",
            max <= 2,
            format!("{max}"),
            target_size,
        );
    }
    let complete = last_lb
        .map(|t| t.saturating_duration_since(last_join))
        .unwrap_or(Duration::ZERO);
    report.target(
        "lb_complete_after_last_join_s",
        "last join -> last load-balancer call done",
        secs(complete),
        format!("{:.3} s", complete.as_secs_f64()),
        "<= 5 s",
        complete <= Duration::from_secs(5),
        format!("{:.1} s over", complete.as_secs_f64() - 5.0),
        target_size,
    );
    api_figures(&mut report, env, &before, &after, k, "joined node");
    report.notes.push(
        "load balancers are complete when the CCM's ensure/update_load_balancer counters stop \
         changing (polled every 20 ms from /metrics, quiet for 10 s) after every joined node \
         is initialised; the fake cloud lives in the CCM process, so host sets are not read \
         directly"
            .into(),
    );
    report.proc(ccm.proc());
    ccm.stop().await;
    report
}

/// UpdatedLoadBalancer event counts per Service of this run (None on error).
async fn lb_events(env: &Env) -> Option<BTreeMap<String, i32>> {
    let api: Api<Event> = Api::namespaced(env.client.clone(), &env.run);
    let list = api.list(&ListParams::default()).await.ok()?;
    let mut out = BTreeMap::new();
    for e in list {
        if e.reason.as_deref() == Some("UpdatedLoadBalancer") {
            let name = e.involved_object.name.clone().unwrap_or_default();
            *out.entry(name).or_insert(0) += e.count.unwrap_or(1).max(1);
        }
    }
    Some(out)
}

fn env_max_per_service(
    before: &BTreeMap<String, i32>,
    after: &BTreeMap<String, i32>,
    _m: usize,
) -> i32 {
    after
        .iter()
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
        .max()
        .unwrap_or(0)
}

async fn steady(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let (n, m) = (opts.nodes, opts.services);
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    let (_event_watch, last_event) = watch_events(env);
    env.create_namespace().await;
    let setup = Instant::now();
    {
        let t = track.clone();
        let _p = Progress::start("setup", move || {
            let g = lock(&t);
            format!(
                "nodes {}/{n}, services {}/{m}",
                g.node_created.len(),
                g.svc_created.len()
            )
        });
        create_nodes(
            env,
            &track,
            0..n,
            |_| NodeKind::Initialised,
            opts.concurrency,
        )
        .await;
        create_services(env, &track, 0..m, true, opts.concurrency).await;
    }
    let ccm = Ccm::start(env, opts, false).await;
    // Converged: the last change of the CCM's cloud calls (the start-up re-ensure of every
    // load balancer), as seen by the settle loop below.
    let mut converged = Instant::now();
    // Settled: no cloud call and no API write for 15 s.
    {
        let quiet = Duration::from_secs(15);
        let _p = Progress::start("settle", || "waiting for the CCM to go quiet".into());
        let mut last = (Metrics::default().cloud_calls(), BTreeMap::new());
        let mut since = Instant::now();
        let deadline = Instant::now() + opts.timeout;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let metrics = ccm.metrics().await;
            let now = (
                metrics.cloud_calls(),
                metrics.by("rest_client_requests_total", "method"),
            );
            if now != last {
                if now.0 != last.0 {
                    converged = Instant::now();
                }
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                break;
            }
            if Instant::now() > deadline {
                panic!("[bench] the CCM did not go quiet within {:?}", opts.timeout);
            }
        }
    }
    report.secs(
        "setup_s",
        "setup (objects created, CCM started and quiet)",
        setup.elapsed(),
    );
    let before = ccm.metrics().await;
    let p0 = ccm.proc();
    env.clear_requests();
    let w0 = Instant::now();
    let window = Duration::from_secs_f64(opts.settle);
    {
        let _p = Progress::start("steady", move || {
            format!(
                "idle window {:.0}/{:.0} s",
                w0.elapsed().as_secs_f64(),
                window.as_secs_f64()
            )
        });
        tokio::time::sleep(window).await;
    }
    let elapsed = w0.elapsed();
    let p1 = ccm.proc();
    let after = ccm.metrics().await;
    let target_size = n >= 5000 && m >= 1000;
    let rss = p1.rss_kb as f64 / 1024.0;
    report.target(
        "ccm_rss_mb",
        "CCM resident memory (VmRSS)",
        rss,
        format!("{rss:.1} MB"),
        "<= 64 MB at 5,000 nodes, 1,000 Services",
        rss <= 64.0,
        format!("{:.1} MB over", rss - 64.0),
        target_size,
    );
    let hwm = p1.hwm_kb as f64 / 1024.0;
    report.fig(
        "ccm_peak_rss_mb",
        "CCM peak resident memory (VmHWM)",
        json!(hwm),
        format!("{hwm:.1} MB"),
    );
    let cpu = p1.cpu_s - p0.cpu_s;
    let pct = cpu / elapsed.as_secs_f64() * 100.0;
    report.fig(
        "window_cpu_s",
        "CCM CPU seconds in the window",
        json!(cpu),
        format!("{cpu:.2} s"),
    );
    report.target(
        "idle_cpu_pct",
        "CCM CPU, % of one core",
        pct,
        format!("{pct:.2} %"),
        "< 2 %",
        pct < 2.0,
        format!("{pct:.2} %"),
        target_size,
    );
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.counts("window_cloud_calls", "cloud calls in the window", &calls, 1);
    let unexpected: f64 = calls
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "instance_metadata" | "instance_exists" | "instance_shutdown"
            )
        })
        .map(|(_, v)| v)
        .sum::<f64>()
        + 0.0; // an empty f64 sum is -0.0
    report.target(
        "window_unexpected_cloud_calls",
        "cloud calls other than refresh/lifecycle",
        unexpected,
        format!("{}", unexpected as u64),
        "0",
        unexpected == 0.0,
        format!("{} calls", unexpected as u64),
        target_size,
    );
    api_figures(&mut report, env, &before, &after, 1, "window");
    // Events since the CCM started (its start-up re-ensure of every LB records two per
    // Service), and those written in the idle window (none expected).
    event_figures(
        &mut report,
        &Metrics::default(),
        &after,
        converged,
        &last_event,
    );
    let idle_events = diff(
        &after.by("event_recorder_events_total", "result"),
        &before.by("event_recorder_events_total", "result"),
    )
    .get("written")
    .copied()
    .unwrap_or(0.0);
    report.fig(
        "window_events_written",
        "Events written in the idle window",
        json!(idle_events),
        format!("{}", idle_events as u64),
    );
    report.fig(
        "ccm_cpu_total_s",
        "CCM CPU time since start (incl. setup)",
        json!(p1.cpu_s),
        format!("{:.2} s", p1.cpu_s),
    );
    ccm.stop().await;
    report
}

async fn route_burst(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let n = opts.nodes;
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    let ccm = Ccm::start(env, opts, true).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = ccm.metrics().await;
    env.clear_requests();
    let t = track.clone();
    let progress = Progress::start("route-burst", move || {
        let g = lock(&t);
        format!(
            "created {}/{n}, NetworkUnavailable=False {}/{n}",
            g.node_created.len(),
            g.node_network.len()
        )
    });
    let t0 = Instant::now();
    create_nodes(env, &track, 0..n, NodeKind::NeedsRoute, opts.concurrency).await;
    wait_until("every node routed", opts.timeout, || {
        lock(&track).node_network.len() >= n
    })
    .await;
    drop(progress);
    ccm.quiet().await;
    let (lat, last_created, last_done) = {
        let g = lock(&track);
        let lat: Vec<Duration> = g
            .node_created
            .iter()
            .map(|(k, c)| g.node_network[k].saturating_duration_since(*c))
            .collect();
        (
            lat,
            g.node_created.values().max().copied().unwrap_or(t0),
            g.node_network.values().max().copied().unwrap_or(t0),
        )
    };
    report.latencies("route_latency", "creation -> NetworkUnavailable=False", lat);
    report.secs(
        "total_s",
        "first creation -> every node routed",
        last_done - t0,
    );
    report.secs(
        "creation_s",
        "first creation -> last creation",
        last_created - t0,
    );
    report.secs(
        "after_last_creation_s",
        "last creation -> every node routed",
        last_done.saturating_duration_since(last_created),
    );
    let after = ccm.metrics().await;
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.counts("cloud_calls_per_node", "cloud calls per node", &calls, n);
    api_figures(&mut report, env, &before, &after, n, "node");
    report.proc(ccm.proc());
    report.notes.push(
        "a node counts as routed when NetworkUnavailable=False, which the route controller \
         writes after create_route succeeded"
            .into(),
    );
    ccm.stop().await;
    report
}

// ---------------------------------------------------------------------------------------------

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "load_start": loadavg(),
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    let cli = Cli::parse_from(args);
    let opts = Opts::from_cli(&cli);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut machine = machine();
        eprintln!(
            "[bench] {} {} on {} cores, load {}",
            opts.scenario.name(),
            opts.json(),
            machine["cores"],
            machine["load_start"]
        );
        let env = Env::start().await;
        let report = match opts.scenario {
            Scenario::NodeBurst => node_burst(&env, &opts, false).await,
            Scenario::Floor => node_burst(&env, &opts, true).await,
            Scenario::LbBurst => {
                let mut r = Report::new(&opts);
                let (ccm, _, _observer) = lb_burst(&env, &opts, &mut r).await;
                r.proc(ccm.proc());
                ccm.stop().await;
                r
            }
            Scenario::NodeChurn => node_churn(&env, &opts).await,
            Scenario::Steady => steady(&env, &opts).await,
            Scenario::RouteBurst => route_burst(&env, &opts).await,
        };
        env.cleanup().await;
        machine["load_end"] = json!(loadavg());
        eprintln!(
            "[bench] done in {:.1} s",
            env.started.elapsed().as_secs_f64()
        );
        report.print(cli.json, &machine);
    });
}
