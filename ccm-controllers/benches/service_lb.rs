//! Benchmark of the service load-balancer controller (not a test: it prints figures).
//!
//! For 200 LoadBalancer Services on the in-process API server and FakeCloud with a cloud
//! latency of 0 ms and 50 ms per call, it prints:
//! - the time from controller start until every Service has its ingress address, for several
//!   worker counts (the measurement behind the default of `--concurrent-service-syncs`);
//! - with the default configuration, the number of `update_load_balancer` calls and the time to
//!   settle (every load balancer has every host) after 10 Nodes join one every 2 s;
//! - the same for a burst of 20 Nodes joining at once.
//!
//! Run with `cargo bench -p ccm-controllers --bench service_lb`. Set `SERVICE_LB_BENCH_QUICK=1`
//! to run only the default worker count.
//!
//! Figures measured on the 2-core development machine (shared with other builds):
//!
//! ```text
//! cloud latency 0 ms per call
//!   time until all 200 have an ingress, workers= 1:     0.23 s
//!   time until all 200 have an ingress, workers= 5:     0.44 s
//!   time until all 200 have an ingress, workers=10:     0.50 s
//!   time until all 200 have an ingress, workers=20:     0.61 s
//!   time until all 200 have an ingress, workers=40:     0.56 s
//!   10 nodes joining one every 2 s (workers=10, window 1 s): 2000 update_load_balancer calls (10.0 per LB), settled 1.27 s after the last join
//!   20 nodes joining at once: 200 update_load_balancer calls (1.0 per LB), settled 1.21 s after the last join
//! cloud latency 50 ms per call
//!   time until all 200 have an ingress, workers= 1:    12.14 s
//!   time until all 200 have an ingress, workers= 5:     2.56 s
//!   time until all 200 have an ingress, workers=10:     1.30 s
//!   time until all 200 have an ingress, workers=20:     0.94 s
//!   time until all 200 have an ingress, workers=40:     0.53 s
//!   10 nodes joining one every 2 s (workers=10, window 1 s): 1840 update_load_balancer calls (9.2 per LB), settled 2.17 s after the last join
//!   20 nodes joining at once: 200 update_load_balancer calls (1.0 per LB), settled 2.11 s after the last join
//! ```
//!
//! Nodes 2 s apart are separate changes (the window is 1 s), so each costs every load balancer
//! one update, as in Go; Go would run each of those passes on one worker (200 × 50 ms = 10 s
//! per node, falling behind a node every 2 s) and would spend 20 updates per load balancer on
//! the burst, which costs 1 here.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ccm_controllers::ControllerContext;
use ccm_controllers::controllers::service::{self, ServiceConfig};
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::FakeCloud;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, ListParams, PostParams};

const SERVICES: usize = 200;
const NAMESPACE: &str = "bench";

struct Setup {
    server: ApiServer,
    fake: FakeCloud,
}

async fn setup(latency: Duration) -> Setup {
    let server = ApiServer::start().await;
    let client = server.client();
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(NAMESPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    for i in 0..3 {
        create_node(&client, &format!("base-{i}")).await;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..SERVICES {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(NAMESPACE, &format!("lb-{i:03}")).build(),
            )
            .await
            .unwrap();
    }
    let fake = FakeCloud::builder().latency(latency).build();
    Setup { server, fake }
}

async fn create_node(client: &kube::Client, name: &str) {
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &kubelet_node(name)
                .provider_id(&format!("fake://{name}"))
                .build(),
        )
        .await
        .unwrap();
}

async fn all_have_ingress(client: &kube::Client) -> bool {
    let list = Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap();
    list.items.len() == SERVICES
        && list.items.iter().all(|s| {
            s.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
        })
}

fn all_have_hosts(fake: &FakeCloud, hosts: &BTreeSet<String>) -> bool {
    let lbs = fake.load_balancers();
    lbs.len() == SERVICES
        && lbs
            .values()
            .all(|lb| lb.hosts.iter().cloned().collect::<BTreeSet<_>>() == *hosts)
}

