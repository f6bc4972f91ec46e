//! node-ipam: N tainted Nodes registered as kubelets do, with the node-IPAM controller on
//! (`--allocate-node-cidrs=true --cidr-allocator-type=RangeAllocator`); time until each has its
//! pod CIDR, and whether every Node got a CIDR of its own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::ListParams;
use serde_json::{Value, json};

use crate::ccm::{Ccm, diff};
use crate::cli::Opts;
use crate::environment::{Env, Progress, Shared, create_nodes, lock, observe, wait_until};
use crate::objects::NodeKind;
use crate::report::{Report, api_figures};

/// The flags that switch the node-IPAM controller on, as the manifests of issue 20 pass them.
fn ipam_args(opts: &Opts) -> Vec<String> {
    vec![
        "--allocate-node-cidrs=true".into(),
        "--cidr-allocator-type=RangeAllocator".into(),
        format!("--cluster-cidr={}", opts.cluster_cidr),
        format!("--node-cidr-mask-size={}", opts.node_cidr_mask_size),
    ]
}

/// Whether a recorded PATCH is the node-IPAM controller's (a JSON patch that adds
/// `/spec/podCIDR`).
fn is_pod_cidr_patch(body: Option<&Value>) -> bool {
    body.and_then(Value::as_array).is_some_and(|ops| {
        ops.iter()
            .any(|op| op["path"].as_str() == Some("/spec/podCIDR") && op["op"] == "add")
    })
}

pub(crate) async fn node_ipam(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let n = opts.nodes;
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    let mut ccm_opts = opts.clone();
    ccm_opts.ccm_args.splice(0..0, ipam_args(opts));
    let ccm = Ccm::start(env, &ccm_opts, false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = ccm.metrics().await;
    env.clear_requests();

    let t = track.clone();
    let progress = Progress::start(opts.scenario.name(), move || {
        let g = lock(&t);
        format!(
            "created {}/{n}, with pod CIDR {}/{n}, initialised {}/{n}",
            g.node_created.len(),
            g.node_pod_cidr.len(),
            g.node_initialised.len()
        )
    });
    let t0 = Instant::now();
    create_nodes(env, &track, 0..n, |_| NodeKind::Tainted, opts.node_pace()).await;
    let created_all = Instant::now();
    wait_until("every node has a pod CIDR", opts.timeout, || {
        lock(&track).node_pod_cidr.len() >= n
    })
    .await;
    drop(progress);
    // The cloud-node controller's trailing writes (addresses, Events).
    ccm.quiet().await;

    let (lat, last_created, last_cidr) = {
        let g = lock(&track);
        let lat: Vec<Duration> = g
            .node_created
            .iter()
            .map(|(k, c)| g.node_pod_cidr[k].saturating_duration_since(*c))
            .collect();
        let last_created = g
            .node_created
            .values()
            .max()
            .copied()
            .unwrap_or(created_all);
        let last_cidr = g.node_pod_cidr.values().max().copied().unwrap_or(t0);
        (lat, last_created, last_cidr)
    };
    report.latencies("cidr_latency", "creation -> pod CIDR", lat);
    report.secs(
        "total_s",
        "first creation -> every node has a pod CIDR",
        last_cidr - t0,
    );
    report.secs(
        "creation_s",
        "first creation -> last creation",
        last_created - t0,
    );
    report.secs(
        "after_last_creation_s",
        "last creation -> every node has a pod CIDR",
        last_cidr.saturating_duration_since(last_created),
    );

    // Every Node a CIDR of its own, none given twice.
    let nodes = env
        .nodes()
        .list(&ListParams::default().labels(&env.selector()))
        .await
        .unwrap();
    let cidrs: Vec<String> = nodes
        .iter()
        .filter_map(|node| node.spec.as_ref()?.pod_cidr.clone())
        .collect();
    let distinct = cidrs.iter().collect::<HashSet<_>>().len();
    report.target(
        "distinct_pod_cidrs",
        "Nodes with a pod CIDR of their own",
        distinct as f64,
        format!("{distinct} of {}", nodes.items.len()),
        "every Node, none twice",
        distinct == n && cidrs.len() == n,
        format!("{} with a CIDR, {distinct} distinct", cidrs.len()),
        true,
    );

    let after = ccm.metrics().await;
    api_figures(&mut report, env, &before, &after, n, "node");
    if let Some(reqs) = env.ccm_requests() {
        let patches = reqs
            .iter()
            .filter(|r| r.verb == "patch" && is_pod_cidr_patch(r.body.as_ref()))
            .count();
        report.fig(
            "ipam_patches_per_node",
            "node-IPAM PATCHes per node",
            json!(patches as f64 / n as f64),
            format!("{:.3}", patches as f64 / n as f64),
        );
    }
    let allocations: f64 = diff(
        &after.by(
            "node_ipam_controller_cidrset_cidrs_allocations_total",
            "clusterCIDR",
        ),
        &before.by(
            "node_ipam_controller_cidrset_cidrs_allocations_total",
            "clusterCIDR",
        ),
    )
    .values()
    .sum::<f64>()
        + 0.0; // an empty f64 sum is -0.0
    report.fig(
        "cidr_allocations",
        "CIDR allocations (node_ipam_controller metric)",
        json!(allocations),
        format!("{}", allocations as u64),
    );
    report.proc(ccm.proc());
    report.notes.push(format!(
        "node-IPAM on: {}; a node counts when the harness's watch first sees spec.podCIDR",
        ipam_args(opts).join(" ")
    ));
    ccm.stop().await;
    report
}
