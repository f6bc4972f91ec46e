//! Shadow mode (`--shadow`, `--shadow-report`): a whole runtime started beside a cluster the
//! normal controllers reconciled with FakeCloud, over real HTTP. It must write nothing
//! (the request log shows only reads and writes the server handled as dry runs, with
//! `dryRun: All` where kube-apiserver reads it, FakeCloud no mutating call),
//! find exactly the differences the test makes in its cloud, report them on
//! `/shadow/divergences`, in the one-shot report and its exit codes (0, 3, 1), and never take
//! the Lease; its route controller sends no route call (`routes.rs`).
//!
//! Holds on a real cluster (`CCM_TEST_KUBECONFIG`): the incumbent is the controller harness
//! scoped to the test's Nodes and namespace, the shadow writes nothing anywhere, and every
//! divergence assertion is about the test's own objects (other Nodes of a shared cluster give
//! divergences of their own against FakeCloud's answers, which are ignored there). The request
//! log is checked on the in-process API server only.

mod lease;
mod node_marks;
mod one_shot;
mod rbac;
mod routes;

use ccm_core::NodeView;
use std::collections::BTreeSet;
use std::time::Duration;

use ccm_controllers::Builder;
use ccm_controllers::InformerScope;
use ccm_core::well_known::{
    FINALIZER_LOAD_BALANCER_CLEANUP, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use ccm_testing::TestCluster;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::{FakeCloud, NodeAnswer};
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::connection::connection_flag;
use crate::support::https::http_get;
use crate::support::node::RUN_LABEL;

const WAIT: Duration = Duration::from_secs(30);

/// The mutating provider operations a shadow must never send.
const MUTATING: &[&str] = &[
    "ensure_load_balancer",
    "update_load_balancer",
    "update_load_balancer_hosts",
    "ensure_load_balancer_deleted",
    "create_route",
    "delete_route",
];

/// A cluster the normal controllers reconciled: `nodes` initialised, one LoadBalancer
/// Service with its load balancer, all in FakeCloud `cloud`.
struct Reconciled {
    cluster: TestCluster,
    cloud: FakeCloud,
    ns: String,
    nodes: Vec<String>,
    service: String,
}

impl Reconciled {
    async fn start(n: usize) -> Reconciled {
        // The shadow runs as in production, with informers over the whole cluster: on a shared
        // real cluster it would also compare the objects of tests running at the same time
        // (their Services' load balancers, their Nodes as hosts), so it takes the cluster alone.
        let cluster = TestCluster::start_exclusive().await;
        let run = cluster.unique_name("shadow");
        let ns = cluster.namespace().await;
        let cloud = FakeCloud::builder()
            .zone("zone-a")
            .region("region-1")
            .build();
        let mut nodes = Vec::new();
        for i in 0..n {
            let name = cluster.unique_name(&format!("shadow-node-{i}"));
            cluster
                .create(&kubelet_node(&name).label(RUN_LABEL, &run).build())
                .await;
            nodes.push(name);
        }
        let service = "web".to_owned();
        cluster
            .create(
                &load_balancer_service(&ns, &service)
                    .port("http", 80)
                    .build(),
            )
            .await;
        // The incumbent: the normal controllers, scoped to the test's objects.
        let incumbent = ControllerHarness::builder(&cluster, cloud.provider())
            .scope(InformerScope {
                node_labels: Some(format!("{RUN_LABEL}={run}")),
                service_namespace: Some(ns.clone()),
                ..InformerScope::default()
            })
            .cloud_node()
            .service()
            .start()
            .await;
        let r = Reconciled {
            cluster,
            cloud,
            ns,
            nodes,
            service,
        };
        let key = r.service_key();
        let want: BTreeSet<String> = r.nodes.iter().cloned().collect();
        let reconciled = eventually(WAIT, || {
            let (r, key, want) = (&r, key.clone(), want.clone());
            async move {
                let lb_hosts: BTreeSet<String> = r
                    .cloud
                    .load_balancers()
                    .get(&key)
                    .map(|lb| lb.hosts.iter().cloned().collect())
                    .unwrap_or_default();
                let svc = r.services().get(&r.service).await.ok();
                let finalized = svc.as_ref().is_some_and(|s| {
                    s.metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP)
                        && s.status
                            .as_ref()
                            .and_then(|st| st.load_balancer.as_ref())
                            .and_then(|lb| lb.ingress.as_ref())
                            .is_some_and(|i| !i.is_empty())
                });
                let mut initialised = true;
                for n in &r.nodes {
                    let node = r.node_api().get(n).await.ok();
                    initialised &= node.is_some_and(|node| !tainted(&node));
                }
                initialised && finalized && lb_hosts == want
            }
        })
        .await;
        assert!(
            reconciled,
            "the incumbent reconciled the Nodes and the Service"
        );
        incumbent.settled().await;
        incumbent.stop().await.unwrap();
        r.cloud.reset_calls();
        r
    }

    /// Node `i` NotReady and its instance gone from the cloud: the lifecycle controller's
    /// deletion case. Returns its name.
    async fn instance_gone(&self, i: usize) -> String {
        let gone = self.nodes[i].clone();
        ccm_testing::harness::set_node_ready(&self.cluster.client(), &gone, false).await;
        self.cloud.set_node(
            &gone,
            NodeAnswer {
                exists: Some(false),
                ..NodeAnswer::default()
            },
        );
        gone
    }

    fn service_key(&self) -> String {
        format!("{}/{}", self.ns, self.service)
    }

    fn node_api(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.cluster.client(), &self.ns)
    }

    /// Whether `d` (one divergence of the report) is about this test's objects.
    fn owns(&self, d: &Value) -> bool {
        let object = d["object"].as_str().unwrap_or_default();
        match d["kind"].as_str() {
            Some("Node") => self.nodes.iter().any(|n| n == object),
            Some("Service") => object == self.service_key(),
            _ => false,
        }
    }

    /// The divergences about this test's objects in a report.
    fn own(&self, report: &Value) -> Vec<Value> {
        report["divergences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| self.owns(d))
            .cloned()
            .collect()
    }

    /// The log index to check requests from (in-process API server only).
    fn log_mark(&self) -> usize {
        log_mark(&self.cluster)
    }

    /// See [`assert_nothing_persisted`].
    fn assert_nothing_persisted(&self, mark: usize) -> usize {
        assert_nothing_persisted(&self.cluster, mark)
    }

    /// FakeCloud received no mutating call.
    fn assert_no_mutating_call(&self) {
        assert_no_mutating_call(&self.cloud);
    }
}