async fn poll_until(mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !cond().await {
        assert!(Instant::now() < deadline, "benchmark did not converge");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Running {
    ctx: ControllerContext,
    handle: tokio::task::JoinHandle<Result<(), ccm_controllers::ControllerError>>,
    informers: tokio::task::JoinSet<()>,
}

fn start(setup: &Setup, config: ServiceConfig) -> Running {
    let (ctx, informers) =
        ControllerContext::standalone(setup.server.client(), setup.fake.provider(), "kubernetes");
    let handle = tokio::spawn(service::run(ctx.clone(), config));
    Running {
        ctx,
        handle,
        informers,
    }
}

async fn stop(mut r: Running) {
    r.ctx.shutdown.cancel();
    r.handle.await.unwrap().unwrap();
    while r.informers.join_next().await.is_some() {}
}

/// Time from start until all Services have an ingress.
async fn time_to_ingress(latency: Duration, workers: usize) -> Duration {
    let setup = setup(latency).await;
    let client = setup.server.client();
    let started = Instant::now();
    let running = start(&setup, {
        let mut config = ServiceConfig::default();
        config.workers = workers;
        config
    });
    poll_until(async || all_have_ingress(&client).await).await;
    let took = started.elapsed();
    stop(running).await;
    took
}

/// Nodes join one every `interval` (zero: all at once); returns (update calls, time from the
/// last join until every load balancer has every host).
async fn node_churn(latency: Duration, joins: usize, interval: Duration) -> (usize, Duration) {
    let setup = setup(latency).await;
    let client = setup.server.client();
    let running = start(&setup, ServiceConfig::default());
    poll_until(async || all_have_ingress(&client).await).await;
    let mut hosts: BTreeSet<String> = (0..3).map(|i| format!("base-{i}")).collect();
    poll_until(async || all_have_hosts(&setup.fake, &hosts)).await;
    setup.fake.reset_calls();
    let names: Vec<String> = (0..joins).map(|i| format!("join-{i:02}")).collect();
    if interval.is_zero() {
        futures::future::join_all(names.iter().map(|n| create_node(&client, n))).await;
    } else {
        for (i, n) in names.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(interval).await;
            }
            create_node(&client, n).await;
        }
    }
    let last_join = Instant::now();
    hosts.extend(names);
    poll_until(async || all_have_hosts(&setup.fake, &hosts)).await;
    let settle = last_join.elapsed();
    let updates = setup.fake.call_count("update_load_balancer");
    stop(running).await;
    (updates, settle)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let quick = std::env::var_os("SERVICE_LB_BENCH_QUICK").is_some();
    let default_workers = ServiceConfig::default().workers;
    runtime.block_on(async {
        println!("service_lb: {SERVICES} LoadBalancer Services, in-process API server, FakeCloud");
        for latency_ms in [0u64, 50] {
            let latency = Duration::from_millis(latency_ms);
            println!("\ncloud latency {latency_ms} ms per call");
            let worker_counts: Vec<usize> = if quick {
                vec![default_workers]
            } else {
                vec![1, 5, default_workers, 20, 40]
            };
            for workers in worker_counts {
                let took = time_to_ingress(latency, workers).await;
                println!(
                    "  time until all {SERVICES} have an ingress, workers={workers:>2}: {:>8.2} s",
                    took.as_secs_f64()
                );
            }
            let (updates, settle) = node_churn(latency, 10, Duration::from_secs(2)).await;
            println!(
                "  10 nodes joining one every 2 s (workers={default_workers}, window 1 s): {updates} update_load_balancer calls ({:.1} per LB), settled {:.2} s after the last join",
                updates as f64 / SERVICES as f64,
                settle.as_secs_f64()
            );
            let (updates, settle) = node_churn(latency, 20, Duration::ZERO).await;
            println!(
                "  20 nodes joining at once: {updates} update_load_balancer calls ({:.1} per LB), settled {:.2} s after the last join",
                updates as f64 / SERVICES as f64,
                settle.as_secs_f64()
            );
        }
    });
}
