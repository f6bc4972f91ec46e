//! route-burst: N Nodes with pod CIDRs; time until each has its route and
//! `NetworkUnavailable=False`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ccm::{Ccm, diff};
use crate::cli::Opts;
use crate::environment::{Env, Progress, Shared, create_nodes, lock, observe, wait_until};
use crate::objects::NodeKind;
use crate::report::{Report, api_figures};

pub(crate) async fn route_burst(env: &Env, opts: &Opts) -> Report {
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
    create_nodes(env, &track, 0..n, NodeKind::NeedsRoute, opts.node_pace()).await;
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