/// The log index to check requests from (in-process API server only).
fn log_mark(cluster: &TestCluster) -> usize {
    cluster
        .api_server()
        .map_or(0, |server| server.requests().len())
}

/// On the in-process API server: every request of the runtime since `mark` is a read
/// (`get`, `list`, `watch`) or a write the server handled as a dry run, with `dryRun: All`
/// where kube-apiserver reads it (the query of a create, update or patch, the `DeleteOptions`
/// body of a delete: [`RequestRecord::dry_run`]), and no Event was sent. Returns the number of
/// dry-run writes seen.
///
/// [`RequestRecord::dry_run`]: ccm_testing::apiserver::RequestRecord::dry_run
fn assert_nothing_persisted(cluster: &TestCluster, mark: usize) -> usize {
    let Some(server) = cluster.api_server() else {
        return 0;
    };
    let runtime: Vec<_> = server.requests()[mark..]
        .iter()
        .filter(|r| {
            r.user_agent
                .as_deref()
                .is_some_and(|ua| ua.starts_with("cloud-controller-manager/"))
        })
        .cloned()
        .collect();
    assert!(!runtime.is_empty(), "the shadow made no request at all");
    let mut dry_runs = 0;
    for r in &runtime {
        assert_ne!(r.resource, "events", "an Event was sent: {r:?}");
        if matches!(r.verb.as_str(), "get" | "list" | "watch") {
            continue;
        }
        assert!(
            r.dry_run,
            "a write the server did not handle as a dry run: {} {} ?{} body {:?}",
            r.method, r.path, r.query, r.body
        );
        dry_runs += 1;
    }
    dry_runs
}

/// FakeCloud received no mutating call.
fn assert_no_mutating_call(cloud: &FakeCloud) {
    for op in MUTATING {
        assert_eq!(
            cloud.call_count(op),
            0,
            "the shadow sent {op}: {:?}",
            cloud.calls_of(op)
        );
    }
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|t| t.key == TAINT_UNINITIALIZED)
}

/// A shadow runtime while it runs.
struct ShadowRun {
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<i32>,
}

/// The controllers the shadow runs unless a test names others.
const NODE_AND_SERVICE_CONTROLLERS: &str = "cloud-node,cloud-node-lifecycle,service";

/// The shadow's flags: the node and service controllers, test-sized periods.
fn shadow_args(cluster: &TestCluster, extra: &[String]) -> Vec<String> {
    shadow_args_with(cluster, NODE_AND_SERVICE_CONTROLLERS, extra)
}

