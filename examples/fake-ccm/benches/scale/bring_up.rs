//! bring-up: N tainted Nodes and M LoadBalancer Services created together, as in a cluster's
//! bring-up (issue 43, item 3): does every Service get its ingress before the last Node is
//! initialised, and how much later than with no Node burst? With `--without-node-burst` the
//! Nodes are registered and initialised first and the Services created alone: the figure to
//! compare the median with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ccm::{Ccm, diff};
use crate::cli::Opts;
use crate::environment::{
    Env, Progress, Shared, create_nodes, create_services, lock, observe,
    register_control_plane_nodes, secs, wait_until,
};
use crate::objects::NodeKind;
use crate::report::{Report, api_figures, percentile};

/// bring-up.
pub(crate) async fn bring_up(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let (n, m) = (opts.nodes, opts.services);
    let cp = opts.control_plane_nodes;
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    env.create_namespace().await;
    let ccm = Ccm::start(env, opts, false).await;
    // The control-plane Nodes (the CCM runs on one) registered and initialised first.
    register_control_plane_nodes(env, &track, opts).await;
    if opts.without_node_burst {
        let t = track.clone();
        let _p = Progress::start("setup", move || {
            format!("nodes initialised {}/{n}", lock(&t).node_initialised.len())
        });
        create_nodes(env, &track, 0..n, |_| NodeKind::Tainted, opts.node_pace()).await;
        wait_until("every node initialised", opts.timeout, || {
            lock(&track).node_initialised.len() >= n + cp
        })
        .await;
        ccm.quiet().await;
    }
    let before = ccm.metrics().await;
    env.clear_requests();
    let t = track.clone();
    let progress = Progress::start(opts.scenario.name(), move || {
        let g = lock(&t);
        format!(
            "nodes created {}/{n}, initialised {}/{n}; services created {}/{m}, with ingress {}/{m}",
            g.node_created.len(),
            g.node_initialised.len().saturating_sub(cp),
            g.svc_created.len(),
            g.svc_ingress.len()
        )
    });
    let t0 = Instant::now();
    if opts.without_node_burst {
        create_services(env, &track, 0..m, false, opts.concurrency).await;
    } else {
        // Together: the harness's creating tasks split between the two.
        let half = (opts.concurrency / 2).max(1);
        futures::future::join(
            create_nodes(env, &track, 0..n, |_| NodeKind::Tainted, opts.node_pace()),
            create_services(env, &track, 0..m, false, half),
        )
        .await;
    }
    wait_until(
        "every node initialised, every Service with an ingress",
        opts.timeout,
        || {
            let g = lock(&track);
            g.node_initialised.len() >= n + cp && g.svc_ingress.len() >= m
        },
    )
    .await;
    drop(progress);
    ccm.quiet().await;

    let (lat, last_ingress, last_node, nodes_created) = {
        let g = lock(&track);
        let lat: Vec<Duration> = g
            .svc_created
            .iter()
            .map(|(k, c)| g.svc_ingress[k].saturating_duration_since(*c))
            .collect();
        let last_ingress = g.svc_ingress.values().max().copied().unwrap_or(t0);
        // The burst's Nodes only (the control-plane ones were initialised before t0).
        let last_node = g
            .node_created
            .keys()
            .filter_map(|k| g.node_initialised.get(k))
            .max()
            .copied();
        let created = g.node_created.values().max().copied();
        (lat, last_ingress, last_node, created)
    };
    let mut sorted = lat;
    sorted.sort();
    let median = percentile(&sorted, 0.5);
    report.secs(
        "ingress_latency_p50_s",
        "Service creation -> ingress p50",
        median,
    );
    report.secs(
        "ingress_latency_p99_s",
        "Service creation -> ingress p99",
        percentile(&sorted, 0.99),
    );
    report.secs(
        "ingress_latency_max_s",
        "Service creation -> ingress max",
        sorted.last().copied().unwrap_or_default(),
    );
    report.secs(
        "last_ingress_s",
        "first creation -> every Service has an ingress",
        last_ingress - t0,
    );
    match (opts.without_node_burst, last_node) {
        (false, Some(last_node)) => {
            if let Some(created) = nodes_created {
                report.secs(
                    "nodes_created_s",
                    "first creation -> last Node created",
                    created - t0,
                );
            }
            report.secs(
                "last_node_s",
                "first creation -> last Node initialised",
                last_node - t0,
            );
            let margin = last_node.saturating_duration_since(last_ingress);
            report.target(
                "ingress_before_last_node",
                "every ingress before the last Node initialised (by)",
                secs(margin),
                if last_ingress <= last_node {
                    format!("yes, by {:.3} s", margin.as_secs_f64())
                } else {
                    format!(
                        "no: last ingress {:.3} s after",
                        (last_ingress - last_node).as_secs_f64()
                    )
                },
                "every ingress before the last Node (issue 43)",
                last_ingress <= last_node,
                "the last ingress came after the last Node".into(),
                n >= 1000 && m >= 100,
            );
        }
        _ => report.notes.push(format!(
            "--without-node-burst: the {n} Nodes were initialised before the Services were \
             created; compare the p50 above with a run without the option (issue 43: at most \
             2 s apart)"
        )),
    }
    let after = ccm.metrics().await;
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    for op in [
        "ensure_load_balancer",
        "update_load_balancer",
        "update_load_balancer_hosts",
    ] {
        let per = calls.get(op).copied().unwrap_or(0.0) / m.max(1) as f64;
        report.fig(
            &format!("{op}_per_service"),
            &format!("{op} per Service"),
            serde_json::json!(per),
            format!("{per:.3}"),
        );
    }
    report.counts("cloud_calls", "cloud calls (all)", &calls, 1);
    api_figures(&mut report, env, &before, &after, n + m, "object");
    report.proc(ccm.proc());
    ccm.stop().await;
    report
}
