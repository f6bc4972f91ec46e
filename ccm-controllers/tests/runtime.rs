//! The runtime end to end without leader election: startup errors and their messages, vendor
//! controllers and flags through the Builder, `/healthz` `/readyz` `/metrics`, graceful
//! shutdown in the middle of slow cloud calls, and the cloud-call budget (QPS under a burst,
//! timeout, Retry, capability forwarding).
//!
//! The runtime needs an API server only for its shared Node and Service informers here; a
//! minimal one (empty lists, idle watches) is served by axum below. Leader election runs
//! against the in-process API server of `ccm-testing` in `runtime_leader.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{Query, Request};
use axum::routing::get;
use ccm_controllers::{
    BudgetConfig, BudgetedProvider, Builder, ControllerContext, ControllerEntry, ControllerError,
    MetricsRegistry,
};
use ccm_core::{
    BoxError, CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, LoadBalancer,
    LoadBalancerStatus, Node, Route, Routes, Service,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// Log capture: the runtime logs its startup errors through tracing; the first subscriber
// installed in the process wins, so install one writing to a buffer the tests can search.

#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = LogBuffer::default();
        let writer = buffer.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        buffer
    })
}

fn logged(needle: &str) -> bool {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).contains(needle)
}

// ---------------------------------------------------------------------------------------------
// A minimal API server: empty Node and Service lists, watches that stay open.

/// User agents the fake API server saw.
fn user_agents() -> &'static Mutex<Vec<String>> {
    static AGENTS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    AGENTS.get_or_init(|| Mutex::new(Vec::new()))
}

async fn fake_api_server() -> String {
    async fn list_or_watch(
        Query(q): Query<BTreeMap<String, String>>,
        req: Request,
    ) -> axum::response::Response {
        if let Some(agent) = req.headers().get("user-agent") {
            user_agents()
                .lock()
                .unwrap()
                .push(agent.to_str().unwrap().to_owned());
        }
        if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
            let stream = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
            return axum::response::Response::builder()
                .header("content-type", "application/json")
                .body(Body::from_stream(stream))
                .unwrap();
        }
        let kind = if req.uri().path().ends_with("nodes") {
            "NodeList"
        } else {
            "ServiceList"
        };
        let body = format!(
            r#"{{"kind":"{kind}","apiVersion":"v1","metadata":{{"resourceVersion":"1"}},"items":[]}}"#
        );
        axum::response::Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    }
    let app = axum::Router::new()
        .route("/api/v1/nodes", get(list_or_watch))
        .route("/api/v1/services", get(list_or_watch));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// GET `https://<addr><path>` (the server's certificate is self-signed); returns (status, body),
/// status 0 when the server cannot be reached.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .danger_accept_invalid_certs(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    match client.get(format!("https://{addr}{path}")).send().await {
        Ok(resp) => (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        ),
        Err(_) => (0, String::new()),
    }
}

