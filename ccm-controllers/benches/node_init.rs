//! How long the cloud-node controller takes to initialise 1,000 Nodes that register together,
//! at 0 ms and 100 ms per cloud call, on the in-process API server; and how many API requests
//! and cloud calls it spends per node.
//!
//! Run with `cargo bench -p ccm-controllers --bench node_init` (add `-- <nodes>` to change the
//! node count). It prints a table; it asserts nothing (speed is not a test).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccm_controllers::ControllerContext;
use ccm_controllers::controllers::cloud_node::{self, CloudNodeConfig};
use ccm_core::Node;
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use futures::StreamExt;
use kube::api::{Api, PostParams};

struct Figures {
    nodes: usize,
    latency: Duration,
    workers: usize,
    elapsed: Duration,
    requests: BTreeMap<String, usize>,
    calls: BTreeMap<String, usize>,
}

fn initialized(text: &str) -> usize {
    text.lines()
        .find(|l| {
            l.starts_with("node_controller_reconciles_total{")
                && l.contains("kind=\"initialize\"")
                && l.contains("result=\"success\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn measure(nodes: usize, latency: Duration, workers: usize) -> Figures {
    let server = ApiServer::start().await;
    let fake = FakeCloud::builder().latency(latency).build();
    let (ctx, mut tasks) =
        ControllerContext::standalone(server.client(), fake.provider(), "kubernetes");
    let config = {
        let mut config = CloudNodeConfig::default();
        config.workers = workers;
        config.status_update_frequency = Duration::from_secs(3600);
        config
    };
    let controller = tokio::spawn(cloud_node::run(ctx.clone(), config));
    // Let the controller sync its (empty) informer before the nodes arrive.
    assert!(ctx.nodes.wait_until_synced().await);
    server.clear_requests();

    let api: Api<Node> = Api::all(server.client());
    let started = Instant::now();
    futures::stream::iter(0..nodes)
        .for_each_concurrent(100, |i| {
            let api = api.clone();
            async move {
                let node = kubelet_node(&format!("node-{i:05}")).build();
                api.create(&PostParams::default(), &node).await.unwrap();
            }
        })
        .await;
    loop {
        let text = ctx.metrics.encode().unwrap();
        if initialized(&text) >= nodes {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    // Let the events and watch echoes of the last nodes settle before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut requests = BTreeMap::new();
    for r in server.requests() {
        // The bench's own Node creates are not the controller's work.
        if r.verb == "create" && r.resource == "nodes" {
            continue;
        }
        let key = format!(
            "{} {}{}",
            r.verb,
            r.resource,
            r.subresource.map(|s| format!("/{s}")).unwrap_or_default()
        );
        *requests.entry(key).or_default() += 1;
    }
    ctx.shutdown.cancel();
    controller.await.unwrap().unwrap();
    tasks.shutdown().await;
    Figures {
        nodes,
        latency,
        workers,
        elapsed,
        requests,
        calls: fake.call_counts(),
    }
}

fn per_node(map: &BTreeMap<String, usize>, nodes: usize) -> String {
    let total: usize = map.values().sum();
    let detail: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{k}: {:.2}", *v as f64 / nodes as f64))
        .collect();
    format!("{:.2} ({})", total as f64 / nodes as f64, detail.join(", "))
}

fn main() {
    let nodes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let workers = CloudNodeConfig::default().workers;
    let runs = [
        (Duration::ZERO, workers),
        (Duration::from_millis(100), workers),
        (Duration::from_millis(100), 1),
    ];
    println!(
        "cloud-node controller: {nodes} tainted nodes registering together, in-process API server"
    );
    for (latency, workers) in runs {
        if workers == 1 && nodes > 200 {
            // Go's default (1 worker) at 100 ms: measured on 100 nodes and extrapolated, as
            // 1,000 would take over 100 s.
            let f = runtime.block_on(measure(100, latency, 1));
            println!(
                "latency {:>4} ms, workers {:>3}: 100 nodes in {:>7.2} s => about {:.0} s for {nodes} (Go's default)",
                f.latency.as_millis(),
                f.workers,
                f.elapsed.as_secs_f64(),
                f.elapsed.as_secs_f64() * nodes as f64 / 100.0,
            );
            continue;
        }
        let f = runtime.block_on(measure(nodes, latency, workers));
        println!(
            "latency {:>4} ms, workers {:>3}: all {} initialised in {:>7.2} s",
            f.latency.as_millis(),
            f.workers,
            f.nodes,
            f.elapsed.as_secs_f64()
        );
        println!(
            "    API requests per node: {}",
            per_node(&f.requests, f.nodes)
        );
        println!("    cloud calls per node:  {}", per_node(&f.calls, f.nodes));
    }
}