/// The shadow's flags: `controllers` (as `--controllers` takes them), test-sized periods.
fn shadow_args_with(cluster: &TestCluster, controllers: &str, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "ccm",
        "--shadow",
        &format!("--controllers={controllers}"),
        "--node-monitor-period=200ms",
        "--node-deletion-grace-period=1s",
        "--shadow-pending-grace=1s",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // The report without credentials, unless the test sets the paths itself (the flag's
    // values add up).
    if !extra
        .iter()
        .any(|a| a.starts_with("--authorization-always-allow-paths"))
    {
        args.push(
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/shadow/divergences"
                .to_owned(),
        );
    }
    args.push(connection_flag(cluster));
    args.extend(extra.iter().cloned());
    args
}

impl ShadowRun {
    /// Starts a shadow of the node and service controllers.
    fn start(cluster: &TestCluster, cloud: &FakeCloud, extra: &[String]) -> ShadowRun {
        Self::start_with_args(cloud, shadow_args(cluster, extra))
    }

    /// Starts a shadow with these flags (see [`shadow_args_with`]).
    fn start_with_args(cloud: &FakeCloud, args: Vec<String>) -> ShadowRun {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let builder = Builder::new()
            .provider(cloud.provider())
            .listener(listener)
            .args(args)
            .shutdown_signal(async move {
                let _ = stop_rx.await;
            });
        ShadowRun {
            addr,
            stop: Some(stop),
            task: tokio::spawn(builder.run_async()),
        }
    }