fn free_listener() -> (std::net::TcpListener, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

// ---------------------------------------------------------------------------------------------
// A test provider.

#[derive(Default)]
struct TestCloud {
    /// How long each cloud call takes.
    latency: Duration,
    started: AtomicUsize,
    completed: AtomicUsize,
    untagged: bool,
    with_routes: bool,
}

#[async_trait]
impl CloudProvider for TestCloud {
    fn provider_name(&self) -> &str {
        "runtime-test"
    }
    fn has_cluster_id(&self) -> bool {
        !self.untagged
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        self.with_routes.then_some(self as &dyn Routes)
    }
}

impl TestCloud {
    async fn work(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.completed.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl InstancesV2 for TestCloud {
    async fn instance_exists(&self, _: &Node) -> CloudResult<bool> {
        self.work().await;
        Ok(true)
    }
    async fn instance_shutdown(&self, _: &Node) -> CloudResult<bool> {
        self.work().await;
        Err(CloudError::NotImplemented)
    }
    async fn instance_metadata(&self, _: &Node) -> CloudResult<InstanceMetadata> {
        self.work().await;
        Ok(InstanceMetadata::default())
    }
}

#[async_trait]
impl Routes for TestCloud {
    async fn list_routes(&self, _: &str) -> CloudResult<Vec<Route>> {
        Ok(vec![])
    }
    async fn create_route(&self, _: &str, _: &str, _: &Route) -> CloudResult<()> {
        Ok(())
    }
    async fn delete_route(&self, _: &str, _: &Route) -> CloudResult<()> {
        Ok(())
    }
}

fn build_registered(config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    match config {
        Some(b"fail") => Err("the cloud config says fail".into()),
        Some(b"untagged") => Ok(Arc::new(TestCloud {
            untagged: true,
            ..TestCloud::default()
        })),
        Some(b"routes") => Ok(Arc::new(TestCloud {
            with_routes: true,
            ..TestCloud::default()
        })),
        _ => Ok(Arc::new(TestCloud::default())),
    }
}

ccm_core::register_cloud_provider!("runtime-test", build_registered);

fn temp_file(name: &str, contents: &[u8]) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("ccm-runtime-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

/// Runs the runtime with these flags (after the program name) and a shutdown that fires at
/// once; returns the exit code.
async fn run_and_stop(args: &[&str], builder: Builder) -> i32 {
    logs();
    let mut all = vec!["cloud-controller-manager".to_owned()];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    tokio::time::timeout(
        Duration::from_secs(30),
        builder.args(all).shutdown_signal(async {}).run_async(),
    )
    .await
    .expect("the runtime stops")
}

const NO_SERVING: &str = "--secure-port=0";
const NO_ELECTION: &str = "--leader-elect=false";
const UNREACHABLE: &str = "--master=http://127.0.0.1:9";

#[tokio::test]
async fn startup_errors_exit_non_zero_naming_the_problem() {
    let missing = std::env::temp_dir().join("ccm-runtime-no-such-file.conf");
    let missing_flag = format!("--cloud-config={}", missing.display());
    let fail = temp_file("fail.conf", b"fail");
    let fail_flag = format!("--cloud-config={}", fail.display());
    let untagged = temp_file("untagged.conf", b"untagged");
    let untagged_flag = format!("--cloud-config={}", untagged.display());
    let routes = temp_file("routes.conf", b"routes");
    let routes_flag = format!("--cloud-config={}", routes.display());
    let route_entry = || {
        Builder::new().controller_entry(
            ControllerEntry::new("node-route-controller", |ctx, _| async move {
                ctx.shutdown.cancelled().await;
                Ok(())
            })
            .alias("route"),
        )
    };

    let cases: Vec<(Vec<&str>, Builder, &str)> = vec![
        (
            vec![],
            Builder::new(),
            "invalid value for --cloud-provider: must be set",
        ),
        (
            vec!["--cloud-provider=nope"],
            Builder::new(),
            "--cloud-provider=nope: unknown cloud provider \"nope\" (registered: ",
        ),
        (
            vec!["--cloud-provider=runtime-test", &missing_flag],
            Builder::new(),
            "invalid value for --cloud-config: cannot read",
        ),
        (
            vec!["--cloud-provider=runtime-test", &fail_flag],
            Builder::new(),
            "could not init cloud provider \"runtime-test\": the cloud config says fail",
        ),
        (
            vec!["--cloud-provider=runtime-test", &untagged_flag],
            Builder::new(),
            "This check can be bypassed by setting --allow-untagged-cloud",
        ),
        (
            vec!["--cloud-provider=runtime-test", "--concurrent-node-syncs=0"],
            Builder::new(),
            "invalid value for --concurrent-node-syncs: must be >= 1",
        ),
        (
            vec![
                "--cloud-provider=runtime-test",
                "--leader-elect-renew-deadline=20s",
            ],
            Builder::new(),
            "invalid value for --leader-elect-renew-deadline: must be less than --leader-elect-lease-duration",
        ),
        (
            vec!["--cloud-provider=runtime-test", "--controllers=*,-bogus"],
            Builder::new(),
            "invalid value for --controllers: \"bogus\" is not in the list of known controllers",
        ),
        (
            vec!["--cloud-provider=runtime-test", &routes_flag],
            route_entry(),
            "--configure-cloud-routes=true needs --cluster-cidr",
        ),
        (
            vec![
                "--cloud-provider=runtime-test",
                &routes_flag,
                "--cluster-cidr=10.0.0.0/8,10.1.0.0/16",
            ],
            route_entry(),
            "the route controller (--configure-cloud-routes=true) needs a valid --cluster-cidr; to run without cloud routes pass --configure-cloud-routes=false",
        ),
        // Node IPAM: checked before anything starts, with Go's messages.
        (
            vec![
                "--cloud-provider=runtime-test",
                "--allocate-node-cidrs=true",
                "--cluster-cidr=10.0.0.0/16",
                "--cidr-allocator-type=CloudAllocator",
            ],
            Builder::new(),
            "--cidr-allocator-type=\"CloudAllocator\" is not available: this binary has RangeAllocator; a cloud provider must register an allocator of that name",
        ),
        (
            vec!["--cloud-provider=runtime-test", "--allocate-node-cidrs"],
            Builder::new(),
            "node-ipam-controller: Must specify --cluster-cidr if --allocate-node-cidrs is set",
        ),
        (
            vec![
                "--cloud-provider=runtime-test",
                "--allocate-node-cidrs",
                "--cluster-cidr=10.0.0.0/16",
                "--node-cidr-mask-size=8",
            ],
            Builder::new(),
            "must be less than or equal to the node CIDR mask size",
        ),
        (
            vec![
                "--cloud-provider=runtime-test",
                "--allocate-node-cidrs",
                "--cluster-cidr=10.0.0.0/16,fd00::/48",
                "--node-cidr-mask-size=24",
            ],
            Builder::new(),
            "usage of --node-cidr-mask-size is not allowed with dual-stack clusters",
        ),
        (
            vec![
                "--cloud-provider=runtime-test",
                "--kubeconfig=/no/such/kubeconfig",
            ],
            Builder::new(),
            "--kubeconfig /no/such/kubeconfig:",
        ),
        (
            vec!["--cloud-provider=runtime-test", "--master=not a url"],
            Builder::new(),
            "invalid value for --master",
        ),
        (
            vec!["--cloud-provider=runtime-test", UNREACHABLE],
            Builder::new()
                .controller_entry(
                    ControllerEntry::new("acme-a", |_, _| async { Ok(()) }).alias("acme"),
                )
                .controller_entry(
                    ControllerEntry::new("acme-b", |_, _| async { Ok(()) }).alias("acme"),
                ),
            "controller name or alias \"acme\" is registered twice",
        ),
        (
            vec!["--cloud-provider=runtime-test", UNREACHABLE],
            Builder::new().default_value("no-such-flag", "1"),
            "Builder::default_value: there is no flag --no-such-flag",
        ),
    ];
    for (args, builder, message) in cases {
        let code = run_and_stop(&args, builder).await;
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(
            logged(message),
            "{args:?}: no log line contains {message:?}"
        );
    }
}

#[tokio::test]
async fn help_version_and_syntax_errors() {
    assert_eq!(run_and_stop(&["--help"], Builder::new()).await, 0);
    assert_eq!(run_and_stop(&["--version"], Builder::new()).await, 0);
    assert_eq!(
        run_and_stop(&["--leader-elect", "false"], Builder::new()).await,
        2
    );
    assert_eq!(run_and_stop(&["--bogus"], Builder::new()).await, 2);
}

#[tokio::test]
async fn valid_startups_stop_cleanly_with_exit_0() {
    let untagged = temp_file("untagged2.conf", b"untagged");
    let untagged_flag = format!("--cloud-config={}", untagged.display());
    let routes = temp_file("routes2.conf", b"routes");
    let routes_flag = format!("--cloud-config={}", routes.display());
    let route_entry = || {
        Builder::new().controller_entry(
            ControllerEntry::new("node-route-controller", |ctx, _| async move {
                ctx.shutdown.cancelled().await;
                Ok(())
            })
            .alias("route"),
        )
    };
    let base = [
        "--cloud-provider=runtime-test",
        UNREACHABLE,
        NO_SERVING,
        NO_ELECTION,
    ];
    let cases: Vec<(Vec<&str>, Builder)> = vec![
        (vec![], Builder::new()),
        // Empty values mean "not set", as in Go.
        (vec!["--cloud-config=", "--kubeconfig="], Builder::new()),
        (
            vec![&untagged_flag, "--allow-untagged-cloud"],
            Builder::new(),
        ),
        (
            vec![&routes_flag, "--configure-cloud-routes=false"],
            route_entry(),
        ),
        (vec![&routes_flag, "--controllers=*,-route"], route_entry()),
        (
            vec![&routes_flag, "--cluster-cidr=10.244.0.0/16"],
            route_entry(),
        ),
        (
            vec![&routes_flag, "--cluster-cidr=10.244.0.0/16,fd00::/48"],
            route_entry(),
        ),
        // A provider without routes: the route controller is skipped with a warning.
        (vec![], route_entry()),
        // Every controller name and alias of Kubernetes' own CCM template, as Go accepts them.
        (
            vec!["--controllers=cloud-node,cloud-node-lifecycle,service,route,nodeipam"],
            Builder::new(),
        ),
        (
            vec![
                "--controllers=cloud-node-controller,cloud-node-lifecycle-controller,service-lb-controller,node-route-controller,node-ipam-controller",
            ],
            Builder::new(),
        ),
        (vec!["--controllers=*,-nodeipam"], Builder::new()),
        // nodeipam is only "not enabled" without --allocate-node-cidrs (Go's start function).
        (
            vec![
                "--controllers=nodeipam",
                "--cidr-allocator-type=CloudAllocator",
            ],
            Builder::new(),
        ),
        // With it, and a vendor allocator registered under the requested name.
        (
            vec![
                "--allocate-node-cidrs",
                "--cidr-allocator-type=CloudAllocator",
            ],
            Builder::new().cidr_allocator("CloudAllocator", VendorAllocator),
        ),
        (
            vec!["--allocate-node-cidrs=true", "--cluster-cidr=10.244.0.0/16"],
            Builder::new(),
        ),
    ];
    for (extra, builder) in cases {
        let mut args = base.to_vec();
        args.extend(extra);
        assert_eq!(run_and_stop(&args, builder).await, 0, "{args:?}");
    }
    assert!(logged(
        "--configure-cloud-routes is set, but the cloud provider does not support routes"
    ));
    assert!(logged("detected a cluster without a ClusterID"));
}

/// A vendor's `--cidr-allocator-type` (e.g. a cloud allocator).
struct VendorAllocator;

impl ccm_controllers::controllers::node_ipam::CidrAllocator for VendorAllocator {
    fn run(
        &self,
        ctx: ControllerContext,
        _: ccm_controllers::controllers::node_ipam::NodeIpamConfig,
    ) -> ccm_controllers::controllers::node_ipam::AllocatorFuture {
        Box::pin(async move {
            ctx.shutdown.cancelled().await;
            Ok(())
        })
    }
}

#[derive(clap::Args, Debug)]
struct AcmeArgs {
    /// How many calls the poller makes per round.
    #[arg(long, default_value_t = 1)]
    acme_calls: usize,
}

/// Metric samples of `text` whose line starts with `prefix`, as `line -> value`.
fn samples(text: &str, prefix: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Checks the OpenMetrics text format: every line is a `# HELP`/`# TYPE`/`# UNIT` comment or
/// a sample `name{labels} value` of a declared family, and the exposition ends with `# EOF`.
fn assert_openmetrics(text: &str) {
    let mut families: Vec<(String, String)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "must end with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().unwrap();
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&kind),
                "bad comment {line:?}"
            );
            if kind == "TYPE" {
                let t = parts.next().unwrap();
                assert!(
                    [
                        "counter",
                        "gauge",
                        "histogram",
                        "info",
                        "unknown",
                        "stateset",
                        "summary",
                        "gaugehistogram"
                    ]
                    .contains(&t),
                    "bad type {line:?}"
                );
                families.push((name.to_owned(), t.to_owned()));
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample {line:?}"));
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad value in {line:?}"
        );
        let name = series.split('{').next().unwrap();
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            {
                assert!(
                    labels.starts_with('{') && labels.ends_with('}'),
                    "bad labels {line:?}"
                );
                for pair in labels[1..labels.len() - 1].split("\",") {
                    let (k, v) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad label {line:?}"));
                    assert!(!k.is_empty() && v.starts_with('"'), "bad label {line:?}");
                }
            }
        }
        let declared = families.iter().any(|(family, t)| {
            let suffixes: &[&str] = match t.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                _ => &[""],
            };
            suffixes.iter().any(|s| name == format!("{family}{s}"))
        });
        assert!(declared, "sample {line:?} has no # TYPE");
    }
}

