//! The runtime's log lines: startup errors exit non-zero naming the problem in the log, valid
//! startups stop cleanly (warning where Go warns), and a whole runtime with vendor controllers
//! and flags serves `/healthz` `/readyz` `/metrics` and logs the controllers it skips.
//!
//! A test binary of its own: the runtime logs through tracing and installs the process's
//! global subscriber on its first run; the first subscriber installed in a process wins, so
//! these tests install one writing to a buffer they search before any runtime runs, which
//! only works in a process where no other test has run a runtime first. The rest of the
//! runtime's tests are in `tests/it/runtime/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "it/support/https.rs"]
mod https;
#[path = "it/support/minimal_api.rs"]
mod minimal_api;
#[path = "it/support/openmetrics.rs"]
mod openmetrics;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ccm_controllers::{Builder, ControllerContext, ControllerEntry, ControllerError};
use ccm_core::{BoxError, CloudProvider, Node};
use ccm_testing::wait::eventually;
use https::http_get;
use minimal_api::{
    NO_ELECTION, NO_SERVING, TestCloud, fake_api_server, free_listener, run_and_stop, user_agents,
};
use openmetrics::{assert_openmetrics, samples};
use tokio::sync::{mpsc, oneshot};

const WAIT: Duration = Duration::from_secs(20);

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
// The test provider, registered under a name, configured by its cloud config.

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

/// A Builder whose route controller (`node-route-controller`, alias `route`) is a stub that
/// waits for shutdown: the startup checks of `--configure-cloud-routes` apply to it.
fn with_route_stub() -> Builder {
    Builder::new().controller_entry(
        ControllerEntry::new("node-route-controller", |ctx, _| async move {
            ctx.shutdown.cancelled().await;
            Ok(())
        })
        .alias("route"),
    )
}

const UNREACHABLE: &str = "--master=http://127.0.0.1:9";

#[tokio::test]
async fn startup_errors_exit_non_zero_naming_the_problem() {
    logs();
    let missing = std::env::temp_dir().join("ccm-runtime-no-such-file.conf");
    let missing_flag = format!("--cloud-config={}", missing.display());
    let fail = temp_file("fail.conf", b"fail");
    let fail_flag = format!("--cloud-config={}", fail.display());
    let untagged = temp_file("untagged.conf", b"untagged");
    let untagged_flag = format!("--cloud-config={}", untagged.display());
    let routes = temp_file("routes.conf", b"routes");
    let routes_flag = format!("--cloud-config={}", routes.display());

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
            with_route_stub(),
            "--configure-cloud-routes=true needs --cluster-cidr",
        ),
        (
            vec![
                "--cloud-provider=runtime-test",
                &routes_flag,
                "--cluster-cidr=10.0.0.0/8,10.1.0.0/16",
            ],
            with_route_stub(),
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
async fn valid_startups_stop_cleanly_with_exit_0() {
    logs();
    let untagged = temp_file("untagged2.conf", b"untagged");
    let untagged_flag = format!("--cloud-config={}", untagged.display());
    let routes = temp_file("routes2.conf", b"routes");
    let routes_flag = format!("--cloud-config={}", routes.display());
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
            with_route_stub(),
        ),
        (
            vec![&routes_flag, "--controllers=*,-route"],
            with_route_stub(),
        ),
        (
            vec![&routes_flag, "--cluster-cidr=10.244.0.0/16"],
            with_route_stub(),
        ),
        (
            vec![&routes_flag, "--cluster-cidr=10.244.0.0/16,fd00::/48"],
            with_route_stub(),
        ),
        // A provider without routes: the route controller is skipped with a warning.
        (vec![], with_route_stub()),
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
                                iv2.instance_exists(&ccm_core::NodeView::from_node(&Node::default())).await.unwrap();
                                let _ = iv2.instance_shutdown(&ccm_core::NodeView::from_node(&Node::default())).await;
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
        eventually(WAIT, || async { http_get(addr, "/readyz").await.0 == 200 }).await,
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
        eventually(WAIT, || async {
            let (_, body) = http_get(addr, "/metrics").await;
            samples(&body).get(exists) == Some(&3.0)
        })
        .await
    );
    poke_tx.send(()).unwrap();
    assert!(
        eventually(WAIT, || async {
            let (_, body) = http_get(addr, "/metrics").await;
            samples(&body).get(exists) == Some(&6.0)
                && samples(&body).get(shutdown_ni) == Some(&6.0)
        })
        .await
    );
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_openmetrics(&body);
    let running: BTreeMap<String, f64> = samples(&body)
        .into_iter()
        .filter(|(series, _)| series.starts_with("running_managed_controllers"))
        .collect();
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
    assert_eq!(samples(&body).get(count), Some(&6.0));
    let host = api.trim_start_matches("http://");
    let list = format!("rest_client_requests_total{{code=\"200\",method=\"GET\",host=\"{host}\"}}");
    assert!(
        samples(&body).get(&list).is_some_and(|n| *n >= 2.0),
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