    async fn report(&self) -> Value {
        let (status, body) = http_get(self.addr, "/shadow/divergences").await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Waits until `pick` finds something in the report; returns it.
    async fn wait_for<T>(&self, what: &str, pick: impl Fn(&Value) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let report = self.report().await;
            if let Some(found) = pick(&report) {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not reported within {WAIT:?}; report: {report:#}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for the would-delete divergence of Node `node` of `r`; returns it.
    async fn would_delete(&self, r: &Reconciled, node: &str) -> Value {
        self.wait_for("the would-delete divergence", |report| {
            r.own(report)
                .into_iter()
                .find(|d| d["object"] == node && d["field"] == "(node deleted)")
        })
        .await
    }

    async fn metrics(&self) -> String {
        http_get(self.addr, "/metrics").await.1
    }

    async fn stop(mut self) -> i32 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap()
    }
}

/// Runs a one-shot shadow; returns its exit code and report.
async fn one_shot(r: &Reconciled) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let code = tokio::time::timeout(
        Duration::from_secs(60),
        Builder::new()
            .provider(r.cloud.provider())
            .listener(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .args(shadow_args(
                &r.cluster,
                &[
                    format!("--shadow-report={}", path.display()),
                    "--shadow-duration=1s".to_owned(),
                ],
            ))
            .shutdown_signal(std::future::pending())
            .run_async(),
    )
    .await
    .expect("the one-shot shadow stops by itself");
    let report = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    (code, report)
}

#[tokio::test]
async fn a_shadow_with_the_same_answers_reports_nothing_and_writes_nothing() {
    let r = Reconciled::start(3).await;
    let mark = r.log_mark();
    let (code, report) = one_shot(&r).await;
    assert!(r.own(&report).is_empty(), "{report:#}");
    if !r.cluster.is_real() {
        assert_eq!(code, 0, "no divergence: exit 0; {report:#}");
        assert_eq!(report["divergences"], Value::Array(vec![]), "{report:#}");
    }
    assert!(
        report["objectsCompared"]["nodes"].as_u64().unwrap() >= 3,
        "{report:#}"
    );
    r.assert_nothing_persisted(mark);
    r.assert_no_mutating_call();
    // The shadow did compare: it asked the cloud about every Node and the load balancer.
    assert!(r.cloud.call_count("get_load_balancer") >= 1);
    r.cluster.cleanup().await;
}

#[tokio::test]
async fn a_changed_zone_is_one_divergence_of_that_node_and_the_node_keeps_its_label() {
    let r = Reconciled::start(3).await;
    let changed = r.nodes[1].clone();
    r.cloud.set_node(
        &changed,
        NodeAnswer {
            zone: Some("zone-b".to_owned()),
            ..NodeAnswer::default()
        },
    );
    let mark = r.log_mark();
    let (code, report) = one_shot(&r).await;
    assert_eq!(code, 3, "divergences: exit 3; {report:#}");
    let own = r.own(&report);
    // Go's initialisation sets the zone twice (the GA and the beta label): one divergence,
    // on that one Node only, naming the GA label, its beta alias and both values.
    assert_eq!(own.len(), 1, "exactly one divergence: {report:#}");
    let d = &own[0];
    assert_eq!(d["kind"], "Node");
    assert_eq!(d["object"], changed.as_str());
    assert_eq!(d["controller"], "node-controller");
    assert_eq!(d["field"], "metadata.labels[topology.kubernetes.io/zone]");
    assert_eq!(
        d["also"],
        serde_json::json!(["metadata.labels[failure-domain.beta.kubernetes.io/zone]"])
    );
    assert_eq!(d["incumbent"], "zone-a");
    assert_eq!(d["ours"], "zone-b");
    assert!(d["since"].as_str().is_some_and(|s| !s.is_empty()));
    // Nothing was written: the Node still has the incumbent's zone.
    let node = r.node_api().get(&changed).await.unwrap();
    assert_eq!(
        node.metadata
            .labels
            .unwrap()
            .get(LABEL_TOPOLOGY_ZONE)
            .map(String::as_str),
        Some("zone-a")
    );
    let dry_runs = r.assert_nothing_persisted(mark);
    if !r.cluster.is_real() {
        assert!(dry_runs >= 1, "the label write was sent as a dry run");
    }
    r.assert_no_mutating_call();
    r.cluster.cleanup().await;
}

#[tokio::test]
async fn load_balancer_hosts_that_differ_are_one_divergence_of_that_service() {
    let r = Reconciled::start(3).await;
    // The incumbent's load balancer lacks one Node (set directly in the cloud).
    let svc = r.services().get(&r.service).await.unwrap();
    let all: Vec<NodeView> = {
        let mut v = Vec::new();
        for n in &r.nodes {
            v.push(NodeView::from(r.node_api().get(n).await.unwrap()));
        }
        v
    };
    let provider = r.cloud.provider();
    let lb = provider.load_balancer().unwrap();
    lb.update_load_balancer("kubernetes", &svc, &all[..2])
        .await
        .unwrap();
    r.cloud.reset_calls();
    let mark = r.log_mark();
    let shadow = ShadowRun::start(&r.cluster, &r.cloud, &[]);
    let own = shadow
        .wait_for("the hosts divergence", |report| {
            let own = r.own(report);
            own.iter()
                .any(|d| d["field"] == "loadBalancer.hosts")
                .then_some(own)
        })
        .await;
    assert_eq!(own.len(), 1, "{own:#?}");
    let d = &own[0];
    assert_eq!(d["kind"], "Service");
    assert_eq!(d["object"], r.service_key().as_str());
    assert_eq!(d["controller"], "service-controller");
    let names = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&d["incumbent"]),
        r.nodes[..2].iter().cloned().collect()
    );
    let ours = names(&d["ours"]);
    let mine: BTreeSet<String> = r.nodes.iter().cloned().collect();
    if r.cluster.is_real() {
        // The shadow's informers see every Node of a shared cluster.
        assert!(ours.is_superset(&mine), "{ours:?}");
    } else {
        assert_eq!(ours, mine);
    }
    let metrics = shadow.metrics().await;
    assert!(
        metrics
            .contains("shadow_divergences{controller=\"service-controller\",kind=\"Service\"} 1"),
        "{metrics}"
    );
    assert_eq!(shadow.stop().await, 0);
    // The cloud still has the incumbent's two hosts; nothing was sent.
    assert_eq!(r.cloud.load_balancers()[&r.service_key()].hosts.len(), 2);
    r.assert_no_mutating_call();
    r.assert_nothing_persisted(mark);
    r.cluster.cleanup().await;
}

/// A backend selector (issue 45) is dry-run as the rest: the shadow compares the hosts the
/// selector picks with the load balancer's, and sends nothing.
#[tokio::test]
async fn the_hosts_a_backend_selector_picks_are_what_the_shadow_compares() {
    let r = Reconciled::start(2).await;
    let pick = r.cluster.unique_name("pick");
    let label = "shadow-backends.ccm-rs.io/pick";
    let patch = |body: Value| kube::api::Patch::Merge(body);
    let params = kube::api::PatchParams::default();
    r.node_api()
        .patch(
            &r.nodes[0],
            &params,
            &patch(serde_json::json!({"metadata": {"labels": {label: pick}}})),
        )
        .await
        .unwrap();
    r.services()
        .patch(
            &r.service,
            &params,
            &patch(serde_json::json!({"metadata": {"annotations": {
                "service.ccm-rs.io/backend-node-selector": format!("{label}={pick}"),
            }}})),
        )
        .await
        .unwrap();
    let mark = r.log_mark();
    let shadow = ShadowRun::start(&r.cluster, &r.cloud, &[]);
    let own = shadow
        .wait_for("the hosts divergence", |report| {
            let own = r.own(report);
            own.iter()
                .any(|d| d["field"] == "loadBalancer.hosts")
                .then_some(own)
        })
        .await;
    let d = own
        .iter()
        .find(|d| d["field"] == "loadBalancer.hosts")
        .unwrap();
    assert_eq!(d["ours"], serde_json::json!([r.nodes[0]]), "{d:#?}");
    assert_eq!(shadow.stop().await, 0);
    // The cloud still has both hosts; nothing was sent.
    assert_eq!(r.cloud.load_balancers()[&r.service_key()].hosts.len(), 2);
    r.assert_no_mutating_call();
    r.assert_nothing_persisted(mark);
    r.cluster.cleanup().await;
}

#[tokio::test]
async fn a_gone_instance_is_a_would_delete_divergence_and_the_node_stays() {
    let r = Reconciled::start(2).await;
    let gone = r.instance_gone(0).await;
    let mark = r.log_mark();
    let shadow = ShadowRun::start(&r.cluster, &r.cloud, &[]);
    let d = shadow.would_delete(&r, &gone).await;
    assert_eq!(d["kind"], "Node");
    assert_eq!(d["incumbent"], "exists");
    assert_eq!(d["ours"], "deleted");
    // Two answers a grace period apart came first: the lifecycle controller asked twice.
    assert!(
        r.cloud.call_count("instance_exists") >= 2 || r.cloud.call_count("instance_metadata") >= 2
    );
    assert_eq!(shadow.stop().await, 0);
    assert!(
        r.node_api().get_opt(&gone).await.unwrap().is_some(),
        "the Node still exists"
    );
    let dry_runs = r.assert_nothing_persisted(mark);
    if !r.cluster.is_real() {
        assert!(dry_runs >= 1, "the delete was sent as a dry run");
    }
    r.cluster.cleanup().await;
}

#[tokio::test]
async fn the_divergences_endpoint_is_authorised_as_metrics_is() {
    let cluster = TestCluster::start().await;
    let cloud = FakeCloud::default();
    // RBAC on the in-process API server (a real cluster has it): an anonymous caller is not
    // allowed the non-resource URLs.
    if let Some(server) = cluster.api_server() {
        server.enable_rbac();
    }
    // Only the probes without credentials (the default): /metrics and /shadow/divergences
    // need an authorised caller; an anonymous request gets the same refusal on both.
    let shadow = ShadowRun::start(
        &cluster,
        &cloud,
        &["--authorization-always-allow-paths=/healthz,/readyz,/livez".to_owned()],
    );
    assert!(
        eventually(WAIT, || async {
            http_get(shadow.addr, "/readyz").await.0 == 200
        })
        .await,
        "the shadow is ready"
    );
    let metrics = http_get(shadow.addr, "/metrics").await.0;
    let divergences = http_get(shadow.addr, "/shadow/divergences").await.0;
    assert!(matches!(metrics, 401 | 403), "/metrics: {metrics}");
    assert_eq!(divergences, metrics);
    assert_eq!(shadow.stop().await, 0);
}

#[tokio::test]
async fn a_report_that_cannot_be_written_exits_1() {
    let cluster = TestCluster::start().await;
    let cloud = FakeCloud::default();
    let dir = tempfile::tempdir().unwrap();
    let run = |path: std::path::PathBuf| {
        let builder = Builder::new()
            .provider(cloud.provider())
            .listener(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .args(shadow_args(
                &cluster,
                &[
                    format!("--shadow-report={}", path.display()),
                    "--shadow-duration=1s".to_owned(),
                ],
            ))
            .shutdown_signal(std::future::pending());
        async move {
            tokio::time::timeout(Duration::from_secs(60), builder.run_async())
                .await
                .expect("the one-shot shadow stops by itself")
        }
    };
    // The same run with a writable file: the report is written (exit 0, or 3 for the other
    // Nodes of a real cluster), so the 1 below is the report's error, not a start-up failure.
    let writable = dir.path().join("report.json");
    let code = run(writable.clone()).await;
    assert!(matches!(code, 0 | 3), "exit {code}");
    assert!(writable.exists());
    // A file in a directory that does not exist: the report cannot be written.
    let path = dir.path().join("missing").join("report.json");
    assert_eq!(run(path.clone()).await, 1, "an unwritable report is exit 1");
    assert!(!path.exists());
}