#[tokio::test]
async fn serving_metrics_and_vendor_controllers() {
    logs();
    let api = fake_api_server().await;
    let cloud = Arc::new(TestCloud::default());
    let (listener, addr) = free_listener();
    let (poke_tx, poke_rx) = mpsc::unbounded_channel::<()>();
    let poke_rx = Arc::new(tokio::sync::Mutex::new(poke_rx));
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let master = format!("--master={api}");
    let builder = Builder::new()
        .with_args::<AcmeArgs>()
        .provider(cloud.clone())
        .version("1.2.3-acme")
        .listener(listener)
        .default_value("concurrent-service-syncs", "3")
        .controller_with_args("acme-poller", move |ctx: ControllerContext, args| {
            let poke_rx = poke_rx.clone();
            async move {
                let calls = args.vendor::<AcmeArgs>().unwrap().acme_calls;
                assert_eq!(args.options.service_workers(), 3, "changed default");
                let mut rx = poke_rx.lock().await;
                loop {
                    tokio::select! {
                        () = ctx.shutdown.cancelled() => return Ok(()),
                        Some(()) = rx.recv() => {
                            for _ in 0..calls {
                                let iv2 = ctx.cloud.instances_v2().unwrap();
                                iv2.instance_exists(&Node::default()).await.unwrap();
                                let _ = iv2.instance_shutdown(&Node::default()).await;
                            }
                        }
                    }
                }
            }
        })
        .controller_entry(
            ControllerEntry::new("acme-off", |_, _| async {
                panic!("disabled by default, must not start")
            })
            .disabled_by_default(),
        )
        .controller("acme-missing", |_| async {
            Err(ControllerError::MissingCapability {
                controller: "acme-missing",
                capability: "load_balancer",
            })
        })
        .args([
            "ccm",
            &master,
            "--leader-elect=false",
            "--authentication-skip-lookup",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--acme-calls=3",
            "--cloud-api-qps=1000",
        ])
        .shutdown_signal(async {
            let _ = stop_rx.await;
        });
    let runtime = tokio::spawn(builder.run_async());

    assert!(
        eventually(|| async { http_get(addr, "/readyz").await.0 == 200 }).await,
        "ready once the informers synced"
    );
    assert_eq!(http_get(addr, "/healthz").await, (200, "ok".to_owned()));
    assert_eq!(http_get(addr, "/livez").await, (200, "ok".to_owned()));
    assert_eq!(
        http_get(addr, "/nope").await.0,
        401,
        "other paths need credentials"
    );

    // The controller runs; poke it and watch the cloud counters move.
    poke_tx.send(()).unwrap();
    let exists = "cloud_provider_requests_total{operation=\"instance_exists\",result=\"success\"}";
    let shutdown_ni =
        "cloud_provider_requests_total{operation=\"instance_shutdown\",result=\"not_implemented\"}";
    assert!(
        eventually(|| async {
            let (_, body) = http_get(addr, "/metrics").await;
            samples(&body, exists).get(exists) == Some(&3.0)
        })
        .await
    );
    poke_tx.send(()).unwrap();
    assert!(
        eventually(|| async {
            let (_, body) = http_get(addr, "/metrics").await;
            samples(&body, exists).get(exists) == Some(&6.0)
                && samples(&body, shutdown_ni).get(shutdown_ni) == Some(&6.0)
        })
        .await
    );
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_openmetrics(&body);
    let running = samples(&body, "running_managed_controllers");
    assert_eq!(
        running.get(
            "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"acme-poller\"}"
        ),
        Some(&1.0),
        "{running:?}"
    );
    assert_eq!(
        running.get("running_managed_controllers{manager=\"cloud-controller-manager\",name=\"acme-missing\"}"),
        Some(&0.0),
        "a controller missing a capability is skipped: {running:?}"
    );
    assert!(
        !running.keys().any(|k| k.contains("acme-off")),
        "{running:?}"
    );
    let count = "cloud_provider_request_duration_seconds_count{operation=\"instance_exists\"}";
    assert_eq!(samples(&body, count).get(count), Some(&6.0));
    let host = api.trim_start_matches("http://");
    let list = format!("rest_client_requests_total{{code=\"200\",method=\"GET\",host=\"{host}\"}}");
    assert!(
        samples(&body, &list).get(&list).is_some_and(|n| *n >= 2.0),
        "the two informer lists are counted: {body}"
    );
    assert_eq!(cloud.completed.load(Ordering::SeqCst), 12);
    assert!(
        user_agents()
            .lock()
            .unwrap()
            .iter()
            .any(|a| *a == ccm_controllers::user_agent("1.2.3-acme", "shared-informers")),
        "the informers' lists and watches carry the version and their client name: {:?}",
        user_agents().lock().unwrap()
    );

    stop_tx.send(()).unwrap();
    assert_eq!(runtime.await.unwrap(), 0);
    assert!(logged(
        "skipping controller: acme-missing: the cloud provider does not support load_balancer"
    ));
}

#[tokio::test]
async fn metrics_need_authentication_by_default_probes_do_not() {
    logs();
    let api = fake_api_server().await;
    let (listener, addr) = free_listener();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let master = format!("--master={api}");
    let runtime = tokio::spawn(
        Builder::new()
            .provider(Arc::new(TestCloud::default()))
            .listener(listener)
            .args(["ccm", &master, NO_ELECTION, "--authentication-skip-lookup"])
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    assert!(eventually(|| async { http_get(addr, "/readyz").await.0 == 200 }).await);
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(http_get(addr, "/livez").await.0, 200);
    assert_eq!(http_get(addr, "/metrics").await.0, 401, "no token");
    stop_tx.send(()).unwrap();
    assert_eq!(runtime.await.unwrap(), 0);
}

#[tokio::test]
async fn shutdown_waits_for_slow_cloud_calls_then_exits_0() {
    logs();
    let api = fake_api_server().await;
    let cloud = Arc::new(TestCloud {
        latency: Duration::from_secs(2),
        ..TestCloud::default()
    });
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let started_tx = Arc::new(Mutex::new(Some(started_tx)));
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let reconciled = Arc::new(AtomicUsize::new(0));
    let reconciled_in = reconciled.clone();
    let probe = cloud.clone();
    let master = format!("--master={api}");
    let builder = Builder::new()
        .provider(cloud.clone())
        .controller("slow", move |ctx: ControllerContext| {
            let started_tx = started_tx.clone();
            let reconciled = reconciled_in.clone();
            let probe = probe.clone();
            async move {
                // Five detached cloud calls (the budget must wait for them) and one reconcile
                // this controller waits for itself.
                for _ in 0..5 {
                    let cloud = ctx.cloud.clone();
                    tokio::spawn(async move {
                        let node = Node::default();
                        cloud.instances_v2().unwrap().instance_metadata(&node).await
                    });
                }
                let cloud = ctx.cloud.clone();
                let reconcile = tokio::spawn(async move {
                    cloud
                        .instances_v2()
                        .unwrap()
                        .instance_exists(&Node::default())
                        .await
                });
                while probe.started.load(Ordering::SeqCst) < 6 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                if let Some(tx) = started_tx.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                ctx.shutdown.cancelled().await;
                // Stop taking work; finish the in-flight reconcile.
                if reconcile.await.is_ok_and(|r| r.is_ok()) {
                    reconciled.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }
        })
        .args(["ccm", &master, NO_ELECTION, NO_SERVING])
        .shutdown_signal(async {
            let _ = stop_rx.await;
        });
    let runtime = tokio::spawn(builder.run_async());
    tokio::time::timeout(Duration::from_secs(20), started_rx)
        .await
        .expect("the slow calls start")
        .unwrap();
    assert_eq!(cloud.started.load(Ordering::SeqCst), 6);
    assert_eq!(
        cloud.completed.load(Ordering::SeqCst),
        0,
        "the calls are still in flight"
    );
    // SIGTERM equivalent.
    stop_tx.send(()).unwrap();
    let code = tokio::time::timeout(Duration::from_secs(20), runtime)
        .await
        .expect("shutdown completes")
        .unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        cloud.completed.load(Ordering::SeqCst),
        6,
        "every in-flight cloud call finished before the runtime returned"
    );
    assert_eq!(reconciled.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------------------------
// The budget on its own (tokio paused time: no wall-clock timing).

struct Recorder {
    calls: Mutex<Vec<Instant>>,
    latency: Duration,
    answer: fn() -> CloudResult<()>,
}

#[async_trait]
impl CloudProvider for Recorder {
    fn provider_name(&self) -> &str {
        "recorder"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
}

#[async_trait]
impl LoadBalancer for Recorder {
    async fn get_load_balancer(
        &self,
        _: &str,
        _: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        Ok(None)
    }
    async fn ensure_load_balancer(
        &self,
        _: &str,
        _: &Service,
        _: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        Ok(LoadBalancerStatus::default())
    }
    async fn update_load_balancer(&self, _: &str, _: &Service, _: &[Arc<Node>]) -> CloudResult<()> {
        self.calls.lock().unwrap().push(Instant::now());
        tokio::time::sleep(self.latency).await;
        (self.answer)()
    }
    async fn ensure_load_balancer_deleted(&self, _: &str, _: &Service) -> CloudResult<()> {
        Ok(())
    }
}

fn recorder(latency: Duration, answer: fn() -> CloudResult<()>) -> Arc<Recorder> {
    Arc::new(Recorder {
        calls: Mutex::new(Vec::new()),
        latency,
        answer,
    })
}

#[tokio::test(start_paused = true)]
async fn cloud_qps_limit_holds_under_a_burst() {
    let inner = recorder(Duration::from_millis(10), || Ok(()));
    let metrics = MetricsRegistry::new();
    let budgeted = BudgetedProvider::new(
        inner.clone(),
        &BudgetConfig {
            rate_limit: Some((5.0, 3)),
            timeout: None,
        },
        &metrics,
    );
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..60 {
        let b = budgeted.clone();
        tasks.spawn(async move {
            b.load_balancer()
                .unwrap()
                .update_load_balancer("c", &Service::default(), &[])
                .await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    let calls: Vec<Duration> = inner
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.duration_since(start))
        .collect();
    assert_eq!(calls.len(), 60);
    // Count calls per 1 s window: the first window holds the burst (3) plus 5/s; every later
    // window at most 5 (+1 for a token landing on the boundary).
    let last = calls.iter().max().unwrap().as_secs();
    for w in 0..=last {
        let n = calls.iter().filter(|c| c.as_secs() == w).count();
        let limit = if w == 0 { 3 + 5 } else { 5 + 1 };
        assert!(n <= limit, "window {w}s: {n} calls > {limit}");
    }
    // And over any 2 s span after the burst, at most 2 x 5 + 1.
    for w in 1..last {
        let n = calls
            .iter()
            .filter(|c| c.as_secs() == w || c.as_secs() == w + 1)
            .count();
        assert!(n <= 11, "2 s from {w}s: {n}");
    }
    // 60 calls at 5/s with a burst of 3 need (60 - 3) / 5 = 11.4 s.
    assert!(calls.iter().max().unwrap() >= &Duration::from_millis(11_400));
    let text = metrics.encode().unwrap();
    assert!(text.contains(
        "cloud_provider_requests_total{operation=\"update_load_balancer\",result=\"success\"} 60"
    ));
}

#[tokio::test(start_paused = true)]
async fn budget_timeout_retry_and_capabilities() {
    let metrics = MetricsRegistry::new();
    let slow = recorder(Duration::from_secs(600), || Ok(()));
    let budgeted = BudgetedProvider::new(
        slow,
        &BudgetConfig {
            rate_limit: None,
            timeout: Some(Duration::from_secs(30)),
        },
        &metrics,
    );
    // Only the capabilities of the inner provider are offered.
    assert!(budgeted.load_balancer().is_some());
    assert!(budgeted.instances_v2().is_none());
    assert!(budgeted.instances().is_none());
    assert!(budgeted.routes().is_none());
    assert!(budgeted.zones().is_none());
    assert!(budgeted.clusters().is_none());
    assert_eq!(budgeted.provider_name(), "recorder");
    let err = budgeted
        .load_balancer()
        .unwrap()
        .update_load_balancer("c", &Service::default(), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::Other(_)));
    assert_eq!(
        err.to_string(),
        "cloud call update_load_balancer timed out after 30s (--cloud-api-timeout)"
    );
    assert_eq!(budgeted.in_flight(), 0);

    let metrics2 = MetricsRegistry::new();
    let retrying = recorder(Duration::ZERO, || {
        Err(CloudError::retry(Duration::ZERO, "busy"))
    });
    let budgeted2 = BudgetedProvider::new(retrying, &BudgetConfig::default(), &metrics2);
    let err = budgeted2
        .load_balancer()
        .unwrap()
        .update_load_balancer("c", &Service::default(), &[])
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), Some(ccm_controllers::MIN_RETRY_AFTER));
    let text = metrics.encode().unwrap();
    assert!(text.contains(
        "cloud_provider_requests_total{operation=\"update_load_balancer\",result=\"error\"} 1"
    ));
    let text2 = metrics2.encode().unwrap();
    assert!(text2.contains(
        "cloud_provider_requests_total{operation=\"update_load_balancer\",result=\"retry\"} 1"
    ));
}
